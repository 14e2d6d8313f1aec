/* One chunk's forward and backward of one micro-batch through the kernels of kernels.h, op by
 * op under the op graph's names (model/ops.c lists them in this order), with the tensor- and
 * sequence-parallel communication of Megatron-LM and the pipeline's transfers.
 *
 * Tensor parallelism (Shoeybi et al. 2019): QKV and fc1 are column-parallel (this rank's heads,
 * its slice of the MLP), the attention projection and fc2 row-parallel: their partial outputs
 * are all-reduced (the g operator) before bias, dropout and the residual add, which then run
 * alike on every TP rank; backward all-reduces the input gradients of QKV and fc1 (the f
 * operator). The embedding and the output layer are vocabulary-parallel: partial embeddings are
 * summed, the cross-entropy combines the ranks' row maxima, sums of exponentials and target
 * logits with three all-reduces (kernels.h's xent_* steps between them).
 *
 * Sequence parallelism (Korthikanti et al. 2022): norms, dropout and residual adds work on this
 * rank's R = b*s/t rows of the micro-batch's flat [b*s, h] activation. An all-gather restores
 * the full sequence before QKV, fc1 and the output layer, a reduce-scatter replaces each
 * all-reduce; backward all-gathers the output gradients of the row-parallel layers and
 * re-gathers the saved, sharded inputs of QKV, fc1 and the output layer for their weight
 * gradients. Dropout draws every token's mask from its sequence's stream at the token's place,
 * so any sharding draws what one rank would.
 *
 * Buffers (docs/memory.md): a layer reads its input from its slot's ln1.in and writes the next
 * layer's ln1.in (the chunk's last one final_ln.in, or a scratch that is sent on); row-parallel
 * outputs pass through ws.out (the full sequence) before the reduction; backward keeps the
 * residual-stream gradient in ws.dx_b (the norm backwards add into it, which is the residual
 * branch), the matmul input gradients in ws.dhid, ws.dqkv, ws.dffn and ws.dact, and sequence
 * parallelism's sharded temporaries in ws.dx_a; sp.gather holds whatever was gathered. */
#include <math.h>

#include "exec/internal.h"

#define TRY(x)                                                                                    \
    do {                                                                                          \
        int rc_ = (x);                                                                            \
        if (rc_)                                                                                  \
            return rc_;                                                                           \
    } while (0)

/* element i of an act-dtype tensor */
#define AT(p, i) EXEC_AT(p, i, ex->ab)

/* ---- counted kernel calls ---- */

/* C[m,n] = op(A) op(B): 2*m*n*k FLOPs, whatever the operands hold. A and B hold act values; C
 * is an act tensor (an activation or its gradient, overwritten) or an fp32 one: a weight
 * gradient (accumulated) or the logits. */
static void mm_act(Exec *ex, void *c, const void *a, const void *b, int m, int n, int k, int ta,
                   int tb)
{
    ex->k->matmul(c, ex->act, a, b, m, n, k, ta, tb, 1.0f, 0.0f);
    exec_count_flops(ex, 2.0 * m * n * k);
}

static void mm_f32(Exec *ex, float *c, const void *a, const void *b, int m, int n, int k, int ta,
                   int tb, int accumulate)
{
    ex->k->matmul(c, PX_FP32, a, b, m, n, k, ta, tb, 1.0f, accumulate ? 1.0f : 0.0f);
    exec_count_flops(ex, 2.0 * m * n * k);
}

/* The op graph's attention convention (model/ops.c): forward 4·B·H·Tq·Tk·D, halved when the
 * job counts the causal half; backward 2x forward, 2.5x on the fused path that recomputes the
 * scores. */
static double attn_flops(const Exec *ex, int B, int H, int Tq, int Tk, int D)
{
    double f = 4.0 * B * H * (double)Tq * Tk * D;
    return ex->spec.job.causal_flops ? 0.5 * f : f;
}

static void attn_fwd(Exec *ex, const KernAttnFwd *a)
{
    ex->k->attention_fwd(a);
    exec_count_flops(ex, attn_flops(ex, a->B, a->H, a->Tq, a->Tk, a->D));
}

static void attn_bwd(Exec *ex, const KernAttnBwd *a)
{
    ex->k->attention_bwd(a);
    exec_count_flops(ex, (a->probs ? 2.0 : 2.5) * attn_flops(ex, a->B, a->H, a->Tq, a->Tk, a->D));
}

/* ---- helpers ---- */

static int op_index(const Exec *ex, int layer, int op, ModelPhase phase)
{
    return ex->layer_op[(layer * EX_LAYER_OPS + op) * EX_PHASES + (int)phase];
}

static int sp_on(const Exec *ex) { return ex->spec.layout.sp && ex->d.t > 1; }

static void norm_fwd(const Exec *ex, void *out, const void *inp, const void *w, const void *b, int N)
{
    const ModelConfig *c = &ex->spec.model;
    if (c->norm == MODEL_LAYERNORM)
        ex->k->layernorm_fwd(out, inp, w, b, N, c->hidden, (float)c->norm_eps);
    else
        ex->k->rmsnorm_fwd(out, inp, w, N, c->hidden, (float)c->norm_eps);
}

/* dinp += the norm's input gradient; dw, db += */
static void norm_bwd(const Exec *ex, void *dinp, float *dw, float *db, const void *dout,
                     const void *inp, const void *w, int N)
{
    const ModelConfig *c = &ex->spec.model;
    if (c->norm == MODEL_LAYERNORM)
        ex->k->layernorm_bwd(dinp, dw, db, dout, inp, w, N, c->hidden, (float)c->norm_eps);
    else
        ex->k->rmsnorm_bwd(dinp, dw, dout, inp, w, N, c->hidden, (float)c->norm_eps);
}

/* The dropout stream of one (step, sequence, layer, site): counter-based, so a recompute, any
 * micro-batch size and any data-parallel split draw the same mask for the same sequence. */
static uint64_t drop_seed(const Exec *ex, long long seq, int layer, int site)
{
    uint64_t z = exec_mix64(ex->spec.job.seed ^ 0x64726f70ull);
    z = exec_mix64(z ^ (uint64_t)ex->cur_step);
    z = exec_mix64(z ^ (uint64_t)seq);
    z = exec_mix64(z ^ (uint64_t)(layer + 1));
    return exec_mix64(z ^ (uint64_t)site);
}

static long long seq_index(const Exec *ex, int mb, int q)
{
    return ex->seq_base + (long long)mb * ex->d.b + q;
}

/* out = dropout(x) over this rank's region of the micro-batch (out may alias x): every token
 * of sequence q at position t draws elements t*h ... of sequence q's stream, whichever rank
 * holds it. */
static void dropout_region(Exec *ex, void *out, uint8_t *mask, const void *x, int mb, int layer,
                           int site)
{
    const int s = ex->d.s, h = ex->d.h, R = ex->d.b * ex->d.s_sp;
    const long long first = sp_on(ex) ? (long long)ex->tp_rank * R : 0;
    for (long long n = first; n < first + R;) {
        const int q = (int)(n / s), t0 = (int)(n % s);
        long long cnt = s - t0;
        if (n + cnt > first + R)
            cnt = first + R - n;
        const size_t o = (size_t)(n - first) * (size_t)h;
        ex->k->dropout_fwd(AT(out, o), mask + o, AT(x, o), (size_t)cnt * h, ex->dropout,
                           exec_stream_at(drop_seed(ex, seq_index(ex, mb, q), layer, site),
                                          (uint64_t)t0 * (uint64_t)h));
        n += cnt;
    }
}

/* ---- tensor-parallel collectives, each timed under its op-graph name ---- */

static int tp_op(Exec *ex, int chunk, ModelPhase ph, const char *base, int kind, PxError *err)
{
    int op = exec_op_find(ex, chunk, ph, 0, "%s.%s", base, model_comm_name((ModelComm)kind));
    if (op < 0)
        px_fail(err, PX_ERUNTIME, "stage %d: the op graph has no %s.%s.%s: model/ and exec/ disagree",
                ex->stage, base, model_comm_name((ModelComm)kind), model_phase_name(ph));
    return op;
}

/* in-place sum of n act elements over TP */
static int tp_allreduce(Exec *ex, int chunk, ModelPhase ph, const char *base, void *buf, size_t n,
                        PxError *err)
{
    if (ex->d.t < 2)
        return PX_OK;
    int op = tp_op(ex, chunk, ph, base, MODEL_TP_ALLREDUCE, err);
    if (op < 0)
        return PX_ERUNTIME;
    exec_op_begin(ex, op);
    int rc = comm_allreduce(ex->comm, buf, n, ex->act, COMM_SUM, MODEL_TP_ALLREDUCE, NULL, err);
    exec_op_end(ex);
    return rc;
}

/* out[t * n] = every rank's n */
static int tp_all_gather(Exec *ex, int chunk, ModelPhase ph, const char *base, void *out,
                         const void *in, size_t n, PxError *err)
{
    int op = tp_op(ex, chunk, ph, base, MODEL_TP_ALL_GATHER, err);
    if (op < 0)
        return PX_ERUNTIME;
    exec_op_begin(ex, op);
    int rc = comm_all_gather(ex->comm, out, in, n, ex->act, MODEL_TP_ALL_GATHER, NULL, err);
    exec_op_end(ex);
    return rc;
}

/* out[n] = this rank's n of the sum of in[t * n] */
static int tp_reduce_scatter(Exec *ex, int chunk, ModelPhase ph, const char *base, void *out,
                             const void *in, size_t n, PxError *err)
{
    int op = tp_op(ex, chunk, ph, base, MODEL_TP_REDUCE_SCATTER, err);
    if (op < 0)
        return PX_ERUNTIME;
    exec_op_begin(ex, op);
    int rc = comm_reduce_scatter(ex->comm, out, in, n, ex->act, MODEL_TP_REDUCE_SCATTER, NULL,
                                 err);
    exec_op_end(ex);
    return rc;
}

static int block_of_layer(const Exec *ex, int l)
{
    for (int b = 0; b < ex->n_blocks; b++)
        if (ex->blocks[b].layer == l)
            return b;
    return -1;
}

static void attention_core_fwd(Exec *ex, const ExecLayerActs *a, void *out, int mb, int l)
{
    const ModelDims *d = &ex->d;
    const int s = d->s, H = d->heads_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const size_t tile = (size_t)H * s * s;
    for (int q = 0; q < d->b; q++) {
        const void *base = AT(a->qkv_out, (size_t)q * s * qkv);
        KernAttnFwd f = {
            .B = 1, .Tq = s, .Tk = s, .H = H, .KV = d->kv_loc, .D = d->hd,
            .scale = (float)(1.0 / sqrt((double)d->hd)),
            .q = base, .k = AT(base, d->q_loc), .v = AT(base, d->q_loc + d->kv_width_loc),
            .q_stride = qkv, .k_stride = qkv, .v_stride = qkv,
            .out = AT(out, (size_t)q * s * d->q_loc),
        };
        if (ex->spec.job.flash_attn) {
            f.lse = a->lse + (size_t)q * H * s;
        } else {
            f.probs = AT(a->softmax, q * tile);
            if (ex->attn_dropout) {
                f.dropout = ex->dropout;
                /* the stream of the whole layer's heads: this rank's first head is global
                 * head tp * H, whose entries start tp * H * s * s into it */
                f.seed = exec_stream_at(drop_seed(ex, seq_index(ex, mb, q), l, EXEC_SITE_ATTN),
                                        (uint64_t)ex->tp_rank * tile);
                f.mask = a->softmax_mask + q * tile;
                f.probs_drop = AT(a->softmax_drop, q * tile);
            }
        }
        attn_fwd(ex, &f);
    }
}

/* ---- a transformer layer ---- */

/* The epilogue of a row-parallel layer (attention projection, fc2): ws.out holds this rank's
 * partial product over the full sequence; reduce it (all-reduce, or reduce-scatter into y's
 * region), then bias, dropout and the residual: out = res + dropout(y + bias). */
static int row_parallel_out(Exec *ex, int chunk, int l, int opi, const char *base, ModelPhase ph,
                            const void *bias, uint8_t *mask, int site, const void *res, void *out,
                            int mb, PxError *err)
{
    const KernBackend *k = ex->k;
    const int R = ex->d.b * ex->d.s_sp, h = ex->d.h;
    void *y = ex->ws_out;
    exec_op_end(ex);
    if (sp_on(ex)) {
        y = out; /* the reduce-scatter writes the region straight into the output */
        TRY(tp_reduce_scatter(ex, chunk, ph, base, y, ex->ws_out, (size_t)R * h, err));
    } else {
        TRY(tp_allreduce(ex, chunk, ph, base, y, (size_t)R * h, err));
    }
    exec_op_resume(ex, op_index(ex, l, opi, ph));
    if (bias)
        k->add_bias(y, bias, R, h);
    if (ex->dropout > 0)
        dropout_region(ex, y, mask, y, mb, l, site);
    k->add(out, res, y, (size_t)R * h);
    exec_op_end(ex);
    return PX_OK;
}

/* Forward of layer l from a->ln1_in; the output (input plus both residual branches, this
 * rank's region) goes to out. phase MODEL_RECOMPUTE re-creates the tensors of a that the
 * recompute mode did not save (out is then scratch). */
static int layer_fwd(Exec *ex, int chunk, int l, const ExecLayerActs *a, void *out,
                     ModelPhase phase, int mb, PxError *err)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const ModelConfig *c = &ex->spec.model;
    const ExecLayerParams *w = &ex->lw[l];
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int sp = sp_on(ex);
    char base[48];

    exec_op_begin(ex, op_index(ex, l, EX_LN1, phase));
    norm_fwd(ex, a->qkv_in, a->ln1_in, w->ln1_w, w->ln1_b, R);
    exec_op_end(ex);

    const void *x = a->qkv_in;
    if (sp) {
        snprintf(base, sizeof base, "layer.%d.attn.qkv", l);
        TRY(tp_all_gather(ex, chunk, phase, base, ex->sp_gather, a->qkv_in, (size_t)R * h, err));
        x = ex->sp_gather;
    }
    exec_op_begin(ex, op_index(ex, l, EX_QKV, phase));
    mm_act(ex, a->qkv_out, x, w->qkv_w, N, qkv, h, 0, 1);
    if (w->qkv_b)
        k->add_bias(a->qkv_out, w->qkv_b, N, qkv);
    if (c->position == MODEL_POS_ROPE)
        k->rope_fwd(a->qkv_out, d->b, d->s, d->heads_loc, d->kv_loc, d->hd, 0, (float)c->rope_theta);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_CORE, phase));
    attention_core_fwd(ex, a, a->proj_in, mb, l);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_PROJ, phase));
    mm_act(ex, ex->ws_out, a->proj_in, w->proj_w, N, h, d->q_loc, 0, 1);
    snprintf(base, sizeof base, "layer.%d.attn.proj", l);
    TRY(row_parallel_out(ex, chunk, l, EX_PROJ, base, phase, w->proj_b, a->attn_drop_mask,
                         EXEC_SITE_ATTN_OUT, a->ln1_in, a->ln2_in, mb, err));

    exec_op_begin(ex, op_index(ex, l, EX_LN2, phase));
    norm_fwd(ex, a->fc1_in, a->ln2_in, w->ln2_w, w->ln2_b, R);
    exec_op_end(ex);

    x = a->fc1_in;
    if (sp) {
        snprintf(base, sizeof base, "layer.%d.mlp.fc1", l);
        TRY(tp_all_gather(ex, chunk, phase, base, ex->sp_gather, a->fc1_in, (size_t)R * h, err));
        x = ex->sp_gather;
    }
    exec_op_begin(ex, op_index(ex, l, EX_FC1, phase));
    mm_act(ex, a->act_in, x, w->fc1_w, N, d->ffn_out_loc, h, 0, 1);
    if (w->fc1_b)
        k->add_bias(a->act_in, w->fc1_b, N, d->ffn_out_loc);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_ACT, phase));
    if (c->mlp == MODEL_SWIGLU)
        k->swiglu_fwd(a->fc2_in, a->act_in, N, d->ffn_loc);
    else
        k->gelu_fwd(a->fc2_in, a->act_in, (size_t)N * d->ffn_loc);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_FC2, phase));
    mm_act(ex, ex->ws_out, a->fc2_in, w->fc2_w, N, h, d->ffn_loc, 0, 1);
    snprintf(base, sizeof base, "layer.%d.mlp.fc2", l);
    return row_parallel_out(ex, chunk, l, EX_FC2, base, phase, w->fc2_b, a->mlp_drop_mask,
                            EXEC_SITE_MLP_OUT, a->ln2_in, out, mb, err);
}

/* The output gradient of a row-parallel layer over the full sequence: dropout's backward on
 * this rank's region of dres, then (SP) the all-gather of the regions. */
static int row_parallel_dy(Exec *ex, int chunk, const char *base, const void *dres,
                           const uint8_t *mask, int l, int opi, const void **dy, PxError *err)
{
    const int R = ex->d.b * ex->d.s_sp, h = ex->d.h;
    const void *y = dres;
    if (ex->dropout > 0) {
        void *tmp = sp_on(ex) ? ex->ws_dx_a : ex->ws_out;
        ex->k->dropout_bwd(tmp, dres, mask, (size_t)R * h, ex->dropout);
        y = tmp;
    }
    if (sp_on(ex)) {
        exec_op_end(ex);
        TRY(tp_all_gather(ex, chunk, MODEL_BWD, base, ex->sp_gather, y, (size_t)R * h, err));
        exec_op_resume(ex, op_index(ex, l, opi, MODEL_BWD));
        y = ex->sp_gather;
    }
    *dy = y;
    return PX_OK;
}

/* The input gradient of a column-parallel layer (QKV, fc1) in ws.dhid is partial: all-reduce
 * it (the f operator), or reduce-scatter it into ws.dx_a's region. *dn gets where it is. */
static int column_parallel_dx(Exec *ex, int chunk, const char *base, const void **dn,
                              PxError *err)
{
    const int R = ex->d.b * ex->d.s_sp, h = ex->d.h;
    if (sp_on(ex)) {
        TRY(tp_reduce_scatter(ex, chunk, MODEL_BWD, base, ex->ws_dx_a, ex->ws_dhid, (size_t)R * h,
                              err));
        *dn = ex->ws_dx_a;
        return PX_OK;
    }
    TRY(tp_allreduce(ex, chunk, MODEL_BWD, base, ex->ws_dhid, (size_t)R * h, err));
    *dn = ex->ws_dhid;
    return PX_OK;
}

/* Backward of layer l: dres holds the gradient of the layer's output (this rank's region) and
 * leaves with the gradient of its input. */
static int layer_bwd(Exec *ex, int chunk, int l, const ExecLayerActs *a, void *dres, int mb,
                     PxError *err)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const ModelConfig *c = &ex->spec.model;
    const ExecLayerParams *w = &ex->lw[l];
    const ExecLayerGrads *g = &ex->lg[l];
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int F = d->ffn_loc, FO = d->ffn_out_loc, sp = sp_on(ex);
    char base[48];

    /* the recomputed layer's output is scratch: ws.out, or with SP (where ws.out feeds the
     * reduce-scatter) ws.dx_a, free until this layer's backward uses it */
    if (ex->spec.layout.recompute == MODEL_RECOMPUTE_FULL)
        TRY(layer_fwd(ex, chunk, l, a, sp ? ex->ws_dx_a : ex->ws_out, MODEL_RECOMPUTE, mb, err));

    /* fc2: dropout, bias, dgrad into the activation's output gradient, wgrad */
    exec_op_begin(ex, op_index(ex, l, EX_FC2, MODEL_BWD));
    const void *dy;
    snprintf(base, sizeof base, "layer.%d.mlp.fc2", l);
    TRY(row_parallel_dy(ex, chunk, base, dres, a->mlp_drop_mask, l, EX_FC2, &dy, err));
    if (g->fc2_b)
        k->bias_grad(g->fc2_b, dy, N, h);
    void *dact = c->mlp == MODEL_SWIGLU ? ex->ws_dact : ex->ws_dffn;
    mm_act(ex, dact, dy, w->fc2_w, N, F, h, 0, 0);
    mm_f32(ex, g->fc2_w, dy, a->fc2_in, h, F, N, 1, 0, 1);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_ACT, MODEL_BWD));
    if (c->mlp == MODEL_SWIGLU)
        k->swiglu_bwd(ex->ws_dffn, a->act_in, ex->ws_dact, N, F);
    else
        k->gelu_bwd(ex->ws_dffn, a->act_in, ex->ws_dffn, (size_t)N * F);
    exec_op_end(ex);

    const void *x = a->fc1_in;
    snprintf(base, sizeof base, "layer.%d.mlp.fc1", l);
    if (sp) {
        TRY(tp_all_gather(ex, chunk, MODEL_BWD, base, ex->sp_gather, a->fc1_in, (size_t)R * h, err));
        x = ex->sp_gather;
    }
    exec_op_begin(ex, op_index(ex, l, EX_FC1, MODEL_BWD));
    if (g->fc1_b)
        k->bias_grad(g->fc1_b, ex->ws_dffn, N, FO);
    mm_act(ex, ex->ws_dhid, ex->ws_dffn, w->fc1_w, N, h, FO, 0, 0);
    mm_f32(ex, g->fc1_w, ex->ws_dffn, x, FO, h, N, 1, 0, 1);
    exec_op_end(ex);
    const void *dn;
    TRY(column_parallel_dx(ex, chunk, base, &dn, err));

    exec_op_begin(ex, op_index(ex, l, EX_LN2, MODEL_BWD));
    norm_bwd(ex, dres, g->ln2_w, g->ln2_b, dn, a->ln2_in, w->ln2_w, R);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_PROJ, MODEL_BWD));
    snprintf(base, sizeof base, "layer.%d.attn.proj", l);
    TRY(row_parallel_dy(ex, chunk, base, dres, a->attn_drop_mask, l, EX_PROJ, &dy, err));
    if (g->proj_b)
        k->bias_grad(g->proj_b, dy, N, h);
    mm_act(ex, ex->ws_dhid, dy, w->proj_w, N, d->q_loc, h, 0, 0);
    mm_f32(ex, g->proj_w, dy, a->proj_in, h, d->q_loc, N, 1, 0, 1);
    exec_op_end(ex);

    /* Selective recompute re-creates the softmax (and its dropout) just before the core's
     * backward; the output it recomputes is not needed and lands in ws.dqkv, which the
     * backward then overwrites. */
    if (ex->spec.layout.recompute == MODEL_RECOMPUTE_SELECTIVE && !ex->spec.job.flash_attn) {
        exec_op_begin(ex, op_index(ex, l, EX_CORE, MODEL_RECOMPUTE));
        attention_core_fwd(ex, a, ex->ws_dqkv, mb, l);
        exec_op_end(ex);
    }

    exec_op_begin(ex, op_index(ex, l, EX_CORE, MODEL_BWD));
    {
        const int s = d->s, H = d->heads_loc;
        const size_t tile = (size_t)H * s * s;
        for (int q = 0; q < d->b; q++) {
            const void *qb = AT(a->qkv_out, (size_t)q * s * qkv);
            void *dbase = AT(ex->ws_dqkv, (size_t)q * s * qkv);
            KernAttnBwd b = {
                .B = 1, .Tq = s, .Tk = s, .H = H, .KV = d->kv_loc, .D = d->hd,
                .scale = (float)(1.0 / sqrt((double)d->hd)),
                .q = qb, .k = AT(qb, d->q_loc), .v = AT(qb, d->q_loc + d->kv_width_loc),
                .q_stride = qkv, .k_stride = qkv, .v_stride = qkv,
                .dout = AT(ex->ws_dhid, (size_t)q * s * d->q_loc),
                .dq = dbase, .dk = AT(dbase, d->q_loc), .dv = AT(dbase, d->q_loc + d->kv_width_loc),
                .dq_stride = qkv, .dk_stride = qkv, .dv_stride = qkv,
            };
            if (ex->spec.job.flash_attn) {
                b.out = AT(a->proj_in, (size_t)q * s * d->q_loc);
                b.lse = a->lse + (size_t)q * H * s;
                b.drow = ex->ws_flash_d + (size_t)q * H * s;
            } else {
                b.probs = AT(a->softmax, q * tile);
                b.dscores = AT(ex->ws_dscores, q * tile);
                if (ex->attn_dropout) {
                    b.dropout = ex->dropout;
                    b.mask = a->softmax_mask + q * tile;
                    b.probs_drop = AT(a->softmax_drop, q * tile);
                }
            }
            attn_bwd(ex, &b);
        }
    }
    exec_op_end(ex);

    x = a->qkv_in;
    snprintf(base, sizeof base, "layer.%d.attn.qkv", l);
    if (sp) {
        TRY(tp_all_gather(ex, chunk, MODEL_BWD, base, ex->sp_gather, a->qkv_in, (size_t)R * h, err));
        x = ex->sp_gather;
    }
    exec_op_begin(ex, op_index(ex, l, EX_QKV, MODEL_BWD));
    if (c->position == MODEL_POS_ROPE)
        k->rope_bwd(ex->ws_dqkv, d->b, d->s, d->heads_loc, d->kv_loc, d->hd, 0,
                    (float)c->rope_theta);
    if (g->qkv_b)
        k->bias_grad(g->qkv_b, ex->ws_dqkv, N, qkv);
    mm_act(ex, ex->ws_dhid, ex->ws_dqkv, w->qkv_w, N, h, qkv, 0, 0);
    mm_f32(ex, g->qkv_w, ex->ws_dqkv, x, qkv, h, N, 1, 0, 1);
    exec_op_end(ex);
    TRY(column_parallel_dx(ex, chunk, base, &dn, err));

    exec_op_begin(ex, op_index(ex, l, EX_LN1, MODEL_BWD));
    norm_bwd(ex, dres, g->ln1_w, g->ln1_b, dn, a->ln1_in, w->ln1_w, R);
    exec_op_end(ex);
    return PX_OK;
}

/* ---- the embedding and the output layer ---- */

static int embed_fwd(Exec *ex, int chunk, int mb, ExecHeadActs *x, void *x0, const int32_t *tok,
                     PxError *err)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const int b = d->b, s = d->s, h = d->h, row = s + 1, V = d->vocab_loc, R = b * d->s_sp;
    const size_t sh = (size_t)s * h;
    const int sp = sp_on(ex);
    TRY(exec_gather_block(ex, ex->embed_block, MODEL_FWD, 0, err));
    /* vocabulary-parallel: this rank's rows give a partial embedding, summed over TP; the
     * positions are added on one rank only */
    const void *wpe = ex->tp_rank == 0 ? ex->wpe : NULL;
    void *emb = sp || ex->dropout > 0 ? ex->ws_out : x0;
    exec_op_begin(ex, ex->other_op[EX_EMBED][MODEL_FWD]);
    for (int q = 0; q < b; q++)
        k->embedding_fwd(AT(emb, q * sh), tok + (size_t)q * row, ex->wte, wpe, s, s, 0, h,
                         ex->tp_rank * V, V);
    exec_op_end(ex);
    if (sp) {
        TRY(tp_reduce_scatter(ex, chunk, MODEL_FWD, "embed", x0, emb, (size_t)R * h, err));
        emb = x0;
    } else {
        TRY(tp_allreduce(ex, chunk, MODEL_FWD, "embed", emb, (size_t)R * h, err));
    }
    if (ex->dropout > 0) {
        exec_op_resume(ex, ex->other_op[EX_EMBED][MODEL_FWD]);
        dropout_region(ex, x0, x->embed_drop_mask, emb, mb, -1, EXEC_SITE_EMBED);
        exec_op_end(ex);
    }
    return PX_OK;
}

/* The output layer and the vocabulary-parallel cross-entropy of one micro-batch. */
static int head_fwd(Exec *ex, int chunk, ExecHeadActs *x, const int32_t *tok, PxError *err)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const int b = d->b, s = d->s, h = d->h, row = s + 1, V = d->vocab_loc;
    const int N = b * d->s_loc, R = b * d->s_sp, vocab = ex->spec.model.vocab, v0 = ex->tp_rank * V;
    TRY(exec_gather_block(ex, ex->final_block, MODEL_FWD, 0, err));
    exec_op_begin(ex, ex->other_op[EX_FINAL_LN][MODEL_FWD]);
    norm_fwd(ex, x->logits_in, x->final_ln_in, ex->lnf_w, ex->lnf_b, R);
    exec_op_end(ex);
    const void *in = x->logits_in;
    if (sp_on(ex)) {
        TRY(tp_all_gather(ex, chunk, MODEL_FWD, "logits", ex->sp_gather, x->logits_in,
                          (size_t)R * h, err));
        in = ex->sp_gather;
    }
    if (ex->tied_here)
        TRY(exec_gather_block(ex, ex->embed_block, MODEL_FWD, 1, err));

    /* fp32 logits straight into the saved probabilities; columns of the vocabulary padding
     * get -inf, so they take no probability and the loss does not depend on the padding */
    exec_op_begin(ex, ex->other_op[EX_LOGITS][MODEL_FWD]);
    mm_f32(ex, x->probs, in, ex->out_w, N, V, h, 0, 1, 0);
    if (vocab < v0 + V)
        k->fill_cols_f32(x->probs, N, V, vocab > v0 ? vocab - v0 : 0, V, -INFINITY);
    exec_op_end(ex);

    /* cross-entropy in the kernels' steps, the ranks' shards combined between them */
    const int op_loss = ex->other_op[EX_LOSS][MODEL_FWD];
    int op_ar = -1;
    if (ex->d.t > 1 && (op_ar = tp_op(ex, chunk, MODEL_FWD, "loss", MODEL_TP_ALLREDUCE, err)) < 0)
        return PX_ERUNTIME;
    float *rowmax = ex->ws_xent, *rowsum = rowmax + N, *target = rowsum + N, *loss = target + N;
    exec_op_begin(ex, op_loss);
    for (int q = 0; q < b; q++)
        k->xent_rowmax(rowmax + (size_t)q * s, x->probs + (size_t)q * s * V, s, V);
    exec_op_end(ex);
    if (op_ar >= 0) {
        exec_op_begin(ex, op_ar);
        int rc = comm_allreduce(ex->comm, rowmax, (size_t)N, PX_FP32, COMM_MAX,
                                MODEL_TP_ALLREDUCE, NULL, err);
        exec_op_end(ex);
        TRY(rc);
    }
    exec_op_resume(ex, op_loss);
    for (int q = 0; q < b; q++) {
        const size_t o = (size_t)q * s;
        k->xent_expsum(rowsum + o, target + o, x->probs + o * V, rowmax + o,
                       tok + (size_t)q * row + 1, s, V, v0);
    }
    exec_op_end(ex);
    /* the op's calls are the communication calls, as the graph counts them (3 per pass) */
    for (int i = 0; i < 2 && op_ar >= 0; i++) {
        exec_op_begin(ex, op_ar);
        int rc = comm_allreduce(ex->comm, i == 0 ? rowsum : target, (size_t)N, PX_FP32,
                                COMM_SUM, MODEL_TP_ALLREDUCE, NULL, err);
        exec_op_end(ex);
        TRY(rc);
    }
    exec_op_resume(ex, op_loss);
    for (int q = 0; q < b; q++) {
        const size_t o = (size_t)q * s;
        k->xent_finish(loss + o, x->probs + o * V, rowsum + o, rowmax + o, target + o, s, V);
    }
    /* every TP rank has the same losses: one of them reports them */
    if (ex->tp_rank == 0 && ex->cp_rank == 0) {
        k->to_host(ex->host_loss, loss, (size_t)N * sizeof *loss);
        double sum = 0.0;
        for (int n = 0; n < N; n++)
            sum += ex->host_loss[n];
        ex->loss_sum += sum;
    }
    exec_op_end(ex);
    return PX_OK;
}

/* The gradient of the logits, computed in fp32 over the probabilities, in the act dtype for the
 * output layer's GEMMs (cuBLAS takes both operands in one dtype), narrowed in place so that it
 * stays within loss.probs as the tensor table sizes it: element i moves from byte 4i to byte
 * ab*i. A cast of elements [lo, 2lo) writes bytes [2lo, 4lo) (bf16), which hold elements below
 * lo that earlier casts have read, and never its own input (bytes [4lo, 8lo)): so elements 0,
 * [1, 2), [2, 4), [4, 8) ... are each one ordinary cast, 1 + log2(n) calls in stream order. */
static const void *dlogits_act(Exec *ex, float *probs, size_t n)
{
    if (ex->act == PX_FP32 || n == 0)
        return probs;
    ex->k->cast_to_act(probs, probs, 1); /* one element: read, then written, by one thread */
    for (size_t lo = 1; lo < n; lo *= 2)
        ex->k->cast_to_act(AT(probs, lo), probs + lo, (2 * lo < n ? 2 * lo : n) - lo);
    return probs;
}

/* The output layer's weight gradient: dW += dlogits^T x (SP: x re-gathered). The logits'
 * gradient is already in the act dtype (dlogits_act). */
static int logits_wgrad(Exec *ex, int chunk, const ExecHeadActs *x, PxError *err)
{
    const ModelDims *d = &ex->d;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, V = d->vocab_loc, h = d->h;
    const void *in = x->logits_in;
    if (sp_on(ex)) {
        TRY(tp_all_gather(ex, chunk, MODEL_BWD, "logits", ex->sp_gather, x->logits_in,
                          (size_t)R * h, err));
        in = ex->sp_gather;
    }
    exec_op_resume(ex, ex->other_op[EX_LOGITS][MODEL_BWD]);
    mm_f32(ex, ex->g_out_w, x->probs, in, V, h, N, 1, 0, 1);
    exec_op_end(ex);
    return PX_OK;
}

static int head_bwd(Exec *ex, int chunk, const ExecHeadActs *x, const int32_t *tok, void *dres,
                    int last_mb, PxError *err)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const int b = d->b, s = d->s, h = d->h, row = s + 1, V = d->vocab_loc;
    const int N = b * d->s_loc, R = b * d->s_sp;
    /* the loss is the mean over every token of the global batch, times the fp16 loss scale */
    const float dloss = (float)(ex->scaler.scale / ((double)ex->spec.job.global_batch * s));
    exec_bucket_zero(ex, ex->final_block);
    TRY(exec_gather_block(ex, ex->final_block, MODEL_BWD, 0, err));
    if (ex->tied_here)
        TRY(exec_gather_block(ex, ex->embed_block, MODEL_BWD, 0, err));

    exec_op_begin(ex, ex->other_op[EX_LOSS][MODEL_BWD]);
    for (int q = 0; q < b; q++)
        k->xent_bwd(x->probs + (size_t)q * s * V, tok + (size_t)q * row + 1, s, V,
                    ex->tp_rank * V, dloss);
    const void *dlogits = dlogits_act(ex, x->probs, (size_t)N * V);
    exec_op_end(ex);

    /* input gradient now; the weight gradient too, unless the embedding's block must be in
     * the ZeRO bucket to receive it (then just before the embedding's backward) */
    void *dx = sp_on(ex) ? ex->ws_out : ex->ws_dx_a;
    exec_op_begin(ex, ex->other_op[EX_LOGITS][MODEL_BWD]);
    mm_act(ex, dx, dlogits, ex->out_w, N, h, V, 0, 0);
    exec_op_end(ex);
    if (!ex->defer_logits_wgrad)
        TRY(logits_wgrad(ex, chunk, x, err));
    if (sp_on(ex))
        TRY(tp_reduce_scatter(ex, chunk, MODEL_BWD, "logits", ex->ws_dx_a, dx, (size_t)R * h, err));
    else
        TRY(tp_allreduce(ex, chunk, MODEL_BWD, "logits", ex->ws_dx_a, (size_t)R * h, err));

    exec_op_begin(ex, ex->other_op[EX_FINAL_LN][MODEL_BWD]);
    k->memset0(dres, (size_t)R * h * ex->ab);
    norm_bwd(ex, dres, ex->g_lnf_w, ex->g_lnf_b, ex->ws_dx_a, x->final_ln_in, ex->lnf_w, R);
    exec_op_end(ex);
    TRY(exec_bucket_reduce(ex, ex->final_block, err));
    if (last_mb)
        TRY(exec_block_done(ex, ex->final_block, err));
    return PX_OK;
}

static int embed_bwd(Exec *ex, int chunk, const ExecHeadActs *x, const int32_t *tok,
                     const void *dres, int last_mb, PxError *err)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const int b = d->b, s = d->s, h = d->h, row = s + 1, V = d->vocab_loc, R = b * d->s_sp;
    const size_t sh = (size_t)s * h;
    exec_bucket_zero(ex, ex->embed_block);
    if (ex->defer_logits_wgrad)
        TRY(logits_wgrad(ex, chunk, x, err));
    const int op = ex->other_op[EX_EMBED][MODEL_BWD];
    exec_op_begin(ex, op);
    const void *dy = dres;
    if (ex->dropout > 0) {
        void *tmp = sp_on(ex) ? ex->ws_dx_a : ex->ws_out;
        k->dropout_bwd(tmp, dres, x->embed_drop_mask, (size_t)R * h, ex->dropout);
        dy = tmp;
    }
    exec_op_end(ex);
    if (sp_on(ex)) {
        TRY(tp_all_gather(ex, chunk, MODEL_BWD, "embed", ex->sp_gather, dy, (size_t)R * h, err));
        dy = ex->sp_gather;
    }
    TRY(exec_gather_block(ex, ex->embed_block, MODEL_BWD, ex->tied_here ? 1 : 0, err));
    exec_op_resume(ex, op);
    for (int q = 0; q < b; q++)
        k->embedding_bwd(ex->g_wte, ex->g_wpe, AT(dy, q * sh), tok + (size_t)q * row, s, s, 0, h,
                         ex->tp_rank * V, V);
    exec_op_end(ex);
    TRY(exec_bucket_reduce(ex, ex->embed_block, err));
    if (last_mb)
        TRY(exec_block_done(ex, ex->embed_block, err));
    return PX_OK;
}

/* ---- a chunk's passes of one micro-batch ---- */

int exec_forward(Exec *ex, int j, int mb, int slot, int xslot, const int32_t *tok, PxError *err)
{
    const ModelDims *d = &ex->d;
    const int g = ex->chunk_g[j], cl = ex->cl, l0 = ex->chunk_l0[j], last = g == d->chunks - 1;
    ExecLayerActs *A = &ex->acts[(size_t)slot * cl];
    ExecHeadActs *x = ex->n_xslots[j] > 0 ? &ex->xacts[j][xslot] : NULL;
    if (g == 0) {
        TRY(embed_fwd(ex, j, mb, x, A[0].ln1_in, tok, err));
    } else {
        TRY(exec_pp_take(ex, j, mb, 0, A[0].ln1_in, err));
        ex->pass_start = exec_now();
    }
    /* the chunk's output: the output layer's input, or a scratch that is sent on (with SP
     * ws.out feeds the last reduce-scatter, so ws.dx_a holds the region) */
    void *send = sp_on(ex) ? ex->ws_dx_a : ex->ws_out;
    for (int li = 0; li < cl; li++) {
        const int l = l0 + li;
        void *out = li + 1 < cl ? A[li + 1].ln1_in : last ? x->final_ln_in : send;
        TRY(exec_gather_block(ex, block_of_layer(ex, l), MODEL_FWD, 0, err));
        TRY(layer_fwd(ex, j, l, &A[li], out, MODEL_FWD, mb, err));
    }
    if (last)
        return head_fwd(ex, j, x, tok, err);
    return exec_pp_give(ex, j, mb, 0, send, err);
}

int exec_backward(Exec *ex, int j, int mb, int slot, int xslot, const int32_t *tok, int last_mb,
                  PxError *err)
{
    const ModelDims *d = &ex->d;
    const int g = ex->chunk_g[j], cl = ex->cl, l0 = ex->chunk_l0[j];
    ExecLayerActs *A = &ex->acts[(size_t)slot * cl];
    const ExecHeadActs *x = ex->n_xslots[j] > 0 ? &ex->xacts[j][xslot] : NULL;
    void *dres = ex->ws_dx_b;
    if (g == d->chunks - 1) {
        TRY(head_bwd(ex, j, x, tok, dres, last_mb, err));
    } else {
        TRY(exec_pp_take(ex, j, mb, 1, dres, err));
        ex->pass_start = exec_now();
    }
    for (int li = cl - 1; li >= 0; li--) {
        const int l = l0 + li, blk = block_of_layer(ex, l);
        exec_bucket_zero(ex, blk);
        TRY(exec_gather_block(ex, blk, MODEL_BWD, 0, err));
        TRY(layer_bwd(ex, j, l, &A[li], dres, mb, err));
        TRY(exec_bucket_reduce(ex, blk, err));
        if (last_mb)
            TRY(exec_block_done(ex, blk, err));
    }
    if (g == 0)
        return embed_bwd(ex, j, x, tok, dres, last_mb, err);
    return exec_pp_give(ex, j, mb, 1, dres, err);
}
