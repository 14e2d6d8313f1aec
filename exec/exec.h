/* exec — the executor of parallax: it trains a plan for real and measures it under the
 * simulator's names.
 *
 * model/ describes a (model, layout, stage) as a tensor table and an op graph; sim/ costs them,
 * exec/ allocates and runs them. Every tensor the executor touches is carved from one arena per
 * memory category following the tensor table (saved activations from pools of the schedule's
 * live sets, as model_activation_bytes counts them), so measured memory per category equals
 * sim_run's prediction; every op is timed under its op-graph name ("layer.3.attn.qkv.fwd") and
 * its FLOPs are counted from the kernel calls actually made (2·m·n·k per matmul; attention from
 * its call's dimensions), so counted FLOPs equal sim_run's rank_flops. Compute goes through
 * kernels.h (the CPU backend, fp32), communication through an ExecComm table of functions (a
 * single-rank implementation now; MPI and NCCL ones are the natural extension).
 *
 * Training semantics, independent of the layout so that a sharded run can reproduce a
 * single-rank one: weights are a function of (seed, the full parameter's name, the element's
 * index in the full tensor); the global batch of step k is the same sequences whatever dp and
 * micro-batch size; the loss is the mean over every token of the global batch; dropout streams
 * are seeded per (seed, step, global sequence, layer, site), so recompute redraws the same
 * masks. docs/executor.md has the details.
 *
 * Example (what parallax-worker does):
 *   ModelPlan plan;
 *   PxError err = {0};
 *   ExecOptions opt;
 *   exec_options_defaults(&opt);
 *   opt.steps = 60;
 *   opt.output = "run.json";
 *   Exec *ex = NULL;
 *   if (model_plan_read("plan.json", &plan, &err) || exec_init(&ex, &plan, &opt, &err) ||
 *       exec_run(ex, &err))
 *       fprintf(stderr, "parallax-worker: %s\n", err.msg);   // status 2: bad input, 1: runtime
 *   exec_free(ex);
 *   model_plan_free(&plan);
 */
#ifndef EXEC_H
#define EXEC_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "sim/sim.h"

/* ---- communication layer ---- */

/* One rank's view of the job's process groups. Every call names its communication kind
 * (DESIGN.md's names) so that bytes are counted per kind as the simulator counts them: a call's
 * bytes are its buffer size S (nccl-tests' size), and a call over a group of one rank moves and
 * counts nothing. Scalar reductions (loss, gradient norm) are control traffic: kind -1, not
 * counted. The single-rank implementation is exec_comm_single(); an MPI or NCCL one fills the
 * same table. */
typedef struct ExecComm ExecComm;
struct ExecComm {
    const char *name; /* "single", later "mpi", "nccl" */
    int rank, world;
    int group_size[5]; /* ranks in this rank's group, by ModelGroup */
    uint64_t bytes[MODEL_COMM_COUNT];
    /* in-place sum of count elements of dtype over the kind's group */
    int (*allreduce)(ExecComm *c, void *buf, size_t count, PxDtype dtype, int kind, PxError *err);
    /* out holds group_size * count elements; in is this rank's count (may be out's own part) */
    int (*all_gather)(ExecComm *c, void *out, const void *in, size_t count, PxDtype dtype,
                      int kind, PxError *err);
    /* in holds group_size * count elements; out gets this rank's summed count */
    int (*reduce_scatter)(ExecComm *c, void *out, const void *in, size_t count, PxDtype dtype,
                          int kind, PxError *err);
    int (*send)(ExecComm *c, const void *buf, size_t bytes, int peer, int kind, PxError *err);
    int (*recv)(ExecComm *c, void *buf, size_t bytes, int peer, int kind, PxError *err);
    int (*barrier)(ExecComm *c, PxError *err);
    void (*free)(ExecComm *c);
};

/* The communication layer of a job with one rank: every group has size 1. Caller frees with
 * c->free(c). NULL when out of memory. */
ExecComm *exec_comm_single(void);

/* ---- the executor ---- */

typedef struct {
    int steps;           /* 0: the plan's training.steps */
    const char *output;  /* run.json path; NULL: none */
    const char *metrics; /* JSON-lines log, one line per step, flushed; NULL: none */
    const char *data;    /* overrides training.data; NULL: the plan's */
    const char *plan_path; /* for messages and run.json */
    int quiet;           /* no progress lines (tests) */
    int prefetch;        /* 1: a loader thread reads the next batch during the step (default) */
} ExecOptions;

void exec_options_defaults(ExecOptions *o);

typedef struct Exec Exec;

/* Checks that this build can run the plan on this process (one rank, fp32 on the CPU, a
 * supported optimizer and ZeRO stage), opens the data, allocates every tensor of the stage's
 * table through the category arenas and initializes the weights. PX_EINPUT names the plan
 * setting or the data file at fault; nothing is left allocated on failure (*out is NULL). */
int exec_init(Exec **out, const ModelPlan *plan, const ExecOptions *opt, PxError *err);
void exec_free(Exec *ex);

/* Runs the training steps: progress lines, the metrics log, a predicted-against-measured
 * summary, and run.json (atomically) at the end, or after SIGINT/SIGTERM at a step boundary. */
int exec_run(Exec *ex, PxError *err);

typedef struct {
    int step;         /* 1-based */
    double loss;      /* mean over every token of the global batch, before the update */
    double lr;
    double grad_norm; /* global norm before clipping */
    double time_s;
    double tokens_per_s;
} ExecStepStats;

/* One training step with index `step` (0-based: data, dropout and the learning rate follow it):
 * every micro-batch's forward and backward in the schedule's order, then the optimizer. */
int exec_step(Exec *ex, int step, ExecStepStats *st, PxError *err);

/* Forward and backward of the global batch of step `step` without the update: *loss gets the
 * mean loss and the gradient tensors hold d(loss)/d(weight). For tests (gradient checks). */
int exec_grads(Exec *ex, int step, double *loss, PxError *err);
/* The same loss from the forward passes alone (gradients untouched): evaluation, and the
 * finite differences of a gradient check. */
int exec_loss(Exec *ex, int step, double *loss, PxError *err);

/* A weight or gradient tensor by its table name ("layer.0.attn.qkv.w", "embed.wte.grad"):
 * host-visible fp32 data on the CPU backend; *numel gets its size. NULL when absent. */
float *exec_tensor(Exec *ex, const char *name, uint64_t *numel);
/* The table's tensors, for iterating over parameters. */
const ModelTensorTable *exec_table(const Exec *ex);

/* Measured memory: the bytes each category's arena holds (allocated at init, never grown);
 * runtime is the profile's allowance, not a measurement. */
void exec_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT]);
/* The activation bytes the steps run so far held at once (live sets times their bytes): equal
 * to the activation arena when the schedule used every slot it was sized for. */
uint64_t exec_activations_in_use_peak(const Exec *ex);
/* FLOPs counted from the kernel calls of the last step. */
double exec_step_flops(const Exec *ex);
/* Counted FLOPs not attributed to any op of the graph (0 unless the executor is broken). */
double exec_unattributed_flops(const Exec *ex);

typedef struct {
    const char *name; /* op-graph full name */
    double calls, seconds, flops; /* per step: calls and FLOPs of the last step, seconds averaged */
} ExecOpReport;
/* Per-op measurements; *n gets the count (every compute op of the stage's graph). */
const ExecOpReport *exec_ops(Exec *ex, int *n);

/* The run's JSON (DESIGN.md's Run). Caller frees with cJSON_Delete. */
cJSON *exec_run_to_json(Exec *ex);

/* ---- plans without the planner ---- */

/* A plan for spec on a cluster profile with `gpus` ranks, its prediction from sim_run. */
int exec_plan_make(const ModelSpec *spec, const char *cluster, int gpus, ModelPlan *out,
                   PxError *err);

/* ---- layout-independent initialization and data ---- */

/* A standard normal draw for element `index` of the full (unsharded) parameter `name`: a
 * counter-based generator keyed by (seed, name), so any sharding draws the same values. */
double exec_init_normal(uint64_t seed, const char *name, uint64_t index);

/* The built-in training text: deterministic English-like sentences from a small grammar,
 * written into buf (bytes, no terminator). Returns the bytes written (= cap). */
size_t exec_text_generate(char *buf, size_t cap);

/* llm.c's token file: a header of 256 int32 (magic, version 1, token count), then uint16
 * tokens. */
enum { EXEC_BIN_MAGIC = 20240520, EXEC_BIN_VERSION = 1, EXEC_BIN_HEADER_INTS = 256 };

#endif
