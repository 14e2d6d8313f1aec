/* Multi-token prediction modules (DeepSeek-V3 technical report sec. 2.2; Megatron-Core's
 * MultiTokenPredictionBlock), op by op as model/ops.c lists them (mtp_module_pass,
 * mtp_head_pass): on the loss's chunk after the main loss, or on a stage of their own (a layout
 * string's m before L) whose transfer to the loss stage carries the main hidden state and their
 * outputs. Module k (1 .. D, model layer layers + k - 1) takes the previous depth's hidden state
 * (the main model's last hidden state before its final norm for k = 1) and the embedding of the
 * tokens k places on, norms each (hnorm, enorm: the model's norm, RMSNorm in DeepSeek-V3),
 * concatenates them [embedding | hidden] (2h, mtp.eh.in, saved) and projects them to h (eh),
 * runs one transformer layer, its own final norm, the shared output layer and a cross-entropy
 * against the tokens k + 1 places on. The last k positions of a sequence have no such target:
 * they are masked, as Megatron-Core rolls the labels and the loss mask, and each module's loss
 * is the mean over its s - k targets of every sequence (the masks by global position: under
 * context parallelism only the sequence's last chunk has masked rows, and the tokens past a
 * chunk come from its lookahead, mtp_tokens.c). The objective adds EXEC_MTP_LOSS_SCALE times
 * the modules' mean loss to the main loss.
 *
 * Buffers (the memory table's, nothing of its own): the module's layer saves its tensors in
 * the chunk's layer set after the chunk's layers; mtp.N.final_ln.in holds the module's output,
 * mtp.N.logits.in its final norm's, mtp.N.loss.probs the fp32 logits and then their gradient;
 * under ZeRO-2/3 mtp.N.final_ln.in, spent after the final norm's backward, holds that norm's
 * weight gradient through the layer's backward (a MoE layer's clears the bucket, module_bwd).
 * The forward embeds into ws.out; the backward keeps eh.in's gradient in ws.dffn (or ws.dqkv,
 * whichever holds b x s x 2h), looks the shifted tokens up again into ws.out for enorm's
 * backward (its input is not saved; under tensor parallelism each rank looks up its vocabulary
 * shard's rows: with SP it runs enorm's backward on those, eh_bwd_sp; without, the shards'
 * rows are summed as in the forward, eh_bwd), and leaves the gradient of the hidden state it
 * read in its own mtp.N.final_ln.in, spent by then, where the depth before it (or the main
 * loss's backward) adds it. Under ZeRO-2 the module's own block's gradients are reduced at the
 * end of its backward, and its contributions to the output layer's and the embedding's wait
 * for those blocks' windows (mtp_tokens.c, exec_mtp_deferred). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "exec/train/internal.h"

#define TRY EXEC_TRY

#define AT(p, i) EXEC_AT(p, i, r->c->ab)

/* C[m,n] = op(A) op(B) into a tensor of type ct (act, fp32, or a weight gradient's c->grad),
 * accumulated or not. */
static void mm(const ExecLayerRun *r, void *c, PxDtype ct, const void *a, const void *b, int m,
               int n, int k, int ta, int tb, int accumulate)
{
    r->c->k->matmul(c, ct, a, b, m, n, k, ta, tb, 1.0f, accumulate ? 1.0f : 0.0f);
    exec_meter_flops(r->M, 2.0 * m * n * k);
}

/* The model's norm over R rows of h from in (packed) into out (rows ld_out apart): one call
 * when out is packed too, else one a row (eh.in's halves). */
static void norm_rows(const ExecLayerRun *r, void *out, int ld_out, const void *in, const void *w,
                      int R)
{
    const ModelConfig *m = &r->c->spec.model;
    const KernBackend *k = r->c->k;
    const int h = m->hidden, rows = ld_out == h ? R : 1;
    for (int i = 0; i < R; i += rows) {
        void *o = AT(out, (size_t)i * ld_out);
        const void *x = AT(in, (size_t)i * h);
        if (m->norm == MODEL_LAYERNORM)
            k->layernorm_fwd(o, x, w, NULL, rows, h, (float)m->norm_eps);
        else
            k->rmsnorm_fwd(o, x, w, rows, h, (float)m->norm_eps);
    }
}

/* Its backward: din += the input's gradient, dw += the weight's, from dout (rows ld apart). */
static void norm_rows_bwd(const ExecLayerRun *r, void *din, float *dw, const void *dout, int ld,
                          const void *in, const void *w, int R)
{
    const ModelConfig *m = &r->c->spec.model;
    const KernBackend *k = r->c->k;
    const int h = m->hidden, rows = ld == h ? R : 1;
    for (int i = 0; i < R; i += rows) {
        void *dx = AT(din, (size_t)i * h);
        const void *dy = AT(dout, (size_t)i * ld), *x = AT(in, (size_t)i * h);
        if (m->norm == MODEL_LAYERNORM)
            k->layernorm_bwd(dx, dw, NULL, dy, x, w, rows, h, (float)m->norm_eps);
        else
            k->rmsnorm_bwd(dx, dw, dy, x, w, rows, h, (float)m->norm_eps);
    }
}

/* rows of width elements from src (rows ld_src apart) to dst (ld_dst apart), one copy a row */
static void copy_rows(const ExecLayerRun *r, void *dst, int ld_dst, const void *src, int ld_src,
                      int rows, int width)
{
    for (int i = 0; i < rows; i++)
        r->c->k->copy(AT(dst, (size_t)i * ld_dst), AT(src, (size_t)i * ld_src),
                      (size_t)width * r->c->ab);
}

/* The op of `role` at module layer l: the module's own (MODEL_OPR_MTP, found by key) or its
 * layer's final norm, output layer and loss (meter.c files them under the layer). */
static int open_op(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, ModelPhase ph,
                   int *op, PxError *err)
{
    if (role == MODEL_OPR_MTP)
        TRY(exec_meter_need(r->M, r->c, role, l, chunk, ph, MODEL_COMM_COUNT, 0,
                            "prediction module's mtp op", op, err));
    else if ((*op = exec_meter_layer_op(r->M, l, role, ph)) < 0)
        return exec_meter_missing(r->c, "prediction module's output layer op", err);
    exec_meter_open(r->M, r->c->k, *op);
    return PX_OK;
}

/* ---- the module and its loss, forward ---- */

/* eh.in gathered over the sequence, and later its gradient ([b*s, 2h]): a layer's backward
 * scratch, free while a module's own op runs: ws.dqkv where only the attention's is 2h wide,
 * else ws.dffn, which the table makes at least 2h wide then (model/tensors.c, add_workspace). */
static void *eh_grad_buf(const ExecLayerRun *r)
{
    const ModelDims *d = &r->c->d;
    return d->ffn_out_loc < 2 * d->h && d->q_loc + d->kv2_loc >= 2 * d->h ? r->W->dqkv
                                                                          : r->W->dffn;
}

/* ZeRO-3: the module's blocks (its layer's, and a MoE layer's experts') gathered before its
 * forward and before its backward (DeepSpeed's with full recompute: for the recomputed forward,
 * and again in the layer's backward, layers.c), or, kept from the forward
 * (--no-reshard-after-forward), pointed at. `which`: 1 the layer's block, 2 the experts', 3
 * both, the experts' first. Released gathers share the ring's slots, two with experts: the
 * forward gathers the embedding (its lookup), then the layer's block (eh), then the experts'
 * into the embedding's spent slot; the backward the experts' before the layer's block, so that
 * the embedding's gather for enorm's backward takes the experts' spent slot. */
static int gather_module(const ExecLayerRun *r, int l, ModelPhase ph, int which, PxError *err)
{
    if (ph == MODEL_BWD && exec_zero_twice_gathered(r->c))
        ph = MODEL_RECOMPUTE;
    if (which & 2)
        TRY(exec_zero_gather(r->Z, r->c, r->P, r->M, r->P->expert_block[l], ph, 0, err));
    return which & 1 ? exec_zero_gather(r->Z, r->c, r->P, r->M, r->P->layer_block[l], ph, 0, err)
                     : PX_OK;
}

/* Module i's gather of the embedding (embed: its shifted tokens' lookup) or of the output
 * layer's block (its head: the embedding's when tied) for `ph`, as the op graph lists the
 * block's gathers of that phase: the forward's after the main model's (the embedding's and,
 * tied, the head's), module by module, each module's lookup before its head's; the backward's
 * from the last module down, each head's before its module's lookup, then the main model's. */
static int regather(const ExecLayerRun *r, int i, int embed, ModelPhase ph, PxError *err)
{
    const ExecCtx *c = r->c;
    if (!exec_mtp_regathers(c))
        return PX_OK;
    const int tied = c->g.tied_here, D = c->spec.model.mtp_layers;
    const int b = embed || tied ? r->P->embed_block : r->P->final_block;
    int occ;
    if (ph == MODEL_FWD)
        occ = tied ? 2 + 2 * i + !embed : 1 + i;
    else
        occ = tied ? 2 * (D - 1 - i) + embed : D - 1 - i;
    return exec_zero_gather(r->Z, c, r->P, r->M, b, ph, occ, err);
}

static int module_fwd(const ExecLayerRun *r, int chunk, int i, const ExecLayerActs *a,
                      const void *hid, const int32_t *tok, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int l = c->spec.model.layers + i, h = d->h, N = d->b * d->s_loc, R = d->b * d->s_sp;
    const ExecLayerParams *w = &r->P->lw[l];
    void *ehin = a->t[EXEC_MTP_ACT];
    const int t = d->t, hl = h / t;
    int op;
    TRY(regather(r, i, 1, MODEL_FWD, err));
    TRY(gather_module(r, l, MODEL_FWD, 1, err));
    TRY(open_op(r, chunk, l, MODEL_OPR_MTP, MODEL_FWD, &op, err));
    /* vocabulary-parallel: the shards' partial embeddings summed, this rank's rows kept */
    exec_mtp_embed_shifted(r, r->W->out, tok, mb, i + 1);
    void *emb = r->W->out;
    const int sp = exec_sp_on(c);
    if (sp) {
        TRY(exec_tp_reduce_scatter(r, MODEL_OPR_MTP, l, chunk, MODEL_FWD, r->W->dx_a, emb,
                                   (size_t)R * h, err));
        emb = r->W->dx_a;
    } else {
        TRY(exec_tp_allreduce(r, MODEL_OPR_MTP, l, chunk, MODEL_FWD, emb, (size_t)N * h, err));
    }
    norm_rows(r, ehin, 2 * h, emb, EXEC_LPT(w, ENORM_W), R);
    norm_rows(r, AT(ehin, h), 2 * h, hid, EXEC_LPT(w, HNORM_W), R);
    if (t == 1) {
        mm(r, EXEC_LA(a, LN1_IN), c->act, ehin, EXEC_LPT(w, EH_W), N, h, 2 * h, 0, 1, 0);
        exec_meter_close(r->M, c->k, op);
        return PX_OK;
    }
    /* column-parallel eh over the whole sequence's input (with SP gathered first), its output
     * columns gathered and this rank's rows of them kept (with SP the layer's input is
     * sequence-parallel; without, every rank's rows are all of them, the gather in ws.dx_a,
     * free in this forward) */
    void *full = sp ? eh_grad_buf(r) : ehin, *gat = sp ? r->W->sp_gather : r->W->dx_a;
    if (sp)
        TRY(exec_tp_all_gather(r, MODEL_OPR_MTP, l, chunk, MODEL_FWD, full, ehin,
                               (size_t)R * 2 * h, err));
    mm(r, r->W->out, c->act, full, EXEC_LPT(w, EH_W), N, hl, 2 * h, 0, 1, 0);
    TRY(exec_tp_all_gather(r, MODEL_OPR_MTP, l, chunk, MODEL_FWD, gat, r->W->out, (size_t)N * hl,
                           err));
    const size_t row0 = sp ? (size_t)c->g.tp_rank * R : 0;
    for (int q = 0; q < t; q++)
        copy_rows(r, AT(EXEC_LA(a, LN1_IN), q * hl), h, AT(gat, ((size_t)q * N + row0) * hl), hl,
                  R, hl);
    exec_meter_close(r->M, c->k, op);
    return PX_OK;
}

/* Module i's loss over the fp32 logits in probs: the rows with a target (the sequence's first
 * s - k positions) as the main loss's cross-entropy, the others' probabilities zeroed (no
 * gradient); its share of the modules' loss into the pass (each cp rank its positions'). */
static int module_loss(const ExecLayerRun *r, int chunk, int i, float *probs, const int32_t *tok,
                       int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const int l = c->spec.model.layers + i, K = i + 1, s = d->s, V = d->vocab_loc;
    const int N = d->b * d->s_loc, n = s - K > 0 ? s - K : 0, v0 = c->g.tp_rank * V;
    const int C = exec_cp_part_len(c), P = exec_cp_parts(c);
    float *rowmax = r->W->xent, *rowsum = rowmax + N, *target = rowsum + N, *loss = target + N;
    ExecMtpTokRun run[2];
    int op;
    TRY(open_op(r, chunk, l, MODEL_OPR_LOSS, MODEL_FWD, &op, err));
    k->xent_rowmax(rowmax, probs, N, V);
    TRY(exec_tp_allreduce_f32(r, MODEL_OPR_LOSS, l, chunk, MODEL_FWD, rowmax, (size_t)N, COMM_MAX,
                              err));
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < P; j++) {
            const size_t o = (size_t)q * d->s_loc + (size_t)j * C;
            for (int u = exec_mtp_tok_runs(r, tok, mb, q, j, K + 1, exec_mtp_part_count(c, j, K), run) - 1; u >= 0;
                 u--) {
                const size_t ou = o + (size_t)run[u].at;
                k->xent_expsum(rowsum + ou, target + ou, probs + ou * V, rowmax + ou, run[u].tok,
                               run[u].n, V, v0);
            }
        }
    TRY(exec_tp_allreduce_f32(r, MODEL_OPR_LOSS, l, chunk, MODEL_FWD, rowsum, (size_t)N, COMM_SUM,
                              err));
    TRY(exec_tp_allreduce_f32(r, MODEL_OPR_LOSS, l, chunk, MODEL_FWD, target, (size_t)N, COMM_SUM,
                              err));
    double sum = 0.0;
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < P; j++) {
            const size_t o = (size_t)q * d->s_loc + (size_t)j * C;
            const int nt = exec_mtp_part_count(c, j, K);
            if (nt > 0)
                k->xent_finish(loss + o, probs + o * V, rowsum + o, rowmax + o, target + o, nt, V);
            k->memset0(probs + (o + (size_t)nt) * V, (size_t)(C - nt) * V * sizeof *probs);
            if (c->g.tp_rank == 0 && nt > 0) {
                k->to_host(r->W->host_loss, loss + o, (size_t)nt * sizeof *loss);
                for (int t = 0; t < nt; t++)
                    sum += r->W->host_loss[t];
            }
        }
    /* the module's mean over its targets, a 1/D share of the modules' mean, in the units of
     * the main loss's sum (which is divided by global_batch x s) */
    if (n > 0)
        r->pass->mtp_loss_sum += sum * s / ((double)n * c->spec.model.mtp_layers);
    exec_meter_close(r->M, k, op);
    return PX_OK;
}

/* Module i's final norm, of its output into out. */
static int final_norm(const ExecLayerRun *r, int chunk, int i, const ExecHeadActs *x, void *out,
                      PxError *err)
{
    const int l = r->c->spec.model.layers + i, R = r->c->d.b * r->c->d.s_sp;
    int op;
    TRY(open_op(r, chunk, l, MODEL_OPR_FINAL_LN, MODEL_FWD, &op, err));
    norm_rows(r, out, r->c->d.h, x->mtp_out[i], EXEC_LPT(&r->P->lw[l], NORM_W), R);
    exec_meter_close(r->M, r->c->k, op);
    return PX_OK;
}

/* The shared output layer and module i's loss, from its final norm's output. */
static int head_fwd(const ExecLayerRun *r, int chunk, int i, ExecHeadActs *x, const int32_t *tok,
                    int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int l = c->spec.model.layers + i, h = d->h, V = d->vocab_loc, vocab = c->spec.model.vocab;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, v0 = c->g.tp_rank * V;
    int op;
    float *probs = (float *)x->mtp_probs[i];
    TRY(regather(r, i, 0, MODEL_FWD, err));
    TRY(open_op(r, chunk, l, MODEL_OPR_LOGITS, MODEL_FWD, &op, err));
    const void *in = x->mtp_logits_in[i];
    if (exec_sp_on(c)) {
        TRY(exec_tp_all_gather(r, MODEL_OPR_LOGITS, l, chunk, MODEL_FWD, r->W->sp_gather, in,
                               (size_t)R * h, err));
        in = r->W->sp_gather;
    }
    mm(r, probs, PX_FP32, in, r->P->out_w, N, V, h, 0, 1, 0);
    if (vocab < v0 + V)
        c->k->fill_cols_f32(probs, N, V, vocab > v0 ? vocab - v0 : 0, V, -INFINITY);
    exec_meter_close(r->M, c->k, op);
    return module_loss(r, chunk, i, probs, tok, mb, err);
}

int exec_mtp_forward(const ExecLayerRun *r, int chunk, int mb, ExecLayerActs *A, ExecHeadActs *x,
                     const int32_t *tok, PxError *err)
{
    const ExecCtx *c = r->c;
    const int D = c->g.chunk_mtp[chunk], cl = c->g.chunk_cl[chunk];
    const int last = c->g.chunk_g[chunk] == c->d.chunks - 1;
    if (last && D == 0) /* the loss stage after the modules' own: their heads alone */
        for (int i = 0; i < c->spec.model.mtp_layers; i++)
            TRY(head_fwd(r, chunk, i, x, tok, mb, err));
    /* on their own stage each module's normed output goes to its place in pp.send, free once
     * the last message has left (under the scatter/gather split normed in ws.out, free until
     * the next module's forward, and this rank's slice of it put there) */
    if (!last && D > 0)
        TRY(exec_pipe_drain(r->pipe, c, err));
    const int split = c->d.pp_split > 1;
    const size_t part = r->pipe->part;
    const void *parts[1 + EXEC_MTP_MAX] = {EXEC_HA(x, FINAL_LN_IN)};
    for (int i = 0; i < D; i++) {
        const ExecLayerActs *a = &A[cl + i];
        const void *hid = i == 0 ? EXEC_HA(x, FINAL_LN_IN) : x->mtp_out[i - 1];
        TRY(module_fwd(r, chunk, i, a, hid, tok, mb, err));
        TRY(gather_module(r, c->spec.model.layers + i, MODEL_FWD, 2, err));
        TRY(exec_layers_one_fwd(r, chunk, c->spec.model.layers + i, a, x->mtp_out[i], mb, err));
        void *place = last ? NULL : EXEC_AT(r->pipe->send, (size_t)(1 + i) * part, c->ab);
        void *out = last ? x->mtp_logits_in[i] : split ? r->W->out : place;
        TRY(final_norm(r, chunk, i, x, out, err));
        if (!last && split)
            c->k->copy(place, AT(out, (size_t)c->g.tp_rank * part), part * c->ab);
        parts[1 + i] = last ? out : place;
        if (last)
            TRY(head_fwd(r, chunk, i, x, tok, mb, err));
    }
    return last || D == 0 ? PX_OK
                          : exec_pipe_give_parts(r->pipe, c, r->M, chunk, mb, 0, parts, 1 + D, err);
}

/* ---- backward ---- */

/* Module i's loss and output layer backward: the gradient of its final norm's output into
 * ws.dx_a, the output layer's weight gradient accumulated. */
static int head_bwd(const ExecLayerRun *r, int chunk, int i, const ExecHeadActs *x,
                    const int32_t *tok, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const int l = c->spec.model.layers + i, K = i + 1, s = d->s, h = d->h, V = d->vocab_loc;
    const int N = d->b * d->s_loc, n = s - K > 0 ? s - K : 0, C = exec_cp_part_len(c);
    /* the module's mean over its targets of every sequence of the global batch, a 1/D share of
     * the modules' loss, times its weight in the objective and the fp16 loss scale */
    const float dloss =
        n > 0 ? (float)(r->pass->loss_scale * EXEC_MTP_LOSS_SCALE /
                        ((double)c->spec.model.mtp_layers * c->spec.job.global_batch * n))
              : 0.0f;
    float *probs = (float *)x->mtp_probs[i];
    ExecMtpTokRun run[2];
    int op;
    TRY(regather(r, i, 0, MODEL_BWD, err));
    TRY(open_op(r, chunk, l, MODEL_OPR_LOSS, MODEL_BWD, &op, err));
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++) {
            const size_t o = (size_t)q * d->s_loc + (size_t)j * C;
            for (int u = exec_mtp_tok_runs(r, tok, mb, q, j, K + 1, exec_mtp_part_count(c, j, K), run) - 1; u >= 0;
                 u--)
                k->xent_bwd(probs + (o + (size_t)run[u].at) * V, run[u].tok, run[u].n, V,
                            c->g.tp_rank * V, dloss);
        }
    const void *dlogits = exec_layers_dlogits_act(r, probs, (size_t)N * V);
    exec_meter_close(r->M, k, op);

    TRY(open_op(r, chunk, l, MODEL_OPR_LOGITS, MODEL_BWD, &op, err));
    const int sp = exec_sp_on(c), R = d->b * d->s_sp;
    void *dx = sp ? r->W->out : r->W->dx_a;
    mm(r, dx, c->act, dlogits, r->P->out_w, N, h, V, 0, 0, 0);
    if (!exec_mtp_deferred(c))
        TRY(exec_layers_logits_wgrad(r, chunk, l, x->mtp_logits_in[i], x->mtp_probs[i], err));
    if (sp)
        TRY(exec_tp_reduce_scatter(r, MODEL_OPR_LOGITS, l, chunk, MODEL_BWD, r->W->dx_a, dx,
                                   (size_t)R * h, err));
    else /* the vocabulary shards' partial sums (tp > 1) */
        TRY(exec_tp_allreduce(r, MODEL_OPR_LOGITS, l, chunk, MODEL_BWD, dx, (size_t)N * h, err));
    exec_meter_close(r->M, k, op);
    return PX_OK;
}

/* The module's own backward under tensor and sequence parallelism, from the layer's input
 * gradient in ws.dx_b (this rank's rows): that gradient and eh.in gathered over the sequence,
 * eh's weight gradient from this rank's columns, its input gradient reduce-scattered to this
 * rank's rows (ws.dhid), hnorm's backward on them, and enorm's on them too: its input, not
 * saved, is looked up again and reduce-scattered to this rank's rows as the forward did (each
 * rank's weight gradient a part, summed over TP as every sequence-parallel norm's is). enorm's
 * input gradient of this rank's rows (ws.dx_b) is then gathered over the sequence and each rank
 * adds its vocabulary shard's rows to the embedding's gradient; under ZeRO-2/3 that waits in the
 * spent eh.in (b x s/(cp tp) rows of h in its 2h), gathered in the embedding's window. */
static int eh_bwd_sp(const ExecLayerRun *r, int chunk, int i, const void *ehin, const void *hid,
                     void *dhid, const int32_t *tok, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const int l = c->spec.model.layers + i, h = d->h, t = d->t, hl = h / t;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp;
    const size_t rb = (size_t)R * h * c->ab;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    void *full = eh_grad_buf(r), *dy = r->W->out, *gat = r->W->sp_gather;
    TRY(exec_tp_all_gather(r, MODEL_OPR_MTP, l, chunk, MODEL_BWD, gat, r->W->dx_b, (size_t)R * h,
                           err));
    copy_rows(r, dy, hl, AT(gat, (size_t)c->g.tp_rank * hl), h, N, hl);
    TRY(exec_tp_all_gather(r, MODEL_OPR_MTP, l, chunk, MODEL_BWD, full, ehin, (size_t)R * 2 * h,
                           err));
    mm(r, EXEC_LPT(g, EH_W), c->grad, dy, full, hl, 2 * h, N, 1, 0, 1);
    mm(r, full, c->act, dy, EXEC_LPT(w, EH_W), N, 2 * h, hl, 0, 0, 0);
    TRY(exec_tp_reduce_scatter(r, MODEL_OPR_MTP, l, chunk, MODEL_BWD, r->W->dhid, full,
                               (size_t)R * 2 * h, err));
    const void *deh = r->W->dhid;
    k->memset0(dhid, rb);
    norm_rows_bwd(r, dhid, EXEC_LPT(g, HNORM_W), AT(deh, h), 2 * h, hid, EXEC_LPT(w, HNORM_W), R);
    /* enorm's input of this rank's rows (in ws.dx_a, spent since the final norm's backward) */
    exec_mtp_embed_shifted(r, r->W->out, tok, mb, i + 1);
    TRY(exec_tp_reduce_scatter(r, MODEL_OPR_MTP, l, chunk, MODEL_BWD, r->W->dx_a, r->W->out,
                               (size_t)R * h, err));
    k->memset0(r->W->dx_b, rb);
    norm_rows_bwd(r, r->W->dx_b, EXEC_LPT(g, ENORM_W), deh, 2 * h, r->W->dx_a,
                  EXEC_LPT(w, ENORM_W), R);
    if (exec_mtp_deferred(c)) {
        k->copy((void *)ehin, r->W->dx_b, rb);
        return PX_OK;
    }
    TRY(exec_tp_all_gather(r, MODEL_OPR_MTP, l, chunk, MODEL_BWD, gat, r->W->dx_b, (size_t)R * h,
                           err));
    exec_mtp_embed_shifted_bwd(r, gat, tok, mb, i + 1);
    return PX_OK;
}

/* The module's own backward without sequence parallelism, from the layer's input gradient in
 * dres (every row, the same on every TP rank): eh's weight gradient from this rank's columns
 * of it, eh's input gradient summed over TP, hnorm's backward into dhid (this module's spent
 * output) and enorm's into dres. enorm's input, not saved, is looked up again and summed over
 * the vocabulary shards as the forward summed it (the op graph's all-reduce), so that every
 * rank has it whole and its weight gradient needs no sum; each rank then adds the rows of its
 * own shard to the embedding's gradient. */
static int eh_bwd(const ExecLayerRun *r, int chunk, int i, const void *ehin, const void *hid,
                  void *dhid, void *dres, const int32_t *tok, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const int l = c->spec.model.layers + i, h = d->h, t = d->t, hl = h / t, N = d->b * d->s_loc;
    const size_t rb = (size_t)N * h * c->ab;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    void *deh = eh_grad_buf(r);
    const void *dy = dres;
    if (t > 1) { /* this rank's columns of eh's output gradient */
        copy_rows(r, r->W->out, hl, AT(dres, (size_t)c->g.tp_rank * hl), h, N, hl);
        dy = r->W->out;
    }
    mm(r, deh, c->act, dy, EXEC_LPT(w, EH_W), N, 2 * h, hl, 0, 0, 0);
    mm(r, EXEC_LPT(g, EH_W), c->grad, dy, ehin, hl, 2 * h, N, 1, 0, 1);
    TRY(exec_tp_allreduce(r, MODEL_OPR_MTP, l, chunk, MODEL_BWD, deh, (size_t)N * 2 * h, err));
    k->memset0(dhid, rb);
    norm_rows_bwd(r, dhid, EXEC_LPT(g, HNORM_W), AT(deh, h), 2 * h, hid, EXEC_LPT(w, HNORM_W), N);
    exec_mtp_embed_shifted(r, r->W->out, tok, mb, i + 1);
    TRY(exec_tp_allreduce(r, MODEL_OPR_MTP, l, chunk, MODEL_BWD, r->W->out, (size_t)N * h, err));
    k->memset0(dres, rb);
    norm_rows_bwd(r, dres, EXEC_LPT(g, ENORM_W), deh, 2 * h, r->W->out, EXEC_LPT(w, ENORM_W), N);
    if (exec_mtp_deferred(c))
        k->copy((void *)ehin, dres, rb);
    else
        exec_mtp_embed_shifted_bwd(r, dres, tok, mb, i + 1);
    return PX_OK;
}

static int module_bwd(const ExecLayerRun *r, int chunk, int i, const ExecLayerActs *a,
                      const ExecHeadActs *x, const int32_t *tok, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const int D = c->g.chunk_mtp[chunk];
    const int l = c->spec.model.layers + i, h = d->h, R = d->b * d->s_sp;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    void *dres = r->W->dx_b;
    const size_t rb = (size_t)R * h * c->ab;
    int op;

    /* the final norm: its output's gradient from the head, its input's (the module's output)
     * plus what the next depth left for it (under ZeRO-2/3 into the bucket, the module's block's
     * gradients all within this backward) */
    exec_zero_bucket_clear(r->Z, c, r->P, r->P->layer_block[l]);
    TRY(gather_module(r, l, MODEL_BWD, 3, err));
    TRY(open_op(r, chunk, l, MODEL_OPR_FINAL_LN, MODEL_BWD, &op, err));
    k->memset0(dres, rb);
    norm_rows_bwd(r, dres, EXEC_LPT(g, NORM_W), r->W->dx_a, h, x->mtp_out[i], EXEC_LPT(w, NORM_W),
                  R);
    if (i + 1 < D)
        k->add_inplace(dres, x->mtp_out[i + 1], (size_t)R * h);
    exec_meter_close(r->M, k, op);

    /* ZeRO-2/3: a MoE layer's backward lends the bucket to its experts' block and clears it
     * again for the layer's (moe.c), which would erase the final norm's weight gradient just
     * computed; it waits in the module's output (spent once the final norm's backward has read
     * it, free until hnorm's backward writes its gradient there) and goes back to the bucket
     * after the layer's backward (a dense layer leaves it there: the same values) */
    void *norm_g = EXEC_LPT(g, NORM_W);
    const size_t norm_gb = (size_t)h * c->gb;
    const int hold = exec_zero_bucketed(c);
    if (hold && norm_gb > rb)
        return px_fail(err, PX_ERUNTIME, "module %d's final norm gradient (%zu bytes) does not fit "
                       "its spent output (%zu bytes)", i + 1, norm_gb, rb);
    if (hold)
        k->copy(x->mtp_out[i], norm_g, norm_gb);
    TRY(exec_layers_one_bwd(r, chunk, l, a, dres, mb, err));
    if (hold)
        k->copy(norm_g, x->mtp_out[i], norm_gb);

    /* eh's backward from the layer's input gradient, then enorm's (the embedding looked up
     * again) and hnorm's (into this module's spent output) */
    const void *ehin = a->t[EXEC_MTP_ACT];
    const void *hid = i == 0 ? EXEC_HA(x, FINAL_LN_IN) : x->mtp_out[i - 1];
    TRY(regather(r, i, 1, MODEL_BWD, err));
    TRY(open_op(r, chunk, l, MODEL_OPR_MTP, MODEL_BWD, &op, err));
    if (exec_sp_on(c))
        TRY(eh_bwd_sp(r, chunk, i, ehin, hid, x->mtp_out[i], tok, mb, err));
    else
        TRY(eh_bwd(r, chunk, i, ehin, hid, x->mtp_out[i], dres, tok, mb, err));
    exec_meter_close(r->M, k, op);
    return exec_zero_bucket_reduce(r->Z, c, r->P, r->M, r->P->layer_block[l], err);
}

int exec_mtp_backward(const ExecLayerRun *r, int chunk, int mb, ExecLayerActs *A,
                      const ExecHeadActs *x, const int32_t *tok, PxError *err)
{
    const ExecCtx *c = r->c;
    const int D = c->g.chunk_mtp[chunk], cl = c->g.chunk_cl[chunk];
    const int last = c->g.chunk_g[chunk] == c->d.chunks - 1;
    const size_t rb = (size_t)c->d.b * c->d.s_sp * c->d.h * c->ab;
    if (last && D == 0) { /* the loss stage after the modules' own: their heads' backward, each
                             input's gradient left in that spent input for the transfer */
        for (int i = c->spec.model.mtp_layers - 1; i >= 0; i--) {
            TRY(head_bwd(r, chunk, i, x, tok, mb, err));
            c->k->copy(x->mtp_logits_in[i], r->W->dx_a, rb);
        }
        return PX_OK;
    }
    /* their own stage: the transfer's parts kept in pp.send (free once the last message has
     * left; nothing else is sent before the chunk's backward ends; under the scatter/gather
     * split this rank's slices), the main hidden state's gradient until the chunk's backward
     * (layers.c), each module's into ws.dx_a, where its final norm's backward reads it, when
     * its turn comes */
    if (!last && D > 0) {
        void *dst[1 + EXEC_MTP_MAX];
        TRY(exec_pipe_drain(r->pipe, c, err));
        for (int k = 0; k <= D; k++)
            dst[k] = EXEC_AT(r->pipe->send, (size_t)k * r->pipe->part, c->ab);
        TRY(exec_pipe_take_parts(r->pipe, c, r->M, chunk, mb, 1, dst, 1 + D, err));
        exec_meter_pass_input(r->M);
    }
    for (int i = D - 1; i >= 0; i--) {
        if (last)
            TRY(head_bwd(r, chunk, i, x, tok, mb, err));
        else
            TRY(exec_pipe_gather_part(r->pipe, c, r->M, chunk, 1, 1 + i, r->W->dx_a, err));
        TRY(module_bwd(r, chunk, i, &A[cl + i], x, tok, mb, err));
    }
    return PX_OK;
}

void **exec_mtp_extra_slot(ExecHeadActs *x, const ModelTensor *t)
{
    int i, at = 0;
    char rest[32];
    if (sscanf(t->name, "mtp.%d.%31s%n", &i, rest, &at) != 2 || i < 0 || i >= EXEC_MTP_MAX)
        return NULL;
    switch (t->role) {
    case MODEL_TR_FINAL_LN_IN: return &x->mtp_out[i];
    case MODEL_TR_LOGITS_IN: return &x->mtp_logits_in[i];
    case MODEL_TR_LOSS_PROBS: return &x->mtp_probs[i];
    default: return NULL;
    }
}
