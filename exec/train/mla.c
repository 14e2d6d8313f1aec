/* Multi-head latent attention's projections (DeepSeek-AI 2024, DeepSeek-V2 sec. 2.1; as
 * Megatron-Core's MLASelfAttention runs them), op by op as model/ops.c lists them: q_a, kv_a,
 * q_b, kv_b forward and kv_b, q_b, kv_a, q_a backward, between the layer's first norm and the
 * attention core, which reads the queries, keys and values this file writes.
 *
 * Tensor parallelism: the down-projections (q_a, kv_a) and the latents' norms are replicated
 * and compute on this rank's rows (its sequence shard with SP); the latents are gathered over
 * TP and the up-projections (q_b, kv_b) split by heads. Backward, the latents' gradients,
 * partial over the heads' ranks, are reduce-scattered back to the shards (all-reduced without
 * SP) before the norms' backward; the down-projections' input gradient needs no collective.
 *
 * Layouts (docs/executor.md, "Multi-head latent attention"):
 * - attn.qkv.out (and ws.dqkv) hold three planes, Q [N, H x qk], K [N, H x qk], V [N, H x v]
 *   (N = b x s_loc rows, H this rank's heads, qk = qk_nope + qk_rope, each head non-rotary part
 *   first); exec_qkv_at gives the core its views.
 * - attn.q_lat is the query latent [N, q_lora] before its norm; attn.kv_lat the keys' and
 *   values' latent and the rotary key before the norm and the rotation, in blocks of R rows
 *   (R = b x s_sp: a rank's shard, the whole sequence without SP), each [R x kv_lora | R x
 *   qk_rope]: what the all-gather of the shards gives. The norms run again in the backward
 *   (no FLOPs: model/ops.c counts none for norms).
 * - kv_b's rows are every head's non-rotary key, then every head's value (init.c's
 *   EXEC_MAP_KV_B), so that the values land in V's plane straight from the GEMM.
 * - ws.mla (model_mla_work) holds the temporaries.
 *
 * FP8 GEMMs (docs/fp8.md): each of the four projections is one FP8 linear (fp8.c's), kv_a's
 * latent and rotary key one GEMM, kv_b's keys and values one. The down-projections' input, the
 * layer's normed input, is quantized once into attn.qkv.in (its saved copy, as the table
 * counts it; q_a's scaling, or kv_a's without a query latent) and both read it; the
 * up-projections' inputs, the normed latents, are quantized for each use (the backward's
 * weight gradient too: the norms run again there). Their outputs and output gradients pass
 * through ws.fp8's act part, where the GEMM's packed columns are split into (or gathered
 * from) the layouts above.
 *
 * FP8 attention (--fp8-attention, the fused core; docs/fp8.md): the forward writes Q, K and V
 * into ws.fp8's act part instead of attn.qkv.out, which then holds their FP8 copy (layers.c
 * quantizes them there under the core's op), and kv_b's GEMM writes through ws.dqkv
 * (kv_b_out); the core's histories under delayed scaling are kv_b's (model_fp8_attn_weight).
 * Under mxfp8 the core's column-wise copies are one per plane (layers.c's fp8_core_cols); with
 * context parallelism the K, V codes are packed from the planes into cp's rows (cp.c), or
 * under mxfp8 (the exchanges in the act dtype) the 16-bit planes are saved in attn.qkv.out
 * over the all-gather and the ring (qkv_out) and quantized by the core after the exchange. */
#include <math.h>

#include "exec/train/internal.h"

#define TRY EXEC_TRY

#define AT(p, i) EXEC_AT(p, i, r->c->ab)

/* The dimensions this file works with, once. */
typedef struct {
    int N, R, h, H, qk, v, nope, rope, qr, kr, kva;
    int sp, blocks, rows; /* the latents' blocks (t with SP, else 1) of `rows` rows each */
    float eps;
    ModelMlaWork mw;
    /* the projections' FP8 weights (NULL: act GEMMs): q_a, kv_a, q_b, kv_b */
    const ExecFp8Weight *fqa, *fkva, *fqb, *fkvb;
} Mla;

static Mla mla_dims(const ExecLayerRun *r, int l)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const ModelMla *m = &c->spec.model.mla;
    Mla x = {
        .N = d->b * d->s_loc, .R = d->b * d->s_sp, .h = d->h, .H = d->heads_loc,
        .qk = d->qk_hd, .v = d->v_hd, .nope = m->qk_nope_dim, .rope = m->qk_rope_dim,
        .qr = m->q_lora_rank, .kr = m->kv_lora_rank, .kva = m->kv_lora_rank + m->qk_rope_dim,
        .sp = exec_sp_on(c), .eps = (float)c->spec.model.norm_eps,
    };
    x.blocks = x.sp ? d->t : 1;
    x.rows = x.sp ? x.R : x.N;
    model_mla_work(&c->spec, d, &x.mw);
    x.fqa = exec_fp8_weight(r->fp8, MODEL_TR_Q_A_W, l);
    x.fkva = exec_fp8_weight(r->fp8, MODEL_TR_KV_A_W, l);
    x.fqb = exec_fp8_weight(r->fp8, MODEL_TR_Q_B_W, l);
    x.fkvb = exec_fp8_weight(r->fp8, MODEL_TR_KV_B_W, l);
    return x;
}

static int op_open(const ExecLayerRun *r, int l, ModelOpRole role, ModelPhase ph)
{
    const int op = exec_meter_layer_op(r->M, l, role, ph);
    exec_meter_open(r->M, r->c->k, op);
    return op;
}

static void op_close(const ExecLayerRun *r, int op) { exec_meter_close(r->M, r->c->k, op); }

/* C[m,n] = op(A) op(B) (beta 0) or += (beta 1), C in the act dtype; 2mnk FLOPs. */
static void mm(const ExecLayerRun *r, void *c, const void *a, const void *b, int m, int n, int k,
               int ta, int tb, float beta)
{
    r->c->k->matmul(c, r->c->act, a, b, m, n, k, ta, tb, 1.0f, beta);
    exec_meter_flops(r->M, 2.0 * m * n * k);
}

/* dW[m,n] += A^T B (a weight's gradient in its dtype, c->grad: fp32 or 16-bit; A [k,m],
 * B [k,n]). */
static void wgrad(const ExecLayerRun *r, float *dw, const void *a, const void *b, int m, int n,
                  int k)
{
    r->c->k->matmul(dw, r->c->grad, a, b, m, n, k, 1, 0, 1.0f, 1.0f);
    exec_meter_flops(r->M, 2.0 * m * n * k);
}

/* An FP8 linear's forward, y [n, w's rows] from x [n, w's cols] (act) quantized into ws.fp8's
 * first copy with w's input scaling (a forward records its amax). */
static void fp8_fwd(const ExecLayerRun *r, void *y, const void *x, const ExecFp8Weight *w, int n,
                    ModelPhase ph)
{
    const int rec = ph == MODEL_FWD;
    const ExecFp8Ref xq = exec_fp8_quantize(r->fp8, r->c, r->fp8->q0, x, n, w->cols, 0,
                                            EXEC_FP8_X, w, 0, rec);
    exec_fp8_linear_fwd(r->fp8, r->c, r->M, y, xq, w, 0, n, rec);
}

/* cols elements of each of `rows` rows from src (row stride lds) to dst (ldd); add: dst += */
static void cols_copy(const ExecLayerRun *r, void *dst, int ldd, const void *src, int lds,
                      int rows, int cols, int add)
{
    r->c->k->copy_cols(dst, ldd, src, lds, rows, cols, add);
}

/* Row n's rotary key in a latent laid out in blocks (attn.kv_lat, or its gradient). */
static void *rope_row(const ExecLayerRun *r, const Mla *m, void *lat, int n)
{
    const int bk = n / m->rows;
    return AT(lat, (size_t)bk * m->rows * m->kva + (size_t)m->rows * m->kr +
                       (size_t)(n - bk * m->rows) * m->rope);
}

/* The latent's norm over every block: out [N, kv_lora] from attn.kv_lat. */
static void kv_norm_all(const ExecLayerRun *r, const Mla *m, void *out, const void *lat,
                        const void *w)
{
    for (int bk = 0; bk < m->blocks; bk++)
        r->c->k->rmsnorm_fwd(AT(out, (size_t)bk * m->rows * m->kr),
                             EXEC_AT(lat, (size_t)bk * m->rows * m->kva, r->c->ab), w, m->rows,
                             m->kr, m->eps);
}

/* The rotary embedding of the queries' rotary parts and the shared rotary key, each part of
 * each sequence at its global positions, through ws.mla's x: [N, (H + 2) x rope] rows, the
 * queries' parts, then the key, then a slot the kernel's packed layout skips (its values).
 * Forward: Q's parts and the latent's key in, Q's and every head's K parts out. Backward: the
 * gradients of Q's parts and the sum over the heads of K's in, Q's and the latent's key out
 * (the key is shared: its gradient is the heads' sum). */
static void rope_parts(const ExecLayerRun *r, const Mla *m, void *qplane, void *kplane, void *lat,
                       int backward)
{
    const ExecCtx *c = r->c;
    const int w = (m->H + 2) * m->rope, ld = m->H * m->qk, C = exec_cp_part_len(c);
    void *E = AT(r->W->mla, m->mw.x);
    for (int h = 0; h < m->H; h++)
        cols_copy(r, AT(E, (size_t)h * m->rope), w, AT(qplane, (size_t)h * m->qk + m->nope), ld,
                  m->N, m->rope, 0);
    void *ek = AT(E, (size_t)m->H * m->rope);
    if (!backward) {
        for (int bk = 0; bk < m->blocks; bk++)
            cols_copy(r, AT(ek, (size_t)bk * m->rows * w), w, rope_row(r, m, lat, bk * m->rows),
                      m->rope, m->rows, m->rope, 0);
    } else {
        for (int h = 0; h < m->H; h++)
            cols_copy(r, ek, w, AT(kplane, (size_t)h * m->qk + m->nope), ld, m->N, m->rope, h > 0);
    }
    const float theta = (float)c->spec.model.rope_theta;
    for (int q = 0; q < c->d.b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++) {
            void *x = AT(E, ((size_t)q * c->d.s_loc + (size_t)j * C) * w);
            const int p0 = exec_cp_part_pos(c, c->g.cp_rank, j);
            if (backward)
                c->k->rope_bwd(x, 1, C, m->H, 1, m->rope, p0, theta);
            else
                c->k->rope_fwd(x, 1, C, m->H, 1, m->rope, p0, theta);
        }
    for (int h = 0; h < m->H; h++)
        cols_copy(r, AT(qplane, (size_t)h * m->qk + m->nope), ld, AT(E, (size_t)h * m->rope), w,
                  m->N, m->rope, 0);
    if (backward) {
        for (int bk = 0; bk < m->blocks; bk++)
            cols_copy(r, rope_row(r, m, lat, bk * m->rows), m->rope,
                      AT(ek, (size_t)bk * m->rows * w), w, m->rows, m->rope, 0);
        return;
    }
    for (int h = 0; h < m->H; h++)
        cols_copy(r, AT(kplane, (size_t)h * m->qk + m->nope), ld, ek, w, m->N, m->rope, 0);
}

/* The down-projections on this rank's rows (its shard with SP, gathered after). */
static int down_fwd(const ExecLayerRun *r, const Mla *m, int chunk, int l, const ExecLayerActs *a,
                    ModelPhase ph, PxError *err)
{
    const ExecLayerParams *w = &r->P->lw[l];
    ExecFp8 *F = r->fp8;
    const int rec = ph == MODEL_FWD;
    /* under FP8 the normed input is in ws.fp8's act part (layers.c), quantized here */
    const void *x = m->fkva ? F->act : EXEC_LA(a, QKV_IN);
    ExecFp8Ref xq = {NULL, {0, 0, 0, 0, 0, 0}};
    void *W = r->W->mla;
    int op;
    if (m->qr > 0) {
        op = op_open(r, l, MODEL_OPR_Q_A, ph);
        void *y = m->sp ? AT(W, m->mw.qs) : EXEC_LAA(a, Q_LAT);
        if (m->fqa) {
            xq = exec_fp8_quantize(F, r->c, EXEC_LA(a, QKV_IN), x, m->R, m->h, 0, EXEC_FP8_X,
                                   m->fqa, 0, rec);
            exec_fp8_linear_fwd(F, r->c, r->M, y, xq, m->fqa, 0, m->R, rec);
        } else {
            mm(r, y, x, EXEC_LPA(w, Q_A_W), m->R, m->qr, m->h, 0, 1, 0.0f);
        }
        op_close(r, op);
    }
    op = op_open(r, l, MODEL_OPR_KV_A, ph);
    void *ks = m->sp ? AT(W, m->mw.ks) : EXEC_LAA(a, KV_LAT);
    if (m->fkva) {
        if (!xq.q)
            xq = exec_fp8_quantize(F, r->c, EXEC_LA(a, QKV_IN), x, m->R, m->h, 0, EXEC_FP8_X,
                                   m->fkva, 0, rec);
        /* [R, kv_lora + rope] in ws.mla's dkv (free until the backward; ws.fp8's act part
         * keeps x for q_b without a query latent), split into the block's latent and rotary
         * key */
        void *y = AT(W, m->mw.dkv);
        exec_fp8_linear_fwd(F, r->c, r->M, y, xq, m->fkva, 0, m->R, rec);
        cols_copy(r, ks, m->kr, y, m->kva, m->R, m->kr, 0);
        cols_copy(r, AT(ks, (size_t)m->R * m->kr), m->rope, AT(y, m->kr), m->kva, m->R, m->rope,
                  0);
    } else {
        mm(r, ks, x, EXEC_LPA(w, KV_A_W), m->R, m->kr, m->h, 0, 1, 0.0f);
        mm(r, AT(ks, (size_t)m->R * m->kr), x, AT(EXEC_LPA(w, KV_A_W), (size_t)m->kr * m->h),
           m->R, m->rope, m->h, 0, 1, 0.0f);
    }
    if (m->sp)
        TRY(exec_tp_all_gather(r, MODEL_OPR_KV_A, l, chunk, ph, EXEC_LAA(a, KV_LAT), ks,
                               (size_t)m->R * m->kva, err));
    op_close(r, op);
    return PX_OK;
}

/* Where the forward writes Q, K and V: attn.qkv.out, or under FP8 attention's fused core
 * (model_fp8_attn_qkv) ws.fp8's act part, which the core reads and quantizes into
 * attn.qkv.out, their FP8 copy (layers.c's fp8_core_fwd). MXFP8 attention with cp over the
 * all-gather or the ring (model_fp8_attn_cp16, model_fp8_attn_saved 0) saves the 16-bit
 * planes in attn.qkv.out, as the QKV projection's rows (layers.c's layer_fwd): the core
 * quantizes them after the gather, or before the ring passes (fp8_core_cp16). */
static void *qkv_out(const ExecLayerRun *r, const ExecLayerActs *a)
{
    const ModelSpec *s = &r->c->spec;
    const int cp16 = model_fp8_attn_cp16(s) && !model_fp8_attn_saved(s);
    return model_fp8_attn_qkv(s) && !cp16 ? r->fp8->act : EXEC_LA(a, QKV_OUT);
}

/* Where kv_b's FP8 GEMM writes its keys and values [N, H (nope + v)] before they go to K's and
 * V's planes: ws.fp8's act part, free once q_b has read the layer's input there; under FP8
 * attention that part holds the planes themselves (qkv_out), so ws.dqkv, the backward's
 * scratch, which no forward reads (N x H (2 qk + v) elements: wide enough). */
static void *kv_b_out(const ExecLayerRun *r)
{
    return model_fp8_attn_qkv(&r->c->spec) ? r->W->dqkv : r->fp8->act;
}

int exec_mla_forward(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                     ModelPhase ph, PxError *err)
{
    const ExecCtx *c = r->c;
    const Mla m = mla_dims(r, l);
    const ExecLayerParams *w = &r->P->lw[l];
    void *W = r->W->mla, *lat = AT(W, m.mw.lat), *X = AT(W, m.mw.x);
    const ExecQkv o = exec_qkv_at(c, qkv_out(r, a), 0);
    TRY(down_fwd(r, &m, chunk, l, a, ph, err));

    int op = op_open(r, l, MODEL_OPR_Q_B, ph);
    const void *qin = lat;
    if (m.qr > 0) {
        if (m.sp)
            TRY(exec_tp_all_gather(r, MODEL_OPR_Q_B, l, chunk, ph, EXEC_LAA(a, Q_LAT),
                                   AT(W, m.mw.qs), (size_t)m.R * m.qr, err));
        c->k->rmsnorm_fwd(lat, EXEC_LAA(a, Q_LAT), EXEC_LPA(w, Q_NORM_W), m.N, m.qr, m.eps);
    } else if (m.fqb) {
        /* the layer's normed input, still in ws.fp8's act part (down_fwd), gathered with SP
         * and quantized whole with q_b's scaling (into ws.fp8's first copy: under FP8
         * attention the GEMM then writes Q's plane over it) */
        ExecFp8Ref xq;
        TRY(exec_tp_column_input(r, chunk, l, MODEL_OPR_Q_B, ph, m.fqb, r->fp8->act,
                                 r->fp8->act, &qin, &xq, err));
        exec_fp8_linear_fwd(r->fp8, c, r->M, o.q, xq, m.fqb, 0, m.N, ph == MODEL_FWD);
    } else {
        ExecFp8Ref xq;
        TRY(exec_tp_column_input(r, chunk, l, MODEL_OPR_Q_B, ph, NULL, EXEC_LA(a, QKV_IN),
                                 EXEC_LA(a, QKV_IN), &qin, &xq, err));
    }
    if (m.fqb && m.qr > 0)
        fp8_fwd(r, o.q, qin, m.fqb, m.N, ph);
    else if (!m.fqb)
        mm(r, o.q, qin, EXEC_LPA(w, Q_B_W), m.N, m.H * m.qk, m.qr > 0 ? m.qr : m.h, 0, 1, 0.0f);
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_KV_B, ph);
    kv_norm_all(r, &m, lat, EXEC_LAA(a, KV_LAT), EXEC_LPA(w, KV_NORM_W));
    const void *wk = EXEC_LPA(w, KV_B_W);
    int ldk = m.H * m.nope; /* the non-rotary keys, X's or ws.fp8's act part's rows */
    if (m.fkvb) {
        /* every head's keys then values, [N, H (nope + v)]: the values to V's plane */
        ldk = m.H * (m.nope + m.v);
        X = kv_b_out(r);
        fp8_fwd(r, X, lat, m.fkvb, m.N, ph);
        cols_copy(r, o.v, o.v_stride, AT(X, (size_t)m.H * m.nope), ldk, m.N, m.H * m.v, 0);
    } else {
        mm(r, o.v, lat, AT(wk, (size_t)m.H * m.nope * m.kr), m.N, m.H * m.v, m.kr, 0, 1, 0.0f);
        mm(r, X, lat, wk, m.N, m.H * m.nope, m.kr, 0, 1, 0.0f);
    }
    for (int h = 0; h < m.H; h++)
        cols_copy(r, AT(o.k, (size_t)h * m.qk), o.k_stride, AT(X, (size_t)h * m.nope), ldk, m.N,
                  m.nope, 0);
    rope_parts(r, &m, o.q, o.k, EXEC_LAA(a, KV_LAT), 0);
    op_close(r, op);
    return PX_OK;
}

/* kv_b's backward: the rotary parts' (Q's back into ws.dqkv, the key's into the latent's
 * gradient), then the GEMMs; the latent's gradient, partial over the heads' ranks, block by
 * block into ws.mla's dkv. */
static void kv_b_bwd(const ExecLayerRun *r, const Mla *m, int l, const ExecLayerActs *a,
                     const ExecQkv *dq)
{
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    void *W = r->W->mla, *X = AT(W, m->mw.x), *lat = AT(W, m->mw.lat), *dkv = AT(W, m->mw.dkv);
    const int kn = m->H * m->nope;
    rope_parts(r, m, dq->q, dq->k, dkv, 1);
    /* the keys' gradients without their rotary parts: X's rows, or under FP8 the first kn
     * columns of the GEMM's output gradient [N, H (nope + v)] in ws.fp8's act part */
    const int ld = m->fkvb ? kn + m->H * m->v : kn;
    if (m->fkvb)
        X = r->fp8->act;
    for (int h = 0; h < m->H; h++)
        cols_copy(r, AT(X, (size_t)h * m->nope), ld, AT(dq->k, (size_t)h * m->qk), dq->k_stride,
                  m->N, m->nope, 0);
    kv_norm_all(r, m, lat, EXEC_LAA(a, KV_LAT), EXEC_LPA(w, KV_NORM_W));
    float *gk = EXEC_LPA(g, KV_B_W);
    if (m->fkvb) {
        /* the latent's gradient [N, kv_lora] in ws.mla's dl, then block by block into dkv */
        const ExecFp8Ref none = {NULL, {0, 0, 0, 0, 0, 0}};
        void *dx = AT(W, m->mw.dl);
        cols_copy(r, AT(X, (size_t)kn), ld, dq->v, dq->v_stride, m->N, m->H * m->v, 0);
        exec_fp8_linear_bwd(r->fp8, r->c, r->M, dx, gk, X, none, lat, m->fkvb, 0, m->N);
        for (int bk = 0; bk < m->blocks; bk++)
            cols_copy(r, AT(dkv, (size_t)bk * m->rows * m->kva), m->kr,
                      AT(dx, (size_t)bk * m->rows * m->kr), m->kr, m->rows, m->kr, 0);
        return;
    }
    wgrad(r, gk, X, lat, kn, m->kr, m->N);
    wgrad(r, EXEC_AT(gk, (size_t)kn * m->kr, r->c->gb), dq->v, lat, m->H * m->v, m->kr, m->N);
    const void *wk = EXEC_LPA(w, KV_B_W), *wv = AT(wk, (size_t)kn * m->kr);
    for (int bk = 0; bk < m->blocks; bk++) {
        void *o = AT(dkv, (size_t)bk * m->rows * m->kva);
        const size_t r0 = (size_t)bk * m->rows;
        mm(r, o, AT(X, r0 * kn), wk, m->rows, m->kr, kn, 0, 0, 0.0f);
        mm(r, o, AT(dq->v, r0 * dq->v_stride), wv, m->rows, m->kr, m->H * m->v, 0, 0, 1.0f);
    }
}

/* q_b's backward; the query latent's gradient (or with q_lora_rank 0 the input's, in ws.dhid)
 * reduced over TP: *qs this rank's rows of it. With q_lora_rank 0 and SP the weight gradient
 * reads the input gathered again (sp.gather, as a column-parallel layer's), and the input's
 * gradient is reduce-scattered through ws.dx_a back into ws.dhid's first rows, where the keys'
 * down-projection adds its own. */
static int q_b_bwd(const ExecLayerRun *r, const Mla *m, int chunk, int l, const ExecLayerActs *a,
                   const ExecQkv *dq, void **qs, PxError *err)
{
    const ExecCtx *c = r->c;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    void *W = r->W->mla, *lat = AT(W, m->mw.lat);
    const int qw = m->H * m->qk, in = m->qr > 0 ? m->qr : m->h;
    const void *x = lat;
    ExecFp8Ref xq = {NULL, {0, 0, 0, 0, 0, 0}};
    if (m->qr > 0) /* under FP8 the normed latent quantized again for the weight gradient */
        c->k->rmsnorm_fwd(lat, EXEC_LAA(a, Q_LAT), EXEC_LPA(w, Q_NORM_W), m->N, m->qr, m->eps);
    else /* the saved input: its FP8 copy itself, or in the act dtype (gathered with SP) */
        TRY(exec_tp_column_bwd_input(r, chunk, l, MODEL_OPR_Q_B, EXEC_LA(a, QKV_IN),
                                     m->fqb != NULL, &x, &xq, err));
    void *dl = m->qr > 0 ? AT(W, m->mw.dq) : r->W->dhid;
    if (m->fqb) { /* dq's plane is [N, qw] */
        exec_fp8_linear_bwd(r->fp8, c, r->M, dl, EXEC_LPA(g, Q_B_W), dq->q, xq, xq.q ? NULL : x,
                            m->fqb, 0, m->N);
    } else {
        wgrad(r, EXEC_LPA(g, Q_B_W), dq->q, x, qw, in, m->N);
        mm(r, dl, dq->q, EXEC_LPA(w, Q_B_W), m->N, in, qw, 0, 0, 0.0f);
    }
    *qs = dl;
    if (m->sp && m->qr == 0) {
        TRY(exec_tp_reduce_scatter(r, MODEL_OPR_Q_B, l, chunk, MODEL_BWD, r->W->dx_a, dl,
                                   (size_t)m->R * in, err));
        c->k->copy(dl, r->W->dx_a, (size_t)m->R * in * c->ab);
        return PX_OK;
    }
    if (m->sp) {
        *qs = AT(W, m->mw.qs);
        return exec_tp_reduce_scatter(r, MODEL_OPR_Q_B, l, chunk, MODEL_BWD, *qs, dl,
                                      (size_t)m->R * in, err);
    }
    return exec_tp_allreduce(r, MODEL_OPR_Q_B, l, chunk, MODEL_BWD, dl, (size_t)m->N * in, err);
}

/* A down-projection's latent norm backward on this rank's rows (dout the latent's reduced
 * gradient, inp the rank's rows of the saved latent, `width` wide): the latent's gradient into
 * ws.mla's z, which it returns. */
static void *down_norm_bwd(const ExecLayerRun *r, const Mla *m, const void *dout,
                           const void *inp, const void *nw, float *gnw, int width)
{
    const ExecCtx *c = r->c;
    void *z = AT(r->W->mla, m->mw.z);
    c->k->memset0(z, (size_t)m->R * width * c->ab);
    c->k->rmsnorm_bwd(z, gnw, dout, inp, nw, m->R, width, m->eps);
    return z;
}

/* A down-projection's GEMMs backward on this rank's rows x (attn.qkv.in) from dy [R, width]:
 * the weight's gradient and the input's, added into ws.dhid (beta 1) or written (beta 0). */
static void down_bwd(const ExecLayerRun *r, const Mla *m, const void *x, const void *dy,
                     const void *wt, float *gw, int width, float beta)
{
    wgrad(r, gw, dy, x, width, m->h, m->R);
    mm(r, r->W->dhid, dy, wt, m->R, m->h, width, 0, 0, beta);
}

/* The down-projections' backward on FP8 (a query latent present: kv_a's writes ws.dhid, q_a's
 * adds; without one kv_a's adds to q_b's there): kv_a's from its latent's and rotary key's
 * gradients (z, krope) gathered into one [R, kv_lora + rope] output gradient, q_a's from its
 * latent's (qz), both with the saved FP8 input; an input gradient that adds goes through
 * ws.fp8's act part (q_a's) or ws.dx_a (kv_a's, whose output gradient the act part holds). */
static void down_bwd_fp8(const ExecLayerRun *r, const Mla *m, const ExecLayerActs *a, int l,
                         const void *z, const void *krope, const void *qz)
{
    const ExecCtx *c = r->c;
    ExecFp8 *F = r->fp8;
    const ExecLayerGrads *g = &r->P->lg[l];
    const ExecFp8Ref xq = exec_fp8_saved(F, EXEC_LA(a, QKV_IN), m->R, m->h);
    if (z) {
        cols_copy(r, F->act, m->kva, z, m->kr, m->R, m->kr, 0);
        cols_copy(r, AT(F->act, m->kr), m->kva, krope, m->rope, m->R, m->rope, 0);
        void *dx = m->qr > 0 ? r->W->dhid : r->W->dx_a;
        exec_fp8_linear_bwd(F, c, r->M, dx, EXEC_LPA(g, KV_A_W), F->act, xq, NULL, m->fkva, 0,
                            m->R);
        if (m->qr == 0)
            c->k->add_inplace(r->W->dhid, dx, (size_t)m->R * m->h);
        return;
    }
    exec_fp8_linear_bwd(F, c, r->M, F->act, EXEC_LPA(g, Q_A_W), qz, xq, NULL, m->fqa, 0, m->R);
    c->k->add_inplace(r->W->dhid, F->act, (size_t)m->R * m->h);
}

int exec_mla_backward(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                      const void **dn, PxError *err)
{
    const ExecCtx *c = r->c;
    const Mla m = mla_dims(r, l);
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    const ExecQkv dq = exec_qkv_at(c, r->W->dqkv, 0);
    const void *x = EXEC_LA(a, QKV_IN);
    /* the rank's block of the saved latents: its shard's rows with SP */
    const int bk = m.sp ? c->g.tp_rank : 0;

    int op = op_open(r, l, MODEL_OPR_KV_B, MODEL_BWD);
    kv_b_bwd(r, &m, l, a, &dq);
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_Q_B, MODEL_BWD);
    void *qs;
    TRY(q_b_bwd(r, &m, chunk, l, a, &dq, &qs, err));
    op_close(r, op);

    /* the keys' and values' latent gradient reduced: a block [R x kv_lora | R x rope] */
    op = op_open(r, l, MODEL_OPR_KV_A, MODEL_BWD);
    void *dkv = AT(r->W->mla, m.mw.dkv), *ks = dkv;
    if (m.sp) {
        ks = AT(r->W->mla, m.mw.ks);
        TRY(exec_tp_reduce_scatter(r, MODEL_OPR_KV_A, l, chunk, MODEL_BWD, ks, dkv,
                                   (size_t)m.R * m.kva, err));
    } else {
        TRY(exec_tp_allreduce(r, MODEL_OPR_KV_A, l, chunk, MODEL_BWD, dkv, (size_t)m.N * m.kva,
                              err));
    }
    const void *kv_in = AT(EXEC_LAA(a, KV_LAT), (size_t)bk * m.R * m.kva);
    const void *wkv = EXEC_LPA(w, KV_A_W);
    float *gkv = EXEC_LPA(g, KV_A_W);
    const void *z = down_norm_bwd(r, &m, ks, kv_in, EXEC_LPA(w, KV_NORM_W),
                                  EXEC_LPA(g, KV_NORM_W), m.kr);
    const void *krope = AT(ks, (size_t)m.R * m.kr);
    if (m.fkva) {
        down_bwd_fp8(r, &m, a, l, z, krope, NULL);
    } else {
        /* with q_lora_rank 0 ws.dhid holds the queries' input gradient already */
        down_bwd(r, &m, x, z, wkv, gkv, m.kr, m.qr > 0 ? 0.0f : 1.0f);
        down_bwd(r, &m, x, krope, AT(wkv, (size_t)m.kr * m.h),
                 EXEC_AT(gkv, (size_t)m.kr * m.h, c->gb), m.rope, 1.0f);
    }
    op_close(r, op);

    if (m.qr > 0) {
        op = op_open(r, l, MODEL_OPR_Q_A, MODEL_BWD);
        z = down_norm_bwd(r, &m, qs, AT(EXEC_LAA(a, Q_LAT), (size_t)bk * m.R * m.qr),
                          EXEC_LPA(w, Q_NORM_W), EXEC_LPA(g, Q_NORM_W), m.qr);
        if (m.fqa)
            down_bwd_fp8(r, &m, a, l, NULL, NULL, z);
        else
            down_bwd(r, &m, x, z, EXEC_LPA(w, Q_A_W), EXEC_LPA(g, Q_A_W), m.qr, 1.0f);
        op_close(r, op);
    }
    *dn = r->W->dhid;
    return PX_OK;
}

/* Under FP8 GEMMs, the rerun of the layer's first matmul of its normed input x (kv_a with a
 * query latent, q_b without one): x quantized again into attn.qkv.in's FP8 copy, which the
 * down-projections' (and without a query latent q_b's) backward read, with q_a's scaling (or
 * without a query latent kv_a's) as down_fwd's, recording nothing; the GEMM's operand: that copy, or under SP the gathered rows
 * of ws.sp_gather quantized into ws.fp8's first copy. */
static ExecFp8Ref sac_fp8_x(const ExecLayerRun *r, const Mla *m, const ExecLayerActs *a,
                            const void *x, const ExecFp8Weight *w, int gathered)
{
    ExecFp8 *F = r->fp8;
    ExecFp8Ref xq = exec_fp8_quantize(F, r->c, EXEC_LA(a, QKV_IN), x, m->R, m->h, 0, EXEC_FP8_X,
                                      m->fqa ? m->fqa : m->fkva, 0, 0);
    if (gathered && m->sp)
        xq = exec_fp8_quantize(F, r->c, F->q0, r->W->sp_gather, m->N, m->h, 0, EXEC_FP8_X, w, 0,
                               0);
    return xq;
}

void exec_mla_sac_recompute(const ExecLayerRun *r, int l, const ExecLayerActs *a)
{
    const ExecCtx *c = r->c;
    const Mla m = mla_dims(r, l);
    const ExecLayerParams *w = &r->P->lw[l];
    void *W = r->W->mla, *lat = AT(W, m.mw.lat);
    const ExecQkv dq = exec_qkv_at(c, r->W->dqkv, 0);
    /* the first norm's output, rerun (ws.fp8's act part under FP8, as the forward's) */
    const void *x = m.fkva ? r->fp8->act : EXEC_LA(a, QKV_IN);
    int op;
    if (m.qr > 0) { /* q_a is the layer's first matmul: its latent's norm only */
        op = op_open(r, l, MODEL_OPR_Q_A, MODEL_RECOMPUTE);
        c->k->rmsnorm_fwd(lat, EXEC_LAA(a, Q_LAT), EXEC_LPA(w, Q_NORM_W), m.N, m.qr, m.eps);
        op_close(r, op);
    }
    /* kv_a on this rank's rows where the forward wrote them: attn.kv_lat, which the table
     * then does not save (model_mla_acts: in ws.recompute), or under SP ws.mla's ks, the
     * backward's scratch (no gather: the gathered latent is saved); under FP8 through ws.mla's
     * dkv as down_fwd, the same GEMM of the same operands */
    op = op_open(r, l, MODEL_OPR_KV_A, MODEL_RECOMPUTE);
    if (model_sac_op_matmuls(&c->spec, &c->d, l, MODEL_OPR_KV_A)) {
        void *ks = m.sp ? AT(W, m.mw.ks) : EXEC_LAA(a, KV_LAT);
        if (m.fkva) {
            void *y = AT(W, m.mw.dkv);
            exec_fp8_linear_fwd(r->fp8, c, r->M, y, sac_fp8_x(r, &m, a, x, m.fkva, 0), m.fkva, 0,
                                m.R, 0);
            cols_copy(r, ks, m.kr, y, m.kva, m.R, m.kr, 0);
            cols_copy(r, AT(ks, (size_t)m.R * m.kr), m.rope, AT(y, m.kr), m.kva, m.R, m.rope, 0);
        } else {
            mm(r, ks, x, EXEC_LPA(w, KV_A_W), m.R, m.kr, m.h, 0, 1, 0.0f);
            mm(r, AT(ks, (size_t)m.R * m.kr), x, AT(EXEC_LPA(w, KV_A_W), (size_t)m.kr * m.h),
               m.R, m.rope, m.h, 0, 1, 0.0f);
        }
    }
    kv_norm_all(r, &m, lat, EXEC_LAA(a, KV_LAT), EXEC_LPA(w, KV_NORM_W));
    op_close(r, op);
    /* q_b without a query latent, into ws.dqkv's Q plane: under SP from sp.gather, the rows
     * the backward gathers again (as the dense layer's rerun wk) */
    if (model_sac_op_matmuls(&c->spec, &c->d, l, MODEL_OPR_Q_B)) {
        op = op_open(r, l, MODEL_OPR_Q_B, MODEL_RECOMPUTE);
        if (m.fqb)
            exec_fp8_linear_fwd(r->fp8, c, r->M, dq.q, sac_fp8_x(r, &m, a, x, m.fqb, 1), m.fqb, 0,
                                m.N, 0);
        else
            mm(r, dq.q, m.sp ? r->W->sp_gather : x, EXEC_LPA(w, Q_B_W), m.N, m.H * m.qk, m.h, 0,
               1, 0.0f);
        op_close(r, op);
    }
    /* kv_b's keys and values from the normed latent, one GEMM into ws.dqkv, and the rotary
     * embedding of ws.dqkv's planes with the saved latent's key */
    op = op_open(r, l, MODEL_OPR_KV_B, MODEL_RECOMPUTE);
    if (model_sac_op_matmuls(&c->spec, &c->d, l, MODEL_OPR_KV_B)) {
        if (m.fkvb)
            fp8_fwd(r, r->W->dqkv, lat, m.fkvb, m.N, MODEL_RECOMPUTE);
        else
            mm(r, r->W->dqkv, lat, EXEC_LPA(w, KV_B_W), m.N, m.H * (m.nope + m.v), m.kr, 0, 1,
               0.0f);
    }
    rope_parts(r, &m, dq.q, dq.k, EXEC_LAA(a, KV_LAT), 0);
    op_close(r, op);
}
