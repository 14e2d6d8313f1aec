/* Costing single ops: GEMM efficiency, memory-bound kernels, collectives. docs/time.md derives
 * every formula and the profile constants it reads. */
#include "sim/internal.h"

#include <math.h>
#include <string.h>

void sim_ctx_init(SimCtx *c, const ProfCluster *cl, const ModelSpec *spec, const ModelDims *d,
                  int node_size)
{
    c->cl = cl;
    c->spec = spec;
    c->d = d;
    c->node_size = node_size;
    c->peak = prof_peak_flops(&cl->device, spec->job.precision);
    c->elem_bytes = (int)px_dtype_bytes(spec->job.precision);
    c->peak_fp8 = spec->job.fp8 == MODEL_FP8_MXFP8 ? prof_peak_mxfp8(&cl->device)
                  : spec->job.fp8 != MODEL_FP8_NONE ? prof_peak_flops(&cl->device, PX_FP8)
                                                    : 0.0;
    c->cpu16 = prof_device_is_cpu(&cl->device) &&
               (spec->job.precision == PX_BF16 || spec->job.precision == PX_FP16);
}

/* The CPU's bf16 and fp16 kernels (kernels/cpu/act16.c) are its fp32 kernels between two
 * streaming passes: each 16-bit operand is widened into fp32 scratch (2 bytes read, 4 written
 * an element) and each output rounded back (4 read, 2 written). An op's bytes count every
 * element it reads or writes once, at 2 bytes, so the passes move 3 times its bytes, and its
 * fp32 kernel twice them (cpu16_kernel_scale). A GPU's kernels read 16 bits directly: no
 * passes. The optimizer (kern_host_adamw reads the 16-bit gradient and rounds the weights
 * itself), the loss (fp32 logits) and communication pass no act operand through scratch. */
double sim_cpu16_pass_bytes(const SimCtx *c, const ModelOp *op)
{
    if (!c->cpu16 || op->kind == MODEL_OP_OPTIMIZER || op->kind == MODEL_OP_LOSS ||
        op->kind == MODEL_OP_COMM)
        return 0.0;
    return 3.0 * op->bytes;
}

/* How many times its op's bytes the kernel itself streams: 2 for the CPU's 16-bit kernels,
 * which run the fp32 kernel on the widened copies. */
static double cpu16_kernel_scale(const SimCtx *c, const ModelOp *op)
{
    return sim_cpu16_pass_bytes(c, op) > 0 ? 2.0 : 1.0;
}

static double cpu16_pass_seconds(const SimCtx *c, const ModelOp *op)
{
    const ProfDevice *dev = &c->cl->device;
    return sim_cpu16_pass_bytes(c, op) / (dev->memory_bandwidth * dev->memory_eff);
}

/* Tile and wave quantization (NVIDIA's Deep Learning Performance Guide, "Matrix
 * Multiplication Background", quoted in seed 003): the library covers the m x n output with
 * tiles and runs them in waves of one tile per SM. Every tile computes in full, its padding
 * included; a partial last wave leaves SMs idle. A GPU at its power limit runs GEMMs at the
 * clock that power allows, not its boost clock, and idle SMs leave their power to the busy
 * ones, which then run faster, by up to clock_headroom: a GEMM takes the longer of its tiles'
 * work at the sustained rate and its waves at clock_headroom times that rate. Without headroom
 * (1) every partial wave costs a full one. The library picks the tile shape that wastes least;
 * smaller tiles reuse less data (their efficiency in the profile). */
static double tile_utilization(const ProfDevice *dev, double m, double n, double batch)
{
    if (dev->n_tiles == 0 || dev->sm_count <= 0)
        return 1.0;
    const double headroom = dev->clock_headroom > 1.0 ? dev->clock_headroom : 1.0;
    double best = 0.0;
    for (int i = 0; i < dev->n_tiles; i++) {
        double tm = dev->tile_m[i], tn = dev->tile_n[i];
        double tiles = ceil(m / tm) * ceil(n / tn) * batch;
        double waves = ceil(tiles / dev->sm_count);
        double slots = fmax(tiles, waves * dev->sm_count / headroom);
        double util = (m * n * batch) / (slots * tm * tn) * dev->tile_eff[i];
        if (util > best)
            best = util;
    }
    return best;
}

double sim_gemm_seconds(const SimCtx *c, const ModelGemm *g, double *eff_out)
{
    return sim_gemm_seconds_as(c, g, 0, eff_out);
}

double sim_gemm_seconds_as(const SimCtx *c, const ModelGemm *g, int fp8, double *eff_out)
{
    const ProfDevice *dev = &c->cl->device;
    double m = (double)g->m, n = (double)g->n, k = (double)g->k, batch = (double)g->batch;
    double flops = 2.0 * m * n * k * batch;
    const double peak = fp8 ? c->peak_fp8 : c->peak;
    const double base_eff = fp8 ? prof_matmul_eff(dev, PX_FP8) : dev->matmul_eff;
    /* a calibrated profile measured GEMMs at the op graph's shapes (in the job's precision: an
     * FP8 GEMM takes that time scaled by the profile's FP8 over 16-bit rate) */
    double measured = prof_measured_gemm(c->cl->measured, m, n, k, batch, c->node_size);
    if (measured > 0) {
        if (fp8)
            measured *= (c->peak * dev->matmul_eff) / (peak * base_eff);
        if (eff_out)
            *eff_out = flops / (peak * measured);
        return measured;
    }
    double eff = base_eff * tile_utilization(dev, m, n, batch);
    /* A short K leaves the main loop little to amortise its prologue and epilogue. */
    if (dev->matmul_k_half > 0)
        eff *= k / (k + dev->matmul_k_half);
    /* Tensor cores need rows of 16 bytes: 8 half-precision elements (seed 003's checklist),
     * 16 FP8 ones. */
    const int in_bytes = fp8 ? 1 : c->elem_bytes;
    int align = 16 / in_bytes;
    if (((int64_t)g->n % align) != 0 || ((int64_t)g->k % align) != 0)
        eff *= dev->misaligned_eff;
    double t_compute = flops / (peak * eff);
    double io = ((m * k + k * n) * in_bytes + m * n * c->elem_bytes) * batch;
    if (c->cpu16 && !fp8)
        io *= 2.0; /* the fp32 GEMM on the widened copies (cpu16_kernel_scale) */
    double t_memory = io / (dev->memory_bandwidth * dev->memory_eff);
    if (eff_out)
        *eff_out = t_compute >= t_memory ? eff : flops / (peak * t_memory);
    return t_compute > t_memory ? t_compute : t_memory;
}

double sim_op_gemm_seconds(const SimCtx *c, const ModelOp *op, int i, int fp8)
{
    ModelGemm four, rest;
    const int64_t rounds = sim_moe_gemm_split(op, i, &four, &rest);
    if (rounds == 0)
        return sim_gemm_seconds_as(c, &op->gemm[i], fp8, NULL);
    double t = (double)rounds * sim_gemm_seconds_as(c, &four, fp8, NULL);
    if (rest.batch > 0)
        t += sim_gemm_seconds_as(c, &rest, fp8, NULL);
    return t;
}

/* An op's time from the rate calibrate fitted for its kind, phase and variant: its fixed cost
 * plus its size at that rate, a matmul's GEMMs timed as measured. Negative when the profile
 * has no such rate. */
static double measured_op_seconds(const SimCtx *c, const ModelOp *op)
{
    const ProfMeasured *m = c->cl->measured;
    if (!m || m->n_ops == 0)
        return -1.0;
    ModelOpKey key;
    model_op_key(c->spec, c->d, op, &key);
    /* the ranks of a node run at once: they share its caches and memory bandwidth */
    const ProfOpRate *r =
        prof_measured_op(m, key.kind, key.phase, key.flash, key.variant, c->node_size);
    char *ring = strstr(key.variant, "/ring");
    if (!r && ring) { /* a profile calibrated without a ring: the whole core's rate */
        *ring = '\0';
        r = prof_measured_op(m, key.kind, key.phase, key.flash, key.variant, c->node_size);
    }
    if (!r)
        return -1.0;
    /* the rate is the fp32 kernel's (calibrate trains in fp32): a 16-bit op's size as the fp32
     * kernel it runs sees it; an attention core's is its FLOPs */
    const double x = op->kind == MODEL_OP_ATTENTION ? key.x : key.x * cpu16_kernel_scale(c, op);
    double t = r->overhead_s + x / r->rate + cpu16_pass_seconds(c, op);
    for (int i = 0; op->kind == MODEL_OP_MATMUL && i < op->n_gemm; i++)
        t += sim_op_gemm_seconds(c, op, i, op->fp8);
    t += sim_host_sync_seconds(c, op);
    /* FP8 quantization passes were not measured: they stream at the profile's bandwidth */
    const ProfDevice *dev = &c->cl->device;
    t += op->fp8_cast_bytes / (dev->memory_bandwidth * dev->memory_eff);
    return t;
}

double sim_compute_seconds(const SimCtx *c, const ModelOp *op)
{
    const ProfDevice *dev = &c->cl->device;
    const double bw = dev->memory_bandwidth * dev->memory_eff;
    const double launch = op->kernels * dev->kernel_overhead_s;
    double measured = measured_op_seconds(c, op);
    if (measured >= 0)
        return measured;
    if (op->kind == MODEL_OP_ATTENTION && c->spec->job.flash_attn) {
        /* a fused causal kernel skips the masked half, whatever half the FLOP count states */
        double work = c->spec->job.causal_flops ? op->flops : 0.5 * op->flops;
        /* at FlashAttention-2's rate where the framework calls it (d->attn_fa2) */
        const int fa2 = c->d && c->d->attn_fa2;
        double eff = op->phase == MODEL_BWD ? (fa2 ? dev->attn_fa2_bwd_eff : dev->attn_bwd_eff)
                                            : (fa2 ? dev->attn_fa2_fwd_eff : dev->attn_fwd_eff);
        double t_c = work / ((op->fp8 ? c->peak_fp8 : c->peak) * eff);
        double t_m = op->bytes * cpu16_kernel_scale(c, op) / bw;
        return (t_c > t_m ? t_c : t_m) + launch + cpu16_pass_seconds(c, op);
    }
    double t = 0.0, io = 0.0;
    const int fp8 = op->fp8 && op->kind == MODEL_OP_MATMUL;
    const double in_bytes = fp8 ? 1.0 : (double)c->elem_bytes;
    for (int i = 0; i < op->n_gemm; i++) {
        const ModelGemm *g = &op->gemm[i];
        t += sim_op_gemm_seconds(c, op, i, fp8);
        io += (((double)g->m * g->k + (double)g->k * g->n) * in_bytes +
               (double)g->m * g->n * c->elem_bytes) * (double)g->batch;
    }
    /* the unfused attention core streams its s x s scores through softmax and dropout at the
     * rate of those kernels (memory_attention), the rest at the streaming kernels' */
    double rest = (op->bytes - io) * cpu16_kernel_scale(c, op);
    if (rest > 0)
        t += rest / (op->kind == MODEL_OP_ATTENTION
                         ? dev->memory_bandwidth * dev->memory_attn_eff
                         : bw);
    return t + launch + sim_host_sync_seconds(c, op) + cpu16_pass_seconds(c, op);
}

double sim_collective_seconds(ModelCollective coll, double S, int n, double alpha, double beta)
{
    if (coll == MODEL_COLL_SEND || coll == MODEL_COLL_RECV)
        return alpha + S / beta;
    if (n < 2)
        return 0.0;
    double steps = n - 1.0, chunk = S / n;
    if (coll == MODEL_COLL_ALLREDUCE) {
        /* ring: reduce-scatter then all-gather, 2(n-1) steps of S/n; a double binary tree
         * pays log2(n) latencies each way but moves S twice: the library takes the faster */
        double ring = 2.0 * steps * (alpha + chunk / beta);
        double tree = 2.0 * ceil(log2((double)n)) * alpha + 2.0 * S / beta;
        return ring < tree ? ring : tree;
    }
    return steps * (alpha + chunk / beta);
}

void sim_group_path(const SimCtx *c, int base, int stride, int n, double *alpha, double *beta,
                    int *nodes_out)
{
    const ProfCluster *cl = c->cl;
    const int N = c->node_size;
    int nodes = 0, last = -1, per_node = 0, most = 0;
    for (int i = 0; i < n; i++) {
        int node = (base + i * stride) / N;
        if (node != last) {
            nodes++;
            last = node;
            per_node = 0;
        }
        per_node++;
        if (per_node > most)
            most = per_node;
    }
    double link = cl->link_bandwidth * cl->link_eff;
    if (nodes <= 1) {
        *alpha = cl->link_latency;
        *beta = link;
    } else {
        /* A ring through k nodes crosses the network once per node and channel; with one NIC
         * share per device, the group's `most` ranks on a node drive `most` shares. */
        double net = most * cl->net_bandwidth * cl->net_eff;
        *alpha = cl->net_latency;
        *beta = net < link ? net : link;
    }
    if (nodes_out)
        *nodes_out = nodes;
}

/* The nodes a group of n ranks (base, base + stride, ...) spans, and the fewest of its members
 * any of them holds. */
static void group_nodes(const SimCtx *c, int base, int stride, int n, int *nodes_out, int *fewest_out)
{
    const int N = c->node_size;
    int nodes = 0, last = -1, here = 0, fewest = n;
    for (int i = 0; i <= n; i++) {
        int node = i < n ? (base + i * stride) / N : -1;
        if (node != last) {
            if (last >= 0) {
                nodes++;
                if (here < fewest)
                    fewest = here;
            }
            last = node;
            here = 0;
        }
        here++;
    }
    *nodes_out = nodes;
    *fewest_out = fewest;
}

/* C(A - b, k) / C(A, k): the chance that k of A things drawn without replacement miss b given
 * ones. */
static double miss_all(double A, double b, int k)
{
    double p = 1.0;
    for (int i = 0; i < k; i++)
        p *= A - b - i > 0 ? (A - b - i) / (A - i) : 0.0;
    return p;
}

double sim_flex_remote_nodes(const ModelMoe *m, int nodes)
{
    if (nodes < 2 || m->experts <= 0)
        return 0.0;
    const int k = m->topk;
    double distinct;
    if (m->groups > 0 && m->topk_groups > 0 && m->groups % nodes == 0) {
        /* whole groups on each node: a token's experts lie in topk_groups groups, each group
         * chosen for its best experts and so holding at least one of them */
        distinct = nodes * (1.0 - miss_all(m->groups, (double)m->groups / nodes, m->topk_groups));
    } else if (m->groups > 0 && m->topk_groups > 0 && nodes % m->groups == 0) {
        /* each group over nodes / groups nodes: the k experts among its topk_groups groups' */
        const double span = (double)m->topk_groups * nodes / m->groups;
        const double pool = (double)m->topk_groups * m->experts / m->groups;
        distinct = span * (1.0 - miss_all(pool, (double)m->experts / nodes, k));
    } else {
        distinct = nodes * (1.0 - miss_all(m->experts, (double)m->experts / nodes, k));
    }
    /* the rank's own node is any of them alike */
    return distinct * (nodes - 1.0) / nodes;
}

/* Megatron-Core's flex dispatcher on DeepEP's kernels (docs/time.md, "MoE as it runs"): of S,
 * the rank's k copies of its T tokens, each token goes once to each remote node that hosts one
 * of its experts (to the rank of the same local index, over its NIC), and NVLink carries every
 * copy to its expert's rank in the node, the forwarded ones included; both paths at once, the
 * network one a message per remote node. */
static double flex_seconds(const SimCtx *c, int base, int stride, int n, double S)
{
    const ProfCluster *cl = c->cl;
    int nodes, fewest;
    group_nodes(c, base, stride, n, &nodes, &fewest);
    if (nodes <= 1) /* one node: the all-to-all */
        return sim_all_to_all_seconds(c, base, stride, n, S, NULL);
    const double k = fewest, link = cl->link_bandwidth * cl->link_eff;
    const double t_link = k > 1 ? (k - 1.0) * cl->link_latency + S * (k - 1.0) / k / link : 0.0;
    const ModelMoe *m = &c->spec->model.moe;
    const double net = cl->net_bandwidth * cl->net_a2a_eff;
    const double t_net = (nodes - 1.0) * cl->net_latency + S / m->topk * sim_flex_remote_nodes(m, nodes) / net;
    return t_link > t_net ? t_link : t_net;
}

double sim_all_to_all_seconds(const SimCtx *c, int base, int stride, int n, double S, int *nodes_out)
{
    const ProfCluster *cl = c->cl;
    if (nodes_out)
        *nodes_out = 1;
    if (n < 2)
        return 0.0;
    /* the fewest group members any node holds: that node's ranks send the most off the node */
    int nodes, fewest;
    group_nodes(c, base, stride, n, &nodes, &fewest);
    if (nodes_out)
        *nodes_out = nodes;
    const double link = cl->link_bandwidth * cl->link_eff;
    const double k = fewest;
    /* a rank sends S/n to each of the n - 1 others, one send per peer: k - 1 of them over the
     * node's link, n - k over its share of the node's NICs, both paths at once; each path pays
     * a latency per peer (NCCL's grouped point-to-point operations, docs/time.md,
     * "All-to-all") */
    const double t_link = (k - 1.0) * (cl->link_latency + S / (n * link));
    if (nodes <= 1)
        return t_link;
    /* across nodes at the rate NCCL's grouped send/receive reaches over a NIC, which a profile
     * may give apart from the rings' (network.all_to_all_efficiency) */
    const double net = cl->net_bandwidth * cl->net_a2a_eff;
    const double t_net = (n - k) * (cl->net_latency + S / (n * net));
    return t_link > t_net ? t_link : t_net;
}

double sim_comm_seconds(const SimCtx *c, const ModelOp *op, int stage)
{
    const ModelDims *d = c->d;
    const int t = d->t, cpd = d->c, dp = d->dp, p = d->p;
    int base = stage * t * cpd * dp, stride = 1, n = op->group_size;
    switch (model_comm_group(op->comm)) {
    case MODEL_GROUP_TP: stride = 1; break;
    case MODEL_GROUP_CP: stride = t; break;
    case MODEL_GROUP_DP: stride = t; break; /* dp x cp: adjacent in rank order */
    /* Megatron-Core's expert order inside a stage: etp fastest, then ep, then expert dp */
    case MODEL_GROUP_ETP: stride = 1; break;
    case MODEL_GROUP_EP: stride = d->etp; break;
    /* the all-gather dispatcher's group: etp x ep consecutive ranks (Megatron-Core's
     * expert-tensor-and-model-parallel group) */
    case MODEL_GROUP_ETP_EP: stride = 1; break;
    case MODEL_GROUP_EDP: stride = d->etp * d->ep; break;
    /* HSDP's replicas of a shard: dp ranks are shard-fastest, so one replica group strides
     * over a whole shard group (dp_shard x cp ranks of tp) */
    case MODEL_GROUP_DPR: stride = t * cpd * d->dp_shard; break;
    case MODEL_GROUP_EMBED:
        base = 0;
        stride = t * cpd * dp * (p - 1);
        n = 2;
        break;
    case MODEL_GROUP_PP: {
        /* the transfer to the next stage (forward send, backward receive) or the previous */
        int dir = (op->comm == MODEL_PP_SEND) == (op->phase == MODEL_FWD) ? 1 : -1;
        int other = (stage + dir + p) % p;
        int lo = stage < other ? stage : other, hi = stage < other ? other : stage;
        base = lo * t * cpd * dp;
        stride = (hi - lo) * t * cpd * dp;
        n = 2;
        break;
    }
    }
    double alpha, beta;
    int nodes;
    sim_group_path(c, base, stride, n, &alpha, &beta, &nodes);
    ModelCollective coll = model_comm_collective(op->comm);
    const double S = (double)op->comm_bytes;
    if (coll == MODEL_COLL_ALL_TO_ALL) {
        /* S is the busiest expert-parallel rank's buffer (model/ops.c sizes it from dims.routed,
         * imbalance included): it receives (dispatch) and sends back (combine) the most, and
         * the exchange ends when it is done */
        if (op->comm == MODEL_EP_ALL_TO_ALL && c->spec->job.moe_dispatcher == MODEL_MOE_DISPATCH_FLEX &&
            n > 1)
            return op->calls * flex_seconds(c, base, stride, n, S);
        double measured = prof_measured_collective(c->cl->measured, "all_to_all", n, nodes, S);
        if (measured > 0)
            return op->calls * measured;
        return op->calls * sim_all_to_all_seconds(c, base, stride, n, S, NULL);
    }
    /* a calibrated profile measured this collective at this group size */
    static const char *const names[] = {"allreduce", "all_gather", "reduce_scatter", "sendrecv", "sendrecv",
                                        "all_to_all"};
    double measured = prof_measured_collective(c->cl->measured, names[coll], n, nodes, (double)op->comm_bytes);
    if (measured > 0)
        return op->calls * measured;
    return op->calls * sim_collective_seconds(coll, (double)op->comm_bytes, n, alpha, beta);
}
