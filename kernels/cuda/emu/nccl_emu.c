/* nccl_emu: see include/nccl.h. Every rank is a process of an mpirun job and its "device"
 * memory is its own heap (kernels/cuda/emu), so an NCCL call becomes the matching non-blocking
 * MPI call on the communicator's MPI communicator, issued when its stream gets to it and
 * completed when MPI says so. Activations in bf16 and fp16 are reduced by MPI operations that
 * add (or compare) in fp32 and round back, as NCCL's kernels do. */
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/px.h"
#include "kernels/cuda/emu/include/nccl.h"

struct ncclComm {
    MPI_Comm comm;
    int rank, nranks;
};

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

/* ---- operations on streams ---- */

static void op_start(void *arg)
{
    Op *o = arg;
    const MPI_Comm c = o->comm->comm;
    const int n = (int)o->count, me = o->comm->rank, size = o->comm->nranks;
    const size_t es = type_bytes(o->dt);
    const MPI_Datatype t = mpi_type(o->dt);
    switch (o->kind) {
    case OP_ALLREDUCE:
        MPI_Iallreduce(o->send == o->recv ? MPI_IN_PLACE : o->send, o->recv, n, t,
                       mpi_op(o->dt, o->op), c, &o->req);
        break;
    case OP_ALLGATHER:
        MPI_Iallgather((const char *)o->send == (char *)o->recv + (size_t)me * o->count * es
                           ? MPI_IN_PLACE
                           : o->send,
                       n, t, o->recv, n, t, c, &o->req);
        break;
    case OP_REDUCESCATTER: {
        /* NCCL's in place (recv is this rank's part of send) is not MPI's: reduce a copy */
        const void *in = o->send;
        const size_t bytes = (size_t)size * o->count * es;
        const char *r = o->recv, *s = o->send;
        if (r + o->count * es > s && r < s + bytes) {
            o->tmp = malloc(bytes ? bytes : 1);
            memcpy(o->tmp, o->send, bytes);
            in = o->tmp;
        }
        MPI_Ireduce_scatter_block(in, o->recv, n, t, mpi_op(o->dt, o->op), c, &o->req);
        break;
    }
    case OP_REDUCE:
        if (me == o->root)
            MPI_Ireduce(o->send == o->recv ? MPI_IN_PLACE : o->send, o->recv, n, t,
                        mpi_op(o->dt, o->op), o->root, c, &o->req);
        else
            MPI_Ireduce(o->send, NULL, n, t, mpi_op(o->dt, o->op), o->root, c, &o->req);
        break;
    case OP_BCAST:
        if (me == o->root && o->send != o->recv)
            memmove(o->recv, o->send, o->count * es);
        MPI_Ibcast(o->recv, n, t, o->root, c, &o->req);
        break;
    case OP_SEND:
        MPI_Isend(o->send, (int)(o->count * es), MPI_BYTE, o->root, 0, c, &o->req);
        break;
    default:
        MPI_Irecv(o->recv, (int)(o->count * es), MPI_BYTE, o->root, 0, c, &o->req);
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

static void op_finish(void *arg)
{
    Op *o = arg;
    free(o->tmp);
    free(o);
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
    if (group_depth > 0 && (kind == OP_SEND || kind == OP_RECV)) {
        ncclResult_t r = group_add(o, stream);
        if (r != ncclSuccess)
            free(o);
        return r;
    }
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
    *out = c;
    return c->rank == rank ? ncclSuccess : ncclInternalError;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (comm) {
        MPI_Comm_free(&comm->comm);
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
    kern_emu_enqueue_op(g->stream, group_start, group_test, group_finish, g);
    return ncclSuccess;
}
