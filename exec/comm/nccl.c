/* The NCCL communication layer: mpi.c's raw operations for ranks that each have a GPU, with
 * every buffer in device memory (comm.c counts the calls and copies a group of one's part on
 * the device, with this layer's copy). MPI stays underneath: it starts the job, carries each
 * NCCL communicator's unique id from the group's first rank to the others (MPI_Bcast over the
 * group's MPI communicator), and takes the control traffic (loss, norm, stop flag), the
 * gathered figures and the barrier, which live on the host.
 *
 * Groups are mpi.c's: tp, cp, dp x cp (its rank is the ZeRO shard), the tied-embedding
 * pair; one NCCL communicator each where the group has two ranks or more. The pipeline gets one
 * two-rank communicator per directed edge between neighbouring stages (s -> s+1 and s -> s-1,
 * ring included for interleaving): NCCL matches point-to-point messages in issue order, not by
 * tag, and on every edge the sender's order equals the receiver's for every schedule of
 * model_schedule_build (test_exec_emu_nccl checks it, pp 2-8, vpp 1-4, up to 24 micro-batches),
 * so the executor's tags are not needed. The edges are created in rounds in which each rank
 * takes part in at most one, so that no two ranks wait for each other's ncclCommInitRank, and
 * each is connected in its round by a byte each way (warm_link: NCCL would otherwise connect
 * it at the pipeline's first receive, which blocks the host until the peer's first call).
 *
 * Streams and events: collectives run on one non-blocking stream, sends on a second and
 * receives on a third (the posted receive of the pipeline waits there without holding up the
 * rest; step.c keeps at most one receive and one send pending), the context-parallel ring's
 * receive and send, as one group, on a fourth (ring_recv). Each operation first waits for
 * an event recorded on the compute stream (the legacy default stream the kernels run on), so it
 * sees every kernel issued before it and no kernel issued before it still reads its buffer; its
 * completion is an event the compute stream waits for at `wait` (or at once for a blocking
 * call). The host never waits for NCCL: a gradient all-reduce started during the backward runs
 * beside the next layers' kernels, and the executor's op timing (kernels.h's sync, the compute
 * stream only) does not wait for it either.
 *
 * ZeRO's sharded calls on an unpadded block (its last ranks own fewer elements): when the block
 * divides evenly, one in-place ncclReduceScatter / ncclAllGather; otherwise one ncclReduce
 * (ncclBroadcast) per shard to (from) its owner, in one NCCL group. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/comm/backend.h"

#if defined(PX_HAVE_NCCL) && defined(PX_HAVE_MPI)

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

int comm_nccl_available(void) { return 1; }

enum { NCCL_REQS = 1024, NCCL_EDGES = 4 };

typedef struct {
    int active;
    cudaEvent_t done;
} NcclReq;

typedef struct {
    int peer; /* world rank at the other end */
    ncclComm_t comm;
    int peer_index; /* the peer's rank in the two-rank communicator */
} NcclEdge;

/* The context-parallel ring's receive (MODEL_CP_P2P), held until the send that follows it. */
typedef struct {
    int req; /* its handle (-1: none held) */
    void *buf;
    size_t bytes;
    int peer; /* its rank in the cp group */
} NcclHeld;

typedef struct {
    CommLayer base; /* first: the raw operations cast back; base.inner is the MPI layer (control,
                       gather_text, barrier, and the host's waits with their timeout) */
    MPI_Comm group[COMM_GROUPS];
    ncclComm_t nccl[COMM_GROUPS]; /* NULL where the group has one rank */
    NcclEdge out[NCCL_EDGES], in[NCCL_EDGES];
    int n_out, n_in;
    cudaStream_t coll, send, recv, ring;
    cudaEvent_t compute;
    NcclReq reqs[NCCL_REQS];
    ModelLayout layout; /* a world rank's cp coordinate: its rank in the cp group */
    NcclHeld held;
} NcclComm;

static int cuda_fail(PxError *err, cudaError_t e, const char *what)
{
    return px_fail(err, PX_ERUNTIME, "%s: CUDA error %d: %s", what, (int)e, cudaGetErrorString(e));
}

static int nccl_fail(PxError *err, ncclResult_t r, const char *what)
{
    return px_fail(err, PX_ERUNTIME, "%s: NCCL error %d: %s", what, (int)r, ncclGetErrorString(r));
}

static int nccl_type(PxDtype t, ncclDataType_t *out, PxError *err)
{
    switch (t) {
    case PX_FP32: *out = ncclFloat32; return PX_OK;
    case PX_BF16: *out = ncclBfloat16; return PX_OK;
    case PX_FP16: *out = ncclFloat16; return PX_OK;
    case PX_INT32: *out = ncclInt32; return PX_OK;
    case PX_FP8: *out = ncclUint8; return PX_OK; /* moved, never reduced */
    case PX_UINT8: *out = ncclUint8; return PX_OK; /* the all-gather dispatcher's routing map */
    default: return px_fail(err, PX_ERUNTIME, "the NCCL layer has no %s collectives", px_dtype_name(t));
    }
}

static int gidx(ModelComm kind) { return (int)model_comm_group(kind); }

/* The operation's stream waits for the compute stream's work issued so far. */
static int begin(NcclComm *n, cudaStream_t st, PxError *err)
{
    cudaError_t e = cudaEventRecord(n->compute, 0);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(st, n->compute, 0);
    return e == cudaSuccess ? PX_OK : cuda_fail(err, e, "ordering a communication after the kernels");
}

/* After enqueuing on st: a request whose event the compute stream will wait for at `wait`, or
 * (req NULL: a blocking call) at once. */
static int end(NcclComm *n, cudaStream_t st, int *req, PxError *err)
{
    for (int i = 0; i < NCCL_REQS; i++) {
        NcclReq *q = &n->reqs[i];
        if (q->active)
            continue;
        cudaError_t e = cudaEventRecord(q->done, st);
        if (e != cudaSuccess)
            return cuda_fail(err, e, "recording a communication's completion");
        if (req) {
            q->active = 1;
            *req = i;
            return PX_OK;
        }
        e = cudaStreamWaitEvent(0, q->done, 0);
        return e == cudaSuccess ? PX_OK : cuda_fail(err, e, "waiting for a communication");
    }
    return px_fail(err, PX_ERUNTIME, "more than %d communication operations pending at once",
                   NCCL_REQS);
}

static int copy_d2d(void *dst, const void *src, size_t bytes, cudaStream_t st, PxError *err)
{
    if (dst == src || bytes == 0)
        return PX_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st);
    return e == cudaSuccess ? PX_OK : cuda_fail(err, e, "a device copy");
}

static int n_allreduce(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                       ModelComm kind, int *req, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    ncclComm_t comm = n->nccl[gidx(kind)];
    ncclDataType_t t;
    int rc = nccl_type(dtype, &t, err);
    if (rc || (rc = begin(n, n->coll, err)))
        return rc;
    ncclResult_t r = ncclAllReduce(buf, buf, count, t, op == COMM_MAX ? ncclMax : ncclSum, comm,
                                   n->coll);
    if (r != ncclSuccess)
        return nccl_fail(err, r, model_comm_name(kind));
    return end(n, n->coll, req, err);
}

static int n_all_gather(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                        ModelComm kind, int *req, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    ncclComm_t comm = n->nccl[gidx(kind)];
    ncclDataType_t t;
    int rc = nccl_type(dtype, &t, err);
    if (rc || (rc = begin(n, n->coll, err)))
        return rc;
    ncclResult_t r = ncclAllGather(in, out, count, t, comm, n->coll); /* in place when in is
                                                                         out's own part */
    if (r != ncclSuccess)
        return nccl_fail(err, r, model_comm_name(kind));
    return end(n, n->coll, req, err);
}

static int n_reduce_scatter(CommLayer *c, void *out, const void *in, size_t count,
                            PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    const int g = gidx(kind);
    ncclComm_t comm = n->nccl[g];
    const size_t es = px_dtype_bytes(dtype);
    ncclDataType_t t;
    int rc = nccl_type(dtype, &t, err);
    if (rc || (rc = begin(n, n->coll, err)))
        return rc;
    /* comm.h's in place (out == in) leaves the sum at the start of in; NCCL's leaves it at
     * this rank's part, from where it moves on the same stream */
    char *dst = out == in ? (char *)out + (size_t)c->group_rank[g] * count * es : out;
    ncclResult_t r = ncclReduceScatter(in, dst, count, t, ncclSum, comm, n->coll);
    if (r != ncclSuccess)
        return nccl_fail(err, r, model_comm_name(kind));
    if ((rc = copy_d2d(out, dst, count * es, n->coll, err)))
        return rc;
    return end(n, n->coll, req, err);
}

static int shard_call(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                      ModelComm kind, int *req, int gather, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    const int g = gidx(kind), size = c->group_size[g], me = c->group_rank[g];
    ncclComm_t comm = n->nccl[g];
    ncclDataType_t t;
    int rc = nccl_type(dtype, &t, err);
    if (rc || (rc = begin(n, n->coll, err)))
        return rc;
    const size_t es = px_dtype_bytes(dtype);
    char *b = buf;
    ncclResult_t r;
    if (numel == (size_t)size * shard) {
        r = gather ? ncclAllGather(b + (size_t)me * shard * es, b, shard, t, comm, n->coll)
                   : ncclReduceScatter(b, b + (size_t)me * shard * es, shard, t, ncclSum, comm,
                                       n->coll);
    } else {
        r = ncclGroupStart();
        for (int i = 0; i < size && r == ncclSuccess; i++) {
            size_t off = (size_t)i * shard;
            if (off >= numel)
                break; /* the group's last ranks own nothing */
            size_t cnt = numel - off < shard ? numel - off : shard;
            char *p = b + off * es;
            r = gather ? ncclBroadcast(p, p, cnt, t, i, comm, n->coll)
                       : ncclReduce(p, p, cnt, t, ncclSum, i, comm, n->coll);
        }
        ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess)
            r = r2;
    }
    if (r != ncclSuccess)
        return nccl_fail(err, r, model_comm_name(kind));
    return end(n, n->coll, req, err);
}

/* In place, rank i's counts[i] elements broadcast from it to their place, in one NCCL group
 * (as a sharded gather of unequal shards). */
static int n_all_gather_v(CommLayer *c, void *buf, const int64_t *counts, PxDtype dtype,
                          ModelComm kind, int *req, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    const int g = gidx(kind), size = c->group_size[g];
    ncclDataType_t t;
    int rc = nccl_type(dtype, &t, err);
    if (rc || (rc = begin(n, n->coll, err)))
        return rc;
    const size_t es = px_dtype_bytes(dtype);
    size_t off = 0;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < size && r == ncclSuccess; i++) {
        char *p = (char *)buf + off * es;
        if (counts[i] > 0)
            r = ncclBroadcast(p, p, (size_t)counts[i], t, i, n->nccl[g], n->coll);
        off += (size_t)counts[i];
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    if (r != ncclSuccess)
        return nccl_fail(err, r, model_comm_name(kind));
    return end(n, n->coll, req, err);
}

static int n_reduce_scatter_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                                  PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return shard_call(c, buf, numel, shard, dtype, kind, req, 0, err);
}

static int n_all_gather_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                              PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return shard_call(c, buf, numel, shard, dtype, kind, req, 1, err);
}

static const NcclEdge *edge(const NcclEdge *e, int n, int peer)
{
    for (int i = 0; i < n; i++)
        if (e[i].peer == peer)
            return &e[i];
    return NULL;
}

static int p2p(CommLayer *c, void *buf, size_t bytes, int peer, int *req, int send, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    const NcclEdge *e = send ? edge(n->out, n->n_out, peer) : edge(n->in, n->n_in, peer);
    if (!e)
        return px_fail(err, PX_ERUNTIME, "no pipeline link %s rank %d", send ? "to" : "from", peer);
    cudaStream_t st = send ? n->send : n->recv;
    int rc = begin(n, st, err);
    if (rc)
        return rc;
    ncclResult_t r = send ? ncclSend(buf, bytes, ncclUint8, e->peer_index, e->comm, st)
                          : ncclRecv(buf, bytes, ncclUint8, e->peer_index, e->comm, st);
    if (r != ncclSuccess) {
        char what[64];
        snprintf(what, sizeof what, "%s rank %d", send ? "send to" : "receive from", peer);
        return nccl_fail(err, r, what);
    }
    return end(n, st, req, err);
}

/* The context-parallel ring (MODEL_CP_P2P, exec/train/layers.c): each rank receives from one
 * cp neighbour while it sends to the other, over the cp group's communicator. NCCL orders the
 * operations of a communicator, so a receive and a send launched apart would deadlock: every
 * rank's send would queue behind its receive, which waits for the other rank's send. So the
 * ring's receive is held (its handle given, nothing launched) until the send that follows it,
 * as the ring posts them, and both go as one NCCL group on the ring's own stream (beside the
 * collectives, which the ring must not wait behind); a request of either completes with both. */
static int ring_recv(NcclComm *n, void *buf, size_t bytes, int peer, int *req, PxError *err)
{
    if (!req)
        return px_fail(err, PX_ERUNTIME, "%s: the ring's receive must be non-blocking",
                       model_comm_name(MODEL_CP_P2P));
    if (n->held.req >= 0)
        return px_fail(err, PX_ERUNTIME, "%s: two receives without a send between them",
                       model_comm_name(MODEL_CP_P2P));
    for (int i = 0; i < NCCL_REQS; i++)
        if (!n->reqs[i].active) {
            int tp, cp, dp, pp;
            model_rank_coords(&n->layout, peer, &tp, &cp, &dp, &pp);
            n->reqs[i].active = 1;
            n->held = (NcclHeld){i, buf, bytes, cp};
            *req = i;
            return PX_OK;
        }
    return px_fail(err, PX_ERUNTIME, "more than %d communication operations pending at once",
                   NCCL_REQS);
}

static int ring_send(NcclComm *n, const void *buf, size_t bytes, int peer, int *req, PxError *err)
{
    const NcclHeld h = n->held;
    if (h.req < 0)
        return px_fail(err, PX_ERUNTIME, "%s: a send without the receive posted before it",
                       model_comm_name(MODEL_CP_P2P));
    n->held.req = -1;
    ncclComm_t comm = n->nccl[gidx(MODEL_CP_P2P)];
    int tp, cp, dp, pp;
    model_rank_coords(&n->layout, peer, &tp, &cp, &dp, &pp);
    int rc = begin(n, n->ring, err);
    if (rc)
        return rc;
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess)
        r = ncclRecv(h.buf, h.bytes, ncclUint8, h.peer, comm, n->ring);
    if (r == ncclSuccess)
        r = ncclSend(buf, bytes, ncclUint8, cp, comm, n->ring);
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    if (r != ncclSuccess)
        return nccl_fail(err, r, model_comm_name(MODEL_CP_P2P));
    cudaError_t e = cudaEventRecord(n->reqs[h.req].done, n->ring);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "recording a communication's completion");
    return end(n, n->ring, req, err);
}

/* The tag is not needed: each directed edge has its own communicator, whose messages arrive in
 * the order they were sent, which is the order the receiver expects them (see the top). */
static int n_send(CommLayer *c, const void *buf, size_t bytes, int peer, int tag,
                  ModelComm kind, int *req, PxError *err)
{
    (void)tag;
    if (kind == MODEL_CP_P2P)
        return ring_send((NcclComm *)c, buf, bytes, peer, req, err);
    return p2p(c, (void *)buf, bytes, peer, req, 1, err);
}

static int n_recv(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                  int *req, PxError *err)
{
    (void)tag;
    if (kind == MODEL_CP_P2P)
        return ring_recv((NcclComm *)c, buf, bytes, peer, req, err);
    return p2p(c, buf, bytes, peer, req, 0, err);
}

static int n_wait(CommLayer *c, int *req, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    if (*req >= 0 && *req == n->held.req)
        return px_fail(err, PX_ERUNTIME, "%s: a receive waited for before its send was posted",
                       model_comm_name(MODEL_CP_P2P));
    NcclReq *q = &n->reqs[*req];
    *req = -1;
    if (!q->active)
        return PX_OK;
    q->active = 0;
    cudaError_t e = cudaStreamWaitEvent(0, q->done, 0);
    return e == cudaSuccess ? PX_OK : cuda_fail(err, e, "waiting for a communication");
}

/* a group of one: this rank's part stays on the device, ordered on the compute stream */
static int n_copy(CommLayer *c, void *dst, const void *src, size_t bytes, PxError *err)
{
    (void)c;
    return copy_d2d(dst, src, bytes, 0, err);
}

static void n_free(CommLayer *c)
{
    NcclComm *n = (NcclComm *)c;
    /* queued operations finish first (an error path may leave some) */
    if (n->coll)
        cudaStreamSynchronize(n->coll);
    for (int g = 0; g < COMM_GROUPS; g++) {
        int alias = 0;
        for (int h = 0; h < g; h++)
            alias |= n->nccl[g] && n->nccl[h] == n->nccl[g];
        if (n->nccl[g] && !alias)
            ncclCommDestroy(n->nccl[g]);
        if (n->group[g] != MPI_COMM_NULL)
            MPI_Comm_free(&n->group[g]);
    }
    /* each directed edge is its own communicator: this rank sends on the out ones only */
    for (int i = 0; i < n->n_out; i++)
        ncclCommDestroy(n->out[i].comm);
    for (int i = 0; i < n->n_in; i++)
        ncclCommDestroy(n->in[i].comm);
    for (int i = 0; i < NCCL_REQS; i++)
        if (n->reqs[i].done)
            cudaEventDestroy(n->reqs[i].done);
    if (n->compute)
        cudaEventDestroy(n->compute);
    if (n->coll)
        cudaStreamDestroy(n->coll);
    if (n->send)
        cudaStreamDestroy(n->send);
    if (n->recv)
        cudaStreamDestroy(n->recv);
    if (n->ring)
        cudaStreamDestroy(n->ring);
    comm_free(c->inner);
    free(n);
}

/* NCCL has no all-to-all-v: one send and one receive per peer in an NCCL group (as
 * Megatron-Core's and NCCL's own examples build it), this rank's own rows a device copy, all on
 * the collective stream. Blocking: the compute stream waits for it. */
static int n_all_to_allv(CommLayer *c, void *out, const int64_t *recv_counts, const void *in,
                         const int64_t *send_counts, PxDtype dtype, ModelComm kind, PxError *err)
{
    NcclComm *n = (NcclComm *)c;
    const int gi = gidx(kind), g = c->group_size[gi], me = c->group_rank[gi];
    ncclComm_t comm = n->nccl[gi];
    ncclDataType_t t;
    int rc = nccl_type(dtype, &t, err);
    if (rc || (rc = begin(n, n->coll, err)))
        return rc;
    const size_t es = px_dtype_bytes(dtype);
    const char *src = in;
    char *dst = out;
    size_t so = 0, ro = 0, self_so = 0, self_ro = 0;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < g && r == ncclSuccess; i++) {
        const size_t sc = (size_t)send_counts[i], rcnt = (size_t)recv_counts[i];
        if (i == me) {
            self_so = so;
            self_ro = ro;
        } else {
            if (sc)
                r = ncclSend(src + so * es, sc, t, i, comm, n->coll);
            if (r == ncclSuccess && rcnt)
                r = ncclRecv(dst + ro * es, rcnt, t, i, comm, n->coll);
        }
        so += sc;
        ro += rcnt;
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    if (r != ncclSuccess)
        return nccl_fail(err, r, model_comm_name(kind));
    if (send_counts[me] != recv_counts[me])
        return px_fail(err, PX_ERUNTIME, "%s: %lld elements to itself but %lld from itself",
                       model_comm_name(kind), (long long)send_counts[me],
                       (long long)recv_counts[me]);
    if ((rc = copy_d2d(dst + self_ro * es, src + self_so * es, (size_t)send_counts[me] * es,
                       n->coll, err)))
        return rc;
    return end(n, n->coll, NULL, err);
}

static const CommOps nccl_ops = {
    .all_to_allv = n_all_to_allv, /* all_to_all_counts: the MPI layer's, on the host */
    .allreduce = n_allreduce,
    .all_gather = n_all_gather,
    .reduce_scatter = n_reduce_scatter,
    .reduce_scatter_shard = n_reduce_scatter_shard,
    .all_gather_shard = n_all_gather_shard,
    .all_gather_v = n_all_gather_v,
    .send = n_send,
    .recv = n_recv,
    .wait = n_wait,
    /* no progress: NCCL progresses on the GPU. Control, gather_text and barrier are the MPI
     * layer's (base.inner: the host's waits, with the timeout and step comm.c hands on), which
     * comm.c calls when these are NULL. */
    .free = n_free,
    .copy = n_copy,
};

/* One NCCL communicator over an MPI communicator: its rank 0 makes the id, MPI_Bcast carries
 * it. The members first agree that none has failed before (failed: this rank has, err holds
 * why), so that no rank waits in ncclCommInitRank for one that will never come. */
static int nccl_over(MPI_Comm mc, int failed, ncclComm_t *out, PxError *err)
{
    int size = 0, rank = 0;
    MPI_Comm_size(mc, &size);
    MPI_Comm_rank(mc, &rank);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (rank == 0 && !failed)
        r = ncclGetUniqueId(&id);
    int bad = failed || r != ncclSuccess, any = bad;
    if (MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, mc) != MPI_SUCCESS ||
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mc) != MPI_SUCCESS)
        return failed ? PX_ERUNTIME : px_fail(err, PX_ERUNTIME, "broadcasting the NCCL unique id over MPI");
    if (failed)
        return PX_ERUNTIME;
    if (r != ncclSuccess)
        return nccl_fail(err, r, "ncclGetUniqueId");
    if (any)
        return px_fail(err, PX_ERUNTIME, "another rank failed to set up NCCL");
    r = ncclCommInitRank(out, size, id, rank);
    return r == ncclSuccess ? PX_OK : nccl_fail(err, r, "ncclCommInitRank");
}

/* NCCL connects two ranks for point-to-point at their first send or receive to each other,
 * and that call blocks the host until the peer makes its own on the same communicator. The
 * pipeline posts each stage's first receive before any send, each direction on its own
 * communicator: left to connect lazily, stage 0 would wait in its receive on one edge for stage
 * 1, which waits in its receive on the other (a deadlock at step 1). So each edge is connected
 * in its round, where both ends meet anyway: one byte each way in a group, then waited for. */
static int warm_link(NcclComm *n, ncclComm_t comm, int peer, unsigned char *scratch,
                     PxError *err)
{
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess)
        r = ncclSend(scratch, 1, ncclUint8, peer, comm, n->coll);
    if (r == ncclSuccess)
        r = ncclRecv(scratch + 1, 1, ncclUint8, peer, comm, n->coll);
    ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess)
        r = r2;
    if (r != ncclSuccess)
        return nccl_fail(err, r, "connecting a pipeline link");
    cudaError_t e = cudaStreamSynchronize(n->coll);
    return e == cudaSuccess ? PX_OK : cuda_fail(err, e, "connecting a pipeline link");
}

/* The pipeline's directed edges (s -> s+1, s -> s-1 on the ring of p stages, duplicates
 * dropped), each given the first round in which neither end has one yet: every rank computes
 * the same rounds, and takes part in at most one edge per round. */
typedef struct {
    int src, dst, round;
} Edge;

static int pipeline_edges(int p, Edge *e)
{
    int n = 0;
    for (int s = 0; s < p; s++)
        for (int dir = 0; dir < 2; dir++) {
            int t = dir == 0 ? (s + 1) % p : (s + p - 1) % p;
            int dup = t == s;
            for (int i = 0; i < n && !dup; i++)
                dup = e[i].src == s && e[i].dst == t;
            if (!dup)
                e[n++] = (Edge){s, t, -1};
        }
    for (int i = 0; i < n; i++) {
        for (int r = 0;; r++) {
            int used = 0;
            for (int k = 0; k < i && !used; k++)
                used = e[k].round == r && (e[k].src == e[i].src || e[k].dst == e[i].src ||
                                           e[k].src == e[i].dst || e[k].dst == e[i].dst);
            if (!used) {
                e[i].round = r;
                break;
            }
        }
    }
    return n;
}

int comm_nccl(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err)
{
    *out = NULL;
    CommLayer *mpi = NULL;
    int rc = comm_mpi(l, tied_pair, &mpi, err);
    if (rc)
        return rc;
    NcclComm *n = calloc(1, sizeof *n);
    if (!n) {
        comm_free(mpi);
        return px_fail(err, PX_ERUNTIME, "out of memory for the communication layer");
    }
    for (int g = 0; g < COMM_GROUPS; g++)
        n->group[g] = MPI_COMM_NULL;
    n->layout = *l;
    n->held.req = -1;
    CommLayer *c = &n->base;
    comm_layer_wrap(c, &nccl_ops, "nccl", mpi);
    cudaError_t e;
    int lo = 0, hi = 0;
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    /* communication first: a reduction the backward waits for should not queue behind kernels */
    if ((e = cudaStreamCreateWithPriority(&n->coll, cudaStreamNonBlocking, hi)) != cudaSuccess ||
        (e = cudaStreamCreateWithPriority(&n->send, cudaStreamNonBlocking, hi)) != cudaSuccess ||
        (e = cudaStreamCreateWithPriority(&n->recv, cudaStreamNonBlocking, hi)) != cudaSuccess ||
        (e = cudaStreamCreateWithPriority(&n->ring, cudaStreamNonBlocking, hi)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&n->compute, cudaEventDisableTiming)) != cudaSuccess) {
        n_free(c);
        return cuda_fail(err, e, "creating the NCCL layer's streams");
    }
    for (int i = 0; i < NCCL_REQS; i++)
        if ((e = cudaEventCreateWithFlags(&n->reqs[i].done, cudaEventDisableTiming)) != cudaSuccess) {
            n_free(c);
            return cuda_fail(err, e, "creating the NCCL layer's events");
        }
    /* the groups, split exactly as mpi.c does, then one NCCL communicator each */
    int tp, cp, dp, pp;
    model_rank_coords(l, c->rank, &tp, &cp, &dp, &pp);
    CommGroupSplit split[COMM_SPLITS];
    const int n_split = comm_group_splits(l, c->rank, tied_pair, MPI_UNDEFINED, split);
    /* every rank takes part in every split and agreement, failed or not: nobody is left
     * waiting; the worker agrees on the status afterwards */
    rc = PX_OK;
    for (int i = 0; i < n_split; i++) {
        MPI_Comm *mc = &n->group[split[i].group];
        if (MPI_Comm_split(MPI_COMM_WORLD, split[i].color, split[i].key, mc) != MPI_SUCCESS) {
            *mc = MPI_COMM_NULL;
            if (!rc)
                rc = px_fail(err, PX_ERUNTIME, "creating the process groups");
            continue;
        }
        if (*mc != MPI_COMM_NULL && c->group_size[split[i].group] > 1) {
            int r = nccl_over(*mc, rc != PX_OK, &n->nccl[split[i].group], err);
            if (!rc)
                rc = r;
        }
    }
    /* expert groups laid out as the dense ones share their communicators (n_free knows) */
    for (int g = MODEL_GROUP_ETP; g <= MODEL_GROUP_ETP_EP; g++)
        if (comm_group_alias(l, (ModelGroup)g) != (ModelGroup)g)
            n->nccl[g] = n->nccl[comm_group_alias(l, (ModelGroup)g)];
    /* the pipeline's edges, round by round */
    Edge *edges = l->pp > 1 ? calloc((size_t)(2 * l->pp), sizeof *edges) : NULL;
    if (l->pp > 1 && !edges && !rc)
        rc = px_fail(err, PX_ERUNTIME, "out of memory for the pipeline's links");
    const int ne = edges ? pipeline_edges(l->pp, edges) : 0;
    const int pipe = tp + l->tp * (cp + l->cp * dp); /* which pipeline this rank is on */
    int rounds = 0;
    for (int i = 0; i < ne; i++)
        if (edges[i].round + 1 > rounds)
            rounds = edges[i].round + 1;
    unsigned char *scratch = NULL; /* the bytes that connect the links */
    if (ne > 0 && (e = cudaMalloc((void **)&scratch, 2)) != cudaSuccess && !rc)
        rc = cuda_fail(err, e, "a scratch for connecting the pipeline's links");
    for (int r = 0; r < rounds; r++) {
        int color = MPI_UNDEFINED, key = 0, mine = -1;
        for (int i = 0; i < ne; i++)
            if (edges[i].round == r && (edges[i].src == pp || edges[i].dst == pp)) {
                mine = i;
                color = pipe * ne + i;
                key = edges[i].src == pp ? 0 : 1;
            }
        MPI_Comm mc = MPI_COMM_NULL;
        if (MPI_Comm_split(MPI_COMM_WORLD, color, key, &mc) != MPI_SUCCESS) {
            if (!rc)
                rc = px_fail(err, PX_ERUNTIME, "creating the pipeline's links");
            continue;
        }
        if (mine < 0)
            continue;
        ncclComm_t nc = NULL;
        int fr = nccl_over(mc, rc != PX_OK, &nc, err);
        MPI_Comm_free(&mc);
        if (fr) {
            if (!rc)
                rc = fr;
            continue;
        }
        const int src = edges[mine].src, dst = edges[mine].dst;
        NcclEdge ed = {model_rank(l, tp, cp, dp, src == pp ? dst : src), nc, src == pp ? 1 : 0};
        int wr = warm_link(n, nc, ed.peer_index, scratch, err);
        if (wr && !rc)
            rc = wr;
        if (src == pp && n->n_out < NCCL_EDGES)
            n->out[n->n_out++] = ed;
        else if (dst == pp && n->n_in < NCCL_EDGES)
            n->in[n->n_in++] = ed;
    }
    free(edges);
    if (scratch)
        cudaFree(scratch);
    if (rc) {
        /* a rank that failed here alone leaves the others in MPI or NCCL calls: the worker
         * agrees on the status and the job ends (every rank reaches the agreement or aborts) */
        n_free(c);
        return rc;
    }
    *out = c;
    return PX_OK;
}

#else /* no NCCL (or no MPI) at build time */

int comm_nccl_available(void) { return 0; }

int comm_nccl(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err)
{
    (void)l, (void)tied_pair;
    *out = NULL;
    return px_fail(err, PX_EINPUT,
                   "this parallax-worker was built without NCCL (it needs CUDA, NCCL and MPI)");
}

#endif
