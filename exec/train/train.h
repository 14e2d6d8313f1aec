/* train — the trainer of parallax's executor: it trains a plan for real on this rank and
 * measures it under the simulator's names.
 *
 * model/ describes a (model, layout, stage) as a tensor table and an op graph; the trainer
 * allocates and runs them. Every tensor it touches is carved from one arena per memory category
 * following the tensor table, bound to its views by role (saved activations from pools of the
 * schedule's live sets, as model_activation_bytes counts them), so measured memory per category
 * equals the plan's prediction; every op is timed under its op-graph name ("layer.3.attn.qkv.fwd")
 * and its FLOPs are counted from the kernel calls actually made, so counted FLOPs equal the
 * prediction's too. Compute goes through kernels.h: the CPU backend in fp32, or the CUDA backend
 * in bf16 or fp16 with fp32 master weights, gradients and optimizer state (and dynamic loss
 * scaling for fp16, as PyTorch's GradScaler); communication through exec/comm, which makes
 * exactly the calls the op graph lists, with its buffer sizes, so that bytes per kind equal the
 * prediction too. The prediction is the plan's own (exec/ never runs the simulator).
 *
 * Parallel layouts: data parallelism with ZeRO 0-3, Megatron's tensor parallelism with
 * vocabulary-parallel embedding and cross-entropy, sequence parallelism, pipeline parallelism
 * (GPipe, 1F1B, interleaved 1F1B, in model_schedule_build's order) and context parallelism
 * (the ring, the all-gather, Ulysses), in any combination.
 *
 * Training semantics, independent of the layout so that a sharded run can reproduce a
 * single-rank one: weights are a function of (seed, the full parameter's name, the element's
 * index in the full tensor); the global batch of step k is the same sequences whatever dp and
 * micro-batch size; the loss is the mean over every token of the global batch; dropout streams
 * are seeded per (seed, step, global sequence, layer, site), so recompute redraws the same
 * masks. docs/executor.md has the details; docs/architecture.md which file holds what.
 *
 * Example (what parallax-worker does, per rank):
 *   ModelPlan plan;
 *   PxError err = {0};
 *   ExecOptions opt;
 *   exec_options_defaults(&opt);
 *   opt.steps = 60;
 *   opt.output = "run.json";                                  // rank 0 writes it
 *   opt.comm = comm;                                          // exec/comm; NULL: one rank
 *   Exec *ex = NULL;
 *   if (model_plan_read("plan.json", &plan, &err) || exec_init(&ex, &plan, &opt, &err) ||
 *       exec_run(ex, &err))
 *       fprintf(stderr, "parallax-worker: %s\n", err.msg);   // status 2: bad input, 1: runtime
 *   exec_free(ex);
 *   model_plan_free(&plan);
 */
#ifndef EXEC_TRAIN_H
#define EXEC_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

typedef struct CommLayer CommLayer; /* exec/comm/comm.h */

/* ---- options (options.c: px_train_options, which the front end links without the trainer) ---- */

/* Where the kernels run. AUTO follows the plan's cluster profile: a GPU device -> CUDA, cpu ->
 * CPU. */
typedef enum { EXEC_BACKEND_AUTO = 0, EXEC_BACKEND_CPU, EXEC_BACKEND_CUDA } ExecBackend;

/* "auto", "cpu" or "cuda"; PX_EINPUT naming the value otherwise. */
int exec_backend_parse(const char *name, ExecBackend *out, PxError *err);
const char *exec_backend_name(ExecBackend b);
/* The backend `override` resolves to for a plan (AUTO: by the device of its profile). */
int exec_backend_for_plan(const ModelPlan *plan, ExecBackend override, ExecBackend *out,
                          PxError *err);

typedef struct {
    int steps;           /* 0: the plan's training.steps */
    const char *output;  /* run.json path; NULL: none */
    const char *metrics; /* JSON-lines log, one line per step, flushed; NULL: none */
    const char *data;    /* overrides training.data; NULL: the plan's */
    const char *plan_path; /* for messages and run.json */
    int quiet;           /* no progress lines (tests) */
    int prefetch;        /* 1: a loader thread reads the next batch during the step (default) */
    CommLayer *comm;     /* the job's communication layer (not owned); NULL: one rank */
    ExecBackend backend; /* AUTO (default): by the plan's device */
    double loss_scale;   /* fp16: the initial loss scale; 0: 65536 (PyTorch's GradScaler) */
    int loss_scale_interval; /* fp16: clean steps before the scale doubles; 0: 2000 */
    const char *comm_note;   /* said after the comm layer's name in the header (why this one) */
    int step_timing;         /* 1: the device is waited for once per step, not at every op's
                                start and end (op timing, the default, costs a GPU a few percent
                                of its step time); ops keep their calls and FLOPs, not seconds */
    /* ---- failures (docs/executor.md, "Failures") ---- */
    double comm_timeout_s; /* a communication wait longer than this ends the job; 0: none
                              (default EXEC_COMM_TIMEOUT_S) */
    int fail_rank, fail_step; /* fail_step >= 1: world rank fail_rank kills itself (SIGKILL) at
                                 the start of that step, as a lost node would (tests) */
    /* ---- checkpoints (exec/checkpoint; docs/executor.md#checkpoints) ---- */
    const char *checkpoint_dir; /* where checkpoints are written and resumed from; NULL: none */
    int checkpoint_every;       /* a checkpoint every N steps; 0: none (with resume: the
                                   checkpoint's own interval) */
    int resume;                 /* continue from the latest complete checkpoint in the dir */
} ExecOptions;

enum { EXEC_COMM_TIMEOUT_S = 600 };

void exec_options_defaults(ExecOptions *o);
/* The run options (--steps, -o, --metrics ... --timing), one table that `parallax run` and
 * `parallax-worker run` both parse with and print in --help: the front end checks the user's
 * options with it and hands them to the worker as given, keeping only its launcher's own.
 *   ExecRunArgs a;
 *   exec_run_args_init(&a);
 *   const PxOption *const tables[] = {exec_run_options, NULL};
 *   int rc = px_opts_parse(tables, argc, argv, see, exec_run_option, &a, 1, &first, &err);
 *   if (!rc)
 *       rc = exec_run_args_check(&a, &err);     // then a.opt is the trainer's options
 * Its ids are below EXEC_RUN_OPTION_IDS, so a program may add options of its own above. */
extern const PxOption exec_run_options[];
enum { EXEC_RUN_OPTION_IDS = 32 };

typedef struct {
    ExecOptions opt;
    /* the failure options as given (NULL: not), checked together */
    const char *comm_timeout, *fail_rank, *fail_step;
    char metrics[512]; /* the metrics log's default name, beside opt.output */
} ExecRunArgs;

/* The defaults (exec_options_defaults, run.json for -o). */
void exec_run_args_init(ExecRunArgs *a);
/* One option of exec_run_options into a (an ExecRunArgs; a PxOptFn): PX_EINPUT naming the
 * option and the value. */
int exec_run_option(void *a, int id, const char *arg, PxError *err);
/* The options together, once parsed: --comm-timeout seconds from 0 (no limit) to 1e7;
 * --fail-rank R >= 0 and --fail-step K >= 1, both or neither; --checkpoint-every and --resume
 * need --checkpoint-dir, which needs one of them. Then the metrics log beside -o when --metrics
 * is not given. PX_EINPUT naming the flags; R against the job's world is the caller's check
 * (exec_init's, and `parallax run`'s against the plan). */
int exec_run_args_check(ExecRunArgs *a, PxError *err);

/* ---- the trainer ---- */

typedef struct Exec Exec;

/* Checks that the plan can run on this job (the world of opt->comm equals the layout's ranks,
 * fp32 on the CPU, a supported optimizer, what model_exec_refusal runs), places
 * this rank in the grid (its stage, TP, DP and ZeRO shard), opens the data when its stage
 * reads tokens, allocates every tensor of its stage's table through the category arenas and
 * initializes its shard of the weights. No communication: a rank may fail here alone. PX_EINPUT names the
 * plan setting or the data file at fault; nothing is left allocated on failure (*out NULL).
 * With opt->checkpoint_dir it checks the directory, and with opt->resume loads this rank's
 * shard of the latest complete checkpoint over the initial state (PX_EINPUT naming the file
 * and the key or check at fault); exec_run then starts at the checkpoint's step. */
int exec_init(Exec **out, const ModelPlan *plan, const ExecOptions *opt, PxError *err);
void exec_free(Exec *ex);

/* Runs the training steps: progress lines, the metrics log, a predicted-against-measured
 * summary, and run.json (atomically) at the end, or after SIGINT/SIGTERM at a step boundary
 * (every rank stops at the same one). With several ranks it is collective: rank 0 prints and
 * writes what every rank measured. With checkpoints, one after every checkpoint_every-th step
 * (a failure to write it ends the run with PX_ERUNTIME on every rank, the previous one kept). */
int exec_run(Exec *ex, PxError *err);

typedef struct {
    int step;         /* 1-based */
    double loss;      /* mean over every token of the global batch, before the update */
    double mtp_loss;  /* the prediction modules' mean loss, each over its targets (0: none) */
    double lr;
    double grad_norm; /* global norm before clipping */
    double time_s;
    double tokens_per_s;
    int skipped;       /* fp16: the gradients overflowed, no update was made */
    double loss_scale; /* the loss scale the step ran with (1 unless fp16) */
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
/* This rank's share of the MoE load-balancing loss of the last step or passes (0 without MoE
 * layers or with a coefficient of 0): the gradients hold its derivative beside the language
 * model's, which is the loss reported. On one rank the whole. */
double exec_aux_loss(const Exec *ex);
/* Megatron-Core's --mtp-loss-scaling-factor default: the objective adds this times the
 * multi-token prediction modules' mean loss (exec_mtp_loss) to the language model's. */
#define EXEC_MTP_LOSS_SCALE 0.1
/* This rank's share of the prediction modules' mean loss of the last step or passes (0 without
 * modules): each module's mean over its targets, averaged over the modules; on one rank the
 * whole. */
double exec_mtp_loss(const Exec *ex);

/* ---- what it holds and measured ---- */

/* A weight or gradient tensor by its table name ("layer.0.attn.qkv.w", "embed.wte.grad"):
 * host-visible fp32 data on the CPU backend; *numel gets its size. NULL when absent, or on
 * another backend (use exec_tensor_read). */
float *exec_tensor(Exec *ex, const char *name, uint64_t *numel);
/* The same tensor copied into out (fp32, cap elements) on any backend: act weights are widened
 * exactly. PX_ERUNTIME when absent, held only as shards (ZeRO-3 weights, ZeRO-2/3 gradients) or
 * larger than cap (*numel: its size). */
int exec_tensor_read(Exec *ex, const char *name, float *out, uint64_t cap, uint64_t *numel);
/* The table's tensors, for iterating over parameters. */
const ModelTensorTable *exec_table(const Exec *ex);
/* The stage's op graph, and the spec and dims the trainer runs (normalised). */
const ModelOpGraph *exec_graph(const Exec *ex);
const ModelSpec *exec_spec(const Exec *ex);
const ModelDims *exec_dims(const Exec *ex);
/* The batch of step `step` on this rank (m * b sequences of seq + 1 tokens, host memory):
 * the step's inputs and targets, as the trainer reads them. */
int exec_batch(Exec *ex, long step, const int32_t **batch, PxError *err);

/* Measured memory: the bytes each category's arena holds (allocated at init, never grown),
 * plus the MoE buffers dropless routing grew past the plan (docs/moe.md, "Dropless routing");
 * runtime is the profile's allowance, not a measurement. */
void exec_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT]);
/* Optimizer offload (docs/memory.md, "Offload"): 0 without it; else 1 with the host bytes per
 * category (master and optimizer: their arenas, which exec_memory counts as 0 on the device;
 * grads: the gradient shards copied out each step, in the gradient dtype), the host's fp32
 * copy of the weight shards the host step updates when the job has no master (*weights; 0
 * with one), and the seconds spent copying and stepping on the host. */
typedef struct {
    double d2h_s, h2d_s, host_step_s; /* summed over the run's updates */
    long steps;                       /* updates made on the host */
} ExecOffloadTimes;
int exec_host_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT], uint64_t *weights,
                     ExecOffloadTimes *t);
/* The device's own account (cudaMemGetInfo: total less free), sampled before the arenas, after
 * them and after every step: 0 where the backend has no device memory (the CPU), else 1 with
 * the bytes in use before the arenas, at the peak, and the device's total. */
int exec_device_memory(const Exec *ex, uint64_t *used_start, uint64_t *used_peak,
                       uint64_t *total);
/* fp16 loss scaling: the current scale and the steps skipped so far. */
double exec_loss_scale(const Exec *ex, long *skipped);
/* The activation bytes the steps run so far held at once (live sets times their bytes): equal
 * to the activation arena when the schedule used every slot it was sized for. */
uint64_t exec_activations_in_use_peak(const Exec *ex);
/* FLOPs counted from the kernel calls of the last step. */
double exec_step_flops(const Exec *ex);
/* Counted FLOPs not attributed to any op of the graph (0 unless the trainer is broken). */
double exec_unattributed_flops(const Exec *ex);

typedef struct {
    const char *name; /* op-graph full name */
    double calls, seconds, flops; /* per step: calls and FLOPs of the last step, seconds averaged */
} ExecOpReport;
/* Per-op measurements; *n gets the count (every op of the stage's graph, in graph order). */
const ExecOpReport *exec_ops(Exec *ex, int *n);

/* The run's JSON (docs/formats.md's Run) from this rank's figures. Caller frees with
 * cJSON_Delete. */
cJSON *exec_run_to_json(Exec *ex);
/* The same from every rank's figures: collective (every rank calls it); rank 0 gets the run in
 * *out, the others NULL. */
int exec_run_gather_json(Exec *ex, cJSON **out, PxError *err);

/* 1 when the last error was seen by every rank alike (a diverged loss, an agreed stop, a
 * checkpoint not written): the job can end normally; 0 when only this rank failed and the
 * job must be aborted. */
int exec_error_is_collective(const Exec *ex);

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
