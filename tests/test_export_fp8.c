/* FP8 in the exports, line by line: Megatron-LM's --fp8-* flags for every recipe and format,
 * FP8 parameters where validate_args takes them, what has no flag said in a comment; NeMo 1.x's
 * fp8 keys; Megatron-Bridge's mixed-precision recipe by name, or the plan's whole
 * MixedPrecisionConfig where the plan differs from it; the DeepSpeed export's NOT EXPRESSIBLE warning. The names are Megatron-LM
 * d98e8a64's, Megatron-Bridge 0.6.2's and NeMo 8cfedd72's (the files of export/ cite them). */

/* Megatron-Bridge's override that replaces the recipe's precision by the plan's, whole: the recipe
 * may hold a name or a MixedPrecisionConfig, so it is deleted and a MixedPrecisionConfig added
 * (Bridge 0.6 instantiates no dataclasses.replace); prec its fp32/fp16/bf16 switches, dtype its
 * torch dtype, fp8 BRIDGE_FP8's keys or "" */
#define BRIDGE_MP(prec, dtype, grad32, fp8)                                                         \
    "'~mixed_precision' '+mixed_precision={_target_:megatron.bridge.training.mixed_precision."     \
    "MixedPrecisionConfig," prec ",params_dtype:{_target_:torch." dtype ",_call_:false},"           \
    "pipeline_dtype:{_target_:torch." dtype ",_call_:false},autocast_enabled:false,"                \
    "grad_reduce_in_fp32:" grad32 fp8 ",first_last_layers_bf16:false,num_layers_at_start_in_bf16:0," \
    "num_layers_at_end_in_bf16:0}'"
#define BRIDGE_BF16 "fp32:false,fp16:false,bf16:true"
#define BRIDGE_FP16 "fp32:false,fp16:true,bf16:false"
#define BRIDGE_FP8(fmt, recipe, hist, algo, gather, reuse, attn)                                   \
    ",fp8:" fmt ",fp8_recipe:" recipe ",fp8_margin:0,fp8_amax_history_len:" hist                    \
    ",fp8_amax_compute_algo:" algo ",fp8_param_gather:" gather                                      \
    ",reuse_grad_buf_for_mxfp8_param_ag:" reuse ",fp8_dot_product_attention:" attn
#include "export/export.h"
#include "fixtures.h"
#include "test.h"

#include <unistd.h>

static ModelSpec job(const char *model, ModelFp8Recipe r, ModelFp8Format fmt)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(model, &s.model, &err), err);
    s.layout.tp = 2;
    s.layout.sp = 1;
    s.layout.zero = 1;
    s.job.micro_batch = 1;
    s.job.global_batch = 64;
    s.job.seq_len = 2048;
    s.job.precision = PX_BF16;
    s.job.fp8 = r;
    s.job.fp8_format = fmt;
    return s;
}

/* The export of spec on `gpus` GPUs of `cluster` in format fmt; what it warns goes to *warned
 * (NULL: warnings silenced). */
static char *export_of(const ModelSpec *s, const char *cluster, int gpus, ExportFormat fmt, char **warned)
{
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(s, cluster, gpus, &plan, &err), err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    FILE *tmp = NULL;
    int saved = -1;
    if (warned) {
        /* px_warn writes to stderr: point it at a file for the call */
        tmp = tmpfile();
        CHECK(tmp != NULL);
        fflush(stderr);
        saved = dup(2);
        CHECK(saved >= 0 && dup2(fileno(tmp), 2) >= 0);
        px_log_set_quiet(0);
    }
    CHECK_OK(export_plan(f, &plan, fmt, &err), err);
    fclose(f);
    if (warned) {
        fflush(stderr);
        px_log_set_quiet(1);
        CHECK(dup2(saved, 2) >= 0);
        close(saved);
        long n = ftell(tmp);
        CHECK(n >= 0);
        *warned = calloc((size_t)n + 1, 1);
        CHECK(*warned != NULL);
        rewind(tmp);
        CHECK(fread(*warned, 1, (size_t)n, tmp) == (size_t)n);
        fclose(tmp);
    }
    model_plan_free(&plan);
    return buf;
}

/* delayed, hybrid, a history of 512, no FP8 parameters */
static void test_delayed(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_DELAYED, MODEL_FP8_HYBRID);
    s.job.fp8_amax_history = 512;
    char *mg = export_of(&s, "dgx-h100", 8, EXPORT_MEGATRON, NULL);
    const char *want_mg[] = {"    --bf16", "    --fp8-format hybrid", "    --fp8-recipe delayed",
                             "    --fp8-amax-history-len 512", "    --fp8-amax-compute-algo max", NULL};
    const char *not_mg[] = {"--fp8-param-gather", "NOT EXPRESSIBLE", "fp8-dot-product", "mxfp8", NULL};
    expect_lines("megatron export (delayed)", mg, want_mg, not_mg);
    free(mg);
    char *ne = export_of(&s, "dgx-h100", 8, EXPORT_NEMO, NULL);
    const char *want_ne[] = {
        "model.transformer_engine=true model.fp8=true model.fp8_e4m3=false model.fp8_hybrid=true "
        "model.fp8_amax_history_len=512 model.fp8_amax_compute_algo=max",
        "scheduler.lr_decay_style=cosine scheduler.lr_warmup_iters=10 scheduler.lr_decay_iters=100",
        BRIDGE_MP(BRIDGE_BF16, "bfloat16", "true",
                  BRIDGE_FP8("hybrid", "delayed", "512", "max", "false", "false", "false")), NULL};
    const char *not_ne[] = {"+model.fp8", "bf16_mixed\n", NULL};
    expect_lines("nemo export (delayed)", ne, want_ne, not_ne);
    free(ne);
}

/* tensorwise, e4m3, FP8 parameters under the distributed optimizer */
static void test_tensorwise(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_TENSORWISE, MODEL_FP8_E4M3);
    s.job.fp8_param_gather = 1;
    char *mg = export_of(&s, "dgx-h100", 8, EXPORT_MEGATRON, NULL);
    const char *want_mg[] = {"    --use-distributed-optimizer", "    --fp8-format e4m3",
                             "    --fp8-recipe tensorwise", "    --fp8-param-gather", NULL};
    const char *not_mg[] = {"--fp8-amax", "NOT EXPRESSIBLE", NULL};
    expect_lines("megatron export (tensorwise)", mg, want_mg, not_mg);
    free(mg);
    char *ne = export_of(&s, "dgx-h100", 8, EXPORT_NEMO, NULL);
    const char *want_ne[] = {
        "# NeMo 1.x's own FP8 keys are delayed scaling's; the '+' keys reach Megatron-Core's TransformerConfig",
        "model.transformer_engine=true model.fp8=true model.fp8_e4m3=true model.fp8_hybrid=false "
        "+model.fp8_recipe=tensorwise",
        "# NOT EXPRESSIBLE in NeMo 1.x: FP8 parameters under the tensorwise recipe (model.fp8_params builds them",
        BRIDGE_MP(BRIDGE_BF16, "bfloat16", "true",
                  BRIDGE_FP8("e4m3", "tensorwise", "1", "most_recent", "true", "false", "false")),
        NULL};
    const char *not_ne[] = {"model.fp8_amax", "+model.fp8_params", NULL}; /* NeMo 1.x's delayed-scaling keys */
    expect_lines("nemo export (tensorwise)", ne, want_ne, not_ne);
    free(ne);
}

/* blockwise with FP8 parameters (FP8 attention with it is no job: model/spec.c, check_fp8) */
static void test_blockwise(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_BLOCKWISE, MODEL_FP8_HYBRID);
    s.job.fp8_param_gather = 1;
    char *mg = export_of(&s, "dgx-h100", 8, EXPORT_MEGATRON, NULL);
    const char *want_mg[] = {"    --fp8-format hybrid", "    --fp8-recipe blockwise",
                             "    --fp8-param-gather", NULL};
    const char *not_mg[] = {"--fp8-amax", "NOT EXPRESSIBLE", NULL};
    expect_lines("megatron export (blockwise)", mg, want_mg, not_mg);
    free(mg);
    char *ne = export_of(&s, "dgx-h100", 8, EXPORT_NEMO, NULL);
    const char *want_ne[] = {
        "model.transformer_engine=true model.fp8=true model.fp8_e4m3=false model.fp8_hybrid=true "
        "+model.fp8_recipe=blockwise",
        BRIDGE_MP(BRIDGE_BF16, "bfloat16", "true",
                  BRIDGE_FP8("hybrid", "blockwise", "1", "most_recent", "true", "false", "false")),
        NULL};
    expect_lines("nemo export (blockwise)", ne, want_ne, NULL);
    free(ne);
}

/* FP8 attention (no Megatron-LM flag) with MXFP8 on B200 */
static void test_fp8_attention(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_MXFP8, MODEL_FP8_HYBRID);
    s.job.fp8_attention = 1;
    char *mg = export_of(&s, "dgx-b200", 8, EXPORT_MEGATRON, NULL);
    const char *want_mg[] = {
        "# NOT EXPRESSIBLE: FP8 attention: Megatron-Core's TransformerConfig.fp8_dot_product_attention has",
        "# no pretrain_gpt.py flag (arguments.py leaves it out of the generated ones)",
        "    --fp8-recipe mxfp8", NULL};
    const char *not_mg[] = {"--fp8-dot-product-attention", "does not take it", NULL};
    expect_lines("megatron export (FP8 attention)", mg, want_mg, not_mg);
    free(mg);
    char *ne = export_of(&s, "dgx-b200", 8, EXPORT_NEMO, NULL);
    const char *want_ne[] = {
        "model.transformer_engine=true model.fp8=true model.fp8_e4m3=false model.fp8_hybrid=true "
        "+model.fp8_recipe=mxfp8 +model.fp8_dot_product_attention=true",
        BRIDGE_MP(BRIDGE_BF16, "bfloat16", "true",
                  BRIDGE_FP8("hybrid", "mxfp8", "1", "most_recent", "false", "false", "true")),
        NULL};
    expect_lines("nemo export (FP8 attention)", ne, want_ne, NULL);
    free(ne);
}

/* MXFP8 on B200 without FP8 parameters: Megatron-Core's DDP config then refuses the recipe's
 * grad-buffer reuse, so the difference names it too */
static void test_mxfp8(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_MXFP8, MODEL_FP8_HYBRID);
    char *mg = export_of(&s, "dgx-b200", 8, EXPORT_MEGATRON, NULL);
    const char *want_mg[] = {
        "# --fp8-recipe mxfp8 runs on Blackwell only: Transformer Engine checks the device, validate_args does not",
        "    --fp8-format hybrid", "    --fp8-recipe mxfp8", NULL};
    const char *not_mg[] = {"--fp8-param-gather", "--fp8-amax", NULL};
    expect_lines("megatron export (mxfp8)", mg, want_mg, not_mg);
    free(mg);
    char *ne = export_of(&s, "dgx-b200", 8, EXPORT_NEMO, NULL);
    const char *want_ne[] = {BRIDGE_MP(BRIDGE_BF16, "bfloat16", "true",
                                       BRIDGE_FP8("hybrid", "mxfp8", "1", "most_recent", "false", "false", "false")),
                             "# the mxfp8 recipe runs on Blackwell only", NULL};
    expect_lines("nemo export (mxfp8)", ne, want_ne, NULL);
    free(ne);
}

/* FP8 parameters under ZeRO-0: validate_args wants the distributed optimizer, so no flag and a
 * NOT EXPRESSIBLE line; fp16 takes the fp16 recipe */
static void test_zero0_fp16(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_DELAYED, MODEL_FP8_HYBRID);
    s.layout.zero = 0;
    s.job.fp8_param_gather = 1;
    s.job.precision = PX_FP16;
    char *mg = export_of(&s, "dgx-h100", 8, EXPORT_MEGATRON, NULL);
    const char *want_mg[] = {
        "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0): validate_args takes",
        "    --fp16", "    --fp8-recipe delayed", "    --fp8-amax-history-len 1024", NULL};
    const char *not_mg[] = {"    --fp8-param-gather", "    --use-distributed-optimizer", NULL};
    expect_lines("megatron export (ZeRO-0)", mg, want_mg, not_mg);
    free(mg);
    char *ne = export_of(&s, "dgx-h100", 8, EXPORT_NEMO, NULL);
    const char *want_ne[] = {
        "model.transformer_engine=true model.fp8=true model.fp8_e4m3=false model.fp8_hybrid=true "
        "model.fp8_amax_history_len=1024 model.fp8_amax_compute_algo=max",
        "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0); the weights stay",
        /* fp16_mixed reduces gradients in fp16, the plan in fp32 */
        BRIDGE_MP(BRIDGE_FP16, "float16", "true",
                  BRIDGE_FP8("hybrid", "delayed", "1024", "max", "false", "false", "false")),
        "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0): they stay 16-bit", NULL};
    const char *not_ne[] = {"+model.fp8_params", NULL};
    expect_lines("nemo export (ZeRO-0)", ne, want_ne, not_ne);
    free(ne);
}

/* a MoE plan's FP8 dispatch: Megatron-Core quantizes only the ncclep flex dispatcher's */
static void test_dispatch(void)
{
    ModelSpec s = job("tiny-moe", MODEL_FP8_TENSORWISE, MODEL_FP8_HYBRID);
    s.layout.tp = 1;
    s.layout.sp = 0;
    s.layout.ep = 4;
    s.layout.etp = 1;
    s.job.seq_len = 0;
    s.job.global_batch = 8;
    s.job.fp8_dispatch = 1;
    char *mg = export_of(&s, "dgx-h100", 8, EXPORT_MEGATRON, NULL);
    const char *want_mg[] = {
        "# FP8 dispatch has no flag for the alltoall dispatcher below: Megatron-Core quantizes the dispatch",
        "# only on the ncclep flex dispatcher, in MXFP8 (--moe-dispatch-fwd-dtype mxfp8); these flags dispatch in bf16",
        "    --moe-token-dispatcher-type alltoall", "    --fp8-recipe tensorwise", NULL};
    expect_lines("megatron export (FP8 dispatch)", mg, want_mg, NULL);
    free(mg);
}

/* DeepSpeed's config has no FP8 key: the JSON is the bf16 one and a warning says so */
static void test_deepspeed(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_BLOCKWISE, MODEL_FP8_HYBRID);
    s.layout.tp = 1;
    s.layout.sp = 0;
    s.job.fp8_param_gather = 1;
    char *warned = NULL;
    char *ds = export_of(&s, "dgx-h100", 8, EXPORT_DEEPSPEED, &warned);
    const char *want_w[] = {
        "parallax: warning: NOT EXPRESSIBLE: FP8 training (recipe blockwise, format hybrid, FP8 parameters) is "
        "not a DeepSpeed config setting: Transformer Engine's layers and te.pytorch.fp8_autocast(fp8_recipe=...) "
        "go in the model code; the config written is the bf16 one",
        NULL};
    expect_lines("deepspeed warnings", warned, want_w, NULL);
    const char *want_ds[] = {"\t\t\"enabled\":\ttrue", NULL};
    const char *not_ds[] = {"fp8", NULL};
    expect_lines("deepspeed export", ds, want_ds, not_ds);
    CHECK(strstr(ds, "\"bf16\":\t{") != NULL);
    free(ds);
    free(warned);
}

/* without FP8 nothing of it is written, and Megatron-Bridge's bf16 and fp16 recipes stay */
static void test_no_fp8(void)
{
    ModelSpec s = job("llama3-8b", MODEL_FP8_NONE, MODEL_FP8_HYBRID);
    const ExportFormat fmts[] = {EXPORT_MEGATRON, EXPORT_NEMO, EXPORT_DEEPSPEED};
    for (int i = 0; i < 3; i++) {
        char *warned = NULL;
        char *out = export_of(&s, "dgx-h100", 8, fmts[i], &warned);
        const char *not_fp8[] = {"fp8", "FP8", NULL};
        expect_lines(export_format_name(fmts[i]), out, NULL, not_fp8);
        expect_lines("warnings", warned, NULL, not_fp8);
        if (fmts[i] == EXPORT_NEMO) {
            const char *want[] = {"mixed_precision=bf16_mixed", NULL};
            expect_lines("nemo export (bf16)", out, want, NULL);
        }
        free(out);
        free(warned);
    }
    /* Megatron-Bridge registers fp16_mixed (and fp16-mixed), not NeMo 2's 16-mixed; it reduces
     * gradients in fp16, the plan in fp32 */
    s.job.precision = PX_FP16;
    char *ne = export_of(&s, "dgx-h100", 8, EXPORT_NEMO, NULL);
    const char *want16[] = {BRIDGE_MP(BRIDGE_FP16, "float16", "true", ""), NULL};
    expect_lines("nemo export (fp16)", ne, want16, NULL);
    free(ne);
}

int main(void)
{
    px_log_set_quiet(1);
    test_delayed();
    test_tensorwise();
    test_blockwise();
    test_fp8_attention();
    test_mxfp8();
    test_zero0_fp16();
    test_dispatch();
    test_deepspeed();
    test_no_fp8();
    TEST_DONE("export_fp8");
}
