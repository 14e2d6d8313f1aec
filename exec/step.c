/* A training step: the stage's schedule (model_schedule_build) with the pipeline's transfers,
 * the gradient reduction of each block (data parallel, ZeRO, the tied embedding, sequence
 * parallelism's norm gradients), the global gradient norm and clipping, the learning rate,
 * and the optimizer over this rank's shard.
 *
 * Pipeline transfers. A stage has one send and one receive buffer (pp.send, pp.recv, as the
 * tensor table sizes them). With blocking sends 1F1B deadlocks (each neighbour sends before
 * it receives), and with one send buffer reused after a lazy wait the interleaved schedule
 * deadlocks too under a rendezvous protocol, because a stage consumes its neighbour's messages
 * in another order than they are produced. So each stage keeps its next expected receive
 * posted at all times (the receives of a step are known from the schedule), and a send only
 * waits for its predecessor before it overwrites pp.send: a message is then always matched as
 * soon as its receiver has consumed the previous one, which no schedule of model/schedule.c
 * blocks (test_exec_schedule replays pp 2-8, vpp 1-4, up to 24 micro-batches).
 * Tags carry (receiving chunk, micro-batch, direction).
 *
 * Data-parallel reduction overlaps the backward: during a chunk's last micro-batch each block
 * starts its non-blocking all-reduce (ZeRO-1: reduce-scatter) as soon as its gradients are
 * complete, and the step waits for them before the optimizer. Tied embeddings across stages
 * first sum the two copies' gradients (embed_allreduce), then reduce over dp: ZeRO-1's shards
 * of the embedding block and of the final block differ, so the sum must come first. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/internal.h"

#define EXEC_PI 3.14159265358979323846

/* ---- slots ---- */

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

/* A communication the executor makes that the op graph does not list. */
static int missing_op(const Exec *ex, const char *what, PxError *err)
{
    return px_fail(err, PX_ERUNTIME, "stage %d: the op graph has no %s: model/ and exec/ disagree",
                   ex->stage, what);
}

/* ---- the pipeline's transfers ---- */

static int tag_of(const Exec *ex, int g, int mb, int backward)
{
    return ((g * ex->d.m) + mb) * 2 + backward;
}

/* The receives of one pass over the schedule (forward only, or both), in order. */
static void plan_receives(Exec *ex, int backward)
{
    ex->n_recvs = 0;
    ex->next_recv = 0;
    for (int i = 0; i < ex->n_actions; i++) {
        const ModelAction *a = &ex->actions[i];
        const int g = ex->chunk_g[a->chunk];
        if (a->backward && !backward)
            continue;
        if ((!a->backward && g > 0) || (a->backward && g < ex->d.chunks - 1))
            ex->recvs[ex->n_recvs++] = *a;
    }
}

/* Posts the next expected receive into pp.recv (nothing when the step expects no more). */
static int post_receive(Exec *ex, PxError *err)
{
    if (ex->next_recv >= ex->n_recvs)
        return PX_OK;
    const ModelAction *a = &ex->recvs[ex->next_recv];
    const int g = ex->chunk_g[a->chunk];
    const int peer = a->backward ? ex->next_rank : ex->prev_rank;
    return comm_recv(ex->comm, ex->pp_recv, ex->pp_elems * ex->ab, peer,
                     tag_of(ex, g, a->mb, a->backward), MODEL_PP_RECV, &ex->recv_req, err);
}

/* Waits for the input of (chunk, mb, direction) and moves it into dst: the whole activation
 * (or gradient) of the region; with Megatron's scatter/gather each TP rank received 1/t of it
 * and the TP group all-gathers the pieces. Then posts the next expected receive. */
int exec_pp_take(Exec *ex, int chunk, int mb, int backward, void *dst, PxError *err)
{
    const ModelPhase ph = backward ? MODEL_BWD : MODEL_FWD;
    const ModelAction *a = ex->next_recv < ex->n_recvs ? &ex->recvs[ex->next_recv] : NULL;
    if (!a || a->chunk != chunk || a->mb != mb || a->backward != backward)
        return px_fail(err, PX_ERUNTIME,
                       "stage %d: the pipeline expected another transfer than chunk %d "
                       "micro-batch %d %s",
                       ex->stage, chunk, mb, backward ? "backward" : "forward");
    int op = exec_op_find(ex, chunk, ph, 0, "pp.pp_recv");
    if (op < 0)
        return missing_op(ex, "pp.pp_recv", err);
    exec_op_begin(ex, op);
    int rc = comm_wait(ex->comm, &ex->recv_req, err);
    exec_op_end(ex);
    if (rc)
        return rc;
    ex->next_recv++;
    if (ex->d.pp_split > 1) {
        op = exec_op_find(ex, chunk, ph, 0, "pp.tp_all_gather");
        if (op < 0)
            return missing_op(ex, "pp.tp_all_gather", err);
        exec_op_begin(ex, op);
        rc = comm_all_gather(ex->comm, dst, ex->pp_recv, ex->pp_elems, ex->act,
                             MODEL_TP_ALL_GATHER, NULL, err);
        exec_op_end(ex);
        if (rc)
            return rc;
    } else {
        ex->k->copy(dst, ex->pp_recv, ex->pp_elems * ex->ab);
    }
    return post_receive(ex, err);
}

/* Sends the output (forward) or input gradient (backward) of (chunk, mb) to the neighbouring
 * stage: this TP rank's 1/t of it with the scatter/gather split, else all of it. */
int exec_pp_give(Exec *ex, int chunk, int mb, int backward, const void *src, PxError *err)
{
    const ModelPhase ph = backward ? MODEL_BWD : MODEL_FWD;
    const int g = ex->chunk_g[chunk];
    int op = exec_op_find(ex, chunk, ph, 0, "pp.pp_send");
    if (op < 0)
        return missing_op(ex, "pp.pp_send", err);
    /* the pass is done: what follows, waiting for the send buffer, is the pipeline's idle */
    ex->pass_end = exec_now();
    exec_op_begin(ex, op);
    /* pp.send is one buffer: its previous message must have left */
    int rc = comm_wait(ex->comm, &ex->send_req, err);
    if (!rc) {
        const void *from =
            ex->d.pp_split > 1 ? EXEC_AT(src, (size_t)ex->tp_rank * ex->pp_elems, ex->ab) : src;
        ex->k->copy(ex->pp_send, from, ex->pp_elems * ex->ab);
        const int peer = backward ? ex->prev_rank : ex->next_rank;
        const int to = backward ? g - 1 : g + 1;
        rc = comm_send(ex->comm, ex->pp_send, ex->pp_elems * ex->ab, peer,
                       tag_of(ex, to, mb, backward), MODEL_PP_SEND, &ex->send_req, err);
    }
    exec_op_end(ex);
    return rc;
}

/* ---- gradient reduction by block ---- */

/* Sequence parallelism: the norms' replicated parameters saw only this rank's sequence shard,
 * so their gradients are summed over TP, one call per norm (a contiguous run of norm
 * parameters in the block) as the op graph lists them. grads: the block's gradient buffer. */
static int sp_norm_grads(Exec *ex, int b, float *grads, ModelPhase phase, PxError *err)
{
    const ExecBlock *blk = &ex->blocks[b];
    if (!ex->spec.layout.sp || ex->d.t < 2 || blk->n_params == 0)
        return PX_OK;
    int op = -1, rc = PX_OK;
    const int end = blk->first_param + blk->n_params;
    for (int i = blk->first_param; i < end && !rc;) {
        if (!ex->params[i].norm) {
            i++;
            continue;
        }
        int k = i;
        uint64_t n = 0;
        while (k < end && ex->params[k].norm && ex->params[k].off == ex->params[i].off + n)
            n += ex->params[k++].numel;
        if (op < 0) {
            op = exec_op_find(ex, blk->chunk, phase, 0, "%s.sp_grads.tp_allreduce",
                              ex->tt.blocks[b].name);
            if (op < 0)
                return missing_op(ex, "a block's sp_grads.tp_allreduce", err);
        }
        exec_op_begin(ex, op); /* one call per norm, as the graph counts them */
        rc = comm_allreduce(ex->comm, grads + ex->params[i].off, n, PX_FP32, COMM_SUM,
                            MODEL_TP_ALLREDUCE, NULL, err);
        exec_op_end(ex);
        i = k;
    }
    return rc;
}

/* Starts the data-parallel reduction of a block (ZeRO 0: all-reduce; 1: reduce-scatter into
 * this rank's shard), non-blocking; its op is timed here and again while the step waits. */
static int start_reduce(Exec *ex, int b, PxError *err)
{
    ExecBlock *blk = &ex->blocks[b];
    const int zero = ex->spec.layout.zero;
    int rc = sp_norm_grads(ex, b, blk->g, MODEL_STEP, err);
    blk->reduced = 1;
    if (rc || ex->zero_n < 2)
        return rc;
    const int kind = zero == 0 ? MODEL_DP_ALLREDUCE : MODEL_DP_REDUCE_SCATTER;
    blk->op_dp = exec_op_find(ex, blk->chunk, MODEL_STEP, 0, "%s.grads.%s", ex->tt.blocks[b].name,
                              model_comm_name((ModelComm)kind));
    if (blk->op_dp < 0)
        return missing_op(ex, "a block's gradient reduction", err);
    exec_op_begin(ex, blk->op_dp);
    if (zero == 0)
        rc = comm_allreduce(ex->comm, blk->g, blk->numel, PX_FP32, COMM_SUM, kind, &blk->dp_req,
                            err);
    else
        rc = comm_reduce_scatter_shard(ex->comm, blk->g, blk->numel, blk->shard, PX_FP32, kind,
                                       &blk->dp_req, err);
    exec_op_end(ex);
    return rc;
}

int exec_block_done(Exec *ex, int b, PxError *err)
{
    /* ZeRO-2/3 reduce every micro-batch (exec_bucket_reduce); a tied block waits for the sum
     * of the two copies at the end of the step */
    if (ex->spec.layout.zero >= 2 || ex->blocks[b].tied || ex->blocks[b].reduced)
        return PX_OK;
    int rc = start_reduce(ex, b, err);
    comm_progress(ex->comm);
    return rc;
}

/* The end of the backward: the tied embedding's two copies summed, every block's reduction
 * started and complete. */
static int finish_reductions(Exec *ex, PxError *err)
{
    int rc = PX_OK;
    for (int b = 0; b < ex->n_blocks && !rc; b++) {
        ExecBlock *blk = &ex->blocks[b];
        if (!blk->tied || ex->spec.layout.zero >= 2)
            continue;
        const char *pname = b == ex->embed_block ? "embed.wte" : "logits.w";
        const ExecParam *p = NULL;
        for (int i = blk->first_param; i < blk->first_param + blk->n_params; i++)
            if (!strcmp(ex->params[i].name, pname))
                p = &ex->params[i];
        int op = exec_op_find(ex, blk->chunk, MODEL_STEP, 0, "%s.grads.embed_allreduce",
                              ex->tt.blocks[b].name);
        if (!p || op < 0)
            return missing_op(ex, "the tied embedding's embed_allreduce", err);
        exec_op_begin(ex, op);
        rc = comm_allreduce(ex->comm, p->g, p->numel, PX_FP32, COMM_SUM, MODEL_EMBED_ALLREDUCE,
                            NULL, err);
        exec_op_end(ex);
    }
    for (int b = 0; b < ex->n_blocks && !rc; b++)
        if (ex->spec.layout.zero <= 1 && !ex->blocks[b].reduced)
            rc = start_reduce(ex, b, err);
    for (int b = 0; b < ex->n_blocks && !rc; b++) {
        ExecBlock *blk = &ex->blocks[b];
        if (blk->dp_req < 0)
            continue;
        exec_op_resume(ex, blk->op_dp);
        rc = comm_wait(ex->comm, &blk->dp_req, err);
        exec_op_end(ex);
    }
    return rc;
}

/* ---- ZeRO-2/3 ---- */

int exec_gather_block(Exec *ex, int b, ModelPhase phase, int occurrence, PxError *err)
{
    if (ex->spec.layout.zero != 3 || b < 0)
        return PX_OK;
    ExecBlock *blk = &ex->blocks[b];
    void *slot = ex->param_gather[ex->gather_next];
    ex->gather_next ^= 1;
    if (ex->zero_n > 1) {
        int op = exec_op_find(ex, blk->chunk, phase, occurrence, "%s.params.dp_all_gather",
                              ex->tt.blocks[b].name);
        if (op < 0)
            return missing_op(ex, "a block's parameter all-gather", err);
        exec_op_begin(ex, op);
        int rc = comm_all_gather(ex->comm, slot, blk->w_shard, blk->shard, ex->act,
                                 MODEL_DP_ALL_GATHER, NULL, err);
        exec_op_end(ex);
        if (rc)
            return rc;
    } else {
        ex->k->copy(slot, blk->w_shard, blk->numel * ex->ab);
    }
    for (int i = blk->first_param; i < blk->first_param + blk->n_params; i++) {
        ExecParam *p = &ex->params[i];
        p->w = EXEC_AT(slot, p->off, ex->ab);
        *p->wslot = p->w;
    }
    if (ex->tied_here && b == ex->embed_block)
        ex->out_w = ex->wte;
    return PX_OK;
}

void exec_bucket_zero(Exec *ex, int b)
{
    if (ex->spec.layout.zero < 2 || b < 0)
        return;
    const ExecBlock *blk = &ex->blocks[b];
    ex->k->memset0(ex->grad_bucket, (size_t)blk->shard * (size_t)ex->zero_n * sizeof(float));
}

/* The block's gradients of this micro-batch are in the bucket: summed over the group into
 * this rank's shard, which accumulates them over the micro-batches. */
int exec_bucket_reduce(Exec *ex, int b, PxError *err)
{
    if (ex->spec.layout.zero < 2 || b < 0)
        return PX_OK;
    ExecBlock *blk = &ex->blocks[b];
    int rc = sp_norm_grads(ex, b, ex->grad_bucket, MODEL_BWD, err);
    if (rc)
        return rc;
    if (ex->zero_n > 1) {
        int op = exec_op_find(ex, blk->chunk, MODEL_BWD, 0, "%s.grads.dp_reduce_scatter",
                              ex->tt.blocks[b].name);
        if (op < 0)
            return missing_op(ex, "a block's gradient reduce-scatter", err);
        exec_op_begin(ex, op);
        /* in place: this rank's summed shard lands at the start of the bucket */
        rc = comm_reduce_scatter(ex->comm, ex->grad_bucket, ex->grad_bucket, blk->shard,
                                 PX_FP32, MODEL_DP_REDUCE_SCATTER, NULL, err);
        if (!rc)
            ex->k->add_f32(blk->g_shard, ex->grad_bucket, blk->shard);
        exec_op_end(ex);
        return rc;
    }
    ex->k->add_f32(blk->g_shard, ex->grad_bucket, blk->numel);
    return PX_OK;
}

/* ---- the batches ---- */

static size_t batch_bytes(const Exec *ex)
{
    return (size_t)ex->d.m * ex->d.b * (size_t)(ex->d.s + 1) * sizeof(int32_t);
}

/* The step's batch on the device (data.batch[step % 2]): copied ahead during the previous step
 * (stage_next), or now. The loader fills host buffer step % 2; before it may refill the other
 * one, every copy from it must be over (copy_sync: they are, the previous step waited for it). */
static int batch_for_step(Exec *ex, int step, const int32_t **out, PxError *err)
{
    const int b = step % 2;
    const int32_t *host = NULL;
    ex->k->copy_sync();
    int rc = exec_loader_get(&ex->loader, step, &host, err);
    if (rc)
        return rc;
    if (ex->staged != step) {
        if (host != ex->batch[b]) /* else the loader wrote it in place (the CPU) */
            ex->k->to_device_async(ex->batch[b], host, batch_bytes(ex));
        if (ex->staged >= 0 && ex->staged % 2 == b)
            ex->staged = -1; /* its device buffer now holds this step */
    }
    ex->k->copy_wait();
    *out = ex->batch[b];
    return PX_OK;
}

/* Copies the batch of step `next` to the device ahead of its step, on the copy stream, when the
 * loader has it already; otherwise its step copies it (batch_for_step). */
static void stage_next(Exec *ex, int next)
{
    const int32_t *host = NULL;
    if (!ex->has_data || next >= ex->steps || ex->staged == next ||
        !exec_loader_ready(&ex->loader, next, &host) || host == ex->batch[next % 2])
        return;
    ex->k->to_device_async(ex->batch[next % 2], host, batch_bytes(ex));
    ex->staged = next;
}

/* ---- the schedule ---- */

/* Every micro-batch's forward (and backward) in the schedule's order; gradients are zeroed
 * first and accumulate over the micro-batches. */
static int run_schedule(Exec *ex, int step, int backward, PxError *err)
{
    const ModelDims *d = &ex->d;
    const int32_t *batch = NULL;
    int rc;
    if (ex->has_data && (rc = batch_for_step(ex, step, &batch, err)))
        return rc;
    ex->cur_step = step;
    ex->seq_base = (long long)step * ex->spec.job.global_batch + (long long)ex->dp_rank * d->m * d->b;
    ex->loss_sum = 0;
    if (backward) {
        if (ex->arena[MODEL_GRADS].base)
            ex->k->memset0(ex->arena[MODEL_GRADS].base, ex->arena[MODEL_GRADS].cap);
        for (int b = 0; b < ex->n_blocks; b++) {
            ex->blocks[b].reduced = 0;
            ex->blocks[b].dp_req = -1;
        }
    }
    for (int j = 0; j < d->v; j++)
        ex->bwd_done[j] = 0;
    plan_receives(ex, backward);
    if ((rc = post_receive(ex, err)))
        return rc;
    const size_t mb_tokens = (size_t)d->b * (size_t)(d->s + 1);
    /* the stages start the schedule together, so that the timeline has one origin and a
     * stage's wait for its first input is its bubble, not rank 0 printing the last step */
    if (d->p > 1 && (rc = comm_barrier(ex->comm, err)))
        return rc;
    ex->step_t0 = exec_now();
    for (int i = 0; i < ex->n_actions && !rc; i++) {
        const ModelAction *a = &ex->actions[i];
        const int j = a->chunk, slot_i = j * d->m + a->mb;
        const int32_t *tok = batch ? batch + (size_t)a->mb * mb_tokens : NULL;
        ExecEvent *ev = &ex->events[i];
        ex->pass_end = -1;
        ev->chunk = j;
        ev->mb = a->mb;
        ev->backward = a->backward;
        if (!backward) {
            if (a->backward)
                continue;
            /* forward only: one slot serves every micro-batch in turn */
            ex->live = 0;
            ex->xlive[j] = 0;
            ex->pass_start = exec_now();
            rc = exec_forward(ex, j, a->mb, 0, 0, tok, err);
        } else if (!a->backward) {
            int s = acquire(ex->slot_busy, ex->n_slots, &ex->live, &ex->peak_live);
            int x = ex->n_xslots[j] > 0
                        ? acquire(ex->xslot_busy[j], ex->n_xslots[j], &ex->xlive[j], &ex->peak_xlive[j])
                        : -1;
            if (s < 0 || (ex->n_xslots[j] > 0 && x < 0))
                return px_fail(err, PX_ERUNTIME,
                               "no free activation slot for micro-batch %d: the schedule holds more "
                               "sets than model_schedule_live counted",
                               a->mb);
            ex->mb_slot[slot_i] = s;
            ex->mb_xslot[slot_i] = x;
            ex->pass_start = exec_now();
            rc = exec_forward(ex, j, a->mb, s, x < 0 ? 0 : x, tok, err);
        } else {
            int last = ++ex->bwd_done[j] == d->m;
            ex->pass_start = exec_now();
            int x = ex->mb_xslot[slot_i];
            rc = exec_backward(ex, j, a->mb, ex->mb_slot[slot_i], x < 0 ? 0 : x, tok, last, err);
            release(ex->slot_busy, ex->mb_slot[slot_i], &ex->live);
            if (x >= 0)
                release(ex->xslot_busy[j], x, &ex->xlive[j]);
        }
        ev->start_s = ex->pass_start - ex->step_t0;
        ev->end_s = (ex->pass_end >= 0 ? ex->pass_end : exec_now()) - ex->step_t0;
    }
    /* the last message must have left before pp.send is written again */
    if (!rc && ex->send_req >= 0)
        rc = comm_wait(ex->comm, &ex->send_req, err);
    if (!rc && backward) {
        memcpy(ex->last_events, ex->events, (size_t)ex->n_actions * sizeof *ex->events);
        ex->have_events = 1;
        rc = finish_reductions(ex, err);
    }
    return rc;
}

/* The loss of the step from every rank's share (only the last stage's first TP rank of each
 * data-parallel replica contributes). */
static int global_loss(Exec *ex, double *loss, PxError *err)
{
    double v = ex->loss_sum;
    int rc = comm_control(ex->comm, &v, 1, COMM_SUM, err);
    *loss = v / ((double)ex->spec.job.global_batch * ex->d.s);
    return rc;
}

int exec_grads(Exec *ex, int step, double *loss, PxError *err)
{
    exec_ops_step_begin(ex);
    int rc = run_schedule(ex, step, 1, err);
    if (!rc)
        rc = global_loss(ex, loss, err);
    exec_ops_step_end(ex, 0);
    return rc;
}

int exec_loss(Exec *ex, int step, double *loss, PxError *err)
{
    exec_ops_step_begin(ex);
    int rc = run_schedule(ex, step, 0, err);
    if (!rc)
        rc = global_loss(ex, loss, err);
    exec_ops_step_end(ex, 0);
    return rc;
}

/* Linear warm-up over warmup_steps, then cosine decay to min_lr at the last step. */
static double lr_at(const ModelJob *j, int step, int steps)
{
    if (j->warmup_steps > 0 && step < j->warmup_steps)
        return j->lr * (double)(step + 1) / j->warmup_steps;
    int decay = steps - j->warmup_steps;
    if (decay <= 1)
        return j->lr;
    double progress = (double)(step - j->warmup_steps) / (double)(decay - 1);
    if (progress > 1.0)
        progress = 1.0;
    return j->min_lr + 0.5 * (j->lr - j->min_lr) * (1.0 + cos(EXEC_PI * progress));
}

/* The part of parameter p this rank updates: [*lo, *hi) in its block's offsets. */
static int own_range(const Exec *ex, const ExecParam *p, uint64_t *lo, uint64_t *hi)
{
    const ExecBlock *blk = &ex->blocks[p->block];
    uint64_t a = p->off > blk->own_off ? p->off : blk->own_off;
    uint64_t b = p->off + p->numel;
    if (b > blk->own_off + blk->own_n)
        b = blk->own_off + blk->own_n;
    *lo = a;
    *hi = b;
    return b > a;
}

/* The reduced gradient of block offsets [lo, hi) of p's block. */
static const float *grad_at(const Exec *ex, const ExecParam *p, uint64_t lo)
{
    const ExecBlock *blk = &ex->blocks[p->block];
    if (ex->spec.layout.zero >= 2)
        return blk->g_shard + (lo - blk->own_off);
    return blk->g + lo; /* ZeRO-1's reduce-scatter left the shard in place */
}

/* This rank's share of the global gradient norm: every element once in the job. TP-replicated
 * parameters count on TP rank 0, data-parallel replicas (ZeRO 0) on ZeRO rank 0, ZeRO shards
 * on their owner, the tied output layer's copy on the first stage only. */
static double local_sumsq(const Exec *ex)
{
    double s = 0;
    const int zero = ex->spec.layout.zero;
    if (zero == 0 && ex->zero_rank != 0)
        return 0;
    /* one call per contiguous run of counted gradients (sumsq waits for the device) */
    const float *run = NULL;
    uint64_t run_n = 0;
    for (int i = 0; i < ex->n_params; i++) {
        const ExecParam *p = &ex->params[i];
        uint64_t lo, hi;
        if ((p->replicated && ex->tp_rank != 0) || p->tied_copy || !own_range(ex, p, &lo, &hi))
            continue;
        const float *g = grad_at(ex, p, lo);
        if (run && g == run + run_n) {
            run_n += hi - lo;
            continue;
        }
        if (run)
            s += ex->k->sumsq(run, run_n);
        run = g;
        run_n = hi - lo;
    }
    if (run)
        s += ex->k->sumsq(run, run_n);
    return s;
}

/* PARALLAX_TEST_INF: an overflow in this step's gradients, as fp16 would make one (rank 0 owns
 * the first element of every block's gradients, whatever the ZeRO stage). */
static void inject_inf(Exec *ex, int step)
{
    if (step >= 64 || !(ex->inf_steps >> step & 1) || comm_rank(ex->comm) != 0 || ex->n_params == 0)
        return;
    const ExecParam *p = &ex->params[0];
    const float inf = INFINITY;
    ex->k->to_device((float *)grad_at(ex, p, p->off), &inf, sizeof inf);
}

static int optimizer_step(Exec *ex, int step, double *loss_out, double *lr_out, double *norm_out,
                          int *skipped, PxError *err)
{
    const ModelJob *j = &ex->spec.job;
    const KernBackend *k = ex->k;
    const int zero = ex->spec.layout.zero;
    *skipped = 0;
    exec_op_begin(ex, ex->other_op[EX_OPTIMIZER][0]);
    /* one control reduction for the step: the loss, the squared gradient norm, and whether
     * any rank was asked to stop (so that all stop at the same step boundary) */
    double v[3] = {ex->loss_sum, local_sumsq(ex), exec_stop_flag ? 1.0 : 0.0};
    if (step < 64 && (ex->nan_loss_steps >> step & 1) && comm_rank(ex->comm) == 0)
        v[0] = NAN; /* PARALLAX_TEST_NAN_LOSS */
    int rc = comm_control(ex->comm, v, 3, COMM_SUM, err);
    if (rc) {
        exec_op_end(ex);
        return rc;
    }
    *loss_out = v[0] / ((double)j->global_batch * ex->d.s);
    ex->stop_agreed = v[2] > 0;
    /* the norm of the scaled gradients: not finite on every rank alike when any rank's are not
     * (the sum went through the control reduction), so the verdict needs no other agreement */
    const double loss_scale = ex->scaler.scale;
    double norm = sqrt(v[1]);
    const int found_inf = !isfinite(norm);
    double lr = lr_at(j, step, ex->steps);
    *lr_out = lr;
    if (ex->scaler.enabled) {
        if (exec_scaler_update(&ex->scaler, found_inf)) {
            /* AMP: no update at all (AdamW's step count does not advance), a smaller scale */
            exec_op_end(ex);
            *norm_out = norm;
            *skipped = 1;
            if (ex->scaler.scale < 0x1p-24) {
                ex->collective_error = 1;
                return px_fail(err, PX_ERUNTIME,
                               "step %d: the fp16 loss scale fell to %g after %ld skipped steps: "
                               "training diverged (lower training.lr)",
                               step + 1, ex->scaler.scale, ex->scaler.skipped);
            }
            return PX_OK;
        }
        norm /= loss_scale;
    }
    *norm_out = norm;
    /* Not finite without a loss scaler: the run stops here, before the update and so before
     * the end of the step (where run.c would write a checkpoint). The control reduction summed
     * both over every rank, so every rank stops at this step alike. fp16 returned above when
     * its gradients overflowed (the scaler's verdict, as PyTorch's GradScaler's); a loss that is
     * not finite beside finite gradients stops it here too. */
    if (found_inf || !isfinite(*loss_out)) {
        exec_op_end(ex);
        ex->collective_error = 1;
        ex->stopped_step = step + 1;
        if (found_inf)
            return px_fail(err, PX_ERUNTIME,
                           "step %d: the gradient norm is %g: training diverged (a gradient is not "
                           "finite; loss %g); stopped before the update (lower training.lr)",
                           step + 1, norm, *loss_out);
        return px_fail(err, PX_ERUNTIME,
                       "step %d: the loss is %g: training diverged (the loss is not finite; "
                       "gradient norm %g); stopped before the update (lower training.lr)",
                       step + 1, *loss_out, norm);
    }
    /* the clip factor and the loss scale's removal, in one multiplication of each gradient */
    const double clip = j->grad_clip > 0 && norm > j->grad_clip ? j->grad_clip / norm : 1.0;
    const float scale = (float)(clip / loss_scale);
    const int t = ++ex->opt_steps;
    for (int i = 0; i < ex->n_params; i++) {
        const ExecParam *p = &ex->params[i];
        const ExecBlock *blk = &ex->blocks[p->block];
        uint64_t lo, hi;
        if (!own_range(ex, p, &lo, &hi))
            continue;
        const uint64_t n = hi - lo, st = zero == 0 ? lo : lo - blk->own_off;
        void *w = zero == 3 ? EXEC_AT(blk->w_shard, lo - blk->own_off, ex->ab)
                            : EXEC_AT(blk->w, lo, ex->ab);
        /* mixed precision: the update runs on the fp32 master, which refreshes the act copy */
        void *param = blk->master ? w : NULL;
        float *master = blk->master ? blk->master + st : (float *)w;
        const float *g = grad_at(ex, p, lo);
        float wd = p->decay ? (float)j->weight_decay : 0.0f;
        if (j->optimizer == MODEL_OPT_ADAMW)
            k->adamw(param, master, g, blk->m + st, blk->v + st, n, (float)lr, (float)j->beta1,
                     (float)j->beta2, (float)j->adam_eps, wd, t, scale);
        else
            k->sgd_momentum(param, master, g, blk->m + st, n, (float)lr, (float)j->momentum, wd,
                            scale);
    }
    exec_op_end(ex);
    /* ZeRO-1/2: every rank updated its shard of the full weights; gather the others' */
    for (int b = 0; b < ex->n_blocks && !rc && (zero == 1 || zero == 2) && ex->zero_n > 1; b++) {
        ExecBlock *blk = &ex->blocks[b];
        int op = exec_op_find(ex, blk->chunk, MODEL_STEP, 0, "%s.params.dp_all_gather",
                              ex->tt.blocks[b].name);
        if (op < 0)
            return missing_op(ex, "a block's parameter all-gather", err);
        exec_op_begin(ex, op);
        rc = comm_all_gather_shard(ex->comm, blk->w, blk->numel, blk->shard, ex->act,
                                   MODEL_DP_ALL_GATHER, NULL, err);
        exec_op_end(ex);
    }
    return rc;
}

/* ---- failures on purpose (docs/executor.md, "Failures") ----
 * --fail-rank/--fail-step: the rank dies as a lost node does, without a word to the others
 * (SIGKILL: no handler, no MPI_Abort), after one line that names it. PARALLAX_TEST_HANG: the
 * rank stalls for good (signals included), so that only the others' timeout can end the job. */
static void lose_rank(const Exec *ex, int step)
{
    const int rank = comm_rank(ex->comm);
    if (ex->opt.fail_step == step + 1 && ex->opt.fail_rank == rank) {
        fprintf(stderr, "parallax-worker: rank %d: step %d: killed on purpose (--fail-rank %d "
                        "--fail-step %d), as a lost node\n", rank, step + 1, rank, step + 1);
        fflush(stderr);
        raise(SIGKILL);
    }
    if (step == ex->hang_step) {
        fprintf(stderr, "parallax-worker: rank %d: step %d: stalling for good as "
                        "PARALLAX_TEST_HANG asks\n", rank, step + 1);
        fflush(stderr);
        for (;;)
            pause();
    }
}

int exec_step(Exec *ex, int step, ExecStepStats *st, PxError *err)
{
    double t0 = exec_now();
    comm_set_step(ex->comm, step + 1); /* for the communication timeout's message */
    lose_rank(ex, step);
    if (step == ex->fail_step)
        return px_fail(err, PX_ERUNTIME, "failing at step %d as PARALLAX_TEST_FAIL asks", step + 1);
    exec_ops_step_begin(ex);
    for (int k = 0; k < MODEL_COMM_COUNT; k++)
        ex->bytes_at_step[k] = comm_bytes(ex->comm, k);
    double loss = 0, lr = 0, norm = 0;
    const double loss_scale = ex->scaler.scale;
    int skipped = 0;
    int rc = run_schedule(ex, step, 1, err);
    if (!rc) {
        inject_inf(ex, step);
        stage_next(ex, step + 1);
        rc = optimizer_step(ex, step, &loss, &lr, &norm, &skipped, err);
    }
    ex->k->sync();
    exec_sample_device_memory(ex);
    double dt = exec_now() - t0;
    const int timed = ex->steps_done > 0 || ex->steps == 1;
    exec_ops_step_end(ex, timed);
    if (timed && !rc) {
        /* every timed step's bubble: one step of a few milliseconds is at the mercy of the
         * scheduler, their median is not */
        double busy, idle;
        exec_bubble_of_step(ex, &busy, &idle);
        if (busy > 0 && ex->n_bubbles < ex->steps)
            ex->step_bubble[ex->n_bubbles++] = idle / busy;
    }
    for (int k = 0; k < MODEL_COMM_COUNT; k++)
        ex->step_bytes[k] = comm_bytes(ex->comm, k) - ex->bytes_at_step[k];
    if (rc)
        return rc;
    memset(st, 0, sizeof *st);
    st->step = step + 1;
    st->loss = loss;
    st->lr = lr;
    st->grad_norm = norm;
    st->time_s = dt;
    st->tokens_per_s = dt > 0 ? (double)ex->spec.job.global_batch * ex->d.s / dt : 0;
    st->skipped = skipped;
    st->loss_scale = loss_scale;
    if (ex->steps_done < ex->steps) {
        ex->step_skipped[ex->steps_done] = skipped;
        ex->step_scale[ex->steps_done] = loss_scale;
        ex->step_loss[ex->steps_done] = loss;
        ex->step_time[ex->steps_done] = dt;
        ex->step_tps[ex->steps_done] = st->tokens_per_s;
        ex->steps_done++;
    }
    return PX_OK;
}
