/* GEMMs at the op graphs' shapes, timed through the kernels the executor trains with, and the
 * device's practical peak and stream bandwidth. */
#include <stdlib.h>
#include <string.h>

#include "exec/calibrate/internal.h"

/* The executor's transposes: forward Y = X W^T (0, 1); backward's first GEMM the input gradient
 * dX = dY W (0, 0), its second the weight gradient dW += dY^T X (1, 0, accumulating). */
static int shapes_add(CalibShapes *sh, const ModelGemm *g, int ta, int tb, float beta)
{
    for (int i = 0; i < sh->n; i++)
        if (sh->s[i].m == g->m && sh->s[i].n == g->n && sh->s[i].k == g->k &&
            sh->s[i].batch == g->batch)
            return 0;
    if (sh->n == sh->cap) {
        int cap = sh->cap ? 2 * sh->cap : 64;
        CalibShape *p = realloc(sh->s, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        sh->s = p;
        sh->cap = cap;
    }
    sh->s[sh->n++] = (CalibShape){g->m, g->n, g->k, g->batch, ta, tb, beta, 0};
    return 0;
}

/* The matmul GEMMs of one model's op graph at one TP degree and micro-batch size. */
static int shapes_of_config(const CalibOptions *o, const char *model, int tp, int mbs,
                            CalibShapes *sh, PxError *err)
{
    ModelSpec s;
    ModelDims d;
    PxError e2 = {0};
    int rc = calib_spec(model, tp, mbs, 1, calib_precision(o), &s, &d, &e2);
    if (rc && e2.code == MODEL_RULE_NONE) {
        *err = e2;
        return rc;
    }
    if (rc)
        return PX_OK; /* this TP degree does not divide the model */
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
    return PX_OK;
}

int calib_shapes_collect(const CalibOptions *o, CalibShapes *sh, PxError *err)
{
    const char *p = o->models;
    char model[128];
    int rc = PX_OK;
    while (!rc && calib_next_model(&p, model, sizeof model))
        for (int ti = 0; ti < CALIB_SIZES && !rc; ti++)
            for (int bi = 0; bi < CALIB_SIZES && !rc; bi++)
                if (!calib_quick_skips(o, calib_tp_sizes[ti], calib_mbs_sizes[bi]))
                    rc = shapes_of_config(o, model, calib_tp_sizes[ti], calib_mbs_sizes[bi], sh,
                                          err);
    return rc;
}

const CalibShape *calib_shape_find(const CalibShapes *sh, const ModelGemm *g)
{
    for (int i = 0; i < sh->n; i++)
        if (sh->s[i].m == g->m && sh->s[i].n == g->n && sh->s[i].k == g->k &&
            sh->s[i].batch == g->batch && sh->s[i].seconds > 0)
            return &sh->s[i];
    return NULL;
}

/* Seconds per call of one GEMM shape (batch calls): the median of five batches of calls, each
 * batch at least min_s / 5 long; one call for a shape that takes longer than that alone. */
static double time_gemm(const KernBackend *k, const CalibShape *s, void *a, void *b, void *c,
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
    return px_median(batches, 5);
}

/* Uniform values in [-0.5, 0.5) into elems elements of the activation type at dst. */
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

/* shapes whose operands would not fit a modest buffer are left to the nearest measured one */
static const double operand_cap_bytes = 1024.0 * 1024 * 1024;

static int shape_fits(const CalibShape *s, size_t eb)
{
    double a = (double)s->m * s->k, b = (double)s->k * s->n, c = (double)s->m * s->n;
    return (a + b) * eb + c * 4 <= operand_cap_bytes;
}

int calib_shapes_time(const CalibOptions *o, const KernBackend *k, CalibShapes *sh, PxError *err)
{
    const size_t eb = px_dtype_bytes(k->act);
    size_t amax = 1, bmax = 1, cmax = 1;
    for (int i = 0; i < sh->n; i++) {
        const CalibShape *s = &sh->s[i];
        double a = (double)s->m * s->k, b = (double)s->k * s->n, c = (double)s->m * s->n;
        if (!shape_fits(s, eb))
            continue;
        if (a > amax)
            amax = (size_t)a;
        if (b > bmax)
            bmax = (size_t)b;
        if (c > cmax)
            cmax = (size_t)c;
    }
    void *A = k->alloc(amax * eb), *B = k->alloc(bmax * eb), *C = k->alloc(cmax * 4);
    int rc = PX_OK;
    if (!A || !B || !C) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory for GEMM operands (%zu, %zu, %zu elements)",
                     amax, bmax, cmax);
    } else {
        fill_random(k, A, amax);
        fill_random(k, B, bmax);
        const double min_s = o->quick ? 0.002 : 0.02;
        for (int i = 0; i < sh->n; i++) {
            CalibShape *s = &sh->s[i];
            s->seconds = shape_fits(s, eb) ? time_gemm(k, s, A, B, C, min_s) : 0;
        }
    }
    k->free(A);
    k->free(B);
    k->free(C);
    return rc;
}

double calib_peak_flops(const CalibOptions *o, const KernBackend *k)
{
    /* a real GPU needs a large product to fill it; the CPU (and the emulated GPU) a small one */
    int n = strcmp(k->name, "cuda") != 0 ? (o->quick ? 384 : 1024) : 8192;
    const size_t eb = px_dtype_bytes(k->act);
    void *A = k->alloc((size_t)n * n * eb), *B = k->alloc((size_t)n * n * eb),
         *C = k->alloc((size_t)n * n * eb);
    double best = 0;
    if (A && B && C) {
        fill_random(k, A, (size_t)n * n);
        fill_random(k, B, (size_t)n * n);
        CalibShape s = {n, n, n, 1, 0, 1, 0.0f, 0};
        for (int r = 0; r < 3; r++) {
            double t = time_gemm(k, &s, A, B, C, o->quick ? 0.01 : 0.1);
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

double calib_bandwidth(const CalibOptions *o, const KernBackend *k)
{
    size_t n = (size_t)(o->quick ? 4 : 32) * 1024 * 1024;
    if (strcmp(k->name, "cuda") == 0)
        n *= 8;
    const size_t eb = px_dtype_bytes(k->act);
    void *a = k->alloc(n * eb), *b = k->alloc(n * eb), *out = k->alloc(n * eb);
    double best = 0;
    if (a && b && out) {
        k->add(out, a, b, n);
        k->sync();
        for (int r = 0; r < (o->quick ? 3 : 8); r++) {
            double t0 = px_now_s();
            k->add(out, a, b, n);
            k->sync();
            double bw = 3.0 * n * eb / (px_now_s() - t0);
            if (bw > best)
                best = bw;
        }
    }
    k->free(a);
    k->free(b);
    k->free(out);
    return best;
}
