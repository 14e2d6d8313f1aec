/* Golden: FLOPs per iteration for the ten rows of Narayanan et al. 2021 Table 1 (GPT, V =
 * 51,200, s = 2048, ffn = 4h):
 *   hardware FLOPs with full recompute  F = 96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h))
 *   model FLOPs (Korthikanti 2022)      F = 72*B*s*l*h^2 * (1 + s/(6h) + V/(12*l*h))
 * summed over every rank of the published layout. With the causal option the attention term
 * halves: 72*B*s*l*h^2 * (1 + s/(12h) + V/(12*l*h)).
 * FlashAttention leaves model FLOPs alone: its backward recomputes the scores (2.5 x the
 * core's forward instead of 2 x), which is hardware work only: 2*B*s^2*l*h more per step. */
#include "fixtures.h"
#include "test.h"

typedef struct {
    const char *zoo;
    int heads, hidden, layers, tp, pp, gpus, batch;
} Row;

int main(void)
{
    px_log_set_quiet(1);
    const Row rows[10] = {
        {"megatron-1.7b", 24, 2304, 24, 1, 1, 32, 512},
        {"megatron-3.6b", 32, 3072, 30, 2, 1, 64, 512},
        {"megatron-7.5b", 32, 4096, 36, 4, 1, 128, 512},
        {"megatron-18.4b", 48, 6144, 40, 8, 1, 256, 1024},
        {"megatron-39.1b", 64, 8192, 48, 8, 2, 512, 1536},
        {"megatron-76.1b", 80, 10240, 60, 8, 4, 1024, 1792},
        {"megatron-145.6b", 96, 12288, 80, 8, 8, 1536, 2304},
        {"megatron-310.1b", 128, 16384, 96, 8, 16, 1920, 2160},
        {"megatron-529.6b", 128, 20480, 105, 8, 35, 2520, 2520},
        {"megatron-1t", 160, 25600, 128, 8, 64, 3072, 3072},
    };
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    printf("%-16s %14s %14s %14s\n", "model", "96-form", "hardware", "model (72)");
    for (int i = 0; i < 10; i++) {
        const Row *w = &rows[i];
        ModelSpec s;
        model_spec_defaults(&s);
        CHECK_OK(model_config_load(w->zoo, &s.model, &err), err);
        CHECK_EQ_INT(w->hidden, s.model.hidden);
        CHECK_EQ_INT(w->layers, s.model.layers);
        CHECK_EQ_INT(w->heads, s.model.heads);
        s.layout.tp = w->tp;
        s.layout.pp = w->pp;
        s.layout.recompute = MODEL_RECOMPUTE_FULL;
        s.job.precision = PX_FP16;
        s.job.flash_attn = 0;
        s.job.global_batch = w->batch;
        SimResult r;
        CHECK_OK(sim_run(&s, &cl, w->gpus, &r, &err), err);
        const double B = w->batch, S = 2048, l = w->layers, h = w->hidden, V = 51200;
        const double hw = 96 * B * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h));
        const double model = 72 * B * S * l * h * h * (1 + S / (6 * h) + V / (12 * l * h));
        printf("%-16s %14.6e %14.6e %14.6e\n", w->zoo, hw, r.hardware_flops, r.model_flops);
        CHECK_REL(hw, r.hardware_flops, 1e-12);
        CHECK_REL(model, r.model_flops, 1e-12);
        sim_result_free(&r);

        s.layout.recompute = MODEL_RECOMPUTE_NONE;
        s.layout.dp = 0;
        s.job.causal_flops = 1;
        CHECK_OK(sim_run(&s, &cl, w->gpus, &r, &err), err);
        CHECK_REL(72 * B * S * l * h * h * (1 + S / (12 * h) + V / (12 * l * h)), r.model_flops, 1e-12);
        CHECK_REL(r.model_flops, r.hardware_flops, 1e-12);
        sim_result_free(&r);

        s.job.causal_flops = 0;
        s.job.flash_attn = 1;
        CHECK_OK(sim_run(&s, &cl, w->gpus, &r, &err), err);
        CHECK_REL(model, r.model_flops, 1e-12);
        CHECK_REL(model + 2 * B * S * S * l * h, r.hardware_flops, 1e-12);
        sim_result_free(&r);
    }
    TEST_DONE("golden_flops");
}
