/* Megatron-LM export: a bash fragment to source (the launch environment validate_args checks and
 * the MEGATRON_ARGS array of pretrain_gpt.py's flags), names checked against Megatron-LM
 * d98e8a64 (megatron/training/arguments.py and the TransformerConfig fields it turns into
 * flags). What the flags cannot carry is a comment above them, never dropped silently. */
#include "export/internal.h"

#include <math.h>
#include <stdarg.h>

static void flag(FILE *f, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One element of the MEGATRON_ARGS array, one to a line: a flag and, with fmt, its value. */
static void flag(FILE *f, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    export_vflag(f, "\n", name, fmt, ap);
    va_end(ap);
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
        flag(f, "--moe-router-score-function", "%s", export_router_score(m));
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
        flag(f, "--moe-token-dispatcher-type", "%s", model_moe_dispatcher_name(t->moe_dispatcher));
        if (t->moe_dispatcher == MODEL_MOE_DISPATCH_FLEX)
            flag(f, "--moe-flex-dispatcher-backend", "deepep");
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
    if (m->experts <= 0)
        return;
    fprintf(f, "# experts: %d routed (top %d) over ep %d x etp %d, expert data parallel %d; %s\n",
            m->experts, m->topk, l->ep, l->etp, l->tp * l->cp * l->dp / (l->ep * l->etp),
            m->capacity_factor > 0 ? "capacity padded" : "dropless (no capacity factor)");
    export_imbalance_note(f, p, "Megatron setting");
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
                   "# no pretrain_gpt.py flag (arguments.py leaves it out of the generated ones)\n");
    if (t->fp8_dispatch && p->spec.model.moe.experts > 0)
        fprintf(f, "# FP8 dispatch has no flag for the %s dispatcher below: Megatron-Core quantizes the dispatch\n"
                   "# only on the ncclep flex dispatcher, in MXFP8 (--moe-dispatch-fwd-dtype mxfp8); these flags dispatch in bf16\n",
                t->moe_dispatcher == MODEL_MOE_DISPATCH_FLEX ? "flex (DeepEP)" : "alltoall");
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

/* The comments that open the fragment: the model, GPUs and cluster, the data-parallel size, the
 * torchrun line, and ZeRO 2-3 as Megatron FSDP. */
static void megatron_launch_notes(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    int nodes;
    const int per_node = export_node_size(p, &nodes);
    fprintf(f, "# Megatron-LM (pretrain_gpt.py) flags for %s on %d GPUs (%s), written by parallax\n",
            p->spec.model.name, p->gpus, p->cluster);
    fprintf(f, "# data-parallel size %d follows from the world size; %d micro-batch%s per step\n",
            l->dp, d->m, d->m == 1 ? "" : "es");
    fprintf(f, "# source this file, then on each node:\n"
               "#   torchrun --nnodes %d --nproc-per-node %d ... pretrain_gpt.py \"${MEGATRON_ARGS[@]}\" --data-path ... (or --mock-data)\n",
            nodes, per_node);
    /* the FSDP asserts: Megatron-LM since ab43d43f (2026-04), still at d98e8a64 */
    if (l->zero >= 2)
        fprintf(f, "# ZeRO-%d maps to Megatron FSDP (--use-megatron-fsdp and the sharding strategy below;\n"
                   "# Megatron-LM versions before the rename call the first flag --use-custom-fsdp), whose\n"
                   "# validate_args asserts --ckpt-format fsdp_dtensor\n",
                l->zero);
    export_gpipe_note(f, l);
}

/* How the flags below say the plan's pipeline split (split_said: export_megatron_pipeline's
 * answer, 0 for the even split, which needs no word). */
static void megatron_split_notes(FILE *f, const ModelLayout *l, const ExportMegatronSplit *ms, int split_said)
{
    if (!split_said)
        return;
    char split[256];
    model_split_format(l->stage_layers, l->n_stage_layers, split, sizeof split);
    if (ms->embed || ms->loss)
        fprintf(f, "# pipeline split %s: the %s counted as a layer, as Megatron-Core's flags below do\n", split,
                ms->embed && ms->loss ? "embedding and the loss each" : ms->embed ? "embedding" : "loss");
    else if (!ms->layout[0])
        fprintf(f, "# uneven pipeline split %s: the first/last stage's layers below, the rest even\n", split);
    else if (l->pp_layout[0])
        fprintf(f, "# pipeline split %s: the plan's layout string (Megatron-LM since 77732c36, core_v0.13.0)\n", split);
    else
        fprintf(f, "# uneven pipeline split %s: %s, which --decoder-first/last-pipeline-num-layers\n"
                   "# cannot say, so it goes as --pipeline-model-parallel-layout (Megatron-LM since 77732c36, core_v0.13.0;\n"
                   "# NOT EXPRESSIBLE in earlier versions, which split the middle stages evenly)\n",
                split, l->vpp > 1 ? "its virtual stages differ" : "its middle stages differ");
}

/* The tokenizer that sizes the embeddings, and a rotary scaling the flags cannot carry. */
static void megatron_model_notes(FILE *f, const ModelConfig *c)
{
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
}

/* The model's architecture and vocabulary. */
static void megatron_model(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
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
    flag(f, "--make-vocab-size-divisible-by", "%d", p->spec.job.pad_vocab);
}

/* Tensor, pipeline (the split as export_megatron_pipeline says it) and context parallelism,
 * then data parallelism, its sharding and overlap, and recompute. */
static void megatron_parallel(FILE *f, const ModelPlan *p, const ModelDims *d, const ExportMegatronSplit *ms,
                              int split_said)
{
    const ModelLayout *l = &p->spec.layout;
    flag(f, "--tensor-model-parallel-size", "%d", l->tp);
    flag(f, "--pipeline-model-parallel-size", "%d", l->pp);
    if (ms->embed)
        flag(f, "--account-for-embedding-in-pipeline-split", NULL);
    if (ms->loss)
        flag(f, "--account-for-loss-in-pipeline-split", NULL);
    if (ms->first >= 0)
        flag(f, "--decoder-first-pipeline-num-layers", "%d", ms->first);
    if (ms->last >= 0)
        flag(f, "--decoder-last-pipeline-num-layers", "%d", ms->last);
    if (ms->layout[0])
        flag(f, "--pipeline-model-parallel-layout", "'%s'", ms->layout);
    /* the layout string gives the chunks itself (arguments.py allows one of the three) */
    else if (l->vpp > 1 && split_said)
        flag(f, "--num-virtual-stages-per-pipeline-rank", "%d", l->vpp);
    else if (l->vpp > 1)
        flag(f, "--num-layers-per-virtual-pipeline-stage", "%d", p->spec.model.layers / (l->pp * l->vpp));
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
}

/* Batch, precision (FP8 included), attention, the optimizer and its schedule. */
static void megatron_training(FILE *f, const ModelPlan *p, const ExportTrain *tr)
{
    const ModelJob *t = &p->spec.job;
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
    flag(f, "--lr", "%g", tr->lr);
    flag(f, "--min-lr", "%g", tr->min_lr);
    if (tr->wsd) {
        flag(f, "--lr-decay-style", "WSD");
        flag(f, "--lr-wsd-decay-style", "cosine");
        flag(f, "--lr-wsd-decay-iters", "%d", tr->wsd_iters);
    } else {
        flag(f, "--lr-decay-style", "cosine");
    }
    flag(f, "--lr-warmup-iters", "%d", tr->warmup);
    flag(f, "--lr-decay-iters", "%d", tr->decay_iters);
    flag(f, "--train-iters", "%d", tr->iters);
    flag(f, "--weight-decay", "%g", t->weight_decay);
    flag(f, "--clip-grad", "%g", t->grad_clip);
    flag(f, "--seed", "%llu", (unsigned long long)t->seed);
}

void export_megatron(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    ExportMegatronSplit ms;
    const int split_said = export_megatron_pipeline(p, d, &ms);
    ExportTrain tr;
    PxError err;
    (void)export_train(p, d, &tr, &err); /* export_plan checked it */
    megatron_launch_notes(f, p, d);
    megatron_split_notes(f, &p->spec.layout, &ms, split_said);
    megatron_model_notes(f, &p->spec.model);
    megatron_moe_notes(f, p);
    megatron_fp8_notes(f, p);
    export_train_comments(f, &tr);
    export_framework_note(f, p, MODEL_FW_MEGATRON);
    megatron_env(f, p);
    fprintf(f, "MEGATRON_ARGS=(\n");
    megatron_model(f, p, d);
    megatron_parallel(f, p, d, &ms, split_said);
    megatron_moe(f, p);
    megatron_training(f, p, &tr);
    fprintf(f, ")\n");
    if (p->spec.job.optimizer == MODEL_OPT_ADAM_8BIT)
        fprintf(f, "# 8-bit Adam has no Megatron-LM flag: its memory was planned, the flags use Adam\n");
}
