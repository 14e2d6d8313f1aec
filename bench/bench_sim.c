/* Benchmark (figures, not a test): layouts evaluated per second on one core for GPT-3 175B on
 * Selene at a global batch of 1536.
 *
 * - The planner's search on 512 and 1024 GPUs: every layout it enumerates gets a verdict
 *   (a rule broken, does not fit, cannot enter the top 5, or its exact step).
 * - Every (tp, pp, vpp, zero, sp, mbs, recompute, schedule) of 1024 GPUs that passes the rules
 *   simulated exactly: through the planner's fast path (compact tables from its cache,
 *   compact graphs) and through the full simulation (every layer's ops, as `simulate`).
 *
 * Rates are per CPU second of this process (the wall clock is printed beside them: on a busy
 * machine the two differ). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"

typedef struct {
    int n, valid;
    double best;
} Sweep;

static Sweep sweep(const ModelSpec *base, const ProfCluster *cl, int gpus, int compact,
                   ModelTableCache *cache, double budget_s)
{
    Sweep w = {0, 0, 1e300};
    PxError err;
    double t0 = px_now_s();
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
                                    if ((++tried & 63) == 0 && px_now_s() - t0 > budget_s)
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
                                    int status = compact ? sim_run_cached(&s, cl, gpus, cache, SIM_FULL, &r, &err)
                                                     : sim_run(&s, cl, gpus, &r, &err);
                                    if (status == PX_OK) {
                                        w.valid++;
                                        if (r.step_s < w.best)
                                            w.best = r.step_s;
                                        sim_result_free(&r);
                                    }
                                }
        }
    return w;
}

/* The optional operand, the seconds each exact sweep may take: -1 to go on, or the exit status
 * (0 after --help, 2 after bad input). */
static int parse_args(int argc, char **argv, double *budget_s)
{
    static const char *const usage =
        "bench_sim [SECONDS]\n\n"
        "Layouts of GPT-3 175B on Selene evaluated per CPU second: the planner's search on 512 and\n"
        "1024 GPUs, then every layout of 1024 GPUs simulated exactly, through the planner's fast\n"
        "path and through the full simulation, each for at most SECONDS (default 20).";
    static const PxOption none[] = {{NULL, 0, NULL, NULL, 0, 0}};
    const PxOption *const tables[] = {none, NULL};
    PxError err = {0};
    int first;
    int rc = px_opts_parse(tables, argc, argv, "(see --help)", NULL, NULL, 1, &first, &err);
    if (rc == PX_OPTS_HELP) {
        px_opts_help(stdout, usage, tables);
        return 0;
    }
    if (!rc && first < argc)
        rc = px_parse_double(argv[first], "SECONDS", budget_s, &err);
    if (rc)
        fprintf(stderr, "bench_sim: %s\n", err.msg);
    return rc ? rc : -1;
}

int main(int argc, char **argv)
{
    double budget = 20.0;
    int status = parse_args(argc, argv, &budget);
    if (status >= 0)
        return status;
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
        double c0 = px_cpu_s();
        if (sim_plan(&q, &cl, &res, &err)) {
            fprintf(stderr, "bench_sim: %s\n", err.msg);
            return 1;
        }
        double cpu = px_cpu_s() - c0;
        printf("planner, %4d GPUs: %7ld layouts decided in %.3f CPU s (%.3f s wall): %8.0f layouts/s; "
               "%ld fit, %ld simulated in full\n",
               gpus, res.considered, cpu, res.seconds, res.considered / cpu, res.feasible, res.timed);
        sim_plan_free(&res);
    }
    ModelTableCache *cache = model_table_cache_new();
    if (!cache) {
        fprintf(stderr, "bench_sim: out of memory\n");
        return 1;
    }
    for (int compact = 1; compact >= 0; compact--) {
        double t0 = px_now_s(), c0 = px_cpu_s();
        Sweep w = sweep(&base, &cl, 1024, compact, cache, budget);
        double t = px_now_s() - t0, cpu = px_cpu_s() - c0;
        printf("%-42s %5d layouts in %6.3f CPU s (%.3f s wall): %8.0f layouts/s (best step %.2f s)\n",
               compact ? "exact, fast path (cached compact tables)" : "exact, full simulation (every layer)",
               w.n, cpu, t, w.n / cpu, w.best);
    }
    model_table_cache_free(cache);
    return 0;
}
