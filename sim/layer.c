/* One transformer layer's time: the op table of the stage that holds the middle layer of the
 * model, summed for that layer by kind of work, as the passes sum it (docs/cli.md,
 * "--layer-time"; docs/time.md, "One layer against Korthikanti Table 4"). */
#include "sim/internal.h"

#include <string.h>

/* The op at i belongs to `layer`: a compact graph's op stands for its chunk's run of layers
 * [op.layer, op.layer + repeat). */
static int holds(const ModelOp *op, int layer)
{
    return op->per_microbatch && op->layer >= 0 && layer >= op->layer && layer < op->layer + op->repeat;
}

int sim_layer_time(const SimResult *r, SimLayerTime *out, PxError *err)
{
    memset(out, 0, sizeof *out);
    if (sim_level(r) < SIM_FULL)
        return px_fail(err, PX_ERUNTIME, "the layer's time needs a full simulation");
    const int layer = r->spec.model.layers / 2;
    int stage = -1;
    for (int s = 0; s < r->dims.p && stage < 0; s++)
        for (int i = 0; i < r->ops[s].count; i++)
            if (holds(&r->ops[s].op[i], layer)) {
                stage = s;
                break;
            }
    if (stage < 0)
        return px_fail(err, PX_ERUNTIME, "no stage holds layer %d", layer);
    const ModelOpGraph *g = &r->ops[stage];
    const double *t = r->op_seconds[stage];
    const double slow = r->cluster.overlap_slowdown;
    SimCtx c;
    sim_ctx_init(&c, &r->cluster, &r->spec, &r->dims, r->node_size);
    out->layer = layer;
    out->stage = stage;
    out->chunk = -1;
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        if (!holds(op, layer))
            continue;
        if (out->chunk < 0)
            out->chunk = op->chunk;
        /* recompute belongs to the backward, as the passes sum it */
        SimPassTime *p = op->phase == MODEL_FWD ? &out->fwd : &out->bwd;
        if (op->kind == MODEL_OP_COMM) {
            const ModelGroup grp = model_comm_group(op->comm);
            /* ZeRO's gathers and reduce-scatters overlap across layers: the zero line's */
            if (grp == MODEL_GROUP_DP || grp == MODEL_GROUP_EDP || grp == MODEL_GROUP_DPR ||
                grp == MODEL_GROUP_PP)
                continue;
            const double e = sim_comm_exposed(g, t, i, &r->spec.layout, r->dims.m, slow);
            p->comm_exposed_s += e;
            /* exposed = (c - hidden) + slowdown x hidden */
            if (slow < 1.0 && t[i] > e)
                p->comm_hidden_s += (t[i] - e) / (1.0 - slow);
            p->total_s += e;
            continue;
        }
        p->total_s += t[i];
        if (op->phase == MODEL_RECOMPUTE)
            out->bwd.recompute_s += t[i];
        if (op->kind == MODEL_OP_ATTENTION) {
            p->attn_core_s += t[i];
            /* an unfused core's batched GEMMs (QK^T and PV), the rest its softmax and dropout;
             * a fused (flash) kernel is one piece */
            for (int k = 0; !r->spec.job.flash_attn && k < op->n_gemm; k++)
                p->attn_gemm_s += sim_gemm_seconds_as(&c, &op->gemm[k], op->fp8, NULL);
        } else if (op->kind == MODEL_OP_MATMUL) {
            /* the GEMMs; a fused epilogue (bias, dropout, residual) is elementwise work */
            double gemm = 0;
            for (int k = 0; k < op->n_gemm; k++)
                gemm += sim_op_gemm_seconds(&c, op, k, op->fp8);
            if (gemm > t[i])
                gemm = t[i];
            p->gemm_s += gemm;
            p->elementwise_s += t[i] - gemm;
        } else {
            p->elementwise_s += t[i];
        }
    }
    return PX_OK;
}

static void pass_json(cJSON *j, const char *key, const SimPassTime *p, int bwd)
{
    cJSON *e = cJSON_AddObjectToObject(j, key);
    cJSON_AddNumberToObject(e, "total_s", p->total_s);
    cJSON_AddNumberToObject(e, "gemm_s", p->gemm_s);
    cJSON_AddNumberToObject(e, "attention_core_s", p->attn_core_s);
    cJSON_AddNumberToObject(e, "attention_gemm_s", p->attn_gemm_s);
    cJSON_AddNumberToObject(e, "elementwise_s", p->elementwise_s);
    cJSON_AddNumberToObject(e, "comm_exposed_s", p->comm_exposed_s);
    cJSON_AddNumberToObject(e, "comm_hidden_s", p->comm_hidden_s);
    if (bwd)
        cJSON_AddNumberToObject(e, "recompute_s", p->recompute_s);
}

cJSON *sim_layer_time_to_json(const SimLayerTime *lt)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "layer", lt->layer);
    cJSON_AddNumberToObject(j, "stage", lt->stage);
    cJSON_AddNumberToObject(j, "chunk", lt->chunk);
    pass_json(j, "forward", &lt->fwd, 0);
    pass_json(j, "backward", &lt->bwd, 1);
    return j;
}

static void pass_print(FILE *f, const char *name, const SimPassTime *p)
{
    fprintf(f, "%-9s %8.3f %8.3f %9.3f %8.3f %11.3f %9.3f %9.3f %9.3f\n", name, 1e3 * p->total_s,
            1e3 * p->gemm_s, 1e3 * p->attn_core_s, 1e3 * p->attn_gemm_s, 1e3 * p->elementwise_s,
            1e3 * p->comm_exposed_s, 1e3 * p->comm_hidden_s, 1e3 * p->recompute_s);
}

void sim_layer_time_print(FILE *f, const SimResult *r, const SimLayerTime *lt)
{
    fprintf(f, "\none layer (ms): layer %d of %d, stage %d chunk %d, one micro-batch of %d x %d tokens\n",
            lt->layer, r->spec.model.layers, lt->stage, lt->chunk, r->spec.job.micro_batch, r->dims.s);
    fprintf(f, "%-9s %8s %8s %9s %8s %11s %9s %9s %9s\n", "pass", "total", "gemm", "attn core",
            "(its bmm)", "elementwise", "comm exp", "comm hid", "recompute");
    pass_print(f, "forward", &lt->fwd);
    pass_print(f, "backward", &lt->bwd);
    fprintf(f, "total = gemm + attn core + elementwise + comm exp; the backward includes what recompute re-runs\n");
}
