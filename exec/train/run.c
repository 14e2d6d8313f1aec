/* A whole run: progress lines, the metrics log (JSON lines, flushed every step so a run in
 * progress can be watched or plotted), checkpoints every N steps (exec/checkpoint), the
 * predicted-against-measured summary, and run.json, written atomically at the end or after
 * SIGINT / SIGTERM at a step boundary that every rank agrees on. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

static void on_signal(int sig)
{
    (void)sig;
    exec_stop_flag = 1;
}

/* JSON has no NaN: a diverged loss is written as null */
static void json_num(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, "\"%s\": %.9g", key, v);
    else
        fprintf(f, "\"%s\": null", key);
}

/* One line of the metrics log. */
static void log_step(FILE *mf, const Exec *ex, const ExecStepStats *st)
{
    fprintf(mf, "{\"step\": %d, ", st->step);
    json_num(mf, "loss", st->loss);
    if (ex->c.spec.model.mtp_layers > 0) {
        fputs(", ", mf);
        json_num(mf, "mtp_loss", st->mtp_loss);
    }
    fputs(", ", mf);
    json_num(mf, "lr", st->lr);
    fputs(", ", mf);
    json_num(mf, "grad_norm", st->grad_norm);
    if (ex->optim.scaler.enabled)
        fprintf(mf, ", \"loss_scale\": %.9g, \"skipped\": %s", st->loss_scale,
                st->skipped ? "true" : "false");
    fprintf(mf, ", \"tokens_per_s\": %.1f, \"ms_per_step\": %.3f}\n", st->tokens_per_s,
            1e3 * st->time_s);
    fflush(mf);
}

/* One progress line. */
static void print_step(const Exec *ex, const ExecStepStats *st, int step, double elapsed)
{
    const int first = ex->hist.first_step, steps = ex->c.steps;
    double eta = elapsed / (step - first + 1) * (steps - step - 1);
    char scale[64] = "";
    if (ex->optim.scaler.enabled)
        snprintf(scale, sizeof scale, "  scale %g%s", st->loss_scale,
                 st->skipped ? " (overflow: step skipped)" : "");
    printf("step %5d/%d  loss %.4f  lr %.2e  norm %6.3f  %9.0f tok/s  %8.1f ms/step  ETA %.1f s%s\n",
           st->step, steps, st->loss, st->lr, st->grad_norm, st->tokens_per_s, 1e3 * st->time_s,
           eta, scale);
    fflush(stdout);
}

/* The steps from the first (or the resumed) one: each logged, printed and checkpointed; stops
 * at an agreed boundary when any rank was asked to. */
static int run_steps(Exec *ex, FILE *mf, PxError *err)
{
    ExecHistory *H = &ex->hist;
    double elapsed = 0;
    int rc = PX_OK;
    for (int step = H->first_step; step < ex->c.steps; step++) {
        /* every rank learnt at the end of the last step whether any was asked to stop */
        if (ex->optim.stop_agreed || (ex->c.g.world == 1 && exec_stop_flag)) {
            H->interrupted = 1;
            break;
        }
        ExecStepStats st;
        if ((rc = exec_step(ex, step, &st, err)))
            break;
        elapsed += st.time_s;
        if (mf)
            log_step(mf, ex, &st);
        if (!ex->c.quiet)
            print_step(ex, &st, step, elapsed);
        /* without checkpoints there is no state to describe every step */
        if (ex->ckpt) {
            CkptState cs;
            exec_ckpt_state(ex, &cs);
            if ((rc = ckpt_after_step(ex->ckpt, &cs, step + 1, ex->c.quiet, &H->collective, err)))
                break;
        }
    }
    if (!rc && ex->optim.stop_agreed && !H->interrupted && H->first_step + H->done < ex->c.steps)
        H->interrupted = 1;
    return rc;
}

/* run.json, gathered from every rank (rank 0 gets it), even when a step failed collectively:
 * no lost data (a run that diverged at its first step too: run.json says where it stopped). */
static int gather_run(Exec *ex, int rc, cJSON **out, PxError *err)
{
    *out = NULL;
    if (ex->hist.done == 0 && ex->optim.diverged_at == 0)
        return rc;
    if (ex->c.g.world == 1) {
        *out = exec_run_to_json(ex);
        return rc;
    }
    PxError gerr = {0};
    int grc = exec_run_gather_json(ex, out, &gerr);
    if (grc && !rc) {
        *err = gerr;
        return grc;
    }
    return rc;
}

int exec_run(Exec *ex, PxError *err)
{
    int rc = PX_OK;
    FILE *mf = NULL;
    /* a resumed run goes on with the log of the run it continues */
    if (ex->metrics[0] && !(mf = fopen(ex->metrics, ckpt_resumed_from(ex->ckpt) > 0 ? "a" : "w")))
        return px_fail(err, PX_EINPUT, "%s: cannot write the metrics log: %s", ex->metrics,
                       strerror(errno));
    /* the loader thread reads step k + 1 while step k computes */
    if (ex->c.g.has_data && (rc = exec_batches_restart(&ex->batches, ex->opt.prefetch, err))) {
        if (mf)
            fclose(mf);
        return rc;
    }
    if (!ex->c.quiet) {
        exec_report_header(ex);
        CkptState cs;
        exec_ckpt_state(ex, &cs);
        ckpt_print_resume(ex->ckpt, &cs);
    }

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    exec_stop_flag = 0;
    ex->optim.stop_agreed = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    rc = run_steps(ex, mf, err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    exec_batches_stop(&ex->batches);
    if (mf && fclose(mf) != 0 && !rc)
        rc = px_fail(err, PX_ERUNTIME, "%s: cannot write the metrics log", ex->metrics);
    /* a failure of this rank alone: the job is aborted, nothing is gathered */
    ExecHistory *H = &ex->hist;
    if (rc && ex->c.g.world > 1 && !exec_error_is_collective(ex))
        return rc;
    if (H->interrupted && !ex->c.quiet)
        printf("interrupted after %d steps\n", H->first_step + H->done);
    cJSON *j = NULL;
    const int grc = gather_run(ex, rc, &j, err);
    if (grc != rc)
        return grc;
    if (!ex->c.quiet && H->done > 0)
        exec_report_summary(ex, j);
    if (ex->output[0] && j) {
        PxError werr = {0};
        int wrc = px_json_write_file(ex->output, j, &werr);
        if (wrc && !rc) {
            *err = werr;
            rc = wrc;
        } else if (!wrc && !ex->c.quiet) {
            printf("wrote %s\n", ex->output);
        }
    }
    cJSON_Delete(j);
    if (!rc && H->interrupted) {
        H->collective = 1;
        rc = px_fail(err, PX_ERUNTIME, "interrupted after %d of %d steps", H->first_step + H->done,
                     ex->c.steps);
    }
    return rc;
}
