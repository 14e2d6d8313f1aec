/* exec — what remains of the executor's old header: calibration (calibrate.c for the worker's
 * parts, calibrate_job.c for the front end's `parallax calibrate`). The trainer is
 * exec/train/train.h, the communication layer exec/comm/comm.h, the launcher
 * exec/launch/launch.h, checkpoints exec/checkpoint/checkpoint.h. */
#ifndef EXEC_H
#define EXEC_H

#include "exec/launch/launch.h"
#include "exec/train/train.h"

/* ---- calibration (calibrate.c, calibrate_job.c) ---- */

/* `parallax-worker calibrate ...` on this rank of `world` (argv[0] is "calibrate"): one part of
 * a calibration, the exit status (0, 1 runtime, 2 bad input). */
int exec_calibrate_main(int argc, char **argv, int rank, int world);

typedef struct {
    const char *output;  /* the profile to write; NULL: prof_calibrated_path's */
    int ranks;           /* the most ranks at once, and the collectives' world; 0: the cores */
    const char *models;  /* calibration models, comma-separated; NULL: "tiny,tiny-llama" */
    const char *base;    /* the cluster profile the measurements extend; NULL: "local" */
    const char *backend; /* "cpu" or "cuda"; NULL: "cpu" */
    int quick;           /* fewer shapes, sizes and repetitions: a rough profile in seconds */
    int quiet;
    LaunchKind launcher;
} ExecCalibrateJob;

/* `parallax calibrate`: runs the worker's compute part on 1, 2, 4, ... up to j->ranks ranks at
 * once, the comm part on j->ranks ranks, then assembles the profile (a temporary folder holds
 * the parts; it is removed on success, kept and named on failure). *exit_status gets the
 * failing part's status; PX_EINPUT / PX_ERUNTIME as launch_worker. */
int exec_calibrate_job(const ExecCalibrateJob *j, int *exit_status, PxError *err);

#endif
