/* The communication layer of a single-rank job. Every group has one rank, so a collective
 * leaves its buffer as it is (an all-gather or reduce-scatter of one rank is a copy) and moves
 * no bytes: as in the simulator, a call over a group of one is not communication and counts
 * nothing. The MPI implementation (comm_mpi.c) fills the same table and counts S bytes per
 * call. */
#include <stdlib.h>
#include <string.h>

#include "exec/exec.h"

static int single_allreduce(ExecComm *c, void *buf, size_t count, PxDtype dtype, ExecRedOp op,
                            int kind, int *req, PxError *err)
{
    (void)c, (void)buf, (void)count, (void)dtype, (void)op, (void)kind, (void)err;
    if (req)
        *req = -1;
    return PX_OK;
}

static int single_copy(ExecComm *c, void *out, const void *in, size_t count, PxDtype dtype,
                       int kind, int *req, PxError *err)
{
    (void)c, (void)kind, (void)err;
    if (out != in && count > 0)
        memmove(out, in, count * px_dtype_bytes(dtype));
    if (req)
        *req = -1;
    return PX_OK;
}

/* one shard holds the whole block: nothing to reduce or gather */
static int single_shard(ExecComm *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                        int kind, int *req, PxError *err)
{
    (void)c, (void)buf, (void)numel, (void)shard, (void)dtype, (void)kind, (void)err;
    if (req)
        *req = -1;
    return PX_OK;
}

static int no_peer(int peer, PxError *err)
{
    return px_fail(err, PX_ERUNTIME, "no rank %d to exchange with in a single-rank job", peer);
}

static int single_recv(ExecComm *c, void *buf, size_t bytes, int peer, int tag, int kind, int *req,
                       PxError *err)
{
    (void)c, (void)buf, (void)bytes, (void)tag, (void)kind, (void)req;
    return no_peer(peer, err);
}

static int single_send(ExecComm *c, const void *buf, size_t bytes, int peer, int tag, int kind,
                       int *req, PxError *err)
{
    (void)c, (void)buf, (void)bytes, (void)tag, (void)kind, (void)req;
    return no_peer(peer, err);
}

static int single_wait(ExecComm *c, int *req, PxError *err)
{
    (void)c, (void)err;
    if (req)
        *req = -1;
    return PX_OK;
}

static void single_progress(ExecComm *c) { (void)c; }

static int single_control(ExecComm *c, double *vals, int n, ExecRedOp op, PxError *err)
{
    (void)c, (void)vals, (void)n, (void)op, (void)err;
    return PX_OK;
}

static int single_gather_text(ExecComm *c, const char *text, char ***out, PxError *err)
{
    (void)c;
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

static int single_barrier(ExecComm *c, PxError *err)
{
    (void)c, (void)err;
    return PX_OK;
}

static void single_free(ExecComm *c) { free(c); }

ExecComm *exec_comm_single(void)
{
    ExecComm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->name = "single";
    c->rank = 0;
    c->world = 1;
    for (int g = 0; g < 5; g++)
        c->group_size[g] = 1;
    c->allreduce = single_allreduce;
    c->all_gather = single_copy;
    c->reduce_scatter = single_copy;
    c->reduce_scatter_shard = single_shard;
    c->all_gather_shard = single_shard;
    c->send = single_send;
    c->recv = single_recv;
    c->wait = single_wait;
    c->progress = single_progress;
    c->control = single_control;
    c->gather_text = single_gather_text;
    c->barrier = single_barrier;
    c->free = single_free;
    return c;
}
