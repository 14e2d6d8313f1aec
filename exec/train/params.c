/* The stage's parameters, block by block: where each lives (its weights in the act dtype, its
 * gradient in the gradient dtype (fp32, or 16-bit with training.grad_dtype: the float * views
 * then point at 16-bit elements, which only kernels taking KernBackend.grad read), its block's
 * master copy and optimizer state), how it is sharded over TP and
 * counted, and the named views the layers read. Tensors are bound by role and layer, as
 * model/ lists them (ModelTensorRole); a block is one flat buffer, the unit of gradient
 * reduction and of ZeRO sharding (docs/executor.md, "Memory"). */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

static int is_dense_param(ModelTensorRole r) { return r >= MODEL_TR_LN1_W && r <= MODEL_TR_FC2_B; }

static int is_moe_param(ModelTensorRole r)
{
    return r >= MODEL_TR_ROUTER_W && r <= MODEL_TR_SHARED_GATE_W;
}

static int is_mla_param(ModelTensorRole r) { return r >= MODEL_TR_Q_A_W && r <= MODEL_TR_KV_B_W; }

/* a prediction module's norms and eh projection (its layer's are the ordinary ones) */
static int is_mtp_param(ModelTensorRole r)
{
    return r >= MODEL_TR_MTP_ENORM_W && r <= MODEL_TR_MTP_NORM_W;
}

static int is_layer_param(ModelTensorRole r)
{
    return is_dense_param(r) || is_moe_param(r) || is_mla_param(r) || is_mtp_param(r) ||
           r == MODEL_TR_SINKS;
}

static int is_expert_param(ModelTensorRole r)
{
    return r == MODEL_TR_EXP_FC1_W || r == MODEL_TR_EXP_FC1_B || r == MODEL_TR_EXP_FC2_W ||
           r == MODEL_TR_EXP_FC2_B;
}

static int is_norm(ModelTensorRole r)
{
    return r == MODEL_TR_LN1_W || r == MODEL_TR_LN1_B || r == MODEL_TR_LN2_W ||
           r == MODEL_TR_LN2_B || r == MODEL_TR_FINAL_LN_W || r == MODEL_TR_FINAL_LN_B ||
           r == MODEL_TR_Q_NORM_W || r == MODEL_TR_KV_NORM_W || r == MODEL_TR_MTP_ENORM_W ||
           r == MODEL_TR_MTP_HNORM_W || r == MODEL_TR_MTP_NORM_W;
}

static int is_param(ModelTensorRole r)
{
    return (r >= MODEL_TR_WTE && r <= MODEL_TR_LOGITS_W) || is_moe_param(r) || is_mla_param(r) ||
           is_mtp_param(r) || r == MODEL_TR_SINKS;
}

/* The views of a parameter: where the layers read its weights and write its gradient. NULL
 * when the role is not a parameter's. */
static void **weight_view(ExecParams *P, ModelTensorRole r, int layer)
{
    if (is_dense_param(r))
        return &P->lw[layer].t[r - MODEL_TR_LN1_W];
    if (is_moe_param(r))
        return &P->lw[layer].m[r - MODEL_TR_ROUTER_W];
    if (r == MODEL_TR_SINKS)
        return &P->lw[layer].sinks;
    if (is_mla_param(r))
        return &P->lw[layer].a[r - MODEL_TR_Q_A_W];
    if (is_mtp_param(r))
        return &P->lw[layer].mtp[r - MODEL_TR_MTP_ENORM_W];
    switch (r) {
    case MODEL_TR_WTE: return &P->wte;
    case MODEL_TR_WPE: return &P->wpe;
    case MODEL_TR_FINAL_LN_W: return &P->lnf_w;
    case MODEL_TR_FINAL_LN_B: return &P->lnf_b;
    case MODEL_TR_LOGITS_W: return &P->out_w;
    default: return NULL;
    }
}

static float **grad_view(ExecParams *P, ModelTensorRole r, int layer)
{
    if (is_dense_param(r))
        return &P->lg[layer].t[r - MODEL_TR_LN1_W];
    if (is_moe_param(r))
        return &P->lg[layer].m[r - MODEL_TR_ROUTER_W];
    if (r == MODEL_TR_SINKS)
        return &P->lg[layer].sinks;
    if (is_mla_param(r))
        return &P->lg[layer].a[r - MODEL_TR_Q_A_W];
    if (is_mtp_param(r))
        return &P->lg[layer].mtp[r - MODEL_TR_MTP_ENORM_W];
    switch (r) {
    case MODEL_TR_WTE: return &P->g_wte;
    case MODEL_TR_WPE: return &P->g_wpe;
    case MODEL_TR_FINAL_LN_W: return &P->g_lnf_w;
    case MODEL_TR_FINAL_LN_B: return &P->g_lnf_b;
    case MODEL_TR_LOGITS_W: return &P->g_out_w;
    default: return NULL;
    }
}

static ExecParam *param_of(ExecParams *P, ModelTensorRole r, int layer)
{
    for (int i = 0; i < P->n; i++)
        if (P->p[i].role == r && P->p[i].layer == layer)
            return &P->p[i];
    return NULL;
}

static ExecMap tp_map(ModelTensorRole r, int swiglu)
{
    switch (r) {
    case MODEL_TR_QKV_W:
    case MODEL_TR_QKV_B: return EXEC_MAP_QKV;
    case MODEL_TR_FC1_W:
    case MODEL_TR_FC1_B: return swiglu ? EXEC_MAP_SWIGLU : EXEC_MAP_ROWS;
    case MODEL_TR_PROJ_W:
    case MODEL_TR_FC2_W: return EXEC_MAP_COLS;
    case MODEL_TR_WTE:
    case MODEL_TR_LOGITS_W:
    case MODEL_TR_SINKS: return EXEC_MAP_ROWS; /* the sinks of this rank's heads */
    case MODEL_TR_Q_B_W: return EXEC_MAP_ROWS; /* MLA's queries: this rank's heads */
    case MODEL_TR_KV_B_W: return EXEC_MAP_KV_B;
    case MODEL_TR_MTP_EH_W: return EXEC_MAP_ROWS;
    default: return EXEC_MAP_FULL;
    }
}

/* The blocks of the table, with this rank's shard of each. */
static int blocks_from(ExecParams *P, const ExecCtx *c, const ModelTensorTable *tt,
                       const ModelTensorTable *twin, PxError *err)
{
    const int zero = c->spec.layout.zero;
    if (twin->n_blocks != tt->n_blocks)
        return px_fail(err, PX_ERUNTIME, "the ZeRO-%d table has %d blocks, without ZeRO %d: model/ "
                       "disagrees with itself", zero, tt->n_blocks, twin->n_blocks);
    P->nb = tt->n_blocks;
    for (int b = 0; b < P->nb; b++) {
        const ModelBlock *mb = &tt->blocks[b];
        ExecBlock *blk = &P->b[b];
        if (mb->layer != twin->blocks[b].layer || mb->chunk != twin->blocks[b].chunk ||
            mb->numel != twin->blocks[b].numel)
            return px_fail(err, PX_ERUNTIME, "block %s differs between the ZeRO and plain tables",
                           mb->name);
        blk->chunk = mb->chunk;
        blk->layer = mb->layer;
        blk->numel = mb->numel;
        blk->shard = zero >= 1 ? mb->shard_numel : mb->numel;
        blk->first_param = -1;
        blk->experts = mb->experts;
        blk->group = mb->experts ? c->d.edp : c->g.zero_n;
        blk->group_rank = mb->experts ? c->g.edp_rank : c->g.zero_rank;
        if (blk->group < 1 || (uint64_t)blk->group != (uint64_t)mb->group)
            return px_fail(err, PX_ERUNTIME, "block %s: ZeRO group of %d ranks in the table, %d "
                           "here: model/ and exec/ disagree", mb->name, mb->group, blk->group);
        if (zero >= 1) {
            uint64_t lo = (uint64_t)blk->group_rank * blk->shard;
            blk->own_off = lo < blk->numel ? lo : blk->numel;
            uint64_t hi = lo + blk->shard < blk->numel ? lo + blk->shard : blk->numel;
            blk->own_n = hi > blk->own_off ? hi - blk->own_off : 0;
        } else {
            blk->own_off = 0;
            blk->own_n = blk->numel;
        }
        if (mb->layer >= 0 && mb->layer < c->spec.model.layers + c->spec.model.mtp_layers)
            *(mb->experts ? &P->expert_block[mb->layer] : &P->layer_block[mb->layer]) = b;
    }
    return PX_OK;
}

/* One parameter of the plain table t: its place in its block and how it is initialized and
 * counted. */
static int param_from(ExecParams *P, const ExecCtx *c, const ModelTensor *t, uint64_t *off,
                      PxError *err)
{
    ExecParam *p = &P->p[P->n];
    if (t->block < 0 || t->block >= P->nb)
        return px_fail(err, PX_ERUNTIME, "parameter %s has no block: model/ and exec/ disagree",
                       t->name);
    if (!is_param(t->role) || (is_layer_param(t->role) &&
                               (t->layer < 0 ||
                                t->layer >= c->spec.model.layers + c->spec.model.mtp_layers)))
        return px_fail(err, PX_ERUNTIME,
                       "the trainer has no use for parameter %s: model/ and exec/ disagree",
                       t->name);
    px_strlcpy(p->name, t->name, sizeof p->name);
    p->role = t->role;
    p->layer = is_layer_param(t->role) ? t->layer : -1;
    p->numel = t->numel;
    p->rows = t->shape[0];
    p->cols = t->ndim > 1 ? t->shape[1] : 1;
    p->block = t->block;
    p->off = off[t->block];
    off[t->block] += t->numel;
    ExecBlock *blk = &P->b[t->block];
    if (blk->first_param < 0)
        blk->first_param = P->n;
    blk->n_params++;
    p->decay = t->ndim >= 2;
    p->replicated = !(t->shard & MODEL_SHARD_TP);
    p->norm = is_norm(t->role);
    /* --fp8-param-gather below ZeRO-3: the table keeps the weight in FP8 (fp8.c binds it) */
    p->fp8 = t->dtype == PX_FP8;
    /* MLA's down-projections compute on the sequence shard too (their norms are norms) */
    p->sp_sum = p->norm || t->role == MODEL_TR_ROUTER_W || t->role == MODEL_TR_ROUTER_B ||
                t->role == MODEL_TR_SHARED_GATE_W || t->role == MODEL_TR_Q_A_W ||
                t->role == MODEL_TR_KV_A_W;
    /* the prediction modules' copy of the embedding (mtp.c) is one too */
    p->tied_copy = (c->g.tied_pair && t->role == MODEL_TR_LOGITS_W) ||
                   (c->g.mtp_pair && t->role == MODEL_TR_WTE && t->chunk >= 0 &&
                    c->g.chunk_g[t->chunk] != 0);
    /* the output layer's copy starts as an exact copy of the embedding */
    px_strlcpy(p->init_name, p->tied_copy ? "embed.wte" : t->name, sizeof p->init_name);
    p->map = c->d.t > 1 ? tp_map(t->role, c->spec.model.mlp == MODEL_SWIGLU) : EXEC_MAP_FULL;
    if (is_expert_param(t->role))
        p->map = c->d.etp > 1 && t->role == MODEL_TR_EXP_FC1_W   ? EXEC_MAP_EXPERTS_FC1
                 : c->d.etp > 1 && t->role == MODEL_TR_EXP_FC2_W ? EXEC_MAP_EXPERTS_FC2
                 : c->d.ep > 1                                   ? EXEC_MAP_EXPERTS
                                                                 : EXEC_MAP_FULL;
    if (t->role == MODEL_TR_WTE && !p->tied_copy)
        P->embed_block = t->block;
    else if (t->role == MODEL_TR_FINAL_LN_W)
        P->final_block = t->block;
    P->n++;
    return PX_OK;
}

int exec_params_build(ExecParams *P, const ExecCtx *c, const ModelTensorTable *tt,
                      const ModelTensorTable *twin, PxError *err)
{
    memset(P, 0, sizeof *P);
    P->embed_block = P->final_block = -1;
    const int L = c->spec.model.layers + c->spec.model.mtp_layers;
    int n = 0;
    for (int i = 0; i < twin->count; i++)
        n += twin->t[i].cat == MODEL_WEIGHTS && !twin->t[i].per_microbatch &&
             !exec_is_fp8_copy(twin->t[i].role);
    P->p = calloc((size_t)(n > 0 ? n : 1), sizeof *P->p);
    P->b = calloc((size_t)(tt->n_blocks > 0 ? tt->n_blocks : 1), sizeof *P->b);
    P->layer_block = malloc((size_t)(L > 0 ? L : 1) * sizeof *P->layer_block);
    P->expert_block = malloc((size_t)(L > 0 ? L : 1) * sizeof *P->expert_block);
    P->lw = calloc((size_t)(L > 0 ? L : 1), sizeof *P->lw);
    P->lg = calloc((size_t)(L > 0 ? L : 1), sizeof *P->lg);
    uint64_t *off = calloc((size_t)(tt->n_blocks > 0 ? tt->n_blocks : 1), sizeof *off);
    if (!P->p || !P->b || !P->layer_block || !P->expert_block || !P->lw || !P->lg || !off) {
        free(off);
        return px_fail(err, PX_ERUNTIME, "out of memory for the parameter table");
    }
    for (int l = 0; l < L; l++)
        P->layer_block[l] = P->expert_block[l] = -1;
    int rc = blocks_from(P, c, tt, twin, err);
    /* the parameters from the table without ZeRO (ZeRO-3's holds only shards, not the
     * parameters inside them): names, shapes, offsets in the block */
    for (int i = 0; i < twin->count && !rc; i++) {
        const ModelTensor *t = &twin->t[i];
        if (t->cat == MODEL_WEIGHTS && !t->per_microbatch && !exec_is_fp8_copy(t->role))
            rc = param_from(P, c, t, off, err);
    }
    for (int b = 0; b < P->nb && !rc; b++)
        if (off[b] != P->b[b].numel)
            rc = px_fail(err, PX_ERUNTIME, "block %s holds %llu elements but its parameters %llu",
                         tt->blocks[b].name, (unsigned long long)P->b[b].numel,
                         (unsigned long long)off[b]);
    free(off);
    for (int b = 0; b < P->nb && !rc; b++)
        P->b[b].tied = (c->g.tied_pair || c->g.mtp_pair) && b == P->embed_block;
    /* and the block of the other copy: the output layer's, or the prediction modules' mtp.wte
     * (the last stage's final block, or a stage of their own's mtp.embed) */
    for (int i = 0; i < P->n && !rc; i++)
        if (P->p[i].tied_copy)
            P->b[P->p[i].block].tied = 1;
    return rc;
}

int exec_params_bind(ExecParams *P, const ExecCtx *c, const ModelTensor *t, void *p, PxError *err)
{
    if (t->cat == MODEL_WEIGHTS || t->cat == MODEL_GRADS) {
        const PxDtype want = t->cat == MODEL_WEIGHTS ? c->act : c->grad;
        if (t->dtype != want)
            return exec_bind_wrong_dtype(t, want, err);
        if (t->role == MODEL_TR_W_SHARD || t->role == MODEL_TR_GRAD_SHARD) {
            if (t->block < 0 || t->block >= P->nb ||
                (t->role == MODEL_TR_W_SHARD) != (t->cat == MODEL_WEIGHTS))
                return exec_bind_unused(t, err);
            if (t->role == MODEL_TR_W_SHARD)
                P->b[t->block].w_shard = p;
            else
                P->b[t->block].g_shard = p;
            return PX_OK;
        }
        ExecParam *q = param_of(P, t->role, is_layer_param(t->role) ? t->layer : -1);
        if (!q || q->numel != t->numel)
            return exec_bind_unused(t, err);
        if (t->cat == MODEL_GRADS)
            q->g = p;
        else
            q->w = p;
        return PX_OK;
    }
    if (t->cat == MODEL_MASTER || t->cat == MODEL_OPTIMIZER) {
        if (t->block < 0 || t->block >= P->nb)
            return exec_bind_unused(t, err);
        ExecBlock *blk = &P->b[t->block];
        /* adam-8bit's codes (one byte a value) */
        const int code = t->role == MODEL_TR_ADAM8_M || t->role == MODEL_TR_ADAM8_V;
        if (t->dtype != (code ? PX_UINT8 : PX_FP32))
            return exec_bind_wrong_dtype(t, code ? PX_UINT8 : PX_FP32, err);
        if (t->cat == MODEL_OPTIMIZER && code) {
            *(t->role == MODEL_TR_ADAM8_M ? &blk->m8 : &blk->v8) = p;
            return PX_OK;
        }
        if (t->cat == MODEL_MASTER && t->role == MODEL_TR_MASTER)
            blk->master = p;
        else if (t->cat == MODEL_OPTIMIZER &&
                 (t->role == MODEL_TR_ADAM_M || t->role == MODEL_TR_MOMENTUM))
            blk->m = p;
        else if (t->cat == MODEL_OPTIMIZER && t->role == MODEL_TR_ADAM_V)
            blk->v = p;
        else if (t->cat == MODEL_OPTIMIZER && t->role == MODEL_TR_ADAM8_ABSMAX)
            blk->absmax = p;
        else
            return exec_bind_unused(t, err);
        return PX_OK;
    }
    return exec_bind_unused(t, err);
}

int exec_params_finish(ExecParams *P, const ExecCtx *c, float *bucket, uint64_t bucket_elems,
                       const void *gather, PxError *err)
{
    const int zero = c->spec.layout.zero, bucketed = exec_zero_bucketed(c);
    for (int b = 0; b < P->nb; b++) {
        ExecBlock *blk = &P->b[b];
        if (blk->n_params == 0)
            continue;
        const ExecParam *first = &P->p[blk->first_param];
        for (int i = blk->first_param; i < blk->first_param + blk->n_params; i++)
            blk->fp8 |= P->p[i].fp8;
        blk->w = zero < 3 && !blk->fp8 ? first->w : NULL;
        /* unsharded gradients: ZeRO 0/1, and ZeRO-2/3 under a pipeline */
        blk->g = !bucketed ? first->g : NULL;
        const int opt8 = c->spec.job.optimizer == MODEL_OPT_ADAM_8BIT;
        if ((zero == 3 && !blk->w_shard) || (zero >= 2 && !blk->g_shard) ||
            (opt8 ? !blk->m8 || !blk->v8 || !blk->absmax : !blk->m) ||
            (c->spec.job.optimizer == MODEL_OPT_ADAMW && !blk->v) || (c->d.master && !blk->master))
            return px_fail(err, PX_ERUNTIME, "block %d lacks its ZeRO-%d state: model/ and exec/ "
                           "disagree", b, zero);
    }
    if (bucketed && !bucket)
        return px_fail(err, PX_ERUNTIME, "ZeRO-%d without zero.grad_bucket: model/ and exec/ disagree",
                       zero);
    if (zero == 3 && !gather)
        return px_fail(err, PX_ERUNTIME,
                       "ZeRO-3 without zero.param_gather: model/ and exec/ disagree");
    for (int i = 0; i < P->n; i++) {
        ExecParam *p = &P->p[i];
        const ExecBlock *blk = &P->b[p->block];
        if (bucketed) {
            if (px_round_up(blk->numel, (uint64_t)blk->group) > bucket_elems)
                return px_fail(err, PX_ERUNTIME, "block of %s exceeds the gradient bucket",
                               p->name);
            p->g = EXEC_AT(bucket, p->off, c->gb);
        }
        /* a block with FP8 parameters: each of the others where the table carved it */
        if ((zero < 3 && !blk->fp8 && p->w != EXEC_AT(blk->w, p->off, c->ab)) ||
            (zero < 3 && blk->fp8 && !p->fp8 && !p->w) ||
            (!bucketed && (void *)p->g != EXEC_AT(blk->g, p->off, c->gb)))
            return px_fail(err, PX_ERUNTIME,
                           "parameter %s is not where its block's flat layout puts it: model/ and "
                           "exec/ disagree",
                           p->name);
        *weight_view(P, p->role, p->layer) = p->w;
        *grad_view(P, p->role, p->layer) = p->g;
    }
    if (c->g.tied_here) {
        P->out_w = P->wte;
        P->g_out_w = P->g_wte;
    }
    return PX_OK;
}

void exec_params_point(ExecParams *P, const ExecCtx *c, int b, void *base)
{
    const ExecBlock *blk = &P->b[b];
    for (int i = blk->first_param; i < blk->first_param + blk->n_params; i++) {
        ExecParam *p = &P->p[i];
        p->w = EXEC_AT(base, p->off, c->ab);
        *weight_view(P, p->role, p->layer) = p->w;
    }
    if (c->g.tied_here && b == P->embed_block)
        P->out_w = P->wte;
}

void exec_params_point_packed(ExecParams *P, const ExecCtx *c, int b, void *base,
                              const uint64_t *off)
{
    const ExecBlock *blk = &P->b[b];
    for (int i = 0; i < blk->n_params; i++) {
        ExecParam *p = &P->p[blk->first_param + i];
        p->w = off[i] == UINT64_MAX ? NULL : EXEC_AT(base, off[i], c->ab);
        *weight_view(P, p->role, p->layer) = p->w;
    }
    if (c->g.tied_here && b == P->embed_block)
        P->out_w = P->wte;
}

int exec_params_own(const ExecParams *P, const ExecParam *p, uint64_t *lo, uint64_t *hi)
{
    const ExecBlock *blk = &P->b[p->block];
    uint64_t a = p->off > blk->own_off ? p->off : blk->own_off;
    uint64_t b = p->off + p->numel;
    if (b > blk->own_off + blk->own_n)
        b = blk->own_off + blk->own_n;
    *lo = a;
    *hi = b;
    return b > a;
}

const ExecParam *exec_params_of(const ExecParams *P, ModelTensorRole role, int layer)
{
    return param_of((ExecParams *)P, role, is_layer_param(role) ? layer : -1);
}

void exec_params_free(ExecParams *P)
{
    free(P->p);
    free(P->b);
    free(P->layer_block);
    free(P->expert_block);
    free(P->lw);
    free(P->lg);
    memset(P, 0, sizeof *P);
}
