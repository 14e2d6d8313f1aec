/* The prediction of one published layout, recomputed by hand, and the contract of its JSON.
 *
 * GPT-3 175B on Selene with Megatron's layout (Narayanan et al. 2021, Sec. 5.1): 1536 GPUs,
 * tp 8, pp 12 (so dp 16), global batch 2304, micro-batch 1, sequence 2048, bf16 with fp32
 * gradients, master weights and Adam state (18 bytes per parameter), flash attention, no
 * dropout, 1F1B. Every memory category of every stage and the busiest stage's communication
 * follow from closed forms that a reader can redo:
 *   weights per layer per rank   12h^2/t + 7h/t (QKV and fc1 biases, split) + 6h (the two
 *                                row-parallel biases and the two norms' weights and biases)
 *   stage 0 adds                 the word embedding V'h/t and the positions s*h
 *   the last stage adds          its copy of the tied output layer V'h/t and the final norm 2h
 *   grads, master                4 bytes per parameter each; Adam m and v 8
 *   saved activations per layer  Korthikanti et al. 2022 Table 2 without dropout masks and
 *                                with flash attention instead of the s x s terms:
 *                                8sbh (norm, QKV, fc1 inputs and the second norm's, replicated)
 *                                + 24sbh/t (Q, K, V, core output, GeLU and fc2 inputs) + the
 *                                fp32 log-sum-exp 4*(a/t)*s*b
 *   in flight on stage i         p - i micro-batches (1F1B), so stage 0 holds L = 96 layers'
 *                                worth, as Korthikanti Sec. 4.2.3 says
 *   the last stage adds          the final norm input and the logits input (2sbh each) and the
 *                                fp32 logits 4*s*b*V'/t
 * with V' = 50264, GPT-2's 50257 padded to a multiple of t. */
#include "fixtures.h"
#include "test.h"

static const cJSON *item(const cJSON *o, const char *key)
{
    const cJSON *i = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!i)
        fprintf(stderr, "missing key '%s'\n", key);
    CHECK(i != NULL);
    return i;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *i = item(o, key);
    CHECK(cJSON_IsNumber(i));
    return i->valuedouble;
}

int main(void)
{
    px_log_set_quiet(1);
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("gpt3-175b", &s.model, &err), err);
    s.layout.tp = 8;
    s.layout.pp = 12;
    s.job.global_batch = 2304;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 1536, &r, &err), err);

    const uint64_t h = 12288, sl = 2048, b = 1, a = 96, t = 8, p = 12, V = 50264, m = 144;
    const uint64_t sbh = sl * b * h, lpr = 8; /* layers per stage */
    CHECK_EQ_INT(16, r.spec.layout.dp);
    CHECK_EQ_INT(PX_BF16, r.spec.job.precision);
    CHECK_EQ_INT((int)V, r.dims.vocab_pad);
    CHECK_EQ_INT((int)m, r.dims.m);
    CHECK_EQ_U64(174604259328ull, (uint64_t)r.params);

    const uint64_t layer_params = 12 * h * h / t + 7 * h / t + 6 * h;
    const uint64_t layer_act = 8 * sbh + 24 * sbh / t + 4 * (a / t) * sl * b;
    uint64_t peak = 0;
    for (uint64_t st = 0; st < p; st++) {
        const SimStageMemory *mem = &r.mem[st];
        uint64_t params = lpr * layer_params;
        uint64_t act = (p - st) * lpr * layer_act;
        if (st == 0)
            params += V * h / t + sl * h;
        if (st == p - 1) {
            params += V * h / t + 2 * h;
            act += 4 * sbh + 4 * sl * b * V / t;
        }
        CHECK_EQ_INT((int)(p - st), mem->peak_live);
        CHECK_EQ_U64(2 * params, mem->cat[MODEL_WEIGHTS]);
        CHECK_EQ_U64(4 * params, mem->cat[MODEL_GRADS]);
        CHECK_EQ_U64(4 * params, mem->cat[MODEL_MASTER]);
        CHECK_EQ_U64(8 * params, mem->cat[MODEL_OPTIMIZER]);
        CHECK_EQ_U64(act, mem->cat[MODEL_ACTIVATIONS]);
        /* pp.send and pp.recv: each TP rank's h/t slice of one micro-batch's activation */
        CHECK_EQ_U64(2 * 2 * sbh / t, mem->cat[MODEL_COMM_BUFFERS]);
        CHECK_EQ_U64(2ull << 30, mem->cat[MODEL_RUNTIME]);
        if (st > 0 && st < p - 1) /* four b*s*h buffers, dQKV, dFFN and flash's fp32 D */
            CHECK_EQ_U64(4 * 2 * sbh + 2 * sbh * 3 / t + 2 * sbh * 4 / t + 4 * (a / t) * sl * b,
                         mem->cat[MODEL_WORKSPACE]);
        uint64_t total = 0;
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            total += mem->cat[c];
        CHECK_EQ_U64(total, mem->total);
        if (total > peak)
            peak = total;
    }
    CHECK_EQ_U64(peak, r.peak_bytes);
    CHECK_EQ_INT(0, r.peak_stage);

    /* A middle stage per step: the gradients all-reduced once over dp (fp32); four TP
     * all-reduces of b*s*h per layer and micro-batch (Megatron's f and g, forward and
     * backward); one send and one receive each way per micro-batch of the rank's 1/t slice,
     * all-gathered over TP on arrival. */
    const uint64_t act_bytes = 2 * sbh;
    CHECK_EQ_U64(4 * lpr * layer_params, r.comm[1][MODEL_DP_ALLREDUCE]);
    CHECK_EQ_U64(4 * lpr * m * act_bytes, r.comm[1][MODEL_TP_ALLREDUCE]);
    CHECK_EQ_U64(2 * m * act_bytes / t, r.comm[1][MODEL_PP_SEND]);
    CHECK_EQ_U64(2 * m * act_bytes / t, r.comm[1][MODEL_PP_RECV]);
    CHECK_EQ_U64(2 * m * act_bytes, r.comm[1][MODEL_TP_ALL_GATHER]);

    /* Model FLOPs: 72*B*s*l*h^2*(1 + s/(6h) + V'/(12*l*h)) (Korthikanti 2022, Sec. 6); flash
     * attention's recomputed scores are hardware FLOPs only. */
    const double B = 2304, S = 2048, L = 96, H = 12288;
    const double model = 72 * B * S * L * H * H * (1 + S / (6 * H) + (double)V / (12 * L * H));
    CHECK_REL(model, r.model_flops, 1e-12);
    CHECK_REL(model + 2 * B * S * S * L * H, r.hardware_flops, 1e-12);

    /* The JSON carries prediction's keys (docs/formats.md) and model.params. */
    cJSON *j = sim_result_to_json(&r);
    CHECK_EQ_U64(174604259328ull, (uint64_t)num(item(j, "model"), "params"));
    const cJSON *mem = item(j, "memory");
    CHECK_EQ_U64(r.peak_bytes, (uint64_t)num(mem, "peak_bytes"));
    const cJSON *ps = item(mem, "per_stage");
    CHECK_EQ_INT((int)p, cJSON_GetArraySize(ps));
    const char *cats[] = {"weights", "grads", "master", "optimizer", "activations",
                          "comm_buffers", "workspace", "runtime"};
    for (int st = 0; st < (int)p; st++) {
        const cJSON *e = cJSON_GetArrayItem(ps, st);
        CHECK_EQ_INT(st, (int)num(e, "stage"));
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            CHECK_EQ_U64(r.mem[st].cat[c], (uint64_t)num(e, cats[c]));
        CHECK_EQ_U64(r.mem[st].total, (uint64_t)num(e, "total"));
    }
    const cJSON *fl = item(j, "flops");
    CHECK_REL(r.model_flops, num(fl, "model_per_step"), 1e-15);
    CHECK_REL(r.hardware_flops, num(fl, "hardware_per_step"), 1e-15);
    const cJSON *tm = item(j, "time");
    const char *times[] = {"step_s", "bubble_fraction", "compute_s", "tp_comm_s", "pp_comm_s",
                           "dp_comm_exposed_s", "optimizer_s"};
    for (size_t i = 0; i < sizeof times / sizeof *times; i++)
        CHECK(num(tm, times[i]) >= 0);
    CHECK(num(tm, "step_s") > 0);
    const cJSON *kinds = item(item(j, "comm"), "per_rank_bytes");
    const char *kind_names[] = {"dp_allreduce", "dp_reduce_scatter", "dp_all_gather",
                                "tp_allreduce", "tp_all_gather", "tp_reduce_scatter",
                                "pp_send", "pp_recv", "cp_all_gather"};
    for (size_t i = 0; i < sizeof kind_names / sizeof *kind_names; i++)
        CHECK(num(kinds, kind_names[i]) >= 0);
    const cJSON *tp = item(j, "throughput");
    CHECK(num(tp, "tokens_per_s") > 0 && num(tp, "tflops_per_gpu") > 0);
    CHECK(num(tp, "mfu") > 0 && num(tp, "mfu") < num(tp, "hfu"));
    const cJSON *ops = item(j, "ops");
    CHECK(cJSON_GetArraySize(ops) > 0);
    const cJSON *op;
    cJSON_ArrayForEach(op, ops)
    {
        CHECK(cJSON_IsString(item(op, "name")));
        CHECK(num(op, "seconds") >= 0 && num(op, "flops") >= 0 && num(op, "bytes") >= 0);
    }
    cJSON_Delete(j);
    sim_result_free(&r);

    /* One stage, so no bubble: exactly 0, never a rounding error below it (summing the
     * micro-batches' times left -4e-16 here). */
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-8b", &s.model, &err), err);
    s.layout.tp = 8;
    s.job.global_batch = 16;
    CHECK_OK(sim_run(&s, &cl, 8, &r, &err), err);
    CHECK(r.bubble_fraction == 0.0);
    sim_result_free(&r);
    TEST_DONE("prediction");
}
