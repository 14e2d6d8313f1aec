/* Exports a plan to the frameworks that run it: Megatron-LM command-line flags, a DeepSpeed
 * config, NeMo (1.x Hydra) and Megatron-Bridge overrides. Flag names follow each framework's
 * documentation; what a framework cannot express is said in a comment, never dropped silently. */
#include "sim/sim.h"

#include <stdarg.h>
#include <string.h>

const char *sim_export_name(SimExportFormat f)
{
    static const char *const names[] = {"megatron", "deepspeed", "nemo"};
    return (unsigned)f < 3 ? names[f] : "?";
}

int sim_export_from_name(const char *s)
{
    for (int i = 0; i < 3; i++)
        if (s && strcmp(s, sim_export_name((SimExportFormat)i)) == 0)
            return i;
    return -1;
}

static void flag(FILE *f, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

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
    fputs(" \\\n", f);
}

/* An uneven split as Megatron-Core takes it: the first and/or the last stage's layers given
 * (--decoder-first/last-pipeline-num-layers), the other stages sharing the rest evenly
 * (get_transformer_layer_offset). *first and *last get -1 when not needed. Returns 0 when the
 * split is not of that form: its middle stages differ. */
static int megatron_split(const ModelLayout *l, int *first, int *last)
{
    const int p = l->n_stage_layers, *n = l->stage_layers;
    *first = *last = -1;
    if (p == 2) {
        *first = n[0];
        *last = n[1];
        return 1;
    }
    for (int i = 2; i < p - 1; i++)
        if (n[i] != n[1])
            return 0;
    if (n[0] != n[1])
        *first = n[0];
    if (n[p - 1] != n[1])
        *last = n[p - 1];
    return 1;
}

/* GPipe (every forward, then every backward) is not a schedule Megatron-LM, NeMo or
 * Megatron-Bridge offer: their non-interleaved pipeline is 1F1B. */
static const char *const gpipe_note =
    "# NOT EXPRESSIBLE: the plan's GPipe schedule; Megatron runs 1F1B here, with the same bubble and\n"
    "# fewer activations in flight (plan with --schedule 1f1b for its exact prediction)\n";

/* Megatron-Core's experimental --pipeline-model-parallel-layout for a split: "Et*2|t*3|tL" */
static void megatron_layout(char *buf, size_t cap, const ModelLayout *l)
{
    size_t n = 0;
    for (int i = 0; i < l->n_stage_layers && n < cap; i++) {
        int k = l->stage_layers[i];
        int w = snprintf(buf + n, cap - n, "%s%s%s", i ? "|" : "", i == 0 ? "E" : "", k > 1 ? "t*" : "t");
        if (w < 0)
            return;
        n += (size_t)w;
        if (k > 1 && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%d", k);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "L");
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
 * ncclep flex dispatcher (moe_dispatch_fwd_dtype): both are said in comments. */
static int fp8_param_gather_ok(const ModelPlan *p)
{
    return p->spec.job.fp8_param_gather && p->spec.layout.zero >= 1;
}

static void megatron_fp8_notes(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    if (t->fp8 == MODEL_FP8_NONE)
        return;
    if (t->fp8 == MODEL_FP8_MXFP8)
        fprintf(f, "# --fp8-recipe mxfp8 runs on Blackwell only: Transformer Engine checks the device, validate_args does not\n");
    if (t->fp8_param_gather && !fp8_param_gather_ok(p))
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
    if (fp8_param_gather_ok(p))
        flag(f, "--fp8-param-gather", NULL);
}

static void megatron(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    fprintf(f, "# Megatron-LM (pretrain_gpt.py) flags for %s on %d GPUs (%s), written by parallax\n",
            c->name, p->gpus, p->cluster);
    fprintf(f, "# data-parallel size %d follows from the world size; %d micro-batches per step\n",
            l->dp, d->m);
    /* the FSDP asserts: Megatron-LM since ab43d43f (2026-04), still at d98e8a64 */
    if (l->zero >= 2)
        fprintf(f, "# ZeRO-%d maps to Megatron FSDP (--use-megatron-fsdp and the sharding strategy below;\n"
                   "# Megatron-LM versions before the rename call the first flag --use-custom-fsdp), whose\n"
                   "# validate_args asserts --ckpt-format fsdp_dtensor and CUDA_DEVICE_MAX_CONNECTIONS unset or > 1\n",
                l->zero);
    if (l->schedule == MODEL_SCHED_GPIPE && l->pp > 1)
        fprintf(f, "%s", gpipe_note);
    int split_first = -1, split_last = -1, split_ok = 1;
    if (d->uneven) {
        char split[256];
        model_split_format(l->stage_layers, l->n_stage_layers, split, sizeof split);
        split_ok = megatron_split(l, &split_first, &split_last);
        if (split_ok) {
            fprintf(f, "# uneven pipeline split %s: the first/last stage's layers below, the rest even\n", split);
        } else {
            char lay[1024];
            megatron_layout(lay, sizeof lay, l);
            fprintf(f, "# NOT EXPRESSIBLE: the uneven pipeline split %s has middle stages of different sizes,\n"
                       "# which --decoder-first/last-pipeline-num-layers cannot say (Megatron splits the middle\n"
                       "# stages evenly), so the flags below do not carry it. Megatron-Core versions with the\n"
                       "# experimental layout flag take it as --pipeline-model-parallel-layout '%s'\n",
                    split, lay);
        }
    }
    /* Megatron FSDP only warns that tp or cp > 1 would rather have one connection */
    if ((l->tp > 1 || l->cp > 1) && l->zero < 2)
        fprintf(f, "# with tp or cp > 1 Megatron-LM's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 in the\n"
                   "# environment (before Blackwell): export CUDA_DEVICE_MAX_CONNECTIONS=1\n");
    megatron_moe_notes(f, p);
    megatron_fp8_notes(f, p);
    fprintf(f, "MEGATRON_ARGS=\\\n");
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
    }
    if (!c->tied_embeddings)
        flag(f, "--untie-embeddings-and-output-weights", NULL);
    if (!c->bias)
        flag(f, "--disable-bias-linear", NULL);
    if (!c->bias && c->qkv_bias)
        flag(f, "--add-qkv-bias", NULL);
    flag(f, "--make-vocab-size-divisible-by", "%d", t->pad_vocab);
    flag(f, "--tensor-model-parallel-size", "%d", l->tp);
    flag(f, "--pipeline-model-parallel-size", "%d", l->pp);
    if (split_first >= 0)
        flag(f, "--decoder-first-pipeline-num-layers", "%d", split_first);
    if (split_last >= 0)
        flag(f, "--decoder-last-pipeline-num-layers", "%d", split_last);
    if (l->vpp > 1)
        flag(f, "--num-layers-per-virtual-pipeline-stage", "%d", c->layers / (l->pp * l->vpp));
    if (l->cp > 1)
        flag(f, "--context-parallel-size", "%d", l->cp);
    if (l->sp)
        flag(f, "--sequence-parallel", NULL);
    if (l->zero == 1)
        flag(f, "--use-distributed-optimizer", NULL);
    if (l->zero >= 2) {
        flag(f, "--use-megatron-fsdp", NULL);
        flag(f, "--data-parallel-sharding-strategy", "%s", l->zero == 2 ? "optim_grads" : "optim_grads_params");
        flag(f, "--ckpt-format", "fsdp_dtensor");
    }
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
    fprintf(f, "    --seed %llu\n", (unsigned long long)t->seed);
    if (t->optimizer == MODEL_OPT_ADAM_8BIT)
        fprintf(f, "# 8-bit Adam has no Megatron-LM flag: its memory was planned, the flags use Adam\n");
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
        cJSON_AddNumberToObject(h, "initial_scale_power", 16);
    }
    cJSON *z = cJSON_AddObjectToObject(j, "zero_optimization");
    cJSON_AddNumberToObject(z, "stage", l->zero);
    cJSON_AddBoolToObject(z, "overlap_comm", l->overlap_dp);
    cJSON_AddBoolToObject(z, "contiguous_gradients", 1);
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
    /* DeepSpeed's checkpointing recomputes whole layers: the block is for full recompute only */
    if (l->recompute == MODEL_RECOMPUTE_FULL) {
        cJSON *ac = cJSON_AddObjectToObject(j, "activation_checkpointing");
        cJSON_AddBoolToObject(ac, "partition_activations", l->sp);
        cJSON_AddBoolToObject(ac, "contiguous_memory_optimization", 0);
        cJSON_AddBoolToObject(ac, "cpu_checkpointing", 0);
    }
    char *s = cJSON_Print(j);
    fprintf(f, "%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

/* A MoE plan's expert and MLA settings as overrides: NeMo 1.x's model.* keys and
 * Megatron-Bridge's model provider (TransformerConfig's field names) share them, but for the
 * layer pattern and the expert tensor degree, which NeMo 1.x does not take. */
static void nemo_moe(FILE *f, const ModelPlan *p, int bridge)
{
    const ModelConfig *c = &p->spec.model;
    const ModelMoe *m = &c->moe;
    const ModelLayout *l = &p->spec.layout;
    if (m->experts > 0) {
        fprintf(f, "model.num_moe_experts=%d model.moe_router_topk=%d model.expert_model_parallel_size=%d",
                m->experts, m->topk, l->ep);
        if (bridge)
            fprintf(f, " model.expert_tensor_parallel_size=%d", l->etp);
        fprintf(f, "\nmodel.moe_ffn_hidden_size=%d", m->expert_ffn);
        if (m->shared_ffn > 0)
            fprintf(f, " model.moe_shared_expert_intermediate_size=%d", m->shared_ffn);
        if (bridge) {
            fprintf(f, " model.moe_layer_freq=[");
            for (int i = 0; i < c->layers; i++)
                fprintf(f, "%s%d", i ? "," : "", model_layer_is_moe(c, i));
            fprintf(f, "]");
        }
        fprintf(f, "\nmodel.moe_router_score_function=%s", m->score == MODEL_ROUTER_SIGMOID ? "sigmoid" : "softmax");
        if (m->groups > 0)
            fprintf(f, " model.moe_router_num_groups=%d model.moe_router_group_topk=%d", m->groups, m->topk_groups);
        fprintf(f, " model.moe_router_load_balancing_type=%s model.moe_aux_loss_coeff=%g",
                m->aux_loss_coeff > 0 ? "aux_loss" : "none", m->aux_loss_coeff);
        if (m->capacity_factor > 0)
            fprintf(f, " model.moe_expert_capacity_factor=%g model.moe_pad_expert_input_to_capacity=true",
                    m->capacity_factor);
        fprintf(f, "\nmodel.moe_token_dispatcher_type=alltoall model.moe_grouped_gemm=true");
        if (p->spec.job.moe_force_balance)
            fprintf(f, " model.moe_router_force_load_balancing=true");
        if (l->overlap_ep && m->shared_ffn > 0)
            fprintf(f, " model.moe_shared_expert_overlap=true");
        fprintf(f, "\n");
        if (!bridge && m->first_dense + (m->layer_freq > 1) > 0)
            fprintf(f, "# NOT EXPRESSIBLE in NeMo 1.x, which makes every layer MoE: this model's dense layers (the first %d;\n"
                       "# after them every %d-th layer is MoE) need Megatron-Bridge's model.moe_layer_freq below\n",
                    m->first_dense, m->layer_freq);
        if (!bridge && l->etp != l->tp)
            fprintf(f, "# NOT EXPRESSIBLE in NeMo 1.x: expert tensor parallel %d differs from tp %d (Megatron-Bridge's model.expert_tensor_parallel_size below)\n",
                    l->etp, l->tp);
    }
    if (c->mla.kv_lora_rank > 0) {
        fprintf(f, "model.multi_latent_attention=true");
        if (c->mla.q_lora_rank > 0)
            fprintf(f, " model.q_lora_rank=%d", c->mla.q_lora_rank);
        fprintf(f, " model.kv_lora_rank=%d model.qk_head_dim=%d model.qk_pos_emb_head_dim=%d model.v_head_dim=%d\n",
                c->mla.kv_lora_rank, c->mla.qk_nope_dim, c->mla.qk_rope_dim, c->mla.v_dim);
    }
    if (c->mtp_layers > 0)
        fprintf(f, "model.mtp_num_layers=%d\n", c->mtp_layers);
}

/* NeMo 1.x's FP8 keys (NVIDIA/NeMo 8cfedd72, examples/nlp/language_modeling/conf/
 * megatron_gpt_config.yaml and megatron_gpt_model.py): fp8 with fp8_e4m3 / fp8_hybrid,
 * fp8_amax_history_len, fp8_amax_compute_algo, all for delayed scaling, and fp8_params, whose
 * weights fp8_model_init builds under DelayedScaling. Other recipes and FP8 attention go
 * through build_transformer_config, which hands Megatron-Core's TransformerConfig every model
 * key named as one of its fields; those keys are not in the yaml, so Hydra needs the '+'. FP8
 * needs the Transformer Engine layer spec (transformer_engine, false in the yaml). */
static void nemo1_fp8(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    if (t->fp8 == MODEL_FP8_NONE)
        return;
    const int delayed = t->fp8 == MODEL_FP8_DELAYED, e4m3 = t->fp8_format == MODEL_FP8_E4M3;
    if (!delayed || t->fp8_attention)
        fprintf(f, "# NeMo 1.x's own FP8 keys are delayed scaling's; the '+' keys reach Megatron-Core's TransformerConfig\n");
    fprintf(f, "model.transformer_engine=true model.fp8=true model.fp8_e4m3=%s model.fp8_hybrid=%s",
            e4m3 ? "true" : "false", e4m3 ? "false" : "true");
    if (delayed)
        fprintf(f, " model.fp8_amax_history_len=%d model.fp8_amax_compute_algo=max", t->fp8_amax_history);
    else
        fprintf(f, " +model.fp8_recipe=%s", model_fp8_recipe_name(t->fp8));
    if (delayed && fp8_param_gather_ok(p))
        fprintf(f, " +model.fp8_params=true");
    if (t->fp8_attention)
        fprintf(f, " +model.fp8_dot_product_attention=true");
    fprintf(f, "\n");
    if (t->fp8_param_gather && !delayed)
        fprintf(f, "# NOT EXPRESSIBLE in NeMo 1.x: FP8 parameters under the %s recipe (model.fp8_params builds them\n"
                   "# under DelayedScaling); the weights stay 16-bit beside their FP8 copies\n",
                model_fp8_recipe_name(t->fp8));
    else if (t->fp8_param_gather && !fp8_param_gather_ok(p))
        fprintf(f, "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0); the weights stay\n"
                   "# 16-bit beside their FP8 copies (plan with --zero 1 for model.fp8_params)\n");
}

/* Megatron-Bridge's mixed-precision recipe for an FP8 plan and where the plan differs from its
 * defaults (NVIDIA-NeMo/Megatron-Bridge 067f987d, src/megatron/bridge/training/
 * mixed_precision.py): delayed is *_with_fp8_delayed_scaling_mixed (hybrid, history 1024, max,
 * FP8 parameters), tensorwise *_with_fp8_current_scaling_mixed (hybrid, FP8 parameters, the
 * first and last layers in bf16, which parallax does not plan), blockwise
 * *_with_fp8_subchannel_scaling_mixed (hybrid, no FP8 parameters), mxfp8 *_with_mxfp8_mixed
 * (e4m3, FP8 parameters with reuse_grad_buf_for_mxfp8_param_ag, which Megatron-Core's DDP
 * config allows only with them). The recipe's setup() copies its fields over the model's, so
 * the differences go to mixed_precision.*: keys of a MixedPrecisionConfig, which a recipe
 * that names its precision by string does not hold. */
static void bridge_fp8(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    static const char *const names[] = {NULL, "fp8_delayed_scaling", "fp8_current_scaling",
                                        "fp8_subchannel_scaling", "mxfp8"};
    if (t->precision == PX_FP32) {
        fprintf(f, "mixed_precision=null\n# NOT EXPRESSIBLE: FP8 GEMMs on fp32 weights (Megatron-Bridge's FP8 recipes are bf16_with_* and fp16_with_*)\n");
        return;
    }
    fprintf(f, "mixed_precision=%s_with_%s_mixed\n", t->precision == PX_FP16 ? "fp16" : "bf16", names[t->fp8]);
    const int want_e4m3 = t->fp8 == MODEL_FP8_MXFP8, want_pg = t->fp8 != MODEL_FP8_BLOCKWISE;
    const int pg = fp8_param_gather_ok(p);
    char diff[512] = "";
    size_t n = 0;
    if ((t->fp8_format == MODEL_FP8_E4M3) != want_e4m3)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8=%s", model_fp8_format_name(t->fp8_format));
    if (t->fp8 == MODEL_FP8_DELAYED && t->fp8_amax_history != 1024)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8_amax_history_len=%d", t->fp8_amax_history);
    if (pg != want_pg)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8_param_gather=%s", pg ? "true" : "false");
    if (t->fp8 == MODEL_FP8_MXFP8 && !pg)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=false");
    if (t->fp8 == MODEL_FP8_TENSORWISE)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.first_last_layers_bf16=false");
    if (t->fp8_attention)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8_dot_product_attention=true");
    if (n > 0)
        fprintf(f, "# the plan differs from that recipe in these MixedPrecisionConfig keys (overrides where the recipe\n"
                   "# holds the object, not its name; else set them on it in Python):\n#%s\n", diff);
    if (t->fp8_param_gather && !pg)
        fprintf(f, "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0): they stay 16-bit\n");
}

static void nemo(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    /* devices per node from the plan's cluster profile */
    int per_node = prof_node_size(&p->profile, p->gpus);
    if (per_node > p->gpus)
        per_node = p->gpus;
    const char *prec = t->precision == PX_BF16 ? "bf16-mixed" : t->precision == PX_FP16 ? "16-mixed" : "32";
    fprintf(f, "# NeMo 1.x (megatron_gpt_pretraining.py) Hydra overrides for %s on %d GPUs\n", c->name, p->gpus);
    if (l->schedule == MODEL_SCHED_GPIPE && l->pp > 1)
        fprintf(f, "%s", gpipe_note);
    fprintf(f, "trainer.devices=%d trainer.num_nodes=%d trainer.precision=%s trainer.max_steps=%d\n",
            per_node, (p->gpus + per_node - 1) / per_node, prec, t->steps);
    fprintf(f, "model.tensor_model_parallel_size=%d model.pipeline_model_parallel_size=%d\n", l->tp, l->pp);
    fprintf(f, "model.virtual_pipeline_model_parallel_size=%s", l->vpp > 1 ? "" : "null");
    if (l->vpp > 1)
        fprintf(f, "%d", l->vpp);
    fprintf(f, " model.context_parallel_size=%d model.sequence_parallel=%s\n", l->cp, l->sp ? "true" : "false");
    fprintf(f, "model.micro_batch_size=%d model.global_batch_size=%d model.encoder_seq_length=%d\n",
            t->micro_batch, t->global_batch, d->s);
    fprintf(f, "model.num_layers=%d model.hidden_size=%d model.ffn_hidden_size=%d model.num_attention_heads=%d model.num_query_groups=%d\n",
            c->layers, c->hidden, c->ffn_hidden, c->heads, c->kv_heads);
    char split[256] = "";
    int split_first = -1, split_last = -1, split_ok = 1;
    if (d->uneven) {
        model_split_format(l->stage_layers, l->n_stage_layers, split, sizeof split);
        split_ok = megatron_split(l, &split_first, &split_last);
        fprintf(f, "# these NeMo 1.x overrides do not carry the uneven pipeline split %s%s\n", split,
                split_ok ? " (the Megatron-Bridge ones below do)" : "");
    }
    nemo_moe(f, p, 0);
    if (l->recompute == MODEL_RECOMPUTE_NONE)
        fprintf(f, "model.activations_checkpoint_granularity=null\n");
    else if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        fprintf(f, "model.activations_checkpoint_granularity=selective\n");
    else
        fprintf(f, "model.activations_checkpoint_granularity=full model.activations_checkpoint_method=uniform model.activations_checkpoint_num_layers=1\n");
    fprintf(f, "model.optim.name=%s model.optim.lr=%g model.optim.weight_decay=%g model.optim.betas=[%g,%g]\n",
            l->zero >= 1 ? "distributed_fused_adam" : "fused_adam", t->lr, t->weight_decay, t->beta1, t->beta2);
    fprintf(f, "model.optim.sched.name=CosineAnnealing model.optim.sched.warmup_steps=%d model.optim.sched.min_lr=%g\n",
            t->warmup_steps, t->min_lr);
    fprintf(f, "model.use_flash_attention=%s model.hidden_dropout=%g model.attention_dropout=%g\n",
            t->flash_attn ? "true" : "false", t->dropout, t->dropout);
    nemo1_fp8(f, p);
    if (l->zero >= 2)
        fprintf(f, "# ZeRO-%d: NeMo 1.x shards optimizer state only (distributed_fused_adam)\n", l->zero);

    fprintf(f, "\n# Megatron-Bridge (ConfigContainer) overrides\n");
    fprintf(f, "model.tensor_model_parallel_size=%d model.pipeline_model_parallel_size=%d", l->tp, l->pp);
    if (l->vpp > 1)
        fprintf(f, " model.virtual_pipeline_model_parallel_size=%d", l->vpp);
    fprintf(f, " model.context_parallel_size=%d model.sequence_parallel=%s\n", l->cp, l->sp ? "true" : "false");
    if (d->uneven && split_ok) {
        if (split_first >= 0)
            fprintf(f, "model.num_layers_in_first_pipeline_stage=%d%s", split_first, split_last >= 0 ? " " : "\n");
        if (split_last >= 0)
            fprintf(f, "model.num_layers_in_last_pipeline_stage=%d\n", split_last);
    } else if (d->uneven) {
        fprintf(f, "# NOT EXPRESSIBLE: the uneven pipeline split %s has middle stages of different sizes "
                   "(num_layers_in_first/last_pipeline_stage leave the middle even)\n", split);
    }
    fprintf(f, "model.seq_length=%d dataset.sequence_length=%d\n", d->s, d->s);
    nemo_moe(f, p, 1);
    if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        fprintf(f, "model.recompute_granularity=selective\n");
    else if (l->recompute == MODEL_RECOMPUTE_FULL)
        fprintf(f, "model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1\n");
    fprintf(f, "train.micro_batch_size=%d train.global_batch_size=%d train.train_iters=%d\n",
            t->micro_batch, t->global_batch, t->steps);
    fprintf(f, "optimizer.lr=%g optimizer.min_lr=%g optimizer.weight_decay=%g optimizer.clip_grad=%g optimizer.use_distributed_optimizer=%s\n",
            t->lr, t->min_lr, t->weight_decay, t->grad_clip, l->zero >= 1 ? "true" : "false");
    fprintf(f, "ddp.use_distributed_optimizer=%s ddp.overlap_grad_reduce=%s ddp.overlap_param_gather=%s\n",
            l->zero >= 1 ? "true" : "false", l->overlap_dp ? "true" : "false",
            l->overlap_dp && l->zero >= 1 ? "true" : "false");
    if (l->zero >= 2)
        fprintf(f, "dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=%s checkpoint.ckpt_format=fsdp_dtensor\n",
                l->zero == 2 ? "optim_grads" : "optim_grads_params");
    fprintf(f, "scheduler.lr_warmup_iters=%d scheduler.lr_decay_style=cosine", t->warmup_steps);
    if (t->fp8 != MODEL_FP8_NONE) {
        fprintf(f, "\n");
        bridge_fp8(f, p);
    } else {
        fprintf(f, " mixed_precision=%s\n",
                t->precision == PX_BF16 ? "bf16_mixed" : t->precision == PX_FP16 ? "fp16_mixed" : "null");
    }
}

int sim_export(FILE *f, const ModelPlan *plan, SimExportFormat fmt, PxError *err)
{
    ModelSpec s = plan->spec;
    ModelDims d;
    int rc = model_spec_check(&s, plan->gpus, &d, err);
    if (rc)
        return rc;
    ModelPlan p = *plan;
    p.spec = s;
    switch (fmt) {
    case SIM_EXPORT_MEGATRON: megatron(f, &p, &d); break;
    case SIM_EXPORT_DEEPSPEED:
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
        /* DeepSpeed's config has no FP8 training key (deepspeedai/DeepSpeed edaa7221: its fp8 code
         * is quantized inference and OptimizedLinear's weight storage) */
        if (s.job.fp8 != MODEL_FP8_NONE)
            px_warn("NOT EXPRESSIBLE: FP8 training (recipe %s, format %s%s) is not a DeepSpeed config setting: "
                    "Transformer Engine's layers and te.pytorch.fp8_autocast(fp8_recipe=...) go in the model "
                    "code; the config written is the %s one",
                    model_fp8_recipe_name(s.job.fp8), model_fp8_format_name(s.job.fp8_format),
                    s.job.fp8_param_gather ? ", FP8 parameters" : "",
                    s.job.precision == PX_FP16 ? "fp16" : s.job.precision == PX_BF16 ? "bf16" : "fp32");
        deepspeed(f, &p, &d);
        break;
    case SIM_EXPORT_NEMO: nemo(f, &p, &d); break;
    default: return px_fail(err, PX_EINPUT, "unknown export format %d", (int)fmt);
    }
    return PX_OK;
}
