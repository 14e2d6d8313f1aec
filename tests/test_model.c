/* Unit tests of model/: configs and Hugging Face import, parameter counts, the layout rules,
 * tensor-table invariants, ZeRO sharding, pipeline schedules and the rank order. */
#include <sys/stat.h>
#include <unistd.h>

#include "fixtures.h"
#include "test.h"

static char tmpdir[] = "/tmp/px_test_model_XXXXXX";

static const char *write_tmp(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_param_counts(void)
{
    PxError err = {0};
    ModelConfig c;
    /* Published totals of the released checkpoints. */
    CHECK_OK(model_config_load("gpt2-124m", &c, &err), err);
    CHECK_EQ_U64(124439808ull, (uint64_t)model_config_params(&c));
    CHECK_OK(model_config_load("llama2-7b", &c, &err), err);
    CHECK_EQ_U64(6738415616ull, (uint64_t)model_config_params(&c));
    CHECK_OK(model_config_load("llama3-8b", &c, &err), err);
    CHECK_EQ_U64(8030261248ull, (uint64_t)model_config_params(&c));
    CHECK_OK(model_config_load("llama2-70b", &c, &err), err);
    CHECK_EQ_U64(68976648192ull, (uint64_t)model_config_params(&c));
    CHECK_OK(model_config_load("tiny", &c, &err), err);
    CHECK_EQ_INT(256, c.vocab);
    CHECK_EQ_INT(4, c.layers);
    CHECK(c.tied_embeddings && c.bias && c.mlp == MODEL_GELU);
    CHECK_OK(model_config_load("tiny-llama", &c, &err), err);
    CHECK(c.kv_heads < c.heads && c.mlp == MODEL_SWIGLU && !c.tied_embeddings);
    CHECK(model_zoo_count() >= 25);

    /* Every model of the zoo. Released checkpoints: their published totals (GPT-2 124M and
     * 355M, Llama 2 and 3 as Meta's model cards and checkpoints count them). GPT-3 (Brown et
     * al. 2020, Table 2.1: 125M ... 175B, rounded) and Megatron's weak-scaling models
     * (Narayanan et al. 2021, Table 1: 1.7 ... 1008.0 B, rounded) are exact counts of their
     * shapes: 12*l*h^2 + 13*l*h + (V + s)*h + 2h, Narayanan's P plus the final norm. */
    static const struct {
        const char *name;
        uint64_t params;
        double published; /* the paper's rounded figure, where the count is not released */
    } zoo[] = {
        {"gpt2-124m", 124439808ull, 0},         {"gpt2-350m", 354823168ull, 0},
        {"gpt3-1.3b", 1315723264ull, 1.3e9},    {"gpt3-2.7b", 2651553280ull, 2.7e9},
        {"gpt3-6.7b", 6658404352ull, 6.7e9},    {"gpt3-13b", 12853386240ull, 13.0e9},
        {"gpt3-175b", 174604259328ull, 175.0e9}, {"megatron-1.7b", 1652230656ull, 1.7e9},
        {"megatron-3.6b", 3562168320ull, 3.6e9}, {"megatron-7.5b", 7467786240ull, 7.5e9},
        {"megatron-18.4b", 18449756160ull, 18.4e9}, {"megatron-39.1b", 39096041472ull, 39.1e9},
        {"megatron-76.1b", 76050739200ull, 76.1e9}, {"megatron-145.6b", 145622261760ull, 145.6e9},
        {"megatron-310.1b", 310130540544ull, 310.1e9}, {"megatron-529.6b", 529600819200ull, 529.6e9},
        {"megatron-1t", 1008038758400ull, 1008.0e9}, {"llama2-7b", 6738415616ull, 0},
        {"llama2-13b", 13015864320ull, 0},      {"llama2-70b", 68976648192ull, 0},
        {"llama3-8b", 8030261248ull, 0},        {"llama3-70b", 70553706496ull, 0},
        {"llama3-405b", 405853388800ull, 0},
    };
    for (size_t i = 0; i < sizeof zoo / sizeof *zoo; i++) {
        CHECK_OK(model_config_load(zoo[i].name, &c, &err), err);
        const double n = model_config_params(&c);
        CHECK_EQ_U64(zoo[i].params, (uint64_t)n);
        /* Narayanan print these shapes' counts to 0.1 B (1.65 B as 1.7); GPT-3's are looser
         * (its 13B has hidden 5140 in Table 2.1, not a multiple of its 40 heads; the zoo
         * uses 5120 = 40 x 128 as Megatron-LM does) and land within 2%. */
        if (zoo[i].published > 0 && strncmp(zoo[i].name, "megatron", 8) == 0)
            CHECK(fabs(n - zoo[i].published) <= 0.05e9);
        else if (zoo[i].published > 0)
            CHECK(fabs(n - zoo[i].published) <= 0.02 * zoo[i].published);
        if (c.family == MODEL_GPT && c.ffn_hidden == 4 * c.hidden) {
            const double l = c.layers, h = c.hidden;
            CHECK_EQ_U64((uint64_t)(12 * l * h * h + 13 * l * h + (c.vocab + c.seq_len) * h + 2 * h),
                         (uint64_t)n);
        }
    }
}

static void test_hf_import(void)
{
    PxError err = {0};
    ModelConfig c;
    const char *p = write_tmp("gpt2.json",
        "{\"model_type\": \"gpt2\", \"n_layer\": 12, \"n_embd\": 768, \"n_head\": 12,"
        " \"vocab_size\": 50257, \"n_positions\": 1024, \"n_inner\": null,"
        " \"layer_norm_epsilon\": 1e-05, \"activation_function\": \"gelu_new\"}");
    CHECK_OK(model_config_load(p, &c, &err), err);
    CHECK_EQ_U64(124439808ull, (uint64_t)model_config_params(&c));
    CHECK(c.family == MODEL_GPT && c.tied_embeddings && c.ffn_hidden == 3072);
    CHECK_STR("gpt2", c.name);

    char dir[300];
    snprintf(dir, sizeof dir, "%s/Llama-3-8B", tmpdir);
    mkdir(dir, 0700);
    p = write_tmp("Llama-3-8B/config.json",
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4096,"
        " \"intermediate_size\": 14336, \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
        " \"num_key_value_heads\": 8, \"vocab_size\": 128256, \"max_position_embeddings\": 8192,"
        " \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
        " \"hidden_act\": \"silu\", \"torch_dtype\": \"bfloat16\"}");
    CHECK_OK(model_config_load(p, &c, &err), err);
    CHECK_EQ_U64(8030261248ull, (uint64_t)model_config_params(&c));
    CHECK_STR("Llama-3-8B", c.name);
    CHECK(c.kv_heads == 8 && c.rope_theta == 500000.0 && c.position == MODEL_POS_ROPE);
    CHECK(!c.tied_embeddings && c.family == MODEL_LLAMA && c.mlp == MODEL_SWIGLU && !c.bias);

    p = write_tmp("mistral.json",
        "{\"model_type\": \"mistral\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
        " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
        " \"vocab_size\": 32000, \"max_position_embeddings\": 32768, \"sliding_window\": null,"
        " \"head_dim\": 128, \"tie_word_embeddings\": false}");
    CHECK_OK(model_config_load(p, &c, &err), err);
    CHECK_EQ_U64(7241732096ull, (uint64_t)model_config_params(&c)); /* Mistral 7B v0.1 */

    /* Qwen2 carries q/k/v biases and ties its embeddings in small sizes. */
    p = write_tmp("qwen2.json",
        "{\"model_type\": \"qwen2\", \"hidden_size\": 896, \"intermediate_size\": 4864,"
        " \"num_attention_heads\": 14, \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,"
        " \"vocab_size\": 151936, \"max_position_embeddings\": 32768, \"tie_word_embeddings\": true}");
    CHECK_OK(model_config_load(p, &c, &err), err);
    CHECK(c.qkv_bias && !c.bias && c.tied_embeddings);
    CHECK_EQ_U64(494032768ull, (uint64_t)model_config_params(&c)); /* Qwen2-0.5B */
    p = write_tmp("qwen2-7b.json",
        "{\"model_type\": \"qwen2\", \"hidden_size\": 3584, \"intermediate_size\": 18944,"
        " \"num_attention_heads\": 28, \"num_hidden_layers\": 28, \"num_key_value_heads\": 4,"
        " \"vocab_size\": 152064, \"max_position_embeddings\": 131072, \"rope_theta\": 1000000.0,"
        " \"tie_word_embeddings\": false}");
    CHECK_OK(model_config_load(p, &c, &err), err);
    CHECK(c.qkv_bias && !c.tied_embeddings && c.kv_heads == 4 && c.rope_theta == 1e6);
    CHECK_EQ_U64(7615616512ull, (uint64_t)model_config_params(&c)); /* Qwen2-7B */

    /* Vocabulary padding on an imported GPT-2: to a multiple of tp by default, of 128 x tp
     * as Megatron-LM pads it (--make-vocab-size-divisible-by 128) when asked. */
    ModelSpec ps;
    ModelDims pd;
    model_spec_defaults(&ps);
    CHECK_OK(model_config_load(write_tmp("gpt2-pad.json",
                 "{\"model_type\": \"gpt2\", \"n_layer\": 12, \"n_embd\": 768, \"n_head\": 12,"
                 " \"vocab_size\": 50257, \"n_positions\": 1024}"), &ps.model, &err), err);
    ps.layout.tp = 2;
    CHECK_OK(model_spec_check(&ps, 2, &pd, &err), err);
    CHECK_EQ_INT(50258, pd.vocab_pad);
    ps.job.pad_vocab = 128;
    CHECK_OK(model_spec_check(&ps, 2, &pd, &err), err);
    CHECK_EQ_INT(50432, pd.vocab_pad);

    p = write_tmp("bert.json", "{\"model_type\": \"bert\", \"hidden_size\": 768}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "model_type 'bert' is not supported");
    p = write_tmp("llama_missing.json", "{\"model_type\": \"llama\", \"hidden_size\": 4096}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "num_hidden_layers: missing required key");
}

static void test_native_errors(void)
{
    PxError err = {0};
    ModelConfig c;
    const char *p = write_tmp("bad1.json", "{\"name\": \"x\", \"family\": \"gpt\", \"layers\": \"four\"}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "layers: expected an integer, got a string");
    p = write_tmp("bad2.json", "{\"name\": \"x\", \"family\": \"gpt\", \"layers\": 4, \"hidden\": 64}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "heads: missing required key");
    p = write_tmp("bad3.json", "{\"name\": \"x\", \"family\": \"mamba\"}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "family: expected one of gpt|llama, got 'mamba'");
    p = write_tmp("bad4.json", "{\"name\": \"x\", \"family\": \"gpt\", \n \"layers\": 4,,}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "malformed JSON near line 2");
    p = write_tmp("bad5.json", "{\"name\": \"x\", \"family\": \"llama\", \"layers\": 4, \"hidden\": 64,"
                  " \"heads\": 8, \"kv_heads\": 3, \"vocab\": 256, \"seq_len\": 64}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "kv_heads 3 must divide heads 8");
    p = write_tmp("bad6.json", "{\"name\": \"x\", \"family\": \"gpt\", \"layers\": 4, \"hidden\": 64,"
                  " \"heads\": 4, \"vocab\": 256, \"seq_len\": 64, \"layers_extra\": 1}");
    CHECK_OK(model_config_load(p, &c, &err), err); /* unknown keys warn, they do not fail */
    p = write_tmp("bad7.json", "{\"name\": \"\", \"family\": \"gpt\", \"layers\": 4, \"hidden\": 64,"
                  " \"heads\": 4, \"vocab\": 256, \"seq_len\": 64}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "name: expected a non-empty name");
    p = write_tmp("bad8.json", "{\"name\": \"a\\nb\", \"family\": \"gpt\", \"layers\": 4, \"hidden\": 64,"
                  " \"heads\": 4, \"vocab\": 256, \"seq_len\": 64}");
    CHECK_INPUT_ERROR(model_config_load(p, &c, &err), err, "without control characters");
    CHECK_INPUT_ERROR(model_config_load("no-such-model", &c, &err), err, "unknown model 'no-such-model'");
    /* round trip through the parallax format */
    CHECK_OK(model_config_load("llama3-70b", &c, &err), err);
    cJSON *j = model_config_to_json(&c);
    ModelConfig back;
    CHECK_OK(model_config_from_json(j, "roundtrip", &back, &err), err);
    cJSON_Delete(j);
    CHECK(memcmp(&c, &back, sizeof c) == 0);
}

static void expect_rule(ModelSpec s, int gpus, const char *needle)
{
    PxError err = {0};
    ModelDims d;
    CHECK_INPUT_ERROR(model_spec_check(&s, gpus, &d, &err), err, needle);
}

static void test_rules(void)
{
    PxError err = {0};
    ModelSpec base;
    model_spec_defaults(&base);
    CHECK_OK(model_config_load("gpt3-175b", &base.model, &err), err);
    ModelSpec s = base;
    s.layout.tp = 7;
    expect_rule(s, 7 * 8, "tp 7 must divide the 96 attention heads");
    s = base;
    s.layout.pp = 7;
    expect_rule(s, 7, "pp 7 x vpp 1 = 7 must divide the 96 layers");
    s = base;
    s.layout.tp = 8;
    expect_rule(s, 12, "does not divide the 12 GPUs");
    s = base;
    s.layout.tp = 8;
    s.layout.dp = 3;
    expect_rule(s, 16, "= 24 does not equal the 16 GPUs");
    s = base;
    s.job.global_batch = 100;
    s.job.micro_batch = 3;
    expect_rule(s, 8, "global batch 100 must be divisible by micro-batch 3 x dp 8 = 24");
    s = base;
    s.layout.sp = 1;
    expect_rule(s, 8, "sequence parallelism needs tp > 1");
    /* the prediction modules' eh projection splits the hidden size over tp */
    s = base;
    s.model.mtp_layers = 1;
    s.model.hidden = 12292;
    s.layout.tp = 8;
    expect_rule(s, 8, "tp 8 must divide the hidden size 12292: the multi-token prediction");
    s = base;
    s.layout.pp = 4;
    s.layout.zero = 3;
    {
        /* ZeRO-3 with a pipeline is priced as torchtitan runs it: once-a-step collectives */
        ModelDims d;
        PxError e = {0};
        CHECK_OK(model_spec_check(&s, 8, &d, &e), e);
        CHECK_EQ_INT(1, d.zero_per_step);
    }
    s = base;
    s.layout.pp = 4;
    s.layout.vpp = 2;
    s.job.global_batch = 6;
    expect_rule(s, 8, "interleaved schedule needs the 3 micro-batches to be a multiple of pp 4");
    s = base;
    s.layout.schedule = MODEL_SCHED_INTERLEAVED;
    expect_rule(s, 8, "interleaved schedule needs vpp >= 2");
    s = base;
    s.layout.pp = 4;
    s.layout.vpp = 2;
    s.layout.schedule = MODEL_SCHED_GPIPE;
    expect_rule(s, 8, "gpipe schedule cannot interleave");
    s = base;
    s.job.seq_len = 4096;
    expect_rule(s, 8, "sequence length 4096 exceeds the 2048 learned positions");
    s = base;
    s.layout.cp = 3;
    expect_rule(s, 3, "cp 3 must divide the sequence length 2048");
    s.layout.cp = 2;
    s.job.seq_len = 2046; /* divisible by cp, not by 2 x cp */
    expect_rule(s, 2, "cp 2 needs the sequence length 2046 to split into 2 x cp = 4 chunks");
    s = base;
    s.job.precision = PX_FP32;
    s.job.grad_dtype = PX_BF16;
    expect_rule(s, 1, "fp32 training keeps fp32 gradients");
    /* the ring runs the fused core only: unfused it is not a layout (MODEL_RULE_CP_CORE) */
    s = base;
    s.layout.cp = 2, s.layout.cp_comm = MODEL_CP_COMM_P2P;
    s.job.flash_attn = 0;
    expect_rule(s, 2, "cp 2 with cp comm type p2p runs the fused attention core");
    s.job.flash_attn = 1;
    {
        ModelDims d;
        PxError e = {0};
        CHECK_OK(model_spec_check(&s, 2, &d, &e), e);
        s.layout.cp_comm = MODEL_CP_COMM_A2A, s.job.flash_attn = 0; /* Ulysses: either core */
        CHECK_OK(model_spec_check(&s, 2, &d, &e), e);
    }

    /* dp comes from the GPUs; 1F1B over several chunks becomes interleaved; vocab padding */
    s = base;
    s.layout.tp = 8;
    s.layout.pp = 4;
    s.layout.vpp = 3;
    s.job.global_batch = 64;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 64, &d, &err), err);
    CHECK_EQ_INT(2, s.layout.dp);
    CHECK_EQ_INT(MODEL_SCHED_INTERLEAVED, s.layout.schedule);
    CHECK_EQ_INT(32, d.m);
    CHECK_EQ_INT(50264, d.vocab_pad); /* multiple of 8 */
    s = base;
    s.layout.tp = 8;
    s.job.pad_vocab = 128;
    CHECK_OK(model_spec_check(&s, 8, &d, &err), err);
    CHECK_EQ_INT(51200, d.vocab_pad); /* Megatron's multiple of 128 x 8 */
}

static void test_tensor_table(void)
{
    PxError err = {0};
    /* Summed over the stages and times tp, the weights are the model's parameters (with the
     * padded vocabulary) plus, for tied embeddings on several stages, one more output copy. */
    const char *names[3] = {"gpt3-13b", "llama3-8b", "tiny"};
    for (int mi = 0; mi < 3; mi++) {
        for (int pp = 1; pp <= 4; pp *= 2) {
            ModelSpec s;
            model_spec_defaults(&s);
            CHECK_OK(model_config_load(names[mi], &s.model, &err), err);
            s.layout.tp = 2;
            s.layout.pp = pp;
            ModelDims d;
            CHECK_OK(model_spec_check(&s, 2 * pp, &d, &err), err);
            ModelConfig padded = s.model;
            padded.vocab = d.vocab_pad;
            double expect = model_config_params(&padded);
            if (s.model.tied_embeddings && pp > 1)
                expect += (double)d.vocab_pad * d.h;
            /* norms, row-parallel biases and positions are replicated over tp */
            double replicated = 0;
            uint64_t total = 0;
            for (int st = 0; st < pp; st++) {
                ModelTensorTable tt;
                CHECK_OK(model_tensors_build(&s, &d, st, &tt, &err), err);
                for (int i = 0; i < tt.count; i++) {
                    const ModelTensor *t = &tt.t[i];
                    if (t->cat != MODEL_WEIGHTS)
                        continue;
                    total += t->numel * 2;
                    if (!(t->shard & MODEL_SHARD_TP))
                        replicated += (double)t->numel;
                    CHECK_EQ_U64(t->numel * px_dtype_bytes(t->dtype), t->bytes);
                }
                model_tensors_free(&tt);
            }
            CHECK_REL(expect, (double)total - replicated, 1e-12);
        }
    }
    /* ZeRO-3: weights are shards; the gathered copies are comm_buffers, never weights. */
    ModelSpec s = fx_spec(fx_gpt(4, 64, 4, 256, 64));
    s.layout.dp = 4;
    s.layout.zero = 3;
    ModelDims d;
    CHECK_OK(model_spec_check(&s, 4, &d, &err), err);
    ModelTensorTable tt;
    CHECK_OK(model_tensors_build(&s, &d, 0, &tt, &err), err);
    uint64_t shards = 0, biggest = 0;
    int found_gather = 0;
    for (int i = 0; i < tt.n_blocks; i++) {
        shards += tt.blocks[i].shard_numel;
        if (tt.blocks[i].numel > biggest)
            biggest = tt.blocks[i].numel;
        CHECK_EQ_U64((tt.blocks[i].numel + 3) / 4, tt.blocks[i].shard_numel);
    }
    for (int i = 0; i < tt.count; i++) {
        if (strcmp(tt.t[i].name, "zero.param_gather") == 0) {
            found_gather = 1;
            CHECK_EQ_INT(MODEL_COMM_BUFFERS, tt.t[i].cat);
            CHECK_EQ_U64(2 * px_round_up(biggest, 4) * 2, tt.t[i].bytes);
        }
        if (tt.t[i].cat == MODEL_WEIGHTS)
            CHECK(strstr(tt.t[i].name, ".w_shard") != NULL);
    }
    CHECK(found_gather);
    CHECK_EQ_U64(shards * 2, model_tensors_bytes(&tt, MODEL_WEIGHTS));
    CHECK_EQ_U64(shards * 4, model_tensors_bytes(&tt, MODEL_GRADS)); /* fp32 gradients */
    CHECK_EQ_U64(shards * 4, model_tensors_bytes(&tt, MODEL_MASTER));
    CHECK_EQ_U64(shards * 8, model_tensors_bytes(&tt, MODEL_OPTIMIZER));
    model_tensors_free(&tt);
    /* fp32 training has no master copy; SGD keeps one momentum; 8-bit Adam two bytes + absmax */
    s = fx_spec(fx_gpt(4, 64, 4, 256, 64));
    s.job.precision = PX_FP32;
    s.job.optimizer = MODEL_OPT_SGD_MOMENTUM;
    CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
    CHECK_OK(model_tensors_build(&s, &d, 0, &tt, &err), err);
    CHECK_EQ_U64(0, model_tensors_bytes(&tt, MODEL_MASTER));
    CHECK_EQ_U64(model_tensors_bytes(&tt, MODEL_WEIGHTS), model_tensors_bytes(&tt, MODEL_OPTIMIZER));
    uint64_t params = tt.params;
    model_tensors_free(&tt);
    s.job.optimizer = MODEL_OPT_ADAM_8BIT;
    CHECK_OK(model_spec_check(&s, 1, &d, &err), err);
    CHECK_OK(model_tensors_build(&s, &d, 0, &tt, &err), err);
    uint64_t absmax = 0;
    for (int i = 0; i < tt.n_blocks; i++)
        absmax += 2 * 4 * px_ceil_div(tt.blocks[i].numel, 2048);
    CHECK_EQ_U64(2 * params + absmax, model_tensors_bytes(&tt, MODEL_OPTIMIZER));
    model_tensors_free(&tt);
}

static void check_schedule_valid(const ModelDims *d, ModelSchedule sched, int stage)
{
    int n_max = 2 * d->m * d->v;
    ModelAction *a = malloc((size_t)n_max * sizeof *a);
    int n = model_schedule_build(d, sched, stage, a);
    CHECK_EQ_INT(n_max, n);
    int *state = calloc((size_t)(d->m * d->v), sizeof *state);
    for (int i = 0; i < n; i++) {
        int k = a[i].chunk * d->m + a[i].mb;
        CHECK(a[i].chunk >= 0 && a[i].chunk < d->v && a[i].mb >= 0 && a[i].mb < d->m);
        CHECK_EQ_INT(a[i].backward ? 1 : 0, state[k]); /* forward first, each once */
        state[k]++;
    }
    for (int k = 0; k < d->m * d->v; k++)
        CHECK_EQ_INT(2, state[k]);
    free(state);
    free(a);
}

static void test_schedules(void)
{
    ModelDims d = {0};
    d.p = 4;
    d.v = 1;
    d.m = 8;
    ModelAction a[64];
    int n = model_schedule_build(&d, MODEL_SCHED_1F1B, 0, a);
    /* stage 0 of 4: three warm-up forwards, then F3 B0 F4 B1 ... */
    CHECK_EQ_INT(16, n);
    for (int i = 0; i < 4; i++)
        CHECK(!a[i].backward && a[i].mb == i);
    CHECK(a[4].backward && a[4].mb == 0);
    CHECK(!a[5].backward && a[5].mb == 4);
    int live = 0, per_chunk[4];
    model_schedule_live(a, n, 1, &live, per_chunk);
    CHECK_EQ_INT(4, live);
    CHECK_EQ_INT(4, per_chunk[0]);
    n = model_schedule_build(&d, MODEL_SCHED_1F1B, 3, a);
    CHECK(!a[0].backward && a[1].backward); /* the last stage alternates from the start */
    model_schedule_live(a, n, 1, &live, per_chunk);
    CHECK_EQ_INT(1, live);
    n = model_schedule_build(&d, MODEL_SCHED_GPIPE, 2, a);
    model_schedule_live(a, n, 1, &live, per_chunk);
    CHECK_EQ_INT(8, live);
    /* interleaved, p 2, v 2, m 4, stage 0 (Megatron's order) */
    d.p = 2;
    d.v = 2;
    d.m = 4;
    n = model_schedule_build(&d, MODEL_SCHED_INTERLEAVED, 0, a);
    const int expect[16][3] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}, {0, 0, 2}, {1, 1, 0},
                               {0, 0, 3}, {1, 1, 1}, {0, 1, 2}, {1, 0, 0}, {0, 1, 3}, {1, 0, 1},
                               {1, 1, 2}, {1, 1, 3}, {1, 0, 2}, {1, 0, 3}};
    CHECK_EQ_INT(16, n);
    for (int i = 0; i < 16; i++) {
        CHECK_EQ_INT(expect[i][0], a[i].backward);
        CHECK_EQ_INT(expect[i][1], a[i].chunk);
        CHECK_EQ_INT(expect[i][2], a[i].mb);
    }
    /* 5 sets alive at the peak, but chunk 0 alone reaches 4 and chunk 1 2: pooling the layer
     * sets (equal in every chunk) needs 5 slots, per-chunk pools would need 6 */
    model_schedule_live(a, n, 2, &live, per_chunk);
    CHECK_EQ_INT(5, live);
    CHECK_EQ_INT(4, per_chunk[0]);
    CHECK_EQ_INT(2, per_chunk[1]);
    /* the counts without the actions (the simulator's) equal the walk over them, exactly */
    model_schedule_peak(&d, MODEL_SCHED_INTERLEAVED, 0, &live, per_chunk);
    CHECK_EQ_INT(5, live);
    CHECK_EQ_INT(4, per_chunk[0]);
    CHECK_EQ_INT(2, per_chunk[1]);
    static ModelAction big[2 * 48 * 6];
    int peak_cases = 0;
    for (int p = 2; p <= 8; p++)
        for (int v = 1; v <= 6; v++)
            for (int m = p; m <= 48; m += p)
                for (int st = 0; st < p; st++)
                    for (int sc = 0; sc < 3; sc++) {
                        ModelSchedule sched = (ModelSchedule)sc;
                        if ((sched == MODEL_SCHED_INTERLEAVED) != (v > 1))
                            continue;
                        d.p = p;
                        d.v = v;
                        d.m = m;
                        int want_live, want[6], got_live, got[6];
                        n = model_schedule_build(&d, sched, st, big);
                        model_schedule_live(big, n, v, &want_live, want);
                        model_schedule_peak(&d, sched, st, &got_live, got);
                        CHECK_EQ_INT(want_live, got_live);
                        for (int j = 0; j < v; j++)
                            CHECK_EQ_INT(want[j], got[j]);
                        peak_cases++;
                    }
    CHECK(peak_cases > 1000);
    /* more than 64 chunks a rank (the counts were arrays of 64, chunks past them counted 0):
     * pp 2 x vpp 65 over 2 micro-batches: stage 0's warm-up, (2 - 0 - 1) x 2 + 64 x 2 = 130,
     * is every forward, so both micro-batches of every chunk are alive at once */
    {
        static ModelAction deep[2 * 4 * 65];
        static int want[65], got[65];
        d.p = 2, d.v = 65, d.m = 2;
        int want_live, got_live;
        n = model_schedule_build(&d, MODEL_SCHED_INTERLEAVED, 0, deep);
        CHECK_EQ_INT(PX_OK, model_schedule_live(deep, n, 65, &want_live, want));
        CHECK_EQ_INT(PX_OK, model_schedule_peak(&d, MODEL_SCHED_INTERLEAVED, 0, &got_live, got));
        CHECK_EQ_INT(want_live, got_live);
        CHECK_EQ_INT(130, got_live);
        for (int j = 0; j < 65; j++) {
            CHECK_EQ_INT(want[j], got[j]);
            CHECK_EQ_INT(2, got[j]);
        }
    }
    for (int p = 1; p <= 4; p++) {
        for (int m = 1; m <= 8; m++) {
            d.p = p;
            d.v = 1;
            d.m = m;
            for (int st = 0; st < p; st++) {
                check_schedule_valid(&d, MODEL_SCHED_1F1B, st);
                check_schedule_valid(&d, MODEL_SCHED_GPIPE, st);
                if (p > 1 && m % p == 0) {
                    d.v = 3;
                    check_schedule_valid(&d, MODEL_SCHED_INTERLEAVED, st);
                    d.v = 1;
                }
            }
        }
    }
}

static void test_rank_order(void)
{
    ModelLayout l = {.dp = 3, .tp = 2, .pp = 4, .cp = 2};
    int seen[48] = {0};
    for (int pp = 0; pp < 4; pp++)
        for (int dp = 0; dp < 3; dp++)
            for (int cp = 0; cp < 2; cp++)
                for (int tp = 0; tp < 2; tp++) {
                    int r = model_rank(&l, tp, cp, dp, pp);
                    CHECK(r >= 0 && r < 48 && !seen[r]);
                    seen[r] = 1;
                    int a, b, c, e;
                    model_rank_coords(&l, r, &a, &b, &c, &e);
                    CHECK(a == tp && b == cp && c == dp && e == pp);
                }
    CHECK_EQ_INT(1, model_rank(&l, 1, 0, 0, 0)); /* tp fastest */
    CHECK_EQ_INT(2, model_rank(&l, 0, 1, 0, 0)); /* then cp */
    CHECK_EQ_INT(4, model_rank(&l, 0, 0, 1, 0)); /* then dp */
    CHECK_EQ_INT(12, model_rank(&l, 0, 0, 0, 1)); /* pp slowest */
}

/* Roles: every tensor and op carries one, the ones a name implies (names stay for people);
 * a layer's activations are listed once (model_layer_acts) and the table holds exactly the
 * saved ones; block ops name their block. A table or graph built without roles, or an
 * activation list that disagrees with the table, fails here. */
static void test_roles(void)
{
    PxError err = {0};
    static const struct {
        ModelRecompute rc;
        int flash;
        double dropout;
        int zero, tp, pp;
    } cases[] = {{MODEL_RECOMPUTE_NONE, 0, 0.1, 0, 2, 2},  {MODEL_RECOMPUTE_SELECTIVE, 0, 0.1, 1, 2, 1},
                 {MODEL_RECOMPUTE_FULL, 1, 0.0, 3, 1, 1},  {MODEL_RECOMPUTE_NONE, 1, 0.1, 2, 2, 1},
                 {MODEL_RECOMPUTE_SELECTIVE, 1, 0.0, 0, 1, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ModelSpec s;
        model_spec_defaults(&s);
        CHECK_OK(model_config_load("tiny", &s.model, &err), err);
        s.layout.recompute = cases[c].rc;
        s.layout.zero = cases[c].zero;
        s.layout.tp = cases[c].tp;
        s.layout.pp = cases[c].pp;
        s.layout.dp = cases[c].zero ? 2 : 1;
        s.layout.sp = cases[c].tp > 1;
        s.job.flash_attn = cases[c].flash;
        s.job.dropout = cases[c].dropout;
        s.job.precision = PX_FP32;
        s.job.global_batch = 8;
        s.job.micro_batch = 2;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 0, &d, &err), err);
        ModelLayerAct acts[MODEL_LAYER_ACTS];
        model_layer_acts(&s, &d, s.layout.recompute, acts);
        uint64_t saved_bytes = 0;
        for (int i = 0; i < MODEL_LAYER_ACTS; i++) {
            CHECK_EQ_INT(MODEL_TR_LN1_IN + i, acts[i].role);
            CHECK(!acts[i].saved || acts[i].present);
            saved_bytes += acts[i].saved ? acts[i].bytes : 0;
        }
        CHECK_EQ_U64(model_layer_activation_bytes(&s, &d), saved_bytes);
        /* full recompute keeps the input only; no recompute keeps everything computed */
        CHECK(acts[0].saved);
        for (int i = 1; i < MODEL_LAYER_ACTS; i++)
            if (s.layout.recompute == MODEL_RECOMPUTE_FULL)
                CHECK(!acts[i].saved);
            else if (s.layout.recompute == MODEL_RECOMPUTE_NONE)
                CHECK_EQ_INT(acts[i].present, acts[i].saved);
        for (int st = 0; st < d.p; st++) {
            ModelTensorTable tt;
            CHECK_OK(model_tensors_build(&s, &d, st, &tt, &err), err);
            int layer_acts = 0, layers = 0;
            for (int i = 0; i < tt.count; i++) {
                const ModelTensor *t = &tt.t[i];
                CHECK(t->role > MODEL_TR_NONE && t->role < MODEL_TR_COUNT);
                if (t->role >= MODEL_TR_LN1_IN && t->role <= MODEL_TR_MLP_DROP_MASK) {
                    const ModelLayerAct *a = &acts[t->role - MODEL_TR_LN1_IN];
                    char want[64];
                    snprintf(want, sizeof want, "layer.%d.%s", t->layer, a->suffix);
                    CHECK_STR(want, t->name);
                    CHECK(a->saved);
                    CHECK_EQ_U64(a->bytes, t->bytes);
                    CHECK_EQ_INT(MODEL_ACTIVATIONS, t->cat);
                    layer_acts++;
                }
                if (t->role == MODEL_TR_QKV_W && t->cat == MODEL_WEIGHTS)
                    layers++;
                if (t->role == MODEL_TR_WS_RECOMPUTE) {
                    uint64_t re = 0;
                    for (int k = 0; k < MODEL_LAYER_ACTS; k++)
                        re += acts[k].present && !acts[k].saved ? acts[k].bytes : 0;
                    CHECK_EQ_U64(re, t->bytes);
                }
            }
            int saved_kinds = 0;
            for (int k = 0; k < MODEL_LAYER_ACTS; k++)
                saved_kinds += acts[k].saved;
            int first, nl = model_stage_layers(&s, &d, st, &first);
            CHECK_EQ_INT(nl * saved_kinds, layer_acts);
            if (s.layout.zero < 3)
                CHECK_EQ_INT(nl, layers);
            ModelOpGraph g;
            CHECK_OK(model_ops_build(&s, &d, st, &g, &err), err);
            for (int i = 0; i < g.count; i++) {
                const ModelOp *op = &g.op[i];
                CHECK(op->role > MODEL_OPR_NONE && op->role < MODEL_OPR_COUNT);
                const int block_op = op->role == MODEL_OPR_BLOCK_PARAMS ||
                                     op->role == MODEL_OPR_BLOCK_GRADS ||
                                     op->role == MODEL_OPR_BLOCK_SP_GRADS;
                CHECK_EQ_INT(block_op, op->block >= 0);
                char want[64];
                if (block_op)
                    snprintf(want, sizeof want, "%s.%s", tt.blocks[op->block].name,
                             model_op_role_name(op->role));
                else if (op->layer >= 0)
                    snprintf(want, sizeof want, "layer.%d.%s", op->layer, model_op_role_name(op->role));
                else
                    snprintf(want, sizeof want, "%s", model_op_role_name(op->role));
                /* a communication op is named after its site, then its kind */
                CHECK(strncmp(op->name, want, strlen(want)) == 0);
                if (op->kind == MODEL_OP_COMM)
                    CHECK_STR(model_comm_name(op->comm), op->name + strlen(want) + 1);
                else
                    CHECK_STR(want, op->name);
            }
            model_ops_free(&g);
            model_tensors_free(&tt);
        }
    }
}

/* Ulysses (cp_comm a2a) as it runs with either core: tiny-llama at sequence 256 over cp 2 in
 * bf16, one sequence a micro-batch (s/cp = 128 rows; q = o = 8 x 8, kv = 4 x 8 per rank). The
 * all-to-alls of Q, K, V carry 128 x (64 + 2 x 32) x 2 = 32768 bytes, of the output 128 x 64 x 2
 * = 16384; the fused core's backward reads the output, saved in the sequence split only
 * (attn.proj.in), so it goes to the head split beside its gradient: two calls under the
 * projection backward, one unfused. The fused core saves the log-sum-exp (attn.lse, 8 heads x
 * 128 rows x 4 bytes = 4096), the unfused one the probabilities (8 x 128 x 256 x 2 = 524288). */
static void test_cp_a2a_cores(void)
{
    PxError err = {0};
    for (int flash = 0; flash <= 1; flash++) {
        ModelSpec s;
        model_spec_defaults(&s);
        CHECK_OK(model_config_load("tiny-llama", &s.model, &err), err);
        s.job.seq_len = 256, s.job.micro_batch = 1, s.job.global_batch = 1;
        s.job.precision = PX_BF16, s.job.grad_dtype = PX_FP32, s.job.flash_attn = flash;
        s.layout.cp = 2, s.layout.cp_comm = MODEL_CP_COMM_A2A;
        ModelDims d;
        CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
        ModelOpGraph g;
        CHECK_OK(model_ops_build(&s, &d, 0, &g, &err), err);
        int seen = 0;
        for (int i = 0; i < g.count; i++) {
            const ModelOp *op = &g.op[i];
            if (op->kind != MODEL_OP_COMM || op->comm != MODEL_CP_ALL_TO_ALL || op->layer != 0)
                continue;
            const int out = strcmp(op->name, "layer.0.attn.proj.cp_all_to_all") == 0;
            CHECK(out || strcmp(op->name, "layer.0.attn.core.cp_all_to_all") == 0);
            CHECK_EQ_U64(out ? 16384u : 32768u, op->comm_bytes);
            CHECK_EQ_INT(out && op->phase == MODEL_BWD && flash ? 2 : 1, op->calls);
            seen++;
        }
        CHECK_EQ_INT(4, seen); /* forward and backward, each side of the core */
        model_ops_free(&g);
        ModelLayerAct acts[MODEL_LAYER_ACTS];
        model_layer_acts_at(&s, &d, MODEL_RECOMPUTE_NONE, 0, acts);
        const ModelLayerAct *lse = &acts[MODEL_TR_ATTN_LSE - MODEL_TR_LN1_IN];
        const ModelLayerAct *p = &acts[MODEL_TR_SOFTMAX - MODEL_TR_LN1_IN];
        CHECK_EQ_U64(flash ? 4096u : 0u, lse->present ? lse->bytes : 0u);
        CHECK_EQ_U64(flash ? 0u : 524288u, p->present ? p->bytes : 0u);
    }
}

int main(void)
{
    px_log_set_quiet(1);
    CHECK(mkdtemp(tmpdir) != NULL);
    test_param_counts();
    test_hf_import();
    test_native_errors();
    test_rules();
    test_tensor_table();
    test_roles();
    test_schedules();
    test_rank_order();
    test_cp_a2a_cores();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    TEST_DONE("model");
}
