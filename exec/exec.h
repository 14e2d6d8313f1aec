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
 * kernels.h: the CPU backend in fp32, or the CUDA backend in bf16 or fp16 with fp32 master
 * weights, gradients and optimizer state (and dynamic loss scaling for fp16, as PyTorch's
 * GradScaler); communication through exec/comm/comm.h's layer (one rank; MPI; NCCL between
 * GPUs, bootstrapped through MPI; or MPI staged through host memory when ranks share a GPU),
 * which makes exactly the communication calls the op graph lists, with its buffer sizes, so
 * that bytes per kind equal the prediction too.
 *
 * Parallel layouts: data parallelism with ZeRO 0-3, Megatron's tensor parallelism with
 * vocabulary-parallel embedding and cross-entropy, sequence parallelism, and pipeline
 * parallelism (GPipe, 1F1B, interleaved 1F1B, in model_schedule_build's order), in any
 * combination; context parallelism is refused.
 *
 * Training semantics, independent of the layout so that a sharded run can reproduce a
 * single-rank one: weights are a function of (seed, the full parameter's name, the element's
 * index in the full tensor); the global batch of step k is the same sequences whatever dp and
 * micro-batch size; the loss is the mean over every token of the global batch; dropout streams
 * are seeded per (seed, step, global sequence, layer, site), so recompute redraws the same
 * masks. docs/executor.md has the details.
 *
 * Example (what parallax-worker does, per rank):
 *   int rank, world;
 *   int mpi = comm_mpi_start(&argc, &argv, &rank, &world);   // under mpirun / srun
 *   ModelPlan plan;
 *   PxError err = {0};
 *   ExecOptions opt;
 *   exec_options_defaults(&opt);
 *   opt.steps = 60;
 *   opt.output = "run.json";                                  // rank 0 writes it
 *   CommLayer *comm = NULL;                                   // exec/comm/comm.h
 *   Exec *ex = NULL;
 *   if (model_plan_read("plan.json", &plan, &err) ||
 *       (world > 1 && comm_mpi(&plan.spec.layout, 1, &comm, &err)) ||
 *       ((opt.comm = comm), exec_init(&ex, &plan, &opt, &err)) || exec_run(ex, &err))
 *       fprintf(stderr, "parallax-worker: %s\n", err.msg);   // status 2: bad input, 1: runtime
 *   exec_free(ex);
 *   comm_free(comm);
 *   model_plan_free(&plan);
 *   if (mpi) comm_mpi_finish();
 */
#ifndef EXEC_H
#define EXEC_H

#include <stdint.h>
#include <stdio.h>

#include "exec/launch/launch.h"
#include "model/model.h"

/* The communication layer (exec/comm/comm.h), which the executor is handed or makes. */
typedef struct CommLayer CommLayer;

/* ---- the executor ---- */

/* Where the kernels run. AUTO follows the plan's cluster: a GPU device -> CUDA, cpu -> CPU. */
typedef enum { EXEC_BACKEND_AUTO = 0, EXEC_BACKEND_CPU, EXEC_BACKEND_CUDA } ExecBackend;

/* "auto", "cpu" or "cuda"; PX_EINPUT naming the value otherwise. */
int exec_backend_parse(const char *name, ExecBackend *out, PxError *err);
const char *exec_backend_name(ExecBackend b);
/* The backend `override` resolves to for a plan (AUTO: by the device of the plan's cluster
 * profile). */
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
    /* ---- failures (docs/executor.md, "Failures") ---- */
    double comm_timeout_s; /* a communication wait longer than this ends the job; 0: none
                              (default EXEC_COMM_TIMEOUT_S) */
    int fail_rank, fail_step; /* fail_step >= 1: world rank fail_rank kills itself (SIGKILL) at
                                 the start of that step, as a lost node would (tests) */

    /* checkpoints (exec/checkpoint.c; docs/executor.md#checkpoints) */
    const char *checkpoint_dir; /* where checkpoints are written and resumed from; NULL: none */
    int checkpoint_every;       /* a checkpoint every N steps; 0: none (with resume: the
                                   checkpoint's own interval) */
    int resume;                 /* continue from the latest complete checkpoint in the dir */
} ExecOptions;

enum { EXEC_COMM_TIMEOUT_S = 600 };

/* The failure options as given on a command line (NULL: not given) into o: --comm-timeout
 * seconds from 0 (no limit) to 1e7; --fail-rank R >= 0 and --fail-step K >= 1, both or neither.
 * PX_EINPUT naming the flag; R against the job's world is exec_init's check. */
int exec_failure_parse(const char *comm_timeout, const char *fail_rank, const char *fail_step,
                       ExecOptions *o, PxError *err);

void exec_options_defaults(ExecOptions *o);

typedef struct Exec Exec;

/* Checks that the plan can run on this job (the world of opt->comm equals the layout's ranks,
 * fp32 on the CPU, a supported optimizer, no context parallelism), places this rank in the
 * grid (its stage, TP, DP and ZeRO shard), opens the data when its stage reads tokens,
 * allocates every tensor of its stage's table through the category arenas and initializes its
 * shard of the weights. No communication: a rank may fail here alone. PX_EINPUT names the
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

/* Measured memory: the bytes each category's arena holds (allocated at init, never grown);
 * runtime is the profile's allowance, not a measurement. */
void exec_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT]);
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
/* Counted FLOPs not attributed to any op of the graph (0 unless the executor is broken). */
double exec_unattributed_flops(const Exec *ex);

typedef struct {
    const char *name; /* op-graph full name */
    double calls, seconds, flops; /* per step: calls and FLOPs of the last step, seconds averaged */
} ExecOpReport;
/* Per-op measurements; *n gets the count (every compute op of the stage's graph). */
const ExecOpReport *exec_ops(Exec *ex, int *n);

/* The run's JSON (DESIGN.md's Run) from this rank's figures. Caller frees with cJSON_Delete. */
cJSON *exec_run_to_json(Exec *ex);
/* The same from every rank's figures: collective (every rank calls it); rank 0 gets the run in
 * *out, the others NULL. */
int exec_run_gather_json(Exec *ex, cJSON **out, PxError *err);

/* This rank's pipeline stage and communication layer. */
int exec_stage(const Exec *ex);
const CommLayer *exec_comm(const Exec *ex);
/* 1 when the last error was seen by every rank alike (a diverged loss, an agreed stop): the
 * job can end normally; 0 when only this rank failed and the job must be aborted. */
int exec_error_is_collective(const Exec *ex);

/* ---- calibration (calibrate.c, calibrate_job.c) ---- */

/* `parallax-worker calibrate ...` on this rank of `world` (argv[0] is "calibrate"): one part of
 * a calibration, the exit status (0, 1 runtime, 2 bad input). */
int exec_calibrate_main(int argc, char **argv, int rank, int world);

typedef struct {
    const char *output;  /* the profile to write; NULL: prof_calibrated_path's */
    int ranks;           /* the most ranks at once, and the collectives' world; 0: the cores */
    const char *models;  /* calibration models, comma-separated; NULL: "tiny,tiny-llama" */
    const char *base;    /* the cluster profile the measurements extend; NULL: "local" */
    const char *backend; /* "cpu" or "cuda"; NULL: "cpu" */
    int quick;           /* fewer shapes, sizes and repetitions: a rough profile in seconds */
    int quiet;
    LaunchKind launcher;
} ExecCalibrateJob;

/* `parallax calibrate`: runs the worker's compute part on 1, 2, 4, ... up to j->ranks ranks at
 * once, the comm part on j->ranks ranks, then assembles the profile (a temporary folder holds
 * the parts; it is removed on success, kept and named on failure). *exit_status gets the
 * failing part's status; PX_EINPUT / PX_ERUNTIME as launch_worker. */
int exec_calibrate_job(const ExecCalibrateJob *j, int *exit_status, PxError *err);

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
