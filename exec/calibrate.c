/* Calibration: measure this machine through the executor's own kernels and communication layer
 * and write what was measured as a cluster profile the simulator reads (profiles/profile.h's
 * `measured` section; docs/time.md, "Calibrated profiles").
 *
 * `parallax calibrate` (calibrate_job.c) runs parallax-worker in parts, each a separate launch
 * so that every part runs exactly as many ranks as it measures:
 *   compute  on c ranks at once, for each concurrency c of 1, 2, 4, ... up to the ranks asked
 *            for: every rank times the GEMMs of the op graphs of the calibration models at
 *            their shapes and transposes, then trains those models for a few steps on one rank
 *            each (the executor itself, every op timed under its op-graph name) and fits, per
 *            kind of op and phase, a fixed cost and a rate over the simulator's own bytes (FLOPs
 *            for attention) of each op; a matmul's fit is over what its measured GEMMs leave.
 *            The ranks' figures are averaged: they ran side by side, sharing caches and memory
 *            bandwidth as a job of c ranks does. Also the device's GEMM peak and stream
 *            bandwidth.
 *   comm     on all the ranks: all-reduce, all-gather and reduce-scatter over groups of 2, 4,
 *            ... ranks (all groups at once, as in a job) and point-to-point transfers between
 *            pairs, over message sizes, through the MPI communication layer; times are the
 *            slowest rank's, and printed with nccl-tests' algorithm and bus bandwidths.
 *   assemble on one rank: the base cluster profile with the measurements added (and the device's
 *            peak and bandwidth replaced by the measured ones on a generic CPU profile, or its
 *            efficiencies set from them otherwise), written atomically. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "exec/comm/comm.h"
#include "exec/exec.h"
#include "exec/train/train.h"
#include "kernels/kernels.h"

/* ---- options ---- */

typedef struct {
    const char *part;    /* compute, comm, assemble */
    const char *output;  /* the part's JSON, or the profile (assemble) */
    const char *models;  /* comma-separated zoo models */
    const char *base;    /* the cluster profile the measurements extend */
    const char *backend; /* cpu, cuda */
    const char *samples; /* compute: every op sample as CSV, for looking at the fits */
    int quick;           /* fewer shapes, sizes and repetitions (tests) */
    int quiet;
    char **parts;        /* assemble: the parts' files */
    int n_parts;
} Calib;

static int g_rank;

#define SAY(...)                                                                                   \
    do {                                                                                           \
        if (g_rank == 0 && !cal->quiet) {                                                          \
            printf(__VA_ARGS__);                                                                   \
            fflush(stdout);                                                                        \
        }                                                                                          \
    } while (0)

/* ---- GEMM shapes of the op graphs ---- */

typedef struct {
    int64_t m, n, k, batch;
    int ta, tb;
    float beta;
    double seconds;
} Shape;

typedef struct {
    Shape *s;
    int n, cap;
} Shapes;

/* The executor's transposes: forward Y = X W^T (0, 1); backward's first GEMM the input gradient
 * dX = dY W (0, 0), its second the weight gradient dW += dY^T X (1, 0, accumulating). */
static int shapes_add(Shapes *sh, const ModelGemm *g, int ta, int tb, float beta)
{
    for (int i = 0; i < sh->n; i++)
        if (sh->s[i].m == g->m && sh->s[i].n == g->n && sh->s[i].k == g->k &&
            sh->s[i].batch == g->batch)
            return 0;
    if (sh->n == sh->cap) {
        int cap = sh->cap ? 2 * sh->cap : 64;
        Shape *p = realloc(sh->s, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        sh->s = p;
        sh->cap = cap;
    }
    sh->s[sh->n++] = (Shape){g->m, g->n, g->k, g->batch, ta, tb, beta, 0};
    return 0;
}

/* A calibration model's spec: its own sequence, one TP degree, one micro-batch size. */
static int calib_spec(const char *model, int tp, int mbs, int flash, PxDtype precision,
                      ModelSpec *s, ModelDims *d, PxError *err)
{
    model_spec_defaults(s);
    int rc = model_config_load(model, &s->model, err);
    if (rc)
        return rc;
    s->layout.tp = tp;
    s->layout.dp = 1;
    s->job.micro_batch = mbs;
    s->job.global_batch = mbs;
    s->job.flash_attn = flash;
    s->job.precision = precision;
    return model_spec_check(s, tp, d, err);
}

/* The precision the backend trains in: the CPU fp32, CUDA bf16 (as the plans it runs). */
static PxDtype calib_precision(const Calib *cal)
{
    return strcmp(cal->backend, "cuda") ? PX_FP32 : PX_BF16;
}

static int next_model(const char **p, char *buf, size_t cap)
{
    const char *s = *p;
    while (*s == ',')
        s++;
    if (!*s)
        return 0;
    const char *e = strchr(s, ',');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *p = s + n;
    return 1;
}

static const int tps[] = {1, 2, 4, 8};
static const int mbss[] = {1, 2, 4, 8};

static int collect_shapes(const Calib *cal, Shapes *sh, PxError *err)
{
    const char *p = cal->models;
    char model[128];
    while (next_model(&p, model, sizeof model)) {
        for (size_t ti = 0; ti < sizeof tps / sizeof tps[0]; ti++) {
            for (size_t bi = 0; bi < sizeof mbss / sizeof mbss[0]; bi++) {
                if (cal->quick && (tps[ti] > 2 || mbss[bi] == 2 || mbss[bi] == 8))
                    continue;
                ModelSpec s;
                ModelDims d;
                PxError e2 = {0};
                int rc = calib_spec(model, tps[ti], mbss[bi], 1, calib_precision(cal), &s, &d, &e2);
                if (rc && e2.code == MODEL_RULE_NONE) {
                    *err = e2;
                    return rc;
                }
                if (rc)
                    continue; /* this TP degree does not divide the model */
                ModelOpGraph g = {0};
                if ((rc = model_ops_build(&s, &d, 0, &g, err)))
                    return rc;
                for (int i = 0; i < g.count && !rc; i++) {
                    const ModelOp *op = &g.op[i];
                    if (op->kind != MODEL_OP_MATMUL)
                        continue;
                    for (int j = 0; j < op->n_gemm && !rc; j++) {
                        int bwd = op->phase == MODEL_BWD;
                        rc = shapes_add(sh, &op->gemm[j], bwd && j == 1, !bwd, bwd && j == 1 ? 1.0f : 0.0f);
                    }
                }
                model_ops_free(&g);
                if (rc)
                    return px_fail(err, PX_ERUNTIME, "out of memory listing GEMM shapes");
            }
        }
    }
    return PX_OK;
}

/* ---- timing kernels ---- */

/* Seconds per call of one GEMM shape (batch calls): the median of five batches of calls, each
 * batch at least min_s / 5 long; one call for a shape that takes longer than that alone. */
static double time_gemm(const KernBackend *k, const Shape *s, void *a, void *b, void *c,
                        double min_s)
{
    const int m = (int)s->m, n = (int)s->n, kk = (int)s->k;
    PxDtype cd = s->beta != 0.0f ? PX_FP32 : k->act;
    for (int w = 0; w < 2; w++)
        for (int64_t i = 0; i < s->batch; i++)
            k->matmul(c, cd, a, b, m, n, kk, s->ta, s->tb, 1.0f, s->beta);
    k->sync();
    double t0 = px_now_s();
    for (int64_t i = 0; i < s->batch; i++)
        k->matmul(c, cd, a, b, m, n, kk, s->ta, s->tb, 1.0f, s->beta);
    k->sync();
    double one = px_now_s() - t0;
    if (one >= min_s / 5)
        return one;
    int reps = (int)(min_s / 5 / (one > 1e-7 ? one : 1e-7)) + 1;
    double batches[5];
    for (int r = 0; r < 5; r++) {
        t0 = px_now_s();
        for (int i = 0; i < reps; i++)
            for (int64_t j = 0; j < s->batch; j++)
                k->matmul(c, cd, a, b, m, n, kk, s->ta, s->tb, 1.0f, s->beta);
        k->sync();
        batches[r] = (px_now_s() - t0) / reps;
    }
    for (int i = 1; i < 5; i++) /* insertion sort: five values */
        for (int j = i; j > 0 && batches[j] < batches[j - 1]; j--) {
            double t = batches[j];
            batches[j] = batches[j - 1];
            batches[j - 1] = t;
        }
    return batches[2];
}

static void fill_random(const KernBackend *k, void *dst, size_t elems)
{
    float *h = malloc(elems * sizeof *h);
    if (!h)
        return;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < elems; i++) {
        x = px_mix64(x + i);
        h[i] = (float)((double)(x >> 11) * (1.0 / 9007199254740992.0) - 0.5);
    }
    if (k->act == PX_FP32) {
        k->to_device(dst, h, elems * sizeof *h);
    } else {
        /* through an fp32 staging buffer on the device, cast to the activation type */
        float *tmp = k->alloc(elems * sizeof *tmp);
        if (tmp) {
            k->to_device(tmp, h, elems * sizeof *h);
            k->cast_to_act(dst, tmp, elems);
            k->sync();
            k->free(tmp);
        }
    }
    free(h);
}

static int time_shapes(const Calib *cal, const KernBackend *k, Shapes *sh, PxError *err)
{
    const size_t eb = px_dtype_bytes(k->act);
    /* shapes whose operands would not fit a modest buffer are left to the nearest measured one */
    const double cap_bytes = 1024.0 * 1024 * 1024;
    size_t amax = 1, bmax = 1, cmax = 1;
    for (int i = 0; i < sh->n; i++) {
        const Shape *s = &sh->s[i];
        double a = (double)s->m * s->k, b = (double)s->k * s->n, c = (double)s->m * s->n;
        if ((a + b) * eb + c * 4 > cap_bytes)
            continue;
        if (a > amax)
            amax = (size_t)a;
        if (b > bmax)
            bmax = (size_t)b;
        if (c > cmax)
            cmax = (size_t)c;
    }
    void *A = k->alloc(amax * eb), *B = k->alloc(bmax * eb), *C = k->alloc(cmax * 4);
    if (!A || !B || !C) {
        k->free(A);
        k->free(B);
        k->free(C);
        return px_fail(err, PX_ERUNTIME, "out of memory for GEMM operands (%zu, %zu, %zu elements)",
                       amax, bmax, cmax);
    }
    fill_random(k, A, amax);
    fill_random(k, B, bmax);
    const double min_s = cal->quick ? 0.002 : 0.02;
    for (int i = 0; i < sh->n; i++) {
        Shape *s = &sh->s[i];
        double a = (double)s->m * s->k, b = (double)s->k * s->n, c = (double)s->m * s->n;
        s->seconds = (a + b) * eb + c * 4 > cap_bytes ? 0 : time_gemm(k, s, A, B, C, min_s);
    }
    k->free(A);
    k->free(B);
    k->free(C);
    return PX_OK;
}

/* The best GEMM rate of a large square product (the device's practical peak). */
static double measure_peak(const Calib *cal, const KernBackend *k)
{
    /* a real GPU needs a large product to fill it; the CPU (and the emulated GPU) a small one */
    int n = strcmp(k->name, "cuda") != 0 ? (cal->quick ? 384 : 1024) : 8192;
    const size_t eb = px_dtype_bytes(k->act);
    void *A = k->alloc((size_t)n * n * eb), *B = k->alloc((size_t)n * n * eb),
         *C = k->alloc((size_t)n * n * eb);
    double best = 0;
    if (A && B && C) {
        fill_random(k, A, (size_t)n * n);
        fill_random(k, B, (size_t)n * n);
        Shape s = {n, n, n, 1, 0, 1, 0.0f, 0};
        for (int r = 0; r < 3; r++) {
            double t = time_gemm(k, &s, A, B, C, cal->quick ? 0.01 : 0.1);
            double rate = 2.0 * n * (double)n * n / t;
            if (rate > best)
                best = rate;
        }
    }
    k->free(A);
    k->free(B);
    k->free(C);
    return best;
}

/* Streaming bandwidth: out = a + b over buffers well beyond the caches (reads two, writes one). */
static double measure_bandwidth(const Calib *cal, const KernBackend *k)
{
    size_t n = (size_t)(cal->quick ? 4 : 32) * 1024 * 1024;
    if (strcmp(k->name, "cuda") == 0)
        n *= 8;
    const size_t eb = px_dtype_bytes(k->act);
    void *a = k->alloc(n * eb), *b = k->alloc(n * eb), *o = k->alloc(n * eb);
    double best = 0;
    if (a && b && o) {
        k->add(o, a, b, n);
        k->sync();
        for (int r = 0; r < (cal->quick ? 3 : 8); r++) {
            double t0 = px_now_s();
            k->add(o, a, b, n);
            k->sync();
            double bw = 3.0 * n * eb / (px_now_s() - t0);
            if (bw > best)
                best = bw;
        }
    }
    k->free(a);
    k->free(b);
    k->free(o);
    return best;
}

/* ---- op rates from real training steps ---- */

typedef struct {
    char kind[16], phase[16], variant[24];
    int flash;
    double x, y; /* ModelOpKey's size; seconds per call (a matmul's without its GEMMs) */
    char op[200]; /* where it came from: model, micro-batch, op name */
} Sample;

typedef struct {
    Sample *s;
    int n, cap;
} Samples;

static const Shape *shape_find(const Shapes *sh, const ModelGemm *g)
{
    for (int i = 0; i < sh->n; i++)
        if (sh->s[i].m == g->m && sh->s[i].n == g->n && sh->s[i].k == g->k &&
            sh->s[i].batch == g->batch && sh->s[i].seconds > 0)
            return &sh->s[i];
    return NULL;
}

static int samples_add(Samples *ss, const Sample *s)
{
    if (ss->n == ss->cap) {
        int cap = ss->cap ? 2 * ss->cap : 256;
        Sample *p = realloc(ss->s, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        ss->s = p;
        ss->cap = cap;
    }
    ss->s[ss->n++] = *s;
    return 0;
}

/* Trains one calibration configuration for a few steps on this rank alone and adds a sample
 * per compute op: its seconds per call against its bytes (FLOPs for attention). */
static int run_config(const Calib *cal, const char *model, int mbs, int flash, const Shapes *sh,
                      Samples *ss, PxError *err)
{
    ModelSpec s;
    ModelDims d;
    int rc = calib_spec(model, 1, mbs, flash, calib_precision(cal), &s, &d, err);
    if (rc)
        return rc;
    const int steps = cal->quick ? 4 : 10;
    s.job.steps = steps;
    /* a plan on the base profile, without a prediction: only the measurements count */
    ModelPlan plan;
    ProfCluster base;
    if ((rc = prof_cluster_load(cal->base, NULL, 0, &base, err)))
        return rc;
    if (prof_peak_flops(&base.device, s.job.precision) <= 0)
        rc = px_fail(err, PX_EINPUT, "device %s has no %s peak FLOP/s: choose another precision",
                     base.device.name, px_dtype_name(s.job.precision));
    else
        rc = model_plan_init(&plan, &s, cal->base, &base, 1, NULL, err);
    prof_cluster_free(&base);
    if (rc)
        return rc;
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.quiet = 1;
    opt.steps = steps;
    opt.plan_path = model;
    opt.backend = strcmp(cal->backend, "cuda") ? EXEC_BACKEND_CPU : EXEC_BACKEND_CUDA;
    Exec *ex = NULL;
    if ((rc = exec_init(&ex, &plan, &opt, err))) {
        model_plan_free(&plan);
        return rc;
    }
    /* each op's time in every step after the first (from the running averages), then the
     * median over those steps: a step disturbed by another process counts once */
    const ModelOpGraph *graph = exec_graph(ex);
    const int n_ops = graph->count, timed = steps - 1;
    double *per = calloc((size_t)n_ops * (size_t)timed + 1, sizeof *per);
    double *prev = calloc((size_t)n_ops + 1, sizeof *prev), *col = calloc((size_t)timed + 1, sizeof *col);
    if (!per || !prev || !col)
        rc = px_fail(err, PX_ERUNTIME, "out of memory timing ops");
    int n = 0;
    const ExecOpReport *rep = NULL;
    for (int i = 0; i < steps && !rc; i++) {
        ExecStepStats st;
        if ((rc = exec_step(ex, i, &st, err)) || i == 0)
            continue;
        rep = exec_ops(ex, &n);
        for (int o = 0; o < n && o < n_ops; o++) {
            double cum = rep[o].seconds * i; /* i timed steps so far */
            per[(size_t)o * timed + (i - 1)] = cum - prev[o];
            prev[o] = cum;
        }
    }
    for (int o = 0; o < n && !rc; o++) {
        for (int t = 0; t < timed; t++)
            col[t] = per[(size_t)o * timed + t];
        for (int a = 1; a < timed; a++) /* insertion sort: a few steps */
            for (int b = a; b > 0 && col[b] < col[b - 1]; b--) {
                double x = col[b];
                col[b] = col[b - 1];
                col[b - 1] = x;
            }
        prev[o] = timed % 2 ? col[timed / 2] : 0.5 * (col[timed / 2 - 1] + col[timed / 2]);
    }
    for (int i = 0; i < n && !rc; i++) {
        const ModelOp *op = &graph->op[i];
        if (op->kind == MODEL_OP_COMM || rep[i].calls <= 0 || prev[i] <= 0)
            continue;
        Sample smp;
        memset(&smp, 0, sizeof smp);
        snprintf(smp.op, sizeof smp.op, "%s/b%d/%s", model, mbs, rep[i].name);
        ModelOpKey key;
        model_op_key(exec_spec(ex), exec_dims(ex), op, &key);
        px_strlcpy(smp.kind, key.kind, sizeof smp.kind);
        px_strlcpy(smp.phase, key.phase, sizeof smp.phase);
        px_strlcpy(smp.variant, key.variant, sizeof smp.variant);
        smp.flash = key.flash;
        smp.x = key.x;
        smp.y = prev[i] / rep[i].calls; /* the median step's */
        if (op->kind == MODEL_OP_MATMUL) {
            /* what the measured GEMMs leave: bias, RoPE, dropout, residual add */
            int all = 1;
            for (int j = 0; j < op->n_gemm && all; j++) {
                const Shape *m = shape_find(sh, &op->gemm[j]);
                if (m)
                    smp.y -= m->seconds;
                all = m != NULL;
            }
            if (!all)
                continue;
        }
        if (samples_add(ss, &smp))
            rc = px_fail(err, PX_ERUNTIME, "out of memory collecting op samples");
    }
    free(per);
    free(prev);
    free(col);
    exec_free(ex);
    model_plan_free(&plan);
    return rc;
}

typedef struct {
    char kind[16], phase[16], variant[24];
    int flash;
    double rate, overhead_s;
    int points;
    double rms_abs; /* root mean square of the fit's errors, seconds */
} Fit;

/* y = a + x / rate by least squares on relative errors (weights 1/y^2), so that small and large
 * ops count alike; through the origin when the intercept comes out negative or the sizes are
 * too close to tell, a constant when the slope comes out negative (y does not grow with x over
 * the sizes seen). */
static Fit fit_samples(const Sample *s, const int *idx, int n)
{
    Fit f;
    memset(&f, 0, sizeof f);
    px_strlcpy(f.kind, s[idx[0]].kind, sizeof f.kind);
    px_strlcpy(f.phase, s[idx[0]].phase, sizeof f.phase);
    px_strlcpy(f.variant, s[idx[0]].variant, sizeof f.variant);
    f.flash = s[idx[0]].flash;
    f.points = n;
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, xmin = INFINITY, xmax = 0;
    for (int i = 0; i < n; i++) {
        const Sample *p = &s[idx[i]];
        double y = p->y > 1e-9 ? p->y : 1e-9, w = 1.0 / (y * y);
        sw += w;
        sx += w * p->x;
        sy += w * p->y;
        sxx += w * p->x * p->x;
        sxy += w * p->x * p->y;
        if (p->x < xmin)
            xmin = p->x;
        if (p->x > xmax)
            xmax = p->x;
    }
    /* sizes within a factor 1.5 cannot separate a fixed cost from a rate: the rate alone,
     * which carries over to other sizes (an optimizer over another stage's parameters) */
    const int spread = xmax > 1.5 * xmin;
    double a = 0, b = 0;
    double det = sw * sxx - sx * sx;
    if (spread && det > 0) {
        b = (sw * sxy - sx * sy) / det;
        a = (sy - b * sx) / sw;
    }
    if (!spread || b <= 0 || a < 0) {
        if (sxx > 0 && sxy > 0 && !(spread && b <= 0)) {
            a = 0;
            b = sxy / sxx; /* through the origin */
        } else {
            a = sy / sw > 0 ? sy / sw : 0;
            b = 0; /* a constant */
        }
    }
    f.overhead_s = a;
    f.rate = b > 0 ? 1.0 / b : 1e18;
    double e2 = 0;
    for (int i = 0; i < n; i++) {
        const Sample *p = &s[idx[i]];
        double pred = a + b * p->x;
        e2 += (pred - p->y) * (pred - p->y);
    }
    f.rms_abs = sqrt(e2 / n);
    return f;
}

static int fit_all(const Samples *ss, Fit **out, int *n_out, PxError *err)
{
    Fit *fits = calloc((size_t)(ss->n > 0 ? ss->n : 1), sizeof *fits);
    int *idx = calloc((size_t)(ss->n > 0 ? ss->n : 1), sizeof *idx);
    char *done = calloc((size_t)(ss->n > 0 ? ss->n : 1), 1);
    if (!fits || !idx || !done) {
        free(fits);
        free(idx);
        free(done);
        return px_fail(err, PX_ERUNTIME, "out of memory fitting op rates");
    }
    int nf = 0;
    for (int i = 0; i < ss->n; i++) {
        if (done[i])
            continue;
        int n = 0;
        for (int j = i; j < ss->n; j++) {
            const Sample *a = &ss->s[i], *b = &ss->s[j];
            if (!done[j] && !strcmp(a->kind, b->kind) && !strcmp(a->phase, b->phase) &&
                a->flash == b->flash && !strcmp(a->variant, b->variant)) {
                idx[n++] = j;
                done[j] = 1;
            }
        }
        fits[nf++] = fit_samples(ss->s, idx, n);
    }
    free(idx);
    free(done);
    *out = fits;
    *n_out = nf;
    return PX_OK;
}

/* ---- the compute part ---- */

static const KernBackend *pick_backend(const Calib *cal, PxError *err)
{
    if (!strcmp(cal->backend, "cpu"))
        return kern_cpu();
    if (!strcmp(cal->backend, "cuda")) {
        const KernBackend *k = kern_cuda();
        if (!k)
            px_fail(err, PX_EINPUT,
                    "--backend cuda: this build has no CUDA backend or no GPU is visible");
        return k;
    }
    px_fail(err, PX_EINPUT, "--backend: expected cpu or cuda, got '%s'", cal->backend);
    return NULL;
}

/* Averages n doubles over the ranks (each rank passes its own; all get the mean). */
static int average(CommLayer *c, double *v, int n, PxError *err)
{
    if (comm_world(c) == 1 || n == 0)
        return PX_OK;
    int rc = comm_control(c, v, n, COMM_SUM, err);
    for (int i = 0; i < n && !rc; i++)
        v[i] /= comm_world(c);
    return rc;
}

/* Averages one double field (at `offset` in records of `stride` bytes) of n records over the
 * ranks, as average does for an array. */
static int average_field(CommLayer *c, void *records, size_t stride, size_t offset, int n,
                         PxError *err)
{
    if (comm_world(c) == 1 || n == 0)
        return PX_OK;
    double *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    char *base = records;
    for (int i = 0; i < n; i++)
        memcpy(&v[i], base + (size_t)i * stride + offset, sizeof v[i]);
    int rc = average(c, v, n, err);
    for (int i = 0; i < n && !rc; i++)
        memcpy(base + (size_t)i * stride + offset, &v[i], sizeof v[i]);
    free(v);
    return rc;
}

static int part_compute(const Calib *cal, CommLayer *comm, PxError *err)
{
    const KernBackend *k = pick_backend(cal, err);
    if (!k)
        return PX_EINPUT;
    const int c = comm_world(comm);
    double t_start = px_now_s();
    Shapes sh = {0};
    Samples ss = {0};
    Fit *fits = NULL;
    int n_fits = 0;
    int rc = collect_shapes(cal, &sh, err);
    if (rc)
        goto out;
    SAY("calibrate: %d rank%s at once (%s backend): %d GEMM shapes of %s\n", c, c > 1 ? "s" : "",
        k->name, sh.n, cal->models);
    if ((rc = comm_barrier(comm, err)) || (rc = time_shapes(cal, k, &sh, err)))
        goto out;
    if ((rc = average_field(comm, sh.s, sizeof *sh.s, offsetof(Shape, seconds), sh.n, err)))
        goto out;
    double peak = 0, bw = 0;
    if ((rc = comm_barrier(comm, err)))
        goto out;
    peak = measure_peak(cal, k);
    bw = measure_bandwidth(cal, k);
    {
        double v[2] = {peak, bw};
        if ((rc = average(comm, v, 2, err)))
            goto out;
        peak = v[0];
        bw = v[1];
    }
    SAY("  GEMMs timed in %.1f s; peak %.1f GFLOP/s (%s), stream bandwidth %.1f GB/s per rank\n",
        px_now_s() - t_start, peak / 1e9, px_dtype_name(k->act), bw / 1e9);

    /* training steps of each calibration configuration, every rank its own */
    double t_ops = px_now_s();
    const char *p = cal->models;
    char model[128];
    int configs = 0;
    while (!rc && next_model(&p, model, sizeof model)) {
        for (size_t bi = 0; bi < sizeof mbss / sizeof mbss[0] && !rc; bi++) {
            if (cal->quick && (mbss[bi] == 2 || mbss[bi] == 8))
                continue;
            for (int flash = 1; flash >= 0 && !rc; flash--) {
                if ((rc = comm_barrier(comm, err)))
                    break;
                rc = run_config(cal, model, mbss[bi], flash, &sh, &ss, err);
                configs++;
            }
        }
    }
    if (rc)
        goto out;
    /* every rank ran the same ops in the same order */
    if ((rc = average_field(comm, ss.s, sizeof *ss.s, offsetof(Sample, y), ss.n, err)))
        goto out;
    if ((rc = fit_all(&ss, &fits, &n_fits, err)))
        goto out;
    if (g_rank == 0 && cal->samples) {
        FILE *f = fopen(cal->samples, "w");
        if (!f) {
            rc = px_fail(err, PX_EINPUT, "--samples %s: cannot write: %s", cal->samples,
                         strerror(errno));
            goto out;
        }
        fprintf(f, "kind,phase,variant,flash,x,seconds,op\n");
        for (int i = 0; i < ss.n; i++)
            fprintf(f, "%s,%s,%s,%d,%.9g,%.9g,%s\n", ss.s[i].kind, ss.s[i].phase,
                    ss.s[i].variant, ss.s[i].flash, ss.s[i].x, ss.s[i].y, ss.s[i].op);
        fclose(f);
    }
    SAY("  %d training configurations, %d op samples in %.1f s; fitted rates:\n", configs, ss.n,
        px_now_s() - t_ops);
    for (int i = 0; i < n_fits; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s %s %s%s", fits[i].kind, fits[i].phase, fits[i].variant,
                 !strcmp(fits[i].kind, "attention") ? (fits[i].flash ? " flash" : " plain") : "");
        char rate[32] = "-";
        if (fits[i].rate < 1e18)
            snprintf(rate, sizeof rate, "%.3g", fits[i].rate / 1e9);
        SAY("    %-32s %4d points  %8s %s + %8.2f us  (rms %.1f us)\n", what, fits[i].points, rate,
            !strcmp(fits[i].kind, "attention") ? "GFLOP/s" : "GB/s   ", 1e6 * fits[i].overhead_s,
            1e6 * fits[i].rms_abs);
    }

    if (g_rank == 0) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "part", "compute");
        cJSON_AddNumberToObject(j, "concurrency", c);
        cJSON_AddStringToObject(j, "backend", k->name);
        cJSON_AddStringToObject(j, "dtype", px_dtype_name(k->act));
        cJSON_AddNumberToObject(j, "peak_flops", peak);
        cJSON_AddNumberToObject(j, "memory_bandwidth", bw);
        cJSON *g = cJSON_AddArrayToObject(j, "gemm");
        for (int i = 0; i < sh.n; i++) {
            if (!(sh.s[i].seconds > 0))
                continue;
            double v[5] = {(double)sh.s[i].m, (double)sh.s[i].n, (double)sh.s[i].k,
                           (double)sh.s[i].batch, sh.s[i].seconds};
            cJSON_AddItemToArray(g, cJSON_CreateDoubleArray(v, 5));
        }
        cJSON *ops = cJSON_AddArrayToObject(j, "ops");
        for (int i = 0; i < n_fits; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "kind", fits[i].kind);
            cJSON_AddStringToObject(o, "phase", fits[i].phase);
            if (!strcmp(fits[i].kind, "attention"))
                cJSON_AddBoolToObject(o, "flash", fits[i].flash);
            if (fits[i].variant[0])
                cJSON_AddStringToObject(o, "variant", fits[i].variant);
            cJSON_AddNumberToObject(o, "rate", fits[i].rate);
            cJSON_AddNumberToObject(o, "overhead_s", fits[i].overhead_s);
            cJSON_AddNumberToObject(o, "points", fits[i].points);
            cJSON_AddItemToArray(ops, o);
        }
        rc = px_json_write_file(cal->output, j, err);
        cJSON_Delete(j);
    }
out:
    free(sh.s);
    free(ss.s);
    free(fits);
    return rc;
}

/* ---- the communication part ---- */

static const char *const coll_names[] = {"allreduce", "all_gather", "reduce_scatter", "sendrecv"};

/* One collective at one size over this rank's group: seconds per call, the slowest rank's. */
static int time_collective(CommLayer *c, int op, size_t bytes, int group, int peer, float *buf,
                           const Calib *cal, double *seconds, PxError *err)
{
    const size_t elems = bytes / sizeof(float);
    const int stage0 = peer > comm_rank(c);
    int rc = PX_OK;
    int iters = 0;
    double t = 0, budget = cal->quick ? 0.005 : 0.05;
    for (int round = 0; round < 2 && !rc; round++) {
        /* round 0: two warm-up calls; round 1: as many as the budget allows, agreed by all */
        int n = round == 0 ? 2 : iters;
        if ((rc = comm_barrier(c, err)))
            break;
        double t0 = px_now_s();
        for (int i = 0; i < n && !rc; i++) {
            switch (op) {
            case 0: rc = comm_allreduce(c, buf, elems, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE, NULL, err); break;
            case 1:
                rc = comm_all_gather(c, buf, buf + comm_group_rank(c, MODEL_GROUP_TP) * (elems / group),
                                     elems / group, PX_FP32, MODEL_TP_ALL_GATHER, NULL, err);
                break;
            case 2:
                rc = comm_reduce_scatter(c, buf, buf, elems / group, PX_FP32, MODEL_TP_REDUCE_SCATTER,
                                         NULL, err);
                break;
            default:
                rc = stage0 ? comm_send(c, buf, bytes, peer, 7, MODEL_PP_SEND, NULL, err)
                            : comm_recv(c, buf, bytes, peer, 7, MODEL_PP_RECV, NULL, err);
                break;
            }
        }
        double dt = px_now_s() - t0;
        double v[1] = {round == 0 ? dt / 2 : dt / n};
        if (!rc)
            rc = comm_control(c, v, 1, COMM_MAX, err);
        if (round == 0) {
            iters = (int)(budget / (v[0] > 1e-7 ? v[0] : 1e-7));
            iters = iters < 3 ? 3 : iters > 1000 ? 1000 : iters;
        } else {
            t = v[0];
        }
    }
    *seconds = t;
    return rc;
}

static int part_comm(const Calib *cal, int world, int nodes, PxError *err)
{
    const size_t lo = cal->quick ? 4096 : 1024, hi = cal->quick ? 1 << 20 : 64u << 20;
    const int step = 4;
    float *buf = malloc(hi + 64);
    cJSON *list = cJSON_CreateArray();
    int rc = PX_OK;
    if (!buf || !list) {
        free(buf);
        cJSON_Delete(list);
        return px_fail(err, PX_ERUNTIME, "out of memory");
    }
    for (size_t i = 0; i < hi / sizeof(float) + 16; i++)
        buf[i] = 1.0f / (float)(1 + i % 7);
    /* group sizes: powers of two dividing the world, and the world itself */
    int groups[16], ng = 0;
    for (int g = 2; g <= world && ng < 15; g *= 2)
        if (world % g == 0)
            groups[ng++] = g;
    if (world > 1 && (ng == 0 || groups[ng - 1] != world))
        groups[ng++] = world;
    for (int op = 0; op < 4 && !rc; op++) {
        for (int gi = 0; gi < ng && !rc; gi++) {
            int g = groups[gi];
            if (op == 3 && (g != 2 || world % 2))
                continue; /* point to point: pairs, first half of the ranks to the second */
            ModelLayout l;
            memset(&l, 0, sizeof l);
            l.tp = op == 3 ? 1 : g;
            l.pp = op == 3 ? 2 : 1;
            l.dp = op == 3 ? world / 2 : world / g;
            l.cp = 1;
            l.vpp = 1;
            CommLayer *c = NULL;
            if ((rc = comm_mpi(&l, 0, &c, err)))
                break;
            int peer = op == 3 ? (comm_rank(c) + world / 2) % world : -1;
            int gnodes = nodes > 1 ? (g * nodes + world - 1) / world : 1; /* ranks fill nodes in order */
            if (gnodes < 1)
                gnodes = 1;
            SAY("%s over %d ranks%s\n%12s %12s %12s %12s\n", coll_names[op], g,
                op == 3 ? " (pairs)" : "", "size (B)", "time (us)", "algbw (GB/s)",
                "busbw (GB/s)");
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "op", coll_names[op]);
            cJSON_AddNumberToObject(e, "ranks", g);
            cJSON_AddNumberToObject(e, "nodes", gnodes);
            cJSON *pts = cJSON_AddArrayToObject(e, "points");
            cJSON_AddItemToArray(list, e);
            for (size_t s = lo; s <= hi && !rc; s *= step) {
                /* all-gather and reduce-scatter move whole per-rank shares */
                size_t elems = s / sizeof(float);
                if (op == 1 || op == 2)
                    elems = (elems / (size_t)g > 0 ? elems / (size_t)g : 1) * (size_t)g;
                size_t bytes = elems * sizeof(float);
                double t = 0;
                if ((rc = time_collective(c, op, bytes, g, peer, buf, cal, &t, err)))
                    break;
                /* nccl-tests: algbw = size / time; busbw scales it by what each link carries */
                double alg = bytes / t;
                double factor = op == 0 ? 2.0 * (g - 1) / g : op == 3 ? 1.0 : (double)(g - 1) / g;
                SAY("%12zu %12.1f %12.3f %12.3f\n", bytes, 1e6 * t, alg / 1e9, alg * factor / 1e9);
                double v[2] = {(double)bytes, t};
                cJSON_AddItemToArray(pts, cJSON_CreateDoubleArray(v, 2));
            }
            comm_free(c);
        }
    }
    if (!rc && g_rank == 0) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "part", "comm");
        cJSON_AddNumberToObject(j, "ranks", world);
        cJSON_AddNumberToObject(j, "nodes", nodes);
        cJSON_AddItemToObject(j, "collectives", list);
        list = NULL;
        rc = px_json_write_file(cal->output, j, err);
        cJSON_Delete(j);
    }
    cJSON_Delete(list);
    free(buf);
    return rc;
}

/* ---- assembling the profile ---- */

/* Sets o[key] (o may be NULL: nothing to set). */
static void set_item(cJSON *o, const char *key, cJSON *v)
{
    if (!o) {
        cJSON_Delete(v);
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, key))
        cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else
        cJSON_AddItemToObject(o, key, v);
}

static void set_num(cJSON *o, const char *key, double v) { set_item(o, key, cJSON_CreateNumber(v)); }

static int part_assemble(const Calib *cal, PxError *err)
{
    ProfCluster base;
    int rc = prof_cluster_load(cal->base, NULL, 0, &base, err);
    if (rc)
        return rc;
    prof_measured_free(base.measured);
    base.measured = NULL;
    const int generic_cpu = !strcmp(base.device.name, "cpu");
    cJSON *prof = prof_cluster_to_json(&base);
    cJSON *gemm = cJSON_CreateArray(), *ops = cJSON_CreateArray(), *colls = NULL;
    double peak = 0, bw = 0;
    int max_c = 1, min_c = 1 << 30;
    char host[64] = "unknown";
    gethostname(host, sizeof host - 1);
    for (int i = 0; i < cal->n_parts && !rc; i++) {
        cJSON *p = px_json_read_file(cal->parts[i], err);
        if (!p) {
            rc = PX_EINPUT;
            break;
        }
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(p, "part");
        if (cJSON_IsString(kind) && !strcmp(kind->valuestring, "compute")) {
            int c = 1;
            if ((rc = px_json_int(p, cal->parts[i], "concurrency", 1, 1, 1 << 20, &c, err))) {
                cJSON_Delete(p);
                break;
            }
            if (c > max_c)
                max_c = c;
            if (c < min_c) {
                /* the device figures of the fewest ranks at once: a rank alone */
                min_c = c;
                peak = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p, "peak_flops"));
                bw = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p, "memory_bandwidth"));
            }
            cJSON *g;
            cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(p, "gemm"))
            {
                cJSON *e = cJSON_Duplicate(g, 1);
                cJSON_AddItemToArray(e, cJSON_CreateNumber(c));
                cJSON_AddItemToArray(gemm, e);
            }
            cJSON *o;
            cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(p, "ops"))
            {
                cJSON *e = cJSON_Duplicate(o, 1);
                cJSON_AddNumberToObject(e, "concurrency", c);
                cJSON_AddItemToArray(ops, e);
            }
        } else if (cJSON_IsString(kind) && !strcmp(kind->valuestring, "comm")) {
            cJSON_Delete(colls);
            colls = cJSON_DetachItemFromObjectCaseSensitive(p, "collectives");
        } else {
            rc = px_fail(err, PX_EINPUT, "%s: not a calibration part", cal->parts[i]);
        }
        cJSON_Delete(p);
    }
    if (!rc && !(peak > 0 && bw > 0))
        rc = px_fail(err, PX_EINPUT, "no compute part among the calibration parts");
    if (!rc) {
        char date[32];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(date, sizeof date, "%Y-%m-%d", &tm);
        cJSON *dev = cJSON_GetObjectItemCaseSensitive(prof, "device");
        cJSON *eff = cJSON_GetObjectItemCaseSensitive(dev, "efficiency");
        cJSON *sources = cJSON_GetObjectItemCaseSensitive(prof, "sources");
        if (!sources)
            sources = cJSON_AddObjectToObject(prof, "sources");
        char desc[160], note[320];
        snprintf(desc, sizeof desc, "%s, calibrated on %s by parallax calibrate (%d rank%s at most)",
                 host, date, max_c, max_c > 1 ? "s" : "");
        set_item(prof, "description", cJSON_CreateString(desc));
        const char *dt = base.device.peak_bf16 > 0 && !generic_cpu ? "bf16" : "fp32";
        if (generic_cpu) {
            /* a generic CPU profile has no data-sheet peak: the measured ones replace it */
            set_num(cJSON_GetObjectItemCaseSensitive(dev, "peak_flops"), "fp32", peak);
            set_num(dev, "memory_bandwidth", bw);
            set_num(eff, "matmul", 1.0);
            set_num(eff, "memory", 1.0);
            snprintf(note, sizeof note,
                     "peak_flops.fp32 and memory_bandwidth: measured by parallax calibrate on %s "
                     "(%s): a %s GEMM's best rate and a streaming add's bandwidth, one rank",
                     host, date, generic_cpu ? "1024^3 sgemm" : "square");
        } else {
            /* a data-sheet device keeps its peak: the measurement sets the efficiencies */
            double p0 = prof_peak_flops(&base.device, !strcmp(dt, "bf16") ? PX_BF16 : PX_FP32);
            if (p0 > 0)
                set_num(eff, "matmul", peak / p0 < 1 ? peak / p0 : 1);
            if (base.device.memory_bandwidth > 0)
                set_num(eff, "memory", bw / base.device.memory_bandwidth < 1
                                           ? bw / base.device.memory_bandwidth
                                           : 1);
            snprintf(note, sizeof note,
                     "efficiency.matmul and .memory: measured by parallax calibrate on %s (%s): "
                     "%.4g FLOP/s %s GEMM, %.4g B/s streaming, against the data sheet",
                     host, date, peak, dt, bw);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(sources, "calibration");
        cJSON_AddStringToObject(sources, "calibration", note);
        cJSON *me = cJSON_AddObjectToObject(prof, "measured");
        cJSON_AddStringToObject(me, "host", host);
        cJSON_AddStringToObject(me, "date", date);
        cJSON_AddNumberToObject(me, "ranks", max_c);
        cJSON_AddItemToObject(me, "gemm", gemm);
        cJSON_AddItemToObject(me, "ops", ops);
        gemm = ops = NULL;
        if (colls) {
            cJSON_AddItemToObject(me, "collectives", colls);
            colls = NULL;
        }
        /* the result must load as a profile before it replaces anything */
        char *text = cJSON_Print(prof);
        ProfCluster check;
        if (!text) {
            rc = px_fail(err, PX_ERUNTIME, "out of memory");
        } else if ((rc = prof_cluster_parse(text, cal->output, &check, err)) == PX_OK) {
            prof_cluster_free(&check);
            size_t n = strlen(text);
            char *t2 = realloc(text, n + 2);
            if (t2) {
                text = t2;
                text[n] = '\n';
                text[n + 1] = '\0';
            }
            rc = px_write_file_atomic(cal->output, text, err);
        }
        free(text);
        if (!rc && !cal->quiet)
            printf("calibrate: wrote %s (%s, %d GEMM shapes, %d op rates, %d collectives)\n",
                   cal->output, host,
                   cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(me, "gemm")),
                   cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(me, "ops")),
                   cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(me, "collectives")));
    }
    cJSON_Delete(gemm);
    cJSON_Delete(ops);
    cJSON_Delete(colls);
    cJSON_Delete(prof);
    prof_cluster_free(&base);
    return rc;
}

/* ---- the worker's subcommand ---- */

static const char *const calib_usage =
    "usage: parallax-worker calibrate --part compute|comm|assemble -o FILE [options] [PARTS...]\n\n"
    "One part of `parallax calibrate` (which runs them in turn; see its --help):\n"
    "  compute   time GEMMs and train the calibration models on every rank at once\n"
    "  comm      time collectives over the ranks through the MPI layer\n"
    "  assemble  write the cluster profile from the parts' files (one rank)\n\n"
    "options:\n"
    "  -o, --output FILE      the part's JSON, or the profile (assemble)\n"
    "  --models LIST          calibration models, comma-separated (default tiny,tiny-llama)\n"
    "  --base PROFILE         cluster profile the measurements extend (default local)\n"
    "  --backend B            cpu or cuda (default cpu)\n"
    "  --quick                fewer shapes, sizes and repetitions\n"
    "  --samples FILE         compute: write every op sample (seconds per call against its\n"
    "                         bytes or FLOPs) as CSV, to look at the fits\n"
    "  --quiet                no progress lines\n"
    "  -h, --help             show this help\n";

static int host_count(CommLayer *c, int *nodes, PxError *err)
{
    char host[64] = "unknown";
    gethostname(host, sizeof host - 1);
    char **all = NULL;
    int rc = comm_gather_text(c, host, &all, err);
    double v[1] = {1};
    if (!rc && comm_rank(c) == 0) {
        int n = 0;
        for (int i = 0; i < comm_world(c); i++) {
            int seen = 0;
            for (int j = 0; j < i && !seen; j++)
                seen = !strcmp(all[i], all[j]);
            n += !seen;
        }
        v[0] = n;
    }
    if (all) {
        for (int i = 0; i < comm_world(c); i++)
            free(all[i]);
        free(all);
    }
    if (!rc) {
        if (comm_rank(c) != 0)
            v[0] = 0;
        rc = comm_control(c, v, 1, COMM_SUM, err);
    }
    *nodes = (int)v[0];
    return rc;
}

int exec_calibrate_main(int argc, char **argv, int rank, int world)
{
    g_rank = rank;
    Calib cal = {NULL, NULL, "tiny,tiny-llama", "local", "cpu", NULL, 0, 0, NULL, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **dst = !strcmp(a, "--part")                      ? &cal.part
                           : !strcmp(a, "-o") || !strcmp(a, "--output") ? &cal.output
                           : !strcmp(a, "--models")                  ? &cal.models
                           : !strcmp(a, "--base")                    ? &cal.base
                           : !strcmp(a, "--backend")                 ? &cal.backend
                           : !strcmp(a, "--samples")                 ? &cal.samples
                                                                     : NULL;
        if (dst) {
            if (!v) {
                if (rank == 0)
                    fprintf(stderr, "parallax-worker calibrate: option '%s' needs a value\n", a);
                return 2;
            }
            *dst = v;
            i++;
        } else if (!strcmp(a, "--quick")) {
            cal.quick = 1;
        } else if (!strcmp(a, "--quiet")) {
            cal.quiet = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (rank == 0)
                fputs(calib_usage, stdout);
            return 0;
        } else if (a[0] == '-') {
            if (rank == 0)
                fprintf(stderr, "parallax-worker calibrate: unknown option '%s' (see --help)\n", a);
            return 2;
        } else {
            if (!cal.parts)
                cal.parts = argv + i;
            else if (cal.parts + cal.n_parts != argv + i) {
                if (rank == 0)
                    fprintf(stderr, "parallax-worker calibrate: the part files go last\n");
                return 2;
            }
            cal.n_parts++;
        }
    }
    const int assemble = cal.part && !strcmp(cal.part, "assemble");
    const char *bad = !cal.part ? "--part is required"
                      : strcmp(cal.part, "compute") && strcmp(cal.part, "comm") && !assemble
                          ? "--part: expected compute, comm or assemble"
                      : !cal.output                   ? "-o FILE is required"
                      : assemble && cal.n_parts == 0  ? "assemble needs the parts' files"
                      : !assemble && cal.n_parts > 0  ? "only assemble takes files"
                      : assemble && world > 1         ? "assemble runs on one rank"
                                                      : NULL;
    if (bad) {
        if (rank == 0)
            fprintf(stderr, "parallax-worker calibrate: %s (see --help)\n", bad);
        return 2;
    }
    /* the measurements must not depend on an earlier calibration of this machine */
    setenv("PARALLAX_UNCALIBRATED", "1", 1);
    PxError err = {0};
    int rc = PX_OK;
    if (assemble) {
        rc = part_assemble(&cal, &err);
    } else {
        ModelLayout l;
        memset(&l, 0, sizeof l);
        l.tp = l.pp = l.cp = l.vpp = 1;
        l.dp = world;
        CommLayer *comm = NULL;
        if (world > 1)
            rc = comm_mpi(&l, 0, &comm, &err);
        else if (!(comm = comm_single()))
            rc = px_fail(&err, PX_ERUNTIME, "out of memory");
        if (!rc && !strcmp(cal.part, "compute")) {
            rc = part_compute(&cal, comm, &err);
        } else if (!rc) {
            int nodes = 1;
            if (world < 2)
                rc = px_fail(&err, PX_EINPUT, "the comm part needs at least 2 ranks");
            else if (!(rc = host_count(comm, &nodes, &err)))
                rc = part_comm(&cal, world, nodes, &err);
        }
        if (comm)
            comm_free(comm);
        if (rc && world > 1) {
            /* a rank failing alone must not leave the others in a collective */
            fprintf(stderr, "parallax-worker calibrate: rank %d of %d: %s\n", rank, world, err.msg);
            fflush(stderr);
            comm_mpi_abort(rc == PX_EINPUT ? 2 : 1);
        }
    }
    if (rc) {
        fprintf(stderr, "parallax-worker calibrate: %s\n", err.msg);
        return rc == PX_EINPUT ? 2 : 1;
    }
    return 0;
}
