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

    /* without HSDP: none */
    c = count(spec(16, MODEL_RECOMPUTE_FULL), 16, NULL);
    CHECK_EQ_INT(0, c.dpr);
}

int main(void)
{
    px_log_set_quiet(1);
    test_gathers();
    test_buckets();
    test_hsdp();
    printf("test_sim_zero3: %d checks passed\n", px_test_checks);
    return 0;
}
