/* Prediction against measurement: a plan's `prediction` and a run.json, quantity by quantity,
 * under the names both use (docs/formats.md's Prediction and Run). */
#include "reports/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

static int add_row(RptCompare *c, const char *quantity, double predicted, double measured,
                   PxError *err)
{
    if (c->count == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        RptDelta *r = realloc(c->rows, (size_t)cap * sizeof *r);
        if (!r)
            return px_fail(err, PX_ERUNTIME, "out of memory comparing");
        c->rows = r;
        c->cap = cap;
    }
    RptDelta *d = &c->rows[c->count++];
    px_strlcpy(d->quantity, quantity, sizeof d->quantity);
    d->predicted = predicted;
    d->measured = measured;
    d->rel_error = predicted != 0 ? (measured - predicted) / predicted
                                  : (measured == 0 ? 0.0 : HUGE_VAL);
    return PX_OK;
}

/* A number at a path of object keys, or NAN when absent. */
static double num(const cJSON *j, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b)
        v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const cJSON *stage_entry(const cJSON *arr, int stage)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "stage");
        if (cJSON_IsNumber(s) && s->valueint == stage)
            return e;
    }
    return NULL;
}

static int add_a2a(RptCompare *c, int rank, double predicted, double measured, PxError *err)
{
    RptA2a *a = realloc(c->a2a, (size_t)(c->n_a2a + 1) * sizeof *a);
    if (!a)
        return px_fail(err, PX_ERUNTIME, "out of memory comparing");
    c->a2a = a;
    a[c->n_a2a++] = (RptA2a){rank, predicted, measured};
    return PX_OK;
}

/* run.json's moe.layers[] (absent: a dense run, nothing to add): each layer's counts and their
 * spread. PX_EINPUT names a malformed entry. */
static int moe_layers(RptCompare *c, const cJSON *run, PxError *err)
{
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "moe"), "layers");
    if (!ls)
        return PX_OK;
    if (!cJSON_IsArray(ls))
        return px_fail(err, PX_EINPUT, "run: moe.layers: expected an array");
    const int n = cJSON_GetArraySize(ls);
    c->moe = calloc((size_t)(n > 0 ? n : 1), sizeof *c->moe);
    if (!c->moe)
        return px_fail(err, PX_ERUNTIME, "out of memory comparing");
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(ls, i);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "tokens_per_expert");
        const double layer = num(e, "layer", NULL);
        const int E = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : 0;
        if (isnan(layer) || E == 0)
            return px_fail(err, PX_EINPUT,
                           "run: moe.layers[%d]: expected a layer and a non-empty "
                           "tokens_per_expert array", i);
        RptMoeLayer *L = &c->moe[c->n_moe++];
        L->layer = (int)layer;
        L->experts = E;
        L->tokens = malloc((size_t)E * sizeof *L->tokens);
        if (!L->tokens)
            return px_fail(err, PX_ERUNTIME, "out of memory comparing");
        double sum = 0;
        for (int k = 0; k < E; k++) {
            const cJSON *v = cJSON_GetArrayItem(t, k);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0)
                return px_fail(err, PX_EINPUT,
                               "run: moe.layers[%d].tokens_per_expert[%d]: expected a count", i, k);
            const double x = v->valuedouble;
            L->tokens[k] = x;
            L->min = k == 0 || x < L->min ? x : L->min;
            L->max = x > L->max ? x : L->max;
            sum += x;
        }
        L->mean = sum / E;
        L->max_over_mean = L->mean > 0 ? L->max / L->mean : 0;
        L->imbalance = num(e, "imbalance", NULL);
        L->extra_bytes = num(e, "extra_bytes", NULL);
    }
    return PX_OK;
}

/* The reason a rank's memory category is above the prediction, when the run gives one: the
 * MoE buffers dropless routing grew (run.json's memory.per_rank[].moe_dropless_bytes), when
 * they are the whole difference. NULL otherwise. */
static const char *memory_reason(const cJSON *rank_mem, const char *cat, double p, double m)
{
    const double g = num(cJSON_GetObjectItemCaseSensitive(rank_mem, "moe_dropless_bytes"), cat,
                         NULL);
    return !isnan(g) && g > 0 && m == p + g ? "dropless growth" : NULL;
}

/* The "rank" of run.json's entry i of `what`: an integer from 0 to world - 1, else an input error
 * naming the entry. */
static int entry_rank(const cJSON *e, const char *what, int i, int world, int *rank, PxError *err)
{
    double v = num(e, "rank", NULL);
    if (isnan(v) || v != floor(v) || v < 0 || v >= world)
        return px_fail(err, PX_EINPUT,
                       "run: %s[%d].rank: expected an integer from 0 to %d (the plan's ranks)",
                       what, i, world - 1);
    *rank = (int)v;
    return PX_OK;
}

int rpt_compare(const cJSON *plan_json, const cJSON *run, RptCompare *c, PxError *err)
{
    memset(c, 0, sizeof *c);
    ModelPlan plan;
    int rc = model_plan_from_json(plan_json, "plan", &plan, err);
    if (rc)
        return rc;
    const cJSON *pred = plan.prediction;
    if (!pred) {
        model_plan_free(&plan);
        return px_fail(err, PX_EINPUT, "plan: no prediction to compare (write it with parallax plan -o)");
    }
    if (!cJSON_IsObject(run)) {
        model_plan_free(&plan);
        return px_fail(err, PX_EINPUT, "run: expected a JSON object");
    }
    char q[96];
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(run, "steps");
    c->steps = cJSON_IsArray(steps) ? cJSON_GetArraySize(steps) : 0;
    double ps = num(pred, "time", "step_s"), ms = num(run, "time", "step_s_median");
    if (isnan(ps) || isnan(ms)) {
        model_plan_free(&plan);
        return px_fail(err, PX_EINPUT, "%s lacks time.%s", isnan(ps) ? "plan prediction" : "run",
                       isnan(ps) ? "step_s" : "step_s_median");
    }
    if ((rc = add_row(c, "step_s", ps, ms, err)))
        goto out;
    double pb = num(pred, "time", "bubble_fraction"), mb = num(run, "time", "bubble_fraction");
    if (!isnan(pb) && !isnan(mb) && (rc = add_row(c, "bubble_fraction", pb, mb, err)))
        goto out;

    /* memory per rank and category against the rank's stage */
    const cJSON *mpr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "memory"), "per_rank");
    const cJSON *mps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pred, "memory"), "per_stage");
    const cJSON *r;
    const int world = plan.gpus;
    int idx = 0;
    cJSON_ArrayForEach(r, mpr)
    {
        int rank, tp, cp, dp, stage;
        if ((rc = entry_rank(r, "memory.per_rank", idx++, world, &rank, err)))
            goto out;
        model_rank_coords(&plan.spec.layout, rank, &tp, &cp, &dp, &stage);
        const cJSON *ps_e = stage_entry(mps, stage);
        if (!ps_e)
            continue;
        /* runtime is the profile's allowance, not a measurement: left out */
        for (int k = 0; k < MODEL_RUNTIME; k++) {
            const char *cat = model_category_name((ModelCategory)k);
            double p = num(ps_e, cat, NULL), m = num(r, cat, NULL);
            if (isnan(p) || isnan(m))
                continue;
            const char *why = memory_reason(r, cat, p, m);
            snprintf(q, sizeof q, "memory rank %d %s%s%s%s", rank, cat, why ? " (" : "",
                     why ? why : "", why ? ")" : "");
            if ((rc = add_row(c, q, p, m, err)))
                goto out;
        }
    }
    /* communication bytes per rank and kind */
    const cJSON *cpr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "comm"), "per_rank");
    const cJSON *cps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pred, "comm"), "per_stage");
    idx = 0;
    cJSON_ArrayForEach(r, cpr)
    {
        int rank, tp, cp, dp, stage;
        if ((rc = entry_rank(r, "comm.per_rank", idx++, world, &rank, err)))
            goto out;
        model_rank_coords(&plan.spec.layout, rank, &tp, &cp, &dp, &stage);
        const cJSON *pe = stage_entry(cps, stage);
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(r, "by_kind");
        if (!pe || !by)
            continue;
        for (int k = 0; k < MODEL_COMM_COUNT; k++) {
            const char *kind = model_comm_name((ModelComm)k);
            double p = num(pe, kind, NULL), m = num(by, kind, NULL);
            if (isnan(p) || isnan(m) || (p == 0 && m == 0))
                continue;
            snprintf(q, sizeof q, "comm rank %d %s bytes", rank, kind);
            if ((rc = add_row(c, q, p, m, err)) ||
                (k == MODEL_EP_ALL_TO_ALL && (rc = add_a2a(c, rank, p, m, err))))
                goto out;
        }
    }
    c->moe_planned_imbalance = num(cJSON_GetObjectItemCaseSensitive(run, "moe"), "planned_imbalance", NULL);
    if ((rc = moe_layers(c, run, err)))
        goto out;
    /* FLOPs per rank per step */
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "flops"), "per_rank_per_step");
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pred, "flops"), "per_rank_per_step");
    for (int rank = 0; cJSON_IsArray(fr) && rank < cJSON_GetArraySize(fr) && rank < world; rank++) {
        int tp, cp, dp, stage;
        model_rank_coords(&plan.spec.layout, rank, &tp, &cp, &dp, &stage);
        const cJSON *m = cJSON_GetArrayItem(fr, rank), *p = cJSON_GetArrayItem(fp, stage);
        if (!cJSON_IsNumber(m) || !cJSON_IsNumber(p))
            continue;
        snprintf(q, sizeof q, "flops rank %d per step", rank);
        if ((rc = add_row(c, q, p->valuedouble, m->valuedouble, err)))
            goto out;
    }
    /* per-op time per step: predicted ops of a stage summed by name against the measured ops
     * (run.json's op seconds are per step, averaged over the timed steps) */
    const cJSON *pops = cJSON_GetObjectItemCaseSensitive(pred, "ops");
    const cJSON *mops = cJSON_GetObjectItemCaseSensitive(run, "ops");
    const cJSON *mo;
    cJSON_ArrayForEach(mo, mops)
    {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(mo, "name");
        if (!cJSON_IsString(nm))
            continue;
        double sv = num(mo, "stage", NULL);
        int stage = isnan(sv) || sv < 0 || sv >= plan.spec.layout.pp ? 0 : (int)sv;
        double p = 0;
        int found = 0;
        const cJSON *po;
        cJSON_ArrayForEach(po, pops)
        {
            const cJSON *pn = cJSON_GetObjectItemCaseSensitive(po, "name");
            if (cJSON_IsString(pn) && strcmp(pn->valuestring, nm->valuestring) == 0 &&
                num(po, "stage", NULL) == stage) {
                p += num(po, "seconds", NULL);
                found = 1;
            }
        }
        if (!found)
            continue;
        if (plan.spec.layout.pp > 1)
            snprintf(q, sizeof q, "op s%d %s", stage, nm->valuestring);
        else
            snprintf(q, sizeof q, "op %s", nm->valuestring);
        if ((rc = add_row(c, q, p, num(mo, "seconds", NULL), err)))
            goto out;
    }
out:
    model_plan_free(&plan);
    if (rc)
        rpt_compare_free(c);
    return rc;
}

void rpt_compare_free(RptCompare *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_moe; i++)
        free(c->moe[i].tokens);
    free(c->moe);
    free(c->a2a);
    free(c->rows);
    memset(c, 0, sizeof *c);
}

/* Experts up to this many are listed one by one; more only by their spread. */
enum { MOE_LIST_MAX = 16 };

/* The MoE layers' routing and the expert all-to-all per rank, after the quantity table. */
static void print_moe(FILE *f, const RptCompare *c)
{
    if (c->n_moe > 0) {
        fprintf(f, "\nMoE routing, last step (token copies per expert, every rank's tokens)\n");
        fprintf(f, "%5s %7s %10s %10s %12s %9s  %s\n", "layer", "experts", "min", "max", "mean",
                "max/mean", "per expert");
        for (int i = 0; i < c->n_moe; i++) {
            const RptMoeLayer *L = &c->moe[i];
            fprintf(f, "%5d %7d %10.0f %10.0f %12.1f %9.3f ", L->layer, L->experts, L->min,
                    L->max, L->mean, L->max_over_mean);
            if (L->experts <= MOE_LIST_MAX)
                for (int e = 0; e < L->experts; e++)
                    fprintf(f, " %.0f", L->tokens[e]);
            else
                fprintf(f, " (%d experts: see run.json)", L->experts);
            fprintf(f, "\n");
        }
    }
    int grew = 0;
    for (int i = 0; i < c->n_moe; i++)
        grew |= c->moe[i].extra_bytes > 0;
    if (grew) {
        fprintf(f, "\nMoE buffers grown past the plan (dropless: no token copy dropped; the "
                   "memory rows marked grown)\n");
        fprintf(f, "%5s %18s %18s %14s\n", "layer", "planned imbalance", "measured imbalance",
                "extra bytes");
        for (int i = 0; i < c->n_moe; i++)
            fprintf(f, "%5d %18.3f %18.3f %14.0f\n", c->moe[i].layer, c->moe_planned_imbalance,
                    c->moe[i].imbalance, c->moe[i].extra_bytes);
    }
    if (c->n_a2a > 0) {
        fprintf(f, "\nexpert all-to-all per step (bytes)\n");
        fprintf(f, "%5s %14s %14s %9s\n", "rank", "predicted", "measured", "ratio");
        for (int i = 0; i < c->n_a2a; i++) {
            const RptA2a *a = &c->a2a[i];
            char ratio[32];
            if (a->predicted > 0)
                snprintf(ratio, sizeof ratio, "%.3f", a->measured / a->predicted);
            else
                snprintf(ratio, sizeof ratio, "n/a");
            fprintf(f, "%5d %14.0f %14.0f %9s\n", a->rank, a->predicted, a->measured, ratio);
        }
    }
}

/* Ops below 1% of the predicted step (both predicted and measured) are listed only on request. */
static int shown(const RptCompare *c, int i, int all_ops)
{
    double step = c->count > 0 ? c->rows[0].predicted : 0;
    const RptDelta *d = &c->rows[i];
    return all_ops || strncmp(d->quantity, "op ", 3) != 0 || d->predicted >= 0.01 * step ||
           d->measured >= 0.01 * step;
}

static void rel_error_text(char *buf, size_t cap, const RptDelta *d)
{
    if (isinf(d->rel_error))
        snprintf(buf, cap, "n/a");
    else
        snprintf(buf, cap, "%+.1f%%", 100 * d->rel_error);
}

void rpt_compare_print(FILE *f, const RptCompare *c, int all_ops)
{
    int hidden = 0;
    fprintf(f, "%-48s %14s %14s %9s\n", "quantity", "predicted", "measured", "error");
    for (int i = 0; i < c->count; i++) {
        const RptDelta *d = &c->rows[i];
        if (!shown(c, i, all_ops)) {
            hidden++;
            continue;
        }
        char e[32];
        rel_error_text(e, sizeof e, d);
        fprintf(f, "%-48s %14.6g %14.6g %9s\n", d->quantity, d->predicted, d->measured, e);
    }
    if (hidden)
        fprintf(f, "(%d ops under 1%% of the step not shown; --all-ops lists them)\n", hidden);
    print_moe(f, c);
}

/* The unit of a quantity of the table, by its name's form. */
static const char *quantity_unit(const char *q)
{
    if (strcmp(q, "step_s") == 0)
        return "s";
    if (strcmp(q, "bubble_fraction") == 0)
        return "idle / compute time";
    if (strncmp(q, "memory ", 7) == 0)
        return "bytes";
    if (strncmp(q, "comm ", 5) == 0)
        return "bytes per step";
    if (strncmp(q, "flops ", 6) == 0)
        return "FLOPs per step";
    if (strncmp(q, "op ", 3) == 0)
        return "s per step";
    return "";
}

void rpt_compare_markdown(FILE *f, const RptCompare *c, int all_ops)
{
    int hidden = 0;
    fputs("| quantity | unit | predicted | measured | error: (measured - predicted) / predicted |\n"
          "|---|---|---:|---:|---:|\n", f);
    for (int i = 0; i < c->count; i++) {
        const RptDelta *d = &c->rows[i];
        if (!shown(c, i, all_ops)) {
            hidden++;
            continue;
        }
        char e[32];
        rel_error_text(e, sizeof e, d);
        /* op names come from run.json: a '|' in one would end its cell */
        fputs("| ", f);
        for (const char *p = d->quantity; *p; p++) {
            if (*p == '|' || *p == '\\')
                fputc('\\', f);
            fputc(*p, f);
        }
        fprintf(f, " | %s | %.6g | %.6g | %s |\n", quantity_unit(d->quantity), d->predicted, d->measured, e);
    }
    if (hidden)
        fprintf(f, "\n%d ops under 1%% of the step not shown (`parallax compare --all-ops` lists them).\n",
                hidden);
    if (c->n_moe > 0 || c->n_a2a > 0) {
        fputs("\n```", f);
        print_moe(f, c); /* starts with its own blank line */
        fputs("```\n", f);
    }
}

cJSON *rpt_compare_to_json(const RptCompare *c)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "steps", c->steps);
    cJSON *rows = cJSON_AddArrayToObject(j, "rows");
    for (int i = 0; i < c->count; i++) {
        const RptDelta *d = &c->rows[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "quantity", d->quantity);
        cJSON_AddNumberToObject(e, "predicted", d->predicted);
        cJSON_AddNumberToObject(e, "measured", d->measured);
        if (isinf(d->rel_error))
            cJSON_AddNullToObject(e, "rel_error");
        else
            cJSON_AddNumberToObject(e, "rel_error", d->rel_error);
        cJSON_AddItemToArray(rows, e);
    }
    if (c->n_moe > 0 || c->n_a2a > 0) {
        cJSON *m = cJSON_AddObjectToObject(j, "moe");
        cJSON *ls = cJSON_AddArrayToObject(m, "layers");
        for (int i = 0; i < c->n_moe; i++) {
            const RptMoeLayer *L = &c->moe[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "layer", L->layer);
            cJSON_AddItemToObject(e, "tokens_per_expert",
                                  cJSON_CreateDoubleArray(L->tokens, L->experts));
            cJSON_AddNumberToObject(e, "min", L->min);
            cJSON_AddNumberToObject(e, "max", L->max);
            cJSON_AddNumberToObject(e, "mean", L->mean);
            cJSON_AddNumberToObject(e, "max_over_mean", L->max_over_mean);
            if (!isnan(L->imbalance))
                cJSON_AddNumberToObject(e, "imbalance", L->imbalance);
            if (!isnan(L->extra_bytes))
                cJSON_AddNumberToObject(e, "extra_bytes", L->extra_bytes);
            cJSON_AddItemToArray(ls, e);
        }
        cJSON *as = cJSON_AddArrayToObject(m, "ep_all_to_all");
        for (int i = 0; i < c->n_a2a; i++) {
            const RptA2a *a = &c->a2a[i];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rank", a->rank);
            cJSON_AddNumberToObject(e, "predicted_bytes", a->predicted);
            cJSON_AddNumberToObject(e, "measured_bytes", a->measured);
            if (a->predicted > 0)
                cJSON_AddNumberToObject(e, "ratio", a->measured / a->predicted);
            else
                cJSON_AddNullToObject(e, "ratio");
            cJSON_AddItemToArray(as, e);
        }
    }
    return j;
}
