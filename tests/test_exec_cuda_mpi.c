/* The executor's parallel layouts on the CUDA backend in bf16 (and one in fp32), end to end
 * through mpirun, against a single-rank run of the same job on the same backend (the fp32
 * layout: on the CPU, the fp32 reference). Built twice:
 * - test_exec_cuda_mpi_emu_<layout> (label mpi): parallax-worker-emu, the CUDA sources on the
 *   CPU, two ranks sharing the one emulated GPU, so the communication goes over MPI staged
 *   through host memory (exec/comm/staged.c), with 16-bit reductions of the activations;
 * - test_exec_cuda_mpi_<layout> (label gpu; exit 77 without a GPU): parallax-worker on the
 *   machine's GPUs: NCCL when every rank has its own GPU, else the staged layer.
 * For every layout:
 * - the losses of every step equal the single-rank run's within 2.5e-4 relative (u/16 of bf16:
 *   the layouts sum the same values in other orders, and under tensor parallelism the partial
 *   activations are reduced in bf16, one more rounding per reduction; measured below 3e-5);
 *   fp32 within 1e-6 of the CPU's fp32 (below);
 * - every rank's memory per category (runtime excepted), communication bytes per kind (at the
 *   bf16 sizes of the activations) and FLOPs equal its stage's prediction exactly;
 * - run.json says which layer carried the communication, and why when it is the fallback.
 * Usage: test_exec_cuda_mpi PARALLAX WORKER LAYOUT (`list` prints the layouts). */
#include <errno.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/test.h"
#include "tests/runs.h"
#include "common/px.h"
#include "kernels/kernels.h"
#include "model/model.h"

typedef struct {
    const char *name;
    int gpus;
    const char *layout; /* the pinned knobs */
    const char *job;    /* settings shared with the single-rank reference */
    /* a second run on the same ranks (NULL: none): the pinned knobs and settings, after job,
     * without the one under test, whose losses the layout's must equal within twin_tol (0: bit
     * for bit) */
    const char *twin;
    double twin_tol;
} Layout;

#define PIN1 "--vpp 1 --schedule 1f1b --mbs 1"
static const Layout layouts[] = {
    {"dp2", 2, "--dp 2 --tp 1 --pp 1 --zero 0 --no-sp " PIN1, "", NULL, 0},
    {"tp2", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --no-sp " PIN1, "--dropout 0.1 --no-flash-attn", NULL, 0},
    {"pp2", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp " PIN1, "", NULL, 0},
    {"pp2_vpp2", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --vpp 2 --schedule interleaved --mbs 1", "", NULL, 0},
    /* uneven virtual stages: the embedding and the loss counted as layers leave the first and
     * the last chunk without one (chunks 0,1,1,1,1,0) */
    {"pp2_vpp3_embed_loss", 2,
     "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --vpp 3 --schedule interleaved --mbs 1 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     "--dropout 0.1", NULL, 0},
    {"dp2_zero1", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, "--recompute selective --no-flash-attn", NULL, 0},
    {"dp2_zero3", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --no-sp " PIN1, "--recompute full", NULL, 0},
    /* 16-bit gradients (Megatron without --accumulate-allreduce-grads-in-fp32): the gradient
     * buffers, ZeRO-1's reduce-scatter and ZeRO-2's bucket and reduce-scatters in bf16, against
     * a single rank's bf16 gradients */
    {"dp2_zero1_grad16", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, "--grad-dtype bf16", NULL, 0},
    {"dp2_zero2_grad16", 2, "--dp 2 --tp 1 --pp 1 --zero 2 --no-sp " PIN1, "--grad-dtype bf16", NULL, 0},
    /* and with the parts whose gradient kernels are their own, against the single rank's 16-bit
     * gradients and (the twin) the same layout with fp32 gradients within the 16-bit gradients'
     * tolerance of test_exec_cuda (1e-3): FP8 GEMMs' weight gradients */
    {"dp2_zero1_fp8_grad16", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1,
     "--precision fp8 --fp8-recipe tensorwise --grad-dtype bf16",
     "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp --grad-dtype fp32 " PIN1, 1e-3},
    /* experts (tokens routed round-robin, so that bf16 picks the experts fp32 does): tiny-moe's
     * grouped GEMMs and router with the experts' gradients reduce-scattered over edp 2;
     * tiny-gpt-oss's over ep 2 with its biases and attention sinks; tiny-dsv3's multi-head
     * latent attention, shared experts and prediction module over tp 2 with SP (the packed sum
     * of the down-projections' and the router's gradients) */
    {"moe_dp2_zero1_grad16", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1,
     "--model tiny-moe --moe-force-balance --grad-dtype bf16",
     "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp --grad-dtype fp32 " PIN1, 1e-3},
    {"gptoss_ep2_grad16", 2, "--dp 2 --ep 2 --tp 1 --pp 1 --zero 0 --no-sp " PIN1,
     "--model tiny-gpt-oss --moe-force-balance --grad-dtype bf16",
     "--dp 2 --ep 2 --tp 1 --pp 1 --zero 0 --no-sp --grad-dtype fp32 " PIN1, 1e-3},
    {"dsv3_tp2_sp_grad16", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--model tiny-dsv3 --moe-force-balance --grad-dtype bf16",
     "--dp 1 --tp 2 --pp 1 --zero 0 --sp --grad-dtype fp32 " PIN1, 1e-3},
    {"tp2_sp", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1, "--dropout 0.1", NULL, 0},
    /* fp32 (no master: the fp32 weights are the parameters; full fp32 GEMMs, no TF32), against
     * the CPU's fp32 on one rank (fp32_reference): SP's all-gathers and reduce-scatters and the
     * TP reductions in fp32, with the dropout stream */
    {"tp2_sp_fp32", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1, "--precision fp32 --dropout 0.1",
     NULL, 0},
    {"tp2_pp2", 4, "--dp 1 --tp 2 --pp 2 --zero 0 --no-sp " PIN1, "--dropout 0.1", NULL, 0},
    {"pp4", 4, "--dp 1 --tp 1 --pp 4 --zero 0 --no-sp " PIN1, "", NULL, 0},
    {"dp2_pp2_zero1", 4, "--dp 2 --tp 1 --pp 2 --zero 1 --no-sp " PIN1, "", NULL, 0},
    /* FSDP under a pipeline: every block gathered once a step and kept (bf16), the gradients
     * reduce-scattered once a step */
    {"dp2_pp2_fsdp", 4, "--dp 2 --tp 1 --pp 2 --zero 3 --fsdp --no-sp " PIN1, "", NULL, 0},
    /* DeepSpeed's ZeRO-3 gathers with two layers prefetched (non-blocking on the NCCL layer's
     * collective stream) and bucketed calls; HSDP 2 x 2 over NCCL */
    {"dp2_zero3_ds_prefetch2_buckets", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp-prefetch 2 --zero-bucket-bytes 20000 --no-sp " PIN1, "--recompute full", NULL, 0},
    {"dp4_hsdp_zero3", 4, "--dp 4 --dp-shard 2 --dp-replicate 2 --tp 1 --pp 1 --zero 3 --no-sp " PIN1, "", NULL, 0},
    /* ZeRO-3 gathering the FP8 weights in FP8 (--fp8-param-gather) on H100 (its TN-only rule:
     * the backward's GEMMs take the gathered weight transposed) */
    {"dp2_zero3_fp8pg", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe tensorwise", NULL, 0},
    /* FP8 attention (docs/fp8.md, "FP8 attention"): bf16 around the FP8 core, tp 2 with SP */
    {"tp2_sp_fp8_attention", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--precision fp8 --fp8-recipe tensorwise --fp8-attention", NULL, 0},
    /* MXFP8 attention on Blackwell (dgx-b200; mxfp8 needs its tensor cores): the device's
     * flash kernels reading the column-wise V (forward), K, Q and dO (backward) beside the
     * row-wise copies; tiny-hd32 (hd32_*: two heads of 32, two layers) at sequence 128, the
     * shapes Transformer Engine asserts, one micro-batch a step (the emulator's time: 6.6 s) */
    {"hd32_tp2_sp_fp8_attention_mxfp8", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200", NULL, 0},
    /* and with multi-head latent attention (tests/data's tiny-dsv3-hd32, mla32_*: its Q, K, V
     * planes, each plane's column-wise copy of its own), by name */
    {"mla32_tp2_sp_fp8_attention_mxfp8", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200", NULL, 0},
    /* in buckets of 20 kB: calls of equal bytes cutting each block's wire image, a rank
     * sending none in a call its part misses (NCCL: a broadcast of no bytes) */
    {"dp2_zero3_fp8pg_buckets", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --zero-bucket-bytes 20000 --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe tensorwise", NULL, 0},
    /* the same under a pipeline: each stage gathered in FP8 once a step, kept across its
     * micro-batches */
    {"dp2_pp2_fsdp_fp8pg", 4, "--dp 2 --tp 1 --pp 2 --zero 3 --fsdp --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe tensorwise", NULL, 0},
    /* below ZeRO-3 (Megatron's distributed optimizer): the FP8 weights are the parameters,
     * quantized from the bf16 values of the updated fp32 master shards (packed in the fp32
     * gradients' place) with the all-reduced amaxes and gathered in FP8 after the step;
     * blockwise (here without transposed copies) all-reduces every tile's
     * amax and quantizes each run of a tile with the scale the cast of the whole bf16 weight
     * takes: bit for bit the losses of the layout without the flag */
    {"dp2_zero1_fp8pg", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe blockwise --set device.fp8_tn_only=0",
     "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, 0},
    /* the same on H100 (TN-only): every rank transposes each gathered FP8 weight, tile by tile
     * with its scale (the kernel's 2D grids: test_kernels_cuda's 130 x 200 against the CPU) */
    {"dp2_zero1_fp8pg_tn", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe blockwise --set device.fp8_tn_only=1",
     "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, 0},
    /* blockwise under ZeRO-3 on H100 (Megatron-FSDP's way: each tile's amax all-reduced, each
     * gather's pieces quantized with their tiles' scales; run by name: the CPU's
     * wide_dp2_zero3_fp8pg_blockwise_tn runs its lines in CI) */
    {"dp2_zero3_fp8pg_blockwise", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe blockwise --set device.fp8_tn_only=1",
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --no-sp " PIN1, 0},
    /* MXFP8 below ZeRO-3 (Megatron's distributed optimizer): the updated shards gathered in
     * bf16 into the fp32 gradients' places and quantized by each rank into both copies, as the
     * cast without the flag quantizes the bf16 weights: bit for bit its losses (the plans'
     * H100 given MXFP8 tensor cores, B200's 4.5e15 dense FP8 FLOP/s, profiles/devices/b200.json) */
    {"dp2_zero1_fp8pg_mxfp8", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --set device.peak_flops.mxfp8=4.5e15", "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, 0},
    /* MXFP8 under ZeRO-3 (Megatron-FSDP): each rank's bf16 shard quantized into the copies
     * its gather carries with the scales of the all-reduced block amaxes (under full
     * recompute the backward's gather carries both), the GEMMs reading them with their
     * scales apart (matmul_fp8_split): the codes the per-use cast makes (its twin within
     * 1e-6: the input gradient's GEMM reads the column-wise copy untransposed) */
    {"dp2_zero3_fsdp_fp8pg_mxfp8", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fp8-param-gather --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --recompute full --set device.peak_flops.mxfp8=4.5e15",
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --no-sp " PIN1, 1e-6},
    /* and with the optimizer offloaded: the host rounds the updated fp32 master to bf16 (to
     * nearest even, as the device's cast), the FP8 pieces' bf16 values are copied up into their
     * gradients' place and quantized there: bit for bit the same layout on the device */
    {"dp2_zero1_fp8pg_offload", 2,
     "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --offload-optimizer --no-sp " PIN1,
     "--precision fp8 --fp8-recipe tensorwise",
     "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1, 0},
    /* context parallelism (tiny-llama: GQA, RoPE): K and V all-gathered; Ulysses' all-to-alls;
     * the ring below */
    {"llama_cp2_allgather", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64", NULL, 0},
    {"llama_cp2_a2a", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64 --no-flash-attn", NULL, 0},
    /* FP8 attention with the all-gather: the fused core's K, V gathered in their one-byte
     * codes with each rank's decode factor, decoded on the device (bf16 around the core; run
     * by name, about 36 s on the emulator over NCCL: 2.5e-4 from one rank over 4 steps) */
    {"llama_cp2_allgather_fp8_attention", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64 --precision fp8 --fp8-recipe tensorwise --fp8-attention", NULL, 0},
    /* MXFP8 attention with the all-gather, the ring and Ulysses (dgx-b200): the exchanges in
     * bf16, the device quantizing this rank's Q, K, V and the gathered K, V (the ring's
     * blocks, Ulysses' head split) into both copies after them, as Transformer Engine does
     * (run by name, 6-16 s each on the emulator over NCCL: 4.5e-5, 4.7e-5 and 1.1e-4 from the
     * CPU's one rank over 4 steps) */
    {"hd32_cp2_allgather_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200",
     NULL, 0},
    {"hd32_cp2_p2p_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200",
     NULL, 0},
    {"hd32_cp2_a2a_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200",
     NULL, 0},
    /* and with multi-head latent attention (tiny-dsv3-hd32): its 16-bit planes saved, packed
     * into the [K | V] rows the all-gather and the ring move, or Ulysses' head split (run by
     * name) */
    {"mla32_cp2_allgather_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200",
     NULL, 0},
    {"mla32_cp2_p2p_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200",
     NULL, 0},
    {"mla32_cp2_a2a_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--precision fp8 --fp8-recipe mxfp8 --fp8-attention --seq 128 --gbs 1 --cluster dgx-b200",
     NULL, 0},
    /* the ring: K, V's codes round it, dK, dV home in one all-to-all (run by name) */
    {"llama_cp2_p2p_fp8_attention", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64 --precision fp8 --fp8-recipe tensorwise --fp8-attention", NULL, 0},
    /* Ulysses: Q, K, V's and dO's codes through the all-to-alls (run by name) */
    {"llama_cp2_a2a_fp8_attention", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64 --precision fp8 --fp8-recipe tensorwise --fp8-attention", NULL, 0},
    /* both under delayed scaling: the ring's dK, dV home in their codes, Ulysses' output and
     * dQ, dK, dV in theirs, each block with its sender's factor (run by name, about 45 s each
     * on the emulator over NCCL: 8.1e-5 and 1.3e-4 from one rank over 4 steps) */
    {"llama_cp2_p2p_fp8_attention_delayed", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64 --precision fp8 --fp8-recipe delayed --fp8-amax-history 16 "
     "--fp8-attention",
     NULL, 0},
    {"llama_cp2_a2a_fp8_attention_delayed", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64 --precision fp8 --fp8-recipe delayed --fp8-amax-history 16 "
     "--fp8-attention",
     NULL, 0},
    /* Ulysses with the fused core: the device's flash kernels over the head split, the saved
     * output moved there beside its gradient (run by name, about 35 s on the emulator: CI runs
     * test_exec_moe_mpi's cuda_dsv3_dense_cp2_a2a_flash, 7 s) */
    {"llama_cp2_a2a_flash", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64", NULL, 0},
    /* dropout with context parallelism: the unfused core's parts drawing their blocks of the
     * one-rank stream (KernAttnFwd.drop_row, drop_head) on the device. Memory, bytes and FLOPs
     * as predicted; the masks themselves are checked where the losses are exact enough to
     * tell (test_exec_mpi's cp dropout layouts, test_kernels_cuda's placed mask): a part
     * drawing the wrong block moves this bf16 run by 6e-5 only, inside the 2.5e-4 */
    {"llama_cp2_allgather_dropout", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64 --no-flash-attn --dropout 0.1", NULL, 0},
    /* the K, V ring: the fused core with a query offset, the merge kernel, the ring's messages */
    {"llama_cp2_p2p", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 64", NULL, 0},
    /* optimizer offload (ZeRO-Offload): the master and AdamW's state in host memory, the
     * reduced gradient shard copied out, the host's step (the device kernel's arithmetic) and
     * the weights rounded to bf16 on the host and copied back: the same losses bit for bit as
     * the layout without offload; with 16-bit gradients (widened on the host) too */
    {"offload", 1, "--dp 1 --tp 1 --pp 1 --zero 1 --offload-optimizer --no-sp " PIN1, "",
     "--dp 1 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, 0},
    {"dp2_zero1_offload", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --offload-optimizer --no-sp " PIN1,
     "--grad-dtype bf16", "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, 0},
    /* adam-8bit (block-wise 8-bit state, Dettmers et al. 2022) on the device: against AdamW
     * on one rank (the first update is AdamW's; measured 1.85e-5 after 4 steps), over
     * ZeRO-2's shards against the single rank's adam-8bit, and offloaded (the host's 8-bit
     * step, the device kernel's codes) against the same layout on the device bit for bit */
    {"adam8", 1, "--dp 1 --tp 1 --pp 1 --zero 0 --no-sp " PIN1, "--optimizer adam-8bit",
     "--dp 1 --tp 1 --pp 1 --zero 0 --no-sp --optimizer adamw " PIN1, 1e-4},
    {"dp2_zero2_adam8", 2, "--dp 2 --tp 1 --pp 1 --zero 2 --no-sp " PIN1, "--optimizer adam-8bit", NULL, 0},
    {"dp2_zero1_offload_adam8", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --offload-optimizer --no-sp " PIN1,
     "--optimizer adam-8bit", "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, 0},
};
enum { N_LAYOUTS = sizeof layouts / sizeof layouts[0], STEPS = 4 };

static const char *px, *worker;

/* The layout's job: a hd32_* layout trains tests/data's tiny-hd32, a mla32_* one its
 * tiny-dsv3-hd32 (the later --model wins). */
static const char *job_of(const Layout *L)
{
    static char job[900];
    const int mla = !strncmp(L->name, "mla32_", 6);
    if (strncmp(L->name, "hd32_", 5) && !mla)
        return L->job;
    snprintf(job, sizeof job, "%s --model %s/tests/data/%s.json", L->job, PX_SOURCE_DIR,
             mla ? "tiny-dsv3-hd32" : "tiny-hd32");
    return job;
}

/* The layout's twin on the same ranks: the losses of every step equal within twin_tol. */
static void check_twin(const Layout *L, const cJSON *run, const char *root)
{
    sh(0, "%s plan --model tiny --cluster dgx-h100 --gpus %d --gbs 8 --seq 16 --steps %d %s %s "
          "-o %s/twin.json", px, L->gpus, STEPS, job_of(L), L->twin, tmp);
    sh(0, "timeout 600 mpirun -n %d %s --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 "
          "%s run %s/twin.json --quiet --backend cuda -o %s/twin.run.json",
       L->gpus, root, worker, tmp, tmp);
    cJSON *twin = read_json("twin.run.json");
    const cJSON *ts = at(twin, "steps", NULL), *ms = at(run, "steps", NULL);
    CHECK_EQ_INT(STEPS, cJSON_GetArraySize(ts));
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        const double a = num(cJSON_GetArrayItem(ts, i), "loss");
        const double b = num(cJSON_GetArrayItem(ms, i), "loss");
        if (L->twin_tol == 0 ? a != b : !(fabs(b - a) <= L->twin_tol * fabs(a))) {
            fprintf(stderr, "FAILED: %s step %d: loss %.17g, its twin's (%s) %.17g: %s\n",
                    L->name, i + 1, b, L->twin, a,
                    L->twin_tol == 0 ? "not equal bit for bit" : "beyond the tolerance");
            exit(1);
        }
        if (fabs(b - a) / fabs(a) > worst)
            worst = fabs(b - a) / fabs(a);
    }
    printf("%-10s twin (%s): final loss %.9f against %.9f, max deviation %.2e (%s %g)\n",
           L->name, L->twin, num(cJSON_GetArrayItem(ms, STEPS - 1), "loss"),
           num(cJSON_GetArrayItem(ts, STEPS - 1), "loss"), worst,
           L->twin_tol == 0 ? "bit for bit:" : "tolerance", L->twin_tol);
    cJSON_Delete(twin);
}

/* An fp32 layout: its single-rank reference is the CPU's fp32 run (the executor's reference
 * backend), not the CUDA backend's own. */
static int fp32_reference(const Layout *L) { return strstr(L->job, "--precision fp32") != NULL; }

static void check_layout(const Layout *L, int gpus)
{
    const char *root = geteuid() == 0 ? "--allow-run-as-root" : "";
    const int fp32 = fp32_reference(L);
    /* the single-rank reference, then the layout */
    sh(0, "%s plan --model tiny --cluster dgx-h100 --gpus 1 --gbs 8 --seq 16 --steps %d %s "
          "-o %s/ref.json", px, STEPS, job_of(L), tmp);
    static const char *const ref_out[] = {"ref.run.json", NULL};
    run_ref("ref.json", ref_out, "%s run %s/ref.json --quiet --backend %s -o %s/ref.run.json",
            worker, tmp, fp32 ? "cpu" : "cuda", tmp);
    sh(0, "%s plan --model tiny --cluster dgx-h100 --gpus %d --gbs 8 --seq 16 --steps %d %s %s "
          "-o %s/plan.json", px, L->gpus, STEPS, L->layout, job_of(L), tmp);
    sh(0, "timeout 600 mpirun -n %d %s --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 "
          "%s run %s/plan.json --quiet --backend cuda -o %s/run.json",
       L->gpus, root, worker, tmp, tmp);
    cJSON *ref = read_json("ref.run.json"), *plan = read_json("plan.json"), *run = read_json("run.json");
    if (L->twin)
        check_twin(L, run, root);

    /* which layers ran it */
    const cJSON *be = at(run, "backend", NULL);
    CHECK(!strncmp(cJSON_GetStringValue(at(be, "compute", NULL)), "cuda", 4));
    CHECK_STR(fp32 ? "fp32" : "bf16", cJSON_GetStringValue(at(be, "precision", NULL)));
    CHECK_EQ_INT(L->gpus, (int)num(be, "world"));
    const char *comm = cJSON_GetStringValue(at(be, "comm", NULL));
    const char *note = cJSON_GetStringValue(at(be, "comm_note", NULL));
    if (gpus >= L->gpus && L->gpus > 1 && strcmp(comm, "nccl") != 0 &&
        !(note && strstr(note, "without NCCL"))) {
        fprintf(stderr, "FAILED: a GPU per rank, but the comm layer is %s (%s)\n", comm,
                note ? note : "no note");
        exit(1);
    }
    if (L->gpus == 1) {
        CHECK_STR("single", comm);
    } else if (strcmp(comm, "nccl") != 0) {
        CHECK_STR("mpi", comm);
        CHECK(note && !strncmp(note, "staged through host memory", 26));
    }

    /* the loss trajectory */
    const cJSON *rs = at(ref, "steps", NULL), *ms = at(run, "steps", NULL);
    CHECK_EQ_INT(STEPS, cJSON_GetArraySize(rs));
    CHECK_EQ_INT(STEPS, cJSON_GetArraySize(ms));
    double worst = 0;
    for (int i = 0; i < STEPS; i++) {
        double a = num(cJSON_GetArrayItem(rs, i), "loss"), b = num(cJSON_GetArrayItem(ms, i), "loss");
        /* FP8 GEMMs: a weight that crosses an FP8 rounding boundary moves by a whole step, as
         * test_exec_mpi's FP8 layouts allow (measured: 2.4e-4 over 4 steps). fp32 against the
         * CPU's fp32 differs only in summation orders (cuBLAS's against OpenBLAS's, the
         * kernels' reductions, the TP reductions): measured 4.1e-9 on the emulator; 1e-6, tighter
         * than the standard's 1e-5, leaves a GPU's own orders (FMA, split-K) 250 times that,
         * and fails a kernel that stores its fp32 output at bf16 precision (2.0e-5) */
        CHECK_REL(a, b, fp32 ? 1e-6 : strstr(L->name, "fp8") ? 1e-3 : 2.5e-4);
        if (fabs(b - a) / fabs(a) > worst)
            worst = fabs(b - a) / fabs(a);
    }

    /* memory, communication and FLOPs of every rank against its stage's prediction */
    const cJSON *pred = at(plan, "prediction", NULL);
    const cJSON *mr = at(run, "memory", "per_rank"), *cr = at(run, "comm", "per_rank");
    const cJSON *fr = at(run, "flops", "per_rank_per_step");
    CHECK_EQ_INT(L->gpus, cJSON_GetArraySize(mr));
    for (int r = 0; r < L->gpus; r++) {
        const cJSON *m = cJSON_GetArrayItem(mr, r), *c = cJSON_GetArrayItem(cr, r);
        const int stage = (int)num(m, "stage");
        const cJSON *pm = stage_entry(at(pred, "memory", "per_stage"), stage);
        for (int k = 0; k < MODEL_RUNTIME; k++) {
            const char *cat = model_category_name((ModelCategory)k);
            if ((uint64_t)num(pm, cat) != (uint64_t)num(m, cat)) {
                fprintf(stderr, "FAILED: %s rank %d (stage %d) %s: predicted %.0f, measured %.0f\n",
                        L->name, r, stage, cat, num(pm, cat), num(m, cat));
                exit(1);
            }
        }
        /* optimizer offload: nothing of the master and the state on the device, and the
         * host's bytes per category equal the plan's host column, a host update every step */
        const cJSON *ph = run_check_host(L->name, r, pm, m, run, STEPS);
        /* (fp32: no master at all, the fp32 weights are the parameters) */
        CHECK(strstr(L->layout, "--offload-optimizer") || fp32 ? num(m, "master") == 0
                                                               : !ph && num(m, "master") > 0);
        CHECK(strstr(L->layout, "--offload-optimizer") ? ph != NULL : ph == NULL);
        if (ph)
            CHECK(num(at(m, "host", NULL), "master") > 0 && num(at(m, "host", NULL), "optimizer") > 0);
        CHECK(num(m, "device_used_peak_bytes") >= num(m, "arena_bytes"));
        const cJSON *pc = stage_entry(at(pred, "comm", "per_stage"), stage);
        const cJSON *by = at(c, "by_kind", NULL);
        for (int k = 0; k < MODEL_COMM_COUNT; k++) {
            const char *kind = model_comm_name((ModelComm)k);
            if ((uint64_t)num(pc, kind) != (uint64_t)num(by, kind)) {
                fprintf(stderr, "FAILED: %s rank %d (stage %d) %s: predicted %.0f bytes, measured %.0f\n",
                        L->name, r, stage, kind, num(pc, kind), num(by, kind));
                exit(1);
            }
        }
        CHECK(L->gpus == 1 ? num(c, "total_bytes") == 0 : num(c, "total_bytes") > 0);
        double pf = cJSON_GetArrayItem(at(pred, "flops", "per_rank_per_step"), stage)->valuedouble;
        CHECK_REL(pf, cJSON_GetArrayItem(fr, r)->valuedouble, 1e-12);
    }
    printf("%-10s %d ranks (%s%s%s), %d steps: final loss %.6f (single rank %.6f), max deviation "
           "%.2e; memory, comm and FLOPs of every rank equal the prediction\n",
           L->name, L->gpus, comm, note ? ", " : "", note ? note : "", STEPS,
           num(cJSON_GetArrayItem(ms, STEPS - 1), "loss"),
           num(cJSON_GetArrayItem(rs, STEPS - 1), "loss"), worst);
    cJSON_Delete(ref);
    cJSON_Delete(plan);
    cJSON_Delete(run);
}

static const char *layout_name(int i) { return layouts[i].name; }

int main(int argc, char **argv)
{
    const int i = run_layout_arg("test_exec_cuda_mpi", argc, argv, N_LAYOUTS, layout_name,
                                 RUN_WORKER_BEFORE, &px, &worker);
    if (i < 0)
        return 0;
    const Layout *L = &layouts[i];
    const int gpus = kern_cuda_device_count();
    if (gpus == 0 || !kern_cuda()) {
        printf("test_exec_cuda_mpi: no CUDA device visible (or parallax was built without CUDA): "
               "skipped\n");
        return 77;
    }
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("test_exec_cuda_mpi: mpirun is not installed: skipped\n");
        return 77;
    }
    char what[96];
    snprintf(what, sizeof what, "cuda-mpi-%s", L->name);
    if (run_scratch(what))
        return 1;
    check_layout(L, gpus);
    run_scratch_remove("test_exec_cuda_mpi");
    TEST_DONE(L->name);
}
