/* Rendering planner results: the ranked table with what makes each layout win, the rejection
 * summary, JSON, the plan file of the winner, sweeps and --min-gpus answers, and the progress
 * bar of a long search. */
#include "sim/internal.h"

#include <stdlib.h>
#include <string.h>

/* " (layers 1,2,1)" for an uneven split, else "" */
static void split_text(char *buf, size_t cap, const ModelLayout *l)
{
    buf[0] = '\0';
    if (l->n_stage_layers > 0 && cap > 12) {
        snprintf(buf, cap, " (layers ");
        model_split_describe(l, buf + 9, cap - 10);
        strcat(buf, ")");
    }
}

static void layout_text(char *buf, size_t cap, const ModelSpec *s)
{
    const ModelLayout *l = &s->layout;
    char split[80];
    split_text(split, sizeof split, l);
    char experts[40] = "";
    if (s->model.moe.experts > 0)
        snprintf(experts, sizeof experts, " ep %d etp %d", l->ep, l->etp);
    snprintf(buf, cap, "tp %d pp %d%s dp %d cp %d%s vpp %d zero %d sp %s mbs %d %s %s%s%s", l->tp, l->pp,
             split, l->dp, l->cp, experts, l->vpp, l->zero, l->sp ? "on" : "off", s->job.micro_batch,
             model_recompute_name(l->recompute), model_schedule_name(l->schedule),
             l->offload_optimizer ? " offload-opt" : "", l->offload_activations ? " offload-act" : "");
}

/* What sets a layout apart within the top k: the parts of the step where it is the best of
 * them, and the choices that buy it. */
static void why(char *buf, size_t cap, const SimPlanResult *r, int i)
{
    const SimCandidate *c = &r->top[i];
    buf[0] = '\0';
    double least[5] = {1e300, 1e300, 1e300, 1e300, 1e300};
    for (int k = 0; k < r->n_top; k++) {
        const SimCandidate *o = &r->top[k];
        double v[5] = {o->compute_s, o->tp_comm_s, o->bubble_fraction + o->pp_comm_s / o->step_s,
                       o->dp_comm_exposed_s, (double)o->peak_bytes};
        for (int q = 0; q < 5; q++)
            if (v[q] < least[q])
                least[q] = v[q];
    }
    double mine[5] = {c->compute_s, c->tp_comm_s, c->bubble_fraction + c->pp_comm_s / c->step_s,
                      c->dp_comm_exposed_s, (double)c->peak_bytes};
    static const char *const what[5] = {"least compute", "least TP comm", "smallest bubble",
                                        "least DP comm", "least memory"};
    size_t n = 0;
    for (int q = 0; q < 5 && r->n_top > 1; q++) {
        if (mine[q] <= least[q] * (1 + 1e-9))
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", what[q]);
    }
    const ModelLayout *l = &c->spec.layout;
    if (l->recompute == MODEL_RECOMPUTE_NONE)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%sno recompute", n ? "; " : "");
    else if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%sselective recompute fits", n ? "; " : "");
    if (l->offload_optimizer || l->offload_activations)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%soffload %s%s%s to fit", n ? "; " : "",
                              l->offload_optimizer ? "optimizer" : "",
                              l->offload_optimizer && l->offload_activations ? " and " : "",
                              l->offload_activations ? "activations" : "");
    if (l->n_stage_layers > 0) {
        char split[160];
        model_split_describe(l, split, sizeof split);
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%sstage layers %s", n ? "; " : "", split);
    }
    if (i > 0 && r->top[0].step_s > 0)
        snprintf(buf + n, n < cap ? cap - n : 0, "%s+%.1f%% step", n ? "; " : "",
                 100.0 * (c->step_s / r->top[0].step_s - 1.0));
}

/* Days and GPU-hours to train on the job's tokens (--tokens) at c's pace on `gpus` GPUs:
 * "  53.1 days, 1.30 M GPU-hours", or "" without a token budget. */
static void train_text(char *buf, size_t cap, const SimCandidate *c, int gpus)
{
    buf[0] = '\0';
    const double tokens = c->spec.job.train_tokens;
    if (!(tokens > 0) || !(c->tokens_per_s > 0))
        return;
    const double days = tokens / c->tokens_per_s / 86400.0;
    char hours[32];
    snprintf(buf, cap, "  %.1f days, %s GPU-hours", days, px_fmt_count(hours, sizeof hours, days * 24.0 * gpus));
}

/* The candidate's days and GPU-hours for the job's tokens into a JSON row (none without). */
static void train_json(cJSON *e, const SimCandidate *c, int gpus)
{
    const double tokens = c->spec.job.train_tokens;
    if (!(tokens > 0) || !(c->tokens_per_s > 0))
        return;
    const double days = tokens / c->tokens_per_s / 86400.0;
    cJSON_AddNumberToObject(e, "train_tokens", tokens);
    cJSON_AddNumberToObject(e, "days", days);
    cJSON_AddNumberToObject(e, "gpu_hours", days * 24.0 * gpus);
}

void sim_plan_print(FILE *f, const SimPlanRequest *q, const ProfCluster *cl,
                    const SimPlanResult *r, int explain)
{
    const ModelSpec *b = &q->base;
    int seq = b->job.seq_len > 0 ? b->job.seq_len : b->model.seq_len;
    fprintf(f, "%s on %s: %d x %s, global batch %d, sequence %d, objective %s\n", b->model.name,
            cl->name, q->gpus, cl->device.name, b->job.global_batch, seq,
            sim_objective_name(q->objective));
    if (b->job.framework != MODEL_FW_MEGATRON) /* ranked as that framework runs them */
        fprintf(f, "framework %s\n", model_framework_name(b->job.framework));
    fprintf(f, "searched %ld layouts in %.2f s: %ld feasible, %ld timed in full (the rest cannot beat them)\n\n",
            r->considered, r->seconds, r->feasible, r->timed);
    const int moe = b->model.moe.experts > 0;
    int cp = 0; /* the context-parallel comm type's column, where a layout has cp */
    for (int i = 0; i < r->n_top; i++)
        cp |= r->top[i].spec.layout.cp > 1;
    fprintf(f, "%3s %3s %3s %4s %3s ", "#", "tp", "pp", "dp", "cp");
    if (cp)
        fprintf(f, "%-9s ", "cp comm");
    if (moe)
        fprintf(f, "%4s %3s ", "ep", "etp");
    fprintf(f, "%3s %4s %3s %4s %-9s %-11s %8s %10s %6s %8s %7s  %s\n", "vpp", "zero", "sp", "mbs",
            "recompute", "schedule", "step s", "tokens/s", "MFU", "mem GiB", "bubble", "why");
    for (int i = 0; i < r->n_top; i++) {
        const SimCandidate *c = &r->top[i];
        const ModelLayout *l = &c->spec.layout;
        char w[256];
        why(w, sizeof w, r, i);
        /* the simulated bubble of a pipeline-less step can come out a rounding error below zero */
        const double bubble = c->bubble_fraction > 0 ? c->bubble_fraction : 0;
        fprintf(f, "%3d %3d %3d %4d %3d ", i + 1, l->tp, l->pp, l->dp, l->cp);
        if (cp)
            fprintf(f, "%-9s ", l->cp > 1 ? model_cp_comm_name(l->cp_comm) : "-");
        if (moe)
            fprintf(f, "%4d %3d ", l->ep, l->etp);
        fprintf(f, "%3d %4d %3s %4d %-9s %-11s %8.3f %10.0f %5.1f%% %8.2f %6.1f%%  %s\n",
                l->vpp, l->zero, l->sp ? "on" : "off",
                c->spec.job.micro_batch, model_recompute_name(l->recompute),
                model_schedule_name(l->schedule), c->step_s, c->tokens_per_s, 100 * c->mfu,
                (double)c->peak_bytes / PX_GIB, 100 * bubble, w);
    }
    if (b->job.train_tokens > 0 && r->n_top > 0 && r->top[0].tokens_per_s > 0) {
        char tokens[32], train[80];
        train_text(train, sizeof train, &r->top[0], q->gpus);
        fprintf(f, "\n%s tokens with layout 1:%s\n", px_fmt_count(tokens, sizeof tokens, b->job.train_tokens),
                train + 1);
    }
    long rejected = 0;
    for (int i = 0; i < SIM_REJECT_COUNT; i++)
        rejected += r->rejected[i];
    fprintf(f, "\nrejected %ld of %ld%s\n", rejected, r->considered, rejected ? ":" : "");
    for (int i = 0; i < SIM_REJECT_COUNT; i++) {
        if (!r->rejected[i])
            continue;
        fprintf(f, "  %9ld  %s\n", r->rejected[i], sim_reject_name(i));
        if (explain)
            fprintf(f, "             e.g. %s\n", r->example[i]);
    }
    if (!explain && rejected)
        fprintf(f, "(--explain shows an example of each)\n");
}

void sim_plan_summary_line(char *buf, size_t cap, const SimPlanResult *r)
{
    if (r->n_top == 0) {
        snprintf(buf, cap, "no layout");
        return;
    }
    const SimCandidate *c = &r->top[0];
    char lay[384]; /* room for every figure at its widest: nothing is cut */
    layout_text(lay, sizeof lay, &c->spec);
    snprintf(buf, cap, "%-62s %8.3f s %10.0f tok/s %5.1f%% MFU %7.2f GiB", lay, c->step_s,
             c->tokens_per_s, 100 * c->mfu, (double)c->peak_bytes / PX_GIB);
}

cJSON *sim_plan_search_json(const SimPlanResult *r)
{
    cJSON *s = cJSON_CreateObject();
    cJSON_AddNumberToObject(s, "considered", (double)r->considered);
    cJSON_AddNumberToObject(s, "evaluated", (double)r->evaluated);
    cJSON_AddNumberToObject(s, "feasible", (double)r->feasible);
    cJSON_AddNumberToObject(s, "timed", (double)r->timed);
    cJSON_AddNumberToObject(s, "seconds", r->seconds);
    cJSON *rej = cJSON_AddObjectToObject(s, "rejected");
    for (int i = 0; i < SIM_REJECT_COUNT; i++) {
        if (!r->rejected[i])
            continue;
        cJSON *e = cJSON_AddObjectToObject(rej, sim_reject_name(i));
        cJSON_AddNumberToObject(e, "count", (double)r->rejected[i]);
        cJSON_AddStringToObject(e, "example", r->example[i]);
    }
    cJSON *top = cJSON_AddArrayToObject(s, "top");
    for (int i = 0; i < r->n_top; i++) {
        const SimCandidate *c = &r->top[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "layout", model_layout_to_json(&c->spec.layout));
        cJSON_AddNumberToObject(e, "micro_batch", c->spec.job.micro_batch);
        cJSON_AddNumberToObject(e, "score", c->score);
        cJSON_AddNumberToObject(e, "step_s", c->step_s);
        cJSON_AddNumberToObject(e, "tokens_per_s", c->tokens_per_s);
        cJSON_AddNumberToObject(e, "mfu", c->mfu);
        cJSON_AddNumberToObject(e, "peak_bytes", (double)c->peak_bytes);
        if (c->spec.layout.offload_optimizer || c->spec.layout.offload_activations)
            cJSON_AddNumberToObject(e, "host_peak_bytes", (double)c->host_peak_bytes);
        cJSON_AddNumberToObject(e, "bubble_fraction", c->bubble_fraction);
        const ModelLayout *l = &c->spec.layout;
        train_json(e, c, l->tp * l->pp * l->cp * l->dp);
        cJSON_AddItemToArray(top, e);
    }
    return s;
}

cJSON *sim_plan_answer_json(const SimPlanResult *r, const ProfCluster *cl, int gpus,
                            const ModelPlan *plan, const SimResult *full)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "cluster", cl->name);
    cJSON_AddNumberToObject(j, "gpus", gpus);
    cJSON_AddItemToObject(j, "model", model_config_to_json(&plan->spec.model));
    cJSON_AddItemToObject(j, "training", model_job_to_json(&full->spec.job, &full->dims));
    cJSON_AddItemToObject(j, "layout", model_layout_to_json(&plan->spec.layout));
    cJSON_AddItemToObject(j, "prediction", cJSON_Duplicate(plan->prediction, 1));
    cJSON_AddItemToObject(j, "search", sim_plan_search_json(r));
    return j;
}

void sim_sweep_print(FILE *f, const SimPlanRequest *q, const SimSweep *s)
{
    const char *unit = sim_objective_unit(s->objective, s->priced);
    char tokens[32] = "";
    if (q->base.job.train_tokens > 0)
        px_fmt_count(tokens, sizeof tokens, q->base.job.train_tokens);
    fprintf(f, "%s, global batch %d: best layout per size; objective %s (%s)%s%s%s\n",
            q->base.model.name, q->base.job.global_batch, sim_objective_name(s->objective), unit,
            tokens[0] ? "; days and GPU-hours to train on " : "", tokens, tokens[0] ? " tokens" : "");
    for (int i = 0; i < s->n_rows; i++) {
        const SimSweepRow *row = &s->rows[i];
        char line[1200], value[48] = "", train[80] = "";
        if (row->ok)
            sim_plan_summary_line(line, sizeof line, &row->plan);
        else
            snprintf(line, sizeof line, "none: %s", row->error);
        if (row->ok && s->objective == SIM_OBJ_COST)
            snprintf(value, sizeof value, "  %10.4g", row->value);
        else if (row->ok && s->objective == SIM_OBJ_TOKENS_PER_GPU)
            snprintf(value, sizeof value, "  %10.0f", row->value);
        if (row->ok)
            train_text(train, sizeof train, &row->plan.top[0], row->gpus);
        fprintf(f, "%6d  %-10s %s%s%s%s\n", row->gpus, row->cluster->name, line, value, train,
                i == s->best && s->n_rows > 1 ? "  <- best" : "");
    }
    if (s->best >= 0 && s->n_rows > 1) {
        const SimSweepRow *b = &s->rows[s->best];
        fprintf(f, "best by %s: %d GPUs of %s, %.5g %s\n", sim_objective_name(s->objective),
                b->gpus, b->cluster->name, b->value, unit);
    }
}

cJSON *sim_sweep_to_json(const SimSweep *s)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < s->n_rows; i++) {
        const SimSweepRow *row = &s->rows[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "cluster", row->cluster->name);
        cJSON_AddNumberToObject(e, "gpus", row->gpus);
        if (row->ok) {
            cJSON_AddNumberToObject(e, "objective_value", row->value);
            train_json(e, &row->plan.top[0], row->gpus);
            cJSON_AddItemToObject(e, "search", sim_plan_search_json(&row->plan));
        } else {
            cJSON_AddStringToObject(e, "error", row->error);
        }
        cJSON_AddBoolToObject(e, "best", i == s->best);
        cJSON_AddItemToArray(arr, e);
    }
    return arr;
}

void sim_min_gpus_print(FILE *f, const ProfCluster *cl, int gpus, const SimPlanResult *r)
{
    char line[256], train[80] = "";
    sim_plan_summary_line(line, sizeof line, r);
    if (r->n_top > 0)
        train_text(train, sizeof train, &r->top[0], gpus);
    fprintf(f, "%s: fewest GPUs meeting the budget: %d\n  %s%s\n", cl->name, gpus, line, train);
}

cJSON *sim_min_gpus_to_json(const ProfCluster *cl, int gpus, const SimPlanResult *r)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "cluster", cl->name);
    cJSON_AddNumberToObject(e, "gpus", gpus);
    if (r->n_top > 0)
        train_json(e, &r->top[0], gpus);
    cJSON_AddItemToObject(e, "search", sim_plan_search_json(r));
    return e;
}

/* sim_progress_bar's lines: a search that outlasts 2 s says what it is doing as each phase
 * begins and every 10 s, and how long it took. */
static void progress_lines(SimProgressBar *p, double t, long done, long total, int phase)
{
    const char *what = p->what ? p->what : "search";
    if (p->first_s == 0)
        p->first_s = t;
    if (phase >= 3) {
        /* many short searches: a line every 2 s once the whole has run 2 s */
        if (t - p->first_s < 2.0 || t - p->told_s < 2.0)
            return;
        p->told_s = t;
        if (phase == 3)
            fprintf(p->f, "%s: %ld of %ld sizes and clusters planned (%.1f s)\n", what, done, total, t - p->first_s);
        else
            fprintf(p->f, "%s: %ld GPUs tried of at most %ld for the budget (%.1f s)\n", what, done, total,
                    t - p->first_s);
        fflush(p->f);
        return;
    }
    if (phase == 2) {
        if (p->shown)
            fprintf(p->f, "%s: search done in %.1f s\n", what, t - p->start_s);
        p->start_s = p->drawn_s = 0;
        p->shown = p->phase = 0;
        fflush(p->f);
        return;
    }
    if (t - p->start_s < 2.0 || (p->phase == phase + 1 && t - p->drawn_s < 10.0))
        return;
    p->phase = phase + 1;
    p->drawn_s = t;
    p->shown = 1;
    if (phase == 0)
        fprintf(p->f, "%s: %ld of %ld layouts checked against the rules and memory (%.1f s)\n", what, done,
                total, t - p->start_s);
    else
        fprintf(p->f, "%s: %ld of at most %ld feasible layouts bounded exactly or timed, best first (%.1f s)\n",
                what, done, total, t - p->start_s);
    fflush(p->f);
}

void sim_progress_bar(void *ctx, long done, long total, int phase)
{
    SimProgressBar *p = ctx;
    const double t = px_now_s();
    if (p->start_s == 0)
        p->start_s = t;
    if (p->lines) {
        progress_lines(p, t, done, total, phase);
        return;
    }
    if (phase >= 3) /* the bar follows each search of a sweep on its own */
        return;
    if (phase == 2) {
        if (p->shown)
            fputs("\r\033[K", p->f);
        p->start_s = p->drawn_s = 0;
        p->shown = 0;
        return;
    }
    if (t - p->start_s < 0.5 || t - p->drawn_s < 0.1)
        return;
    p->drawn_s = t;
    p->shown = 1;
    int width = 30, fill = total > 0 ? (int)(width * (double)done / (double)total) : 0;
    if (fill > width)
        fill = width;
    fprintf(p->f, "\r%s [%.*s%*s] %ld/%ld", phase ? "timing   " : "searching", fill,
            "##############################", width - fill, "", done, total);
    fflush(p->f);
}

int sim_plan_best(const SimPlanResult *r, const ProfCluster *cl, const char *cluster_ref,
                  int gpus, ModelPlan *plan, SimResult *full, PxError *err)
{
    memset(plan, 0, sizeof *plan);
    if (r->n_top == 0)
        return px_fail(err, PX_EINPUT, "no layout to write");
    int rc = sim_run(&r->top[0].spec, cl, gpus, full, err);
    if (rc)
        return rc;
    if ((rc = sim_plan_make(full, cluster_ref, plan, err)))
        sim_result_free(full);
    return rc;
}

int sim_plan_make(const SimResult *full, const char *cluster_ref, ModelPlan *plan, PxError *err)
{
    return model_plan_init(plan, &full->spec, cluster_ref, &full->cluster, full->dims.gpus,
                           sim_prediction_to_json(full), err);
}

int sim_plan_for(const ModelSpec *spec, const char *cluster, int gpus, ModelPlan *out,
                 PxError *err)
{
    memset(out, 0, sizeof *out);
    ProfCluster cl;
    int rc = prof_cluster_load(cluster, NULL, 0, &cl, err);
    if (rc)
        return rc;
    SimResult r;
    /* the result shares the cluster's measurements: free it after the result */
    if (!(rc = sim_run(spec, &cl, gpus, &r, err))) {
        rc = sim_plan_make(&r, cluster, out, err);
        sim_result_free(&r);
    }
    prof_cluster_free(&cl);
    return rc;
}
