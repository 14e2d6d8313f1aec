/* The simulator on mixture-of-experts layouts: the all-to-all's time inside and across nodes
 * recomputed by hand (with a profile's own all-to-all rate across nodes), the overlap rule of --overlap-ep, model FLOPs that ignore the routing
 * imbalance, the planner's rejection of an ep that does not divide the experts (by the rule's
 * name), and the Megatron-LM flags of a MoE plan. */
#include "fixtures.h"
#include "export/export.h"
#include "sim/internal.h"
#include "test.h"

/* dgx-a100: NVLink 300 GB/s x 0.8 = 240 GB/s at 3 us; a NIC share of 25 GB/s x 0.85 = 21.25 GB/s
 * at 5 us; 8 devices a node. An all-to-all of S = 8 MiB per rank, S/n to each peer, a latency
 * per peer (docs/time.md, "All-to-all"):
 *  - 8 ranks on one node: 7 peers of 3 us + 1 MiB / 240 GB/s = 7 x 7.369067 = 51.583467 us;
 *  - 16 ranks on two nodes (8 on each): 7 peers on the node, 7 x (3 us + 512 KiB / 240 GB/s)
 *    = 36.291733 us, while 8 off it take 8 x (5 us + 512 KiB / 21.25 GB/s) = 237.379012 us;
 *  - 16 ranks 8 apart (one per node): 15 x (5 us + 512 KiB / 21.25 GB/s) = 445.085647 us.
 * One latency for all the peers (parallax before it priced each peer's send) gives 33.583 us
 * and fails the first. */
static void test_all_to_all(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    ModelDims d = {0};
    model_spec_defaults(&s);
    SimCtx c;
    sim_ctx_init(&c, &cl, &s, &d, 8);
    const double S = 8388608.0;
    int nodes = 0;
    CHECK_REL(7.0 * (3e-6 + 1048576.0 / 240e9), sim_all_to_all_seconds(&c, 0, 1, 8, S, &nodes), 1e-12);
    CHECK_REL(51.58346667e-6, sim_all_to_all_seconds(&c, 0, 1, 8, S, NULL), 1e-9);
    CHECK_EQ_INT(1, nodes);
    CHECK_REL(237.3790118e-6, sim_all_to_all_seconds(&c, 0, 1, 16, S, &nodes), 1e-9);
    CHECK_EQ_INT(2, nodes);
    CHECK_REL(445.0856471e-6, sim_all_to_all_seconds(&c, 0, 8, 16, S, &nodes), 1e-9);
    CHECK_EQ_INT(16, nodes);
    /* a group of one moves nothing */
    CHECK(sim_all_to_all_seconds(&c, 0, 1, 1, S, NULL) == 0.0);

    /* through sim_comm_seconds: an EP group of 16 ranks 2 apart (etp 2 is fastest in the
     * expert order) in a stage of tp 2 x dp 16 = 32 ranks: ranks 0, 2, ..., 30 put 4 members on
     * each of 4 nodes: 3 peers over NVLink (3 x 3 us + 3/16 S / 240 GB/s = 15.5536 us), 12
     * over the NIC share (12 x 5 us + 12/16 S / 21.25 GB/s = 356.068518 us) */
    d.t = 2;
    d.c = 1;
    d.dp = 16;
    d.p = 1;
    d.ep = 16;
    d.etp = 2;
    ModelOp op = {0};
    op.kind = MODEL_OP_COMM;
    op.comm = MODEL_EP_ALL_TO_ALL;
    op.group_size = 16;
    op.comm_bytes = (uint64_t)S;
    op.calls = 1;
    CHECK_REL(12.0 * 5e-6 + 12.0 / 16.0 * S / 21.25e9, sim_comm_seconds(&c, &op, 0), 1e-12);
    prof_cluster_free(&cl);
}

/* The flex dispatcher (DeepEP; docs/time.md, "MoE as it runs"): a token crosses the network
 * once per remote node that hosts one of its experts. Remote nodes per token, by hand:
 *  - DeepSeek-V3 (256 experts, top 8, 8 groups, top 4 groups) over 8 nodes, a group a node:
 *    8 x (1 - C(7,4)/C(8,4)) = 8 x (1 - 35/70) = 4 nodes, 4 x 7/8 = 3.5 remote;
 *  - over 4 nodes (2 groups a node): 4 x (1 - C(6,4)/C(8,4)) = 4 x 55/70, x 3/4 = 2.357143;
 *  - over 2 nodes: 2 x (1 - 1/70), x 1/2 = 0.985714;
 *  - over 16 nodes (a group over 2): its 8 experts among 4 groups' 128 on 8 nodes of 16 each,
 *    8 x (1 - C(112,8)/C(128,8)), x 15/16 = 5.005647;
 *  - 128 experts, top 8, no groups, over 2 nodes: 2 x (1 - C(64,8)/C(128,8)), x 1/2 = 0.996904.
 * Time on dgx-a100 of S = 8 MiB (its 8 copies of 131,072 B tokens) for DeepSeek-V3's routing
 * over 16 ranks on 2 nodes: the network carries S/8 x 0.985714 = 1,033,597 B in one message,
 * 5 us + 48.640 us = 53.640 us; NVLink the 7/8 of S forwarded, 7 x 3 us + 7,340,032 B / 240 GB/s
 * = 51.583 us; the longer, 53.640 us, against the all-to-all's 237.379 us (test_all_to_all). */
static void test_flex(void)
{
    ModelMoe m = {.experts = 256, .topk = 8, .groups = 8, .topk_groups = 4};
    CHECK_REL(3.5, sim_flex_remote_nodes(&m, 8), 1e-12);
    CHECK_REL(2.357142857, sim_flex_remote_nodes(&m, 4), 1e-9);
    CHECK_REL(0.9857142857, sim_flex_remote_nodes(&m, 2), 1e-9);
    CHECK_REL(5.005647089, sim_flex_remote_nodes(&m, 16), 1e-9);
    CHECK(sim_flex_remote_nodes(&m, 1) == 0.0);
    ModelMoe flat = {.experts = 128, .topk = 8};
    CHECK_REL(0.9969041357, sim_flex_remote_nodes(&flat, 2), 1e-9);

    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    ModelDims d = {0};
    model_spec_defaults(&s);
    s.model.moe = m;
    s.job.moe_dispatcher = MODEL_MOE_DISPATCH_FLEX;
    d.t = 1;
    d.c = 1;
    d.dp = 16;
    d.p = 1;
    d.ep = 16;
    d.etp = 1;
    SimCtx c;
    sim_ctx_init(&c, &cl, &s, &d, 8);
    const double S = 8388608.0;
    ModelOp op = {0};
    op.kind = MODEL_OP_COMM;
    op.comm = MODEL_EP_ALL_TO_ALL;
    op.group_size = 16;
    op.comm_bytes = (uint64_t)S;
    op.calls = 1;
    CHECK_REL(5e-6 + S / 8.0 * (2.0 * (1.0 - 1.0 / 70.0) / 2.0) / 21.25e9, sim_comm_seconds(&c, &op, 0), 1e-12);
    CHECK_REL(53.63982790e-6, sim_comm_seconds(&c, &op, 0), 1e-9);
    /* inside one node it is the all-to-all */
    op.group_size = 8;
    d.dp = 8;
    d.ep = 8;
    CHECK_REL(51.58346667e-6, sim_comm_seconds(&c, &op, 0), 1e-9);
    prof_cluster_free(&cl);
}

/* dgx-h100 gives the all-to-all its own rate across nodes (network.all_to_all_efficiency 0.52,
 * fitted on MoE Parallel Folding's Table 4; docs/time.md, "Expert parallelism"): a NIC share of
 * 50 GB/s x 0.52 = 26 GB/s at 5 us, while the rings keep 50 x 0.85 = 42.5 GB/s. S = 8 MiB:
 *  - 16 ranks one a node: 15 x (5 us + 512 KiB / 26 GB/s) = 15 x 25.164923 = 377.473846 us
 *    (at the rings' 42.5 GB/s it would be 260.042824 us, which the first check refuses);
 *  - 16 ranks on two nodes: 8 x 25.164923 = 201.319385 us off the node, against the 7 NVLink
 *    peers' 7 x (3 us + 512 KiB / 360 GB/s) = 31.194489 us;
 *  - a ring over the same two nodes still gets 8 NIC shares at 0.85: 340 GB/s. */
static void test_all_to_all_rate(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    CHECK_REL(0.52, cl.net_a2a_eff, 1e-12);
    CHECK_REL(0.85, cl.net_eff, 1e-12);
    ModelSpec s;
    ModelDims d = {0};
    model_spec_defaults(&s);
    SimCtx c;
    sim_ctx_init(&c, &cl, &s, &d, 8);
    const double S = 8388608.0;
    CHECK_REL(377.4738462e-6, sim_all_to_all_seconds(&c, 0, 8, 16, S, NULL), 1e-9);
    CHECK_REL(201.3193846e-6, sim_all_to_all_seconds(&c, 0, 1, 16, S, NULL), 1e-9);
    double alpha = 0, beta = 0;
    sim_group_path(&c, 0, 1, 16, &alpha, &beta, NULL);
    CHECK_REL(340e9, beta, 1e-12);
    CHECK_REL(5e-6, alpha, 1e-12);
    prof_cluster_free(&cl);
}

/* --overlap-ep: one MoE layer whose passes each hold shared experts of 2 s (fc1 1.5 + act 0.5),
 * routed experts of 5 s and two all-to-alls of 3 s; slowdown 0.1.
 *  - one micro-batch: a pass's 6 s of all-to-all hide under its 2 s of shared experts:
 *    4 + 0.1 x 2 = 4.2 s exposed, 2.1 s for each;
 *  - two micro-batches: the 12 s of both passes hide under the layer's 14 s of compute:
 *    0.1 x 12 = 1.2 s exposed, 0.3 s for each;
 *  - without the flag each exposes its 3 s. */
static void test_overlap_ep(void)
{
    ModelOp ops[10];
    double t[10];
    memset(ops, 0, sizeof ops);
    const struct {
        ModelOpKind kind;
        ModelOpRole role;
        double s;
    } pass[5] = {{MODEL_OP_MATMUL, MODEL_OPR_FC1, 1.5},
                 {MODEL_OP_ACTIVATION, MODEL_OPR_ACT, 0.5},
                 {MODEL_OP_COMM, MODEL_OPR_DISPATCH, 3.0},
                 {MODEL_OP_MATMUL, MODEL_OPR_EXP_FC1, 5.0},
                 {MODEL_OP_COMM, MODEL_OPR_COMBINE, 3.0}};
    for (int ph = 0; ph < 2; ph++)
        for (int i = 0; i < 5; i++) {
            ModelOp *o = &ops[ph * 5 + i];
            o->phase = ph ? MODEL_BWD : MODEL_FWD;
            o->kind = pass[i].kind;
            o->role = pass[i].role;
            o->layer = 3;
            o->chunk = 0;
            o->per_microbatch = 1;
            o->repeat = 1;
            if (o->kind == MODEL_OP_COMM) {
                o->comm = MODEL_EP_ALL_TO_ALL;
                o->group_size = 8;
            }
            t[ph * 5 + i] = pass[i].s;
        }
    ModelOpGraph g = {.stage = 0, .op = ops, .count = 10, .cap = 10};
    ModelLayout l = {0};
    l.overlap_ep = 1;
    CHECK_REL(2.1, sim_comm_exposed(&g, t, 2, &l, 1, 0.1), 1e-12);
    CHECK_REL(2.1, sim_comm_exposed(&g, t, 9, &l, 1, 0.1), 1e-12);
    CHECK_REL(0.3, sim_comm_exposed(&g, t, 4, &l, 2, 0.1), 1e-12);
    CHECK_REL(0.3, sim_comm_exposed(&g, t, 7, &l, 8, 0.1), 1e-12);
    l.overlap_ep = 0;
    CHECK_REL(3.0, sim_comm_exposed(&g, t, 2, &l, 2, 0.1), 1e-12);
}

static void moe_spec(ModelSpec *s, PxError *err)
{
    model_spec_defaults(s);
    CHECK_OK(model_config_load("tiny-moe", &s->model, err), *err);
    s->job.global_batch = 16;
    s->job.micro_batch = 1;
    s->job.precision = PX_BF16;
}

/* The op graph gives the busiest rank's routed work (imbalance x the balanced share): the job's
 * model FLOPs are the tokens' work, whatever the imbalance; its hardware FLOPs too (routing
 * moves work between ranks, it makes none); the busiest rank's own FLOPs grow with it. */
static void test_flops_imbalance(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    moe_spec(&s, &err);
    s.layout.ep = 4;
    SimResult a, b;
    CHECK_OK(sim_run(&s, &cl, 8, &a, &err), err);
    s.job.moe_imbalance = 2.0;
    CHECK_OK(sim_run(&s, &cl, 8, &b, &err), err);
    CHECK_REL(a.model_flops, b.model_flops, 1e-12);
    CHECK_REL(a.hardware_flops, b.hardware_flops, 1e-12);
    CHECK(b.rank_flops[0] > a.rank_flops[0] * 1.05);
    CHECK(b.step_s > a.step_s);
    sim_result_free(&a);
    sim_result_free(&b);
    prof_cluster_free(&cl);
}

/* ep 3 on 8 experts: every layout breaks MODEL_RULE_EXPERTS, and the answer names the rule and
 * its example. */
static void test_plan_rejects_ep(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    moe_spec(&q.base, &err);
    q.base.layout.ep = 3;
    q.pinned = SIM_PIN_EP;
    q.gpus = 8;
    q.top = 3;
    q.headroom = 0.05;
    SimPlanResult r;
    CHECK_EQ_INT(PX_EINPUT, sim_plan(&q, &cl, &r, &err));
    CHECK_STR("ep x etp does not divide the experts or the stage's ranks", model_rule_name(MODEL_RULE_EXPERTS));
    CHECK(strstr(err.msg, "ep x etp does not divide the experts or the stage's ranks (e.g. ep 3 must divide the 8 experts)") != NULL);
    /* searched: ep over the divisors of the experts, and the winner's degrees pass the rule */
    memset(&err, 0, sizeof err);
    q.pinned = 0;
    q.base.layout.ep = 0;
    CHECK_OK(sim_plan(&q, &cl, &r, &err), err);
    CHECK(r.n_top > 0);
    CHECK(8 % r.top[0].spec.layout.ep == 0);
    int eps_seen = 0;
    for (int i = 0; i < r.n_top; i++)
        eps_seen |= 1 << r.top[i].spec.layout.ep;
    CHECK(eps_seen != 0);
    sim_plan_free(&r);
    prof_cluster_free(&cl);
}

/* Pruning never changes the answer on a MoE model, whose dense and MoE layers cost apart: the
 * top layouts equal the brute force's, which times every feasible layout. */
static void test_plan_pruning(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    moe_spec(&q.base, &err);
    q.gpus = 16;
    q.top = 5;
    q.headroom = 0.05;
    SimPlanResult a, b;
    CHECK_OK(sim_plan(&q, &cl, &a, &err), err);
    q.brute_force = 1;
    CHECK_OK(sim_plan(&q, &cl, &b, &err), err);
    CHECK_EQ_INT(b.n_top, a.n_top);
    CHECK(b.timed > a.timed);
    for (int i = 0; i < a.n_top; i++) {
        CHECK_REL(b.top[i].score, a.top[i].score, 1e-12);
        CHECK_EQ_INT(b.top[i].spec.layout.ep, a.top[i].spec.layout.ep);
    }
    sim_plan_free(&a);
    sim_plan_free(&b);
    prof_cluster_free(&cl);
}

/* The Megatron-LM flags of a MoE plan (tiny-moe: one dense layer, then MoE). */
/* The Megatron-LM export of s planned on 8 dgx-a100 GPUs, as a string to free. */
static char *megatron_flags(const ModelSpec *s)
{
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(s, "dgx-a100", 8, &plan, &err), err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK_OK(export_plan(f, &plan, EXPORT_MEGATRON, &err), err);
    fclose(f);
    model_plan_free(&plan);
    return buf;
}

static void test_export_megatron(void)
{
    PxError err = {0};
    ModelSpec s;
    moe_spec(&s, &err);
    s.layout.tp = 2;
    s.layout.sp = 1;
    s.layout.ep = 4;
    s.layout.etp = 1;
    s.job.moe_force_balance = 1;
    char *buf = megatron_flags(&s);
    static const char *const want[] = {
        "    --tensor-model-parallel-size 2\n",
        "    --sequence-parallel\n",
        "    --num-experts 8\n",
        "    --moe-router-topk 2\n",
        "    --moe-ffn-hidden-size 64\n",
        "    --moe-shared-expert-intermediate-size 64\n",
        "    --moe-layer-freq '([0]*1+[1]*3)'\n",
        "    --expert-model-parallel-size 4\n",
        "    --expert-tensor-parallel-size 1\n",
        "    --moe-router-score-function softmax\n",
        "    --moe-router-load-balancing-type aux_loss\n",
        "    --moe-aux-loss-coeff 0.01\n",
        "    --moe-token-dispatcher-type alltoall\n",
        "    --moe-grouped-gemm\n",
        "    --moe-router-force-load-balancing\n",
        "# experts: 8 routed (top 2) over ep 4 x etp 1, expert data parallel 2; dropless (no capacity factor)\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(buf, want[i])) {
            fprintf(stderr, "export lacks: %s--- export:\n%s", want[i], buf);
            exit(1);
        }
    CHECK(strstr(buf, "--moe-expert-capacity-factor") == NULL);
    CHECK(strstr(buf, "--multi-latent-attention") == NULL);
    free(buf);

    /* the all-gather dispatcher the plan was priced with is the one Megatron is told to run */
    s.job.moe_dispatcher = MODEL_MOE_DISPATCH_ALLGATHER;
    buf = megatron_flags(&s);
    CHECK(strstr(buf, "    --moe-token-dispatcher-type allgather\n") != NULL);
    CHECK(strstr(buf, "--moe-token-dispatcher-type alltoall") == NULL);
    free(buf);

    /* the flex one on DeepEP's kernels (Megatron-Core's --moe-flex-dispatcher-backend) */
    s.job.moe_dispatcher = MODEL_MOE_DISPATCH_FLEX;
    buf = megatron_flags(&s);
    CHECK(strstr(buf, "    --moe-token-dispatcher-type flex\n    --moe-flex-dispatcher-backend deepep\n") != NULL);
    free(buf);

    /* DeepEP does not pad to a capacity (Megatron-Core refuses the pair), FP8 dispatch needs an
     * all-to-all dispatcher */
    ModelDims d;
    s.job.moe_capacity_factor = 1.25;
    CHECK_EQ_INT(PX_EINPUT, model_spec_check(&s, 8, &d, &err));
    CHECK_STR("moe_dispatcher flex (DeepEP) does not pad the experts' inputs to a capacity: capacity "
              "factor 1.25 needs the alltoall or allgather dispatcher", err.msg);
    s.job.moe_capacity_factor = 0;
    s.model.moe.capacity_factor = 0;
    s.job.fp8_dispatch = 1;
    s.job.precision = PX_BF16;
    s.job.fp8 = MODEL_FP8_BLOCKWISE;
    CHECK_OK(model_spec_check(&s, 8, &d, &err), err);
    s.job.moe_dispatcher = MODEL_MOE_DISPATCH_ALLGATHER;
    CHECK_EQ_INT(PX_EINPUT, model_spec_check(&s, 8, &d, &err));
    CHECK_STR("FP8 dispatch needs an all-to-all dispatcher (alltoall or flex), not moe_dispatcher allgather",
              err.msg);
}

int main(void)
{
    px_log_set_quiet(1);
    test_all_to_all();
    test_flex();
    test_all_to_all_rate();
    test_overlap_ep();
    test_flops_imbalance();
    test_plan_rejects_ep();
    test_plan_pruning();
    test_export_megatron();
    TEST_DONE("sim_moe");
}
