/* DeepSpeed export: the config JSON (batch, precision, ZeRO, optimizer, scheduler, activation
 * checkpointing), checked by DeepSpeed's own config classes (tests/clients/deepspeed_check.py).
 * What the config cannot say (tensor, pipeline and context degrees, MoE, FP8, ...) goes to
 * stderr as warnings, never dropped silently. */
#include "export/internal.h"

#include <math.h>

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

/* The optimizer and its learning-rate schedule (DeepSpeed's WarmupCosineLR). */
static void deepspeed_optimizer(cJSON *j, const ModelJob *t, const ExportTrain *tr)
{
    cJSON *o = cJSON_AddObjectToObject(j, "optimizer");
    cJSON *op = cJSON_CreateObject();
    if (t->optimizer == MODEL_OPT_SGD_MOMENTUM) {
        cJSON_AddStringToObject(o, "type", "SGD");
        cJSON_AddNumberToObject(op, "lr", tr->lr);
        cJSON_AddNumberToObject(op, "momentum", t->momentum);
        cJSON_AddNumberToObject(op, "weight_decay", t->weight_decay);
    } else {
        cJSON_AddStringToObject(o, "type", "AdamW");
        cJSON_AddNumberToObject(op, "lr", tr->lr);
        double betas[2] = {t->beta1, t->beta2};
        cJSON_AddItemToObject(op, "betas", cJSON_CreateDoubleArray(betas, 2));
        cJSON_AddNumberToObject(op, "eps", t->adam_eps);
        cJSON_AddNumberToObject(op, "weight_decay", t->weight_decay);
    }
    cJSON_AddItemToObject(o, "params", op);
    cJSON *sch = cJSON_AddObjectToObject(j, "scheduler");
    cJSON_AddStringToObject(sch, "type", "WarmupCosineLR");
    cJSON *sp = cJSON_AddObjectToObject(sch, "params");
    /* the cosine reaches cos_min_ratio at total_num_steps: the decay's end, or the training's when
     * the decay ends before it (deepspeed_train_notes says so) */
    cJSON_AddNumberToObject(sp, "total_num_steps", tr->decay_iters > tr->iters ? tr->decay_iters : tr->iters);
    cJSON_AddNumberToObject(sp, "warmup_num_steps", tr->warmup);
    cJSON_AddNumberToObject(sp, "cos_min_ratio", export_ratio(tr->min_lr, tr->lr));
    /* parallax warms up linearly (DeepSpeed's default is logarithmic) */
    cJSON_AddStringToObject(sp, "warmup_type", "linear");
}

/* The config JSON itself. */
static void deepspeed_config(FILE *f, const ModelPlan *p, const ModelDims *d)
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
     * weights with fp32 gradients (deepspeed_notes warns) */
    if (t->precision != PX_FP32 && (l->zero >= 1 || t->grad_dtype == t->precision)) {
        cJSON *dt = cJSON_AddObjectToObject(j, "data_types");
        cJSON_AddStringToObject(dt, "grad_accum_dtype", px_dtype_name(t->grad_dtype));
    }
    cJSON *z = cJSON_AddObjectToObject(j, "zero_optimization");
    cJSON_AddNumberToObject(z, "stage", l->zero);
    cJSON_AddBoolToObject(z, "overlap_comm", l->overlap_dp);
    cJSON_AddBoolToObject(z, "contiguous_gradients", 1);
    deepspeed_sharding(z, p, d);
    ExportTrain tr;
    PxError err;
    (void)export_train(p, d, &tr, &err); /* export_plan checked it */
    deepspeed_optimizer(j, t, &tr);
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


/* What DeepSpeed's config cannot say of the layout, the model and the precision (on stderr). */
static void deepspeed_notes(const ModelPlan *p, const ModelDims *d)
{
    const ModelSpec *s = &p->spec;
    if (s->layout.tp > 1 || s->layout.pp > 1 || s->layout.cp > 1)
        px_warn("DeepSpeed's config has no tensor, pipeline or context degrees: set tp %d, pp %d, "
                "cp %d in Megatron-DeepSpeed's arguments",
                s->layout.tp, s->layout.pp, s->layout.cp);
    if (d->uneven) {
        char split[256];
        model_split_format(s->layout.stage_layers, s->layout.n_stage_layers, split, sizeof split);
        px_warn("the uneven pipeline split %s is not expressible in DeepSpeed: its config has no "
                "pipeline settings, and PipelineModule's partition_method balances by 'uniform', "
                "'parameters' or 'type:' only; Megatron-DeepSpeed needs its layers placed by hand",
                split);
    }
    if (s->layout.recompute == MODEL_RECOMPUTE_SELECTIVE)
        px_warn("selective recompute is not a DeepSpeed config setting (its checkpointing recomputes "
                "whole layers): Megatron-DeepSpeed versions with Megatron-LM's recompute arguments "
                "take it as --recompute-granularity selective");
    else if (s->layout.recompute == MODEL_RECOMPUTE_FULL)
        px_warn("full recompute: the activation_checkpointing block configures DeepSpeed's "
                "checkpointing; Megatron-DeepSpeed turns it on with --checkpoint-activations "
                "--deepspeed-activation-checkpointing");
    if (d->moe)
        px_warn("NOT EXPRESSIBLE: the %d experts over ep %d are not a DeepSpeed config setting: DeepSpeed "
                "builds MoE in the model code (deepspeed.moe.layer.MoE(hidden_size, expert, num_experts=%d, "
                "ep_size=%d, k=%d%s)); expert tensor parallel %d has no DeepSpeed equivalent beyond 1",
                s->model.moe.experts, s->layout.ep, s->model.moe.experts, s->layout.ep, s->model.moe.topk,
                s->model.moe.capacity_factor > 0 ? ", capacity_factor=..." : ", drop_tokens=False",
                s->layout.etp);
    if (s->model.mla.kv_lora_rank > 0 || s->model.mtp_layers > 0)
        px_warn("NOT EXPRESSIBLE: multi-head latent attention and multi-token prediction are model code, "
                "not DeepSpeed config settings");
    if (s->job.precision != PX_FP32 && s->layout.zero == 0 && s->job.grad_dtype != s->job.precision)
        px_warn("NOT EXPRESSIBLE: %s gradients of %s weights without ZeRO: DeepSpeed's engine accumulates them "
                "in the weights' dtype there (data_types.grad_accum_dtype %s is for its ZeRO optimizers); "
                "plan with --zero 1 or --grad-dtype %s",
                px_dtype_name(s->job.grad_dtype), px_dtype_name(s->job.precision),
                px_dtype_name(s->job.grad_dtype), px_dtype_name(s->job.precision));
    /* DeepSpeed's config has no FP8 training key (deepspeedai/DeepSpeed edaa7221: its fp8 code
     * is quantized inference and OptimizedLinear's weight storage) */
    if (s->job.fp8 != MODEL_FP8_NONE)
        px_warn("NOT EXPRESSIBLE: FP8 training (recipe %s, format %s%s) is not a DeepSpeed config setting: "
                "Transformer Engine's layers and te.pytorch.fp8_autocast(fp8_recipe=...) go in the model "
                "code; the config written is the %s one",
                model_fp8_recipe_name(s->job.fp8), model_fp8_format_name(s->job.fp8_format),
                s->job.fp8_param_gather ? ", FP8 parameters" : "",
                s->job.precision == PX_FP16 ? "fp16" : s->job.precision == PX_BF16 ? "bf16" : "fp32");
}

/* The training figures (on stderr): where they come from, the length, which a DeepSpeed config
 * does not hold, and the decays WarmupCosineLR cannot follow. */
static void deepspeed_train_notes(const ModelPlan *p, const ModelDims *d)
{
    ExportTrain tr;
    PxError err;
    (void)export_train(p, d, &tr, &err); /* export_plan checked it */
    export_train_warn(&tr);
    export_framework_note(NULL, p, MODEL_FW_DEEPSPEED);
    px_warn("train for %d iterations: the length is the training loop's, not a DeepSpeed config setting", tr.iters);
    if (tr.wsd)
        px_warn("NOT EXPRESSIBLE: the peak held to iteration %d before the cosine decay: WarmupCosineLR decays from "
                "the warm-up's end", tr.decay_iters - tr.wsd_iters);
    if (tr.decay_iters < tr.iters)
        px_warn("NOT EXPRESSIBLE: the minimum reached at iteration %d and held to %d: WarmupCosineLR reaches it at "
                "total_num_steps, the last iteration", tr.decay_iters, tr.iters);
}

void export_deepspeed(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    deepspeed_notes(p, d);
    deepspeed_train_notes(p, d);
    deepspeed_sharding_notes(p);
    deepspeed_config(f, p, d);
}
