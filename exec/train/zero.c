/* Data-parallel gradient reduction and ZeRO, block by block.
 *
 * The reduction overlaps the backward: during a chunk's last micro-batch each block starts its
 * non-blocking all-reduce (ZeRO-1: reduce-scatter into this rank's shard) as soon as its
 * gradients are complete, and the step waits for them before the optimizer. Tied embeddings
 * across stages first sum the two copies' gradients (embed_allreduce), then reduce over dp:
 * ZeRO-1's shards of the embedding block and of the final block differ, so the sum must come
 * first. ZeRO-2/3 reduce every micro-batch through one gradient bucket into this rank's
 * accumulating shard; ZeRO-3 gathers each block's parameters before its forward and backward
 * into one of two gather buffers. Sequence parallelism's norm gradients are summed over TP
 * first (Korthikanti et al. 2022, Sec. 4.2.2). Every call is timed under its op of the graph. */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

int exec_zero_init(ExecZero *Z, int n_blocks, PxError *err)
{
    memset(Z, 0, sizeof *Z);
    const size_t n = (size_t)(n_blocks > 0 ? n_blocks : 1);
    Z->req = malloc(n * sizeof *Z->req);
    Z->reduced = calloc(n, sizeof *Z->reduced);
    Z->op = calloc(n, sizeof *Z->op);
    if (!Z->req || !Z->reduced || !Z->op)
        return px_fail(err, PX_ERUNTIME, "out of memory for the reductions");
    for (int b = 0; b < n_blocks; b++)
        Z->req[b] = -1;
    return PX_OK;
}

void exec_zero_free(ExecZero *Z)
{
    free(Z->req);
    free(Z->reduced);
    free(Z->op);
    memset(Z, 0, sizeof *Z);
}

int exec_zero_bind(ExecZero *Z, const ExecCtx *c, const ModelTensor *t, void *p, PxError *err)
{
    const int bucket = t->role == MODEL_TR_ZERO_GRAD_BUCKET;
    const PxDtype want = bucket ? PX_FP32 : c->act;
    if (t->dtype != want)
        return exec_bind_wrong_dtype(t, want, err);
    if (bucket) {
        Z->bucket = p;
        Z->bucket_elems = t->numel;
    } else {
        Z->gather[0] = p;
        Z->gather[1] = p ? EXEC_AT(p, t->numel / 2, c->ab) : NULL;
    }
    return PX_OK;
}

void exec_zero_step_begin(ExecZero *Z, int n_blocks)
{
    for (int b = 0; b < n_blocks; b++) {
        Z->reduced[b] = 0;
        Z->req[b] = -1;
    }
}

/* The data-parallel collective `kind` (a DP_* kind) for a block: over the expert-data-parallel
 * group for a MoE layer's experts (model/ops.c's block_kind). */
static ModelComm block_kind(const ExecBlock *blk, ModelComm kind)
{
    if (!blk->experts)
        return kind;
    return kind == MODEL_DP_ALLREDUCE        ? MODEL_EDP_ALLREDUCE
           : kind == MODEL_DP_REDUCE_SCATTER ? MODEL_EDP_REDUCE_SCATTER
                                             : MODEL_EDP_ALL_GATHER;
}

/* Sequence parallelism: the norms' replicated parameters saw only this rank's sequence shard,
 * so their gradients are summed over TP, one call per norm (a contiguous run of norm
 * parameters in the block) as the op graph lists them. A MoE layer's router (replicated too)
 * joins its norms in one call, packed through the scratch. grads: the block's gradient
 * buffer. */
static int sp_norm_grads(const ExecZero *Z, const ExecCtx *c, const ExecParams *P, ExecMeter *M,
                         int b, float *grads, ModelPhase phase, PxError *err)
{
    const ExecBlock *blk = &P->b[b];
    if (!c->spec.layout.sp || c->d.t < 2 || blk->n_params == 0)
        return PX_OK;
    int op = -1, rc = PX_OK, packed = 0;
    const int end = blk->first_param + blk->n_params;
    uint64_t total = 0;
    for (int i = blk->first_param; i < end; i++) {
        packed |= P->p[i].sp_sum && !P->p[i].norm;
        total += P->p[i].sp_sum ? P->p[i].numel : 0;
    }
    if (total == 0)
        return PX_OK;
    if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_SP_GRADS, b, blk->chunk, phase,
                              MODEL_TP_ALLREDUCE, 0, "a block's sp_grads.tp_allreduce", &op, err)))
        return rc;
    if (packed) {
        if (!Z->scratch || total > Z->scratch_elems)
            return px_fail(err, PX_ERUNTIME, "block %d: %llu replicated gradients to sum over TP "
                           "but a scratch of %llu", b, (unsigned long long)total,
                           (unsigned long long)Z->scratch_elems);
        exec_meter_begin(M, c->k, op);
        uint64_t o = 0;
        for (int i = blk->first_param; i < end; i++)
            if (P->p[i].sp_sum) {
                c->k->copy(Z->scratch + o, grads + P->p[i].off, P->p[i].numel * sizeof(float));
                o += P->p[i].numel;
            }
        rc = comm_allreduce(c->comm, Z->scratch, total, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE,
                            NULL, err);
        o = 0;
        for (int i = blk->first_param; i < end && !rc; i++)
            if (P->p[i].sp_sum) {
                c->k->copy(grads + P->p[i].off, Z->scratch + o, P->p[i].numel * sizeof(float));
                o += P->p[i].numel;
            }
        exec_meter_end(M, c->k);
        return rc;
    }
    for (int i = blk->first_param; i < end && !rc;) {
        if (!P->p[i].norm) {
            i++;
            continue;
        }
        int k = i;
        uint64_t n = 0;
        while (k < end && P->p[k].norm && P->p[k].off == P->p[i].off + n)
            n += P->p[k++].numel;
        exec_meter_begin(M, c->k, op); /* one call per norm, as the graph counts them */
        rc = comm_allreduce(c->comm, grads + P->p[i].off, n, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE,
                            NULL, err);
        exec_meter_end(M, c->k);
        i = k;
    }
    return rc;
}

/* Starts the data-parallel reduction of a block (ZeRO 0: all-reduce; 1: reduce-scatter into
 * this rank's shard), non-blocking; its op is timed here and again while the step waits. */
static int start_reduce(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                        PxError *err)
{
    ExecBlock *blk = &P->b[b];
    const int zero = c->spec.layout.zero;
    int rc = sp_norm_grads(Z, c, P, M, b, blk->g, MODEL_STEP, err);
    Z->reduced[b] = 1;
    /* a MoE layer's routed experts are replicated (and sharded) over the expert-data-parallel
     * group only */
    if (rc || blk->group < 2)
        return rc;
    const ModelComm kind = block_kind(blk, zero == 0 ? MODEL_DP_ALLREDUCE : MODEL_DP_REDUCE_SCATTER);
    if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_GRADS, b, blk->chunk, MODEL_STEP, kind, 0,
                              "a block's gradient reduction", &Z->op[b], err)))
        return rc;
    exec_meter_begin(M, c->k, Z->op[b]);
    if (zero == 0)
        rc = comm_allreduce(c->comm, blk->g, blk->numel, PX_FP32, COMM_SUM, kind, &Z->req[b], err);
    else
        rc = comm_reduce_scatter_shard(c->comm, blk->g, blk->numel, blk->shard, PX_FP32, kind,
                                       &Z->req[b], err);
    exec_meter_end(M, c->k);
    return rc;
}

int exec_zero_block_done(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                         PxError *err)
{
    /* ZeRO-2/3 reduce every micro-batch (exec_zero_bucket_reduce); a tied block waits for the
     * sum of the two copies at the end of the step */
    if (c->spec.layout.zero >= 2 || P->b[b].tied || Z->reduced[b])
        return PX_OK;
    int rc = start_reduce(Z, c, P, M, b, err);
    comm_progress(c->comm);
    return rc;
}

/* The tied embedding's copies summed over the first and last stages. */
static int tied_sum(const ExecCtx *c, ExecParams *P, ExecMeter *M, int b, PxError *err)
{
    const ExecBlock *blk = &P->b[b];
    /* a stage holds each at most once: the first chunk's embedding, the last chunk's copy */
    const ExecParam *p =
        exec_params_of(P, b == P->embed_block ? MODEL_TR_WTE : MODEL_TR_LOGITS_W, -1);
    int op = exec_meter_find(M, MODEL_OPR_BLOCK_GRADS, b, blk->chunk, MODEL_STEP,
                             MODEL_EMBED_ALLREDUCE, 0);
    if (!p || op < 0)
        return exec_meter_missing(c, "the tied embedding's embed_allreduce", err);
    exec_meter_begin(M, c->k, op);
    int rc = comm_allreduce(c->comm, p->g, p->numel, PX_FP32, COMM_SUM, MODEL_EMBED_ALLREDUCE, NULL,
                            err);
    exec_meter_end(M, c->k);
    return rc;
}

/* HSDP: block b's gradient shard, reduced over its shard group, summed over the dp_replicate
 * replicas of that shard (one call of the padded shard, as the graph counts it); the routed
 * experts' blocks are reduced over their whole expert-data-parallel group already. */
static int replicas_allreduce(const ExecCtx *c, ExecParams *P, ExecMeter *M, int b, PxError *err)
{
    ExecBlock *blk = &P->b[b];
    if (blk->experts)
        return PX_OK;
    float *shard = c->spec.layout.zero >= 2 ? blk->g_shard : blk->g + blk->own_off;
    /* ZeRO-1 keeps the shard inside the unpadded gradients: the last shard must be whole */
    if (c->spec.layout.zero < 2 && blk->own_n != blk->shard)
        return px_fail(err, PX_ERUNTIME, "HSDP with ZeRO-1: block %d's %llu elements do not split "
                       "evenly over the %d ranks of its shard group; use ZeRO-2 or 3", b,
                       (unsigned long long)blk->numel, blk->group);
    int op, rc;
    if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_GRADS, b, blk->chunk, MODEL_STEP,
                              MODEL_DPR_ALLREDUCE, 0, "a block's dpr_allreduce", &op, err)))
        return rc;
    exec_meter_begin(M, c->k, op);
    rc = comm_allreduce(c->comm, shard, blk->shard, PX_FP32, COMM_SUM, MODEL_DPR_ALLREDUCE, NULL,
                        err);
    exec_meter_end(M, c->k);
    return rc;
}

int exec_zero_finish(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err)
{
    int rc = PX_OK;
    const int zero = c->spec.layout.zero;
    for (int b = 0; b < P->nb && !rc; b++)
        if (P->b[b].tied && zero < 2)
            rc = tied_sum(c, P, M, b, err);
    for (int b = 0; b < P->nb && !rc; b++)
        if (zero <= 1 && !Z->reduced[b])
            rc = start_reduce(Z, c, P, M, b, err);
    for (int b = 0; b < P->nb && !rc; b++) {
        if (Z->req[b] < 0)
            continue;
        exec_meter_resume(M, c->k, Z->op[b]);
        rc = comm_wait(c->comm, &Z->req[b], err);
        exec_meter_end(M, c->k);
    }
    for (int b = 0; b < P->nb && !rc && c->d.dp_rep > 1; b++)
        rc = replicas_allreduce(c, P, M, b, err);
    return rc;
}

int exec_zero_gather(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                     ModelPhase phase, int occurrence, PxError *err)
{
    if (c->spec.layout.zero != 3 || b < 0)
        return PX_OK;
    const ExecBlock *blk = &P->b[b];
    void *slot = Z->gather[Z->gather_next];
    Z->gather_next ^= 1;
    if (blk->group > 1) {
        int op, rc;
        const ModelComm kind = block_kind(blk, MODEL_DP_ALL_GATHER);
        if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, b, blk->chunk, phase, kind,
                                  occurrence, "a block's parameter all-gather", &op, err)))
            return rc;
        exec_meter_begin(M, c->k, op);
        rc = comm_all_gather(c->comm, slot, blk->w_shard, blk->shard, c->act, kind, NULL, err);
        exec_meter_end(M, c->k);
        if (rc)
            return rc;
    } else {
        c->k->copy(slot, blk->w_shard, blk->numel * c->ab);
    }
    exec_params_point(P, c, b, slot);
    return PX_OK;
}

void exec_zero_bucket_clear(ExecZero *Z, const ExecCtx *c, const ExecParams *P, int b)
{
    if (c->spec.layout.zero < 2 || b < 0)
        return;
    c->k->memset0(Z->bucket, (size_t)P->b[b].shard * (size_t)P->b[b].group * sizeof(float));
}

/* The block's gradients of this micro-batch are in the bucket: summed over the group into
 * this rank's shard, which accumulates them over the micro-batches. */
int exec_zero_bucket_reduce(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                            PxError *err)
{
    if (c->spec.layout.zero < 2 || b < 0)
        return PX_OK;
    const ExecBlock *blk = &P->b[b];
    int rc = sp_norm_grads(Z, c, P, M, b, Z->bucket, MODEL_BWD, err);
    if (rc)
        return rc;
    if (blk->group > 1) {
        int op;
        const ModelComm kind = block_kind(blk, MODEL_DP_REDUCE_SCATTER);
        if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_GRADS, b, blk->chunk, MODEL_BWD, kind, 0,
                                  "a block's gradient reduce-scatter", &op, err)))
            return rc;
        exec_meter_begin(M, c->k, op);
        /* in place: this rank's summed shard lands at the start of the bucket */
        rc = comm_reduce_scatter(c->comm, Z->bucket, Z->bucket, blk->shard, PX_FP32, kind, NULL,
                                 err);
        if (!rc)
            c->k->add_f32(blk->g_shard, Z->bucket, blk->shard);
        exec_meter_end(M, c->k);
        return rc;
    }
    c->k->add_f32(blk->g_shard, Z->bucket, blk->numel);
    return PX_OK;
}

int exec_zero_gather_updated(const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err)
{
    const int zero = c->spec.layout.zero;
    int rc = PX_OK;
    for (int b = 0; b < P->nb && !rc && (zero == 1 || zero == 2); b++) {
        ExecBlock *blk = &P->b[b];
        if (blk->group < 2)
            continue;
        const ModelComm kind = block_kind(blk, MODEL_DP_ALL_GATHER);
        int op;
        if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, b, blk->chunk, MODEL_STEP, kind,
                                  0, "a block's parameter all-gather", &op, err)))
            return rc;
        exec_meter_begin(M, c->k, op);
        rc = comm_all_gather_shard(c->comm, blk->w, blk->numel, blk->shard, c->act, kind, NULL,
                                   err);
        exec_meter_end(M, c->k);
    }
    return rc;
}
