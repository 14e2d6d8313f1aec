/* The time model: pipeline bubbles in the uniform case (event simulation, closed form and
 * (p-1)/m agree exactly), collectives recomputed by hand, node placement from the rank order,
 * GEMM tile quantization, and the bounds overlap must respect. */
#include "fixtures.h"
#include "sim/internal.h"
#include "test.h"

static void test_uniform_bubbles(void)
{
    const ModelSchedule scheds[3] = {MODEL_SCHED_GPIPE, MODEL_SCHED_1F1B, MODEL_SCHED_INTERLEAVED};
    for (int si = 0; si < 3; si++) {
        for (int p = 1; p <= 8; p++) {
            for (int v = 1; v <= (scheds[si] == MODEL_SCHED_INTERLEAVED ? 4 : 1); v++) {
                if (scheds[si] == MODEL_SCHED_INTERLEAVED && (p < 2 || v < 2))
                    continue;
                for (int m = p; m <= 4 * p; m += p) {
                    ModelDims d = {0};
                    d.p = p;
                    d.v = v;
                    d.m = m;
                    /* f = 3, b = 5 per chunk: exact binary fractions keep sums exact */
                    double fwd[64], bwd[64], p2p[8] = {0}, fin[8], ls[64], le[64];
                    for (int i = 0; i < p * v; i++) {
                        fwd[i] = 3.0;
                        bwd[i] = 5.0;
                    }
                    double T = sim_pipeline_event(&d, scheds[si], fwd, bwd, p2p, fin, ls, le);
                    double closed = sim_pipeline_uniform(&d, scheds[si], 3.0, 5.0);
                    CHECK_REL(closed, T, 1e-12);
                    double ideal = (double)m * v * 8.0;
                    /* bubble / ideal = (p-1)/m, and (p-1)/(v m) interleaved (seeds 001, 002) */
                    CHECK_REL(1.0 + (double)(p - 1) / ((double)v * m), T / ideal, 1e-12);
                    for (int s = 0; s < p; s++)
                        CHECK(fin[s] <= T);
                }
            }
        }
    }
}

static void test_collectives(void)
{
    /* A 16-rank ring all-reduce of 1 MiB at 50 GB/s and 500 ns (the ASTRA-sim golden's setting):
     * 2 x 15 steps of (500 ns + 65,536 B / 50e9 B/s = 1,310.72 ns) = 54,321.6 ns. A double binary
     * tree: 2 x log2(16) = 8 latencies = 4,000 ns plus 2 x 1,048,576 B / 50e9 = 41,943.04 ns,
     * 45,943.04 ns: the faster of the two is taken. An all-gather: 15 x 1,810.72 = 27,160.8 ns. */
    const double S = 1048576, a = 500e-9, b = 50e9;
    CHECK_REL(45943.04e-9, sim_collective_seconds(MODEL_COLL_ALLREDUCE, S, 16, a, b), 1e-12);
    CHECK_REL(27160.8e-9, sim_collective_seconds(MODEL_COLL_ALL_GATHER, S, 16, a, b), 1e-12);
    CHECK_REL(27160.8e-9, sim_collective_seconds(MODEL_COLL_REDUCE_SCATTER, S, 16, a, b), 1e-12);
    /* 64 MiB over 8 ranks: the ring wins: 14 x (500 ns + 8 MiB / 50 GB/s = 167,772.16 ns) */
    CHECK_REL(14 * (500e-9 + 8388608 / 50e9), sim_collective_seconds(MODEL_COLL_ALLREDUCE, 64 * S, 8, a, b), 1e-12);
    CHECK_REL(500e-9 + S / b, sim_collective_seconds(MODEL_COLL_SEND, S, 2, a, b), 1e-12);
    CHECK_EQ_U64(0, sim_collective_seconds(MODEL_COLL_ALLREDUCE, S, 1, a, b) == 0.0 ? 0 : 1);
}

static void test_placement(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    ModelDims d;
    model_spec_defaults(&s);
    SimCtx c;
    sim_ctx_init(&c, &cl, &s, &d, 8);
    double alpha, beta;
    int nodes;
    /* tp 8 fills a node: NVLink at 300 GB/s x 0.8 */
    sim_group_path(&c, 0, 1, 8, &alpha, &beta, &nodes);
    CHECK_EQ_INT(1, nodes);
    CHECK_REL(240e9, beta, 1e-12);
    CHECK_REL(3e-6, alpha, 1e-12);
    /* a DP group 8 apart (after tp 8): one rank per node, one NIC: 25 GB/s x 0.85 */
    sim_group_path(&c, 0, 8, 16, &alpha, &beta, &nodes);
    CHECK_EQ_INT(16, nodes);
    CHECK_REL(21.25e9, beta, 1e-12);
    CHECK_REL(5e-6, alpha, 1e-12);
    /* a DP group 2 apart (after tp 2) over 4 nodes: 4 ranks per node drive 4 NICs */
    sim_group_path(&c, 0, 2, 16, &alpha, &beta, &nodes);
    CHECK_EQ_INT(4, nodes);
    CHECK_REL(85e9, beta, 1e-12);
    /* 8 ranks per node would drive 200 GB/s of NICs, capped by the node's links */
    sim_group_path(&c, 0, 1, 64, &alpha, &beta, &nodes);
    CHECK_EQ_INT(8, nodes);
    CHECK_REL(170e9, beta, 1e-12);
}

static void test_gemm_quantization(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s;
    model_spec_defaults(&s);
    s.job.precision = PX_BF16;
    ModelDims d = {0};
    SimCtx c;
    sim_ctx_init(&c, &cl, &s, &d, 8);
    double e1, e2, e3, e4;
    const double k_factor = 8192.0 / (8192.0 + 64.0);
    /* 108 SMs: 6912 x 4096 makes 27 x 32 = 864 tiles of 256 x 128, exactly 8 waves */
    ModelGemm full = {6912, 4096, 8192, 1};
    sim_gemm_seconds(&c, &full, &e1);
    CHECK_REL(0.67 * k_factor, e1, 1e-12);
    /* one more row of 256-row tiles makes 896 tiles, 9 waves for 8.3 waves of work: within the
     * A100's clock headroom (9 / 8.3 = 1.085 < 1.125) the busy SMs of the last wave run faster,
     * so nothing is lost */
    ModelGemm spill = {6912 + 256, 4096, 8192, 1};
    sim_gemm_seconds(&c, &spill, &e2);
    CHECK_REL(e1, e2, 1e-12);
    /* n not a multiple of 8 bf16 elements: the misaligned factor (Karpathy's 50257 vs 50304) */
    ModelGemm odd = {6912, 4097, 8192, 1};
    sim_gemm_seconds(&c, &odd, &e3);
    CHECK(e3 < 0.6 * e1);
    /* one tile shape alone: 109 tiles of 256 x 128 fill one wave and 1 SM of a second. The
     * second wave costs 2 / 1.125 waves of sustained work, not 109 / 108 */
    cl.device.n_tiles = 1;
    cl.device.tile_m[0] = 256;
    cl.device.tile_n[0] = 128;
    cl.device.tile_eff[0] = 1.0;
    ModelGemm few = {256 * 109, 128, 8192, 1};
    sim_gemm_seconds(&c, &few, &e4);
    CHECK_REL(0.67 * k_factor * 109.0 / (216.0 / 1.125), e4, 1e-12);
    /* without headroom every partial wave costs a full one: 109 / 216, and the spill 896 / 972 */
    cl.device.clock_headroom = 1.0;
    sim_gemm_seconds(&c, &few, &e4);
    CHECK_REL(0.67 * k_factor * 109.0 / 216.0, e4, 1e-12);
    sim_gemm_seconds(&c, &spill, &e2);
    CHECK_REL(0.67 * k_factor * 896.0 / 972.0, e2, 1e-12);
    prof_cluster_free(&cl);
}

static double step(ModelSpec s, const ProfCluster *cl, int gpus, double *compute, double *dp_total)
{
    PxError err = {0};
    SimResult r;
    CHECK_OK(sim_run(&s, cl, gpus, &r, &err), err);
    double t = r.step_s;
    *compute = r.compute_s;
    *dp_total = 0;
    const ModelOpGraph *g = &r.ops[r.critical_stage];
    for (int i = 0; i < g->count; i++)
        if (!g->op[i].per_microbatch && g->op[i].kind == MODEL_OP_COMM &&
            model_comm_group(g->op[i].comm) == MODEL_GROUP_DP)
            *dp_total += r.op_seconds[r.critical_stage][i];
    /* the breakdown is consistent: the step is at least the pipeline plus the optimizer */
    CHECK(t >= r.stage_time[r.critical_stage].pipeline_s + r.optimizer_s - 1e-12);
    sim_result_free(&r);
    return t;
}

static void test_overlap_bounds(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    const char *models[3] = {"gpt3-1.3b", "llama2-7b", "gpt3-13b"};
    for (int mi = 0; mi < 3; mi++) {
        for (int zero = 0; zero <= 3; zero++) {
            for (int tp = 1; tp <= 4; tp *= 2) {
                ModelSpec s;
                model_spec_defaults(&s);
                CHECK_OK(model_config_load(models[mi], &s.model, &err), err);
                s.layout.tp = tp;
                s.layout.zero = zero;
                s.layout.sp = tp > 1;
                s.job.global_batch = 64;
                double c0, c1, dp0, dp1;
                double serial = step(s, &cl, 32, &c0, &dp0);
                s.layout.overlap_dp = 1;
                s.layout.overlap_tp = 1;
                double over = step(s, &cl, 32, &c1, &dp1);
                CHECK_REL(c0, c1, 1e-12); /* the same compute */
                /* never slower than without overlap, never faster than compute alone or than
                 * the network's serial time for the gradients */
                CHECK(over <= serial * (1 + 1e-12));
                CHECK(over >= c1);
                CHECK(over >= dp1);
            }
        }
    }
}

/* Context parallelism's exposed exchange (docs/time.md, "Context parallelism"), cp 4, slowdown
 * 0.1. The ring forward: 3 steps of 1 ms each under a 2 ms core's 0.5 ms blocks: 3 x (0.5 ms
 * exposed + 0.1 x 0.5 ms hidden) = 1.65 ms. Its backward: 7 calls of 1 ms, 3 steps of K, V and
 * dK, dV (2 ms) under an 8 ms core's 2 ms blocks: 3 x 0.1 x 2 ms, plus the last dK, dV's
 * 1 ms: 1.6 ms. The all-gather and the all-to-all are exposed whole. */
static void test_cp_exposed(void)
{
    ModelOp ops[2];
    memset(ops, 0, sizeof ops);
    ModelOpGraph g = {.op = ops, .count = 2, .cap = 2};
    ModelLayout l;
    memset(&l, 0, sizeof l);
    for (int i = 0; i < 2; i++) {
        ops[i].phase = MODEL_FWD;
        ops[i].role = MODEL_OPR_CORE;
        ops[i].layer = 3;
    }
    ops[0].kind = MODEL_OP_COMM;
    ops[0].comm = MODEL_CP_P2P;
    ops[0].group_size = 4;
    ops[0].calls = 3;
    ops[1].kind = MODEL_OP_ATTENTION;
    double t[2] = {3e-3, 2e-3};
    CHECK_REL(1.65e-3, sim_comm_exposed(&g, t, 0, &l, 8, 0.1), 1e-12);
    /* the backward's op follows the core's backward */
    ops[0] = ops[1];
    ops[0].phase = ops[1].phase = MODEL_BWD;
    ops[1].kind = MODEL_OP_COMM;
    ops[1].comm = MODEL_CP_P2P;
    ops[1].group_size = 4;
    ops[1].calls = 7;
    double tb[2] = {8e-3, 7e-3};
    CHECK_REL(1.6e-3, sim_comm_exposed(&g, tb, 1, &l, 8, 0.1), 1e-12);
    ops[1].comm = MODEL_CP_REDUCE_SCATTER;
    ops[1].calls = 1;
    CHECK_REL(7e-3, sim_comm_exposed(&g, tb, 1, &l, 8, 0.1), 1e-12);
    ops[1].comm = MODEL_CP_ALL_TO_ALL;
    CHECK_REL(7e-3, sim_comm_exposed(&g, tb, 1, &l, 8, 0.1), 1e-12);
}

int main(void)
{
    px_log_set_quiet(1);
    test_uniform_bubbles();
    test_collectives();
    test_placement();
    test_gemm_quantization();
    test_overlap_bounds();
    test_cp_exposed();
    TEST_DONE("time");
}
