/* Benchmark (figures, not a test): layouts the simulator evaluates per second on one core for
 * GPT-3 175B on Selene — every (tp, pp, vpp, zero, sp, mbs, recompute, schedule) of 1024 GPUs
 * at a global batch of 1536 that passes the layout rules, once through the full simulation
 * (every layer's ops, as `parallax simulate`) and once through the planner's fast path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim/sim.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    int n, valid;
    double best;
} Sweep;

static Sweep sweep(const ModelSpec *base, const ProfCluster *cl, int gpus, int compact, double budget_s)
{
    Sweep w = {0, 0, 1e300};
    PxError err;
    double t0 = now();
    long tried = 0;
    for (int tp = 1; tp <= 8; tp *= 2)
        for (int pp = 1; pp <= 96; pp++) {
            if (gpus % (tp * pp)) /* not a factorisation of the GPUs: no layout to time */
                continue;
            for (int vpp = 1; vpp <= 12; vpp++)
                for (int zero = 0; zero <= 3; zero++)
                    for (int sp = 0; sp <= 1; sp++)
                        for (int mbs = 1; mbs <= 8; mbs *= 2)
                            for (int rc = 0; rc < 3; rc++)
                                for (int sched = 0; sched < 2; sched++) {
                                    if ((++tried & 63) == 0 && now() - t0 > budget_s)
                                        return w;
                                    if (sched && vpp > 1)
                                        continue;
                                    ModelSpec s = *base;
                                    s.layout.tp = tp;
                                    s.layout.pp = pp;
                                    s.layout.vpp = vpp;
                                    s.layout.zero = zero;
                                    s.layout.sp = sp;
                                    s.layout.recompute = (ModelRecompute)rc;
                                    s.layout.schedule = sched ? MODEL_SCHED_GPIPE : MODEL_SCHED_1F1B;
                                    s.job.micro_batch = mbs;
                                    ModelDims d;
                                    ModelSpec probe = s;
                                    if (model_spec_check(&probe, gpus, &d, &err))
                                        continue;
                                    SimResult r;
                                    w.n++;
                                    if (sim_run_ex(&s, cl, gpus, compact, SIM_FULL, &r, &err) == PX_OK) {
                                        w.valid++;
                                        if (r.step_s < w.best)
                                            w.best = r.step_s;
                                        sim_result_free(&r);
                                    }
                                }
        }
    return w;
}

int main(int argc, char **argv)
{
    double budget = argc > 1 ? atof(argv[1]) : 20.0;
    PxError err = {0};
    ProfCluster cl;
    ModelSpec base;
    model_spec_defaults(&base);
    if (prof_cluster_load("dgx-a100", NULL, 0, &cl, &err) ||
        model_config_load("gpt3-175b", &base.model, &err)) {
        fprintf(stderr, "bench_sim: %s\n", err.msg);
        return 1;
    }
    base.job.global_batch = 1536;
    px_log_set_quiet(1);
    printf("gpt3-175b on dgx-a100, 1024 GPUs, global batch 1536, one core\n");
    /* the planner: every candidate checked against the rules, feasible ones costed and
     * bounded, the few that can win simulated in full */
    for (int gpus = 512; gpus <= 1024; gpus *= 2) {
        SimPlanRequest q;
        memset(&q, 0, sizeof q);
        q.base = base;
        q.gpus = gpus;
        q.top = 5;
        q.headroom = 0.05;
        SimPlanResult res;
        if (sim_plan(&q, &cl, &res, &err)) {
            fprintf(stderr, "bench_sim: %s\n", err.msg);
            return 1;
        }
        printf("planner, %4d GPUs: %7ld layouts considered in %.2f s (%.0f/s), %ld feasible costed and "
               "bounded (%.0f/s), %ld simulated in full\n",
               gpus, res.considered, res.seconds, res.considered / res.seconds, res.feasible,
               res.feasible / res.seconds, res.timed);
        sim_plan_free(&res);
    }
    for (int compact = 1; compact >= 0; compact--) {
        double t0 = now();
        Sweep w = sweep(&base, &cl, 1024, compact, budget);
        double t = now() - t0;
        printf("%-34s %7d layouts in %6.2f s: %9.0f layouts/s (best step %.2f s)\n",
               compact ? "fast path (compact graphs)" : "full simulation (every layer)", w.n, t,
               w.n / t, w.best);
    }
    return 0;
}
