/* Saved activations: a pool of layer sets (one set: the layers of the stage's largest chunk;
 * a chunk of fewer layers, as an uneven split over virtual stages gives, uses the set's first
 * ones) and per chunk a pool of its extras (the embedding's dropout mask, the output layer's
 * tensors), each as many as the schedule keeps alive at once (model_schedule_live), which is
 * what model_activation_bytes counts. What the recompute mode does not save lives in
 * ws.recompute, one layer's worth reused by every layer. Tensors are found by role; their sizes
 * and dtypes are model_layer_acts's, the one description the table is built from. */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

int exec_acts_init(ExecActs *X, const ExecCtx *c, const ModelAction *actions, int n, PxError *err)
{
    memset(X, 0, sizeof *X);
    const int v = c->d.v;
    model_schedule_live(actions, n, v, &X->n_slots, X->n_xslots);
    X->acts = exec_zalloc((size_t)X->n_slots * (size_t)c->g.cl, sizeof *X->acts);
    X->slot_busy = exec_zalloc((size_t)X->n_slots, sizeof *X->slot_busy);
    if (!X->acts || !X->slot_busy)
        return px_fail(err, PX_ERUNTIME, "out of memory for the activation pools");
    for (int j = 0; j < v; j++) {
        X->xacts[j] = exec_zalloc((size_t)X->n_xslots[j], sizeof *X->xacts[j]);
        X->xslot_busy[j] = exec_zalloc((size_t)X->n_xslots[j], sizeof *X->xslot_busy[j]);
        if (!X->xacts[j] || !X->xslot_busy[j])
            return px_fail(err, PX_ERUNTIME, "out of memory for the activation pools");
    }
    return PX_OK;
}

void exec_acts_free(ExecActs *X, const ExecCtx *c)
{
    free(X->acts);
    free(X->slot_busy);
    for (int j = 0; j < c->d.v && j < EXEC_MAX_CHUNKS; j++) {
        free(X->xacts[j]);
        free(X->xslot_busy[j]);
    }
    memset(X, 0, sizeof *X);
}

static void layer_acts(const ExecCtx *c, int l, ModelLayerAct f[MODEL_LAYER_ACTS + MODEL_MOE_ACTS]);

/* One layer's unsaved activations carved from base (f: its acts); the bytes used. */
static uint64_t region_view(ExecLayerActs *view, uint8_t *base, uint64_t bytes,
                            const ModelLayerAct *f)
{
    ExecArena r = {.base = base, .cap = bytes};
    memset(view, 0, sizeof *view);
    /* larger elements first (fp32, then act, then masks): nothing needs padding */
    for (size_t es = 8; es >= 1; es /= 2)
        for (int i = 0; i < MODEL_LAYER_ACTS + MODEL_MOE_ACTS; i++)
            if (f[i].present && !f[i].saved && px_dtype_bytes(f[i].dtype) == es)
                view->t[i] = exec_arena_carve(&r, f[i].bytes, es);
    return r.used;
}

int exec_acts_region(ExecActs *X, const ExecCtx *c, uint8_t *base, uint64_t bytes, PxError *err)
{
    /* the model's first dense and first MoE layer: a MoE layer (full recompute) re-creates its
     * router's and experts' tensors too, and the region is the larger of the two layouts */
    int first_of[2] = {-1, -1};
    for (int l = 0; l < c->spec.model.layers; l++) {
        const int k = c->d.moe && model_layer_is_moe(&c->spec.model, l);
        if (first_of[k] < 0)
            first_of[k] = l;
    }
    ModelLayerAct f[MODEL_LAYER_ACTS + MODEL_MOE_ACTS];
    uint64_t most = 0;
    for (int k = 0; k < 2; k++) {
        if (first_of[k] < 0)
            continue;
        layer_acts(c, first_of[k], f);
        const uint64_t used = region_view(k ? &X->region_moe : &X->region, base, bytes, f);
        most = used > most ? used : most;
    }
    if (most != bytes)
        return px_fail(err, PX_ERUNTIME,
                       "ws.recompute holds %llu bytes but the %s recompute needs %llu: model/ and "
                       "exec/ disagree",
                       (unsigned long long)bytes, model_recompute_name(c->spec.layout.recompute),
                       (unsigned long long)most);
    return PX_OK;
}

/* The dtype the extras keep each role in. */
static PxDtype extra_dtype(const ExecCtx *c, ModelTensorRole r)
{
    return r == MODEL_TR_EMBED_DROP_MASK ? PX_UINT8 : r == MODEL_TR_LOSS_PROBS ? PX_FP32 : c->act;
}

/* The activations of global layer l: model_layer_acts_at's, and a MoE layer's model_moe_acts
 * after them (absent in a dense layer). */
static void layer_acts(const ExecCtx *c, int l, ModelLayerAct f[MODEL_LAYER_ACTS + MODEL_MOE_ACTS])
{
    model_layer_acts_at(&c->spec, &c->d, c->spec.layout.recompute, l, f);
    model_moe_acts(&c->spec, &c->d, c->spec.layout.recompute, f + MODEL_LAYER_ACTS);
    if (!(c->d.moe && model_layer_is_moe(&c->spec.model, l)))
        for (int i = MODEL_LAYER_ACTS; i < MODEL_LAYER_ACTS + MODEL_MOE_ACTS; i++)
            f[i].present = f[i].saved = 0;
}

/* The local chunk whose layer set sizes the shared slots: the one saving the most bytes per
 * micro-batch, as model_activation_bytes counts a slot (the first of equals). */
static int sizing_chunk(const ExecCtx *c, const ModelTensorTable *tt)
{
    int sz = 0;
    for (int j = 1; j < c->d.v; j++)
        if (tt->act_layer_bytes[j] > tt->act_layer_bytes[sz])
            sz = j;
    return sz;
}

/* Each tensor's copies side by side, larger elements first so that nothing needs padding. The
 * table lists every chunk's layers; the sizing chunk's tensors size the shared slots and the
 * other chunks' (as many layers or fewer) are only checked against the model's. */
int exec_acts_bind(ExecActs *X, const ExecCtx *c, const ModelTensorTable *tt, ExecArena *arena,
                   int pass, PxError *err)
{
    const int cl = c->g.cl, sz = sizing_chunk(c, tt);
    ModelLayerAct f[MODEL_LAYER_ACTS + MODEL_MOE_ACTS];
    if (c->g.chunk_cl[sz] != cl)
        return px_fail(err, PX_ERUNTIME,
                       "local chunk %d saves the most activations but holds %d layers, another "
                       "%d: model/ and exec/ disagree on the activation slots",
                       sz, c->g.chunk_cl[sz], cl);
    X->slot_bytes = 0;
    for (int j = 0; j < c->d.v; j++)
        X->xslot_bytes[j] = 0;
    for (int es = 8; es >= 1; es /= 2) {
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (!t->per_microbatch || px_dtype_bytes(t->dtype) != (size_t)es)
                continue;
            const int j = t->chunk;
            if (j < 0 || j >= c->d.v)
                return exec_bind_unused(t, err);
            const int moe_act = t->role >= MODEL_TR_ROUTER_PROBS && t->role <= MODEL_TR_EXP_OUT;
            const int layer_act =
                moe_act || (t->role >= MODEL_TR_LN1_IN && t->role <= MODEL_TR_MLP_DROP_MASK);
            const int extra = t->role >= MODEL_TR_EMBED_DROP_MASK && t->role <= MODEL_TR_LOSS_PROBS;
            const int fi = moe_act     ? MODEL_LAYER_ACTS + (int)(t->role - MODEL_TR_ROUTER_PROBS)
                           : layer_act ? (int)(t->role - MODEL_TR_LN1_IN)
                                       : -1;
            const int li = t->layer - c->g.chunk_l0[j]; /* the layer's place in its chunk */
            if (layer_act) {
                layer_acts(c, t->layer, f);
                if (li < 0 || li >= c->g.chunk_cl[j] || !f[fi].saved || f[fi].numel != t->numel)
                    return exec_bind_unused(t, err);
                if (t->dtype != f[fi].dtype)
                    return px_fail(err, PX_ERUNTIME, "tensor %s is %s but model_layer_acts says %s",
                                   t->name, px_dtype_name(t->dtype), px_dtype_name(f[fi].dtype));
                if (j != sz)
                    continue; /* the sizing chunk's layers size the shared slots */
                X->slot_bytes += t->bytes;
            } else if (extra) {
                if (t->dtype != extra_dtype(c, t->role))
                    return px_fail(err, PX_ERUNTIME, "tensor %s is %s but the trainer keeps it in %s",
                                   t->name, px_dtype_name(t->dtype),
                                   px_dtype_name(extra_dtype(c, t->role)));
                X->xslot_bytes[j] += t->bytes;
            } else {
                return exec_bind_unused(t, err);
            }
            const int copies = layer_act ? X->n_slots : X->n_xslots[j];
            for (int k = 0; k < copies; k++) {
                void *p = exec_arena_carve(arena, t->bytes, (size_t)es);
                if (!pass)
                    continue;
                if (layer_act)
                    X->acts[(size_t)k * cl + li].t[fi] = p;
                else
                    X->xacts[j][k].t[t->role - MODEL_TR_EMBED_DROP_MASK] = p;
            }
        }
    }
    if (!pass)
        return PX_OK;
    /* every slot's layers: what is not saved lives in ws.recompute */
    for (int k = 0; k < X->n_slots; k++)
        for (int li = 0; li < cl; li++) {
            const int l = c->g.chunk_l0[sz] + li;
            layer_acts(c, l, f);
            const ExecLayerActs *region =
                c->d.moe && model_layer_is_moe(&c->spec.model, l) ? &X->region_moe : &X->region;
            for (int i = 0; i < MODEL_LAYER_ACTS + MODEL_MOE_ACTS; i++) {
                ExecLayerActs *a = &X->acts[(size_t)k * cl + li];
                if (f[i].present && !a->t[i]) {
                    if (!(a->t[i] = region->t[i]))
                        return px_fail(err, PX_ERUNTIME,
                                       "a layer's %s is neither saved nor in ws.recompute: model/ "
                                       "and exec/ disagree",
                                       f[i].suffix);
                }
            }
        }
    for (int j = 0; j < c->d.v; j++) {
        const int g = c->g.chunk_g[j];
        for (int k = 0; k < X->n_xslots[j]; k++) {
            const ExecHeadActs *x = &X->xacts[j][k];
            if ((g == c->d.chunks - 1 &&
                 (!EXEC_HA(x, FINAL_LN_IN) || !EXEC_HA(x, LOGITS_IN) || !EXEC_HA(x, LOSS_PROBS))) ||
                (g == 0 && c->dropout > 0 && !EXEC_HA(x, EMBED_DROP_MASK)))
                return px_fail(err, PX_ERUNTIME, "the embedding's or output layer's saved tensors "
                                                 "are incomplete: model/ and exec/ disagree");
        }
    }
    return PX_OK;
}

static int acquire(int *busy, int n, int *live, int *peak)
{
    for (int i = 0; i < n; i++)
        if (!busy[i]) {
            busy[i] = 1;
            if (++*live > *peak)
                *peak = *live;
            return i;
        }
    return -1;
}

static void release(int *busy, int i, int *live)
{
    if (i >= 0) {
        busy[i] = 0;
        --*live;
    }
}

int exec_acts_acquire(ExecActs *X, int j, int *slot, int *xslot, PxError *err)
{
    *slot = acquire(X->slot_busy, X->n_slots, &X->live, &X->peak_live);
    *xslot = X->n_xslots[j] > 0
                 ? acquire(X->xslot_busy[j], X->n_xslots[j], &X->xlive[j], &X->peak_xlive[j])
                 : -1;
    if (*slot < 0 || (X->n_xslots[j] > 0 && *xslot < 0))
        return px_fail(err, PX_ERUNTIME,
                       "no free activation slot: the schedule holds more sets than "
                       "model_schedule_live counted");
    return PX_OK;
}

void exec_acts_release(ExecActs *X, int j, int slot, int xslot)
{
    release(X->slot_busy, slot, &X->live);
    if (xslot >= 0)
        release(X->xslot_busy[j], xslot, &X->xlive[j]);
}

void exec_acts_reset(ExecActs *X, int j)
{
    X->live = 0;
    X->xlive[j] = 0;
}

ExecLayerActs *exec_acts_layers(const ExecActs *X, const ExecCtx *c, int slot)
{
    return &X->acts[(size_t)slot * c->g.cl];
}

ExecHeadActs *exec_acts_extras(const ExecActs *X, int j, int xslot)
{
    return X->n_xslots[j] > 0 ? &X->xacts[j][xslot < 0 ? 0 : xslot] : NULL;
}

uint64_t exec_acts_in_use_peak(const ExecActs *X, const ExecCtx *c)
{
    uint64_t b = (uint64_t)X->peak_live * X->slot_bytes;
    for (int j = 0; j < c->d.v; j++)
        b += (uint64_t)X->peak_xlive[j] * X->xslot_bytes[j];
    return b;
}
