/* fp16's dynamic loss scaling (exec/scale.c), as PyTorch's GradScaler does it: on an Inf or NaN
 * gradient the step is skipped and the scale halved; after `interval` clean steps in a row it
 * doubles. Against the emulated CUDA backend in fp16 (kernels/cuda/emu), every figure exact:
 * - the scaler alone: the scale and the verdict after each step of a given history, PyTorch's
 *   defaults (2^16, 2000), and a disabled scaler (bf16, fp32) that never skips;
 * - injected overflows (PARALLAX_TEST_INF: an Inf in a gradient after the backward): the
 *   skipped steps leave the weights, the fp32 master weights and AdamW's state and step count
 *   untouched, so a run that skips steps 1 and 2 and then trains steps 3-5 equals, bit for bit,
 *   a run that starts at step 3 with the scale the first one arrived at; the metrics give every
 *   step's scale and verdict;
 * - a real overflow: a scale of 2^24 overflows fp16's gradients, the run skips and halves until
 *   the gradients fit, then trains;
 * - bf16 has no scaler: an Inf in its gradients ends the run as diverged. */
#include "tests/test_exec_common.h"
#include "exec/train/internal.h"
#include "sim/sim.h"
#include "kernels/kernels.h"

/* ---- the scaler alone ---- */

static void test_scaler(void)
{
    ExecScaler s;
    exec_scaler_init(&s, 1, 0, 0);
    CHECK(s.scale == 65536.0);
    CHECK_EQ_INT(2000, s.interval);
    for (int i = 1; i < 2000; i++) {
        CHECK_EQ_INT(0, exec_scaler_update(&s, 0));
        CHECK(s.scale == 65536.0);
    }
    CHECK_EQ_INT(0, exec_scaler_update(&s, 0));
    CHECK(s.scale == 131072.0); /* doubled at the 2000th clean step */

    /* a history: clean, Inf, Inf, then clean steps, interval 3 */
    exec_scaler_init(&s, 1, 1024, 3);
    const int inf[10] = {0, 1, 1, 0, 0, 0, 0, 0, 0, 1};
    const int skip[10] = {0, 1, 1, 0, 0, 0, 0, 0, 0, 1};
    const double after[10] = {1024, 512, 256, 256, 256, 512, 512, 512, 1024, 512};
    for (int i = 0; i < 10; i++) {
        CHECK_EQ_INT(skip[i], exec_scaler_update(&s, inf[i]));
        if (s.scale != after[i]) {
            fprintf(stderr, "after step %d the scale is %g, expected %g\n", i + 1, s.scale, after[i]);
            exit(1);
        }
    }
    CHECK_EQ_INT(3, s.skipped);
    CHECK_EQ_INT(0, s.clean); /* a skip restarts the count */

    /* bf16 and fp32: no scaling, nothing skipped, whatever the gradients */
    exec_scaler_init(&s, 0, 1024, 3);
    CHECK(s.scale == 1.0);
    CHECK_EQ_INT(0, exec_scaler_update(&s, 1));
    CHECK(s.scale == 1.0);
    CHECK_EQ_INT(0, s.skipped);
}

/* ---- on the emulated GPU ---- */

static Exec *fp16_exec(PxDtype precision, double scale, int interval, const char *inf_steps)
{
    ModelSpec s = tx_spec("tiny", 16, 4, 2);
    s.job.precision = precision;
    s.job.steps = 16;
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(&s, "dgx-h100", 1, &plan, &err), err);
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.quiet = 1;
    opt.prefetch = 0;
    opt.backend = EXEC_BACKEND_CUDA;
    opt.loss_scale = scale;
    opt.loss_scale_interval = interval;
    if (inf_steps)
        setenv("PARALLAX_TEST_INF", inf_steps, 1);
    else
        unsetenv("PARALLAX_TEST_INF");
    Exec *ex = NULL;
    CHECK_OK(exec_init(&ex, &plan, &opt, &err), err);
    unsetenv("PARALLAX_TEST_INF");
    model_plan_free(&plan);
    return ex;
}

/* The weights (act), the fp32 master weights and the AdamW state of the whole model, as bytes. */
typedef struct {
    unsigned char *b;
    size_t n;
} Snap;

static Snap snapshot(Exec *ex)
{
    const int cats[3] = {MODEL_WEIGHTS, MODEL_MASTER, MODEL_OPTIMIZER};
    Snap s = {NULL, 0};
    for (int i = 0; i < 3; i++)
        s.n += ex->mem.a[cats[i]].cap;
    s.b = malloc(s.n);
    CHECK(s.b != NULL);
    size_t off = 0;
    ex->c.k->sync();
    for (int i = 0; i < 3; i++) {
        ex->c.k->to_host(s.b + off, ex->mem.a[cats[i]].base, ex->mem.a[cats[i]].cap);
        off += ex->mem.a[cats[i]].cap;
    }
    return s;
}

static int same(Snap a, Snap b) { return a.n == b.n && memcmp(a.b, b.b, a.n) == 0; }

static void test_injected(void)
{
    PxError err = {0};
    ExecStepStats st;
    /* A: Inf in steps 1 and 2 (scale 1024 -> 512 -> 256), then three clean steps, interval 2 */
    Exec *a = fp16_exec(PX_FP16, 1024, 2, "1,2");
    Snap s0 = snapshot(a);
    const double scales[5] = {1024, 512, 256, 256, 512};
    const int skipped[5] = {1, 1, 0, 0, 0};
    double loss_a[5];
    for (int i = 0; i < 5; i++) {
        CHECK_OK(exec_step(a, i, &st, &err), err);
        CHECK_EQ_INT(skipped[i], st.skipped);
        CHECK(st.loss_scale == scales[i]);
        CHECK(isfinite(st.loss)); /* the forward was fine: only the gradients overflowed */
        loss_a[i] = st.loss;
        if (i == 1) {
            Snap s2 = snapshot(a);
            CHECK(same(s0, s2)); /* two skipped steps changed nothing */
            free(s2.b);
        }
    }
    long nskip = 0;
    CHECK(exec_loss_scale(a, &nskip) == 512.0);
    CHECK_EQ_INT(2, nskip);
    Snap sa = snapshot(a);
    CHECK(!same(s0, sa)); /* and the clean ones trained */

    /* B: the same job started at step 3 with scale 256: the same updates, bit for bit (AdamW's
     * step count included: A's first update is its t = 1 too) */
    Exec *b = fp16_exec(PX_FP16, 256, 2, NULL);
    for (int i = 2; i < 5; i++) {
        CHECK_OK(exec_step(b, i, &st, &err), err);
        CHECK_EQ_INT(0, st.skipped);
        CHECK(st.loss_scale == scales[i]);
        if (st.loss != loss_a[i]) {
            fprintf(stderr, "step %d: loss %.9g after two skipped steps, %.9g without them\n", i + 1,
                    loss_a[i], st.loss);
            exit(1);
        }
    }
    Snap sb = snapshot(b);
    CHECK(same(sa, sb));
    free(s0.b);
    free(sa.b);
    free(sb.b);
    exec_free(a);
    exec_free(b);
}

static void test_real_overflow(void)
{
    PxError err = {0};
    ExecStepStats st;
    const double start = 0x1p24;
    Exec *ex = fp16_exec(PX_FP16, start, 2000, NULL);
    Snap s0 = snapshot(ex);
    double scale = start;
    int i = 0;
    for (; i < 16; i++) {
        CHECK_OK(exec_step(ex, i, &st, &err), err);
        CHECK(st.loss_scale == scale); /* halved after every skipped step */
        if (!st.skipped)
            break;
        CHECK(!isfinite(st.grad_norm));
        scale /= 2;
    }
    /* the gradient of a target's logit, (p - 1) x 2^24 / (global batch x sequence) = -2^18 (p
     * is about 1/256 at the start), is beyond fp16's 65504: the first step overflows for sure;
     * the scale comes down until the gradients fit, and the first step that fits trains from
     * the initial weights */
    CHECK(i >= 1 && i < 16);
    CHECK(scale <= 0x1p22);
    CHECK(isfinite(st.grad_norm) && st.grad_norm > 0);
    printf("  a scale of 2^24: %d steps skipped, training from scale 2^%d on\n", i,
           (int)log2(scale));
    Snap s1 = snapshot(ex);
    CHECK(!same(s0, s1));
    free(s0.b);
    free(s1.b);
    exec_free(ex);
}

static void test_bf16_no_scaler(void)
{
    PxError err = {0};
    ExecStepStats st;
    Exec *ex = fp16_exec(PX_BF16, 0, 0, "2");
    CHECK_OK(exec_step(ex, 0, &st, &err), err);
    CHECK(st.loss_scale == 1.0 && !st.skipped);
    CHECK_EQ_INT(PX_ERUNTIME, exec_step(ex, 1, &st, &err));
    CHECK(strstr(err.msg, "step 2: the gradient norm is inf: training diverged") != NULL);
    CHECK(exec_error_is_collective(ex));
    exec_free(ex);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    px_log_set_quiet(1);
    test_scaler();
    if (!kern_cuda_with(PX_FP16)) {
        printf("test_loss_scale: no CUDA backend (not even the emulator): the scaler alone passed; "
               "the runs skipped\n");
        return 77;
    }
    test_injected();
    test_real_overflow();
    test_bf16_no_scaler();
    TEST_DONE("loss_scale");
}
