/* Published runs priced (docs/calibration.md, "Published runs"): one JSON file per source in
 * published/, each row a job someone ran and measured (model, cluster, GPUs, layout, job,
 * framework, the measured figure) with the tolerance parallax is held to on it. Each row is
 * simulated and its prediction compared with the measured figure in the row's own metric. */
#include "sim/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const metric_names[SIM_PUB_METRIC_COUNT] = {"step_s", "tflops_per_gpu",
                                                                "tokens_per_s_per_gpu"};

const char *sim_published_metric_name(int metric)
{
    return metric >= 0 && metric < SIM_PUB_METRIC_COUNT ? metric_names[metric] : "?";
}

static const char *const flop_count_names[SIM_FLOPS_COUNT] = {"parallax", "megatron", "megatron-causal",
                                                              "palm", "palm-causal"};

const char *sim_flop_count_name(SimFlopCount c)
{
    return c >= 0 && c < SIM_FLOPS_COUNT ? flop_count_names[c] : "?";
}

int sim_flop_count_from_name(const char *name)
{
    for (int i = 0; i < SIM_FLOPS_COUNT; i++)
        if (strcmp(name, flop_count_names[i]) == 0)
            return i;
    return -1;
}

/* Megatron-LM's num_floating_point_operations (megatron/training/training.py), its GQA branch:
 * 12·B·s·h² per layer times [(1 + g/a + s/h)·(d·a/h) + (f/h)·glu] with d the head width, g the
 * KV heads, f the layer's MLP width (a MoE layer: the expert width times top-k plus the shared
 * experts'), glu 3/2 for SwiGLU, plus the logits' 6·B·s·h·V. Counted per layer, so that dense
 * and MoE layers mix (first_dense). The causal variant halves the s/h term. */
static double megatron_flops(const ModelConfig *m, double tokens, double seq, double vocab, int causal)
{
    const double h = m->hidden, a = m->heads, g = m->kv_heads, d = m->head_dim;
    const double glu = m->mlp == MODEL_SWIGLU ? 1.5 : 1.0;
    const double attn = (1.0 + g / a + seq / h * (causal ? 0.5 : 1.0)) * (d * a / h);
    double per = 0.0;
    for (int l = 0; l < m->layers; l++) {
        const double f = model_layer_is_moe(m, l)
                             ? (double)m->moe.expert_ffn * m->moe.topk + m->moe.shared_ffn
                             : (double)m->ffn_hidden;
        per += attn + f / h * glu;
    }
    return 12.0 * tokens * h * h * per + 6.0 * tokens * h * vocab;
}

double sim_flop_count_step(SimFlopCount c, const ModelConfig *m, double gbs, double seq,
                           double vocab_padded)
{
    if (m->mla.kv_lora_rank > 0)
        return 0.0;
    const double tokens = gbs * seq;
    switch (c) {
    case SIM_FLOPS_MEGATRON: return megatron_flops(m, tokens, seq, vocab_padded, 0);
    case SIM_FLOPS_MEGATRON_CAUSAL: return megatron_flops(m, tokens, seq, vocab_padded, 1);
    case SIM_FLOPS_PALM:
    case SIM_FLOPS_PALM_CAUSAL: {
        /* 6N + 12·L·H·Q·T a token: N the parameters a token passes through (all of them,
         * embedding and output layer included, as PaLM's N), H heads of Q, T the sequence */
        const double attn = 12.0 * m->layers * m->heads * (double)m->head_dim * seq;
        return tokens * (6.0 * model_config_active_params(m) + (c == SIM_FLOPS_PALM ? attn : 0.5 * attn));
    }
    default: return 0.0;
    }
}

/* A model or cluster named by a row: a built-in name, or a JSON file relative to the data
 * file's directory (published/models/..., published/clusters/...). */
static void resolve(const char *dir, const char *name, char *out, size_t cap)
{
    const size_t n = strlen(name);
    if (n > 5 && strcmp(name + n - 5, ".json") == 0 && name[0] != '/' && dir[0])
        snprintf(out, cap, "%s/%s", dir, name);
    else
        snprintf(out, cap, "%s", name);
}

/* err's message again, after where: the row it came from. */
static int again(PxError *err, int rc, const char *where)
{
    char m[sizeof err->msg];
    px_strlcpy(m, err->msg, sizeof m);
    return px_fail(err, rc, "%s: %s", where, m);
}

/* A row's layout or job keys over the defaults' JSON (a row states only what it sets). */
static cJSON *overlay(cJSON *base, const cJSON *row)
{
    for (const cJSON *k = row ? row->child : NULL; k && base; k = k->next) {
        cJSON_DeleteItemFromObjectCaseSensitive(base, k->string);
        cJSON_AddItemToObject(base, k->string, cJSON_Duplicate(k, 1));
    }
    return base;
}

/* dp, when the row leaves it out: what the GPUs leave after tp x pp x cp. */
static void fill_dp(cJSON *layout, int gpus)
{
    const cJSON *dp = cJSON_GetObjectItemCaseSensitive(layout, "dp");
    if (!layout || (cJSON_IsNumber(dp) && dp->valueint > 0))
        return;
    int mp = 1;
    static const char *const keys[] = {"tp", "pp", "cp"};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(layout, keys[i]);
        mp *= cJSON_IsNumber(v) && v->valueint > 0 ? v->valueint : 1;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(layout, "dp");
    cJSON_AddNumberToObject(layout, "dp", gpus / mp > 0 ? gpus / mp : 1);
}

/* The row's figure from a simulation, in its metric. */
static double predicted(const SimResult *r, int metric)
{
    switch (metric) {
    case SIM_PUB_STEP_S: return r->step_s;
    case SIM_PUB_TFLOPS_PER_GPU: return r->tflops_per_gpu;
    default: return r->tokens_per_s / r->dims.gpus;
    }
}

/* The measured figure: exactly one of the metrics' keys. */
static int read_measured(const cJSON *row, const char *where, SimPublishedRow *out, PxError *err)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(row, "measured");
    if (!cJSON_IsObject(m))
        return px_fail(err, PX_EINPUT, "%s measured: an object with one of step_s, tflops_per_gpu, "
                       "tokens_per_s_per_gpu is required", where);
    out->metric = -1;
    for (int k = 0; k < SIM_PUB_METRIC_COUNT; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, metric_names[k]);
        if (!v)
            continue;
        if (out->metric >= 0)
            return px_fail(err, PX_EINPUT, "%s measured: give one figure, not %s and %s", where,
                           metric_names[out->metric], metric_names[k]);
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
            return px_fail(err, PX_EINPUT, "%s measured.%s must be a positive number", where,
                           metric_names[k]);
        out->metric = k;
        out->measured = v->valuedouble;
    }
    if (out->metric < 0)
        return px_fail(err, PX_EINPUT, "%s measured: none of step_s, tflops_per_gpu, "
                       "tokens_per_s_per_gpu", where);
    return PX_OK;
}

/* The FLOP count the row's tflops_per_gpu is on: absent, parallax's own. */
static int read_flop_count(const cJSON *row, const char *where, SimPublishedRow *out, PxError *err)
{
    char name[32] = "parallax";
    int rc = px_json_string(row, where, "flop_count", 0, name, sizeof name, err);
    if (rc)
        return rc;
    const int c = sim_flop_count_from_name(name);
    if (c < 0)
        return px_fail(err, PX_EINPUT, "%s flop_count: '%s' is none of parallax, megatron, "
                       "megatron-causal, palm, palm-causal", where, name);
    if (c != SIM_FLOPS_OWN && out->metric != SIM_PUB_TFLOPS_PER_GPU)
        return px_fail(err, PX_EINPUT, "%s flop_count: only a tflops_per_gpu figure is on a FLOP "
                       "count, not %s", where, metric_names[out->metric]);
    out->flops = (SimFlopCount)c;
    return PX_OK;
}

/* One row: read, simulated, compared. */
static int price_row(const cJSON *row, const char *dir, const char *where, const char *framework,
                     SimFlopCount flops, SimPublishedRow *out, PxError *err)
{
    char model[1024], cluster[1024], name[256];
    int rc;
    if ((rc = px_json_string(row, where, "id", 1, out->id, sizeof out->id, err)) ||
        (rc = px_json_string(row, where, "model", 1, name, sizeof name, err)))
        return rc;
    resolve(dir, name, model, sizeof model);
    px_strlcpy(out->model, name, sizeof out->model);
    if ((rc = px_json_string(row, where, "cluster", 1, name, sizeof name, err)))
        return rc;
    resolve(dir, name, cluster, sizeof cluster);
    px_strlcpy(out->cluster, name, sizeof out->cluster);
    px_strlcpy(out->framework, "megatron", sizeof out->framework);
    if ((rc = px_json_int(row, where, "gpus", 1, 1, 1 << 24, &out->gpus, err)) ||
        (rc = px_json_string(row, where, "framework", 0, out->framework, sizeof out->framework, err)) ||
        (rc = px_json_double(row, where, "tolerance", 1, 0.0, 1.0, &out->tolerance, err)) ||
        (rc = read_measured(row, where, out, err)) ||
        (rc = read_flop_count(row, where, out, err)))
        return rc;
    if ((int)flops >= 0 && out->flops != SIM_FLOPS_OWN)
        out->flops = flops;
    if (framework)
        px_strlcpy(out->framework, framework, sizeof out->framework);
    ModelSpec s;
    model_spec_defaults(&s);
    if ((rc = model_config_load(model, &s.model, err)))
        return rc;
    char w[700];
    snprintf(w, sizeof w, "%s framework", where);
    if ((rc = model_field_parse(model_field(MODEL_FIELD_FRAMEWORK), out->framework, 0, &s, err)))
        return again(err, rc, w);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(row, "layout");
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(row, "job");
    snprintf(w, sizeof w, "%s layout", where);
    cJSON *lj = overlay(model_layout_to_json(&s.layout), l);
    fill_dp(lj, out->gpus);
    rc = model_layout_from_json(lj, w, &s.layout, err);
    cJSON_Delete(lj);
    if (rc)
        return rc;
    snprintf(w, sizeof w, "%s job", where);
    if (s.job.seq_len <= 0)
        s.job.seq_len = s.model.seq_len; /* the JSON's range has no "the model's" */
    cJSON *jj = overlay(model_job_to_json(&s.job, NULL), j);
    rc = model_job_from_json(jj, w, &s.job, err);
    cJSON_Delete(jj);
    if (rc)
        return rc;
    ProfCluster cl;
    if ((rc = prof_cluster_load(cluster, NULL, 0, &cl, err)))
        return rc;
    SimResult r;
    rc = sim_run(&s, &cl, out->gpus, &r, err);
    if (rc) {
        prof_cluster_free(&cl);
        return again(err, rc, where);
    }
    out->predicted = predicted(&r, out->metric);
    out->step_s = r.step_s;
    if (out->flops != SIM_FLOPS_OWN) {
        /* the source's figure is its count over the measured step: the step it stands for, and
         * the prediction's step on the same count */
        const double f = sim_flop_count_step(out->flops, &s.model, s.job.global_batch,
                                             r.dims.s, r.dims.vocab_pad);
        if (!(f > 0)) {
            sim_result_free(&r);
            prof_cluster_free(&cl);
            return px_fail(err, PX_EINPUT, "%s flop_count: %s does not count %s (multi-head latent "
                           "attention)", where, sim_flop_count_name(out->flops), out->model);
        }
        out->measured_step_s = f / (out->measured * 1e12 * out->gpus);
        out->predicted = f / (r.step_s * out->gpus) / 1e12;
    }
    out->fits = r.peak_bytes <= r.rank_memory_bytes;
    sim_result_free(&r);
    prof_cluster_free(&cl);
    /* error: how far the prediction is from the measurement, positive when it predicts more
     * (a longer step, a higher rate) */
    out->error = out->predicted / out->measured - 1.0;
    out->inside = fabs(out->error) <= out->tolerance;
    return PX_OK;
}

int sim_published_run(const char *path, SimPublished *out, PxError *err)
{
    return sim_published_run_as(path, NULL, out, err);
}

int sim_published_run_as(const char *path, const char *framework, SimPublished *out, PxError *err)
{
    return sim_published_run_with(path, framework, (SimFlopCount)-1, out, err);
}

int sim_published_run_with(const char *path, const char *framework, SimFlopCount flops,
                           SimPublished *out, PxError *err)
{
    memset(out, 0, sizeof *out);
    px_strlcpy(out->path, path, sizeof out->path);
    cJSON *root = px_json_read_file(path, err);
    if (!root)
        return err->code ? err->code : PX_EINPUT;
    char where[600], dir[512];
    snprintf(where, sizeof where, "%s:", path);
    px_strlcpy(dir, path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    else
        px_strlcpy(dir, ".", sizeof dir);
    int rc = px_json_string(root, where, "source", 1, out->source, sizeof out->source, err);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "rows");
    if (!rc && (!cJSON_IsArray(rows) || cJSON_GetArraySize(rows) == 0))
        rc = px_fail(err, PX_EINPUT, "%s rows: a non-empty array of runs is required", path);
    if (!rc) {
        out->n_rows = cJSON_GetArraySize(rows);
        out->rows = calloc((size_t)out->n_rows, sizeof *out->rows);
        if (!out->rows)
            rc = px_fail(err, PX_ERUNTIME, "out of memory reading %s", path);
    }
    for (int i = 0; !rc && i < out->n_rows; i++) {
        snprintf(where, sizeof where, "%s: rows[%d]", path, i);
        rc = price_row(cJSON_GetArrayItem(rows, i), dir, where, framework, flops, &out->rows[i], err);
    }
    cJSON_Delete(root);
    if (rc)
        sim_published_free(out);
    return rc;
}

void sim_published_free(SimPublished *p)
{
    if (!p)
        return;
    free(p->rows);
    p->rows = NULL;
    p->n_rows = 0;
}

void sim_published_print(FILE *f, const SimPublished *p, int n)
{
    int rows = 0, inside = 0, w = 36; /* the id column: as wide as the longest id */
    for (int k = 0; k < n; k++)
        for (int i = 0; i < p[k].n_rows; i++)
            if ((int)strlen(p[k].rows[i].id) > w)
                w = (int)strlen(p[k].rows[i].id);
    fprintf(f, "%-*s %-11s %-20s %12s %12s %8s %6s %s\n", w, "id", "framework", "metric", "measured",
            "predicted", "error", "tol", "in/out");
    for (int k = 0; k < n; k++) {
        fprintf(f, "# %s (%s)\n", p[k].source, p[k].path);
        for (int i = 0; i < p[k].n_rows; i++) {
            const SimPublishedRow *r = &p[k].rows[i];
            fprintf(f, "%-*s %-11s %-20s %12.4g %12.4g %+7.1f%% %5.0f%% %s%s\n", w, r->id, r->framework,
                    sim_published_metric_name(r->metric), r->measured, r->predicted, 100 * r->error,
                    100 * r->tolerance, r->inside ? "in" : "OUT", r->fits ? "" : " (does not fit)");
            rows++;
            inside += r->inside;
        }
    }
    fprintf(f, "%d of %d rows within their tolerance\n", inside, rows);
}

cJSON *sim_published_to_json(const SimPublished *p, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; k < n; k++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "source", p[k].source);
        cJSON_AddStringToObject(s, "file", p[k].path);
        cJSON *rows = cJSON_AddArrayToObject(s, "rows");
        for (int i = 0; i < p[k].n_rows; i++) {
            const SimPublishedRow *r = &p[k].rows[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "id", r->id);
            cJSON_AddStringToObject(o, "model", r->model);
            cJSON_AddStringToObject(o, "cluster", r->cluster);
            cJSON_AddNumberToObject(o, "gpus", r->gpus);
            cJSON_AddStringToObject(o, "framework", r->framework);
            cJSON_AddStringToObject(o, "metric", sim_published_metric_name(r->metric));
            cJSON_AddNumberToObject(o, "measured", r->measured);
            cJSON_AddNumberToObject(o, "predicted", r->predicted);
            cJSON_AddNumberToObject(o, "error", r->error);
            cJSON_AddNumberToObject(o, "tolerance", r->tolerance);
            cJSON_AddBoolToObject(o, "inside", r->inside);
            cJSON_AddNumberToObject(o, "step_s", r->step_s);
            cJSON_AddBoolToObject(o, "fits", r->fits);
            if (r->flops != SIM_FLOPS_OWN) {
                cJSON_AddStringToObject(o, "flop_count", sim_flop_count_name(r->flops));
                cJSON_AddNumberToObject(o, "measured_step_s", r->measured_step_s);
            }
            cJSON_AddItemToArray(rows, o);
        }
        cJSON_AddItemToArray(a, s);
    }
    return a;
}
