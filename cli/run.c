/* parallax run: launches the executor on a plan. parallax-worker, found next to this
 * executable, runs once per rank: directly for a one-rank plan, through mpirun (or srun inside
 * a Slurm allocation) with the plan's world size for several. --launcher chooses: none runs the
 * worker directly whatever the plan, for a job that is already one rank of a launch
 * (mpirun -n 8 parallax run plan.json --launcher none). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "model/model.h"

extern char **environ;

enum { RUN_STEPS = CLI_EXTRA, RUN_METRICS, RUN_DATA, RUN_QUIET, RUN_LAUNCHER };

static const CliOption run_options[] = {
    {"steps", 1, "N", "training steps (default: the plan's training.steps)", RUN_STEPS},
    {"output", 1, "FILE", "run.json to write (default run.json)", CLI_OUTPUT},
    {"metrics", 1, "FILE", "JSON-lines log of every step (default: run.metrics.jsonl beside -o)",
     RUN_METRICS},
    {"data", 1, "FILE", "text file (byte tokens) or llm.c .bin tokens (default: the built-in text)",
     RUN_DATA},
    {"quiet", 0, NULL, "no progress lines", RUN_QUIET},
    {"launcher", 1, "L", "mpirun, srun or none (default: srun under Slurm, else mpirun; none for one rank)",
     RUN_LAUNCHER},
    {NULL, 0, NULL, NULL, 0}};

static const char *const run_usage =
    "PLAN.json [--steps N] [-o FILE] [--metrics FILE] [--data FILE] [--quiet] [--launcher L]\n\n"
    "Trains the plan for real and measures it under the simulator's names: a progress line\n"
    "per step, a metrics log, and run.json with losses, memory, communication, FLOPs and time\n"
    "per op of every rank. A single-rank plan runs parallax-worker directly; a plan of several\n"
    "ranks starts it with mpirun (--oversubscribe when the ranks outnumber the cores) or, inside\n"
    "a Slurm allocation, srun.";

typedef enum { LAUNCH_NONE = 0, LAUNCH_MPIRUN, LAUNCH_SRUN } Launcher;

/* An executable named `name` on PATH, into out; -1 when there is none. */
static int find_on_path(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        if (n > 0 && (size_t)snprintf(out, cap, "%.*s/%s", (int)n, path, name) < cap &&
            access(out, X_OK) == 0)
            return 0;
        path += n + (colon ? 1 : 0);
    }
    return -1;
}

/* The worker sits beside this executable (both are built into the build directory). */
static int worker_path(char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return -1;
    slash[1] = '\0';
    if ((size_t)snprintf(out, cap, "%sparallax-worker", self) >= cap)
        return -1;
    return 0;
}

int cli_cmd_run(int argc, char **argv)
{
    CliArgs a = {0};
    const CliOption *const tables[] = {run_options, NULL};
    int status = cli_parse("run", run_usage, argc, argv, tables, 1, &a);
    const char *steps = NULL, *metrics = NULL, *data = NULL, *launcher_name = NULL;
    int quiet = 0;
    if (status < 0) {
        steps = a.extra[RUN_STEPS - CLI_EXTRA];
        metrics = a.extra[RUN_METRICS - CLI_EXTRA];
        data = a.extra[RUN_DATA - CLI_EXTRA];
        quiet = a.extra[RUN_QUIET - CLI_EXTRA] != NULL;
        launcher_name = a.extra[RUN_LAUNCHER - CLI_EXTRA];
        if (a.n_positional != 1) {
            fprintf(stderr, "parallax run: expected one plan file (see 'parallax run --help')\n");
            status = 2;
        }
    }
    PxError err = {0};
    int n_steps = 0;
    if (status < 0 && steps && px_parse_int(steps, "--steps", 1, 1 << 30, &n_steps, &err)) {
        fprintf(stderr, "parallax run: %s\n", err.msg);
        status = 2;
    }
    Launcher launcher = LAUNCH_NONE;
    if (status < 0 && launcher_name) {
        if (!strcmp(launcher_name, "mpirun"))
            launcher = LAUNCH_MPIRUN;
        else if (!strcmp(launcher_name, "srun"))
            launcher = LAUNCH_SRUN;
        else if (!strcmp(launcher_name, "none"))
            launcher = LAUNCH_NONE;
        else {
            fprintf(stderr, "parallax run: --launcher: expected mpirun, srun or none, got '%s'\n",
                    launcher_name);
            status = 2;
        }
    }
    ModelPlan plan = {0};
    int world = 1;
    if (status < 0) {
        int rc = model_plan_read(a.positional[0], &plan, &err);
        if (rc) {
            fprintf(stderr, "parallax run: %s\n", err.msg);
            status = rc == PX_EINPUT ? 2 : 1;
        } else {
            world = plan.gpus;
        }
        model_plan_free(&plan);
    }
    /* the default: one rank runs alone, several under Slurm's srun or mpirun */
    if (status < 0 && !launcher_name && world > 1)
        launcher = getenv("SLURM_JOB_ID") ? LAUNCH_SRUN : LAUNCH_MPIRUN;
    if (status < 0 && launcher == LAUNCH_SRUN) {
        const char *nt = getenv("SLURM_NTASKS");
        if (nt && atoi(nt) > 0 && atoi(nt) < world) {
            fprintf(stderr,
                    "parallax run: %s needs %d ranks but the Slurm allocation has %s tasks "
                    "(SLURM_NTASKS): allocate at least %d\n",
                    a.positional[0], world, nt, world);
            status = 2;
        }
    }
    char worker[PATH_MAX + 32];
    if (status < 0) {
        if (worker_path(worker, sizeof worker) != 0) {
            fprintf(stderr, "parallax run: cannot locate this executable to find parallax-worker\n");
            status = 1;
        } else if (access(worker, X_OK) != 0) {
            fprintf(stderr,
                    "parallax run: the executor %s is missing or not executable (%s): build it "
                    "with 'cmake --build' (target parallax-worker)\n",
                    worker, strerror(errno));
            status = 1;
        }
    }
    char tool[PATH_MAX + 32];
    const char *tool_name = launcher == LAUNCH_SRUN ? "srun" : "mpirun";
    if (status < 0 && launcher != LAUNCH_NONE && find_on_path(tool_name, tool, sizeof tool) != 0) {
        fprintf(stderr,
                "parallax run: %s needs %d ranks but %s is not on PATH (install %s, or choose "
                "another --launcher)\n",
                a.positional[0], world, tool_name,
                launcher == LAUNCH_SRUN ? "Slurm" : "openmpi-bin");
        status = 1;
    }
    if (status >= 0)
        return status;

    const char *wargv[48];
    char nbuf[32];
    int n = 0;
    snprintf(nbuf, sizeof nbuf, "%d", world);
    if (launcher == LAUNCH_MPIRUN) {
        wargv[n++] = tool;
        wargv[n++] = "-n";
        wargv[n++] = nbuf;
        /* OpenMPI refuses root unless told; containers often run as root */
        if (geteuid() == 0)
            wargv[n++] = "--allow-run-as-root";
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores > 0 && world > cores) {
            /* more ranks than cores: allow it, do not pin several ranks to one core, and let
             * waiting ranks yield (the worker's waits also sleep between polls then) */
            wargv[n++] = "--oversubscribe";
            wargv[n++] = "--bind-to";
            wargv[n++] = "none";
            wargv[n++] = "--mca";
            wargv[n++] = "mpi_yield_when_idle";
            wargv[n++] = "1";
        }
        wargv[n++] = "--quiet";
    } else if (launcher == LAUNCH_SRUN) {
        wargv[n++] = tool;
        wargv[n++] = "-n";
        wargv[n++] = nbuf;
    }
    const char *exe = launcher == LAUNCH_NONE ? worker : tool;
    wargv[n++] = worker;
    wargv[n++] = "run";
    wargv[n++] = a.positional[0];
    if (steps) {
        wargv[n++] = "--steps";
        wargv[n++] = steps;
    }
    if (a.output) {
        wargv[n++] = "--output";
        wargv[n++] = a.output;
    }
    if (metrics) {
        wargv[n++] = "--metrics";
        wargv[n++] = metrics;
    }
    if (data) {
        wargv[n++] = "--data";
        wargv[n++] = data;
    }
    if (quiet)
        wargv[n++] = "--quiet";
    wargv[n] = NULL;

    /* Ctrl-C reaches the worker too (same process group; mpirun forwards it to the ranks): it
     * finishes its step and writes run.json, so the front end waits for it rather than dying
     * first. */
    struct sigaction ign, old_int, old_term;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGINT, &ign, &old_int);
    sigaction(SIGTERM, &ign, &old_term);
    /* ...and the worker itself starts with the default dispositions, not our ignoring ones */
    posix_spawnattr_t attr;
    sigset_t def;
    sigemptyset(&def);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawn(&pid, exe, NULL, &attr, (char *const *)wargv, environ);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        fprintf(stderr, "parallax run: cannot start %s: %s\n", exe, strerror(rc));
        status = 1;
    } else {
        int ws = 0;
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
            ;
        if (WIFEXITED(ws)) {
            status = WEXITSTATUS(ws);
        } else {
            fprintf(stderr, "parallax run: %s died from signal %d\n",
                    launcher == LAUNCH_NONE ? "the worker" : tool_name,
                    WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
            status = 1;
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return status;
}
