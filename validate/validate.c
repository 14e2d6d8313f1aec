/* Validation: plan layouts of a model on this machine's (calibrated) profile, run them for real
 * through `parallax run` (a subprocess, so the front end needs no MPI), compare prediction and
 * measurement quantity by quantity, and draw the report. Timing layouts use no more ranks than
 * cores; memory and communication are compared at any rank count. */
#include "validate/validate.h"

#include "reports/report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct {
    int dp, tp, pp, vpp, zero, sp, mbs, recompute, schedule;
} Layout;

/* What is worth validating on a few CPU ranks besides the planner's best layouts (which come
 * first): every kind of parallelism alone and in pairs, each schedule, ZeRO stages and
 * recompute modes. */
static const Layout spread[] = {
    {1, 1, 1, 1, 0, 0, 4, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {1, 1, 1, 1, 0, 0, 2, MODEL_RECOMPUTE_FULL, MODEL_SCHED_1F1B},
    {1, 1, 1, 1, 0, 0, 8, MODEL_RECOMPUTE_SELECTIVE, MODEL_SCHED_1F1B},
    {2, 1, 1, 1, 0, 0, 4, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {2, 1, 1, 1, 1, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {1, 2, 1, 1, 0, 0, 4, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {1, 2, 1, 1, 0, 1, 4, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {1, 1, 2, 1, 0, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {1, 1, 2, 1, 0, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_GPIPE},
    {1, 1, 2, 2, 0, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_INTERLEAVED},
    {2, 1, 1, 1, 3, 0, 4, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    /* beyond the cores: memory and communication only */
    {2, 2, 1, 1, 0, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {1, 2, 2, 1, 0, 1, 2, MODEL_RECOMPUTE_SELECTIVE, MODEL_SCHED_1F1B},
    {2, 1, 2, 1, 1, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {2, 2, 2, 1, 1, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
    {4, 1, 1, 1, 3, 0, 2, MODEL_RECOMPUTE_NONE, MODEL_SCHED_1F1B},
};

void val_request_defaults(ValRequest *q)
{
    memset(q, 0, sizeof *q);
    q->dir = "validation";
    q->steps = 20;
    q->max_ranks = 8;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    q->max_timing_ranks = cores > 0 ? (int)cores : 1;
}

int val_request_resolve(ValRequest *q, const char *cluster_name, PxError *err)
{
    if (!q->parallax[0]) {
        ssize_t n = readlink("/proc/self/exe", q->parallax, sizeof q->parallax - 1);
        if (n <= 0)
            return px_fail(err, PX_ERUNTIME, "cannot find the parallax executable (/proc/self/exe)");
        q->parallax[n] = '\0';
    }
    /* scaling curves and the landscape on this machine's profile, up to the largest layout */
    q->n_scaling_gpus = 0;
    for (int g = 1; g <= 64 && g <= q->max_ranks; g *= 2)
        q->scaling_gpus[q->n_scaling_gpus++] = g;
    /* the plans name the calibrated profile by its path, so that runs read what was planned */
    if (!(strcmp(cluster_name, "local") == 0 &&
          prof_calibrated_path(q->cluster_ref, sizeof q->cluster_ref)))
        px_strlcpy(q->cluster_ref, cluster_name, sizeof q->cluster_ref);
    return PX_OK;
}

void val_print_header(FILE *f, const ValRequest *q)
{
    const ProfCluster *cl = q->cluster;
    fprintf(f, "validating %s on %s (%s): %d cores, timing up to %d ranks, memory and "
               "communication up to %d\n",
            q->base.model.name, cl->name,
            cl->measured ? "calibrated" : "not calibrated: run parallax calibrate",
            q->max_timing_ranks, q->max_timing_ranks, q->max_ranks);
}

enum { PLAN_TOP = 3 };

/* The planner's best layouts on the timing ranks (context parallelism pinned off: the
 * executor does not run it), as Layout rows; fewer when fewer fit. */
static int planned(const ValRequest *q, Layout *out, int *n_out, PxError *err)
{
    *n_out = 0;
    SimPlanRequest pq;
    memset(&pq, 0, sizeof pq);
    pq.base = q->base;
    pq.base.layout.cp = 1;
    pq.pinned = SIM_PIN_CP;
    pq.gpus = q->max_timing_ranks;
    pq.objective = SIM_OBJ_TIME;
    pq.top = PLAN_TOP;
    SimPlanResult r;
    memset(&r, 0, sizeof r);
    int rc = sim_plan(&pq, q->cluster, &r, err);
    if (rc == PX_EINPUT) /* nothing fits on so few ranks: the spread alone */
        return PX_OK;
    for (int i = 0; !rc && i < r.n_top && i < PLAN_TOP; i++) {
        const ModelLayout *l = &r.top[i].spec.layout;
        out[(*n_out)++] = (Layout){l->dp, l->tp, l->pp, l->vpp, l->zero, l->sp,
                                   r.top[i].spec.job.micro_batch, (int)l->recompute,
                                   (int)l->schedule};
    }
    sim_plan_free(&r);
    return rc;
}

static int same_layout(const Layout *a, const Layout *b)
{
    return a->dp == b->dp && a->tp == b->tp && a->pp == b->pp && a->vpp == b->vpp &&
           a->zero == b->zero && a->sp == b->sp && a->mbs == b->mbs &&
           a->recompute == b->recompute && a->schedule == b->schedule;
}

static int run_child(char *const argv[], const char *log_path, PxError *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e)
        return px_fail(err, PX_ERUNTIME, "cannot start %s: %s", argv[0], strerror(e));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return px_fail(err, PX_ERUNTIME, "waiting for %s: %s", argv[0], strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return px_fail(err, PX_ERUNTIME, "%s %s failed (exit %d): see %s", argv[0], argv[1],
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1, log_path);
    return PX_OK;
}

int val_run(const ValRequest *q, cJSON **json_out, FILE *log, PxError *err)
{
    *json_out = NULL;
    if (px_mkdir_p(q->dir, err))
        return PX_ERUNTIME; /* as the report's charts do: the run fails (exit 1) */
    const int n_spread = (int)(sizeof spread / sizeof spread[0]);
    Layout rows[PLAN_TOP + sizeof spread / sizeof spread[0]];
    int n_top = 0, n = 0;
    int prc = planned(q, rows, &n_top, err);
    if (prc)
        return prc;
    n = n_top;
    for (int i = 0; i < n_spread; i++) {
        int dup = 0;
        for (int k = 0; k < n_top && !dup; k++)
            dup = same_layout(&rows[k], &spread[i]);
        if (!dup)
            rows[n++] = spread[i];
    }
    char (*labels)[96] = calloc((size_t)n, sizeof *labels);
    const char **lp = calloc((size_t)n, sizeof *lp);
    double *pred = calloc((size_t)n, sizeof *pred), *meas = calloc((size_t)n, sizeof *meas);
    char *table = NULL;
    size_t table_len = 0;
    FILE *tf = open_memstream(&table, &table_len);
    cJSON *out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "model", q->base.model.name);
    cJSON_AddStringToObject(out, "cluster", q->cluster->name);
    cJSON *layouts = cJSON_AddArrayToObject(out, "layouts");
    int rc = PX_OK, n_timed = 0, pick = 0, pick_pp = 0, n_loss = 0, loss_steps = 0;
    double first_lo = 0, first_hi = 0, last_lo = 0, last_hi = 0;
    if (!labels || !lp || !pred || !meas || !tf) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory");
        goto out;
    }
    fprintf(tf, "%3s %5s  %-50s %11s %11s %8s %9s %7s %7s\n", "#", "ranks", "layout", "predicted",
            "measured", "error", "ops<15%", "memory", "comm");
    if (log)
        fprintf(log, "%3s %5s  %-50s %11s %11s %8s %9s %7s %7s\n", "#", "ranks", "layout", "predicted",
                "measured", "error", "ops<15%", "memory", "comm");
    for (int i = 0; i < n; i++) {
        const Layout *L = &rows[i];
        const int ranks = L->dp * L->tp * L->pp, timing = ranks <= q->max_timing_ranks;
        if (!timing && ranks > q->max_ranks)
            continue;
        ModelSpec s = q->base;
        s.layout.dp = L->dp;
        s.layout.tp = L->tp;
        s.layout.pp = L->pp;
        s.layout.vpp = L->vpp;
        s.layout.zero = L->zero;
        s.layout.sp = L->sp;
        s.layout.recompute = (ModelRecompute)L->recompute;
        s.layout.schedule = (ModelSchedule)L->schedule;
        s.job.micro_batch = L->mbs;
        ModelSpec probe = s;
        ModelDims d;
        PxError e2 = {0};
        if (model_spec_check(&probe, ranks, &d, &e2))
            continue; /* the model does not take this layout */
        SimResult r;
        if ((rc = sim_run(&s, q->cluster, ranks, &r, err)))
            goto out;
        ModelPlan plan;
        rc = sim_plan_make(&r, q->cluster_ref, &plan, err);
        sim_result_free(&r);
        if (rc)
            goto out;
        char plan_path[1200], run_path[1200], log_path[1200], steps[16];
        snprintf(plan_path, sizeof plan_path, "%s/plan-%02d.json", q->dir, i + 1);
        snprintf(run_path, sizeof run_path, "%s/run-%02d.json", q->dir, i + 1);
        snprintf(log_path, sizeof log_path, "%s/run-%02d.log", q->dir, i + 1);
        snprintf(steps, sizeof steps, "%d", timing ? q->steps : 3);
        cJSON *pj = model_plan_to_json(&plan);
        model_plan_free(&plan);
        char *lay = labels[i];
        char vpp[16] = "";
        if (L->vpp > 1)
            snprintf(vpp, sizeof vpp, " vpp%d", L->vpp);
        snprintf(lay, sizeof labels[i], "%sdp%d tp%d pp%d%s%s zero%d mbs%d %s %s",
                 i < n_top ? "plan: " : "", L->dp, L->tp, L->pp, vpp, L->sp ? " sp" : "", L->zero,
                 L->mbs, model_recompute_name((ModelRecompute)L->recompute),
                 model_schedule_name((ModelSchedule)L->schedule));
        if (log)
            fprintf(log, "%3d %5d  %-50s ", i + 1, ranks, lay), fflush(log);
        char *argv[] = {(char *)q->parallax, "run", plan_path, "--steps", steps, "-o", run_path, NULL};
        cJSON *run = NULL;
        if ((rc = px_json_write_file(plan_path, pj, err)) || (rc = run_child(argv, log_path, err)) ||
            !(run = px_json_read_file(run_path, err))) {
            if (!rc)
                rc = PX_ERUNTIME;
            cJSON_Delete(pj);
            goto out;
        }
        /* the run trained for real: its first and last losses */
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(run, "steps");
        const int n_steps = cJSON_GetArraySize(st);
        const double loss0 = n_steps ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                                           cJSON_GetArrayItem(st, 0), "loss"))
                                     : NAN;
        const double loss1 = n_steps ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                                           cJSON_GetArrayItem(st, n_steps - 1), "loss"))
                                     : NAN;
        RptCompare c;
        rc = rpt_compare(pj, run, &c, err);
        cJSON_Delete(pj);
        cJSON_Delete(run);
        if (rc)
            goto out;
        int mem_equal = 1, comm_equal = 1, ops = 0, ops_ok = 0;
        const double step_p = c.rows[0].predicted, step_m = c.rows[0].measured, e = c.rows[0].rel_error;
        for (int k = 0; k < c.count; k++) {
            const RptDelta *dl = &c.rows[k];
            if (strncmp(dl->quantity, "memory", 6) == 0 && dl->predicted != dl->measured)
                mem_equal = 0;
            if (strncmp(dl->quantity, "comm", 4) == 0 && dl->predicted != dl->measured)
                comm_equal = 0;
            if (strncmp(dl->quantity, "op ", 3) == 0 && dl->predicted >= 0.01 * step_p) {
                ops++;
                ops_ok += fabs(dl->rel_error) <= 0.15;
            }
        }
        cJSON *lj = cJSON_CreateObject();
        cJSON_AddNumberToObject(lj, "index", i + 1);
        cJSON_AddStringToObject(lj, "layout", lay);
        cJSON_AddNumberToObject(lj, "ranks", ranks);
        cJSON_AddBoolToObject(lj, "timing", timing);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(lj, "predicted"), "step_s", step_p);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(lj, "measured"), "step_s", step_m);
        if (timing) {
            cJSON_AddNumberToObject(lj, "step_error", e);
            cJSON_AddNumberToObject(lj, "ops_over_1pct", ops);
            cJSON_AddNumberToObject(lj, "ops_within_15pct", ops_ok);
        }
        cJSON_AddNumberToObject(lj, "steps", n_steps);
        if (isfinite(loss0) && isfinite(loss1)) {
            cJSON_AddNumberToObject(lj, "loss_first", loss0);
            cJSON_AddNumberToObject(lj, "loss_last", loss1);
        }
        if (timing && isfinite(loss0) && isfinite(loss1)) {
            if (!n_loss++) {
                loss_steps = n_steps;
                first_lo = first_hi = loss0;
                last_lo = last_hi = loss1;
            }
            first_lo = fmin(first_lo, loss0), first_hi = fmax(first_hi, loss0);
            last_lo = fmin(last_lo, loss1), last_hi = fmax(last_hi, loss1);
            loss_steps = n_steps < loss_steps ? n_steps : loss_steps;
        }
        cJSON_AddBoolToObject(lj, "memory_equal", mem_equal);
        cJSON_AddBoolToObject(lj, "comm_equal", comm_equal);
        cJSON_AddItemToObject(lj, "compare", rpt_compare_to_json(&c));
        cJSON_AddItemToArray(layouts, lj);
        rpt_compare_free(&c);
        char es[32] = "-", os[32] = "-", ms[32] = "(not timed)";
        if (timing) {
            snprintf(es, sizeof es, "%+.1f%%", 100 * e);
            snprintf(os, sizeof os, "%d/%d", ops_ok, ops);
            snprintf(ms, sizeof ms, "%.4f", step_m);
            lp[n_timed] = lay;
            pred[n_timed] = 1e3 * step_p;
            meas[n_timed] = 1e3 * step_m;
            n_timed++;
            /* the report's detailed pages show the deepest pipeline that was timed (its
                 * timelines say the most), the first of them */
            if (L->pp > pick_pp || !pick) {
                pick = i + 1;
                pick_pp = L->pp;
            }
        }
        char line[256];
        snprintf(line, sizeof line, "%11.4f %11s %8s %9s %7s %7s\n", step_p, ms, es, os,
                 mem_equal ? "equal" : "DIFFER", comm_equal ? "equal" : "DIFFER");
        fprintf(tf, "%3d %5d  %-50s %s", i + 1, ranks, lay, line);
        if (log)
            fputs(line, log);
    }
    /* every layout trains the same trajectory: say where it went */
    if (n_loss > 0) {
        char first[48], last[48], line[192];
        snprintf(first, sizeof first, first_hi - first_lo < 5e-5 ? "%.4f" : "%.4f to %.4f",
                 first_lo, first_hi);
        snprintf(last, sizeof last, last_hi - last_lo < 5e-5 ? "%.4f" : "%.4f to %.4f", last_lo,
                 last_hi);
        snprintf(line, sizeof line, "training: loss %s at step 1, %s at step %d, on each of the %d "
                 "timed layouts\n", first, last, loss_steps, n_loss);
        fputs(line, tf);
        if (log)
            fputs(line, log);
    }
    fclose(tf);
    tf = NULL;
    RptOutput o = {q->dir};
    if (n_timed > 0 && (rc = rpt_compare_bars(&o, "validation", "step time: predicted against measured",
                                              "milliseconds per step", lp, pred, meas, n_timed, err)))
        goto out;
    {
        /* the report: the validation chart and table, then one layout's full comparison */
        char plan_path[1200], run_path[1200];
        snprintf(plan_path, sizeof plan_path, "%s/plan-%02d.json", q->dir, pick ? pick : 1);
        snprintf(run_path, sizeof run_path, "%s/run-%02d.json", q->dir, pick ? pick : 1);
        cJSON *pj = px_json_read_file(plan_path, err), *rj = pj ? px_json_read_file(run_path, err) : NULL;
        char *text = malloc(table_len + 64);
        if (text)
            snprintf(text, table_len + 64, "```\n%s```", table);
        RptSection sec = {"Validation: predicted against measured", n_timed > 0 ? "validation" : NULL, text};
        RptRequest rq = {.dir = q->dir, .title = "parallax validation", .plan = pj, .run = rj,
                         .base = &q->base, .cluster = q->cluster, .gpus = q->scaling_gpus,
                         .n_gpus = q->n_scaling_gpus, .landscape = q->n_scaling_gpus > 0,
                         .extra = &sec, .n_extra = 1};
        rc = pj && rj ? rpt_build(&rq, NULL, err) : PX_ERUNTIME;
        free(text);
        cJSON_Delete(pj);
        cJSON_Delete(rj);
        if (rc)
            goto out;
    }
    *json_out = out;
    out = NULL;
out:
    if (tf)
        fclose(tf);
    free(table);
    free(labels);
    free(lp);
    free(pred);
    free(meas);
    cJSON_Delete(out);
    return rc;
}
