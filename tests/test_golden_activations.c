/* Golden: Korthikanti et al. 2022, Table 2 — activation memory per transformer layer in bytes,
 * with 2-byte activations, dropout, and no flash attention:
 *   no parallelism                       s*b*h*(34 + 5*a*s/h)
 *   tensor parallel                      s*b*h*(10 + 24/t + 5*a*s/(h*t))
 *   tensor + sequence parallel           s*b*h*(34/t + 5*a*s/(h*t))
 *   tensor parallel + selective          s*b*h*(10 + 24/t)
 *   tensor + sequence + selective        s*b*h*34/t
 *   full recompute                       2*s*b*h
 * checked exactly for several models, micro-batches and TP degrees. Then the pipeline terms of
 * Sec. 4.2.3: the first 1F1B stage holds p micro-batches in flight (L layers' worth plus the
 * embedding dropout mask s*b*h*p/t), p = 1 adds the output layer 4*s*b*h/t*(1 + V/h), and the
 * interleaved schedule holds L*(1 + (p-1)/(p*v)) layers' worth on the first stage. */
#include "fixtures.h"
#include "test.h"

static uint64_t layer_bytes(ModelConfig c, int b, int t, int sp, ModelRecompute rc)
{
    PxError err = {0};
    ModelSpec s = fx_spec(c);
    s.layout.tp = t;
    s.layout.sp = sp;
    s.layout.recompute = rc;
    s.job.dropout = 0.1;
    s.job.flash_attn = 0;
    s.job.micro_batch = b;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, t, &d, &err), err);
    return model_layer_activation_bytes(&s, &d);
}

int main(void)
{
    px_log_set_quiet(1);
    PxError err = {0};
    /* gpt3-175b, megatron-18.4b and megatron-1t shapes (Brown 2020; Narayanan 2021 Table 1) */
    const ModelConfig models[3] = {fx_gpt(96, 12288, 96, 51200, 2048), fx_gpt(40, 6144, 48, 51200, 2048),
                                   fx_gpt(128, 25600, 160, 51200, 2048)};
    const int bs[2] = {1, 4}, ts[4] = {1, 2, 4, 8};
    for (int mi = 0; mi < 3; mi++) {
        const ModelConfig c = models[mi];
        const uint64_t h = (uint64_t)c.hidden, a = (uint64_t)c.heads, s = (uint64_t)c.seq_len;
        for (int bi = 0; bi < 2; bi++) {
            const uint64_t b = (uint64_t)bs[bi], sbh = s * b * h;
            CHECK_EQ_U64(34 * sbh + 5 * a * s * s * b, layer_bytes(c, bs[bi], 1, 0, MODEL_RECOMPUTE_NONE));
            CHECK_EQ_U64(2 * sbh, layer_bytes(c, bs[bi], 1, 0, MODEL_RECOMPUTE_FULL));
            for (int ti = 1; ti < 4; ti++) {
                const uint64_t t = (uint64_t)ts[ti];
                CHECK_EQ_U64(10 * sbh + 24 * sbh / t + 5 * a * s * s * b / t,
                             layer_bytes(c, bs[bi], ts[ti], 0, MODEL_RECOMPUTE_NONE));
                CHECK_EQ_U64(34 * sbh / t + 5 * a * s * s * b / t,
                             layer_bytes(c, bs[bi], ts[ti], 1, MODEL_RECOMPUTE_NONE));
                CHECK_EQ_U64(10 * sbh + 24 * sbh / t,
                             layer_bytes(c, bs[bi], ts[ti], 0, MODEL_RECOMPUTE_SELECTIVE));
                CHECK_EQ_U64(34 * sbh / t, layer_bytes(c, bs[bi], ts[ti], 1, MODEL_RECOMPUTE_SELECTIVE));
                CHECK_EQ_U64(2 * sbh, layer_bytes(c, bs[bi], ts[ti], 0, MODEL_RECOMPUTE_FULL));
                CHECK_EQ_U64(2 * sbh / t, layer_bytes(c, bs[bi], ts[ti], 1, MODEL_RECOMPUTE_FULL));
            }
        }
    }
    printf("per-layer formulas: exact for 3 models x 2 micro-batches x 4 TP degrees\n");
    {
        /* the six cells for GPT-3 175B, b = 1, t = 8, as a reader can redo them */
        const ModelConfig c = models[0];
        const uint64_t h = 12288, a = 96, s = 2048, t = 8, sbh = s * h;
        const struct {
            const char *name;
            uint64_t formula, got;
        } rows[6] = {
            {"no parallelism  sbh(34 + 5as/h)", 34 * sbh + 5 * a * s * s,
             layer_bytes(c, 1, 1, 0, MODEL_RECOMPUTE_NONE)},
            {"tp              sbh(10 + 24/t + 5as/(ht))", 10 * sbh + 24 * sbh / t + 5 * a * s * s / t,
             layer_bytes(c, 1, 8, 0, MODEL_RECOMPUTE_NONE)},
            {"tp + sp         sbh(34/t + 5as/(ht))", 34 * sbh / t + 5 * a * s * s / t,
             layer_bytes(c, 1, 8, 1, MODEL_RECOMPUTE_NONE)},
            {"tp + selective  sbh(10 + 24/t)", 10 * sbh + 24 * sbh / t,
             layer_bytes(c, 1, 8, 0, MODEL_RECOMPUTE_SELECTIVE)},
            {"tp + sp + sel.  sbh(34/t)", 34 * sbh / t, layer_bytes(c, 1, 8, 1, MODEL_RECOMPUTE_SELECTIVE)},
            {"full recompute  2sbh", 2 * sbh, layer_bytes(c, 1, 8, 0, MODEL_RECOMPUTE_FULL)},
        };
        printf("%-42s %14s %14s %6s\n", "gpt3-175b, b 1, t 8, bytes per layer", "Korthikanti", "parallax",
               "diff");
        for (int i = 0; i < 6; i++) {
            printf("%-42s %14" PRIu64 " %14" PRIu64 " %6" PRId64 "\n", rows[i].name, rows[i].formula,
                   rows[i].got, (int64_t)(rows[i].got - rows[i].formula));
            CHECK_EQ_U64(rows[i].formula, rows[i].got);
        }
    }

    /* First stage of 1F1B with m >= p: p sets of L/p layers plus p embedding dropout masks. */
    {
        ModelConfig c = fx_gpt(96, 12288, 96, 51200, 2048);
        const int p = 8, t = 8;
        ModelSpec s = fx_spec(c);
        s.layout.tp = t;
        s.layout.pp = p;
        s.layout.sp = 1;
        s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
        s.job.dropout = 0.1;
        s.job.flash_attn = 0;
        s.job.global_batch = 32;
        SimResult r;
        ProfCluster cl;
        CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
        CHECK_OK(sim_run(&s, &cl, p * t, &r, &err), err);
        const uint64_t sbh = 2048ull * 12288;
        CHECK_EQ_INT(p, r.mem[0].peak_live);
        CHECK_EQ_U64(96 * (34 * sbh / t) + p * sbh / t, r.mem[0].cat[MODEL_ACTIVATIONS]);
        sim_result_free(&r);
    }
    /* p = 1: the output layer adds 4*s*b*h/t*(1 + V/h) (final norm input, logits input and
     * fp32 logits), the embedding dropout mask s*b*h/t. */
    {
        ModelConfig c = fx_gpt(40, 6144, 48, 51200, 2048);
        const int t = 8;
        ModelSpec s = fx_spec(c);
        s.layout.tp = t;
        s.layout.sp = 1;
        s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
        s.job.dropout = 0.1;
        s.job.flash_attn = 0;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, t, &d, &err), err);
        ModelTensorTable tt;
        CHECK_OK(model_tensors_build(&s, &d, 0, &tt, &err), err);
        const uint64_t sbh = 2048ull * 6144, sbV = 2048ull * 51200;
        CHECK_EQ_U64(40 * (34 * sbh / t) + sbh / t + 4 * sbh / t + 4 * sbV / t, tt.act_chunk_bytes[0]);
        model_tensors_free(&tt);
    }
    /* Interleaved: L*(1 + (p-1)/(p*v)) layers on the first stage (p = 4, v = 2, L = 16: 22),
     * i.e. 2(p-1) + (v-1)p + 1 = 11 chunk sets in flight. Dropout off: no embedding mask. */
    {
        ModelConfig c = fx_gpt(16, 4096, 32, 51200, 2048);
        ModelSpec s = fx_spec(c);
        s.layout.pp = 4;
        s.layout.vpp = 2;
        s.layout.tp = 4;
        s.layout.sp = 1;
        s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
        s.job.flash_attn = 0;
        s.job.global_batch = 8;
        SimResult r;
        ProfCluster cl;
        CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
        CHECK_OK(sim_run(&s, &cl, 16, &r, &err), err);
        CHECK_EQ_INT(11, r.mem[0].peak_live);
        CHECK_EQ_U64(22 * model_layer_activation_bytes(&r.spec, &r.dims), r.mem[0].cat[MODEL_ACTIVATIONS]);
        /* the last stage keeps fewer: (p-s-1)*2 + (v-1)*p + 1 = 5 sets */
        CHECK_EQ_INT(5, r.mem[3].peak_live);
        sim_result_free(&r);
    }
    TEST_DONE("golden_activations");
}
