/* Helpers shared by the executor's tests: small plans built in memory (as the planner will write
 * them) and an executor on them. */
#ifndef TEST_EXEC_COMMON_H
#define TEST_EXEC_COMMON_H

#include "exec/train/train.h"
#include "sim/sim.h"
#include "tests/test.h"

/* A zoo model with a short job: fp32, single rank, the given batch shape. */
static inline ModelSpec tx_spec(const char *model, int seq, int gbs, int mbs)
{
    ModelSpec s;
    PxError err = {0};
    model_spec_defaults(&s);
    if (model_config_load(model, &s.model, &err)) {
        fprintf(stderr, "model %s: %s\n", model, err.msg);
        exit(1);
    }
    s.job.seq_len = seq;
    s.job.global_batch = gbs;
    s.job.micro_batch = mbs;
    s.job.precision = PX_FP32;
    s.job.steps = 10;
    return s;
}

/* An executor for spec on the local cluster, one rank, quiet. */
static inline Exec *tx_exec(const ModelSpec *spec)
{
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(spec, "local", 1, &plan, &err), err);
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.quiet = 1;
    opt.prefetch = 0;
    Exec *ex = NULL;
    CHECK_OK(exec_init(&ex, &plan, &opt, &err), err);
    model_plan_free(&plan);
    return ex;
}

#endif
