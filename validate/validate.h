/* val — validation on the machine at hand: plan a spread of layouts of a model on this
 * machine's (calibrated) profile, train each for real through `parallax run` (a subprocess, so
 * the front end needs no MPI), set prediction against measurement quantity by quantity
 * (rpt_compare) and write the report with its charts (reports/). Timing layouts use no more
 * ranks than cores; memory and communication are compared at any rank count.
 *
 * Example:
 *   ValRequest q;
 *   val_request_defaults(&q);                  // 20 steps, up to 8 ranks, timing up to the cores
 *   q.base = spec;                             // the model and the job
 *   q.cluster = &cluster;                      // this machine's profile, loaded as "local"
 *   cJSON *j = NULL;
 *   if (val_request_resolve(&q, "local", &err) || val_run(&q, &j, stdout, &err))
 *       fprintf(stderr, "parallax validate: %s\n", err.msg);
 *   // validation/plan-NN.json, run-NN.json, run-NN.log, validation.json, calibration.txt,
 *   // report.md, report.html
 *   cJSON_Delete(j);
 */
#ifndef VAL_H
#define VAL_H

#include <stdio.h>

#include "common/px.h"
#include "sim/sim.h"

/* The host check: whether this machine still runs as fast as when its profile was calibrated
 * (a short probe of the device's GEMM rate and streaming bandwidth, as calibrate measured
 * them). Beyond VAL_HOST_DRIFT either way, the profile's predictions are off by about as much. */
#define VAL_HOST_DRIFT 0.10
typedef struct {
    int probed;                    /* 0: not checked (no calibrated profile, or one without its figures) */
    double peak, bw;               /* probed now: FLOP/s, B/s */
    double peak_ref, bw_ref;       /* the profile's, from calibrate */
    double peak_change, bw_change; /* now / then - 1 */
    int drifted;                   /* either change beyond VAL_HOST_DRIFT, on a quiet machine */
    int recalibrated;              /* val_host_check calibrated again: load the profile again */
    int busy;                      /* other work shared the CPUs during the probe (not drifted) */
    char busy_why[200];            /* val_busy_reason of the probe's window, when busy */
} ValHostCheck;

/* Is the machine quiet? Step times measured while other work shares the CPUs say how busy the
 * host was, not how good the prediction is, so validate measures the host before and during its
 * timed runs and grades them only on a quiet machine: other processes under VAL_QUIET_OTHER of
 * the cores' time and steal (a virtual machine's CPUs taken by its host) under VAL_QUIET_STEAL.
 * Other processes' time is the CPUs' busy time (/proc/stat) less the validation's own tree's
 * (getrusage of validate and the runs it waited for). */
#define VAL_QUIET_OTHER 0.05
#define VAL_QUIET_STEAL 0.01
/* the window before the timed runs lasts this long at least (validate waits out the rest) */
#define VAL_QUIET_BEFORE_S 1.0
/* Tries: a host's speed changes from one second to the next where it is shared below what
 * /proc shows (a virtual machine's cores on hyperthreads and a last-level cache that other
 * tenants use), and such interference only ever adds time. So each timed layout is run this
 * many times, the tries spread over the validation (every timed layout once, then again), and
 * its fastest run is the one compared; on a busy machine, whose rows are not graded, once. */
#define VAL_TRIES 5
#define VAL_MAX_TRIES 10
/* A timed layout's fastest try counts as found when another try came within this of it; one
 * whose fastest no other try matched gets more tries, up to twice --tries (VAL_MAX_TRIES at
 * most): a lone fast try among slow ones is the host's fast phase found once, a lone try that
 * is fastest only because all were slow is matched by none. */
#define VAL_MATCH 0.05
/* a timed layout passes when its step is within this of the prediction */
#define VAL_PASS_ERROR 0.10
enum { VAL_QUIET_NAMED = 3 }; /* the busiest other processes named in the verdict */

/* /proc/stat's first line in jiffies: every field, the busy ones (user, nice, system, irq,
 * softirq), steal (-1: not reported); cpus: its cpuN lines */
typedef struct {
    long long total, busy, steal;
    int cpus;
} ValCpuTimes;

/* A process from /proc/[pid]/stat: utime + stime in ticks, its start (ticks after boot) */
typedef struct {
    int pid;
    char comm[32];
    long long ticks, start;
} ValProc;

typedef struct {
    double t_s;        /* monotonic clock */
    int have_stat;     /* /proc/stat was read */
    ValCpuTimes cpu;
    double load1;      /* /proc/loadavg's 1-minute figure (-1: unread) */
    double own_cpu_s;  /* this process and its reaped children */
    long clk_tck;
    ValProc *procs;    /* every other process, by pid */
    int n_procs, cap_procs;
} ValHostSnap;

typedef struct {
    int measured;               /* 0: /proc/stat unreadable: quiet unknown, not graded */
    int quiet;
    double window_s, cpu_s;     /* the window, and the CPUs' time in it */
    int cores;
    double load;                /* the higher 1-minute load of the window's two ends */
    double own_cpu_s, other_cpu_s, other_share;
    double steal_s, steal_share; /* steal_s NaN where the kernel does not report it */
    char busiest[VAL_QUIET_NAMED][32];
    double busiest_s[VAL_QUIET_NAMED];
    int n_busiest;
    char verdict[400];          /* "busy: other processes used 48.0% of the 2 cores' time ..." */
} ValQuiet;

/* /proc/stat's text into *out; PX_EINPUT when its first line is not "cpu" with 4+ figures. */
int val_proc_stat_parse(const char *text, ValCpuTimes *out);
/* /proc/[pid]/stat's text into *out; PX_EINPUT when malformed. */
int val_proc_pid_stat_parse(const char *text, ValProc *out);
/* The host now (s: zeroed before the first call; val_host_snap_free after the last). */
void val_host_snap(ValHostSnap *s);
void val_host_snap_free(ValHostSnap *s);
/* The window from a to b judged against the bars, the verdict written. */
void val_quiet_judge(const ValHostSnap *a, const ValHostSnap *b, ValQuiet *q);
/* Why a measured window was not quiet, for the verdict: "other processes took 78% of the cores'
 * time (quiet is under 5%)", or where others stayed under their bar, "the hypervisor took 1.7%
 * of the CPUs' time from this machine (steal; quiet is under 1%)". */
void val_busy_reason(const ValQuiet *q, char *buf, size_t cap);
/* {quiet (null: not measured), load, other_cpu_s, steal_s (null: not reported), verdict,
 * window_s, cores, cpu_s, other_share, other_share_max, steal_share_max, before {window_s, load,
 * other_cpu_s, other_share} (before: NULL or unmeasured: none)} */
cJSON *val_quiet_json(const ValQuiet *q, const ValQuiet *before);

typedef struct {
    char parallax[1024];     /* the parallax executable: runs are launched through `parallax run` */
    const char *dir;         /* plans, runs, logs and the report */
    ModelSpec base;          /* model and job */
    const ProfCluster *cluster;
    char cluster_ref[1200];  /* the profile as the plans name it (a name or a path) */
    int max_timing_ranks;    /* timing layouts use at most this many ranks (the cores) */
    int max_ranks;           /* memory and communication layouts up to this many */
    int steps;               /* steps per timing run (the median of those after the first) */
    int tries;               /* timed runs per timed layout, the fastest kept (VAL_TRIES) */
    int max_layouts;         /* only the first this many rows (the planner's first); 0: all */
    int scaling_gpus[8];     /* scaling curves and landscape in the report (none: no curves) */
    int n_scaling_gpus;
    ValHostCheck host;       /* val_host_check's result, in the JSON and the report */
    ValHostSnap start;       /* the host when validate began (val_host_snap; none: t_s 0) */
    char calibration_log[1300]; /* the calibrated profile's tables (val_request_resolve; "": none) */
} ValRequest;

/* Everything zero but the defaults: the report in "validation", 20 steps per timing run,
 * layouts up to 8 ranks, timing up to as many ranks as this machine has cores. */
void val_request_defaults(ValRequest *q);
/* What follows from the request once its limits are set and its cluster loaded (as
 * cluster_name): the scaling sizes 1, 2, 4, ... up to max_ranks; cluster_ref, the calibrated
 * profile's path where cluster_name is "local" and this machine has one, else cluster_name;
 * and, when parallax is empty, the running executable (the parallax program calls this).
 * PX_ERUNTIME when the executable cannot be found. */
int val_request_resolve(ValRequest *q, const char *cluster_name, PxError *err);
/* "validating <model> on <cluster> (calibrated or not): N cores, timing up to ..." */
void val_print_header(FILE *f, const ValRequest *q);

/* The probe's figures (peak FLOP/s, bw B/s) against the calibrated profile's measured section:
 * fills h (probed 0, and nothing else, where m has no figures). */
void val_host_compare(const ProfMeasured *m, double peak, double bw, ValHostCheck *h);
/* The probe of m's figures, with the machine watched while it runs: where other processes
 * took more than the quiet bar, a slower probe says how busy the machine was, not how fast the
 * host is, so h is marked busy (with the reason) and not drifted. Load explains a probe up to
 * ten times slower (VAL_BUSY_EXPLAINS), never a faster one: those stay drifted. */
#define VAL_BUSY_EXPLAINS 0.9
/* That judgement of h (val_host_compare's) over the probe's window w. */
void val_host_busy(ValHostCheck *h, const ValQuiet *w);
int val_host_probe(const ProfMeasured *m, ValHostCheck *h, PxError *err);
/* "host check: GEMM 52.3 GFLOP/s now, 51.9 when calibrated on <date> (+0.8%); ..." and, beyond
 * VAL_HOST_DRIFT, by how much the host is faster or slower and what to run. */
void val_host_print(FILE *f, const ValHostCheck *h, const ProfMeasured *m);
/* {probed, peak_flops, peak_flops_calibrated, memory_bandwidth, memory_bandwidth_calibrated,
 * drifted, recalibrated} (the caller's to free) */
cJSON *val_host_json(const ValHostCheck *h);
/* Whether the host ran at its calibrated speed around the timed runs, so that their step errors
 * are the model's: 1 when neither probe drifted beyond VAL_HOST_DRIFT (before: the check ahead
 * of the runs, which counts only when the host was not calibrated again then; after: the probe
 * once they ended), or no probe was made; else 0, and `why` says which probe moved, what and by
 * how much ("GEMMs 12.0% slower after the timed runs than when calibrated"). */
int val_host_steady(const ValHostCheck *before, const ValHostCheck *after, char *why, size_t cap);

/* The host check of a calibrated q->cluster (nothing when it is not calibrated): probes this
 * machine (calib_probe), compares, prints to log (NULL: quiet); with recalibrate, a drifted
 * host is calibrated again in place (`parallax calibrate` with the profile's --quick and ranks)
 * and q->host.recalibrated set: the caller loads the profile again. PX_ERUNTIME when the probe
 * or the calibration fails. */
int val_host_check(ValRequest *q, int recalibrate, FILE *log, PxError *err);
/* The rows val_run would run, one line each, without running any: its number, ranks and layout,
 * then "timed", "memory and communication", "not run: beyond --max-ranks N" or "skipped: " and
 * whose refusal (the model's or the executor's, model_exec_refusal) with its sentence. */
int val_list(const ValRequest *q, FILE *out, PxError *err);

/* Runs each layout of a fixed spread that the model takes (the planner's best on the timing
 * ranks first, then every kind of parallelism alone and in pairs, each schedule, ZeRO stages,
 * recompute modes), compares, and writes the report with a validation chart. The host is
 * measured from q->start to the first timed run (a second at least) and over the timed runs
 * (val_quiet_judge); the timed rows are graded (within VAL_PASS_ERROR) only on a quiet machine.
 * *json, also written to DIR/validation.json, gets {model, cluster, layouts[] {index, layout,
 * ranks, timing, predicted {step_s}, measured {step_s}, step_error, ops_over_1pct,
 * ops_within_15pct, machine (the run's own window), grade ("pass", "FAIL", "not graded"), steps,
 * loss_first, loss_last, memory_equal, comm_equal, compare}, machine (val_quiet_json of the
 * timed runs, with before), host_check_after (val_host_json of the probe after the timed runs,
 * where q->host was probed), graded (quiet, and val_host_steady), verdict, pass_error,
 * median_abs_error, max_abs_error,
 * calibration_log (DIR/calibration.txt, or null)}; each timed run-NN.json gets its machine too.
 * `log` (NULL: quiet) gets a progress line per layout, the busy warning before the runs when the
 * machine was busy, then the answer: the machine, the verdict, the table, the losses and where
 * the calibration's tables are. PX_ERUNTIME names the run that failed and its log. */
int val_run(const ValRequest *q, cJSON **json, FILE *log, PxError *err);

#endif
