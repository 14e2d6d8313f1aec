/* Transformer Engine's passes around context-parallel attention (model/ops.c cp_passes;
 * docs/time.md, "Context parallelism"): their bytes and kernels for a small cp 2 layout under
 * each comm type, worked by hand, and PyTorch's ring's as torchtitan runs it; their time at the
 * device's streaming rate; and where they are not priced (a CPU, DeepSpeed's, the executor's
 * own graph). */
#include "fixtures.h"
#include "sim/internal.h"
#include "test.h"

/* 2 layers, h 64, 4 heads of 16 (kv heads 4), vocabulary 128, sequence 32, bf16, flash
 * attention, cp 2 over 2 GPUs, mbs 1: a rank holds s/cp = 16 tokens. Per layer and
 * micro-batch its K, V are K = 16 x 128 x 2 = 4096 bytes, its queries Q and output O
 * 16 x 64 x 2 = 2048 each, its log-sum-exp l = 16 x 4 = 64 elements. */
static ModelSpec small(ModelCpComm comm, ModelFramework fw)
{
    ModelSpec s = fx_spec(fx_gpt(2, 64, 4, 128, 32));
    s.layout.cp = 2;
    s.layout.cp_comm = comm;
    s.layout.recompute = MODEL_RECOMPUTE_NONE;
    s.job.micro_batch = 1;
    s.job.global_batch = 1;
    s.job.framework = fw;
    return s;
}

/* The first layer's cp_passes op of phase ph in r's stage 0, or -1. */
static int passes_op(const SimResult *r, ModelPhase ph)
{
    const ModelOpGraph *g = &r->ops[0];
    for (int i = 0; i < g->count; i++)
        if (g->op[i].phase == ph && strcmp(g->op[i].name, "layer.0.attn.core.cp_passes") == 0)
            return i;
    return -1;
}

/* The first layer's cp exchange op of kind k in phase ph: its buffer and calls */
static void check_comm(const SimResult *r, ModelPhase ph, ModelComm k, uint64_t bytes, int calls)
{
    const ModelOpGraph *g = &r->ops[0];
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        if (op->kind == MODEL_OP_COMM && op->phase == ph && op->comm == k && op->layer == 0) {
            CHECK_EQ_INT((long long)bytes, (long long)op->comm_bytes);
            CHECK_EQ_INT(calls, op->calls);
            return;
        }
    }
    fprintf(stderr, "no layer 0 %s op in the %s\n", model_comm_name(k), model_phase_name(ph));
    CHECK(0);
}

static void check_passes(const SimResult *r, ModelPhase ph, double bytes, int kernels)
{
    const int i = passes_op(r, ph);
    if (i < 0)
        fprintf(stderr, "no layer.0.attn.core.cp_passes op in the %s (expected %.0f bytes)\n",
                model_phase_name(ph), bytes);
    CHECK(i >= 0);
    if (i < 0)
        return;
    const ModelOp *op = &r->ops[0].op[i];
    CHECK_REL(bytes, op->bytes, 0);
    CHECK_EQ_INT(kernels, op->kernels);
    CHECK_REL(0.0, op->flops, 0);
    /* a memory-bound kernel each: the bytes at the streaming rate, plus the launches */
    const ProfDevice *dev = &r->cluster.device;
    CHECK_REL(bytes / (dev->memory_bandwidth * dev->memory_eff) + kernels * dev->kernel_overhead_s,
              r->op_seconds[0][i], 1e-12);
}

/* The ring at cp 2 (te_ring_fwd, te_ring_bwd). Rank 0 (steps: its own, then rank 1's K, V seen
 * from its second query half): forward 2K + 32l (l cloned and widened, narrowed back) + 2O +
 * 8l (step 0's output scaled) + 14l + 1.5O (the half step merged) = 18,816; backward 2K + 4l
 * + Q + 2K (step 0: half a dQ copied, a whole dK, dV copied) + 2.5Q + 2.5K (the diagonal:
 * half copied, half added each) = 34,048. Rank 1 (rank 0's first half of K, V at step 1):
 * forward 2K + 40l + 2O + 28l + 3O = 22,784; backward 2K + 2Q + K + 3Q + 3K = 34,816. Rank 1
 * moves more (57,600 against 52,864): forward 22,784 bytes in 5 + 2 kernels, backward 34,816
 * in 1 + 2 x 2. */
static void test_ring(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s = small(MODEL_CP_COMM_P2P, MODEL_FW_MEGATRON);
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_INT(1, r.dims.cp_te);
    check_passes(&r, MODEL_FWD, 22784.0, 7);
    check_passes(&r, MODEL_BWD, 34816.0, 5);
    sim_result_free(&r);
    /* NeMo and Megatron-Bridge run Megatron-Core's too; torchtitan's ring is PyTorch's */
    s.job.framework = MODEL_FW_NEMO;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    check_passes(&r, MODEL_FWD, 22784.0, 7);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* Under the all-gather rotater the cp = 2 sends of dK, dV: the first under the core's second
 * block (half its backward), the last home after it, exposed whole (sim/time.c cp_exposed) */
static void check_dkv_exposed(const SimResult *r)
{
    const ModelOpGraph *g = &r->ops[0];
    for (int i = 1; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        if (op->kind != MODEL_OP_COMM || op->comm != MODEL_CP_P2P || op->layer != 0)
            continue;
        const double *t = r->op_seconds[0], slow = r->cluster.overlap_slowdown;
        const double call = t[i] / 2.0, block = t[i - 1] / 2.0;
        const double hidden = call < block ? call : block;
        CHECK(g->op[i - 1].kind != MODEL_OP_COMM && g->op[i - 1].phase == MODEL_BWD);
        CHECK_REL((call - hidden) + slow * hidden + call,
                  sim_comm_exposed(g, t, i, &r->spec.layout, r->dims.m, slow), 1e-12);
        return;
    }
    CHECK(0);
}

/* PyTorch's context_parallel ring as torchtitan runs it (torch_ring_fwd, torch_ring_bwd), the
 * same under either rotater (p2p, allgather). Rank 1 (its step 1: rank 0's first half of K, V,
 * merged whole): forward K, V made contiguous 2K, concatenated once 2K, step 0's output widened
 * 3O, step 1's widened 3O and merged 16O + 56l, the result narrowed 3O: 71,168 bytes in
 * 2 + 1 + 1 + 9 + 1 = 14 kernels. Backward: fp32 dQ, dK, dV zeroed 2Q + 2K, K, V contiguous 2K
 * and concatenated 2K, step 0's dK, dV added 5K and dQ 5Q, step 1's dK, dV into their first
 * half 6.5K and dQ whole 5Q, the fp32 dK, dV concatenated twice 8K, narrowed 3Q + 3K:
 * 147,456 bytes in 3 + 2 + 1 + 3 + 5 + 2 + 2 = 18. Rank 0 (step 1 partial) moves less: forward
 * 58,624, backward 144,640. Ulysses is not PyTorch's: none. */
static void test_torch_ring(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s = small(MODEL_CP_COMM_P2P, MODEL_FW_TORCHTITAN);
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_INT(0, r.dims.cp_te);
    CHECK_EQ_INT(1, r.dims.cp_torch);
    check_passes(&r, MODEL_FWD, 71168.0, 14);
    check_passes(&r, MODEL_BWD, 147456.0, 18);
    /* its exchange: K, V once forward (4,096 bytes); backward K, V once and the fp32 dK, dV
     * twice (16 x 128 x 4 = 8,192 each), 20,480 bytes as 3 calls of their mean, 6,826 */
    check_comm(&r, MODEL_FWD, MODEL_CP_P2P, 4096, 1);
    check_comm(&r, MODEL_BWD, MODEL_CP_P2P, 6826, 3);
    sim_result_free(&r);
    /* the all-gather rotater: K, V gathered (32 x 128 x 2 = 8,192) forward and again
     * backward, the fp32 dK, dV riding the all-to-all rotater twice, no reduce-scatter */
    s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    check_passes(&r, MODEL_FWD, 71168.0, 14);
    check_passes(&r, MODEL_BWD, 147456.0, 18);
    check_comm(&r, MODEL_FWD, MODEL_CP_ALL_GATHER, 8192, 1);
    check_comm(&r, MODEL_BWD, MODEL_CP_ALL_GATHER, 8192, 1);
    check_comm(&r, MODEL_BWD, MODEL_CP_P2P, 8192, 2);
    check_dkv_exposed(&r);
    sim_result_free(&r);
    s.layout.cp_comm = MODEL_CP_COMM_A2A;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_INT(0, r.dims.cp_torch);
    CHECK_EQ_INT(-1, passes_op(&r, MODEL_FWD));
    CHECK_EQ_INT(-1, passes_op(&r, MODEL_BWD));
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* The all-gather (te_gather), every rank alike: forward the gathered K, V reordered, 2 cp K =
 * 16,384, and the two half outputs copied, O: 18,432 in 4 kernels. Backward dK, dV zeroed
 * (cp K), the gather reordered (2 cp K), dQ's halves copied (Q), the steps' dK, dV added
 * (3 x 5/2 K: the steps see 1 and 4 half chunks of the 4), reordered back (2 cp K):
 * 17.5 K + Q = 73,728 in 12. Ulysses: each tensor its all-to-alls move, moved twice more, 4X:
 * forward Q, K, V and O, 4 x 8,192 = 32,768 in 8 kernels; backward dO and the saved O, then
 * dQ, dK, dV: 4 x 10,240 = 40,960 in 10. */
static void test_gather_a2a(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s = small(MODEL_CP_COMM_ALLGATHER, MODEL_FW_MEGATRON);
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    check_passes(&r, MODEL_FWD, 18432.0, 4);
    check_passes(&r, MODEL_BWD, 73728.0, 12);
    sim_result_free(&r);
    s = small(MODEL_CP_COMM_A2A, MODEL_FW_BRIDGE);
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    check_passes(&r, MODEL_FWD, 32768.0, 8);
    check_passes(&r, MODEL_BWD, 40960.0, 10);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* Not on a CPU (the executor's own cp, its passes inside its core op), nor in the graph
 * model_spec_check's dims give the executor, nor with FP8 attention (not priced). */
static void test_not_priced(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    ModelSpec s = small(MODEL_CP_COMM_P2P, MODEL_FW_MEGATRON);
    s.job.precision = PX_FP32;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_INT(0, r.dims.cp_te);
    CHECK_EQ_INT(-1, passes_op(&r, MODEL_FWD));
    sim_result_free(&r);
    s.job.framework = MODEL_FW_TORCHTITAN;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_INT(0, r.dims.cp_torch);
    CHECK_EQ_INT(-1, passes_op(&r, MODEL_FWD));
    sim_result_free(&r);
    s.job.framework = MODEL_FW_MEGATRON;
    prof_cluster_free(&cl);
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
    CHECK_EQ_INT(0, d.cp_te);
    CHECK_EQ_INT(0, d.cp_torch);
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    s.job.precision = PX_BF16;
    s.job.fp8 = MODEL_FP8_DELAYED;
    s.job.fp8_attention = 1;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_INT(1, r.dims.cp_te);
    CHECK_EQ_INT(-1, passes_op(&r, MODEL_FWD));
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

int main(void)
{
    px_log_set_quiet(1);
    test_ring();
    test_gather_a2a();
    test_torch_ring();
    test_not_priced();
    TEST_DONE("sim_cp");
}
