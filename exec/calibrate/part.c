/* One part of a calibration on this rank: its options, and the layer over the part's ranks that
 * compute and comm measure through. */
#include <stdlib.h>
#include <string.h>

#include "exec/calibrate/internal.h"

void calib_options_defaults(CalibOptions *o)
{
    memset(o, 0, sizeof *o);
    o->part = CALIB_COMPUTE;
    o->models = CALIB_DEFAULT_MODELS;
    o->base = CALIB_DEFAULT_BASE;
    o->backend = CALIB_DEFAULT_BACKEND;
}

int calib_part_parse(const char *name, CalibPart *out, PxError *err)
{
    if (!strcmp(name, "compute"))
        *out = CALIB_COMPUTE;
    else if (!strcmp(name, "comm"))
        *out = CALIB_COMM;
    else if (!strcmp(name, "assemble"))
        *out = CALIB_ASSEMBLE;
    else if (!strcmp(name, "probe"))
        *out = CALIB_PROBE;
    else
        return px_fail(err, PX_EINPUT, "--part: expected compute, comm, assemble or probe");
    return PX_OK;
}

int calib_options_check(const CalibOptions *o, int world, PxError *err)
{
    const int assemble = o->part == CALIB_ASSEMBLE;
    const char *bad = !o->output                    ? "-o FILE is required"
                      : assemble && o->n_parts == 0 ? "assemble needs the parts' files"
                      : !assemble && o->n_parts > 0 ? "only assemble takes files"
                      : assemble && world > 1       ? "assemble runs on one rank"
                      : o->part == CALIB_PROBE && world > 1 ? "probe runs on one rank"
                                                    : NULL;
    return bad ? px_fail(err, PX_EINPUT, "%s", bad) : PX_OK;
}

int calib_part_run(const CalibOptions *o, int world, PxError *err)
{
    int rc = calib_options_check(o, world, err);
    if (rc)
        return rc;
    /* the measurements must not depend on an earlier calibration of this machine */
    setenv("PARALLAX_UNCALIBRATED", "1", 1);
    if (o->part == CALIB_ASSEMBLE)
        return calib_assemble(o, err);
    if (o->part == CALIB_PROBE)
        return calib_probe_part(o, err);
    /* every rank of the part in one data-parallel group: barriers and averages over them */
    ModelLayout l;
    memset(&l, 0, sizeof l);
    l.tp = l.pp = l.cp = l.vpp = 1;
    l.dp = world;
    CommLayer *c = NULL;
    if (world > 1)
        rc = comm_mpi(&l, 0, &c, err);
    else if (!(c = comm_single()))
        rc = px_fail(err, PX_ERUNTIME, "out of memory");
    if (!rc)
        rc = o->part == CALIB_COMPUTE ? calib_compute(o, c, err) : calib_collectives(o, c, err);
    comm_free(c);
    return rc;
}
