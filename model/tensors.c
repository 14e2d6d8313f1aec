/* The tensor table of one pipeline stage: every tensor a rank of that stage holds.
 *
 * Saved activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
 * Transformer Models", Sec. 4, Table 2) term by term, so that with 2-byte activations, dropout
 * and no flash attention one layer holds s*b*h*(34 + 5*a*s/h) bytes; docs/memory.md derives
 * every entry. Norm statistics (mean, rstd) are recomputed in backward rather than saved. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    ModelTensorTable *tt; /* NULL: only sum the bytes */
    uint64_t sum;
    int chunk, layer, block, per_mb;
    int repeat;
    int unnamed; /* compact tables: sums only, no tensor records and no names */
    PxError *err;
    int rc;
} Adder;

/* What an FP8 tensor adds to add()'s: its scales' bytes, the parameter it copies, and its
 * experts' matrices. */
typedef struct {
    uint64_t scale_bytes;
    ModelTensorRole of;
    int groups;
} Fp8Extra;

static void add_ex(Adder *a, ModelTensorRole role, const char *name, ModelCategory cat, PxDtype dt,
                   int shard, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                   const Fp8Extra *x)
{
    int64_t dims[4] = {d0, d1, d2, d3};
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        numel *= (uint64_t)dims[i];
    uint64_t bytes = numel * px_dtype_bytes(dt) + (x ? x->scale_bytes : 0);
    const uint64_t weighted = bytes * (uint64_t)(a->repeat > 0 ? a->repeat : 1);
    a->sum += weighted;
    if (!a->tt || a->rc)
        return;
    a->tt->cat_bytes[cat] += weighted;
    if (a->unnamed)
        return;
    ModelTensorTable *tt = a->tt;
    if (tt->count == tt->cap) {
        int cap = tt->cap ? 2 * tt->cap : 64;
        ModelTensor *t = realloc(tt->t, (size_t)cap * sizeof *t);
        if (!t) {
            a->rc = px_fail(a->err, PX_ERUNTIME, "out of memory building the tensor table");
            return;
        }
        tt->t = t;
        tt->cap = cap;
    }
    ModelTensor *t = &tt->t[tt->count++];
    memset(t, 0, sizeof *t);
    px_strlcpy(t->name, name, sizeof t->name);
    t->role = role;
    t->cat = cat;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < 4; i++)
        t->shape[i] = i < ndim ? dims[i] : 1;
    t->numel = numel;
    t->bytes = bytes;
    t->chunk = a->chunk;
    t->layer = a->layer;
    t->block = a->block;
    t->per_microbatch = a->per_mb;
    t->shard = shard;
    t->repeat = a->repeat > 0 ? a->repeat : 1;
    t->scale_bytes = x ? x->scale_bytes : 0;
    t->of = x ? x->of : MODEL_TR_NONE;
    t->groups = x && x->groups > 1 ? x->groups : 1;
}

static void add(Adder *a, ModelTensorRole role, const char *name, ModelCategory cat, PxDtype dt,
                int shard, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    add_ex(a, role, name, cat, dt, shard, ndim, d0, d1, d2, d3, NULL);
}

/* Formats a tensor's name unless nothing keeps it: a compact table, or a sum without a table
 * (the adder `a` in scope). */
#define NAME(buf, ...)                                                                             \
    ((a)->unnamed || !(a)->tt ? (void)((buf)[0] = '\0') : (void)snprintf(buf, sizeof buf, __VA_ARGS__))

void model_layer_acts(const ModelSpec *s, const ModelDims *d, ModelRecompute mode,
                      ModelLayerAct out[MODEL_LAYER_ACTS])
{
    model_layer_acts_at(s, d, mode, -1, out);
}

/* One activation of the tables below. */
typedef struct {
    const char *suffix;
    PxDtype dt;
    int shard, ndim;
    int64_t d0, d1, d2, d3;
    int present, saved;
} ActRow;

static void acts_fill(const ActRow *t, int n, ModelTensorRole first, ModelLayerAct *out)
{
    for (int i = 0; i < n; i++) {
        ModelLayerAct *o = &out[i];
        memset(o, 0, sizeof *o);
        o->role = (ModelTensorRole)(first + i);
        o->suffix = t[i].suffix;
        o->dtype = t[i].dt;
        o->shard = t[i].shard;
        o->ndim = t[i].ndim;
        const int64_t dims[4] = {t[i].d0, t[i].d1, t[i].d2, t[i].d3};
        o->numel = 1;
        for (int k = 0; k < 4; k++) {
            o->shape[k] = k < o->ndim ? dims[k] : 1;
            if (k < o->ndim)
                o->numel *= (uint64_t)dims[k];
        }
        o->bytes = o->numel * px_dtype_bytes(o->dtype);
        o->present = t[i].present;
        o->saved = t[i].present && t[i].saved;
    }
}

/* Under FP8 training the inputs of FP8 GEMMs are saved in FP8 (Transformer Engine keeps the
 * quantized copy the weight gradient reads): entries of out whose role is listed become
 * matrices of their rows x last dimension, one byte each, with their scales. */
static void acts_fp8(const ModelSpec *s, ModelLayerAct *out, int n, const ModelTensorRole *roles,
                     int n_roles, int groups)
{
    if (s->job.fp8 == MODEL_FP8_NONE)
        return;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n_roles; k++) {
            const int64_t cols = out[i].shape[out[i].ndim - 1];
            if (out[i].role != roles[k] || cols <= 0) /* a dense model's MoE entries are empty */
                continue;
            const int64_t rows = (int64_t)(out[i].numel / (uint64_t)cols);
            out[i].dtype = PX_FP8;
            out[i].bytes = model_fp8_bytes(s->job.fp8, 0, rows, cols);
            /* one tensor per group: a scale of the whole tensor is one per group (row-wise
             * blocks split between the groups as they are) */
            if (groups > 1 && (s->job.fp8 == MODEL_FP8_DELAYED || s->job.fp8 == MODEL_FP8_TENSORWISE))
                out[i].bytes += (uint64_t)(groups - 1) * model_fp8_scale_bytes(s->job.fp8, 0, rows, cols);
        }
}

/* MXFP8 attention's second copy of Q, K, V in attn.qkv.out (model_fp8_attn_copies): column-wise,
 * each 32 positions of a sequence of one channel a block with its E8M0 scale (OCP MX v1.0). */
static void acts_fp8_attn_colwise(const ModelSpec *s, ModelLayerAct *out, int n)
{
    if (model_fp8_attn_copies(s) < 2 || !model_fp8_attn_saved(s))
        return;
    for (int i = 0; i < n; i++) {
        const ModelLayerAct *o = &out[i];
        if (o->role != MODEL_TR_QKV_OUT || o->numel == 0)
            continue;
        const uint64_t b = (uint64_t)o->shape[0], sl = (uint64_t)o->shape[1];
        const uint64_t cols = (uint64_t)o->shape[2];
        out[i].bytes += b * sl * cols + b * px_ceil_div(sl, 32) * cols;
    }
}

void model_moe_acts(const ModelSpec *s, const ModelDims *d, ModelRecompute mode,
                    ModelLayerAct out[MODEL_MOE_ACTS])
{
    const PxDtype e = d->act, f32 = PX_FP32;
    const int64_t T = d->tokens, k = s->model.moe.topk, E = s->model.moe.experts, R = d->routed;
    const int sv = mode != MODEL_RECOMPUTE_FULL, sp = s->layout.sp ? MODEL_SHARD_SP : 0;
    const int on = d->moe;
    /* the all-gather dispatcher (model_moe_allgather): the experts' outputs stay on the
     * expert rank, R rows before their weights; the n T tokens gathered over etp x ep keep
     * their routing to this rank's experts (the rest marked dropped) for the backward */
    const int ag = on && s->job.moe_dispatcher == MODEL_MOE_DISPATCH_ALLGATHER;
    const int64_t nT = T * d->ep * d->etp;
    const ActRow t[MODEL_MOE_ACTS] = {
        {"moe.router.probs", f32, sp, 2, T, E, 1, 1, on, sv},
        {"moe.route.idx", PX_INT32, sp, 2, T, k, 1, 1, on, sv},
        {"moe.route.w", f32, sp, 2, T, k, 1, 1, on, sv},
        {"moe.experts.fc1.in", e, MODEL_SHARD_EP, 2, R, d->h, 1, 1, on, sv},
        {"moe.experts.act.in", e, MODEL_SHARD_EP, 2, R, d->eff_out_loc, 1, 1, on, sv},
        {"moe.experts.fc2.in", e, MODEL_SHARD_EP, 2, R, d->eff_loc, 1, 1, on, sv},
        {"moe.experts.out", e, ag ? MODEL_SHARD_EP : sp, 2, ag ? R : T * k, d->h, 1, 1, on, sv},
        {"moe.ep.idx", PX_INT32, MODEL_SHARD_EP, 2, nT, k, 1, 1, ag, sv},
        {"moe.ep.w", f32, MODEL_SHARD_EP, 2, nT, k, 1, 1, ag, sv},
    };
    acts_fill(t, MODEL_MOE_ACTS, MODEL_TR_ROUTER_PROBS, out);
    /* the experts' GEMMs quantize each local expert's rows as a tensor of its own (Transformer
     * Engine's grouped GEMM: one scale per GEMM); a capacity's padding rows, after all the real
     * ones, are a GEMM and a tensor of their own per expert (exec/train/moe.c's segments) */
    static const ModelTensorRole fp8_in[] = {MODEL_TR_EXP_IN, MODEL_TR_EXP_FC2_IN};
    acts_fp8(s, out, MODEL_MOE_ACTS, fp8_in, 2,
             d->experts_loc * (s->model.moe.capacity_factor > 0 ? 2 : 1));
}

/* FP8 attention over Ulysses (cp_comm a2a, the fused core): the head-split Q, K, V the core
 * saves are the blocks the all-to-all brought, each sender's codes with its decode factor
 * (exec/train/cp.c's a2a_fp8; Transformer Engine saves the head-split FP8 Q, K, V): cp - 1
 * factors more than the one of a rank's own copy. */
static void fp8_attn_a2a(const ModelSpec *s, const ModelDims *d, ModelLayerAct *out)
{
    if (d->c < 2 || s->layout.cp_comm != MODEL_CP_COMM_A2A || !model_fp8_attn_codes(s))
        return;
    for (int i = 0; i < MODEL_LAYER_ACTS; i++)
        if (out[i].role == MODEL_TR_QKV_OUT && out[i].bytes > 0)
            out[i].bytes += (uint64_t)(d->c - 1) * model_fp8_scale_bytes(s->job.fp8, 0, 1, 1);
}

void model_layer_acts_at(const ModelSpec *s, const ModelDims *d, ModelRecompute mode, int layer,
                         ModelLayerAct out[MODEL_LAYER_ACTS])
{
    const PxDtype e = d->act, f32 = PX_FP32, u8 = PX_UINT8;
    const int64_t b = d->b, sl = d->s_loc, ss = d->s_sp, h = d->h, hl = d->heads_loc, sq = d->s;
    const int sp = s->layout.sp ? MODEL_SHARD_SP : 0, tp = MODEL_SHARD_TP;
    const int drop = s->job.dropout > 0.0, flash = s->job.flash_attn;
    /* full recompute keeps only the layer's input; selective drops the attention core's
     * s x s tensors (FlashAttention has none: its backward recomputes the scores itself) */
    const int full = mode == MODEL_RECOMPUTE_FULL, none = mode == MODEL_RECOMPUTE_NONE;
    /* a MoE layer's MLP is its shared experts (if any); the router reads fc1.in as well */
    const int moe = layer >= 0 && model_layer_is_moe(&s->model, layer);
    /* op-level selective recompute (model/ops.c's sac_op_recompute) re-creates the norms'
     * outputs and, in a dense layer, the activation's before the backward: not saved */
    const int op = d->recompute_op && mode == MODEL_RECOMPUTE_SELECTIVE, op_mlp = op && !moe;
    const int mlp = !moe || d->sff_loc > 0;
    const int64_t f_out = moe ? d->sff_out_loc : d->ffn_out_loc, f_in = moe ? d->sff_loc : d->ffn_loc;
    const ActRow t[MODEL_LAYER_ACTS] = {
        {"ln1.in", e, sp, 3, b, ss, h, 1, 1, 1},
        {"attn.qkv.in", e, sp, 3, b, ss, h, 1, 1, !full && !op},
        {"attn.qkv.out", e, tp, 3, b, sl, d->q_loc + d->kv2_loc, 1, 1, !full},
        {"attn.lse", f32, tp, 3, b, hl, sl, 1, flash, !full},
        {"attn.softmax", e, tp, 4, b, hl, sl, sq, !flash, none},
        {"attn.softmax_mask", u8, tp, 4, b, hl, sl, sq, !flash && drop, none},
        {"attn.softmax_drop", e, tp, 4, b, hl, sl, sq, !flash && drop, none},
        {"attn.proj.in", e, tp, 3, b, sl, d->o_loc, 1, 1, !full},
        {"attn.proj.in.fp8", e, tp, 3, b, sl, d->o_loc, 1, model_fp8_proj_in(s) == MODEL_FP8_PROJ_BOTH, !full},
        {"attn.drop_mask", u8, sp, 3, b, ss, h, 1, drop, !full},
        {"ln2.in", e, sp, 3, b, ss, h, 1, 1, !full},
        {"mlp.fc1.in", e, sp, 3, b, ss, h, 1, 1, !full && !op},
        {"mlp.act.in", e, tp, 3, b, sl, f_out, 1, mlp, !full},
        {"mlp.fc2.in", e, tp, 3, b, sl, f_in, 1, mlp, !full && !op_mlp},
        {"mlp.drop_mask", u8, sp, 3, b, ss, h, 1, drop, !full},
    };
    acts_fill(t, MODEL_LAYER_ACTS, MODEL_TR_LN1_IN, out);
    /* the attention projection's saved input as model_fp8_proj_in has it; FP8 attention's Q,
     * K, V and (delayed) output (model_fp8_attn_qkv, model_fp8_attn_out); a MoE layer's router
     * reads fc1.in too, in high precision (left out for a MoE layer) */
    const ModelFp8ProjIn pin = model_fp8_proj_in(s);
    ModelTensorRole fp8_in[6] = {MODEL_TR_QKV_IN, MODEL_TR_FC2_IN,
                                 pin == MODEL_FP8_PROJ_BOTH ? MODEL_TR_PROJ_IN_FP8
                                 : pin == MODEL_FP8_PROJ_FP8 ? MODEL_TR_PROJ_IN
                                                             : MODEL_TR_NONE};
    int n_in = 3; /* and at most one each of the three below */
    if (model_fp8_attn_saved(s)) /* MXFP8 with cp over the ring, the all-gather: 16-bit */
        fp8_in[n_in++] = MODEL_TR_QKV_OUT;
    if (model_fp8_attn_out(s))
        fp8_in[n_in++] = MODEL_TR_PROJ_IN;
    if (!moe)
        fp8_in[n_in++] = MODEL_TR_FC1_IN;
    acts_fp8(s, out, MODEL_LAYER_ACTS, fp8_in, n_in, 1);
    fp8_attn_a2a(s, d, out);
    acts_fp8_attn_colwise(s, out, MODEL_LAYER_ACTS);
}

enum { LAYER_ALL_ACTS = MODEL_LAYER_ACTS + MODEL_MOE_ACTS + MODEL_MLA_ACTS };

void model_mla_acts(const ModelSpec *s, const ModelDims *d, ModelRecompute mode,
                    ModelLayerAct out[MODEL_MLA_ACTS])
{
    const ModelMla *mla = &s->model.mla;
    const int sv = mode != MODEL_RECOMPUTE_FULL, on = mla->kv_lora_rank > 0;
    /* op-level selective recompute reruns kv_a (model_sac_op_matmuls: with a query latent the
     * layer's 2nd matmul; q_a, the 1st, never reruns) into the latent the backward reads: not
     * saved. Under SP the saved latent is the one gathered over TP, which the rerun (no
     * collective) does not re-create: saved. */
    const int op = d->recompute_op && mode == MODEL_RECOMPUTE_SELECTIVE && !(s->layout.sp && d->t > 1);
    const int kv_rerun = op && model_sac_op_matmuls(s, d, -1, MODEL_OPR_KV_A);
    const ActRow t[MODEL_MLA_ACTS] = {
        {"attn.q_lat", d->act, 0, 3, d->b, d->s_loc, mla->q_lora_rank, 1, on && mla->q_lora_rank > 0, sv},
        {"attn.kv_lat", d->act, 0, 3, d->b, d->s_loc, mla->kv_lora_rank + mla->qk_rope_dim, 1, on, sv && !kv_rerun},
    };
    acts_fill(t, MODEL_MLA_ACTS, MODEL_TR_Q_LAT, out);
}

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

void model_mla_work(const ModelSpec *s, const ModelDims *d, ModelMlaWork *out)
{
    memset(out, 0, sizeof *out);
    const ModelMla *m = &s->model.mla;
    if (m->kv_lora_rank <= 0)
        return;
    const uint64_t N = (uint64_t)d->b * (uint64_t)d->s_loc, R = (uint64_t)d->b * (uint64_t)d->s_sp;
    const uint64_t H = (uint64_t)d->heads_loc, qr = (uint64_t)m->q_lora_rank;
    const uint64_t kr = (uint64_t)m->kv_lora_rank, rope = (uint64_t)m->qk_rope_dim;
    const uint64_t lat = max_u64(qr, kr);
    out->lat = N * max_u64((H + 2) * rope, H * (uint64_t)m->qk_nope_dim);
    out->dkv = out->lat + N * lat;
    out->dq = out->dkv + N * (kr + rope);
    out->qs = out->dq + N * qr;
    out->ks = out->qs + R * qr;
    out->z = out->ks + R * (kr + rope);
    out->dl = out->z + R * lat;
    /* FP8's kv_b backward writes the latent's gradient whole before its blocks go to dkv */
    out->total = out->dl + (d->fp8 ? N * kr : 0);
    if (!s->layout.sp || d->t < 2)
        return;
    /* under SP it is also the scratch of a layer's one all-reduce of the gradients (fp32) its
     * TP ranks hold whole (model/ops.c's sp_norm_grads): the norms, the down-projections and
     * their norms, a MoE layer's router and shared gate; a prediction module's block adds its
     * enorm, hnorm and final norm (weights only) */
    const ModelConfig *c = &s->model;
    const uint64_t h = (uint64_t)d->h;
    uint64_t f = 2 * h * (c->norm == MODEL_LAYERNORM && c->bias ? 2 : 1) + qr * h + qr +
                 (kr + rope) * h + kr + (c->qk_norm ? 2 * (uint64_t)c->head_dim : 0);
    if (d->moe)
        f += (uint64_t)c->moe.experts * h + (c->moe.router_bias ? (uint64_t)c->moe.experts : 0) +
             (c->moe.shared_gate && c->moe.shared_ffn > 0 ? h : 0);
    if (c->mtp_layers > 0)
        f += 3 * h;
    const uint64_t es = px_dtype_bytes(d->act), need = (f * 4 + es - 1) / es;
    out->total = need > out->total ? need : out->total;
}

/* Every activation layer `layer` computes: model_layer_acts_at's, a MoE layer's
 * model_moe_acts, and multi-head latent attention's two latents (the query's and the keys' and
 * values', normed: the up-projections' inputs). Returns their count. */
static int layer_all_acts(const ModelSpec *s, const ModelDims *d, ModelRecompute mode, int layer,
                          ModelLayerAct out[LAYER_ALL_ACTS])
{
    model_layer_acts_at(s, d, mode, layer, out);
    int n = MODEL_LAYER_ACTS;
    if (layer >= 0 && model_layer_is_moe(&s->model, layer)) {
        model_moe_acts(s, d, mode, out + n);
        n += MODEL_MOE_ACTS;
    }
    if (s->model.mla.kv_lora_rank > 0) {
        model_mla_acts(s, d, mode, out + n);
        n += MODEL_MLA_ACTS;
    }
    return n;
}

/* Saved activations of one transformer layer for one micro-batch under recompute mode `mode`
 * (Korthikanti et al. 2022, Sec. 4, Table 2, term by term; docs/memory.md; a MoE layer's and
 * MLA's in docs/moe.md). */
static void layer_saved(Adder *a, const ModelSpec *s, const ModelDims *d, ModelRecompute mode,
                        int layer)
{
    char n[64];
    ModelLayerAct t[LAYER_ALL_ACTS];
    int count = layer_all_acts(s, d, mode, layer, t);
    for (int i = 0; i < count; i++) {
        if (!t[i].saved)
            continue;
        NAME(n, "layer.%d.%s", layer, t[i].suffix);
        const Fp8Extra x = {t[i].bytes - t[i].numel * px_dtype_bytes(t[i].dtype), MODEL_TR_NONE, 1};
        add_ex(a, t[i].role, n, MODEL_ACTIVATIONS, t[i].dtype, t[i].shard, t[i].ndim, t[i].shape[0],
               t[i].shape[1], t[i].shape[2], t[i].shape[3], &x);
    }
}

uint64_t model_layer_activation_bytes(const ModelSpec *s, const ModelDims *d)
{
    Adder a = {0};
    layer_saved(&a, s, d, s->layout.recompute, 0);
    return a.sum;
}

/* Bytes that a recomputation re-creates for one layer in backward: what the layer computes and
 * the recompute mode does not save (the attention core's s x s tensors under selective
 * recompute, nothing with flash attention; all but the layer's input under full recompute).
 * A model with MoE layers sizes it for the larger of a dense and a MoE layer. */
static uint64_t recompute_bytes(const ModelSpec *s, const ModelDims *d)
{
    uint64_t most = 0;
    int first_of[2] = {-1, -1}; /* the model's first dense and first MoE layer */
    for (int l = 0; l < s->model.layers; l++) {
        int k = model_layer_is_moe(&s->model, l);
        if (first_of[k] < 0)
            first_of[k] = l;
    }
    for (int kind = 0; kind < 2; kind++) {
        ModelLayerAct t[LAYER_ALL_ACTS];
        if (first_of[kind] < 0)
            continue;
        int count = layer_all_acts(s, d, s->layout.recompute, first_of[kind], t);
        uint64_t sum = 0;
        for (int i = 0; i < count; i++)
            if (t[i].present && !t[i].saved)
                sum += t[i].bytes;
        if (sum > most)
            most = sum;
    }
    return most;
}

void model_block_name(char *n, int layer)
{
    char digits[12];
    int k = 0;
    unsigned u = layer < 0 ? 0u : (unsigned)layer;
    do {
        digits[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u && k < (int)sizeof digits);
    memcpy(n, "layer.", 6);
    int at = 6;
    while (k > 0)
        n[at++] = digits[--k];
    n[at] = '\0';
}

static int add_block(ModelTensorTable *tt, const char *name, int chunk, int layer, int repeat,
                     PxError *err)
{
    if (tt->n_blocks == tt->blocks_cap) {
        int cap = tt->blocks_cap ? 2 * tt->blocks_cap : 16;
        ModelBlock *b = realloc(tt->blocks, (size_t)cap * sizeof *b);
        if (!b)
            return px_fail(err, PX_ERUNTIME, "out of memory building the tensor table");
        tt->blocks = b;
        tt->blocks_cap = cap;
    }
    ModelBlock *b = &tt->blocks[tt->n_blocks++];
    memset(b, 0, sizeof *b);
    px_strlcpy(b->name, name, sizeof b->name);
    b->chunk = chunk;
    b->layer = layer;
    b->repeat = repeat;
    return PX_OK;
}

/* An FP8 GEMM's weight of `groups` matrices of d0 / groups x d1 under FP8 training: its FP8
 * copy (unless it is the weight itself, --fp8-param-gather), the transposed copy where the
 * device or the recipe needs one, and delayed scaling's amax history of the three tensors each
 * of its GEMMs quantizes (input, weight, output gradient) with their scales as a last row.
 * The weights' copies exist where the weights do (ZeRO-3 casts gathered weights per use). */
static void add_fp8_copies(Adder *a, const ModelSpec *s, const ModelDims *d, ModelTensorRole role,
                           const char *name, int shard, int64_t d0, int64_t d1, int groups)
{
    const ModelFp8Recipe r = s->job.fp8;
    const int64_t rows = d0 / groups;
    char n[64];
    if (s->layout.zero < 3 && !s->job.fp8_param_gather) {
        const Fp8Extra x = {(uint64_t)groups * model_fp8_scale_bytes(r, 1, rows, d1), role, groups};
        NAME(n, "%s.fp8", name);
        add_ex(a, MODEL_TR_FP8_W, n, MODEL_WEIGHTS, PX_FP8, shard, 2, d0, d1, 0, 0, &x);
    }
    if (s->layout.zero < 3 && d->fp8_wt) {
        const Fp8Extra x = {(uint64_t)groups * model_fp8_scale_bytes(r, 1, d1, rows), role, groups};
        NAME(n, "%s.fp8_t", name);
        add_ex(a, MODEL_TR_FP8_WT, n, MODEL_WEIGHTS, PX_FP8, shard, 2, d1 * groups, rows, 0, 0, &x);
    }
    if (model_fp8_mx_gather_copies(s, d, MODEL_STEP) > 0) {
        /* MXFP8 under ZeRO-3: the whole weight's E8M0 scales of both copies on every rank (the
         * MXFP8Tensor parameter's rowwise and columnwise scale_inv, Transformer Engine's
         * tensor/utils.py computing them from the all-reduced block amaxes); its elements are
         * the shard's (w_shard) */
        const Fp8Extra x = {0, role, groups}; /* the executor binds it to its weight */
        NAME(n, "%s.fp8_scales", name);
        add_ex(a, MODEL_TR_FP8_MX_SCALES, n, MODEL_WEIGHTS, PX_UINT8, shard, 1,
               (int64_t)groups * (int64_t)(model_fp8_scale_bytes(r, 1, rows, d1) +
                                           model_fp8_scale_bytes(r, 1, d1, rows)),
               0, 0, 0, &x);
    }
    if (r == MODEL_FP8_DELAYED) {
        /* the experts' fc1 holds the dispatched rows' history too (model_fp8_dispatch_history),
         * the QKV weight (MLA's kv_b) FP8 attention's (model_fp8_attn_history) */
        const int disp = role == MODEL_TR_EXP_FC1_W && model_fp8_dispatch_history(s, d);
        const int core = role == model_fp8_attn_weight(s) ? model_fp8_attn_history(s) : 0;
        const Fp8Extra x = {0, role, groups};
        NAME(n, "%s.fp8_amax", name);
        add_ex(a, MODEL_TR_FP8_AMAX, n, MODEL_WEIGHTS, PX_FP32, 0, 2, s->job.fp8_amax_history + 1,
               3 * groups + disp + core, 0, 0, &x);
    }
}

/* One parameter with its gradient (when gradients are not sharded); an FP8 GEMM's weight of
 * `groups` matrices (a MoE layer's experts) with its FP8 copies. */
static void add_param_g(Adder *a, const ModelSpec *s, const ModelDims *d, ModelTensorRole role,
                        const char *name, int shard, int ndim, int64_t d0, int64_t d1, int groups)
{
    ModelTensorTable *tt = a->tt;
    uint64_t numel = (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1);
    const int fp8 = ndim == 2 && model_fp8_weight(s, role);
    tt->blocks[a->block].numel += numel;
    if (fp8) {
        ModelFp8Scaling sc;
        model_fp8_scaling(s->job.fp8, 1, d0 / groups, d1, &sc);
        tt->blocks[a->block].fp8_numel += numel;
        tt->blocks[a->block].fp8_weights += groups;
        tt->blocks[a->block].fp8_scales += groups * (int)(((d0 / groups + sc.block_r - 1) / sc.block_r) *
                                                          ((d1 + sc.block_c - 1) / sc.block_c));
        if (s->job.fp8 == MODEL_FP8_MXFP8) /* the column-wise copy's 32 x 1 blocks */
            tt->blocks[a->block].fp8_scales += groups * (int)((d0 / groups + 31) / 32 * d1);
    }
    tt->params += numel * (uint64_t)a->repeat;
    if (s->layout.zero < 3 && fp8 && s->job.fp8_param_gather) {
        const Fp8Extra x = {(uint64_t)groups * model_fp8_scale_bytes(s->job.fp8, 1, d0 / groups, d1),
                            MODEL_TR_NONE, groups};
        add_ex(a, role, name, MODEL_WEIGHTS, PX_FP8, shard, ndim, d0, d1, 0, 0, &x);
    } else if (s->layout.zero < 3) {
        add(a, role, name, MODEL_WEIGHTS, d->param, shard, ndim, d0, d1, 0, 0);
    }
    if (fp8)
        add_fp8_copies(a, s, d, role, name, shard, d0, d1, groups);
    /* unsharded gradients: without ZeRO-2/3, or under a pipeline where they accumulate whole
     * over the stage's micro-batches before the step's reduce-scatter */
    if (s->layout.zero < 2 || d->zero_per_step) {
        char g[64];
        NAME(g, "%s.grad", name);
        add(a, role, g, MODEL_GRADS, d->grad, shard, ndim, d0, d1, 0, 0);
    }
}

static void add_param(Adder *a, const ModelSpec *s, const ModelDims *d, ModelTensorRole role,
                      const char *name, int shard, int ndim, int64_t d0, int64_t d1)
{
    add_param_g(a, s, d, role, name, shard, ndim, d0, d1, 1);
}

/* Attention's parameters: the QKV projection (or multi-head latent attention's down- and
 * up-projections with their norms), the sinks, the output projection. */
static void add_attention_params(Adder *a, const ModelSpec *s, const ModelDims *d, int layer)
{
    const ModelConfig *c = &s->model;
    const ModelMla *mla = &c->mla;
    const int64_t h = d->h;
    const int qkv_bias = c->bias || c->qkv_bias;
    char n[64];
    if (mla->kv_lora_rank > 0) {
        /* Megatron-Core's MLA: the down-projections and their norms are replicated over TP,
         * the up-projections split by heads */
        const int64_t qr = mla->q_lora_rank, kr = mla->kv_lora_rank, rope = mla->qk_rope_dim;
        if (qr > 0) {
            NAME(n, "layer.%d.attn.q_a.w", layer);
            add_param(a, s, d, MODEL_TR_Q_A_W, n, 0, 2, qr, h);
            NAME(n, "layer.%d.attn.q_norm.w", layer);
            add_param(a, s, d, MODEL_TR_Q_NORM_W, n, 0, 1, qr, 0);
        }
        NAME(n, "layer.%d.attn.q_b.w", layer);
        add_param(a, s, d, MODEL_TR_Q_B_W, n, MODEL_SHARD_TP, 2, d->q_loc, qr > 0 ? qr : h);
        NAME(n, "layer.%d.attn.kv_a.w", layer);
        add_param(a, s, d, MODEL_TR_KV_A_W, n, 0, 2, kr + rope, h);
        NAME(n, "layer.%d.attn.kv_norm.w", layer);
        add_param(a, s, d, MODEL_TR_KV_NORM_W, n, 0, 1, kr, 0);
        NAME(n, "layer.%d.attn.kv_b.w", layer);
        add_param(a, s, d, MODEL_TR_KV_B_W, n, MODEL_SHARD_TP, 2,
                  (int64_t)d->heads_loc * (mla->qk_nope_dim + mla->v_dim), kr);
    } else {
        int64_t qkv = d->q_loc + d->kv2_loc;
        NAME(n, "layer.%d.attn.qkv.w", layer);
        add_param(a, s, d, MODEL_TR_QKV_W, n, MODEL_SHARD_TP, 2, qkv, h);
        if (qkv_bias) {
            NAME(n, "layer.%d.attn.qkv.b", layer);
            add_param(a, s, d, MODEL_TR_QKV_B, n, MODEL_SHARD_TP, 1, qkv, 0);
        }
        if (c->qk_norm) {
            NAME(n, "layer.%d.attn.q_norm.w", layer);
            add_param(a, s, d, MODEL_TR_QN_W, n, 0, 1, c->head_dim, 0);
            NAME(n, "layer.%d.attn.k_norm.w", layer);
            add_param(a, s, d, MODEL_TR_KN_W, n, 0, 1, c->head_dim, 0);
        }
    }
    if (c->attn_sinks) {
        NAME(n, "layer.%d.attn.sinks", layer);
        add_param(a, s, d, MODEL_TR_SINKS, n, MODEL_SHARD_TP, 1, d->heads_loc, 0);
    }
    NAME(n, "layer.%d.attn.proj.w", layer);
    add_param(a, s, d, MODEL_TR_PROJ_W, n, MODEL_SHARD_TP, 2, h, d->o_loc);
    if (c->bias || c->proj_bias) {
        NAME(n, "layer.%d.attn.proj.b", layer);
        add_param(a, s, d, MODEL_TR_PROJ_B, n, 0, 1, h, 0);
    }
}

/* A layer's parameters but a MoE layer's routed experts (add_expert_params): norms, attention,
 * and the MLP, which in a MoE layer is the router with the shared experts. A prediction
 * module's layer (layer >= layers) also holds the module's norms and eh projection. */
static void add_layer_params(Adder *a, const ModelSpec *s, const ModelDims *d, int layer)
{
    const ModelConfig *c = &s->model;
    const int64_t h = d->h;
    const int norm_bias = c->norm == MODEL_LAYERNORM && c->bias;
    const int moe = model_layer_is_moe(c, layer);
    char n[64];
    if (layer >= c->layers) {
        NAME(n, "layer.%d.mtp.enorm.w", layer);
        add_param(a, s, d, MODEL_TR_MTP_ENORM_W, n, 0, 1, h, 0);
        NAME(n, "layer.%d.mtp.hnorm.w", layer);
        add_param(a, s, d, MODEL_TR_MTP_HNORM_W, n, 0, 1, h, 0);
        NAME(n, "layer.%d.mtp.eh.w", layer);
        add_param(a, s, d, MODEL_TR_MTP_EH_W, n, MODEL_SHARD_TP, 2, (h + d->t - 1) / d->t, 2 * h);
        NAME(n, "layer.%d.mtp.norm.w", layer);
        add_param(a, s, d, MODEL_TR_MTP_NORM_W, n, 0, 1, h, 0);
    }
    NAME(n, "layer.%d.ln1.w", layer);
    add_param(a, s, d, MODEL_TR_LN1_W, n, 0, 1, h, 0);
    if (norm_bias) {
        NAME(n, "layer.%d.ln1.b", layer);
        add_param(a, s, d, MODEL_TR_LN1_B, n, 0, 1, h, 0);
    }
    add_attention_params(a, s, d, layer);
    NAME(n, "layer.%d.ln2.w", layer);
    add_param(a, s, d, MODEL_TR_LN2_W, n, 0, 1, h, 0);
    if (norm_bias) {
        NAME(n, "layer.%d.ln2.b", layer);
        add_param(a, s, d, MODEL_TR_LN2_B, n, 0, 1, h, 0);
    }
    const int64_t f_out = moe ? d->sff_out_loc : d->ffn_out_loc, f_in = moe ? d->sff_loc : d->ffn_loc;
    if (moe) {
        const ModelMoe *m = &c->moe;
        NAME(n, "layer.%d.moe.router.w", layer);
        add_param(a, s, d, MODEL_TR_ROUTER_W, n, 0, 2, m->experts, h);
        if (m->router_bias) {
            NAME(n, "layer.%d.moe.router.b", layer);
            add_param(a, s, d, MODEL_TR_ROUTER_B, n, 0, 1, m->experts, 0);
        }
        if (m->shared_gate && f_in > 0) {
            NAME(n, "layer.%d.moe.shared_gate.w", layer);
            add_param(a, s, d, MODEL_TR_SHARED_GATE_W, n, 0, 1, h, 0);
        }
    }
    if (f_in == 0)
        return;
    NAME(n, "layer.%d.mlp.fc1.w", layer);
    add_param(a, s, d, MODEL_TR_FC1_W, n, MODEL_SHARD_TP, 2, f_out, h);
    if (c->bias) {
        NAME(n, "layer.%d.mlp.fc1.b", layer);
        add_param(a, s, d, MODEL_TR_FC1_B, n, MODEL_SHARD_TP, 1, f_out, 0);
    }
    NAME(n, "layer.%d.mlp.fc2.w", layer);
    add_param(a, s, d, MODEL_TR_FC2_W, n, MODEL_SHARD_TP, 2, h, f_in);
    if (c->bias) {
        NAME(n, "layer.%d.mlp.fc2.b", layer);
        add_param(a, s, d, MODEL_TR_FC2_B, n, 0, 1, h, 0);
    }
}

/* A MoE layer's routed experts on this rank: experts_loc experts, each's matrices split over
 * etp ranks, held as [experts_loc x rows, cols] (block "layer.<l>.experts"). */
static void add_expert_params(Adder *a, const ModelSpec *s, const ModelDims *d, int layer)
{
    const int64_t h = d->h, E = d->experts_loc;
    const int shard = MODEL_SHARD_EP | (d->etp > 1 ? MODEL_SHARD_TP : 0);
    char n[64];
    NAME(n, "layer.%d.moe.experts.fc1.w", layer);
    add_param_g(a, s, d, MODEL_TR_EXP_FC1_W, n, shard, 2, E * d->eff_out_loc, h, (int)E);
    if (s->model.moe.expert_bias) {
        NAME(n, "layer.%d.moe.experts.fc1.b", layer);
        add_param(a, s, d, MODEL_TR_EXP_FC1_B, n, shard, 1, E * d->eff_out_loc, 0);
    }
    NAME(n, "layer.%d.moe.experts.fc2.w", layer);
    add_param_g(a, s, d, MODEL_TR_EXP_FC2_W, n, shard, 2, E * h, d->eff_loc, (int)E);
    if (s->model.moe.expert_bias) {
        NAME(n, "layer.%d.moe.experts.fc2.b", layer);
        add_param(a, s, d, MODEL_TR_EXP_FC2_B, n, MODEL_SHARD_EP, 1, E * h, 0);
    }
}

/* Sharded gradients, master weights and optimizer state of one block. */
static void add_block_states(Adder *a, const ModelSpec *s, const ModelDims *d, ModelBlock *blk)
{
    const int zero = s->layout.zero;
    const int dp_shard = zero >= 1 ? MODEL_SHARD_DP : 0;
    blk->group = blk->experts ? d->edp : d->zero_group;
    blk->shard_numel = px_ceil_div(blk->numel, (uint64_t)blk->group);
    int64_t n_state = (int64_t)(zero >= 1 ? blk->shard_numel : blk->numel);
    char n[64];
    if (zero == 3) {
        NAME(n, "%s.w_shard", blk->name);
        add(a, MODEL_TR_W_SHARD, n, MODEL_WEIGHTS, d->param, MODEL_SHARD_DP, 1, (int64_t)blk->shard_numel, 0, 0, 0);
    }
    if (zero >= 2) {
        NAME(n, "%s.grad_shard", blk->name);
        add(a, MODEL_TR_GRAD_SHARD, n, MODEL_GRADS, d->grad, MODEL_SHARD_DP, 1, (int64_t)blk->shard_numel, 0, 0, 0);
    }
    if (d->master) {
        NAME(n, "%s.master", blk->name);
        add(a, MODEL_TR_MASTER, n, MODEL_MASTER, PX_FP32, dp_shard, 1, n_state, 0, 0, 0);
    }
    switch (s->job.optimizer) {
    case MODEL_OPT_ADAMW:
        NAME(n, "%s.adam_m", blk->name);
        add(a, MODEL_TR_ADAM_M, n, MODEL_OPTIMIZER, PX_FP32, dp_shard, 1, n_state, 0, 0, 0);
        NAME(n, "%s.adam_v", blk->name);
        add(a, MODEL_TR_ADAM_V, n, MODEL_OPTIMIZER, PX_FP32, dp_shard, 1, n_state, 0, 0, 0);
        break;
    case MODEL_OPT_SGD_MOMENTUM:
        NAME(n, "%s.momentum", blk->name);
        add(a, MODEL_TR_MOMENTUM, n, MODEL_OPTIMIZER, PX_FP32, dp_shard, 1, n_state, 0, 0, 0);
        break;
    case MODEL_OPT_ADAM_8BIT:
        /* Dettmers et al. 2022 (8-bit Optimizers via Block-wise Quantization): one byte per
         * state and an fp32 absmax per block of MODEL_ADAM8_BLOCK (2048) values. */
        NAME(n, "%s.adam8_m", blk->name);
        add(a, MODEL_TR_ADAM8_M, n, MODEL_OPTIMIZER, PX_UINT8, dp_shard, 1, n_state, 0, 0, 0);
        NAME(n, "%s.adam8_v", blk->name);
        add(a, MODEL_TR_ADAM8_V, n, MODEL_OPTIMIZER, PX_UINT8, dp_shard, 1, n_state, 0, 0, 0);
        NAME(n, "%s.adam8_absmax", blk->name);
        add(a, MODEL_TR_ADAM8_ABSMAX, n, MODEL_OPTIMIZER, PX_FP32, dp_shard, 2, 2, (int64_t)px_ceil_div((uint64_t)n_state, MODEL_ADAM8_BLOCK),
            0, 0);
        break;
    }
}

/* A compact table stands for a chunk's layers by kind: its dense layers as one block, its MoE
 * layers as one (with one for their experts), each the first of its kind with repeat = their
 * count; a prediction module's layer stands alone. Chunks with as many layers of a kind add
 * the same bytes: the first one is added tensor by tensor and its sums are replayed. */
typedef struct {
    uint64_t sum, cat[MODEL_CAT_COUNT], params;
} Snapshot;

typedef struct {
    Snapshot delta;
    uint64_t numel, fp8_numel; /* the block's own counts (parameters, of them FP8 GEMMs') */
    int fp8_weights;           /* and its FP8 GEMM weight matrices */
    int fp8_scales;            /* and their scales */
} Replay;

enum { KIND_DENSE = 0, KIND_MOE, KIND_EXPERTS, KIND_COUNT };

typedef struct {
    int nl[KIND_COUNT], act_nl[KIND_COUNT]; /* layers of the kind recorded, -1: none */
    Replay params[KIND_COUNT], acts[KIND_COUNT], states;
    uint64_t state_numel, state_shard; /* the layer block whose states are recorded */
    int state_repeat, state_experts;
} Reuse;

static void snapshot(const Adder *a, Snapshot *s)
{
    s->sum = a->sum;
    memcpy(s->cat, a->tt->cat_bytes, sizeof s->cat);
    s->params = a->tt->params;
}

static void reuse_record(const Adder *a, const Snapshot *before, Replay *r, uint64_t numel,
                         uint64_t fp8_numel)
{
    r->fp8_numel = fp8_numel;
    r->delta.sum = a->sum - before->sum;
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        r->delta.cat[c] = a->tt->cat_bytes[c] - before->cat[c];
    r->delta.params = a->tt->params - before->params;
    r->numel = numel;
}

static void reuse_apply(Adder *a, const Replay *r, uint64_t *numel, uint64_t *fp8_numel)
{
    if (fp8_numel)
        *fp8_numel += r->fp8_numel;
    a->sum += r->delta.sum;
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        a->tt->cat_bytes[c] += r->delta.cat[c];
    a->tt->params += r->delta.params;
    if (numel)
        *numel += r->numel;
}

/* What tensors_build adds: the parameter half (parameters, their states, ZeRO's buffers) and
 * the activation half (saved activations, workspace, pipeline / SP / CP buffers). */
enum { PART_PARAMS = 1, PART_ACTS = 2, PART_ALL = 3 };

/* What the phases of tensors_build share: the spec, the stage, the adder and the sums a compact
 * table replays for chunks alike. */
typedef struct {
    const ModelSpec *s;
    const ModelDims *d;
    int stage, compact;
    ModelTensorTable *tt;
    Adder a;
    Reuse reuse;
    int has_data, has_loss, has_moe;
} Build;

int model_chunk_runs(const ModelSpec *s, const ModelDims *d, int gc, int compact,
                     ModelLayerRun *out, int cap)
{
    int l0, nl = model_chunk_layers(s, d, gc, &l0);
    int n = 0;
    if (compact) {
        int first[2] = {-1, -1}, count[2] = {0, 0};
        for (int l = l0; l < l0 + nl; l++) {
            int k = model_layer_is_moe(&s->model, l);
            if (first[k] < 0)
                first[k] = l;
            count[k]++;
        }
        for (int k = 0; k < 2; k++)
            if (count[k] > 0 && n < cap)
                out[n++] = (ModelLayerRun){first[k], count[k], k};
    } else {
        for (int l = l0; l < l0 + nl && n < cap; l++)
            out[n++] = (ModelLayerRun){l, 1, model_layer_is_moe(&s->model, l)};
    }
    if (gc == d->mtp_chunk)
        for (int i = 0; i < s->model.mtp_layers && n < cap; i++) {
            int l = s->model.layers + i;
            out[n++] = (ModelLayerRun){l, 1, model_layer_is_moe(&s->model, l)};
        }
    return n;
}

int model_chunk_runs_count(const ModelSpec *s, const ModelDims *d, int gc, int compact)
{
    int l0, nl = model_chunk_layers(s, d, gc, &l0);
    int mtp = gc == d->mtp_chunk ? s->model.mtp_layers : 0;
    return (compact ? 2 : nl) + mtp;
}

/* Adds one block of a kind standing for `rep` layers from layer l: replayed when the kind was
 * recorded with as many layers (compact), else added tensor by tensor. */
static int add_kind_block(Build *B, int j, int l, int rep, int kind, int mtp, PxError *err)
{
    Adder *a = &B->a;
    ModelTensorTable *tt = B->tt;
    char n[32];
    if (kind == KIND_EXPERTS)
        snprintf(n, sizeof n, "layer.%d.experts", l);
    else
        model_block_name(n, l); /* block names are always kept: ops find blocks by them */
    int rc = add_block(tt, n, j, l, rep, err);
    if (rc)
        return rc;
    tt->blocks[tt->n_blocks - 1].experts = kind == KIND_EXPERTS;
    a->block = tt->n_blocks - 1;
    a->layer = l;
    a->repeat = rep;
    if (B->compact && !mtp && B->reuse.nl[kind] == rep) {
        reuse_apply(a, &B->reuse.params[kind], &tt->blocks[a->block].numel,
                    &tt->blocks[a->block].fp8_numel);
        tt->blocks[a->block].fp8_weights += B->reuse.params[kind].fp8_weights;
        tt->blocks[a->block].fp8_scales += B->reuse.params[kind].fp8_scales;
    } else {
        Snapshot before;
        snapshot(a, &before);
        if (kind == KIND_EXPERTS)
            add_expert_params(a, B->s, B->d, l);
        else
            add_layer_params(a, B->s, B->d, l);
        if (!mtp) {
            B->reuse.nl[kind] = rep;
            reuse_record(a, &before, &B->reuse.params[kind], tt->blocks[a->block].numel,
                         tt->blocks[a->block].fp8_numel);
            B->reuse.params[kind].fp8_weights = tt->blocks[a->block].fp8_weights;
            B->reuse.params[kind].fp8_scales = tt->blocks[a->block].fp8_scales;
        }
    }
    a->repeat = 1;
    return PX_OK;
}

/* A chunk's layer blocks: one per layer (and one per MoE layer's experts), or (compact) one per
 * kind standing for the chunk's layers of that kind. */
static int add_layer_blocks(Build *B, int j, int g, PxError *err)
{
    const int cap = model_chunk_runs_count(B->s, B->d, g, B->compact);
    ModelLayerRun stack[8], *runs = cap <= 8 ? stack : malloc((size_t)cap * sizeof *runs);
    if (!runs)
        return px_fail(err, PX_ERUNTIME, "out of memory building the tensor table");
    int n = model_chunk_runs(B->s, B->d, g, B->compact, runs, cap), rc = PX_OK;
    for (int i = 0; i < n && !rc; i++) {
        const int mtp = runs[i].first >= B->s->model.layers;
        rc = add_kind_block(B, j, runs[i].first, runs[i].count, runs[i].moe ? KIND_MOE : KIND_DENSE,
                            mtp, err);
        if (!rc && runs[i].moe)
            rc = add_kind_block(B, j, runs[i].first, runs[i].count, KIND_EXPERTS, mtp, err);
    }
    if (runs != stack)
        free(runs);
    return rc;
}

/* Parameters, block by block, chunk by chunk: the embedding on the first chunk, the layers,
 * the final norm and output layer on the last. */
static int add_parameters(Build *B, PxError *err)
{
    const ModelSpec *s = B->s;
    const ModelDims *d = B->d;
    const ModelConfig *c = &s->model;
    const int64_t h = d->h;
    Adder *a = &B->a;
    ModelTensorTable *tt = B->tt;
    int rc;
    for (int j = 0; j < d->v; j++) {
        int g = model_global_chunk(d, B->stage, j);
        int first = g == 0, last = g == d->chunks - 1;
        a->chunk = j;
        if (first) {
            if ((rc = add_block(tt, "embed", j, -1, 1, err)))
                return rc;
            a->block = tt->n_blocks - 1;
            a->layer = -1;
            add_param(a, s, d, MODEL_TR_WTE, "embed.wte", MODEL_SHARD_TP, 2, d->vocab_loc, h);
            if (c->position == MODEL_POS_LEARNED)
                add_param(a, s, d, MODEL_TR_WPE, "embed.wpe", 0, 2, c->seq_len, h);
        }
        if ((rc = add_layer_blocks(B, j, g, err)))
            return rc;
        if (last) {
            if ((rc = add_block(tt, "final", j, -1, 1, err)))
                return rc;
            a->block = tt->n_blocks - 1;
            a->layer = -1;
            add_param(a, s, d, MODEL_TR_FINAL_LN_W, "final_ln.w", 0, 1, h, 0);
            if (c->norm == MODEL_LAYERNORM && c->bias)
                add_param(a, s, d, MODEL_TR_FINAL_LN_B, "final_ln.b", 0, 1, h, 0);
            /* A tied output layer shares embed.wte when both live on this chunk; on another
             * stage it is a copy whose gradient is all-reduced with the first stage's. */
            if (!c->tied_embeddings || !first)
                add_param(a, s, d, MODEL_TR_LOGITS_W, "logits.w", MODEL_SHARD_TP, 2, d->vocab_loc, h);
            /* the prediction modules embed the next tokens: away from the first stage an untied
             * model keeps a copy of the embedding (a tied one's output layer is that copy) */
            if (c->mtp_layers > 0 && g == d->mtp_chunk && !first && !c->tied_embeddings)
                add_param(a, s, d, MODEL_TR_WTE, "mtp.wte", MODEL_SHARD_TP, 2, d->vocab_loc, h);
        } else if (c->mtp_layers > 0 && g == d->mtp_chunk && B->stage != 0) {
            /* a standalone MTP stage: its own copy of the embedding, tied or not, whose gradient
             * is summed with the first stage's as the output layer's copy is (on the first
             * pipeline rank, a later chunk with vpp > 1 too, they read embed.wte itself) */
            if ((rc = add_block(tt, "mtp.embed", j, -1, 1, err)))
                return rc;
            a->block = tt->n_blocks - 1;
            a->layer = -1;
            add_param(a, s, d, MODEL_TR_WTE, "mtp.wte", MODEL_SHARD_TP, 2, d->vocab_loc, h);
        }
    }
    a->chunk = -1;
    a->layer = -1;
    return PX_OK;
}

/* Every block's sharded gradients, master weights and optimizer state (a compact table's
 * layer blocks replayed when alike). */
static void add_states(Build *B)
{
    Adder *a = &B->a;
    Reuse *reuse = &B->reuse;
    ModelTensorTable *tt = B->tt;
    for (int i = 0; i < tt->n_blocks; i++) {
        ModelBlock *blk = &tt->blocks[i];
        a->block = i;
        a->repeat = blk->repeat;
        if (B->compact && blk->layer >= 0 && reuse->state_numel == blk->numel &&
            reuse->state_repeat == blk->repeat && reuse->state_experts == blk->experts) {
            blk->group = blk->experts ? B->d->edp : B->d->zero_group;
            blk->shard_numel = reuse->state_shard;
            reuse_apply(a, &reuse->states, NULL, NULL);
        } else {
            Snapshot before;
            snapshot(a, &before);
            add_block_states(a, B->s, B->d, blk);
            if (B->compact && blk->layer >= 0) {
                reuse->state_numel = blk->numel;
                reuse->state_repeat = blk->repeat;
                reuse->state_shard = blk->shard_numel;
                reuse->state_experts = blk->experts;
                reuse_record(a, &before, &reuse->states, 0, 0);
            }
        }
    }
    a->block = -1;
    a->repeat = 1;
}

/* Saved activations, one set per (chunk, micro-batch) in flight: the embedding's dropout mask,
 * the layers' (model_layer_acts), the output layer's inputs and the fp32 probabilities. */
static void add_activations(Build *B)
{
    const ModelSpec *s = B->s;
    const ModelDims *d = B->d;
    const int64_t h = d->h, b = d->b;
    const int sp = s->layout.sp ? MODEL_SHARD_SP : 0;
    Adder *a = &B->a;
    ModelTensorTable *tt = B->tt;
    a->per_mb = 1;
    for (int j = 0; j < d->v; j++) {
        int g = model_global_chunk(d, B->stage, j);
        uint64_t before = a->sum;
        a->chunk = j;
        if (g == 0) {
            B->has_data = 1;
            if (s->job.dropout > 0.0)
                add(a, MODEL_TR_EMBED_DROP_MASK, "embed.drop_mask", MODEL_ACTIVATIONS, PX_UINT8, sp, 3,
                    b, d->s_sp, h, 0);
        }
        uint64_t before_layers = a->sum;
        const int cap = model_chunk_runs_count(s, d, g, B->compact);
        ModelLayerRun stack[8], *runs = cap <= 8 ? stack : malloc((size_t)cap * sizeof *runs);
        if (!runs) {
            a->rc = px_fail(a->err, PX_ERUNTIME, "out of memory building the tensor table");
            break;
        }
        const int nr = model_chunk_runs(s, d, g, B->compact, runs, cap);
        for (int i = 0; i < nr; i++) {
            const int l = runs[i].first, rep = runs[i].count, k = runs[i].moe;
            const int mtp = l >= s->model.layers;
            B->has_moe |= k;
            a->layer = l;
            a->repeat = rep;
            if (B->compact && !mtp && B->reuse.act_nl[k] == rep) {
                reuse_apply(a, &B->reuse.acts[k], NULL, NULL);
            } else {
                Snapshot snap;
                snapshot(a, &snap);
                layer_saved(a, s, d, s->layout.recompute, l);
                if (mtp) {
                    /* the module's input: the shifted tokens' normed embedding beside the
                     * normed hidden state */
                    char n[64];
                    NAME(n, "layer.%d.mtp.eh.in", l);
                    add(a, MODEL_TR_MTP_EH_IN, n, MODEL_ACTIVATIONS, d->act, sp, 3, b, d->s_sp, 2 * h, 0);
                } else {
                    B->reuse.act_nl[k] = rep;
                    reuse_record(a, &snap, &B->reuse.acts[k], 0, 0);
                }
            }
            a->repeat = 1;
        }
        if (runs != stack)
            free(runs);
        tt->act_layer_bytes[j] = a->sum - before_layers;
        a->layer = -1;
        const int mtp_alone = g == d->mtp_chunk && g != d->chunks - 1;
        /* there the first module's hnorm reads the main hidden state, which it keeps for its
         * backward as the loss stage keeps final_ln.in (autograd's saved input in Megatron-Core) */
        if (mtp_alone && s->model.mtp_layers > 0) {
            add(a, MODEL_TR_FINAL_LN_IN, "mtp.hidden", MODEL_ACTIVATIONS, d->act, sp, 3, b, d->s_sp, h, 0);
            B->has_data = 1; /* the modules embed the tokens on */
        }
        for (int i = 0; i < s->model.mtp_layers && mtp_alone; i++) {
            /* a standalone MTP stage keeps each module's final norm input; its output layer's
             * inputs and probabilities are the loss stage's (below) */
            char n[64];
            NAME(n, "mtp.%d.final_ln.in", i);
            add(a, MODEL_TR_FINAL_LN_IN, n, MODEL_ACTIVATIONS, d->act, sp, 3, b, d->s_sp, h, 0);
        }
        if (g == d->chunks - 1) {
            B->has_data = B->has_loss = 1;
            add(a, MODEL_TR_FINAL_LN_IN, "final_ln.in", MODEL_ACTIVATIONS, d->act, sp, 3, b, d->s_sp, h, 0);
            add(a, MODEL_TR_LOGITS_IN, "logits.in", MODEL_ACTIVATIONS, d->act, sp, 3, b, d->s_sp, h, 0);
            /* Cross-entropy keeps fp32 probabilities (Korthikanti's 4*s*b*V/t). */
            add(a, MODEL_TR_LOSS_PROBS, "loss.probs", MODEL_ACTIVATIONS, PX_FP32, MODEL_SHARD_TP, 3, b,
                d->s_loc, d->vocab_loc, 0);
            /* each prediction module has an output layer of its own inputs and probabilities */
            for (int i = 0; i < s->model.mtp_layers; i++) {
                char n[64];
                if (d->mtp_chunk == g) {
                    NAME(n, "mtp.%d.final_ln.in", i);
                    add(a, MODEL_TR_FINAL_LN_IN, n, MODEL_ACTIVATIONS, d->act, sp, 3, b, d->s_sp, h, 0);
                }
                NAME(n, "mtp.%d.logits.in", i);
                add(a, MODEL_TR_LOGITS_IN, n, MODEL_ACTIVATIONS, d->act, sp, 3, b, d->s_sp, h, 0);
                NAME(n, "mtp.%d.loss.probs", i);
                add(a, MODEL_TR_LOSS_PROBS, n, MODEL_ACTIVATIONS, PX_FP32, MODEL_SHARD_TP, 3, b,
                    d->s_loc, d->vocab_loc, 0);
            }
        }
        tt->act_chunk_bytes[j] = a->sum - before;
    }
    a->per_mb = 0;
    a->chunk = -1;
}

static uint64_t pad16(uint64_t n) { return (n + 15u) & ~(uint64_t)15u; }

void model_fp8_workspace(const ModelSpec *s, const ModelDims *d, ModelFp8Workspace *out)
{
    memset(out, 0, sizeof *out);
    if (!d->fp8)
        return;
    const ModelMla *mla = &s->model.mla;
    const int64_t M = (int64_t)d->b * d->s_loc, R = d->moe ? d->routed : 0;
    /* every FP8 GEMM operand but the weights, rows x reduction: inputs and output gradients */
    const int64_t shapes[][2] = {
        {M, d->h},
        {M, d->q_loc + d->kv2_loc},
        {M, d->o_loc},
        {M, d->ffn_out_loc},
        {M, d->ffn_loc},
        {M, d->sff_out_loc},
        {M, d->sff_loc},
        {R, d->h},
        {R, d->eff_out_loc},
        {R, d->eff_loc},
        {M, mla->q_lora_rank},
        {M, mla->kv_lora_rank + mla->qk_rope_dim},
        {M, (int64_t)d->heads_loc * (mla->qk_nope_dim + mla->v_dim)},
    };
    uint64_t most_numel = 0, most_q = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t r = shapes[i][0], c = shapes[i][1];
        if (r <= 0 || c <= 0)
            continue;
        if ((uint64_t)(r * c) > most_numel)
            most_numel = (uint64_t)(r * c);
        uint64_t q = model_fp8_bytes(s->job.fp8, 0, r, c);
        /* a column-wise copy (the transposed operand of a TN-only GEMM) scales along the rows */
        const uint64_t qt = d->fp8_wt ? model_fp8_bytes(s->job.fp8, 0, c, r) : 0;
        q = qt > q ? qt : q;
        if (q > most_q)
            most_q = q;
    }
    /* --fp8-dispatch: the routed rows received (and over etp gathered) with their senders'
     * scales, one per sender under a per-tensor recipe */
    if (s->job.fp8_dispatch && R > 0) {
        const uint64_t q = model_fp8_dispatch_bytes(s->job.fp8, R, d->h, d->ep * d->etp);
        most_q = q > most_q ? q : most_q;
    }
    /* op-level recompute's rerun wk and w3 (a SwiGLU layer's) read their rows of QKV's and
     * fc1's weight copies as operands of their own, copied into the second copy
     * (exec/train/fp8.c's exec_fp8_weight_rows) */
    if (d->recompute_op) {
        const int64_t slices[][2] = {
            {mla->kv_lora_rank > 0 ? 0 : d->kv_width_loc, d->h},
            {s->model.mlp == MODEL_SWIGLU ? d->ffn_loc : 0, d->h},
        };
        for (size_t i = 0; i < sizeof slices / sizeof slices[0]; i++) {
            const uint64_t q = model_fp8_bytes(s->job.fp8, 1, slices[i][0], slices[i][1]);
            most_q = q > most_q ? q : most_q;
        }
    }
    /* FP8 attention with its output in FP8 (model_fp8_attn_out): the act part holds Q, K, V
     * and the output (the core's, then decoded from its FP8 copy) side by side */
    uint64_t core =
        model_fp8_attn_out(s) ? (uint64_t)M * (uint64_t)(d->q_loc + d->kv2_loc + d->o_loc) : 0;
    /* MXFP8 attention (model_fp8_attn_copies 2): the core reads Q, K, V decoded from both
     * copies, row-wise then column-wise side by side, and its backward dO's column-wise copy
     * after them (the row-wise one decoded in place, in ws.dhid) */
    if (model_fp8_attn_copies(s) == 2)
        core = (uint64_t)M * (uint64_t)(2 * (d->q_loc + d->kv2_loc) + d->o_loc);
    /* MXFP8 with cp (model_fp8_attn_cp16) over the all-gather: the whole sequence's K, V
     * decoded from their column-wise copy after them, and both copies' codes quantized one
     * at a time in q0: this rank's Q, K, V, then the gathered K, V (exec/train/layers.c's
     * fp8_core_cp16) */
    if (model_fp8_attn_cp16(s) && s->layout.cp_comm != MODEL_CP_COMM_A2A) {
        /* the ring (cp.c's ring_mx_block): the block at hand decoded from both copies */
        const int gather = s->layout.cp_comm == MODEL_CP_COMM_ALLGATHER;
        const int64_t kv = gather ? (int64_t)d->b * d->s : M;
        core += (uint64_t)(gather ? 1 : 2) * (uint64_t)kv * (uint64_t)d->kv2_loc;
        const uint64_t q = model_fp8_bytes(s->job.fp8, 0, M, d->q_loc + d->kv2_loc);
        const uint64_t g = model_fp8_bytes(s->job.fp8, 0, kv, d->kv2_loc);
        most_q = q > most_q ? q : most_q;
        most_q = g > most_q ? g : most_q;
    }
    most_numel = core > most_numel ? core : most_numel;
    out->act_bytes = most_numel * px_dtype_bytes(d->act);
    out->q_bytes = most_q;
    out->scratch = 0;
    out->act = 16;
    out->q0 = out->act + pad16(out->act_bytes);
    out->q1 = out->q0 + pad16(most_q);
    out->w = out->wt = out->total = out->q1 + pad16(most_q);
    /* MXFP8 parameters under ZeRO-3: the GEMMs read the gathered copies, none is cast */
    if (s->layout.zero < 3 || model_fp8_mx_gather_copies(s, d, MODEL_FWD) > 0)
        return;
    /* the FP8 GEMMs' weights, one matrix (one expert's) each: rows x cols per rank */
    const int64_t h = d->h, qr = mla->q_lora_rank, kr = mla->kv_lora_rank;
    const int mla_on = kr > 0;
    const int64_t weights[][2] = {
        {mla_on ? 0 : d->q_loc + d->kv2_loc, h},
        {h, d->o_loc},
        {d->ffn_out_loc, h},
        {h, d->ffn_loc},
        {d->sff_out_loc, h},
        {h, d->sff_loc},
        {d->moe ? d->eff_out_loc : 0, h},
        {h, d->moe ? d->eff_loc : 0},
        {mla_on ? qr : 0, h},
        {mla_on ? d->q_loc : 0, qr > 0 ? qr : h},
        {mla_on ? kr + mla->qk_rope_dim : 0, h},
        {mla_on ? (int64_t)d->heads_loc * (mla->qk_nope_dim + mla->v_dim) : 0, kr},
    };
    for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++) {
        const int64_t r = weights[i][0], c = weights[i][1];
        if (r <= 0 || c <= 0)
            continue;
        const uint64_t q = model_fp8_bytes(s->job.fp8, 1, r, c);
        const uint64_t qt = d->fp8_wt ? model_fp8_bytes(s->job.fp8, 1, c, r) : 0;
        out->w_bytes = q > out->w_bytes ? q : out->w_bytes;
        out->wt_bytes = qt > out->wt_bytes ? qt : out->wt_bytes;
    }
    out->wt = out->w + pad16(out->w_bytes);
    out->total = out->wt + pad16(out->wt_bytes);
}

uint64_t model_fp8_workspace_bytes(const ModelSpec *s, const ModelDims *d)
{
    ModelFp8Workspace w;
    model_fp8_workspace(s, d, &w);
    return w.total;
}

/* Workspace: scratch reused by every layer of every chunk; the data and the loss's statistics
 * where the stage reads tokens or computes the loss. */
static void add_workspace(Build *B)
{
    const ModelSpec *s = B->s;
    const ModelDims *d = B->d;
    const int64_t h = d->h, b = d->b;
    const int sp = s->layout.sp ? MODEL_SHARD_SP : 0;
    const PxDtype e = d->act;
    Adder *a = &B->a;
    add(a, MODEL_TR_WS_OUT, "ws.out", MODEL_WORKSPACE, e, 0, 3, b, d->s_loc, h, 0);
    add(a, MODEL_TR_WS_DX_A, "ws.dx_a", MODEL_WORKSPACE, e, sp, 3, b, d->s_sp, h, 0);
    add(a, MODEL_TR_WS_DX_B, "ws.dx_b", MODEL_WORKSPACE, e, sp, 3, b, d->s_sp, h, 0);
    add(a, MODEL_TR_WS_DHID, "ws.dhid", MODEL_WORKSPACE, e, 0, 3, b, d->s_loc, d->q_loc > h ? d->q_loc : h, 0);
    add(a, MODEL_TR_WS_DQKV, "ws.dqkv", MODEL_WORKSPACE, e, MODEL_SHARD_TP, 3, b, d->s_loc,
        d->q_loc + d->kv2_loc, 0);
    /* the MLP's backward scratch, as wide as the widest MLP a layer runs: a dense layer's or
     * a MoE layer's shared experts' (Qwen2-MoE's are wider than its dense layers'); under FP8
     * the shared experts' gate decodes fc2's saved input into it, with GeLU beside the
     * activation's gradient (exec/train/layers.c, fp8_gate_bwd) */
    int64_t f_out = d->sff_out_loc > d->ffn_out_loc ? d->sff_out_loc : d->ffn_out_loc;
    const int64_t f_in = d->sff_loc > d->ffn_loc ? d->sff_loc : d->ffn_loc;
    if (d->fp8 && s->model.moe.shared_gate && d->sff_loc > 0 && 2 * d->sff_loc > f_out)
        f_out = 2 * d->sff_loc;
    /* the prediction modules' eh projection keeps its input's gradient ([b*s, 2h]) in a layer's
     * backward scratch: ws.dqkv where the attention's is wide enough, else this one, at least
     * 2h wide (exec/train/mtp.c, eh_grad_buf) */
    if (s->model.mtp_layers > 0 && d->ffn_out_loc < 2 * h && d->q_loc + d->kv2_loc < 2 * h &&
        f_out < 2 * h)
        f_out = 2 * h;
    add(a, MODEL_TR_WS_DFFN, "ws.dffn", MODEL_WORKSPACE, e, MODEL_SHARD_TP, 3, b, d->s_loc, f_out, 0);
    if (s->model.mlp == MODEL_SWIGLU)
        add(a, MODEL_TR_WS_DACT, "ws.dact", MODEL_WORKSPACE, e, MODEL_SHARD_TP, 3, b, d->s_loc, f_in, 0);
    if (s->job.flash_attn)
        add(a, MODEL_TR_WS_FLASH_D, "ws.flash_d", MODEL_WORKSPACE, PX_FP32, MODEL_SHARD_TP, 3, b,
            d->heads_loc, d->s_loc, 0);
    else
        add(a, MODEL_TR_WS_DSCORES, "ws.dscores", MODEL_WORKSPACE, e, MODEL_SHARD_TP, 4, b,
            d->heads_loc, d->s_loc, d->s);
    ModelMlaWork mw;
    model_mla_work(s, d, &mw);
    if (mw.total > 0) /* multi-head latent attention's temporaries (docs/memory.md) */
        add(a, MODEL_TR_WS_MLA, "ws.mla", MODEL_WORKSPACE, e, MODEL_SHARD_TP, 1, (int64_t)mw.total, 0, 0, 0);
    uint64_t re = recompute_bytes(s, d);
    if (re > 0)
        add(a, MODEL_TR_WS_RECOMPUTE, "ws.recompute", MODEL_WORKSPACE, PX_UINT8, 0, 1, (int64_t)re, 0, 0, 0);
    if (B->has_data)
        /* a sequence's tokens and the next ones: with context parallelism each of the rank's
         * two chunks with its own next token and the mtp_layers tokens after it that the
         * prediction modules read (exec/train/data.c, mtp_tokens.c) */
        add(a, MODEL_TR_DATA_BATCH, "data.batch", MODEL_WORKSPACE, PX_INT32, MODEL_SHARD_CP, 4, 2, d->m,
            b, d->s_loc + (d->c > 1 ? 2 * (1 + s->model.mtp_layers) : 1));
    /* The cross-entropy's per-token row max, sum of exponentials, target logit and loss (fp32):
     * the steps the vocabulary-parallel reductions separate (kernels.h's xent_*). */
    if (B->has_moe) {
        /* the experts' backward: the gradient of fc1's output and of their input rows */
        add(a, MODEL_TR_WS_EXP_DFFN, "ws.exp_dffn", MODEL_WORKSPACE, e, MODEL_SHARD_EP, 2, d->routed,
            d->eff_out_loc, 0, 0);
        add(a, MODEL_TR_WS_EXP_DX, "ws.exp_dx", MODEL_WORKSPACE, e, MODEL_SHARD_EP, 2, d->routed, h, 0, 0);
    }
    if (d->fp8)
        add(a, MODEL_TR_WS_FP8, "ws.fp8", MODEL_WORKSPACE, PX_UINT8, 0, 1,
            (int64_t)model_fp8_workspace_bytes(s, d), 0, 0, 0);
    if (B->has_loss)
        add(a, MODEL_TR_WS_XENT, "ws.xent", MODEL_WORKSPACE, PX_FP32, MODEL_SHARD_CP, 2, 4, b * d->s_loc,
            0, 0);
}

/* Communication buffers of the activations: the pipeline's, the sequence-parallel gather, the
 * context-parallel K and V. */
static void add_comm_buffers(Build *B)
{
    const ModelSpec *s = B->s;
    const ModelDims *d = B->d;
    const int64_t h = d->h, b = d->b;
    const int sp = s->layout.sp ? MODEL_SHARD_SP : 0;
    const PxDtype e = d->act;
    Adder *a = &B->a;
    if (d->p > 1) {
        /* with the scatter/gather split each TP rank sends and receives its h/t slice; from a
         * standalone MTP stage on, a transfer holds 1 + mtp_layers of them (model/ops.c), and
         * a stage's buffers fit its largest */
        int shard = sp | (d->pp_split > 1 ? MODEL_SHARD_TP : 0);
        int64_t xs = 1, xr = 1;
        for (int j = 0; j < d->v && s->model.mtp_layers > 0 && d->mtp_chunk < d->chunks - 1; j++) {
            const int g = model_global_chunk(d, B->stage, j);
            if (g >= d->mtp_chunk && g < d->chunks - 1)
                xs = 1 + s->model.mtp_layers;
            if (g > d->mtp_chunk)
                xr = 1 + s->model.mtp_layers;
        }
        /* a stage sends and receives either way (forward activations, backward gradients) */
        const int64_t x = xs > xr ? xs : xr;
        add(a, MODEL_TR_PP_SEND, "pp.send", MODEL_COMM_BUFFERS, e, shard, 3, b, x * d->s_sp, h / d->pp_split, 0);
        add(a, MODEL_TR_PP_RECV, "pp.recv", MODEL_COMM_BUFFERS, e, shard, 3, b, x * d->s_sp, h / d->pp_split, 0);
    }
    if (s->layout.sp)
        add(a, MODEL_TR_SP_GATHER, "sp.gather", MODEL_COMM_BUFFERS, e, 0, 3, b, d->s_loc, h, 0);
    if (d->c > 1 && s->layout.cp_comm == MODEL_CP_COMM_A2A) {
        /* Ulysses' all-to-alls: the rank's Q, K, V (or output, or their gradients) packed by
         * destination, and what it receives, then reordered by the executor into the head
         * split over the whole sequence, which takes attn.qkv.out's place (docs/memory.md) */
        const int64_t w = d->q_loc + (int64_t)d->kv2_loc;
        add(a, MODEL_TR_CP_A2A_SEND, "cp.a2a_send", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 3, b,
            d->s_loc, w, 0);
        add(a, MODEL_TR_CP_A2A_RECV, "cp.a2a_recv", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 3, b,
            d->s_loc, w, 0);
    } else if (d->c > 1 && s->layout.cp_comm == MODEL_CP_COMM_P2P) {
        /* the ring: two slots (the block at hand, the one arriving), each a block's K and V
         * and the gradient of K and V accumulated for it; one chunk's partial output (or its
         * Q gradient, the wider: multi-head latent attention's differ), its log-sum-exp and
         * its K, V gradient (docs/memory.md) */
        const int64_t kv2 = (int64_t)d->kv2_loc, C = d->s_loc / 2;
        /* with FP8 attention (exec/train/cp.c's ring_fwd_fp8): two slots of a block's codes, the
         * block decoded, and the K, V gradients of every block, sent home by one all-to-all
         * and received: 3 + 2 cp blocks */
        const int64_t slots = model_fp8_attn_codes(s) ? 3 + 2 * (int64_t)d->c : 4;
        add(a, MODEL_TR_CP_KV, "cp.kv", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 4, slots, b,
            d->s_loc, kv2);
        add(a, MODEL_TR_CP_OUT_PART, "cp.out_part", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 2, C,
            d->q_loc > d->o_loc ? d->q_loc : d->o_loc, 0, 0);
        add(a, MODEL_TR_CP_LSE_PART, "cp.lse_part", MODEL_COMM_BUFFERS, PX_FP32, MODEL_SHARD_TP, 2,
            d->heads_loc, C, 0, 0);
        add(a, MODEL_TR_CP_DKV_PART, "cp.dkv_part", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 2, C,
            kv2, 0, 0);
    } else if (d->c > 1) {
        /* the gathered K and V (with the all-gather: in cp rank order, and backward the K, V
         * gradient reduce-scattered from it), and for the all-gather the same in global token
         * order (attention's keys) and the gradient of the full sequence's K and V
         * (docs/memory.md, "Context parallelism") */
        const int64_t kv2 = (int64_t)d->kv2_loc;
        add(a, MODEL_TR_CP_KV, "cp.kv", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 3, b, d->s, kv2, 0);
        if (s->layout.cp_comm == MODEL_CP_COMM_ALLGATHER) {
            add(a, MODEL_TR_CP_KV_FULL, "cp.kv_full", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 3, b,
                d->s, kv2, 0);
            add(a, MODEL_TR_CP_DKV, "cp.dkv", MODEL_COMM_BUFFERS, e, MODEL_SHARD_TP, 3, b, d->s,
                kv2, 0);
        }
    }
    if (B->has_moe && s->job.moe_dispatcher == MODEL_MOE_DISPATCH_ALLGATHER) {
        /* the all-gather dispatcher over etp x ep (n ranks): the n T tokens gathered (then
         * the experts' weighted outputs summed into it for the reduce-scatter; the backward's
         * output gradient and input gradient the same way), the dense scores and routing map
         * gathered (the scores' gradient reduce-scattered from it), the gathered copies'
         * weight gradient */
        const int64_t nT = d->tokens * d->ep * d->etp, E = s->model.moe.experts;
        add(a, MODEL_TR_EP_GATHER, "ep.gather", MODEL_COMM_BUFFERS, e, MODEL_SHARD_EP, 2, nT, h, 0, 0);
        add(a, MODEL_TR_EP_PROBS, "ep.probs", MODEL_COMM_BUFFERS, PX_FP32, MODEL_SHARD_EP, 2, nT, E, 0, 0);
        add(a, MODEL_TR_EP_MAP, "ep.map", MODEL_COMM_BUFFERS, PX_UINT8, MODEL_SHARD_EP, 2, nT, E, 0, 0);
        add(a, MODEL_TR_EP_DW, "ep.dw", MODEL_WORKSPACE, PX_FP32, MODEL_SHARD_EP, 2, nT,
            s->model.moe.topk, 0, 0);
    } else if (B->has_moe && d->ep * d->etp > 1) {
        /* the all-to-all's send side (a token's topk copies, permuted) and receive side (the
         * rows the rank's experts take, gathered over etp) */
        add(a, MODEL_TR_EP_SEND, "ep.send", MODEL_COMM_BUFFERS, e, sp, 2,
            d->tokens * s->model.moe.topk, h, 0, 0);
        add(a, MODEL_TR_EP_RECV, "ep.recv", MODEL_COMM_BUFFERS, e, MODEL_SHARD_EP, 2, d->routed, h, 0, 0);
    }
}

/* Room for the scales of block b's FP8 matrices in ZeRO-3's FP8 gather (exec/train/
 * fp8gather.c): each matrix's fp32 scales after its elements, padded to
 * MODEL_FP8_GATHER_SCALE_BYTES, so that the next matrix starts 16-byte aligned: 16 bytes a
 * matrix with a per-tensor scale; with blockwise 4 a 128 x 128 tile and at most 12 of
 * padding a matrix (the executor's round_up(4 x tiles, 16) each, whose sum this bounds: one
 * count, the block's matrices and tiles). */
static uint64_t gather_scale_room(const ModelBlock *b)
{
    return (uint64_t)(MODEL_FP8_GATHER_SCALE_BYTES - 4) * (uint64_t)b->fp8_weights +
           4u * (uint64_t)b->fp8_scales;
}

/* ZeRO's buffers (docs/memory.md, "ZeRO-3's gathered parameters"): the gradient bucket
 * (ZeRO-2/3), one block's unsharded gradients while they are reduced, and ZeRO-3's
 * parameter-gather buffer, each block-sized part as large as the largest block padded to a
 * multiple of its group, as its shards are. Streaming, the gather buffer holds the layer being
 * computed and the `prefetch` layers gathered ahead (a MoE layer: its block and its experts'),
 * at least the two blocks the executor alternates; with the gathered parameters kept from
 * forward to backward, every block of the stage, whole. */
static void add_zero_buffers(Build *B)
{
    const ModelSpec *s = B->s;
    const ModelDims *d = B->d;
    const ModelTensorTable *tt = B->tt;
    uint64_t padded = 0, all = 0, fp8_all = 0, act_most = 0, fp8_most = 0;
    uint64_t room = 0, room_most = 0; /* the FP8 matrices' scales in the gathered layout */
    int experts = 0;
    for (int i = 0; i < tt->n_blocks; i++) {
        const ModelBlock *blk = &tt->blocks[i];
        uint64_t g = (uint64_t)(blk->experts ? d->edp : d->zero_group);
        uint64_t p = px_round_up(blk->numel, g), rep = (uint64_t)(blk->repeat > 0 ? blk->repeat : 1);
        padded = p > padded ? p : padded;
        /* gathered in FP8, a slot's parts: the largest block's other elements (the padding
         * among them), and the most FP8 elements and weights of any block */
        act_most = p - blk->fp8_numel > act_most ? p - blk->fp8_numel : act_most;
        fp8_most = blk->fp8_numel > fp8_most ? blk->fp8_numel : fp8_most;
        const uint64_t r = gather_scale_room(blk);
        room_most = r > room_most ? r : room_most;
        all += p * rep;
        fp8_all += blk->fp8_numel * rep;
        room += r * rep;
        experts |= blk->experts;
    }
    /* under a pipeline the unsharded gradients (add_param_g) are the reduce-scatter's input */
    if (s->layout.zero >= 2 && !d->zero_per_step)
        add(&B->a, MODEL_TR_ZERO_GRAD_BUCKET, "zero.grad_bucket", MODEL_COMM_BUFFERS, d->grad, 0, 1,
            (int64_t)padded, 0, 0, 0);
    if (s->layout.zero == 3) {
        const int ahead = s->layout.prefetch < 0 ? 0 : s->layout.prefetch == 0 ? 1 : s->layout.prefetch;
        int64_t parts = (int64_t)(1 + ahead) * (experts ? 2 : 1);
        if (parts < 2)
            parts = 2;
        const int pg = d->fp8 && s->job.fp8_param_gather;
        uint64_t elems = (uint64_t)parts * padded;
        /* of them, the FP8 GEMMs' weights when they are gathered in FP8 (a slot holds any
         * block's: its other elements and its FP8 ones, each part as large as any block's) */
        uint64_t fp8 = (uint64_t)parts * fp8_most, scales = (uint64_t)parts * room_most;
        if (pg)
            elems = (uint64_t)parts * (act_most + fp8_most);
        /* kept from forward to backward, or (a pipeline) across the stage's micro-batches:
         * every block of the stage, whole */
        if ((s->layout.keep_gathered || d->zero_per_step) && all > (uint64_t)parts * padded) {
            elems = all;
            fp8 = fp8_all;
            scales = room;
        }
        if (!pg)
            fp8 = 0;
        elems -= fp8;
        /* MXFP8 (Megatron-FSDP): a slot holds the copies its gather carries, the row-wise or
         * the column-wise one, both where one gather serves a forward and a backward; the
         * scales stay each rank's own (MODEL_TR_FP8_MX_SCALES) */
        const int mx_fwd = model_fp8_mx_gather_copies(s, d, MODEL_FWD);
        if (mx_fwd > 0) {
            const int mx_bwd = model_fp8_mx_gather_copies(s, d, MODEL_BWD);
            fp8 *= (uint64_t)(d->zero_per_step ? 2 : mx_fwd > mx_bwd ? mx_fwd : mx_bwd);
            scales = 0;
        }
        elems = (elems + 1) / 2 * 2; /* two equal halves */
        add(&B->a, MODEL_TR_ZERO_PARAM_GATHER, "zero.param_gather", MODEL_COMM_BUFFERS, d->param, 0, 2,
            2, (int64_t)(elems / 2), 0, 0);
        if (fp8 > 0) {
            /* the FP8 weights gathered in one byte each, each matrix's scales after it
             * (gather_scale_room) */
            const Fp8Extra x = {scales, MODEL_TR_NONE, 1};
            add_ex(&B->a, MODEL_TR_ZERO_PARAM_GATHER, "zero.param_gather_fp8", MODEL_COMM_BUFFERS,
                   PX_FP8, 0, 1, (int64_t)fp8, 0, 0, 0, &x);
        }
    }
}

static int tensors_build(const ModelSpec *s, const ModelDims *d, int stage, int compact,
                         int parts, ModelTensorTable *tt, PxError *err)
{
    memset(tt, 0, sizeof *tt);
    tt->stage = stage;
    tt->compact = compact;
    if (stage < 0 || stage >= d->p)
        return px_fail(err, PX_EINPUT, "stage %d is outside the pipeline's %d stages", stage, d->p);
    tt->act_chunk_bytes = calloc((size_t)d->v, sizeof *tt->act_chunk_bytes);
    tt->act_layer_bytes = calloc((size_t)d->v, sizeof *tt->act_layer_bytes);
    if (!tt->act_chunk_bytes || !tt->act_layer_bytes)
        return px_fail(err, PX_ERUNTIME, "out of memory building the tensor table");
    Build B = {.s = s, .d = d, .stage = stage, .compact = compact, .tt = tt,
               .a = {.tt = tt, .err = err, .block = -1, .layer = -1, .chunk = -1, .repeat = 1,
                     .unnamed = compact},
               .reuse = {.nl = {-1, -1, -1}, .act_nl = {-1, -1, -1}}};
    if (parts & PART_PARAMS) {
        int rc = add_parameters(&B, err);
        if (rc)
            return rc;
        add_states(&B);
    }
    if (parts & PART_ACTS) {
        add_activations(&B);
        add_workspace(&B);
        add_comm_buffers(&B);
    }
    if (parts & PART_PARAMS)
        add_zero_buffers(&B);
    return B.a.rc;
}

int model_tensors_build(const ModelSpec *s, const ModelDims *d, int stage, ModelTensorTable *tt,
                        PxError *err)
{
    return tensors_build(s, d, stage, 0, PART_ALL, tt, err);
}

int model_tensors_build_compact(const ModelSpec *s, const ModelDims *d, int stage,
                                ModelTensorTable *tt, PxError *err)
{
    return tensors_build(s, d, stage, 1, PART_ALL, tt, err);
}

/* ---- the planner's cache of compact tables ----
 *
 * Across the layouts of one search, a stage's parameter half depends on tp, ZeRO and its
 * group, and the stage's chunks; its activation half on tp, cp, sp, the micro-batch and
 * recompute, and the chunks. Each half is built once per distinct key and the table is put
 * together from the two. The keys hold every derived size the halves read; the model and job
 * are the cache's own (a different one empties it). */

enum { CACHE_MAX_CHUNKS = 32 };

typedef struct {
    int n;                               /* words in use */
    uint64_t w[24 + CACHE_MAX_CHUNKS];   /* sizes, then one word per chunk */
} CacheKey;

typedef struct {
    ModelBlock *blocks; /* parameter half */
    int n_blocks;
    uint64_t params;
    uint64_t *act_chunk, *act_layer; /* activation half, [v] each */
    uint64_t cat[MODEL_CAT_COUNT];
    int key_n;
    uint64_t key_w[]; /* the key's words, key_n of them */
} CacheEntry;

/* Open addressing over small slots; each entry is its own allocation, sized to its key. */
typedef struct {
    uint64_t hash;
    CacheEntry *e; /* NULL: empty */
} CacheSlot;

typedef struct {
    CacheSlot *slot;
    size_t cap, n;
} CacheMap;

struct ModelTableCache {
    int have_spec;
    ModelConfig model;
    ModelJob job;
    CacheMap params, acts;
};

ModelTableCache *model_table_cache_new(void) { return calloc(1, sizeof(ModelTableCache)); }

static void map_clear(CacheMap *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        CacheEntry *e = m->slot[i].e;
        if (!e)
            continue;
        free(e->blocks);
        free(e->act_chunk);
        free(e->act_layer);
        free(e);
    }
    free(m->slot);
    memset(m, 0, sizeof *m);
}

void model_table_cache_free(ModelTableCache *c)
{
    if (!c)
        return;
    map_clear(&c->params);
    map_clear(&c->acts);
    free(c);
}

static uint64_t key_hash(const CacheKey *k)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)k->n;
    for (int i = 0; i < k->n; i++) {
        h ^= k->w[i];
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h;
}

static int key_equal(const CacheEntry *e, const CacheKey *k)
{
    return e->key_n == k->n && memcmp(e->key_w, k->w, (size_t)k->n * sizeof k->w[0]) == 0;
}

/* The slot of key k (hash h): its entry's, or the empty one it would take. */
static CacheSlot *map_slot(CacheMap *m, const CacheKey *k, uint64_t h)
{
    size_t i = (size_t)h & (m->cap - 1);
    while (m->slot[i].e && (m->slot[i].hash != h || !key_equal(m->slot[i].e, k)))
        i = (i + 1) & (m->cap - 1);
    return &m->slot[i];
}

static int map_grow(CacheMap *m)
{
    if (m->cap && m->n * 2 < m->cap)
        return PX_OK;
    const size_t cap = m->cap ? 2 * m->cap : 256;
    CacheMap g = {calloc(cap, sizeof(CacheSlot)), cap, m->n};
    if (!g.slot)
        return PX_ERUNTIME;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slot[i].e) { /* rehash by the stored hash: keys differ, so take the first free slot */
            size_t j = (size_t)m->slot[i].hash & (cap - 1);
            while (g.slot[j].e)
                j = (j + 1) & (cap - 1);
            g.slot[j] = m->slot[i];
        }
    free(m->slot);
    *m = g;
    return PX_OK;
}

/* A new entry for key k in slot sl: its key copied, sized to it. */
static CacheEntry *map_add(CacheMap *m, CacheSlot *sl, const CacheKey *k, uint64_t h)
{
    CacheEntry *e = calloc(1, sizeof *e + (size_t)k->n * sizeof k->w[0]);
    if (!e)
        return NULL;
    e->key_n = k->n;
    memcpy(e->key_w, k->w, (size_t)k->n * sizeof k->w[0]);
    sl->hash = h;
    sl->e = e;
    m->n++;
    return e;
}

/* One half of a stage's compact table, and the cache entry (key k, slot sl) it will fill. */
static int build_half(const ModelSpec *s, const ModelDims *d, int stage, int part, CacheMap *m,
                      CacheSlot *sl, const CacheKey *k, uint64_t h, ModelTensorTable *tt,
                      CacheEntry **entry, PxError *err)
{
    int rc = tensors_build(s, d, stage, 1, part, tt, err);
    if (!rc && !(*entry = map_add(m, sl, k, h)))
        rc = px_fail(err, PX_ERUNTIME, "out of memory caching tensor tables");
    if (rc)
        model_tensors_free(tt);
    return rc;
}

static void key_chunks(CacheKey *k, const ModelSpec *s, const ModelDims *d, int stage)
{
    for (int j = 0; j < d->v; j++) {
        int g = model_global_chunk(d, stage, j);
        int l0, nl = model_chunk_layers(s, d, g, &l0);
        /* and where the chunk sits against the prediction modules' (theirs, or after it) */
        k->w[k->n++] = (uint64_t)(g == 0) << 63 | (uint64_t)(g == d->chunks - 1) << 62 |
                       (uint64_t)(g == d->mtp_chunk) << 61 | (uint64_t)(g > d->mtp_chunk) << 60 |
                       (uint64_t)(uint32_t)l0 << 24 | (uint64_t)(uint32_t)nl;
    }
}

int model_tensors_build_cached(ModelTableCache *c, const ModelSpec *s, const ModelDims *d,
                               int stage, ModelTensorTable *tt, PxError *err)
{
    if (!c || d->v > CACHE_MAX_CHUNKS)
        return model_tensors_build_compact(s, d, stage, tt, err);
    ModelJob job = s->job;
    job.micro_batch = 0; /* a key's (d->b): the planner varies it */
    if (!c->have_spec || memcmp(&c->model, &s->model, sizeof c->model) != 0 ||
        memcmp(&c->job, &job, sizeof c->job) != 0) {
        map_clear(&c->params);
        map_clear(&c->acts);
        c->model = s->model;
        c->job = job;
        c->have_spec = 1;
    }
    if (map_grow(&c->params) || map_grow(&c->acts))
        return px_fail(err, PX_ERUNTIME, "out of memory caching tensor tables");
    const ModelLayout *l = &s->layout;
    CacheKey kp = {0}, ka = {0};
    const uint64_t pk[] = {(uint64_t)d->t, (uint64_t)l->zero | (uint64_t)d->zero_per_step << 8, (uint64_t)d->zero_group,
                           (uint64_t)d->v, (uint64_t)d->param, (uint64_t)d->grad,
                           (uint64_t)d->master, (uint64_t)d->vocab_loc, (uint64_t)d->q_loc,
                           (uint64_t)d->kv2_loc, (uint64_t)d->ffn_out_loc,
                           (uint64_t)d->ffn_loc, (uint64_t)d->h, (uint64_t)d->chunks,
                           (uint64_t)d->edp, (uint64_t)d->experts_loc,
                           (uint64_t)d->eff_loc | (uint64_t)d->sff_loc << 32, (uint64_t)d->o_loc};
    const uint64_t ak[] = {(uint64_t)d->act, (uint64_t)d->b, (uint64_t)d->s, (uint64_t)d->s_loc,
                           (uint64_t)d->s_sp, (uint64_t)d->h, (uint64_t)d->q_loc,
                           (uint64_t)d->kv2_loc, (uint64_t)d->heads_loc,
                           (uint64_t)d->ffn_out_loc, (uint64_t)d->ffn_loc, (uint64_t)d->vocab_loc,
                           (uint64_t)d->m, (uint64_t)d->c,
                           (uint64_t)(d->p > 1) | (uint64_t)d->pp_split << 1 | (uint64_t)(l->sp != 0) << 32 |
                               (uint64_t)l->recompute << 33,
                           (uint64_t)d->v | (uint64_t)d->chunks << 32,
                           (uint64_t)d->tokens, (uint64_t)d->routed,
                           (uint64_t)d->eff_loc | (uint64_t)d->sff_loc << 32,
                           (uint64_t)(d->ep * d->etp) | (uint64_t)d->o_loc << 32};
    memcpy(kp.w, pk, sizeof pk);
    kp.n = (int)(sizeof pk / sizeof pk[0]);
    memcpy(ka.w, ak, sizeof ak);
    ka.n = (int)(sizeof ak / sizeof ak[0]);
    key_chunks(&kp, s, d, stage);
    key_chunks(&ka, s, d, stage);
    const uint64_t hp = key_hash(&kp), ha = key_hash(&ka);
    CacheSlot *sp = map_slot(&c->params, &kp, hp), *sa = map_slot(&c->acts, &ka, ha);
    CacheEntry *ep = sp->e, *ea = sa->e;
    int rc;
    ModelTensorTable part;
    if (!ep) { /* the parameter half, built once */
        if ((rc = build_half(s, d, stage, PART_PARAMS, &c->params, sp, &kp, hp, &part, &ep, err)))
            return rc;
        ep->blocks = part.blocks;
        ep->n_blocks = part.n_blocks;
        ep->params = part.params;
        memcpy(ep->cat, part.cat_bytes, sizeof ep->cat);
        part.blocks = NULL;
        model_tensors_free(&part);
    }
    if (!ea) { /* the activation half, built once */
        if ((rc = build_half(s, d, stage, PART_ACTS, &c->acts, sa, &ka, ha, &part, &ea, err)))
            return rc;
        ea->act_chunk = part.act_chunk_bytes;
        ea->act_layer = part.act_layer_bytes;
        memcpy(ea->cat, part.cat_bytes, sizeof ea->cat);
        part.act_chunk_bytes = part.act_layer_bytes = NULL;
        model_tensors_free(&part);
    }
    /* the table from its halves, whose arrays it borrows (the cache outlives it) */
    memset(tt, 0, sizeof *tt);
    tt->stage = stage;
    tt->compact = 1;
    tt->borrowed = 1;
    tt->blocks = ep->blocks;
    tt->n_blocks = tt->blocks_cap = ep->n_blocks;
    tt->params = ep->params;
    tt->act_chunk_bytes = ea->act_chunk;
    tt->act_layer_bytes = ea->act_layer;
    for (int k = 0; k < MODEL_CAT_COUNT; k++)
        tt->cat_bytes[k] = ep->cat[k] + ea->cat[k];
    return PX_OK;
}

void model_tensors_free(ModelTensorTable *tt)
{
    if (!tt)
        return;
    if (tt->borrowed) {
        memset(tt, 0, sizeof *tt);
        return;
    }
    free(tt->t);
    free(tt->blocks);
    free(tt->act_chunk_bytes);
    free(tt->act_layer_bytes);
    memset(tt, 0, sizeof *tt);
}

uint64_t model_tensors_bytes(const ModelTensorTable *tt, ModelCategory c)
{
    return (unsigned)c < MODEL_CAT_COUNT ? tt->cat_bytes[c] : 0;
}
