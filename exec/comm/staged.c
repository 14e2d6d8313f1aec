/* The MPI communication layer for buffers in device memory, staged through host memory: the
 * fallback when several ranks share one GPU (NCCL refuses two ranks on one device) or NCCL was
 * not built. Each arena the executor attaches gets a host mirror (page-locked, from the
 * backend's host_alloc) at the same offsets, so that a device pointer maps to its mirror and
 * the in-place and aliasing rules of comm.h's calls (an all-gather whose input is part of its
 * output, an in-place reduce-scatter) hold on the host as they did on the device. A call
 * copies its input from the device into the mirror, runs the MPI call on the mirror, and copies
 * its output back: at once for a blocking call, at the wait for a non-blocking one (the buffers
 * belong to the operation until then, so nothing else touches either copy meanwhile).
 *
 * Costs: two trips over PCIe per call and no overlap of a reduction with the kernels that
 * precede its start (the copy waits for them). Correctness, not speed: a GPU per rank and NCCL
 * are the fast path. The inner layer's raw operations run on the mirrors: comm.c counts each call
 * once, on this layer, and never hands it a group of one (whose copy stays on the device). */
#include <stdlib.h>

#include "exec/comm/backend.h"
#include "kernels/kernels.h"

enum { STAGED_MIRRORS = 16, STAGED_REQS = 1024 };

typedef struct {
    char *dev, *host;
    size_t bytes;
} Mirror;

typedef struct {
    int active;
    int inner;           /* the inner layer's request */
    void *out_dev;       /* copied back at the wait (NULL: nothing to copy) */
    const void *out_host;
    size_t out_bytes;
} StagedReq;

typedef struct {
    CommLayer base; /* first: the raw operations cast back; base.inner runs the calls */
    const KernBackend *k;
    Mirror mirror[STAGED_MIRRORS];
    int n_mirrors;
    StagedReq *reqs;
} StagedComm;

/* The host mirror of [p, p + bytes): NULL (with err filled) when no attached memory holds it. */
static void *host_of(StagedComm *s, const void *p, size_t bytes, PxError *err)
{
    const char *c = p;
    for (int i = 0; i < s->n_mirrors; i++) {
        const Mirror *m = &s->mirror[i];
        if (c >= m->dev && c <= m->dev + m->bytes && bytes <= (size_t)(m->dev + m->bytes - c))
            return m->host + (c - m->dev);
    }
    px_fail(err, PX_ERUNTIME,
            "the staged communication layer was handed %zu bytes at %p outside the memory the "
            "executor attached",
            bytes, p);
    return NULL;
}

/* After the inner call: a blocking one copies its output back now, a non-blocking one keeps
 * what to copy for its wait. */
static int finish(StagedComm *s, int rc, int inner_req, int *req, void *out_dev,
                  const void *out_host, size_t out_bytes, PxError *err)
{
    if (rc)
        return rc;
    if (!req) {
        if (out_dev && out_bytes)
            s->k->to_device(out_dev, out_host, out_bytes);
        return PX_OK;
    }
    for (int i = 0; i < STAGED_REQS; i++) {
        StagedReq *q = &s->reqs[i];
        if (q->active)
            continue;
        q->active = 1;
        q->inner = inner_req;
        q->out_dev = out_dev;
        q->out_host = out_host;
        q->out_bytes = out_bytes;
        *req = i;
        return PX_OK;
    }
    /* cannot happen while the inner layer has fewer slots; complete it rather than lose it */
    CommLayer *in = s->base.inner;
    int w = in->ops->wait(in, &inner_req, err);
    if (!w && out_dev && out_bytes)
        s->k->to_device(out_dev, out_host, out_bytes);
    *req = -1;
    return w;
}

static int st_allreduce(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                        ModelComm kind, int *req, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    const size_t bytes = count * px_dtype_bytes(dtype);
    void *h = host_of(s, buf, bytes, err);
    if (!h)
        return PX_ERUNTIME;
    s->k->to_host(h, buf, bytes);
    int ir = -1;
    int rc = c->inner->ops->allreduce(c->inner, h, count, dtype, op, kind, req ? &ir : NULL, err);
    return finish(s, rc, ir, req, buf, h, bytes, err);
}

static int st_all_gather(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                         ModelComm kind, int *req, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    const size_t es = px_dtype_bytes(dtype), g = (size_t)comm_group_of(c, kind);
    void *ho = host_of(s, out, g * count * es, err);
    void *hi = ho ? host_of(s, in, count * es, err) : NULL;
    if (!hi)
        return PX_ERUNTIME;
    s->k->to_host(hi, in, count * es);
    int ir = -1;
    int rc = c->inner->ops->all_gather(c->inner, ho, hi, count, dtype, kind, req ? &ir : NULL,
                                       err);
    return finish(s, rc, ir, req, out, ho, g * count * es, err);
}

static int st_reduce_scatter(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                             ModelComm kind, int *req, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    const size_t es = px_dtype_bytes(dtype), g = (size_t)comm_group_of(c, kind);
    void *hi = host_of(s, in, g * count * es, err);
    void *ho = hi ? host_of(s, out, count * es, err) : NULL;
    if (!ho)
        return PX_ERUNTIME;
    s->k->to_host(hi, in, g * count * es);
    int ir = -1;
    int rc = c->inner->ops->reduce_scatter(c->inner, ho, hi, count, dtype, kind,
                                           req ? &ir : NULL, err);
    return finish(s, rc, ir, req, out, ho, count * es, err);
}

/* The sharded calls work on the whole block in place: it goes over and comes back whole (the
 * parts that are not this rank's are undefined after a reduce-scatter anyway). */
static int st_shard(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                    ModelComm kind, int *req, int gather, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    const size_t bytes = numel * px_dtype_bytes(dtype);
    void *h = host_of(s, buf, bytes, err);
    if (!h)
        return PX_ERUNTIME;
    s->k->to_host(h, buf, bytes);
    int ir = -1;
    CommLayer *in = c->inner;
    int rc = gather ? in->ops->all_gather_shard(in, h, numel, shard, dtype, kind,
                                                req ? &ir : NULL, err)
                    : in->ops->reduce_scatter_shard(in, h, numel, shard, dtype, kind,
                                                    req ? &ir : NULL, err);
    return finish(s, rc, ir, req, buf, h, bytes, err);
}

static int st_reduce_scatter_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                                   PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return st_shard(c, buf, numel, shard, dtype, kind, req, 0, err);
}

static int st_all_gather_shard(CommLayer *c, void *buf, size_t numel, size_t shard,
                               PxDtype dtype, ModelComm kind, int *req, PxError *err)
{
    return st_shard(c, buf, numel, shard, dtype, kind, req, 1, err);
}

static int st_all_gather_v(CommLayer *c, void *buf, const int64_t *counts, PxDtype dtype,
                           ModelComm kind, int *req, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    size_t n = 0;
    for (int i = 0; i < comm_group_of(c, kind); i++)
        n += (size_t)counts[i];
    const size_t bytes = n * px_dtype_bytes(dtype);
    void *h = host_of(s, buf, bytes, err);
    if (!h)
        return PX_ERUNTIME;
    s->k->to_host(h, buf, bytes); /* this rank's part, at its place */
    int ir = -1;
    CommLayer *in = c->inner;
    int rc = in->ops->all_gather_v(in, h, counts, dtype, kind, req ? &ir : NULL, err);
    return finish(s, rc, ir, req, buf, h, bytes, err);
}

static int st_send(CommLayer *c, const void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                   int *req, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    void *h = host_of(s, buf, bytes, err);
    if (!h)
        return PX_ERUNTIME;
    s->k->to_host(h, buf, bytes);
    int ir = -1;
    int rc = c->inner->ops->send(c->inner, h, bytes, peer, tag, kind, req ? &ir : NULL, err);
    return finish(s, rc, ir, req, NULL, NULL, 0, err);
}

static int st_recv(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                   int *req, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    void *h = host_of(s, buf, bytes, err);
    if (!h)
        return PX_ERUNTIME;
    int ir = -1;
    int rc = c->inner->ops->recv(c->inner, h, bytes, peer, tag, kind, req ? &ir : NULL, err);
    return finish(s, rc, ir, req, buf, h, bytes, err);
}

static int st_wait(CommLayer *c, int *req, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    StagedReq *q = &s->reqs[*req];
    *req = -1;
    if (!q->active)
        return PX_OK;
    q->active = 0;
    int rc = c->inner->ops->wait(c->inner, &q->inner, err);
    if (!rc && q->out_dev && q->out_bytes)
        s->k->to_device(q->out_dev, q->out_host, q->out_bytes);
    return rc;
}

/* The inner layer holds this one's requests. Said here, not by comm.c going down a NULL entry:
 * there NULL means nothing to advance (NCCL, whose MPI layer holds none). */
static void st_progress(CommLayer *c)
{
    if (c->inner->ops->progress)
        c->inner->ops->progress(c->inner);
}

/* A new mirror for [base, base + bytes); attaching the same base again replaces its mirror (an
 * executor made again on the same layer). */
static int st_attach(CommLayer *c, void *base, size_t bytes, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    Mirror *m = NULL;
    for (int i = 0; i < s->n_mirrors && !m; i++)
        if (s->mirror[i].dev == base)
            m = &s->mirror[i];
    if (!m) {
        if (s->n_mirrors == STAGED_MIRRORS)
            return px_fail(err, PX_ERUNTIME, "the staged communication layer mirrors at most %d "
                           "buffers", STAGED_MIRRORS);
        m = &s->mirror[s->n_mirrors++];
    } else if (m->bytes == bytes) {
        return PX_OK;
    } else {
        s->k->host_free(m->host);
    }
    m->dev = base;
    m->bytes = bytes;
    m->host = s->k->host_alloc(bytes);
    if (!m->host) {
        m->dev = NULL;
        m->bytes = 0;
        return px_fail(err, PX_ERUNTIME, "out of host memory for the staged communication layer "
                       "(%.1f MiB)", (double)bytes / (1024.0 * 1024.0));
    }
    return PX_OK;
}

/* a group of one: this rank's part stays on the device */
static int st_copy(CommLayer *c, void *dst, const void *src, size_t bytes, PxError *err)
{
    (void)err;
    ((StagedComm *)c)->k->copy(dst, src, bytes);
    return PX_OK;
}

static void st_free(CommLayer *c)
{
    StagedComm *s = (StagedComm *)c;
    for (int i = 0; i < s->n_mirrors; i++)
        s->k->host_free(s->mirror[i].host);
    comm_free(c->inner);
    free(s->reqs);
    free(s);
}

/* The rows sent and received: their totals over the group are the two buffers' sizes. */
static int st_all_to_allv(CommLayer *c, void *out, const int64_t *recv_counts, const void *in,
                          const int64_t *send_counts, PxDtype dtype, ModelComm kind, PxError *err)
{
    StagedComm *s = (StagedComm *)c;
    const size_t es = px_dtype_bytes(dtype);
    const int g = comm_group_of(c, kind);
    size_t sent = 0, got = 0;
    for (int i = 0; i < g; i++) {
        sent += (size_t)send_counts[i];
        got += (size_t)recv_counts[i];
    }
    void *hi = sent ? host_of(s, in, sent * es, err) : (void *)s;
    void *ho = hi && got ? host_of(s, out, got * es, err) : (void *)s;
    if (!hi || !ho)
        return PX_ERUNTIME;
    if (sent)
        s->k->to_host(hi, in, sent * es);
    int rc = c->inner->ops->all_to_allv(c->inner, ho, recv_counts, hi, send_counts, dtype, kind,
                                        err);
    return finish(s, rc, -1, NULL, got ? out : NULL, ho, got * es, err);
}

static const CommOps staged_ops = {
    .all_to_allv = st_all_to_allv, /* all_to_all_counts: the inner layer's, on the host */
    .allreduce = st_allreduce,
    .all_gather = st_all_gather,
    .reduce_scatter = st_reduce_scatter,
    .reduce_scatter_shard = st_reduce_scatter_shard,
    .all_gather_shard = st_all_gather_shard,
    .all_gather_v = st_all_gather_v,
    .send = st_send,
    .recv = st_recv,
    .wait = st_wait,
    .progress = st_progress, /* control, gather_text, barrier: comm.c runs the inner layer's */
    .free = st_free,
    .attach = st_attach,
    .copy = st_copy,
};

int comm_staged(CommLayer *inner, const KernBackend *k, CommLayer **out, PxError *err)
{
    *out = NULL;
    StagedComm *s = calloc(1, sizeof *s);
    StagedReq *reqs = calloc(STAGED_REQS, sizeof *reqs);
    if (!s || !reqs) {
        free(s);
        free(reqs);
        comm_free(inner);
        return px_fail(err, PX_ERUNTIME, "out of memory for the communication layer");
    }
    CommLayer *c = &s->base;
    /* the name stays the inner one's ("mpi"): the run's header says that it is staged */
    comm_layer_wrap(c, &staged_ops, inner->name, inner);
    s->k = k;
    s->reqs = reqs;
    *out = c;
    return PX_OK;
}
