/* nccl_emu: see include/nccl.h. Every rank is a process of an mpirun job and its "device"
 * memory is its own heap (kernels/cuda/emu), so an NCCL call becomes the matching non-blocking
 * MPI call on the communicator's MPI communicator, issued when its stream gets to it and
 * completed when MPI says so. Activations in bf16 and fp16 are reduced by MPI operations that
 * add (or compare) in fp32 and round back, as NCCL's kernels do. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/px.h"
#include "kernels/cuda/emu/include/nccl.h"

struct ncclComm {
    MPI_Comm comm;
    int rank, nranks;
    unsigned char *connected; /* per peer: point-to-point set up (connect_peers) */
};

/* message tags on a communicator's MPI communicator: data, and the pairs' connections */
enum { TAG_DATA = 0, TAG_CONNECT = 1, GROUP_PEERS = 1024 };

enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_REDUCE, OP_BCAST, OP_SEND, OP_RECV };

typedef struct {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root; /* reduce, broadcast: the root; send, receive: the peer */
    ncclComm_t comm;
    MPI_Request req;
    void *tmp;
} Op;

/* ---- 16-bit floats: common/px.h's conversions, which round to nearest even as the device
 * intrinsics do ---- */

#define HALF_OP(name, to_f, from_f, combine)                                                      \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt)                            \
    {                                                                                             \
        (void)dt;                                                                                 \
        const uint16_t *a = in;                                                                   \
        uint16_t *b = inout;                                                                      \
        for (int i = 0; i < *len; i++) {                                                          \
            const float x = to_f(a[i]), y = to_f(b[i]);                                           \
            b[i] = from_f(combine);                                                               \
        }                                                                                         \
    }
HALF_OP(bf16_sum, px_bf16_to_float, px_float_to_bf16, x + y)
HALF_OP(fp16_sum, px_half_to_float, px_float_to_half, x + y)
HALF_OP(bf16_max, px_bf16_to_float, px_float_to_bf16, x > y || y != y ? x : y)
HALF_OP(fp16_max, px_half_to_float, px_float_to_half, x > y || y != y ? x : y)

static MPI_Op half_ops[4]; /* bf16 sum, fp16 sum, bf16 max, fp16 max; made once */
static int half_ops_made;

static size_t type_bytes(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
    }
}

static MPI_Datatype mpi_type(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat16:
    case ncclBfloat16: return MPI_UINT16_T; /* arithmetic through half_ops */
    case ncclFloat32: return MPI_FLOAT;
    default: return MPI_DOUBLE;
    }
}

static MPI_Op mpi_op(ncclDataType_t t, ncclRedOp_t op)
{
    if (t == ncclBfloat16 || t == ncclFloat16) {
        if (!half_ops_made) {
            MPI_Op_create(bf16_sum, 1, &half_ops[0]);
            MPI_Op_create(fp16_sum, 1, &half_ops[1]);
            MPI_Op_create(bf16_max, 1, &half_ops[2]);
            MPI_Op_create(fp16_max, 1, &half_ops[3]);
            half_ops_made = 1;
        }
        return half_ops[(op == ncclMax ? 2 : 0) + (t == ncclFloat16)];
    }
    switch (op) {
    case ncclProd: return MPI_PROD;
    case ncclMax: return MPI_MAX;
    case ncclMin: return MPI_MIN;
    default: return MPI_SUM;
    }
}

/* ---- operations on streams ----
 *
 * MPI never sees device memory: an operation copies its input into host buffers when it
 * starts and its result out of them when it completes, both inside the emulator's device
 * window (kernels/cuda/emu: device memory is closed to the host otherwise). MPI may progress a
 * request during any MPI call of the host, and a peer on the same machine may read or write a
 * buffer through the kernel (single-copy transports): only host buffers can be handed to it. */

static void *host_copy(const void *src, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "parallax: nccl_emu: out of memory for %zu bytes\n", bytes);
        abort();
    }
    if (src && bytes)
        memcpy(p, src, bytes);
    return p;
}

static void op_start(void *arg)
{
    Op *o = arg;
    const MPI_Comm c = o->comm->comm;
    const int n = (int)o->count, me = o->comm->rank, size = o->comm->nranks;
    const size_t es = type_bytes(o->dt), bytes = o->count * es;
    const MPI_Datatype t = mpi_type(o->dt);
    switch (o->kind) {
    case OP_ALLREDUCE:
        o->tmp = host_copy(o->send, bytes);
        MPI_Iallreduce(MPI_IN_PLACE, o->tmp, n, t, mpi_op(o->dt, o->op), c, &o->req);
        break;
    case OP_ALLGATHER:
        /* in place when send is recv's own part: copied first, so that is no case here */
        o->tmp = host_copy(NULL, (size_t)size * bytes);
        memcpy((char *)o->tmp + (size_t)me * bytes, o->send, bytes);
        MPI_Iallgather(MPI_IN_PLACE, n, t, o->tmp, n, t, c, &o->req);
        break;
    case OP_REDUCESCATTER:
        /* the whole input, then this rank's part of the sum at its start */
        o->tmp = host_copy(o->send, (size_t)size * bytes);
        MPI_Ireduce_scatter_block(MPI_IN_PLACE, o->tmp, n, t, mpi_op(o->dt, o->op), c, &o->req);
        break;
    case OP_REDUCE:
        o->tmp = host_copy(o->send, bytes);
        MPI_Ireduce(me == o->root ? MPI_IN_PLACE : o->tmp, me == o->root ? o->tmp : NULL, n, t,
                    mpi_op(o->dt, o->op), o->root, c, &o->req);
        break;
    case OP_BCAST:
        o->tmp = host_copy(me == o->root ? o->send : NULL, bytes);
        MPI_Ibcast(o->tmp, n, t, o->root, c, &o->req);
        break;
    case OP_SEND:
        o->tmp = host_copy(o->send, bytes);
        MPI_Isend(o->tmp, (int)bytes, MPI_BYTE, o->root, TAG_DATA, c, &o->req);
        break;
    default:
        o->tmp = host_copy(NULL, bytes);
        MPI_Irecv(o->tmp, (int)bytes, MPI_BYTE, o->root, TAG_DATA, c, &o->req);
        break;
    }
}

static int op_test(void *arg)
{
    Op *o = arg;
    int done = 0;
    MPI_Test(&o->req, &done, MPI_STATUS_IGNORE);
    return done;
}

/* Complete: the result into device memory (the emulator calls this inside its window). */
static void op_finish(void *arg)
{
    Op *o = arg;
    const size_t bytes = o->count * type_bytes(o->dt);
    switch (o->kind) {
    case OP_ALLGATHER: memcpy(o->recv, o->tmp, (size_t)o->comm->nranks * bytes); break;
    case OP_REDUCE:
        if (o->comm->rank == o->root)
            memcpy(o->recv, o->tmp, bytes);
        break;
    case OP_SEND: break;
    default: memcpy(o->recv, o->tmp, bytes); break;
    }
    free(o->tmp);
    free(o);
}

/* ---- connecting a pair: NCCL's lazy point-to-point setup ----
 *
 * NCCL connects two ranks of a communicator for point-to-point at their first ncclSend or
 * ncclRecv to each other (at ncclGroupEnd inside a group), on the host: the call does not
 * return before the peer has made its own first call to this rank on the same communicator.
 * So a pipeline whose stages each post their first receive before any send, each direction on
 * its own communicator, deadlocks on a GPU at step 1: stage 0 waits in its receive on one
 * communicator for stage 1, which waits in its receive on the other. Played here: the first
 * point-to-point call between a pair exchanges a message with the peer on the host, and a wait
 * longer than PX_NCCL_EMU_CONNECT_S seconds (60 by default) is that deadlock, reported and
 * aborted. The GPU goes on meanwhile (every stream's operations keep moving). */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Connects each send's and receive's pair (n operations, on any communicators) that is not
 * connected yet, all at once, as ncclGroupEnd does. */
static void connect_ops(Op *const *op, int n, const char *call)
{
    MPI_Request req[2 * GROUP_PEERS];
    Op *fresh[GROUP_PEERS];
    int nf = 0, nr = 0;
    static const char hello = 1;
    char back[GROUP_PEERS];
    for (int i = 0; i < n; i++) {
        Op *o = op[i];
        if ((o->kind != OP_SEND && o->kind != OP_RECV) || o->comm->connected[o->root])
            continue;
        int dup = 0;
        for (int j = 0; j < nf && !dup; j++)
            dup = fresh[j]->comm == o->comm && fresh[j]->root == o->root;
        if (dup)
            continue;
        if (nf == GROUP_PEERS) {
            fprintf(stderr, "parallax: nccl_emu: more than %d new pairs in one group\n",
                    GROUP_PEERS);
            abort();
        }
        fresh[nf] = o;
        MPI_Isend(&hello, 1, MPI_CHAR, o->root, TAG_CONNECT, o->comm->comm, &req[nr++]);
        MPI_Irecv(&back[nf], 1, MPI_CHAR, o->root, TAG_CONNECT, o->comm->comm, &req[nr++]);
        nf++;
    }
    if (nf == 0)
        return;
    const char *lim = getenv("PX_NCCL_EMU_CONNECT_S");
    const double limit_s = lim && atof(lim) > 0 ? atof(lim) : 60.0, t0 = now_s();
    for (;;) {
        int done = 0;
        MPI_Testall(nr, req, &done, MPI_STATUSES_IGNORE);
        if (done)
            break;
        kern_emu_progress();
        if (now_s() - t0 > limit_s) {
            int world = 0, peer = fresh[0]->root, peer_world = -1;
            MPI_Comm_rank(MPI_COMM_WORLD, &world);
            MPI_Group g, wg;
            MPI_Comm_group(fresh[0]->comm->comm, &g);
            MPI_Comm_group(MPI_COMM_WORLD, &wg);
            MPI_Group_translate_ranks(g, 1, &peer, wg, &peer_world);
            MPI_Group_free(&g);
            MPI_Group_free(&wg);
            fprintf(stderr,
                    "parallax: nccl_emu: world rank %d (rank %d of a communicator of %d) has "
                    "waited %.0f s in its first %s with world rank %d: NCCL connects a pair at its "
                    "first point-to-point call and blocks the host until the peer makes its own "
                    "on the same communicator, so a peer that waits elsewhere (in its own first "
                    "receive on another communicator, say) deadlocks both on a GPU; connect the "
                    "pair first (a small send and receive in a group after ncclCommInitRank)\n",
                    world, fresh[0]->comm->rank, fresh[0]->comm->nranks, limit_s, call,
                    peer_world);
            abort();
        }
        const struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
    for (int j = 0; j < nf; j++)
        fresh[j]->comm->connected[fresh[j]->root] = 1;
}

/* The sends and receives of an ncclGroupStart/End pair, started together as one stream
 * operation at ncclGroupEnd (as NCCL fuses them): one by one, two ranks that each send the other
 * a message above MPI's eager limit would each wait at their send for a receive the other has
 * not posted yet (an all-to-all-v deadlocked so). */
typedef struct {
    Op **op;
    int n, cap;
    cudaStream_t stream;
} Group;

static Group group; /* the open group's sends and receives */
static int group_depth;

static void group_start(void *arg)
{
    Group *g = arg;
    for (int i = 0; i < g->n; i++)
        op_start(g->op[i]);
}

static int group_test(void *arg)
{
    Group *g = arg;
    int all = 1;
    for (int i = 0; i < g->n; i++)
        all &= op_test(g->op[i]);
    return all;
}

static void group_finish(void *arg)
{
    Group *g = arg;
    for (int i = 0; i < g->n; i++)
        op_finish(g->op[i]);
    free(g->op);
    free(g);
}

/* o joins the open group; ncclInvalidUsage when the group's operations are on other streams */
static ncclResult_t group_add(Op *o, cudaStream_t stream)
{
    if (group.n > 0 && group.stream != stream)
        return ncclInvalidUsage;
    if (group.n == group.cap) {
        const int cap = group.cap ? 2 * group.cap : 16;
        Op **p = realloc(group.op, (size_t)cap * sizeof *p);
        if (!p)
            return ncclSystemError;
        group.op = p;
        group.cap = cap;
    }
    group.stream = stream;
    group.op[group.n++] = o;
    return ncclSuccess;
}

static ncclResult_t enqueue(int kind, const void *send, void *recv, size_t count,
                            ncclDataType_t dt, ncclRedOp_t op, int root, ncclComm_t comm,
                            cudaStream_t stream)
{
    if (!comm || count * type_bytes(dt) > (size_t)INT_MAX)
        return ncclInvalidArgument;
    Op *o = calloc(1, sizeof *o);
    if (!o)
        return ncclSystemError;
    o->kind = kind;
    o->send = send;
    o->recv = recv;
    o->count = count;
    o->dt = dt;
    o->op = op;
    o->root = root;
    o->comm = comm;
    if ((kind == OP_SEND || kind == OP_RECV) && (root < 0 || root >= comm->nranks)) {
        free(o);
        return ncclInvalidArgument;
    }
    if (group_depth > 0 && (kind == OP_SEND || kind == OP_RECV)) {
        ncclResult_t r = group_add(o, stream);
        if (r != ncclSuccess)
            free(o);
        return r;
    }
    if (kind == OP_SEND || kind == OP_RECV)
        connect_ops(&o, 1, kind == OP_SEND ? "ncclSend" : "ncclRecv");
    kern_emu_enqueue_op(stream, op_start, op_test, op_finish, o);
    return ncclSuccess;
}

/* ---- the API ---- */

enum { ID_MAGIC = 0x4d455850 }; /* "PXEM" */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static int32_t counter;
    int32_t f[3] = {ID_MAGIC, 0, ++counter};
    MPI_Comm_rank(MPI_COMM_WORLD, &f[1]);
    memset(id, 0, sizeof *id);
    memcpy(id->internal, f, sizeof f);
    return ncclSuccess;
}

/* The members find each other through the id's creator, whose world rank the id holds: each
 * tells it its (rank, world rank), it answers with the whole list, and the list becomes an MPI
 * communicator (MPI_Comm_create_group: collective over the members only). The creator must be
 * a member. */
ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    int32_t f[3];
    memcpy(f, id.internal, sizeof f);
    if (f[0] != ID_MAGIC || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    const int root = f[1], tag = 20000 + (int)((f[2] * 37u + (unsigned)root) % 10000u);
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    int *list = calloc((size_t)nranks, sizeof *list);
    if (!list)
        return ncclSystemError;
    if (world == root) {
        list[rank] = world;
        for (int i = 1; i < nranks; i++) {
            int m[2];
            MPI_Recv(m, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (m[0] < 0 || m[0] >= nranks) {
                free(list);
                return ncclInvalidUsage;
            }
            list[m[0]] = m[1];
        }
        for (int i = 0; i < nranks; i++)
            if (list[i] != world)
                MPI_Send(list, nranks, MPI_INT, list[i], tag, MPI_COMM_WORLD);
    } else {
        int m[2] = {rank, world};
        MPI_Send(m, 2, MPI_INT, root, tag, MPI_COMM_WORLD);
        MPI_Recv(list, nranks, MPI_INT, root, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    MPI_Group wg, g;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_incl(wg, nranks, list, &g);
    free(list);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return ncclSystemError;
    int e = MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->comm);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    if (e != MPI_SUCCESS) {
        free(c);
        return ncclSystemError;
    }
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->nranks);
    c->connected = calloc((size_t)c->nranks, 1);
    if (!c->connected) {
        MPI_Comm_free(&c->comm);
        free(c);
        return ncclSystemError;
    }
    *out = c;
    return c->rank == rank ? ncclSuccess : ncclInternalError;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm) {
        MPI_Comm_free(&comm->comm);
        free(comm->connected);
        free(comm);
    }
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown result code";
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return enqueue(OP_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return enqueue(OP_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    return enqueue(OP_REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_BCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_SEND, sendbuff, NULL, count, datatype, ncclSum, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(OP_RECV, NULL, recvbuff, count, datatype, ncclSum, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0)
        return ncclInvalidUsage;
    if (--group_depth > 0 || group.n == 0)
        return ncclSuccess;
    Group *g = malloc(sizeof *g);
    if (!g)
        return ncclSystemError;
    *g = group;
    memset(&group, 0, sizeof group);
    connect_ops(g->op, g->n, "ncclSend/ncclRecv (ncclGroupEnd)");
    kern_emu_enqueue_op(g->stream, group_start, group_test, group_finish, g);
    return ncclSuccess;
}
