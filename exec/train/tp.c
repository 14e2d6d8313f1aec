/* Tensor parallelism and sequence parallelism: the communication of Megatron-LM's layers, each
 * collective timed under its own op of the graph within the layer's op that the caller has
 * open (exec_meter_open nests it).
 *
 * Tensor parallelism (Shoeybi et al. 2019): QKV and fc1 are column-parallel (this rank's heads,
 * its slice of the MLP), the attention projection and fc2 row-parallel: their partial outputs
 * are all-reduced (the g operator) before bias, dropout and the residual add, which then run
 * alike on every TP rank; backward all-reduces the input gradients of QKV and fc1 (the f
 * operator). The embedding and the output layer are vocabulary-parallel: partial embeddings are
 * summed, the cross-entropy combines the ranks' row maxima, sums of exponentials and target
 * logits with three all-reduces.
 *
 * Sequence parallelism (Korthikanti et al. 2022): norms, dropout and residual adds work on this
 * rank's R = b*s/t rows of the micro-batch's flat [b*s, h] activation. An all-gather restores
 * the full sequence before QKV, fc1 and the output layer, a reduce-scatter replaces each
 * all-reduce; backward all-gathers the output gradients of the row-parallel layers and
 * re-gathers the saved, sharded inputs of QKV, fc1 and the output layer for their weight
 * gradients. sp.gather holds whatever was gathered. */
#include "exec/train/internal.h"

/* ---- the collectives ---- */

/* One TP collective under its op: an all-reduce of n elements of dt in place over out (`how`),
 * an all-gather of every rank's n into out[t * n], or a reduce-scatter of in[t * n] into this
 * rank's n of out. */
static int collective(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                      ModelPhase ph, ModelComm kind, void *out, const void *in, size_t n,
                      PxDtype dt, CommRedOp how, PxError *err)
{
    const ExecCtx *c = r->c;
    const int op = exec_meter_comm_op(r->M, c, role, layer, chunk, ph, kind, err);
    if (op < 0)
        return PX_ERUNTIME;
    int rc;
    exec_meter_open(r->M, c->k, op);
    if (kind == MODEL_TP_ALLREDUCE)
        rc = comm_allreduce(c->comm, out, n, dt, how, kind, NULL, err);
    else if (kind == MODEL_TP_ALL_GATHER)
        rc = comm_all_gather(c->comm, out, in, n, dt, kind, NULL, err);
    else
        rc = comm_reduce_scatter(c->comm, out, in, n, dt, kind, NULL, err);
    exec_meter_close(r->M, c->k, op);
    return rc;
}

int exec_tp_allreduce(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                      ModelPhase ph, void *buf, size_t n, PxError *err)
{
    if (r->c->d.t < 2)
        return PX_OK;
    return collective(r, role, layer, chunk, ph, MODEL_TP_ALLREDUCE, buf, NULL, n, r->c->act,
                      COMM_SUM, err);
}

int exec_tp_allreduce_f32(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                          ModelPhase ph, float *buf, size_t n, CommRedOp how, PxError *err)
{
    if (r->c->d.t < 2)
        return PX_OK;
    return collective(r, role, layer, chunk, ph, MODEL_TP_ALLREDUCE, buf, NULL, n, PX_FP32, how,
                      err);
}

int exec_tp_all_gather(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                       ModelPhase ph, void *out, const void *in, size_t n, PxError *err)
{
    return collective(r, role, layer, chunk, ph, MODEL_TP_ALL_GATHER, out, in, n, r->c->act,
                      COMM_SUM, err);
}

int exec_tp_reduce_scatter(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                           ModelPhase ph, void *out, const void *in, size_t n, PxError *err)
{
    return collective(r, role, layer, chunk, ph, MODEL_TP_REDUCE_SCATTER, out, in, n, r->c->act,
                      COMM_SUM, err);
}

/* ---- Megatron's operators ---- */

int exec_tp_column_input(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, ModelPhase ph,
                         const ExecFp8Weight *w, void *saved, const void *x, const void **xin,
                         ExecFp8Ref *xq, PxError *err)
{
    const ExecCtx *c = r->c;
    ExecFp8 *F = r->fp8;
    const int R = c->d.b * c->d.s_sp, N = c->d.b * c->d.s_loc, h = c->d.h, sp = exec_sp_on(c);
    const int rec = ph == MODEL_FWD;
    *xin = x;
    if (w && saved != x) {
        /* the saved input is x's FP8 copy: this rank's region, whose amax the forward records
         * here unless the whole input's quantization below records it */
        *xq = exec_fp8_quantize(F, c, saved, x, R, h, 0, EXEC_FP8_X, w, 0, rec && !sp);
        if (!sp)
            return PX_OK;
    }
    if (sp) {
        int rc = exec_tp_all_gather(r, role, l, chunk, ph, r->W->sp_gather, x, (size_t)R * h, err);
        if (rc)
            return rc;
        *xin = r->W->sp_gather;
    }
    if (w)
        *xq = exec_fp8_quantize(F, c, F->q0, *xin, N, h, 0, EXEC_FP8_X, w, 0, rec);
    return PX_OK;
}

int exec_tp_column_bwd_input(const ExecLayerRun *r, int chunk, int l, ModelOpRole role,
                             const void *saved, int in_fp8, const void **x_act, ExecFp8Ref *xq,
                             PxError *err)
{
    const ExecCtx *c = r->c;
    const int R = c->d.b * c->d.s_sp, N = c->d.b * c->d.s_loc, h = c->d.h;
    xq->q = NULL;
    *x_act = NULL;
    if (!exec_sp_on(c)) {
        if (in_fp8)
            *xq = exec_fp8_saved(r->fp8, saved, N, h);
        else
            *x_act = saved;
        return PX_OK;
    }
    const void *region = saved;
    if (in_fp8) { /* an FP8 copy is gathered in the act dtype: dequantized into ws.fp8 first */
        const ExecFp8Ref q = exec_fp8_saved(r->fp8, saved, R, h);
        c->k->fp8_dequantize(r->fp8->act, q.q, &q.f);
        region = r->fp8->act;
    }
    int rc = exec_tp_all_gather(r, role, l, chunk, MODEL_BWD, r->W->sp_gather, region,
                                (size_t)R * h, err);
    *x_act = r->W->sp_gather;
    return rc;
}

int exec_tp_row_reduce(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, ModelPhase ph,
                       void *region, void **y, PxError *err)
{
    const size_t n = (size_t)r->c->d.b * r->c->d.s_sp * r->c->d.h;
    if (exec_sp_on(r->c)) {
        *y = region; /* the reduce-scatter writes this rank's rows straight into the output */
        return exec_tp_reduce_scatter(r, role, l, chunk, ph, region, r->W->out, n, err);
    }
    *y = r->W->out;
    return exec_tp_allreduce(r, role, l, chunk, ph, r->W->out, n, err);
}

int exec_tp_row_dy(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, const void *dres,
                   const void **dy, PxError *err)
{
    *dy = dres;
    if (!exec_sp_on(r->c))
        return PX_OK;
    *dy = r->W->sp_gather;
    return exec_tp_all_gather(r, role, l, chunk, MODEL_BWD, r->W->sp_gather, dres,
                              (size_t)r->c->d.b * r->c->d.s_sp * r->c->d.h, err);
}

int exec_tp_column_dx(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, const void **dn,
                      PxError *err)
{
    const size_t n = (size_t)r->c->d.b * r->c->d.s_sp * r->c->d.h;
    if (exec_sp_on(r->c)) {
        *dn = r->W->dx_a;
        return exec_tp_reduce_scatter(r, role, l, chunk, MODEL_BWD, r->W->dx_a, r->W->dhid, n,
                                      err);
    }
    *dn = r->W->dhid;
    return exec_tp_allreduce(r, role, l, chunk, MODEL_BWD, r->W->dhid, n, err);
}
