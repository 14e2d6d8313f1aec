/* The MoE terms of the time model recomputed by hand (docs/time.md, "MoE as it runs"): the
 * routed experts' GEMMs four at a time as Transformer Engine's grouped GEMM runs them, one
 * launch per expert, the router's score/top-k/aux-loss passes, the dispatcher's sorts and
 * weighted un-permute, and its device-to-host sync, on tiny-moe at ep 2 (4 local experts)
 * and on H100 figures. Each check fails when its term is removed. */
#include "fixtures.h"
#include "sim/internal.h"
#include "test.h"

/* tiny-moe (h 64, 8 experts top-2, expert_ffn 64, aux loss 0.01) at b 1, s 64, bf16, on 2
 * ranks (dp 2, one micro-batch each) with ep 2: T = 64 tokens, R = 64 x 2 = 128 routed rows, 4 local experts. */
static void tiny_graph(ModelSpec *s, ModelDims *d, ModelOpGraph *g, PxError *err)
{
    model_spec_defaults(s);
    CHECK_OK(model_config_load("tiny-moe", &s->model, err), *err);
    s->job.global_batch = 2;
    s->job.micro_batch = 1;
    s->job.seq_len = 64;
    s->job.precision = PX_BF16;
    s->layout.dp = 2;
    s->layout.ep = 2;
    CHECK_OK(model_spec_check(s, 2, d, err), *err);
    CHECK_OK(model_ops_build(s, d, 0, g, err), *err);
}

static const ModelOp *find(const ModelOpGraph *g, const char *name, ModelPhase ph, int nth)
{
    for (int i = 0; i < g->count; i++)
        if (g->op[i].phase == ph && strcmp(g->op[i].name, name) == 0 && nth-- == 0)
            return &g->op[i];
    return NULL;
}

/* Layer 1 (the first MoE layer; layer 0 is dense). */
static void test_op_graph_terms(void)
{
    PxError err = {0};
    ModelSpec s;
    ModelDims d;
    ModelOpGraph g;
    tiny_graph(&s, &d, &g, &err);
    CHECK_EQ_INT(64, (int)d.tokens);
    CHECK_EQ_INT(128, (int)d.routed);
    CHECK_EQ_INT(4, d.experts_loc);
    const double T = 64, E = 8, k = 2, h = 64, R = 128, a = 2;
    /* router: scores, top-k, routing map and counts, aux loss; forward: the cast of T x E to
     * fp32 (T E 6 = 3,072 B), softmax (T E 8 = 4,096), top-k's read (T E 4 = 2,048) and write
     * (T k 12 = 1,536), the map (2 T E = 1,024), the counts' (T k 8 = 1,024), the aux loss's
     * sum (T E 4 = 2,048): 14,848 B in 5 + 4 kernels */
    const ModelOp *r = find(&g, "layer.1.moe.router", MODEL_FWD, 1);
    CHECK(r != NULL && r->kind == MODEL_OP_ACTIVATION);
    CHECK_REL(T * E * (a + 4) + 2 * T * E * 4 + T * E * 4 + T * k * 12 + 2 * T * E + T * k * 8 + T * E * 4, r->bytes, 1e-12);
    CHECK_REL(14848.0, r->bytes, 1e-12);
    CHECK_EQ_INT(9, r->kernels);
    /* backward: the top-k gradient into [T, E] (2 T E 4 + T k 12), the softmax's (3 T E 4), the
     * aux loss's (2 T E 4), the cast back (T E 6): 4,096 + 1,536 + 6,144 + 4,096 + 3,072 */
    r = find(&g, "layer.1.moe.router", MODEL_BWD, 1);
    CHECK(r != NULL && r->kind == MODEL_OP_ACTIVATION);
    CHECK_REL(18944.0, r->bytes, 1e-12);
    CHECK_EQ_INT(6, r->kernels);
    /* the dispatcher's sorts by local expert: R rows in and out, after the dispatch and before
     * the combine, and again in the backward: 2 x 128 x 64 x 2 = 32,768 B each */
    for (int ph = 0; ph < 2; ph++)
        for (int nth = 0; nth < 2; nth++) {
            const ModelOp *o = find(&g, "layer.1.moe.dispatch.sort", ph ? MODEL_BWD : MODEL_FWD, nth);
            CHECK(o != NULL && o->kind == MODEL_OP_PERMUTE);
            CHECK_REL(2 * R * h * a, o->bytes, 1e-12);
            CHECK_REL(32768.0, o->bytes, 1e-12);
        }
    /* the token counts copied to the host once per forward, none in the backward */
    const ModelOp *c = find(&g, "layer.1.moe.dispatch.counts", MODEL_FWD, 0);
    CHECK(c != NULL);
    CHECK_EQ_INT(1, c->host_syncs);
    CHECK(find(&g, "layer.1.moe.dispatch.counts", MODEL_BWD, 0) == NULL);
    /* un-permute: scale (2 T k h a) then scatter-add (T k h a + T k 4 + 3 T h a), 2 kernels:
     * 32,768 + 16,384 + 512 + 24,576 = 74,240 B */
    const ModelOp *u = find(&g, "layer.1.moe.combine", MODEL_FWD, 0);
    CHECK(u != NULL && u->kind == MODEL_OP_PERMUTE);
    CHECK_REL(74240.0, u->bytes, 1e-12);
    CHECK_EQ_INT(2, u->kernels);
    /* the experts' GEMMs: one launch per local expert (4 forward, 8 backward) */
    const ModelOp *f = find(&g, "layer.1.moe.experts.fc1", MODEL_FWD, 0);
    CHECK(f != NULL);
    CHECK_EQ_INT(4, f->kernels);
    f = find(&g, "layer.1.moe.experts.fc1", MODEL_BWD, 0);
    CHECK(f != NULL);
    CHECK_EQ_INT(8, f->kernels);
    model_ops_free(&g);
}

/* The all-gather dispatcher on the same case: n = etp x ep = 2 ranks gather T n = 128 tokens.
 * Forward: the scores and map, 128 x 8 x (4 + 1) = 5,120 B, and the rows, 128 x 64 x 2 = 16,384
 * B, over the 2 ranks; the counts (128 x 4 map entries + 4 x 8) = 544 B with its host sync; the
 * local rows permuted out: 2 R h a + R 4 + T n 4 = 32,768 + 512 + 512 = 33,792 B. Combine: scale
 * (2 R h a), zero the [T n, h] buffer (16,384), scatter-add (2 R h a + R 4): 82,432 B in 3
 * kernels, then the reduce-scatter of 16,384 B. No all-to-all, no sort. */
static void test_allgather_dispatcher(void)
{
    PxError err = {0};
    ModelSpec s;
    ModelDims d;
    ModelOpGraph g;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny-moe", &s.model, &err), err);
    s.job.global_batch = 2;
    s.job.micro_batch = 1;
    s.job.seq_len = 64;
    s.job.precision = PX_BF16;
    s.job.moe_dispatcher = MODEL_MOE_DISPATCH_ALLGATHER;
    s.layout.dp = 2;
    s.layout.ep = 2;
    CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    const ModelOp *o = find(&g, "layer.1.moe.dispatch.ep_all_gather", MODEL_FWD, 0);
    CHECK(o != NULL && o->group_size == 2);
    CHECK_EQ_U64(5120, o->comm_bytes);
    o = find(&g, "layer.1.moe.dispatch.ep_all_gather", MODEL_FWD, 1);
    CHECK(o != NULL);
    CHECK_EQ_U64(16384, o->comm_bytes);
    o = find(&g, "layer.1.moe.dispatch.counts", MODEL_FWD, 0);
    CHECK(o != NULL && o->host_syncs == 1);
    CHECK_REL(544.0, o->bytes, 1e-12);
    o = find(&g, "layer.1.moe.dispatch", MODEL_FWD, 0);
    CHECK(o != NULL && o->kind == MODEL_OP_PERMUTE);
    CHECK_REL(33792.0, o->bytes, 1e-12);
    o = find(&g, "layer.1.moe.combine", MODEL_FWD, 0);
    CHECK(o != NULL && o->kind == MODEL_OP_PERMUTE);
    CHECK_REL(82432.0, o->bytes, 1e-12);
    CHECK_EQ_INT(3, o->kernels);
    o = find(&g, "layer.1.moe.combine.ep_reduce_scatter", MODEL_FWD, 0);
    CHECK(o != NULL);
    CHECK_EQ_U64(16384, o->comm_bytes);
    for (int i = 0; i < g.count; i++)
        CHECK(g.op[i].comm != MODEL_EP_ALL_TO_ALL || g.op[i].kind != MODEL_OP_COMM);
    CHECK(find(&g, "layer.1.moe.dispatch.sort", MODEL_FWD, 0) == NULL);
    /* the backward: the output gradient gathered, the rows' and the scores' gradients
     * reduce-scattered */
    o = find(&g, "layer.1.moe.combine.ep_all_gather", MODEL_BWD, 0);
    CHECK(o != NULL);
    CHECK_EQ_U64(16384, o->comm_bytes);
    o = find(&g, "layer.1.moe.combine.ep_reduce_scatter", MODEL_BWD, 0);
    CHECK(o != NULL);
    CHECK_EQ_U64(128 * 8 * 4, o->comm_bytes);
    o = find(&g, "layer.1.moe.dispatch.ep_reduce_scatter", MODEL_BWD, 0);
    CHECK(o != NULL);
    CHECK_EQ_U64(16384, o->comm_bytes);
    model_ops_free(&g);
    /* FP8 dispatch is the all-to-all's */
    s.job.fp8 = MODEL_FP8_BLOCKWISE;
    s.job.fp8_dispatch = 1;
    CHECK_EQ_INT(PX_EINPUT, model_spec_check(&s, 2, &d, &err));
    CHECK(strstr(err.msg, "FP8 dispatch needs an all-to-all dispatcher (alltoall or flex), not moe_dispatcher allgather") != NULL);
}

/* H100 (989.4 TFLOP/s, matmul 0.66, 132 SMs, K half 64): 6 experts' GEMMs of 128 x 128 x 4096
 * take the 64 x 64 tiles (0.75; 4 an expert), which waste least of a wave this small. Pooled in
 * one batch their 24 tiles run in one wave; Transformer Engine runs 4 experts then 2, two
 * waves, each as long as the pooled one: a wave is one tile's work,
 * 2 x 64 x 64 x 4096 x 132 / (989.4e12 x 0.66 x 0.75 x 4096/4160) = 9.1850 us. */
static void test_expert_gemm_streams(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    ModelDims d = {0};
    model_spec_defaults(&s);
    s.job.precision = PX_BF16;
    SimCtx c;
    sim_ctx_init(&c, &cl, &s, &d, 8);
    ModelOp op = {0};
    op.kind = MODEL_OP_MATMUL;
    op.role = MODEL_OPR_EXP_FC1;
    op.n_gemm = 1;
    op.gemm[0] = (ModelGemm){128, 128, 4096, 6};
    const double wave = 2.0 * 64 * 64 * 4096 * 132 / (989.4e12 * 0.66 * 0.75 * 4096.0 / 4160.0);
    CHECK_REL(9.1850e-6, wave, 1e-4);
    CHECK_REL(2.0 * wave, sim_op_gemm_seconds(&c, &op, 0, 0), 1e-12);
    CHECK_REL(wave, sim_gemm_seconds(&c, &op.gemm[0], NULL), 1e-12);
    /* a dense GEMM of the same batch is not split */
    op.role = MODEL_OPR_FC1;
    CHECK_REL(wave, sim_op_gemm_seconds(&c, &op, 0, 0), 1e-12);
    prof_cluster_free(&cl);
}

/* The dispatcher's sync: 10 us on H100 (host_sync_s) on top of the op's bytes and launch. */
static void test_host_sync(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    CHECK_REL(10e-6, cl.device.host_sync_s, 1e-12);
    ModelSpec s;
    ModelDims d = {0};
    model_spec_defaults(&s);
    s.job.precision = PX_BF16;
    SimCtx c;
    sim_ctx_init(&c, &cl, &s, &d, 8);
    ModelOp op = {0};
    op.kind = MODEL_OP_PERMUTE;
    op.bytes = 64;
    op.kernels = 1;
    op.host_syncs = 1;
    /* 64 B at 3.35 TB/s x 0.75, one 2 us launch, the 10 us sync */
    CHECK_REL(64.0 / (3.35e12 * 0.75) + 2e-6 + 10e-6, sim_compute_seconds(&c, &op), 1e-12);
    prof_cluster_free(&cl);
}

/* The whole tiny-moe step grows by the host syncs: 3 MoE layers x 1 micro-batch forward. */
static void test_step_has_syncs(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    ModelDims d;
    ModelOpGraph g;
    tiny_graph(&s, &d, &g, &err);
    int syncs = 0;
    for (int i = 0; i < g.count; i++)
        syncs += g.op[i].host_syncs * g.op[i].repeat;
    CHECK_EQ_INT(3, syncs);
    model_ops_free(&g);
    SimResult a, b;
    CHECK_OK(sim_run(&s, &cl, 2, &a, &err), err);
    cl.device.host_sync_s = 0;
    CHECK_OK(sim_run(&s, &cl, 2, &b, &err), err);
    CHECK_REL(3 * 10e-6, a.step_s - b.step_s, 1e-6);
    sim_result_free(&a);
    sim_result_free(&b);
    prof_cluster_free(&cl);
}

int main(void)
{
    px_log_set_quiet(1);
    test_op_graph_terms();
    test_allgather_dispatcher();
    test_expert_gemm_streams();
    test_host_sync();
    test_step_has_syncs();
    TEST_DONE("moe_time");
}
