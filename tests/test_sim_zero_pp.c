/* ZeRO-2/3 with pipeline parallelism and FP8 parameter gathering under ZeRO-3 (docs/time.md,
 * "Sharded data parallelism with a pipeline"), worked by hand on a small case: a 4-layer GPT
 * of h = 64 (4 heads, vocabulary 128, 32 positions, tied embeddings) on pp 2 x dp 2, bf16
 * parameters, fp32 gradients, AdamW, 4 micro-batches a step.
 *
 * A layer holds 12h^2 + 13h = 49,984 parameters, of them 12h^2 = 49,152 in its four GEMM
 * weights (QKV 3h x h, projection h x h, fc1 4h x h, fc2 h x 4h); the embedding 128 x 64 +
 * 32 x 64 = 10,240. Stage 0 holds the embedding and layers 0-1: 110,208 parameters, each
 * block even, so a dp-2 shard is half of it: 55,104. */
#include "fixtures.h"
#include "sim/internal.h"
#include "test.h"

#define STAGE0 110208u /* parameters on stage 0 */
#define SHARD0 55104u  /* their ZeRO shard over dp 2 */

static ModelSpec spec(int zero)
{
    ModelSpec s = fx_spec(fx_gpt(4, 64, 4, 128, 32));
    s.layout.pp = 2;
    s.layout.dp = 2;
    s.layout.zero = zero;
    s.layout.fsdp = zero == 3;
    s.job.global_batch = 8;
    s.job.micro_batch = 1;
    s.job.grad_dtype = PX_FP32;
    return s;
}

static void simulate(ModelSpec s, SimResult *r)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    CHECK_OK(sim_run(&s, &cl, 4, r, &err), err);
    prof_cluster_free(&cl);
}

/* DP / ZeRO collectives that run every micro-batch on stage 0: none under a pipeline. */
static int per_microbatch_dp_ops(const SimResult *r)
{
    int n = 0;
    for (int i = 0; i < r->ops[0].count; i++) {
        const ModelOp *op = &r->ops[0].op[i];
        const ModelGroup g = op->kind == MODEL_OP_COMM ? model_comm_group(op->comm) : MODEL_GROUP_TP;
        n += op->per_microbatch && (g == MODEL_GROUP_DP || g == MODEL_GROUP_EDP);
    }
    return n;
}

static uint64_t tensor_bytes(const SimResult *r, const char *name)
{
    const ModelTensorTable *tt = &r->work->tables[0];
    for (int i = 0; i < tt->count; i++)
        if (strcmp(tt->t[i].name, name) == 0)
            return tt->t[i].bytes;
    return 0;
}

/* ZeRO-3 under a pipeline, as torchtitan runs FSDP2 with PP: the stage's parameters gathered
 * once a step and kept gathered across its 4 micro-batches, the gradients accumulated whole and
 * reduce-scattered once. */
static void test_zero3_pp(void)
{
    SimResult r, z1;
    simulate(spec(3), &r);
    simulate(spec(1), &z1);
    CHECK_EQ_INT(1, r.dims.zero_per_step);
    CHECK_EQ_INT(4, r.dims.m);
    CHECK_EQ_INT(0, per_microbatch_dp_ops(&r));
    const SimStageMemory *m = &r.mem[0];
    /* weights: the bf16 shard, 55,104 x 2 */
    CHECK_EQ_U64(110208u, m->cat[MODEL_WEIGHTS]);
    /* grads: the whole stage's fp32 accumulation 110,208 x 4 plus the fp32 shard 55,104 x 4 */
    CHECK_EQ_U64(440832u + 220416u, m->cat[MODEL_GRADS]);
    /* master 55,104 x 4; AdamW m and v 2 x 55,104 x 4 */
    CHECK_EQ_U64(220416u, m->cat[MODEL_MASTER]);
    CHECK_EQ_U64(440832u, m->cat[MODEL_OPTIMIZER]);
    /* the gathered parameters, every block of the stage whole in bf16: 110,208 x 2; no
     * gradient bucket (the accumulation is the reduce-scatter's input) */
    CHECK_EQ_U64(220416u, tensor_bytes(&r, "zero.param_gather"));
    CHECK_EQ_U64(0u, tensor_bytes(&r, "zero.grad_bucket"));
    CHECK_EQ_U64(z1.mem[0].cat[MODEL_COMM_BUFFERS] + 220416u, m->cat[MODEL_COMM_BUFFERS]);
    /* bytes per step: one gather in bf16, one reduce-scatter in fp32, whatever m is */
    CHECK_EQ_U64((uint64_t)STAGE0 * 2u, r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64((uint64_t)STAGE0 * 4u, r.comm[0][MODEL_DP_REDUCE_SCATTER]);
    CHECK_EQ_U64(0u, r.comm[0][MODEL_DP_ALLREDUCE]);
    /* ZeRO-1 moves the same bytes (its gather after the step, not before the forward) */
    CHECK_EQ_U64(z1.comm[0][MODEL_DP_ALL_GATHER], r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64(z1.comm[0][MODEL_DP_REDUCE_SCATTER], r.comm[0][MODEL_DP_REDUCE_SCATTER]);
    /* the compact tables the planner reads agree */
    PxError err = {0};
    uint64_t peak = 0;
    int peak_stage = -1;
    CHECK_OK(sim_memory_peak(&r.spec, &r.dims, &r.cluster, NULL, &peak, &peak_stage, &err), err);
    CHECK_EQ_U64(r.peak_bytes, peak);
    sim_result_free(&r);
    sim_result_free(&z1);
}

/* ZeRO-2 under a pipeline: the gradients accumulate whole and are reduce-scattered once a step
 * into their shard; the parameters stay whole, the updated shards gathered after the step. */
static void test_zero2_pp(void)
{
    SimResult r;
    simulate(spec(2), &r);
    CHECK_EQ_INT(1, r.dims.zero_per_step);
    CHECK_EQ_INT(0, per_microbatch_dp_ops(&r));
    const SimStageMemory *m = &r.mem[0];
    CHECK_EQ_U64((uint64_t)STAGE0 * 2u, m->cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64((uint64_t)STAGE0 * 4u + (uint64_t)SHARD0 * 4u, m->cat[MODEL_GRADS]);
    CHECK_EQ_U64(0u, tensor_bytes(&r, "zero.grad_bucket"));
    CHECK_EQ_U64(0u, tensor_bytes(&r, "zero.param_gather"));
    CHECK_EQ_U64((uint64_t)STAGE0 * 2u, r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64((uint64_t)STAGE0 * 4u, r.comm[0][MODEL_DP_REDUCE_SCATTER]);
    sim_result_free(&r);
}

/* --fp8-param-gather under ZeRO-3 (torchao's float8 all-gather with FSDP2), tensorwise scaling:
 * a layer's four GEMM weights (49,152) travel in one byte, its norms and biases (832) in two:
 * 50,816 bytes a layer, against 99,968 in bf16; the embedding stays bf16 (20,480). Each step
 * the 8 FP8 weights' amaxes are all-reduced in one call: 32 bytes. The kept gathered weights
 * are 49,152 x 2 FP8 bytes with 8 fp32 scales, each padded to 16 bytes (128), the rest
 * (10,240 + 2 x 832 = 11,904) bf16. */
static void test_fp8_param_gather(void)
{
    ModelSpec s = spec(3);
    s.job.fp8 = MODEL_FP8_TENSORWISE;
    s.job.fp8_param_gather = 1;
    SimResult r;
    simulate(s, &r);
    CHECK_EQ_U64(20480u + 2u * 50816u, r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64(32u, r.comm[0][MODEL_DP_ALLREDUCE]);
    CHECK_EQ_U64(98304u + 128u, tensor_bytes(&r, "zero.param_gather_fp8"));
    CHECK_EQ_U64(11904u * 2u, tensor_bytes(&r, "zero.param_gather"));
    sim_result_free(&r);
    /* without a pipeline: per micro-batch gathers, each layer's 50,816 bytes */
    s.layout.pp = 1;
    s.layout.dp = 4;
    SimResult q;
    simulate(s, &q);
    CHECK_EQ_INT(0, q.dims.zero_per_step);
    int layers = 0;
    for (int i = 0; i < q.ops[0].count; i++) {
        const ModelOp *op = &q.ops[0].op[i];
        if (op->kind == MODEL_OP_COMM && op->comm == MODEL_DP_ALL_GATHER && op->layer == 1 &&
            op->phase == MODEL_FWD) {
            CHECK_EQ_U64(50816u, op->comm_bytes * (uint64_t)op->calls);
            layers++;
        }
    }
    CHECK_EQ_INT(1, layers);
    sim_result_free(&q);
}

/* --fp8-param-gather below ZeRO-3 (Megatron's distributed optimizer): ZeRO-2 under the
 * pipeline gathers the updated shards after the step with the FP8 weights in one byte, as
 * ZeRO-3 gathers them (20,480 + 2 x 50,816 bytes), once the 8 weights' amaxes are all-reduced
 * (32 bytes: a shard's amax is not its weight's; the op graph counted none below ZeRO-3), with
 * blockwise every tile's. The FP8 weights replace the ones the optimizer writes, so fp32
 * training keeps an fp32 master (ZeRO-1: its shard, 55,104 x 4 bytes). */
static void test_fp8_param_gather_below_zero3(void)
{
    ModelSpec s = spec(2);
    s.job.fp8 = MODEL_FP8_TENSORWISE;
    s.job.fp8_param_gather = 1;
    SimResult r;
    simulate(s, &r);
    CHECK_EQ_U64(20480u + 2u * 50816u, r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64(32u, r.comm[0][MODEL_DP_ALLREDUCE]);
    sim_result_free(&r);
    /* blockwise: a shard's cut splits the 128 x 128 tiles, whose amaxes are all-reduced: 7 a
     * layer (qkv 192 x 64: 2, proj 64 x 64: 1, fc1 256 x 64: 2, fc2 64 x 256: 2), 56 bytes */
    s.job.fp8 = MODEL_FP8_BLOCKWISE;
    simulate(s, &r);
    CHECK_EQ_U64(20480u + 2u * 50816u, r.comm[0][MODEL_DP_ALL_GATHER]);
    CHECK_EQ_U64(56u, r.comm[0][MODEL_DP_ALLREDUCE]);
    sim_result_free(&r);
    s = spec(1);
    s.job.fp8 = MODEL_FP8_TENSORWISE;
    s.job.fp8_param_gather = 1;
    s.job.precision = PX_FP32;
    s.job.grad_dtype = PX_FP32;
    SimResult q;
    simulate(s, &q);
    CHECK_EQ_INT(1, q.dims.master);
    CHECK_EQ_U64((uint64_t)SHARD0 * 4u, q.mem[0].cat[MODEL_MASTER]);
    CHECK_EQ_U64(32u, q.comm[0][MODEL_DP_ALLREDUCE]);
    sim_result_free(&q);
}

int main(void)
{
    px_log_set_quiet(1);
    test_zero3_pp();
    test_zero2_pp();
    test_fp8_param_gather();
    test_fp8_param_gather_below_zero3();
    printf("test_sim_zero_pp: %d checks passed\n", px_test_checks);
    return 0;
}
