/* bench_kernels_cuda — figures for the CUDA backend, through kernels.h as the executor calls
 * it: GEMM TFLOP/s (bf16 inputs, fp32 accumulation; FP8 inputs per tensor, in DeepSeek-V3's
 * blocks and as MXFP8) for transformer shapes, the memory
 * bandwidth of copy / cast / add / layernorm, and the fused and unfused attention. Not a test:
 * timings on a shared machine are noisy, and nothing here passes or fails on a number.
 *
 * Timing: first --warmup seconds of square GEMMs, so that the clocks have left their idle
 * frequency (a GPU idles at a few hundred MHz and boosts under load, over a fraction of a
 * second) before the first figure; then, per figure, a few untimed calls and calls until at
 * least --min-time seconds have passed,
 * bracketed by sync() and a monotonic host clock (each timed block holds many calls, so the
 * launch latency of the last one does not count). Bandwidth counts the bytes a kernel must read
 * and write (GB = 1e9); GEMM FLOPs are 2mnk; causal attention counts half of the square.
 *
 * Usage: bench_kernels_cuda [--quick] [--min-time S] [--warmup S] (--help lists them); exits
 * 77 when no GPU * is visible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static const KernBackend *K;
static double min_time = 0.3;
static double warmup_s = 2.0;

static void *dalloc(size_t bytes)
{
    void *p = K->alloc(bytes);
    if (!p) {
        fprintf(stderr, "bench_kernels_cuda: cannot allocate %.2f GiB on the device\n",
                (double)bytes / (1024.0 * 1024.0 * 1024.0));
        exit(1);
    }
    return p;
}

/* Fills n act elements with values uniform in [-1, 1): matrices of zeros run faster (less
 * switching power) and would flatter the GEMM figures. */
static void fill_random_act(void *d, size_t n)
{
    enum { CHUNK = 1 << 20 };
    static float *dev, *host;
    if (!dev) {
        host = malloc(CHUNK * sizeof *host);
        if (!host)
            exit(1);
        uint64_t s = 0x5eed;
        for (size_t i = 0; i < CHUNK; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            host[i] = (float)((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
        }
        dev = dalloc(CHUNK * sizeof *dev);
        K->to_device(dev, host, CHUNK * sizeof *dev);
    }
    const size_t es = px_dtype_bytes(K->act);
    for (size_t i = 0; i < n; i += CHUNK)
        K->cast_to_act((char *)d + i * es, dev, n - i < CHUNK ? n - i : CHUNK);
}

typedef void (*BenchFn)(void *ctx);

/* seconds per call */
static double time_it(BenchFn fn, void *ctx)
{
    for (int i = 0; i < 3; i++)
        fn(ctx);
    K->sync();
    long calls = 0;
    double t0 = px_now_s(), t = 0.0;
    do {
        for (int i = 0; i < 10; i++)
            fn(ctx);
        calls += 10;
        K->sync();
        t = px_now_s() - t0;
    } while (t < min_time);
    return t / (double)calls;
}

/* ---- GEMM ---- */

typedef struct {
    int m, n, k, ta, tb;
    PxDtype c_dtype;
    float beta;
    void *a, *b, *c;
    const char *what;
} Gemm;

static void gemm_run(void *ctx)
{
    Gemm *g = ctx;
    K->matmul(g->c, g->c_dtype, g->a, g->b, g->m, g->n, g->k, g->ta, g->tb, 1.0f, g->beta);
}

static void bench_gemm(int m, int n, int k, int ta, int tb, PxDtype c_dtype, float beta,
                       const char *what)
{
    const size_t es = px_dtype_bytes(K->act);
    Gemm g = {m, n, k, ta, tb, c_dtype, beta, NULL, NULL, NULL, what};
    g.a = dalloc((size_t)m * k * es);
    g.b = dalloc((size_t)k * n * es);
    g.c = dalloc((size_t)m * n * px_dtype_bytes(c_dtype));
    fill_random_act(g.a, (size_t)m * k);
    fill_random_act(g.b, (size_t)k * n);
    double s = time_it(gemm_run, &g);
    printf("gemm  %-28s %6d %6d %6d  %c%c  C %-4s  %9.3f ms  %7.1f TFLOP/s\n", what, m, n, k,
           ta ? 'T' : 'N', tb ? 'T' : 'N', px_dtype_name(c_dtype), s * 1e3,
           2.0 * m * n * (double)k / s / 1e12);
    K->free(g.a), K->free(g.b), K->free(g.c);
}

/* ---- FP8 GEMM ---- */

typedef struct {
    int m, n, k;
    KernFp8 fa, fb;
    void *qa, *qb, *c;
} GemmFp8;

static void gemm_fp8_run(void *ctx)
{
    GemmFp8 *g = ctx;
    K->matmul_fp8(g->c, K->act, g->qa, &g->fa, g->qb, &g->fb, g->m, g->n, g->k, 0, 1, 1.0f,
                  0.0f);
}

/* C[m, n] (act) = A[m, k] B[n, k]^T on FP8 operands quantized from random act values, with
 * scaling blocks ba_r x ba_c (A) and bb_r x bb_c (B); 0 means the whole dimension (one scale:
 * per-tensor, cuBLASLt's FP8 path on Hopper); e8m0 for MXFP8's scales. */
static void bench_gemm_fp8(int m, int n, int k, int ba_r, int ba_c, int bb_r, int bb_c,
                           int e8m0, const char *what)
{
    GemmFp8 g = {m, n, k, {m, k, ba_r ? ba_r : m, ba_c ? ba_c : k, 0, e8m0},
                 {n, k, bb_r ? bb_r : n, bb_c ? bb_c : k, 0, e8m0}, NULL, NULL, NULL};
    const size_t es = px_dtype_bytes(K->act), big = (size_t)(m > n ? m : n) * k;
    void *x = dalloc(big * es);
    g.qa = dalloc(kern_fp8_bytes(&g.fa));
    g.qb = dalloc(kern_fp8_bytes(&g.fb));
    g.c = dalloc((size_t)m * n * es);
    fill_random_act(x, big);
    K->fp8_quantize(g.qa, NULL, x, &g.fa, 0, NULL);
    K->fp8_quantize(g.qb, NULL, x, &g.fb, 0, NULL);
    K->free(x);
    double s = time_it(gemm_fp8_run, &g);
    printf("fp8   %-28s %6d %6d %6d  NT  C %-4s  %9.3f ms  %7.1f TFLOP/s\n", what, m, n, k,
           px_dtype_name(K->act), s * 1e3, 2.0 * m * n * (double)k / s / 1e12);
    K->free(g.qa), K->free(g.qb), K->free(g.c);
}

/* Square GEMMs for warmup_s seconds: the clocks up before the first figure. */
static void warm_up(void)
{
    if (!(warmup_s > 0))
        return;
    const int n = 4096;
    const size_t es = px_dtype_bytes(K->act);
    Gemm g = {n, n, n, 0, 1, K->act, 0.0f, NULL, NULL, NULL, "warm-up"};
    g.a = dalloc((size_t)n * n * es);
    g.b = dalloc((size_t)n * n * es);
    g.c = dalloc((size_t)n * n * es);
    fill_random_act(g.a, (size_t)n * n);
    fill_random_act(g.b, (size_t)n * n);
    long calls = 0;
    const double t0 = px_now_s();
    while (px_now_s() - t0 < warmup_s) {
        for (int i = 0; i < 10; i++)
            gemm_run(&g);
        K->sync();
        calls += 10;
    }
    printf("warm-up   %ld GEMMs of %d^3 in %.1f s before the first figure\n", calls, n,
           px_now_s() - t0);
    K->free(g.a), K->free(g.b), K->free(g.c);
}

/* ---- memory-bound kernels ---- */

typedef struct {
    int op;
    size_t n;
    void *x, *y, *z;
} Stream;

enum { S_COPY, S_CAST_ACT, S_CAST_F32, S_ADD, S_LAYERNORM, S_ADAMW };

static void stream_run(void *ctx)
{
    Stream *s = ctx;
    switch (s->op) {
    case S_COPY: K->copy(s->y, s->x, s->n * px_dtype_bytes(K->act)); break;
    case S_CAST_ACT: K->cast_to_act(s->y, s->x, s->n); break;
    case S_CAST_F32: K->cast_to_f32(s->x, s->y, s->n); break;
    case S_ADD: K->add(s->z, s->y, s->y, s->n); break;
    case S_LAYERNORM:
        K->layernorm_fwd(s->z, s->y, s->x, NULL, (int)(s->n / 4096), 4096, 1e-5f);
        break;
    case S_ADAMW:
        K->adamw(s->y, s->x, s->z, (float *)s->z + s->n, (float *)s->z + 2 * s->n, s->n, 1e-4f,
                 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f);
        break;
    }
}

static void bench_stream(size_t n)
{
    const size_t es = px_dtype_bytes(K->act);
    Stream s = {0, n, NULL, NULL, NULL};
    s.x = dalloc(n * 4);      /* fp32 */
    s.y = dalloc(n * es);     /* act */
    s.z = dalloc(n * 4 * 3);  /* act outputs, or fp32 grad, m, v */
    fill_random_act(s.y, n);
    static const struct {
        int op;
        const char *name;
        double bytes_per_elem_fp32, bytes_per_elem_act;
    } ops[] = {
        {S_COPY, "copy act (device memcpy)", 0, 2},
        {S_CAST_ACT, "cast fp32 -> act", 4, 1},
        {S_CAST_F32, "cast act -> fp32", 4, 1},
        {S_ADD, "add act + act -> act", 0, 3},
        {S_LAYERNORM, "layernorm fwd (C=4096)", 0, 2},
        {S_ADAMW, "adamw (fp32 master, m, v)", 7 * 4, 1}, /* reads 4 fp32, writes 3 */
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        s.op = ops[i].op;
        double t = time_it(stream_run, &s);
        double bytes = (double)n * (ops[i].bytes_per_elem_fp32 + ops[i].bytes_per_elem_act * es);
        printf("mem   %-34s %11zu elems  %9.3f ms  %7.1f GB/s\n", ops[i].name, n, t * 1e3,
               bytes / t / 1e9);
    }
    K->free(s.x), K->free(s.y), K->free(s.z);
}

/* ---- attention ---- */

typedef struct {
    KernAttnFwd f;
    KernAttnBwd b;
    int bwd;
} Attn;

static void attn_run(void *ctx)
{
    Attn *a = ctx;
    if (a->bwd)
        K->attention_bwd(&a->b);
    else
        K->attention_fwd(&a->f);
}

static void bench_attention(int B, int T, int H, int KV, int D, int fused)
{
    const size_t es = px_dtype_bytes(K->act), row = (size_t)(H + 2 * KV) * D;
    const size_t nqkv = (size_t)B * T * row, no = (size_t)B * T * H * D;
    const size_t np = (size_t)B * H * T * T, nl = (size_t)B * H * T;
    void *qkv = dalloc(nqkv * es), *dqkv = dalloc(nqkv * es), *out = dalloc(no * es);
    void *dout = dalloc(no * es), *probs = fused ? NULL : dalloc(np * es);
    void *dscores = fused ? NULL : dalloc(np * es);
    float *lse = dalloc(nl * 4), *drow = dalloc(nl * 4);
    fill_random_act(qkv, nqkv);
    fill_random_act(dout, no);
    char *q = qkv, *dq = dqkv;
    Attn a;
    memset(&a, 0, sizeof a);
    a.f = (KernAttnFwd){.B = B, .Tq = T, .Tk = T, .H = H, .KV = KV, .D = D,
                        .scale = 1.0f / sqrtf((float)D), .q = q, .k = q + (size_t)H * D * es,
                        .v = q + (size_t)(H + KV) * D * es, .q_stride = (int)row,
                        .k_stride = (int)row, .v_stride = (int)row, .out = out, .probs = probs,
                        .lse = fused ? lse : NULL};
    a.b = (KernAttnBwd){.B = B, .Tq = T, .Tk = T, .H = H, .KV = KV, .D = D, .scale = a.f.scale,
                        .q = a.f.q, .k = a.f.k, .v = a.f.v, .q_stride = (int)row,
                        .k_stride = (int)row, .v_stride = (int)row, .out = out, .dout = dout,
                        .dq = dq, .dk = dq + (size_t)H * D * es,
                        .dv = dq + (size_t)(H + KV) * D * es,
                        .dq_stride = (int)row, .dk_stride = (int)row, .dv_stride = (int)row,
                        .probs = probs, .dscores = dscores, .lse = fused ? lse : NULL,
                        .drow = fused ? drow : NULL};
    K->attention_fwd(&a.f); /* the backward reads its outputs */
    const double causal = 2.0 * 2.0 * B * H * (double)T * T * D / 2.0; /* QK^T and PV, half */
    for (a.bwd = 0; a.bwd < 2; a.bwd++) {
        double t = time_it(attn_run, &a);
        double flops = a.bwd ? 2.5 * causal : causal; /* dV, dP, dQ, dK (+ the recompute) */
        printf("attn  %-7s %-3s B%d T%d H%d KV%d D%d %*s %9.3f ms  %7.1f TFLOP/s (causal)\n",
               fused ? "fused" : "unfused", a.bwd ? "bwd" : "fwd", B, T, H, KV, D, 8, "",
               t * 1e3, flops / t / 1e12);
    }
    K->free(qkv), K->free(dqkv), K->free(out), K->free(dout), K->free(probs), K->free(dscores);
    K->free(lse), K->free(drow);
}

enum { OPT_QUICK, OPT_MIN_TIME, OPT_WARMUP };

static const PxOption bench_options[] = {
    {"quick", 0, NULL, "fewer and smaller shapes", OPT_QUICK, 0},
    {"min-time", 1, "S", "time each figure for at least S seconds (default 0.3)", OPT_MIN_TIME, 0},
    {"warmup", 1, "S", "run GEMMs for S seconds before the first figure (default 2; 0: none)",
     OPT_WARMUP, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static int bench_option(void *ctx, int id, const char *arg, PxError *err)
{
    if (id == OPT_QUICK)
        *(int *)ctx = 1;
    if (id == OPT_WARMUP) {
        if (px_parse_double(arg, "--warmup", &warmup_s, err))
            return PX_EINPUT;
        if (!(warmup_s >= 0 && warmup_s <= 600))
            return px_fail(err, PX_EINPUT, "--warmup: expected seconds from 0 to 600, got '%s'", arg);
        return PX_OK;
    }
    return id == OPT_MIN_TIME ? px_parse_double(arg, "--min-time", &min_time, err) : PX_OK;
}

/* --quick and --min-time: -1 to go on, or the exit status (0 after --help, 2 after bad input). */
static int parse_args(int argc, char **argv, int *quick)
{
    static const char *const usage =
        "bench_kernels_cuda [--quick] [--min-time S] [--warmup S]\n\n"
        "GEMM TFLOP/s for transformer shapes, the bandwidth of copy, cast, add and layernorm, and\n"
        "the fused and unfused attention, through the CUDA backend. Exits 77 when no GPU is\n"
        "visible.";
    const PxOption *const tables[] = {bench_options, NULL};
    PxError err = {0};
    int first;
    int rc = px_opts_parse(tables, argc, argv, "(see --help)", bench_option, quick, 0, &first, &err);
    if (rc == PX_OPTS_HELP) {
        px_opts_help(stdout, usage, tables);
        return 0;
    }
    if (rc)
        fprintf(stderr, "bench_kernels_cuda: %s\n", err.msg);
    return rc ? rc : -1;
}

int main(int argc, char **argv)
{
    int quick = 0;
    int status = parse_args(argc, argv, &quick);
    if (status >= 0)
        return status;
    K = kern_cuda();
    if (!K) {
        printf("bench_kernels_cuda: no CUDA device visible: nothing to measure\n");
        return 77;
    }
    printf("backend %s, act %s\n", K->name, px_dtype_name(K->act));
    warm_up();
    /* GPT-2 124M-like shapes at 8192 tokens (B*T), a Llama-8B-like layer, and a square */
    bench_gemm(4096, 4096, 4096, 0, 1, K->act, 0.0f, "square");
    if (!quick)
        bench_gemm(8192, 8192, 8192, 0, 1, K->act, 0.0f, "square");
    bench_gemm(8192, 2304, 768, 0, 1, K->act, 0.0f, "gpt2 qkv fwd");
    bench_gemm(8192, 768, 3072, 0, 1, K->act, 0.0f, "gpt2 fc2 fwd");
    bench_gemm(8192, 3072, 768, 0, 0, K->act, 0.0f, "gpt2 fc2 dx");
    bench_gemm(768, 3072, 8192, 1, 0, PX_FP32, 1.0f, "gpt2 fc2 dw (fp32 +=)");
    if (!quick) {
        bench_gemm(8192, 50304, 768, 0, 1, K->act, 0.0f, "gpt2 logits fwd");
        bench_gemm(8192, 6144, 4096, 0, 1, K->act, 0.0f, "llama8b qkv fwd");
        bench_gemm(8192, 28672, 4096, 0, 1, K->act, 0.0f, "llama8b fc1 fwd");
        bench_gemm(4096, 14336, 8192, 1, 0, PX_FP32, 1.0f, "llama8b fc2 dw (fp32 +=)");
    }
    /* FP8 (E4M3 operands): per tensor (cuBLASLt), DeepSeek-V3's 1x128 x 128x128 blocks, MXFP8 */
    bench_gemm_fp8(4096, 4096, 4096, 0, 0, 0, 0, 0, "square tensor");
    if (!quick) {
        bench_gemm_fp8(8192, 8192, 8192, 0, 0, 0, 0, 0, "square tensor");
        bench_gemm_fp8(8192, 6144, 4096, 0, 0, 0, 0, 0, "llama8b qkv tensor");
        bench_gemm_fp8(8192, 28672, 4096, 0, 0, 0, 0, 0, "llama8b fc1 tensor");
        bench_gemm_fp8(8192, 6144, 4096, 1, 128, 128, 128, 0, "llama8b qkv 1x128/128x128");
        bench_gemm_fp8(8192, 6144, 4096, 1, 32, 1, 32, 1, "llama8b qkv mxfp8");
    }
    bench_stream(quick ? (size_t)1 << 26 : (size_t)1 << 28);
    bench_attention(8, 1024, 12, 12, 64, 1);
    bench_attention(8, 1024, 12, 12, 64, 0);
    if (!quick) {
        bench_attention(2, 4096, 32, 8, 128, 1);
        bench_attention(1, 4096, 32, 8, 128, 0);
    }
    return 0;
}
