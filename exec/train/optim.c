/* The update at the end of a step: one control reduction that gives every rank the step's
 * loss, the global gradient norm and whether any rank was asked to stop; fp16's loss scaler
 * (a step whose gradients overflowed is skipped); the global-norm clip; AdamW, SGD with
 * momentum or 8-bit Adam on this rank's shard (the fp32 master when the weights are 16-bit,
 * reading fp32 or 16-bit gradients: training.grad_dtype);
 * and ZeRO-1/2's gather of the updated weights. The learning rate warms up linearly, then
 * decays as a cosine. */
#include <math.h>
#include <stdlib.h>

#include "exec/train/internal.h"

#define EXEC_PI 3.14159265358979323846

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

float *exec_optim_grad_at(const ExecCtx *c, const ExecParams *P, const ExecParam *p, uint64_t lo)
{
    const ExecBlock *blk = &P->b[p->block];
    if (c->spec.layout.zero >= 2)
        return EXEC_AT(blk->g_shard, lo - blk->own_off, c->gb);
    return EXEC_AT(blk->g, lo, c->gb); /* ZeRO-1's reduce-scatter left the shard in place */
}

/* This rank's share of the global gradient norm (every element once in the job). */
static double local_sumsq(const ExecCtx *c, const ExecParams *P)
{
    double s = 0;
    const int zero = c->spec.layout.zero;
    /* every element once in the job: TP-replicated parameters count on TP rank 0, data-parallel
     * replicas (ZeRO 0) on ZeRO rank 0, ZeRO shards on their owner of HSDP's first replica, the
     * tied output layer's copy on the first stage only */
    /* a MoE layer's routed experts are this rank's (ep) and replicated over the
     * expert-data-parallel ranks: counted on its first (etp 1), or on each shard's owner with
     * ZeRO */
    /* one call per contiguous run of counted gradients (sumsq waits for the device) */
    const float *run = NULL;
    uint64_t run_n = 0;
    for (int i = 0; i < P->n; i++) {
        const ExecParam *p = &P->p[i];
        uint64_t lo, hi;
        if (P->b[p->block].experts) {
            /* an expert's fc2 bias is whole on each of its etp ranks: counted on the first */
            if ((zero == 0 && c->g.edp_rank != 0) || (p->replicated && c->g.etp_rank != 0) ||
                !exec_params_own(P, p, &lo, &hi))
                continue;
        } else if ((zero == 0 && c->g.zero_rank != 0) || c->g.dp_replica != 0 ||
                   (p->replicated && c->g.tp_rank != 0) ||
                   p->tied_copy || !exec_params_own(P, p, &lo, &hi)) {
            continue;
        }
        const float *g = exec_optim_grad_at(c, P, p, lo);
        if (run && (const void *)g == EXEC_AT(run, run_n, c->gb)) {
            run_n += hi - lo;
            continue;
        }
        if (run)
            s += c->k->grad_sumsq(run, run_n);
        run = g;
        run_n = hi - lo;
    }
    if (run)
        s += c->k->grad_sumsq(run, run_n);
    return s;
}

/* ---- adam-8bit: block-wise quantized state (Dettmers et al. 2022) ---- */

/* One call of the kernels' 8-bit step (KernAdam8) being gathered: the segments of one
 * parameter block's state that this rank updates (its parameters, neighbours with the same
 * weight decay merged), with the pointers of the first. The kernels decode each quantization
 * block a segment touches, update it and code it back, so each block must reach one call a
 * step: a call is run when the next segment belongs to another parameter block, and when it
 * is full, up to the quantization block the next segment starts in (the rest carried over). */
typedef struct ExecAdam8 {
    KernAdam8 a, now; /* the call gathered; the part of it run early (adam8_run) */
    const ExecBlock *blk;
    void *param;   /* the act weights (or NULL) at a.begin[0] */
    float *master; /* the fp32 master (or fp32 weights) at a.begin[0] */
    const void *g; /* the gradients at a.begin[0] */
    int host;      /* in host memory (optimizer offload), else the backend's */
} Adam8;

static void adam8_call(const ExecCtx *c, const Adam8 *A, const KernAdam8 *a)
{
    const ExecBlock *blk = A->blk;
    if (A->host)
        kern_host_adam8(A->param, A->master, A->g, c->grad, blk->m8, blk->v8, blk->absmax, a);
    else
        c->k->adam8(A->param, A->master, A->g, blk->m8, blk->v8, blk->absmax, a);
}

/* Runs the gathered segments' elements below state element cut, and keeps the rest for the
 * next call (cut 0: all of them run). */
static void adam8_run(const ExecCtx *c, Adam8 *A, uint64_t cut)
{
    KernAdam8 *a = &A->a;
    if (a->n == 0)
        return;
    if (cut == 0 || cut >= a->end[a->n - 1]) {
        adam8_call(c, A, a);
        a->n = 0;
        return;
    }
    /* the part below cut runs now, the part above is the next call's */
    KernAdam8 *now = &A->now;
    *now = *a;
    int k = 0, n = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->begin[i] < cut) {
            now->end[k] = a->end[i] < cut ? a->end[i] : cut;
            k++;
        }
        if (a->end[i] > cut) {
            a->begin[n] = a->begin[i] > cut ? a->begin[i] : cut;
            a->end[n] = a->end[i];
            a->weight_decay[n] = a->weight_decay[i];
            n++;
        }
    }
    now->n = k;
    adam8_call(c, A, now);
    const uint64_t moved = a->begin[0] - now->begin[0];
    a->n = n;
    A->param = A->param ? EXEC_AT(A->param, moved, c->ab) : NULL;
    A->master += moved;
    A->g = EXEC_AT(A->g, moved, c->gb);
}

/* Adds state elements [st, st + n) of blk (param, master, g: their first) with weight decay
 * wd to the call, running what must run first. */
static void adam8_add(const ExecCtx *c, Adam8 *A, const ExecBlock *blk, void *param,
                      float *master, const void *g, uint64_t st, uint64_t n, float wd)
{
    KernAdam8 *a = &A->a;
    if (a->n && A->blk != blk)
        adam8_run(c, A, 0);
    if (a->n && a->end[a->n - 1] == st && a->weight_decay[a->n - 1] == wd) {
        a->end[a->n - 1] = st + n;
        return;
    }
    if (a->n == KERN_ADAM8_SEGMENTS)
        adam8_run(c, A, st / MODEL_ADAM8_BLOCK * MODEL_ADAM8_BLOCK);
    if (a->n == 0) {
        A->blk = blk;
        A->param = param;
        A->master = master;
        A->g = g;
        a->state_n = c->spec.layout.zero >= 1 ? blk->shard : blk->numel;
    }
    a->begin[a->n] = st;
    a->end[a->n] = st + n;
    a->weight_decay[a->n] = wd;
    a->n++;
}

/* AdamW on n elements, by the backend in its memory (param: the act copy to refresh, or
 * NULL), or on the host (optimizer offload: the gradients in the run's gradient dtype, no act
 * copy; the same arithmetic). */
static void adamw_on(const ExecCtx *c, int host, void *param, float *master, const void *g,
                     float *m, float *v, uint64_t n, double lr, float wd, int t, float scale)
{
    const ModelJob *j = &c->spec.job;
    const float b1 = (float)j->beta1, b2 = (float)j->beta2, eps = (float)j->adam_eps;
    if (host)
        kern_host_adamw(master, g, c->grad, m, v, n, (float)lr, b1, b2, eps, wd, t, scale);
    else
        c->k->adamw(param, master, g, m, v, n, (float)lr, b1, b2, eps, wd, t, scale);
}

/* The optimizer's step on n elements of one parameter: its fp32 master (or the weights
 * themselves), their gradient (in the gradient dtype) and state m, v (st: the elements' place
 * in its block's state); param, when not NULL, gets the updated weights in the activation
 * dtype. host: the step runs in host memory (optimizer offload). adam-8bit runs AdamW on its
 * state dequantized, quantization block by block (A). */
static void step_range(const ExecCtx *c, const ExecParam *p, void *param, float *master,
                       const void *g, const ExecBlock *blk, uint64_t st, uint64_t n, double lr,
                       int t, float scale, Adam8 *A, int host)
{
    const ModelJob *j = &c->spec.job;
    const float wd = p->decay ? (float)j->weight_decay : 0.0f;
    if (j->optimizer == MODEL_OPT_ADAMW) {
        adamw_on(c, host, param, master, g, blk->m + st, blk->v + st, n, lr, wd, t, scale);
    } else if (j->optimizer == MODEL_OPT_SGD_MOMENTUM) {
        if (host)
            kern_host_sgd_momentum(master, g, c->grad, blk->m + st, n, (float)lr,
                                   (float)j->momentum, wd, scale);
        else
            c->k->sgd_momentum(param, master, g, blk->m + st, n, (float)lr, (float)j->momentum,
                               wd, scale);
    } else {
        A->a.lr = (float)lr; /* the step's, for every call it gathers */
        A->a.t = t;
        A->a.grad_scale = scale;
        adam8_add(c, A, blk, param, master, g, st, n, wd);
    }
}

/* adam-8bit on a block that holds FP8 parameters below ZeRO-3: one call spans the block's
 * parameters with a single act pointer, but only its other parameters have act weights, each
 * a tensor of its own (params.c), so the calls refresh none and each of those parameters' act
 * weights is cast from its updated master here (the rounding the kernels' refresh does), before
 * exec_pg_updated gathers them. */
static void adam8_fp8_block_acts(const ExecCtx *c, const ExecParams *P)
{
    for (int i = 0; i < P->n; i++) {
        const ExecParam *p = &P->p[i];
        const ExecBlock *blk = &P->b[p->block];
        uint64_t lo, hi;
        if (!blk->fp8 || p->fp8 || !p->w || !blk->master || !exec_params_own(P, p, &lo, &hi))
            continue;
        const uint64_t st = c->spec.layout.zero == 0 ? lo : lo - blk->own_off;
        c->k->cast_to_act(EXEC_AT(p->w, lo - p->off, c->ab), blk->master + st, (size_t)(hi - lo));
    }
}

/* AdamW or SGD on this rank's part of every parameter, the clip and the loss scale's removal
 * folded into one multiplication of each gradient. */
static void update(ExecOptim *O, const ExecCtx *c, ExecParams *P, double lr, float scale,
                   Adam8 *A)
{
    const int zero = c->spec.layout.zero;
    const int t = ++O->opt_steps;
    for (int i = 0; i < P->n; i++) {
        const ExecParam *p = &P->p[i];
        const ExecBlock *blk = &P->b[p->block];
        uint64_t lo, hi;
        if (!exec_params_own(P, p, &lo, &hi))
            continue;
        const uint64_t n = hi - lo, st = zero == 0 ? lo : lo - blk->own_off;
        /* an FP8 parameter has no act weights: fp8gather.c quantizes its updated master */
        void *w = zero == 3 ? EXEC_AT(blk->w_shard, lo - blk->own_off, c->ab)
                  : p->fp8  ? NULL
                            : EXEC_AT(p->w, lo - p->off, c->ab);
        /* mixed precision: the update runs on the fp32 master, which refreshes the act copy
         * (adam-8bit's on a block of FP8 parameters: adam8_fp8_block_acts) */
        void *param = blk->master && !(A && blk->fp8 && zero < 3) ? w : NULL;
        float *master = blk->master ? blk->master + st : (float *)w;
        step_range(c, p, param, master, exec_optim_grad_at(c, P, p, lo), blk, st, n, lr, t,
                   scale, A, 0);
    }
    if (A) {
        adam8_run(c, A, 0);
        adam8_fp8_block_acts(c, P);
    }
}

/* adam-8bit's call, with the codes' values and the job's constants; the largest number of
 * segments one quantization block takes must fit a call (48: a parameter block of tens of
 * parameters in 2048 values would need more). */
static int adam8_init(ExecOptim *O, const ExecCtx *c, const ExecParams *P, PxError *err)
{
    Adam8 *A = calloc(1, sizeof *A);
    if (!(O->adam8 = A))
        return px_fail(err, PX_ERUNTIME, "out of memory for adam-8bit's call");
    const ModelJob *j = &c->spec.job;
    A->host = c->spec.layout.offload_optimizer;
    kern_adam8_tables(A->a.codes);
    A->a.beta1 = (float)j->beta1;
    A->a.beta2 = (float)j->beta2;
    A->a.eps = (float)j->adam_eps;
    for (int b = 0; b < P->nb; b++) {
        uint64_t q = UINT64_MAX, end = 0;
        int n = 0, decay = -1;
        for (int i = P->b[b].first_param; i < P->b[b].first_param + P->b[b].n_params; i++) {
            const ExecParam *p = &P->p[i];
            uint64_t lo, hi;
            if (!exec_params_own(P, p, &lo, &hi))
                continue;
            const uint64_t st = c->spec.layout.zero == 0 ? lo : lo - P->b[b].own_off;
            if (st == end && p->decay == decay && n > 0) { /* merged with the one before */
                end = st + (hi - lo);
                continue;
            }
            n = st / MODEL_ADAM8_BLOCK == q ? n + 1 : 1;
            if (n > KERN_ADAM8_SEGMENTS)
                return px_fail(err, PX_EINPUT,
                               "training.optimizer adam-8bit: parameter block %d has more than %d "
                               "parameters in one quantization block of %d values",
                               b, KERN_ADAM8_SEGMENTS, MODEL_ADAM8_BLOCK);
            end = st + (hi - lo);
            decay = p->decay;
            q = (end - 1) / MODEL_ADAM8_BLOCK;
            if (q != st / MODEL_ADAM8_BLOCK)
                n = 1;
        }
    }
    return PX_OK;
}

int exec_optim_offload_init(ExecOptim *O, const ExecCtx *c, const ExecParams *P, PxError *err)
{
    int rc;
    if (c->spec.job.optimizer == MODEL_OPT_ADAM_8BIT && (rc = adam8_init(O, c, P, err)))
        return rc;
    if (!c->spec.layout.offload_optimizer)
        return PX_OK;
    if (!(O->host_off = calloc((size_t)P->nb + 1, sizeof *O->host_off)))
        return px_fail(err, PX_ERUNTIME, "out of memory for the offloaded optimizer");
    for (int b = 0; b < P->nb; b++)
        O->host_off[b + 1] = O->host_off[b] + P->b[b].shard;
    O->host_elems = O->host_off[P->nb];
    /* one gradient shard per block in the gradient dtype (docs/memory.md), which also stages
     * the updated weights back to the device (the act dtype is no wider); without a master
     * table (fp32 weights: the CPU) the fp32 weights the host step updates, a copy of their own */
    const size_t elems = O->host_elems ? (size_t)O->host_elems : 1;
    O->host_g = calloc(elems, c->gb);
    if (!c->d.master)
        O->host_w = calloc(elems, sizeof(float));
    if (!O->host_g || (!c->d.master && !O->host_w))
        return px_fail(err, PX_ERUNTIME, "out of memory for the offloaded optimizer: %.3f GiB",
                       (double)O->host_elems * (double)(c->gb + sizeof(float)) / PX_GIB);
    return PX_OK;
}

void exec_optim_offload_free(ExecOptim *O)
{
    free(O->adam8);
    free(O->host_g);
    free(O->host_w);
    free(O->host_off);
    O->adam8 = NULL;
    O->host_g = NULL;
    O->host_w = NULL;
    O->host_off = NULL;
}

/* This rank's weight shard of block b on the device: ZeRO-3's w_shard, else its slice of w. */
static void *device_w_shard(const ExecCtx *c, const ExecBlock *blk)
{
    return c->spec.layout.zero == 3 ? blk->w_shard : EXEC_AT(blk->w, blk->own_off, c->ab);
}

void exec_optim_offload_round(const ExecOptim *O, const ExecCtx *c, const ExecParams *P)
{
    for (int b = 0; b < P->nb && !O->host_w; b++)
        if (P->b[b].own_n)
            kern_host_round(EXEC_AT(O->host_g, O->host_off[b], c->gb), c->act, P->b[b].master,
                            P->b[b].own_n);
}

/* A block holding FP8 parameters (--fp8-param-gather below ZeRO-3) has no act weights of
 * their own (blk->w NULL): its other parameters' pieces of the updated shard w (act values,
 * packed from the shard's first element) go into their weights, the FP8 parameters' stay on
 * the host, where fp8gather.c's exec_pg_updated takes them (G->up) into their gradients' place
 * to quantize them on the device. The bytes up are the shard's act bytes either way. */
static void fp8_block_up(const ExecCtx *c, const ExecParams *P, const ExecBlock *blk,
                         const void *w)
{
    for (int i = blk->first_param; i < blk->first_param + blk->n_params; i++) {
        const ExecParam *p = &P->p[i];
        uint64_t lo, hi;
        if (p->fp8 || !exec_params_own(P, p, &lo, &hi))
            continue;
        c->k->to_device(EXEC_AT(p->w, lo - p->off, c->ab), EXEC_AT(w, lo - blk->own_off, c->ab),
                        (size_t)(hi - lo) * c->ab);
    }
}

/* ZeRO-Offload's step (Ren et al. 2021): each block's reduced gradient shard copied device ->
 * host (in the gradient dtype), AdamW, SGD or 8-bit Adam over the host's master and optimizer
 * state (bind.c put those arenas in host memory; fp32 weights, which have no master, are
 * updated in a host copy of the shard), the updated master rounded to the weights' dtype on the
 * host (to nearest even, as the device's update kernels round) and copied host -> device into
 * the rank's weight shard (where ZeRO-1/2 then gather it as usual). The host's arithmetic is the
 * device kernels' (kern_host_adamw), so the weights are those the step would give on the
 * device. */
static void update_offloaded(ExecOptim *O, const ExecCtx *c, ExecParams *P, double lr, float scale,
                             Adam8 *A)
{
    const KernBackend *k = c->k;
    double t0 = px_now_s();
    for (int b = 0; b < P->nb; b++) {
        const ExecBlock *blk = &P->b[b];
        if (blk->own_n == 0)
            continue;
        const void *g = c->spec.layout.zero >= 2 ? (const void *)blk->g_shard
                                                 : EXEC_AT(blk->g, blk->own_off, c->gb);
        k->to_host(EXEC_AT(O->host_g, O->host_off[b], c->gb), g, blk->own_n * c->gb);
        /* the weights once (after initialization or a resumed checkpoint): the host's copy is
         * the one the steps update from then on */
        if (O->host_w && !O->host_w_ready)
            k->to_host(O->host_w + O->host_off[b], device_w_shard(c, blk), blk->own_n * c->ab);
    }
    O->host_w_ready = 1;
    double t1 = px_now_s();
    O->d2h_s += t1 - t0;
    const int t = ++O->opt_steps;
    for (int i = 0; i < P->n; i++) {
        const ExecParam *p = &P->p[i];
        const ExecBlock *blk = &P->b[p->block];
        uint64_t lo, hi;
        if (!exec_params_own(P, p, &lo, &hi))
            continue;
        const uint64_t n = hi - lo, st = lo - blk->own_off, h = O->host_off[p->block] + st;
        float *master = O->host_w ? O->host_w + h : blk->master + st;
        step_range(c, p, NULL, master, EXEC_AT(O->host_g, h, c->gb), blk, st, n, lr, t, scale,
                   A, 1);
    }
    if (A)
        adam8_run(c, A, 0);
    exec_optim_offload_round(O, c, P);
    double t2 = px_now_s();
    O->host_step_s += t2 - t1;
    for (int b = 0; b < P->nb; b++) {
        const ExecBlock *blk = &P->b[b];
        const void *w = O->host_w ? (const void *)(O->host_w + O->host_off[b])
                                  : EXEC_AT(O->host_g, O->host_off[b], c->gb);
        if (blk->own_n && blk->fp8)
            fp8_block_up(c, P, blk, w);
        else if (blk->own_n)
            k->to_device(device_w_shard(c, blk), w, blk->own_n * c->ab);
    }
    O->h2d_s += px_now_s() - t2;
    O->host_steps++;
}

int exec_optim_step(ExecOptim *O, const ExecCtx *c, ExecParams *P, ExecMeter *M, int step,
                    double loss_sum, double mtp_loss_sum, int nan_loss, int stop, ExecUpdate *u,
                    PxError *err)
{
    const ModelJob *j = &c->spec.job;
    u->skipped = 0;
    /* one control reduction for the step: the loss, the squared gradient norm, and whether
     * any rank was asked to stop (so that all stop at the same step boundary), and the
     * prediction modules' loss */
    double v[4] = {loss_sum, local_sumsq(c, P), stop ? 1.0 : 0.0, mtp_loss_sum};
    if (nan_loss)
        v[0] = NAN;
    int rc = comm_control(c->comm, v, 4, COMM_SUM, err);
    if (rc)
        return rc;
    u->loss = v[0] / ((double)j->global_batch * c->d.s);
    u->mtp_loss = v[3] / ((double)j->global_batch * c->d.s);
    O->stop_agreed = v[2] > 0;
    /* the norm of the scaled gradients: not finite on every rank alike when any rank's are not
     * (the sum went through the control reduction), so the verdict needs no other agreement */
    const double loss_scale = O->scaler.scale;
    double norm = sqrt(v[1]);
    const int found_inf = !isfinite(norm);
    u->lr = lr_at(j, step, c->steps);
    if (O->scaler.enabled) {
        if (exec_scaler_update(&O->scaler, found_inf)) {
            /* AMP: no update at all (AdamW's step count does not advance), a smaller scale */
            u->norm = norm;
            u->skipped = 1;
            if (O->scaler.scale < 0x1p-24) {
                O->collective = 1;
                return px_fail(err, PX_ERUNTIME,
                               "step %d: the fp16 loss scale fell to %g after %ld skipped steps: "
                               "training diverged (lower training.lr)",
                               step + 1, O->scaler.scale, O->scaler.skipped);
            }
            return PX_OK;
        }
        norm /= loss_scale;
    }
    u->norm = norm;
    /* Not finite without a loss scaler: the run stops here, before the update and so before
     * the end of the step (where a checkpoint would be written). The control reduction summed
     * both over every rank, so every rank stops at this step alike. fp16 returned above when
     * its gradients overflowed (the scaler's verdict, as PyTorch's GradScaler's); a loss that is
     * not finite beside finite gradients stops it here too. */
    if (found_inf || !isfinite(u->loss)) {
        O->collective = 1;
        O->diverged_at = step + 1;
        if (found_inf)
            return px_fail(err, PX_ERUNTIME,
                           "step %d: the gradient norm is %g: training diverged (a gradient is not "
                           "finite; loss %g); stopped before the update (lower training.lr)",
                           step + 1, norm, u->loss);
        return px_fail(err, PX_ERUNTIME,
                       "step %d: the loss is %g: training diverged (the loss is not finite; "
                       "gradient norm %g); stopped before the update (lower training.lr)",
                       step + 1, u->loss, norm);
    }
    const double clip = j->grad_clip > 0 && norm > j->grad_clip ? j->grad_clip / norm : 1.0;
    if (c->spec.layout.offload_optimizer)
        update_offloaded(O, c, P, u->lr, (float)(clip / loss_scale), O->adam8);
    else
        update(O, c, P, u->lr, (float)(clip / loss_scale), O->adam8);
    /* ZeRO-1/2: every rank updated its shard of the full weights; gather the others' */
    return exec_zero_gather_updated(c, P, M, err);
}
