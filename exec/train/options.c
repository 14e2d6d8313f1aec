/* The trainer's options: their defaults, the backends by name, and the failure options as a
 * command line gives them. The worker parses with them, and so does `parallax run`, which
 * checks --backend and the failure options before it starts anything: this file is a library of
 * its own (px_train_options) that needs neither the kernels nor MPI. */
#include <stddef.h>
#include <string.h>

#include "exec/train/train.h"

void exec_options_defaults(ExecOptions *o)
{
    memset(o, 0, sizeof *o);
    o->prefetch = 1;
    o->comm_timeout_s = EXEC_COMM_TIMEOUT_S;
}

int exec_backend_parse(const char *name, ExecBackend *out, PxError *err)
{
    if (!strcmp(name, "auto"))
        *out = EXEC_BACKEND_AUTO;
    else if (!strcmp(name, "cpu"))
        *out = EXEC_BACKEND_CPU;
    else if (!strcmp(name, "cuda"))
        *out = EXEC_BACKEND_CUDA;
    else
        return px_fail(err, PX_EINPUT, "--backend: expected cpu, cuda or auto, got '%s'", name);
    return PX_OK;
}

const char *exec_backend_name(ExecBackend b)
{
    return b == EXEC_BACKEND_CPU ? "cpu" : b == EXEC_BACKEND_CUDA ? "cuda" : "auto";
}

/* --fail-rank R with --fail-step K kill one rank on purpose, so that a test can watch the job
 * end (docs/executor.md, "Failures"). */
int exec_failure_parse(const char *comm_timeout, const char *fail_rank, const char *fail_step,
                       ExecOptions *o, PxError *err)
{
    if (comm_timeout) {
        double t = 0;
        if (px_parse_double(comm_timeout, "--comm-timeout", &t, err))
            return PX_EINPUT;
        if (t < 0 || t > 1e7)
            return px_fail(err, PX_EINPUT,
                           "--comm-timeout: expected seconds from 0 (no limit) to 1e7, got '%s'",
                           comm_timeout);
        o->comm_timeout_s = t;
    }
    if (!fail_rank != !fail_step)
        return px_fail(err, PX_EINPUT, "%s needs %s too: which rank fails at which step",
                       fail_rank ? "--fail-rank" : "--fail-step",
                       fail_rank ? "--fail-step" : "--fail-rank");
    if (fail_rank &&
        (px_parse_int(fail_rank, "--fail-rank", 0, 1 << 30, &o->fail_rank, err) ||
         px_parse_int(fail_step, "--fail-step", 1, 1 << 30, &o->fail_step, err)))
        return PX_EINPUT;
    return PX_OK;
}
