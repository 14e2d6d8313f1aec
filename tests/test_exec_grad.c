/* Whole-model gradient check: the executor's analytic gradients against central finite
 * differences of its loss, for a sample of elements of every parameter tensor (embeddings,
 * norms, QKV, projection, MLP, biases, output layer), on tiny (GPT: LayerNorm, GeLU, learned
 * positions, tied embeddings, biases) and tiny-llama (RMSNorm, SwiGLU, RoPE, grouped-query
 * attention, untied output layer), tiny-moe (router, routed and shared experts; with the shared
 * experts' gate, beside biases, wider than the dense MLP; GeLU experts) and tiny-gpt-oss (router and expert biases, attention sinks), with flash
 * and unfused attention and with dropout (the same
 * step redraws the same masks, so the loss stays a deterministic function of the weights).
 *
 * fp32 forward passes make the difference quotient noisy, so the check samples the elements
 * with the largest gradient in each quarter of every tensor (where signal dominates rounding),
 * and asks for agreement within 2% or an absolute 1e-4. */
#include "tests/test_exec_common.h"

/* The objective the gradients are of: the language model's loss plus the MoE load-balancing
 * loss and the prediction modules' weighted loss (0 without them). */
static double loss_at(Exec *ex)
{
    PxError err = {0};
    double loss = 0;
    CHECK_OK(exec_loss(ex, 0, &loss, &err), err);
    return loss + exec_aux_loss(ex) + EXEC_MTP_LOSS_SCALE * exec_mtp_loss(ex);
}

static double worst; /* largest error over its tolerance */

static int worst_checked;

static void check_model(const char *what, ModelSpec spec)
{
    Exec *ex = tx_exec(&spec);
    const ModelTensorTable *tt = exec_table(ex);
    /* At initialization attention is nearly uniform and the gradients of Q and K are tiny,
     * too small to tell a wrong one from rounding: sharpen it by scaling the QKV weights
     * (multi-head latent attention's up-projections). */
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_WEIGHTS ||
            !(strstr(t->name, "attn.qkv.w") || strstr(t->name, "attn.q_b.w") ||
              strstr(t->name, "attn.kv_b.w")))
            continue;
        float *w = exec_tensor(ex, t->name, NULL);
        for (uint64_t j = 0; j < t->numel; j++)
            w[j] *= 8.0f;
    }
    /* The shared experts' gate likewise: its logit's gradient is the gate's slope times the
     * shared experts' small output at initialization; larger shared outputs and gate weights
     * make it tell */
    for (int i = 0; spec.model.moe.shared_gate && i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_WEIGHTS ||
            (!strstr(t->name, "mlp.fc2.w") && !strstr(t->name, "shared_gate.w")))
            continue;
        float *w = exec_tensor(ex, t->name, NULL);
        for (uint64_t j = 0; j < t->numel; j++)
            w[j] *= 16.0f;
    }
    PxError err = {0};
    double loss = 0, loss_fwd = loss_at(ex);
    CHECK_OK(exec_grads(ex, 0, &loss, &err), err);
    CHECK(loss > 4.0 && loss < 7.0); /* about ln(256) at initialization */
    loss += exec_aux_loss(ex) + EXEC_MTP_LOSS_SCALE * exec_mtp_loss(ex);
    CHECK(loss == loss_fwd); /* forward alone gives the training loss bit for bit */

    /* the analytic gradient of every sampled element, before any perturbation */
    enum { SAMPLES = 4, MAX_T = 128 };
    uint64_t idx[MAX_T][SAMPLES];
    double an[MAX_T][SAMPLES];
    int nt = 0;
    for (int i = 0; i < tt->count && nt < MAX_T; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_WEIGHTS)
            continue;
        char gname[72];
        snprintf(gname, sizeof gname, "%s.grad", t->name);
        uint64_t n = 0;
        float *g = exec_tensor(ex, gname, &n);
        CHECK(g != NULL && n == t->numel);
        /* the largest |g| of each quarter of the tensor: the quarters of a QKV weight hold Q,
         * K and V rows, of an embedding different tokens */
        for (int k = 0; k < SAMPLES; k++) {
            uint64_t lo = n * (uint64_t)k / SAMPLES, hi = n * (uint64_t)(k + 1) / SAMPLES, best = lo;
            for (uint64_t j = lo; j < hi; j++)
                if (fabsf(g[j]) > fabsf(g[best]))
                    best = j;
            idx[nt][k] = best < n ? best : 0;
        }
        for (int k = 0; k < SAMPLES; k++)
            an[nt][k] = g[idx[nt][k]];
        nt++;
    }
    CHECK(nt > 10);

    int ti = 0, checked = 0;
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_WEIGHTS)
            continue;
        float *w = exec_tensor(ex, t->name, NULL);
        for (int k = 0; k < SAMPLES; k++) {
            const uint64_t j = idx[ti][k];
            const float w0 = w[j];
            const float h = 1e-2f * (fabsf(w0) > 0.1f ? fabsf(w0) : 0.1f);
            w[j] = w0 + h;
            double lp = loss_at(ex);
            w[j] = w0 - h;
            double lm = loss_at(ex);
            w[j] = w0;
            double fd = (lp - lm) / (2.0 * (double)h), a = an[ti][k];
            double tol = 0.02 * fabs(a) + 1e-4;
            if (fabs(fd - a) / tol > worst)
                worst = fabs(fd - a) / tol;
            if (!(fabs(fd - a) <= tol)) {
                fprintf(stderr,
                        "%s: %s[%llu]: analytic %.6e, finite difference %.6e (off by %.3g, "
                        "tolerance %.3g)\n",
                        what, t->name, (unsigned long long)j, a, fd, fabs(fd - a), tol);
                exit(1);
            }
            checked++;
        }
        ti++;
    }
    worst_checked += checked;
    exec_free(ex);
}

int main(void)
{
    px_log_set_quiet(1);
    ModelSpec s = tx_spec("tiny", 16, 2, 1);
    s.job.flash_attn = 1;
    check_model("tiny flash", s);
    s.job.flash_attn = 0;
    s.job.dropout = 0.1;
    check_model("tiny unfused dropout", s);
    s = tx_spec("tiny-llama", 16, 2, 1);
    check_model("tiny-llama flash", s);
    s.job.flash_attn = 0;
    check_model("tiny-llama unfused", s);
    /* a padded vocabulary (256 -> 320, untied): the padding takes no probability */
    s = tx_spec("tiny", 16, 2, 2);
    s.model.tied_embeddings = 0;
    s.job.pad_vocab = 64 + 256;
    check_model("tiny untied padded", s);
    /* multi-token prediction modules (mtp.c): two depths, so that the second reads the
     * first's output; tied (the modules embed with the output layer's weights) and untied;
     * an untrained module predicts about as well as chance, ln(256) */
    s = tx_spec("tiny", 16, 2, 1);
    s.model.mtp_layers = 2;
    check_model("tiny mtp 2", s);
    {
        Exec *ex = tx_exec(&s);
        PxError err = {0};
        double loss = 0;
        CHECK_OK(exec_loss(ex, 0, &loss, &err), err);
        CHECK(fabs(exec_mtp_loss(ex) - log(256.0)) < 0.1);
        exec_free(ex);
    }
    s = tx_spec("tiny-llama", 16, 2, 1);
    s.model.mtp_layers = 1;
    check_model("tiny-llama mtp 1", s);
    /* a MoE model (router, routed SwiGLU experts, a shared expert, a leading dense layer):
     * the load-balancing loss is left out (the loss reported is the language model's) and the
     * routing forced: a perturbation that flips a token's choice of expert makes the loss jump */
    s = tx_spec("tiny-moe", 16, 2, 1);
    s.model.moe.aux_loss_coeff = 0;
    s.job.moe_force_balance = 1;
    check_model("tiny-moe forced", s);
    s.job.flash_attn = 0;
    s.job.dropout = 0.1;
    check_model("tiny-moe forced dropout", s);
    s.model.moe.shared_ffn = 0;
    check_model("tiny-moe forced without shared experts", s);
    /* the load-balancing loss's gradient (through the router's probabilities; the forced
     * choice and counts do not move under a perturbation), with a coefficient large enough
     * that its term dominates the router's gradient. With softmax scores and forced balance
     * the loss is the constant coeff (each token's probabilities sum to 1) and its gradient 0,
     * which the first check confirms; sigmoid scores do not sum to 1, so the second checks a
     * gradient that is not zero (halving it fails the check at embed.wte) */
    s = tx_spec("tiny-moe", 16, 2, 1);
    s.job.moe_force_balance = 1;
    s.model.moe.aux_loss_coeff = 1.0;
    {
        Exec *ex = tx_exec(&s);
        PxError err = {0};
        double loss = 0;
        CHECK_OK(exec_loss(ex, 0, &loss, &err), err);
        /* balanced counts: coeff * E / (k T^2) * sum_e (T k / E) * sum_t p_te = coeff per
         * layer and micro-batch, times b / global_batch: the sum over the step is coeff times
         * the MoE layers (3) */
        CHECK_REL(3.0, exec_aux_loss(ex), 1e-5);
        exec_free(ex);
    }
    check_model("tiny-moe forced with the load-balancing loss", s);
    s.model.moe.score = MODEL_ROUTER_SIGMOID;
    check_model("tiny-moe forced sigmoid with the load-balancing loss", s);
    /* GPT-OSS's shape (tiny-gpt-oss): the router's and the experts' biases, QKV and
     * projection biases and attention sinks, fused and unfused; the biases start at 0, so a
     * forward that left one out would see no change under its perturbation */
    s = tx_spec("tiny-gpt-oss", 16, 2, 1);
    s.model.moe.aux_loss_coeff = 0;
    s.job.moe_force_balance = 1;
    check_model("tiny-gpt-oss forced flash", s);
    s.job.flash_attn = 0;
    check_model("tiny-gpt-oss forced unfused", s);
    /* Qwen2-MoE's sigmoid gate on the shared experts' output */
    s = tx_spec("tiny-moe", 16, 2, 1);
    s.model.moe.aux_loss_coeff = 0;
    s.model.moe.shared_gate = 1;
    s.job.moe_force_balance = 1;
    check_model("tiny-moe forced with the shared gate", s);
    /* the gate beside the MLP's biases (fc2's added after the gated output), and Qwen2-MoE's
     * shape: a gated shared expert wider than the dense layers' MLP (192 over 176) */
    s.model.bias = 1;
    check_model("tiny-moe forced with the shared gate and biases", s);
    s.model.bias = 0;
    s.model.moe.shared_ffn = 192;
    check_model("tiny-moe forced with a gated shared expert wider than ffn_hidden", s);
    /* GeLU experts and shared experts */
    s = tx_spec("tiny-moe", 16, 2, 1);
    s.model.moe.aux_loss_coeff = 0;
    s.model.mlp = MODEL_GELU;
    s.job.moe_force_balance = 1;
    check_model("tiny-moe forced GeLU", s);
    /* multi-head latent attention in DeepSeek-V3's shape (tiny-dsv3 without its multi-token
     * prediction module, routing forced, no load-balancing loss): the down-projections, the
     * latents' norms, the up-projections, the rotary parts shared by the heads, value heads
     * narrower than the query and key heads; two sequences a micro-batch (positions restart) */
    s = tx_spec("tiny-dsv3", 16, 4, 2);
    s.model.mtp_layers = 0;
    s.model.moe.aux_loss_coeff = 0;
    s.job.moe_force_balance = 1;
    check_model("tiny-dsv3 forced flash", s);
    s.job.flash_attn = 0;
    check_model("tiny-dsv3 forced unfused", s);
    s.model.mla.q_lora_rank = 0;
    check_model("tiny-dsv3 forced, queries projected directly", s);
    printf("checked %d sampled elements; the worst used %.0f%% of its tolerance\n", worst_checked,
           100.0 * worst);
    TEST_DONE("test_exec_grad");
}
