/* comm — the executor's communication layer: one rank's view of the job's process groups, the
 * collectives and messages the op graph lists, and their bytes counted as the graph counts them.
 *
 * Backends, behind the same calls: the one-rank layer (comm_single); MPI (comm_mpi); NCCL
 * between GPUs, bootstrapped through MPI (comm_nccl); MPI staged through host memory for
 * buffers in device memory when ranks share a GPU (comm_staged). comm_for_job picks the one a
 * multi-rank job uses. The MPI process itself (start, agreement, abort, finish) is here too.
 *
 * Groups (Megatron-Core's rank order, model_rank): tp, cp, dp x cp (gradients and ZeRO shards:
 * model_comm_group's MODEL_GROUP_DP), the pipeline (point to point with world ranks), the
 * tied-embedding pair (first and last stage), and the expert groups of a MoE layout
 * (model_expert_coords: ep, etp and the expert-data-parallel ranks that replicate experts). Every call names its communication kind
 * (docs/formats.md's names), which selects the group and the counter.
 *
 * Counting, the same for every backend: a call's bytes are its buffer size S (nccl-tests' size:
 * the whole buffer of an all-reduce, the gathered output of an all-gather, the input of a
 * reduce-scatter, the padded group * shard buffer of the sharded calls, the message of a send or
 * receive), one call and S bytes for its kind; a receive under a kind that is a send
 * (MODEL_CP_P2P: the ring counts what each rank sends) counts nothing. A collective over a group of one rank is no
 * communication: it moves and counts nothing, as the op graph lists no op for it (an all-gather
 * or reduce-scatter whose out is not in still copies this rank's part, through the layer's own
 * copy: device memory stays on the device); a send or receive there has no peer and fails. The
 * world-wide calls (control, gather_text, barrier) are not counted: scalar reductions (loss,
 * gradient norm, the stop flag) are control traffic (docs/formats.md).
 *
 * Calls with req == NULL block; with req they start a non-blocking operation and put its handle
 * in *req for comm_wait (the buffers belong to the operation until then), or -1 when there was
 * nothing to start. Every function returning int returns PX_OK or a status with err filled.
 *
 * Failures: no rank waits forever. A wait of the MPI layer (a blocking call, a wait, the control
 * reduction, the barrier, the final gather; the NCCL and staged layers wait through it) longer
 * than the layer's timeout prints "rank R: step K: <op> on the <group> group did not complete
 * within S s" and ends the job (MPI_Abort).
 *
 * Example (one rank of a data-parallel job: a gradient all-reduce beside the backward):
 *   int rank, world;
 *   int mpi = comm_mpi_start(&argc, &argv, &rank, &world);   // under mpirun / srun
 *   PxError err = {0};
 *   CommLayer *c = NULL;
 *   int rc = world > 1 ? comm_mpi(&spec.layout, 0, &c, &err)   // spec: the plan's ModelSpec
 *                      : (c = comm_single()) ? PX_OK : PX_ERUNTIME;
 *   if (rc) ...                                              // err.msg says why
 *   comm_set_timeout(c, 600);
 *   int req;
 *   comm_allreduce(c, grads, n, PX_FP32, COMM_SUM, MODEL_DP_ALLREDUCE, &req, &err);
 *   ...                                                      // more of the backward
 *   comm_wait(c, &req, &err);                                // grads hold the sum
 *   printf("%llu bytes\n", (unsigned long long)comm_bytes(c, MODEL_DP_ALLREDUCE)); // 4n (dp > 1)
 *   comm_free(c);
 *   if (mpi) comm_mpi_finish();
 */
#ifndef COMM_H
#define COMM_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

typedef struct KernBackend KernBackend; /* kernels/kernels.h */

typedef enum { COMM_SUM = 0, COMM_MAX } CommRedOp;

typedef struct CommLayer CommLayer; /* opaque outside exec/comm */

/* ---- making a layer ---- */

/* The layer of a job with one rank: every group has size 1. NULL when out of memory. */
CommLayer *comm_single(void);

/* The MPI layer for a layout (MPI must be running: comm_mpi_start): the world must hold
 * tp*cp*dp*pp ranks (PX_EINPUT otherwise, naming both). tied_pair: 1, the first stage and
 * the one holding a copy of the embedding (the last: a tied output layer or the prediction
 * modules' mtp.wte; or the modules' own stage) share it (an embedding group of 2); 2, a tied
 * model whose modules sit on a stage of their own after the first: the first, that stage and
 * the last (a group of 3). PX_EINPUT in a build without MPI. */
int comm_mpi(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err);

/* The NCCL layer for a layout, over the world of MPI (which must be running): the groups of
 * comm_mpi, one NCCL communicator each, its unique id broadcast over the group's MPI
 * communicator; collectives on the layer's own stream, ordered after the compute stream's work
 * by events, so that a non-blocking reduction overlaps the backward; pipeline messages on one
 * NCCL communicator per direction of each pair of stages. Buffers are in device memory. The
 * rank's GPU must be current (kern_cuda_set_device) and the CUDA backend bound. PX_EINPUT in a
 * build without NCCL. */
int comm_nccl(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err);

/* The layer `inner` (taken over: freed with the result, or on failure) for buffers in device
 * memory: every call copies its inputs from the device into host mirrors of the attached memory
 * (comm_attach), runs inner's call there and copies its outputs back when it completes (a
 * non-blocking one at its wait). For ranks that share a GPU, where NCCL cannot run. k: the
 * kernels whose memory it mirrors. Its name stays inner's. */
int comm_staged(CommLayer *inner, const KernBackend *k, CommLayer **out, PxError *err);

/* The layer a multi-rank job uses (MPI must be running). gpu 0: MPI. gpu 1 (the job's kernels
 * run on CUDA): each rank takes GPU (local rank mod the GPUs it sees), and the ranks of each
 * node compare their GPUs' PCI bus ids (collective): NCCL when no two hold the same GPU (a GPU
 * per rank, whether each sees all of the node's or only its own through CUDA_VISIBLE_DEVICES),
 * else (two ranks on one GPU: NCCL refuses them; or no NCCL in this build) MPI staged through
 * host memory. *note says which and why, for the run's header (static text; NULL on the CPU).
 * PX_ERUNTIME when a rank cannot take its GPU (on every rank). */
int comm_for_job(const ModelSpec *s, int tied_pair, int gpu, CommLayer **out, const char **note,
                 PxError *err);

/* Frees the layer (and the layer it runs on); accepts NULL. */
void comm_free(CommLayer *c);

/* ---- what it is ---- */

const char *comm_name(const CommLayer *c); /* "single", "mpi" (staged too), "nccl" */
int comm_rank(const CommLayer *c);         /* in the world */
int comm_world(const CommLayer *c);
/* ranks in this rank's group g, and this rank's place in it (dp: the ZeRO shard it owns); 1
 * and 0 for a g that is no group */
int comm_group_size(const CommLayer *c, ModelGroup g);
int comm_group_rank(const CommLayer *c, ModelGroup g);
/* bytes and calls of a kind since the layer was made (0 for a kind that is none) */
uint64_t comm_bytes(const CommLayer *c, ModelComm kind);
uint64_t comm_calls(const CommLayer *c, ModelComm kind);

/* A wait longer than `seconds` ends the job, naming the rank, its step, the operation and its
 * group (docs/executor.md, "Failures"); 0: no limit (the default). */
void comm_set_timeout(CommLayer *c, double seconds);
/* The step the rank is in (1-based; 0 before the first), for the timeout's message. */
void comm_set_step(CommLayer *c, int step);

/* ---- counted communication over the kind's group ---- */

/* in-place reduction of count elements */
int comm_allreduce(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                   ModelComm kind, int *req, PxError *err);
/* out holds group * count elements, this rank's count at its place; in is this rank's count
 * (it may be out's own part) */
int comm_all_gather(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                    ModelComm kind, int *req, PxError *err);
/* in holds group * count elements; out gets this rank's summed count. out == in is in place:
 * the sum lands at the start of in. */
int comm_reduce_scatter(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                        ModelComm kind, int *req, PxError *err);
/* ZeRO on a block that memory holds unpadded, over the dp x cp group (a MoE layer's experts:
 * the expert-data-parallel group, EDP_* kinds): numel elements cut
 * into shards of `shard` (= ceil(numel / group)); the group's last ranks own fewer elements,
 * or none. Counted as the padded buffer of group * shard elements, as the op graph lists it.
 * In place: reduce_scatter_shard leaves this rank's summed shard at its own offset (the rest
 * of buf is undefined), all_gather_shard fills every shard from its owner. */
int comm_reduce_scatter_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                              PxDtype dtype, ModelComm kind, int *req, PxError *err);
int comm_all_gather_shard(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                          ModelComm kind, int *req, PxError *err);
/* In place over the kind's group: buf holds counts[i] elements of rank i, packed in group order
 * (this rank's at its place already), and every part arrives at its place. Counted as the
 * gathered buffer, sum(counts) elements. ZeRO-3's FP8 parameter gather, whose ranks hold
 * unequal parts of a block's FP8 weights. */
int comm_all_gather_v(CommLayer *c, void *buf, const int64_t *counts, PxDtype dtype,
                      ModelComm kind, int *req, PxError *err);
/* The all-to-all of a MoE layer's token rows over the kind's group (MODEL_EP_ALL_TO_ALL), in
 * two calls as Megatron-Core's dispatcher makes them: first the counts, then the rows.
 * comm_all_to_all_counts: send[i] (host memory, one per rank of the group, in group order) is
 * what this rank will send to rank i; recv[i] gets what rank i will send here. Metadata: not
 * counted (any kind's group: the experts' etp ranks exchange their row counts with an ETP
 * kind). comm_all_to_allv (blocking): in holds send_counts[i] elements for rank i, packed in
 * group order; out receives recv_counts[i] from rank i, packed likewise. Counted as the bytes
 * this rank sends (nccl-tests' all-to-all size: the send buffer), whatever goes to itself
 * included. Over a group of one, recv[0] = send[0] and out gets in (copied unless out == in),
 * uncounted. Counts must agree pairwise between ranks (the counts call makes them so). */
int comm_all_to_all_counts(CommLayer *c, const int64_t *send, int64_t *recv, ModelComm kind,
                           PxError *err);
int comm_all_to_allv(CommLayer *c, void *out, const int64_t *recv_counts, const void *in,
                     const int64_t *send_counts, PxDtype dtype, ModelComm kind, PxError *err);
/* point to point with a world rank; messages of one (peer, tag) arrive in order */
int comm_send(CommLayer *c, const void *buf, size_t bytes, int peer, int tag, ModelComm kind,
              int *req, PxError *err);
int comm_recv(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
              int *req, PxError *err);
/* completes *req (then -1); a handle of -1 (or req NULL) is already complete */
int comm_wait(CommLayer *c, int *req, PxError *err);
/* lets pending non-blocking operations advance (MPI progresses only inside its calls) */
void comm_progress(CommLayer *c);

/* ---- control traffic over the world, not counted ---- */

/* an in-place sum or maximum of n doubles over every rank */
int comm_control(CommLayer *c, double *vals, int n, CommRedOp op, PxError *err);
/* rank 0 gets every rank's text (out[r], malloc'ed, caller frees each and the array); the
 * others get *out = NULL */
int comm_gather_text(CommLayer *c, const char *text, char ***out, PxError *err);
int comm_barrier(CommLayer *c, PxError *err);

/* Device memory the calls may name: the executor attaches each arena it communicates from (the
 * staged layer mirrors it in host memory; attaching the same base again replaces its mirror).
 * A no-op where the layer takes any pointer. */
int comm_attach(CommLayer *c, void *base, size_t bytes, PxError *err);

/* ---- the MPI process (stubs that say so in a build without MPI) ---- */

/* 1 when this build has the MPI layer; the NCCL one. */
int comm_mpi_available(void);
int comm_nccl_available(void);
/* Starts MPI when this process was launched as one rank of an MPI job (mpirun, srun or any
 * launcher that sets the PMI/PMIx environment, or PARALLAX_MPI=1): returns 1 with *rank and
 * *world filled; 0 when it runs alone (no launcher, or a build without MPI: then *rank is the
 * launcher's, so that only the first process speaks). */
int comm_mpi_start(int *argc, char ***argv, int *rank, int *world);
/* Ends every rank of the job with `code` (MPI_Abort); no return. Without MPI it returns. */
void comm_mpi_abort(int code);
void comm_mpi_finish(void);
/* An agreement without a layer: every rank passes its status; all get the worst one and the
 * lowest rank that had it (*first_rank, optional). For errors found before the groups exist (a
 * plan one rank cannot read). */
int comm_mpi_agree(int status, int *first_rank);

#endif
