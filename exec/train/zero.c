/* Data-parallel gradient reduction and ZeRO, block by block.
 *
 * The reduction overlaps the backward: during a chunk's last micro-batch each block starts its
 * non-blocking all-reduce (ZeRO-1: reduce-scatter into this rank's shard) as soon as its
 * gradients are complete, and the step waits for them before the optimizer. Tied embeddings
 * across stages first sum the two copies' gradients (embed_allreduce), then reduce over dp:
 * ZeRO-1's shards of the embedding block and of the final block differ, so the sum must come
 * first. ZeRO-2/3 reduce every micro-batch through one gradient bucket into this rank's
 * accumulating shard; ZeRO-3 gathers each block's parameters before its forward and backward
 * (DeepSpeed's once more for a recomputed forward; none after the forward when they are kept)
 * into a ring of gather buffers, the next layers' ahead of the compute (prefetch). Buckets cut
 * a block's gather and reduce-scatter into calls. HSDP all-reduces each reduced gradient shard
 * over its replicas at the step. Sequence parallelism's norm gradients are summed over TP
 * first (Korthikanti et al. 2022, Sec. 4.2.2). Under a pipeline ZeRO-2/3 run as torchtitan runs
 * FSDP2 there (model/ops.c, ModelDims.zero_per_step): gradients accumulate unsharded over the
 * stage's micro-batches and are reduce-scattered once a step as ZeRO-1's, into the block's
 * gradient shard; ZeRO-3 gathers every block once before the stage's first forward into a
 * buffer of its own, kept across the micro-batches. Every call is timed under its op of the
 * graph. Gradients, their reductions and the bucket are in the gradient dtype (c->grad: fp32, or
 * 16-bit with training.grad_dtype, summed in 16 bits as Megatron without
 * --accumulate-allreduce-grads-in-fp32 does). */
#include <math.h>
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
    Z->slot_of = calloc(n, sizeof *Z->slot_of);
    Z->gather_req = malloc(n * sizeof *Z->gather_req);
    Z->gather_op = calloc(n, sizeof *Z->gather_op);
    Z->gather_phase = calloc(n, sizeof *Z->gather_phase);
    if (!Z->req || !Z->reduced || !Z->op || !Z->slot_of || !Z->gather_req || !Z->gather_op ||
        !Z->gather_phase)
        return px_fail(err, PX_ERUNTIME, "out of memory for the reductions");
    for (int b = 0; b < n_blocks; b++)
        Z->req[b] = Z->gather_req[b] = -1;
    return PX_OK;
}

/* A block's ZeRO collective in buckets (model/ops.c's zero_comm, docs/time.md): `calls` calls
 * of `per` elements of each rank's shard; one call of the whole shard without buckets. */
static void bucket_calls(const ExecCtx *c, const ExecBlock *blk, size_t elem, int *calls, uint64_t *per)
{
    const double total = (double)blk->shard * blk->group * (double)elem;
    const double bucket = c->spec.layout.bucket_bytes;
    *calls = 1;
    if (bucket > 0 && total > bucket) {
        const double n = ceil(total / bucket);
        *calls = n < (double)blk->shard ? (int)n : (int)blk->shard;
    }
    *per = (blk->shard + (uint64_t)*calls - 1) / (uint64_t)*calls;
}

int exec_zero_buffers(ExecZero *Z, const ExecCtx *c, const ExecParams *P, PxError *err)
{
    const ModelLayout *l = &c->spec.layout;
    /* HSDP with ZeRO-1 all-reduces each shard where the reduce-scatter left it, inside the
     * block's unpadded gradients: every shard must be whole (the same verdict on every rank) */
    for (int b = 0; b < P->nb && l->zero == 1 && c->d.dp_rep > 1; b++)
        if (!P->b[b].experts && P->b[b].numel % (uint64_t)P->b[b].group != 0)
            return px_fail(err, PX_EINPUT, "HSDP with ZeRO-1: block %d's %llu elements do not split "
                           "evenly over the %d ranks of its shard group; use ZeRO-2 or 3", b,
                           (unsigned long long)P->b[b].numel, P->b[b].group);
    if (l->zero < 2)
        return PX_OK;
    /* under a pipeline every block of the stage is gathered once a step and kept, in one call
     * per block as its reduce-scatter is (no buckets, no prefetch) */
    const int per_step = c->d.zero_per_step, kept_all = l->keep_gathered || per_step;
    /* the largest block padded to its group (zero.param_gather's half), and the largest
     * bucketed call with its send side */
    uint64_t slot = 0, stage = 0, kept = 0;
    int experts = 0;
    for (int b = 0; b < P->nb; b++) {
        const ExecBlock *blk = &P->b[b];
        const uint64_t padded = blk->shard * (uint64_t)blk->group;
        slot = padded > slot ? padded : slot;
        kept += padded;
        experts |= blk->experts;
        /* the gathers' pieces (parameter dtype) and the reductions' (gradient dtype) */
        for (int k = 0; k < 2 && !per_step; k++) {
            int calls;
            uint64_t per;
            bucket_calls(c, blk, k ? c->gb : c->ab, &calls, &per);
            if (calls > 1 && per * (uint64_t)(blk->group + 1) > stage)
                stage = per * (uint64_t)(blk->group + 1);
        }
    }
    const size_t eb = c->ab > 4 ? c->ab : 4;
    /* prefetch: the layer being computed and `ahead` more in flight, a slot each; a MoE layer
     * gathers two blocks (the layer's and its experts'), which the ring of the two halves
     * holds only without prefetch */
    Z->ahead = l->zero == 3 && !experts && !per_step
                   ? (l->prefetch < 0 ? 0 : l->prefetch == 0 ? 1 : l->prefetch)
                   : 0;
    Z->n_ring = Z->ahead + 1 > 2 ? Z->ahead + 1 : 2;
    const uint64_t stage_bytes = px_round_up(stage * eb, 64);
    Z->extra_bytes = stage_bytes;
    if (Z->extra_bytes && !(Z->extra = c->k->alloc(Z->extra_bytes)))
        return px_fail(err, PX_ERUNTIME, "out of memory: %.3f GiB for ZeRO's bucketed gathers",
                       (double)Z->extra_bytes / PX_GIB);
    Z->stage = stage_bytes ? Z->extra : NULL;
    if (l->zero < 3)
        return PX_OK;
    if (Z->pg.on)
        return exec_pg_buffers(Z, c, P, err);
    /* the ring's slots, or the kept blocks, one after another in zero.param_gather */
    const uint64_t need = kept_all ? kept : (uint64_t)Z->n_ring * slot;
    if (need > Z->gather_elems)
        return px_fail(err, PX_ERUNTIME, "zero.param_gather holds %llu elements, the %s need %llu "
                       "(the memory table and the executor disagree)",
                       (unsigned long long)Z->gather_elems,
                       kept_all ? "kept blocks" : "prefetch ring's slots", (unsigned long long)need);
    for (int i = 0; i < Z->n_ring; i++)
        Z->ring[i] = EXEC_AT(Z->gather[0], (uint64_t)i * slot, c->ab);
    if (kept_all) {
        if (!(Z->kept = calloc((size_t)P->nb, sizeof *Z->kept)))
            return px_fail(err, PX_ERUNTIME, "out of memory for the kept gathers");
        uint64_t at = 0;
        for (int b = 0; b < P->nb; b++) {
            Z->kept[b] = EXEC_AT(Z->gather[0], at, c->ab);
            at += P->b[b].shard * (uint64_t)P->b[b].group;
        }
    }
    return PX_OK;
}

void exec_zero_free(ExecZero *Z, const KernBackend *k)
{
    if (k && Z->extra)
        k->free(Z->extra);
    exec_pg_free(&Z->pg, k);
    free(Z->kept);
    free(Z->slot_of);
    free(Z->gather_req);
    free(Z->gather_op);
    free(Z->gather_phase);
    free(Z->req);
    free(Z->reduced);
    free(Z->op);
    memset(Z, 0, sizeof *Z);
}

int exec_zero_bind(ExecZero *Z, const ExecCtx *c, const ModelTensor *t, void *p, PxError *err)
{
    const int bucket = t->role == MODEL_TR_ZERO_GRAD_BUCKET;
    if (!bucket && t->dtype == PX_FP8)
        return exec_pg_bind(&Z->pg, t, p, err);
    const PxDtype want = bucket ? c->grad : c->act;
    if (t->dtype != want)
        return exec_bind_wrong_dtype(t, want, err);
    if (bucket) {
        Z->bucket = p;
        Z->bucket_elems = t->numel;
    } else {
        Z->gather[0] = p;
        Z->gather[1] = p ? EXEC_AT(p, t->numel / 2, c->ab) : NULL;
        Z->gather_elems = (uint64_t)t->numel;
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
                              MODEL_TP_ALLREDUCE, 0, "sp_grads.tp_allreduce of a block", &op, err)))
        return rc;
    if (packed) {
        /* packed in the gradient dtype into the scratch (scratch_elems counts fp32 elements) */
        if (!Z->scratch || total * c->gb > Z->scratch_elems * sizeof(float))
            return px_fail(err, PX_ERUNTIME, "block %d: %llu replicated gradients to sum over TP "
                           "but a scratch of %llu fp32 elements", b, (unsigned long long)total,
                           (unsigned long long)Z->scratch_elems);
        exec_meter_open(M, c->k, op);
        uint64_t o = 0;
        for (int i = blk->first_param; i < end; i++)
            if (P->p[i].sp_sum) {
                c->k->copy(EXEC_AT(Z->scratch, o, c->gb), EXEC_AT(grads, P->p[i].off, c->gb),
                           P->p[i].numel * c->gb);
                o += P->p[i].numel;
            }
        rc = comm_allreduce(c->comm, Z->scratch, total, c->grad, COMM_SUM, MODEL_TP_ALLREDUCE,
                            NULL, err);
        o = 0;
        for (int i = blk->first_param; i < end && !rc; i++)
            if (P->p[i].sp_sum) {
                c->k->copy(EXEC_AT(grads, P->p[i].off, c->gb), EXEC_AT(Z->scratch, o, c->gb),
                           P->p[i].numel * c->gb);
                o += P->p[i].numel;
            }
        exec_meter_close(M, c->k, op);
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
        exec_meter_open(M, c->k, op); /* one call per norm, as the graph counts them */
        rc = comm_allreduce(c->comm, EXEC_AT(grads, P->p[i].off, c->gb), n, c->grad, COMM_SUM,
                            MODEL_TP_ALLREDUCE, NULL, err);
        exec_meter_close(M, c->k, op);
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
    exec_meter_open(M, c->k, Z->op[b]);
    if (zero == 0)
        rc = comm_allreduce(c->comm, blk->g, blk->numel, c->grad, COMM_SUM, kind, &Z->req[b], err);
    else
        rc = comm_reduce_scatter_shard(c->comm, blk->g, blk->numel, blk->shard, c->grad, kind,
                                       &Z->req[b], err);
    exec_meter_close(M, c->k, Z->op[b]);
    return rc;
}

int exec_zero_block_done(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                         PxError *err)
{
    /* ZeRO-2/3 without a pipeline reduce every micro-batch (exec_zero_bucket_reduce); a tied
     * block waits for the sum of the two copies at the end of the step */
    if (exec_zero_bucketed(c) || P->b[b].tied || Z->reduced[b])
        return PX_OK;
    int rc = start_reduce(Z, c, P, M, b, err);
    comm_progress(c->comm);
    return rc;
}

/* The tied embedding's copies summed over the embedding group (the first stage and the stages
 * holding a copy). */
static int tied_sum(const ExecCtx *c, ExecParams *P, ExecMeter *M, int b, PxError *err)
{
    const ExecBlock *blk = &P->b[b];
    /* block b's: the first chunk's embedding, or a copy (the output layer's, or the prediction
     * modules' mtp.wte) */
    const ExecParam *p = NULL;
    for (int i = 0; i < P->n && !p; i++)
        if (P->p[i].block == b &&
            (P->p[i].tied_copy || (b == P->embed_block && P->p[i].role == MODEL_TR_WTE)))
            p = &P->p[i];
    int op = exec_meter_find(M, MODEL_OPR_BLOCK_GRADS, b, blk->chunk, MODEL_STEP,
                             MODEL_EMBED_ALLREDUCE, 0);
    if (!p || op < 0)
        return exec_meter_missing(c, "embed_allreduce of the tied embedding", err);
    exec_meter_open(M, c->k, op);
    int rc = comm_allreduce(c->comm, p->g, p->numel, c->grad, COMM_SUM, MODEL_EMBED_ALLREDUCE, NULL,
                            err);
    exec_meter_close(M, c->k, op);
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
    void *shard = c->spec.layout.zero >= 2 ? (void *)blk->g_shard
                                           : EXEC_AT(blk->g, blk->own_off, c->gb);
    int op, rc;
    if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_GRADS, b, blk->chunk, MODEL_STEP,
                              MODEL_DPR_ALLREDUCE, 0, "dpr_allreduce of a block", &op, err)))
        return rc;
    exec_meter_open(M, c->k, op);
    rc = comm_allreduce(c->comm, shard, blk->shard, c->grad, COMM_SUM, MODEL_DPR_ALLREDUCE, NULL,
                        err);
    exec_meter_close(M, c->k, op);
    return rc;
}

/* ZeRO-2/3 under a pipeline: the step's reduce-scatter left this rank's summed shard at its
 * place in the block's unsharded gradients; it goes to the block's gradient shard (padded
 * with zeros past the block's end), which the update and HSDP's replicas read as without a
 * pipeline. */
static void shard_out(const ExecCtx *c, ExecParams *P, int b)
{
    const ExecBlock *blk = &P->b[b];
    const size_t gb = c->gb;
    if (blk->own_n)
        c->k->copy(blk->g_shard, EXEC_AT(blk->g, blk->own_off, gb), blk->own_n * gb);
    if (blk->own_n < blk->shard)
        c->k->memset0(EXEC_AT(blk->g_shard, blk->own_n, gb), (blk->shard - blk->own_n) * gb);
}

int exec_zero_finish(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err)
{
    int rc = PX_OK;
    const int bucketed = exec_zero_bucketed(c);
    for (int b = 0; b < P->nb && !rc; b++)
        if (P->b[b].tied && !bucketed)
            rc = tied_sum(c, P, M, b, err);
    for (int b = 0; b < P->nb && !rc; b++)
        if (!bucketed && !Z->reduced[b])
            rc = start_reduce(Z, c, P, M, b, err);
    for (int b = 0; b < P->nb && !rc; b++) {
        if (Z->req[b] < 0)
            continue;
        exec_meter_open_again(M, c->k, Z->op[b]);
        rc = comm_wait(c->comm, &Z->req[b], err);
        exec_meter_close(M, c->k, Z->op[b]);
    }
    for (int b = 0; b < P->nb && !rc && c->d.zero_per_step; b++)
        if (P->b[b].n_params > 0)
            shard_out(c, P, b);
    for (int b = 0; b < P->nb && !rc && c->d.dp_rep > 1; b++)
        rc = replicas_allreduce(c, P, M, b, err);
    return rc;
}

/* A bucketed all-gather of block b into dst, call by call through the staging: each rank's
 * piece of its shard (zero-padded past the shard's end) gathered, then each rank's piece moved
 * to its place in the block. */
static int gather_buckets(ExecZero *Z, const ExecCtx *c, const ExecBlock *blk, ModelComm kind,
                          void *dst, int calls, uint64_t per, ExecMeter *M, int op, PxError *err)
{
    const size_t ab = c->ab;
    void *send = Z->stage, *recv = EXEC_AT(Z->stage, per, ab);
    int rc = PX_OK;
    for (int j = 0; j < calls && !rc; j++) {
        const uint64_t lo = (uint64_t)j * per, n = lo >= blk->shard ? 0 : (blk->shard - lo < per ? blk->shard - lo : per);
        exec_meter_open(M, c->k, op);
        if (n < per)
            c->k->memset0(send, per * ab);
        if (n)
            c->k->copy(send, EXEC_AT(blk->w_shard, lo, ab), n * ab);
        rc = comm_all_gather(c->comm, recv, send, per, c->act, kind, NULL, err);
        for (int r = 0; r < blk->group && !rc && n; r++)
            c->k->copy(EXEC_AT(dst, (uint64_t)r * blk->shard + lo, ab),
                       EXEC_AT(recv, (uint64_t)r * per, ab), n * ab);
        exec_meter_close(M, c->k, op);
    }
    return rc;
}

/* Issues block b's gather for (phase, occurrence) into its buffer: non-blocking when `async`
 * and the call is one (the wait is exec_zero_gather's), else complete on return. */
static int issue_gather(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                        ModelPhase phase, int occurrence, int async, PxError *err)
{
    const ExecBlock *blk = &P->b[b];
    void *dst;
    if (Z->kept) {
        dst = Z->kept[b];
    } else if (phase == MODEL_BWD && Z->gather_phase[b] == -((int)MODEL_RECOMPUTE + 1)) {
        /* DeepSpeed's gather after the recomputed forward: into the slot that forward read, so
         * that the ring's order (and what is prefetched in it) stays the issue order */
        dst = Z->slot_of[b];
    } else {
        dst = Z->ring[Z->ring_next];
        Z->ring_next = (Z->ring_next + 1) % Z->n_ring;
    }
    Z->slot_of[b] = dst;
    Z->gather_phase[b] = (int)phase + 1;
    if (Z->pg.on)
        return exec_pg_issue(Z, c, P, M, b, phase, occurrence, async, dst, err);
    if (blk->group < 2) {
        c->k->copy(dst, blk->w_shard, blk->numel * c->ab);
        exec_params_point(P, c, b, dst);
        return PX_OK;
    }
    int op, rc, calls;
    uint64_t per;
    const ModelComm kind = block_kind(blk, MODEL_DP_ALL_GATHER);
    if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, b, blk->chunk, phase, kind,
                              occurrence, "parameter all-gather of a block", &op, err)))
        return rc;
    bucket_calls(c, blk, c->ab, &calls, &per);
    if (calls > 1) {
        rc = gather_buckets(Z, c, blk, kind, dst, calls, per, M, op, err);
    } else {
        exec_meter_open(M, c->k, op);
        rc = comm_all_gather(c->comm, dst, blk->w_shard, blk->shard, c->act, kind,
                             async ? &Z->gather_req[b] : NULL, err);
        exec_meter_close(M, c->k, op);
        Z->gather_op[b] = op;
    }
    if (!rc)
        exec_params_point(P, c, b, dst);
    return rc;
}

int exec_zero_prefetch(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                       ModelPhase phase, PxError *err)
{
    if (c->spec.layout.zero != 3 || c->d.zero_per_step || b < 0 ||
        Z->gather_phase[b] == (int)phase + 1)
        return PX_OK;
    if (Z->kept && phase != MODEL_FWD)
        return PX_OK; /* the forward's gather is kept */
    int rc = issue_gather(Z, c, P, M, b, phase, 0, 1, err);
    Z->prefetched += rc == PX_OK;
    return rc;
}

int exec_zero_gather(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                     ModelPhase phase, int occurrence, PxError *err)
{
    /* under a pipeline the step's gather (exec_zero_gather_step) serves every pass */
    if (c->spec.layout.zero != 3 || c->d.zero_per_step || b < 0)
        return PX_OK;
    int rc = PX_OK;
    if (Z->kept && phase != MODEL_FWD) {
        /* keep_gathered: the forward's gathered parameters serve the backward */
        if (Z->pg.on)
            rc = exec_pg_finish(Z, c, P, b, err);
        else
            exec_params_point(P, c, b, Z->kept[b]);
    } else if (Z->gather_phase[b] == (int)phase + 1 && occurrence == 0) {
        /* prefetched: wait for it (timed under its op again, as a reduction's wait is) */
        if (Z->gather_req[b] >= 0) {
            exec_meter_open_again(M, c->k, Z->gather_op[b]);
            rc = comm_wait(c->comm, &Z->gather_req[b], err);
            if (!rc && Z->pg.on)
                rc = comm_wait(c->comm, &Z->pg.req8[b], err);
            exec_meter_close(M, c->k, Z->gather_op[b]);
        }
        if (Z->pg.on && !rc)
            rc = exec_pg_finish(Z, c, P, b, err);
        else
            exec_params_point(P, c, b, Z->slot_of[b]);
    } else {
        rc = issue_gather(Z, c, P, M, b, phase, occurrence, 0, err);
    }
    Z->gather_phase[b] = -((int)phase + 1); /* consumed: the next pass gathers again */
    return rc;
}

void exec_zero_bucket_clear(ExecZero *Z, const ExecCtx *c, const ExecParams *P, int b)
{
    if (!exec_zero_bucketed(c) || b < 0)
        return;
    c->k->memset0(Z->bucket, (size_t)P->b[b].shard * (size_t)P->b[b].group * c->gb);
}

/* A bucketed reduce-scatter of the bucket (block blk's gradients, rank-major shards), call by
 * call through the staging: piece j of every rank's shard packed (zero-padded past the
 * shard's end), reduce-scattered, and this rank's summed piece added to its shard. */
/* dst += src over n gradients: fp32, or 16-bit ones (the act dtype's add, one rounding) */
static void grad_acc(const ExecCtx *c, void *dst, const void *src, uint64_t n)
{
    if (c->grad == PX_FP32)
        c->k->add_f32(dst, src, n);
    else
        c->k->add_inplace(dst, src, n);
}

static int reduce_buckets(ExecZero *Z, const ExecCtx *c, const ExecBlock *blk, ModelComm kind,
                          int calls, uint64_t per, ExecMeter *M, int op, PxError *err)
{
    const size_t gb = c->gb;
    void *send = Z->stage, *recv = EXEC_AT(Z->stage, per * (uint64_t)blk->group, gb);
    int rc = PX_OK;
    for (int j = 0; j < calls && !rc; j++) {
        const uint64_t lo = (uint64_t)j * per, n = lo >= blk->shard ? 0 : (blk->shard - lo < per ? blk->shard - lo : per);
        exec_meter_open(M, c->k, op);
        if (n < per)
            c->k->memset0(send, per * (uint64_t)blk->group * gb);
        for (int r = 0; r < blk->group && n; r++)
            c->k->copy(EXEC_AT(send, (uint64_t)r * per, gb),
                       EXEC_AT(Z->bucket, (uint64_t)r * blk->shard + lo, gb), n * gb);
        rc = comm_reduce_scatter(c->comm, recv, send, per, c->grad, kind, NULL, err);
        if (!rc && n)
            grad_acc(c, EXEC_AT(blk->g_shard, lo, gb), recv, n);
        exec_meter_close(M, c->k, op);
    }
    return rc;
}

/* The block's gradients of this micro-batch are in the bucket: summed over the group into
 * this rank's shard, which accumulates them over the micro-batches. */
int exec_zero_bucket_reduce(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                            PxError *err)
{
    if (!exec_zero_bucketed(c) || b < 0)
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
        int calls;
        uint64_t per;
        bucket_calls(c, blk, c->gb, &calls, &per);
        if (calls > 1)
            return reduce_buckets(Z, c, blk, kind, calls, per, M, op, err);
        exec_meter_open(M, c->k, op);
        /* in place: this rank's summed shard lands at the start of the bucket */
        rc = comm_reduce_scatter(c->comm, Z->bucket, Z->bucket, blk->shard, c->grad, kind, NULL,
                                 err);
        if (!rc)
            grad_acc(c, blk->g_shard, Z->bucket, blk->shard);
        exec_meter_close(M, c->k, op);
        return rc;
    }
    grad_acc(c, blk->g_shard, Z->bucket, blk->numel);
    return PX_OK;
}

int exec_zero_gather_step(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M,
                          PxError *err)
{
    if (c->spec.layout.zero != 3 || !c->d.zero_per_step)
        return PX_OK;
    int rc = PX_OK;
    for (int b = 0; b < P->nb && !rc; b++) {
        const ExecBlock *blk = &P->b[b];
        if (blk->n_params == 0)
            continue;
        if (Z->pg.on) { /* FP8 weights in one byte, with the step's scales (fp8gather.c) */
            Z->slot_of[b] = Z->kept[b];
            rc = exec_pg_issue(Z, c, P, M, b, MODEL_STEP, 0, 0, Z->kept[b], err);
            continue;
        }
        if (blk->group < 2) {
            c->k->copy(Z->kept[b], blk->w_shard, blk->numel * c->ab);
        } else {
            const ModelComm kind = block_kind(blk, MODEL_DP_ALL_GATHER);
            int op;
            if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, b, blk->chunk, MODEL_STEP,
                                      kind, 0, "parameter all-gather of a block", &op, err)))
                return rc;
            exec_meter_open(M, c->k, op);
            rc = comm_all_gather(c->comm, Z->kept[b], blk->w_shard, blk->shard, c->act, kind, NULL,
                                 err);
            exec_meter_close(M, c->k, op);
        }
        if (!rc)
            exec_params_point(P, c, b, Z->kept[b]);
    }
    return rc;
}

int exec_zero_gather_updated(const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err)
{
    const int zero = c->spec.layout.zero;
    int rc = PX_OK;
    for (int b = 0; b < P->nb && !rc && (zero == 1 || zero == 2); b++) {
        ExecBlock *blk = &P->b[b];
        if (blk->group < 2 || blk->fp8) /* FP8 parameters: exec_pg_updated */
            continue;
        const ModelComm kind = block_kind(blk, MODEL_DP_ALL_GATHER);
        int op;
        if ((rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, b, blk->chunk, MODEL_STEP, kind,
                                  0, "parameter all-gather of a block", &op, err)))
            return rc;
        exec_meter_open(M, c->k, op);
        rc = comm_all_gather_shard(c->comm, blk->w, blk->numel, blk->shard, c->act, kind, NULL,
                                   err);
        exec_meter_close(M, c->k, op);
    }
    return rc;
}
