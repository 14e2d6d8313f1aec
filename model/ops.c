/* The op graph of one pipeline stage: forward, backward and recompute ops of one micro-batch
 * for each local model chunk, then the per-step ops (gradient reduction, optimizer).
 *
 * FLOPs are matmul FLOPs, 2*m*n*k per product, as in Narayanan et al. 2021 (Sec. 5.1) and
 * Korthikanti et al. 2022 (Sec. 6): backward = 2 x forward, attention scores and context counted
 * without causal halving unless the job asks for it. Tensor-parallel communication follows
 * Megatron-LM: the g operator all-reduces the outputs of the row-parallel attention projection
 * and fc2 in forward, the f operator all-reduces the inputs' gradients of the column-parallel
 * QKV and fc1 in backward; with sequence parallelism each all-reduce becomes an all-gather /
 * reduce-scatter pair and the backward re-gathers the saved, sequence-sharded inputs of QKV,
 * fc1 and the output layer for their weight gradients. docs/ops.md lists every op. */
#include "model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ModelOpGraph *g;
    const ModelSpec *s;
    const ModelDims *d;
    ModelPhase phase;
    ModelOpRole role; /* the ops emitted next run here, for this block (-1: none) */
    int block;
    int chunk, layer, per_mb;
    int repeat;
    PxError *err;
    int rc;
} Emit;

static int block_norms(const ModelSpec *s, const ModelBlock *b);

/* Names are built by hand rather than with snprintf: the planner builds millions of them. */
static void name_join(char *dst, size_t cap, const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na > cap - 1)
        na = cap - 1;
    if (dst != a)
        memmove(dst, a, na);
    if (na + 1 < cap) {
        dst[na++] = '.';
        if (nb > cap - 1 - na)
            nb = cap - 1 - na;
        memcpy(dst + na, b, nb);
        na += nb;
    }
    dst[na] = '\0';
}

/* "layer.<l>" or "layer.<l>.<suffix>" (suffix NULL for none) into n[64]. */
static void layer_name(char *n, int l, const char *suffix)
{
    model_block_name(n, l);
    if (suffix)
        name_join(n, 64, n, suffix);
}

static const char *const role_names[MODEL_OPR_COUNT] = {
    "",         "embed",    "ln1",    "attn.qkv", "attn.core", "attn.proj", "ln2",
    "mlp.fc1",  "mlp.act",  "mlp.fc2", "final_ln", "logits",    "loss",      "optimizer",
    "pp",       "params",   "grads",  "sp_grads", "moe.router", "moe.dispatch",
    "moe.experts.fc1", "moe.experts.act", "moe.experts.fc2", "moe.combine", "attn.q_a",
    "attn.q_b", "attn.kv_a", "attn.kv_b", "mtp"};

const char *model_op_role_name(ModelOpRole r)
{
    return (unsigned)r < MODEL_OPR_COUNT ? role_names[r] : "?";
}

/* The ops emitted next run at role r of layer l: their base name "layer.<l>.<role>" into
 * n[64]. */
static void at_layer(Emit *e, ModelOpRole r, int l, char *n)
{
    e->role = r;
    layer_name(n, l, role_names[r]);
}

/* The ops emitted next run at role r outside the layers (embed, final_ln, logits, loss,
 * optimizer, pp): returns the base name. */
static const char *at(Emit *e, ModelOpRole r)
{
    e->role = r;
    return role_names[r];
}

static ModelOp *op_new(Emit *e, ModelOpKind kind, const char *name)
{
    static ModelOp sink; /* absorbs writes after an allocation failure */
    if (e->rc)
        return &sink;
    ModelOpGraph *g = e->g;
    if (g->count == g->cap) {
        int cap = g->cap ? 2 * g->cap : 256; /* a compact stage: about 100 ops per chunk */
        ModelOp *o = realloc(g->op, (size_t)cap * sizeof *o);
        if (!o) {
            e->rc = px_fail(e->err, PX_ERUNTIME, "out of memory building the op graph");
            return &sink;
        }
        g->op = o;
        g->cap = cap;
    }
    ModelOp *op = &g->op[g->count++];
    memset(op, 0, sizeof *op);
    px_strlcpy(op->name, name, sizeof op->name);
    op->kind = kind;
    op->phase = e->phase;
    op->role = e->role;
    op->block = e->block;
    op->chunk = e->chunk;
    op->layer = e->layer;
    op->per_microbatch = e->per_mb;
    op->calls = 1;
    op->repeat = e->repeat;
    op->kernels = kind == MODEL_OP_COMM ? 0 : 1;
    return op;
}

static double eb(const Emit *e) { return (double)px_dtype_bytes(e->d->act); }

/* Elementwise passes over an activation: fused kernels make one pass of `fused` reads and
 * writes in one kernel, unfused ones `unfused` passes in `kernels` kernels. */
static double passes(const Emit *e, double fused, double unfused)
{
    return e->s->job.fused_kernels ? fused : unfused;
}

/* Current scaling's amax pass over a quantized tensor of `elems` elements (docs/fp8.md, "Time"):
 * under `tensorwise` the scale comes from the tensor itself, so before the cast one kernel reads
 * it for its amax and one more turns the amax into the scale (Transformer Engine's
 * Float8CurrentScalingQuantizer::quantize_impl, transformer_engine/pytorch/csrc/quantizer.cpp:
 * nvte_compute_amax, nvte_compute_scale_from_amax, then nvte_quantize_v2): a bytes an element
 * and two kernels. Delayed scaling takes its scale from the history (the cast records the amax);
 * the block recipes take each block's amax in the cast kernel itself. */
static double fp8_amax_bytes(const Emit *e, double elems)
{
    return e->s->job.fp8 == MODEL_FP8_TENSORWISE ? elems * eb(e) : 0.0;
}

/* An FP8 linear layer (docs/fp8.md): its GEMMs read one-byte operands, and it quantizes what
 * they read but the weights (cast once per step, by the optimizer step): the forward its
 * input, the backward the output gradient, each read in the activation dtype and written in
 * FP8, twice where a transposed copy is kept (a TN-only device, or MXFP8's column-wise
 * scales). A quantize is one kernel. */
static void linear_fp8(Emit *e, ModelOp *op, double M, double N, double K, double W,
                       double extra_bytes)
{
    const double a = eb(e), copies = 1.0 + (e->d->fp8_wt ? 1.0 : 0.0);
    /* ZeRO-3 keeps no FP8 copies: each use casts the gathered weight (read in the weights'
     * dtype, written in FP8: the forward's copy, the backward's transposed one or again the
     * copy) */
    const int mx_gathered = model_fp8_mx_gather_copies(e->s, e->d, MODEL_FWD) > 0;
    const double per_use = e->s->layout.zero != 3      ? 0.0
                           : !e->s->job.fp8_param_gather ? W * ((double)px_dtype_bytes(e->d->param) + 1.0)
                           : e->d->fp8_wt && !mx_gathered ? 2.0 * W /* gathered in FP8: transposed only */
                                                         : 0.0; /* MXFP8: each copy gathered */
    /* an attention projection that saved its 16-bit input quantizes it again for the weight
     * gradient (model_fp8_proj_in) */
    double requant = e->role == MODEL_OPR_PROJ && model_fp8_proj_in(e->s) == MODEL_FP8_PROJ_ACT
                         ? M * K * (a + 1.0)
                         : 0.0;
    /* the shared experts' fc2 under their gate (exec/train/layers.c, fp8_gate_bwd): its saved
     * FP8 input decoded for the gate's backward (read 1 byte, write a) and, gated, quantized
     * again for the weight gradient (read a, write 1): two kernels more */
    const int gate = e->phase == MODEL_BWD && e->role == MODEL_OPR_FC2 && e->layer >= 0 &&
                     e->s->model.moe.shared_gate && model_layer_is_moe(&e->s->model, e->layer);
    if (gate)
        requant += 2.0 * M * K * (a + 1.0);
    /* current scaling reads each activation or gradient it quantizes once more, for its amax */
    const double amax = e->phase == MODEL_BWD
                            ? fp8_amax_bytes(e, M * N) + (requant > 0 ? fp8_amax_bytes(e, M * K) : 0.0)
                            : fp8_amax_bytes(e, M * K);
    if (e->phase == MODEL_BWD) {
        double g = (double)px_dtype_bytes(e->d->grad);
        op->fp8_cast_bytes = M * N * (a + copies) + per_use + requant + amax;
        /* dgrad reads dY and W, writes dX; wgrad reads dY and X, accumulates dW */
        op->bytes = (M * N + W + M * K * a) + (M * N + M * K) + 2.0 * W * g + extra_bytes +
                    op->fp8_cast_bytes;
    } else {
        op->fp8_cast_bytes = M * K * (a + copies) + per_use + amax;
        op->bytes = (M * K + W + M * N * a) + extra_bytes + op->fp8_cast_bytes;
    }
    op->fp8 = 1;
    /* the amax and the scale: two kernels for each tensor current scaling reads for its amax */
    const int amax_kernels = amax > 0 ? 2 * (e->phase == MODEL_BWD && requant > 0 ? 2 : 1) : 0;
    op->kernels += (per_use > 0 ? 2 : 1) + (gate ? 2 : 0) + amax_kernels;
}

/* Y[M,N] = X[M,K] W[N,K]^T; backward computes dX (M,K,N) and dW (N,K,M). Weight gradients
 * accumulate into the gradient buffer (read and written in the gradient dtype). An epilogue
 * (bias, dropout, residual) adds extra_bytes in epi_kernels launches. */
/* `groups` weight matrices of N x K, each applied to its share of the M rows (a MoE layer's
 * experts as one grouped GEMM; 1: an ordinary linear layer). */
static void linear_g(Emit *e, const char *base, double M, double N, double K, double extra_bytes,
                     int epi_kernels, int groups)
{
    ModelOp *op = op_new(e, MODEL_OP_MATMUL, base);
    double a = eb(e), W = N * K * groups;
    int64_t m = (int64_t)ceil(M / groups);
    if (e->phase == MODEL_BWD) {
        double g = (double)px_dtype_bytes(e->d->grad);
        op->flops = 4.0 * M * N * K;
        op->bytes = (M * N + W + M * K) * a + (M * N + M * K) * a + 2.0 * W * g + extra_bytes;
        op->n_gemm = 2;
        op->gemm[0] = (ModelGemm){m, (int64_t)K, (int64_t)N, groups};
        op->gemm[1] = (ModelGemm){(int64_t)N, (int64_t)K, m, groups};
    } else {
        op->flops = 2.0 * M * N * K;
        op->bytes = (M * K + W + M * N) * a + extra_bytes;
        op->n_gemm = 1;
        op->gemm[0] = (ModelGemm){m, (int64_t)N, (int64_t)K, groups};
    }
    /* a MoE layer's grouped GEMM launches one GEMM per expert (Transformer Engine's
     * general_grouped_gemm) */
    op->kernels = op->n_gemm * groups + (extra_bytes > 0 ? epi_kernels : 0);
    op->epilogue_bytes = extra_bytes;
    if (model_fp8_op(e->s, e->role))
        linear_fp8(e, op, M, N, K, W, extra_bytes);
}

static void linear_k(Emit *e, const char *base, double M, double N, double K, double extra_bytes,
                     int epi_kernels)
{
    linear_g(e, base, M, N, K, extra_bytes, epi_kernels, 1);
}

static void linear(Emit *e, const char *base, double M, double N, double K, double extra_bytes)
{
    linear_k(e, base, M, N, K, extra_bytes, 1);
}

/* The row-parallel outputs' epilogue: bias, dropout and residual add; Megatron's fused
 * bias-dropout-add reads output, bias and residual and writes the sum (3 passes, 1 kernel);
 * unfused: bias add (2), dropout (2 + mask), residual add (3) in 3 kernels. */
static void linear_epilogue(Emit *e, const char *base, double M, double N, double K, double nb)
{
    int drop = e->s->job.dropout > 0.0;
    double fused = 3.0 + (drop ? 1.0 / eb(e) : 0.0);
    double unfused = 2.0 + (drop ? 2.0 + 1.0 / eb(e) : 0.0) + 3.0;
    linear_k(e, base, M, N, K, passes(e, fused, unfused) * nb, e->s->job.fused_kernels ? 1 : (drop ? 3 : 2));
}

static void comm(Emit *e, const char *base, ModelComm kind, int group_size, double bytes, int calls)
{
    if (group_size < 2)
        return;
    char n[sizeof ((ModelOp *)0)->name];
    name_join(n, sizeof n, base, model_comm_name(kind));
    ModelOp *op = op_new(e, MODEL_OP_COMM, n);
    op->comm = kind;
    op->group_size = group_size;
    op->comm_bytes = (uint64_t)bytes;
    op->calls = calls;
}

/* A collective on block b of the tensor table at role r (params, grads, sp_grads), named
 * "<block>.<role>.<kind>" and tagged with the block, which the executor reduces or gathers by;
 * the ops emitted after it belong to no block. */
static void block_comm(Emit *e, ModelOpRole r, const ModelTensorTable *tt, int b, ModelComm kind,
                       int group_size, double bytes, int calls)
{
    char n[64];
    e->role = r;
    e->block = b;
    name_join(n, sizeof n, tt->blocks[b].name, role_names[r]);
    comm(e, n, kind, group_size, bytes, calls);
    e->block = -1;
}

static ModelOp *simple(Emit *e, ModelOpKind kind, const char *base, double bytes)
{
    ModelOp *op = op_new(e, kind, base);
    op->bytes = bytes;
    return op;
}

/* A norm over nb bytes of activations, `passes` of them as a fused kernel makes (2 forward,
 * 4-5 backward). A framework whose norms are Python modules run eagerly (eager_norms: the
 * torchtitan and fms-fsdp RMSNorm, `(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps))
 * .type_as(x) * weight`) makes six kernels of it: the cast up (read a, write 4 bytes per
 * element), pow (4 + 4), mean (4), the scaling (4 + 4), the cast down (4 + a) and the weight
 * (a + a): 4a + 28 bytes per element where the fused kernel moves 2a; its backward runs each
 * op's gradient, twice the forward's traffic and kernels (docs/time.md, "Frameworks"). */
static ModelOp *norm(Emit *e, const char *n, double passes, double nb)
{
    const double a = eb(e);
    ModelOp *op = simple(e, MODEL_OP_NORM, n, passes * nb);
    if (!e->d->eager_norms)
        return op;
    const double extra = nb / a * (4.0 * a + 28.0 - 2.0 * a);
    const int bwd = e->phase == MODEL_BWD;
    op->bytes += bwd ? 2.0 * extra : extra;
    op->kernels += bwd ? 10 : 5;
    return op;
}

/* Bytes of the full-sequence activation [b, s_loc, h] that TP collectives move. */
static double tp_act_bytes(const Emit *e)
{
    const ModelDims *d = e->d;
    return (double)d->b * d->s_loc * d->h * eb(e);
}

/* FP8 attention on the unfused core, as Transformer Engine's unfused path emulates it: Q, K, V
 * (forward) and dO (backward) quantized and decoded in place (read a, write 1; read 1, write
 * a: two kernels), the 16-bit tensors saved as without FP8. A selective recompute reruns the
 * core on the rounded Q, K, V without rounding them again. */
static void attention_fp8_emulated(Emit *e, ModelOp *op, double qkv, double out)
{
    if (e->phase == MODEL_RECOMPUTE && e->s->layout.recompute != MODEL_RECOMPUTE_FULL)
        return;
    op->fp8_cast_bytes = 2.0 * (e->phase == MODEL_BWD ? out : qkv) * (eb(e) + 1.0);
    op->bytes += op->fp8_cast_bytes;
    op->kernels += 2;
}

/* MXFP8 attention's fused core (model_fp8_attn_copies 2; docs/fp8.md, "FP8 attention"), as
 * Transformer Engine runs it: the forward quantizes Q, K and V in one pass into both copies
 * (read a, write 2 bytes an element) and reads the row-wise Q and K and the column-wise V; the
 * backward quantizes dO into both copies (read a, write 2) and reads Q, K and dO in both copies
 * (2 bytes an element where it read a) and V in one (the row-wise, for dP). Its output stays
 * 16-bit (model_fp8_attn_out 0). One kernel per quantize pass. With context parallelism
 * (model_fp8_attn_cp16) Transformer Engine quantizes each step's parts after the exchange
 * (context_parallel.py's combine_and_quantize per step): priced as one pass over this rank's
 * Q and the whole sequence's K, V (the qkv here), as the executor runs it; TE's all-gather
 * quantizes each step's keys up to its chunk, (2 cp + 1) / (2 cp) of them on average. */
static void attention_mxfp8(Emit *e, ModelOp *op, double qkv, double out)
{
    const ModelDims *d = e->d;
    const double a = eb(e);
    const int vw = e->s->model.mla.kv_lora_rank > 0 ? d->o_loc : d->kv_width_loc;
    const double v = (double)d->b * d->s * vw; /* the values' elements, of the qkv */
    if (e->phase == MODEL_BWD) {
        /* with cp over the all-gather or the ring (model_fp8_attn_saved 0) the saved 16-bit
         * Q, K, V (the gathered or passed K, V) are quantized into both copies again */
        const double again = model_fp8_attn_saved(e->s) ? 0.0 : qkv * (a + 2.0);
        op->fp8_cast_bytes = out * (a + 2.0) + again;
        op->bytes += op->fp8_cast_bytes - (qkv - v) * (a - 2.0) - v * (a - 1.0) - out * (a - 2.0);
        op->kernels += again > 0.0;
    } else {
        op->fp8_cast_bytes = qkv * (a + 2.0);
        op->bytes += op->fp8_cast_bytes - qkv * (a - 1.0);
    }
    op->kernels += 1;
}

/* The gradients that travel in FP8 (model_fp8_attn_dqkv) quantized with their history's
 * factor (read a, write 1) and decoded where they arrive (read 1, write a): Ulysses' head-split
 * dQ, dK, dV, b s/cp (q + 2 kv) elements, or the ring's dK, dV of every block, cp b s/cp 2 kv.
 * Transformer Engine's kernel writes them in FP8 and decodes them after the exchange
 * (context_parallel.py); the executor quantizes in a pass of its own (exec/train/cp.c). */
static double attention_fp8_dqkv(const Emit *e)
{
    const ModelDims *d = e->d;
    if (!model_fp8_attn_dqkv(e->s))
        return 0.0;
    const double M = (double)d->b * d->s_loc;
    const double g = e->s->layout.cp_comm == MODEL_CP_COMM_A2A
                         ? M * (d->q_loc + (double)d->kv2_loc)
                         : d->c * M * (double)d->kv2_loc;
    return 2.0 * g * (eb(e) + 1.0);
}

/* FP8 attention's fused core (model_fp8_attn_qkv; docs/fp8.md, "FP8 attention"), over qkv
 * elements of Q, K, V and out of the output: the forward quantizes Q, K and V (read in the act
 * dtype, written in FP8 once: the core's kernels take no transposed copies) and its GEMMs read
 * the FP8 copies; under delayed scaling the core writes its output in FP8 and decodes the
 * 16-bit output from it (read 1 byte, write a). The backward quantizes the output gradient
 * (read a, write 1), reads the saved FP8 Q, K, V (and output, delayed) and the FP8 output
 * gradient in its GEMMs. One kernel per quantize or decode pass. The unfused core: above. */
static void attention_fp8(Emit *e, ModelOp *op, double qkv, double out)
{
    if (!model_fp8_op(e->s, MODEL_OPR_CORE))
        return;
    if (!model_fp8_attn_qkv(e->s)) {
        attention_fp8_emulated(e, op, qkv, out);
        return;
    }
    const double a = eb(e), o8 = model_fp8_attn_out(e->s) ? 1.0 : 0.0;
    if (model_fp8_attn_copies(e->s) == 2) {
        attention_mxfp8(e, op, qkv, out);
        return;
    }
    if (e->phase == MODEL_BWD) {
        op->fp8_cast_bytes = out * (a + 1.0) + attention_fp8_dqkv(e);
        /* Q, K, V and the output (delayed) read in one byte; dO once of its three reads */
        op->bytes += op->fp8_cast_bytes - qkv * (a - 1.0) - out * (a - 1.0) * (1.0 + o8);
        op->kernels += 1 + (model_fp8_attn_dqkv(e->s) ? 2 : 0);
    } else {
        op->fp8_cast_bytes = qkv * (a + 1.0) + o8 * out * (1.0 + a);
        op->bytes += op->fp8_cast_bytes - qkv * (a - 1.0) - o8 * out * (a - 1.0);
        op->kernels += 1 + (int)o8;
    }
}

static void attention_core(Emit *e, const char *base)
{
    const ModelDims *d = e->d;
    const ModelSpec *s = e->s;
    /* query/key heads qk_hd wide, value heads v_hd (equal but with MLA): the scores cost
     * qk_hd and the context v_hd per pair, their mean in the FLOP count's d */
    double bh = (double)d->b * d->heads_loc, sq = d->s_loc, sk = d->s, a = eb(e);
    double hd = d->v_hd, qk = d->qk_hd;
    double fwd = model_attention_fwd_flops(s, bh, sq, sk, 0.5 * (qk + hd));
    double qkv = (double)d->b * (sq * d->q_loc + sk * d->kv2_loc) * a;
    double out = (double)d->b * sq * d->o_loc * a;
    double mat = bh * sq * sk * a; /* one s x s score matrix per head */
    int drop = s->job.dropout > 0.0;
    ModelOp *op = op_new(e, MODEL_OP_ATTENTION, base);
    op->fp8 = model_fp8_op(s, e->role);
    op->n_gemm = 2;
    op->gemm[0] = (ModelGemm){(int64_t)sq, (int64_t)sk, (int64_t)qk, (int64_t)bh};
    op->gemm[1] = (ModelGemm){(int64_t)sq, (int64_t)hd, (int64_t)sk, (int64_t)bh};
    /* Unfused attention: the score GEMM writes S; Megatron's fused scale-mask-softmax reads it
     * and writes P in one kernel (unfused: scale, mask and softmax are three passes of two);
     * dropout reads P and writes the dropped copy and its mask; the context GEMM reads it. */
    const double softmax = passes(e, 2.0, 6.0);
    const int softmax_kernels = s->job.fused_kernels ? 1 : 3;
    if (e->phase == MODEL_BWD) {
        op->n_gemm = 4;
        op->gemm[2] = (ModelGemm){(int64_t)sk, (int64_t)hd, (int64_t)sq, (int64_t)bh};
        op->gemm[3] = (ModelGemm){(int64_t)sq, (int64_t)qk, (int64_t)sk, (int64_t)bh};
        if (s->job.flash_attn) {
            /* FlashAttention's backward recomputes the scores: 2.5 x the forward (Dao 2023).
             * The extra half is recompute: it counts in hardware FLOPs, not model FLOPs. */
            op->flops = model_attention_bwd_flops(fwd, 1, &op->recompute_flops);
            op->bytes = 2.0 * qkv + 3.0 * out + bh * sq * 8.0;
            op->kernels = 2;
            attention_fp8(e, op, qkv / a, out / a);
        } else {
            /* dP written and read, softmax backward reads P and dP and writes dS, dropout
             * backward reads the mask, the two gradient GEMMs read dS */
            op->flops = model_attention_bwd_flops(fwd, 0, NULL);
            op->bytes = 2.0 * qkv + 2.0 * out + mat * (drop ? 7.0 + 1.0 / a : 5.0) + mat * (softmax - 2.0);
            op->kernels = 4 + softmax_kernels + drop;
            attention_fp8(e, op, qkv / a, out / a);
        }
    } else {
        op->flops = fwd;
        if (s->job.flash_attn) {
            op->bytes = qkv + out + bh * sq * 4.0;
            op->kernels = 1;
            attention_fp8(e, op, qkv / a, out / a);
        } else {
            op->bytes = qkv + out + mat * (2.0 + softmax + (drop ? 2.0 + 1.0 / a : 0.0));
            op->kernels = 2 + softmax_kernels + drop;
            attention_fp8(e, op, qkv / a, out / a);
        }
    }
}

double model_attention_fwd_flops(const ModelSpec *s, double bh, double tq, double tk, double d)
{
    double fwd = 2.0 * 2.0 * bh * tq * tk * d;
    return s->job.causal_flops ? 0.5 * fwd : fwd;
}

double model_attention_bwd_flops(double fwd_flops, int flash, double *recompute_flops)
{
    if (recompute_flops)
        *recompute_flops = flash ? 0.5 * fwd_flops : 0.0;
    return (flash ? 2.5 : 2.0) * fwd_flops;
}

/* The rotary embedding of the queries and keys where the framework runs it eagerly
 * (d->rope_eager_bytes, from its profile): fms-fsdp's RotaryEmbedding.adjusted_qk casts each
 * tensor to fp32 (read a, write 4 bytes an element), multiplies it by the cached 2 x 2
 * rotations into a tensor twice its size (read 4, write 8), sums the pairs (read 8, write 4) and
 * casts back (read 4, write a): 36 bytes an element in 4 kernels at a = 2, each pass (its
 * backward runs each op's gradient: the same traffic). Fused, it rides the QKV projection's
 * epilogue and is not priced (docs/time.md, "Frameworks"). */
static void qkv_rope_eager(const Emit *e, double M, double *bytes, int *kernels)
{
    const ModelDims *d = e->d;
    *bytes = d->rope_eager_bytes * M * ((double)d->q_loc + d->kv_width_loc);
    *kernels = 2 * d->rope_eager_kernels;
}

/* The QKV projection, or multi-head latent attention's: the down-projections on the rank's
 * (sequence-parallel) tokens, their norms, the latents gathered over TP, the up-projections by
 * heads (Megatron-Core's MLA). */
static void qkv_forward(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const ModelMla *m = &s->model.mla;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    char n[64];
    if (m->kv_lora_rank <= 0) {
        at_layer(e, MODEL_OPR_QKV, l, n);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        /* Qwen3's per-head norms of the queries and keys: a read and a write of each */
        double rope = 0;
        int rope_k = 0;
        qkv_rope_eager(e, M, &rope, &rope_k);
        const double extra = (s->model.qk_norm ? 2.0 * M * (d->q_loc + d->kv_width_loc) * a : 0) + rope;
        linear_k(e, n, M, d->q_loc + (double)d->kv2_loc, h, extra, (s->model.qk_norm ? 1 : 0) + rope_k);
        return;
    }
    if (m->q_lora_rank > 0) {
        at_layer(e, MODEL_OPR_Q_A, l, n);
        linear(e, n, Msp, m->q_lora_rank, h, 2.0 * Msp * m->q_lora_rank * a); /* + its norm */
    }
    at_layer(e, MODEL_OPR_KV_A, l, n);
    linear(e, n, Msp, (double)m->kv_lora_rank + m->qk_rope_dim, h, 2.0 * Msp * m->kv_lora_rank * a);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, M * (m->kv_lora_rank + m->qk_rope_dim) * a, 1);
    at_layer(e, MODEL_OPR_Q_B, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, M * (m->q_lora_rank > 0 ? m->q_lora_rank : h) * a, 1);
    linear(e, n, M, d->q_loc, m->q_lora_rank > 0 ? m->q_lora_rank : h, 0);
    at_layer(e, MODEL_OPR_KV_B, l, n);
    linear(e, n, M, (double)d->heads_loc * (m->qk_nope_dim + m->v_dim), m->kv_lora_rank, 0);
}

/* The MLP of widths f_out (fc1's output) and f_in per TP rank: a dense layer's, or a MoE layer's
 * shared experts. */
static void mlp_forward(Emit *e, int l, double f_out, double f_in)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a;
    char n[64];
    at_layer(e, MODEL_OPR_FC1, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, f_out, h, 0);
    at_layer(e, MODEL_OPR_ACT, l, n);
    /* bias + GeLU fused (Megatron's bias_gelu): read fc1's output, write the activation;
     * unfused: a bias-add pass first */
    simple(e, MODEL_OP_ACTIVATION, n, M * (f_out + f_in + passes(e, 0.0, 2.0 * f_out)) * a)
        ->kernels = s->job.fused_kernels ? 1 : 2;
    at_layer(e, MODEL_OPR_FC2, l, n);
    linear_epilogue(e, n, M, h, f_in, nb);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
}

/* The router's work beside its GEMM (docs/time.md, "MoE as it runs"), after Megatron-Core's
 * TopKRouter and topk_softmax_with_capacity: the logits cast to fp32, the score function
 * (softmax or sigmoid), top-k (values and int64 indices), the routing map (a [T, E] boolean
 * zeroed and scattered) and the tokens per expert summed from it; with an auxiliary loss the
 * scores' sum over the tokens and the loss's scalar arithmetic. Forward: one kernel a pass,
 * the loss's scalar ops counted as 3. Backward: the top-k gradient scattered into [T, E], the
 * score function's backward, the auxiliary loss's gradient added, the cast back. */
static void router_routing(Emit *e, const char *n, double T, double E, double k, int aux)
{
    const double a = eb(e), f = 4.0;
    ModelOp *op = simple(e, MODEL_OP_ACTIVATION, n, 0);
    if (e->phase == MODEL_BWD) {
        op->bytes = T * E * f * 2.0 + T * k * 12.0 + T * E * f * 3.0 + T * E * (f + a) +
                    (aux ? 2.0 * T * E * f : 0.0);
        op->kernels = 4 + (aux ? 2 : 0);
    } else {
        op->bytes = T * E * (a + f) + 2.0 * T * E * f + T * E * f + T * k * 12.0 + 2.0 * T * E +
                    T * k * 8.0 + (aux ? T * E * f : 0.0);
        op->kernels = 5 + (aux ? 4 : 0);
    }
}

/* Megatron-Core's all-to-all dispatcher sorts the received rows by local expert after the
 * dispatch (sort_chunks_by_idxs: they arrive grouped by source rank) and back before the
 * combine, when a rank holds more than one expert: a pass over the R rows in and out. */
static void moe_sort(Emit *e, int l, double R)
{
    const ModelDims *d = e->d;
    if (d->ep < 2 || d->experts_loc < 2)
        return;
    char n[64];
    at_layer(e, MODEL_OPR_DISPATCH, l, n);
    name_join(n, sizeof n, n, "sort");
    simple(e, MODEL_OP_PERMUTE, n, 2.0 * R * d->h * eb(e));
}

/* Bytes of one FP8 padding copy of the experts' R rows of width h (docs/time.md, "MoE
 * experts in FP8"): Megatron-Core's TEGroupedMLP under FP8 (megatron/core/transformer/moe/
 * experts.py, since "Enable FP8 for TEGroupedMLP" of 2024-10-29) pads each local expert's rows
 * to a multiple of 16, the FP8 GEMM's alignment, with Transformer Engine's Fp8Padding before fc1
 * and takes the padding out with Fp8Unpadding after fc2; each is a copy of the rows into a new
 * buffer (tex.fused_multi_row_padding; the unpadding a split and torch.cat), and the backward
 * runs the other one on the gradient. Transformer Engine before 2.3 (commit 4c9626e7e of
 * 2025-04-15) copies on every call; since then only when some expert's count is not already a
 * multiple of 16, which under the router's own choice is nearly every micro-batch. So a read and
 * a write of R x h activations, one kernel, before fc1 and after fc2 in the forward and again in
 * the backward. Megatron-Core's --moe-router-padding-for-fp8 (2025-06) pads the routing map
 * instead and makes no copy; parallax prices the default. 0 outside FP8 experts. */
double model_moe_fp8_pad_bytes(const ModelSpec *s, const ModelDims *d, double R)
{
    if (!model_fp8_op(s, MODEL_OPR_EXP_FC1))
        return 0.0;
    return 2.0 * R * d->h * (double)px_dtype_bytes(d->act);
}

/* The last op emitted: an expert GEMM that carries one FP8 padding copy (above) as a pass
 * of its own, one kernel more. */
static void experts_fp8_pad(Emit *e, double R)
{
    const double pad = model_moe_fp8_pad_bytes(e->s, e->d, R);
    if (pad <= 0.0)
        return;
    ModelOp *op = &e->g->op[e->g->count - 1];
    op->fp8_cast_bytes += pad;
    op->bytes += pad;
    op->kernels += 1;
}

/* The routed experts' GEMMs and activation on the R rows of the rank's local experts
 * (forward, or backward in reverse order). Under FP8 fc1's input is padded before it and fc2's
 * output unpadded after it (experts_fp8_pad): fc1 and fc2 carry one copy each, each pass. */
static void experts_pass(Emit *e, int l, double R)
{
    const ModelDims *d = e->d;
    const double h = d->h, a = eb(e);
    char n[64];
    if (e->phase == MODEL_BWD) {
        at_layer(e, MODEL_OPR_EXP_FC2, l, n);
        linear_g(e, n, R, h, d->eff_loc, 0, 1, d->experts_loc);
        experts_fp8_pad(e, R);
        at_layer(e, MODEL_OPR_EXP_ACT, l, n);
        simple(e, MODEL_OP_ACTIVATION, n, R * (2.0 * d->eff_out_loc + d->eff_loc) * a);
        at_layer(e, MODEL_OPR_EXP_FC1, l, n);
        linear_g(e, n, R, d->eff_out_loc, h, 0, 1, d->experts_loc);
        experts_fp8_pad(e, R);
        return;
    }
    at_layer(e, MODEL_OPR_EXP_FC1, l, n);
    linear_g(e, n, R, d->eff_out_loc, h, 0, 1, d->experts_loc);
    experts_fp8_pad(e, R);
    at_layer(e, MODEL_OPR_EXP_ACT, l, n);
    simple(e, MODEL_OP_ACTIVATION, n, R * ((double)d->eff_out_loc + d->eff_loc) * a);
    at_layer(e, MODEL_OPR_EXP_FC2, l, n);
    linear_g(e, n, R, h, d->eff_loc, 0, 1, d->experts_loc);
    experts_fp8_pad(e, R);
}

/* The token counts of the rank's experts copied to the host, which sizes the permuted buffers
 * and the grouped GEMM's splits (and the all-to-all's) from them: `bytes` read, one launch, one
 * host sync (Megatron-Core's dispatchers, tokens_per_expert moved to the CPU). */
static void moe_counts(Emit *e, int l, double bytes)
{
    char n[64];
    at_layer(e, MODEL_OPR_DISPATCH, l, n);
    name_join(n, sizeof n, n, "counts");
    simple(e, MODEL_OP_PERMUTE, n, bytes)->host_syncs = 1;
}

/* The all-gather dispatcher (Megatron-Core's MoEAllGatherTokenDispatcher), forward or backward:
 * over the etp x ep ranks (n of them, T tokens each) every token, its scores and its routing
 * map are gathered; each rank permutes out the R rows of its local experts, and after them
 * scales each by its weight and scatter-adds it into a zeroed [n T, h] buffer, which is
 * reduce-scattered back to the tokens' ranks. The backward gathers the output gradient,
 * gathers the R rows' gradients from it, and after the experts scatter-adds them back for the
 * reduce-scatter; the scores' gradient is reduce-scattered too. No all-to-all, no sort: the
 * rows come out of the permutation in expert order. */
static void moe_allgather(Emit *e, int l, int before)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const double T = (double)d->tokens, E = s->model.moe.experts, R = (double)d->routed;
    const double h = d->h, a = eb(e), g = (double)d->ep * d->etp, Tn = g * T;
    const int bwd = e->phase == MODEL_BWD;
    char n[64];
    if (before && !bwd) {
        at_layer(e, MODEL_OPR_DISPATCH, l, n);
        comm(e, n, MODEL_EP_ALL_GATHER, (int)g, Tn * E * 5.0, 1);
        comm(e, n, MODEL_EP_ALL_GATHER, (int)g, Tn * h * a, 1);
        moe_counts(e, l, Tn * d->experts_loc + d->experts_loc * 8.0);
        /* the local map's rows gathered: read and write R rows, their indices */
        simple(e, MODEL_OP_PERMUTE, n, 2.0 * R * h * a + R * 4.0 + Tn * d->experts_loc);
    } else if (!before && !bwd) {
        at_layer(e, MODEL_OPR_COMBINE, l, n);
        /* scale (R rows in and out), zero the [n T, h] buffer, scatter-add the rows into it */
        simple(e, MODEL_OP_PERMUTE, n, 2.0 * R * h * a + Tn * h * a + 2.0 * R * h * a + R * 4.0)
            ->kernels = 3;
        comm(e, n, MODEL_EP_REDUCE_SCATTER, (int)g, Tn * h * a, 1);
        simple(e, MODEL_OP_PERMUTE, n, 3.0 * T * h * a); /* the residual add */
    } else if (before) {
        at_layer(e, MODEL_OPR_COMBINE, l, n);
        comm(e, n, MODEL_EP_ALL_GATHER, (int)g, Tn * h * a, 1);
        /* gather R rows' gradients, then the scale's: the rows' and the weights' gradients */
        simple(e, MODEL_OP_PERMUTE, n, 2.0 * R * h * a + 3.0 * R * h * a + R * 8.0)->kernels = 2;
        comm(e, n, MODEL_EP_REDUCE_SCATTER, (int)g, Tn * E * 4.0, 1);
    } else {
        at_layer(e, MODEL_OPR_DISPATCH, l, n);
        simple(e, MODEL_OP_PERMUTE, n, Tn * h * a + 2.0 * R * h * a + R * 4.0)->kernels = 2;
        comm(e, n, MODEL_EP_REDUCE_SCATTER, (int)g, Tn * h * a, 1);
    }
}

/* A MoE layer's routed experts (forward): the router's logits GEMM, its score function, top-k
 * and auxiliary loss, and the permutation of the T x k copies into expert order; the
 * dispatcher's device-to-host copy of the token counts, which the host waits for; the dispatch
 * all-to-all over ep (each rank's buffer: the rows its experts take, routed / etp), the gather
 * over etp and the sort by local expert; the experts' grouped GEMMs on the routed rows; the
 * sort back, the reduce-scatter over etp and the all-to-all back; each copy scaled by its
 * weight and the k copies of a token summed. */
static void moe_forward(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const ModelMoe *m = &s->model.moe;
    const double T = (double)d->tokens, k = m->topk, E = m->experts, R = (double)d->routed;
    const double h = d->h, a = eb(e), rows = R / d->etp;
    char n[64];
    at_layer(e, MODEL_OPR_ROUTER, l, n);
    linear(e, n, T, E, h, 0);
    router_routing(e, n, T, E, k, m->aux_loss_coeff > 0);
    const int ag = s->job.moe_dispatcher == MODEL_MOE_DISPATCH_ALLGATHER;
    if (!ag)
        simple(e, MODEL_OP_PERMUTE, n, T * h * a + T * k * h * a + T * k * 4.0);
    /* SP: the load-balancing loss counts the copies per expert over the whole micro-batch,
     * its TP shards' counts summed (Megatron-Core's sequence_partition_group) */
    if (s->layout.sp && m->aux_loss_coeff > 0)
        comm(e, n, MODEL_TP_ALLREDUCE, d->t, E * 4.0, 1);
    /* context parallelism: each cp rank routes its part of the sequence, so the counts are
     * summed over cp too (Megatron-Core all-reduces them over tp x cp). parallax all-gathers
     * the cp ranks' E counts and adds them up: for cp 2 the ring moves the all-reduce's bytes,
     * and no comm kind is added for E floats */
    if (d->c > 1 && m->aux_loss_coeff > 0)
        comm(e, n, MODEL_CP_ALL_GATHER, d->c, d->c * E * 4.0, 1);
    if (ag) {
        moe_allgather(e, l, 1);
        experts_pass(e, l, R);
        moe_allgather(e, l, 0);
        return;
    }
    /* the counts per expert (MoEAlltoAllTokenDispatcher's preprocess) */
    moe_counts(e, l, E * 8.0);
    at_layer(e, MODEL_OPR_DISPATCH, l, n);
    /* FP8 dispatch (DeepSeek-V3): the rows quantized once before the all-to-all, one byte an
     * element and the recipe's scales: row-wise ones with their rows, a per-tensor one from
     * each sender to each of its ep peers, and over etp each part with its ep senders' */
    const int q = d->fp8 && s->job.fp8_dispatch;
    const ModelFp8Recipe fr = s->job.fp8;
    const double rows_b = q ? (double)model_fp8_dispatch_bytes(fr, (int64_t)rows, (int64_t)h, d->ep) : rows * h * a;
    const double all_b = q ? (double)model_fp8_dispatch_bytes(fr, (int64_t)R, (int64_t)h, d->ep * d->etp) : R * h * a;
    if (q)
        simple(e, MODEL_OP_PERMUTE, n, T * k * h * (a + 1.0));
    comm(e, n, MODEL_EP_ALL_TO_ALL, d->ep, rows_b, 1);
    comm(e, n, MODEL_ETP_ALL_GATHER, d->etp, all_b, 1);
    moe_sort(e, l, R);
    experts_pass(e, l, R);
    moe_sort(e, l, R);
    at_layer(e, MODEL_OPR_COMBINE, l, n);
    comm(e, n, MODEL_ETP_REDUCE_SCATTER, d->etp, R * h * a, 1);
    comm(e, n, MODEL_EP_ALL_TO_ALL, d->ep, rows * h * a, 1);
    /* un-permute (Megatron-Core's unpermute): each copy scaled by its weight (read and write
     * the T x k rows), then scatter-added into its token (read the rows and the weights, write
     * the sum, add the residual): two kernels */
    simple(e, MODEL_OP_PERMUTE, n, 2.0 * T * k * h * a + T * k * h * a + T * k * 4.0 + 3.0 * T * h * a)
        ->kernels = 2;
}

/* Context parallelism's exchange for the attention core, per comm type (docs/time.md,
 * "Context parallelism"); KVb is the rank's own keys and values, b x s/cp x kv2_loc.
 * allgather: the whole sequence's K, V gathered before the core, their gradients
 * reduce-scattered after its backward. p2p (ring attention, Megatron's default): K, V go round
 * the ring in cp - 1 steps of KVb each, one step under each block of the core; the backward
 * sends them round again and passes dK, dV along with them, cp steps back to their owner.
 * a2a (DeepSpeed-Ulysses): Q, K, V turned from the sequence split to a head split before the
 * core and the output back after it, each all-to-all sized by the rank's buffer as the
 * experts' are; with the fused core the backward moves the saved output to the head split
 * beside its gradient (Transformer Engine's AttnFuncWithCPAndQKVOA2A). `before` says which
 * side of the core the ops emitted now sit on. */
static double cp_kv_bytes(const Emit *e)
{
    const ModelDims *d = e->d;
    return (double)d->b * d->s_loc * (double)d->kv2_loc * eb(e);
}

/* allgather's K, V gather: every rank's KVb in the act dtype, or with FP8 attention's fused
 * core (model_fp8_attn_qkv) their one-byte codes, as Transformer Engine's
 * AttnFuncWithCPAndKVAllGather gathers the FP8 data of K and V (context_parallel.py), each
 * rank's with the 4-byte fp32 decode factor it quantized them with (docs/fp8.md, "The
 * executor": parallax's ranks keep their own scales) */
/* (MXFP8 attention with cp, model_fp8_attn_cp16, moves the act dtype on every kind, as TE's
 * three functions do under fp8_recipe.mxfp8(): model_fp8_attn_codes 0) */
static double cp_gather_bytes(const Emit *e)
{
    const ModelDims *d = e->d;
    const double kv = (double)d->b * d->s * (double)d->kv2_loc;
    return model_fp8_attn_codes(e->s) ? kv + d->c * 4.0 : kv * eb(e);
}

/* A ring message of K, V: KVb, or with FP8 attention's fused core their one-byte codes and the
 * 4-byte decode factor of the rank that quantized them, as Transformer Engine's
 * AttnFuncWithCPAndKVP2P passes the FP8 data of K and V (context_parallel.py) */
static double cp_ring_bytes(const Emit *e)
{
    const ModelDims *d = e->d;
    return model_fp8_attn_codes(e->s) ? (double)d->b * d->s_loc * d->kv2_loc + 4.0
                                       : cp_kv_bytes(e);
}

/* One of Ulysses' all-to-alls of a rank's `elems` elements: in the act dtype, or (fp8) their
 * one-byte codes with the sender's 4-byte decode factor to each of the cp ranks. With FP8
 * attention (the fused core) Transformer Engine's AttnFuncWithCPAndQKVOA2A moves Q, K, V and
 * dO in FP8, and the output and dQ, dK, dV too under delayed scaling (context_parallel.py;
 * docs/fp8.md, "FP8 attention with context parallelism") */
static double cp_a2a_bytes(const Emit *e, double elems, int fp8)
{
    return fp8 ? elems + 4.0 * e->d->c : elems * eb(e);
}

/* PyTorch's context_parallel sends dK, dV in fp32 (_templated_ring_attention_backward:
 * "accum_dtype = torch.float32 if _cp_options.convert_to_f32", grad_key and grad_value
 * zeros_like(..., dtype=accum_dtype), their torch.cat handed to an _AllToAllRotater whatever
 * the K, V rotater), cp calls: one after every step, the last the sum's return home */
static double torch_dkv_bytes(const Emit *e)
{
    const ModelDims *d = e->d;
    return (double)d->b * d->s_loc * (double)d->kv2_loc * 4.0;
}

static void cp_forward(Emit *e, const char *n, int before)
{
    const ModelDims *d = e->d;
    const double M = (double)d->b * d->s_loc;
    switch (e->s->layout.cp_comm) {
    case MODEL_CP_COMM_ALLGATHER:
        if (before)
            comm(e, n, MODEL_CP_ALL_GATHER, d->c, cp_gather_bytes(e), 1);
        break;
    case MODEL_CP_COMM_A2A:
        comm(e, n, MODEL_CP_ALL_TO_ALL, d->c,
             before ? cp_a2a_bytes(e, M * (d->q_loc + (double)d->kv2_loc),
                                   model_fp8_attn_codes(e->s))
                    : cp_a2a_bytes(e, M * d->o_loc, model_fp8_attn_out(e->s)),
             1);
        break;
    default:
        if (before)
            comm(e, n, MODEL_CP_P2P, d->c, cp_ring_bytes(e), d->c - 1);
        break;
    }
}

/* The backward's: `before` the core's backward (the output gradient's side) or after it. */
static void cp_backward(Emit *e, const char *n, int before)
{
    const ModelDims *d = e->d;
    const double a = eb(e), M = (double)d->b * d->s_loc;
    const double kv_full = (double)d->b * d->s * (double)d->kv2_loc * a;
    switch (e->s->layout.cp_comm) {
    case MODEL_CP_COMM_ALLGATHER:
        if (!before && d->cp_torch) { /* PyTorch's dK, dV ride its all-to-all rotater */
            comm(e, n, MODEL_CP_P2P, d->c, torch_dkv_bytes(e), d->c);
            break;
        }
        /* the gradients in the act dtype: TE reduce-scatters dK, dV in the nominal dtype */
        comm(e, n, before ? MODEL_CP_ALL_GATHER : MODEL_CP_REDUCE_SCATTER, d->c,
             before ? cp_gather_bytes(e) : kv_full, 1);
        break;
    case MODEL_CP_COMM_A2A:
        /* the fused core's backward reads the output, saved in the sequence split only
         * (attn.proj.in): it goes to the head split beside its gradient, a call of its own */
        if (before && model_fp8_attn_out(e->s)) {
            /* delayed scaling: dO in its codes alone; the core saved its output in the head
             * split, in FP8 (TE's AttnFuncWithCPAndQKVOA2A saves out_part, its FP8 output
             * before the all-to-all, and moves no output in the backward) */
            comm(e, n, MODEL_CP_ALL_TO_ALL, d->c, cp_a2a_bytes(e, M * d->o_loc, 1), 1);
        } else if (before && model_fp8_attn_codes(e->s)) {
            /* dO in its codes, the saved output as the forward moved it: two calls of
             * unequal size, priced as two of their mean (the same time under alpha-beta) */
            const double go = cp_a2a_bytes(e, M * d->o_loc, 1);
            const double o = cp_a2a_bytes(e, M * d->o_loc, 0);
            comm(e, n, MODEL_CP_ALL_TO_ALL, d->c, 0.5 * (go + o), 2);
        } else if (before)
            comm(e, n, MODEL_CP_ALL_TO_ALL, d->c, M * d->o_loc * a, e->s->job.flash_attn ? 2 : 1);
        else
            comm(e, n, MODEL_CP_ALL_TO_ALL, d->c,
                 cp_a2a_bytes(e, M * (d->q_loc + (double)d->kv2_loc), model_fp8_attn_dqkv(e->s)), 1);
        break;
    default:
        if (before)
            break;
        if (model_fp8_attn_codes(e->s)) {
            /* K, V's codes cp - 1 times, then every block's dK, dV home in one all-to-all:
             * codes under delayed scaling (TE's), the act dtype under current scaling */
            comm(e, n, MODEL_CP_P2P, d->c, cp_ring_bytes(e), d->c - 1);
            const double kv = (double)d->b * d->s_loc * d->kv2_loc;
            comm(e, n, MODEL_CP_ALL_TO_ALL, d->c,
                 d->c * (model_fp8_attn_dqkv(e->s) ? kv + 4.0 : kv * eb(e)), 1);
        } else if (d->cp_torch) {
            /* PyTorch's: K, V cp - 1 times (KVb), its fp32 dK, dV cp times (2 KVb in bf16),
             * priced as 2 cp - 1 calls of their mean (the same time under alpha-beta) */
            const double kv = cp_kv_bytes(e);
            comm(e, n, MODEL_CP_P2P, d->c,
                 ((d->c - 1) * kv + d->c * torch_dkv_bytes(e)) / (2 * d->c - 1), 2 * d->c - 1);
        } else /* K, V cp - 1 times and dK, dV cp times, KVb a call */
            comm(e, n, MODEL_CP_P2P, d->c, cp_kv_bytes(e), 2 * d->c - 1);
        break;
    }
}

/* Transformer Engine's bookkeeping around its ring: AttnFuncWithCPAndKVP2P in v2.2's
 * transformer_engine/pytorch/attention.py (2025-04-07; v2.3's context_parallel.py makes the
 * same passes, the current snapshot's too but with the log-sum-exp kept in fp32 and dK, dV
 * added apart), in Megatron-Core's sbhd layout (TEDotProductAttention's qkv_format), causal,
 * 16-bit attention: the memory passes around the per-step kernels, each a kernel (the merges are
 * @jit_fuser functions, torch.compile'd into one: pytorch/jit.py). Per layer and micro-batch at
 * cp rank r, with K the rank's K, V (KVb), O its output (act dtype) and l the elements of its
 * log-sum-exp (b x heads x s/cp, fp32, fp64 while merged). Step j's K, V are rank r - j's:
 * steps 1..r see their first half ("lower-triangle"), steps r + 1..cp - 1 see all of them
 * from the second half of the queries ("upper-triangle", half an output). In sbhd the halves
 * are the leading dim, so the .contiguous() of a half (lines 991, 1132 forward, 1918, 2045
 * backward) copies nothing. Forward: K, V concatenated into the ring's buffer (2K, line 796);
 * step 0's log-sum-exp cloned and widened to fp64 (8l + 12l, line 1374), each later step's
 * merged into it whole (20l, line 1378) or into its second half (10l, line 1390), narrowed back
 * (12l, line 1404); then the outputs merged by it: step 0's scaled (2O + 8l,
 * flash_attn_fwd_out_correction_init, line 1409), each whole one added (3O + 8l, line 1417),
 * each half one added into the second half (1.5O + 4l, line 1436). */
static void te_ring_fwd(int cp, int r, double K, double O, double l, double *bytes, int *kernels)
{
    double b = 2.0 * K + 20.0 * l + 12.0 * l + 2.0 * O + 8.0 * l;
    for (int j = 1; j < cp; j++)
        b += j <= r ? 20.0 * l + 3.0 * O + 8.0 * l : 10.0 * l + 1.5 * O + 4.0 * l;
    *bytes = b;
    *kernels = 5 + 2 * (cp - 1);
}

/* The backward (line 1557 on), with Q the rank's queries: the second half of the log-sum-exp
 * made contiguous where r < cp - 1 (4l, line 1612), the saved K, V copied into the ring's
 * buffer (2K, line 1684), and each step i (its K, V rank r + i + 1's; t = cp - r - 1 the first
 * step on or below the diagonal) puts its dQ into the rank's (lines 2255-2300: added whole,
 * 3Q, after t; at t half copied and half added, 2.5Q in two kernels, or copied, 2Q, at
 * r = cp - 1; before t half a dQ into the second half, added 1.5Q or at i = 0 copied Q) and
 * its dK, dV into the buffer that rides the ring on (lines 2349-2392, dK and dV one view,
 * _combine_tensors: the diagonal step i = cp - 1 added whole, 3K, or at r = 0 half added and
 * half copied, 2.5K in two kernels; from t on a half one added into the first half, 1.5K, or
 * copied, K, at i = 0, r = cp - 1; before t a whole one added, 3K, or copied, 2K, at i = 0). */
static void te_ring_bwd(int cp, int r, double K, double Q, double l, double *bytes, int *kernels)
{
    const int t = cp - r - 1;
    double b = 2.0 * K + (r < cp - 1 ? 4.0 * l : 0.0);
    int k = 1 + (r < cp - 1);
    for (int i = 0; i < cp; i++) {
        if (i > t) { /* dQ */
            b += 3.0 * Q;
        } else if (i == t) {
            b += r == cp - 1 ? 2.0 * Q : 2.5 * Q;
            k += r < cp - 1;
        } else {
            b += i > 0 ? 1.5 * Q : Q;
        }
        if (i == cp - 1) { /* dK, dV */
            b += r == 0 ? 2.5 * K : 3.0 * K;
            k += r == 0;
        } else if (i >= t) {
            b += i == 0 && r == cp - 1 ? K : 1.5 * K;
        } else {
            b += i > 0 ? 3.0 * K : 2.0 * K;
        }
        k += 2;
    }
    *bytes = b;
    *kernels = k;
}

/* The all-gather (AttnFuncWithCPAndKVAllGather, v2.2's attention.py line 2515 on): every rank
 * alike, two steps (its two query chunks against the keys up to each). Forward: the gathered
 * K and V put in sequence order by torch.index_select (2 cp K in two kernels, lines
 * 2615-2616), each step's half output copied into the rank's (O in two, lines 2721-2723).
 * Backward: the full-length dK, dV zeroed (cp K, lines 2785-2786), the gather put in order again
 * (2 cp K, lines 2804-2805), each step's half dQ copied into the rank's (Q, lines 2914-2916),
 * each step's dK, dV added into their range of the zeroed ones ((cp + 1/2) K tokens' worth
 * read twice and written once, 3 (2 cp + 1)/2 K in four kernels, lines 2929-2930; the steps see
 * (r + 1) and (2 cp - r) half chunks), and the sum put back in rank order (2 cp K, lines
 * 2940-2941). The .contiguous() of K, V and of each step's halves (lines 2605, 2639, 2661,
 * 2847, 2919, 2949) copy nothing in sbhd, the sequence being the leading dim. */
static void te_gather(int cp, int backward, double K, double Q, double O, double *bytes,
                      int *kernels)
{
    *bytes = backward ? (5.0 * cp + 1.5 * (2.0 * cp + 1.0)) * K + Q : 2.0 * cp * K + O;
    *kernels = backward ? 12 : 4;
}

/* PyTorch's context_parallel ring (torch/distributed/tensor/experimental/_attention.py at
 * pytorch/pytorch 0123248a, the statements quoted), as torchtitan runs it: eager kernels in the
 * SDPA layout (b, heads, s, d), causal with round-robin load balance (_cp_options defaults:
 * convert_to_f32, enable_load_balance). Per layer and micro-batch at cp rank r, K the rank's K, V
 * (KVb), O its output (act dtype, 2O in fp32), l the elements of its log-sum-exp (fp32). Step
 * i's K, V are rank r - i's: steps 1..r see their first half (a whole merge), steps r + 1..cp - 1
 * all of them from the second query half (a partial one). Forward (_templated_ring_attention):
 * K and V made contiguous ("key = key.contiguous()": torchtitan hands SDPA a transpose(1, 2)
 * of its (b, s, heads, d) tensors, so 2K in two kernels); "torch.cat([key.flatten(),
 * value.flatten()])" before each of the cp - 1 sends, whatever the rotater (2K each); each
 * step's output widened to fp32 (_SDPAMerger.step, "out.to(torch.float32)": 3O, or 1.5O half;
 * the log-sum-exp is fp32 already); each later step merged (_merge_one): "out - F.sigmoid(
 * block_lse - lse) * (out - block_out)" five kernels, 16O + 24l, and "lse - F.logsigmoid(lse -
 * block_lse)" three, 32l (half as much on a partial step, which _partial_update then
 * concatenates back whole: "torch.cat(chunks, dim=dim)", 4O + 8l in two); the result narrowed
 * (results, "out.to(self._out_dtype)": 3O). */
static void torch_ring_fwd(int cp, int r, double K, double O, double l, double *bytes,
                           int *kernels)
{
    double b = 2.0 * K + (cp - 1) * 2.0 * K + 3.0 * O + 3.0 * O;
    int k = 2 + (cp - 1) + 1 + 1;
    for (int i = 1; i < cp; i++) {
        if (i <= r) { /* widened, merged whole */
            b += 3.0 * O + 16.0 * O + 56.0 * l;
            k += 1 + 8;
        } else { /* half widened, merged, concatenated back */
            b += 1.5 * O + 8.0 * O + 28.0 * l + 4.0 * O + 8.0 * l;
            k += 1 + 8 + 2;
        }
    }
    *bytes = b;
    *kernels = k;
}

/* Its backward (_templated_ring_attention_backward), Q the rank's queries: dQ, dK, dV
 * accumulated in fp32 ("accum_dtype = torch.float32", "torch.zeros_like(query,
 * dtype=accum_dtype)" and key's, value's: 2Q + 2K written, three kernels); the saved K, V made
 * contiguous again (2K in two) and concatenated before each of the cp - 1 sends (2K each); where
 * i > r "logsumexp.chunk(2, dim=seq_dim)[1].contiguous()" (4l); each step's bf16 dK, dV added
 * into the fp32 ones ("grad_key += grad_key_": 5K in two kernels) or, for i in 1..r, into their
 * first half by _partial_update, add then torch.cat (2.5K + 4K in four); "torch.cat([grad_key.
 * flatten(), grad_value.flatten()])" in fp32 every step for the all-to-all rotater (4K each);
 * dQ added whole ("grad_query += grad_query_": 5Q, i <= r) or into its second half by
 * _partial_update (2.5Q + 4Q in two); at the end "grad_query.to(query.dtype)" and the returned
 * dK, dV ".to(key.dtype)" (3Q + 3K in two). */
static void torch_ring_bwd(int cp, int r, double K, double Q, double l, double *bytes,
                           int *kernels)
{
    double b = 2.0 * Q + 2.0 * K + 2.0 * K + (cp - 1) * 2.0 * K + cp * 4.0 * K;
    b += 3.0 * Q + 3.0 * K;
    int k = 3 + 2 + (cp - 1) + cp + 2;
    for (int i = 0; i < cp; i++) {
        if (i > r) {
            b += 4.0 * l + 5.0 * K + 6.5 * Q;
            k += 1 + 2 + 2;
        } else if (i > 0) {
            b += 6.5 * K + 5.0 * Q;
            k += 4 + 1;
        } else {
            b += 5.0 * K + 5.0 * Q;
            k += 2 + 1;
        }
    }
    *bytes = b;
    *kernels = k;
}

/* PyTorch's ring passes at the rank that moves the most in forward and backward together (the
 * last where the queries are at least as wide as K, V: its whole merges and half dK, dV adds
 * move more than the partial ones). */
static void torch_ring(int cp, int backward, double K, double Q, double O, double l,
                       double *bytes, int *kernels)
{
    double best = -1.0;
    for (int r = 0; r < cp; r++) {
        double fb, bb;
        int fk, bk;
        torch_ring_fwd(cp, r, K, O, l, &fb, &fk);
        torch_ring_bwd(cp, r, K, Q, l, &bb, &bk);
        if (fb + bb > best) {
            best = fb + bb;
            *bytes = backward ? bb : fb;
            *kernels = backward ? bk : fk;
        }
    }
}

/* The passes as one memory-bound op, <n>.cp_passes */
static void emit_cp_passes(Emit *e, const char *n, double bytes, int kernels)
{
    char pn[sizeof ((ModelOp *)0)->name];
    name_join(pn, sizeof pn, n, "cp_passes");
    simple(e, MODEL_OP_PERMUTE, pn, bytes)->kernels = kernels;
}

/* Transformer Engine's passes around its context-parallel attention as one op after the core's
 * forward or backward, where the job runs TE's (d->cp_te) with 16-bit attention: the ring's
 * (te_ring_fwd, te_ring_bwd) at the rank that moves the most in the two together (the last cp
 * rank where the queries are wider than K, V, as with grouped-query attention), the
 * all-gather's (te_gather), Ulysses' (AttnFuncWithCPAndQKVOA2A: each tensor its all-to-all
 * moves, X bytes, moved twice more by flash_attn_a2a_communicate, 4X in two kernels: before
 * the core split into cp head groups by movedim().contiguous() (line 418) and the received
 * chunks put in order by reorder_seq_chunks_for_a2a_before_attn's index_select (line 363);
 * after it the reverse, lines 374 and 441). FP8 attention's passes (per-step outputs
 * dequantized to fp32, the dQ, dK, dV buffers of delayed scaling) are not priced. Where the
 * job runs PyTorch's context_parallel instead (d->cp_torch, torchtitan), its ring's passes
 * (torch_ring) whatever the rotater. */
static void cp_passes(Emit *e, const char *n, int backward)
{
    const ModelDims *d = e->d;
    if ((!d->cp_te && !d->cp_torch) || d->c < 2 || e->s->job.fp8_attention)
        return;
    const double a = eb(e), M = (double)d->b * d->s_loc;
    const double K = M * d->kv2_loc * a, Q = M * d->q_loc * a, O = M * d->o_loc * a;
    double bytes = 0.0;
    int kernels = 0;
    if (d->cp_torch) {
        torch_ring(d->c, backward, K, Q, O, M * d->heads_loc, &bytes, &kernels);
        emit_cp_passes(e, n, bytes, kernels);
        return;
    }
    switch (e->s->layout.cp_comm) {
    case MODEL_CP_COMM_ALLGATHER:
        te_gather(d->c, backward, K, Q, O, &bytes, &kernels);
        break;
    case MODEL_CP_COMM_A2A: {
        /* forward: Q, K, V in, O out; backward: dO (and with the fused core O) in, dQ, dK, dV
         * out (cp_forward, cp_backward) */
        const int outs = backward ? (e->s->job.flash_attn ? 2 : 1) : 1;
        bytes = 4.0 * (Q + K + outs * O);
        kernels = 2 * (3 + outs);
        break;
    }
    default: {
        double best = -1.0;
        for (int r = 0; r < d->c; r++) {
            double fb, bb;
            int fk, bk;
            te_ring_fwd(d->c, r, K, O, M * d->heads_loc, &fb, &fk);
            te_ring_bwd(d->c, r, K, Q, M * d->heads_loc, &bb, &bk);
            if (fb + bb > best) {
                best = fb + bb;
                bytes = backward ? bb : fb;
                kernels = backward ? bk : fk;
            }
        }
        break;
    }
    }
    emit_cp_passes(e, n, bytes, kernels);
}

static void layer_forward(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a; /* one norm-region activation */
    const int moe = model_layer_is_moe(&s->model, l);
    char n[64];
    e->layer = l;
    at_layer(e, MODEL_OPR_LN1, l, n);
    norm(e, n, 2.0, nb);
    qkv_forward(e, l);
    at_layer(e, MODEL_OPR_CORE, l, n);
    cp_forward(e, n, 1);
    attention_core(e, n);
    cp_passes(e, n, 0);
    at_layer(e, MODEL_OPR_PROJ, l, n);
    cp_forward(e, n, 0);
    linear_epilogue(e, n, M, h, d->o_loc, nb);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
    at_layer(e, MODEL_OPR_LN2, l, n);
    norm(e, n, 2.0, nb);
    if (!moe) {
        mlp_forward(e, l, d->ffn_out_loc, d->ffn_loc);
        return;
    }
    if (d->sff_loc > 0)
        mlp_forward(e, l, d->sff_out_loc, d->sff_loc);
    moe_forward(e, l);
}

/* Multi-head latent attention's projections under op-level recompute (sac_op_recompute): the
 * rerun ones of q_a, kv_a, q_b, kv_b (with a query latent kv_a and kv_b, the 2nd and 4th of
 * the layer's matmuls; without one q_b, the 2nd), the latents' norms (priced as the forward
 * prices them, within the down-projections) and the rotary embedding of the queries' and the
 * shared key's rotary parts (a read and a write of each, beside kv_b). */
static void sac_op_mla(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const ModelMla *m = &s->model.mla;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double qn = 2.0 * Msp * m->q_lora_rank * a, kn = 2.0 * Msp * m->kv_lora_rank * a;
    const double rope = 2.0 * M * (d->heads_loc + 1.0) * m->qk_rope_dim * a;
    char n[64];
    if (m->q_lora_rank > 0) {
        at_layer(e, MODEL_OPR_Q_A, l, n);
        if (model_sac_op_matmuls(s, d, l, MODEL_OPR_Q_A))
            linear(e, n, Msp, m->q_lora_rank, h, qn);
        else
            simple(e, MODEL_OP_NORM, n, qn);
    }
    at_layer(e, MODEL_OPR_KV_A, l, n);
    if (model_sac_op_matmuls(s, d, l, MODEL_OPR_KV_A))
        linear(e, n, Msp, (double)m->kv_lora_rank + m->qk_rope_dim, h, kn);
    else
        simple(e, MODEL_OP_NORM, n, kn);
    if (model_sac_op_matmuls(s, d, l, MODEL_OPR_Q_B)) {
        at_layer(e, MODEL_OPR_Q_B, l, n);
        linear(e, n, M, d->q_loc, m->q_lora_rank > 0 ? m->q_lora_rank : h, 0);
    }
    at_layer(e, MODEL_OPR_KV_B, l, n);
    if (model_sac_op_matmuls(s, d, l, MODEL_OPR_KV_B))
        linear(e, n, M, (double)d->heads_loc * (m->qk_nope_dim + m->v_dim), m->kv_lora_rank, rope);
    else
        simple(e, MODEL_OP_ACTIVATION, n, rope);
}

/* Under FP8 GEMMs, op-level recompute's quantization of an input of `elems` elements that the
 * table keeps as an FP8 copy and does not save, beside the recomputed op that makes it (op),
 * when no rerun matmul of role `gemm` quantizes it: read in the act dtype, written in FP8
 * (twice with a transposed copy), as linear_fp8's forward cast. The backward's GEMM reads it. */
static void sac_op_requant(Emit *e, ModelOp *op, ModelOpRole gemm, double elems)
{
    if (!model_fp8_op(e->s, gemm) || model_sac_op_matmuls(e->s, e->d, e->layer, gemm))
        return;
    const double cast = elems * (eb(e) + 1.0 + (e->d->fp8_wt ? 1.0 : 0.0)) + fp8_amax_bytes(e, elems);
    op->fp8_cast_bytes += cast;
    op->bytes += cast;
    op->kernels += 1 + (fp8_amax_bytes(e, elems) > 0 ? 2 : 0);
}

/* Under FP8 GEMMs, a rerun attention projection whose input the table saves as an FP8 copy
 * (model_fp8_proj_in: FP8 or both) reads that copy as it is: the input quantize linear_fp8
 * priced (M x K elements) runs no more (the op just emitted). */
static void sac_op_proj_saved(Emit *e, double M, double K)
{
    if (e->rc || !model_fp8_op(e->s, MODEL_OPR_PROJ) ||
        model_fp8_proj_in(e->s) == MODEL_FP8_PROJ_ACT)
        return;
    ModelOp *op = &e->g->op[e->g->count - 1];
    const double cast = M * K * (eb(e) + 1.0 + (e->d->fp8_wt ? 1.0 : 0.0)) + fp8_amax_bytes(e, M * K);
    op->fp8_cast_bytes -= cast;
    op->bytes -= cast;
    op->kernels -= 1 + (fp8_amax_bytes(e, M * K) > 0 ? 2 : 0);
}

/* Op-level selective activation checkpointing (torchtitan's "selective op"; docs/time.md,
 * "Frameworks"): before the layer's backward its checkpointed forward runs again, saving every
 * SDPA output and every other matmul output (the reduce-scatters' too: no collective runs
 * again), so the other matmuls (model_sac_op_matmuls) and all elementwise ops are recomputed.
 * A dense layer reruns wk, wo and w3 (gated) or fc2; an MLA layer with a query latent kv_a,
 * kv_b, and w1 and w2 (gated) or fc1, without one q_b, wo and w3 or fc2. The elementwise ops:
 * the two norms, the two residual adds (read two, write one), the activation, and MLA's
 * latents' norms and rotary embedding. A MoE layer's MLP half is not recomputed. Under FP8
 * GEMMs a rerun matmul runs in FP8 again, quantizing its input (linear_fp8) into the FP8 copy
 * its backward reads, which the table does not save (but wo's saved copy: sac_op_proj_saved);
 * an unsaved FP8 input no rerun quantizes is quantized beside its op (sac_op_requant). */
static void sac_op_recompute(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a;
    const int moe = model_layer_is_moe(&s->model, l), gated = s->model.mlp == MODEL_SWIGLU;
    char n[64];
    const ModelPhase keep = e->phase;
    e->phase = MODEL_RECOMPUTE;
    e->layer = l;
    at_layer(e, MODEL_OPR_LN1, l, n);
    norm(e, n, 2.0, nb);
    if (s->model.mla.kv_lora_rank > 0) {
        sac_op_mla(e, l);
    } else {
        at_layer(e, MODEL_OPR_QKV, l, n);
        linear(e, n, M, d->kv_width_loc, h, 0); /* wk */
    }
    at_layer(e, MODEL_OPR_PROJ, l, n);
    if (model_sac_op_matmuls(s, d, l, MODEL_OPR_PROJ)) {
        linear(e, n, M, h, d->o_loc, 3.0 * nb); /* wo, and the residual add */
        sac_op_proj_saved(e, M, d->o_loc);
    } else
        simple(e, MODEL_OP_ACTIVATION, n, 3.0 * nb);
    at_layer(e, MODEL_OPR_LN2, l, n);
    ModelOp *ln2 = norm(e, n, 2.0, nb);
    if (!moe) {
        const double f_in = d->ffn_loc, f_out = d->ffn_out_loc;
        /* mlp.fc1.in and mlp.fc2.in, not saved: quantized again for fc1's and fc2's backward
         * where no rerun matmul does it (a GELU fc1, a SwiGLU w2 left to the backward) */
        sac_op_requant(e, ln2, MODEL_OPR_FC1, Msp * h);
        at_layer(e, MODEL_OPR_FC1, l, n);
        if (model_sac_op_matmuls(s, d, l, MODEL_OPR_FC1)) /* w1 or w3, or fc1 */
            linear(e, n, M, gated ? f_in : f_out, h, 0);
        at_layer(e, MODEL_OPR_ACT, l, n);
        sac_op_requant(e, simple(e, MODEL_OP_ACTIVATION, n, M * (f_out + f_in) * a), MODEL_OPR_FC2,
                       M * f_in);
        at_layer(e, MODEL_OPR_FC2, l, n);
        if (model_sac_op_matmuls(s, d, l, MODEL_OPR_FC2))
            linear(e, n, M, h, f_in, 3.0 * nb); /* w2 or fc2, and the residual add */
        else
            simple(e, MODEL_OP_ACTIVATION, n, 3.0 * nb); /* the residual add */
    }
    e->phase = keep;
}

/* The data-parallel collective `kind` for block b: over the expert-data-parallel group for a
 * MoE layer's experts, else over dp x cp. */
static ModelComm block_kind(const ModelTensorTable *tt, int b, ModelComm kind)
{
    if (!tt->blocks[b].experts)
        return kind;
    return kind == MODEL_DP_ALLREDUCE        ? MODEL_EDP_ALLREDUCE
           : kind == MODEL_DP_REDUCE_SCATTER ? MODEL_EDP_REDUCE_SCATTER
                                             : MODEL_EDP_ALL_GATHER;
}

/* The ranks that share block b's ZeRO state and reduce its gradients. */
static int block_group(const ModelDims *d, const ModelTensorTable *tt, int b)
{
    return tt->blocks[b].experts ? d->edp : d->zero_group;
}

/* Bytes of block b's parameters gathered over `group` ranks (padded to a multiple of it): the
 * weights' dtype, one byte for the FP8 GEMMs' weights kept in FP8 (--fp8-param-gather; their
 * scales are not counted), a byte a copy for MXFP8's under ZeRO-3 (`copies`:
 * model_fp8_mx_gather_copies; Megatron-FSDP gathers the row-wise copy's bytes before a
 * forward and the column-wise one's before a backward, the scales never: every rank computes
 * them). MXFP8's below ZeRO-3 travel in the weights' dtype: an E8M0 scale
 * a block of 32 along each copy's own axis, no rank can quantize its flat shard into the
 * whole weight's copies, so Megatron-LM's distributed optimizer gathers the updated weights
 * in bf16 (into the gradient buffer: param_and_grad_buffer.py's shared_buffer) and each rank
 * quantizes them (_post_param_sync; exec/train/fp8gather.c's mx_matrix). */
static double block_param_bytes(const ModelSpec *s, const ModelDims *d, const ModelBlock *b,
                                int group, int copies)
{
    const double pe = (double)px_dtype_bytes(d->param);
    const double padded = (double)px_round_up(b->numel, (uint64_t)group);
    if (!d->fp8 || !s->job.fp8_param_gather ||
        (s->job.fp8 == MODEL_FP8_MXFP8 && s->layout.zero < 3))
        return padded * pe;
    return (padded - (double)b->fp8_numel) * pe + (double)b->fp8_numel * (copies > 1 ? copies : 1);
}

/* A block's ZeRO collective of `numel` elements over `group` ranks in `elem` bytes each, in
 * buckets of at most layout.bucket_bytes (docs/time.md, "Sharded data parallelism"): calls =
 * ceil(bytes / bucket_bytes) of equal size, each rank's shard split evenly among them (the
 * last call padded like the block's flat buffer is padded to the group). One call of the whole
 * padded block without buckets. */
static void zero_comm(Emit *e, ModelOpRole r, const ModelTensorTable *tt, int block, ModelComm kind,
                      int group, double elem)
{
    const uint64_t shard = px_round_up(tt->blocks[block].numel, (uint64_t)group) / (uint64_t)group;
    const double total = (double)shard * group * elem, bucket = e->s->layout.bucket_bytes;
    int calls = 1;
    if (bucket > 0 && total > bucket) {
        const double c = ceil(total / bucket);
        calls = c < (double)shard ? (int)c : (int)shard; /* at least one element a call */
    }
    const uint64_t per = (shard + (uint64_t)calls - 1) / (uint64_t)calls;
    block_comm(e, r, tt, block, kind, group, round((double)per * group * elem), calls);
}

/* ZeRO-3's gather of block b in FP8 (--fp8-param-gather): `bytes` on the wire
 * (block_param_bytes: each rank's shard is its other elements in the act dtype and its FP8
 * ones in a byte, so the ranks' parts differ in bytes). In buckets the calls cut that wire
 * image of the whole block (the ranks' parts one after another) into ceil(bytes /
 * bucket_bytes) calls of equal bytes, the last padded with zeros (exec/train/fp8gather.c's
 * issue_buckets): each call at most bucket_bytes, and calls x ceil(bytes / calls) in all. */
static void zero_gather_fp8(Emit *e, const ModelTensorTable *tt, int block, ModelComm kind,
                            int group, double bytes)
{
    const double bucket = e->s->layout.bucket_bytes;
    const double shard = (double)(px_round_up(tt->blocks[block].numel, (uint64_t)group) /
                                  (uint64_t)group);
    int calls = 1;
    if (bucket > 0 && bytes > bucket) {
        const double c = ceil(bytes / bucket);
        calls = c < shard ? (int)c : (int)shard;
    }
    block_comm(e, MODEL_OPR_BLOCK_PARAMS, tt, block, kind, group, ceil(bytes / calls), calls);
}

/* ZeRO-3's gather of block b's parameters before a pass that reads them (`phase`: the
 * forward, the backward, or DeepSpeed's recomputed forward); none per micro-batch under a
 * pipeline, where a stage gathers once per step (step_param_gathers). With
 * --fp8-param-gather the FP8 GEMMs' weights travel in one byte. */
static void zero_gather(Emit *e, const ModelTensorTable *tt, int block, ModelPhase phase)
{
    const ModelDims *d = e->d;
    if (e->s->layout.zero != 3 || d->zero_per_step)
        return;
    const ModelPhase keep = e->phase;
    const ModelOpRole keep_role = e->role;
    e->phase = phase;
    const int grp = block_group(d, tt, block);
    const double padded = (double)px_round_up(tt->blocks[block].numel, (uint64_t)grp);
    const ModelComm kind = block_kind(tt, block, MODEL_DP_ALL_GATHER);
    const double bytes = block_param_bytes(e->s, d, &tt->blocks[block], grp,
                                           model_fp8_mx_gather_copies(e->s, d, phase));
    if (d->fp8 && e->s->job.fp8_param_gather)
        zero_gather_fp8(e, tt, block, kind, grp, bytes);
    else
        zero_comm(e, MODEL_OPR_BLOCK_PARAMS, tt, block, kind, grp, bytes / padded);
    e->phase = keep;
    e->role = keep_role;
}

/* The backward's gather of a block outside the layers (embedding, output layer): none when the
 * forward's gathered parameters are kept. */
static void zero_gather_bwd(Emit *e, const ModelTensorTable *tt, int block)
{
    if (!e->s->layout.keep_gathered)
        zero_gather(e, tt, block, MODEL_BWD);
}

static void zero_reduce(Emit *e, const ModelTensorTable *tt, int block)
{
    const ModelDims *d = e->d;
    if (e->s->layout.zero < 2 || d->zero_per_step)
        return;
    zero_comm(e, MODEL_OPR_BLOCK_GRADS, tt, block, block_kind(tt, block, MODEL_DP_REDUCE_SCATTER),
              block_group(d, tt, block), (double)px_dtype_bytes(d->grad));
}

/* Parameters of layer l beyond its norms that TP ranks hold whole while each computes on its
 * sequence shard: the router (and shared-expert gate), MLA's down-projections and their norms.
 * Their gradients are partial sums over TP like the norms' (Megatron-Core marks them
 * sequence_parallel). */
static double sp_replicated(const ModelSpec *s, int l)
{
    const ModelConfig *c = &s->model;
    double n = 0;
    if (l >= 0 && model_layer_is_moe(c, l))
        n += (double)c->moe.experts * c->hidden + (c->moe.router_bias ? c->moe.experts : 0) +
             (c->moe.shared_gate && c->moe.shared_ffn > 0 ? c->hidden : 0);
    if (l >= 0 && c->qk_norm)
        n += 2.0 * c->head_dim;
    const ModelMla *m = &c->mla;
    if (l >= 0 && m->kv_lora_rank > 0)
        n += (double)m->q_lora_rank * c->hidden + m->q_lora_rank +
             ((double)m->kv_lora_rank + m->qk_rope_dim) * c->hidden + m->kv_lora_rank;
    return n;
}

/* Sequence parallelism leaves the norms' parameters replicated over TP while each rank sees
 * only its sequence shard, so their gradients are partial sums: Megatron-LM all-reduces them
 * over TP (allreduce_layernorm_grads; Korthikanti et al. 2022 Sec. 4.2.2). One call per norm
 * of the block (a layer's two, the final norm's one), before the block's data-parallel
 * reduction: per step with ZeRO 0/1, per micro-batch with ZeRO 2/3, which reduce gradients
 * every micro-batch. The row-parallel biases need none: their gradients come from the
 * gathered, full-sequence output gradients. */
static void sp_norm_grads(Emit *e, const ModelTensorTable *tt, int block, int norms)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    if (!s->layout.sp || d->t < 2 || block < 0 || norms < 1)
        return;
    const int norm_bias = s->model.norm == MODEL_LAYERNORM && s->model.bias;
    const double ge = (double)px_dtype_bytes(d->grad), per = (double)d->h * (1 + norm_bias);
    const double extra = sp_replicated(s, tt->blocks[block].layer);
    /* a prediction module's enorm, hnorm and final norm have weights only (tensors.c) */
    const int mtp = tt->blocks[block].layer >= s->model.layers && norms > 3;
    if (extra > 0) /* one call over the norms' and the other replicated parameters' gradients */
        block_comm(e, MODEL_OPR_BLOCK_SP_GRADS, tt, block, MODEL_TP_ALLREDUCE, d->t,
                   (per * norms - (mtp ? 3.0 * d->h * norm_bias : 0) + extra) * ge, 1);
    else if (mtp) {
        block_comm(e, MODEL_OPR_BLOCK_SP_GRADS, tt, block, MODEL_TP_ALLREDUCE, d->t, per * ge,
                   norms - 3);
        block_comm(e, MODEL_OPR_BLOCK_SP_GRADS, tt, block, MODEL_TP_ALLREDUCE, d->t,
                   (double)d->h * ge, 3);
    } else
        block_comm(e, MODEL_OPR_BLOCK_SP_GRADS, tt, block, MODEL_TP_ALLREDUCE, d->t, per * ge, norms);
}

/* The MLP's backward (widths as mlp_forward). */
static void mlp_backward(Emit *e, int l, double f_out, double f_in)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a;
    char n[64];
    at_layer(e, MODEL_OPR_FC2, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, h, f_in, 2.0 * nb);
    at_layer(e, MODEL_OPR_ACT, l, n);
    simple(e, MODEL_OP_ACTIVATION, n, M * (2.0 * f_out + f_in) * a);
    at_layer(e, MODEL_OPR_FC1, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, f_out, h, 0);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
}

/* The routed experts' backward, moe_forward in reverse: the combine's gradient (to each copy's
 * output and to its weight: the scatter-add's gradient gathers the token's gradient to its k
 * copies, the scaling's reads the saved outputs) sent back to the experts and sorted by
 * expert, their GEMMs' gradients, sorted back, the dispatch's gradient returned to the tokens'
 * ranks and summed per token, the router's score function, top-k and auxiliary loss
 * gradients, its GEMM's. No host sync: the backward reuses the forward's counts. */
static void moe_backward(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const ModelMoe *m = &s->model.moe;
    const double T = (double)d->tokens, k = m->topk, E = m->experts, R = (double)d->routed;
    const double h = d->h, a = eb(e), rows = R / d->etp;
    char n[64];
    if (s->job.moe_dispatcher == MODEL_MOE_DISPATCH_ALLGATHER) {
        moe_allgather(e, l, 1);
        experts_pass(e, l, R);
        moe_allgather(e, l, 0);
        at_layer(e, MODEL_OPR_ROUTER, l, n);
        router_routing(e, n, T, E, k, m->aux_loss_coeff > 0);
        linear(e, n, T, E, h, 0);
        return;
    }
    at_layer(e, MODEL_OPR_COMBINE, l, n);
    /* gather: read the output gradient, write each copy's; scale: read those and the saved
     * outputs, write the copies' gradients and the weights' */
    simple(e, MODEL_OP_PERMUTE, n, T * h * a + 2.0 * T * k * h * a + 2.0 * T * k * h * a + T * k * 8.0)
        ->kernels = 2;
    comm(e, n, MODEL_EP_ALL_TO_ALL, d->ep, rows * h * a, 1);
    comm(e, n, MODEL_ETP_ALL_GATHER, d->etp, R * h * a, 1);
    moe_sort(e, l, R);
    experts_pass(e, l, R);
    moe_sort(e, l, R);
    at_layer(e, MODEL_OPR_DISPATCH, l, n);
    comm(e, n, MODEL_ETP_REDUCE_SCATTER, d->etp, R * h * a, 1);
    comm(e, n, MODEL_EP_ALL_TO_ALL, d->ep, rows * h * a, 1);
    at_layer(e, MODEL_OPR_ROUTER, l, n);
    /* un-permute: each token's k copy gradients summed into its input gradient */
    simple(e, MODEL_OP_PERMUTE, n, T * k * h * a + 2.0 * T * h * a + T * k * 4.0);
    router_routing(e, n, T, E, k, m->aux_loss_coeff > 0);
    linear(e, n, T, E, h, 0);
}

/* MLA's projections' backward (qkv_forward in reverse); the latents' gradients, partial over
 * the heads' TP ranks, reduce-scattered back to the sequence shards (or all-reduced). */
static void qkv_backward(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const ModelMla *m = &s->model.mla;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    char n[64];
    if (m->kv_lora_rank <= 0) {
        at_layer(e, MODEL_OPR_QKV, l, n);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        double rope = 0;
        int rope_k = 0;
        qkv_rope_eager(e, M, &rope, &rope_k);
        linear_k(e, n, M, d->q_loc + (double)d->kv2_loc, h, rope, rope_k);
        comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
        return;
    }
    const ModelComm back = sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE;
    const double q_in = m->q_lora_rank > 0 ? m->q_lora_rank : h;
    at_layer(e, MODEL_OPR_KV_B, l, n);
    linear(e, n, M, (double)d->heads_loc * (m->qk_nope_dim + m->v_dim), m->kv_lora_rank, 0);
    at_layer(e, MODEL_OPR_Q_B, l, n);
    /* queries projected from the layer's input itself (q_lora_rank 0): under SP their weight
     * gradient gathers the input again, as a column-parallel layer's */
    if (sp && m->q_lora_rank <= 0)
        comm(e, n, MODEL_TP_ALL_GATHER, t, M * h * a, 1);
    linear(e, n, M, d->q_loc, q_in, 0);
    comm(e, n, back, t, M * q_in * a, 1);
    at_layer(e, MODEL_OPR_KV_A, l, n);
    comm(e, n, back, t, M * (m->kv_lora_rank + m->qk_rope_dim) * a, 1);
    linear(e, n, Msp, (double)m->kv_lora_rank + m->qk_rope_dim, h, 3.0 * Msp * m->kv_lora_rank * a);
    if (m->q_lora_rank > 0) {
        at_layer(e, MODEL_OPR_Q_A, l, n);
        linear(e, n, Msp, m->q_lora_rank, h, 3.0 * Msp * m->q_lora_rank * a);
    }
}

/* A layer's backward; block is its table block, xblock its experts' (-1: a dense layer). */
static void layer_backward(Emit *e, const ModelTensorTable *tt, int block, int xblock, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a;
    const int moe = model_layer_is_moe(&s->model, l);
    char n[64];
    e->layer = l;
    /* ZeRO-3's gathers (docs/time.md, "Sharded data parallelism"): none with the forward's
     * parameters kept; with full recompute FSDP's one gather serves the recomputed forward and
     * the backward, while DeepSpeed's ZeRO-3 frees the parameters after the recomputed forward
     * too and gathers before each */
    const int full = s->layout.recompute == MODEL_RECOMPUTE_FULL, keep = s->layout.keep_gathered;
    const int twice = full && !s->layout.fsdp;
    if (!keep) {
        zero_gather(e, tt, block, twice ? MODEL_RECOMPUTE : MODEL_BWD);
        if (xblock >= 0)
            zero_gather(e, tt, xblock, twice ? MODEL_RECOMPUTE : MODEL_BWD);
    }
    if (full) {
        e->phase = MODEL_RECOMPUTE;
        layer_forward(e, l);
        e->phase = MODEL_BWD;
    }
    if (d->recompute_op)
        sac_op_recompute(e, l);
    e->layer = l;
    if (twice && !keep) {
        zero_gather(e, tt, block, MODEL_BWD);
        if (xblock >= 0)
            zero_gather(e, tt, xblock, MODEL_BWD);
    }
    e->layer = l;
    if (!moe) {
        mlp_backward(e, l, d->ffn_out_loc, d->ffn_loc);
    } else {
        moe_backward(e, l);
        if (d->sff_loc > 0)
            mlp_backward(e, l, d->sff_out_loc, d->sff_loc);
    }
    at_layer(e, MODEL_OPR_LN2, l, n);
    norm(e, n, 4.0, nb);
    at_layer(e, MODEL_OPR_PROJ, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, h, d->o_loc, 2.0 * nb);
    if (s->layout.cp_comm == MODEL_CP_COMM_A2A)
        cp_backward(e, n, 1);
    at_layer(e, MODEL_OPR_CORE, l, n);
    if (s->layout.cp_comm == MODEL_CP_COMM_ALLGATHER)
        cp_backward(e, n, 1);
    if (s->layout.recompute == MODEL_RECOMPUTE_SELECTIVE && !s->job.flash_attn) {
        e->phase = MODEL_RECOMPUTE;
        attention_core(e, n);
        e->phase = MODEL_BWD;
    }
    attention_core(e, n);
    cp_backward(e, n, 0);
    cp_passes(e, n, 1);
    qkv_backward(e, l);
    at_layer(e, MODEL_OPR_LN1, l, n);
    norm(e, n, 5.0, nb); /* + the residual gradient */
    if (s->layout.zero >= 2 && !d->zero_per_step)
        sp_norm_grads(e, tt, block, block_norms(s, &tt->blocks[block]));
    zero_reduce(e, tt, block);
    if (xblock >= 0)
        zero_reduce(e, tt, xblock);
}

static int block_index(const ModelTensorTable *tt, const char *name, int layer, int chunk)
{
    for (int i = 0; i < tt->n_blocks; i++) {
        const ModelBlock *b = &tt->blocks[i];
        if (b->chunk == chunk && b->layer == layer && strcmp(b->name, name) == 0)
            return i;
    }
    return -1;
}

/* Block of layer l on local chunk j: the layer's, or (experts) its routed experts'. */
static int layer_block(const ModelTensorTable *tt, int l, int j, int experts)
{
    char bn[32];
    if (experts)
        snprintf(bn, sizeof bn, "layer.%d.experts", l);
    else
        layer_name(bn, l, NULL);
    return block_index(tt, bn, l, j);
}

/* ZeRO-3's gathers before a layer's forward: its block and, in a MoE layer, its experts'. */
static void run_gather(Emit *e, const ModelTensorTable *tt, int l, int j, int moe)
{
    zero_gather(e, tt, layer_block(tt, l, j, 0), MODEL_FWD);
    if (moe)
        zero_gather(e, tt, layer_block(tt, l, j, 1), MODEL_FWD);
}

/* The norms whose gradients SP all-reduces over TP: a layer's two (and a prediction module's
 * three more), the final norm; none for a MoE layer's experts or the embedding. */
static int block_norms(const ModelSpec *s, const ModelBlock *b)
{
    if (b->experts)
        return 0;
    if (b->layer >= 0)
        return b->layer >= s->model.layers ? 5 : 2;
    return strcmp(b->name, "final") == 0 ? 1 : 0;
}

static void embed_pass(Emit *e, const ModelTensorTable *tt, int j, int backward)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, h = d->h, a = eb(e);
    int blk = block_index(tt, "embed", -1, j);
    e->layer = -1;
    if (!backward) {
        zero_gather(e, tt, blk, MODEL_FWD);
        /* gather rows (+ positions), dropout */
        const char *n = at(e, MODEL_OPR_EMBED);
        simple(e, MODEL_OP_EMBEDDING, n, M * (2.0 * h * a + 4.0));
        comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
    } else {
        const char *n = at(e, MODEL_OPR_EMBED);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        zero_gather_bwd(e, tt, blk);
        /* scatter-add the output gradient into the embedding gradient rows */
        simple(e, MODEL_OP_EMBEDDING, n,
               M * (h * a + 2.0 * h * (double)px_dtype_bytes(d->grad) + 4.0));
        zero_reduce(e, tt, blk);
    }
}

static void head_pass(Emit *e, const ModelTensorTable *tt, int j, int backward)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double V = d->vocab_loc, nb = Msp * h * a;
    int blk = block_index(tt, "final", -1, j);
    /* A tied output layer on the embedding's chunk reads embed.wte: ZeRO-3 gathers it again. */
    int tied_here = s->model.tied_embeddings && model_global_chunk(d, tt->stage, j) == 0;
    int eblk = tied_here ? block_index(tt, "embed", -1, j) : -1;
    e->layer = -1;
    if (!backward) {
        zero_gather(e, tt, blk, MODEL_FWD);
        norm(e, at(e, MODEL_OPR_FINAL_LN), 2.0, nb);
        const char *n = at(e, MODEL_OPR_LOGITS);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        if (eblk >= 0)
            zero_gather(e, tt, eblk, MODEL_FWD);
        /* logits are written in fp32 into the saved probabilities */
        linear(e, n, M, V, h, M * V * (4.0 - a));
        n = at(e, MODEL_OPR_LOSS);
        simple(e, MODEL_OP_LOSS, n, 2.0 * M * V * 4.0);
        comm(e, n, MODEL_TP_ALLREDUCE, t, M * 4.0, 3); /* max, sum of exp, target logit */
    } else {
        zero_gather_bwd(e, tt, blk);
        if (eblk >= 0)
            zero_gather_bwd(e, tt, eblk);
        simple(e, MODEL_OP_LOSS, at(e, MODEL_OPR_LOSS), 2.0 * M * V * 4.0);
        const char *n = at(e, MODEL_OPR_LOGITS);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        linear(e, n, M, V, h, M * V * (4.0 - a));
        comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
        norm(e, at(e, MODEL_OPR_FINAL_LN), 4.0, nb);
        if (s->layout.zero >= 2 && !d->zero_per_step)
            sp_norm_grads(e, tt, blk, 1);
        zero_reduce(e, tt, blk);
    }
}

/* ZeRO-3 whose forward's gathers are not kept (FSDP2's reshard after forward, DeepSpeed's
 * release after each use), on the one stage a step's gathers run in: a prediction module reads
 * the embedding (its shifted tokens looked up in its forward, and again in its backward for
 * enorm's) and the output layer (its head's forward and backward) after those blocks' own
 * gathers have been released, and gathers them again for each read, as FSDP2 gathers a module
 * at each of its calls in the forward and at each of their backwards. The ring of gather
 * buffers holds them (each read needs one of the module's blocks beside it at most, and the
 * executor orders the gathers so: exec/train/mtp.c): more bytes, no more memory. With the
 * gathers kept the forward's copies serve every read. */
static void mtp_gather(Emit *e, const ModelTensorTable *tt, int block, ModelPhase phase)
{
    if (!e->s->layout.keep_gathered && block >= 0)
        zero_gather(e, tt, block, phase);
}

/* The block holding the output layer's weights on local chunk j: the embedding's when it is
 * tied and on that chunk, else the final block. */
static int out_block(const Emit *e, const ModelTensorTable *tt, int j)
{
    const int tied = e->s->model.tied_embeddings && model_global_chunk(e->d, tt->stage, j) == 0;
    return block_index(tt, tied ? "embed" : "final", -1, j);
}

/* A multi-token prediction module on layer l (DeepSeek-V3 Sec. 2.2; Megatron-Core's MTP): the
 * next tokens' embedding and the hidden state, each normed, concatenated and projected (eh,
 * column-parallel, its output gathered), the module's transformer layer and its final norm.
 * It runs on the MTP chunk (d->mtp_chunk), after that chunk's layers. */
static void mtp_module_pass(Emit *e, const ModelTensorTable *tt, int j, int l, int backward)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a, hl = ceil(h / t);
    const int moe = model_layer_is_moe(&s->model, l);
    const int blk = layer_block(tt, l, j, 0), xblk = moe ? layer_block(tt, l, j, 1) : -1;
    char n[64];
    e->layer = l;
    if (!backward) {
        run_gather(e, tt, l, j, moe);
        mtp_gather(e, tt, block_index(tt, "embed", -1, j), MODEL_FWD);
        e->layer = l;
        at_layer(e, MODEL_OPR_MTP, l, n);
        simple(e, MODEL_OP_EMBEDDING, n, M * (2.0 * h * a + 4.0));
        comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
        norm(e, n, 4.0, nb);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, 2.0 * tp_act_bytes(e), 1);
        linear(e, n, M, hl, 2.0 * h, 0);
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        layer_forward(e, l);
        e->layer = l;
        at_layer(e, MODEL_OPR_FINAL_LN, l, n);
        norm(e, n, 2.0, nb);
        return;
    }
    at_layer(e, MODEL_OPR_FINAL_LN, l, n);
    norm(e, n, 4.0, nb);
    layer_backward(e, tt, blk, xblk, l);
    mtp_gather(e, tt, block_index(tt, "embed", -1, j), MODEL_BWD);
    e->layer = l;
    at_layer(e, MODEL_OPR_MTP, l, n);
    if (sp) {
        /* the layer's input gradient over the whole sequence (the backward of Megatron's
         * scatter to the sequence-parallel region) and eh's input gathered again for its
         * weight gradient (ColumnParallelLinear with SP keeps it sharded) */
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        comm(e, n, MODEL_TP_ALL_GATHER, t, 2.0 * tp_act_bytes(e), 1);
    }
    linear(e, n, M, hl, 2.0 * h, 0);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, 2.0 * tp_act_bytes(e), 1);
    norm(e, n, 8.0, nb);
    /* enorm's input, not saved, looked up again and its shards' partial lookups summed as the
     * forward's were: with SP reduce-scattered to the rank's rows, whose input gradient is then
     * gathered over the sequence for the embedding's rows (under ZeRO-2/3 in the embedding's
     * window); without SP all-reduced */
    if (sp) {
        comm(e, n, MODEL_TP_REDUCE_SCATTER, t, tp_act_bytes(e), 1);
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    } else {
        comm(e, n, MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
    }
    simple(e, MODEL_OP_EMBEDDING, n, M * (h * a + 2.0 * h * (double)px_dtype_bytes(d->grad) + 4.0));
}

/* A prediction module's output: the shared output layer over its part of the hidden states
 * and a loss of its own, on the last chunk with the output layer. */
static void mtp_head_pass(Emit *e, const ModelTensorTable *tt, int j, int l, int backward)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, h = d->h, a = eb(e), V = d->vocab_loc;
    char n[64];
    mtp_gather(e, tt, out_block(e, tt, j), backward ? MODEL_BWD : MODEL_FWD);
    e->layer = l;
    if (!backward) {
        at_layer(e, MODEL_OPR_LOGITS, l, n);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        linear(e, n, M, V, h, M * V * (4.0 - a));
        at_layer(e, MODEL_OPR_LOSS, l, n);
        simple(e, MODEL_OP_LOSS, n, 2.0 * M * V * 4.0);
        comm(e, n, MODEL_TP_ALLREDUCE, t, M * 4.0, 3);
        return;
    }
    at_layer(e, MODEL_OPR_LOSS, l, n);
    simple(e, MODEL_OP_LOSS, n, 2.0 * M * V * 4.0);
    at_layer(e, MODEL_OPR_LOGITS, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, V, h, M * V * (4.0 - a));
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
}

/* What a chunk's passes need to know beyond the emitter: its place in the model, what its
 * transfers carry, and its layer runs. */
typedef struct {
    int j, first, last; /* local chunk; it holds the model's first or last global chunk */
    /* Megatron's scatter/gather: without SP each TP rank sends 1/t of the (replicated)
     * activation and the receivers all-gather it over the node's links (Narayanan 2021 Sec. 4.1) */
    double pp_bytes, pp_gather;
    /* from a standalone MTP stage to the loss's, a transfer carries the main hidden states and
     * each module's output, concatenated along the sequence (Megatron-Core's MTP block):
     * xin for the transfer into this chunk, xout for the one out of it */
    double xin, xout;
    const ModelLayerRun *runs; /* the model's layers [0, nr), the prediction modules' after */
    int nr, n_mtp;
} ChunkPasses;

/* A chunk's forward: its input (received, or the embedding), its runs of layers, then its
 * output sent on, or the output layer and the prediction modules. */
static void chunk_forward(Emit *e, const ModelTensorTable *tt, const ChunkPasses *c)
{
    const ModelSpec *s = e->s;
    const int j = c->j;
    e->phase = MODEL_FWD;
    e->layer = -1;
    if (!c->first) {
        comm(e, at(e, MODEL_OPR_PP), MODEL_PP_RECV, 2, c->xin * c->pp_bytes, 1);
        if (c->pp_gather > 0)
            comm(e, at(e, MODEL_OPR_PP), MODEL_TP_ALL_GATHER, e->d->t, c->xin * c->pp_gather, 1);
    } else {
        embed_pass(e, tt, j, 0);
    }
    for (int i = 0; i < c->nr; i++) {
        const int l = c->runs[i].first;
        e->repeat = c->runs[i].count;
        e->layer = l;
        run_gather(e, tt, l, j, c->runs[i].moe);
        layer_forward(e, l);
        e->repeat = 1;
    }
    e->layer = -1;
    const int l_mtp = s->model.layers; /* the first prediction module's layer */
    if (!c->last) {
        for (int i = 0; i < c->n_mtp; i++)
            mtp_module_pass(e, tt, j, c->runs[c->nr + i].first, 0);
        e->layer = -1;
        comm(e, at(e, MODEL_OPR_PP), MODEL_PP_SEND, 2, c->xout * c->pp_bytes, 1);
        return;
    }
    head_pass(e, tt, j, 0);
    for (int i = 0; i < s->model.mtp_layers; i++) {
        if (c->n_mtp)
            mtp_module_pass(e, tt, j, c->runs[c->nr + i].first, 0);
        mtp_head_pass(e, tt, j, l_mtp + i, 0);
    }
}

/* A chunk's backward, the forward in reverse: the output's gradient (received, or from the
 * loss and the prediction modules' heads), the runs of layers last to first, then the input's
 * gradient sent back, or the embedding's. */
static void chunk_backward(Emit *e, const ModelTensorTable *tt, const ChunkPasses *c)
{
    const ModelSpec *s = e->s;
    const int j = c->j;
    e->phase = MODEL_BWD;
    e->layer = -1;
    if (!c->last) {
        comm(e, at(e, MODEL_OPR_PP), MODEL_PP_RECV, 2, c->xout * c->pp_bytes, 1);
        if (c->pp_gather > 0)
            comm(e, at(e, MODEL_OPR_PP), MODEL_TP_ALL_GATHER, e->d->t, c->xout * c->pp_gather, 1);
        for (int i = c->n_mtp - 1; i >= 0; i--)
            mtp_module_pass(e, tt, j, c->runs[c->nr + i].first, 1);
    } else {
        const int l_mtp = s->model.layers;
        for (int i = s->model.mtp_layers - 1; i >= 0; i--) {
            mtp_head_pass(e, tt, j, l_mtp + i, 1);
            if (c->n_mtp)
                mtp_module_pass(e, tt, j, c->runs[c->nr + i].first, 1);
        }
        head_pass(e, tt, j, 1);
    }
    for (int i = c->nr - 1; i >= 0; i--) {
        const int l = c->runs[i].first;
        e->repeat = c->runs[i].count;
        layer_backward(e, tt, layer_block(tt, l, j, 0), c->runs[i].moe ? layer_block(tt, l, j, 1) : -1, l);
        e->repeat = 1;
    }
    e->layer = -1;
    if (!c->first)
        comm(e, at(e, MODEL_OPR_PP), MODEL_PP_SEND, 2, c->xin * c->pp_bytes, 1);
    else
        embed_pass(e, tt, j, 1);
}

/* One micro-batch's forward and backward of local chunk j (compact: a run of like layers
 * emitted once, with its repeat). -1 (e->rc set) when out of memory. */
static int chunk_passes(Emit *e, const ModelTensorTable *tt, int stage, int j, int compact)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int gc = model_global_chunk(d, stage, j);
    const int mtp_stage = s->model.mtp_layers > 0 && d->mtp_chunk < d->chunks - 1;
    ChunkPasses c = {
        .j = j,
        .first = gc == 0,
        .last = gc == d->chunks - 1,
        .pp_bytes = (double)d->b * d->s_sp * d->h * eb(e) / d->pp_split,
        .pp_gather = d->pp_split > 1 ? (double)d->b * d->s_sp * d->h * eb(e) : 0,
        .xin = mtp_stage && gc > d->mtp_chunk ? 1.0 + s->model.mtp_layers : 1.0,
        .xout = mtp_stage && gc >= d->mtp_chunk ? 1.0 + s->model.mtp_layers : 1.0,
    };
    e->chunk = j;
    const int cap = model_chunk_runs_count(s, d, gc, compact);
    ModelLayerRun stack[8], *runs = cap <= 8 ? stack : malloc((size_t)cap * sizeof *runs);
    if (!runs) {
        e->rc = px_fail(e->err, PX_ERUNTIME, "out of memory building the op graph");
        return -1;
    }
    c.runs = runs;
    c.nr = model_chunk_runs(s, d, gc, compact, runs, cap);
    while (c.nr > 0 && runs[c.nr - 1].first >= s->model.layers) { /* the prediction modules' */
        c.nr--;
        c.n_mtp++;
    }
    chunk_forward(e, tt, &c);
    chunk_backward(e, tt, &c);
    if (runs != stack)
        free(runs);
    return 0;
}

/* Per step, each block's gradient reduction: all-reduce (no ZeRO) or reduce-scatter (ZeRO-1,
 * and ZeRO-2/3 under a pipeline: once, after the stage's last micro-batch) over its
 * data-parallel group, SP's norm gradients first; with HSDP its shard's all-reduce over the
 * replicas. */
static void step_grad_reductions(Emit *e, const ModelTensorTable *tt)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const double ge = (double)px_dtype_bytes(d->grad);
    const int zero = d->zero_per_step ? 1 : s->layout.zero;
    for (int i = 0; i < tt->n_blocks; i++) {
        const ModelBlock *b = &tt->blocks[i];
        e->chunk = b->chunk;
        e->layer = b->layer;
        e->repeat = b->repeat;
        const int grp = block_group(d, tt, i);
        if (zero <= 1)
            sp_norm_grads(e, tt, i, block_norms(s, b));
        if (zero == 0)
            block_comm(e, MODEL_OPR_BLOCK_GRADS, tt, i, block_kind(tt, i, MODEL_DP_ALLREDUCE), grp,
                       (double)b->numel * ge, 1);
        else if (zero == 1)
            block_comm(e, MODEL_OPR_BLOCK_GRADS, tt, i, block_kind(tt, i, MODEL_DP_REDUCE_SCATTER), grp,
                       (double)px_round_up(b->numel, (uint64_t)grp) * ge, 1);
        /* HSDP: the block's gradient shard, reduced over its shard group (above, or each
         * micro-batch with ZeRO-2/3), all-reduced over its dp_replicate replicas; the routed
         * experts keep their expert-data-parallel group whole */
        if (d->dp_rep > 1 && !b->experts)
            block_comm(e, MODEL_OPR_BLOCK_GRADS, tt, i, MODEL_DPR_ALLREDUCE, d->dp_rep,
                       (double)(px_round_up(b->numel, (uint64_t)grp) / (uint64_t)grp) * ge, 1);
    }
    e->repeat = 1;
}

/* The output layer's copy of a tied embedding, and the prediction modules' copy of the
 * embedding (in the last stage's final block, or a standalone MTP stage's mtp.embed): their
 * gradients summed with the first stage's. A tied model with a standalone MTP stage after the
 * first holds three copies, summed by one all-reduce over the three stages. */
static void step_embedding_sync(Emit *e, const ModelTensorTable *tt, int stage)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int mtp_n = s->model.mtp_layers;
    const int copy_last = s->model.tied_embeddings || (mtp_n > 0 && d->mtp_chunk == d->chunks - 1);
    /* none on the first pipeline rank, whose embed.wte the modules read */
    const int copy_mtp = mtp_n > 0 && d->mtp_chunk != d->chunks - 1 && d->mtp_chunk % d->p != 0;
    const double ge = (double)px_dtype_bytes(d->grad);
    if (!(copy_last || copy_mtp) || d->chunks <= 1)
        return;
    const int members = copy_last && copy_mtp ? 3 : 2;
    for (int j = 0; j < d->v; j++) {
        int gc = model_global_chunk(d, stage, j);
        const char *bn = gc == 0                            ? "embed"
                         : gc == d->chunks - 1 && copy_last ? "final"
                         : gc == d->mtp_chunk && copy_mtp   ? "mtp.embed"
                                                            : NULL;
        if (bn) {
            e->chunk = j;
            e->layer = -1;
            /* found: the table gives the first chunk its embed block, the last its final
             * and the MTP chunk its mtp.embed */
            block_comm(e, MODEL_OPR_BLOCK_GRADS, tt, block_index(tt, bn, -1, j),
                       MODEL_EMBED_ALLREDUCE, members, (double)d->vocab_loc * d->h * ge, 1);
        }
    }
}

/* A framework's eager AdamW step (d->adamw_step_bytes, from its profile: fms-fsdp's
 * torch.optim.AdamW, PyTorch's multi-tensor implementation, after FSDP1's clip_grad_norm_) makes
 * one pass over the shard per foreach op, each at least a kernel: the weight decay (mul_), m
 * (lerp_), v (mul_, addcmul_), the denominator (sqrt, div_, add_), the update (addcdiv_), and
 * the clipping's norm and scaling (docs/time.md, "Frameworks"). */
#define ADAMW_FOREACH_KERNELS 10

/* MXFP8 parameters under ZeRO-3 (model_fp8_mx_gather_copies): after the update each rank
 * quantizes its shard of the fp32 master into both copies, as Transformer Engine's
 * _cast_master_weights_to_fp8_mxfp8_scaling (tensor/utils.py) does for Megatron-FSDP: one
 * read of the shard for its blocks' partial amaxes (mxfp8_scaling_compute_partial_amax), one
 * more for the cast (mxfp8_scaling_partial_cast), which writes the row-wise and the column-wise
 * byte: 4 + 4 + 2 bytes an element of the shard's FP8 weights (a block's share: fp8_numel /
 * group). */
static double mx_shard_cast(const ModelTensorTable *tt)
{
    double bytes = 0;
    for (int i = 0; i < tt->n_blocks; i++) {
        const ModelBlock *b = &tt->blocks[i];
        if (b->fp8_numel > 0 && b->group > 0)
            bytes += (double)b->fp8_numel / b->group * b->repeat * (4.0 + 4.0 + 2.0);
    }
    return bytes;
}

/* The optimizer step over the rank's parameters (its shard with ZeRO), the FP8 weights' casts
 * and the gradient norm's read; a framework that gives its AdamW step's bytes per element
 * (adamw_step_bytes) moves those instead of the fused count and the norm's read. */
static void step_optimizer(Emit *e, const ModelTensorTable *tt)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const double ge = (double)px_dtype_bytes(d->grad), pe = (double)px_dtype_bytes(d->param);
    const int zero = s->layout.zero;
    e->chunk = -1;
    e->layer = -1;
    e->repeat = 1;
    /* AdamW per state element: read the gradient, read+write master (or the fp32 weight),
     * m and v, write the low-precision weight; SGD: gradient, weight, momentum. */
    double elems = 0, total = 0;
    for (int i = 0; i < tt->n_blocks; i++) {
        total += (double)tt->blocks[i].numel * tt->blocks[i].repeat;
        elems += (double)(zero >= 1 ? tt->blocks[i].shard_numel : tt->blocks[i].numel) *
                 tt->blocks[i].repeat;
    }
    double per = 0;
    switch (s->job.optimizer) {
    case MODEL_OPT_ADAMW: per = ge + 8.0 + 16.0 + (d->master ? pe : 0); break;
    case MODEL_OPT_SGD_MOMENTUM: per = ge + 8.0 + 8.0 + (d->master ? pe : 0); break;
    case MODEL_OPT_ADAM_8BIT: per = ge + 8.0 + 4.0 + (d->master ? pe : 0); break;
    }
    /* FP8 weights' copies: each step re-casts the FP8 GEMMs' weights (read in the
     * weights' dtype, written once, twice with a transposed copy); FP8 parameters, which
     * the update writes itself (counted as pe), only their transposed copy (read, write) */
    double fp8_numel = 0;
    for (int i = 0; i < tt->n_blocks; i++)
        fp8_numel += (double)tt->blocks[i].fp8_numel * tt->blocks[i].repeat;
    double cast = 0;
    /* MXFP8's FP8 parameters are quantized by every rank from the gathered 16-bit values, as
     * the weights' copies are without the flag (block_param_bytes) */
    const int own_cast = s->job.fp8_param_gather && s->job.fp8 != MODEL_FP8_MXFP8;
    if (d->fp8 && zero < 3)
        cast = own_cast ? fp8_numel * (d->fp8_wt ? 2.0 : 0.0)
                                       : fp8_numel * (pe + 1.0 + (d->fp8_wt ? 1.0 : 0.0));
    if (model_fp8_mx_gather_copies(s, d, MODEL_STEP) > 0)
        cast = mx_shard_cast(tt);
    /* + one read of every local gradient for the gradient norm (under a pipeline ZeRO-2/3
     * hold the stage's accumulated gradients whole, as ZeRO-1 does, and are priced alike) */
    const int sharded_grads = zero >= 2 && !d->zero_per_step;
    double bytes = elems * per + (sharded_grads ? elems : total) * ge;
    if (d->adamw_step_bytes > 0)
        bytes = elems * d->adamw_step_bytes;
    ModelOp *op = simple(e, MODEL_OP_OPTIMIZER, at(e, MODEL_OPR_OPTIMIZER), bytes + cast);
    op->fp8_cast_bytes = cast;
    if (d->adamw_step_bytes > 0)
        op->kernels = ADAMW_FOREACH_KERNELS;
}

/* A ZeRO stage gathering FP8 weights whose scales are computed from the whole weight (one per
 * tensor: delayed, tensorwise; one a 128 x 128 tile: blockwise): a shard's amax is not its
 * weight's (nor, the flat shard cut splitting tiles, its tiles'), so each step, after the
 * update, the ranks all-reduce (max) every FP8 matrix's amax (every tile's) over its ZeRO
 * group (torchao's precompute_float8_dynamic_scale_for_fsdp under ZeRO-3, Megatron-FSDP's
 * partial tile amaxes with blockwise; below it
 * Transformer Engine's cast of the master shards to FP8 in Megatron's distributed optimizer,
 * before the parameter all-gather; without ZeRO every rank holds whole weights and needs
 * none): the dense blocks' over the ZeRO group in one call, the experts' (a matrix a local
 * expert, each scaled on its own) over the expert-data-parallel group in another, the ranks of
 * which hold the same experts (the other ep ranks' experts are other weights), 4 bytes a
 * matrix (a tile) of the stage. Each call is tagged with the first block that holds one of its
 * matrices. MXFP8 under ZeRO-3 (Megatron-FSDP) likewise: the flat cut lets a 1 x 32 or 32 x 1
 * block straddle two shards, so Transformer Engine all-reduces every block's partial amax, of
 * both copies, in the master's dtype (fp32: _cast_master_weights_to_fp8_mxfp8_scaling's
 * packed_amaxes), 4 bytes a block of each copy (ModelBlock.fp8_scales counts both; TE pads the
 * scale grids to 128 x 4, which parallax does not count). */
static void step_fp8_amax(Emit *e, const ModelTensorTable *tt)
{
    const ModelSpec *s = e->s;
    const int mx = model_fp8_mx_gather_copies(s, e->d, MODEL_STEP) > 0;
    if (s->layout.zero == 0 || !s->job.fp8_param_gather ||
        (s->job.fp8 != MODEL_FP8_DELAYED && s->job.fp8 != MODEL_FP8_TENSORWISE &&
         s->job.fp8 != MODEL_FP8_BLOCKWISE && !mx))
        return;
    for (int experts = 0; experts < 2; experts++) {
        double weights = 0;
        int first = -1;
        for (int i = 0; i < tt->n_blocks; i++) {
            if (!!tt->blocks[i].experts != experts)
                continue;
            weights += (double)tt->blocks[i].fp8_scales * tt->blocks[i].repeat;
            if (first < 0 && tt->blocks[i].fp8_weights > 0)
                first = i;
        }
        if (first < 0)
            continue;
        e->chunk = tt->blocks[first].chunk;
        e->layer = tt->blocks[first].layer;
        e->repeat = 1;
        block_comm(e, MODEL_OPR_BLOCK_PARAMS, tt, first, block_kind(tt, first, MODEL_DP_ALLREDUCE),
                   block_group(e->d, tt, first), 4.0 * weights, 1);
    }
}

/* ZeRO-1/2: every block's updated parameter shards gathered after the step; ZeRO-3 under a
 * pipeline: every block gathered once per step, before the stage's first forward (timed like
 * ZeRO-1's: under that forward with --overlap-dp), kept across its micro-batches. */
static void step_param_gathers(Emit *e, const ModelTensorTable *tt)
{
    const int zero = e->s->layout.zero;
    for (int i = 0; i < tt->n_blocks && (zero == 1 || zero == 2 || e->d->zero_per_step); i++) {
        const ModelBlock *b = &tt->blocks[i];
        e->chunk = b->chunk;
        e->layer = b->layer;
        e->repeat = b->repeat;
        const int grp = block_group(e->d, tt, i);
        block_comm(e, MODEL_OPR_BLOCK_PARAMS, tt, i, block_kind(tt, i, MODEL_DP_ALL_GATHER), grp,
                   block_param_bytes(e->s, e->d, b, grp,
                                     model_fp8_mx_gather_copies(e->s, e->d, MODEL_STEP)),
                   1);
    }
    step_fp8_amax(e, tt);
}

static int ops_build(const ModelSpec *s, const ModelDims *d, int stage, int compact,
                     const ModelTensorTable *given, ModelOpGraph *g, PxError *err)
{
    memset(g, 0, sizeof *g);
    g->stage = stage;
    ModelTensorTable own;
    const ModelTensorTable *tp = given;
    if (!tp) {
        int rc = compact ? model_tensors_build_compact(s, d, stage, &own, err)
                         : model_tensors_build(s, d, stage, &own, err);
        if (rc) {
            model_tensors_free(&own);
            return rc;
        }
        tp = &own;
    }
    const ModelTensorTable tt = *tp;
    Emit e = {.g = g, .s = s, .d = d, .err = err, .per_mb = 1, .repeat = 1, .block = -1};
    /* each chunk's forward and backward of one micro-batch */
    for (int j = 0; j < d->v; j++)
        if (chunk_passes(&e, &tt, stage, j, compact) < 0)
            break;
    /* per-step ops: gradient reduction by block, tied-embedding sync, optimizer, gathers */
    e.per_mb = 0;
    e.phase = MODEL_STEP;
    step_grad_reductions(&e, &tt);
    step_embedding_sync(&e, &tt, stage);
    step_optimizer(&e, &tt);
    step_param_gathers(&e, &tt);
    if (tp == &own)
        model_tensors_free(&own);
    return e.rc;
}

int model_ops_build(const ModelSpec *s, const ModelDims *d, int stage, ModelOpGraph *g,
                    PxError *err)
{
    return ops_build(s, d, stage, 0, NULL, g, err);
}

int model_ops_build_compact(const ModelSpec *s, const ModelDims *d, int stage,
                            const ModelTensorTable *tt, ModelOpGraph *g, PxError *err)
{
    return ops_build(s, d, stage, 1, tt, g, err);
}

int model_ops_build_with(const ModelSpec *s, const ModelDims *d, int stage,
                         const ModelTensorTable *tt, ModelOpGraph *g, PxError *err)
{
    return ops_build(s, d, stage, tt->compact, tt, g, err);
}

void model_ops_free(ModelOpGraph *g)
{
    if (!g)
        return;
    free(g->op);
    memset(g, 0, sizeof *g);
}

const char *model_phase_name(ModelPhase p)
{
    static const char *const names[] = {"fwd", "bwd", "recompute", "step"};
    return names[p];
}

void model_op_fullname(const ModelOp *op, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s.%s", op->name, model_phase_name(op->phase));
}

/* ---- how calibrated op rates are keyed ---- */

static const char *kind_name(ModelOpKind k)
{
    static const char *const names[] = {"matmul", "attention", "norm", "activation",
                                        "embedding", "loss", "optimizer", "comm", "permute"};
    return (unsigned)k < 9 ? names[k] : "?";
}

void model_op_key(const ModelSpec *s, const ModelDims *d, const ModelOp *op, ModelOpKey *key)
{
    memset(key, 0, sizeof *key);
    px_strlcpy(key->kind, kind_name(op->kind), sizeof key->kind);
    px_strlcpy(key->phase, op->phase == MODEL_RECOMPUTE ? "fwd" : model_phase_name(op->phase),
               sizeof key->phase);
    const char *pos = s->model.position == MODEL_POS_ROPE ? "rope" : "learned";
    switch (op->kind) {
    case MODEL_OP_NORM:
        px_strlcpy(key->variant, s->model.norm == MODEL_RMSNORM ? "rmsnorm" : "layernorm",
                   sizeof key->variant);
        break;
    case MODEL_OP_ACTIVATION:
        px_strlcpy(key->variant, s->model.mlp == MODEL_SWIGLU ? "swiglu" : "gelu",
                   sizeof key->variant);
        break;
    case MODEL_OP_EMBEDDING:
        px_strlcpy(key->variant, pos, sizeof key->variant);
        break;
    case MODEL_OP_MATMUL: {
        /* the projection's role ("attn.qkv", "mlp.fc1", "logits"): which epilogue follows
         * its GEMMs (a bias, RoPE in the QKV projection, a residual add) */
        snprintf(key->variant, sizeof key->variant, "%.14s/%s", model_op_role_name(op->role),
                 pos);
        break;
    }
    case MODEL_OP_ATTENTION:
        /* context parallelism's ring runs the core as blocks of s/(2 cp) tokens, merged by
         * their log-sum-exp: its own rate where calibrate trained a ring (sim falls back to the
         * whole core's) */
        snprintf(key->variant, sizeof key->variant, "hd%d%s", d->hd,
                 s->layout.cp > 1 && s->layout.cp_comm == MODEL_CP_COMM_P2P ? "/ring" : "");
        key->flash = s->job.flash_attn;
        break;
    default: break;
    }
    if (op->kind == MODEL_OP_ATTENTION) {
        key->x = op->flops;
    } else if (op->kind == MODEL_OP_MATMUL) {
        /* what grows with the tokens beyond the GEMMs: the first GEMM's output (the bias added
         * to it forward, the bias gradient read from the output gradient backward) and the
         * epilogue's passes */
        const ModelGemm *g = &op->gemm[0];
        key->x = (op->n_gemm > 0 ? (double)g->m * g->n * (double)g->batch *
                                       (double)px_dtype_bytes(d->act)
                                 : 0) +
                 op->epilogue_bytes;
    } else {
        key->x = op->bytes;
    }
}
