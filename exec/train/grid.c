/* This rank's place in the layout: its stage and its ranks in the TP, CP, DP and ZeRO groups
 * (Megatron-Core's rank order, model_rank), its neighbouring stages, the model chunks and layers
 * it holds, and whether its stage reads tokens, computes the loss or shares a tied embedding. */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

int exec_grid_init(ExecGrid *g, const ModelSpec *s, const ModelDims *d, int rank, int world,
                   const ModelTensorTable *tt, PxError *err)
{
    memset(g, 0, sizeof *g);
    /* the chunks' four counts in one allocation, as many chunks as the stage holds */
    if (!(g->chunk_g = calloc(4 * (size_t)(d->v > 0 ? d->v : 1), sizeof *g->chunk_g)))
        return px_fail(err, PX_ERUNTIME, "out of memory for the stage's %d chunks", d->v);
    g->chunk_l0 = g->chunk_g + d->v;
    g->chunk_cl = g->chunk_l0 + d->v;
    g->chunk_mtp = g->chunk_cl + d->v;
    const ModelLayout *l = &s->layout;
    g->rank = rank;
    g->world = world;
    model_rank_coords(l, rank, &g->tp_rank, &g->cp_rank, &g->dp_rank, &g->stage);
    g->zero_n = d->zero_group;
    int pp_rank;
    model_expert_coords(l, rank, &g->etp_rank, &g->ep_rank, &g->edp_rank, &pp_rank);
    /* HSDP: dp rank = shard + dp_shard x replica; the ZeRO group is one replica's dp_shard x cp */
    g->dp_replica = g->dp_rank / d->dp_shard;
    g->zero_rank = g->cp_rank + l->cp * (g->dp_rank % d->dp_shard);
    g->prev_rank = model_rank(l, g->tp_rank, g->cp_rank, g->dp_rank, (g->stage + d->p - 1) % d->p);
    g->next_rank = model_rank(l, g->tp_rank, g->cp_rank, g->dp_rank, (g->stage + 1) % d->p);
    /* an uneven split over virtual stages gives each chunk its own count (the first and the
     * last chunk may hold none: only the embedding, only the output layer and loss); a slot of
     * layer sets is sized by the largest (acts.c) */
    for (int j = 0; j < d->v; j++) {
        g->chunk_g[j] = model_global_chunk(d, g->stage, j);
        g->chunk_cl[j] = model_chunk_layers(s, d, g->chunk_g[j], &g->chunk_l0[j]);
        g->chunk_mtp[j] = g->chunk_g[j] == d->mtp_chunk ? s->model.mtp_layers : 0;
        if (g->chunk_cl[j] + g->chunk_mtp[j] > g->cl)
            g->cl = g->chunk_cl[j] + g->chunk_mtp[j];
    }
    g->tied_here = s->model.tied_embeddings && d->chunks == 1;
    g->tied_pair = s->model.tied_embeddings && d->chunks > 1;
    /* mtp.wte: an untied model's on a later stage, a tied one's on a stage of their own (on the
     * loss stage a tied model's modules read the output layer, its copy already; on the first
     * pipeline rank both read embed.wte) */
    g->mtp_pair = d->chunks > 1 && s->model.mtp_layers > 0 && d->mtp_chunk % d->p != 0 &&
                  (!s->model.tied_embeddings || d->mtp_chunk != d->chunks - 1);
    g->defer_logits_wgrad = g->tied_here && l->zero >= 2 && !d->zero_per_step;
    for (int i = 0; tt && i < tt->count; i++) {
        g->has_data |= tt->t[i].role == MODEL_TR_DATA_BATCH;
        g->has_loss |= tt->t[i].role == MODEL_TR_WS_XENT;
    }
    return PX_OK;
}

void exec_grid_free(ExecGrid *g)
{
    free(g->chunk_g);
    g->chunk_g = g->chunk_l0 = g->chunk_cl = g->chunk_mtp = NULL;
}
