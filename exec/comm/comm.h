/* TEMPORARY shim: the comm_ API over the old ExecComm table, until the communication layer
 * module lands. */
#ifndef COMM_COMM_H
#define COMM_COMM_H

#include "exec/exec.h"

typedef struct CommLayer CommLayer;
typedef enum { COMM_SUM = 0, COMM_MAX } CommRedOp;

static inline int comm_rank(const CommLayer *c) { return c->rank; }
static inline int comm_world(const CommLayer *c) { return c->world; }
static inline const char *comm_name(const CommLayer *c) { return c->name; }
static inline int comm_group_size(const CommLayer *c, ModelGroup g) { return c->group_size[g]; }
static inline int comm_group_rank(const CommLayer *c, ModelGroup g) { return c->group_rank[g]; }
static inline uint64_t comm_bytes(const CommLayer *c, ModelComm k) { return c->bytes[k]; }
static inline uint64_t comm_calls(const CommLayer *c, ModelComm k) { return c->calls[k]; }
static inline void comm_set_timeout(CommLayer *c, double s) { c->timeout_s = s; }
static inline void comm_set_step(CommLayer *c, int step) { c->step = step; }
static inline CommLayer *comm_single(void) { return exec_comm_single(); }
static inline int comm_mpi_available(void) { return exec_mpi_available(); }
static inline int comm_nccl_available(void) { return exec_nccl_available(); }
static inline int comm_mpi(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err)
{
    return exec_comm_mpi(l, tied_pair, out, err);
}
static inline int comm_nccl(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err)
{
    return exec_comm_nccl(l, tied_pair, out, err);
}
static inline int comm_staged(CommLayer *inner, const struct KernBackend *k, CommLayer **out,
                              PxError *err)
{
    return exec_comm_staged(inner, k, out, err);
}
/* The layer a multi-rank job uses (MPI must be running). gpu 0: MPI. gpu 1 (the job's kernels
 * run on CUDA): each rank takes the GPU of its local rank on the node; NCCL with a GPU per rank,
 * else (the node's ranks outnumber its GPUs: NCCL refuses two ranks on one device; or no NCCL in
 * this build) MPI staged through host memory, and *note says why for the run's header (NULL
 * otherwise). PX_ERUNTIME when the GPU cannot be made current. (for_job.c) */
int comm_for_job(const ModelSpec *s, int tied_pair, int gpu, CommLayer **out, const char **note,
                 PxError *err);
static inline int comm_mpi_start(int *argc, char ***argv, int *rank, int *world)
{
    return exec_mpi_start(argc, argv, rank, world);
}
static inline void comm_mpi_abort(int code) { exec_mpi_abort(code); }
static inline void comm_mpi_finish(void) { exec_mpi_finish(); }
static inline int comm_mpi_agree(int status, int *first_rank)
{
    return exec_mpi_agree(status, first_rank);
}
static inline void comm_mpi_local(int *local_rank, int *local_size)
{
    exec_mpi_local(local_rank, local_size);
}
static inline void comm_free(CommLayer *c)
{
    if (c)
        c->free(c);
}
static inline int comm_allreduce(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                                 ModelComm kind, int *req, PxError *err)
{
    return c->allreduce(c, buf, count, dtype, (ExecRedOp)op, (int)kind, req, err);
}
static inline int comm_all_gather(CommLayer *c, void *out, const void *in, size_t count,
                                  PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return c->all_gather(c, out, in, count, dtype, (int)kind, req, err);
}
static inline int comm_reduce_scatter(CommLayer *c, void *out, const void *in, size_t count,
                                      PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return c->reduce_scatter(c, out, in, count, dtype, (int)kind, req, err);
}
static inline int comm_reduce_scatter_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                                            PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return c->reduce_scatter_shard(c, buf, numel, shard, dtype, (int)kind, req, err);
}
static inline int comm_all_gather_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                                        PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return c->all_gather_shard(c, buf, numel, shard, dtype, (int)kind, req, err);
}
static inline int comm_send(CommLayer *c, const void *buf, size_t bytes, int peer, int tag,
                            ModelComm kind, int *req, PxError *err)
{
    return c->send(c, buf, bytes, peer, tag, (int)kind, req, err);
}
static inline int comm_recv(CommLayer *c, void *buf, size_t bytes, int peer, int tag,
                            ModelComm kind, int *req, PxError *err)
{
    return c->recv(c, buf, bytes, peer, tag, (int)kind, req, err);
}
static inline int comm_wait(CommLayer *c, int *req, PxError *err) { return c->wait(c, req, err); }
static inline void comm_progress(CommLayer *c) { c->progress(c); }
static inline int comm_control(CommLayer *c, double *vals, int n, CommRedOp op, PxError *err)
{
    return c->control(c, vals, n, (ExecRedOp)op, err);
}
static inline int comm_gather_text(CommLayer *c, const char *text, char ***out, PxError *err)
{
    return c->gather_text(c, text, out, err);
}
static inline int comm_barrier(CommLayer *c, PxError *err) { return c->barrier(c, err); }
static inline int comm_attach(CommLayer *c, void *base, size_t bytes, PxError *err)
{
    return c->attach ? c->attach(c, base, bytes, err) : PX_OK;
}

#endif
