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

void exec_op_begin(Exec *ex, int op)
{
    ex->cur_op = op;
    ex->k->sync();
    ex->op_t0 = exec_now();
}

void exec_op_end(Exec *ex)
{
    ex->k->sync();
    double dt = exec_now() - ex->op_t0;
    if (ex->cur_op >= 0) {
        ExecOpStat *o = &ex->ops[ex->cur_op];
        o->step_s += dt;
        o->step_calls += 1;
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

cJSON *exec_run_to_json(Exec *ex)
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
    cJSON_AddStringToObject(be, "comm", ex->comm->name);
    cJSON_AddNumberToObject(be, "world", ex->comm->world);
    cJSON_AddStringToObject(be, "host", host);

    cJSON *steps = cJSON_AddArrayToObject(j, "steps");
    for (int i = 0; i < ex->steps_done; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "step", i + 1);
        cJSON_AddNumberToObject(s, "loss", ex->step_loss[i]);
        cJSON_AddNumberToObject(s, "time_s", ex->step_time[i]);
        cJSON_AddNumberToObject(s, "tokens_per_s", ex->step_tps[i]);
        cJSON_AddItemToArray(steps, s);
    }
    cJSON_AddBoolToObject(j, "interrupted", ex->interrupted);

    uint64_t mem[MODEL_CAT_COUNT], total = 0;
    exec_memory(ex, mem);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        total += mem[c];
    cJSON *memory = cJSON_AddObjectToObject(j, "memory");
    cJSON *mr = cJSON_AddArrayToObject(memory, "per_rank");
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "rank", ex->comm->rank);
    cJSON_AddNumberToObject(r, "stage", ex->stage);
    cJSON_AddNumberToObject(r, "peak_bytes", (double)total);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        cJSON_AddNumberToObject(r, model_category_name((ModelCategory)c), (double)mem[c]);
    /* runtime is not measured: it is the profile's allowance for the process image and
     * libraries; the process's real peak resident size is given beside it */
    cJSON_AddStringToObject(r, "runtime_source", "profile");
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        cJSON_AddNumberToObject(r, "process_peak_rss_bytes", (double)ru.ru_maxrss * 1024.0);
    cJSON_AddNumberToObject(r, "activation_sets", ex->peak_live);
    cJSON_AddNumberToObject(r, "activations_in_use_peak", (double)exec_activations_in_use_peak(ex));
    cJSON_AddItemToArray(mr, r);

    cJSON *comm = cJSON_AddObjectToObject(j, "comm");
    cJSON *cr = cJSON_AddArrayToObject(comm, "per_rank");
    cJSON *c0 = cJSON_CreateObject();
    cJSON_AddNumberToObject(c0, "rank", ex->comm->rank);
    uint64_t ctot = 0;
    cJSON *kinds = cJSON_CreateObject();
    for (int k = 0; k < MODEL_COMM_COUNT; k++) {
        ctot += ex->comm->bytes[k];
        cJSON_AddNumberToObject(kinds, model_comm_name((ModelComm)k), (double)ex->comm->bytes[k]);
    }
    cJSON_AddNumberToObject(c0, "total_bytes", (double)ctot);
    cJSON_AddItemToObject(c0, "by_kind", kinds);
    cJSON_AddItemToArray(cr, c0);

    int n = 0;
    const ExecOpReport *ops = exec_ops(ex, &n);
    cJSON *oa = cJSON_AddArrayToObject(j, "ops");
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", ops[i].name);
        cJSON_AddNumberToObject(o, "stage", ex->stage);
        cJSON_AddNumberToObject(o, "calls", ops[i].calls);
        cJSON_AddNumberToObject(o, "seconds", ops[i].seconds);
        cJSON_AddNumberToObject(o, "flops", ops[i].flops);
        cJSON_AddItemToArray(oa, o);
    }

    cJSON *fl = cJSON_AddObjectToObject(j, "flops");
    cJSON *pr = cJSON_AddArrayToObject(fl, "per_rank_per_step");
    cJSON_AddItemToArray(pr, cJSON_CreateNumber(exec_step_flops(ex)));

    cJSON *tm = cJSON_AddObjectToObject(j, "time");
    cJSON_AddNumberToObject(tm, "step_s_median", median_step(ex));
    /* one rank, one stage: no pipeline, no bubble */
    cJSON_AddNumberToObject(tm, "bubble_fraction", 0.0);
    cJSON_AddNumberToObject(tm, "timed_steps", ex->timed_steps);
    return j;
}
