/* What the executor runs: one statement, consulted by the executor's own refusal at start
 * (exec/train/trainer.c), by the planner when it plans for this machine (sim/plan.c: a layout
 * the executor would refuse is not ranked) and by `validate`'s choice of layouts, so that the
 * three cannot disagree (docs/executor.md, "What the executor runs"). It lives in model/
 * because the planner may not call into exec/ (tests/arrows.py); it reads the spec and its
 * dims only, so a plan can be judged before any rank starts. What depends on the job as it is
 * started (the world's size, a CUDA device present, the backend's kernels) stays exec's. */
#include <stdio.h>

#include "model/model.h"

/* Context parallelism has no limit of the executor's own: the layout's rules (model/spec.c)
 * have gone first (the sequence in 2 x cp chunks, check_batch; a2a's cp dividing the heads and
 * KV heads per TP rank, check_tensor_split; the ring only with the fused core, check_cp_core),
 * and the ring, the all-gather and Ulysses run at any cp (Ulysses' all-to-all counts are sized
 * by the cp group at init: exec/train/trainer.c); FP8 attention with cp runs too (below). */

/* FP8 has no limit of the executor's own. --fp8-param-gather (exec/train/fp8gather.c): the FP8
 * weights gathered in FP8 with scales every rank computes from all-reduced amaxes: ZeRO-3's gathers of the
 * layers' weights with a per-tensor scale, blockwise's tiles or MXFP8's 1 x 32 and 32 x 1
 * blocks (Megatron-FSDP's: each rank's shard quantized into the copies its gather carries,
 * the row-wise one before a forward and the column-wise one before a backward, both where one
 * gather serves both; the scales never travel) (the experts' over the expert-data-parallel
 * group; in buckets of equal bytes at pp 1; under a pipeline once a step, a call a block
 * whatever the bucket size), and below ZeRO-3 the gather of the updated weights after the
 * step (none without ZeRO), quantized from the updated fp32 master (with --offload-optimizer
 * from the act values the host rounds it to), with a per-tensor scale or blockwise's 128 x 128
 * tiles (a TN-only device's transposed copy made from the FP8 bytes, each tile transposed with
 * its scale); MXFP8's gathered in the act dtype into the gradients' places and quantized by
 * every rank (ZeRO-2 is model/spec.c's rule). Every recipe and ZeRO stage the spec takes
 * runs. */

/* FP8 attention (exec/train/layers.c): Q, K, V, the output gradient and (delayed, the fused
 * core) the output quantized with a per-tensor scale: their own (tensorwise) or their
 * histories' (delayed, model_fp8_attn_history), or under mxfp8 in 1 x 32 and 32 x 1
 * blocks, both copies, each GEMM of the core reading the one blocked along its reduction
 * (model_fp8_attn_copies); the fused core saves the FP8 copies. Blockwise with FP8
 * attention is no job (model/spec.c, check_fp8). MXFP8's second copies reach the core
 * where it reads this rank's Q, K, V itself (layers.c, multi-head latent attention's planes
 * each a copy of its own). With cp, as Transformer Engine runs it (model_fp8_attn_cp16),
 * K and V gathered in the act dtype and the core quantizing this rank's Q, K, V and the
 * gathered K, V into both copies after the gather, the ring's blocks at each step, or
 * Ulysses' head split after its all-to-all (layers.c's fp8_core_cp16, cp.c's
 * ring_mx_block and a2a_qkv): every kind runs, with multi-head latent attention too (its
 * 16-bit planes saved in attn.qkv.out and quantized plane by plane column-wise, their K, V
 * packed into the rows the all-gather and the ring move: mla.c's qkv_out, cp.c's
 * mla_kv_rows; Ulysses' head split packed from the planes). Under the per-tensor recipes
 * the fused core's FP8 with cp runs over the all-gather, the ring and Ulysses under
 * tensorwise and delayed (cp.c; delayed: the output and the Q, K, V gradients in their
 * codes where TE moves them so, model_fp8_attn_dqkv); multi-head latent
 * attention's K, V codes are packed from its planes, as Transformer Engine's CP moves them
 * for unequal head widths (its test_attention_with_cp.py runs its MLA shapes in FP8 over
 * every cp kind), under both recipes over every cp kind (delayed: the output and dQKV codes
 * in MLA's widths, kv_b's histories); the unfused core with cp is no job (model/spec.c,
 * check_cp_core). Nothing of FP8 attention is refused here. */

/* The backends have no limit either: the CPU trains fp32, bf16 and fp16, mixture-of-experts
 * models and FP8 GEMMs included (kern_cpu_with: each kernel widens its act operands to fp32
 * and rounds once on the store, the CUDA backend's contract; the expert permutation and the
 * FP8 entries too, FP8 codes passing as they are); CUDA every precision the spec allows
 * (fp32, bf16, fp16: model/spec.c, check_job), fp32 in full fp32 GEMMs, no TF32, as the
 * simulator prices it (the device's fp32 peak: kernels/cuda/context.cu, docs/gpu.md). */

/* Rotary embeddings with an odd head_dim are not checked here: the model's configuration
 * (model_config_check, which model_spec_check runs first) refuses them for every model. */
int model_exec_refusal(const ModelSpec *s, const ModelDims *d, int gpu, char *why, size_t cap)
{
    /* nothing is refused today (above: context parallelism, FP8, the backends); the spec, its
     * dims and the device stay the arguments a future limit reads */
    (void)s, (void)d, (void)gpu, (void)why, (void)cap;
    return 0;
}
