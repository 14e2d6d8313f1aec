/* Sharded data parallelism (docs/time.md, "Sharded data parallelism"): the op graph's ZeRO-3
 * gathers and reduce-scatters per phase for DeepSpeed's ZeRO-3, FSDP and kept parameters, with
 * and without full recompute; buckets; HSDP's all-reduce over the replicas, its bytes and where
 * its group sits. A 2-layer GPT of h = 64 (vocabulary 128, 32 positions, tied embeddings): a
 * layer holds 12h^2 + 13h = 49,984 parameters, the embedding 128 x 64 + 32 x 64 = 10,240, the
 * final norm 2h = 128. */
#include "fixtures.h"
#include "sim/internal.h"
#include "test.h"

#define LAYER_NUMEL 49984.0

typedef struct {
    int gather[4];  /* per phase (fwd, bwd, recompute, step): all-gathers of the layers' blocks */
    int reduce[4];  /* reduce-scatters of the layers' blocks */
    int other_gather; /* all-gathers of the embedding and the final block */
    int dpr, dpr_layers;
    uint64_t gather_bytes, reduce_bytes, dpr_bytes; /* of one layer block's op, calls included */
    int gather_calls, reduce_calls;
} Count;

static ModelSpec spec(int dp, int recompute)
{
    ModelSpec s = fx_spec(fx_gpt(2, 64, 4, 128, 32));
    s.layout.dp = dp;
    s.layout.zero = 3;
    s.layout.recompute = recompute;
    s.job.global_batch = dp;
    s.job.micro_batch = 1;
    s.job.grad_dtype = PX_BF16;
    return s;
}

static Count count(ModelSpec s, int gpus, ModelDims *dims)
{
    PxError err = {0};
    ModelDims d;
    CHECK_OK(model_spec_check(&s, gpus, &d, &err), err);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    Count c;
    memset(&c, 0, sizeof c);
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind != MODEL_OP_COMM)
            continue;
        const int layer = op->layer >= 0 && op->block >= 0;
        const uint64_t total = op->comm_bytes * (uint64_t)op->calls;
        if (op->comm == MODEL_DP_ALL_GATHER) {
            CHECK_EQ_INT(op->phase != MODEL_STEP, op->per_microbatch);
            if (layer) {
                c.gather[op->phase]++;
                c.gather_bytes = total;
                c.gather_calls = op->calls;
            } else {
                c.other_gather++;
            }
        } else if (op->comm == MODEL_DP_REDUCE_SCATTER && layer) {
            c.reduce[op->phase]++;
            c.reduce_bytes = total;
            c.reduce_calls = op->calls;
        } else if (op->comm == MODEL_DPR_ALLREDUCE) {
            CHECK_EQ_INT(MODEL_STEP, op->phase);
            CHECK_EQ_INT(0, op->per_microbatch);
            CHECK_EQ_INT(d.dp_rep, op->group_size);
            c.dpr++;
            if (layer) {
                c.dpr_layers++;
                c.dpr_bytes = total;
            }
        }
    }
    model_ops_free(&g);
    if (dims)
        *dims = d;
    return c;
}

/* The contract's gathers per layer and micro-batch, phase by phase. */
static void test_gathers(void)
{
    /* DeepSpeed's ZeRO-3 (fsdp 0), full recompute: forward, recompute, backward: 3 a layer.
     * bf16: round_up(49,984, 4) x 2 = 99,968 B each; the gradients' reduce-scatter the same */
    Count c = count(spec(4, MODEL_RECOMPUTE_FULL), 4, NULL);
    CHECK_EQ_INT(2, c.gather[MODEL_FWD]);
    CHECK_EQ_INT(2, c.gather[MODEL_RECOMPUTE]);
    CHECK_EQ_INT(2, c.gather[MODEL_BWD]);
    CHECK_EQ_INT(0, c.gather[MODEL_STEP]);
    CHECK_EQ_INT(2, c.reduce[MODEL_BWD]);
    CHECK_EQ_U64(99968, c.gather_bytes);
    CHECK_EQ_U64(99968, c.reduce_bytes);
    CHECK_EQ_INT(1, c.gather_calls);
    /* embedding and final block: forward (the tied output layer gathers the embedding again)
     * and backward: 3 + 3 */
    CHECK_EQ_INT(6, c.other_gather);
    CHECK_EQ_INT(0, c.dpr);

    /* FSDP: the backward's one gather serves the recomputed forward */
    ModelSpec s = spec(4, MODEL_RECOMPUTE_FULL);
    s.layout.fsdp = 1;
    c = count(s, 4, NULL);
    CHECK_EQ_INT(2, c.gather[MODEL_FWD]);
    CHECK_EQ_INT(0, c.gather[MODEL_RECOMPUTE]);
    CHECK_EQ_INT(2, c.gather[MODEL_BWD]);

    /* no recompute: forward and backward, with and without fsdp */
    for (int f = 0; f < 2; f++) {
        s = spec(4, MODEL_RECOMPUTE_NONE);
        s.layout.fsdp = f;
        c = count(s, 4, NULL);
        CHECK_EQ_INT(2, c.gather[MODEL_FWD]);
        CHECK_EQ_INT(0, c.gather[MODEL_RECOMPUTE]);
        CHECK_EQ_INT(2, c.gather[MODEL_BWD]);
    }

    /* kept parameters: the forward's gather only, whatever the recompute; the embedding and
     * final block keep theirs too */
    for (int r = 0; r < 2; r++) {
        s = spec(4, r ? MODEL_RECOMPUTE_FULL : MODEL_RECOMPUTE_SELECTIVE);
        s.layout.keep_gathered = 1;
        c = count(s, 4, NULL);
        CHECK_EQ_INT(2, c.gather[MODEL_FWD]);
        CHECK_EQ_INT(0, c.gather[MODEL_RECOMPUTE]);
        CHECK_EQ_INT(0, c.gather[MODEL_BWD]);
        CHECK_EQ_INT(3, c.other_gather);
        CHECK_EQ_INT(2, c.reduce[MODEL_BWD]);
    }
}

/* Buckets: 25,000 B cut the 99,968 B block into ceil(99,968 / 25,000) = 4 calls of 3,124
 * elements a rank (12,496 / 4) x 4 ranks x 2 B = 24,992 B; 20,000 B into 5 calls, each rank's
 * 12,496 elements as 5 of 2,500 (the last padded): 20,000 B a call. */
static void test_buckets(void)
{
    ModelSpec s = spec(4, MODEL_RECOMPUTE_FULL);
    s.layout.bucket_bytes = 25000;
    Count c = count(s, 4, NULL);
    CHECK_EQ_INT(4, c.gather_calls);
    CHECK_EQ_INT(4, c.reduce_calls);
    CHECK_EQ_U64(99968, c.gather_bytes);
    CHECK_EQ_U64(99968, c.reduce_bytes);
    CHECK_EQ_INT(2, c.gather[MODEL_RECOMPUTE]); /* still one op a block */
    s.layout.bucket_bytes = 20000;
    c = count(s, 4, NULL);
    CHECK_EQ_INT(5, c.gather_calls);
    CHECK_EQ_U64(100000, c.gather_bytes);
    /* a bucket larger than the block: one call */
    s.layout.bucket_bytes = 1e6;
    c = count(s, 4, NULL);
    CHECK_EQ_INT(1, c.gather_calls);
    CHECK_EQ_U64(99968, c.gather_bytes);
}

/* HSDP, dp 16 = dp_shard 8 x dp_replicate 2: each block's gradient shard, round_up(49,984, 8) /
 * 8 = 6,248 elements x 2 B = 12,496 B, all-reduced over 2 replicas once per step; one op per
 * block (2 layers, embedding, final). The shard group is 8: the gathers move round_up(49,984,
 * 8) x 2 = 99,968 B. The replicas sit 8 ranks apart: on dgx-a100, a node apart. */
static void test_hsdp(void)
{
    ModelSpec s = spec(16, MODEL_RECOMPUTE_FULL);
    s.layout.dp_shard = 8;
    ModelDims d;
    Count c = count(s, 16, &d);
    CHECK_EQ_INT(8, d.zero_group);
    CHECK_EQ_INT(2, d.dp_rep);
    CHECK_EQ_INT(4, c.dpr);
    CHECK_EQ_INT(2, c.dpr_layers);
    CHECK_EQ_U64(12496, c.dpr_bytes);
    CHECK_EQ_U64(99968, c.gather_bytes);

    /* its cost on dgx-a100: 2 ranks 8 apart sit on 2 nodes, a NIC share each (25 GB/s x 0.85
     * = 21.25 GB/s) at 5 us: ring 2 x (5 us + 6,248 B / 21.25 GB/s) = 10.588047 us, below the
     * tree's 2 x 5 us + 2 x 12,496 B / 21.25 GB/s = 11.176094 us */
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    SimCtx sc;
    sim_ctx_init(&sc, &cl, &s, &d, 8);
    ModelOp op;
    memset(&op, 0, sizeof op);
    op.kind = MODEL_OP_COMM;
    op.comm = MODEL_DPR_ALLREDUCE;
    op.group_size = 2;
    op.comm_bytes = 12496;
    op.calls = 1;
    CHECK_REL(2.0 * (5e-6 + 6248.0 / 21.25e9), sim_comm_seconds(&sc, &op, 0), 1e-12);
    /* dp 8 as dp_shard 1 x dp_replicate 8: the replicas are neighbours on one node (NVLink,
     * 240 GB/s at 3 us): the tree's 2 x 3 x 3 us + 2 x 12,496 B / 240 GB/s = 18.104133 us beats
     * the ring's 14 x (3 us + 1,562 B / 240 GB/s) */
    ModelSpec s1 = spec(8, MODEL_RECOMPUTE_FULL);
    s1.layout.dp_shard = 1;
    ModelDims d1;
    CHECK_OK(model_spec_check(&s1, 8, &d1, &err), err);
    CHECK_EQ_INT(8, d1.dp_rep);
    sim_ctx_init(&sc, &cl, &s1, &d1, 8);
    op.group_size = 8;
    CHECK_REL(18e-6 + 2.0 * 12496.0 / 240e9, sim_comm_seconds(&sc, &op, 0), 1e-12);
    prof_cluster_free(&cl);

    /* without HSDP: none */
    c = count(spec(16, MODEL_RECOMPUTE_FULL), 16, NULL);
    CHECK_EQ_INT(0, c.dpr);
}


/* A graph of hand-made ops: kind (0 compute, 1 gather, 2 reduce-scatter), phase, layer,
 * seconds; one chunk, per micro-batch. */
typedef struct {
    int kind;
    ModelPhase phase;
    int layer, repeat;
    double s;
} HandOp;

static void hand_exposed(const HandOp *h, int n, int prefetch, double slow, double *out)
{
    ModelOp ops[16];
    double t[16];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < n; i++) {
        ops[i].kind = h[i].kind ? MODEL_OP_COMM : MODEL_OP_MATMUL;
        ops[i].comm = h[i].kind == 1 ? MODEL_DP_ALL_GATHER : MODEL_DP_REDUCE_SCATTER;
        ops[i].phase = h[i].phase;
        ops[i].layer = h[i].layer;
        ops[i].repeat = h[i].repeat ? h[i].repeat : 1;
        ops[i].per_microbatch = 1;
        ops[i].calls = 1;
        t[i] = h[i].s;
        out[i] = -1;
    }
    ModelOpGraph g = {.op = ops, .count = n, .cap = n};
    ModelLayout l;
    memset(&l, 0, sizeof l);
    l.overlap_dp = 1;
    l.prefetch = prefetch;
    CHECK(sim_dp_exposed(&g, t, &l, 1, slow, out) == 0);
}

/* The two streams by hand (no slowdown unless said):
 *  - forward, gathers of 2 s, layers of 3 s: layer 0's gather waits in full (2 s), layer 1's
 *    runs 2-4 s under layer 0 (2-5 s): hidden. Slowdown 0.1: 2 and 0.2.
 *  - gathers of 4 s: 0-4 s exposed, the next 4-8 s under compute 4-7 s: 1 s exposed; with
 *    prefetch none it starts at 7 s: 4 s.
 *  - a compact run of the same two layers (repeat 2): each op's average, (2 + 0) / 2 = 1.
 *  - backward, gathers 2 s, layers 4 s, reduce-scatters 3 s: gather 1 0-2 s (exposed), gather
 *    0 2-4 s under layer 1 (2-6 s), reduce-scatter 1 6-9 s under layer 0 (6-10 s), reduce-
 *    scatter 0 10-13 s after the compute: 3 s exposed.
 *  - the same with gathers of 3 s: gather 0 runs 3-6 s first, reduce-scatter 1 at 7-10 s
 *    under layer 0 (7-11 s), reduce-scatter 0 11-14 s: 3 s.
 *  - and reduce-scatters of 5 s with gathers of 2 s: reduce-scatter 1 6-11 s, layer 0 6-10 s,
 *    reduce-scatter 0 11-16 s: the pass waits 10-16 s, 1 s charged to reduce-scatter 1 and 5
 *    s to reduce-scatter 0 (the capacity of layer 0's compute is shared, not granted twice).
 *  - DeepSpeed's layer with full recompute: gather 2 s, recompute 2 s, gather 2 s, backward
 *    4 s, reduce-scatter 3 s: the first gather waits (2 s), the second runs 2-4 s under the
 *    recompute, the reduce-scatter after the backward, 8-11 s: exposed 2, 0, 3. */
static void test_two_streams(void)
{
    double x[16];
    HandOp fwd[4] = {{1, MODEL_FWD, 0, 0, 2}, {0, MODEL_FWD, 0, 0, 3}, {1, MODEL_FWD, 1, 0, 2}, {0, MODEL_FWD, 1, 0, 3}};
    hand_exposed(fwd, 4, 0, 0.0, x);
    CHECK_REL(2.0, x[0], 1e-12);
    CHECK(x[2] == 0.0);
    CHECK(x[1] == -1); /* compute ops untouched */
    hand_exposed(fwd, 4, 0, 0.1, x);
    CHECK_REL(2.0, x[0], 1e-12);
    CHECK_REL(0.2, x[2], 1e-12);
    fwd[0].s = fwd[2].s = 4;
    hand_exposed(fwd, 4, 1, 0.0, x);
    CHECK_REL(4.0, x[0], 1e-12);
    CHECK_REL(1.0, x[2], 1e-12);
    hand_exposed(fwd, 4, -1, 0.0, x);
    CHECK_REL(4.0, x[2], 1e-12);

    HandOp run[2] = {{1, MODEL_FWD, 0, 2, 2}, {0, MODEL_FWD, 0, 2, 3}};
    hand_exposed(run, 2, 0, 0.0, x);
    CHECK_REL(1.0, x[0], 1e-12);

    HandOp bwd[6] = {{1, MODEL_BWD, 1, 0, 2}, {0, MODEL_BWD, 1, 0, 4}, {2, MODEL_BWD, 1, 0, 3},
                     {1, MODEL_BWD, 0, 0, 2}, {0, MODEL_BWD, 0, 0, 4}, {2, MODEL_BWD, 0, 0, 3}};
    hand_exposed(bwd, 6, 0, 0.0, x);
    CHECK_REL(2.0, x[0], 1e-12);
    CHECK(x[2] == 0.0);
    CHECK(x[3] == 0.0);
    CHECK_REL(3.0, x[5], 1e-12);
    bwd[0].s = bwd[3].s = 3;
    hand_exposed(bwd, 6, 0, 0.0, x);
    CHECK_REL(3.0, x[0], 1e-12);
    CHECK(x[2] == 0.0);
    CHECK(x[3] == 0.0);
    CHECK_REL(3.0, x[5], 1e-12);
    bwd[0].s = bwd[3].s = 2;
    bwd[2].s = bwd[5].s = 5;
    hand_exposed(bwd, 6, 0, 0.0, x);
    CHECK_REL(1.0, x[2], 1e-12);
    CHECK_REL(5.0, x[5], 1e-12);

    HandOp ds[5] = {{1, MODEL_RECOMPUTE, 0, 0, 2}, {0, MODEL_RECOMPUTE, 0, 0, 2}, {1, MODEL_BWD, 0, 0, 2},
                    {0, MODEL_BWD, 0, 0, 4}, {2, MODEL_BWD, 0, 0, 3}};
    hand_exposed(ds, 5, 0, 0.0, x);
    CHECK_REL(2.0, x[0], 1e-12);
    CHECK(x[2] == 0.0);
    CHECK_REL(3.0, x[4], 1e-12);
}

/* The ZeRO group's latency: a gather over 16 ranks, tp 1 on dgx-a100 (8 a node), crosses 2
 * nodes: alpha is the network's 5 us, beta 8 NIC shares of 21.25 GB/s = 170 GB/s; 16 MiB:
 * 15 x (5 us + 1 MiB / 170 GB/s) = 167.52141 us a call, and a bucketed op pays it per call
 * (4 calls of 4 MiB: 4 x 15 x (5 us + 256 KiB / 170 GB/s) = 392.52141 us). On one node (8
 * ranks): NVLink's 3 us and 240 GB/s. */
static void test_latency(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &cl, &err), err);
    ModelSpec s = spec(16, MODEL_RECOMPUTE_FULL);
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 16, &d, &err), err);
    SimCtx sc;
    sim_ctx_init(&sc, &cl, &s, &d, 8);
    ModelOp op;
    memset(&op, 0, sizeof op);
    op.kind = MODEL_OP_COMM;
    op.comm = MODEL_DP_ALL_GATHER;
    op.group_size = 16;
    op.comm_bytes = 16777216;
    op.calls = 1;
    CHECK_REL(167.52141e-6, sim_comm_seconds(&sc, &op, 0), 1e-7);
    op.comm_bytes = 4194304;
    op.calls = 4;
    CHECK_REL(392.52141e-6, sim_comm_seconds(&sc, &op, 0), 1e-7);
    op.calls = 1;
    op.group_size = 8;
    op.comm_bytes = 16777216;
    CHECK_REL(7.0 * (3e-6 + 2097152.0 / 240e9), sim_comm_seconds(&sc, &op, 0), 1e-12);
    prof_cluster_free(&cl);
}

int main(void)
{
    px_log_set_quiet(1);
    test_gathers();
    test_buckets();
    test_hsdp();
    test_two_streams();
    test_latency();
    printf("test_sim_zero3: %d checks passed\n", px_test_checks);
    return 0;
}
