/* The pipeline's transfers between neighbouring stages.
 *
 * A stage has one send and one receive buffer (pp.send, pp.recv, as the tensor table sizes
 * them). With blocking sends 1F1B deadlocks (each neighbour sends before it receives), and with
 * one send buffer reused after a lazy wait the interleaved schedule deadlocks too under a
 * rendezvous protocol, because a stage consumes its neighbour's messages in another order than
 * they are produced. So each stage keeps its next expected receive posted at all times (the
 * receives of a step are known from the schedule), and a send only waits for its predecessor
 * before it overwrites pp.send: a message is then always matched as soon as its receiver has
 * consumed the previous one, which no schedule of model/schedule.c blocks (test_exec_schedule
 * replays pp 2-8, vpp 1-4, up to 24 micro-batches). Tags carry (receiving chunk, micro-batch,
 * direction). With Megatron's scatter/gather (d.pp_split > 1) each TP rank sends and receives
 * 1/t of the activation and the TP group all-gathers the pieces. */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

int exec_pipe_init(ExecPipe *pp, int n_actions, PxError *err)
{
    memset(pp, 0, sizeof *pp);
    pp->send_req = pp->recv_req = -1;
    pp->recvs = calloc((size_t)(n_actions > 0 ? n_actions : 1), sizeof *pp->recvs);
    if (!pp->recvs)
        return px_fail(err, PX_ERUNTIME, "out of memory for the pipeline's receives");
    return PX_OK;
}

void exec_pipe_free(ExecPipe *pp)
{
    free(pp->recvs);
    memset(pp, 0, sizeof *pp);
}

int exec_pipe_bind(ExecPipe *pp, const ModelTensor *t, void *p, PxError *err)
{
    if (t->role == MODEL_TR_PP_SEND) {
        pp->send = p;
        pp->elems = t->numel;
        return PX_OK;
    }
    if (t->role == MODEL_TR_PP_RECV && t->numel == pp->elems) {
        pp->recv = p;
        return PX_OK;
    }
    return px_fail(err, PX_ERUNTIME, "the pipeline has no use for tensor %s: model/ and exec/ "
                   "disagree", t->name);
}

/* The activations' worth a transfer carries: past a stage of the prediction modules' own, the
 * main hidden states and each module's output, one after the other (model/ops.c's xin, xout).
 * out: global chunk g's forward send (and the backward receive of its output's gradient); else
 * its forward receive (and the backward send of its input's gradient). */
static int parts_of(const ExecCtx *c, int g, int out)
{
    const ModelDims *d = &c->d;
    const int D = c->spec.model.mtp_layers;
    if (D == 0 || d->mtp_chunk == d->chunks - 1)
        return 1;
    return (out ? g >= d->mtp_chunk : g > d->mtp_chunk) ? 1 + D : 1;
}

static int tag_of(const ExecCtx *c, int g, int mb, int backward)
{
    return ((g * c->d.m) + mb) * 2 + backward;
}

/* Posts the next expected receive into pp.recv (nothing when the step expects no more). */
static int post_receive(ExecPipe *pp, const ExecCtx *c, PxError *err)
{
    if (pp->next_recv >= pp->n_recvs)
        return PX_OK;
    const ModelAction *a = &pp->recvs[pp->next_recv];
    const int g = c->g.chunk_g[a->chunk];
    const int peer = a->backward ? c->g.next_rank : c->g.prev_rank;
    const uint64_t n = (uint64_t)parts_of(c, g, a->backward) * pp->part;
    return comm_recv(c->comm, pp->recv, n * c->ab, peer, tag_of(c, g, a->mb, a->backward),
                     MODEL_PP_RECV, &pp->recv_req, err);
}

int exec_pipe_start(ExecPipe *pp, const ExecCtx *c, const ModelAction *actions, int n,
                    int backward, PxError *err)
{
    pp->n_recvs = 0;
    pp->next_recv = 0;
    /* the buffers hold the stage's largest transfer */
    int most = 1;
    for (int j = 0; j < c->d.v; j++)
        for (int out = 0; out < 2; out++)
            if (parts_of(c, c->g.chunk_g[j], out) > most)
                most = parts_of(c, c->g.chunk_g[j], out);
    pp->part = pp->elems / (uint64_t)most;
    for (int i = 0; i < n; i++) {
        const ModelAction *a = &actions[i];
        const int g = c->g.chunk_g[a->chunk];
        if (a->backward && !backward)
            continue;
        if ((!a->backward && g > 0) || (a->backward && g < c->d.chunks - 1))
            pp->recvs[pp->n_recvs++] = *a;
    }
    return post_receive(pp, c, err);
}

int exec_pipe_take(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb, int backward,
                   void *dst, PxError *err)
{
    return exec_pipe_take_parts(pp, c, M, chunk, mb, backward, &dst, 1, err);
}

int exec_pipe_take_parts(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb,
                         int backward, void *const *dst, int n, PxError *err)
{
    const ModelPhase ph = backward ? MODEL_BWD : MODEL_FWD;
    const ModelAction *a = pp->next_recv < pp->n_recvs ? &pp->recvs[pp->next_recv] : NULL;
    if (!a || a->chunk != chunk || a->mb != mb || a->backward != backward)
        return px_fail(err, PX_ERUNTIME,
                       "stage %d: the pipeline expected another transfer than chunk %d "
                       "micro-batch %d %s",
                       c->g.stage, chunk, mb, backward ? "backward" : "forward");
    int op, rc;
    if ((rc = exec_meter_need(M, c, MODEL_OPR_PP, -1, chunk, ph, MODEL_PP_RECV, 0, "pp.pp_recv",
                              &op, err)))
        return rc;
    exec_meter_open(M, c->k, op);
    rc = comm_wait(c->comm, &pp->recv_req, err);
    exec_meter_close(M, c->k, op);
    if (rc)
        return rc;
    pp->next_recv++;
    const int split = c->d.pp_split > 1;
    if (split) {
        if ((rc = exec_meter_need(M, c, MODEL_OPR_PP, -1, chunk, ph, MODEL_TP_ALL_GATHER, 0,
                                  "pp.tp_all_gather", &op, err)))
            return rc;
        exec_meter_open(M, c->k, op);
    }
    /* each part gathered whole (a slice of part elements from every TP rank), or copied; under
     * the split one kept in pp.send stays this rank's slice */
    for (int k = 0; k < n && !rc; k++) {
        const void *from = EXEC_AT(pp->recv, (size_t)k * pp->part, c->ab);
        if (split && dst[k] != EXEC_AT(pp->send, (size_t)k * pp->part, c->ab))
            rc = comm_all_gather(c->comm, dst[k], from, pp->part, c->act, MODEL_TP_ALL_GATHER,
                                 NULL, err);
        else
            c->k->copy(dst[k], from, pp->part * c->ab);
    }
    if (split)
        exec_meter_close(M, c->k, op);
    return rc ? rc : post_receive(pp, c, err);
}

int exec_pipe_gather_part(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int backward,
                          int k, void *dst, PxError *err)
{
    const void *from = EXEC_AT(pp->send, (size_t)k * pp->part, c->ab);
    int op, rc;
    if (c->d.pp_split <= 1) {
        c->k->copy(dst, from, pp->part * c->ab);
        return PX_OK;
    }
    if ((rc = exec_meter_need(M, c, MODEL_OPR_PP, -1, chunk, backward ? MODEL_BWD : MODEL_FWD,
                              MODEL_TP_ALL_GATHER, 0, "pp.tp_all_gather", &op, err)))
        return rc;
    exec_meter_open_again(M, c->k, op);
    rc = comm_all_gather(c->comm, dst, from, pp->part, c->act, MODEL_TP_ALL_GATHER, NULL, err);
    exec_meter_close(M, c->k, op);
    return rc;
}

int exec_pipe_give(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb, int backward,
                   const void *src, PxError *err)
{
    return exec_pipe_give_parts(pp, c, M, chunk, mb, backward, &src, 1, err);
}

int exec_pipe_give_parts(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb,
                         int backward, const void *const *src, int n, PxError *err)
{
    const ModelPhase ph = backward ? MODEL_BWD : MODEL_FWD;
    const int g = c->g.chunk_g[chunk];
    int op, rc;
    if ((rc = exec_meter_need(M, c, MODEL_OPR_PP, -1, chunk, ph, MODEL_PP_SEND, 0, "pp.pp_send",
                              &op, err)))
        return rc;
    /* the pass is done: what follows, waiting for the send buffer, is the pipeline's idle */
    exec_meter_pass_output(M);
    exec_meter_open(M, c->k, op);
    /* pp.send is one buffer: its previous message must have left */
    rc = comm_wait(c->comm, &pp->send_req, err);
    if (!rc) {
        /* a part already in place (written there by mtp.c) is not copied */
        for (int k = 0; k < n; k++) {
            void *to_k = EXEC_AT(pp->send, (size_t)k * pp->part, c->ab);
            const void *from =
                c->d.pp_split > 1 ? EXEC_AT(src[k], (size_t)c->g.tp_rank * pp->part, c->ab) : src[k];
            if (src[k] != to_k)
                c->k->copy(to_k, from, pp->part * c->ab);
        }
        const int peer = backward ? c->g.prev_rank : c->g.next_rank;
        const int to = backward ? g - 1 : g + 1;
        rc = comm_send(c->comm, pp->send, (size_t)n * pp->part * c->ab, peer,
                       tag_of(c, to, mb, backward), MODEL_PP_SEND, &pp->send_req, err);
    }
    exec_meter_close(M, c->k, op);
    return rc;
}

int exec_pipe_drain(ExecPipe *pp, const ExecCtx *c, PxError *err)
{
    return pp->send_req >= 0 ? comm_wait(c->comm, &pp->send_req, err) : PX_OK;
}
