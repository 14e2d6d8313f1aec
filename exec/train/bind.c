/* The category arenas: one allocation per memory category, carved by the stage's tensor table
 * and handed to the part that owns each tensor (by its role): the parameters' weights,
 * gradients, master copies and optimizer state (params.c), the workspace (layers.c, data.c,
 * acts.c's ws.recompute), the communication buffers (pipeline.c, zero.c, layers.c's sp.gather)
 * and the saved activations (acts.c). Two passes: one sizes the arenas (nothing allocated),
 * the other carves them; they carve in the same order, so the sizes are exactly what the second
 * pass uses, and the measured bytes per category equal the table's. */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

/* The parts a tensor can belong to. */
typedef struct {
    const ExecCtx *c;
    ExecParams *P;
    ExecActs *X;
    ExecWork *W;
    ExecPipe *pipe;
    ExecZero *Z;
    ExecBatches *B;
    ExecFp8 *F;
} Owners;

static int workspace(const Owners *o, const ModelTensor *t, void *p, PxError *err)
{
    if (t->role == MODEL_TR_DATA_BATCH)
        return exec_batches_bind(o->B, t, p, err);
    if (t->role == MODEL_TR_WS_FP8)
        return exec_fp8_bind(o->F, o->P, t, p, err);
    return exec_work_bind(o->W, o->c, t, p, err);
}

static int comm_buffer(const Owners *o, const ModelTensor *t, void *p, PxError *err)
{
    switch (t->role) {
    case MODEL_TR_PP_SEND:
    case MODEL_TR_PP_RECV: return exec_pipe_bind(o->pipe, t, p, err);
    case MODEL_TR_ZERO_GRAD_BUCKET:
    case MODEL_TR_ZERO_PARAM_GATHER: return exec_zero_bind(o->Z, o->c, t, p, err);
    default: return exec_work_bind(o->W, o->c, t, p, err);
    }
}

/* An FP8 parameter (--fp8-param-gather below ZeRO-3): the FP8 weight itself, bound by fp8.c. */
static int fp8_param(const ModelTensor *t)
{
    return t->cat == MODEL_WEIGHTS && t->dtype == PX_FP8 && !exec_is_fp8_copy(t->role);
}

/* Everything but the saved activations. p is NULL in the sizing pass (pass 0). */
static int bind_static(ExecArenas *A, const ModelTensorTable *tt, const Owners *o, int pass,
                       PxError *err)
{
    int rc = PX_OK, region = 0; /* ws.recompute was bound */
    /* weights and gradients in table order, so that a block's parameters are contiguous */
    for (int i = 0; i < tt->count && !rc; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->per_microbatch || (t->cat != MODEL_WEIGHTS && t->cat != MODEL_GRADS) ||
            exec_is_fp8_copy(t->role) || fp8_param(t))
            continue;
        void *p = exec_arena_carve(&A->a[t->cat], t->bytes, px_dtype_bytes(t->dtype));
        rc = exec_params_bind(o->P, o->c, t, pass ? p : NULL, err);
    }
    /* then the FP8 weights' amax histories (fp32) and copies (bytes), an FP8 parameter in its
     * copy's place: after every parameter, so that nothing needs padding */
    for (int k = 0; k < 2 && !rc; k++)
        for (int i = 0; i < tt->count && !rc; i++) {
            const ModelTensor *t = &tt->t[i];
            if (!(exec_is_fp8_copy(t->role) || fp8_param(t)) ||
                (t->role == MODEL_TR_FP8_AMAX) != (k == 0))
                continue;
            void *p = exec_arena_carve(&A->a[t->cat], t->bytes, k == 0 ? sizeof(float) : 1);
            rc = exec_fp8_bind(o->F, o->P, t, pass ? p : NULL, err);
        }
    /* master weights and optimizer state (fp32): one flat buffer per block and kind (ZeRO >= 1:
     * the shard) */
    for (int i = 0; i < tt->count && !rc; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_OPTIMIZER && t->cat != MODEL_MASTER)
            continue;
        void *p = exec_arena_carve(&A->a[t->cat], t->bytes, px_dtype_bytes(t->dtype));
        rc = exec_params_bind(o->P, o->c, t, pass ? p : NULL, err);
    }
    /* workspace: ws.fp8 first (its parts start on 16-byte boundaries and its size is a
     * multiple of 16: model_fp8_workspace), then by element size, largest first, so that no
     * tensor needs padding; ws.recompute (bytes that hold fp32 and act tensors and masks) after
     * the 2-byte ones, at a 4-byte boundary: the 2-byte tensors end on one when their element
     * counts are even, as in every model here (an odd one would show as padding, a workspace
     * that differs from the table) */
    static const int order[] = {16, 8, 4, 2, 0, 1}; /* 0: ws.recompute; 16: ws.fp8 */
    for (size_t k = 0; k < sizeof order / sizeof order[0] && !rc; k++) {
        for (int i = 0; i < tt->count && !rc; i++) {
            const ModelTensor *t = &tt->t[i];
            if (t->per_microbatch || t->cat != MODEL_WORKSPACE)
                continue;
            const int re = t->role == MODEL_TR_WS_RECOMPUTE, f8 = t->role == MODEL_TR_WS_FP8;
            if (re ? order[k] != 0
                   : f8 ? order[k] != 16 : px_dtype_bytes(t->dtype) != (size_t)order[k])
                continue;
            void *p = exec_arena_carve(&A->a[MODEL_WORKSPACE], t->bytes,
                                       re ? 4 : f8 ? 16 : px_dtype_bytes(t->dtype));
            if (re) {
                rc = pass ? exec_acts_region(o->X, o->c, p, t->bytes, err) : PX_OK;
                region = pass;
            } else {
                rc = workspace(o, t, pass ? p : NULL, err);
            }
        }
    }
    /* communication buffers: pipeline send and receive, the sequence-parallel gather (act),
     * ZeRO's gradient bucket (gradient dtype) and its two parameter-gather buffers (act) */
    for (int i = 0; i < tt->count && !rc; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_COMM_BUFFERS)
            continue;
        void *p = exec_arena_carve(&A->a[MODEL_COMM_BUFFERS], t->bytes, px_dtype_bytes(t->dtype));
        rc = comm_buffer(o, t, pass ? p : NULL, err);
    }
    /* a table without ws.recompute: nothing is recomputed, and the region says so */
    if (!rc && pass && !region)
        rc = exec_acts_region(o->X, o->c, NULL, 0, err);
    return rc;
}

static int bind(ExecArenas *A, const ModelTensorTable *tt, const Owners *o, int pass, PxError *err)
{
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        A->a[c].used = 0;
    int rc = bind_static(A, tt, o, pass, err);
    if (!rc)
        rc = exec_acts_bind(o->X, o->c, tt, &A->a[MODEL_ACTIVATIONS], pass, err);
    return rc;
}

int exec_bind_all(ExecArenas *A, const ModelTensorTable *tt, const ExecCtx *c, ExecParams *P,
                  ExecActs *X, ExecWork *W, ExecPipe *pipe, ExecZero *Z, ExecBatches *B,
                  ExecFp8 *F, PxError *err)
{
    const Owners o = {c, P, X, W, pipe, Z, B, F};
    int rc = bind(A, tt, &o, 0, err);
    if (rc)
        return rc;
    for (int k = 0; k < MODEL_CAT_COUNT; k++) {
        ExecArena *a = &A->a[k];
        a->cap = a->used;
        if (a->cap == 0)
            continue;
        /* optimizer offload: master and optimizer state in host memory, not the device's */
        a->host = model_category_on_host(&c->spec.layout, (ModelCategory)k);
        a->base = a->host ? aligned_alloc(64, px_round_up(a->cap, 64)) : c->k->alloc(a->cap);
        if (a->host && a->base)
            memset(a->base, 0, a->cap);
        if (!a->base)
            return px_fail(err, PX_ERUNTIME, "out of memory: %.3f GiB of %s",
                           (double)a->cap / PX_GIB, model_category_name((ModelCategory)k));
    }
    rc = bind(A, tt, &o, 1, err);
    for (int k = 0; !rc && k < MODEL_CAT_COUNT; k++)
        if (A->a[k].used != A->a[k].cap)
            rc = px_fail(err, PX_ERUNTIME, "the %s arena was sized %llu bytes but carved %llu",
                         model_category_name((ModelCategory)k), (unsigned long long)A->a[k].cap,
                         (unsigned long long)A->a[k].used);
    return rc;
}
