/* Plans: the layout, training job and prediction the planner hands to the executor, written and
 * read as JSON (the layout's and the job's own JSON is fields.c's). */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

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
