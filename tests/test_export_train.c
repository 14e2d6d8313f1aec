/* The training length and learning-rate schedule of every export (export/train.c,
 * docs/exports.md "Training length and schedule"): iterations = ceil(tokens / (global batch x
 * sequence)); the peak, minimum, warm-up and decay from the plan when set, else from the zoo
 * model's published recipe, else parallax's defaults with a WARNING; each format in its own
 * keys. Every figure below is recomputed by hand in its comment. Also torchtitan's GPT-OSS. */
#include "export/export.h"
#include "fixtures.h"
#include "sim/sim.h"
#include "test.h"

#include <cjson/cJSON.h>

static ModelSpec job(const char *model, int tp, int pp, int gbs, int seq)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(model, &s.model, &err), err);
    s.layout.tp = tp;
    s.layout.pp = pp;
    s.layout.sp = tp > 1;
    s.layout.zero = 1;
    s.job.micro_batch = 1;
    s.job.global_batch = gbs;
    s.job.seq_len = seq;
    s.job.precision = PX_BF16;
    return s;
}

static char *export_of(const ModelSpec *s, const char *cluster, int gpus, ExportFormat fmt)
{
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(s, cluster, gpus, &plan, &err), err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    CHECK_OK(export_plan(f, &plan, fmt, &err), err);
    fclose(f);
    model_plan_free(&plan);
    return buf;
}

static void expect_format(const char *what, const ModelSpec *s, const char *cluster, int gpus, ExportFormat fmt,
                          const char *const *want, const char *const *not_want)
{
    char *got = export_of(s, cluster, gpus, fmt);
    expect_lines(what, got, want, not_want);
    free(got);
}

/* DeepSpeed's scheduler block: the numbers of the JSON */
static void expect_deepspeed(const ModelSpec *s, const char *cluster, int gpus, double lr, double total,
                             double warmup, double ratio)
{
    char *got = export_of(s, cluster, gpus, EXPORT_DEEPSPEED);
    cJSON *j = cJSON_Parse(got);
    CHECK(j != NULL);
    const cJSON *sp = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "scheduler"), "params");
    const cJSON *op = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "optimizer"), "params");
    CHECK_REL(lr, cJSON_GetObjectItem(op, "lr")->valuedouble, 1e-12);
    CHECK_REL(total, cJSON_GetObjectItem(sp, "total_num_steps")->valuedouble, 0);
    CHECK_REL(warmup, cJSON_GetObjectItem(sp, "warmup_num_steps")->valuedouble, 0);
    CHECK_REL(ratio, cJSON_GetObjectItem(sp, "cos_min_ratio")->valuedouble, 1e-12);
    cJSON_Delete(j);
    free(got);
}

/* Llama 3 405B with --tokens 15e12, 2048 x 8192 = 16,777,216 tokens a step: 15e12 / 16,777,216 =
 * 894,069.67, so 894,070 iterations; its recipe (Llama 3 paper sec. 3.4.1): peak 8e-5, minimum
 * 8e-7, 8,000 warm-up steps, cosine to the minimum at 1,200,000 (past the last iteration). */
static void test_llama3_405b_tokens(void)
{
    ModelSpec s = job("llama3-405b", 8, 16, 2048, 8192);
    s.layout.embed_in_split = s.layout.loss_in_split = 1; /* 126 + 2 layers over 16 stages */
    s.job.train_tokens = 15e12;
    const char *mg[] = {"    --lr 8e-05", "    --min-lr 8e-07", "    --lr-decay-style cosine",
                        "    --lr-warmup-iters 8000", "    --lr-decay-iters 1200000", "    --train-iters 894070",
                        "# training length: 894070 iterations = 15T tokens / (2048 sequences x 8192 tokens), rounded up: the plan's --tokens",
                        "# learning rate: peak 8e-05, minimum 8e-07, the model's published recipe",
                        "# warm-up: 8000 iterations, the recipe's steps", NULL};
    const char *mg_not[] = {"--train-iters 100\n", "--lr 0.001", "WARNING", "WSD", NULL};
    expect_format("megatron, llama3-405b 15T tokens", &s, "dgx-h100", 2048, EXPORT_MEGATRON, mg, mg_not);
    const char *br[] = {"train.micro_batch_size=1 train.global_batch_size=2048 train.train_iters=894070 rng.seed=1234",
                        "optimizer.lr=8e-05 optimizer.min_lr=8e-07 optimizer.weight_decay=0.1 optimizer.clip_grad=1",
                        "scheduler.lr_decay_style=cosine scheduler.lr_warmup_iters=8000 scheduler.lr_decay_iters=1200000",
                        NULL};
    expect_format("bridge, llama3-405b 15T tokens", &s, "dgx-h100", 2048, EXPORT_BRIDGE, br, mg_not);
    /* NeMo 1.x: the decay past the last step as the scheduler's own max_steps */
    const char *ne[] = {"trainer.devices=8 trainer.num_nodes=256 trainer.precision=bf16-mixed trainer.max_steps=894070",
                        "model.optim.sched.name=CosineAnnealing model.optim.sched.warmup_steps=8000 "
                        "model.optim.sched.constant_steps=0 model.optim.sched.min_lr=8e-07",
                        "+model.optim.sched.max_steps=1200000", NULL};
    expect_format("nemo, llama3-405b 15T tokens", &s, "dgx-h100", 2048, EXPORT_NEMO, ne, NULL);
    /* DeepSpeed: the cosine reaches 8e-7 / 8e-5 = 0.01 at total_num_steps, the decay's end */
    expect_deepspeed(&s, "dgx-h100", 2048, 8e-5, 1200000, 8000, 0.01);
    const char *tt[] = {"    --training.steps 894070 \\", "    --lr_scheduler.warmup_steps 8000 \\",
                        "    --lr_scheduler.decay_ratio None \\", "    --lr_scheduler.min_lr_factor 0.01 \\",
                        "    --optimizer.param_groups.0.optimizer_kwargs.lr 8e-05 \\",
                        "# NOT EXPRESSIBLE: the minimum learning rate at iteration 1200000: torchtitan's decay ends at the last",
                        NULL};
    expect_format("torchtitan, llama3-405b 15T tokens", &s, "dgx-h100", 2048, EXPORT_TORCHTITAN, tt, NULL);
    const char *tm[] = {"steps = 894070", "warmup_steps = 8000", "lr = 8e-05", "min_lr_factor = 0.01", NULL};
    expect_format("torchtitan-toml, llama3-405b 15T tokens", &s, "dgx-h100", 2048, EXPORT_TORCHTITAN_TOML, tm, NULL);
    /* Slurm: parallax run for the iterations, with the plan's own (default) schedule said */
    const char *sl[] = {"srun --ntasks=2048 --cpus-per-task=3 --gpu-bind=none \"$PARALLAX\" run \"$PLAN\" --launcher none --steps 894070",
                        "# WARNING: not the model's published recipe (peak 8e-05, minimum 8e-07, warm-up 8000): plan with --lr 8e-05",
                        NULL};
    expect_format("slurm, llama3-405b 15T tokens", &s, "dgx-h100", 2048, EXPORT_SLURM, sl, NULL);
}

/* DeepSeek-V3 without --tokens: its recipe's 14.8T tokens at 4096 x 4096 = 16,777,216 a step,
 * 882,148.4 -> 882,149 iterations; warm-up-stable-decay: the minimum at 14.3T tokens (852,346.4
 * -> 852,347), the cosine over the last 4.3T of them (256,299.97 -> 256,300); 2,000 warm-up. */
static void test_deepseek_v3_recipe(void)
{
    ModelSpec s = job("deepseek-v3", 2, 1, 4096, 4096);
    s.layout.ep = 64;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    const char *mg[] = {"    --lr 0.00022", "    --min-lr 2.2e-05", "    --lr-decay-style WSD",
                        "    --lr-wsd-decay-style cosine", "    --lr-wsd-decay-iters 256300",
                        "    --lr-warmup-iters 2000", "    --lr-decay-iters 852347", "    --train-iters 882149",
                        "# training length: 882149 iterations = 14.8T tokens / (4096 sequences x 4096 tokens), rounded up: "
                        "the recipe's tokens (plan with --tokens N for another length)",
                        "# decay: warm-up-stable-decay, held at the peak to iteration 596047, then cosine to the minimum at "
                        "852347, held there to the end",
                        NULL};
    expect_format("megatron, deepseek-v3 recipe", &s, "dgx-h100", 1024, EXPORT_MEGATRON, mg, NULL);
    const char *br[] = {"scheduler.lr_decay_style=WSD scheduler.lr_warmup_iters=2000 scheduler.lr_decay_iters=852347 "
                        "scheduler.lr_wsd_decay_style=cosine scheduler.lr_wsd_decay_iters=256300",
                        NULL};
    expect_format("bridge, deepseek-v3 recipe", &s, "dgx-h100", 1024, EXPORT_BRIDGE, br, NULL);
    /* NeMo 1.x: min at 852,347, held for 882,149 - 852,347 = 29,802; no stable phase */
    const char *ne[] = {"model.optim.sched.name=CosineAnnealing model.optim.sched.warmup_steps=2000 "
                        "model.optim.sched.constant_steps=29802 model.optim.sched.min_lr=2.2e-05",
                        "# NOT EXPRESSIBLE: the peak held to iteration 596047 before the cosine decay (NeMo 1.x's CosineAnnealing",
                        NULL};
    expect_format("nemo, deepseek-v3 recipe", &s, "dgx-h100", 1024, EXPORT_NEMO, ne, NULL);
    /* torchtitan: the decay as its share of the steps, 256,300 / 882,149 */
    char ratio[96];
    snprintf(ratio, sizeof ratio, "    --lr_scheduler.decay_ratio %.12g \\", 256300.0 / 882149.0);
    const char *tt[] = {"    --training.steps 882149 \\", ratio, NULL};
    expect_format("torchtitan, deepseek-v3 recipe", &s, "dgx-h100", 1024, EXPORT_TORCHTITAN, tt, NULL);
    expect_deepspeed(&s, "dgx-h100", 1024, 2.2e-4, 882149, 2000, 0.1);
}

/* GPT-3 175B: warm-up and decay given in tokens (Brown et al. Appendix B), 1536 x 2048 =
 * 3,145,728 tokens a step: 375M -> 119.2 -> 120; 260B -> 82,651.9 -> 82,652; 300B -> 95,367.4
 * -> 95,368; peak 6e-5 (Table 2.1), 10% of it at the end. */
static void test_gpt3_tokens_recipe(void)
{
    ModelSpec s = job("gpt3-175b", 8, 12, 1536, 2048);
    s.layout.vpp = 2;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    const char *mg[] = {"    --lr 6e-05", "    --min-lr 6e-06", "    --lr-warmup-iters 120",
                        "    --lr-decay-iters 82652", "    --train-iters 95368",
                        "# warm-up: 120 iterations = the recipe's 375M tokens, rounded up", NULL};
    expect_format("megatron, gpt3-175b recipe", &s, "dgx-a100", 768, EXPORT_MEGATRON, mg, NULL);
    /* DeepSpeed reaches its minimum at total_num_steps: the last step here, said NOT EXPRESSIBLE */
    expect_deepspeed(&s, "dgx-a100", 768, 6e-5, 95368, 120, 0.1);
}

/* The plan's own figures win over the recipe: --lr 3e-4 --min-lr 3e-5 --warmup-steps 500
 * --tokens 1e12 on Llama 2 7B, 512 x 4096 = 2,097,152 a step: 476,837.16 -> 476,838. */
static void test_plan_wins(void)
{
    ModelSpec s = job("llama2-7b", 1, 1, 512, 4096);
    s.job.lr = 1.5e-4;
    s.job.min_lr = 1.5e-5;
    s.job.warmup_steps = 500;
    s.job.train_tokens = 1e12;
    const char *mg[] = {"    --lr 0.00015", "    --min-lr 1.5e-05", "    --lr-warmup-iters 500",
                        "    --lr-decay-iters 476838", "    --train-iters 476838",
                        "# learning rate: peak 0.00015, minimum 1.5e-05, the plan's --lr / --min-lr",
                        "# warm-up: 500 iterations, the plan's --warmup-steps", NULL};
    const char *not_mg[] = {"WARNING", "schedule from:", "3e-4", NULL};
    expect_format("megatron, llama2-7b plan's figures", &s, "dgx-h100", 8, EXPORT_MEGATRON, mg, not_mg);
}

/* No recipe (Llama 3 8B's paper gives none) and nothing set: parallax's defaults, said */
static void test_defaults_said(void)
{
    ModelSpec s = job("llama3-8b", 2, 1, 64, 8192);
    const char *mg[] = {"    --lr 0.001", "    --train-iters 100", "    --lr-warmup-iters 10",
                        "# WARNING: training length 100 iterations is parallax's default --steps, a test run: plan with "
                        "--tokens N (or --steps N) for a real one",
                        "# WARNING: learning rate peak 0.001, minimum 0.0001 are parallax's defaults, not tuned for this "
                        "model: plan with --lr X --min-lr X",
                        "# WARNING: warm-up 10 iterations is parallax's default: plan with --warmup-steps N", NULL};
    expect_format("megatron, defaults", &s, "dgx-h100", 16, EXPORT_MEGATRON, mg, NULL);
    const char *tt[] = {"# WARNING: training length 100 iterations is parallax's default --steps, a test run: plan with "
                        "--tokens N (or --steps N) for a real one",
                        NULL};
    expect_format("torchtitan, defaults", &s, "dgx-h100", 16, EXPORT_TORCHTITAN, tt, NULL);
    /* a zoo model resized is another model: Llama 3 405B's recipe does not follow it */
    ModelSpec r = job("llama3-405b", 8, 1, 64, 8192);
    r.model.layers = 8;
    const char *rs[] = {"    --lr 0.001", "    --train-iters 100", NULL};
    const char *not_rs[] = {"schedule from:", "8e-05", NULL};
    expect_format("megatron, resized llama3-405b", &r, "dgx-h100", 8, EXPORT_MEGATRON, rs, not_rs);
}

/* More iterations than a 32-bit counter: refused, naming the tokens and the fix */
static void test_too_long(void)
{
    ModelSpec s = job("llama3-8b", 2, 1, 64, 8192);
    s.job.train_tokens = 1e18; /* / 524,288 = 1.9e12 iterations */
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(&s, "dgx-h100", 16, &plan, &err), err);
    FILE *f = fopen("/dev/null", "w");
    CHECK(f != NULL);
    CHECK_INPUT_ERROR(export_plan(f, &plan, EXPORT_MEGATRON, &err), err,
                      "train_tokens 1e+18: 1.907e+12 iterations of 524288 tokens (global batch x sequence) exceed "
                      "2147483647");
    fclose(f);
    model_plan_free(&plan);
}

/* GPT-OSS-120B is torchtitan's own gpt_oss 120b: 0.3's --module gpt_oss --config gpt_oss_120b,
 * 0.2's model gpt_oss, flavor 120b; no placeholder, nothing said not expressible of the model */
static void test_titan_gpt_oss(void)
{
    ModelSpec s = job("gpt-oss-120b", 1, 1, 64, 4096);
    s.layout.ep = 8;
    const char *tt[] = {"    --module gpt_oss \\", "    --config gpt_oss_120b \\", NULL};
    const char *not_tt[] = {"MODULE", "CONFIG", "NOT EXPRESSIBLE: the model", NULL};
    expect_format("torchtitan, gpt-oss-120b", &s, "dgx-h100", 8, EXPORT_TORCHTITAN, tt, not_tt);
    const char *tm[] = {"name = \"gpt_oss\"", "flavor = \"120b\"", NULL};
    const char *not_tm[] = {"MODEL", "FLAVOR", "NOT EXPRESSIBLE: the model", NULL};
    expect_format("torchtitan-toml, gpt-oss-120b", &s, "dgx-h100", 8, EXPORT_TORCHTITAN_TOML, tm, not_tm);
    /* without its attention sinks it is no longer GPT-OSS: no flavor */
    s.model.attn_sinks = 0;
    const char *gone[] = {"    --module MODULE \\", NULL};
    expect_format("torchtitan, gpt-oss-120b without sinks", &s, "dgx-h100", 8, EXPORT_TORCHTITAN, gone, NULL);
}

int main(void)
{
    setenv("PARALLAX_UNCALIBRATED", "1", 1);
    px_log_set_quiet(1);
    test_llama3_405b_tokens();
    test_deepseek_v3_recipe();
    test_gpt3_tokens_recipe();
    test_plan_wins();
    test_defaults_said();
    test_too_long();
    test_titan_gpt_oss();
    TEST_DONE("export_train");
}
