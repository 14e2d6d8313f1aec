/* Memory, FLOPs and communication bytes of a layout: sums over model/'s tensor tables and op
 * graphs, with the activation peak taken from the stage's pipeline schedule. */
#include "sim/internal.h"

#include <stdlib.h>
#include <string.h>

PxDtype sim_default_precision(const ProfDevice *d) { return d->peak_bf16 > 0 ? PX_BF16 : PX_FP32; }

void sim_result_free(SimResult *r)
{
    if (!r)
        return;
    sim_time_free(r);
    if (r->ops)
        for (int i = 0; i < r->dims.p; i++)
            model_ops_free(&r->ops[i]);
    free(r->ops);
    free(r->mem);
    free(r->rank_flops);
    free(r->comm);
    memset(r, 0, sizeof *r);
}

static int stage_memory(const SimResult *r, int stage, SimStageMemory *m, PxError *err)
{
    ModelTensorTable tt;
    int rc = model_tensors_build(&r->spec, &r->dims, stage, &tt, err);
    if (rc) {
        model_tensors_free(&tt);
        return rc;
    }
    memset(m, 0, sizeof *m);
    for (int i = 0; i < tt.count; i++)
        if (!tt.t[i].per_microbatch)
            m->cat[tt.t[i].cat] += tt.t[i].bytes;
    int n_act = 2 * r->dims.m * r->dims.v;
    ModelAction *acts = malloc((size_t)n_act * sizeof *acts);
    if (!acts) {
        model_tensors_free(&tt);
        return px_fail(err, PX_ERUNTIME, "out of memory simulating the pipeline schedule");
    }
    int n = model_schedule_build(&r->dims, r->spec.layout.schedule, stage, acts);
    m->cat[MODEL_ACTIVATIONS] = model_schedule_peak(acts, n, tt.act_chunk_bytes, &m->peak_live);
    free(acts);
    m->cat[MODEL_RUNTIME] = r->cluster.device.runtime_bytes;
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        m->total += m->cat[c];
    model_tensors_free(&tt);
    return PX_OK;
}

int sim_run(const ModelSpec *spec, const ProfCluster *cl, int gpus, SimResult *r, PxError *err)
{
    memset(r, 0, sizeof *r);
    r->spec = *spec;
    r->cluster = *cl;
    if (r->spec.job.precision == PX_DTYPE_COUNT)
        r->spec.job.precision = sim_default_precision(&cl->device);
    int rc = model_spec_check(&r->spec, gpus, &r->dims, err);
    if (rc)
        return rc;
    const ModelDims *d = &r->dims;
    r->node_size = prof_node_size(cl, d->gpus);
    if (r->node_size > d->gpus)
        r->node_size = d->gpus;
    if (cl->nodes > 0 && (double)d->gpus > (double)cl->nodes * cl->node_devices)
        return px_fail(err, PX_EINPUT, "%d GPUs exceed cluster %s: %d nodes of %d", d->gpus,
                       cl->name, cl->nodes, cl->node_devices);
    r->rank_memory_bytes = prof_rank_memory(cl, r->node_size);
    r->params = model_config_params(&r->spec.model);

    r->mem = calloc((size_t)d->p, sizeof *r->mem);
    r->rank_flops = calloc((size_t)d->p, sizeof *r->rank_flops);
    r->comm = calloc((size_t)d->p, sizeof *r->comm);
    r->ops = calloc((size_t)d->p, sizeof *r->ops);
    if (!r->mem || !r->rank_flops || !r->comm || !r->ops) {
        sim_result_free(r);
        return px_fail(err, PX_ERUNTIME, "out of memory for %d pipeline stages", d->p);
    }
    /* Every TP, CP and DP rank of a stage does the same work on its shard. */
    const double replicas = (double)d->t * d->c * d->dp;
    for (int st = 0; st < d->p; st++) {
        if ((rc = stage_memory(r, st, &r->mem[st], err)) ||
            (rc = model_ops_build(&r->spec, d, st, &r->ops[st], err))) {
            sim_result_free(r);
            return rc;
        }
        if (r->mem[st].total > r->peak_bytes) {
            r->peak_bytes = r->mem[st].total;
            r->peak_stage = st;
        }
        const ModelOpGraph *g = &r->ops[st];
        for (int i = 0; i < g->count; i++) {
            const ModelOp *op = &g->op[i];
            double times = op->per_microbatch ? d->m : 1;
            r->rank_flops[st] += op->flops * times;
            r->hardware_flops += op->flops * times * replicas;
            if (op->phase == MODEL_FWD || op->phase == MODEL_BWD)
                r->model_flops += op->flops * times * replicas;
            if (op->kind == MODEL_OP_COMM)
                r->comm[st][op->comm] += op->comm_bytes * (uint64_t)op->calls * (uint64_t)times;
        }
    }
    if ((rc = sim_time(r, err))) {
        sim_result_free(r);
        return rc;
    }
    return PX_OK;
}
