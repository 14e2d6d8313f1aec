/* calib — calibration: measure this machine through the executor's own kernels, trainer and
 * communication layer, and write what was measured as a cluster profile the simulator reads
 * (profiles/profile.h's `measured` section; docs/calibration.md).
 *
 * A calibration runs in parts, each its own launch of parallax-worker so that every part runs
 * exactly as many ranks as it measures:
 *   compute   on c ranks at once, for each concurrency c of 1, 2, 4, ... up to the ranks asked
 *             for: every rank times the GEMMs of the calibration models' op graphs at their
 *             shapes and transposes, the device's GEMM peak and stream bandwidth, then trains
 *             those models for a few steps on one rank each (every op timed under its op-graph
 *             name) and fits, per kind of op, phase and variant, a fixed cost and a rate over the
 *             simulator's own size of each op; a matmul's fit is over what its measured GEMMs
 *             leave. The ranks' figures are averaged: they ran side by side, sharing caches and
 *             memory bandwidth as a job of c ranks does.
 *   comm      on all the ranks: all-reduce, all-gather and reduce-scatter over groups of 2, 4, ...
 *             ranks (all groups at once, as in a job) and send/recv between pairs, over message
 *             sizes; times are the slowest rank's, printed with nccl-tests' algbw and busbw.
 *   assemble  on one rank: the base cluster profile with the parts' measurements added (and the
 *             device's peak and bandwidth replaced by the measured ones on the generic CPU
 *             device, or its efficiencies set from them otherwise), checked and written
 *             atomically.
 * `parallax calibrate` runs the parts in turn through the launcher (calib_job): that is the
 * front end's part, library px_calib_job, which needs neither MPI nor the kernels. The parts are
 * the worker's (calib_part_run), library px_calib.
 *
 * Example (the front end: `parallax calibrate --quick --ranks 2 -o p.json`):
 *   CalibJob j = {0};
 *   j.output = "p.json";
 *   j.ranks = 2;
 *   j.quick = 1;
 *   int status = 0;
 *   PxError err = {0};
 *   if (calib_job(&j, &status, &err))            // status: the failing part's exit status
 *       fprintf(stderr, "parallax calibrate: %s\n", err.msg);
 *
 * Example (one part, on each rank of `parallax-worker calibrate --part compute` under mpirun):
 *   CalibOptions o;
 *   calib_options_defaults(&o);
 *   o.part = CALIB_COMPUTE;
 *   o.output = "compute-2.json";                 // rank 0 writes it
 *   if (calib_options_check(&o, world, &err) || calib_part_run(&o, world, &err))
 *       ...                                      // world > 1: end the job, comm_mpi_abort
 */
#ifndef EXEC_CALIBRATE_H
#define EXEC_CALIBRATE_H

#include "common/px.h"
#include "exec/launch/launch.h"

/* What a calibration measures and extends when not told: the job's and the part's defaults
 * alike. */
#define CALIB_DEFAULT_MODELS "tiny,tiny-llama"
#define CALIB_DEFAULT_BASE "local"
#define CALIB_DEFAULT_BACKEND "cpu"

/* ---- one part (px_calib: the worker's, with the kernels, the trainer and exec/comm) ---- */

/* probe: the compute part's device figures alone (a rank's GEMM peak and streaming bandwidth),
 * which validate's host check sets against the profile's */
typedef enum { CALIB_COMPUTE = 0, CALIB_COMM, CALIB_ASSEMBLE, CALIB_PROBE } CalibPart;

typedef struct {
    CalibPart part;
    const char *output;  /* the part's JSON, or the profile (assemble) */
    const char *models;  /* calibration models, comma-separated */
    const char *base;    /* the cluster profile the measurements extend */
    const char *backend; /* compute: "cpu" or "cuda" */
    const char *samples; /* compute: every op sample as CSV, to look at the fits; NULL: none */
    int quick;           /* fewer shapes, sizes and repetitions: a rough profile in seconds */
    int quiet;           /* no progress lines */
    const char *const *parts; /* assemble: the parts' files */
    int n_parts;
} CalibOptions;

/* Compute, the CALIB_DEFAULT_ models, base and backend; no output, samples or parts. */
void calib_options_defaults(CalibOptions *o);
/* "compute", "comm" or "assemble"; PX_EINPUT otherwise ("--part: expected ..."). */
int calib_part_parse(const char *name, CalibPart *out, PxError *err);
/* Whether the options fit together for a job of `world` ranks: an output, the parts' files for
 * assemble and only for it, assemble on one rank. PX_EINPUT naming what is wrong. */
int calib_options_check(const CalibOptions *o, int world, PxError *err);
/* Runs part o->part on this process, one rank of `world` (MPI running when world > 1):
 * compute and comm over a layer of every rank, rank 0 printing progress lines (unless quiet)
 * and writing o->output; assemble alone. What it measures ignores an earlier calibration of
 * this machine (it sets PARALLAX_UNCALIBRATED). PX_EINPUT names the option, model, profile or
 * part file at fault; PX_ERUNTIME otherwise. Compute and comm are collective: a rank may fail
 * alone, and then the caller ends the job (comm_mpi_abort) so that no rank waits for it. */
int calib_part_run(const CalibOptions *o, int world, PxError *err);

/* ---- the job (px_calib_job: the front end's, without MPI or the kernels) ---- */

typedef struct {
    const char *output;  /* the profile to write; NULL: prof_calibrated_path's */
    int ranks;           /* the most ranks at once, and the collectives' world; 0: the cores */
    const char *models;  /* calibration models, comma-separated; NULL: CALIB_DEFAULT_MODELS */
    const char *base;    /* the cluster profile the measurements extend; NULL: CALIB_DEFAULT_BASE */
    const char *backend; /* "cpu" or "cuda"; NULL: CALIB_DEFAULT_BACKEND */
    int quick;           /* fewer shapes, sizes and repetitions: a rough profile in seconds */
    int quiet;
    LaunchKind launcher;
    const char *log;     /* the parts' tables: this file; NULL: beside the profile
                          * (calib_log_path); "-": the terminal. Progress lines stay on stdout. */
} CalibJob;

/* Where a calibration writing `profile` puts its tables when not told: "p.json" ->
 * "p.calibration.txt" (validate names it, and copies it beside its report). */
void calib_log_path(const char *profile, char *out, size_t cap);

/* `parallax calibrate`: runs the worker's compute part on 1, 2, 4, ... up to j->ranks ranks at
 * once, the comm part on j->ranks ranks, then assembles the profile (a temporary folder holds
 * the parts; it is removed on success, kept and named in the message on failure). *exit_status
 * gets the failing part's status; PX_EINPUT / PX_ERUNTIME as exec_launch. */
int calib_job(const CalibJob *j, int *exit_status, PxError *err);

/* The probe part on one rank (parallax-worker, no launcher): the device's GEMM peak (*peak,
 * FLOP/s) and streaming bandwidth (*bw, B/s) as the compute part measures them, with --quick's
 * sizes when quick. About a second on a CPU. PX_ERUNTIME when the part fails. */
int calib_probe(const char *backend, int quick, double *peak, double *bw, PxError *err);

#endif
