/* The CPU kernels against references written here: every forward against a straightforward
 * float64 implementation, every backward against central finite differences of that reference
 * (loss = sum(out * w) for a random weighting w), and the contracts of kernels.h that callers
 * rely on: which outputs accumulate (+=) and which are overwritten, strides into packed
 * buffers, GQA group sums, causal masking with a query offset, vocabulary shards, and the
 * dropout stream. Problems are tiny so that the test stays fast under AddressSanitizer. */
#include <cblas.h>
#include <float.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "test.h"

static const KernBackend *K;

/* ---- helpers ---- */

static uint64_t rng_state = 0x5eed;

/* uniform in [-1, 1) (splitmix64) */
static double rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "test_kernels: out of memory\n");
        exit(1);
    }
    return p;
}

static float *fnew(size_t n) { return xcalloc(n, sizeof(float)); }
static double *dnew(size_t n) { return xcalloc(n, sizeof(double)); }

/* n floats uniform in [offset - scale, offset + scale) */
static float *frand(size_t n, double scale, double offset)
{
    float *x = fnew(n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(offset + scale * rnd());
    return x;
}

/* the fp32 values in double, so that the reference sees exactly what the kernel sees */
static double *dfrom(const float *x, size_t n)
{
    double *d = dnew(n);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static float *fcopy(const float *x, size_t n)
{
    float *f = fnew(n);
    memcpy(f, x, n * sizeof *f);
    return f;
}

static void fill(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Every element: |actual - expected| <= abs + rel |expected|; the first miss fails the test. */
static void check_close(const char *file, int line, const char *what, const double *expected,
                        const float *actual, size_t n, double rel, double abs)
{
    px_test_checks++;
    for (size_t i = 0; i < n; i++) {
        double e = expected[i], a = actual[i];
        if (!(fabs(a - e) <= abs + rel * fabs(e))) {
            fprintf(stderr,
                    "%s:%d: FAILED: %s[%zu]\n  expected %.9g (within %g relative + %g absolute)\n"
                    "  actual   %.9g (%.3g off)\n",
                    file, line, what, i, e, rel, abs, a, fabs(a - e));
            exit(1);
        }
    }
}

#define FWD_REL 1e-5
#define FWD_ABS 1e-6
#define GRAD_REL 1e-4
#define GRAD_ABS 1e-5
#define FD_EPS 1e-6

#define CHECK_CLOSE(expected, actual, n, rel, abs)                                                \
    check_close(__FILE__, __LINE__, #actual, (expected), (actual), (n), (rel), (abs))
#define CHECK_FWD(expected, actual, n) CHECK_CLOSE(expected, actual, n, FWD_REL, FWD_ABS)
#define CHECK_GRAD(expected, actual, n) CHECK_CLOSE(expected, actual, n, GRAD_REL, GRAD_ABS)

/* Two kernel outputs that should agree (fused vs unfused, recompute vs saved). */
static void check_close_ff(const char *file, int line, const char *what, const float *expected,
                           const float *actual, size_t n, double rel, double abs)
{
    double *e = dfrom(expected, n);
    check_close(file, line, what, e, actual, n, rel, abs);
    free(e);
}
#define CHECK_SAME(expected, actual, n, rel, abs)                                                 \
    check_close_ff(__FILE__, __LINE__, #actual, (expected), (actual), (n), (rel), (abs))

typedef double (*LossFn)(void *ctx);

/* grad[i] = dL/dx[i] by central differences; x (an input of ctx) is perturbed in place and
 * restored. */
static void fd_grad(double *grad, LossFn loss, void *ctx, double *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_EPS;
        double lp = loss(ctx);
        x[i] = x0 - FD_EPS;
        double lm = loss(ctx);
        x[i] = x0;
        grad[i] = (lp - lm) / (2.0 * FD_EPS);
    }
}

/* pre + g, for checking "+=" outputs that were pre-filled with pre */
static double *plus(const float *pre, const double *g, size_t n)
{
    double *r = dnew(n);
    for (size_t i = 0; i < n; i++)
        r[i] = pre[i] + g[i];
    return r;
}

/* ---- backend table and memory ---- */

static void test_table(void)
{
    CHECK_STR("cpu", K->name);
    CHECK_EQ_INT(PX_FP32, K->act);
    CHECK(K == kern_cpu()); /* one table, initialized once */
    /* every entry filled: a forgotten one would crash the first caller, far from here */
#define HAS(f) CHECK(K->f != NULL)
    HAS(alloc); HAS(free); HAS(memset0); HAS(copy); HAS(to_device); HAS(to_host); HAS(sync);
    HAS(matmul); HAS(add_bias); HAS(bias_grad); HAS(layernorm_fwd); HAS(layernorm_bwd);
    HAS(rmsnorm_fwd); HAS(rmsnorm_bwd); HAS(gelu_fwd); HAS(gelu_bwd); HAS(swiglu_fwd);
    HAS(swiglu_bwd); HAS(rope_fwd); HAS(rope_bwd); HAS(attention_fwd); HAS(attention_bwd);
    HAS(add); HAS(add_inplace); HAS(copy_cols); HAS(dropout_fwd); HAS(dropout_bwd); HAS(embedding_fwd);
    HAS(embedding_bwd); HAS(xent_rowmax); HAS(xent_expsum); HAS(xent_finish); HAS(xent_bwd);
    HAS(adamw); HAS(sgd_momentum); HAS(adam8); HAS(sumsq); HAS(grad_sumsq); HAS(all_finite);
    HAS(scale_f32); HAS(cast_to_act);
    HAS(cast_to_f32); HAS(acc_to_f32); HAS(add_bias_f32); HAS(gate_fwd); HAS(gate_bwd);
    HAS(gate_wgrad); HAS(attention_sink_bwd);
#undef HAS
    /* one BLAS thread per rank unless PARALLAX_BLAS_THREADS asks for more: ranks already have
     * a core each */
    const char *bt = getenv("PARALLAX_BLAS_THREADS");
    CHECK_EQ_INT(bt && *bt ? atoi(bt) : 1, openblas_get_num_threads());
    const KernBackend *cuda = kern_cuda(); /* NULL without CUDA; a real table otherwise */
    CHECK(cuda == NULL || cuda->name != NULL);
}

static void test_memory(void)
{
    size_t n = 1000;
    unsigned char *p = K->alloc(n);
    CHECK(p != NULL);
    CHECK_EQ_U64(0, (uintptr_t)p % 64);
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            CHECK_EQ_INT(0, p[i]);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 7 + 1);
    unsigned char *q = K->alloc(n), host[1000];
    K->copy(q, p, n);
    K->to_host(host, q, n);
    CHECK(memcmp(host, p, n) == 0);
    memset(host, 0xAB, n);
    K->to_device(q, host, n);
    CHECK(memcmp(host, q, n) == 0);
    K->memset0(q + 10, 20);
    CHECK_EQ_INT(0, q[10]);
    CHECK_EQ_INT(0, q[29]);
    CHECK_EQ_INT(0xAB, q[9]);
    CHECK_EQ_INT(0xAB, q[30]);
    K->copy(q, p, 0); /* zero bytes: nothing happens */
    K->sync();
    void *z = K->alloc(0);
    CHECK(z != NULL);
    K->free(z);
    K->free(p);
    K->free(q);
    K->free(NULL);
}

/* ---- matmul, bias ---- */

static void test_matmul(void)
{
    const int m = 5, n = 7, k = 6;
    const float alpha = 0.7f;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            for (int bi = 0; bi < 2; bi++) {
                const float beta = bi ? 0.5f : 0.0f;
                float *a = frand((size_t)m * k, 1, 0), *b = frand((size_t)k * n, 1, 0);
                float *c = frand((size_t)m * n, 1, 0);
                double *ref = dnew((size_t)m * n);
                for (int i = 0; i < m; i++) {
                    for (int j = 0; j < n; j++) {
                        double s = 0.0;
                        for (int p = 0; p < k; p++) {
                            double av = ta ? a[p * m + i] : a[i * k + p];
                            double bv = tb ? b[j * k + p] : b[p * n + j];
                            s += av * bv;
                        }
                        ref[i * n + j] = alpha * s + (double)beta * c[i * n + j];
                    }
                }
                /* beta = 0 must not read C (a workspace may hold anything, NaN included) */
                if (beta == 0.0f)
                    fill(c, (size_t)m * n, NAN);
                K->matmul(c, PX_FP32, a, b, m, n, k, ta, tb, alpha, beta);
                CHECK_FWD(ref, c, (size_t)m * n);
                free(a);
                free(b);
                free(c);
                free(ref);
            }
        }
    }
    /* k = 0: the product is empty and only beta applies */
    float c[4] = {1, 2, 3, 4}, dummy = 0;
    K->matmul(c, PX_FP32, &dummy, &dummy, 2, 2, 0, 0, 0, 1.0f, 0.5f);
    CHECK_REL(1.5, c[2], 1e-7);
}

/* A linear layer, y = x W^T + b, and its backward through matmul and bias_grad exactly as the
 * example at the top of kernels.h, against finite differences. */
typedef struct {
    int N, IN, OUT;
    double *x, *w, *b, *wy, *y;
} LinearCtx;

static void linear_ref(LinearCtx *c)
{
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OUT; o++) {
            double s = c->b[o];
            for (int i = 0; i < c->IN; i++)
                s += c->x[n * c->IN + i] * c->w[o * c->IN + i];
            c->y[n * c->OUT + o] = s;
        }
}

static double linear_loss(void *ctx)
{
    LinearCtx *c = ctx;
    linear_ref(c);
    return dot(c->y, c->wy, (size_t)c->N * c->OUT);
}

static void test_linear(void)
{
    LinearCtx c = {.N = 4, .IN = 5, .OUT = 3};
    size_t nx = (size_t)c.N * c.IN, nw = (size_t)c.OUT * c.IN, ny = (size_t)c.N * c.OUT;
    float *x = frand(nx, 1, 0), *w = frand(nw, 1, 0), *b = frand(c.OUT, 1, 0);
    float *dy = frand(ny, 1, 0), *y = fnew(ny), *dx = frand(nx, 1, 0);
    float *dw0 = frand(nw, 1, 0), *db0 = frand(c.OUT, 1, 0);
    float *dw = fcopy(dw0, nw), *db = fcopy(db0, c.OUT);
    c.x = dfrom(x, nx), c.w = dfrom(w, nw), c.b = dfrom(b, c.OUT), c.wy = dfrom(dy, ny);
    c.y = dnew(ny);

    K->matmul(y, K->act, x, w, c.N, c.OUT, c.IN, 0, 1, 1.0f, 0.0f);
    K->add_bias(y, b, c.N, c.OUT);
    linear_ref(&c);
    CHECK_FWD(c.y, y, ny);

    K->matmul(dx, K->act, dy, w, c.N, c.IN, c.OUT, 0, 0, 1.0f, 0.0f);
    K->matmul(dw, PX_FP32, dy, x, c.OUT, c.IN, c.N, 1, 0, 1.0f, 1.0f);
    K->bias_grad(db, dy, c.N, c.OUT);
    double *gx = dnew(nx), *gw = dnew(nw), *gb = dnew(c.OUT);
    fd_grad(gx, linear_loss, &c, c.x, nx);
    fd_grad(gw, linear_loss, &c, c.w, nw);
    fd_grad(gb, linear_loss, &c, c.b, c.OUT);
    CHECK_GRAD(gx, dx, nx);
    double *ew = plus(dw0, gw, nw), *eb = plus(db0, gb, c.OUT);
    CHECK_GRAD(ew, dw, nw);
    CHECK_GRAD(eb, db, c.OUT);

    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw0), free(db0), free(dw);
    free(db), free(c.x), free(c.w), free(c.b), free(c.wy), free(c.y), free(gx), free(gw);
    free(gb), free(ew), free(eb);
}

/* add_bias, and bias_grad over more than one 64-column block with many rows (the linear
 * layer above checks bias_grad against finite differences) */
static void test_bias(void)
{
    const int N = 37, C = 70;
    size_t nc = (size_t)N * C;
    float *out = frand(nc, 1, 0), *bias = frand(C, 1, 0), *dy = frand(nc, 1, 0);
    float *dbias = frand(C, 1, 0);
    double *ref = dnew(nc), *refb = dnew(C);
    for (int c = 0; c < C; c++) {
        refb[c] = dbias[c];
        for (int n = 0; n < N; n++) {
            ref[n * C + c] = (double)out[n * C + c] + bias[c];
            refb[c] += dy[n * C + c];
        }
    }
    K->add_bias(out, bias, N, C);
    CHECK_FWD(ref, out, nc);
    K->bias_grad(dbias, dy, N, C);
    CHECK_FWD(refb, dbias, C);
    free(out), free(bias), free(dy), free(dbias), free(ref), free(refb);
}

/* ---- norms ---- */

typedef struct {
    int N, C, rms;
    double eps;
    double *x, *w, *b, *wy, *y;
} NormCtx;

static void norm_ref(NormCtx *c)
{
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (size_t)n * c->C;
        double mean = 0.0, var = 0.0;
        if (!c->rms) {
            for (int i = 0; i < c->C; i++)
                mean += x[i];
            mean /= c->C;
        }
        for (int i = 0; i < c->C; i++)
            var += (x[i] - mean) * (x[i] - mean);
        double rstd = 1.0 / sqrt(var / c->C + c->eps);
        for (int i = 0; i < c->C; i++)
            c->y[(size_t)n * c->C + i] = (x[i] - mean) * rstd * c->w[i] + (c->b ? c->b[i] : 0.0);
    }
}

static double norm_loss(void *ctx)
{
    NormCtx *c = ctx;
    norm_ref(c);
    return dot(c->y, c->wy, (size_t)c->N * c->C);
}

static void test_norm(int rms, int with_bias, int N, int C)
{
    const float eps = 1e-5f;
    size_t nc = (size_t)N * C;
    /* an offset, so that the mean matters */
    float *x = frand(nc, 1.5, 0.3), *w = frand(C, 0.5, 1.0), *b = frand(C, 1, 0);
    float *dy = frand(nc, 1, 0), *y = fnew(nc);
    NormCtx c = {.N = N, .C = C, .rms = rms, .eps = eps};
    c.x = dfrom(x, nc), c.w = dfrom(w, C), c.b = with_bias ? dfrom(b, C) : NULL;
    c.wy = dfrom(dy, nc), c.y = dnew(nc);

    if (rms)
        K->rmsnorm_fwd(y, x, w, N, C, eps);
    else
        K->layernorm_fwd(y, x, w, with_bias ? b : NULL, N, C, eps);
    norm_ref(&c);
    CHECK_FWD(c.y, y, nc);

    /* the gradients accumulate: pre-fill them with values that must survive */
    float *dx0 = frand(nc, 1, 0), *dw0 = frand(C, 1, 0), *db0 = frand(C, 1, 0);
    float *dx = fcopy(dx0, nc), *dw = fcopy(dw0, C), *db = fcopy(db0, C);
    if (rms)
        K->rmsnorm_bwd(dx, dw, dy, x, w, N, C, eps);
    else
        K->layernorm_bwd(dx, dw, with_bias ? db : NULL, dy, x, w, N, C, eps);
    double *gx = dnew(nc), *gw = dnew(C), *gb = dnew(C);
    fd_grad(gx, norm_loss, &c, c.x, nc);
    fd_grad(gw, norm_loss, &c, c.w, C);
    double *ex = plus(dx0, gx, nc), *ew = plus(dw0, gw, C);
    CHECK_GRAD(ex, dx, nc);
    CHECK_GRAD(ew, dw, C);
    if (with_bias) {
        fd_grad(gb, norm_loss, &c, c.b, C);
        double *eb = plus(db0, gb, C);
        CHECK_GRAD(eb, db, C);
        free(eb);
    } else {
        CHECK(memcmp(db, db0, C * sizeof *db) == 0); /* db = NULL: nothing to write */
    }
    free(x), free(w), free(b), free(dy), free(y), free(c.x), free(c.w), free(c.b), free(c.wy);
    free(c.y), free(dx0), free(dw0), free(db0), free(dx), free(dw), free(db), free(gx);
    free(gw), free(gb), free(ex), free(ew);
}

/* ---- activations ---- */

typedef struct {
    int swiglu, N, F; /* gelu: n = N */
    double *x, *wy, *y;
} ActCtx;

static double gelu_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}

static void act_ref(ActCtx *c)
{
    if (!c->swiglu) {
        for (int i = 0; i < c->N; i++)
            c->y[i] = gelu_ref(c->x[i]);
        return;
    }
    for (int n = 0; n < c->N; n++)
        for (int i = 0; i < c->F; i++) {
            double g = c->x[(size_t)n * 2 * c->F + i], u = c->x[(size_t)n * 2 * c->F + c->F + i];
            c->y[(size_t)n * c->F + i] = g / (1.0 + exp(-g)) * u;
        }
}

static double act_loss(void *ctx)
{
    ActCtx *c = ctx;
    act_ref(c);
    return dot(c->y, c->wy, c->swiglu ? (size_t)c->N * c->F : (size_t)c->N);
}

static void test_gelu(void)
{
    const int n = 41;
    float *x = frand(n, 4, 0), *dy = frand(n, 1, 0), *y = fnew(n), *dx = fnew(n);
    x[0] = 0.0f, x[1] = -8.0f, x[2] = 8.0f;
    ActCtx c = {.N = n, .x = dfrom(x, n), .wy = dfrom(dy, n), .y = dnew(n)};
    K->gelu_fwd(y, x, n);
    act_ref(&c);
    CHECK_FWD(c.y, y, n);
    fill(dx, n, 123.0f); /* overwritten, not accumulated */
    K->gelu_bwd(dx, x, dy, n);
    double *g = dnew(n);
    fd_grad(g, act_loss, &c, c.x, n);
    CHECK_GRAD(g, dx, n);
    /* in place on the gradient, as a caller short of memory would call it */
    K->gelu_bwd(dy, x, dy, n);
    CHECK_SAME(dx, dy, n, 0, 0);
    free(x), free(dy), free(y), free(dx), free(c.x), free(c.wy), free(c.y), free(g);
}

static void test_swiglu(void)
{
    const int N = 3, F = 5;
    size_t ni = (size_t)N * 2 * F, no = (size_t)N * F;
    float *x = frand(ni, 3, 0), *dy = frand(no, 1, 0), *y = fnew(no), *dx = fnew(ni);
    ActCtx c = {.swiglu = 1, .N = N, .F = F, .x = dfrom(x, ni), .wy = dfrom(dy, no)};
    c.y = dnew(no);
    K->swiglu_fwd(y, x, N, F);
    act_ref(&c);
    CHECK_FWD(c.y, y, no);
    fill(dx, ni, -5.0f);
    K->swiglu_bwd(dx, x, dy, N, F);
    double *g = dnew(ni);
    fd_grad(g, act_loss, &c, c.x, ni);
    CHECK_GRAD(g, dx, ni);
    free(x), free(dy), free(y), free(dx), free(c.x), free(c.wy), free(c.y), free(g);
}

/* ---- rope ---- */

typedef struct {
    int B, T, H, KV, D, pos_offset;
    double theta;
    double *x, *wy, *y;
} RopeCtx;

static void rope_ref(RopeCtx *c)
{
    size_t row = (size_t)(c->H + 2 * c->KV) * c->D, n = (size_t)c->B * c->T * row;
    memcpy(c->y, c->x, n * sizeof *c->y);
    int half = c->D / 2;
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int h = 0; h < c->H + c->KV; h++) /* Q and K heads; V stays */
                for (int i = 0; i < half; i++) {
                    size_t o = ((size_t)b * c->T + t) * row + (size_t)h * c->D + i;
                    double ang = (c->pos_offset + t) * pow(c->theta, -2.0 * i / c->D);
                    double x1 = c->x[o], x2 = c->x[o + half];
                    c->y[o] = x1 * cos(ang) - x2 * sin(ang);
                    c->y[o + half] = x2 * cos(ang) + x1 * sin(ang);
                }
}

static double rope_loss(void *ctx)
{
    RopeCtx *c = ctx;
    rope_ref(c);
    return dot(c->y, c->wy, (size_t)c->B * c->T * (c->H + 2 * c->KV) * c->D);
}

static void test_rope(void)
{
    RopeCtx c = {.B = 2, .T = 3, .H = 2, .KV = 1, .D = 8, .pos_offset = 5, .theta = 10000.0};
    size_t n = (size_t)c.B * c.T * (c.H + 2 * c.KV) * c.D;
    float *x = frand(n, 1, 0), *y = fcopy(x, n), *dy = frand(n, 1, 0), *dx = fcopy(dy, n);
    c.x = dfrom(x, n), c.wy = dfrom(dy, n), c.y = dnew(n);
    K->rope_fwd(y, c.B, c.T, c.H, c.KV, c.D, c.pos_offset, (float)c.theta);
    rope_ref(&c);
    CHECK_FWD(c.y, y, n);
    /* the backward is the inverse rotation */
    K->rope_bwd(y, c.B, c.T, c.H, c.KV, c.D, c.pos_offset, (float)c.theta);
    CHECK_SAME(x, y, n, 1e-6, 1e-6);
    K->rope_bwd(dx, c.B, c.T, c.H, c.KV, c.D, c.pos_offset, (float)c.theta);
    double *g = dnew(n);
    fd_grad(g, rope_loss, &c, c.x, n);
    CHECK_GRAD(g, dx, n);
    free(x), free(y), free(dy), free(dx), free(c.x), free(c.wy), free(c.y), free(g);
}

/* ---- attention ---- */

/* Dense float64 copies: q [B,Tq,H*D], k and v [B,Tk,KV*D], whatever the kernel's strides. */
typedef struct {
    int B, Tq, Tk, H, KV, D, q_offset;
    double scale, dropout;
    uint64_t seed;
    double *q, *k, *v, *wy, *y, *probs, *lse;
    double *sinks; /* [H] or NULL: each head's sink logit joins its softmax denominator */
} AttnCtx;

static void attn_ref(AttnCtx *c)
{
    int rep = c->H / c->KV;
    double *s = dnew((size_t)c->Tk);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int t = 0; t < c->Tq; t++) {
                const double *q = c->q + ((size_t)b * c->Tq + t) * c->H * c->D + (size_t)h * c->D;
                size_t bht = (((size_t)b * c->H + h) * c->Tq + t);
                int g = h / rep;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < c->Tk; j++) {
                    const double *k =
                        c->k + ((size_t)b * c->Tk + j) * c->KV * c->D + (size_t)g * c->D;
                    s[j] = c->scale * dot(q, k, (size_t)c->D);
                    if (j <= c->q_offset + t && s[j] > mx)
                        mx = s[j];
                }
                if (c->sinks && c->sinks[h] > mx)
                    mx = c->sinks[h];
                for (int j = 0; j <= c->q_offset + t && j < c->Tk; j++)
                    sum += exp(s[j] - mx);
                if (c->sinks)
                    sum += exp(c->sinks[h] - mx);
                c->lse[bht] = mx + log(sum);
                double *y = c->y + ((size_t)b * c->Tq + t) * c->H * c->D + (size_t)h * c->D;
                for (int d = 0; d < c->D; d++)
                    y[d] = 0.0;
                for (int j = 0; j < c->Tk; j++) {
                    double p = j <= c->q_offset + t ? exp(s[j] - mx) / sum : 0.0;
                    c->probs[bht * c->Tk + j] = p;
                    if (c->dropout > 0)
                        p = kern_dropout_keep(c->seed, bht * c->Tk + j, (float)c->dropout)
                                ? p / (1.0 - (double)(float)c->dropout)
                                : 0.0;
                    const double *v =
                        c->v + ((size_t)b * c->Tk + j) * c->KV * c->D + (size_t)g * c->D;
                    for (int d = 0; d < c->D; d++)
                        y[d] += p * v[d];
                }
            }
    free(s);
}

static double attn_loss(void *ctx)
{
    AttnCtx *c = ctx;
    attn_ref(c);
    return dot(c->y, c->wy, (size_t)c->B * c->Tq * c->H * c->D);
}

/* Copies rows of `width` elements between a dense array and a strided view. */
static void to_view(float *view, int stride, const float *dense, int rows, int width)
{
    for (int r = 0; r < rows; r++)
        memcpy(view + (size_t)r * stride, dense + (size_t)r * width, (size_t)width * sizeof *view);
}

static void from_view(float *dense, const float *view, int stride, int rows, int width)
{
    for (int r = 0; r < rows; r++)
        memcpy(dense + (size_t)r * width, view + (size_t)r * stride, (size_t)width * sizeof *dense);
}

typedef struct {
    int B, Tq, Tk, H, KV, D, q_offset;
    int packed;    /* Tq == Tk: q, k, v in one [B,T,(H+2KV)*D] buffer, as after the QKV matmul */
    float dropout; /* unfused path only */
    int fd;        /* finite differences (small problems); else fused vs unfused only */
    int sinks;     /* attention sinks (GPT-OSS), their gradient by attention_sink_bwd */
} AttnCase;

#define SENTINEL 777.0f

static void test_attention(AttnCase ac)
{
    const int B = ac.B, Tq = ac.Tq, Tk = ac.Tk, H = ac.H, KV = ac.KV, D = ac.D;
    const size_t nq = (size_t)B * Tq * H * D, nk = (size_t)B * Tk * KV * D;
    const size_t np = (size_t)B * H * Tq * Tk, nl = (size_t)B * H * Tq;
    const float scale = 1.0f / sqrtf((float)D);
    const uint64_t seed = 0xC0FFEE;
    float *q = frand(nq, 1.5, 0), *k = frand(nk, 1.5, 0), *v = frand(nk, 1, 0);
    float *dout = frand(nq, 1, 0);
    AttnCtx c = {.B = B, .Tq = Tq, .Tk = Tk, .H = H, .KV = KV, .D = D, .q_offset = ac.q_offset,
                 .scale = scale, .dropout = ac.dropout, .seed = seed};
    c.q = dfrom(q, nq), c.k = dfrom(k, nk), c.v = dfrom(v, nk), c.wy = dfrom(dout, nq);
    c.y = dnew(nq), c.probs = dnew(np), c.lse = dnew(nl);
    /* sinks of either sign, one above every score of its head's rows */
    float *sinks = ac.sinks ? frand((size_t)H, 2, 0) : NULL;
    if (sinks)
        sinks[0] = 6.0f;
    c.sinks = sinks ? dfrom(sinks, (size_t)H) : NULL;
    attn_ref(&c);

    /* Views. packed: one qkv row per token, and a dqkv of the same layout. Otherwise (context
     * parallel, Tk > Tq) q rows padded by 3 elements and k, v interleaved in one kv buffer;
     * the padding must survive the backward. */
    int qs, ks, vs;
    size_t nbq, nbkv;
    if (ac.packed) {
        qs = ks = vs = (H + 2 * KV) * D;
        nbq = (size_t)B * Tq * qs, nbkv = 0;
    } else {
        qs = H * D + 3, ks = vs = 2 * KV * D;
        nbq = (size_t)B * Tq * qs, nbkv = (size_t)B * Tk * ks;
    }
    float *bq = fnew(nbq), *bkv = fnew(nbkv), *dbq = fnew(nbq), *dbkv = fnew(nbkv);
    fill(bq, nbq, SENTINEL), fill(bkv, nbkv, SENTINEL);
    float *vq = bq, *vk = ac.packed ? bq + H * D : bkv;
    float *vv = ac.packed ? bq + (H + KV) * D : bkv + KV * D;
    float *dvq = dbq, *dvk = ac.packed ? dbq + H * D : dbkv;
    float *dvv = ac.packed ? dbq + (H + KV) * D : dbkv + KV * D;
    to_view(vq, qs, q, B * Tq, H * D);
    to_view(vk, ks, k, B * Tk, KV * D);
    to_view(vv, vs, v, B * Tk, KV * D);

    /* unfused forward */
    float *out = fnew(nq), *probs = fnew(np), *pdrop = fnew(np), *dscores = fnew(np);
    uint8_t *mask = xcalloc(np, 1);
    fill(out, nq, SENTINEL), fill(probs, np, SENTINEL);
    KernAttnFwd f = {.B = B, .Tq = Tq, .Tk = Tk, .H = H, .KV = KV, .D = D,
                     .q_offset = ac.q_offset, .scale = scale, .q = vq, .k = vk, .v = vv,
                     .q_stride = qs, .k_stride = ks, .v_stride = vs, .out = out, .probs = probs,
                     .dropout = ac.dropout, .seed = seed, .mask = mask, .probs_drop = pdrop,
                     .sinks = sinks};
    K->attention_fwd(&f);
    CHECK_FWD(c.y, out, nq);
    CHECK_FWD(c.probs, probs, np); /* masked entries exactly 0 */
    if (ac.dropout > 0) {
        double *ed = dnew(np);
        for (size_t i = 0; i < np; i++) {
            int keep = kern_dropout_keep(seed, i, ac.dropout);
            CHECK_EQ_INT(keep, mask[i]);
            ed[i] = keep ? c.probs[i] / (1.0 - (double)ac.dropout) : 0.0;
        }
        CHECK_FWD(ed, pdrop, np);
        free(ed);
        /* a recompute with the same seed draws the same mask; another seed does not */
        uint8_t *mask2 = xcalloc(np, 1);
        float *out2 = fnew(nq), *probs2 = fnew(np), *pdrop2 = fnew(np);
        KernAttnFwd f2 = f;
        f2.mask = mask2, f2.out = out2, f2.probs = probs2, f2.probs_drop = pdrop2;
        K->attention_fwd(&f2);
        CHECK(memcmp(mask, mask2, np) == 0);
        CHECK(memcmp(out, out2, nq * sizeof *out) == 0);
        f2.seed = seed + 1;
        K->attention_fwd(&f2);
        CHECK(memcmp(mask, mask2, np) != 0);
        free(mask2), free(out2), free(probs2), free(pdrop2);
    }

    /* unfused backward: dq, dk, dv overwritten (pre-filled with the sentinel) */
    fill(dbq, nbq, SENTINEL), fill(dbkv, nbkv, SENTINEL);
    KernAttnBwd bw = {.B = B, .Tq = Tq, .Tk = Tk, .H = H, .KV = KV, .D = D,
                      .q_offset = ac.q_offset, .scale = scale, .q = vq, .k = vk, .v = vv,
                      .q_stride = qs, .k_stride = ks, .v_stride = vs, .dout = dout, .dq = dvq,
                      .dk = dvk, .dv = dvv, .dq_stride = qs, .dk_stride = ks, .dv_stride = vs,
                      .probs = probs, .dropout = ac.dropout, .mask = mask, .probs_drop = pdrop,
                      .dscores = dscores};
    K->attention_bwd(&bw);
    float *gq = fnew(nq), *gk = fnew(nk), *gv = fnew(nk);
    from_view(gq, dvq, qs, B * Tq, H * D);
    from_view(gk, dvk, ks, B * Tk, KV * D);
    from_view(gv, dvv, vs, B * Tk, KV * D);
    if (!ac.packed)
        for (int r = 0; r < B * Tq; r++)
            for (int i = H * D; i < qs; i++)
                CHECK(dbq[(size_t)r * qs + i] == SENTINEL);
    double *eq = dnew(nq), *ek = dnew(nk), *ev = dnew(nk);
    if (ac.fd) {
        fd_grad(eq, attn_loss, &c, c.q, nq);
        fd_grad(ek, attn_loss, &c, c.k, nk);
        fd_grad(ev, attn_loss, &c, c.v, nk);
        CHECK_GRAD(eq, gq, nq);
        CHECK_GRAD(ek, gk, nk);
        CHECK_GRAD(ev, gv, nk);
    }
    /* the sinks' gradient from the unfused backward's dscores, accumulated into */
    double *es = sinks ? dnew((size_t)H) : NULL;
    float *gs = sinks ? fnew((size_t)H) : NULL;
    if (sinks) {
        fd_grad(es, attn_loss, &c, c.sinks, (size_t)H);
        fill(gs, (size_t)H, 0.5f);
        K->attention_sink_bwd(gs, sinks, NULL, NULL, dscores, B, H, Tq, Tk);
        for (int h = 0; h < H; h++)
            gs[h] -= 0.5f;
        CHECK_GRAD(es, gs, (size_t)H);
    }

    if (ac.dropout == 0) {
        /* fused forward: same output, and the log-sum-exp */
        float *out2 = fnew(nq), *lse = fnew(nl), *drow = fnew(nl);
        fill(out2, nq, SENTINEL);
        KernAttnFwd ff = f;
        ff.out = out2, ff.probs = NULL, ff.mask = NULL, ff.probs_drop = NULL, ff.lse = lse;
        K->attention_fwd(&ff);
        CHECK_FWD(c.y, out2, nq);
        CHECK_FWD(c.lse, lse, nl);
        CHECK_SAME(out, out2, nq, 1e-5, 1e-6);

        /* fused backward: against finite differences, and against the unfused backward */
        fill(dbq, nbq, SENTINEL), fill(dbkv, nbkv, SENTINEL);
        KernAttnBwd fb = bw;
        fb.probs = NULL, fb.dscores = NULL, fb.out = out2, fb.lse = lse, fb.drow = drow;
        K->attention_bwd(&fb);
        float *hq = fnew(nq), *hk = fnew(nk), *hv = fnew(nk);
        from_view(hq, dvq, qs, B * Tq, H * D);
        from_view(hk, dvk, ks, B * Tk, KV * D);
        from_view(hv, dvv, vs, B * Tk, KV * D);
        if (ac.fd) {
            CHECK_GRAD(eq, hq, nq);
            CHECK_GRAD(ek, hk, nk);
            CHECK_GRAD(ev, hv, nk);
        }
        CHECK_SAME(gq, hq, nq, 1e-4, 1e-5);
        CHECK_SAME(gk, hk, nk, 1e-4, 1e-5);
        CHECK_SAME(gv, hv, nk, 1e-4, 1e-5);
        if (sinks) { /* from the fused backward's lse and drow */
            fill(gs, (size_t)H, 0.0f);
            K->attention_sink_bwd(gs, sinks, lse, drow, NULL, B, H, Tq, Tk);
            CHECK_GRAD(es, gs, (size_t)H);
        }
        if (!ac.packed)
            for (int r = 0; r < B * Tq; r++)
                for (int i = H * D; i < qs; i++)
                    CHECK(dbq[(size_t)r * qs + i] == SENTINEL);
        free(out2), free(lse), free(drow), free(hq), free(hk), free(hv);
    }

    free(q), free(k), free(v), free(dout), free(c.q), free(c.k), free(c.v), free(c.wy);
    free(c.y), free(c.probs), free(c.lse), free(bq), free(bkv), free(dbq), free(dbkv);
    free(out), free(probs), free(pdrop), free(dscores), free(mask), free(gq), free(gk), free(gv);
    free(eq), free(ek), free(ev), free(sinks), free(c.sinks), free(es), free(gs);
}

/* ---- the shared experts' gate and the router's bias (GPT-OSS's and Qwen2-MoE's extras) ---- */

/* y = g(x) (hid W^T) with g = sigmoid(x . w), loss = sum(y * wy), over x, w, hid and W */
typedef struct {
    int N, C, F;
    double *x, *w, *hid, *W, *wy;
} GateCtx;

static double gate_loss(void *ctx)
{
    GateCtx *c = ctx;
    double loss = 0.0;
    for (int n = 0; n < c->N; n++) {
        const double g = 1.0 / (1.0 + exp(-dot(c->x + (size_t)n * c->C, c->w, (size_t)c->C)));
        for (int o = 0; o < c->C; o++)
            loss += g * dot(c->hid + (size_t)n * c->F, c->W + (size_t)o * c->F, (size_t)c->F) *
                    c->wy[(size_t)n * c->C + o];
    }
    return loss;
}

/* gate_fwd, and gate_bwd + gate_wgrad with the GEMMs around them as the executor runs them
 * (dhid = dy W before the gate's backward, dW = dy^T hid and dx after), against finite
 * differences; add_bias_f32 against a sum. */
static void test_gate(void)
{
    enum { N = 5, C = 6, F = 4 };
    float *x = frand(N * C, 1, 0), *w = frand(C, 1, 0), *hid = frand(N * F, 1, 0);
    float *W = frand(C * F, 1, 0), *dy = frand(N * C, 1, 0);
    GateCtx c = {.N = N, .C = C, .F = F};
    c.x = dfrom(x, N * C), c.w = dfrom(w, C), c.hid = dfrom(hid, N * F), c.W = dfrom(W, C * F);
    c.wy = dfrom(dy, N * C);
    /* forward: y = g (hid W^T), compared through the loss */
    float *y = fnew(N * C);
    K->matmul(y, PX_FP32, hid, W, N, C, F, 0, 1, 1.0f, 0.0f);
    K->gate_fwd(y, x, w, N, C);
    double got = 0.0;
    for (int i = 0; i < N * C; i++)
        got += (double)y[i] * dy[i];
    CHECK_REL(gate_loss(&c), got, 1e-5);
    /* backward */
    float *dhid = fnew(N * F), *dW = fnew(C * F), *dx = fnew(N * C), *dw = fnew(C), *dl = fnew(N);
    K->matmul(dhid, PX_FP32, dy, W, N, F, C, 0, 0, 1.0f, 0.0f);
    K->gate_bwd(dl, dhid, hid, x, w, N, C, F);
    K->matmul(dW, PX_FP32, dy, hid, C, F, N, 1, 0, 1.0f, 0.0f); /* hid gated in place */
    fill(dx, N * C, 1.0f), fill(dw, C, 1.0f);                   /* both accumulated into */
    K->gate_wgrad(dx, dw, dl, x, w, N, C);
    for (int i = 0; i < N * C; i++)
        dx[i] -= 1.0f;
    for (int i = 0; i < C; i++)
        dw[i] -= 1.0f;
    double *e = dnew(N * C);
    fd_grad(e, gate_loss, &c, c.x, N * C);
    CHECK_GRAD(e, dx, N * C);
    fd_grad(e, gate_loss, &c, c.w, C);
    CHECK_GRAD(e, dw, C);
    fd_grad(e, gate_loss, &c, c.hid, N * F);
    CHECK_GRAD(e, dhid, N * F);
    fd_grad(e, gate_loss, &c, c.W, C * F);
    CHECK_GRAD(e, dW, C * F);
    /* the router's bias on fp32 logits */
    float *lg = frand(N * C, 1, 0), *b = frand(C, 1, 0), *lg0 = fnew(N * C);
    memcpy(lg0, lg, N * C * sizeof *lg);
    K->add_bias_f32(lg, b, N, C);
    for (int i = 0; i < N * C; i++)
        CHECK(lg[i] == lg0[i] + b[i % C]);
    free(x), free(w), free(hid), free(W), free(dy), free(c.x), free(c.w), free(c.hid), free(c.W);
    free(c.wy), free(y), free(dhid), free(dW), free(dx), free(dw), free(dl), free(e), free(lg);
    free(b), free(lg0);
}

/* ---- embedding ---- */

typedef struct {
    int N, T, pos_offset, C, v_start, V;
    const int32_t *tok;
    double *wte, *wpe, *wy, *y;
} EmbCtx;

static void emb_ref(EmbCtx *c)
{
    for (int n = 0; n < c->N; n++)
        for (int i = 0; i < c->C; i++) {
            int local = c->tok[n] - c->v_start;
            double e = local >= 0 && local < c->V ? c->wte[(size_t)local * c->C + i] : 0.0;
            if (c->wpe)
                e += c->wpe[(size_t)(c->pos_offset + n % c->T) * c->C + i];
            c->y[(size_t)n * c->C + i] = e;
        }
}

static double emb_loss(void *ctx)
{
    EmbCtx *c = ctx;
    emb_ref(c);
    return dot(c->y, c->wy, (size_t)c->N * c->C);
}

/* The online softmax's merge: attention over 7 keys (every one visible) equals the merge of
 * the results over keys 0-2 and 3-6, output and log-sum-exp; and merging with a block whose
 * lse is -inf-like (no weight) leaves the first as it was. */
static void test_attention_merge(void)
{
    enum { T = 3, H = 4, KV = 2, D = 5, TK = 7, TA = 3 };
    float *q = frand((size_t)T * H * D, 1, 0), *kv = frand((size_t)TK * 2 * KV * D, 1, 0);
    float *o = fnew((size_t)T * H * D), *oa = fnew((size_t)T * H * D), *ob = fnew((size_t)T * H * D);
    float *lse = fnew((size_t)H * T), *la = fnew((size_t)H * T), *lb = fnew((size_t)H * T);
    const float scale = 0.5f;
    KernAttnFwd f = {.B = 1, .Tq = T, .Tk = TK, .H = H, .KV = KV, .D = D, .q_offset = TK - 1,
                     .scale = scale, .q = q, .k = kv, .v = kv + KV * D, .q_stride = H * D,
                     .k_stride = 2 * KV * D, .v_stride = 2 * KV * D, .out = o, .lse = lse};
    K->attention_fwd(&f);
    f.Tk = TA, f.q_offset = TA - 1, f.out = oa, f.lse = la;
    K->attention_fwd(&f);
    f.Tk = TK - TA, f.q_offset = TK - TA - 1, f.k = kv + (size_t)TA * 2 * KV * D;
    f.v = kv + (size_t)TA * 2 * KV * D + KV * D, f.out = ob, f.lse = lb;
    K->attention_fwd(&f);
    K->attention_merge(oa, la, ob, lb, T, H, D);
    CHECK_SAME(o, oa, (size_t)T * H * D, FWD_REL, FWD_ABS);
    CHECK_SAME(lse, la, (size_t)H * T, FWD_REL, FWD_ABS);
    float *keep = fcopy(o, (size_t)T * H * D);
    fill(lb, (size_t)H * T, -1e30f);
    K->attention_merge(o, lse, ob, lb, T, H, D);
    CHECK_SAME(keep, o, (size_t)T * H * D, 0, 0);
    free(q), free(kv), free(o), free(oa), free(ob), free(lse), free(la), free(lb), free(keep);
}

static void test_embedding(int with_wpe)
{
    /* shard rows 5..9 of a vocabulary of 15; tokens inside and outside it, one repeated */
    const int32_t tok[8] = {5, 0, 9, 12, 7, 7, 14, 4};
    const int N = 8, T = 4, pos_offset = 3, C = 3, v_start = 5, V = 5, P = pos_offset + T + 2;
    size_t ne = (size_t)V * C, np = (size_t)P * C, no = (size_t)N * C;
    float *wte = frand(ne, 1, 0), *wpe = frand(np, 1, 0), *dy = frand(no, 1, 0);
    float *y = fnew(no);
    fill(y, no, SENTINEL);
    EmbCtx c = {.N = N, .T = T, .pos_offset = pos_offset, .C = C, .v_start = v_start, .V = V,
                .tok = tok, .wte = dfrom(wte, ne), .wpe = with_wpe ? dfrom(wpe, np) : NULL,
                .wy = dfrom(dy, no), .y = dnew(no)};
    K->embedding_fwd(y, tok, wte, with_wpe ? wpe : NULL, N, T, pos_offset, C, v_start, V);
    emb_ref(&c);
    CHECK_FWD(c.y, y, no);

    float *dte0 = frand(ne, 1, 0), *dpe0 = frand(np, 1, 0);
    float *dte = fcopy(dte0, ne), *dpe = fcopy(dpe0, np);
    K->embedding_bwd(dte, with_wpe ? dpe : NULL, dy, tok, N, T, pos_offset, C, v_start, V);
    double *gte = dnew(ne), *gpe = dnew(np);
    fd_grad(gte, emb_loss, &c, c.wte, ne);
    double *ete = plus(dte0, gte, ne);
    CHECK_GRAD(ete, dte, ne);
    if (with_wpe) {
        fd_grad(gpe, emb_loss, &c, c.wpe, np);
        double *epe = plus(dpe0, gpe, np);
        CHECK_GRAD(epe, dpe, np);
        free(epe);
    }
    free(wte), free(wpe), free(dy), free(y), free(c.wte), free(c.wpe), free(c.wy), free(c.y);
    free(dte0), free(dpe0), free(dte), free(dpe), free(gte), free(gpe), free(ete);
}

/* ---- cross-entropy ---- */

typedef struct {
    int N, V;
    const int32_t *tok;
    double dloss;
    double *logits, *loss, *probs;
} XentCtx;

static void xent_ref(XentCtx *c)
{
    for (int n = 0; n < c->N; n++) {
        const double *l = c->logits + (size_t)n * c->V;
        double mx = l[0], sum = 0.0;
        for (int i = 1; i < c->V; i++)
            mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < c->V; i++)
            sum += exp(l[i] - mx);
        double lse = mx + log(sum);
        for (int i = 0; i < c->V; i++)
            c->probs[(size_t)n * c->V + i] = exp(l[i] - lse);
        c->loss[n] = lse - l[c->tok[n]];
    }
}

static double xent_loss(void *ctx)
{
    XentCtx *c = ctx;
    xent_ref(c);
    double s = 0.0;
    for (int n = 0; n < c->N; n++)
        s += c->dloss * c->loss[n];
    return s;
}

static void test_xent(void)
{
    const int N = 4, V = 10, split = 6;
    const int32_t tok[4] = {3, 9, 0, 6};
    const float dloss = 0.25f; /* 1/N: a mean over tokens */
    size_t nl = (size_t)N * V;
    float *logits = frand(nl, 3, 0);
    XentCtx c = {.N = N, .V = V, .tok = tok, .dloss = dloss, .logits = dfrom(logits, nl),
                 .loss = dnew(N), .probs = dnew(nl)};
    xent_ref(&c);

    /* one shard: the whole vocabulary */
    float *work = fcopy(logits, nl), rowmax[4], rowsum[4], target[4], loss[4];
    K->xent_rowmax(rowmax, work, N, V);
    K->xent_expsum(rowsum, target, work, rowmax, tok, N, V, 0);
    for (int n = 0; n < N; n++)
        CHECK_EQ_U64(0, memcmp(&target[n], &logits[(size_t)n * V + tok[n]], sizeof(float)));
    K->xent_finish(loss, work, rowsum, rowmax, target, N, V);
    CHECK_FWD(c.loss, loss, N);
    CHECK_FWD(c.probs, work, nl);
    K->xent_bwd(work, tok, N, V, 0, dloss);
    double *g = dnew(nl);
    fd_grad(g, xent_loss, &c, c.logits, nl);
    CHECK_GRAD(g, work, nl);

    /* two shards, [0, split) and [split, V), combined as the all-reduces would: max of the
     * row maxima, sum of the row sums and of the target logits */
    float *s0 = fnew((size_t)N * split), *s1 = fnew((size_t)N * (V - split));
    for (int n = 0; n < N; n++) {
        memcpy(s0 + (size_t)n * split, logits + (size_t)n * V, split * sizeof(float));
        memcpy(s1 + (size_t)n * (V - split), logits + (size_t)n * V + split,
               (V - split) * sizeof(float));
    }
    float m0[4], m1[4], r0[4], r1[4], t0[4], t1[4], l0[4], l1[4];
    K->xent_rowmax(m0, s0, N, split);
    K->xent_rowmax(m1, s1, N, V - split);
    for (int n = 0; n < N; n++)
        m0[n] = m1[n] = m0[n] > m1[n] ? m0[n] : m1[n];
    K->xent_expsum(r0, t0, s0, m0, tok, N, split, 0);
    K->xent_expsum(r1, t1, s1, m1, tok, N, V - split, split);
    for (int n = 0; n < N; n++) {
        CHECK(t0[n] == 0.0f || t1[n] == 0.0f); /* the target is in one shard only */
        r0[n] = r1[n] = r0[n] + r1[n];
        t0[n] = t1[n] = t0[n] + t1[n];
    }
    K->xent_finish(l0, s0, r0, m0, t0, N, split);
    K->xent_finish(l1, s1, r1, m1, t1, N, V - split);
    CHECK_FWD(c.loss, l0, N);
    CHECK_FWD(c.loss, l1, N);
    K->xent_bwd(s0, tok, N, split, 0, dloss);
    K->xent_bwd(s1, tok, N, V - split, split, dloss);
    float *joined = fnew(nl);
    for (int n = 0; n < N; n++) {
        memcpy(joined + (size_t)n * V, s0 + (size_t)n * split, split * sizeof(float));
        memcpy(joined + (size_t)n * V + split, s1 + (size_t)n * (V - split),
               (V - split) * sizeof(float));
    }
    CHECK_GRAD(g, joined, nl);
    free(logits), free(c.logits), free(c.loss), free(c.probs), free(work), free(g), free(s0);
    free(s1), free(joined);
}

/* ---- optimizers ---- */

static void test_adamw(int refresh)
{
    const size_t n = 13;
    const int steps = 5;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *master = frand(n, 1, 0), *m = fnew(n), *v = fnew(n), *param = fnew(n);
    double *rw = dfrom(master, n), *rm = dnew(n), *rv = dnew(n);
    for (int t = 1; t <= steps; t++) {
        float *grad = frand(n, 1, 0);
        K->adamw(refresh ? param : NULL, master, grad, m, v, n, lr, b1, b2, eps, wd, t, gs);
        for (size_t i = 0; i < n; i++) {
            double g = (double)grad[i] * gs;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g;
            rv[i] = b2 * rv[i] + (1.0 - b2) * g * g;
            double mh = rm[i] / (1.0 - pow(b1, t)), vh = rv[i] / (1.0 - pow(b2, t));
            rw[i] -= lr * (mh / (sqrt(vh) + eps) + wd * rw[i]);
        }
        CHECK_FWD(rm, m, n);
        CHECK_FWD(rv, v, n);
        CHECK_FWD(rw, master, n);
        if (refresh)
            CHECK(memcmp(param, master, n * sizeof *param) == 0);
        else
            for (size_t i = 0; i < n; i++)
                CHECK(param[i] == 0.0f);
        free(grad);
    }
    free(master), free(m), free(v), free(param), free(rw), free(rm), free(rv);
}

static void test_sgd(void)
{
    const size_t n = 11;
    const float lr = 0.05f, mu = 0.9f, wd = 0.01f, gs = 2.0f;
    float *master = frand(n, 1, 0), *mom = fnew(n), *param = fnew(n);
    double *rw = dfrom(master, n), *rm = dnew(n);
    for (int t = 1; t <= 4; t++) {
        float *grad = frand(n, 1, 0);
        K->sgd_momentum(param, master, grad, mom, n, lr, mu, wd, gs);
        for (size_t i = 0; i < n; i++) {
            double g = (double)grad[i] * gs + wd * rw[i];
            rm[i] = mu * rm[i] + g;
            rw[i] -= lr * rm[i];
        }
        CHECK_FWD(rm, mom, n);
        CHECK_FWD(rw, master, n);
        CHECK(memcmp(param, master, n * sizeof *param) == 0);
        free(grad);
    }
    free(master), free(mom), free(param), free(rw), free(rm);
}

/* A context-parallel part's unfused call (queries q0 .. q0+C-1 of H heads against keys
 * 0 .. q0+C-1) with the stream placed as the whole S x S call's (offset q0 x S, rows S and
 * heads S x S apart) draws, entry for entry, the whole call's mask over its block; with the
 * default placement it would not. */
static void test_attention_drop_block(void)
{
    enum { S = 8, H = 3, D = 4, C = 2, Q0 = 5 };
    const int tk = Q0 + C;
    const float p = 0.3f;
    const uint64_t seed = 0xD1CE;
    float *qkv = frand((size_t)S * 3 * H * D, 1, 0);
    float *out = fnew((size_t)S * H * D), *probs = fnew((size_t)H * S * S);
    float *pd = fnew((size_t)H * S * S);
    uint8_t *mask = xcalloc((size_t)H * S * S, 1);
    KernAttnFwd f = {.B = 1, .Tq = S, .Tk = S, .H = H, .KV = H, .D = D, .scale = 0.5f,
                     .q = qkv, .k = qkv + H * D, .v = qkv + 2 * H * D, .q_stride = 3 * H * D,
                     .k_stride = 3 * H * D, .v_stride = 3 * H * D, .out = out, .probs = probs,
                     .dropout = p, .seed = seed, .mask = mask, .probs_drop = pd};
    K->attention_fwd(&f);
    float *pout = fnew((size_t)C * H * D), *pprobs = fnew((size_t)H * C * tk);
    float *ppd = fnew((size_t)H * C * tk);
    uint8_t *pmask = xcalloc((size_t)H * C * tk, 1);
    KernAttnFwd g = f;
    g.Tq = C, g.Tk = tk, g.q_offset = Q0, g.q = qkv + (size_t)Q0 * 3 * H * D;
    g.out = pout, g.probs = pprobs, g.mask = pmask, g.probs_drop = ppd;
    g.seed = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(Q0 * S); /* exec_stream_at's shift */
    g.drop_row = S, g.drop_head = (uint64_t)S * S;
    K->attention_fwd(&g);
    int differ = 0;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < C; t++)
            for (int j = 0; j < tk; j++) {
                const uint8_t want = mask[((size_t)h * S + Q0 + t) * S + j];
                const uint8_t got = pmask[((size_t)h * C + t) * tk + j];
                if (got != want)
                    CHECK_EQ_INT(want, got);
            }
    g.drop_row = 0, g.drop_head = 0; /* the call's own [H, C, tk] */
    K->attention_fwd(&g);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < C; t++)
            for (int j = 0; j < tk; j++)
                differ += pmask[((size_t)h * C + t) * tk + j] != mask[((size_t)h * S + Q0 + t) * S + j];
    CHECK(differ > 0);
    free(qkv), free(out), free(probs), free(pd), free(mask);
    free(pout), free(pprobs), free(ppd), free(pmask);
}

/* ---- elementwise, dropout, fp32 helpers ---- */

static void test_elementwise(void)
{
    const size_t n = 37;
    float *a = frand(n, 1, 0), *b = frand(n, 1, 0), *o = fnew(n);
    double *e = dnew(n);
    for (size_t i = 0; i < n; i++)
        e[i] = (double)a[i] + b[i];
    K->add(o, a, b, n);
    CHECK_FWD(e, o, n);
    float *a2 = fcopy(a, n);
    K->add(a2, a2, b, n); /* out aliasing an input */
    CHECK_FWD(e, a2, n);
    K->add_inplace(a, b, n);
    CHECK_FWD(e, a, n);

    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)b[i] * b[i];
    CHECK_REL(ss, K->sumsq(b, n), 1e-12);
    CHECK(K->sumsq(b, 0) == 0.0);

    CHECK_EQ_INT(1, K->all_finite(b, n));
    CHECK_EQ_INT(1, K->all_finite(b, 0));
    float keep = b[17];
    b[17] = NAN;
    CHECK_EQ_INT(0, K->all_finite(b, n));
    b[17] = keep;
    b[n - 1] = INFINITY;
    CHECK_EQ_INT(0, K->all_finite(b, n));
    b[n - 1] = 0.0f;
    b[0] = -INFINITY;
    CHECK_EQ_INT(0, K->all_finite(b, n));
    b[0] = FLT_MAX;
    CHECK_EQ_INT(1, K->all_finite(b, n));

    for (size_t i = 0; i < n; i++)
        e[i] = b[i] * 0.125;
    K->scale_f32(b, n, 0.125f);
    CHECK_FWD(e, b, n);

    /* casts are exact on the CPU (act is fp32); acc_to_f32 accumulates */
    float *act = fnew(n), *back = fnew(n);
    K->cast_to_act(act, b, n);
    K->cast_to_f32(back, act, n);
    CHECK(memcmp(back, b, n * sizeof *b) == 0);
    for (size_t i = 0; i < n; i++)
        e[i] = (double)back[i] + act[i];
    K->acc_to_f32(back, act, n);
    CHECK_FWD(e, back, n);
    free(a), free(b), free(o), free(e), free(a2), free(act), free(back);
}

typedef struct {
    size_t n;
    double p;
    const uint8_t *mask;
    double *x, *wy;
} DropCtx;

static double drop_loss(void *ctx)
{
    DropCtx *c = ctx;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++)
        s += (c->mask[i] ? c->x[i] / (1.0 - c->p) : 0.0) * c->wy[i];
    return s;
}

static void test_dropout(void)
{
    const size_t n = 200000;
    const float p = 0.2f;
    const uint64_t seed = 1234;
    float *x = frand(n, 1, 0), *y = fnew(n), *y2 = fnew(n), *dy = frand(n, 1, 0), *dx = fnew(n);
    uint8_t *mask = xcalloc(n, 1), *mask2 = xcalloc(n, 1);
    K->dropout_fwd(y, mask, x, n, p, seed);
    size_t kept = 0;
    double *e = dnew(n);
    for (size_t i = 0; i < n; i++) {
        kept += mask[i];
        if (mask[i] != kern_dropout_keep(seed, i, p))
            CHECK_EQ_INT(kern_dropout_keep(seed, i, p), mask[i]);
        e[i] = mask[i] ? x[i] / (1.0 - (double)p) : 0.0;
    }
    CHECK_FWD(e, y, n);
    /* keep rate: standard deviation sqrt(p(1-p)/n) ~ 0.0009, so 0.005 is over 5 of them */
    CHECK(fabs((double)kept / n - (1.0 - p)) < 0.005);
    K->dropout_fwd(y2, mask2, x, n, p, seed);
    CHECK(memcmp(mask, mask2, n) == 0);
    K->dropout_fwd(y2, mask2, x, n, p, seed + 1);
    CHECK(memcmp(mask, mask2, n) != 0);

    K->dropout_bwd(dx, dy, mask, n, p);
    for (size_t i = 0; i < n; i++)
        e[i] = mask[i] ? dy[i] / (1.0 - (double)p) : 0.0;
    CHECK_FWD(e, dx, n);
    /* and against finite differences on a short prefix */
    const size_t nf = 50;
    DropCtx c = {.n = nf, .p = p, .mask = mask, .x = dfrom(x, nf), .wy = dfrom(dy, nf)};
    double *g = dnew(nf);
    fd_grad(g, drop_loss, &c, c.x, nf);
    CHECK_GRAD(g, dx, nf);

    /* p = 0 keeps everything unchanged */
    K->dropout_fwd(y2, mask2, x, n, 0.0f, seed);
    CHECK(memcmp(y2, x, n * sizeof *x) == 0);
    for (size_t i = 0; i < n; i++)
        if (mask2[i] != 1)
            CHECK_EQ_INT(1, mask2[i]);
    free(x), free(y), free(y2), free(dy), free(dx), free(mask), free(mask2), free(e), free(c.x);
    free(c.wy), free(g);
}

/* A block of columns between strided rows, copied and added, and nothing else touched. */
static void test_copy_cols(void)
{
    float src[3 * 5], dst[3 * 4];
    for (int i = 0; i < 15; i++)
        src[i] = (float)i;
    for (int i = 0; i < 12; i++)
        dst[i] = -1.0f;
    K->copy_cols(dst + 1, 4, src + 2, 5, 3, 2, 0);
    const float want[12] = {-1, 2, 3, -1, -1, 7, 8, -1, -1, 12, 13, -1};
    for (int i = 0; i < 12; i++)
        CHECK(dst[i] == want[i]);
    K->copy_cols(dst + 1, 4, src + 2, 5, 3, 2, 1);
    for (int i = 0; i < 12; i++)
        CHECK(dst[i] == (want[i] < 0 ? -1.0f : 2.0f * want[i]));
}

/* MXFP8 attention's second operands (KernAttnFwd.v_col, KernAttnBwd's q_col, k_col, dout_col),
 * on both paths: copies of the first operands' values give the first operands' results bit for
 * bit; a zero second copy zeroes exactly the products that reduce over a sequence and read it
 * (O = P V: v_col; dV = P^T dO: dout_col; dQ = dS K: k_col; dK = dS^T Q: q_col) and leaves the
 * rest bit for bit (the scores, the log-sum-exp and dP = dO V^T read the first copies). */
enum { SC_FIRST = 0, SC_SAME, SC_ZERO_V, SC_ZERO_DO, SC_ZERO_K, SC_ZERO_Q, SC_CASES };

typedef struct {
    float *out, *lse, *probs, *dq, *dk, *dv;
} AttnRun;

static AttnRun attn_second_run(int fused, int which, const float *q, const float *k,
                               const float *v, const float *dout, const float *zero, int B, int T,
                               int H, int KV, int D)
{
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D;
    const size_t np = (size_t)B * H * T * T, nl = (size_t)B * H * T;
    AttnRun r = {fnew(nq), fnew(nl), fnew(np), fnew(nq), fnew(nk), fnew(nk)};
    float *qs = fnew(nq), *ks = fnew(nk), *vs = fnew(nk), *ds = fnew(nq);
    memcpy(qs, q, nq * sizeof *q), memcpy(ks, k, nk * sizeof *k);
    memcpy(vs, v, nk * sizeof *v), memcpy(ds, dout, nq * sizeof *dout);
    float *dscores = fnew(np), *drow = fnew(nl);
    const int same = which == SC_SAME;
    KernAttnFwd f = {.B = B, .Tq = T, .Tk = T, .H = H, .KV = KV, .D = D,
                     .scale = 1.0f / sqrtf((float)D), .q = q, .k = k, .v = v, .q_stride = H * D,
                     .k_stride = KV * D, .v_stride = KV * D, .out = r.out,
                     .v_col = same ? vs : which == SC_ZERO_V ? zero : NULL};
    if (fused)
        f.lse = r.lse;
    else
        f.probs = r.probs;
    K->attention_fwd(&f);
    KernAttnBwd b = {.B = B, .Tq = T, .Tk = T, .H = H, .KV = KV, .D = D, .scale = f.scale,
                     .q = q, .k = k, .v = v, .q_stride = H * D, .k_stride = KV * D,
                     .v_stride = KV * D, .out = r.out, .dout = dout, .dq = r.dq, .dk = r.dk,
                     .dv = r.dv, .dq_stride = H * D, .dk_stride = KV * D, .dv_stride = KV * D,
                     .q_col = same ? qs : which == SC_ZERO_Q ? zero : NULL,
                     .k_col = same ? ks : which == SC_ZERO_K ? zero : NULL,
                     .dout_col = same ? ds : which == SC_ZERO_DO ? zero : NULL};
    if (fused)
        b.lse = r.lse, b.drow = drow;
    else
        b.probs = r.probs, b.dscores = dscores;
    if (which != SC_ZERO_V) /* the backward reads the forward's output: a zero one is no case */
        K->attention_bwd(&b);
    free(qs), free(ks), free(vs), free(ds), free(dscores), free(drow);
    return r;
}

/* a == b bit for bit (n floats), or (b NULL) a all zero */
static void check_bits(const char *what, int fused, int which, const float *a, const float *b,
                       size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b ? memcmp(&a[i], &b[i], sizeof *a) != 0 : a[i] != 0.0f) {
            fprintf(stderr, "FAILED: attention's second copies (%s, case %d): %s[%zu] = %.9g, "
                    "expected %.9g\n", fused ? "fused" : "unfused", which, what, i, a[i],
                    b ? b[i] : 0.0);
            exit(1);
        }
}

static void test_attention_second_copies(void)
{
    enum { B = 2, T = 40, H = 4, KV = 2, D = 4 }; /* GQA; more keys than one tile of 32 */
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KV * D;
    const size_t np = (size_t)B * H * T * T, nl = (size_t)B * H * T;
    float *q = frand(nq, 1.5, 0), *k = frand(nk, 1.5, 0), *v = frand(nk, 1, 0);
    float *dout = frand(nq, 1, 0), *zero = fnew(nq);
    for (int fused = 0; fused < 2; fused++) {
        AttnRun r[SC_CASES];
        for (int w = 0; w < SC_CASES; w++)
            r[w] = attn_second_run(fused, w, q, k, v, dout, zero, B, T, H, KV, D);
        const AttnRun *a = &r[SC_FIRST];
        for (int w = SC_SAME; w < SC_CASES; w++) {
            const AttnRun *x = &r[w];
            check_bits("out", fused, w, x->out, w == SC_ZERO_V ? NULL : a->out, nq);
            if (fused)
                check_bits("lse", fused, w, x->lse, a->lse, nl);
            else
                check_bits("probs", fused, w, x->probs, a->probs, np);
            if (w == SC_ZERO_V)
                continue;
            check_bits("dq", fused, w, x->dq, w == SC_ZERO_K ? NULL : a->dq, nq);
            check_bits("dk", fused, w, x->dk, w == SC_ZERO_Q ? NULL : a->dk, nk);
            check_bits("dv", fused, w, x->dv, w == SC_ZERO_DO ? NULL : a->dv, nk);
        }
        for (int w = 0; w < SC_CASES; w++)
            free(r[w].out), free(r[w].lse), free(r[w].probs), free(r[w].dq), free(r[w].dk),
                free(r[w].dv);
    }
    free(q), free(k), free(v), free(dout), free(zero);
    printf("  attention's second copies (MXFP8): each product over a sequence reads its own, "
           "fused and unfused\n");
}

int main(void)
{
    K = kern_cpu();
    test_table();
    test_copy_cols();
    test_memory();
    test_matmul();
    test_linear();
    test_bias();
    test_norm(0, 1, 4, 7);   /* layernorm */
    test_norm(0, 0, 4, 7);   /* layernorm without bias */
    test_norm(0, 1, 35, 67); /* across the backward's row chunks and column blocks */
    test_norm(1, 0, 4, 7);   /* rmsnorm */
    test_norm(1, 0, 35, 67);
    test_gelu();
    test_swiglu();
    test_rope();
    /* GQA (4 heads on 2 KV groups), a packed qkv buffer, plain causal */
    test_attention((AttnCase){.B = 2, .Tq = 4, .Tk = 4, .H = 4, .KV = 2, .D = 4, .packed = 1,
                              .fd = 1});
    /* context parallel, a middle rank: queries at 1..3 of 6 keys (keys 4, 5 never seen) */
    test_attention((AttnCase){.B = 2, .Tq = 3, .Tk = 6, .H = 4, .KV = 2, .D = 4, .q_offset = 1,
                              .fd = 1});
    /* context parallel, the last rank, with dropout on the probabilities */
    test_attention((AttnCase){.B = 2, .Tq = 3, .Tk = 6, .H = 4, .KV = 2, .D = 4, .q_offset = 3,
                              .dropout = 0.25f, .fd = 1});
    test_attention((AttnCase){.B = 1, .Tq = 4, .Tk = 4, .H = 4, .KV = 2, .D = 4, .packed = 1,
                              .dropout = 0.5f, .fd = 1});
    /* multi-head (KV = H), and more keys than one block of the fused forward */
    test_attention((AttnCase){.B = 1, .Tq = 70, .Tk = 150, .H = 2, .KV = 2, .D = 8,
                              .q_offset = 80});
    test_attention((AttnCase){.B = 1, .Tq = 130, .Tk = 130, .H = 2, .KV = 1, .D = 3,
                              .packed = 1});
    /* attention sinks (GPT-OSS), unfused and fused; a context-parallel part with dropout */
    test_attention((AttnCase){.B = 2, .Tq = 4, .Tk = 4, .H = 4, .KV = 2, .D = 4, .packed = 1,
                              .fd = 1, .sinks = 1});
    test_attention((AttnCase){.B = 2, .Tq = 3, .Tk = 6, .H = 4, .KV = 2, .D = 4, .q_offset = 3,
                              .dropout = 0.25f, .fd = 1, .sinks = 1});
    test_attention((AttnCase){.B = 1, .Tq = 70, .Tk = 150, .H = 2, .KV = 2, .D = 8,
                              .q_offset = 80, .sinks = 1});
    test_attention_drop_block();
    test_attention_second_copies();
    test_attention_merge();
    test_gate();
    test_embedding(1);
    test_embedding(0);
    test_xent();
    test_adamw(1);
    test_adamw(0);
    test_sgd();
    test_elementwise();
    test_dropout();
    TEST_DONE("kernels");
}
