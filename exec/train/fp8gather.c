/* The FP8 parameter gather (--fp8-param-gather; docs/fp8.md, "FP8 parameters under ZeRO-3"
 * and "below ZeRO-3"): a block's FP8 GEMM weights travel in one byte an element, its other
 * parameters in the act dtype, and the gathered FP8 weight feeds its GEMMs as it is (no second
 * quantization). Below ZeRO-3 (the end of this file) the FP8 weights are the parameters
 * themselves, quantized from the updated fp32 master and gathered after the step.
 *
 * The scale: a shard's amax is not its weight's, and every rank must quantize its shards of a
 * weight with the same per-tensor scale, so each step begins with every FP8 matrix's amax over
 * this rank's shards, all-reduced (max) in one call of 4 bytes a matrix over the ZeRO group for
 * the dense blocks' and in another over the expert-data-parallel group for the experts' (an
 * expert weight is a matrix a local expert, each with its own scale, as the GEMMs quantize
 * them; the ep peers hold other experts) (torchao's precompute_float8_dynamic_scale_for_fsdp;
 * model/ops.c's step_fp8_amax counts both). With blockwise each 128 x 128 tile has its
 * scale and the shard cut splits tiles, so the amaxes are the tiles' (shard_tile_amax, run by
 * run), 4 bytes a tile in the same calls, as Megatron-FSDP's blockwise FP8 parameters
 * (Transformer Engine's cast_master_weights_to_fp8 over the data-parallel group).
 * Tensorwise scaling takes amax / 448 (E4M3's largest), the scale the whole weight's own
 * quantization takes, so the GEMMs read the bytes ZeRO-3 without it casts per use; delayed
 * scaling rolls the amax into the weight's history and takes the decode factor it gives (one
 * entry a step, where the per-use cast records one a forward). The scales do not travel: every
 * rank has them.
 *
 * The ranks' shards of a block hold unequal parts of its FP8 weights (the flat block is cut
 * where it is, not weight by weight), so each part is gathered with its own counts
 * (comm_all_gather_v) in place: the act part packed into ring[i] (the other parameters, in
 * block order, the padding last), the FP8 part into ring8[i], which is then laid out matrix by
 * matrix with each one's scale after its elements, the layout its GEMMs read. Bytes on the
 * wire: (padded - fp8) x act + fp8, as model/ops.c's block_param_bytes counts them; in
 * buckets (layout.bucket_bytes at pp 1) that wire image cut into calls of equal bytes
 * (gather_image, model/ops.c's zero_gather_fp8). Only the
 * kernels' quantize and copies: the CPU and CUDA backends alike (a TN-only device's backward
 * GEMMs read the gathered weight transposed by the kernels' fp8_transpose, fp8.c). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

/* The scales of one matrix of FP8 weight i (a tile's each with blockwise, else one). */
static int tiles_of(const ExecFp8 *F, int i)
{
    const KernFp8 f = exec_fp8_desc(F, F->w[i].rows, F->w[i].cols, 1, 0);
    return (int)kern_fp8_scales(&f);
}

int exec_pg_init(ExecFp8Gather *G, struct ExecFp8 *F, const ExecCtx *c, const ExecParams *P,
                 PxError *err)
{
    memset(G, 0, sizeof *G);
    if (!F->on || !c->spec.job.fp8_param_gather)
        return PX_OK;
    G->on = c->spec.layout.zero == 3;
    G->after = !G->on;
    G->fp8 = F;
    /* MXFP8: below ZeRO-3 no scale travels or is all-reduced (mx_updated), an entry a matrix;
     * under ZeRO-3 an amax a block of each copy (mx_shard_amax) */
    const int mx = c->spec.job.fp8 == MODEL_FP8_MXFP8;
    G->mx = G->on && mx;
    const size_t nb = (size_t)(P->nb > 0 ? P->nb : 1);
    G->w_of = exec_zalloc((size_t)P->n, sizeof *G->w_of);
    G->req8 = malloc(nb * sizeof *G->req8);
    G->spread = exec_zalloc(nb, sizeof *G->spread);
    G->req8c = malloc(nb * sizeof *G->req8c);
    G->carried = exec_zalloc(nb, sizeof *G->carried);
    int most = 1;
    for (int b = 0; b < P->nb; b++)
        most = P->b[b].n_params > most ? P->b[b].n_params : most;
    G->off = exec_zalloc((size_t)most, sizeof *G->off);
    if (!G->w_of || !G->req8 || !G->spread || !G->off || !G->req8c || !G->carried)
        return px_fail(err, PX_ERUNTIME, "out of memory for the FP8 parameter gather");
    for (int b = 0; b < P->nb; b++)
        G->req8[b] = G->req8c[b] = -1;
    if (G->mx) { /* a slot holds the most copies a gather carries */
        const int fwd = model_fp8_mx_gather_copies(&c->spec, &c->d, MODEL_FWD);
        const int bwd = model_fp8_mx_gather_copies(&c->spec, &c->d, MODEL_BWD);
        G->mx_most = c->d.zero_per_step ? 2 : fwd > bwd ? fwd : bwd;
    }
    /* a scale an entry (a matrix's, or below ZeRO-3 with blockwise a tile's: tiles_of), the
     * dense blocks' first: their amaxes and the experts' are all-reduced over two groups */
    for (int i = 0; i < P->n; i++)
        G->w_of[i] = -1;
    for (int experts = 0; experts < 2; experts++) {
        for (int i = 0; i < P->n; i++) {
            if (F->w[i].p && !!P->b[P->p[i].block].experts == experts) {
                G->w_of[i] = G->n_w;
                G->n_w += F->w[i].groups * (G->mx ? (int)exec_fp8_mx_grids(F, &F->w[i])
                                            : mx    ? 1
                                                    : tiles_of(F, i));
            }
        }
        G->n_dense = experts ? G->n_dense : G->n_w;
    }
    for (int i = 0; i < P->n; i++) {
        /* a block's pieces are walked in offset order */
        if (i > 0 && P->p[i].block == P->p[i - 1].block && P->p[i].off < P->p[i - 1].off)
            return px_fail(err, PX_ERUNTIME, "%s lies before %s in its block: the FP8 parameter "
                           "gather walks a block's parameters in order", P->p[i].name,
                           P->p[i - 1].name);
    }
    /* one allocation, which the trainer attaches to the communication layer */
    /* MXFP8's scales are <w>.fp8_scales: its amaxes only (a quarter of a byte an element) */
    G->scales_bytes = (G->mx ? 1 : 2) * (size_t)(G->n_w > 0 ? G->n_w : 1) * sizeof(float);
    if (!(G->amax = c->k->alloc(G->scales_bytes)))
        return px_fail(err, PX_ERUNTIME, "out of memory for the FP8 weights' scales");
    G->scale = G->mx ? NULL : G->amax + (G->n_w > 0 ? G->n_w : 1);
    int group = 1;
    for (int b = 0; b < P->nb; b++)
        group = P->b[b].group > group ? P->b[b].group : group;
    G->pad_bytes = G->after ? (size_t)group * c->ab : 0;
    if (G->after && (!(G->pad = c->k->alloc(G->pad_bytes)) ||
                     !(G->host = exec_zalloc((size_t)(G->n_w > 0 ? G->n_w : 1), sizeof *G->host))))
        return px_fail(err, PX_ERUNTIME, "out of memory for the FP8 parameters' gather");
    /* ZeRO-3 with blockwise takes its tiles' amaxes on the host (shard_tile_amax) */
    if (!G->host && F->recipe == MODEL_FP8_BLOCKWISE &&
        !(G->host = exec_zalloc((size_t)(G->n_w > 0 ? G->n_w : 1), sizeof *G->host)))
        return px_fail(err, PX_ERUNTIME, "out of memory for the FP8 parameters' gather");
    return PX_OK;
}

void exec_pg_free(ExecFp8Gather *G, const KernBackend *k)
{
    if (k) {
        k->free(G->amax);
        k->free(G->pad);
    }
    free(G->w_of);
    free(G->req8);
    free(G->spread);
    free(G->req8c);
    free(G->carried);
    free(G->off);
    free(G->kept8);
    free(G->host);
    memset(G, 0, sizeof *G);
}

int exec_pg_bind(ExecFp8Gather *G, const ModelTensor *t, void *p, PxError *err)
{
    if (!G->on)
        return exec_bind_unused(t, err);
    G->buf = p;
    G->bytes = t->bytes;
    return PX_OK;
}

/* The elements of one of parameter i's FP8 matrices (an expert weight holds one a local
 * expert, each quantized with its own scale). */
static uint64_t matrix_elems(const ExecFp8Gather *G, int i)
{
    return (uint64_t)G->fp8->w[i].rows * (uint64_t)G->fp8->w[i].cols;
}

/* Below ZeRO-3: where element `a` (of its block's flat layout) of matrix g of parameter i
 * lies in its FP8 weight (the matrices one after another, each with its scale). */
static uint8_t *piece_at(const ExecFp8Gather *G, int i, int g, uint64_t a)
{
    const ExecFp8Weight *fw = &G->fp8->w[i];
    const KernFp8 f = exec_fp8_desc(G->fp8, fw->rows, fw->cols, 1, 0);
    const uint64_t m0 = fw->p->off + (uint64_t)g * matrix_elems(G, i);
    return (uint8_t *)fw->q + (size_t)g * kern_fp8_bytes(&f) + (a - m0);
}

/* Block b's FP8 elements in [lo, hi) of its flat layout, and the bytes of its FP8 matrices'
 * scales in the gathered layout (exec_fp8_gather_room each). */
static uint64_t fp8_in(const ExecFp8Gather *G, const ExecParams *P, int b, uint64_t lo,
                       uint64_t hi, uint64_t *room)
{
    const ExecBlock *blk = &P->b[b];
    uint64_t n = 0, w = 0;
    for (int i = blk->first_param; i < blk->first_param + blk->n_params; i++) {
        const ExecParam *p = &P->p[i];
        if (G->w_of[i] < 0)
            continue;
        /* MXFP8's copies travel without scales */
        w += G->mx ? 0 : (uint64_t)G->fp8->w[i].groups * exec_fp8_gather_room(G->fp8, &G->fp8->w[i]);
        const uint64_t a = p->off > lo ? p->off : lo, e = p->off + p->numel < hi ? p->off + p->numel : hi;
        n += e > a ? e - a : 0;
    }
    if (room)
        *room = w;
    return n;
}

/* The calls of block blk's gather of `wire` bytes (model/ops.c's zero_gather_fp8): one, or
 * in buckets ceil(wire / bucket_bytes), at most one a shard's element; under a pipeline the
 * step's gathers are one call a block whatever the bucket size. */
static int bucket_calls(const ExecCtx *c, const ExecBlock *blk, uint64_t wire)
{
    const double bucket = c->spec.layout.bucket_bytes;
    if (bucket <= 0 || (double)wire <= bucket || blk->group < 2 || c->d.zero_per_step)
        return 1;
    const double n = ceil((double)wire / bucket);
    return n < (double)blk->shard ? (int)n : (int)blk->shard;
}

int exec_pg_buffers(ExecZero *Z, const ExecCtx *c, const ExecParams *P, PxError *err)
{
    ExecFp8Gather *G = &Z->pg;
    const ModelLayout *l = &c->spec.layout;
    uint64_t act_most = 0, slot8 = 0, act_all = 0, fp8_all = 0, stage = 0;
    for (int b = 0; b < P->nb; b++) {
        const ExecBlock *blk = &P->b[b];
        uint64_t w;
        const uint64_t padded = blk->shard * (uint64_t)blk->group;
        const uint64_t f = fp8_in(G, P, b, 0, padded, &w);
        const uint64_t most = G->mx ? (uint64_t)G->mx_most : 1, part8 = f * most + w;
        act_most = padded - f > act_most ? padded - f : act_most;
        slot8 = part8 > slot8 ? part8 : slot8;
        act_all += padded - f;
        fp8_all += part8;
        /* a bucketed gather's calls go through the staging, one call's bytes (MXFP8: of a
         * gather of one copy or of the most) */
        for (uint64_t copies = 1; copies <= most; copies += most > 1 ? most - 1 : 1) {
            const uint64_t wire = (padded - f) * c->ab + f * copies;
            const int calls = bucket_calls(c, blk, wire);
            const uint64_t call = (wire + (uint64_t)calls - 1) / (uint64_t)calls;
            stage = calls > 1 && call > stage ? call : stage;
        }
    }
    G->slot8 = slot8;
    stage = px_round_up(stage, 64);
    if (stage > Z->extra_bytes) {
        c->k->free(Z->extra);
        Z->extra_bytes = stage;
        if (!(Z->stage = Z->extra = c->k->alloc(stage)))
            return px_fail(err, PX_ERUNTIME, "out of memory: %.3f GiB for the FP8 gather's "
                           "bucketed calls", (double)stage / PX_GIB);
    }
    /* kept: from the forward to the backward, or under a pipeline across the step */
    const int kept = l->keep_gathered || c->d.zero_per_step;
    const uint64_t need = kept ? act_all : (uint64_t)Z->n_ring * act_most;
    const uint64_t need8 = kept ? fp8_all : (uint64_t)Z->n_ring * slot8;
    if (need > Z->gather_elems || need8 > G->bytes || !G->buf)
        return px_fail(err, PX_ERUNTIME, "zero.param_gather holds %llu elements and "
                       "zero.param_gather_fp8 %llu bytes, the FP8 parameter gather needs %llu and "
                       "%llu (the memory table and the executor disagree)",
                       (unsigned long long)Z->gather_elems, (unsigned long long)G->bytes,
                       (unsigned long long)need, (unsigned long long)need8);
    for (int i = 0; i < Z->n_ring; i++) {
        Z->ring[i] = EXEC_AT(Z->gather[0], (uint64_t)i * act_most, c->ab);
        G->ring8[i] = G->buf + (uint64_t)i * slot8;
    }
    if (!kept)
        return PX_OK;
    Z->kept = calloc((size_t)P->nb, sizeof *Z->kept);
    G->kept8 = calloc((size_t)P->nb, sizeof *G->kept8);
    if (!Z->kept || !G->kept8)
        return px_fail(err, PX_ERUNTIME, "out of memory for the kept gathers");
    uint64_t at = 0, at8 = 0;
    for (int b = 0; b < P->nb; b++) {
        uint64_t w;
        const uint64_t padded = P->b[b].shard * (uint64_t)P->b[b].group;
        const uint64_t f = fp8_in(G, P, b, 0, padded, &w);
        Z->kept[b] = EXEC_AT(Z->gather[0], at, c->ab);
        G->kept8[b] = G->buf + at8;
        at += padded - f;
        at8 += f * (G->mx ? (uint64_t)G->mx_most : 1) + w;
    }
    return PX_OK;
}

/* Matrix k's decode factor of this step. */
static const float *scale_of(const ExecFp8Gather *G, int k) { return G->scale + k; }

/* The amaxes of matrices [at, at + n), all-reduced (max) over the ZeRO group of `block` (the
 * first block that holds one of them) in one call of `kind`, as model/ops.c's step_fp8_amax
 * counts it (timed under its op; M NULL: before the first step, not metered). */
static int amax_allreduce(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, ExecMeter *M,
                          int block, int at, int n, ModelComm kind, PxError *err)
{
    if (block < 0 || n == 0 || P->b[block].group <= 1)
        return PX_OK;
    int op = -1, rc;
    if (M && (rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, block, P->b[block].chunk,
                                   MODEL_STEP, kind, 0, "amax all-reduce of the FP8 weights", &op,
                                   err)))
        return rc;
    if (M)
        exec_meter_open(M, c->k, op);
    rc = comm_allreduce(c->comm, G->amax + at, (size_t)n, PX_FP32, COMM_MAX, kind, NULL, err);
    if (M)
        exec_meter_close(M, c->k, op);
    return rc;
}

/* ZeRO-3: this rank's amax of every FP8 matrix's elements in its shards (0 where it holds
 * none), of its act shard quantized into ws.fp8's weight area. The first dense and the first
 * experts' block that hold one. */
static void shard_amax(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int first[2])
{
    ExecFp8 *F = G->fp8;
    const KernBackend *k = c->k;
    first[0] = first[1] = -1;
    for (int i = 0; i < P->n; i++) {
        const int w = G->w_of[i];
        if (w < 0)
            continue;
        const ExecParam *p = &P->p[i];
        const ExecBlock *blk = &P->b[p->block];
        const int ex = !!blk->experts;
        first[ex] = first[ex] < 0 ? p->block : first[ex];
        const uint64_t n = matrix_elems(G, i);
        uint64_t lo = 0, hi = 0;
        const int own = exec_params_own(P, p, &lo, &hi);
        for (int g = 0; g < F->w[i].groups; g++) {
            const uint64_t m0 = p->off + (uint64_t)g * n;
            const uint64_t a = m0 > lo ? m0 : lo, e = m0 + n < hi ? m0 + n : hi;
            if (!own || e <= a) {
                k->memset0(G->amax + w + g, sizeof(float));
                continue;
            }
            const KernFp8 f = {1, (int)(e - a), 1, (int)(e - a), 0, 0};
            k->fp8_quantize(F->wq, F->amax, EXEC_AT(blk->w_shard, a - blk->own_off, c->ab), &f,
                            0, NULL);
            k->copy(G->amax + w + g, F->amax, sizeof(float));
        }
    }
}

/* Every FP8 matrix's decode factor from its all-reduced amax (G->amax). */
static int take_scales(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, PxError *err)
{
    ExecFp8 *F = G->fp8;
    const KernBackend *k = c->k;
    if (F->len) {
        /* delayed scaling: the amax rolled into the weight's history, whose factor it takes */
        for (int i = 0; i < P->n; i++) {
            const int w = G->w_of[i];
            const ExecFp8Weight *fw = &F->w[i];
            for (int g = 0; w >= 0 && g < fw->groups; g++) {
                const size_t col = (size_t)(3 * g + EXEC_FP8_W);
                k->fp8_amax_update(fw->hist + col * (size_t)F->len, fw->scale + col,
                                   G->amax + w + g, F->fmax, F->len, 1);
                k->copy(G->scale + w + g, fw->scale + col, sizeof(float));
            }
        }
        return PX_OK;
    }
    /* tensorwise: the whole weight's own scale (kernels' current scaling: amax / 448, 1 for
     * an all-zero weight) */
    float *h = malloc((size_t)G->n_w * sizeof *h);
    if (!h)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    k->to_host(h, G->amax, (size_t)G->n_w * sizeof *h);
    for (int w = 0; w < G->n_w; w++) {
        const float s = h[w] == 0.0f ? 1.0f : h[w] / 448.0f;
        h[w] = s > 0.0f ? s : FLT_TRUE_MIN;
    }
    k->to_device(G->scale, h, (size_t)G->n_w * sizeof *h);
    free(h);
    return PX_OK;
}

static void shard_tile_amax(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P,
                            int first[2]);
static uint64_t run_end(uint64_t x, uint64_t e, const KernFp8 *f, int *tile);
static uint64_t own_piece(const ExecFp8Gather *G, const ExecParams *P, int i, int g, uint64_t *a,
                          uint64_t *e);

/* ---- MXFP8 under ZeRO-3 (docs/fp8.md, "MXFP8 parameters under ZeRO-3") ---- */

/* Megatron-FSDP with Transformer Engine's MXFP8 parameters: each rank quantizes its flat shard
 * into both copies of the whole weight (the row-wise one, 1 x 32 blocks, and the column-wise
 * one in the weight's shape, 32 x 1 blocks), so every rank needs every block's scale, and a
 * block may straddle two shards: the step's partial amaxes of every block of both grids are
 * all-reduced (max) over the block's ZeRO group (the experts' over the expert-data-parallel
 * one) and every rank computes both scale grids of every whole weight into <w>.fp8_scales
 * (tensor/utils.py's _cast_master_weights_to_fp8_mxfp8_scaling). A gather then carries the
 * copies its pass reads, without scales (model_fp8_mx_gather_copies). */

/* This rank's partial amax of every 1 x 32 and 32 x 1 block of every FP8 matrix over its act
 * shard (0 where it holds none of a block: mxfp8_scaling_compute_partial_amax), into G->amax: a
 * matrix's row-wise grid's entries, then its column-wise one's. The first dense and the first
 * experts' block that hold one. */
static void mx_shard_amax(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int first[2])
{
    ExecFp8 *F = G->fp8;
    first[0] = first[1] = -1;
    c->k->memset0(G->amax, (size_t)G->n_w * sizeof *G->amax);
    for (int i = 0; i < P->n; i++) {
        if (G->w_of[i] < 0)
            continue;
        const ExecBlock *blk = &P->b[P->p[i].block];
        const int ex = !!blk->experts;
        first[ex] = first[ex] < 0 ? P->p[i].block : first[ex];
        const ExecFp8Weight *fw = &F->w[i];
        const KernFp8 fr = exec_fp8_mx_desc(F, fw, 0), fc = exec_fp8_mx_desc(F, fw, 1);
        const uint64_t grids = exec_fp8_mx_grids(F, fw), nr = kern_fp8_scales(&fr);
        for (int g = 0; g < fw->groups; g++) {
            uint64_t a, e;
            const uint64_t m0 = own_piece(G, P, i, g, &a, &e);
            if (e <= a)
                continue;
            float *amax = G->amax + G->w_of[i] + (uint64_t)g * grids;
            const void *x = EXEC_AT(blk->w_shard, a - blk->own_off, c->ab);
            c->k->fp8_piece_amax(amax, x, a - m0, e - a, &fr);
            c->k->fp8_piece_amax(amax + nr, x, a - m0, e - a, &fc);
        }
    }
}

/* Both E8M0 scale grids of every FP8 matrix from its all-reduced block amaxes, into
 * <w>.fp8_scales (laid out as G->amax's entries). */
static void mx_take_scales(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P)
{
    const ExecFp8 *F = G->fp8;
    for (int i = 0; i < P->n; i++) {
        if (G->w_of[i] < 0)
            continue;
        const ExecFp8Weight *fw = &F->w[i];
        const KernFp8 fr = exec_fp8_mx_desc(F, fw, 0), fc = exec_fp8_mx_desc(F, fw, 1);
        const uint64_t grids = exec_fp8_mx_grids(F, fw), nr = kern_fp8_scales(&fr);
        for (int g = 0; g < fw->groups; g++) {
            const float *amax = G->amax + G->w_of[i] + (uint64_t)g * grids;
            uint8_t *sc = fw->mxs + (uint64_t)g * grids;
            c->k->fp8_block_scales(sc, amax, &fr);
            c->k->fp8_block_scales(sc + nr, amax + nr, &fc);
        }
    }
}

/* The copies a gather for `phase` carries (model_fp8_mx_gather_copies): 1 the row-wise one
 * (before a forward, DeepSpeed's recomputed one), 2 the column-wise one (before a backward), 3
 * both, the row-wise one first (a gather that serves a forward and a backward). */
static int mx_carried(const ExecCtx *c, ModelPhase phase)
{
    const ModelPhase at = c->d.zero_per_step ? MODEL_STEP : phase;
    if (model_fp8_mx_gather_copies(&c->spec, &c->d, at) >= 2)
        return 3;
    return phase == MODEL_BWD ? 2 : 1;
}

/* Parameter i's piece [a, e) (block offsets, within one matrix: g, starting at m0) of this
 * rank's shard (w_shard from element lo) quantized into each copy in `carried` with the
 * step's scales (mxfp8_scaling_partial_cast), at `at` bytes of each copy's part: the first
 * carried copy's part at q8, the second's ftot bytes (the block's FP8 elements) after it. */
static void mx_piece(const ExecFp8Gather *G, const ExecCtx *c, const ExecBlock *blk, int i, int g,
                     uint64_t m0, uint64_t a, uint64_t e, uint64_t lo, uint8_t *q8, uint64_t at,
                     int carried, uint64_t ftot)
{
    const ExecFp8Weight *fw = &G->fp8->w[i];
    const KernFp8 fr = exec_fp8_mx_desc(G->fp8, fw, 0);
    const uint64_t grids = exec_fp8_mx_grids(G->fp8, fw), nr = kern_fp8_scales(&fr);
    const void *x = EXEC_AT(blk->w_shard, a - lo, c->ab);
    int j = 0;
    for (int copy = 0; copy < 2; copy++) {
        if (!(carried & (1 << copy)))
            continue;
        const KernFp8 f = exec_fp8_mx_desc(G->fp8, fw, copy);
        const uint8_t *sc = fw->mxs + (uint64_t)g * grids + (copy ? nr : 0);
        c->k->fp8_piece_quantize(q8 + (uint64_t)j * ftot + at, x, a - m0, e - a, &f, sc);
        j++;
    }
}

/* Block b's FP8 weights pointed at the copies its slot's FP8 part (q8) holds: each weight's
 * matrices at their place among the block's FP8 elements (ftot) in each carried copy; and its
 * other parameters packed in `act`. */
static void mx_point(ExecFp8Gather *G, const ExecCtx *c, ExecParams *P, int b, void *act,
                     const uint8_t *q8)
{
    const ExecBlock *blk = &P->b[b];
    const int carried = G->carried[b];
    const uint64_t ftot = fp8_in(G, P, b, 0, blk->shard * (uint64_t)blk->group, NULL);
    uint64_t packed = 0, act_at = 0;
    for (int j = 0; j < blk->n_params; j++) {
        const int i = blk->first_param + j;
        ExecFp8Weight *fw = &G->fp8->w[i];
        G->off[j] = G->w_of[i] >= 0 ? UINT64_MAX : act_at;
        if (G->w_of[i] < 0) {
            act_at += P->p[i].numel;
            continue;
        }
        if (carried & 1)
            fw->gq = q8 + packed;
        if (carried & 2)
            fw->gqt = q8 + (carried & 1 ? ftot : 0) + packed;
        packed += P->p[i].numel;
    }
    exec_params_point_packed(P, c, b, act, G->off);
}

int exec_pg_scales(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err)
{
    ExecFp8Gather *G = &Z->pg;
    if (!G->on || G->n_w == 0)
        return PX_OK;
    int first[2];
    if (G->mx)
        mx_shard_amax(G, c, P, first);
    else if (G->fp8->recipe == MODEL_FP8_BLOCKWISE)
        shard_tile_amax(G, c, P, first);
    else
        shard_amax(G, c, P, first);
    int rc = amax_allreduce(G, c, P, M, first[0], 0, G->n_dense, MODEL_DP_ALLREDUCE, err);
    if (!rc)
        rc = amax_allreduce(G, c, P, M, first[1], G->n_dense, G->n_w - G->n_dense,
                            MODEL_EDP_ALLREDUCE, err);
    if (!rc && G->mx)
        mx_take_scales(G, c, P);
    return rc ? rc : G->mx ? PX_OK : take_scales(G, c, P, err);
}

/* This rank's shard of block b packed into its places of the two parts: its act elements at
 * a_at (elements) of the act part, its FP8 weights' pieces quantized at q_at (bytes) of the
 * FP8 part run by run (run_end: a piece of a matrix with a per-tensor scale, of a 128 x 128
 * tile's row with blockwise), each with its matrix's (tile's) scale, through ws.fp8's weight
 * area (a quantization writes its scale after the elements); MXFP8 (carried, nonzero) a
 * matrix's piece at a time into each carried copy (mx_piece, ftot: the block's FP8
 * elements). */
static void pack_shard(const ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int b,
                       void *act, uint64_t a_at, uint8_t *q8, uint64_t q_at, int carried,
                       uint64_t ftot)
{
    const ExecBlock *blk = &P->b[b];
    const KernBackend *k = c->k;
    const uint64_t lo = (uint64_t)blk->group_rank * blk->shard, hi = lo + blk->shard;
    uint64_t x = lo;
    for (int i = blk->first_param; i < blk->first_param + blk->n_params; i++) {
        const ExecParam *p = &P->p[i];
        const int w = G->w_of[i];
        const uint64_t s0 = p->off > lo ? p->off : lo;
        const uint64_t s1 = p->off + p->numel < hi ? p->off + p->numel : hi;
        if (w < 0 || s1 <= s0)
            continue;
        if (s0 > x) {
            k->copy(EXEC_AT(act, a_at, c->ab), EXEC_AT(blk->w_shard, x - lo, c->ab),
                    (size_t)(s0 - x) * c->ab);
            a_at += s0 - x;
        }
        /* matrix by matrix, run by run, each with its scale */
        const uint64_t m = matrix_elems(G, i);
        const ExecFp8Weight *fw = &G->fp8->w[i];
        const KernFp8 mf = exec_fp8_desc(G->fp8, fw->rows, fw->cols, 1, 0);
        const int tiles = tiles_of(G->fp8, i);
        for (uint64_t a = s0; a < s1 && carried;) {
            const uint64_t g = (a - p->off) / m, m0 = p->off + g * m;
            const uint64_t e = m0 + m < s1 ? m0 + m : s1;
            mx_piece(G, c, blk, i, (int)g, m0, a, e, lo, q8, q_at, carried, ftot);
            q_at += e - a;
            a = e;
        }
        for (uint64_t a = s0; a < s1 && !carried;) {
            const uint64_t g = (a - p->off) / m, m0 = p->off + g * m;
            int t;
            const uint64_t e = m0 + run_end(a - m0, (m0 + m < s1 ? m0 + m : s1) - m0, &mf, &t);
            const int n = (int)(e - a);
            const KernFp8 f = {1, n, 1, n, 0, 0};
            k->fp8_quantize(G->fp8->wq, NULL, EXEC_AT(blk->w_shard, a - lo, c->ab), &f, 0,
                            scale_of(G, w + (int)g * tiles + t));
            k->copy(q8 + q_at, G->fp8->wq, (size_t)n);
            q_at += (uint64_t)n;
            a = e;
        }
        x = s1;
    }
    if (hi > x)
        k->copy(EXEC_AT(act, a_at, c->ab), EXEC_AT(blk->w_shard, x - lo, c->ab),
                (size_t)(hi - x) * c->ab);
}

/* The FP8 part of block b (the weights' elements packed in block order) laid out matrix by
 * matrix (an expert weight's local experts one by one) with each one's scales after it in
 * exec_fp8_gather_room (the scale, blockwise's tiles' row by row, padded to
 * MODEL_FP8_GATHER_SCALE_BYTES so that the next matrix starts 16-byte aligned where its
 * elements are a multiple of 16, as cuBLASLt's FP8 GEMM takes them), last
 * matrix first (each moves up by that much a matrix before it), through ws.fp8's weight area;
 * then the views: the act parameters packed in `act`, each FP8 weight's gq (its first
 * matrix). */
static void spread_and_point(ExecFp8Gather *G, const ExecCtx *c, ExecParams *P, int b, void *act,
                             uint8_t *q8, int spread)
{
    const ExecBlock *blk = &P->b[b];
    const KernBackend *k = c->k;
    uint64_t packed = 0, act_at = 0, room = 0;
    for (int j = 0; j < blk->n_params; j++) {
        const int i = blk->first_param + j, w = G->w_of[i];
        G->off[j] = w >= 0 ? UINT64_MAX : act_at;
        act_at += w >= 0 ? 0 : P->p[i].numel;
        packed += w >= 0 ? P->p[i].numel : 0;
        room += w >= 0 ? (uint64_t)G->fp8->w[i].groups * exec_fp8_gather_room(G->fp8, &G->fp8->w[i])
                       : 0;
    }
    for (int j = blk->n_params - 1; j >= 0; j--) {
        const int i = blk->first_param + j, w = G->w_of[i];
        if (w < 0)
            continue;
        const uint64_t n = matrix_elems(G, i), r = exec_fp8_gather_room(G->fp8, &G->fp8->w[i]);
        const int tiles = tiles_of(G->fp8, i);
        for (int g = G->fp8->w[i].groups - 1; g >= 0; g--) {
            packed -= n;
            room -= r;
            uint8_t *dst = q8 + packed + room;
            if (spread && room > 0) {
                k->copy(G->fp8->wq, q8 + packed, (size_t)n);
                k->copy(dst, G->fp8->wq, (size_t)n);
            }
            if (spread)
                k->copy(dst + n, scale_of(G, w + g * tiles), (size_t)tiles * sizeof(float));
            G->fp8->w[i].gq = dst;
        }
    }
    exec_params_point_packed(P, c, b, act, G->off);
}

/* The FP8 part of the slot whose act part is dst (a ring slot, or block b's kept buffer). */
static uint8_t *slot8_of(const ExecZero *Z, int b, const void *dst)
{
    if (Z->kept)
        return Z->pg.kept8[b];
    for (int i = 0; i < Z->n_ring; i++)
        if (Z->ring[i] == dst)
            return Z->pg.ring8[i];
    return NULL;
}

/* A block's gathered wire image: each rank's part, its act elements (act_n[r] x ab bytes)
 * then its FP8 ones (fp8_n[r] bytes), the parts one after another; a part's act bytes live at
 * their place in the act part of the slot (act), its FP8 bytes in the FP8 part (q8). */
typedef struct {
    const KernBackend *k;
    size_t ab;
    void *act;
    uint8_t *q8;
    const int64_t *act_n, *fp8_n;
    int group;
    int copies;    /* MXFP8: the FP8 copies each part carries, one after another (else 1) */
    uint64_t ftot; /* the FP8 part's bytes a copy: the second copy's part starts there */
} Image;

/* Bytes of rank r's part. */
static uint64_t part_bytes(const Image *im, int r)
{
    return (uint64_t)im->act_n[r] * im->ab + (uint64_t)im->fp8_n[r] * (uint64_t)im->copies;
}

/* Bytes of the image before rank r's part (r = group: the whole image). */
static uint64_t image_bytes(const Image *im, int r)
{
    uint64_t n = 0;
    for (int i = 0; i < r; i++)
        n += part_bytes(im, i);
    return n;
}

/* Copies bytes [from, from + len) of rank r's part between their places and buf (to_buf: into
 * buf): its act bytes in the act part, then each copy's FP8 bytes in its FP8 part. */
static void image_copy(const Image *im, int r, uint64_t from, uint64_t len, uint8_t *buf,
                       int to_buf)
{
    uint64_t a_at = 0, q_at = 0;
    for (int i = 0; i < r; i++) {
        a_at += (uint64_t)im->act_n[i];
        q_at += (uint64_t)im->fp8_n[i];
    }
    /* the part's segments: its act bytes, then a copy's FP8 bytes each */
    uint64_t at = 0;
    for (int sg = 0; sg <= im->copies && len > 0; sg++) {
        const uint64_t n = sg ? (uint64_t)im->fp8_n[r] : (uint64_t)im->act_n[r] * im->ab;
        uint8_t *place = sg ? im->q8 + (uint64_t)(sg - 1) * im->ftot + q_at
                            : (uint8_t *)im->act + a_at * im->ab;
        if (from < at + n) {
            const uint64_t off = from - at, k = at + n - from < len ? at + n - from : len;
            im->k->copy(to_buf ? buf : place + off, to_buf ? (const void *)(place + off) : buf,
                        (size_t)k);
            buf += k;
            from += k;
            len -= k;
        }
        at += n;
    }
}

/* The image gathered in `calls` calls of equal bytes (model/ops.c's zero_gather_fp8): call j
 * carries bytes [j B, (j + 1) B) of the image, B = ceil(image / calls), the last one padded
 * with zeros by the last rank; each rank sends what of its part falls in the call (from its
 * places, into the staging at its offset), the call gathers them in place (comm_all_gather_v,
 * ranks outside the call sending none) and every part is copied to its places. */
static int gather_image(uint8_t *stage, const Image *im, int me, int calls, ModelComm kind,
                        const ExecCtx *c, ExecMeter *M, int op, PxError *err)
{
    enum { MAX_GROUP = 1024 };
    int64_t counts[MAX_GROUP];
    const uint64_t total = image_bytes(im, im->group);
    const uint64_t B = (total + (uint64_t)calls - 1) / (uint64_t)calls;
    int rc = PX_OK;
    for (int j = 0; j < calls && !rc; j++) {
        const uint64_t lo = (uint64_t)j * B, hi = lo + B;
        const uint64_t real = total > lo ? total - lo : 0, pad = hi > total ? B - real : 0;
        exec_meter_open(M, c->k, op);
        uint64_t at = 0;
        for (int r = 0; r < im->group; r++) {
            const uint64_t end = at + part_bytes(im, r);
            const uint64_t x0 = at > lo ? at : lo, x1 = end < hi ? end : hi;
            counts[r] = (int64_t)(x1 > x0 ? x1 - x0 : 0) + (r == im->group - 1 ? (int64_t)pad : 0);
            if (r == me && r == im->group - 1 && pad)
                c->k->memset0(stage + real, (size_t)pad);
            if (r == me && x1 > x0)
                image_copy(im, r, x0 - at, x1 - x0, stage + (x0 - lo), 1);
            at = end;
        }
        rc = comm_all_gather_v(c->comm, stage, counts, PX_FP8, kind, NULL, err);
        at = 0;
        for (int r = 0; r < im->group && !rc; r++) {
            const uint64_t end = at + part_bytes(im, r);
            const uint64_t x0 = at > lo ? at : lo, x1 = end < hi ? end : hi;
            if (r != me && x1 > x0)
                image_copy(im, r, x0 - at, x1 - x0, stage + (x0 - lo), 0);
            at = end;
        }
        exec_meter_close(M, c->k, op);
    }
    return rc;
}

int exec_pg_issue(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                  ModelPhase phase, int occurrence, int async, void *dst, PxError *err)
{
    ExecFp8Gather *G = &Z->pg;
    const ExecBlock *blk = &P->b[b];
    uint8_t *q8 = slot8_of(Z, b, dst);
    if (!q8)
        return px_fail(err, PX_ERUNTIME, "block %d: a gather slot without its FP8 part", b);
    enum { MAX_GROUP = 1024 };
    if (blk->group > MAX_GROUP)
        return px_fail(err, PX_ERUNTIME, "a ZeRO group of %d ranks (the FP8 parameter gather "
                       "takes %d)", blk->group, MAX_GROUP);
    int64_t act_n[MAX_GROUP], fp8_n[MAX_GROUP];
    uint64_t a_at = 0, q_at = 0;
    for (int r = 0; r < blk->group; r++) {
        const uint64_t lo = (uint64_t)r * blk->shard;
        const uint64_t f = fp8_in(G, P, b, lo, lo + blk->shard, NULL);
        fp8_n[r] = (int64_t)f;
        act_n[r] = (int64_t)(blk->shard - f);
        if (r < blk->group_rank) {
            a_at += blk->shard - f;
            q_at += f;
        }
    }
    G->spread[b] = 0;
    int rc = PX_OK, op = -1;
    const ModelComm kind = blk->experts ? MODEL_EDP_ALL_GATHER : MODEL_DP_ALL_GATHER;
    if (blk->group > 1 &&
        (rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, b, blk->chunk, phase, kind,
                              occurrence, "a block's parameter all-gather", &op, err)))
        return rc;
    const int carried = G->mx ? mx_carried(c, phase) : 0;
    const int copies = carried == 3 ? 2 : 1;
    const uint64_t ftot = fp8_in(G, P, b, 0, blk->shard * (uint64_t)blk->group, NULL);
    G->carried[b] = carried;
    const Image im = {c->k, c->ab, dst, q8, act_n, fp8_n, blk->group, copies, ftot};
    const int calls = bucket_calls(c, blk, image_bytes(&im, blk->group));
    if (calls > 1) { /* blocking, also when prefetched */
        pack_shard(G, c, P, b, dst, a_at, q8, q_at, carried, ftot);
        Z->gather_op[b] = op;
        if (!(rc = gather_image(Z->stage, &im, blk->group_rank, calls, kind, c, M, op, err)))
            rc = exec_pg_finish(Z, c, P, b, err);
        return rc;
    }
    if (op >= 0)
        exec_meter_open(M, c->k, op);
    pack_shard(G, c, P, b, dst, a_at, q8, q_at, carried, ftot);
    rc = comm_all_gather_v(c->comm, dst, act_n, c->act, kind, async ? &Z->gather_req[b] : NULL,
                           err);
    if (!rc)
        rc = comm_all_gather_v(c->comm, q8, fp8_n, PX_FP8, kind, async ? &G->req8[b] : NULL, err);
    if (!rc && copies > 1) /* MXFP8's second copy, in its own part */
        rc = comm_all_gather_v(c->comm, q8 + ftot, fp8_n, PX_FP8, kind,
                               async ? &G->req8c[b] : NULL, err);
    if (op >= 0)
        exec_meter_close(M, c->k, op);
    Z->gather_op[b] = op;
    if (!rc && Z->gather_req[b] < 0 && G->req8[b] < 0 && G->req8c[b] < 0)
        rc = exec_pg_finish(Z, c, P, b, err);
    return rc;
}

int exec_pg_finish(ExecZero *Z, const ExecCtx *c, ExecParams *P, int b, PxError *err)
{
    ExecFp8Gather *G = &Z->pg;
    int rc = comm_wait(c->comm, &G->req8[b], err); /* zero.c timed it; done unless it did not */
    if (!rc)
        rc = comm_wait(c->comm, &G->req8c[b], err);
    if (rc)
        return rc;
    void *act = Z->slot_of[b];
    if (G->mx) {
        mx_point(G, c, P, b, act, slot8_of(Z, b, act));
        return PX_OK;
    }
    spread_and_point(G, c, P, b, act, slot8_of(Z, b, act), !G->spread[b]);
    G->spread[b] = 1;
    return PX_OK;
}

/* ---- below ZeRO-3: the gather of the updated weights (exec_pg_updated) ---- */

/* Elements [off, off + n) of block blk's flat layout gathered in place in buf (their place:
 * rank r's part, its shard's share of them, after the parts of the ranks before it), in
 * `dtype`, over the block's group. */
static int gather_range(const ExecCtx *c, const ExecBlock *blk, void *buf, uint64_t off,
                        uint64_t n, PxDtype dtype, ModelComm kind, PxError *err)
{
    enum { MAX_GROUP = 1024 };
    int64_t counts[MAX_GROUP];
    if (blk->group > MAX_GROUP)
        return px_fail(err, PX_ERUNTIME, "a ZeRO group of %d ranks (the FP8 parameters' gather "
                       "takes %d)", blk->group, MAX_GROUP);
    for (int r = 0; r < blk->group; r++) {
        const uint64_t lo = (uint64_t)r * blk->shard, hi = lo + blk->shard;
        const uint64_t a = lo > off ? lo : off, e = hi < off + n ? hi : off + n;
        counts[r] = (int64_t)(e > a ? e - a : 0);
    }
    return comm_all_gather_v(c->comm, buf, counts, dtype, kind, NULL, err);
}

/* Where the update read the gradient of element a of block blk (optim.c's exec_optim_grad_at,
 * not called from here: optim.c calls into zero.c, which calls this file). */
static void *grads_at(const ExecCtx *c, const ExecBlock *blk, uint64_t a)
{
    if (c->spec.layout.zero >= 2)
        return EXEC_AT(blk->g_shard, a - blk->own_off, c->gb);
    return EXEC_AT(blk->g, a, c->gb);
}

/* This rank's piece [*a, *e) (block offsets; empty: *e <= *a) of matrix g of parameter i, and
 * the matrix's first element m0. */
static uint64_t own_piece(const ExecFp8Gather *G, const ExecParams *P, int i, int g, uint64_t *a,
                          uint64_t *e)
{
    const ExecParam *p = &P->p[i];
    const uint64_t n = matrix_elems(G, i), m0 = p->off + (uint64_t)g * n;
    uint64_t lo = 0, hi = 0;
    exec_params_own(P, p, &lo, &hi);
    *a = m0 > lo ? m0 : lo;
    *e = m0 + n < hi ? m0 + n : hi;
    return m0;
}

/* From element x (of the matrix of layout f, x < e) the end of the run of elements that share
 * x's scaling block, capped at e, and that block's index (row-major, as the scales follow the
 * elements): the whole piece with a per-tensor scale, else at most a block's width of a row. */
static uint64_t run_end(uint64_t x, uint64_t e, const KernFp8 *f, int *tile)
{
    const uint64_t R = (uint64_t)f->rows, C = (uint64_t)f->cols;
    const uint64_t br = (uint64_t)f->block_r < R ? (uint64_t)f->block_r : R;
    const uint64_t bc = (uint64_t)f->block_c < C ? (uint64_t)f->block_c : C;
    const uint64_t r = x / C, col = x % C;
    *tile = (int)((r / br) * ((C + bc - 1) / bc) + col / bc);
    uint64_t end;
    if (bc >= C) { /* the block spans whole rows */
        const uint64_t rr = (r / br + 1) * br;
        end = (rr < R ? rr : R) * C;
    } else {
        const uint64_t cc = (col / bc + 1) * bc;
        end = r * C + (cc < C ? cc : C);
    }
    return end < e ? end : e;
}

/* Elements [a, e) of block b's updated master in the act dtype into act: cast on the device
 * from the master, or with the optimizer offloaded (the master in host memory) copied up from
 * the host, which rounded them as the cast rounds (optim.c's exec_optim_offload_round). Megatron
 * copies its offloaded fp32 master back into the distributed optimizer's device shard
 * (cpu_offloading/hybrid_optimizer.py's param_copy_back_gpu_hook) and casts that
 * (distrib_optimizer.py's _copy_main_params_to_model_params, quantize_param_shard): the plan
 * keeps no master on the device (docs/memory.md, "Offload"), so the act values go up, the
 * shard's act bytes as for every other parameter. */
static void updated_act(const ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int b,
                        void *act, uint64_t a, uint64_t e)
{
    const ExecBlock *blk = &P->b[b];
    if (!G->up) {
        c->k->cast_to_act(act, blk->master + (a - blk->own_off), (size_t)(e - a));
        return;
    }
    const void *h = EXEC_AT(G->up, G->up_off[b], c->gb);
    c->k->to_device(act, EXEC_AT(h, a - blk->own_off, c->ab), (size_t)(e - a) * c->ab);
}

/* The amax of every run (run_end: a 128 x 128 tile's part of a row, or a per-tensor matrix's
 * whole piece) of matrix i's group g between a and e (m0: where the group starts), quantized
 * from src (the values at a, act dtype) into the FP8 weight's piece (in_place: its place, which
 * matrix_updated overwrites) or ws.fp8's weight area, the maxima folded into h (a tile's
 * entry each), a device-to-host copy a run. master_amax's and shard_tile_amax's. */
static void runs_amax(ExecFp8Gather *G, const ExecCtx *c, int i, int g, const KernFp8 *mf,
                      uint64_t m0, uint64_t a, uint64_t e, const void *src, int in_place,
                      float *h)
{
    ExecFp8 *F = G->fp8;
    for (uint64_t x = a, end; x < e; x = end) {
        int t;
        float amax;
        end = m0 + run_end(x - m0, e - m0, mf, &t);
        const KernFp8 f = {1, (int)(end - x), 1, (int)(end - x), 0, 0};
        c->k->fp8_quantize(in_place ? piece_at(G, i, g, x) : F->wq, F->amax,
                           EXEC_AT(src, x - a, c->ab), &f, 0, NULL);
        c->k->to_host(&amax, F->amax, sizeof amax);
        h[t] = amax > h[t] || isnan(amax) ? amax : h[t];
    }
}

/* Below ZeRO-3: this rank's amax of every scaling block of every FP8 matrix (0 where it holds
 * none of it) from its pieces' act values, which it first casts from the updated fp32 master
 * into the place of their gradients, packed from the first (read by the update, cleared at the
 * next step's start, as wide as the act dtype or wider), where matrix_updated reads them again: run by run (run_end),
 * each quantized into its place in the FP8 weight (overwritten by matrix_updated's; the scale
 * each writes after its run lands in the next run, the next rank's piece, which the gather
 * brings, or the matrix's scales, written after the gather), the maxima taken on the host
 * (G->host) and copied into G->amax. The first dense and the first experts' block that hold
 * one. */
static void master_amax(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int first[2])
{
    ExecFp8 *F = G->fp8;
    const KernBackend *k = c->k;
    first[0] = first[1] = -1;
    memset(G->host, 0, (size_t)G->n_w * sizeof *G->host);
    for (int i = 0; i < P->n; i++) {
        if (G->w_of[i] < 0)
            continue;
        const ExecBlock *blk = &P->b[P->p[i].block];
        const int ex = !!blk->experts, tiles = tiles_of(F, i);
        first[ex] = first[ex] < 0 ? P->p[i].block : first[ex];
        const KernFp8 mf = exec_fp8_desc(F, F->w[i].rows, F->w[i].cols, 1, 0);
        for (int g = 0; g < F->w[i].groups; g++) {
            uint64_t a, e;
            const uint64_t m0 = own_piece(G, P, i, g, &a, &e);
            if (e <= a)
                continue;
            void *act = grads_at(c, blk, a); /* the piece's act values, packed */
            updated_act(G, c, P, P->p[i].block, act, a, e);
            runs_amax(G, c, i, g, &mf, m0, a, e, act, 1, G->host + G->w_of[i] + g * tiles);
        }
    }
    k->to_device(G->amax, G->host, (size_t)G->n_w * sizeof *G->host);
}

/* ZeRO-3 with blockwise: this rank's amax of every 128 x 128 tile of every FP8 matrix (0
 * where it holds none of it), from its act shard run by run (run_end), each quantized into
 * ws.fp8's weight area, the maxima taken on the host (G->host) and copied into G->amax, as
 * master_amax does below ZeRO-3 (Transformer Engine's partial amaxes of a blockwise weight's
 * shard, which Megatron-FSDP all-reduces over the data-parallel group). The first dense and
 * the first experts' block that hold one. */
static void shard_tile_amax(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int first[2])
{
    ExecFp8 *F = G->fp8;
    const KernBackend *k = c->k;
    first[0] = first[1] = -1;
    memset(G->host, 0, (size_t)G->n_w * sizeof *G->host);
    for (int i = 0; i < P->n; i++) {
        if (G->w_of[i] < 0)
            continue;
        const ExecBlock *blk = &P->b[P->p[i].block];
        const int ex = !!blk->experts, tiles = tiles_of(F, i);
        first[ex] = first[ex] < 0 ? P->p[i].block : first[ex];
        const KernFp8 mf = exec_fp8_desc(F, F->w[i].rows, F->w[i].cols, 1, 0);
        for (int g = 0; g < F->w[i].groups; g++) {
            uint64_t a, e;
            const uint64_t m0 = own_piece(G, P, i, g, &a, &e);
            if (e > a)
                runs_amax(G, c, i, g, &mf, m0, a, e, EXEC_AT(blk->w_shard, a - blk->own_off, c->ab),
                          0, G->host + G->w_of[i] + g * tiles);
        }
    }
    k->to_device(G->amax, G->host, (size_t)G->n_w * sizeof *G->host);
}

/* Matrix g of parameter i: this rank's piece quantized run by run from its act values (where
 * master_amax left them, packed from its first gradient's place) with its blocks' scales, the matrix gathered (comm), its scales
 * written after it, its transpose made from the FP8 bytes (a TN-only device's; blockwise: each
 * 128 x 128 tile transposed with its scale, kernels' fp8_transpose, as Transformer Engine's
 * _create_columnwise derives a 2D-scaled weight's columnwise copy after the gather). */
static int matrix_updated(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int i, int g,
                          int comm, ModelComm kind, PxError *err)
{
    const KernBackend *k = c->k;
    const ExecBlock *blk = &P->b[P->p[i].block];
    const ExecFp8Weight *fw = &G->fp8->w[i];
    const KernFp8 mf = exec_fp8_desc(G->fp8, fw->rows, fw->cols, 1, 0);
    const int tiles = tiles_of(G->fp8, i), w = G->w_of[i] + g * tiles;
    uint64_t a, e;
    const uint64_t m0 = own_piece(G, P, i, g, &a, &e), n = matrix_elems(G, i);
    const void *act = e > a ? grads_at(c, blk, a) : NULL; /* master_amax's act values */
    for (uint64_t x = a, end; x < e; x = end) {
        int t;
        end = m0 + run_end(x - m0, e - m0, &mf, &t);
        const KernFp8 f = {1, (int)(end - x), 1, (int)(end - x), 0, 0};
        k->fp8_quantize(piece_at(G, i, g, x), NULL, EXEC_AT(act, x - a, c->ab), &f, 0,
                        scale_of(G, w + t));
    }
    uint8_t *q = piece_at(G, i, g, m0);
    int rc = comm ? gather_range(c, blk, q, m0, n, PX_FP8, kind, err) : PX_OK;
    k->copy(q + n, scale_of(G, w), (size_t)tiles * sizeof(float));
    if (fw->qt) {
        const ExecFp8Ref r = exec_fp8_weight_ref(G->fp8, fw, g, 0);
        k->fp8_transpose((void *)exec_fp8_weight_ref(G->fp8, fw, g, 1).q, r.q, &r.f);
    }
    return rc;
}

/* ---- below ZeRO-3 with MXFP8: the updated weights gathered in the act dtype ---- */

/* Megatron-LM's distributed optimizer with MXFP8 parameters (docs/fp8.md, "MXFP8 parameters
 * below ZeRO-3"): an E8M0 scale a block of 32 elements, each copy (row-wise, column-wise) its
 * own blocks, so no rank can quantize its shard of a weight into the copies of the whole; the
 * updated shards travel in the act dtype into the gradient buffer, free after the update
 * (megatron/core/distributed/param_and_grad_buffer.py: the shared_buffer, param_data a bf16
 * view of grad_data, zeroed after the copy; distrib_optimizer.py's
 * _copy_main_params_to_param_buffer), and every rank quantizes every weight from the whole
 * values itself (_post_param_sync). No amax all-reduce: an MXFP8 scale is its block's. */

/* Matrix g of parameter i: this rank's piece of the updated master cast to the act dtype into
 * its place among the matrix's gradients (read by the update, cleared at the next step's
 * start, as wide as the act dtype or wider: the matrix's values fit in its gradients' first
 * bytes), the matrix gathered there in the act dtype (comm), and its row-wise copy (and
 * column-wise one, w->qt) quantized from the whole, with scales of its own blocks, as
 * exec_fp8_cast quantizes the act weight without the flag (the same values: bit for bit). */
static int mx_matrix(ExecFp8Gather *G, const ExecCtx *c, const ExecParams *P, int i, int g,
                     int comm, ModelComm kind, PxError *err)
{
    const ExecBlock *blk = &P->b[P->p[i].block];
    const ExecFp8Weight *fw = &G->fp8->w[i];
    uint64_t a, e;
    const uint64_t m0 = own_piece(G, P, i, g, &a, &e);
    void *land = EXEC_AT(blk->g, m0, c->gb);
    if (e > a)
        c->k->cast_to_act(EXEC_AT(land, a - m0, c->ab), blk->master + (a - blk->own_off),
                          (size_t)(e - a));
    const int rc =
        comm ? gather_range(c, blk, land, m0, matrix_elems(G, i), c->act, kind, err) : PX_OK;
    for (int t = fw->qt ? 1 : 0; t >= 0 && !rc; t--) {
        const ExecFp8Ref r = exec_fp8_weight_ref(G->fp8, fw, g, t);
        c->k->fp8_quantize((void *)r.q, NULL, land, &r.f, t, NULL);
    }
    return rc;
}

static int block_updated(ExecFp8Gather *G, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                         PxError *err);

/* The update's MXFP8 weights: block by block (block_updated with mx_matrix), on the gradients'
 * places, which ZeRO-2 shards (model/spec.c refuses it: Megatron's distributed optimizer holds
 * whole gradients). */
static int mx_updated(ExecFp8Gather *G, const ExecCtx *c, ExecParams *P, ExecMeter *M,
                      PxError *err)
{
    if (c->spec.layout.zero >= 2)
        return px_fail(err, PX_ERUNTIME, "MXFP8 parameters gathered below ZeRO-3 need whole "
                       "gradients (--zero 0 or 1; model/spec.c refuses ZeRO-2)");
    int rc = PX_OK;
    for (int b = 0; b < P->nb && !rc; b++)
        if (P->b[b].fp8)
            rc = block_updated(G, c, P, M, b, err);
    return rc;
}

/* Block b (it holds FP8 parameters) after the update, under one op of the parameter
 * all-gather (model/ops.c's step_param_gathers: block_param_bytes, in one call): its act
 * parameters as the update left them and its FP8 matrices, each gathered in place, and the
 * padding of the block's last shard (its last rank's zeros, into G->pad), so that the bytes
 * are (padded - fp8) x act + fp8. Without ZeRO every rank holds the whole block: its
 * matrices are quantized, nothing moves. */
static int block_updated(ExecFp8Gather *G, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                         PxError *err)
{
    const ExecBlock *blk = &P->b[b];
    const int comm = c->spec.layout.zero > 0 && blk->group > 1;
    const ModelComm kind = blk->experts ? MODEL_EDP_ALL_GATHER : MODEL_DP_ALL_GATHER;
    int op = -1, rc = PX_OK;
    if (comm && M &&
        (rc = exec_meter_need(M, c, MODEL_OPR_BLOCK_PARAMS, b, blk->chunk, MODEL_STEP, kind, 0,
                              "parameter all-gather of a block", &op, err)))
        return rc;
    if (op >= 0)
        exec_meter_open(M, c->k, op);
    for (int i = blk->first_param; i < blk->first_param + blk->n_params && !rc; i++) {
        const ExecParam *p = &P->p[i];
        if (G->w_of[i] < 0) {
            if (comm)
                rc = gather_range(c, blk, p->w, p->off, p->numel, c->act, kind, err);
            continue;
        }
        for (int g = 0; g < G->fp8->w[i].groups && !rc; g++)
            rc = c->spec.job.fp8 == MODEL_FP8_MXFP8
                     ? mx_matrix(G, c, P, i, g, comm, kind, err)
                     : matrix_updated(G, c, P, i, g, comm, kind, err);
    }
    const uint64_t padded = blk->shard * (uint64_t)blk->group;
    if (comm && !rc && padded > blk->numel) {
        /* the padding is the last rank's: its zeros land in G->pad */
        if (blk->group_rank == blk->group - 1)
            c->k->memset0(G->pad, G->pad_bytes);
        rc = gather_range(c, blk, G->pad, blk->numel, padded - blk->numel, c->act, kind, err);
    }
    if (op >= 0)
        exec_meter_close(M, c->k, op);
    return rc;
}

int exec_pg_updated(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err)
{
    ExecFp8Gather *G = &Z->pg;
    if (!G->after || G->n_w == 0)
        return PX_OK;
    if (c->spec.job.fp8 == MODEL_FP8_MXFP8)
        return mx_updated(G, c, P, M, err);
    int first[2], rc = PX_OK;
    master_amax(G, c, P, first);
    /* without ZeRO every rank's amax is its whole weight's already */
    if (c->spec.layout.zero > 0) {
        rc = amax_allreduce(G, c, P, M, first[0], 0, G->n_dense, MODEL_DP_ALLREDUCE, err);
        if (!rc)
            rc = amax_allreduce(G, c, P, M, first[1], G->n_dense, G->n_w - G->n_dense,
                                MODEL_EDP_ALLREDUCE, err);
    }
    if (!rc)
        rc = take_scales(G, c, P, err);
    for (int b = 0; b < P->nb && !rc; b++)
        if (P->b[b].fp8)
            rc = block_updated(G, c, P, M, b, err);
    return rc;
}
