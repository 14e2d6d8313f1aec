/* Validation: plan layouts of a model on this machine's (calibrated) profile, run them for real
 * through `parallax run` (a subprocess, so the front end needs no MPI), compare prediction and
 * measurement quantity by quantity, and draw the report. Timing layouts use no more ranks than
 * cores; memory and communication are compared at any rank count. */
#include "validate/validate.h"

#include "exec/calibrate/calibrate.h"
#include "exec/train/train.h"
#include "reports/report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* A layout and what of the job goes with it: cp_comm counts where cp > 1; flash is the
 * attention core, 1 fused (--flash-attn), 0 unfused, and in the spread FLASH_JOB for the
 * job's own (the planner's rows and the rows to validate hold 0 or 1). */
typedef struct {
    int dp, tp, pp, cp, vpp, zero, sp, mbs, recompute, schedule, cp_comm, flash;
    int ep, etp; /* the planner's expert layout (0: the job's, as the spread rows take it) */
    int keep;    /* ZeRO-3's gathered parameters kept from the forward to the backward */
} Layout;

enum { FLASH_JOB = -1 };

#define NONE MODEL_RECOMPUTE_NONE
#define F1B MODEL_SCHED_1F1B
#define P2P MODEL_CP_COMM_P2P
/* What is worth validating on a few CPU ranks besides the planner's best layouts (which come
 * first): every kind of parallelism alone and in pairs, each schedule, ZeRO stages, recompute
 * modes, and context parallelism with each comm type: p2p on the fused core (its only one), a2a
 * on the unfused one (the fused one is the job's default, which the planner's rows take),
 * allgather on the job's. */
static const Layout spread[] = {
    {1, 1, 1, 1, 1, 0, 0, 4, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 1, 1, 1, 1, 0, 0, 2, MODEL_RECOMPUTE_FULL, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 1, 1, 1, 1, 0, 0, 8, MODEL_RECOMPUTE_SELECTIVE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {2, 1, 1, 1, 1, 0, 0, 4, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {2, 1, 1, 1, 1, 1, 0, 2, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 2, 1, 1, 1, 0, 0, 4, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 2, 1, 1, 1, 0, 1, 4, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 1, 2, 1, 1, 0, 0, 2, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 1, 2, 1, 1, 0, 0, 2, NONE, MODEL_SCHED_GPIPE, P2P, FLASH_JOB, 0, 0, 0},
    {1, 1, 2, 1, 2, 0, 0, 2, NONE, MODEL_SCHED_INTERLEAVED, P2P, FLASH_JOB, 0, 0, 0},
    {2, 1, 1, 1, 1, 3, 0, 4, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 1, 1, 2, 1, 0, 0, 4, NONE, F1B, P2P, 1, 0, 0, 0},
    {1, 1, 1, 2, 1, 0, 0, 4, NONE, F1B, MODEL_CP_COMM_ALLGATHER, FLASH_JOB, 0, 0, 0},
    {1, 1, 1, 2, 1, 0, 0, 4, NONE, F1B, MODEL_CP_COMM_A2A, 0, 0, 0, 0},
    /* beyond the cores: memory and communication only */
    {2, 2, 1, 1, 1, 0, 0, 2, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {1, 2, 2, 1, 1, 0, 1, 2, MODEL_RECOMPUTE_SELECTIVE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {2, 1, 2, 1, 1, 1, 0, 2, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {2, 2, 2, 1, 1, 1, 0, 2, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {4, 1, 1, 1, 1, 3, 0, 2, NONE, F1B, P2P, FLASH_JOB, 0, 0, 0},
    {2, 1, 1, 2, 1, 1, 0, 2, NONE, F1B, P2P, 1, 0, 0, 0},
    {1, 2, 1, 2, 1, 0, 1, 2, NONE, F1B, MODEL_CP_COMM_A2A, 0, 0, 0, 0},
};
/* A mixture-of-experts model's expert layouts besides (after the spread): the experts over the
 * data-parallel ranks, over the tensor-parallel ones (MoE Parallel Folding: ep across tp, etp
 * 1) and over the context-parallel ones, timed on two ranks; on four, experts split by tensor
 * parallelism too (etp 2) or not, beside pipelines plain and interleaved, four expert ranks, and
 * ZeRO-3 over the expert-data-parallel group. */
static const Layout moe_spread[] = {
    {2, 1, 1, 1, 1, 0, 0, 4, NONE, F1B, P2P, FLASH_JOB, 2, 1, 0},
    {1, 2, 1, 1, 1, 0, 1, 4, NONE, F1B, P2P, FLASH_JOB, 2, 1, 0},
    {1, 1, 1, 2, 1, 0, 0, 4, NONE, F1B, P2P, 1, 2, 1, 0},
    /* memory and communication only */
    {2, 2, 1, 1, 1, 0, 1, 2, NONE, F1B, P2P, FLASH_JOB, 2, 2, 0},
    {2, 2, 1, 1, 1, 1, 1, 2, NONE, F1B, P2P, FLASH_JOB, 2, 1, 0},
    {2, 1, 2, 1, 1, 1, 0, 2, NONE, F1B, P2P, FLASH_JOB, 2, 1, 0},
    {2, 1, 2, 1, 2, 0, 0, 2, NONE, MODEL_SCHED_INTERLEAVED, P2P, FLASH_JOB, 2, 1, 0},
    {4, 1, 1, 1, 1, 1, 0, 2, NONE, F1B, P2P, FLASH_JOB, 4, 1, 0},
    {4, 1, 1, 1, 1, 3, 0, 2, NONE, F1B, P2P, FLASH_JOB, 2, 1, 0},
};
#undef NONE
#undef F1B
#undef P2P

void val_request_defaults(ValRequest *q)
{
    memset(q, 0, sizeof *q);
    q->dir = "validation";
    q->steps = 20;
    q->tries = VAL_TRIES;
    q->max_ranks = 8;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    q->max_timing_ranks = cores > 0 ? (int)cores : 1;
}

int val_request_resolve(ValRequest *q, const char *cluster_name, PxError *err)
{
    if (!q->parallax[0]) {
        ssize_t n = readlink("/proc/self/exe", q->parallax, sizeof q->parallax - 1);
        if (n <= 0)
            return px_fail(err, PX_ERUNTIME,
                           "cannot find the parallax executable (/proc/self/exe)");
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
    /* a calibrated profile's tables, where calibrate left them */
    q->calibration_log[0] = '\0';
    if (q->cluster->measured && strchr(q->cluster_ref, '/')) {
        calib_log_path(q->cluster_ref, q->calibration_log, sizeof q->calibration_log);
        if (access(q->calibration_log, R_OK) != 0)
            q->calibration_log[0] = '\0';
    }
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

/* The planner's best layouts kept, and how many it is asked for: its best on two ranks are
 * often the same layout with each cp comm type, and those the executor refuses are passed over. */
enum { PLAN_TOP = 3, PLAN_ASK = 24 };

/* Why spec s on ranks ranks cannot be validated on q's cluster, or NULL: *whose says "the model
 * does not take it" when it breaks one of the model's rules, "the executor does not run it"
 * when model_exec_refusal (what the executor itself refuses by) does; the sentence in e2. */
static const char *refusal(const ValRequest *q, const ModelSpec *s, int ranks, PxError *e2,
                           const char **whose)
{
    ModelSpec probe = *s;
    ModelDims d;
    *whose = "the model does not take it";
    /* the precision as the plan will have it on this cluster (the device's default) */
    if (sim_resolve_job(&probe.job, &q->cluster->device, e2) ||
        model_spec_check(&probe, ranks, &d, e2))
        return e2->msg;
    *whose = "the executor does not run it";
    return model_exec_refusal(&probe, &d, !prof_device_is_cpu(&q->cluster->device), e2->msg,
                              sizeof e2->msg)
               ? e2->msg
               : NULL;
}

static int same_layout(const Layout *a, const Layout *b);

/* The planner's best layouts on the timing ranks that the executor runs (context parallelism
 * with the comm types the job's attention core takes), as Layout rows; fewer when fewer fit. */
static int planned(const ValRequest *q, Layout *out, int *n_out, PxError *err)
{
    *n_out = 0;
    SimPlanRequest pq;
    memset(&pq, 0, sizeof pq);
    pq.base = q->base;
    pq.gpus = q->max_timing_ranks;
    pq.objective = SIM_OBJ_TIME;
    pq.top = PLAN_ASK;
    SimPlanResult r;
    memset(&r, 0, sizeof r);
    int rc = sim_plan(&pq, q->cluster, &r, err);
    if (rc == PX_EINPUT) /* nothing fits on so few ranks: the spread alone */
        return PX_OK;
    for (int i = 0; !rc && i < r.n_top && *n_out < PLAN_TOP; i++) {
        const ModelSpec *s = &r.top[i].spec;
        const ModelLayout *l = &s->layout;
        PxError e2 = {0};
        const char *whose;
        if (refusal(q, s, l->dp * l->tp * l->pp * l->cp, &e2, &whose))
            continue;
        const Layout L = {l->dp, l->tp, l->pp, l->cp, l->vpp, l->zero, l->sp, s->job.micro_batch,
                          (int)l->recompute, (int)l->schedule,
                          l->cp > 1 ? (int)l->cp_comm : MODEL_CP_COMM_P2P, s->job.flash_attn,
                          s->model.moe.experts > 0 ? l->ep : 0, s->model.moe.experts > 0 ? l->etp : 0,
                          l->zero == 3 && l->keep_gathered};
        /* the planner's picks that differ only in what a row does not carry run once */
        int seen = 0;
        for (int k = 0; k < *n_out; k++)
            seen |= same_layout(&out[k], &L);
        if (!seen)
            out[(*n_out)++] = L;
    }
    sim_plan_free(&r);
    return rc;
}

static int same_layout(const Layout *a, const Layout *b)
{
    return a->dp == b->dp && a->tp == b->tp && a->pp == b->pp && a->cp == b->cp &&
           a->vpp == b->vpp && a->zero == b->zero && a->sp == b->sp && a->mbs == b->mbs &&
           a->recompute == b->recompute && a->schedule == b->schedule &&
           (a->cp == 1 || a->cp_comm == b->cp_comm) && a->flash == b->flash && a->ep == b->ep &&
           a->etp == b->etp && a->keep == b->keep;
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

enum { N_SPREAD = (int)(sizeof spread / sizeof spread[0]),
       N_MOE_SPREAD = (int)(sizeof moe_spread / sizeof moe_spread[0]) };

/* What a validation gathers over its layouts, for the table, the JSON, the chart and the
 * report. */
typedef struct {
    const ValRequest *q;
    FILE *log;
    Layout rows[PLAN_TOP + N_SPREAD + N_MOE_SPREAD]; /* the planner's best, then the spread */
    int n_rows, n_top;
    char (*labels)[128];      /* [n_rows] */
    char (*short_labels)[48]; /* [n_rows]: the chart's, "1: dp2 zero2 mbs4" */
    const char **timed_label; /* the timed layouts: their short labels and step milliseconds */
    double *pred_ms, *meas_ms;
    int n_timed;
    int pick, pick_pp;        /* the layout the report details (1-based), and its pp */
    FILE *table;              /* the table in Markdown, for the report */
    char *table_text;
    size_t table_len;
    cJSON *json, *layouts;
    int n_loss, loss_steps;   /* the timed runs' first and last losses, their ranges */
    double first_lo, first_hi, last_lo, last_hi;
    /* the machine: the host when the first timed run starts and after the latest one ended, and
     * the windows before the timed runs (from validate's start) and during them */
    ValHostSnap first, last, run_start;
    ValQuiet before, during;
    ValHostCheck host_after; /* the host's speed probed again once the timed runs ended */
    int timed_started;
    int tries;                /* timed runs per timed layout: q->tries, fewer once the host is busy */
    int busy;                 /* a run found the machine busy: no more tries before the last */
    int last_quiet;           /* the window before the runs, then the timed runs' so far, was quiet */
    double (*try_s)[VAL_MAX_TRIES]; /* [n_rows]: each try's measured step, in order */
    int *n_tries;             /* [n_rows] */
    struct Outcome *outs;     /* [n_rows]: what each row came to, tabled once the runs end */
    char (*why)[320];         /* [n_rows]: a skipped row's reason */
    char (*grade)[16];        /* [n_rows]: "pass", "FAIL", "not graded" or "" */
} Validation;

/* One layout's run set against its prediction. */
typedef struct Outcome {
    int state;                       /* ROW_* */
    int ranks, timing, n_steps;
    double loss0, loss1;             /* first and last loss (NaN when the run has no steps) */
    double step_p, step_m, step_err; /* predicted and measured step, relative error */
    int mem_equal, comm_equal, ops, ops_ok;
    ValQuiet machine;                /* timed runs: the host during this run */
} Outcome;

/* What became of a row: beyond the largest layout (not run), refused, or compared. */
enum { ROW_OUT = 0, ROW_SKIPPED, ROW_RAN };

/* Spread row i (past the spread: moe_spread's, for a mixture-of-experts model) as the model
 * takes it: a mixture-of-experts model's tensor parallelism with SP (Megatron-Core requires
 * it). */
static Layout spread_row(const ValRequest *q, int i)
{
    Layout L = i < N_SPREAD ? spread[i] : moe_spread[i - N_SPREAD];
    if (L.flash == FLASH_JOB)
        L.flash = q->base.job.flash_attn;
    if (q->base.model.moe.experts > 0 && L.tp > 1)
        L.sp = 1;
    return L;
}

/* The planner's best layouts first, then the spread less what they, or an earlier row as the
 * model takes it, already cover. */
static int choose_layouts(Validation *v, PxError *err)
{
    int rc = planned(v->q, v->rows, &v->n_top, err);
    if (rc)
        return rc;
    v->n_rows = v->n_top;
    const int n = N_SPREAD + (v->q->base.model.moe.experts > 0 ? N_MOE_SPREAD : 0);
    for (int i = 0; i < n; i++) {
        const Layout L = spread_row(v->q, i);
        int dup = 0;
        for (int k = 0; k < v->n_rows && !dup; k++)
            dup = same_layout(&v->rows[k], &L);
        if (!dup)
            v->rows[v->n_rows++] = L;
    }
    return PX_OK;
}

static int validation_open(Validation *v, const ValRequest *q, FILE *log, PxError *err)
{
    memset(v, 0, sizeof *v);
    v->q = q;
    v->log = log;
    int rc = choose_layouts(v, err);
    if (rc)
        return rc;
    if (q->max_layouts > 0 && v->n_rows > q->max_layouts)
        v->n_rows = q->max_layouts;
    const size_t n = (size_t)v->n_rows;
    v->labels = calloc(n, sizeof *v->labels);
    v->short_labels = calloc(n, sizeof *v->short_labels);
    v->timed_label = calloc(n, sizeof *v->timed_label);
    v->pred_ms = calloc(n, sizeof *v->pred_ms), v->meas_ms = calloc(n, sizeof *v->meas_ms);
    v->outs = calloc(n, sizeof *v->outs);
    v->why = calloc(n, sizeof *v->why);
    v->grade = calloc(n, sizeof *v->grade);
    v->try_s = calloc(n, sizeof *v->try_s);
    v->n_tries = calloc(n, sizeof *v->n_tries);
    v->table = open_memstream(&v->table_text, &v->table_len);
    v->json = cJSON_CreateObject();
    cJSON_AddStringToObject(v->json, "model", q->base.model.name);
    cJSON_AddStringToObject(v->json, "cluster", q->cluster->name);
    if (q->host.probed)
        cJSON_AddItemToObject(v->json, "host_check", val_host_json(&q->host));
    v->layouts = cJSON_AddArrayToObject(v->json, "layouts");
    if (!v->labels || !v->short_labels || !v->timed_label || !v->pred_ms || !v->meas_ms ||
        !v->outs || !v->why || !v->grade || !v->table || !v->try_s || !v->n_tries)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    return PX_OK;
}

static void validation_close(Validation *v)
{
    if (v->table)
        fclose(v->table);
    free(v->table_text);
    free(v->labels);
    free(v->short_labels);
    free(v->timed_label);
    free(v->pred_ms);
    free(v->meas_ms);
    free(v->outs);
    free(v->why);
    free(v->grade);
    free(v->try_s);
    free(v->n_tries);
    val_host_snap_free(&v->first);
    val_host_snap_free(&v->last);
    val_host_snap_free(&v->run_start);
    cJSON_Delete(v->json);
}

/* The chart's label: the row's number and what differs from one rank, no recompute and 1F1B (the
 * table beside the chart has the whole layout), short enough that every bar's label shows. */
static void short_label(char *buf, size_t cap, int index, const Layout *L)
{
    size_t n = (size_t)snprintf(buf, cap, "%d:", index);
    const int dims[7] = {L->dp, L->tp, L->pp, L->cp, L->vpp, L->ep, L->etp};
    const char *const names[7] = {"dp", "tp", "pp", "cp", "vpp", "ep", "etp"};
    for (int k = 0; k < 7 && n < cap; k++)
        if (dims[k] > 1)
            n += (size_t)snprintf(buf + n, cap - n, " %s%d", names[k], dims[k]);
    if (L->cp > 1 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " %s", model_cp_comm_name((ModelCpComm)L->cp_comm));
    if (L->sp && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " sp");
    if (L->zero && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " zero%d", L->zero);
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " mbs%d", L->mbs);
    if (L->recompute != MODEL_RECOMPUTE_NONE && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " %s", model_recompute_name((ModelRecompute)L->recompute));
    /* vpp > 1 already says interleaved */
    if (L->schedule != MODEL_SCHED_1F1B && !(L->schedule == MODEL_SCHED_INTERLEAVED && L->vpp > 1) &&
        n < cap)
        snprintf(buf + n, cap - n, " %s", model_schedule_name((ModelSchedule)L->schedule));
}

/* The layout on the base model and job. */
static ModelSpec layout_spec(const ValRequest *q, const Layout *L)
{
    ModelSpec s = q->base;
    s.layout.dp = L->dp;
    s.layout.tp = L->tp;
    s.layout.pp = L->pp;
    s.layout.cp = L->cp;
    s.layout.cp_comm = (ModelCpComm)L->cp_comm;
    s.job.flash_attn = L->flash;
    s.layout.vpp = L->vpp;
    s.layout.zero = L->zero;
    s.layout.sp = L->sp;
    s.layout.keep_gathered = L->keep;
    s.layout.recompute = (ModelRecompute)L->recompute;
    s.layout.schedule = (ModelSchedule)L->schedule;
    s.job.micro_batch = L->mbs;
    if (L->ep > 0)
        s.layout.ep = L->ep;
    if (L->etp > 0)
        s.layout.etp = L->etp;
    /* the experts' tokens forced to balance, as the prediction assumes them (imbalance 1): what
     * an untrained router sends where is not the time model's to predict, and the all-to-all's
     * bytes and the dropless buffers are then the plan's exactly (docs/moe.md) */
    if (s.model.moe.experts > 0)
        s.job.moe_force_balance = 1;
    return s;
}

/* "plan: dp2 tp1 pp1 zero2 mbs4 none 1f1b"; with context parallelism its degree and comm type
 * after pp ("cp2 a2a"), and the attention core last where it is not the job's ("unfused"). */
static void layout_label(char *buf, size_t cap, const Layout *L, int from_planner, int job_flash)
{
    char vpp[16] = "", cp[32] = "", ep[32] = "";
    if (L->vpp > 1)
        snprintf(vpp, sizeof vpp, " vpp%d", L->vpp);
    if (L->ep > 1 || L->etp > 1)
        snprintf(ep, sizeof ep, L->etp > 1 ? " ep%d etp%d" : " ep%d", L->ep > 0 ? L->ep : 1, L->etp);
    if (L->cp > 1)
        snprintf(cp, sizeof cp, " cp%d %s", L->cp, model_cp_comm_name((ModelCpComm)L->cp_comm));
    snprintf(buf, cap, "%sdp%d tp%d pp%d%s%s%s%s zero%d%s mbs%d %s %s%s",
             from_planner ? "plan: " : "", L->dp, L->tp, L->pp, cp, vpp, ep, L->sp ? " sp" : "",
             L->zero, L->keep ? " keep" : "", L->mbs,
             model_recompute_name((ModelRecompute)L->recompute),
             model_schedule_name((ModelSchedule)L->schedule),
             L->flash == job_flash ? "" : L->flash ? " fused" : " unfused");
}

/* The layout simulated on the profile, as the plan `parallax run` trains. */
static int predict(const ValRequest *q, const ModelSpec *s, int ranks, cJSON **plan_json,
                   PxError *err)
{
    SimResult r;
    int rc = sim_run(s, q->cluster, ranks, &r, err);
    if (rc)
        return rc;
    ModelPlan plan;
    rc = sim_plan_make(&r, q->cluster_ref, &plan, err);
    sim_result_free(&r);
    if (rc)
        return rc;
    *plan_json = model_plan_to_json(&plan);
    model_plan_free(&plan);
    return PX_OK;
}

/* Writes plan-NN.json, trains it through `parallax run` (its output in run-NN.log) and reads
 * run-NN.json. */
static int train(const ValRequest *q, int index, int timing, const cJSON *plan_json,
                 cJSON **run, PxError *err)
{
    char plan_path[1200], run_path[1200], log_path[1200], steps[16];
    snprintf(plan_path, sizeof plan_path, "%s/plan-%02d.json", q->dir, index);
    snprintf(run_path, sizeof run_path, "%s/run-%02d.json", q->dir, index);
    snprintf(log_path, sizeof log_path, "%s/run-%02d.log", q->dir, index);
    snprintf(steps, sizeof steps, "%d", timing ? q->steps : 3);
    char *argv[] = {(char *)q->parallax, "run", plan_path, "--steps", steps, "-o", run_path, NULL};
    int rc;
    if ((rc = px_json_write_file(plan_path, plan_json, err)) ||
        (rc = run_child(argv, log_path, err)))
        return rc;
    return (*run = px_json_read_file(run_path, err)) ? PX_OK : PX_ERUNTIME;
}

/* The run trained for real: its first and last losses. */
static void run_losses(const cJSON *run, Outcome *o)
{
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(run, "steps");
    o->n_steps = cJSON_GetArraySize(st);
    o->loss0 = o->n_steps ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                                cJSON_GetArrayItem(st, 0), "loss"))
                          : NAN;
    o->loss1 = o->n_steps ? cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(
                                cJSON_GetArrayItem(st, o->n_steps - 1), "loss"))
                          : NAN;
}

/* The comparison in a few figures: the step, whether memory and communication bytes are equal
 * on every rank, and how many of the ops above 1% of the step are within 15%. */
static void summarize(const RptCompare *c, Outcome *o)
{
    o->mem_equal = 1, o->comm_equal = 1, o->ops = 0, o->ops_ok = 0;
    o->step_p = c->rows[0].predicted, o->step_m = c->rows[0].measured;
    o->step_err = c->rows[0].rel_error;
    for (int k = 0; k < c->count; k++) {
        const RptDelta *dl = &c->rows[k];
        if (strncmp(dl->quantity, "memory", 6) == 0 && dl->predicted != dl->measured)
            o->mem_equal = 0;
        if (strncmp(dl->quantity, "comm", 4) == 0 && dl->predicted != dl->measured)
            o->comm_equal = 0;
        if (strncmp(dl->quantity, "op ", 3) == 0 && dl->predicted >= 0.01 * o->step_p) {
            o->ops++;
            o->ops_ok += fabs(dl->rel_error) <= 0.15;
        }
    }
}

/* Row i's fastest try so far (0-based; the first of equals), of n_tries[i] > 0. */
static int fastest(const Validation *v, int i)
{
    int best = 0;
    for (int k = 1; k < v->n_tries[i]; k++)
        best = v->try_s[i][k] < v->try_s[i][best] ? k : best;
    return best;
}

/* Whether row i's fastest try has been matched: another try within VAL_MATCH of it. */
static int fastest_matched(const Validation *v, int i)
{
    const int best = fastest(v, i);
    for (int k = 0; k < v->n_tries[i]; k++)
        if (k != best && v->try_s[i][k] <= (1 + VAL_MATCH) * v->try_s[i][best])
            return 1;
    return 0;
}

/* The timed rows tried so far whose fastest try is not matched. */
static int unmatched(const Validation *v)
{
    int n = 0;
    for (int i = 0; i < v->n_rows; i++)
        n += v->n_tries[i] > 0 && !fastest_matched(v, i);
    return n;
}

static void add_layout_json(Validation *v, int index, const Layout *L, const char *label,
                            const Outcome *o, const RptCompare *c)
{
    cJSON *lj = cJSON_CreateObject();
    cJSON_AddNumberToObject(lj, "index", index);
    cJSON_AddStringToObject(lj, "layout", label);
    cJSON_AddNumberToObject(lj, "ranks", o->ranks);
    cJSON_AddNumberToObject(lj, "cp", L->cp);
    if (L->cp > 1)
        cJSON_AddStringToObject(lj, "cp_comm_type", model_cp_comm_name((ModelCpComm)L->cp_comm));
    cJSON_AddBoolToObject(lj, "flash_attn", L->flash);
    cJSON_AddBoolToObject(lj, "timing", o->timing);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(lj, "predicted"), "step_s", o->step_p);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(lj, "measured"), "step_s", o->step_m);
    if (o->timing) {
        cJSON_AddNumberToObject(lj, "step_error", o->step_err);
        const int tries = v->n_tries[index - 1];
        cJSON_AddNumberToObject(lj, "tries", tries);
        cJSON_AddBoolToObject(lj, "fastest_matched", tries > 1 && fastest_matched(v, index - 1));
        cJSON_AddItemToObject(lj, "step_s_tries",
                              cJSON_CreateDoubleArray(v->try_s[index - 1], tries));
        cJSON_AddNumberToObject(lj, "ops_over_1pct", o->ops);
        cJSON_AddNumberToObject(lj, "ops_within_15pct", o->ops_ok);
        cJSON_AddItemToObject(lj, "machine", val_quiet_json(&o->machine, NULL));
    }
    cJSON_AddNumberToObject(lj, "steps", o->n_steps);
    if (isfinite(o->loss0) && isfinite(o->loss1)) {
        cJSON_AddNumberToObject(lj, "loss_first", o->loss0);
        cJSON_AddNumberToObject(lj, "loss_last", o->loss1);
    }
    cJSON_AddBoolToObject(lj, "memory_equal", o->mem_equal);
    cJSON_AddBoolToObject(lj, "comm_equal", o->comm_equal);
    cJSON_AddItemToObject(lj, "compare", rpt_compare_to_json(c));
    cJSON_AddItemToArray(v->layouts, lj);
}

/* A timed layout: its losses into the ranges every timed run shares, its step into the chart,
 * and whether it is the one the report details: the deepest pipeline that was timed (its
 * timelines say the most), the first of them. */
static void add_timed(Validation *v, int index, const Layout *L, const Outcome *o)
{
    if (isfinite(o->loss0) && isfinite(o->loss1)) {
        if (!v->n_loss++) {
            v->loss_steps = o->n_steps;
            v->first_lo = v->first_hi = o->loss0;
            v->last_lo = v->last_hi = o->loss1;
        }
        v->first_lo = fmin(v->first_lo, o->loss0), v->first_hi = fmax(v->first_hi, o->loss0);
        v->last_lo = fmin(v->last_lo, o->loss1), v->last_hi = fmax(v->last_hi, o->loss1);
        v->loss_steps = o->n_steps < v->loss_steps ? o->n_steps : v->loss_steps;
    }
    v->timed_label[v->n_timed] = v->short_labels[index - 1];
    v->pred_ms[v->n_timed] = 1e3 * o->step_p;
    v->meas_ms[v->n_timed] = 1e3 * o->step_m;
    v->n_timed++;
    if (L->pp > v->pick_pp || !v->pick) {
        v->pick = index;
        v->pick_pp = L->pp;
    }
}

/* Row i's line of the terminal's table and of the report's, once every run has ended and the
 * rows are graded. */
static void table_row(Validation *v, FILE *term, int i)
{
    const Outcome *o = &v->outs[i];
    const char *label = v->labels[i];
    if (o->state == ROW_SKIPPED) {
        if (term)
            fprintf(term, "%3d %5d  %-54s skipped: %s\n", i + 1, o->ranks, label, v->why[i]);
        return;
    }
    char es[32] = "-", os[32] = "-", ms[32] = "(not timed)";
    if (o->timing) {
        snprintf(es, sizeof es, "%+.1f%%", 100 * o->step_err);
        snprintf(os, sizeof os, "%d/%d", o->ops_ok, o->ops);
        snprintf(ms, sizeof ms, "%.4f", o->step_m);
    }
    const char *grade = v->grade[i][0] ? v->grade[i] : "-";
    if (term)
        fprintf(term, "%3d %5d  %-54s %11.4f %11s %8s %9s %7s %7s  %s\n", i + 1, o->ranks, label,
            o->step_p, ms, es, os, o->mem_equal ? "equal" : "DIFFER",
            o->comm_equal ? "equal" : "DIFFER", grade);
    fprintf(v->table, "| %d | %d | %s | %.4f | %s | %s | %s | %s | %s | %s |\n", i + 1, o->ranks,
            label, o->step_p, o->timing ? ms : "not timed", es, os,
            o->mem_equal ? "equal" : "DIFFER", o->comm_equal ? "equal" : "DIFFER", grade);
}

/* Before the first timed run: the host since validate began (q->start), said at once when it
 * was busy; then the window of the timed runs opens. Before every timed run: its own window. */
static void timed_open(Validation *v)
{
    if (!v->timed_started) {
        v->timed_started = 1;
        val_host_snap(&v->first);
        /* a window of a few milliseconds says nothing: the before window lasts a second at least */
        const double wait_s = VAL_QUIET_BEFORE_S - (v->first.t_s - v->q->start.t_s);
        if (v->q->start.t_s > 0 && wait_s > 0) {
            struct timespec ts = {(time_t)wait_s, (long)(1e9 * (wait_s - (double)(time_t)wait_s))};
            nanosleep(&ts, NULL);
            val_host_snap(&v->first);
        }
        if (v->q->start.t_s > 0) {
            val_quiet_judge(&v->q->start, &v->first, &v->before);
            if (v->log && v->before.measured && !v->before.quiet)
                fprintf(v->log, "machine before the timed runs: %s: their step times will "
                                "probably not be graded\n",
                        v->before.verdict);
        }
        v->last_quiet = !v->before.measured || v->before.quiet;
    }
    val_host_snap(&v->run_start);
}

/* After a timed run: the host during it, into o->machine, and into its run-NN.json. */
static void timed_close(Validation *v, int index, Outcome *o, cJSON *run)
{
    val_host_snap(&v->last);
    val_quiet_judge(&v->run_start, &v->last, &o->machine);
    /* whether to try again follows the timed runs' window so far, not one run's second, where a
     * few jiffies of steal or a daemon's wake-up cross the bars */
    ValQuiet so_far;
    val_quiet_judge(&v->first, &v->last, &so_far);
    v->last_quiet = !so_far.measured || so_far.quiet;
    char path[1200];
    snprintf(path, sizeof path, "%s/run-%02d.json", v->q->dir, index);
    cJSON_AddItemToObject(run, "machine", val_quiet_json(&o->machine, NULL));
    PxError e2 = {0};
    px_json_write_file(path, run, &e2); /* the run's own record; the validation's JSON has it too */
}

/* "[ 3/18] dp2 tp1 ... (2 ranks)": on a terminal one line rewritten for each run; off a
 * terminal (a log, a CI job) the passes' own lines (pass_progress) say enough, and the answer
 * is not buried under a line per try. */
enum { TRY_PLANNED, TRY_MATCHING, TRY_LAST };
static void progress(Validation *v, int i, int ranks, int try, int tries, int kind)
{
    if (!v->log)
        return;
    const int tty = isatty(fileno(v->log));
    if (!tty)
        return;
    char t[64] = "";
    if (tries > 1 && try <= tries && kind != TRY_MATCHING)
        snprintf(t, sizeof t, ", try %d of %d", try, tries);
    else if (tries > 1)
        snprintf(t, sizeof t, ", try %d%s", try,
                 kind == TRY_LAST ? ", the last" : ": its fastest not matched yet");
    fprintf(v->log, "\r\033[K[%2d/%d] running %s (%d rank%s%s)", i + 1, v->n_rows, v->labels[i],
            ranks, ranks > 1 ? "s" : "", t);
    fflush(v->log);
}

/* Off a terminal, a line as each pass over the layouts begins: "validate: timing pass 2 of 5
 * (21.4 s so far)"; pass 0 is the last one, which also checks memory and communication. */
static void pass_progress(Validation *v, int pass, int only, double t0)
{
    if (!v->log || isatty(fileno(v->log)))
        return;
    const double so_far = px_now_s() - t0;
    if (!pass)
        fprintf(v->log,
                "validate: last pass: every layout, the timed ones with their last try, memory "
                "and communication (%.1f s so far)\n",
                so_far);
    else if (only)
        fprintf(v->log,
                "validate: timing pass %d: the layouts whose fastest try no other has matched "
                "yet (%.1f s so far)\n",
                pass, so_far);
    else
        fprintf(v->log, "validate: timing pass %d of %d (%.1f s so far)\n", pass, v->tries, so_far);
    fflush(v->log);
}

/* The run's measured step (its median after the first step; 0 when it has none). */
static double run_step(const cJSON *run)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(run, "time");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(t, "step_s_median");
    return cJSON_IsNumber(m) ? m->valuedouble : 0;
}

/* Run index's files (run-NN.json, .metrics.jsonl, .log) moved aside as the fastest try so far
 * (to run-NN.best.*), back over the latest try's (back), or the ones aside removed (drop). */
enum { BEST_ASIDE, BEST_BACK, BEST_DROP };
static void best_files(const ValRequest *q, int index, int how)
{
    static const char *const ext[] = {"json", "metrics.jsonl", "log"};
    for (int k = 0; k < 3; k++) {
        char run[1200], best[1200];
        snprintf(run, sizeof run, "%s/run-%02d.%s", q->dir, index, ext[k]);
        snprintf(best, sizeof best, "%s/run-%02d.best.%s", q->dir, index, ext[k]);
        if (how == BEST_ASIDE)
            rename(run, best);
        else if (how == BEST_BACK)
            rename(best, run);
        else
            remove(best);
    }
}

/* A try of row i has ended with `run`: its step recorded; when it is the fastest so far and
 * more tries follow (last: this is the last), its files are kept aside; on the last try, the
 * fastest try's files and JSON take the run's place (*run replaced). */
static int record_try(Validation *v, int i, cJSON **run, int last, PxError *err)
{
    const int k = v->n_tries[i]++;
    v->try_s[i][k] = run_step(*run);
    const int best = fastest(v, i) == k;
    if (!last) {
        if (best)
            best_files(v->q, i + 1, BEST_ASIDE);
        return PX_OK;
    }
    if (best || k == 0) {
        best_files(v->q, i + 1, BEST_DROP);
        return PX_OK;
    }
    best_files(v->q, i + 1, BEST_BACK);
    char path[1200];
    snprintf(path, sizeof path, "%s/run-%02d.json", v->q->dir, i + 1);
    cJSON_Delete(*run);
    *run = px_json_read_file(path, err);
    return *run ? PX_OK : PX_ERUNTIME;
}

/* Row i as each of its tries begins it: its ranks and whether it is timed, its label, and its
 * spec (*s). ROW_BEYOND: larger than --max-ranks and not timed, not run; ROW_REFUSED: the model
 * does not take it or the executor does not run it, v->why[i] says which and why. */
enum { ROW_RUNS, ROW_REFUSED, ROW_BEYOND };
static int row_begin(Validation *v, int i, Outcome *o, ModelSpec *s)
{
    const ValRequest *q = v->q;
    const Layout *L = &v->rows[i];
    memset(o, 0, sizeof *o);
    o->ranks = L->dp * L->tp * L->pp * L->cp;
    o->timing = o->ranks <= q->max_timing_ranks;
    if (!o->timing && o->ranks > q->max_ranks)
        return ROW_BEYOND;
    *s = layout_spec(q, L);
    layout_label(v->labels[i], sizeof v->labels[i], L, i < v->n_top, q->base.job.flash_attn);
    PxError e2 = {0};
    const char *whose, *why = refusal(q, s, o->ranks, &e2, &whose);
    if (!why)
        return ROW_RUNS;
    snprintf(v->why[i], sizeof v->why[i], "%s: %s", whose, why);
    return ROW_REFUSED;
}

/* One of the tries before the last: every timed layout the model and the executor take (only:
 * those whose fastest try is not matched yet), trained and its step recorded (record_try). Once
 * a run finds the machine busy, no more such tries: its rows will not be graded, and the last
 * try follows. */
static int timing_pass(Validation *v, int pass, int only, PxError *err)
{
    const ValRequest *q = v->q;
    for (int i = 0; i < v->n_rows && !v->busy; i++) {
        if (v->timed_started && !v->last_quiet) { /* busy since: one more try, the last */
            v->busy = 1;
            v->tries = pass + 1;
            return PX_OK;
        }
        if (only && (!v->n_tries[i] || fastest_matched(v, i)))
            continue;
        Outcome o;
        ModelSpec s;
        if (row_begin(v, i, &o, &s) != ROW_RUNS || !o.timing)
            continue;
        timed_open(v);
        if (!v->last_quiet) { /* busy before the runs: the last try is the only one */
            v->busy = 1;
            v->tries = pass;
            return PX_OK;
        }
        cJSON *pj = NULL, *run = NULL;
        int rc = predict(q, &s, o.ranks, &pj, err);
        if (rc)
            return rc;
        progress(v, i, o.ranks, v->n_tries[i] + 1, v->tries, only ? TRY_MATCHING : TRY_PLANNED);
        rc = train(q, i + 1, 1, pj, &run, err);
        cJSON_Delete(pj);
        if (!rc) {
            timed_close(v, i + 1, &o, run);
            rc = record_try(v, i, &run, 0, err);
        }
        cJSON_Delete(run);
        if (rc)
            return rc;
    }
    return PX_OK;
}

/* Row i (0-based) of the layouts: skipped when too large to run here or when the model does not
 * take it; else predicted, trained, compared and recorded. */
static int validate_layout(Validation *v, int i, PxError *err)
{
    const ValRequest *q = v->q;
    const Layout *L = &v->rows[i];
    const char *label = v->labels[i];
    Outcome o;
    ModelSpec s;
    const int begun = row_begin(v, i, &o, &s);
    if (begun == ROW_BEYOND)
        return PX_OK;
    if (begun == ROW_REFUSED) {
        o.state = ROW_SKIPPED;
        v->outs[i] = o;
        return PX_OK;
    }
    cJSON *pj = NULL, *run = NULL;
    int rc = predict(q, &s, o.ranks, &pj, err);
    if (rc)
        return rc;
    short_label(v->short_labels[i], sizeof v->short_labels[i], i + 1, L);
    if (o.timing)
        timed_open(v);
    progress(v, i, o.ranks, v->n_tries[i] + 1, o.timing ? v->tries : 0, TRY_LAST);
    if ((rc = train(q, i + 1, o.timing, pj, &run, err))) {
        cJSON_Delete(pj);
        return rc;
    }
    if (o.timing) {
        timed_close(v, i + 1, &o, run);
        if ((rc = record_try(v, i, &run, 1, err))) {
            cJSON_Delete(pj);
            return rc;
        }
    }
    run_losses(run, &o);
    RptCompare c;
    rc = rpt_compare(pj, run, &c, err);
    cJSON_Delete(pj);
    cJSON_Delete(run);
    if (rc)
        return rc;
    summarize(&c, &o);
    add_layout_json(v, i + 1, L, label, &o, &c);
    rpt_compare_free(&c);
    if (o.timing)
        add_timed(v, i + 1, L, &o);
    o.state = ROW_RAN;
    v->outs[i] = o;
    return PX_OK;
}

/* Every layout trains the same trajectory: say where it went (term: the terminal's table). */
static void loss_summary(Validation *v, FILE *term)
{
    if (v->n_loss == 0)
        return;
    char first[48], last[48], line[192];
    snprintf(first, sizeof first, v->first_hi - v->first_lo < 5e-5 ? "%.4f" : "%.4f to %.4f",
             v->first_lo, v->first_hi);
    snprintf(last, sizeof last, v->last_hi - v->last_lo < 5e-5 ? "%.4f" : "%.4f to %.4f",
             v->last_lo, v->last_hi);
    snprintf(line, sizeof line, "training: loss %s at step 1, %s at step %d, on each of the %d "
             "timed layouts\n", first, last, v->loss_steps, v->n_loss);
    fprintf(v->table, "\n%s", line); /* a paragraph under the table */
    if (term)
        fputs(line, term);
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The rows graded, or not when the machine was busy (or its load unknown), and the verdict in
 * a sentence: into v->grade, the JSON and *verdict. */
static void grade_rows(Validation *v, char *verdict, size_t cap)
{
    const ValQuiet *m = &v->during;
    char drift[300];
    const int steady = val_host_steady(&v->q->host, &v->host_after, drift, sizeof drift);
    const int graded = m->measured && m->quiet && steady;
    double *abs_err = calloc((size_t)v->n_rows + 1, sizeof *abs_err);
    int n = 0, pass = 0, worst = -1;
    for (int i = 0; i < v->n_rows; i++) {
        const Outcome *o = &v->outs[i];
        if (o->state != ROW_RAN || !o->timing)
            continue;
        const double e = fabs(o->step_err);
        const int ok = e <= VAL_PASS_ERROR + 1e-9;
        px_strlcpy(v->grade[i], graded ? ok ? "pass" : "FAIL" : "not graded", sizeof v->grade[i]);
        if (abs_err)
            abs_err[n] = e;
        n++, pass += ok;
        if (worst < 0 || e > fabs(v->outs[worst].step_err))
            worst = i;
    }
    double median = 0;
    if (abs_err && n > 0) {
        qsort(abs_err, (size_t)n, sizeof *abs_err, by_value);
        median = n % 2 ? abs_err[n / 2] : 0.5 * (abs_err[n / 2 - 1] + abs_err[n / 2]);
    }
    free(abs_err);
    if (n == 0)
        snprintf(verdict, cap, "nothing graded: no layout was timed");
    else if (!m->measured)
        snprintf(verdict, cap, "not graded: whether the machine was quiet is unknown (%s)",
                 m->verdict);
    else if (!m->quiet) {
        char why[200];
        val_busy_reason(m, why, sizeof why);
        snprintf(verdict, cap, "not graded: machine busy: during the timed runs %s, so their "
                 "step errors describe the load, not the model; run again on a quiet machine",
                 why);
    }
    else if (!steady)
        snprintf(verdict, cap, "not graded: the host drifted: %s, and the predictions use the "
                 "calibrated rates, so the step errors describe the drift, not the model; "
                 "calibrate again (parallax calibrate, or validate --recalibrate) and run again",
                 drift);
    else
        snprintf(verdict, cap, "%s: %d of %d timed layouts within %.0f%% of the predicted step "
                 "(median |error| %.1f%%, largest %+.1f%% on #%d)",
                 pass == n ? "pass" : "FAIL", pass, n, 100 * VAL_PASS_ERROR, 100 * median,
                 100 * v->outs[worst].step_err, worst + 1);
    cJSON_AddItemToObject(v->json, "machine", val_quiet_json(m, &v->before));
    if (v->host_after.probed)
        cJSON_AddItemToObject(v->json, "host_check_after", val_host_json(&v->host_after));
    cJSON_AddBoolToObject(v->json, "graded", graded && n > 0);
    cJSON_AddStringToObject(v->json, "verdict", verdict);
    cJSON_AddNumberToObject(v->json, "pass_error", VAL_PASS_ERROR);
    if (n > 0) {
        cJSON_AddNumberToObject(v->json, "median_abs_error", median);
        cJSON_AddNumberToObject(v->json, "max_abs_error", fabs(v->outs[worst].step_err));
    }
    const cJSON *lj;
    cJSON_ArrayForEach(lj, v->layouts)
    {
        int i = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(lj, "index")) - 1;
        if (i >= 0 && i < v->n_rows && v->grade[i][0])
            cJSON_AddStringToObject((cJSON *)lj, "grade", v->grade[i]);
    }
}

/* The calibration's tables (the log beside the calibrated profile) copied beside the report,
 * named in the JSON ("calibration_log": null when there is none) and into *shown. */
static void calibration_log(Validation *v, char *shown, size_t cap)
{
    const ValRequest *q = v->q;
    snprintf(shown, cap, "none (the profile is not calibrated, or was before calibrate kept its tables)");
    FILE *in = q->calibration_log[0] ? fopen(q->calibration_log, "rb") : NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/calibration.txt", q->dir);
    FILE *out = in ? fopen(path, "wb") : NULL;
    if (out) {
        char buf[8192];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0)
            fwrite(buf, 1, n, out);
        snprintf(shown, cap, "%s", path);
        fclose(out);
    }
    if (in)
        fclose(in);
    if (out)
        cJSON_AddStringToObject(v->json, "calibration_log", path);
    else
        cJSON_AddNullToObject(v->json, "calibration_log");
}

/* Where the host was checked before the runs and some were timed, its speed probed again now:
 * a host that slowed down (or sped up) during the runs, a throttled CPU or a neighbour on the
 * same memory, leaves the errors of the rows timed after it (val_host_steady). A probe that
 * fails leaves the check unmade, with a line in the log. */
static void probe_after(Validation *v)
{
    const ProfMeasured *m = v->q->cluster->measured;
    if (!v->q->host.probed || !v->timed_started || !m)
        return;
    PxError err = {0};
    if (val_host_probe(m, &v->host_after, &err)) {
        if (v->log)
            fprintf(v->log, "host check after the timed runs: not made: %s\n", err.msg);
        return;
    }
    if (v->log) {
        fputs("after the timed runs, ", v->log);
        val_host_print(v->log, &v->host_after, m);
    }
}

int val_host_steady(const ValHostCheck *before, const ValHostCheck *after, char *why, size_t cap)
{
    const ValHostCheck *h[2] = {before, after};
    const char *when[2] = {"before", "after"};
    if (cap)
        why[0] = '\0';
    for (int k = 0; k < 2; k++) {
        if (!h[k] || !h[k]->probed || !h[k]->drifted || (k == 0 && h[k]->recalibrated))
            continue;
        const int gemm = fabs(h[k]->peak_change) >= fabs(h[k]->bw_change);
        const double c = gemm ? h[k]->peak_change : h[k]->bw_change;
        snprintf(why, cap, "%s %.1f%% %s %s the timed runs than when calibrated",
                 gemm ? "GEMMs" : "memory bandwidth", 100 * fabs(c), c < 0 ? "slower" : "faster",
                 when[k]);
        return 0;
    }
    return 1;
}

/* Under the table: how often each timed layout ran and how far its slowest try was from its
 * fastest (the host's own variation), the largest such gap named (term: the terminal's copy). */
static void tries_note(Validation *v, FILE *term)
{
    int worst = -1, n = 0, most = 0, least = VAL_MAX_TRIES;
    double gap = 0;
    for (int i = 0; i < v->n_rows; i++) {
        const Outcome *o = &v->outs[i];
        if (o->state != ROW_RAN || !o->timing)
            continue;
        const int tries = v->n_tries[i];
        n++;
        most = tries > most ? tries : most;
        least = tries < least ? tries : least;
        double lo = v->try_s[i][0], hi = lo;
        for (int k = 1; k < tries; k++)
            lo = fmin(lo, v->try_s[i][k]), hi = fmax(hi, v->try_s[i][k]);
        if (lo > 0 && hi / lo - 1 > gap)
            gap = hi / lo - 1, worst = i;
    }
    if (n == 0 || most < 2)
        return;
    char line[600];
    const int lone = unmatched(v);
    char times[32];
    if (least == most)
        snprintf(times, sizeof times, "%d times", most);
    else
        snprintf(times, sizeof times, "%d to %d times", least, most);
    snprintf(line, sizeof line, "timing: each timed layout ran %s, the tries spread over the "
             "validation, and its fastest run is the one compared (interference only adds time); "
             "the slowest try was %+.0f%% over the fastest at most (#%d); %d of %d fastest tries "
             "matched by another within %.0f%%\n",
             times, 100 * gap, worst + 1, n - lone, n, 100 * VAL_MATCH);
    fprintf(v->table, "\n%s", line);
    if (term)
        fputs(line, term);
}

/* The answer, once every run has ended: the machine, the verdict, the table, the training line,
 * where the calibration's tables are; the report's table gets the same rows. */
static void answer(Validation *v)
{
    const int timed = v->timed_started;
    if (!timed) /* nothing timed: the machine as it was when the runs began */
        val_quiet_judge(&v->q->start, &v->q->start, &v->during);
    else
        val_quiet_judge(&v->first, &v->last, &v->during);
    probe_after(v);
    char verdict[800], cal[1300];
    grade_rows(v, verdict, sizeof verdict);
    calibration_log(v, cal, sizeof cal);
    FILE *term = v->log;
    if (term) {
        if (isatty(fileno(term)))
            fputs("\r\033[K", term);
        fprintf(term, "machine during the timed runs: %s\n", v->during.verdict);
        fprintf(term, "validation: %s\n", verdict);
        fprintf(term, "%3s %5s  %-54s %11s %11s %8s %9s %7s %7s  %s\n", "#", "ranks", "layout",
                "predicted", "measured", "error", "ops<15%", "memory", "comm", "grade");
    }
    fprintf(v->table, "**Machine during the timed runs**: %s.\n\n**Validation**: %s.\n\n",
            v->during.verdict, verdict);
    fputs("| # | ranks | layout | predicted s | measured s | error | ops within 15% | memory | comm | grade |\n"
          "|---:|---:|---|---:|---:|---:|---:|---|---|---|\n", v->table);
    for (int i = 0; i < v->n_rows; i++)
        if (v->outs[i].state != ROW_OUT)
            table_row(v, term, i);
    tries_note(v, term);
    loss_summary(v, term);
    if (term)
        fprintf(term, "calibration tables: %s\n", cal);
}

/* The report: the validation chart and table, then one layout's full comparison, the scaling
 * curves and the landscape. */
static int write_report(Validation *v, PxError *err)
{
    const ValRequest *q = v->q;
    RptOutput o = {q->dir};
    int rc;
    if (v->n_timed > 0 &&
        (rc = rpt_compare_bars(&o, "validation", "step time: predicted against measured",
                               "milliseconds per step", v->timed_label, v->pred_ms, v->meas_ms,
                               v->n_timed, err)))
        return rc;
    char plan_path[1200], run_path[1200];
    snprintf(plan_path, sizeof plan_path, "%s/plan-%02d.json", q->dir, v->pick ? v->pick : 1);
    snprintf(run_path, sizeof run_path, "%s/run-%02d.json", q->dir, v->pick ? v->pick : 1);
    cJSON *pj = px_json_read_file(plan_path, err);
    cJSON *rj = pj ? px_json_read_file(run_path, err) : NULL;
    char *text = v->table_text ? strdup(v->table_text) : NULL;
    RptSection sec = {"Validation: predicted against measured",
                      v->n_timed > 0 ? "validation" : NULL, text};
    /* the header and the charts below it describe one row: say which */
    char note[240];
    const int row = v->pick ? v->pick : 1;
    const cJSON *graded = cJSON_GetObjectItemCaseSensitive(v->json, "graded");
    const int timed = cJSON_GetObjectItemCaseSensitive(v->json, "median_abs_error") != NULL;
    snprintf(note, sizeof note,
             "validation row %d (of the timed rows, the first with the most pipeline stages: the "
             "charts below draw it)%s",
             row, timed && cJSON_IsFalse(graded)
                      ? "; its measured step is not graded (the verdict below says why)"
                      : "");
    RptRequest rq = {.dir = q->dir, .title = "parallax validation", .plan = pj, .run = rj,
                     .layout_note = note,
                     .base = &q->base, .cluster = q->cluster, .gpus = q->scaling_gpus,
                     .n_gpus = q->n_scaling_gpus, .landscape = q->n_scaling_gpus > 0,
                     .extra = &sec, .n_extra = 1, .validation = v->json};
    rc = pj && rj ? rpt_build(&rq, NULL, err) : PX_ERUNTIME;
    free(text);
    cJSON_Delete(pj);
    cJSON_Delete(rj);
    return rc;
}

int val_list(const ValRequest *q, FILE *out, PxError *err)
{
    Validation v;
    int rc = validation_open(&v, q, NULL, err);
    for (int i = 0; !rc && i < v.n_rows; i++) {
        const Layout *L = &v.rows[i];
        const int ranks = L->dp * L->tp * L->pp * L->cp;
        char label[128];
        layout_label(label, sizeof label, L, i < v.n_top, q->base.job.flash_attn);
        const ModelSpec s = layout_spec(q, L);
        PxError e2 = {0};
        const char *whose, *why = refusal(q, &s, ranks, &e2, &whose);
        fprintf(out, "%3d %5d  %-54s ", i + 1, ranks, label);
        if (ranks > q->max_ranks)
            fprintf(out, "not run: beyond --max-ranks %d\n", q->max_ranks);
        else if (why)
            fprintf(out, "skipped: %s: %s\n", whose, why);
        else
            fprintf(out, "%s\n", ranks <= q->max_timing_ranks ? "timed" : "memory and communication");
    }
    validation_close(&v);
    return rc;
}

int val_run(const ValRequest *q, cJSON **json_out, FILE *log, PxError *err)
{
    *json_out = NULL;
    if (px_mkdir_p(q->dir, err))
        return PX_ERUNTIME; /* as the report's charts do: the run fails (exit 1) */
    Validation v;
    int rc = validation_open(&v, q, log, err);
    v.tries = q->tries > 0 ? q->tries : 1;
    const double t0 = px_now_s();
    int pass = 1;
    for (; !rc && pass < v.tries && !v.busy; pass++) {
        pass_progress(&v, pass, 0, t0);
        rc = timing_pass(&v, pass, 0, err);
    }
    /* the rows whose fastest try no other matched: more tries, up to twice as many in all */
    const int most = 2 * v.tries < VAL_MAX_TRIES ? 2 * v.tries : VAL_MAX_TRIES;
    for (; !rc && v.tries > 1 && !v.busy && pass < most && unmatched(&v); pass++) {
        pass_progress(&v, pass, 1, t0);
        rc = timing_pass(&v, pass, 1, err);
    }
    if (!rc)
        pass_progress(&v, 0, 0, t0);
    for (int i = 0; !rc && i < v.n_rows; i++)
        rc = validate_layout(&v, i, err);
    if (!rc) {
        answer(&v);
        fclose(v.table); /* the table's text is complete for the report */
        v.table = NULL;
        rc = write_report(&v, err);
    }
    if (!rc) {
        char path[1200];
        snprintf(path, sizeof path, "%s/validation.json", q->dir);
        rc = px_json_write_file(path, v.json, err);
    }
    if (!rc) {
        *json_out = v.json;
        v.json = NULL;
    }
    validation_close(&v);
    return rc;
}

void val_host_compare(const ProfMeasured *m, double peak, double bw, ValHostCheck *h)
{
    memset(h, 0, sizeof *h);
    if (!m || !(m->peak_flops > 0 && m->memory_bandwidth > 0) || !(peak > 0 && bw > 0))
        return;
    h->probed = 1;
    h->peak = peak;
    h->bw = bw;
    h->peak_ref = m->peak_flops;
    h->bw_ref = m->memory_bandwidth;
    h->peak_change = peak / m->peak_flops - 1;
    h->bw_change = bw / m->memory_bandwidth - 1;
    /* at the bar is within it: 110 against 100 is +10% though its double is a hair above */
    const double bar = VAL_HOST_DRIFT + 1e-9;
    h->drifted = fabs(h->peak_change) > bar || fabs(h->bw_change) > bar;
}

cJSON *val_host_json(const ValHostCheck *h)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "probed", h->probed);
    cJSON_AddNumberToObject(j, "peak_flops", h->peak);
    cJSON_AddNumberToObject(j, "peak_flops_calibrated", h->peak_ref);
    cJSON_AddNumberToObject(j, "memory_bandwidth", h->bw);
    cJSON_AddNumberToObject(j, "memory_bandwidth_calibrated", h->bw_ref);
    cJSON_AddBoolToObject(j, "drifted", h->drifted);
    cJSON_AddBoolToObject(j, "recalibrated", h->recalibrated);
    cJSON_AddBoolToObject(j, "busy", h->busy);
    if (h->busy)
        cJSON_AddStringToObject(j, "busy_why", h->busy_why);
    return j;
}

void val_host_busy(ValHostCheck *h, const ValQuiet *w)
{
    /* other processes only: a jiffy of steal in a window this short crosses its bar, and
     * steal that slows the probe slows the runs as much (the drift says so) */
    const int explained = h->peak_change <= VAL_HOST_DRIFT && h->bw_change <= VAL_HOST_DRIFT &&
                          h->peak_change > -VAL_BUSY_EXPLAINS && h->bw_change > -VAL_BUSY_EXPLAINS;
    if (h->probed && w->measured && w->other_share > VAL_QUIET_OTHER && explained) {
        h->busy = 1;
        h->drifted = 0;
        val_busy_reason(w, h->busy_why, sizeof h->busy_why);
    }
}

int val_host_probe(const ProfMeasured *m, ValHostCheck *h, PxError *err)
{
    ValHostSnap a = {0}, b = {0};
    val_host_snap(&a);
    double peak = 0, bw = 0;
    int rc = calib_probe(CALIB_DEFAULT_BACKEND, m->quick, &peak, &bw, err);
    val_host_snap(&b);
    if (!rc) {
        val_host_compare(m, peak, bw, h);
        ValQuiet w;
        val_quiet_judge(&a, &b, &w);
        val_host_busy(h, &w);
    }
    val_host_snap_free(&a);
    val_host_snap_free(&b);
    return rc;
}

void val_host_print(FILE *f, const ValHostCheck *h, const ProfMeasured *m)
{
    if (!h->probed)
        return;
    fprintf(f, "host check: GEMM %.1f GFLOP/s now, %.1f when calibrated on %s (%+.1f%%); "
               "memory %.1f GB/s now, %.1f (%+.1f%%)",
            h->peak / 1e9, h->peak_ref / 1e9, m && m->date[0] ? m->date : "?", 100 * h->peak_change,
            h->bw / 1e9, h->bw_ref / 1e9, 100 * h->bw_change);
    if (h->busy) {
        fprintf(f, ": not judged: during the probe %s, so the change says how busy the machine "
                   "was, not how fast the host is (do not calibrate now)\n",
                h->busy_why);
        return;
    }
    if (!h->drifted) {
        fprintf(f, ": within %.0f%%\n", 100 * VAL_HOST_DRIFT);
        return;
    }
    const int gemm = fabs(h->peak_change) >= fabs(h->bw_change);
    const double c = gemm ? h->peak_change : h->bw_change;
    fprintf(f, "\nhost check: this host runs %.0f%% %s than when it was calibrated (%s): predictions "
               "made with its profile are off by about as much; run `parallax calibrate` (or "
               "validate --recalibrate) to calibrate it again\n",
            100 * fabs(c), c < 0 ? "slower" : "faster", gemm ? "GEMMs" : "memory bandwidth");
}

int val_host_check(ValRequest *q, int recalibrate, FILE *log, PxError *err)
{
    const ProfMeasured *m = q->cluster->measured;
    memset(&q->host, 0, sizeof q->host);
    if (!m)
        return PX_OK;
    if (!(m->peak_flops > 0 && m->memory_bandwidth > 0)) {
        if (log)
            fprintf(log, "host check: skipped: the profile was calibrated before it recorded its "
                         "device figures (run parallax calibrate to add them)\n");
        return PX_OK;
    }
    int rc = val_host_probe(m, &q->host, err);
    if (rc)
        return rc;
    if (log)
        val_host_print(log, &q->host, m);
    if (q->host.busy && recalibrate && log)
        fprintf(log, "host check: --recalibrate: not now: a calibration on a busy machine would "
                     "measure the load\n");
    if (!q->host.drifted || !recalibrate)
        return PX_OK;
    if (log) {
        fprintf(log, "host check: --recalibrate: calibrating this machine again in place\n");
        fflush(log);
    }
    CalibJob j;
    memset(&j, 0, sizeof j);
    j.ranks = m->ranks;
    j.quick = m->quick;
    j.quiet = log == NULL;
    char path[1200];
    if (strcmp(q->cluster_ref, "local") != 0 && strchr(q->cluster_ref, '/'))
        j.output = q->cluster_ref; /* the calibrated profile the plans name */
    else if (prof_calibrated_path(path, sizeof path))
        j.output = path;
    int status = 0;
    if ((rc = calib_job(&j, &status, err)))
        return rc == PX_EINPUT ? PX_ERUNTIME : rc;
    q->host.recalibrated = 1;
    return PX_OK;
}
