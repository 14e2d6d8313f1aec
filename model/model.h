/* model — the single source of truth for sizes and work in parallax.
 *
 * For a model configuration, a parallel layout and a training job (together a ModelSpec) and a
 * pipeline stage, this module yields:
 *   - the tensor table: every parameter, gradient, master copy, optimizer state, saved
 *     activation, communication buffer and workspace tensor the rank holds, with shape, dtype,
 *     sharding and memory category;
 *   - the op graph: every forward / backward / recompute op of one micro-batch and every
 *     per-step op, with matmul FLOPs, bytes moved, GEMM shapes, and every communication event
 *     with its kind, group and bytes;
 *   - the pipeline schedule: the order in which a stage runs forward and backward passes of
 *     (model chunk, micro-batch) pairs, from which the activation peak follows.
 * sim/ only costs these; exec/ only allocates and runs them. Ranks of one pipeline stage are
 * symmetric (TP, CP and DP ranks hold the same sizes), so everything is per stage.
 *
 * Example:
 *   ModelSpec spec;
 *   model_spec_defaults(&spec);
 *   model_config_load("gpt3-175b", &spec.model, &err);
 *   spec.layout.tp = 8; spec.layout.pp = 12; spec.layout.dp = 16;
 *   spec.job.global_batch = 2304;
 *   ModelDims dims;
 *   if (model_spec_check(&spec, 1536, &dims, &err)) ...   // "pp 7 must divide layers 96"
 *   // or an uneven split: spec.layout.n_stage_layers = 12, stage_layers[] = {7, 8, 8, ..., 7}
 *   ModelTensorTable tt;
 *   model_tensors_build(&spec, &dims, 0, &tt, &err);       // stage 0
 *   ... model_tensors_free(&tt);
 */
#ifndef MODEL_H
#define MODEL_H

#include <stdint.h>

#include "common/px.h"
#include "profiles/profile.h"

/* ---- model configuration ---- */

typedef enum { MODEL_GPT = 0, MODEL_LLAMA } ModelFamily;
typedef enum { MODEL_LAYERNORM = 0, MODEL_RMSNORM } ModelNorm;
typedef enum { MODEL_GELU = 0, MODEL_SWIGLU } ModelMlp;
typedef enum { MODEL_POS_LEARNED = 0, MODEL_POS_ROPE } ModelPosition;
typedef enum { MODEL_ROUTER_SOFTMAX = 0, MODEL_ROUTER_SIGMOID } ModelRouterScore;

/* Mixture of experts (experts 0: a dense model). A MoE layer replaces the MLP by a router, the
 * routed experts (SwiGLU, or the model's MLP kind) of width expert_ffn and, optionally, shared
 * experts every token passes through (shared_ffn: their summed width, as Megatron's
 * --moe-shared-expert-intermediate-size). Layers 0 .. first_dense-1 stay dense; after them every
 * layer_freq-th layer is MoE (1: all). docs/moe.md. */
typedef struct {
    int experts;           /* routed experts per MoE layer */
    int topk;              /* experts each token is routed to */
    int expert_ffn;        /* each routed expert's inner width (per matrix for SwiGLU) */
    int shared_ffn;        /* shared experts' summed inner width; 0: none */
    int shared_gate;       /* a sigmoid gate on the shared experts' output (Qwen2-MoE) */
    int first_dense;       /* leading dense layers (DeepSeek's first_k_dense_replace) */
    int layer_freq;        /* every layer_freq-th layer after them is MoE; 1: every one */
    ModelRouterScore score;
    int groups, topk_groups; /* group-limited routing (DeepSeek-V3: 8 groups, 4 chosen); 0: none */
    int router_bias;       /* the router's linear layer has a bias (GPT-OSS) */
    int expert_bias;       /* the experts' linear layers have biases (GPT-OSS) */
    int norm_topk;         /* top-k weights renormalised to sum to 1 */
    double aux_loss_coeff; /* load-balancing loss weight (Switch / GShard); 0: none */
    double capacity_factor; /* tokens an expert takes, as a multiple of its balanced share; 0: dropless */
} ModelMoe;

/* DeepSeek's multi-head latent attention (kv_lora_rank 0: ordinary attention). Queries go
 * through a rank-q_lora_rank bottleneck (0: projected directly), keys and values through a
 * shared rank-kv_lora_rank latent plus one rotary key of qk_rope_dim shared by the heads.
 * Query/key heads are qk_nope_dim + qk_rope_dim wide, value heads v_dim. */
typedef struct {
    int q_lora_rank, kv_lora_rank;
    int qk_nope_dim, qk_rope_dim, v_dim;
} ModelMla;

/* Rotary scaling for a long context (Hugging Face's rope_scaling / rope_parameters): Llama 3.1's
 * "llama3" rescales each rotary frequency by how its wavelength compares with the pre-training
 * context, original_context: wavelengths shorter than original_context / high_freq_factor keep
 * their frequency, those longer than original_context / low_freq_factor are divided by factor,
 * the band between is interpolated (Meta's llama-models, apply_scaling; transformers'
 * _compute_llama3_parameters). It adds no parameters and no work: the exports carry it. */
typedef enum { MODEL_ROPE_SCALING_NONE = 0, MODEL_ROPE_SCALING_LLAMA3 } ModelRopeScalingType;

typedef struct {
    ModelRopeScalingType type;
    double factor;
    double low_freq_factor, high_freq_factor;
    int original_context; /* original_max_position_embeddings: the pre-training length */
} ModelRopeScaling;

typedef struct {
    char name[64];
    ModelFamily family;
    int layers;
    int hidden;
    int heads;
    int kv_heads;   /* < heads: grouped-query attention */
    int head_dim;   /* heads * head_dim need not equal hidden */
    int ffn_hidden; /* width of the MLP's inner dimension (per matrix for SwiGLU) */
    int vocab;
    int seq_len; /* the model's context: learned position table size, default job sequence */
    ModelNorm norm;
    ModelMlp mlp;
    ModelPosition position;
    int tied_embeddings; /* output layer shares the word embedding */
    int bias;            /* biases on every linear layer and on the norms (GPT-2 style) */
    int qkv_bias;        /* biases on the QKV projection only (Qwen2); implied by bias */
    int proj_bias;       /* a bias on the attention output projection (GPT-OSS); implied by bias */
    double norm_eps;
    double rope_theta;
    ModelMoe moe;
    ModelMla mla;
    int mtp_layers; /* multi-token prediction modules after the last layer (DeepSeek-V3: 1) */
    int attn_sinks; /* a learned sink logit per head (GPT-OSS) */
    int qk_norm;    /* RMSNorm over each query and key head, head_dim weights each (Qwen3) */
    ModelRopeScaling rope_scaling; /* type NONE: plain RoPE (or none: learned positions) */
} ModelConfig;

/* Loads a zoo model by name ("gpt2-124m") or a file: parallax model JSON or a Hugging Face
 * config.json (gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, deepseek_v3,
 * gpt_oss). PX_EINPUT names the file and key at fault. */
int model_config_load(const char *name_or_path, ModelConfig *out, PxError *err);
/* Parses either JSON form; origin names the source in messages. */
int model_config_from_json(const cJSON *j, const char *origin, ModelConfig *out, PxError *err);
/* The parallax model JSON (docs/formats.md's Model). Caller frees with cJSON_Delete. */
cJSON *model_config_to_json(const ModelConfig *c);
/* Checks internal consistency (positive sizes, heads divisible by kv_heads ...). */
int model_config_check(const ModelConfig *c, const char *origin, PxError *err);
/* Parameter count with the vocabulary as configured (no padding), MTP modules included. */
double model_config_params(const ModelConfig *c);
/* Parameters one token passes through: every routed expert's share counted topk times instead of
 * experts times; shared experts, routers, attention, norms, the embedding and the output layer in
 * full, MTP modules included (as in model_config_params). */
double model_config_active_params(const ModelConfig *c);
/* 1 when global layer l (0-based; the MTP modules' layers are layers + i) is a MoE layer. */
int model_layer_is_moe(const ModelConfig *c, int l);
/* MoE layers among layers [first, first + n). */
int model_moe_layers_in(const ModelConfig *c, int first, int n);
/* The zoo compiled into the binary. */
int model_zoo_count(void);
const char *model_zoo_name(int i);
/* A zoo model's JSON text, NULL when name is not in the zoo: what the exports read a published
 * training recipe from (its "recipe" object, docs/exports.md), which ModelConfig does not hold. */
const char *model_zoo_text(const char *name);

const char *model_family_name(ModelFamily f);
/* "none" or "llama3": the rope_type a config names the scaling by. */
const char *model_rope_scaling_name(ModelRopeScalingType t);
/* 1 when c's rotary scaling is Llama 3.1's as Megatron-Core fixes it: llama3 with low_freq_factor
 * 1, high_freq_factor 4 and an 8192-token original context (RotaryEmbedding._apply_scaling's
 * defaults, which --use-rope-scaling and Megatron-Bridge's rope_scaling take, leaving only the
 * factor to --rope-scaling-factor / rope_scaling_factor). 0 for any other llama3 scaling, which
 * those frameworks cannot express, and for none. */
int model_rope_scaling_megatron(const ModelConfig *c);

/* ---- layout and training job ---- */

typedef enum { MODEL_RECOMPUTE_NONE = 0, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_FULL } ModelRecompute;
typedef enum { MODEL_SCHED_1F1B = 0, MODEL_SCHED_GPIPE, MODEL_SCHED_INTERLEAVED } ModelSchedule;
typedef enum { MODEL_OPT_ADAMW = 0, MODEL_OPT_SGD_MOMENTUM, MODEL_OPT_ADAM_8BIT } ModelOptimizer;
/* adam-8bit's quantization block: one fp32 absmax per this many values of m and of v (Dettmers
 * et al. 2022, "8-bit Optimizers via Block-wise Quantization", Sec. 2.1) */
#define MODEL_ADAM8_BLOCK 2048
/* How context-parallel attention reaches the other ranks' keys and values, Megatron-Core's
 * --cp-comm-type: p2p, a ring passing K and V (and in the backward their gradients) a chunk at
 * a time, overlapped with the attention of the chunk at hand (Megatron's default); allgather,
 * the whole sequence's K and V gathered before attention and their gradients reduce-scattered
 * after; a2a, DeepSpeed-Ulysses' all-to-all from a sequence split to a head split and back. */
typedef enum { MODEL_CP_COMM_P2P = 0, MODEL_CP_COMM_ALLGATHER, MODEL_CP_COMM_A2A } ModelCpComm;
/* How a MoE layer's tokens reach their experts (Megatron-Core's --moe-token-dispatcher-type):
 * all-to-all over ep (default), or every token all-gathered over the etp x ep ranks and the
 * outputs reduce-scattered back, or the flex dispatcher on DeepEP's kernels: the all-to-all's
 * work, with each token crossing the network once per remote node that hosts one of its
 * experts and NVLink forwarding it there (docs/time.md, "MoE as it runs"). */
typedef enum {
    MODEL_MOE_DISPATCH_ALLTOALL = 0, MODEL_MOE_DISPATCH_ALLGATHER, MODEL_MOE_DISPATCH_FLEX
} ModelMoeDispatcher;

/* Stages an uneven split can name (an even split has no limit). */
enum { MODEL_MAX_STAGES = 256 };

typedef struct {
    int dp, tp, pp, cp;
    int vpp;  /* model chunks per pipeline rank; > 1 means the interleaved schedule */
    int zero; /* 0 replicated, 1 optimizer+master sharded, 2 +grads, 3 +params */
    int sp;   /* sequence parallelism in the norm/dropout regions (needs tp > 1) */
    ModelRecompute recompute;
    ModelSchedule schedule;
    int overlap_dp; /* overlap DP reduction / ZeRO gathers with compute */
    int overlap_tp; /* overlap TP communication with compute */
    int tp_bwd_exposed; /* 1: QKV's and fc1's backward TP collectives exposed too, as Megatron-LM
                           before its asynchronous gradient all-reduce (late 2021); 0: they run
                           under the layer's own GEMMs (docs/time.md) */
    /* Expert parallelism, as Megatron-Core folds it: the routed experts are split over ep
     * ranks and each expert's matrices over etp ranks, inside the tp x cp x dp ranks of a
     * pipeline stage; the remaining (tp x cp x dp) / (ep x etp) ranks replicate the experts
     * (expert data parallelism). 0: 1 (etp 0: tp, Megatron's default). */
    int ep, etp;
    int overlap_ep; /* overlap the experts' all-to-all with compute (shared experts, other micro-batches) */
    /* Uneven pipeline split: the layers of each of the pp stages (vpp 1), summing to the
     * model's layers. 0 entries: the even split, layers / (pp * vpp) per chunk.
     * model_spec_check clears a split whose stages are all equal, so that it is the even one. */
    int n_stage_layers;
    int stage_layers[MODEL_MAX_STAGES];
    /* Megatron-Core's other ways to split the layers over the pipeline (docs/pipeline.md):
     * embed_in_split / loss_in_split count the input embedding / the output layer with its loss
     * as one layer each (--account-for-embedding/loss-in-pipeline-split); first_stage_layers /
     * last_stage_layers give the first / last pipeline stage's layers, the others sharing the
     * rest evenly (--decoder-first/last-pipeline-num-layers; 0: not given); pp_layout is the
     * layout string (--pipeline-model-parallel-layout; empty: none). model_spec_check resolves
     * whichever is given into stage_layers. */
    int embed_in_split, loss_in_split, first_stage_layers, last_stage_layers;
    char pp_layout[512];
    /* Where the prediction modules sit, which only a layout string moves: the virtual stages
     * after theirs, 0 for the last stage (every other form, and "...tmL"), 1 for a standalone
     * stage before the loss's ("...,m|L"). model_split_resolve sets it from pp_layout. */
    int mtp_from_last;
    ModelCpComm cp_comm;
    /* Sharded data parallelism (zero 3; docs/time.md, "Sharded data parallelism"). fsdp: the
     * gathers of PyTorch FSDP2 and Megatron-FSDP, whose backward gather also serves a layer's
     * recomputed forward; 0: DeepSpeed ZeRO-3's, where the recomputed forward gathers again.
     * keep_gathered: a layer's gathered parameters stay from its forward to its backward
     * (FSDP2's reshard_after_forward=False); 0: freed after the forward, gathered again.
     * prefetch: layers whose gathers run ahead of the compute; 0: the default, 1; -1: none.
     * bucket_bytes: a block's gathers and gradient reductions in calls of at most this many
     * bytes; 0: one call per block. */
    int fsdp, keep_gathered, prefetch;
    double bucket_bytes;
    /* HSDP: the data-parallel ranks as dp_shard x dp_replicate (torchtitan's names); the ZeRO
     * state is sharded over dp_shard x cp ranks and replicated dp_replicate times, and each
     * gradient shard is all-reduced over its replicas. 0: dp_shard = dp, dp_replicate = 1. */
    int dp_shard, dp_replicate;
    /* Offload (ZeRO-Offload, FSDP's CPU offload): master weights and optimizer state in host
     * memory with the optimizer step on the host; saved activations to host memory in the
     * forward and back before the backward. */
    int offload_optimizer, offload_activations;
} ModelLayout;

/* FP8 training (docs/fp8.md), Megatron's --fp8-recipe names: how the FP8 GEMMs' operands are
 * scaled. delayed: one scale per tensor from an amax history (Transformer Engine's
 * DelayedScaling); tensorwise: one per tensor from the tensor itself (current scaling);
 * blockwise: DeepSeek-V3's 128 x 128 blocks for weights and 1 x 128 for activations and
 * gradients, fp32 scales; mxfp8: OCP MX blocks of 1 x 32 with E8M0 (power-of-two) scales. */
typedef enum {
    MODEL_FP8_NONE = 0,
    MODEL_FP8_DELAYED,
    MODEL_FP8_TENSORWISE,
    MODEL_FP8_BLOCKWISE,
    MODEL_FP8_MXFP8
} ModelFp8Recipe;
/* hybrid: E4M3 in the forward, E5M2 for gradients (Megatron's default); e4m3: E4M3 throughout */
typedef enum { MODEL_FP8_HYBRID = 0, MODEL_FP8_E4M3 } ModelFp8Format;
/* Frameworks, by the exports' names (megatron, deepspeed, nemo, bridge, torchtitan) and IBM's
 * fms-fsdp (PyTorch FSDP1); megatron is the default. */
typedef enum {
    MODEL_FW_MEGATRON = 0, MODEL_FW_DEEPSPEED, MODEL_FW_NEMO, MODEL_FW_BRIDGE, MODEL_FW_TORCHTITAN,
    MODEL_FW_FMS_FSDP, MODEL_FW_COUNT
} ModelFramework;
const char *model_framework_name(ModelFramework f);

typedef struct {
    int global_batch; /* sequences per step */
    int micro_batch;  /* sequences per micro-batch per data-parallel rank */
    int seq_len;      /* 0: the model's */
    PxDtype precision;  /* weights and activations: fp32, bf16 or fp16; PX_DTYPE_COUNT: auto */
    PxDtype grad_dtype; /* fp32 (Megatron's default) or the precision's 2-byte type */
    ModelOptimizer optimizer;
    int flash_attn;       /* attention without the s^2 matrices saved */
    double dropout;       /* probability; 0 = no dropout ops or masks */
    int pad_vocab;        /* pad the vocabulary to a multiple of pad_vocab * tp (1: only to tp) */
    int causal_flops;     /* count the causal half of attention scores (default: full, as Narayanan) */
    int fused_kernels;    /* fused elementwise kernels (bias-GeLU, bias-dropout-add, scale-mask-softmax) */
    double train_tokens;  /* tokens to train on, for days and GPU-hours; 0: not asked */
    /* MoE routing: the busiest expert-parallel rank's tokens over the balanced share (1: the
     * balance NVIDIA's benchmarks force); force_balance routes round-robin, ignoring the
     * router's choice, as Megatron's --moe-router-force-load-balancing */
    double moe_imbalance;
    int moe_force_balance;
    ModelMoeDispatcher moe_dispatcher;
    /* --moe-capacity-factor: > 0 sets the model's moe.capacity_factor when the spec is checked
     * (model_spec_check), which stays the one the simulator, the exports and the executor read
     * and the plan writes; 0: the model's own */
    double moe_capacity_factor;
    /* FP8 GEMMs in the transformer layers' linear layers (not the embedding, the output layer,
     * the router or the attention core unless fp8_attention), on top of `precision`, which
     * stays the weights' and activations' type */
    ModelFp8Recipe fp8;
    ModelFp8Format fp8_format;
    int fp8_param_gather; /* the FP8 copy is the only low-precision weight (Megatron's
                             --fp8-param-gather): no bf16 weights, parameters gathered in FP8 */
    int fp8_amax_history; /* delayed scaling's amax history length (Transformer Engine: 1024) */
    int fp8_attention;    /* the attention core in FP8 too (Megatron-Core's fp8_dot_product_attention) */
    int fp8_dispatch;     /* MoE tokens dispatched to the experts in FP8 with their scales, as
                             DeepSeek-V3 (the combine stays in the activation dtype) */
    /* FP8 weights and saved inputs keep a transposed copy, as on devices whose FP8 GEMMs take
     * only the TN layout (Hopper): -1 auto (the simulator sets it from the device), 0, 1 */
    int fp8_transpose;
    /* training hyperparameters (the executor's): warm-up then cosine decay to min_lr */
    double lr, min_lr;
    int warmup_steps;
    double weight_decay, grad_clip; /* grad_clip: global norm; 0 = none */
    double beta1, beta2, adam_eps, momentum;
    int steps;
    uint64_t seed;
    char data[256]; /* training text or llm.c .bin token file; empty: the built-in text */
    /* the framework that runs the job (the exports' names): what it overlaps, how it recomputes,
     * which kernels it runs; its settings are profiles/frameworks/<name>.json (sim/framework.c) */
    ModelFramework framework;
} ModelJob;

typedef struct {
    ModelConfig model;
    ModelLayout layout;
    ModelJob job;
} ModelSpec;

/* Derived sizes, computed by model_spec_check. Names follow the Korthikanti notation. */
typedef struct {
    int gpus;         /* dp * tp * pp * cp */
    int m;            /* micro-batches per step per data-parallel rank */
    int p, v, t, c;   /* pp, vpp, tp, cp */
    int dp;
    int chunks;       /* p * v model chunks */
    int chunk_layers; /* layers per model chunk of an even split; 0 when the split is uneven:
                         model_chunk_layers gives every chunk's */
    int uneven;       /* layout.stage_layers splits the layers (vpp 1) */
    int b, s;         /* micro-batch, sequence */
    int s_loc;        /* s / cp: tokens of a sequence on this rank */
    int s_sp;         /* s_loc / tp with SP, else s_loc: tokens in the norm/dropout regions */
    int h, hd;
    int heads_loc, kv_loc;   /* per TP rank */
    int q_loc, kv_width_loc; /* heads_loc * hd, kv_loc * hd */
    int kv2_loc;             /* a token's keys and values per TP rank: 2 * kv_width_loc, with MLA
                                heads_loc * (qk_hd + v_hd) (kv_width_loc their mean) */
    int ffn_loc;             /* ffn / tp */
    int ffn_out_loc;         /* fc1 output width per TP rank: ffn_loc (GELU) or 2*ffn_loc (SwiGLU) */
    int vocab_pad, vocab_loc;
    int zero_group; /* ranks that shard ZeRO state and reduce gradients: dp_shard * cp */
    int dp_shard, dp_rep; /* HSDP: dp = dp_shard x dp_rep (dp, 1 without it) */
    int pp_split;   /* TP ranks a pipeline transfer is split over and re-gathered by (Megatron's
                       scatter/gather: tp without SP when tp divides h; else 1) */
    /* attention widths: query/key heads qk_hd wide, value heads v_hd (both hd but with MLA);
     * o_loc = heads_loc * v_hd, the attention output per TP rank */
    int qk_hd, v_hd, o_loc;
    /* mixture of experts (0 when dense) */
    int moe;            /* the model has MoE layers */
    int ep, etp, edp;   /* expert parallel, expert tensor parallel, expert data parallel */
    int experts_loc;    /* routed experts per rank: experts / ep */
    int eff_loc;        /* a routed expert's inner width per rank: expert_ffn / etp */
    int eff_out_loc;    /* its fc1 output: 2 * eff_loc (SwiGLU) or eff_loc */
    int sff_loc, sff_out_loc; /* the shared experts' inner width / fc1 output per TP rank */
    int64_t tokens;     /* tokens entering a MoE layer on this rank per micro-batch: b x s_sp */
    double imbalance;   /* the job's moe_imbalance, 1 when it forces the balance (or no MoE) */
    int64_t routed;     /* token copies an expert rank's GEMMs process per micro-batch: tokens x
                           topk x etp x imbalance (capacity: the capacity's), rounded up */
    PxDtype param, act, grad;
    int master; /* 1 when an fp32 master copy exists (precision is not fp32) */
    int fp8;    /* the job's ModelFp8Recipe (MODEL_FP8_NONE: no FP8 GEMMs) */
    int fp8_wt; /* FP8 weights keep a transposed copy: fp8_transpose, or MXFP8, whose scales run
                   along the reduction dimension */
    /* the global chunk holding the prediction modules (chunks - 1 but with a standalone MTP
     * stage); the chunks after it, up to the last, pass the main hidden states and each
     * module's output on: 1 + mtp_layers times a layer's activation per transfer */
    int mtp_chunk;
    /* ZeRO-2/3 with pp > 1 as torchtitan (FSDP2) runs it (docs/time.md, "Sharded data
     * parallelism with a pipeline"): gradients accumulate unsharded over a stage's
     * micro-batches and are reduce-scattered once per step; ZeRO-3's parameters are gathered
     * once per step and stay gathered across the stage's micro-batches */
    int zero_per_step;
    /* `selective` recompute as the job's framework runs it op by op (torchtitan's op-level
     * selective activation checkpointing): every other matmul and every elementwise op of a
     * layer recomputed before its backward (docs/time.md, "Frameworks") */
    int recompute_op;
    /* the job's framework runs its norms as eager Python modules and the job is not compiled
     * (fused_kernels 0): six kernels where a fused norm makes one (model/ops.c's norm) */
    int eager_norms;
    /* the job's framework runs its attention on FlashAttention-2's kernels (PyTorch's SDPA of
     * 2024: fms-fsdp), which Hopper runs at a lower rate than the fused kernels Megatron's
     * Transformer Engine calls (docs/time.md, "Frameworks") */
    int attn_fa2;
    /* its rotary embedding as eager PyTorch runs it (the job not compiled): bytes per element
     * of the queries and keys and kernels per tensor, each pass (0: fused, not priced) */
    double rope_eager_bytes;
    int rope_eager_kernels;
    /* bytes the framework's AdamW step moves per element of the rank's optimizer shard, norm
     * and clipping included (0: the fused count; docs/time.md, "Frameworks") */
    double adamw_step_bytes;
    /* the layouts the job's framework runs, from its profile (0: every one): bit z of
     * fw_zero_stages for ZeRO-z (fw_zero_stages_pp with pp > 1, fw_zero_stages_cp with cp > 1),
     * bit c of fw_cp_comm for
     * ModelCpComm c, of fw_moe_dispatch for ModelMoeDispatcher; fw_dp_only: data parallelism
     * only (model_framework_refusal) */
    unsigned fw_zero_stages, fw_zero_stages_pp, fw_zero_stages_cp, fw_cp_comm, fw_moe_dispatch;
    int fw_dp_only;
    /* context parallelism's attention is Transformer Engine's (AttnFuncWithCPAndKVP2P,
     * ...KVAllGather, ...QKVOA2A): the copies, merges and gradient adds around its kernels are
     * an op of their own (model/ops.c cp_passes; docs/time.md, "Context parallelism"). Set by
     * the simulator where the framework runs TE on a GPU (sim_cp_te), 0 from model_spec_check:
     * the executor's cp does its own passes inside its core op */
    int cp_te;
    /* context parallelism's attention is PyTorch's context_parallel ring (torchtitan): its
     * eager copies, fp32 merges and gradient adds are the same op (model/ops.c torch_ring_fwd,
     * torch_ring_bwd). Set by the simulator (sim_cp_torch), 0 from model_spec_check */
    int cp_torch;
} ModelDims;

/* The rule a layout broke, in PxError.code after model_spec_check fails (0: not a rule). */
typedef enum {
    MODEL_RULE_NONE = 0,
    MODEL_RULE_DEGREES,       /* a degree out of range */
    MODEL_RULE_GPUS,          /* tp x pp x cp (x dp) against the GPUs */
    MODEL_RULE_POSITIONS,     /* sequence longer than the learned positions */
    MODEL_RULE_HEADS,         /* tp against heads, key/value heads, ffn */
    MODEL_RULE_SP_TP,         /* sequence parallelism without tp */
    MODEL_RULE_VPP,           /* virtual stages against pp and the schedule */
    MODEL_RULE_LAYERS,        /* pp x vpp against the layers */
    MODEL_RULE_ZERO_PP,       /* ZeRO-2/3 with pipeline parallelism (no longer broken: priced) */
    MODEL_RULE_BATCH,         /* global batch against micro-batch x dp */
    MODEL_RULE_INTERLEAVED_M, /* interleaving needs a multiple of pp micro-batches */
    MODEL_RULE_SEQUENCE,      /* cp (and tp with SP) against the sequence */
    MODEL_RULE_JOB,           /* precision, gradients, dropout, padding */
    MODEL_RULE_SPLIT,         /* an uneven split's stage layers: count, values, sum, vpp */
    MODEL_RULE_EXPERTS,       /* ep / etp against the experts and the stage's ranks */
    MODEL_RULE_CP_CORE,       /* the ring (cp_comm p2p) without the fused attention core */
    MODEL_RULE_COUNT
} ModelRule;

const char *model_rule_name(ModelRule r);

/* Validates the layout against the model, job and GPU count (gpus 0: not checked; dp 0: filled
 * from the GPUs) and fills dims. PX_EINPUT with one line naming the rule that is broken. */
int model_spec_check(ModelSpec *s, int gpus, ModelDims *dims, PxError *err);

/* What the executor runs (model/runnable.c), one statement that the executor's refusal at
 * start, the planner for this machine's cluster and `validate` all consult: 0 when it runs the
 * checked spec s (dims d from model_spec_check) on a GPU (gpu 1: CUDA, bf16 or fp16) or on the
 * CPU (gpu 0: fp32); else 1 with a sentence in why naming the plan setting it does not run
 * (docs/executor.md, "What the executor runs"). */
int model_exec_refusal(const ModelSpec *s, const ModelDims *d, int gpu, char *why, size_t cap);
/* Whether the job's framework runs the layout at all (its profile's zero_stages,
 * zero_stages_pp, cp_comm_types, dp_only; d from model_spec_check): 0, or 1 with why filled,
 * e.g. "torchtitan does not run ZeRO-2 (it runs ZeRO 0, 3: profiles/frameworks/torchtitan.json)".
 * The planner ranks only what the framework runs; simulate prices the layout as given and
 * says so. */
int model_framework_refusal(const ModelSpec *s, const ModelDims *d, char *why, size_t cap);

const char *model_recompute_name(ModelRecompute r);
const char *model_fp8_recipe_name(ModelFp8Recipe r); /* "none", "delayed", ... "mxfp8" */
int model_fp8_recipe_from_name(const char *s);       /* -1 when unknown */
const char *model_fp8_format_name(ModelFp8Format f); /* "hybrid", "e4m3" */
int model_fp8_format_from_name(const char *s);

/* How recipe r scales an FP8 matrix stored rows x cols (quantized along its rows: the GEMM
 * reduces over cols), kernels/kernels.h's KernFp8 layout: one scale per block_r x block_c
 * block, fp32 or E8M0 (one byte). weight: a weight matrix (blockwise: 128 x 128) rather than an
 * activation or gradient (1 x 128). */
typedef struct {
    int64_t block_r, block_c;
    int e8m0;
} ModelFp8Scaling;
void model_fp8_scaling(ModelFp8Recipe r, int weight, int64_t rows, int64_t cols, ModelFp8Scaling *out);
/* Bytes of the scales of such a matrix, and of the matrix with them (rows x cols + scales). */
uint64_t model_fp8_scale_bytes(ModelFp8Recipe r, int weight, int64_t rows, int64_t cols);
uint64_t model_fp8_bytes(ModelFp8Recipe r, int weight, int64_t rows, int64_t cols);
/* --fp8-dispatch's bytes of rows x cols activations from `sources` senders: the elements and,
 * with row-wise scales (blockwise, mxfp8), each row's own (model_fp8_bytes); with a per-tensor
 * scale (tensorwise, delayed) each sender's one fp32 scale, which travels with its rows to
 * every peer (a peer's rows decode with their sender's scale). */
uint64_t model_fp8_dispatch_bytes(ModelFp8Recipe r, int64_t rows, int64_t cols, int sources);
/* 1 when --fp8-dispatch quantizes the dispatched rows with delayed scaling: the delayed recipe,
 * the all-to-all dispatcher and rows that leave the rank (ep x etp > 1). Their amax history
 * and decode factor are one more column of the experts' fc1 weight's <w>.fp8_amax (3 x
 * experts_loc + 1 columns), per MoE layer and rank. */
int model_fp8_dispatch_history(const ModelSpec *s, const ModelDims *d);
const char *model_schedule_name(ModelSchedule s);
const char *model_optimizer_name(ModelOptimizer o);
int model_recompute_from_name(const char *s); /* -1 when unknown */
int model_schedule_from_name(const char *s);
int model_optimizer_from_name(const char *s);
const char *model_cp_comm_name(ModelCpComm c); /* "p2p", "allgather", "a2a" */
int model_cp_comm_from_name(const char *s);    /* -1 when unknown */
int model_moe_dispatcher_from_name(const char *s); /* -1 when unknown */
const char *model_moe_dispatcher_name(ModelMoeDispatcher k); /* "alltoall", "allgather", "flex" */
/* Megatron-Core rank order: tp fastest, then cp, dp, pp. */
int model_rank(const ModelLayout *l, int tp, int cp, int dp, int pp);
void model_rank_coords(const ModelLayout *l, int rank, int *tp, int *cp, int *dp, int *pp);
/* Megatron-Core's expert rank order inside a pipeline stage: etp fastest, then ep, then
 * expert data parallel (the layout's ep and etp resolved: model_spec_check fills them). */
void model_expert_coords(const ModelLayout *l, int rank, int *etp, int *ep, int *edp, int *pp);
/* Global model chunk held as local chunk j by stage s (Megatron interleaving): j * p + s. */
static inline int model_global_chunk(const ModelDims *d, int stage, int j) { return j * d->p + stage; }
/* The layers of global model chunk gc: returns their count, *first gets the first (global)
 * layer. Even splits give every chunk chunk_layers; an uneven split gives stage gc (vpp 1)
 * layout.stage_layers[gc], after the stages before it. Every loop over a chunk's layers goes
 * through here. */
int model_chunk_layers(const ModelSpec *s, const ModelDims *d, int gc, int *first);
/* Layers of a chunk as the tables and graphs walk them: one run per layer, or (compact) one per
 * kind, dense then MoE, each starting at the chunk's first layer of that kind with count =
 * the chunk's layers of it; the last chunk ends with its prediction modules' layers (layers +
 * i), one run each. */
typedef struct {
    int first, count, moe;
} ModelLayerRun;
/* Fills out (capacity cap: model_chunk_runs_count) and returns the runs of global chunk gc. */
int model_chunk_runs(const ModelSpec *s, const ModelDims *d, int gc, int compact,
                     ModelLayerRun *out, int cap);
int model_chunk_runs_count(const ModelSpec *s, const ModelDims *d, int gc, int compact);
/* The layers pipeline stage `stage` holds over all its chunks (*first: its first chunk's first
 * layer; contiguous only when vpp is 1). */
int model_stage_layers(const ModelSpec *s, const ModelDims *d, int stage, int *first);
/* Checks a split of `layers` over the pp x vpp virtual stages (layout.stage_layers when
 * n_stage_layers > 0, in Megatron-Core's virtual-stage order: global chunk j * pp + s):
 * one entry per virtual stage, at least 1 but in the first (embedding) and last (loss) ones,
 * summing to the layers. PX_EINPUT names the value at fault. */
int model_split_check(const ModelLayout *l, int layers, PxError *err);
/* Resolves the layout's Megatron-Core form (embed/loss_in_split, first/last_stage_layers or
 * pp_layout; at most one) into stage_layers, and vpp from a layout string when vpp is 1.
 * A stage_layers already there (a plan read back) must agree. PX_EINPUT names the fault. */
int model_split_resolve(const ModelConfig *c, ModelLayout *l, PxError *err);
/* Parses Megatron-Core's layout string ("Et*3|(tt|)*2,t*2mL"; `what` names it in messages,
 * which point at the offending character) into l->stage_layers (and l->vpp when 1), and
 * l->mtp_from_last from the stage of its prediction modules ("...,m|L": 1). */
int model_layout_string_parse(const char *text, const char *what, const ModelConfig *c,
                              ModelLayout *l, PxError *err);
/* The planner's balanced split of `layers` over `pp` stages (out: pp entries): every stage
 * gets layers / pp, and the remaining layers go one each to the middle stages, the last
 * middle stage first (it holds the fewest activation sets in flight under 1F1B, p - s on
 * stage s, and neither the embedding nor the output layer); when the remainder outnumbers
 * the middle stages, to one end: the first stage (spill_last 0) or the last (1). docs/planner.md
 * gives the reasoning. */
void model_split_balanced(int layers, int pp, int spill_last, int *out);
/* A Megatron-Core layout string that splits c's layers over pp x vpp virtual stages when no
 * even split does (the embedding and the loss each weighed as a layer, the rest balanced:
 * DeepSeek-V3 on pp 8 x vpp 4 "Et|(tt|)*30,mL"), into buf: 1, or 0 when there is none. */
int model_split_layout_example(const ModelConfig *c, int pp, int vpp, char *buf, size_t cap);
/* The split and how it was said, for people: "embedding and loss each counted as a layer:
 * 1,2*62,1" (runs of three or more as N*k), "layout Et*3|(t*4|)*14,t*2mL: 3,4*14,2", or
 * "1,2,1". */
void model_split_describe(const ModelLayout *l, char *buf, size_t cap);
/* "1,2,1" into buf. */
void model_split_format(const int *stage_layers, int n, char *buf, size_t cap);
/* Parses "1,2,1" (what names the flag or key in messages) into l->stage_layers. */
int model_split_parse(const char *text, const char *what, ModelLayout *l, PxError *err);

/* ---- the fields of the layout and the job, described once (fields.c) ----
 * One row per field of ModelLayout and ModelJob: its JSON key, type, range and default, and its
 * command-line flag with metavar and help. The rows drive the layout's and the job's JSON (read
 * and written), model_spec_defaults, and the front end's knobs (cli/options.c makes its option
 * rows, --help and parsing from them), so a new field is its member in the struct and its row.
 * What a field does beyond its type's handling is a hook of its row (--fsdp also sets zero 3,
 * --precision fp8 the FP8 recipe); docs/formats.md lists the keys.
 *
 * Example:
 *   const ModelField *f = model_field(MODEL_FIELD_TP);
 *   model_field_parse(f, "8", 0, &spec, &err);          // --tp 8: spec.layout.tp = 8
 *   cJSON *j = model_layout_to_json(&spec.layout);      // {"dp": ..., "tp": 8, ...}
 */

/* The fields: the layout's, then the job's, each in the order their JSON writes them. */
typedef enum {
    MODEL_FIELD_DP = 0, MODEL_FIELD_TP, MODEL_FIELD_PP, MODEL_FIELD_CP, MODEL_FIELD_VPP,
    MODEL_FIELD_ZERO, MODEL_FIELD_SP, MODEL_FIELD_RECOMPUTE, MODEL_FIELD_SCHEDULE,
    MODEL_FIELD_OVERLAP_DP, MODEL_FIELD_OVERLAP_TP, MODEL_FIELD_TP_BWD_EXPOSED,
    MODEL_FIELD_STAGE_LAYERS, MODEL_FIELD_EMBED_IN_SPLIT, MODEL_FIELD_LOSS_IN_SPLIT,
    MODEL_FIELD_FIRST_STAGE_LAYERS, MODEL_FIELD_LAST_STAGE_LAYERS, MODEL_FIELD_PP_LAYOUT,
    MODEL_FIELD_CP_COMM, MODEL_FIELD_EP, MODEL_FIELD_ETP, MODEL_FIELD_OVERLAP_EP, MODEL_FIELD_FSDP,
    MODEL_FIELD_KEEP_GATHERED, MODEL_FIELD_PREFETCH, MODEL_FIELD_BUCKET_BYTES,
    MODEL_FIELD_DP_SHARD, MODEL_FIELD_DP_REPLICATE, MODEL_FIELD_OFFLOAD_OPTIMIZER,
    MODEL_FIELD_OFFLOAD_ACTIVATIONS,
    MODEL_FIELD_LAYOUT_END, /* the job's from here */
    MODEL_FIELD_GLOBAL_BATCH = MODEL_FIELD_LAYOUT_END, MODEL_FIELD_MICRO_BATCH,
    MODEL_FIELD_MICRO_BATCHES, MODEL_FIELD_SEQ_LEN, MODEL_FIELD_PRECISION, MODEL_FIELD_GRAD_DTYPE,
    MODEL_FIELD_OPTIMIZER, MODEL_FIELD_LR, MODEL_FIELD_MIN_LR, MODEL_FIELD_WARMUP_STEPS,
    MODEL_FIELD_WEIGHT_DECAY, MODEL_FIELD_GRAD_CLIP, MODEL_FIELD_BETA1, MODEL_FIELD_BETA2,
    MODEL_FIELD_ADAM_EPS, MODEL_FIELD_MOMENTUM, MODEL_FIELD_STEPS, MODEL_FIELD_SEED,
    MODEL_FIELD_DATA, MODEL_FIELD_FLASH_ATTN, MODEL_FIELD_DROPOUT, MODEL_FIELD_PAD_VOCAB,
    MODEL_FIELD_VOCAB_PADDED, MODEL_FIELD_FUSED_KERNELS, MODEL_FIELD_CAUSAL_FLOPS, MODEL_FIELD_FRAMEWORK,
    MODEL_FIELD_TRAIN_TOKENS, MODEL_FIELD_MOE_IMBALANCE, MODEL_FIELD_MOE_FORCE_BALANCE,
    MODEL_FIELD_FP8, MODEL_FIELD_FP8_FORMAT, MODEL_FIELD_FP8_PARAM_GATHER,
    MODEL_FIELD_FP8_AMAX_HISTORY, MODEL_FIELD_FP8_ATTENTION, MODEL_FIELD_FP8_DISPATCH,
    MODEL_FIELD_FP8_TRANSPOSE, MODEL_FIELD_MOE_DISPATCHER, MODEL_FIELD_MOE_CAPACITY_FACTOR,
    MODEL_FIELD_COUNT
} ModelFieldId;

typedef enum {
    MODEL_FT_INT = 0, /* int */
    MODEL_FT_BOOL,    /* int, 0 or 1: JSON false or true */
    MODEL_FT_DOUBLE,
    MODEL_FT_U64,     /* uint64_t: a JSON integer up to 2^53 */
    MODEL_FT_ENUM,    /* an enum, by its names (names[value]) */
    MODEL_FT_DTYPE,   /* a PxDtype among names (fp32, bf16, fp16: PxDtype's first three) */
    MODEL_FT_STRING,  /* char[size] */
    MODEL_FT_INT_LIST, /* int[], its count at count_at */
    MODEL_FT_DERIVED  /* no member: a figure of ModelDims the JSON carries beside the fields */
} ModelFieldType;

typedef struct ModelField ModelField;
struct ModelField {
    ModelFieldId id;
    const char *key; /* the JSON key */
    ModelFieldType type;
    size_t at, size; /* the member's offset in ModelLayout (the layout's ids) or ModelJob, size */
    size_t count_at; /* INT_LIST: its count's offset */
    const char *const *names; /* ENUM, DTYPE: the values' names */
    int n_names;
    int required;  /* the JSON must have the key */
    double lo, hi; /* the JSON's range (INT, DOUBLE) */
    double def;    /* model_spec_defaults' value (STRING and INT_LIST: empty) */
    /* when the JSON writer writes the key (NULL: always), and the number it writes when that is
     * not the member's (NULL: the member) */
    int (*shown)(const ModelField *f, const void *obj, const ModelDims *d);
    double (*value)(const void *obj, const ModelDims *d);
    /* the command line: --flag METAVAR; a row without a metavar is a switch that sets the field
     * to 1 (to 0 when invert), and --no_flag (if any) sets it the other way */
    const char *flag, *metavar, *help;
    const char *no_flag, *no_help;
    int invert;
    /* the flag's own range, when not the JSON's (cli_range 1) */
    int cli_range;
    double cli_lo, cli_hi;
    /* DOUBLE: why a value outside the flag's range is refused ("must be in [0, 1)"; NULL: any
     * number); STRING: what the value is, when too long ("path") */
    const char *cli_msg;
    const char *cli_names; /* ENUM, DTYPE: the names an unknown value's message lists, when not
                              names[] ("fp32, bf16, fp16 or fp8") */
    /* hooks for what the type's handling does not do (NULL: the type's): the flag's value into
     * s (flag: "--pp-layers"; arg NULL for a switch, then on: the value it sets), and the key
     * read from j into obj (the ModelLayout or ModelJob) */
    int (*parse)(const ModelField *f, const char *flag, const char *arg, int on, ModelSpec *s,
                 PxError *err);
    int (*read)(const ModelField *f, const cJSON *j, const char *where, void *obj, PxError *err);
};

/* The rows in the order --help lists them (all MODEL_FIELD_COUNT of them), and one by id. */
int model_field_count(void);
const ModelField *model_field_at(int i);
const ModelField *model_field(ModelFieldId id);
/* The field's command-line value arg (NULL for a switch; no: its --no_flag was given) into s:
 * PX_EINPUT naming the flag and the value. */
int model_field_parse(const ModelField *f, const char *arg, int no, ModelSpec *s, PxError *err);

/* Every field at its default (model configuration zeroed). */
void model_spec_defaults(ModelSpec *s);
/* The layout's and the job's JSON (docs/formats.md). Reading warns about unknown keys and
 * names the key path at fault (PX_EINPUT); missing optional keys keep out's values. */
cJSON *model_layout_to_json(const ModelLayout *l);
int model_layout_from_json(const cJSON *j, const char *where, ModelLayout *out, PxError *err);
/* training: the job; dims (optional) adds derived figures (micro-batches, padded vocabulary) */
cJSON *model_job_to_json(const ModelJob *t, const ModelDims *dims);
int model_job_from_json(const cJSON *j, const char *where, ModelJob *out, PxError *err);

/* ---- plan: the hand-off from the planner to the executor (docs/formats.md's Plan) ----
 * A plan is self-contained: besides the layout and the job it carries the cluster profile the
 * planner resolved (every --set applied, measurements included) and the prediction made on it,
 * so the same file gives the same prediction on any host. schema_version 1 plans carried only
 * the profile's name: they still load, the name resolved on this host, with a warning. */

enum { MODEL_PLAN_SCHEMA = 2 };

typedef struct {
    ModelSpec spec;
    char cluster[256];   /* the profile's name or path as the planner was given it */
    ProfCluster profile; /* the resolved profile (owned: model_plan_free) */
    int gpus;            /* world size */
    cJSON *prediction;   /* the simulator's prediction, carried verbatim (owned; may be NULL) */
    int schema_version;  /* as read (2 when made here) */
} ModelPlan;

/* Reads and validates a plan (the layout against its world size, the inline profile).
 * PX_EINPUT names the key. */
int model_plan_read(const char *path, ModelPlan *out, PxError *err);
int model_plan_from_json(const cJSON *j, const char *origin, ModelPlan *out, PxError *err);
/* A plan of spec on `profile` (copied) for `gpus` ranks with its prediction (taken over; may be
 * NULL); cluster_ref names the profile as the user gave it. */
int model_plan_init(ModelPlan *out, const ModelSpec *spec, const char *cluster_ref,
                    const ProfCluster *profile, int gpus, cJSON *prediction, PxError *err);
/* A deep copy (its own profile and prediction). */
int model_plan_copy(ModelPlan *out, const ModelPlan *src, PxError *err);
/* The plan's JSON (schema_version 2); the profile and the prediction are copied in. */
cJSON *model_plan_to_json(const ModelPlan *p);
void model_plan_free(ModelPlan *p);

/* ---- memory categories and communication kinds (same names in sim and exec) ---- */

typedef enum {
    MODEL_WEIGHTS = 0,
    MODEL_GRADS,
    MODEL_MASTER,
    MODEL_OPTIMIZER,
    MODEL_ACTIVATIONS,
    MODEL_COMM_BUFFERS,
    MODEL_WORKSPACE,
    MODEL_RUNTIME,
    MODEL_CAT_COUNT
} ModelCategory;

typedef enum {
    MODEL_DP_ALLREDUCE = 0,
    MODEL_DP_REDUCE_SCATTER,
    MODEL_DP_ALL_GATHER,
    MODEL_TP_ALLREDUCE,
    MODEL_TP_ALL_GATHER,
    MODEL_TP_REDUCE_SCATTER,
    MODEL_PP_SEND,
    MODEL_PP_RECV,
    MODEL_CP_ALL_GATHER,
    MODEL_CP_REDUCE_SCATTER,
    MODEL_EMBED_ALLREDUCE, /* tied embedding gradients between first and last stage */
    MODEL_EP_ALL_TO_ALL,   /* MoE token dispatch and combine over the expert-parallel group */
    MODEL_ETP_ALL_GATHER,  /* routed tokens gathered over the expert-tensor-parallel group */
    MODEL_ETP_REDUCE_SCATTER,
    MODEL_EDP_ALLREDUCE,   /* routed experts' gradients over the expert-data-parallel group */
    MODEL_EDP_REDUCE_SCATTER,
    MODEL_EDP_ALL_GATHER,
    MODEL_DPR_ALLREDUCE,   /* HSDP: each gradient shard over its dp_replicate replicas */
    MODEL_CP_P2P,          /* cp_comm p2p: K, V (and their gradients) sent around the CP ring */
    MODEL_CP_ALL_TO_ALL,   /* cp_comm a2a: Q, K, V and the output between sequence and head splits */
    MODEL_EP_ALL_GATHER,   /* the all-gather dispatcher: every token gathered over etp x ep */
    MODEL_EP_REDUCE_SCATTER, /* and the experts' outputs reduce-scattered back */
    MODEL_COMM_COUNT
} ModelComm;

typedef enum { MODEL_COLL_ALLREDUCE = 0, MODEL_COLL_ALL_GATHER, MODEL_COLL_REDUCE_SCATTER, MODEL_COLL_SEND, MODEL_COLL_RECV, MODEL_COLL_ALL_TO_ALL } ModelCollective;
typedef enum { MODEL_GROUP_TP = 0, MODEL_GROUP_CP, MODEL_GROUP_DP, MODEL_GROUP_PP, MODEL_GROUP_EMBED, MODEL_GROUP_EP, MODEL_GROUP_ETP, MODEL_GROUP_EDP, MODEL_GROUP_DPR, MODEL_GROUP_ETP_EP } ModelGroup;

const char *model_category_name(ModelCategory c);
/* 1 when the layout keeps category c in host memory rather than on the device: master and
 * optimizer with offload_optimizer (docs/memory.md, "Offload"). The tensor table lists such
 * tensors as usual; the device arenas leave them out. Saved activations with
 * offload_activations move between the two during the step and are not reported here. */
int model_category_on_host(const ModelLayout *l, ModelCategory c);
const char *model_comm_name(ModelComm k);
int model_comm_from_name(const char *s);
ModelCollective model_comm_collective(ModelComm k);
ModelGroup model_comm_group(ModelComm k);
const char *model_group_name(ModelGroup g);

/* ---- a plan's prediction, read back ---- */

/* What a plan's prediction says of each pipeline stage, read back from its JSON to set beside
 * a measurement (the executor's summary): memory per category, communication per kind and
 * hardware FLOPs of one rank, and the stage's step and bubble. */
typedef struct {
    int stages;                         /* 0: the plan carries no prediction */
    uint64_t (*mem)[MODEL_CAT_COUNT];   /* [stage][category] bytes */
    uint64_t (*comm)[MODEL_COMM_COUNT]; /* [stage][kind] bytes per step */
    double *rank_flops;                 /* [stage] per step */
    double *step_s, *bubble_fraction;   /* [stage] */
    double job_step_s, job_bubble_fraction; /* of the stage that ends the step last */
} ModelPredicted;

/* Reads p->prediction (nothing when it has none: stages 0) for p's pp stages; PX_EINPUT names
 * a key that is missing or not a number. */
int model_predicted_read(const ModelPlan *p, ModelPredicted *out, PxError *err);
void model_predicted_free(ModelPredicted *m);

/* ---- tensor table ---- */

enum { MODEL_SHARD_TP = 1, MODEL_SHARD_SP = 2, MODEL_SHARD_CP = 4, MODEL_SHARD_DP = 8, MODEL_SHARD_EP = 16 };

/* What a tensor of the table is. The executor binds its views by role (with the layer for a
 * layer's tensors and the block for a block's state), never by name: names are for people,
 * and for the initial weights' random streams. A gradient carries its parameter's role in
 * MODEL_GRADS. The layer's saved activations are contiguous, in the order model_layer_acts
 * lists them. Enums only grow at the end of each group's range. */
typedef enum {
    MODEL_TR_NONE = 0,
    /* parameters */
    MODEL_TR_WTE, MODEL_TR_WPE,
    MODEL_TR_LN1_W, MODEL_TR_LN1_B, MODEL_TR_QKV_W, MODEL_TR_QKV_B, MODEL_TR_PROJ_W,
    MODEL_TR_PROJ_B, MODEL_TR_LN2_W, MODEL_TR_LN2_B, MODEL_TR_FC1_W, MODEL_TR_FC1_B,
    MODEL_TR_FC2_W, MODEL_TR_FC2_B,
    MODEL_TR_FINAL_LN_W, MODEL_TR_FINAL_LN_B, MODEL_TR_LOGITS_W,
    /* a parameter block's flat state (ZeRO shards, master copy, optimizer state) */
    MODEL_TR_W_SHARD, MODEL_TR_GRAD_SHARD, MODEL_TR_MASTER, MODEL_TR_ADAM_M, MODEL_TR_ADAM_V,
    MODEL_TR_MOMENTUM, MODEL_TR_ADAM8_M, MODEL_TR_ADAM8_V, MODEL_TR_ADAM8_ABSMAX,
    /* a transformer layer's saved activations (model_layer_acts) */
    MODEL_TR_LN1_IN, MODEL_TR_QKV_IN, MODEL_TR_QKV_OUT, MODEL_TR_ATTN_LSE, MODEL_TR_SOFTMAX,
    MODEL_TR_SOFTMAX_MASK, MODEL_TR_SOFTMAX_DROP, MODEL_TR_PROJ_IN, MODEL_TR_PROJ_IN_FP8,
    MODEL_TR_ATTN_DROP_MASK,
    MODEL_TR_LN2_IN, MODEL_TR_FC1_IN, MODEL_TR_ACT_IN, MODEL_TR_FC2_IN, MODEL_TR_MLP_DROP_MASK,
    /* the embedding's and the output layer's saved activations */
    MODEL_TR_EMBED_DROP_MASK, MODEL_TR_FINAL_LN_IN, MODEL_TR_LOGITS_IN, MODEL_TR_LOSS_PROBS,
    /* workspace */
    MODEL_TR_WS_OUT, MODEL_TR_WS_DX_A, MODEL_TR_WS_DX_B, MODEL_TR_WS_DHID, MODEL_TR_WS_DQKV,
    MODEL_TR_WS_DFFN, MODEL_TR_WS_DACT, MODEL_TR_WS_FLASH_D, MODEL_TR_WS_DSCORES,
    MODEL_TR_WS_RECOMPUTE, MODEL_TR_DATA_BATCH, MODEL_TR_WS_XENT,
    /* communication buffers */
    MODEL_TR_PP_SEND, MODEL_TR_PP_RECV, MODEL_TR_SP_GATHER, MODEL_TR_CP_KV,
    MODEL_TR_ZERO_GRAD_BUCKET, MODEL_TR_ZERO_PARAM_GATHER,
    /* a MoE layer's parameters (its shared experts are the layer's MLP: FC1_W, FC2_W) */
    MODEL_TR_ROUTER_W, MODEL_TR_ROUTER_B, MODEL_TR_EXP_FC1_W, MODEL_TR_EXP_FC1_B,
    MODEL_TR_EXP_FC2_W, MODEL_TR_EXP_FC2_B, MODEL_TR_SHARED_GATE_W,
    /* multi-head latent attention's parameters (in place of QKV_W), attention sinks */
    MODEL_TR_Q_A_W, MODEL_TR_Q_NORM_W, MODEL_TR_Q_B_W, MODEL_TR_KV_A_W, MODEL_TR_KV_NORM_W,
    MODEL_TR_KV_B_W, MODEL_TR_SINKS,
    /* a multi-token prediction module's own parameters (its layer is an ordinary layer) */
    MODEL_TR_MTP_ENORM_W, MODEL_TR_MTP_HNORM_W, MODEL_TR_MTP_EH_W, MODEL_TR_MTP_NORM_W,
    /* a MoE layer's saved activations (model_moe_acts), after the layer's */
    MODEL_TR_ROUTER_PROBS, MODEL_TR_ROUTE_IDX, MODEL_TR_ROUTE_W, MODEL_TR_EXP_IN,
    MODEL_TR_EXP_ACT_IN, MODEL_TR_EXP_FC2_IN, MODEL_TR_EXP_OUT,
    /* the all-gather dispatcher's: the gathered tokens' routing to this rank's experts */
    MODEL_TR_EP_IDX, MODEL_TR_EP_W,
    /* multi-head latent attention's saved latents */
    MODEL_TR_Q_LAT, MODEL_TR_KV_LAT,
    /* a MoE layer's workspace and all-to-all buffers */
    MODEL_TR_WS_EXP_DFFN, MODEL_TR_WS_EXP_DX, MODEL_TR_EP_SEND, MODEL_TR_EP_RECV,
    /* a multi-token prediction module's saved activations: the shifted tokens' normed
     * embedding and the normed hidden state, concatenated (eh_proj's input) */
    MODEL_TR_MTP_EH_IN,
    /* per-head RMSNorm weights of the queries and keys (Qwen3's q_norm, k_norm) */
    MODEL_TR_QN_W, MODEL_TR_KN_W,
    /* FP8 training: a linear weight's FP8 copy (weights, `of` names the parameter), its
     * transposed copy, delayed scaling's amax history and scales of the GEMMs that read it;
     * the workspace FP8 GEMMs quantize their operands in */
    MODEL_TR_FP8_W, MODEL_TR_FP8_WT, MODEL_TR_FP8_AMAX, MODEL_TR_WS_FP8,
    /* context parallelism's all-gather: the gathered K and V in global token order, the
     * gradient of the full sequence's K and V (cp.kv holds them in cp rank order) */
    MODEL_TR_CP_KV_FULL, MODEL_TR_CP_DKV,
    /* context parallelism's all-to-all (Ulysses): what a rank sends and what it receives */
    MODEL_TR_CP_A2A_SEND, MODEL_TR_CP_A2A_RECV,
    /* context parallelism's K, V ring (p2p): a block's partial attention output and
     * log-sum-exp, its K, V gradient */
    MODEL_TR_CP_OUT_PART, MODEL_TR_CP_LSE_PART, MODEL_TR_CP_DKV_PART,
    /* multi-head latent attention's temporaries (model_mla_work) */
    MODEL_TR_WS_MLA,
    /* the all-gather dispatcher's buffers over etp x ep: the gathered tokens (and the outputs
     * reduce-scattered), the gathered dense scores and routing map, the weights' gradient */
    MODEL_TR_EP_GATHER, MODEL_TR_EP_PROBS, MODEL_TR_EP_MAP, MODEL_TR_EP_DW,
    /* MXFP8 parameters under ZeRO-3 (model_fp8_mx_gather_copies): a weight's whole E8M0 scales
     * of both copies, which every rank keeps (the gathers move the elements only) */
    MODEL_TR_FP8_MX_SCALES,
    MODEL_TR_COUNT
} ModelTensorRole;

/* A layer's saved activations: roles MODEL_TR_LN1_IN ... MODEL_TR_MLP_DROP_MASK; a MoE layer's
 * add MODEL_TR_ROUTER_PROBS ... MODEL_TR_EP_W. */
enum { MODEL_LAYER_ACTS = MODEL_TR_MLP_DROP_MASK - MODEL_TR_LN1_IN + 1 };
enum { MODEL_MOE_ACTS = MODEL_TR_EP_W - MODEL_TR_ROUTER_PROBS + 1 };
/* Multi-head latent attention's: MODEL_TR_Q_LAT, MODEL_TR_KV_LAT. */
enum { MODEL_MLA_ACTS = MODEL_TR_KV_LAT - MODEL_TR_Q_LAT + 1 };

typedef struct {
    char name[56]; /* "layer.3.attn.qkv.w", "layer.3.attn.softmax", "zero.param_gather" */
    ModelTensorRole role;
    ModelCategory cat;
    PxDtype dtype;
    int ndim;
    int64_t shape[4];
    uint64_t numel;
    uint64_t bytes;
    int chunk;          /* local model chunk, -1 for rank-wide tensors */
    int layer;          /* global layer, -1 for none */
    int block;          /* parameter block (ZeRO shard and bucket unit), -1 for none */
    int per_microbatch; /* 1: a saved activation, one copy per (chunk, micro-batch) in flight */
    int shard;          /* MODEL_SHARD_* flags */
    int repeat;         /* identical layers this entry stands for: 1, or a chunk's layers in a
                           compact table */
    uint64_t scale_bytes; /* an FP8 tensor's scales, at the end of its bytes (KernFp8 layout) */
    ModelTensorRole of;   /* an FP8 copy or amax history: the parameter's role */
    int groups;           /* an FP8 tensor of a MoE layer's experts: one KernFp8 matrix per local
                             expert, bytes / groups each; else 1 */
} ModelTensor;

/* A parameter block: the embedding, one layer, or the final norm with the output layer.
 * ZeRO shards each block's flat buffer over zero_group ranks, padded to a multiple of it. */
typedef struct {
    char name[32];
    int chunk, layer;
    uint64_t numel;       /* parameters in the block on this rank (after TP) */
    uint64_t shard_numel; /* ceil(numel / zero_group) */
    int repeat;           /* identical blocks it stands for (compact tables) */
    int experts;          /* a MoE layer's routed experts ("layer.<l>.experts"): sharded and
                             reduced over the expert-data-parallel group */
    int group;            /* ranks that shard its ZeRO state and reduce its gradients */
    uint64_t fp8_numel;   /* of numel, the FP8 GEMMs' weights (model_fp8_weight): stored in FP8
                             and gathered in FP8 with --fp8-param-gather */
    int fp8_weights;      /* FP8 GEMM weight matrices in it (a MoE layer's experts: one per local
                             expert), each with one scale */
    int fp8_scales;       /* their scales (model_fp8_scaling's blocks): one a matrix with a
                             per-tensor recipe, one a 128 x 128 tile with blockwise; with
                             mxfp8 a 1 x 32 block of the row-wise copy and a 32 x 1 one of
                             the column-wise copy */
} ModelBlock;

typedef struct {
    int stage;
    ModelTensor *t;
    int count, cap;
    ModelBlock *blocks;
    int n_blocks, blocks_cap;
    uint64_t *act_chunk_bytes; /* [v] saved activation bytes of one micro-batch per local chunk */
    uint64_t *act_layer_bytes; /* [v] the part of it saved by transformer layers (the same for
                                  every chunk: chunks of a stage hold equally many layers, since
                                  an uneven split has one chunk per stage) */
    uint64_t params;           /* parameters on this rank (after TP, before ZeRO) */
    uint64_t cat_bytes[MODEL_CAT_COUNT]; /* bytes per category weighted by repeat, saved
                                            activations counted once per chunk */
    int compact;                         /* built by model_tensors_build_compact */
    int borrowed; /* blocks and act_*_bytes belong to a ModelTableCache: not freed here */
} ModelTensorTable;

int model_tensors_build(const ModelSpec *s, const ModelDims *d, int stage, ModelTensorTable *out,
                        PxError *err);
/* A compact table: its sums (cat_bytes, act_*_bytes, params) and blocks equal the full table's,
 * each chunk's layers standing as one block with repeat = the chunk's layers; it lists no
 * tensors (count 0). The planner's fast path. */
int model_tensors_build_compact(const ModelSpec *s, const ModelDims *d, int stage,
                                ModelTensorTable *out, PxError *err);
/* A layer's block name, "layer.<layer>", into n (at least 18 bytes): the name the tables' blocks
 * and the ops' names start with. */
void model_block_name(char *n, int layer);
/* The planner's cache: compact tables put together from halves built once per distinct input
 * (the parameter half per tp, ZeRO stage and group; the activation half per tp, cp, sp,
 * micro-batch and recompute; each per stage shape). The result equals
 * model_tensors_build_compact's. A cache serves one model and job at a time. */
typedef struct ModelTableCache ModelTableCache;
ModelTableCache *model_table_cache_new(void); /* NULL when out of memory */
void model_table_cache_free(ModelTableCache *c);
int model_tensors_build_cached(ModelTableCache *c, const ModelSpec *s, const ModelDims *d,
                               int stage, ModelTensorTable *tt, PxError *err);
void model_tensors_free(ModelTensorTable *tt);
/* Bytes of one category, weighted by repeat (activations: one micro-batch of every chunk). */
uint64_t model_tensors_bytes(const ModelTensorTable *tt, ModelCategory c);
/* The FP8 GEMMs' workspace (ws.fp8), where an operand is quantized before its GEMM: 16 bytes of
 * fp32 scratch (delayed scaling's amax of the tensor being quantized, then E4M3's and E5M2's
 * largest values), the largest operand but the weights in the activation dtype (a GEMM's input
 * before it is quantized: a norm's or the attention core's output; with FP8 attention's output
 * in FP8, Q, K, V and that output side by side), then two FP8 copies of the
 * largest operand with scales (an output gradient row-wise and column-wise, or a re-gathered
 * input), each in the orientation that needs more scales when a transposed copy is kept; under
 * ZeRO-3, which keeps no FP8 copies of the weights, room for the largest weight matrix (one
 * expert's) cast for the GEMM that reads it, and for its transpose where one is kept. Every
 * part starts on a 16-byte boundary. Offsets in bytes from its start; total 0 without FP8. */
typedef struct {
    uint64_t scratch, act, q0, q1, w, wt;
    uint64_t act_bytes, q_bytes; /* the act part's and each FP8 copy's room */
    uint64_t w_bytes, wt_bytes;  /* ZeRO-3's weight casts (0 otherwise) */
    uint64_t total;
} ModelFp8Workspace;
/* ZeRO-3's FP8 parameter gather lays each gathered weight's elements out with its fp32 scale
 * after them, padded to this many bytes, so that the next weight's elements start 16-byte
 * aligned (cuBLASLt's FP8 GEMM) when each weight's are a multiple of 16 bytes. */
enum { MODEL_FP8_GATHER_SCALE_BYTES = 16 };
void model_fp8_workspace(const ModelSpec *s, const ModelDims *d, ModelFp8Workspace *out);
uint64_t model_fp8_workspace_bytes(const ModelSpec *s, const ModelDims *d); /* its total */
/* Saved activation bytes of one transformer layer and one micro-batch (the Korthikanti figure). */
uint64_t model_layer_activation_bytes(const ModelSpec *s, const ModelDims *d);

/* One tensor of a transformer layer's activations for one micro-batch, as the layer's forward
 * writes it and its backward reads it. The one description of them: the tensor table adds
 * those the recompute mode saves (per micro-batch) and sizes ws.recompute for the others,
 * which the backward re-creates; the executor binds both by role. */
typedef struct {
    ModelTensorRole role;
    const char *suffix; /* the tensor's name after "layer.<i>." */
    PxDtype dtype;      /* the activation dtype, fp32 (lse), uint8 (dropout masks), or FP8 (an
                           FP8 GEMM's input under FP8 training: rows x last dimension with its
                           scales, model_fp8_bytes) */
    int shard;          /* MODEL_SHARD_* */
    int ndim;
    int64_t shape[4];
    uint64_t numel, bytes;
    int present; /* the configuration computes it (flash attention, dropout ...) */
    int saved;   /* kept for the backward under the mode asked for; else recomputed */
} ModelLayerAct;

/* The MODEL_LAYER_ACTS activations of a dense layer in role order (out[i].role =
 * MODEL_TR_LN1_IN + i), `saved` under recompute mode `mode`. */
void model_layer_acts(const ModelSpec *s, const ModelDims *d, ModelRecompute mode,
                      ModelLayerAct out[MODEL_LAYER_ACTS]);
/* The same for global layer `layer`: in a MoE layer the MLP entries are its shared experts'
 * (absent without them). */
void model_layer_acts_at(const ModelSpec *s, const ModelDims *d, ModelRecompute mode, int layer,
                         ModelLayerAct out[MODEL_LAYER_ACTS]);
/* A MoE layer's MODEL_MOE_ACTS further activations (out[i].role = MODEL_TR_ROUTER_PROBS + i):
 * the router's fp32 scores, the chosen experts and their weights, the routed tokens as the
 * experts receive them, the experts' fc1 output and fc2 input, and their outputs back on the
 * token's rank (the weights' gradient reads them). */
void model_moe_acts(const ModelSpec *s, const ModelDims *d, ModelRecompute mode,
                    ModelLayerAct out[MODEL_MOE_ACTS]);
/* Multi-head latent attention's MODEL_MLA_ACTS further activations (out[i].role =
 * MODEL_TR_Q_LAT + i; absent without MLA): the query's latent (absent with q_lora_rank 0) and
 * the keys' and values' latent with the rotary key, both over the whole sequence (gathered
 * over TP) and before their norms, which the backward re-applies (docs/moe.md). */
void model_mla_acts(const ModelSpec *s, const ModelDims *d, ModelRecompute mode,
                    ModelLayerAct out[MODEL_MLA_ACTS]);

/* ws.mla, multi-head latent attention's temporaries of one micro-batch (the executor's
 * exec/train/mla.c): element offsets of its regions in the act dtype, N = b x s_loc rows and
 * R = b x s_sp. x: the up-projections' narrow outputs or their gradients (the rotary parts
 * gathered, the keys' non-rotary part) [N, max((heads + 2) x qk_rope, heads x qk_nope)];
 * lat: a latent after its norm [N, max(q_lora, kv_lora)]; dkv: the keys' and values' latent
 * gradient [N, kv_lora + qk_rope]; dq: the query latent's [N, q_lora]; qs, ks, z: a rank's
 * sequence shard of them, and of a norm's input gradient [R, ...]; dl: under FP8 the keys'
 * and values' latent gradient as kv_b's GEMM writes it [N, kv_lora] (empty otherwise). total:
 * its elements (0 without MLA); with SP at least a layer's gradients held whole on every TP
 * rank in fp32, as the scratch of their one all-reduce. */
typedef struct {
    uint64_t x, lat, dkv, dq, qs, ks, z, dl, total;
} ModelMlaWork;
void model_mla_work(const ModelSpec *s, const ModelDims *d, ModelMlaWork *out);

/* ---- op graph ---- */

typedef enum { MODEL_FWD = 0, MODEL_BWD, MODEL_RECOMPUTE, MODEL_STEP } ModelPhase;
typedef enum {
    MODEL_OP_MATMUL = 0,
    MODEL_OP_ATTENTION,
    MODEL_OP_NORM,
    MODEL_OP_ACTIVATION,
    MODEL_OP_EMBEDDING,
    MODEL_OP_LOSS,
    MODEL_OP_OPTIMIZER,
    MODEL_OP_COMM,
    MODEL_OP_PERMUTE /* MoE: gathering token rows into expert order and back (memory-bound) */
} ModelOpKind;

/* Where in the model an op runs: the executor finds an op by (role, layer or block, chunk,
 * phase, communication kind), never by name. A communication op carries the role of the
 * compute op it serves (the QKV projection's all-gather is MODEL_OPR_QKV) or of the block it
 * reduces or gathers. Enums only grow at the end. */
typedef enum {
    MODEL_OPR_NONE = 0,
    MODEL_OPR_EMBED, MODEL_OPR_LN1, MODEL_OPR_QKV, MODEL_OPR_CORE, MODEL_OPR_PROJ, MODEL_OPR_LN2,
    MODEL_OPR_FC1, MODEL_OPR_ACT, MODEL_OPR_FC2, MODEL_OPR_FINAL_LN, MODEL_OPR_LOGITS,
    MODEL_OPR_LOSS, MODEL_OPR_OPTIMIZER,
    MODEL_OPR_PP,              /* the pipeline's transfers ("pp") */
    MODEL_OPR_BLOCK_PARAMS,    /* a block's parameter all-gather (ZeRO): "<block>.params" */
    MODEL_OPR_BLOCK_GRADS,     /* a block's gradient reduction: "<block>.grads" */
    MODEL_OPR_BLOCK_SP_GRADS,  /* SP's norm-gradient all-reduce: "<block>.sp_grads" */
    MODEL_OPR_ROUTER,          /* "moe.router": scores, top-k, permutation, aux loss */
    MODEL_OPR_DISPATCH,        /* "moe.dispatch": the all-to-all of the routed tokens */
    MODEL_OPR_EXP_FC1, MODEL_OPR_EXP_ACT, MODEL_OPR_EXP_FC2, /* "moe.experts.fc1" ... */
    MODEL_OPR_COMBINE,         /* "moe.combine": the all-to-all back, weighted sum */
    MODEL_OPR_Q_A, MODEL_OPR_Q_B, MODEL_OPR_KV_A, MODEL_OPR_KV_B, /* MLA's projections */
    MODEL_OPR_MTP,             /* "mtp": a prediction module's norms and eh projection */
    MODEL_OPR_COUNT
} ModelOpRole;

/* The role's part of an op's name: "attn.qkv" (after "layer.<i>."), "embed", "grads" (after
 * the block's name). */
const char *model_op_role_name(ModelOpRole r);
/* What an FP8 job's attention output projection saves of its input (the attention core's
 * output) for its weight gradient, as Megatron-Core (attention.py, at d98e8a64) sets up
 * Transformer Engine: with a recipe other than delayed, linear_proj saves the original 16-bit
 * input, which the fused core saves anyway (save_original_input, TE >= 2.6), and quantizes it
 * again in the backward; under delayed scaling it saves its quantized copy, beside the fused
 * core's 16-bit output (attn.proj.in.fp8 then). ACT also without FP8. */
typedef enum { MODEL_FP8_PROJ_ACT = 0, MODEL_FP8_PROJ_FP8, MODEL_FP8_PROJ_BOTH } ModelFp8ProjIn;
ModelFp8ProjIn model_fp8_proj_in(const ModelSpec *s);
/* What FP8 attention (fp8_attention) keeps for the fused core's backward, as Transformer
 * Engine's FusedAttention does with an FP8 backward (docs/fp8.md, "FP8 attention"): Q, K and V
 * quantized with one scale (its QKV quantizer) and saved in FP8 instead of the 16-bit
 * attn.qkv.out (model_fp8_attn_qkv); under delayed scaling the core's output in FP8 too,
 * instead of the 16-bit attn.proj.in (model_fp8_attn_out; under current scaling, tensorwise,
 * the output stays 16-bit, NVTE_DPA_FP8CS_O_in_F16's default). The unfused core (TE's
 * UnfusedDotProductAttention only emulates FP8) saves what it saves without FP8: both 0. */
int model_fp8_attn_qkv(const ModelSpec *s);
int model_fp8_attn_out(const ModelSpec *s);
/* How many FP8 copies of Q, K, V (and of the output gradient) the fused FP8 core keeps: 2 under
 * MXFP8, whose 32-element blocks run along the reduction dimension of the GEMM reading them:
 * row-wise (along head_dim) for the scores and dP = dO V^T, column-wise (along the sequence)
 * for O = P V, dV, dQ and dK; Transformer Engine quantizes and saves both (utils.py's
 * combine_and_quantize under training, backends.py's FusedAttnFunc). 1 under a per-tensor
 * scale, 0 without model_fp8_attn_qkv. */
int model_fp8_attn_copies(const ModelSpec *s);
/* MXFP8 attention with context parallelism (model_fp8_attn_copies 2, cp > 1), as Transformer
 * Engine runs it (context_parallel.py; docs/fp8.md, "FP8 attention with context
 * parallelism"): nothing is quantized before an exchange, K and V (over Ulysses Q, K, V, the
 * output and the gradients) travel in the 16-bit nominal dtype, and each step's fused call
 * quantizes its own parts into both copies. model_fp8_attn_codes: Q, K, V (and dO) travel as
 * FP8 codes, model_fp8_attn_qkv but not under MXFP8 with cp. model_fp8_attn_saved: the core's
 * op keeps FP8 copies of Q, K, V in attn.qkv.out: model_fp8_attn_qkv but, under MXFP8 with
 * cp, over Ulysses only (AttnFuncWithCPAndQKVOA2A saves its head-split FP8 q_part, k_part,
 * v_part; the ring and the all-gather save this rank's 16-bit Q, K, V and quantize again in
 * the backward). */
int model_fp8_attn_cp16(const ModelSpec *s);
int model_fp8_attn_codes(const ModelSpec *s);
int model_fp8_attn_saved(const ModelSpec *s);
/* MXFP8 parameters under ZeRO-3 (--fp8-recipe mxfp8 --zero 3 --fp8-param-gather), as
 * Megatron-FSDP runs them (docs/fp8.md, "MXFP8 parameters under ZeRO-3"): each rank keeps its
 * shard of both MXFP8 copies (row-wise, 1 x 32 blocks; column-wise, 32 x 1) and the whole
 * weights' E8M0 scales of both, which every rank computes from the blocks' amaxes all-reduced
 * after the update; a gather moves one copy's bytes, the row-wise before a forward, the
 * column-wise before a backward. The FP8 copies one gather before `phase` carries: 0 when the
 * layout is not such a one, 2 when it serves a forward and a backward (the gathered parameters
 * kept from forward to backward; under full recompute FSDP's backward gather, which serves the
 * recomputed forward too; MODEL_STEP: a pipeline's once-a-step gather), else 1. */
int model_fp8_mx_gather_copies(const ModelSpec *s, const ModelDims *d, ModelPhase phase);
/* 1 where FP8 attention's Q, K, V gradients travel in FP8: delayed scaling with the fused
 * core over the ring (each block's dK, dV home in one all-to-all) or Ulysses (dQ, dK, dV back
 * to the sequence split), as Transformer Engine's AttnFuncWithCPAndKVP2P and
 * AttnFuncWithCPAndQKVOA2A move the codes its dQKV quantizer (fp8_meta's "scaling_bwd"
 * META_DQKV) wrote (context_parallel.py; docs/fp8.md, "FP8 attention with context
 * parallelism"); 0 otherwise (the all-gather reduce-scatters them in the act dtype). */
int model_fp8_attn_dqkv(const ModelSpec *s);
/* Delayed scaling's histories of FP8 attention's tensors (fp8_attention, the delayed recipe):
 * Q, K, V's (one scale for the three), the output gradient's, where the fused core writes
 * its output in FP8 (model_fp8_attn_out) the output's and where the gradients travel in FP8
 * (model_fp8_attn_dqkv) theirs: that many more columns of the layer's QKV weight's
 * <w>.fp8_amax (each len history entries and a decode factor), after its GEMM's three
 * (multi-head latent attention's kv_b weight's: model_fp8_attn_weight); 0 otherwise. */
int model_fp8_attn_history(const ModelSpec *s);
/* The weight whose <w>.fp8_amax holds FP8 attention's histories (model_fp8_attn_history): the
 * QKV projection's, or with multi-head latent attention, which has none, kv_b's (the
 * up-projection that writes K and V). */
ModelTensorRole model_fp8_attn_weight(const ModelSpec *s);

/* 1 when the weight of role r is an FP8 GEMM's operand under the job (a linear layer of a
 * transformer layer: QKV or MLA's projections, the output projection, the MLP's and the
 * experts' matrices). */
int model_fp8_weight(const ModelSpec *s, ModelTensorRole r);
/* 1 when op role r's GEMMs run in FP8 under the job (the roles of model_fp8_weight's weights,
 * and the attention core with fp8_attention). */
int model_fp8_op(const ModelSpec *s, ModelOpRole r);
/* Bytes of one FP8 padding copy of a MoE layer's R routed rows (Transformer Engine's Fp8Padding
 * and Fp8Unpadding around Megatron-Core's FP8 grouped experts): 2 x R x h x act bytes, four a
 * micro-batch (forward and backward); 0 when the experts' GEMMs are not FP8. */
double model_moe_fp8_pad_bytes(const ModelSpec *s, const ModelDims *d, double R);

/* Op-level selective recompute (ModelDims.recompute_op; torchtitan's "selective op"): which of
 * layer `layer`'s matmuls at op role r run again before its backward. The layer's matmuls are
 * counted in its forward's order and every other one (the 2nd, 4th, ...) reruns: a dense
 * layer's wq, wk, wv (QKV), wo, then w1, w3, w2 (gated fc1, fc2) or fc1, fc2; multi-head latent
 * attention's q_a (with a query latent), kv_a, q_b, kv_b, wo, then the MLP's. A MoE layer's MLP
 * half (router, experts, shared experts) is not counted nor rerun. Bit i set: the op's i-th
 * matmul reruns (QKV: 0 wq, 1 wk, 2 wv; gated fc1: 0 w1, 1 w3; else 0 its one). 0 without
 * op-level recompute. model/ops.c prices them, the executor runs them. */
unsigned model_sac_op_matmuls(const ModelSpec *s, const ModelDims *d, int layer, ModelOpRole r);
/* 1 when op-level selective recompute reruns anything of layer `layer` at role r: the norms
 * (LN1, LN2, MLA's latents' at Q_A and KV_A), the residual adds (PROJ, FC2), the activation,
 * MLA's rotary embedding (KV_B), and the roles with a rerun matmul. */
int model_sac_op_role(const ModelSpec *s, const ModelDims *d, int layer, ModelOpRole r);

/* Attention's matmul FLOPs, the op graph's convention (Narayanan et al. 2021): forward
 * 2 x 2 x BH x Tq x Tk x D for the scores and the context (halved when the job counts only the
 * causal half); backward twice the forward, or 2.5 x on the fused path that recomputes the
 * scores (FlashAttention-2, Dao 2023), the extra half being recompute. The executor counts its
 * attention calls with the same functions. */
double model_attention_fwd_flops(const ModelSpec *s, double bh, double tq, double tk, double d);
/* *recompute_flops (optional) gets the part of it that is recompute (hardware FLOPs only). */
double model_attention_bwd_flops(double fwd_flops, int flash, double *recompute_flops);

/* C[m,n] = A[m,k] * B[k,n], `batch` independent products. */
typedef struct {
    int64_t m, n, k, batch;
} ModelGemm;

typedef struct {
    char name[56]; /* base name: "layer.3.attn.qkv", "layer.3.attn.proj.tp_allreduce", "pp.send" */
    ModelPhase phase;
    ModelOpKind kind;
    ModelOpRole role;
    int chunk;          /* local model chunk, -1 for per-step ops */
    int layer;          /* global layer or -1 */
    int block;          /* the table's block a block op reduces or gathers, else -1 */
    int per_microbatch; /* 1: runs once per micro-batch of its chunk; 0: once per step */
    double flops;       /* matmul FLOPs (the quantity MFU is defined on) */
    double recompute_flops; /* of flops, work that re-forms what the forward computed and does
                               not save (FlashAttention's backward recomputes the scores):
                               hardware FLOPs, not model FLOPs */
    double bytes;       /* estimated memory traffic, GEMM operands and elementwise passes */
    int kernels;        /* kernel launches per execution (GEMMs included) */
    double epilogue_bytes; /* a matmul's bytes beyond its GEMMs: bias, dropout, residual */
    int n_gemm;
    ModelGemm gemm[4];
    /* communication (kind MODEL_OP_COMM) */
    int fp8;               /* its GEMMs run in FP8 (model_fp8_op) */
    double fp8_cast_bytes; /* of bytes, the passes that quantize its operands to FP8 (the
                              optimizer step's: the weights' FP8 copies; an FP8 expert
                              GEMM's: its padding copy too, model_moe_fp8_pad_bytes) */
    ModelComm comm;
    int group_size;
    uint64_t comm_bytes; /* buffer size S of one call: nccl-tests' "size" */
    int calls;           /* calls of comm_bytes each per execution (1 for most) */
    int repeat;          /* identical layers it stands for: 1, or a chunk's layers (compact) */
    int host_syncs;      /* device-to-host synchronisations per execution: the host waits for
                            the device (a MoE dispatcher's token counts), docs/time.md */
} ModelOp;

typedef struct {
    int stage;
    ModelOp *op;
    int count, cap;
} ModelOpGraph;

int model_ops_build(const ModelSpec *s, const ModelDims *d, int stage, ModelOpGraph *out,
                    PxError *err);
/* The compact graph: one layer per chunk with repeat = the chunk's layers (see the compact
 * tensor table); given the stage's compact table when the caller has built it (else NULL). */
int model_ops_build_compact(const ModelSpec *s, const ModelDims *d, int stage,
                            const ModelTensorTable *tt, ModelOpGraph *out, PxError *err);
/* The graph on the stage's table the caller has built: compact when the table is. */
int model_ops_build_with(const ModelSpec *s, const ModelDims *d, int stage,
                         const ModelTensorTable *tt, ModelOpGraph *out, PxError *err);
void model_ops_free(ModelOpGraph *g);
/* "layer.3.attn.qkv.fwd", "optimizer.step". */
void model_op_fullname(const ModelOp *op, char *buf, size_t cap);
const char *model_phase_name(ModelPhase p);

/* ---- calibrated op rates: how a profile keys an op's fitted rate ---- */

/* How a calibrated profile keys and sizes an op's fitted rate: `parallax calibrate` fits by it
 * and the simulator looks up by it, so both read an op the same way. kind and phase name the
 * op ("norm", "fwd"; recompute counts as fwd); variant names what of the model changes the
 * op's speed on one device ("layernorm" or "rmsnorm", "gelu" or "swiglu", the position
 * embedding, attention's head dimension "hd64", a matmul's role and position embedding
 * "attn.qkv/rope"); x is the size the rate applies to: FLOPs for attention, for a matmul the
 * bytes of its first GEMM's output plus its epilogue's (its GEMMs are timed by shape), bytes for
 * the rest. */
typedef struct {
    char kind[16], phase[16], variant[24];
    int flash;
    double x;
} ModelOpKey;

void model_op_key(const ModelSpec *s, const ModelDims *d, const ModelOp *op, ModelOpKey *key);

/* ---- pipeline schedule ---- */

typedef struct {
    int backward; /* 0 forward, 1 backward */
    int chunk;    /* local model chunk */
    int mb;       /* micro-batch */
} ModelAction;

/* Writes the 2*m*v actions of stage `stage` in execution order into out (capacity 2*m*v) and
 * returns their count. GPipe: all forwards then all backwards; 1F1B: p-s-1 warm-up forwards,
 * then one forward one backward; interleaved: Megatron's order over v chunks. */
int model_schedule_build(const ModelDims *d, ModelSchedule sched, int stage, ModelAction *out);
/* Walks the actions: *peak_live gets the most (chunk, micro-batch) sets alive at once and
 * max_live[j] (v entries) the most sets of chunk j alive at once. PX_OK, or PX_ERUNTIME when
 * out of memory for the walk's v counts (any v: no bound on the chunks a rank holds). */
int model_schedule_live(const ModelAction *a, int n, int v, int *peak_live, int *max_live);
/* The same counts for stage `stage`'s schedule, walked without storing its actions. */
int model_schedule_peak(const ModelDims *d, ModelSchedule sched, int stage, int *peak_live,
                        int *max_live);
/* Activation memory of a stage as parallax's executor allocates it: one pool of peak_live slots
 * for the layers' sets (each the largest chunk's), and for each chunk's extras (the embedding's
 * dropout mask, the output layer's tensors) a pool of that chunk's max_live. */
uint64_t model_activation_bytes(const ModelTensorTable *tt, int v, int peak_live,
                                const int *max_live);

#endif
