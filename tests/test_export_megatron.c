/* The Megatron-LM and NeMo 1.x exports, line by line, where the real clients (tests/clients,
 * label clients) found them wanting: the launch environment as lines a shell sources
 * (CUDA_DEVICE_MAX_CONNECTIONS=1 for tp or cp > 1 before Blackwell, unset for Megatron FSDP),
 * MEGATRON_ARGS as a bash array, the tokenizer and vocabulary, an uneven split with unequal
 * middle stages as --pipeline-model-parallel-layout (MTP modules included), QK norms; NeMo 1.x's
 * '+' on keys megatron_gpt_config.yaml lacks and the architecture its defaults would replace. */
#include "export/export.h"
#include "fixtures.h"
#include "test.h"

static ModelSpec job(const char *model, int tp, int cp, int pp, int zero, int gbs, int seq)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(model, &s.model, &err), err);
    s.layout.tp = tp;
    s.layout.cp = cp;
    s.layout.pp = pp;
    s.layout.sp = tp > 1;
    s.layout.zero = zero;
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
    /* --format nemo writes the Megatron-Bridge overrides after NeMo 1.x's: keep NeMo 1.x's */
    char *bridge = fmt == EXPORT_NEMO ? strstr(buf, "\n# Megatron-Bridge") : NULL;
    if (fmt == EXPORT_NEMO)
        CHECK(bridge != NULL);
    if (bridge)
        bridge[1] = '\0';
    return buf;
}

/* llama3-8b, tp 2 cp 2 on 16 H100s: dp 4, 64 / (1 x 4) = 16 micro-batches */
static void test_env_tp(void)
{
    ModelSpec s = job("llama3-8b", 2, 2, 1, 1, 64, 8192);
    char *mg = export_of(&s, "dgx-h100", 16, EXPORT_MEGATRON);
    const char *want[] = {
        "# data-parallel size 4 follows from the world size; 16 micro-batches per step",
        "#   torchrun --nnodes 2 --nproc-per-node 8 ... pretrain_gpt.py \"${MEGATRON_ARGS[@]}\" --data-path ... (or --mock-data)",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1", "MEGATRON_ARGS=(", "    --tokenizer-type NullTokenizer",
        "    --vocab-size 128256", "    --make-vocab-size-divisible-by 1", "    --context-parallel-size 2",
        "    --seed 1234", ")", NULL};
    /* p2p is Megatron-LM's default: said by leaving the flag out */
    const char *not_want[] = {"unset", " \\\n", "--pipeline-model-parallel-layout", "--qk-layernorm",
                              "--cp-comm-type", NULL};
    expect_lines("megatron export (tp 2, cp 2)", mg, want, not_want);
    free(mg);

    char *ne = export_of(&s, "dgx-h100", 16, EXPORT_NEMO);
    const char *want_ne[] = {
        "trainer.devices=8 trainer.num_nodes=2 trainer.precision=bf16-mixed trainer.max_steps=100",
        "model.mcore_gpt=true model.megatron_amp_O2=true",
        "model.virtual_pipeline_model_parallel_size=null +model.context_parallel_size=2 model.sequence_parallel=true",
        "model.micro_batch_size=1 model.global_batch_size=64 model.encoder_seq_length=8192 model.max_position_embeddings=8192",
        "model.num_query_groups=8 model.kv_channels=128 model.normalization=rmsnorm model.layernorm_epsilon=1e-05",
        "model.activation=fast-swiglu model.bias=false model.share_embeddings_and_output_weights=false",
        "model.position_embedding_type=rope +model.rotary_base=500000 model.make_vocab_size_divisible_by=1",
        "# the vocabulary (128256, padded to 128256) comes from model.tokenizer.*, the data's tokenizer", NULL};
    const char *not_ne[] = {" model.context_parallel_size", "decoder_block_gpt", "+model.qk_layernorm",
                            "cp_comm_type", NULL};
    expect_lines("nemo export (tp 2, cp 2)", ne, want_ne, not_ne);
    free(ne);
}

/* The context-parallel comm types in Megatron-Core's spelling, cp 4 at 32k tokens */
static void test_cp_comm(void)
{
    static const char *const mg_want[] = {"    --cp-comm-type all_gather", "    --cp-comm-type a2a"};
    static const char *const ne_want[] = {"+model.cp_comm_type=all_gather", "+model.cp_comm_type=a2a"};
    for (int i = 0; i < 2; i++) {
        ModelSpec s = job("llama3-8b", 2, 4, 1, 1, 64, 32768);
        s.layout.cp_comm = i == 0 ? MODEL_CP_COMM_ALLGATHER : MODEL_CP_COMM_A2A;
        char *mg = export_of(&s, "dgx-h100", 16, EXPORT_MEGATRON);
        const char *want[] = {"    --context-parallel-size 4", mg_want[i], NULL};
        const char *not_want[] = {"allgather", NULL};
        expect_lines("megatron export (cp 4, cp comm type)", mg, want, not_want);
        free(mg);
        char *ne = export_of(&s, "dgx-h100", 16, EXPORT_NEMO);
        const char *want_ne[] = {ne_want[i], NULL};
        expect_lines("nemo export (cp 4, cp comm type)", ne, want_ne, not_want);
        free(ne);
    }
}

/* ZeRO-2 is Megatron FSDP, which wants CUDA_DEVICE_MAX_CONNECTIONS unset or > 1; one micro-batch */
static void test_env_fsdp(void)
{
    ModelSpec s = job("llama3-8b", 2, 1, 1, 2, 4, 4096);
    char *mg = export_of(&s, "dgx-h100", 8, EXPORT_MEGATRON);
    const char *want[] = {"# data-parallel size 4 follows from the world size; 1 micro-batch per step",
                          "unset CUDA_DEVICE_MAX_CONNECTIONS", "    --use-megatron-fsdp",
                          "    --ckpt-format fsdp_dtensor", NULL};
    const char *not_want[] = {"export CUDA_DEVICE_MAX_CONNECTIONS", "micro-batches", NULL};
    expect_lines("megatron export (FSDP)", mg, want, not_want);
    free(mg);
}

/* Blackwell: validate_args asks nothing of the environment for tp > 1 */
static void test_env_blackwell(void)
{
    ModelSpec s = job("llama3-8b", 2, 1, 1, 1, 64, 4096);
    char *mg = export_of(&s, "dgx-b200", 8, EXPORT_MEGATRON);
    const char *want[] = {
        "# on Blackwell validate_args no longer asks for CUDA_DEVICE_MAX_CONNECTIONS=1 with tp or cp > 1", NULL};
    const char *not_want[] = {"export CUDA_DEVICE_MAX_CONNECTIONS", "unset", NULL};
    expect_lines("megatron export (B200)", mg, want, not_want);
    free(mg);
}

/* GPT-3 1.3B: the GPT architecture, learned positions of the model's 2048 */
static void test_gpt(void)
{
    ModelSpec s = job("gpt3-1.3b", 1, 1, 1, 1, 64, 1024);
    char *ne = export_of(&s, "dgx-a100", 8, EXPORT_NEMO);
    const char *want[] = {
        "model.micro_batch_size=1 model.global_batch_size=64 model.encoder_seq_length=1024 model.max_position_embeddings=2048",
        "model.activation=gelu model.bias=true model.share_embeddings_and_output_weights=true",
        "model.position_embedding_type=learned_absolute model.make_vocab_size_divisible_by=1", NULL};
    const char *not_want[] = {"rotary_base", "export CUDA", NULL};
    expect_lines("nemo export (GPT-3)", ne, want, not_want);
    free(ne);
}

/* DeepSeek-V3 on 4 stages of 15,16,14,16 layers: unequal middle stages go as Megatron-Core's
 * layout, its MTP module on the last stage before the loss; NeMo 1.x cannot say the split */
static void test_layout(void)
{
    ModelSpec s = job("deepseek-v3", 1, 1, 4, 1, 256, 4096);
    s.layout.ep = 8;
    s.layout.etp = 1;
    const int split[] = {15, 16, 14, 16};
    s.layout.n_stage_layers = 4;
    memcpy(s.layout.stage_layers, split, sizeof split);
    char *mg = export_of(&s, "dgx-h100", 32, EXPORT_MEGATRON);
    const char *want[] = {"    --pipeline-model-parallel-layout 'Et*15|t*16|t*14|t*16mL'", "    --mtp-num-layers 1",
                          "    --kv-channels 192", NULL};
    const char *not_want[] = {"--decoder-first-pipeline-num-layers", "NOT EXPRESSIBLE: the uneven", NULL};
    expect_lines("megatron export (layout)", mg, want, not_want);
    free(mg);

    char *ne = export_of(&s, "dgx-h100", 32, EXPORT_NEMO);
    const char *want_ne[] = {
        "# NOT EXPRESSIBLE in NeMo 1.x: the uneven pipeline split 15,16,14,16 has middle stages of different sizes (num_layers_in_first/last_pipeline_stage",
        "+model.name=decoder_block_gpt",
        "+model.num_moe_experts=256 +model.moe_router_topk=8 ++model.expert_model_parallel_size=8 +model.expert_tensor_parallel_size=1",
        "+model.moe_token_dispatcher_type=alltoall +model.moe_grouped_gemm=true",
        "# NOT EXPRESSIBLE in NeMo 1.x: 1 multi-token prediction module (MegatronGPTModel builds", NULL};
    const char *not_ne[] = {"num_layers_in_first_pipeline_stage", "mtp_num_layers", NULL};
    expect_lines("nemo export (layout)", ne, want_ne, not_ne);
    free(ne);
    /* Megatron-LM's DeepSeek-V3 example, the module on a stage of its own: the string as given,
     * which says the 32 virtual stages itself */
    ModelSpec m = job("deepseek-v3", 2, 1, 16, 1, 256, 4096);
    m.layout.ep = 8;
    m.layout.etp = 1;
    snprintf(m.layout.pp_layout, sizeof m.layout.pp_layout, "Et*3|(tt|)*29,m|L");
    mg = export_of(&m, "dgx-h100", 256, EXPORT_MEGATRON);
    const char *want_m[] = {"    --pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'", "    --mtp-num-layers 1",
                            "    --pipeline-model-parallel-size 16", NULL};
    const char *not_m[] = {"--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage",
                           "--decoder-first-pipeline-num-layers", NULL};
    expect_lines("megatron export (standalone MTP stage)", mg, want_m, not_m);
    free(mg);
}

/* An uneven split of the first/last form: NeMo 2.3.0 on takes it; Qwen3's QK norms */
static void test_first_last(void)
{
    ModelSpec s = job("qwen3-30b-a3b", 1, 1, 4, 1, 256, 4096);
    s.layout.ep = 8;
    s.layout.etp = 1;
    const int split[] = {11, 13, 13, 11};
    s.layout.n_stage_layers = 4;
    memcpy(s.layout.stage_layers, split, sizeof split);
    char *mg = export_of(&s, "dgx-h100", 32, EXPORT_MEGATRON);
    const char *want[] = {"    --decoder-first-pipeline-num-layers 11", "    --decoder-last-pipeline-num-layers 11",
                          "    --qk-layernorm", NULL};
    const char *not_want[] = {"--pipeline-model-parallel-layout", NULL};
    expect_lines("megatron export (first/last)", mg, want, not_want);
    free(mg);

    char *ne = export_of(&s, "dgx-h100", 32, EXPORT_NEMO);
    const char *want_ne[] = {
        "+model.num_layers_in_first_pipeline_stage=11 +model.num_layers_in_last_pipeline_stage=11",
        "# the uneven pipeline split 11,13,13,11: NeMo 2.3.0 on; 1.23.0 splits evenly", "+model.qk_layernorm=true",
        "+model.name=decoder_block_gpt", NULL};
    const char *not_ne[] = {"NOT EXPRESSIBLE in NeMo 1.x: the uneven", "moe_layer_freq=[", NULL};
    expect_lines("nemo export (first/last)", ne, want_ne, not_ne);
    free(ne);
}

/* Sharded data parallelism and offload (docs/exports.md): llama3-8b on 32 H100s, dp 32 as HSDP
 * 8 x 4, FSDP, full recompute, optimizer offload, buckets of 5e8 bytes (2.5e8 bf16 parameters,
 * 1.25e8 fp32 gradients); then the same without HSDP but with the parameters kept gathered. */
static void test_sharding(void)
{
    ModelSpec s = job("llama3-8b", 1, 1, 1, 3, 64, 8192);
    s.layout.fsdp = 1;
    s.layout.dp_shard = 8;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    s.layout.offload_optimizer = 1;
    s.layout.bucket_bytes = 5e8;
    char *mg = export_of(&s, "dgx-h100", 32, EXPORT_MEGATRON);
    const char *want[] = {"    --use-megatron-fsdp", "    --data-parallel-sharding-strategy optim_grads_params",
                          "    --num-distributed-optimizer-instances 4", "    --ddp-bucket-size 250000000",
                          "    --optimizer-cpu-offload", "    --optimizer-offload-fraction 1.0",
                          "    --use-precision-aware-optimizer", NULL};
    const char *not_want[] = {"NOT EXPRESSIBLE", "DeepSpeed ZeRO-3's gathers", "--cpu-offloading-num-layers", NULL};
    expect_lines("megatron export (HSDP, offload)", mg, want, not_want);
    free(mg);
    char *ds = export_of(&s, "dgx-h100", 32, EXPORT_DEEPSPEED);
    const char *want_ds[] = {"\t\t\"stage\":\t3,", "\t\t\"reduce_bucket_size\":\t125000000,",
                             "\t\t\"stage3_prefetch_bucket_size\":\t250000000,", "\t\t\"offload_optimizer\":\t{",
                             "\t\t\t\"device\":\t\"cpu\",", "\t\t\"cpu_checkpointing\":\tfalse", NULL};
    expect_lines("deepspeed export (HSDP, offload)", ds, want_ds, (const char *const[]){"stage3_max_live_parameters", NULL});
    free(ds);
    char *br = export_of(&s, "dgx-h100", 32, EXPORT_BRIDGE);
    const char *want_br[] = {"optimizer.optimizer_cpu_offload=true optimizer.optimizer_offload_fraction=1.0",
                             "ddp.num_distributed_optimizer_instances=4 ddp.bucket_size=250000000", NULL};
    expect_lines("bridge export (HSDP, offload)", br, want_br, (const char *const[]){"optimizer.use_precision_aware_optimizer=false", NULL});
    free(br);

    s.layout.fsdp = 0;
    s.layout.dp_shard = 0;
    s.layout.offload_optimizer = 0;
    s.layout.bucket_bytes = 0;
    s.layout.keep_gathered = 1;
    s.layout.offload_activations = 1;
    mg = export_of(&s, "dgx-h100", 32, EXPORT_MEGATRON);
    const char *want2[] = {
        "# NOT EXPRESSIBLE: activation offload with recompute: Megatron-Core's CPU offloading (--cpu-offloading-num-layers) refuses pipeline parallelism and recompute",
        "# NOT EXPRESSIBLE: parameters kept gathered from forward to backward: Megatron-FSDP reshards after every forward (--torch-fsdp2-no-reshard-after-forward is torch FSDP2's, --use-torch-fsdp2)",
        NULL};
    expect_lines("megatron export (kept gathered)", mg, want2,
                 (const char *const[]){"    --num-distributed-optimizer-instances", "    --optimizer-cpu-offload", NULL});
    free(mg);
    ds = export_of(&s, "dgx-h100", 32, EXPORT_DEEPSPEED);
    /* llama3-8b's 8,030,261,248 parameters: nothing released below them */
    const char *want_ds2[] = {"\t\t\"stage3_max_live_parameters\":\t8030261248,",
                              "\t\t\"stage3_max_reuse_distance\":\t8030261248", "\t\t\"cpu_checkpointing\":\ttrue", NULL};
    expect_lines("deepspeed export (kept gathered)", ds, want_ds2, (const char *const[]){"offload_optimizer", NULL});
    free(ds);
}

int main(void)
{
    px_log_set_quiet(1);
    test_sharding();
    test_env_tp();
    test_cp_comm();
    test_env_fsdp();
    test_env_blackwell();
    test_gpt();
    test_layout();
    test_first_last();
    TEST_DONE("export_megatron");
}
