/* Megatron-Bridge export: the recipe to start from and the ConfigContainer overrides that make it
 * the plan, as scripts/training/run_recipe.py takes them (--recipe NAME, then Hydra overrides).
 *
 * Checked against Megatron-Bridge 0.6.2 (PyPI) with Megatron-Core 0.19.2, through its own path:
 * the recipe builds the ConfigContainer, process_config_with_overrides applies the overrides,
 * runtime_config_update resolves the precision and runs ConfigContainer.validate(), and every
 * warning Bridge logs on the way fails the check (tests/clients/bridge_check.py). Facts of that
 * version the code below relies on:
 *   - recipes keep the model's layout and architecture flat under model.* (the model provider, a
 *     TransformerConfig); Bridge's main branch nests them under model.transformer.*;
 *   - the dataset's length is dataset.seq_length, which validate() compares with
 *     model.seq_length (0.3.1's dataset.sequence_length is now copied from it);
 *   - run_recipe.py finds a recipe among megatron.bridge.recipes' names: the legacy ones
 *     (llama3_8b_pretrain_config, ...) and 0.6's own (gpt3_175b_pretrain_32gpu_h100_bf16_config);
 *   - the activation function and the layer spec are callables no override can set, so the
 *     recipe a plan starts from must have the plan's MLP (GELU: GPT-3's, SwiGLU: the others);
 *   - a recipe may hold its precision as a recipe name or as a MixedPrecisionConfig, and the
 *     override grammar replaces either with a name but sets keys of neither; a _target_ is
 *     instantiated only from an allowlist (megatron., torch., ...), which since 0.4.1 refuses
 *     dataclasses.replace, and a refused one is only a logged warning that keeps the recipe's
 *     precision: a plan that differs from a named precision recipe deletes it and adds a whole
 *     MixedPrecisionConfig (bridge_precision);
 *   - a recipe's CommOverlapConfig turns data-parallel overlap on by itself whenever dp > 1, so
 *     comm_overlap is null and the plan's overlaps are the DDP and model keys. */
#include "export/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

/* A recipe and the model it builds (from the Hugging Face config it loads: facts of those
 * configs, the same as parallax's zoo entries). vocab 0: the tokenizer's; rope_theta 0: learned
 * positions; llama3 > 0: Llama 3.1's rope scaling factor. */
typedef struct {
    const char *recipe;
    const char *source; /* what the recipe loads */
    int layers, hidden, heads, kv_heads, vocab;
    double rope_theta, llama3;
    int experts, topk, expert_ffn;
    int mla;
} BridgeRecipe;

static const BridgeRecipe bridge_recipes[] = {
    {"llama3_8b_pretrain_config", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 128256, 500000, 0, 0, 0, 0, 0},
    {"llama3_70b_pretrain_config", "meta-llama/Meta-Llama-3-70B", 80, 8192, 64, 8, 128256, 500000, 0, 0, 0, 0, 0},
    {"llama31_8b_pretrain_config", "meta-llama/Meta-Llama-3.1-8B", 32, 4096, 32, 8, 128256, 500000, 8, 0, 0, 0, 0},
    {"qwen3_30b_a3b_pretrain_config", "Qwen/Qwen3-30B-A3B", 48, 2048, 32, 4, 151936, 1000000, 0, 128, 8, 768, 0},
    {"deepseek_v3_pretrain_config", "deepseek-ai/DeepSeek-V3", 61, 7168, 128, 128, 129280, 10000, 0, 256, 8, 2048, 1},
    {"gpt3_175b_pretrain_32gpu_h100_bf16_config", "GPTProvider175B", 96, 12288, 96, 96, 0, 0, 0, 0, 0, 0, 0},
    /* new in 0.4-0.6: Qwen3's larger MoE and GPT-OSS (its biases and attention sinks are the
     * recipe's own provider's) */
    {"qwen3_235b_a22b_pretrain_config", "Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 151936, 1000000, 0, 128, 8, 1536, 0},
    {"gpt_oss_120b_pretrain_config", "openai/gpt-oss-120b", 36, 2880, 64, 8, 201088, 150000, 0, 128, 4, 2880, 0},
};

enum { BRIDGE_LLAMA3_8B = 0, BRIDGE_QWEN3_30B = 3, BRIDGE_DEEPSEEK_V3 = 4, BRIDGE_GPT3_175B = 5, BRIDGE_GPT_OSS = 7 };

static int recipe_matches(const BridgeRecipe *r, const ModelConfig *c)
{
    const int rope = c->position == MODEL_POS_ROPE;
    /* Llama 3.1's recipes carry Meta's frequency factors and 8192-token original context, which
     * Megatron-Core fixes: a scaling with others is not theirs */
    const double llama3 = c->rope_scaling.type != MODEL_ROPE_SCALING_LLAMA3 ? 0
                          : model_rope_scaling_megatron(c)                 ? c->rope_scaling.factor
                                                                          : -1;
    return r->layers == c->layers && r->hidden == c->hidden && r->heads == c->heads &&
           r->kv_heads == c->kv_heads && (r->vocab == 0 || r->vocab == c->vocab) &&
           r->rope_theta == (rope ? c->rope_theta : 0) && r->llama3 == llama3 &&
           r->experts == c->moe.experts && r->topk == (c->moe.experts ? c->moe.topk : 0) &&
           r->expert_ffn == (c->moe.experts ? c->moe.expert_ffn : 0) &&
           r->mla == (c->mla.kv_lora_rank > 0) && (r->rope_theta == 0) == (c->mlp == MODEL_GELU);
}

/* The recipe to start from: the model's own where Megatron-Bridge has one (*own 1), else the
 * nearest in what overrides cannot change: MLA (DeepSeek-V3's provider), experts (Qwen3-MoE's),
 * a GELU MLP (GPT-3's), else Llama 3's. */
static const BridgeRecipe *pick_recipe(const ModelConfig *c, int *own)
{
    const int n = (int)(sizeof bridge_recipes / sizeof bridge_recipes[0]);
    for (int i = 0; i < n; i++)
        if (recipe_matches(&bridge_recipes[i], c)) {
            *own = 1;
            return &bridge_recipes[i];
        }
    *own = 0;
    if (c->mla.kv_lora_rank > 0)
        return &bridge_recipes[BRIDGE_DEEPSEEK_V3];
    if (c->moe.experts > 0)
        return &bridge_recipes[BRIDGE_QWEN3_30B];
    if (c->mlp == MODEL_GELU)
        return &bridge_recipes[BRIDGE_GPT3_175B];
    return &bridge_recipes[BRIDGE_LLAMA3_8B];
}

/* Overrides as shell words, several to a line (ov takes one or more, space-separated; none holds a
 * space or a single quote): a word with a character the shell would expand ({} [] ~ * ? | and the
 * like) is single-quoted, so that a line pastes onto run_recipe.py's
 * command line as it is. */
typedef struct {
    FILE *f;
    int words; /* on the current line */
} BridgeOut;

static void ov(BridgeOut *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void ov(BridgeOut *o, const char *fmt, ...)
{
    char w[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w, sizeof w, fmt, ap);
    va_end(ap);
    for (char *save = NULL, *word = strtok_r(w, " ", &save); word; word = strtok_r(NULL, " ", &save)) {
        const int quote = strpbrk(word, "{}[]~*?$\"`!&;|<>()\\#") != NULL;
        fprintf(o->f, "%s%s%s%s", o->words++ ? " " : "", quote ? "'" : "", word, quote ? "'" : "");
    }
}

static void ov_end(BridgeOut *o)
{
    if (o->words)
        fputc('\n', o->f);
    o->words = 0;
}

/* An int key, null where Megatron-Core says "none" by None. */
static void ov_int_or_null(BridgeOut *o, const char *key, int v, int is_null)
{
    if (is_null)
        ov(o, "%s=null", key);
    else
        ov(o, "%s=%d", key, v);
}

/* The pipeline split: Megatron-Core's first/last stage counts where the middle stages are even,
 * else its layout string ("Et*3|t*4|...|t*3mL": E the embedding, t a layer, m a multi-token
 * prediction module, L the loss), which overrides whatever split the recipe holds. */
static void bridge_split(BridgeOut *o, const ModelPlan *p, const ModelDims *d)
{
    ExportMegatronSplit ms;
    export_megatron_pipeline(p, d, &ms);
    /* quoted for Hydra too: unquoted, its ',' would make a list and its '(' a syntax error */
    if (ms.layout[0])
        ov(o, "model.pipeline_model_parallel_layout=\"%s\"", ms.layout);
    else
        ov(o, "model.pipeline_model_parallel_layout=null");
    ov_int_or_null(o, "model.num_layers_in_first_pipeline_stage", ms.first, ms.first < 0);
    ov_int_or_null(o, "model.num_layers_in_last_pipeline_stage", ms.last, ms.last < 0);
    ov(o, "model.account_for_embedding_in_pipeline_split=%s model.account_for_loss_in_pipeline_split=%s",
       ms.embed ? "true" : "false", ms.loss ? "true" : "false");
    ov_end(o);
}

/* The architecture, every key parallax's model describes, whichever recipe holds it already. */
static void bridge_model(BridgeOut *o, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const ModelJob *t = &p->spec.job;
    ov(o, "model.num_layers=%d", c->layers);
    ov(o, "model.hidden_size=%d", c->hidden);
    ov(o, "model.ffn_hidden_size=%d", c->ffn_hidden);
    ov(o, "model.num_attention_heads=%d", c->heads);
    if (c->mla.kv_lora_rank == 0) {
        ov(o, "model.num_query_groups=%d", c->kv_heads);
        ov(o, "model.kv_channels=%d", c->head_dim);
    }
    ov_end(o);
    /* the padded vocabulary as the model's (Megatron-Bridge pads only a vocabulary it takes from
     * the tokenizer), the tokenizer's own for a NullTokenizer */
    ov(o, "model.vocab_size=%d tokenizer.vocab_size=%d", d->vocab_pad, c->vocab);
    ov(o, "model.seq_length=%d dataset.seq_length=%d", d->s, d->s);
    ov_end(o);
    ov(o, "model.normalization=%s", c->norm == MODEL_RMSNORM ? "RMSNorm" : "LayerNorm");
    ov(o, "model.layernorm_epsilon=%g", c->norm_eps);
    ov(o, "model.layernorm_zero_centered_gamma=false");
    ov(o, "model.gated_linear_unit=%s", export_bool(c->mlp == MODEL_SWIGLU));
    /* GPT-OSS's own recipe keeps its biases (on every linear layer but the MLP's gates) and its
     * YaRN-scaled RoPE: parallax's model of it has the same biases and plans no RoPE cost */
    const int oss = recipe_matches(&bridge_recipes[BRIDGE_GPT_OSS], c);
    if (!oss) {
        ov(o, "model.add_bias_linear=%s", export_bool(c->bias));
        ov(o, "model.add_qkv_bias=%s", export_bool(c->bias || c->qkv_bias));
    }
    ov(o, "model.qk_layernorm=%s", export_bool(c->qk_norm));
    ov(o, "model.share_embeddings_and_output_weights=%s", export_bool(c->tied_embeddings));
    ov_end(o);
    if (oss) {
        ov(o, "model.rotary_base=%.0f", c->rope_theta);
    } else if (c->position == MODEL_POS_ROPE) {
        ov(o, "model.position_embedding_type=rope model.rotary_base=%.0f", c->rope_theta);
        ov(o, "model.rotary_scaling_factor=null");
        if (c->rope_scaling.type == MODEL_ROPE_SCALING_LLAMA3)
            ov(o, "model.rope_scaling=true model.rope_scaling_factor=%g", c->rope_scaling.factor);
        else
            ov(o, "model.rope_scaling=false");
    } else {
        ov(o, "model.position_embedding_type=learned_absolute");
    }
    ov(o, "model.hidden_dropout=%g model.attention_dropout=%g", t->dropout, t->dropout);
    ov_end(o);
}

/* Experts, latent attention and prediction modules: TransformerConfig's keys, null where the
 * plan has none (the recipe it starts from may). */
static void bridge_moe(BridgeOut *o, const ModelPlan *p)
{
    const ModelConfig *c = &p->spec.model;
    const ModelMoe *m = &c->moe;
    const ModelLayout *l = &p->spec.layout;
    if (m->experts > 0) {
        ov(o, "model.num_moe_experts=%d model.moe_router_topk=%d", m->experts, m->topk);
        ov(o, "model.expert_model_parallel_size=%d model.expert_tensor_parallel_size=%d", l->ep, l->etp);
        ov_end(o);
        ov(o, "model.moe_ffn_hidden_size=%d", m->expert_ffn);
        ov_int_or_null(o, "model.moe_shared_expert_intermediate_size", m->shared_ffn, m->shared_ffn == 0);
        ov(o, "model.moe_shared_expert_gate=%s", export_bool(m->shared_ffn > 0 && m->shared_gate));
        ov_end(o);
        char freq[4 * 4096];
        size_t n = (size_t)snprintf(freq, sizeof freq, "[");
        for (int i = 0; i < c->layers && n < sizeof freq; i++)
            n += (size_t)snprintf(freq + n, sizeof freq - n, "%s%d", i ? "," : "", model_layer_is_moe(c, i));
        ov(o, "model.moe_layer_freq=%s]", freq);
        ov_end(o);
        ov(o, "model.moe_router_score_function=%s", export_router_score(m));
        ov_int_or_null(o, "model.moe_router_num_groups", m->groups, m->groups == 0);
        ov_int_or_null(o, "model.moe_router_group_topk", m->topk_groups, m->groups == 0);
        /* a positive coefficient keeps the recipe's kind of auxiliary loss (DeepSeek-V3's is
         * per sequence): parallax costs them alike */
        if (m->aux_loss_coeff > 0)
            ov(o, "model.moe_aux_loss_coeff=%g", m->aux_loss_coeff);
        else
            ov(o, "model.moe_router_load_balancing_type=none model.moe_aux_loss_coeff=0");
        ov_end(o);
        if (m->capacity_factor > 0)
            ov(o, "model.moe_expert_capacity_factor=%g model.moe_pad_expert_input_to_capacity=true", m->capacity_factor);
        else
            ov(o, "model.moe_expert_capacity_factor=null model.moe_pad_expert_input_to_capacity=false");
        /* the dispatcher parallax costs (a recipe may pick the flex one for the device) */
        ov(o, "model.moe_token_dispatcher_type=%s model.moe_grouped_gemm=true",
           model_moe_dispatcher_name(p->spec.job.moe_dispatcher));
        if (p->spec.job.moe_dispatcher == MODEL_MOE_DISPATCH_FLEX)
            ov(o, "model.moe_flex_dispatcher_backend=deepep");
        ov(o, "model.moe_router_force_load_balancing=%s", export_bool(p->spec.job.moe_force_balance));
        ov(o, "model.moe_shared_expert_overlap=%s", export_bool(l->overlap_ep && m->shared_ffn > 0));
        ov_end(o);
    } else {
        ov(o, "model.num_moe_experts=null");
        ov_end(o);
    }
    if (c->mla.kv_lora_rank > 0) {
        ov(o, "model.multi_latent_attention=true");
        ov_int_or_null(o, "model.q_lora_rank", c->mla.q_lora_rank, c->mla.q_lora_rank == 0);
        ov(o, "model.kv_lora_rank=%d model.qk_head_dim=%d model.qk_pos_emb_head_dim=%d model.v_head_dim=%d",
           c->mla.kv_lora_rank, c->mla.qk_nope_dim, c->mla.qk_rope_dim, c->mla.v_dim);
        ov_end(o);
        /* plain RoPE, as parallax's model: YaRN (the MLA default, and DeepSeek-V3's context
         * extension after pre-training) is not planned; MLA fuses RoPE only under YaRN */
        ov(o, "model.rope_type=rope model.apply_rope_fusion=false");
    }
    ov_int_or_null(o, "model.mtp_num_layers", c->mtp_layers, c->mtp_layers == 0);
    ov_end(o);
}

/* What a recipe's model cannot take of this plan's, as comments. */
static void bridge_model_notes(FILE *f, const ModelPlan *p, const BridgeRecipe *r)
{
    const ModelConfig *c = &p->spec.model;
    const ModelMoe *m = &c->moe;
    /* GPT-OSS's recipe builds its biases and sinks itself, with its banded attention and YaRN */
    const int oss = r == &bridge_recipes[BRIDGE_GPT_OSS];
    if (oss)
        fprintf(f, "# the recipe's GPT-OSS has its QKV, output, router and expert biases and attention sinks, and its banded\n"
                   "# attention (128 tokens) on every other layer, which parallax plans as full causal attention\n");
    if (c->rope_scaling.type == MODEL_ROPE_SCALING_LLAMA3 && !model_rope_scaling_megatron(c))
        fprintf(f, "# NOT EXPRESSIBLE: llama3 rope scaling with low/high frequency factors %g/%g and an original\n"
                   "# context of %d: Megatron-Core fixes them at 1/4 and 8192, model.rope_scaling_factor is the only key\n",
                c->rope_scaling.low_freq_factor, c->rope_scaling.high_freq_factor, c->rope_scaling.original_context);
    if (c->attn_sinks && !oss)
        fprintf(f, "# NOT EXPRESSIBLE on %s: attention sinks (a learned logit per head)\n", r->recipe);
    if (c->proj_bias && !c->bias && !oss)
        fprintf(f, "# NOT EXPRESSIBLE: a bias on the attention output projection alone (model.add_bias_linear\n"
                   "# puts one on every linear layer)\n");
    if (m->experts > 0 && (m->router_bias || m->expert_bias) && !oss)
        fprintf(f, "# NOT EXPRESSIBLE: biases on the router or the experts alone\n");
    if (m->experts > 0 && c->mlp == MODEL_GELU)
        fprintf(f, "# NOT EXPRESSIBLE: GELU experts on %s, whose activation is SiLU (a callable no override sets)\n",
                r->recipe);
    export_imbalance_note(f, p, "setting");
}

/* Megatron-Bridge's mixed-precision recipe for the plan (training/mixed_precision.py): its name
 * when the plan is that recipe, else the whole MixedPrecisionConfig. bf16_mixed reduces gradients
 * in fp32, fp16_mixed in fp16; the FP8 ones are hybrid but mxfp8 (e4m3), keep FP8 parameters but
 * blockwise (mxfp8 with reuse_grad_buf_for_mxfp8_param_ag, which it asserts alongside them),
 * delayed scaling keeps 1024 amaxes reduced by max, and current scaling runs the first and last
 * layers in bf16, which parallax does not plan. A whole config, not a change to the named one:
 * Bridge instantiates MixedPrecisionConfig (its allowlist's megatron. prefix) but, since 0.4.1,
 * not dataclasses.replace, and a refused _target_ is only a warning that keeps the recipe's. */
static void bridge_precision(BridgeOut *o, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    static const char *const fp8_names[] = {NULL, "fp8_delayed_scaling", "fp8_current_scaling",
                                            "fp8_subchannel_scaling", "mxfp8"};
    static const char *const fp8_recipes[] = {NULL, "delayed", "tensorwise", "blockwise", "mxfp8"};
    const int fp16 = t->precision == PX_FP16, fp32 = t->precision == PX_FP32, fp8 = t->fp8 != MODEL_FP8_NONE;
    const int grad32 = t->grad_dtype == PX_FP32;
    const int e4m3 = t->fp8_format == MODEL_FP8_E4M3, mx = t->fp8 == MODEL_FP8_MXFP8;
    const int pg = export_fp8_param_gather_ok(p);
    char name[96];
    if (fp8)
        snprintf(name, sizeof name, "%s_with_%s_mixed", fp16 ? "fp16" : "bf16", fp8_names[t->fp8]);
    else
        snprintf(name, sizeof name, "%s_mixed", fp16 ? "fp16" : "bf16");
    /* the named recipe is the plan's exactly */
    const int named = !fp32 && grad32 == !fp16 &&
                      (!fp8 || (e4m3 == mx && (t->fp8 != MODEL_FP8_DELAYED || t->fp8_amax_history == 1024) &&
                                pg == (t->fp8 != MODEL_FP8_BLOCKWISE) && (!mx || pg) &&
                                t->fp8 != MODEL_FP8_TENSORWISE && !t->fp8_attention));
    if (named) {
        ov(o, "mixed_precision=%s", name);
        ov_end(o);
        return;
    }
    const char *dt = fp32 ? "float32" : fp16 ? "float16" : "bfloat16";
    char fp8s[512] = "";
    if (fp8)
        snprintf(fp8s, sizeof fp8s,
                 ",fp8:%s,fp8_recipe:%s,fp8_margin:0,fp8_amax_history_len:%d,fp8_amax_compute_algo:%s,"
                 "fp8_param_gather:%s,reuse_grad_buf_for_mxfp8_param_ag:%s,fp8_dot_product_attention:%s",
                 model_fp8_format_name(t->fp8_format), fp8_recipes[t->fp8],
                 t->fp8 == MODEL_FP8_DELAYED ? t->fp8_amax_history : 1,
                 t->fp8 == MODEL_FP8_DELAYED ? "max" : "most_recent", export_bool(pg), export_bool(mx && pg),
                 export_bool(t->fp8_attention));
    ov(o, "~mixed_precision");
    ov(o, "+mixed_precision={_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,"
          "fp32:%s,fp16:%s,bf16:%s,params_dtype:{_target_:torch.%s,_call_:false},"
          "pipeline_dtype:{_target_:torch.%s,_call_:false},autocast_enabled:false,grad_reduce_in_fp32:%s%s,"
          "first_last_layers_bf16:false,num_layers_at_start_in_bf16:0,num_layers_at_end_in_bf16:0}",
       export_bool(fp32), export_bool(fp16), export_bool(!fp32 && !fp16), dt, dt, export_bool(grad32), fp8s);
    ov_end(o);
}

static void bridge_precision_notes(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    if (t->fp8 == MODEL_FP8_NONE)
        return;
    if (t->precision == PX_FP32)
        fprintf(f, "# NOT EXPRESSIBLE: FP8 GEMMs on fp32 weights (Megatron-Bridge's FP8 recipes are bf16_with_* and\n"
                   "# fp16_with_*): the precision below is fp32 alone\n");
    if (t->fp8_param_gather && !export_fp8_param_gather_ok(p))
        fprintf(f, "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0): they stay 16-bit\n");
    if (t->fp8 == MODEL_FP8_MXFP8)
        fprintf(f, "# the mxfp8 recipe runs on Blackwell only\n");
    if (t->fp8_dispatch && p->spec.model.moe.experts > 0)
        fprintf(f, "# FP8 dispatch: Megatron-Core quantizes the dispatch only on the flex dispatcher's ncclep\n"
                   "# backend, in MXFP8 (not the %s one below, which dispatches in bf16)\n",
                model_moe_dispatcher_name(p->spec.job.moe_dispatcher));
}

/* The comments that open the overrides: the recipe, the command that runs it, and what the plan
 * has that the keys below cannot say. */
static void bridge_header(FILE *f, const ModelPlan *p, const ModelDims *d, const BridgeRecipe *r, int own)
{
    int nodes;
    const int per_node = export_node_size(p, &nodes);
    fprintf(f, "\n# Megatron-Bridge (ConfigContainer) overrides for %s on %d GPUs, written by parallax\n",
            p->spec.model.name, p->gpus);
    fprintf(f, "# recipe: %s (%s)\n", r->recipe,
            own ? "the model's own" : "the nearest: the architecture below replaces its model's");
    fprintf(f, "# run: torchrun --nnodes %d --nproc-per-node %d scripts/training/run_recipe.py --recipe %s \\\n"
               "#        followed by every line below (Megatron-Bridge 0.6.2; the quotes are the shell's)\n",
            nodes, per_node, r->recipe);
    if (!own)
        fprintf(f, "# its tokenizer is replaced by a NullTokenizer of the model's vocabulary: set your own\n");
    export_gpipe_note(f, &p->spec.layout);
    bridge_model_notes(f, p, r);
    bridge_precision_notes(f, p);
    ExportTrain tr;
    PxError err;
    (void)export_train(p, d, &tr, &err); /* export_plan checked it */
    export_train_comments(f, &tr);
    export_framework_note(f, p, MODEL_FW_BRIDGE);
    if (p->spec.job.optimizer == MODEL_OPT_ADAM_8BIT)
        fprintf(f, "# 8-bit Adam has no Megatron-Bridge key: its memory was planned, the keys below use Adam\n");
}

/* The training loop, the optimizer and its schedule, and data parallelism (the distributed
 * optimizer, Megatron FSDP, buckets, overlap). */
static void bridge_training(BridgeOut *o, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    ExportTrain tr;
    PxError err;
    (void)export_train(p, d, &tr, &err); /* export_plan checked it */
    ov(o, "train.micro_batch_size=%d train.global_batch_size=%d train.train_iters=%d", t->micro_batch,
       t->global_batch, tr.iters);
    ov(o, "rng.seed=%llu", (unsigned long long)t->seed);
    ov_end(o);
    if (t->optimizer == MODEL_OPT_SGD_MOMENTUM)
        ov(o, "optimizer.optimizer=sgd optimizer.sgd_momentum=%g", t->momentum);
    else
        ov(o, "optimizer.optimizer=adam optimizer.adam_beta1=%g optimizer.adam_beta2=%g optimizer.adam_eps=%g",
           t->beta1, t->beta2, t->adam_eps);
    ov_end(o);
    ov(o, "optimizer.lr=%g optimizer.min_lr=%g optimizer.weight_decay=%g optimizer.clip_grad=%g", tr.lr, tr.min_lr,
       t->weight_decay, t->grad_clip);
    ov_end(o);
    /* fp32 master weights, gradients and Adam moments, as parallax plans them (a recipe may
     * keep them in bf16 through the precision-aware optimizer) */
    ov(o, "optimizer.use_precision_aware_optimizer=%s optimizer.main_grads_dtype=torch.float32 "
          "optimizer.main_params_dtype=torch.float32 optimizer.exp_avg_dtype=torch.float32 "
          "optimizer.exp_avg_sq_dtype=torch.float32", export_bool(l->offload_optimizer));
    ov_end(o);
    /* optimizer offload: the hybrid device optimizer, on the precision-aware optimizer's path
     * (OptimizerConfig); HSDP as the distributed optimizer's instances; buckets in parameters */
    if (l->offload_optimizer) {
        ov(o, "optimizer.optimizer_cpu_offload=true optimizer.optimizer_offload_fraction=1.0");
        ov_end(o);
    }
    if (l->dp_replicate > 1 || l->bucket_bytes > 0) {
        if (l->dp_replicate > 1)
            ov(o, "ddp.num_distributed_optimizer_instances=%d", l->dp_replicate);
        if (l->bucket_bytes > 0)
            ov(o, "ddp.bucket_size=%.0f", floor(l->bucket_bytes / (double)px_dtype_bytes(d->param)));
        ov_end(o);
    }
    /* SchedulerConfig: Megatron-Core's OptimizerParamScheduler, as Megatron-LM's flags */
    ov(o, "scheduler.lr_decay_style=%s scheduler.lr_warmup_iters=%d scheduler.lr_decay_iters=%d", tr.wsd ? "WSD" : "cosine",
       tr.warmup, tr.decay_iters);
    if (tr.wsd)
        ov(o, "scheduler.lr_wsd_decay_style=cosine scheduler.lr_wsd_decay_iters=%d", tr.wsd_iters);
    ov_end(o);
    ov(o, "optimizer.use_distributed_optimizer=%s ddp.use_distributed_optimizer=%s", export_bool(l->zero >= 1),
       export_bool(l->zero >= 1));
    ov(o, "ddp.overlap_grad_reduce=%s ddp.overlap_param_gather=%s", export_bool(l->overlap_dp),
       export_bool(l->overlap_dp && l->zero >= 1));
    ov_end(o);
    if (l->zero >= 2)
        ov(o, "dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=%s "
              "checkpoint.ckpt_format=fsdp_dtensor",
           l->zero == 2 ? "optim_grads" : "optim_grads_params");
    else
        ov(o, "dist.use_megatron_fsdp=false ddp.use_megatron_fsdp=false ddp.data_parallel_sharding_strategy=no_shard");
    ov_end(o);
}

void export_bridge(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    int own = 0;
    const BridgeRecipe *r = pick_recipe(&p->spec.model, &own);
    bridge_header(f, p, d, r, own);

    BridgeOut o = {f, 0};
    ov(&o, "model.tensor_model_parallel_size=%d model.pipeline_model_parallel_size=%d", l->tp, l->pp);
    ov_int_or_null(&o, "model.virtual_pipeline_model_parallel_size", l->vpp, l->vpp <= 1);
    ov(&o, "model.context_parallel_size=%d model.sequence_parallel=%s", l->cp, export_bool(l->sp));
    if (l->cp > 1)
        ov(&o, "model.cp_comm_type=%s", export_cp_comm_name(l->cp_comm));
    ov_end(&o);
    bridge_split(&o, p, d);
    bridge_model(&o, p, d);
    if (!own) {
        ov(&o, "tokenizer.tokenizer_type=NullTokenizer tokenizer.tokenizer_model=null");
        ov_end(&o);
    }
    bridge_moe(&o, p);
    if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        ov(&o, "model.recompute_granularity=selective model.recompute_method=null model.recompute_num_layers=null "
               "model.recompute_modules=[core_attn]");
    else if (l->recompute == MODEL_RECOMPUTE_FULL)
        ov(&o, "model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1");
    else
        ov(&o, "model.recompute_granularity=null model.recompute_method=null model.recompute_num_layers=null");
    ov_end(&o);
    bridge_training(&o, p, d);
    ov(&o, "comm_overlap=null model.tp_comm_overlap=%s", export_bool(l->overlap_tp));
    ov_end(&o);
    bridge_precision(&o, p);
}
