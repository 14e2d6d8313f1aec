/* The executor's life cycle: checks that the plan can run here, places this rank in the
 * layout's grid, binds every tensor of its stage's table to a category arena, maps the op
 * graph's names, and initializes the weights. The steps themselves are in step.c, one
 * micro-batch's passes in model.c. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/internal.h"

void exec_options_defaults(ExecOptions *o)
{
    memset(o, 0, sizeof *o);
    o->prefetch = 1;
    o->comm_timeout_s = EXEC_COMM_TIMEOUT_S;
}

/* ---- arenas ---- */

void *exec_arena_carve(ExecArena *a, uint64_t bytes, size_t align)
{
    uint64_t off = px_round_up(a->used, align ? align : 1);
    a->used = off + bytes;
    if (!a->base || a->used > a->cap)
        return NULL;
    return a->base + off;
}

/* ---- saved activations of a layer: what each field is and how big ---- */

/* The C type of a field of ExecLayerActs: an act tensor (void *), fp32 (float *) or a mask. */
enum { AF_ACT = 0, AF_F32, AF_U8 };

typedef struct {
    const char *suffix; /* after "layer.<i>." */
    size_t off;         /* offsetof in ExecLayerActs */
    int ctype;          /* AF_* */
    uint64_t numel;
    int needed; /* the executor writes it in this configuration */
    PxDtype dt; /* its dtype (filled by act_fields from ctype) */
} ActField;

enum { ACT_FIELDS = 14 };

static PxDtype act_field_dtype(const Exec *ex, int ctype)
{
    return ctype == AF_U8 ? PX_UINT8 : ctype == AF_F32 ? PX_FP32 : ex->act;
}

static void act_fields(const Exec *ex, ActField f[ACT_FIELDS])
{
    const ModelDims *d = &ex->d;
    /* N: the sequence on this rank; R: its norm/dropout region (N / tp with SP) */
    const uint64_t N = (uint64_t)d->b * d->s_loc, R = (uint64_t)d->b * d->s_sp, h = (uint64_t)d->h;
    const uint64_t qkv = (uint64_t)d->q_loc + 2u * (uint64_t)d->kv_width_loc;
    const uint64_t sq = (uint64_t)d->b * d->heads_loc * d->s_loc * d->s;
    const int flash = ex->spec.job.flash_attn, drop = ex->dropout > 0.0f;
    const ActField t[ACT_FIELDS] = {
        {"ln1.in", offsetof(ExecLayerActs, ln1_in), AF_ACT, R * h, 1, PX_FP32},
        {"attn.qkv.in", offsetof(ExecLayerActs, qkv_in), AF_ACT, R * h, 1, PX_FP32},
        {"attn.qkv.out", offsetof(ExecLayerActs, qkv_out), AF_ACT, N * qkv, 1, PX_FP32},
        {"attn.lse", offsetof(ExecLayerActs, lse), AF_F32, (uint64_t)d->b * d->heads_loc * d->s_loc,
         flash, PX_FP32},
        {"attn.softmax", offsetof(ExecLayerActs, softmax), AF_ACT, sq, !flash, PX_FP32},
        {"attn.softmax_mask", offsetof(ExecLayerActs, softmax_mask), AF_U8, sq, ex->attn_dropout,
         PX_FP32},
        {"attn.softmax_drop", offsetof(ExecLayerActs, softmax_drop), AF_ACT, sq, ex->attn_dropout,
         PX_FP32},
        {"attn.proj.in", offsetof(ExecLayerActs, proj_in), AF_ACT, N * (uint64_t)d->q_loc, 1, PX_FP32},
        {"attn.drop_mask", offsetof(ExecLayerActs, attn_drop_mask), AF_U8, R * h, drop, PX_FP32},
        {"ln2.in", offsetof(ExecLayerActs, ln2_in), AF_ACT, R * h, 1, PX_FP32},
        {"mlp.fc1.in", offsetof(ExecLayerActs, fc1_in), AF_ACT, R * h, 1, PX_FP32},
        {"mlp.act.in", offsetof(ExecLayerActs, act_in), AF_ACT, N * (uint64_t)d->ffn_out_loc, 1,
         PX_FP32},
        {"mlp.fc2.in", offsetof(ExecLayerActs, fc2_in), AF_ACT, N * (uint64_t)d->ffn_loc, 1, PX_FP32},
        {"mlp.drop_mask", offsetof(ExecLayerActs, mlp_drop_mask), AF_U8, R * h, drop, PX_FP32},
    };
    memcpy(f, t, sizeof t);
    for (int i = 0; i < ACT_FIELDS; i++)
        f[i].dt = act_field_dtype(ex, f[i].ctype);
}

static void act_set(ExecLayerActs *a, const ActField *f, void *p)
{
    char *at = (char *)a + f->off;
    if (f->ctype == AF_U8)
        *(uint8_t **)(void *)at = p;
    else if (f->ctype == AF_F32)
        *(float **)(void *)at = p;
    else
        *(void **)(void *)at = p;
}

static void *act_get(const ExecLayerActs *a, const ActField *f)
{
    const char *at = (const char *)a + f->off;
    if (f->ctype == AF_U8)
        return *(uint8_t *const *)(const void *)at;
    if (f->ctype == AF_F32)
        return *(float *const *)(const void *)at;
    return *(void *const *)(const void *)at;
}

static int act_field_index(const ActField *f, const char *suffix)
{
    for (int i = 0; i < ACT_FIELDS; i++)
        if (strcmp(f[i].suffix, suffix) == 0)
            return i;
    return -1;
}

/* "layer.12.attn.qkv.w" -> 12 and the suffix; -1 when the name is not a layer's. */
static int layer_of(const char *name, const char **suffix)
{
    int l = -1, n = 0;
    if (sscanf(name, "layer.%d.%n", &l, &n) != 1 || n == 0)
        return -1;
    *suffix = name + n;
    return l;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* ---- parameters by name ---- */

/* The place of a layer parameter's field, the same in ExecLayerParams and ExecLayerGrads. */
#define LAYER_FIELDS(X)                                                                           \
    X("ln1.w", ln1_w) X("ln1.b", ln1_b) X("attn.qkv.w", qkv_w) X("attn.qkv.b", qkv_b)             \
    X("attn.proj.w", proj_w) X("attn.proj.b", proj_b) X("ln2.w", ln2_w) X("ln2.b", ln2_b)         \
    X("mlp.fc1.w", fc1_w) X("mlp.fc1.b", fc1_b) X("mlp.fc2.w", fc2_w) X("mlp.fc2.b", fc2_b)

static void **layer_weight(ExecLayerParams *p, const char *suffix)
{
#define X(s, f)                                                                                   \
    if (!strcmp(suffix, s))                                                                       \
        return &p->f;
    LAYER_FIELDS(X)
#undef X
    return NULL;
}

static float **layer_grad(ExecLayerGrads *g, const char *suffix)
{
#define X(s, f)                                                                                   \
    if (!strcmp(suffix, s))                                                                       \
        return &g->f;
    LAYER_FIELDS(X)
#undef X
    return NULL;
}

/* The view a weight named `name` binds to; NULL if unknown. */
static void **weight_slot(Exec *ex, const char *name)
{
    const char *suffix;
    int l = layer_of(name, &suffix);
    if (l >= 0)
        return l < ex->spec.model.layers ? layer_weight(&ex->lw[l], suffix) : NULL;
    if (!strcmp(name, "embed.wte"))
        return &ex->wte;
    if (!strcmp(name, "embed.wpe"))
        return &ex->wpe;
    if (!strcmp(name, "final_ln.w"))
        return &ex->lnf_w;
    if (!strcmp(name, "final_ln.b"))
        return &ex->lnf_b;
    if (!strcmp(name, "logits.w"))
        return &ex->out_w;
    return NULL;
}

/* The view the gradient of the weight named `name` binds to; NULL if unknown. */
static float **grad_slot(Exec *ex, const char *name)
{
    const char *suffix;
    int l = layer_of(name, &suffix);
    if (l >= 0)
        return l < ex->spec.model.layers ? layer_grad(&ex->lg[l], suffix) : NULL;
    if (!strcmp(name, "embed.wte"))
        return &ex->g_wte;
    if (!strcmp(name, "embed.wpe"))
        return &ex->g_wpe;
    if (!strcmp(name, "final_ln.w"))
        return &ex->g_lnf_w;
    if (!strcmp(name, "final_ln.b"))
        return &ex->g_lnf_b;
    if (!strcmp(name, "logits.w"))
        return &ex->g_out_w;
    return NULL;
}

static ExecParam *param_named(Exec *ex, const char *name)
{
    for (int i = 0; i < ex->n_params; i++)
        if (!strcmp(ex->params[i].name, name))
            return &ex->params[i];
    return NULL;
}

/* The parameters of the stage, block by block, from the table without ZeRO (ZeRO-3's table
 * holds only shards, not the parameters inside them): names, shapes, offsets in the block,
 * and how each is sharded over TP, initialized and counted. */
static int params_from_twin(Exec *ex, PxError *err)
{
    const ModelTensorTable *tw = &ex->twin;
    const int tp = ex->d.t > 1, sw = ex->spec.model.mlp == MODEL_SWIGLU;
    int n = 0;
    for (int i = 0; i < tw->count; i++)
        n += tw->t[i].cat == MODEL_WEIGHTS && !tw->t[i].per_microbatch;
    ex->params = calloc((size_t)(n > 0 ? n : 1), sizeof *ex->params);
    ex->n_blocks = ex->tt.n_blocks;
    ex->blocks = calloc((size_t)(ex->n_blocks > 0 ? ex->n_blocks : 1), sizeof *ex->blocks);
    if (!ex->params || !ex->blocks)
        return px_fail(err, PX_ERUNTIME, "out of memory for the parameter table");
    if (tw->n_blocks != ex->tt.n_blocks)
        return px_fail(err, PX_ERUNTIME, "the ZeRO-%d table has %d blocks, without ZeRO %d: model/ "
                       "disagrees with itself", ex->spec.layout.zero, ex->tt.n_blocks, tw->n_blocks);
    for (int b = 0; b < ex->n_blocks; b++) {
        const ModelBlock *mb = &ex->tt.blocks[b];
        ExecBlock *blk = &ex->blocks[b];
        if (strcmp(mb->name, tw->blocks[b].name) != 0 || mb->numel != tw->blocks[b].numel)
            return px_fail(err, PX_ERUNTIME, "block %s differs between the ZeRO and plain tables",
                           mb->name);
        blk->chunk = mb->chunk;
        blk->layer = mb->layer;
        blk->numel = mb->numel;
        blk->shard = ex->spec.layout.zero >= 1 ? mb->shard_numel : mb->numel;
        blk->first_param = -1;
        blk->dp_req = -1;
        if (ex->spec.layout.zero >= 1) {
            uint64_t lo = (uint64_t)ex->zero_rank * blk->shard;
            blk->own_off = lo < blk->numel ? lo : blk->numel;
            uint64_t hi = lo + blk->shard < blk->numel ? lo + blk->shard : blk->numel;
            blk->own_n = hi > blk->own_off ? hi - blk->own_off : 0;
        } else {
            blk->own_off = 0;
            blk->own_n = blk->numel;
        }
        if (!strcmp(mb->name, "embed"))
            ex->embed_block = b;
        else if (!strcmp(mb->name, "final"))
            ex->final_block = b;
    }
    uint64_t *off = calloc((size_t)(ex->n_blocks > 0 ? ex->n_blocks : 1), sizeof *off);
    if (!off)
        return px_fail(err, PX_ERUNTIME, "out of memory for the parameter table");
    for (int i = 0; i < tw->count; i++) {
        const ModelTensor *t = &tw->t[i];
        if (t->cat != MODEL_WEIGHTS || t->per_microbatch)
            continue;
        ExecParam *p = &ex->params[ex->n_params];
        if (t->block < 0 || t->block >= ex->n_blocks) {
            free(off);
            return px_fail(err, PX_ERUNTIME, "parameter %s has no block: model/ and exec/ disagree",
                           t->name);
        }
        px_strlcpy(p->name, t->name, sizeof p->name);
        p->wslot = weight_slot(ex, t->name);
        p->gslot = grad_slot(ex, t->name);
        if (!p->wslot || !p->gslot) {
            free(off);
            return px_fail(err, PX_ERUNTIME,
                           "the executor has no use for parameter %s: model/ and exec/ disagree",
                           t->name);
        }
        p->numel = t->numel;
        p->rows = t->shape[0];
        p->cols = t->ndim > 1 ? t->shape[1] : 1;
        p->block = t->block;
        p->off = off[t->block];
        off[t->block] += t->numel;
        ExecBlock *blk = &ex->blocks[t->block];
        if (blk->first_param < 0)
            blk->first_param = ex->n_params;
        blk->n_params++;
        p->decay = t->ndim >= 2;
        p->replicated = !(t->shard & MODEL_SHARD_TP);
        p->norm = ends_with(t->name, "ln1.w") || ends_with(t->name, "ln1.b") ||
                  ends_with(t->name, "ln2.w") || ends_with(t->name, "ln2.b") ||
                  !strcmp(t->name, "final_ln.w") || !strcmp(t->name, "final_ln.b");
        p->tied_copy = ex->tied_pair && !strcmp(t->name, "logits.w");
        /* the output layer's copy starts as an exact copy of the embedding */
        px_strlcpy(p->init_name, p->tied_copy ? "embed.wte" : t->name, sizeof p->init_name);
        p->map = EXEC_MAP_FULL;
        if (tp) {
            if (ends_with(t->name, "attn.qkv.w") || ends_with(t->name, "attn.qkv.b"))
                p->map = EXEC_MAP_QKV;
            else if (ends_with(t->name, "mlp.fc1.w") || ends_with(t->name, "mlp.fc1.b"))
                p->map = sw ? EXEC_MAP_SWIGLU : EXEC_MAP_ROWS;
            else if (ends_with(t->name, "attn.proj.w") || ends_with(t->name, "mlp.fc2.w"))
                p->map = EXEC_MAP_COLS;
            else if (!strcmp(t->name, "embed.wte") || !strcmp(t->name, "logits.w"))
                p->map = EXEC_MAP_ROWS;
        }
        ex->n_params++;
    }
    int rc = PX_OK;
    for (int b = 0; b < ex->n_blocks && !rc; b++)
        if (off[b] != ex->blocks[b].numel)
            rc = px_fail(err, PX_ERUNTIME, "block %s holds %llu elements but its parameters %llu",
                         ex->tt.blocks[b].name, (unsigned long long)ex->blocks[b].numel,
                         (unsigned long long)off[b]);
    free(off);
    if (rc)
        return rc;
    for (int b = 0; b < ex->n_blocks; b++)
        ex->blocks[b].tied = ex->tied_pair && (b == ex->embed_block || b == ex->final_block);
    return PX_OK;
}

/* ---- binding the table to the arenas ---- */

static int unknown_tensor(const ModelTensor *t, PxError *err)
{
    return px_fail(err, PX_ERUNTIME,
                   "the executor has no use for tensor %s (%s) of the tensor table: model/ and "
                   "exec/ disagree",
                   t->name, model_category_name(t->cat));
}

/* A tensor whose dtype is not the one the executor gives it (the table and the kernels must
 * agree on every byte). */
static int wrong_dtype(const ModelTensor *t, PxDtype want, PxError *err)
{
    return px_fail(err, PX_ERUNTIME,
                   "tensor %s of the tensor table is %s but the executor keeps it in %s: model/ and "
                   "exec/ disagree",
                   t->name, px_dtype_name(t->dtype), px_dtype_name(want));
}

/* The workspace tensors the executor binds by name, with their dtypes. */
static int bind_workspace(Exec *ex, const ModelTensor *t, void *p, PxError *err)
{
    static const struct {
        const char *name;
        size_t off;
        int act; /* 1: act dtype (void *), 0: fp32 (float *) */
    } ws[] = {
        {"ws.out", offsetof(Exec, ws_out), 1},         {"ws.dx_a", offsetof(Exec, ws_dx_a), 1},
        {"ws.dx_b", offsetof(Exec, ws_dx_b), 1},       {"ws.dhid", offsetof(Exec, ws_dhid), 1},
        {"ws.dqkv", offsetof(Exec, ws_dqkv), 1},       {"ws.dffn", offsetof(Exec, ws_dffn), 1},
        {"ws.dact", offsetof(Exec, ws_dact), 1},       {"ws.dscores", offsetof(Exec, ws_dscores), 1},
        {"ws.flash_d", offsetof(Exec, ws_flash_d), 0}, {"ws.xent", offsetof(Exec, ws_xent), 0},
    };
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        if (strcmp(t->name, ws[i].name) != 0)
            continue;
        PxDtype want = ws[i].act ? ex->act : PX_FP32;
        if (t->dtype != want)
            return wrong_dtype(t, want, err);
        if (ws[i].act)
            *(void **)(void *)((char *)ex + ws[i].off) = p;
        else
            *(float **)(void *)((char *)ex + ws[i].off) = p;
        return PX_OK;
    }
    if (!strcmp(t->name, "data.batch")) {
        if (t->dtype != PX_INT32)
            return wrong_dtype(t, PX_INT32, err);
        ex->batch[0] = p;
        ex->batch[1] = p ? (int32_t *)p + t->numel / 2 : NULL;
        return PX_OK;
    }
    return unknown_tensor(t, err);
}

static int bind_static(Exec *ex, int pass, PxError *err)
{
    const ModelTensorTable *tt = &ex->tt;
    /* weights (act dtype) and gradients (fp32) in table order, so that a block's parameters are
     * contiguous */
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->per_microbatch || (t->cat != MODEL_WEIGHTS && t->cat != MODEL_GRADS))
            continue;
        const PxDtype want = t->cat == MODEL_WEIGHTS ? ex->act : PX_FP32;
        if (t->dtype != want)
            return wrong_dtype(t, want, err);
        void *p = exec_arena_carve(&ex->arena[t->cat], t->bytes, px_dtype_bytes(t->dtype));
        if (t->block >= 0 && ends_with(t->name, ".w_shard") && t->cat == MODEL_WEIGHTS) {
            if (pass)
                ex->blocks[t->block].w_shard = p;
            continue;
        }
        if (t->block >= 0 && ends_with(t->name, ".grad_shard") && t->cat == MODEL_GRADS) {
            if (pass)
                ex->blocks[t->block].g_shard = p;
            continue;
        }
        char base[64];
        px_strlcpy(base, t->name, sizeof base);
        int grad = t->cat == MODEL_GRADS;
        if (grad) {
            if (!ends_with(base, ".grad"))
                return unknown_tensor(t, err);
            base[strlen(base) - 5] = '\0';
        }
        ExecParam *q = param_named(ex, base);
        if (!q || q->numel != t->numel)
            return unknown_tensor(t, err);
        if (pass) {
            if (grad)
                q->g = p;
            else
                q->w = p;
        }
    }
    /* master weights and optimizer state (fp32): one flat buffer per block and kind (ZeRO >= 1:
     * the shard) */
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_OPTIMIZER && t->cat != MODEL_MASTER)
            continue;
        void *p = exec_arena_carve(&ex->arena[t->cat], t->bytes, px_dtype_bytes(t->dtype));
        const char *dot = strrchr(t->name, '.');
        if (!dot || t->block < 0)
            return unknown_tensor(t, err);
        if (t->dtype != PX_FP32)
            return wrong_dtype(t, PX_FP32, err);
        ExecBlock *blk = &ex->blocks[t->block];
        float **slot = NULL;
        if (t->cat == MODEL_MASTER && !strcmp(dot, ".master"))
            slot = &blk->master;
        else if (t->cat == MODEL_OPTIMIZER && (!strcmp(dot, ".adam_m") || !strcmp(dot, ".momentum")))
            slot = &blk->m;
        else if (t->cat == MODEL_OPTIMIZER && !strcmp(dot, ".adam_v"))
            slot = &blk->v;
        else
            return unknown_tensor(t, err);
        if (pass)
            *slot = p;
    }
    /* workspace: by element size, largest first, so that no tensor needs padding; ws.recompute
     * (bytes that hold fp32 and act tensors and masks) after the 2-byte ones, at a 4-byte
     * boundary: the 2-byte tensors end on one when their element counts are even, as in every
     * model here (an odd one would show as padding, a workspace that differs from the table) */
    static const int order[] = {8, 4, 2, 0, 1}; /* 0: ws.recompute */
    for (size_t o = 0; o < sizeof order / sizeof order[0]; o++) {
        const int pass_size = order[o];
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (t->per_microbatch || t->cat != MODEL_WORKSPACE)
                continue;
            int is_re = !strcmp(t->name, "ws.recompute");
            if (is_re ? pass_size != 0 : px_dtype_bytes(t->dtype) != (size_t)pass_size)
                continue;
            void *p = exec_arena_carve(&ex->arena[MODEL_WORKSPACE], t->bytes,
                                       is_re ? 4 : px_dtype_bytes(t->dtype));
            if (is_re) {
                if (pass) {
                    ex->re_base = p;
                    ex->re_bytes = t->bytes;
                }
                continue;
            }
            int rc = bind_workspace(ex, t, pass ? p : NULL, err);
            if (rc)
                return rc;
        }
    }
    /* communication buffers: pipeline send and receive, the sequence-parallel gather (act),
     * ZeRO's gradient bucket (fp32) and its two parameter-gather buffers (act) */
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_COMM_BUFFERS)
            continue;
        const char *n = t->name;
        const int bucket = !strcmp(n, "zero.grad_bucket");
        const PxDtype want = bucket ? PX_FP32 : ex->act;
        if (t->dtype != want)
            return wrong_dtype(t, want, err);
        void *p = exec_arena_carve(&ex->arena[MODEL_COMM_BUFFERS], t->bytes, px_dtype_bytes(want));
        if (!strcmp(n, "pp.send")) {
            ex->pp_send = p;
            ex->pp_elems = t->numel;
        } else if (!strcmp(n, "pp.recv")) {
            ex->pp_recv = p;
            if (t->numel != ex->pp_elems)
                return unknown_tensor(t, err);
        } else if (!strcmp(n, "sp.gather")) {
            ex->sp_gather = p;
        } else if (bucket) {
            ex->grad_bucket = p;
            ex->bucket_elems = t->numel;
        } else if (!strcmp(n, "zero.param_gather")) {
            ex->param_gather[0] = p;
            ex->param_gather[1] = p ? EXEC_AT(p, t->numel / 2, ex->ab) : NULL;
            ex->gather_elems = t->numel / 2;
        } else {
            return unknown_tensor(t, err);
        }
    }
    return PX_OK;
}

/* ws.recompute holds what the recompute mode does not save: one layer's worth, reused by every
 * layer (forward scratch, then the re-created tensors before the layer's backward). */
static int bind_region(Exec *ex, uint8_t *base, uint64_t bytes, PxError *err)
{
    ActField f[ACT_FIELDS];
    act_fields(ex, f);
    ExecArena r = {.base = base, .cap = bytes};
    ExecLayerActs view;
    memset(&view, 0, sizeof view);
    /* larger elements first (fp32, then act, then masks): nothing needs padding */
    for (size_t es = 8; es >= 1; es /= 2) {
        for (int i = 0; i < ACT_FIELDS; i++) {
            if (!f[i].needed || px_dtype_bytes(f[i].dt) != es)
                continue;
            /* saved in the slot? then it does not live here (every layer saves the same set) */
            int saved = 0;
            for (int k = 0; k < ex->tt.count && !saved; k++) {
                const char *suffix;
                const ModelTensor *t = &ex->tt.t[k];
                saved = t->per_microbatch && layer_of(t->name, &suffix) >= 0 &&
                        !strcmp(suffix, f[i].suffix);
            }
            if (saved)
                continue;
            void *p = exec_arena_carve(&r, f[i].numel * es, es);
            act_set(&view, &f[i], p);
        }
    }
    if (r.used != bytes)
        return px_fail(err, PX_ERUNTIME,
                       "ws.recompute holds %llu bytes but the %s recompute needs %llu: model/ and "
                       "exec/ disagree",
                       (unsigned long long)bytes, model_recompute_name(ex->spec.layout.recompute),
                       (unsigned long long)r.used);
    ex->region = view;
    return PX_OK;
}

/* Saved activations: a pool of n_slots layer sets (one set: the cl layers of a chunk, whichever
 * chunk runs) and per chunk a pool of its extras, each tensor's copies side by side, fp32
 * tensors before the uint8 masks so that nothing needs padding. The table lists every chunk's
 * layers; chunks are alike, so the first chunk's tensors size the slots and the others are
 * only checked against them. */
static int bind_activations(Exec *ex, int pass, PxError *err)
{
    const ModelTensorTable *tt = &ex->tt;
    const int cl = ex->cl;
    ActField f[ACT_FIELDS];
    act_fields(ex, f);
    ex->slot_bytes = 0;
    for (int j = 0; j < ex->d.v; j++)
        ex->xslot_bytes[j] = 0;
    for (int es = 8; es >= 1; es /= 2) {
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (!t->per_microbatch || px_dtype_bytes(t->dtype) != (size_t)es)
                continue;
            const char *suffix = NULL;
            int l = layer_of(t->name, &suffix);
            int fi = l >= 0 ? act_field_index(f, suffix) : -1;
            const int j = t->chunk;
            if (j < 0 || j >= ex->d.v)
                return unknown_tensor(t, err);
            const int li = l - ex->chunk_l0[j]; /* the layer's place in its chunk */
            if (l >= 0) {
                if (li < 0 || li >= cl || fi < 0 || !f[fi].needed || f[fi].numel != t->numel)
                    return unknown_tensor(t, err);
                if (t->dtype != f[fi].dt)
                    return wrong_dtype(t, f[fi].dt, err);
                if (j != 0)
                    continue; /* the first chunk's layers size the shared slots */
                ex->slot_bytes += t->bytes;
            } else {
                const PxDtype want = !strcmp(t->name, "embed.drop_mask") ? PX_UINT8
                                     : !strcmp(t->name, "loss.probs")     ? PX_FP32
                                                                          : ex->act;
                if (t->dtype != want)
                    return wrong_dtype(t, want, err);
                ex->xslot_bytes[j] += t->bytes;
            }
            int copies = l >= 0 ? ex->n_slots : ex->n_xslots[j];
            for (int k = 0; k < copies; k++) {
                void *p = exec_arena_carve(&ex->arena[MODEL_ACTIVATIONS], t->bytes, (size_t)es);
                if (!pass)
                    continue;
                if (l >= 0) {
                    act_set(&ex->acts[(size_t)k * cl + li], &f[fi], p);
                    continue;
                }
                ExecHeadActs *x = &ex->xacts[j][k];
                if (!strcmp(t->name, "embed.drop_mask"))
                    x->embed_drop_mask = p;
                else if (!strcmp(t->name, "final_ln.in"))
                    x->final_ln_in = p;
                else if (!strcmp(t->name, "logits.in"))
                    x->logits_in = p;
                else if (!strcmp(t->name, "loss.probs"))
                    x->probs = p;
                else
                    return unknown_tensor(t, err);
            }
        }
    }
    if (!pass)
        return PX_OK;
    /* every slot's layers: what is not saved lives in ws.recompute */
    for (int k = 0; k < ex->n_slots; k++)
        for (int li = 0; li < cl; li++)
            for (int i = 0; i < ACT_FIELDS; i++) {
                ExecLayerActs *a = &ex->acts[(size_t)k * cl + li];
                if (f[i].needed && !act_get(a, &f[i])) {
                    void *p = act_get(&ex->region, &f[i]);
                    if (!p)
                        return px_fail(err, PX_ERUNTIME,
                                       "a layer's %s is neither saved nor in ws.recompute: model/ "
                                       "and exec/ disagree",
                                       f[i].suffix);
                    act_set(a, &f[i], p);
                }
            }
    for (int j = 0; j < ex->d.v; j++) {
        const int g = ex->chunk_g[j];
        for (int k = 0; k < ex->n_xslots[j]; k++) {
            const ExecHeadActs *x = &ex->xacts[j][k];
            if ((g == ex->d.chunks - 1 && (!x->final_ln_in || !x->logits_in || !x->probs)) ||
                (g == 0 && ex->dropout > 0 && !x->embed_drop_mask))
                return px_fail(err, PX_ERUNTIME, "the embedding's or output layer's saved tensors "
                                                 "are incomplete: model/ and exec/ disagree");
        }
    }
    return PX_OK;
}

/* pass 0 sizes the arenas, pass 1 carves them and points every view at its tensor. */
static int bind(Exec *ex, int pass, PxError *err)
{
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        ex->arena[c].used = 0;
    ex->re_base = NULL;
    ex->re_bytes = 0;
    int rc = bind_static(ex, pass, err);
    if (!rc && pass)
        rc = bind_region(ex, ex->re_base, ex->re_bytes, err);
    if (!rc)
        rc = bind_activations(ex, pass, err);
    return rc;
}

static int allocate(Exec *ex, PxError *err)
{
    int rc = bind(ex, 0, err);
    if (rc)
        return rc;
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        ExecArena *a = &ex->arena[c];
        a->cap = a->used;
        if (a->cap == 0)
            continue;
        a->base = ex->k->alloc(a->cap);
        if (!a->base)
            return px_fail(err, PX_ERUNTIME, "out of memory: %.3f GiB of %s",
                           (double)a->cap / PX_GIB, model_category_name((ModelCategory)c));
    }
    rc = bind(ex, 1, err);
    for (int c = 0; !rc && c < MODEL_CAT_COUNT; c++)
        if (ex->arena[c].used != ex->arena[c].cap)
            rc = px_fail(err, PX_ERUNTIME, "the %s arena was sized %llu bytes but carved %llu",
                         model_category_name((ModelCategory)c),
                         (unsigned long long)ex->arena[c].cap,
                         (unsigned long long)ex->arena[c].used);
    return rc;
}

/* Points every parameter's views at its memory: its own tensors (ZeRO < 3 weights, < 2
 * gradients), the gradient bucket at its offset (ZeRO 2/3), nothing yet for ZeRO-3 weights
 * (exec_gather_block points them into the gather buffer). Blocks are contiguous in table order:
 * checked, since reductions and ZeRO treat a block as one flat buffer. */
static int bind_params(Exec *ex, PxError *err)
{
    const int zero = ex->spec.layout.zero;
    for (int b = 0; b < ex->n_blocks; b++) {
        ExecBlock *blk = &ex->blocks[b];
        if (blk->n_params == 0)
            continue;
        const ExecParam *first = &ex->params[blk->first_param];
        blk->w = zero < 3 ? first->w : NULL;
        blk->g = zero < 2 ? first->g : NULL;
        if ((zero == 3 && !blk->w_shard) || (zero >= 2 && !blk->g_shard) || !blk->m ||
            (ex->spec.job.optimizer == MODEL_OPT_ADAMW && !blk->v) || (ex->d.master && !blk->master))
            return px_fail(err, PX_ERUNTIME, "block %s lacks its ZeRO-%d state: model/ and exec/ "
                           "disagree", ex->tt.blocks[b].name, zero);
    }
    if (zero >= 2 && !ex->grad_bucket)
        return px_fail(err, PX_ERUNTIME, "ZeRO-%d without zero.grad_bucket: model/ and exec/ disagree",
                       zero);
    if (zero == 3 && !ex->param_gather[0])
        return px_fail(err, PX_ERUNTIME, "ZeRO-3 without zero.param_gather: model/ and exec/ disagree");
    for (int i = 0; i < ex->n_params; i++) {
        ExecParam *p = &ex->params[i];
        const ExecBlock *blk = &ex->blocks[p->block];
        if (zero >= 2) {
            if (px_round_up(blk->numel, (uint64_t)ex->zero_n) > ex->bucket_elems)
                return px_fail(err, PX_ERUNTIME, "block of %s exceeds the gradient bucket",
                               p->name);
            p->g = ex->grad_bucket + p->off;
        }
        if ((zero < 3 && p->w != EXEC_AT(blk->w, p->off, ex->ab)) ||
            (zero < 2 && p->g != blk->g + p->off))
            return px_fail(err, PX_ERUNTIME,
                           "parameter %s is not where its block's flat layout puts it: model/ and "
                           "exec/ disagree",
                           p->name);
        *p->wslot = p->w;
        *p->gslot = p->g;
    }
    if (ex->tied_here) {
        ex->out_w = ex->wte;
        ex->g_out_w = ex->g_wte;
    }
    return PX_OK;
}

/* ---- the op graph's names ---- */

static int phase_slot(ModelPhase p) { return p == MODEL_STEP ? 0 : (int)p; }

static uint64_t op_key(const char *name, int chunk)
{
    return exec_hash_name((uint64_t)(chunk + 7), name);
}

int exec_op_find(const Exec *ex, int chunk, ModelPhase phase, int occurrence, const char *fmt, ...)
{
    char base[96], name[112];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "%s.%s", base, model_phase_name(phase));
    const int cap = ex->op_hash_cap;
    if (cap <= 0)
        return -1;
    for (uint64_t h = op_key(name, chunk) & (uint64_t)(cap - 1);; h = (h + 1) & (uint64_t)(cap - 1)) {
        int i = ex->op_hash[h];
        if (i < 0)
            return -1;
        if (ex->ops[i].chunk == chunk && !strcmp(ex->ops[i].name, name)) {
            while (occurrence-- > 0 && i >= 0)
                i = ex->ops[i].next_same;
            return i;
        }
    }
}

static int map_ops(Exec *ex, PxError *err)
{
    static const char *const layer_names[EX_LAYER_OPS] = {
        "ln1", "attn.qkv", "attn.core", "attn.proj", "ln2", "mlp.fc1", "mlp.act", "mlp.fc2"};
    static const char *const other_names[EX_OTHER_OPS] = {"embed", "final_ln", "logits", "loss",
                                                          "optimizer"};
    const int L = ex->spec.model.layers;
    const ModelOpGraph *g = &ex->graph;
    int cap = 16;
    while (cap < 2 * g->count)
        cap *= 2;
    ex->ops = calloc((size_t)(g->count > 0 ? g->count : 1), sizeof *ex->ops);
    ex->report = calloc((size_t)(g->count > 0 ? g->count : 1), sizeof *ex->report);
    ex->layer_op = malloc((size_t)L * EX_LAYER_OPS * EX_PHASES * sizeof *ex->layer_op);
    ex->op_hash = malloc((size_t)cap * sizeof *ex->op_hash);
    if (!ex->ops || !ex->report || !ex->layer_op || !ex->op_hash)
        return px_fail(err, PX_ERUNTIME, "out of memory for the op table");
    ex->op_hash_cap = cap;
    for (int i = 0; i < cap; i++)
        ex->op_hash[i] = -1;
    for (int i = 0; i < L * EX_LAYER_OPS * EX_PHASES; i++)
        ex->layer_op[i] = -1;
    for (int i = 0; i < EX_OTHER_OPS; i++)
        for (int p = 0; p < EX_PHASES; p++)
            ex->other_op[i][p] = -1;
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        ExecOpStat *o = &ex->ops[i];
        model_op_fullname(op, o->name, sizeof o->name);
        o->compute = op->kind != MODEL_OP_COMM;
        o->chunk = op->chunk;
        o->phase = op->phase;
        o->next_same = -1;
        /* every op by (name, chunk); repeats chain in graph order (ZeRO-3 gathers a tied
         * embedding twice per pass) */
        for (uint64_t h = op_key(o->name, o->chunk) & (uint64_t)(cap - 1);;
             h = (h + 1) & (uint64_t)(cap - 1)) {
            int k = ex->op_hash[h];
            if (k < 0) {
                ex->op_hash[h] = i;
                break;
            }
            if (ex->ops[k].chunk == o->chunk && !strcmp(ex->ops[k].name, o->name)) {
                while (ex->ops[k].next_same >= 0)
                    k = ex->ops[k].next_same;
                ex->ops[k].next_same = i;
                break;
            }
        }
        if (!o->compute)
            continue;
        const char *suffix;
        int l = layer_of(op->name, &suffix);
        int found = 0;
        if (l >= 0 && l < L) {
            for (int k = 0; k < EX_LAYER_OPS && !found; k++)
                if (!strcmp(suffix, layer_names[k])) {
                    ex->layer_op[(l * EX_LAYER_OPS + k) * EX_PHASES + phase_slot(op->phase)] = i;
                    found = 1;
                }
        } else {
            for (int k = 0; k < EX_OTHER_OPS && !found; k++)
                if (!strcmp(op->name, other_names[k])) {
                    ex->other_op[k][phase_slot(op->phase)] = i;
                    found = 1;
                }
        }
        if (!found)
            return px_fail(err, PX_ERUNTIME, "the executor does not run op %s of the op graph",
                           o->name);
    }
    /* and every op the executor runs must be in the graph: the stage's layers, its embedding
     * and output layer, the optimizer */
    const ModelRecompute rc = ex->spec.layout.recompute;
    for (int j = 0; j < ex->d.v; j++)
        for (int l = ex->chunk_l0[j]; l < ex->chunk_l0[j] + ex->cl; l++)
            for (int k = 0; k < EX_LAYER_OPS; k++)
                for (int p = 0; p < EX_PHASES; p++) {
                    int want = p != MODEL_RECOMPUTE || rc == MODEL_RECOMPUTE_FULL ||
                               (k == EX_CORE && rc == MODEL_RECOMPUTE_SELECTIVE && !ex->spec.job.flash_attn);
                    if (want && ex->layer_op[(l * EX_LAYER_OPS + k) * EX_PHASES + p] < 0)
                        return px_fail(err, PX_ERUNTIME, "the op graph has no layer.%d.%s.%s", l,
                                       layer_names[k], model_phase_name((ModelPhase)p));
                }
    for (int k = 0; k < EX_OTHER_OPS; k++) {
        int here = k == EX_OPTIMIZER || (k == EX_EMBED ? ex->embed_block >= 0 : ex->has_loss);
        for (int p = 0; p < 2 && here; p++)
            if ((k == EX_OPTIMIZER ? p == 0 : 1) && ex->other_op[k][p] < 0)
                return px_fail(err, PX_ERUNTIME, "the op graph has no %s.%s", other_names[k],
                               k == EX_OPTIMIZER ? "step" : model_phase_name((ModelPhase)p));
    }
    ex->cur_op = -1;
    return PX_OK;
}

/* ---- what this build can run ---- */

static int check_supported(const Exec *ex, const char *origin, PxError *err)
{
    const ModelSpec *s = &ex->spec;
    const ModelDims *d = &ex->d;
    if (d->c > 1)
        return px_fail(err, PX_EINPUT,
                       "%s: layout.cp %d: the executor does not run context parallelism (make the "
                       "plan with --cp 1)",
                       origin, d->c);
    if (d->gpus != comm_world(ex->comm)) {
        if (comm_world(ex->comm) == 1 && !comm_mpi_available())
            return px_fail(err, PX_EINPUT,
                           "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d) but this "
                           "parallax-worker was built without MPI: it runs single-rank plans only "
                           "(install libopenmpi-dev and rebuild)",
                           origin, d->gpus, d->dp, d->t, d->p, d->c);
        if (comm_world(ex->comm) == 1)
            return px_fail(err, PX_EINPUT,
                           "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d) but this "
                           "process runs alone: start it with parallax run (mpirun / srun)",
                           origin, d->gpus, d->dp, d->t, d->p, d->c);
        return px_fail(err, PX_EINPUT,
                       "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d) but the job "
                       "has %d",
                       origin, d->gpus, d->dp, d->t, d->p, d->c, comm_world(ex->comm));
    }
    if (s->job.grad_dtype != PX_FP32)
        return px_fail(err, PX_EINPUT,
                       "%s: training.grad_dtype %s: the executor accumulates gradients in fp32 "
                       "(make the plan with --grad-dtype fp32)",
                       origin, px_dtype_name(s->job.grad_dtype));
    if (s->job.optimizer == MODEL_OPT_ADAM_8BIT)
        return px_fail(err, PX_EINPUT,
                       "%s: training.optimizer adam-8bit is not implemented by the executor yet: "
                       "use adamw or sgd-momentum",
                       origin);
    if (s->model.position == MODEL_POS_ROPE && s->model.head_dim % 2 != 0)
        return px_fail(err, PX_EINPUT, "%s: rotary embeddings need an even head_dim, got %d", origin,
                       s->model.head_dim);
    if (d->v > 64)
        return px_fail(err, PX_EINPUT, "%s: layout.vpp %d: at most 64 chunks per rank", origin, d->v);
    return PX_OK;
}

/* ---- the backend ---- */

/* The CPU profile is named cpu (and a calibrated CPU profile keeps its device's name); a device
 * without 16-bit tensor throughput is a CPU too. */
static int device_is_cpu(const ProfDevice *d)
{
    return !strncmp(d->name, "cpu", 3) || (d->peak_bf16 <= 0 && d->peak_fp16 <= 0);
}

int exec_backend_for_plan(const ModelPlan *plan, ExecBackend override, ExecBackend *out,
                          PxError *err)
{
    (void)err;
    *out = override;
    if (override == EXEC_BACKEND_AUTO)
        *out = device_is_cpu(&plan->profile.device) ? EXEC_BACKEND_CPU : EXEC_BACKEND_CUDA;
    return PX_OK;
}

/* The kernels for the plan: its precision on the chosen backend. PX_EINPUT names what does not
 * fit (the CPU trains fp32; CUDA bf16 or fp16; no CUDA device here). */
static int choose_backend(Exec *ex, const char *origin, PxError *err)
{
    const PxDtype prec = ex->spec.job.precision;
    const ProfDevice *dev = &ex->plan.profile.device;
    ExecBackend b = ex->opt.backend;
    if (b == EXEC_BACKEND_AUTO)
        b = device_is_cpu(dev) ? EXEC_BACKEND_CPU : EXEC_BACKEND_CUDA;
    if (b == EXEC_BACKEND_CPU) {
        if (prec != PX_FP32)
            return px_fail(err, PX_EINPUT,
                           "%s: training.precision %s: the CPU backend trains in fp32 (make the "
                           "plan with --precision fp32)",
                           origin, px_dtype_name(prec));
        ex->k = kern_cpu();
    } else {
        if (prec != PX_BF16 && prec != PX_FP16)
            return px_fail(err, PX_EINPUT,
                           "%s: training.precision %s: the CUDA backend trains in bf16 or fp16 "
                           "(make the plan with --precision bf16, or run an fp32 plan on the CPU "
                           "with --backend cpu)",
                           origin, px_dtype_name(prec));
        ex->k = kern_cuda_with(prec);
        if (!ex->k) {
            if (ex->opt.backend == EXEC_BACKEND_AUTO)
                return px_fail(err, PX_EINPUT,
                               "%s: training.precision %s: the CPU backend trains in fp32, and "
                               "this machine has no CUDA device for the plan's %s (parallax-worker "
                               "built without CUDA, or no driver or GPU visible): run it on a GPU "
                               "machine, or make the plan with --precision fp32",
                               origin, px_dtype_name(prec), dev->name);
            return px_fail(err, PX_EINPUT,
                           "%s: --backend cuda, but this machine has no CUDA device "
                           "(parallax-worker built without CUDA, or no driver or GPU visible)",
                           origin);
        }
        kern_cuda_device_name(ex->device_name, sizeof ex->device_name);
    }
    ex->act = ex->k->act;
    ex->ab = px_dtype_bytes(ex->act);
    if (ex->act != prec)
        return px_fail(err, PX_ERUNTIME, "the %s backend computes in %s, not the plan's %s",
                       ex->k->name, px_dtype_name(ex->act), px_dtype_name(prec));
    return PX_OK;
}

/* The directory of path must exist and take new files (run.json is written through a
 * temporary file beside it and renamed). */
static int check_writable(const char *path, PxError *err)
{
    char dir[256];
    px_strlcpy(dir, path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (!slash)
        px_strlcpy(dir, ".", sizeof dir);
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (access(dir, W_OK) != 0)
        return px_fail(err, PX_EINPUT, "%s: cannot write into %s: %s", path, dir, strerror(errno));
    return PX_OK;
}

/* PARALLAX_TEST_FAIL=RANK:WHERE makes one rank fail on purpose, so that tests can prove the
 * job ends (no rank left waiting): WHERE is "init" or "step:K" (before the K-th step, 1-based). */
static int test_failure(Exec *ex, PxError *err)
{
    ex->fail_step = -1;
    const char *s = getenv("PARALLAX_TEST_FAIL");
    if (!s || !*s)
        return PX_OK;
    int rank = -1, step = 0, n = 0;
    if (sscanf(s, "%d:init%n", &rank, &n) == 1 && n > 0 && s[n] == '\0') {
        if (rank == comm_rank(ex->comm))
            return px_fail(err, PX_ERUNTIME, "failing at start as PARALLAX_TEST_FAIL=%s asks", s);
        return PX_OK;
    }
    if (sscanf(s, "%d:step:%d", &rank, &step) == 2 && step >= 1) {
        if (rank == comm_rank(ex->comm))
            ex->fail_step = step - 1;
        return PX_OK;
    }
    return px_fail(err, PX_EINPUT, "PARALLAX_TEST_FAIL=%s: expected RANK:init or RANK:step:K", s);
}

/* Steps K[,K...] (1-based, K <= 64) of the environment variable `name` as bits k - 1. */
static int test_steps(const char *name, uint64_t *bits, PxError *err)
{
    *bits = 0;
    const char *s = getenv(name);
    if (!s || !*s)
        return PX_OK;
    for (const char *p = s; *p;) {
        char *end = NULL;
        long k = strtol(p, &end, 10);
        if (end == p || k < 1 || k > 64 || (*end && *end != ','))
            return px_fail(err, PX_EINPUT, "%s=%s: expected steps 1-64 separated by commas", name,
                           s);
        *bits |= 1ull << (k - 1);
        p = *end ? end + 1 : end;
    }
    return PX_OK;
}

/* PARALLAX_TEST_INF=K[,K...]: rank 0 writes +Inf into a gradient after the backward of each
 * step K (1-based, K <= 64), as an fp16 overflow would; the loss scaler's tests use it. */
static int test_inf(Exec *ex, PxError *err)
{
    return test_steps("PARALLAX_TEST_INF", &ex->inf_steps, err);
}

/* ---- failures on purpose, and the communication timeout (docs/executor.md, "Failures") ----
 * --fail-rank R --fail-step K (ExecOptions): rank R kills itself at the start of step K.
 * PARALLAX_TEST_HANG=RANK:step:K: that rank stops at the start of step K and never returns, so
 * that the others' communication timeout must end the job. PARALLAX_TEST_NAN_LOSS=K[,K...]:
 * rank 0's share of the loss of steps K is a NaN. */
static int failure_options(Exec *ex, const ExecOptions *opt, PxError *err)
{
    const int world = comm_world(ex->comm);
    ex->hang_step = -1;
    if (!(opt->comm_timeout_s >= 0))
        return px_fail(err, PX_EINPUT, "--comm-timeout: expected 0 (none) or a number of seconds, "
                                       "got %g", opt->comm_timeout_s);
    comm_set_timeout(ex->comm, opt->comm_timeout_s);
    comm_set_step(ex->comm, 0);
    if (opt->fail_step < 0)
        return px_fail(err, PX_EINPUT, "--fail-step %d: expected a step from 1", opt->fail_step);
    if (opt->fail_step > 0 && (opt->fail_rank < 0 || opt->fail_rank >= world))
        return px_fail(err, PX_EINPUT, "--fail-rank %d: the job has %d rank%s (0 to %d)",
                       opt->fail_rank, world, world == 1 ? "" : "s", world - 1);
    const char *s = getenv("PARALLAX_TEST_HANG");
    if (s && *s) {
        int rank = -1, step = 0, n = 0;
        if (sscanf(s, "%d:step:%d%n", &rank, &step, &n) != 2 || s[n] != '\0' || step < 1)
            return px_fail(err, PX_EINPUT, "PARALLAX_TEST_HANG=%s: expected RANK:step:K", s);
        if (rank == comm_rank(ex->comm))
            ex->hang_step = step - 1;
    }
    return test_steps("PARALLAX_TEST_NAN_LOSS", &ex->nan_loss_steps, err);
}

/* ---- init and free ---- */

static void *zalloc(size_t n, size_t size) { return calloc(n > 0 ? n : 1, size); }

int exec_init(Exec **out, const ModelPlan *plan, const ExecOptions *opt, PxError *err)
{
    *out = NULL;
    Exec *ex = calloc(1, sizeof *ex);
    if (!ex)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    ex->opt = *opt;
    ex->embed_block = ex->final_block = -1;
    ex->send_req = ex->recv_req = -1;
    px_strlcpy(ex->plan_path, opt->plan_path ? opt->plan_path : "plan", sizeof ex->plan_path);
    int rc = model_plan_copy(&ex->plan, plan, err);
    if (rc) {
        free(ex);
        return rc;
    }
    if (opt->comm) {
        ex->comm = opt->comm;
    } else {
        ex->comm = comm_single();
        ex->own_comm = 1;
        if (!ex->comm) {
            rc = px_fail(err, PX_ERUNTIME, "out of memory");
            goto fail;
        }
    }
    /* only rank 0 writes run.json and the metrics log */
    if (comm_rank(ex->comm) == 0) {
        if (opt->output)
            px_strlcpy(ex->output, opt->output, sizeof ex->output);
        if (opt->metrics)
            px_strlcpy(ex->metrics, opt->metrics, sizeof ex->metrics);
    } else {
        ex->opt.quiet = 1;
    }
    ex->spec = plan->spec;
    if (opt->data)
        px_strlcpy(ex->spec.job.data, opt->data, sizeof ex->spec.job.data);
    rc = model_spec_check(&ex->spec, plan->gpus, &ex->d, err);
    if (rc) {
        char msg[sizeof err->msg];
        px_strlcpy(msg, err->msg, sizeof msg);
        rc = px_fail(err, PX_EINPUT, "%s: %s", ex->plan_path, msg);
        goto fail;
    }
    ex->plan.spec = ex->spec;
    if ((rc = check_supported(ex, ex->plan_path, err)) || (rc = test_failure(ex, err)) ||
        (rc = test_inf(ex, err)) || (rc = failure_options(ex, opt, err)))
        goto fail;
    /* a run.json that cannot be written is found out now, not after the training */
    if (ex->output[0] && (rc = check_writable(ex->output, err)))
        goto fail;
    if (ex->metrics[0] && (rc = check_writable(ex->metrics, err)))
        goto fail;
    ex->steps = opt->steps > 0 ? opt->steps : ex->spec.job.steps;
    if (ex->steps < 1) {
        rc = px_fail(err, PX_EINPUT, "%s: training.steps is 0: nothing to run (give --steps N)",
                     ex->plan_path);
        goto fail;
    }
    /* run.json records the job as run: --steps and --data included */
    ex->spec.job.steps = ex->steps;
    ex->plan.spec = ex->spec;
    ex->dropout = (float)ex->spec.job.dropout;
    /* The fused (flash) kernel has no dropout of the attention probabilities; the residual and
     * embedding dropouts still apply. */
    ex->attn_dropout = ex->dropout > 0.0f && !ex->spec.job.flash_attn;
    if ((rc = model_predicted_read(&ex->plan, &ex->pred, err))) {
        char msg[sizeof err->msg];
        px_strlcpy(msg, err->msg, sizeof msg);
        rc = px_fail(err, rc, "%s: %s", ex->plan_path, msg);
        goto fail;
    }
    if ((rc = choose_backend(ex, ex->plan_path, err)))
        goto fail;
    ex->comm_note = opt->comm_note;
    exec_scaler_init(&ex->scaler, ex->act == PX_FP16, opt->loss_scale, opt->loss_scale_interval);
    {
        size_t fb = 0, tb = 0;
        if (ex->k->mem_info && ex->k->mem_info(&fb, &tb)) {
            ex->have_dev_mem = 1;
            ex->dev_total = tb;
            ex->dev_used_start = ex->dev_used_peak = tb - fb;
        }
    }

    /* this rank's place: stage, shards, neighbours */
    const ModelDims *d = &ex->d;
    const ModelLayout *lay = &ex->spec.layout;
    model_rank_coords(lay, comm_rank(ex->comm), &ex->tp_rank, &ex->cp_rank, &ex->dp_rank, &ex->stage);
    ex->zero_n = d->zero_group;
    ex->zero_rank = ex->cp_rank + lay->cp * ex->dp_rank;
    if (comm_group_size(ex->comm, MODEL_GROUP_DP) != ex->zero_n ||
        comm_group_rank(ex->comm, MODEL_GROUP_DP) != ex->zero_rank ||
        comm_group_size(ex->comm, MODEL_GROUP_TP) != d->t || comm_group_rank(ex->comm, MODEL_GROUP_TP) != ex->tp_rank) {
        rc = px_fail(err, PX_ERUNTIME, "the communication layer's groups do not follow the layout");
        goto fail;
    }
    ex->prev_rank = model_rank(lay, ex->tp_rank, ex->cp_rank, ex->dp_rank, (ex->stage + d->p - 1) % d->p);
    ex->next_rank = model_rank(lay, ex->tp_rank, ex->cp_rank, ex->dp_rank, (ex->stage + 1) % d->p);
    ex->chunk_g = zalloc((size_t)d->v, sizeof *ex->chunk_g);
    ex->chunk_l0 = zalloc((size_t)d->v, sizeof *ex->chunk_l0);
    if (!ex->chunk_g || !ex->chunk_l0) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory");
        goto fail;
    }
    /* the stage's chunks hold equally many layers (an uneven split has one chunk per stage),
     * so one slot of layer sets fits whichever chunk runs */
    for (int j = 0; j < d->v; j++) {
        ex->chunk_g[j] = model_global_chunk(d, ex->stage, j);
        ex->cl = model_chunk_layers(&ex->spec, d, ex->chunk_g[j], &ex->chunk_l0[j]);
    }
    ex->tied_here = ex->spec.model.tied_embeddings && d->chunks == 1;
    ex->tied_pair = ex->spec.model.tied_embeddings && d->chunks > 1;
    ex->defer_logits_wgrad = ex->tied_here && lay->zero >= 2;
    {
        ModelSpec plain = ex->spec;
        plain.layout.zero = 0;
        if ((rc = model_tensors_build(&ex->spec, d, ex->stage, &ex->tt, err)) ||
            (rc = model_tensors_build(&plain, d, ex->stage, &ex->twin, err)) ||
            (rc = model_ops_build(&ex->spec, d, ex->stage, &ex->graph, err)))
            goto fail;
    }
    for (int i = 0; i < ex->tt.count; i++) {
        ex->has_data |= !strcmp(ex->tt.t[i].name, "data.batch");
        ex->has_loss |= !strcmp(ex->tt.t[i].name, "ws.xent");
    }

    /* the schedule and the live sets it needs */
    const int L = ex->spec.model.layers;
    const int nact = 2 * d->m * d->v;
    ex->actions = zalloc((size_t)nact, sizeof *ex->actions);
    ex->recvs = zalloc((size_t)nact, sizeof *ex->recvs);
    ex->events = zalloc((size_t)nact, sizeof *ex->events);
    ex->last_events = zalloc((size_t)nact, sizeof *ex->last_events);
    ex->mb_slot = zalloc((size_t)d->m * d->v, sizeof *ex->mb_slot);
    ex->mb_xslot = zalloc((size_t)d->m * d->v, sizeof *ex->mb_xslot);
    ex->bwd_done = zalloc((size_t)d->v, sizeof *ex->bwd_done);
    ex->n_xslots = zalloc((size_t)d->v, sizeof *ex->n_xslots);
    ex->xslot_bytes = zalloc((size_t)d->v, sizeof *ex->xslot_bytes);
    ex->xlive = zalloc((size_t)d->v, sizeof *ex->xlive);
    ex->peak_xlive = zalloc((size_t)d->v, sizeof *ex->peak_xlive);
    ex->xacts = zalloc((size_t)d->v, sizeof *ex->xacts);
    ex->xslot_busy = zalloc((size_t)d->v, sizeof *ex->xslot_busy);
    if (!ex->actions || !ex->recvs || !ex->events || !ex->last_events || !ex->mb_slot ||
        !ex->mb_xslot || !ex->bwd_done || !ex->n_xslots || !ex->xslot_bytes || !ex->xlive ||
        !ex->peak_xlive || !ex->xacts || !ex->xslot_busy) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory for the schedule");
        goto fail;
    }
    ex->n_actions = model_schedule_build(d, lay->schedule, ex->stage, ex->actions);
    model_schedule_live(ex->actions, ex->n_actions, d->v, &ex->n_slots, ex->n_xslots);
    for (int j = 0; j < d->v; j++) {
        ex->xacts[j] = zalloc((size_t)ex->n_xslots[j], sizeof **ex->xacts);
        ex->xslot_busy[j] = zalloc((size_t)ex->n_xslots[j], sizeof **ex->xslot_busy);
        if (!ex->xacts[j] || !ex->xslot_busy[j]) {
            rc = px_fail(err, PX_ERUNTIME, "out of memory for the schedule");
            goto fail;
        }
    }

    /* the data, before memory: a bad file should fail fast */
    if (ex->has_data && (rc = exec_data_open(&ex->data, ex->spec.job.data, ex->spec.model.vocab,
                                             ex->spec.job.global_batch, d->s, err)))
        goto fail;

    ex->lw = zalloc((size_t)L, sizeof *ex->lw);
    ex->lg = zalloc((size_t)L, sizeof *ex->lg);
    ex->acts = zalloc((size_t)ex->n_slots * (size_t)ex->cl, sizeof *ex->acts);
    ex->slot_busy = zalloc((size_t)ex->n_slots, sizeof *ex->slot_busy);
    ex->step_loss = zalloc((size_t)ex->steps, sizeof *ex->step_loss);
    ex->step_time = zalloc((size_t)ex->steps, sizeof *ex->step_time);
    ex->step_tps = zalloc((size_t)ex->steps, sizeof *ex->step_tps);
    ex->step_bubble = zalloc((size_t)ex->steps, sizeof *ex->step_bubble);
    ex->step_skipped = zalloc((size_t)ex->steps, sizeof *ex->step_skipped);
    ex->step_scale = zalloc((size_t)ex->steps, sizeof *ex->step_scale);
    ex->host_loss = ex->has_loss ? zalloc((size_t)d->b * (size_t)d->s_loc, sizeof *ex->host_loss) : NULL;
    if (!ex->lw || !ex->lg || !ex->acts || !ex->slot_busy || !ex->step_loss || !ex->step_time ||
        !ex->step_tps || !ex->step_bubble || !ex->step_skipped || !ex->step_scale ||
        (ex->has_loss && !ex->host_loss)) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory");
        goto fail;
    }
    if ((rc = params_from_twin(ex, err)) || (rc = allocate(ex, err)))
        goto fail;
    /* the pools are what the simulator counts for this schedule */
    if (ex->arena[MODEL_ACTIVATIONS].cap !=
        model_activation_bytes(&ex->tt, d->v, ex->n_slots, ex->n_xslots)) {
        rc = px_fail(err, PX_ERUNTIME,
                     "the activation pools hold %llu bytes but model_activation_bytes counts %llu: "
                     "model/ and exec/ disagree",
                     (unsigned long long)ex->arena[MODEL_ACTIVATIONS].cap,
                     (unsigned long long)model_activation_bytes(&ex->tt, d->v, ex->n_slots, ex->n_xslots));
        goto fail;
    }
    if ((rc = bind_params(ex, err)) || (rc = map_ops(ex, err)))
        goto fail;
    if ((rc = exec_init_params(ex, err)))
        goto fail;
    /* checkpoints: the directory checked, and with --resume the state loaded over the
     * initial one */
    if ((rc = exec_ckpt_init(ex, err)))
        goto fail;
    /* memory the communication layer may be handed (the staged fallback mirrors it on the host) */
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        if (ex->arena[c].base && c != MODEL_OPTIMIZER && c != MODEL_MASTER &&
            (rc = comm_attach(ex->comm, ex->arena[c].base, ex->arena[c].cap, err)))
            goto fail;
    exec_sample_device_memory(ex);

    /* the loader reads into host staging buffers, copied to data.batch ahead of their step;
     * the CPU's data.batch is host memory already, so there the loader fills its two halves
     * directly and the batches take no memory beyond the workspace arena */
    ExecLoader *ld = &ex->loader;
    ex->staged = -1;
    const int direct = ex->k == kern_cpu();
    if (ex->has_data && !direct) {
        const size_t bytes = (size_t)d->m * d->b * (size_t)(d->s + 1) * sizeof(int32_t);
        for (int i = 0; i < 2; i++)
            if (!(ex->stage_buf[i] = ex->k->host_alloc(bytes))) {
                rc = px_fail(err, PX_ERUNTIME, "out of host memory for the batches (%zu bytes)",
                             bytes);
                goto fail;
            }
    }
    ld->src = &ex->data;
    ld->buf[0] = direct ? ex->batch[0] : ex->stage_buf[0];
    ld->buf[1] = direct ? ex->batch[1] : ex->stage_buf[1];
    ld->rows = d->m * d->b;
    ld->row_len = d->s + 1;
    ld->seq_len = d->s;
    ld->global_batch = ex->spec.job.global_batch;
    /* data-parallel rank r reads sequences r*m*b ... of each step (cp ranks share them) */
    ld->first_seq = (long long)ex->dp_rank * d->m * d->b;
    ld->key = exec_hash_name(ex->spec.job.seed, "data");
    if (ex->has_data) {
        if ((rc = exec_loader_start(ld, 0, err)))
            goto fail;
        ex->loader_started = 1;
    }
    *out = ex;
    return PX_OK;
fail:
    exec_free(ex);
    return rc;
}

void exec_free(Exec *ex)
{
    if (!ex)
        return;
    if (ex->loader_started)
        exec_loader_stop(&ex->loader);
    exec_data_close(&ex->data);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        if (ex->k && ex->arena[c].base)
            ex->k->free(ex->arena[c].base);
    for (int i = 0; i < 2; i++)
        if (ex->k && ex->stage_buf[i]) {
            ex->k->copy_sync(); /* no copy may still read it */
            ex->k->host_free(ex->stage_buf[i]);
        }
    exec_ckpt_free(ex);
    free(ex->host_loss);
    free(ex->step_skipped);
    free(ex->step_scale);
    if (ex->comm && ex->own_comm)
        comm_free(ex->comm);
    model_predicted_free(&ex->pred);
    model_tensors_free(&ex->tt);
    model_tensors_free(&ex->twin);
    model_ops_free(&ex->graph);
    model_plan_free(&ex->plan);
    free(ex->params);
    free(ex->blocks);
    free(ex->lw);
    free(ex->lg);
    free(ex->acts);
    if (ex->xacts)
        for (int j = 0; j < ex->d.v; j++)
            free(ex->xacts[j]);
    if (ex->xslot_busy)
        for (int j = 0; j < ex->d.v; j++)
            free(ex->xslot_busy[j]);
    free(ex->xacts);
    free(ex->xslot_busy);
    free(ex->n_xslots);
    free(ex->xslot_bytes);
    free(ex->xlive);
    free(ex->peak_xlive);
    free(ex->slot_busy);
    free(ex->chunk_g);
    free(ex->chunk_l0);
    free(ex->actions);
    free(ex->recvs);
    free(ex->events);
    free(ex->last_events);
    free(ex->mb_slot);
    free(ex->mb_xslot);
    free(ex->bwd_done);
    free(ex->ops);
    free(ex->report);
    free(ex->layer_op);
    free(ex->op_hash);
    free(ex->step_loss);
    free(ex->step_time);
    free(ex->step_tps);
    free(ex->step_bubble);
    free(ex);
}

/* ---- accessors ---- */

/* A weight or gradient tensor of the table by name: its parameter and whether it is the
 * gradient; NULL when absent. */
static const ExecParam *tensor_param(Exec *ex, const char *name, int *grad, uint64_t *numel)
{
    for (int i = 0; i < ex->tt.count; i++) {
        const ModelTensor *t = &ex->tt.t[i];
        if (t->per_microbatch || strcmp(t->name, name) != 0)
            continue;
        if (t->cat != MODEL_WEIGHTS && t->cat != MODEL_GRADS)
            return NULL;
        char base[64];
        px_strlcpy(base, name, sizeof base);
        *grad = t->cat == MODEL_GRADS;
        if (*grad) {
            if (!ends_with(base, ".grad"))
                return NULL;
            base[strlen(base) - 5] = '\0';
        }
        if (numel)
            *numel = t->numel;
        return param_named(ex, base);
    }
    return NULL;
}

float *exec_tensor(Exec *ex, const char *name, uint64_t *numel)
{
    int grad = 0;
    const ExecParam *p = tensor_param(ex, name, &grad, numel);
    /* host-visible fp32 only: the CPU backend's */
    if (!p || strcmp(ex->k->name, "cpu") != 0)
        return NULL;
    return grad ? p->g : (float *)p->w;
}

int exec_tensor_read(Exec *ex, const char *name, float *out, uint64_t cap, uint64_t *numel)
{
    int grad = 0;
    uint64_t n = 0;
    const ExecParam *p = tensor_param(ex, name, &grad, &n);
    if (numel)
        *numel = n;
    /* ZeRO-3's weights and ZeRO-2/3's gradients live as shards: no whole tensor to read */
    const int zero = ex->spec.layout.zero;
    if (!p || n > cap || (!grad && (!p->w || zero == 3)) || (grad && zero >= 2))
        return PX_ERUNTIME;
    ex->k->sync();
    if (grad || ex->act == PX_FP32) {
        ex->k->to_host(out, grad ? (const void *)p->g : p->w, n * sizeof(float));
        return PX_OK;
    }
    /* act weights: read into the back half of out, widened front to back */
    uint16_t *h = (uint16_t *)(void *)(out + n) - n;
    ex->k->to_host(h, p->w, n * sizeof *h);
    for (uint64_t i = 0; i < n; i++)
        out[i] = ex->act == PX_BF16 ? exec_bf16_to_float(h[i]) : exec_half_to_float(h[i]);
    return PX_OK;
}

const ModelTensorTable *exec_table(const Exec *ex) { return &ex->tt; }

void exec_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT])
{
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        bytes[c] = ex->arena[c].cap;
    bytes[MODEL_RUNTIME] = ex->plan.profile.device.runtime_bytes;
}

uint64_t exec_activations_in_use_peak(const Exec *ex)
{
    uint64_t b = (uint64_t)ex->peak_live * ex->slot_bytes;
    for (int j = 0; j < ex->d.v; j++)
        b += (uint64_t)ex->peak_xlive[j] * ex->xslot_bytes[j];
    return b;
}

int exec_stage(const Exec *ex) { return ex->stage; }

const CommLayer *exec_comm(const Exec *ex) { return ex->comm; }

int exec_error_is_collective(const Exec *ex) { return ex->collective_error; }
