/* A MoE layer's routed experts on this rank's tokens, forward and backward (docs/moe.md):
 * router -> top-k -> permutation into expert order -> counts exchanged -> all-to-all-v to the
 * expert ranks -> rows sorted by local expert -> SwiGLU experts (one GEMM per expert on its rows)
 * -> rows sorted back -> all-to-all-v home -> the weighted sum of each token's k outputs. The
 * shared experts and the residual are the caller's (the layer's ordinary MLP path). Views are
 * bound by role (ExecMoeViews); nothing here allocates after exec_moe_init.
 *
 * Rows on an expert rank arrive from each source rank j as one block per local expert l
 * (source-major, [j][l]); the experts want them expert-major ([l][j]). Megatron-Core sorts the
 * chunks the same way (sort_chunks_by_idxs); here a device copy per block does it. */
#include <string.h>

#include "exec/train/internal.h"

int exec_moe_init(ExecMoe *M, const ExecCtx *c, int moe_layers, PxError *err)
{
    memset(M, 0, sizeof *M);
    const int E = c->spec.model.moe.experts, ep = c->d.ep > 0 ? c->d.ep : 1;
    M->E = E;
    M->ep = ep;
    M->L = E / ep;
    M->layers = moe_layers;
    M->cnt = exec_zalloc((size_t)E, sizeof *M->cnt);
    M->cntf = exec_zalloc((size_t)E, sizeof *M->cntf);
    M->send = exec_zalloc((size_t)ep, sizeof *M->send);
    M->recv = exec_zalloc((size_t)ep, sizeof *M->recv);
    M->blk = exec_zalloc((size_t)ep * (size_t)M->L, sizeof *M->blk);
    M->one_s = exec_zalloc((size_t)ep, sizeof *M->one_s);
    M->one_r = exec_zalloc((size_t)ep, sizeof *M->one_r);
    M->tokens_per_expert = exec_zalloc((size_t)(moe_layers > 0 ? moe_layers : 1) * (size_t)E,
                                       sizeof *M->tokens_per_expert);
    if (!M->cnt || !M->cntf || !M->send || !M->recv || !M->blk || !M->one_s || !M->one_r ||
        !M->tokens_per_expert) {
        exec_moe_free(M);
        return px_fail(err, PX_ERUNTIME, "out of memory");
    }
    return PX_OK;
}

void exec_moe_free(ExecMoe *M)
{
    free(M->cnt);
    free(M->cntf);
    free(M->send);
    free(M->recv);
    free(M->blk);
    free(M->one_s);
    free(M->one_r);
    free(M->tokens_per_expert);
    memset(M, 0, sizeof *M);
}

void exec_moe_step_begin(ExecMoe *M)
{
    memset(M->tokens_per_expert, 0,
           (size_t)(M->layers > 0 ? M->layers : 1) * (size_t)M->E * sizeof *M->tokens_per_expert);
}

double exec_moe_imbalance(const ExecMoe *M, int layer_index)
{
    const double *t = M->tokens_per_expert + (size_t)layer_index * (size_t)M->E;
    double mx = 0, sum = 0;
    for (int e = 0; e < M->E; e++) {
        mx = t[e] > mx ? t[e] : mx;
        sum += t[e];
    }
    return sum > 0 ? mx / (sum / M->E) : 0;
}

static KernMoeRoute route_of(const ExecCtx *c, int N, long long first_seq)
{
    const ModelMoe *m = &c->spec.model.moe;
    KernMoeRoute r = {0};
    r.N = N;
    r.E = m->experts;
    r.topk = m->topk;
    r.score = m->score == MODEL_ROUTER_SIGMOID ? KERN_MOE_SIGMOID : KERN_MOE_SOFTMAX;
    r.groups = m->groups;
    r.topk_groups = m->topk_groups;
    r.norm_topk = m->norm_topk;
    r.force_balance = c->spec.job.moe_force_balance;
    /* a row's global id: its sequence's, then its place in the sequence (SP: this rank's
     * slice), so that forced routing is the same on every layout */
    const int sp = c->spec.layout.sp && c->d.t > 1;
    r.seq_rows = c->d.s_sp;
    r.seq_stride = c->d.s;
    r.first = (uint64_t)first_seq * (uint64_t)c->d.s +
              (uint64_t)(sp ? c->g.tp_rank * c->d.s_sp : 0);
    return r;
}

/* This rank's routed copies per expert (cnt, from the device) into the rows it sends each
 * expert rank, and the counts exchange: blk[j * L + l] the rows source j sends this rank's
 * expert l, recv[j] their sum. One exchange per local expert: the layer's counts call carries
 * one count per peer. PX_ERUNTIME when the rows exceed the plan's buffer (routed). */
static int exchange_counts(ExecMoe *M, const ExecCtx *c, const float *cnt_dev, int64_t cap,
                           int64_t *total_recv, PxError *err)
{
    const int ep = M->ep, L = M->L;
    c->k->to_host(M->cntf, cnt_dev, (size_t)M->E * sizeof *M->cntf);
    for (int e = 0; e < M->E; e++)
        M->cnt[e] = (int64_t)M->cntf[e]; /* exact: counts stay below 2^24 */
    for (int j = 0; j < ep; j++) {
        M->send[j] = 0;
        for (int l = 0; l < L; l++)
            M->send[j] += M->cnt[j * L + l];
        M->recv[j] = 0;
    }
    for (int l = 0; l < L; l++) {
        for (int j = 0; j < ep; j++)
            M->one_s[j] = M->cnt[j * L + l];
        int rc = comm_all_to_all_counts(c->comm, M->one_s, M->one_r, MODEL_EP_ALL_TO_ALL, err);
        if (rc)
            return rc;
        for (int j = 0; j < ep; j++) {
            M->blk[j * L + l] = M->one_r[j];
            M->recv[j] += M->one_r[j];
        }
    }
    int64_t t = 0;
    for (int j = 0; j < ep; j++)
        t += M->recv[j];
    if (t > cap)
        return px_fail(err, PX_ERUNTIME,
                       "rank %d: its experts received %lld token copies but the plan sized them "
                       "for %lld (training.moe_imbalance): raise it, or force the balance",
                       c->g.rank, (long long)t, (long long)cap);
    *total_recv = t;
    return PX_OK;
}

/* Rows of h elements between source-major ([j][l]) and expert-major ([l][j]) order. */
static void sort_blocks(const ExecMoe *M, const ExecCtx *c, void *dst, const void *src, int h,
                        int to_expert_major)
{
    const size_t row = (size_t)h * c->ab;
    size_t so = 0;
    for (int j = 0; j < M->ep; j++)
        for (int l = 0; l < M->L; l++) {
            const int64_t n = M->blk[j * M->L + l];
            /* the block's place in expert-major order: the rows of experts before l, then of
             * sources before j for expert l */
            size_t eo = 0;
            for (int l2 = 0; l2 < M->L; l2++)
                for (int j2 = 0; j2 < M->ep; j2++)
                    if (l2 < l || (l2 == l && j2 < j))
                        eo += (size_t)M->blk[j2 * M->L + l2];
            if (n > 0) {
                if (to_expert_major)
                    c->k->copy((char *)dst + eo * row, (const char *)src + so * row,
                               (size_t)n * row);
                else
                    c->k->copy((char *)dst + so * row, (const char *)src + eo * row,
                               (size_t)n * row);
            }
            so += (size_t)n;
        }
}

/* The rows of local expert l in expert-major order: *off, returns the count. */
static int64_t expert_rows(const ExecMoe *M, int l, int64_t *off)
{
    int64_t o = 0, n = 0;
    for (int l2 = 0; l2 <= l; l2++)
        for (int j = 0; j < M->ep; j++) {
            if (l2 < l)
                o += M->blk[j * M->L + l2];
            else
                n += M->blk[j * M->L + l2];
        }
    *off = o;
    return n;
}

int exec_moe_forward(ExecMoe *M, const ExecCtx *c, const ExecMoeViews *v, int layer_index,
                     void *y, const void *x, long long first_seq, double loss_weight,
                     double *aux_loss, PxError *err)
{
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ModelMoe *mo = &c->spec.model.moe;
    const int N = (int)d->tokens, h = d->h, E = mo->experts, K = mo->topk;
    const int eff = d->eff_loc, eff_out = d->eff_out_loc;
    const KernMoeRoute r = route_of(c, N, first_seq);
    int rc;
    /* router: fp32 logits into probs, scored in place */
    k->matmul(v->probs, PX_FP32, x, v->router_w, N, E, h, 0, 1, 1.0f, 0.0f);
    k->moe_route_fwd(v->probs, v->idx, v->w, v->probs, &r);
    /* the load-balancing loss over this micro-batch's tokens (Switch: coeff * E * f . P) */
    *aux_loss = 0;
    k->moe_counts(v->counts_f, v->idx, N, K, E);
    if (mo->aux_loss_coeff > 0) {
        float aux = 0;
        const double copies = (double)N * K;
        const float scale = (float)(mo->aux_loss_coeff * E / (copies * N) * loss_weight);
        k->moe_aux_fwd(v->aux_dev, v->probs, v->counts_f, N, E, scale);
        k->to_host(&aux, v->aux_dev, sizeof aux);
        *aux_loss = aux;
    }
    /* dispatch */
    k->moe_permute(v->ep_send, v->counts_i, NULL, x, v->idx, N, h, K, E);
    int64_t got = 0;
    if ((rc = exchange_counts(M, c, v->counts_f, d->routed, &got, err)))
        return rc;
    double *tpe = M->tokens_per_expert + (size_t)layer_index * (size_t)E;
    for (int e = 0; e < E; e++)
        tpe[e] += (double)M->cnt[e];
    for (int j = 0; j < M->ep; j++) {
        M->send[j] *= h;
        M->recv[j] *= h;
    }
    if ((rc = comm_all_to_allv(c->comm, v->ep_recv, M->recv, v->ep_send, M->send, c->act,
                               MODEL_EP_ALL_TO_ALL, err)))
        return rc;
    sort_blocks(M, c, v->exp_in, v->ep_recv, h, 1);
    /* the experts, one GEMM each on its rows: SwiGLU, out into ep_recv (expert-major) */
    for (int l = 0; l < M->L; l++) {
        int64_t o = 0;
        const int R = (int)expert_rows(M, l, &o);
        if (R == 0)
            continue;
        void *xin = EXEC_AT(v->exp_in, o * h, c->ab);
        void *act = EXEC_AT(v->exp_act_in, o * eff_out, c->ab);
        void *hid = EXEC_AT(v->exp_fc2_in, o * eff, c->ab);
        const void *w1 = EXEC_AT(v->fc1_w, (size_t)l * eff_out * h, c->ab);
        const void *w2 = EXEC_AT(v->fc2_w, (size_t)l * h * eff, c->ab);
        k->matmul(act, c->act, xin, w1, R, eff_out, h, 0, 1, 1.0f, 0.0f);
        k->swiglu_fwd(hid, act, R, eff);
        k->matmul(EXEC_AT(v->ep_recv, o * h, c->ab), c->act, hid, w2, R, h, eff, 0, 1, 1.0f,
                  0.0f);
    }
    /* combine: back to source-major, home, and the weighted sum */
    sort_blocks(M, c, v->ep_send, v->ep_recv, h, 0);
    if ((rc = comm_all_to_allv(c->comm, v->exp_out, M->send, v->ep_send, M->recv, c->act,
                               MODEL_EP_ALL_TO_ALL, err)))
        return rc;
    k->moe_unpermute(y, v->exp_out, v->w, v->idx, N, h, K, E);
    (void)got;
    return PX_OK;
}

int exec_moe_backward(ExecMoe *M, const ExecCtx *c, const ExecMoeViews *v, void *dx,
                      const void *dy, const void *x, long long first_seq, double loss_weight,
                      PxError *err)
{
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ModelMoe *mo = &c->spec.model.moe;
    const int N = (int)d->tokens, h = d->h, E = mo->experts, K = mo->topk;
    const int eff = d->eff_loc, eff_out = d->eff_out_loc;
    const KernMoeRoute r = route_of(c, N, first_seq);
    int rc;
    /* combine's backward: each copy's gradient and the weights' */
    k->moe_unpermute_bwd(v->ep_send, v->dw, dy, v->exp_out, v->w, v->idx, N, h, K, E);
    /* the same counts as the forward's, recomputed from idx, then the rows out */
    k->moe_counts(v->counts_f, v->idx, N, K, E);
    int64_t got = 0;
    if ((rc = exchange_counts(M, c, v->counts_f, d->routed, &got, err)))
        return rc;
    for (int j = 0; j < M->ep; j++) {
        M->send[j] *= h;
        M->recv[j] *= h;
    }
    if ((rc = comm_all_to_allv(c->comm, v->ep_recv, M->recv, v->ep_send, M->send, c->act,
                               MODEL_EP_ALL_TO_ALL, err)))
        return rc;
    sort_blocks(M, c, v->ws_dx, v->ep_recv, h, 1);
    for (int l = 0; l < M->L; l++) {
        int64_t o = 0;
        const int R = (int)expert_rows(M, l, &o);
        if (R == 0)
            continue;
        void *dout = EXEC_AT(v->ws_dx, o * h, c->ab);
        const void *xin = EXEC_AT(v->exp_in, o * h, c->ab);
        void *act = EXEC_AT(v->exp_act_in, o * eff_out, c->ab);
        void *hid = EXEC_AT(v->exp_fc2_in, o * eff, c->ab);
        const void *w1 = EXEC_AT(v->fc1_w, (size_t)l * eff_out * h, c->ab);
        const void *w2 = EXEC_AT(v->fc2_w, (size_t)l * h * eff, c->ab);
        float *g1 = v->g_fc1_w + (size_t)l * eff_out * h;
        float *g2 = v->g_fc2_w + (size_t)l * h * eff;
        /* fc2: its weight gradient reads the saved input, which then takes its gradient */
        k->matmul(g2, PX_FP32, dout, hid, h, eff, R, 1, 0, 1.0f, 1.0f);
        k->matmul(hid, c->act, dout, w2, R, eff, h, 0, 0, 1.0f, 0.0f);
        /* SwiGLU's backward in place over its saved input (kernels.h allows dinp == inp) */
        k->swiglu_bwd(act, act, hid, R, eff);
        k->matmul(g1, PX_FP32, act, xin, eff_out, h, R, 1, 0, 1.0f, 1.0f);
        /* the rows' input gradient over their output gradient, which is spent */
        k->matmul(dout, c->act, act, w1, R, h, eff_out, 0, 0, 1.0f, 0.0f);
    }
    sort_blocks(M, c, v->ep_recv, v->ws_dx, h, 0);
    if ((rc = comm_all_to_allv(c->comm, v->ep_send, M->send, v->ep_recv, M->recv, c->act,
                               MODEL_EP_ALL_TO_ALL, err)))
        return rc;
    k->moe_permute_bwd(dx, v->ep_send, v->idx, N, h, K, E);
    /* the router: the weights' gradient and the load-balancing loss's, to the logits */
    const float *dprobs = NULL;
    if (mo->aux_loss_coeff > 0) {
        const double copies = (double)N * K;
        const float scale = (float)(mo->aux_loss_coeff * E / (copies * N) * loss_weight);
        k->moe_aux_bwd(v->dlogits, v->counts_f, N, E, scale);
        dprobs = v->dlogits;
    }
    k->moe_route_bwd(v->dlogits, dprobs, v->dw, v->probs, v->idx, &r);
    /* logits = x router_w^T in fp32: dx += dlogits router_w, g_router += dlogits^T x (the CPU
     * computes in fp32: act is fp32 there; a 16-bit backend narrows dlogits first) */
    k->matmul(dx, c->act, v->dlogits, v->router_w, N, h, E, 0, 0, 1.0f, 1.0f);
    k->matmul(v->g_router_w, PX_FP32, v->dlogits, x, E, h, N, 1, 0, 1.0f, 1.0f);
    (void)got;
    return PX_OK;
}
