/* The communication layer's calls, the same for every backend: the kind checked, a group of one
 * decided, the bytes and calls counted, then the backend's raw operation (backend.h). Counting
 * here, once, is what makes bytes per kind mean the same thing whichever backend moved them, and
 * equal the op graph's, which lists S bytes per call and no op over a group of one. The one-rank
 * layer is here too: with every group of one rank, the wrapper never hands it anything to do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/comm/backend.h"
#include "kernels/kernels.h"

void comm_layer_init(CommLayer *c, const CommOps *ops, const char *name, int rank, int world)
{
    memset(c, 0, sizeof *c);
    c->ops = ops;
    c->name = name;
    c->rank = rank;
    c->world = world;
    for (int g = 0; g < COMM_GROUPS; g++)
        c->group_size[g] = 1;
}

void comm_layer_wrap(CommLayer *c, const CommOps *ops, const char *name, CommLayer *inner)
{
    comm_layer_init(c, ops, name, inner->rank, inner->world);
    memcpy(c->group_size, inner->group_size, sizeof c->group_size);
    memcpy(c->group_rank, inner->group_rank, sizeof c->group_rank);
    c->inner = inner;
}

/* ---- what it is ---- */

const char *comm_name(const CommLayer *c) { return c->name; }
int comm_rank(const CommLayer *c) { return c->rank; }
int comm_world(const CommLayer *c) { return c->world; }

int comm_group_size(const CommLayer *c, ModelGroup g)
{
    return (unsigned)g < COMM_GROUPS ? c->group_size[g] : 1;
}

int comm_group_rank(const CommLayer *c, ModelGroup g)
{
    return (unsigned)g < COMM_GROUPS ? c->group_rank[g] : 0;
}

uint64_t comm_bytes(const CommLayer *c, ModelComm kind)
{
    return (unsigned)kind < MODEL_COMM_COUNT ? c->bytes[kind] : 0;
}

uint64_t comm_calls(const CommLayer *c, ModelComm kind)
{
    return (unsigned)kind < MODEL_COMM_COUNT ? c->calls[kind] : 0;
}

/* The layers underneath wait on the host for this one: they get the same limit and step. */
void comm_set_timeout(CommLayer *c, double seconds)
{
    for (; c; c = c->inner)
        c->timeout_s = seconds;
}

void comm_set_step(CommLayer *c, int step)
{
    for (; c; c = c->inner)
        c->step = step;
}

void comm_free(CommLayer *c)
{
    if (c)
        c->ops->free(c);
}

/* ---- counted communication ---- */

static int bad_kind(ModelComm kind, PxError *err)
{
    return px_fail(err, PX_ERUNTIME, "communication kind %d is none of model.h's ModelComm",
                   (int)kind);
}

/* One call of S bytes, counted once it started. */
static void tally(CommLayer *c, ModelComm kind, uint64_t bytes)
{
    c->bytes[kind] += bytes;
    c->calls[kind]++;
}

/* An all-gather or reduce-scatter over a group of one: this rank's part is the result. */
static int one_rank_copy(CommLayer *c, void *out, const void *in, size_t bytes, PxError *err)
{
    if (out == in || bytes == 0)
        return PX_OK;
    if (c->ops->copy)
        return c->ops->copy(c, out, in, bytes, err);
    memmove(out, in, bytes);
    return PX_OK;
}

int comm_allreduce(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                   ModelComm kind, int *req, PxError *err)
{
    if (req)
        *req = -1;
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    if (comm_group_of(c, kind) < 2 || count == 0)
        return PX_OK;
    int rc = c->ops->allreduce(c, buf, count, dtype, op, kind, req, err);
    if (!rc)
        tally(c, kind, (uint64_t)count * px_dtype_bytes(dtype));
    return rc;
}

int comm_all_gather(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                    ModelComm kind, int *req, PxError *err)
{
    if (req)
        *req = -1;
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    const int g = comm_group_of(c, kind);
    const size_t es = px_dtype_bytes(dtype);
    if (g < 2)
        return one_rank_copy(c, out, in, count * es, err);
    int rc = c->ops->all_gather(c, out, in, count, dtype, kind, req, err);
    if (!rc)
        tally(c, kind, (uint64_t)g * count * es); /* the gathered output */
    return rc;
}

int comm_reduce_scatter(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                        ModelComm kind, int *req, PxError *err)
{
    if (req)
        *req = -1;
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    const int g = comm_group_of(c, kind);
    const size_t es = px_dtype_bytes(dtype);
    if (g < 2)
        return one_rank_copy(c, out, in, count * es, err);
    int rc = c->ops->reduce_scatter(c, out, in, count, dtype, kind, req, err);
    if (!rc)
        tally(c, kind, (uint64_t)g * count * es); /* the input */
    return rc;
}

static int shard_call(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                      ModelComm kind, int *req, int gather, PxError *err)
{
    if (req)
        *req = -1;
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    const int g = comm_group_of(c, kind);
    if (g < 2 || numel == 0)
        return PX_OK; /* one shard holds the whole block */
    if (model_comm_group(kind) != MODEL_GROUP_DP && model_comm_group(kind) != MODEL_GROUP_EDP)
        return px_fail(err, PX_ERUNTIME,
                       "sharded %s over a group other than dp x cp or expert data parallel",
                       model_comm_name(kind));
    if (shard == 0 || (numel - 1) / shard >= (size_t)g)
        return px_fail(err, PX_ERUNTIME,
                       "sharded %s: %d shards of %zu elements do not hold a block of %zu",
                       model_comm_name(kind), g, shard, numel);
    int rc = gather ? c->ops->all_gather_shard(c, buf, numel, shard, dtype, kind, req, err)
                    : c->ops->reduce_scatter_shard(c, buf, numel, shard, dtype, kind, req, err);
    if (!rc)
        tally(c, kind, (uint64_t)g * shard * px_dtype_bytes(dtype)); /* padded to the group */
    return rc;
}

int comm_reduce_scatter_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                              PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return shard_call(c, buf, numel, shard, dtype, kind, req, 0, err);
}

int comm_all_gather_shard(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                          ModelComm kind, int *req, PxError *err)
{
    return shard_call(c, buf, numel, shard, dtype, kind, req, 1, err);
}

int comm_all_gather_v(CommLayer *c, void *buf, const int64_t *counts, PxDtype dtype,
                      ModelComm kind, int *req, PxError *err)
{
    if (req)
        *req = -1;
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    const int g = comm_group_of(c, kind);
    if (g < 2)
        return PX_OK; /* this rank's part is the whole, in place */
    if (!c->ops->all_gather_v)
        return px_fail(err, PX_ERUNTIME, "the %s layer has no all-gather of unequal parts (%s)",
                       c->name, model_comm_name(kind));
    uint64_t n = 0;
    for (int i = 0; i < g; i++)
        n += (uint64_t)counts[i];
    int rc = c->ops->all_gather_v(c, buf, counts, dtype, kind, req, err);
    if (!rc)
        tally(c, kind, n * px_dtype_bytes(dtype)); /* the gathered output */
    return rc;
}

static int not_all_to_all(ModelComm kind, PxError *err)
{
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    if (model_comm_collective(kind) != MODEL_COLL_ALL_TO_ALL)
        return px_fail(err, PX_ERUNTIME, "%s is not an all-to-all", model_comm_name(kind));
    return PX_OK;
}

int comm_all_to_all_counts(CommLayer *c, const int64_t *send, int64_t *recv, ModelComm kind,
                           PxError *err)
{
    /* metadata over the kind's group, whatever its collective: the expert-tensor-parallel
     * ranks exchange their row counts before their all-gather */
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    if (comm_group_of(c, kind) < 2) {
        recv[0] = send[0];
        return PX_OK;
    }
    while (!c->ops->all_to_all_counts && c->inner)
        c = c->inner;
    return c->ops->all_to_all_counts(c, send, recv, kind, err);
}

int comm_all_to_allv(CommLayer *c, void *out, const int64_t *recv_counts, const void *in,
                     const int64_t *send_counts, PxDtype dtype, ModelComm kind, PxError *err)
{
    int rc = not_all_to_all(kind, err);
    if (rc)
        return rc;
    const int g = comm_group_of(c, kind);
    const size_t es = px_dtype_bytes(dtype);
    if (g < 2) {
        if (recv_counts[0] != send_counts[0])
            return px_fail(err, PX_ERUNTIME, "%s over a group of one: %lld elements sent, %lld "
                           "received", model_comm_name(kind), (long long)send_counts[0],
                           (long long)recv_counts[0]);
        return one_rank_copy(c, out, in, (size_t)send_counts[0] * es, err);
    }
    uint64_t sent = 0;
    for (int i = 0; i < g; i++)
        sent += (uint64_t)send_counts[i];
    rc = c->ops->all_to_allv(c, out, recv_counts, in, send_counts, dtype, kind, err);
    if (!rc)
        tally(c, kind, sent * es);
    return rc;
}

/* A message needs a peer in the kind's group: over a group of one there is none (a pipeline of
 * one stage sends nothing), which is a caller's error rather than nothing to do. */
static int p2p(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
               int *req, int send, PxError *err)
{
    if (req)
        *req = -1;
    if ((unsigned)kind >= MODEL_COMM_COUNT)
        return bad_kind(kind, err);
    if (comm_group_of(c, kind) < 2)
        return px_fail(err, PX_ERUNTIME, "%s rank %d: this rank's %s group has no other rank",
                       send ? "send to" : "receive from", peer,
                       model_group_name(model_comm_group(kind)));
    int rc = send ? c->ops->send(c, buf, bytes, peer, tag, kind, req, err)
                  : c->ops->recv(c, buf, bytes, peer, tag, kind, req, err);
    /* a receive under a send's kind (the context-parallel ring's messages: the graph counts
     * what each rank sends) is the sender's count */
    if (!rc && (send || model_comm_collective(kind) != MODEL_COLL_SEND))
        tally(c, kind, bytes);
    return rc;
}

int comm_send(CommLayer *c, const void *buf, size_t bytes, int peer, int tag, ModelComm kind,
              int *req, PxError *err)
{
    return p2p(c, (void *)buf, bytes, peer, tag, kind, req, 1, err);
}

int comm_recv(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
              int *req, PxError *err)
{
    return p2p(c, buf, bytes, peer, tag, kind, req, 0, err);
}

int comm_wait(CommLayer *c, int *req, PxError *err)
{
    if (!req || *req < 0)
        return PX_OK;
    return c->ops->wait(c, req, err);
}

void comm_progress(CommLayer *c)
{
    if (c->ops->progress)
        c->ops->progress(c);
}

/* ---- control traffic: in a world of one, the values are already everyone's ----
 * It lives on the host: a layer that leaves these calls NULL (NCCL, staged) runs them on the
 * layer underneath, which spans the same world. Nothing here is counted, so nothing is lost or
 * counted twice on the way down. */

int comm_control(CommLayer *c, double *vals, int n, CommRedOp op, PxError *err)
{
    if (c->world < 2)
        return PX_OK;
    while (!c->ops->control && c->inner)
        c = c->inner;
    return c->ops->control(c, vals, n, op, err);
}

int comm_gather_text(CommLayer *c, const char *text, char ***out, PxError *err)
{
    if (c->world >= 2) {
        while (!c->ops->gather_text && c->inner)
            c = c->inner;
        return c->ops->gather_text(c, text, out, err);
    }
    char **a = malloc(sizeof *a);
    char *t = a ? malloc(strlen(text) + 1) : NULL;
    if (!t) {
        free(a);
        *out = NULL;
        return px_fail(err, PX_ERUNTIME, "out of memory gathering the ranks' figures");
    }
    strcpy(t, text);
    a[0] = t;
    *out = a;
    return PX_OK;
}

int comm_barrier(CommLayer *c, PxError *err)
{
    if (c->world < 2)
        return PX_OK;
    while (!c->ops->barrier && c->inner)
        c = c->inner;
    return c->ops->barrier(c, err);
}

int comm_attach(CommLayer *c, void *base, size_t bytes, PxError *err)
{
    return c->ops->attach ? c->ops->attach(c, base, bytes, err) : PX_OK;
}

/* ---- the one-rank layer ---- */

static void single_free(CommLayer *c) { free(c); }

static const CommOps single_ops = {.free = single_free};

CommLayer *comm_single(void)
{
    CommLayer *c = malloc(sizeof *c);
    if (c)
        comm_layer_init(c, &single_ops, "single", 0, 1);
    return c;
}
