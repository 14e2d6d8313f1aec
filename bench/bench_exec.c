/* bench_exec — figures, not a test: training throughput of a gpt2-124m-shaped model at B=4,
 * T=64 on one core, and the FLOP rate its counted FLOPs reach against the sgemm peak measured on
 * the same core just before. Usage: bench_exec [STEPS] (default 3, after one warm-up step). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/train/train.h"
#include "kernels/kernels.h"
#include "sim/sim.h"

/* The best of a few square sgemms, the most a core gets out of OpenBLAS. */
static double sgemm_peak(const KernBackend *k, int n)
{
    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = k->alloc(bytes), *b = k->alloc(bytes), *c = k->alloc(bytes);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)n * n; i++) {
            a[i] = (float)((i % 7) - 3) * 0.01f;
            b[i] = (float)((i % 5) - 2) * 0.01f;
        }
        for (int r = 0; r < 5; r++) {
            double t0 = px_now_s();
            k->matmul(c, PX_FP32, a, b, n, n, n, 0, 1, 1.0f, 0.0f);
            double dt = px_now_s() - t0;
            double f = 2.0 * n * n * (double)n / dt;
            if (f > best)
                best = f;
        }
    }
    k->free(a);
    k->free(b);
    k->free(c);
    return best;
}

/* the plan's predicted step (one stage) */
static double predicted_step_s(const ModelPlan *plan)
{
    ModelPredicted pr;
    PxError err = {0};
    if (model_predicted_read(plan, &pr, &err) || pr.stages < 1)
        return 0;
    double s = pr.step_s[0];
    model_predicted_free(&pr);
    return s;
}

/* The optional operand, the timed steps: -1 to go on, or the exit status (0 after --help, 2
 * after bad input). */
static int parse_args(int argc, char **argv, int *steps)
{
    static const char *const usage =
        "bench_exec [STEPS]\n\n"
        "Training throughput of a gpt2-124m-shaped model at B=4, T=64 on one core, and the FLOP\n"
        "rate its counted FLOPs reach against the sgemm peak of the same core: STEPS timed steps\n"
        "(default 3) after one warm-up step.";
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
        rc = px_parse_int(argv[first], "STEPS", 1, 1 << 20, steps, &err);
    if (rc)
        fprintf(stderr, "bench_exec: %s\n", err.msg);
    return rc ? rc : -1;
}

int main(int argc, char **argv)
{
    int steps = 3;
    int status = parse_args(argc, argv, &steps);
    if (status >= 0)
        return status;
    PxError err = {0};
    ModelSpec spec;
    model_spec_defaults(&spec);
    if (model_config_load("gpt2-124m", &spec.model, &err)) {
        fprintf(stderr, "bench_exec: %s\n", err.msg);
        return 1;
    }
    spec.job.seq_len = 64;
    spec.job.micro_batch = 4;
    spec.job.global_batch = 4;
    spec.job.precision = PX_FP32;
    spec.job.steps = steps + 1;
    const KernBackend *k = kern_cpu();
    double peak = sgemm_peak(k, 1024);
    printf("sgemm peak (1024^3, one core): %.1f GFLOP/s\n", peak / 1e9);

    for (int flash = 1; flash >= 0; flash--) {
        spec.job.flash_attn = flash;
        ModelPlan plan;
        ExecOptions opt;
        exec_options_defaults(&opt);
        opt.quiet = 1;
        Exec *ex = NULL;
        double t0 = px_now_s();
        if (sim_plan_for(&spec, "local", 1, &plan, &err) || exec_init(&ex, &plan, &opt, &err)) {
            fprintf(stderr, "bench_exec: %s\n", err.msg);
            return 1;
        }
        double t_init = px_now_s() - t0;
        ExecStepStats st;
        double total = 0, flops = 0, loss0 = 0, loss1 = 0;
        for (int s = 0; s <= steps; s++) {
            if (exec_step(ex, s, &st, &err)) {
                fprintf(stderr, "bench_exec: %s\n", err.msg);
                return 1;
            }
            if (s == 0) {
                loss0 = st.loss;
                continue; /* warm-up */
            }
            total += st.time_s;
            flops += exec_step_flops(ex);
            loss1 = st.loss;
        }
        double tps = (double)steps * spec.job.global_batch * spec.job.seq_len / total;
        double rate = flops / total;
        printf("gpt2-124m B=4 T=64 flash-attn %-3s: %7.0f tokens/s  %6.3f s/step  %6.1f GFLOP/s "
               "counted = %4.1f%% of the sgemm peak  (init %.1f s, loss %.3f -> %.3f, predicted "
               "step %.3f s)\n",
               flash ? "on" : "off", tps, total / steps, rate / 1e9, 100.0 * rate / peak, t_init,
               loss0, loss1, predicted_step_s(&plan));
        /* where the time goes: op names without their layer, summed over the layers */
        int n = 0;
        const ExecOpReport *ops = exec_ops(ex, &n);
        enum { GROUPS = 64 };
        char gname[GROUPS][64];
        double gsec[GROUPS] = {0}, gflops[GROUPS] = {0};
        int ng = 0;
        for (int i = 0; i < n; i++) {
            const char *name = ops[i].name;
            int l = -1, off = 0;
            if (sscanf(name, "layer.%d.%n", &l, &off) == 1 && off > 0)
                name += off;
            int g = 0;
            while (g < ng && strcmp(gname[g], name) != 0)
                g++;
            if (g == ng) {
                if (ng == GROUPS)
                    continue;
                snprintf(gname[ng++], sizeof gname[0], "%s", name);
            }
            gsec[g] += ops[i].seconds;
            gflops[g] += ops[i].flops;
        }
        printf("    slowest ops per step (all layers):");
        for (int r = 0; r < 6; r++) {
            int best = -1;
            for (int g = 0; g < ng; g++)
                if (gsec[g] >= 0 && (best < 0 || gsec[g] > gsec[best]))
                    best = g;
            if (best < 0)
                break;
            printf("%s %s %.3f s", r ? "," : "", gname[best], gsec[best]);
            if (gflops[best] > 0)
                printf(" (%.0f GFLOP/s)", gflops[best] / gsec[best] / 1e9);
            gsec[best] = -1;
        }
        printf("\n");
        exec_free(ex);
        model_plan_free(&plan);
    }
    return 0;
}
