/* launch — starting parallax-worker for a job: directly for one rank, through mpirun or, inside
 * a Slurm allocation, srun for several (one process per rank). The front end (`parallax run`,
 * `parallax calibrate`) uses it; it needs no MPI library, no kernels, only the launcher program
 * on PATH, so the front end stays a program that plans on a laptop.
 *
 * Example (what `parallax run plan.json` does for a plan of 8 ranks):
 *   LaunchKind kind = LAUNCH_DEFAULT;                 // or from --launcher
 *   PxError err = {0};
 *   if (name && launch_kind_parse(name, &kind, &err))
 *       ...                                           // exit 2 with err.msg
 *   const char *args[] = {"run", "plan.json", "--steps", "20", NULL};
 *   LaunchJob job = {kind, 8, "plan.json"};
 *   int status = 0;
 *   if (launch_worker(&job, args, &status, &err))     // mpirun -n 8 parallax-worker run ...
 *       ...                                           // exit 1 (2 for PX_EINPUT) with err.msg
 *   return status;                                    // the worker's
 */
#ifndef LAUNCH_H
#define LAUNCH_H

#include <stddef.h>

#include "common/px.h"

typedef enum {
    LAUNCH_DEFAULT = 0, /* one rank: none; several: srun under Slurm, else mpirun; mpirun with
                         * a hostfile */
    LAUNCH_NONE,        /* the worker directly (a job that is already one rank of a launch) */
    LAUNCH_MPIRUN,
    LAUNCH_SRUN
} LaunchKind;

typedef struct {
    LaunchKind kind;
    int ranks;            /* processes to start */
    const char *what;     /* names the job in messages: the plan's path, "calibrate" */
    const char *hostfile; /* mpirun only: the nodes and their slots (NULL: this machine) */
} LaunchJob;

/* "mpirun", "srun" or "none" (--launcher's values); PX_EINPUT naming the value otherwise, *out
 * unchanged. */
int launch_kind_parse(const char *name, LaunchKind *out, PxError *err);

/* Runs parallax-worker with args (NULL-terminated, after the program name) on j->ranks
 * processes, waiting for it with SIGINT / SIGTERM ignored here (the worker gets them and stops
 * at a step boundary). *exit_status gets the worker's (or launcher's) exit status. PX_EINPUT:
 * a Slurm allocation too small; PX_ERUNTIME: no worker, no launcher on PATH, or the job died
 * from a signal; PX_EINPUT for a hostfile with another launcher than mpirun. mpirun gets
 * --hostfile when j has one, else --oversubscribe --bind-to none when the ranks outnumber the
 * cores; --allow-run-as-root for root; -x for each PARALLAX_* variable set, so that ranks on other
 * nodes see them. srun gets --mpi=pmix unless SLURM_MPI_TYPE chooses, and --gpu-bind=none. */
int launch_worker(const LaunchJob *j, const char *const *args, int *exit_status, PxError *err);

#endif
