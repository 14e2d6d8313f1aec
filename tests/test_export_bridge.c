/* The Megatron-Bridge export line by line: which recipe it names for which model (Megatron-Bridge
 * 0.6.2's, export/bridge.c lists them), the architecture a borrowed recipe's model is given,
 * the pipeline split as first/last counts or as Megatron-Core's layout string, the keys a
 * recipe sets that the plan resets, and the shell quoting of the override words. The real client
 * takes every plan of tests/clients/plans.txt in tests/clients/bridge_check.py. */
#include "export/export.h"
#include "fixtures.h"
#include "test.h"

static ModelSpec spec(const char *model, int tp, int pp)
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
    s.job.global_batch = 64;
    s.job.precision = PX_BF16;
    return s;
}

static char *bridge_of(const ModelSpec *s, const char *cluster, int gpus)
{
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(s, cluster, gpus, &plan, &err), err);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    CHECK_OK(export_plan(f, &plan, EXPORT_BRIDGE, &err), err);
    fclose(f);
    model_plan_free(&plan);
    return buf;
}

/* every line of want is a whole line of text, no string of not_want is in it */
/* Llama 3 8B is a recipe of its own: named, run by run_recipe.py on the plan's nodes */
static void test_own_recipe(void)
{
    ModelSpec s = spec("llama3-8b", 2, 1);
    s.layout.cp = 2;
    s.job.seq_len = 8192;
    char *out = bridge_of(&s, "dgx-h100", 16);
    const char *want[] = {
        "# recipe: llama3_8b_pretrain_config (the model's own)",
        "# run: torchrun --nnodes 2 --nproc-per-node 8 scripts/training/run_recipe.py --recipe llama3_8b_pretrain_config \\",
        "model.tensor_model_parallel_size=2 model.pipeline_model_parallel_size=1 "
        "model.virtual_pipeline_model_parallel_size=null model.context_parallel_size=2 model.sequence_parallel=true "
        "model.cp_comm_type=p2p",
        "model.num_layers=32 model.hidden_size=4096 model.ffn_hidden_size=14336 model.num_attention_heads=32 "
        "model.num_query_groups=8 model.kv_channels=128",
        "model.vocab_size=128256 tokenizer.vocab_size=128256 model.seq_length=8192 dataset.seq_length=8192",
        "model.position_embedding_type=rope model.rotary_base=500000 model.rotary_scaling_factor=null "
        "model.rope_scaling=false model.hidden_dropout=0 model.attention_dropout=0",
        "comm_overlap=null model.tp_comm_overlap=false", "mixed_precision=bf16_mixed", NULL};
    /* its own tokenizer stays; dense: no expert keys but the reset of a recipe's */
    const char *not_want[] = {"tokenizer.tokenizer_type", "moe_router", "model.model.", NULL};
    expect_lines("bridge (llama3-8b)", out, want, not_want);
    free(out);
}

/* Llama 3.1: its own recipe, found through the rope scaling; Llama 3 405B has none (0.6.2's is
 * 3.1's), so Llama 3 8B's is borrowed with the architecture replaced and a NullTokenizer */
static void test_llama31_and_borrowed(void)
{
    ModelSpec s = spec("llama3-8b", 2, 1);
    s.model.rope_scaling.type = MODEL_ROPE_SCALING_LLAMA3;
    s.model.rope_scaling.factor = 8;
    s.model.rope_scaling.low_freq_factor = 1;
    s.model.rope_scaling.high_freq_factor = 4;
    s.model.rope_scaling.original_context = 8192;
    char *out = bridge_of(&s, "dgx-h100", 8);
    const char *want[] = {"# recipe: llama31_8b_pretrain_config (the model's own)",
                          "model.position_embedding_type=rope model.rotary_base=500000 model.rotary_scaling_factor=null "
                          "model.rope_scaling=true model.rope_scaling_factor=8 model.hidden_dropout=0 model.attention_dropout=0",
                          NULL};
    expect_lines("bridge (llama 3.1)", out, want, (const char *const[]){"NOT EXPRESSIBLE", NULL});
    free(out);
    /* a scaling Megatron-Core cannot take (it fixes the original context at 8192) */
    s.model.rope_scaling.original_context = 4096;
    out = bridge_of(&s, "dgx-h100", 8);
    const char *want4k[] = {"# recipe: llama3_8b_pretrain_config (the nearest: the architecture below replaces its model's)",
                            "# NOT EXPRESSIBLE: llama3 rope scaling with low/high frequency factors 1/4 and an original", NULL};
    expect_lines("bridge (llama3 scaling, 4k)", out, want4k, NULL);
    free(out);

    s = spec("llama3-405b", 8, 9);
    s.job.global_batch = 512;
    out = bridge_of(&s, "dgx-h100", 576);
    const char *want405[] = {
        "# recipe: llama3_8b_pretrain_config (the nearest: the architecture below replaces its model's)",
        "# its tokenizer is replaced by a NullTokenizer of the model's vocabulary: set your own",
        "model.num_layers=126 model.hidden_size=16384 model.ffn_hidden_size=53248 model.num_attention_heads=128 "
        "model.num_query_groups=8 model.kv_channels=128",
        "tokenizer.tokenizer_type=NullTokenizer tokenizer.tokenizer_model=null", NULL};
    expect_lines("bridge (llama3-405b)", out, want405, NULL);
    free(out);
}

/* GPT-3: 0.6's GPT-3 recipe, among run_recipe.py's names; a GPT of another size borrows it; fp16
 * with fp32 gradients is not fp16_mixed (which reduces them in fp16): a whole MixedPrecisionConfig */
static void test_gpt3(void)
{
    ModelSpec s = spec("gpt3-1.3b", 1, 1);
    s.job.precision = PX_FP16;
    s.job.micro_batch = 4;
    s.job.global_batch = 256;
    char *out = bridge_of(&s, "dgx-a100", 8);
    const char *want[] = {
        "# recipe: gpt3_175b_pretrain_32gpu_h100_bf16_config (the nearest: the architecture below replaces its model's)",
        "# run: torchrun --nnodes 1 --nproc-per-node 8 scripts/training/run_recipe.py --recipe "
        "gpt3_175b_pretrain_32gpu_h100_bf16_config \\",
        "model.num_layers=24 model.hidden_size=2048 model.ffn_hidden_size=8192 model.num_attention_heads=16 "
        "model.num_query_groups=16 model.kv_channels=128",
        "model.vocab_size=50257 tokenizer.vocab_size=50257 model.seq_length=2048 dataset.seq_length=2048",
        "model.normalization=LayerNorm model.layernorm_epsilon=1e-05 model.layernorm_zero_centered_gamma=false "
        "model.gated_linear_unit=false model.add_bias_linear=true model.add_qkv_bias=true model.qk_layernorm=false "
        "model.share_embeddings_and_output_weights=true",
        "model.position_embedding_type=learned_absolute model.hidden_dropout=0 model.attention_dropout=0",
        "'~mixed_precision' '+mixed_precision={_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,"
        "fp32:false,fp16:true,bf16:false,params_dtype:{_target_:torch.float16,_call_:false},"
        "pipeline_dtype:{_target_:torch.float16,_call_:false},autocast_enabled:false,grad_reduce_in_fp32:true,"
        "first_last_layers_bf16:false,num_layers_at_start_in_bf16:0,num_layers_at_end_in_bf16:0}'",
        NULL};
    expect_lines("bridge (gpt3-1.3b fp16)", out, want, (const char *const[]){"dataclasses.replace", NULL});
    free(out);
    /* the 175B model is the recipe's own; vpp 2, and the padded vocabulary is the model's */
    s = spec("gpt3-175b", 8, 12);
    s.layout.vpp = 2;
    s.layout.schedule = MODEL_SCHED_INTERLEAVED;
    s.job.global_batch = 1536;
    out = bridge_of(&s, "dgx-a100", 768);
    const char *want175[] = {
        "# recipe: gpt3_175b_pretrain_32gpu_h100_bf16_config (the model's own)",
        "model.tensor_model_parallel_size=8 model.pipeline_model_parallel_size=12 "
        "model.virtual_pipeline_model_parallel_size=2 model.context_parallel_size=1 model.sequence_parallel=true",
        "model.vocab_size=50264 tokenizer.vocab_size=50257 model.seq_length=2048 dataset.seq_length=2048", NULL};
    expect_lines("bridge (gpt3-175b)", out, want175, (const char *const[]){"tokenizer.tokenizer_type", NULL});
    free(out);
}

/* DeepSeek-V3's uneven split: the middle stages differ, so Megatron-Core's layout string, with the
 * prediction module (m) on the last stage and the word quoted for the shell; plain RoPE */
static void test_deepseek_split(void)
{
    ModelSpec s = spec("deepseek-v3", 2, 16);
    s.layout.cp = 2;
    s.layout.ep = 64;
    s.layout.etp = 1;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    s.job.global_batch = 4096;
    const int split[16] = {3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3};
    s.layout.n_stage_layers = 16;
    memcpy(s.layout.stage_layers, split, sizeof split);
    char *out = bridge_of(&s, "dgx-h100", 1024);
    const char *want[] = {
        "# recipe: deepseek_v3_pretrain_config (the model's own)",
        "'model.pipeline_model_parallel_layout=\"Et*3|t*3|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*3mL\"' "
        "model.num_layers_in_first_pipeline_stage=null model.num_layers_in_last_pipeline_stage=null "
        "model.account_for_embedding_in_pipeline_split=false model.account_for_loss_in_pipeline_split=false",
        "model.num_moe_experts=256 model.moe_router_topk=8 model.expert_model_parallel_size=64 "
        "model.expert_tensor_parallel_size=1",
        "model.moe_ffn_hidden_size=2048 model.moe_shared_expert_intermediate_size=2048 model.moe_shared_expert_gate=false",
        "model.moe_router_score_function=sigmoid model.moe_router_num_groups=8 model.moe_router_group_topk=4 "
        "model.moe_aux_loss_coeff=0.001",
        "model.multi_latent_attention=true model.q_lora_rank=1536 model.kv_lora_rank=512 model.qk_head_dim=128 "
        "model.qk_pos_emb_head_dim=64 model.v_head_dim=128",
        "model.rope_type=rope model.apply_rope_fusion=false model.mtp_num_layers=1",
        "model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1", NULL};
    const char *not_want[] = {"model.kv_channels", "NOT EXPRESSIBLE", NULL};
    expect_lines("bridge (deepseek-v3)", out, want, not_want);
    CHECK(strstr(out, "'model.moe_layer_freq=[0,0,0,1,1,") != NULL);
    free(out);
    /* Megatron-LM's own string with the module on a stage of its own, 32 virtual stages: as
     * given */
    s = spec("deepseek-v3", 2, 16);
    s.layout.cp = 2;
    s.layout.ep = 64;
    s.layout.etp = 1;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    s.job.global_batch = 4096;
    snprintf(s.layout.pp_layout, sizeof s.layout.pp_layout, "Et*3|(tt|)*29,m|L");
    out = bridge_of(&s, "dgx-h100", 1024);
    const char *want_m[] = {
        "'model.pipeline_model_parallel_layout=\"Et*3|(tt|)*29,m|L\"' "
        "model.num_layers_in_first_pipeline_stage=null model.num_layers_in_last_pipeline_stage=null "
        "model.account_for_embedding_in_pipeline_split=false model.account_for_loss_in_pipeline_split=false",
        "model.rope_type=rope model.apply_rope_fusion=false model.mtp_num_layers=1", NULL};
    expect_lines("bridge (deepseek-v3, standalone MTP stage)", out, want_m,
                 (const char *const[]){"NOT EXPRESSIBLE", NULL});
    free(out);
    /* first and last alone: counts, no layout */
    s = spec("llama3-70b", 8, 4);
    const int split4[4] = {19, 20, 20, 21};
    s.layout.n_stage_layers = 4;
    memcpy(s.layout.stage_layers, split4, sizeof split4);
    out = bridge_of(&s, "dgx-h100", 64);
    const char *want4[] = {"model.pipeline_model_parallel_layout=null model.num_layers_in_first_pipeline_stage=19 "
                           "model.num_layers_in_last_pipeline_stage=21 model.account_for_embedding_in_pipeline_split=false "
                           "model.account_for_loss_in_pipeline_split=false",
                           NULL};
    expect_lines("bridge (llama3-70b uneven)", out, want4, NULL);
    free(out);
}

/* a MoE model Megatron-Bridge has no recipe for borrows Qwen3-MoE's (SiLU experts) */
static void test_moe_borrowed(void)
{
    ModelSpec s = spec("mixtral-8x7b", 2, 2);
    s.layout.ep = 8;
    s.layout.etp = 1;
    s.job.seq_len = 4096;
    s.job.global_batch = 256;
    char *out = bridge_of(&s, "dgx-h100", 32);
    const char *want[] = {"# recipe: qwen3_30b_a3b_pretrain_config (the nearest: the architecture below replaces its model's)",
                          "model.moe_ffn_hidden_size=14336 model.moe_shared_expert_intermediate_size=null "
                          "model.moe_shared_expert_gate=false",
                          "model.moe_router_score_function=softmax model.moe_router_num_groups=null "
                          "model.moe_router_group_topk=null model.moe_aux_loss_coeff=0.02",
                          "tokenizer.tokenizer_type=NullTokenizer tokenizer.tokenizer_model=null", NULL};
    expect_lines("bridge (mixtral)", out, want, NULL);
    free(out);
}

/* The MoE recipes 0.6 added: GPT-OSS-120B's own, whose provider has its biases and attention sinks
 * (nothing said NOT EXPRESSIBLE), and Qwen3-235B-A22B's */
static void test_moe_recipes_06(void)
{
    ModelSpec s = spec("gpt-oss-120b", 1, 1);
    s.layout.ep = 8;
    char *out = bridge_of(&s, "dgx-h100", 8);
    const char *want[] = {"# recipe: gpt_oss_120b_pretrain_config (the model's own)",
                          "model.num_moe_experts=128 model.moe_router_topk=4 model.expert_model_parallel_size=8 "
                          "model.expert_tensor_parallel_size=1",
                          "model.rotary_base=150000 model.hidden_dropout=0 model.attention_dropout=0", NULL};
    /* its biases and YaRN RoPE stay the recipe's */
    expect_lines("bridge (gpt-oss-120b)", out, want,
                 (const char *const[]){"NOT EXPRESSIBLE", "NullTokenizer", "add_bias_linear", "position_embedding_type",
                                       NULL});
    free(out);
    s = spec("qwen3-235b-a22b", 4, 1);
    s.layout.ep = 2;
    out = bridge_of(&s, "dgx-h100", 8);
    const char *want_q[] = {"# recipe: qwen3_235b_a22b_pretrain_config (the model's own)", NULL};
    expect_lines("bridge (qwen3-235b-a22b)", out, want_q, NULL);
    free(out);
}

int main(void)
{
    px_log_set_quiet(1);
    test_moe_recipes_06();
    test_own_recipe();
    test_llama31_and_borrowed();
    test_gpt3();
    test_deepseek_split();
    test_moe_borrowed();
    TEST_DONE("export_bridge");
}
