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
    "pp",       "params",   "grads",  "sp_grads"};

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

/* Y[M,N] = X[M,K] W[N,K]^T; backward computes dX (M,K,N) and dW (N,K,M). Weight gradients
 * accumulate into the gradient buffer (read and written in the gradient dtype). An epilogue
 * (bias, dropout, residual) adds extra_bytes in epi_kernels launches. */
static void linear_k(Emit *e, const char *base, double M, double N, double K, double extra_bytes,
                     int epi_kernels)
{
    ModelOp *op = op_new(e, MODEL_OP_MATMUL, base);
    double a = eb(e);
    if (e->phase == MODEL_BWD) {
        double g = (double)px_dtype_bytes(e->d->grad);
        op->flops = 4.0 * M * N * K;
        op->bytes = (M * N + N * K + M * K) * a + (M * N + M * K) * a + 2.0 * N * K * g + extra_bytes;
        op->n_gemm = 2;
        op->gemm[0] = (ModelGemm){(int64_t)M, (int64_t)K, (int64_t)N, 1};
        op->gemm[1] = (ModelGemm){(int64_t)N, (int64_t)K, (int64_t)M, 1};
    } else {
        op->flops = 2.0 * M * N * K;
        op->bytes = (M * K + N * K + M * N) * a + extra_bytes;
        op->n_gemm = 1;
        op->gemm[0] = (ModelGemm){(int64_t)M, (int64_t)N, (int64_t)K, 1};
    }
    op->kernels = op->n_gemm + (extra_bytes > 0 ? epi_kernels : 0);
    op->epilogue_bytes = extra_bytes;
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

/* Bytes of the full-sequence activation [b, s_loc, h] that TP collectives move. */
static double tp_act_bytes(const Emit *e)
{
    const ModelDims *d = e->d;
    return (double)d->b * d->s_loc * d->h * eb(e);
}

static void attention_core(Emit *e, const char *base)
{
    const ModelDims *d = e->d;
    const ModelSpec *s = e->s;
    double bh = (double)d->b * d->heads_loc, sq = d->s_loc, sk = d->s, hd = d->hd, a = eb(e);
    double fwd = model_attention_fwd_flops(s, bh, sq, sk, hd);
    double qkv = (double)d->b * (sq * d->q_loc + 2.0 * sk * d->kv_width_loc) * a;
    double out = (double)d->b * sq * d->q_loc * a;
    double mat = bh * sq * sk * a; /* one s x s score matrix per head */
    int drop = s->job.dropout > 0.0;
    ModelOp *op = op_new(e, MODEL_OP_ATTENTION, base);
    op->n_gemm = 2;
    op->gemm[0] = (ModelGemm){(int64_t)sq, (int64_t)sk, (int64_t)hd, (int64_t)bh};
    op->gemm[1] = (ModelGemm){(int64_t)sq, (int64_t)hd, (int64_t)sk, (int64_t)bh};
    /* Unfused attention: the score GEMM writes S; Megatron's fused scale-mask-softmax reads it
     * and writes P in one kernel (unfused: scale, mask and softmax are three passes of two);
     * dropout reads P and writes the dropped copy and its mask; the context GEMM reads it. */
    const double softmax = passes(e, 2.0, 6.0);
    const int softmax_kernels = s->job.fused_kernels ? 1 : 3;
    if (e->phase == MODEL_BWD) {
        op->n_gemm = 4;
        op->gemm[2] = (ModelGemm){(int64_t)sk, (int64_t)hd, (int64_t)sq, (int64_t)bh};
        op->gemm[3] = (ModelGemm){(int64_t)sq, (int64_t)hd, (int64_t)sk, (int64_t)bh};
        if (s->job.flash_attn) {
            /* FlashAttention's backward recomputes the scores: 2.5 x the forward (Dao 2023).
             * The extra half is recompute: it counts in hardware FLOPs, not model FLOPs. */
            op->flops = model_attention_bwd_flops(fwd, 1, &op->recompute_flops);
            op->bytes = 2.0 * qkv + 3.0 * out + bh * sq * 8.0;
            op->kernels = 2;
        } else {
            /* dP written and read, softmax backward reads P and dP and writes dS, dropout
             * backward reads the mask, the two gradient GEMMs read dS */
            op->flops = model_attention_bwd_flops(fwd, 0, NULL);
            op->bytes = 2.0 * qkv + 2.0 * out + mat * (drop ? 7.0 + 1.0 / a : 5.0) + mat * (softmax - 2.0);
            op->kernels = 4 + softmax_kernels + drop;
        }
    } else {
        op->flops = fwd;
        if (s->job.flash_attn) {
            op->bytes = qkv + out + bh * sq * 4.0;
            op->kernels = 1;
        } else {
            op->bytes = qkv + out + mat * (2.0 + softmax + (drop ? 2.0 + 1.0 / a : 0.0));
            op->kernels = 2 + softmax_kernels + drop;
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

static void layer_forward(Emit *e, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a; /* one norm-region activation */
    char n[64];
    e->layer = l;
    at_layer(e, MODEL_OPR_LN1, l, n);
    simple(e, MODEL_OP_NORM, n, 2.0 * nb);
    at_layer(e, MODEL_OPR_QKV, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, d->q_loc + 2.0 * d->kv_width_loc, h, 0);
    at_layer(e, MODEL_OPR_CORE, l, n);
    comm(e, n, MODEL_CP_ALL_GATHER, d->c, (double)d->b * d->s * 2.0 * d->kv_width_loc * a, 1);
    attention_core(e, n);
    at_layer(e, MODEL_OPR_PROJ, l, n);
    linear_epilogue(e, n, M, h, d->q_loc, nb);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
    at_layer(e, MODEL_OPR_LN2, l, n);
    simple(e, MODEL_OP_NORM, n, 2.0 * nb);
    at_layer(e, MODEL_OPR_FC1, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, d->ffn_out_loc, h, 0);
    at_layer(e, MODEL_OPR_ACT, l, n);
    /* bias + GeLU fused (Megatron's bias_gelu): read fc1's output, write the activation;
     * unfused: a bias-add pass first */
    simple(e, MODEL_OP_ACTIVATION, n,
           M * (d->ffn_out_loc + d->ffn_loc + passes(e, 0.0, 2.0 * d->ffn_out_loc)) * a)
        ->kernels = s->job.fused_kernels ? 1 : 2;
    at_layer(e, MODEL_OPR_FC2, l, n);
    linear_epilogue(e, n, M, h, d->ffn_loc, nb);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
}

static void zero_gather(Emit *e, const ModelTensorTable *tt, int block, ModelPhase phase)
{
    const ModelDims *d = e->d;
    if (e->s->layout.zero != 3)
        return;
    const ModelPhase keep = e->phase;
    const ModelOpRole keep_role = e->role;
    e->phase = phase;
    block_comm(e, MODEL_OPR_BLOCK_PARAMS, tt, block, MODEL_DP_ALL_GATHER, d->zero_group,
               (double)px_round_up(tt->blocks[block].numel, (uint64_t)d->zero_group) *
                   (double)px_dtype_bytes(d->param),
               1);
    e->phase = keep;
    e->role = keep_role;
}

static void zero_reduce(Emit *e, const ModelTensorTable *tt, int block)
{
    const ModelDims *d = e->d;
    if (e->s->layout.zero < 2)
        return;
    block_comm(e, MODEL_OPR_BLOCK_GRADS, tt, block, MODEL_DP_REDUCE_SCATTER, d->zero_group,
               (double)px_round_up(tt->blocks[block].numel, (uint64_t)d->zero_group) *
                   (double)px_dtype_bytes(d->grad),
               1);
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
    block_comm(e, MODEL_OPR_BLOCK_SP_GRADS, tt, block, MODEL_TP_ALLREDUCE, d->t,
               (double)d->h * (1 + norm_bias) * (double)px_dtype_bytes(d->grad), norms);
}

static void layer_backward(Emit *e, const ModelTensorTable *tt, int block, int l)
{
    const ModelSpec *s = e->s;
    const ModelDims *d = e->d;
    const int t = d->t, sp = s->layout.sp;
    const double M = (double)d->b * d->s_loc, Msp = (double)d->b * d->s_sp, h = d->h, a = eb(e);
    const double nb = Msp * h * a;
    char n[64];
    e->layer = l;
    zero_gather(e, tt, block, MODEL_BWD);
    if (s->layout.recompute == MODEL_RECOMPUTE_FULL) {
        e->phase = MODEL_RECOMPUTE;
        layer_forward(e, l);
        e->phase = MODEL_BWD;
    }
    e->layer = l;
    at_layer(e, MODEL_OPR_FC2, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, h, d->ffn_loc, 2.0 * nb);
    at_layer(e, MODEL_OPR_ACT, l, n);
    simple(e, MODEL_OP_ACTIVATION, n, M * (2.0 * d->ffn_out_loc + d->ffn_loc) * a);
    at_layer(e, MODEL_OPR_FC1, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, d->ffn_out_loc, h, 0);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
    at_layer(e, MODEL_OPR_LN2, l, n);
    simple(e, MODEL_OP_NORM, n, 4.0 * nb);
    at_layer(e, MODEL_OPR_PROJ, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, h, d->q_loc, 2.0 * nb);
    at_layer(e, MODEL_OPR_CORE, l, n);
    double kv_full = (double)d->b * d->s * 2.0 * d->kv_width_loc * a;
    comm(e, n, MODEL_CP_ALL_GATHER, d->c, kv_full, 1);
    if (s->layout.recompute == MODEL_RECOMPUTE_SELECTIVE && !s->job.flash_attn) {
        e->phase = MODEL_RECOMPUTE;
        attention_core(e, n);
        e->phase = MODEL_BWD;
    }
    attention_core(e, n);
    comm(e, n, MODEL_CP_REDUCE_SCATTER, d->c, kv_full, 1);
    at_layer(e, MODEL_OPR_QKV, l, n);
    if (sp)
        comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
    linear(e, n, M, d->q_loc + 2.0 * d->kv_width_loc, h, 0);
    comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
    at_layer(e, MODEL_OPR_LN1, l, n);
    simple(e, MODEL_OP_NORM, n, 5.0 * nb); /* + the residual gradient */
    if (s->layout.zero >= 2)
        sp_norm_grads(e, tt, block, 2);
    zero_reduce(e, tt, block);
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
        zero_gather(e, tt, blk, MODEL_BWD);
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
        simple(e, MODEL_OP_NORM, at(e, MODEL_OPR_FINAL_LN), 2.0 * nb);
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
        zero_gather(e, tt, blk, MODEL_BWD);
        if (eblk >= 0)
            zero_gather(e, tt, eblk, MODEL_BWD);
        simple(e, MODEL_OP_LOSS, at(e, MODEL_OPR_LOSS), 2.0 * M * V * 4.0);
        const char *n = at(e, MODEL_OPR_LOGITS);
        if (sp)
            comm(e, n, MODEL_TP_ALL_GATHER, t, tp_act_bytes(e), 1);
        linear(e, n, M, V, h, M * V * (4.0 - a));
        comm(e, n, sp ? MODEL_TP_REDUCE_SCATTER : MODEL_TP_ALLREDUCE, t, tp_act_bytes(e), 1);
        simple(e, MODEL_OP_NORM, at(e, MODEL_OPR_FINAL_LN), 4.0 * nb);
        if (s->layout.zero >= 2)
            sp_norm_grads(e, tt, blk, 1);
        zero_reduce(e, tt, blk);
    }
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
    /* Megatron's scatter/gather: without SP each TP rank sends 1/t of the (replicated)
     * activation and the receivers all-gather it over the node's links (Narayanan 2021 Sec. 4.1) */
    const double pp_bytes = (double)d->b * d->s_sp * d->h * eb(&e) / d->pp_split;
    const double pp_gather = d->pp_split > 1 ? (double)d->b * d->s_sp * d->h * eb(&e) : 0;
    for (int j = 0; j < d->v; j++) {
        int gc = model_global_chunk(d, stage, j);
        int first = gc == 0, last = gc == d->chunks - 1;
        int l0, nl = model_chunk_layers(s, d, gc, &l0);
        const int rep = compact ? nl : 1;
        e.chunk = j;
        e.layer = -1;
        /* forward */
        e.phase = MODEL_FWD;
        if (!first) {
            comm(&e, at(&e, MODEL_OPR_PP), MODEL_PP_RECV, 2, pp_bytes, 1);
            if (pp_gather > 0)
                comm(&e, at(&e, MODEL_OPR_PP), MODEL_TP_ALL_GATHER, d->t, pp_gather, 1);
        } else {
            embed_pass(&e, &tt, j, 0);
        }
        for (int l = l0; l < l0 + nl; l += rep) {
            char bn[32];
            layer_name(bn, l, NULL);
            e.repeat = rep;
            e.layer = l;
            zero_gather(&e, &tt, block_index(&tt, bn, l, j), MODEL_FWD);
            layer_forward(&e, l);
            e.repeat = 1;
        }
        e.layer = -1;
        if (!last)
            comm(&e, at(&e, MODEL_OPR_PP), MODEL_PP_SEND, 2, pp_bytes, 1);
        else
            head_pass(&e, &tt, j, 0);
        /* backward */
        e.phase = MODEL_BWD;
        if (!last) {
            comm(&e, at(&e, MODEL_OPR_PP), MODEL_PP_RECV, 2, pp_bytes, 1);
            if (pp_gather > 0)
                comm(&e, at(&e, MODEL_OPR_PP), MODEL_TP_ALL_GATHER, d->t, pp_gather, 1);
        } else {
            head_pass(&e, &tt, j, 1);
        }
        for (int l = l0 + nl - 1; l >= l0; l -= rep) {
            int first_l = compact ? l0 : l; /* the compact table's representative */
            char bn[32];
            layer_name(bn, first_l, NULL);
            e.repeat = rep;
            layer_backward(&e, &tt, block_index(&tt, bn, first_l, j), first_l);
            e.repeat = 1;
        }
        e.layer = -1;
        if (!first)
            comm(&e, at(&e, MODEL_OPR_PP), MODEL_PP_SEND, 2, pp_bytes, 1);
        else
            embed_pass(&e, &tt, j, 1);
    }

    /* Per-step ops: gradient reduction by block, tied-embedding sync, optimizer, gathers. */
    e.per_mb = 0;
    e.phase = MODEL_STEP;
    const double ge = (double)px_dtype_bytes(d->grad), pe = (double)px_dtype_bytes(d->param);
    const int zero = s->layout.zero, zg = d->zero_group;
    for (int i = 0; i < tt.n_blocks; i++) {
        const ModelBlock *b = &tt.blocks[i];
        e.chunk = b->chunk;
        e.layer = b->layer;
        e.repeat = b->repeat;
        if (zero <= 1)
            sp_norm_grads(&e, &tt, i, b->layer >= 0 ? 2 : strcmp(b->name, "final") == 0 ? 1 : 0);
        if (zero == 0)
            block_comm(&e, MODEL_OPR_BLOCK_GRADS, &tt, i, MODEL_DP_ALLREDUCE, zg,
                       (double)b->numel * ge, 1);
        else if (zero == 1)
            block_comm(&e, MODEL_OPR_BLOCK_GRADS, &tt, i, MODEL_DP_REDUCE_SCATTER, zg,
                       (double)px_round_up(b->numel, (uint64_t)zg) * ge, 1);
    }
    e.repeat = 1;
    if (s->model.tied_embeddings && d->chunks > 1) {
        for (int j = 0; j < d->v; j++) {
            int gc = model_global_chunk(d, stage, j);
            if (gc == 0 || gc == d->chunks - 1) {
                e.chunk = j;
                e.layer = -1;
                /* found: the table gives the first chunk its embed block, the last its final */
                block_comm(&e, MODEL_OPR_BLOCK_GRADS, &tt,
                           block_index(&tt, gc == 0 ? "embed" : "final", -1, j),
                           MODEL_EMBED_ALLREDUCE, 2, (double)d->vocab_loc * d->h * ge, 1);
            }
        }
    }
    e.chunk = -1;
    e.layer = -1;
    e.repeat = 1;
    {
        /* AdamW per state element: read the gradient, read+write master (or the fp32 weight),
         * m and v, write the low-precision weight; SGD: gradient, weight, momentum. */
        double elems = 0, total = 0;
        for (int i = 0; i < tt.n_blocks; i++) {
            total += (double)tt.blocks[i].numel * tt.blocks[i].repeat;
            elems += (double)(zero >= 1 ? tt.blocks[i].shard_numel : tt.blocks[i].numel) *
                     tt.blocks[i].repeat;
        }
        double per = 0;
        switch (s->job.optimizer) {
        case MODEL_OPT_ADAMW: per = ge + 8.0 + 16.0 + (d->master ? pe : 0); break;
        case MODEL_OPT_SGD_MOMENTUM: per = ge + 8.0 + 8.0 + (d->master ? pe : 0); break;
        case MODEL_OPT_ADAM_8BIT: per = ge + 8.0 + 4.0 + (d->master ? pe : 0); break;
        }
        /* + one read of every local gradient for the gradient norm */
        simple(&e, MODEL_OP_OPTIMIZER, at(&e, MODEL_OPR_OPTIMIZER), elems * per + (zero >= 2 ? elems : total) * ge);
    }
    for (int i = 0; i < tt.n_blocks && (zero == 1 || zero == 2); i++) {
        const ModelBlock *b = &tt.blocks[i];
        e.chunk = b->chunk;
        e.layer = b->layer;
        e.repeat = b->repeat;
        block_comm(&e, MODEL_OPR_BLOCK_PARAMS, &tt, i, MODEL_DP_ALL_GATHER, zg,
                   (double)px_round_up(b->numel, (uint64_t)zg) * pe, 1);
    }
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
                                        "embedding", "loss", "optimizer", "comm"};
    return (unsigned)k < 8 ? names[k] : "?";
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
        snprintf(key->variant, sizeof key->variant, "hd%d", d->hd);
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
