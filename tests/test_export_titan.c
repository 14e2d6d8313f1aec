/* The torchtitan exports line by line, for two plans: a llama3-8b ZeRO-3 layout torchtitan
 * expresses whole (FSDP, TP with SP, CP, full recompute), and a GPT-3 layout with what
 * torchtitan cannot say (not a torchtitan model, fp16, plain DP beside TP, TP without SP, an
 * uneven GPipe split, selective recompute, SGD, dropout, no clipping). The keys are torchtitan
 * 0.3.0's command line and 0.2.1's TOML job file (export/titan.c cites the files);
 * tests/clients/torchtitan_check.py loads every export with torchtitan's own config manager. */
#include "export/export.h"
#include "fixtures.h"
#include "test.h"

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

/* llama3-8b on 16 H100s: dp 4 x tp 2 x cp 2, ZeRO-3, full recompute, 64 sequences of 8192 in
 * micro-batches of 1 (16 gradient accumulation steps), DP and TP overlapped (async TP, which
 * needs torch.compile): nothing unexpressible */
static void test_fsdp(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-8b", &s.model, &err), err);
    s.layout.tp = 2;
    s.layout.cp = 2;
    s.layout.cp_comm = MODEL_CP_COMM_ALLGATHER; /* torchtitan 0.3's only way */
    s.layout.sp = 1;
    s.layout.zero = 3;
    s.layout.overlap_dp = 1;
    s.layout.overlap_tp = 1;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    s.job.global_batch = 64;
    s.job.seq_len = 8192;
    s.job.precision = PX_BF16;
    char *cli = export_of(&s, "dgx-h100", 16, EXPORT_TORCHTITAN);
    const char *want_cli[] = {
        "# torchtitan 0.3 command line for llama3-8b on 16 GPUs (dgx-h100), written by parallax:",
        "# torchtitan's llama3 8B is Llama 3.1's, RoPE scaled (factor 8 over 8192 positions)",
        "# tensor parallelism with sequence parallelism: enable_sequence_parallel, torchtitan's default",
        "# TP communication overlapped with the GEMMs: torchtitan's async TP, which needs torch.compile",
        "torchrun --nnodes 2 --nproc_per_node 8 -m torchtitan.train \\",
        "    --module llama3 \\",
        "    --config llama3_8b \\",
        "    --parallelism.data_parallel_replicate_degree 1 \\",
        "    --parallelism.data_parallel_shard_degree 4 \\",
        "    --parallelism.fsdp_reshard_after_forward always \\",
        "    --parallelism.tensor_parallel_degree 2 \\",
        "    --parallelism.enable_sequence_parallel \\",
        "    --parallelism.context_parallel_degree 2 \\",
        "    --parallelism.pipeline_parallel_degree 1 \\",
        "    --parallelism.expert_parallel_degree 1 \\",
        "    --compile.enable \\",
        "    --compile.enable_async_tensor_parallel \\",
        "    --training.local_batch_size 1 \\",
        "    --training.global_batch_size 64 \\",
        "    --training.seq_len 8192 \\",
        "    --training.steps 100 \\",
        "    --training.max_norm 1 \\",
        "    --training.mixed_precision_param bfloat16 \\",
        "    --training.mixed_precision_reduce float32 \\",
        "    --optimizer.param_groups.0.optimizer_name AdamW \\",
        "    --optimizer.param_groups.0.optimizer_kwargs.lr 0.001 \\",
        "    --optimizer.param_groups.0.optimizer_kwargs.betas 0.9 0.95 \\",
        "    --optimizer.param_groups.0.optimizer_kwargs.eps 1e-08 \\",
        "    --optimizer.param_groups.0.optimizer_kwargs.weight_decay 0.1 \\",
        "    --lr_scheduler.warmup_steps 10 \\",
        "    --lr_scheduler.decay_ratio None \\",
        "    --lr_scheduler.decay_type cosine \\",
        "    --lr_scheduler.min_lr_factor 0.1 \\",
        "    --debug.seed 1234 \\",
        "    activation-checkpoint:full",
        NULL};
    const char *not_cli[] = {"NOT EXPRESSIBLE", "pipeline_parallel_schedule", "disable_cuda_graphs", "MODULE",
                             "no_enable_async", NULL};
    expect_lines("torchtitan 0.3 export (FSDP)", cli, want_cli, not_cli);
    free(cli);
    char *toml = export_of(&s, "dgx-h100", 16, EXPORT_TORCHTITAN_TOML);
    const char *want_toml[] = {
        "# torchtitan 0.2 job file for llama3-8b on 16 GPUs (dgx-h100), written by parallax; run it as",
        "# torchrun --nnodes 2 --nproc_per_node 8 -m torchtitan.train --job.config_file FILE",
        "[model]", "name = \"llama3\"", "flavor = \"8B\"",
        "[optimizer]", "name = \"AdamW\"", "lr = 0.001", "beta1 = 0.9", "beta2 = 0.95", "eps = 1e-08",
        "weight_decay = 0.1",
        "[lr_scheduler]", "warmup_steps = 10", "decay_type = \"cosine\"", "min_lr_factor = 0.1",
        "[training]", "local_batch_size = 1", "global_batch_size = 64", "seq_len = 8192", "steps = 100",
        "max_norm = 1.0", "mixed_precision_param = \"bfloat16\"", "mixed_precision_reduce = \"float32\"",
        "[parallelism]", "data_parallel_replicate_degree = 1", "data_parallel_shard_degree = 4",
        "fsdp_reshard_after_forward = \"always\"", "tensor_parallel_degree = 2",
        "enable_async_tensor_parallel = true", "context_parallel_degree = 2", "pipeline_parallel_degree = 1",
        "context_parallel_rotate_method = \"allgather\"", "expert_parallel_degree = 1",
        "expert_tensor_parallel_degree = 1",
        "[activation_checkpoint]", "mode = \"full\"",
        "[compile]", "enable = true", "components = [\"model\", \"loss\"]",
        "[debug]", "seed = 1234",
        NULL};
    const char *not_toml[] = {"NOT EXPRESSIBLE", "converters", "pipeline_parallel_schedule", NULL};
    expect_lines("torchtitan 0.2 export (FSDP)", toml, want_toml, not_toml);
    free(toml);

    /* the ring: 0.2 rotates K and V one rank a step (alltoall); 0.3 cannot, and says so.
     * Ulysses: neither can */
    s.layout.cp_comm = MODEL_CP_COMM_P2P;
    toml = export_of(&s, "dgx-h100", 16, EXPORT_TORCHTITAN_TOML);
    const char *want_ring[] = {"context_parallel_rotate_method = \"alltoall\"", NULL};
    expect_lines("torchtitan 0.2 export (cp p2p)", toml, want_ring, not_toml);
    free(toml);
    cli = export_of(&s, "dgx-h100", 16, EXPORT_TORCHTITAN);
    const char *want_ring03[] = {
        "# NOT EXPRESSIBLE: the K/V ring (cp comm type p2p): torchtitan 0.3 has no rotate method and", NULL};
    expect_lines("torchtitan 0.3 export (cp p2p)", cli, want_ring03, NULL);
    free(cli);
    s.layout.cp_comm = MODEL_CP_COMM_A2A;
    toml = export_of(&s, "dgx-h100", 16, EXPORT_TORCHTITAN_TOML);
    const char *want_a2a[] = {
        "# NOT EXPRESSIBLE: Ulysses context parallelism (cp comm type a2a): torchtitan passes K and V",
        "# shards round the cp ranks and never splits the heads; written as the ring (context_parallel_rotate_method alltoall)",
        "context_parallel_rotate_method = \"alltoall\"", NULL};
    expect_lines("torchtitan 0.2 export (cp a2a)", toml, want_a2a, NULL);
    free(toml);
}

/* gpt3-1.3b on 8 A100s: dp 2 x tp 2 (no SP) x pp 2 split 10 | 14 under GPipe, ZeRO-0, fp16,
 * selective recompute, SGD, dropout, no gradient clipping; 32 sequences in micro-batches of 2:
 * 8 pipeline micro-batches per step, so a local batch of 16 */
static void test_unexpressible(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("gpt3-1.3b", &s.model, &err), err);
    s.layout.tp = 2;
    s.layout.pp = 2;
    s.layout.zero = 0;
    s.layout.overlap_dp = 1;
    s.layout.schedule = MODEL_SCHED_GPIPE;
    s.layout.n_stage_layers = 2;
    s.layout.stage_layers[0] = 10;
    s.layout.stage_layers[1] = 14;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    s.job.micro_batch = 2;
    s.job.global_batch = 32;
    s.job.precision = PX_FP16;
    s.job.optimizer = MODEL_OPT_SGD_MOMENTUM;
    s.job.dropout = 0.1;
    s.job.grad_clip = 0;
    char *cli = export_of(&s, "dgx-a100", 8, EXPORT_TORCHTITAN);
    const char *want_cli[] = {
        "# NOT EXPRESSIBLE: the model gpt3-1.3b: torchtitan builds only its own model families (llama3,",
        "# GPT, 24 layers, hidden 2048, LayerNorm, GELU, biases, tied embeddings.",
        "# Replace MODULE and CONFIG with a config_registry module of your own that builds it",
        "# tensor parallelism without sequence parallelism (enable_sequence_parallel off)",
        "# uneven pipeline split: each stage's modules listed in module_fqns_per_model_part",
        "# NOT EXPRESSIBLE: selective recompute of the attention core: torchtitan's selective policy",
        "# NOT EXPRESSIBLE: fp16 mixed precision (and its loss scaling): torchtitan's",
        "# NOT EXPRESSIBLE: SGD with momentum 0.9: torchtitan's optimizers are Adam and AdamW (and DistMuon); written as",
        "# NOT EXPRESSIBLE: dropout 0.1: torchtitan's models have no dropout",
        "# NOT EXPRESSIBLE: the vocabulary padded to 50258: torchtitan keeps the model's 50257",
        "# torchtitan 0.3 captures CUDA graphs unless told not to, and refuses them with pipeline parallelism",
        "torchrun --nnodes 1 --nproc_per_node 8 -m torchtitan.train \\",
        "    --module MODULE \\",
        "    --config CONFIG \\",
        "    --parallelism.data_parallel_replicate_degree 2 \\",
        "    --parallelism.data_parallel_shard_degree 1 \\",
        "    --parallelism.fsdp_reshard_after_forward default \\",
        "    --parallelism.no_enable_sequence_parallel \\",
        "    --parallelism.pipeline_parallel_degree 2 \\",
        "    --parallelism.pipeline_parallel_schedule GPipe \\",
        "    --parallelism.pipeline_parallel_microbatch_size 2 \\",
        "    --parallelism.module_fqns_per_model_part tok_embeddings,layers.0,layers.1,layers.2,layers.3,"
        "layers.4,layers.5,layers.6,layers.7,layers.8,layers.9 layers.10,layers.11,layers.12,layers.13,"
        "layers.14,layers.15,layers.16,layers.17,layers.18,layers.19,layers.20,layers.21,layers.22,"
        "layers.23,norm,lm_head \\",
        "    --compile.no_enable_async_tensor_parallel \\",
        "    --training.local_batch_size 16 \\",
        "    --training.global_batch_size 32 \\",
        "    --training.seq_len 2048 \\",
        "    --training.max_norm inf \\",
        "    --training.mixed_precision_param bfloat16 \\",
        "    --training.disable_cuda_graphs \\",
        "    activation-checkpoint:selective",
        NULL};
    const char *not_cli[] = {"layers_per_stage", "ZeRO", "not overlapped", "--compile.enable", NULL};
    expect_lines("torchtitan 0.3 export (GPT)", cli, want_cli, not_cli);
    free(cli);
    char *toml = export_of(&s, "dgx-a100", 8, EXPORT_TORCHTITAN_TOML);
    const char *want_toml[] = {
        "# Replace MODEL and FLAVOR with a TrainSpec of your own (register_train_spec) that builds it",
        "# NOT EXPRESSIBLE: plain data parallelism (ZeRO-0) here:",
        "# torchtitan 0.2's DDP takes no other parallelism (\"DDP has not supported > 1D parallelism\");",
        "# (fsdp_reshard_after_forward never)",
        "# NOT EXPRESSIBLE: tensor parallelism without sequence parallelism: torchtitan 0.2's TP always",
        "# NOT EXPRESSIBLE: SGD with momentum 0.9: torchtitan's optimizers are Adam and AdamW; written as",
        "name = \"MODEL\"", "flavor = \"FLAVOR\"",
        "local_batch_size = 16", "global_batch_size = 32", "max_norm = inf",
        "mixed_precision_param = \"bfloat16\"",
        "data_parallel_replicate_degree = 1", "data_parallel_shard_degree = 2",
        "fsdp_reshard_after_forward = \"never\"", "tensor_parallel_degree = 2", "pipeline_parallel_degree = 2",
        "pipeline_parallel_schedule = \"GPipe\"", "pipeline_parallel_microbatch_size = 2",
        "module_fqns_per_model_part = [",
        "    [\"tok_embeddings\", \"layers.0\", \"layers.1\", \"layers.2\", \"layers.3\", \"layers.4\", "
        "\"layers.5\", \"layers.6\", \"layers.7\", \"layers.8\", \"layers.9\"],",
        "    [\"layers.10\", \"layers.11\", \"layers.12\", \"layers.13\", \"layers.14\", \"layers.15\", "
        "\"layers.16\", \"layers.17\", \"layers.18\", \"layers.19\", \"layers.20\", \"layers.21\", "
        "\"layers.22\", \"layers.23\", \"norm\", \"output\"],",
        "]",
        "mode = \"selective\"", "selective_ac_option = \"op\"",
        NULL};
    const char *not_toml[] = {"layers_per_stage", "context_parallel_rotate_method", "lm_head", NULL};
    expect_lines("torchtitan 0.2 export (GPT)", toml, want_toml, not_toml);
    free(toml);
}

/* HSDP (8 x 4), FSDP, the parameters kept gathered, optimizer offload, buckets and activation
 * offload on 32 H100s: torchtitan's two data-parallel degrees, reshard never, its CPU offload,
 * and the notes for what it cannot say. */
static void test_hsdp(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-8b", &s.model, &err), err);
    s.layout.zero = 3;
    s.layout.fsdp = 1;
    s.layout.dp_shard = 8;
    s.layout.keep_gathered = 1;
    s.layout.offload_optimizer = 1;
    s.layout.offload_activations = 1;
    s.layout.bucket_bytes = 5e8;
    s.layout.overlap_dp = 1;
    s.job.global_batch = 64;
    s.job.seq_len = 8192;
    s.job.precision = PX_BF16;
    char *cli = export_of(&s, "dgx-h100", 32, EXPORT_TORCHTITAN);
    const char *want_cli[] = {
        "    --parallelism.data_parallel_replicate_degree 4 \\", "    --parallelism.data_parallel_shard_degree 8 \\",
        "    --parallelism.fsdp_reshard_after_forward never \\", "    --training.enable_cpu_offload \\",
        "# HSDP: parameters sharded over 8 ranks (x cp 1), replicated 4 times",
        "# NOT EXPRESSIBLE: buckets of 500000000 bytes: FSDP2 gathers and reduces one transformer block",
        "# NOT EXPRESSIBLE: activation offload: torchtitan has no setting for it", NULL};
    expect_lines("torchtitan 0.3 (HSDP)", cli, want_cli, (const char *const[]){"# the plan predicts DeepSpeed", NULL});
    free(cli);
    char *toml = export_of(&s, "dgx-h100", 32, EXPORT_TORCHTITAN_TOML);
    const char *want_toml[] = {"data_parallel_replicate_degree = 4", "data_parallel_shard_degree = 8",
                               "fsdp_reshard_after_forward = \"never\"", "enable_cpu_offload = true", NULL};
    expect_lines("torchtitan 0.2 (HSDP)", toml, want_toml, NULL);
    free(toml);

    /* DeepSpeed's gathers with full recompute: the plan's figures are not FSDP2's */
    s.layout.fsdp = 0;
    s.layout.keep_gathered = 0;
    s.layout.offload_optimizer = 0;
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    toml = export_of(&s, "dgx-h100", 32, EXPORT_TORCHTITAN_TOML);
    const char *want2[] = {"fsdp_reshard_after_forward = \"always\"",
                           "# the plan predicts DeepSpeed ZeRO-3's gathers (a recomputed forward gathers again); FSDP2's", NULL};
    expect_lines("torchtitan 0.2 (ZeRO-3, full recompute)", toml, want2, (const char *const[]){"enable_cpu_offload", NULL});
    free(toml);
}

/* A plan priced for one framework exported to another that runs it otherwise: a warning naming
 * each difference that touches the plan; none where the plan was priced for the target. */
static void test_framework(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("llama3-8b", &s.model, &err), err);
    s.layout.zero = 3;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    s.job.global_batch = 32;
    s.job.seq_len = 8192;
    s.job.precision = PX_BF16;
    s.job.fused_kernels = 0;
    char *cli = export_of(&s, "dgx-h100", 8, EXPORT_TORCHTITAN);
    const char *want[] = {
        "# WARNING: the plan was priced as megatron runs it (training.framework), and torchtitan runs it",
        "# otherwise: torchtitan recomputes `selective` op by op (megatron: the attention core); torchtitan",
        "# always overlaps data-parallel communication (megatron: not overlapped); torchtitan runs the norms",
        "# as eager modules, uncompiled (megatron: fused). Its predicted step is megatron's: plan with",
        "# --framework torchtitan for torchtitan's prediction and ranking", NULL};
    expect_lines("megatron's plan for torchtitan", cli, want, NULL);
    free(cli);
    s.job.framework = MODEL_FW_TORCHTITAN;
    cli = export_of(&s, "dgx-h100", 8, EXPORT_TORCHTITAN);
    expect_lines("torchtitan's plan for torchtitan", cli, (const char *const[]){NULL},
                 (const char *const[]){"# WARNING: the plan was priced", NULL});
    free(cli);
    /* to Megatron-LM: the recompute and the norms (Megatron-Core's are fused kernels whatever
     * the job says) differ; not the overlap: the plan's layout took torchtitan's, and the
     * Megatron-LM export writes it */
    cli = export_of(&s, "dgx-h100", 8, EXPORT_MEGATRON);
    const char *want_mlm[] = {
        "# WARNING: the plan was priced as torchtitan runs it (training.framework), and megatron runs it",
        "# otherwise: megatron recomputes `selective` as the attention core (torchtitan: op by op); megatron",
        "# runs the norms as fused kernels (torchtitan: eager). Its predicted step is torchtitan's: plan with",
        "# --framework megatron for megatron's prediction and ranking", NULL};
    expect_lines("torchtitan's plan for Megatron-LM", cli, want_mlm, NULL);
    free(cli);
}

int main(void)
{
    px_log_set_quiet(1);
    test_framework();
    test_hsdp();
    test_fsdp();
    test_unexpressible();
    TEST_DONE("export_titan");
}
