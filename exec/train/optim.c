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

/* The 256 values a code stands for, ascending, as fractions of its block's absmax: dynamic
 * (exponent, fraction) codes after the paper's Sec. 2.2. A code's bits after the sign (m's
 * table only) are E zeros, a one, and F linear fraction bits: 10^-E x (0.1 + 0.9 (i + 1) / 2^F),
 * i < 2^F. m (signed): 7 bits, E 0..6, 127 magnitudes a sign and zero (the 256th a second
 * zero); v (non-negative): 8 bits, E 0..7, 255 magnitudes and zero. So the smallest nonzero
 * value is 1e-6 of m's absmax and 1e-7 of v's, and the precision is relative, as the states'
 * spread over orders of magnitude wants. */
static void adam8_table(float *t, int is_signed)
{
    const int bits = is_signed ? 7 : 8;
    float mag[255];
    int n = 0;
    for (int E = bits - 1; E >= 0; E--) { /* ascending: the smallest exponent first */
        const int F = bits - 1 - E;
        for (int i = 0; i < (1 << F); i++)
            mag[n++] = (float)(pow(10.0, -E) * (0.1 + 0.9 * (i + 1) / (double)(1 << F)));
    }
    int k = 0;
    if (is_signed) {
        for (int i = n - 1; i >= 0; i--)
            t[k++] = -mag[i];
        t[k++] = 0.0f;
    }
    t[k++] = 0.0f;
    for (int i = 0; i < n; i++)
        t[k++] = mag[i];
}

/* The code nearest x (a fraction of the absmax, in the table's range); positive v is never
 * rounded to zero (its square root divides the update). */
static uint8_t adam8_code(const float *t, float x, int keep_positive)
{
    int lo = 0, hi = 255;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (t[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    int q = x - t[lo] <= t[hi] - x ? lo : hi;
    if (keep_positive && x > 0.0f && t[q] == 0.0f)
        q = hi;
    return (uint8_t)q;
}

/* One quantization block of a parameter block's state, dequantized in fp32 while the
 * parameters that hold it update (the fp32 AdamW kernel on it), then quantized back against
 * its new absmax. */
typedef struct ExecAdam8 {
    float tm[256], tv[256];
    const ExecBlock *blk;
    uint64_t state_n, q; /* the block's state elements; the quantization block held */
    float m[MODEL_ADAM8_BLOCK], v[MODEL_ADAM8_BLOCK];
} Adam8;

static uint64_t adam8_len(const Adam8 *A)
{
    const uint64_t at = A->q * MODEL_ADAM8_BLOCK;
    return A->state_n - at < MODEL_ADAM8_BLOCK ? A->state_n - at : MODEL_ADAM8_BLOCK;
}

static void adam8_flush(Adam8 *A)
{
    if (!A->blk)
        return;
    const uint64_t n = adam8_len(A), nq = px_ceil_div(A->state_n, MODEL_ADAM8_BLOCK);
    float am = 0.0f, av = 0.0f;
    for (uint64_t i = 0; i < n; i++) {
        am = fabsf(A->m[i]) > am ? fabsf(A->m[i]) : am;
        av = A->v[i] > av ? A->v[i] : av;
    }
    uint8_t *m8 = A->blk->m8 + A->q * MODEL_ADAM8_BLOCK;
    uint8_t *v8 = A->blk->v8 + A->q * MODEL_ADAM8_BLOCK;
    for (uint64_t i = 0; i < n; i++) {
        m8[i] = adam8_code(A->tm, am > 0.0f ? A->m[i] / am : 0.0f, 0);
        v8[i] = adam8_code(A->tv, av > 0.0f ? A->v[i] / av : 0.0f, 1);
    }
    A->blk->absmax[A->q] = am;
    A->blk->absmax[nq + A->q] = av;
    A->blk = NULL;
}

/* Holds quantization block q of blk's state (the one held before written back first). */
static void adam8_hold(Adam8 *A, const ExecCtx *c, const ExecBlock *blk, uint64_t q)
{
    if (A->blk == blk && A->q == q)
        return;
    adam8_flush(A);
    A->blk = blk;
    A->q = q;
    A->state_n = c->spec.layout.zero >= 1 ? blk->shard : blk->numel;
    const uint64_t n = adam8_len(A), nq = px_ceil_div(A->state_n, MODEL_ADAM8_BLOCK);
    const float am = blk->absmax[q], av = blk->absmax[nq + q];
    const uint8_t *m8 = blk->m8 + q * MODEL_ADAM8_BLOCK, *v8 = blk->v8 + q * MODEL_ADAM8_BLOCK;
    for (uint64_t i = 0; i < n; i++) {
        A->m[i] = A->tm[m8[i]] * am;
        A->v[i] = A->tv[v8[i]] * av;
    }
}

/* The optimizer's step on n elements of one parameter: its fp32 master (or the weights
 * themselves), their gradient and state m, v (st: the elements' place in its block's state);
 * param, when not NULL, gets the updated weights in the activation dtype. adam-8bit runs AdamW
 * on its state dequantized, quantization block by block (A). */
static void step_range(const ExecCtx *c, const ExecParam *p, void *param, float *master,
                       const float *g, const ExecBlock *blk, uint64_t st, uint64_t n, double lr,
                       int t, float scale, Adam8 *A)
{
    const ModelJob *j = &c->spec.job;
    const float wd = p->decay ? (float)j->weight_decay : 0.0f;
    const float b1 = (float)j->beta1, b2 = (float)j->beta2, eps = (float)j->adam_eps;
    if (j->optimizer == MODEL_OPT_ADAMW) {
        c->k->adamw(param, master, g, blk->m + st, blk->v + st, n, (float)lr, b1, b2, eps, wd, t,
                    scale);
    } else if (j->optimizer == MODEL_OPT_SGD_MOMENTUM) {
        c->k->sgd_momentum(param, master, g, blk->m + st, n, (float)lr, (float)j->momentum, wd,
                           scale);
    } else {
        while (n > 0) {
            const uint64_t q = st / MODEL_ADAM8_BLOCK, off = st % MODEL_ADAM8_BLOCK;
            const uint64_t take = n < MODEL_ADAM8_BLOCK - off ? n : MODEL_ADAM8_BLOCK - off;
            adam8_hold(A, c, blk, q);
            c->k->adamw(param, master, g, A->m + off, A->v + off, take, (float)lr, b1, b2, eps,
                        wd, t, scale);
            param = param ? EXEC_AT(param, take, c->ab) : NULL;
            master += take;
            g += take;
            st += take;
            n -= take;
        }
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
        void *w = zero == 3 ? EXEC_AT(blk->w_shard, lo - blk->own_off, c->ab)
                            : EXEC_AT(blk->w, lo, c->ab);
        /* mixed precision: the update runs on the fp32 master, which refreshes the act copy */
        void *param = blk->master ? w : NULL;
        float *master = blk->master ? blk->master + st : (float *)w;
        step_range(c, p, param, master, exec_optim_grad_at(c, P, p, lo), blk, st, n, lr, t,
                   scale, A);
    }
    if (A)
        adam8_flush(A);
}

int exec_optim_offload_init(ExecOptim *O, const ExecCtx *c, const ExecParams *P, PxError *err)
{
    if (c->spec.job.optimizer == MODEL_OPT_ADAM_8BIT) {
        if (!(O->adam8 = calloc(1, sizeof *O->adam8)))
            return px_fail(err, PX_ERUNTIME, "out of memory for adam-8bit's scratch");
        adam8_table(O->adam8->tm, 1);
        adam8_table(O->adam8->tv, 0);
    }
    if (!c->spec.layout.offload_optimizer)
        return PX_OK;
    if (!(O->host_off = calloc((size_t)P->nb + 1, sizeof *O->host_off)))
        return px_fail(err, PX_ERUNTIME, "out of memory for the offloaded optimizer");
    for (int b = 0; b < P->nb; b++)
        O->host_off[b + 1] = O->host_off[b] + P->b[b].shard;
    O->host_elems = O->host_off[P->nb];
    /* one gradient shard per block (docs/memory.md), and the fp32 weights the host step
     * updates: the CPU trains fp32 weights, which have no master copy of their own */
    O->host_g = calloc(O->host_elems ? O->host_elems : 1, sizeof(float));
    O->host_w = calloc(O->host_elems ? O->host_elems : 1, sizeof(float));
    if (!O->host_g || !O->host_w)
        return px_fail(err, PX_ERUNTIME, "out of memory for the offloaded optimizer: %.3f GiB",
                       2.0 * (double)O->host_elems * sizeof(float) / PX_GIB);
    return PX_OK;
}

void exec_optim_offload_free(ExecOptim *O)
{
    free(O->host_g);
    free(O->host_w);
    free(O->host_off);
    free(O->adam8);
    O->adam8 = NULL;
    O->host_g = O->host_w = NULL;
    O->host_off = NULL;
}

/* This rank's weight shard of block b on the device: ZeRO-3's w_shard, else its slice of w. */
static void *device_w_shard(const ExecCtx *c, const ExecBlock *blk)
{
    return c->spec.layout.zero == 3 ? blk->w_shard : EXEC_AT(blk->w, blk->own_off, c->ab);
}

/* ZeRO-Offload's step (Ren et al. 2021): each block's reduced gradient shard copied device ->
 * host, AdamW or SGD over the host's weights, master and optimizer state, the updated weight
 * shard copied host -> device (where ZeRO-1/2 then gather it as usual). The device arenas hold
 * no master or optimizer state (bind.c puts them in host memory). */
static void update_offloaded(ExecOptim *O, const ExecCtx *c, ExecParams *P, double lr, float scale,
                             Adam8 *A)
{
    const KernBackend *k = c->k;
    double t0 = px_now_s();
    for (int b = 0; b < P->nb; b++) {
        const ExecBlock *blk = &P->b[b];
        if (blk->own_n == 0)
            continue;
        const float *g = c->spec.layout.zero >= 2 ? blk->g_shard : blk->g + blk->own_off;
        k->to_host(O->host_g + O->host_off[b], g, blk->own_n * sizeof(float));
        /* the weights once (after initialization or a resumed checkpoint): the host's copy is
         * the one the steps update from then on */
        if (!O->host_w_ready)
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
        step_range(c, p, NULL, O->host_w + h, O->host_g + h, blk, st, n, lr, t, scale, A);
    }
    if (A)
        adam8_flush(A);
    double t2 = px_now_s();
    O->host_step_s += t2 - t1;
    for (int b = 0; b < P->nb; b++) {
        const ExecBlock *blk = &P->b[b];
        if (blk->own_n)
            k->to_device(device_w_shard(c, blk), O->host_w + O->host_off[b], blk->own_n * c->ab);
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
