/* One micro-batch's forward and backward through the kernels of kernels.h, op by op under the
 * op graph's names (model/ops.c lists them in this order).
 *
 * Buffers (docs/memory.md): a layer reads its input from its slot's ln1.in and writes the next
 * layer's ln1.in (the last one final_ln.in); row-parallel outputs pass through ws.out before the
 * residual add; backward keeps the residual-stream gradient in ws.dx_b (the norm backwards add
 * into it, which is the residual branch), and the matmul input gradients in ws.dhid, ws.dqkv,
 * ws.dffn and ws.dact. Sequences are processed one by one where a dropout stream is drawn, so
 * that masks depend on the sequence and not on how sequences are grouped into micro-batches. */
#include <math.h>

#include "exec/internal.h"

/* ---- counted kernel calls ---- */

/* C[m,n] = op(A) op(B) (+ C when accumulate): 2*m*n*k FLOPs, whatever the operands hold. */
static void mm(Exec *ex, float *c, const float *a, const float *b, int m, int n, int k, int ta,
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

static void norm_fwd(const Exec *ex, float *out, const float *inp, const float *w, const float *b,
                     int N)
{
    const ModelConfig *c = &ex->spec.model;
    if (c->norm == MODEL_LAYERNORM)
        ex->k->layernorm_fwd(out, inp, w, b, N, c->hidden, (float)c->norm_eps);
    else
        ex->k->rmsnorm_fwd(out, inp, w, N, c->hidden, (float)c->norm_eps);
}

/* dinp += the norm's input gradient; dw, db += */
static void norm_bwd(const Exec *ex, float *dinp, float *dw, float *db, const float *dout,
                     const float *inp, const float *w, int N)
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

/* out = dropout(x) per sequence (out may alias x) */
static void dropout_rows(Exec *ex, float *out, uint8_t *mask, const float *x, int mb, int layer,
                         int site)
{
    const size_t sh = (size_t)ex->d.s * ex->d.h;
    for (int q = 0; q < ex->d.b; q++)
        ex->k->dropout_fwd(out + q * sh, mask + q * sh, x + q * sh, sh, ex->dropout,
                           drop_seed(ex, seq_index(ex, mb, q), layer, site));
}

static void attention_core_fwd(Exec *ex, const ExecLayerActs *a, float *out, int mb, int l)
{
    const ModelDims *d = &ex->d;
    const int s = d->s, H = d->heads_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const size_t tile = (size_t)H * s * s;
    for (int q = 0; q < d->b; q++) {
        const float *base = a->qkv_out + (size_t)q * s * qkv;
        KernAttnFwd f = {
            .B = 1, .Tq = s, .Tk = s, .H = H, .KV = d->kv_loc, .D = d->hd,
            .scale = (float)(1.0 / sqrt((double)d->hd)),
            .q = base, .k = base + d->q_loc, .v = base + d->q_loc + d->kv_width_loc,
            .q_stride = qkv, .k_stride = qkv, .v_stride = qkv,
            .out = out + (size_t)q * s * d->q_loc,
        };
        if (ex->spec.job.flash_attn) {
            f.lse = a->lse + (size_t)q * H * s;
        } else {
            f.probs = a->softmax + q * tile;
            if (ex->attn_dropout) {
                f.dropout = ex->dropout;
                f.seed = drop_seed(ex, seq_index(ex, mb, q), l, EXEC_SITE_ATTN);
                f.mask = a->softmax_mask + q * tile;
                f.probs_drop = a->softmax_drop + q * tile;
            }
        }
        attn_fwd(ex, &f);
    }
}

/* ---- a transformer layer ---- */

/* Forward of layer l from a->ln1_in; the output (input plus both residual branches) goes to
 * out. phase MODEL_RECOMPUTE re-creates the tensors of a that the recompute mode did not save
 * (out is then scratch). */
static void layer_fwd(Exec *ex, int l, const ExecLayerActs *a, float *out, ModelPhase phase,
                      int mb)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const ModelConfig *c = &ex->spec.model;
    const ExecLayerParams *w = &ex->lw[l];
    const int N = d->b * d->s, h = d->h, qkv = d->q_loc + 2 * d->kv_width_loc;

    exec_op_begin(ex, op_index(ex, l, EX_LN1, phase));
    norm_fwd(ex, a->qkv_in, a->ln1_in, w->ln1_w, w->ln1_b, N);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_QKV, phase));
    mm(ex, a->qkv_out, a->qkv_in, w->qkv_w, N, qkv, h, 0, 1, 0);
    if (w->qkv_b)
        k->add_bias(a->qkv_out, w->qkv_b, N, qkv);
    if (c->position == MODEL_POS_ROPE)
        k->rope_fwd(a->qkv_out, d->b, d->s, d->heads_loc, d->kv_loc, d->hd, 0, (float)c->rope_theta);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_CORE, phase));
    attention_core_fwd(ex, a, a->proj_in, mb, l);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_PROJ, phase));
    mm(ex, ex->ws_out, a->proj_in, w->proj_w, N, h, d->q_loc, 0, 1, 0);
    if (w->proj_b)
        k->add_bias(ex->ws_out, w->proj_b, N, h);
    if (ex->dropout > 0)
        dropout_rows(ex, ex->ws_out, a->attn_drop_mask, ex->ws_out, mb, l, EXEC_SITE_ATTN_OUT);
    k->add(a->ln2_in, a->ln1_in, ex->ws_out, (size_t)N * h);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_LN2, phase));
    norm_fwd(ex, a->fc1_in, a->ln2_in, w->ln2_w, w->ln2_b, N);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_FC1, phase));
    mm(ex, a->act_in, a->fc1_in, w->fc1_w, N, d->ffn_out_loc, h, 0, 1, 0);
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
    mm(ex, ex->ws_out, a->fc2_in, w->fc2_w, N, h, d->ffn_loc, 0, 1, 0);
    if (w->fc2_b)
        k->add_bias(ex->ws_out, w->fc2_b, N, h);
    if (ex->dropout > 0)
        dropout_rows(ex, ex->ws_out, a->mlp_drop_mask, ex->ws_out, mb, l, EXEC_SITE_MLP_OUT);
    k->add(out, a->ln2_in, ex->ws_out, (size_t)N * h);
    exec_op_end(ex);
}

/* Backward of layer l: dres holds the gradient of the layer's output and leaves with the
 * gradient of its input. */
static void layer_bwd(Exec *ex, int l, const ExecLayerActs *a, float *dres, int mb)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const ModelConfig *c = &ex->spec.model;
    const ExecLayerParams *w = &ex->lw[l];
    const ExecLayerParams *g = &ex->lg[l];
    const int N = d->b * d->s, h = d->h, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int F = d->ffn_loc, FO = d->ffn_out_loc;

    if (ex->spec.layout.recompute == MODEL_RECOMPUTE_FULL)
        layer_fwd(ex, l, a, ex->ws_out, MODEL_RECOMPUTE, mb);

    /* fc2: dropout, bias, dgrad into the activation's output gradient, wgrad */
    exec_op_begin(ex, op_index(ex, l, EX_FC2, MODEL_BWD));
    const float *dy = dres;
    if (ex->dropout > 0) {
        k->dropout_bwd(ex->ws_out, dres, a->mlp_drop_mask, (size_t)N * h, ex->dropout);
        dy = ex->ws_out;
    }
    if (g->fc2_b)
        k->bias_grad(g->fc2_b, dy, N, h);
    float *dact = c->mlp == MODEL_SWIGLU ? ex->ws_dact : ex->ws_dffn;
    mm(ex, dact, dy, w->fc2_w, N, F, h, 0, 0, 0);
    mm(ex, g->fc2_w, dy, a->fc2_in, h, F, N, 1, 0, 1);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_ACT, MODEL_BWD));
    if (c->mlp == MODEL_SWIGLU)
        k->swiglu_bwd(ex->ws_dffn, a->act_in, ex->ws_dact, N, F);
    else
        k->gelu_bwd(ex->ws_dffn, a->act_in, ex->ws_dffn, (size_t)N * F);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_FC1, MODEL_BWD));
    if (g->fc1_b)
        k->bias_grad(g->fc1_b, ex->ws_dffn, N, FO);
    mm(ex, ex->ws_dhid, ex->ws_dffn, w->fc1_w, N, h, FO, 0, 0, 0);
    mm(ex, g->fc1_w, ex->ws_dffn, a->fc1_in, FO, h, N, 1, 0, 1);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_LN2, MODEL_BWD));
    norm_bwd(ex, dres, g->ln2_w, g->ln2_b, ex->ws_dhid, a->ln2_in, w->ln2_w, N);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_PROJ, MODEL_BWD));
    dy = dres;
    if (ex->dropout > 0) {
        k->dropout_bwd(ex->ws_out, dres, a->attn_drop_mask, (size_t)N * h, ex->dropout);
        dy = ex->ws_out;
    }
    if (g->proj_b)
        k->bias_grad(g->proj_b, dy, N, h);
    mm(ex, ex->ws_dhid, dy, w->proj_w, N, d->q_loc, h, 0, 0, 0);
    mm(ex, g->proj_w, dy, a->proj_in, h, d->q_loc, N, 1, 0, 1);
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
            const float *base = a->qkv_out + (size_t)q * s * qkv;
            float *dbase = ex->ws_dqkv + (size_t)q * s * qkv;
            KernAttnBwd b = {
                .B = 1, .Tq = s, .Tk = s, .H = H, .KV = d->kv_loc, .D = d->hd,
                .scale = (float)(1.0 / sqrt((double)d->hd)),
                .q = base, .k = base + d->q_loc, .v = base + d->q_loc + d->kv_width_loc,
                .q_stride = qkv, .k_stride = qkv, .v_stride = qkv,
                .dout = ex->ws_dhid + (size_t)q * s * d->q_loc,
                .dq = dbase, .dk = dbase + d->q_loc, .dv = dbase + d->q_loc + d->kv_width_loc,
                .dq_stride = qkv, .dk_stride = qkv, .dv_stride = qkv,
            };
            if (ex->spec.job.flash_attn) {
                b.out = a->proj_in + (size_t)q * s * d->q_loc;
                b.lse = a->lse + (size_t)q * H * s;
                b.drow = ex->ws_flash_d + (size_t)q * H * s;
            } else {
                b.probs = a->softmax + q * tile;
                b.dscores = ex->ws_dscores + q * tile;
                if (ex->attn_dropout) {
                    b.dropout = ex->dropout;
                    b.mask = a->softmax_mask + q * tile;
                    b.probs_drop = a->softmax_drop + q * tile;
                }
            }
            attn_bwd(ex, &b);
        }
    }
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_QKV, MODEL_BWD));
    if (c->position == MODEL_POS_ROPE)
        k->rope_bwd(ex->ws_dqkv, d->b, d->s, d->heads_loc, d->kv_loc, d->hd, 0,
                    (float)c->rope_theta);
    if (g->qkv_b)
        k->bias_grad(g->qkv_b, ex->ws_dqkv, N, qkv);
    mm(ex, ex->ws_dhid, ex->ws_dqkv, w->qkv_w, N, h, qkv, 0, 0, 0);
    mm(ex, g->qkv_w, ex->ws_dqkv, a->qkv_in, qkv, h, N, 1, 0, 1);
    exec_op_end(ex);

    exec_op_begin(ex, op_index(ex, l, EX_LN1, MODEL_BWD));
    norm_bwd(ex, dres, g->ln1_w, g->ln1_b, ex->ws_dhid, a->ln1_in, w->ln1_w, N);
    exec_op_end(ex);
}

/* ---- a micro-batch ---- */

void exec_forward(Exec *ex, int mb, int slot, int xslot, const int32_t *tok, double *loss_sum)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const int L = ex->spec.model.layers, b = d->b, s = d->s, h = d->h, row = s + 1;
    const int N = b * s, V = d->vocab_loc, vocab = ex->spec.model.vocab;
    const size_t sh = (size_t)s * h;
    ExecLayerActs *A = &ex->acts[(size_t)slot * L];
    ExecHeadActs *x = &ex->xacts[xslot];
    float *x0 = L > 0 ? A[0].ln1_in : x->final_ln_in;

    exec_op_begin(ex, ex->other_op[EX_EMBED][MODEL_FWD]);
    float *emb = ex->dropout > 0 ? ex->ws_out : x0;
    for (int q = 0; q < b; q++)
        k->embedding_fwd(emb + q * sh, tok + (size_t)q * row, ex->wte, ex->wpe, s, s, 0, h, 0, V);
    if (ex->dropout > 0)
        dropout_rows(ex, x0, x->embed_drop_mask, emb, mb, -1, EXEC_SITE_EMBED);
    exec_op_end(ex);

    for (int l = 0; l < L; l++)
        layer_fwd(ex, l, &A[l], l + 1 < L ? A[l + 1].ln1_in : x->final_ln_in, MODEL_FWD, mb);

    exec_op_begin(ex, ex->other_op[EX_FINAL_LN][MODEL_FWD]);
    norm_fwd(ex, x->logits_in, x->final_ln_in, ex->lnf_w, ex->lnf_b, N);
    exec_op_end(ex);

    /* fp32 logits straight into the saved probabilities; columns of the vocabulary padding
     * get -inf, so they take no probability and the loss does not depend on the padding */
    exec_op_begin(ex, ex->other_op[EX_LOGITS][MODEL_FWD]);
    mm(ex, x->probs, x->logits_in, ex->out_w, N, V, h, 0, 1, 0);
    if (vocab < V)
        for (int n = 0; n < N; n++)
            for (int v = vocab; v < V; v++)
                x->probs[(size_t)n * V + v] = -INFINITY;
    exec_op_end(ex);

    exec_op_begin(ex, ex->other_op[EX_LOSS][MODEL_FWD]);
    float *rowmax = ex->ws_xent, *rowsum = rowmax + N, *target = rowsum + N, *loss = target + N;
    for (int q = 0; q < b; q++) {
        const size_t o = (size_t)q * s;
        float *p = x->probs + o * V;
        const int32_t *tgt = tok + (size_t)q * row + 1;
        k->xent_rowmax(rowmax + o, p, s, V);
        k->xent_expsum(rowsum + o, target + o, p, rowmax + o, tgt, s, V, 0);
        k->xent_finish(loss + o, p, rowsum + o, rowmax + o, target + o, s, V);
    }
    double sum = 0.0;
    for (int n = 0; n < N; n++)
        sum += loss[n];
    *loss_sum += sum;
    exec_op_end(ex);
}

void exec_backward(Exec *ex, int mb, int slot, int xslot, const int32_t *tok)
{
    const KernBackend *k = ex->k;
    const ModelDims *d = &ex->d;
    const int L = ex->spec.model.layers, b = d->b, s = d->s, h = d->h, row = s + 1;
    const int N = b * s, V = d->vocab_loc;
    const size_t sh = (size_t)s * h;
    ExecLayerActs *A = &ex->acts[(size_t)slot * L];
    ExecHeadActs *x = &ex->xacts[xslot];
    /* the loss is the mean over every token of the global batch */
    const float dloss = (float)(1.0 / ((double)ex->spec.job.global_batch * s));

    exec_op_begin(ex, ex->other_op[EX_LOSS][MODEL_BWD]);
    for (int q = 0; q < b; q++)
        k->xent_bwd(x->probs + (size_t)q * s * V, tok + (size_t)q * row + 1, s, V, 0, dloss);
    exec_op_end(ex);

    exec_op_begin(ex, ex->other_op[EX_LOGITS][MODEL_BWD]);
    mm(ex, ex->ws_dx_a, x->probs, ex->out_w, N, h, V, 0, 0, 0);
    mm(ex, ex->g_out_w, x->probs, x->logits_in, V, h, N, 1, 0, 1);
    exec_op_end(ex);

    float *dres = ex->ws_dx_b;
    exec_op_begin(ex, ex->other_op[EX_FINAL_LN][MODEL_BWD]);
    k->memset0(dres, (size_t)N * h * sizeof *dres);
    norm_bwd(ex, dres, ex->g_lnf_w, ex->g_lnf_b, ex->ws_dx_a, x->final_ln_in, ex->lnf_w, N);
    exec_op_end(ex);

    for (int l = L - 1; l >= 0; l--)
        layer_bwd(ex, l, &A[l], dres, mb);

    exec_op_begin(ex, ex->other_op[EX_EMBED][MODEL_BWD]);
    const float *dy = dres;
    if (ex->dropout > 0) {
        k->dropout_bwd(ex->ws_out, dres, x->embed_drop_mask, (size_t)N * h, ex->dropout);
        dy = ex->ws_out;
    }
    for (int q = 0; q < b; q++)
        k->embedding_bwd(ex->g_wte, ex->g_wpe, dy + q * sh, tok + (size_t)q * row, s, s, 0, h, 0, V);
    exec_op_end(ex);
}
