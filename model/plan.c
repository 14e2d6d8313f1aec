/* Plans: the layout, training job and prediction the planner hands to the executor, and the
 * JSON (de)serialisation of layouts and jobs that sim's output shares. */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const recompute_names[] = {"none", "selective", "full"};
static const char *const schedule_names[] = {"1f1b", "gpipe", "interleaved"};
static const char *const optimizer_names[] = {"adamw", "sgd-momentum", "adam-8bit"};
static const char *const float_names[] = {"fp32", "bf16", "fp16"};

cJSON *model_layout_to_json(const ModelLayout *l)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "dp", l->dp);
    cJSON_AddNumberToObject(j, "tp", l->tp);
    cJSON_AddNumberToObject(j, "pp", l->pp);
    cJSON_AddNumberToObject(j, "cp", l->cp);
    cJSON_AddNumberToObject(j, "vpp", l->vpp);
    cJSON_AddNumberToObject(j, "zero", l->zero);
    cJSON_AddBoolToObject(j, "sp", l->sp);
    cJSON_AddStringToObject(j, "recompute", model_recompute_name(l->recompute));
    cJSON_AddStringToObject(j, "schedule", model_schedule_name(l->schedule));
    cJSON_AddBoolToObject(j, "overlap_dp", l->overlap_dp);
    cJSON_AddBoolToObject(j, "overlap_tp", l->overlap_tp);
    if (l->tp_bwd_exposed) /* said only when set */
        cJSON_AddBoolToObject(j, "tp_bwd_exposed", 1);
    if (l->n_stage_layers > 0)
        cJSON_AddItemToObject(j, "stage_layers", cJSON_CreateIntArray(l->stage_layers, l->n_stage_layers));
    /* how the split was said, for the exports to say it the same way */
    if (l->embed_in_split)
        cJSON_AddBoolToObject(j, "embed_in_split", 1);
    if (l->loss_in_split)
        cJSON_AddBoolToObject(j, "loss_in_split", 1);
    if (l->first_stage_layers > 0)
        cJSON_AddNumberToObject(j, "first_stage_layers", l->first_stage_layers);
    if (l->last_stage_layers > 0)
        cJSON_AddNumberToObject(j, "last_stage_layers", l->last_stage_layers);
    if (l->pp_layout[0])
        cJSON_AddStringToObject(j, "pp_layout", l->pp_layout);
    if (l->cp > 1)
        cJSON_AddStringToObject(j, "cp_comm_type", model_cp_comm_name(l->cp_comm));
    /* expert parallelism where it is not the default (ep 1, etp = tp) */
    if (l->ep > 1 || (l->etp > 0 && l->etp != l->tp) || l->overlap_ep) {
        cJSON_AddNumberToObject(j, "ep", l->ep > 0 ? l->ep : 1);
        cJSON_AddNumberToObject(j, "etp", l->etp > 0 ? l->etp : l->tp);
        cJSON_AddBoolToObject(j, "overlap_ep", l->overlap_ep);
    }
    /* sharded data parallelism, HSDP and offload where they are not the defaults */
    if (l->fsdp)
        cJSON_AddBoolToObject(j, "fsdp", 1);
    if (l->keep_gathered)
        cJSON_AddBoolToObject(j, "keep_gathered", 1);
    if (l->prefetch)
        cJSON_AddNumberToObject(j, "prefetch", l->prefetch);
    if (l->bucket_bytes > 0)
        cJSON_AddNumberToObject(j, "bucket_bytes", l->bucket_bytes);
    if (l->dp_replicate > 1) {
        cJSON_AddNumberToObject(j, "dp_shard", l->dp_shard);
        cJSON_AddNumberToObject(j, "dp_replicate", l->dp_replicate);
    }
    if (l->offload_optimizer)
        cJSON_AddBoolToObject(j, "offload_optimizer", 1);
    if (l->offload_activations)
        cJSON_AddBoolToObject(j, "offload_activations", 1);
    return j;
}

static const char *json_kind(const cJSON *v)
{
    return cJSON_IsString(v) ? "a string"
           : cJSON_IsBool(v) ? "a boolean"
           : cJSON_IsObject(v) ? "an object"
           : cJSON_IsArray(v) ? "an array"
           : cJSON_IsNumber(v) ? "a fraction"
                               : "null";
}

/* layout.stage_layers: an array of one integer per (virtual) stage. Its length and sum are the
 * layout rules' to check (model_spec_check), against pp and the model. */
static int stage_layers_from_json(const cJSON *j, const char *where, ModelLayout *l, PxError *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "stage_layers");
    char path[640];
    px_json_path(path, sizeof path, where, "stage_layers");
    l->n_stage_layers = 0;
    if (!a || cJSON_IsNull(a))
        return PX_OK;
    if (!cJSON_IsArray(a))
        return px_fail(err, PX_EINPUT, "%s: expected an array of layers per stage, got %s", path,
                       json_kind(a));
    int n = cJSON_GetArraySize(a);
    if (n < 1 || n > MODEL_MAX_STAGES)
        return px_fail(err, PX_EINPUT, "%s: expected 1 to %d entries (one per stage), got %d", path,
                       MODEL_MAX_STAGES, n);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble != floor(e->valuedouble))
            return px_fail(err, PX_EINPUT, "%s[%d]: expected an integer, got %s", path, i,
                           json_kind(e));
        if (e->valuedouble < 0 || e->valuedouble > 100000)
            return px_fail(err, PX_EINPUT, "%s[%d]: expected 0 to 100000 layers, got %.0f", path, i,
                           e->valuedouble);
        l->stage_layers[i++] = (int)e->valuedouble;
    }
    l->n_stage_layers = n;
    return PX_OK;
}

int model_layout_from_json(const cJSON *j, const char *where, ModelLayout *l, PxError *err)
{
    static const char *const known[] = {"dp", "tp", "pp", "cp", "vpp", "zero", "sp", "recompute",
                                        "schedule", "overlap_dp", "overlap_tp", "tp_bwd_exposed", "stage_layers", "ep",
                                        "etp", "overlap_ep", "fsdp", "keep_gathered", "prefetch",
                                        "bucket_bytes", "dp_shard", "dp_replicate",
                                        "offload_optimizer", "offload_activations",
                                        "embed_in_split", "loss_in_split", "first_stage_layers",
                                        "last_stage_layers", "pp_layout", "cp_comm_type", NULL};
    if (!cJSON_IsObject(j))
        return px_fail(err, PX_EINPUT, "%s expected an object", where);
    px_json_warn_unknown(j, where, known);
    int rc, rcm = (int)l->recompute, sch = (int)l->schedule, cpc = (int)l->cp_comm;
    static const char *const cp_comm_names[] = {"p2p", "allgather", "a2a"};
    if ((rc = px_json_int(j, where, "dp", 1, 1, 1 << 24, &l->dp, err)) ||
        (rc = px_json_int(j, where, "tp", 1, 1, 1 << 16, &l->tp, err)) ||
        (rc = px_json_int(j, where, "pp", 1, 1, 1 << 16, &l->pp, err)) ||
        (rc = px_json_int(j, where, "cp", 0, 1, 1 << 16, &l->cp, err)) ||
        (rc = px_json_int(j, where, "vpp", 0, 1, 1 << 16, &l->vpp, err)) ||
        (rc = px_json_int(j, where, "zero", 0, 0, 3, &l->zero, err)) ||
        (rc = px_json_bool(j, where, "sp", 0, &l->sp, err)) ||
        (rc = px_json_enum(j, where, "recompute", 0, recompute_names, 3, &rcm, err)) ||
        (rc = px_json_enum(j, where, "schedule", 0, schedule_names, 3, &sch, err)) ||
        (rc = px_json_bool(j, where, "overlap_dp", 0, &l->overlap_dp, err)) ||
        (rc = px_json_bool(j, where, "overlap_tp", 0, &l->overlap_tp, err)) ||
        (rc = px_json_bool(j, where, "tp_bwd_exposed", 0, &l->tp_bwd_exposed, err)) ||
        (rc = px_json_int(j, where, "ep", 0, 1, 1 << 16, &l->ep, err)) ||
        (rc = px_json_int(j, where, "etp", 0, 1, 1 << 16, &l->etp, err)) ||
        (rc = px_json_bool(j, where, "overlap_ep", 0, &l->overlap_ep, err)) ||
        (rc = px_json_bool(j, where, "fsdp", 0, &l->fsdp, err)) ||
        (rc = px_json_bool(j, where, "keep_gathered", 0, &l->keep_gathered, err)) ||
        (rc = px_json_int(j, where, "prefetch", 0, -1, 16, &l->prefetch, err)) ||
        (rc = px_json_int(j, where, "dp_shard", 0, 1, 1 << 24, &l->dp_shard, err)) ||
        (rc = px_json_int(j, where, "dp_replicate", 0, 1, 1 << 24, &l->dp_replicate, err)) ||
        (rc = px_json_bool(j, where, "offload_optimizer", 0, &l->offload_optimizer, err)) ||
        (rc = px_json_bool(j, where, "offload_activations", 0, &l->offload_activations, err)) ||
        (rc = px_json_double(j, where, "bucket_bytes", 0, 0, 1e15, &l->bucket_bytes, err)) ||
        (rc = px_json_bool(j, where, "embed_in_split", 0, &l->embed_in_split, err)) ||
        (rc = px_json_bool(j, where, "loss_in_split", 0, &l->loss_in_split, err)) ||
        (rc = px_json_int(j, where, "first_stage_layers", 0, 0, 100000, &l->first_stage_layers, err)) ||
        (rc = px_json_int(j, where, "last_stage_layers", 0, 0, 100000, &l->last_stage_layers, err)) ||
        (rc = px_json_enum(j, where, "cp_comm_type", 0, cp_comm_names, 3, &cpc, err)) ||
        (rc = stage_layers_from_json(j, where, l, err)))
        return rc;
    l->cp_comm = (ModelCpComm)cpc;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(j, "pp_layout");
    if (lay && !cJSON_IsNull(lay)) {
        char path[640];
        px_json_path(path, sizeof path, where, "pp_layout");
        if (!cJSON_IsString(lay) || strlen(lay->valuestring) >= sizeof l->pp_layout)
            return px_fail(err, PX_EINPUT, "%s: expected a layout string of at most %zu characters", path,
                           sizeof l->pp_layout - 1);
        snprintf(l->pp_layout, sizeof l->pp_layout, "%s", lay->valuestring);
    }
    l->recompute = (ModelRecompute)rcm;
    l->schedule = (ModelSchedule)sch;
    return PX_OK;
}

cJSON *model_job_to_json(const ModelJob *t, const ModelDims *d)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "global_batch", t->global_batch);
    cJSON_AddNumberToObject(j, "micro_batch", t->micro_batch);
    if (d)
        cJSON_AddNumberToObject(j, "micro_batches", d->m);
    cJSON_AddNumberToObject(j, "seq_len", d ? d->s : t->seq_len);
    cJSON_AddStringToObject(j, "precision", px_dtype_name(t->precision));
    cJSON_AddStringToObject(j, "grad_dtype", px_dtype_name(t->grad_dtype));
    cJSON_AddStringToObject(j, "optimizer", model_optimizer_name(t->optimizer));
    cJSON_AddNumberToObject(j, "lr", t->lr);
    cJSON_AddNumberToObject(j, "min_lr", t->min_lr);
    cJSON_AddNumberToObject(j, "warmup_steps", t->warmup_steps);
    cJSON_AddNumberToObject(j, "weight_decay", t->weight_decay);
    cJSON_AddNumberToObject(j, "grad_clip", t->grad_clip);
    cJSON_AddNumberToObject(j, "beta1", t->beta1);
    cJSON_AddNumberToObject(j, "beta2", t->beta2);
    cJSON_AddNumberToObject(j, "eps", t->adam_eps);
    cJSON_AddNumberToObject(j, "momentum", t->momentum);
    cJSON_AddNumberToObject(j, "steps", t->steps);
    cJSON_AddNumberToObject(j, "seed", (double)t->seed);
    cJSON_AddStringToObject(j, "data", t->data);
    cJSON_AddBoolToObject(j, "flash_attn", t->flash_attn);
    cJSON_AddNumberToObject(j, "dropout", t->dropout);
    cJSON_AddNumberToObject(j, "pad_vocab", t->pad_vocab);
    if (d)
        cJSON_AddNumberToObject(j, "vocab_padded", d->vocab_pad);
    cJSON_AddBoolToObject(j, "fused_kernels", t->fused_kernels);
    cJSON_AddStringToObject(j, "attention_flops", t->causal_flops ? "causal" : "full");
    if (t->train_tokens > 0)
        cJSON_AddNumberToObject(j, "train_tokens", t->train_tokens);
    if (t->moe_imbalance != 1.0 || t->moe_force_balance) {
        cJSON_AddNumberToObject(j, "moe_imbalance", t->moe_imbalance);
        cJSON_AddBoolToObject(j, "moe_force_balance", t->moe_force_balance);
    }
    if (t->fp8 != MODEL_FP8_NONE) {
        cJSON_AddStringToObject(j, "fp8_recipe", model_fp8_recipe_name(t->fp8));
        cJSON_AddStringToObject(j, "fp8_format", model_fp8_format_name(t->fp8_format));
        cJSON_AddBoolToObject(j, "fp8_param_gather", t->fp8_param_gather);
        cJSON_AddNumberToObject(j, "fp8_amax_history", t->fp8_amax_history);
        cJSON_AddBoolToObject(j, "fp8_attention", t->fp8_attention);
        cJSON_AddBoolToObject(j, "fp8_dispatch", t->fp8_dispatch);
        if (t->fp8_transpose >= 0)
            cJSON_AddBoolToObject(j, "fp8_transpose", t->fp8_transpose);
    }
    return j;
}

/* The job's FP8 keys (all optional; none: no FP8). */
static int fp8_from_json(const cJSON *j, const char *where, ModelJob *t, PxError *err)
{
    static const char *const recipes[] = {"none", "delayed", "tensorwise", "blockwise", "mxfp8"};
    static const char *const formats[] = {"hybrid", "e4m3"};
    int rc, recipe = (int)t->fp8, format = (int)t->fp8_format;
    int tr = t->fp8_transpose > 0;
    if ((rc = px_json_enum(j, where, "fp8_recipe", 0, recipes, 5, &recipe, err)) ||
        (rc = px_json_enum(j, where, "fp8_format", 0, formats, 2, &format, err)) ||
        (rc = px_json_bool(j, where, "fp8_param_gather", 0, &t->fp8_param_gather, err)) ||
        (rc = px_json_int(j, where, "fp8_amax_history", 0, 1, 1 << 16, &t->fp8_amax_history, err)) ||
        (rc = px_json_bool(j, where, "fp8_attention", 0, &t->fp8_attention, err)) ||
        (rc = px_json_bool(j, where, "fp8_dispatch", 0, &t->fp8_dispatch, err)) ||
        (rc = px_json_bool(j, where, "fp8_transpose", 0, &tr, err)))
        return rc;
    t->fp8 = (ModelFp8Recipe)recipe;
    t->fp8_format = (ModelFp8Format)format;
    if (cJSON_GetObjectItemCaseSensitive(j, "fp8_transpose"))
        t->fp8_transpose = tr;
    return PX_OK;
}

int model_job_from_json(const cJSON *j, const char *where, ModelJob *t, PxError *err)
{
    static const char *const known[] = {
        "global_batch", "micro_batch", "micro_batches", "seq_len", "precision", "grad_dtype",
        "optimizer", "lr", "min_lr", "warmup_steps", "weight_decay", "grad_clip", "beta1", "beta2",
        "eps", "momentum", "steps", "seed", "data", "flash_attn", "dropout", "pad_vocab",
        "vocab_padded", "fused_kernels", "attention_flops", "train_tokens", "moe_imbalance",
        "moe_force_balance", "fp8_recipe", "fp8_format", "fp8_param_gather", "fp8_amax_history",
        "fp8_attention", "fp8_transpose", "fp8_dispatch", NULL};
    static const char *const flops_names[] = {"full", "causal"};
    if (!cJSON_IsObject(j))
        return px_fail(err, PX_EINPUT, "%s expected an object", where);
    px_json_warn_unknown(j, where, known);
    int rc, prec = 0, grad = 0, opt = (int)t->optimizer;
    uint64_t seed = t->seed;
    if ((rc = px_json_int(j, where, "global_batch", 1, 1, 1 << 30, &t->global_batch, err)) ||
        (rc = px_json_int(j, where, "micro_batch", 1, 1, 1 << 24, &t->micro_batch, err)) ||
        (rc = px_json_int(j, where, "seq_len", 1, 1, 1 << 24, &t->seq_len, err)) ||
        (rc = px_json_enum(j, where, "precision", 1, float_names, 3, &prec, err)) ||
        (rc = px_json_enum(j, where, "grad_dtype", 0, float_names, 3, &grad, err)) ||
        (rc = px_json_enum(j, where, "optimizer", 0, optimizer_names, 3, &opt, err)) ||
        (rc = px_json_double(j, where, "lr", 0, 0, 10, &t->lr, err)) ||
        (rc = px_json_double(j, where, "min_lr", 0, 0, 10, &t->min_lr, err)) ||
        (rc = px_json_int(j, where, "warmup_steps", 0, 0, 1 << 30, &t->warmup_steps, err)) ||
        (rc = px_json_double(j, where, "weight_decay", 0, 0, 10, &t->weight_decay, err)) ||
        (rc = px_json_double(j, where, "grad_clip", 0, 0, 1e9, &t->grad_clip, err)) ||
        (rc = px_json_double(j, where, "beta1", 0, 0, 0.999999, &t->beta1, err)) ||
        (rc = px_json_double(j, where, "beta2", 0, 0, 0.999999999, &t->beta2, err)) ||
        (rc = px_json_double(j, where, "eps", 0, 0, 1, &t->adam_eps, err)) ||
        (rc = px_json_double(j, where, "momentum", 0, 0, 0.999999, &t->momentum, err)) ||
        (rc = px_json_int(j, where, "steps", 0, 0, 1 << 30, &t->steps, err)) ||
        (rc = px_json_u64(j, where, "seed", 0, &seed, err)) ||
        (rc = px_json_string(j, where, "data", 0, t->data, sizeof t->data, err)) ||
        (rc = px_json_bool(j, where, "flash_attn", 0, &t->flash_attn, err)) ||
        (rc = px_json_double(j, where, "dropout", 0, 0, 0.999, &t->dropout, err)) ||
        (rc = px_json_int(j, where, "pad_vocab", 0, 1, 1 << 16, &t->pad_vocab, err)) ||
        (rc = px_json_bool(j, where, "fused_kernels", 0, &t->fused_kernels, err)) ||
        (rc = px_json_double(j, where, "train_tokens", 0, 0, 1e30, &t->train_tokens, err)) ||
        (rc = px_json_double(j, where, "moe_imbalance", 0, 1.0, 1 << 16, &t->moe_imbalance, err)) ||
        (rc = px_json_bool(j, where, "moe_force_balance", 0, &t->moe_force_balance, err)) ||
        (rc = fp8_from_json(j, where, t, err)))
        return rc;
    int af = t->causal_flops;
    if ((rc = px_json_enum(j, where, "attention_flops", 0, flops_names, 2, &af, err)))
        return rc;
    static const PxDtype types[] = {PX_FP32, PX_BF16, PX_FP16};
    t->precision = types[prec];
    t->grad_dtype = cJSON_GetObjectItemCaseSensitive(j, "grad_dtype") ? types[grad] : PX_FP32;
    t->optimizer = (ModelOptimizer)opt;
    t->seed = seed;
    t->causal_flops = af;
    return PX_OK;
}

/* The plan's cluster profile: inline from schema_version 2, else (version 1) the profile of that
 * name on this host, with a warning that it may not be the planner's. */
static int plan_profile(const cJSON *j, const char *origin, int version, ModelPlan *p,
                        PxError *err)
{
    char where[640];
    snprintf(where, sizeof where, "%s: profile", origin);
    const cJSON *prof = cJSON_GetObjectItemCaseSensitive(j, "profile");
    if (version >= 2) {
        if (!cJSON_IsObject(prof))
            return px_fail(err, PX_EINPUT, "%s: profile: %s", origin,
                           prof ? "expected an object (the resolved cluster profile)"
                                : "missing (the resolved cluster profile)");
        return prof_cluster_from_json(prof, where, &p->profile, err);
    }
    px_warn("%s: schema_version 1 carries no cluster profile: '%s' is resolved on this host, so "
            "the prediction may not be the planner's (write the plan again for schema_version %d)",
            origin, p->cluster, MODEL_PLAN_SCHEMA);
    int rc = prof_cluster_load(p->cluster, NULL, 0, &p->profile, err);
    if (rc) {
        char msg[sizeof err->msg];
        px_strlcpy(msg, err->msg, sizeof msg);
        return px_fail(err, PX_EINPUT, "%s: cluster: %s", origin, msg);
    }
    return PX_OK;
}

static int plan_from_json(const cJSON *j, const char *origin, ModelPlan *p, PxError *err)
{
    static const char *const known[] = {"schema_version", "model", "cluster", "profile", "gpus",
                                        "training", "layout", "prediction", NULL};
    memset(p, 0, sizeof *p);
    model_spec_defaults(&p->spec);
    char where[600];
    snprintf(where, sizeof where, "%s:", origin);
    if (!cJSON_IsObject(j))
        return px_fail(err, PX_EINPUT, "%s expected a JSON object", where);
    px_json_warn_unknown(j, where, known);
    int rc, version = 1;
    const cJSON *m, *tr, *lay;
    if ((rc = px_json_int(j, where, "schema_version", 1, 1, MODEL_PLAN_SCHEMA, &version, err)) ||
        (rc = px_json_string(j, where, "cluster", 1, p->cluster, sizeof p->cluster, err)) ||
        (rc = px_json_int(j, where, "gpus", 1, 1, 1 << 24, &p->gpus, err)) ||
        (rc = px_json_object(j, where, "model", 1, &m, err)) ||
        (rc = px_json_object(j, where, "training", 1, &tr, err)) ||
        (rc = px_json_object(j, where, "layout", 1, &lay, err)))
        return rc;
    p->schema_version = version;
    char w2[640];
    snprintf(w2, sizeof w2, "%s model", origin);
    if ((rc = model_config_from_json(m, w2, &p->spec.model, err)))
        return rc;
    snprintf(w2, sizeof w2, "%s: training", origin);
    if ((rc = model_job_from_json(tr, w2, &p->spec.job, err)))
        return rc;
    snprintf(w2, sizeof w2, "%s: layout", origin);
    if ((rc = model_layout_from_json(lay, w2, &p->spec.layout, err)))
        return rc;
    ModelDims d;
    if ((rc = model_spec_check(&p->spec, p->gpus, &d, err))) {
        char msg[sizeof err->msg];
        px_strlcpy(msg, err->msg, sizeof msg);
        return px_fail(err, PX_EINPUT, "%s the layout breaks a rule: %s", where, msg);
    }
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(j, "prediction");
    if (pred && !cJSON_IsObject(pred))
        return px_fail(err, PX_EINPUT, "%s prediction: expected an object", where);
    if ((rc = plan_profile(j, origin, version, p, err)))
        return rc;
    if (pred && !(p->prediction = cJSON_Duplicate(pred, 1)))
        return px_fail(err, PX_ERUNTIME, "%s out of memory", where);
    return PX_OK;
}

int model_plan_from_json(const cJSON *j, const char *origin, ModelPlan *p, PxError *err)
{
    int rc = plan_from_json(j, origin, p, err);
    if (rc)
        model_plan_free(p); /* nothing is left allocated on failure */
    return rc;
}

int model_plan_init(ModelPlan *out, const ModelSpec *spec, const char *cluster_ref,
                    const ProfCluster *profile, int gpus, cJSON *prediction, PxError *err)
{
    memset(out, 0, sizeof *out);
    out->spec = *spec;
    px_strlcpy(out->cluster, cluster_ref, sizeof out->cluster);
    out->gpus = gpus;
    out->schema_version = MODEL_PLAN_SCHEMA;
    out->prediction = prediction;
    return prof_cluster_copy(profile, &out->profile, err);
}

int model_plan_copy(ModelPlan *out, const ModelPlan *src, PxError *err)
{
    int rc = model_plan_init(out, &src->spec, src->cluster, &src->profile, src->gpus, NULL, err);
    out->schema_version = src->schema_version;
    if (!rc && src->prediction && !(out->prediction = cJSON_Duplicate(src->prediction, 1)))
        rc = px_fail(err, PX_ERUNTIME, "out of memory copying the plan");
    if (rc)
        model_plan_free(out);
    return rc;
}

int model_plan_read(const char *path, ModelPlan *p, PxError *err)
{
    memset(p, 0, sizeof *p);
    cJSON *j = px_json_read_file(path, err);
    if (!j)
        return PX_EINPUT;
    int rc = model_plan_from_json(j, path, p, err);
    cJSON_Delete(j);
    if (rc)
        model_plan_free(p);
    return rc;
}

cJSON *model_plan_to_json(const ModelPlan *p)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "schema_version", MODEL_PLAN_SCHEMA);
    cJSON_AddItemToObject(j, "model", model_config_to_json(&p->spec.model));
    cJSON_AddStringToObject(j, "cluster", p->cluster);
    cJSON_AddItemToObject(j, "profile", prof_cluster_to_json(&p->profile));
    cJSON_AddNumberToObject(j, "gpus", p->gpus);
    ModelSpec s = p->spec;
    ModelDims d;
    PxError err;
    int ok = model_spec_check(&s, p->gpus, &d, &err) == PX_OK;
    cJSON_AddItemToObject(j, "training", model_job_to_json(&s.job, ok ? &d : NULL));
    cJSON_AddItemToObject(j, "layout", model_layout_to_json(&s.layout));
    if (p->prediction)
        cJSON_AddItemToObject(j, "prediction", cJSON_Duplicate(p->prediction, 1));
    return j;
}

void model_plan_free(ModelPlan *p)
{
    if (!p)
        return;
    cJSON_Delete(p->prediction);
    p->prediction = NULL;
    prof_cluster_free(&p->profile);
}

/* ---- the prediction, read back ---- */

/* element i of the array `key` of obj (an object of the array when `field` is given) as a
 * number */
static int pred_num(const cJSON *arr, const char *where, int i, const char *field, double *out,
                    PxError *err)
{
    const cJSON *e = cJSON_GetArrayItem(arr, i);
    if (field)
        e = cJSON_GetObjectItemCaseSensitive(e, field);
    if (!cJSON_IsNumber(e))
        return px_fail(err, PX_EINPUT, "%s[%d]%s%s: expected a number", where, i, field ? "." : "",
                       field ? field : "");
    *out = e->valuedouble;
    return PX_OK;
}

static const cJSON *pred_array(const cJSON *pred, const char *obj, const char *key, int n,
                               char *where, size_t cap, PxError *err)
{
    snprintf(where, cap, "prediction.%s.%s", obj, key);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pred, obj), key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) {
        px_fail(err, PX_EINPUT, "%s: expected an array of %d stages", where, n);
        return NULL;
    }
    return a;
}

int model_predicted_read(const ModelPlan *p, ModelPredicted *m, PxError *err)
{
    memset(m, 0, sizeof *m);
    const cJSON *pred = p->prediction;
    if (!pred)
        return PX_OK;
    const int n = p->spec.layout.pp;
    m->mem = calloc((size_t)n, sizeof *m->mem);
    m->comm = calloc((size_t)n, sizeof *m->comm);
    m->rank_flops = calloc((size_t)n, sizeof *m->rank_flops);
    m->step_s = calloc((size_t)n, sizeof *m->step_s);
    m->bubble_fraction = calloc((size_t)n, sizeof *m->bubble_fraction);
    if (!m->mem || !m->comm || !m->rank_flops || !m->step_s || !m->bubble_fraction) {
        model_predicted_free(m);
        return px_fail(err, PX_ERUNTIME, "out of memory reading the prediction");
    }
    char w[4][96];
    const cJSON *mem = pred_array(pred, "memory", "per_stage", n, w[0], sizeof w[0], err);
    const cJSON *comm = mem ? pred_array(pred, "comm", "per_stage", n, w[1], sizeof w[1], err) : NULL;
    const cJSON *fl = comm ? pred_array(pred, "flops", "per_rank_per_step", n, w[2], sizeof w[2], err) : NULL;
    const cJSON *tm = fl ? pred_array(pred, "time", "per_stage", n, w[3], sizeof w[3], err) : NULL;
    int rc = tm ? PX_OK : PX_EINPUT;
    double v = 0;
    for (int st = 0; st < n && !rc; st++) {
        for (int c = 0; c < MODEL_CAT_COUNT && !rc; c++)
            if (!(rc = pred_num(mem, w[0], st, model_category_name((ModelCategory)c), &v, err)))
                m->mem[st][c] = (uint64_t)v;
        for (int k = 0; k < MODEL_COMM_COUNT && !rc; k++)
            if (!(rc = pred_num(comm, w[1], st, model_comm_name((ModelComm)k), &v, err)))
                m->comm[st][k] = (uint64_t)v;
        if (!rc)
            rc = pred_num(fl, w[2], st, NULL, &m->rank_flops[st], err);
        if (!rc)
            rc = pred_num(tm, w[3], st, "step_s", &m->step_s[st], err);
        if (!rc)
            rc = pred_num(tm, w[3], st, "bubble_fraction", &m->bubble_fraction[st], err);
    }
    const cJSON *time = cJSON_GetObjectItemCaseSensitive(pred, "time");
    if (!rc && ((rc = px_json_double(time, "prediction.time", "step_s", 1, 0, 1e30, &m->job_step_s, err)) ||
                (rc = px_json_double(time, "prediction.time", "bubble_fraction", 1, 0, 1e30,
                                     &m->job_bubble_fraction, err))))
        rc = PX_EINPUT;
    if (rc) {
        model_predicted_free(m);
        return rc;
    }
    m->stages = n;
    return PX_OK;
}

void model_predicted_free(ModelPredicted *m)
{
    if (!m)
        return;
    free(m->mem);
    free(m->comm);
    free(m->rank_flops);
    free(m->step_s);
    free(m->bubble_fraction);
    memset(m, 0, sizeof *m);
}
