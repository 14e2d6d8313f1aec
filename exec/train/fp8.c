/* FP8 training's state in the trainer (docs/fp8.md): the FP8 copies of the linear layers'
 * weights, cast from their act values once per step (under ZeRO-3, which keeps no copies, by
 * each GEMM into ws.fp8); delayed scaling's amax histories and decode factors; ws.fp8, where a
 * GEMM's operands are quantized; the quantization of an operand with its recipe's scaling; and
 * the FP8 linear layer's forward and backward, which layers.c and moe.c call.
 *
 * Delayed scaling follows Transformer Engine's DelayedScaling (amax_compute_algo "max",
 * margin 0): a tensor is quantized with the decode factor that the largest amax of its history
 * gives, and its own amax is then rolled into that history. Each of an FP8 GEMM's three tensors
 * has its history: the input and the output gradient take one entry per micro-batch (as
 * Transformer Engine updates after every forward and backward), the weight one per cast
 * (under ZeRO-3 one per forward). A recomputed forward quantizes with the current factors and
 * records nothing, so that the history counts each micro-batch once. <w>.fp8_amax holds, for
 * group g and tensor c, the history at (3g + c) * len and then the 3 * groups decode factors,
 * (len + 1) x 3 x groups fp32 as the tensor table sizes it; the experts' fc1 under
 * --fp8-dispatch holds the dispatched rows' history and factor as one more column (hist_cols,
 * exec_fp8_dispatch_quantize), the QKV weight (MLA's kv_b: model_fp8_attn_weight) FP8
 * attention's after its own three (model_fp8_attn_history, exec_fp8_core_quantize). */
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

static const ModelTensorRole fp8_roles[EXEC_FP8_ROLES] = {
    MODEL_TR_QKV_W, MODEL_TR_PROJ_W, MODEL_TR_FC1_W, MODEL_TR_FC2_W, MODEL_TR_EXP_FC1_W,
    MODEL_TR_EXP_FC2_W, MODEL_TR_Q_A_W, MODEL_TR_KV_A_W, MODEL_TR_Q_B_W, MODEL_TR_KV_B_W,
};

int exec_fp8_role_index(ModelTensorRole r)
{
    for (int i = 0; i < EXEC_FP8_ROLES; i++)
        if (fp8_roles[i] == r)
            return i;
    return -1;
}

int exec_fp8_init(ExecFp8 *F, const ExecCtx *c, const ExecParams *P, PxError *err)
{
    memset(F, 0, sizeof *F);
    const ModelJob *j = &c->spec.job;
    F->on = c->d.fp8 != MODEL_FP8_NONE;
    if (!F->on)
        return PX_OK;
    F->recipe = j->fp8;
    F->hybrid = j->fp8_format == MODEL_FP8_HYBRID;
    F->wt = c->d.fp8_wt;
    F->len = j->fp8 == MODEL_FP8_DELAYED ? j->fp8_amax_history : 0;
    F->params = j->fp8_param_gather && c->spec.layout.zero < 3;
    model_fp8_workspace(&c->spec, &c->d, &F->lay);
    /* a row for every layer with weights: the model's and its prediction modules' (layers + k -
     * 1, whose transformer layers run their GEMMs in FP8 as the model's do; their eh projection
     * and the shared output layer stay in the act dtype, as model_fp8_op prices them) */
    const int layers = c->spec.model.layers + c->spec.model.mtp_layers;
    F->n = P->n;
    F->w = exec_zalloc((size_t)P->n, sizeof *F->w);
    F->of_layer = exec_zalloc((size_t)layers * EXEC_FP8_ROLES, sizeof *F->of_layer);
    if (!F->w || !F->of_layer)
        return px_fail(err, PX_ERUNTIME, "out of memory for the FP8 weights");
    for (int i = 0; i < layers * EXEC_FP8_ROLES; i++)
        F->of_layer[i] = -1;
    /* the layers' FP8 GEMMs' weights, whatever the table keeps of them (ZeRO-3: no copies) */
    for (int i = 0; i < P->n; i++) {
        const ExecParam *p = &P->p[i];
        const int ri = exec_fp8_role_index(p->role);
        if (ri < 0 || p->layer < 0 || !model_fp8_weight(&c->spec, p->role))
            continue;
        if (p->layer >= layers)
            return px_fail(err, PX_ERUNTIME,
                           "%s: an FP8 GEMM weight of layer %d past the model's %d layers and "
                           "prediction modules: model/ and exec/ disagree",
                           p->name, p->layer, layers);
        const int experts = p->role == MODEL_TR_EXP_FC1_W || p->role == MODEL_TR_EXP_FC2_W;
        ExecFp8Weight *w = &F->w[i];
        w->p = p;
        w->groups = experts ? c->d.experts_loc : 1;
        w->rows = (int)(p->rows / w->groups);
        w->cols = (int)p->cols;
        w->hist_cols = 3 * w->groups + (p->role == MODEL_TR_EXP_FC1_W &&
                                        model_fp8_dispatch_history(&c->spec, &c->d)) +
                       (p->role == model_fp8_attn_weight(&c->spec)
                            ? model_fp8_attn_history(&c->spec)
                            : 0);
        F->of_layer[p->layer * EXEC_FP8_ROLES + ri] = i;
    }
    return PX_OK;
}

void exec_fp8_free(ExecFp8 *F)
{
    free(F->w);
    free(F->of_layer);
    memset(F, 0, sizeof *F);
}

KernFp8 exec_fp8_desc(const ExecFp8 *F, int rows, int cols, int weight, int grad)
{
    ModelFp8Scaling sc;
    model_fp8_scaling(F->recipe, weight, rows, cols, &sc);
    const KernFp8 f = {rows, cols, (int)sc.block_r, (int)sc.block_c, grad && F->hybrid, sc.e8m0};
    return f;
}

uint64_t exec_fp8_gather_room(const ExecFp8 *F, const ExecFp8Weight *w)
{
    const KernFp8 f = exec_fp8_desc(F, w->rows, w->cols, 1, 0);
    return px_round_up(kern_fp8_scales(&f) * sizeof(float), MODEL_FP8_GATHER_SCALE_BYTES);
}

/* The FP8 weight entry a table tensor (<w>.fp8, .fp8_t, .fp8_amax, or an FP8 parameter itself)
 * belongs to: its parameter's index, or -1 (with err) when the stage has no such FP8 GEMM
 * weight or its matrices differ. */
static int weight_of(const ExecFp8 *F, const ExecParams *P, const ModelTensor *t, PxError *err)
{
    const ExecParam *p = exec_params_of(P, exec_is_fp8_copy(t->role) ? t->of : t->role, t->layer);
    const int i = p ? (int)(p - P->p) : -1;
    if (i < 0 || !F->w[i].p) {
        exec_bind_unused(t, err);
        return -1;
    }
    const ExecFp8Weight *w = &F->w[i];
    if (w->groups != (t->groups > 0 ? t->groups : 1)) {
        px_fail(err, PX_ERUNTIME, "%s: %d FP8 matrices of %s's %lld rows: model/ and exec/ disagree",
                t->name, t->groups, p->name, (long long)p->rows);
        return -1;
    }
    return i;
}

static int check_bytes(const ModelTensor *t, uint64_t want, PxError *err)
{
    if (t->bytes == want)
        return PX_OK;
    return px_fail(err, PX_ERUNTIME,
                   "%s holds %llu bytes but the executor computes %llu in it: model/ and exec/ "
                   "disagree",
                   t->name, (unsigned long long)t->bytes, (unsigned long long)want);
}

int exec_fp8_bind(ExecFp8 *F, const ExecParams *P, const ModelTensor *t, void *p, PxError *err)
{
    if (!F->on)
        return exec_bind_unused(t, err);
    if (t->role == MODEL_TR_WS_FP8) {
        int rc = check_bytes(t, F->lay.total, err);
        if (rc || !p)
            return rc;
        F->ws = p;
        F->amax = (float *)(F->ws + F->lay.scratch);
        F->fmax = F->amax + 1;
        F->act = F->ws + F->lay.act;
        F->q0 = F->ws + F->lay.q0;
        F->q1 = F->ws + F->lay.q1;
        F->wq = F->lay.w_bytes ? F->ws + F->lay.w : NULL;
        F->wqt = F->lay.wt_bytes ? F->ws + F->lay.wt : NULL;
        return PX_OK;
    }
    const int i = weight_of(F, P, t, err);
    if (i < 0)
        return PX_ERUNTIME;
    ExecFp8Weight *w = &F->w[i];
    int rc;
    if (!exec_is_fp8_copy(t->role)) { /* the parameter, kept in FP8 (F->params) */
        const KernFp8 f = exec_fp8_desc(F, w->rows, w->cols, 1, 0);
        if (!F->params || t->dtype != PX_FP8)
            return exec_bind_unused(t, err);
        if (!(rc = check_bytes(t, (uint64_t)w->groups * kern_fp8_bytes(&f), err)))
            w->q = p;
        return rc;
    }
    switch (t->role) {
    case MODEL_TR_FP8_W: {
        const KernFp8 f = exec_fp8_desc(F, w->rows, w->cols, 1, 0);
        if (!(rc = check_bytes(t, (uint64_t)w->groups * kern_fp8_bytes(&f), err)))
            w->q = p;
        return rc;
    }
    case MODEL_TR_FP8_WT: {
        const KernFp8 f = exec_fp8_desc(F, w->cols, w->rows, 1, 0);
        if (!F->wt)
            return exec_bind_unused(t, err);
        if (!(rc = check_bytes(t, (uint64_t)w->groups * kern_fp8_bytes(&f), err)))
            w->qt = p;
        return rc;
    }
    case MODEL_TR_FP8_MX_SCALES: {
        if (!(rc = check_bytes(t, (uint64_t)w->groups * exec_fp8_mx_grids(F, w), err)) && p)
            w->mxs = p;
        return rc;
    }
    case MODEL_TR_FP8_AMAX:
        if (!F->len)
            return exec_bind_unused(t, err);
        if (!(rc = check_bytes(t, (uint64_t)(F->len + 1) * (uint64_t)w->hist_cols * sizeof(float),
                               err)) &&
            p) {
            w->hist = p;
            w->scale = w->hist + (size_t)w->hist_cols * F->len;
        }
        return rc;
    default: return exec_bind_unused(t, err);
    }
}

const ExecFp8Weight *exec_fp8_weight(const ExecFp8 *F, ModelTensorRole role, int layer)
{
    const int ri = exec_fp8_role_index(role);
    if (!F->on || ri < 0 || layer < 0)
        return NULL;
    const int i = F->of_layer[layer * EXEC_FP8_ROLES + ri];
    return i >= 0 ? &F->w[i] : NULL;
}

ExecFp8Ref exec_fp8_weight_ref(const ExecFp8 *F, const ExecFp8Weight *w, int g, int transposed)
{
    ExecFp8Ref r = {NULL, exec_fp8_desc(F, w->rows, w->cols, 1, 0)};
    if (transposed)
        r.f = exec_fp8_desc(F, w->cols, w->rows, 1, 0);
    r.q = (const uint8_t *)(transposed ? w->qt : w->q) + (size_t)g * kern_fp8_bytes(&r.f);
    return r;
}

/* Delayed scaling's decode factor of tensor `which` of group g, and its history. */
static float *scale_of(const ExecFp8 *F, const ExecFp8Weight *w, int g, int which)
{
    return F->len ? w->scale + 3 * g + which : NULL;
}

static void record(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, int g, int which,
                   int grad)
{
    c->k->fp8_amax_update(w->hist + (size_t)(3 * g + which) * (size_t)F->len,
                          w->scale + 3 * g + which, F->amax, F->fmax + (grad && F->hybrid), F->len,
                          1);
}

ExecFp8Ref exec_fp8_quantize(ExecFp8 *F, const ExecCtx *c, void *q, const void *x, int rows,
                             int cols, int trans, int which, const ExecFp8Weight *w, int g,
                             int rec)
{
    const int grad = which == EXEC_FP8_DY;
    ExecFp8Ref r = {q, exec_fp8_desc(F, rows, cols, 0, grad)};
    const float *scale = scale_of(F, w, g, which);
    c->k->fp8_quantize(q, scale && rec ? F->amax : NULL, x, &r.f, trans, scale);
    if (scale && rec)
        record(F, c, w, g, which, grad);
    return r;
}

/* Group g of w's act values cast into q, w's copy (transposed: its transpose), with the
 * weight's decode factor under delayed scaling; rec rolls the weight's amax into its history. */
static void cast_group(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, int g, void *q,
                       int transposed, int rec)
{
    const KernFp8 f = transposed ? exec_fp8_desc(F, w->cols, w->rows, 1, 0)
                                 : exec_fp8_desc(F, w->rows, w->cols, 1, 0);
    const float *scale = scale_of(F, w, g, EXEC_FP8_W);
    c->k->fp8_quantize(q, scale && rec ? F->amax : NULL,
                       EXEC_AT(w->p->w, (size_t)g * w->rows * w->cols, c->ab), &f, transposed,
                       scale);
    if (scale && rec)
        record(F, c, w, g, EXEC_FP8_W, 0);
}

/* Casts w's act values into its copies, group by group (the weight's amax recorded once). */
static void cast_weight(ExecFp8 *F, const ExecCtx *c, ExecFp8Weight *w)
{
    for (int g = 0; g < w->groups; g++) {
        /* the transposed copy first: it quantizes with the factor the copy's record replaces */
        if (w->qt)
            cast_group(F, c, w, g, (void *)exec_fp8_weight_ref(F, w, g, 1).q, 1, 0);
        cast_group(F, c, w, g, (void *)exec_fp8_weight_ref(F, w, g, 0).q, 0, 1);
    }
}

void exec_fp8_cast(ExecFp8 *F, const ExecCtx *c)
{
    /* ZeRO-3 casts per use instead; FP8 parameters are written by fp8gather.c */
    for (int i = 0; F->on && !F->params && i < F->n; i++)
        if (F->w[i].q)
            cast_weight(F, c, &F->w[i]);
}

int exec_fp8_start(ExecFp8 *F, const ExecCtx *c, PxError *err)
{
    if (!F->on)
        return PX_OK;
    if (!F->ws)
        return px_fail(err, PX_ERUNTIME, "an FP8 plan without ws.fp8: model/ and exec/ disagree");
    const float fmax[2] = {448.0f, 57344.0f}; /* E4M3's and E5M2's largest finite values */
    c->k->to_device(F->fmax, fmax, sizeof fmax);
    int most = 0;
    for (int i = 0; i < F->n; i++)
        most = F->w[i].hist_cols > most ? F->w[i].hist_cols : most;
    float *ones = exec_zalloc((size_t)most, sizeof *ones);
    if (!ones)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    for (int i = 0; i < most; i++)
        ones[i] = 1.0f;
    int rc = PX_OK;
    for (int i = 0; i < F->n && !rc; i++) {
        const ExecFp8Weight *w = &F->w[i];
        if (!w->p)
            continue;
        const int zero3 = c->spec.layout.zero == 3;
        if ((!zero3 && (!w->q || (F->wt && !w->qt))) || (F->len && !w->hist))
            rc = px_fail(err, PX_ERUNTIME,
                         "%s has no FP8 copy%s in the tensor table: model/ and exec/ disagree",
                         w->p->name, F->wt ? ", transposed copy" : F->len ? " or amax history" : "");
        else if (zero3 && c->spec.job.fp8_param_gather && F->recipe == MODEL_FP8_MXFP8 && !w->mxs)
            rc = px_fail(err, PX_ERUNTIME, "%s has no fp8_scales in the tensor table: model/ and "
                         "exec/ disagree", w->p->name);
        else if (zero3 && !w->mxs && (!F->wq || (F->wt && !F->wqt)))
            rc = px_fail(err, PX_ERUNTIME,
                         "ws.fp8 has no room for ZeRO-3's weight casts: model/ and exec/ disagree");
        else if (F->len) /* delayed scaling starts from decode factors of 1, as Transformer Engine */
            c->k->to_device(w->scale, ones, (size_t)w->hist_cols * sizeof *ones);
    }
    free(ones);
    if (!rc)
        exec_fp8_cast(F, c);
    return rc;
}

void exec_fp8_dispatch_quantize(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, void *q,
                                const void *x, int rows, int cols, int rec)
{
    const int col = w->hist_cols - 1;
    float *scale = w->scale + col;
    if (rows > 0) {
        const KernFp8 f = exec_fp8_desc(F, rows, cols, 0, 0);
        c->k->fp8_quantize(q, rec ? F->amax : NULL, x, &f, 0, scale);
    } else {
        c->k->memset0(q, sizeof(float)); /* a zero scale, which nothing decodes with */
        if (rec)
            c->k->memset0(F->amax, sizeof(float));
    }
    if (rec)
        c->k->fp8_amax_update(w->hist + (size_t)col * (size_t)F->len, scale, F->amax, F->fmax,
                              F->len, 1);
}

ExecFp8Ref exec_fp8_core_quantize(ExecFp8 *F, const ExecCtx *c, void *q, const void *x, int rows,
                                  int cols, int which, const ExecFp8Weight *fq, int rec)
{
    const int grad = which == EXEC_FP8_CORE_DO || which == EXEC_FP8_CORE_DQKV;
    ExecFp8Ref r = {q, exec_fp8_desc(F, rows, cols, 0, grad)};
    const int col = 3 + which;
    float *scale = F->len ? fq->scale + col : NULL;
    c->k->fp8_quantize(q, scale && rec ? F->amax : NULL, x, &r.f, 0, scale);
    if (scale && rec)
        c->k->fp8_amax_update(fq->hist + (size_t)col * (size_t)F->len, scale, F->amax,
                              F->fmax + (grad && F->hybrid), F->len, 1);
    return r;
}

/* MXFP8's column-wise layout of rows x cols: 32 x 1 blocks */
static KernFp8 mx_colwise(const ExecFp8 *F, int rows, int cols, int grad)
{
    KernFp8 f = exec_fp8_desc(F, rows, cols, 0, grad);
    const int br = f.block_r;
    f.block_r = f.block_c;
    f.block_c = br;
    return f;
}

void exec_fp8_mx_copies(ExecFp8 *F, const ExecCtx *c, void *row, void *col, const void *x,
                        int rows, int cols, int grad)
{
    KernFp8 f = mx_colwise(F, rows, cols, grad);
    c->k->fp8_quantize(F->q0, NULL, x, &f, 0, NULL);
    c->k->fp8_dequantize(col, F->q0, &f);
    f = exec_fp8_desc(F, rows, cols, 0, grad);
    c->k->fp8_quantize(F->q0, NULL, x, &f, 0, NULL);
    c->k->fp8_dequantize(row, F->q0, &f);
}

void exec_fp8_mx_saved(ExecFp8 *F, const ExecCtx *c, void *saved, void *row, void *col,
                       const void *x, int rows, int cols)
{
    const KernFp8 fr = exec_fp8_desc(F, rows, cols, 0, 0), fc = mx_colwise(F, rows, cols, 0);
    uint8_t *qc = (uint8_t *)saved + kern_fp8_bytes(&fr);
    if (x) {
        c->k->fp8_quantize(qc, NULL, x, &fc, 0, NULL);
        c->k->fp8_quantize(saved, NULL, x, &fr, 0, NULL);
    }
    c->k->fp8_dequantize(col, qc, &fc);
    c->k->fp8_dequantize(row, saved, &fr);
}

/* Where FP8 attention's fused core writes its output under delayed scaling
 * (model_fp8_attn_out): ws.fp8's act part after Q, K and V, decoded there from its FP8 copy
 * (attn.proj.in) for the projection and the core's backward; NULL otherwise. */
void *exec_fp8_core_out(const ExecLayerRun *r)
{
    const ExecCtx *c = r->c;
    const size_t N = (size_t)c->d.b * (size_t)c->d.s_loc;
    return model_fp8_attn_out(&c->spec)
               ? EXEC_AT(r->fp8->act, N * (size_t)(c->d.q_loc + c->d.kv2_loc), c->ab)
               : NULL;
}

ExecFp8Ref exec_fp8_saved(const ExecFp8 *F, const void *q, int rows, int cols)
{
    const ExecFp8Ref x = {q, exec_fp8_desc(F, rows, cols, 0, 0)};
    return x;
}

void exec_fp8_mm(const ExecCtx *c, ExecMeter *M, void *out, PxDtype ct, ExecFp8Ref a,
                 ExecFp8Ref b, int m, int n, int k, int ta, int tb, float beta)
{
    c->k->matmul_fp8(out, ct, a.q, &a.f, b.q, &b.f, m, n, k, ta, tb, 1.0f, beta);
    exec_meter_flops(M, 2.0 * m * n * k);
}

/* A GEMM's weight operand: its FP8 tensor and, where its scales lie apart (a gathered MXFP8
 * copy: the gather carries none, <w>.fp8_scales holds them), their place; NULL: after the
 * elements. */
typedef struct {
    ExecFp8Ref r;
    const void *s;
} WeightOp;

/* exec_fp8_mm with the weight as B. */
static void weight_mm(const ExecCtx *c, ExecMeter *M, void *out, PxDtype ct, ExecFp8Ref a,
                      WeightOp b, int m, int n, int k, int ta, int tb, float beta)
{
    if (!b.s) {
        exec_fp8_mm(c, M, out, ct, a, b.r, m, n, k, ta, tb, beta);
        return;
    }
    c->k->matmul_fp8_split(out, ct, a.q, &a.f, NULL, b.r.q, &b.r.f, b.s, m, n, k, ta, tb, 1.0f,
                           beta);
    exec_meter_flops(M, 2.0 * m * n * k);
}

uint64_t exec_fp8_mx_grids(const ExecFp8 *F, const ExecFp8Weight *w)
{
    const KernFp8 r = exec_fp8_mx_desc(F, w, 0), t = exec_fp8_mx_desc(F, w, 1);
    return kern_fp8_scales(&r) + kern_fp8_scales(&t);
}

KernFp8 exec_fp8_mx_desc(const ExecFp8 *F, const ExecFp8Weight *w, int colwise)
{
    KernFp8 f = exec_fp8_desc(F, w->rows, w->cols, 1, 0);
    if (colwise) { /* the weight's shape, 32 x 1 blocks */
        f.block_r = f.block_c;
        f.block_c = 1;
    }
    return f;
}

/* Group g of a gathered MXFP8 weight (fp8gather.c's exec_pg_finish): the row-wise copy for a
 * forward, the column-wise one for the input gradient (transposed), each in the weight's shape
 * with its grid of <w>.fp8_scales; the column-wise one is read with the GEMM's transpose flag
 * flipped (exec_fp8_linear_dgrad), which gives the product of the transposed copy a cast
 * makes, bit for bit (kernels.h's matmul_fp8_split), so nothing is transposed after the
 * gather, as Megatron-FSDP gathers Transformer Engine's columnwise data as it is. */
static WeightOp mx_use(const ExecFp8 *F, const ExecFp8Weight *w, int g, int colwise)
{
    const KernFp8 fr = exec_fp8_mx_desc(F, w, 0);
    const size_t n = (size_t)w->rows * (size_t)w->cols, nr = kern_fp8_scales(&fr);
    const uint8_t *s = w->mxs + (size_t)g * exec_fp8_mx_grids(F, w);
    const WeightOp o = {{(const uint8_t *)(colwise ? w->gqt : w->gq) + (size_t)g * n,
                         exec_fp8_mx_desc(F, w, colwise)},
                        colwise ? s + nr : s};
    return o;
}

/* Group g of w's FP8 copy (transposed: its transposed copy) for a GEMM: the copy cast after the
 * update, or under ZeRO-3 the gathered weight cast now into ws.fp8 (a forward's cast records
 * its amax under delayed scaling, as the cast after an update does). */
static ExecFp8Ref weight_copy(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, int g,
                              int transposed, int rec)
{
    if (w->gq) { /* gathered in FP8 (fp8gather.c): read as it arrived, or transposed; a local
                    expert's matrix after the g before it, each with its scales */
        const size_t at = (size_t)g * ((size_t)w->rows * (size_t)w->cols +
                                       (size_t)exec_fp8_gather_room(F, w));
        const ExecFp8Ref r = {(const uint8_t *)w->gq + at,
                              exec_fp8_desc(F, w->rows, w->cols, 1, 0)};
        if (!transposed)
            return r;
        c->k->fp8_transpose(F->wqt, r.q, &r.f);
        const ExecFp8Ref t = {F->wqt, exec_fp8_desc(F, w->cols, w->rows, 1, 0)};
        return t;
    }
    if (w->q)
        return exec_fp8_weight_ref(F, w, g, transposed);
    ExecFp8Ref r = {transposed ? F->wqt : F->wq, exec_fp8_desc(F, w->rows, w->cols, 1, 0)};
    if (transposed)
        r.f = exec_fp8_desc(F, w->cols, w->rows, 1, 0);
    cast_group(F, c, w, g, (void *)r.q, transposed, rec);
    return r;
}

/* weight_copy's, or a gathered MXFP8 weight's copy with its scales (mx_use). */
static WeightOp weight_use(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, int g,
                           int transposed, int rec)
{
    if (w->mxs) /* MXFP8 gathered in its two copies */
        return mx_use(F, w, g, transposed);
    const WeightOp o = {weight_copy(F, c, w, g, transposed, rec), NULL};
    return o;
}

void exec_fp8_linear_fwd(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *y, ExecFp8Ref x,
                         const ExecFp8Weight *w, int g, int N, int rec)
{
    weight_mm(c, M, y, c->act, x, weight_use(F, c, w, g, 0, rec), N, w->rows, w->cols, 0, 1,
              0.0f);
}

ExecFp8Ref exec_fp8_weight_rows(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, int row0,
                                int rows)
{
    const WeightOp use = weight_use(F, c, w, 0, 0, 0);
    const ExecFp8Ref all = use.r;
    const ExecFp8Ref r = {F->q1, exec_fp8_desc(F, rows, w->cols, 1, 0)};
    const size_t cols = (size_t)w->cols, sb = all.f.e8m0 ? 1 : 4;
    const size_t per_row = (cols + (size_t)all.f.block_c - 1) / (size_t)all.f.block_c;
    const size_t first = (size_t)(row0 / all.f.block_r) * per_row;
    const uint8_t *src = all.q;
    c->k->copy(F->q1, src + (size_t)row0 * cols, (size_t)rows * cols);
    const uint8_t *scales = use.s ? (const uint8_t *)use.s : src + (size_t)w->rows * cols;
    c->k->copy((uint8_t *)F->q1 + (size_t)rows * cols, scales + first * sb,
               kern_fp8_scales(&r.f) * sb);
    return r;
}

void exec_fp8_linear_bwd(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *dx, float *dw,
                         const void *dy, ExecFp8Ref x, const void *x_act, const ExecFp8Weight *w,
                         int g, int N)
{
    exec_fp8_linear_bwd_rec(F, c, M, dx, dw, dy, x, x_act, w, g, N, 1);
}

void exec_fp8_linear_bwd_rec(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *dx, float *dw,
                             const void *dy, ExecFp8Ref x, const void *x_act,
                             const ExecFp8Weight *w, int g, int N, int rec)
{
    ExecFp8Dy dyq;
    exec_fp8_linear_dgrad(F, c, M, dx, dy, w, g, N, rec, &dyq);
    exec_fp8_linear_wgrad(F, c, M, dw, &dyq, x, x_act, w, g, N);
}

void exec_fp8_linear_dgrad(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *dx, const void *dy,
                           const ExecFp8Weight *w, int g, int N, int rec, ExecFp8Dy *dyq)
{
    const int O = w->rows, K = w->cols;
    dyq->row = exec_fp8_quantize(F, c, F->q0, dy, N, O, 0, EXEC_FP8_DY, w, g, rec);
    dyq->col.q = NULL;
    if (F->wt) {
        dyq->col = exec_fp8_quantize(F, c, F->q1, dy, O, N, 1, EXEC_FP8_DY, w, g, 0);
        /* a gathered MXFP8 column-wise copy has the weight's shape: read untransposed */
        weight_mm(c, M, dx, c->act, dyq->row, weight_use(F, c, w, g, 1, 0), N, K, O, 0,
                  w->mxs ? 0 : 1, 0.0f);
    } else {
        weight_mm(c, M, dx, c->act, dyq->row, weight_use(F, c, w, g, 0, 0), N, K, O, 0, 0, 0.0f);
    }
}

void exec_fp8_linear_wgrad(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, float *dw,
                           const ExecFp8Dy *dyq, ExecFp8Ref x, const void *x_act,
                           const ExecFp8Weight *w, int g, int N)
{
    const int O = w->rows, K = w->cols;
    if (x_act)
        x = exec_fp8_quantize(F, c, F->wt ? F->q0 : F->q1, x_act, N, K, 0, EXEC_FP8_X, w, g, 0);
    /* the weight gradient accumulated in its dtype (fp32, or 16-bit: training.grad_dtype) */
    if (F->wt)
        exec_fp8_mm(c, M, dw, c->grad, dyq->col, x, O, K, N, 0, 0, 1.0f);
    else
        exec_fp8_mm(c, M, dw, c->grad, dyq->row, x, O, K, N, 1, 0, 1.0f);
}
