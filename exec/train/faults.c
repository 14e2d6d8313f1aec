/* Failures on purpose (docs/executor.md, "Failures"), so that tests can prove a job ends when
 * a rank fails, dies or stalls, and that a diverged run stops cleanly. None of this is in the
 * trainer's state: it only reads what it was asked for here.
 *   --fail-rank R --fail-step K          rank R kills itself (SIGKILL) at the start of step K,
 *                                        as a lost node, without a word to the others
 *   PARALLAX_TEST_FAIL=RANK:init|RANK:step:K  that rank fails (an error) at start or at step K
 *   PARALLAX_TEST_HANG=RANK:step:K       that rank stalls for good at the start of step K, so
 *                                        that only the others' communication timeout ends it
 *   PARALLAX_TEST_INF=K[,K...]           rank 0 writes +Inf into a gradient after step K's
 *                                        backward, as an fp16 overflow would
 *   PARALLAX_TEST_NAN_LOSS=K[,K...]      rank 0's share of step K's loss is a NaN */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/train/internal.h"

/* Steps K[,K...] (1-based, K <= 64) of the environment variable `name` as bits k - 1. */
static int test_steps(const char *name, uint64_t *bits, PxError *err)
{
    *bits = 0;
    const char *s = getenv(name);
    if (!s || !*s)
        return PX_OK;
    for (const char *p = s; *p;) {
        char *end = NULL;
        long k = strtol(p, &end, 10);
        if (end == p || k < 1 || k > 64 || (*end && *end != ','))
            return px_fail(err, PX_EINPUT, "%s=%s: expected steps 1-64 separated by commas", name,
                           s);
        *bits |= 1ull << (k - 1);
        p = *end ? end + 1 : end;
    }
    return PX_OK;
}

static int test_fail(ExecFaults *F, int rank, PxError *err)
{
    const char *s = getenv("PARALLAX_TEST_FAIL");
    if (!s || !*s)
        return PX_OK;
    int r = -1, step = 0, n = 0;
    if (sscanf(s, "%d:init%n", &r, &n) == 1 && n > 0 && s[n] == '\0') {
        if (r == rank)
            return px_fail(err, PX_ERUNTIME, "failing at start as PARALLAX_TEST_FAIL=%s asks", s);
        return PX_OK;
    }
    if (sscanf(s, "%d:step:%d", &r, &step) == 2 && step >= 1) {
        if (r == rank)
            F->fail_step = step - 1;
        return PX_OK;
    }
    return px_fail(err, PX_EINPUT, "PARALLAX_TEST_FAIL=%s: expected RANK:init or RANK:step:K", s);
}

static int test_hang(ExecFaults *F, int rank, PxError *err)
{
    const char *s = getenv("PARALLAX_TEST_HANG");
    if (!s || !*s)
        return PX_OK;
    int r = -1, step = 0, n = 0;
    if (sscanf(s, "%d:step:%d%n", &r, &step, &n) != 2 || s[n] != '\0' || step < 1)
        return px_fail(err, PX_EINPUT, "PARALLAX_TEST_HANG=%s: expected RANK:step:K", s);
    if (r == rank)
        F->hang_step = step - 1;
    return PX_OK;
}

int exec_faults_init(ExecFaults *F, const ExecOptions *o, int rank, int world, PxError *err)
{
    memset(F, 0, sizeof *F);
    F->fail_step = F->hang_step = -1;
    int rc;
    if ((rc = test_fail(F, rank, err)) || (rc = test_steps("PARALLAX_TEST_INF", &F->inf_steps, err)))
        return rc;
    if (o->fail_step < 0)
        return px_fail(err, PX_EINPUT, "--fail-step %d: expected a step from 1", o->fail_step);
    if (o->fail_step > 0 && (o->fail_rank < 0 || o->fail_rank >= world))
        return px_fail(err, PX_EINPUT, "--fail-rank %d: the job has %d rank%s (0 to %d)",
                       o->fail_rank, world, world == 1 ? "" : "s", world - 1);
    F->kill_rank = o->fail_rank;
    F->kill_step = o->fail_step;
    if ((rc = test_hang(F, rank, err)))
        return rc;
    return test_steps("PARALLAX_TEST_NAN_LOSS", &F->nan_loss_steps, err);
}

int exec_faults_step(const ExecFaults *F, int rank, int step, PxError *err)
{
    if (F->kill_step == step + 1 && F->kill_rank == rank) {
        fprintf(stderr, "parallax-worker: rank %d: step %d: killed on purpose (--fail-rank %d "
                        "--fail-step %d), as a lost node\n", rank, step + 1, rank, step + 1);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (step == F->hang_step) {
        fprintf(stderr, "parallax-worker: rank %d: step %d: stalling for good as "
                        "PARALLAX_TEST_HANG asks\n", rank, step + 1);
        fflush(stderr);
        for (;;)
            pause();
    }
    if (step == F->fail_step)
        return px_fail(err, PX_ERUNTIME, "failing at step %d as PARALLAX_TEST_FAIL asks", step + 1);
    return PX_OK;
}

int exec_faults_inf(const ExecFaults *F, int rank, int step)
{
    return step < 64 && (F->inf_steps >> step & 1) && rank == 0;
}

int exec_faults_nan_loss(const ExecFaults *F, int rank, int step)
{
    return step < 64 && (F->nan_loss_steps >> step & 1) && rank == 0;
}
