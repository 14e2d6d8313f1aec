/* Private interfaces between the simulator's files (not part of sim.h's public contract). */
#ifndef SIM_INTERNAL_H
#define SIM_INTERNAL_H

#include "sim/sim.h"

/* What costing an op needs to know about the layout on the cluster. */
typedef struct {
    const ProfCluster *cl;
    const ModelSpec *spec;
    const ModelDims *d;
    int node_size;    /* ranks per node in this job */
    double peak;      /* dense matmul FLOP/s in the job's precision */
    int elem_bytes;   /* bytes of one activation element */
    double peak_fp8;  /* dense FLOP/s of the job's FP8 GEMMs (MXFP8's or FP8's peak; 0: none) */
    int cpu16;        /* a bf16 or fp16 job on CPU ranks: its kernels widen to fp32 (act16.c) */
} SimCtx;

void sim_ctx_init(SimCtx *c, const ProfCluster *cl, const ModelSpec *spec, const ModelDims *d,
                  int node_size);

/* One GEMM (batch products of [m,k] x [k,n]) on the device: the slower of its compute at the
 * efficiency the shape allows and its operand traffic. *eff (optional) gets that efficiency. */
double sim_gemm_seconds(const SimCtx *c, const ModelGemm *g, double *eff);
/* The same GEMM with FP8 operands (fp8 1): at the FP8 peak and FP8 efficiency, one-byte
 * operands, the output in the activation dtype. */
double sim_gemm_seconds_as(const SimCtx *c, const ModelGemm *g, int fp8, double *eff);
/* A MoE layer's routed experts' GEMM (an op of role moe.experts.fc1/fc2): its batch is the
 * local experts, run as Transformer Engine's grouped GEMM does, 4 at a time on its streams,
 * each group quantized into waves on its own (sim/moe.c). */
int sim_is_expert_gemm(const ModelOp *op);
/* GEMM i of op as the grouped GEMM runs it: the rounds of 4 experts (returned; 0: not an
 * expert GEMM of more than 4, run as one), each *four, then *rest (batch 0: none). */
int64_t sim_moe_gemm_split(const ModelOp *op, int i, ModelGemm *four, ModelGemm *rest);
/* Seconds of GEMM i of a matmul op: an expert GEMM as above, any other as sim_gemm_seconds_as. */
double sim_op_gemm_seconds(const SimCtx *c, const ModelOp *op, int i, int fp8);
/* What op's device-to-host syncs cost: host_syncs x the device's host_sync_s. */
double sim_host_sync_seconds(const SimCtx *c, const ModelOp *op);
/* A compute op: its GEMMs, the rest of its bytes at streaming bandwidth, its kernel launches. */
double sim_compute_seconds(const SimCtx *c, const ModelOp *op);
/* The bytes a 16-bit job's op on CPU ranks moves besides its fp32 kernel's: the widening of
 * its 16-bit operands into fp32 scratch and the rounding of its outputs back
 * (kernels/cpu/act16.c; docs/time.md, "16 bits on the CPU"). 0 on a GPU and in fp32. */
double sim_cpu16_pass_bytes(const SimCtx *c, const ModelOp *op);

/* Ring / tree collectives with alpha-beta costs: S bytes over n ranks (S as nccl-tests' size). */
double sim_collective_seconds(ModelCollective coll, double bytes, int n, double alpha, double beta);
/* Latency and per-rank bandwidth of a group of `n` ranks `stride` apart in rank order whose
 * first rank is `base`: inside one node the link, across nodes the slower of the link and the
 * network of the group's ranks on a node (each device brings its share of the node's NICs). */
void sim_group_path(const SimCtx *c, int base, int stride, int n, double *alpha, double *beta,
                    int *nodes);
/* An all-to-all of S bytes per rank (nccl-tests' size: S/n to each rank) over a group of n
 * ranks `stride` apart from `base`: the slower of the k - 1 peers on the node, each a latency
 * of the link and (k-1)/n S over it, and the n - k peers off it, each a latency of the network
 * and (n-k)/n S over the rank's share of the NICs (the two paths at once), k the fewest group
 * members on a node.
 * *nodes (optional) gets the nodes the group spans. docs/time.md derives it. */
double sim_all_to_all_seconds(const SimCtx *c, int base, int stride, int n, double S, int *nodes);
/* The remote nodes a token of model m reaches when its expert-parallel group spans `nodes`
 * nodes, the experts even over them (the flex dispatcher's network copies per token): the
 * distinct nodes of its topk experts, drawn uniformly (within its topk_groups groups under
 * group-limited routing whose groups align with the nodes), times (nodes - 1) / nodes. */
double sim_flex_remote_nodes(const ModelMoe *m, int nodes);
/* Seconds of a communication op (all its calls), for a rank of the given stage. */
double sim_comm_seconds(const SimCtx *c, const ModelOp *op, int stage);

/* Pipeline timing: per stage s and local chunk j, one micro-batch's forward fwd[s*v+j] and
 * backward bwd[s*v+j]; p2p[s] the transfer from stage s to the next (stage p-1 to 0 for the
 * interleaved wrap-around). Fills finish[s] (when stage s ends its last action) and
 * last_bwd_start/end[s*v+j] (its chunk's final backward). Returns the latest finish, or a
 * negative value on allocation failure. */
double sim_pipeline_event(const ModelDims *d, ModelSchedule sched, const double *fwd,
                          const double *bwd, const double *p2p, double *finish,
                          double *last_bwd_start, double *last_bwd_end);
/* The pipeline twice over one schedule build: with the transfers (as sim_pipeline_event) and
 * without them (finish_free[s], for the bubble). scratch holds p + 2 p v doubles. */
double sim_pipeline_pair(const ModelDims *d, ModelSchedule sched, const double *fwd,
                         const double *bwd, const double *p2p, double *finish,
                         double *last_bwd_start, double *last_bwd_end, double *finish_free,
                         double *scratch);
/* The closed form (m + p - 1)(F + B) (1F1B, GPipe) or (m v + p - 1)(f + b) (interleaved), exact
 * when every stage and chunk takes the same time and transfers are free. */
double sim_pipeline_uniform(const ModelDims *d, ModelSchedule sched, double fwd, double bwd);

/* How much of communication op i (per micro-batch, not point-to-point, not data-parallel) its
 * pass cannot hide: TP (and ETP) under overlap_tp and CP behind their partner compute op, the
 * experts' all-to-all under overlap_ep behind the shared experts or, with m >= 2
 * micro-batches, the layer's compute of both passes; each at the overlap slowdown; t holds
 * every op's seconds. A DP op (and EDP) is exposed whole here: sim_dp_exposed times them. */
double sim_comm_exposed(const ModelOpGraph *g, const double *t, int i, const ModelLayout *l,
                        int m, double slow);

/* The per-micro-batch DP (and EDP) collectives of every pass of g (docs/time.md, "Sharded data
 * parallelism"): out[i] is the exposed seconds of one execution of op i (its repeats'
 * average), the others left alone. Without overlap_dp each is exposed whole; with it each pass
 * runs as a compute stream and one network stream that carries the DP collectives in the
 * order they are issued: the gathers of a unit (the blocks gathered at one point of the pass)
 * `prefetch` units ahead of the compute that needs them (none ahead with prefetch -1), the
 * gradients' reduce-scatters when their block's backward ends; compute waits for its gathers
 * and the pass for its last reduce-scatter. A wait is charged to the collectives on the
 * network while it lasts, the hidden rest at the overlap slowdown. Returns 0, or -1 out of
 * memory. */
int sim_dp_exposed(const ModelOpGraph *g, const double *t, const ModelLayout *l, int m,
                   double slow, double *out);

/* The stage whose tables and ops stand for `stage` (itself unless a compact simulation's
 * middle stage is like an earlier one), for a layout (sim_stage_model_of: spec checked, d its
 * dims) or a simulation's result (sim/stage.c). */
int sim_stage_model_of(const ModelSpec *spec, const ModelDims *d, int compact, int stage);
int sim_stage_model(const SimResult *r, int stage);

/* A simulation's workspace (sim.h tells the answer from it): what sim/ builds on the way to a
 * SimResult and reads between the phases of sim_run_ex and sim_continue. One block owned by
 * the result: this struct, then tables, then the doubles of the passes and transfers. */
struct SimWork {
    int compact;            /* built with compact tables and graphs (sim_run_ex) */
    ModelTableCache *cache; /* the caller's, tables come from it (sim_run_cached); not owned */
    int level;              /* how far the simulation went (SIM_MEMORY ...) */
    ModelTensorTable *tables; /* [pp] tensor table of each distinct stage (compact: a middle
                                 stage's stands for those like it); the op graphs' source */
    /* what sim_time_costs leaves sim_time_finish and sim_timeline */
    double *pass_fwd, *pass_bwd; /* [pp * vpp] one micro-batch's passes per chunk */
    double *p2p;                 /* [pp] transfer from each stage to the next */
    double bound_s;              /* no schedule finishes a step sooner (SIM_BOUND; the planner
                                    prunes with it before sim_continue) */
};

/* PX_OK when the cluster has the GPUs; else PX_EINPUT naming the --set nodes=N that would
 * (sim/simulate.c; the simulation and the planner say it alike). */
int sim_cluster_holds(const ProfCluster *cl, int gpus, PxError *err);

/* How far r went (SIM_MEMORY ...; 0: nothing, a result freed or failed). */
static inline int sim_level(const SimResult *r) { return r->work ? r->work->level : 0; }

/* Fills the time of r from its op graphs (sim/time.c): sim_time_costs times every op, sums
 * each chunk's passes and sets the bound (SIM_BOUND); sim_time_finish runs the pipeline and
 * the step (SIM_FULL). */
int sim_time_costs(SimResult *r, PxError *err);
int sim_time_finish(SimResult *r, PxError *err);

#endif
