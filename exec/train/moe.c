/* A MoE layer's routed experts on this rank's tokens, forward and backward (docs/moe.md):
 * router -> top-k -> permutation into expert order -> counts exchanged -> all-to-all-v to the
 * expert ranks -> rows sorted by local expert -> the experts, SwiGLU or GeLU as the model's
 * MLP (one GEMM per expert on its rows) -> rows sorted back -> all-to-all-v home -> the
 * weighted sum of each token's k outputs. The
 * shared experts and the residual are the caller's (the layer's ordinary MLP path). Views are
 * bound by role (ExecMoeViews); nothing here allocates after exec_moe_init.
 *
 * Rows on an expert rank arrive from each source rank j as one block per local expert l
 * (source-major, [j][l]); the experts want them expert-major ([l][j]). Megatron-Core sorts the
 * chunks the same way (sort_chunks_by_idxs); here a device copy per block does it. */
#include <stdio.h>
#include <string.h>

#include "exec/train/internal.h"

int exec_moe_init(ExecMoe *M, const ExecCtx *c, PxError *err)
{
    memset(M, 0, sizeof *M);
    /* the cp ranks' counts are gathered into the router's [tokens, E] logit gradient scratch */
    if (c->d.moe && c->d.c > c->d.tokens)
        return px_fail(err, PX_EINPUT, "layout.cp %d: a MoE layer needs at least cp tokens per "
                       "rank (%lld)", c->d.c, (long long)c->d.tokens);
    const ModelConfig *cfg = &c->spec.model;
    const int E = cfg->moe.experts, ep = c->d.ep > 0 ? c->d.ep : 1;
    M->E = E;
    M->ep = ep;
    M->L = E / ep;
    M->etp = c->d.etp > 1 ? c->d.etp : 1;
    M->etp_rank = M->etp > 1 ? c->g.etp_rank : 0;
    M->m = c->d.m;
    const size_t wide = (size_t)(ep > M->etp ? ep : M->etp);
    /* the prediction modules' layers (mtp.c) after the model's */
    M->index = exec_zalloc((size_t)(cfg->layers + cfg->mtp_layers), sizeof *M->index);
    if (M->index)
        for (int l = 0; l < cfg->layers + cfg->mtp_layers; l++)
            M->index[l] = model_layer_is_moe(cfg, l) ? M->layers++ : -1;
    const size_t nl = (size_t)(M->layers > 0 ? M->layers : 1);
    M->cnt = exec_zalloc((size_t)E, sizeof *M->cnt);
    M->cntf = exec_zalloc((size_t)E, sizeof *M->cntf);
    M->send = exec_zalloc((size_t)ep, sizeof *M->send);
    M->recv = exec_zalloc((size_t)ep, sizeof *M->recv);
    M->blk = exec_zalloc((size_t)M->etp * (size_t)ep * (size_t)M->L, sizeof *M->blk);
    M->one_s = exec_zalloc(wide, sizeof *M->one_s);
    M->one_r = exec_zalloc(wide, sizeof *M->one_r);
    M->tokens_per_expert = exec_zalloc(nl * (size_t)E, sizeof *M->tokens_per_expert);
    M->gcount = exec_zalloc(nl * (size_t)(M->m > 0 ? M->m : 1) * (size_t)E, sizeof *M->gcount);
    const size_t nslots = nl * (size_t)(M->m > 0 ? M->m : 1);
    M->spill = exec_zalloc(nslots, sizeof *M->spill);
    M->spill_rows = exec_zalloc(nslots, sizeof *M->spill_rows);
    M->rows_max = exec_zalloc(nl, sizeof *M->rows_max);
    M->layer_extra = exec_zalloc(nl, sizeof *M->layer_extra);
    M->k = c->k;
    /* the capacity the simulator sizes d.routed for (model/spec.c): per source rank and
     * expert, so an expert rank's padded rows are etp x ep x L x capacity (its etp group's
     * sources, gathered) */
    if (cfg->moe.capacity_factor > 0 && c->d.routed > 0)
        M->capacity = (int)(c->d.routed / ((int64_t)ep * M->L * (c->d.etp > 0 ? c->d.etp : 1)));
    M->drop_steps = c->steps > 0 ? c->steps : 1;
    if (c->d.moe) {
        ModelLayerAct acts[MODEL_MOE_ACTS];
        model_moe_acts(&c->spec, &c->d, MODEL_RECOMPUTE_NONE, acts);
        M->fp8_in_bytes = acts[MODEL_TR_EXP_IN - MODEL_TR_ROUTER_PROBS].bytes;
        M->fp8_hid_bytes = acts[MODEL_TR_EXP_FC2_IN - MODEL_TR_ROUTER_PROBS].bytes;
    }
    M->dropped = exec_zalloc((size_t)M->drop_steps * nl, sizeof *M->dropped);
    if (!M->index || !M->cnt || !M->cntf || !M->send || !M->recv || !M->blk || !M->one_s ||
        !M->one_r || !M->tokens_per_expert || !M->gcount || !M->spill || !M->spill_rows ||
        !M->rows_max || !M->layer_extra || !M->dropped) {
        exec_moe_free(M);
        return px_fail(err, PX_ERUNTIME, "out of memory");
    }
    return PX_OK;
}

void exec_moe_free(ExecMoe *M)
{
    if (M->k) {
        for (int i = 0; M->spill && i < (M->layers > 0 ? M->layers : 1) * (M->m > 0 ? M->m : 1); i++)
            M->k->free(M->spill[i]);
        M->k->free(M->ep_recv);
        M->k->free(M->ws_dx);
    }
    free(M->spill);
    free(M->spill_rows);
    free(M->rows_max);
    free(M->layer_extra);
    free(M->growth);
    free(M->dropped);
    free(M->index);
    free(M->cnt);
    free(M->cntf);
    free(M->send);
    free(M->recv);
    free(M->blk);
    free(M->one_s);
    free(M->one_r);
    free(M->tokens_per_expert);
    free(M->gcount);
    memset(M, 0, sizeof *M);
}

void exec_moe_step_begin(ExecMoe *M)
{
    if (!M->tokens_per_expert)
        return;
    memset(M->tokens_per_expert, 0,
           (size_t)(M->layers > 0 ? M->layers : 1) * (size_t)M->E * sizeof *M->tokens_per_expert);
    M->aux_sum = 0;
    M->steps_begun++;
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

/* The router's forward over this rank's rows (kern moe_route_fwd). Forced balance chooses by a
 * row's global id, which the kernel reads as runs of seq_rows ids; under context parallelism a
 * rank's part of a sequence is two chunks far apart (exec_cp_part_pos), each at its own
 * place, so the rows go in one call per run of consecutive ids: per sequence, this rank's SP
 * slice of the cp part cut where the chunks meet. */
static void route_fwd(const ExecCtx *c, const ExecMoeViews *v, const KernMoeRoute *rt)
{
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    if (!rt->force_balance || d->c <= 1) {
        k->moe_route_fwd(v->probs, v->idx, v->w, v->probs, rt);
        return;
    }
    const int E = rt->E, K = rt->topk, C = exec_cp_part_len(c);
    const int rows = d->s_sp, p0 = exec_sp_on(c) ? c->g.tp_rank * d->s_sp : 0;
    const uint64_t seq0 = rt->first - (uint64_t)p0; /* the micro-batch's first sequence's id */
    for (int q = 0; q < d->b; q++)
        for (int p = p0; p < p0 + rows;) {
            const int j = p / C, end = (j + 1) * C < p0 + rows ? (j + 1) * C : p0 + rows;
            const size_t n = (size_t)q * rows + (size_t)(p - p0);
            KernMoeRoute run = *rt;
            run.N = end - p;
            run.seq_rows = run.N;
            run.seq_stride = run.N;
            run.first = seq0 + (uint64_t)q * (uint64_t)d->s +
                        (uint64_t)(exec_cp_part_pos(c, c->g.cp_rank, j) + p - j * C);
            k->moe_route_fwd(v->probs + n * E, v->idx + n * K, v->w + n * K, v->probs + n * E,
                             &run);
            p = end;
        }
}

/* The load-balancing loss's factor (Switch Transformer, Fedus et al. 2021, eq. 4, as
 * Megatron-Core's switch_load_balancing_loss): coeff * E / (topk * T^2) over the T tokens of
 * the whole micro-batch (its SP shards and cp parts together), so that every layout computes
 * the same loss; times loss_weight. */
static float aux_scale(const ExecCtx *c, double loss_weight)
{
    const ModelMoe *mo = &c->spec.model.moe;
    const double T = (double)c->d.tokens * (exec_sp_on(c) ? c->d.t : 1) * c->d.c;
    return (float)(mo->aux_loss_coeff * mo->experts / (mo->topk * T * T) * loss_weight);
}

/* The op of (role, layer, phase) of the given compute kind (the router has a GEMM and a
 * permutation under one role), or the communication `kind`. -1 when the graph has none. */
static int moe_op(const ExecLayerRun *r, ModelOpRole role, int l, int chunk, ModelPhase ph,
                  ModelOpKind want, int kind)
{
    for (int k = 0; k < 4; k++) {
        int op = exec_meter_find(r->M, role, l, chunk, ph, kind, k);
        if (op < 0)
            return -1;
        if (kind != MODEL_COMM_COUNT || r->M->graph->op[op].kind == want)
            return op;
    }
    return -1;
}

static int need_op(const ExecLayerRun *r, ModelOpRole role, int l, int chunk, ModelPhase ph,
                   ModelOpKind want, int kind, int *op, PxError *err)
{
    *op = moe_op(r, role, l, chunk, ph, want, kind);
    if (*op >= 0)
        return PX_OK;
    char what[96];
    snprintf(what, sizeof what, "layer.%d.%s.%s.%s", l, model_op_role_name(role),
             kind == MODEL_COMM_COUNT ? "compute" : model_comm_name((ModelComm)kind),
             model_phase_name(ph));
    return exec_meter_missing(r->c, what, err);
}

/* The ops a MoE layer's pass times, found once per pass by role, kind and phase: the router's
 * GEMM and permutation, the combine's, the experts' three, and when they exist the counts'
 * exchanges for the load-balancing loss (aux: the forward's; the all-reduce over TP with SP,
 * the all-gather over cp) and the dispatch and combine all-to-alls (ep > 1); -1 where
 * absent. */
typedef struct {
    int mm, perm, comb, fc1, act, fc2, ar, disp, back;
    int cpg; /* cp > 1: the counts all-gathered over the cp ranks */
    int ag, rs; /* etp > 1: the gather of the experts' rows over etp, and its reduce-scatter */
} MoeOps;

static int find_ops(const ExecLayerRun *r, int l, int chunk, ModelPhase ph, int aux, int ep,
                    int etp, MoeOps *o, PxError *err)
{
    o->ar = o->disp = o->back = o->ag = o->rs = o->cpg = o->perm = -1;
    const int want_ar = aux && exec_sp_on(r->c);
    /* the all-gather dispatcher's own ops are find_ag_ops'; its router permutes nothing */
    const int ag = exec_moe_allgather(r->c);
    if (ag)
        ep = etp = 1;
    int rc;
    if (aux && r->c->d.c > 1 &&
        (rc = need_op(r, MODEL_OPR_ROUTER, l, chunk, ph, MODEL_OP_COMM, MODEL_CP_ALL_GATHER,
                      &o->cpg, err)))
        return rc;
    /* the gather sits on the experts' input side: the dispatch forward, the combine backward */
    const ModelOpRole in_side = ph == MODEL_BWD ? MODEL_OPR_COMBINE : MODEL_OPR_DISPATCH;
    const ModelOpRole out_side = ph == MODEL_BWD ? MODEL_OPR_DISPATCH : MODEL_OPR_COMBINE;
    if (etp > 1 &&
        ((rc = need_op(r, in_side, l, chunk, ph, MODEL_OP_COMM, MODEL_ETP_ALL_GATHER, &o->ag, err)) ||
         (rc = need_op(r, out_side, l, chunk, ph, MODEL_OP_COMM, MODEL_ETP_REDUCE_SCATTER, &o->rs,
                       err))))
        return rc;
    if ((rc = need_op(r, MODEL_OPR_ROUTER, l, chunk, ph, MODEL_OP_MATMUL, MODEL_COMM_COUNT, &o->mm,
                      err)) ||
        (!ag && (rc = need_op(r, MODEL_OPR_ROUTER, l, chunk, ph, MODEL_OP_PERMUTE,
                              MODEL_COMM_COUNT, &o->perm, err))) ||
        (rc = need_op(r, MODEL_OPR_COMBINE, l, chunk, ph, MODEL_OP_PERMUTE, MODEL_COMM_COUNT,
                      &o->comb, err)) ||
        (rc = need_op(r, MODEL_OPR_EXP_FC1, l, chunk, ph, MODEL_OP_MATMUL, MODEL_COMM_COUNT,
                      &o->fc1, err)) ||
        (rc = need_op(r, MODEL_OPR_EXP_ACT, l, chunk, ph, MODEL_OP_ACTIVATION, MODEL_COMM_COUNT,
                      &o->act, err)) ||
        (rc = need_op(r, MODEL_OPR_EXP_FC2, l, chunk, ph, MODEL_OP_MATMUL, MODEL_COMM_COUNT,
                      &o->fc2, err)) ||
        (want_ar && (rc = need_op(r, MODEL_OPR_ROUTER, l, chunk, ph, MODEL_OP_COMM,
                                  MODEL_TP_ALLREDUCE, &o->ar, err))) ||
        (ep > 1 && ((rc = need_op(r, MODEL_OPR_DISPATCH, l, chunk, ph, MODEL_OP_COMM,
                                  MODEL_EP_ALL_TO_ALL, &o->disp, err)) ||
                    (rc = need_op(r, MODEL_OPR_COMBINE, l, chunk, ph, MODEL_OP_COMM,
                                  MODEL_EP_ALL_TO_ALL, &o->back, err)))))
        return rc;
    return PX_OK;
}

/* op scopes (exec_meter_open) */
static void op_open(const ExecLayerRun *r, int op) { exec_meter_open(r->M, r->c->k, op); }
static void op_again(const ExecLayerRun *r, int op) { exec_meter_open_again(r->M, r->c->k, op); }
static void op_close(const ExecLayerRun *r, int op) { exec_meter_close(r->M, r->c->k, op); }

/* The copies this rank sends to each expert-parallel rank: its counts summed over that rank's
 * local experts. */
static void sum_sends(ExecMoe *M)
{
    for (int j = 0; j < M->ep; j++) {
        M->send[j] = 0;
        for (int l = 0; l < M->L; l++)
            M->send[j] += M->cnt[j * M->L + l];
    }
}

/* This rank's routed copies per expert, from the device counts, and the rows it sends each
 * expert rank (sum_sends). The counts exchange that follows (ep > 1) fills blk and recv; rows
 * beyond the plan's buffers grow them (dropless: docs/moe.md). */
static void local_counts(ExecMoe *M, const ExecCtx *c, const float *cnt_dev)
{
    c->k->to_host(M->cntf, cnt_dev, (size_t)M->E * sizeof *M->cntf);
    for (int e = 0; e < M->E; e++)
        M->cnt[e] = (int64_t)M->cntf[e]; /* exact: counts stay below 2^24 */
    sum_sends(M);
}

/* etp > 1: every etp rank's counts (blk's other parts), one exchange per (source, expert) as
 * for ep, and the rows of the gathered buffer: etp parts of M->pad rows each (*total). The
 * parts are padded to the plan's routed / etp at least, so that the all-gather and the
 * reduce-scatter move the buffer the plan priced (Megatron-Core's gather of the experts' rows
 * over etp). */
static int exchange_etp(ExecMoe *M, const ExecCtx *c, int64_t *total, PxError *err)
{
    const int n = M->ep * M->L, me = M->etp_rank;
    for (int x = 0; x < n; x++) {
        for (int i = 0; i < M->etp; i++)
            M->one_s[i] = M->blk[me * n + x];
        int rc = comm_all_to_all_counts(c->comm, M->one_s, M->one_r, MODEL_ETP_ALL_GATHER, err);
        if (rc)
            return rc;
        for (int i = 0; i < M->etp; i++)
            M->blk[i * n + x] = i == me ? M->blk[me * n + x] : M->one_r[i];
    }
    int64_t pad = c->d.routed / M->etp;
    M->rows_real = 0;
    for (int i = 0; i < M->etp; i++) {
        int64_t part = 0;
        for (int x = 0; x < n; x++)
            part += M->blk[i * n + x];
        pad = part > pad ? part : pad;
        M->rows_real += part;
    }
    M->pad = pad;
    *total = pad * M->etp;
    return PX_OK;
}

/* Token dropping: each expert keeps at most M->capacity of this rank's copies (moe_drop marked
 * the rest on the device, so the host clamps the counts it read before the marks); returns the
 * copies dropped. */
static int64_t clamp_counts(ExecMoe *M)
{
    int64_t dropped = 0;
    for (int e = 0; e < M->E; e++)
        if (M->cnt[e] > M->capacity) {
            dropped += M->cnt[e] - M->capacity;
            M->cnt[e] = M->capacity;
        }
    sum_sends(M);
    return dropped;
}

static int exchange_counts(ExecMoe *M, const ExecCtx *c, int64_t *total, PxError *err)
{
    const int ep = M->ep, L = M->L;
    int64_t *blk = M->blk + (size_t)M->etp_rank * (size_t)ep * (size_t)L; /* this rank's part */
    for (int j = 0; j < ep; j++)
        M->recv[j] = 0;
    for (int l = 0; l < L; l++) {
        for (int j = 0; j < ep; j++)
            M->one_s[j] = M->cnt[j * L + l];
        int rc = ep > 1 ? comm_all_to_all_counts(c->comm, M->one_s, M->one_r,
                                                  MODEL_EP_ALL_TO_ALL, err)
                        : (M->one_r[0] = M->one_s[0], PX_OK);
        if (rc)
            return rc;
        for (int j = 0; j < ep; j++) {
            blk[j * L + l] = M->one_r[j];
            M->recv[j] += M->one_r[j];
        }
    }
    int64_t t = 0;
    for (int j = 0; j < ep; j++)
        t += M->recv[j];
    *total = t;
    return M->etp > 1 ? exchange_etp(M, c, total, err) : PX_OK;
}

/* Dropless routing: rows are rounded up to this many when a buffer grows, so that a routing
 * that creeps up a few copies at a time does not reallocate every step. */
enum { MOE_GROW_ROWS = 64 };

static int64_t grown_rows(int64_t t) { return (t + MOE_GROW_ROWS - 1) / MOE_GROW_ROWS * MOE_GROW_ROWS; }

/* One more entry of the growth log (run.json's moe.layers[].growth); a log that cannot grow
 * loses the entry, not the run: the bytes stay counted in extra[]. */
static void log_growth(ExecMoe *M, int li, uint64_t bytes)
{
    if (M->n_growth > 0 && M->growth[M->n_growth - 1].layer == li &&
        M->growth[M->n_growth - 1].step == M->steps_begun) {
        M->growth[M->n_growth - 1].bytes += bytes;
        return;
    }
    if (M->n_growth == M->cap_growth) {
        int cap = M->cap_growth ? 2 * M->cap_growth : 16;
        struct ExecMoeGrowth *g = realloc(M->growth, (size_t)cap * sizeof *g);
        if (!g)
            return;
        M->growth = g;
        M->cap_growth = cap;
    }
    M->growth[M->n_growth++] = (struct ExecMoeGrowth){li, M->steps_begun, bytes};
}

/* Replaces *buf by a zeroed buffer of `bytes` (the old one freed), counting the growth against
 * MoE layer li, the one whose routing asked for it. */
static int regrow(ExecMoe *M, void **buf, size_t old_bytes, size_t bytes, ModelCategory cat,
                  int li, PxError *err)
{
    void *p = M->k->alloc(bytes);
    if (!p)
        return px_fail(err, PX_ERUNTIME,
                       "out of device memory growing the MoE buffers to %zu bytes (dropless "
                       "routing past the plan's training.moe_imbalance): plan with a larger "
                       "--moe-imbalance, or --moe-capacity-factor to drop tokens",
                       bytes);
    M->k->free(*buf);
    *buf = p;
    M->extra[cat] += bytes - old_bytes;
    M->layer_extra[li] += bytes - old_bytes;
    log_growth(M, li, bytes - old_bytes);
    return PX_OK;
}

/* The views of MoE layer l's micro-batch mb for the t rows its experts take on this rank: the
 * plan's (the arenas) while t fits d.routed; past it the buffers grow instead of dropping a
 * copy (Megatron-Core's dropless default): the saved rows of this (layer, micro-batch) and the
 * shared receive and gradient scratch, kept for the next time. FP8 experts quantize their rows
 * through ws.fp8, which the plan sizes: there the run stops, naming the counts. */
static int fit_rows(ExecMoe *M, const ExecCtx *c, int layer, int mb, int64_t t, ExecMoeViews *v,
                    PxError *err)
{
    const int li = M->index[layer];
    const int64_t took = M->etp > 1 ? M->rows_real : t; /* not the etp parts' padding */
    if (took > M->rows_max[li])
        M->rows_max[li] = took;
    if (t <= c->d.routed)
        return PX_OK;
    if (v->f1 || v->f2)
        return px_fail(err, PX_ERUNTIME,
                       "rank %d: its experts received %lld token copies but the plan sized them "
                       "for %lld (training.moe_imbalance), and FP8 experts run dropless only "
                       "within the plan's buffers: raise it, or force the balance",
                       c->g.rank, (long long)t, (long long)c->d.routed);
    const size_t ab = c->ab, h = (size_t)c->d.h;
    /* the all-gather dispatcher keeps the experts' outputs beside their inputs */
    const int ag = exec_moe_allgather(c);
    const size_t row = (h + (size_t)c->d.eff_out_loc + (size_t)c->d.eff_loc + (ag ? h : 0)) * ab;
    const size_t slot = (size_t)li * (size_t)M->m + (size_t)mb;
    int rc;
    if (t > M->spill_rows[slot]) {
        const int64_t n = grown_rows(t);
        if ((rc = regrow(M, &M->spill[slot], (size_t)M->spill_rows[slot] * row, (size_t)n * row,
                         MODEL_ACTIVATIONS, li, err)))
            return rc;
        M->spill_rows[slot] = n;
    }
    if (t > M->scratch_rows) {
        const int64_t n = grown_rows(t);
        const size_t was = (size_t)M->scratch_rows * h * ab, now = (size_t)n * h * ab;
        if ((M->ep * M->etp > 1 && !ag &&
             (rc = regrow(M, &M->ep_recv, was, now, MODEL_COMM_BUFFERS, li, err))) ||
            (rc = regrow(M, &M->ws_dx, was, now, MODEL_WORKSPACE, li, err)))
            return rc;
        M->scratch_rows = n;
    }
    char *base = M->spill[slot];
    const size_t n = (size_t)M->spill_rows[slot];
    v->exp_in = base;
    v->exp_act_in = base + n * h * ab;
    v->exp_fc2_in = base + n * (h + (size_t)c->d.eff_out_loc) * ab;
    if (ag)
        v->exp_out = base + n * (h + (size_t)c->d.eff_out_loc + (size_t)c->d.eff_loc) * ab;
    if (M->ep * M->etp > 1 && !ag)
        v->ep_recv = M->ep_recv;
    v->ws_dx = M->ws_dx;
    return PX_OK;
}

/* Rows of h elements between source-major ([j][l]) and expert-major ([l][j]) order; with
 * etp > 1 the sources are every etp rank's ep sources, each etp rank's rows a part of M->pad
 * rows of the gathered buffer. */
static void sort_blocks(const ExecMoe *M, const ExecCtx *c, void *dst, const void *src, int h,
                        int to_expert_major)
{
    const size_t row = (size_t)h * c->ab;
    const int S = M->etp * M->ep; /* sources: (etp rank, ep rank), the etp rank slower */
    size_t so = 0;
    for (int j = 0; j < S; j++)
        for (int l = 0; l < M->L; l++) {
            /* etp > 1: each etp rank's part of the gathered buffer starts at its pad */
            if (M->etp > 1 && j % M->ep == 0 && l == 0)
                so = (size_t)(j / M->ep) * (size_t)M->pad;
            const int64_t n = M->blk[j * M->L + l];
            /* the block's place in expert-major order: the rows of experts before l, then of
             * sources before j for expert l */
            size_t eo = 0;
            for (int l2 = 0; l2 < M->L; l2++)
                for (int j2 = 0; j2 < S; j2++)
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
        for (int j = 0; j < M->etp * M->ep; j++) {
            if (l2 < l)
                o += M->blk[j * M->L + l2];
            else
                n += M->blk[j * M->L + l2];
        }
    *off = o;
    return n;
}

/* The real rows this expert rank's experts take: every source's blocks (with etp > 1 the
 * sources of every etp rank, gathered). */
static int64_t real_rows(const ExecMoe *M)
{
    int64_t real = 0;
    for (int i = 0; i < M->etp * M->ep * M->L; i++)
        real += M->blk[i];
    return real;
}

/* Zeroes rows [real, d.routed) of buf ([d.routed, h] act): a capacity's padding rows, after
 * the real rows this expert rank received (the blocks' counts). */
static void pad_zero(const ExecMoe *M, const ExecCtx *c, void *buf)
{
    const int64_t real = real_rows(M);
    if (M->capacity > 0 && real < c->d.routed)
        c->k->memset0(EXEC_AT(buf, real * c->d.h, c->ab),
                      (size_t)(c->d.routed - real) * (size_t)c->d.h * c->ab);
}

/* The GEMM segments of the experts' rows: segment s < L the rows of local expert s; with a
 * capacity, segment L + l is expert l's padding up to etp x ep x capacity rows (each of its
 * sources' capacity; Megatron-Core's
 * moe_pad_expert_input_to_capacity), zero rows after all the real ones (`real` of them), so
 * that the GEMMs run on d.routed rows as the plan prices them. *l gets the expert. Under FP8
 * a segment is a tensor of its own: the padding's zero rows quantize to zero codes with a
 * scale of 1 (current scaling) or their expert's decode factor (delayed), record no amax
 * (theirs is 0: the expert's input's amax is its real rows'), and keep their scale beside the
 * real rows' (model_moe_acts prices two per expert under a per-tensor recipe; row-wise
 * recipes' scales are the rows' own). */
static int seg_count(const ExecMoe *M) { return M->capacity > 0 ? 2 * M->L : M->L; }

static int64_t seg_rows(const ExecMoe *M, int s, int *l, int64_t *off)
{
    if (s < M->L) {
        *l = s;
        return expert_rows(M, s, off);
    }
    *l = s - M->L;
    int64_t o = real_rows(M), n = 0, dummy = 0; /* the real rows come first */
    for (int l2 = 0; l2 <= *l; l2++) {
        n = (int64_t)M->etp * M->ep * M->capacity - expert_rows(M, l2, &dummy);
        if (l2 < *l)
            o += n;
    }
    *off = o;
    return n;
}

/* Under FP8 the experts' saved inputs hold one FP8 tensor of its rows x cols per local expert,
 * expert after expert (the loops over the experts keep the running offset): one's bytes. */
static size_t fp8_rows_bytes(const ExecFp8 *F, int rows, int cols)
{
    const KernFp8 f = exec_fp8_desc(F, rows, cols, 0, 0);
    return rows > 0 ? kern_fp8_bytes(&f) : 0;
}

/* The bytes of the FP8 tensors of every segment of rows of `cols` elements. */
static size_t fp8_segs_bytes(const ExecMoe *M, const ExecFp8 *F, int cols)
{
    size_t q = 0;
    for (int sg = 0; sg < seg_count(M); sg++) {
        int64_t o = 0;
        int l = 0;
        q += fp8_rows_bytes(F, (int)seg_rows(M, sg, &l, &o), cols);
    }
    return q;
}

/* FP8 experts: the segments' tensors (a capacity's padding ones too, with their scales) fit in
 * the saved inputs the plan sized, or the run stops before writing past them. */
static int fp8_fits(const ExecMoe *M, const ExecLayerRun *r, const ExecMoeViews *v, PxError *err)
{
    if (!v->f1 && !v->f2)
        return PX_OK;
    const size_t in = fp8_segs_bytes(M, r->fp8, r->c->d.h);
    const size_t hid = fp8_segs_bytes(M, r->fp8, r->c->d.eff_loc);
    if (in <= M->fp8_in_bytes && hid <= M->fp8_hid_bytes)
        return PX_OK;
    return px_fail(err, PX_ERUNTIME,
                   "rank %d: the experts' FP8 inputs take %zu and %zu bytes but the plan's "
                   "moe.experts.fc1.in and moe.experts.fc2.in hold %llu and %llu: model/ and "
                   "exec/ disagree",
                   r->c->g.rank, in, hid, (unsigned long long)M->fp8_in_bytes,
                   (unsigned long long)M->fp8_hid_bytes);
}

/* One all-to-all-v of rows of h elements, send and receive counts in rows (the exchange's). */
static int rows_a2a(ExecMoe *M, const ExecCtx *c, void *out, const int64_t *recv_rows,
                    const void *in, const int64_t *send_rows, PxError *err)
{
    for (int j = 0; j < M->ep; j++) {
        M->one_s[j] = send_rows[j] * c->d.h;
        M->one_r[j] = recv_rows[j] * c->d.h;
    }
    return comm_all_to_allv(c->comm, out, M->one_r, in, M->one_s, c->act, MODEL_EP_ALL_TO_ALL,
                            err);
}

/* --fp8-dispatch's scales: one per sender (tensorwise), else one set per row. */
static int fp8_per_tensor(const ExecFp8 *F)
{
    return F->recipe == MODEL_FP8_TENSORWISE || F->recipe == MODEL_FP8_DELAYED;
}

/* The bytes of a part of the FP8 rows as the all-to-all leaves them: pad rows from ep senders
 * (model_fp8_dispatch_bytes; the real rows first, then room). Over etp each rank's part is one
 * of these in the gathered buffer. */
static size_t fp8_part_bytes(const ExecMoe *M, const ExecLayerRun *r)
{
    return (size_t)model_fp8_dispatch_bytes(r->fp8->recipe, M->pad, r->c->d.h, M->ep);
}

/* Decodes a part of FP8 rows at q into out (act rows, source order): rows[j] rows from sender
 * j, as the all-to-all left them: each sender's codes then its scale (per tensor), or all the
 * codes then all the rows' scales (row-wise). */
static void fp8_decode(const ExecMoe *M, const ExecLayerRun *r, void *out, const uint8_t *q,
                       const int64_t *rows)
{
    const ExecCtx *c = r->c;
    ExecFp8 *F = r->fp8;
    const int h = c->d.h;
    int64_t all = 0;
    for (int j = 0; j < M->ep; j++)
        all += rows[j];
    if (!fp8_per_tensor(F)) {
        const KernFp8 f = exec_fp8_desc(F, (int)all, h, 0, 0);
        if (all > 0)
            c->k->fp8_dequantize(out, q, &f);
        return;
    }
    size_t qo = 0;
    int64_t oo = 0;
    for (int j = 0; j < M->ep; j++) {
        if (rows[j] > 0) {
            const KernFp8 f = exec_fp8_desc(F, (int)rows[j], h, 0, 0);
            c->k->fp8_dequantize(EXEC_AT(out, oo * h, c->ab), q + qo, &f);
        }
        qo += (size_t)rows[j] * (size_t)h + sizeof(float);
        oo += rows[j];
    }
}

/* --fp8-dispatch under a per-tensor scale (tensorwise: the current amax of the rows this rank
 * sends; delayed: the decode factor of their amax history, exec_fp8_dispatch_quantize, which a
 * forward's dispatch (rec), not a recompute's, rolls their amax into): the rows quantized with one
 * scale into q1, then each peer's message in q0 its rows' codes and a copy of that fp32 scale
 * (sent to every peer, rows or none: ep scales, as model_fp8_dispatch_bytes counts them),
 * received into dst. One all-to-all-v of bytes. */
static int fp8_tensor_a2a(ExecMoe *M, const ExecLayerRun *r, const ExecMoeViews *v, uint8_t *dst,
                          const void *in, int64_t sent, int rec, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    ExecFp8 *F = r->fp8;
    const int h = c->d.h;
    const size_t sc = sizeof(float);
    uint8_t *q0 = F->q0, *q1 = F->q1;
    const uint8_t *scale = q1 + (size_t)sent * (size_t)h;
    if (F->recipe == MODEL_FP8_DELAYED) {
        exec_fp8_dispatch_quantize(F, c, v->f1, q1, in, (int)sent, h, rec);
    } else if (sent > 0) {
        const KernFp8 fs = exec_fp8_desc(F, (int)sent, h, 0, 0);
        k->fp8_quantize(q1, NULL, in, &fs, 0, NULL);
    } else {
        k->memset0(q1, sc); /* no rows: a zero scale, which nothing decodes with */
    }
    size_t so = 0, mo = 0;
    for (int j = 0; j < M->ep; j++) {
        const size_t n = (size_t)M->send[j] * (size_t)h;
        if (n > 0)
            k->copy(q0 + mo, q1 + so, n);
        k->copy(q0 + mo + n, scale, sc);
        M->one_s[j] = (int64_t)(n + sc);
        M->one_r[j] = M->recv[j] * h + (int64_t)sc;
        so += n;
        mo += n + sc;
    }
    return comm_all_to_allv(c->comm, dst, M->one_r, q0, M->one_s, PX_FP8, MODEL_EP_ALL_TO_ALL, err);
}

/* Row-wise scales (blockwise's 1 x 128, MXFP8's 1 x 32) belong to one row, so that a peer's
 * rows carry their own: the rows quantized into q0, the elements and the scales two calls of
 * one op (model_fp8_bytes of the rows sent), received into dst. */
static int fp8_row_a2a(ExecMoe *M, const ExecLayerRun *r, uint8_t *dst, const void *in,
                       int64_t sent, int64_t got, PxError *err)
{
    const ExecCtx *c = r->c;
    ExecFp8 *F = r->fp8;
    const int h = c->d.h;
    const KernFp8 fs = exec_fp8_desc(F, (int)sent, h, 0, 0);
    c->k->fp8_quantize(F->q0, NULL, in, &fs, 0, NULL);
    /* a row's scale bytes, the same on every rank whatever it sends (one row's layout) */
    const KernFp8 one = exec_fp8_desc(F, 1, h, 0, 0);
    const int64_t row_scales = (int64_t)(kern_fp8_bytes(&one) - (size_t)h);
    for (int j = 0; j < M->ep; j++) {
        M->one_s[j] = M->send[j] * h;
        M->one_r[j] = M->recv[j] * h;
    }
    int rc = comm_all_to_allv(c->comm, dst, M->one_r, F->q0, M->one_s, PX_FP8,
                              MODEL_EP_ALL_TO_ALL, err);
    for (int j = 0; j < M->ep; j++) {
        M->one_s[j] = M->send[j] * row_scales;
        M->one_r[j] = M->recv[j] * row_scales;
    }
    /* collective: every rank calls it, one that sends or receives no rows with zero counts */
    if (!rc)
        rc = comm_all_to_allv(c->comm, dst + got * h, M->one_r,
                              (const uint8_t *)F->q0 + sent * h, M->one_s, PX_FP8,
                              MODEL_EP_ALL_TO_ALL, err);
    return rc;
}

/* --fp8-dispatch (DeepSeek-V3): the forward's rows quantized once before the all-to-all and
 * sent in one byte an element with their scales (fp8_row_a2a, fp8_tensor_a2a), then decoded
 * into out for the experts, whose GEMMs quantize each expert's rows as without it. With
 * etp > 1 the rows stay in FP8 in this etp rank's part of ws.fp8's second copy (parts of
 * fp8_part_bytes), for fp8_etp_gather. model/ops.c's moe_forward counts both
 * (model_fp8_dispatch_bytes). Through ws.fp8's two FP8 copies, sized for the routed rows. */
static int fp8_rows_a2a(ExecMoe *M, const ExecLayerRun *r, const ExecMoeViews *v, void *out,
                        const void *in, int rec, PxError *err)
{
    ExecFp8 *F = r->fp8;
    const int h = r->c->d.h;
    int64_t sent = 0, got = 0;
    for (int j = 0; j < M->ep; j++) {
        sent += M->send[j];
        got += M->recv[j];
    }
    const int pt = fp8_per_tensor(F);
    const size_t extra = pt ? (size_t)M->ep * sizeof(float) : 0;
    const KernFp8 fs = exec_fp8_desc(F, (int)sent, h, 0, 0), fr = exec_fp8_desc(F, (int)got, h, 0, 0);
    /* etp 1: the whole copy (M->pad counts the parts of etp > 1 alone) */
    const size_t q = F->lay.q_bytes, part = M->etp > 1 ? fp8_part_bytes(M, r) : q;
    const size_t in_b = pt ? (size_t)got * (size_t)h + extra : kern_fp8_bytes(&fr);
    const size_t out_b = pt ? (size_t)sent * (size_t)h + extra : kern_fp8_bytes(&fs);
    if ((!pt && fs.block_r != 1) || out_b > q || in_b > part || (size_t)M->etp * part > q)
        return px_fail(err, PX_ERUNTIME, "FP8 dispatch of %lld rows out and %lld in (parts of "
                       "%llu bytes over etp %d): ws.fp8 holds %llu bytes a copy",
                       (long long)sent, (long long)got, (unsigned long long)part, M->etp,
                       (unsigned long long)q);
    uint8_t *dst = (uint8_t *)F->q1 + (size_t)M->etp_rank * part;
    int rc = pt ? fp8_tensor_a2a(M, r, v, dst, in, sent, rec, err)
                : fp8_row_a2a(M, r, dst, in, sent, got, err);
    if (!rc && M->etp == 1)
        fp8_decode(M, r, out, dst, M->recv);
    return rc;
}

/* With etp > 1, after fp8_rows_a2a: every etp rank's part of FP8 rows gathered over etp (one
 * all-gather of bytes, etp x fp8_part_bytes: model_fp8_dispatch_bytes of the routed rows from
 * etp x ep senders), and each part decoded into its place in ep_recv (pad rows apart), its
 * senders' rows counted by the blocks. */
static int fp8_etp_gather(ExecMoe *M, const ExecLayerRun *r, void *ep_recv, PxError *err)
{
    const ExecCtx *c = r->c;
    const size_t part = fp8_part_bytes(M, r);
    uint8_t *q1 = r->fp8->q1;
    int rc = comm_all_gather(c->comm, q1, q1 + (size_t)M->etp_rank * part, part, PX_FP8,
                             MODEL_ETP_ALL_GATHER, NULL, err);
    for (int i = 0; !rc && i < M->etp; i++) {
        for (int j = 0; j < M->ep; j++) {
            M->one_r[j] = 0;
            for (int l = 0; l < M->L; l++)
                M->one_r[j] += M->blk[((size_t)i * M->ep + j) * M->L + l];
        }
        fp8_decode(M, r, EXEC_AT(ep_recv, (size_t)i * (size_t)M->pad * (size_t)c->d.h, c->ab),
                   q1 + (size_t)i * part, M->one_r);
    }
    return rc;
}

/* The experts' forward, one GEMM each on its rows (expert-major, in rows_in): fc1, the
 * activation (SwiGLU or GeLU), fc2 into eout, each under its op; under FP8 each expert's rows
 * are quantized into the saved input first (rec: a forward, whose casts delayed scaling
 * records). */
static void experts_fwd(const ExecMoe *M, const ExecLayerRun *r, const MoeOps *ops,
                        const ExecMoeViews *v, const void *rows_in, void *eout, int rec)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const int h = c->d.h, eff = c->d.eff_loc, eff_out = c->d.eff_out_loc;
    ExecFp8 *F = r->fp8;
    op_open(r, ops->fc1);
    size_t q = 0;
    for (int sg = 0; sg < seg_count(M); sg++) {
        int64_t o = 0;
        int l = 0;
        const int R = (int)seg_rows(M, sg, &l, &o);
        const int srec = rec && sg < M->L; /* the padding records nothing */
        if (R > 0 && v->f1) {
            const ExecFp8Ref xq = exec_fp8_quantize(F, c, (uint8_t *)v->exp_in + q,
                                                    EXEC_AT(rows_in, o * h, c->ab), R, h, 0,
                                                    EXEC_FP8_X, v->f1, l, srec);
            q += fp8_rows_bytes(F, R, h);
            exec_fp8_linear_fwd(F, c, r->M, EXEC_AT(v->exp_act_in, o * eff_out, c->ab), xq, v->f1,
                                l, R, srec);
        } else if (R > 0) {
            k->matmul(EXEC_AT(v->exp_act_in, o * eff_out, c->ab), c->act,
                      EXEC_AT(v->exp_in, o * h, c->ab),
                      EXEC_AT(v->fc1_w, (size_t)l * eff_out * h, c->ab), R, eff_out, h, 0, 1,
                      1.0f, 0.0f);
            exec_meter_flops(r->M, 2.0 * R * eff_out * h);
        }
        if (R > 0 && v->fc1_b)
            k->add_bias(EXEC_AT(v->exp_act_in, o * eff_out, c->ab),
                        EXEC_AT(v->fc1_b, (size_t)l * eff_out, c->ab), R, eff_out);
    }
    op_close(r, ops->fc1);
    /* the activation's output: the fc2 input, saved as it is or (FP8) quantized from ws.fp8 */
    void *hid = v->f2 ? F->act : v->exp_fc2_in;
    const int gated = c->spec.model.mlp == MODEL_SWIGLU;
    op_open(r, ops->act);
    for (int sg = 0; sg < seg_count(M); sg++) {
        int64_t o = 0;
        int l = 0;
        const int R = (int)seg_rows(M, sg, &l, &o);
        if (R > 0 && gated)
            k->swiglu_fwd(EXEC_AT(hid, o * eff, c->ab), EXEC_AT(v->exp_act_in, o * eff_out, c->ab),
                          R, eff);
        else if (R > 0)
            k->gelu_fwd(EXEC_AT(hid, o * eff, c->ab), EXEC_AT(v->exp_act_in, o * eff_out, c->ab),
                        (size_t)R * eff);
    }
    op_close(r, ops->act);
    op_open(r, ops->fc2);
    q = 0;
    for (int sg = 0; sg < seg_count(M); sg++) {
        int64_t o = 0;
        int l = 0;
        const int R = (int)seg_rows(M, sg, &l, &o);
        /* the padding's output goes to scratch: it reaches no token (eout may hold fewer rows
         * than d.routed: without ep and etp, the k copies of the tokens) */
        void *y = EXEC_AT(sg < M->L ? eout : v->ws_dx, o * h, c->ab);
        const int srec = rec && sg < M->L;
        if (R > 0 && v->f2) {
            const ExecFp8Ref xq = exec_fp8_quantize(F, c, (uint8_t *)v->exp_fc2_in + q,
                                                    EXEC_AT(hid, o * eff, c->ab), R, eff, 0,
                                                    EXEC_FP8_X, v->f2, l, srec);
            q += fp8_rows_bytes(F, R, eff);
            exec_fp8_linear_fwd(F, c, r->M, y, xq, v->f2, l, R, srec);
        } else if (R > 0) {
            k->matmul(y, c->act,
                      EXEC_AT(v->exp_fc2_in, o * eff, c->ab),
                      EXEC_AT(v->fc2_w, (size_t)l * h * eff, c->ab), R, h, eff, 0, 1, 1.0f, 0.0f);
            exec_meter_flops(r->M, 2.0 * R * h * eff);
        }
        /* fc2's bias once per row: etp ranks' partial outputs are summed after */
        if (R > 0 && v->fc2_b && sg < M->L && M->etp_rank == 0)
            k->add_bias(EXEC_AT(eout, o * h, c->ab), EXEC_AT(v->fc2_b, (size_t)l * h, c->ab), R,
                        h);
    }
    op_close(r, ops->fc2);
}

/* The experts' backward over their rows' output gradients (ws_dx, expert-major): fc2, the
 * activation, fc1, each under its op. fc2's weight gradient reads the saved input, which then
 * takes its gradient (under FP8 the gradient goes to ws.fp8's act part: the saved input is
 * one byte an element). */
static void experts_bwd(const ExecMoe *M, const ExecLayerRun *r, const MoeOps *ops,
                        const ExecMoeViews *v)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const int h = c->d.h, eff = c->d.eff_loc, eff_out = c->d.eff_out_loc;
    ExecFp8 *F = r->fp8;
    void *dhid = v->f2 ? F->act : v->exp_fc2_in;
    op_open(r, ops->fc2);
    size_t q = 0;
    for (int sg = 0; sg < seg_count(M); sg++) {
        int64_t o = 0;
        int l = 0;
        const int R = (int)seg_rows(M, sg, &l, &o);
        if (R == 0)
            continue;
        const void *dout = EXEC_AT(v->ws_dx, o * h, c->ab);
        /* every etp rank holds the rows' whole output gradient, and its own copy of the bias */
        if (v->g_fc2_b)
            k->bias_grad(EXEC_AT(v->g_fc2_b, (size_t)l * h, c->gb), dout, R, h);
        if (v->f2) { /* the padding's zero output gradient records nothing */
            exec_fp8_linear_bwd_rec(F, c, r->M, EXEC_AT(dhid, o * eff, c->ab),
                                    EXEC_AT(v->g_fc2_w, (size_t)l * h * eff, c->gb), dout,
                                    exec_fp8_saved(F, (uint8_t *)v->exp_fc2_in + q, R, eff), NULL,
                                    v->f2, l, R, sg < M->L);
            q += fp8_rows_bytes(F, R, eff);
            continue;
        }
        void *hid = EXEC_AT(v->exp_fc2_in, o * eff, c->ab);
        k->matmul(EXEC_AT(v->g_fc2_w, (size_t)l * h * eff, c->gb), c->grad, dout, hid, h, eff, R,
                  1, 0, 1.0f, 1.0f);
        k->matmul(hid, c->act, dout, EXEC_AT(v->fc2_w, (size_t)l * h * eff, c->ab), R, eff, h, 0,
                  0, 1.0f, 0.0f);
        exec_meter_flops(r->M, 4.0 * R * h * eff);
    }
    op_close(r, ops->fc2);
    /* the activation's backward in place over its saved input (kernels.h allows dinp == inp
     * for SwiGLU; GeLU's kernels read each element before writing it) */
    const int gated = c->spec.model.mlp == MODEL_SWIGLU;
    op_open(r, ops->act);
    for (int sg = 0; sg < seg_count(M); sg++) {
        int64_t o = 0;
        int l = 0;
        const int R = (int)seg_rows(M, sg, &l, &o);
        void *act = EXEC_AT(v->exp_act_in, o * eff_out, c->ab);
        if (R > 0 && gated)
            k->swiglu_bwd(act, act, EXEC_AT(dhid, o * eff, c->ab), R, eff);
        else if (R > 0)
            k->gelu_bwd(act, act, EXEC_AT(dhid, o * eff, c->ab), (size_t)R * eff);
    }
    op_close(r, ops->act);
    /* fc1: the rows' input gradient over their output gradient, which is spent */
    op_open(r, ops->fc1);
    q = 0;
    for (int sg = 0; sg < seg_count(M); sg++) {
        int64_t o = 0;
        int l = 0;
        const int R = (int)seg_rows(M, sg, &l, &o);
        if (R == 0)
            continue;
        void *dout = EXEC_AT(v->ws_dx, o * h, c->ab);
        const void *act = EXEC_AT(v->exp_act_in, o * eff_out, c->ab);
        if (v->g_fc1_b) /* the activation's backward left fc1's output gradient in act */
            k->bias_grad(EXEC_AT(v->g_fc1_b, (size_t)l * eff_out, c->gb), act, R, eff_out);
        if (v->f1) {
            exec_fp8_linear_bwd_rec(F, c, r->M, dout,
                                    EXEC_AT(v->g_fc1_w, (size_t)l * eff_out * h, c->gb), act,
                                    exec_fp8_saved(F, (uint8_t *)v->exp_in + q, R, h), NULL, v->f1,
                                    l, R, sg < M->L);
            q += fp8_rows_bytes(F, R, h);
            continue;
        }
        k->matmul(EXEC_AT(v->g_fc1_w, (size_t)l * eff_out * h, c->gb), c->grad, act,
                  EXEC_AT(v->exp_in, o * h, c->ab), eff_out, h, R, 1, 0, 1.0f, 1.0f);
        k->matmul(dout, c->act, act, EXEC_AT(v->fc1_w, (size_t)l * eff_out * h, c->ab), R, h,
                  eff_out, 0, 0, 1.0f, 0.0f);
        exec_meter_flops(r->M, 4.0 * R * eff_out * h);
    }
    op_close(r, ops->fc1);
}

/* The routed rows to the experts, after the counts: the all-to-all over ep (ep_send, source
 * order) into this rank's part of ep_recv, and with etp > 1 the gather of every etp rank's
 * part (Megatron-Core's expert tensor parallelism: each etp rank holds a slice of every local
 * expert's width and takes every row its etp group received); then sorted into expert order
 * in *dst: the experts' input (ph the forward or its recompute; ws.fp8 under FP8) or their
 * output gradient, ws_dx (MODEL_BWD). Without ep and etp the rows are in *dst already. v:
 * fit_rows may move it. */
static int to_experts(ExecMoe *M, const ExecLayerRun *r, const MoeOps *ops, int layer, int mb,
                      ExecMoeViews *v, ModelPhase ph, void **dst, PxError *err)
{
    const ExecCtx *c = r->c;
    const int bwd = ph == MODEL_BWD;
    const int h = c->d.h, a2a = bwd ? ops->back : ops->disp;
    if (a2a >= 0)
        op_open(r, a2a);
    int64_t rows = 0;
    int rc = exchange_counts(M, c, &rows, err);
    if (!rc)
        rc = fit_rows(M, c, layer, mb, rows, v, err);
    *dst = bwd ? v->ws_dx : v->f1 ? r->fp8->act : v->exp_in;
    const int fp8d = !bwd && r->fp8->on && c->spec.job.fp8_dispatch;
    void *own = EXEC_AT(v->ep_recv, (size_t)M->etp_rank * (size_t)M->pad * (size_t)h, c->ab);
    if (!rc && (M->ep > 1 || M->etp > 1)) {
        rc = fp8d ? fp8_rows_a2a(M, r, v, own, v->ep_send, ph == MODEL_FWD, err)
                 : rows_a2a(M, c, own, M->recv, v->ep_send, M->send, err);
        if (!rc && M->etp == 1)
            sort_blocks(M, c, *dst, v->ep_recv, h, 1);
    }
    if (a2a >= 0)
        op_close(r, a2a);
    if (!rc && M->etp > 1) {
        op_open(r, ops->ag);
        rc = fp8d ? fp8_etp_gather(M, r, v->ep_recv, err)
                  : comm_all_gather(c->comm, v->ep_recv, own, (size_t)M->pad * (size_t)h, c->act,
                                    MODEL_ETP_ALL_GATHER, NULL, err);
        if (!rc)
            sort_blocks(M, c, *dst, v->ep_recv, h, 1);
        op_close(r, ops->ag);
    }
    return rc;
}

/* The experts' rows (src, expert order) home: with etp > 1 sorted back into the gathered
 * buffer's parts and reduce-scattered over etp (each etp rank's partial sums of its own rows
 * added up), then the all-to-all over ep into dst (source order): the combine's input
 * (forward) or the permutation's gradient, ep_send (backward). */
static int from_experts(ExecMoe *M, const ExecLayerRun *r, const MoeOps *ops,
                        const ExecMoeViews *v, int bwd, const void *src, void *dst, PxError *err)
{
    const ExecCtx *c = r->c;
    const int h = c->d.h, a2a = bwd ? ops->disp : ops->back;
    int rc = PX_OK;
    const void *home = v->ep_recv;
    if (M->etp > 1) {
        op_open(r, ops->rs);
        sort_blocks(M, c, v->ep_recv, src, h, 0);
        rc = comm_reduce_scatter(c->comm, v->ep_recv, v->ep_recv, (size_t)M->pad * (size_t)h,
                                 c->act, MODEL_ETP_REDUCE_SCATTER, NULL, err);
        op_close(r, ops->rs);
        if (rc)
            return rc;
    }
    if (a2a >= 0)
        op_open(r, a2a);
    if (M->etp == 1) {
        void *scratch = src == v->ep_recv ? v->ep_send : v->ep_recv;
        sort_blocks(M, c, scratch, src, h, 0);
        home = scratch;
    }
    rc = rows_a2a(M, c, dst, M->send, home, M->recv, err);
    if (a2a >= 0)
        op_close(r, a2a);
    return rc;
}

/* ---- the all-gather dispatcher (Megatron-Core's MoEAllGatherTokenDispatcher; model/ops.c
 * moe_allgather, docs/moe.md): over the etp x ep ranks (n of them) every token, its dense
 * scores and routing map are gathered; each rank permutes out the rows of its local experts
 * (the permutation's own kernels, the other experts' copies marked dropped) and after them
 * scatter-adds each row times its weight into the zeroed [n T, h] buffer, which is
 * reduce-scattered back to the tokens' ranks (with etp > 1 the sum adds the etp ranks'
 * partial outputs too). The backward mirrors it: the output gradient gathered, each row's and
 * weight's gradient, the dense weight gradient reduce-scattered; after the experts the rows'
 * input gradients summed per token and reduce-scattered. ---- */

/* The ops of an all-gather pass (MoeOps' fields as the all-to-all's where they mean the same;
 * model/ops.c moe_allgather's order): forward, the dispatch's gathers of the routing (agr) and
 * of the tokens (agx), its counts (cnt) and permutation (perm), the combine's scatter-add (comb)
 * and reduce-scatter (rsx); backward, the combine's gather of the output gradient (agx), its
 * rows' and weights' gradients (comb) and the weights' reduce-scatter (rsp), the dispatch's
 * sum per token (perm) and reduce-scatter (rsx). The collectives are absent on one rank. */
typedef struct {
    int agr, agx, cnt, perm, comb, rsx, rsp;
} AgOps;

static int ag_op(const ExecLayerRun *r, ModelOpRole role, int l, int chunk, ModelPhase ph,
                 int kind, int occurrence, int need, int *op, PxError *err)
{
    *op = exec_meter_find(r->M, role, l, chunk, ph, kind, occurrence);
    if (*op >= 0 || !need)
        return PX_OK;
    char what[96];
    snprintf(what, sizeof what, "layer.%d.%s.%s#%d.%s", l, model_op_role_name(role),
             kind == MODEL_COMM_COUNT ? "compute" : model_comm_name((ModelComm)kind), occurrence,
             model_phase_name(ph));
    return exec_meter_missing(r->c, what, err);
}

static int find_ag_ops(const ExecLayerRun *r, int l, int chunk, ModelPhase ph, int n, AgOps *a,
                       PxError *err)
{
    const int C = MODEL_COMM_COUNT, g = n > 1;
    const ModelOpRole D = MODEL_OPR_DISPATCH, B = MODEL_OPR_COMBINE;
    int rc;
    a->agr = a->cnt = a->rsp = -1;
    if (ph == MODEL_BWD) {
        if ((rc = ag_op(r, B, l, chunk, ph, MODEL_EP_ALL_GATHER, 0, g, &a->agx, err)) ||
            (rc = ag_op(r, B, l, chunk, ph, C, 0, 1, &a->comb, err)) ||
            (rc = ag_op(r, B, l, chunk, ph, MODEL_EP_REDUCE_SCATTER, 0, g, &a->rsp, err)) ||
            (rc = ag_op(r, D, l, chunk, ph, C, 0, 1, &a->perm, err)))
            return rc;
        return ag_op(r, D, l, chunk, ph, MODEL_EP_REDUCE_SCATTER, 0, g, &a->rsx, err);
    }
    if ((rc = ag_op(r, D, l, chunk, ph, MODEL_EP_ALL_GATHER, 0, g, &a->agr, err)) ||
        (rc = ag_op(r, D, l, chunk, ph, MODEL_EP_ALL_GATHER, 1, g, &a->agx, err)) ||
        (rc = ag_op(r, D, l, chunk, ph, C, 0, 1, &a->cnt, err)) ||
        (rc = ag_op(r, D, l, chunk, ph, C, 1, 1, &a->perm, err)) ||
        (rc = ag_op(r, B, l, chunk, ph, C, 0, 1, &a->comb, err)))
        return rc;
    return ag_op(r, B, l, chunk, ph, MODEL_EP_REDUCE_SCATTER, 0, g, &a->rsx, err);
}

static void ag_open(const ExecLayerRun *r, int op)
{
    if (op >= 0)
        exec_meter_open(r->M, r->c->k, op);
}

static void ag_close(const ExecLayerRun *r, int op)
{
    if (op >= 0)
        exec_meter_close(r->M, r->c->k, op);
}

/* Every rank's N x h rows of src (the forward's input, the backward's output gradient)
 * gathered into v->ag_x over the etp x ep ranks, under op (-1: on one rank, no op). */
static int ag_gather(const ExecLayerRun *r, int op, const ExecMoeViews *v, const void *src,
                     PxError *err)
{
    const ExecCtx *c = r->c;
    ag_open(r, op);
    int rc = comm_all_gather(c->comm, v->ag_x, src, (size_t)c->d.tokens * (size_t)c->d.h, c->act,
                             MODEL_EP_ALL_GATHER, NULL, err);
    ag_close(r, op);
    return rc;
}

/* The rows of this rank's local experts among the n T gathered tokens (idx_g, every other
 * expert's copies marked dropped), counted on the device and read by the host into blk (one
 * source: the rows come out of the permutation in expert order, no sort), and the views
 * for them (fit_rows: dropless growth past the plan). */
static int ag_rows(ExecMoe *M, const ExecCtx *c, int layer, int mb, ExecMoeViews *v, int n,
                   PxError *err)
{
    const int N = (int)c->d.tokens, E = M->E, K = c->spec.model.moe.topk;
    const int e0 = c->g.ep_rank * M->L;
    c->k->moe_counts(v->counts_f, v->idx_g, n * N, K, E);
    c->k->to_host(M->cntf, v->counts_f, (size_t)E * sizeof *M->cntf);
    memset(M->blk, 0, (size_t)M->etp * (size_t)M->ep * (size_t)M->L * sizeof *M->blk);
    int64_t rows = 0;
    for (int l = 0; l < M->L; l++) {
        M->blk[l] = (int64_t)M->cntf[e0 + l]; /* exact: counts stay below 2^24 */
        rows += M->blk[l];
    }
    M->rows_real = rows;
    return fit_rows(M, c, layer, mb, rows, v, err);
}

/* The forward after the router (v->idx, v->w this rank's routing): the dispatch, the experts,
 * the combine into y. */
static int ag_forward(ExecMoe *M, const ExecLayerRun *r, const MoeOps *ops, int chunk, int layer,
                      ModelPhase phase, ExecMoeViews *v, void *y, const void *x, int mb,
                      PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const int N = (int)c->d.tokens, h = c->d.h, E = M->E, K = c->spec.model.moe.topk;
    const int n = M->ep * M->etp, me = comm_group_rank(c->comm, MODEL_GROUP_ETP_EP);
    const size_t NE = (size_t)N * (size_t)E, NK = (size_t)N * (size_t)K;
    const int e0 = c->g.ep_rank * M->L;
    AgOps a;
    int rc = find_ag_ops(r, layer, chunk, phase, n, &a, err);
    if (rc)
        return rc;
    /* the routing, dense, in this rank's part, and gathered: the scores, then the map */
    ag_open(r, a.agr);
    k->moe_dense(v->ag_probs + (size_t)me * NE, v->ag_map + (size_t)me * NE, v->idx, v->w, N, K, E);
    rc = comm_all_gather(c->comm, v->ag_probs, v->ag_probs + (size_t)me * NE, NE, PX_FP32,
                         MODEL_EP_ALL_GATHER, NULL, err);
    if (!rc)
        rc = comm_all_gather(c->comm, v->ag_map, v->ag_map + (size_t)me * NE, NE, PX_UINT8,
                             MODEL_EP_ALL_GATHER, NULL, err);
    ag_close(r, a.agr);
    if (rc)
        return rc;
    if ((rc = ag_gather(r, a.agx, v, x, err)))
        return rc;
    ag_open(r, a.cnt);
    for (int p = 0; p < n; p++)
        k->moe_sparse(v->idx_g + (size_t)p * NK, v->w_g + (size_t)p * NK, v->ag_probs + (size_t)p * NE,
                      v->ag_map + (size_t)p * NE, N, K, E, e0, e0 + M->L);
    rc = ag_rows(M, c, layer, mb, v, n, err);
    ag_close(r, a.cnt);
    if (rc)
        return rc;
    /* the rows in expert order (FP8: into ws.fp8, whence each expert's are quantized into the
     * saved input), then a capacity's zero padding after them */
    void *rows_in = v->f1 ? r->fp8->act : v->exp_in;
    ag_open(r, a.perm);
    k->moe_permute(rows_in, v->counts_i, NULL, v->ag_x, v->idx_g, n * N, h, K, E);
    pad_zero(M, c, rows_in);
    ag_close(r, a.perm);
    if ((rc = fp8_fits(M, r, v, err)))
        return rc;
    experts_fwd(M, r, ops, v, rows_in, v->exp_out, phase == MODEL_FWD);
    /* each row times its weight summed into its token's row of the zeroed buffer */
    ag_open(r, a.comb);
    k->moe_unpermute(v->ag_x, v->exp_out, v->w_g, v->idx_g, n * N, h, K, E);
    ag_close(r, a.comb);
    ag_open(r, a.rsx);
    rc = comm_reduce_scatter(c->comm, y, v->ag_x, (size_t)N * (size_t)h, c->act,
                             MODEL_EP_REDUCE_SCATTER, NULL, err);
    ag_close(r, a.rsx);
    return rc;
}

/* The backward up to the router: the combine's (the weights' gradient, dense and
 * reduce-scattered, picked into v->dw), the experts', the dispatch's into dx. */
static int ag_backward(ExecMoe *M, const ExecLayerRun *r, const MoeOps *ops, int chunk,
                       int layer, ExecMoeViews *v, void *dx, const void *dy, int mb, PxError *err)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const int N = (int)c->d.tokens, h = c->d.h, E = M->E, K = c->spec.model.moe.topk;
    const int n = M->ep * M->etp;
    AgOps a;
    int rc = find_ag_ops(r, layer, chunk, MODEL_BWD, n, &a, err);
    if (rc)
        return rc;
    if ((rc = ag_gather(r, a.agx, v, dy, err)))
        return rc;
    ag_open(r, a.comb);
    rc = ag_rows(M, c, layer, mb, v, n, err); /* the forward's rows, where fit_rows put them */
    if (!rc) {
        k->moe_unpermute_bwd(v->ws_dx, v->ag_dw, v->ag_x, v->exp_out, v->w_g, v->idx_g, n * N, h,
                             K, E);
        pad_zero(M, c, v->ws_dx); /* the padding's output gradient: none */
        k->moe_dense(v->ag_probs, NULL, v->idx_g, v->ag_dw, n * N, K, E);
    }
    ag_close(r, a.comb);
    if (rc)
        return rc;
    ag_open(r, a.rsp);
    rc = comm_reduce_scatter(c->comm, v->dlogits, v->ag_probs, (size_t)N * (size_t)E, PX_FP32,
                             MODEL_EP_REDUCE_SCATTER, NULL, err);
    ag_close(r, a.rsp);
    if (rc)
        return rc;
    k->moe_pick(v->dw, v->dlogits, v->idx, N, K, E);
    const int xb = r->P->expert_block[layer];
    experts_bwd(M, r, ops, v);
    if ((rc = exec_zero_bucket_reduce(r->Z, c, r->P, r->M, xb, err)))
        return rc;
    exec_zero_bucket_clear(r->Z, c, r->P, r->P->layer_block[layer]);
    ag_open(r, a.perm);
    k->moe_permute_bwd(v->ag_x, v->ws_dx, v->idx_g, n * N, h, K, E);
    ag_close(r, a.perm);
    ag_open(r, a.rsx);
    rc = comm_reduce_scatter(c->comm, dx, v->ag_x, (size_t)N * (size_t)h, c->act,
                             MODEL_EP_REDUCE_SCATTER, NULL, err);
    ag_close(r, a.rsx);
    return rc;
}

/* The load-balancing loss's counts (v->counts_f, this rank's) summed over the micro-batch's
 * whole sequence: all-reduced over TP with SP (each TP rank routes its shard), then with
 * cp > 1 all-gathered over the cp ranks into the router's logit gradient scratch (free in the
 * forward: [cp][E] floats) and added up. Counts are whole numbers below 2^24, so any order of
 * the sums gives the single rank's exactly. */
static int sum_counts(const ExecLayerRun *r, const MoeOps *ops, const ExecMoeViews *v,
                      PxError *err)
{
    const ExecCtx *c = r->c;
    const size_t E = (size_t)c->spec.model.moe.experts;
    int rc = PX_OK;
    if (ops->ar >= 0) {
        op_open(r, ops->ar);
        rc = comm_allreduce(c->comm, v->counts_f, E, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE, NULL,
                            err);
        op_close(r, ops->ar);
    }
    if (rc || ops->cpg < 0)
        return rc;
    op_open(r, ops->cpg);
    rc = comm_all_gather(c->comm, v->dlogits, v->counts_f, E, PX_FP32, MODEL_CP_ALL_GATHER, NULL,
                         err);
    for (int j = 0; !rc && j < c->d.c; j++)
        if (j != c->g.cp_rank)
            c->k->add_f32(v->counts_f, v->dlogits + (size_t)j * E, E);
    op_close(r, ops->cpg);
    return rc;
}

int exec_moe_forward(ExecMoe *M, const ExecLayerRun *r, int chunk, int layer, ModelPhase phase,
                     const ExecMoeViews *v_plan, void *y, const void *x, long long first_seq,
                     int mb, double loss_weight, PxError *err)
{
    ExecMoeViews grown = *v_plan, *v = &grown; /* fit_rows may move the rows' views */
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ModelMoe *mo = &c->spec.model.moe;
    const int N = (int)d->tokens, h = d->h, E = mo->experts, K = mo->topk;
    const int ep = M->ep;
    const KernMoeRoute rt = route_of(c, N, first_seq);
    const ModelPhase ph = phase;
    const int again = phase == MODEL_RECOMPUTE; /* counted in the forward already */
    int rc;
    MoeOps ops;
    if ((rc = find_ops(r, layer, chunk, ph, mo->aux_loss_coeff > 0, ep, M->etp, &ops, err)))
        return rc;
    /* router: fp32 logits into probs, scored in place */
    op_open(r, ops.mm);
    k->matmul(v->probs, PX_FP32, x, v->router_w, N, E, h, 0, 1, 1.0f, 0.0f);
    exec_meter_flops(r->M, 2.0 * N * E * h);
    if (v->router_b)
        k->add_bias_f32(v->probs, v->router_b, N, E);
    route_fwd(c, v, &rt);
    k->moe_counts(v->counts_f, v->idx, N, K, E);
    /* a capacity drops the copies past it after the counts, which the load-balancing loss
     * takes before dropping (Megatron-Core's router) */
    if (M->capacity > 0)
        k->moe_drop(v->idx, v->w, N, K, E, M->capacity);
    op_close(r, ops.mm);
    /* the copies in expert order: straight into the experts' input without ep (under FP8 into
     * ws.fp8, whence each expert's rows are quantized into the saved input) */
    ExecFp8 *F = r->fp8;
    void *rows_in = v->f1 ? F->act : v->exp_in;
    const int moved = ep > 1 || M->etp > 1; /* the rows leave this rank's tokens' order */
    void *send = moved ? v->ep_send : rows_in;
    const int ag = exec_moe_allgather(c); /* its dispatch permutes the gathered tokens */
    if (ag) {
        op_again(r, ops.mm);
        local_counts(M, c, v->counts_f);
        op_close(r, ops.mm);
    } else {
        op_open(r, ops.perm);
        k->moe_permute(send, v->counts_i, NULL, x, v->idx, N, h, K, E);
        local_counts(M, c, v->counts_f);
        op_close(r, ops.perm);
    }
    double *tpe = M->tokens_per_expert + (size_t)M->index[layer] * (size_t)E;
    for (int e = 0; e < E && !again; e++)
        tpe[e] += (double)M->cnt[e];
    if (M->capacity > 0) {
        const int64_t dropped = clamp_counts(M);
        const int step = M->steps_begun - 1;
        if (!again && step >= 0 && step < M->drop_steps)
            M->dropped[(size_t)step * (size_t)M->layers + (size_t)M->index[layer]] += dropped;
    }
    /* the load-balancing loss over the whole micro-batch: SP sums the counts over TP, cp over
     * the cp ranks, each rank adds its tokens' probabilities (its share of the loss and of its
     * gradient) */
    if (mo->aux_loss_coeff > 0) {
        if ((rc = sum_counts(r, &ops, v, err)))
            return rc;
        /* the router's op again (its call is counted): the loss needs the counts summed over
         * TP, which the permutation read before as this rank's */
        float aux = 0;
        op_again(r, ops.mm);
        k->moe_aux_fwd(v->aux_dev, v->probs, v->counts_f, N, E, aux_scale(c, loss_weight));
        k->to_host(&aux, v->aux_dev, sizeof aux);
        k->to_host(M->gcount + ((size_t)M->index[layer] * (size_t)M->m + (size_t)mb) * (size_t)E,
                   v->counts_f, (size_t)E * sizeof(float));
        op_close(r, ops.mm);
        if (!again)
            M->aux_sum += aux;
    }
    if (ag)
        return ag_forward(M, r, &ops, chunk, layer, phase, v, y, x, mb, err);
    /* dispatch (--fp8-dispatch under delayed scaling records the rows' amax in a forward) */
    if ((rc = to_experts(M, r, &ops, layer, mb, v, phase, &rows_in, err)))
        return rc;
    /* the capacity's padding rows after the real ones: zero input, so zero output and no
     * weight gradient */
    pad_zero(M, c, rows_in);
    if ((rc = fp8_fits(M, r, v, err)))
        return rc;
    /* the experts, out in expert order (etp: ws_dx, free until the backward; ep: ep_recv;
     * neither: the combine's input itself) */
    void *eout = M->etp > 1 ? v->ws_dx : ep > 1 ? v->ep_recv : v->exp_out;
    experts_fwd(M, r, &ops, v, rows_in, eout, phase == MODEL_FWD);
    /* combine: back to source-major, home, and the weighted sum */
    if (moved && (rc = from_experts(M, r, &ops, v, 0, eout, v->exp_out, err)))
        return rc;
    op_open(r, ops.comb);
    k->moe_unpermute(y, v->exp_out, v->w, v->idx, N, h, K, E);
    op_close(r, ops.comb);
    return PX_OK;
}

static int router_bwd(const ExecMoe *M, const ExecLayerRun *r, const MoeOps *o, int layer,
                      const ExecMoeViews *v, void *dx, const void *x, const KernMoeRoute *rt,
                      int mb, double loss_weight);

int exec_moe_backward(ExecMoe *M, const ExecLayerRun *r, int chunk, int layer,
                      const ExecMoeViews *v_plan, void *dx, const void *dy, const void *x,
                      long long first_seq, int mb, double loss_weight, PxError *err)
{
    ExecMoeViews grown = *v_plan, *v = &grown; /* the forward's rows where fit_rows put them */
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelDims *d = &c->d;
    const ModelMoe *mo = &c->spec.model.moe;
    const int N = (int)d->tokens, h = d->h, E = mo->experts, K = mo->topk;
    const int ep = M->ep;
    const KernMoeRoute rt = route_of(c, N, first_seq);
    const ModelPhase ph = MODEL_BWD;
    int rc;
    MoeOps ops;
    if ((rc = find_ops(r, layer, chunk, ph, 0, ep, M->etp, &ops, err)))
        return rc;
    /* ZeRO-2/3: the experts' block has the gradient bucket first (the layer's block has
     * written nothing yet this micro-batch), is reduced once its weight gradients are done, and
     * hands the bucket back to the layer's block for the router's */
    const int xb = r->P->expert_block[layer];
    exec_zero_bucket_clear(r->Z, c, r->P, xb);
    if (exec_moe_allgather(c)) {
        if ((rc = ag_backward(M, r, &ops, chunk, layer, v, dx, dy, mb, err)))
            return rc;
        return router_bwd(M, r, &ops, layer, v, dx, x, &rt, mb, loss_weight);
    }
    /* combine's backward: each copy's gradient (in expert order) and the weights' */
    const int moved = ep > 1 || M->etp > 1;
    void *dcopies = moved ? v->ep_send : v->ws_dx;
    op_open(r, ops.comb);
    k->moe_unpermute_bwd(dcopies, v->dw, dy, v->exp_out, v->w, v->idx, N, h, K, E);
    /* the forward's counts again, from idx */
    k->moe_counts(v->counts_f, v->idx, N, K, E);
    local_counts(M, c, v->counts_f);
    op_close(r, ops.comb);
    void *dout = NULL; /* the rows' output gradients in expert order: ws_dx */
    if ((rc = to_experts(M, r, &ops, layer, mb, v, MODEL_BWD, &dout, err)))
        return rc;
    pad_zero(M, c, v->ws_dx); /* the padding's output gradient: none */
    experts_bwd(M, r, &ops, v);
    if ((rc = exec_zero_bucket_reduce(r->Z, c, r->P, r->M, xb, err)))
        return rc;
    exec_zero_bucket_clear(r->Z, c, r->P, r->P->layer_block[layer]);
    const void *back = v->ws_dx;
    if (moved) {
        if ((rc = from_experts(M, r, &ops, v, 1, v->ws_dx, v->ep_send, err)))
            return rc;
        back = v->ep_send;
    }
    op_open(r, ops.perm);
    k->moe_permute_bwd(dx, back, v->idx, N, h, K, E);
    op_close(r, ops.perm);
    return router_bwd(M, r, &ops, layer, v, dx, x, &rt, mb, loss_weight);
}

/* The router's backward: the weights' gradient (v->dw) and the load-balancing loss's to the
 * logits, their GEMM's gradients, accumulated into dx. */
static int router_bwd(const ExecMoe *M, const ExecLayerRun *r, const MoeOps *o, int layer,
                      const ExecMoeViews *v, void *dx, const void *x, const KernMoeRoute *rt,
                      int mb, double loss_weight)
{
    const ExecCtx *c = r->c;
    const KernBackend *k = c->k;
    const ModelMoe *mo = &c->spec.model.moe;
    const int N = (int)c->d.tokens, h = c->d.h, E = mo->experts;
    op_open(r, o->mm);
    const float *dprobs = NULL;
    if (mo->aux_loss_coeff > 0) {
        k->to_device(v->counts_f,
                     M->gcount + ((size_t)M->index[layer] * (size_t)M->m + (size_t)mb) * (size_t)E,
                     (size_t)E * sizeof(float));
        k->moe_aux_bwd(v->dlogits, v->counts_f, N, E, aux_scale(c, loss_weight));
        dprobs = v->dlogits;
    }
    k->moe_route_bwd(v->dlogits, dprobs, v->dw, v->probs, v->idx, rt);
    /* logits = x router_w^T, accumulated in fp32 from act inputs: dx += dlogits router_w,
     * g_router += dlogits^T x. A GEMM's inputs are act, so a 16-bit backend narrows dlogits
     * first (one rounding, as Megatron-Core's router under bf16 without its fp32 router
     * option); on the CPU act is fp32 and dlogits is used as it is. */
    const void *dl = v->dlogits;
    if (c->act != PX_FP32) {
        k->cast_to_act(v->dlogits_act, v->dlogits, (size_t)N * (size_t)E);
        dl = v->dlogits_act;
    }
    k->matmul(dx, c->act, dl, v->router_w, N, h, E, 0, 0, 1.0f, 1.0f);
    k->matmul(v->g_router_w, c->grad, dl, x, E, h, N, 1, 0, 1.0f, 1.0f);
    if (v->g_router_b)
        k->bias_grad(v->g_router_b, dl, N, E);
    exec_meter_flops(r->M, 4.0 * N * E * h);
    op_close(r, o->mm);
    return PX_OK;
}
