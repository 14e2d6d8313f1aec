/* The CPU backend's 16-bit tables (kern_cpu_with, kern_cpu_with_grads) against its fp32 one,
 * entry by entry on small shapes. Every input is a value the 16-bit type holds, given to the
 * fp32 table as fp32 and to the 16-bit one in 16 bits; each 16-bit output must be the fp32
 * output rounded to nearest even, bit for bit (one rounding on the store, docs/gpu.md,
 * "Precision"). Shapes have odd sizes, strided views into packed rows and in-place calls. */
#include "kernels/kernels.h"
#include "tests/test.h"

typedef struct {
    PxDtype dt; /* the 16-bit table's side's dtype (bf16, fp16, or fp32 for fp32 gradients) */
    size_t n;
    float *f; /* the fp32 table's copy */
    void *h;  /* the 16-bit table's copy, in dt */
} Buf;

static uint64_t rng_state = 0x1234567887654321ull;

static float rand_unit(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float widen(PxDtype dt, uint16_t h)
{
    return dt == PX_BF16 ? px_bf16_to_float(h) : px_half_to_float(h);
}

/* n values in [-scale, scale), each one dt holds, in both copies */
static Buf buf_new(PxDtype dt, size_t n, float scale)
{
    Buf b = {dt, n, calloc(n ? n : 1, sizeof(float)), calloc(n ? n : 1, px_dtype_bytes(dt))};
    CHECK(b.f && b.h);
    for (size_t i = 0; i < n; i++) {
        const float x = rand_unit() * scale;
        kern_host_round((char *)b.h + i * px_dtype_bytes(dt), dt, &x, 1);
        b.f[i] = dt == PX_FP32 ? x : widen(dt, ((uint16_t *)b.h)[i]);
    }
    return b;
}

/* The 16-bit copy's element i, and a pointer to it */
static uint16_t h16(const Buf *b, size_t i) { return ((const uint16_t *)b->h)[i]; }
static void *at(const Buf *b, size_t i) { return (char *)b->h + i * px_dtype_bytes(b->dt); }

static void buf_free(Buf *b)
{
    free(b->f);
    free(b->h);
}

/* The 16-bit copy equals the fp32 copy rounded, bit for bit (fp32 copies: equal); the fp32
 * copy then holds the rounded values. */
static void buf_check(const char *what, Buf *b)
{
    for (size_t i = 0; i < b->n; i++) {
        uint16_t want = 0;
        px_test_checks++;
        if (b->dt == PX_FP32) {
            const float got = ((const float *)b->h)[i];
            if (got != b->f[i]) {
                fprintf(stderr, "FAILED: %s (fp32) element %zu: expected %.9g, actual %.9g\n",
                        what, i, (double)b->f[i], (double)got);
                exit(1);
            }
            continue;
        }
        kern_host_round(&want, b->dt, &b->f[i], 1);
        if (want != h16(b, i)) {
            fprintf(stderr,
                    "FAILED: %s (%s) element %zu: expected %.9g (0x%04x, the fp32 table's %.9g "
                    "rounded), actual %.9g (0x%04x)\n",
                    what, px_dtype_name(b->dt), i, (double)widen(b->dt, want), want,
                    (double)b->f[i], (double)widen(b->dt, h16(b, i)), h16(b, i));
            exit(1);
        }
        b->f[i] = widen(b->dt, want); /* the next call starts from the same values on both sides */
    }
}

static void check_matmul(const KernBackend *f, const KernBackend *k)
{
    const int m = 5, n = 7, kk = 9;
    for (int beta = 0; beta <= 1; beta++) {
        Buf a = buf_new(k->act, (size_t)m * kk, 1.0f), b = buf_new(k->act, (size_t)kk * n, 1.0f);
        Buf c = buf_new(k->act, (size_t)m * n, 1.0f), c32 = buf_new(PX_FP32, (size_t)m * n, 1.0f);
        f->matmul(c.f, PX_FP32, a.f, b.f, m, n, kk, 1, 0, 0.5f, (float)beta);
        k->matmul(c.h, k->act, a.h, b.h, m, n, kk, 1, 0, 0.5f, (float)beta);
        buf_check(beta ? "matmul (act C, beta 1)" : "matmul (act C)", &c);
        /* an fp32 C (a weight gradient) is the fp32 table's exactly */
        float *want = malloc(sizeof(float) * (size_t)m * n);
        CHECK(want);
        memcpy(want, c32.f, sizeof(float) * (size_t)m * n);
        f->matmul(want, PX_FP32, a.f, b.f, m, n, kk, 0, 1, 1.0f, (float)beta);
        k->matmul(c32.f, PX_FP32, a.h, b.h, m, n, kk, 0, 1, 1.0f, (float)beta);
        for (int i = 0; i < m * n; i++)
            CHECK(want[i] == c32.f[i]);
        free(want);
        buf_free(&a);
        buf_free(&b);
        buf_free(&c);
        buf_free(&c32);
    }
}

static void check_norms(const KernBackend *f, const KernBackend *k)
{
    const int N = 3, C = 11;
    const size_t n = (size_t)N * C;
    Buf x = buf_new(k->act, n, 2.0f), w = buf_new(k->act, C, 1.0f), b = buf_new(k->act, C, 1.0f);
    Buf y = buf_new(k->act, n, 1.0f), dy = buf_new(k->act, n, 1.0f), dx = buf_new(k->act, n, 1.0f);
    Buf dw = buf_new(k->grad, C, 1.0f), db = buf_new(k->grad, C, 1.0f);
    f->layernorm_fwd(y.f, x.f, w.f, b.f, N, C, 1e-5f);
    k->layernorm_fwd(y.h, x.h, w.h, b.h, N, C, 1e-5f);
    buf_check("layernorm_fwd", &y);
    f->layernorm_bwd(dx.f, dw.f, db.f, dy.f, x.f, w.f, N, C, 1e-5f);
    k->layernorm_bwd(dx.h, dw.h, db.h, dy.h, x.h, w.h, N, C, 1e-5f);
    buf_check("layernorm_bwd dinp", &dx);
    buf_check("layernorm_bwd dw", &dw);
    buf_check("layernorm_bwd db", &db);
    f->rmsnorm_fwd(y.f, x.f, w.f, N, C, 1e-5f);
    k->rmsnorm_fwd(y.h, x.h, w.h, N, C, 1e-5f);
    buf_check("rmsnorm_fwd", &y);
    f->rmsnorm_bwd(dx.f, dw.f, dy.f, x.f, w.f, N, C, 1e-5f);
    k->rmsnorm_bwd(dx.h, dw.h, dy.h, x.h, w.h, N, C, 1e-5f);
    buf_check("rmsnorm_bwd dinp", &dx);
    buf_check("rmsnorm_bwd dw", &dw);
    f->bias_grad(db.f, dy.f, N, C);
    k->bias_grad(db.h, dy.h, N, C);
    buf_check("bias_grad", &db);
    f->add_bias(y.f, b.f, N, C);
    k->add_bias(y.h, b.h, N, C);
    buf_check("add_bias", &y);
    Buf *all[] = {&x, &w, &b, &y, &dy, &dx, &dw, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        buf_free(all[i]);
}

/* Elementwise entries, the backwards in place (gelu_bwd's dinp on dout, swiglu_bwd's on inp). */
static void check_elementwise(const KernBackend *f, const KernBackend *k)
{
    const int N = 3, F = 5;
    const size_t n = (size_t)N * 2 * F;
    Buf x = buf_new(k->act, n, 3.0f), y = buf_new(k->act, n, 1.0f), d = buf_new(k->act, n, 1.0f);
    f->gelu_fwd(y.f, x.f, n);
    k->gelu_fwd(y.h, x.h, n);
    buf_check("gelu_fwd", &y);
    f->gelu_bwd(d.f, x.f, d.f, n);
    k->gelu_bwd(d.h, x.h, d.h, n);
    buf_check("gelu_bwd (dinp = dout)", &d);
    f->swiglu_fwd(y.f, x.f, N, F);
    k->swiglu_fwd(y.h, x.h, N, F);
    buf_check("swiglu_fwd", &y);
    f->swiglu_bwd(x.f, x.f, d.f, N, F);
    k->swiglu_bwd(x.h, x.h, d.h, N, F);
    buf_check("swiglu_bwd (dinp = inp)", &x);
    f->add(y.f, y.f, d.f, n);
    k->add(y.h, y.h, d.h, n);
    buf_check("add (out = a)", &y);
    f->add_inplace(d.f, x.f, n);
    k->add_inplace(d.h, x.h, n);
    buf_check("add_inplace", &d);
    uint8_t *mask = calloc(n, 1), *mask16 = calloc(n, 1);
    CHECK(mask && mask16);
    f->dropout_fwd(y.f, mask, x.f, n, 0.3f, 77);
    k->dropout_fwd(y.h, mask16, x.h, n, 0.3f, 77);
    buf_check("dropout_fwd", &y);
    CHECK(memcmp(mask, mask16, n) == 0);
    f->dropout_bwd(d.f, d.f, mask, n, 0.3f);
    k->dropout_bwd(d.h, d.h, mask16, n, 0.3f);
    buf_check("dropout_bwd (in place)", &d);
    /* columns 2..6 of 10-wide rows into columns 1..5 of 7-wide rows, then added */
    Buf dst = buf_new(k->act, (size_t)N * 7, 1.0f);
    for (int add = 0; add <= 1; add++) {
        f->copy_cols(dst.f + 1, 7, x.f + 2, 10, N, 5, add);
        k->copy_cols(at(&dst, 1), 7, at(&x, 2), 10, N, 5, add);
        buf_check(add ? "copy_cols (add)" : "copy_cols", &dst);
    }
    free(mask);
    free(mask16);
    buf_free(&x);
    buf_free(&y);
    buf_free(&d);
    buf_free(&dst);
}

/* rope in place on packed rows, and the embedding lookup and its backward with positions. */
static void check_rope_embedding(const KernBackend *f, const KernBackend *k)
{
    const int B = 2, T = 3, H = 2, KV = 1, D = 4, C = 6, V = 5;
    const size_t n = (size_t)B * T * (H + 2 * KV) * D;
    Buf q = buf_new(k->act, n, 2.0f);
    f->rope_fwd(q.f, B, T, H, KV, D, 3, 10000.0f);
    k->rope_fwd(q.h, B, T, H, KV, D, 3, 10000.0f);
    buf_check("rope_fwd", &q);
    f->rope_bwd(q.f, B, T, H, KV, D, 3, 10000.0f);
    k->rope_bwd(q.h, B, T, H, KV, D, 3, 10000.0f);
    buf_check("rope_bwd", &q);
    const int32_t tok[6] = {0, 3, 9, 4, 1, 4}; /* 9: outside the shard v_start 0, V 5 */
    Buf wte = buf_new(k->act, (size_t)V * C, 1.0f), wpe = buf_new(k->act, (size_t)(T + 2) * C, 1.0f);
    Buf out = buf_new(k->act, (size_t)B * T * C, 1.0f);
    Buf dte = buf_new(k->grad, (size_t)V * C, 1.0f), dpe = buf_new(k->grad, (size_t)(T + 2) * C, 1.0f);
    f->embedding_fwd(out.f, tok, wte.f, wpe.f, B * T, T, 2, C, 0, V);
    k->embedding_fwd(out.h, tok, wte.h, wpe.h, B * T, T, 2, C, 0, V);
    buf_check("embedding_fwd", &out);
    f->embedding_bwd(dte.f, dpe.f, out.f, tok, B * T, T, 2, C, 0, V);
    k->embedding_bwd(dte.h, dpe.h, out.h, tok, B * T, T, 2, C, 0, V);
    buf_check("embedding_bwd dwte", &dte);
    buf_check("embedding_bwd dwpe", &dpe);
    Buf *all[] = {&q, &wte, &wpe, &out, &dte, &dpe};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        buf_free(all[i]);
}

/* Attention on packed qkv rows (strided views), fused and unfused, forward and backward into
 * packed dqkv rows, with sinks, and the ring's merge. */
static void check_attention(const KernBackend *f, const KernBackend *k, int unfused)
{
    const int B = 2, T = 5, H = 2, KV = 1, D = 4, row = (H + 2 * KV) * D;
    const size_t nqkv = (size_t)B * T * row, nout = (size_t)B * T * H * D;
    const size_t np = (size_t)B * H * T * T, nl = (size_t)B * H * T;
    Buf qkv = buf_new(k->act, nqkv, 1.0f), out = buf_new(k->act, nout, 1.0f);
    Buf probs = buf_new(k->act, np, 1.0f), dout = buf_new(k->act, nout, 1.0f);
    Buf dqkv = buf_new(k->act, nqkv, 1.0f), ds = buf_new(k->act, np, 1.0f);
    Buf sinks = buf_new(k->act, H, 1.0f), dsinks = buf_new(k->grad, H, 1.0f);
    float *lse = calloc(nl, sizeof(float)), *lse16 = calloc(nl, sizeof(float));
    float *drow = calloc(nl, sizeof(float)), *drow16 = calloc(nl, sizeof(float));
    CHECK(lse && lse16 && drow && drow16);
    /* side 0 the fp32 table's, side 1 the 16-bit one's; every phase's outputs are checked (and
     * the fp32 side's rounded) before the next reads them */
    KernAttnFwd a[2];
    KernAttnBwd g[2];
    const KernBackend *kb[2] = {f, k};
    for (int half = 0; half < 2; half++) {
        const void *q = half ? qkv.h : (const void *)qkv.f;
        const size_t e = half ? 2 : 4;
        a[half] = (KernAttnFwd){.B = B, .Tq = T, .Tk = T, .H = H, .KV = KV, .D = D,
                                .scale = 0.5f, .q = q, .k = (const char *)q + e * H * D,
                                .v = (const char *)q + e * (H + KV) * D, .q_stride = row,
                                .k_stride = row, .v_stride = row, .out = half ? out.h : out.f,
                                .lse = half ? lse16 : lse, .sinks = half ? sinks.h : sinks.f};
        if (unfused)
            a[half].probs = half ? probs.h : probs.f;
        kb[half]->attention_fwd(&a[half]);
        g[half] = (KernAttnBwd){.B = B, .Tq = T, .Tk = T, .H = H, .KV = KV, .D = D,
                                .scale = 0.5f, .q = a[half].q, .k = a[half].k, .v = a[half].v,
                                .q_stride = row, .k_stride = row, .v_stride = row,
                                .out = a[half].out, .dout = half ? dout.h : dout.f,
                                .dq = half ? dqkv.h : dqkv.f, .dq_stride = row,
                                .dk_stride = row, .dv_stride = row, .probs = a[half].probs,
                                .lse = a[half].lse, .drow = half ? drow16 : drow,
                                .dscores = half ? ds.h : ds.f};
        g[half].dk = (char *)g[half].dq + e * H * D;
        g[half].dv = (char *)g[half].dq + e * (H + KV) * D;
    }
    buf_check(unfused ? "attention_fwd (unfused) out" : "attention_fwd (fused) out", &out);
    if (unfused)
        buf_check("attention_fwd probs", &probs);
    for (size_t i = 0; i < nl && !unfused; i++)
        CHECK(lse[i] == lse16[i]);
    for (int half = 0; half < 2; half++)
        kb[half]->attention_bwd(&g[half]);
    buf_check(unfused ? "attention_bwd (unfused) dqkv" : "attention_bwd (fused) dqkv", &dqkv);
    if (unfused)
        buf_check("attention_bwd dscores", &ds);
    for (int half = 0; half < 2; half++)
        kb[half]->attention_sink_bwd(half ? dsinks.h : dsinks.f, a[half].sinks,
                                     unfused ? NULL : a[half].lse, unfused ? NULL : g[half].drow,
                                     unfused ? g[half].dscores : NULL, B, H, T, T);
    buf_check("attention_sink_bwd", &dsinks);
    if (!unfused) {
        /* the ring's merge of this result with the one of dout's values as out_b */
        f->attention_merge(out.f, lse, dout.f, drow, B * T, H, D);
        k->attention_merge(out.h, lse16, dout.h, drow, B * T, H, D);
        buf_check("attention_merge", &out);
    }
    free(lse);
    free(lse16);
    free(drow);
    free(drow16);
    Buf *all[] = {&qkv, &out, &probs, &dout, &dqkv, &ds, &sinks, &dsinks};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        buf_free(all[i]);
}

/* The optimizer on the fp32 master, the act copy rounded from it, and the casts. */
static void check_optim_casts(const KernBackend *f, const KernBackend *k)
{
    const size_t n = 13;
    Buf p = buf_new(k->act, n, 1.0f), g = buf_new(k->grad, n, 1.0f);
    Buf mst = buf_new(PX_FP32, n, 1.0f), m = buf_new(PX_FP32, n, 0.1f), v = buf_new(PX_FP32, n, 0.1f);
    float mst16[13], m16[13], v16[13];
    for (size_t i = 0; i < n; i++) {
        v.f[i] = fabsf(v.f[i]);
        mst16[i] = mst.f[i], m16[i] = m.f[i], v16[i] = v.f[i];
    }
    f->adamw(p.f, mst.f, g.f, m.f, v.f, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
    k->adamw(p.h, mst16, g.h, m16, v16, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
    buf_check("adamw param", &p);
    for (size_t i = 0; i < n; i++)
        CHECK(mst16[i] == mst.f[i] && m16[i] == m.f[i] && v16[i] == v.f[i]);
    f->sgd_momentum(p.f, mst.f, g.f, m.f, n, 1e-2f, 0.9f, 0.1f, 0.5f);
    k->sgd_momentum(p.h, mst16, g.h, m16, n, 1e-2f, 0.9f, 0.1f, 0.5f);
    buf_check("sgd_momentum param", &p);
    CHECK(f->grad_sumsq(g.f, n) == k->grad_sumsq(g.h, n));
    /* cast_to_act from fp32 values that are not 16-bit ones; cast_to_f32 and acc_to_f32 back */
    float x[13], back[13], acc[13];
    for (size_t i = 0; i < n; i++)
        x[i] = rand_unit() * 3.0f, acc[i] = 1.0f;
    k->cast_to_act(p.h, x, n);
    kern_host_round(p.f, PX_FP32, x, n);
    buf_check("cast_to_act", &p);
    k->cast_to_f32(back, p.h, n);
    k->acc_to_f32(acc, p.h, n);
    for (size_t i = 0; i < n; i++)
        CHECK(back[i] == widen(k->act, h16(&p, i)) && acc[i] == 1.0f + back[i]);
    buf_free(&p);
    buf_free(&g);
    buf_free(&mst);
    buf_free(&m);
    buf_free(&v);
}

/* The shared experts' sigmoid gate (forward, backward, weight gradient) and the router's bias
 * over fp32 logits: their fp32 outputs (dlogit, the logits) equal the fp32 table's exactly. */
static void check_gate(const KernBackend *f, const KernBackend *k)
{
    enum { N = 3, C = 7, F = 5 };
    Buf x = buf_new(k->act, (size_t)N * C, 1.0f), w = buf_new(k->act, C, 0.5f);
    Buf y = buf_new(k->act, (size_t)N * C, 1.0f), dx = buf_new(k->act, (size_t)N * C, 1.0f);
    Buf hid = buf_new(k->act, (size_t)N * F, 1.0f), dhid = buf_new(k->act, (size_t)N * F, 1.0f);
    Buf dw = buf_new(k->grad, C, 1.0f), logits = buf_new(PX_FP32, (size_t)N * C, 2.0f);
    float dl[N], dl16[N];
    f->gate_fwd(y.f, x.f, w.f, N, C);
    k->gate_fwd(y.h, x.h, w.h, N, C);
    buf_check("gate_fwd", &y);
    f->gate_bwd(dl, dhid.f, hid.f, x.f, w.f, N, C, F);
    k->gate_bwd(dl16, dhid.h, hid.h, x.h, w.h, N, C, F);
    buf_check("gate_bwd dhid", &dhid);
    buf_check("gate_bwd hid", &hid);
    for (int i = 0; i < N; i++)
        CHECK(dl[i] == dl16[i]);
    f->gate_wgrad(dx.f, dw.f, dl, x.f, w.f, N, C);
    k->gate_wgrad(dx.h, dw.h, dl, x.h, w.h, N, C);
    buf_check("gate_wgrad dx", &dx);
    buf_check("gate_wgrad dw", &dw);
    f->add_bias_f32(logits.f, w.f, N, C);
    k->add_bias_f32(logits.h, w.h, N, C);
    buf_check("add_bias_f32", &logits);
    Buf *all[] = {&x, &w, &y, &dx, &hid, &dhid, &dw, &logits};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        buf_free(all[i]);
}

/* The expert permutation and its inverse over 5 tokens of 2 copies among 4 experts, one copy
 * dropped (kern_moe_expert_of): only the kept rows are written, the rows past them keep their
 * values on both sides. */
static void check_moe(const KernBackend *f, const KernBackend *k)
{
    enum { N = 5, C = 3, TOPK = 2, E = 4 };
    const int32_t idx[N * TOPK] = {1, 3, 0, 2, -1 - 2, 1, 3, 0, 2, 1};
    float wt[N * TOPK], dw[N * TOPK], dw16[N * TOPK];
    int32_t counts[E], counts16[E], row_of[N * TOPK], row_of16[N * TOPK];
    for (int i = 0; i < N * TOPK; i++)
        wt[i] = 0.25f + 0.0625f * (float)i;
    Buf x = buf_new(k->act, (size_t)N * C, 2.0f), rows = buf_new(k->act, (size_t)N * TOPK * C, 1.0f);
    Buf y = buf_new(k->act, (size_t)N * C, 1.0f), dy = buf_new(k->act, (size_t)N * C, 1.0f);
    Buf eout = buf_new(k->act, (size_t)N * TOPK * C, 1.0f);
    f->moe_permute(rows.f, counts, row_of, x.f, idx, N, C, TOPK, E);
    k->moe_permute(rows.h, counts16, row_of16, x.h, idx, N, C, TOPK, E);
    buf_check("moe_permute", &rows);
    CHECK(memcmp(counts, counts16, sizeof counts) == 0 && memcmp(row_of, row_of16, sizeof row_of) == 0);
    f->moe_permute_bwd(x.f, eout.f, idx, N, C, TOPK, E);
    k->moe_permute_bwd(x.h, eout.h, idx, N, C, TOPK, E);
    buf_check("moe_permute_bwd", &x);
    f->moe_unpermute(y.f, eout.f, wt, idx, N, C, TOPK, E);
    k->moe_unpermute(y.h, eout.h, wt, idx, N, C, TOPK, E);
    buf_check("moe_unpermute", &y);
    f->moe_unpermute_bwd(rows.f, dw, dy.f, eout.f, wt, idx, N, C, TOPK, E);
    k->moe_unpermute_bwd(rows.h, dw16, dy.h, eout.h, wt, idx, N, C, TOPK, E);
    buf_check("moe_unpermute_bwd deout", &rows);
    for (int i = 0; i < N * TOPK; i++)
        CHECK(dw[i] == dw16[i]);
    Buf *all[] = {&x, &rows, &y, &dy, &eout};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        buf_free(all[i]);
}

/* The same bytes (codes and scales) from both tables' quantizations. */
static void check_bytes(const char *what, const uint8_t *want, const uint8_t *got, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        px_test_checks++;
        if (want[i] != got[i]) {
            fprintf(stderr, "FAILED: %s byte %zu: expected 0x%02x, actual 0x%02x\n", what, i,
                    want[i], got[i]);
            exit(1);
        }
    }
}

/* One FP8 layout f of A (M x K) and B (N x K): quantize (and transposed, and delayed for a
 * one-block layout), the flat pieces' amax and quantization, dequantize, and the GEMM
 * C = A B^T into act and fp32 C with beta 0 and 1, its scales in place and split off. */
static void check_fp8_layout(const KernBackend *f, const KernBackend *k, KernFp8 fa, KernFp8 fb)
{
    const int M = fa.rows, K = fa.cols, N = fb.rows;
    const size_t na = (size_t)M * K, nb = (size_t)N * K, qa = kern_fp8_bytes(&fa);
    Buf a = buf_new(k->act, na, 3.0f), b = buf_new(k->act, nb, 0.5f);
    uint8_t *q = calloc(qa, 1), *q16 = calloc(qa, 1), *qb = calloc(kern_fp8_bytes(&fb), 1);
    CHECK(q && q16 && qb);
    float amax = 0, amax16 = 0;
    f->fp8_quantize(q, &amax, a.f, &fa, 0, NULL);
    k->fp8_quantize(q16, &amax16, a.h, &fa, 0, NULL);
    check_bytes("fp8_quantize", q, q16, qa);
    CHECK(amax == amax16);
    const int one_block = fa.block_r >= M && fa.block_c >= K;
    const float delayed = fa.e8m0 ? 0.0078125f : 0.0123f;
    KernFp8 ft = {K, M, fa.block_c, fa.block_r, fa.e5m2, fa.e8m0};
    CHECK(kern_fp8_bytes(&ft) == qa);
    f->fp8_quantize(q, NULL, a.f, &ft, 1, one_block ? &delayed : NULL);
    k->fp8_quantize(q16, NULL, a.h, &ft, 1, one_block ? &delayed : NULL);
    check_bytes(one_block ? "fp8_quantize (trans, delayed)" : "fp8_quantize (trans)", q, q16, qa);
    /* pieces [0, 7) and [7, na): the amaxes, the scales from them, the codes */
    const size_t ns = kern_fp8_scales(&fa), cut = 7;
    float *pa = calloc(ns, sizeof(float)), *pa16 = calloc(ns, sizeof(float));
    CHECK(pa && pa16);
    for (int side = 0; side < 2; side++) {
        const KernBackend *t = side ? k : f;
        float *am = side ? pa16 : pa;
        uint8_t *qq = side ? q16 : q;
        const void *x = side ? a.h : (const void *)a.f;
        const size_t eb = side ? px_dtype_bytes(k->act) : sizeof(float);
        t->fp8_piece_amax(am, x, 0, cut, &fa);
        t->fp8_piece_amax(am, (const char *)x + cut * eb, cut, na - cut, &fa);
        t->fp8_block_scales(qq + na, am, &fa);
        t->fp8_piece_quantize(qq, x, 0, cut, &fa, qq + na);
        t->fp8_piece_quantize(qq + cut, (const char *)x + cut * eb, cut, na - cut, &fa, qq + na);
    }
    CHECK(memcmp(pa, pa16, ns * sizeof(float)) == 0);
    check_bytes("fp8_piece_amax, fp8_piece_quantize", q, q16, qa);
    f->fp8_dequantize(a.f, q, &fa);
    k->fp8_dequantize(a.h, q, &fa);
    buf_check("fp8_dequantize", &a);
    f->fp8_quantize(qb, NULL, b.f, &fb, 0, NULL);
    /* C in the act dtype, the gradients' (a weight gradient's GEMM) and fp32 */
    const PxDtype cdt[3] = {k->act, k->grad, PX_FP32};
    for (int i = 0; i < 3; i++)
        for (int beta = 0; beta <= 1; beta++) {
            Buf c = buf_new(cdt[i], (size_t)M * N, 1.0f);
            char what[64];
            snprintf(what, sizeof what, "matmul_fp8 (%s C, beta %d)", px_dtype_name(cdt[i]), beta);
            f->matmul_fp8(c.f, PX_FP32, q, &fa, qb, &fb, M, N, K, 0, 1, 0.5f, (float)beta);
            k->matmul_fp8(c.h, cdt[i], q, &fa, qb, &fb, M, N, K, 0, 1, 0.5f, (float)beta);
            buf_check(what, &c);
            /* the scales split off (A's given apart, B's after its elements) */
            f->matmul_fp8_split(c.f, PX_FP32, q, &fa, q + na, qb, &fb, NULL, M, N, K, 0, 1, 1.0f,
                                (float)beta);
            k->matmul_fp8_split(c.h, cdt[i], q, &fa, q + na, qb, &fb, NULL, M, N, K, 0, 1, 1.0f,
                                (float)beta);
            buf_check("matmul_fp8_split", &c);
            buf_free(&c);
        }
    free(q);
    free(q16);
    free(qb);
    free(pa);
    free(pa16);
    buf_free(&a);
    buf_free(&b);
}

/* FP8 under every scaling: per tensor (tensorwise, delayed), blockwise's 1 x 128 rows beside
 * 128 x 128 tiles (here 1 x 16 and 16 x 16 on 40 columns: partial blocks) and MXFP8's 1 x 32
 * E8M0 blocks, E4M3 and E5M2. */
static void check_fp8(const KernBackend *f, const KernBackend *k)
{
    enum { M = 6, N = 5, K = 40 };
    check_fp8_layout(f, k, (KernFp8){M, K, M, K, 0, 0}, (KernFp8){N, K, N, K, 0, 0});
    check_fp8_layout(f, k, (KernFp8){M, K, M, K, 1, 0}, (KernFp8){N, K, N, K, 0, 0});
    check_fp8_layout(f, k, (KernFp8){M, K, 1, 16, 0, 0}, (KernFp8){N, K, 16, 16, 0, 0});
    check_fp8_layout(f, k, (KernFp8){M, K, 1, 32, 0, 1}, (KernFp8){N, K, 1, 32, 0, 1});
}

int main(void)
{
    const KernBackend *f = kern_cpu();
    CHECK(kern_cpu_with(PX_FP32) == f);
    CHECK(kern_cpu_with(PX_FP8) == NULL);
    CHECK(kern_cpu_with_grads(PX_BF16, PX_FP16) == NULL);
    const PxDtype acts[2] = {PX_BF16, PX_FP16};
    for (int i = 0; i < 2; i++)
        for (int g16 = 0; g16 <= 1; g16++) {
            const KernBackend *k = kern_cpu_with_grads(acts[i], g16 ? acts[i] : PX_FP32);
            CHECK(k && k->act == acts[i] && k->grad == (g16 ? acts[i] : PX_FP32));
            CHECK(k == kern_cpu_with_grads(acts[i], k->grad));
            check_matmul(f, k);
            check_norms(f, k);
            check_elementwise(f, k);
            check_rope_embedding(f, k);
            check_attention(f, k, 0);
            check_attention(f, k, 1);
            check_optim_casts(f, k);
            check_gate(f, k);
            check_moe(f, k);
            check_fp8(f, k);
        }
    TEST_DONE("kernels_act16");
}
