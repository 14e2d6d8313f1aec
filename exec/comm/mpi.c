/* The MPI communication layer: the process grid of a layout in Megatron-Core's rank order
 * (rank = tp + TP*(cp + CP*(dp + DP*pp)), model_rank), one communicator per group, and the raw
 * operations over them (comm.c counts them and decides the groups of one). The MPI process
 * itself too: starting it, agreeing before the groups exist, aborting, finishing.
 *
 * Groups: tp (ranks of one stage and data-parallel replica), cp, dp x cp (the gradient
 * reduction and ZeRO group, ordered cp fastest so that its rank is the ZeRO shard index), the
 * tied-embedding pair (stage 0 and the last stage of one (tp, cp, dp)), and point to point on
 * the world communicator for the pipeline.
 *
 * Waiting: MPI progresses only inside its calls and its own waits spin. On an oversubscribed
 * node (more ranks than cores, as the tests run 8 ranks on 2) a spinning rank steals the core
 * of the rank it waits for, so there every wait polls with MPI_Test and sleeps between polls
 * (doubling from a few microseconds to a quarter of a millisecond); otherwise MPI's blocking
 * calls are used. PARALLAX_POLL=0/1 overrides the choice.
 *
 * Timeouts: with a communication timeout (comm_set_timeout, --comm-timeout) every wait is a
 * loop of MPI_Test, blocking collectives included (started non-blocking), which reads the clock
 * every few dozen tests; a wait that outlasts the timeout names the rank, its step, the
 * operation and its group, and ends the job with MPI_Abort, so that a lost or stalled rank never
 * leaves the others waiting forever. MPI_Wait spins as much, so this costs nothing measurable.
 * Without MPI at build time the functions below are stubs that say so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/comm/backend.h"

int comm_group_splits(const ModelLayout *l, int rank, int tied_pair, int undefined,
                      CommGroupSplit split[COMM_SPLITS])
{
    int tp, cp, dp, pp;
    model_rank_coords(l, rank, &tp, &cp, &dp, &pp);
    int etp, ep, edp, epp;
    model_expert_coords(l, rank, &etp, &ep, &edp, &epp);
    const int n_etp = l->etp > 0 ? l->etp : l->tp, n_ep = l->ep > 0 ? l->ep : 1;
    const int n_edp = l->tp * l->cp * l->dp / (n_etp * n_ep);
    /* HSDP: dp = shard + dp_shard x replica; without it one replica of dp shards */
    const int n_shard = l->dp_shard > 0 ? l->dp_shard : l->dp, n_rep = l->dp / n_shard;
    const int shard = dp % n_shard, rep = dp / n_shard;
    int n = 0;
    split[n++] = (CommGroupSplit){MODEL_GROUP_TP, cp + l->cp * (dp + l->dp * pp), tp};
    split[n++] = (CommGroupSplit){MODEL_GROUP_CP, tp + l->tp * (dp + l->dp * pp), cp};
    split[n++] = (CommGroupSplit){MODEL_GROUP_DP, tp + l->tp * (pp + l->pp * rep), cp + l->cp * shard};
    split[n] = (CommGroupSplit){MODEL_GROUP_EMBED, undefined, pp};
    /* the first stage and the one holding the other copy: the last, or the prediction
     * modules' own stage (a layout string's m before L: exec/train/mtp.c) unless that is the
     * first (they read the embedding there; a tied model's copy is the last stage's); with
     * three copies (tied_pair 2) both */
    const int mtp_stage = (l->pp * l->vpp - 1 - l->mtp_from_last) % l->pp;
    const int peer = l->mtp_from_last > 0 && mtp_stage != 0 ? mtp_stage : l->pp - 1;
    if (tied_pair && l->pp > 1 && (pp == 0 || pp == peer || (tied_pair == 2 && pp == l->pp - 1)))
        split[n].color = tp + l->tp * (cp + l->cp * dp);
    n++;
    if (n_rep > 1)
        split[n++] = (CommGroupSplit){MODEL_GROUP_DPR, tp + l->tp * (cp + l->cp * (shard + n_shard * pp)), rep};
    if (comm_group_alias(l, MODEL_GROUP_EDP) != MODEL_GROUP_EDP)
        return n;
    split[n++] = (CommGroupSplit){MODEL_GROUP_EP, etp + n_etp * (edp + n_edp * pp), ep};
    split[n++] = (CommGroupSplit){MODEL_GROUP_ETP, ep + n_ep * (edp + n_edp * pp), etp};
    split[n++] = (CommGroupSplit){MODEL_GROUP_EDP, etp + n_etp * (ep + n_ep * pp), edp};
    if (comm_group_alias(l, MODEL_GROUP_ETP_EP) == MODEL_GROUP_ETP_EP)
        split[n++] = (CommGroupSplit){MODEL_GROUP_ETP_EP, edp + n_edp * pp, etp + n_etp * ep};
    return n;
}

#ifdef PX_HAVE_MPI

#include <mpi.h>
#include <time.h>
#include <unistd.h>

int comm_mpi_available(void) { return 1; }

/* Launched as one rank of a job? OpenMPI's mpirun, PMIx (OpenMPI 4, srun --mpi=pmix), PMI-1/2
 * (MPICH's hydra, srun --mpi=pmi2); PARALLAX_MPI=1 forces it, =0 refuses it. */
static int launched(void)
{
    const char *force = getenv("PARALLAX_MPI");
    if (force && *force)
        return strcmp(force, "0") != 0;
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

int comm_mpi_start(int *argc, char ***argv, int *rank, int *world)
{
    *rank = 0;
    *world = 1;
    if (!launched())
        return 0;
    int provided = 0;
    /* the data loader thread never calls MPI: the main thread alone does */
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return 0;
    /* errors come back as statuses so that the message names the rank and the operation */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    return 1;
}

void comm_mpi_abort(int code)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Abort(MPI_COMM_WORLD, code);
}

void comm_mpi_finish(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Finalize();
}

int comm_mpi_agree(int status, int *first_rank)
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* MAXLOC keeps the lowest rank among equal values: the worst status, first rank with it */
    struct {
        int value, index;
    } in = {status, rank}, out = {status, rank};
    if (MPI_Allreduce(&in, &out, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD) != MPI_SUCCESS)
        return status ? status : PX_ERUNTIME;
    if (first_rank)
        *first_rank = out.index;
    return out.value;
}

enum { MPI_REQS = 1024 };

typedef struct {
    MPI_Request r;
    int active;
    /* the in-place reduce-scatter leaves the sum at the start of the buffer: moved to the
     * owner's offset on completion */
    char *move_dst;
    const char *move_src;
    size_t move_bytes;
    int *counts, *displs; /* [dp group] vector collectives read them until they complete */
    ModelComm kind;       /* for the timeout's message */
} Req;

typedef struct {
    CommLayer base; /* first: the raw operations cast back */
    MPI_Comm group[COMM_GROUPS]; /* by ModelGroup; pp: the world (point to point) */
    Req *reqs;
    int poll;
    int tag_ub;
    int *bcounts, *bdispls; /* the arrays of a blocking sharded call */
    int *a2a; /* [4][world]: an all-to-all-v's send counts and offsets, receive counts and offsets */
    MPI_Op sum16[2], max16[2]; /* bf16, fp16: MPI has no 16-bit floats */
} MpiComm;

/* Reductions of 16-bit floats (activations under tensor parallelism, as NCCL reduces them):
 * each pair is combined in fp32 and rounded back, once per combination. */
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
/* common/px.h's conversions, by the CUDA intrinsics' (and kernels/cuda/emu's) rules */
HALF_OP(bf16_sum, px_bf16_to_float, px_float_to_bf16, x + y)
HALF_OP(fp16_sum, px_half_to_float, px_float_to_half, x + y)
HALF_OP(bf16_max, px_bf16_to_float, px_float_to_bf16, x > y || y != y ? x : y)
HALF_OP(fp16_max, px_half_to_float, px_float_to_half, x > y || y != y ? x : y)

static int mpi_fail(PxError *err, int code, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", code);
    return px_fail(err, PX_ERUNTIME, "%s: %s", what, msg);
}

static void sleep_ns(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* What a wait is for: an operation of a kind (its group follows) or a world-wide one. */
typedef struct {
    const char *op, *group;
} Waiting;

static Waiting waiting_kind(ModelComm kind)
{
    Waiting w = {model_comm_name(kind), model_group_name(model_comm_group(kind))};
    return w;
}

static Waiting waiting_world(const char *op)
{
    Waiting w = {op, "world"};
    return w;
}

/* The wait outlasted the timeout: say so and end the job (no return). */
static void timed_out(const MpiComm *m, Waiting w)
{
    char step[32];
    if (m->base.step > 0)
        snprintf(step, sizeof step, "step %d", m->base.step);
    else
        snprintf(step, sizeof step, "at start");
    fprintf(stderr,
            "parallax-worker: rank %d: %s: %s on the %s group did not complete within %g s "
            "(--comm-timeout): a rank is lost or stalled; ending the job\n",
            m->base.rank, step, w.op, w.group, m->base.timeout_s);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort(); /* MPI_Abort does not return */
}

/* Blocking calls start non-blocking and complete here when waits poll or have a timeout. */
static int nonblocking(const MpiComm *m) { return m->poll || m->base.timeout_s > 0; }

/* Completes one request: MPI's wait; polling with sleeps on an oversubscribed node; a loop of
 * tests that reads the clock every 64 of them under a timeout. */
static int complete(MpiComm *m, MPI_Request *r, Waiting w)
{
    if (!nonblocking(m))
        return MPI_Wait(r, MPI_STATUS_IGNORE);
    const double limit = m->base.timeout_s;
    double t0 = 0;
    long ns = 2000;
    for (int spins = 0;; spins++) {
        int done = 0;
        int e = MPI_Test(r, &done, MPI_STATUS_IGNORE);
        if (e != MPI_SUCCESS || done)
            return e;
        if (limit > 0 && (spins % 64 == 0 || (m->poll && spins >= 16))) {
            const double now = px_now_s();
            if (spins == 0)
                t0 = now;
            else if (now - t0 > limit)
                timed_out(m, w);
        }
        if (!m->poll || spins < 16)
            continue;
        sleep_ns(ns);
        if (ns < 250000)
            ns *= 2;
    }
}

static int dtype_of(PxDtype t, MPI_Datatype *out, PxError *err)
{
    switch (t) {
    case PX_FP32: *out = MPI_FLOAT; return PX_OK;
    case PX_INT32: *out = MPI_INT; return PX_OK;
    case PX_BF16:
    case PX_FP16: *out = MPI_UINT16_T; return PX_OK; /* the reductions take op_of's */
    case PX_FP8: *out = MPI_UINT8_T; return PX_OK; /* moved, never reduced */
    case PX_UINT8: *out = MPI_UINT8_T; return PX_OK; /* the all-gather dispatcher's routing map */
    default:
        return px_fail(err, PX_ERUNTIME, "the MPI layer has no %s collectives", px_dtype_name(t));
    }
}

static MPI_Op op_of(const MpiComm *m, PxDtype t, CommRedOp op)
{
    if (t == PX_BF16 || t == PX_FP16)
        return op == COMM_MAX ? m->max16[t == PX_FP16] : m->sum16[t == PX_FP16];
    return op == COMM_MAX ? MPI_MAX : MPI_SUM;
}

static int count_of(size_t n, int *out, PxError *err)
{
    if (n > 0x7fffffff)
        return px_fail(err, PX_ERUNTIME, "%zu elements exceed one MPI call's count", n);
    *out = (int)n;
    return PX_OK;
}

static MPI_Comm comm_of(MpiComm *m, ModelComm kind) { return m->group[model_comm_group(kind)]; }

/* A free request slot for a non-blocking call (req != NULL), or NULL for a blocking one. */
static Req *slot(MpiComm *m, int *req, int *idx, PxError *err)
{
    if (!req) {
        *idx = -1;
        return NULL;
    }
    for (int i = 0; i < MPI_REQS; i++)
        if (!m->reqs[i].active) {
            Req *q = &m->reqs[i];
            q->active = 1;
            q->move_dst = NULL;
            q->move_src = NULL;
            q->move_bytes = 0;
            *idx = i;
            return q;
        }
    px_fail(err, PX_ERUNTIME, "more than %d communication operations pending at once", MPI_REQS);
    *idx = -2;
    return NULL;
}

static void finish_req(Req *q)
{
    if (q->move_dst && q->move_bytes > 0 && q->move_dst != q->move_src)
        memmove(q->move_dst, q->move_src, q->move_bytes);
    q->active = 0;
}

/* After starting a call: a non-blocking one is handed out, a blocking one (in poll mode
 * started as non-blocking too) is completed here. */
static int started(MpiComm *m, Req *q, int idx, int *req, MPI_Request *local, int e,
                   ModelComm kind, PxError *err)
{
    const char *what = model_comm_name(kind);
    if (e != MPI_SUCCESS) {
        if (q)
            q->active = 0;
        return mpi_fail(err, e, what);
    }
    if (q) {
        q->kind = kind;
        *req = idx;
        return PX_OK;
    }
    if (local) {
        e = complete(m, local, waiting_kind(kind));
        if (e != MPI_SUCCESS)
            return mpi_fail(err, e, what);
    }
    return PX_OK;
}

static int m_allreduce(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                       ModelComm kind, int *req, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    MPI_Datatype t = MPI_FLOAT;
    int n = 0, rc, idx;
    if ((rc = dtype_of(dtype, &t, err)) || (rc = count_of(count, &n, err)))
        return rc;
    Req *q = slot(m, req, &idx, err);
    if (idx == -2)
        return PX_ERUNTIME;
    MPI_Op o = op_of(m, dtype, op);
    MPI_Request local;
    int e;
    if (q)
        e = MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, o, comm_of(m, kind), &q->r);
    else if (nonblocking(m))
        e = MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, o, comm_of(m, kind), &local);
    else
        e = MPI_Allreduce(MPI_IN_PLACE, buf, n, t, o, comm_of(m, kind));
    return started(m, q, idx, req, !q && nonblocking(m) ? &local : NULL, e, kind, err);
}

static int m_all_gather(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                        ModelComm kind, int *req, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    const size_t es = px_dtype_bytes(dtype);
    MPI_Datatype t = MPI_FLOAT;
    int n = 0, rc, idx;
    if ((rc = dtype_of(dtype, &t, err)) || (rc = count_of(count, &n, err)))
        return rc;
    Req *q = slot(m, req, &idx, err);
    if (idx == -2)
        return PX_ERUNTIME;
    const int me = c->group_rank[model_comm_group(kind)];
    const void *src = in == (const char *)out + (size_t)me * count * es ? MPI_IN_PLACE : in;
    MPI_Request local;
    int e;
    if (q)
        e = MPI_Iallgather(src, n, t, out, n, t, comm_of(m, kind), &q->r);
    else if (nonblocking(m))
        e = MPI_Iallgather(src, n, t, out, n, t, comm_of(m, kind), &local);
    else
        e = MPI_Allgather(src, n, t, out, n, t, comm_of(m, kind));
    return started(m, q, idx, req, !q && nonblocking(m) ? &local : NULL, e, kind, err);
}

static int m_reduce_scatter(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                            ModelComm kind, int *req, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    MPI_Datatype t = MPI_FLOAT;
    int n = 0, rc, idx;
    if ((rc = dtype_of(dtype, &t, err)) || (rc = count_of(count, &n, err)))
        return rc;
    Req *q = slot(m, req, &idx, err);
    if (idx == -2)
        return PX_ERUNTIME;
    /* in place (out == in): MPI leaves the sum at the start of the buffer, as promised */
    const void *src = out == in ? MPI_IN_PLACE : in;
    MPI_Request local;
    int e;
    MPI_Op o = op_of(m, dtype, COMM_SUM);
    if (q)
        e = MPI_Ireduce_scatter_block(src, out, n, t, o, comm_of(m, kind), &q->r);
    else if (nonblocking(m))
        e = MPI_Ireduce_scatter_block(src, out, n, t, o, comm_of(m, kind), &local);
    else
        e = MPI_Reduce_scatter_block(src, out, n, t, o, comm_of(m, kind));
    return started(m, q, idx, req, !q && nonblocking(m) ? &local : NULL, e, kind, err);
}

/* The counts and offsets of a block of numel elements in shards of `shard`. */
static void shard_counts(int g, size_t numel, size_t shard, int *counts, int *displs)
{
    for (int i = 0; i < g; i++) {
        size_t off = (size_t)i * shard;
        size_t n = off >= numel ? 0 : numel - off < shard ? numel - off : shard;
        counts[i] = (int)n;
        displs[i] = (int)(off < numel ? off : numel);
    }
}

static int shard_call(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                      ModelComm kind, int *req, int gather, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    const ModelGroup grp = model_comm_group(kind); /* dp x cp, or a MoE layer's experts' edp */
    const int g = c->group_size[grp];
    MPI_Datatype t = MPI_FLOAT;
    int n = 0, rc, idx;
    if ((rc = dtype_of(dtype, &t, err)) || (rc = count_of(shard * (size_t)g, &n, err)))
        return rc;
    Req *q = slot(m, req, &idx, err);
    if (idx == -2)
        return PX_ERUNTIME;
    int *counts = q ? q->counts : m->bcounts, *displs = q ? q->displs : m->bdispls;
    shard_counts(g, numel, shard, counts, displs);
    const size_t es = px_dtype_bytes(dtype);
    const int me = c->group_rank[grp];
    MPI_Comm comm = m->group[grp];
    MPI_Request local;
    MPI_Request *rp = q ? &q->r : &local;
    int e;
    if (gather) {
        if (q || nonblocking(m))
            e = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, t, comm, rp);
        else
            e = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, t, comm);
    } else {
        if (q || nonblocking(m))
            e = MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, t, op_of(m, dtype, COMM_SUM), comm,
                                    rp);
        else
            e = MPI_Reduce_scatter(MPI_IN_PLACE, buf, counts, t, op_of(m, dtype, COMM_SUM), comm);
    }
    Req done = {0};
    Req *mv = q ? q : &done;
    if (!gather && counts[me] > 0) {
        mv->move_dst = (char *)buf + (size_t)displs[me] * es;
        mv->move_src = buf;
        mv->move_bytes = (size_t)counts[me] * es;
    }
    rc = started(m, q, idx, req, !q && nonblocking(m) ? &local : NULL, e, kind, err);
    if (!rc && !q)
        finish_req(mv);
    return rc;
}

static int m_reduce_scatter_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                                  PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return shard_call(c, buf, numel, shard, dtype, kind, req, 0, err);
}

static int m_all_gather_shard(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                              ModelComm kind, int *req, PxError *err)
{
    return shard_call(c, buf, numel, shard, dtype, kind, req, 1, err);
}

static int p2p(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind, int *req,
               int send, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    int n = 0, rc, idx;
    if ((rc = count_of(bytes, &n, err)))
        return rc;
    if (peer < 0 || peer >= c->world)
        return px_fail(err, PX_ERUNTIME, "no rank %d in a job of %d", peer, c->world);
    Req *q = slot(m, req, &idx, err);
    if (idx == -2)
        return PX_ERUNTIME;
    MPI_Request local;
    MPI_Request *rp = q ? &q->r : &local;
    /* tags beyond MPI_TAG_UB wrap: messages of one pair still match in posting order */
    int t = (int)((unsigned)tag % ((unsigned)m->tag_ub + 1u));
    int e = send ? MPI_Isend(buf, n, MPI_BYTE, peer, t, MPI_COMM_WORLD, rp)
                 : MPI_Irecv(buf, n, MPI_BYTE, peer, t, MPI_COMM_WORLD, rp);
    char what[64];
    snprintf(what, sizeof what, "%s with rank %d", send ? "send" : "receive", peer);
    if (e != MPI_SUCCESS) {
        if (q)
            q->active = 0;
        return mpi_fail(err, e, what);
    }
    if (q) {
        q->kind = kind;
        *req = idx;
        return PX_OK;
    }
    e = complete(m, &local, waiting_kind(kind));
    return e == MPI_SUCCESS ? PX_OK : mpi_fail(err, e, what);
}

static int m_send(CommLayer *c, const void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                  int *req, PxError *err)
{
    return p2p(c, (void *)buf, bytes, peer, tag, kind, req, 1, err);
}

static int m_recv(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                  int *req, PxError *err)
{
    return p2p(c, buf, bytes, peer, tag, kind, req, 0, err);
}

static int m_wait(CommLayer *c, int *req, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    Req *q = &m->reqs[*req];
    *req = -1;
    if (!q->active)
        return PX_OK;
    int e = complete(m, &q->r, waiting_kind(q->kind));
    if (e != MPI_SUCCESS) {
        q->active = 0;
        return mpi_fail(err, e, "waiting for a communication");
    }
    finish_req(q);
    return PX_OK;
}

static void m_progress(CommLayer *c)
{
    int flag = 0;
    (void)c;
    /* any MPI call drives the progress engine; probing the world is the cheapest */
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}

static int m_control(CommLayer *c, double *vals, int n, CommRedOp op, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    MPI_Op o = op == COMM_MAX ? MPI_MAX : MPI_SUM;
    int e;
    if (nonblocking(m)) {
        MPI_Request r;
        e = MPI_Iallreduce(MPI_IN_PLACE, vals, n, MPI_DOUBLE, o, MPI_COMM_WORLD, &r);
        if (e == MPI_SUCCESS)
            e = complete(m, &r, waiting_world("the control reduction"));
    } else {
        e = MPI_Allreduce(MPI_IN_PLACE, vals, n, MPI_DOUBLE, o, MPI_COMM_WORLD);
    }
    return e == MPI_SUCCESS ? PX_OK : mpi_fail(err, e, "control reduction");
}

static int m_gather_text(CommLayer *c, const char *text, char ***out, PxError *err)
{
    const int W = c->world, me = c->rank;
    *out = NULL;
    size_t len = strlen(text);
    int n;
    int rc = count_of(len, &n, err);
    if (rc)
        return rc;
    int *lens = me == 0 ? calloc((size_t)W, sizeof *lens) : NULL;
    int *displs = me == 0 ? calloc((size_t)W, sizeof *displs) : NULL;
    if (me == 0 && (!lens || !displs)) {
        free(lens);
        free(displs);
        /* the others are in the gather: a rank that cannot take part must end the job */
        return px_fail(err, PX_ERUNTIME, "out of memory gathering the ranks' figures");
    }
    MpiComm *m = (MpiComm *)c;
    const Waiting w = waiting_world("gathering the ranks' figures");
    MPI_Request rq;
    int e;
    if (nonblocking(m)) {
        e = MPI_Igather(&n, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq);
        if (e == MPI_SUCCESS)
            e = complete(m, &rq, w);
    } else {
        e = MPI_Gather(&n, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    char *all = NULL;
    if (e == MPI_SUCCESS && me == 0) {
        long long total = 0;
        for (int r = 0; r < W; r++) {
            displs[r] = (int)total;
            total += lens[r];
        }
        if (total > 0x7fffffff || !(all = malloc((size_t)total + 1))) {
            free(lens);
            free(displs);
            return px_fail(err, PX_ERUNTIME, "cannot gather %lld bytes of the ranks' figures", total);
        }
    }
    if (e == MPI_SUCCESS && nonblocking(m)) {
        e = MPI_Igatherv(text, n, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, MPI_COMM_WORLD, &rq);
        if (e == MPI_SUCCESS)
            e = complete(m, &rq, w);
    } else if (e == MPI_SUCCESS) {
        e = MPI_Gatherv(text, n, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, MPI_COMM_WORLD);
    }
    if (e != MPI_SUCCESS) {
        free(lens);
        free(displs);
        free(all);
        return mpi_fail(err, e, "gathering the ranks' figures");
    }
    if (me != 0)
        return PX_OK;
    char **a = calloc((size_t)W, sizeof *a);
    for (int r = 0; a && r < W; r++) {
        a[r] = malloc((size_t)lens[r] + 1);
        if (!a[r]) {
            for (int k = 0; k < r; k++)
                free(a[k]);
            free(a);
            a = NULL;
            break;
        }
        memcpy(a[r], all + displs[r], (size_t)lens[r]);
        a[r][lens[r]] = '\0';
    }
    free(lens);
    free(displs);
    free(all);
    if (!a)
        return px_fail(err, PX_ERUNTIME, "out of memory gathering the ranks' figures");
    *out = a;
    return PX_OK;
}

static int m_barrier(CommLayer *c, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    int e;
    if (nonblocking(m)) {
        MPI_Request r;
        e = MPI_Ibarrier(MPI_COMM_WORLD, &r);
        if (e == MPI_SUCCESS)
            e = complete(m, &r, waiting_world("the barrier"));
    } else {
        e = MPI_Barrier(MPI_COMM_WORLD);
    }
    return e == MPI_SUCCESS ? PX_OK : mpi_fail(err, e, "barrier");
}

static void m_free(CommLayer *c)
{
    MpiComm *m = (MpiComm *)c;
    if (!m)
        return;
    if (m->reqs) {
        for (int i = 0; i < MPI_REQS; i++) {
            if (m->reqs[i].active) {
                /* an error path left it pending: completing it may hang, cancelling may not
                 * be supported; freeing the handle lets MPI finish it on its own */
                MPI_Request_free(&m->reqs[i].r);
            }
            free(m->reqs[i].counts);
            free(m->reqs[i].displs);
        }
        free(m->reqs);
    }
    free(m->bcounts);
    free(m->bdispls);
    free(m->a2a);
    /* the expert groups may share the dense groups' communicators: each is freed once (a
     * freed handle becomes MPI_COMM_NULL, so the sharing is found before any is freed) */
    int alias[COMM_GROUPS] = {0};
    for (int g = 0; g < COMM_GROUPS; g++)
        for (int h = 0; h < g; h++)
            alias[g] |= m->group[g] != MPI_COMM_NULL && m->group[h] == m->group[g];
    for (int g = 0; g < COMM_GROUPS; g++)
        if (m->group[g] != MPI_COMM_NULL && m->group[g] != MPI_COMM_WORLD && !alias[g])
            MPI_Comm_free(&m->group[g]);
    for (int i = 0; i < 2; i++) {
        if (m->sum16[i] != MPI_OP_NULL)
            MPI_Op_free(&m->sum16[i]);
        if (m->max16[i] != MPI_OP_NULL)
            MPI_Op_free(&m->max16[i]);
    }
    free(m);
}

/* Counts of int64 elements per peer as MPI's int counts and packed offsets. */
static int a2a_arrays(const int64_t *counts, int g, int *cnt, int *displs, PxError *err)
{
    int64_t off = 0;
    for (int i = 0; i < g; i++) {
        if (counts[i] < 0 || counts[i] > 0x7fffffff || off > 0x7fffffff)
            return px_fail(err, PX_ERUNTIME, "all-to-all: %lld elements for rank %d of the group "
                           "do not fit one MPI call", (long long)counts[i], i);
        cnt[i] = (int)counts[i];
        displs[i] = (int)off;
        off += counts[i];
    }
    return PX_OK;
}

static int m_all_to_allv(CommLayer *c, void *out, const int64_t *recv_counts, const void *in,
                         const int64_t *send_counts, PxDtype dtype, ModelComm kind, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    const int g = comm_group_of(c, kind);
    int *sc = m->a2a, *sd = sc + c->world, *rc_ = sd + c->world, *rd = rc_ + c->world;
    MPI_Datatype t = MPI_FLOAT;
    int rc;
    if ((rc = dtype_of(dtype, &t, err)) || (rc = a2a_arrays(send_counts, g, sc, sd, err)) ||
        (rc = a2a_arrays(recv_counts, g, rc_, rd, err)))
        return rc;
    MPI_Request local;
    int e;
    if (nonblocking(m))
        e = MPI_Ialltoallv(in, sc, sd, t, out, rc_, rd, t, comm_of(m, kind), &local);
    else
        e = MPI_Alltoallv(in, sc, sd, t, out, rc_, rd, t, comm_of(m, kind));
    return started(m, NULL, -1, NULL, nonblocking(m) ? &local : NULL, e, kind, err);
}

static int m_all_to_all_counts(CommLayer *c, const int64_t *send, int64_t *recv, ModelComm kind,
                               PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    MPI_Request local;
    int e;
    if (nonblocking(m))
        e = MPI_Ialltoall(send, 1, MPI_INT64_T, recv, 1, MPI_INT64_T, comm_of(m, kind), &local);
    else
        e = MPI_Alltoall(send, 1, MPI_INT64_T, recv, 1, MPI_INT64_T, comm_of(m, kind));
    return started(m, NULL, -1, NULL, nonblocking(m) ? &local : NULL, e, kind, err);
}

/* In place, rank i's counts[i] elements packed in group order (ZeRO-3's FP8 parameter
 * gather, whose ranks hold unequal parts of a block's FP8 weights). */
static int m_all_gather_v(CommLayer *c, void *buf, const int64_t *counts, PxDtype dtype,
                          ModelComm kind, int *req, PxError *err)
{
    MpiComm *m = (MpiComm *)c;
    const int g = comm_group_of(c, kind);
    MPI_Datatype t = MPI_FLOAT;
    int rc, idx;
    if ((rc = dtype_of(dtype, &t, err)))
        return rc;
    Req *q = slot(m, req, &idx, err);
    if (idx == -2)
        return PX_ERUNTIME;
    int *cnt = q ? q->counts : m->bcounts, *displs = q ? q->displs : m->bdispls;
    if ((rc = a2a_arrays(counts, g, cnt, displs, err))) {
        if (q)
            q->active = 0;
        return rc;
    }
    MPI_Request local;
    int e;
    if (q || nonblocking(m))
        e = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, displs, t,
                            comm_of(m, kind), q ? &q->r : &local);
    else
        e = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, displs, t, comm_of(m, kind));
    return started(m, q, idx, req, !q && nonblocking(m) ? &local : NULL, e, kind, err);
}

static const CommOps mpi_ops = {
    .all_to_allv = m_all_to_allv,
    .all_to_all_counts = m_all_to_all_counts,
    .allreduce = m_allreduce,
    .all_gather = m_all_gather,
    .reduce_scatter = m_reduce_scatter,
    .reduce_scatter_shard = m_reduce_scatter_shard,
    .all_gather_shard = m_all_gather_shard,
    .all_gather_v = m_all_gather_v,
    .send = m_send,
    .recv = m_recv,
    .wait = m_wait,
    .progress = m_progress,
    .control = m_control,
    .gather_text = m_gather_text,
    .barrier = m_barrier,
    .free = m_free,
};

/* Ranks on this node beyond its cores? Then waits poll and sleep. */
static int oversubscribed(void)
{
    const char *force = getenv("PARALLAX_POLL");
    if (force && *force)
        return strcmp(force, "0") != 0;
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local)
        local = getenv("SLURM_NTASKS_PER_NODE");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return local && cores > 0 && atol(local) > cores;
}

void comm_mpi_local(int *local_rank, int *local_size)
{
    MPI_Comm node;
    *local_rank = 0;
    *local_size = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return;
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
}

enum { NODE_ID_BYTES = 64 };

int comm_mpi_node_sharing(const char *id, int failed, int *sharing)
{
    int local = 0, n = 1, mine[2] = {1, failed != 0}, all[2] = {1, failed != 0};
    MPI_Comm node;
    char me[NODE_ID_BYTES];
    snprintf(me, sizeof me, "%s", id);
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(node, &local);
        MPI_Comm_size(node, &n);
        char *ids = calloc((size_t)n, NODE_ID_BYTES);
        if (!ids) {
            /* the others wait in the gather below: end the job */
            fprintf(stderr, "parallax: out of memory comparing the GPUs of %d ranks\n", n);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (MPI_Allgather(me, NODE_ID_BYTES, MPI_CHAR, ids, NODE_ID_BYTES, MPI_CHAR, node) !=
            MPI_SUCCESS)
            mine[1] = 1;
        for (int i = 0; me[0] && i < n; i++)
            mine[0] += i != local && strncmp(ids + (size_t)i * NODE_ID_BYTES, me, NODE_ID_BYTES) == 0;
        free(ids);
        MPI_Comm_free(&node);
    }
    if (MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        all[1] = 1;
    *sharing = all[0];
    return all[1];
}

int comm_mpi(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err)
{
    *out = NULL;
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int need = l->tp * l->cp * l->dp * l->pp;
    if (need != world)
        return px_fail(err, PX_EINPUT,
                       "the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d) but the job has "
                       "%d: launch it with parallax run, or mpirun -n %d",
                       need, l->dp, l->tp, l->pp, l->cp, world, need);
    MpiComm *m = calloc(1, sizeof *m);
    Req *reqs = calloc(MPI_REQS, sizeof *reqs);
    if (!m || !reqs) {
        free(m);
        free(reqs);
        return px_fail(err, PX_ERUNTIME, "out of memory for the communication layer");
    }
    m->reqs = reqs;
    for (int i = 0; i < 2; i++)
        m->sum16[i] = m->max16[i] = MPI_OP_NULL;
    const int dpn = l->dp * l->cp;
    m->bcounts = calloc((size_t)dpn, sizeof(int));
    m->bdispls = calloc((size_t)dpn, sizeof(int));
    m->a2a = calloc(4 * (size_t)world, sizeof(int));
    for (int i = 0; i < MPI_REQS; i++) {
        reqs[i].counts = calloc((size_t)dpn, sizeof(int));
        reqs[i].displs = calloc((size_t)dpn, sizeof(int));
        if (!reqs[i].counts || !reqs[i].displs || !m->bcounts || !m->bdispls || !m->a2a) {
            for (int k = 0; k < COMM_GROUPS; k++)
                m->group[k] = MPI_COMM_NULL;
            m_free(&m->base);
            return px_fail(err, PX_ERUNTIME, "out of memory for the communication layer");
        }
    }
    for (int g = 0; g < COMM_GROUPS; g++)
        m->group[g] = MPI_COMM_NULL;
    int tp, cp, dp, pp;
    model_rank_coords(l, rank, &tp, &cp, &dp, &pp);
    /* one split per group; every rank takes part in every split (collective) */
    CommGroupSplit split[COMM_SPLITS];
    const int n_split = comm_group_splits(l, rank, tied_pair, MPI_UNDEFINED, split);
    int e = MPI_SUCCESS;
    for (int i = 0; i < n_split && e == MPI_SUCCESS; i++)
        e = MPI_Comm_split(MPI_COMM_WORLD, split[i].color, split[i].key, &m->group[split[i].group]);
    for (int g = MODEL_GROUP_ETP; g <= MODEL_GROUP_ETP_EP; g++)
        if (comm_group_alias(l, (ModelGroup)g) != (ModelGroup)g)
            m->group[g] = m->group[comm_group_alias(l, (ModelGroup)g)];
    if (e != MPI_SUCCESS) {
        m_free(&m->base);
        return mpi_fail(err, e, "creating the process groups");
    }
    m->group[MODEL_GROUP_PP] = MPI_COMM_WORLD;
    if (e == MPI_SUCCESS)
        e = MPI_Op_create(bf16_sum, 1, &m->sum16[0]);
    if (e == MPI_SUCCESS)
        e = MPI_Op_create(fp16_sum, 1, &m->sum16[1]);
    if (e == MPI_SUCCESS)
        e = MPI_Op_create(bf16_max, 1, &m->max16[0]);
    if (e == MPI_SUCCESS)
        e = MPI_Op_create(fp16_max, 1, &m->max16[1]);
    if (e != MPI_SUCCESS) {
        m_free(&m->base);
        return mpi_fail(err, e, "creating the 16-bit reductions");
    }
    CommLayer *c = &m->base;
    comm_layer_init(c, &mpi_ops, "mpi", rank, world);
    for (int g = 0; g < COMM_GROUPS; g++) {
        if (g == MODEL_GROUP_PP || m->group[g] == MPI_COMM_NULL)
            continue;
        MPI_Comm_size(m->group[g], &c->group_size[g]);
        MPI_Comm_rank(m->group[g], &c->group_rank[g]);
        MPI_Comm_set_errhandler(m->group[g], MPI_ERRORS_RETURN);
    }
    c->group_size[MODEL_GROUP_PP] = l->pp;
    c->group_rank[MODEL_GROUP_PP] = pp;
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    m->tag_ub = flag && ub ? *(int *)ub : 32767;
    m->poll = oversubscribed();
    *out = c;
    return PX_OK;
}

#else /* no MPI at build time */

int comm_mpi_available(void) { return 0; }

int comm_mpi_start(int *argc, char ***argv, int *rank, int *world)
{
    (void)argc, (void)argv;
    /* started by a launcher all the same: each process runs alone and refuses a plan of
     * several ranks; the launcher's rank lets only the first one say so */
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    *rank = 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) {
            *rank = atoi(getenv(vars[i]));
            break;
        }
    *world = 1;
    return 0;
}

void comm_mpi_abort(int code) { (void)code; }

void comm_mpi_finish(void) {}

void comm_mpi_local(int *local_rank, int *local_size)
{
    *local_rank = 0;
    *local_size = 1;
}

int comm_mpi_node_sharing(const char *id, int failed, int *sharing)
{
    (void)id;
    *sharing = 1;
    return failed != 0;
}

int comm_mpi_agree(int status, int *first_rank)
{
    if (first_rank)
        *first_rank = 0;
    return status;
}

int comm_mpi(const ModelLayout *l, int tied_pair, CommLayer **out, PxError *err)
{
    (void)tied_pair;
    *out = NULL;
    return px_fail(err, PX_EINPUT,
                   "the layout needs %d ranks but this parallax-worker was built without MPI "
                   "(install libopenmpi-dev and rebuild)",
                   l->tp * l->cp * l->dp * l->pp);
}

#endif
