/* The fields of the layout and the training job, described once: one row per field of ModelLayout
 * and ModelJob (model.h's ModelField), from which its default, its JSON (read and written) and
 * its command-line flag follow. The rows stand in the order the front end's --help lists them;
 * the JSON follows the ids' order. */
#include "model/model.h"

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* enums are read and written through an int: they must be one */
_Static_assert(sizeof(ModelRecompute) == sizeof(int) && sizeof(ModelSchedule) == sizeof(int) &&
                   sizeof(ModelOptimizer) == sizeof(int) && sizeof(ModelCpComm) == sizeof(int) &&
                   sizeof(ModelFp8Recipe) == sizeof(int) && sizeof(ModelFp8Format) == sizeof(int) &&
                   sizeof(PxDtype) == sizeof(int) && sizeof(ModelMoeDispatcher) == sizeof(int),
               "the fields' enums are int-sized");

/* ---- the names of the layout's and the job's enums ---- */

static const char *const recompute_names[] = {"none", "selective", "full"};
static const char *const schedule_names[] = {"1f1b", "gpipe", "interleaved"};
static const char *const optimizer_names[] = {"adamw", "sgd-momentum", "adam-8bit"};
static const char *const cp_comm_names[] = {"p2p", "allgather", "a2a"};
static const char *const fp8_recipe_names[] = {"none", "delayed", "tensorwise", "blockwise", "mxfp8"};
static const char *const fp8_format_names[] = {"hybrid", "e4m3"};
static const char *const float_names[] = {"fp32", "bf16", "fp16"}; /* PxDtype's first three */
static const char *const flops_names[] = {"full", "causal"};      /* causal_flops 0, 1 */
static const char *const moe_dispatcher_names[] = {"alltoall", "allgather", "flex"}; /* Megatron's names */
static const char *const framework_names[] = {"megatron", "deepspeed", "nemo", "bridge", "torchtitan", "fms-fsdp"};
_Static_assert(sizeof framework_names / sizeof framework_names[0] == MODEL_FW_COUNT, "a name per framework");

const char *model_framework_name(ModelFramework f)
{
    return (int)f >= 0 && f < MODEL_FW_COUNT ? framework_names[f] : "?";
}

static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (s && strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *model_recompute_name(ModelRecompute r) { return recompute_names[r]; }
const char *model_schedule_name(ModelSchedule s) { return schedule_names[s]; }
const char *model_optimizer_name(ModelOptimizer o) { return optimizer_names[o]; }
const char *model_cp_comm_name(ModelCpComm c) { return cp_comm_names[c]; }
const char *model_moe_dispatcher_name(ModelMoeDispatcher k) { return moe_dispatcher_names[k]; }
const char *model_fp8_recipe_name(ModelFp8Recipe r) { return fp8_recipe_names[r]; }
const char *model_fp8_format_name(ModelFp8Format f) { return fp8_format_names[f]; }
int model_recompute_from_name(const char *s) { return name_index(s, recompute_names, 3); }
int model_schedule_from_name(const char *s) { return name_index(s, schedule_names, 3); }
int model_optimizer_from_name(const char *s) { return name_index(s, optimizer_names, 3); }
int model_cp_comm_from_name(const char *s) { return name_index(s, cp_comm_names, 3); }
int model_moe_dispatcher_from_name(const char *s) { return name_index(s, moe_dispatcher_names, 3); }
int model_fp8_recipe_from_name(const char *s) { return name_index(s, fp8_recipe_names, 5); }
int model_fp8_format_from_name(const char *s) { return name_index(s, fp8_format_names, 2); }

/* ---- when the JSON writes a key, and what ---- */

/* keys said only when set: a flag on, a number not 0, a string or list not empty */
static int shown_if_set(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)d;
    const char *p = (const char *)obj + f->at;
    switch (f->type) {
    case MODEL_FT_DOUBLE: return *(const double *)p != 0;
    case MODEL_FT_STRING: return p[0] != '\0';
    case MODEL_FT_INT_LIST: return *(const int *)((const char *)obj + f->count_at) > 0;
    default: return *(const int *)p != 0;
    }
}

/* the derived figures, only when the dims are known */
static int shown_with_dims(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)f, (void)obj;
    return d != NULL;
}

/* the context-parallel attention's kind, only with context parallelism */
static int shown_with_cp(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)f, (void)d;
    return ((const ModelLayout *)obj)->cp > 1;
}

/* expert parallelism where it is not the default (ep 1, etp = tp) */
static int shown_with_ep(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)f, (void)d;
    const ModelLayout *l = obj;
    return l->ep > 1 || (l->etp > 0 && l->etp != l->tp) || l->overlap_ep;
}

/* HSDP's split of dp, only when it replicates */
static int shown_with_hsdp(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)f, (void)d;
    return ((const ModelLayout *)obj)->dp_replicate > 1;
}

/* MoE routing where it is not the balanced default */
static int shown_with_moe(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)f, (void)d;
    const ModelJob *t = obj;
    return t->moe_imbalance != 1.0 || t->moe_force_balance;
}

/* never written: the value lives on in the model it sets (moe.capacity_factor) */
static int shown_never(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)f, (void)obj, (void)d;
    return 0;
}

/* the FP8 keys, only with an FP8 recipe */
static int shown_with_fp8(const ModelField *f, const void *obj, const ModelDims *d)
{
    (void)f, (void)d;
    return ((const ModelJob *)obj)->fp8 != MODEL_FP8_NONE;
}

/* fp8_transpose: with FP8, and once it is no longer auto (-1) */
static int shown_fp8_transpose(const ModelField *f, const void *obj, const ModelDims *d)
{
    return shown_with_fp8(f, obj, d) && ((const ModelJob *)obj)->fp8_transpose >= 0;
}

/* ep and etp as they resolve: 0 means 1, and tp */
static double ep_value(const void *obj, const ModelDims *d)
{
    (void)d;
    const ModelLayout *l = obj;
    return l->ep > 0 ? l->ep : 1;
}

static double etp_value(const void *obj, const ModelDims *d)
{
    (void)d;
    const ModelLayout *l = obj;
    return l->etp > 0 ? l->etp : l->tp;
}

/* the sequence the job runs: the model's when seq_len is 0 */
static double seq_value(const void *obj, const ModelDims *d)
{
    return d ? d->s : ((const ModelJob *)obj)->seq_len;
}

static double micro_batches_value(const void *obj, const ModelDims *d)
{
    (void)obj;
    return d->m;
}

static double vocab_padded_value(const void *obj, const ModelDims *d)
{
    (void)obj;
    return d->vocab_pad;
}

/* ---- the fields that parse or read beyond their type ---- */

static int parse_value(const ModelField *f, const char *flag, const char *arg, int on,
                       ModelSpec *s, PxError *err);

/* --fsdp: FSDP shards the parameters, so it is zero 3 */
static int parse_fsdp(const ModelField *f, const char *flag, const char *arg, int on, ModelSpec *s,
                      PxError *err)
{
    (void)f, (void)flag, (void)arg, (void)on, (void)err;
    s->layout.fsdp = 1;
    s->layout.zero = 3;
    return PX_OK;
}

/* --fsdp-prefetch 0 is none, which the layout says as -1 (its 0 is the default, 1) */
static int parse_prefetch(const ModelField *f, const char *flag, const char *arg, int on,
                          ModelSpec *s, PxError *err)
{
    (void)on;
    int v;
    int rc = px_parse_int(arg, flag, (long long)f->cli_lo, (long long)f->cli_hi, &v, err);
    if (!rc)
        s->layout.prefetch = v == 0 ? -1 : v;
    return rc;
}

/* --pp-layers 1,3: the split's own parser names the entry at fault */
static int parse_stage_layers(const ModelField *f, const char *flag, const char *arg, int on,
                              ModelSpec *s, PxError *err)
{
    (void)f, (void)on;
    return model_split_parse(arg, flag, &s->layout, err);
}

static int parse_pp_layout(const ModelField *f, const char *flag, const char *arg, int on,
                           ModelSpec *s, PxError *err)
{
    (void)f, (void)on;
    ModelLayout *l = &s->layout;
    if (strlen(arg) >= sizeof l->pp_layout)
        return px_fail(err, PX_EINPUT, "%s: at most %zu characters, got %zu", flag,
                       sizeof l->pp_layout - 1, strlen(arg));
    snprintf(l->pp_layout, sizeof l->pp_layout, "%s", arg);
    return PX_OK;
}

/* --precision fp8: FP8 GEMMs on bf16 weights and activations, as Megatron's --bf16
 * --fp8-format, with delayed scaling unless a recipe is given */
static int parse_precision(const ModelField *f, const char *flag, const char *arg, int on,
                           ModelSpec *s, PxError *err)
{
    if (strcmp(arg, "fp8") != 0)
        return parse_value(f, flag, arg, on, s, err);
    s->job.precision = PX_BF16;
    if (s->job.fp8 == MODEL_FP8_NONE)
        s->job.fp8 = MODEL_FP8_DELAYED;
    return PX_OK;
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

/* layout.stage_layers: an array of one integer per (virtual) stage, absent or null for the even
 * split. Its length and sum are the layout rules' to check (model_spec_check), against pp and
 * the model. */
static int read_stage_layers(const ModelField *f, const cJSON *j, const char *where, void *obj,
                             PxError *err)
{
    ModelLayout *l = obj;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, f->key);
    char path[640];
    px_json_path(path, sizeof path, where, f->key);
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

/* layout.pp_layout: a layout string, null as absent */
static int read_pp_layout(const ModelField *f, const cJSON *j, const char *where, void *obj,
                          PxError *err)
{
    ModelLayout *l = obj;
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(j, f->key);
    if (!lay || cJSON_IsNull(lay))
        return PX_OK;
    char path[640];
    px_json_path(path, sizeof path, where, f->key);
    if (!cJSON_IsString(lay) || strlen(lay->valuestring) >= sizeof l->pp_layout)
        return px_fail(err, PX_EINPUT, "%s: expected a layout string of at most %zu characters", path,
                       sizeof l->pp_layout - 1);
    snprintf(l->pp_layout, sizeof l->pp_layout, "%s", lay->valuestring);
    return PX_OK;
}

/* ---- the rows ---- */

#define LAYOUT(m) .at = offsetof(ModelLayout, m), .size = sizeof(((ModelLayout *)0)->m)
#define JOB(m) .at = offsetof(ModelJob, m), .size = sizeof(((ModelJob *)0)->m)
#define NAMES(a) .names = a, .n_names = (int)(sizeof a / sizeof a[0])

static const ModelField fields[] = {
    /* the layout: degrees and the pipeline's split */
    {.id = MODEL_FIELD_TP, .key = "tp", .type = MODEL_FT_INT, LAYOUT(tp), .required = 1, .lo = 1, .hi = 1 << 16,
     .def = 1, .flag = "tp", .metavar = "N", .help = "tensor-parallel degree"},
    {.id = MODEL_FIELD_PP, .key = "pp", .type = MODEL_FT_INT, LAYOUT(pp), .required = 1, .lo = 1, .hi = 1 << 16,
     .def = 1, .flag = "pp", .metavar = "N", .help = "pipeline-parallel degree (stages)"},
    {.id = MODEL_FIELD_STAGE_LAYERS, .key = "stage_layers", .type = MODEL_FT_INT_LIST, LAYOUT(stage_layers),
     .count_at = offsetof(ModelLayout, n_stage_layers), .shown = shown_if_set, .flag = "pp-layers",
     .metavar = "N,N...", .help = "layers of each pipeline stage, e.g. 1,3 (sets pp; default: even)",
     .parse = parse_stage_layers, .read = read_stage_layers},
    {.id = MODEL_FIELD_EMBED_IN_SPLIT, .key = "embed_in_split", .type = MODEL_FT_BOOL, LAYOUT(embed_in_split),
     .shown = shown_if_set, .flag = "account-for-embedding-in-pipeline-split",
     .help = "the input embedding counts as one layer in the pipeline split"},
    {.id = MODEL_FIELD_LOSS_IN_SPLIT, .key = "loss_in_split", .type = MODEL_FT_BOOL, LAYOUT(loss_in_split),
     .shown = shown_if_set, .flag = "account-for-loss-in-pipeline-split",
     .help = "the output layer and loss count as one layer in the pipeline split"},
    {.id = MODEL_FIELD_FIRST_STAGE_LAYERS, .key = "first_stage_layers", .type = MODEL_FT_INT,
     LAYOUT(first_stage_layers), .lo = 0, .hi = 100000, .shown = shown_if_set,
     .flag = "decoder-first-pipeline-num-layers", .metavar = "N",
     .help = "layers of the first pipeline stage, the rest even", .cli_range = 1, .cli_lo = 1, .cli_hi = 100000},
    {.id = MODEL_FIELD_LAST_STAGE_LAYERS, .key = "last_stage_layers", .type = MODEL_FT_INT,
     LAYOUT(last_stage_layers), .lo = 0, .hi = 100000, .shown = shown_if_set,
     .flag = "decoder-last-pipeline-num-layers", .metavar = "N",
     .help = "layers of the last pipeline stage, the rest even", .cli_range = 1, .cli_lo = 1, .cli_hi = 100000},
    {.id = MODEL_FIELD_PP_LAYOUT, .key = "pp_layout", .type = MODEL_FT_STRING, LAYOUT(pp_layout),
     .shown = shown_if_set, .flag = "pipeline-model-parallel-layout", .metavar = "S",
     .help = "Megatron layout string of the pp x vpp stages, e.g. \"Et*3|(t*4|)*14,t*2L\"",
     .parse = parse_pp_layout, .read = read_pp_layout},
    {.id = MODEL_FIELD_DP, .key = "dp", .type = MODEL_FT_INT, LAYOUT(dp), .required = 1, .lo = 1, .hi = 1 << 24,
     .def = 0 /* from the GPUs */, .flag = "dp", .metavar = "N",
     .help = "data-parallel degree (default: what the GPUs leave)"},
    {.id = MODEL_FIELD_CP, .key = "cp", .type = MODEL_FT_INT, LAYOUT(cp), .lo = 1, .hi = 1 << 16, .def = 1,
     .flag = "cp", .metavar = "N", .help = "context-parallel degree"},
    {.id = MODEL_FIELD_CP_COMM, .key = "cp_comm_type", .type = MODEL_FT_ENUM, LAYOUT(cp_comm), NAMES(cp_comm_names),
     .shown = shown_with_cp, .flag = "cp-comm-type", .metavar = "T",
     .help = "context-parallel attention: p2p (K/V ring, default) | allgather | a2a (Ulysses)"},
    {.id = MODEL_FIELD_VPP, .key = "vpp", .type = MODEL_FT_INT, LAYOUT(vpp), .lo = 1, .hi = 1 << 16, .def = 1,
     .flag = "vpp", .metavar = "N", .help = "model chunks per pipeline rank (>1: interleaved schedule)"},
    /* sharding and offload */
    {.id = MODEL_FIELD_ZERO, .key = "zero", .type = MODEL_FT_INT, LAYOUT(zero), .lo = 0, .hi = 3, .flag = "zero",
     .metavar = "0-3", .help = "ZeRO stage: 1 optimizer+master, 2 +grads, 3 +params sharded"},
    {.id = MODEL_FIELD_FSDP, .key = "fsdp", .type = MODEL_FT_BOOL, LAYOUT(fsdp), .shown = shown_if_set,
     .flag = "fsdp", .help = "FSDP2 / Megatron-FSDP sharding: zero 3 whose backward gather also serves the recompute",
     .parse = parse_fsdp},
    {.id = MODEL_FIELD_KEEP_GATHERED, .key = "keep_gathered", .type = MODEL_FT_BOOL, LAYOUT(keep_gathered),
     .shown = shown_if_set, .flag = "no-reshard-after-forward",
     .help = "zero 3: keep each layer's gathered parameters from its forward to its backward",
     .no_flag = "reshard-after-forward",
     .no_help = "zero 3: free them after the forward, gather again in the backward (default)"},
    {.id = MODEL_FIELD_PREFETCH, .key = "prefetch", .type = MODEL_FT_INT, LAYOUT(prefetch), .lo = -1, .hi = 16,
     .shown = shown_if_set, .flag = "fsdp-prefetch", .metavar = "N",
     .help = "zero 3: layers whose parameter gathers run ahead of the compute (default 1; 0: none)",
     .cli_range = 1, .cli_lo = 0, .cli_hi = 16, .parse = parse_prefetch},
    {.id = MODEL_FIELD_BUCKET_BYTES, .key = "bucket_bytes", .type = MODEL_FT_DOUBLE, LAYOUT(bucket_bytes),
     .lo = 0, .hi = 1e15, .shown = shown_if_set, .flag = "zero-bucket-bytes", .metavar = "B",
     .help = "ZeRO gathers and gradient reductions in calls of at most B bytes, e.g. 5e8 (default: one per layer)",
     .cli_range = 1, .cli_lo = 1, .cli_hi = 1e15, .cli_msg = "expected a positive number of bytes, e.g. 5e8"},
    {.id = MODEL_FIELD_DP_SHARD, .key = "dp_shard", .type = MODEL_FT_INT, LAYOUT(dp_shard), .lo = 1, .hi = 1 << 24,
     .shown = shown_with_hsdp, .flag = "dp-shard", .metavar = "N",
     .help = "HSDP: data-parallel ranks that shard the ZeRO state (default: dp)"},
    {.id = MODEL_FIELD_DP_REPLICATE, .key = "dp_replicate", .type = MODEL_FT_INT, LAYOUT(dp_replicate), .lo = 1,
     .hi = 1 << 24, .shown = shown_with_hsdp, .flag = "dp-replicate", .metavar = "N",
     .help = "HSDP: replicas of the sharded state; dp = dp-shard x dp-replicate (default 1)"},
    {.id = MODEL_FIELD_OFFLOAD_OPTIMIZER, .key = "offload_optimizer", .type = MODEL_FT_BOOL,
     LAYOUT(offload_optimizer), .shown = shown_if_set, .flag = "offload-optimizer",
     .help = "master weights and optimizer state in host memory, the optimizer step on the host"},
    {.id = MODEL_FIELD_OFFLOAD_ACTIVATIONS, .key = "offload_activations", .type = MODEL_FT_BOOL,
     LAYOUT(offload_activations), .shown = shown_if_set, .flag = "offload-activations",
     .help = "saved activations to host memory in the forward, back before the backward"},
    /* activations and the schedule */
    {.id = MODEL_FIELD_SP, .key = "sp", .type = MODEL_FT_BOOL, LAYOUT(sp), .flag = "sp",
     .help = "sequence parallelism (needs tp > 1)", .no_flag = "no-sp",
     .no_help = "no sequence parallelism (default)"},
    {.id = MODEL_FIELD_RECOMPUTE, .key = "recompute", .type = MODEL_FT_ENUM, LAYOUT(recompute),
     NAMES(recompute_names), .flag = "recompute", .metavar = "MODE",
     .help = "activation recompute: none | selective | full"},
    {.id = MODEL_FIELD_SCHEDULE, .key = "schedule", .type = MODEL_FT_ENUM, LAYOUT(schedule), NAMES(schedule_names),
     .flag = "schedule", .metavar = "S", .help = "pipeline schedule: 1f1b | gpipe | interleaved"},
    /* the job: batch, sequence and precision */
    {.id = MODEL_FIELD_MICRO_BATCH, .key = "micro_batch", .type = MODEL_FT_INT, JOB(micro_batch), .required = 1,
     .lo = 1, .hi = 1 << 24, .def = 1, .flag = "mbs", .metavar = "N",
     .help = "micro-batch size in sequences (default 1)"},
    {.id = MODEL_FIELD_GLOBAL_BATCH, .key = "global_batch", .type = MODEL_FT_INT, JOB(global_batch),
     .required = 1, .lo = 1, .hi = 1 << 30, .flag = "gbs", .metavar = "N",
     .help = "global batch size in sequences (default: mbs x dp)"},
    {.id = MODEL_FIELD_SEQ_LEN, .key = "seq_len", .type = MODEL_FT_INT, JOB(seq_len), .required = 1, .lo = 1,
     .hi = 1 << 24, .value = seq_value, .flag = "seq", .metavar = "N",
     .help = "sequence length (default: the model's)"},
    {.id = MODEL_FIELD_PRECISION, .key = "precision", .type = MODEL_FT_DTYPE, JOB(precision), NAMES(float_names),
     .required = 1, .def = PX_DTYPE_COUNT /* auto: by the device */, .flag = "precision", .metavar = "T",
     .help = "fp32 | bf16 | fp16 | fp8 (bf16 with FP8 GEMMs; default: bf16 on GPUs, fp32 on CPUs)",
     .cli_names = "fp32, bf16, fp16 or fp8", .parse = parse_precision},
    {.id = MODEL_FIELD_FP8, .key = "fp8_recipe", .type = MODEL_FT_ENUM, JOB(fp8), NAMES(fp8_recipe_names),
     .shown = shown_with_fp8, .flag = "fp8-recipe", .metavar = "R",
     .help = "FP8 GEMMs scaled delayed | tensorwise | blockwise | mxfp8 (default with --precision fp8: delayed)",
     .cli_names = "delayed, tensorwise, blockwise, mxfp8 or none"},
    {.id = MODEL_FIELD_FP8_FORMAT, .key = "fp8_format", .type = MODEL_FT_ENUM, JOB(fp8_format),
     NAMES(fp8_format_names), .shown = shown_with_fp8, .flag = "fp8-format", .metavar = "F",
     .help = "hybrid (E4M3 forward, E5M2 gradients; default) | e4m3"},
    {.id = MODEL_FIELD_FP8_PARAM_GATHER, .key = "fp8_param_gather", .type = MODEL_FT_BOOL, JOB(fp8_param_gather),
     .shown = shown_with_fp8, .flag = "fp8-param-gather",
     .help = "keep weights in FP8 only and gather them in FP8 (no bf16 copy)"},
    {.id = MODEL_FIELD_FP8_AMAX_HISTORY, .key = "fp8_amax_history", .type = MODEL_FT_INT, JOB(fp8_amax_history),
     .lo = 1, .hi = 1 << 16, .def = 1024 /* Transformer Engine's */, .shown = shown_with_fp8,
     .flag = "fp8-amax-history", .metavar = "N", .help = "delayed scaling's amax history length (default 1024)"},
    {.id = MODEL_FIELD_FP8_ATTENTION, .key = "fp8_attention", .type = MODEL_FT_BOOL, JOB(fp8_attention),
     .shown = shown_with_fp8, .flag = "fp8-attention", .help = "the attention core in FP8 too (default: bf16)"},
    {.id = MODEL_FIELD_FP8_DISPATCH, .key = "fp8_dispatch", .type = MODEL_FT_BOOL, JOB(fp8_dispatch),
     .shown = shown_with_fp8, .flag = "fp8-dispatch",
     .help = "MoE tokens dispatched in FP8 with their scales, as DeepSeek-V3 (default: bf16)"},
    {.id = MODEL_FIELD_GRAD_DTYPE, .key = "grad_dtype", .type = MODEL_FT_DTYPE, JOB(grad_dtype), NAMES(float_names),
     .def = PX_FP32 /* Megatron's */, .flag = "grad-dtype", .metavar = "T",
     .help = "gradient dtype: fp32 (default) | bf16 | fp16"},
    {.id = MODEL_FIELD_OPTIMIZER, .key = "optimizer", .type = MODEL_FT_ENUM, JOB(optimizer), NAMES(optimizer_names),
     .flag = "optimizer", .metavar = "O", .help = "adamw (default) | sgd-momentum | adam-8bit"},
    {.id = MODEL_FIELD_FLASH_ATTN, .key = "flash_attn", .type = MODEL_FT_BOOL, JOB(flash_attn), .def = 1,
     .flag = "flash-attn", .help = "flash attention: no s x s matrices saved (default)",
     .no_flag = "no-flash-attn", .no_help = "unfused attention that saves the softmax"},
    {.id = MODEL_FIELD_DROPOUT, .key = "dropout", .type = MODEL_FT_DOUBLE, JOB(dropout), .lo = 0, .hi = 0.999,
     .flag = "dropout", .metavar = "P", .help = "dropout probability (default 0: no dropout)",
     .cli_range = 1, .cli_lo = 0, .cli_hi = 1 - DBL_EPSILON / 2 /* below 1 */, .cli_msg = "must be in [0, 1)"},
    /* overlap and expert parallelism */
    {.id = MODEL_FIELD_OVERLAP_DP, .key = "overlap_dp", .type = MODEL_FT_BOOL, LAYOUT(overlap_dp),
     .flag = "overlap-dp", .help = "overlap DP reduction and ZeRO gathers with compute",
     .no_flag = "no-overlap-dp", .no_help = "do not overlap DP communication (default)"},
    {.id = MODEL_FIELD_OVERLAP_TP, .key = "overlap_tp", .type = MODEL_FT_BOOL, LAYOUT(overlap_tp),
     .flag = "overlap-tp", .help = "overlap TP communication with compute", .no_flag = "no-overlap-tp",
     .no_help = "do not overlap TP communication (default)"},
    {.id = MODEL_FIELD_EP, .key = "ep", .type = MODEL_FT_INT, LAYOUT(ep), .lo = 1, .hi = 1 << 16,
     .shown = shown_with_ep, .value = ep_value, .flag = "ep", .metavar = "N|LIST|auto",
     .help = "expert-parallel degree: routed experts split over N ranks (plan: a list like 1,2,4,8, or auto, to search)"},
    {.id = MODEL_FIELD_ETP, .key = "etp", .type = MODEL_FT_INT, LAYOUT(etp), .lo = 1, .hi = 1 << 16,
     .shown = shown_with_ep, .value = etp_value, .flag = "etp", .metavar = "N|LIST|auto",
     .help = "expert tensor-parallel degree (default: tp, as Megatron-Core; plan: a list or auto)"},
    {.id = MODEL_FIELD_OVERLAP_EP, .key = "overlap_ep", .type = MODEL_FT_BOOL, LAYOUT(overlap_ep),
     .shown = shown_with_ep, .flag = "overlap-ep",
     .help = "overlap the experts' all-to-all with the shared experts and another micro-batch",
     .no_flag = "no-overlap-ep", .no_help = "do not overlap the experts' all-to-all (default)"},
    {.id = MODEL_FIELD_MOE_IMBALANCE, .key = "moe_imbalance", .type = MODEL_FT_DOUBLE, JOB(moe_imbalance),
     .lo = 1.0, .hi = 1 << 16, .def = 1.0, .shown = shown_with_moe, .flag = "moe-imbalance", .metavar = "X",
     .help = "busiest expert-parallel rank's tokens over the balanced share, >= 1 (default 1)",
     .cli_range = 1, .cli_lo = 1.0, .cli_hi = 1e6, .cli_msg = "must be at least 1 (1: balanced)"},
    {.id = MODEL_FIELD_MOE_FORCE_BALANCE, .key = "moe_force_balance", .type = MODEL_FT_BOOL,
     JOB(moe_force_balance), .shown = shown_with_moe, .flag = "moe-force-balance",
     .help = "route tokens round-robin (Megatron's --moe-router-force-load-balancing): imbalance 1"},
    {.id = MODEL_FIELD_MOE_DISPATCHER, .key = "moe_dispatcher", .type = MODEL_FT_ENUM, JOB(moe_dispatcher),
     NAMES(moe_dispatcher_names), .shown = shown_if_set, .flag = "moe-dispatcher", .metavar = "D",
     .help = "MoE token dispatcher: alltoall (default) | allgather | flex (DeepEP: a token crosses the "
             "network once per node; Megatron's --moe-token-dispatcher-type)"},
    {.id = MODEL_FIELD_MOE_CAPACITY_FACTOR, .key = "moe_capacity_factor", .type = MODEL_FT_DOUBLE,
     JOB(moe_capacity_factor), .lo = 0, .hi = 1e3, .shown = shown_never, .flag = "moe-capacity-factor",
     .metavar = "F",
     .help = "drop the token copies past F x an expert's balanced share, padded to it (Megatron's "
             "--moe-expert-capacity-factor; sets the model's moe.capacity_factor; default: the model's, 0 dropless)",
     .cli_range = 1, .cli_lo = 0, .cli_hi = 1e3, .cli_msg = "must be between 0 and 1000"},
    /* how the work is counted and run */
    {.id = MODEL_FIELD_PAD_VOCAB, .key = "pad_vocab", .type = MODEL_FT_INT, JOB(pad_vocab), .lo = 1, .hi = 1 << 16,
     .def = 1, .flag = "pad-vocab", .metavar = "N",
     .help = "pad the vocabulary to a multiple of N x tp (Megatron: 128; default 1)"},
    {.id = MODEL_FIELD_CAUSAL_FLOPS, .key = "attention_flops", .type = MODEL_FT_ENUM, JOB(causal_flops),
     NAMES(flops_names), .flag = "causal-flops", .help = "count only the causal half of attention FLOPs"},
    {.id = MODEL_FIELD_FUSED_KERNELS, .key = "fused_kernels", .type = MODEL_FT_BOOL, JOB(fused_kernels), .def = 1,
     .flag = "fused-kernels", .help = "fused elementwise kernels: bias-GeLU, bias-dropout-add, softmax (default)",
     .no_flag = "no-fused-kernels", .no_help = "one kernel per elementwise step"},
    {.id = MODEL_FIELD_FRAMEWORK, .key = "framework", .type = MODEL_FT_ENUM, JOB(framework),
     NAMES(framework_names), .shown = shown_if_set, .flag = "framework", .metavar = "F",
     .help = "the framework that runs the job: megatron (default), deepspeed, nemo, bridge, torchtitan, "
             "fms-fsdp (its settings: profiles/frameworks/F.json)"},
    {.id = MODEL_FIELD_TP_BWD_EXPOSED, .key = "tp_bwd_exposed", .type = MODEL_FT_BOOL, LAYOUT(tp_bwd_exposed),
     .shown = shown_if_set, .flag = "async-tp-grad", .invert = 1,
     .help = "QKV's and fc1's backward TP collectives under their own GEMMs (Megatron since late 2021; default)",
     .no_flag = "no-async-tp-grad",
     .no_help = "their backward TP collectives exposed, as Megatron of early 2021 (Narayanan et al.)"},
    {.id = MODEL_FIELD_TRAIN_TOKENS, .key = "train_tokens", .type = MODEL_FT_DOUBLE, JOB(train_tokens), .lo = 0,
     .hi = 1e30, .shown = shown_if_set, .flag = "tokens", .metavar = "N",
     .help = "tokens to train on: report days and GPU-hours (e.g. 15T, 300B or 1.5e12)", .cli_range = 1,
     .cli_lo = DBL_TRUE_MIN /* above 0 */, .cli_hi = DBL_MAX, .cli_msg = "must be positive"},
    /* the executor's training hyperparameters */
    {.id = MODEL_FIELD_LR, .key = "lr", .type = MODEL_FT_DOUBLE, JOB(lr), .lo = 0, .hi = 10, .def = 1e-3,
     .flag = "lr", .metavar = "X", .help = "peak learning rate (default 1e-3)"},
    {.id = MODEL_FIELD_MIN_LR, .key = "min_lr", .type = MODEL_FT_DOUBLE, JOB(min_lr), .lo = 0, .hi = 10,
     .def = 1e-4, .flag = "min-lr", .metavar = "X",
     .help = "learning rate at the end of the cosine decay (default 1e-4)"},
    {.id = MODEL_FIELD_WARMUP_STEPS, .key = "warmup_steps", .type = MODEL_FT_INT, JOB(warmup_steps), .lo = 0,
     .hi = 1 << 30, .def = 10, .flag = "warmup-steps", .metavar = "N", .help = "linear warm-up steps (default 10)"},
    {.id = MODEL_FIELD_STEPS, .key = "steps", .type = MODEL_FT_INT, JOB(steps), .lo = 0, .hi = 1 << 30, .def = 100,
     .flag = "steps", .metavar = "N", .help = "training steps (default 100)", .cli_range = 1, .cli_lo = 1,
     .cli_hi = 1 << 30},
    {.id = MODEL_FIELD_SEED, .key = "seed", .type = MODEL_FT_U64, JOB(seed), .def = 1234, .flag = "seed",
     .metavar = "N", .help = "initialisation and data seed (default 1234)", .cli_range = 1, .cli_lo = 0,
     .cli_hi = 2147483647},
    {.id = MODEL_FIELD_WEIGHT_DECAY, .key = "weight_decay", .type = MODEL_FT_DOUBLE, JOB(weight_decay), .lo = 0,
     .hi = 10, .def = 0.1, .flag = "weight-decay", .metavar = "X", .help = "decoupled weight decay (default 0.1)"},
    {.id = MODEL_FIELD_GRAD_CLIP, .key = "grad_clip", .type = MODEL_FT_DOUBLE, JOB(grad_clip), .lo = 0, .hi = 1e9,
     .def = 1.0, .flag = "grad-clip", .metavar = "X",
     .help = "clip the global gradient norm to X, 0 for none (default 1.0)"},
    {.id = MODEL_FIELD_DATA, .key = "data", .type = MODEL_FT_STRING, JOB(data), .flag = "data", .metavar = "FILE",
     .help = "training data: a text file or llm.c .bin tokens (default: built-in text)", .cli_msg = "path"},
    /* without a flag: the optimizer's constants, the device's FP8 layout, the derived figures */
    {.id = MODEL_FIELD_BETA1, .key = "beta1", .type = MODEL_FT_DOUBLE, JOB(beta1), .lo = 0, .hi = 0.999999,
     .def = 0.9},
    {.id = MODEL_FIELD_BETA2, .key = "beta2", .type = MODEL_FT_DOUBLE, JOB(beta2), .lo = 0, .hi = 0.999999999,
     .def = 0.95},
    {.id = MODEL_FIELD_ADAM_EPS, .key = "eps", .type = MODEL_FT_DOUBLE, JOB(adam_eps), .lo = 0, .hi = 1,
     .def = 1e-8},
    {.id = MODEL_FIELD_MOMENTUM, .key = "momentum", .type = MODEL_FT_DOUBLE, JOB(momentum), .lo = 0,
     .hi = 0.999999, .def = 0.9},
    {.id = MODEL_FIELD_FP8_TRANSPOSE, .key = "fp8_transpose", .type = MODEL_FT_BOOL, JOB(fp8_transpose),
     .def = -1 /* auto: the simulator sets it from the device */, .shown = shown_fp8_transpose},
    {.id = MODEL_FIELD_MICRO_BATCHES, .key = "micro_batches", .type = MODEL_FT_DERIVED, .shown = shown_with_dims,
     .value = micro_batches_value},
    {.id = MODEL_FIELD_VOCAB_PADDED, .key = "vocab_padded", .type = MODEL_FT_DERIVED, .shown = shown_with_dims,
     .value = vocab_padded_value},
};
_Static_assert(sizeof fields / sizeof fields[0] == MODEL_FIELD_COUNT, "one row per field");

int model_field_count(void) { return MODEL_FIELD_COUNT; }

const ModelField *model_field_at(int i) { return i >= 0 && i < MODEL_FIELD_COUNT ? &fields[i] : NULL; }

const ModelField *model_field(ModelFieldId id)
{
    for (int i = 0; i < MODEL_FIELD_COUNT; i++)
        if (fields[i].id == id)
            return &fields[i];
    return NULL;
}

/* The member of f in s: in the layout or the job by its id. */
static char *member(const ModelField *f, ModelSpec *s)
{
    return (f->id < MODEL_FIELD_LAYOUT_END ? (char *)&s->layout : (char *)&s->job) + f->at;
}

/* ---- the command line ---- */

/* "a, b or c": the names an unknown value's message lists */
static void names_list(const ModelField *f, char *buf, size_t cap)
{
    if (f->cli_names) {
        snprintf(buf, cap, "%s", f->cli_names);
        return;
    }
    buf[0] = '\0';
    for (int i = 0; i < f->n_names; i++) {
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, "%s%s", i == 0 ? "" : i == f->n_names - 1 ? " or " : ", ", f->names[i]);
    }
}

/* The type's parse: a switch sets `on`; a value is checked against the flag's range. */
static int parse_value(const ModelField *f, const char *flag, const char *arg, int on,
                       ModelSpec *s, PxError *err)
{
    char *p = member(f, s);
    const double lo = f->cli_range ? f->cli_lo : f->lo, hi = f->cli_range ? f->cli_hi : f->hi;
    int v, rc;
    double x;
    if (!f->metavar) {
        *(int *)p = on;
        return PX_OK;
    }
    switch (f->type) {
    case MODEL_FT_INT: return px_parse_int(arg, flag, (long long)lo, (long long)hi, (int *)p, err);
    case MODEL_FT_U64:
        if (!(rc = px_parse_int(arg, flag, (long long)lo, (long long)hi, &v, err)))
            *(uint64_t *)p = (uint64_t)v;
        return rc;
    case MODEL_FT_DOUBLE:
        if ((rc = px_parse_double(arg, flag, &x, err)))
            return rc;
        if (f->cli_msg && !(x >= lo && x <= hi))
            return px_fail(err, PX_EINPUT, "%s: %s, got %s", flag, f->cli_msg, arg);
        *(double *)p = x;
        return PX_OK;
    case MODEL_FT_ENUM:
    case MODEL_FT_DTYPE:
        if ((v = name_index(arg, f->names, f->n_names)) < 0) {
            char names[160];
            names_list(f, names, sizeof names);
            return px_fail(err, PX_EINPUT, "%s: expected %s, got '%s'", flag, names, arg);
        }
        *(int *)p = v;
        return PX_OK;
    case MODEL_FT_STRING:
        if (strlen(arg) >= f->size)
            return px_fail(err, PX_EINPUT, "%s: %s longer than %zu characters", flag, f->cli_msg,
                           f->size - 1);
        px_strlcpy(p, arg, f->size);
        return PX_OK;
    default: return px_fail(err, PX_EINPUT, "%s: the field %s takes no value here", flag, f->key);
    }
}

int model_field_parse(const ModelField *f, const char *arg, int no, ModelSpec *s, PxError *err)
{
    char flag[80];
    snprintf(flag, sizeof flag, "--%s", no ? f->no_flag : f->flag);
    const int on = !no != !!f->invert;
    return f->parse ? f->parse(f, flag, arg, on, s, err) : parse_value(f, flag, arg, on, s, err);
}

/* ---- defaults and JSON ---- */

void model_spec_defaults(ModelSpec *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < MODEL_FIELD_COUNT; i++) {
        const ModelField *f = &fields[i];
        char *p = member(f, s);
        switch (f->type) {
        case MODEL_FT_INT:
        case MODEL_FT_BOOL:
        case MODEL_FT_ENUM:
        case MODEL_FT_DTYPE: *(int *)p = (int)f->def; break;
        case MODEL_FT_DOUBLE: *(double *)p = f->def; break;
        case MODEL_FT_U64: *(uint64_t *)p = (uint64_t)f->def; break;
        default: break; /* strings and lists empty; derived figures have no member */
        }
    }
}

static void field_to_json(cJSON *j, const ModelField *f, const void *obj, const ModelDims *d)
{
    if (f->shown && !f->shown(f, obj, d))
        return;
    const char *p = (const char *)obj + f->at;
    if (f->value) {
        cJSON_AddNumberToObject(j, f->key, f->value(obj, d));
        return;
    }
    switch (f->type) {
    case MODEL_FT_INT: cJSON_AddNumberToObject(j, f->key, *(const int *)p); break;
    case MODEL_FT_BOOL: cJSON_AddBoolToObject(j, f->key, *(const int *)p); break;
    case MODEL_FT_DOUBLE: cJSON_AddNumberToObject(j, f->key, *(const double *)p); break;
    case MODEL_FT_U64: cJSON_AddNumberToObject(j, f->key, (double)*(const uint64_t *)p); break;
    case MODEL_FT_ENUM: cJSON_AddStringToObject(j, f->key, f->names[*(const int *)p]); break;
    case MODEL_FT_DTYPE: cJSON_AddStringToObject(j, f->key, px_dtype_name((PxDtype)(*(const int *)p))); break;
    case MODEL_FT_STRING: cJSON_AddStringToObject(j, f->key, p); break;
    case MODEL_FT_INT_LIST:
        cJSON_AddItemToObject(j, f->key,
                              cJSON_CreateIntArray((const int *)p, *(const int *)((const char *)obj + f->count_at)));
        break;
    default: break;
    }
}

/* The fields of ids [first, end) of obj (a layout or a job), in id order. */
static cJSON *fields_to_json(const void *obj, int first, int end, const ModelDims *d)
{
    cJSON *j = cJSON_CreateObject();
    for (int id = first; id < end; id++)
        field_to_json(j, model_field((ModelFieldId)id), obj, d);
    return j;
}

static int field_from_json(const ModelField *f, const cJSON *j, const char *where, void *obj,
                           PxError *err)
{
    if (f->read)
        return f->read(f, j, where, obj, err);
    char *p = (char *)obj + f->at;
    const long long lo = (long long)f->lo, hi = (long long)f->hi;
    switch (f->type) {
    case MODEL_FT_INT: return px_json_int(j, where, f->key, f->required, lo, hi, (int *)p, err);
    case MODEL_FT_BOOL: return px_json_bool(j, where, f->key, f->required, (int *)p, err);
    case MODEL_FT_DOUBLE: return px_json_double(j, where, f->key, f->required, f->lo, f->hi, (double *)p, err);
    case MODEL_FT_U64: return px_json_u64(j, where, f->key, f->required, (uint64_t *)p, err);
    case MODEL_FT_ENUM:
    case MODEL_FT_DTYPE:
        return px_json_enum(j, where, f->key, f->required, f->names, f->n_names, (int *)p, err);
    case MODEL_FT_STRING: return px_json_string(j, where, f->key, f->required, p, f->size, err);
    default: return PX_OK; /* derived figures are written, not read */
    }
}

/* The fields of ids [first, end) from j into obj, after a warning for each key not among them. */
static int fields_from_json(const cJSON *j, const char *where, void *obj, int first, int end,
                            PxError *err)
{
    if (!cJSON_IsObject(j))
        return px_fail(err, PX_EINPUT, "%s expected an object", where);
    const char *known[MODEL_FIELD_COUNT + 1];
    int n = 0;
    for (int id = first; id < end; id++)
        known[n++] = model_field((ModelFieldId)id)->key;
    known[n] = NULL;
    px_json_warn_unknown(j, where, known);
    for (int id = first; id < end; id++) {
        int rc = field_from_json(model_field((ModelFieldId)id), j, where, obj, err);
        if (rc)
            return rc;
    }
    return PX_OK;
}

cJSON *model_layout_to_json(const ModelLayout *l)
{
    return fields_to_json(l, 0, MODEL_FIELD_LAYOUT_END, NULL);
}

int model_layout_from_json(const cJSON *j, const char *where, ModelLayout *l, PxError *err)
{
    return fields_from_json(j, where, l, 0, MODEL_FIELD_LAYOUT_END, err);
}

cJSON *model_job_to_json(const ModelJob *t, const ModelDims *d)
{
    return fields_to_json(t, MODEL_FIELD_LAYOUT_END, MODEL_FIELD_COUNT, d);
}

int model_job_from_json(const cJSON *j, const char *where, ModelJob *t, PxError *err)
{
    return fields_from_json(j, where, t, MODEL_FIELD_LAYOUT_END, MODEL_FIELD_COUNT, err);
}
