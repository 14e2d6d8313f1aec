/* Context parallelism (docs/executor.md, "Parallel layouts"): the split of each sequence over
 * the cp ranks, and the attention core's communication with the other cp ranks, each
 * collective or message timed under its own op of the graph within the core's op that the
 * caller has open (exec_meter_open nests it).
 *
 * The split (Megatron-LM's load balancing): a sequence is cut into 2 cp chunks and cp rank i
 * holds chunks i and 2 cp - 1 - i, its parts 0 and 1, embedded, rotated and scored at their
 * global positions. Only the attention core talks to the other cp ranks: K and V all-gathered
 * (allgather, whose core is the layers' own over the gathered keys), passed around a ring with
 * the partial results merged by their log-sum-exp (p2p), or Q, K, V and the output moved
 * between the sequence and a head split (a2a, Ulysses). Multi-head latent attention's heads are
 * two widths, queries and keys qk_hd, values and the output v_hd: every core here takes both
 * (ordinary attention's are equal), and reads and writes Q, K, V through exec_qkv_at's views
 * (mla.c's planes, or the packed rows). */
#include <math.h>
#include <string.h>

#include "exec/train/internal.h"

/* element i of an act-dtype tensor (c in scope) */
#define AT(p, i) EXEC_AT(p, i, c->ab)

/* A token's keys per TP rank, kv_loc heads of qk_hd: where its values start in the gathered
 * and the ring's rows of [K | V] (kv2_loc wide) */
static int kv_k_width(const ExecCtx *c) { return c->d.kv_loc * c->d.qk_hd; }

/* The FLOPs of the core's forward for `heads` heads, s_q queries against s_k keys: as the op
 * graph counts them, the mean of the two head widths (model/ops.c) */
static double core_fwd_flops(const ExecCtx *c, double heads, int s_q, int s_k)
{
    return model_attention_fwd_flops(&c->spec, heads, s_q, s_k, 0.5 * (c->d.qk_hd + c->d.v_hd));
}

/* ---- the split ---- */

int exec_cp_parts(const ExecCtx *c) { return c->d.c > 1 ? 2 : 1; }

int exec_cp_part_len(const ExecCtx *c) { return c->d.s_loc / exec_cp_parts(c); }

int exec_cp_part_pos(const ExecCtx *c, int cp_rank, int j)
{
    return exec_cp_part_len(c) * (j == 0 ? cp_rank : 2 * c->d.c - 1 - cp_rank);
}

int exec_cp_tok_row(const ExecCtx *c) { return c->d.s_loc + exec_cp_parts(c); }

void exec_cp_pick_rows(const ExecCtx *c, int32_t *dst, const int32_t *src, int rows)
{
    const int row = exec_cp_tok_row(c), C = exec_cp_part_len(c);
    for (int n = 0; n < rows; n++)
        for (int j = 0; j < 2; j++)
            memcpy(dst + (size_t)n * row + (size_t)j * (C + 1),
                   src + (size_t)n * (c->d.s + 1) + exec_cp_part_pos(c, c->g.cp_rank, j),
                   (size_t)(C + 1) * sizeof(int32_t));
}

void exec_cp_part_keys(const ExecCtx *c, int j, int *q_offset, int *tk)
{
    *q_offset = exec_cp_part_pos(c, c->g.cp_rank, j);
    *tk = *q_offset + exec_cp_part_len(c);
}

int exec_cp_owns_core(const ExecCtx *c)
{
    return c->d.c > 1 && c->spec.layout.cp_comm != MODEL_CP_COMM_ALLGATHER;
}

int exec_cp_quantizes_out(const ExecCtx *c)
{
    return c->d.c > 1 && c->spec.layout.cp_comm == MODEL_CP_COMM_A2A &&
           model_fp8_attn_out(&c->spec);
}

/* The output the fused core's backward reads: attn.proj.in, or under delayed FP8 attention
 * (its FP8 copy there) the values decoded from it into ws.fp8's act part */
static const void *core_saved_out(const ExecLayerRun *r, const ExecLayerActs *a)
{
    const void *o = exec_fp8_core_out(r);
    return o ? o : EXEC_LA(a, PROJ_IN);
}

/* One collective over the cp group under its op (role, layer l, chunk, phase): an all-gather of
 * every rank's n elements of send into recv, a reduce-scatter of recv in place (this rank's n
 * of the sum at its start), or an all-to-all of send into recv, cnt elements with each rank. */
static int collective_dt(const ExecLayerRun *r, ModelOpRole role, int l, int chunk, ModelPhase ph,
                         ModelComm kind, void *recv, const void *send, size_t n,
                         const int64_t *cnt, PxDtype dt, PxError *err)
{
    const ExecCtx *c = r->c;
    const int op = exec_meter_comm_op(r->M, c, role, l, chunk, ph, kind, err);
    if (op < 0)
        return PX_ERUNTIME;
    int rc;
    exec_meter_open(r->M, c->k, op);
    if (kind == MODEL_CP_ALL_GATHER)
        rc = comm_all_gather(c->comm, recv, send, n, dt, kind, NULL, err);
    else if (kind == MODEL_CP_REDUCE_SCATTER)
        rc = comm_reduce_scatter(c->comm, recv, recv, n, dt, kind, NULL, err);
    else
        rc = comm_all_to_allv(c->comm, recv, cnt, send, cnt, dt, kind, err);
    exec_meter_close(r->M, c->k, op);
    return rc;
}

/* The same in the act dtype. */
static int collective(const ExecLayerRun *r, ModelOpRole role, int l, int chunk, ModelPhase ph,
                      ModelComm kind, void *recv, const void *send, size_t n, const int64_t *cnt,
                      PxError *err)
{
    return collective_dt(r, role, l, chunk, ph, kind, recv, send, n, cnt, r->c->act, err);
}

/* ---- allgather ---- */

/* Multi-head latent attention's keys and values (the planes of mla.c) to or from rows of
 * [K | V] (heads x qk_hd, then heads x v_hd) as the gather packs them: back 0 packs planes'
 * rows into `rows`, 1 unpacks `rows` into the planes (ws.dqkv's). */
static void mla_kv_rows(const ExecCtx *c, void *rows, void *planes, int back)
{
    const ModelDims *d = &c->d;
    const ExecQkv x = exec_qkv_at(c, planes, 0);
    const int kw = d->kv_loc * d->qk_hd, vw = d->kv_loc * d->v_hd;
    const int kv2 = d->kv2_loc, n = d->b * d->s_loc;
    void *rv = EXEC_AT(rows, kw, c->ab);
    if (back) {
        c->k->copy_cols(x.k, x.k_stride, rows, kv2, n, kw, 0);
        c->k->copy_cols(x.v, x.v_stride, rv, kv2, n, vw, 0);
    } else {
        c->k->copy_cols(rows, kv2, x.k, x.k_stride, n, kw, 0);
        c->k->copy_cols(rv, kv2, x.v, x.v_stride, n, vw, 0);
    }
}

/* FP8 attention's K | V codes of this rank's rows (the saved copy in attn.qkv.out, codes then
 * its factor) into dst's rows of kv2: the packed rows' K, V columns, or with multi-head latent
 * attention (whose copy holds the planes of mla.c, one per-tensor scale over all three) each
 * row's K then V from their planes, as mla_kv_rows packs the act values; rows `stride` apart. */
static void kv_codes(const ExecCtx *c, uint8_t *dst, size_t stride, const uint8_t *codes)
{
    const ModelDims *d = &c->d;
    const size_t N = (size_t)d->b * d->s_loc, kv2 = (size_t)d->kv2_loc;
    const size_t kw = (size_t)kv_k_width(c), vw = kv2 - kw, qw = (size_t)d->q_loc;
    for (size_t n = 0; n < N; n++)
        if (exec_mla_on(c)) {
            c->k->copy(dst + n * stride, codes + N * qw + n * kw, kw);
            c->k->copy(dst + n * stride + kw, codes + N * (qw + kw) + n * vw, vw);
        } else
            c->k->copy(dst + n * stride, codes + n * (qw + kv2) + qw, kv2);
}

/* FP8 attention with the all-gather (the fused core, model_fp8_attn_qkv): K and V travel as
 * the one-byte codes of attn.qkv.out, as Transformer Engine's AttnFuncWithCPAndKVAllGather
 * gathers the FP8 data of K and V (context_parallel.py, forward and again in the backward).
 * Each rank's block is its b x s_loc rows of [K | V] codes followed by the decode factor it
 * quantized them with (4 bytes: parallax's ranks keep their own scales, where TE's share one
 * through the amax reduction group: docs/fp8.md), and each block is decoded with its own
 * factor into cp.dkv (free until the backward's core), rank-major, for the caller's reorder.
 * Returns the decoded blocks. */
static void *gather_kv_fp8(const ExecLayerRun *r, const ExecLayerActs *a, int l, int chunk,
                           ModelPhase ph, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + d->kv2_loc, kv2 = d->kv2_loc, N = d->b * d->s_loc;
    const ExecFp8Ref own = exec_fp8_saved(r->fp8, EXEC_LA(a, QKV_OUT), N, qkv);
    const size_t count = (size_t)N * kv2, sb = kern_fp8_bytes(&own.f) - (size_t)N * qkv;
    const size_t blk = count + sb;
    uint8_t *all = r->W->cp_kv, *mine = all + (size_t)c->g.cp_rank * blk;
    kv_codes(c, mine, (size_t)kv2, own.q);
    c->k->copy(mine + count, (const uint8_t *)own.q + (size_t)N * qkv, sb);
    if (collective_dt(r, MODEL_OPR_CORE, l, chunk, ph, MODEL_CP_ALL_GATHER, all, mine, blk, NULL,
                      PX_FP8, err))
        return NULL;
    KernFp8 f = own.f;
    f.cols = f.block_c = kv2;
    for (int src = 0; src < d->c; src++)
        c->k->fp8_dequantize(AT(r->W->cp_dkv, (size_t)src * count), all + (size_t)src * blk, &f);
    return r->W->cp_dkv;
}

int exec_cp_gather_kv(const ExecLayerRun *r, const ExecLayerActs *a, int l, int chunk,
                      ModelPhase ph, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int b = d->b, sl = d->s_loc, qkv = d->q_loc + d->kv2_loc;
    const int kv2 = d->kv2_loc, C = exec_cp_part_len(c);
    const size_t row = (size_t)kv2 * c->ab, count = (size_t)b * sl * kv2;
    const void *blocks = r->W->cp_kv;
    if (model_fp8_attn_codes(&c->spec)) { /* MXFP8 (model_fp8_attn_cp16): the act dtype */
        if (!(blocks = gather_kv_fp8(r, a, l, chunk, ph, err)))
            return PX_ERUNTIME;
    } else {
        void *mine = AT(r->W->cp_kv, (size_t)c->g.cp_rank * count);
        if (exec_mla_on(c))
            mla_kv_rows(c, mine, EXEC_LA(a, QKV_OUT), 0);
        else
            for (size_t n = 0; n < (size_t)b * sl; n++)
                c->k->copy(AT(mine, n * kv2), AT(EXEC_LA(a, QKV_OUT), n * qkv + d->q_loc), row);
        int rc = collective(r, MODEL_OPR_CORE, l, chunk, ph, MODEL_CP_ALL_GATHER, r->W->cp_kv,
                            mine, count, NULL, err);
        if (rc)
            return rc;
    }
    for (int src = 0; src < d->c; src++)
        for (int q = 0; q < b; q++)
            for (int j = 0; j < 2; j++)
                c->k->copy(AT(r->W->cp_kv_full, ((size_t)q * d->s + exec_cp_part_pos(c, src, j)) * kv2),
                           AT(blocks, (size_t)src * count + ((size_t)q * sl + (size_t)j * C) * kv2),
                           (size_t)C * row);
    return PX_OK;
}

int exec_cp_scatter_dkv(const ExecLayerRun *r, int l, int chunk, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int b = d->b, sl = d->s_loc, qkv = d->q_loc + d->kv2_loc;
    const int kv2 = d->kv2_loc, C = exec_cp_part_len(c);
    const size_t row = (size_t)kv2 * c->ab, count = (size_t)b * sl * kv2;
    for (int dst = 0; dst < d->c; dst++)
        for (int q = 0; q < b; q++)
            for (int j = 0; j < 2; j++)
                c->k->copy(AT(r->W->cp_kv, (size_t)dst * count + ((size_t)q * sl + (size_t)j * C) * kv2),
                           AT(r->W->cp_dkv, ((size_t)q * d->s + exec_cp_part_pos(c, dst, j)) * kv2),
                           (size_t)C * row);
    int rc = collective(r, MODEL_OPR_CORE, l, chunk, MODEL_BWD, MODEL_CP_REDUCE_SCATTER,
                        r->W->cp_kv, NULL, count, NULL, err);
    if (rc)
        return rc;
    if (exec_mla_on(c))
        mla_kv_rows(c, r->W->cp_kv, r->W->dqkv, 1);
    else
        for (size_t n = 0; n < (size_t)b * sl; n++)
            c->k->copy(AT(r->W->dqkv, n * qkv + d->q_loc), AT(r->W->cp_kv, n * kv2), row);
    return PX_OK;
}

/* ---- a2a: Ulysses ---- */

/* Ulysses (Jacobs et al. 2023), cp_comm a2a: rank r of the cp group attends with heads
 * r H/cp ... and KV groups r KV/cp ... of this TP rank's over the whole sequence. A rank's
 * head-split rows are W = wq + wk + wv wide (its Q heads, K heads, V heads: (H + 2 KV)/cp x hd
 * for ordinary attention), held in global token order: attn.qkv.out takes them in place of its
 * own (the same size). */
typedef struct {
    int wq, wk, wv, W; /* a rank's Q, K, V and row widths in the head split */
    int wo;            /* its output's: its heads x v_hd */
    size_t rows;       /* this rank's token rows: b x s_loc */
    int64_t each;      /* elements to and from each rank of the group (a2a_width) */
} CpA2a;

static void a2a_dims(const ExecCtx *c, CpA2a *x)
{
    const ModelDims *d = &c->d;
    const int Hc = d->heads_loc / d->c, KVc = d->kv_loc / d->c;
    x->wq = Hc * d->qk_hd;
    x->wk = KVc * d->qk_hd;
    x->wv = KVc * d->v_hd;
    x->W = x->wq + x->wk + x->wv;
    x->wo = Hc * d->v_hd;
    x->rows = (size_t)d->b * d->s_loc;
}

/* every rank sends every other this rank's rows, `width` wide */
static void a2a_width(CpA2a *x, int width) { x->each = (int64_t)(x->rows * (size_t)width); }

/* Moves the rows of part j of sequence q of rank `rank` (C rows, `width` wide) between the
 * packed buffer `pk` (rank-major: each rank's b x s_loc local rows) and the global-order
 * buffer `gl`; to_global says which way. */
static void a2a_move(const ExecCtx *c, void *pk, void *gl, int width, int to_global)
{
    const ModelDims *d = &c->d;
    const int C = exec_cp_part_len(c);
    const size_t rows = (size_t)d->b * d->s_loc, bytes = (size_t)C * width * c->ab;
    for (int rk = 0; rk < d->c; rk++)
        for (int q = 0; q < d->b; q++)
            for (int j = 0; j < 2; j++) {
                void *p = AT(pk, (rk * rows + (size_t)q * d->s_loc + (size_t)j * C) * width);
                void *g = AT(gl, ((size_t)q * d->s + exec_cp_part_pos(c, rk, j)) * width);
                c->k->copy(to_global ? g : p, to_global ? p : g, bytes);
            }
}

/* Between this rank's rows of Q, K, V (the views v: attn.qkv.out's or ws.dqkv's) and the
 * rank-major rows of the head split (pk, W wide): each row's heads of rank rk of the group.
 * to_split says which way. */
static void a2a_pack(const ExecCtx *c, const CpA2a *x, const ExecQkv *v, void *pk, int to_split)
{
    for (int rk = 0; rk < c->d.c; rk++)
        for (size_t n = 0; n < x->rows; n++) {
            void *o = AT(pk, (rk * x->rows + n) * x->W);
            void *q = AT(v->q, n * v->q_stride + (size_t)rk * x->wq);
            void *k = AT(v->k, n * v->k_stride + (size_t)rk * x->wk);
            void *vv = AT(v->v, n * v->v_stride + (size_t)rk * x->wv);
            c->k->copy(to_split ? o : q, to_split ? q : o, (size_t)x->wq * c->ab);
            c->k->copy(to_split ? AT(o, x->wq) : k, to_split ? k : AT(o, x->wq),
                       (size_t)x->wk * c->ab);
            c->k->copy(to_split ? AT(o, x->wq + x->wk) : vv, to_split ? vv : AT(o, x->wq + x->wk),
                       (size_t)x->wv * c->ab);
        }
}

/* One all-to-all of send into cp.a2a_recv: the pass's first (occurrence 0) or second. The
 * graph lists Q, K, V's under the core and the output's under the projection (forward: Q, K, V
 * then the output; backward: the output's gradient, with the fused core the output too, then
 * Q's, K's and V's). */
static int a2a_call(const ExecLayerRun *r, int l, int chunk, ModelPhase ph, int occurrence,
                    const CpA2a *x, const void *send, PxError *err)
{
    const int out = (occurrence == 1) != (ph == MODEL_BWD);
    for (int i = 0; i < r->c->d.c; i++) /* cp counts (ExecWork.cp_cnt, sized at init) */
        r->W->cp_cnt[i] = x->each;
    return collective(r, out ? MODEL_OPR_PROJ : MODEL_OPR_CORE, l, chunk, ph, MODEL_CP_ALL_TO_ALL,
                      r->W->cp_recv, send, 0, r->W->cp_cnt, err);
}

/* ---- a2a with FP8 attention ---- */

/* FP8 attention over Ulysses (the fused core, current scaling), as Transformer Engine's
 * AttnFuncWithCPAndQKVOA2A: Q, K, V and the output gradient are quantized in the sequence
 * split and their one-byte codes cross the all-to-all, the output and the Q, K, V gradients
 * travel in the act dtype (context_parallel.py; docs/fp8.md). A rank's block for each peer is
 * the peer's columns of its rows' codes followed by the decode factor it quantized them with
 * (parallax's ranks keep their own scales), so the blocks a rank receives decode each with its
 * sender's factor. The head-split Q, K, V the fused core saves are those received blocks, in
 * attn.qkv.out (cp - 1 factors more than one rank's copy: the table counts them). */
typedef struct {
    int n;         /* column segments per peer: 3 (Q, K, V) or 1 (the output gradient) */
    int off[3];    /* where peer 0's segment starts in a codes row */
    int width[3];  /* a peer's segment; peer rk's starts at off + rk x width */
    int W;         /* a peer's row: the widths' sum */
} A2aSegs;

static int fp8_on(const ExecCtx *c) { return model_fp8_attn_codes(&c->spec); }

/* The FP8 weight whose amax holds FP8 attention's histories (model_fp8_attn_weight: QKV's, or
 * multi-head latent attention's kv_b) */
static const ExecFp8Weight *attn_weight(const ExecLayerRun *r, int l)
{
    return exec_fp8_weight(r->fp8, model_fp8_attn_weight(&r->c->spec), l);
}

/* Where Ulysses' core reads the head-split Q, K, V: attn.qkv.out, or with FP8 attention
 * ws.fp8's act part, decoded there from the received blocks (the ring's Q too: decoded there
 * from this rank's codes, or under MXFP8 quantized there by layers.c's fp8_core_cp16). */
static void *a2a_heads(const ExecLayerRun *r, const ExecLayerActs *a)
{
    return model_fp8_attn_qkv(&r->c->spec) ? r->fp8->act : EXEC_LA(a, QKV_OUT);
}

/* Where Ulysses' core reads the column-wise copies under MXFP8 attention (model_fp8_attn_cp16):
 * Q, K, V's (dout 0) after the row-wise ones in ws.fp8's act part, then dO's (dout 1), each in
 * the head split's layout; NULL otherwise. */
static void *a2a_mx_col(const ExecLayerRun *r, int dout)
{
    const ExecCtx *c = r->c;
    const size_t N = (size_t)c->d.b * c->d.s_loc, qkv = (size_t)(c->d.q_loc + c->d.kv2_loc);
    return model_fp8_attn_cp16(&c->spec) ? AT(r->fp8->act, N * qkv * (dout ? 2 : 1)) : NULL;
}

/* The received blocks (recv, x->rows x sg->W codes and a factor of sb bytes each) decoded with
 * their senders' factors into stage (act, rank-major) and moved into dst in global order. */
static void a2a_fp8_decode(const ExecLayerRun *r, const CpA2a *x, const A2aSegs *sg,
                           const void *recv, size_t sb, KernFp8 f, void *stage, void *dst)
{
    const ExecCtx *c = r->c;
    const size_t blk = x->rows * (size_t)sg->W + sb;
    f.rows = f.block_r = (int)x->rows;
    f.cols = f.block_c = sg->W;
    for (int rk = 0; rk < c->d.c; rk++)
        c->k->fp8_dequantize(AT(stage, rk * x->rows * (size_t)sg->W),
                             (const uint8_t *)recv + (size_t)rk * blk, &f);
    a2a_move(c, stage, dst, sg->W, 1);
}

/* A quantized tensor of this rank's rows (q: x->rows x cols codes, then its factor) to the
 * head split: each peer's block packed into send, the all-to-all (its op as a2a_call's) into
 * recv, then decoded into dst through stage. */
static int a2a_fp8(const ExecLayerRun *r, const CpA2a *x, const A2aSegs *sg, int l, int chunk,
                   ModelPhase ph, int occurrence, ExecFp8Ref q, int cols, uint8_t *send,
                   void *recv, void *stage, void *dst, PxError *err)
{
    const ExecCtx *c = r->c;
    const size_t rows = x->rows, sb = kern_fp8_bytes(&q.f) - rows * (size_t)cols;
    const size_t blk = rows * (size_t)sg->W + sb;
    const uint8_t *codes = q.q;
    int64_t *cnt = r->W->cp_cnt;
    for (int rk = 0; rk < c->d.c; rk++) {
        uint8_t *o = send + (size_t)rk * blk;
        for (size_t n = 0; n < rows; n++)
            for (int i = 0, at = 0; i < sg->n; at += sg->width[i], i++)
                c->k->copy(o + n * sg->W + at,
                           codes + n * cols + sg->off[i] + (size_t)rk * sg->width[i],
                           (size_t)sg->width[i]);
        c->k->copy(o + rows * sg->W, codes + rows * cols, sb);
        cnt[rk] = (int64_t)blk;
    }
    const int out = (occurrence == 1) != (ph == MODEL_BWD);
    int rc = collective_dt(r, out ? MODEL_OPR_PROJ : MODEL_OPR_CORE, l, chunk, ph,
                           MODEL_CP_ALL_TO_ALL, recv, send, 0, cnt, PX_FP8, err);
    if (!rc)
        a2a_fp8_decode(r, x, sg, recv, sb, q.f, stage, dst);
    return rc;
}

/* Delayed scaling's head-split tensors (model_fp8_attn_out: the output forward, the Q, K, V
 * gradients backward), as Transformer Engine's AttnFuncWithCPAndQKVOA2A moves the codes its O
 * and dQKV quantizers wrote: q holds cp blocks of `count` codes, rank-major (peer rk's rows of
 * this rank's heads), then the factor of this rank's history they were quantized with. Block
 * rk goes to rank rk with the factor (the all-to-all, its op as a2a_call's; send and recv hold
 * cp blocks of count + 4 bytes), and each block received is decoded with its sender's factor
 * into stage (act, rank-major, count each). */
static int a2a_blocks_fp8(const ExecLayerRun *r, int l, int chunk, ModelPhase ph, int occurrence,
                          ExecFp8Ref q, size_t count, uint8_t *send, uint8_t *recv, void *stage,
                          PxError *err)
{
    const ExecCtx *c = r->c;
    const int cp = c->d.c;
    const size_t sb = kern_fp8_bytes(&q.f) - (size_t)cp * count, blk = count + sb;
    int64_t *cnt = r->W->cp_cnt;
    for (int rk = 0; rk < cp; rk++) {
        c->k->copy(send + (size_t)rk * blk, (const uint8_t *)q.q + (size_t)rk * count, count);
        c->k->copy(send + (size_t)rk * blk + count, (const uint8_t *)q.q + (size_t)cp * count, sb);
        cnt[rk] = (int64_t)blk;
    }
    const int out = (occurrence == 1) != (ph == MODEL_BWD);
    int rc = collective_dt(r, out ? MODEL_OPR_PROJ : MODEL_OPR_CORE, l, chunk, ph,
                           MODEL_CP_ALL_TO_ALL, recv, send, 0, cnt, PX_FP8, err);
    if (rc)
        return rc;
    KernFp8 f = q.f;
    f.rows = f.block_r = q.f.rows / cp;
    for (int rk = 0; rk < cp; rk++)
        c->k->fp8_dequantize(AT(stage, (size_t)rk * count), recv + (size_t)rk * blk, &f);
    return PX_OK;
}

/* The output's blocks received over the all-to-all (recv: rank-major, each x->rows rows of
 * x->wo, the heads of that rank) into this rank's rows of out, every head (o_loc wide). */
static void a2a_unsplit_out(const ExecCtx *c, const CpA2a *x, void *recv, void *out)
{
    for (int rk = 0; rk < c->d.c; rk++)
        for (size_t n = 0; n < x->rows; n++)
            c->k->copy(AT(out, n * c->d.o_loc + (size_t)rk * x->wo),
                       AT(recv, (rk * x->rows + n) * x->wo), (size_t)x->wo * c->ab);
}

/* The forward's output under delayed scaling: the head-split output (cp.a2a_recv, global
 * order) made rank-major and quantized with this rank's output history (rec: a forward
 * records its amax) into attn.proj.in, the copy the backward reads (TE saves its head-split
 * FP8 output), its blocks sent in their codes and the received ones decoded into this rank's
 * rows of out, every head. */
static int a2a_out_fp8(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int chunk, int l,
                       ModelPhase ph, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    CpA2a x;
    a2a_dims(c, &x);
    a2a_move(c, r->W->cp_send, r->W->cp_recv, x.wo, 0);
    const ExecFp8Ref q = exec_fp8_core_quantize(r->fp8, c, EXEC_LA(a, PROJ_IN), r->W->cp_send,
                                                d->c * (int)x.rows, x.wo, EXEC_FP8_CORE_O,
                                                attn_weight(r, l), ph == MODEL_FWD);
    int rc = a2a_blocks_fp8(r, l, chunk, ph, 1, q, x.rows * (size_t)x.wo, r->W->cp_recv,
                            r->W->cp_send, r->W->cp_recv, err);
    if (rc)
        return rc;
    a2a_unsplit_out(c, &x, r->W->cp_recv, out);
    return PX_OK;
}

/* The backward's saved output under delayed scaling: attn.proj.in's head-split codes decoded
 * (through cp.a2a_recv) into ws.dhid in global order, where the core's backward reads it; no
 * output crosses the group. */
static void a2a_saved_out_fp8(const ExecLayerRun *r, const ExecLayerActs *a, const CpA2a *x)
{
    const ExecCtx *c = r->c;
    const ExecFp8Ref q = exec_fp8_saved(r->fp8, EXEC_LA(a, PROJ_IN), c->d.c * (int)x->rows, x->wo);
    c->k->fp8_dequantize(r->W->cp_recv, q.q, &q.f);
    a2a_move(c, r->W->cp_recv, r->W->dhid, x->wo, 1);
}

/* The backward's Q, K, V gradients under delayed scaling: rank-major in cp.a2a_send (W wide),
 * quantized with this rank's dQKV history into ws.fp8's first copy, their blocks sent in their
 * codes and the received ones decoded into cp.a2a_recv, rank-major, for a2a_pack. */
static int a2a_dqkv_fp8(const ExecLayerRun *r, const CpA2a *x, int chunk, int l, PxError *err)
{
    const ExecCtx *c = r->c;
    const ExecFp8Ref q = exec_fp8_core_quantize(r->fp8, c, r->fp8->q0, r->W->cp_send,
                                                c->d.c * (int)x->rows, x->W, EXEC_FP8_CORE_DQKV,
                                                attn_weight(r, l), 1);
    return a2a_blocks_fp8(r, l, chunk, MODEL_BWD, 1, q, x->rows * (size_t)x->W, r->W->cp_recv,
                          r->W->cp_send, r->W->cp_recv, err);
}

/* Q, K, V's segments of a codes row of the packed layout [Q | K | V] */
static A2aSegs qkv_segs(const ExecCtx *c, const CpA2a *x)
{
    const ModelDims *d = &c->d;
    return (A2aSegs){3, {0, d->q_loc, d->q_loc + d->kv_loc * d->qk_hd}, {x->wq, x->wk, x->wv}, x->W};
}

/* Multi-head latent attention's saved copy (q: its three planes' codes, then the factor) as
 * packed rows [Q | K | V] of codes and the factor after them, in cp.a2a_recv (b·s_loc rows of
 * q + 2 kv act elements, room for both; free until the all-to-all lands there): the layout
 * a2a_fp8 cuts into the peers' blocks. */
static const void *mla_packed_codes(const ExecLayerRun *r, ExecFp8Ref q)
{
    const ExecCtx *c = r->c;
    const size_t N = (size_t)c->d.b * c->d.s_loc, qw = (size_t)c->d.q_loc;
    const size_t qkv = qw + (size_t)c->d.kv2_loc;
    const uint8_t *codes = q.q;
    uint8_t *pk = r->W->cp_recv;
    for (size_t n = 0; n < N; n++)
        c->k->copy(pk + n * qkv, codes + n * qw, qw);
    kv_codes(c, pk + qw, qkv, codes);
    c->k->copy(pk + N * qkv, codes + N * qkv, kern_fp8_bytes(&q.f) - N * qkv);
    return pk;
}

/* The forward's: the saved codes (attn.qkv.out, quantized by the core's op) to the head
 * split, received into attn.qkv.out, the core's Q, K, V decoded into ws.fp8's act part. */
static int a2a_qkv_fp8(const ExecLayerRun *r, const ExecLayerActs *a, int chunk, int l,
                       ModelPhase ph, PxError *err)
{
    const ExecCtx *c = r->c;
    const int qkv = c->d.q_loc + c->d.kv2_loc;
    CpA2a x;
    a2a_dims(c, &x);
    const A2aSegs sg = qkv_segs(c, &x);
    ExecFp8Ref q = exec_fp8_saved(r->fp8, EXEC_LA(a, QKV_OUT), (int)x.rows, qkv);
    if (exec_mla_on(c))
        q.q = mla_packed_codes(r, q);
    return a2a_fp8(r, &x, &sg, l, chunk, ph, 0, q, qkv, r->W->cp_send, EXEC_LA(a, QKV_OUT),
                   r->W->cp_recv, r->fp8->act, err);
}

/* The backward's, before the core: the saved head-split blocks decoded into ws.fp8's act part
 * (through cp.a2a_recv), and the output gradient quantized (this rank's rows, ws.fp8's first
 * copy) and moved in its codes to the head split, decoded into cp.a2a_send (through ws.dhid). */
static int a2a_bwd_fp8(const ExecLayerRun *r, const ExecLayerActs *a, CpA2a *x, int chunk, int l,
                       PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + d->kv2_loc;
    const A2aSegs sq = qkv_segs(c, x);
    const ExecFp8Ref saved = exec_fp8_saved(r->fp8, EXEC_LA(a, QKV_OUT), (int)x->rows, qkv);
    a2a_fp8_decode(r, x, &sq, EXEC_LA(a, QKV_OUT),
                   kern_fp8_bytes(&saved.f) - x->rows * (size_t)qkv, saved.f, r->W->cp_recv,
                   r->fp8->act);
    const ExecFp8Ref g = exec_fp8_core_quantize(r->fp8, c, r->fp8->q0, r->W->dhid, (int)x->rows,
                                                d->o_loc, EXEC_FP8_CORE_DO,
                                                attn_weight(r, l), 1);
    const A2aSegs so = {1, {0, 0, 0}, {x->wo, 0, 0}, x->wo};
    return a2a_fp8(r, x, &so, l, chunk, MODEL_BWD, 0, g, d->o_loc, r->W->cp_send, r->W->cp_recv,
                   r->W->dhid, r->W->cp_send, err);
}

/* Q, K, V from the sequence split (attn.qkv.out, this rank's rows) to the head split over the
 * whole sequence (attn.qkv.out again, W wide). */
static int a2a_qkv(const ExecLayerRun *r, const ExecLayerActs *a, int chunk, int l, ModelPhase ph,
                   PxError *err)
{
    const ExecCtx *c = r->c;
    if (fp8_on(c))
        return a2a_qkv_fp8(r, a, chunk, l, ph, err);
    CpA2a x;
    a2a_dims(c, &x);
    a2a_width(&x, x.W);
    const int mx = model_fp8_attn_cp16(&c->spec);
    void *src = mx ? r->fp8->act : EXEC_LA(a, QKV_OUT);
    const ExecQkv v = exec_qkv_at(c, src, 0);
    a2a_pack(c, &x, &v, r->W->cp_send, 1);
    int rc = a2a_call(r, l, chunk, ph, 0, &x, r->W->cp_send, err);
    if (rc)
        return rc;
    a2a_move(c, r->W->cp_recv, mx ? r->W->cp_send : src, x.W, 1);
    if (mx) /* MXFP8 (AttnFuncWithCPAndQKVOA2A): the 16-bit head split quantized after the
               exchange into both copies, saved (q_part, k_part, v_part) and decoded; b x s
               rows of W, so a column-wise block is 32 positions of one head's channel, as
               TE's blocks run along each head's sequence (and as one rank's) */
        exec_fp8_mx_saved(r->fp8, c, EXEC_LA(a, QKV_OUT), r->fp8->act, a2a_mx_col(r, 0),
                          r->W->cp_send, c->d.b * c->d.s, x.W);
    return PX_OK;
}

/* The head-split output (cp.a2a_recv, global order, wo wide) back to the sequence split: this
 * rank's rows of every head into out. */
static int a2a_out(const ExecLayerRun *r, void *out, int chunk, int l, ModelPhase ph,
                   PxError *err)
{
    const ExecCtx *c = r->c;
    CpA2a x;
    a2a_dims(c, &x);
    a2a_width(&x, x.wo);
    a2a_move(c, r->W->cp_send, r->W->cp_recv, x.wo, 0);
    int rc = a2a_call(r, l, chunk, ph, 1, &x, r->W->cp_send, err);
    if (rc)
        return rc;
    a2a_unsplit_out(c, &x, r->W->cp_recv, out);
    return PX_OK;
}

/* Ulysses' core, forward: with `comm` Q, K, V to the head split first and the output back
 * after (the forward's, a full recompute's), else (selective recompute) over the head split
 * attn.qkv.out already holds, into out. Sequence by sequence, causal over the whole one: the
 * ordinary core, fused or not, over this rank's heads. */
static int a2a_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int mb, int l,
                   int chunk, ModelPhase ph, int comm, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    CpA2a x;
    a2a_dims(c, &x);
    int rc;
    if (comm && (rc = a2a_qkv(r, a, chunk, l, ph, err)))
        return rc;
    void *oh = comm ? r->W->cp_recv : out;
    const int Hc = d->heads_loc / d->c, s = d->s;
    const size_t tile = (size_t)Hc * s * s;
    /* the sinks of this rank's heads of the split */
    const void *sinks = r->P->lw[l].sinks;
    const void *hs = sinks ? AT(sinks, (size_t)c->g.cp_rank * Hc) : NULL;
    for (int q = 0; q < d->b; q++) {
        const void *base = AT(a2a_heads(r, a), (size_t)q * s * x.W);
        KernAttnFwd f = {
            .B = 1, .Tq = s, .Tk = s, .H = Hc, .KV = d->kv_loc / d->c, .D = d->qk_hd,
            .Dv = d->v_hd, .scale = (float)(1.0 / sqrt((double)d->qk_hd)),
            .q = base, .k = AT(base, x.wq), .v = AT(base, x.wq + x.wk),
            .q_stride = x.W, .k_stride = x.W, .v_stride = x.W,
            .out = AT(oh, (size_t)q * s * x.wo),
            .sinks = hs,
            .v_col = a2a_mx_col(r, 0) ? AT(a2a_mx_col(r, 0), (size_t)q * s * x.W + x.wq + x.wk)
                                      : NULL,
        };
        /* the fused core saves the log-sum-exp of its Hc x s rows (attn.lse's b x heads_loc x
         * s_loc), the unfused one its probabilities */
        if (c->spec.job.flash_attn)
            f.lse = (float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * Hc * s;
        else
            f.probs = AT(EXEC_LA(a, SOFTMAX), q * tile);
        if (c->attn_dropout) {
            /* the one-rank stream of the layer's heads, s x s each: this rank's first head of
             * the split is global head tp x heads_loc + cp_rank x Hc */
            const uint64_t g0 = (uint64_t)c->g.tp_rank * d->heads_loc + (uint64_t)c->g.cp_rank * Hc;
            f.dropout = c->dropout;
            f.seed = exec_stream_at(exec_drop_seed(r, exec_seq_index(r, mb, q), l, EXEC_SITE_ATTN),
                                    g0 * (uint64_t)s * (uint64_t)s);
            f.mask = (uint8_t *)EXEC_LA(a, SOFTMAX_MASK) + q * tile;
            f.probs_drop = AT(EXEC_LA(a, SOFTMAX_DROP), q * tile);
        }
        c->k->attention_fwd(&f);
        exec_meter_flops(r->M, core_fwd_flops(c, (double)Hc, s, s));
    }
    if (!comm)
        return PX_OK;
    return exec_cp_quantizes_out(c) ? a2a_out_fp8(r, a, out, chunk, l, ph, err)
                                    : a2a_out(r, out, chunk, l, ph, err);
}

/* Rows of every head (o_loc wide: the output, or its gradient) from the sequence split to the
 * head split: this rank's rows of each rank's heads packed into buf, the all-to-all (the
 * backward's first side, the projection's op), and buf overwritten with this rank's heads over
 * the whole sequence in global order. */
static int a2a_rows_to_heads(const ExecLayerRun *r, const CpA2a *x, int l, int chunk,
                             const void *rows, void *buf, PxError *err)
{
    const ExecCtx *c = r->c;
    for (int rk = 0; rk < c->d.c; rk++)
        for (size_t n = 0; n < x->rows; n++)
            c->k->copy(AT(buf, (rk * x->rows + n) * x->wo),
                       AT(rows, n * c->d.o_loc + (size_t)rk * x->wo), (size_t)x->wo * c->ab);
    int rc = a2a_call(r, l, chunk, MODEL_BWD, 0, x, buf, err);
    if (!rc)
        a2a_move(c, r->W->cp_recv, buf, x->wo, 1);
    return rc;
}

/* Ulysses' core, backward: the output's gradient (ws.dhid) to the head split (in cp.a2a_send),
 * and with the fused core the output too (attn.proj.in, into ws.dhid, free once the gradient
 * has gone: its backward reads the output, which the forward saved in the sequence split only,
 * as Transformer Engine's does), the attention's backward there, and Q's, K's and V's gradients
 * back to this rank's rows of ws.dqkv. */
static int a2a_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int chunk, int l, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int Hc = d->heads_loc / d->c, s = d->s, flash = c->spec.job.flash_attn;
    CpA2a x;
    a2a_dims(c, &x);
    a2a_width(&x, x.wo);
    int rc = fp8_on(c) ? a2a_bwd_fp8(r, a, &x, chunk, l, err)
                       : a2a_rows_to_heads(r, &x, l, chunk, r->W->dhid, r->W->cp_send, err);
    if (!rc && flash && exec_cp_quantizes_out(c))
        a2a_saved_out_fp8(r, a, &x);
    else if (!rc && flash)
        rc = a2a_rows_to_heads(r, &x, l, chunk, EXEC_LA(a, PROJ_IN), r->W->dhid, err);
    if (rc)
        return rc;
    void *qc = a2a_mx_col(r, 0), *dc = a2a_mx_col(r, 1);
    if (qc) { /* MXFP8: the saved head split decoded, dO quantized into both copies there */
        exec_fp8_mx_saved(r->fp8, c, EXEC_LA(a, QKV_OUT), r->fp8->act, qc, NULL, d->b * s, x.W);
        exec_fp8_mx_copies(r->fp8, c, r->W->cp_send, dc, r->W->cp_send, d->b * s, x.wo, 1);
    }
    const size_t tile = (size_t)Hc * s * s;
    for (int q = 0; q < d->b; q++) {
        const void *base = AT(a2a_heads(r, a), (size_t)q * s * x.W);
        void *db = AT(r->W->cp_recv, (size_t)q * s * x.W);
        KernAttnBwd b = {
            .B = 1, .Tq = s, .Tk = s, .H = Hc, .KV = d->kv_loc / d->c, .D = d->qk_hd,
            .Dv = d->v_hd, .scale = (float)(1.0 / sqrt((double)d->qk_hd)),
            .q = base, .k = AT(base, x.wq), .v = AT(base, x.wq + x.wk),
            .q_stride = x.W, .k_stride = x.W, .v_stride = x.W,
            .dout = AT(r->W->cp_send, (size_t)q * s * x.wo),
            .dq = db, .dk = AT(db, x.wq), .dv = AT(db, x.wq + x.wk),
            .dq_stride = x.W, .dk_stride = x.W, .dv_stride = x.W,
            .q_col = qc ? AT(qc, (size_t)q * s * x.W) : NULL,
            .k_col = qc ? AT(qc, (size_t)q * s * x.W + x.wq) : NULL,
            .dout_col = dc ? AT(dc, (size_t)q * s * x.wo) : NULL,
        };
        if (flash) {
            b.out = AT(r->W->dhid, (size_t)q * s * x.wo);
            b.lse = (const float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * Hc * s;
            b.drow = r->W->flash_d + (size_t)q * Hc * s;
        } else {
            b.probs = AT(EXEC_LA(a, SOFTMAX), q * tile);
            b.dscores = AT(r->W->dscores, q * tile);
        }
        if (c->attn_dropout) {
            b.dropout = c->dropout;
            b.mask = (const uint8_t *)EXEC_LA(a, SOFTMAX_MASK) + q * tile;
            b.probs_drop = AT(EXEC_LA(a, SOFTMAX_DROP), q * tile);
        }
        c->k->attention_bwd(&b);
        if (r->P->lw[l].sinks) /* this rank's heads' sinks, over the whole sequence */
            c->k->attention_sink_bwd(EXEC_AT(r->P->lg[l].sinks, (size_t)c->g.cp_rank * Hc, c->gb),
                                     AT(r->P->lw[l].sinks, (size_t)c->g.cp_rank * Hc), b.lse,
                                     b.drow, flash ? NULL : b.dscores, 1, Hc, s, s);
        exec_meter_flops(r->M, model_attention_bwd_flops(core_fwd_flops(c, (double)Hc, s, s),
                                                         flash, NULL));
    }
    a2a_width(&x, x.W);
    a2a_move(c, r->W->cp_send, r->W->cp_recv, x.W, 0);
    if ((rc = model_fp8_attn_dqkv(&c->spec) ? a2a_dqkv_fp8(r, &x, chunk, l, err)
                                            : a2a_call(r, l, chunk, MODEL_BWD, 1, &x, r->W->cp_send, err)))
        return rc;
    const ExecQkv dv = exec_qkv_at(c, r->W->dqkv, 0);
    a2a_pack(c, &x, &dv, r->W->cp_recv, 0);
    return PX_OK;
}

/* ---- p2p: the ring ---- */

/* The K, V ring (cp_comm p2p; Liu et al. 2023's ring attention with Megatron-LM's chunks):
 * cp.kv holds two slots, each a block (a rank's K and V, b x s_loc rows of 2 kv, its parts in
 * order) followed by the K, V gradient accumulated for it. Step k holds the block of cp rank
 * (this - k) mod cp. The block goes on to the next rank, and the previous rank's arrives in the
 * other slot, while the attention computes on it: the messages are posted before the block's
 * attention and waited for after it (the backward's gradient of a block goes after its
 * attention, which accumulates it). The pass's messages are one op of the graph (the
 * backward's ring steps and its last message share it). */
enum { CP_RING_TAG = 0x70000 }; /* apart from the pipeline's tags; its peers are other ranks */

static size_t ring_block(const ExecCtx *c) { return (size_t)c->d.b * c->d.s_loc * c->d.kv2_loc; }

/* MXFP8 attention on the ring (model_fp8_attn_cp16), as Transformer Engine's
 * AttnFuncWithCPAndKVP2P under fp8_recipe.mxfp8(): the blocks travel in the act dtype and each
 * step quantizes the block at hand into both copies (combine_and_quantize), decoded into
 * ws.fp8's act part after the core's other copies (this rank's Q, K, V both ways and dO's
 * column-wise copy, which layers.c quantizes before the ring: fp8_core_ring_mx), the row-wise
 * block first, then the column-wise one. Returns the row-wise block (blk itself without
 * MXFP8) and the column-wise one in *col (NULL without). */
static const void *ring_mx_block(const ExecLayerRun *r, const void *blk, const void **col)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const size_t N = (size_t)d->b * d->s_loc, qkv = (size_t)(d->q_loc + d->kv2_loc);
    *col = NULL;
    if (!model_fp8_attn_cp16(&c->spec))
        return blk;
    void *row = AT(r->fp8->act, N * (2 * qkv + (size_t)d->o_loc));
    void *cb = AT(row, ring_block(c));
    exec_fp8_mx_copies(r->fp8, c, row, cb, blk, d->b * d->s_loc, d->kv2_loc, 0);
    *col = cb;
    return row;
}

/* Where the ring's core reads this rank's column-wise Q (dout 0) or dO (dout 1) under MXFP8
 * attention: ws.fp8's act part after the row-wise Q, K, V (layers.c's fp8_core_col) */
static const void *ring_mx_col(const ExecLayerRun *r, int dout)
{
    const ExecCtx *c = r->c;
    const size_t N = (size_t)c->d.b * c->d.s_loc, qkv = (size_t)(c->d.q_loc + c->d.kv2_loc);
    return model_fp8_attn_cp16(&c->spec) ? AT(r->fp8->act, N * qkv * (dout ? 2 : 1)) : NULL;
}

static void *ring_slot(const ExecLayerRun *r, int i, int grad)
{
    const ExecCtx *c = r->c;
    return AT(r->W->cp_kv, ((size_t)2 * i + (size_t)grad) * ring_block(c));
}

static int ring_peer(const ExecCtx *c, int delta)
{
    return model_rank(&c->spec.layout, c->g.tp_rank, (c->g.cp_rank + delta + c->d.c) % c->d.c,
                      c->g.dp_rank, c->g.stage);
}

/* One message of the ring, started: `bytes` of slot `from` (its block, or its gradient) to the
 * next rank, as much from the previous one into slot `into`, their handles in rq and sq (both
 * slots belong to the transfer until ring_wait). Counted as a call of the op g; the time it
 * takes to post them is the op's. */
static int ring_post(const ExecLayerRun *r, int g, ModelPhase ph, const void *from, void *into,
                     size_t bytes, int *rq, int *sq, PxError *err)
{
    const ExecCtx *c = r->c;
    const int tag = CP_RING_TAG + (ph == MODEL_BWD);
    exec_meter_open(r->M, c->k, g);
    int rc = comm_recv(c->comm, into, bytes, ring_peer(c, -1), tag, MODEL_CP_P2P, rq, err);
    if (!rc)
        rc = comm_send(c->comm, from, bytes, ring_peer(c, 1), tag, MODEL_CP_P2P, sq, err);
    exec_meter_close(r->M, c->k, g);
    return rc;
}

/* Completes the messages of ring_post; the time the rank waits for them (what the attention
 * beside them did not hide) is op g's, more of the call that posted them. */
static int ring_wait(const ExecLayerRun *r, int g, int *rq, int *sq, PxError *err)
{
    exec_meter_open_again(r->M, r->c->k, g);
    int rc = comm_wait(r->c->comm, rq, err);
    if (!rc)
        rc = comm_wait(r->c->comm, sq, err);
    exec_meter_close(r->M, r->c->k, g);
    return rc;
}

/* Whether query part j of this rank sees key part jj of cp rank src, and the query offset
 * that masks it: an earlier chunk whole (every key visible), the same chunk causally. */
static int ring_visible(const ExecCtx *c, int j, int src, int jj, int *q_offset)
{
    const int qp = exec_cp_part_pos(c, c->g.cp_rank, j), kp = exec_cp_part_pos(c, src, jj);
    *q_offset = kp < qp ? exec_cp_part_len(c) - 1 : 0;
    return kp <= qp;
}

/* This rank's K, V columns of attn.qkv.out into the ring's slot 0. */
static void ring_own_block(const ExecLayerRun *r, const ExecLayerActs *a)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + d->kv2_loc, kv2 = d->kv2_loc;
    if (exec_mla_on(c)) {
        mla_kv_rows(c, ring_slot(r, 0, 0), EXEC_LA(a, QKV_OUT), 0);
        return;
    }
    for (size_t n = 0; n < (size_t)d->b * d->s_loc; n++)
        c->k->copy(AT(ring_slot(r, 0, 0), n * kv2), AT(EXEC_LA(a, QKV_OUT), n * qkv + d->q_loc),
                   (size_t)kv2 * c->ab);
}

/* One block's attention (the forward's): each query part's output and log-sum-exp over the
 * block's visible key parts, merged into what the earlier blocks gave. The attention sinks
 * (NULL: none) join the first block's softmax only, so each query counts them once. */
static void ring_block_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out,
                           const void *blk, int step, int src, int more, const void *sinks)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc, kw = kv_k_width(c);
    const int kv2 = d->kv2_loc, C = exec_cp_part_len(c);
    const ExecQkv x = exec_qkv_at(c, a2a_heads(r, a), 0);
    const void *col;
    blk = ring_mx_block(r, blk, &col);
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < 2; j++)
            for (int jj = 0; jj < 2; jj++) {
                int q0;
                if (!ring_visible(c, j, src, jj, &q0))
                    continue;
                const int first = step == 0 && jj == 0; /* the own block's first part */
                const size_t kr = ((size_t)q * sl + (size_t)jj * C) * kv2;
                const size_t rows = (size_t)q * sl + (size_t)j * C;
                float *lse = (float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * H * sl + (size_t)j * H * C;
                const void *kb = AT(blk, ((size_t)q * sl + (size_t)jj * C) * kv2);
                KernAttnFwd f = {
                    .B = 1, .Tq = C, .Tk = C, .H = H, .KV = d->kv_loc, .D = d->qk_hd,
                    .Dv = d->v_hd, .q_offset = q0,
                    .scale = (float)(1.0 / sqrt((double)d->qk_hd)),
                    .q = AT(x.q, rows * x.q_stride), .k = kb, .v = AT(kb, kw),
                    .q_stride = x.q_stride, .k_stride = kv2, .v_stride = kv2,
                    .out = first ? AT(out, rows * d->o_loc) : r->W->cp_out_part,
                    .lse = first ? lse : r->W->cp_lse_part,
                    .sinks = first ? sinks : NULL,
                    .v_col = col ? AT(col, kr + (size_t)kw) : NULL,
                };
                c->k->attention_fwd(&f);
                if (!first)
                    c->k->attention_merge(AT(out, rows * d->o_loc), lse, r->W->cp_out_part,
                                          r->W->cp_lse_part, C, H, d->v_hd);
                if (more)
                    comm_progress(c->comm); /* MPI moves the messages inside its calls */
            }
}

typedef void (*Ring8Fn)(const ExecLayerRun *r, const ExecLayerActs *a, void *out,
                        const void *sinks, const void *blk, int step, int src, int more);
static int ring8_pass(const ExecLayerRun *r, const ExecLayerActs *a, void *out, const void *sinks,
                      int g, ModelPhase ph, Ring8Fn fn, PxError *err);
static void ring8_block_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out,
                            const void *sinks, const void *blk, int step, int src, int more);

/* The ring's forward: each query part's output and log-sum-exp (attn.proj.in's rows and
 * attn.lse's) over every block, merged block by block (the online softmax). The fused core
 * only. */
static int ring_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int l, int chunk,
                    ModelPhase ph, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int g = exec_meter_comm_op(r->M, c, MODEL_OPR_CORE, l, chunk, ph, MODEL_CP_P2P, err);
    if (g < 0)
        return PX_ERUNTIME;
    int rc;
    if (fp8_on(c)) {
        if ((rc = ring8_pass(r, a, out, r->P->lw[l].sinks, g, ph, ring8_block_fwd, err)))
            return rc;
    } else
        ring_own_block(r, a);
    for (int step = 0, cur = 0; !fp8_on(c) && step < d->c; step++, cur ^= 1) {
        const int src = (c->g.cp_rank - step + d->c) % d->c, more = step + 1 < d->c;
        int rq = -1, sq = -1;
        if (more && (rc = ring_post(r, g, ph, ring_slot(r, cur, 0), ring_slot(r, cur ^ 1, 0),
                                    ring_block(c) * c->ab, &rq, &sq, err)))
            return rc;
        ring_block_fwd(r, a, out, ring_slot(r, cur, 0), step, src, more, r->P->lw[l].sinks);
        if (more && (rc = ring_wait(r, g, &rq, &sq, err)))
            return rc;
    }
    for (int q = 0; q < d->b; q++)
        exec_meter_flops(r->M, core_fwd_flops(c, (double)d->heads_loc, d->s_loc, d->s));
    return PX_OK;
}

/* One block's part of every gradient (the backward's), with the forward's output and
 * log-sum-exp over all blocks (so each block's probabilities are the softmax's own): Q's added
 * into ws.dqkv, K's and V's into the block's gradient dblk. */
static void ring_block_bwd(const ExecLayerRun *r, const ExecLayerActs *a, const void *blk,
                           void *dblk, int src, int more)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc, kw = kv_k_width(c);
    const int kv2 = d->kv2_loc, C = exec_cp_part_len(c);
    const ExecQkv x = exec_qkv_at(c, a2a_heads(r, a), 0);
    const ExecQkv dx = exec_qkv_at(c, r->W->dqkv, 0);
    const void *col, *qc = ring_mx_col(r, 0), *dc = ring_mx_col(r, 1);
    blk = ring_mx_block(r, blk, &col);
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < 2; j++)
            for (int jj = 0; jj < 2; jj++) {
                int q0;
                if (!ring_visible(c, j, src, jj, &q0))
                    continue;
                const size_t rows = (size_t)q * sl + (size_t)j * C;
                const size_t krows = (size_t)q * sl + (size_t)jj * C;
                const size_t lo = (size_t)q * H * sl + (size_t)j * H * C;
                const void *kb = AT(blk, krows * kv2);
                KernAttnBwd b = {
                    .B = 1, .Tq = C, .Tk = C, .H = H, .KV = d->kv_loc, .D = d->qk_hd,
                    .Dv = d->v_hd, .q_offset = q0,
                    .scale = (float)(1.0 / sqrt((double)d->qk_hd)),
                    .q = AT(x.q, rows * x.q_stride), .k = kb, .v = AT(kb, kw),
                    .q_stride = x.q_stride, .k_stride = kv2, .v_stride = kv2,
                    .out = AT(core_saved_out(r, a), rows * d->o_loc),
                    .dout = AT(r->W->dhid, rows * d->o_loc),
                    .dq = r->W->cp_out_part, .dk = r->W->cp_dkv_part,
                    .dv = AT(r->W->cp_dkv_part, kw), .dq_stride = d->q_loc,
                    .dk_stride = kv2, .dv_stride = kv2,
                    .lse = (const float *)EXEC_LA(a, ATTN_LSE) + lo, .drow = r->W->flash_d + lo,
                    .q_col = qc ? AT(qc, rows * x.q_stride) : NULL,
                    .k_col = col ? AT(col, krows * kv2) : NULL,
                    .dout_col = dc ? AT(dc, rows * d->o_loc) : NULL,
                };
                c->k->attention_bwd(&b);
                for (int t = 0; t < C; t++)
                    c->k->add_inplace(AT(dx.q, (rows + t) * dx.q_stride),
                                      AT(r->W->cp_out_part, (size_t)t * d->q_loc), d->q_loc);
                c->k->add_inplace(AT(dblk, krows * kv2), r->W->cp_dkv_part, (size_t)C * kv2);
                if (more)
                    comm_progress(c->comm);
            }
}

/* ---- p2p with FP8 attention ---- */

/* FP8 attention on the ring (the fused core, current scaling), as Transformer Engine's
 * AttnFuncWithCPAndKVP2P: the ring passes K | V as their one-byte codes (here each block with
 * the decode factor of the rank that quantized it: parallax's ranks keep their own scales),
 * decoded block by block for the attention; Q and K, V of this rank are read decoded from
 * ws.fp8's act part. The backward's ring passes the codes again, and each block's dK, dV
 * (the act dtype) go home in one all-to-all after the last step instead of riding the ring.
 * cp.kv holds (in blocks of b x s_loc x kv2 act elements) the two code slots, the decoded
 * block, and the gradients of every block to send and the ones received. */
static void *ring8_at(const ExecLayerRun *r, int blk)
{
    const ExecCtx *c = r->c;
    return AT(r->W->cp_kv, (size_t)blk * ring_block(c));
}

/* This rank's K | V codes (attn.qkv.out) and their factor into code slot 0; returns the
 * slot's bytes, the saved copy's layout in f */
static size_t ring8_own(const ExecLayerRun *r, const ExecLayerActs *a, KernFp8 *f)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + d->kv2_loc, kv2 = d->kv2_loc, N = d->b * d->s_loc;
    const ExecFp8Ref own = exec_fp8_saved(r->fp8, EXEC_LA(a, QKV_OUT), N, qkv);
    const size_t count = (size_t)N * kv2, sb = kern_fp8_bytes(&own.f) - (size_t)N * qkv;
    uint8_t *slot = ring8_at(r, 0);
    kv_codes(c, slot, (size_t)kv2, own.q);
    c->k->copy(slot + count, (const uint8_t *)own.q + (size_t)N * qkv, sb);
    *f = own.f;
    f->cols = f->block_c = kv2;
    return count + sb;
}

/* One pass of the ring over the code slots: the block of each step decoded into cp.kv's third
 * block and handed to fn (the forward's or the backward's block), the next one arriving
 * beside it; op g counts the messages. */
static int ring8_pass(const ExecLayerRun *r, const ExecLayerActs *a, void *out, const void *sinks,
                      int g, ModelPhase ph, Ring8Fn fn, PxError *err)
{
    const ExecCtx *c = r->c;
    KernFp8 f;
    const size_t bytes = ring8_own(r, a, &f);
    for (int step = 0, cur = 0; step < c->d.c; step++, cur ^= 1) {
        const int src = (c->g.cp_rank - step + c->d.c) % c->d.c, more = step + 1 < c->d.c;
        int rq = -1, sq = -1, rc;
        if (more &&
            (rc = ring_post(r, g, ph, ring8_at(r, cur), ring8_at(r, cur ^ 1), bytes, &rq, &sq, err)))
            return rc;
        c->k->fp8_dequantize(ring8_at(r, 2), ring8_at(r, cur), &f);
        fn(r, a, out, sinks, ring8_at(r, 2), step, src, more);
        if (more && (rc = ring_wait(r, g, &rq, &sq, err)))
            return rc;
    }
    return PX_OK;
}

static void ring8_block_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out,
                            const void *sinks, const void *blk, int step, int src, int more)
{
    ring_block_fwd(r, a, out, blk, step, src, more, sinks);
}

/* a block's gradient lands in its own place among the ones to send home */
static void ring8_block_bwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out,
                            const void *sinks, const void *blk, int step, int src, int more)
{
    (void)out, (void)sinks, (void)step;
    ring_block_bwd(r, a, blk, ring8_at(r, 3 + src), src, more);
}

/* The backward's start: Q, K, V decoded from the saved codes into ws.fp8's act part and the
 * output gradient rounded through FP8 in place (this rank's rows, its own factor), as the
 * layers' core does on one rank. */
static void ring8_bwd_inputs(const ExecLayerRun *r, const ExecLayerActs *a, int l)
{
    const ExecCtx *c = r->c;
    const int N = c->d.b * c->d.s_loc, qkv = c->d.q_loc + c->d.kv2_loc;
    const ExecFp8Ref q = exec_fp8_saved(r->fp8, EXEC_LA(a, QKV_OUT), N, qkv);
    c->k->fp8_dequantize(r->fp8->act, q.q, &q.f);
    void *o = exec_fp8_core_out(r);
    if (o) { /* delayed: the output's FP8 copy (attn.proj.in), quantized after the merge */
        const ExecFp8Ref so = exec_fp8_saved(r->fp8, EXEC_LA(a, PROJ_IN), N, c->d.o_loc);
        c->k->fp8_dequantize(o, so.q, &so.f);
    }
    const ExecFp8Ref g = exec_fp8_core_quantize(r->fp8, c, r->fp8->q0, r->W->dhid, N, c->d.o_loc,
                                                EXEC_FP8_CORE_DO,
                                                attn_weight(r, l), 1);
    c->k->fp8_dequantize(r->W->dhid, g.q, &g.f);
}

/* Under delayed scaling (model_fp8_attn_dqkv) the gradients of every block (cp.kv's blocks
 * 3 ...) quantized with one factor of this rank's dQKV history, as Transformer Engine's ring
 * writes each step's dK, dV with its dQKV quantizer and sends the codes home in one all-to-all:
 * the codes into the room of the received blocks (3 + cp ...), each block's sent with the
 * factor from blocks 3 ..., the received ones back into the room of 3 + cp ... and decoded each
 * with its sender's factor (into block 2), summed in block 3. Returns the sum. */
static void *ring8_dkv_codes(const ExecLayerRun *r, int l, int chunk, PxError *err)
{
    const ExecCtx *c = r->c;
    const int cp = c->d.c;
    const size_t blk = ring_block(c);
    uint8_t *codes = ring8_at(r, 3 + cp), *send = ring8_at(r, 3);
    const ExecFp8Ref q = exec_fp8_core_quantize(r->fp8, c, codes, send, cp * c->d.b * c->d.s_loc,
                                                c->d.kv2_loc, EXEC_FP8_CORE_DQKV,
                                                attn_weight(r, l), 1);
    const size_t sb = kern_fp8_bytes(&q.f) - (size_t)cp * blk, each = blk + sb;
    int64_t *cnt = r->W->cp_cnt;
    for (int i = 0; i < cp; i++) {
        c->k->copy(send + (size_t)i * each, codes + (size_t)i * blk, blk);
        c->k->copy(send + (size_t)i * each + blk, codes + (size_t)cp * blk, sb);
        cnt[i] = (int64_t)each;
    }
    if (collective_dt(r, MODEL_OPR_CORE, l, chunk, MODEL_BWD, MODEL_CP_ALL_TO_ALL, codes, send, 0,
                      cnt, PX_FP8, err))
        return NULL;
    KernFp8 f = q.f;
    f.rows = f.block_r = q.f.rows / cp;
    void *sum = ring8_at(r, 3);
    c->k->fp8_dequantize(sum, codes, &f);
    for (int i = 1; i < cp; i++) {
        c->k->fp8_dequantize(ring8_at(r, 2), codes + (size_t)i * each, &f);
        c->k->add_inplace(sum, ring8_at(r, 2), blk);
    }
    return sum;
}

/* The K, V gradients of every block (cp.kv's blocks 3 ...) home in one all-to-all (blocks
 * 3 + cp ...; in their codes under delayed scaling: ring8_dkv_codes), summed into ws.dqkv's
 * K, V columns. */
static int ring8_dkv_home(const ExecLayerRun *r, int l, int chunk, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + d->kv2_loc, kv2 = d->kv2_loc;
    const size_t blk = ring_block(c);
    void *sum = ring8_at(r, 3 + d->c);
    if (model_fp8_attn_dqkv(&c->spec)) {
        if (!(sum = ring8_dkv_codes(r, l, chunk, err)))
            return PX_ERUNTIME;
    } else {
        int64_t *cnt = r->W->cp_cnt;
        for (int i = 0; i < d->c; i++)
            cnt[i] = (int64_t)blk;
        int rc = collective(r, MODEL_OPR_CORE, l, chunk, MODEL_BWD, MODEL_CP_ALL_TO_ALL, sum,
                            ring8_at(r, 3), 0, cnt, err);
        if (rc)
            return rc;
        for (int i = 1; i < d->c; i++)
            c->k->add_inplace(sum, ring8_at(r, 3 + d->c + i), blk);
    }
    if (exec_mla_on(c)) {
        mla_kv_rows(c, sum, r->W->dqkv, 1);
        return PX_OK;
    }
    for (size_t n = 0; n < (size_t)d->b * d->s_loc; n++)
        c->k->copy(AT(r->W->dqkv, n * qkv + d->q_loc), AT(sum, n * kv2), (size_t)kv2 * c->ab);
    return PX_OK;
}

/* The ring's backward: each block's part of every gradient, K's and V's in the block's gradient,
 * which travels with it; a last message takes each gradient to its owner. */
static int ring_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int l, int chunk, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + d->kv2_loc, kv2 = d->kv2_loc;
    const size_t blk_bytes = ring_block(c) * c->ab;
    c->k->memset0(r->W->dqkv, (size_t)d->b * d->s_loc * qkv * c->ab);
    const int g = exec_meter_comm_op(r->M, c, MODEL_OPR_CORE, l, chunk, MODEL_BWD, MODEL_CP_P2P,
                                     err);
    if (g < 0)
        return PX_ERUNTIME;
    int cur = 0, rc;
    if (fp8_on(c)) {
        ring8_bwd_inputs(r, a, l);
        c->k->memset0(ring8_at(r, 3), (size_t)d->c * blk_bytes);
        if ((rc = ring8_pass(r, a, NULL, NULL, g, MODEL_BWD, ring8_block_bwd, err)) ||
            (rc = ring8_dkv_home(r, l, chunk, err)))
            return rc;
    } else {
        ring_own_block(r, a);
        c->k->memset0(ring_slot(r, 0, 1), blk_bytes);
    }
    for (int step = 0; !fp8_on(c) && step < d->c; step++, cur ^= 1) {
        const int src = (c->g.cp_rank - step + d->c) % d->c, more = step + 1 < d->c;
        void *dblk = ring_slot(r, cur, 1);
        int rq = -1, sq = -1, drq = -1, dsq = -1;
        /* the block on beside its attention; its gradient must wait for it */
        if (more && (rc = ring_post(r, g, MODEL_BWD, ring_slot(r, cur, 0),
                                    ring_slot(r, cur ^ 1, 0), blk_bytes, &rq, &sq, err)))
            return rc;
        ring_block_bwd(r, a, ring_slot(r, cur, 0), dblk, src, more);
        /* the gradient on, a message of its own (the graph's calls); after the last step it goes
         * home: the next rank's block, this rank's from the previous one */
        if ((rc = ring_post(r, g, MODEL_BWD, dblk, ring_slot(r, cur ^ 1, 1), blk_bytes, &drq,
                            &dsq, err)) ||
            (more && (rc = ring_wait(r, g, &rq, &sq, err))) ||
            (rc = ring_wait(r, g, &drq, &dsq, err)))
            return rc;
    }
    if (fp8_on(c))
        ; /* ring8_dkv_home wrote them */
    else if (exec_mla_on(c))
        mla_kv_rows(c, ring_slot(r, cur, 1), r->W->dqkv, 1);
    else
        for (size_t n = 0; n < (size_t)d->b * d->s_loc; n++)
            c->k->copy(AT(r->W->dqkv, n * qkv + d->q_loc), AT(ring_slot(r, cur, 1), n * kv2),
                       (size_t)kv2 * c->ab);
    /* the sinks' gradient once per query part, from its lse over every block and the row
     * terms the blocks' backward wrote */
    const int H = d->heads_loc, C = exec_cp_part_len(c);
    for (int q = 0; r->P->lw[l].sinks && q < d->b; q++)
        for (int j = 0; j < 2; j++) {
            const size_t lo = (size_t)q * H * d->s_loc + (size_t)j * H * C;
            c->k->attention_sink_bwd(r->P->lg[l].sinks, r->P->lw[l].sinks,
                                     (const float *)EXEC_LA(a, ATTN_LSE) + lo, r->W->flash_d + lo,
                                     NULL, 1, H, C, C);
        }
    for (int q = 0; q < d->b; q++)
        exec_meter_flops(r->M, model_attention_bwd_flops(
                                   core_fwd_flops(c, (double)d->heads_loc, d->s_loc, d->s), 1, NULL));
    return PX_OK;
}

/* ---- the core's entries ---- */

int exec_cp_attention_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int mb,
                          int l, int chunk, ModelPhase ph, int comm, PxError *err)
{
    if (r->c->spec.layout.cp_comm == MODEL_CP_COMM_A2A)
        return a2a_fwd(r, a, out, mb, l, chunk, ph, comm, err);
    return ring_fwd(r, a, out, l, chunk, ph, err);
}

int exec_cp_attention_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int l, int chunk,
                          PxError *err)
{
    if (r->c->spec.layout.cp_comm == MODEL_CP_COMM_A2A)
        return a2a_bwd(r, a, chunk, l, err);
    return ring_bwd(r, a, l, chunk, err);
}
