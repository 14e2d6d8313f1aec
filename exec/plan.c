/* Plans without the planner: a layout and job, simulated on a cluster profile, written as the
 * plan the executor reads (tests and exec_mkplan use it). */
#include <string.h>

#include "exec/exec.h"

int exec_plan_make(const ModelSpec *spec, const char *cluster, int gpus, ModelPlan *out,
                   PxError *err)
{
    memset(out, 0, sizeof *out);
    ProfCluster cl;
    int rc = prof_cluster_load(cluster, NULL, 0, &cl, err);
    if (rc)
        return rc;
    SimResult r;
    /* the result shares the cluster's measurements: free it after the result */
    if ((rc = sim_run(spec, &cl, gpus, &r, err))) {
        prof_cluster_free(&cl);
        return rc;
    }
    out->spec = r.spec; /* normalised: dp, precision, global batch filled in */
    px_strlcpy(out->cluster, cluster, sizeof out->cluster);
    out->gpus = r.dims.gpus;
    out->prediction = sim_prediction_to_json(&r);
    sim_result_free(&r);
    prof_cluster_free(&cl);
    return PX_OK;
}
