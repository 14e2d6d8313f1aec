/* A whole run: progress lines, the metrics log (JSON lines, flushed every step so a run in
 * progress can be watched or plotted), a predicted-against-measured summary, and run.json,
 * written atomically at the end or after SIGINT / SIGTERM at a step boundary. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>

#include "exec/internal.h"

volatile sig_atomic_t exec_stop_flag;

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

static void print_header(const Exec *ex)
{
    const ModelDims *d = &ex->d;
    const ModelSpec *s = &ex->spec;
    char params[32];
    px_fmt_count(params, sizeof params, model_config_params(&s->model));
    char compute[160], comm[192];
    if (ex->device_name[0])
        snprintf(compute, sizeof compute, "%s compute on %s", ex->k->name, ex->device_name);
    else
        snprintf(compute, sizeof compute, "%s compute", ex->k->name);
    if (ex->comm_note)
        snprintf(comm, sizeof comm, "%s comm, %s", comm_name(ex->comm), ex->comm_note);
    else
        snprintf(comm, sizeof comm, "%s comm", comm_name(ex->comm));
    if (comm_world(ex->comm) > 1)
        printf("parallax-worker: %s on %s, %d ranks: dp %d x tp %d x pp %d (%s, %s)\n",
               s->model.name, ex->plan.profile.name, comm_world(ex->comm), d->dp, d->t, d->p, compute, comm);
    else
        printf("parallax-worker: %s on %s, 1 rank (%s, %s)\n", s->model.name, ex->plan.profile.name,
               compute, comm);
    printf("model     %d layers, hidden %d, %d heads, vocab %d: %s parameters\n", s->model.layers,
           s->model.hidden, s->model.heads, s->model.vocab, params);
    printf("training  gbs %d  mbs %d (%d micro-batches)  seq %d  %s  %s  lr %g -> %g (warm-up %d)  "
           "%d steps\n",
           s->job.global_batch, s->job.micro_batch, d->m, d->s, px_dtype_name(s->job.precision),
           model_optimizer_name(s->job.optimizer), s->job.lr, s->job.min_lr, s->job.warmup_steps,
           ex->steps);
    if (ex->d.master)
        printf("precision %s weights and activations, fp32 master weights, gradients and optimizer "
               "state\n", px_dtype_name(ex->act));
    if (ex->scaler.enabled)
        printf("loss      dynamic fp16 loss scaling: scale %g, halved and the step skipped on an "
               "Inf or NaN gradient, doubled after %d clean steps\n",
               ex->scaler.scale, ex->scaler.interval);
    printf("layout    schedule %s  recompute %s  flash-attn %s  dropout %g  zero %d%s\n",
           model_schedule_name(s->layout.schedule), model_recompute_name(s->layout.recompute),
           s->job.flash_attn ? "on" : "off", s->job.dropout, s->layout.zero,
           s->layout.sp ? "  sp on" : "");
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

/* The device's own account of its memory beside the arenas: what the runtime category stands
 * for (CUDA context, cuBLAS workspace, NCCL) measured, against the profile's allowance. */
static void print_device_memory(const Exec *ex, uint64_t arenas, uint64_t allowance)
{
    uint64_t u0, up, ut;
    if (!exec_device_memory(ex, &u0, &up, &ut))
        return;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    printf("device    cudaMemGetInfo: %.3f GiB in use at the peak of %.2f GiB (%.3f GiB before "
           "the arenas); beyond the arenas %.3f GiB, against the runtime allowance of %.3f GiB\n",
           (double)up / gib, (double)ut / gib, (double)u0 / gib,
           (double)(up > arenas ? up - arenas : 0) / gib, (double)allowance / gib);
}

static void print_loss_scale(const Exec *ex)
{
    if (ex->scaler.enabled)
        printf("loss scale %g at the end; %ld of %d steps skipped (gradients not finite)\n",
               ex->scaler.scale, ex->scaler.skipped, ex->steps_done);
}

static void print_summary_one(Exec *ex)
{
    uint64_t mem[MODEL_CAT_COUNT];
    exec_memory(ex, mem);
    const uint64_t *pm = ex->pred.mem[ex->stage];
    printf("\nmemory of rank 0 (bytes)  predicted      measured\n");
    int all_equal = 1;
    uint64_t psum = 0, msum = 0;
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        const char *note = c == MODEL_RUNTIME ? "profile allowance, not measured"
                           : pm[c] == mem[c] ? "equal"
                                                  : "DIFFERS";
        if (c != MODEL_RUNTIME && pm[c] != mem[c])
            all_equal = 0;
        if (c != MODEL_RUNTIME) {
            psum += pm[c];
            msum += mem[c];
        }
        printf("  %-14s %14llu %14llu  %s\n", model_category_name((ModelCategory)c),
               (unsigned long long)pm[c], (unsigned long long)mem[c], note);
    }
    printf("  %-14s %14llu %14llu  %s\n", "arenas", (unsigned long long)psum,
           (unsigned long long)msum, psum == msum ? "equal (peak: allocated once)" : "DIFFERS");
    print_device_memory(ex, msum, mem[MODEL_RUNTIME]);
    double fp = ex->pred.rank_flops[ex->stage], fm = exec_step_flops(ex);
    int flops_equal = fabs(fp - fm) <= 1e-9 * fabs(fp);
    printf("FLOPs per step            %14.6e %14.6e  %s\n", fp, fm,
           flops_equal ? "equal" : "DIFFERS");
    printf("step time (s)             %14.4f %14.4f  (measured: median; predicted by the plan on its %s "
           "profile)\n",
           ex->pred.step_s[ex->stage], exec_median_step_s(ex), ex->plan.profile.name);
    print_loss_scale(ex);
    if (!all_equal || !flops_equal)
        printf("warning: measured memory or FLOPs differ from the prediction: a bug in model/ or "
               "exec/\n");
}

static double jnum(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* Every rank's memory (all categories but runtime), communication per kind, FLOPs and
 * bubble against its stage's prediction, from the gathered run. */
static void print_summary_ranks(Exec *ex, const cJSON *run)
{
    const cJSON *mr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "memory"), "per_rank");
    const cJSON *cr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "comm"), "per_rank");
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "flops"), "per_rank_per_step");
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(run, "timeline");
    const int W = cJSON_GetArraySize(mr), pipe = ex->d.p > 1;
    int bad = 0;
    printf("\nper rank        memory (bytes, runtime excluded)      communication per step (bytes)      "
           "FLOPs per step%s\n", pipe ? "        bubble" : "");
    printf("rank stage      predicted       measured             predicted       measured             "
           "predicted  measured%s\n", pipe ? "   predicted measured" : "");
    for (int i = 0; i < W; i++) {
        const cJSON *m = cJSON_GetArrayItem(mr, i), *c = cJSON_GetArrayItem(cr, i);
        const int st = (int)jnum(m, "stage");
        uint64_t pm = 0, mm = 0, pc = 0, mc = 0;
        int mem_eq = 1, comm_eq = 1;
        for (int k = 0; k < MODEL_RUNTIME; k++) {
            uint64_t p = ex->pred.mem[st][k], v = (uint64_t)jnum(m, model_category_name((ModelCategory)k));
            pm += p;
            mm += v;
            mem_eq &= p == v;
        }
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(c, "by_kind");
        for (int k = 0; k < MODEL_COMM_COUNT; k++) {
            uint64_t p = ex->pred.comm[st][k], v = (uint64_t)jnum(by, model_comm_name((ModelComm)k));
            pc += p;
            mc += v;
            comm_eq &= p == v;
        }
        double pf = ex->pred.rank_flops[st], mf = cJSON_GetNumberValue(cJSON_GetArrayItem(fr, i));
        int fl_eq = fabs(pf - mf) <= 1e-9 * fabs(pf);
        bad |= !mem_eq || !comm_eq || !fl_eq;
        printf("%4d %5d %14llu %14llu %-7s %14llu %14llu %-7s %12.4e %9s", (int)jnum(m, "rank"), st,
               (unsigned long long)pm, (unsigned long long)mm, mem_eq ? "equal" : "DIFFERS",
               (unsigned long long)pc, (unsigned long long)mc, comm_eq ? "equal" : "DIFFERS", pf,
               fl_eq ? "equal" : "DIFFERS");
        if (pipe)
            printf("   %8.1f%% %7.1f%%", 100 * ex->pred.bubble_fraction[st],
                   100 * jnum(cJSON_GetArrayItem(tl, i), "bubble_fraction"));
        printf("\n");
    }
    printf("step time (s)   %14.4f %14.4f  (measured: median; predicted by the plan on its %s profile)\n",
           ex->pred.job_step_s, exec_median_step_s(ex), ex->plan.profile.name);
    /* every rank's device peak, from the gathered run */
    int have_dev = 0;
    for (int i = 0; i < W; i++)
        have_dev |= cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(mr, i),
                                                     "device_used_peak_bytes") != NULL;
    if (have_dev) {
        printf("device memory in use at the peak (cudaMemGetInfo, GiB):");
        for (int i = 0; i < W; i++)
            printf(" %d: %.3f", i,
                   jnum(cJSON_GetArrayItem(mr, i), "device_used_peak_bytes") / (1024.0 * 1024.0 * 1024.0));
        printf("\n");
    }
    print_loss_scale(ex);
    if (pipe)
        printf("bubble          %13.1f%% %13.1f%%  (idle over busy time of the stage that ends "
               "last)\n",
               100 * ex->pred.job_bubble_fraction,
               100 * jnum(cJSON_GetObjectItemCaseSensitive(run, "time"), "bubble_fraction"));
    if (bad)
        printf("warning: measured memory, communication or FLOPs differ from the prediction: a bug "
               "in model/ or exec/\n");
}

int exec_run(Exec *ex, PxError *err)
{
    int rc = PX_OK;
    FILE *mf = NULL;
    /* a resumed run goes on with the log of the run it continues */
    if (ex->metrics[0] && !(mf = fopen(ex->metrics, ex->ckpt.resumed_from > 0 ? "a" : "w")))
        return px_fail(err, PX_EINPUT, "%s: cannot write the metrics log: %s", ex->metrics,
                       strerror(errno));
    /* the loader thread reads step k + 1 while step k computes */
    if (ex->has_data) {
        exec_loader_stop(&ex->loader);
        ex->loader_started = 0;
        if ((rc = exec_loader_start(&ex->loader, ex->opt.prefetch, err))) {
            if (mf)
                fclose(mf);
            return rc;
        }
        ex->loader_started = 1;
    }
    if (!ex->opt.quiet) {
        print_header(ex);
        exec_ckpt_print_resume(ex);
    }

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    exec_stop_flag = 0;
    ex->stop_agreed = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    double elapsed = 0;
    for (int step = ex->first_step; step < ex->steps; step++) {
        /* every rank learnt at the end of the last step whether any was asked to stop */
        if (ex->stop_agreed || (comm_world(ex->comm) == 1 && exec_stop_flag)) {
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
            if (ex->scaler.enabled)
                fprintf(mf, ", \"loss_scale\": %.9g, \"skipped\": %s", st.loss_scale,
                        st.skipped ? "true" : "false");
            fprintf(mf, ", \"tokens_per_s\": %.1f, \"ms_per_step\": %.3f}\n", st.tokens_per_s,
                    1e3 * st.time_s);
            fflush(mf);
        }
        if (!ex->opt.quiet) {
            double eta = elapsed / (step - ex->first_step + 1) * (ex->steps - step - 1);
            char scale[64] = "";
            if (ex->scaler.enabled)
                snprintf(scale, sizeof scale, "  scale %g%s", st.loss_scale,
                         st.skipped ? " (overflow: step skipped)" : "");
            printf("step %5d/%d  loss %.4f  lr %.2e  norm %6.3f  %9.0f tok/s  %8.1f ms/step  "
                   "ETA %.1f s%s\n",
                   st.step, ex->steps, st.loss, st.lr, st.grad_norm, st.tokens_per_s,
                   1e3 * st.time_s, eta, scale);
            fflush(stdout);
        }
        if ((rc = exec_ckpt_after_step(ex, step + 1, err)))
            break;
    }
    if (!rc && ex->stop_agreed && !ex->interrupted && ex->first_step + ex->steps_done < ex->steps)
        ex->interrupted = 1;
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (ex->loader_started) {
        exec_loader_stop(&ex->loader);
        ex->loader_started = 0;
    }
    if (mf && fclose(mf) != 0 && !rc)
        rc = px_fail(err, PX_ERUNTIME, "%s: cannot write the metrics log", ex->metrics);
    /* a failure of this rank alone: the job is aborted, nothing is gathered */
    if (rc && comm_world(ex->comm) > 1 && !ex->collective_error)
        return rc;
    if (ex->interrupted && !ex->opt.quiet)
        printf("interrupted after %d steps\n", ex->first_step + ex->steps_done);
    /* what was measured is written even when a step failed: no lost data (a run that diverged
     * at its first step too: run.json says where it stopped) */
    cJSON *j = NULL;
    if (ex->steps_done > 0 || ex->stopped_step > 0) {
        if (comm_world(ex->comm) > 1) {
            PxError gerr = {0};
            int grc = exec_run_gather_json(ex, &j, &gerr);
            if (grc && !rc) {
                *err = gerr;
                return grc;
            }
        } else {
            j = exec_run_to_json(ex);
        }
    }
    if (!ex->opt.quiet && ex->steps_done > 0 && !ex->pred.stages)
        printf("\nthe plan carries no prediction: nothing to set the measurements beside\n");
    else if (!ex->opt.quiet && ex->steps_done > 0) {
        if (comm_world(ex->comm) > 1 && j)
            print_summary_ranks(ex, j);
        else if (comm_world(ex->comm) == 1)
            print_summary_one(ex);
    }
    if (ex->output[0] && j) {
        PxError werr = {0};
        int wrc = px_json_write_file(ex->output, j, &werr);
        if (wrc && !rc) {
            *err = werr;
            rc = wrc;
        } else if (!wrc && !ex->opt.quiet) {
            printf("wrote %s\n", ex->output);
        }
    }
    cJSON_Delete(j);
    if (!rc && ex->interrupted) {
        ex->collective_error = 1;
        rc = px_fail(err, PX_ERUNTIME, "interrupted after %d of %d steps",
                     ex->first_step + ex->steps_done, ex->steps);
    }
    return rc;
}
