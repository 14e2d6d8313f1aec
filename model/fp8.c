/* FP8 training's rules: how a recipe scales a matrix and what it costs in bytes, and which
 * weights and ops run in FP8 (docs/fp8.md). The recipes' and formats' names are spec.c's. */
#include "model/model.h"

#include <string.h>

void model_fp8_scaling(ModelFp8Recipe r, int weight, int64_t rows, int64_t cols, ModelFp8Scaling *out)
{
    memset(out, 0, sizeof *out);
    switch (r) {
    case MODEL_FP8_BLOCKWISE:
        /* DeepSeek-V3 (2024), Sec. 3.3.2: 128 x 128 blocks of weights, 1 x 128 tiles of
         * activations and gradients */
        out->block_r = weight ? 128 : 1;
        out->block_c = 128;
        break;
    case MODEL_FP8_MXFP8:
        /* OCP Microscaling Formats (MX) v1.0: 32 elements share one E8M0 scale */
        out->block_r = 1;
        out->block_c = 32;
        out->e8m0 = 1;
        break;
    default:
        /* one scale for the whole matrix */
        out->block_r = rows > 0 ? rows : 1;
        out->block_c = cols > 0 ? cols : 1;
        break;
    }
}

uint64_t model_fp8_scale_bytes(ModelFp8Recipe r, int weight, int64_t rows, int64_t cols)
{
    if (r == MODEL_FP8_NONE || rows <= 0 || cols <= 0)
        return 0;
    ModelFp8Scaling sc;
    model_fp8_scaling(r, weight, rows, cols, &sc);
    uint64_t n = px_ceil_div((uint64_t)rows, (uint64_t)sc.block_r) *
                 px_ceil_div((uint64_t)cols, (uint64_t)sc.block_c);
    return n * (sc.e8m0 ? 1u : 4u);
}

uint64_t model_fp8_bytes(ModelFp8Recipe r, int weight, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    return (uint64_t)rows * (uint64_t)cols + model_fp8_scale_bytes(r, weight, rows, cols);
}

uint64_t model_fp8_dispatch_bytes(ModelFp8Recipe r, int64_t rows, int64_t cols, int sources)
{
    if (r != MODEL_FP8_TENSORWISE && r != MODEL_FP8_DELAYED)
        return model_fp8_bytes(r, 0, rows, cols);
    const uint64_t n = rows > 0 && cols > 0 ? (uint64_t)rows * (uint64_t)cols : 0;
    return n + 4u * (uint64_t)(sources > 0 ? sources : 0);
}

int model_fp8_dispatch_history(const ModelSpec *s, const ModelDims *d)
{
    return s->job.fp8 == MODEL_FP8_DELAYED && s->job.fp8_dispatch && d->moe &&
           s->job.moe_dispatcher != MODEL_MOE_DISPATCH_ALLGATHER && d->ep * d->etp > 1;
}

int model_fp8_mx_gather_copies(const ModelSpec *s, const ModelDims *d, ModelPhase phase)
{
    const ModelLayout *l = &s->layout;
    if (!d->fp8 || !s->job.fp8_param_gather || s->job.fp8 != MODEL_FP8_MXFP8 || l->zero != 3)
        return 0;
    switch (phase) {
    case MODEL_FWD: return l->keep_gathered ? 2 : 1;
    case MODEL_BWD: return l->recompute == MODEL_RECOMPUTE_FULL && l->fsdp ? 2 : 1;
    case MODEL_STEP: return 2;
    default: return 1; /* DeepSpeed's gather before the recomputed forward: row-wise */
    }
}

int model_fp8_weight(const ModelSpec *s, ModelTensorRole r)
{
    if (s->job.fp8 == MODEL_FP8_NONE)
        return 0;
    switch (r) {
    case MODEL_TR_QKV_W:
    case MODEL_TR_PROJ_W:
    case MODEL_TR_FC1_W:
    case MODEL_TR_FC2_W:
    case MODEL_TR_EXP_FC1_W:
    case MODEL_TR_EXP_FC2_W:
    case MODEL_TR_Q_A_W:
    case MODEL_TR_Q_B_W:
    case MODEL_TR_KV_A_W:
    case MODEL_TR_KV_B_W:
        return 1;
    default:
        return 0;
    }
}

int model_fp8_op(const ModelSpec *s, ModelOpRole r)
{
    if (s->job.fp8 == MODEL_FP8_NONE)
        return 0;
    switch (r) {
    case MODEL_OPR_QKV:
    case MODEL_OPR_PROJ:
    case MODEL_OPR_FC1:
    case MODEL_OPR_FC2:
    case MODEL_OPR_EXP_FC1:
    case MODEL_OPR_EXP_FC2:
    case MODEL_OPR_Q_A:
    case MODEL_OPR_Q_B:
    case MODEL_OPR_KV_A:
    case MODEL_OPR_KV_B:
        return 1;
    case MODEL_OPR_CORE:
        return s->job.fp8_attention;
    default:
        return 0;
    }
}

ModelFp8ProjIn model_fp8_proj_in(const ModelSpec *s)
{
    if (!model_fp8_op(s, MODEL_OPR_PROJ) || s->job.fp8 != MODEL_FP8_DELAYED)
        return MODEL_FP8_PROJ_ACT;
    /* the unfused core's backward reads its probabilities and V, not its output */
    return s->job.flash_attn ? MODEL_FP8_PROJ_BOTH : MODEL_FP8_PROJ_FP8;
}

int model_fp8_attn_qkv(const ModelSpec *s)
{
    return model_fp8_op(s, MODEL_OPR_CORE) && s->job.flash_attn;
}

int model_fp8_attn_out(const ModelSpec *s)
{
    return model_fp8_attn_qkv(s) && s->job.fp8 == MODEL_FP8_DELAYED;
}

int model_fp8_attn_copies(const ModelSpec *s)
{
    if (!model_fp8_attn_qkv(s))
        return 0;
    return s->job.fp8 == MODEL_FP8_MXFP8 ? 2 : 1;
}

int model_fp8_attn_cp16(const ModelSpec *s)
{
    return model_fp8_attn_copies(s) == 2 && s->layout.cp > 1;
}

int model_fp8_attn_codes(const ModelSpec *s)
{
    return model_fp8_attn_qkv(s) && !model_fp8_attn_cp16(s);
}

int model_fp8_attn_saved(const ModelSpec *s)
{
    return model_fp8_attn_qkv(s) &&
           (!model_fp8_attn_cp16(s) || s->layout.cp_comm == MODEL_CP_COMM_A2A);
}

int model_fp8_attn_dqkv(const ModelSpec *s)
{
    return model_fp8_attn_out(s) && s->layout.cp > 1 &&
           s->layout.cp_comm != MODEL_CP_COMM_ALLGATHER;
}

int model_fp8_attn_history(const ModelSpec *s)
{
    if (s->job.fp8 != MODEL_FP8_DELAYED || !model_fp8_op(s, MODEL_OPR_CORE))
        return 0;
    return 2 + model_fp8_attn_out(s) + model_fp8_attn_dqkv(s);
}

ModelTensorRole model_fp8_attn_weight(const ModelSpec *s)
{
    return s->model.mla.kv_lora_rank > 0 ? MODEL_TR_KV_B_W : MODEL_TR_QKV_W;
}
