/* One chunk's forward and backward of one micro-batch through the kernels of kernels.h, op by
 * op as the op graph lists them (model/ops.c, in this order). Each op is one scope: opened
 * where it starts and closed where it ends (meter.c), its communication opened within it under
 * its own op: tensor and sequence parallelism's collectives (tp.c), context parallelism's
 * (cp.c), a MoE layer's routed experts (moe.c), ZeRO's gathers and reductions (zero.c) and the
 * pipeline's transfers (pipeline.c) are theirs to run.
 *
 * Tensor parallelism shards the layers as Megatron-LM does (tp.c): norms, bias, dropout and the
 * residual adds run alike on every TP rank over this rank's rows (all of them, or with sequence
 * parallelism its R = b*s/t of the micro-batch's flat [b*s, h] activation). Dropout draws
 * every token's mask from its sequence's stream at the token's place, so any sharding draws what
 * one rank would. Context parallelism (cp.c) gives a rank two parts of each sequence, embedded,
 * rotated and scored at their global positions.
 *
 * Buffers (docs/memory.md): a layer reads its input from its slot's ln1.in and writes the next
 * layer's ln1.in (the chunk's last one final_ln.in, or a scratch that is sent on); row-parallel
 * outputs pass through ws.out (the full sequence) before the reduction; backward keeps the
 * residual-stream gradient in ws.dx_b (the norm backwards add into it, which is the residual
 * branch), the matmul input gradients in ws.dhid, ws.dqkv, ws.dffn and ws.dact, and sequence
 * parallelism's sharded temporaries in ws.dx_a; sp.gather holds whatever was gathered. */
#include <math.h>
#include <string.h>

#include "exec/train/internal.h"

#define TRY EXEC_TRY

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
    case MODEL_TR_WS_MLA: act = &W->mla; break;
    case MODEL_TR_EP_GATHER: act = &W->ep_gather; break;
    case MODEL_TR_EP_PROBS: f32 = &W->ep_probs; break;
    case MODEL_TR_EP_DW: f32 = &W->ep_dw; break;
    case MODEL_TR_EP_MAP:
        if (t->dtype != PX_UINT8)
            return exec_bind_wrong_dtype(t, PX_UINT8, err);
        W->ep_map = p;
        return PX_OK;
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

/* ---- op scopes and counting ---- */

/* Opens the op of (role, phase): layer l's, or (l -1) the one outside the layers; returns it
 * for op_close. An error return from within leaves it open: the step fails (meter.c). */
static int op_open(const ExecLayerRun *r, int l, ModelOpRole role, ModelPhase ph)
{
    const int op = l >= 0 ? exec_meter_layer_op(r->M, l, role, ph)
                          : exec_meter_other_op(r->M, role, ph);
    exec_meter_open(r->M, r->c->k, op);
    return op;
}

static void op_close(const ExecLayerRun *r, int op) { exec_meter_close(r->M, r->c->k, op); }

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

/* A weight gradient's GEMM, accumulated into the gradient in its dtype (fp32, or 16-bit with
 * training.grad_dtype: rounded once per call, as Megatron's wgrad into a bf16 main_grad). */
static void mm_grad(const ExecLayerRun *r, float *dw, const void *a, const void *b, int m, int n,
                    int k)
{
    r->c->k->matmul(dw, r->c->grad, a, b, m, n, k, 1, 0, 1.0f, 1.0f);
    exec_meter_flops(r->M, 2.0 * m * n * k);
}

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

/* A column-parallel linear's backward from dy (N x out) and its input x (N x in): the bias's
 * gradient when it has one, then dx = dy W into ws.dhid and dW += dy^T x, in FP8 with weight f8
 * (xq its input's FP8 copy) or in the act dtype. */
static void column_linear_bwd(const ExecLayerRun *r, void *bgrad, float *wgrad, const void *w,
                              const void *dy, const void *x, ExecFp8Ref xq,
                              const ExecFp8Weight *f8, int N, int in, int out)
{
    if (bgrad)
        r->c->k->bias_grad(bgrad, dy, N, out);
    if (f8) {
        fp8_bwd(r, r->W->dhid, wgrad, dy, xq, x, f8, N);
    } else {
        mm_act(r, r->W->dhid, dy, w, N, in, out, 0, 0);
        mm_grad(r, wgrad, dy, x, out, in, N);
    }
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

/* out = dropout(x) over this rank's region of the micro-batch (out may alias x): every token
 * of sequence q at global position t draws elements t*h ... of sequence q's stream, whichever
 * rank holds it (SP: a tp rank's rows of the b x s_loc; cp: each of the rank's parts at its
 * global positions). */
static void dropout_region(const ExecLayerRun *r, void *out, uint8_t *mask, const void *x, int mb,
                           int layer, int site)
{
    const ExecCtx *c = r->c;
    const int sl = c->d.s_loc, h = c->d.h, R = c->d.b * c->d.s_sp, C = exec_cp_part_len(c);
    const long long first = exec_sp_on(c) ? (long long)c->g.tp_rank * R : 0;
    for (long long n = first; n < first + R;) {
        const int q = (int)(n / sl), tl = (int)(n % sl), j = tl / C;
        const int t0 = exec_cp_part_pos(c, c->g.cp_rank, j) + tl % C;
        long long cnt = C - tl % C; /* to the end of the part */
        if (n + cnt > first + R)
            cnt = first + R - n;
        const size_t o = (size_t)(n - first) * (size_t)h;
        c->k->dropout_fwd(AT(out, o), mask + o, AT(x, o), (size_t)cnt * h, c->dropout,
                          exec_stream_at(exec_drop_seed(r, exec_seq_index(r, mb, q), layer, site),
                                         (uint64_t)t0 * (uint64_t)h));
        n += cnt;
    }
}

/* dropout's backward over this rank's region of dres, into ws.dx_a with SP (ws.out feeds the
 * reduce-scatter there) or ws.out; dres itself without dropout. */
static const void *dropout_bwd(const ExecLayerRun *r, const void *dres, const uint8_t *mask)
{
    const ExecCtx *c = r->c;
    if (c->dropout <= 0)
        return dres;
    void *tmp = exec_sp_on(c) ? r->W->dx_a : r->W->out;
    c->k->dropout_bwd(tmp, dres, mask, (size_t)c->d.b * c->d.s_sp * c->d.h, c->dropout);
    return tmp;
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
    v->router_b = EXEC_LPM(w, ROUTER_B);
    v->fc1_b = EXEC_LPM(w, EXP_FC1_B);
    v->fc2_b = EXEC_LPM(w, EXP_FC2_B);
    v->g_router_b = EXEC_LPM(g, ROUTER_B);
    v->g_fc1_b = EXEC_LPM(g, EXP_FC1_B);
    v->g_fc2_b = EXEC_LPM(g, EXP_FC2_B);
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
    v->idx_g = EXEC_LMA(a, EP_IDX);
    v->w_g = EXEC_LMA(a, EP_W);
    v->ag_x = r->W->ep_gather;
    v->ag_probs = r->W->ep_probs;
    v->ag_map = r->W->ep_map;
    v->ag_dw = r->W->ep_dw;
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

/* ---- ZeRO-3's gathers (zero.c) ---- */

static int gather_block(const ExecLayerRun *r, int b, ModelPhase ph, int occurrence, PxError *err)
{
    return exec_zero_gather(r->Z, r->c, r->P, r->M, b, ph, occurrence, err);
}

/* ---- the attention core ---- */

/* FP8 attention (model_fp8_attn_qkv; docs/fp8.md, "FP8 attention"): where the QKV projection
 * writes Q, K and V and the core reads them, ws.fp8's act part (attn.qkv.out holds their FP8
 * copy); NULL without it. */
static void *fp8_core_qkv(const ExecLayerRun *r)
{
    return model_fp8_attn_qkv(&r->c->spec) ? r->fp8->act : NULL;
}

static void *core_qkv(const ExecLayerRun *r, const ExecLayerActs *a)
{
    void *x = fp8_core_qkv(r);
    return x ? x : EXEC_LA(a, QKV_OUT);
}

/* The FP8 weight whose amax holds FP8 attention's histories (model_fp8_attn_weight: QKV's,
 * or multi-head latent attention's kv_b) */
static const ExecFp8Weight *fp8_core_weight(const ExecLayerRun *r, int l)
{
    return exec_fp8_weight(r->fp8, model_fp8_attn_weight(&r->c->spec), l);
}

/* MXFP8 attention (model_fp8_attn_copies 2; docs/fp8.md, "FP8 attention"): where the core
 * reads the column-wise copies, decoded into ws.fp8's act part after the row-wise Q, K, V
 * (fp8_core_qkv): Q, K, V (dout 0), then the backward's output gradient (dout 1) after them;
 * NULL under another recipe, whose core reads one copy. */
static void *fp8_core_col(const ExecLayerRun *r, int dout)
{
    const ExecCtx *c = r->c;
    const size_t N = (size_t)c->d.b * (size_t)c->d.s_loc, qkv = (size_t)(c->d.q_loc + c->d.kv2_loc);
    if (model_fp8_attn_copies(&c->spec) != 2)
        return NULL;
    return EXEC_AT(r->fp8->act, N * qkv * (dout ? 2 : 1), c->ab);
}

/* The column-wise copy of rows x cols act values x (a sequence's rows one after another, each
 * sequence a multiple of 32 rows: model/spec.c's MXFP8 attention rule): MXFP8's blocks turned
 * along the rows, 32 x 1 with their E8M0 scales (OCP MX), written to q (grad: an output
 * gradient, E5M2 in the hybrid format). Returns its layout. */
static KernFp8 fp8_core_colwise(const ExecLayerRun *r, void *q, const void *x, int rows, int cols,
                                int grad)
{
    KernFp8 f = exec_fp8_desc(r->fp8, rows, cols, 0, grad);
    const int br = f.block_r;
    f.block_r = f.block_c;
    f.block_c = br;
    r->c->k->fp8_quantize(q, NULL, x, &f, 0, NULL);
    return f;
}

/* MXFP8 attention's column-wise copies of Q, K and V (codes at qc, after the row-wise copy),
 * quantized from x (NULL: the saved copy, decoded only) and decoded into col. A 32 x 1 block
 * holds one column of 32 rows, so the copy follows the layout: one tensor of the packed rows
 * [Q | K | V], or with multi-head latent attention one per plane (mla.c's Q, K and V planes,
 * one after another, as exec_qkv_at reads them), each with its scales after its codes: the
 * same bytes as one tensor of b·s × (q + 2 kv) (model_fp8_attn_copies' price). */
static void fp8_core_cols(const ExecLayerRun *r, uint8_t *qc, const void *x, void *col)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int N = d->b * d->s_loc, mla = exec_mla_on(c), qk = d->heads_loc * d->qk_hd;
    const int width[3] = {mla ? qk : d->q_loc + d->kv2_loc, qk, d->heads_loc * d->v_hd};
    size_t at = 0; /* the plane's first element */
    for (int i = 0; i < (mla ? 3 : 1); i++) {
        KernFp8 f = exec_fp8_desc(r->fp8, N, width[i], 0, 0);
        if (x)
            f = fp8_core_colwise(r, qc, AT(x, at), N, width[i], 0);
        else {
            const int br = f.block_r;
            f.block_r = f.block_c;
            f.block_c = br;
        }
        c->k->fp8_dequantize(AT(col, at), qc, &f);
        qc += kern_fp8_bytes(&f);
        at += (size_t)N * (size_t)width[i];
    }
}

/* MXFP8 attention with the all-gather (model_fp8_attn_cp16; docs/fp8.md, "FP8 attention with
 * context parallelism"): where the whole sequence's K, V are decoded from their column-wise
 * copy, after the core's other copies in ws.fp8's act part (b x s rows of kv2, cp.kv_full's
 * layout); NULL elsewhere. */
static void *fp8_core_kv_col(const ExecLayerRun *r)
{
    const ExecCtx *c = r->c;
    const size_t N = (size_t)c->d.b * (size_t)c->d.s_loc;
    const size_t w = 2 * (size_t)(c->d.q_loc + c->d.kv2_loc) + (size_t)c->d.o_loc;
    if (!model_fp8_attn_cp16(&c->spec) || c->d.c < 2 ||
        c->spec.layout.cp_comm != MODEL_CP_COMM_ALLGATHER)
        return NULL;
    return EXEC_AT(r->fp8->act, N * w, c->ab);
}

/* MXFP8 attention with the all-gather, after each gather (the forward's, a full recompute's
 * and the backward's), as Transformer Engine's AttnFuncWithCPAndKVAllGather quantizes each
 * step's Q and K, V after the exchange (combine_and_quantize) and saves the 16-bit tensors:
 * this rank's 16-bit Q, K, V (attn.qkv.out) quantized into both copies and decoded into
 * ws.fp8's act part as on one rank (row-wise at fp8_core_qkv, column-wise at fp8_core_col),
 * and the gathered K, V of the whole sequence (cp.kv_full) the same: the column-wise copy
 * decoded into fp8_core_kv_col, the row-wise one in place. Each copy's codes pass through
 * ws.fp8's q0, one at a time. On the ring (AttnFuncWithCPAndKVP2P, the same 16-bit saves)
 * this rank's Q, K, V only, before the ring passes; each block is quantized at its step. */
static void fp8_core_cp16(const ExecLayerRun *r, const ExecLayerActs *a, int l, int rec)
{
    const ExecCtx *c = r->c;
    const int N = c->d.b * c->d.s_loc, qkv = c->d.q_loc + c->d.kv2_loc, S = c->d.b * c->d.s;
    const ExecFp8Weight *fq = fp8_core_weight(r, l);
    const void *own = EXEC_LA(a, QKV_OUT);
    void *kv = r->W->cp_kv_full;
    fp8_core_cols(r, r->fp8->q0, own, fp8_core_col(r, 0));
    ExecFp8Ref q = exec_fp8_core_quantize(r->fp8, c, r->fp8->q0, own, N, qkv, EXEC_FP8_CORE_QKV,
                                          fq, rec);
    c->k->fp8_dequantize(r->fp8->act, q.q, &q.f);
    if (!fp8_core_kv_col(r)) /* the ring: its blocks at each step (cp.c's ring_mx_block) */
        return;
    const KernFp8 f = fp8_core_colwise(r, r->fp8->q0, kv, S, c->d.kv2_loc, 0);
    c->k->fp8_dequantize(fp8_core_kv_col(r), r->fp8->q0, &f);
    q = exec_fp8_core_quantize(r->fp8, c, r->fp8->q0, kv, S, c->d.kv2_loc, EXEC_FP8_CORE_QKV, fq,
                               0);
    c->k->fp8_dequantize(kv, q.q, &q.f);
}

/* FP8 attention's forward, under the core's op: Q, K, V (act, in ws.fp8's act part) quantized
 * with one scale (their own, or under delayed scaling their history's: rec, a forward, records
 * their amax) into attn.qkv.out, the copy the backward reads, and decoded in place: the core's
 * matmuls take the FP8 values. The unfused core (model/ops.c's attention_fp8_emulated) rounds
 * attn.qkv.out in place, through ws.fp8's first copy. */
static void fp8_core_fwd(const ExecLayerRun *r, const ExecLayerActs *a, int l, int rec)
{
    const ExecCtx *c = r->c;
    const int N = c->d.b * c->d.s_loc, qkv = c->d.q_loc + c->d.kv2_loc;
    if (!model_fp8_op(&c->spec, MODEL_OPR_CORE) || model_fp8_attn_cp16(&c->spec))
        return; /* MXFP8 with cp: after the gather, or on the ring (fp8_core_cp16) */
    const ExecFp8Weight *fq = fp8_core_weight(r, l);
    void *x = fp8_core_qkv(r), *saved = EXEC_LA(a, QKV_OUT), *col = fp8_core_col(r, 0);
    if (col) { /* MXFP8: the column-wise copy after the row-wise one, from the values before
                  the row-wise copy's decode replaces them */
        const KernFp8 row = exec_fp8_desc(r->fp8, N, qkv, 0, 0);
        fp8_core_cols(r, (uint8_t *)saved + kern_fp8_bytes(&row), x, col);
    }
    const ExecFp8Ref q = exec_fp8_core_quantize(r->fp8, c, x ? saved : r->fp8->q0, x ? x : saved,
                                                N, qkv, EXEC_FP8_CORE_QKV, fq, rec);
    c->k->fp8_dequantize(x ? x : saved, q.q, &q.f);
}

/* Under delayed scaling, after the fused core: its output (exec_fp8_core_out) quantized with its
 * history's scale into attn.proj.in, the copy the backward reads, and decoded in place, the
 * values the projection quantizes with its own scale. */
static void fp8_core_fwd_out(const ExecLayerRun *r, const ExecLayerActs *a, int l, int rec)
{
    const ExecCtx *c = r->c;
    void *o = exec_fp8_core_out(r);
    if (!o || exec_cp_quantizes_out(c)) /* Ulysses: in the head split (cp.c) */
        return;
    const ExecFp8Ref q = exec_fp8_core_quantize(
        r->fp8, c, EXEC_LA(a, PROJ_IN), o, c->d.b * c->d.s_loc, c->d.o_loc, EXEC_FP8_CORE_O,
        fp8_core_weight(r, l), rec);
    c->k->fp8_dequantize(o, q.q, &q.f);
}

/* Its backward, under the core's op: the saved FP8 Q, K, V decoded into ws.fp8's act part (the
 * unfused core's are rounded already), the saved FP8 output too under delayed scaling, and the
 * output gradient (ws.dhid) quantized as a gradient into ws.fp8's first copy and decoded in
 * place. Returns the core's output, as its backward reads it. */
static const void *fp8_core_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int l)
{
    const ExecCtx *c = r->c;
    const int N = c->d.b * c->d.s_loc, qkv = c->d.q_loc + c->d.kv2_loc;
    if (!model_fp8_op(&c->spec, MODEL_OPR_CORE))
        return EXEC_LA(a, PROJ_IN);
    const ExecFp8Weight *fq = fp8_core_weight(r, l);
    void *x = fp8_core_qkv(r), *o = exec_fp8_core_out(r), *col = fp8_core_col(r, 0);
    void *dcol = fp8_core_col(r, 1);
    if (model_fp8_attn_cp16(&c->spec)) /* MXFP8 with cp: the saved 16-bit Q, K, V again */
        fp8_core_cp16(r, a, l, 0);
    else if (x) {
        const ExecFp8Ref q = exec_fp8_saved(r->fp8, EXEC_LA(a, QKV_OUT), N, qkv);
        c->k->fp8_dequantize(x, q.q, &q.f);
        if (col) /* MXFP8: the saved column-wise copy after the row-wise one */
            fp8_core_cols(r, (uint8_t *)q.q + kern_fp8_bytes(&q.f), NULL, col);
    }
    if (dcol) { /* MXFP8: dO's column-wise copy, before its row-wise decode replaces it */
        const KernFp8 f = fp8_core_colwise(r, r->fp8->q0, r->W->dhid, N, c->d.o_loc, 1);
        c->k->fp8_dequantize(dcol, r->fp8->q0, &f);
    }
    if (o) {
        const ExecFp8Ref q = exec_fp8_saved(r->fp8, EXEC_LA(a, PROJ_IN), N, c->d.o_loc);
        c->k->fp8_dequantize(o, q.q, &q.f);
    }
    const ExecFp8Ref g = exec_fp8_core_quantize(r->fp8, c, r->fp8->q0, r->W->dhid, N, c->d.o_loc,
                                                EXEC_FP8_CORE_DO, fq, 1);
    c->k->fp8_dequantize(r->W->dhid, g.q, &g.f);
    return o ? o : EXEC_LA(a, PROJ_IN);
}

/* The attention core's forward, within its op, sequence by sequence and (context parallelism)
 * part by part: each part's queries against the keys up to its last position. The saved softmax
 * (unfused) or log-sum-exp (fused) of a sequence holds its parts one after the other. With
 * cp > 1 the keys are cp.kv_full's, gathered first when `comm` (the forward's, or a full
 * recompute's, all-gather), or the ring's and Ulysses' core runs instead (cp.c). */
static int attention_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int mb, int l,
                         int chunk, ModelPhase ph, int comm, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc;
    const int cp = d->c > 1, kvs = d->kv2_loc, P = exec_cp_parts(c);
    const int C = exec_cp_part_len(c);
    const size_t tile = (size_t)H * sl * d->s;
    if (exec_cp_owns_core(c)) {
        if (model_fp8_attn_cp16(&c->spec) && !model_fp8_attn_saved(&c->spec))
            fp8_core_cp16(r, a, l, ph == MODEL_FWD); /* the ring's MXFP8: Q, K, V first */
        return exec_cp_attention_fwd(r, a, out, mb, l, chunk, ph, comm, err);
    }
    if (cp && comm)
        TRY(exec_cp_gather_kv(r, a, l, chunk, ph, err));
    if (cp && fp8_core_kv_col(r)) /* MXFP8: both copies after the gather */
        fp8_core_cp16(r, a, l, ph == MODEL_FWD);
    for (int q = 0; q < d->b; q++) {
        const ExecQkv x = exec_qkv_at(c, core_qkv(r, a), q);
        const void *kb = cp ? AT(r->W->cp_kv_full, (size_t)q * d->s * kvs) : x.k;
        const void *vb = cp ? AT(kb, (size_t)d->kv_loc * d->qk_hd) : x.v;
        void *col = fp8_core_col(r, 0), *kvc = fp8_core_kv_col(r); /* MXFP8: V's column-wise */
        const void *v_col = kvc   ? AT(kvc, (size_t)q * d->s * kvs + (size_t)d->kv_loc * d->qk_hd)
                            : col ? exec_qkv_at(c, col, q).v
                                  : NULL;
        size_t at = 0; /* the part's place in the sequence's softmax */
        for (int j = 0; j < P; j++) {
            int q0, tk;
            exec_cp_part_keys(c, j, &q0, &tk);
            KernAttnFwd f = {
                .B = 1, .Tq = C, .Tk = tk, .H = H, .KV = d->kv_loc, .D = d->qk_hd, .Dv = d->v_hd,
                .q_offset = q0, .scale = (float)(1.0 / sqrt((double)d->qk_hd)),
                .q = AT(x.q, (size_t)j * C * x.q_stride), .k = kb, .v = vb,
                .q_stride = x.q_stride, .k_stride = cp ? kvs : x.k_stride,
                .v_stride = cp ? kvs : x.v_stride,
                .out = AT(out, ((size_t)q * sl + (size_t)j * C) * d->o_loc),
                .sinks = r->P->lw[l].sinks, /* each part's queries: once per query */
                .v_col = v_col,
            };
            if (c->spec.job.flash_attn) {
                f.lse = (float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * H * sl + (size_t)j * H * C;
            } else {
                f.probs = AT(EXEC_LA(a, SOFTMAX), q * tile + at);
                if (c->attn_dropout) {
                    f.dropout = c->dropout;
                    /* the stream of the whole layer's heads over the whole sequence, s x s
                     * per head: this rank's first head is global head tp * H, and the part's
                     * first query is at position q0 */
                    const uint64_t ss = (uint64_t)d->s * (uint64_t)d->s;
                    f.seed = exec_stream_at(
                        exec_drop_seed(r, exec_seq_index(r, mb, q), l, EXEC_SITE_ATTN),
                        (uint64_t)c->g.tp_rank * H * ss + (uint64_t)q0 * d->s);
                    f.drop_row = (uint64_t)d->s;
                    f.drop_head = ss;
                    f.mask = (uint8_t *)EXEC_LA(a, SOFTMAX_MASK) + q * tile + at;
                    f.probs_drop = AT(EXEC_LA(a, SOFTMAX_DROP), q * tile + at);
                }
            }
            at += (size_t)H * C * tk;
            c->k->attention_fwd(&f);
        }
        /* counted as the op graph counts a sequence's core: s_loc queries against s keys */
        exec_meter_flops(r->M, model_attention_fwd_flops(&c->spec, (double)H, sl, d->s,
                                                         0.5 * (d->qk_hd + d->v_hd)));
    }
    return PX_OK;
}

/* The attention core's backward, sequence by sequence and part by part (the fused path's or
 * the unfused one's saved tensors); out: its forward output (the fused path's). With context
 * parallelism the K, V gradients of each part land in cp.kv (free once cp.kv_full holds the
 * keys) and add up in cp.dkv, which exec_cp_scatter_dkv hands back to their owners. */
static void core_bwd(const ExecLayerRun *r, const ExecLayerActs *a, const void *out, int l)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int sl = d->s_loc, H = d->heads_loc;
    const int cp = d->c > 1, kvs = d->kv2_loc, P = exec_cp_parts(c);
    const int C = exec_cp_part_len(c);
    const size_t tile = (size_t)H * sl * d->s;
    if (cp)
        c->k->memset0(r->W->cp_dkv, (size_t)d->b * d->s * kvs * c->ab);
    for (int q = 0; q < d->b; q++) {
        const ExecQkv x = exec_qkv_at(c, core_qkv(r, a), q);
        const ExecQkv dx = exec_qkv_at(c, r->W->dqkv, q);
        const void *kb = cp ? AT(r->W->cp_kv_full, (size_t)q * d->s * kvs) : x.k;
        void *dkb = cp ? r->W->cp_kv : dx.k;
        /* MXFP8 attention (no cp): Q's, K's and dO's column-wise copies */
        void *col = fp8_core_col(r, 0), *dcol = fp8_core_col(r, 1);
        const ExecQkv xc = exec_qkv_at(c, col ? col : core_qkv(r, a), q);
        size_t at = 0;
        for (int j = 0; j < P; j++) {
            int q0, tk;
            exec_cp_part_keys(c, j, &q0, &tk);
            const size_t rows = (size_t)q * sl + (size_t)j * C;
            KernAttnBwd b = {
                .B = 1, .Tq = C, .Tk = tk, .H = H, .KV = d->kv_loc, .D = d->qk_hd, .Dv = d->v_hd,
                .q_offset = q0, .scale = (float)(1.0 / sqrt((double)d->qk_hd)),
                .q = AT(x.q, (size_t)j * C * x.q_stride), .k = kb,
                .v = cp ? AT(kb, (size_t)d->kv_loc * d->qk_hd) : x.v,
                .q_stride = x.q_stride, .k_stride = cp ? kvs : x.k_stride,
                .v_stride = cp ? kvs : x.v_stride,
                .dout = AT(r->W->dhid, rows * d->o_loc),
                .dq = AT(dx.q, (size_t)j * C * dx.q_stride), .dk = dkb,
                .dv = cp ? AT(dkb, (size_t)d->kv_loc * d->qk_hd) : dx.v,
                .dq_stride = dx.q_stride, .dk_stride = cp ? kvs : dx.k_stride,
                .dv_stride = cp ? kvs : dx.v_stride,
                .q_col = col ? AT(xc.q, (size_t)j * C * xc.q_stride) : NULL,
                .k_col = !col ? NULL
                         : fp8_core_kv_col(r) ? AT(fp8_core_kv_col(r), (size_t)q * d->s * kvs)
                                              : xc.k,
                .dout_col = dcol ? AT(dcol, rows * d->o_loc) : NULL,
            };
            if (c->spec.job.flash_attn) {
                b.out = AT(out, rows * d->o_loc);
                b.lse = (const float *)EXEC_LA(a, ATTN_LSE) + (size_t)q * H * sl + (size_t)j * H * C;
                b.drow = r->W->flash_d + (size_t)q * H * sl + (size_t)j * H * C;
            } else {
                b.probs = AT(EXEC_LA(a, SOFTMAX), q * tile + at);
                b.dscores = AT(r->W->dscores, q * tile + at);
                if (c->attn_dropout) {
                    b.dropout = c->dropout;
                    b.mask = (const uint8_t *)EXEC_LA(a, SOFTMAX_MASK) + q * tile + at;
                    b.probs_drop = AT(EXEC_LA(a, SOFTMAX_DROP), q * tile + at);
                }
            }
            at += (size_t)H * C * tk;
            c->k->attention_bwd(&b);
            if (r->P->lw[l].sinks) /* the part's queries, their lse or dscores */
                c->k->attention_sink_bwd(r->P->lg[l].sinks, r->P->lw[l].sinks, b.lse, b.drow,
                                         b.lse ? NULL : b.dscores, 1, H, C, tk);
            if (cp)
                c->k->add_inplace(AT(r->W->cp_dkv, (size_t)q * d->s * kvs), dkb, (size_t)tk * kvs);
        }
        const double fwd = model_attention_fwd_flops(&c->spec, (double)H, sl, d->s,
                                                     0.5 * (d->qk_hd + d->v_hd));
        exec_meter_flops(r->M, model_attention_bwd_flops(fwd, !!c->spec.job.flash_attn, NULL));
    }
}

/* The attention core's backward, within its op: with context parallelism (allgather) K and V
 * gathered again (the op graph's backward all-gather, which the selective recompute reads too)
 * and their gradients handed back after; the ring's and Ulysses' backward is cp.c's.
 * Selective recompute re-creates the softmax (and its dropout) first, under its own op; the
 * output it recomputes is not needed and lands in ws.dqkv, which the backward then overwrites.
 * The fused path's backward reads the forward's output, saved in the act dtype whenever the
 * fused core runs (model_fp8_proj_in). */
static int attention_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int chunk, int l, int mb,
                         PxError *err)
{
    const ExecCtx *c = r->c;
    const int gather = c->d.c > 1 && !exec_cp_owns_core(c);
    if (gather)
        TRY(exec_cp_gather_kv(r, a, l, chunk, MODEL_BWD, err));
    if (c->spec.layout.recompute == MODEL_RECOMPUTE_SELECTIVE && !c->spec.job.flash_attn) {
        /* with cp the keys are in cp.kv_full already: gathered once, for both */
        const int op = op_open(r, l, MODEL_OPR_CORE, MODEL_RECOMPUTE);
        TRY(attention_fwd(r, a, r->W->dqkv, mb, l, chunk, MODEL_RECOMPUTE, 0, err));
        op_close(r, op);
    }
    if (exec_cp_owns_core(c)) {
        if (model_fp8_attn_cp16(&c->spec) && !model_fp8_attn_saved(&c->spec))
            fp8_core_bwd(r, a, l); /* the ring's MXFP8: Q, K, V and dO both ways */
        return exec_cp_attention_bwd(r, a, l, chunk, err);
    }
    core_bwd(r, a, fp8_core_bwd(r, a, l), l);
    return gather ? exec_cp_scatter_dkv(r, l, chunk, err) : PX_OK;
}

/* ---- a transformer layer ---- */

/* Rotary embedding (backward: its inverse) over packed QKV rows (attn.qkv.out's layout), each
 * part of each sequence at its global positions. */
static void rope(const ExecLayerRun *r, void *qkv_rows, int backward)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int qkv = d->q_loc + d->kv2_loc, C = exec_cp_part_len(c);
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

/* The epilogue of a row-parallel layer (attention projection, fc2) within its op: ws.out holds
 * this rank's partial product over the full sequence, reduced (tp.c) into y; then bias, dropout
 * and the residual: out = res + dropout(y + bias) (+ a MoE layer's routed experts' output). */
static int row_out(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, ModelPhase ph,
                   const void *bias, uint8_t *mask, int site, const void *res, void *out, int mb,
                   const void *extra, PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, h = c->d.h;
    void *y;
    TRY(exec_tp_row_reduce(r, chunk, l, role, ph, out, &y, err));
    if (extra) /* a MoE layer's routed experts beside its shared ones */
        c->k->add(y, y, extra, (size_t)R * h);
    if (bias)
        c->k->add_bias(y, bias, R, h);
    if (c->dropout > 0)
        dropout_region(r, y, mask, y, mb, l, site);
    c->k->add(out, res, y, (size_t)R * h);
    return PX_OK;
}

/* A MoE layer's routed experts, forward (moe.c, under their ops): their output in ws.dhid, free
 * in the forward. Without shared experts the combine's op goes on with the dropout and the
 * residual into out (*done). */
static int moe_fwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *out,
                   ModelPhase ph, int mb, int *done, PxError *err)
{
    const ExecCtx *c = r->c;
    ExecMoeViews v;
    moe_views(r, l, a, &v);
    TRY(exec_moe_forward(r->moe, r, chunk, l, ph, &v, r->W->dhid, EXEC_LA(a, FC1_IN),
                         exec_seq_index(r, mb, 0), mb, aux_weight(r), err));
    *done = c->d.sff_loc == 0;
    if (!*done)
        return PX_OK;
    const int op = exec_meter_find(r->M, MODEL_OPR_COMBINE, l, chunk, ph, MODEL_COMM_COUNT, 0);
    exec_meter_open_again(r->M, c->k, op);
    if (c->dropout > 0) /* in place over ws.dhid */
        dropout_region(r, r->W->dhid, EXEC_LA(a, MLP_DROP_MASK), r->W->dhid, mb, l,
                       EXEC_SITE_MLP_OUT);
    c->k->add(out, EXEC_LA(a, LN2_IN), r->W->dhid, (size_t)c->d.b * c->d.s_sp * c->d.h);
    op_close(r, op);
    return PX_OK;
}

/* Forward of layer l from its ln1.in; the output (input plus both residual branches, this
 * rank's region) goes to out. phase MODEL_RECOMPUTE re-creates the tensors of a that the
 * recompute mode did not save (out is then scratch). */
static int layer_fwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *out,
                     ModelPhase ph, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ExecLayerParams *w = &r->P->lw[l];
    ExecFp8 *F = r->fp8;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h, qkv = d->q_loc + d->kv2_loc;
    const int rec = ph == MODEL_FWD, moe = is_moe(c, l);
    /* the weights whose GEMMs run in FP8 (NULL: act GEMMs); their inputs are saved in FP8, and
     * what computes them writes ws.fp8's act part first */
    const ExecFp8Weight *fq = exec_fp8_weight(F, MODEL_TR_QKV_W, l);
    const ExecFp8Weight *fp = exec_fp8_weight(F, MODEL_TR_PROJ_W, l);
    const ExecFp8Weight *f1 = exec_fp8_weight(F, MODEL_TR_FC1_W, l);
    const ExecFp8Weight *f2 = exec_fp8_weight(F, MODEL_TR_FC2_W, l);
    /* the projection's input: saved in the act dtype and quantized for the GEMM alone, or its
     * quantized copy saved (beside the act one, or alone: model_fp8_proj_in) */
    const ModelFp8ProjIn pin = model_fp8_proj_in(&c->spec);
    void *core_out = exec_fp8_core_out(r);
    void *o = pin == MODEL_FP8_PROJ_FP8 ? F->act : core_out ? core_out : EXEC_LA(a, PROJ_IN);
    const void *x;
    ExecFp8Ref xq;

    int op = op_open(r, l, MODEL_OPR_LN1, ph);
    /* multi-head latent attention's down-projections quantize it too (mla.c) */
    void *ln1 = fq || exec_fp8_weight(F, MODEL_TR_KV_A_W, l) ? F->act : EXEC_LA(a, QKV_IN);
    norm_fwd(r, ln1, EXEC_LA(a, LN1_IN), EXEC_LP(w, LN1_W), EXEC_LP(w, LN1_B), R);
    op_close(r, op);

    if (exec_mla_on(c)) {
        TRY(exec_mla_forward(r, chunk, l, a, ph, err));
    } else {
        op = op_open(r, l, MODEL_OPR_QKV, ph);
        TRY(exec_tp_column_input(r, chunk, l, MODEL_OPR_QKV, ph, fq, EXEC_LA(a, QKV_IN), ln1, &x,
                                 &xq, err));
        /* FP8 attention: quantized under the core's op (MXFP8 with cp: after the gather or
         * on the ring, from the 16-bit attn.qkv.out; over Ulysses after its all-to-all) */
        void *qo = model_fp8_attn_cp16(&c->spec) && !model_fp8_attn_saved(&c->spec)
                       ? EXEC_LA(a, QKV_OUT)
                       : core_qkv(r, a);
        if (fq)
            fp8_fwd(r, qo, xq, fq, N, ph);
        else
            mm_act(r, qo, x, EXEC_LP(w, QKV_W), N, qkv, h, 0, 1);
        if (EXEC_LP(w, QKV_B))
            k->add_bias(qo, EXEC_LP(w, QKV_B), N, qkv);
        if (c->spec.model.position == MODEL_POS_ROPE)
            rope(r, qo, 0);
        op_close(r, op);
    }

    op = op_open(r, l, MODEL_OPR_CORE, ph);
    fp8_core_fwd(r, a, l, rec);
    TRY(attention_fwd(r, a, o, mb, l, chunk, ph, 1, err));
    fp8_core_fwd_out(r, a, l, rec);
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_PROJ, ph);
    if (fp)
        fp8_fwd(r, r->W->out,
                exec_fp8_quantize(F, c,
                                  pin == MODEL_FP8_PROJ_BOTH  ? EXEC_LA(a, PROJ_IN_FP8)
                                  : pin == MODEL_FP8_PROJ_FP8 ? EXEC_LA(a, PROJ_IN)
                                                              : F->q0,
                                  o, N, d->o_loc, 0, EXEC_FP8_X, fp, 0, rec),
                fp, N, ph);
    else
        mm_act(r, r->W->out, EXEC_LA(a, PROJ_IN), EXEC_LP(w, PROJ_W), N, h, d->o_loc, 0, 1);
    TRY(row_out(r, chunk, l, MODEL_OPR_PROJ, ph, EXEC_LP(w, PROJ_B), EXEC_LA(a, ATTN_DROP_MASK),
                EXEC_SITE_ATTN_OUT, EXEC_LA(a, LN1_IN), EXEC_LA(a, LN2_IN), mb, NULL, err));
    op_close(r, op);

    /* a MoE layer's fc1.in stays in the act dtype: the router reads it */
    op = op_open(r, l, MODEL_OPR_LN2, ph);
    void *ln2 = f1 && !moe ? F->act : EXEC_LA(a, FC1_IN);
    norm_fwd(r, ln2, EXEC_LA(a, LN2_IN), EXEC_LP(w, LN2_W), EXEC_LP(w, LN2_B), R);
    op_close(r, op);

    /* a MoE layer: the routed experts' output first, then the shared experts' beside it */
    int done = 0;
    if (moe)
        TRY(moe_fwd(r, chunk, l, a, out, ph, mb, &done, err));
    if (done)
        return PX_OK;
    int Fw, FO;
    mlp_widths(c, l, &Fw, &FO);

    op = op_open(r, l, MODEL_OPR_FC1, ph);
    TRY(exec_tp_column_input(r, chunk, l, MODEL_OPR_FC1, ph, f1, EXEC_LA(a, FC1_IN), ln2, &x, &xq,
                             err));
    if (f1)
        fp8_fwd(r, EXEC_LA(a, ACT_IN), xq, f1, N, ph);
    else
        mm_act(r, EXEC_LA(a, ACT_IN), x, EXEC_LP(w, FC1_W), N, FO, h, 0, 1);
    if (EXEC_LP(w, FC1_B))
        k->add_bias(EXEC_LA(a, ACT_IN), EXEC_LP(w, FC1_B), N, FO);
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_ACT, ph);
    void *hid = f2 ? F->act : EXEC_LA(a, FC2_IN);
    if (c->spec.model.mlp == MODEL_SWIGLU)
        k->swiglu_fwd(hid, EXEC_LA(a, ACT_IN), N, Fw);
    else
        k->gelu_fwd(hid, EXEC_LA(a, ACT_IN), (size_t)N * Fw);
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_FC2, ph);
    if (f2)
        fp8_fwd(r, r->W->out,
                exec_fp8_quantize(F, c, EXEC_LA(a, FC2_IN), hid, N, Fw, 0, EXEC_FP8_X, f2, 0, rec),
                f2, N, ph);
    else
        mm_act(r, r->W->out, EXEC_LA(a, FC2_IN), EXEC_LP(w, FC2_W), N, h, Fw, 0, 1);
    /* Qwen2-MoE's gate on the shared experts' output, from the whole rows of their input (x:
     * with SP fc1's gathered input, still in ws.sp_gather), so every TP rank scales its
     * partial output by the same gate before the reduction */
    if (moe && EXEC_LPM(w, SHARED_GATE_W))
        k->gate_fwd(r->W->out, x, EXEC_LPM(w, SHARED_GATE_W), N, h);
    TRY(row_out(r, chunk, l, MODEL_OPR_FC2, ph, EXEC_LP(w, FC2_B), EXEC_LA(a, MLP_DROP_MASK),
                EXEC_SITE_MLP_OUT, EXEC_LA(a, LN2_IN), out, mb, moe ? r->W->dhid : NULL, err));
    op_close(r, op);
    return PX_OK;
}

/* fc2's backward under FP8 with the shared experts' gate, y = g (hid W2^T), g = sigmoid(x . w)
 * per row: the input gradient dy W2 first, ungated, in FP8; then the gate's backward
 * (gate_bwd's contract) on fc2's saved FP8 input decoded into scratch (ws.dffn, with GeLU
 * after the activation's gradient there: the table makes it twice as wide), which gives the
 * logit's gradient and scales the input gradient and the decoded input by g; then fc2's
 * weight gradient in FP8 from dy and the gated input quantized, dy^T (g hid) = (g dy)^T hid.
 * The gate's own product (h x 1) stays in the act dtype, as Megatron-Core's gate_weight, a
 * plain linear outside Transformer Engine's FP8 modules (docs/moe.md). */
static void fp8_gate_bwd(const ExecLayerRun *r, void *dact, float *dw, const void *dy,
                         const void *saved, const void *x, const void *gate, float *dgate,
                         const ExecFp8Weight *f2, int N, int F)
{
    const ExecCtx *c = r->c;
    ExecFp8Dy dyq;
    exec_fp8_linear_dgrad(r->fp8, c, r->M, dact, dy, f2, 0, N, 1, &dyq);
    void *hid = c->spec.model.mlp == MODEL_SWIGLU ? r->W->dffn : AT(r->W->dffn, (size_t)N * F);
    const ExecFp8Ref q = fp8_saved(r, saved, N, F);
    c->k->fp8_dequantize(hid, q.q, &q.f);
    c->k->gate_bwd(dgate, dact, hid, x, gate, N, c->d.h, F);
    exec_fp8_linear_wgrad(r->fp8, c, r->M, dw, &dyq, q, hid, f2, 0, N);
}

/* The shared experts' gate with SP (tp > 1): its backward at fc2's reads the gate of every
 * row, so fc1's input is gathered over TP first (fc1's own gather, early: fc1's backward then
 * reads it in ws.sp_gather) and fc2's output gradient is gathered beside it into ws.out (free
 * in the backward with SP). The same two gathers as without the gate, so the plan's ops and
 * bytes hold. Each TP rank's logit gradient is then partial (its slice of the hidden units):
 * summed over TP by what follows anyway, fc1's input gradient's reduce-scatter for dx and the
 * SP gradients' all-reduce for the gate's weight (docs/moe.md, "Biases, the shared gate,
 * sinks"). */
static int gate_sp_inputs(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                          const void *dres, const void **x, const void **dy, PxError *err)
{
    const ExecCtx *c = r->c;
    ExecFp8Ref none;
    TRY(exec_tp_column_bwd_input(r, chunk, l, MODEL_OPR_FC1, EXEC_LA(a, FC1_IN), 0, x, &none,
                                 err));
    *dy = r->W->out;
    return exec_tp_all_gather(r, MODEL_OPR_FC2, l, chunk, MODEL_BWD, r->W->out,
                              dropout_bwd(r, dres, EXEC_LA(a, MLP_DROP_MASK)),
                              (size_t)c->d.b * c->d.s_sp * c->d.h, err);
}

/* The MLP's backward: fc2 (dropout, bias, dgrad into the activation's output gradient,
 * wgrad), the activation, fc1 and the f operator on its input gradient (*dn). */
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
    const void *gate = is_moe(c, l) ? EXEC_LPM(w, SHARED_GATE_W) : NULL;
    float *dgate = (float *)r->W->exp_dffn;
    const int gate_sp = gate && exec_sp_on(c);
    const void *x = EXEC_LA(a, FC1_IN); /* the shared experts' input, whole rows */
    ExecFp8Ref xq = {NULL, {0, 0, 0, 0, 0, 0}};

    int op = op_open(r, l, MODEL_OPR_FC2, MODEL_BWD);
    const void *dy;
    if (gate_sp)
        TRY(gate_sp_inputs(r, chunk, l, a, dres, &x, &dy, err));
    else
        TRY(exec_tp_row_dy(r, chunk, l, MODEL_OPR_FC2,
                           dropout_bwd(r, dres, EXEC_LA(a, MLP_DROP_MASK)), &dy, err));
    if (EXEC_LP(g, FC2_B))
        k->bias_grad(EXEC_LP(g, FC2_B), dy, N, h);
    void *dact = c->spec.model.mlp == MODEL_SWIGLU ? r->W->dact : r->W->dffn;
    if (f2 && gate) {
        fp8_gate_bwd(r, dact, EXEC_LP(g, FC2_W), dy, EXEC_LA(a, FC2_IN), x, gate, dgate, f2, N, F);
    } else if (f2) {
        fp8_bwd(r, dact, EXEC_LP(g, FC2_W), dy, fp8_saved(r, EXEC_LA(a, FC2_IN), N, F), NULL, f2,
                N);
    } else {
        mm_act(r, dact, dy, EXEC_LP(w, FC2_W), N, F, h, 0, 0);
        /* the shared gate's: its logit's gradient (into the router's scratch, spent by the
         * routed experts' backward before), then the gated hid and dact (gate.c's contract) */
        if (gate)
            k->gate_bwd(dgate, dact, EXEC_LA(a, FC2_IN), x, gate, N, h, F);
        mm_grad(r, EXEC_LP(g, FC2_W), dy, EXEC_LA(a, FC2_IN), h, F, N);
    }
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_ACT, MODEL_BWD);
    if (c->spec.model.mlp == MODEL_SWIGLU)
        k->swiglu_bwd(r->W->dffn, EXEC_LA(a, ACT_IN), r->W->dact, N, F);
    else
        k->gelu_bwd(r->W->dffn, EXEC_LA(a, ACT_IN), r->W->dffn, (size_t)N * F);
    op_close(r, op);

    /* a MoE layer's fc1.in is kept in the act dtype (the router reads it) */
    op = op_open(r, l, MODEL_OPR_FC1, MODEL_BWD);
    if (!gate_sp) /* (the gate's gathered fc1's input before fc2's backward) */
        TRY(exec_tp_column_bwd_input(r, chunk, l, MODEL_OPR_FC1, EXEC_LA(a, FC1_IN),
                                     f1 && !is_moe(c, l), &x, &xq, err));
    column_linear_bwd(r, EXEC_LP(g, FC1_B), EXEC_LP(g, FC1_W), EXEC_LP(w, FC1_W), r->W->dffn, x,
                      xq, f1, N, h, FO);
    if (gate)
        k->gate_wgrad(r->W->dhid, EXEC_LPM(g, SHARED_GATE_W), dgate, x, gate, N, h);
    TRY(exec_tp_column_dx(r, chunk, l, MODEL_OPR_FC1, dn, err));
    op_close(r, op);
    return PX_OK;
}

/* A MoE layer's MLP backward: the routed experts' (over the region's output gradient, after
 * dropout's backward), then the shared experts' as a dense MLP's; *dn gets the sum of their
 * input gradients. The routed input gradient lands in the layer's saved experts' input, spent
 * by then. The combine's backward is one call in three scopes: the dropout's backward here,
 * its routed part in moe.c (which counts the call) and the sum of the two input gradients. */
static int moe_mlp_bwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                       const void *dres, const void **dn, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, h = c->d.h;
    const int op_comb = exec_meter_find(r->M, MODEL_OPR_COMBINE, l, chunk, MODEL_BWD,
                                        MODEL_COMM_COUNT, 0);
    const void *dy = dres;
    if (c->dropout > 0) {
        exec_meter_open_again(r->M, c->k, op_comb);
        dy = dropout_bwd(r, dres, EXEC_LA(a, MLP_DROP_MASK));
        op_close(r, op_comb);
    }
    ExecMoeViews v;
    moe_views(r, l, a, &v);
    /* under FP8 the experts' saved input is too small for it: ws.fp8's act part, which the
     * shared experts' backward leaves alone */
    void *dxr = r->fp8->on ? r->fp8->act : EXEC_LMA(a, EXP_IN);
    TRY(exec_moe_backward(r->moe, r, chunk, l, &v, dxr, dy, EXEC_LA(a, FC1_IN),
                          exec_seq_index(r, mb, 0), mb, aux_weight(r), err));
    if (c->d.sff_loc == 0) {
        *dn = dxr;
        return PX_OK;
    }
    TRY(mlp_bwd(r, chunk, l, a, dres, dn, err));
    exec_meter_open_again(r->M, c->k, op_comb);
    c->k->add((void *)*dn, *dn, dxr, (size_t)R * h);
    op_close(r, op_comb);
    return PX_OK;
}

/* The QKV projection's backward from ws.dqkv (the rotary embedding's inverse first); *dn gets
 * its input gradient (tp.c's f operator). */
static int qkv_bwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                   const void **dn, PxError *err)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const ExecLayerParams *w = &r->P->lw[l];
    const ExecLayerGrads *g = &r->P->lg[l];
    const int N = d->b * d->s_loc, h = d->h, qkv = d->q_loc + d->kv2_loc;
    const ExecFp8Weight *fq = exec_fp8_weight(r->fp8, MODEL_TR_QKV_W, l);
    const int op = op_open(r, l, MODEL_OPR_QKV, MODEL_BWD);
    const void *x;
    ExecFp8Ref xq;
    TRY(exec_tp_column_bwd_input(r, chunk, l, MODEL_OPR_QKV, EXEC_LA(a, QKV_IN), fq != NULL, &x,
                                 &xq, err));
    if (c->spec.model.position == MODEL_POS_ROPE)
        rope(r, r->W->dqkv, 1);
    column_linear_bwd(r, EXEC_LP(g, QKV_B), EXEC_LP(g, QKV_W), EXEC_LP(w, QKV_W), r->W->dqkv, x,
                      xq, fq, N, h, qkv);
    TRY(exec_tp_column_dx(r, chunk, l, MODEL_OPR_QKV, dn, err));
    op_close(r, op);
    return PX_OK;
}

/* Op-level recompute under FP8 GEMMs: x (the R rows of this rank's region) quantized again
 * into `saved`, the table's FP8 copy the backward reads, with the factors of now and recording
 * nothing (the forward recorded its amax); the rerun GEMM's operand: that copy, or under SP the
 * gathered rows of ws.sp_gather quantized into ws.fp8's first copy (as exec_tp_column_input). */
static ExecFp8Ref sac_fp8_input(const ExecLayerRun *r, void *saved, const void *x,
                                const ExecFp8Weight *w, int gathered)
{
    const ModelDims *d = &r->c->d;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h;
    ExecFp8Ref xq = exec_fp8_quantize(r->fp8, r->c, saved, x, R, h, 0, EXEC_FP8_X, w, 0, 0);
    if (gathered && exec_sp_on(r->c))
        xq = exec_fp8_quantize(r->fp8, r->c, r->fp8->q0, r->W->sp_gather, N, h, 0, EXEC_FP8_X, w,
                               0, 0);
    return xq;
}

/* A rerun matmul on FP8, y [N, n] = x (quantized) times rows [row0, row0 + n) of w's copy. */
static void sac_fp8_mm(const ExecLayerRun *r, void *y, ExecFp8Ref xq, const ExecFp8Weight *w,
                       int row0, int n, int N)
{
    if (row0 == 0 && n == w->rows)
        exec_fp8_linear_fwd(r->fp8, r->c, r->M, y, xq, w, 0, N, 0);
    else
        exec_fp8_mm(r->c, r->M, y, r->c->act, xq, exec_fp8_weight_rows(r->fp8, r->c, w, row0, n),
                    N, n, w->cols, 0, 1, 0.0f);
}

/* The MLP half of sac_recompute in a dense layer (ln2's output in ln2, ws.fp8's act part under
 * FP8): w3 (gated) or fc1 where it reruns, the activation, fc2 or w2 where it reruns, and the
 * residual add; under FP8 fc2's input quantized into its table copy where no rerun does it. */
static void sac_mlp(const ExecLayerRun *r, int l, const ExecLayerActs *a, const void *ln2)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const ModelSpec *s = &c->spec;
    const ExecLayerParams *w = &r->P->lw[l];
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h, sp = exec_sp_on(c);
    const int gated = s->model.mlp == MODEL_SWIGLU;
    const ExecFp8Weight *f1 = exec_fp8_weight(r->fp8, MODEL_TR_FC1_W, l);
    const ExecFp8Weight *f2 = exec_fp8_weight(r->fp8, MODEL_TR_FC2_W, l);
    int Fw, FO;
    mlp_widths(c, l, &Fw, &FO);
    const unsigned fc1 = model_sac_op_matmuls(s, d, l, MODEL_OPR_FC1);
    const size_t row0 = gated && (fc1 & 2u) ? (size_t)Fw : 0;
    int op;
    if (fc1) { /* w1 (fc1's gate slice), w3 (its up slice, after the gate's), or fc1 */
        op = op_open(r, l, MODEL_OPR_FC1, MODEL_RECOMPUTE);
        if (f1)
            sac_fp8_mm(r, r->W->dffn, sac_fp8_input(r, EXEC_LA(a, FC1_IN), ln2, f1, 1), f1,
                       (int)row0, gated ? Fw : FO, N);
        else
            mm_act(r, r->W->dffn, sp ? r->W->sp_gather : EXEC_LA(a, FC1_IN),
                   AT(EXEC_LP(w, FC1_W), row0 * (size_t)h), N, gated ? Fw : FO, h, 0, 1);
        op_close(r, op);
    }
    op = op_open(r, l, MODEL_OPR_ACT, MODEL_RECOMPUTE);
    void *hid = f2 ? r->fp8->act : EXEC_LA(a, FC2_IN);
    if (gated)
        c->k->swiglu_fwd(hid, EXEC_LA(a, ACT_IN), N, Fw);
    else
        c->k->gelu_fwd(hid, EXEC_LA(a, ACT_IN), (size_t)N * Fw);
    const int fc2 = model_sac_op_matmuls(s, d, l, MODEL_OPR_FC2) != 0;
    if (f2 && !fc2) /* fc2.in for fc2's backward */
        exec_fp8_quantize(r->fp8, c, EXEC_LA(a, FC2_IN), hid, N, Fw, 0, EXEC_FP8_X, f2, 0, 0);
    op_close(r, op);
    op = op_open(r, l, MODEL_OPR_FC2, MODEL_RECOMPUTE);
    if (fc2 && f2)
        sac_fp8_mm(r, r->W->out,
                   exec_fp8_quantize(r->fp8, c, EXEC_LA(a, FC2_IN), hid, N, Fw, 0, EXEC_FP8_X, f2,
                                     0, 0),
                   f2, 0, h, N);
    else if (fc2)
        mm_act(r, r->W->out, EXEC_LA(a, FC2_IN), EXEC_LP(w, FC2_W), N, h, Fw, 0, 1);
    c->k->add(r->W->dhid, EXEC_LA(a, LN2_IN), r->W->out, (size_t)R * h);
    op_close(r, op);
}

/* Op-level selective activation checkpointing (torchtitan's "selective op"; the op graph's
 * sac_op_recompute, docs/time.md "Frameworks"), before layer l's backward: its checkpointed
 * forward again, every other matmul of the layer (model_sac_op_matmuls: a dense layer's wk, wo,
 * and w3 gated or fc2; MLA's in mla.c, then w1 and w2 or fc1 with a query latent) and every
 * elementwise op rerun, no collective. The norms and the activation re-create the tensors the
 * backward reads and the table does not save (attn.qkv.in, mlp.fc1.in, a dense layer's
 * mlp.fc2.in: in ws.recompute, bit for bit the forward's); the matmuls' outputs and the
 * residual adds, which saved tensors already hold (attn.qkv.out packs wk's, mlp.act.in w1's and
 * w3's, ln2.in the attention's residual: model_layer_acts_at), land in scratch the backward
 * overwrites (ws.dqkv, ws.dffn, ws.out, ws.dhid). Under SP the matmuls of the gathered input
 * read ws.sp.gather, the full sequence's rows the backward gathers again. A MoE layer reruns
 * its attention half only: its experts are not recomputed. Under FP8 GEMMs (docs/fp8.md) a
 * rerun matmul runs in FP8, quantizing its input into the table's FP8 copy the backward reads
 * (the forward's values: the same norm's output; delayed scaling with the factors of now,
 * recording nothing); where no rerun quantizes an FP8 GEMM's unsaved input, the op that makes
 * it does; wo reads a saved FP8 copy of its input as it is (model_fp8_proj_in). */
static void sac_recompute(const ExecLayerRun *r, int l, const ExecLayerActs *a)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ModelSpec *s = &c->spec;
    const ExecLayerParams *w = &r->P->lw[l];
    ExecFp8 *F = r->fp8;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h, sp = exec_sp_on(c);
    const ExecFp8Weight *fq = exec_fp8_weight(F, MODEL_TR_QKV_W, l);
    const ExecFp8Weight *fp = exec_fp8_weight(F, MODEL_TR_PROJ_W, l);
    const ModelFp8ProjIn pin = model_fp8_proj_in(s);
    int op = op_open(r, l, MODEL_OPR_LN1, MODEL_RECOMPUTE);
    void *ln1 = fq || exec_fp8_weight(F, MODEL_TR_KV_A_W, l) ? F->act : EXEC_LA(a, QKV_IN);
    norm_fwd(r, ln1, EXEC_LA(a, LN1_IN), EXEC_LP(w, LN1_W), EXEC_LP(w, LN1_B), R);
    op_close(r, op);
    if (exec_mla_on(c)) {
        exec_mla_sac_recompute(r, l, a);
    } else { /* wk: QKV's rows after this rank's query heads */
        op = op_open(r, l, MODEL_OPR_QKV, MODEL_RECOMPUTE);
        if (fq)
            sac_fp8_mm(r, r->W->dqkv, sac_fp8_input(r, EXEC_LA(a, QKV_IN), ln1, fq, 1), fq,
                       d->q_loc, d->kv_width_loc, N);
        else
            mm_act(r, r->W->dqkv, sp ? r->W->sp_gather : EXEC_LA(a, QKV_IN),
                   AT(EXEC_LP(w, QKV_W), (size_t)d->q_loc * h), N, d->kv_width_loc, h, 0, 1);
        op_close(r, op);
    }
    op = op_open(r, l, MODEL_OPR_PROJ, MODEL_RECOMPUTE);
    if (model_sac_op_matmuls(s, d, l, MODEL_OPR_PROJ) && fp)
        sac_fp8_mm(r, r->W->out,
                   pin == MODEL_FP8_PROJ_ACT
                       ? exec_fp8_quantize(F, c, F->q0, EXEC_LA(a, PROJ_IN), N, d->o_loc, 0,
                                           EXEC_FP8_X, fp, 0, 0)
                       : fp8_saved(r, pin == MODEL_FP8_PROJ_BOTH ? EXEC_LA(a, PROJ_IN_FP8)
                                                                 : EXEC_LA(a, PROJ_IN),
                                   N, d->o_loc),
                   fp, 0, h, N);
    else if (model_sac_op_matmuls(s, d, l, MODEL_OPR_PROJ))
        mm_act(r, r->W->out, EXEC_LA(a, PROJ_IN), EXEC_LP(w, PROJ_W), N, h, d->o_loc, 0, 1);
    k->add(r->W->dhid, EXEC_LA(a, LN1_IN), r->W->out, (size_t)R * h);
    op_close(r, op);
    op = op_open(r, l, MODEL_OPR_LN2, MODEL_RECOMPUTE);
    /* a MoE layer's fc1.in stays in the act dtype: the router reads it */
    const int f8_ln2 = exec_fp8_weight(F, MODEL_TR_FC1_W, l) && !is_moe(c, l);
    void *ln2 = f8_ln2 ? F->act : EXEC_LA(a, FC1_IN);
    norm_fwd(r, ln2, EXEC_LA(a, LN2_IN), EXEC_LP(w, LN2_W), EXEC_LP(w, LN2_B), R);
    if (f8_ln2 && !model_sac_op_matmuls(s, d, l, MODEL_OPR_FC1)) /* fc1.in, for fc1's backward */
        sac_fp8_input(r, EXEC_LA(a, FC1_IN), ln2, exec_fp8_weight(F, MODEL_TR_FC1_W, l), 0);
    op_close(r, op);
    if (!is_moe(c, l))
        sac_mlp(r, l, a, ln2);
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
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, h = d->h;
    const ExecFp8Weight *fp = exec_fp8_weight(r->fp8, MODEL_TR_PROJ_W, l);
    const ModelFp8ProjIn pin = model_fp8_proj_in(&c->spec);

    /* the recomputed layer's output is scratch: ws.out, or with SP (where ws.out feeds the
     * reduce-scatter) ws.dx_a, free until this layer's backward uses it */
    if (c->spec.layout.recompute == MODEL_RECOMPUTE_FULL)
        TRY(layer_fwd(r, chunk, l, a, exec_sp_on(c) ? r->W->dx_a : r->W->out, MODEL_RECOMPUTE,
                      mb, err));
    if (d->recompute_op)
        sac_recompute(r, l, a);
    /* DeepSpeed's ZeRO-3 freed the parameters after the recomputed forward: gathered again */
    if (exec_zero_twice_gathered(c)) {
        TRY(gather_block(r, r->P->layer_block[l], MODEL_BWD, 0, err));
        TRY(gather_block(r, r->P->expert_block[l], MODEL_BWD, 0, err));
    }

    const void *dn;
    if (is_moe(c, l))
        TRY(moe_mlp_bwd(r, chunk, l, a, dres, &dn, mb, err));
    else
        TRY(mlp_bwd(r, chunk, l, a, dres, &dn, err));

    int op = op_open(r, l, MODEL_OPR_LN2, MODEL_BWD);
    norm_bwd(r, dres, EXEC_LP(g, LN2_W), EXEC_LP(g, LN2_B), dn, EXEC_LA(a, LN2_IN),
             EXEC_LP(w, LN2_W), R);
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_PROJ, MODEL_BWD);
    const void *dy;
    TRY(exec_tp_row_dy(r, chunk, l, MODEL_OPR_PROJ, dropout_bwd(r, dres, EXEC_LA(a, ATTN_DROP_MASK)),
                       &dy, err));
    if (EXEC_LP(g, PROJ_B))
        k->bias_grad(EXEC_LP(g, PROJ_B), dy, N, h);
    if (fp && pin == MODEL_FP8_PROJ_ACT) {
        /* the act input saved: quantized again for the weight gradient */
        const ExecFp8Ref none = {NULL, {0, 0, 0, 0, 0, 0}};
        fp8_bwd(r, r->W->dhid, EXEC_LP(g, PROJ_W), dy, none, EXEC_LA(a, PROJ_IN), fp, N);
    } else if (fp) {
        fp8_bwd(r, r->W->dhid, EXEC_LP(g, PROJ_W), dy,
                fp8_saved(r, pin == MODEL_FP8_PROJ_BOTH ? EXEC_LA(a, PROJ_IN_FP8)
                                                        : EXEC_LA(a, PROJ_IN),
                          N, d->o_loc),
                NULL, fp, N);
    } else {
        mm_act(r, r->W->dhid, dy, EXEC_LP(w, PROJ_W), N, d->o_loc, h, 0, 0);
        mm_grad(r, EXEC_LP(g, PROJ_W), dy, EXEC_LA(a, PROJ_IN), h, d->o_loc, N);
    }
    op_close(r, op);

    op = op_open(r, l, MODEL_OPR_CORE, MODEL_BWD);
    TRY(attention_bwd(r, a, chunk, l, mb, err));
    op_close(r, op);

    if (exec_mla_on(c))
        TRY(exec_mla_backward(r, chunk, l, a, &dn, err));
    else
        TRY(qkv_bwd(r, chunk, l, a, &dn, err));

    op = op_open(r, l, MODEL_OPR_LN1, MODEL_BWD);
    norm_bwd(r, dres, EXEC_LP(g, LN1_W), EXEC_LP(g, LN1_B), dn, EXEC_LA(a, LN1_IN),
             EXEC_LP(w, LN1_W), R);
    op_close(r, op);
    return PX_OK;
}

/* ---- the embedding and the output layer ---- */

/* Sequence q's part j in the micro-batch's token rows (exec_cp_tok_row); its targets follow
 * one token on. */
static const int32_t *tok_part(const ExecCtx *c, const int32_t *tok, int q, int j)
{
    return tok + (size_t)q * exec_cp_tok_row(c) + (size_t)j * (exec_cp_part_len(c) + 1);
}

static int embed_fwd(const ExecLayerRun *r, int chunk, int mb, ExecHeadActs *x, void *x0,
                     const int32_t *tok, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ExecParams *P = r->P;
    const int b = d->b, h = d->h, V = d->vocab_loc, R = b * d->s_sp, C = exec_cp_part_len(c);
    const int sp = exec_sp_on(c);
    TRY(gather_block(r, P->embed_block, MODEL_FWD, 0, err));
    /* vocabulary-parallel: this rank's rows give a partial embedding, summed over TP; the
     * positions are added on one rank only */
    const void *wpe = c->g.tp_rank == 0 ? P->wpe : NULL;
    void *emb = sp || c->dropout > 0 ? r->W->out : x0;
    const int op = op_open(r, -1, MODEL_OPR_EMBED, MODEL_FWD);
    for (int q = 0; q < b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++)
            k->embedding_fwd(AT(emb, ((size_t)q * d->s_loc + (size_t)j * C) * h),
                             tok_part(c, tok, q, j), P->wte, wpe, C, C,
                             exec_cp_part_pos(c, c->g.cp_rank, j), h, c->g.tp_rank * V, V);
    if (sp) {
        TRY(exec_tp_reduce_scatter(r, MODEL_OPR_EMBED, -1, chunk, MODEL_FWD, x0, emb,
                                   (size_t)R * h, err));
        emb = x0;
    } else {
        TRY(exec_tp_allreduce(r, MODEL_OPR_EMBED, -1, chunk, MODEL_FWD, emb, (size_t)R * h, err));
    }
    if (c->dropout > 0)
        dropout_region(r, x0, EXEC_HA(x, EMBED_DROP_MASK), emb, mb, -1, EXEC_SITE_EMBED);
    op_close(r, op);
    return PX_OK;
}

/* The vocabulary-parallel cross-entropy of one micro-batch over the fp32 logits in loss.probs:
 * the kernels' steps with the ranks' shards combined between them (max, sum of exponentials,
 * target logit: the op graph's 3 all-reduces a pass); this rank's share of the summed token
 * losses goes into the pass. */
static int cross_entropy(const ExecLayerRun *r, int chunk, ExecHeadActs *x, const int32_t *tok,
                         PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const int b = d->b, V = d->vocab_loc, N = b * d->s_loc, P = exec_cp_parts(c);
    const int C = exec_cp_part_len(c), v0 = c->g.tp_rank * V;
    float *probs = EXEC_HA(x, LOSS_PROBS);
    float *rowmax = r->W->xent, *rowsum = rowmax + N, *target = rowsum + N, *loss = target + N;
    const int op = op_open(r, -1, MODEL_OPR_LOSS, MODEL_FWD);
    k->xent_rowmax(rowmax, probs, N, V);
    TRY(exec_tp_allreduce_f32(r, MODEL_OPR_LOSS, -1, chunk, MODEL_FWD, rowmax, (size_t)N,
                              COMM_MAX, err));
    for (int q = 0; q < b; q++)
        for (int j = 0; j < P; j++) {
            const size_t o = (size_t)q * d->s_loc + (size_t)j * C;
            k->xent_expsum(rowsum + o, target + o, probs + o * V, rowmax + o,
                           tok_part(c, tok, q, j) + 1, C, V, v0);
        }
    TRY(exec_tp_allreduce_f32(r, MODEL_OPR_LOSS, -1, chunk, MODEL_FWD, rowsum, (size_t)N,
                              COMM_SUM, err));
    TRY(exec_tp_allreduce_f32(r, MODEL_OPR_LOSS, -1, chunk, MODEL_FWD, target, (size_t)N,
                              COMM_SUM, err));
    k->xent_finish(loss, probs, rowsum, rowmax, target, N, V);
    /* every TP rank has the same losses: one of them reports them (each cp rank its tokens') */
    if (c->g.tp_rank == 0) {
        k->to_host(r->W->host_loss, loss, (size_t)N * sizeof *loss);
        double sum = 0.0;
        for (int n = 0; n < N; n++)
            sum += r->W->host_loss[n];
        r->pass->loss_sum += sum;
    }
    op_close(r, op);
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
    int op = op_open(r, -1, MODEL_OPR_FINAL_LN, MODEL_FWD);
    norm_fwd(r, EXEC_HA(x, LOGITS_IN), EXEC_HA(x, FINAL_LN_IN), P->lnf_w, P->lnf_b, R);
    op_close(r, op);
    /* the output layer's input over the full sequence, and its weights (the tied embedding's
     * second gather under ZeRO-3) */
    const void *in = EXEC_HA(x, LOGITS_IN);
    if (exec_sp_on(c)) {
        TRY(exec_tp_all_gather(r, MODEL_OPR_LOGITS, -1, chunk, MODEL_FWD, r->W->sp_gather,
                               EXEC_HA(x, LOGITS_IN), (size_t)R * h, err));
        in = r->W->sp_gather;
    }
    if (c->g.tied_here)
        TRY(gather_block(r, P->embed_block, MODEL_FWD, 1, err));

    /* fp32 logits straight into the saved probabilities; columns of the vocabulary padding
     * get -inf, so they take no probability and the loss does not depend on the padding */
    float *probs = EXEC_HA(x, LOSS_PROBS);
    op = op_open(r, -1, MODEL_OPR_LOGITS, MODEL_FWD);
    mm_f32(r, probs, in, P->out_w, N, V, h, 0, 1, 0);
    if (vocab < v0 + V)
        k->fill_cols_f32(probs, N, V, vocab > v0 ? vocab - v0 : 0, V, -INFINITY);
    op_close(r, op);
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

int exec_layers_logits_wgrad(const ExecLayerRun *r, int chunk, int l, const void *in,
                             const void *probs, PxError *err)
{
    const ModelDims *d = &r->c->d;
    const int N = d->b * d->s_loc, R = d->b * d->s_sp, V = d->vocab_loc, h = d->h;
    if (exec_sp_on(r->c)) {
        TRY(exec_tp_all_gather(r, MODEL_OPR_LOGITS, l, chunk, MODEL_BWD, r->W->sp_gather, in,
                               (size_t)R * h, err));
        in = r->W->sp_gather;
    }
    mm_grad(r, r->P->g_out_w, probs, in, V, h, N);
    return PX_OK;
}

/* The output layer's weight gradient, within its backward op: dW += dlogits^T x (SP: x
 * re-gathered). The logits' gradient is already in the act dtype (dlogits_act). */
static int logits_wgrad(const ExecLayerRun *r, int chunk, const ExecHeadActs *x, PxError *err)
{
    return exec_layers_logits_wgrad(r, chunk, -1, EXEC_HA(x, LOGITS_IN), EXEC_HA(x, LOSS_PROBS),
                                    err);
}

/* Under ZeRO-2/3 the prediction modules' heads' share of the output layer's weight gradient,
 * which waited for this block's window (mtp_tokens.c, exec_mtp_deferred), each within more of
 * its head's backward op. */
static int mtp_deferred_wgrad(const ExecLayerRun *r, int chunk, const ExecHeadActs *x,
                              PxError *err)
{
    const ExecCtx *c = r->c;
    if (!exec_mtp_deferred(c) || c->g.chunk_g[chunk] != c->d.chunks - 1)
        return PX_OK;
    for (int i = 0; i < c->spec.model.mtp_layers; i++) {
        const int l = c->spec.model.layers + i;
        const int op = exec_meter_layer_op(r->M, l, MODEL_OPR_LOGITS, MODEL_BWD);
        if (op < 0)
            return exec_meter_missing(c, "prediction module's output layer op", err);
        exec_meter_open_again(r->M, c->k, op);
        TRY(exec_layers_logits_wgrad(r, chunk, l, x->mtp_logits_in[i], x->mtp_probs[i], err));
        op_close(r, op);
    }
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
    const int N = b * d->s_loc, R = b * d->s_sp, sp = exec_sp_on(c);
    /* the loss is the mean over every token of the global batch (of every cp rank's), times
     * the fp16 loss scale */
    const float dloss = (float)(r->pass->loss_scale / ((double)c->spec.job.global_batch * d->s));
    float *probs = EXEC_HA(x, LOSS_PROBS);
    exec_zero_bucket_clear(r->Z, c, P, P->final_block);
    /* after the prediction modules' own gathers of these blocks (mtp.c) */
    TRY(gather_block(r, P->final_block, MODEL_BWD, exec_mtp_gathers_bwd(c, 0), err));
    if (c->g.tied_here)
        TRY(gather_block(r, P->embed_block, MODEL_BWD, exec_mtp_gathers_bwd(c, 1), err));

    int op = op_open(r, -1, MODEL_OPR_LOSS, MODEL_BWD);
    for (int q = 0; q < b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++)
            k->xent_bwd(probs + ((size_t)q * d->s_loc + (size_t)j * C) * V,
                        tok_part(c, tok, q, j) + 1, C, V, c->g.tp_rank * V, dloss);
    const void *dlogits = dlogits_act(r, probs, (size_t)N * V);
    op_close(r, op);

    /* input gradient (summed over TP into ws.dx_a); the weight gradient too, unless the
     * embedding's block must be in the ZeRO bucket to receive it (then just before the
     * embedding's backward) */
    void *dx = sp ? r->W->out : r->W->dx_a;
    op = op_open(r, -1, MODEL_OPR_LOGITS, MODEL_BWD);
    mm_act(r, dx, dlogits, P->out_w, N, h, V, 0, 0);
    if (!c->g.defer_logits_wgrad)
        TRY(logits_wgrad(r, chunk, x, err));
    if (sp)
        TRY(exec_tp_reduce_scatter(r, MODEL_OPR_LOGITS, -1, chunk, MODEL_BWD, r->W->dx_a, dx,
                                   (size_t)R * h, err));
    else
        TRY(exec_tp_allreduce(r, MODEL_OPR_LOGITS, -1, chunk, MODEL_BWD, r->W->dx_a,
                              (size_t)R * h, err));
    op_close(r, op);
    /* ZeRO-2/3: the prediction modules' share of the output layer's weight gradient */
    if (!c->g.defer_logits_wgrad)
        TRY(mtp_deferred_wgrad(r, chunk, x, err));

    op = op_open(r, -1, MODEL_OPR_FINAL_LN, MODEL_BWD);
    /* the prediction modules' gradient of the hidden state they read, which their backward
     * (mtp.c, before this one) left in the first module's spent output, or none */
    const void *dh_mtp = c->g.chunk_mtp[chunk] > 0 ? x->mtp_out[0] : NULL;
    if (dh_mtp)
        k->copy(dres, dh_mtp, (size_t)R * h * c->ab);
    else
        k->memset0(dres, (size_t)R * h * c->ab);
    norm_bwd(r, dres, P->g_lnf_w, P->g_lnf_b, r->W->dx_a, EXEC_HA(x, FINAL_LN_IN), P->lnf_w, R);
    op_close(r, op);
    TRY(exec_zero_bucket_reduce(r->Z, c, P, r->M, P->final_block, err));
    if (last_mb)
        TRY(exec_zero_block_done(r->Z, c, P, r->M, P->final_block, err));
    return PX_OK;
}

static int embed_bwd(const ExecLayerRun *r, int chunk, int mb, const ExecLayerActs *A,
                     const ExecHeadActs *x, const int32_t *tok, const void *dres, int last_mb,
                     PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    ExecParams *P = r->P;
    const int b = d->b, h = d->h, V = d->vocab_loc, R = b * d->s_sp, C = exec_cp_part_len(c);
    exec_zero_bucket_clear(r->Z, c, P, P->embed_block);
    if (c->g.defer_logits_wgrad) {
        /* the output layer's weight gradient, deferred: more of its backward op's call */
        const int op = exec_meter_other_op(r->M, MODEL_OPR_LOGITS, MODEL_BWD);
        exec_meter_open_again(r->M, c->k, op);
        TRY(logits_wgrad(r, chunk, x, err));
        op_close(r, op);
        TRY(mtp_deferred_wgrad(r, chunk, x, err));
    }
    TRY(gather_block(r, P->embed_block, MODEL_BWD,
                     (c->g.tied_here ? 1 : 0) + exec_mtp_gathers_bwd(c, 1), err));
    const int op = op_open(r, -1, MODEL_OPR_EMBED, MODEL_BWD);
    const void *dy = dropout_bwd(r, dres, EXEC_HA(x, EMBED_DROP_MASK));
    if (exec_sp_on(c)) {
        TRY(exec_tp_all_gather(r, MODEL_OPR_EMBED, -1, chunk, MODEL_BWD, r->W->sp_gather, dy,
                               (size_t)R * h, err));
        dy = r->W->sp_gather;
    }
    for (int q = 0; q < b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++)
            k->embedding_bwd(P->g_wte, P->g_wpe, AT(dy, ((size_t)q * d->s_loc + (size_t)j * C) * h),
                             tok_part(c, tok, q, j), C, C, exec_cp_part_pos(c, c->g.cp_rank, j), h,
                             c->g.tp_rank * V, V);
    op_close(r, op);
    /* ZeRO-2/3: the prediction modules' rows of the embedding's gradient (mtp_tokens.c) */
    TRY(exec_mtp_deferred_embed(r, chunk, mb, A, tok, err));
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
    /* a stage of the prediction modules' own keeps its output, the main hidden state, for
     * them (mtp.c, which sends it on with theirs); a loss stage after it receives theirs too */
    const int alone = !last && c->g.chunk_mtp[j] > 0, D = c->spec.model.mtp_layers;
    const int after = last && D > 0 && c->d.mtp_chunk != g;
    /* the chunk's output: the output layer's input, or a scratch that is sent on (with SP
     * ws.out feeds the last reduce-scatter, so ws.dx_a holds the region; a chunk of the
     * embedding only sends from ws.dx_a too, as its dropout reads ws.out) */
    void *send = alone ? EXEC_HA(x, FINAL_LN_IN) : exec_sp_on(c) || cl == 0 ? r->W->dx_a : r->W->out;
    /* the chunk's input: its first layer's, or (a chunk without layers) its output */
    void *in = cl > 0 ? EXEC_LA(&A[0], LN1_IN) : last ? EXEC_HA(x, FINAL_LN_IN) : send;
    if (g == 0) {
        TRY(embed_fwd(r, j, mb, x, in, tok, err));
    } else if (after) {
        void *dst[1 + EXEC_MTP_MAX] = {in};
        for (int i = 0; i < D; i++)
            dst[1 + i] = x->mtp_logits_in[i];
        TRY(exec_pipe_take_parts(r->pipe, c, r->M, j, mb, 0, dst, 1 + D, err));
        exec_meter_pass_input(r->M);
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
    return alone ? PX_OK : exec_pipe_give(r->pipe, c, r->M, j, mb, 0, send, err);
}

int exec_layers_backward(const ExecLayerRun *r, int j, int mb, ExecLayerActs *A,
                         const ExecHeadActs *x, const int32_t *tok, int last_mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const int g = c->g.chunk_g[j], cl = c->g.chunk_cl[j], l0 = c->g.chunk_l0[j];
    void *dres = r->W->dx_b;
    const int D = c->spec.model.mtp_layers, last = g == c->d.chunks - 1;
    const int after = last && D > 0 && c->d.mtp_chunk != g;
    if (last) {
        TRY(head_bwd(r, j, x, tok, dres, last_mb, err));
    } else if (c->g.chunk_mtp[j] > 0) {
        /* the prediction modules' own stage: their backward (mtp.c) took the gradient and left
         * the main hidden state's part in pp.send, theirs in the first module's spent output */
        TRY(exec_pipe_gather_part(r->pipe, c, r->M, j, 1, 0, dres, err));
        c->k->add_inplace(dres, x->mtp_out[0], (size_t)c->d.b * c->d.s_sp * c->d.h);
    } else {
        TRY(exec_pipe_take(r->pipe, c, r->M, j, mb, 1, dres, err));
        exec_meter_pass_input(r->M);
    }
    for (int li = cl - 1; li >= 0; li--) {
        const int l = l0 + li, blk = r->P->layer_block[l];
        exec_zero_bucket_clear(r->Z, c, r->P, blk);
        /* ZeRO-3: DeepSpeed's gather for the recomputed forward, else the backward's (which
         * with --fsdp serves the recomputed forward too); then the earlier layers' prefetched */
        const ModelPhase first = exec_zero_twice_gathered(c) ? MODEL_RECOMPUTE : MODEL_BWD;
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
        return embed_bwd(r, j, mb, A, x, tok, dres, last_mb, err);
    if (after) { /* the modules' gradients, which their heads' backward left in their inputs */
        const void *src[1 + EXEC_MTP_MAX] = {dres};
        for (int i = 0; i < D; i++)
            src[1 + i] = x->mtp_logits_in[i];
        return exec_pipe_give_parts(r->pipe, c, r->M, j, mb, 1, src, 1 + D, err);
    }
    return exec_pipe_give(r->pipe, c, r->M, j, mb, 1, dres, err);
}

/* ---- for the prediction modules (mtp.c) ---- */

int exec_layers_one_fwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *out,
                        int mb, PxError *err)
{
    return layer_fwd(r, chunk, l, a, out, MODEL_FWD, mb, err);
}

int exec_layers_one_bwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *dres,
                        int mb, PxError *err)
{
    return layer_bwd(r, chunk, l, a, dres, mb, err);
}

const void *exec_layers_dlogits_act(const ExecLayerRun *r, float *probs, size_t n)
{
    return dlogits_act(r, probs, n);
}
