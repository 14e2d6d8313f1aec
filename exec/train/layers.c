/* One chunk's forward and backward of one micro-batch through the kernels of kernels.h, op by
 * op as the op graph lists them (model/ops.c, in this order), each timed under its op, with the
 * tensor- and sequence-parallel communication of Megatron-LM and the pipeline's transfers.
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
 * Context parallelism (docs/executor.md, "Context parallelism"): a rank's b*s_loc rows are two
 * chunks of each sequence (Megatron-LM's load balancing), embedded, rotated and scored at their
 * global positions; only the attention core talks to the other cp ranks: K and V all-gathered
 * (allgather), passed around a ring with the partial results merged by their log-sum-exp (p2p),
 * or Q, K, V and the output moved between the sequence and a head split (a2a, Ulysses).
 *
 * Buffers (docs/memory.md): a layer reads its input from its slot's ln1.in and writes the next
 * layer's ln1.in (the chunk's last one final_ln.in, or a scratch that is sent on); row-parallel
 * outputs pass through ws.out (the full sequence) before the reduction; backward keeps the
 * residual-stream gradient in ws.dx_b (the norm backwards add into it, which is the residual
 * branch), the matmul input gradients in ws.dhid, ws.dqkv, ws.dffn and ws.dact, and sequence
 * parallelism's sharded temporaries in ws.dx_a; sp.gather holds whatever was gathered. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "exec/train/internal.h"

#define TRY(x)                                                                                    \
    do {                                                                                          \
        int rc_ = (x);                                                                            \
        if (rc_)                                                                                  \
            return rc_;                                                                           \
    } while (0)

/* element i of an act-dtype tensor */
#define AT(p, i) EXEC_AT(p, i, r->c->ab)

/* ---- workspace ---- */

int exec_work_bind(ExecWork *W, const ExecCtx *c, const ModelTensor *t, void *p, PxError *err)
{
    void **act = NULL;
    float **f32 = NULL;
    switch (t->role) {
    case MODEL_TR_WS_OUT: act = &W->out; break;
    case MODEL_TR_WS_DX_A: act = &W->dx_a; break;
    case MODEL_TR_WS_DX_B: act = &W->dx_b; break;
    case MODEL_TR_WS_DHID: act = &W->dhid; break;
    case MODEL_TR_WS_DQKV: act = &W->dqkv; break;
    case MODEL_TR_WS_DFFN: act = &W->dffn; break;
    case MODEL_TR_WS_DACT: act = &W->dact; break;
    case MODEL_TR_WS_DSCORES: act = &W->dscores; break;
    case MODEL_TR_SP_GATHER: act = &W->sp_gather; break;
    case MODEL_TR_WS_FLASH_D: f32 = &W->flash_d; break;
    case MODEL_TR_WS_XENT: f32 = &W->xent; break;
    case MODEL_TR_WS_EXP_DFFN: act = &W->exp_dffn; break;
    case MODEL_TR_WS_EXP_DX: act = &W->exp_dx; break;
    case MODEL_TR_EP_SEND: act = &W->ep_send; break;
    case MODEL_TR_EP_RECV: act = &W->ep_recv; break;
    case MODEL_TR_CP_KV: act = &W->cp_kv; break;
    case MODEL_TR_CP_KV_FULL: act = &W->cp_kv_full; break;
    case MODEL_TR_CP_DKV: act = &W->cp_dkv; break;
    case MODEL_TR_CP_A2A_SEND: act = &W->cp_send; break;
    case MODEL_TR_CP_A2A_RECV: act = &W->cp_recv; break;
    case MODEL_TR_CP_OUT_PART: act = &W->cp_out_part; break;
    case MODEL_TR_CP_DKV_PART: act = &W->cp_dkv_part; break;
    case MODEL_TR_CP_LSE_PART: f32 = &W->cp_lse_part; break;
    default: return exec_bind_unused(t, err);
    }
    if (t->role == MODEL_TR_WS_EXP_DFFN) {
        /* the router's scratch lives in it (moe_views): the logits' and weights' gradients,
         * the counts and the loss, fp32; on a 16-bit backend the logits' gradient narrowed
         * to act after them */
        const ModelMoe *mo = &c->spec.model.moe;
        const uint64_t NE = (uint64_t)c->d.tokens * (uint64_t)mo->experts;
        const uint64_t need = ((uint64_t)c->d.tokens * (uint64_t)(mo->experts + mo->topk) +
                               3u * (uint64_t)mo->experts + 1u) * sizeof(float) +
                              (c->act != PX_FP32 ? NE * c->ab : 0);
        if (t->bytes < need)
            return px_fail(err, PX_ERUNTIME,
                           "%s holds %llu bytes but the router's scratch needs %llu: model/ and "
                           "exec/ disagree",
                           t->name, (unsigned long long)t->bytes, (unsigned long long)need);
    }
    const PxDtype want = act ? c->act : PX_FP32;
    if (t->dtype != want)
        return exec_bind_wrong_dtype(t, want, err);
    if (act)
        *act = p;
    else
        *f32 = p;
    return PX_OK;
}

/* ---- timing and counting ---- */

static void begin(const ExecLayerRun *r, int op) { exec_meter_begin(r->M, r->c->k, op); }
static void resume(const ExecLayerRun *r, int op) { exec_meter_resume(r->M, r->c->k, op); }
static void end(const ExecLayerRun *r) { exec_meter_end(r->M, r->c->k); }

static int layer_op(const ExecLayerRun *r, int l, ModelOpRole role, ModelPhase ph)
{
    return exec_meter_layer_op(r->M, l, role, ph);
}

static int other_op(const ExecLayerRun *r, ModelOpRole role, ModelPhase ph)
{
    return exec_meter_other_op(r->M, role, ph);
}

/* C[m,n] = op(A) op(B): 2*m*n*k FLOPs, whatever the operands hold. A and B hold act values; C
 * is an act tensor (an activation or its gradient, overwritten) or an fp32 one: a weight
 * gradient (accumulated) or the logits. */
static void mm_act(const ExecLayerRun *r, void *c, const void *a, const void *b, int m, int n,
                   int k, int ta, int tb)
{
    r->c->k->matmul(c, r->c->act, a, b, m, n, k, ta, tb, 1.0f, 0.0f);
    exec_meter_flops(r->M, 2.0 * m * n * k);
}

static void mm_f32(const ExecLayerRun *r, float *c, const void *a, const void *b, int m, int n,
                   int k, int ta, int tb, int accumulate)
{
    r->c->k->matmul(c, PX_FP32, a, b, m, n, k, ta, tb, 1.0f, accumulate ? 1.0f : 0.0f);
    exec_meter_flops(r->M, 2.0 * m * n * k);
}

/* ---- helpers ---- */

static int sp_on(const ExecCtx *c) { return c->spec.layout.sp && c->d.t > 1; }

/* ---- FP8 linear layers (fp8.c; docs/fp8.md) ---- */

static void fp8_fwd(const ExecLayerRun *r, void *y, ExecFp8Ref x, const ExecFp8Weight *w, int N,
                    ModelPhase ph)
{
    exec_fp8_linear_fwd(r->fp8, r->c, r->M, y, x, w, 0, N, ph == MODEL_FWD);
}

static void fp8_bwd(const ExecLayerRun *r, void *dx, float *dw, const void *dy, ExecFp8Ref x,
                    const void *x_act, const ExecFp8Weight *w, int N)
{
    exec_fp8_linear_bwd(r->fp8, r->c, r->M, dx, dw, dy, x, x_act, w, 0, N);
}

/* A saved FP8 activation of rows x cols as a GEMM operand. */
static ExecFp8Ref fp8_saved(const ExecLayerRun *r, const void *q, int rows, int cols)
{
    return exec_fp8_saved(r->fp8, q, rows, cols);
}

static void norm_fwd(const ExecLayerRun *r, void *out, const void *inp, const void *w,
                     const void *b, int N)
{
    const ModelConfig *c = &r->c->spec.model;
    if (c->norm == MODEL_LAYERNORM)
        r->c->k->layernorm_fwd(out, inp, w, b, N, c->hidden, (float)c->norm_eps);
    else
        r->c->k->rmsnorm_fwd(out, inp, w, N, c->hidden, (float)c->norm_eps);
}

/* dinp += the norm's input gradient; dw, db += */
static void norm_bwd(const ExecLayerRun *r, void *dinp, float *dw, float *db, const void *dout,
                     const void *inp, const void *w, int N)
{
    const ModelConfig *c = &r->c->spec.model;
    if (c->norm == MODEL_LAYERNORM)
        r->c->k->layernorm_bwd(dinp, dw, db, dout, inp, w, N, c->hidden, (float)c->norm_eps);
    else
        r->c->k->rmsnorm_bwd(dinp, dw, dout, inp, w, N, c->hidden, (float)c->norm_eps);
}

/* The dropout stream of one (step, sequence, layer, site): counter-based, so a recompute, any
 * micro-batch size and any data-parallel split draw the same mask for the same sequence. */
static uint64_t drop_seed(const ExecLayerRun *r, long long seq, int layer, int site)
{
    uint64_t z = px_mix64(r->c->spec.job.seed ^ 0x64726f70ull);
    z = px_mix64(z ^ (uint64_t)r->pass->step);
    z = px_mix64(z ^ (uint64_t)seq);
    z = px_mix64(z ^ (uint64_t)(layer + 1));
    return px_mix64(z ^ (uint64_t)site);
}

static long long seq_index(const ExecLayerRun *r, int mb, int q)
{
    return r->pass->seq_base + (long long)mb * r->c->d.b + q;
}

/* out = dropout(x) over this rank's region of the micro-batch (out may alias x): every token
 * of sequence q at position t draws elements t*h ... of sequence q's stream, whichever rank
 * holds it. */
static void dropout_region(const ExecLayerRun *r, void *out, uint8_t *mask, const void *x, int mb,
                           int layer, int site)
{
    const ExecCtx *c = r->c;
    const int s = c->d.s, h = c->d.h, R = c->d.b * c->d.s_sp;
    const long long first = sp_on(c) ? (long long)c->g.tp_rank * R : 0;
    for (long long n = first; n < first + R;) {
        const int q = (int)(n / s), t0 = (int)(n % s);
        long long cnt = s - t0;
        if (n + cnt > first + R)
            cnt = first + R - n;
        const size_t o = (size_t)(n - first) * (size_t)h;
        c->k->dropout_fwd(AT(out, o), mask + o, AT(x, o), (size_t)cnt * h, c->dropout,
                          exec_stream_at(drop_seed(r, seq_index(r, mb, q), layer, site),
                                         (uint64_t)t0 * (uint64_t)h));
        n += cnt;
    }
}

/* ---- a MoE layer's parts ---- */

static int is_moe(const ExecCtx *c, int l) { return c->d.moe && model_layer_is_moe(&c->spec.model, l); }

/* The MLP's widths of layer l: a MoE layer's MLP is its shared experts. */
static void mlp_widths(const ExecCtx *c, int l, int *F, int *FO)
{
    const int moe = is_moe(c, l);
    *F = moe ? c->d.sff_loc : c->d.ffn_loc;
    *FO = moe ? c->d.sff_out_loc : c->d.ffn_out_loc;
}

/* The weight of a micro-batch's load-balancing loss in the step's objective: one micro-batch of
 * global_batch / b (Megatron-Core averages it over the micro-batches and the data-parallel
 * ranks), times the fp16 loss scale. The same on every layout with the same micro-batch. */
static double aux_weight(const ExecLayerRun *r)
{
    return r->pass->loss_scale * (double)r->c->d.b / (double)r->c->spec.job.global_batch;
}

/* Layer l's MoE views over its saved activations a; the router's scratch in ws.exp_dffn (its
 * size checked when bound). */
static void moe_views(const ExecLayerRun *r, int l, const ExecLayerActs *a, ExecMoeViews *v)
{
    const ExecCtx *c = r->c;
    const ModelMoe *mo = &c->spec.model.moe;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    const size_t N = (size_t)c->d.tokens, E = (size_t)mo->experts, K = (size_t)mo->topk;
    memset(v, 0, sizeof *v);
    v->router_w = EXEC_LPM(w, ROUTER_W);
    v->fc1_w = EXEC_LPM(w, EXP_FC1_W);
    v->fc2_w = EXEC_LPM(w, EXP_FC2_W);
    v->g_router_w = EXEC_LPM(g, ROUTER_W);
    v->g_fc1_w = EXEC_LPM(g, EXP_FC1_W);
    v->g_fc2_w = EXEC_LPM(g, EXP_FC2_W);
    v->probs = EXEC_LMA(a, ROUTER_PROBS);
    v->idx = EXEC_LMA(a, ROUTE_IDX);
    v->w = EXEC_LMA(a, ROUTE_W);
    v->exp_in = EXEC_LMA(a, EXP_IN);
    v->exp_act_in = EXEC_LMA(a, EXP_ACT_IN);
    v->exp_fc2_in = EXEC_LMA(a, EXP_FC2_IN);
    v->exp_out = EXEC_LMA(a, EXP_OUT);
    v->ep_send = r->W->ep_send;
    v->ep_recv = r->W->ep_recv;
    v->ws_dx = r->W->exp_dx;
    float *s = r->W->exp_dffn;
    v->dlogits = s;
    v->dw = s + N * E;
    v->counts_f = v->dw + N * K;
    v->aux_dev = v->counts_f + E;
    v->counts_i = (int32_t *)(v->aux_dev + E); /* E floats after the loss: aligned, apart */
    v->dlogits_act = c->act == PX_FP32 ? (void *)v->dlogits : (void *)(v->counts_i + E);
    v->f1 = exec_fp8_weight(r->fp8, MODEL_TR_EXP_FC1_W, l);
    v->f2 = exec_fp8_weight(r->fp8, MODEL_TR_EXP_FC2_W, l);
}

/* ---- tensor-parallel collectives, each timed under its op ---- */

/* The graph's op for the TP collective `kind` at (role, layer; -1 outside the layers). */
static int tp_op(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk, ModelPhase ph,
                 ModelComm kind, PxError *err)
{
    int op = exec_meter_find(r->M, role, layer, chunk, ph, kind, 0);
    if (op < 0) {
        /* the op's name is made only when it is missing: the lookup runs every pass */
        char at[48], what[128];
        if (layer >= 0)
            snprintf(at, sizeof at, "layer.%d.%s", layer, model_op_role_name(role));
        else
            snprintf(at, sizeof at, "%s", model_op_role_name(role));
        snprintf(what, sizeof what, "%s.%s.%s", at, model_comm_name(kind), model_phase_name(ph));
        exec_meter_missing(r->c, what, err);
    }
    return op;
}

/* in-place sum of n act elements over TP */
static int tp_allreduce(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                        ModelPhase ph, void *buf, size_t n, PxError *err)
{
    if (r->c->d.t < 2)
        return PX_OK;
    int op = tp_op(r, role, layer, chunk, ph, MODEL_TP_ALLREDUCE, err);
    if (op < 0)
        return PX_ERUNTIME;
    begin(r, op);
    int rc = comm_allreduce(r->c->comm, buf, n, r->c->act, COMM_SUM, MODEL_TP_ALLREDUCE, NULL, err);
    end(r);
    return rc;
}

/* out[t * n] = every rank's n */
static int tp_all_gather(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                         ModelPhase ph, void *out, const void *in, size_t n, PxError *err)
{
    int op = tp_op(r, role, layer, chunk, ph, MODEL_TP_ALL_GATHER, err);
    if (op < 0)
        return PX_ERUNTIME;
    begin(r, op);
    int rc = comm_all_gather(r->c->comm, out, in, n, r->c->act, MODEL_TP_ALL_GATHER, NULL, err);
    end(r);
    return rc;
}

/* out[n] = this rank's n of the sum of in[t * n] */
static int tp_reduce_scatter(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                             ModelPhase ph, void *out, const void *in, size_t n, PxError *err)
{
    int op = tp_op(r, role, layer, chunk, ph, MODEL_TP_REDUCE_SCATTER, err);
    if (op < 0)
        return PX_ERUNTIME;
    begin(r, op);
    int rc = comm_reduce_scatter(r->c->comm, out, in, n, r->c->act, MODEL_TP_REDUCE_SCATTER, NULL,
                                 err);
    end(r);
    return rc;
}

/* ZeRO-3 with full recompute without --fsdp (DeepSpeed's): a layer is gathered for its
 * recomputed forward and again for its backward (docs/time.md's contract); none with
 * keep_gathered, whose forward's parameters serve both. */
static int twice_gathered(const ExecCtx *c)
{
    const ModelLayout *l = &c->spec.layout;
    return l->zero == 3 && l->recompute == MODEL_RECOMPUTE_FULL && !l->fsdp && !l->keep_gathered;
}

static int gather_block(const ExecLayerRun *r, int b, ModelPhase ph, int occurrence, PxError *err)
{
    return exec_zero_gather(r->Z, r->c, r->P, r->M, b, ph, occurrence, err);
}

/* The input of a column-parallel layer (QKV, fc1) from x, this rank's region of it (act): with
 * SP all-gathered into sp.gather (*xin). Under FP8 (w) the layer's saved input `saved` (when it
 * is not x itself) is the region quantized, and the GEMM's input is the whole input quantized
 * (*xq: the saved copy, or ws.fp8's first copy); a forward records its amax once. Returns with
 * the layer's op running. */
static int column_input(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, ModelPhase ph,
                        const ExecFp8Weight *w, void *saved, const void *x, const void **xin,
                        ExecFp8Ref *xq, PxError *err)
{
    const ExecCtx *c = r->c;
    ExecFp8 *F = r->fp8;
    const int R = c->d.b * c->d.s_sp, N = c->d.b * c->d.s_loc, h = c->d.h, sp = sp_on(c);
    const int op = layer_op(r, l, role, ph), rec = ph == MODEL_FWD;
    const int keep = w && saved != x; /* the saved input is x's FP8 copy */
    if (keep) {
        begin(r, op);
        *xq = exec_fp8_quantize(F, c, saved, x, R, h, 0, EXEC_FP8_X, w, 0, rec && !sp);
        *xin = x;
        if (!sp)
            return PX_OK;
        end(r);
    }
    if (sp) {
        TRY(tp_all_gather(r, role, l, chunk, ph, r->W->sp_gather, x, (size_t)R * h, err));
        if (keep)
            resume(r, op);
        else
            begin(r, op);
        x = r->W->sp_gather;
    } else {
        begin(r, op);
    }
    *xin = x;
    if (w)
        *xq = exec_fp8_quantize(F, c, F->q0, x, N, h, 0, EXEC_FP8_X, w, 0, rec);
    return PX_OK;
}

/* The input a column-parallel layer's weight gradient reads, from its saved input (an FP8 copy
 * of this rank's region when fp8_saved): the saved FP8 copy itself (*xq) or an act input
 * (*x_act), which SP all-gathers into sp.gather (an FP8 copy dequantized into ws.fp8 first).
 * Returns with the layer's backward op running. */
static int column_bwd_input(const ExecLayerRun *r, int chunk, int l, ModelOpRole role,
                           const void *saved, int in_fp8, const void **x_act, ExecFp8Ref *xq,
                           PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, N = c->d.b * c->d.s_loc, h = c->d.h;
    const int op = layer_op(r, l, role, MODEL_BWD);
    xq->q = NULL;
    *x_act = NULL;
    if (!sp_on(c)) {
        begin(r, op);
        if (in_fp8)
            *xq = fp8_saved(r, saved, N, h);
        else
            *x_act = saved;
        return PX_OK;
    }
    const void *region = saved;
    if (in_fp8) {
        const ExecFp8Ref q = fp8_saved(r, saved, R, h);
        begin(r, op);
        c->k->fp8_dequantize(r->fp8->act, q.q, &q.f);
        end(r);
        region = r->fp8->act;
    }
    TRY(tp_all_gather(r, role, l, chunk, MODEL_BWD, r->W->sp_gather, region, (size_t)R * h, err));
    if (in_fp8)
        resume(r, op);
    else
        begin(r, op);
    *x_act = r->W->sp_gather;
    return PX_OK;
}

/* ---- context parallelism (docs/executor.md, "Context parallelism") ---- */

static int cp_op(const ExecLayerRun *r, int l, int chunk, ModelPhase ph, ModelComm kind,
                 PxError *err)
{
    return tp_op(r, MODEL_OPR_CORE, l, chunk, ph, kind, err);
}

/* The all-gather of K and V over the cp group into cp.kv_full, in global token order: this
 * rank's K, V columns of attn.qkv.out packed into its slot of cp.kv, gathered there in cp rank
 * order, then each part copied to its place. Returns with the core's op `op` not running. */
static int cp_gather_kv(const ExecLayerRun *r, const ExecLayerActs *a, int chunk, int l,
                        ModelPhase ph, int op, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int b = d->b, sl = d->s_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int kv2 = 2 * d->kv_width_loc, C = exec_cp_part_len(c);
    const size_t row = (size_t)kv2 * c->ab, count = (size_t)b * sl * kv2;
    void *mine = AT(r->W->cp_kv, (size_t)c->g.cp_rank * count);
    resume(r, op);
    for (size_t n = 0; n < (size_t)b * sl; n++)
        c->k->copy(AT(mine, n * kv2), AT(EXEC_LA(a, QKV_OUT), n * qkv + d->q_loc), row);
    end(r);
    const int g = cp_op(r, l, chunk, ph, MODEL_CP_ALL_GATHER, err);
    if (g < 0)
        return PX_ERUNTIME;
    begin(r, g);
    int rc = comm_all_gather(c->comm, r->W->cp_kv, mine, count, c->act, MODEL_CP_ALL_GATHER, NULL,
                             err);
    end(r);
    TRY(rc);
    resume(r, op);
    for (int src = 0; src < d->c; src++)
        for (int q = 0; q < b; q++)
            for (int j = 0; j < 2; j++)
                c->k->copy(AT(r->W->cp_kv_full, ((size_t)q * d->s + exec_cp_part_pos(c, src, j)) * kv2),
                           AT(r->W->cp_kv, (size_t)src * count + ((size_t)q * sl + (size_t)j * C) * kv2),
                           (size_t)C * row);
    end(r);
    return PX_OK;
}

/* The K, V gradient of the full sequence (cp.dkv, global order) back to its owners: put in
 * cp rank order into cp.kv, reduce-scattered there, and this rank's sum unpacked into the K, V
 * columns of ws.dqkv. Returns with the core's op `op` not running. */
static int cp_scatter_dkv(const ExecLayerRun *r, int chunk, int l, int op, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int b = d->b, sl = d->s_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int kv2 = 2 * d->kv_width_loc, C = exec_cp_part_len(c);
    const size_t row = (size_t)kv2 * c->ab, count = (size_t)b * sl * kv2;
    resume(r, op);
    for (int dst = 0; dst < d->c; dst++)
        for (int q = 0; q < b; q++)
            for (int j = 0; j < 2; j++)
                c->k->copy(AT(r->W->cp_kv, (size_t)dst * count + ((size_t)q * sl + (size_t)j * C) * kv2),
                           AT(r->W->cp_dkv, ((size_t)q * d->s + exec_cp_part_pos(c, dst, j)) * kv2),
                           (size_t)C * row);
    end(r);
    const int g = cp_op(r, l, chunk, MODEL_BWD, MODEL_CP_REDUCE_SCATTER, err);
    if (g < 0)
        return PX_ERUNTIME;
    begin(r, g);
    int rc = comm_reduce_scatter(c->comm, r->W->cp_kv, r->W->cp_kv, count, c->act,
                                 MODEL_CP_REDUCE_SCATTER, NULL, err);
    end(r);
    TRY(rc);
    resume(r, op);
    for (size_t n = 0; n < (size_t)b * sl; n++)
        c->k->copy(AT(r->W->dqkv, n * qkv + d->q_loc), AT(r->W->cp_kv, n * kv2), row);
    end(r);
    return PX_OK;
}

/* Ulysses (Jacobs et al. 2023), cp_comm a2a: rank r of the cp group attends with heads
 * r H/cp ... and KV groups r KV/cp ... of this TP rank's over the whole sequence. A rank's
 * head-split rows are W = (H + 2 KV)/cp x hd wide (its Q heads, K heads, V heads), held in
 * global token order: attn.qkv.out takes them in place of its own (the same size). */
typedef struct {
    int wq, wk, W;   /* a rank's Q, K (and V) and row widths in the head split */
    size_t rows;     /* this rank's token rows: b x s_loc */
    int64_t cnt[EXEC_CP_MAX]; /* elements to and from each rank of the group (a2a_width) */
} CpA2a;

static void a2a_dims(const ExecCtx *c, CpA2a *x)
{
    const ModelDims *d = &c->d;
    x->wq = d->heads_loc / d->c * d->hd;
    x->wk = d->kv_loc / d->c * d->hd;
    x->W = x->wq + 2 * x->wk;
    x->rows = (size_t)d->b * d->s_loc;
}

/* every rank sends every other this rank's rows, `width` wide */
static void a2a_width(const ExecCtx *c, CpA2a *x, int width)
{
    for (int i = 0; i < c->d.c; i++)
        x->cnt[i] = (int64_t)(x->rows * (size_t)width);
}

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
                void *p = EXEC_AT(pk, (rk * rows + (size_t)q * d->s_loc + (size_t)j * C) * width, c->ab);
                void *g = EXEC_AT(gl, ((size_t)q * d->s + exec_cp_part_pos(c, rk, j)) * width, c->ab);
                c->k->copy(to_global ? g : p, to_global ? p : g, bytes);
            }
}

/* One counted all-to-all of cp.a2a_send into cp.a2a_recv, timed under its op: the pass's
 * first (occurrence 0) or second. The graph lists Q, K, V's under the core and the output's
 * under the projection (forward: Q, K, V then the output; backward: the output's gradient
 * then Q's, K's and V's). */
static int a2a_call(const ExecLayerRun *r, int l, int chunk, ModelPhase ph, int occurrence,
                    const CpA2a *x, PxError *err)
{
    const int out = (occurrence == 1) != (ph == MODEL_BWD);
    const ModelOpRole role = out ? MODEL_OPR_PROJ : MODEL_OPR_CORE;
    const int g = exec_meter_find(r->M, role, l, chunk, ph, MODEL_CP_ALL_TO_ALL, 0);
    if (g < 0) {
        char what[128];
        snprintf(what, sizeof what, "layer.%d.%s.%s.%s", l, model_op_role_name(role),
                 model_comm_name(MODEL_CP_ALL_TO_ALL), model_phase_name(ph));
        return exec_meter_missing(r->c, what, err);
    }
    begin(r, g);
    int rc = comm_all_to_allv(r->c->comm, r->W->cp_recv, x->cnt, r->W->cp_send, x->cnt, r->c->act,
                              MODEL_CP_ALL_TO_ALL, err);
    end(r);
    return rc;
}

/* Q, K, V from the sequence split (attn.qkv.out, this rank's rows) to the head split over the
 * whole sequence (attn.qkv.out again, W wide). Returns with op `op` not running. */
static int a2a_qkv(const ExecLayerRun *r, const ExecLayerActs *a, int chunk, int l, ModelPhase ph,
                   int op, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + 2 * d->kv_width_loc;
    CpA2a x;
    a2a_dims(c, &x);
    a2a_width(c, &x, x.W);
    void *src = EXEC_LA(a, QKV_OUT);
    resume(r, op);
    for (int rk = 0; rk < d->c; rk++)
        for (size_t n = 0; n < x.rows; n++) {
            void *o = AT(r->W->cp_send, (rk * x.rows + n) * x.W);
            const void *row = AT(src, n * qkv);
            c->k->copy(o, AT(row, (size_t)rk * x.wq), (size_t)x.wq * c->ab);
            c->k->copy(AT(o, x.wq), AT(row, d->q_loc + (size_t)rk * x.wk), (size_t)x.wk * c->ab);
            c->k->copy(AT(o, x.wq + x.wk), AT(row, d->q_loc + d->kv_width_loc + (size_t)rk * x.wk),
                       (size_t)x.wk * c->ab);
        }
    end(r);
    TRY(a2a_call(r, l, chunk, ph, 0, &x, err));
    resume(r, op);
    a2a_move(c, r->W->cp_recv, src, x.W, 1);
    end(r);
    return PX_OK;
}

/* The head-split output (cp.a2a_recv, global order, wq wide) back to the sequence split: this
 * rank's rows of every head into out. Returns with op `op` not running. */
static int a2a_out(const ExecLayerRun *r, void *out, int chunk, int l, ModelPhase ph, int op,
                   PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    CpA2a x;
    a2a_dims(c, &x);
    a2a_width(c, &x, x.wq);
    resume(r, op);
    a2a_move(c, r->W->cp_send, r->W->cp_recv, x.wq, 0);
    end(r);
    TRY(a2a_call(r, l, chunk, ph, 1, &x, err));
    resume(r, op);
    for (int rk = 0; rk < d->c; rk++)
        for (size_t n = 0; n < x.rows; n++)
            c->k->copy(AT(out, n * d->q_loc + (size_t)rk * x.wq),
                       AT(r->W->cp_recv, (rk * x.rows + n) * x.wq), (size_t)x.wq * c->ab);
    end(r);
    return PX_OK;
}

/* Ulysses' core, forward: with `comm` Q, K, V to the head split first and the output back
 * after (the forward's, a full recompute's), else (selective recompute) over the head split
 * attn.qkv.out already holds, into out. Sequence by sequence, causal over the whole one. */
static int attention_a2a_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int l,
                             int chunk, ModelPhase ph, int op, int comm, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    CpA2a x;
    a2a_dims(c, &x);
    if (comm) {
        end(r);
        TRY(a2a_qkv(r, a, chunk, l, ph, op, err));
        resume(r, op);
    }
    void *oh = comm ? r->W->cp_recv : out;
    const int Hc = d->heads_loc / d->c, s = d->s;
    const size_t tile = (size_t)Hc * s * s;
    for (int q = 0; q < d->b; q++) {
        const void *base = AT(EXEC_LA(a, QKV_OUT), (size_t)q * s * x.W);
        KernAttnFwd f = {
            .B = 1, .Tq = s, .Tk = s, .H = Hc, .KV = d->kv_loc / d->c, .D = d->hd,
            .scale = (float)(1.0 / sqrt((double)d->hd)),
            .q = base, .k = AT(base, x.wq), .v = AT(base, x.wq + x.wk),
            .q_stride = x.W, .k_stride = x.W, .v_stride = x.W,
            .out = AT(oh, (size_t)q * s * x.wq),
            .probs = AT(EXEC_LA(a, SOFTMAX), q * tile),
        };
        c->k->attention_fwd(&f);
        exec_meter_flops(r->M, model_attention_fwd_flops(&c->spec, (double)Hc, s, s, d->hd));
    }
    if (comm) {
        end(r);
        TRY(a2a_out(r, out, chunk, l, ph, op, err));
        resume(r, op);
    }
    return PX_OK;
}

/* Ulysses' core, backward: the output's gradient (ws.dhid) to the head split, the attention's
 * backward there, and Q's, K's and V's gradients back to this rank's rows of ws.dqkv. Returns
 * with op `op` not running. */
static int attention_a2a_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int chunk, int l,
                             int op, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + 2 * d->kv_width_loc, Hc = d->heads_loc / d->c, s = d->s;
    CpA2a x;
    a2a_dims(c, &x);
    a2a_width(c, &x, x.wq);
    begin(r, op);
    for (int rk = 0; rk < d->c; rk++)
        for (size_t n = 0; n < x.rows; n++)
            c->k->copy(AT(r->W->cp_send, (rk * x.rows + n) * x.wq),
                       AT(r->W->dhid, n * d->q_loc + (size_t)rk * x.wq), (size_t)x.wq * c->ab);
    end(r);
    TRY(a2a_call(r, l, chunk, MODEL_BWD, 0, &x, err));
    resume(r, op);
    a2a_move(c, r->W->cp_recv, r->W->cp_send, x.wq, 1); /* dO, head split, in cp.a2a_send */
    const size_t tile = (size_t)Hc * s * s;
    for (int q = 0; q < d->b; q++) {
        const void *base = AT(EXEC_LA(a, QKV_OUT), (size_t)q * s * x.W);
        void *db = AT(r->W->cp_recv, (size_t)q * s * x.W);
        KernAttnBwd b = {
            .B = 1, .Tq = s, .Tk = s, .H = Hc, .KV = d->kv_loc / d->c, .D = d->hd,
            .scale = (float)(1.0 / sqrt((double)d->hd)),
            .q = base, .k = AT(base, x.wq), .v = AT(base, x.wq + x.wk),
            .q_stride = x.W, .k_stride = x.W, .v_stride = x.W,
            .dout = AT(r->W->cp_send, (size_t)q * s * x.wq),
            .dq = db, .dk = AT(db, x.wq), .dv = AT(db, x.wq + x.wk),
            .dq_stride = x.W, .dk_stride = x.W, .dv_stride = x.W,
            .probs = AT(EXEC_LA(a, SOFTMAX), q * tile),
            .dscores = AT(r->W->dscores, q * tile),
        };
        c->k->attention_bwd(&b);
        const double fwd = model_attention_fwd_flops(&c->spec, (double)Hc, s, s, d->hd);
        exec_meter_flops(r->M, model_attention_bwd_flops(fwd, 0, NULL));
    }
    a2a_width(c, &x, x.W);
    a2a_move(c, r->W->cp_send, r->W->cp_recv, x.W, 0);
    end(r);
    TRY(a2a_call(r, l, chunk, MODEL_BWD, 1, &x, err));
    resume(r, op);
    for (int rk = 0; rk < d->c; rk++)
        for (size_t n = 0; n < x.rows; n++) {
            const void *i = AT(r->W->cp_recv, (rk * x.rows + n) * x.W);
            void *row = AT(r->W->dqkv, n * qkv);
            c->k->copy(AT(row, (size_t)rk * x.wq), i, (size_t)x.wq * c->ab);
            c->k->copy(AT(row, d->q_loc + (size_t)rk * x.wk), AT(i, x.wq), (size_t)x.wk * c->ab);
            c->k->copy(AT(row, d->q_loc + d->kv_width_loc + (size_t)rk * x.wk), AT(i, x.wq + x.wk),
                       (size_t)x.wk * c->ab);
        }
    end(r);
    return PX_OK;
}

/* The K, V ring (cp_comm p2p; Liu et al. 2023's ring attention with Megatron-LM's chunks):
 * cp.kv holds two slots, each a block (a rank's K and V, b x s_loc rows of 2 kv, its parts in
 * order) followed by the K, V gradient accumulated for it. Step k holds the block of cp rank
 * (this - k) mod cp. The block goes on to the next rank, and the previous rank's arrives in the
 * other slot, while the attention computes on it: the messages are posted before the block's
 * attention and waited for after it (the backward's gradient of a block goes after its
 * attention, which accumulates it). */
enum { CP_RING_TAG = 0x70000 }; /* apart from the pipeline's tags; its peers are other ranks */

static size_t ring_block(const ExecCtx *c) { return (size_t)c->d.b * c->d.s_loc * 2 * c->d.kv_width_loc; }

static void *ring_slot(const ExecLayerRun *r, int i, int grad)
{
    return AT(r->W->cp_kv, ((size_t)2 * i + (size_t)grad) * ring_block(r->c));
}

static int ring_peer(const ExecCtx *c, int delta)
{
    return model_rank(&c->spec.layout, c->g.tp_rank, (c->g.cp_rank + delta + c->d.c) % c->d.c,
                      c->g.dp_rank, c->g.stage);
}

/* The graph's p2p op of the pass (one op a pass: the backward's ring steps and its last
 * message share it); -1 with err filled when the graph lists none. */
static int ring_op(const ExecLayerRun *r, int l, int chunk, ModelPhase ph, PxError *err)
{
    const int g = exec_meter_find(r->M, MODEL_OPR_CORE, l, chunk, ph, MODEL_CP_P2P, 0);
    if (g < 0) {
        char what[128];
        snprintf(what, sizeof what, "layer.%d.%s.%s.%s", l, model_op_role_name(MODEL_OPR_CORE),
                 model_comm_name(MODEL_CP_P2P), model_phase_name(ph));
        exec_meter_missing(r->c, what, err);
    }
    return g;
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
    begin(r, g);
    int rc = comm_recv(c->comm, into, bytes, ring_peer(c, -1), tag, MODEL_CP_P2P, rq, err);
    if (!rc)
        rc = comm_send(c->comm, from, bytes, ring_peer(c, 1), tag, MODEL_CP_P2P, sq, err);
    end(r);
    return rc;
}

/* Completes the messages of ring_post; the time the rank waits for them (what the attention
 * beside them did not hide) is op g's. */
static int ring_wait(const ExecLayerRun *r, int g, int *rq, int *sq, PxError *err)
{
    resume(r, g);
    int rc = comm_wait(r->c->comm, rq, err);
    if (!rc)
        rc = comm_wait(r->c->comm, sq, err);
    end(r);
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

/* The ring's forward: each query part's output and log-sum-exp (attn.proj.in's rows and
 * attn.lse's) over every block, merged block by block (the online softmax). The fused core
 * only. Returns with op `op` running. */
static int attention_ring_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int l,
                              int chunk, ModelPhase ph, int op, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int kv2 = 2 * d->kv_width_loc, C = exec_cp_part_len(c), me = c->g.cp_rank;
    const size_t row = (size_t)kv2 * c->ab;
    for (size_t n = 0; n < (size_t)d->b * sl; n++)
        c->k->copy(AT(ring_slot(r, 0, 0), n * kv2), AT(EXEC_LA(a, QKV_OUT), n * qkv + d->q_loc), row);
    const int g = ring_op(r, l, chunk, ph, err);
    if (g < 0)
        return PX_ERUNTIME;
    for (int step = 0, cur = 0; step < d->c; step++, cur ^= 1) {
        const int src = (me - step + d->c) % d->c, more = step + 1 < d->c;
        const void *blk = ring_slot(r, cur, 0);
        int rq = -1, sq = -1;
        if (more) {
            end(r);
            TRY(ring_post(r, g, ph, blk, ring_slot(r, cur ^ 1, 0), ring_block(c) * c->ab, &rq, &sq,
                          err));
            resume(r, op);
        }
        for (int q = 0; q < d->b; q++)
            for (int j = 0; j < 2; j++)
                for (int jj = 0; jj < 2; jj++) {
                    int q0;
                    if (!ring_visible(c, j, src, jj, &q0))
                        continue;
                    const int first = step == 0 && jj == 0; /* the own block's first part */
                    const size_t rows = (size_t)q * sl + (size_t)j * C;
                    float *lse = (float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * H * sl + (size_t)j * H * C;
                    const void *kb = AT(blk, ((size_t)q * sl + (size_t)jj * C) * kv2);
                    KernAttnFwd f = {
                        .B = 1, .Tq = C, .Tk = C, .H = H, .KV = d->kv_loc, .D = d->hd,
                        .q_offset = q0, .scale = (float)(1.0 / sqrt((double)d->hd)),
                        .q = AT(EXEC_LA(a, QKV_OUT), rows * qkv), .k = kb,
                        .v = AT(kb, d->kv_width_loc), .q_stride = qkv, .k_stride = kv2,
                        .v_stride = kv2,
                        .out = first ? AT(out, rows * d->q_loc) : r->W->cp_out_part,
                        .lse = first ? lse : r->W->cp_lse_part,
                    };
                    c->k->attention_fwd(&f);
                    if (!first)
                        c->k->attention_merge(AT(out, rows * d->q_loc), lse, r->W->cp_out_part,
                                              r->W->cp_lse_part, C, H, d->hd);
                    if (more)
                        comm_progress(c->comm); /* MPI moves the messages inside its calls */
                }
        if (more) {
            end(r);
            TRY(ring_wait(r, g, &rq, &sq, err));
            resume(r, op);
        }
    }
    for (int q = 0; q < d->b; q++)
        exec_meter_flops(r->M, model_attention_fwd_flops(&c->spec, (double)H, sl, d->s, d->hd));
    return PX_OK;
}

/* The ring's backward: each block's part of every gradient, with the forward's output and
 * log-sum-exp over all blocks (so each block's probabilities are the softmax's own): Q's added
 * into ws.dqkv, K's and V's into the block's gradient, which travels with it; a last message
 * takes each gradient to its owner. Returns with op `op` not running. */
static int attention_ring_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int l, int chunk,
                              int op, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int kv2 = 2 * d->kv_width_loc, C = exec_cp_part_len(c), me = c->g.cp_rank;
    const size_t row = (size_t)kv2 * c->ab, blk_bytes = ring_block(c) * c->ab;
    begin(r, op);
    for (size_t n = 0; n < (size_t)d->b * sl; n++)
        c->k->copy(AT(ring_slot(r, 0, 0), n * kv2), AT(EXEC_LA(a, QKV_OUT), n * qkv + d->q_loc), row);
    c->k->memset0(ring_slot(r, 0, 1), blk_bytes);
    c->k->memset0(r->W->dqkv, (size_t)d->b * sl * qkv * c->ab);
    const int g = ring_op(r, l, chunk, MODEL_BWD, err);
    if (g < 0) {
        end(r);
        return PX_ERUNTIME;
    }
    int cur = 0;
    for (int step = 0; step < d->c; step++) {
        const int src = (me - step + d->c) % d->c, more = step + 1 < d->c;
        const void *blk = ring_slot(r, cur, 0);
        void *dblk = ring_slot(r, cur, 1);
        int rq = -1, sq = -1, drq = -1, dsq = -1;
        if (more) { /* the block on beside its attention; its gradient must wait for it */
            end(r);
            TRY(ring_post(r, g, MODEL_BWD, blk, ring_slot(r, cur ^ 1, 0), blk_bytes, &rq, &sq, err));
            resume(r, op);
        }
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
                        .B = 1, .Tq = C, .Tk = C, .H = H, .KV = d->kv_loc, .D = d->hd,
                        .q_offset = q0, .scale = (float)(1.0 / sqrt((double)d->hd)),
                        .q = AT(EXEC_LA(a, QKV_OUT), rows * qkv), .k = kb,
                        .v = AT(kb, d->kv_width_loc), .q_stride = qkv, .k_stride = kv2,
                        .v_stride = kv2,
                        .out = AT(EXEC_LA(a, PROJ_IN), rows * d->q_loc),
                        .dout = AT(r->W->dhid, rows * d->q_loc),
                        .dq = r->W->cp_out_part, .dk = r->W->cp_dkv_part,
                        .dv = AT(r->W->cp_dkv_part, d->kv_width_loc), .dq_stride = d->q_loc,
                        .dk_stride = kv2, .dv_stride = kv2,
                        .lse = (const float *)EXEC_LA(a, ATTN_LSE) + lo, .drow = r->W->flash_d + lo,
                    };
                    c->k->attention_bwd(&b);
                    for (int t = 0; t < C; t++)
                        c->k->add_inplace(AT(r->W->dqkv, (rows + t) * qkv),
                                          AT(r->W->cp_out_part, (size_t)t * d->q_loc), d->q_loc);
                    c->k->add_inplace(AT(dblk, krows * kv2), r->W->cp_dkv_part, (size_t)C * kv2);
                    if (more)
                        comm_progress(c->comm);
                }
        end(r);
        /* the gradient on, a message of its own (the graph's calls); after the last step it goes
         * home: the next rank's block, this rank's from the previous one */
        TRY(ring_post(r, g, MODEL_BWD, dblk, ring_slot(r, cur ^ 1, 1), blk_bytes, &drq, &dsq, err));
        if (more)
            TRY(ring_wait(r, g, &rq, &sq, err));
        TRY(ring_wait(r, g, &drq, &dsq, err));
        resume(r, op);
        cur ^= 1;
    }
    for (size_t n = 0; n < (size_t)d->b * sl; n++)
        c->k->copy(AT(r->W->dqkv, n * qkv + d->q_loc), AT(ring_slot(r, cur, 1), n * kv2), row);
    for (int q = 0; q < d->b; q++) {
        const double fwd = model_attention_fwd_flops(&c->spec, (double)H, sl, d->s, d->hd);
        exec_meter_flops(r->M, model_attention_bwd_flops(fwd, 1, NULL));
    }
    end(r);
    return PX_OK;
}

/* Where part j's keys are: the sequence's own K, V columns (cp 1) or cp.kv_full; part j's
 * queries see keys 0 .. its last position: *tk of them, the first at *q_offset. */
static void cp_part_keys(const ExecCtx *c, int j, int *q_offset, int *tk)
{
    *q_offset = exec_cp_part_pos(c, c->g.cp_rank, j);
    *tk = *q_offset + exec_cp_part_len(c);
}

/* The attention core's forward, sequence by sequence and (context parallelism) part by part:
 * each part's queries against the keys up to its last position. The saved softmax (unfused)
 * or log-sum-exp (fused) of a sequence holds its parts one after the other. Runs within op
 * `op`; with cp > 1 and `gather` gathers K and V first (the forward's, or a full recompute's,
 * all-gather), else finds them in cp.kv_full. */
static int attention_core_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int mb,
                              int l, int chunk, ModelPhase ph, int op, int gather, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int cp = d->c > 1, kvs = cp ? 2 * d->kv_width_loc : qkv, P = exec_cp_parts(c);
    const int C = exec_cp_part_len(c);
    const size_t tile = (size_t)H * sl * d->s;
    if (cp && c->spec.layout.cp_comm == MODEL_CP_COMM_A2A)
        return attention_a2a_fwd(r, a, out, l, chunk, ph, op, gather, err);
    if (cp && c->spec.layout.cp_comm == MODEL_CP_COMM_P2P)
        return attention_ring_fwd(r, a, out, l, chunk, ph, op, err);
    if (cp && gather) {
        end(r);
        TRY(cp_gather_kv(r, a, chunk, l, ph, op, err));
        resume(r, op);
    }
    for (int q = 0; q < d->b; q++) {
        const void *base = AT(EXEC_LA(a, QKV_OUT), (size_t)q * sl * qkv);
        const void *kb = cp ? AT(r->W->cp_kv_full, (size_t)q * d->s * kvs) : AT(base, d->q_loc);
        size_t at = 0; /* the part's place in the sequence's softmax */
        for (int j = 0; j < P; j++) {
            int q0, tk;
            cp_part_keys(c, j, &q0, &tk);
            KernAttnFwd f = {
                .B = 1, .Tq = C, .Tk = tk, .H = H, .KV = d->kv_loc, .D = d->hd, .q_offset = q0,
                .scale = (float)(1.0 / sqrt((double)d->hd)),
                .q = AT(base, (size_t)j * C * qkv), .k = kb, .v = AT(kb, d->kv_width_loc),
                .q_stride = qkv, .k_stride = kvs, .v_stride = kvs,
                .out = AT(out, ((size_t)q * sl + (size_t)j * C) * d->q_loc),
            };
            if (c->spec.job.flash_attn) {
                f.lse = (float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * H * sl + (size_t)j * H * C;
            } else {
                f.probs = AT(EXEC_LA(a, SOFTMAX), q * tile + at);
                if (c->attn_dropout) { /* cp > 1 refuses dropout (exec_init) */
                    f.dropout = c->dropout;
                    /* the stream of the whole layer's heads: this rank's first head is global
                     * head tp * H, whose entries start tp * H * s * s into it */
                    f.seed = exec_stream_at(drop_seed(r, seq_index(r, mb, q), l, EXEC_SITE_ATTN),
                                            (uint64_t)c->g.tp_rank * tile);
                    f.mask = (uint8_t *)EXEC_LA(a, SOFTMAX_MASK) + q * tile;
                    f.probs_drop = AT(EXEC_LA(a, SOFTMAX_DROP), q * tile);
                }
            }
            at += (size_t)H * C * tk;
            c->k->attention_fwd(&f);
        }
        /* counted as the op graph counts a sequence's core: s_loc queries against s keys */
        exec_meter_flops(r->M, model_attention_fwd_flops(&c->spec, (double)H, sl, d->s, d->hd));
    }
    return PX_OK;
}

/* ---- a transformer layer ---- */

/* Rotary embedding (backward: its inverse) over packed QKV rows (attn.qkv.out's layout), each
 * part of each sequence at its global positions. */
static void rope(const ExecLayerRun *r, void *qkv_rows, int backward)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + 2 * d->kv_width_loc, C = exec_cp_part_len(c);
    const float theta = (float)c->spec.model.rope_theta;
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++) {
            void *x = AT(qkv_rows, ((size_t)q * d->s_loc + (size_t)j * C) * qkv);
            const int p0 = exec_cp_part_pos(c, c->g.cp_rank, j);
            if (backward)
                c->k->rope_bwd(x, 1, C, d->heads_loc, d->kv_loc, d->hd, p0, theta);
            else
                c->k->rope_fwd(x, 1, C, d->heads_loc, d->kv_loc, d->hd, p0, theta);
        }
}

/* The epilogue of a row-parallel layer (attention projection, fc2): ws.out holds this rank's
 * partial product over the full sequence; reduce it (all-reduce, or reduce-scatter into y's
 * region), then bias, dropout and the residual: out = res + dropout(y + bias). */
static int row_parallel_out(const ExecLayerRun *r, int chunk, int l, ModelOpRole role,
                            ModelPhase ph, const void *bias, uint8_t *mask, int site,
                            const void *res, void *out, int mb, const void *extra, PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, h = c->d.h;
    void *y = r->W->out;
    end(r);
    if (sp_on(c)) {
        y = out; /* the reduce-scatter writes the region straight into the output */
        TRY(tp_reduce_scatter(r, role, l, chunk, ph, y, r->W->out, (size_t)R * h, err));
    } else {
        TRY(tp_allreduce(r, role, l, chunk, ph, y, (size_t)R * h, err));
    }
    resume(r, layer_op(r, l, role, ph));
    if (extra) /* a MoE layer's routed experts beside its shared ones */
        c->k->add(y, y, extra, (size_t)R * h);
    if (bias)
        c->k->add_bias(y, bias, R, h);
    if (c->dropout > 0)
        dropout_region(r, y, mask, y, mb, l, site);
    c->k->add(out, res, y, (size_t)R * h);
    end(r);
    return PX_OK;
}

/* Forward of layer l from its ln1.in; the output (input plus both residual branches, this
 * rank's region) goes to out. phase MODEL_RECOMPUTE re-creates the tensors of a that the
 * recompute mode did not save (out is then scratch). */
static int layer_fwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *out,
                     ModelPhase phase, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ModelConfig *cfg = &c->spec.model;
    const ExecLayerParams *w = &r->P->lw[l];
    ExecFp8 *F = r->fp8;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int rec = phase == MODEL_FWD;
    /* the weights whose GEMMs run in FP8 (NULL: act GEMMs); their inputs are saved in FP8, and
     * what computes them writes ws.fp8's act part first */
    const ExecFp8Weight *fq = exec_fp8_weight(F, MODEL_TR_QKV_W, l);
    const ExecFp8Weight *fp = exec_fp8_weight(F, MODEL_TR_PROJ_W, l);
    const ExecFp8Weight *f1 = exec_fp8_weight(F, MODEL_TR_FC1_W, l);
    const ExecFp8Weight *f2 = exec_fp8_weight(F, MODEL_TR_FC2_W, l);

    begin(r, layer_op(r, l, MODEL_OPR_LN1, phase));
    void *ln1 = fq ? F->act : EXEC_LA(a, QKV_IN);
    norm_fwd(r, ln1, EXEC_LA(a, LN1_IN), EXEC_LP(w, LN1_W), EXEC_LP(w, LN1_B), R);
    end(r);

    const void *x;
    ExecFp8Ref xq;
    TRY(column_input(r, chunk, l, MODEL_OPR_QKV, phase, fq, EXEC_LA(a, QKV_IN), ln1, &x, &xq, err));
    if (fq)
        fp8_fwd(r, EXEC_LA(a, QKV_OUT), xq, fq, N, phase);
    else
        mm_act(r, EXEC_LA(a, QKV_OUT), x, EXEC_LP(w, QKV_W), N, qkv, h, 0, 1);
    if (EXEC_LP(w, QKV_B))
        k->add_bias(EXEC_LA(a, QKV_OUT), EXEC_LP(w, QKV_B), N, qkv);
    if (cfg->position == MODEL_POS_ROPE)
        rope(r, EXEC_LA(a, QKV_OUT), 0);
    end(r);

    /* the projection's input: saved in the act dtype and quantized for the GEMM alone, or its
     * quantized copy saved (beside the act one, or alone: model_fp8_proj_in) */
    const ModelFp8ProjIn pin = model_fp8_proj_in(&c->spec);
    void *o = pin == MODEL_FP8_PROJ_FP8 ? F->act : EXEC_LA(a, PROJ_IN);
    const int op_core = layer_op(r, l, MODEL_OPR_CORE, phase);
    begin(r, op_core);
    TRY(attention_core_fwd(r, a, o, mb, l, chunk, phase, op_core, 1, err));
    end(r);

    begin(r, layer_op(r, l, MODEL_OPR_PROJ, phase));
    if (fp)
        fp8_fwd(r, r->W->out,
                exec_fp8_quantize(F, c,
                                  pin == MODEL_FP8_PROJ_BOTH  ? EXEC_LA(a, PROJ_IN_FP8)
                                  : pin == MODEL_FP8_PROJ_FP8 ? EXEC_LA(a, PROJ_IN)
                                                              : F->q0,
                                  o, N, d->q_loc, 0, EXEC_FP8_X, fp, 0, rec),
                fp, N, phase);
    else
        mm_act(r, r->W->out, EXEC_LA(a, PROJ_IN), EXEC_LP(w, PROJ_W), N, h, d->q_loc, 0, 1);
    TRY(row_parallel_out(r, chunk, l, MODEL_OPR_PROJ, phase, EXEC_LP(w, PROJ_B),
                         EXEC_LA(a, ATTN_DROP_MASK), EXEC_SITE_ATTN_OUT, EXEC_LA(a, LN1_IN),
                         EXEC_LA(a, LN2_IN), mb, NULL, err));

    /* a MoE layer's fc1.in stays in the act dtype: the router reads it */
    const int moe = is_moe(c, l);
    begin(r, layer_op(r, l, MODEL_OPR_LN2, phase));
    void *ln2 = f1 && !moe ? F->act : EXEC_LA(a, FC1_IN);
    norm_fwd(r, ln2, EXEC_LA(a, LN2_IN), EXEC_LP(w, LN2_W), EXEC_LP(w, LN2_B), R);
    end(r);

    /* a MoE layer: the routed experts' output first (ws.dhid, free in the forward), then the
     * shared experts' beside it, or alone its dropout and residual */
    const void *routed = NULL;
    if (moe) {
        ExecMoeViews v;
        moe_views(r, l, a, &v);
        TRY(exec_moe_forward(r->moe, r, chunk, l, phase, &v, r->W->dhid, EXEC_LA(a, FC1_IN),
                             seq_index(r, mb, 0), mb, aux_weight(r), err));
        routed = r->W->dhid;
        if (d->sff_loc == 0) {
            resume(r, exec_meter_find(r->M, MODEL_OPR_COMBINE, l, chunk, phase, MODEL_COMM_COUNT, 0));
            if (c->dropout > 0) /* in place over ws.dhid */
                dropout_region(r, r->W->dhid, EXEC_LA(a, MLP_DROP_MASK), routed, mb, l,
                               EXEC_SITE_MLP_OUT);
            k->add(out, EXEC_LA(a, LN2_IN), routed, (size_t)R * h);
            end(r);
            return PX_OK;
        }
    }
    int Fw, FO;
    mlp_widths(c, l, &Fw, &FO);
    TRY(column_input(r, chunk, l, MODEL_OPR_FC1, phase, f1, EXEC_LA(a, FC1_IN), ln2, &x, &xq, err));
    if (f1)
        fp8_fwd(r, EXEC_LA(a, ACT_IN), xq, f1, N, phase);
    else
        mm_act(r, EXEC_LA(a, ACT_IN), x, EXEC_LP(w, FC1_W), N, FO, h, 0, 1);
    if (EXEC_LP(w, FC1_B))
        k->add_bias(EXEC_LA(a, ACT_IN), EXEC_LP(w, FC1_B), N, FO);
    end(r);

    begin(r, layer_op(r, l, MODEL_OPR_ACT, phase));
    void *hid = f2 ? F->act : EXEC_LA(a, FC2_IN);
    if (cfg->mlp == MODEL_SWIGLU)
        k->swiglu_fwd(hid, EXEC_LA(a, ACT_IN), N, Fw);
    else
        k->gelu_fwd(hid, EXEC_LA(a, ACT_IN), (size_t)N * Fw);
    end(r);

    begin(r, layer_op(r, l, MODEL_OPR_FC2, phase));
    if (f2)
        fp8_fwd(r, r->W->out,
                exec_fp8_quantize(F, c, EXEC_LA(a, FC2_IN), hid, N, Fw, 0, EXEC_FP8_X, f2, 0, rec),
                f2, N, phase);
    else
        mm_act(r, r->W->out, EXEC_LA(a, FC2_IN), EXEC_LP(w, FC2_W), N, h, Fw, 0, 1);
    return row_parallel_out(r, chunk, l, MODEL_OPR_FC2, phase, EXEC_LP(w, FC2_B),
                            EXEC_LA(a, MLP_DROP_MASK), EXEC_SITE_MLP_OUT, EXEC_LA(a, LN2_IN), out,
                            mb, routed, err);
}

/* The output gradient of a row-parallel layer over the full sequence: dropout's backward on
 * this rank's region of dres, then (SP) the all-gather of the regions. */
static int row_parallel_dy(const ExecLayerRun *r, int chunk, int l, ModelOpRole role,
                           const void *dres, const uint8_t *mask, const void **dy, PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, h = c->d.h;
    const void *y = dres;
    if (c->dropout > 0) {
        void *tmp = sp_on(c) ? r->W->dx_a : r->W->out;
        c->k->dropout_bwd(tmp, dres, mask, (size_t)R * h, c->dropout);
        y = tmp;
    }
    if (sp_on(c)) {
        end(r);
        TRY(tp_all_gather(r, role, l, chunk, MODEL_BWD, r->W->sp_gather, y, (size_t)R * h, err));
        resume(r, layer_op(r, l, role, MODEL_BWD));
        y = r->W->sp_gather;
    }
    *dy = y;
    return PX_OK;
}

/* The input gradient of a column-parallel layer (QKV, fc1) in ws.dhid is partial: all-reduce
 * it (the f operator), or reduce-scatter it into ws.dx_a's region. *dn gets where it is. */
static int column_parallel_dx(const ExecLayerRun *r, int chunk, int l, ModelOpRole role,
                              const void **dn, PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, h = c->d.h;
    if (sp_on(c)) {
        TRY(tp_reduce_scatter(r, role, l, chunk, MODEL_BWD, r->W->dx_a, r->W->dhid, (size_t)R * h,
                              err));
        *dn = r->W->dx_a;
        return PX_OK;
    }
    TRY(tp_allreduce(r, role, l, chunk, MODEL_BWD, r->W->dhid, (size_t)R * h, err));
    *dn = r->W->dhid;
    return PX_OK;
}

/* The attention core's backward, sequence by sequence and part by part (the fused path's or
 * the unfused one's saved tensors); out: its forward output (the fused path's). With context
 * parallelism the K, V gradients of each part land in cp.kv (free once cp.kv_full holds the
 * keys) and add up in cp.dkv, which cp_scatter_dkv hands back to their owners. */
static void attention_core_bwd(const ExecLayerRun *r, const ExecLayerActs *a, const void *out)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int cp = d->c > 1, kvs = cp ? 2 * d->kv_width_loc : qkv, P = exec_cp_parts(c);
    const int C = exec_cp_part_len(c);
    const size_t tile = (size_t)H * sl * d->s;
    if (cp)
        c->k->memset0(r->W->cp_dkv, (size_t)d->b * d->s * kvs * c->ab);
    for (int q = 0; q < d->b; q++) {
        const void *qb = AT(EXEC_LA(a, QKV_OUT), (size_t)q * sl * qkv);
        const void *kb = cp ? AT(r->W->cp_kv_full, (size_t)q * d->s * kvs) : AT(qb, d->q_loc);
        void *dbase = AT(r->W->dqkv, (size_t)q * sl * qkv);
        void *dkb = cp ? r->W->cp_kv : AT(dbase, d->q_loc);
        size_t at = 0;
        for (int j = 0; j < P; j++) {
            int q0, tk;
            cp_part_keys(c, j, &q0, &tk);
            const size_t rows = (size_t)q * sl + (size_t)j * C;
            KernAttnBwd b = {
                .B = 1, .Tq = C, .Tk = tk, .H = H, .KV = d->kv_loc, .D = d->hd, .q_offset = q0,
                .scale = (float)(1.0 / sqrt((double)d->hd)),
                .q = AT(qb, (size_t)j * C * qkv), .k = kb, .v = AT(kb, d->kv_width_loc),
                .q_stride = qkv, .k_stride = kvs, .v_stride = kvs,
                .dout = AT(r->W->dhid, rows * d->q_loc),
                .dq = AT(dbase, (size_t)j * C * qkv), .dk = dkb, .dv = AT(dkb, d->kv_width_loc),
                .dq_stride = qkv, .dk_stride = kvs, .dv_stride = kvs,
            };
            if (c->spec.job.flash_attn) {
                b.out = AT(out, rows * d->q_loc);
                b.lse = (const float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * H * sl + (size_t)j * H * C;
                b.drow = r->W->flash_d + (size_t)q * H * sl + (size_t)j * H * C;
            } else {
                b.probs = AT(EXEC_LA(a, SOFTMAX), q * tile + at);
                b.dscores = AT(r->W->dscores, q * tile + at);
                if (c->attn_dropout) {
                    b.dropout = c->dropout;
                    b.mask = (const uint8_t *)EXEC_LA(a, SOFTMAX_MASK) + q * tile;
                    b.probs_drop = AT(EXEC_LA(a, SOFTMAX_DROP), q * tile);
                }
            }
            at += (size_t)H * C * tk;
            c->k->attention_bwd(&b);
            if (cp)
                c->k->add_inplace(AT(r->W->cp_dkv, (size_t)q * d->s * kvs), dkb, (size_t)tk * kvs);
        }
        const double fwd = model_attention_fwd_flops(&c->spec, (double)H, sl, d->s, d->hd);
        exec_meter_flops(r->M, model_attention_bwd_flops(fwd, !!c->spec.job.flash_attn, NULL));
    }
}

/* The MLP's backward: fc2 (dropout, bias, dgrad into the activation's output gradient,
 * wgrad), the activation, fc1, and the f operator on its input gradient (*dn). */
static int mlp_bwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                   const void *dres, const void **dn, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    const ExecFp8Weight *f1 = exec_fp8_weight(r->fp8, MODEL_TR_FC1_W, l);
    const ExecFp8Weight *f2 = exec_fp8_weight(r->fp8, MODEL_TR_FC2_W, l);
    const int N = d->b * d->s_loc, h = d->h;
    int F, FO;
    mlp_widths(c, l, &F, &FO);

    begin(r, layer_op(r, l, MODEL_OPR_FC2, MODEL_BWD));
    const void *dy;
    TRY(row_parallel_dy(r, chunk, l, MODEL_OPR_FC2, dres, EXEC_LA(a, MLP_DROP_MASK), &dy, err));
    if (EXEC_LP(g, FC2_B))
        k->bias_grad(EXEC_LP(g, FC2_B), dy, N, h);
    void *dact = c->spec.model.mlp == MODEL_SWIGLU ? r->W->dact : r->W->dffn;
    if (f2) {
        fp8_bwd(r, dact, EXEC_LP(g, FC2_W), dy, fp8_saved(r, EXEC_LA(a, FC2_IN), N, F), NULL, f2,
                N);
    } else {
        mm_act(r, dact, dy, EXEC_LP(w, FC2_W), N, F, h, 0, 0);
        mm_f32(r, EXEC_LP(g, FC2_W), dy, EXEC_LA(a, FC2_IN), h, F, N, 1, 0, 1);
    }
    end(r);

    begin(r, layer_op(r, l, MODEL_OPR_ACT, MODEL_BWD));
    if (c->spec.model.mlp == MODEL_SWIGLU)
        k->swiglu_bwd(r->W->dffn, EXEC_LA(a, ACT_IN), r->W->dact, N, F);
    else
        k->gelu_bwd(r->W->dffn, EXEC_LA(a, ACT_IN), r->W->dffn, (size_t)N * F);
    end(r);

    /* a MoE layer's fc1.in is kept in the act dtype (the router reads it) */
    const void *x;
    ExecFp8Ref xq;
    TRY(column_bwd_input(r, chunk, l, MODEL_OPR_FC1, EXEC_LA(a, FC1_IN), f1 && !is_moe(c, l), &x,
                         &xq, err));
    if (EXEC_LP(g, FC1_B))
        k->bias_grad(EXEC_LP(g, FC1_B), r->W->dffn, N, FO);
    if (f1) {
        fp8_bwd(r, r->W->dhid, EXEC_LP(g, FC1_W), r->W->dffn, xq, x, f1, N);
    } else {
        mm_act(r, r->W->dhid, r->W->dffn, EXEC_LP(w, FC1_W), N, h, FO, 0, 0);
        mm_f32(r, EXEC_LP(g, FC1_W), r->W->dffn, x, FO, h, N, 1, 0, 1);
    }
    end(r);
    return column_parallel_dx(r, chunk, l, MODEL_OPR_FC1, dn, err);
}

/* A MoE layer's MLP backward: the routed experts' (over the region's output gradient, after
 * dropout's backward), then the shared experts' as a dense MLP's; *dn gets the sum of their
 * input gradients. The routed input gradient lands in the layer's saved experts' input, spent
 * by then. */
static int moe_mlp_bwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                       const void *dres, const void **dn, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, h = c->d.h;
    const int op_comb = exec_meter_find(r->M, MODEL_OPR_COMBINE, l, chunk, MODEL_BWD,
                                        MODEL_COMM_COUNT, 0);
    const void *dy = dres;
    if (c->dropout > 0) {
        void *tmp = sp_on(c) ? r->W->dx_a : r->W->out;
        resume(r, op_comb);
        c->k->dropout_bwd(tmp, dres, EXEC_LA(a, MLP_DROP_MASK), (size_t)R * h, c->dropout);
        end(r);
        dy = tmp;
    }
    ExecMoeViews v;
    moe_views(r, l, a, &v);
    /* under FP8 the experts' saved input is too small for it: ws.fp8's act part, which the
     * shared experts' backward leaves alone */
    void *dxr = r->fp8->on ? r->fp8->act : EXEC_LMA(a, EXP_IN);
    TRY(exec_moe_backward(r->moe, r, chunk, l, &v, dxr, dy, EXEC_LA(a, FC1_IN),
                          seq_index(r, mb, 0), mb, aux_weight(r), err));
    if (c->d.sff_loc == 0) {
        *dn = dxr;
        return PX_OK;
    }
    TRY(mlp_bwd(r, chunk, l, a, dres, dn, err));
    resume(r, op_comb);
    c->k->add((void *)*dn, *dn, dxr, (size_t)R * h);
    end(r);
    return PX_OK;
}

/* Backward of layer l: dres holds the gradient of the layer's output (this rank's region) and
 * leaves with the gradient of its input. */
static int layer_bwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *dres,
                     int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h, qkv = d->q_loc + 2 * d->kv_width_loc;
    const int sp = sp_on(c);
    const ExecFp8Weight *fq = exec_fp8_weight(r->fp8, MODEL_TR_QKV_W, l);
    const ExecFp8Weight *fp = exec_fp8_weight(r->fp8, MODEL_TR_PROJ_W, l);

    /* the recomputed layer's output is scratch: ws.out, or with SP (where ws.out feeds the
     * reduce-scatter) ws.dx_a, free until this layer's backward uses it */
    if (c->spec.layout.recompute == MODEL_RECOMPUTE_FULL)
        TRY(layer_fwd(r, chunk, l, a, sp ? r->W->dx_a : r->W->out, MODEL_RECOMPUTE, mb, err));
    /* DeepSpeed's ZeRO-3 freed the parameters after the recomputed forward: gathered again */
    if (twice_gathered(c)) {
        TRY(gather_block(r, r->P->layer_block[l], MODEL_BWD, 0, err));
        TRY(gather_block(r, r->P->expert_block[l], MODEL_BWD, 0, err));
    }

    const void *dn;
    if (is_moe(c, l))
        TRY(moe_mlp_bwd(r, chunk, l, a, dres, &dn, mb, err));
    else
        TRY(mlp_bwd(r, chunk, l, a, dres, &dn, err));

    begin(r, layer_op(r, l, MODEL_OPR_LN2, MODEL_BWD));
    norm_bwd(r, dres, EXEC_LP(g, LN2_W), EXEC_LP(g, LN2_B), dn, EXEC_LA(a, LN2_IN),
             EXEC_LP(w, LN2_W), R);
    end(r);

    begin(r, layer_op(r, l, MODEL_OPR_PROJ, MODEL_BWD));
    const void *dy;
    TRY(row_parallel_dy(r, chunk, l, MODEL_OPR_PROJ, dres, EXEC_LA(a, ATTN_DROP_MASK), &dy, err));
    if (EXEC_LP(g, PROJ_B))
        k->bias_grad(EXEC_LP(g, PROJ_B), dy, N, h);
    const ModelFp8ProjIn pin = model_fp8_proj_in(&c->spec);
    const ExecFp8Ref pq = fp8_saved(r, pin == MODEL_FP8_PROJ_BOTH ? EXEC_LA(a, PROJ_IN_FP8)
                                                                  : EXEC_LA(a, PROJ_IN),
                                    N, d->q_loc);
    if (fp && pin == MODEL_FP8_PROJ_ACT) {
        /* the act input saved: quantized again for the weight gradient */
        const ExecFp8Ref none = {NULL, {0, 0, 0, 0, 0, 0}};
        fp8_bwd(r, r->W->dhid, EXEC_LP(g, PROJ_W), dy, none, EXEC_LA(a, PROJ_IN), fp, N);
    } else if (fp) {
        fp8_bwd(r, r->W->dhid, EXEC_LP(g, PROJ_W), dy, pq, NULL, fp, N);
    } else {
        mm_act(r, r->W->dhid, dy, EXEC_LP(w, PROJ_W), N, d->q_loc, h, 0, 0);
        mm_f32(r, EXEC_LP(g, PROJ_W), dy, EXEC_LA(a, PROJ_IN), h, d->q_loc, N, 1, 0, 1);
    }
    end(r);

    /* Selective recompute re-creates the softmax (and its dropout) just before the core's
     * backward; the output it recomputes is not needed and lands in ws.dqkv, which the
     * backward then overwrites. */
    const int op_core = layer_op(r, l, MODEL_OPR_CORE, MODEL_BWD);
    const int rec_core = c->spec.layout.recompute == MODEL_RECOMPUTE_SELECTIVE &&
                         !c->spec.job.flash_attn;
    const int a2a = d->c > 1 && c->spec.layout.cp_comm == MODEL_CP_COMM_A2A;
    const int ring = d->c > 1 && c->spec.layout.cp_comm == MODEL_CP_COMM_P2P;
    const int cp = d->c > 1 && !a2a && !ring; /* the all-gather */
    /* context parallelism gathers K and V again for the backward (the op graph's backward
     * all-gather), which the selective recompute below reads too */
    if (cp)
        TRY(cp_gather_kv(r, a, chunk, l, MODEL_BWD, op_core, err));
    if (rec_core) {
        const int op_rec = layer_op(r, l, MODEL_OPR_CORE, MODEL_RECOMPUTE);
        begin(r, op_rec);
        /* with cp the keys are in cp.kv_full already: gathered once, for both */
        TRY(attention_core_fwd(r, a, r->W->dqkv, mb, l, chunk, MODEL_RECOMPUTE, op_rec, 0, err));
        end(r);
    }

    /* the fused path's backward reads the forward's output, saved in the act dtype whenever the
     * fused core runs (model_fp8_proj_in) */
    if (a2a) {
        TRY(attention_a2a_bwd(r, a, chunk, l, op_core, err));
    } else if (ring) {
        TRY(attention_ring_bwd(r, a, l, chunk, op_core, err));
    } else {
        begin(r, op_core);
        attention_core_bwd(r, a, EXEC_LA(a, PROJ_IN));
        end(r);
    }
    if (cp)
        TRY(cp_scatter_dkv(r, chunk, l, op_core, err));

    const void *x;
    ExecFp8Ref xq;
    TRY(column_bwd_input(r, chunk, l, MODEL_OPR_QKV, EXEC_LA(a, QKV_IN), fq != NULL, &x, &xq, err));
    if (c->spec.model.position == MODEL_POS_ROPE)
        rope(r, r->W->dqkv, 1);
    if (EXEC_LP(g, QKV_B))
        k->bias_grad(EXEC_LP(g, QKV_B), r->W->dqkv, N, qkv);
    if (fq) {
        fp8_bwd(r, r->W->dhid, EXEC_LP(g, QKV_W), r->W->dqkv, xq, x, fq, N);
    } else {
        mm_act(r, r->W->dhid, r->W->dqkv, EXEC_LP(w, QKV_W), N, h, qkv, 0, 0);
        mm_f32(r, EXEC_LP(g, QKV_W), r->W->dqkv, x, qkv, h, N, 1, 0, 1);
    }
    end(r);
    TRY(column_parallel_dx(r, chunk, l, MODEL_OPR_QKV, &dn, err));

    begin(r, layer_op(r, l, MODEL_OPR_LN1, MODEL_BWD));
    norm_bwd(r, dres, EXEC_LP(g, LN1_W), EXEC_LP(g, LN1_B), dn, EXEC_LA(a, LN1_IN),
             EXEC_LP(w, LN1_W), R);
    end(r);
    return PX_OK;
}

/* ---- the embedding and the output layer ---- */

/* Sequence q's part j in the micro-batch's token rows (exec_tok_row); its targets follow
 * one token on. */
static const int32_t *tok_part(const ExecCtx *c, const int32_t *tok, int q, int j)
{
    return tok + (size_t)q * exec_tok_row(c) + (size_t)j * (exec_cp_part_len(c) + 1);
}

static int embed_fwd(const ExecLayerRun *r, int chunk, int mb, ExecHeadActs *x, void *x0,
                     const int32_t *tok, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ExecParams *P = r->P;
    const int b = d->b, h = d->h, V = d->vocab_loc, R = b * d->s_sp;
    const int sp = sp_on(c);
    TRY(gather_block(r, P->embed_block, MODEL_FWD, 0, err));
    /* vocabulary-parallel: this rank's rows give a partial embedding, summed over TP; the
     * positions are added on one rank only */
    const void *wpe = c->g.tp_rank == 0 ? P->wpe : NULL;
    void *emb = sp || c->dropout > 0 ? r->W->out : x0;
    const int op = other_op(r, MODEL_OPR_EMBED, MODEL_FWD);
    begin(r, op);
    for (int q = 0; q < b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++) {
            const int C = exec_cp_part_len(c);
            k->embedding_fwd(AT(emb, ((size_t)q * d->s_loc + (size_t)j * C) * h),
                             tok_part(c, tok, q, j), P->wte, wpe, C, C,
                             exec_cp_part_pos(c, c->g.cp_rank, j), h, c->g.tp_rank * V, V);
        }
    end(r);
    if (sp) {
        TRY(tp_reduce_scatter(r, MODEL_OPR_EMBED, -1, chunk, MODEL_FWD, x0, emb, (size_t)R * h, err));
        emb = x0;
    } else {
        TRY(tp_allreduce(r, MODEL_OPR_EMBED, -1, chunk, MODEL_FWD, emb, (size_t)R * h, err));
    }
    if (c->dropout > 0) {
        resume(r, op);
        dropout_region(r, x0, EXEC_HA(x, EMBED_DROP_MASK), emb, mb, -1, EXEC_SITE_EMBED);
        end(r);
    }
    return PX_OK;
}

/* The vocabulary-parallel cross-entropy of one micro-batch over the fp32 logits in loss.probs:
 * the kernels' steps with the ranks' shards combined between them (max, sum of exponentials,
 * target logit); this rank's share of the summed token losses goes into the pass. */
static int cross_entropy(const ExecLayerRun *r, int chunk, ExecHeadActs *x, const int32_t *tok,
                         PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const int b = d->b, V = d->vocab_loc, N = b * d->s_loc, P = exec_cp_parts(c);
    const int C = exec_cp_part_len(c), v0 = c->g.tp_rank * V;
    float *probs = EXEC_HA(x, LOSS_PROBS);
    const int op_loss = other_op(r, MODEL_OPR_LOSS, MODEL_FWD);
    int op_ar = -1;
    if (d->t > 1 &&
        (op_ar = tp_op(r, MODEL_OPR_LOSS, -1, chunk, MODEL_FWD, MODEL_TP_ALLREDUCE, err)) < 0)
        return PX_ERUNTIME;
    float *rowmax = r->W->xent, *rowsum = rowmax + N, *target = rowsum + N, *loss = target + N;
    begin(r, op_loss);
    k->xent_rowmax(rowmax, probs, N, V);
    end(r);
    if (op_ar >= 0) {
        begin(r, op_ar);
        int rc = comm_allreduce(c->comm, rowmax, (size_t)N, PX_FP32, COMM_MAX, MODEL_TP_ALLREDUCE,
                                NULL, err);
        end(r);
        TRY(rc);
    }
    resume(r, op_loss);
    for (int q = 0; q < b; q++)
        for (int j = 0; j < P; j++) {
            const size_t o = (size_t)q * d->s_loc + (size_t)j * C;
            k->xent_expsum(rowsum + o, target + o, probs + o * V, rowmax + o,
                           tok_part(c, tok, q, j) + 1, C, V, v0);
        }
    end(r);
    /* the op's calls are the communication calls, as the graph counts them (3 per pass) */
    for (int i = 0; i < 2 && op_ar >= 0; i++) {
        begin(r, op_ar);
        int rc = comm_allreduce(c->comm, i == 0 ? rowsum : target, (size_t)N, PX_FP32, COMM_SUM,
                                MODEL_TP_ALLREDUCE, NULL, err);
        end(r);
        TRY(rc);
    }
    resume(r, op_loss);
    k->xent_finish(loss, probs, rowsum, rowmax, target, N, V);
    /* every TP rank has the same losses: one of them reports them (each cp rank its tokens') */
    if (c->g.tp_rank == 0) {
        k->to_host(r->W->host_loss, loss, (size_t)N * sizeof *loss);
        double sum = 0.0;
        for (int n = 0; n < N; n++)
            sum += r->W->host_loss[n];
        r->pass->loss_sum += sum;
    }
    end(r);
    return PX_OK;
}

/* The output layer and the cross-entropy of one micro-batch. */
static int head_fwd(const ExecLayerRun *r, int chunk, ExecHeadActs *x, const int32_t *tok,
                    PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ExecParams *P = r->P;
    const int h = d->h, V = d->vocab_loc;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, vocab = c->spec.model.vocab;
    const int v0 = c->g.tp_rank * V;
    TRY(gather_block(r, P->final_block, MODEL_FWD, 0, err));
    begin(r, other_op(r, MODEL_OPR_FINAL_LN, MODEL_FWD));
    norm_fwd(r, EXEC_HA(x, LOGITS_IN), EXEC_HA(x, FINAL_LN_IN), P->lnf_w, P->lnf_b, R);
    end(r);
    const void *in = EXEC_HA(x, LOGITS_IN);
    if (sp_on(c)) {
        TRY(tp_all_gather(r, MODEL_OPR_LOGITS, -1, chunk, MODEL_FWD, r->W->sp_gather,
                          EXEC_HA(x, LOGITS_IN), (size_t)R * h, err));
        in = r->W->sp_gather;
    }
    if (c->g.tied_here)
        TRY(gather_block(r, P->embed_block, MODEL_FWD, 1, err));

    /* fp32 logits straight into the saved probabilities; columns of the vocabulary padding
     * get -inf, so they take no probability and the loss does not depend on the padding */
    float *probs = EXEC_HA(x, LOSS_PROBS);
    begin(r, other_op(r, MODEL_OPR_LOGITS, MODEL_FWD));
    mm_f32(r, probs, in, P->out_w, N, V, h, 0, 1, 0);
    if (vocab < v0 + V)
        k->fill_cols_f32(probs, N, V, vocab > v0 ? vocab - v0 : 0, V, -INFINITY);
    end(r);
    return cross_entropy(r, chunk, x, tok, err);
}

/* The gradient of the logits, computed in fp32 over the probabilities, in the act dtype for the
 * output layer's GEMMs (cuBLAS takes both operands in one dtype), narrowed in place so that it
 * stays within loss.probs as the tensor table sizes it: element i moves from byte 4i to byte
 * ab*i. A cast of elements [lo, 2lo) writes bytes [2lo, 4lo) (bf16), which hold elements below
 * lo that earlier casts have read, and never its own input (bytes [4lo, 8lo)): so elements 0,
 * [1, 2), [2, 4), [4, 8) ... are each one ordinary cast, 1 + log2(n) calls in stream order. */
static const void *dlogits_act(const ExecLayerRun *r, float *probs, size_t n)
{
    if (r->c->act == PX_FP32 || n == 0)
        return probs;
    r->c->k->cast_to_act(probs, probs, 1); /* one element: read, then written, by one thread */
    for (size_t lo = 1; lo < n; lo *= 2)
        r->c->k->cast_to_act(AT(probs, lo), probs + lo, (2 * lo < n ? 2 * lo : n) - lo);
    return probs;
}

/* The output layer's weight gradient: dW += dlogits^T x (SP: x re-gathered). The logits'
 * gradient is already in the act dtype (dlogits_act). */
static int logits_wgrad(const ExecLayerRun *r, int chunk, const ExecHeadActs *x, PxError *err)
{
    const ModelDims *d = &r->c->d;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, V = d->vocab_loc, h = d->h;
    const void *in = EXEC_HA(x, LOGITS_IN);
    if (sp_on(r->c)) {
        TRY(tp_all_gather(r, MODEL_OPR_LOGITS, -1, chunk, MODEL_BWD, r->W->sp_gather,
                          EXEC_HA(x, LOGITS_IN), (size_t)R * h, err));
        in = r->W->sp_gather;
    }
    resume(r, other_op(r, MODEL_OPR_LOGITS, MODEL_BWD));
    mm_f32(r, r->P->g_out_w, EXEC_HA(x, LOSS_PROBS), in, V, h, N, 1, 0, 1);
    end(r);
    return PX_OK;
}

static int head_bwd(const ExecLayerRun *r, int chunk, const ExecHeadActs *x, const int32_t *tok,
                    void *dres, int last_mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    ExecParams *P = r->P;
    const int b = d->b, h = d->h, V = d->vocab_loc, C = exec_cp_part_len(c);
    const int N = b * d->s_loc, R = b * d->s_sp;
    /* the loss is the mean over every token of the global batch (of every cp rank's), times
     * the fp16 loss scale */
    const float dloss = (float)(r->pass->loss_scale / ((double)c->spec.job.global_batch * d->s));
    float *probs = EXEC_HA(x, LOSS_PROBS);
    exec_zero_bucket_clear(r->Z, c, P, P->final_block);
    TRY(gather_block(r, P->final_block, MODEL_BWD, 0, err));
    if (c->g.tied_here)
        TRY(gather_block(r, P->embed_block, MODEL_BWD, 0, err));

    begin(r, other_op(r, MODEL_OPR_LOSS, MODEL_BWD));
    for (int q = 0; q < b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++)
            k->xent_bwd(probs + ((size_t)q * d->s_loc + (size_t)j * C) * V,
                        tok_part(c, tok, q, j) + 1, C, V, c->g.tp_rank * V, dloss);
    const void *dlogits = dlogits_act(r, probs, (size_t)N * V);
    end(r);

    /* input gradient now; the weight gradient too, unless the embedding's block must be in
     * the ZeRO bucket to receive it (then just before the embedding's backward) */
    void *dx = sp_on(c) ? r->W->out : r->W->dx_a;
    begin(r, other_op(r, MODEL_OPR_LOGITS, MODEL_BWD));
    mm_act(r, dx, dlogits, P->out_w, N, h, V, 0, 0);
    end(r);
    if (!c->g.defer_logits_wgrad)
        TRY(logits_wgrad(r, chunk, x, err));
    if (sp_on(c))
        TRY(tp_reduce_scatter(r, MODEL_OPR_LOGITS, -1, chunk, MODEL_BWD, r->W->dx_a, dx,
                              (size_t)R * h, err));
    else
        TRY(tp_allreduce(r, MODEL_OPR_LOGITS, -1, chunk, MODEL_BWD, r->W->dx_a, (size_t)R * h,
                         err));

    begin(r, other_op(r, MODEL_OPR_FINAL_LN, MODEL_BWD));
    k->memset0(dres, (size_t)R * h * c->ab);
    norm_bwd(r, dres, P->g_lnf_w, P->g_lnf_b, r->W->dx_a, EXEC_HA(x, FINAL_LN_IN), P->lnf_w, R);
    end(r);
    TRY(exec_zero_bucket_reduce(r->Z, c, P, r->M, P->final_block, err));
    if (last_mb)
        TRY(exec_zero_block_done(r->Z, c, P, r->M, P->final_block, err));
    return PX_OK;
}

static int embed_bwd(const ExecLayerRun *r, int chunk, const ExecHeadActs *x, const int32_t *tok,
                     const void *dres, int last_mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    ExecParams *P = r->P;
    const int b = d->b, h = d->h, V = d->vocab_loc, R = b * d->s_sp, C = exec_cp_part_len(c);
    exec_zero_bucket_clear(r->Z, c, P, P->embed_block);
    if (c->g.defer_logits_wgrad)
        TRY(logits_wgrad(r, chunk, x, err));
    const int op = other_op(r, MODEL_OPR_EMBED, MODEL_BWD);
    begin(r, op);
    const void *dy = dres;
    if (c->dropout > 0) {
        void *tmp = sp_on(c) ? r->W->dx_a : r->W->out;
        k->dropout_bwd(tmp, dres, EXEC_HA(x, EMBED_DROP_MASK), (size_t)R * h, c->dropout);
        dy = tmp;
    }
    end(r);
    if (sp_on(c)) {
        TRY(tp_all_gather(r, MODEL_OPR_EMBED, -1, chunk, MODEL_BWD, r->W->sp_gather, dy,
                          (size_t)R * h, err));
        dy = r->W->sp_gather;
    }
    TRY(gather_block(r, P->embed_block, MODEL_BWD, c->g.tied_here ? 1 : 0, err));
    resume(r, op);
    for (int q = 0; q < b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++)
            k->embedding_bwd(P->g_wte, P->g_wpe, AT(dy, ((size_t)q * d->s_loc + (size_t)j * C) * h),
                             tok_part(c, tok, q, j), C, C, exec_cp_part_pos(c, c->g.cp_rank, j), h,
                             c->g.tp_rank * V, V);
    end(r);
    TRY(exec_zero_bucket_reduce(r->Z, c, P, r->M, P->embed_block, err));
    if (last_mb)
        TRY(exec_zero_block_done(r->Z, c, P, r->M, P->embed_block, err));
    return PX_OK;
}

/* ---- a chunk's passes of one micro-batch ---- */

int exec_layers_forward(const ExecLayerRun *r, int j, int mb, ExecLayerActs *A, ExecHeadActs *x,
                        const int32_t *tok, PxError *err)
{
    const ExecCtx *c = r->c;
    const int g = c->g.chunk_g[j], cl = c->g.chunk_cl[j], l0 = c->g.chunk_l0[j];
    const int last = g == c->d.chunks - 1;
    /* the chunk's output: the output layer's input, or a scratch that is sent on (with SP
     * ws.out feeds the last reduce-scatter, so ws.dx_a holds the region; a chunk of the
     * embedding only sends from ws.dx_a too, as its dropout reads ws.out) */
    void *send = sp_on(c) || cl == 0 ? r->W->dx_a : r->W->out;
    /* the chunk's input: its first layer's, or (a chunk without layers) its output */
    void *in = cl > 0 ? EXEC_LA(&A[0], LN1_IN) : last ? EXEC_HA(x, FINAL_LN_IN) : send;
    if (g == 0) {
        TRY(embed_fwd(r, j, mb, x, in, tok, err));
    } else {
        TRY(exec_pipe_take(r->pipe, c, r->M, j, mb, 0, in, err));
        exec_meter_pass_input(r->M);
    }
    for (int li = 0; li < cl; li++) {
        const int l = l0 + li;
        void *out = li + 1 < cl ? EXEC_LA(&A[li + 1], LN1_IN) : last ? EXEC_HA(x, FINAL_LN_IN) : send;
        TRY(gather_block(r, r->P->layer_block[l], MODEL_FWD, 0, err));
        TRY(gather_block(r, r->P->expert_block[l], MODEL_FWD, 0, err)); /* ZeRO-3, the other half */
        /* ZeRO-3's prefetch: the next layers' gathers issued before this one computes */
        for (int a = 1; a <= r->Z->ahead && li + a < cl; a++)
            TRY(exec_zero_prefetch(r->Z, c, r->P, r->M, r->P->layer_block[l + a], MODEL_FWD, err));
        TRY(layer_fwd(r, j, l, &A[li], out, MODEL_FWD, mb, err));
    }
    if (last)
        return head_fwd(r, j, x, tok, err);
    return exec_pipe_give(r->pipe, c, r->M, j, mb, 0, send, err);
}

int exec_layers_backward(const ExecLayerRun *r, int j, int mb, ExecLayerActs *A,
                         const ExecHeadActs *x, const int32_t *tok, int last_mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const int g = c->g.chunk_g[j], cl = c->g.chunk_cl[j], l0 = c->g.chunk_l0[j];
    void *dres = r->W->dx_b;
    if (g == c->d.chunks - 1) {
        TRY(head_bwd(r, j, x, tok, dres, last_mb, err));
    } else {
        TRY(exec_pipe_take(r->pipe, c, r->M, j, mb, 1, dres, err));
        exec_meter_pass_input(r->M);
    }
    for (int li = cl - 1; li >= 0; li--) {
        const int l = l0 + li, blk = r->P->layer_block[l];
        exec_zero_bucket_clear(r->Z, c, r->P, blk);
        /* ZeRO-3: DeepSpeed's gather for the recomputed forward, else the backward's (which
         * with --fsdp serves the recomputed forward too); then the earlier layers' prefetched */
        const ModelPhase first = twice_gathered(c) ? MODEL_RECOMPUTE : MODEL_BWD;
        TRY(gather_block(r, blk, first, 0, err));
        TRY(gather_block(r, r->P->expert_block[l], first, 0, err));
        for (int a = 1; a <= r->Z->ahead && li - a >= 0; a++)
            TRY(exec_zero_prefetch(r->Z, c, r->P, r->M, r->P->layer_block[l - a], first, err));
        TRY(layer_bwd(r, j, l, &A[li], dres, mb, err));
        TRY(exec_zero_bucket_reduce(r->Z, c, r->P, r->M, blk, err));
        if (last_mb)
            TRY(exec_zero_block_done(r->Z, c, r->P, r->M, blk, err));
        /* a MoE layer's routed experts: their own block, reduced over the expert-data-parallel
         * group */
        if (last_mb && r->P->expert_block[l] >= 0)
            TRY(exec_zero_block_done(r->Z, c, r->P, r->M, r->P->expert_block[l], err));
    }
    if (g == 0)
        return embed_bwd(r, j, x, tok, dres, last_mb, err);
    return exec_pipe_give(r->pipe, c, r->M, j, mb, 1, dres, err);
}
