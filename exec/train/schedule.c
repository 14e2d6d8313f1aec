/* A step's passes in the stage's schedule (model_schedule_build's order: GPipe, 1F1B or
 * interleaved 1F1B): each micro-batch's forward takes a free activation slot and its backward
 * gives it back; gradients are zeroed first and accumulate over the micro-batches; the
 * pipeline's transfers and the data-parallel reductions run inside the passes (pipeline.c,
 * zero.c), and every pass is recorded with when it ran (the measured bubble). */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

int exec_sched_init(ExecSched *S, const ExecCtx *c, PxError *err)
{
    memset(S, 0, sizeof *S);
    const ModelDims *d = &c->d;
    const int nact = 2 * d->m * d->v;
    S->actions = exec_zalloc((size_t)nact, sizeof *S->actions);
    S->mb_slot = exec_zalloc((size_t)d->m * d->v, sizeof *S->mb_slot);
    S->mb_xslot = exec_zalloc((size_t)d->m * d->v, sizeof *S->mb_xslot);
    S->bwd_done = exec_zalloc((size_t)d->v, sizeof *S->bwd_done);
    if (!S->actions || !S->mb_slot || !S->mb_xslot || !S->bwd_done)
        return px_fail(err, PX_ERUNTIME, "out of memory for the schedule");
    S->n = model_schedule_build(d, c->spec.layout.schedule, c->g.stage, S->actions);
    return PX_OK;
}

void exec_sched_free(ExecSched *S)
{
    free(S->actions);
    free(S->mb_slot);
    free(S->mb_xslot);
    free(S->bwd_done);
    memset(S, 0, sizeof *S);
}

ExecLayerRun exec_layer_run(Exec *ex)
{
    return (ExecLayerRun){.c = &ex->c, .P = &ex->params, .W = &ex->work, .M = &ex->meter,
                          .pipe = &ex->pipe, .Z = &ex->zero, .pass = &ex->pass,
                          .moe = &ex->moe, .fp8 = &ex->fp8};
}

/* A chunk's forward, then its prediction modules' (mtp.c: none but on the last chunk). */
static int forward(const ExecLayerRun *r, int j, int mb, ExecLayerActs *A, ExecHeadActs *x,
                   const int32_t *tok, PxError *err)
{
    int rc = exec_layers_forward(r, j, mb, A, x, tok, err);
    return rc ? rc : exec_mtp_forward(r, j, mb, A, x, tok, err);
}

/* One action of the schedule: a forward (backward 0: forward only, one slot serving every
 * micro-batch in turn) or a backward, in its activation slots. */
static int run_action(Exec *ex, const ExecLayerRun *r, const ModelAction *a, const int32_t *tok,
                      int backward, PxError *err)
{
    ExecSched *S = &ex->sched;
    ExecActs *X = &ex->acts;
    const int j = a->chunk, slot_i = j * ex->c.d.m + a->mb;
    if (!backward) {
        exec_acts_reset(X, j);
        exec_meter_pass_input(&ex->meter);
        return forward(r, j, a->mb, exec_acts_layers(X, &ex->c, j, 0), exec_acts_extras(X, j, 0),
                       tok, err);
    }
    if (!a->backward) {
        int s, x;
        int rc = exec_acts_acquire(X, j, &s, &x, err);
        if (rc)
            return rc;
        S->mb_slot[slot_i] = s;
        S->mb_xslot[slot_i] = x;
        exec_meter_pass_input(&ex->meter);
        return forward(r, j, a->mb, exec_acts_layers(X, &ex->c, j, s), exec_acts_extras(X, j, x),
                       tok, err);
    }
    const int last = ++S->bwd_done[j] == ex->c.d.m;
    const int s = S->mb_slot[slot_i], x = S->mb_xslot[slot_i];
    exec_meter_pass_input(&ex->meter);
    /* the prediction modules' backward first: the main loss's adds their gradient */
    int rc = exec_mtp_backward(r, j, a->mb, exec_acts_layers(X, &ex->c, j, s),
                               exec_acts_extras(X, j, x), tok, err);
    if (!rc)
        rc = exec_layers_backward(r, j, a->mb, exec_acts_layers(X, &ex->c, j, s),
                                  exec_acts_extras(X, j, x), tok, last, err);
    exec_acts_release(X, j, s, x);
    return rc;
}

int exec_schedule_run(Exec *ex, int step, int backward, PxError *err)
{
    const ExecCtx *c = &ex->c;
    const ModelDims *d = &c->d;
    ExecSched *S = &ex->sched;
    const int32_t *batch = NULL;
    int rc;
    if (c->g.has_data && (rc = exec_batches_get(&ex->batches, c, step, &batch, err)))
        return rc;
    ex->pass.step = step;
    ex->pass.seq_base = (long long)step * c->spec.job.global_batch + (long long)c->g.dp_rank * d->m * d->b;
    ex->pass.loss_sum = 0;
    ex->pass.mtp_loss_sum = 0;
    ex->pass.loss_scale = ex->optim.scaler.scale;
    if (backward) {
        const ExecArena *g = &ex->mem.a[MODEL_GRADS];
        if (g->base)
            c->k->memset0(g->base, g->cap);
        exec_zero_step_begin(&ex->zero, ex->params.nb);
    }
    /* ZeRO-3 under a pipeline: the stage's parameters, gathered once for all its passes */
    if ((rc = exec_zero_gather_step(&ex->zero, c, &ex->params, &ex->meter, err)))
        return rc;
    for (int j = 0; j < d->v; j++)
        S->bwd_done[j] = 0;
    if ((rc = exec_pipe_start(&ex->pipe, c, S->actions, S->n, backward, err)))
        return rc;
    const size_t mb_tokens = (size_t)d->b * (size_t)exec_cp_tok_row(c);
    /* the stages start the schedule together, so that the timeline has one origin and a
     * stage's wait for its first input is its bubble, not rank 0 printing the last step */
    if (d->p > 1 && (rc = comm_barrier(c->comm, err)))
        return rc;
    const ExecLayerRun r = exec_layer_run(ex);
    exec_meter_schedule_begin(&ex->meter);
    for (int i = 0; i < S->n && !rc; i++) {
        const ModelAction *a = &S->actions[i];
        if (!backward && a->backward)
            continue;
        const int32_t *tok = batch ? batch + (size_t)a->mb * mb_tokens : NULL;
        rc = run_action(ex, &r, a, tok, backward, err);
        exec_meter_pass_end(&ex->meter, i, a->chunk, a->mb, a->backward);
    }
    /* the last message must have left before pp.send is written again */
    if (!rc)
        rc = exec_pipe_drain(&ex->pipe, c, err);
    if (!rc && backward) {
        exec_meter_schedule_end(&ex->meter, S->n);
        rc = exec_zero_finish(&ex->zero, c, &ex->params, &ex->meter, err);
    }
    return rc;
}
