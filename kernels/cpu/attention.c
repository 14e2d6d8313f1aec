/* Causal self-attention with grouped-query heads, for one micro-batch on one TP rank.
 *
 * Two paths, chosen by the caller through probs:
 * - unfused (probs != NULL): the softmax [B,H,Tq,Tk] is materialized with one sgemm per head
 *   and saved by the caller; it is the only path with attention dropout, and the one whose
 *   memory matches Korthikanti et al.'s activation formulas without flash attention;
 * - fused (probs == NULL): each query row runs an online softmax over blocks of keys (Milakov &
 *   Gimelshein 2018; Dao et al. 2022, FlashAttention), keeping only the row's log-sum-exp; the
 *   backward recomputes the probabilities from it. Memory is O(T) instead of O(T^2).
 *
 * Query t has position q_offset + t and sees keys 0 .. q_offset + t, which lets a
 * context-parallel rank attend its queries to all gathered keys (Tk > Tq). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* Keys per block of the fused forward: the scores of a block live on the stack. */
enum { ATTN_BLOCK = 64 };

/* Number of keys query t sees: 0 .. q_offset + t, clamped to the keys there are. */
static int attn_visible(int q_offset, int t, int Tk)
{
    long last = (long)q_offset + t;
    return last + 1 < (long)Tk ? (int)(last + 1) : Tk;
}

/* The rows of q, k, v (and their gradients) must hold all their heads, or rows would overlap. */
static void attn_check(int B, int Tq, int Tk, int H, int KV, int D, int Dv, int q_offset,
                       int q_stride, int k_stride, int v_stride)
{
    KERN_CHECK(B >= 0 && Tq >= 0 && H > 0 && KV > 0 && D > 0 && Dv > 0, "attention: bad sizes");
    KERN_CHECK(Tk > 0 || Tq == 0 || B == 0, "attention: no keys");
    KERN_CHECK(H % KV == 0, "attention: heads must be a multiple of KV groups");
    KERN_CHECK(q_offset >= 0, "attention: negative q_offset");
    KERN_CHECK(q_stride >= H * D && k_stride >= KV * D && v_stride >= KV * Dv,
               "attention: a stride is shorter than its row of heads");
}

/* MXFP8 attention's second copy of an operand (kernels.h: KernAttnFwd.v_col, KernAttnBwd's
 * q_col, k_col, dout_col), or the operand itself where the caller gives none. */
static const float *attn_second(const void *first, const void *second)
{
    return second ? second : first;
}

/* The value heads' width: D unless the caller gives its own. */
static int attn_dv(int D, int Dv) { return Dv > 0 ? Dv : D; }

static float attn_dot(const float *a, const float *b, int D)
{
    float s = 0.0f;
    for (int d = 0; d < D; d++)
        s += a[d] * b[d];
    return s;
}

/* Zeroes the KV-group slices [B, Tk, KV*D] of a strided dk or dv, and nothing between them
 * (they may be views into a packed dqkv). */
static void attn_zero_kv(float *x, int B, int Tk, int KV, int D, int stride)
{
    for (size_t r = 0; r < (size_t)B * Tk; r++)
        memset(x + r * stride, 0, (size_t)KV * D * sizeof *x);
}

/* Softmax of the first `visible` entries of a row in place; the rest (keys after the query)
 * become 0 so that the saved probabilities can multiply V and be read by the backward as is.
 * A sink (sink != NULL) joins the denominator with no entry of its own. */
static void attn_softmax_row(float *s, int visible, int Tk, const float *sink)
{
    float mx = s[0];
    for (int j = 1; j < visible; j++)
        mx = s[j] > mx ? s[j] : mx;
    if (sink)
        mx = *sink > mx ? *sink : mx;
    double sum = sink ? exp((double)*sink - mx) : 0.0;
    for (int j = 0; j < visible; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < visible; j++)
        s[j] *= inv;
    for (int j = visible; j < Tk; j++)
        s[j] = 0.0f;
}

static void attn_fwd_unfused(const KernAttnFwd *a)
{
    // q is (B,Tq,q_stride), k (B,Tk,k_stride), v (B,Tk,v_stride); out is (B,Tq,H*Dv);
    // probs, mask, probs_drop are (B,H,Tq,Tk)
    const int Tq = a->Tq, Tk = a->Tk, H = a->H, D = a->D, rep = a->H / a->KV;
    const int Dv = attn_dv(D, a->Dv);
    const float *q = a->q, *k = a->k, *v = attn_second(a->v, a->v_col); /* O = P V's */
    float *out = a->out, *probs = a->probs, *pdrop = a->probs_drop;
    const size_t ldo = (size_t)H * Dv, tile = (size_t)Tq * Tk;
    const int drop = a->dropout > 0.0f;
    KERN_CHECK(!drop || (a->mask && pdrop), "attention: dropout needs mask and probs_drop");
    KERN_CHECK(a->dropout < 1.0f, "attention: dropout must be below 1");
    const float keep_scale = drop ? 1.0f / (1.0f - a->dropout) : 1.0f;
    const uint64_t drow = a->drop_row ? a->drop_row : (uint64_t)Tk;
    const uint64_t dhead = a->drop_head ? a->drop_head : (uint64_t)tile;
    for (int b = 0; b < a->B; b++) {
        for (int h = 0; h < H; h++) {
            const int g = h / rep;
            const size_t bh = (size_t)b * H + h;
            const float *qb = q + (size_t)b * Tq * a->q_stride + (size_t)h * D;
            const float *kb = k + (size_t)b * Tk * a->k_stride + (size_t)g * D;
            const float *vb = v + (size_t)b * Tk * a->v_stride + (size_t)g * Dv;
            float *P = probs + bh * tile;
            // All Tq x Tk scores in one sgemm, masked ones too: cheaper than a product per
            // row of visible keys, and the softmax overwrites the masked ones with 0.
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, D, a->scale, qb,
                        a->q_stride, kb, a->k_stride, 0.0f, P, Tk);
            const float *sink = a->sinks ? (const float *)a->sinks + h : NULL;
            for (int t = 0; t < Tq; t++)
                attn_softmax_row(P + (size_t)t * Tk, attn_visible(a->q_offset, t, Tk), Tk, sink);
            const float *Pused = P;
            if (drop) {
                // The entry's place in the stream (by default its flat index into [B,H,Tq,Tk])
                // names each draw, so a recompute and the CUDA backend draw the same mask;
                // masked entries draw too, to keep indices simple.
                for (size_t i = 0; i < tile; i++) {
                    const uint64_t at = bh * dhead + (i / (size_t)Tk) * drow + i % (size_t)Tk;
                    int keep = kern_dropout_keep(a->seed, at, a->dropout);
                    a->mask[bh * tile + i] = (uint8_t)keep;
                    pdrop[bh * tile + i] = keep ? P[i] * keep_scale : 0.0f;
                }
                Pused = pdrop + bh * tile;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, Dv, Tk, 1.0f, Pused, Tk, vb,
                        a->v_stride, 0.0f, out + (size_t)b * Tq * ldo + (size_t)h * Dv, (int)ldo);
        }
    }
}

static void attn_fwd_fused(const KernAttnFwd *a)
{
    // out is (B,Tq,H*Dv), lse is (B,H,Tq)
    const int Tq = a->Tq, Tk = a->Tk, H = a->H, D = a->D, rep = a->H / a->KV;
    const int Dv = attn_dv(D, a->Dv);
    const float *q = a->q, *k = a->k, *v = attn_second(a->v, a->v_col); /* O = P V's */
    float *out = a->out;
    const size_t ldo = (size_t)H * Dv;
    KERN_CHECK(a->dropout == 0.0f, "attention: dropout needs the unfused path (probs)");
    KERN_CHECK(a->lse != NULL, "attention: the fused path needs lse");
    for (int b = 0; b < a->B; b++) {
        for (int h = 0; h < H; h++) {
            const int g = h / rep;
            const float *kb = k + (size_t)b * Tk * a->k_stride + (size_t)g * D;
            const float *vb = v + (size_t)b * Tk * a->v_stride + (size_t)g * Dv;
            for (int t = 0; t < Tq; t++) {
                const float *qr = q + ((size_t)b * Tq + t) * a->q_stride + (size_t)h * D;
                // The output row is the accumulator: fp32 on the CPU, and no scratch needed.
                float *acc = out + ((size_t)b * Tq + t) * ldo + (size_t)h * Dv;
                const int vis = attn_visible(a->q_offset, t, Tk);
                // a sink starts the sum: exp(sink - m) with m = sink
                const float *sink = a->sinks ? (const float *)a->sinks + h : NULL;
                float m = sink ? *sink : -INFINITY;
                double l = sink ? 1.0 : 0.0;
                for (int d = 0; d < Dv; d++)
                    acc[d] = 0.0f;
                for (int j0 = 0; j0 < vis; j0 += ATTN_BLOCK) {
                    const int nj = vis - j0 < ATTN_BLOCK ? vis - j0 : ATTN_BLOCK;
                    float s[ATTN_BLOCK];
                    float bm = -INFINITY;
                    for (int jj = 0; jj < nj; jj++) {
                        s[jj] = a->scale * attn_dot(qr, kb + (size_t)(j0 + jj) * a->k_stride, D);
                        bm = s[jj] > bm ? s[jj] : bm;
                    }
                    const float mnew = bm > m ? bm : m;
                    // What was summed so far was weighted by exp(-m); bring it to exp(-mnew).
                    // On the first block m = -inf and the factor is 0 (of an empty sum).
                    const float corr = expf(m - mnew);
                    l *= corr;
                    for (int d = 0; d < Dv; d++)
                        acc[d] *= corr;
                    for (int jj = 0; jj < nj; jj++) {
                        const float p = expf(s[jj] - mnew);
                        const float *vr = vb + (size_t)(j0 + jj) * a->v_stride;
                        l += p;
                        for (int d = 0; d < Dv; d++)
                            acc[d] += p * vr[d];
                    }
                    m = mnew;
                }
                // l >= 1: the row's maximum (or the sink) contributes exp(0)
                const float inv = (float)(1.0 / l);
                for (int d = 0; d < Dv; d++)
                    acc[d] *= inv;
                a->lse[((size_t)b * H + h) * Tq + t] = m + (float)log(l);
            }
        }
    }
}

void kern_cpu_attention_fwd(const KernAttnFwd *a)
{
    attn_check(a->B, a->Tq, a->Tk, a->H, a->KV, a->D, attn_dv(a->D, a->Dv), a->q_offset,
               a->q_stride, a->k_stride, a->v_stride);
    if (a->B == 0 || a->Tq == 0)
        return;
    if (a->probs)
        attn_fwd_unfused(a);
    else
        attn_fwd_fused(a);
}

/* With P the softmax, Pu the probabilities that multiplied V (P, or its dropped copy) and dO
 * the output gradient: dV = Pu^T dO, dPu = dO V^T, dP = dPu * mask / (1-p),
 * dS = P * (dP - rowsum(dP * P)), dQ = scale dS K, dK = scale dS^T Q. */
static void attn_bwd_unfused(const KernAttnBwd *a)
{
    // dscores, probs, mask, probs_drop are (B,H,Tq,Tk); dout is (B,Tq,H*Dv)
    const int Tq = a->Tq, Tk = a->Tk, H = a->H, D = a->D, rep = a->H / a->KV;
    const int Dv = attn_dv(D, a->Dv);
    const float *q = attn_second(a->q, a->q_col), *k = attn_second(a->k, a->k_col), *v = a->v;
    const float *dout = a->dout, *dout_c = attn_second(a->dout, a->dout_col), *probs = a->probs;
    const float *pdrop = a->probs_drop;
    float *dq = a->dq, *dk = a->dk, *dv = a->dv, *dS_all = a->dscores;
    const size_t ldo = (size_t)H * Dv, tile = (size_t)Tq * Tk;
    const int drop = a->dropout > 0.0f;
    KERN_CHECK(dS_all != NULL, "attention: the unfused backward needs dscores");
    KERN_CHECK(!drop || (a->mask && pdrop), "attention: dropout needs mask and probs_drop");
    KERN_CHECK(a->dropout < 1.0f, "attention: dropout must be below 1");
    const float keep_scale = drop ? 1.0f / (1.0f - a->dropout) : 1.0f;
    for (int b = 0; b < a->B; b++) {
        for (int h = 0; h < H; h++) {
            const int g = h / rep;
            const size_t bh = (size_t)b * H + h;
            /* dK and dQ reduce over a sequence: the column-wise Q and K (MXFP8), as does dV
             * (dO's); dP over head_dim: the row-wise dO and V */
            const float *qcb = q + (size_t)b * Tq * a->q_stride + (size_t)h * D;
            const float *kcb = k + (size_t)b * Tk * a->k_stride + (size_t)g * D;
            const float *vb = v + (size_t)b * Tk * a->v_stride + (size_t)g * Dv;
            const float *dob = dout + (size_t)b * Tq * ldo + (size_t)h * Dv;
            const float *docb = dout_c + (size_t)b * Tq * ldo + (size_t)h * Dv;
            float *dqb = dq + (size_t)b * Tq * a->dq_stride + (size_t)h * D;
            float *dkb = dk + (size_t)b * Tk * a->dk_stride + (size_t)g * D;
            float *dvb = dv + (size_t)b * Tk * a->dv_stride + (size_t)g * Dv;
            const float *P = probs + bh * tile;
            const float *Pused = drop ? pdrop + bh * tile : P;
            float *dS = dS_all + bh * tile;
            // heads of one group add into the same dk, dv rows (beta = 1 after the zeroing)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, Dv, Tq, 1.0f, Pused, Tk, docb,
                        (int)ldo, 1.0f, dvb, a->dv_stride);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, Dv, 1.0f, dob, (int)ldo,
                        vb, a->v_stride, 0.0f, dS, Tk);
            if (drop) {
                const uint8_t *mk = a->mask + bh * tile;
                for (size_t i = 0; i < tile; i++)
                    dS[i] = mk[i] ? dS[i] * keep_scale : 0.0f;
            }
            for (int t = 0; t < Tq; t++) {
                float *ds = dS + (size_t)t * Tk;
                const float *p = P + (size_t)t * Tk;
                double dot = 0.0;
                for (int j = 0; j < Tk; j++)
                    dot += (double)ds[j] * p[j];
                for (int j = 0; j < Tk; j++)
                    ds[j] = p[j] * (ds[j] - (float)dot);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, D, Tk, a->scale, dS, Tk, kcb,
                        a->k_stride, 0.0f, dqb, a->dq_stride);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, D, Tq, a->scale, dS, Tk, qcb,
                        a->q_stride, 1.0f, dkb, a->dk_stride);
        }
    }
}

/* The same formulas one query row at a time, with P recomputed as exp(s - lse) and
 * rowsum(dP * P) = rowsum(dO * O) (because O = P V), so nothing of size Tq x Tk is stored. */
static void attn_bwd_fused(const KernAttnBwd *a)
{
    // out, dout are (B,Tq,H*Dv); lse, drow are (B,H,Tq)
    const int Tq = a->Tq, Tk = a->Tk, H = a->H, D = a->D, rep = a->H / a->KV;
    const int Dv = attn_dv(D, a->Dv);
    const float *q = a->q, *k = a->k, *v = a->v, *out = a->out, *dout = a->dout;
    const float *q_c = attn_second(q, a->q_col), *k_c = attn_second(k, a->k_col);
    const float *dout_c = attn_second(dout, a->dout_col);
    float *dq = a->dq, *dk = a->dk, *dv = a->dv;
    const size_t ldo = (size_t)H * Dv;
    KERN_CHECK(a->dropout == 0.0f, "attention: dropout needs the unfused path (probs)");
    KERN_CHECK(a->lse && a->drow && out, "attention: the fused backward needs out, lse, drow");
    for (int b = 0; b < a->B; b++) {
        for (int h = 0; h < H; h++) {
            const int g = h / rep;
            const size_t bh = (size_t)b * H + h;
            const size_t ko = (size_t)b * Tk * a->k_stride + (size_t)g * D;
            const float *kb = k + ko, *kcb = k_c + ko;
            const float *vb = v + (size_t)b * Tk * a->v_stride + (size_t)g * Dv;
            float *dkb = dk + (size_t)b * Tk * a->dk_stride + (size_t)g * D;
            float *dvb = dv + (size_t)b * Tk * a->dv_stride + (size_t)g * Dv;
            for (int t = 0; t < Tq; t++) {
                const size_t qo = ((size_t)b * Tq + t) * a->q_stride + (size_t)h * D;
                const size_t oo = ((size_t)b * Tq + t) * ldo + (size_t)h * Dv;
                const float *qr = q + qo, *qcr = q_c + qo, *orow = out + oo;
                const float *dor = dout + oo, *docr = dout_c + oo;
                float *dqr = dq + ((size_t)b * Tq + t) * a->dq_stride + (size_t)h * D;
                double dr = 0.0;
                for (int d = 0; d < Dv; d++)
                    dr += (double)dor[d] * orow[d];
                a->drow[bh * Tq + t] = (float)dr;
                const float lse = a->lse[bh * Tq + t];
                for (int d = 0; d < D; d++)
                    dqr[d] = 0.0f;
                const int vis = attn_visible(a->q_offset, t, Tk);
                for (int j = 0; j < vis; j++) {
                    const float *kr = kb + (size_t)j * a->k_stride;
                    const float *kcr = kcb + (size_t)j * a->k_stride;
                    const float *vr = vb + (size_t)j * a->v_stride;
                    float *dkr = dkb + (size_t)j * a->dk_stride;
                    float *dvr = dvb + (size_t)j * a->dv_stride;
                    const float p = expf(a->scale * attn_dot(qr, kr, D) - lse);
                    const float ds = p * (attn_dot(dor, vr, Dv) - (float)dr) * a->scale;
                    /* the sums over a sequence read the column-wise copies (MXFP8) */
                    for (int d = 0; d < D; d++) {
                        dqr[d] += ds * kcr[d];
                        dkr[d] += ds * qcr[d];
                    }
                    for (int d = 0; d < Dv; d++)
                        dvr[d] += p * docr[d];
                }
            }
        }
    }
}

void kern_cpu_attention_bwd(const KernAttnBwd *a)
{
    const int Dv = attn_dv(a->D, a->Dv);
    attn_check(a->B, a->Tq, a->Tk, a->H, a->KV, a->D, Dv, a->q_offset, a->q_stride, a->k_stride,
               a->v_stride);
    attn_check(a->B, a->Tq, a->Tk, a->H, a->KV, a->D, Dv, a->q_offset, a->dq_stride, a->dk_stride,
               a->dv_stride);
    // dk and dv are overwritten (even with no queries) but summed over the heads of a group
    attn_zero_kv(a->dk, a->B, a->Tk, a->KV, a->D, a->dk_stride);
    attn_zero_kv(a->dv, a->B, a->Tk, a->KV, Dv, a->dv_stride);
    if (a->B == 0 || a->Tq == 0)
        return;
    if (a->probs)
        attn_bwd_unfused(a);
    else
        attn_bwd_fused(a);
}

/* Milakov & Gimelshein 2018's online softmax, two blocks at a time: each side's output is
 * normalised by its own sum of exponentials e^lse, so the merged one weighs them by their
 * share of the total. */
void kern_cpu_attention_merge(void *out, float *lse, const void *out_b, const float *lse_b, int T,
                              int H, int D)
{
    float *o = out;
    const float *ob = out_b;
    KERN_CHECK(T >= 0 && H > 0 && D > 0, "attention_merge: bad shape");
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            const size_t i = (size_t)h * T + t;
            const double a = lse[i], b = lse_b[i], m = a > b ? a : b;
            const double L = m + log(exp(a - m) + exp(b - m));
            const float wa = (float)exp(a - L), wb = (float)exp(b - L);
            float *row = o + (size_t)t * H * D + (size_t)h * D;
            const float *rb = ob + (size_t)t * H * D + (size_t)h * D;
            for (int d = 0; d < D; d++)
                row[d] = wa * row[d] + wb * rb[d];
            lse[i] = (float)L;
        }
}
