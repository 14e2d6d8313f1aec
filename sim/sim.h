/* sim — the analytic simulator. It costs what model/ describes for a layout on a cluster
 * profile: memory per pipeline stage and category (the tensor table, with the activation peak
 * of the pipeline schedule), FLOPs per step (the op graph), and communication bytes per stage
 * and kind. It links only cJSON and libm: planning works on a laptop.
 *
 * Example:
 *   SimResult r;
 *   if (sim_run(&spec, &cluster, 1536, &r, &err) == PX_OK) {
 *       sim_result_print(stdout, &r);          // tables for people
 *       cJSON *j = sim_result_to_json(&r);     // the prediction's keys (docs/formats.md)
 *       ...
 *       sim_result_free(&r);
 *   }
 */
#ifndef SIM_H
#define SIM_H

#include <stdio.h>

#include "model/model.h"
#include "profiles/profile.h"

typedef struct {
    uint64_t cat[MODEL_CAT_COUNT]; /* bytes per memory category, activations at their peak */
    uint64_t total;
    int peak_live; /* (chunk, micro-batch) activation sets alive at the activation peak */
    /* offload (docs/memory.md, "Offload"): host bytes per rank by the category they hold
     * (grads: the host gradient shard; master, optimizer; activations: the offloaded layer
     * sets), not counted in cat[] or total */
    uint64_t host[MODEL_CAT_COUNT];
    uint64_t host_total;
} SimStageMemory;

typedef struct {
    double compute_s;       /* compute per step on one rank of the stage */
    double tp_comm_s;       /* TP and CP communication the passes cannot hide, per step */
    double ep_comm_s;       /* the experts' all-to-all and ETP gathers not hidden, per step */
    double pp_comm_s;       /* how much later the stage finishes because of p2p transfers */
    double dp_exposed_s;    /* DP / ZeRO communication not hidden, per step */
    double optimizer_s;     /* with offload_optimizer: the host's step and the PCIe copies not
                               hidden (offload_*_s below) */
    double offload_act_s;   /* activation offload's PCIe copies not hidden, per step (in the
                               passes, so in pipeline_s) */
    double offload_down_s, offload_up_s, offload_host_s; /* offload_optimizer: gradients down
                               and parameters up, not hidden, and the host optimizer step */
    double pipeline_s;      /* when the stage finishes its last backward */
    double bubble_fraction; /* idle over busy time of the stage without transfers */
    double step_s;          /* the stage's step: pipeline, then reduction, optimizer, gathers */
    /* ZeRO-2/3's per-micro-batch collectives per step (docs/time.md, "Sharded data
     * parallelism"), by SIM_ZERO_*: their time, of it the latency part (calls x (n - 1) x
     * alpha), and what the passes could not hide (of dp_exposed_s) */
    double zero_s[4], zero_latency_s[4], zero_exposed_s[4];
    /* context parallelism's exchange per step (docs/time.md, "Context parallelism"): its
     * time and what the passes could not hide (of tp_comm_s) */
    double cp_comm_s, cp_exposed_s;
} SimStageTime;

/* ZeRO's per-micro-batch collectives in SimStageTime: the gathers before the forward, before
 * DeepSpeed's recomputed forward, before the backward; the gradients' reduce-scatters. */
enum { SIM_ZERO_GATHER_FWD = 0, SIM_ZERO_GATHER_RECOMPUTE, SIM_ZERO_GATHER_BWD, SIM_ZERO_REDUCE };

/* A simulation is an answer and the workspace it was worked out in, kept apart.
 *
 * SimResult is the answer, what reports, validate, the CLI, the planner's ranking and the
 * tests read: the question as normalised (spec, dims, cluster and what the cluster gives a
 * rank), then the prediction: memory per stage and category with its peaks, FLOPs, bytes per
 * stage and kind, time per stage and of the step, throughput; and the op list every figure was
 * summed from (each stage's op graph and the seconds of each of its ops).
 *
 * SimWork (sim/internal.h) is the workspace, read by sim/ alone: how the simulation was built
 * (compact graphs, the caller's table cache), how far it went (the levels of sim_run_ex and
 * sim_continue), the stages' tensor tables the graphs were built on, and what one phase leaves
 * the next: one micro-batch's passes per chunk, the transfers between stages, the planner's
 * bound on the step. The result owns it and sim_result_free frees both; no caller outside sim/
 * needs it (white-box tests include sim/internal.h to look in).
 *
 * How far sim_run_ex went decides what the answer holds: SIM_MEMORY the question and memory;
 * SIM_BOUND also FLOPs, bytes, the op list and its seconds (and stage_time's sums over the
 * passes); SIM_FULL also the rest of the time. */
typedef struct SimWork SimWork;

typedef struct {
    /* the question, as normalised */
    ModelSpec spec; /* as normalised by model_spec_check (dp, schedule, global batch filled) */
    ModelDims dims;
    ProfCluster cluster;
    double params; /* parameters of the model as configured (no vocabulary padding) */
    int node_size; /* ranks per node in this job */
    uint64_t rank_memory_bytes; /* memory a rank may use on this cluster */
    uint64_t host_rank_memory_bytes; /* host memory a rank may use (0: the profile has none) */
    /* memory */
    SimStageMemory *mem;        /* [pp] */
    uint64_t peak_bytes;
    int peak_stage;
    uint64_t host_peak_bytes; /* the largest host_total of any stage (0 without offload) */
    /* FLOPs and bytes */
    double model_flops;    /* per step, whole job: forward + backward, no recompute */
    double hardware_flops; /* per step, whole job: recompute included */
    double *rank_flops;    /* [pp] hardware FLOPs of one rank of each stage per step */
    uint64_t (*comm)[MODEL_COMM_COUNT]; /* [pp][kind] bytes one rank moves per step */
    /* the op list: each stage's ops (compact: one layer per chunk standing for its run, and a
     * middle stage may share an earlier one's graph and seconds) and their seconds */
    ModelOpGraph *ops;                  /* [pp] op graph of each stage */
    double **op_seconds;                /* [pp][op] seconds of one execution of each op */
    /* time: each stage's, then the prediction's time and throughput, for the stage that ends
     * the step last */
    SimStageTime *stage_time;           /* [pp] */
    int critical_stage;
    double step_s, bubble_fraction, compute_s, tp_comm_s, pp_comm_s, dp_comm_exposed_s, optimizer_s;
    double ep_comm_s; /* the experts' all-to-all and ETP gathers not hidden, per step */
    double tokens_per_s;
    double tflops_per_gpu; /* hardware FLOPs per second per GPU, in TFLOP/s (Narayanan's metric) */
    double mfu, hfu;       /* model / hardware FLOPs over the dense peak */
    double mfu_fp8;        /* with an FP8 recipe: model FLOPs over the FP8 (MXFP8) peak */
    SimWork *work;         /* the workspace (owned; sim/ only) */
} SimResult;

/* Simulates spec on cluster with `gpus` ranks (dp 0 in the spec: what the GPUs leave).
 * PX_EINPUT names the layout rule or the cluster limit that is broken; nothing is allocated. */
int sim_run(const ModelSpec *spec, const ProfCluster *cluster, int gpus, SimResult *out,
            PxError *err);
/* How far sim_run_ex goes: memory; + FLOPs, bytes and every op's time (and, in the workspace,
 * the planner's lower bound on the step); + the pipeline and the step itself. */
enum { SIM_MEMORY = 1, SIM_BOUND = 2, SIM_FULL = 3 };

/* The planner's fast path: compact tables and graphs (one layer per chunk standing for all
 * of them) and one build per distinct stage, up to `level`. Memory, FLOPs, communication and
 * time agree with sim_run's (tests check it); op lists hold one layer per chunk. */
int sim_run_ex(const ModelSpec *spec, const ProfCluster *cluster, int gpus, int compact,
               int level, SimResult *out, PxError *err);
/* sim_run_ex's fast path with the planner's cache of compact tables (model_table_cache_new;
 * NULL: none): the same results, tables put together from halves built once per distinct
 * input. The cache must outlive the result. */
int sim_run_cached(const ModelSpec *spec, const ProfCluster *cluster, int gpus,
                   ModelTableCache *cache, int level, SimResult *out, PxError *err);
/* Takes a result of sim_run_ex further, up to `level`. */
int sim_continue(SimResult *r, int level, PxError *err);
/* The planner's memory verdict: the peak bytes of any stage (and the first stage that reaches
 * it) of a layout model_spec_check has passed (spec normalised, d its dims, precision
 * resolved), from compact tables (cache may be NULL), without a SimResult. Equal to sim_run's
 * peak_bytes and peak_stage. */
int sim_memory_peak(const ModelSpec *spec, const ModelDims *d, const ProfCluster *cluster,
                    ModelTableCache *cache, uint64_t *peak, int *peak_stage, PxError *err);
/* sim_memory_peak with the largest host bytes of any stage (offload; host_peak may be NULL). */
int sim_memory_peaks(const ModelSpec *spec, const ModelDims *d, const ProfCluster *cluster,
                     ModelTableCache *cache, uint64_t *peak, int *peak_stage, uint64_t *host_peak,
                     PxError *err);
/* PX_EINPUT when the layout offloads (optimizer or activations) to a cluster whose profile
 * describes no host (host.memory_bytes, host.pcie_bandwidth, host.memory_bandwidth). */
int sim_offload_check(const ModelSpec *spec, const ProfCluster *cluster, PxError *err);
/* Seconds one rank spends on one layer and one micro-batch, forward and backward (recompute
 * included): its compute and the TP communication it cannot hide when TP stays inside a node
 * (other communication left out). A result of sim_run_ex at SIM_MEMORY or beyond. */
int sim_layer_seconds(const SimResult *r, double *fwd_s, double *bwd_s, PxError *err);
/* The planner's cheap lower bound on a layout's step (spec checked, d its dims) from one
 * layer's forward and backward (sim_layer_seconds): each stage's passes, and the pipeline's
 * fill before and drain after them. */
double sim_step_floor(const ModelSpec *spec, const ModelDims *d, double layer_fwd_s,
                      double layer_bwd_s);
void sim_result_free(SimResult *r);
/* The prediction (docs/formats.md: memory, flops, comm, ops) plus model, layout and training. */
cJSON *sim_result_to_json(const SimResult *r);
void sim_result_print(FILE *f, const SimResult *r);
/* The Prediction object alone (memory, flops, comm, time, throughput, ops): a plan's
 * `prediction`. */
cJSON *sim_prediction_to_json(const SimResult *r);
/* One transformer layer's time (docs/cli.md, --layer-time): the model's middle layer (layers / 2)
 * on the stage that holds it, one micro-batch, each pass by kind of work as the passes sum it.
 * total = gemm + attention core + elementwise + comm exposed; attention_gemm is the core's own
 * batched GEMMs (in attn_core; 0 with flash attention, one fused kernel), comm_hidden the overlapped part of the layer's TP, CP and EP
 * collectives (ZeRO's and the pipeline's are not a layer's). The backward includes the
 * recomputed forward (recompute_s of it). */
typedef struct {
    double total_s, gemm_s, attn_core_s, attn_gemm_s, elementwise_s, comm_exposed_s, comm_hidden_s;
    double recompute_s;
} SimPassTime;
typedef struct {
    int layer, stage, chunk;
    SimPassTime fwd, bwd;
} SimLayerTime;
/* PX_ERUNTIME when r is not a full simulation; nothing is allocated. */
int sim_layer_time(const SimResult *r, SimLayerTime *out, PxError *err);
void sim_layer_time_print(FILE *f, const SimResult *r, const SimLayerTime *lt);
cJSON *sim_layer_time_to_json(const SimLayerTime *lt);
/* What FP8 changes (docs/fp8.md): a simulation with an FP8 recipe set beside the same layout
 * without one. Time on the stage that ends the step, memory on the peak stage; the FP8 tensors'
 * bytes by kind from its full table (zero from a compact one). */
typedef struct {
    int on;                      /* the job has an FP8 recipe (else all zero) */
    double step_s, base_step_s;  /* with FP8, and without */
    double gemm_s, base_gemm_s;  /* ops whose GEMMs run in FP8, per step, and the same ops without */
    double cast_s;               /* quantization passes per step (in gemm_s; the weights' casts too) */
    int stage;                   /* the peak stage the memory figures are of */
    uint64_t mem[MODEL_CAT_COUNT], base_mem[MODEL_CAT_COUNT];
    uint64_t peak_bytes, base_peak_bytes;
    uint64_t weight_copies, transposes, fp8_params, scales, amax, workspace;
    uint64_t act_fp8, act_fp8_as_16; /* saved FP8 GEMM inputs at the peak, and in 16 bits */
    double mfu, base_mfu, mfu_fp8;   /* over the 16-bit peak with and without FP8; over FP8's */
} SimFp8Effect;
int sim_fp8_effect(const SimResult *r, SimFp8Effect *e, PxError *err);
void sim_fp8_effect_print(FILE *f, const SimResult *r, const SimFp8Effect *e);
cJSON *sim_fp8_effect_to_json(const SimResult *r, const SimFp8Effect *e);
/* The zoo and the built-in profiles, as tables or JSON. */
int sim_list_models(FILE *f, int json, PxError *err);
int sim_list_profiles(FILE *f, int json, PxError *err);
/* One action of the simulated pipeline: a forward or backward of (chunk, micro-batch) on a
 * stage, with when it ran (its blocking send included at its end). */
typedef struct {
    int stage, chunk, mb, backward;
    double start_s, end_s, send_s;
} SimEvent;

/* Every action of every stage (stage-major, in schedule order), from a full simulation.
 * The caller frees *events. */
int sim_timeline(const SimResult *r, SimEvent **events, int *count, PxError *err);

/* ---- the planner (sim/plan.c) ---- */

typedef enum { SIM_OBJ_TIME = 0, SIM_OBJ_COST, SIM_OBJ_TOKENS_PER_GPU } SimObjective;

/* Knobs the user pinned: the planner tries only the request's value for them. */
enum {
    SIM_PIN_TP = 1 << 0,
    SIM_PIN_PP = 1 << 1,
    SIM_PIN_DP = 1 << 2,
    SIM_PIN_CP = 1 << 3,
    SIM_PIN_VPP = 1 << 4,
    SIM_PIN_ZERO = 1 << 5,
    SIM_PIN_SP = 1 << 6,
    SIM_PIN_MBS = 1 << 7,
    SIM_PIN_RECOMPUTE = 1 << 8,
    SIM_PIN_SCHEDULE = 1 << 9,
    SIM_PIN_PP_LAYERS = 1 << 10, /* base.layout.stage_layers (pins pp too) */
    SIM_PIN_EP = 1 << 11,
    SIM_PIN_ETP = 1 << 12,
    SIM_PIN_CP_COMM = 1 << 13
};

/* Why a layout was rejected: one of model's rules (ModelRule), or the planner's own;
 * SIM_REJECT_EXECUTOR: planning for this machine's cluster ("local"), a layout the executor
 * would refuse (model_exec_refusal); SIM_REJECT_FRAMEWORK: a layout the job's framework does not
 * run (model_framework_refusal: torchtitan's ZeRO-1/2, DeepSpeed's ring, ...). */
enum { SIM_REJECT_CROSS_NODE_TP = MODEL_RULE_COUNT, SIM_REJECT_MEMORY, SIM_REJECT_HOST_MEMORY,
       SIM_REJECT_EXECUTOR, SIM_REJECT_FRAMEWORK, SIM_REJECT_COUNT };

typedef struct {
    ModelSpec spec; /* the layout, normalised */
    double score;   /* the objective, lower is better */
    double step_s, tokens_per_s, mfu, bubble_fraction, tflops_per_gpu;
    double compute_s, tp_comm_s, pp_comm_s, dp_comm_exposed_s, optimizer_s;
    uint64_t peak_bytes;
    uint64_t host_peak_bytes; /* offload's host bytes per rank (0 without offload) */
} SimCandidate;

typedef struct {
    ModelSpec base;  /* model and job; the pinned knobs' values in layout and job */
    unsigned pinned; /* SIM_PIN_* */
    int gpus;
    SimObjective objective;
    double headroom;         /* fraction of each rank's memory kept free */
    int allow_cross_node_tp; /* else tp must divide the node */
    int top;                 /* layouts to rank (>= 1) */
    /* a MoE model's expert degrees to try when not pinned (n 0: every degree that divides the
     * experts and the stage's ranks; etp: 1 and tp) */
    int ep_values[16], n_ep_values;
    int etp_values[16], n_etp_values;
    int brute_force;         /* time every feasible layout exactly (tests of the pruning) */
    /* each layout simulated in full (all feasible ones with brute_force), optional */
    void (*timed)(void *ctx, const SimCandidate *c);
    void *timed_ctx;
    /* progress (optional): phase 0 rules and memory, 1 exact timing, 2 done; over several
     * searches also 3, a sweep's (size, cluster) done (done of total), and 4, --min-gpus's size
     * tried (done GPUs of at most total) */
    void (*progress)(void *ctx, long done, long total, int phase);
    void *progress_ctx;
} SimPlanRequest;


typedef struct {
    SimCandidate *top; /* best first */
    int n_top;
    long considered; /* layouts enumerated */
    long evaluated;  /* passed the rules: simulated, memory at least */
    long feasible;   /* evaluated and fit: a floor on the step computed (sim_step_floor) */
    long timed;      /* given the exact pipeline simulation */
    long rejected[SIM_REJECT_COUNT];
    char example[SIM_REJECT_COUNT][320]; /* the first rejection of each reason */
    uint64_t rank_memory_bytes;
    double seconds;
} SimPlanResult;

/* Searches every layout. PX_EINPUT when none works, naming the commonest reason. */
int sim_plan(const SimPlanRequest *q, const ProfCluster *cluster, SimPlanResult *out, PxError *err);
void sim_plan_free(SimPlanResult *r);
const char *sim_objective_name(SimObjective o);
int sim_objective_from_name(const char *s);
const char *sim_reject_name(int reason);
/* The ranked table, what makes each layout win, and the rejections (examples with explain). */
void sim_plan_print(FILE *f, const SimPlanRequest *q, const ProfCluster *cluster,
                    const SimPlanResult *r, int explain);
/* One line for sweeps: the best layout and its figures. */
void sim_plan_summary_line(char *buf, size_t cap, const SimPlanResult *r);
/* search {considered, evaluated, feasible, timed, seconds, rejected{}, top[]} */
cJSON *sim_plan_search_json(const SimPlanResult *r);
/* `parallax plan --json` for one size on one cluster: {cluster, gpus, model, training, layout,
 * prediction, search}, from the search and its winner simulated in full (sim_plan_best). */
cJSON *sim_plan_answer_json(const SimPlanResult *r, const ProfCluster *cluster, int gpus,
                            const ModelPlan *plan, const SimResult *full);
/* A progress bar for a long search, drawn on f (a terminal): give sim_progress_bar as the
 * request's progress and a SimProgressBar with f set and the rest zero as its context. The bar
 * appears once a search has run half a second (short ones stay silent), is redrawn at most
 * ten times a second, and is erased when the search ends, ready for the next one. With lines
 * set (f a file or a pipe, where a redrawn bar is noise) it writes whole lines instead, once a
 * search has run 2 s: one as each phase begins, one every 10 s within it, one at the end
 * ("plan: 1234567 of 5667264 layouts checked against the rules and memory (2.0 s)"). */
typedef struct {
    FILE *f;
    int lines;   /* a line per phase instead of a redrawn bar */
    const char *what; /* the lines' first word: the command ("plan") */
    double start_s, drawn_s; /* when the search began; when the bar was last drawn */
    int shown;
    int phase; /* lines: the phase of the last line, plus one (0: none yet) */
    double first_s, told_s; /* lines: when the first search began; the last line over searches */
} SimProgressBar;
void sim_progress_bar(void *ctx, long done, long total, int phase);
/* The winner as a plan: simulated in full (every layer's ops), its prediction attached. The
 * caller frees plan (model_plan_free) and full (sim_result_free). */
int sim_plan_best(const SimPlanResult *r, const ProfCluster *cluster, const char *cluster_ref,
                  int gpus, ModelPlan *plan, SimResult *full, PxError *err);
/* The plan of a full simulation: its layout and job, its cluster profile (copied, so the plan
 * is self-contained) and its prediction; cluster_ref names the profile as the user gave it.
 * The caller frees plan (model_plan_free). */
int sim_plan_make(const SimResult *full, const char *cluster_ref, ModelPlan *plan, PxError *err);
/* A plan without the planner: spec simulated on the cluster profile `cluster` (no overrides)
 * with `gpus` ranks (tests and tools/mkplan). */
int sim_plan_for(const ModelSpec *spec, const char *cluster, int gpus, ModelPlan *out,
                 PxError *err);

/* ---- sweeps (sim/sweep.c): the planner over several sizes and cluster profiles ---- */

/* One (size, cluster) of a sweep: its best layout, or why none works there. */
typedef struct {
    int gpus;
    const ProfCluster *cluster;
    int ok;             /* a layout works: plan holds the best (top 1) */
    SimPlanResult plan;
    char error[1024];   /* not ok: why no layout works (sim_plan's message) */
    double value, rank; /* ok: the objective's figure (sim_objective_unit); it, lower better */
} SimSweepRow;

typedef struct {
    SimSweepRow *rows; /* size-major: rows[s * n_clusters + c] */
    int n_rows, n_gpus, n_clusters;
    int best;          /* the row the objective ranks first; -1 when no row works */
    SimObjective objective;
    int priced;        /* GPU-hour prices were given: cost is money, not GPU-hours */
} SimSweep;

/* The best layout of q's model and job (q->gpus and q->top are not read) at every size of gpus
 * on every cluster, ranked across rows by the objective's figure: step seconds; GPU-hours per
 * million tokens, times the cluster's price of a GPU-hour when prices are given; tokens per
 * second per GPU. price holds none (n_price 0), one for every cluster, or one per cluster, each
 * positive, and only for the cost objective: PX_EINPUT otherwise. A (size, cluster) where no
 * layout works is a row with its reason, not an error; PX_ERUNTIME (out of memory, a
 * simulation that failed) stops the sweep with out empty. The caller frees out (sim_sweep_free). */
int sim_sweep(const SimPlanRequest *q, const ProfCluster *clusters, int n_clusters,
              const int *gpus, int n_gpus, const double *price, int n_price, SimSweep *out,
              PxError *err);
void sim_sweep_free(SimSweep *s);
/* What a sweep's objective figures measure: "step seconds", "GPU-hours per million tokens" (or
 * money, when priced), "tokens per second per GPU". */
const char *sim_objective_unit(SimObjective o, int priced);
/* The sweep for people: a line per row (size, cluster, the best layout and its figures, the
 * objective's figure where it is not the step time), the best marked and named under them. q
 * is the sweep's request (its model and global batch head the table). */
void sim_sweep_print(FILE *f, const SimPlanRequest *q, const SimSweep *s);
/* [{cluster, gpus, objective_value and search | error, best}] */
cJSON *sim_sweep_to_json(const SimSweep *s);

/* The fewest GPUs (node multiples 1, 2, 3, 4, 6, 8, 12, ... from q->gpus up to limit and the
 * cluster's size) whose best layout meets a step-time budget (max_step_s > 0) and/or a
 * days-to-train budget (max_days > 0, for the job's train_tokens). PX_EINPUT when no size
 * does, naming the sizes tried and the closest; the caller frees out (sim_plan_free). */
int sim_plan_min_gpus(const SimPlanRequest *q, const ProfCluster *cluster, double max_step_s,
                      double max_days, int limit, SimPlanResult *out, int *gpus_out,
                      PxError *err);
/* The answer of sim_plan_min_gpus on one cluster: for people, "<cluster>: fewest GPUs meeting
 * the budget: N" and the best layout's line; for machines, {cluster, gpus, search}. */
void sim_min_gpus_print(FILE *f, const ProfCluster *cluster, int gpus, const SimPlanResult *r);
cJSON *sim_min_gpus_to_json(const ProfCluster *cluster, int gpus, const SimPlanResult *r);

/* ---- published runs (sim/published.c; docs/calibration.md, "Published runs") ---- */

/* A row's measured figure: the step's seconds, achieved TFLOP/s per GPU (hardware FLOPs, as
 * Narayanan's, or on the source's own FLOP count: below), or tokens per second per GPU. */
enum { SIM_PUB_STEP_S = 0, SIM_PUB_TFLOPS_PER_GPU, SIM_PUB_TOKENS_PER_S_PER_GPU, SIM_PUB_METRIC_COUNT };

/* The FLOP count a source turned its step time into TFLOP/s or MFU with (a row's flop_count;
 * docs/calibration.md, "FLOP counts"): none, parallax's own hardware FLOPs; Megatron-LM's
 * num_floating_point_operations with the attention scores counted in full (before Megatron-LM
 * commit 8873b55d6a, 2025-03-06) or halved for the causal mask (after it); PaLM's 6N + 12LHQT a
 * token (Chowdhery et al. 2022, App. B), in full or with the attention term halved. */
typedef enum {
    SIM_FLOPS_OWN = 0,
    SIM_FLOPS_MEGATRON,
    SIM_FLOPS_MEGATRON_CAUSAL,
    SIM_FLOPS_PALM,
    SIM_FLOPS_PALM_CAUSAL,
    SIM_FLOPS_COUNT
} SimFlopCount;
const char *sim_flop_count_name(SimFlopCount c);
int sim_flop_count_from_name(const char *name); /* -1 when unknown */
/* The FLOPs of one step of gbs sequences of seq tokens by count c (c != SIM_FLOPS_OWN);
 * vocab_padded is the output layer's width (Megatron's padded vocabulary). 0 for a model the
 * count does not cover (multi-head latent attention). */
double sim_flop_count_step(SimFlopCount c, const ModelConfig *m, double gbs, double seq,
                           double vocab_padded);

typedef struct {
    char id[96], model[128], cluster[128], framework[32];
    int gpus, metric;
    double measured, predicted; /* in the metric */
    double error;               /* predicted / measured - 1 */
    double tolerance;           /* the |error| the row is held to */
    int inside;                 /* |error| <= tolerance */
    double step_s;              /* the predicted step */
    int fits;                   /* the prediction fits the device's memory */
    SimFlopCount flops;         /* the count tflops_per_gpu is on (SIM_FLOPS_OWN: parallax's) */
    double measured_step_s;     /* with a source's count: the step its figure stands for */
} SimPublishedRow;

typedef struct {
    char source[96], path[512];
    SimPublishedRow *rows;
    int n_rows;
} SimPublished;

/* One source's file (published/<source>.json: {source, cite, url, notes, rows[{id, model,
 * cluster, gpus, layout, job, framework, measured, tolerance, assumed}]}), every row simulated.
 * A model or cluster ending in .json is a file beside the data file. PX_EINPUT names the file,
 * the row and the key at fault; nothing is left allocated. */
int sim_published_run(const char *path, SimPublished *out, PxError *err);
/* The same with every row priced as run by `framework` (NULL: each row's own). */
int sim_published_run_as(const char *path, const char *framework, SimPublished *out, PxError *err);
/* The same again with every row that names a FLOP count read on count `flops` instead
 * (SIM_FLOPS_OWN: parallax's hardware FLOPs; -1: each row's own), to see what the count
 * changes. */
int sim_published_run_with(const char *path, const char *framework, SimFlopCount flops,
                           SimPublished *out, PxError *err);
void sim_published_free(SimPublished *p);
const char *sim_published_metric_name(int metric);
/* Every row of n sources: id, framework, metric, measured, predicted, error, tolerance, in/out. */
void sim_published_print(FILE *f, const SimPublished *p, int n);
/* [{source, file, rows[{id, model, cluster, gpus, framework, metric, measured, predicted, error,
 * tolerance, inside, step_s, fits, and with a source's count flop_count, measured_step_s}]}] */
cJSON *sim_published_to_json(const SimPublished *p, int n);

/* The precision a job gets when none is given: bf16 where the device has bf16 tensor cores,
 * fp32 otherwise (CPU ranks). */
PxDtype sim_default_precision(const ProfDevice *d);
/* A job's settings that depend on the device, resolved (precision when auto; whether FP8 keeps
 * transposed copies, from the device's TN-only rule) and checked: PX_EINPUT when the device has
 * no tensor cores for the job's FP8 recipe. */
int sim_resolve_job(ModelJob *j, const ProfDevice *dev, PxError *err);
/* 1 when the job's context-parallel attention is Transformer Engine's, whose memory passes the
 * op graph then prices (ModelDims.cp_te): Megatron-LM, NeMo or Megatron-Bridge on a GPU. */
int sim_cp_te(const ModelSpec *s, const ProfDevice *dev);
/* 1 when it is PyTorch's context_parallel ring (ModelDims.cp_torch): torchtitan on a GPU with
 * cp_comm p2p or allgather (PyTorch has no Ulysses). */
int sim_cp_torch(const ModelSpec *s, const ProfDevice *dev);

#endif
