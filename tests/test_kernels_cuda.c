/* The CUDA backend against the CPU backend, its reference: every entry of the table, forward and
 * backward, on random inputs, for bf16, fp16 and fp32 activations (fp32: the FP8 kernels reading
 * and writing fp32, the GEMMs in full fp32, no act rounding at all). Inputs are rounded to the
 * act dtype first, so both backends see the same values and the difference measures only the
 * CUDA backend's own rounding (its outputs in act, its summation orders, the act-dtype scores of
 * the unfused attention). Each comparison prints the largest absolute error and the largest
 * relative one, measured against |expected| + rms(expected) so that entries near zero are judged
 * on the scale of their tensor; a comparison fails above its tolerance, a multiple of the act
 * dtype's epsilon (2^-8 bf16, 2^-11 fp16; for fp32 2^-19, run_suite says why) for act outputs
 * and a small constant for fp32 ones. Exact where the contract is exact: dropout masks (the
 * counter-based stream draws byte for byte the same), casts, scaling, the preserved padding of
 * strided views, and MoE's chosen experts, counts, row map and permuted rows.
 *
 * Every failed comparison is reported and the run goes on, so that one run on a GPU shows every
 * kernel that disagrees; it exits 1 at the end, counting them.
 *
 * Exits 77 (ctest: skipped) when kern_cuda() is NULL: no GPU or no driver. Built against
 * kernels/cuda/emu instead (test_kernels_cuda_emu), the backend runs on the CPU and the test
 * uses small shapes only; on a GPU it adds larger ones (PARALLAX_TEST_LARGE=1 or 0 says
 * otherwise). */
#include <float.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"
#include "test.h"

/* ---- failures: reported, counted, and the run goes on ----
 * One run on a GPU (a scarce machine) must show every kernel that disagrees, not the first. A
 * failed comparison prints its line and counts; the checks of test.h are redefined here to do
 * the same (a check inside a loop prints at its first failure only and counts the others);
 * main exits 1 at the end. REQUIRE stays fatal, for what the rest of a test cannot go without
 * (an allocation, the backend). A CUDA error or a broken contract still aborts inside the
 * backend: a device error is sticky, and nothing after it could be trusted. */

enum { FAIL_SITES = 256 };
static struct {
    const char *file;
    int line;
    long count;
} fail_site[FAIL_SITES];
static int n_fail_sites;
static long failures;

/* Counts a failure at file:line: 1 when it is the first there (say it), 0 after. */
static int failed_at(const char *file, int line)
{
    failures++;
    for (int i = 0; i < n_fail_sites; i++)
        if (fail_site[i].line == line && !strcmp(fail_site[i].file, file)) {
            fail_site[i].count++;
            return 0;
        }
    if (n_fail_sites < FAIL_SITES) {
        fail_site[n_fail_sites].file = file;
        fail_site[n_fail_sites].line = line;
        fail_site[n_fail_sites].count = 1;
        n_fail_sites++;
    }
    return 1;
}

#define REQUIRE(cond)                                                                             \
    do {                                                                                          \
        px_test_checks++;                                                                         \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "%s:%d: FAILED (cannot go on): %s\n", __FILE__, __LINE__, #cond);     \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

#undef CHECK
#define CHECK(cond)                                                                               \
    do {                                                                                          \
        px_test_checks++;                                                                         \
        if (!(cond) && failed_at(__FILE__, __LINE__))                                             \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);                    \
    } while (0)

#undef CHECK_EQ_INT
#define CHECK_EQ_INT(expected, actual)                                                            \
    do {                                                                                          \
        long long e_ = (long long)(expected), a_ = (long long)(actual);                           \
        px_test_checks++;                                                                         \
        if (e_ != a_ && failed_at(__FILE__, __LINE__))                                            \
            fprintf(stderr, "%s:%d: FAILED: %s\n  expected %lld\n  actual   %lld\n", __FILE__,     \
                    __LINE__, #actual, e_, a_);                                                   \
    } while (0)

#undef CHECK_REL
#define CHECK_REL(expected, actual, rel)                                                          \
    do {                                                                                          \
        double e_ = (double)(expected), a_ = (double)(actual);                                    \
        px_test_checks++;                                                                         \
        if (!(fabs(a_ - e_) <= (rel) * fabs(e_)) && failed_at(__FILE__, __LINE__))                \
            fprintf(stderr, "%s:%d: FAILED: %s\n  expected %.9g (within %g relative)\n  actual   " \
                    "%.9g\n", __FILE__, __LINE__, #actual, e_, (double)(rel), a_);                \
    } while (0)

static const KernBackend *G; /* under test */
static const KernBackend *R; /* the reference: kern_cpu() */
static double EPS;           /* unit roundoff of the act dtype: 2^-8 bf16, 2^-11 fp16 */
static int large;            /* larger shapes too: on a real GPU, or PARALLAX_TEST_LARGE=1 */

/* ---- host helpers ---- */

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

static void *xmalloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "test_kernels_cuda: out of memory\n");
        exit(1);
    }
    return p;
}

static float *fnew(size_t n) { return xmalloc(n * sizeof(float)); }

static float *fcopy(const float *x, size_t n)
{
    float *y = fnew(n);
    if (n)
        memcpy(y, x, n * sizeof *y);
    return y;
}

static void fill(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

/* ---- 16-bit floats on the host, round to nearest even (as __float2bfloat16, __float2half) ---- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t bf16_bits(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_float(uint16_t h) { return u2f((uint32_t)h << 16); }

static uint16_t fp16_bits(float f)
{
    const uint32_t u = f2u(f), sign = (u >> 16) & 0x8000u;
    const float a = fabsf(f);
    if (a != a)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) /* subnormal: a multiple of 2^-24 */
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    uint32_t e = ((u >> 23) & 0xffu) - 127 + 15, m = u & 0x7fffffu;
    uint32_t r = (e << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

static float fp16_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const int e = (h >> 10) & 0x1f;
    const uint32_t m = h & 0x3ffu;
    if (e == 0x1f)
        return u2f(sign | 0x7f800000u | (m << 13));
    if (e == 0)
        return sign ? -ldexpf((float)m, -24) : ldexpf((float)m, -24);
    return u2f(sign | ((uint32_t)(e - 15 + 127) << 23) | (m << 13));
}

/* An act element's bits (fp32's all 32), and back */
static uint32_t act_bits(float f)
{
    return G->act == PX_FP32 ? f2u(f) : G->act == PX_BF16 ? bf16_bits(f) : fp16_bits(f);
}
static float act_float(uint32_t h)
{
    return G->act == PX_FP32 ? u2f(h) : G->act == PX_BF16 ? bf16_float((uint16_t)h)
                                                         : fp16_float((uint16_t)h);
}
static float act_round(float f) { return act_float(act_bits(f)); }

/* element i of an act buffer in host memory: AB bytes (2, or 4 for fp32 activations) */
static size_t AB;
static void act_put(void *buf, size_t i, float x)
{
    const uint32_t b = act_bits(x);
    if (AB == 4) {
        memcpy((char *)buf + i * 4, &b, 4);
    } else {
        const uint16_t h = (uint16_t)b;
        memcpy((char *)buf + i * 2, &h, 2);
    }
}
static uint32_t act_get(const void *buf, size_t i)
{
    uint32_t b = 0;
    uint16_t h = 0;
    if (AB == 4)
        memcpy(&b, (const char *)buf + i * 4, 4);
    else
        memcpy(&h, (const char *)buf + i * 2, 2), b = h;
    return b;
}

/* n values uniform in [offset - scale, offset + scale), rounded to the act dtype */
static float *arand(size_t n, double scale, double offset)
{
    float *x = fnew(n);
    for (size_t i = 0; i < n; i++)
        x[i] = act_round((float)(offset + scale * rnd()));
    return x;
}

/* n fp32 values uniform in [offset - scale, offset + scale) */
static float *frand(size_t n, double scale, double offset)
{
    float *x = fnew(n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(offset + scale * rnd());
    return x;
}

/* ---- device buffers of the backend under test ---- */

static void *dalloc(size_t bytes)
{
    void *p = G->alloc(bytes);
    if (!p) {
        fprintf(stderr, "test_kernels_cuda: device allocation of %zu bytes failed\n", bytes);
        exit(1);
    }
    return p;
}

/* a device act buffer holding x (rounded to act) */
static void *up_act(const float *x, size_t n)
{
    void *h = xmalloc(n * AB);
    for (size_t i = 0; i < n; i++)
        act_put(h, i, x[i]);
    void *d = dalloc(n * AB);
    G->to_device(d, h, n * AB);
    free(h);
    return d;
}

static void set_act(void *d, const float *x, size_t n)
{
    void *h = xmalloc(n * AB);
    for (size_t i = 0; i < n; i++)
        act_put(h, i, x[i]);
    G->to_device(d, h, n * AB);
    free(h);
}

static void *up_bytes(const void *x, size_t bytes)
{
    void *d = dalloc(bytes);
    G->to_device(d, x, bytes);
    return d;
}

static float *up_f32(const float *x, size_t n) { return up_bytes(x, n * sizeof *x); }

static float *down_act(const void *d, size_t n)
{
    void *h = xmalloc(n * AB);
    G->to_host(h, d, n * AB);
    float *x = fnew(n);
    for (size_t i = 0; i < n; i++)
        x[i] = act_float(act_get(h, i));
    free(h);
    return x;
}

/* the bits of n act elements, each widened to 32 bits */
static uint32_t *down_bits(const void *d, size_t n)
{
    void *h = xmalloc(n * AB);
    G->to_host(h, d, n * AB);
    uint32_t *b = xmalloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++)
        b[i] = act_get(h, i);
    free(h);
    return b;
}

static float *down_f32(const float *d, size_t n)
{
    float *x = fnew(n);
    G->to_host(x, d, n * sizeof *x);
    return x;
}

/* ---- comparisons ---- */

static const char *act_name(void) { return px_dtype_name(G->act); }

/* Fails when max_i |a_i - e_i| / (|e_i| + rms(e)) exceeds tol; prints both maxima either way. */
static void compare(const char *file, int line, const char *op, const char *what,
                    const float *e, const float *a, size_t n, double tol)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)e[i] * e[i];
    double floor = n ? sqrt(ss / (double)n) : 0.0;
    if (!(floor > 1e-30))
        floor = 1e-30;
    double max_abs = 0.0, max_rel = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - e[i]);
        if (a[i] != a[i] || (isinf(a[i]) && a[i] != e[i]))
            d = INFINITY;
        if (a[i] == e[i])
            d = 0.0; /* equal infinities */
        double r = d / (fabs(e[i]) + floor);
        if (d > max_abs)
            max_abs = d;
        if (r > max_rel) {
            max_rel = r;
            worst = i;
        }
    }
    printf("  %-6s %-16s %-12s n=%-8zu max abs %.3e  max rel %.3e  (tol %.1e)\n", act_name(), op,
           what, n, max_abs, max_rel, tol);
    px_test_checks++;
    if (!(max_rel <= tol)) {
        fprintf(stderr,
                "%s:%d: FAILED: %s %s (%s): element %zu\n  expected %.9g\n  actual   %.9g "
                "(%.3g relative to |expected| + rms %.3g; tolerance %.3g)\n",
                file, line, op, what, act_name(), worst, e[worst], a[worst], max_rel, floor, tol);
        failures++;
    }
}
#define COMPARE(op, what, e, a, n, tol)                                                           \
    compare(__FILE__, __LINE__, (op), (what), (e), (a), (n), (tol))

static void compare_bytes(const char *file, int line, const char *op, const char *what,
                          const void *e, const void *a, size_t bytes)
{
    px_test_checks++;
    const unsigned char *x = e, *y = a;
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < bytes; i++)
        if (x[i] != y[i] && differ++ == 0)
            first = i;
    if (differ) {
        fprintf(stderr, "%s:%d: FAILED: %s %s (%s): %zu of %zu bytes differ, the first byte %zu\n"
                "  expected %d\n  actual   %d\n", file, line, op, what, act_name(), differ, bytes,
                first, x[first], y[first]);
        failures++;
        return;
    }
    printf("  %-6s %-16s %-12s %zu bytes identical\n", act_name(), op, what, bytes);
}
#define COMPARE_BYTES(op, what, e, a, bytes)                                                      \
    compare_bytes(__FILE__, __LINE__, (op), (what), (e), (a), (bytes))

/* Tolerances in units of the act dtype's unit roundoff: rounding an fp32 result to act once is
 * off by at most 1 (a tie), two results a rounding apart by 2. The unfused attention rounds its
 * scores, probabilities, dP and dS to act, and sums dK, dV over the heads of a KV group in act:
 * its errors grow with the row length (measured under kernels/cuda/emu at the larger shapes:
 * out 5.4, probs 2.5, dq 9.3, dk 10.2, dv 5.6), hence its wider tolerances; the fused one keeps
 * everything in fp32 and rounds once (under 0.9). */
#define T_ACT(k) ((k) * EPS)
#define T_F32 1e-4 /* fp32 outputs: summation order and libm differences only */

/* ---- the table and memory ---- */

static void test_table(void)
{
#define HAS(f) CHECK(G->f != NULL)
    HAS(name); HAS(alloc); HAS(free); HAS(memset0); HAS(copy); HAS(to_device); HAS(to_host);
    HAS(sync); HAS(matmul); HAS(add_bias); HAS(bias_grad); HAS(layernorm_fwd);
    HAS(layernorm_bwd); HAS(rmsnorm_fwd); HAS(rmsnorm_bwd); HAS(gelu_fwd); HAS(gelu_bwd);
    HAS(swiglu_fwd); HAS(swiglu_bwd); HAS(rope_fwd); HAS(rope_bwd); HAS(attention_fwd);
    HAS(attention_bwd); HAS(attention_merge); HAS(add); HAS(add_inplace); HAS(copy_cols); HAS(dropout_fwd); HAS(dropout_bwd);
    HAS(embedding_fwd); HAS(embedding_bwd); HAS(xent_rowmax); HAS(xent_expsum);
    HAS(xent_finish); HAS(xent_bwd); HAS(adamw); HAS(sgd_momentum); HAS(adam8); HAS(sumsq);
    HAS(grad_sumsq); HAS(all_finite);
    HAS(scale_f32); HAS(cast_to_act); HAS(cast_to_f32); HAS(acc_to_f32);
    HAS(moe_route_fwd); HAS(moe_route_bwd); HAS(moe_counts); HAS(moe_aux_fwd);
    HAS(moe_aux_bwd); HAS(moe_permute); HAS(moe_permute_bwd); HAS(moe_unpermute);
    HAS(moe_unpermute_bwd); HAS(moe_drop); HAS(moe_dense); HAS(moe_sparse); HAS(moe_pick);
    HAS(fp8_quantize); HAS(fp8_dequantize);
    HAS(fp8_transpose); HAS(matmul_fp8); HAS(fp8_amax_update); HAS(fp8_piece_amax);
    HAS(fp8_block_scales); HAS(fp8_piece_quantize); HAS(matmul_fp8_split); HAS(add_bias_f32);
    HAS(gate_fwd); HAS(gate_bwd); HAS(gate_wgrad); HAS(attention_sink_bwd);
#undef HAS
    CHECK(strncmp(G->name, "cuda", 4) == 0);
}

static void test_memory(void)
{
    const size_t n = 1000;
    unsigned char host[1000], back[1000];
    unsigned char *p = G->alloc(n);
    REQUIRE(p != NULL);
    G->to_host(back, p, n);
    for (size_t i = 0; i < n; i++)
        if (back[i] != 0)
            CHECK_EQ_INT(0, back[i]); /* zero-filled */
    for (size_t i = 0; i < n; i++)
        host[i] = (unsigned char)(i * 7 + 1);
    G->to_device(p, host, n);
    unsigned char *q = G->alloc(n);
    G->copy(q, p, n);
    G->to_host(back, q, n);
    CHECK(memcmp(back, host, n) == 0);
    G->memset0(q + 10, 20);
    G->to_host(back, q, n);
    CHECK_EQ_INT(0, back[10]);
    CHECK_EQ_INT(0, back[29]);
    CHECK_EQ_INT(host[9], back[9]);
    CHECK_EQ_INT(host[30], back[30]);
    G->copy(q, p, 0); /* zero bytes: nothing happens */
    G->memset0(q, 0);
    G->sync();
    void *z = G->alloc(0);
    REQUIRE(z != NULL);
    G->free(z);
    G->free(p);
    G->free(q);
    G->free(NULL);
    printf("  %-6s memory: alloc zero-fills, copies, memset0 and free behave\n", act_name());
}

/* ---- matrix products ---- */

static void test_matmul_case(int m, int n, int k, int ta, int tb)
{
    const size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    float *a = arand(na, 1, 0), *b = arand(nb, 1, 0), *c0 = arand(nc, 1, 0);
    void *da = up_act(a, na), *db = up_act(b, nb);
    char what[64];
    /* act output, beta = 0 (c not read: prefilled with garbage) and beta = 0.75 */
    for (int with_beta = 0; with_beta < 2; with_beta++) {
        const float alpha = 0.5f, beta = with_beta ? 0.75f : 0.0f;
        float *ec = fcopy(c0, nc);
        R->matmul(ec, PX_FP32, a, b, m, n, k, ta, tb, alpha, beta);
        void *dc = up_act(c0, nc);
        G->matmul(dc, G->act, da, db, m, n, k, ta, tb, alpha, beta);
        float *gc = down_act(dc, nc);
        snprintf(what, sizeof what, "%dx%dx%d %c%c b%g", m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N',
                 (double)beta);
        COMPARE("matmul act", what, ec, gc, nc, T_ACT(1.5));
        free(ec), free(gc), G->free(dc);
    }
    /* fp32 output accumulated (a weight gradient: beta = 1) */
    float *ec = fcopy(c0, nc);
    R->matmul(ec, PX_FP32, a, b, m, n, k, ta, tb, 1.0f, 1.0f);
    float *dc = up_f32(c0, nc);
    G->matmul(dc, PX_FP32, da, db, m, n, k, ta, tb, 1.0f, 1.0f);
    float *gc = down_f32(dc, nc);
    snprintf(what, sizeof what, "%dx%dx%d %c%c +=", m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N');
    COMPARE("matmul fp32", what, ec, gc, nc, T_F32);
    free(ec), free(gc), G->free(dc);
    free(a), free(b), free(c0), G->free(da), G->free(db);
}

static void test_matmul(void)
{
    static const int shapes[][3] = {{5, 7, 3}, {33, 17, 65}, {64, 48, 32}, {1, 9, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                test_matmul_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb);
    if (large) {
        test_matmul_case(512, 768, 1024, 0, 1); /* a linear layer's forward */
        test_matmul_case(768, 1024, 512, 1, 0); /* its weight gradient */
    }
    /* k = 0: c = beta c; m = 0: nothing */
    const size_t nc = 6 * 4;
    float *c0 = arand(nc, 1, 0), *ec = fnew(nc);
    for (size_t i = 0; i < nc; i++)
        ec[i] = 0.5f * c0[i];
    void *dc = up_act(c0, nc);
    G->matmul(dc, G->act, dc, dc, 6, 4, 0, 0, 0, 1.0f, 0.5f);
    float *gc = down_act(dc, nc);
    COMPARE("matmul act", "k=0 b0.5", ec, gc, nc, T_ACT(1.01));
    free(gc);
    G->matmul(dc, G->act, dc, dc, 6, 4, 0, 0, 0, 1.0f, 0.0f);
    gc = down_act(dc, nc);
    fill(ec, nc, 0.0f);
    COMPARE("matmul act", "k=0 b0", ec, gc, nc, 0.0);
    G->matmul(dc, G->act, dc, dc, 0, 4, 5, 0, 0, 1.0f, 0.0f);
    free(c0), free(ec), free(gc), G->free(dc);
}

static void test_bias(void)
{
    const int N = 300, C = 70;
    const size_t n = (size_t)N * C;
    float *out = arand(n, 1, 0), *bias = arand(C, 1, 0), *dout = arand(n, 1, 0);
    float *db0 = frand(C, 1, 0);
    float *eo = fcopy(out, n), *edb = fcopy(db0, C);
    R->add_bias(eo, bias, N, C);
    R->bias_grad(edb, dout, N, C);
    void *dout_ = up_act(out, n), *dbias = up_act(bias, C), *ddo = up_act(dout, n);
    float *ddb = up_f32(db0, C);
    G->add_bias(dout_, dbias, N, C);
    G->bias_grad(ddb, ddo, N, C);
    float *go = down_act(dout_, n), *gdb = down_f32(ddb, C);
    COMPARE("add_bias", "out", eo, go, n, T_ACT(1.01));
    COMPARE("bias_grad", "dbias +=", edb, gdb, C, T_F32);
    free(out), free(bias), free(dout), free(db0), free(eo), free(edb), free(go), free(gdb);
    G->free(dout_), G->free(dbias), G->free(ddo), G->free(ddb);
}

/* ---- norms ---- */

static void test_norm(int rms, int with_bias, int N, int C)
{
    const size_t n = (size_t)N * C;
    const float eps = 1e-5f;
    float *x = arand(n, 1.0, 0.3), *w = arand(C, 0.5, 1.0), *b = arand(C, 0.5, 0.0);
    float *dy = arand(n, 1.0, 0.0), *dx0 = arand(n, 1.0, 0.0);
    float *dw0 = frand(C, 1, 0), *db0 = frand(C, 1, 0);
    float *eo = fnew(n), *edx = fcopy(dx0, n), *edw = fcopy(dw0, C), *edb = fcopy(db0, C);
    void *dxx = up_act(x, n), *dww = up_act(w, C), *dbb = up_act(b, C), *ddy = up_act(dy, n);
    void *ddx = up_act(dx0, n), *dout = dalloc(n * AB);
    float *ddw = up_f32(dw0, C), *ddb = up_f32(db0, C);
    const char *op = rms ? "rmsnorm" : "layernorm";
    char what[64];
    if (rms) {
        R->rmsnorm_fwd(eo, x, w, N, C, eps);
        R->rmsnorm_bwd(edx, edw, dy, x, w, N, C, eps);
        G->rmsnorm_fwd(dout, dxx, dww, N, C, eps);
        G->rmsnorm_bwd(ddx, ddw, ddy, dxx, dww, N, C, eps);
    } else {
        R->layernorm_fwd(eo, x, w, with_bias ? b : NULL, N, C, eps);
        R->layernorm_bwd(edx, edw, with_bias ? edb : NULL, dy, x, w, N, C, eps);
        G->layernorm_fwd(dout, dxx, dww, with_bias ? dbb : NULL, N, C, eps);
        G->layernorm_bwd(ddx, ddw, with_bias ? ddb : NULL, ddy, dxx, dww, N, C, eps);
    }
    float *go = down_act(dout, n), *gdx = down_act(ddx, n), *gdw = down_f32(ddw, C);
    float *gdb = down_f32(ddb, C);
    snprintf(what, sizeof what, "%dx%d%s", N, C, with_bias ? " bias" : "");
    COMPARE(op, what, eo, go, n, T_ACT(1.5));
    COMPARE(op, "dinp +=", edx, gdx, n, T_ACT(2));
    COMPARE(op, "dw +=", edw, gdw, C, T_F32);
    COMPARE(op, "db", edb, gdb, C, T_F32); /* unchanged when there is no bias */
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0), free(eo), free(edx);
    free(edw), free(edb), free(go), free(gdx), free(gdw), free(gdb);
    G->free(dxx), G->free(dww), G->free(dbb), G->free(ddy), G->free(ddx), G->free(dout);
    G->free(ddw), G->free(ddb);
}

/* ---- activations ---- */

static void test_gelu(void)
{
    const size_t n = 4099;
    float *x = arand(n, 4, 0), *dy = arand(n, 1, 0), *eo = fnew(n), *edx = fnew(n);
    R->gelu_fwd(eo, x, n);
    R->gelu_bwd(edx, x, dy, n);
    void *dx = up_act(x, n), *ddy = up_act(dy, n), *dout = dalloc(n * AB);
    G->gelu_fwd(dout, dx, n);
    G->gelu_bwd(ddy, dx, ddy, n); /* dinp aliasing dout, as the executor calls it */
    float *go = down_act(dout, n), *gdx = down_act(ddy, n);
    COMPARE("gelu", "fwd", eo, go, n, T_ACT(1.5));
    COMPARE("gelu", "bwd in place", edx, gdx, n, T_ACT(1.5));
    free(x), free(dy), free(eo), free(edx), free(go), free(gdx);
    G->free(dx), G->free(ddy), G->free(dout);
}

static void test_swiglu(void)
{
    const int N = 13, F = 77;
    const size_t ni = (size_t)N * 2 * F, no = (size_t)N * F;
    float *x = arand(ni, 4, 0), *dy = arand(no, 1, 0), *eo = fnew(no), *edx = fnew(ni);
    R->swiglu_fwd(eo, x, N, F);
    R->swiglu_bwd(edx, x, dy, N, F);
    void *dx = up_act(x, ni), *ddy = up_act(dy, no), *dout = dalloc(no * AB);
    void *ddx = dalloc(ni * AB);
    G->swiglu_fwd(dout, dx, N, F);
    G->swiglu_bwd(ddx, dx, ddy, N, F);
    float *go = down_act(dout, no), *gdx = down_act(ddx, ni);
    COMPARE("swiglu", "fwd", eo, go, no, T_ACT(1.5));
    COMPARE("swiglu", "bwd", edx, gdx, ni, T_ACT(1.5));
    G->swiglu_bwd(dx, dx, ddy, N, F); /* dinp aliasing inp: the same result */
    float *gdx2 = down_act(dx, ni);
    COMPARE("swiglu", "bwd in place", gdx, gdx2, ni, 0.0);
    free(x), free(dy), free(eo), free(edx), free(go), free(gdx), free(gdx2);
    G->free(dx), G->free(ddy), G->free(dout), G->free(ddx);
}

/* A block of columns between strided views, written and added (copy_cols): equal bit for bit
 * when copied, within a rounding when added. */
static void test_copy_cols(void)
{
    const int rows = 19, lds = 37, ldd = 29, cols = 11;
    const size_t ns = (size_t)rows * lds, nd = (size_t)rows * ldd;
    float *s = arand(ns, 2, 0), *d0 = arand(nd, 2, 0), *e = fcopy(d0, nd);
    R->copy_cols(e + 3, ldd, s + 5, lds, rows, cols, 0);
    void *ds = up_act(s, ns), *dd = up_act(d0, nd);
    G->copy_cols((char *)dd + 3 * AB, ldd, (const char *)ds + 5 * AB, lds, rows, cols, 0);
    float *g = down_act(dd, nd), *er = down_act(dd, nd);
    void *de = up_act(e, nd); /* the expected, rounded to act as the device's */
    float *ed = down_act(de, nd);
    COMPARE("copy_cols", "copy", ed, g, nd, 0.0);
    R->copy_cols(er + 3, ldd, s + 5, lds, rows, cols, 1);
    G->copy_cols((char *)dd + 3 * AB, ldd, (const char *)ds + 5 * AB, lds, rows, cols, 1);
    float *g2 = down_act(dd, nd);
    COMPARE("copy_cols", "add", er, g2, nd, T_ACT(1.5));
    free(s), free(d0), free(e), free(g), free(er), free(ed), free(g2);
    G->free(ds), G->free(dd), G->free(de);
}

/* ---- RoPE ---- */

static void test_rope_case(int B, int T, int H, int KV, int D, int pos_offset)
{
    const size_t row = (size_t)(H + 2 * KV) * D, n = (size_t)B * T * row;
    const float theta = 10000.0f;
    float *x = arand(n, 1, 0), *e = fcopy(x, n);
    R->rope_fwd(e, B, T, H, KV, D, pos_offset, theta);
    void *dx = up_act(x, n);
    G->rope_fwd(dx, B, T, H, KV, D, pos_offset, theta);
    float *g = down_act(dx, n);
    char what[64];
    snprintf(what, sizeof what, "fwd pos %d", pos_offset);
    COMPARE("rope", what, e, g, n, T_ACT(1.5));
    /* V heads do not move */
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (size_t i = (size_t)(H + KV) * D; i < row; i++)
            if (g[r * row + i] != x[r * row + i])
                CHECK(g[r * row + i] == x[r * row + i]);
    /* the backward of the rounded forward output, on both */
    float *e2 = fcopy(g, n);
    R->rope_bwd(e2, B, T, H, KV, D, pos_offset, theta);
    G->rope_bwd(dx, B, T, H, KV, D, pos_offset, theta);
    float *g2 = down_act(dx, n);
    snprintf(what, sizeof what, "bwd pos %d", pos_offset);
    COMPARE("rope", what, e2, g2, n, T_ACT(1.5));
    free(x), free(e), free(g), free(e2), free(g2), G->free(dx);
}

/* ---- attention ---- */

typedef struct {
    int B, Tq, Tk, H, KV, D, q_offset;
    int Dv;        /* value heads' width (0: D; multi-head latent attention's differ) */
    int packed;    /* Tq == Tk: q, k, v in one [B,T,(H+KV)*D + KV*Dv] buffer */
    float dropout; /* unfused path only */
    int sinks;     /* attention sinks (GPT-OSS) and their gradient */
    uint64_t drop_row, drop_head; /* the dropout stream's placement (0: the call's own) */
} AttnCase;

#define SENTINEL 7.0f /* exact in bf16 and fp16 */

/* Scatters rows of `width` values into a strided view of a host buffer. */
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

/* The padding of a strided buffer (the columns past the heads in each row) still holds the
 * sentinel. */
static void check_padding(const float *buf, int rows, int stride, int used)
{
    for (int r = 0; r < rows; r++)
        for (int i = used; i < stride; i++)
            if (buf[(size_t)r * stride + i] != SENTINEL)
                CHECK(buf[(size_t)r * stride + i] == SENTINEL);
}

/* One attention case: its dense inputs, their strided views on the host and the same views on
 * the device, and what each phase leaves for the next (the fused phase reuses the unfused
 * backward's views and gradient buffers). */
typedef struct {
    AttnCase ac;
    size_t nq, nk, np, nl; /* elements of q, k, probabilities, rows */
    size_t nv, no;         /* of v, and of the output (and its gradient) */
    int dv;                /* the value heads' width */
    int qs, ks, vs;        /* row strides of the q, k and v views */
    size_t nbq, nbkv;      /* elements of the q (or packed qkv) buffer and of the kv buffer */
    size_t koff, voff;     /* where k and v start in a row of their buffer */
    float scale;
    float *q, *k, *v, *dout;
    float *bq, *bkv, *hk; /* host views; hk is the buffer that holds k and v */
    void *gbq, *gbkv, *gq, *gk, *gv, *gdout;
    /* unfused forward: expected (e*) and device (g*) outputs, the device's read back (h*) */
    KernAttnFwd f, gf;
    float *eo, *ep, *epd, *eds, *ho, *hp, *hpd;
    uint8_t *em, *gm;
    void *go, *gp, *gpd, *gds;
    /* unfused backward: gradient views, expected and device gradients */
    KernAttnBwd bw, gb;
    float *dbq, *dbkv, *dhk, *eq, *ek, *ev, *gq_, *gk_, *gv_;
    void *gdbq, *gdbkv;
    float *hs; /* the sinks [H] (act values) on the host, NULL without; gs on the device */
    void *gs;
} Attn;

#define ATTN_ES AB /* act element bytes */

/* Random inputs, laid out as packed qkv rows, or as q rows padded by 3 with k and v
 * interleaved in one kv buffer; the padding holds the sentinel; the same views on the device. */
static void attn_inputs(Attn *t, AttnCase ac)
{
    const int B = ac.B, Tq = ac.Tq, Tk = ac.Tk, H = ac.H, KV = ac.KV, D = ac.D;
    t->ac = ac;
    const int Dv = ac.Dv > 0 ? ac.Dv : D;
    t->dv = Dv;
    t->nq = (size_t)B * Tq * H * D, t->nk = (size_t)B * Tk * KV * D;
    t->nv = (size_t)B * Tk * KV * Dv, t->no = (size_t)B * Tq * H * Dv;
    t->np = (size_t)B * H * Tq * Tk, t->nl = (size_t)B * H * Tq;
    t->scale = 1.0f / sqrtf((float)D);
    char what[96];
    snprintf(what, sizeof what, "B%d Tq%d Tk%d H%d KV%d D%d Dv%d off%d%s p%.2g", B, Tq, Tk, H, KV,
             D, Dv, ac.q_offset, ac.packed ? " packed" : "", (double)ac.dropout);
    printf("  attention %s\n", what);
    t->q = arand(t->nq, 1.5, 0), t->k = arand(t->nk, 1.5, 0), t->v = arand(t->nv, 1, 0);
    t->dout = arand(t->no, 1, 0);

    if (ac.packed) {
        t->qs = t->ks = t->vs = (H + KV) * D + KV * Dv;
        t->nbq = (size_t)B * Tq * t->qs, t->nbkv = 0;
    } else {
        t->qs = H * D + 3, t->ks = t->vs = KV * D + KV * Dv;
        t->nbq = (size_t)B * Tq * t->qs, t->nbkv = (size_t)B * Tk * t->ks;
    }
    t->koff = ac.packed ? (size_t)H * D : 0;
    t->voff = ac.packed ? (size_t)(H + KV) * D : (size_t)KV * D;
    t->bq = fnew(t->nbq), t->bkv = fnew(t->nbkv);
    fill(t->bq, t->nbq, SENTINEL), fill(t->bkv, t->nbkv, SENTINEL);
    t->hk = ac.packed ? t->bq : t->bkv;
    to_view(t->bq, t->qs, t->q, B * Tq, H * D);
    to_view(t->hk + t->koff, t->ks, t->k, B * Tk, KV * D);
    to_view(t->hk + t->voff, t->vs, t->v, B * Tk, KV * Dv);
    t->gbq = up_act(t->bq, t->nbq), t->gbkv = t->nbkv ? up_act(t->bkv, t->nbkv) : NULL;
    void *gk_base = ac.packed ? t->gbq : t->gbkv;
    t->gq = t->gbq, t->gk = (char *)gk_base + t->koff * ATTN_ES;
    t->gv = (char *)gk_base + t->voff * ATTN_ES;
    t->gdout = up_act(t->dout, t->no);
    if (ac.sinks) {
        t->hs = arand((size_t)H, 2, 0);
        t->gs = up_act(t->hs, (size_t)H);
    }
}

/* The sinks' gradient on both backends from the backward's dscores (unfused) or lse and drow
 * (fused), accumulated into a random start. */
static void attn_sink_grads(Attn *t, const char *op, const float *else_, const float *edrow,
                            const float *eds, const float *glse, const float *gdrow,
                            const void *gds)
{
    const int H = t->ac.H;
    float *e = frand((size_t)H, 1, 0), *gd = up_f32(e, (size_t)H);
    R->attention_sink_bwd(e, t->hs, else_, edrow, eds, t->ac.B, H, t->ac.Tq, t->ac.Tk);
    G->attention_sink_bwd(gd, t->gs, glse, gdrow, gds, t->ac.B, H, t->ac.Tq, t->ac.Tk);
    float *h = down_f32(gd, (size_t)H);
    COMPARE(op, "dsinks +=", e, h, (size_t)H, T_ACT(8));
    free(e), free(h), G->free(gd);
}

/* The unfused forward (scores, probabilities, dropout) on both backends. */
static void attn_unfused_fwd(Attn *t)
{
    const AttnCase ac = t->ac;
    const size_t nq = t->no, np = t->np;
    t->eo = fnew(nq), t->ep = fnew(np), t->epd = fnew(np), t->eds = fnew(np);
    t->em = xmalloc(np);
    t->f = (KernAttnFwd){.B = ac.B, .Tq = ac.Tq, .Tk = ac.Tk, .H = ac.H, .KV = ac.KV, .D = ac.D,
                         .Dv = ac.Dv,
                         .q_offset = ac.q_offset, .scale = t->scale, .q = t->bq,
                         .k = t->hk + t->koff, .v = t->hk + t->voff, .q_stride = t->qs,
                         .k_stride = t->ks, .v_stride = t->vs, .out = t->eo, .probs = t->ep,
                         .dropout = ac.dropout, .seed = 0xC0FFEE, .drop_row = ac.drop_row,
                         .drop_head = ac.drop_head, .mask = t->em, .probs_drop = t->epd,
                         .sinks = t->hs};
    R->attention_fwd(&t->f);
    t->go = dalloc(nq * ATTN_ES), t->gp = dalloc(np * ATTN_ES), t->gpd = dalloc(np * ATTN_ES);
    t->gds = dalloc(np * ATTN_ES);
    t->gm = dalloc(np);
    t->gf = t->f;
    t->gf.q = t->gq, t->gf.k = t->gk, t->gf.v = t->gv, t->gf.out = t->go, t->gf.probs = t->gp;
    t->gf.mask = t->gm, t->gf.probs_drop = t->gpd, t->gf.sinks = t->gs;
    G->attention_fwd(&t->gf);
    t->ho = down_act(t->go, nq), t->hp = down_act(t->gp, np), t->hpd = NULL;
    COMPARE("attn unfused", "out", t->eo, t->ho, nq, T_ACT(12));
    COMPARE("attn unfused", "probs", t->ep, t->hp, np, T_ACT(8));
    if (ac.dropout > 0) {
        uint8_t *hm = xmalloc(np);
        G->to_host(hm, t->gm, np);
        COMPARE_BYTES("attn unfused", "mask", t->em, hm, np);
        t->hpd = down_act(t->gpd, np);
        COMPARE("attn unfused", "probs_drop", t->epd, t->hpd, np, T_ACT(8));
        free(hm);
    }
}

/* The device's gradients read back from its views against the expected ones, and the padding
 * of a strided q view still the sentinel. */
static void attn_compare_grads(Attn *t, const char *op, double tol_q, double tol_k, double tol_v)
{
    const int rq = t->ac.B * t->ac.Tq, rk = t->ac.B * t->ac.Tk;
    const int wq = t->ac.H * t->ac.D, wk = t->ac.KV * t->ac.D, wv = t->ac.KV * t->dv;
    float *hbq = down_act(t->gdbq, t->nbq), *hbkv = t->nbkv ? down_act(t->gdbkv, t->nbkv) : NULL;
    float *hdk_base = t->ac.packed ? hbq : hbkv;
    from_view(t->gq_, hbq, t->qs, rq, wq);
    from_view(t->gk_, hdk_base + t->koff, t->ks, rk, wk);
    from_view(t->gv_, hdk_base + t->voff, t->vs, rk, wv);
    COMPARE(op, "dq", t->eq, t->gq_, t->nq, tol_q);
    COMPARE(op, "dk", t->ek, t->gk_, t->nk, tol_k);
    COMPARE(op, "dv", t->ev, t->gv_, t->nv, tol_v);
    if (!t->ac.packed)
        check_padding(hbq, rq, t->qs, wq);
    free(hbq), free(hbkv);
}

/* The expected gradients read from the host views into eq, ek, ev. */
static void attn_expected_grads(Attn *t)
{
    const int rq = t->ac.B * t->ac.Tq, rk = t->ac.B * t->ac.Tk;
    const int wq = t->ac.H * t->ac.D, wk = t->ac.KV * t->ac.D, wv = t->ac.KV * t->dv;
    from_view(t->eq, t->dbq, t->qs, rq, wq);
    from_view(t->ek, t->dhk + t->koff, t->ks, rk, wk);
    from_view(t->ev, t->dhk + t->voff, t->vs, rk, wv);
}

/* The unfused backward into views prefilled with the sentinel (dq, dk, dv are overwritten).
 * The reference differentiates the CUDA forward's own (rounded) probabilities, so that the
 * comparison measures the backward alone. */
static void attn_unfused_bwd(Attn *t)
{
    const AttnCase ac = t->ac;
    const size_t nq = t->nq, nk = t->nk;
    t->dbq = fnew(t->nbq), t->dbkv = fnew(t->nbkv);
    fill(t->dbq, t->nbq, SENTINEL), fill(t->dbkv, t->nbkv, SENTINEL);
    t->dhk = ac.packed ? t->dbq : t->dbkv;
    t->bw = (KernAttnBwd){.B = ac.B, .Tq = ac.Tq, .Tk = ac.Tk, .H = ac.H, .KV = ac.KV, .D = ac.D,
                          .Dv = ac.Dv,
                          .q_offset = ac.q_offset, .scale = t->scale, .q = t->f.q, .k = t->f.k,
                          .v = t->f.v, .q_stride = t->qs, .k_stride = t->ks, .v_stride = t->vs,
                          .dout = t->dout, .dq = t->dbq, .dk = t->dhk + t->koff,
                          .dv = t->dhk + t->voff, .dq_stride = t->qs, .dk_stride = t->ks,
                          .dv_stride = t->vs, .probs = t->hp, .dropout = ac.dropout,
                          .mask = t->em, .probs_drop = t->hpd, .dscores = t->eds};
    R->attention_bwd(&t->bw);
    t->eq = fnew(nq), t->ek = fnew(nk), t->ev = fnew(t->nv);
    attn_expected_grads(t);
    t->gdbq = dalloc(t->nbq * ATTN_ES), t->gdbkv = t->nbkv ? dalloc(t->nbkv * ATTN_ES) : NULL;
    fill(t->dbq, t->nbq, SENTINEL), fill(t->dbkv, t->nbkv, SENTINEL);
    set_act(t->gdbq, t->dbq, t->nbq);
    if (t->nbkv)
        set_act(t->gdbkv, t->dbkv, t->nbkv);
    void *gdk_base = ac.packed ? t->gdbq : t->gdbkv;
    t->gb = t->bw;
    t->gb.q = t->gq, t->gb.k = t->gk, t->gb.v = t->gv, t->gb.dout = t->gdout, t->gb.dq = t->gdbq;
    t->gb.dk = (char *)gdk_base + t->koff * ATTN_ES;
    t->gb.dv = (char *)gdk_base + t->voff * ATTN_ES;
    t->gb.probs = t->gp, t->gb.mask = t->gm, t->gb.probs_drop = t->gpd, t->gb.dscores = t->gds;
    G->attention_bwd(&t->gb);
    t->gq_ = fnew(nq), t->gk_ = fnew(nk), t->gv_ = fnew(t->nv);
    attn_compare_grads(t, "attn unfused", T_ACT(24), T_ACT(24), T_ACT(12));
    if (t->hs) { /* the reference's dscores from the device's probabilities: the same dS */
        float *hds = down_act(t->gds, t->np);
        attn_sink_grads(t, "attn unfused", NULL, NULL, hds, NULL, NULL, t->gds);
        free(hds);
    }
}

/* The fused forward (lse instead of probabilities) and backward, into the unfused backward's
 * views reset to the sentinel; the reference differentiates the CUDA forward: its rounded out,
 * its lse. */
static void attn_fused(Attn *t)
{
    const size_t nq = t->no, nl = t->nl;
    float *eo2 = fnew(nq), *e_lse = fnew(nl), *edrow = fnew(nl);
    KernAttnFwd ff = t->f;
    ff.out = eo2, ff.probs = NULL, ff.mask = NULL, ff.probs_drop = NULL, ff.lse = e_lse;
    R->attention_fwd(&ff);
    void *go2 = dalloc(nq * ATTN_ES);
    float *glse = dalloc(nl * sizeof(float)), *gdrow = dalloc(nl * sizeof(float));
    KernAttnFwd gff = t->gf;
    gff.out = go2, gff.probs = NULL, gff.mask = NULL, gff.probs_drop = NULL, gff.lse = glse;
    G->attention_fwd(&gff);
    float *ho2 = down_act(go2, nq), *hlse = down_f32(glse, nl);
    COMPARE("attn fused", "out", eo2, ho2, nq, T_ACT(1.5));
    COMPARE("attn fused", "lse", e_lse, hlse, nl, T_F32);

    fill(t->dbq, t->nbq, SENTINEL), fill(t->dbkv, t->nbkv, SENTINEL);
    KernAttnBwd fb = t->bw;
    fb.probs = NULL, fb.dscores = NULL, fb.mask = NULL, fb.probs_drop = NULL;
    fb.out = ho2, fb.lse = hlse, fb.drow = edrow;
    R->attention_bwd(&fb);
    attn_expected_grads(t);
    set_act(t->gdbq, t->dbq, t->nbq); /* all sentinel again */
    if (t->nbkv)
        set_act(t->gdbkv, t->dbkv, t->nbkv);
    KernAttnBwd gfb = t->gb;
    gfb.probs = NULL, gfb.dscores = NULL, gfb.mask = NULL, gfb.probs_drop = NULL;
    gfb.out = go2, gfb.lse = glse, gfb.drow = gdrow;
    G->attention_bwd(&gfb);
    attn_compare_grads(t, "attn fused", T_ACT(3), T_ACT(3), T_ACT(3));
    if (t->hs)
        attn_sink_grads(t, "attn fused", hlse, edrow, NULL, glse, gdrow, NULL);
    free(eo2), free(e_lse), free(edrow), free(ho2), free(hlse);
    G->free(go2), G->free(glse), G->free(gdrow);
}

static void attn_free(Attn *t)
{
    free(t->q), free(t->k), free(t->v), free(t->dout), free(t->bq), free(t->bkv), free(t->eo);
    free(t->ep), free(t->epd), free(t->eds), free(t->em), free(t->ho), free(t->hp), free(t->hpd);
    free(t->dbq), free(t->dbkv), free(t->eq), free(t->ek), free(t->ev);
    free(t->gq_), free(t->gk_), free(t->gv_);
    G->free(t->gbq), G->free(t->gbkv), G->free(t->gdout), G->free(t->go), G->free(t->gp);
    G->free(t->gpd), G->free(t->gds), G->free(t->gm), G->free(t->gdbq), G->free(t->gdbkv);
    free(t->hs), G->free(t->gs);
}

/* ---- the shared experts' gate and the router's bias (GPT-OSS's and Qwen2-MoE's extras) ---- */

static void test_gate(int N, int C, int F)
{
    const size_t nc = (size_t)N * C, nf = (size_t)N * F;
    float *x = arand(nc, 1, 0), *w = arand(C, 1, 0), *y = arand(nc, 1, 0);
    float *dh = arand(nf, 1, 0), *hid = arand(nf, 1, 0);
    void *gx = up_act(x, nc), *gw = up_act(w, C), *gy = up_act(y, nc);
    void *gdh = up_act(dh, nf), *ghid = up_act(hid, nf);
    R->gate_fwd(y, x, w, N, C);
    G->gate_fwd(gy, gx, gw, N, C);
    float *hy = down_act(gy, nc);
    COMPARE("gate_fwd", "y", y, hy, nc, T_ACT(2));
    float *el = fnew((size_t)N), *gl = dalloc((size_t)N * sizeof(float));
    R->gate_bwd(el, dh, hid, x, w, N, C, F);
    G->gate_bwd(gl, gdh, ghid, gx, gw, N, C, F);
    float *hl = down_f32(gl, (size_t)N), *hdh = down_act(gdh, nf), *hh = down_act(ghid, nf);
    COMPARE("gate_bwd", "dlogit", el, hl, (size_t)N, T_ACT(4));
    COMPARE("gate_bwd", "dhid", dh, hdh, nf, T_ACT(2));
    COMPARE("gate_bwd", "hid", hid, hh, nf, T_ACT(2));
    /* the wgrad from the same dlogit on both sides */
    float *dx = arand(nc, 1, 0), *dw = frand(C, 1, 0);
    void *gdx = up_act(dx, nc);
    float *gdw = up_f32(dw, C), *gl2 = up_f32(el, (size_t)N);
    R->gate_wgrad(dx, dw, el, x, w, N, C);
    G->gate_wgrad(gdx, gdw, gl2, gx, gw, N, C);
    float *hdx = down_act(gdx, nc), *hdw = down_f32(gdw, C);
    COMPARE("gate_wgrad", "dx +=", dx, hdx, nc, T_ACT(2));
    COMPARE("gate_wgrad", "dw +=", dw, hdw, C, T_F32);
    /* the router's bias on fp32 logits */
    float *lg = frand(nc, 1, 0), *b = arand(C, 1, 0);
    float *glg = up_f32(lg, nc);
    void *gb = up_act(b, C);
    R->add_bias_f32(lg, b, N, C);
    G->add_bias_f32(glg, gb, N, C);
    float *hlg = down_f32(glg, nc);
    COMPARE("add_bias_f32", "out", lg, hlg, nc, T_F32);
    free(x), free(w), free(y), free(dh), free(hid), free(hy), free(el), free(hl), free(hdh);
    free(hh), free(dx), free(dw), free(hdx), free(hdw), free(lg), free(b), free(hlg);
    G->free(gx), G->free(gw), G->free(gy), G->free(gdh), G->free(ghid), G->free(gl);
    G->free(gdx), G->free(gdw), G->free(gl2), G->free(glg), G->free(gb);
}

/* The unfused path on both backends (forward, then backward into strided views), and the fused
 * one where there is no dropout. */
static void test_attention(AttnCase ac)
{
    Attn t = {0};
    attn_inputs(&t, ac);
    attn_unfused_fwd(&t);
    attn_unfused_bwd(&t);
    if (ac.dropout == 0)
        attn_fused(&t);
    attn_free(&t);
}

/* ---- embedding ---- */

/* The ring's merge of two partial results: lse spread over +-lse_scale, so that with a wide
 * spread one side's weight underflows to 0 (exp of the gap) and the sum must not overflow. */
/* MXFP8 attention's second operands on the device (as test_kernels' CPU check): second copies
 * holding the first operands' values give their results bit for bit, and a zero second copy
 * zeroes exactly the product that reads it (O = P V: v_col; dV: dout_col; dQ: k_col; dK:
 * q_col), leaving the rest bit for bit; fused (the flash kernels' extra tiles) and unfused. */
enum { SC_FIRST = 0, SC_SAME, SC_ZERO_V, SC_ZERO_DO, SC_ZERO_K, SC_ZERO_Q, SC_CASES };
enum { SC_B = 2, SC_T = 40, SC_H = 4, SC_KV = 2, SC_D = 4 };

typedef struct {
    float *out, *lse, *dq, *dk, *dv; /* read back */
} AttnSecond;

static AttnSecond attn_second_run(int fused, int which, void *const in[4], void *const same[4],
                                  void *zero)
{
    const size_t nq = (size_t)SC_B * SC_T * SC_H * SC_D, nk = (size_t)SC_B * SC_T * SC_KV * SC_D;
    const size_t np = (size_t)SC_B * SC_H * SC_T * SC_T, nl = (size_t)SC_B * SC_H * SC_T;
    void *out = dalloc(nq * ATTN_ES), *probs = dalloc(np * ATTN_ES), *ds = dalloc(np * ATTN_ES);
    void *dq = dalloc(nq * ATTN_ES), *dk = dalloc(nk * ATTN_ES), *dv = dalloc(nk * ATTN_ES);
    float *lse = dalloc(nl * sizeof(float)), *drow = dalloc(nl * sizeof(float));
    const int sm = which == SC_SAME;
    KernAttnFwd f = {.B = SC_B, .Tq = SC_T, .Tk = SC_T, .H = SC_H, .KV = SC_KV, .D = SC_D,
                     .scale = 0.5f, .q = in[0], .k = in[1], .v = in[2], .q_stride = SC_H * SC_D,
                     .k_stride = SC_KV * SC_D, .v_stride = SC_KV * SC_D, .out = out,
                     .v_col = sm ? same[2] : which == SC_ZERO_V ? zero : NULL};
    if (fused)
        f.lse = lse;
    else
        f.probs = probs;
    G->attention_fwd(&f);
    KernAttnBwd b = {.B = SC_B, .Tq = SC_T, .Tk = SC_T, .H = SC_H, .KV = SC_KV, .D = SC_D,
                     .scale = 0.5f, .q = in[0], .k = in[1], .v = in[2], .q_stride = SC_H * SC_D,
                     .k_stride = SC_KV * SC_D, .v_stride = SC_KV * SC_D, .out = out,
                     .dout = in[3], .dq = dq, .dk = dk, .dv = dv, .dq_stride = SC_H * SC_D,
                     .dk_stride = SC_KV * SC_D, .dv_stride = SC_KV * SC_D,
                     .q_col = sm ? same[0] : which == SC_ZERO_Q ? zero : NULL,
                     .k_col = sm ? same[1] : which == SC_ZERO_K ? zero : NULL,
                     .dout_col = sm ? same[3] : which == SC_ZERO_DO ? zero : NULL};
    if (fused)
        b.lse = lse, b.drow = drow;
    else
        b.probs = probs, b.dscores = ds;
    if (which != SC_ZERO_V) /* the backward reads the forward's output: a zero one is no case */
        G->attention_bwd(&b);
    AttnSecond r = {down_act(out, nq), down_f32(lse, nl), down_act(dq, nq), down_act(dk, nk),
                    down_act(dv, nk)};
    G->free(out), G->free(probs), G->free(ds), G->free(dq), G->free(dk), G->free(dv);
    G->free(lse), G->free(drow);
    return r;
}

/* a == b bit for bit (n floats), or (b NULL) a all zero */
static void attn_second_bits(const char *what, int fused, int which, const float *a,
                             const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b ? memcmp(&a[i], &b[i], sizeof *a) != 0 : a[i] != 0.0f) {
            fprintf(stderr, "FAILED: attention's second copies on %s (%s, case %d): %s[%zu] = "
                    "%.9g, expected %.9g\n", G->name, fused ? "fused" : "unfused", which, what,
                    i, a[i], b ? b[i] : 0.0);
            exit(1);
        }
}

static void test_attention_second_copies(void)
{
    const size_t nq = (size_t)SC_B * SC_T * SC_H * SC_D, nk = (size_t)SC_B * SC_T * SC_KV * SC_D;
    const size_t nl = (size_t)SC_B * SC_H * SC_T, n[4] = {nq, nk, nk, nq};
    void *in[4], *same[4], *zero = dalloc(nq * ATTN_ES);
    for (int i = 0; i < 4; i++) {
        float *x = frand(n[i], i == 2 || i == 3 ? 1.0 : 1.5, 0);
        in[i] = up_act(x, n[i]), same[i] = up_act(x, n[i]);
        free(x);
    }
    for (int fused = 0; fused < 2; fused++) {
        AttnSecond r[SC_CASES];
        for (int w = 0; w < SC_CASES; w++)
            r[w] = attn_second_run(fused, w, in, same, zero);
        const AttnSecond *a = &r[SC_FIRST];
        for (int w = SC_SAME; w < SC_CASES; w++) {
            const AttnSecond *x = &r[w];
            attn_second_bits("out", fused, w, x->out, w == SC_ZERO_V ? NULL : a->out, nq);
            if (fused)
                attn_second_bits("lse", fused, w, x->lse, a->lse, nl);
            if (w == SC_ZERO_V)
                continue;
            attn_second_bits("dq", fused, w, x->dq, w == SC_ZERO_K ? NULL : a->dq, nq);
            attn_second_bits("dk", fused, w, x->dk, w == SC_ZERO_Q ? NULL : a->dk, nk);
            attn_second_bits("dv", fused, w, x->dv, w == SC_ZERO_DO ? NULL : a->dv, nk);
        }
        for (int w = 0; w < SC_CASES; w++)
            free(r[w].out), free(r[w].lse), free(r[w].dq), free(r[w].dk), free(r[w].dv);
    }
    for (int i = 0; i < 4; i++)
        G->free(in[i]), G->free(same[i]);
    G->free(zero);
    printf("  attention's second copies (MXFP8) on %s: each product over a sequence reads its "
           "own, fused and unfused\n", G->name);
}

static void test_attention_merge(int T, int H, int D, double lse_scale)
{
    const size_t no = (size_t)T * H * D, nl = (size_t)T * H;
    float *o = arand(no, 1, 0), *ob = arand(no, 1, 0), *l = frand(nl, lse_scale, 0);
    float *lb = frand(nl, lse_scale, 0), *eo = fcopy(o, no), *el = fcopy(l, nl);
    R->attention_merge(eo, el, ob, lb, T, H, D);
    void *dout = up_act(o, no), *dob = up_act(ob, no);
    float *dl = up_f32(l, nl), *dlb = up_f32(lb, nl);
    G->attention_merge(dout, dl, dob, dlb, T, H, D);
    float *go = down_act(dout, no), *gl = down_f32(dl, nl);
    char what[64];
    snprintf(what, sizeof what, "T%d H%d D%d lse +-%g", T, H, D, lse_scale);
    COMPARE("attn_merge out", what, eo, go, no, T_ACT(1.5));
    COMPARE("attn_merge lse", what, el, gl, nl, T_F32);
    free(o), free(ob), free(l), free(lb), free(eo), free(el), free(go), free(gl);
    G->free(dout), G->free(dob), G->free(dl), G->free(dlb);
}

static void test_embedding(int with_wpe)
{
    const int B = 2, T = 6, N = B * T, C = 70, V = 20, v_start = 10, pos_offset = 2;
    const int P = pos_offset + T;
    int32_t tok[12];
    for (int n = 0; n < N; n++)
        tok[n] = (int32_t)((n * 7 + 3) % 40); /* half inside the shard [10, 30) */
    tok[0] = INT32_MIN + 5;                   /* far outside, and must not wrap */
    tok[5] = 12, tok[9] = 12;                 /* a repeated token: dwte sums both */
    const size_t n = (size_t)N * C;
    float *wte = arand((size_t)V * C, 1, 0), *wpe = arand((size_t)P * C, 1, 0);
    float *dy = arand(n, 1, 0), *dwte0 = frand((size_t)V * C, 1, 0);
    float *dwpe0 = frand((size_t)P * C, 1, 0);
    float *eo = fnew(n), *edwte = fcopy(dwte0, (size_t)V * C), *edwpe = fcopy(dwpe0, (size_t)P * C);
    R->embedding_fwd(eo, tok, wte, with_wpe ? wpe : NULL, N, T, pos_offset, C, v_start, V);
    R->embedding_bwd(edwte, with_wpe ? edwpe : NULL, dy, tok, N, T, pos_offset, C, v_start, V);
    int32_t *gtok = up_bytes(tok, sizeof tok);
    void *gwte = up_act(wte, (size_t)V * C), *gwpe = up_act(wpe, (size_t)P * C);
    void *gdy = up_act(dy, n), *go = dalloc(n * AB);
    float *gdwte = up_f32(dwte0, (size_t)V * C), *gdwpe = up_f32(dwpe0, (size_t)P * C);
    G->embedding_fwd(go, gtok, gwte, with_wpe ? gwpe : NULL, N, T, pos_offset, C, v_start, V);
    G->embedding_bwd(gdwte, with_wpe ? gdwpe : NULL, gdy, gtok, N, T, pos_offset, C, v_start, V);
    float *ho = down_act(go, n), *hdwte = down_f32(gdwte, (size_t)V * C);
    float *hdwpe = down_f32(gdwpe, (size_t)P * C);
    const char *what = with_wpe ? "wte+wpe" : "wte";
    COMPARE("embedding fwd", what, eo, ho, n, with_wpe ? T_ACT(1.01) : 0.0);
    COMPARE("embedding bwd", "dwte +=", edwte, hdwte, (size_t)V * C, T_F32);
    COMPARE("embedding bwd", "dwpe +=", edwpe, hdwpe, (size_t)P * C, T_F32);
    free(wte), free(wpe), free(dy), free(dwte0), free(dwpe0), free(eo), free(edwte), free(edwpe);
    free(ho), free(hdwte), free(hdwpe);
    G->free(gtok), G->free(gwte), G->free(gwpe), G->free(gdy), G->free(go), G->free(gdwte);
    G->free(gdwpe);
}

/* ---- cross-entropy (fp32 throughout) ---- */

static void test_xent_case(int N, int V, int v_start)
{
    const size_t n = (size_t)N * V;
    float *logits = frand(n, 5, 1);
    int32_t *tg = xmalloc((size_t)N * sizeof *tg);
    for (int i = 0; i < N; i++)
        tg[i] = (int32_t)(v_start + (i * 37) % (V + 4) - 2); /* a few outside the shard */
    float *e = fcopy(logits, n), *emax = fnew(N), *esum = fnew(N), *etgt = fnew(N);
    float *eloss = fnew(N);
    float *gl = up_f32(logits, n), *gmax = dalloc((size_t)N * 4), *gsum = dalloc((size_t)N * 4);
    float *gtgt = dalloc((size_t)N * 4), *gloss = dalloc((size_t)N * 4);
    int32_t *gtg = up_bytes(tg, (size_t)N * sizeof *tg);
    char what[64];
    snprintf(what, sizeof what, "%dx%d", N, V);
    R->xent_rowmax(emax, e, N, V);
    G->xent_rowmax(gmax, gl, N, V);
    float *h = down_f32(gmax, N);
    COMPARE("xent_rowmax", what, emax, h, N, 0.0);
    free(h);
    R->xent_expsum(esum, etgt, e, emax, tg, N, V, v_start);
    G->xent_expsum(gsum, gtgt, gl, gmax, gtg, N, V, v_start);
    h = down_f32(gl, n);
    COMPARE("xent_expsum", "exp", e, h, n, T_F32);
    free(h), h = down_f32(gsum, N);
    COMPARE("xent_expsum", "rowsum", esum, h, N, T_F32);
    free(h), h = down_f32(gtgt, N);
    COMPARE("xent_expsum", "target", etgt, h, N, 0.0);
    free(h);
    if (V > 0) {
        R->xent_finish(eloss, e, esum, emax, etgt, N, V);
        G->xent_finish(gloss, gl, gsum, gmax, gtgt, N, V);
        h = down_f32(gl, n);
        COMPARE("xent_finish", "probs", e, h, n, T_F32);
        free(h), h = down_f32(gloss, N);
        COMPARE("xent_finish", "loss", eloss, h, N, T_F32);
        free(h);
        R->xent_bwd(e, tg, N, V, v_start, 0.25f);
        G->xent_bwd(gl, gtg, N, V, v_start, 0.25f);
        h = down_f32(gl, n);
        COMPARE("xent_bwd", "dlogits", e, h, n, T_F32);
        free(h);
    }
    free(logits), free(tg), free(e), free(emax), free(esum), free(etgt), free(eloss);
    G->free(gl), G->free(gmax), G->free(gsum), G->free(gtgt), G->free(gloss), G->free(gtg);
}

/* ---- optimizer ---- */

static void test_optim(size_t n, int refresh)
{
    float *master = frand(n, 1, 0), *grad = frand(n, 1, 0), *m = frand(n, 0.1, 0);
    float *v = frand(n, 0.01, 0.011), *p0 = arand(n, 1, 0);
    const char *what = refresh ? "param refresh" : "no param";
    /* AdamW */
    float *em = fcopy(master, n), *emm = fcopy(m, n), *ev = fcopy(v, n), *ep = fcopy(p0, n);
    R->adamw(refresh ? ep : NULL, em, grad, emm, ev, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, 0.5f);
    float *gm_ = up_f32(master, n), *gg = up_f32(grad, n), *gmm = up_f32(m, n), *gv = up_f32(v, n);
    void *gp = up_act(p0, n);
    G->adamw(refresh ? gp : NULL, gm_, gg, gmm, gv, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, 0.5f);
    float *h = down_f32(gm_, n);
    COMPARE("adamw", "master", em, h, n, 1e-6);
    free(h), h = down_f32(gmm, n);
    COMPARE("adamw", "m", emm, h, n, 1e-6);
    free(h), h = down_f32(gv, n);
    COMPARE("adamw", "v", ev, h, n, 1e-6);
    free(h), h = down_act(gp, n);
    for (size_t i = 0; i < n; i++)
        ep[i] = refresh ? act_round(ep[i]) : p0[i]; /* the master rounded, or untouched */
    COMPARE("adamw", what, ep, h, n, T_ACT(2));
    free(h);
    /* SGD with momentum */
    float *sm = fcopy(master, n), *smo = fcopy(m, n), *sp = fcopy(p0, n);
    R->sgd_momentum(refresh ? sp : NULL, sm, grad, smo, n, 0.1f, 0.9f, 0.01f, 2.0f);
    G->to_device(gm_, master, n * 4);
    G->to_device(gmm, m, n * 4);
    set_act(gp, p0, n);
    G->sgd_momentum(refresh ? gp : NULL, gm_, gg, gmm, n, 0.1f, 0.9f, 0.01f, 2.0f);
    h = down_f32(gm_, n);
    COMPARE("sgd_momentum", "master", sm, h, n, 1e-6);
    free(h), h = down_f32(gmm, n);
    COMPARE("sgd_momentum", "momentum", smo, h, n, 1e-6);
    free(h), h = down_act(gp, n);
    for (size_t i = 0; i < n; i++)
        sp[i] = refresh ? act_round(sp[i]) : p0[i];
    COMPARE("sgd_momentum", what, sp, h, n, T_ACT(2));
    free(h);
    free(master), free(grad), free(m), free(v), free(p0), free(em), free(emm), free(ev), free(ep);
    free(sm), free(smo), free(sp);
    G->free(gm_), G->free(gg), G->free(gmm), G->free(gv), G->free(gp);
}

/* 8-bit Adam: the device's call against the host's (kern_host_adam8, the CPU backend's loops),
 * code for code and bit for bit: three quantization blocks of a 5000-value state (the last
 * 904), segments with and without weight decay and a gap; from element 0, or from 2100 (the
 * first block untouched, the pointers offset). K: fp32 gradients, or 16-bit ones. */
static void test_adam8(const KernBackend *K, uint64_t begin)
{
    enum { S = 5000, NQ = 3 };
    static KernAdam8 a;
    memset(&a, 0, sizeof a);
    kern_adam8_tables(a.codes);
    a.state_n = S;
    const uint64_t seg[2][3][2] = {{{0, 100}, {100, 2500}, {2600, 4999}},
                                   {{2100, 3000}, {3000, 4999}, {0, 0}}};
    const int which = begin != 0;
    for (int i = 0; i < 3 && seg[which][i][1]; i++) {
        a.begin[i] = seg[which][i][0];
        a.end[i] = seg[which][i][1];
        a.weight_decay[i] = i % 2 ? 0.0f : 0.1f;
        a.n = i + 1;
    }
    a.lr = 1e-2f, a.beta1 = 0.9f, a.beta2 = 0.999f, a.eps = 1e-8f, a.grad_scale = 0.5f, a.t = 3;
    const size_t n = S - begin, gb = px_dtype_bytes(K->grad);
    uint8_t *m8 = xmalloc(S), *v8 = xmalloc(S);
    for (size_t i = 0; i < S; i++) {
        m8[i] = (uint8_t)(256 * (0.5 + 0.5 * rnd()));
        v8[i] = (uint8_t)(128 + 127 * (0.5 + 0.5 * rnd())); /* positive v, and some zeros */
        v8[i] = i % 97 ? v8[i] : 0;
    }
    float absmax[2 * NQ] = {0.2f, 0.15f, 0.1f, 0.02f, 0.015f, 0.0f}; /* an all-zero v block */
    float *master = frand(n, 1, 0), *g32 = arand(n, 1, 0), *p0 = arand(n, 1, 0);
    void *grad = g32;
    uint16_t *g16 = NULL;
    if (gb == 2) {
        g16 = xmalloc(n * 2);
        for (size_t i = 0; i < n; i++)
            g16[i] = (uint16_t)act_bits(g32[i]);
        grad = g16;
    }
    /* the host's */
    uint8_t *em8 = xmalloc(S), *ev8 = xmalloc(S);
    memcpy(em8, m8, S), memcpy(ev8, v8, S);
    float eabs[2 * NQ], *em = fcopy(master, n), *ep = fcopy(p0, n);
    memcpy(eabs, absmax, sizeof eabs);
    kern_host_adam8(ep, em, grad, K->grad, em8, ev8, eabs, &a);
    /* the device's */
    float *dm = up_f32(master, n), *dabs = up_f32(absmax, 2 * NQ);
    void *dg = up_bytes(grad, n * gb), *dp = up_act(p0, n);
    uint8_t *dm8 = up_bytes(m8, S), *dv8 = up_bytes(v8, S);
    K->adam8(dp, dm, dg, dm8, dv8, dabs, &a);
    uint8_t *h8 = xmalloc(S);
    const char *what = gb == 2 ? "master 16-bit g" : "master";
    G->to_host(h8, dm8, S);
    COMPARE_BYTES("adam8", "m codes", em8, h8, S);
    G->to_host(h8, dv8, S);
    COMPARE_BYTES("adam8", "v codes", ev8, h8, S);
    float *h = down_f32(dabs, 2 * NQ);
    COMPARE_BYTES("adam8", "absmax", eabs, h, sizeof eabs);
    free(h), h = down_f32(dm, n);
    COMPARE_BYTES("adam8", what, em, h, n * sizeof *em);
    CHECK(memcmp(em, master, n * sizeof *em) != 0); /* it moved */
    uint32_t *pb = down_bits(dp, n), *eb = xmalloc(n * sizeof *eb);
    for (size_t i = 0; i < n; i++) /* the host refreshed its fp32 copy: the device rounds it */
        eb[i] = act_bits(ep[i]);
    COMPARE_BYTES("adam8", "param refresh", eb, pb, n * sizeof *eb);
    free(h), free(pb), free(eb), free(h8), free(m8), free(v8), free(em8), free(ev8);
    free(master), free(g32), free(g16), free(p0), free(em), free(ep);
    G->free(dm), G->free(dabs), G->free(dg), G->free(dp), G->free(dm8), G->free(dv8);
}

/* ---- 16-bit parameter gradients (kern_cuda_with_grads) ---- */

/* Each backward adds its fp32 sum into the 16-bit gradient rounded once per call (the
 * embedding's once per token, in row order), and the optimizer and the norm's sum of squares
 * read them widened: the expected values round the CPU's fp32 results the same way. */
static void test_grads16(void)
{
    const KernBackend *H = kern_cuda_with_grads(G->act, G->act), *F = G;
    REQUIRE(H != NULL);
    CHECK(H->act == G->act && H->grad == G->act && F->grad == PX_FP32);
    CHECK(kern_cuda_with_grads(G->act, PX_FP32) == G);
    CHECK(kern_cuda_with_grads(G->act, G->act == PX_BF16 ? PX_FP16 : PX_BF16) == NULL);
    const int N = 300, C = 70, V = 20, T = 6;
    const size_t n = (size_t)N * C;
    float *x = arand(n, 1.0, 0.3), *w = arand(C, 0.5, 1.0), *dy = arand(n, 1, 0);
    float *g0 = arand(C, 1, 0), *h0 = arand(C, 1, 0);
    /* bias_grad and layernorm_bwd: the CPU's fp32 sums from the same 16-bit start, rounded */
    float *edb = fcopy(g0, C), *edw = fcopy(g0, C), *edb2 = fcopy(h0, C), *edx = fnew(n);
    fill(edx, n, 0.0f);
    R->bias_grad(edb, dy, N, C);
    R->layernorm_bwd(edx, edw, edb2, dy, x, w, N, C, 1e-5f);
    void *ddy = up_act(dy, n), *dx = up_act(x, n), *dw = up_act(w, C), *ddx = dalloc(n * AB);
    void *gdb = up_act(g0, C), *gdw = up_act(g0, C), *gdb2 = up_act(h0, C);
    G = H; /* down_act and act_round read G's act: the same */
    H->bias_grad(gdb, ddy, N, C);
    H->layernorm_bwd(ddx, gdw, gdb2, ddy, dx, dw, N, C, 1e-5f);
    for (int i = 0; i < C; i++) {
        edb[i] = act_round(edb[i]);
        edw[i] = act_round(edw[i]);
        edb2[i] = act_round(edb2[i]);
    }
    float *a = down_act(gdb, C);
    /* the sums' order differs from the CPU's: a rounding may land one unit (2 EPS) apart */
    COMPARE("bias_grad", "16-bit dbias +=", edb, a, C, T_ACT(2.01));
    free(a), a = down_act(gdw, C);
    COMPARE("layernorm_bwd", "16-bit dw +=", edw, a, C, T_ACT(2.01));
    free(a), a = down_act(gdb2, C);
    COMPARE("layernorm_bwd", "16-bit db +=", edb2, a, C, T_ACT(2.01));
    free(a);
    /* embedding_bwd: token by token, each addition rounded, exactly */
    int32_t tok[36];
    for (int i = 0; i < 36; i++)
        tok[i] = (int32_t)((i * 7 + 3) % 25); /* some outside the shard [0, 20), repeats */
    float *e0 = arand((size_t)V * C, 1, 0), *p0 = arand((size_t)T * C, 1, 0);
    float *ewte = fcopy(e0, (size_t)V * C), *ewpe = fcopy(p0, (size_t)T * C);
    for (int r = 0; r < 36; r++)
        for (int c = 0; c < C; c++) {
            const float d = dy[(size_t)r * C + c];
            if (tok[r] < V)
                ewte[(size_t)tok[r] * C + c] = act_round(ewte[(size_t)tok[r] * C + c] + d);
            ewpe[(size_t)(r % T) * C + c] = act_round(ewpe[(size_t)(r % T) * C + c] + d);
        }
    int32_t *gtok = up_bytes(tok, sizeof tok);
    void *gwte = up_act(e0, (size_t)V * C), *gwpe = up_act(p0, (size_t)T * C);
    H->embedding_bwd(gwte, gwpe, ddy, gtok, 36, T, 0, C, 0, V);
    a = down_act(gwte, (size_t)V * C);
    COMPARE("embedding_bwd", "16-bit dwte +=", ewte, a, (size_t)V * C, 0.0);
    free(a), a = down_act(gwpe, (size_t)T * C);
    COMPARE("embedding_bwd", "16-bit dwpe +=", ewpe, a, (size_t)T * C, 0.0);
    free(a);
    /* attention_sink_bwd: the fused path's sum (lse, drow) and the unfused one's (row sums of
     * dscores), each added to the 16-bit sinks' gradient once */
    enum { SH = 4, SB = 2, ST = 5 };
    const size_t nr = (size_t)SB * SH * ST;
    float *sk = arand(SH, 1.0, 0), *lse = frand(nr, 1.0, 2.0), *drow = frand(nr, 1.0, 0);
    float *ds = arand(nr * ST, 1, 0), *es = fcopy(g0, SH), *es2 = fcopy(h0, SH);
    R->attention_sink_bwd(es, sk, lse, drow, NULL, SB, SH, ST, ST);
    R->attention_sink_bwd(es2, sk, NULL, NULL, ds, SB, SH, ST, ST);
    void *gsk = up_act(sk, SH), *gds = up_act(ds, nr * ST);
    float *glse = up_f32(lse, nr), *gdrow = up_f32(drow, nr);
    void *gs = up_act(g0, SH), *gs2 = up_act(h0, SH);
    H->attention_sink_bwd(gs, gsk, glse, gdrow, NULL, SB, SH, ST, ST);
    H->attention_sink_bwd(gs2, gsk, NULL, NULL, gds, SB, SH, ST, ST);
    for (int i = 0; i < SH; i++) {
        es[i] = act_round(es[i]);
        es2[i] = act_round(es2[i]);
    }
    a = down_act(gs, SH);
    COMPARE("attention_sink_bwd", "16-bit dsinks += (lse)", es, a, SH, T_ACT(2.01));
    free(a), a = down_act(gs2, SH);
    COMPARE("attention_sink_bwd", "16-bit dsinks += (dscores)", es2, a, SH, T_ACT(2.01));
    free(a), free(sk), free(lse), free(drow), free(ds), free(es), free(es2);
    G->free(gsk), G->free(gds), G->free(glse), G->free(gdrow), G->free(gs), G->free(gs2);
    /* gate_wgrad: the shared gate's weight gradient, a column's sum over the rows added once */
    float *dl = frand(N, 1.0, 0), *egw = fcopy(h0, C);
    R->gate_wgrad(NULL, egw, dl, x, w, N, C);
    float *gdl = up_f32(dl, N);
    void *ggw = up_act(h0, C);
    H->gate_wgrad(NULL, ggw, gdl, dx, dw, N, C);
    for (int i = 0; i < C; i++)
        egw[i] = act_round(egw[i]);
    a = down_act(ggw, C);
    COMPARE("gate_wgrad", "16-bit dw +=", egw, a, C, T_ACT(2.01));
    free(a), free(dl), free(egw);
    G->free(gdl), G->free(ggw);
    /* adamw reads the 16-bit gradient into its fp32 update; grad_sumsq widens it */
    float *master = frand(C, 1, 0), *m = frand(C, 0.1, 0), *v = frand(C, 0.01, 0.011);
    float *em = fcopy(master, C), *emm = fcopy(m, C), *ev = fcopy(v, C);
    R->adamw(NULL, em, dy, emm, ev, C, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, 0.5f);
    float *gm_ = up_f32(master, C), *gmm = up_f32(m, C), *gv = up_f32(v, C);
    H->adamw(NULL, gm_, ddy, gmm, gv, C, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, 0.5f);
    a = down_f32(gm_, C);
    COMPARE("adamw", "16-bit grad", em, a, C, 1e-6);
    free(a);
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)dy[i] * dy[i];
    CHECK_REL(ss, H->grad_sumsq(ddy, n), 1e-12);
    CHECK_REL(R->sumsq(dy, n), R->grad_sumsq(dy, n), 0.0);
    G = F;
    free(x), free(w), free(dy), free(g0), free(h0), free(edb), free(edw), free(edb2), free(edx);
    free(e0), free(p0), free(ewte), free(ewpe), free(master), free(m), free(v), free(em);
    free(emm), free(ev);
    G->free(ddy), G->free(dx), G->free(dw), G->free(ddx), G->free(gdb), G->free(gdw);
    G->free(gdb2), G->free(gtok), G->free(gwte), G->free(gwpe), G->free(gm_), G->free(gmm);
    G->free(gv);
}

/* ---- elementwise, casts, fp32 helpers ---- */

static void test_elementwise(size_t n)
{
    float *a = arand(n, 2, 0), *b = arand(n, 2, 0), *e = fnew(n);
    void *ga = up_act(a, n), *gb = up_act(b, n), *go = dalloc(n * AB);
    R->add(e, a, b, n);
    G->add(go, ga, gb, n);
    float *h = down_act(go, n);
    COMPARE("add", "out", e, h, n, T_ACT(1.01));
    free(h);
    G->add(ga, ga, gb, n); /* out aliasing a */
    h = down_act(ga, n);
    COMPARE("add", "in place", e, h, n, T_ACT(1.01));
    free(h);
    /* views at an odd element offset: not 16-byte aligned, so the one-by-one path */
    set_act(ga, a, n);
    G->add((char *)go + AB, (char *)ga + AB, (char *)gb + AB, n - 1);
    h = down_act((char *)go + AB, n - 1);
    COMPARE("add", "unaligned", e + 1, h, n - 1, T_ACT(1.01));
    free(h);
    R->add_inplace(a, b, n);
    G->add_inplace(ga, gb, n);
    h = down_act(ga, n);
    COMPARE("add_inplace", "out +=", a, h, n, T_ACT(1.01));
    free(h);

    /* casts: exact against the host's round to nearest even, ties and tiny values included */
    float *x = frand(n, 3, 0);
    if (n > 8) {
        x[0] = 1.0f + 1.0f / 256.0f;         /* a bf16 tie: rounds to even (1) */
        x[1] = 1.0f + 3.0f / 256.0f;         /* a bf16 tie: rounds to even (1 + 2^-6) */
        x[2] = 1.0f + 1.0f / 2048.0f;        /* an fp16 tie */
        x[3] = 1e-6f;                        /* an fp16 subnormal */
        x[4] = -2e-8f;                       /* rounds to -0 in fp16 */
        x[5] = 70000.0f;                     /* fp16 overflow: inf */
        x[6] = -0.0f;
        x[7] = 1e-30f;
    }
    float *gx = up_f32(x, n), *gf = dalloc(n * 4), *ex = fnew(n);
    G->cast_to_act(go, gx, n);
    uint32_t *bits = down_bits(go, n);
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (bits[i] != act_bits(x[i]))
            bad = i;
    px_test_checks++;
    if (bad != n) {
        fprintf(stderr, "%s:%d: FAILED: cast_to_act(%.9g): expected bits 0x%04x, actual 0x%04x\n",
                __FILE__, __LINE__, x[bad], act_bits(x[bad]), bits[bad]);
        failures++;
    } else {
        printf("  %-6s %-16s %-12s n=%-8zu bit-exact round to nearest even\n", act_name(),
               "cast_to_act", "bits", n);
    }
    for (size_t i = 0; i < n; i++)
        ex[i] = act_float(bits[i]);
    G->memset0(go, n * AB);
    G->cast_to_act((char *)go + AB, gx + 1, n - 1); /* unaligned */
    uint32_t *bits1 = down_bits((char *)go + AB, n - 1);
    COMPARE_BYTES("cast_to_act", "unaligned", bits + 1, bits1, (n - 1) * sizeof *bits);
    free(bits1);
    set_act(go, ex, n); /* the bits just read */
    G->cast_to_f32(gf, go, n);
    h = down_f32(gf, n);
    COMPARE_BYTES("cast_to_f32", "values", ex, h, n * 4);
    free(h);
    /* acc_to_f32: out += act, in fp32: the same additions as the host's */
    float *acc = frand(n, 1, 0);
    G->to_device(gf, acc, n * 4);
    for (size_t i = 0; i < n; i++)
        acc[i] += ex[i];
    G->acc_to_f32(gf, go, n);
    h = down_f32(gf, n);
    COMPARE_BYTES("acc_to_f32", "out +=", acc, h, n * 4);
    free(h);
    /* scale_f32: one multiply, exact */
    G->to_device(gx, x, n * 4);
    G->scale_f32(gx, n, 0.375f);
    for (size_t i = 0; i < n; i++)
        ex[i] = x[i] * 0.375f;
    h = down_f32(gx, n);
    COMPARE_BYTES("scale_f32", "x *=", ex, h, n * 4);
    free(h);
    /* sumsq: double accumulation; all_finite */
    G->to_device(gx, x, n * 4);
    double es = R->sumsq(x, n), gs = G->sumsq(gx, n);
    CHECK_REL(es, gs, 1e-9);
    printf("  %-6s %-16s %-12s n=%-8zu %.17g vs %.17g\n", act_name(), "sumsq", "double", n, es, gs);
    CHECK(G->sumsq(gx, 0) == 0.0);
    CHECK_EQ_INT(1, G->all_finite(gx, n));
    CHECK_EQ_INT(1, G->all_finite(gx, 0));
    float nan = NAN, inf = INFINITY;
    G->to_device(gx + n - 1, &nan, 4); /* the very last element */
    CHECK_EQ_INT(0, G->all_finite(gx, n));
    CHECK_EQ_INT(1, G->all_finite(gx, n - 1));
    G->to_device(gx + n / 2, &inf, 4);
    CHECK_EQ_INT(0, G->all_finite(gx, n - 1));
    printf("  %-6s %-16s %-12s n=%-8zu finds a NaN and an inf\n", act_name(), "all_finite", "flags",
           n);
    free(a), free(b), free(e), free(x), free(ex), free(acc), free(bits);
    G->free(ga), G->free(gb), G->free(go), G->free(gx), G->free(gf);
}

static void test_dropout(size_t n)
{
    const float p = 0.3f;
    const uint64_t seed = 1234567;
    float *x = arand(n, 2, 0), *dy = arand(n, 1, 0), *eo = fnew(n), *edx = fnew(n);
    uint8_t *em = xmalloc(n), *hm = xmalloc(n);
    R->dropout_fwd(eo, em, x, n, p, seed);
    R->dropout_bwd(edx, dy, em, n, p);
    void *gx = up_act(x, n), *gdy = up_act(dy, n), *go = dalloc(n * AB);
    uint8_t *gm = dalloc(n);
    G->dropout_fwd(go, gm, gx, n, p, seed);
    G->to_host(hm, gm, n);
    COMPARE_BYTES("dropout_fwd", "mask", em, hm, n);
    float *h = down_act(go, n);
    COMPARE("dropout_fwd", "out", eo, h, n, T_ACT(1.01));
    G->dropout_fwd(gx, gm, gx, n, p, seed); /* out aliasing inp */
    float *h2 = down_act(gx, n);
    COMPARE("dropout_fwd", "in place", h, h2, n, 0.0);
    free(h), free(h2);
    G->dropout_bwd(gdy, gdy, gm, n, p); /* dinp aliasing dout */
    h = down_act(gdy, n);
    COMPARE("dropout_bwd", "dinp", edx, h, n, T_ACT(1.01));
    free(h);
    free(x), free(dy), free(eo), free(edx), free(em), free(hm);
    G->free(gx), G->free(gdy), G->free(go), G->free(gm);
}

/* ---- mixture of experts: fp32 router, act rows ---- */

/* One row of router logits whose scores are far apart: a shuffled ladder of steps of 8/E,
 * jittered by a fifth of a step. */
static void moe_ladder_row(float *x, int E)
{
    int *perm = xmalloc((size_t)E * sizeof *perm);
    const double step = 8.0 / E;
    for (int e = 0; e < E; e++)
        perm[e] = e;
    for (int e = E - 1; e > 0; e--) {
        const int j = (int)((rnd() + 1.0) * 0.5 * (e + 1)) % (e + 1), t = perm[e];
        perm[e] = perm[j], perm[j] = t;
    }
    for (int e = 0; e < E; e++)
        x[e] = (float)(step * (perm[e] - E / 2) + 0.2 * step * rnd());
    free(perm);
}

static int moe_desc(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* 1 when 0 < v[i] and every two of v[0..n) differ by more than 1e-5 of the larger: a GPU's
 * expf (within 2 ulp of the host's) cannot reorder them */
static int moe_separated(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, moe_desc);
    for (int i = 0; i + 1 < n; i++)
        if (!(v[i] - v[i + 1] > 1e-5f * v[i]))
            return 0;
    return n == 0 || v[n - 1] > 0.0f;
}

/* The reference's scores of row x, and its group scores, are all separated (moe_separated). */
static int moe_row_separated(const float *x, const KernMoeRoute *r)
{
    KernMoeRoute one = *r;
    one.N = 1, one.force_balance = 0, one.seq_rows = 1, one.seq_stride = 1, one.first = 0;
    const int E = r->E, ng = r->groups;
    float *p = fnew((size_t)E), *w = fnew((size_t)r->topk), *gs = fnew((size_t)(ng ? ng : 1));
    int32_t *idx = xmalloc((size_t)r->topk * sizeof *idx);
    R->moe_route_fwd(p, idx, w, x, &one);
    for (int g = 0; g < ng; g++) { /* the best two of each group (sorted by moe_separated) */
        const int per = E / ng;
        float *v = fcopy(p + (size_t)g * per, (size_t)per);
        qsort(v, (size_t)per, sizeof *v, moe_desc);
        gs[g] = v[0] + (per >= 2 ? v[1] : 0.0f);
        free(v);
    }
    const int ok = moe_separated(p, E) && moe_separated(gs, ng);
    free(p), free(w), free(gs), free(idx);
    return ok;
}

/* Router logits for r whose top-k never hinges on a rounding (moe_row_separated); with ties,
 * rows 0 .. 3 hold exact ties instead, which both backends must break the same way: all
 * equal; equal pairs; every group of `per` experts alike; groups whose best score is the same
 * and whose second best equals it in the odd groups only (a group's score counts a repeated
 * best twice, so the odd groups win). */
static float *moe_logits(const KernMoeRoute *r, int ties)
{
    const int N = r->N, E = r->E, per = r->groups ? E / r->groups : E;
    const double step = 8.0 / E;
    float *x = fnew((size_t)N * E);
    for (int n = 0; n < N; n++) {
        int tries = 0;
        do {
            moe_ladder_row(x + (size_t)n * E, E);
            if (++tries == 100) {
                fprintf(stderr, "test_kernels_cuda: no separated router logits for E %d\n", E);
                exit(1);
            }
        } while (!moe_row_separated(x + (size_t)n * E, r));
    }
    for (int n = 0; ties && n < N && n < 4; n++)
        for (int e = 0; e < E; e++) {
            const int g = e / per, i = e % per;
            x[(size_t)n * E + e] = n == 0   ? 0.5f
                                   : n == 1 ? (float)(-step * (e / 2))
                                   : n == 2 ? (float)(step * (i % 4))
                                   : i == 0 ? 1.0f
                                   : i == 1 ? (g % 2 ? 1.0f : 0.9f)
                                            : -1.0f;
        }
    return x;
}

static void moe_route_name(char *buf, size_t cap, const KernMoeRoute *r)
{
    snprintf(buf, cap, "%s%s E%d k%d%s", r->score == KERN_MOE_SIGMOID ? "sig" : "smax",
             r->norm_topk ? "+norm" : "", r->E, r->topk,
             r->force_balance ? " force" : r->groups ? " grp" : "");
}

/* Routing forward (also in place), backward with and without the scores' own gradient (also in
 * place), the counts and the auxiliary loss, each against kern_cpu on the same inputs. */
static void test_moe_route(KernMoeRoute r, int ties)
{
    const int N = r.N, E = r.E, K = r.topk;
    const size_t ne = (size_t)N * E, nk = (size_t)N * K;
    char what[64];
    moe_route_name(what, sizeof what, &r);
    float *logits = moe_logits(&r, ties);
    float *ep = fnew(ne), *ew = fnew(nk);
    int32_t *ei = xmalloc(nk * sizeof *ei), *hi = xmalloc(nk * sizeof *hi);
    R->moe_route_fwd(ep, ei, ew, logits, &r);
    float *gl = up_f32(logits, ne), *gp = dalloc(ne * 4), *gw = dalloc(nk * 4);
    int32_t *gi = dalloc(nk * sizeof *gi);
    G->moe_route_fwd(gp, gi, gw, gl, &r);
    float *h = down_f32(gp, ne);
    COMPARE("moe_route_fwd", what, ep, h, ne, T_F32);
    free(h), h = down_f32(gw, nk);
    COMPARE("moe_route_fwd w", what, ew, h, nk, T_F32);
    free(h);
    G->to_host(hi, gi, nk * sizeof *hi);
    COMPARE_BYTES("moe_route_fwd idx", what, ei, hi, nk * sizeof *hi);
    G->memset0(gi, nk * sizeof *gi);
    G->moe_route_fwd(gl, gi, gw, gl, &r); /* the executor scores its logits in place */
    G->to_host(hi, gi, nk * sizeof *hi);
    COMPARE_BYTES("moe_route_fwd idx", "in place", ei, hi, nk * sizeof *hi);
    h = down_f32(gl, ne);
    COMPARE("moe_route_fwd", "in place", ep, h, ne, T_F32);
    free(h);

    /* backward from the reference's probs and idx, so only the backward is measured */
    float *dw = frand(nk, 1, 0), *dprobs = frand(ne, 1, 0), *edl = fnew(ne);
    float *gdw = up_f32(dw, nk), *gdp = up_f32(dprobs, ne), *gdl = dalloc(ne * 4);
    G->to_device(gp, ep, ne * 4);
    G->to_device(gi, ei, nk * sizeof *gi);
    R->moe_route_bwd(edl, NULL, dw, ep, ei, &r);
    G->moe_route_bwd(gdl, NULL, gdw, gp, gi, &r);
    h = down_f32(gdl, ne);
    COMPARE("moe_route_bwd", "dw only", edl, h, ne, T_F32);
    free(h);
    R->moe_route_bwd(edl, dprobs, dw, ep, ei, &r);
    G->moe_route_bwd(gdl, gdp, gdw, gp, gi, &r);
    h = down_f32(gdl, ne);
    COMPARE("moe_route_bwd", "dw+dprobs", edl, h, ne, T_F32);
    free(h);
    G->moe_route_bwd(gdp, gdp, gdw, gp, gi, &r); /* dprobs is dlogits */
    h = down_f32(gdp, ne);
    COMPARE("moe_route_bwd", "in place", edl, h, ne, T_F32);
    free(h);

    /* counts (exact: integers), the loss and its gradient (exact: one product each) */
    float *ec = fnew(E), *gc = dalloc((size_t)E * 4), *edp = fnew(ne), el, hl;
    float *gloss = dalloc(4);
    R->moe_counts(ec, ei, N, K, E);
    G->moe_counts(gc, gi, N, K, E);
    h = down_f32(gc, E);
    COMPARE("moe_counts", what, ec, h, E, 0.0);
    free(h);
    const float scale = (float)(0.01 * E / ((double)nk * (N > 0 ? N : 1)));
    R->moe_aux_fwd(&el, ep, ec, N, E, scale);
    G->moe_aux_fwd(gloss, gp, gc, N, E, scale);
    G->to_host(&hl, gloss, sizeof hl);
    COMPARE("moe_aux_fwd", what, &el, &hl, 1, T_F32);
    R->moe_aux_bwd(edp, ec, N, E, scale);
    G->moe_aux_bwd(gdp, gc, N, E, scale);
    h = down_f32(gdp, ne);
    COMPARE("moe_aux_bwd", what, edp, h, ne, 0.0);
    free(h);

    free(logits), free(ep), free(ew), free(ei), free(hi), free(dw), free(dprobs), free(edl);
    free(ec), free(edp);
    G->free(gl), G->free(gp), G->free(gw), G->free(gi), G->free(gdw), G->free(gdp);
    G->free(gdl), G->free(gc), G->free(gloss);
}

static KernMoeRoute moe_route(int N, int E, int topk, KernMoeScore score, int norm_topk)
{
    KernMoeRoute r = {0};
    r.N = N, r.E = E, r.topk = topk, r.score = score, r.norm_topk = norm_topk;
    r.seq_rows = N > 0 ? N : 1;
    r.seq_stride = r.seq_rows;
    return r;
}

static KernMoeRoute moe_grouped(KernMoeRoute r, int groups, int topk_groups)
{
    r.groups = groups, r.topk_groups = topk_groups;
    return r;
}

/* The permutation of N tokens' topk copies over E experts and its three partners: indices of
 * pattern 0 from a softmax routing, 1 every copy to one of the first three experts (the others
 * empty), 2 every copy to expert E-1. Permuted rows are moved, not computed: exact; sums over
 * k are fp32 rounded once to act; dw is fp32. */
/* The all-gather dispatcher's dense routing for the routing (idx, w; gidx, gw on the device):
 * moved, not computed, so exact: the dense scores and map, back for the upper half of the
 * experts, a dense gradient picked by idx. */
static void test_moe_dense(const int32_t *idx, const int32_t *gidx, const float *w,
                           const float *gw, int N, int topk, int E, const char *what)
{
    const size_t nk = (size_t)N * topk, ne = (size_t)N * E;
    float *ep = fnew(ne), *ew = fnew(nk), *epk = fnew(nk);
    uint8_t *em = xmalloc(ne), *hm = xmalloc(ne);
    int32_t *ei = xmalloc(nk * sizeof *ei), *hi = xmalloc(nk * sizeof *hi);
    R->moe_dense(ep, em, idx, w, N, topk, E);
    R->moe_sparse(ei, ew, ep, em, N, topk, E, E / 2, E);
    R->moe_pick(epk, ep, idx, N, topk, E);
    float *gp = dalloc(ne * 4), *gw2 = dalloc(nk * 4), *gpk = dalloc(nk * 4);
    uint8_t *gm = dalloc(ne);
    int32_t *gi = dalloc(nk * 4);
    G->moe_dense(gp, gm, gidx, gw, N, topk, E);
    G->moe_sparse(gi, gw2, gp, gm, N, topk, E, E / 2, E);
    G->moe_pick(gpk, gp, gidx, N, topk, E);
    float *h = down_f32(gp, ne);
    COMPARE("moe_dense", what, ep, h, ne, 0.0);
    free(h);
    G->to_host(hm, gm, ne);
    COMPARE_BYTES("moe_dense map", what, em, hm, ne);
    G->to_host(hi, gi, nk * sizeof *hi);
    COMPARE_BYTES("moe_sparse idx", what, ei, hi, nk * sizeof *hi);
    h = down_f32(gw2, nk);
    COMPARE("moe_sparse w", what, ew, h, nk, 0.0);
    free(h), h = down_f32(gpk, nk);
    COMPARE("moe_pick", what, epk, h, nk, 0.0);
    free(h);
    free(ep), free(ew), free(epk), free(em), free(hm), free(ei), free(hi);
    G->free(gp), G->free(gw2), G->free(gpk), G->free(gm), G->free(gi);
}

static void test_moe_permute(int N, int C, int topk, int E, int pattern)
{
    const size_t nk = (size_t)N * topk, nc = (size_t)N * C, kc = nk * C;
    char what[64];
    snprintf(what, sizeof what, "%dx%d k%d E%d p%d", N, C, topk, E, pattern);
    int32_t *idx = xmalloc((nk ? nk : 1) * sizeof *idx);
    if (pattern == 0 || pattern == 3) {
        KernMoeRoute r = moe_route(N, E, topk, KERN_MOE_SOFTMAX, 0);
        float *logits = moe_logits(&r, 0), *p = fnew((size_t)N * E), *w = fnew(nk);
        R->moe_route_fwd(p, idx, w, logits, &r);
        if (pattern == 3 && nk > 0) {
            /* a capacity of half the balanced share: the device's marks equal the reference's
             * exactly, and the permutation family below runs on the dropped copies */
            const int cap = (int)((nk / (size_t)E + 1) / 2);
            int32_t *gi = up_bytes(idx, nk * sizeof *idx), *hi = xmalloc(nk * sizeof *hi);
            float *gw0 = up_f32(w, nk);
            R->moe_drop(idx, w, N, topk, E, cap);
            G->moe_drop(gi, gw0, N, topk, E, cap);
            G->to_host(hi, gi, nk * sizeof *hi);
            COMPARE_BYTES("moe_drop idx", what, idx, hi, nk * sizeof *hi);
            free(hi), G->free(gi), G->free(gw0);
        }
        free(logits), free(p), free(w);
    } else {
        for (size_t i = 0; i < nk; i++)
            idx[i] = pattern == 1 ? (int32_t)((i * 7 + i / 5) % 3) : E - 1;
    }
    float *x = arand(nc, 1, 0), *dout = arand(kc, 1, 0), *eout = arand(kc, 1, 0);
    float *dy = arand(nc, 1, 0), *w = frand(nk, 0.5, 0.5);
    float *eo = fnew(kc), *edx = fnew(nc), *ey = fnew(nc), *ede = fnew(kc), *edw = fnew(nk);
    int32_t *ecnt = xmalloc((size_t)E * 4), *erow = xmalloc((nk ? nk : 1) * 4);
    int32_t *hcnt = xmalloc((size_t)E * 4), *hrow = xmalloc((nk ? nk : 1) * 4);
    R->moe_permute(eo, ecnt, erow, x, idx, N, C, topk, E);
    R->moe_permute_bwd(edx, dout, idx, N, C, topk, E);
    R->moe_unpermute(ey, eout, w, idx, N, C, topk, E);
    R->moe_unpermute_bwd(ede, edw, dy, eout, w, idx, N, C, topk, E);

    int32_t *gidx = up_bytes(idx, (nk ? nk : 1) * sizeof *idx);
    void *gx = up_act(x, nc), *gdout = up_act(dout, kc), *geout = up_act(eout, kc);
    void *gdy = up_act(dy, nc), *go = dalloc(kc * AB), *gdx = dalloc(nc * AB);
    void *gy = dalloc(nc * AB), *gde = dalloc(kc * AB);
    float *gw = up_f32(w, nk), *gdw = dalloc(nk * 4);
    int32_t *gcnt = dalloc((size_t)E * 4), *grow = dalloc((nk ? nk : 1) * 4);
    int32_t junk[4] = {7, 7, 7, 7};
    G->to_device(gcnt, junk, (size_t)(E < 4 ? E : 4) * 4); /* counts are overwritten */
    G->moe_permute(go, gcnt, grow, gx, gidx, N, C, topk, E);
    float *h = down_act(go, kc);
    COMPARE("moe_permute", what, eo, h, kc, 0.0);
    free(h);
    G->to_host(hcnt, gcnt, (size_t)E * 4);
    COMPARE_BYTES("moe_permute counts", what, ecnt, hcnt, (size_t)E * 4);
    G->to_host(hrow, grow, nk * 4);
    COMPARE_BYTES("moe_permute row_of", what, erow, hrow, nk * 4);
    G->memset0(go, kc * AB);
    G->moe_permute(go, gcnt, NULL, gx, gidx, N, C, topk, E);
    h = down_act(go, kc);
    COMPARE("moe_permute", "no row_of", eo, h, kc, 0.0);
    free(h);

    G->moe_permute_bwd(gdx, gdout, gidx, N, C, topk, E);
    h = down_act(gdx, nc);
    COMPARE("moe_permute_bwd", what, edx, h, nc, T_ACT(1.01));
    free(h);
    G->moe_unpermute(gy, geout, gw, gidx, N, C, topk, E);
    h = down_act(gy, nc);
    COMPARE("moe_unpermute", what, ey, h, nc, T_ACT(1.01));
    free(h);
    G->moe_unpermute_bwd(gde, gdw, gdy, geout, gw, gidx, N, C, topk, E);
    h = down_act(gde, kc);
    COMPARE("moe_unpermute_bwd", "deout", ede, h, kc, T_ACT(1.01));
    free(h), h = down_f32(gdw, nk);
    COMPARE("moe_unpermute_bwd", "dw", edw, h, nk, T_F32);
    free(h);
    test_moe_dense(idx, gidx, w, gw, N, topk, E, what);

    free(idx), free(x), free(dout), free(eout), free(dy), free(w), free(eo), free(edx);
    free(ey), free(ede), free(edw), free(ecnt), free(erow), free(hcnt), free(hrow);
    G->free(gidx), G->free(gx), G->free(gdout), G->free(geout), G->free(gdy), G->free(go);
    G->free(gdx), G->free(gy), G->free(gde), G->free(gw), G->free(gdw), G->free(gcnt);
    G->free(grow);
}

/* No tokens: the counts are still overwritten with zeros, and nothing else is touched. */
static void test_moe_empty(void)
{
    const int E = 5;
    int32_t junk[5] = {1, 2, 3, 4, 5}, zero[5] = {0}, h[5];
    int32_t *gcnt = up_bytes(junk, sizeof junk);
    float *gc = up_f32((const float[5]){1, 2, 3, 4, 5}, E), hc[5], zf[5] = {0};
    G->moe_permute(NULL, gcnt, NULL, NULL, NULL, 0, 8, 2, E);
    G->to_host(h, gcnt, sizeof h);
    COMPARE_BYTES("moe_permute counts", "no tokens", zero, h, sizeof h);
    G->moe_counts(gc, NULL, 0, 2, E);
    G->to_host(hc, gc, sizeof hc);
    COMPARE_BYTES("moe_counts", "no tokens", zf, hc, sizeof hc);
    G->free(gcnt), G->free(gc);
}

static void test_moe(void)
{
    /* softmax top-k, raw and renormalised; sigmoid (always renormalised); E beyond a warp's
     * 32 lanes and not a multiple of them */
    test_moe_route(moe_route(37, 16, 4, KERN_MOE_SOFTMAX, 0), 1);
    test_moe_route(moe_route(37, 16, 4, KERN_MOE_SOFTMAX, 1), 1);
    test_moe_route(moe_route(50, 64, 6, KERN_MOE_SOFTMAX, 1), 1);
    test_moe_route(moe_route(50, 200, 8, KERN_MOE_SIGMOID, 0), 1);
    test_moe_route(moe_route(9, 1, 1, KERN_MOE_SOFTMAX, 0), 0); /* one expert */
    test_moe_route(moe_route(5, KERN_MOE_MAX_EXPERTS, 8, KERN_MOE_SIGMOID, 0), 1);
    /* group-limited (DeepSeek-V3: 256 experts in 8 groups, 4 groups, top-8, sigmoid); groups
     * of one expert; as many groups as lanes and more */
    test_moe_route(moe_grouped(moe_route(21, 256, 8, KERN_MOE_SIGMOID, 0), 8, 4), 1);
    test_moe_route(moe_grouped(moe_route(21, 64, 6, KERN_MOE_SOFTMAX, 1), 8, 3), 1);
    test_moe_route(moe_grouped(moe_route(21, 64, 6, KERN_MOE_SOFTMAX, 0), 8, 3), 1);
    test_moe_route(moe_grouped(moe_route(13, 8, 2, KERN_MOE_SOFTMAX, 0), 8, 4), 1);
    test_moe_route(moe_grouped(moe_route(13, 128, 4, KERN_MOE_SIGMOID, 0), 64, 5), 1);
    /* forced balance: two sequences of 20 of 30 tokens from global id 5 */
    KernMoeRoute fb = moe_route(40, 16, 2, KERN_MOE_SOFTMAX, 0);
    fb.force_balance = 1, fb.first = 5, fb.seq_rows = 20, fb.seq_stride = 30;
    test_moe_route(fb, 0);
    fb.score = KERN_MOE_SIGMOID;
    test_moe_route(fb, 0);
    test_moe_route(moe_route(0, 8, 2, KERN_MOE_SOFTMAX, 0), 0); /* no tokens */

    test_moe_permute(37, 70, 4, 16, 0);
    test_moe_permute(37, 70, 4, 16, 1); /* most experts empty */
    test_moe_permute(600, 24, 4, 16, 0); /* several blocks (256 tokens each at topk 4) */
    test_moe_permute(1500, 9, 1, 7, 0);  /* topk 1, E not a power of two */
    test_moe_permute(300, 16, 8, 64, 2); /* every copy to the last expert */
    test_moe_permute(3, 33, 10, 10, 0);  /* topk = E: every expert once per token */
    test_moe_permute(37, 70, 4, 16, 3);  /* token dropping at half the balanced share */
    test_moe_empty();
    if (large) {
        test_moe_route(moe_grouped(moe_route(4096, 256, 8, KERN_MOE_SIGMOID, 0), 8, 4), 1);
        test_moe_permute(4096, 1024, 8, 64, 0);
    }
}

/* ---- the suite, per act dtype ---- */

/* ---- FP8 (kernels.h's KernFp8): quantize and dequantize against bytes computed by hand and
 * against a host quantizer written from kernels.h's words; matmul_fp8 against products of the
 * decoded values; the amax history over three steps; then all of them against the CPU
 * backend on inputs with NaN, infinities and extreme ranges ---- */

static float fp8_val(uint8_t q, int e5m2)
{
    return e5m2 ? px_e5m2_to_float(q) : px_e4m3_to_float(q);
}

static uint8_t fp8_enc(float v, int e5m2)
{
    return e5m2 ? px_float_to_e5m2(v) : px_float_to_e4m3(v);
}

static float e8m0_val(uint8_t e) { return e == 0xff ? NAN : ldexpf(1.0f, (int)e - 127); }

/* An amax as expected: the same bits, or NaN for NaN (its payload is no part of the contract:
 * converting an act NaN to fp32 may give any NaN on a GPU) */
static int fp8_amax_same(float e, float a) { return e != e ? a != a : f2u(e) == f2u(a); }

static size_t fp8_block(const KernFp8 *f, int r, int c)
{
    const int nbc = (f->cols + f->block_c - 1) / f->block_c;
    return (size_t)(r / f->block_r) * nbc + c / f->block_c;
}

/* scale i of q's tail, as a decode factor */
static float fp8_scale(const uint8_t *q, const KernFp8 *f, size_t i)
{
    const uint8_t *tail = q + (size_t)f->rows * f->cols;
    if (f->e8m0)
        return e8m0_val(tail[i]);
    float s;
    memcpy(&s, tail + 4 * i, 4);
    return s;
}

static void fp8_put_scale(uint8_t *q, const KernFp8 *f, size_t i, float s)
{
    memcpy(q + (size_t)f->rows * f->cols + 4 * i, &s, 4);
}

/* q's values [rows, cols] in fp32 */
static float *fp8_values(const uint8_t *q, const KernFp8 *f)
{
    float *v = fnew((size_t)f->rows * f->cols);
    for (int r = 0; r < f->rows; r++)
        for (int c = 0; c < f->cols; c++) {
            const size_t i = (size_t)r * f->cols + c;
            v[i] = fp8_val(q[i], f->e5m2) * fp8_scale(q, f, fp8_block(f, r, c));
        }
    return v;
}

/* kernels.h's fp8_quantize with current scaling, on the host */
static void fp8_ref_quantize(uint8_t *q, const float *x, const KernFp8 *f, int trans)
{
    const size_t ns = kern_fp8_scales(f);
    float *amax = fnew(ns);
    for (int r = 0; r < f->rows; r++)
        for (int c = 0; c < f->cols; c++) {
            const size_t b = fp8_block(f, r, c);
            const float v = trans ? x[(size_t)c * f->rows + r] : x[(size_t)r * f->cols + c];
            amax[b] = fmaxf(amax[b], fabsf(v));
        }
    for (size_t b = 0; b < ns; b++) {
        if (f->e8m0) {
            int e = 0;
            frexpf(amax[b], &e);
            q[(size_t)f->rows * f->cols + b] =
                amax[b] == 0.0f ? 127 : (uint8_t)(e - 1 - (f->e5m2 ? 15 : 8) + 127);
        } else {
            const float fmax = f->e5m2 ? 57344.0f : 448.0f;
            fp8_put_scale(q, f, b, amax[b] == 0.0f ? 1.0f : amax[b] / fmax);
        }
    }
    for (int r = 0; r < f->rows; r++)
        for (int c = 0; c < f->cols; c++) {
            const float v = trans ? x[(size_t)c * f->rows + r] : x[(size_t)r * f->cols + c];
            q[(size_t)r * f->cols + c] = fp8_enc(v / fp8_scale(q, f, fp8_block(f, r, c)), f->e5m2);
        }
    free(amax);
}

/* Quantizes x on the device (given: a delayed scale, or NULL), checks q byte for byte against
 * expect and the amax against expect_amax, then dequantizes q on the device and checks each
 * value against fp8 value x scale rounded to act (NaN for NaN). */
static void fp8_check(const char *what, const KernFp8 *f, int trans, const float *given,
                      const float *x, const uint8_t *expect, float expect_amax)
{
    const size_t n = (size_t)f->rows * f->cols, bytes = kern_fp8_bytes(f);
    void *dx = up_act(x, n), *dq = dalloc(bytes);
    float *damax = dalloc(sizeof(float)), *dscale = given ? up_f32(given, 1) : NULL;
    G->fp8_quantize(dq, damax, dx, f, trans, dscale);
    uint8_t *q = xmalloc(bytes);
    G->to_host(q, dq, bytes);
    COMPARE_BYTES("fp8_quantize", what, expect, q, bytes);
    float amax;
    G->to_host(&amax, damax, sizeof amax);
    px_test_checks++;
    if (!fp8_amax_same(expect_amax, amax)) {
        fprintf(stderr, "%s:%d: FAILED: fp8_quantize %s (%s): amax\n  expected %.9g\n  actual   "
                "%.9g\n", __FILE__, __LINE__, what, act_name(), (double)expect_amax, (double)amax);
        failures++;
    }
    void *dy = dalloc(n * AB);
    G->fp8_dequantize(dy, dq, f);
    uint32_t *y = down_bits(dy, n);
    float *v = fp8_values(q, f);
    for (size_t i = 0; i < n; i++) {
        const float got = act_float(y[i]);
        if (v[i] != v[i])
            CHECK(got != got);
        else if (act_bits(v[i]) != y[i]) {
            fprintf(stderr, "%s:%d: FAILED: fp8_dequantize %s (%s): element %zu: expected %.9g, "
                    "got %.9g\n", __FILE__, __LINE__, what, act_name(), i,
                    (double)act_round(v[i]), (double)got);
            failures++;
            break;
        }
    }
    px_test_checks++;
    printf("  %-6s %-16s %-12s %zu values exact\n", act_name(), "fp8_dequantize", what, n);
    free(q), free(y), free(v);
    G->free(dx), G->free(dq), G->free(damax), G->free(dscale), G->free(dy);
}

static void test_fp8_hand(void)
{
    const float nan = NAN;
    /* per tensor, E4M3: amax 448, scale 1; 3.125 is a tie between 3 and 3.25: to even (3) */
    {
        const KernFp8 f = {2, 3, 2, 3, 0, 0};
        const float x[] = {448, -1, 0.5f, 3.125f, 0, -448};
        uint8_t e[6 + 4] = {0x7e, 0xb8, 0x30, 0x44, 0x00, 0xfe};
        fp8_put_scale(e, &f, 0, 1.0f);
        fp8_check("tensor", &f, 0, NULL, x, e, 448.0f);
    }
    /* trans: q [2,3] is x [3,2] transposed */
    {
        const KernFp8 f = {2, 3, 2, 3, 0, 0};
        const float x[] = {1, 2, 3, 4, 5, 448};
        uint8_t e[6 + 4] = {0x38, 0x44, 0x4a, 0x40, 0x48, 0x7e};
        fp8_put_scale(e, &f, 0, 1.0f);
        fp8_check("tensor T", &f, 1, NULL, x, e, 448.0f);
    }
    /* 1 x 128 over 2 x 130: a partial block of 2 columns per row; an all-zero block gets 1 */
    {
        const KernFp8 f = {2, 130, 1, 128, 0, 0};
        float x[260] = {0};
        x[0] = 7, x[1] = 1;                        /* scale 7/448 = 2^-6: 448, 64 */
        x[129] = -0.5f;                            /* scale 0.5/448: -448 */
        x[130 + 128] = 3, x[130 + 129] = 0.09375f; /* scale 3/448: 448, 14 */
        uint8_t e[260 + 16] = {0};
        e[0] = 0x7e, e[1] = 0x68, e[129] = 0xfe, e[130 + 128] = 0x7e, e[130 + 129] = 0x56;
        fp8_put_scale(e, &f, 0, 7.0f / 448.0f);
        fp8_put_scale(e, &f, 1, 0.5f / 448.0f);
        fp8_put_scale(e, &f, 2, 1.0f);
        fp8_put_scale(e, &f, 3, 3.0f / 448.0f);
        fp8_check("1x128", &f, 0, NULL, x, e, 7.0f);
    }
    /* 128 x 128 over 130 x 129: partial blocks down and across */
    {
        const KernFp8 f = {130, 129, 128, 128, 0, 0};
        const size_t n = 130 * 129;
        float *x = fnew(n);
        uint8_t *e = xmalloc(n + 16);
        x[5 * 129 + 7] = 896, e[5 * 129 + 7] = 0x7e;          /* block (0,0): scale 2 */
        x[127 * 129 + 127] = -2, e[127 * 129 + 127] = 0xb8;   /* -1 */
        x[128] = 28, e[128] = 0x7e;                           /* block (0,1): scale 2^-4 */
        x[100 * 129 + 128] = 1, e[100 * 129 + 128] = 0x58;    /* 16 */
        x[129 * 129 + 128] = -5, e[129 * 129 + 128] = 0xfe;   /* block (1,1): 5/448 */
        fp8_put_scale(e, &f, 0, 2.0f);
        fp8_put_scale(e, &f, 1, 0.0625f);
        fp8_put_scale(e, &f, 2, 1.0f); /* block (1,0): all zero */
        fp8_put_scale(e, &f, 3, 5.0f / 448.0f);
        fp8_check("128x128", &f, 0, NULL, x, e, 896.0f);
        free(x), free(e);
    }
    /* MXFP8, 1 x 32 with E8M0 over 1 x 96: amax 3 -> 2^(1 - 8); amax 500 -> 2^(8 - 8) and 500
     * saturates (the OCP rule's known clipping); an all-zero block gets 2^0 */
    {
        const KernFp8 f = {1, 96, 1, 32, 0, 1};
        float x[96] = {0};
        uint8_t e[96 + 3] = {0};
        x[0] = 3, e[0] = 0x7c;      /* 384 */
        x[1] = 1, e[1] = 0x70;      /* 128 */
        x[2] = 0.01f, e[2] = 0x3a;  /* 1.28 -> 1.25 */
        x[32] = 500, e[32] = 0x7e;  /* 448 */
        x[33] = -0.001f, e[33] = 0x81; /* 0.51 of E4M3's smallest subnormal 2^-9: rounds up */
        e[96] = 120, e[97] = 127, e[98] = 127;
        fp8_check("1x32 e8m0", &f, 0, NULL, x, e, 500.0f);
    }
    /* E5M2: per tensor, amax 7 -> scale 7/57344 = 2^-13; MXFP8 E5M2: emax 15 */
    {
        const KernFp8 f = {1, 4, 1, 4, 1, 0};
        const float x[] = {7, -1, 0, 3};
        uint8_t e[4 + 4] = {0x7b, 0xf0, 0x00, 0x76};
        fp8_put_scale(e, &f, 0, 7.0f / 57344.0f);
        fp8_check("e5m2", &f, 0, NULL, x, e, 7.0f);
        const KernFp8 g = {1, 32, 1, 32, 1, 1};
        float y[32] = {0};
        uint8_t eg[32 + 1] = {0};
        y[31] = 1, eg[31] = 0x78; /* 2^15 */
        eg[32] = 112;             /* 2^(0 - 15) */
        fp8_check("e5m2 e8m0", &g, 0, NULL, y, eg, 1.0f);
    }
    /* delayed scaling (a given scale, 0.5): saturation of finite values and of infinity, NaN
     * kept; amax still measured, NaN propagating */
    {
        const KernFp8 f = {1, 6, 1, 6, 0, 0};
        const float x[] = {300, -1000, nan, INFINITY, 0.75f, -0.0f}, s = 0.5f;
        uint8_t e[6 + 4] = {0x7e, 0xfe, 0x7f, 0x7e, 0x3c, 0x80};
        fp8_put_scale(e, &f, 0, s);
        fp8_check("delayed sat", &f, 0, &s, x, e, nan);
        const KernFp8 g = {1, 3, 1, 3, 1, 0};
        const float y[] = {nan, 1e6f, -57344};
        uint8_t eg[3 + 4] = {0x7f, 0x7b, 0xfb};
        fp8_put_scale(eg, &g, 0, 1.0f);
        const float one = 1.0f;
        fp8_check("delayed e5m2", &g, 0, &one, y, eg, nan);
    }
    /* current scaling ignores a NaN and an infinity: the others scale by the finite maximum,
     * the infinity saturates, -NaN keeps its sign (0xff, as px_float_to_e4m3); the amax output
     * is NaN */
    {
        const KernFp8 f = {1, 5, 1, 5, 0, 0};
        const float x[] = {nan, 448, -2, -INFINITY, u2f(0xffc00000u)};
        uint8_t e[5 + 4] = {0x7f, 0x7e, 0xc0, 0xfe, 0xff};
        fp8_put_scale(e, &f, 0, 1.0f);
        fp8_check("nan", &f, 0, NULL, x, e, nan);
    }
}

/* random x, every layout, both orientations: q byte for byte as the host quantizer's */
static void test_fp8_random(int rows, int cols, int br, int bc, int e5m2, int e8m0, int trans)
{
    const KernFp8 f = {rows, cols, br, bc, e5m2, e8m0};
    const size_t n = (size_t)rows * cols, bytes = kern_fp8_bytes(&f);
    float *x = arand(n, 2.0, 0.0);
    for (size_t i = 0; i < n; i += 7)
        x[i] = act_round(x[i] * (float)(1 << (i % 11))); /* blocks of different ranges */
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    uint8_t *e = xmalloc(bytes);
    fp8_ref_quantize(e, x, &f, trans);
    char what[64];
    snprintf(what, sizeof what, "%dx%d/%dx%d%s%s%s", rows, cols, br, bc, e5m2 ? " e5m2" : "",
             e8m0 ? " e8m0" : "", trans ? " T" : "");
    fp8_check(what, &f, trans, NULL, x, e, amax);
    free(x), free(e);
}

/* The host reference: alpha op(A) op(B) + beta C0 from A's and B's decoded values, in double. */
static float *fp8_ref_matmul(const uint8_t *qa, const KernFp8 *fa, const uint8_t *qb,
                             const KernFp8 *fb, const float *c0, int m, int n, int k, int ta,
                             int tb, float alpha, float beta)
{
    float *va = fp8_values(qa, fa), *vb = fp8_values(qb, fb), *c = fnew((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int l = 0; l < k; l++)
                s += (double)va[ta ? (size_t)l * m + i : (size_t)i * k + l] *
                     vb[tb ? (size_t)j * k + l : (size_t)l * n + j];
            const double old = beta == 0.0f ? 0.0 : beta * c0[(size_t)i * n + j];
            c[(size_t)i * n + j] = (float)(alpha * s + old);
        }
    free(va), free(vb);
    return c;
}

/* Tolerances of matmul_fp8. cuBLASLt's path (per tensor, TN) multiplies the exact FP8 values:
 * only the output's rounding to act, or on a GPU the FP8 tensor cores' accumulator, which
 * keeps fewer bits than fp32 (about 14 on H800: DeepSeek-V3 report, section 3.3.2), hence a
 * looser fp32 bound. The dequantizing path rounds each decoded value to act once more. */
#define T_FP8_LT_F32 1e-3
/* cuBLASLt's act output: the accumulator's bound too, which exceeds 1.5 u when act is fp32
 * (measured on an H200, 2026-11-30: 6.3e-4 relative at 512x768x1024, 2.5e-4 at 32x48x64) */
#define T_FP8_LT_ACT (T_ACT(1.5) > T_FP8_LT_F32 ? T_ACT(1.5) : T_FP8_LT_F32)

/* operands quantized on the device from random act data (a: layout la, b: lb) */
static void test_fp8_matmul_case(int m, int n, int k, int ta, int tb, KernFp8 la, KernFp8 lb,
                                 const char *name)
{
    la.rows = ta ? k : m, la.cols = ta ? m : k;
    lb.rows = tb ? n : k, lb.cols = tb ? k : n;
    const size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    float *a = arand(na, 1.0, 0.0), *b = arand(nb, 1.0, 0.0), *c0 = arand(nc, 1.0, 0.0);
    void *dxa = up_act(a, na), *dxb = up_act(b, nb);
    void *dqa = dalloc(kern_fp8_bytes(&la)), *dqb = dalloc(kern_fp8_bytes(&lb));
    G->fp8_quantize(dqa, NULL, dxa, &la, 0, NULL);
    G->fp8_quantize(dqb, NULL, dxb, &lb, 0, NULL);
    uint8_t *qa = xmalloc(kern_fp8_bytes(&la)), *qb = xmalloc(kern_fp8_bytes(&lb));
    G->to_host(qa, dqa, kern_fp8_bytes(&la));
    G->to_host(qb, dqb, kern_fp8_bytes(&lb));
    const int lt = !ta && tb && m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && !la.e8m0 &&
                   !lb.e8m0 && la.block_r >= la.rows && la.block_c >= la.cols &&
                   lb.block_r >= lb.rows && lb.block_c >= lb.cols;
    char what[80];
    snprintf(what, sizeof what, "%dx%dx%d %c%c %s%s", m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N',
             name, lt ? " lt" : "");
    /* act output, alpha 0.75, beta 0.5 */
    float *ec = fp8_ref_matmul(qa, &la, qb, &lb, c0, m, n, k, ta, tb, 0.75f, 0.5f);
    void *dc = up_act(c0, nc);
    G->matmul_fp8(dc, G->act, dqa, &la, dqb, &lb, m, n, k, ta, tb, 0.75f, 0.5f);
    float *gc = down_act(dc, nc);
    COMPARE("matmul_fp8 act", what, ec, gc, nc, lt ? T_FP8_LT_ACT : T_ACT(3));
    free(ec), free(gc), G->free(dc);
    /* fp32 output, beta 0 (c holds garbage that must not be read) */
    float *junk = fnew(nc);
    fill(junk, nc, NAN);
    float *dcf = up_f32(junk, nc);
    ec = fp8_ref_matmul(qa, &la, qb, &lb, junk, m, n, k, ta, tb, 1.0f, 0.0f);
    G->matmul_fp8(dcf, PX_FP32, dqa, &la, dqb, &lb, m, n, k, ta, tb, 1.0f, 0.0f);
    gc = down_f32(dcf, nc);
    COMPARE("matmul_fp8 fp32", what, ec, gc, nc, lt ? T_FP8_LT_F32 : T_ACT(3));
    free(ec), free(gc), free(junk), G->free(dcf);
    free(a), free(b), free(c0), free(qa), free(qb);
    G->free(dxa), G->free(dxb), G->free(dqa), G->free(dqb);
}

static void test_fp8_matmul(void)
{
    const KernFp8 tensor = {0, 0, 1 << 30, 1 << 30, 0, 0}, tensor5 = {0, 0, 1 << 30, 1 << 30, 1, 0};
    const KernFp8 row128 = {0, 0, 1, 128, 0, 0}, blk128 = {0, 0, 128, 128, 0, 0};
    const KernFp8 mx = {0, 0, 1, 32, 0, 1};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_fp8_matmul_case(32, 48, 64, ta, tb, tensor, tensor, "tensor");
            test_fp8_matmul_case(5, 7, 9, ta, tb, tensor, tensor, "tensor");
            test_fp8_matmul_case(16, 32, 48, ta, tb, tensor, tensor5, "e4m3 x e5m2");
            test_fp8_matmul_case(9, 20, 130, ta, tb, row128, blk128, "1x128 x 128x128");
            test_fp8_matmul_case(6, 10, 96, ta, tb, mx, mx, "mxfp8");
        }
    if (large)
        test_fp8_matmul_case(512, 768, 1024, 0, 1, tensor, tensor, "tensor");
}

static void test_fp8_amax_update(void)
{
    enum { LEN = 4, N = 3 };
    const float fmax[N] = {448, 57344, 448};
    const float steps[3][N] = {{2, 0, 10}, {5, 0, 1}, {1, 0, 3}};
    /* the scale after each step: max over the history / fmax, 1 where it is all zero */
    const float want[3][N] = {{2.0f / 448, 1, 10.0f / 448},
                              {5.0f / 448, 1, 10.0f / 448},
                              {5.0f / 448, 1, 10.0f / 448}};
    float *dh = dalloc(LEN * N * sizeof(float)), *ds = dalloc(N * sizeof(float));
    float *dfmax = up_f32(fmax, N), *damax = dalloc(N * sizeof(float));
    for (int s = 0; s < 3; s++) {
        G->to_device(damax, steps[s], sizeof steps[s]);
        G->fp8_amax_update(dh, ds, damax, dfmax, LEN, N);
        float *sc = down_f32(ds, N);
        for (int i = 0; i < N; i++)
            CHECK(sc[i] == want[s][i]);
        free(sc);
    }
    /* rows, newest first: step 3, step 2, step 1, the initial zeros */
    float *h = down_f32(dh, LEN * N);
    for (int i = 0; i < N; i++) {
        CHECK(h[0 * N + i] == steps[2][i]);
        CHECK(h[1 * N + i] == steps[1][i]);
        CHECK(h[2 * N + i] == steps[0][i]);
        CHECK(h[3 * N + i] == 0.0f);
    }
    printf("  %-6s %-16s %-12s 3 steps exact\n", act_name(), "fp8_amax_update", "4x3");
    free(h);
    G->free(dh), G->free(ds), G->free(dfmax), G->free(damax);
}

/* ---- FP8 against the CPU backend: both follow kernels/cpu/fp8.c's rules for NaN,
 * infinities, scale underflow and E8M0 clamping, so quantize gives the same bytes and amax ---- */

/* Inputs of a rows x cols FP8 tensor in x's order (x [cols, rows] when trans), rounded to act.
 * Uniform values whose range depends on the row of q, so that a 1 x N block sees one range:
 * ordinary ones of three scales, tiny ones (bf16's subnormal range; fp16 flushes them), huge
 * ones (infinite in fp16), and a row of NaN and infinities only; then, anywhere, a few NaN of
 * either sign, infinities and tiny and huge values. With tiny, every finite row is tiny (an
 * E8M0 exponent below -127, an fp32 scale in the subnormal range). For a matmul operand
 * (operand): no NaN (a NaN row of C says little), no row of infinities only (its block would
 * decode to +-fmax, as would one of zeros and infinities: the tiny rows stay within fp16's
 * range), and otherwise values of one size, as test_fp8_matmul_case's, for which its
 * tolerances hold (they are relative to rms(C): rows of A or B of different sizes would need
 * looser ones); the infinities left saturate to about their block's largest finite |x|. */
static float *fp8_wild(int rows, int cols, int trans, int tiny, int operand)
{
    const size_t n = (size_t)rows * cols;
    const float qnan = u2f(0x7fc00000u), qnan_neg = u2f(0xffc00000u);
    const float big = operand ? 1.0f : 0x1p100f, small = operand ? 0x1p-12f : 0x1p-128f;
    const float scales[6] = {1.0f, operand ? 1.0f : 0x1p-6f, operand ? 1.0f : 0x1p9f, small, big,
                             1.0f};
    const float special[6] = {operand ? INFINITY : qnan, operand ? -INFINITY : qnan_neg,
                              INFINITY, -INFINITY, 0x1p-133f, operand ? 1.0f : 3e38f};
    float *x = fnew(n);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const size_t i = trans ? (size_t)c * rows + r : (size_t)r * cols + c;
            float v;
            if (r % 6 == 5 && !operand)
                v = special[(size_t)((rnd() + 1.0) * 2.0)]; /* NaN or infinity only */
            else if (tiny)
                v = (float)rnd() * ldexpf(1.0f, -120 - r % 8);
            else
                v = (float)rnd() * scales[r % 6];
            if (rnd() > 0.97)
                v = special[(size_t)((rnd() + 1.0) * 3.0)];
            x[i] = act_round(v);
        }
    return x;
}

/* quantize, the amax and dequantize of G and of the CPU backend on the same act-rounded x:
 * identical bytes, amax, and values (NaN for NaN) */
static void fp8_vs_cpu(int rows, int cols, int br, int bc, int e5m2, int e8m0, int trans,
                       int tiny)
{
    const KernFp8 f = {rows, cols, br, bc, e5m2, e8m0};
    const size_t n = (size_t)rows * cols, bytes = kern_fp8_bytes(&f);
    const int one_block = br >= rows && bc >= cols;
    char what[64];
    snprintf(what, sizeof what, "%dx%d/%dx%d%s%s%s%s", rows, cols, one_block ? rows : br,
             one_block ? cols : bc, e5m2 ? " e5m2" : "", e8m0 ? " e8m0" : "", trans ? " T" : "",
             tiny ? " tiny" : "");
    float *x = fp8_wild(rows, cols, trans, tiny, 0);
    void *dx = up_act(x, n), *dq = dalloc(bytes);
    float *damax = dalloc(sizeof(float));
    uint8_t *e = xmalloc(bytes), *q = xmalloc(bytes);
    /* current scaling, then (one block only) delayed scaling with a given power of two */
    for (int delayed = 0; delayed <= one_block; delayed++) {
        const float given = 0.125f;
        float *dgiven = delayed ? up_f32(&given, 1) : NULL;
        float eamax, amax;
        R->fp8_quantize(e, &eamax, x, &f, trans, delayed ? &given : NULL);
        G->fp8_quantize(dq, damax, dx, &f, trans, dgiven);
        G->to_host(q, dq, bytes);
        G->to_host(&amax, damax, sizeof amax);
        char tag[80];
        snprintf(tag, sizeof tag, "%s%s", what, delayed ? " dl" : "");
        COMPARE_BYTES("fp8_quantize cpu", tag, e, q, bytes);
        px_test_checks++;
        if (!fp8_amax_same(eamax, amax)) {
            fprintf(stderr, "%s:%d: FAILED: fp8_quantize cpu %s (%s): amax\n  expected %.9g "
                    "(0x%08x)\n  actual   %.9g (0x%08x)\n", __FILE__, __LINE__, tag, act_name(),
                    (double)eamax, f2u(eamax), (double)amax, f2u(amax));
            failures++;
        }
        G->free(dgiven);
    }
    /* the tensor transposed (the last quantize's, delayed where it ran), its scales' grid
     * with it: the CPU's bytes */
    {
        uint8_t *et = xmalloc(bytes), *t = xmalloc(bytes);
        void *dt = dalloc(bytes);
        R->fp8_transpose(et, e, &f);
        G->fp8_transpose(dt, dq, &f);
        G->to_host(t, dt, bytes);
        COMPARE_BYTES("fp8_transpose cpu", what, et, t, bytes);
        px_test_checks++;
        free(et), free(t);
        G->free(dt);
    }
    /* dequantize: the CPU's fp32 values rounded to act */
    float *ev = fnew(n);
    R->fp8_dequantize(ev, e, &f);
    void *dy = dalloc(n * AB);
    G->fp8_dequantize(dy, dq, &f);
    uint32_t *y = down_bits(dy, n);
    for (size_t i = 0; i < n; i++) {
        const float got = act_float(y[i]);
        if (ev[i] != ev[i] ? got == got : act_bits(ev[i]) != y[i]) {
            fprintf(stderr, "%s:%d: FAILED: fp8_dequantize cpu %s (%s): element %zu: expected "
                    "%.9g, got %.9g\n", __FILE__, __LINE__, what, act_name(), i,
                    (double)act_round(ev[i]), (double)got);
            failures++;
            break;
        }
    }
    px_test_checks++;
    free(x), free(e), free(q), free(ev), free(y);
    G->free(dx), G->free(dq), G->free(damax), G->free(dy);
}

/* matmul_fp8 of G and of the CPU backend on operands quantized by each from the same wild
 * data (the same bytes), within test_fp8_matmul_case's tolerances */
static void fp8_matmul_vs_cpu(int m, int n, int k, int ta, int tb, KernFp8 la, KernFp8 lb,
                              const char *name)
{
    la.rows = ta ? k : m, la.cols = ta ? m : k;
    lb.rows = tb ? n : k, lb.cols = tb ? k : n;
    const size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    const size_t ba = kern_fp8_bytes(&la), bb = kern_fp8_bytes(&lb);
    float *a = fp8_wild(la.rows, la.cols, 0, 0, 1), *b = fp8_wild(lb.rows, lb.cols, 0, 0, 1);
    float *c0 = arand(nc, 1.0, 0.0);
    uint8_t *qa = xmalloc(ba), *qb = xmalloc(bb), *ga = xmalloc(ba), *gb = xmalloc(bb);
    R->fp8_quantize(qa, NULL, a, &la, 0, NULL);
    R->fp8_quantize(qb, NULL, b, &lb, 0, NULL);
    void *dxa = up_act(a, na), *dxb = up_act(b, nb), *dqa = dalloc(ba), *dqb = dalloc(bb);
    G->fp8_quantize(dqa, NULL, dxa, &la, 0, NULL);
    G->fp8_quantize(dqb, NULL, dxb, &lb, 0, NULL);
    G->to_host(ga, dqa, ba);
    G->to_host(gb, dqb, bb);
    const int lt = !ta && tb && m % 16 == 0 && n % 16 == 0 && k % 16 == 0 && !la.e8m0 &&
                   !lb.e8m0 && la.block_r >= la.rows && la.block_c >= la.cols &&
                   lb.block_r >= lb.rows && lb.block_c >= lb.cols;
    char what[80];
    snprintf(what, sizeof what, "%dx%dx%d %c%c %s%s", m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N',
             name, lt ? " lt" : "");
    COMPARE_BYTES("fp8_quantize cpu", what, qa, ga, ba);
    COMPARE_BYTES("fp8_quantize cpu", what, qb, gb, bb);
    /* act output, alpha 0.75, beta 0.5 */
    float *ec = fcopy(c0, nc);
    R->matmul_fp8(ec, PX_FP32, qa, &la, qb, &lb, m, n, k, ta, tb, 0.75f, 0.5f);
    void *dc = up_act(c0, nc);
    G->matmul_fp8(dc, G->act, dqa, &la, dqb, &lb, m, n, k, ta, tb, 0.75f, 0.5f);
    float *gc = down_act(dc, nc);
    COMPARE("matmul_fp8 cpu act", what, ec, gc, nc, lt ? T_FP8_LT_ACT : T_ACT(3));
    free(ec), free(gc), G->free(dc);
    /* fp32 output, beta 0 */
    ec = fnew(nc);
    R->matmul_fp8(ec, PX_FP32, qa, &la, qb, &lb, m, n, k, ta, tb, 1.0f, 0.0f);
    float *dcf = dalloc(nc * sizeof(float));
    G->matmul_fp8(dcf, PX_FP32, dqa, &la, dqb, &lb, m, n, k, ta, tb, 1.0f, 0.0f);
    gc = down_f32(dcf, nc);
    COMPARE("matmul_fp8 cpu f32", what, ec, gc, nc, lt ? T_FP8_LT_F32 : T_ACT(3));
    free(ec), free(gc), G->free(dcf);
    free(a), free(b), free(c0), free(qa), free(qb), free(ga), free(gb);
    G->free(dxa), G->free(dxb), G->free(dqa), G->free(dqb);
}

/* fp8_amax_update of G and of the CPU backend over five steps, history and scales bit for bit:
 * a column with a NaN (its scale kept while the NaN is in the window, then updated), one with
 * +inf and one with a -NaN and -inf, one whose max / fmax underflows (the smallest positive
 * float), an all-zero one (1), an ordinary one */
static void fp8_amax_update_vs_cpu(void)
{
    enum { LEN = 3, N = 6, STEPS = 5 };
    const float qnan = u2f(0x7fc00000u), qnan_neg = u2f(0xffc00000u), tmin = u2f(1u);
    const float fmax[N] = {448, 448, 57344, 448, 448, 57344};
    const float steps[STEPS][N] = {{2, 1, INFINITY, tmin, 0, -INFINITY},
                                   {5, qnan, 1, tmin, 0, -1},
                                   {1, 7, 1, 0, 0, 3},
                                   {3, 2, 1, tmin, 0, qnan_neg},
                                   {0.5f, 1, 1, 0, 0, 2}};
    float eh[LEN * N] = {0}, es[N], gs[N], gh[LEN * N];
    fill(es, N, 0.25f);
    float *dh = up_f32(eh, LEN * N), *ds = up_f32(es, N), *dfmax = up_f32(fmax, N);
    float *damax = dalloc(N * sizeof(float));
    for (int s = 0; s < STEPS; s++) {
        R->fp8_amax_update(eh, es, steps[s], fmax, LEN, N);
        G->to_device(damax, steps[s], sizeof steps[s]);
        G->fp8_amax_update(dh, ds, damax, dfmax, LEN, N);
        G->to_host(gs, ds, sizeof gs);
        G->to_host(gh, dh, sizeof gh);
        char what[32];
        snprintf(what, sizeof what, "step %d", s + 1);
        COMPARE_BYTES("fp8_amax_update cpu", what, es, gs, sizeof es);
        COMPARE_BYTES("fp8_amax_update cpu", what, eh, gh, sizeof eh);
    }
    /* the rules themselves, after the last step: column 1's NaN out of the window (7 / 448),
     * column 5's still in it (step 3's 3 / 57344 kept; -inf counts as nothing), column 2's
     * infinity gone (1 / 57344), the underflow, the all-zero column */
    CHECK(gs[1] == 7.0f / 448.0f && gs[5] == 3.0f / 57344.0f && gs[2] == 1.0f / 57344.0f &&
          gs[3] == tmin && gs[4] == 1.0f);
    G->free(dh), G->free(ds), G->free(dfmax), G->free(damax);
}

static void test_fp8_vs_cpu(void)
{
    static const int layouts[][5] = {
        /* rows, cols, block_r, block_c, e8m0 */
        {7, 70, 1 << 30, 1 << 30, 0}, /* per tensor */
        {7, 70, 1 << 30, 1 << 30, 1}, /* per tensor, E8M0: delayed scaling's power of two */
        {6, 300, 1, 128, 0},          /* 1 x 128, a partial block per row */
        {130, 200, 128, 128, 0},      /* 128 x 128, partial down and across */
        {6, 100, 1, 32, 1},           /* MXFP8 */
        {100, 6, 32, 1, 1},           /* MXFP8's column-wise copy */
    };
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++)
        for (int e5m2 = 0; e5m2 < 2; e5m2++)
            for (int trans = 0; trans < 2; trans++)
                for (int tiny = 0; tiny < 2; tiny++)
                    fp8_vs_cpu(layouts[l][0], layouts[l][1], layouts[l][2], layouts[l][3], e5m2,
                               layouts[l][4], trans, tiny);
    const KernFp8 tensor = {0, 0, 1 << 30, 1 << 30, 0, 0}, tensor5 = {0, 0, 1 << 30, 1 << 30, 1, 0};
    const KernFp8 row128 = {0, 0, 1, 128, 0, 0}, blk128 = {0, 0, 128, 128, 0, 0};
    const KernFp8 mx = {0, 0, 1, 32, 0, 1}, mx5 = {0, 0, 1, 32, 1, 1};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            fp8_matmul_vs_cpu(32, 48, 64, ta, tb, tensor, tensor, "tensor");
            fp8_matmul_vs_cpu(5, 7, 9, ta, tb, tensor, tensor, "tensor");
            fp8_matmul_vs_cpu(16, 32, 48, ta, tb, tensor, tensor5, "e4m3 x e5m2");
            fp8_matmul_vs_cpu(9, 20, 130, ta, tb, row128, blk128, "1x128 x 128x128");
            fp8_matmul_vs_cpu(6, 10, 96, ta, tb, mx, mx5, "e4m3 x e5m2 mx");
        }
    fp8_amax_update_vs_cpu();
}

/* A weight quantized from flat pieces on the device (fp8_piece_amax, fp8_block_scales,
 * fp8_piece_quantize), cut at 20, 1001 and 3333: the scales and bytes the device's
 * fp8_quantize writes for the whole, row-wise, column-wise in the weight's shape (32 x 1),
 * E5M2, one fp32 scale. */
static void test_fp8_pieces(void)
{
    enum { PR = 64, PC = 96, N = PR * PC };
    const uint64_t cut[] = {0, 20, 1001, 3333, N};
    float *x = arand(N, 2.0, 0.0);
    for (size_t i = 0; i < N; i += 7)
        x[i] = act_round(x[i] * (float)(1 << (i % 11)));
    void *dx = up_act(x, N);
    const KernFp8 fs[] = {{PR, PC, 1, 32, 0, 1}, {PR, PC, 32, 1, 0, 1}, {PR, PC, 32, 1, 1, 1},
                          {PR, PC, PR, PC, 0, 0}};
    for (size_t l = 0; l < sizeof fs / sizeof fs[0]; l++) {
        const KernFp8 *f = &fs[l];
        const size_t bytes = kern_fp8_bytes(f), ns = kern_fp8_scales(f);
        uint8_t *dw = dalloc(bytes), *dq = dalloc(bytes);
        float *damax = dalloc(ns * sizeof(float));
        G->memset0(damax, ns * sizeof(float));
        G->fp8_quantize(dw, NULL, dx, f, 0, NULL);
        for (int p = 0; p + 1 < 5; p++)
            G->fp8_piece_amax(damax, (const uint8_t *)dx + cut[p] * AB, cut[p],
                              cut[p + 1] - cut[p], f);
        G->fp8_block_scales(dq + N, damax, f);
        for (int p = 0; p + 1 < 5; p++)
            G->fp8_piece_quantize(dq + cut[p], (const uint8_t *)dx + cut[p] * AB, cut[p],
                                  cut[p + 1] - cut[p], f, dq + N);
        uint8_t *w = xmalloc(bytes), *q = xmalloc(bytes);
        G->to_host(w, dw, bytes);
        G->to_host(q, dq, bytes);
        char what[64];
        snprintf(what, sizeof what, "pieces %zu", l);
        COMPARE_BYTES("fp8_piece_quantize", what, w, q, bytes);
        free(w), free(q);
        G->free(dw), G->free(dq), G->free(damax);
    }
    G->free(dx);
    free(x);
}

/* matmul_fp8_split on the device: a column-wise MXFP8 copy in the weight's shape (64 x 96, 32
 * x 1), elements and scales apart, gives bit for bit the device's matmul_fp8 on the copy with
 * its scales after the elements. */
static void test_fp8_matmul_split(void)
{
    enum { SM = 8, SO = 64, SI = 96 };
    float *w = arand(SO * SI, 2.0, 0.0), *dy = arand(SM * SO, 1.0, 0.0);
    const KernFp8 fa = {SM, SO, 1, 32, 1, 1}, fc = {SO, SI, 32, 1, 0, 1};
    void *dw = up_act(w, SO * SI), *ddy = up_act(dy, SM * SO);
    uint8_t *qa = dalloc(kern_fp8_bytes(&fa)), *qc = dalloc(kern_fp8_bytes(&fc));
    uint8_t *elems = dalloc(SO * SI), *scales = dalloc(kern_fp8_scales(&fc));
    G->fp8_quantize(qa, NULL, ddy, &fa, 0, NULL);
    G->fp8_quantize(qc, NULL, dw, &fc, 0, NULL);
    G->copy(elems, qc, SO * SI);
    G->copy(scales, qc + SO * SI, kern_fp8_scales(&fc));
    float *c0 = dalloc(SM * SI * sizeof(float)), *c1 = dalloc(SM * SI * sizeof(float));
    G->matmul_fp8(c0, PX_FP32, qa, &fa, qc, &fc, SM, SI, SO, 0, 0, 1.0f, 0.0f);
    G->matmul_fp8_split(c1, PX_FP32, qa, &fa, NULL, elems, &fc, scales, SM, SI, SO, 0, 0, 1.0f,
                        0.0f);
    float *h0 = fnew(SM * SI), *h1 = fnew(SM * SI);
    G->to_host(h0, c0, SM * SI * sizeof(float));
    G->to_host(h1, c1, SM * SI * sizeof(float));
    COMPARE_BYTES("matmul_fp8_split", "32x1 copy, scales apart", h0, h1, SM * SI * sizeof(float));
    free(w), free(dy), free(h0), free(h1);
    G->free(dw), G->free(ddy), G->free(qa), G->free(qc), G->free(elems), G->free(scales);
    G->free(c0), G->free(c1);
}

static void test_fp8(void)
{
    test_fp8_hand();
    test_fp8_random(3, 70, 3, 70, 0, 0, 0);
    test_fp8_random(3, 70, 3, 70, 1, 0, 1);
    test_fp8_random(5, 300, 1, 128, 0, 0, 0);
    test_fp8_random(5, 300, 1, 128, 0, 0, 1);
    test_fp8_random(200, 150, 128, 128, 0, 0, 1);
    test_fp8_random(300, 260, 128, 128, 0, 0, 0); /* several thread blocks per scaling block */
    test_fp8_random(4, 100, 1, 32, 0, 1, 0);
    test_fp8_random(100, 4, 32, 1, 1, 1, 1);     /* MXFP8's column-wise copy */
    test_fp8_matmul();
    test_fp8_amax_update();
    test_fp8_vs_cpu();
    test_fp8_pieces();
    test_fp8_matmul_split();
}

static void run_suite(PxDtype act)
{
    G = kern_cuda_with(act);
    REQUIRE(G != NULL);
    REQUIRE(G->act == act);
    CHECK(kern_cuda_with(act) == G); /* one table */
    AB = px_dtype_bytes(act);
    /* fp32 activations round nothing to act: what is left is the summation orders' (cuBLAS's
     * and the kernels' against OpenBLAS and the CPU's loops) and libm's, a few fp32 ulps times
     * the sums' lengths (measured under the emulator: at most 8.3e-7 relative, the unfused
     * attention's dk; 6.9e-7 for a 1.5 u output); EPS 2^-19 (1.9e-6) leaves them 4x room */
    EPS = act == PX_BF16 ? 1.0 / 256.0 : act == PX_FP16 ? 1.0 / 2048.0 : 1.0 / 524288.0;
    printf("== %s backend, %s activations\n", G->name, act_name());
    test_table();
    test_memory();
    test_matmul();
    test_bias();
    if (act != PX_FP32) /* fp32 activations: fp32 gradients only */
        test_grads16();
    else
        CHECK(kern_cuda_with_grads(PX_FP32, PX_BF16) == NULL &&
              kern_cuda_with_grads(PX_FP32, PX_FP32) == G && G->grad == PX_FP32);
    test_norm(0, 1, 35, 67);
    test_norm(0, 0, 4, 7);
    test_norm(1, 0, 35, 67);
    test_norm(0, 1, 3, 30000); /* columns beyond shared memory: global atomics */
    if (large) {
        test_norm(0, 1, 4096, 1027);
        test_norm(1, 0, 4096, 4096);
    }
    test_gelu();
    test_swiglu();
    test_copy_cols();
    test_rope_case(2, 5, 4, 2, 8, 3);
    test_rope_case(1, 3, 2, 1, 16, 100000); /* a long context: the angle needs double */
    /* GQA (4 heads on 2 KV groups), a packed qkv buffer, plain causal */
    test_attention((AttnCase){.B = 2, .Tq = 4, .Tk = 4, .H = 4, .KV = 2, .D = 4, .packed = 1});
    test_attention_merge(37, 3, 40, 2.0);
    test_attention_second_copies();
    test_attention_merge(5, 2, 7, 60.0); /* the widest gaps: one weight underflows to 0 */
    /* context parallel, a middle rank: queries at 1..3 of 6 keys */
    test_attention((AttnCase){.B = 2, .Tq = 3, .Tk = 6, .H = 4, .KV = 2, .D = 4, .q_offset = 1});
    /* with dropout on the probabilities: the mask byte for byte */
    test_attention((AttnCase){.B = 2, .Tq = 3, .Tk = 6, .H = 4, .KV = 2, .D = 4, .q_offset = 3,
                              .dropout = 0.25f});
    test_attention((AttnCase){.B = 1, .Tq = 4, .Tk = 4, .H = 4, .KV = 2, .D = 4, .packed = 1,
                              .dropout = 0.5f});
    /* a context-parallel part drawing its block of a larger matrix's stream (rows 16, heads
     * 16 x 16 apart) */
    test_attention((AttnCase){.B = 2, .Tq = 3, .Tk = 6, .H = 4, .KV = 2, .D = 4, .q_offset = 3,
                              .dropout = 0.25f, .drop_row = 16, .drop_head = 256});
    /* several key tiles, queries after most keys; odd head dims; D beyond one warp */
    test_attention((AttnCase){.B = 1, .Tq = 70, .Tk = 150, .H = 2, .KV = 2, .D = 8,
                              .q_offset = 80});
    test_attention((AttnCase){.B = 1, .Tq = 45, .Tk = 45, .H = 2, .KV = 1, .D = 3, .packed = 1});
    /* value heads narrower and wider than the query and key heads (multi-head latent
     * attention's v_dim beside qk_nope + qk_rope) */
    test_attention((AttnCase){.B = 2, .Tq = 5, .Tk = 5, .H = 4, .KV = 4, .D = 12, .Dv = 8,
                              .packed = 1});
    test_attention((AttnCase){.B = 1, .Tq = 40, .Tk = 70, .H = 2, .KV = 2, .D = 4, .Dv = 6,
                              .q_offset = 30});
    test_attention((AttnCase){.B = 2, .Tq = 37, .Tk = 37, .H = 3, .KV = 1, .D = 40, .packed = 1});
    /* D = 256: the fused kernels need more than 48 KiB of shared memory */
    test_attention((AttnCase){.B = 1, .Tq = 9, .Tk = 9, .H = 2, .KV = 1, .D = 256, .packed = 1});
    /* attention sinks (GPT-OSS): in the softmax and the flash kernels, and their gradient */
    test_attention((AttnCase){.B = 2, .Tq = 4, .Tk = 4, .H = 4, .KV = 2, .D = 4, .packed = 1,
                              .sinks = 1});
    test_attention((AttnCase){.B = 1, .Tq = 70, .Tk = 150, .H = 2, .KV = 2, .D = 8,
                              .q_offset = 80, .sinks = 1});
    test_gate(37, 40, 24);
    if (large) {
        test_attention((AttnCase){.B = 2, .Tq = 256, .Tk = 256, .H = 8, .KV = 2, .D = 64,
                                  .packed = 1});
        test_attention((AttnCase){.B = 1, .Tq = 128, .Tk = 512, .H = 4, .KV = 4, .D = 128,
                                  .q_offset = 384});
        test_attention((AttnCase){.B = 2, .Tq = 128, .Tk = 128, .H = 4, .KV = 4, .D = 64,
                                  .packed = 1, .dropout = 0.1f});
    }
    test_embedding(1);
    test_embedding(0);
    test_xent_case(7, 1000, 500);
    test_xent_case(3, 0, 0); /* an empty shard: rowmax -inf, rowsum 0, target 0 */
    if (large)
        test_xent_case(32, 50304, 0);
    test_optim(1000, 1);
    test_optim(1000, 0);
    test_adam8(G, 0);
    test_adam8(G, 2100);
    if (act != PX_FP32)
        test_adam8(kern_cuda_with_grads(G->act, G->act), 0);
    test_elementwise(10007);
    test_dropout(10007);
    if (large) {
        test_optim((size_t)1 << 20, 1);
        test_elementwise((size_t)1 << 22);
        test_dropout((size_t)1 << 22);
    }    test_moe();
    test_fp8();
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* the report and a failure on stderr stay in order */
    R = kern_cpu();
    const KernBackend *cuda = kern_cuda();
    if (!cuda) {
        printf("test_kernels_cuda: no CUDA device visible (or parallax was built without CUDA): "
               "skipped\n");
        return 77;
    }
    CHECK_EQ_INT(PX_BF16, cuda->act);
    CHECK(kern_cuda_with(PX_FP8) == NULL);
    /* PARALLAX_TEST_LARGE=0 or 1 overrides: the emulator takes minutes for the large shapes,
     * and so does compute-sanitizer */
    const char *env = getenv("PARALLAX_TEST_LARGE");
    large = env && *env ? strcmp(env, "0") != 0 : strcmp(cuda->name, "cuda") == 0;
    run_suite(PX_BF16);
    run_suite(PX_FP16);
    run_suite(PX_FP32);
    if (failures) {
        fprintf(stderr, "kernels_cuda: %ld failures in %d checks:\n", failures, px_test_checks);
        for (int i = 0; i < n_fail_sites; i++)
            if (fail_site[i].count > 1)
                fprintf(stderr, "  %s:%d failed %ld times\n", fail_site[i].file, fail_site[i].line,
                        fail_site[i].count);
        fprintf(stderr, "kernels_cuda: FAILED (every failed comparison is above, with its line)\n");
        return 1;
    }
    TEST_DONE("kernels_cuda");
}
