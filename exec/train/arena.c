/* The arena: one allocation carved front to back, each piece aligned to its element size; the
 * category arenas (bind.c) and the activation pools (acts.c) are carved with it. */
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
        if (k && A->a[c].base)
            k->free(A->a[c].base);
    memset(A, 0, sizeof *A);
}
