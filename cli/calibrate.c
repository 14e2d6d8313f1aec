/* parallax calibrate: measures this machine through the executor's kernels and communication
 * layer and writes a calibrated cluster profile (calib_job does the work). */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "exec/calibrate/calibrate.h"
#include "exec/launch/launch.h"
#include "validate/validate.h"

enum { CAL_RANKS = CLI_EXTRA, CAL_MODELS, CAL_BASE, CAL_BACKEND, CAL_QUICK, CAL_QUIET, CAL_LAUNCHER, CAL_LOG };

static const CliOption calibrate_options[] = {
    {"output", 1, "FILE",
     "profile to write (default profiles/local-<host>.json, which --cluster local then uses)",
     CLI_OUTPUT, 'o'},
    {"ranks", 1, "N", "most ranks at once, and the collectives' ranks (default: the cores)",
     CAL_RANKS, 0},
    {"models", 1, "LIST", "models whose GEMM shapes and ops are measured (default tiny,tiny-llama)",
     CAL_MODELS, 0},
    {"base", 1, "PROFILE", "cluster profile the measurements extend (default local)", CAL_BASE, 0},
    {"backend", 1, "B", "cpu or cuda (default cpu)", CAL_BACKEND, 0},
    {"quick", 0, NULL, "fewer shapes, sizes and repetitions: a rough profile in seconds", CAL_QUICK, 0},
    {"quiet", 0, NULL, "no progress lines", CAL_QUIET, 0},
    {"log", 1, "FILE",
     "the measurements' tables (default: beside the profile, p.json's in p.calibration.txt; - for "
     "the terminal)",
     CAL_LOG, 0},
    {"launcher", 1, "L", "mpirun, srun or none (default: srun under Slurm, else mpirun)",
     CAL_LAUNCHER, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static const char *const calibrate_usage =
    "[-o FILE] [--ranks N] [--models LIST] [--base PROFILE] [--backend B] [--quick] [--log FILE]\n\n"
    "Measures this machine and writes a cluster profile the simulator reads: GEMM times at the\n"
    "op graphs' shapes and per-kind op rates from real training steps, with 1, 2, 4, ... ranks\n"
    "running at once (they share caches and memory bandwidth), the device's GEMM peak and\n"
    "stream bandwidth, and all-reduce, all-gather, reduce-scatter and send/recv times over\n"
    "message and group sizes (tabled with nccl-tests' algbw and busbw in the log, which\n"
    "validate names).";

int cli_cmd_calibrate(int argc, char **argv)
{
    CliArgs a = {0};
    const CliOption *const tables[] = {calibrate_options, NULL};
    int status = cli_parse("calibrate", calibrate_usage, argc, argv, tables, 0, &a);
    if (status >= 0)
        return status;
    PxError err = {0};
    CalibJob j = {0};
    j.output = a.output;
    j.models = a.extra[CAL_MODELS - CLI_EXTRA];
    j.base = a.extra[CAL_BASE - CLI_EXTRA];
    j.backend = a.extra[CAL_BACKEND - CLI_EXTRA];
    j.quick = a.extra[CAL_QUICK - CLI_EXTRA] != NULL;
    j.quiet = a.extra[CAL_QUIET - CLI_EXTRA] != NULL;
    j.log = a.extra[CAL_LOG - CLI_EXTRA];
    const char *v;
    int rc = PX_OK;
    if ((v = a.extra[CAL_RANKS - CLI_EXTRA]))
        rc = px_parse_int(v, "--ranks", 1, 4096, &j.ranks, &err);
    if (!rc && (v = a.extra[CAL_LAUNCHER - CLI_EXTRA]))
        rc = launch_kind_parse(v, &j.launcher, &err);
    if (!rc && j.backend && strcmp(j.backend, "cpu") != 0 && strcmp(j.backend, "cuda") != 0)
        rc = px_fail(&err, PX_EINPUT, "--backend: expected cpu or cuda, got '%s'", j.backend);
    if (!rc) {
        /* a profile measured while other work shared the CPUs describes the load: say so */
        ValHostSnap before = {0}, after = {0};
        val_host_snap(&before);
        int exit_status = 0;
        rc = calib_job(&j, &exit_status, &err);
        if (rc && exit_status == 2)
            rc = PX_EINPUT;
        val_host_snap(&after);
        ValQuiet m;
        val_quiet_judge(&before, &after, &m);
        if (!rc && !j.quiet && m.measured)
            printf("calibrate: machine during the measurements: %s%s\n", m.verdict,
                   m.quiet ? "" : ": the profile describes this load as much as the machine; "
                                  "calibrate again on a quiet machine");
        val_host_snap_free(&before);
        val_host_snap_free(&after);
    }
    return rc ? cli_fail("calibrate", rc, &err) : 0;
}
