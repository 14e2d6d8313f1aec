/* What the executor runs: one statement, consulted by the executor's own refusal at start
 * (exec/train/trainer.c), by the planner when it plans for this machine (sim/plan.c: a layout
 * the executor would refuse is not ranked) and by `validate`'s choice of layouts, so that the
 * three cannot disagree (docs/executor.md, "What the executor runs"). It lives in model/
 * because the planner may not call into exec/ (tests/arrows.py); it reads the spec and its
 * dims only, so a plan can be judged before any rank starts. What depends on the job as it is
 * started (the world's size, a CUDA device present, the backend's kernels) stays exec's. */
#include <stdio.h>

#include "model/model.h"

/* Context parallelism's limits. The layout's own rules (model/spec.c) have gone first: the
 * sequence in 2 x cp chunks (check_batch), a2a's cp dividing the heads and KV heads per TP rank
 * (check_tensor_split), the ring only with the fused core (check_cp_core), so the simulator
 * prices none of them and none is the executor's. What stays is the executor's own: Ulysses'
 * cp bounded by the fixed counts of its all-to-all (exec/train/cp.c, EXEC_CP_MAX), a size of
 * arrays, not of the layout, which the simulator prices at any cp (a2a's cp divides the heads
 * per TP rank, so only a model of more than 64 of them meets it); the ring and the all-gather
 * run at any cp. */
const char *model_exec_cp_limit(const ModelSpec *s, const ModelDims *d)
{
    return s->layout.cp_comm == MODEL_CP_COMM_A2A && d->c > MODEL_EXEC_CP_MAX
               ? "a2a's cp must be at most 64"
               : NULL;
}

/* --fp8-param-gather's limits (exec/train/fp8gather.c), or NULL: the FP8 weights gathered in
 * FP8 with scales every rank computes from all-reduced amaxes: ZeRO-3's gathers of the
 * layers' weights with a per-tensor scale (the experts' over the expert-data-parallel group; in
 * buckets of equal bytes at pp 1; under a pipeline once a step, a call a block whatever the
 * bucket size), and below ZeRO-3 the gather of the updated weights after the step (none
 * without ZeRO), quantized from the updated fp32 master, with a per-tensor scale or
 * blockwise's 128 x 128 tiles. */
static const char *fp8_gather_limit(const ModelSpec *s, const ModelDims *d)
{
    const int below = s->layout.zero < 3;
    const ModelFp8Recipe r = s->job.fp8;
    return r == MODEL_FP8_MXFP8
               ? "fp8_param_gather runs with a per-tensor scale (--fp8-recipe tensorwise or "
                 "delayed) or blockwise's tiles, not MXFP8's blocks (its column-wise copy needs "
                 "the weights' own values, which an FP8 gather does not bring)"
           : r == MODEL_FP8_BLOCKWISE && !below
               ? "fp8_param_gather runs with a per-tensor scale (--fp8-recipe tensorwise or "
                 "delayed) under ZeRO-3, whose gathers quantize a weight with one scale; "
                 "blockwise's tiles below it (--zero 0, 1 or 2)"
           : r == MODEL_FP8_BLOCKWISE && d->fp8_wt
               ? "fp8_param_gather with blockwise runs without transposed copies (a TN-only "
                 "device's, fp8_transpose 1: the executor transposes a weight of one scale only)"
           : below && s->layout.offload_optimizer
               ? "below ZeRO-3 fp8_param_gather runs without --offload-optimizer"
               : NULL;
}

/* The FP8 limits, or NULL. */
static const char *fp8_limit(const ModelSpec *s, const ModelDims *d)
{
    const ModelJob *j = &s->job;
    const char *pg = j->fp8_param_gather ? fp8_gather_limit(s, d) : NULL;
    if (pg || !j->fp8_attention)
        return pg;
    /* FP8 attention (exec/train/layers.c): Q, K, V, the output gradient and (delayed, the fused
     * core) the output quantized with a per-tensor scale: their own (tensorwise) or their
     * histories' (delayed, model_fp8_attn_history), or under mxfp8 in 1 x 32 and 32 x 1
     * blocks, both copies, each GEMM of the core reading the one blocked along its reduction
     * (model_fp8_attn_copies); the fused core saves the FP8 copies. Blockwise with FP8
     * attention is no job (model/spec.c, check_fp8). MXFP8's second copies reach the core
     * where it reads this rank's Q, K, V itself (layers.c): not through context parallelism's
     * gathers and exchanges (cp.c), nor multi-head latent attention's layout (mla.c), each
     * refused by name below on its own too, so that lifting those leaves this one */
    const int mx = j->fp8 == MODEL_FP8_MXFP8 && model_fp8_attn_copies(s) == 2;
    return mx && (s->layout.cp > 1 || s->model.mla.kv_lora_rank > 0)
               ? "fp8_attention under mxfp8 runs without context parallelism (--cp 1) and "
                 "multi-head latent attention: their cores do not yet take the column-wise "
                 "copies of Q, K, V and dO"
           : s->layout.cp > 1 ? "fp8_attention runs without context parallelism (--cp 1)"
           : s->model.mla.kv_lora_rank > 0
               ? "fp8_attention runs without multi-head latent attention"
               : NULL;
}

/* What the backend the plan runs on takes (checked last, as the executor picks its kernels
 * after the plan's other settings): the CPU trains fp32, CUDA bf16 or fp16. */
static int device_refusal(const ModelSpec *s, int gpu, char *why, size_t cap)
{
    const PxDtype prec = s->job.precision;
    if (!gpu && prec != PX_FP32)
        snprintf(why, cap,
                 "training.precision %s: the CPU backend trains in fp32 (make the plan with "
                 "--precision fp32)",
                 px_dtype_name(prec));
    else if (gpu && prec != PX_BF16 && prec != PX_FP16)
        snprintf(why, cap,
                 "training.precision %s: the CUDA backend trains in bf16 or fp16 (make the plan "
                 "with --precision bf16, or run an fp32 plan on the CPU with --backend cpu)",
                 px_dtype_name(prec));
    else
        return 0;
    return 1;
}

int model_exec_refusal(const ModelSpec *s, const ModelDims *d, int gpu, char *why, size_t cap)
{
    const ModelConfig *m = &s->model;
    const char *lim;
    if ((lim = model_exec_cp_limit(s, d)))
        snprintf(why, cap,
                 "layout.cp %d (cp_comm_type %s, sequence %d): the executor runs context "
                 "parallelism with limits: %s",
                 d->c, model_cp_comm_name(s->layout.cp_comm), d->s, lim);
    else if (d->fp8 != MODEL_FP8_NONE && (lim = fp8_limit(s, d)))
        snprintf(why, cap, "training.fp8 %s: the executor runs FP8 GEMMs with limits: %s",
                 model_fp8_recipe_name(s->job.fp8), lim);
    else if (m->position == MODEL_POS_ROPE && m->mla.kv_lora_rank <= 0 && m->head_dim % 2 != 0)
        snprintf(why, cap, "rotary embeddings need an even head_dim, got %d", m->head_dim);
    else if (d->v > MODEL_EXEC_MAX_CHUNKS)
        snprintf(why, cap, "layout.vpp %d: at most %d chunks per rank", d->v,
                 MODEL_EXEC_MAX_CHUNKS);
    else
        return device_refusal(s, gpu, why, cap);
    return 1;
}
