/* Communication bytes per rank and kind per step, each recomputed from the closed forms:
 * Megatron TP (2 all-reduces of b*s*h forward, 2 backward per layer; SP turns them into
 * all-gather / reduce-scatter pairs and re-gathers saved inputs in backward), DP all-reduce of
 * the gradients once per step, ZeRO-1 reduce-scatter + all-gather, ZeRO-3 two gathers and one
 * reduce-scatter per block per micro-batch (ZeRO paper: 3 Psi), PP one send/recv of b*s*h per
 * stage boundary per micro-batch each way, CP all-gathers of K and V. Bytes are the buffer size
 * S of each call, nccl-tests' "size". */
#include "fixtures.h"
#include "test.h"

static ProfCluster cl;

static SimResult run(ModelSpec s, int gpus)
{
    PxError err = {0};
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, gpus, &r, &err), err);
    return r;
}

static uint64_t rank_params(const SimResult *r, int stage)
{
    PxError err = {0};
    ModelTensorTable tt;
    CHECK_OK(model_tensors_build(&r->spec, &r->dims, stage, &tt, &err), err);
    uint64_t p = tt.params;
    model_tensors_free(&tt);
    return p;
}

/* Sum over blocks of the block padded to a multiple of g. */
static uint64_t padded_params(const SimResult *r, int stage, uint64_t g)
{
    PxError err = {0};
    ModelTensorTable tt;
    CHECK_OK(model_tensors_build(&r->spec, &r->dims, stage, &tt, &err), err);
    uint64_t p = 0;
    for (int i = 0; i < tt.n_blocks; i++)
        p += px_round_up(tt.blocks[i].numel, g);
    model_tensors_free(&tt);
    return p;
}

int main(void)
{
    px_log_set_quiet(1);
    PxError err = {0};
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec base;
    model_spec_defaults(&base);
    CHECK_OK(model_config_load("gpt3-1.3b", &base.model, &err), err);
    base.job.precision = PX_BF16;
    base.job.global_batch = 8;
    const uint64_t L = 24, s = 2048, h = 2048, b = 1, bsh2 = b * s * h * 2, loss = 3 * b * s * 4;

    /* tp 2 x dp 2, no SP: per micro-batch 4L all-reduces in layers, the embedding's output
     * (forward), the output layer's input gradient (backward), 3 small loss reductions. */
    ModelSpec sp = base;
    sp.layout.tp = 2;
    SimResult r = run(sp, 4);
    const uint64_t m = 4;
    CHECK_EQ_U64(m * ((4 * L + 2) * bsh2 + loss), r.comm[0][MODEL_TP_ALLREDUCE]);
    CHECK_EQ_U64(rank_params(&r, 0) * 4, r.comm[0][MODEL_DP_ALLREDUCE]); /* fp32 grads */
    CHECK_EQ_U64(0, r.comm[0][MODEL_TP_ALL_GATHER] + r.comm[0][MODEL_PP_SEND] + r.comm[0][MODEL_DP_ALL_GATHER]);
    sim_result_free(&r);

    /* + full recompute: the recomputed forward repeats its 2 all-reduces per layer */
    sp.layout.recompute = MODEL_RECOMPUTE_FULL;
    sp.layout.dp = 0;
    r = run(sp, 4);
    CHECK_EQ_U64(m * ((6 * L + 2) * bsh2 + loss), r.comm[0][MODEL_TP_ALLREDUCE]);
    sim_result_free(&r);

    /* SP: per layer forward 2 all-gathers + 2 reduce-scatters; backward 2 all-gathers of output
     * gradients, 2 re-gathers of saved inputs, 2 reduce-scatters. Embedding: reduce-scatter
     * forward, all-gather backward; output layer: all-gather forward, re-gather and
     * reduce-scatter backward. Selective recompute adds no communication. The norms'
     * replicated weights and biases see only their rank's sequence shard: their gradients
     * are all-reduced over TP once per step (2 norms per layer and the final one, 2h fp32
     * values each with LayerNorm's bias). */
    sp = base;
    sp.layout.tp = 2;
    sp.layout.sp = 1;
    sp.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    r = run(sp, 4);
    CHECK_EQ_U64(m * (6 * L + 3) * bsh2, r.comm[0][MODEL_TP_ALL_GATHER]);
    CHECK_EQ_U64(m * (4 * L + 2) * bsh2, r.comm[0][MODEL_TP_REDUCE_SCATTER]);
    CHECK_EQ_U64(m * loss + (2 * L + 1) * 2 * h * 4, r.comm[0][MODEL_TP_ALLREDUCE]);
    sim_result_free(&r);

    /* ZeRO-1 over dp 4: reduce-scatter fp32 gradients, all-gather bf16 parameters, per step;
     * ZeRO-2 reduce-scatters every micro-batch. */
    sp = base;
    sp.layout.zero = 1;
    r = run(sp, 4);
    uint64_t pad = padded_params(&r, 0, 4);
    CHECK_EQ_U64(pad * 4, r.comm[0][MODEL_DP_REDUCE_SCATTER]);
    CHECK_EQ_U64(pad * 2, r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64(0, r.comm[0][MODEL_DP_ALLREDUCE]);
    sim_result_free(&r);
    sp.layout.zero = 2;
    sp.layout.dp = 0;
    r = run(sp, 4);
    CHECK_EQ_U64(2 * pad * 4, r.comm[0][MODEL_DP_REDUCE_SCATTER]); /* m = 2 */
    CHECK_EQ_U64(pad * 2, r.comm[0][MODEL_DP_ALL_GATHER]);
    sim_result_free(&r);

    /* ZeRO-3, dp 8, m 1, 2-byte grads: every block gathered for forward and for backward and its
     * gradient reduce-scattered: 3 Psi (the tied embedding is gathered again for the output
     * layer, forward and backward). */
    sp.layout.zero = 3;
    sp.layout.dp = 0;
    sp.job.grad_dtype = PX_BF16;
    r = run(sp, 8);
    pad = padded_params(&r, 0, 8);
    uint64_t embed = px_round_up((uint64_t)r.dims.vocab_pad * h + s * h, 8);
    CHECK_EQ_U64(2 * pad * 2 + 2 * embed * 2, r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64(pad * 2, r.comm[0][MODEL_DP_REDUCE_SCATTER]);
    sim_result_free(&r);

    /* PP 4 x dp 2, m 4: first and last stages one send and one receive per micro-batch, middle
     * stages two of each; tied embeddings all-reduce their gradient between first and last. */
    sp = base;
    sp.layout.pp = 4;
    r = run(sp, 8);
    CHECK_EQ_U64(m * bsh2, r.comm[0][MODEL_PP_SEND]);
    CHECK_EQ_U64(m * bsh2, r.comm[0][MODEL_PP_RECV]);
    CHECK_EQ_U64(2 * m * bsh2, r.comm[1][MODEL_PP_SEND]);
    CHECK_EQ_U64(2 * m * bsh2, r.comm[2][MODEL_PP_RECV]);
    CHECK_EQ_U64(m * bsh2, r.comm[3][MODEL_PP_SEND]);
    CHECK_EQ_U64((uint64_t)r.dims.vocab_pad * h * 4, r.comm[0][MODEL_EMBED_ALLREDUCE]);
    CHECK_EQ_U64((uint64_t)r.dims.vocab_pad * h * 4, r.comm[3][MODEL_EMBED_ALLREDUCE]);
    CHECK_EQ_U64(0, r.comm[1][MODEL_EMBED_ALLREDUCE]);
    CHECK_EQ_U64(rank_params(&r, 1) * 4, r.comm[1][MODEL_DP_ALLREDUCE]);
    sim_result_free(&r);

    /* Interleaved pp 2 x vpp 2, m 4: stage 0 holds chunks 0 and 2 of 4; chunk 0 sends forward
     * and receives backward, chunk 2 does both directions both ways: 3 sends, 3 receives. */
    sp = base;
    sp.layout.pp = 2;
    sp.layout.vpp = 2;
    r = run(sp, 4);
    CHECK_EQ_U64(3 * m * bsh2, r.comm[0][MODEL_PP_SEND]);
    CHECK_EQ_U64(3 * m * bsh2, r.comm[0][MODEL_PP_RECV]);
    sim_result_free(&r);

    /* CP 2 x tp 2 (docs/time.md, "Context parallelism"): per layer per micro-batch the rank's
     * own K and V, kvb = b x s/2 x 2 kv width / tp in bf16. The ring (p2p, the default) sends
     * them cp - 1 = 1 time forward; backward 1 time again and dK, dV cp = 2 times; gradients
     * reduce over dp x cp. */
    sp = base;
    sp.layout.tp = 2;
    sp.layout.cp = 2;
    sp.job.global_batch = 4;
    r = run(sp, 4);
    const uint64_t kv = b * s * 2 * (h / 2) * 2, kvb = kv / 2;
    CHECK_EQ_U64(4 * L * (1 + 3) * kvb, r.comm[0][MODEL_CP_P2P]); /* m 4 */
    CHECK_EQ_U64(0, r.comm[0][MODEL_CP_ALL_GATHER]);
    CHECK_EQ_U64(rank_params(&r, 0) * 4, r.comm[0][MODEL_DP_ALLREDUCE]);
    CHECK_EQ_INT(2, r.dims.zero_group);
    sim_result_free(&r);

    /* full recompute repeats the forward's exchange before the backward */
    sp.layout.recompute = MODEL_RECOMPUTE_FULL;
    r = run(sp, 4);
    CHECK_EQ_U64(4 * L * (1 + 1 + 3) * kvb, r.comm[0][MODEL_CP_P2P]);
    sim_result_free(&r);
    sp.layout.recompute = MODEL_RECOMPUTE_NONE;

    /* allgather: K and V of the full sequence gathered in forward and again in backward,
     * their gradients reduce-scattered */
    sp.layout.cp_comm = MODEL_CP_COMM_ALLGATHER;
    r = run(sp, 4);
    CHECK_EQ_U64(4 * L * 2 * kv, r.comm[0][MODEL_CP_ALL_GATHER]); /* m 4, 2 per layer */
    CHECK_EQ_U64(4 * L * kv, r.comm[0][MODEL_CP_REDUCE_SCATTER]);
    CHECK_EQ_U64(0, r.comm[0][MODEL_CP_P2P]);
    sim_result_free(&r);

    /* a2a (Ulysses): each pass moves the rank's Q, K, V (3 x h/2 wide) and its output (h/2),
     * b x s/2 tokens, in bf16; with flash attention (the default) the backward also moves the
     * saved output, which the fused backward reads in the head split */
    sp.layout.cp_comm = MODEL_CP_COMM_A2A;
    r = run(sp, 4);
    const uint64_t qkv = b * (s / 2) * 3 * (h / 2) * 2, out = b * (s / 2) * (h / 2) * 2;
    CHECK_EQ_U64(4 * L * (2 * qkv + 3 * out), r.comm[0][MODEL_CP_ALL_TO_ALL]);
    CHECK_EQ_U64(0, r.comm[0][MODEL_CP_P2P]);
    sim_result_free(&r);
    sp.job.flash_attn = 0;
    r = run(sp, 4);
    CHECK_EQ_U64(4 * L * 2 * (qkv + out), r.comm[0][MODEL_CP_ALL_TO_ALL]);
    sim_result_free(&r);
    sp.job.flash_attn = 1;

    /* cp 4, tp 1: kvb = b x s/4 x 2h; the ring's 3 steps forward, 3 + 4 backward */
    sp = base;
    sp.layout.cp = 4;
    sp.job.global_batch = 4;
    r = run(sp, 4);
    const uint64_t kvb4 = b * (s / 4) * 2 * h * 2;
    CHECK_EQ_U64(4 * L * (3 + 7) * kvb4, r.comm[0][MODEL_CP_P2P]);
    sim_result_free(&r);
    TEST_DONE("comm");
}
