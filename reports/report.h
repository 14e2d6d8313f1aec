/* rpt — reports: charts drawn with gnuplot (PNG and SVG), Markdown and HTML pages that embed
 * them, Perfetto / Chrome traces, and the comparison of a plan's prediction with a run's
 * measurements. It reads the JSON that sim/ and exec/ write (a plan's `prediction`, run.json),
 * so a report can be drawn long after the run, on another machine.
 *
 * Example:
 *   RptOutput out = {.dir = "report"};
 *   RptSeries s = {.title = "tokens/s per GPU", ...};
 *   if (rpt_line_chart(&out, "scaling", "GPU count", "TFLOP/s per GPU", &s, 1, &err)) ...
 *   // report/scaling.png, report/scaling.svg; rpt_page_write adds them to report.md/html
 */
#ifndef RPT_H
#define RPT_H

#include <stdio.h>

#include "common/px.h"
#include "sim/sim.h"

typedef struct {
    const char *dir; /* created when missing */
} RptOutput;

/* Creates dir and its parents when missing; PX_ERUNTIME naming the one that cannot be made. */
int rpt_dir_make(const char *dir, PxError *err);

/* ---- charts: every chart writes <dir>/<name>.dat, .gp, .png and .svg; PX_ERUNTIME when
 * gnuplot is missing or fails (its exit status in the message) ---- */

typedef struct {
    const char *title;
    const double *x, *y;
    int n;
    int axis2; /* on the right-hand axis */
} RptSeries;

/* Lines with points; log2 x axis when logx. y2label names the right axis (NULL: none). */
int rpt_line_chart(const RptOutput *o, const char *name, const char *title, const char *xlabel,
                   const char *ylabel, const char *y2label, int logx, const RptSeries *s, int n,
                   PxError *err);

/* Stacked bars: rows are bars (labels), columns are the stacked parts (names). values is
 * row-major [rows][cols]. */
int rpt_stacked_bars(const RptOutput *o, const char *name, const char *title, const char *ylabel,
                     const char *const *labels, int rows, const char *const *names, int cols,
                     const double *values, PxError *err);

/* A span of a timeline: one track per rank or stage. kind 0 forward, 1 backward, 2 other. */
typedef struct {
    int track;
    int kind;
    double start_s, end_s;
    char label[32];
    char tag[12]; /* drawn on the bar when it fits: the micro-batch, "3" or "3.1" (chunk 1) */
} RptSpan;

/* Gantt chart of spans, one row per track: panels one above the other when there are several
 * timelines (simulated and measured), each with its own title; the image grows with the
 * tracks, and each bar wide enough carries its tag. The caller picks the window of time. */
int rpt_timeline_chart(const RptOutput *o, const char *name, const char *title,
                       const RptSpan *const *spans, const int *counts, const char *const *titles,
                       int panels, PxError *err);

/* Scatter of (x, y) points; those flagged in front[] joined as the Pareto front. The y axis is
 * logarithmic when the values span more than a decade (the label says so). */
int rpt_scatter_pareto(const RptOutput *o, const char *name, const char *title, const char *xlabel,
                       const char *ylabel, const double *x, const double *y, const int *front,
                       int n, PxError *err);

/* Marks the points no other point beats on both (lower x and lower y): front[i] = 1. */
void rpt_pareto(const double *x, const double *y, int n, int *front);

/* Bars of predicted against measured with the relative error above each pair. */
int rpt_compare_bars(const RptOutput *o, const char *name, const char *title, const char *ylabel,
                     const char *const *labels, const double *predicted, const double *measured,
                     int n, PxError *err);

/* ---- traces ---- */

/* Perfetto / Chrome trace JSON: one track (thread) per span track, named track_names[track]. */
int rpt_trace_write(const char *path, const char *process, const RptSpan *spans, int n,
                    const char *const *track_names, int tracks, PxError *err);

/* ---- pages ---- */

typedef struct {
    const char *heading;
    const char *chart;   /* chart name (its .png and .svg are embedded), or NULL */
    const char *text;    /* Markdown paragraph under it, or NULL */
} RptSection;

/* Writes <dir>/report.md and <dir>/report.html: the page is written once in Markdown (GitHub's
 * dialect: its tables, fenced code) and report.html is that Markdown rendered by cmark-gfm, the
 * charts embedded as SVG there and as PNG in report.md. */
int rpt_page_write(const RptOutput *o, const char *title, const RptSection *sections, int n,
                   PxError *err);

/* Formats v with `digits` significant digits (1 to 17) into buf and returns buf: fixed notation
 * while the rounded value lies in [1e-3, 1e6), its integer digits all kept ("0.0128", "53.9",
 * "1235"); an exponent outside it ("1.23e-05"); "0" for zero, "n/a" when not finite. */
const char *rpt_fmt_sig(char *buf, size_t cap, double v, int digits);

/* ---- prediction against measurement ---- */

typedef struct {
    char quantity[96]; /* "step_s", "op layer.0.attn.qkv.fwd", "memory rank 0 weights" ... */
    double predicted, measured;
    double rel_error; /* (measured - predicted) / predicted; 0 when both are 0 */
} RptDelta;

/* A MoE layer's routing in the run's last step (run.json's moe.layers[]): the token copies each
 * expert received over the whole job, their spread, and the busiest expert over the mean (1:
 * perfect balance). */
typedef struct {
    int layer, experts;
    double *tokens; /* [experts] */
    double min, max, mean, max_over_mean;
    /* dropless routing: the busiest rank's rows over the balanced share (NAN when the run
     * does not say), and the bytes its buffers grew past the plan over every rank */
    double imbalance, extra_bytes;
} RptMoeLayer;

/* A rank's expert all-to-all bytes per step: the plan's buffers against what its routing sent
 * (equal under forced balance; below them with real routing). */
typedef struct {
    int rank;
    double predicted, measured;
} RptA2a;

typedef struct {
    RptDelta *rows;
    int count, cap;
    int steps; /* steps measured */
    RptMoeLayer *moe; /* a MoE run's layers, else NULL */
    int n_moe;
    RptA2a *a2a;      /* every rank with expert all-to-all traffic, in rank order */
    int n_a2a;
    double moe_planned_imbalance; /* run.json's moe.planned_imbalance (NAN: absent) */
} RptCompare;

/* Compares a plan (its prediction) with a run (run.json): step time, bubble, per-op time per
 * step, memory per category per rank, communication bytes per kind per rank, FLOPs per rank;
 * for a MoE run also each MoE layer's tokens per expert and each rank's expert all-to-all.
 * PX_EINPUT names the file and key when either lacks what is compared. */
int rpt_compare(const cJSON *plan, const cJSON *run, RptCompare *out, PxError *err);
void rpt_compare_free(RptCompare *c);
void rpt_compare_print(FILE *f, const RptCompare *c, int all_ops);
/* The same rows as rpt_compare_print, as a Markdown table (header and delimiter row, one row per
 * quantity shown), the ops left out said under it and the MoE figures in a fenced block. */
void rpt_compare_markdown(FILE *f, const RptCompare *c, int all_ops);
cJSON *rpt_compare_to_json(const RptCompare *c);

/* ---- the page's header: what a team reads first ---- */

typedef struct {
    char title[160];     /* "llama3-70b on dgx-h100, 1024 GPUs" (empty: nothing known) */
    char model[64], cluster[64], device[64];
    int gpus, node_devices;
    int have_layout;     /* spec holds the layout and the job */
    ModelSpec spec;
    char framework[48];  /* the plan's "framework" when it names one, else Megatron-LM */
    /* the prediction's figures, NAN when unknown */
    double step_s, tokens_per_s, mfu, tflops_per_gpu, bubble_fraction;
    double measured_step_s; /* the run's median step, NAN without a run */
    double train_tokens;    /* the token budget, 0: none given */
    char basis[160];        /* where the figures come from */
    int cpu;                /* the plan's device is a CPU: its ranks are "CPU ranks", not GPUs */
    char note[240];         /* after the layout (a validation: which of its rows this is), or "" */
} RptHeader;

/* Nothing known: every figure NAN, the framework Megatron-LM. */
void rpt_header_init(RptHeader *h);
/* The model, cluster, layout and figures of a plan's own prediction, and the run's measured
 * median step when run is given; PX_EINPUT names what the plan lacks. */
int rpt_header_from_plan(RptHeader *h, const cJSON *plan, const cJSON *run, PxError *err);
/* The header as Markdown: a line of the key figures, then a table of figure and value (model,
 * cluster, GPUs, layout, framework, step, tokens/s, MFU, hardware TFLOP/s, bubble, days and
 * cost to train, date, commit). gpu_hour_price <= 0: the cost is left out with how to ask for it;
 * no token budget: the days likewise. date (NULL: now, UTC) and commit (NULL: rpt_commit())
 * are for tests. Free with free(); NULL when out of memory. */
char *rpt_header_markdown(const RptHeader *h, double gpu_hour_price, const char *date,
                          const char *commit);
/* The parallax build's `git describe` ("unknown" outside a git checkout). */
const char *rpt_commit(void);

/* ---- a whole report ---- */

typedef struct {
    const char *dir;
    const char *title;
    const cJSON *plan; /* a plan with its prediction: memory, simulated timeline, trace */
    const cJSON *run;  /* a run.json: measured timeline and trace; with the plan, the comparison */
    /* scaling curves (strong: the base job's global batch; weak: scaled with the GPUs) and the
     * planner's landscape at gpus[0] (every feasible layout simulated in full) */
    const ModelSpec *base;
    const ProfCluster *cluster;
    const int *gpus;
    int n_gpus;
    int landscape;
    /* sections placed first on the page (validation), optional */
    const RptSection *extra;
    int n_extra;
    /* a validation's JSON (validate --json): its host_check and quiet objects become the
     * page's host check; NULL: <dir>/validation.json when there is one */
    const cJSON *validation;
    double gpu_hour_price; /* $ per GPU-hour for the header's cost; 0: not priced */
    double train_tokens;   /* > 0: the header's token budget, over the plan's */
    const char *layout_note; /* the header's note after the layout (NULL: none) */
    FILE *progress;        /* a line per phase (NULL: silent) */
} RptRequest;

/* Draws every chart the inputs allow, the traces, and report.md / report.html; prints each
 * file written to `log` (NULL: quiet). */
int rpt_build(const RptRequest *q, FILE *log, PxError *err);

#endif
