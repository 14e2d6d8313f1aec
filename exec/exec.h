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
 * GradScaler); communication through an ExecComm table of functions (one rank; MPI; NCCL
 * between GPUs, bootstrapped through MPI; or MPI staged through host memory when ranks share a
 * GPU), which makes exactly the communication calls the op graph lists, with its buffer sizes,
 * so that bytes per kind equal the prediction too.
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
 *   int mpi = exec_mpi_start(&argc, &argv, &rank, &world);   // under mpirun / srun
 *   ModelPlan plan;
 *   PxError err = {0};
 *   ExecOptions opt;
 *   exec_options_defaults(&opt);
 *   opt.steps = 60;
 *   opt.output = "run.json";                                  // rank 0 writes it
 *   ExecComm *comm = NULL;
 *   Exec *ex = NULL;
 *   if (model_plan_read("plan.json", &plan, &err) ||
 *       (world > 1 && exec_comm_mpi(&plan.spec.layout, 1, &comm, &err)) ||
 *       ((opt.comm = comm), exec_init(&ex, &plan, &opt, &err)) || exec_run(ex, &err))
 *       fprintf(stderr, "parallax-worker: %s\n", err.msg);   // status 2: bad input, 1: runtime
 *   exec_free(ex);
 *   if (comm) comm->free(comm);
 *   model_plan_free(&plan);
 *   if (mpi) exec_mpi_finish();
 */
#ifndef EXEC_H
#define EXEC_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "exec/train/train.h"

/* ---- communication layer ---- */

/* One rank's view of the job's process groups (DESIGN.md's rank order, model_rank): tp, cp,
 * dp x cp (gradients and ZeRO shards: model_comm_group's MODEL_GROUP_DP), the pipeline (point
 * to point with world ranks) and the tied-embedding pair (first and last stage). Every call
 * names its communication kind (DESIGN.md's names), which selects the group and the counter:
 * a call's bytes are its buffer size S (nccl-tests' size: the whole buffer of an all-reduce,
 * the gathered output of an all-gather, the input of a reduce-scatter, the message of a send
 * or receive), and a call over a group of one rank is no communication: it moves and counts
 * nothing, as the op graph lists no op for it. Scalar reductions (loss, gradient norm, the
 * stop flag) are control traffic over the world and are not counted.
 *
 * Calls with req == NULL block; with req they start a non-blocking operation and put its
 * handle in *req for wait (the buffers belong to the operation until then). Every function
 * returns PX_OK or a status with err filled. exec_comm_single() is the one-rank table;
 * exec_comm_mpi() (comm_mpi.c) the MPI one. */
typedef enum { EXEC_SUM = 0, EXEC_MAX } ExecRedOp;

typedef struct CommLayer ExecComm;
struct CommLayer {
    const char *name; /* "single", "mpi" */
    int rank, world;
    int group_size[5]; /* ranks in this rank's group, by ModelGroup */
    int group_rank[5]; /* this rank's place in each group (dp: the ZeRO shard it owns) */
    uint64_t bytes[MODEL_COMM_COUNT]; /* since creation, by kind */
    uint64_t calls[MODEL_COMM_COUNT];
    /* in-place reduction of count elements over the kind's group */
    int (*allreduce)(ExecComm *c, void *buf, size_t count, PxDtype dtype, ExecRedOp op, int kind,
                     int *req, PxError *err);
    /* out holds group_size * count elements, this rank's count at its place; in is this rank's
     * count (it may be out's own part) */
    int (*all_gather)(ExecComm *c, void *out, const void *in, size_t count, PxDtype dtype,
                      int kind, int *req, PxError *err);
    /* in holds group_size * count elements; out gets this rank's summed count. out == in is
     * in place: the sum lands at the start of in. */
    int (*reduce_scatter)(ExecComm *c, void *out, const void *in, size_t count, PxDtype dtype,
                          int kind, int *req, PxError *err);
    /* ZeRO on a block that memory holds unpadded: numel elements cut into shards of `shard`
     * (= ceil(numel / group)); the group's last ranks own fewer elements, or none. Counted as
     * the padded buffer of group * shard elements, as the op graph lists it. In place:
     * reduce_scatter_shard leaves this rank's summed shard at its own offset (the rest of buf
     * is undefined), all_gather_shard fills every shard from its owner. */
    int (*reduce_scatter_shard)(ExecComm *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                                int kind, int *req, PxError *err);
    int (*all_gather_shard)(ExecComm *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                            int kind, int *req, PxError *err);
    /* point to point with a world rank; messages of one (peer, tag) arrive in order */
    int (*send)(ExecComm *c, const void *buf, size_t bytes, int peer, int tag, int kind, int *req,
                PxError *err);
    int (*recv)(ExecComm *c, void *buf, size_t bytes, int peer, int tag, int kind, int *req,
                PxError *err);
    /* completes *req (then -1); a handle of -1 is already complete */
    int (*wait)(ExecComm *c, int *req, PxError *err);
    /* lets pending non-blocking operations advance (MPI progresses only inside its calls) */
    void (*progress)(ExecComm *c);
    /* control traffic over the world, not counted: an in-place sum or maximum of n doubles */
    int (*control)(ExecComm *c, double *vals, int n, ExecRedOp op, PxError *err);
    /* rank 0 gets every rank's text (out[r], malloc'ed, caller frees each and the array);
     * the others get *out = NULL */
    int (*gather_text)(ExecComm *c, const char *text, char ***out, PxError *err);
    int (*barrier)(ExecComm *c, PxError *err);
    void (*free)(ExecComm *c);
    /* Device memory the calls may name: the executor attaches each arena it communicates from
     * (the staged layer mirrors it in host memory). NULL: the layer takes any pointer. */
    int (*attach)(ExecComm *c, void *base, size_t bytes, PxError *err);

    /* ---- failures: no rank waits forever ----
     * A wait of the MPI layer (a blocking call, a wait, the control reduction, the barrier, the
     * final gather) longer than timeout_s prints "rank R: step K: <op> on the <group> group did
     * not complete within S s" and ends the job (MPI_Abort). 0: no limit. step: the step the
     * rank is in (1-based; 0 before the first), for that message. The executor sets both. */
    double timeout_s;
    int step;
};

/* The communication layer of a job with one rank: every group has size 1. Caller frees with
 * c->free(c). NULL when out of memory. */
ExecComm *exec_comm_single(void);

struct KernBackend; /* kernels/kernels.h */

/* The MPI layer `inner` (taken over: freed with the result) for buffers in device memory: every
 * call copies its inputs from the device into host mirrors of the attached memory, runs the MPI
 * call there and copies its outputs back when it completes (a non-blocking one at its wait).
 * For ranks that share a GPU, where NCCL cannot run. k: the kernels whose memory it mirrors. */
int exec_comm_staged(ExecComm *inner, const struct KernBackend *k, ExecComm **out, PxError *err);

/* ---- NCCL (comm_nccl.c; built with CUDA and NCCL, stubs otherwise) ---- */

/* 1 when this build has the NCCL communication layer. */
int exec_nccl_available(void);
/* The NCCL table for a layout, over the world of MPI (which must be running): the same groups as
 * exec_comm_mpi, one NCCL communicator each, its unique id broadcast over the group's MPI
 * communicator; collectives on the layer's own stream, ordered after the compute stream's work
 * by events, so that a non-blocking reduction overlaps the backward; pipeline messages on one
 * NCCL communicator per direction of each pair of stages. The rank's GPU must be current
 * (kern_cuda_set_device) and the CUDA backend bound. PX_EINPUT without NCCL. */
int exec_comm_nccl(const ModelLayout *l, int tied_pair, ExecComm **out, PxError *err);
/* This rank's place on its node (MPI's shared-memory split): *local_rank of *local_size; 0 and
 * 1 without MPI. */
void exec_mpi_local(int *local_rank, int *local_size);

/* How every process group is split out of the world for `rank` of layout l (MPI_Comm_split's
 * color and key), for the TP, CP, DP and EMBED groups in that order; color is `undefined`
 * (MPI_UNDEFINED) where the rank belongs to no such group (EMBED off the first and last
 * stages, or without a tied pair). The MPI and NCCL layers both split by it, so their groups
 * agree. */
typedef struct {
    ModelGroup group;
    int color, key;
} ExecGroupSplit;
void exec_group_splits(const ModelLayout *l, int rank, int tied_pair, int undefined,
                       ExecGroupSplit split[4]);

/* ---- MPI (comm_mpi.c; stubs when parallax was built without MPI) ---- */

/* 1 when this build has the MPI communication layer. */
int exec_mpi_available(void);
/* Starts MPI when this process was launched as one rank of an MPI job (mpirun, srun or any
 * launcher that sets the PMI/PMIx environment, or PARALLAX_MPI=1): returns 1 with *rank and
 * *world filled; 0 when it runs alone (no launcher, or a build without MPI). */
int exec_mpi_start(int *argc, char ***argv, int *rank, int *world);
/* Ends every rank of the job with `code` (MPI_Abort); no return. Without MPI it returns. */
void exec_mpi_abort(int code);
void exec_mpi_finish(void);
/* An MPI (status, rank, message) agreement without a comm table: every rank passes its
 * status; all get the worst one and the lowest rank that had it. For errors found before
 * the groups exist (a plan one rank cannot read). */
int exec_mpi_agree(int status, int *first_rank);
/* The MPI table for a layout: the world must hold tp*cp*dp*pp ranks (PX_EINPUT otherwise,
 * naming both). tied_pair: the first and last stage share a tied embedding (an embedding
 * group of 2). PX_EINPUT without MPI. */
int exec_comm_mpi(const ModelLayout *l, int tied_pair, ExecComm **out, PxError *err);

/* ---- starting the worker (launch.c: no MPI library needed, only the launcher) ---- */

typedef enum {
    EXEC_LAUNCH_DEFAULT = 0, /* one rank: none; several: srun under Slurm, else mpirun */
    EXEC_LAUNCH_NONE,        /* the worker directly (a job that is already one rank of a launch) */
    EXEC_LAUNCH_MPIRUN,
    EXEC_LAUNCH_SRUN
} ExecLauncher;

typedef struct {
    ExecLauncher launcher;
    int ranks;        /* processes to start */
    const char *what; /* names the job in messages: the plan's path, "calibrate" */
} ExecLaunch;

/* "mpirun", "srun" or "none"; PX_EINPUT naming the value otherwise. */
int exec_launcher_parse(const char *name, ExecLauncher *out, PxError *err);
/* parallax-worker beside this executable, into out; PX_ERUNTIME when it is missing. */
int exec_worker_path(char *out, size_t cap, PxError *err);
/* Runs parallax-worker with args (NULL-terminated, after the program name) on l->ranks
 * processes, waiting for it with SIGINT / SIGTERM ignored here (the worker gets them and stops
 * at a step boundary). *exit_status gets the worker's (or launcher's) exit status. PX_EINPUT:
 * a Slurm allocation too small; PX_ERUNTIME: no worker, no launcher on PATH, or the job died
 * from a signal. mpirun gets --oversubscribe --bind-to none when the ranks outnumber the cores,
 * and --allow-run-as-root for root. */
int exec_launch(const ExecLaunch *l, const char *const *args, int *exit_status, PxError *err);

#endif
