/* A whole report: every chart the inputs allow, the traces, and the pages. */
#include "reports/report.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SECTIONS 16

typedef struct {
    RptSection sec[MAX_SECTIONS];
    char *texts[MAX_SECTIONS];
    int n;
} Page;

static void section(Page *p, const char *heading, const char *chart, char *text)
{
    if (p->n == MAX_SECTIONS) {
        free(text);
        return;
    }
    p->sec[p->n] = (RptSection){heading, chart, text};
    p->texts[p->n] = text;
    p->n++;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(NULL, 0, f, ap);
    va_end(ap);
    char *s = malloc((size_t)n + 1);
    if (s) {
        va_start(ap, f);
        vsnprintf(s, (size_t)n + 1, f, ap);
        va_end(ap);
    }
    return s;
}

static void logf_(FILE *log, const char *dir, const char *name)
{
    if (log)
        fprintf(log, "  %s/%s\n", dir, name);
}

/* Memory per stage, stacked by category, from the prediction. */
static int memory_chart(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(q->plan, "prediction");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pred, "memory"), "per_stage");
    int rows = cJSON_GetArraySize(ps);
    if (!cJSON_IsArray(ps) || rows == 0)
        return PX_OK;
    const char *names[MODEL_CAT_COUNT];
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        names[c] = model_category_name((ModelCategory)c);
    double *v = calloc((size_t)rows * MODEL_CAT_COUNT, sizeof *v);
    char (*labels)[24] = calloc((size_t)rows, sizeof *labels);
    const char **lp = calloc((size_t)rows, sizeof *lp);
    if (!v || !labels || !lp) {
        free(v);
        free(labels);
        free(lp);
        return px_fail(err, PX_ERUNTIME, "out of memory");
    }
    char text[4096];
    size_t tn = (size_t)snprintf(text, sizeof text, "| stage | total GiB | largest category |\n|---:|---:|---|\n");
    for (int r = 0; r < rows; r++) {
        const cJSON *e = cJSON_GetArrayItem(ps, r);
        snprintf(labels[r], sizeof labels[r], "stage %d", r);
        lp[r] = labels[r];
        int big = 0;
        for (int c = 0; c < MODEL_CAT_COUNT; c++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(e, names[c]);
            v[r * MODEL_CAT_COUNT + c] = cJSON_IsNumber(x) ? x->valuedouble / PX_GIB : 0;
            if (v[r * MODEL_CAT_COUNT + c] > v[r * MODEL_CAT_COUNT + big])
                big = c;
        }
        const cJSON *tot = cJSON_GetObjectItemCaseSensitive(e, "total");
        char gib[32];
        rpt_fmt_sig(gib, sizeof gib, cJSON_IsNumber(tot) ? tot->valuedouble / PX_GIB : 0, 3);
        if (tn < sizeof text - 80 && (r < 8 || r == rows - 1))
            tn += (size_t)snprintf(text + tn, sizeof text - tn, "| %d | %s | %s |\n", r, gib, names[big]);
    }
    RptOutput o = {q->dir};
    int rc = rpt_stacked_bars(&o, "memory", "memory per GPU by pipeline stage (predicted)", "GiB", lp,
                              rows, names, MODEL_CAT_COUNT, v, err);
    free(v);
    free(labels);
    free(lp);
    if (rc)
        return rc;
    logf_(log, q->dir, "memory.png, memory.svg");
    section(pg, "Memory per pipeline stage", "memory", fmt("%s", text));
    return PX_OK;
}

static const char *stage_names[256];
static char stage_name_buf[256][16];

static void name_tracks(const char *prefix, int n)
{
    for (int i = 0; i < n && i < 256; i++) {
        snprintf(stage_name_buf[i], sizeof stage_name_buf[i], "%s %d", prefix, i);
        stage_names[i] = stage_name_buf[i];
    }
}

/* The simulated schedule (re-simulated from the plan) and the measured one (run.json's
 * timeline, when it has one): a chart with both and a trace each. */
static int timelines(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    RptSpan *spans[2] = {NULL, NULL};
    int counts[2] = {0, 0}, panels = 0, rc = PX_OK, tracks_sim = 0, tracks_run = 0;
    const char *titles[2];
    char sim_title[128] = "", run_title[128] = "";
    RptSpan *sim = NULL, *meas = NULL;
    int n_sim = 0, n_meas = 0;
    if (q->plan) {
        ModelPlan plan;
        PxError e2 = {0};
        if (model_plan_from_json(q->plan, "plan", &plan, &e2) == PX_OK) {
            SimResult r;
            /* the timeline of the plan's own profile, on which its prediction was made */
            if (sim_run(&plan.spec, &plan.profile, plan.gpus, &r, &e2) == PX_OK) {
                SimEvent *ev;
                int n;
                if (sim_timeline(&r, &ev, &n, &e2) == PX_OK) {
                    sim = calloc((size_t)(n > 0 ? n : 1), sizeof *sim);
                    for (int i = 0; sim && i < n; i++) {
                        sim[i].track = ev[i].stage;
                        sim[i].kind = ev[i].backward;
                        sim[i].start_s = ev[i].start_s;
                        sim[i].end_s = ev[i].end_s;
                        snprintf(sim[i].label, sizeof sim[i].label, "%c c%d mb%d", ev[i].backward ? 'B' : 'F',
                                 ev[i].chunk, ev[i].mb);
                    }
                    n_sim = sim ? n : 0;
                    tracks_sim = r.dims.p;
                    free(ev);
                    snprintf(sim_title, sizeof sim_title, "simulated: pp %d, %d micro-batches, %s, bubble %.1f%%",
                             r.dims.p, r.dims.m, model_schedule_name(r.spec.layout.schedule),
                             100 * r.bubble_fraction);
                }
                sim_result_free(&r);
            }
            model_plan_free(&plan);
        } else {
            px_warn("report: no simulated timeline: %s", e2.msg);
        }
    }
    if (q->run) {
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(q->run, "timeline");
        int total = 0;
        const cJSON *rk, *ev;
        cJSON_ArrayForEach(rk, tl) total += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(rk, "events"));
        if (total > 0) {
            meas = calloc((size_t)total, sizeof *meas);
            cJSON_ArrayForEach(rk, tl)
            {
                const cJSON *rr = cJSON_GetObjectItemCaseSensitive(rk, "rank");
                int rank = cJSON_IsNumber(rr) ? rr->valueint : 0;
                if (rank + 1 > tracks_run)
                    tracks_run = rank + 1;
                cJSON_ArrayForEach(ev, cJSON_GetObjectItemCaseSensitive(rk, "events"))
                {
                    if (!meas || n_meas >= total)
                        break;
                    RptSpan *s = &meas[n_meas++];
                    const cJSON *b = cJSON_GetObjectItemCaseSensitive(ev, "backward");
                    const cJSON *c = cJSON_GetObjectItemCaseSensitive(ev, "chunk");
                    const cJSON *m = cJSON_GetObjectItemCaseSensitive(ev, "mb");
                    const cJSON *s0 = cJSON_GetObjectItemCaseSensitive(ev, "start_s");
                    const cJSON *s1 = cJSON_GetObjectItemCaseSensitive(ev, "end_s");
                    s->track = rank;
                    s->kind = cJSON_IsTrue(b) || (cJSON_IsNumber(b) && b->valueint) ? 1 : 0;
                    s->start_s = cJSON_IsNumber(s0) ? s0->valuedouble : 0;
                    s->end_s = cJSON_IsNumber(s1) ? s1->valuedouble : 0;
                    snprintf(s->label, sizeof s->label, "%c c%d mb%d", s->kind ? 'B' : 'F',
                             cJSON_IsNumber(c) ? c->valueint : 0, cJSON_IsNumber(m) ? m->valueint : 0);
                }
            }
            snprintf(run_title, sizeof run_title, "measured: %d ranks, one step", tracks_run);
        }
    }
    RptOutput o = {q->dir};
    char path[1200];
    if (n_sim > 0) {
        spans[panels] = sim;
        counts[panels] = n_sim;
        titles[panels++] = sim_title;
        snprintf(path, sizeof path, "%s/trace_simulated.json", q->dir);
        name_tracks("stage", tracks_sim);
        if ((rc = rpt_trace_write(path, "parallax simulated schedule", sim, n_sim, stage_names, tracks_sim, err)))
            goto out;
        logf_(log, q->dir, "trace_simulated.json");
    }
    if (n_meas > 0) {
        spans[panels] = meas;
        counts[panels] = n_meas;
        titles[panels++] = run_title;
        snprintf(path, sizeof path, "%s/trace_measured.json", q->dir);
        name_tracks("rank", tracks_run);
        if ((rc = rpt_trace_write(path, "parallax measured run", meas, n_meas, stage_names, tracks_run, err)))
            goto out;
        logf_(log, q->dir, "trace_measured.json");
    }
    if (panels > 0) {
        if ((rc = rpt_timeline_chart(&o, "timeline", "pipeline timeline of one step", (const RptSpan *const *)spans,
                                     counts, titles, panels, err)))
            goto out;
        logf_(log, q->dir, "timeline.png, timeline.svg");
        section(pg, "Pipeline timeline", "timeline",
                fmt("Each bar is one forward (blue) or backward (orange) pass of a model chunk for one "
                    "micro-batch. %s%s%s Open trace_simulated.json%s in ui.perfetto.dev or "
                    "chrome://tracing to zoom in.",
                    n_sim ? "Simulated from the plan: " : "", n_sim ? sim_title : "", n_sim ? "." : "",
                    n_meas ? " and trace_measured.json" : ""));
    }
out:
    free(sim);
    free(meas);
    return rc;
}

static int comparison(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    RptCompare c;
    int rc = rpt_compare(q->plan, q->run, &c, err);
    if (rc)
        return rc;
    /* the chart: the largest ops by predicted time (at most 12, each above 1% of the step),
     * on their own scale; the step's own figures go in the title */
    enum { TOP = 12 };
    const char **labels = calloc(TOP, sizeof *labels);
    double *p = calloc(TOP, sizeof *p), *m = calloc(TOP, sizeof *m);
    int n = 0;
    double step = c.count ? c.rows[0].predicted : 0, step_m = c.count ? c.rows[0].measured : 0;
    char *used = calloc((size_t)c.count + 1, 1);
    while (labels && p && m && used && n < TOP) {
        int best = -1;
        for (int i = 1; i < c.count; i++) {
            const RptDelta *d = &c.rows[i];
            if (!used[i] && strncmp(d->quantity, "op ", 3) == 0 && d->predicted >= 0.01 * step &&
                (best < 0 || d->predicted > c.rows[best].predicted))
                best = i;
        }
        if (best < 0)
            break;
        used[best] = 1;
        labels[n] = c.rows[best].quantity + 3;
        p[n] = c.rows[best].predicted * 1e3;
        m[n] = c.rows[best].measured * 1e3;
        n++;
    }
    free(used);
    if (n == 0 && c.count > 0 && labels && p && m) { /* no op timings: the step alone */
        labels[n] = "step";
        p[n] = step * 1e3;
        m[n] = step_m * 1e3;
        n++;
    }
    char title[160];
    snprintf(title, sizeof title,
             "step %.2f ms predicted, %.2f ms measured (%+.1f%%): the largest ops per step",
             step * 1e3, step_m * 1e3, step > 0 ? 100 * (step_m - step) / step : 0.0);
    RptOutput o = {q->dir};
    if (n > 0 && (rc = rpt_compare_bars(&o, "compare", title,
                                        "milliseconds per step", labels, p, m, n, err)) == PX_OK)
        logf_(log, q->dir, "compare.png, compare.svg");
    free(labels);
    free(p);
    free(m);
    if (!rc) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f) {
            rpt_compare_markdown(f, &c, 0);
            fclose(f);
        }
        section(pg, "Predicted against measured", n > 0 ? "compare" : NULL, text);
    }
    rpt_compare_free(&c);
    return rc;
}

typedef struct {
    double *x, *y;
    int n, cap;
} Points;

static void collect(void *ctx, const SimCandidate *c)
{
    Points *pt = ctx;
    if (pt->n == pt->cap) {
        int cap = pt->cap ? 2 * pt->cap : 1024;
        double *x = realloc(pt->x, (size_t)cap * sizeof *x), *y = x ? realloc(pt->y, (size_t)cap * sizeof *y) : NULL;
        if (!x || !y) {
            pt->x = x ? x : pt->x;
            return;
        }
        pt->x = x;
        pt->y = y;
        pt->cap = cap;
    }
    pt->x[pt->n] = (double)c->peak_bytes / PX_GIB;
    pt->y[pt->n] = c->step_s;
    pt->n++;
}

static int scaling(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    const int n = q->n_gpus;
    double *xs = calloc((size_t)n, sizeof *xs), *ts = calloc((size_t)n, sizeof *ts), *ms = calloc((size_t)n, sizeof *ms);
    double *xw = calloc((size_t)n, sizeof *xw), *tw = calloc((size_t)n, sizeof *tw), *mw = calloc((size_t)n, sizeof *mw);
    int ns = 0, nw = 0, rc = PX_OK;
    char text[8192];
    size_t tn = (size_t)snprintf(text, sizeof text,
                                 "| GPUs | strong: best layout | TFLOP/s/GPU | MFU | weak: global batch | TFLOP/s/GPU | MFU |\n"
                                 "|---:|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; xs && ts && ms && xw && tw && mw && i < n; i++) {
        /* a row's cells, strong then weak: layout or global batch, TFLOP/s per GPU, MFU; a
         * size without a feasible layout keeps its dashes, so every row has all its cells */
        char cell[2][3][64];
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 3; j++)
                snprintf(cell[k][j], sizeof cell[k][j], "-");
        int found = 0;
        for (int weak = 0; weak <= 1; weak++) {
            SimPlanRequest r;
            memset(&r, 0, sizeof r);
            r.base = *q->base;
            r.gpus = q->gpus[i];
            r.top = 1;
            r.headroom = 0.05;
            if (weak) {
                double g = (double)q->base->job.global_batch * q->gpus[i] / q->gpus[0];
                r.base.job.global_batch = (int)llround(g);
                if (r.base.job.global_batch < 1)
                    continue;
            }
            SimPlanResult res;
            PxError e2 = {0};
            if (sim_plan(&r, q->cluster, &res, &e2) != PX_OK)
                continue;
            const SimCandidate *c = &res.top[0];
            found = 1;
            if (!weak) {
                xs[ns] = q->gpus[i];
                ts[ns] = c->tflops_per_gpu;
                ms[ns] = 100 * c->mfu;
                ns++;
                snprintf(cell[0][0], sizeof cell[0][0], "tp %d pp %d dp %d cp %d", c->spec.layout.tp,
                         c->spec.layout.pp, c->spec.layout.dp, c->spec.layout.cp);
            } else {
                xw[nw] = q->gpus[i];
                tw[nw] = c->tflops_per_gpu;
                mw[nw] = 100 * c->mfu;
                nw++;
                snprintf(cell[1][0], sizeof cell[1][0], "%d", r.base.job.global_batch);
            }
            /* TFLOP/s per GPU spans 0.01 (the tiny model on a CPU) to hundreds: significant
             * digits, not a fixed count of decimals, keep it readable at every size */
            rpt_fmt_sig(cell[weak][1], sizeof cell[weak][1], c->tflops_per_gpu, 3);
            rpt_fmt_sig(cell[weak][2], sizeof cell[weak][2], 100 * c->mfu, 3);
            if (isfinite(c->mfu))
                strcat(cell[weak][2], "%");
            sim_plan_free(&res);
        }
        if (found && tn < sizeof text - 400)
            tn += (size_t)snprintf(text + tn, sizeof text - tn, "| %d | %s | %s | %s | %s | %s | %s |\n",
                                   q->gpus[i], cell[0][0], cell[0][1], cell[0][2], cell[1][0],
                                   cell[1][1], cell[1][2]);
    }
    if (ns + nw > 0) {
        RptSeries s[4] = {{"strong scaling: TFLOP/s per GPU", xs, ts, ns, 0},
                          {"weak scaling: TFLOP/s per GPU", xw, tw, nw, 0},
                          {"strong scaling: MFU %", xs, ms, ns, 1},
                          {"weak scaling: MFU %", xw, mw, nw, 1}};
        RptOutput o = {q->dir};
        char title[256];
        snprintf(title, sizeof title,
                 "%s on %s: best layout per size (strong: global batch %d; weak: %d per %d GPU%s)",
                 q->base->model.name, q->cluster->name, q->base->job.global_batch,
                 q->base->job.global_batch, q->gpus[0], q->gpus[0] > 1 ? "s" : "");
        if ((rc = rpt_line_chart(&o, "scaling", title, "GPUs", "TFLOP/s per GPU", "MFU (%)", 1, s, 4, err)) == PX_OK) {
            logf_(log, q->dir, "scaling.png, scaling.svg");
            section(pg, "Scaling", "scaling",
                    fmt("Strong scaling keeps the global batch of %d; weak scaling grows it with the GPUs. "
                        "Each point is the planner's best layout at that size.\n\n%s",
                        q->base->job.global_batch, text));
        }
    }
    free(xs);
    free(ts);
    free(ms);
    free(xw);
    free(tw);
    free(mw);
    return rc;
}

/* The planner's best layout at one size with the layout's family pinned: sharded data
 * parallelism alone (tp, pp, cp 1, ZeRO-3 with the base's sharding knobs) or 3D parallelism
 * (ZeRO-1, every tp x pp x dp). 0 when nothing of that family fits. */
static int best_of(const RptRequest *q, int gpus, int sharded, SimCandidate *out)
{
    SimPlanRequest r;
    memset(&r, 0, sizeof r);
    r.base = *q->base;
    r.gpus = gpus;
    r.top = 1;
    r.headroom = 0.05;
    r.pinned = SIM_PIN_ZERO;
    r.base.layout.zero = sharded ? 3 : 1;
    if (sharded) {
        r.pinned |= SIM_PIN_TP | SIM_PIN_PP | SIM_PIN_CP;
        r.base.layout.tp = r.base.layout.pp = r.base.layout.cp = 1;
    } else {
        r.base.layout.fsdp = r.base.layout.keep_gathered = 0;
    }
    SimPlanResult res;
    PxError e2 = {0};
    if (sim_plan(&r, q->cluster, &res, &e2) != PX_OK)
        return 0;
    *out = res.top[0];
    sim_plan_free(&res);
    return 1;
}

/* TFLOP/s per GPU of the best ZeRO-3 / FSDP layout against the best 3D one at each size, the
 * global batch held (docs/time.md, "Sharded data parallelism"). */
static int sharded_scaling(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    const int n = q->n_gpus;
    double *x[2], *y[2];
    int k[2] = {0, 0}, rc = PX_OK;
    for (int f = 0; f < 2; f++) {
        x[f] = calloc((size_t)n, sizeof(double));
        y[f] = calloc((size_t)n, sizeof(double));
    }
    char text[8192];
    size_t tn = (size_t)snprintf(text, sizeof text,
                                 "| GPUs | ZeRO-3: layout | step (s) | exposed DP (s) | TFLOP/s/GPU | 3D: layout | step (s) | TFLOP/s/GPU |\n"
                                 "|---:|---|---:|---:|---:|---|---:|---:|\n");
    for (int i = 0; x[0] && y[0] && x[1] && y[1] && i < n; i++) {
        char cell[2][3][64];
        double dp_s = NAN;
        for (int f = 0; f < 2; f++) {
            SimCandidate c;
            for (int j = 0; j < 3; j++)
                snprintf(cell[f][j], sizeof cell[f][j], "-");
            if (!best_of(q, q->gpus[i], f == 0, &c))
                continue;
            x[f][k[f]] = q->gpus[i];
            y[f][k[f]] = c.tflops_per_gpu;
            k[f]++;
            const ModelLayout *l = &c.spec.layout;
            if (f == 0) {
                snprintf(cell[f][0], sizeof cell[f][0], "dp %d mbs %d %s", l->dp, c.spec.job.micro_batch,
                         model_recompute_name(l->recompute));
                dp_s = c.dp_comm_exposed_s;
            } else {
                snprintf(cell[f][0], sizeof cell[f][0], "tp %d pp %d dp %d mbs %d", l->tp, l->pp, l->dp,
                         c.spec.job.micro_batch);
            }
            rpt_fmt_sig(cell[f][1], sizeof cell[f][1], c.step_s, 3);
            rpt_fmt_sig(cell[f][2], sizeof cell[f][2], c.tflops_per_gpu, 3);
        }
        char dp[32] = "-";
        if (isfinite(dp_s))
            rpt_fmt_sig(dp, sizeof dp, dp_s, 3);
        if (tn < sizeof text - 400)
            tn += (size_t)snprintf(text + tn, sizeof text - tn, "| %d | %s | %s | %s | %s | %s | %s | %s |\n",
                                   q->gpus[i], cell[0][0], cell[0][1], dp, cell[0][2], cell[1][0], cell[1][1],
                                   cell[1][2]);
    }
    if (k[0] + k[1] > 0) {
        RptSeries s[2] = {{q->base->layout.fsdp ? "FSDP (tp 1, pp 1)" : "ZeRO-3 (tp 1, pp 1)", x[0], y[0], k[0], 0},
                          {"3D (tp x pp x dp, ZeRO-1)", x[1], y[1], k[1], 0}};
        RptOutput o = {q->dir};
        char title[256];
        snprintf(title, sizeof title, "%s on %s: sharded data parallelism against 3D, global batch %d",
                 q->base->model.name, q->cluster->name, q->base->job.global_batch);
        if ((rc = rpt_line_chart(&o, "scaling_sharded", title, "GPUs", "TFLOP/s per GPU", NULL, 1, s, 2, err)) ==
            PX_OK) {
            logf_(log, q->dir, "scaling_sharded.png, scaling_sharded.svg");
            section(pg, "Sharded data parallelism against 3D", "scaling_sharded",
                    fmt("The planner's best layout of each family at each size, the global batch of %d held: "
                        "ZeRO-3 gathers every layer's parameters from all data-parallel ranks while each "
                        "rank's share of the batch shrinks, so its exposed communication grows with the GPUs "
                        "(docs/time.md, \"Sharded data parallelism\").\n\n%s",
                        q->base->job.global_batch, text));
        }
    }
    for (int f = 0; f < 2; f++) {
        free(x[f]);
        free(y[f]);
    }
    return rc;
}

static int landscape(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    Points pt = {0};
    SimPlanRequest r;
    memset(&r, 0, sizeof r);
    r.base = *q->base;
    r.gpus = q->gpus[0];
    r.top = 1;
    r.headroom = 0.05;
    r.brute_force = 1;
    r.timed = collect;
    r.timed_ctx = &pt;
    SimPlanResult res;
    int rc = sim_plan(&r, q->cluster, &res, err);
    if (rc) {
        free(pt.x);
        free(pt.y);
        return rc;
    }
    int *front = calloc((size_t)(pt.n > 0 ? pt.n : 1), sizeof *front);
    if (!front) {
        sim_plan_free(&res);
        free(pt.x);
        free(pt.y);
        return px_fail(err, PX_ERUNTIME, "out of memory");
    }
    rpt_pareto(pt.x, pt.y, pt.n, front);
    int nf = 0;
    for (int i = 0; i < pt.n; i++)
        nf += front[i];
    RptOutput o = {q->dir};
    char title[256];
    snprintf(title, sizeof title, "%s on %d x %s: every feasible layout", q->base->model.name, q->gpus[0],
             q->cluster->device.name);
    rc = rpt_scatter_pareto(&o, "landscape", title, "peak memory per GPU (GiB)", "step time (s)", pt.x,
                            pt.y, front, pt.n, err);
    if (!rc) {
        logf_(log, q->dir, "landscape.png, landscape.svg");
        section(pg, "The planner's landscape", "landscape",
                fmt("%d feasible layouts of %ld considered; %d lie on the Pareto front (no other layout is "
                    "both faster and smaller). The fastest takes %.3f s per step.",
                    pt.n, res.considered, nf, res.top[0].step_s));
    }
    free(front);
    free(pt.x);
    free(pt.y);
    sim_plan_free(&res);
    return rc;
}

int rpt_build(const RptRequest *q, FILE *log, PxError *err)
{
    Page pg;
    memset(&pg, 0, sizeof pg);
    int rc = PX_OK;
    if (log)
        fprintf(log, "writing %s:\n", q->dir);
    for (int i = 0; i < q->n_extra && pg.n < MAX_SECTIONS; i++) {
        pg.sec[pg.n] = q->extra[i];
        pg.texts[pg.n] = NULL; /* the caller's */
        pg.n++;
    }
    /* the traces are written before any chart would create the directory */
    if ((q->plan || q->run) && (rc = rpt_dir_make(q->dir, err)))
        goto out;
    if (q->plan && (rc = memory_chart(q, &pg, log, err)))
        goto out;
    if ((q->plan || q->run) && (rc = timelines(q, &pg, log, err)))
        goto out;
    if (q->plan && q->run && (rc = comparison(q, &pg, log, err)))
        goto out;
    if (q->base && q->cluster && q->n_gpus > 0) {
        if ((rc = scaling(q, &pg, log, err)) || (rc = sharded_scaling(q, &pg, log, err)))
            goto out;
        if (q->landscape && (rc = landscape(q, &pg, log, err)))
            goto out;
    }
    if (pg.n == 0) {
        rc = px_fail(err, PX_EINPUT, "nothing to report: give a plan, a run, or a model with --gpus");
        goto out;
    }
    RptOutput o = {q->dir};
    if ((rc = rpt_page_write(&o, q->title ? q->title : "parallax report", pg.sec, pg.n, err)))
        goto out;
    logf_(log, q->dir, "report.md, report.html");
out:
    for (int i = 0; i < pg.n; i++)
        free(pg.texts[i]);
    return rc;
}
