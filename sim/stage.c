/* Which stage's tensor table and op graph stand for another's in a compact simulation. Both the
 * simulation (sim/simulate.c: memory, FLOPs, bytes) and the time model (sim/time.c) ask, so the
 * answer lives below them both. */
#include "sim/internal.h"

/* Stages 1 .. p-2 hold neither the embedding nor the output layer: with compact tables those
 * with as many layers are identical but for their position, so the first of them stands for
 * all (every middle stage of an even split; a group per layer count of an uneven one). */
int sim_stage_model_of(const ModelSpec *spec, const ModelDims *d, int compact, int stage)
{
    /* a standalone MTP stage's pipeline rank is like no other */
    const int mtp_rank = spec->model.mtp_layers > 0 ? d->mtp_chunk % d->p : -1;
    if (!compact || d->p < 3 || stage == 0 || stage == d->p - 1 || stage == mtp_rank)
        return stage;
    /* a stage like another holds as many layers in each of its chunks (the chunk at j is the
     * virtual stage j * p + s); the embedding, the loss and the prediction modules sit on
     * their stages only */
    const int *n = spec->layout.stage_layers;
    for (int s = 1; s < stage; s++) {
        if (s == mtp_rank)
            continue;
        int same = 1;
        for (int j = 0; j < d->v && same && d->uneven; j++)
            same = n[j * d->p + s] == n[j * d->p + stage];
        if (same)
            return s;
    }
    return stage;
}

int sim_stage_model(const SimResult *r, int stage)
{
    return sim_stage_model_of(&r->spec, &r->dims, r->work->compact, stage);
}
