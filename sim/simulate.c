/* Memory, FLOPs and communication bytes of a layout: sums over model/'s tensor tables and op
 * graphs, with the activation peak taken from the stage's pipeline schedule. */
#include "sim/internal.h"

#include <stdlib.h>
#include <string.h>

/* bf16 where the device has bf16 rates; fp32 on CPUs, whose bf16 and fp16 rates are the fp32
 * GEMM's (profiles/devices/cpu.json: the CPU's 16-bit kernels widen to fp32), so 16 bits there
 * is asked for, never a default */
PxDtype sim_default_precision(const ProfDevice *d)
{
    return d->peak_bf16 > 0 && !prof_device_is_cpu(d) ? PX_BF16 : PX_FP32;
}

int sim_resolve_job(ModelJob *j, const ProfDevice *dev, PxError *err)
{
    if (j->precision == PX_DTYPE_COUNT)
        j->precision = sim_default_precision(dev);
    if (j->fp8 == MODEL_FP8_NONE)
        return PX_OK;
    if (prof_peak_flops(dev, PX_FP8) <= 0)
        return px_fail(err, PX_EINPUT,
                       "device %s has no FP8 tensor cores: FP8 training (--precision fp8, "
                       "--fp8-recipe %s) needs Hopper (H100, H200) or Blackwell (B200, GB200)",
                       dev->name, model_fp8_recipe_name(j->fp8));
    if (j->fp8 == MODEL_FP8_MXFP8 && prof_peak_mxfp8(dev) <= 0)
        return px_fail(err, PX_EINPUT,
                       "device %s has no MXFP8 tensor cores: the mxfp8 recipe needs Blackwell "
                       "(B200, GB200); use delayed, tensorwise or blockwise",
                       dev->name);
    if (j->fp8_transpose < 0)
        j->fp8_transpose = dev->fp8_transpose ? 1 : 0;
    return PX_OK;
}

/* 1 where the job's context parallelism is Transformer Engine's (model/ops.c cp_passes):
 * Megatron-LM, NeMo and Megatron-Bridge run Megatron-Core, whose cp_comm_type p2p, all_gather
 * and a2a are TE's AttnFuncWithCPAndKVP2P, ...KVAllGather and ...QKVOA2A (TEDotProductAttention,
 * megatron/core/extensions/transformer_engine.py), on a GPU: TE runs on none other. On a CPU
 * the job is parallax's executor, whose cp passes lie inside its core op (exec/train/cp.c) and
 * its calibrated rate. torchtitan's is PyTorch's context_parallel, DeepSpeed's sequence
 * parallelism Ulysses of its own: neither is TE's. */
int sim_cp_te(const ModelSpec *s, const ProfDevice *dev)
{
    const ModelFramework f = s->job.framework;
    return (f == MODEL_FW_MEGATRON || f == MODEL_FW_NEMO || f == MODEL_FW_BRIDGE) &&
           !prof_device_is_cpu(dev);
}

/* 1 where it is PyTorch's context_parallel (model/ops.c torch_ring_fwd): torchtitan's cp is
 * torch.distributed.tensor.experimental.context_parallel, whose SDPA dispatch runs
 * _templated_ring_attention on a GPU (flash, efficient or cuDNN attention). Its rotate method
 * (all-gather by default, or all-to-all) moves K, V but makes the same passes; it has no
 * head-split (Ulysses) form, so a2a gets none. */
int sim_cp_torch(const ModelSpec *s, const ProfDevice *dev)
{
    return s->job.framework == MODEL_FW_TORCHTITAN && s->layout.cp_comm != MODEL_CP_COMM_A2A &&
           !prof_device_is_cpu(dev);
}

void sim_result_free(SimResult *r)
{
    if (!r)
        return;
    /* the answer's per-stage arrays and the workspace are allocated together (run) */
    if (r->work) {
        for (int s = 0; s < r->dims.p; s++) {
            /* a middle stage borrows its model stage's ops (cap 0) and, placed alike, their
             * seconds */
            const int ms = sim_stage_model(r, s);
            if (ms == s || r->op_seconds[s] != r->op_seconds[ms])
                free(r->op_seconds[s]);
            if (r->ops[s].cap > 0)
                model_ops_free(&r->ops[s]);
            model_tensors_free(&r->work->tables[s]);
        }
    }
    free(r->mem); /* one block: mem, rank_flops, comm, ops, op_seconds, stage_time */
    free(r->work); /* one block: the workspace, its tables, passes and transfers */
    memset(r, 0, sizeof *r);
}

/* Activation sets alive at once on a stage: the warm-up
 * forwards plus one (GPipe: all m; 1F1B: min(p - s, m); interleaved: min(2(p-s-1) + (v-1)p + 1,
 * m v)), as walking model/schedule.c's order gives. */
static int live_sets(const ModelDims *d, ModelSchedule sched, int stage)
{
    int total = d->m * d->v;
    if (sched == MODEL_SCHED_GPIPE)
        return total;
    int warm = d->v == 1 ? d->p - stage - 1 : (d->p - stage - 1) * 2 + (d->v - 1) * d->p;
    return warm + 1 < total ? warm + 1 : total;
}

int sim_offload_check(const ModelSpec *s, const ProfCluster *cl, PxError *err)
{
    const ModelLayout *l = &s->layout;
    if (!l->offload_optimizer && !l->offload_activations)
        return PX_OK;
    if (cl->host_pcie_bandwidth <= 0 || cl->host_memory_bandwidth <= 0 || cl->host_memory_bytes <= 0)
        return px_fail(err, PX_EINPUT,
                       "cluster %s describes no host (host.memory_bytes, host.pcie_bandwidth, "
                       "host.memory_bandwidth): %s needs them; give a cluster file with a \"host\" "
                       "object (docs/profiles.md, \"Host\")",
                       cl->name, l->offload_optimizer ? "--offload-optimizer" : "--offload-activations");
    return PX_OK;
}

/* What offload moves to the host (docs/memory.md, "Offload"): the categories
 * model_category_on_host names and a gradient shard per block to copy the reduced gradients
 * into; with activation offload, the live layer sets, of which the device keeps two layers'
 * worth in flight. m->cat holds the device figures before, and after. */
static void stage_offload(const ModelSpec *s, const ModelDims *d, const ModelTensorTable *tt,
                          int stage, SimStageMemory *m)
{
    const ModelLayout *l = &s->layout;
    if (l->offload_optimizer) {
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            if (model_category_on_host(l, (ModelCategory)c)) {
                m->host[c] = m->cat[c];
                m->cat[c] = 0;
            }
        uint64_t shard = 0;
        for (int b = 0; b < tt->n_blocks; b++)
            shard += tt->blocks[b].shard_numel * (uint64_t)(tt->blocks[b].repeat > 0 ? tt->blocks[b].repeat : 1);
        m->host[MODEL_GRADS] = shard * (uint64_t)px_dtype_bytes(d->grad);
        /* without a master copy (fp32 training) the host step updates a copy of the weight
         * shard of its own, which it sends back: the master's place on the host */
        if (!d->master)
            m->host[MODEL_MASTER] = shard * (uint64_t)px_dtype_bytes(d->param);
    }
    if (l->offload_activations) {
        uint64_t slot = 0, layer = 0;
        for (int j = 0; j < d->v; j++) {
            int first;
            const int n = model_chunk_layers(s, d, model_global_chunk(d, stage, j), &first);
            if (tt->act_layer_bytes[j] > slot)
                slot = tt->act_layer_bytes[j];
            if (n > 0 && px_ceil_div(tt->act_layer_bytes[j], (uint64_t)n) > layer)
                layer = px_ceil_div(tt->act_layer_bytes[j], (uint64_t)n);
        }
        const uint64_t sets = (uint64_t)m->peak_live * slot;
        const uint64_t keep = 2 * layer < sets ? 2 * layer : sets;
        m->host[MODEL_ACTIVATIONS] = sets;
        m->cat[MODEL_ACTIVATIONS] -= sets - keep;
    }
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        m->host_total += m->host[c];
}

/* Memory of a stage from its (full or compact) tensor table: every rank-wide tensor, and the
 * activation peak of the stage's schedule. */
static int stage_memory(const ModelSpec *s, const ModelDims *d, uint64_t runtime_bytes,
                        const ModelTensorTable *tt, int stage, SimStageMemory *m, PxError *err)
{
    memset(m, 0, sizeof *m);
    /* saved activations are the only tensors per micro-batch: they are replaced below */
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        m->cat[c] = tt->cat_bytes[c];
    int extras = 0;
    for (int j = 0; j < d->v; j++)
        extras |= tt->act_chunk_bytes[j] != tt->act_layer_bytes[j];
    int *max_live = calloc((size_t)(d->v > 0 ? d->v : 1), sizeof *max_live); /* any number of virtual stages */
    if (!max_live ||
        (d->v > 1 && extras &&
         model_schedule_peak(d, s->layout.schedule, stage, &m->peak_live, max_live))) {
        free(max_live);
        return px_fail(err, PX_ERUNTIME, "out of memory for the schedule's %d chunks' counts",
                       d->v);
    }
    if (d->v == 1 || !extras) {
        /* one chunk, or chunks of layers only: the closed-form count is the walk's */
        m->peak_live = live_sets(d, s->layout.schedule, stage);
        for (int j = 0; j < d->v; j++)
            max_live[j] = d->v == 1 ? m->peak_live : 0; /* chunks without extras pool nothing */
    }
    m->cat[MODEL_ACTIVATIONS] = model_activation_bytes(tt, d->v, m->peak_live, max_live);
    free(max_live);
    m->cat[MODEL_RUNTIME] = runtime_bytes;
    stage_offload(s, d, tt, stage, m);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        m->total += m->cat[c];
    return PX_OK;
}

int sim_memory_peaks(const ModelSpec *spec, const ModelDims *d, const ProfCluster *cl,
                     ModelTableCache *cache, uint64_t *peak, int *peak_stage, uint64_t *host_peak,
                     PxError *err)
{
    ModelTensorTable tt;
    int have = -1, rc = PX_OK;
    memset(&tt, 0, sizeof tt);
    *peak = 0;
    *peak_stage = 0;
    if (host_peak)
        *host_peak = 0;
    for (int st = 0; st < d->p && !rc; st++) {
        const int ms = sim_stage_model_of(spec, d, 1, st);
        if (ms != have) {
            model_tensors_free(&tt);
            have = -1;
            if ((rc = model_tensors_build_cached(cache, spec, d, ms, &tt, err)))
                break;
            have = ms;
        }
        SimStageMemory m;
        if ((rc = stage_memory(spec, d, cl->device.runtime_bytes, &tt, st, &m, err)))
            break;
        if (m.total > *peak) {
            *peak = m.total;
            *peak_stage = st;
        }
        if (host_peak && m.host_total > *host_peak)
            *host_peak = m.host_total;
    }
    model_tensors_free(&tt);
    return rc;
}

int sim_memory_peak(const ModelSpec *spec, const ModelDims *d, const ProfCluster *cl,
                    ModelTableCache *cache, uint64_t *peak, int *peak_stage, PxError *err)
{
    return sim_memory_peaks(spec, d, cl, cache, peak, peak_stage, NULL, err);
}

int sim_run(const ModelSpec *spec, const ProfCluster *cl, int gpus, SimResult *r, PxError *err)
{
    return sim_run_ex(spec, cl, gpus, 0, SIM_FULL, r, err);
}

/* Memory of every stage, from the tables the op graphs are then built on. A middle stage's
 * compact table stands for the middle stages of as many layers: built once per layer count. */
static int build_memory(SimResult *r, PxError *err)
{
    const ModelDims *d = &r->dims;
    SimWork *w = r->work;
    for (int st = 0; st < d->p; st++) {
        const int model_st = sim_stage_model(r, st);
        int rc = PX_OK;
        if (model_st == st)
            rc = w->cache     ? model_tensors_build_cached(w->cache, &r->spec, d, st, &w->tables[st], err)
                 : w->compact ? model_tensors_build_compact(&r->spec, d, st, &w->tables[st], err)
                              : model_tensors_build(&r->spec, d, st, &w->tables[st], err);
        if (!rc)
            rc = stage_memory(&r->spec, d, r->cluster.device.runtime_bytes, &w->tables[model_st], st,
                              &r->mem[st], err);
        if (rc)
            return rc;
        if (r->mem[st].total > r->peak_bytes) {
            r->peak_bytes = r->mem[st].total;
            r->peak_stage = st;
        }
        if (r->mem[st].host_total > r->host_peak_bytes)
            r->host_peak_bytes = r->mem[st].host_total;
    }
    return PX_OK;
}

/* A routed expert's op: its GEMMs and activation run on the `routed` token copies the busiest
 * rank receives. */
static int routed_expert_op(const ModelOp *op)
{
    return op->role == MODEL_OPR_EXP_FC1 || op->role == MODEL_OPR_EXP_ACT ||
           op->role == MODEL_OPR_EXP_FC2;
}

/* What the job's totals count of a routed expert op's FLOPs, which the op graph gives for the
 * busiest expert-parallel rank (routed = tokens x topk x etp x imbalance, or the capacity):
 * model FLOPs are the work the tokens ask for, tokens x topk x etp on every rank, padding and
 * imbalance left out; hardware FLOPs what the ranks execute together, the capacity's padding
 * included (each rank pads to it) but not the imbalance (the busiest rank's surplus is the
 * others' shortfall: routing moves work, it does not make any). */
static void routed_share(const ModelSpec *s, const ModelDims *d, double *model, double *hardware)
{
    *model = *hardware = 1.0;
    if (!d->moe || d->routed <= 0)
        return;
    const double balanced = (double)d->tokens * s->model.moe.topk * d->etp;
    *model = balanced / (double)d->routed;
    *hardware = s->model.moe.capacity_factor > 0 ? 1.0 : *model;
}

/* Op graphs of every stage (compact: one per distinct stage, copied), FLOPs and bytes. */
static int build_ops(SimResult *r, PxError *err)
{
    const ModelDims *d = &r->dims;
    /* Every TP, CP and DP rank of a stage does the same work on its shard; a routed expert's
     * op is the busiest rank's (routed_share) */
    const double replicas = (double)d->t * d->c * d->dp;
    double exp_model, exp_hw;
    routed_share(&r->spec, d, &exp_model, &exp_hw);
    for (int st = 0; st < d->p; st++) {
        int model_st = sim_stage_model(r, st);
        if (model_st != st) {
            /* the same ops: borrowed, not copied (cap 0 marks the borrower) */
            r->ops[st] = r->ops[model_st];
            r->ops[st].stage = st;
            r->ops[st].cap = 0;
        } else {
            int rc = model_ops_build_with(&r->spec, d, st, &r->work->tables[st], &r->ops[st], err);
            if (rc)
                return rc;
        }
        const ModelOpGraph *g = &r->ops[st];
        for (int i = 0; i < g->count; i++) {
            const ModelOp *op = &g->op[i];
            double times = (op->per_microbatch ? d->m : 1) * (double)op->repeat;
            const int routed = routed_expert_op(op);
            r->rank_flops[st] += op->flops * times;
            r->hardware_flops += op->flops * times * replicas * (routed ? exp_hw : 1.0);
            if (op->phase == MODEL_FWD || op->phase == MODEL_BWD)
                r->model_flops += (op->flops - op->recompute_flops) * times * replicas *
                                  (routed ? exp_model : 1.0);
            if (op->kind == MODEL_OP_COMM)
                r->comm[st][op->comm] += op->comm_bytes * (uint64_t)op->calls * (uint64_t)times;
        }
    }
    return PX_OK;
}

int sim_layer_seconds(const SimResult *r, double *fwd_s, double *bwd_s, PxError *err)
{
    *fwd_s = *bwd_s = 0;
    if (sim_level(r) < SIM_MEMORY)
        return px_fail(err, PX_ERUNTIME, "the layer's cost needs the stage's tables");
    /* stage 0's first chunk holds at least one layer of every layout */
    ModelOpGraph g;
    int rc = model_ops_build_with(&r->spec, &r->dims, 0, &r->work->tables[0], &g, err);
    if (rc)
        return rc;
    SimCtx c;
    sim_ctx_init(&c, &r->cluster, &r->spec, &r->dims, r->node_size);
    double *t = calloc((size_t)g.count + 1, sizeof *t);
    if (!t) {
        model_ops_free(&g);
        return px_fail(err, PX_ERUNTIME, "out of memory costing a layer");
    }
    /* TP groups sit alike on every stage when they stay inside a node: their exposed part
     * counts too (CP, DP and p2p transfers depend on where a stage's groups fall: left out) */
    const int tp_alike = r->node_size % r->dims.t == 0;
    for (int i = 0; i < g.count; i++)
        if (g.op[i].chunk == 0 && g.op[i].layer >= 0 && g.op[i].per_microbatch)
            t[i] = g.op[i].kind == MODEL_OP_COMM ? sim_comm_seconds(&c, &g.op[i], 0)
                                                 : sim_compute_seconds(&c, &g.op[i]);
    /* The floor multiplies one layer by every layer of a stage, so it must be the cheapest
     * kind: a MoE model's dense and MoE layers differ, and the chunk's first layer of each
     * kind stands for its kind (a compact graph's runs). Where the chunk lacks a kind the model
     * has, nothing here bounds it: the floor is 0, which prunes nothing but is never wrong. */
    double kind_s[2][2] = {{0, 0}, {0, 0}};
    int kind_layer[2] = {-1, -1};
    for (int i = 0; i < g.count; i++) {
        const ModelOp *op = &g.op[i];
        if (!op->per_microbatch || op->chunk != 0 || op->layer < 0)
            continue;
        const int moe = model_layer_is_moe(&r->spec.model, op->layer);
        if (kind_layer[moe] < 0)
            kind_layer[moe] = op->layer;
        if (op->layer != kind_layer[moe]) /* one layer of each kind */
            continue;
        double share = t[i];
        if (op->kind == MODEL_OP_COMM) {
            if (model_comm_group(op->comm) != MODEL_GROUP_TP || !tp_alike)
                continue;
            share = sim_comm_exposed(&g, t, i, &r->spec.layout, r->dims.m, r->cluster.overlap_slowdown);
        }
        /* as the passes sum them: recompute belongs to the backward */
        kind_s[moe][op->phase == MODEL_FWD ? 0 : 1] += share;
    }
    const int has_moe = r->dims.moe && model_moe_layers_in(&r->spec.model, 0, r->spec.model.layers) > 0;
    const int has_dense = !r->dims.moe || model_moe_layers_in(&r->spec.model, 0, r->spec.model.layers) < r->spec.model.layers;
    if ((has_moe && kind_layer[1] < 0) || (has_dense && kind_layer[0] < 0)) {
        *fwd_s = *bwd_s = 0;
    } else {
        const int k = !has_dense ? 1 : !has_moe ? 0
                      : kind_s[1][0] + kind_s[1][1] < kind_s[0][0] + kind_s[0][1] ? 1 : 0;
        *fwd_s = kind_s[k][0];
        *bwd_s = kind_s[k][1];
    }
    free(t);
    model_ops_free(&g);
    return PX_OK;
}

int sim_cluster_holds(const ProfCluster *cl, int gpus, PxError *err)
{
    if (cl->nodes <= 0 || (double)gpus <= (double)cl->nodes * cl->node_devices)
        return PX_OK;
    /* the profile's "nodes" is the one figure to raise: name it with the count that fits */
    const long need = ((long)gpus + cl->node_devices - 1) / (cl->node_devices > 0 ? cl->node_devices : 1);
    return px_fail(err, PX_EINPUT,
                   "%d GPUs exceed cluster %s: %d nodes of %d (%ld GPUs); for a larger cluster of "
                   "these nodes add --set nodes=%ld",
                   gpus, cl->name, cl->nodes, cl->node_devices, (long)cl->nodes * cl->node_devices, need);
}

double sim_step_floor(const ModelSpec *spec, const ModelDims *d, double layer_fwd_s,
                      double layer_bwd_s)
{
    /* Stage s cannot start before micro-batch 0's forward has crossed the stages before it,
     * is then busy with all its passes, and its last backward (chunk 0's) must still cross
     * them back: sum over s' < s of chunk 0's passes, plus m times its own. Counting only
     * the layers' compute keeps it below every schedule's step; with equal stages and free
     * transfers it is the uniform pipeline's (m + p - 1)(F + B). */
    double best = 0, before = 0;
    const double layer = layer_fwd_s + layer_bwd_s;
    for (int st = 0; st < d->p; st++) {
        int first, n = model_stage_layers(spec, d, st, &first);
        int n0 = model_chunk_layers(spec, d, model_global_chunk(d, st, 0), &first);
        double end = before + (double)d->m * n * layer;
        if (end > best)
            best = end;
        before += n0 * layer;
    }
    return best * (1.0 - 1e-9); /* shaded so that rounding never lifts it above the step */
}

int sim_continue(SimResult *r, int level, PxError *err)
{
    SimWork *w = r->work;
    int rc = PX_OK;
    if (w->level < SIM_BOUND && level >= SIM_BOUND) {
        if ((rc = build_ops(r, err)) || (rc = sim_time_costs(r, err)))
            return rc;
        w->level = SIM_BOUND;
    }
    if (w->level < SIM_FULL && level >= SIM_FULL) {
        if ((rc = sim_time_finish(r, err)))
            return rc;
        w->level = SIM_FULL;
    }
    return PX_OK;
}

static int run(const ModelSpec *spec, const ProfCluster *cl, int gpus, int compact,
               ModelTableCache *cache, int level, SimResult *r, PxError *err);

int sim_run_ex(const ModelSpec *spec, const ProfCluster *cl, int gpus, int compact, int level,
               SimResult *r, PxError *err)
{
    return run(spec, cl, gpus, compact, NULL, level, r, err);
}

int sim_run_cached(const ModelSpec *spec, const ProfCluster *cl, int gpus, ModelTableCache *cache,
                   int level, SimResult *r, PxError *err)
{
    return run(spec, cl, gpus, 1, cache, level, r, err);
}

/* The answer's per-stage arrays in one block and the workspace in another (each element a
 * multiple of 8 bytes), zeroed: the passes are sums. NULL-free on failure. */
static int alloc_stages(SimResult *r, int compact, ModelTableCache *cache)
{
    const size_t p = (size_t)r->dims.p, pv = p * (size_t)r->dims.v;
    char *block = calloc(1, p * (sizeof *r->mem + sizeof *r->rank_flops + sizeof *r->comm +
                                 sizeof *r->ops + sizeof *r->op_seconds + sizeof *r->stage_time));
    SimWork *w = calloc(1, sizeof *w + p * sizeof *w->tables + (2 * pv + p) * sizeof(double));
    if (!block || !w) {
        free(block);
        free(w);
        return -1;
    }
    r->mem = (SimStageMemory *)block;
    r->rank_flops = (double *)(r->mem + p);
    r->comm = (uint64_t(*)[MODEL_COMM_COUNT])(r->rank_flops + p);
    r->ops = (ModelOpGraph *)(r->comm + p);
    r->op_seconds = (double **)(r->ops + p);
    r->stage_time = (SimStageTime *)(r->op_seconds + p);
    w->compact = compact;
    w->cache = cache;
    w->tables = (ModelTensorTable *)(w + 1);
    w->pass_fwd = (double *)(w->tables + p);
    w->pass_bwd = w->pass_fwd + pv;
    w->p2p = w->pass_bwd + pv;
    r->work = w;
    return 0;
}

static int run(const ModelSpec *spec, const ProfCluster *cl, int gpus, int compact,
               ModelTableCache *cache, int level, SimResult *r, PxError *err)
{
    memset(r, 0, sizeof *r);
    r->spec = *spec;
    r->cluster = *cl;
    int rc = sim_resolve_job(&r->spec.job, &cl->device, err);
    if (!rc)
        rc = model_spec_check(&r->spec, gpus, &r->dims, err);
    if (rc)
        return rc;
    r->dims.cp_te = sim_cp_te(&r->spec, &cl->device);
    r->dims.cp_torch = sim_cp_torch(&r->spec, &cl->device);
    const ModelDims *d = &r->dims;
    r->node_size = prof_node_size(cl, d->gpus);
    if (r->node_size > d->gpus)
        r->node_size = d->gpus;
    if ((rc = sim_cluster_holds(cl, d->gpus, err)))
        return rc;
    r->rank_memory_bytes = prof_rank_memory(cl, r->node_size);
    r->host_rank_memory_bytes = prof_host_rank_memory(cl, r->node_size);
    if ((rc = sim_offload_check(&r->spec, cl, err)))
        return rc;
    r->params = model_config_params(&r->spec.model);
    if (alloc_stages(r, compact, cache) < 0) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory for %d pipeline stages", d->p);
        sim_result_free(r);
        return rc;
    }
    if ((rc = build_memory(r, err))) {
        sim_result_free(r);
        return rc;
    }
    r->work->level = SIM_MEMORY;
    if ((rc = sim_continue(r, level, err))) {
        sim_result_free(r);
        return rc;
    }
    return PX_OK;
}
