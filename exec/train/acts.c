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
    /* per chunk, as many as the stage holds */
    X->n_xslots = exec_zalloc((size_t)v, sizeof *X->n_xslots);
    X->xacts = exec_zalloc((size_t)v, sizeof *X->xacts);
    X->xslot_bytes = exec_zalloc((size_t)v, sizeof *X->xslot_bytes);
    X->xslot_busy = exec_zalloc((size_t)v, sizeof *X->xslot_busy);
    X->xlive = exec_zalloc((size_t)v, sizeof *X->xlive);
    X->peak_xlive = exec_zalloc((size_t)v, sizeof *X->peak_xlive);
    X->used = exec_zalloc((size_t)v, sizeof *X->used);
    if (!X->n_xslots || !X->xacts || !X->xslot_bytes || !X->xslot_busy || !X->xlive ||
        !X->peak_xlive || !X->used || model_schedule_live(actions, n, v, &X->n_slots, X->n_xslots))
        return px_fail(err, PX_ERUNTIME, "out of memory for the activation pools of %d chunks", v);
    X->acts = exec_zalloc((size_t)v * (size_t)X->n_slots * (size_t)c->g.cl, sizeof *X->acts);
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
    for (int j = 0; j < c->d.v; j++) {
        free(X->xacts ? X->xacts[j] : NULL);
        free(X->xslot_busy ? X->xslot_busy[j] : NULL);
    }
    free(X->n_xslots);
    free(X->xacts);
    free(X->xslot_bytes);
    free(X->xslot_busy);
    free(X->xlive);
    free(X->peak_xlive);
    free(X->used);
    memset(X, 0, sizeof *X);
}

static void layer_acts(const ExecCtx *c, int l, ModelLayerAct f[EXEC_LAYER_ACTS]);

/* One layer's unsaved activations carved from base (f: its acts); the bytes used. */
static uint64_t region_view(ExecLayerActs *view, uint8_t *base, uint64_t bytes,
                            const ModelLayerAct *f)
{
    ExecArena r = {.base = base, .cap = bytes};
    memset(view, 0, sizeof *view);
    /* larger elements first (fp32, then act, then masks): nothing needs padding */
    for (size_t es = 8; es >= 1; es /= 2)
        for (int i = 0; i < EXEC_LAYER_ACTS; i++)
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
    ModelLayerAct f[EXEC_LAYER_ACTS];
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

/* The activations of global layer l: model_layer_acts_at's, a MoE layer's model_moe_acts
 * after them (absent in a dense layer), then model_mla_acts (absent without MLA). */
static void layer_acts(const ExecCtx *c, int l, ModelLayerAct f[EXEC_LAYER_ACTS])
{
    model_layer_acts_at(&c->spec, &c->d, c->spec.layout.recompute, l, f);
    model_moe_acts(&c->spec, &c->d, c->spec.layout.recompute, f + MODEL_LAYER_ACTS);
    if (!(c->d.moe && model_layer_is_moe(&c->spec.model, l)))
        for (int i = MODEL_LAYER_ACTS; i < MODEL_LAYER_ACTS + MODEL_MOE_ACTS; i++)
            f[i].present = f[i].saved = 0;
    model_mla_acts(&c->spec, &c->d, c->spec.layout.recompute,
                   f + MODEL_LAYER_ACTS + MODEL_MOE_ACTS);
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

/* Checks a per-micro-batch tensor of the table against what the trainer keeps: *fi its place
 * in a layer set (a layer's or MoE layer's activation) or -1 for a chunk's extras. */
static int check_act(const ExecCtx *c, const ModelTensor *t, int *fi, PxError *err)
{
    const int j = t->chunk;
    if (j < 0 || j >= c->d.v)
        return exec_bind_unused(t, err);
    const int moe_act = t->role >= MODEL_TR_ROUTER_PROBS && t->role <= MODEL_TR_EP_W;
    const int mla_act = t->role >= MODEL_TR_Q_LAT && t->role <= MODEL_TR_KV_LAT;
    const int li = t->layer - c->g.chunk_l0[j]; /* the layer's place in its chunk's sets */
    if (t->role == MODEL_TR_MTP_EH_IN) { /* a prediction module's, after its layer's (mtp.c) */
        *fi = EXEC_MTP_ACT;
        const uint64_t want = (uint64_t)c->d.b * (uint64_t)c->d.s_sp * 2u * (uint64_t)c->d.h;
        return li < c->g.chunk_cl[j] || li >= c->g.chunk_cl[j] + c->g.chunk_mtp[j] ||
                       t->numel != want || t->dtype != c->act
                   ? exec_bind_unused(t, err)
                   : PX_OK;
    }
    const int layer_act = moe_act || mla_act ||
                          (t->role >= MODEL_TR_LN1_IN && t->role <= MODEL_TR_MLP_DROP_MASK);
    const int extra = t->role >= MODEL_TR_EMBED_DROP_MASK && t->role <= MODEL_TR_LOSS_PROBS;
    *fi = moe_act   ? MODEL_LAYER_ACTS + (int)(t->role - MODEL_TR_ROUTER_PROBS)
          : mla_act ? MODEL_LAYER_ACTS + MODEL_MOE_ACTS + (int)(t->role - MODEL_TR_Q_LAT)
          : layer_act ? (int)(t->role - MODEL_TR_LN1_IN)
                      : -1;
    if (layer_act) {
        ModelLayerAct f[EXEC_LAYER_ACTS];
        layer_acts(c, t->layer, f);
        if (li < 0 || li >= c->g.chunk_cl[j] + c->g.chunk_mtp[j] || !f[*fi].saved ||
            f[*fi].numel != t->numel)
            return exec_bind_unused(t, err);
        if (t->dtype != f[*fi].dtype)
            return px_fail(err, PX_ERUNTIME, "tensor %s is %s but model_layer_acts says %s",
                           t->name, px_dtype_name(t->dtype), px_dtype_name(f[*fi].dtype));
    } else if (extra) {
        if (t->dtype != extra_dtype(c, t->role))
            return px_fail(err, PX_ERUNTIME, "tensor %s is %s but the trainer keeps it in %s",
                           t->name, px_dtype_name(t->dtype), px_dtype_name(extra_dtype(c, t->role)));
    } else {
        return exec_bind_unused(t, err);
    }
    return PX_OK;
}

/* Slot by slot within each element size, larger elements first so that nothing needs padding:
 * a slot's part of that size is the sizing chunk's layers' tensors of it, and every chunk's
 * layers are carved from the same bytes (a chunk of other layers, a dense layer beside a MoE
 * one, lays its tensors out its own way in them: one layout for all would need each tensor's
 * largest). The chunks' extras are each tensor's copies side by side. The table lists every
 * chunk's layers. */
int exec_acts_bind(ExecActs *X, const ExecCtx *c, const ModelTensorTable *tt, ExecArena *arena,
                   int pass, PxError *err)
{
    const int cl = c->g.cl, sz = sizing_chunk(c, tt), v = c->d.v;
    ModelLayerAct f[EXEC_LAYER_ACTS];
    if (c->g.chunk_cl[sz] + c->g.chunk_mtp[sz] != cl)
        return px_fail(err, PX_ERUNTIME,
                       "local chunk %d saves the most activations but holds %d layers, another "
                       "%d: model/ and exec/ disagree on the activation slots",
                       sz, c->g.chunk_cl[sz], cl);
    X->slot_bytes = 0;
    for (int j = 0; j < v; j++)
        X->xslot_bytes[j] = 0;
    int rc, fi;
    for (int es = 8; es >= 1; es /= 2) {
        uint64_t part = 0; /* a slot's bytes of elements of es bytes: the sizing chunk's */
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (!t->per_microbatch || px_dtype_bytes(t->dtype) != (size_t)es)
                continue;
            if ((rc = check_act(c, t, &fi, err)))
                return rc;
            if (fi >= 0 && t->chunk == sz)
                part += t->bytes;
        }
        X->slot_bytes += part;
        uint8_t *base = exec_arena_carve(arena, (uint64_t)X->n_slots * part, (size_t)es);
        uint64_t *used = X->used; /* each chunk's bytes of the part so far */
        memset(used, 0, (size_t)v * sizeof *used);
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (!t->per_microbatch || px_dtype_bytes(t->dtype) != (size_t)es)
                continue;
            (void)check_act(c, t, &fi, err); /* checked above */
            const int j = t->chunk;
            if (fi < 0) {
                X->xslot_bytes[j] += t->bytes;
                for (int k = 0; k < X->n_xslots[j]; k++) {
                    void *p = exec_arena_carve(arena, t->bytes, (size_t)es);
                    void **mtp = exec_mtp_extra_slot(&X->xacts[j][k], t);
                    if (pass)
                        *(mtp ? mtp : &X->xacts[j][k].t[t->role - MODEL_TR_EMBED_DROP_MASK]) = p;
                }
                continue;
            }
            if (used[j] + t->bytes > part)
                return px_fail(err, PX_ERUNTIME,
                               "local chunk %d's activations of %d-byte elements need more than "
                               "the %llu bytes of the sizing chunk's: model/ and exec/ disagree "
                               "on the activation slots",
                               j, es, (unsigned long long)part);
            const int li = t->layer - c->g.chunk_l0[j];
            for (int k = 0; pass && base && k < X->n_slots; k++)
                X->acts[((size_t)j * (size_t)X->n_slots + (size_t)k) * (size_t)cl + (size_t)li]
                    .t[fi] = base + (uint64_t)k * part + used[j];
            used[j] += t->bytes;
        }
    }
    if (!pass)
        return PX_OK;
    /* every chunk's slots' layers: what is not saved lives in ws.recompute */
    for (int j = 0; j < v; j++)
        for (int k = 0; k < X->n_slots; k++)
            for (int li = 0; li < c->g.chunk_cl[j] + c->g.chunk_mtp[j]; li++) {
                const int l = c->g.chunk_l0[j] + li;
                layer_acts(c, l, f);
                const ExecLayerActs *region =
                    c->d.moe && model_layer_is_moe(&c->spec.model, l) ? &X->region_moe : &X->region;
                ExecLayerActs *a = &X->acts[((size_t)j * (size_t)X->n_slots + (size_t)k) * (size_t)cl + (size_t)li];
                for (int i = 0; i < EXEC_LAYER_ACTS; i++)
                    if (f[i].present && !a->t[i] && !(a->t[i] = region->t[i]))
                        return px_fail(err, PX_ERUNTIME,
                                       "a layer's %s is neither saved nor in ws.recompute: model/ "
                                       "and exec/ disagree",
                                       f[i].suffix);
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

ExecLayerActs *exec_acts_layers(const ExecActs *X, const ExecCtx *c, int j, int slot)
{
    return &X->acts[((size_t)j * (size_t)X->n_slots + (size_t)slot) * (size_t)c->g.cl];
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
