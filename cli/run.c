/* parallax run: launches the executor on a plan. One rank runs parallax-worker directly, found
 * next to this executable; several ranks will go through mpirun or srun (a later change), so
 * for now a plan that needs more than one rank is refused here with the reason. */
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

enum { RUN_STEPS = CLI_EXTRA, RUN_METRICS, RUN_DATA, RUN_QUIET };

static const CliOption run_options[] = {
    {"steps", 1, "N", "training steps (default: the plan's training.steps)", RUN_STEPS},
    {"output", 1, "FILE", "run.json to write (default run.json)", CLI_OUTPUT},
    {"metrics", 1, "FILE", "JSON-lines log of every step (default: run.metrics.jsonl beside -o)",
     RUN_METRICS},
    {"data", 1, "FILE", "text file (byte tokens) or llm.c .bin tokens (default: the built-in text)",
     RUN_DATA},
    {"quiet", 0, NULL, "no progress lines", RUN_QUIET},
    {NULL, 0, NULL, NULL, 0}};

static const char *const run_usage =
    "PLAN.json [--steps N] [-o FILE] [--metrics FILE] [--data FILE] [--quiet]\n\n"
    "Trains the plan for real and measures it under the simulator's names: a progress line\n"
    "per step, a metrics log, and run.json with losses, memory per category, FLOPs and time\n"
    "per op. A single-rank plan runs parallax-worker directly.";

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
    const char *steps = NULL, *metrics = NULL, *data = NULL;
    int quiet = 0;
    if (status < 0) {
        steps = a.extra[RUN_STEPS - CLI_EXTRA];
        metrics = a.extra[RUN_METRICS - CLI_EXTRA];
        data = a.extra[RUN_DATA - CLI_EXTRA];
        quiet = a.extra[RUN_QUIET - CLI_EXTRA] != NULL;
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
    ModelPlan plan = {0};
    if (status < 0) {
        int rc = model_plan_read(a.positional[0], &plan, &err);
        if (rc) {
            fprintf(stderr, "parallax run: %s\n", err.msg);
            status = rc == PX_EINPUT ? 2 : 1;
        } else if (plan.gpus > 1) {
            const ModelLayout *l = &plan.spec.layout;
            fprintf(stderr,
                    "parallax run: %s needs %d ranks (dp %d x tp %d x pp %d x cp %d): launching "
                    "several ranks (mpirun / srun) is not implemented yet; only single-rank plans "
                    "run\n",
                    a.positional[0], plan.gpus, l->dp, l->tp, l->pp, l->cp);
            status = 2;
        }
        model_plan_free(&plan);
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
    if (status >= 0)
        return status;

    const char *wargv[16];
    int n = 0;
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

    /* Ctrl-C reaches the worker too (same process group): it finishes its step and writes
     * run.json, so the front end waits for it rather than dying first. */
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
    int rc = posix_spawn(&pid, worker, NULL, &attr, (char *const *)wargv, environ);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        fprintf(stderr, "parallax run: cannot start %s: %s\n", worker, strerror(rc));
        status = 1;
    } else {
        int ws = 0;
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
            ;
        if (WIFEXITED(ws)) {
            status = WEXITSTATUS(ws);
        } else {
            fprintf(stderr, "parallax run: the worker died from signal %d\n",
                    WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
            status = 1;
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return status;
}
