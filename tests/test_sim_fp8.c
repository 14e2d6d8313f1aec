/* FP8 training in the model and the simulator: an FP8 matrix's bytes under each recipe (and
 * the kernels' layout of the same matrix), the hand-computed Llama-3-70B memory of docs/fp8.md
 * under every recipe, the devices that refuse a recipe, FP8 GEMM time against the 16-bit one,
 * the quantization bytes of a linear op, FP8 parameter gathering's bytes, and the comparison
 * with the same layout without FP8. */
#include "fixtures.h"
#include "kernels/kernels.h"
#include "sim/internal.h"
#include "test.h"

/* rows x cols + scales: per tensor one fp32; blockwise weights 128 x 128 blocks, activations
 * 1 x 128, fp32; MXFP8 1 x 32 blocks of one E8M0 byte. 130 x 200:
 *   tensorwise 26000 + 4; blockwise weight 2 x 2 blocks: 26000 + 16; blockwise activation
 *   130 x 2: 26000 + 1040; mxfp8 130 x 7: 26000 + 910. */
static void test_fp8_bytes(void)
{
    CHECK_EQ_U64(26004, model_fp8_bytes(MODEL_FP8_TENSORWISE, 1, 130, 200));
    CHECK_EQ_U64(26004, model_fp8_bytes(MODEL_FP8_DELAYED, 0, 130, 200));
    CHECK_EQ_U64(26016, model_fp8_bytes(MODEL_FP8_BLOCKWISE, 1, 130, 200));
    CHECK_EQ_U64(27040, model_fp8_bytes(MODEL_FP8_BLOCKWISE, 0, 130, 200));
    CHECK_EQ_U64(26910, model_fp8_bytes(MODEL_FP8_MXFP8, 1, 130, 200));
    CHECK_EQ_U64(910, model_fp8_scale_bytes(MODEL_FP8_MXFP8, 0, 130, 200));
    /* the kernels' layout of the same matrices holds as many bytes */
    const ModelFp8Recipe recipes[] = {MODEL_FP8_DELAYED, MODEL_FP8_TENSORWISE, MODEL_FP8_BLOCKWISE,
                                      MODEL_FP8_MXFP8};
    const int64_t shapes[][2] = {{130, 200}, {1, 1}, {4096, 14336}, {33, 31}};
    for (int r = 0; r < 4; r++)
        for (int w = 0; w < 2; w++)
            for (int i = 0; i < 4; i++) {
                ModelFp8Scaling sc;
                model_fp8_scaling(recipes[r], w, shapes[i][0], shapes[i][1], &sc);
                KernFp8 f = {(int)shapes[i][0], (int)shapes[i][1], (int)sc.block_r, (int)sc.block_c, 0,
                             sc.e8m0};
                CHECK_EQ_U64(kern_fp8_bytes(&f),
                             model_fp8_bytes(recipes[r], w, shapes[i][0], shapes[i][1]));
            }
    CHECK_EQ_INT(MODEL_FP8_BLOCKWISE, model_fp8_recipe_from_name("blockwise"));
    CHECK_EQ_INT(-1, model_fp8_recipe_from_name("fp4"));
    CHECK_STR("mxfp8", model_fp8_recipe_name(MODEL_FP8_MXFP8));
}

/* Llama-3-70B, tp 4, pp 8, vpp 5, mbs 1, gbs 128, seq 8192 on 64 GPUs (docs/fp8.md works it by
 * hand): stage 0 holds 10 layers and the embedding. */
static ModelSpec llama70b(ModelFp8Recipe r, int transpose)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-70b", &s.model, &err), err);
    s.layout.tp = 4;
    s.layout.pp = 8;
    s.layout.vpp = 5;
    s.layout.schedule = MODEL_SCHED_INTERLEAVED;
    s.job.micro_batch = 1;
    s.job.global_batch = 128;
    s.job.seq_len = 8192;
    s.job.precision = PX_BF16;
    s.job.fp8 = r;
    s.job.fp8_transpose = transpose;
    return s;
}

static uint64_t stage0(ModelSpec s, ModelCategory cat, uint64_t *layer_acts)
{
    PxError err = {0};
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
    ModelTensorTable tt;
    CHECK_OK(model_tensors_build(&s, &d, 0, &tt, &err), err);
    uint64_t b = model_tensors_bytes(&tt, cat);
    if (layer_acts)
        *layer_acts = model_layer_activation_bytes(&s, &d);
    model_tensors_free(&tt);
    return b;
}

static void test_llama70b_memory(void)
{
    /* bf16: 10 layers x 213,925,888 + embedding 32,064 x 8,192 = 2,401,927,168 parameters */
    uint64_t acts = 0;
    CHECK_EQ_U64(4803854336ull, stage0(llama70b(MODEL_FP8_NONE, -1), MODEL_WEIGHTS, &acts));
    /* a layer's saved activations: 965,214,208 B in bf16 */
    CHECK_EQ_U64(965214208ull, acts);
    /* tensorwise on a TN-only device: + FP8 copies 2,139,095,040 + 40 scales of 4 B, and as
     * much again transposed; the GEMM inputs qkv.in, fc1.in, fc2.in in one byte and a scale,
     * proj.in in bf16 (Megatron-Core's linear_proj keeps the fused core's output):
     * 772,276,236 B */
    CHECK_EQ_U64(9082044736ull, stage0(llama70b(MODEL_FP8_TENSORWISE, 1), MODEL_WEIGHTS, &acts));
    CHECK_EQ_U64(772276236ull, acts);
    /* delayed: proj.in's FP8 copy (16,777,220 B) beside the bf16 one */
    stage0(llama70b(MODEL_FP8_DELAYED, 1), MODEL_WEIGHTS, &acts);
    CHECK_EQ_U64(772276236ull + 16777220ull, acts);
    /* no transposes (Blackwell): the copies once */
    CHECK_EQ_U64(4803854336ull + 2139095200ull, stage0(llama70b(MODEL_FP8_TENSORWISE, 0), MODEL_WEIGHTS, NULL));
    /* delayed: + 40 amax histories of (1024 + 1) x 3 fp32 = 12,300 B each */
    CHECK_EQ_U64(9082044736ull + 492000ull, stage0(llama70b(MODEL_FP8_DELAYED, 1), MODEL_WEIGHTS, NULL));
    /* blockwise: 128 x 128 blocks, 52,224 B of scales per layer and direction */
    CHECK_EQ_U64(9083088896ull, stage0(llama70b(MODEL_FP8_BLOCKWISE, 1), MODEL_WEIGHTS, NULL));
    /* MXFP8: both directions always, one E8M0 byte per 32 */
    CHECK_EQ_U64(9215737856ull, stage0(llama70b(MODEL_FP8_MXFP8, 0), MODEL_WEIGHTS, NULL));
    /* FP8 parameters: the linear weights one byte (+ scales), the norms and embedding bf16, the
     * transposed copies as before */
    ModelSpec pg = llama70b(MODEL_FP8_TENSORWISE, 1);
    pg.job.fp8_param_gather = 1;
    pg.layout.zero = 1;
    CHECK_EQ_U64(4803854656ull, stage0(pg, MODEL_WEIGHTS, NULL));
    /* gradients, master and optimizer state do not change */
    CHECK_EQ_U64(stage0(llama70b(MODEL_FP8_NONE, -1), MODEL_MASTER, NULL),
                 stage0(llama70b(MODEL_FP8_MXFP8, 0), MODEL_MASTER, NULL));
}

static void test_devices(void)
{
    PxError err = {0};
    ProfCluster a100, h100, b200;
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, &a100, &err), err);
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &h100, &err), err);
    CHECK_OK(prof_cluster_load("dgx-b200", NULL, 0, &b200, &err), err);
    ModelJob j;
    ModelSpec s;
    model_spec_defaults(&s);
    j = s.job;
    j.fp8 = MODEL_FP8_TENSORWISE;
    CHECK_INPUT_ERROR(sim_resolve_job(&j, &a100.device, &err), err, "has no FP8 tensor cores");
    CHECK_OK(sim_resolve_job(&j, &h100.device, &err), err);
    CHECK_EQ_INT(1, j.fp8_transpose);
    CHECK_EQ_INT(PX_BF16, j.precision);
    j = s.job;
    j.fp8 = MODEL_FP8_MXFP8;
    CHECK_INPUT_ERROR(sim_resolve_job(&j, &h100.device, &err), err, "has no MXFP8 tensor cores");
    CHECK_OK(sim_resolve_job(&j, &b200.device, &err), err);
    CHECK_EQ_INT(0, j.fp8_transpose);
    /* a job that gives its own choice keeps it */
    j = s.job;
    j.fp8 = MODEL_FP8_DELAYED;
    j.fp8_transpose = 0;
    CHECK_OK(sim_resolve_job(&j, &h100.device, &err), err);
    CHECK_EQ_INT(0, j.fp8_transpose);

    /* an 8192^3 GEMM is compute-bound at both rates: FP8 takes the 16-bit time times the
     * ratio of the rates (peak x large-GEMM efficiency), the shape terms being shared */
    ModelSpec sp = llama70b(MODEL_FP8_TENSORWISE, 1);
    ModelDims d;
    CHECK_OK(model_spec_check(&sp, 64, &d, &err), err);
    SimCtx c;
    sim_ctx_init(&c, &h100, &sp, &d, 8);
    const ModelGemm g = {8192, 8192, 8192, 1};
    const ProfDevice *dv = &h100.device;
    const double t16 = sim_gemm_seconds_as(&c, &g, 0, NULL), t8 = sim_gemm_seconds_as(&c, &g, 1, NULL);
    CHECK_REL(t16 * (dv->peak_bf16 * dv->matmul_eff) / (dv->peak_fp8 * dv->eff_matmul_fp8), t8, 1e-12);
    CHECK(t8 < t16);
    prof_cluster_free(&a100);
    prof_cluster_free(&h100);
    prof_cluster_free(&b200);
}

/* The op graph: layer 0's QKV forward reads X [8192, 8192] in bf16 for its amax (tensorwise:
 * current scaling's amax pass), then again to write it in FP8 twice (row- and column-wise):
 * 8192 x 8192 x (2 + 2 + 2) B; its backward quantizes dY [8192, 2560] likewise. Delayed
 * scaling has no amax pass: 8192 x 8192 x (2 + 2) B. With FP8 parameters and ZeRO-1 a layer block's all-gather moves its linear
 * weights in one byte and its 16,384 norm weights in two. */
static void test_ops(void)
{
    PxError err = {0};
    ModelSpec s = llama70b(MODEL_FP8_TENSORWISE, 1);
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    int seen = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->layer != 0 || op->role != MODEL_OPR_QKV || op->kind != MODEL_OP_MATMUL)
            continue;
        CHECK_EQ_INT(1, op->fp8);
        if (op->phase == MODEL_FWD)
            CHECK_REL(8192.0 * 8192 * 6, op->fp8_cast_bytes, 1e-15);
        if (op->phase == MODEL_BWD)
            CHECK_REL(8192.0 * 2560 * 6, op->fp8_cast_bytes, 1e-15);
        seen++;
    }
    CHECK_EQ_INT(2, seen);
    model_ops_free(&g);
    s = llama70b(MODEL_FP8_DELAYED, 1);
    CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    seen = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->layer != 0 || op->role != MODEL_OPR_QKV || op->kind != MODEL_OP_MATMUL)
            continue;
        CHECK_REL((op->phase == MODEL_BWD ? 8192.0 * 2560 : 8192.0 * 8192) * 4, op->fp8_cast_bytes,
                  1e-15);
        seen++;
    }
    CHECK_EQ_INT(2, seen);
    for (int i = 0; i < g.count; i++)
        if (g.op[i].role == MODEL_OPR_CORE || g.op[i].role == MODEL_OPR_LOGITS)
            CHECK_EQ_INT(0, g.op[i].fp8);
    model_ops_free(&g);

    s = llama70b(MODEL_FP8_TENSORWISE, 1);
    s.layout.pp = 4;
    s.layout.vpp = 1;
    s.layout.schedule = MODEL_SCHED_1F1B;
    s.layout.zero = 1;
    s.job.fp8_param_gather = 1;
    CHECK_OK(model_spec_check(&s, 32, &d, &err), err); /* dp 2 */
    CHECK_OK(model_ops_build(&s, &d, 1, &g, &err), err);
    seen = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->comm == MODEL_DP_ALL_GATHER && op->kind == MODEL_OP_COMM && op->layer == 20) {
            CHECK_EQ_U64(213909504ull + 2 * 16384ull, op->comm_bytes);
            seen++;
        }
    }
    CHECK_EQ_INT(1, seen);
    model_ops_free(&g);

    /* ZeRO-3 keeps no FP8 copies: each use casts the gathered QKV weight, 2560 x 8192 read in
     * bf16 and written in FP8 (3 B an element), in the forward and in the backward, beside the
     * input's and the gradient's quantization above; the optimizer step casts nothing */
    s = llama70b(MODEL_FP8_TENSORWISE, 1);
    s.layout.zero = 3;
    s.layout.pp = s.layout.vpp = 1; /* ZeRO-3 takes no pipeline: tp 4 x dp 16 */
    s.layout.schedule = MODEL_SCHED_1F1B;
    CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    seen = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind == MODEL_OP_OPTIMIZER)
            CHECK(op->fp8_cast_bytes == 0);
        if (op->layer != 0 || op->role != MODEL_OPR_QKV || op->kind != MODEL_OP_MATMUL)
            continue;
        const double w = 2560.0 * 8192 * 3;
        CHECK_REL((op->phase == MODEL_BWD ? 8192.0 * 2560 * 6 : 8192.0 * 8192 * 6) + w,
                  op->fp8_cast_bytes, 1e-15);
        seen++;
    }
    CHECK_EQ_INT(2, seen);
    model_ops_free(&g);
}

/* torchtitan's op-level selective recompute with FP8 GEMMs (docs/time.md, "Frameworks"): a
 * rerun matmul quantizes its input again as the forward does, and an input the table keeps as
 * an FP8 copy but does not save is quantized again beside the recomputed op that makes it when
 * no rerun matmul does: Llama 3 70B, tp 4 with SP (M = 8192 rows, 2048 a shard), tensorwise
 * with transposed copies (bf16 read, 2 FP8 writes: 4 bytes an element). SwiGLU: w3 reruns and
 * quantizes mlp.fc1.in (8192 x 8192 x 4), w2 does not, so the activation's op quantizes
 * mlp.fc2.in (8192 x 7168 x 4 = 234881024). GELU: fc1 is not rerun, so the second norm's op
 * quantizes mlp.fc1.in (2048 x 8192 x 4 = 67108864) and fc2, rerun, mlp.fc2.in. wo reruns:
 * tensorwise it quantizes its saved bf16 input again (8192 x 2048 x 4 = 67108864); delayed
 * (with FlashAttention the input saved beside its FP8 copy, model_fp8_proj_in) it reads the
 * saved copy, quantizing nothing. ws.fp8's copies hold the rows of a weight that wk (1024 x
 * 8192) and w3 (7168 x 8192) read as operands of their own: at sequence 1024 w3's, with its
 * one fp32 scale 58720260 bytes, outgrow the largest activation operand (1024 x 14336, 14680068
 * bytes with its scale). */
static void test_sac_op(void)
{
    PxError err = {0};
    for (int gelu = 0; gelu <= 2; gelu++) {
        ModelSpec s = llama70b(gelu == 2 ? MODEL_FP8_DELAYED : MODEL_FP8_TENSORWISE, 1);
        s.layout.sp = 1;
        s.job.framework = MODEL_FW_TORCHTITAN;
        s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
        if (gelu == 1)
            s.model.mlp = MODEL_GELU;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 32, &d, &err), err);
        ModelOpGraph g;
        CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
        double ln2 = -1, act = -1, fc1 = 0, fc2 = 0, proj = -1;
        for (int i = 0; i < g.count; i++) {
            const ModelOp *op = &g.op[i];
            if (op->layer != 0 || op->phase != MODEL_RECOMPUTE)
                continue;
            if (op->role == MODEL_OPR_LN2)
                ln2 = op->fp8_cast_bytes;
            if (op->role == MODEL_OPR_ACT)
                act = op->fp8_cast_bytes;
            if (op->role == MODEL_OPR_FC1)
                fc1 = op->fp8_cast_bytes;
            if (op->role == MODEL_OPR_FC2)
                fc2 = op->fp8_cast_bytes;
            if (op->role == MODEL_OPR_PROJ)
                proj = op->fp8_cast_bytes;
        }
        /* tensorwise (gelu 0, 1) reads each tensor once more for its amax: 6 bytes an element */
        const double q = gelu == 2 ? 4.0 : 6.0;
        CHECK_REL(gelu == 1 ? 67108864.0 / 4 * q : 0.0, ln2, 1e-15);
        CHECK_REL(gelu == 1 ? 0.0 : 234881024.0 / 4 * q, act, 1e-15);
        CHECK_REL(gelu == 1 ? 0.0 : 8192.0 * 8192 * q, fc1, 1e-15);
        CHECK_REL(gelu == 1 ? 8192.0 * 7168 * q : 0.0, fc2, 1e-15);
        CHECK_REL(gelu == 2 ? 0.0 : 67108864.0 / 4 * q, proj, 1e-15);
        model_ops_free(&g);
    }
    ModelSpec s = llama70b(MODEL_FP8_TENSORWISE, 1);
    s.layout.sp = 1;
    s.job.framework = MODEL_FW_TORCHTITAN;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    s.job.seq_len = 1024;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 32, &d, &err), err);
    ModelFp8Workspace ws;
    model_fp8_workspace(&s, &d, &ws);
    CHECK_EQ_U64(58720260ull, ws.q_bytes);
}

/* FP8 dispatch: the forward's all-to-all carries the routed rows in one byte with the
 * recipe's 1 x 128 fp32 scales; the backward's stays bf16. tiny-moe on 4 ranks with ep 4. */
static void test_dispatch(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny-moe", &s.model, &err), err);
    s.layout.ep = 4;
    s.job.global_batch = 4;
    s.job.precision = PX_BF16;
    s.job.fp8 = MODEL_FP8_BLOCKWISE;
    s.job.fp8_transpose = 1;
    s.job.fp8_dispatch = 1;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    const int64_t rows = d.routed / d.etp, h = d.h;
    int fwd = 0, bwd = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind != MODEL_OP_COMM || op->comm != MODEL_EP_ALL_TO_ALL)
            continue;
        if (op->phase == MODEL_FWD && op->role == MODEL_OPR_DISPATCH) {
            CHECK_EQ_U64((uint64_t)(rows * h + rows * ((h + 127) / 128) * 4), op->comm_bytes);
            fwd++;
        } else if (op->phase == MODEL_BWD) {
            CHECK_EQ_U64((uint64_t)(rows * h * 2), op->comm_bytes);
            bwd++;
        }
    }
    CHECK(fwd > 0 && bwd == 2 * fwd);
    model_ops_free(&g);
    /* a per-tensor scale (tensorwise): each rank's one fp32 scale goes to each of its 4 peers
     * with its rows (it was counted once, 12 bytes short of what the executor sends) */
    s.job.fp8 = MODEL_FP8_TENSORWISE;
    CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    fwd = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind == MODEL_OP_COMM && op->comm == MODEL_EP_ALL_TO_ALL &&
            op->phase == MODEL_FWD && op->role == MODEL_OPR_DISPATCH) {
            CHECK_EQ_U64((uint64_t)(rows * h + 4 * 4), op->comm_bytes);
            fwd++;
        }
    }
    CHECK(fwd > 0);
    model_ops_free(&g);
}

/* ZeRO-3 gathering FP8 weights with a per-tensor scale: each step's amax all-reduce, a call a
 * group. tiny-moe on dp 4 with ep 2: the dense blocks' 16 FP8 matrices (QKV and projection of
 * 4 layers, the dense layer's fc1 and fc2, the shared expert's of the 3 MoE layers) over dp 4;
 * the experts' 24 (fc1 and fc2 of 4 local experts in 3 layers) over edp 2, whose ranks hold
 * the same experts (one call of 160 bytes over dp 4 before, mixing the ep ranks' experts). */
static void test_amax_groups(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny-moe", &s.model, &err), err);
    s.layout.dp = 4;
    s.layout.ep = 2;
    s.layout.zero = 3;
    s.job.global_batch = 8;
    s.job.precision = PX_BF16;
    s.job.fp8 = MODEL_FP8_TENSORWISE;
    s.job.fp8_param_gather = 1;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
    CHECK_EQ_INT(2, d.edp);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    int dense = 0, experts = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind != MODEL_OP_COMM || op->phase != MODEL_STEP)
            continue;
        if (op->comm == MODEL_DP_ALLREDUCE) {
            CHECK_EQ_U64(64, op->comm_bytes);
            CHECK_EQ_INT(4, op->group_size);
            dense++;
        } else if (op->comm == MODEL_EDP_ALLREDUCE) {
            CHECK_EQ_U64(96, op->comm_bytes);
            CHECK_EQ_INT(2, op->group_size);
            experts++;
        }
    }
    CHECK_EQ_INT(1, dense);
    CHECK_EQ_INT(1, experts);
    model_ops_free(&g);
}

/* --fp8-param-gather with MXFP8 below ZeRO-3 (Megatron-LM's distributed optimizer gathers the
 * updated weights in bf16 into the gradient buffer and each rank quantizes them). Llama 3 70B,
 * tp 4, pp 4, dp 2, ZeRO-1, stage 1 (layers 20 to 39): layer 20's gather carries its
 * 213,909,504 FP8 GEMM elements and its two norms' 2 x 8192 in 2 bytes each, 427,851,776
 * (tensorwise: 213,909,504 + 2 x 16,384), and no amax all-reduce; the step's casts read the
 * 20 layers' 4,278,190,080 FP8 elements in bf16 and write the row-wise and column-wise copies:
 * 4 bytes an element, 17,112,760,320 (as without the flag). ZeRO-2 is refused: no whole
 * gradient buffer to land the gather in. */
static void test_mxfp8_gather(void)
{
    PxError err = {0};
    ModelSpec s = llama70b(MODEL_FP8_MXFP8, -1);
    s.layout.pp = 4;
    s.layout.vpp = 1;
    s.layout.schedule = MODEL_SCHED_1F1B;
    s.layout.zero = 1;
    s.job.fp8_param_gather = 1;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 32, &d, &err), err); /* dp 2 */
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 1, &g, &err), err);
    int gathers = 0, amax = 0, optim = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind == MODEL_OP_COMM && op->comm == MODEL_DP_ALL_GATHER && op->layer == 20) {
            CHECK_EQ_U64(427851776ull, op->comm_bytes);
            CHECK_EQ_INT(1, op->calls);
            gathers++;
        }
        if (op->kind == MODEL_OP_COMM && op->comm == MODEL_DP_ALLREDUCE && op->phase == MODEL_STEP)
            amax++;
        if (op->kind == MODEL_OP_OPTIMIZER) {
            CHECK_REL(17112760320.0, op->fp8_cast_bytes, 1e-15);
            optim++;
        }
    }
    CHECK_EQ_INT(1, gathers);
    CHECK_EQ_INT(0, amax);
    CHECK_EQ_INT(1, optim);
    model_ops_free(&g);
    s.layout.zero = 2;
    CHECK_EQ_INT(PX_EINPUT, model_spec_check(&s, 32, &d, &err));
    CHECK(strstr(err.msg, "fp8_param_gather with MXFP8 gathers the updated weights in their own "
                          "dtype into the whole gradient buffer") != NULL);
}

/* tiny on dp 2 under FSDP (ZeRO-3), global batch 8, FP8 parameters gathered under `recipe`
 * in `precision`. */
static void tiny_fsdp_fp8pg(ModelSpec *s, PxDtype precision, ModelFp8Recipe recipe)
{
    PxError err = {0};
    model_spec_defaults(s);
    CHECK_OK(model_config_load("tiny", &s->model, &err), err);
    s->layout.dp = 2;
    s->layout.zero = 3;
    s->layout.fsdp = 1;
    s->job.global_batch = 8;
    s->job.precision = precision;
    s->job.fp8 = recipe;
    s->job.fp8_param_gather = 1;
}

/* MXFP8 parameters under ZeRO-3, as Megatron-FSDP runs them (docs/fp8.md, "MXFP8 parameters
 * under ZeRO-3"). tiny in bf16 on dp 2 (--fsdp): a layer holds 49,152 FP8 GEMM elements (QKV
 * 192 x 64, projection 64 x 64, fc1 256 x 64, fc2 64 x 256) and 832 others. A forward gather
 * moves the row-wise copy, 832 x 2 + 49,152 = 50,816 bytes, a backward gather the column-wise
 * one, as many; under full recompute FSDP's one backward gather serves the recomputed forward
 * and the backward: both copies, 832 x 2 + 2 x 49,152 = 99,968. Each step all-reduces the
 * blocks' amaxes of both copies in fp32: a layer's 1,536 row-wise blocks (192 x 2 + 64 x 2 +
 * 256 x 2 + 64 x 8) and 1,536 column-wise (6 x 64 + 2 x 64 + 8 x 64 + 2 x 256), 4 layers x
 * 3,072 x 4 = 49,152 bytes; every rank keeps those scales, one byte each: 12,288 bytes of
 * weights; the update's cast reads each rank's 98,304 FP8 shard elements twice in fp32 and
 * writes both copies: 983,040 bytes. No GEMM casts a weight (ws.fp8 holds no weight room).
 * With --no-reshard-after-forward the forward's gather carries both copies (99,968), and so
 * does a pipeline's once-a-step gather. */
static void test_mxfp8_zero3(void)
{
    PxError err = {0};
    ModelSpec s;
    tiny_fsdp_fp8pg(&s, PX_BF16, MODEL_FP8_MXFP8);
    for (int full = 0; full < 2; full++) {
        s.layout.recompute = full ? MODEL_RECOMPUTE_FULL : MODEL_RECOMPUTE_NONE;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        ModelOpGraph g;
        CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
        int fwd = 0, bwd = 0, amax = 0, optim = 0;
        for (int i = 0; i < g.count; i++) {
            const ModelOp *op = &g.op[i];
            if (op->kind == MODEL_OP_OPTIMIZER) {
                CHECK_REL(983040.0, op->fp8_cast_bytes, 1e-15);
                optim++;
            }
            if (op->kind != MODEL_OP_COMM)
                continue;
            if (op->comm == MODEL_DP_ALLREDUCE && op->phase == MODEL_STEP) {
                CHECK_EQ_U64(49152, op->comm_bytes);
                amax++;
            }
            if (op->comm != MODEL_DP_ALL_GATHER || strncmp(op->name, "layer.0.", 8))
                continue;
            if (op->phase == MODEL_FWD) {
                CHECK_EQ_U64(50816, op->comm_bytes);
                fwd++;
            } else if (op->phase == MODEL_BWD) {
                CHECK_EQ_U64(full ? 99968 : 50816, op->comm_bytes);
                bwd++;
            }
        }
        CHECK_EQ_INT(1, fwd);
        CHECK_EQ_INT(1, bwd);
        CHECK_EQ_INT(1, amax);
        CHECK_EQ_INT(1, optim);
        model_ops_free(&g);
        ModelTensorTable tt;
        CHECK_OK(model_tensors_build(&s, &d, 0, &tt, &err), err);
        uint64_t scales = 0;
        for (int i = 0; i < tt.count; i++)
            if (tt.t[i].role == MODEL_TR_FP8_MX_SCALES)
                scales += tt.t[i].bytes * (uint64_t)tt.t[i].repeat;
        CHECK_EQ_U64(12288, scales);
        model_tensors_free(&tt);
        /* the GEMMs read the gathered copies: ws.fp8 keeps no room for a weight's cast */
        ModelFp8Workspace w;
        model_fp8_workspace(&s, &d, &w);
        CHECK_EQ_U64(0, w.w_bytes);
        CHECK_EQ_U64(0, w.wt_bytes);
    }
    /* one gather serving a forward and a backward carries both copies: the forward's kept for
     * the backward (no backward gather), and under a pipeline the step's (pp 2: layer 0 on
     * stage 0) */
    s.layout.recompute = MODEL_RECOMPUTE_NONE;
    for (int pp = 1; pp <= 2; pp++) {
        s.layout.keep_gathered = pp == 1;
        s.layout.pp = pp;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 2 * pp, &d, &err), err);
        ModelOpGraph g;
        CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
        int both = 0, other = 0;
        for (int i = 0; i < g.count; i++) {
            const ModelOp *op = &g.op[i];
            if (op->kind != MODEL_OP_COMM || op->comm != MODEL_DP_ALL_GATHER ||
                strncmp(op->name, "layer.0.", 8))
                continue;
            if (op->phase == (pp == 1 ? MODEL_FWD : MODEL_STEP) && op->comm_bytes == 99968)
                both++;
            else
                other++;
        }
        CHECK_EQ_INT(1, both);
        CHECK_EQ_INT(0, other);
        model_ops_free(&g);
    }
}

/* ZeRO-3's FP8 gather in buckets: the block's wire image (the ranks' parts, act and FP8 bytes)
 * cut into calls of equal bytes, the last padded. tiny in fp32 on dp 2 with 30 kB buckets: the
 * embedding's 20,480 elements (no FP8 weight: 81,920 bytes) in 3 calls of 27,307 (each rank's
 * pieces of 3414 elements gave 27,312 before), gathered twice in the forward (the tied output
 * layer's too); a layer's 52,480 bytes (its 4 FP8 weights' 49,152 elements in a byte, its 832
 * others in 4) in 2 of 26,240. */
static void test_bucketed_gather(void)
{
    PxError err = {0};
    ModelSpec s;
    tiny_fsdp_fp8pg(&s, PX_FP32, MODEL_FP8_TENSORWISE);
    s.layout.bucket_bytes = 30000;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    int embed = 0, layer = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind != MODEL_OP_COMM || op->comm != MODEL_DP_ALL_GATHER || op->phase != MODEL_FWD)
            continue;
        if (!strncmp(op->name, "embed.", 6)) {
            CHECK_EQ_U64(27307, op->comm_bytes);
            CHECK_EQ_INT(3, op->calls);
            embed++;
        } else if (!strncmp(op->name, "layer.0.", 8)) {
            CHECK_EQ_U64(26240, op->comm_bytes);
            CHECK_EQ_INT(2, op->calls);
            layer++;
        }
    }
    CHECK_EQ_INT(2, embed);
    CHECK_EQ_INT(1, layer);
    model_ops_free(&g);
}

/* FP8 against bf16 on the same layout: faster, by less than the peaks' ratio; the linear
 * layers' ops account for the gain; stage 0's weights grow by the FP8 and transposed copies. */
static void test_effect(void)
{
    PxError err = {0};
    ProfCluster h100;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &h100, &err), err);
    ModelSpec s = llama70b(MODEL_FP8_TENSORWISE, -1);
    SimResult r;
    CHECK_OK(sim_run(&s, &h100, 64, &r, &err), err);
    SimFp8Effect e;
    CHECK_OK(sim_fp8_effect(&r, &e, &err), err);
    CHECK_EQ_INT(1, e.on);
    CHECK(e.step_s < e.base_step_s);
    CHECK(e.base_step_s / e.step_s < 2.0);
    CHECK(e.gemm_s < e.base_gemm_s);
    CHECK(e.cast_s > 0 && e.cast_s < e.gemm_s);
    /* what FP8 leaves alone takes about as long as before (within the pipeline's reshuffle) */
    CHECK_REL(e.base_step_s - e.base_gemm_s, e.step_s - e.gemm_s, 0.05);
    CHECK_EQ_INT(0, e.stage);
    CHECK_EQ_U64(2139095040ull, e.weight_copies);
    CHECK_EQ_U64(2139095040ull, e.transposes);
    CHECK_EQ_U64(9082044736ull, e.mem[MODEL_WEIGHTS]);
    CHECK_EQ_U64(4803854336ull, e.base_mem[MODEL_WEIGHTS]);
    CHECK(e.mem[MODEL_ACTIVATIONS] < e.base_mem[MODEL_ACTIVATIONS]);
    CHECK(e.act_fp8 * 2 > e.act_fp8_as_16 && e.act_fp8 * 2 < e.act_fp8_as_16 + e.act_fp8_as_16 / 1000);
    CHECK_REL(r.mfu * h100.device.peak_bf16 / h100.device.peak_fp8, r.mfu_fp8, 1e-12);
    /* the planner's compact tables and graphs give the same memory and time */
    SimResult cr;
    CHECK_OK(sim_run_ex(&s, &h100, 64, 1, SIM_FULL, &cr, &err), err);
    CHECK_EQ_U64(r.peak_bytes, cr.peak_bytes);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        CHECK_EQ_U64(r.mem[0].cat[c], cr.mem[0].cat[c]);
    CHECK_REL(r.step_s, cr.step_s, 1e-9);
    sim_result_free(&cr);
    ModelSpec dv = s;
    CHECK_OK(model_config_load("deepseek-v3", &dv.model, &err), err);
    dv.layout.tp = 2;
    dv.layout.sp = 1;
    dv.layout.pp = 4;
    dv.layout.vpp = 1;
    dv.layout.schedule = MODEL_SCHED_1F1B;
    dv.layout.n_stage_layers = 0;
    CHECK_OK(model_split_parse("15,16,16,14", "test", &dv.layout, &err), err);
    dv.layout.ep = 8;
    dv.layout.etp = 1;
    dv.layout.recompute = MODEL_RECOMPUTE_FULL;
    dv.job.seq_len = 4096;
    dv.job.fp8 = MODEL_FP8_BLOCKWISE;
    dv.job.fp8_dispatch = 1;
    sim_result_free(&r);
    CHECK_OK(sim_run(&dv, &h100, 64, &r, &err), err);
    CHECK_OK(sim_run_ex(&dv, &h100, 64, 1, SIM_FULL, &cr, &err), err);
    CHECK_EQ_U64(r.peak_bytes, cr.peak_bytes);
    CHECK_REL(r.step_s, cr.step_s, 1e-9);
    sim_result_free(&cr);
    sim_result_free(&r);
    /* without FP8 there is nothing to compare */
    s.job.fp8 = MODEL_FP8_NONE;
    CHECK_OK(sim_run(&s, &h100, 64, &r, &err), err);
    CHECK_OK(sim_fp8_effect(&r, &e, &err), err);
    CHECK_EQ_INT(0, e.on);
    CHECK(r.mfu_fp8 == 0.0);
    sim_result_free(&r);
    prof_cluster_free(&h100);
}

/* Qwen2-MoE's shared-expert gate beside FP8 shared experts: the shared experts' fc2 backward
 * of a MoE layer decodes its saved FP8 input for the gate's backward and quantizes the gated
 * input again for its weight gradient (exec/train/layers.c, fp8_gate_bwd), 2 x M x K x (a + 1)
 * bytes in two kernels beside the output gradient's M x N x (a + 1). tiny-moe, bf16,
 * tensorwise without transposed copies, a micro-batch of 64 tokens: M = 64, N = h = 64, K =
 * shared_ffn = 64; current scaling reads each tensor it quantizes once more for its amax (M x N
 * x a, and M x K x a for the gated input, two kernels each): 20,480 + 24,576 + 8,192 bytes; the
 * dense layer 0's fc2 and the ungated one 12,288 + 8,192. */
static void test_shared_gate(void)
{
    PxError err = {0};
    double cast[2][2] = {{0, 0}, {0, 0}}; /* [gate][layer] */
    int kernels[2] = {0, 0};
    for (int gate = 0; gate < 2; gate++) {
        ModelSpec s;
        model_spec_defaults(&s);
        CHECK_OK(model_config_load("tiny-moe", &s.model, &err), err);
        s.model.moe.shared_gate = gate;
        s.job.seq_len = 64;
        s.job.global_batch = 8;
        s.job.micro_batch = 1;
        s.job.precision = PX_BF16;
        s.job.fp8 = MODEL_FP8_TENSORWISE;
        s.job.fp8_transpose = 0;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        CHECK_EQ_INT(0, d.fp8_wt);
        ModelOpGraph g;
        CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
        for (int i = 0; i < g.count; i++) {
            const ModelOp *op = &g.op[i];
            if (op->layer < 0 || op->layer > 1 || op->role != MODEL_OPR_FC2 ||
                op->kind != MODEL_OP_MATMUL || op->phase != MODEL_BWD)
                continue;
            cast[gate][op->layer] = op->fp8_cast_bytes;
            if (op->layer == 1)
                kernels[gate] = op->kernels;
        }
        model_ops_free(&g);
    }
    CHECK_REL(20480.0, cast[0][0], 1e-15);
    CHECK_REL(20480.0, cast[0][1], 1e-15);
    CHECK_REL(20480.0, cast[1][0], 1e-15);
    CHECK_REL(20480.0 + 24576.0 + 8192.0, cast[1][1], 1e-15);
    CHECK_EQ_INT(kernels[0] + 4, kernels[1]);
}

/* FP8 attention (docs/fp8.md, "FP8 attention"), Llama-3-70B as above, tp 4, fused core: per
 * layer Q, K, V [8192, 2560] are saved in one byte with one fp32 scale (20,971,524 B) instead
 * of bf16 (41,943,040 B): 772,276,236 - 20,971,516 = 751,304,720 B under tensorwise. Under
 * delayed the core's output [8192, 2048] is saved in FP8 too (16,777,220 B instead of
 * 33,554,432) beside the projection's FP8 copy: 789,053,456 - 20,971,516 - 16,777,212 =
 * 751,304,728 B. The core's forward quantizes Q, K, V: 8192 x 2560 x (2 + 1) B (delayed: and
 * decodes the output, + 8192 x 2048 x 3 B); its backward the output gradient, 8192 x 2048 x
 * 3 B. The unfused core saves what it does without FP8 and rounds Q, K, V and dO in place. */
static void test_fp8_attention(void)
{
    uint64_t acts = 0;
    ModelSpec s = llama70b(MODEL_FP8_TENSORWISE, 1);
    s.job.fp8_attention = 1;
    stage0(s, MODEL_WEIGHTS, &acts);
    CHECK_EQ_U64(751304720ull, acts);
    s.job.fp8 = MODEL_FP8_DELAYED;
    stage0(s, MODEL_WEIGHTS, &acts);
    CHECK_EQ_U64(751304728ull, acts);
    s.job.flash_attn = 0;
    ModelSpec ref = s;
    ref.job.fp8_attention = 0;
    uint64_t ref_acts = 0;
    stage0(ref, MODEL_WEIGHTS, &ref_acts);
    stage0(s, MODEL_WEIGHTS, &acts);
    CHECK_EQ_U64(ref_acts, acts);

    const double qkv = 8192.0 * 2560, o = 8192.0 * 2048;
    for (int delayed = 0; delayed < 2; delayed++) {
        PxError err = {0};
        s = llama70b(delayed ? MODEL_FP8_DELAYED : MODEL_FP8_TENSORWISE, 1);
        s.job.fp8_attention = 1;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
        ModelOpGraph g;
        CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
        int seen = 0;
        for (int i = 0; i < g.count; i++) {
            const ModelOp *op = &g.op[i];
            if (op->layer != 0 || op->role != MODEL_OPR_CORE || op->kind != MODEL_OP_ATTENTION)
                continue;
            CHECK_EQ_INT(1, op->fp8);
            if (op->phase == MODEL_FWD)
                CHECK_REL(qkv * 3 + (delayed ? o * 3 : 0), op->fp8_cast_bytes, 1e-15);
            if (op->phase == MODEL_BWD)
                CHECK_REL(o * 3, op->fp8_cast_bytes, 1e-15);
            seen++;
        }
        CHECK_EQ_INT(2, seen);
        model_ops_free(&g);
    }
    /* the unfused core rounds Q, K, V (forward) and dO (backward) in place: read 2, write 1,
     * then read 1, write 2 */
    PxError err = {0};
    s = llama70b(MODEL_FP8_TENSORWISE, 1);
    s.job.fp8_attention = 1;
    s.job.flash_attn = 0;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    int seen = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->layer != 0 || op->role != MODEL_OPR_CORE || op->kind != MODEL_OP_ATTENTION)
            continue;
        CHECK_REL(op->phase == MODEL_BWD ? o * 6 : qkv * 6, op->fp8_cast_bytes, 1e-15);
        seen++;
    }
    CHECK_EQ_INT(2, seen);
    model_ops_free(&g);
}

/* The core's op of layer 0 in the given phase (forward or backward) of s's first stage. */
static ModelOp core_op(const ModelSpec *s0, ModelPhase ph)
{
    PxError err = {0};
    ModelSpec s = *s0;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    ModelOp found = {0};
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->layer == 0 && op->role == MODEL_OPR_CORE && op->kind == MODEL_OP_ATTENTION &&
            op->phase == ph)
            found = *op;
    }
    model_ops_free(&g);
    CHECK(found.kind == MODEL_OP_ATTENTION);
    return found;
}

/* MXFP8 attention (docs/fp8.md, "FP8 attention"), Llama-3-70B as above without transposes:
 * Transformer Engine saves Q, K, V in two copies, row-wise (1 x 32 blocks along head_dim) and
 * column-wise (32 x 1 along the sequence), each 8192 x 2560 B and 8192 x 2560 / 32 = 655,360
 * E8M0 scales: 43,253,760 B a layer instead of the bf16 41,943,040 (+1,310,720: MXFP8
 * attention costs memory). The forward quantizes Q, K, V into both (8192 x 2560 x (2 + 2) B),
 * reading one copy of each in one byte: +3 x 8192 x 2560 B over the 16-bit core; the backward
 * dO into both (8192 x 2048 x 4 B) and reads Q, K and dO in both copies (2 B, as in bf16) and
 * V [8192, 256] in one: + 4 x 8192 x 2048 - 8192 x 256 B. One more kernel each. */
static void test_mxfp8_attention(void)
{
    uint64_t ref_acts = 0, acts = 0;
    ModelSpec s = llama70b(MODEL_FP8_MXFP8, 0);
    stage0(s, MODEL_WEIGHTS, &ref_acts);
    ModelSpec ref = s;
    s.job.fp8_attention = 1;
    stage0(s, MODEL_WEIGHTS, &acts);
    CHECK_EQ_U64(ref_acts + 1310720ull, acts);
    CHECK_EQ_U64(779616256ull, acts); /* 778,305,536 B under MXFP8 GEMMs alone */
    const double qkv = 8192.0 * 2560, o = 8192.0 * 2048, v = 8192.0 * 256;
    const ModelOp f = core_op(&s, MODEL_FWD), f0 = core_op(&ref, MODEL_FWD);
    const ModelOp b = core_op(&s, MODEL_BWD), b0 = core_op(&ref, MODEL_BWD);
    CHECK_EQ_INT(1, f.fp8);
    CHECK_REL(qkv * 4, f.fp8_cast_bytes, 1e-15);
    CHECK_REL(o * 4, b.fp8_cast_bytes, 1e-15);
    CHECK_REL(qkv * 3, f.bytes - f0.bytes, 1e-15);
    CHECK_REL(o * 4 - v, b.bytes - b0.bytes, 1e-15);
    CHECK_EQ_INT(f0.kernels + 1, f.kernels);
    CHECK_EQ_INT(b0.kernels + 1, b.kernels);
}

/* A MoE layer's FP8 experts pad their rows to multiples of 16 and take the padding out again,
 * as Megatron-Core's TEGroupedMLP does with Transformer Engine's Fp8Padding and Fp8Unpadding
 * (model_moe_fp8_pad_bytes): a copy of the R x h rows (read and write, 2 bytes each) with fc1's
 * input and fc2's output, forward and backward, one kernel each. tiny-moe at ep 4 under delayed
 * scaling with transposed copies: R = 128 rows of h = 64 over 2 local experts of expert_ffn 64
 * (fc1 128 wide): fc1's forward casts X (128 x 64 x (2 + 2)) and pads (2 x 128 x 64 x 2), 65,536
 * B; fc2's forward casts its input (128 x 64 x 4) and unpads (32,768), 65,536 B; the backward
 * casts dY (fc2: 128 x 64 x 4, fc1: 128 x 128 x 4) and copies once more: 65,536 and 98,304 B.
 * In bf16 no op pads. */
static void test_expert_padding(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny-moe", &s.model, &err), err);
    s.layout.ep = 4;
    s.job.global_batch = 4;
    s.job.precision = PX_BF16;
    s.job.fp8 = MODEL_FP8_DELAYED;
    s.job.fp8_transpose = 1;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
    CHECK_EQ_U64(128u, (uint64_t)d.routed);
    CHECK_EQ_U64(64u, (uint64_t)d.h);
    CHECK_EQ_INT(2, d.experts_loc);
    CHECK_REL(32768.0, model_moe_fp8_pad_bytes(&s, &d, (double)d.routed), 1e-15);
    ModelOpGraph g;
    CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
    int seen = 0;
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (op->kind != MODEL_OP_MATMUL ||
            (op->role != MODEL_OPR_EXP_FC1 && op->role != MODEL_OPR_EXP_FC2))
            continue;
        const int fc1 = op->role == MODEL_OPR_EXP_FC1, bwd = op->phase == MODEL_BWD;
        const double want = fc1 && bwd ? 98304.0 : 65536.0;
        CHECK_REL(want, op->fp8_cast_bytes, 1e-15);
        /* one launch per expert GEMM, the quantize and the padding copy */
        CHECK_EQ_INT(op->n_gemm * 2 + 1 + 1, op->kernels);
        seen++;
    }
    CHECK_EQ_INT(3 * 4, seen); /* 3 MoE layers, fc1 and fc2, forward and backward */
    model_ops_free(&g);
    s.job.fp8 = MODEL_FP8_NONE;
    CHECK(model_moe_fp8_pad_bytes(&s, &d, (double)d.routed) == 0.0);
}

int main(void)
{
    px_log_set_quiet(1);
    test_fp8_bytes();
    test_llama70b_memory();
    test_devices();
    test_ops();
    test_sac_op();
    test_dispatch();
    test_expert_padding();
    test_amax_groups();
    test_bucketed_gather();
    test_mxfp8_gather();
    test_mxfp8_zero3();
    test_effect();
    test_shared_gate();
    test_fp8_attention();
    test_mxfp8_attention();
    TEST_DONE("sim_fp8");
}
