/* The tokens the multi-token prediction modules read (exec/train/mtp.c): module k's position p
 * embeds token p + k and targets token p + k + 1, looked up here with context parallelism's
 * lookahead; and under ZeRO-2/3 the modules' rows of the embedding's gradient, added in the
 * embedding's window of the main backward (layers.c calls it, so it lives apart from mtp.c,
 * which calls layers.c). */
#include "exec/train/internal.h"

#define AT(p, i) EXEC_AT(p, i, r->c->ab)

/* The embedding the modules read (the first stage's, or the last stage's copy: mtp.wte, or a
 * tied model's output layer) and its gradient. */
static const void *emb_w(const ExecParams *P) { return P->wte ? P->wte : P->out_w; }
static float *emb_g(const ExecParams *P) { return P->wte ? P->g_wte : P->g_out_w; }

/* The shifted tokens.
 *
 * Module k reads token p + k at position p and targets token p + k + 1. Under context
 * parallelism a part of C positions at p0 holds tokens p0 .. p0 + C (exec_cp_tok_row), so the
 * last k of its positions need the first tokens of the part after it, which another cp rank
 * holds. Megatron-Core's roll_tensor fetches them from the neighbouring cp rank, one token a
 * module; here every cp rank already reads its data-parallel rank's whole sequences from the
 * loader (data.c), so it takes the D = mtp_layers tokens past each of its parts along with the
 * part, into a lookahead after the step's rows: nothing moves between the cp ranks. */

int exec_mtp_lookahead(const ExecCtx *c)
{
    return c->d.c > 1 ? c->spec.model.mtp_layers : 0;
}

size_t exec_mtp_lookahead_ints(const ExecCtx *c, int rows)
{
    return (size_t)rows * exec_cp_parts(c) * exec_mtp_lookahead(c);
}

void exec_mtp_pick_lookahead(const ExecCtx *c, int32_t *dst, const int32_t *src, int rows)
{
    const int D = exec_mtp_lookahead(c), s = c->d.s, C = exec_cp_part_len(c);
    for (int n = 0; n < rows && D > 0; n++)
        for (int j = 0; j < exec_cp_parts(c); j++)
            for (int i = 0; i < D; i++) {
                /* past the sequence's last token (the last part's): never read, masked */
                const int at = exec_cp_part_pos(c, c->g.cp_rank, j) + C + 1 + i;
                dst[((size_t)n * exec_cp_parts(c) + j) * D + i] =
                    at <= s ? src[(size_t)n * (s + 1) + at] : 0;
            }
}

/* Tokens i0 .. i0 + n - 1 of sequence q's part j in micro-batch mb (counted from the token at
 * the part's first position) as at most two runs: the part's own row (tokens 0 .. C) and its
 * lookahead after the step's rows (schedule.c hands this micro-batch's rows at tok). */
int exec_mtp_tok_runs(const ExecLayerRun *r, const int32_t *tok, int mb, int q, int j, int i0,
                      int n, ExecMtpTokRun run[2])
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int C = exec_cp_part_len(c), row = exec_cp_tok_row(c), D = exec_mtp_lookahead(c);
    const int32_t *part = tok + (size_t)q * row + (size_t)j * (C + 1);
    int n0 = D == 0 ? n : C + 1 - i0;
    n0 = n0 < 0 ? 0 : n0 > n ? n : n0;
    run[0] = (ExecMtpTokRun){part + i0, 0, n0};
    if (n0 == n)
        return n > 0;
    const int32_t *look = tok + (size_t)(d->m - mb) * d->b * row +
                          ((size_t)(mb * d->b + q) * exec_cp_parts(c) + j) * D;
    run[1] = (ExecMtpTokRun){look + (i0 + n0 - C - 1), n0, n - n0};
    return n0 > 0 ? 2 : (run[0] = run[1], 1);
}

/* Part j's positions p with p + ahead < s among its C: for ahead k - 1 those with a token k on
 * (module k embeds it), for ahead k those with a target. */
int exec_mtp_part_count(const ExecCtx *c, int j, int ahead)
{
    const int C = exec_cp_part_len(c);
    const int n = c->d.s - ahead - exec_cp_part_pos(c, c->g.cp_rank, j);
    return n < 0 ? 0 : n > C ? C : n;
}

/* The shifted tokens' embedding of module k into out [b*s_loc, h]: position p embeds token
 * p + k of its sequence; the positions past the sequence's last token (masked: they have no
 * target) embed nothing. */
void exec_mtp_embed_shifted(const ExecLayerRun *r, void *out, const int32_t *tok, int mb, int k)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int h = d->h, V = d->vocab_loc, C = exec_cp_part_len(c);
    ExecMtpTokRun run[2];
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++) {
            void *o = AT(out, ((size_t)q * d->s_loc + (size_t)j * C) * h);
            const int n = exec_mtp_part_count(c, j, k - 1);
            for (int u = exec_mtp_tok_runs(r, tok, mb, q, j, k, n, run) - 1; u >= 0; u--)
                c->k->embedding_fwd(AT(o, (size_t)run[u].at * h), run[u].tok, emb_w(r->P), NULL,
                                    run[u].n, run[u].n, 0, h, c->g.tp_rank * V, V);
            if (n < C)
                c->k->memset0(AT(o, (size_t)n * h), (size_t)(C - n) * h * c->ab);
        }
}

/* Its backward: the gradient of those rows (dy [b*s_loc, h]) into the embedding's rows of this
 * rank's vocabulary shard. */
void exec_mtp_embed_shifted_bwd(const ExecLayerRun *r, const void *dy, const int32_t *tok, int mb,
                                int k)
{
    const ExecCtx *c = r->c;
    const ModelDims *d = &c->d;
    const int h = d->h, V = d->vocab_loc, C = exec_cp_part_len(c);
    ExecMtpTokRun run[2];
    for (int q = 0; q < d->b; q++)
        for (int j = 0; j < exec_cp_parts(c); j++) {
            const void *o = AT(dy, ((size_t)q * d->s_loc + (size_t)j * C) * h);
            const int n = exec_mtp_part_count(c, j, k - 1);
            for (int u = exec_mtp_tok_runs(r, tok, mb, q, j, k, n, run) - 1; u >= 0; u--)
                c->k->embedding_bwd(emb_g(r->P), NULL, AT(o, (size_t)run[u].at * h), run[u].tok,
                                    run[u].n, run[u].n, 0, h, c->g.tp_rank * V, V);
        }
}

/* Only where gradients go through per-micro-batch buckets: under a pipeline ZeRO-2/3 accumulate
 * them whole over the step, as ZeRO-1 does, and nothing need wait for a bucket's window. */
int exec_mtp_deferred(const ExecCtx *c) { return exec_zero_bucketed(c); }

int exec_mtp_deferred_embed(const ExecLayerRun *r, int chunk, int mb, const ExecLayerActs *A,
                            const int32_t *tok, PxError *err)
{
    const ExecCtx *c = r->c;
    const int D = c->g.chunk_mtp[chunk], cl = c->g.chunk_cl[chunk];
    for (int i = 0; exec_mtp_deferred(c) && i < D; i++) {
        int op;
        const int rc = exec_meter_need(r->M, c, MODEL_OPR_MTP, c->spec.model.layers + i, chunk,
                                       MODEL_BWD, MODEL_COMM_COUNT, 0,
                                       "prediction module's mtp op", &op, err);
        if (rc)
            return rc;
        exec_meter_open_again(r->M, c->k, op); /* more of the module's backward */
        const void *dy = A[cl + i].t[EXEC_MTP_ACT];
        int rc2 = PX_OK;
        if (exec_sp_on(c)) { /* this rank's rows, gathered over the sequence (mtp.c, eh_bwd_sp) */
            rc2 = exec_tp_all_gather(r, MODEL_OPR_MTP, c->spec.model.layers + i, chunk, MODEL_BWD,
                                     r->W->sp_gather, dy, (size_t)c->d.b * c->d.s_sp * c->d.h,
                                     err);
            dy = r->W->sp_gather;
        }
        if (!rc2)
            exec_mtp_embed_shifted_bwd(r, dy, tok, mb, i + 1);
        exec_meter_close(r->M, c->k, op);
        if (rc2)
            return rc2;
    }
    return PX_OK;
}

/* ZeRO-3 whose forward's gathers are released (no --no-reshard-after-forward) on the one stage
 * whose passes gather: the embedding's and the output layer's gathers are gone, in the ring of
 * gather buffers, by the time a module reads them, so each read gathers its block again
 * (model/ops.c, mtp_gather). Here, not in mtp.c, as layers.c asks it too. */
int exec_mtp_regathers(const ExecCtx *c)
{
    const ModelLayout *l = &c->spec.layout;
    return l->zero == 3 && !c->d.zero_per_step && !l->keep_gathered && c->d.chunks == 1;
}

int exec_mtp_gathers_bwd(const ExecCtx *c, int embed)
{
    const int D = c->spec.model.mtp_layers;
    return !exec_mtp_regathers(c) ? 0 : c->g.tied_here ? (embed ? 2 * D : 0) : D;
}
