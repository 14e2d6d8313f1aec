/* A whole run: progress lines, the metrics log (JSON lines, flushed every step so a run in
 * progress can be watched or plotted), a predicted-against-measured summary, and run.json,
 * written atomically at the end or after SIGINT / SIGTERM at a step boundary. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>

#include "exec/internal.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* JSON has no NaN: a diverged loss is written as null */
static void json_num(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, "\"%s\": %.9g", key, v);
    else
        fprintf(f, "\"%s\": null", key);
}

static void print_header(const Exec *ex)
{
    const ModelDims *d = &ex->d;
    const ModelSpec *s = &ex->spec;
    char params[32];
    px_fmt_count(params, sizeof params, (double)ex->tt.params);
    printf("parallax-worker: %s on %s, 1 rank (%s compute, %s comm)\n", s->model.name,
           ex->cluster.name, ex->k->name, ex->comm->name);
    printf("model     %d layers, hidden %d, %d heads, vocab %d: %s parameters\n", s->model.layers,
           s->model.hidden, s->model.heads, s->model.vocab, params);
    printf("training  gbs %d  mbs %d (%d micro-batches)  seq %d  %s  %s  lr %g -> %g (warm-up %d)  "
           "%d steps\n",
           s->job.global_batch, s->job.micro_batch, d->m, d->s, px_dtype_name(s->job.precision),
           model_optimizer_name(s->job.optimizer), s->job.lr, s->job.min_lr, s->job.warmup_steps,
           ex->steps);
    printf("layout    schedule %s  recompute %s  flash-attn %s  dropout %g  zero %d\n",
           model_schedule_name(s->layout.schedule), model_recompute_name(s->layout.recompute),
           s->job.flash_attn ? "on" : "off", s->job.dropout, s->layout.zero);
    if (ex->data.kind == EXEC_DATA_BUILTIN)
        printf("data      the built-in text (%.1f MiB, byte tokens)\n",
               (double)ex->data.ntok / (1024.0 * 1024.0));
    else
        printf("data      %s (%llu %s)\n", ex->data.path, (unsigned long long)ex->data.ntok,
               ex->data.kind == EXEC_DATA_TOKENS ? "tokens" : "byte tokens");
    if (ex->dropout > 0 && !ex->attn_dropout)
        printf("note      flash attention has no attention-probability dropout on the CPU; the "
               "embedding and residual dropouts apply\n");
    fflush(stdout);
}

static void print_summary(Exec *ex)
{
    uint64_t mem[MODEL_CAT_COUNT];
    exec_memory(ex, mem);
    const SimStageMemory *pm = &ex->sim.mem[ex->stage];
    printf("\nmemory of rank 0 (bytes)  predicted      measured\n");
    int all_equal = 1;
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        const char *note = c == MODEL_RUNTIME ? "profile allowance, not measured"
                           : pm->cat[c] == mem[c] ? "equal"
                                                  : "DIFFERS";
        if (c != MODEL_RUNTIME && pm->cat[c] != mem[c])
            all_equal = 0;
        printf("  %-14s %14llu %14llu  %s\n", model_category_name((ModelCategory)c),
               (unsigned long long)pm->cat[c], (unsigned long long)mem[c], note);
    }
    double fp = ex->sim.rank_flops[ex->stage], fm = exec_step_flops(ex);
    int flops_equal = fabs(fp - fm) <= 1e-9 * fabs(fp);
    printf("FLOPs per step            %14.6e %14.6e  %s\n", fp, fm,
           flops_equal ? "equal" : "DIFFERS");
    printf("step time (s)             %14.4f %14.4f  (measured: median; predicted from the %s "
           "profile)\n",
           ex->sim.stage_time[ex->stage].step_s, exec_median_step_s(ex), ex->cluster.name);
    if (!all_equal || !flops_equal)
        printf("warning: measured memory or FLOPs differ from the prediction: a bug in model/ or "
               "exec/\n");
}

int exec_run(Exec *ex, PxError *err)
{
    int rc = PX_OK;
    FILE *mf = NULL;
    if (ex->metrics[0] && !(mf = fopen(ex->metrics, "w")))
        return px_fail(err, PX_EINPUT, "%s: cannot write the metrics log: %s", ex->metrics,
                       strerror(errno));
    /* the loader thread reads step k + 1 while step k computes */
    exec_loader_stop(&ex->loader);
    ex->loader_started = 0;
    if ((rc = exec_loader_start(&ex->loader, ex->opt.prefetch, err))) {
        if (mf)
            fclose(mf);
        return rc;
    }
    ex->loader_started = 1;
    if (!ex->opt.quiet)
        print_header(ex);

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    stop_requested = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    double elapsed = 0;
    for (int step = 0; step < ex->steps; step++) {
        if (stop_requested) {
            ex->interrupted = 1;
            break;
        }
        ExecStepStats st;
        if ((rc = exec_step(ex, step, &st, err)))
            break;
        elapsed += st.time_s;
        if (mf) {
            fprintf(mf, "{\"step\": %d, ", st.step);
            json_num(mf, "loss", st.loss);
            fputs(", ", mf);
            json_num(mf, "lr", st.lr);
            fputs(", ", mf);
            json_num(mf, "grad_norm", st.grad_norm);
            fprintf(mf, ", \"tokens_per_s\": %.1f, \"ms_per_step\": %.3f}\n", st.tokens_per_s,
                    1e3 * st.time_s);
            fflush(mf);
        }
        if (!ex->opt.quiet) {
            double eta = elapsed / (step + 1) * (ex->steps - step - 1);
            printf("step %5d/%d  loss %.4f  lr %.2e  norm %6.3f  %9.0f tok/s  %8.1f ms/step  "
                   "ETA %.1f s\n",
                   st.step, ex->steps, st.loss, st.lr, st.grad_norm, st.tokens_per_s,
                   1e3 * st.time_s, eta);
            fflush(stdout);
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    exec_loader_stop(&ex->loader);
    ex->loader_started = 0;
    if (mf && fclose(mf) != 0 && !rc)
        rc = px_fail(err, PX_ERUNTIME, "%s: cannot write the metrics log", ex->metrics);
    if (ex->interrupted && !ex->opt.quiet)
        printf("interrupted after %d steps\n", ex->steps_done);
    if (!ex->opt.quiet && ex->steps_done > 0)
        print_summary(ex);
    /* what was measured is written even when a step failed: no lost data */
    if (ex->output[0] && ex->steps_done > 0) {
        PxError werr = {0};
        cJSON *j = exec_run_to_json(ex);
        int wrc = px_json_write_file(ex->output, j, &werr);
        cJSON_Delete(j);
        if (wrc && !rc) {
            *err = werr;
            rc = wrc;
        } else if (!wrc && !ex->opt.quiet) {
            printf("wrote %s\n", ex->output);
        }
    }
    if (!rc && ex->interrupted)
        rc = px_fail(err, PX_ERUNTIME, "interrupted after %d of %d steps", ex->steps_done,
                     ex->steps);
    return rc;
}
