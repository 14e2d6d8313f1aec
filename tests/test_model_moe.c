/* Golden tests of the mixture-of-experts models: exact total and active parameter counts of the
 * zoo's MoE models, derived by hand below and held against the published figures; Hugging Face
 * config.json import of every MoE model type (and Qwen3, and transformers 5's rope_parameters)
 * against the zoo entries; and the errors bad MoE input gets. */
#include "model/model.h"
#include "test.h"

/* n in units of `unit`, rounded to the nearest (a published "671B" is round(n / 1e9) = 671). */
static long long round_to(double n, double unit) { return llround(n / unit); }

static ModelConfig zoo(const char *name)
{
    PxError err = {0};
    ModelConfig c;
    CHECK_OK(model_config_load(name, &c, &err), err);
    return c;
}

/* Each count is the layer's tensors (model_config_params' comment), summed by hand here.
 * Notation: h hidden, V vocab, E routed experts, k top-k; a SwiGLU MLP of width f is 3 h f. */
static void test_counts(void)
{
    ModelConfig c;

    /* DeepSeek-V3: h 7168, 128 heads, V 129280, 61 layers of which 3 dense and 58 MoE.
     * MLA attention: q_a 1536 x 7168 = 11,010,048; q_norm 1,536; q_b 128 x 192 x 1536 =
     *   37,748,736; kv_a 576 x 7168 = 4,128,768; kv_norm 512; kv_b 128 x 256 x 512 = 16,777,216;
     *   proj 7168 x 16384 = 117,440,512; two norms 14,336: 187,121,664 per layer.
     * Dense MLP 3 x 7168 x 18432 = 396,361,728: a dense layer 583,483,392.
     * MoE: router 256 x 7168 = 1,835,008; one expert 3 x 7168 x 2048 = 44,040,192, 256 of them
     *   11,274,289,152, the shared one 44,040,192: a MoE layer 11,507,286,016.
     * Embedding and output layer 2 x 926,679,040; final norm 7,168.
     * Main model: 3 x 583,483,392 + 58 x 11,507,286,016 + 1,853,358,080 + 7,168
     *   = 671,026,404,352.
     * MTP module: enorm, hnorm, final norm 3 x 7,168; eh_proj 7168 x 14336 = 102,760,448; one
     *   MoE layer 11,507,286,016: 11,610,068,000. With it: 682,636,472,320.
     * Active, main model: a MoE layer passes 187,121,664 + 1,835,008 + (8 + 1) x 44,040,192 =
     *   585,318,400; 3 x 583,483,392 + 58 x 585,318,400 + 1,853,365,248 = 37,552,282,624.
     * With MTP: + 21,504 + 102,760,448 + 585,318,400 = 38,240,382,976. */
    c = zoo("deepseek-v3");
    CHECK_EQ_U64(682636472320ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(38240382976ull, (uint64_t)model_config_active_params(&c));
    const double emb = (double)c.vocab * c.hidden;
    /* The 685B on the checkpoint (684,531,386,000 in its safetensors) counts what parallax shares
     * or does not train: the MTP layer's own copies of the embedding and output layer
     * (1,853,358,080), the routers' e_score_correction_bias (256 x 59 MoE layers = 15,104,
     * selection-only biases updated outside the gradient) and the FP8 weights' 128 x 128 block
     * scales: per attention 672 + 2304 + 280 + 1024 + 7168 = 11,448, per dense MLP 3 x 8064,
     * per expert 3 x 896 (257 per MoE layer), eh_proj left in bf16:
     * 3 x (11,448 + 24,192) + 59 x (11,448 + 257 x 2,688) = 41,540,496. */
    CHECK_EQ_U64(684531386000ull,
                 (uint64_t)(model_config_params(&c) + 2 * emb + 256 * 59 + 41540496.0));
    CHECK_EQ_INT(685, round_to(684531386000.0, 1e9));
    c.mtp_layers = 0;
    CHECK_EQ_U64(671026404352ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(37552282624ull, (uint64_t)model_config_active_params(&c));
    CHECK_EQ_INT(671, round_to(model_config_params(&c), 1e9));
    /* The report's 37B activated: 36.6B without the input embedding (a lookup), 37.55B with
     * it; the former rounds to 37, the latter only truncates to it. */
    CHECK_EQ_INT(37, round_to(model_config_active_params(&c) - emb, 1e9));
    CHECK_EQ_INT(37, (long long)(model_config_active_params(&c) / 1e9));

    /* Qwen3-235B-A22B: h 4096, 64 query heads and 4 KV heads of 128, V 151936, 94 MoE layers.
     * Attention: qkv (8192 + 1024) x 4096 = 37,748,736; proj 4096 x 8192 = 33,554,432; q/k norms
     *   256; two norms 8,192: 71,311,616.
     * MoE: router 128 x 4096 = 524,288; an expert 3 x 4096 x 1536 = 18,874,368, 128 of them
     *   2,415,919,104: a layer 2,487,755,008.
     * Total 94 x 2,487,755,008 + 2 x 622,329,856 + 4,096 = 235,093,634,560.
     * Active: 71,311,616 + 524,288 + 8 x 18,874,368 = 222,830,848 a layer;
     *   94 x 222,830,848 + 1,244,663,808 = 22,190,763,520. */
    c = zoo("qwen3-235b-a22b");
    CHECK_EQ_U64(235093634560ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(22190763520ull, (uint64_t)model_config_active_params(&c));
    CHECK_EQ_INT(235, round_to(model_config_params(&c), 1e9));
    CHECK_EQ_INT(22, round_to(model_config_active_params(&c), 1e9));

    /* Qwen3-30B-A3B: h 2048, 32 query heads and 4 KV heads of 128, 48 MoE layers.
     * Attention: qkv 5120 x 2048 = 10,485,760; proj 2048 x 4096 = 8,388,608; q/k norms 256;
     *   norms 4,096: 18,878,720. MoE: router 262,144; an expert 3 x 2048 x 768 = 4,718,592,
     *   128 of them 603,979,776: a layer 623,120,640.
     * Total 48 x 623,120,640 + 2 x 311,164,928 + 2,048 = 30,532,122,624.
     * Active: 18,878,720 + 262,144 + 8 x 4,718,592 = 56,889,600 a layer;
     *   48 x 56,889,600 + 622,331,904 = 3,353,032,704. Qwen's "3.3B activated" counts the
     *   embeddings (3.04B without them) and truncates 3.35 to one decimal. */
    c = zoo("qwen3-30b-a3b");
    CHECK_EQ_U64(30532122624ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(3353032704ull, (uint64_t)model_config_active_params(&c));
    CHECK_EQ_INT(305, round_to(model_config_params(&c), 1e8));
    CHECK_EQ_INT(33, (long long)(model_config_active_params(&c) / 1e8));

    /* gpt-oss-120b: h 2880, 64 query heads and 8 KV heads of 64, V 201088, 36 MoE layers.
     * Attention: qkv 5120 x 2880 = 14,745,600 + bias 5,120; proj 2880 x 4096 = 11,796,480 +
     *   bias 2,880; sinks 64; norms 5,760: 26,555,904 (x 36 = 0.96B, the model card's).
     * MoE: router 128 x 2880 + 128 = 368,768; an expert 3 x 2880 x 2880 + 5760 + 2880 =
     *   24,891,840, 128 of them 3,186,155,520: MLP 3,186,524,288 (x 36 = 114.71B, the card's).
     * Total 36 x 3,213,080,192 + 2 x 579,133,440 + 2,880 = 116,829,156,672.
     * Active: 26,555,904 + 368,768 + 4 x 24,891,840 = 126,492,032 a layer;
     *   36 x 126,492,032 + 1,158,269,760 = 5,711,982,912. The card's 5.13B active counts the
     *   output layer but not the embedding: 5,711,982,912 - 579,133,440 = 5,132,849,472. */
    c = zoo("gpt-oss-120b");
    CHECK_EQ_U64(116829156672ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(5711982912ull, (uint64_t)model_config_active_params(&c));
    CHECK_EQ_INT(11683, round_to(model_config_params(&c), 1e7));
    CHECK_EQ_INT(513, round_to(model_config_active_params(&c) - (double)c.vocab * c.hidden, 1e7));

    /* Mixtral 8x7B: h 4096, 32 query heads and 8 KV heads of 128, V 32000, 32 MoE layers.
     * Attention: qkv 6144 x 4096 = 25,165,824; proj 16,777,216; norms 8,192: 41,951,232.
     * MoE: router 8 x 4096 = 32,768; an expert 3 x 4096 x 14336 = 176,160,768, 8 of them
     *   1,409,286,144: a layer 1,451,270,144.
     * Total 32 x 1,451,270,144 + 2 x 131,072,000 + 4,096 = 46,702,792,704.
     * Active: 41,951,232 + 32,768 + 2 x 176,160,768 = 394,305,536 a layer;
     *   32 x 394,305,536 + 262,148,096 = 12,879,925,248 (Mistral's 12.9B counts the embeddings). */
    c = zoo("mixtral-8x7b");
    CHECK_EQ_U64(46702792704ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(12879925248ull, (uint64_t)model_config_active_params(&c));
    CHECK_EQ_INT(467, round_to(model_config_params(&c), 1e8));
    CHECK_EQ_INT(129, round_to(model_config_active_params(&c), 1e8));

    /* Mixtral 8x22B: h 6144, 48 query heads and 8 KV heads of 128, V 32000, 56 MoE layers.
     * Attention: qkv 8192 x 6144 = 50,331,648; proj 37,748,736; norms 12,288: 88,092,672.
     * MoE: router 8 x 6144 = 49,152; an expert 3 x 6144 x 16384 = 301,989,888, 8 of them
     *   2,415,919,104: a layer 2,504,060,928.
     * Total 56 x 2,504,060,928 + 2 x 196,608,000 + 6,144 = 140,620,634,112 (Mistral's 141B).
     * Active: 88,092,672 + 49,152 + 2 x 301,989,888 = 692,121,600 a layer;
     *   56 x 692,121,600 + 393,222,144 = 39,152,031,744 (Mistral's 39B). */
    c = zoo("mixtral-8x22b");
    CHECK_EQ_U64(140620634112ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(39152031744ull, (uint64_t)model_config_active_params(&c));

    /* Mixtral-8x22B-G8T8 (Liu et al. 2025): each expert cut into 8, 64 of 2048, top-8. The same
     * experts' parameters, a router of 64 x 6144 = 393,216: a layer 2,504,404,992; total
     * 56 x 2,504,404,992 + 393,222,144 = 140,639,901,696. Active: 88,092,672 + 393,216 +
     * 8 x 37,748,736 = 390,475,776 a layer; 56 x 390,475,776 + 393,222,144 = 22,259,865,600. */
    c = zoo("mixtral-8x22b-g8t8");
    CHECK_EQ_U64(140639901696ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(22259865600ull, (uint64_t)model_config_active_params(&c));

    /* Qwen2-57B-A14B: h 3584, 28 query heads and 4 KV heads of 128, V 151936, 28 MoE layers.
     * Attention: qkv 4608 x 3584 = 16,515,072 + bias 4,608; proj 12,845,056; norms 7,168:
     *   29,371,904.
     * MoE: router 64 x 3584 = 229,376; an expert 3 x 3584 x 2560 = 27,525,120, 64 of them
     *   1,761,607,680; the shared experts 3 x 3584 x 20480 = 220,200,960 and their gate 3,584:
     *   a layer 2,011,413,504.
     * Total 28 x 2,011,413,504 + 2 x 544,538,624 + 3,584 = 57,408,658,944 (Qwen's 57B).
     * Active: 29,371,904 + 229,376 + 8 x 27,525,120 + 220,200,960 + 3,584 = 470,006,784 a layer;
     *   28 x 470,006,784 + 1,089,080,832 = 14,249,270,784 (Qwen's A14B). */
    c = zoo("qwen2-57b-a14b");
    CHECK_EQ_U64(57408658944ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(14249270784ull, (uint64_t)model_config_active_params(&c));

    /* tiny-moe: h 64, 8 heads and 4 KV heads of 8, V 256, layer 0 dense, layers 1-3 MoE.
     * Attention: qkv 128 x 64 = 8,192; proj 4,096; norms 128: 12,416.
     * Dense MLP 3 x 64 x 176 = 33,792: 46,208. MoE: router 512; an expert 3 x 64 x 64 = 12,288,
     *   8 of them 98,304; the shared one 12,288: a MoE layer 123,520.
     * Total 46,208 + 3 x 123,520 + 2 x 16,384 + 64 = 449,600.
     * Active: 12,416 + 512 + (2 + 1) x 12,288 = 49,792; 46,208 + 3 x 49,792 + 32,832 = 228,416. */
    c = zoo("tiny-moe");
    CHECK_EQ_U64(449600ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(228416ull, (uint64_t)model_config_active_params(&c));
    CHECK(!model_layer_is_moe(&c, 0) && model_layer_is_moe(&c, 1) && model_layer_is_moe(&c, 3));

    /* A dense model's active count is its total. */
    c = zoo("llama3-8b");
    CHECK_EQ_U64((uint64_t)model_config_params(&c), (uint64_t)model_config_active_params(&c));
}

static int parse(const char *text, ModelConfig *c, PxError *err)
{
    cJSON *j = px_json_parse(text, "config.json", err);
    CHECK(j != NULL);
    int rc = model_config_from_json(j, "config.json", c, err);
    cJSON_Delete(j);
    return rc;
}

/* The config.json gives the zoo entry, field for field (the parallax JSON of both, named alike),
 * but the sequence: a RoPE model's seq_len is only the default job length, and the zoo keeps the
 * pre-training length where the release lists its longest context (DeepSeek-V3, Qwen3). */
static void check_same(const char *zoo_name, const char *hf_text)
{
    PxError err = {0};
    ModelConfig hf, z = zoo(zoo_name);
    CHECK_OK(parse(hf_text, &hf, &err), err);
    px_strlcpy(hf.name, z.name, sizeof hf.name);
    CHECK(z.position == MODEL_POS_ROPE);
    hf.seq_len = z.seq_len;
    cJSON *a = model_config_to_json(&z), *b = model_config_to_json(&hf);
    char *sa = cJSON_PrintUnformatted(a), *sb = cJSON_PrintUnformatted(b);
    CHECK_STR(sa, sb);
    CHECK_EQ_U64((uint64_t)model_config_params(&z), (uint64_t)model_config_params(&hf));
    free(sa);
    free(sb);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* The released config.json files, as their repositories hold them (keys parallax does not read
 * trimmed; those a test varies given with each use, since cJSON reads the first of a repeated
 * key). */
#define DEEPSEEK_V3                                                                               \
    "\"model_type\": \"deepseek_v3\", \"hidden_size\": 7168, \"intermediate_size\": 18432,"        \
    " \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, \"num_nextn_predict_layers\": 1," \
    " \"num_attention_heads\": 128, \"num_key_value_heads\": 128, \"n_shared_experts\": 1,"       \
    " \"n_routed_experts\": 256, \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512,"           \
    " \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"                       \
    " \"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", \"num_experts_per_tok\": 8,"      \
    " \"first_k_dense_replace\": 3,"                                                              \
    " \"norm_topk_prob\": true, \"aux_loss_alpha\": 0.001, \"seq_aux\": true,"                     \
    " \"hidden_act\": \"silu\", \"max_position_embeddings\": 163840, \"rms_norm_eps\": 1e-06,"      \
    " \"tie_word_embeddings\": false, \"rope_theta\": 10000, \"attention_bias\": false,"           \
    " \"vocab_size\": 129280"

static void test_hf_import(void)
{
    PxError err = {0};
    ModelConfig c;
    check_same("deepseek-v3", "{" DEEPSEEK_V3 ", \"moe_layer_freq\": 1, \"n_group\": 8,"
                              " \"topk_group\": 4, \"scoring_func\": \"sigmoid\"}");
    check_same("qwen3-235b-a22b",
        "{\"model_type\": \"qwen3_moe\", \"attention_bias\": false, \"decoder_sparse_step\": 1,"
        " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
        " \"intermediate_size\": 12288, \"max_position_embeddings\": 40960, \"max_window_layers\": 94,"
        " \"mlp_only_layers\": [], \"moe_intermediate_size\": 1536, \"norm_topk_prob\": true,"
        " \"num_attention_heads\": 64, \"num_experts\": 128, \"num_experts_per_tok\": 8,"
        " \"num_hidden_layers\": 94, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06,"
        " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001,"
        " \"sliding_window\": null, \"tie_word_embeddings\": false, \"use_sliding_window\": false,"
        " \"vocab_size\": 151936}");
#define QWEN3_30B                                                                                 \
    "\"model_type\": \"qwen3_moe\", \"attention_bias\": false, \"decoder_sparse_step\": 1,"         \
    " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"                         \
    " \"intermediate_size\": 6144, \"max_position_embeddings\": 40960, \"max_window_layers\": 48,"  \
    " \"mlp_only_layers\": [], \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"          \
    " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8,"              \
    " \"num_hidden_layers\": 48, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06,"             \
    " \"router_aux_loss_coef\": 0.001, \"sliding_window\": null, \"tie_word_embeddings\": false,"  \
    " \"use_sliding_window\": false, \"vocab_size\": 151936"
    check_same("qwen3-30b-a3b", "{" QWEN3_30B ", \"rope_theta\": 1000000.0}");
    /* transformers 5 moves rope_theta into rope_parameters, keyed by layer type where the
     * layer types differ */
    check_same("qwen3-30b-a3b",
               "{" QWEN3_30B ", \"rope_parameters\": {\"rope_type\": \"default\","
               " \"rope_theta\": 1000000.0}}");
    check_same("qwen3-30b-a3b",
               "{" QWEN3_30B ", \"rope_parameters\": {\"full_attention\": {\"rope_type\": "
               "\"default\", \"rope_theta\": 1000000.0}, \"sliding_attention\": {\"rope_type\": "
               "\"default\", \"rope_theta\": 10000.0}}}");
    CHECK_INPUT_ERROR(parse("{" QWEN3_30B ", \"rope_parameters\": {\"rope_theta\": \"big\"}}", &c,
                            &err),
                      err, "rope_parameters.rope_theta");
#define SF2 "\"sliding_attention\", \"full_attention\", "
    check_same("gpt-oss-120b",
        "{\"model_type\": \"gpt_oss\", \"attention_bias\": true, \"experts_per_token\": 4,"
        " \"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2880,"
        " \"initial_context_length\": 4096, \"intermediate_size\": 2880, \"layer_types\": ["
        SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2 SF2
        "\"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 131072,"
        " \"num_attention_heads\": 64, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 36,"
        " \"num_key_value_heads\": 8, \"num_local_experts\": 128, \"rms_norm_eps\": 1e-05,"
        " \"rope_scaling\": {\"beta_fast\": 32.0, \"beta_slow\": 1.0, \"factor\": 32.0,"
        " \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\", \"truncate\": false},"
        " \"rope_theta\": 150000, \"router_aux_loss_coef\": 0.9, \"sliding_window\": 128,"
        " \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false, \"vocab_size\": 201088}");
#define MIXTRAL                                                                                   \
    "\"model_type\": \"mixtral\", \"hidden_act\": \"silu\", \"hidden_size\": 4096,"                 \
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"                           \
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"         \
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.02,"         \
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"vocab_size\": 32000"
    check_same("mixtral-8x7b", "{" MIXTRAL ", \"num_local_experts\": 8, \"num_experts_per_tok\": 2}");

    /* Qwen3 (dense): per-head q/k norms, head_dim apart from hidden / heads. Qwen3-0.6B:
     * 28 x (qkv 4096 x 1024 + proj 1024 x 2048 + 256 + 2,048 + MLP 3 x 1024 x 3072) =
     * 28 x 15,730,944, + tied embedding 155,582,464 + 1,024 = 596,049,920 (0.6B). */
    CHECK_OK(parse("{\"model_type\": \"qwen3\", \"head_dim\": 128, \"hidden_size\": 1024,"
                   " \"intermediate_size\": 3072, \"max_position_embeddings\": 40960,"
                   " \"num_attention_heads\": 16, \"num_hidden_layers\": 28,"
                   " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000,"
                   " \"tie_word_embeddings\": true, \"vocab_size\": 151936}",
                   &c, &err),
             err);
    CHECK(c.qk_norm && c.head_dim == 128 && c.tied_embeddings && !c.qkv_bias && c.moe.experts == 0);
    CHECK_EQ_U64(596049920ull, (uint64_t)model_config_params(&c));
    /* Qwen3-8B: 36 x 192,946,432 + 2 x 622,329,856 + 4,096 = 8,190,735,360 (8.2B). */
    CHECK_OK(parse("{\"model_type\": \"qwen3\", \"head_dim\": 128, \"hidden_size\": 4096,"
                   " \"intermediate_size\": 12288, \"max_position_embeddings\": 40960,"
                   " \"num_attention_heads\": 32, \"num_hidden_layers\": 36,"
                   " \"num_key_value_heads\": 8, \"rope_theta\": 1000000,"
                   " \"tie_word_embeddings\": false, \"vocab_size\": 151936}",
                   &c, &err),
             err);
    CHECK_EQ_U64(8190735360ull, (uint64_t)model_config_params(&c));

    /* Qwen2-MoE (Qwen1.5-MoE-A2.7B): q/k/v biases, 60 experts of 1408, top-4, a shared expert
     * of 5632 behind a sigmoid gate. Attention 6144 x 2048 + 6,144 + 2048 x 2048 + 4,096 =
     * 16,787,456; MoE 60 x 2048 + 60 x 3 x 2048 x 1408 + 3 x 2048 x 5632 + 2,048 = 553,773,056;
     * total 24 x 570,560,512 + 2 x 311,164,928 + 2,048 = 14,315,784,192 (14.3B); active
     * 24 x (16,787,456 + 122,880 + 4 x 8,650,752 + 34,603,008 + 2,048) + 622,331,904 =
     * 2,689,173,504 (2.7B). */
#define QWEN2_MOE                                                                                 \
    "\"model_type\": \"qwen2_moe\", \"hidden_size\": 2048, \"intermediate_size\": 5632,"            \
    " \"max_position_embeddings\": 8192, \"moe_intermediate_size\": 1408,"                         \
    " \"num_attention_heads\": 16, \"num_experts\": 60, \"num_experts_per_tok\": 4,"               \
    " \"num_hidden_layers\": 24, \"num_key_value_heads\": 16, \"rope_theta\": 1000000.0,"          \
    " \"shared_expert_intermediate_size\": 5632, \"sliding_window\": 32768,"                       \
    " \"tie_word_embeddings\": false, \"use_sliding_window\": false, \"vocab_size\": 151936"
    CHECK_OK(parse("{" QWEN2_MOE ", \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
                   " \"norm_topk_prob\": false}", &c, &err), err);
    CHECK(c.qkv_bias && c.moe.shared_gate && c.moe.shared_ffn == 5632 && !c.moe.norm_topk);
    CHECK_EQ_INT(1408, c.ffn_hidden); /* no dense layer: the experts' width */
    CHECK_EQ_U64(14315784192ull, (uint64_t)model_config_params(&c));
    CHECK_EQ_U64(2689173504ull, (uint64_t)model_config_active_params(&c));
    /* a leading run of dense layers is first_dense; the dense MLP keeps intermediate_size */
    CHECK_OK(parse("{" QWEN2_MOE ", \"mlp_only_layers\": [0, 1]}", &c, &err), err);
    CHECK(c.moe.first_dense == 2 && c.ffn_hidden == 5632 && model_moe_layers_in(&c, 0, 24) == 22);
    /* any other set cannot be placed: warned about, modelled as MoE layers */
    CHECK_OK(parse("{" QWEN2_MOE ", \"mlp_only_layers\": [5]}", &c, &err), err);
    CHECK_EQ_INT(24, model_moe_layers_in(&c, 0, 24));
    /* decoder_sparse_step 2: layers 1, 3, 5 ... are MoE ((l + 1) % 2 == 0) */
    CHECK_OK(parse("{" QWEN2_MOE ", \"decoder_sparse_step\": 2}", &c, &err), err);
    CHECK(!model_layer_is_moe(&c, 0) && model_layer_is_moe(&c, 1) && !model_layer_is_moe(&c, 2));
    CHECK_EQ_INT(5632, c.ffn_hidden);
    /* DeepSeek's moe_layer_freq: MoE where l >= first_k_dense_replace and l % freq == 0 */
    CHECK_OK(parse("{" DEEPSEEK_V3 ", \"moe_layer_freq\": 2}", &c, &err), err);
    for (int l = 0; l < 61; l++)
        CHECK_EQ_INT(l >= 3 && l % 2 == 0, model_layer_is_moe(&c, l));
}

static void test_bad_input(void)
{
    PxError err = {0};
    ModelConfig c;
    CHECK_INPUT_ERROR(parse("{" MIXTRAL ", \"num_local_experts\": 8, \"num_experts_per_tok\": 9}",
                            &c, &err),
                      err, "num_experts_per_tok 9 exceeds num_local_experts 8");
    CHECK_INPUT_ERROR(parse("{" DEEPSEEK_V3 ", \"n_group\": 7}", &c, &err), err,
                      "n_group 7 must divide n_routed_experts 256");
    CHECK_INPUT_ERROR(parse("{" DEEPSEEK_V3 ", \"n_group\": 8, \"topk_group\": 9}", &c, &err), err,
                      "topk_group 9 exceeds n_group 8");
    CHECK_INPUT_ERROR(parse("{" DEEPSEEK_V3 ", \"scoring_func\": \"tanh\"}", &c, &err), err,
                      "scoring_func: 'tanh' is not supported (softmax, sigmoid)");
    CHECK_INPUT_ERROR(parse("{" MIXTRAL ", \"num_experts_per_tok\": 2}", &c, &err), err,
                      "num_local_experts: missing required key");
#define NATIVE                                                                                    \
    "{\"name\": \"m\", \"family\": \"llama\", \"layers\": 2, \"hidden\": 64, \"heads\": 8,"         \
    " \"vocab\": 256, \"seq_len\": 64, \"moe\": {\"experts\": 8, \"expert_ffn\": 64, "
    CHECK_OK(parse(NATIVE "\"topk\": 2}}", &c, &err), err);
    CHECK_INPUT_ERROR(parse(NATIVE "\"topk\": 9}}", &c, &err), err,
                      "moe.topk 9 must be between 1 and the 8 experts");
    CHECK_INPUT_ERROR(parse(NATIVE "\"topk\": 2, \"groups\": 3, \"topk_groups\": 1}}", &c, &err),
                      err, "moe.groups 3 must divide the 8 experts");
    CHECK_INPUT_ERROR(parse(NATIVE "\"topk\": 2, \"score\": \"tanh\"}}", &c, &err), err,
                      "moe.score");
    CHECK_INPUT_ERROR(parse("{\"model_type\": \"dbrx\"}", &c, &err), err,
                      "model_type 'dbrx' is not supported (gpt2, llama, mistral, qwen2, qwen3, "
                      "mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss)");
}

/* The native format carries every new key through a write and a read. */
static void test_roundtrip(void)
{
    static const char *const names[] = {"deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b",
                                        "tiny-moe"};
    PxError err = {0};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        ModelConfig a = zoo(names[i]), b;
        cJSON *j = model_config_to_json(&a);
        CHECK_OK(model_config_from_json(j, names[i], &b, &err), err);
        cJSON *k = model_config_to_json(&b);
        CHECK(cJSON_Compare(j, k, 1));
        CHECK_EQ_U64((uint64_t)model_config_active_params(&a),
                     (uint64_t)model_config_active_params(&b));
        cJSON_Delete(j);
        cJSON_Delete(k);
    }
}

int main(void)
{
    px_log_set_quiet(1);
    test_counts();
    test_hf_import();
    test_bad_input();
    test_roundtrip();
    TEST_DONE("model_moe");
}
