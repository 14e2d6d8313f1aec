/* Starting parallax-worker for a job (launch.h): the launcher's command line, and waiting for it
 * with the front end's own signals out of the way. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec/launch/launch.h"

extern char **environ;

int launch_kind_parse(const char *name, LaunchKind *out, PxError *err)
{
    if (!strcmp(name, "mpirun"))
        *out = LAUNCH_MPIRUN;
    else if (!strcmp(name, "srun"))
        *out = LAUNCH_SRUN;
    else if (!strcmp(name, "none"))
        *out = LAUNCH_NONE;
    else
        return px_fail(err, PX_EINPUT, "--launcher: expected mpirun, srun or none, got '%s'",
                       name);
    return PX_OK;
}

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

/* parallax-worker beside this executable, into out; PX_ERUNTIME when it is missing. */
static int worker_path(char *out, size_t cap, PxError *err)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    char *slash = NULL;
    if (n > 0) {
        self[n] = '\0';
        slash = strrchr(self, '/');
    }
    if (!slash)
        return px_fail(err, PX_ERUNTIME,
                       "cannot locate this executable to find parallax-worker beside it");
    slash[1] = '\0';
    if ((size_t)snprintf(out, cap, "%sparallax-worker", self) >= cap)
        return px_fail(err, PX_ERUNTIME, "the path of parallax-worker is too long");
    if (access(out, X_OK) != 0)
        return px_fail(err, PX_ERUNTIME,
                       "the executor %s is missing or not executable (%s): build it with "
                       "'cmake --build' (target parallax-worker)",
                       out, strerror(errno));
    return PX_OK;
}

int launch_worker(const LaunchJob *j, const char *const *args, int *exit_status, PxError *err)
{
    const int world = j->ranks > 0 ? j->ranks : 1;
    LaunchKind launcher = j->kind;
    if (launcher == LAUNCH_DEFAULT)
        launcher = j->hostfile ? LAUNCH_MPIRUN
                   : world == 1 ? LAUNCH_NONE
                   : getenv("SLURM_JOB_ID") ? LAUNCH_SRUN
                                            : LAUNCH_MPIRUN;
    if (j->hostfile && launcher != LAUNCH_MPIRUN)
        return px_fail(err, PX_EINPUT, "--hostfile %s is for --launcher mpirun (srun takes the "
                       "nodes of its Slurm allocation)", j->hostfile);
    if (launcher == LAUNCH_SRUN) {
        const char *nt = getenv("SLURM_NTASKS");
        if (nt && atoi(nt) > 0 && atoi(nt) < world)
            return px_fail(err, PX_EINPUT,
                           "%s needs %d ranks but the Slurm allocation has %s tasks "
                           "(SLURM_NTASKS): allocate at least %d",
                           j->what, world, nt, world);
    }
    char worker[PATH_MAX + 32];
    int rc = worker_path(worker, sizeof worker, err);
    if (rc)
        return rc;
    char tool[PATH_MAX + 32];
    const char *tool_name = launcher == LAUNCH_SRUN ? "srun" : "mpirun";
    if (launcher != LAUNCH_NONE && find_on_path(tool_name, tool, sizeof tool) != 0)
        return px_fail(err, PX_ERUNTIME,
                       "%s needs %d ranks but %s is not on PATH (install %s, or choose another "
                       "--launcher)",
                       j->what, world, tool_name,
                       launcher == LAUNCH_SRUN ? "Slurm" : "openmpi-bin");

    int n_args = 0, n_env = 0;
    while (args[n_args])
        n_args++;
    for (char **e = environ; *e; e++)
        n_env += !strncmp(*e, "PARALLAX_", 9);
    const char **argv = calloc((size_t)n_args + 2 * (size_t)n_env + 24, sizeof *argv);
    /* the names of the PARALLAX_* variables, for mpirun's -x */
    char *names = calloc(1, 1 + (size_t)n_env * 64);
    if (!argv || !names) {
        free(argv);
        free(names);
        return px_fail(err, PX_ERUNTIME, "out of memory starting the worker");
    }
    char nbuf[32];
    int n = 0;
    snprintf(nbuf, sizeof nbuf, "%d", world);
    if (launcher == LAUNCH_MPIRUN) {
        argv[n++] = tool;
        argv[n++] = "-n";
        argv[n++] = nbuf;
        /* OpenMPI refuses root unless told; containers often run as root */
        if (geteuid() == 0)
            argv[n++] = "--allow-run-as-root";
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (j->hostfile) {
            /* its nodes and slots decide where the ranks go */
            argv[n++] = "--hostfile";
            argv[n++] = j->hostfile;
        } else if (cores > 0 && world > cores) {
            /* more ranks than cores: allow it, do not pin several ranks to one core, and let
             * waiting ranks yield (the worker's waits also sleep between polls then) */
            argv[n++] = "--oversubscribe";
            argv[n++] = "--bind-to";
            argv[n++] = "none";
            argv[n++] = "--mca";
            argv[n++] = "mpi_yield_when_idle";
            argv[n++] = "1";
        }
        /* mpirun passes its environment to the ranks on this node only: name parallax's */
        char *at = names;
        for (char **e = environ; *e; e++) {
            const char *eq = strchr(*e, '=');
            size_t len = eq ? (size_t)(eq - *e) : 0;
            if (strncmp(*e, "PARALLAX_", 9) != 0 || len == 0 || len > 63)
                continue;
            memcpy(at, *e, len);
            at[len] = '\0';
            argv[n++] = "-x";
            argv[n++] = at;
            at += len + 1;
        }
        argv[n++] = "--quiet";
    } else if (launcher == LAUNCH_SRUN) {
        argv[n++] = tool;
        argv[n++] = "-n";
        argv[n++] = nbuf;
        /* the ranks join the MPI job through PMIx, which OpenMPI 4 speaks (Debian's has no PMI-2);
         * Slurm's own default is none, which would leave each rank alone. SLURM_MPI_TYPE, srun's
         * variable for --mpi, chooses another. */
        const char *mpi_type = getenv("SLURM_MPI_TYPE");
        if (!mpi_type || !*mpi_type)
            argv[n++] = "--mpi=pmix";
        /* every rank sees the node's GPUs and takes the one of its rank on the node, the rule
         * the worker's NCCL choice rests on; --gpus-per-task alone would hide the others */
        argv[n++] = "--gpu-bind=none";
    }
    const char *exe = launcher == LAUNCH_NONE ? worker : tool;
    argv[n++] = worker;
    for (int i = 0; i < n_args; i++)
        argv[n++] = args[i];
    argv[n] = NULL;

    /* Ctrl-C reaches the worker too (same process group; mpirun forwards it to the ranks): it
     * finishes its step and writes its results, so the front end waits for it rather than
     * dying first. */
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
    int e = posix_spawn(&pid, exe, NULL, &attr, (char *const *)argv, environ);
    posix_spawnattr_destroy(&attr);
    free(argv);
    free(names);
    if (e != 0) {
        rc = px_fail(err, PX_ERUNTIME, "cannot start %s: %s", exe, strerror(e));
    } else {
        int ws = 0;
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
            ;
        if (WIFEXITED(ws))
            *exit_status = WEXITSTATUS(ws);
        else
            rc = px_fail(err, PX_ERUNTIME, "%s died from signal %d",
                         launcher == LAUNCH_NONE ? "the worker" : tool_name,
                         WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
}
