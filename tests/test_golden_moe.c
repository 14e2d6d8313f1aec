/* Golden: mixture-of-experts models in the tensor table, the op graph and the simulator.
 *   - the tables' parameters (tp 1, pp 1, ep 1) equal the configuration's count, MoE experts,
 *     MLA and the prediction module included, for every MoE model of the zoo;
 *   - model FLOPs equal Megatron-LM's num_floating_point_operations (megatron/training/
 *     training.py, MoE, MLA and MTP terms) on DeepSeek-V3 (with and without its prediction
 *     module) and Qwen3-235B-A22B shapes, up to the terms the conventions differ by, written
 *     out below: the router's GEMM, which parallax counts and Megatron leaves out, and norms
 *     (MLA's "+1" per latent, a prediction module's three), which Megatron counts as FLOPs and
 *     parallax as memory traffic;
 *   - memory and all-to-all bytes of tiny-moe at ep 2 x dp 2, derived by hand;
 *   - the expert-parallel rules. */
#include "fixtures.h"
#include "test.h"

static void table_params(const char *zoo)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(zoo, &s.model, &err), err);
    s.job.global_batch = 1;
    s.job.seq_len = 128;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
    ModelTensorTable tt;
    CHECK_OK(model_tensors_build_compact(&s, &d, 0, &tt, &err), err);
    printf("%-18s table %.0f  config %.0f\n", zoo, (double)tt.params, model_config_params(&s.model));
    CHECK_EQ_U64((uint64_t)model_config_params(&s.model), tt.params);
    model_tensors_free(&tt);
}

/* Megatron-LM's num_floating_point_operations for a MoE model with MLA or GQA (SwiGLU, causal
 * attention), batch B of sequences s, the vocabulary padded as given. Its MTP modules count as
 * layers of the last layer's kind, plus their norms and eh projection, 3h + 2h^2 per token,
 * and one more output layer each (training.py at Megatron-LM d98e8a64). */
static double megatron_flops(const ModelConfig *c, double B, double s, double vpad)
{
    const ModelMoe *m = &c->moe;
    const double mtp = c->mtp_layers, h = c->hidden, L = c->layers + mtp, g = 1.5;
    const double nm = model_moe_layers_in(c, 0, c->layers + c->mtp_layers), nd = L - nm;
    double attn;
    if (c->mla.kv_lora_rank > 0) {
        const ModelMla *a = &c->mla;
        const double H = c->heads, qk = a->qk_nope_dim, rope = a->qk_rope_dim;
        const double q_term = a->q_lora_rank * (h + H * (qk + rope) + 1);
        attn = 6 * L *
               (q_term + a->kv_lora_rank * (h + H * (qk + a->v_dim) + 1) + h * rope +
                H * a->v_dim * h + s * H * (qk + rope) / 2 + s * H * a->v_dim / 2);
    } else {
        const double ratio = (double)c->heads * c->head_dim / h;
        attn = 12 * L * h * h * ((1 + (double)c->kv_heads / c->heads + s / h / 2) * ratio);
    }
    const double mlp = 12 * L * h *
                       (c->ffn_hidden * g * (nd / L) + m->expert_ffn * (double)m->topk * g * (nm / L) +
                        m->shared_ffn * g * (nm / L));
    return B * s * (mlp + attn + 6 * mtp * (3 * h + 2 * h * h) + 6 * h * vpad * (mtp + 1));
}

static void flops_vs_megatron(const char *zoo, int gpus, int tp, int ep, int keep_mtp)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(zoo, &s.model, &err), err);
    if (!keep_mtp)
        s.model.mtp_layers = 0; /* the main model alone */
    s.layout.tp = tp;
    s.layout.sp = tp > 1;
    s.layout.ep = ep;
    s.job.seq_len = 4096;
    s.job.global_batch = 2 * gpus / tp;
    s.job.pad_vocab = 128; /* Megatron's --make-vocab-size-divisible-by */
    s.job.causal_flops = 1;
    s.job.precision = PX_BF16;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, gpus, &r, &err), err);
    const ModelConfig *c = &s.model;
    const double B = s.job.global_batch, S = 4096, h = c->hidden;
    const double vpad = (double)px_round_up((uint64_t)c->vocab, 128u * (uint64_t)tp);
    const double nm = model_moe_layers_in(c, 0, c->layers + c->mtp_layers);
    const double meg = megatron_flops(c, B, S, vpad);
    const double router = 6.0 * B * S * nm * c->moe.experts * h;
    /* norms Megatron counts as FLOPs and parallax as traffic: MLA's two latent norms per layer,
     * a prediction module's three */
    const double norms = 6.0 * B * S * (c->layers + c->mtp_layers) * (c->mla.q_lora_rank + c->mla.kv_lora_rank) +
                         6.0 * B * S * c->mtp_layers * 3.0 * h;
    printf("%-18s megatron %.6e  + router %.4e  - mla norms %.4e  parallax %.6e\n", zoo, meg,
           router, norms, r.model_flops);
    CHECK_REL(meg + router - norms, r.model_flops, 1e-12);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* tiny-moe (4 layers, h 64, 8 heads of 8, 4 KV heads, ffn 176, vocab 256; layer 0 dense, layers
 * 1-3 MoE: 8 experts of ffn 64, top-2, one shared expert of 64) on 4 ranks, ep 2: dp 4,
 * expert dp 4 / 2 = 2, bf16, ZeRO-1, gbs 4, mbs 1, seq 64.
 *   per layer: norms 2 x 64 = 128; attention qkv (64 + 2 x 32) x 64 = 8192, proj 4096
 *   dense MLP (layer 0): fc1 2 x 176 x 64 = 22528, fc2 176 x 64 = 11264     -> 46208
 *   MoE layer, dense part: 128 + 12288 + router 8 x 64 = 512 + shared 8192 + 4096 -> 25216
 *   experts: 8 x (2 x 64 x 64 + 64 x 64) = 98304, 4 per rank: 49152
 *   embed 256 x 64 = 16384; final: norm 64 + output 16384 = 16448
 *   weights (bf16): 16384 + 46208 + 3 x 25216 + 16448 + 3 x 49152 = 302144 params, 604288 B
 *   grads (fp32, ZeRO-1 keeps them whole): 1208576 B
 *   master (fp32) over the blocks' groups: dense blocks / 4, experts / 2:
 *     4096 + 11552 + 3 x 6304 + 4112 + 3 x 24576 = 112400 values, 449600 B; Adam m, v 899200 B
 *   all-to-all: 64 tokens x top-2 = 128 rows of 64 x 2 B = 16384 B a call; dispatch and combine,
 *     forward and backward: 4 calls x 3 MoE layers x 1 micro-batch = 196608 B a step
 *   expert-dp gradient reduce-scatter: 3 blocks x 49152 x 4 B = 589824 B. */
static void tiny_moe_ep2(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny-moe", &s.model, &err), err);
    s.layout.ep = 2;
    s.layout.zero = 1;
    s.job.global_batch = 4;
    s.job.precision = PX_BF16;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 4, &r, &err), err);
    CHECK_EQ_U64(604288, r.mem[0].cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64(1208576, r.mem[0].cat[MODEL_GRADS]);
    CHECK_EQ_U64(449600, r.mem[0].cat[MODEL_MASTER]);
    CHECK_EQ_U64(899200, r.mem[0].cat[MODEL_OPTIMIZER]);
    CHECK_EQ_U64(196608, r.comm[0][MODEL_EP_ALL_TO_ALL]);
    CHECK_EQ_U64(3 * 49152 * 4, r.comm[0][MODEL_EDP_REDUCE_SCATTER]);
    CHECK_EQ_U64(3 * 49152 * 2, r.comm[0][MODEL_EDP_ALL_GATHER]);
    CHECK_EQ_U64(0, r.comm[0][MODEL_ETP_ALL_GATHER]);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* DeepSeek-V3 as its report trains it (Sec. 3.2): 2048 GPUs, pp 16, ep 64, ZeRO-1, no TP;
 * docs/moe.md derives a middle stage's model state by hand. */
static void deepseek_v3_2048(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("deepseek-v3", &s.model, &err), err);
    s.layout.pp = 16;
    s.layout.ep = 64;
    s.layout.zero = 1;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    CHECK_OK(model_split_parse("3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,2", "test", &s.layout, &err), err);
    s.job.seq_len = 4096;
    s.job.global_batch = 1024;
    s.job.precision = PX_BF16;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2048, &r, &err), err);
    const uint64_t params = 4ull * (232996864ull + 176160768ull);
    CHECK_EQ_U64(1636630528ull, params);
    CHECK_EQ_U64(params * 2, r.mem[1].cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64(params * 4, r.mem[1].cat[MODEL_GRADS]);
    const uint64_t states = 4ull * (232996864ull / 128 + 176160768ull / 2);
    CHECK_EQ_U64(states * 4, r.mem[1].cat[MODEL_MASTER]);
    CHECK_EQ_U64(states * 8, r.mem[1].cat[MODEL_OPTIMIZER]);
    printf("deepseek-v3 2048 pp16 ep64 stage 1: weights %.2f GiB grads %.2f master+adam %.2f "
           "activations %.2f GiB\n",
           r.mem[1].cat[MODEL_WEIGHTS] / 1073741824.0, r.mem[1].cat[MODEL_GRADS] / 1073741824.0,
           (r.mem[1].cat[MODEL_MASTER] + r.mem[1].cat[MODEL_OPTIMIZER]) / 1073741824.0,
           r.mem[1].cat[MODEL_ACTIVATIONS] / 1073741824.0);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* torchtitan's op-level selective recompute of multi-head latent attention's layers
 * (model_sac_op_matmuls; docs/time.md, "Frameworks"), by hand. tiny-dsv3 on one rank, fp32,
 * 8 micro-batches of 32 tokens (M = 32): h 64, 4 heads, q_lora 32, kv_lora 16, rope 8, nope
 * 16, v 16, ffn 176 (SwiGLU); layer 0 dense, 1-3 MoE, and the prediction module's layer (MoE).
 * The forward's matmuls q_a, kv_a, q_b, kv_b, wo, w1, w3, w2: the 2nd, 4th, 6th and 8th rerun.
 *   kv_a 2 x 32 x (16 + 8) x 64 = 98304, kv_b 2 x 32 x 4 (16 + 16) x 16 = 131072 (every layer);
 *   w1 = w2 = 2 x 32 x 176 x 64 = 720896 (layer 0 only: a MoE layer's MLP half is not rerun)
 *   a step: 8 x (1671168 + 4 x 229376) = 20709376 recompute FLOPs.
 * Priced as a dense layer's (wk 80 wide, wo, w3) it was 8 x (1310720 + 4 x 589824) = 29360128.
 * Saved: kv_a reruns into the latent it wrote (no SP): attn.kv_lat, 32 x 24 x 4 = 3072 bytes
 * a layer, leaves the activations (769536 bytes before, 5 layers: 754176) for ws.recompute
 * (242752 + 3072 = 245824). With TP 2 and SP the gathered latent stays saved. */
static void mla_op_sac(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny-dsv3", &s.model, &err), err);
    s.job.global_batch = 8;
    s.job.micro_batch = 1;
    s.job.seq_len = 32;
    s.job.precision = PX_FP32;
    s.job.framework = MODEL_FW_TORCHTITAN;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 1, &r, &err), err);
    double rec = 0; /* a micro-batch's */
    for (int i = 0; i < r.ops[0].count; i++)
        if (r.ops[0].op[i].phase == MODEL_RECOMPUTE)
            rec += r.ops[0].op[i].flops * r.ops[0].op[i].repeat;
    CHECK_EQ_U64(20709376, (uint64_t)(8 * rec));
    CHECK_EQ_U64(754176, r.mem[0].cat[MODEL_ACTIVATIONS]);
    CHECK_EQ_U64(245824, r.mem[0].cat[MODEL_WORKSPACE]);
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
    CHECK(model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_KV_A) == 1 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_KV_B) == 1 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_Q_A) == 0 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_Q_B) == 0 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_PROJ) == 0 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_FC1) == 1 && /* w1, not w3 */
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_FC2) == 1 &&
          model_sac_op_matmuls(&s, &d, 1, MODEL_OPR_FC1) == 0);
    sim_result_free(&r);
    /* without a query latent: q_b (2nd) and wo (4th), then w3 (6th), as a dense layer's */
    s.model.mla.q_lora_rank = 0;
    CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
    CHECK(model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_KV_A) == 0 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_Q_B) == 1 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_KV_B) == 0 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_PROJ) == 1 &&
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_FC1) == 2 && /* w3 */
          model_sac_op_matmuls(&s, &d, 0, MODEL_OPR_FC2) == 0);
    prof_cluster_free(&cl);
}

/* DeepSeek-V3 under torchtitan's op-level selective recompute: 1024 GPUs, pp 16 (3, 3, 4 x 13,
 * 3 layers), ep 64, no TP, bf16, sequence 4096, global batch 4096: 64 micro-batches of one
 * sequence per rank. A layer's rerun matmuls per micro-batch (M = 4096, h 7168, 128 heads,
 * q_lora 1536, kv_lora 512, rope 64, nope 128, v 128, dense ffn 18432):
 *   kv_a 2 M (512 + 64) h = 33822867456, kv_b 2 M 128 (128 + 128) 512 = 137438953472,
 *   w1 = w2 = 2 M 18432 h = 1082331758592 (the first three layers are dense): 2335925338112.
 *   Stage 0, its three dense layers: 64 x 3 x 2335925338112 = 448497664917504 a step.
 *   Priced as a dense layer's (wk 20480 wide: 1202590842880, wo 962072674304, w3):
 *   64 x 3 x 3246995275776 = 623423092948992, the stage's rank 174925428031488 FLOPs more
 *   (4300155616493568 a step where it is 4125230188462080).
 * Saved: the latent attn.kv_lat (4096 x 576 x 2 bytes) no more, for stage 0's 3 layers and
 * the 16 micro-batches 1F1B holds there: 226492416 bytes fewer activations. */
static void deepseek_v3_op_sac(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("deepseek-v3", &s.model, &err), err);
    s.layout.pp = 16;
    s.layout.ep = 64;
    CHECK_OK(model_split_parse("3,3,4,4,4,4,4,4,4,4,4,4,4,4,4,3", "test", &s.layout, &err), err);
    s.job.seq_len = 4096;
    s.job.global_batch = 4096;
    s.job.precision = PX_BF16;
    s.job.framework = MODEL_FW_TORCHTITAN;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 1024, &r, &err), err);
    double rec = 0; /* a micro-batch's */
    for (int i = 0; i < r.ops[0].count; i++)
        if (r.ops[0].op[i].phase == MODEL_RECOMPUTE)
            rec += r.ops[0].op[i].flops * r.ops[0].op[i].repeat;
    printf("deepseek-v3 op-level recompute, stage 0: %.0f FLOPs a step, rank %.0f, "
           "activations %llu\n", 64 * rec, r.rank_flops[0],
           (unsigned long long)r.mem[0].cat[MODEL_ACTIVATIONS]);
    CHECK_EQ_U64(448497664917504ull, (uint64_t)(64 * rec));
    CHECK_EQ_U64(4125230188462080ull, (uint64_t)r.rank_flops[0]);
    CHECK_EQ_U64(53276049408ull - 226492416ull, r.mem[0].cat[MODEL_ACTIVATIONS]);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* Megatron-Core's expert groups (parallel_state's expert RankGenerator, order tp-cp-ep-dp-pp
 * with tp = etp, cp = 1): 16 ranks, tp 2 x dp 4 x pp 2.
 *   ep 4, etp 1: EP groups {0,1,2,3} {4,5,6,7} {8..11} {12..15}; EDP {0,4} {1,5} ...
 *   ep 2, etp 2: ETP {0,1} {2,3} ...; EP {0,2} {1,3} {4,6} {5,7}; EDP {0,4} {1,5} {2,6} {3,7} */
static void expert_ranks(void)
{
    ModelLayout l = {.tp = 2, .cp = 1, .dp = 4, .pp = 2, .ep = 4, .etp = 1};
    int etp, ep, edp, pp;
    model_expert_coords(&l, 5, &etp, &ep, &edp, &pp);
    CHECK(etp == 0 && ep == 1 && edp == 1 && pp == 0);
    model_expert_coords(&l, 14, &etp, &ep, &edp, &pp);
    CHECK(etp == 0 && ep == 2 && edp == 1 && pp == 1);
    l.ep = 2;
    l.etp = 2;
    model_expert_coords(&l, 5, &etp, &ep, &edp, &pp);
    CHECK(etp == 1 && ep == 0 && edp == 1 && pp == 0);
    model_expert_coords(&l, 3, &etp, &ep, &edp, &pp);
    CHECK(etp == 1 && ep == 1 && edp == 0 && pp == 0);
    model_expert_coords(&l, 11, &etp, &ep, &edp, &pp);
    CHECK(etp == 1 && ep == 1 && edp == 0 && pp == 1);
}

static void rule(const char *zoo, int gpus, int tp, int sp, int ep, int etp, ModelRule want,
                 const char *words)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(zoo, &s.model, &err), err);
    s.layout.tp = tp;
    s.layout.sp = sp;
    s.layout.ep = ep;
    s.layout.etp = etp;
    ModelDims d;
    CHECK_EQ_INT(PX_EINPUT, model_spec_check(&s, gpus, &d, &err));
    printf("rule %-12s ep %d etp %d tp %d: %s\n", zoo, ep, etp, tp, err.msg);
    CHECK_EQ_INT(want, err.code);
    CHECK(strstr(err.msg, words) != NULL);
}

int main(void)
{
    px_log_set_quiet(1);
    const char *zoo[] = {"tiny-moe", "mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                         "gpt-oss-120b", "deepseek-v3", "mixtral-8x22b", "mixtral-8x22b-g8t8",
                         "qwen2-57b-a14b"};
    for (int i = 0; i < 9; i++)
        table_params(zoo[i]);
    flops_vs_megatron("deepseek-v3", 256, 1, 64, 0);
    flops_vs_megatron("deepseek-v3", 256, 1, 64, 1);
    flops_vs_megatron("qwen3-235b-a22b", 64, 4, 8, 0);
    tiny_moe_ep2();
    deepseek_v3_2048();
    mla_op_sac();
    deepseek_v3_op_sac();
    expert_ranks();
    rule("tiny-moe", 6, 1, 0, 3, 0, MODEL_RULE_EXPERTS, "ep 3 must divide the 8 experts");
    rule("tiny-moe", 4, 1, 0, 8, 0, MODEL_RULE_EXPERTS, "must divide the 4 ranks");
    rule("tiny-moe", 4, 2, 0, 2, 1, MODEL_RULE_SP_TP, "needs sequence parallelism");
    rule("tiny", 4, 1, 0, 2, 0, MODEL_RULE_EXPERTS, "has no experts");
    printf("%d checks passed\n", px_test_checks);
    return 0;
}
