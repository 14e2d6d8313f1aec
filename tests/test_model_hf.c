/* Unit tests of the Hugging Face import's rotary settings: rope_theta and Llama 3.1's rope_scaling
 * in transformers 4's form (top level, rope_scaling) and transformers 5's (rope_parameters), the
 * planning sequence taken from the pre-training length, the parallax JSON's rope_scaling object
 * and its round trip, and the errors a bad scaling object gives. */
#include "test.h"

#include "model/model.h"

static int parse(const char *text, ModelConfig *c, PxError *err)
{
    cJSON *j = px_json_parse(text, "config.json", err);
    CHECK(j != NULL);
    int rc = model_config_from_json(j, "config.json", c, err);
    cJSON_Delete(j);
    return rc;
}

/* Llama-3.1-8B as its config.json has it, less the keys parallax does not read. */
#define LLAMA31_BODY                                                                              \
    "\"model_type\": \"llama\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"             \
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"        \
    " \"vocab_size\": 128256, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"      \
    " \"tie_word_embeddings\": false"
#define LLAMA3_SCALING                                                                            \
    "\"factor\": 8.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"                       \
    " \"original_max_position_embeddings\": 8192"

static void check_llama31(const ModelConfig *c)
{
    CHECK(c->rope_theta == 500000.0);
    CHECK_EQ_INT(MODEL_ROPE_SCALING_LLAMA3, c->rope_scaling.type);
    CHECK(c->rope_scaling.factor == 8.0);
    CHECK(c->rope_scaling.low_freq_factor == 1.0);
    CHECK(c->rope_scaling.high_freq_factor == 4.0);
    CHECK_EQ_INT(8192, c->rope_scaling.original_context);
    /* the planning sequence is the pre-training length, not the 131072 the scaling reaches */
    CHECK_EQ_INT(8192, c->seq_len);
    /* 32 x (attention 4096 x (4096 + 2 x 1024) + 4096 x 4096, SwiGLU 3 x 4096 x 14336, two norms)
     * + embedding and output 2 x 128256 x 4096 + final norm: the scaling adds nothing */
    CHECK_EQ_U64(8030261248ull, (uint64_t)model_config_params(c));
    CHECK_EQ_INT(1, model_rope_scaling_megatron(c));
}

static void test_transformers4(void)
{
    PxError err = {0};
    ModelConfig c;
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_theta\": 500000.0, \"rope_scaling\": {" LLAMA3_SCALING
                   ", \"rope_type\": \"llama3\"}}",
                   &c, &err),
             err);
    check_llama31(&c);
    /* older configs name the type "type" */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_theta\": 500000.0, \"rope_scaling\": {" LLAMA3_SCALING
                   ", \"type\": \"llama3\"}}",
                   &c, &err),
             err);
    check_llama31(&c);
    /* Llama 3 (no scaling): null is absent, max_position_embeddings is the planning length */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_theta\": 500000.0, \"rope_scaling\": null}", &c, &err),
             err);
    CHECK_EQ_INT(MODEL_ROPE_SCALING_NONE, c.rope_scaling.type);
    CHECK_EQ_INT(131072, c.seq_len);
    CHECK_EQ_INT(0, model_rope_scaling_megatron(&c));
}

static void test_transformers5(void)
{
    PxError err = {0};
    ModelConfig c;
    /* transformers 5 moves rope_theta into rope_parameters beside the scaling */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_parameters\": {" LLAMA3_SCALING
                   ", \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}}",
                   &c, &err),
             err);
    check_llama31(&c);
    /* no scaling: rope_type default */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_parameters\": {\"rope_theta\": 1000000.0,"
                   " \"rope_type\": \"default\"}}",
                   &c, &err),
             err);
    CHECK(c.rope_theta == 1e6);
    CHECK_EQ_INT(MODEL_ROPE_SCALING_NONE, c.rope_scaling.type);
    CHECK_EQ_INT(131072, c.seq_len);
    /* keyed by layer type: the full-attention layers' entry is the model's */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_parameters\": {\"full_attention\": {" LLAMA3_SCALING
                   ", \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}, \"sliding_attention\":"
                   " {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}}",
                   &c, &err),
             err);
    check_llama31(&c);
}

static void test_other_scalings(void)
{
    PxError err = {0};
    ModelConfig c;
    /* YaRN (DeepSeek-V3): not carried; its original length is the planning sequence */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32,"
                   " \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0,"
                   " \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}}",
                   &c, &err),
             err);
    CHECK_EQ_INT(MODEL_ROPE_SCALING_NONE, c.rope_scaling.type);
    CHECK_EQ_INT(4096, c.seq_len);
    /* linear: positions divided by the factor, so the trained length is the context over it */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}}",
                   &c, &err),
             err);
    CHECK_EQ_INT(32768, c.seq_len);
    /* dynamic: transformers takes max_position_embeddings as the original length */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}",
                   &c, &err),
             err);
    CHECK_EQ_INT(131072, c.seq_len);
    /* a top-level original_max_position_embeddings (Phi-3's place for it) */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"original_max_position_embeddings\": 4096,"
                   " \"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1.0],"
                   " \"short_factor\": [1.0]}}",
                   &c, &err),
             err);
    CHECK_EQ_INT(4096, c.seq_len);
    /* an original length that differs from Megatron-Core's fixed 8192 */
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0,"
                   " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                   " \"original_max_position_embeddings\": 4096}}",
                   &c, &err),
             err);
    CHECK_EQ_INT(4096, c.seq_len);
    CHECK(c.rope_scaling.factor == 32.0);
    CHECK_EQ_INT(0, model_rope_scaling_megatron(&c));
}

static void test_errors(void)
{
    PxError err = {0};
    ModelConfig c;
    CHECK_INPUT_ERROR(parse("{" LLAMA31_BODY ", \"rope_scaling\": {\"rope_type\": \"llama3\","
                            " \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}}",
                            &c, &err),
                      err,
                      "config.json: rope_scaling.original_max_position_embeddings: missing "
                      "required key (llama3 scaling)");
    CHECK_INPUT_ERROR(parse("{" LLAMA31_BODY ", \"rope_scaling\": {\"rope_type\": \"llama3\","
                            " \"factor\": 8.0, \"high_freq_factor\": 4.0,"
                            " \"original_max_position_embeddings\": 8192}}",
                            &c, &err),
                      err, "rope_scaling.low_freq_factor: missing required key");
    CHECK_INPUT_ERROR(parse("{" LLAMA31_BODY ", \"rope_scaling\": \"llama3\"}", &c, &err), err,
                      "config.json: rope_scaling: expected an object");
    CHECK_INPUT_ERROR(parse("{" LLAMA31_BODY ", \"rope_parameters\": {\"rope_type\": 3}}", &c, &err),
                      err, "config.json: rope_parameters.rope_type: expected a string");
    /* transformers' llama3 check: low below high */
    CHECK_INPUT_ERROR(parse("{" LLAMA31_BODY ", \"rope_scaling\": {\"rope_type\": \"llama3\","
                            " \"factor\": 8.0, \"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0,"
                            " \"original_max_position_embeddings\": 8192}}",
                            &c, &err),
                      err, "0 < low_freq_factor < high_freq_factor");
    /* the parallax format */
#define NATIVE "\"name\": \"m\", \"family\": \"llama\", \"layers\": 2, \"hidden\": 64, \"heads\": 4," \
               " \"vocab\": 256, \"seq_len\": 64"
    CHECK_INPUT_ERROR(parse("{" NATIVE ", \"rope_scaling\": {\"rope_type\": \"yarn\"}}", &c, &err),
                      err, "rope_scaling.rope_type");
    CHECK_INPUT_ERROR(parse("{" NATIVE ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}}",
                            &c, &err),
                      err, "rope_scaling.low_freq_factor: missing required key");
    CHECK_INPUT_ERROR(parse("{\"name\": \"g\", \"family\": \"gpt\", \"layers\": 2, \"hidden\": 64,"
                            " \"heads\": 4, \"vocab\": 256, \"seq_len\": 64, \"rope_scaling\":"
                            " {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1,"
                            " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 64}}",
                            &c, &err),
                      err, "rope_scaling needs rotary positions");
}

/* transformers 5 saves Qwen3-MoE's expert count as num_local_experts, and its rotary base in
 * rope_parameters: the model is the same (Qwen3-30B-A3B, 30532122624 parameters as transformers
 * counts them on the meta device) */
static void test_qwen3_moe_transformers5(void)
{
    PxError err = {0};
    ModelConfig c;
#define QWEN3_30B                                                                                 \
    "\"model_type\": \"qwen3_moe\", \"decoder_sparse_step\": 1, \"head_dim\": 128,"           \
    " \"hidden_size\": 2048, \"intermediate_size\": 6144, \"max_position_embeddings\": 40960,"  \
    " \"mlp_only_layers\": [], \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"       \
    " \"num_attention_heads\": 32, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"     \
    " \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06, \"router_aux_loss_coef\": 0.001,"   \
    " \"tie_word_embeddings\": false, \"vocab_size\": 151936"
    CHECK_OK(parse("{" QWEN3_30B ", \"num_local_experts\": 128, \"rope_parameters\":"
                   " {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}}",
                   &c, &err),
             err);
    CHECK_EQ_INT(128, c.moe.experts);
    CHECK(c.rope_theta == 1e6);
    CHECK_EQ_U64(30532122624ull, (uint64_t)model_config_params(&c));
    /* transformers 4's name wins where both are there */
    CHECK_OK(parse("{" QWEN3_30B ", \"num_experts\": 64, \"num_local_experts\": 128}", &c, &err), err);
    CHECK_EQ_INT(64, c.moe.experts);
    CHECK_INPUT_ERROR(parse("{" QWEN3_30B "}", &c, &err), err, "num_experts: missing required key");
}

/* The parallax JSON carries the scaling (plans embed their model this way) and reads it back. */
static void test_round_trip(void)
{
    PxError err = {0};
    ModelConfig c, back;
    CHECK_OK(parse("{" LLAMA31_BODY ", \"rope_theta\": 500000.0, \"rope_scaling\": {" LLAMA3_SCALING
                   ", \"rope_type\": \"llama3\"}}",
                   &c, &err),
             err);
    cJSON *j = model_config_to_json(&c);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    CHECK(cJSON_IsObject(rs));
    CHECK_STR("llama3", cJSON_GetObjectItemCaseSensitive(rs, "rope_type")->valuestring);
    CHECK(cJSON_GetObjectItemCaseSensitive(rs, "factor")->valuedouble == 8.0);
    CHECK_EQ_INT(8192, cJSON_GetObjectItemCaseSensitive(rs, "original_max_position_embeddings")->valueint);
    CHECK_OK(model_config_from_json(j, "round trip", &back, &err), err);
    char *a = cJSON_PrintUnformatted(j);
    cJSON *k = model_config_to_json(&back);
    char *b = cJSON_PrintUnformatted(k);
    CHECK_STR(a, b);
    check_llama31(&back);
    free(a);
    free(b);
    cJSON_Delete(j);
    cJSON_Delete(k);
    /* without scaling there is no key */
    CHECK_OK(model_config_load("llama3-8b", &c, &err), err);
    j = model_config_to_json(&c);
    CHECK(cJSON_GetObjectItemCaseSensitive(j, "rope_scaling") == NULL);
    cJSON_Delete(j);
}

int main(void)
{
    px_log_set_quiet(1); /* the planning-sequence notes and "not carried" warnings */
    test_transformers4();
    test_transformers5();
    test_other_scalings();
    test_errors();
    test_qwen3_moe_transformers5();
    test_round_trip();
    TEST_DONE("test_model_hf");
}
