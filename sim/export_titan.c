/* torchtitan export. */
#include "sim/internal.h"

int sim_export_torchtitan(FILE *f, const ModelPlan *p, const ModelDims *d, PxError *err)
{
    (void)f;
    (void)p;
    (void)d;
    return px_fail(err, PX_EINPUT, "export --format torchtitan is not written yet");
}
