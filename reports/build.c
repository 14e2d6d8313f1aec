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
    RptHeader hdr; /* the plan's, else the best layout at the scaling's first size */
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

static void phase(const RptRequest *q, const char *f, ...) __attribute__((format(printf, 2, 3)));

/* A line of progress per phase, to q->progress: a report with a landscape takes seconds, and a
 * silent terminal (or log) reads as a hang. */
static void phase(const RptRequest *q, const char *f, ...)
{
    if (!q->progress)
        return;
    va_list ap;
    va_start(ap, f);
    fputs("report: ", q->progress);
    vfprintf(q->progress, f, ap);
    fputc('\n', q->progress);
    fflush(q->progress);
    va_end(ap);
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
    size_t tn = (size_t)snprintf(text, sizeof text, "| stage | total (GiB per GPU) | largest category |\n|---:|---:|---|\n");
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

/* A timeline of many passes (a 70B plan: 8 stages x 5 chunks x 2 passes x 32 micro-batches)
 * is a barcode at full length. The chart shows a window from the step's start: the warm-up
 * and the first TIMELINE_STEADY passes of the steady phase, counted on the row whose first
 * backward comes first (the last stage's), where forwards and backwards alternate; the whole
 * step stays in the trace. Without backwards, the first TIMELINE_STEADY passes of the row
 * that starts first. */
enum { TIMELINE_STEADY = 8 };

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The window's end: see TIMELINE_STEADY. */
static double window_end(const RptSpan *s, int n, double t_full)
{
    int track = -1;
    double from = 0;
    for (int i = 0; i < n; i++)
        if (s[i].kind == 1 && (track < 0 || s[i].start_s < from))
            track = s[i].track, from = s[i].start_s;
    if (track < 0) {
        for (int i = 0; i < n; i++)
            if (track < 0 || s[i].start_s < from)
                track = s[i].track, from = s[i].start_s;
    }
    double *ends = malloc((size_t)(n > 0 ? n : 1) * sizeof *ends);
    if (!ends || track < 0) {
        free(ends);
        return t_full;
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        if (s[i].track == track && s[i].start_s >= from)
            ends[k++] = s[i].end_s;
    qsort(ends, (size_t)k, sizeof *ends, cmp_double);
    const double t_end = k > TIMELINE_STEADY ? ends[TIMELINE_STEADY - 1] : t_full;
    free(ends);
    return t_end;
}

/* Keeps the spans that start before the window's end, clipped to it, and returns their count;
 * *t_end the window's end, *t_full the step's, *mb_hi the last micro-batch started inside. */
static int window_spans(RptSpan *s, int n, double *t_end, double *t_full, int *mb_hi, const int *mb)
{
    *t_full = 0;
    for (int i = 0; i < n; i++)
        *t_full = s[i].end_s > *t_full ? s[i].end_s : *t_full;
    *t_end = window_end(s, n, *t_full);
    int kept = 0;
    *mb_hi = 0;
    for (int i = 0; i < n; i++) {
        if (s[i].start_s >= *t_end)
            continue;
        if (mb[i] > *mb_hi)
            *mb_hi = mb[i];
        s[kept] = s[i];
        if (s[kept].end_s > *t_end)
            s[kept].end_s = *t_end;
        kept++;
    }
    return kept;
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

/* A timeline's spans and what its title says. */
typedef struct {
    RptSpan *spans;
    int *mb; /* [n] each span's micro-batch */
    int n, tracks, micro_batches, vpp;
    double bubble; /* the simulated one; NAN for a measured timeline */
    char title[200];
} Timeline;

static void timeline_free(Timeline *t)
{
    free(t->spans);
    free(t->mb);
}

static void span_tag(RptSpan *s, int mb, int chunk, int vpp)
{
    if (vpp > 1)
        snprintf(s->tag, sizeof s->tag, "%d.%d", mb % 1000, chunk % 100);
    else
        snprintf(s->tag, sizeof s->tag, "%d", mb % 100000);
}

/* The plan's schedule, re-simulated on the plan's own profile (on which its prediction was made). */
static void simulated_timeline(const RptRequest *q, Timeline *t)
{
    ModelPlan plan;
    PxError e2 = {0};
    if (model_plan_from_json(q->plan, "plan", &plan, &e2) != PX_OK) {
        px_warn("report: no simulated timeline: %s", e2.msg);
        return;
    }
    SimResult r;
    if (sim_run(&plan.spec, &plan.profile, plan.gpus, &r, &e2) == PX_OK) {
        SimEvent *ev;
        int n;
        if (sim_timeline(&r, &ev, &n, &e2) == PX_OK) {
            t->spans = calloc((size_t)(n > 0 ? n : 1), sizeof *t->spans);
            t->mb = calloc((size_t)(n > 0 ? n : 1), sizeof *t->mb);
            const int vpp = r.spec.layout.vpp > 1 ? r.spec.layout.vpp : 1;
            for (int i = 0; t->spans && t->mb && i < n; i++) {
                RptSpan *s = &t->spans[i];
                s->track = ev[i].stage;
                s->kind = ev[i].backward;
                s->start_s = ev[i].start_s;
                s->end_s = ev[i].end_s;
                snprintf(s->label, sizeof s->label, "%c c%d mb%d", ev[i].backward ? 'B' : 'F', ev[i].chunk,
                         ev[i].mb);
                span_tag(s, ev[i].mb, ev[i].chunk, vpp);
                t->mb[i] = ev[i].mb;
            }
            t->n = t->spans && t->mb ? n : 0;
            t->tracks = r.dims.p;
            t->micro_batches = r.dims.m;
            t->vpp = vpp;
            t->bubble = r.bubble_fraction;
            free(ev);
            snprintf(t->title, sizeof t->title, "simulated: pp %d, %d micro-batches, %s", r.dims.p, r.dims.m,
                     model_schedule_name(r.spec.layout.schedule));
            if (vpp > 1) {
                char v[40];
                snprintf(v, sizeof v, " (vpp %d)", vpp);
                px_strlcpy(t->title + strlen(t->title), v, sizeof t->title - strlen(t->title));
            }
        }
        sim_result_free(&r);
    }
    model_plan_free(&plan);
}

/* run.json's timeline (absent: n 0). */
static void measured_timeline(const RptRequest *q, Timeline *t)
{
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(q->run, "timeline");
    int total = 0;
    const cJSON *rk, *ev;
    cJSON_ArrayForEach(rk, tl) total += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(rk, "events"));
    if (total == 0)
        return;
    t->spans = calloc((size_t)total, sizeof *t->spans);
    t->mb = calloc((size_t)total, sizeof *t->mb);
    if (!t->spans || !t->mb)
        return;
    t->vpp = 1;
    cJSON_ArrayForEach(rk, tl)
    cJSON_ArrayForEach(ev, cJSON_GetObjectItemCaseSensitive(rk, "events"))
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(ev, "chunk");
        if (cJSON_IsNumber(c) && c->valueint + 1 > t->vpp)
            t->vpp = c->valueint + 1;
    }
    cJSON_ArrayForEach(rk, tl)
    {
        const cJSON *rr = cJSON_GetObjectItemCaseSensitive(rk, "rank");
        int rank = cJSON_IsNumber(rr) ? rr->valueint : 0;
        if (rank + 1 > t->tracks)
            t->tracks = rank + 1;
        cJSON_ArrayForEach(ev, cJSON_GetObjectItemCaseSensitive(rk, "events"))
        {
            if (t->n >= total)
                break;
            RptSpan *s = &t->spans[t->n];
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(ev, "backward");
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(ev, "chunk");
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(ev, "mb");
            const cJSON *s0 = cJSON_GetObjectItemCaseSensitive(ev, "start_s");
            const cJSON *s1 = cJSON_GetObjectItemCaseSensitive(ev, "end_s");
            const int chunk = cJSON_IsNumber(c) ? c->valueint : 0, mb = cJSON_IsNumber(m) ? m->valueint : 0;
            s->track = rank;
            s->kind = cJSON_IsTrue(b) || (cJSON_IsNumber(b) && b->valueint) ? 1 : 0;
            s->start_s = cJSON_IsNumber(s0) ? s0->valuedouble : 0;
            s->end_s = cJSON_IsNumber(s1) ? s1->valuedouble : 0;
            snprintf(s->label, sizeof s->label, "%c c%d mb%d", s->kind ? 'B' : 'F', chunk, mb);
            span_tag(s, mb, chunk, t->vpp);
            t->mb[t->n++] = mb;
            if (mb + 1 > t->micro_batches)
                t->micro_batches = mb + 1;
        }
    }
    t->bubble = NAN;
    snprintf(t->title, sizeof t->title, "measured: %d ranks, %d micro-batches", t->tracks, t->micro_batches);
}

/* Narrows t to its window and says which part of the step the title shows. */
static void timeline_window(Timeline *t)
{
    double t_end, t_full;
    int mb_hi;
    t->n = window_spans(t->spans, t->n, &t_end, &t_full, &mb_hi, t->mb);
    const size_t len = strlen(t->title);
    if (t_end < t_full)
        snprintf(t->title + len, sizeof t->title - len, "; the first %.3g s of the %.3g s step (micro-batches 0-%d)",
                 t_end, t_full, mb_hi);
    else
        snprintf(t->title + len, sizeof t->title - len, "; the whole step, %.3g s", t_full);
}

/* The simulated schedule (re-simulated from the plan) and the measured one (run.json's
 * timeline, when it has one): a trace each with every pass, and a chart of a window of each. */
static int timelines(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    Timeline sim = {0}, meas = {0};
    sim.bubble = meas.bubble = NAN;
    int rc = PX_OK, panels = 0;
    if (q->plan)
        simulated_timeline(q, &sim);
    if (q->run)
        measured_timeline(q, &meas);
    char path[1200];
    if (sim.n > 0) {
        snprintf(path, sizeof path, "%s/trace_simulated.json", q->dir);
        name_tracks("stage", sim.tracks);
        if ((rc = rpt_trace_write(path, "parallax simulated schedule", sim.spans, sim.n, stage_names, sim.tracks, err)))
            goto out;
        logf_(log, q->dir, "trace_simulated.json");
    }
    if (meas.n > 0) {
        snprintf(path, sizeof path, "%s/trace_measured.json", q->dir);
        name_tracks("rank", meas.tracks);
        if ((rc = rpt_trace_write(path, "parallax measured run", meas.spans, meas.n, stage_names, meas.tracks, err)))
            goto out;
        logf_(log, q->dir, "trace_measured.json");
    }
    const RptSpan *spans[2];
    int counts[2];
    const char *titles[2];
    Timeline *tl[2] = {&sim, &meas};
    for (int k = 0; k < 2; k++) {
        if (tl[k]->n == 0)
            continue;
        timeline_window(tl[k]);
        spans[panels] = tl[k]->spans;
        counts[panels] = tl[k]->n;
        titles[panels++] = tl[k]->title;
    }
    if (panels > 0) {
        RptOutput o = {q->dir};
        if ((rc = rpt_timeline_chart(&o, "timeline", "pipeline timeline (blue forward, orange backward)", spans,
                                     counts, titles, panels, err)))
            goto out;
        logf_(log, q->dir, "timeline.png, timeline.svg");
        char bubble[400] = "";
        if (isfinite(sim.bubble))
            snprintf(bubble, sizeof bubble,
                     " The simulated bubble is %.1f%%: the busiest stage's idle time inside the pipeline over "
                     "its compute time, which exceeds 100%% when a stage waits longer than it works; as a "
                     "share of that stage's pipeline time, %.1f%% is idle.",
                     100 * sim.bubble, 100 * sim.bubble / (1 + sim.bubble));
        section(pg, "Pipeline timeline", "timeline",
                fmt("One row per pipeline stage (simulated) or rank (measured). Each bar is one forward "
                    "(blue) or backward (orange) pass of a model chunk for one micro-batch; the number on "
                    "it is the micro-batch%s. The chart shows a window from the start of the step: the "
                    "warm-up and the first %d passes of the steady phase, where forwards and backwards "
                    "alternate, so that each bar stays readable at any pp x vpp; every pass of the step is "
                    "in trace_simulated.json%s (ui.perfetto.dev or chrome://tracing).%s",
                    sim.vpp > 1 || meas.vpp > 1 ? " and, where the bar has room, after the dot, the model chunk" : "", TIMELINE_STEADY,
                    meas.n ? " and trace_measured.json" : "", bubble));
    }
out:
    timeline_free(&sim);
    timeline_free(&meas);
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
    const RptRequest *q;
    double t0, said; /* when the landscape began, and last said how far it was */
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
    const double now = px_now_s();
    if (now - pt->said >= 2.0) {
        phase(pt->q, "landscape: %d layouts timed in %.0f s", pt->n, now - pt->t0);
        pt->said = now;
    }
}

/* What the tables' two FLOP rates count, said under each table that prints them. */
#define FLOPS_CONVENTION                                                                                \
    "Hardware TFLOP/s per GPU counts every FLOP the GPU executes, recompute included (Narayanan et "  \
    "al. 2021's convention), so a layout that recomputes shows more of them for the same work; MFU "  \
    "counts the model's FLOPs only (forward and backward, no recompute) over the dense 16-bit peak, " \
    "and ranks layouts as their step times do."

/* The header of a report without a plan: the planner's best layout at the first size. */
static void header_from_candidate(RptHeader *h, const RptRequest *q, const SimCandidate *c, int gpus)
{
    px_strlcpy(h->model, q->base->model.name, sizeof h->model);
    px_strlcpy(h->cluster, q->cluster->name, sizeof h->cluster);
    px_strlcpy(h->device, q->cluster->device.name, sizeof h->device);
    h->gpus = gpus;
    h->node_devices = q->cluster->node_devices;
    h->spec = c->spec;
    h->have_layout = 1;
    h->step_s = c->step_s;
    h->tokens_per_s = c->tokens_per_s;
    h->mfu = c->mfu;
    h->tflops_per_gpu = c->tflops_per_gpu;
    h->bubble_fraction = c->bubble_fraction;
    h->train_tokens = q->base->job.train_tokens;
    snprintf(h->basis, sizeof h->basis, "the planner's best layout at %d GPUs (the scaling's first size)", gpus);
    snprintf(h->title, sizeof h->title, "%s on %s, %d GPU%s", h->model, h->cluster, gpus, gpus == 1 ? "" : "s");
}

static int scaling(const RptRequest *q, Page *pg, FILE *log, PxError *err)
{
    const int n = q->n_gpus;
    double *xs = calloc((size_t)n, sizeof *xs), *ts = calloc((size_t)n, sizeof *ts), *ms = calloc((size_t)n, sizeof *ms);
    double *xw = calloc((size_t)n, sizeof *xw), *tw = calloc((size_t)n, sizeof *tw), *mw = calloc((size_t)n, sizeof *mw);
    int ns = 0, nw = 0, rc = PX_OK;
    char text[8192];
    size_t tn = (size_t)snprintf(text, sizeof text,
                                 "| GPUs | strong: best layout | hardware TFLOP/s per GPU | MFU | weak: global batch (sequences) | "
                                 "hardware TFLOP/s per GPU | MFU |\n"
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
            if (!weak && i == 0 && !pg->hdr.have_layout)
                header_from_candidate(&pg->hdr, q, c, q->gpus[i]);
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
        if ((rc = rpt_line_chart(&o, "scaling", title, "GPUs", "hardware TFLOP/s per GPU (recompute counted)",
                                 "MFU (%, model FLOPs)", 1, s, 4, err)) == PX_OK) {
            logf_(log, q->dir, "scaling.png, scaling.svg");
            section(pg, "Scaling", "scaling",
                    fmt("Strong scaling keeps the global batch of %d; weak scaling grows it with the GPUs. "
                        "Each point is the planner's best layout at that size. %s\n\n%s",
                        q->base->job.global_batch, FLOPS_CONVENTION, text));
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
                                 "| GPUs | ZeRO-3: layout | step (s) | exposed data-parallel comm. (s per step) | "
                                 "hardware TFLOP/s per GPU | MFU | 3D: layout | step (s) | hardware TFLOP/s per GPU | MFU |\n"
                                 "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|\n");
    for (int i = 0; x[0] && y[0] && x[1] && y[1] && i < n; i++) {
        char cell[2][4][64];
        double dp_s = NAN;
        for (int f = 0; f < 2; f++) {
            SimCandidate c;
            for (int j = 0; j < 4; j++)
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
            snprintf(cell[f][3], sizeof cell[f][3], "%.1f%%", 100 * c.mfu);
        }
        char dp[32] = "-";
        if (isfinite(dp_s))
            rpt_fmt_sig(dp, sizeof dp, dp_s, 3);
        if (tn < sizeof text - 400)
            tn += (size_t)snprintf(text + tn, sizeof text - tn, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                                   q->gpus[i], cell[0][0], cell[0][1], dp, cell[0][2], cell[0][3], cell[1][0],
                                   cell[1][1], cell[1][2], cell[1][3]);
    }
    if (k[0] + k[1] > 0) {
        RptSeries s[2] = {{q->base->layout.fsdp ? "FSDP (tp 1, pp 1)" : "ZeRO-3 (tp 1, pp 1)", x[0], y[0], k[0], 0},
                          {"3D (tp x pp x dp, ZeRO-1)", x[1], y[1], k[1], 0}};
        RptOutput o = {q->dir};
        char title[256];
        snprintf(title, sizeof title, "%s on %s: sharded data parallelism against 3D, global batch %d",
                 q->base->model.name, q->cluster->name, q->base->job.global_batch);
        if ((rc = rpt_line_chart(&o, "scaling_sharded", title, "GPUs", "hardware TFLOP/s per GPU (recompute counted)",
                                 NULL, 1, s, 2, err)) ==
            PX_OK) {
            logf_(log, q->dir, "scaling_sharded.png, scaling_sharded.svg");
            section(pg, "Sharded data parallelism against 3D", "scaling_sharded",
                    fmt("The planner's best layout of each family at each size, the global batch of %d held: "
                        "ZeRO-3 gathers every layer's parameters from all data-parallel ranks while each "
                        "rank's share of the batch shrinks, so its exposed communication grows with the GPUs "
                        "(docs/time.md, \"Sharded data parallelism\"). %s A ZeRO-3 layout that needs "
                        "recompute to fit can thus show more TFLOP/s per GPU than the 3D one and still take "
                        "the longer step: compare the steps or the MFU.\n\n%s",
                        q->base->job.global_batch, FLOPS_CONVENTION, text));
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
    pt.q = q;
    pt.t0 = pt.said = px_now_s();
    phase(q, "landscape: simulating every feasible layout at %d GPUs in full (this takes the longest)", q->gpus[0]);
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
    phase(q, "landscape: %d feasible layouts timed of %ld considered, in %.1f s", pt.n, res.considered,
          px_now_s() - pt.t0);
    if (!rc) {
        logf_(log, q->dir, "landscape.png, landscape.svg");
        section(pg, "The planner's landscape", "landscape",
                fmt("%d feasible layouts of %ld considered; %d lie on the Pareto front (no other layout is "
                    "both faster and smaller). The fastest takes %.3f s per step. Step time is in seconds "
                    "per optimizer step, peak memory in GiB per GPU; the step axis is logarithmic when the "
                    "layouts' steps span more than a decade, so that the fast ones are not flattened.",
                    pt.n, res.considered, nf, res.top[0].step_s));
    }
    free(front);
    free(pt.x);
    free(pt.y);
    sim_plan_free(&res);
    return rc;
}

/* One probe of the host check: now against when calibrated, in `unit` (scale: bytes to it). */
static void host_row(FILE *f, const char *what, const cJSON *h, const char *now_key, const char *ref_key,
                     double scale)
{
    const cJSON *now = cJSON_GetObjectItemCaseSensitive(h, now_key), *ref = cJSON_GetObjectItemCaseSensitive(h, ref_key);
    if (!cJSON_IsNumber(now) || !cJSON_IsNumber(ref))
        return;
    char a[32], b[32];
    fprintf(f, "| %s | %s | %s | ", what, rpt_fmt_sig(a, sizeof a, now->valuedouble / scale, 3),
            rpt_fmt_sig(b, sizeof b, ref->valuedouble / scale, 3));
    if (ref->valuedouble > 0)
        fprintf(f, "%+.1f%% |\n", 100 * (now->valuedouble - ref->valuedouble) / ref->valuedouble);
    else
        fputs("n/a |\n", f);
}

/* The validation's host check (host_check: this host's GEMM rate and memory bandwidth against
 * the calibration's) and quiet check (load and other processes' CPU time during the timed runs):
 * whether the measured column can be read as parallax's error at all. Either may be absent. */
static char *host_text(const cJSON *v)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(v, "host_check");
    if (cJSON_IsObject(h) && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(h, "probed"))) {
        fputs("| probe | now | when calibrated | change |\n|---|---:|---:|---:|\n", f);
        host_row(f, "GEMM (GFLOP/s)", h, "peak_flops", "peak_flops_calibrated", 1e9);
        host_row(f, "memory bandwidth (GB/s)", h, "memory_bandwidth", "memory_bandwidth_calibrated", 1e9);
        const cJSON *ha = cJSON_GetObjectItemCaseSensitive(v, "host_check_after");
        if (cJSON_IsObject(ha)) {
            host_row(f, "GEMM after the timed runs (GFLOP/s)", ha, "peak_flops", "peak_flops_calibrated", 1e9);
            host_row(f, "memory bandwidth after the timed runs (GB/s)", ha, "memory_bandwidth",
                     "memory_bandwidth_calibrated", 1e9);
        }
        int busy = 0;
        for (int k = 0; k < 2; k++) { /* a probe on a busy machine judges nothing */
            const cJSON *p = k ? ha : h;
            const cJSON *why = cJSON_GetObjectItemCaseSensitive(p, "busy_why");
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "busy")) && cJSON_IsString(why) &&
                ++busy)
                fprintf(f, "\nThe probe %s was not judged: during it %s, so its change says how "
                           "busy the machine was, not how fast the host is.\n",
                        k ? "after the timed runs" : "before the timed runs", why->valuestring);
        }
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ha, "drifted")))
            fputs("\n**Not graded: the host drifted during the timed runs** from its calibrated rates, so the "
                  "errors below include the drift (calibrate again and run again).\n",
                  f);
        else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(h, "recalibrated")))
            fputs("\nThe host had drifted from its calibration; it was calibrated again before the runs.\n", f);
        else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(h, "drifted")))
            fputs("\n**Not graded: the host had drifted from its calibration**: the predictions use the "
                  "calibrated rates, so the errors below include the drift (`parallax validate --recalibrate` "
                  "calibrates again first).\n",
                  f);
        else if (busy && busy == 1 + cJSON_IsObject(ha))
            fputs("\nSo nothing says whether this host still runs at its calibrated rates.\n", f);
        else if (busy)
            fputs("\nThe other probe found the host as it was calibrated.\n", f);
        else
            fprintf(f, "\nThe host ran as when it was calibrated, before the timed runs%s: the predictions' "
                       "rates hold here.\n",
                    cJSON_IsObject(ha) ? " and after them" : "");
    } else {
        fputs("No host check was made (`--no-host-check`, or the profile is not calibrated): nothing says "
              "whether this host still runs at its calibrated rates.\n",
              f);
    }
    const cJSON *qt = cJSON_GetObjectItemCaseSensitive(v, "machine");
    if (cJSON_IsObject(qt)) {
        const cJSON *quiet = cJSON_GetObjectItemCaseSensitive(qt, "quiet");
        const cJSON *verdict = cJSON_GetObjectItemCaseSensitive(qt, "verdict");
        const char *keys[3] = {"load", "other_cpu_s", "steal_s"};
        const char *names[3] = {"load (1-minute average)", "other processes' CPU time during the timed runs (s)",
                                "steal time (s)"};
        fputs("\n| quiet check | value |\n|---|---:|\n", f);
        for (int k = 0; k < 3; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(qt, keys[k]);
            char b[32];
            fprintf(f, "| %s | %s |\n", names[k],
                    cJSON_IsNumber(x) ? rpt_fmt_sig(b, sizeof b, x->valuedouble, 3) : "not reported");
        }
        if (cJSON_IsFalse(quiet))
            fprintf(f, "\n**Not graded: the machine was not quiet.** %s The measured times include the other "
                       "load, so the rows' errors are not parallax's.\n",
                    cJSON_IsString(verdict) ? verdict->valuestring : "");
        else if (cJSON_IsString(verdict))
            fprintf(f, "\n%s\n", verdict->valuestring);
    } else {
        fputs("\nNo quiet check was recorded: nothing says whether other processes shared the machine "
              "during the timed runs.\n",
              f);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* The host check section, from q->validation or <dir>/validation.json; none without either. */
static void host_section(const RptRequest *q, Page *pg)
{
    cJSON *owned = NULL;
    const cJSON *v = q->validation;
    if (!v) {
        char path[1200];
        snprintf(path, sizeof path, "%s/validation.json", q->dir);
        FILE *f = fopen(path, "r");
        if (!f)
            return;
        fclose(f);
        PxError e = {0};
        if (!(owned = px_json_read_file(path, &e))) {
            px_warn("report: %s", e.msg);
            return;
        }
        v = owned;
    }
    section(pg, "Host check", NULL, host_text(v));
    cJSON_Delete(owned);
}

/* The header first, then the page's sections. */
static void put_header(const RptRequest *q, Page *pg)
{
    if (q->train_tokens > 0)
        pg->hdr.train_tokens = q->train_tokens;
    if (q->layout_note)
        px_strlcpy(pg->hdr.note, q->layout_note, sizeof pg->hdr.note);
    char *text = rpt_header_markdown(&pg->hdr, q->gpu_hour_price, NULL, NULL);
    if (!text)
        return;
    if (pg->n == MAX_SECTIONS) {
        free(pg->texts[--pg->n]);
    }
    memmove(&pg->sec[1], &pg->sec[0], (size_t)pg->n * sizeof pg->sec[0]);
    memmove(&pg->texts[1], &pg->texts[0], (size_t)pg->n * sizeof pg->texts[0]);
    pg->sec[0] = (RptSection){NULL, NULL, text};
    pg->texts[0] = text;
    pg->n++;
}

int rpt_build(const RptRequest *q, FILE *log, PxError *err)
{
    Page pg;
    memset(&pg, 0, sizeof pg);
    rpt_header_init(&pg.hdr);
    int rc = PX_OK;
    if (log)
        fprintf(log, "writing %s:\n", q->dir);
    /* whether the validation's errors can be read as parallax's comes before them */
    host_section(q, &pg);
    for (int i = 0; i < q->n_extra && pg.n < MAX_SECTIONS; i++) {
        pg.sec[pg.n] = q->extra[i];
        pg.texts[pg.n] = NULL; /* the caller's */
        pg.n++;
    }
    if (q->plan) {
        PxError e2 = {0};
        if (rpt_header_from_plan(&pg.hdr, q->plan, q->run, &e2) != PX_OK)
            px_warn("report: the header names no layout: %s", e2.msg);
    }
    /* the traces are written before any chart would create the directory */
    if ((q->plan || q->run || q->n_extra || q->validation) && (rc = rpt_dir_make(q->dir, err)))
        goto out;
    if (q->plan) {
        phase(q, "memory per pipeline stage (the plan's prediction)");
        if ((rc = memory_chart(q, &pg, log, err)))
            goto out;
    }
    if (q->plan || q->run) {
        phase(q, "pipeline timeline (%s)", q->plan ? "re-simulating the plan" : "the run's");
        if ((rc = timelines(q, &pg, log, err)))
            goto out;
    }
    if (q->plan && q->run) {
        phase(q, "predicted against measured");
        if ((rc = comparison(q, &pg, log, err)))
            goto out;
    }
    if (q->base && q->cluster && q->n_gpus > 0) {
        phase(q, "scaling: the planner's best layout at %d size%s, strong and weak", q->n_gpus, q->n_gpus > 1 ? "s" : "");
        if ((rc = scaling(q, &pg, log, err)))
            goto out;
        phase(q, "sharded data parallelism against 3D at %d size%s", q->n_gpus, q->n_gpus > 1 ? "s" : "");
        if ((rc = sharded_scaling(q, &pg, log, err)))
            goto out;
        if (q->landscape && (rc = landscape(q, &pg, log, err)))
            goto out;
    }
    if (pg.n == 0) {
        rc = px_fail(err, PX_EINPUT, "nothing to report: give a plan, a run, or a model with --gpus");
        goto out;
    }
    put_header(q, &pg);
    phase(q, "pages: report.md and report.html (charts inline)");
    char title[320];
    const char *t = q->title ? q->title : "parallax report";
    if (pg.hdr.title[0])
        snprintf(title, sizeof title, "%s: %s", t, pg.hdr.title);
    else
        px_strlcpy(title, t, sizeof title);
    RptOutput o = {q->dir};
    if ((rc = rpt_page_write(&o, title, pg.sec, pg.n, err)))
        goto out;
    logf_(log, q->dir, "report.md, report.html");
out:
    for (int i = 0; i < pg.n; i++)
        free(pg.texts[i]);
    return rc;
}
