/* The failure options, for the worker and for `parallax run`, which checks them before it starts
 * anything and passes them on (it links this file through px_launch, without MPI):
 * --comm-timeout S, and --fail-rank R with --fail-step K, which kill one rank on purpose so that
 * a test can watch the job end (docs/executor.md, "Failures"). */
#include <stddef.h>

#include "exec/exec.h"

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
