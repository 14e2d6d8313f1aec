/* FP8 training on the CPU executor (docs/fp8.md, "The executor"):
 * - the weights' FP8 copies hold real one-byte codes with each recipe's scaling, recomputed
 *   here from the recipe's definition over the weight's fp32 values: per tensor (amax / 448),
 *   128 x 128 blocks, OCP MX 1 x 32 blocks with E8M0 powers of two (and the transposed copy
 *   MXFP8 keeps), delayed scaling's decode factor from the amax history;
 * - output gradients are quantized as E5M2 in the hybrid format and E4M3 in the e4m3 one;
 * - delayed scaling keeps one history entry per micro-batch for a GEMM's input and output
 *   gradient, one per cast for its weight;
 * - the arenas hold the one-byte tensors: tiny's activations, by hand, 4 x 757,772 + 393,216
 *   bytes with FP8 GEMM inputs against 4 x 1,052,672 + 393,216 without; ws.fp8's parts by hand,
 *   ZeRO-3's per-use weight casts included;
 * - multi-head latent attention's four projections (tiny-dsv3, dense) run as FP8 GEMMs: under
 *   delayed scaling one step of 2 micro-batches fills the newest entries of each one's input,
 *   weight and output gradient histories (two at most), but for kv_a's input, which q_a's
 *   quantization serves (one saved copy); and the loss moves off the fp32 one;
 * - a prediction module's transformer layer runs its four GEMMs in FP8 (their histories fill
 *   as the model's layers' do);
 * - --fp8-dispatch under delayed scaling: the dispatched rows' history column, one entry per
 *   forward, none per recompute;
 * - Qwen2-MoE's shared-expert gate beside FP8 shared experts: their first-step gradients and
 *   the gate's follow fp32's;
 * - `curves MODEL`: 120 steps of tiny or tiny-moe (the router's own choice) in FP8 follow the
 *   fp32 run (the CPU's reference precision; bf16 on a GPU) within 1% at every step and 0.5%
 *   over the last 20 (tiny-moe, whose router may choose differently on FP8 outputs: 2% and
 *   1%), for every recipe, and differ from it (the GEMMs really ran on FP8 values).
 * Usage: test_exec_fp8 [curves tiny|tiny-moe] */
#include "exec/train/internal.h"
#include "tests/test_exec_common.h"

static ModelSpec fp8_spec(ModelFp8Recipe r, ModelFp8Format fmt)
{
    ModelSpec s = tx_spec("tiny", 64, 8, 4);
    s.job.fp8 = r;
    s.job.fp8_format = fmt;
    return s;
}

static float e8m0_scale(float amax)
{
    int e;
    if (amax == 0.0f)
        return 1.0f; /* an all-zero block */
    frexpf(amax, &e);
    return ldexpf(1.0f, e - 1 - 8); /* 2^(floor(log2 amax) - emax), emax 8 for E4M3 */
}

static float f32_at(const uint8_t *p)
{
    float f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* The codes of q ([rows, cols] then its scales, block br x bc) against x ([rows, cols] with row
 * stride xr and column stride xc), each block scaled by what `rule` gives its amax (E8M0: the
 * scale is stored as a biased exponent byte). */
static void check_codes(const uint8_t *q, const float *x, int rows, int cols, size_t xr, size_t xc,
                        int br, int bc, int e8m0, float fixed_scale, int e5m2)
{
    const int nbc = (cols + bc - 1) / bc;
    const uint8_t *scales = q + (size_t)rows * cols;
    for (int r0 = 0; r0 < rows; r0 += br)
        for (int c0 = 0; c0 < cols; c0 += bc) {
            float amax = 0;
            for (int r = r0; r < r0 + br && r < rows; r++)
                for (int c = c0; c < c0 + bc && c < cols; c++)
                    amax = fmaxf(amax, fabsf(x[r * xr + c * xc]));
            const size_t b = (size_t)(r0 / br) * nbc + (size_t)(c0 / bc);
            float s;
            if (e8m0) {
                s = e8m0_scale(amax);
                int e;
                frexpf(s, &e);
                CHECK_EQ_INT(e - 1 + 127, scales[b]);
            } else {
                s = fixed_scale > 0 ? fixed_scale : amax / (e5m2 ? 57344.0f : 448.0f);
                CHECK(f32_at(scales + 4 * b) == s);
            }
            for (int r = r0; r < r0 + br && r < rows; r++)
                for (int c = c0; c < c0 + bc && c < cols; c++) {
                    const float v = x[r * xr + c * xc] / s;
                    CHECK_EQ_INT(e5m2 ? px_float_to_e5m2(v) : px_float_to_e4m3(v),
                                 q[(size_t)r * cols + c]);
                }
        }
}

/* Every recipe's copy of layer 0's QKV weight ([192, 64] on tiny) after exec_init's cast. */
static void weights_per_recipe(void)
{
    const ModelFp8Recipe rs[] = {MODEL_FP8_TENSORWISE, MODEL_FP8_BLOCKWISE, MODEL_FP8_MXFP8,
                                 MODEL_FP8_DELAYED};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        ModelSpec s = fp8_spec(rs[i], MODEL_FP8_HYBRID);
        Exec *ex = tx_exec(&s);
        const ExecFp8Weight *w = exec_fp8_weight(&ex->fp8, MODEL_TR_QKV_W, 0);
        CHECK(w != NULL && w->q != NULL);
        CHECK_EQ_INT(192, w->rows);
        CHECK_EQ_INT(64, w->cols);
        const float *x = w->p->w;
        switch (rs[i]) {
        case MODEL_FP8_TENSORWISE: check_codes(w->q, x, 192, 64, 64, 1, 192, 64, 0, 0, 0); break;
        case MODEL_FP8_BLOCKWISE: check_codes(w->q, x, 192, 64, 64, 1, 128, 128, 0, 0, 0); break;
        case MODEL_FP8_MXFP8:
            check_codes(w->q, x, 192, 64, 64, 1, 1, 32, 1, 0, 0);
            /* the transposed copy: [64, 192], its 1 x 32 blocks along the weight's rows */
            CHECK(w->qt != NULL);
            check_codes(w->qt, x, 64, 192, 1, 64, 1, 32, 1, 0, 0);
            break;
        default: {
            /* delayed: the first cast quantizes with the initial decode factor 1, then the
             * weight's amax enters its history and gives the next factor */
            check_codes(w->q, x, 192, 64, 64, 1, 192, 64, 0, 1.0f, 0);
            float amax = 0;
            for (int k = 0; k < 192 * 64; k++)
                amax = fmaxf(amax, fabsf(x[k]));
            const int len = ex->fp8.len;
            CHECK_EQ_INT(1024, len);
            CHECK(w->hist[EXEC_FP8_W * len] == amax);
            CHECK(w->hist[EXEC_FP8_W * len + 1] == 0.0f);
            CHECK(w->scale[EXEC_FP8_W] == amax / 448.0f);
            CHECK(w->scale[EXEC_FP8_X] == 1.0f && w->scale[EXEC_FP8_DY] == 1.0f);
            /* one step of 2 micro-batches: two entries for the input and the output gradient,
             * one more for the weight (its cast after the update) */
            ExecStepStats st;
            PxError err = {0};
            CHECK_OK(exec_step(ex, 0, &st, &err), err);
            for (int c = 0; c < 3; c++) {
                const float *h = w->hist + (size_t)c * len;
                CHECK(h[0] > 0 && h[1] > 0 && h[2] == 0.0f);
                float most = fmaxf(h[0], h[1]);
                CHECK(w->scale[c] == most / 448.0f || (c == EXEC_FP8_DY && w->scale[c] == most / 57344.0f));
            }
            CHECK(w->hist[EXEC_FP8_W * len + 1] == amax);
            /* the copy after the update was cast with the factor of the weight's first amax */
            check_codes(w->q, x, 192, 64, 64, 1, 192, 64, 0, amax / 448.0f, 0);
            break;
        }
        }
        printf("  %-10s layer.0.attn.qkv.w.fp8: 12,288 codes and their scales as the recipe "
               "defines them\n",
               model_fp8_recipe_name(rs[i]));
        exec_free(ex);
    }
}

/* The last FP8 GEMM of a backward (layer 0's QKV) leaves its output gradient's codes in ws.fp8:
 * E5M2 scaled by amax / 57344 in the hybrid format, E4M3 by amax / 448 in the e4m3 one. */
static void gradient_format(void)
{
    for (int f = 0; f < 2; f++) {
        ModelSpec s = fp8_spec(MODEL_FP8_TENSORWISE, f ? MODEL_FP8_E4M3 : MODEL_FP8_HYBRID);
        Exec *ex = tx_exec(&s);
        double loss;
        PxError err = {0};
        CHECK_OK(exec_grads(ex, 0, &loss, &err), err);
        const int N = 4 * 64, O = 192;
        check_codes(ex->fp8.q0, (const float *)ex->work.dqkv, N, O, O, 1, N, O, 0, 0, !f);
        printf("  %-6s format: the QKV output gradient as %d %s codes\n", f ? "e4m3" : "hybrid",
               N * O, f ? "E4M3" : "E5M2");
        exec_free(ex);
    }
}

/* The arenas against the table and against tiny's figures by hand (docs/memory.md's terms;
 * flash attention, no dropout, 1 micro-batch of 4 x 64 tokens alive on one stage). */
static void memory(void)
{
    ModelSpec s = fp8_spec(MODEL_FP8_TENSORWISE, MODEL_FP8_HYBRID);
    Exec *ex = tx_exec(&s);
    /* per layer: ln1.in 65,536, attn.qkv.in 16,384 + 4, attn.qkv.out 196,608, attn.lse 4,096,
     * attn.proj.in 65,536 (the core's output in fp32: the projection quantizes it again for its
     * weight gradient), ln2.in 65,536, mlp.fc1.in 16,388, mlp.act.in 262,144, mlp.fc2.in
     * 65,536 + 4; the output layer's final_ln.in, logits.in 65,536 each and loss.probs 262,144 */
    CHECK_EQ_U64(4u * 757772u + 393216u, ex->mem.a[MODEL_ACTIVATIONS].cap);
    /* the weights: tiny's 220,544 fp32 parameters (GPT-2 style, 4 layers of 64) and per layer
     * four FP8 copies of 12,288 + 4,096 + 16,384 + 16,384 codes with a 4-byte scale each */
    CHECK_EQ_U64(4u * 220544u + 4u * (49152u + 16u), ex->mem.a[MODEL_WEIGHTS].cap);
    for (int k = 0; k < MODEL_RUNTIME; k++)
        CHECK_EQ_U64(model_tensors_bytes(&ex->tt, (ModelCategory)k), ex->mem.a[k].cap);
    exec_free(ex);
    /* delayed scaling: the projection saves its FP8 copy (16,388) beside the core's output */
    s = fp8_spec(MODEL_FP8_DELAYED, MODEL_FP8_HYBRID);
    ex = tx_exec(&s);
    CHECK_EQ_U64(4u * (757772u + 16388u) + 393216u, ex->mem.a[MODEL_ACTIVATIONS].cap);
    exec_free(ex);
    ModelSpec b = tx_spec("tiny", 64, 8, 4);
    ex = tx_exec(&b);
    CHECK_EQ_U64(4u * 1052672u + 393216u, ex->mem.a[MODEL_ACTIVATIONS].cap);
    CHECK_EQ_U64(4u * 220544u, ex->mem.a[MODEL_WEIGHTS].cap);
    exec_free(ex);
    printf("  tiny: activations 3,424,304 bytes in FP8 (3,489,856 delayed) against 4,603,904 in "
           "fp32; weights 882,176 + 196,672 of FP8 copies\n");
}

/* ws.fp8's parts for tiny (mbs 4 x seq 64 = 256 rows), by hand: 16 bytes of scratch; the act
 * part, the largest operand in fp32, 256 x 256 x 4 = 262,144; two FP8 copies of the largest
 * operand. tensorwise: 65,536 codes + one 4-byte scale = 65,540, padded to 65,552; mxfp8 (1 x 32
 * E8M0 blocks, transposed copies, so the larger orientation counts): 65,536 + 256 x 8 = 67,584.
 * ZeRO-3 adds room for the largest weight cast per use: tensorwise fc1 [256, 64] 16,388 -> 16,400;
 * mxfp8 16,384 + 256 x 2 = 16,896, and as much again for its transpose. The executor carves
 * exactly these, or ws.fp8's binding fails. */
static void workspace(void)
{
    const struct {
        ModelFp8Recipe r;
        int zero;
        uint64_t q, w, wt, total;
    } cases[] = {
        {MODEL_FP8_TENSORWISE, 0, 65540, 0, 0, 16 + 262144 + 2 * 65552},
        {MODEL_FP8_TENSORWISE, 3, 65540, 16388, 0, 16 + 262144 + 2 * 65552 + 16400},
        {MODEL_FP8_MXFP8, 3, 67584, 16896, 16896, 16 + 262144 + 2 * 67584 + 2 * 16896},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ModelSpec s = fp8_spec(cases[i].r, MODEL_FP8_HYBRID);
        s.layout.zero = cases[i].zero;
        s.layout.dp = 1;
        ModelDims d;
        PxError err = {0};
        CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
        ModelFp8Workspace w;
        model_fp8_workspace(&s, &d, &w);
        CHECK_EQ_U64(262144, w.act_bytes);
        CHECK_EQ_U64(cases[i].q, w.q_bytes);
        CHECK_EQ_U64(cases[i].w, w.w_bytes);
        CHECK_EQ_U64(cases[i].wt, w.wt_bytes);
        CHECK_EQ_U64(cases[i].total, w.total);
        CHECK_EQ_U64(w.total, model_fp8_workspace_bytes(&s, &d));
        Exec *ex = tx_exec(&s); /* binds ws.fp8 part by part, and trains a step */
        ExecStepStats st;
        CHECK_OK(exec_step(ex, 0, &st, &err), err);
        CHECK(isfinite(st.loss));
        exec_free(ex);
    }
    printf("  ws.fp8: 393,264 bytes (tensorwise), 409,664 with ZeRO-3, 431,120 (mxfp8, ZeRO-3)\n");
}

enum { CURVE_STEPS = 120 };

static void curve(const ModelSpec *s, double *loss)
{
    ModelSpec t = *s;
    t.job.steps = CURVE_STEPS;
    Exec *ex = tx_exec(&t);
    for (int i = 0; i < CURVE_STEPS; i++) {
        ExecStepStats st;
        PxError err = {0};
        CHECK_OK(exec_step(ex, i, &st, &err), err);
        loss[i] = st.loss;
    }
    exec_free(ex);
}

static void curves(const char *model)
{
    static double ref[CURVE_STEPS], got[CURVE_STEPS];
    ModelSpec b = tx_spec(model, 64, 8, 4);
    /* a MoE model's router chooses on FP8 outputs too: a token whose two best experts are
     * nearly tied may go elsewhere, which moves a step's loss further than the GEMMs alone */
    const int moe = b.model.moe.experts > 0;
    const double step_tol = moe ? 0.02 : 0.01, mean_tol = moe ? 0.01 : 0.005;
    curve(&b, ref);
    printf("  %-10s recipe       loss@1    loss@%d  fp32@%d  max |rel diff|  last-20 mean diff\n",
           model, CURVE_STEPS, CURVE_STEPS);
    for (int r = MODEL_FP8_DELAYED; r <= MODEL_FP8_MXFP8; r++) {
        ModelSpec s = b;
        s.job.fp8 = (ModelFp8Recipe)r;
        curve(&s, got);
        double worst = 0, m_ref = 0, m_got = 0;
        for (int i = 0; i < CURVE_STEPS; i++) {
            worst = fmax(worst, fabs(got[i] - ref[i]) / ref[i]);
            if (i >= CURVE_STEPS - 20) {
                m_ref += ref[i] / 20;
                m_got += got[i] / 20;
            }
        }
        printf("  %-10s %-10s  %8.4f  %8.4f  %8.4f  %12.2e  %+14.3f%%\n", "",
               model_fp8_recipe_name((ModelFp8Recipe)r),
               got[0], got[CURVE_STEPS - 1], ref[CURVE_STEPS - 1], worst, 100 * (m_got - m_ref) / m_ref);
        CHECK(worst <= step_tol);
        CHECK(fabs(m_got - m_ref) <= mean_tol * m_ref);
        CHECK(worst >= 1e-4); /* the FP8 GEMMs changed the numbers */
        CHECK(got[CURVE_STEPS - 1] < 0.5 * got[0]); /* and it learned */
    }
}

/* Multi-head latent attention's projections on FP8 (exec/train/mla.c): their histories. */
static void mla_gemms(void)
{
    double loss[2];
    for (int f = 0; f < 2; f++) {
        ModelSpec s = tx_spec("tiny-dsv3", 64, 8, 4);
        s.model.moe.experts = 0;
        s.model.mtp_layers = 0;
        s.job.fp8 = f ? MODEL_FP8_DELAYED : MODEL_FP8_NONE;
        s.job.fp8_amax_history = 16;
        Exec *ex = tx_exec(&s);
        ExecStepStats st;
        PxError err = {0};
        CHECK_OK(exec_step(ex, 0, &st, &err), err);
        loss[f] = st.loss;
        static const ModelTensorRole roles[] = {MODEL_TR_Q_A_W, MODEL_TR_KV_A_W, MODEL_TR_Q_B_W,
                                                MODEL_TR_KV_B_W};
        for (int i = 0; f && i < 4; i++) {
            const ExecFp8Weight *w = exec_fp8_weight(&ex->fp8, roles[i], 1);
            CHECK(w != NULL && w->q != NULL);
            const int len = ex->fp8.len;
            for (int c = 0; c < 3; c++) {
                /* newest first; an entry may be 0 where the first micro-batch's gradient
                 * underflowed at the initial decode factor 1 (a q latent's is ~1e-6) */
                const float *h = w->hist + (size_t)c * len;
                const int none = roles[i] == MODEL_TR_KV_A_W && c == EXEC_FP8_X;
                if ((h[0] > 0) == none || h[1] < 0 || h[2] != 0 || (none && h[1] != 0)) {
                    fprintf(stderr, "FAILED: %s's history %d: %g %g %g\n", w->p->name, c, h[0],
                            h[1], h[2]);
                    exit(1);
                }
            }
        }
        exec_free(ex);
    }
    printf("  tiny-dsv3 (dense) delayed: q_a, kv_a, q_b, kv_b on FP8; loss %.6f (fp32 %.6f)\n",
           loss[1], loss[0]);
    CHECK(fabs(loss[1] - loss[0]) > 1e-6);
}

/* Multi-head latent attention without a query latent (q_lora_rank 0, DeepSeek-V2-Lite's
 * shape) and with a latent wider than the hidden size and the queries (kv_lora_rank 112 >
 * 96): one micro-batch's gradients on FP8 against fp32's, tensor by tensor. q_b reads the
 * layer's normed input, its input gradient and kv_a's add in ws.dhid, and kv_b's latent
 * gradient has ws.mla's region of its own; a term lost or a buffer overrun shows in the norms'
 * and the embedding's gradients, which every later layer's input gradient feeds. */
/* At initialization attention is nearly uniform and the queries barely move the loss:
 * sharpen it (test_exec_grad's factor 8 on the up-projections, or on a, b: the weights named
 * ".attn.<a>.w", ".attn.<b>.w"), the FP8 copies cast again. */
static void sharpen_as(Exec *ex, const char *a, const char *b)
{
    const ModelTensorTable *tt = exec_table(ex);
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        const char *dot = strstr(t->name, ".attn.");
        if (t->cat != MODEL_WEIGHTS || !dot || (strcmp(dot, a) && strcmp(dot, b)))
            continue;
        float *w = exec_tensor(ex, t->name, NULL);
        CHECK(w != NULL);
        for (uint64_t j = 0; j < t->numel; j++)
            w[j] *= 8.0f;
    }
    exec_fp8_cast(&ex->fp8, &ex->c);
}

static void sharpen(Exec *ex)
{
    sharpen_as(ex, ".attn.q_b.w", ".attn.kv_b.w");
}

#define MLA_Q0_GRAD_TOL 0.5
static void mla_q0_grads(void)
{
    ModelSpec s = tx_spec("tiny-dsv3", 32, 4, 4);
    s.model.moe.experts = 0;
    s.model.mtp_layers = 0;
    s.model.mla.q_lora_rank = 0;
    s.model.mla.kv_lora_rank = 112;
    Exec *ref = tx_exec(&s);
    PxError err = {0};
    double l32 = 0;
    sharpen(ref);
    CHECK_OK(exec_grads(ref, 0, &l32, &err), err);
    const ModelTensorTable *tt = exec_table(ref);
    static const ModelFp8Recipe recipes[] = {MODEL_FP8_TENSORWISE, MODEL_FP8_BLOCKWISE};
    for (int r = 0; r < 2; r++) {
        ModelSpec f = s;
        f.job.fp8 = recipes[r];
        Exec *ex = tx_exec(&f);
        double l8 = 0, worst = 0;
        const char *at = "";
        sharpen(ex);
        CHECK_OK(exec_grads(ex, 0, &l8, &err), err);
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (t->cat != MODEL_WEIGHTS)
                continue;
            char gname[72];
            snprintf(gname, sizeof gname, "%s.grad", t->name);
            uint64_t n = 0, n8 = 0;
            const float *a = exec_tensor(ref, gname, &n), *b = exec_tensor(ex, gname, &n8);
            CHECK(a != NULL && b != NULL && n == n8);
            double num = 0, den = 0;
            for (uint64_t j = 0; j < n; j++) {
                num += ((double)b[j] - a[j]) * ((double)b[j] - a[j]);
                den += (double)a[j] * a[j];
            }
            const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
            if (rel > worst)
                worst = rel, at = t->name;
        }
        printf("  tiny-dsv3 (dense) q_lora_rank 0, kv_lora_rank 112, %s: loss %.6f (fp32 %.6f), "
               "gradients within %.3f of fp32's (relative L2, worst %s)\n",
               model_fp8_recipe_name(recipes[r]), l8, l32, worst, at);
        CHECK(fabs(l8 - l32) > 1e-6 && fabs(l8 - l32) < 1e-2 * l32);
        CHECK(worst < MLA_Q0_GRAD_TOL);
        exec_free(ex);
    }
    exec_free(ref);
}

/* A prediction module's transformer layer (model layer `layers`) runs its GEMMs in FP8 as the
 * model's do, found in the trainer's FP8 table by its layer: under delayed scaling one step of
 * 2 micro-batches fills the newest two entries of each of its GEMMs' input and output gradient
 * histories, and of its weights' (the start's cast and the update's). */
static void mtp_gemms(void)
{
    ModelSpec s = tx_spec("tiny", 64, 8, 4);
    s.model.mtp_layers = 1;
    s.job.fp8 = MODEL_FP8_DELAYED;
    s.job.fp8_amax_history = 16;
    Exec *ex = tx_exec(&s);
    ExecStepStats st;
    PxError err = {0};
    CHECK_OK(exec_step(ex, 0, &st, &err), err);
    static const ModelTensorRole roles[] = {MODEL_TR_QKV_W, MODEL_TR_PROJ_W, MODEL_TR_FC1_W,
                                            MODEL_TR_FC2_W};
    const int L = s.model.layers, len = ex->fp8.len;
    for (int i = 0; i < 4; i++) {
        const ExecFp8Weight *w = exec_fp8_weight(&ex->fp8, roles[i], L);
        CHECK(w != NULL && w->q != NULL && w->p->layer == L);
        for (int c = 0; c < 3; c++) {
            const float *h = w->hist + (size_t)c * len;
            if (!(h[0] > 0) || !(h[1] > 0) || h[2] != 0) {
                fprintf(stderr, "FAILED: %s's history %d: %g %g %g\n", w->p->name, c, h[0], h[1],
                        h[2]);
                exit(1);
            }
        }
    }
    printf("  tiny with a prediction module, delayed: its layer's 4 GEMMs on FP8; loss %.6f, "
           "modules' loss %.6f\n",
           st.loss, st.mtp_loss);
    exec_free(ex);
}

/* --fp8-dispatch under delayed scaling (exec_fp8_dispatch_quantize): the plan gives the
 * experts' fc1 history one more column on an expert-parallel layout only, and the dispatched
 * rows quantize with that column's decode factor, a forward rolling their amax into it and a
 * recompute not, a rank that sends no rows recording 0; the experts' own columns untouched. */
static void dispatch_history(void)
{
    ModelSpec s = tx_spec("tiny-moe", 64, 8, 4);
    s.job.fp8 = MODEL_FP8_DELAYED;
    s.job.fp8_dispatch = 1;
    ModelSpec one = s;
    s.layout.dp = s.layout.ep = 2;
    ModelDims d;
    PxError err = {0};
    CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
    CHECK_EQ_INT(1, model_fp8_dispatch_history(&s, &d));
    CHECK_OK(model_spec_check(&one, 1, &d, &err), err);
    CHECK_EQ_INT(0, model_fp8_dispatch_history(&one, &d));

    enum { LEN = 4, COLS = 4, ROWS = 2, W = 32 };
    static ExecCtx c;
    c.k = kern_cpu();
    ExecFp8 F = {0};
    F.recipe = MODEL_FP8_DELAYED;
    F.len = LEN;
    float af[3] = {0.0f, 448.0f, 57344.0f}; /* the amax scratch, then E4M3's and E5M2's */
    F.amax = af;
    F.fmax = af + 1;
    float hist[(LEN + 1) * COLS] = {0};
    ExecFp8Weight w = {0};
    w.groups = 1;
    w.hist_cols = COLS;
    w.hist = hist;
    w.scale = hist + LEN * COLS;
    for (int i = 0; i < COLS; i++)
        w.scale[i] = 1.0f;
    float x[ROWS * W];
    for (int i = 0; i < ROWS * W; i++)
        x[i] = (float)(i % 7 - 3) * 0.5f; /* amax 1.5 */
    uint8_t q[ROWS * W + 4];
    /* a forward: the initial factor 1 travels, then 1.5 enters the history */
    exec_fp8_dispatch_quantize(&F, &c, &w, q, x, ROWS, W, 1);
    CHECK(f32_at(q + ROWS * W) == 1.0f);
    for (int i = 0; i < ROWS * W; i++)
        CHECK_EQ_INT(px_float_to_e4m3(x[i]), q[i]);
    CHECK(hist[3 * LEN] == 1.5f && hist[3 * LEN + 1] == 0.0f);
    CHECK(w.scale[3] == 1.5f / 448.0f);
    /* a recompute: the factor 1.5 / 448 travels, nothing recorded */
    exec_fp8_dispatch_quantize(&F, &c, &w, q, x, ROWS, W, 0);
    CHECK(f32_at(q + ROWS * W) == 1.5f / 448.0f);
    CHECK_EQ_INT(px_float_to_e4m3(x[1] / (1.5f / 448.0f)), q[1]);
    CHECK(hist[3 * LEN] == 1.5f && hist[3 * LEN + 1] == 0.0f);
    /* no rows: a zero scale, and an amax of 0 rolled in (the factor keeps the window's 1.5) */
    exec_fp8_dispatch_quantize(&F, &c, &w, q, x, 0, W, 1);
    CHECK(f32_at(q) == 0.0f);
    CHECK(hist[3 * LEN] == 0.0f && hist[3 * LEN + 1] == 1.5f);
    CHECK(w.scale[3] == 1.5f / 448.0f);
    for (int i = 0; i < 3 * LEN; i++)
        CHECK(hist[i] == 0.0f);
    for (int i = 0; i < 3; i++)
        CHECK(w.scale[i] == 1.0f);
    printf("  delayed --fp8-dispatch: the rows' own history column, one entry per forward\n");
}

/* The relative L2 distance of the gradient `name` of b from a's. */
static double grad_distance(Exec *a, Exec *b, const char *name)
{
    uint64_t na = 0, nb = 0;
    const float *ga = exec_tensor(a, name, &na), *gb = exec_tensor(b, name, &nb);
    if (!ga || !gb || na != nb) {
        fprintf(stderr, "FAILED: gradient %s missing\n", name);
        exit(1);
    }
    double d2 = 0, r2 = 0;
    for (uint64_t e = 0; e < na; e++) {
        d2 += ((double)gb[e] - ga[e]) * ((double)gb[e] - ga[e]);
        r2 += (double)ga[e] * ga[e];
    }
    return sqrt(d2 / (r2 > 0 ? r2 : 1));
}

/* Qwen2-MoE's shared-expert gate under FP8 (tiny-moe, its MoE layer 1, forced routing): the
 * shared experts' fc1 and fc2 in FP8, the gate's product in fp32, fc2's backward split around
 * the gate's (layers.c, fp8_gate_bwd). The first step's gradients of the shared experts and of
 * the gate follow the fp32 run's within FP8's rounding, SwiGLU and GeLU, per-tensor and
 * blockwise scales, and differ from them (FP8 ran): measured 5.1e-2 ... 7.0e-2 (L2, relative)
 * for fc1 and fc2, as without the gate (5.3e-2 ... 7.4e-2: E5M2 output gradients), and 6.4e-2
 * ... 9.9e-2 for the gate's weight; so within 0.15. A gate left out of fc2's input gradient,
 * of its weight gradient, or the logit's gradient dropped is off by order 1 (g is about 1/2). */
static void shared_gate_gradients(void)
{
    static const char *const names[] = {"layer.1.mlp.fc1.w.grad", "layer.1.mlp.fc2.w.grad",
                                        "layer.1.moe.shared_gate.w.grad"};
    static const ModelFp8Recipe recipes[] = {MODEL_FP8_TENSORWISE, MODEL_FP8_BLOCKWISE};
    double worst = 0;
    for (int gelu = 0; gelu < 2; gelu++)
        for (int ri = 0; ri < 2; ri++) {
            Exec *ex[2];
            for (int f = 0; f < 2; f++) {
                ModelSpec s = tx_spec("tiny-moe", 32, 4, 4);
                s.model.moe.shared_gate = 1;
                s.model.mlp = gelu ? MODEL_GELU : MODEL_SWIGLU;
                s.job.moe_force_balance = 1;
                s.job.fp8 = f ? recipes[ri] : MODEL_FP8_NONE;
                ex[f] = tx_exec(&s);
                double loss;
                PxError err = {0};
                CHECK_OK(exec_grads(ex[f], 0, &loss, &err), err);
            }
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
                const double d = grad_distance(ex[0], ex[1], names[i]);
                if (!(d <= 0.15 && d > 0)) {
                    fprintf(stderr, "FAILED: %s %s: %s differs from fp32's by %.3e (L2, relative)\n",
                            gelu ? "gelu" : "swiglu", model_fp8_recipe_name(recipes[ri]), names[i],
                            d);
                    exit(1);
                }
                worst = d > worst ? d : worst;
            }
            exec_free(ex[0]);
            exec_free(ex[1]);
        }
    printf("  tiny-moe with the shared gate (SwiGLU, GeLU; tensorwise, blockwise): the shared "
           "experts' and the gate's first gradients within %.2e of fp32's\n", worst);
}

/* The largest relative L2 distance of b's gradients of every layer's attention weights
 * (attn.*.w: MLA's q_a, q_b, kv_a, kv_b and the projection) from a's; *at names it. */
static double attn_grads_distance(Exec *a, Exec *b, const char **at)
{
    const ModelTensorTable *tt = exec_table(a);
    double worst = 0;
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        const size_t n = strlen(t->name);
        if (t->cat != MODEL_WEIGHTS || !strstr(t->name, ".attn.") || n < 2 ||
            strcmp(t->name + n - 2, ".w"))
            continue;
        char g[80];
        snprintf(g, sizeof g, "%s.grad", t->name);
        const double d = grad_distance(a, b, g);
        if (d > worst)
            worst = d, *at = t->name;
    }
    return worst;
}

/* FP8 attention with multi-head latent attention (--fp8-attention, the fused core; mla.c
 * writes Q, K, V into ws.fp8's act part, kv_b's output through ws.dqkv) on tiny-dsv3's dense
 * layers, 2 micro-batches of 2 x 32 rows, q_b's and kv_b's weights sharpened 8 times (else
 * attention is nearly uniform). Tensorwise: the loss differs from the FP8-GEMMs-only run's
 * (the core read the FP8 values) and the first step's gradients of every attention weight
 * follow fp32's: measured MLA_ATTN_TENSOR_MEASURED against MLA_ATTN_GEMM_MEASURED with FP8
 * GEMMs alone; within MLA_ATTN_GRAD_TOL, and off the FP8-GEMMs-only run's. Delayed (against
 * the delayed FP8-GEMMs-only run, as fp8_attention_delayed: both start from factors of 1):
 * kv_b's <w>.fp8_amax holds the core's three histories after its GEMM's three, two entries
 * each, and each factor is its window's largest over the format's largest value. Every
 * category of memory as the table says. */
#define MLA_ATTN_GRAD_TOL 0.4
static void mla_fp8_attention(void)
{
    enum { LEN = 4, COLS = 6 };
    static const ModelFp8Recipe recipes[] = {MODEL_FP8_NONE, MODEL_FP8_TENSORWISE,
                                             MODEL_FP8_TENSORWISE, MODEL_FP8_DELAYED,
                                             MODEL_FP8_DELAYED};
    Exec *ex[5];
    double loss[5];
    for (int f = 0; f < 5; f++) {
        ModelSpec s = tx_spec("tiny-dsv3", 32, 4, 2);
        s.model.moe.experts = 0;
        s.model.mtp_layers = 0;
        s.job.fp8 = recipes[f];
        s.job.fp8_format = MODEL_FP8_HYBRID; /* E5M2 output gradients */
        s.job.fp8_attention = f == 2 || f == 4;
        s.job.fp8_amax_history = LEN;
        ex[f] = tx_exec(&s);
        sharpen(ex[f]);
        PxError err = {0};
        CHECK_OK(exec_grads(ex[f], 0, &loss[f], &err), err);
        for (int k = 0; k < MODEL_RUNTIME; k++)
            CHECK_EQ_U64(model_tensors_bytes(&ex[f]->tt, (ModelCategory)k), ex[f]->mem.a[k].cap);
    }
    CHECK(loss[2] != loss[1] && loss[4] != loss[3]);
    const char *at = "", *at_gemm = "", *at_delayed = "", *at_off = "";
    const double d = attn_grads_distance(ex[0], ex[2], &at);
    const double g = attn_grads_distance(ex[0], ex[1], &at_gemm);
    const double off = attn_grads_distance(ex[1], ex[2], &at_off);
    const double dd = attn_grads_distance(ex[3], ex[4], &at_delayed);
    printf("  tiny-dsv3 (dense) with FP8 attention: tensorwise loss %.6f (FP8 GEMMs alone %.6f, "
           "fp32 %.6f), the attention weights' first gradients within %.3e of fp32's (%s; "
           "%.3e with FP8 GEMMs alone, %s), %.3e off FP8 GEMMs alone's; delayed loss %.6f "
           "(FP8 GEMMs alone %.6f), gradients within %.3e of FP8 GEMMs alone's (%s)\n",
           loss[2], loss[1], loss[0], d, at, g, at_gemm, off, loss[4], loss[3], dd, at_delayed);
    if (!(d <= MLA_ATTN_GRAD_TOL && off > 0 && dd <= MLA_ATTN_GRAD_TOL && dd > 0)) {
        fprintf(stderr, "FAILED: MLA with FP8 attention: gradients %.3e from fp32's (%s), %.3e "
                "from FP8 GEMMs alone (%s); delayed %.3e (%s)\n", d, at, off, at_off, dd,
                at_delayed);
        exit(1);
    }
    for (int l = 0; l < 4; l++) {
        /* the core's histories: kv_b's, the QKV weight MLA has none of */
        CHECK(exec_fp8_weight(&ex[4]->fp8, MODEL_TR_QKV_W, l) == NULL);
        const ExecFp8Weight *w = exec_fp8_weight(&ex[4]->fp8, MODEL_TR_KV_B_W, l);
        CHECK(w != NULL && w->hist != NULL);
        CHECK_EQ_INT(COLS, w->hist_cols);
        CHECK_EQ_INT(3, exec_fp8_weight(&ex[3]->fp8, MODEL_TR_KV_B_W, l)->hist_cols);
        for (int col = 3; col < COLS; col++) {
            const float *h = w->hist + col * LEN;
            const float fmax = col == 4 ? 57344.0f : 448.0f;
            CHECK(h[0] > 0.0f && h[1] > 0.0f && h[2] == 0.0f && h[3] == 0.0f);
            CHECK(w->scale[col] == (h[0] > h[1] ? h[0] : h[1]) / fmax);
        }
    }
    for (int f = 0; f < 5; f++)
        exec_free(ex[f]);
}

/* FP8 attention (--fp8-attention, the fused core, tensorwise; docs/fp8.md, "FP8 attention") on
 * tiny (mbs 4 x seq 64 = 256 rows): attn.qkv.out holds Q, K, V [256, 192] in one byte and one
 * fp32 scale, 49,156 bytes instead of 196,608 in fp32: 4 x (757,772 - 147,452) + 393,216
 * activations, every category as the table says. The QKV weights sharpened 8 times (else
 * attention is nearly uniform and Q, K barely matter), the loss differs from the FP8-GEMMs-only
 * run's (the forward's core read the FP8 values), and the first step's gradients of the
 * attention's weights (layers 0 and 3) follow the fp32 run's: measured at worst 0.132 (L2,
 * relative) against 0.117 with FP8 GEMMs alone, and 24.3 with the backward reading ws.fp8's act
 * part undecoded; within 0.25, and off the FP8-GEMMs-only run's. */
static void fp8_attention(void)
{
    static const char *const names[] = {"layer.0.attn.qkv.w.grad", "layer.0.attn.proj.w.grad",
                                        "layer.3.attn.qkv.w.grad", "layer.3.attn.proj.w.grad"};
    Exec *ex[4];
    double loss[4];
    for (int f = 0; f < 4; f++) {
        ModelSpec s = fp8_spec(f ? MODEL_FP8_TENSORWISE : MODEL_FP8_NONE, MODEL_FP8_HYBRID);
        s.job.fp8_attention = f >= 2;
        s.job.flash_attn = f != 3;
        ex[f] = tx_exec(&s);
        sharpen_as(ex[f], ".attn.qkv.w", ".attn.qkv.w");
        PxError err = {0};
        CHECK_OK(exec_grads(ex[f], 0, &loss[f], &err), err);
    }
    CHECK(loss[2] != loss[1]);
    CHECK_EQ_U64(4u * (757772u - 147452u) + 393216u, ex[2]->mem.a[MODEL_ACTIVATIONS].cap);
    for (int f = 2; f < 4; f++)
        for (int k = 0; k < MODEL_RUNTIME; k++)
            CHECK_EQ_U64(model_tensors_bytes(&ex[f]->tt, (ModelCategory)k), ex[f]->mem.a[k].cap);
    /* the unfused core rounds the same Q, K, V and dO with the same scales in place: the fused
     * core's loss but for the cores' own arithmetic, which the FP8 GEMMs after them round on
     * (measured 8.3e-6 relative; 6.9e-5 unrounded, the FP8-GEMMs-only loss), its gradients as
     * close to fp32's */
    CHECK_REL(loss[2], loss[3], 3e-5);
    double worst = 0, worst_gemm = 0, unfused = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const double d = grad_distance(ex[0], ex[2], names[i]), g = grad_distance(ex[0], ex[1], names[i]);
        const double off = grad_distance(ex[1], ex[2], names[i]);
        if (!(d <= 0.25 && off > 0)) {
            fprintf(stderr, "FAILED: %s: %.3e from fp32's (L2, relative), %.3e from FP8 GEMMs "
                    "alone\n", names[i], d, off);
            exit(1);
        }
        worst = d > worst ? d : worst;
        worst_gemm = g > worst_gemm ? g : worst_gemm;
        const double u = grad_distance(ex[0], ex[3], names[i]);
        CHECK(u <= 0.25);
        unfused = u > unfused ? u : unfused;
    }
    printf("  tiny with FP8 attention (tensorwise): loss %.6f (FP8 GEMMs alone %.6f, fp32 %.6f), "
           "the attention's first gradients within %.2e of fp32's (%.2e with FP8 GEMMs alone); "
           "activations 2,834,496 bytes; unfused: loss %.6f, gradients within %.2e of fp32's\n", loss[2], loss[1], loss[0], worst, worst_gemm, loss[3], unfused);
    for (int f = 0; f < 4; f++)
        exec_free(ex[f]);
}

/* Op-level selective recompute under delayed scaling (exec/train/layers.c's sac_recompute):
 * the rerun matmuls and norms quantize the inputs the backward reads with the factors of now
 * and record nothing, so that after a step of 2 micro-batches each FP8 GEMM's input history
 * holds 2 entries, bit for bit those of the same step without recompute (the forwards are the
 * same); a recompute that recorded would add 2 more where a matmul reruns or a norm's or the
 * activation's output is quantized again (wk's QKV, wo, w3's fc1, and fc2 by the activation). */
static void sac_history(void)
{
    enum { LEN = 16 };
    static const ModelTensorRole roles[] = {MODEL_TR_QKV_W, MODEL_TR_PROJ_W, MODEL_TR_FC1_W,
                                            MODEL_TR_FC2_W};
    float hist[2][4][LEN];
    for (int op = 0; op < 2; op++) {
        ModelSpec s = tx_spec("tiny-llama", 16, 4, 2);
        s.job.fp8 = MODEL_FP8_DELAYED;
        s.job.fp8_amax_history = LEN;
        if (op) {
            s.job.framework = MODEL_FW_TORCHTITAN;
            s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
        }
        Exec *ex = tx_exec(&s);
        CHECK(ex->c.d.recompute_op == op && ex->fp8.len == LEN);
        ExecStepStats st;
        PxError err = {0};
        CHECK_OK(exec_step(ex, 0, &st, &err), err);
        for (int i = 0; i < 4; i++) {
            const ExecFp8Weight *w = exec_fp8_weight(&ex->fp8, roles[i], 1);
            CHECK(w != NULL);
            memcpy(hist[op][i], w->hist + (size_t)EXEC_FP8_X * LEN, sizeof hist[op][i]);
        }
        exec_free(ex);
    }
    for (int i = 0; i < 4; i++) {
        int entries = 0;
        while (entries < LEN && hist[1][i][entries] > 0)
            entries++;
        if (entries != 2 || memcmp(hist[0][i], hist[1][i], sizeof hist[0][i]) != 0) {
            fprintf(stderr,
                    "FAILED: op-level recompute: layer 1 role %d's input history has %d entries "
                    "(%g %g %g), without recompute %g %g %g\n",
                    (int)roles[i], entries, hist[1][i][0], hist[1][i][1], hist[1][i][2],
                    hist[0][i][0], hist[0][i][1], hist[0][i][2]);
            exit(1);
        }
    }
    printf("  op-level recompute, delayed: 2 input amax entries a GEMM, as without recompute\n");
}

/* FP8 attention under delayed scaling (the fused core; docs/fp8.md, "FP8 attention") on tiny
 * with an amax history of 4: the core's tensors quantize with their histories' factors, which
 * the QKV weight's <w>.fp8_amax holds after its GEMM's three columns: Q, K, V's (E4M3), the
 * output gradient's (E5M2 in the hybrid format) and the output's (E4M3). One step of two
 * micro-batches rolls two amaxes into each (newest first), and each factor is the window's
 * largest over the format's largest value. attn.proj.in holds the output in one byte and a
 * scale, 16,388 bytes instead of 65,536, beside the projection's own FP8 copy
 * (attn.proj.in.fp8): 4 x (16,388 - 49,148) = 131,040 bytes fewer activations than the
 * tensorwise run's 2,834,496, every category as the table says. The first step's gradients
 * are compared with the delayed FP8-GEMMs-only run's, not fp32's: both start from decode
 * factors of 1, which flush most of the first micro-batch's E5M2 output gradients to zero
 * (1.009 from fp32's, L2 relative, either way). The attention's first gradients follow that
 * run's: measured at worst 4.99e-2 (layer.0.attn.qkv.w); within 0.15 and off it (FP8 ran).
 * The unfused core keeps two columns (Q, K, V's and dO's), its gradients as close. */
static void fp8_attention_delayed(void)
{
    enum { LEN = 4, COLS = 6 };
    static const char *const names[] = {"layer.0.attn.qkv.w.grad", "layer.0.attn.proj.w.grad",
                                        "layer.3.attn.qkv.w.grad", "layer.3.attn.proj.w.grad"};
    Exec *ex[3];
    double loss[3];
    for (int f = 0; f < 3; f++) {
        ModelSpec s = fp8_spec(MODEL_FP8_DELAYED, MODEL_FP8_HYBRID);
        s.job.fp8_attention = f > 0;
        s.job.flash_attn = f < 2;
        s.job.fp8_amax_history = LEN;
        ex[f] = tx_exec(&s);
        sharpen_as(ex[f], ".attn.qkv.w", ".attn.qkv.w");
        PxError err = {0};
        CHECK_OK(exec_grads(ex[f], 0, &loss[f], &err), err);
    }
    CHECK_EQ_U64(2834496u - 4u * (49148u - 16388u), ex[1]->mem.a[MODEL_ACTIVATIONS].cap);
    for (int k = 0; k < MODEL_RUNTIME; k++)
        CHECK_EQ_U64(model_tensors_bytes(&ex[1]->tt, (ModelCategory)k), ex[1]->mem.a[k].cap);
    double worst_fmax = 0;
    for (int l = 0; l < 4; l++) {
        /* the CPU's tensors are host memory: the history as the table's <w>.fp8_amax holds it */
        const ExecFp8Weight *w = exec_fp8_weight(&ex[1]->fp8, MODEL_TR_QKV_W, l);
        CHECK(w != NULL && w->hist != NULL);
        CHECK_EQ_INT(COLS, w->hist_cols);
        const float *hist = w->hist, *scale = w->scale;
        CHECK(scale == hist + COLS * LEN);
        for (int col = 3; col < COLS; col++) {
            const float *h = hist + col * LEN;
            const float fmax = col == 4 ? 57344.0f : 448.0f;
            CHECK(h[0] > 0.0f && h[1] > 0.0f && h[2] == 0.0f && h[3] == 0.0f);
            CHECK(scale[col] == (h[0] > h[1] ? h[0] : h[1]) / fmax);
            worst_fmax = h[0] > worst_fmax ? h[0] : worst_fmax;
        }
    }
    double worst = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const double d = grad_distance(ex[0], ex[1], names[i]);
        if (!(d <= 0.15 && d > 0)) {
            fprintf(stderr, "FAILED: delayed: %s: %.3e from FP8 GEMMs alone (L2, relative)\n",
                    names[i], d);
            exit(1);
        }
        worst = d > worst ? d : worst;
    }
    CHECK(loss[1] != loss[0]);
    /* the unfused core: Q, K, V and dO rounded with their histories' factors, O not quantized
     * (two columns after the GEMM's three), every category as the table says */
    for (int k = 0; k < MODEL_RUNTIME; k++)
        CHECK_EQ_U64(model_tensors_bytes(&ex[2]->tt, (ModelCategory)k), ex[2]->mem.a[k].cap);
    for (int l = 0; l < 4; l++) {
        const ExecFp8Weight *w = exec_fp8_weight(&ex[2]->fp8, MODEL_TR_QKV_W, l);
        CHECK(w != NULL && w->hist != NULL && w->hist_cols == 5);
        for (int col = 3; col < 5; col++)
            CHECK(w->hist[col * LEN] > 0.0f && w->hist[col * LEN + 1] > 0.0f &&
                  w->hist[col * LEN + 2] == 0.0f);
    }
    double unfused = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const double u = grad_distance(ex[0], ex[2], names[i]);
        CHECK(u <= 0.15 && u > 0);
        unfused = u > unfused ? u : unfused;
    }
    printf("  tiny with FP8 attention (delayed): loss %.6f (FP8 GEMMs alone %.6f), the core's "
           "three histories two entries each (largest amax %.3g), the attention's first "
           "gradients within %.2e of FP8 GEMMs alone's; activations %llu bytes; unfused: loss "
           "%.6f, gradients within %.2e\n",
           loss[1], loss[0], worst_fmax, worst,
           (unsigned long long)ex[1]->mem.a[MODEL_ACTIVATIONS].cap, loss[2], unfused);
    for (int f = 0; f < 3; f++)
        exec_free(ex[f]);
}

/* MXFP8 attention (--fp8-recipe mxfp8 --fp8-attention; docs/fp8.md, "FP8 attention") on
 * tests/data's tiny-hd32 (two heads of 32, two layers) at mbs 4 x seq 128 = 512 rows, the
 * shapes Transformer Engine asserts:
 * - attn.qkv.out holds Q, K, V [512, 192] in both blockings: 1 x 32 (512 x 192 + 512 x 6 E8M0
 *   scales = 101,376 bytes) and 32 x 1 along each sequence (98,304 + 4 x 4 x 192 = 101,376):
 *   202,752 bytes where fp32 holds 393,216; ws.fp8's act part the decoded row-wise and
 *   column-wise Q, K, V and dO's column-wise copy, 512 x (2 x 192 + 64) fp32 = 917,504 bytes
 *   (the largest GEMM operand, fc1's output gradient, needs 512 x 256: 524,288); every
 *   category as the table says;
 * - the core's output (attn.proj.in, fp32) of the last micro-batch is, bit for bit, the CPU
 *   kernel's over the saved copies decoded: the row-wise Q and K, the column-wise V; with the
 *   row-wise V it would differ;
 * - the first step's gradients of the attention's weights (QKV weights sharpened 8 times)
 *   follow fp32's: measured at worst 0.119 (L2, relative), against 0.107 with MXFP8 GEMMs
 *   alone; within 0.25, and off the MXFP8-GEMMs-only run's (the core read FP8 values). The
 *   unfused core (Transformer Engine's emulation: Q, K, V and dO rounded in place, row-wise)
 *   as close: 0.121. Activations 3,440,640 bytes, every category as the table says. */
static void mxfp8_core_output(Exec *ex, int N, int T)
{
    enum { QKV = 192, DH = 32 };
    /* one slot of layer activations (pp 1): the last micro-batch's, layer 1's */
    CHECK_EQ_INT(1, ex->acts.n_slots);
    const ExecLayerActs *la = exec_acts_layers(&ex->acts, &ex->c, 0, 0) + 1;
    const uint8_t *saved = EXEC_LA(la, QKV_OUT);
    const float *o = EXEC_LA(la, PROJ_IN);
    CHECK(saved != NULL && o != NULL);
    const KernBackend *k = kern_cpu();
    const KernFp8 row = {N, QKV, 1, 32, 0, 1}, col = {N, QKV, 32, 1, 0, 1};
    float *xr = calloc((size_t)N * QKV, sizeof *xr), *xc = calloc((size_t)N * QKV, sizeof *xc);
    float *want = calloc((size_t)N * 2 * DH, sizeof *want), *lse = calloc((size_t)N * 2, sizeof *lse);
    CHECK(xr && xc && want && lse);
    k->fp8_dequantize(xr, saved, &row);
    k->fp8_dequantize(xc, saved + kern_fp8_bytes(&row), &col);
    for (int v = 0; v < 2; v++) {
        KernAttnFwd f = {.B = N / T, .Tq = T, .Tk = T, .H = 2, .KV = 2, .D = DH,
                         .scale = 1.0f / sqrtf((float)DH), .q = xr, .k = xr + 2 * DH,
                         .v = (v ? xr : xc) + 4 * DH, .q_stride = QKV, .k_stride = QKV,
                         .v_stride = QKV, .out = want, .lse = lse};
        k->attention_fwd(&f);
        const int same = !memcmp(want, o, (size_t)N * 2 * DH * sizeof *o);
        if (same != !v) {
            fprintf(stderr, "FAILED: MXFP8 attention's output %s the kernel's over the %s V\n",
                    same ? "equals" : "differs from", v ? "row-wise" : "column-wise");
            exit(1);
        }
    }
    free(xr), free(xc), free(want), free(lse);
}

static void fp8_attention_mxfp8(void)
{
    static const char *const names[] = {"layer.0.attn.qkv.w.grad", "layer.0.attn.proj.w.grad",
                                        "layer.1.attn.qkv.w.grad", "layer.1.attn.proj.w.grad"};
    Exec *ex[4];
    double loss[4];
    for (int f = 0; f < 4; f++) {
        ModelSpec s = tx_spec(PX_SOURCE_DIR "/tests/data/tiny-hd32.json", 128, 8, 4);
        s.job.fp8 = f ? MODEL_FP8_MXFP8 : MODEL_FP8_NONE;
        s.job.fp8_attention = f >= 2;
        s.job.flash_attn = f != 3;
        ex[f] = tx_exec(&s);
        sharpen_as(ex[f], ".attn.qkv.w", ".attn.qkv.w");
        PxError err = {0};
        CHECK_OK(exec_grads(ex[f], 0, &loss[f], &err), err);
    }
    CHECK(loss[2] != loss[1]);
    const ModelTensorTable *tt = &ex[2]->tt;
    for (int i = 0; i < tt->count; i++) {
        if (!strcmp(tt->t[i].name, "layer.0.attn.qkv.out"))
            CHECK_EQ_U64(2u * 101376u, tt->t[i].bytes);
        if (!strcmp(tt->t[i].name, "ws.fp8")) {
            ModelFp8Workspace w;
            model_fp8_workspace(&ex[2]->c.spec, &ex[2]->c.d, &w);
            CHECK_EQ_U64(917504u, w.act_bytes);
            CHECK_EQ_U64(w.total, tt->t[i].bytes);
        }
    }
    for (int f = 2; f < 4; f++)
        for (int c = 0; c < MODEL_RUNTIME; c++)
            CHECK_EQ_U64(model_tensors_bytes(&ex[f]->tt, (ModelCategory)c), ex[f]->mem.a[c].cap);
    CHECK_EQ_U64(3440640u, ex[2]->mem.a[MODEL_ACTIVATIONS].cap);
    mxfp8_core_output(ex[2], 512, 128);
    double worst = 0, worst_gemm = 0, unfused = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const double d = grad_distance(ex[0], ex[2], names[i]), g = grad_distance(ex[0], ex[1], names[i]);
        const double off = grad_distance(ex[1], ex[2], names[i]), u = grad_distance(ex[0], ex[3], names[i]);
        if (!(d <= 0.25 && off > 0 && u <= 0.25)) {
            fprintf(stderr, "FAILED: MXFP8 attention: %s: %.3e from fp32's (L2, relative), %.3e "
                    "from MXFP8 GEMMs alone, unfused %.3e from fp32's\n", names[i], d, off, u);
            exit(1);
        }
        worst = d > worst ? d : worst;
        worst_gemm = g > worst_gemm ? g : worst_gemm;
        unfused = u > unfused ? u : unfused;
    }
    printf("  tiny-hd32 with MXFP8 attention: loss %.6f (MXFP8 GEMMs alone %.6f, fp32 %.6f), the "
           "core's output that of the saved copies (column-wise V), the attention's first "
           "gradients within %.2e of fp32's (%.2e with MXFP8 GEMMs alone); activations %llu "
           "bytes; unfused: loss %.6f, gradients within %.2e\n",
           loss[2], loss[1], loss[0], worst, worst_gemm,
           (unsigned long long)ex[2]->mem.a[MODEL_ACTIVATIONS].cap, loss[3], unfused);
    for (int f = 0; f < 4; f++)
        exec_free(ex[f]);
}

/* MXFP8 attention with multi-head latent attention (tiny-dsv3's dense layers with the spec's
 * MXFP8 attention shapes, qk_nope 24 + qk_rope 8 = 32 and v_dim 32; one micro-batch of 2 x 128
 * rows): attn.qkv.out holds the row-wise copy of the three planes Q, K, V (one tensor of
 * 256 x 384 in 1 x 32 blocks, each block inside one plane's row) and after it the column-wise
 * copies, one per plane in 32 x 1 blocks (a block one column of one plane: one feature of 32
 * tokens); the core's output of layer 1 is, bit for bit, the CPU kernel's over the row-wise
 * Q, K and the column-wise V as decoded from there, and not the one over the row-wise V; every
 * category as the table says. */
static void mla_fp8_attention_mxfp8(void)
{
    enum { T = 128, N = 256, H = 4, D = 32, P = H * D, QKV = 3 * P };
    ModelSpec s = tx_spec("tiny-dsv3", T, 2, 2);
    s.model.moe.experts = 0;
    s.model.mtp_layers = 0;
    s.model.mla.qk_nope_dim = 24, s.model.mla.v_dim = 32, s.model.seq_len = T;
    s.job.fp8 = MODEL_FP8_MXFP8;
    s.job.fp8_attention = 1;
    s.job.flash_attn = 1;
    Exec *ex = tx_exec(&s);
    double loss;
    PxError err = {0};
    CHECK_OK(exec_grads(ex, 0, &loss, &err), err);
    for (int c = 0; c < MODEL_RUNTIME; c++)
        CHECK_EQ_U64(model_tensors_bytes(&ex->tt, (ModelCategory)c), ex->mem.a[c].cap);
    CHECK_EQ_INT(1, ex->acts.n_slots);
    const ExecLayerActs *la = exec_acts_layers(&ex->acts, &ex->c, 0, 0) + 1;
    const uint8_t *saved = EXEC_LA(la, QKV_OUT);
    const float *o = EXEC_LA(la, PROJ_IN);
    CHECK(saved != NULL && o != NULL);
    const KernBackend *k = kern_cpu();
    const KernFp8 row = {N, QKV, 1, 32, 0, 1}, col = {N, P, 32, 1, 0, 1};
    float *xr = calloc((size_t)N * QKV, sizeof *xr), *vc = calloc((size_t)N * P, sizeof *vc);
    float *want = calloc((size_t)N * P, sizeof *want), *lse = calloc((size_t)N * H, sizeof *lse);
    CHECK(xr && vc && want && lse);
    k->fp8_dequantize(xr, saved, &row);
    /* V's column-wise copy: after the row-wise copy and Q's and K's column-wise ones */
    k->fp8_dequantize(vc, saved + kern_fp8_bytes(&row) + 2 * kern_fp8_bytes(&col), &col);
    for (int v = 0; v < 2; v++) {
        KernAttnFwd f = {.B = N / T, .Tq = T, .Tk = T, .H = H, .KV = H, .D = D, .Dv = D,
                         .scale = 1.0f / sqrtf((float)D), .q = xr, .k = xr + (size_t)N * P,
                         .v = v ? xr + (size_t)2 * N * P : vc, .q_stride = P, .k_stride = P,
                         .v_stride = P, .out = want, .lse = lse};
        k->attention_fwd(&f);
        const int same = !memcmp(want, o, (size_t)N * P * sizeof *o);
        if (same != !v) {
            fprintf(stderr, "FAILED: MLA's MXFP8 attention output %s the kernel's over the %s V\n",
                    same ? "equals" : "differs from", v ? "row-wise" : "column-wise plane's");
            exit(1);
        }
    }
    printf("  tiny-dsv3 (dense, head widths 32) with MXFP8 attention: loss %.6f, the core's output "
           "that of the saved copies (V's column-wise plane), activations %llu bytes\n",
           loss, (unsigned long long)ex->mem.a[MODEL_ACTIVATIONS].cap);
    free(xr), free(vc), free(want), free(lse);
    exec_free(ex);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "curves")) {
        curves(argc > 2 ? argv[2] : "tiny");
        TEST_DONE("test_exec_fp8 curves");
    }
    weights_per_recipe();
    gradient_format();
    memory();
    workspace();
    mla_gemms();
    mla_q0_grads();
    mla_fp8_attention();
    mtp_gemms();
    dispatch_history();
    shared_gate_gradients();
    fp8_attention();
    sac_history();
    fp8_attention_delayed();
    fp8_attention_mxfp8();
    mla_fp8_attention_mxfp8();
    TEST_DONE("test_exec_fp8");
}
