/* a Slurm batch script export. */
#include "sim/internal.h"

int sim_export_slurm(FILE *f, const ModelPlan *p, const ModelDims *d, PxError *err)
{
    (void)f;
    (void)p;
    (void)d;
    return px_fail(err, PX_EINPUT, "export --format slurm is not written yet");
}
