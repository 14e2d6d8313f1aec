/* Measurement: every op timed under its op-graph name, FLOPs counted from the kernel calls
 * made inside it, and the run's JSON (DESIGN.md's Run). */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "exec/internal.h"

double exec_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void exec_sample_device_memory(Exec *ex)
{
    size_t fb = 0, tb = 0;
    if (!ex->have_dev_mem || !ex->k->mem_info(&fb, &tb))
        return;
    if (tb - fb > ex->dev_used_peak)
        ex->dev_used_peak = tb - fb;
}

int exec_device_memory(const Exec *ex, uint64_t *used_start, uint64_t *used_peak, uint64_t *total)
{
    *used_start = ex->dev_used_start;
    *used_peak = ex->dev_used_peak;
    *total = ex->dev_total;
    return ex->have_dev_mem;
}

double exec_loss_scale(const Exec *ex, long *skipped)
{
    if (skipped)
        *skipped = ex->scaler.skipped;
    return ex->scaler.scale;
}

void exec_op_begin(Exec *ex, int op)
{
    ex->cur_op = op;
    ex->cur_counts = 1;
    ex->k->sync();
    ex->op_t0 = exec_now();
}

void exec_op_resume(Exec *ex, int op)
{
    exec_op_begin(ex, op);
    ex->cur_counts = 0;
}

void exec_op_end(Exec *ex)
{
    ex->k->sync();
    double dt = exec_now() - ex->op_t0;
    if (ex->cur_op >= 0) {
        ExecOpStat *o = &ex->ops[ex->cur_op];
        o->step_s += dt;
        o->step_calls += ex->cur_counts;
    }
    ex->cur_op = -1;
}

void exec_count_flops(Exec *ex, double flops)
{
    if (ex->cur_op >= 0)
        ex->ops[ex->cur_op].step_flops += flops;
    else
        ex->unattributed_flops += flops;
}

void exec_ops_step_begin(Exec *ex)
{
    for (int i = 0; i < ex->graph.count; i++) {
        ExecOpStat *o = &ex->ops[i];
        o->step_calls = o->step_flops = o->step_s = 0;
    }
    ex->unattributed_flops = 0;
}

/* Timed steps exclude the first of a run (page faults, BLAS warm-up) unless it is the only one. */
void exec_ops_step_end(Exec *ex, int timed)
{
    for (int i = 0; i < ex->graph.count; i++) {
        ExecOpStat *o = &ex->ops[i];
        o->last_calls = o->step_calls;
        o->last_flops = o->step_flops;
        if (timed)
            o->timed_s += o->step_s;
    }
    if (timed)
        ex->timed_steps++;
}

double exec_step_flops(const Exec *ex)
{
    double f = ex->unattributed_flops;
    for (int i = 0; i < ex->graph.count; i++)
        f += ex->ops[i].last_flops;
    return f;
}

double exec_unattributed_flops(const Exec *ex) { return ex->unattributed_flops; }

const ExecOpReport *exec_ops(Exec *ex, int *n)
{
    int k = 0;
    for (int i = 0; i < ex->graph.count; i++) {
        const ExecOpStat *o = &ex->ops[i];
        ExecOpReport *r = &ex->report[k++];
        r->name = o->name;
        r->calls = o->last_calls;
        r->flops = o->last_flops;
        r->seconds = ex->timed_steps > 0 ? o->timed_s / ex->timed_steps : o->step_s;
    }
    *n = k;
    return ex->report;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median step time over the timed steps (all but the first when there are several). */
static double median_step(const Exec *ex)
{
    int first = ex->steps_done > 1 ? 1 : 0, n = ex->steps_done - first;
    if (n <= 0)
        return 0;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t)
        return 0;
    memcpy(t, ex->step_time + first, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

double exec_median_step_s(const Exec *ex) { return median_step(ex); }

void exec_bubble_of_step(const Exec *ex, double *busy_s, double *idle_s)
{
    double busy = 0, end = 0;
    if (ex->have_events)
        for (int i = 0; i < ex->n_actions; i++) {
            const ExecEvent *e = &ex->last_events[i];
            busy += e->end_s - e->start_s;
            if (e->end_s > end)
                end = e->end_s;
        }
    /* idle: the time from the step's start to the stage's last pass that no pass used, as
     * the simulator counts a stage's bubble */
    *busy_s = busy;
    *idle_s = end > busy ? end - busy : 0;
}

double exec_bubble(const Exec *ex, double *busy_s, double *idle_s)
{
    double busy, idle;
    exec_bubble_of_step(ex, &busy, &idle);
    if (busy_s)
        *busy_s = busy;
    if (idle_s)
        *idle_s = idle;
    const int n = ex->n_bubbles;
    if (n == 0)
        return busy > 0 ? idle / busy : 0;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t)
        return busy > 0 ? idle / busy : 0;
    memcpy(t, ex->step_bubble, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

/* This rank's figures: memory, communication and FLOPs per step, ops, the recorded step's
 * passes. */
static cJSON *rank_json(Exec *ex)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "rank", comm_rank(ex->comm));
    cJSON_AddNumberToObject(r, "stage", ex->stage);

    uint64_t mem[MODEL_CAT_COUNT], total = 0;
    exec_memory(ex, mem);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        total += mem[c];
    cJSON *m = cJSON_AddObjectToObject(r, "memory");
    cJSON_AddNumberToObject(m, "rank", comm_rank(ex->comm));
    cJSON_AddNumberToObject(m, "stage", ex->stage);
    cJSON_AddNumberToObject(m, "peak_bytes", (double)total);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        cJSON_AddNumberToObject(m, model_category_name((ModelCategory)c), (double)mem[c]);
    /* runtime is not measured: it is the profile's allowance for the process image and
     * libraries; the process's real peak resident size is given beside it */
    cJSON_AddStringToObject(m, "runtime_source", "profile");
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        cJSON_AddNumberToObject(m, "process_peak_rss_bytes", (double)ru.ru_maxrss * 1024.0);
    cJSON_AddNumberToObject(m, "activation_sets", ex->peak_live);
    cJSON_AddNumberToObject(m, "activations_in_use_peak", (double)exec_activations_in_use_peak(ex));
    /* the peak two ways: the arenas (every category but runtime, allocated once) and the
     * device's own account (cudaMemGetInfo), which adds the CUDA context, cuBLAS's workspace,
     * NCCL's buffers and anything else the process holds on the device */
    cJSON_AddNumberToObject(m, "arena_bytes", (double)(total - mem[MODEL_RUNTIME]));
    uint64_t u0, up, ut;
    if (exec_device_memory(ex, &u0, &up, &ut)) {
        cJSON_AddStringToObject(m, "device_source", "cudaMemGetInfo");
        cJSON_AddNumberToObject(m, "device_used_peak_bytes", (double)up);
        cJSON_AddNumberToObject(m, "device_used_before_arenas_bytes", (double)u0);
        cJSON_AddNumberToObject(m, "device_total_bytes", (double)ut);
    }

    cJSON *c0 = cJSON_AddObjectToObject(r, "comm");
    cJSON_AddNumberToObject(c0, "rank", comm_rank(ex->comm));
    cJSON_AddNumberToObject(c0, "stage", ex->stage);
    uint64_t ctot = 0;
    cJSON *kinds = cJSON_CreateObject();
    for (int k = 0; k < MODEL_COMM_COUNT; k++) {
        ctot += ex->step_bytes[k];
        cJSON_AddNumberToObject(kinds, model_comm_name((ModelComm)k), (double)ex->step_bytes[k]);
    }
    cJSON_AddNumberToObject(c0, "total_bytes", (double)ctot);
    cJSON_AddItemToObject(c0, "by_kind", kinds);

    cJSON_AddNumberToObject(r, "flops", exec_step_flops(ex));
    int n = 0;
    const ExecOpReport *ops = exec_ops(ex, &n);
    cJSON *oa = cJSON_AddArrayToObject(r, "ops");
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", ops[i].name);
        cJSON_AddNumberToObject(o, "stage", ex->stage);
        cJSON_AddNumberToObject(o, "calls", ops[i].calls);
        cJSON_AddNumberToObject(o, "seconds", ops[i].seconds);
        cJSON_AddNumberToObject(o, "flops", ops[i].flops);
        cJSON_AddItemToArray(oa, o);
    }

    cJSON *tl = cJSON_AddObjectToObject(r, "timeline");
    cJSON_AddNumberToObject(tl, "rank", comm_rank(ex->comm));
    cJSON_AddNumberToObject(tl, "stage", ex->stage);
    double busy, idle, bubble = exec_bubble(ex, &busy, &idle);
    cJSON_AddNumberToObject(tl, "busy_s", busy);
    cJSON_AddNumberToObject(tl, "idle_s", idle);
    cJSON_AddNumberToObject(tl, "bubble_fraction", bubble);
    cJSON *ev = cJSON_AddArrayToObject(tl, "events");
    for (int i = 0; ex->have_events && i < ex->n_actions; i++) {
        const ExecEvent *e = &ex->last_events[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "chunk", e->chunk);
        cJSON_AddNumberToObject(o, "mb", e->mb);
        cJSON_AddBoolToObject(o, "backward", e->backward);
        cJSON_AddNumberToObject(o, "start_s", e->start_s);
        cJSON_AddNumberToObject(o, "end_s", e->end_s);
        cJSON_AddItemToArray(ev, o);
    }
    return r;
}

static cJSON *detach(cJSON *obj, const char *key)
{
    return cJSON_DetachItemFromObjectCaseSensitive(obj, key);
}

/* The run (DESIGN.md's Run) from every rank's figures, in rank order. */
static cJSON *run_json(Exec *ex, cJSON *const *ranks, int n)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "schema_version", 1);
    cJSON_AddItemToObject(j, "plan", model_plan_to_json(&ex->plan));
    cJSON_AddStringToObject(j, "plan_path", ex->plan_path);

    cJSON *be = cJSON_AddObjectToObject(j, "backend");
    char host[256] = "unknown";
    if (gethostname(host, sizeof host - 1) != 0)
        px_strlcpy(host, "unknown", sizeof host);
    host[sizeof host - 1] = '\0';
    cJSON_AddStringToObject(be, "compute", ex->k->name);
    cJSON_AddStringToObject(be, "precision", px_dtype_name(ex->act));
    if (ex->device_name[0])
        cJSON_AddStringToObject(be, "device", ex->device_name);
    cJSON_AddStringToObject(be, "comm", comm_name(ex->comm));
    if (ex->comm_note)
        cJSON_AddStringToObject(be, "comm_note", ex->comm_note);
    cJSON_AddNumberToObject(be, "world", comm_world(ex->comm));
    cJSON_AddStringToObject(be, "host", host);

    cJSON *steps = cJSON_AddArrayToObject(j, "steps");
    for (int i = 0; i < ex->steps_done; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "step", ex->first_step + i + 1);
        cJSON_AddNumberToObject(s, "loss", ex->step_loss[i]);
        cJSON_AddNumberToObject(s, "time_s", ex->step_time[i]);
        cJSON_AddNumberToObject(s, "tokens_per_s", ex->step_tps[i]);
        if (ex->scaler.enabled) {
            cJSON_AddNumberToObject(s, "loss_scale", ex->step_scale[i]);
            cJSON_AddBoolToObject(s, "skipped", ex->step_skipped[i]);
        }
        cJSON_AddItemToArray(steps, s);
    }
    cJSON_AddBoolToObject(j, "interrupted", ex->interrupted);
    /* a loss or gradient norm that was not finite stopped the run at this step (not in steps) */
    if (ex->stopped_step > 0)
        cJSON_AddNumberToObject(j, "diverged_at_step", ex->stopped_step);
    exec_ckpt_json(ex, j);
    if (ex->scaler.enabled) {
        cJSON *ls = cJSON_AddObjectToObject(j, "loss_scale");
        cJSON_AddNumberToObject(ls, "final", ex->scaler.scale);
        cJSON_AddNumberToObject(ls, "skipped_steps", (double)ex->scaler.skipped);
        cJSON_AddNumberToObject(ls, "growth_interval", ex->scaler.interval);
    }

    cJSON *mr = cJSON_AddArrayToObject(cJSON_AddObjectToObject(j, "memory"), "per_rank");
    cJSON *cr = cJSON_AddArrayToObject(cJSON_AddObjectToObject(j, "comm"), "per_rank");
    cJSON *oa = cJSON_AddArrayToObject(j, "ops");
    cJSON *opr = n > 1 ? cJSON_AddArrayToObject(j, "ops_per_rank") : NULL;
    cJSON *fr = cJSON_AddArrayToObject(cJSON_AddObjectToObject(j, "flops"), "per_rank_per_step");
    cJSON *tl = ex->d.p > 1 ? cJSON_AddArrayToObject(j, "timeline") : NULL;
    double crit_end = -1, crit_bubble = 0;
    int *stage_seen = calloc((size_t)ex->d.p, sizeof *stage_seen);
    for (int i = 0; i < n; i++) {
        cJSON *r = ranks[i];
        int rank = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "rank"));
        int stage = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "stage"));
        cJSON_AddItemToArray(mr, detach(r, "memory"));
        cJSON_AddItemToArray(cr, detach(r, "comm"));
        cJSON_AddItemToArray(fr, detach(r, "flops"));
        cJSON *ops = detach(r, "ops");
        /* ops[]: one rank per stage (the stage's first), so that the names compare with the
         * prediction's ops of that stage; ops_per_rank[]: all of them */
        if (stage_seen && stage >= 0 && stage < ex->d.p && !stage_seen[stage]) {
            stage_seen[stage] = 1;
            cJSON *o;
            cJSON_ArrayForEach(o, ops)
            {
                cJSON *c = cJSON_Duplicate(o, 1);
                cJSON_AddNumberToObject(c, "rank", rank);
                cJSON_AddItemToArray(oa, c);
            }
        }
        if (opr) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rank", rank);
            cJSON_AddNumberToObject(e, "stage", stage);
            cJSON_AddItemToObject(e, "ops", ops);
            cJSON_AddItemToArray(opr, e);
        } else {
            cJSON_Delete(ops);
        }
        cJSON *t = detach(r, "timeline");
        const cJSON *evs = cJSON_GetObjectItemCaseSensitive(t, "events");
        double end = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, evs)
        {
            double x = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "end_s"));
            if (x > end)
                end = x;
        }
        /* the run's bubble is the one of the rank that ends its pipeline last, as the
         * simulator reports the stage that ends the step */
        if (end > crit_end) {
            crit_end = end;
            crit_bubble = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(t, "bubble_fraction"));
        }
        if (tl)
            cJSON_AddItemToArray(tl, t);
        else
            cJSON_Delete(t);
    }
    free(stage_seen);

    cJSON *tm = cJSON_AddObjectToObject(j, "time");
    cJSON_AddNumberToObject(tm, "step_s_median", median_step(ex));
    /* one stage: no pipeline, no bubble */
    cJSON_AddNumberToObject(tm, "bubble_fraction", ex->d.p > 1 ? crit_bubble : 0.0);
    cJSON_AddNumberToObject(tm, "timed_steps", ex->timed_steps);
    return j;
}

cJSON *exec_run_to_json(Exec *ex)
{
    cJSON *r = rank_json(ex);
    cJSON *j = run_json(ex, &r, 1);
    cJSON_Delete(r);
    return j;
}

int exec_run_gather_json(Exec *ex, cJSON **out, PxError *err)
{
    *out = NULL;
    cJSON *r = rank_json(ex);
    char *text = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (!text)
        return px_fail(err, PX_ERUNTIME, "out of memory writing rank %d's figures", comm_rank(ex->comm));
    char **all = NULL;
    int rc = comm_gather_text(ex->comm, text, &all, err);
    free(text);
    if (rc || !all)
        return rc;
    const int W = comm_world(ex->comm);
    cJSON **ranks = calloc((size_t)W, sizeof *ranks);
    for (int i = 0; i < W; i++) {
        if (ranks && !(ranks[i] = cJSON_Parse(all[i])))
            rc = px_fail(err, PX_ERUNTIME, "rank %d's figures do not parse", i);
        free(all[i]);
    }
    free(all);
    if (!ranks)
        return px_fail(err, PX_ERUNTIME, "out of memory gathering the ranks' figures");
    if (!rc)
        *out = run_json(ex, ranks, W);
    for (int i = 0; i < W; i++)
        cJSON_Delete(ranks[i]);
    free(ranks);
    return rc;
}
