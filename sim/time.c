/* Step time: every op costed (sim/cost.c), summed per model chunk into one micro-batch's forward
 * and backward with the communication each pass cannot hide, run through the pipeline schedule
 * (sim/pipeline.c), then the per-step gradient reduction, optimizer and parameter gathers. */
#include "sim/internal.h"

#include <stdlib.h>
#include <string.h>

/* The compute op a communication op can overlap with: the matmul it feeds or drains (TP), the
 * attention core (CP); adjacent in the graph, in the same phase, at the same role of the same
 * layer. */
static int partner(const ModelOpGraph *g, int i)
{
    const ModelOp *op = &g->op[i];
    for (int k = i - 1; k <= i + 1; k += 2) {
        if (k < 0 || k >= g->count)
            continue;
        const ModelOp *o = &g->op[k];
        if (o->kind != MODEL_OP_COMM && o->phase == op->phase && o->chunk == op->chunk &&
            o->role == op->role && o->layer == op->layer)
            return k;
    }
    return -1;
}

/* Exposed time of communication c overlapping compute g: what does not fit under it, plus the
 * slowdown the overlapped part inflicts on the compute (shared SMs and memory bandwidth). */
static double overlap(double c, double g, double slowdown)
{
    double hidden = c < g ? c : g;
    return (c - hidden) + slowdown * hidden;
}

/* The shared experts' compute: a MoE layer's MLP ops (its shared experts are the layer's MLP). */
static int shared_expert_op(const ModelOp *o)
{
    return o->kind != MODEL_OP_COMM &&
           (o->role == MODEL_OPR_FC1 || o->role == MODEL_OPR_ACT || o->role == MODEL_OPR_FC2);
}

/* The experts' all-to-all under overlap_ep (docs/time.md, "Expert parallelism"): with one
 * micro-batch in flight the only independent work is the shared experts' (Megatron-Core's
 * --moe-shared-expert-overlap runs them beside the dispatch and the combine), so each pass's
 * all-to-all hides under its own shared experts. With two or more, the schedule pairs one
 * micro-batch's forward with another's backward (DeepSeek-V3's DualPipe, Megatron-Core's
 * combined 1F1B all-to-all overlap), and the layer's all-to-all of both passes hides under all
 * of the layer's compute in both passes. Either way op i gets its share of what is exposed. */
static double ep_exposed(const ModelOpGraph *g, const double *t, int i, int m, double slow)
{
    const ModelOp *op = &g->op[i];
    const int fwd = op->phase == MODEL_FWD;
    double comm_same = 0, comm_other = 0, shared_same = 0, compute_all = 0;
    for (int q = 0; q < g->count; q++) {
        const ModelOp *o = &g->op[q];
        if (o->layer != op->layer || o->chunk != op->chunk || !o->per_microbatch)
            continue;
        const int same = (o->phase == MODEL_FWD) == fwd;
        if (o->kind == MODEL_OP_COMM) {
            if (o->comm == MODEL_EP_ALL_TO_ALL)
                *(same ? &comm_same : &comm_other) += t[q];
            continue;
        }
        compute_all += t[q];
        if (same && shared_expert_op(o))
            shared_same += t[q];
    }
    double comm = comm_same, hide = shared_same;
    if (m >= 2) {
        comm = comm_same + comm_other;
        hide = compute_all;
    }
    return comm > 0 ? t[i] / comm * overlap(comm, hide, slow) : 0.0;
}

/* Context parallelism's exchange (docs/time.md, "Context parallelism"). The all-gather, its
 * reduce-scatter and Ulysses' all-to-alls block the core: exposed whole. The ring (p2p) splits
 * the core into cp blocks, one per rank's K, V, and sends the next block's K, V while the
 * current one computes: the forward's cp - 1 transfers each hide under one block, the first
 * block being the rank's own. The backward sends K, V and the gradients dK, dV of the block
 * just done together, cp - 1 steps of two transfers each under a block, and returns the last
 * dK, dV to their owner after the last block, with nothing left to hide under (with FP8
 * attention K, V alone, as the forward's). */
static double cp_exposed(const ModelOpGraph *g, const double *t, int i, double slow)
{
    const ModelOp *op = &g->op[i];
    const int k = partner(g, i);
    if (op->comm != MODEL_CP_P2P || k < 0 || op->calls < 1)
        return t[i];
    const double n = op->group_size, block = t[k] / n, call = t[i] / op->calls;
    /* with FP8 attention the backward's ring carries K, V only (cp - 1 calls), the gradients
     * going home in an all-to-all of their own, exposed whole (docs/fp8.md) */
    /* PyTorch's under its all-gather rotater: dK, dV alone cp times, each under the next
     * block, the last home after the last block (model/ops.c torch_dkv_bytes) */
    if (op->phase == MODEL_BWD && op->calls == op->group_size)
        return (n - 1.0) * overlap(call, block, slow) + call;
    if (op->phase != MODEL_BWD || op->calls < 2 * op->group_size - 1)
        return (n - 1.0) * overlap(call, block, slow);
    return (n - 1.0) * overlap(2.0 * call, block, slow) + call;
}

double sim_comm_exposed(const ModelOpGraph *g, const double *t, int i, const ModelLayout *l,
                        int m, double slow)
{
    const ModelOp *op = &g->op[i];
    const ModelGroup grp = model_comm_group(op->comm);
    if (op->comm == MODEL_EP_ALL_TO_ALL)
        return l->overlap_ep ? ep_exposed(g, t, i, m, slow) : t[i];
    int k = partner(g, i);
    /* the experts' tensor-parallel gathers feed and drain their GEMMs as TP's do */
    if ((grp == MODEL_GROUP_TP || grp == MODEL_GROUP_ETP) && l->overlap_tp && k >= 0)
        return overlap(t[i], t[k], slow);
    /* Megatron's column-parallel linear (QKV, fc1) overlaps its backward collectives with its
     * own GEMMs even without TP overlap (LinearWithGradAccumulationAndAsyncCommunication, since
     * 2022): the input gradient's all-reduce, or SP's reduce-scatter, runs under the weight
     * gradient's GEMM, and SP's re-gather of the input under the input gradient's. The two
     * GEMMs do the same FLOPs: each collective gets half of the op (docs/time.md, "One layer
     * against Korthikanti Table 4"). layout.tp_bwd_exposed is Megatron before it. */
    if (grp == MODEL_GROUP_TP && op->phase == MODEL_BWD && k >= 0 && !l->tp_bwd_exposed &&
        (op->role == MODEL_OPR_QKV || op->role == MODEL_OPR_FC1))
        return overlap(t[i], 0.5 * t[k], slow);
    if (grp == MODEL_GROUP_CP)
        return cp_exposed(g, t, i, slow);
    return t[i];
}

static int dp_op(const ModelOp *o)
{
    const ModelGroup grp = model_comm_group(o->comm);
    return o->kind == MODEL_OP_COMM && o->per_microbatch &&
           (grp == MODEL_GROUP_DP || grp == MODEL_GROUP_EDP);
}

static int dp_gather(const ModelOp *o)
{
    return dp_op(o) && (o->comm == MODEL_DP_ALL_GATHER || o->comm == MODEL_EDP_ALL_GATHER);
}

/* A collective's time on the DP network: when it runs, and the op it is. */
typedef struct {
    double start, end;
    int op;
} NetSlot;

typedef struct {
    NetSlot *slot;
    int n, cap;
} Slots;

static int slots_add(Slots *q, double start, double end, int op)
{
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 64;
        NetSlot *s = realloc(q->slot, (size_t)cap * sizeof *s);
        if (!s)
            return -1;
        q->slot = s;
        q->cap = cap;
    }
    q->slot[q->n++] = (NetSlot){start, end, op};
    return 0;
}

/* Compute waits from a to b: each collective on the network meanwhile takes its part of the
 * wait (slots sorted, from *first on; waits come in time order). */
static void slots_wait(const Slots *q, int *first, double a, double b, double *stall)
{
    if (!(b > a))
        return;
    while (*first < q->n && q->slot[*first].end <= a)
        (*first)++;
    for (int k = *first; k < q->n && q->slot[k].start < b; k++) {
        const double lo = q->slot[k].start > a ? q->slot[k].start : a;
        const double hi = q->slot[k].end < b ? q->slot[k].end : b;
        if (hi > lo)
            stall[q->slot[k].op] += hi - lo;
    }
}

typedef struct {
    Slots gather, reduce, pending; /* pending: reduce-scatters as issued (start: when) */
    double *stall;                 /* [op] waits charged to each op, summed over its repeats */
} Net;

/* One pass (ops P[0..np) of one chunk, in graph order) through the two streams. The pass is
 * expanded first: a compact graph's run of identical layers (its ops carry repeat r and one
 * layer) plays r times, so that a compact graph times like the full one. Units are the runs
 * of gathers, each with the layer instance it belongs to; the gathers that gate compute go
 * first on the network and the reduce-scatters, which nothing in the pass waits for, take the
 * time the gathers leave (the next layer's all-gather issued before this layer's
 * reduce-scatter, as FSDP's backward prefetch does). */
static int dp_pass(const ModelOpGraph *g, const double *t, const ModelLayout *l, int m,
                   double slow, const int *P, int np, Net *nt)
{
    int ne = 0;
    for (int k = 0; k < np; k++)
        ne += g->op[P[k]].repeat;
    /* E: the expanded ops; inst: their layer instance; unit: where each unit starts */
    int *E = malloc((size_t)(3 * ne + 2) * sizeof *E), *inst = E + ne, *unit = inst + ne;
    double *uend = malloc((size_t)(ne + 1) * sizeof *uend); /* when a unit's gathers end */
    if (!E || !uend) {
        free(E);
        free(uend);
        return -1;
    }
    int n = 0, id = 0;
    for (int k = 0; k < np;) {
        const ModelOp *o = &g->op[P[k]];
        int e = k + 1;
        if (o->repeat > 1)
            while (e < np && g->op[P[e]].repeat == o->repeat && g->op[P[e]].layer == o->layer)
                e++;
        for (int r = 0; r < o->repeat; r++) {
            for (int q = k; q < e; q++) {
                if (n > 0 && ((q == k && r > 0) || g->op[P[q]].layer != g->op[E[n - 1]].layer))
                    id++;
                inst[n] = id;
                E[n++] = P[q];
            }
        }
        k = e;
    }
    int nu = 0;
    for (int k = 0; k < n; k++)
        if (dp_gather(&g->op[E[k]]) && (k == 0 || !dp_gather(&g->op[E[k - 1]])))
            unit[nu++] = k;
    unit[nu] = n;
    const int ahead = l->prefetch < 0 ? 0 : l->prefetch == 0 ? 1 : l->prefetch;
    char *done = calloc((size_t)nu + 1, 1);
    int rc = done ? 0 : -1, u = 0, first = 0;
    double T = 0, gfree = 0;
    for (int k = 0; k < n && !rc;) {
        if (u < nu && k == unit[u]) {
            /* the unit's gathers, issued now unless prefetched; its compute waits for them,
             * then starts and issues the prefetched ones: the rest of its own layer's next
             * unit (DeepSpeed's backward gather, after the recomputed forward frees the
             * parameters) and the first unit of each of the next `ahead` layers */
            for (int pass = 0; pass < 2 && !rc; pass++) {
                for (int v = u; v < nu && !rc; v++) {
                    const int d = inst[unit[v]] - inst[unit[u]];
                    const int want = pass == 0 ? v == u
                                     : ahead > 0 && ((v == u + 1 && d == 0) ||
                                                     (d > 0 && d <= ahead &&
                                                      inst[unit[v - 1]] != inst[unit[v]]));
                    if (d > ahead)
                        break;
                    if (!want || done[v])
                        continue;
                    done[v] = 1;
                    uend[v] = T;
                    for (int q = unit[v]; q < n && dp_gather(&g->op[E[q]]) && !rc; q++) {
                        const double start = T > gfree ? T : gfree;
                        gfree = start + t[E[q]];
                        uend[v] = gfree;
                        rc = slots_add(&nt->gather, start, gfree, E[q]);
                    }
                }
                if (pass == 0 && !rc) {
                    slots_wait(&nt->gather, &first, T, uend[u], nt->stall);
                    if (uend[u] > T)
                        T = uend[u];
                }
            }
            while (k < n && dp_gather(&g->op[E[k]]))
                k++;
            u++;
            continue;
        }
        const int i = E[k++];
        const ModelOp *o = &g->op[i];
        if (o->kind != MODEL_OP_COMM)
            T += t[i];
        else if (dp_op(o)) /* a reduce-scatter: the compute goes on */
            rc = slots_add(&nt->pending, T, T + t[i], i);
        else if (model_comm_group(o->comm) != MODEL_GROUP_PP)
            T += sim_comm_exposed(g, t, i, l, m, slow);
    }
    /* the reduce-scatters in issue order, in the time the gathers leave free */
    double x = 0;
    int k = 0;
    for (int q = 0; q < nt->pending.n && !rc; q++) {
        const NetSlot *p = &nt->pending.slot[q];
        double left = p->end - p->start;
        if (p->start > x)
            x = p->start;
        while (left > 0 && !rc) {
            while (k < nt->gather.n && nt->gather.slot[k].end <= x)
                k++;
            if (k < nt->gather.n && nt->gather.slot[k].start <= x) {
                x = nt->gather.slot[k].end;
                continue;
            }
            const double gap = k < nt->gather.n ? nt->gather.slot[k].start - x : left;
            const double run = left < gap ? left : gap;
            rc = slots_add(&nt->reduce, x, x + run, p->op);
            x += run;
            left -= run;
        }
    }
    /* the backward ends when its gradients are reduced */
    first = 0;
    if (!rc)
        slots_wait(&nt->reduce, &first, T, x, nt->stall);
    free(done);
    free(uend);
    free(E);
    return rc;
}

int sim_dp_exposed(const ModelOpGraph *g, const double *t, const ModelLayout *l, int m,
                   double slow, double *out)
{
    int any = 0, chunks = 0;
    for (int i = 0; i < g->count; i++) {
        if (dp_op(&g->op[i])) {
            out[i] = t[i];
            any = 1;
        }
        if (g->op[i].chunk + 1 > chunks)
            chunks = g->op[i].chunk + 1;
    }
    if (!any || !l->overlap_dp)
        return 0;
    Net nt = {0};
    int *P = malloc((size_t)g->count * sizeof *P);
    nt.stall = calloc((size_t)g->count, sizeof *nt.stall);
    int rc = P && nt.stall ? 0 : -1;
    for (int j = 0; j < chunks && !rc; j++)
        for (int bwd = 0; bwd < 2 && !rc; bwd++) {
            int np = 0, has = 0;
            for (int i = 0; i < g->count; i++) {
                const ModelOp *o = &g->op[i];
                if (o->per_microbatch && o->chunk == j && (o->phase != MODEL_FWD) == bwd) {
                    P[np++] = i;
                    has |= dp_op(o);
                }
            }
            if (!has)
                continue;
            nt.gather.n = nt.reduce.n = nt.pending.n = 0;
            rc = dp_pass(g, t, l, m, slow, P, np, &nt);
        }
    for (int i = 0; i < g->count && !rc; i++) {
        if (!dp_op(&g->op[i]))
            continue;
        const double r = g->op[i].repeat, stall = nt.stall[i];
        const double hidden = t[i] * r - stall;
        out[i] = (stall + slow * (hidden > 0 ? hidden : 0)) / r;
    }
    free(P);
    free(nt.stall);
    free(nt.gather.slot);
    free(nt.reduce.slot);
    free(nt.pending.slot);
    return rc;
}

typedef struct {
    double ready, seconds;
} Pending;

/* A block's per-step gradient reduction: over the data-parallel group, for the routed experts
 * over the expert-data-parallel group, with HSDP its shard's all-reduce over the replicas
 * (each on its own ranks: sim_comm_seconds) */
static int grad_reduction(ModelComm k)
{
    return k == MODEL_DP_ALLREDUCE || k == MODEL_DP_REDUCE_SCATTER || k == MODEL_EDP_ALLREDUCE ||
           k == MODEL_EDP_REDUCE_SCATTER || k == MODEL_DPR_ALLREDUCE;
}

static int by_ready(const void *a, const void *b)
{
    double x = ((const Pending *)a)->ready, y = ((const Pending *)b)->ready;
    return x < y ? -1 : x > y;
}

/* Optimizer offload's traffic of one stage (docs/time.md, "Offload"): the gradient shards
 * copied down and the updated parameters copied up over PCIe (bytes), and the bytes the host's
 * optimizer step touches: the gradients read, master and state read and written, the
 * parameters written (the device optimizer's own count, ops.c). */
static void offload_bytes(const SimResult *r, int s, double *down, double *up, double *touch)
{
    const ModelTensorTable *tt = &r->work->tables[sim_stage_model(r, s)];
    double elems = 0;
    for (int b = 0; b < tt->n_blocks; b++)
        elems += (double)tt->blocks[b].shard_numel * (tt->blocks[b].repeat > 0 ? tt->blocks[b].repeat : 1);
    const SimStageMemory *m = &r->mem[s];
    *down = elems * (double)px_dtype_bytes(r->dims.grad);
    *up = elems * (double)px_dtype_bytes(r->dims.param);
    *touch = *down + 2.0 * (double)(m->host[MODEL_MASTER] + m->host[MODEL_OPTIMIZER]) + *up;
}

/* The host's share of its node's memory bandwidth: the ranks of a node run their optimizer
 * steps at once. */
static double host_rank_bandwidth(const SimResult *r)
{
    return r->cluster.host_memory_bandwidth / (r->node_size > 1 ? r->node_size : 1);
}

/* Where a stage's groups sit: latency, bandwidth and nodes spanned of its TP, CP, DP / ZeRO
 * groups and of its transfers to the next and previous stages. Two stages placed alike cost
 * every op alike (sim_comm_seconds depends on the stage through these paths only). */
typedef struct {
    double alpha[5], beta[5];
    int nodes[5];
} Placement;

static void placement(const SimCtx *c, int stage, Placement *pl)
{
    const ModelDims *d = c->d;
    const int block = d->t * d->c * d->dp, p = d->p;
    memset(pl, 0, sizeof *pl);
    const int base = stage * block;
    sim_group_path(c, base, 1, d->t, &pl->alpha[0], &pl->beta[0], &pl->nodes[0]);
    sim_group_path(c, base, d->t, d->c, &pl->alpha[1], &pl->beta[1], &pl->nodes[1]);
    sim_group_path(c, base, d->t, d->zero_group, &pl->alpha[2], &pl->beta[2], &pl->nodes[2]);
    const int next = (stage + 1) % p, prev = (stage + p - 1) % p;
    for (int k = 0; k < 2; k++) {
        int other = k ? prev : next;
        int lo = stage < other ? stage : other, hi = stage < other ? other : stage;
        sim_group_path(c, lo * block, (hi - lo) * block, 2, &pl->alpha[3 + k], &pl->beta[3 + k],
                       &pl->nodes[3 + k]);
    }
}

/* Communication op `op` of a stage in its sums per step (rep executions a micro-batch, m
 * micro-batches): t the seconds of one execution, exposed what the pass cannot hide of it. DP
 * and EDP count as ZeRO's collectives too (their time, latency and exposed part); the rest
 * by group: EP and ETP, else TP with CP's exchange. */
static void add_comm_time(const SimCtx *c, const ModelOp *op, int s, double t, double exposed,
                          double rep, int m, SimStageTime *st)
{
    const ModelGroup grp = model_comm_group(op->comm);
    if (grp == MODEL_GROUP_DP || grp == MODEL_GROUP_EDP) {
        st->dp_exposed_s += exposed * rep * m;
        const int gather = op->comm == MODEL_DP_ALL_GATHER || op->comm == MODEL_EDP_ALL_GATHER;
        const int z = !gather                        ? SIM_ZERO_REDUCE
                      : op->phase == MODEL_FWD       ? SIM_ZERO_GATHER_FWD
                      : op->phase == MODEL_RECOMPUTE ? SIM_ZERO_GATHER_RECOMPUTE
                                                     : SIM_ZERO_GATHER_BWD;
        ModelOp bare = *op; /* its latency: the same calls of nothing */
        bare.comm_bytes = 0;
        st->zero_s[z] += t * rep * m;
        st->zero_latency_s[z] += sim_comm_seconds(c, &bare, s) * rep * m;
        st->zero_exposed_s[z] += exposed * rep * m;
    } else if (grp == MODEL_GROUP_EP || grp == MODEL_GROUP_ETP || grp == MODEL_GROUP_ETP_EP) {
        st->ep_comm_s += exposed * rep * m;
    } else {
        st->tp_comm_s += exposed * rep * m;
        if (grp == MODEL_GROUP_CP) {
            st->cp_comm_s += t * rep * m;
            st->cp_exposed_s += exposed * rep * m;
        }
    }
}

/* What offload adds to a stage's costs (docs/time.md, "Offload"): with the optimizer on the
 * host, the host's step itself (its copies are placed in sim_time_finish); with activations
 * on the host, each layer's saved activations going down after its forward and coming back
 * before its backward, under the pass's own compute. */
static void stage_offload_costs(SimResult *r, int s)
{
    const ModelLayout *l = &r->spec.layout;
    const int v = r->dims.v, m = r->dims.m;
    SimStageTime *st = &r->stage_time[s];
    if (l->offload_optimizer) {
        double down, up, touch;
        offload_bytes(r, s, &down, &up, &touch);
        st->offload_host_s = touch / host_rank_bandwidth(r);
        st->optimizer_s = st->offload_host_s;
    }
    if (l->offload_activations) {
        const ModelTensorTable *tt = &r->work->tables[sim_stage_model(r, s)];
        const double slow = r->cluster.overlap_slowdown;
        double *fwd = r->work->pass_fwd + s * v, *bwd = r->work->pass_bwd + s * v;
        for (int j = 0; j < v; j++) {
            const double x = (double)tt->act_layer_bytes[j] / r->cluster.host_pcie_bandwidth;
            const double ef = overlap(x, fwd[j], slow), eb = overlap(x, bwd[j], slow);
            fwd[j] += ef;
            bwd[j] += eb;
            st->offload_act_s += (ef + eb) * m;
        }
    }
}

/* Every op of stage s timed (r->op_seconds[s]), summed into one micro-batch's forward and
 * backward per chunk with the communication each cannot hide, the stage's sums per step and
 * its transfer to the next stage. */
static int stage_costs(SimResult *r, const SimCtx *c, int s, PxError *err)
{
    const ModelLayout *l = &r->spec.layout;
    const int v = r->dims.v, m = r->dims.m;
    const double slow = r->cluster.overlap_slowdown;
    const ModelOpGraph *g = &r->ops[s];
    SimStageTime *st = &r->stage_time[s];
    double *fwd = r->work->pass_fwd + s * v, *bwd = r->work->pass_bwd + s * v;
    double *t = r->op_seconds[s] = calloc((size_t)g->count + 1, sizeof(double));
    if (!t)
        return px_fail(err, PX_ERUNTIME, "out of memory timing stage %d", s);
    for (int i = 0; i < g->count; i++)
        t[i] = g->op[i].kind == MODEL_OP_COMM ? sim_comm_seconds(c, &g->op[i], s)
                                              : sim_compute_seconds(c, &g->op[i]);
    double *dpx = malloc(((size_t)g->count + 1) * sizeof *dpx);
    if (!dpx || sim_dp_exposed(g, t, l, m, slow, dpx)) {
        free(dpx);
        return px_fail(err, PX_ERUNTIME, "out of memory timing stage %d", s);
    }
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        if (!op->per_microbatch) {
            if (op->kind == MODEL_OP_OPTIMIZER && !l->offload_optimizer)
                st->optimizer_s += t[i];
            continue;
        }
        double *pass = op->phase == MODEL_FWD ? &fwd[op->chunk] : &bwd[op->chunk];
        const double rep = op->repeat;
        if (op->kind != MODEL_OP_COMM) {
            *pass += t[i] * rep;
            st->compute_s += t[i] * rep * m;
            continue;
        }
        ModelGroup grp = model_comm_group(op->comm);
        if (grp == MODEL_GROUP_PP) {
            /* a stage's transfers are costed alike: its largest (a standalone MTP
             * stage's carries 1 + mtp_layers activations) */
            if (op->comm == MODEL_PP_SEND && op->phase == MODEL_FWD && t[i] > r->work->p2p[s])
                r->work->p2p[s] = t[i];
            continue;
        }
        const int dp = grp == MODEL_GROUP_DP || grp == MODEL_GROUP_EDP;
        const double exposed = dp ? dpx[i] : sim_comm_exposed(g, t, i, l, m, slow);
        *pass += exposed * rep;
        add_comm_time(c, op, s, t[i], exposed, rep, m, st);
    }
    free(dpx);
    stage_offload_costs(r, s);
    return PX_OK;
}

int sim_time_costs(SimResult *r, PxError *err)
{
    const ModelDims *d = &r->dims;
    const int p = d->p, v = d->v, m = d->m;
    SimWork *w = r->work;
    SimCtx c;
    sim_ctx_init(&c, &r->cluster, &r->spec, d, r->node_size);
    if (!(c.peak > 0))
        return px_fail(err, PX_EINPUT, "device %s has no %s peak FLOP/s: choose another precision",
                       r->cluster.device.name, px_dtype_name(r->spec.job.precision));
    double *fwd = w->pass_fwd, *bwd = w->pass_bwd;
    w->bound_s = 0;
    /* every op of every stage, one micro-batch's forward and backward per chunk, the optimizer */
    Placement model_pl = {0};
    int model_pl_stage = -1;
    for (int s = 0; s < p; s++) {
        const int ms = sim_stage_model(r, s);
        if (ms != s) {
            /* a middle stage like an earlier one: the same costs when its groups sit alike */
            Placement pl;
            if (model_pl_stage != ms) {
                placement(&c, ms, &model_pl);
                model_pl_stage = ms;
            }
            placement(&c, s, &pl);
            if (memcmp(&pl, &model_pl, sizeof pl) == 0) {
                r->op_seconds[s] = r->op_seconds[ms];
                r->stage_time[s] = r->stage_time[ms];
                w->p2p[s] = w->p2p[ms];
                for (int j = 0; j < v; j++) {
                    fwd[s * v + j] = fwd[ms * v + j];
                    bwd[s * v + j] = bwd[ms * v + j];
                }
                continue; /* its bound is its model stage's */
            }
        }
        int rc = stage_costs(r, &c, s, err);
        if (rc)
            return rc;
        /* A stage runs its actions one at a time and the optimizer after them: no schedule
         * can finish the step sooner than the busiest stage's passes plus its optimizer. */
        const SimStageTime *st = &r->stage_time[s];
        double busy = 0;
        for (int j = 0; j < v; j++)
            busy += m * (fwd[s * v + j] + bwd[s * v + j]);
        if (busy + st->optimizer_s > w->bound_s)
            w->bound_s = busy + st->optimizer_s;
    }
    return PX_OK;
}

/* A stage's per-step collectives after its pipeline ends at T: the gradient reduction's
 * exposed part (overlapped with each chunk's last backward, between lbs and lbe, when asked),
 * the tied-embedding and SP norm-gradient all-reduces (embed) and ZeRO-1/2's parameter
 * all-gather (gather), the last two whole. */
static int step_collectives(const SimResult *r, int s, const double *lbs, const double *lbe,
                            double T, double *exposed_out, double *embed_out, double *gather_out,
                            PxError *err)
{
    const ModelLayout *l = &r->spec.layout;
    const int v = r->dims.v;
    const double slow = r->cluster.overlap_slowdown;
    const ModelOpGraph *g = &r->ops[s];
    const double *t = r->op_seconds[s];
    int slots = 1;
    for (int i = 0; i < g->count; i++)
        slots += g->op[i].repeat;
    Pending *q = calloc((size_t)slots, sizeof *q);
    int *order = calloc((size_t)v, sizeof(int)), *count = calloc((size_t)v, sizeof(int));
    if (!q || !order || !count) {
        free(q);
        free(order);
        free(count);
        return px_fail(err, PX_ERUNTIME, "out of memory timing stage %d", s);
    }
    int nq = 0;
    double grads = 0, embed = 0, gather = 0;
    for (int i = 0; i < g->count; i++)
        if (!g->op[i].per_microbatch && g->op[i].kind == MODEL_OP_COMM && grad_reduction(g->op[i].comm))
            count[g->op[i].chunk] += g->op[i].repeat;
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        if (op->per_microbatch || op->kind != MODEL_OP_COMM)
            continue;
        if (grad_reduction(op->comm)) {
            for (int rpt = 0; rpt < op->repeat; rpt++) {
                int j = op->chunk, k = order[j]++, n = count[j];
                /* blocks are listed embed, layers ascending, final: backward finishes
                 * them in reverse over the chunk's last backward */
                double frac = (double)(n - k) / n;
                q[nq].ready = lbs[s * v + j] + frac * (lbe[s * v + j] - lbs[s * v + j]);
                q[nq].seconds = t[i];
                nq++;
                grads += t[i];
            }
        } else if (op->comm == MODEL_EMBED_ALLREDUCE || op->comm == MODEL_TP_ALLREDUCE) {
            /* the tied embedding's and, with SP, the norms' gradient all-reduces */
            embed += t[i] * op->repeat;
        } else if (op->comm == MODEL_DP_ALL_GATHER || op->comm == MODEL_EDP_ALL_GATHER) {
            gather += t[i] * op->repeat;
        }
    }
    free(order);
    free(count);
    double exposed = grads;
    if (l->overlap_dp && nq > 0) {
        qsort(q, (size_t)nq, sizeof *q, by_ready);
        double f = 0;
        for (int i = 0; i < nq; i++)
            f = (q[i].ready > f ? q[i].ready : f) + q[i].seconds;
        exposed = f > T ? f - T : 0;
        exposed += slow * (grads - exposed > 0 ? grads - exposed : 0);
    }
    free(q);
    *exposed_out = exposed;
    *embed_out = embed;
    *gather_out = gather;
    return PX_OK;
}

/* ZeRO-2/3 under a pipeline: the stage's once-a-step gathers (before its first forward) and
 * reduce-scatters in the zero sums (SIM_ZERO_GATHER_FWD, SIM_ZERO_REDUCE) with their latency
 * part, and what the step could not hide of them (gather_exposed; of the gradient queue,
 * grads_exposed). */
static void zero_step_sums(const SimResult *r, int s, double gather_exposed, double grads_exposed)
{
    const ModelOpGraph *g = &r->ops[s];
    const double *t = r->op_seconds[s];
    SimStageTime *st = &r->stage_time[s];
    SimCtx c;
    sim_ctx_init(&c, &r->cluster, &r->spec, &r->dims, r->node_size);
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        if (op->per_microbatch || op->kind != MODEL_OP_COMM)
            continue;
        const int z = op->comm == MODEL_DP_ALL_GATHER || op->comm == MODEL_EDP_ALL_GATHER ? SIM_ZERO_GATHER_FWD
                      : op->comm == MODEL_DP_REDUCE_SCATTER || op->comm == MODEL_EDP_REDUCE_SCATTER ? SIM_ZERO_REDUCE
                                                                                                   : -1;
        if (z < 0)
            continue;
        ModelOp bare = *op;
        bare.comm_bytes = 0;
        st->zero_s[z] += t[i] * op->repeat;
        st->zero_latency_s[z] += sim_comm_seconds(&c, &bare, s) * op->repeat;
    }
    st->zero_exposed_s[SIM_ZERO_GATHER_FWD] += gather_exposed;
    st->zero_exposed_s[SIM_ZERO_REDUCE] += grads_exposed;
}

/* Stage s's step from the pipeline's finish with (fin) and without (fin0) transfers and each
 * chunk's last backward (lbs, lbe): the per-step collectives, the optimizer (with offload its
 * copies), the bubble. */
static int stage_finish(SimResult *r, int s, const double *fin, const double *fin0,
                        const double *lbs, const double *lbe, PxError *err)
{
    const ModelLayout *l = &r->spec.layout;
    const int v = r->dims.v, m = r->dims.m;
    const double slow = r->cluster.overlap_slowdown;
    const double *fwd = r->work->pass_fwd, *bwd = r->work->pass_bwd;
    SimStageTime *st = &r->stage_time[s];
    double T = fin[s], exposed = 0, embed = 0, gather = 0;
    int rc = step_collectives(r, s, lbs, lbe, T, &exposed, &embed, &gather, err);
    if (rc)
        return rc;
    double gather_exposed = gather;
    if (l->overlap_dp && gather > 0)
        gather_exposed = overlap(gather, fwd[s * v], slow); /* under the next step's first forward */
    if (l->offload_optimizer) {
        /* ZeRO-Offload without the delayed update: the gradient shards go down under the
         * last backward of each chunk, the host steps once all have arrived, the updated
         * shard comes up under the next step's first forward, ahead of the gathers that
         * share that forward (docs/time.md, "Offload") */
        double down, up, touch, last_bwd = 0;
        offload_bytes(r, s, &down, &up, &touch);
        const double pcie = r->cluster.host_pcie_bandwidth;
        for (int j = 0; j < v; j++)
            last_bwd += lbe[s * v + j] - lbs[s * v + j];
        st->offload_down_s = l->overlap_dp ? overlap(down / pcie, last_bwd, slow) : down / pcie;
        st->offload_up_s = l->overlap_dp ? overlap(up / pcie + gather, fwd[s * v], slow) - gather_exposed
                                         : up / pcie;
        st->optimizer_s = st->offload_host_s + st->offload_down_s + st->offload_up_s;
    }
    st->dp_exposed_s += exposed + embed + gather_exposed;
    if (r->dims.zero_per_step)
        zero_step_sums(r, s, gather_exposed, exposed);
    st->pipeline_s = T;
    st->pp_comm_s = fin[s] - fin0[s];
    double ideal = 0;
    for (int j = 0; j < v; j++)
        ideal += m * (fwd[s * v + j] + bwd[s * v + j]);
    st->bubble_fraction = ideal > 0 ? fin0[s] / ideal - 1.0 : 0.0;
    if (st->bubble_fraction < 0.0) /* rounding: no pipeline beats its ideal */
        st->bubble_fraction = 0.0;
    st->step_s = T + exposed + embed + st->optimizer_s + gather_exposed;
    return PX_OK;
}

/* The prediction's time and throughput: the critical stage's figures and what its step gives. */
static void step_summary(SimResult *r)
{
    const ModelDims *d = &r->dims;
    SimCtx c;
    sim_ctx_init(&c, &r->cluster, &r->spec, d, r->node_size);
    const SimStageTime *cs = &r->stage_time[r->critical_stage];
    r->compute_s = cs->compute_s;
    r->tp_comm_s = cs->tp_comm_s;
    r->ep_comm_s = cs->ep_comm_s;
    r->pp_comm_s = cs->pp_comm_s;
    r->dp_comm_exposed_s = cs->dp_exposed_s;
    r->optimizer_s = cs->optimizer_s;
    r->bubble_fraction = cs->bubble_fraction;
    r->tokens_per_s = (double)r->spec.job.global_batch * d->s / r->step_s;
    r->tflops_per_gpu = r->hardware_flops / (r->step_s * d->gpus) / 1e12;
    r->mfu = r->model_flops / (r->step_s * d->gpus * c.peak);
    r->hfu = r->hardware_flops / (r->step_s * d->gpus * c.peak);
    r->mfu_fp8 = c.peak_fp8 > 0 ? r->model_flops / (r->step_s * d->gpus * c.peak_fp8) : 0.0;
}

int sim_time_finish(SimResult *r, PxError *err)
{
    const ModelDims *d = &r->dims;
    const int p = d->p, v = d->v;
    const SimWork *w = r->work;
    /* one block: finish with and without transfers, each chunk's last backward, scratch */
    double *block = calloc((size_t)(3 * p + 4 * p * v), sizeof(double));
    double *fin = block, *fin0 = fin + p, *lbs = fin0 + p, *lbe = lbs + p * v;
    double *scratch = lbe + p * v;
    int rc = PX_OK;
    if (!block)
        return px_fail(err, PX_ERUNTIME, "out of memory timing %d stages", p);
    /* the pipeline, with and without its transfers */
    if (sim_pipeline_pair(d, r->spec.layout.schedule, w->pass_fwd, w->pass_bwd, w->p2p, fin, lbs,
                          lbe, fin0, scratch) < 0) {
        free(block);
        return px_fail(err, PX_ERUNTIME, "pipeline simulation failed (out of memory)");
    }
    /* per step: gradient reduction (overlapped with the last backward when asked), the
     * tied-embedding and SP norm-gradient all-reduces, ZeRO-1/2's parameter all-gather */
    r->step_s = 0;
    for (int s = 0; s < p && !rc; s++) {
        if ((rc = stage_finish(r, s, fin, fin0, lbs, lbe, err)))
            break;
        if (r->stage_time[s].step_s > r->step_s) {
            r->step_s = r->stage_time[s].step_s;
            r->critical_stage = s;
        }
    }
    if (!rc)
        step_summary(r);
    free(block);
    return rc;
}
