/* The executor's parallel layouts over MPI, end to end: a plan from `parallax plan` with the
 * layout's knobs pinned, trained by `parallax run` (mpirun, oversubscribed on small machines),
 * against a single-rank run of the same job:
 * - the loss of every step equals the single-rank one within 1e-5 relative;
 * - every rank's memory per category (runtime excepted: a profile allowance) equals its stage's
 *   predicted bytes, and its communication bytes per kind and FLOPs per step equal the
 *   prediction exactly;
 * - op by op, every rank ran each op of its stage's graph as often as the graph says
 *   (compute and communication alike);
 * - on pipeline layouts every rank idles (the bubble), and the stages idle in the order the
 *   schedule implies: the recorded step's passes replayed with their measured durations
 *   (so that a stage slowed down by something else on the machine is accounted for).
 * Usage: test_exec_mpi PARALLAX LAYOUT (one ctest per layout; `list` prints them). */
#include <errno.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/test.h"
#include "tests/runs.h"
#include "common/px.h"
#include "model/model.h"

typedef struct {
    const char *name;
    int gpus;
    const char *layout; /* the pinned knobs */
    const char *job;    /* settings shared with the single-rank reference */
    int steps;
    int pipeline; /* check the bubble */
    const char *split; /* the plan's layout.stage_layers, for uneven splits */
    double tol; /* the loss against the single rank's, relative; 0: 1e-5 */
} Layout;

#define PIN1 "--vpp 1 --schedule 1f1b --mbs 1"
static const Layout layouts[] = {
    {"dp2", 2, "--dp 2 --tp 1 --pp 1 --zero 0 --no-sp " PIN1, "", 5, 0, NULL, 0},
    {"tp2", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --no-sp " PIN1, "--dropout 0.1 --no-flash-attn", 5, 0, NULL, 0},
    {"pp2_gpipe", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --vpp 1 --schedule gpipe --mbs 1", "", 20, 1, NULL, 0},
    {"pp2_1f1b", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp " PIN1, "", 20, 1, NULL, 0},
    {"pp2_vpp2", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --vpp 2 --schedule interleaved --mbs 1", "",
     20, 1, NULL, 0},
    {"dp2_zero1", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, "--recompute selective --no-flash-attn", 5, 0, NULL, 0},
    {"dp2_zero2", 2, "--dp 2 --tp 1 --pp 1 --zero 2 --no-sp " PIN1, "--dropout 0.1", 5, 0, NULL, 0},
    {"dp2_zero3", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --no-sp " PIN1, "--recompute full", 5, 0, NULL, 0},
    {"tp2_sp", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1, "--dropout 0.1 --no-flash-attn --recompute selective", 5, 0, NULL, 0},
    {"dp2_tp2", 4, "--dp 2 --tp 2 --pp 1 --zero 0 --no-sp " PIN1, "", 5, 0, NULL, 0},
    {"tp2_pp2", 4, "--dp 1 --tp 2 --pp 2 --zero 0 --no-sp " PIN1, "--dropout 0.1", 5, 0, NULL, 0},
    {"dp2_pp2", 4, "--dp 2 --tp 1 --pp 2 --zero 0 --no-sp --vpp 1 --schedule gpipe --mbs 2", "--mbs 2", 5, 0, NULL, 0},
    {"dp2_tp2_pp2_zero1", 8, "--dp 2 --tp 2 --pp 2 --zero 1 --sp " PIN1, "--dropout 0.1 --recompute full", 5, 0, NULL, 0},
    {"dp4_zero3", 4, "--dp 4 --tp 1 --pp 1 --zero 3 --no-sp " PIN1, "", 5, 0, NULL, 0},
    /* uneven splits: the planner's for 3 stages of 4 layers, and one pinned */
    {"pp3_uneven", 3, "--dp 1 --tp 1 --pp 3 --zero 0 --no-sp " PIN1, "", 6, 0, "1,2,1", 0},
    {"pp2_split13", 2, "--dp 1 --tp 1 --pp-layers 1,3 --zero 0 --no-sp " PIN1, "--dropout 0.1", 6, 0, "1,3", 0},
    /* uneven virtual stages (Megatron-Core's forms): the embedding and the loss counted as
     * layers leave the first and the last chunk without one (tiny on pp 2 x vpp 3, tiny-llama
     * on pp 3 x vpp 2 over 6 micro-batches), and a layout string gives chunks of 1, 1, 2 and 0 */
    {"pp2_vpp3_embed_loss", 2,
     "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --vpp 3 --schedule interleaved --mbs 1 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     "--dropout 0.1", 20, 1, "0,1,1,1,1,0", 0},
    {"llama_pp3_vpp2_embed_loss", 3,
     "--dp 1 --tp 1 --pp 3 --zero 0 --no-sp --vpp 2 --schedule interleaved --mbs 1 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     "--model tiny-llama --gbs 6", 6, 0, "0,1,1,1,1,0", 0},
    {"pp2_layout_string", 2,
     "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --schedule interleaved --mbs 1 "
     "--pipeline-model-parallel-layout 'Et|t|t*2|L'",
     "", 6, 0, "1,1,2,0", 0},
    /* the same with tensor and sequence parallelism and dropout (the embedding-only chunk's
     * reduce-scatter and mask), and a stage of the embedding only without interleaving */
    {"tp2_sp_pp2_vpp3_embed_loss", 4,
     "--dp 1 --tp 2 --pp 2 --zero 0 --sp --vpp 3 --schedule interleaved --mbs 1 "
     "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
     "--dropout 0.1 --recompute selective", 5, 0, "0,1,1,1,1,0", 0},
    /* more than 64 chunks a rank (the executor's and the simulator's per-chunk counts were
     * arrays of 64): 130 layers of tiny on pp 2 x vpp 65, a layer a chunk, 2 micro-batches */
    {"pp2_vpp65", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --vpp 65 --schedule interleaved --mbs 1",
     "--gbs 2 --seq 16", 2, 0, NULL, 0},
    {"pp2_embed_stage", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp " PIN1 " --pipeline-model-parallel-layout 'E|t*4L'",
     "--dropout 0.1", 6, 0, "0,4", 0},
    /* FP8 GEMMs (docs/fp8.md): layouts that keep each GEMM whole (dp, pp, ZeRO; ZeRO-3 casts
     * each gathered weight per use) quantize the same micro-batches alike, but their gradients'
     * sums round differently (reduction order), and a weight that moves across an FP8 rounding
     * boundary changes by a whole FP8 step: within 1e-3 of one rank (the single rank takes
     * micro-batches of one sequence too: the scales are per micro-batch). A tensor-parallel
     * shard takes its own scales, and delayed scaling's histories see each rank's micro-batches
     * only: those within 3e-3 */
    {"dp2_zero1_fp8_tensorwise", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1,
     "--fp8-recipe tensorwise --recompute full --mbs 1", 5, 0, NULL, 1e-3},
    {"pp2_vpp2_fp8_blockwise", 2, "--dp 1 --tp 1 --pp 2 --zero 0 --no-sp --vpp 2 --schedule interleaved --mbs 1",
     "--fp8-recipe blockwise --dropout 0.1 --mbs 1", 5, 0, NULL, 1e-3},
    {"tp2_sp_fp8_delayed", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--fp8-recipe delayed --fp8-amax-history 16 --no-flash-attn --recompute selective", 5, 0, NULL, 3e-3},
    /* FP8 attention (docs/fp8.md, "FP8 attention"), tensorwise: the fused core's Q, K, V
     * saved in FP8 with one scale of this rank's heads, the output gradient quantized; tp 2
     * with SP under full recompute (the recomputed forward quantizes again; one rank:
     * test_exec_fp8) */
    {"tp2_sp_fp8_attention_full", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--fp8-recipe tensorwise --fp8-attention --recompute full", 3, 0, NULL, 3e-3},
    /* the unfused core (Q, K, V and dO rounded in place) with dropout and selective
     * recompute, which reruns the core on the rounded Q, K, V */
    {"tp2_fp8_attention_unfused", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --no-sp " PIN1,
     "--fp8-recipe tensorwise --fp8-attention --no-flash-attn --dropout 0.1 --recompute selective",
     3, 0, NULL, 3e-3},
    /* delayed scaling: the core's Q, K, V, output and output gradient quantized with their
     * histories' factors (the QKV weight's <w>.fp8_amax), the fused core's output saved in
     * FP8 (attn.proj.in) beside the projection's own FP8 copy; tp 2 with SP */
    {"tp2_sp_fp8_attention_delayed", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--fp8-recipe delayed --fp8-amax-history 16 --fp8-attention", 3, 0, NULL, 3e-3},
    /* MXFP8 attention: Q, K, V saved in both blockings (1 x 32 along head_dim, 32 x 1 along
     * the sequence) and dO quantized into both, each of the core's GEMMs reading the copy
     * blocked along its reduction; tiny-hd32 (*_hd32_*: two heads of 32, two layers) at
     * sequence 128, the shapes Transformer Engine asserts; tp 2 with SP, one head a rank */
    {"hd32_tp2_sp_fp8_attention_mxfp8", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--seq 128 --fp8-recipe mxfp8 --fp8-attention", 3, 0, NULL, 3e-3},
    {"dp2_zero2_fp8_mxfp8", 2, "--dp 2 --tp 1 --pp 1 --zero 2 --no-sp " PIN1, "--fp8-recipe mxfp8 --mbs 1", 5, 0,
     NULL, 1e-3},
    {"dp2_zero3_fp8_mxfp8", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --no-sp " PIN1,
     "--fp8-recipe mxfp8 --recompute full --mbs 1", 5, 0, NULL, 1e-3},
    /* ZeRO-3 gathering the FP8 weights in FP8 (--fp8-param-gather, exec/train/fp8gather.c),
     * the reference being one rank without it: the FSDP way, DeepSpeed's (a gather for the
     * recomputed forward too) and the gathers kept for the backward. Tensorwise quantizes each
     * shard with its whole weight's scale: the losses of the same layout without the flag, bit
     * for bit (check_cast_twin, on the first). The second on a TN-only device: the backward's
     * GEMMs take the gathered FP8 weight transposed (kernels' fp8_transpose). Delayed scaling records the weight's amax once a step instead
     * of once a forward: within 3e-3 */
    {"dp2_zero3_fp8pg_tensorwise", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe tensorwise --mbs 1", 5, 0, NULL, 1e-3},
    {"dp2_zero3_fp8pg_deepspeed_full", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe tensorwise --recompute full --dropout 0.1 --set device.fp8_tn_only=1", 5, 0, NULL, 1e-3},
    {"dp2_zero3_fp8pg_delayed_keep", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --no-reshard-after-forward --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe delayed --fp8-amax-history 16 --mbs 1", 5, 0, NULL, 3e-3},
    /* in buckets of 30 kB at pp 1: each block's wire image (the ranks' parts, act and FP8
     * bytes) cut into calls of equal bytes, the last padded (model/ops.c's zero_gather_fp8),
     * two layers prefetched; bit for bit against the layout without the flag (check_cast_twin) */
    {"dp2_zero3_fp8pg_tensorwise_buckets", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fsdp-prefetch 2 --zero-bucket-bytes 30000 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe tensorwise --mbs 1", 4, 0, NULL, 1e-3},
    /* the same under a pipeline, whose stage is gathered in FP8 once a step and kept across its
     * micro-batches: tensorwise bit for bit against the layout without the flag
     * (check_cast_twin); delayed with buckets, which do not cut the step's gathers */
    /* blockwise, as Megatron-FSDP runs it: each 128 x 128 tile's amax all-reduced over the
     * ZeRO group once a step (the shard cut splits tiles), each gather's pieces quantized run
     * by run with their tiles' scales, each gathered matrix followed by its tiles' scales; on
     * a TN-only device each use's transposed copy made tile by tile. Tiny at hidden 256
     * (job_of), whose matrices hold up to 6 x 2 tiles: bit for bit against the layout without
     * the flag (check_cast_twin) */
    {"wide_dp2_zero3_fp8pg_blockwise_tn", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe blockwise --mbs 1 --set device.fp8_tn_only=1", 3, 0, NULL, 1e-3},
    {"dp2_pp2_zero3_fp8pg_tensorwise", 4, "--dp 2 --tp 1 --pp 2 --zero 3 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe tensorwise --mbs 1", 5, 0, NULL, 1e-3},
    {"dp2_pp2_zero3_fp8pg_delayed_buckets", 4,
     "--dp 2 --tp 1 --pp 2 --zero 3 --fsdp --zero-bucket-bytes 30000 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe delayed --fp8-amax-history 16 --recompute full --mbs 1", 5, 0, NULL, 3e-3},
    /* below ZeRO-3 (Megatron's distributed optimizer with --fp8-param-gather): the FP8 weights
     * are the parameters, quantized from the fp32 master shards with the weight's all-reduced
     * amax and gathered in FP8 after the update. Tensorwise takes the scale each cast of the
     * whole weight takes: the losses of the layout without the flag, bit for bit
     * (check_cast_twin); delayed records the weight's amax once a step, after the update */
    {"dp2_zero1_fp8pg_tensorwise", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe tensorwise --mbs 1", 3, 0, NULL, 1e-3},
    {"dp2_zero2_fp8pg_delayed", 2, "--dp 2 --tp 1 --pp 1 --zero 2 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe delayed --fp8-amax-history 16 --mbs 1 --set device.fp8_tn_only=1", 3, 0, NULL, 3e-3},
    /* blockwise: the amax of every 128 x 128 tile all-reduced (the shard cut splits tiles: a
     * rank holds part of a tile's rows, or of a row), each tile's scale that of the whole
     * weight's own quantization: bit for bit against the layout without the flag; without
     * ZeRO each rank quantizes its whole weights, nothing moves, here with adam-8bit (whose
     * call spans a block's parameters, only some of which have act weights: bit for bit
     * against the layout without the flag; before optim.c's adam8_fp8_block_acts, 5.5693
     * against 5.5193 at step 2 on one rank) */
    {"dp2_zero1_fp8pg_blockwise", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe blockwise --mbs 1", 3, 0, NULL, 1e-3},
    /* the same on a TN-only device (H100's case), tiny at hidden 256 (job_of): each rank
     * makes the transposed copy of the gathered FP8 weight, every 128 x 128 tile transposed
     * with its scale (kernels' fp8_transpose), the bytes the cast of the transposed weight
     * makes: bit for bit against the layout without the flag */
    {"wide_dp2_zero1_fp8pg_blockwise_tn", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe blockwise --mbs 1 --set device.fp8_tn_only=1", 3, 0, NULL, 1e-3},
    {"dp2_zero0_fp8pg_tensorwise_adam8", 2, "--dp 2 --tp 1 --pp 1 --zero 0 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe tensorwise --optimizer adam-8bit --mbs 1", 3, 0, NULL, 1e-3},
    /* MXFP8 (Megatron's distributed optimizer: an MXFP8 scale is a block's of 32 along each
     * copy's own axis): the updated shards gathered in the act dtype into the gradients'
     * places, each rank quantizing the whole weights into both copies, no amax all-reduce
     * (fp8gather.c's mx_matrix): the same values as the cast without the flag, bit for bit
     * (check_cast_twin); tp 2 with SP, whose row- and column-parallel weights are cut by TP */
    /* MXFP8 under ZeRO-3 (Megatron-FSDP: fp8gather.c's mx_shard_amax): every 1 x 32 and
     * 32 x 1 block's partial amax all-reduced, each rank's shard quantized into the copy its
     * gather carries (row-wise before a forward, column-wise before a backward, both for the
     * backward's gather under full recompute), the GEMMs reading the copies with the scales
     * every rank computed: the codes the per-use cast makes (check_cast_twin: within 1e-6,
     * bit for bit on tiny). Full recompute in the pinned knobs, so that the single-rank
     * reference is dp2_zero1_fp8pg_mxfp8's (the cache's) */
    {"dp2_zero3_fsdp_fp8pg_mxfp8", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fp8-param-gather --recompute full --no-sp " PIN1,
     "--fp8-recipe mxfp8 --mbs 1", 3, 0, NULL, 3e-3},
    /* by name (CI's time): in buckets of 20 kB, the backward's gathers' wire images holding
     * both copies of each rank's part; under a pipeline (dp 2 x pp 2), whose once-a-step
     * gather carries both copies */
    {"dp2_zero3_fp8pg_mxfp8_buckets_full", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --zero-bucket-bytes 20000 --fp8-param-gather "
     "--recompute full --no-sp " PIN1,
     "--fp8-recipe mxfp8 --mbs 1", 3, 0, NULL, 3e-3},
    {"dp2_pp2_zero3_fp8pg_mxfp8", 4, "--dp 2 --tp 1 --pp 2 --zero 3 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe mxfp8 --mbs 1", 3, 0, NULL, 3e-3},
    {"dp2_zero1_fp8pg_mxfp8", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --no-sp " PIN1,
     "--fp8-recipe mxfp8 --mbs 1", 3, 0, NULL, 1e-3},
    {"tp2_sp_dp2_zero1_fp8pg_mxfp8", 4, "--dp 2 --tp 2 --pp 1 --zero 1 --fp8-param-gather --sp " PIN1,
     "--fp8-recipe mxfp8 --mbs 1", 3, 0, NULL, 1e-3},
    /* with the optimizer offloaded: the fp32 master and AdamW's state in host memory, the
     * host's updated master rounded to the act dtype and copied up into the FP8 pieces'
     * gradients' place, quantized there: bit for bit the offloaded layout without the flag
     * (check_cast_twin), host bytes per category as the plan's host column */
    {"dp2_zero1_fp8pg_offload_tensorwise", 2,
     "--dp 2 --tp 1 --pp 1 --zero 1 --fp8-param-gather --offload-optimizer --no-sp " PIN1,
     "--fp8-recipe tensorwise --mbs 1", 3, 0, NULL, 1e-3},
    /* sharded data parallelism (docs/executor.md, "Sharded data parallelism"): DeepSpeed's
     * ZeRO-3 gathers each layer again for its recomputed forward (dp2_zero3 runs --fsdp's one
     * gather); the forward's gathers kept for the backward; two layers prefetched with the
     * gathers and reduce-scatters cut into buckets of 40 kB; HSDP's 2 x 2 with its replicas'
     * all-reduce; the optimizer offloaded to host memory (a cluster that describes the host) */
    {"dp2_zero3_full_deepspeed", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --no-sp " PIN1, "--recompute full", 5, 0, NULL, 0},
    {"dp2_zero3_keep", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --no-reshard-after-forward --no-sp " PIN1, "--dropout 0.1", 5, 0,
     NULL, 0},
    {"dp2_zero3_keep_full", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --no-reshard-after-forward --no-sp " PIN1,
     "--recompute full", 5, 0, NULL, 0},
    {"dp2_zero3_prefetch2_buckets", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fsdp-prefetch 2 --zero-bucket-bytes 40000 --no-sp " PIN1,
     "--recompute selective", 5, 0, NULL, 0},
    {"dp2_zero2_buckets", 2, "--dp 2 --tp 1 --pp 1 --zero 2 --zero-bucket-bytes 30000 --no-sp " PIN1, "", 5, 0, NULL,
     0},
    {"dp4_hsdp_zero3", 4, "--dp 4 --dp-shard 2 --dp-replicate 2 --tp 1 --pp 1 --zero 3 --no-sp " PIN1, "", 5, 0, NULL,
     0},
    /* ZeRO-2/3 under a pipeline as torchtitan runs FSDP2 there (docs/executor.md): gradients
     * reduce-scattered once a step, ZeRO-3's parameters gathered once a step and kept across the
     * stage's micro-batches (with full recompute too: no gather for the recomputed forward);
     * interleaved with --fsdp, a buffer per chunk's block */
    {"dp2_pp2_zero2", 4, "--dp 2 --tp 1 --pp 2 --zero 2 --no-sp " PIN1, "--dropout 0.1", 5, 0, NULL, 0},
    {"dp2_pp2_zero3_full", 4, "--dp 2 --tp 1 --pp 2 --zero 3 --no-sp " PIN1, "--recompute full", 5, 0, NULL, 0},
    {"dp2_pp2_vpp2_fsdp", 4,
     "--dp 2 --tp 1 --pp 2 --zero 3 --fsdp --no-sp --vpp 2 --schedule interleaved --mbs 1", "", 5, 0,
     NULL, 0},
    /* HSDP 2 x 2 under a pipeline: the shards' all-reduce over the replicas once a step as
     * without one; the bucket size does not cut the step's calls (one a block, as priced) */
    {"dp4_hsdp_pp2_zero3_buckets", 8,
     "--dp 4 --dp-shard 2 --dp-replicate 2 --tp 1 --pp 2 --zero 3 --zero-bucket-bytes 30000 --no-sp " PIN1,
     "", 5, 0, NULL, 0},
    {"dp4_hsdp_zero1", 4, "--dp 4 --dp-shard 2 --dp-replicate 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, "", 5, 0, NULL,
     0},
    /* tiny-llama (RoPE, SwiGLU, GQA; the later --model wins): HSDP with DeepSpeed's recompute
     * gathers, two layers prefetched; keep_gathered with buckets; offload with ZeRO-2 */
    {"llama_dp4_hsdp_zero3_full_prefetch2", 4,
     "--dp 4 --dp-shard 2 --dp-replicate 2 --tp 1 --pp 1 --zero 3 --fsdp-prefetch 2 --no-sp " PIN1,
     "--model tiny-llama --recompute full", 5, 0, NULL, 0},
    {"llama_dp2_zero3_keep_buckets", 2,
     "--dp 2 --tp 1 --pp 1 --zero 3 --no-reshard-after-forward --zero-bucket-bytes 30000 --no-sp " PIN1,
     "--model tiny-llama", 5, 0, NULL, 0},
    {"llama_dp2_zero2_offload", 2, "--dp 2 --tp 1 --pp 1 --zero 2 --offload-optimizer --no-sp " PIN1,
     "--model tiny-llama", 5, 0, NULL, 0},
    {"dp2_zero1_offload", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --offload-optimizer --no-sp " PIN1, "", 5, 0, NULL, 0},
    {"dp2_zero3_offload", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --offload-optimizer --no-sp " PIN1,
     "--recompute full", 5, 0, NULL, 0},
    /* torchtitan's op-level selective recompute (docs/executor.md, "Recompute"): tiny-llama
     * (SwiGLU: w3 rerun) with TP and SP (the rerun matmuls read sp.gather), tiny (GELU: fc2
     * rerun) with FSDP and dropout */
    {"llama_tp2_sp_sac", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--model tiny-llama --framework torchtitan --recompute selective", 5, 0, NULL, 0},
    {"dp2_zero3_sac", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --no-sp " PIN1,
     "--framework torchtitan --recompute selective --dropout 0.1", 5, 0, NULL, 0},
    /* and with FP8 GEMMs (by name): the rerun matmuls quantize their inputs into the FP8 copies
     * the backward reads, wk and w3 read their rows of the weight copies; tiny-llama tensorwise
     * (wo's act input quantized again), with TP and SP blockwise (w3's rows start inside a
     * 128-row block), tiny delayed (fc1's input quantized beside the norm, fc2 rerun) */
    {"llama_dp2_sac_fp8_tensorwise", 2, "--dp 2 --tp 1 --pp 1 --zero 0 --no-sp " PIN1,
     "--model tiny-llama --framework torchtitan --recompute selective --fp8-recipe tensorwise --mbs 1",
     3, 0, NULL, 1e-3},
    {"llama_tp2_sp_sac_fp8_blockwise", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp " PIN1,
     "--model tiny-llama --framework torchtitan --recompute selective --fp8-recipe blockwise --mbs 1",
     3, 0, NULL, 1e-3},
    /* by name: ZeRO-3 casting the weight per use and gathering it in FP8 on a TN-only device
     * (wk's and w3's rows copied from the cast or gathered weight), and mxfp8 at sequence 16,
     * where w3's rows outgrow every activation operand of ws.fp8's copies */
    {"llama_dp2_zero3_sac_fp8_tensorwise", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --no-sp " PIN1,
     "--model tiny-llama --framework torchtitan --recompute selective --fp8-recipe tensorwise --mbs 1",
     3, 0, NULL, 1e-3},
    {"llama_dp2_zero3_fp8pg_sac_tn", 2, "--dp 2 --tp 1 --pp 1 --zero 3 --fsdp --fp8-param-gather --no-sp " PIN1,
     "--model tiny-llama --framework torchtitan --recompute selective --fp8-recipe tensorwise --mbs 1 "
     "--set device.fp8_tn_only=1",
     3, 0, NULL, 1e-3},
    {"llama_dp2_sac_fp8_mxfp8_seq16", 2, "--dp 2 --tp 1 --pp 1 --zero 0 --no-sp " PIN1,
     "--model tiny-llama --framework torchtitan --recompute selective --fp8-recipe mxfp8 --mbs 1 --seq 16",
     3, 0, NULL, 1e-3},
    {"dp2_sac_fp8_delayed", 2, "--dp 2 --tp 1 --pp 1 --zero 0 --no-sp " PIN1,
     "--framework torchtitan --recompute selective --fp8-recipe delayed --fp8-amax-history 16 --mbs 1",
     3, 0, NULL, 3e-3},
    /* adam-8bit: its state replicated, and sharded by ZeRO-1 (the shard's quantization blocks
     * start at its own first element, not the single rank's: other absmax values, 6.6e-7 off
     * the single rank after 5 steps), in host memory with the optimizer offloaded */
    {"dp2_adam8", 2, "--dp 2 --tp 1 --pp 1 --zero 0 --no-sp " PIN1, "--optimizer adam-8bit", 5, 0, NULL, 0},
    {"dp2_zero1_adam8", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp " PIN1, "--optimizer adam-8bit", 5, 0, NULL, 0},
    {"dp2_zero1_offload_adam8", 2, "--dp 2 --tp 1 --pp 1 --zero 1 --offload-optimizer --no-sp " PIN1,
     "--optimizer adam-8bit", 5, 0, NULL, 0},
    /* context parallelism (docs/executor.md, "Context parallelism"): tiny-llama (GQA, RoPE) at
     * sequence 256, K and V all-gathered; the fused and the unfused attention, selective and
     * full recompute, combined with TP and SP, the pipeline, and data parallelism with ZeRO-1 */
    {"llama_cp2_allgather", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 5, 0, NULL, 0},
    {"llama_cp2_allgather_selective", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn --recompute selective", 5, 0, NULL, 0},
    {"llama_cp4_allgather", 4, "--dp 1 --tp 1 --pp 1 --cp 4 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 5, 0, NULL, 0},
    {"llama_cp2_tp2_sp_allgather", 4, "--dp 1 --tp 2 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn", 5, 0, NULL, 0},
    {"llama_cp2_pp2_allgather", 4, "--dp 1 --tp 1 --pp 2 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 5, 0, NULL, 0},
    {"llama_cp2_dp2_zero1_allgather", 4,
     "--dp 2 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 1 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --recompute full", 5, 0, NULL, 0},
    /* the K, V ring (the fused core: unfused it is no layout, model/spec.c's check_cp_core) */
    /* GPT-OSS's attention sinks over the ring: in each query's first block only, their
     * gradient once per query part; and over Ulysses' head split, unfused and fused, and the
     * all-gather (those three by hand, not in CI). The sinks start near 0 (normal(0, 0.02)), so a sink counted twice or
     * another head's taken moves the loss by 1e-6 only: the tolerance is 1e-7. */
    {"llama_sinks_cp2_p2p", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 3, 0, NULL, 1e-7},
    {"llama_sinks_cp2_a2a", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn", 3, 0, NULL, 1e-7},
    {"llama_sinks_cp2_a2a_flash", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 3, 0, NULL, 1e-7},
    {"llama_sinks_cp2_allgather", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 3, 0, NULL, 1e-7},
    {"llama_cp2_p2p", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 5, 0, NULL, 0},
    {"llama_cp4_p2p", 4, "--dp 1 --tp 1 --pp 1 --cp 4 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 5, 0, NULL, 0},
    {"llama_cp2_tp2_sp_p2p", 4, "--dp 1 --tp 2 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --sp " PIN1,
     "--model tiny-llama --seq 256", 5, 0, NULL, 0},
    {"llama_cp2_pp2_p2p", 4, "--dp 1 --tp 1 --pp 2 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 5, 0, NULL, 0},
    {"llama_cp2_dp2_zero1_p2p", 4, "--dp 2 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 1 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --recompute full", 5, 0, NULL, 0},
    /* Ulysses' all-to-alls, the unfused core below and the fused one after them */
    {"llama_cp2_a2a", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn", 5, 0, NULL, 0},
    {"llama_cp4_a2a_selective", 4, "--dp 1 --tp 1 --pp 1 --cp 4 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn --recompute selective", 5, 0, NULL, 0},
    {"llama_cp2_tp2_a2a", 4, "--dp 1 --tp 2 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn", 5, 0, NULL, 0},
    {"llama_cp2_pp2_a2a", 4, "--dp 1 --tp 1 --pp 2 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn", 5, 0, NULL, 0},
    {"llama_cp2_dp2_zero1_a2a", 4, "--dp 2 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 1 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn --recompute full", 5, 0, NULL, 0},
    /* the fused core over the head split: the log-sum-exp saved (attn.lse, ws.flash_d), the
     * output moved to the head split beside its gradient backward (a second all-to-all under
     * the projection), the scores recomputed. Within 1e-7: the backward's row terms taken
     * from the wrong rows of the output (the sequence split's) move the losses by 5.9e-7 only */
    {"llama_cp2_a2a_flash", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256", 3, 0, NULL, 1e-7},
    /* dropout with context parallelism: each cp rank draws the one-rank masks of the positions
     * (and, Ulysses, the heads) it holds, at every site: the embedding, the attention's and the
     * MLP's outputs, and the attention probabilities where the core runs unfused (its parts'
     * blocks of the s x s stream with the all-gather, the head split's whole rows with a2a) */
    {"llama_cp2_p2p_dropout", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --dropout 0.1", 5, 0, NULL, 0},
    {"llama_cp2_allgather_dropout", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn --dropout 0.1", 5, 0, NULL, 0},
    {"llama_cp2_a2a_dropout_selective", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn --dropout 0.1 --recompute selective", 5, 0, NULL, 0},
    {"llama_cp2_tp2_sp_allgather_dropout", 4,
     "--dp 1 --tp 2 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn --dropout 0.1", 5, 0, NULL, 0},
    {"llama_cp2_tp2_sp_a2a_dropout_full", 4,
     "--dp 1 --tp 2 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --sp " PIN1,
     "--model tiny-llama --seq 256 --no-flash-attn --dropout 0.1 --recompute full", 5, 0, NULL, 0},
    {"llama_cp2_p2p_dropout_full", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --dropout 0.1 --recompute full", 5, 0, NULL, 0},
    /* FP8 GEMMs with context parallelism (docs/fp8.md, "The executor"): each cp rank quantizes
     * its own b x s/cp rows with scales of their own, and delayed scaling's input and gradient
     * histories see those rows only (no amax travels: the op graph counts none, as for TP);
     * the attention core stays in the act dtype. Within 3e-3 as TP's FP8 layouts. The ring
     * (the fused core: delayed scaling saves the projection's input in FP8 beside the core's
     * output), and the all-gather with the unfused core, selective recompute and transposed
     * copies */
    {"llama_cp2_p2p_fp8_delayed", 2, "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --fp8-recipe delayed --fp8-amax-history 16", 5, 0, NULL, 3e-3},
    {"llama_cp2_allgather_fp8_tensorwise", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 256 --fp8-recipe tensorwise --no-flash-attn --recompute selective "
     "--set device.fp8_tn_only=1",
     5, 0, NULL, 3e-3},
    /* FP8 attention with the all-gather (docs/fp8.md, "The executor"): the fused core's K, V
     * gathered as their one-byte codes, each rank's with its own decode factor (the op graph
     * counts b s kv2 + 4 cp bytes a gather), decoded before the core; the gradients
     * reduce-scattered in the act dtype. Tensorwise, and delayed under full recompute (the
     * recomputed forward quantizes and gathers again) */
    {"llama_cp2_allgather_fp8_attention_tensorwise", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 128 --fp8-recipe tensorwise --fp8-attention", 3, 0, NULL, 3e-3},
    {"llama_cp2_allgather_fp8_attention_delayed_full", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 128 --fp8-recipe delayed --fp8-amax-history 16 --fp8-attention "
     "--recompute full",
     3, 0, NULL, 3e-3},
    /* MXFP8 attention with the all-gather, as Transformer Engine runs it: K, V gathered in
     * the act dtype (the layout without FP8 attention's bytes), this rank's 16-bit Q, K, V
     * saved, and the core quantizing this rank's Q, K, V and the gathered K, V into both
     * copies after each gather; tiny-hd32 at sequence 128 (a rank's chunks 32 rows: one
     * column-wise block each, the blocks of one rank's, so within 1e-6, not FP8's 3e-3:
     * measured 3.4e-10) */
    {"hd32_cp2_allgather_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type allgather --zero 0 --no-sp " PIN1,
     "--seq 128 --fp8-recipe mxfp8 --fp8-attention", 3, 0, NULL, 1e-6},
    /* and on the ring (AttnFuncWithCPAndKVP2P's MXFP8): the blocks in the act dtype, each
     * quantized into both copies at its step, dK, dV riding the ring as without FP8. The
     * merged outputs round differently from one rank's, which moves FP8 codes downstream:
     * measured 2.9e-5, held within 1e-4 (the forward reading every step's V from the first
     * block's column-wise copy measured 1.8e-4) */
    {"hd32_cp2_p2p_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--seq 128 --fp8-recipe mxfp8 --fp8-attention", 3, 0, NULL, 1e-4},
    /* and Ulysses (AttnFuncWithCPAndQKVOA2A's MXFP8): Q, K, V, the output and the gradients
     * in the act dtype, the head split (b x s rows of this rank's heads) quantized into both
     * copies after the all-to-all and saved so (attn.qkv.out), dO quantized there into both.
     * A column-wise block is 32 positions of one head's channel, as on one rank, so within
     * 1e-6: measured 3.4e-10 (2.5e-5 when the head split was blocked as b x s/cp rows of
     * q + 2 kv, each block then every cp-th position) */
    {"hd32_cp2_a2a_fp8_attention_mxfp8", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--seq 128 --fp8-recipe mxfp8 --fp8-attention", 3, 0, NULL, 1e-6},
    /* Ulysses under tensorwise: Q, K, V's codes and dO's cross the all-to-alls, each block
     * with its sender's decode factor; the head-split Q, K, V the core saves are the received
     * blocks (attn.qkv.out: cp - 1 factors more) */
    {"llama_cp2_a2a_fp8_attention_tensorwise", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 128 --fp8-recipe tensorwise --fp8-attention", 3, 0, NULL, 3e-3},
    /* the ring under tensorwise: K, V's codes round the ring with their owner's factor, each
     * block's dK, dV home in one all-to-all after the last step */
    {"llama_cp2_p2p_fp8_attention_tensorwise", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 128 --fp8-recipe tensorwise --fp8-attention", 3, 0, NULL, 3e-3},
    /* both under delayed scaling, as Transformer Engine moves the tensors its quantizers wrote:
     * the ring's dK, dV home in their codes (one factor of this rank's dQKV history, a fourth
     * column of the QKV weight's amax), the output saved in FP8 after the merge; Ulysses' output
     * quantized and saved in the head split and sent back in its codes, dQ, dK, dV back in
     * theirs, no output moved in the backward */
    {"llama_cp2_p2p_fp8_attention_delayed", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 128 --fp8-recipe delayed --fp8-amax-history 16 --fp8-attention",
     3, 0, NULL, 3e-3},
    {"llama_cp2_a2a_fp8_attention_delayed", 2,
     "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type a2a --zero 0 --no-sp " PIN1,
     "--model tiny-llama --seq 128 --fp8-recipe delayed --fp8-amax-history 16 --fp8-attention",
     3, 0, NULL, 3e-3},
    /* the CPU's 16-bit kernels (kern_cpu_with): the plan in bf16 (its gradients bf16 too:
     * reduce-scattered and all-gathered in 16 bits) or fp16 (dynamic loss scaling), the
     * reference the same job in fp32: the losses within 16-bit rounding of it, memory and bytes
     * the simulator's for 2-byte activations exactly */
    {"dp2_zero1_bf16_grad16_cpu", 2,
     "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp --precision bf16 --grad-dtype bf16 " PIN1, "", 3, 0,
     NULL, 1e-3},
    {"tp2_sp_fp16_cpu", 2, "--dp 1 --tp 2 --pp 1 --zero 0 --sp --precision fp16 " PIN1,
     "--dropout 0.1 --no-flash-attn", 3, 0, NULL, 1e-3},
    /* and with FP8 GEMMs and FP8 attention (tensorwise): the act inputs quantized, the GEMMs'
     * act outputs and the decoded Q, K, V rounded once, against the same FP8 job in fp32 on
     * one rank within the FP8 tolerance */
    {"dp2_zero1_fp8_tensorwise_bf16_cpu", 2,
     "--dp 2 --tp 1 --pp 1 --zero 1 --no-sp --precision bf16 " PIN1,
     "--fp8-recipe tensorwise --fp8-attention --mbs 1", 3, 0, NULL, 3e-3},
    {"dp2_tp2_pp2_zero1_fp8_delayed", 8, "--dp 2 --tp 2 --pp 2 --zero 1 --sp " PIN1,
     "--fp8-recipe delayed --fp8-format e4m3 --recompute full --set device.fp8_tn_only=1", 5, 0, NULL, 3e-3},
};
enum { N_LAYOUTS = sizeof layouts / sizeof layouts[0] };

static const char *px;

/* Calls per step of op `name` on `stage`, summed over the stage's chunks. */
static double predicted_calls(const cJSON *pops, int stage, const char *name)
{
    double c = 0;
    const cJSON *o;
    cJSON_ArrayForEach(o, pops)
    {
        if ((int)num(o, "stage") == stage && !strcmp(cJSON_GetStringValue(at(o, "name", NULL)), name))
            c += num(o, "calls");
    }
    return c;
}

/* Optimizer offload needs a cluster that describes the host (docs/memory.md): the local one
 * with a host of its own, written into the scratch. */
static const char *cluster_for(const Layout *L)
{
    static char path[600];
    if (!strstr(L->layout, "--offload-optimizer"))
        return "local";
    snprintf(path, sizeof path, "%s/local-host.json", tmp);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "{\"schema_version\": 1, \"name\": \"local-host\", \"description\": \"this machine with "
               "a host description\", \"device\": \"cpu\",\n"
               " \"node\": {\"devices\": 0, \"link\": {\"bandwidth\": 5e9, \"latency\": 1e-6, "
               "\"efficiency\": 0.8}},\n"
               " \"network\": {\"bandwidth_per_device\": 5e9, \"latency\": 1e-6, \"efficiency\": 0.8},\n"
               " \"shared_memory\": true, \"overlap\": {\"compute_slowdown\": 0.1},\n"
               " \"host\": {\"memory_bytes\": 8e9, \"pcie_bandwidth\": 1e10, \"memory_bandwidth\": 1e10, "
               "\"cores\": 2}}\n");
    CHECK(fclose(f) == 0);
    return path;
}

/* The layout's job: a *_sinks_* layout trains tiny-llama with GPT-OSS's attention sinks, a
 * *_vpp65 one tiny with 130 layers (a chunk of one layer each on pp 2 x vpp 65), a wide_* one
 * tiny at hidden 256, ffn 512 and 1 layer, whose weights hold 128 x 128 tiles in both
 * directions (tiny's 64 columns or rows give a grid of one row or column of tiles, whose
 * transpose is the same list of scales) (a model file in the scratch directory), a hd32_*
 * one tests/data's tiny-hd32 (the later --model wins). */
static const char *job_of(const Layout *L)
{
    static char job[900];
    if (!strncmp(L->name, "hd32_", 5)) {
        snprintf(job, sizeof job, "%s --model %s/tests/data/tiny-hd32.json", L->job, PX_SOURCE_DIR);
        return job;
    }
    const int sinks = strstr(L->name, "_sinks_") != NULL, wide = !strncmp(L->name, "wide_", 5);
    if (!sinks && !wide && !strstr(L->name, "_vpp65"))
        return L->job;
    PxError err = {0};
    ModelConfig m;
    CHECK_OK(model_config_load(sinks ? "tiny-llama" : "tiny", &m, &err), err);
    if (sinks)
        m.attn_sinks = 1;
    else if (wide)
        m.hidden = 256, m.ffn_hidden = 512, m.layers = 1;
    else
        m.layers = 130;
    snprintf(m.name, sizeof m.name, sinks ? "tiny-llama-sinks" : wide ? "tiny-wide" : "tiny-130");
    char path[400];
    snprintf(path, sizeof path, "%s/%s.json", tmp, m.name);
    cJSON *j = model_config_to_json(&m);
    CHECK_OK(px_json_write_file(path, j, &err), err);
    cJSON_Delete(j);
    snprintf(job, sizeof job, "%s --model %s", L->job, path);
    return job;
}

static void trained(const Layout *L, cJSON **plan, cJSON **run)
{
    sh(0, "%s plan --model tiny --cluster %s --gpus %d --gbs 8 --steps %d %s %s -o %s/plan.json",
       px, cluster_for(L), L->gpus, L->steps, L->layout, job_of(L), tmp);
    sh(0, "timeout 600 %s run %s/plan.json --quiet -o %s/run.json", px, tmp, tmp);
    *plan = read_json("plan.json");
    *run = read_json("run.json");
}

/* The recorded step of the first rank of `stage`: its timeline entry. */
static const cJSON *stage_timeline(const cJSON *run, int stage)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, at(run, "timeline", NULL)) if ((int)num(t, "stage") == stage) return t;
    fprintf(stderr, "FAILED: no timeline of stage %d\n", stage);
    exit(1);
}

enum { MAXP = 8, MAXEV = 512 };

/* The idle fraction of each stage that the schedule implies for the recorded step: the stages'
 * passes replayed with their measured durations, each starting when its stage is free and its
 * input is ready (the previous chunk's forward, the next chunk's backward), transfers free. A
 * stage slowed down by something else on the machine shows up in its durations, so the
 * replay's order of the stages' idle times is the one the measurement must have. */
static void replay(const cJSON *run, int p, double *idle_frac)
{
    double start[MAXP][MAXEV], dur[MAXP][MAXEV];
    int chunk[MAXP][MAXEV], mb[MAXP][MAXEV], bwd[MAXP][MAXEV], n[MAXP], next[MAXP];
    double fend[MAXP * 4][64], bend[MAXP * 4][64], free_at[MAXP], busy[MAXP];
    int G = 0, M = 0;
    CHECK(p <= MAXP);
    for (int s = 0; s < p; s++) {
        const cJSON *e;
        n[s] = next[s] = 0;
        free_at[s] = busy[s] = 0;
        cJSON_ArrayForEach(e, at(stage_timeline(run, s), "events", NULL))
        {
            CHECK(n[s] < MAXEV);
            int k = n[s]++;
            chunk[s][k] = (int)num(e, "chunk");
            mb[s][k] = (int)num(e, "mb");
            bwd[s][k] = cJSON_IsTrue(at(e, "backward", NULL));
            start[s][k] = num(e, "start_s");
            dur[s][k] = num(e, "end_s") - start[s][k];
            busy[s] += dur[s][k];
            if (chunk[s][k] * p + s + 1 > G)
                G = chunk[s][k] * p + s + 1;
            if (mb[s][k] + 1 > M)
                M = mb[s][k] + 1;
        }
    }
    CHECK(G <= MAXP * 4 && M <= 64);
    for (int g = 0; g < G; g++)
        for (int i = 0; i < M; i++)
            fend[g][i] = bend[g][i] = -1;
    for (int progress = 1; progress;) {
        progress = 0;
        for (int s = 0; s < p; s++)
            while (next[s] < n[s]) {
                const int k = next[s], g = chunk[s][k] * p + s, i = mb[s][k];
                double ready = 0;
                if (!bwd[s][k]) {
                    if (g > 0 && (ready = fend[g - 1][i]) < 0)
                        break;
                } else {
                    if ((ready = fend[g][i]) < 0 || (g < G - 1 && bend[g + 1][i] < 0))
                        break;
                    if (g < G - 1 && bend[g + 1][i] > ready)
                        ready = bend[g + 1][i];
                }
                double t0 = ready > free_at[s] ? ready : free_at[s];
                free_at[s] = t0 + dur[s][k];
                if (bwd[s][k])
                    bend[g][i] = free_at[s];
                else
                    fend[g][i] = free_at[s];
                next[s]++;
                progress = 1;
            }
    }
    for (int s = 0; s < p; s++) {
        CHECK(next[s] == n[s]); /* the recorded passes follow a schedule that can run */
        idle_frac[s] = busy[s] > 0 ? (free_at[s] - busy[s]) / busy[s] : 0;
    }
}

static int check_bubble(const Layout *L, const cJSON *plan, const cJSON *run, int last_try)
{
    const int p = (int)num(at(plan, "layout", NULL), "pp");
    const cJSON *tl = at(run, "timeline", NULL);
    CHECK_EQ_INT(L->gpus, cJSON_GetArraySize(tl));
    const cJSON *t;
    cJSON_ArrayForEach(t, tl)
    {
        /* every rank waits: the last stage for its first input, the first for the first
         * gradient to come back */
        CHECK(num(t, "bubble_fraction") > 0 && num(t, "idle_s") > 0);
        /* one forward and one backward per (chunk, micro-batch) */
        CHECK_EQ_INT(2 * (int)num(at(plan, "training", NULL), "micro_batches") *
                         (int)num(at(plan, "layout", NULL), "vpp"),
                     cJSON_GetArraySize(at(t, "events", NULL)));
    }
    /* the recorded step against the schedule replayed with its pass durations */
    double implied[MAXP], measured[MAXP];
    replay(run, p, implied);
    for (int s = 0; s < p; s++) {
        const cJSON *st = stage_timeline(run, s);
        measured[s] = num(st, "idle_s") / num(st, "busy_s");
    }
    const cJSON *pt = at(at(plan, "prediction", NULL), "time", NULL);
    const cJSON *pst = at(pt, "per_stage", NULL);
    printf("%-20s bubble (median over steps) stage 0 %5.1f%%, stage %d %5.1f%%; predicted %5.1f%%, "
           "%5.1f%%; recorded step %5.1f%%, %5.1f%%, its schedule implies %5.1f%%, %5.1f%%\n",
           L->name, 100 * num(stage_timeline(run, 0), "bubble_fraction"), p - 1,
           100 * num(stage_timeline(run, p - 1), "bubble_fraction"),
           100 * num(stage_entry(pst, 0), "bubble_fraction"),
           100 * num(stage_entry(pst, p - 1), "bubble_fraction"), 100 * measured[0],
           100 * measured[p - 1], 100 * implied[0], 100 * implied[p - 1]);
    /* with uniform stages the first stage waits longest for the backward to come back */
    CHECK(num(stage_entry(pst, 0), "bubble_fraction") > num(stage_entry(pst, p - 1), "bubble_fraction"));
    /* the stages idle in the order the schedule implies (when it implies one clearly), and at
     * least half as much as it implies: waiting is not hidden inside the passes */
    int ok = 1;
    if (fabs(implied[0] - implied[p - 1]) > 0.02)
        ok &= (measured[0] > measured[p - 1]) == (implied[0] > implied[p - 1]);
    for (int s = 0; s < p; s++)
        ok &= measured[s] >= 0.5 * implied[s];
    if (ok)
        return 1;
    if (last_try) {
        fprintf(stderr, "FAILED: %s: the stages' idle times do not follow the schedule\n", L->name);
        exit(1);
    }
    /* a stall between two passes is not in the replay: one more run before failing */
    printf("%-20s the stages' idle times do not follow the schedule this time: once more\n", L->name);
    return 0;
}

/* The layout without --fp8-param-gather, trained: every step's loss equals `steps`' exactly
 * (a shard quantized with its whole weight's scale is the bytes the per-use cast makes). */
static void check_cast_twin(const Layout *L, const cJSON *steps)
{
    /* MXFP8 under ZeRO-3: the input gradient's GEMM reads the gathered column-wise copy in the
     * weight's shape (matmul_fp8_split, the transpose flag flipped) where the per-use cast
     * transposes it: the same codes and scales, the products summed in sgemm's other order
     * (bit for bit where OpenBLAS sums NN and NT alike: tiny; tiny-llama 6.8e-10) */
    if (PX_TEST_SANITIZED) /* the twin runs the lines of the layout without the flag */
        return;
    const double tol = strstr(L->layout, "--zero 3") && strstr(L->job, "mxfp8") ? 1e-6 : 0;
    double worst = 0;
    char lay[600];
    const char *flag = "--fp8-param-gather ", *at_flag = strstr(L->layout, flag);
    CHECK(at_flag != NULL);
    snprintf(lay, sizeof lay, "%.*s%s", (int)(at_flag - L->layout), L->layout,
             at_flag + strlen(flag));
    sh(0, "%s plan --model tiny --cluster %s --gpus %d --gbs 8 --steps %d %s %s -o %s/twin.json",
       px, cluster_for(L), L->gpus, L->steps, lay, job_of(L), tmp);
    sh(0, "timeout 600 %s run %s/twin.json --quiet -o %s/twin.run.json", px, tmp, tmp);
    cJSON *twin = read_json("twin.run.json");
    const cJSON *ts = at(twin, "steps", NULL);
    CHECK_EQ_INT(L->steps, cJSON_GetArraySize(ts));
    for (int i = 0; i < L->steps; i++) {
        const double a = num(cJSON_GetArrayItem(ts, i), "loss"), b = num(cJSON_GetArrayItem(steps, i), "loss");
        const double dev = fabs(b - a) / fabs(a);
        if (tol > 0 ? !(dev <= tol) : a != b) {
            fprintf(stderr, "FAILED: %s step %d: loss %.17g with the FP8 gather, %.17g without "
                    "--fp8-param-gather (tolerance %g)\n", L->name, i + 1, b, a, tol);
            exit(1);
        }
        worst = dev > worst ? dev : worst;
    }
    printf("%-20s the same losses without --fp8-param-gather (%s): max deviation %.2e\n",
           L->name, lay, worst);
    cJSON_Delete(twin);
}

static void check_layout(const Layout *L)
{
    /* the single-rank reference of the same job */
    sh(0, "%s plan --model tiny --cluster local --gpus 1 --gbs 8 --steps %d %s -o %s/ref.json", px,
       L->steps, job_of(L), tmp);
    static const char *const ref_out[] = {"ref.run.json", NULL};
    run_ref("ref.json", ref_out, "%s run %s/ref.json --quiet --launcher none -o %s/ref.run.json", px,
            tmp, tmp);
    cJSON *ref = read_json("ref.run.json");
    cJSON *plan, *run;
    trained(L, &plan, &run);

    const cJSON *lay = at(plan, "layout", NULL);
    CHECK_EQ_INT(L->gpus, (int)(num(lay, "dp") * num(lay, "tp") * num(lay, "pp") * num(lay, "cp")));
    if (L->split) {
        /* the plan carries the split and every rank ran its stage's layers (the ops below) */
        const cJSON *sl = at(lay, "stage_layers", NULL), *e;
        char got[64] = "";
        size_t n = 0;
        cJSON_ArrayForEach(e, sl)
        {
            if (n < sizeof got)
                n += (size_t)snprintf(got + n, sizeof got - n, "%s%d", n ? "," : "", e->valueint);
        }
        CHECK_STR(L->split, got);
    }
    CHECK_EQ_INT(L->gpus, (int)num(at(run, "backend", NULL), "world"));
    CHECK_STR(L->gpus > 1 ? "mpi" : "single", cJSON_GetStringValue(at(run, "backend", "comm")));

    /* the loss trajectory */
    const cJSON *rs = at(ref, "steps", NULL), *ms = at(run, "steps", NULL);
    CHECK_EQ_INT(L->steps, cJSON_GetArraySize(rs));
    CHECK_EQ_INT(L->steps, cJSON_GetArraySize(ms));
    double worst = 0;
    for (int i = 0; i < L->steps; i++) {
        double a = num(cJSON_GetArrayItem(rs, i), "loss"), b = num(cJSON_GetArrayItem(ms, i), "loss");
        CHECK_REL(a, b, L->tol > 0 ? L->tol : 1e-5);
        if (fabs(b - a) / fabs(a) > worst)
            worst = fabs(b - a) / fabs(a);
    }

    /* --fp8-param-gather with tensorwise scaling, whose scale is the whole weight's (one
     * layout a way of gathering: the second run costs CI time) */
    if (!strcmp(L->name, "dp2_zero3_fp8pg_tensorwise") || !strcmp(L->name, "dp2_pp2_zero3_fp8pg_tensorwise") ||
        !strcmp(L->name, "dp2_zero3_fp8pg_tensorwise_buckets") ||
        !strcmp(L->name, "dp2_zero1_fp8pg_tensorwise") || !strcmp(L->name, "dp2_zero1_fp8pg_blockwise") ||
        !strcmp(L->name, "dp2_zero1_fp8pg_mxfp8") || !strcmp(L->name, "tp2_sp_dp2_zero1_fp8pg_mxfp8") ||
        !strcmp(L->name, "dp2_zero0_fp8pg_tensorwise_adam8") ||
        !strcmp(L->name, "dp2_zero1_fp8pg_offload_tensorwise") ||
        !strcmp(L->name, "wide_dp2_zero1_fp8pg_blockwise_tn") ||
        !strcmp(L->name, "wide_dp2_zero3_fp8pg_blockwise_tn") ||
        !strcmp(L->name, "dp2_zero3_fsdp_fp8pg_mxfp8") ||
        !strcmp(L->name, "dp2_zero3_fp8pg_mxfp8_buckets_full") ||
        !strcmp(L->name, "dp2_pp2_zero3_fp8pg_mxfp8"))
        check_cast_twin(L, ms);

    /* memory, communication, FLOPs and ops of every rank against its stage's prediction */
    const cJSON *pred = at(plan, "prediction", NULL);
    const cJSON *mr = at(run, "memory", "per_rank"), *cr = at(run, "comm", "per_rank");
    const cJSON *fr = at(run, "flops", "per_rank_per_step"), *opr = at(run, "ops_per_rank", NULL);
    CHECK_EQ_INT(L->gpus, cJSON_GetArraySize(mr));
    CHECK_EQ_INT(L->gpus, cJSON_GetArraySize(cr));
    CHECK_EQ_INT(L->gpus, cJSON_GetArraySize(fr));
    CHECK_EQ_INT(L->gpus, cJSON_GetArraySize(opr));
    uint64_t comm_total = 0;
    for (int r = 0; r < L->gpus; r++) {
        const cJSON *m = cJSON_GetArrayItem(mr, r), *c = cJSON_GetArrayItem(cr, r);
        CHECK_EQ_INT(r, (int)num(m, "rank"));
        CHECK_EQ_INT(r, (int)num(c, "rank"));
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
        /* optimizer offload: the host's bytes per category as the plan's host column, the
         * host's updates made every step */
        if (run_check_host(L->name, r, pm, m, run, L->steps)) {
            const cJSON *of = cJSON_GetArrayItem(at(run, "offload", "per_rank"), r);
            CHECK(num(of, "host_optimizer_s") > 0 && num(of, "grads_to_host_s") > 0 &&
                  num(of, "weights_to_device_s") > 0);
        }
        /* the activation pools were full at the schedule's peak */
        CHECK_EQ_U64((uint64_t)num(m, "activations"), (uint64_t)num(m, "activations_in_use_peak"));
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
        comm_total += (uint64_t)num(c, "total_bytes");
        /* ZeRO-3's prefetch: each layer's gather but a chunk's first issued while the layer
         * before it computes, forward and (without kept gathers) backward, every micro-batch */
        /* (none under a pipeline, which gathers every block once a step) */
        if ((int)num(lay, "zero") == 3) {
            const cJSON *pf = cJSON_GetObjectItemCaseSensitive(lay, "prefetch");
            const int ahead = (pf && pf->valueint < 0) || num(lay, "pp") > 1 ? 0 : 1;
            const int passes = cJSON_IsTrue(at(lay, "keep_gathered", NULL)) ? 1 : 2;
            const int layers = (int)num(at(plan, "model", NULL), "layers");
            const int mbs = (int)num(at(plan, "training", NULL), "micro_batches");
            CHECK_EQ_INT(ahead * L->steps * mbs * passes * (layers - 1),
                         (int)num(c, "zero3_gathers_prefetched"));
        }
        double pf = cJSON_GetArrayItem(at(pred, "flops", "per_rank_per_step"), stage)->valuedouble;
        CHECK_REL(pf, cJSON_GetArrayItem(fr, r)->valuedouble, 1e-12);
        const cJSON *ro = cJSON_GetArrayItem(opr, r);
        CHECK_EQ_INT(stage, (int)num(ro, "stage"));
        const cJSON *o;
        int n_ops = 0;
        cJSON_ArrayForEach(o, at(ro, "ops", NULL))
        {
            const char *name = cJSON_GetStringValue(at(o, "name", NULL));
            /* an op of several chunks is listed once per chunk: sum both sides by name */
            double want = predicted_calls(at(pred, "ops", NULL), stage, name), got = 0;
            const cJSON *o2;
            cJSON_ArrayForEach(o2, at(ro, "ops", NULL))
            {
                if (!strcmp(cJSON_GetStringValue(at(o2, "name", NULL)), name))
                    got += num(o2, "calls");
            }
            if (want != got) {
                fprintf(stderr, "FAILED: %s rank %d op %s: the graph says %g calls per step, it ran %g\n",
                        L->name, r, name, want, got);
                exit(1);
            }
            n_ops++;
        }
        CHECK(n_ops > 0);
    }
    CHECK(comm_total > 0);
    printf("%-20s %d ranks, %d steps: final loss %.6f (single rank %.6f), max deviation %.2e; "
           "memory, comm and FLOPs of every rank equal the prediction\n",
           L->name, L->gpus, L->steps, num(cJSON_GetArrayItem(ms, L->steps - 1), "loss"),
           num(cJSON_GetArrayItem(rs, L->steps - 1), "loss"), worst);

    if (L->pipeline && !check_bubble(L, plan, run, 0)) {
        cJSON_Delete(plan);
        cJSON_Delete(run);
        trained(L, &plan, &run);
        check_bubble(L, plan, run, 1);
    }
    cJSON_Delete(ref);
    cJSON_Delete(plan);
    cJSON_Delete(run);
}

static const char *layout_name(int i) { return layouts[i].name; }

int main(int argc, char **argv)
{
    const int i = run_layout_arg("test_exec_mpi", argc, argv, N_LAYOUTS, layout_name,
                                 RUN_WORKER_NONE, &px, NULL);
    if (i < 0)
        return 0;
    const Layout *L = &layouts[i];
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("test_exec_mpi: mpirun is not installed: skipped\n");
        return 77;
    }
    char what[96];
    snprintf(what, sizeof what, "mpi-%s", L->name);
    if (run_scratch(what))
        return 1;
    check_layout(L);
    run_scratch_remove("test_exec_mpi");
    TEST_DONE(L->name);
}
