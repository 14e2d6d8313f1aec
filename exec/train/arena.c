/* The arena: one allocation carved front to back, each piece aligned to its element size; the
 * category arenas (bind.c) and the activation pools (acts.c) are carved with it. Also the
 * binding's failures, which every part that takes tensors reports (below them all, so that
 * no part calls back into bind.c). */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

void *exec_arena_carve(ExecArena *a, uint64_t bytes, size_t align)
{
    uint64_t off = px_round_up(a->used, align ? align : 1);
    a->used = off + bytes;
    if (!a->base || a->used > a->cap)
        return NULL;
    return a->base + off;
}

void exec_arenas_free(ExecArenas *A, const KernBackend *k)
{
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        if (A->a[c].host)
            free(A->a[c].base);
        else if (k && A->a[c].base)
            k->free(A->a[c].base);
    memset(A, 0, sizeof *A);
}

int exec_bind_unused(const ModelTensor *t, PxError *err)
{
    return px_fail(err, PX_ERUNTIME,
                   "the trainer has no use for tensor %s (%s) of the tensor table: model/ and "
                   "exec/ disagree",
                   t->name, model_category_name(t->cat));
}

int exec_bind_wrong_dtype(const ModelTensor *t, PxDtype want, PxError *err)
{
    return px_fail(err, PX_ERUNTIME,
                   "tensor %s of the tensor table is %s but the trainer keeps it in %s: model/ and "
                   "exec/ disagree",
                   t->name, px_dtype_name(t->dtype), px_dtype_name(want));
}
