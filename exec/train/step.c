/* A training step: the failures asked for, the schedule's passes (schedule.c), the update
 * (optim.c), and the step's measurements (meter.c, the run's history); and the forward-backward
 * without an update that gradient checks use. */
#include <math.h>
#include <string.h>

#include "exec/train/internal.h"

/* set by run.c's signal handler; the step's control reduction tells every rank */
volatile sig_atomic_t exec_stop_flag;

/* The loss of the step from every rank's share (only the last stage's first TP rank of each
 * data-parallel replica contributes). */
static int global_loss(Exec *ex, double *loss, PxError *err)
{
    double v = ex->pass.loss_sum;
    int rc = comm_control(ex->c.comm, &v, 1, COMM_SUM, err);
    *loss = v / ((double)ex->c.spec.job.global_batch * ex->c.d.s);
    return rc;
}

static int passes_only(Exec *ex, int step, int backward, double *loss, PxError *err)
{
    exec_meter_step_begin(&ex->meter, NULL);
    exec_moe_step_begin(&ex->moe); /* the passes' load-balancing loss alone */
    int rc = exec_pg_scales(&ex->zero, &ex->c, &ex->params, &ex->meter, err);
    if (!rc)
        rc = exec_schedule_run(ex, step, backward, err);
    if (!rc)
        rc = exec_meter_scopes_check(&ex->meter, err);
    if (!rc)
        rc = global_loss(ex, loss, err);
    exec_meter_step_end(&ex->meter, NULL, 0);
    return rc;
}

int exec_grads(Exec *ex, int step, double *loss, PxError *err)
{
    return passes_only(ex, step, 1, loss, err);
}

int exec_loss(Exec *ex, int step, double *loss, PxError *err)
{
    return passes_only(ex, step, 0, loss, err);
}

double exec_aux_loss(const Exec *ex) { return ex->moe.aux_sum; }

double exec_mtp_loss(const Exec *ex)
{
    return ex->pass.mtp_loss_sum / ((double)ex->c.spec.job.global_batch * ex->c.d.s);
}

/* PARALLAX_TEST_INF: an overflow in this step's gradients, as fp16 would make one (rank 0 owns
 * the first element of every block's gradients, whatever the ZeRO stage). */
static void inject_inf(Exec *ex, int step)
{
    if (!exec_faults_inf(&ex->faults, ex->c.g.rank, step) || ex->params.n == 0)
        return;
    const ExecParam *p = &ex->params.p[0];
    const float inf = INFINITY;
    ex->c.k->to_device(exec_optim_grad_at(&ex->c, &ex->params, p, p->off), &inf, sizeof inf);
}

/* The update, timed under the optimizer's op: the control reduction, the optimizer step, ZeRO's
 * gather of the updated weights (its own op within it) and the updated weights' FP8 copies (the
 * op graph counts the casts under the optimizer). */
static int update(Exec *ex, int step, ExecUpdate *u, PxError *err)
{
    ExecCtx *c = &ex->c;
    ExecMeter *M = &ex->meter;
    const int op = exec_meter_other_op(M, MODEL_OPR_OPTIMIZER, MODEL_STEP);
    exec_meter_open(M, c->k, op);
    int rc = exec_optim_step(&ex->optim, c, &ex->params, M, step, ex->pass.loss_sum,
                             ex->pass.mtp_loss_sum,
                             exec_faults_nan_loss(&ex->faults, c->g.rank, step),
                             exec_stop_flag != 0, u, err);
    if (!rc && !u->skipped && ex->fp8.on)
        exec_fp8_cast(&ex->fp8, c);
    /* FP8 parameters below ZeRO-3: quantized from the updated master and gathered */
    if (!rc && !u->skipped)
        rc = exec_pg_updated(&ex->zero, c, &ex->params, M, err);
    exec_meter_close(M, c->k, op);
    return rc;
}

int exec_step(Exec *ex, int step, ExecStepStats *st, PxError *err)
{
    ExecCtx *c = &ex->c;
    double t0 = px_now_s();
    comm_set_step(c->comm, step + 1); /* for the communication timeout's message */
    int rc = exec_faults_step(&ex->faults, c->g.rank, step, err);
    if (rc)
        return rc;
    exec_meter_step_begin(&ex->meter, c->comm);
    exec_moe_step_begin(&ex->moe);
    const double loss_scale = ex->optim.scaler.scale;
    ExecUpdate u = {0, 0, 0, 0, 0};
    /* the FP8 weights' scales of the step, which its ZeRO-3 gathers quantize with */
    rc = exec_pg_scales(&ex->zero, c, &ex->params, &ex->meter, err);
    if (!rc)
        rc = exec_schedule_run(ex, step, 1, err);
    if (!rc) {
        inject_inf(ex, step);
        exec_batches_stage_next(&ex->batches, c, step + 1);
        rc = update(ex, step, &u, err);
    }
    if (!rc)
        rc = exec_meter_scopes_check(&ex->meter, err);
    c->k->sync();
    exec_meter_device_memory(&ex->meter, c->k, 0);
    double dt = px_now_s() - t0;
    const int timed = ex->hist.done > 0 || c->steps == 1;
    exec_meter_step_end(&ex->meter, c->comm, timed);
    if (timed && !rc)
        exec_meter_keep_bubble(&ex->meter);
    if (rc)
        return rc;
    memset(st, 0, sizeof *st);
    st->step = step + 1;
    st->loss = u.loss;
    st->mtp_loss = u.mtp_loss;
    st->lr = u.lr;
    st->grad_norm = u.norm;
    st->time_s = dt;
    st->tokens_per_s = dt > 0 ? (double)c->spec.job.global_batch * c->d.s / dt : 0;
    st->skipped = u.skipped;
    st->loss_scale = loss_scale;
    exec_history_record(&ex->hist, c->steps, st);
    return PX_OK;
}
