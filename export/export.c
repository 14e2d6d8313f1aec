/* Exports a plan to the frameworks that run it: Megatron-LM command-line flags, a DeepSpeed
 * config; NeMo 1.x and Megatron-Bridge (nemo.c, bridge.c), torchtitan (titan.c) and a Slurm
 * batch script (slurm.c) in files of their own. Flag names follow each framework's
 * documentation; what a framework cannot express is said in a comment, never dropped silently. */
#include "export/internal.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

const char *export_format_name(ExportFormat f)
{
    static const char *const names[] = {"megatron", "deepspeed", "nemo", "bridge", "torchtitan", "slurm", "torchtitan-toml"};
    return (unsigned)f < EXPORT_COUNT ? names[f] : "?";
}

int export_format_from_name(const char *s)
{
    for (int i = 0; i < EXPORT_COUNT; i++)
        if (s && strcmp(s, export_format_name((ExportFormat)i)) == 0)
            return i;
    return -1;
}

static void flag(FILE *f, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One element of the MEGATRON_ARGS array: a flag and, with fmt, its value. */
static void flag(FILE *f, const char *name, const char *fmt, ...)
{
    fprintf(f, "    %s", name);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputc(' ', f);
        vfprintf(f, fmt, ap);
        va_end(ap);
    }
    fputc('\n', f);
}

/* Megatron's --moe-layer-freq as its list form, run-length coded: "([0]*3+[1]*58)". Its int
 * form N makes layer i MoE when i % N == 0 (moe_layer_freq in Megatron-Core's
 * transformer_config.py), while parallax's first_dense and layer_freq follow Hugging Face
 * (first_k_dense_replace, then every layer_freq-th layer): only the list says both. */
static void megatron_moe_layers(char *buf, size_t cap, const ModelConfig *c)
{
    size_t n = (size_t)snprintf(buf, cap, "(");
    for (int l = 0; l < c->layers && n < cap;) {
        const int moe = model_layer_is_moe(c, l);
        int run = 1;
        while (l + run < c->layers && model_layer_is_moe(c, l + run) == moe)
            run++;
        n += (size_t)snprintf(buf + n, cap - n, "%s[%d]*%d", l ? "+" : "", moe, run);
        l += run;
    }
    if (n < cap)
        snprintf(buf + n, cap - n, ")");
}

/* Mixture of experts and multi-head latent attention (Megatron-Core's MoE and MLA arguments). */
static void megatron_moe(FILE *f, const ModelPlan *p)
{
    const ModelConfig *c = &p->spec.model;
    const ModelMoe *m = &c->moe;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    if (m->experts > 0) {
        char freq[4096];
        megatron_moe_layers(freq, sizeof freq, c);
        flag(f, "--num-experts", "%d", m->experts);
        flag(f, "--moe-router-topk", "%d", m->topk);
        flag(f, "--moe-ffn-hidden-size", "%d", m->expert_ffn);
        if (m->shared_ffn > 0)
            flag(f, "--moe-shared-expert-intermediate-size", "%d", m->shared_ffn);
        if (m->shared_ffn > 0 && m->shared_gate)
            flag(f, "--moe-shared-expert-gate", NULL);
        flag(f, "--moe-layer-freq", "'%s'", freq);
        flag(f, "--expert-model-parallel-size", "%d", l->ep);
        flag(f, "--expert-tensor-parallel-size", "%d", l->etp);
        flag(f, "--moe-router-score-function", "%s", m->score == MODEL_ROUTER_SIGMOID ? "sigmoid" : "softmax");
        if (m->groups > 0) {
            flag(f, "--moe-router-num-groups", "%d", m->groups);
            flag(f, "--moe-router-group-topk", "%d", m->topk_groups);
        }
        if (m->aux_loss_coeff > 0) {
            flag(f, "--moe-router-load-balancing-type", "aux_loss");
            flag(f, "--moe-aux-loss-coeff", "%g", m->aux_loss_coeff);
        } else {
            flag(f, "--moe-router-load-balancing-type", "none");
        }
        if (m->capacity_factor > 0) {
            /* parallax pads every expert's input to its capacity (dims.routed) */
            flag(f, "--moe-expert-capacity-factor", "%g", m->capacity_factor);
            flag(f, "--moe-pad-expert-input-to-capacity", NULL);
        }
        flag(f, "--moe-token-dispatcher-type", "alltoall");
        flag(f, "--moe-grouped-gemm", NULL);
        if (t->moe_force_balance)
            flag(f, "--moe-router-force-load-balancing", NULL);
        if (l->overlap_ep && m->shared_ffn > 0)
            flag(f, "--moe-shared-expert-overlap", NULL);
    }
    if (c->mla.kv_lora_rank > 0) {
        flag(f, "--multi-latent-attention", NULL);
        if (c->mla.q_lora_rank > 0)
            flag(f, "--q-lora-rank", "%d", c->mla.q_lora_rank);
        flag(f, "--kv-lora-rank", "%d", c->mla.kv_lora_rank);
        flag(f, "--qk-head-dim", "%d", c->mla.qk_nope_dim);
        flag(f, "--qk-pos-emb-head-dim", "%d", c->mla.qk_rope_dim);
        flag(f, "--v-head-dim", "%d", c->mla.v_dim);
    }
    if (c->mtp_layers > 0)
        flag(f, "--mtp-num-layers", "%d", c->mtp_layers);
}

/* What the Megatron flags cannot carry of a MoE plan, as comments above them. */
static void megatron_moe_notes(FILE *f, const ModelPlan *p)
{
    const ModelMoe *m = &p->spec.model.moe;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    if (m->experts <= 0)
        return;
    fprintf(f, "# experts: %d routed (top %d) over ep %d x etp %d, expert data parallel %d; %s\n",
            m->experts, m->topk, l->ep, l->etp, l->tp * l->cp * l->dp / (l->ep * l->etp),
            m->capacity_factor > 0 ? "capacity padded" : "dropless (no capacity factor)");
    if (t->moe_imbalance > 1.0 && !t->moe_force_balance)
        fprintf(f, "# planned for a routing imbalance of %g (the busiest EP rank's tokens over the balanced\n"
                   "# share): a planning assumption, not a Megatron setting\n", t->moe_imbalance);
    if (l->overlap_ep)
        fprintf(f, "# the plan overlaps the experts' all-to-all with compute%s; Megatron-Core versions\n"
                   "# with it take --overlap-moe-expert-parallel-comm for the overlap across micro-batches\n",
                m->shared_ffn > 0 ? " (--moe-shared-expert-overlap: under the shared experts)" : "");
    if (m->score == MODEL_ROUTER_SIGMOID)
        fprintf(f, "# parallax's model description has no routed scaling factor or bias-based balancing:\n"
                   "# add --moe-router-topk-scaling-factor and --moe-router-enable-expert-bias from the\n"
                   "# model's own config where it uses them (DeepSeek-V3: 2.5, and aux-loss-free balancing)\n");
    if (m->router_bias || m->expert_bias)
        fprintf(f, "# NOT EXPRESSIBLE: biases on the router or the experts (GPT-OSS): --disable-bias-linear\n"
                   "# below turns every linear bias off, --add-bias-linear would turn them all on\n");
}

/* FP8 training, checked against Megatron-LM d98e8a64 (megatron/training/arguments.py and
 * megatron/core/transformer/transformer_config.py, whose fields become flags): --fp8-format
 * (TransformerConfig.fp8: e4m3 | hybrid) turns FP8 on, --fp8-recipe takes parallax's recipe
 * names, delayed scaling's history is --fp8-amax-history-len with --fp8-amax-compute-algo max
 * (Megatron's defaults are 1 and most_recent; parallax plans Transformer Engine's 1024 and
 * max). validate_args takes --fp8-param-gather only with the distributed optimizer or FSDP,
 * which ZeRO 1 and 2 map to. fp8_dot_product_attention is a TransformerConfig field that
 * arguments.py excludes from the flags, and Megatron-Core quantizes a MoE dispatch only on the
 * ncclep flex dispatcher (moe_dispatch_fwd_dtype): both are said in comments.
 * (export_fp8_param_gather_ok in common.c says when the flag applies.) */
static void megatron_fp8_notes(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    if (t->fp8 == MODEL_FP8_NONE)
        return;
    if (t->fp8 == MODEL_FP8_MXFP8)
        fprintf(f, "# --fp8-recipe mxfp8 runs on Blackwell only: Transformer Engine checks the device, validate_args does not\n");
    if (t->fp8_param_gather && !export_fp8_param_gather_ok(p))
        fprintf(f, "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0): validate_args takes\n"
                   "# --fp8-param-gather only with --use-distributed-optimizer or FSDP, so the flags below keep the 16-bit\n"
                   "# weights beside their FP8 copies (plan with --zero 1 for the flag)\n");
    if (t->fp8_attention)
        fprintf(f, "# NOT EXPRESSIBLE: FP8 attention: Megatron-Core's TransformerConfig.fp8_dot_product_attention has\n"
                   "# no pretrain_gpt.py flag (arguments.py leaves it out of the generated ones)%s\n",
                t->fp8 == MODEL_FP8_BLOCKWISE ? "; the blockwise recipe\n# (Float8BlockScaling) does not take it either" : "");
    if (t->fp8_dispatch && p->spec.model.moe.experts > 0)
        fprintf(f, "# FP8 dispatch has no flag for the alltoall dispatcher below: Megatron-Core quantizes the dispatch\n"
                   "# only on the ncclep flex dispatcher, in MXFP8 (--moe-dispatch-fwd-dtype mxfp8); these flags dispatch in bf16\n");
}

static void megatron_fp8(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    if (t->fp8 == MODEL_FP8_NONE)
        return;
    flag(f, "--fp8-format", "%s", model_fp8_format_name(t->fp8_format));
    flag(f, "--fp8-recipe", "%s", model_fp8_recipe_name(t->fp8));
    if (t->fp8 == MODEL_FP8_DELAYED) {
        flag(f, "--fp8-amax-history-len", "%d", t->fp8_amax_history);
        flag(f, "--fp8-amax-compute-algo", "max");
    }
    if (export_fp8_param_gather_ok(p))
        flag(f, "--fp8-param-gather", NULL);
}

/* The launch environment validate_args checks (Megatron-LM d98e8a64, megatron/training/
 * arguments.py): with tp or cp > 1 it asserts CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell
 * (get_device_arch_version() < 10; a device with MXFP8 tensor cores is Blackwell), so that
 * the kernels of tensor-parallel communication and compute queue in issue order; Megatron FSDP
 * instead asserts the variable is not 1 (unset or > 1, for its overlapped collectives) and only
 * warns about tp or cp. Written as lines a shell sources, not only said. */
static void megatron_env(FILE *f, const ModelPlan *p)
{
    const ModelLayout *l = &p->spec.layout;
    const ProfDevice *dev = &p->profile.device;
    const int blackwell = dev->peak_mxfp8 > 0 && !prof_device_is_cpu(dev);
    if (l->zero >= 2) {
        fprintf(f, "# Megatron FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS unset or > 1 (validate_args)%s\n",
                l->tp > 1 || l->cp > 1 ? "; with tp or cp > 1\n# it only warns that tensor parallelism would rather have one connection" : "");
        fprintf(f, "unset CUDA_DEVICE_MAX_CONNECTIONS\n");
    } else if ((l->tp > 1 || l->cp > 1) && !blackwell) {
        fprintf(f, "# with tp or cp > 1 before Blackwell validate_args asserts one hardware queue per device\n");
        fprintf(f, "export CUDA_DEVICE_MAX_CONNECTIONS=1\n");
    } else if (l->tp > 1 || l->cp > 1) {
        fprintf(f, "# on Blackwell validate_args no longer asks for CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1\n");
    }
}

/* --pipeline-model-parallel-layout for a split whose middle stages differ: the stages' decoder
 * layers ('t'), the embedding first ('E'), the loss last ('L') and the multi-token prediction
 * modules, which a split given as layers per stage places on the last stage, just before the
 * loss ('m' each: PipelineParallelLayerLayout.validate_layer_layout counts them against
 * --mtp-num-layers). A plan's own layout string goes as given, a standalone "m|L" included. */
/* HSDP, buckets and offload as Megatron-LM's flags. HSDP is the distributed optimizer's (and
 * Megatron-FSDP's) instances: each shards over dp / instances ranks and the instances all-reduce
 * their shards. --ddp-bucket-size counts parameters (DistributedDataParallelConfig.bucket_size).
 * Megatron's activation offload (Transformer Engine's, --cpu-offloading-num-layers) keeps the
 * last layer on the device and refuses pipeline parallelism and recompute (TransformerConfig's
 * __post_init__). */
static void megatron_sharding(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *j = &p->spec.job;
    if (l->dp_replicate > 1)
        flag(f, "--num-distributed-optimizer-instances", "%d", l->dp_replicate);
    if (l->bucket_bytes > 0)
        flag(f, "--ddp-bucket-size", "%.0f", floor(l->bucket_bytes / (double)px_dtype_bytes(d->param)));
    if (l->offload_optimizer) {
        /* the hybrid device optimizer runs on the precision-aware optimizer's code path */
        flag(f, "--optimizer-cpu-offload", NULL);
        flag(f, "--optimizer-offload-fraction", "1.0");
        flag(f, "--use-precision-aware-optimizer", NULL);
        if (j->optimizer != MODEL_OPT_ADAMW)
            fprintf(f, "# NOT EXPRESSIBLE: optimizer offload of %s: Megatron-Core's precision-aware optimizer "
                       "(which the offload needs) is Adam only\n", model_optimizer_name(j->optimizer));
        if (j->fp8_param_gather && j->fp8 != MODEL_FP8_DELAYED)
            fprintf(f, "# NOT EXPRESSIBLE: optimizer offload with --fp8-param-gather: validate_args asks for "
                       "--fp8-recipe delayed\n");
    }
    if (l->offload_activations) {
        if (l->pp > 1 || l->recompute != MODEL_RECOMPUTE_NONE || p->spec.model.layers < 2)
            fprintf(f, "# NOT EXPRESSIBLE: activation offload with %s: Megatron-Core's CPU offloading "
                       "(--cpu-offloading-num-layers) refuses pipeline parallelism and recompute\n",
                    l->pp > 1 ? "pipeline parallelism" : l->recompute != MODEL_RECOMPUTE_NONE ? "recompute" : "one layer");
        else
            flag(f, "--cpu-offloading-num-layers", "%d", p->spec.model.layers - 1);
    }
    if (l->zero == 3 && l->keep_gathered)
        fprintf(f, "# NOT EXPRESSIBLE: parameters kept gathered from forward to backward: Megatron-FSDP "
                   "reshards after every forward (--torch-fsdp2-no-reshard-after-forward is torch FSDP2's, "
                   "--use-torch-fsdp2)\n");
    if (l->zero == 3 && !l->fsdp && l->recompute == MODEL_RECOMPUTE_FULL && !l->keep_gathered)
        fprintf(f, "# the plan predicts DeepSpeed ZeRO-3's gathers (a recomputed forward gathers again);\n"
                   "# Megatron-FSDP's backward gather serves the recompute: plan with --fsdp for its figures\n");
    if (l->zero == 3 && l->prefetch > 1)
        fprintf(f, "# NOT EXPRESSIBLE: prefetch of %d layers: Megatron-FSDP prefetches the next module's "
                   "parameters only\n", l->prefetch);
}

static void megatron(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    int per_node = prof_node_size(&p->profile, p->gpus);
    if (per_node > p->gpus)
        per_node = p->gpus;
    fprintf(f, "# Megatron-LM (pretrain_gpt.py) flags for %s on %d GPUs (%s), written by parallax\n",
            c->name, p->gpus, p->cluster);
    fprintf(f, "# data-parallel size %d follows from the world size; %d micro-batch%s per step\n",
            l->dp, d->m, d->m == 1 ? "" : "es");
    fprintf(f, "# source this file, then on each node:\n"
               "#   torchrun --nnodes %d --nproc-per-node %d ... pretrain_gpt.py \"${MEGATRON_ARGS[@]}\" --data-path ... (or --mock-data)\n",
            (p->gpus + per_node - 1) / per_node, per_node);
    /* the FSDP asserts: Megatron-LM since ab43d43f (2026-04), still at d98e8a64 */
    if (l->zero >= 2)
        fprintf(f, "# ZeRO-%d maps to Megatron FSDP (--use-megatron-fsdp and the sharding strategy below;\n"
                   "# Megatron-LM versions before the rename call the first flag --use-custom-fsdp), whose\n"
                   "# validate_args asserts --ckpt-format fsdp_dtensor\n",
                l->zero);
    if (l->schedule == MODEL_SCHED_GPIPE && l->pp > 1)
        fprintf(f, "%s", export_gpipe_note);
    ExportMegatronSplit ms;
    const int split_said = export_megatron_pipeline(p, d, &ms);
    if (split_said) {
        char split[256];
        model_split_format(l->stage_layers, l->n_stage_layers, split, sizeof split);
        if (ms.embed || ms.loss)
            fprintf(f, "# pipeline split %s: the %s counted as a layer, as Megatron-Core's flags below do\n", split,
                    ms.embed && ms.loss ? "embedding and the loss each" : ms.embed ? "embedding" : "loss");
        else if (!ms.layout[0])
            fprintf(f, "# uneven pipeline split %s: the first/last stage's layers below, the rest even\n", split);
        else if (l->pp_layout[0])
            fprintf(f, "# pipeline split %s: the plan's layout string (Megatron-LM since 77732c36, core_v0.13.0)\n", split);
        else
            fprintf(f, "# uneven pipeline split %s: %s, which --decoder-first/last-pipeline-num-layers\n"
                       "# cannot say, so it goes as --pipeline-model-parallel-layout (Megatron-LM since 77732c36, core_v0.13.0;\n"
                       "# NOT EXPRESSIBLE in earlier versions, which split the middle stages evenly)\n",
                    split, l->vpp > 1 ? "its virtual stages differ" : "its middle stages differ");
    }
    /* parallax sizes the embedding and output layer for this vocabulary, padded to a multiple
     * of pad_vocab x tp as Megatron pads it (--make-vocab-size-divisible-by). NullTokenizer
     * takes the size alone: no tokenizer files or downloads, and it is what --mock-data runs
     * with; a real data set needs its own tokenizer, with the same vocabulary size. */
    fprintf(f, "# NullTokenizer with --vocab-size %d sizes the embeddings as planned; for real data use the\n"
               "# model's tokenizer instead (--tokenizer-type HuggingFaceTokenizer --tokenizer-model NAME_OR_PATH)\n",
            c->vocab);
    if (c->rope_scaling.type != MODEL_ROPE_SCALING_NONE && !model_rope_scaling_megatron(c))
        fprintf(f, "# NOT EXPRESSIBLE: this %s rotary scaling (factor %g) differs from Llama 3.1's frequency factors\n"
                   "# or original context, which --use-rope-scaling fixes; the flags below leave RoPE unscaled\n",
                model_rope_scaling_name(c->rope_scaling.type), c->rope_scaling.factor);
    megatron_moe_notes(f, p);
    megatron_fp8_notes(f, p);
    megatron_env(f, p);
    fprintf(f, "MEGATRON_ARGS=(\n");
    flag(f, "--num-layers", "%d", c->layers);
    flag(f, "--hidden-size", "%d", c->hidden);
    flag(f, "--ffn-hidden-size", "%d", c->ffn_hidden);
    flag(f, "--num-attention-heads", "%d", c->heads);
    if (c->head_dim * c->heads != c->hidden)
        flag(f, "--kv-channels", "%d", c->head_dim);
    if (c->kv_heads != c->heads) {
        flag(f, "--group-query-attention", NULL);
        flag(f, "--num-query-groups", "%d", c->kv_heads);
    }
    flag(f, "--seq-length", "%d", d->s);
    flag(f, "--max-position-embeddings", "%d", c->position == MODEL_POS_LEARNED ? c->seq_len : d->s);
    if (c->family == MODEL_LLAMA || c->norm == MODEL_RMSNORM)
        flag(f, "--normalization", "RMSNorm");
    flag(f, "--norm-epsilon", "%g", c->norm_eps);
    if (c->mlp == MODEL_SWIGLU)
        flag(f, "--swiglu", NULL);
    if (c->position == MODEL_POS_ROPE) {
        flag(f, "--position-embedding-type", "rope");
        flag(f, "--rotary-base", "%.0f", c->rope_theta);
        if (model_rope_scaling_megatron(c)) {
            flag(f, "--use-rope-scaling", NULL);
            flag(f, "--rope-scaling-factor", "%g", c->rope_scaling.factor);
        }
    }
    if (!c->tied_embeddings)
        flag(f, "--untie-embeddings-and-output-weights", NULL);
    if (!c->bias)
        flag(f, "--disable-bias-linear", NULL);
    if (!c->bias && c->qkv_bias)
        flag(f, "--add-qkv-bias", NULL);
    if (c->qk_norm)
        flag(f, "--qk-layernorm", NULL); /* the model's normalization, over each head */
    if (c->attn_sinks)
        flag(f, "--softmax-type", "learnable"); /* a learned sink logit per head */
    flag(f, "--tokenizer-type", "NullTokenizer");
    flag(f, "--vocab-size", "%d", c->vocab);
    flag(f, "--make-vocab-size-divisible-by", "%d", t->pad_vocab);
    flag(f, "--tensor-model-parallel-size", "%d", l->tp);
    flag(f, "--pipeline-model-parallel-size", "%d", l->pp);
    if (ms.embed)
        flag(f, "--account-for-embedding-in-pipeline-split", NULL);
    if (ms.loss)
        flag(f, "--account-for-loss-in-pipeline-split", NULL);
    if (ms.first >= 0)
        flag(f, "--decoder-first-pipeline-num-layers", "%d", ms.first);
    if (ms.last >= 0)
        flag(f, "--decoder-last-pipeline-num-layers", "%d", ms.last);
    if (ms.layout[0])
        flag(f, "--pipeline-model-parallel-layout", "'%s'", ms.layout);
    /* the layout string gives the chunks itself (arguments.py allows one of the three) */
    else if (l->vpp > 1 && split_said)
        flag(f, "--num-virtual-stages-per-pipeline-rank", "%d", l->vpp);
    else if (l->vpp > 1)
        flag(f, "--num-layers-per-virtual-pipeline-stage", "%d", c->layers / (l->pp * l->vpp));
    if (l->cp > 1)
        flag(f, "--context-parallel-size", "%d", l->cp);
    if (l->cp > 1 && l->cp_comm != MODEL_CP_COMM_P2P) /* p2p is Megatron-LM's default */
        flag(f, "--cp-comm-type", "%s", export_cp_comm_name(l->cp_comm));
    if (l->sp)
        flag(f, "--sequence-parallel", NULL);
    if (l->zero == 1)
        flag(f, "--use-distributed-optimizer", NULL);
    if (l->zero >= 2) {
        flag(f, "--use-megatron-fsdp", NULL);
        flag(f, "--data-parallel-sharding-strategy", "%s", l->zero == 2 ? "optim_grads" : "optim_grads_params");
        flag(f, "--ckpt-format", "fsdp_dtensor");
    }
    megatron_sharding(f, p, d);
    if (l->overlap_dp) {
        flag(f, "--overlap-grad-reduce", NULL);
        if (l->zero >= 1)
            flag(f, "--overlap-param-gather", NULL);
    }
    if (l->overlap_tp)
        flag(f, "--tp-comm-overlap", NULL);
    if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        flag(f, "--recompute-granularity", "selective");
    if (l->recompute == MODEL_RECOMPUTE_FULL) {
        flag(f, "--recompute-granularity", "full");
        flag(f, "--recompute-method", "uniform");
        flag(f, "--recompute-num-layers", "1");
    }
    megatron_moe(f, p);
    flag(f, "--micro-batch-size", "%d", t->micro_batch);
    flag(f, "--global-batch-size", "%d", t->global_batch);
    if (t->precision == PX_BF16)
        flag(f, "--bf16", NULL);
    else if (t->precision == PX_FP16)
        flag(f, "--fp16", NULL);
    if (t->precision != PX_FP32 && t->grad_dtype == PX_FP32)
        flag(f, "--accumulate-allreduce-grads-in-fp32", NULL);
    megatron_fp8(f, p);
    if (t->flash_attn)
        flag(f, "--use-flash-attn", NULL);
    flag(f, "--attention-dropout", "%g", t->dropout);
    flag(f, "--hidden-dropout", "%g", t->dropout);
    if (t->optimizer == MODEL_OPT_SGD_MOMENTUM) {
        flag(f, "--optimizer", "sgd");
        flag(f, "--sgd-momentum", "%g", t->momentum);
    } else {
        flag(f, "--optimizer", "adam");
        flag(f, "--adam-beta1", "%g", t->beta1);
        flag(f, "--adam-beta2", "%g", t->beta2);
        flag(f, "--adam-eps", "%g", t->adam_eps);
    }
    flag(f, "--lr", "%g", t->lr);
    flag(f, "--min-lr", "%g", t->min_lr);
    flag(f, "--lr-decay-style", "cosine");
    flag(f, "--lr-warmup-iters", "%d", t->warmup_steps);
    flag(f, "--train-iters", "%d", t->steps);
    flag(f, "--weight-decay", "%g", t->weight_decay);
    flag(f, "--clip-grad", "%g", t->grad_clip);
    flag(f, "--seed", "%llu", (unsigned long long)t->seed);
    fprintf(f, ")\n");
    if (t->optimizer == MODEL_OPT_ADAM_8BIT)
        fprintf(f, "# 8-bit Adam has no Megatron-LM flag: its memory was planned, the flags use Adam\n");
}

/* zero_optimization's buckets, ZeRO-3's gathering limits and the optimizer offload. DeepSpeed
 * counts its buckets and limits in elements (runtime/zero/config.py): the gradients' for the
 * reduction bucket, the parameters' for the gathers. */
static void deepspeed_sharding(cJSON *z, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    const double pe = (double)px_dtype_bytes(d->param), ge = (double)px_dtype_bytes(d->grad);
    const double params = model_config_params(&p->spec.model);
    if (l->bucket_bytes > 0) {
        cJSON_AddNumberToObject(z, "reduce_bucket_size", floor(l->bucket_bytes / ge));
        cJSON_AddNumberToObject(z, l->zero == 3 ? "stage3_prefetch_bucket_size" : "allgather_bucket_size",
                                floor(l->bucket_bytes / pe));
    } else if (l->zero == 3 && l->prefetch > 1) {
        /* prefetch depth in layers: that many layers' parameters in the prefetch bucket */
        cJSON_AddNumberToObject(z, "stage3_prefetch_bucket_size",
                                floor(l->prefetch * params / p->spec.model.layers));
    }
    if (l->zero == 3 && l->keep_gathered) {
        /* a layer's gathered parameters stay until its backward: DeepSpeed releases none while
         * the live parameters and the reuse distance stay under these limits */
        cJSON_AddNumberToObject(z, "stage3_max_live_parameters", ceil(params));
        cJSON_AddNumberToObject(z, "stage3_max_reuse_distance", ceil(params));
    }
    if (l->offload_optimizer) {
        cJSON *o = cJSON_AddObjectToObject(z, "offload_optimizer");
        cJSON_AddStringToObject(o, "device", "cpu");
        cJSON_AddBoolToObject(o, "pin_memory", 1);
    }
}

/* What DeepSpeed's config cannot say of the plan's sharding and offload (on stderr). */
static void deepspeed_sharding_notes(const ModelPlan *p)
{
    const ModelLayout *l = &p->spec.layout;
    if (l->dp_replicate > 1)
        px_warn("NOT EXPRESSIBLE: HSDP (dp_shard %d x dp_replicate %d): DeepSpeed 0.19.8 removed MiCS "
                "(mics_shard_size), and zero_hpz_partition_size keeps a second copy of the parameters "
                "for the backward's gathers while the optimizer state stays sharded over all %d ranks; "
                "the config written shards over the whole data-parallel group",
                l->dp_shard, l->dp_replicate, l->dp);
    if (l->zero == 3 && l->fsdp && l->recompute == MODEL_RECOMPUTE_FULL && !l->keep_gathered)
        px_warn("the plan predicts FSDP's gathers (one per layer in the backward serves the recomputed "
                "forward too); DeepSpeed's ZeRO-3 gathers again for the recomputed forward once a layer "
                "is larger than stage3_max_reuse_distance: plan without --fsdp for DeepSpeed's figures");
    if (l->offload_activations && l->recompute != MODEL_RECOMPUTE_FULL)
        px_warn("NOT EXPRESSIBLE: activation offload without full recompute: DeepSpeed moves only the "
                "checkpointed layer inputs to the host (activation_checkpointing.cpu_checkpointing)");
}

static void deepspeed(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "train_batch_size", t->global_batch);
    cJSON_AddNumberToObject(j, "train_micro_batch_size_per_gpu", t->micro_batch);
    cJSON_AddNumberToObject(j, "gradient_accumulation_steps", d->m);
    cJSON_AddNumberToObject(j, "gradient_clipping", t->grad_clip);
    cJSON_AddNumberToObject(j, "steps_per_print", 10);
    if (t->precision == PX_BF16) {
        cJSON *b = cJSON_AddObjectToObject(j, "bf16");
        cJSON_AddBoolToObject(b, "enabled", 1);
    } else if (t->precision == PX_FP16) {
        cJSON *h = cJSON_AddObjectToObject(j, "fp16");
        cJSON_AddBoolToObject(h, "enabled", 1);
        cJSON_AddNumberToObject(h, "loss_scale", 0); /* dynamic */
        /* parallax's scaler (exec/train/scale.c, torch.amp.GradScaler's): 2^16 at first,
         * halved at every overflow (DeepSpeed waits for `hysteresis` of them), doubled after
         * 2000 clean steps (DeepSpeed's window defaults to 1000) */
        cJSON_AddNumberToObject(h, "initial_scale_power", 16);
        cJSON_AddNumberToObject(h, "loss_scale_window", 2000);
        cJSON_AddNumberToObject(h, "hysteresis", 1);
    }
    /* DeepSpeed accumulates gradients in the model's dtype unless data_types.grad_accum_dtype
     * says otherwise, which its ZeRO optimizers take; without ZeRO the engine refuses 16-bit
     * weights with fp32 gradients (export_plan warns) */
    if (t->precision != PX_FP32 && (l->zero >= 1 || t->grad_dtype == t->precision)) {
        cJSON *dt = cJSON_AddObjectToObject(j, "data_types");
        cJSON_AddStringToObject(dt, "grad_accum_dtype", px_dtype_name(t->grad_dtype));
    }
    cJSON *z = cJSON_AddObjectToObject(j, "zero_optimization");
    cJSON_AddNumberToObject(z, "stage", l->zero);
    cJSON_AddBoolToObject(z, "overlap_comm", l->overlap_dp);
    cJSON_AddBoolToObject(z, "contiguous_gradients", 1);
    deepspeed_sharding(z, p, d);
    cJSON *o = cJSON_AddObjectToObject(j, "optimizer");
    cJSON *op = cJSON_CreateObject();
    if (t->optimizer == MODEL_OPT_SGD_MOMENTUM) {
        cJSON_AddStringToObject(o, "type", "SGD");
        cJSON_AddNumberToObject(op, "lr", t->lr);
        cJSON_AddNumberToObject(op, "momentum", t->momentum);
        cJSON_AddNumberToObject(op, "weight_decay", t->weight_decay);
    } else {
        cJSON_AddStringToObject(o, "type", "AdamW");
        cJSON_AddNumberToObject(op, "lr", t->lr);
        double betas[2] = {t->beta1, t->beta2};
        cJSON_AddItemToObject(op, "betas", cJSON_CreateDoubleArray(betas, 2));
        cJSON_AddNumberToObject(op, "eps", t->adam_eps);
        cJSON_AddNumberToObject(op, "weight_decay", t->weight_decay);
    }
    cJSON_AddItemToObject(o, "params", op);
    cJSON *sch = cJSON_AddObjectToObject(j, "scheduler");
    cJSON_AddStringToObject(sch, "type", "WarmupCosineLR");
    cJSON *sp = cJSON_AddObjectToObject(sch, "params");
    cJSON_AddNumberToObject(sp, "total_num_steps", t->steps);
    cJSON_AddNumberToObject(sp, "warmup_num_steps", t->warmup_steps);
    cJSON_AddNumberToObject(sp, "cos_min_ratio", t->lr > 0 ? t->min_lr / t->lr : 0);
    /* parallax warms up linearly (DeepSpeed's default is logarithmic) */
    cJSON_AddStringToObject(sp, "warmup_type", "linear");
    /* DeepSpeed's checkpointing recomputes whole layers: the block is for full recompute only */
    if (l->recompute == MODEL_RECOMPUTE_FULL) {
        cJSON *ac = cJSON_AddObjectToObject(j, "activation_checkpointing");
        cJSON_AddBoolToObject(ac, "partition_activations", l->sp);
        cJSON_AddBoolToObject(ac, "contiguous_memory_optimization", 0);
        cJSON_AddBoolToObject(ac, "cpu_checkpointing", l->offload_activations);
    }
    char *s = cJSON_Print(j);
    fprintf(f, "%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

int export_plan(FILE *f, const ModelPlan *plan, ExportFormat fmt, PxError *err)
{
    ModelSpec s = plan->spec;
    ModelDims d;
    int rc = model_spec_check(&s, plan->gpus, &d, err);
    if (rc)
        return rc;
    ModelPlan p = *plan;
    p.spec = s;
    switch (fmt) {
    case EXPORT_MEGATRON: megatron(f, &p, &d); break;
    case EXPORT_DEEPSPEED:
        if (s.layout.tp > 1 || s.layout.pp > 1 || s.layout.cp > 1)
            px_warn("DeepSpeed's config has no tensor, pipeline or context degrees: set tp %d, pp %d, "
                    "cp %d in Megatron-DeepSpeed's arguments",
                    s.layout.tp, s.layout.pp, s.layout.cp);
        if (d.uneven) {
            char split[256];
            model_split_format(s.layout.stage_layers, s.layout.n_stage_layers, split, sizeof split);
            px_warn("the uneven pipeline split %s is not expressible in DeepSpeed: its config has no "
                    "pipeline settings, and PipelineModule's partition_method balances by 'uniform', "
                    "'parameters' or 'type:' only; Megatron-DeepSpeed needs its layers placed by hand",
                    split);
        }
        if (s.layout.recompute == MODEL_RECOMPUTE_SELECTIVE)
            px_warn("selective recompute is not a DeepSpeed config setting (its checkpointing recomputes "
                    "whole layers): Megatron-DeepSpeed versions with Megatron-LM's recompute arguments "
                    "take it as --recompute-granularity selective");
        else if (s.layout.recompute == MODEL_RECOMPUTE_FULL)
            px_warn("full recompute: the activation_checkpointing block configures DeepSpeed's "
                    "checkpointing; Megatron-DeepSpeed turns it on with --checkpoint-activations "
                    "--deepspeed-activation-checkpointing");
        if (d.moe)
            px_warn("NOT EXPRESSIBLE: the %d experts over ep %d are not a DeepSpeed config setting: DeepSpeed "
                    "builds MoE in the model code (deepspeed.moe.layer.MoE(hidden_size, expert, num_experts=%d, "
                    "ep_size=%d, k=%d%s)); expert tensor parallel %d has no DeepSpeed equivalent beyond 1",
                    s.model.moe.experts, s.layout.ep, s.model.moe.experts, s.layout.ep, s.model.moe.topk,
                    s.model.moe.capacity_factor > 0 ? ", capacity_factor=..." : ", drop_tokens=False",
                    s.layout.etp);
        if (s.model.mla.kv_lora_rank > 0 || s.model.mtp_layers > 0)
            px_warn("NOT EXPRESSIBLE: multi-head latent attention and multi-token prediction are model code, "
                    "not DeepSpeed config settings");
        if (s.job.precision != PX_FP32 && s.layout.zero == 0 && s.job.grad_dtype != s.job.precision)
            px_warn("NOT EXPRESSIBLE: %s gradients of %s weights without ZeRO: DeepSpeed's engine accumulates them "
                    "in the weights' dtype there (data_types.grad_accum_dtype %s is for its ZeRO optimizers); "
                    "plan with --zero 1 or --grad-dtype %s",
                    px_dtype_name(s.job.grad_dtype), px_dtype_name(s.job.precision),
                    px_dtype_name(s.job.grad_dtype), px_dtype_name(s.job.precision));
        /* DeepSpeed's config has no FP8 training key (deepspeedai/DeepSpeed edaa7221: its fp8 code
         * is quantized inference and OptimizedLinear's weight storage) */
        if (s.job.fp8 != MODEL_FP8_NONE)
            px_warn("NOT EXPRESSIBLE: FP8 training (recipe %s, format %s%s) is not a DeepSpeed config setting: "
                    "Transformer Engine's layers and te.pytorch.fp8_autocast(fp8_recipe=...) go in the model "
                    "code; the config written is the %s one",
                    model_fp8_recipe_name(s.job.fp8), model_fp8_format_name(s.job.fp8_format),
                    s.job.fp8_param_gather ? ", FP8 parameters" : "",
                    s.job.precision == PX_FP16 ? "fp16" : s.job.precision == PX_BF16 ? "bf16" : "fp32");
        deepspeed_sharding_notes(&p);
        deepspeed(f, &p, &d);
        break;
    case EXPORT_NEMO:
        export_nemo1(f, &p, &d);
        export_bridge(f, &p, &d);
        break;
    case EXPORT_BRIDGE: export_bridge(f, &p, &d); break;
    case EXPORT_TORCHTITAN: return export_torchtitan(f, &p, &d, err);
    case EXPORT_SLURM: return export_slurm(f, &p, &d, err);
    case EXPORT_TORCHTITAN_TOML: return export_torchtitan_toml(f, &p, &d, err);
    default: return px_fail(err, PX_EINPUT, "unknown export format %d", (int)fmt);
    }
    return PX_OK;
}
