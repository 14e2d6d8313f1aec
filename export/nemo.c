/* NeMo 1.x export: Hydra overrides for megatron_gpt_pretraining.py (megatron_gpt_config.yaml).
 * --format nemo writes them, then Megatron-Bridge's (bridge.c). */
#include "export/internal.h"

#include <stdio.h>

/* NeMo 1.x's FP8 keys (NVIDIA/NeMo 8cfedd72, examples/nlp/language_modeling/conf/
 * megatron_gpt_config.yaml and megatron_gpt_model.py): fp8 with fp8_e4m3 / fp8_hybrid,
 * fp8_amax_history_len, fp8_amax_compute_algo, all for delayed scaling, and fp8_params, whose
 * weights fp8_model_init builds under DelayedScaling. Other recipes and FP8 attention go
 * through build_transformer_config, which hands Megatron-Core's TransformerConfig every model
 * key named as one of its fields; those keys are not in the yaml, so Hydra needs the '+'. FP8
 * needs the Transformer Engine layer spec (transformer_engine, false in the yaml). */
static void nemo1_fp8(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    if (t->fp8 == MODEL_FP8_NONE)
        return;
    const int delayed = t->fp8 == MODEL_FP8_DELAYED, e4m3 = t->fp8_format == MODEL_FP8_E4M3;
    if (!delayed || t->fp8_attention)
        fprintf(f, "# NeMo 1.x's own FP8 keys are delayed scaling's; the '+' keys reach Megatron-Core's TransformerConfig\n");
    fprintf(f, "model.transformer_engine=true model.fp8=true model.fp8_e4m3=%s model.fp8_hybrid=%s",
            export_bool(e4m3), export_bool(!e4m3));
    if (delayed)
        fprintf(f, " model.fp8_amax_history_len=%d model.fp8_amax_compute_algo=max", t->fp8_amax_history);
    else
        fprintf(f, " +model.fp8_recipe=%s", model_fp8_recipe_name(t->fp8));
    if (delayed && export_fp8_param_gather_ok(p))
        fprintf(f, " +model.fp8_params=true");
    if (t->fp8_attention)
        fprintf(f, " +model.fp8_dot_product_attention=true");
    fprintf(f, "\n");
    if (t->fp8_param_gather && !delayed)
        fprintf(f, "# NOT EXPRESSIBLE in NeMo 1.x: FP8 parameters under the %s recipe (model.fp8_params builds them\n"
                   "# under DelayedScaling); the weights stay 16-bit beside their FP8 copies\n",
                model_fp8_recipe_name(t->fp8));
    else if (t->fp8_param_gather && !export_fp8_param_gather_ok(p))
        fprintf(f, "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0); the weights stay\n"
                   "# 16-bit beside their FP8 copies (plan with --zero 1 for model.fp8_params)\n");
}

/* A MoE plan's expert and MLA settings for NeMo 1.x. build_transformer_config hands Megatron-Core's
 * TransformerConfig (and build_model_parallel_config its ModelParallelConfig) every model key named
 * as one of its fields; none of these is in megatron_gpt_config.yaml but expert_model_parallel_size
 * (NeMo 8cfedd72's, not 1.23.0's: '++'). NeMo builds every layer from one layer spec, MoE when
 * num_moe_experts is set, unless model.name picks decoder_block_gpt (get_specs, NeMo 2.3.0 on),
 * Megatron-Core's get_gpt_decoder_block_spec, which reads moe_layer_freq, multi_latent_attention
 * and qk_layernorm from the config. */
static void nemo1_moe(FILE *f, const ModelPlan *p)
{
    const ModelConfig *c = &p->spec.model;
    const ModelMoe *m = &c->moe;
    const ModelLayout *l = &p->spec.layout;
    if (m->experts > 0) {
        fprintf(f, "+model.num_moe_experts=%d +model.moe_router_topk=%d ++model.expert_model_parallel_size=%d"
                   " +model.expert_tensor_parallel_size=%d\n",
                m->experts, m->topk, l->ep, l->etp);
        fprintf(f, "+model.moe_ffn_hidden_size=%d", m->expert_ffn);
        if (m->shared_ffn > 0)
            fprintf(f, " +model.moe_shared_expert_intermediate_size=%d", m->shared_ffn);
        if (m->first_dense > 0 || m->layer_freq > 1) {
            fprintf(f, " +model.moe_layer_freq=[");
            for (int i = 0; i < c->layers; i++)
                fprintf(f, "%s%d", i ? "," : "", model_layer_is_moe(c, i));
            fprintf(f, "]");
        }
        fprintf(f, "\n+model.moe_router_score_function=%s", export_router_score(m));
        if (m->groups > 0)
            fprintf(f, " +model.moe_router_num_groups=%d +model.moe_router_group_topk=%d", m->groups, m->topk_groups);
        fprintf(f, " +model.moe_router_load_balancing_type=%s +model.moe_aux_loss_coeff=%g",
                m->aux_loss_coeff > 0 ? "aux_loss" : "none", m->aux_loss_coeff);
        if (m->capacity_factor > 0)
            fprintf(f, " +model.moe_expert_capacity_factor=%g +model.moe_pad_expert_input_to_capacity=true",
                    m->capacity_factor);
        fprintf(f, "\n+model.moe_token_dispatcher_type=%s +model.moe_grouped_gemm=true",
                model_moe_dispatcher_name(p->spec.job.moe_dispatcher));
        /* the flag of the Megatron-Core releases NeMo 2 ran with (moe_flex_dispatcher_backend
         * came in late 2025) */
        if (p->spec.job.moe_dispatcher == MODEL_MOE_DISPATCH_FLEX)
            fprintf(f, " +model.moe_enable_deepep=true");
        if (p->spec.job.moe_force_balance)
            fprintf(f, " +model.moe_router_force_load_balancing=true");
        if (l->overlap_ep && m->shared_ffn > 0)
            fprintf(f, " +model.moe_shared_expert_overlap=true");
        fprintf(f, "\n");
    }
    if (c->mla.kv_lora_rank > 0) {
        fprintf(f, "+model.multi_latent_attention=true");
        if (c->mla.q_lora_rank > 0)
            fprintf(f, " +model.q_lora_rank=%d", c->mla.q_lora_rank);
        fprintf(f, " +model.kv_lora_rank=%d +model.qk_head_dim=%d +model.qk_pos_emb_head_dim=%d +model.v_head_dim=%d\n",
                c->mla.kv_lora_rank, c->mla.qk_nope_dim, c->mla.qk_rope_dim, c->mla.v_dim);
    }
    if (c->mtp_layers > 0)
        fprintf(f, "# NOT EXPRESSIBLE in NeMo 1.x: %d multi-token prediction module%s (MegatronGPTModel builds\n"
                   "# Megatron-Core's GPTModel without an MTP block); %s memory was planned\n",
                c->mtp_layers, c->mtp_layers > 1 ? "s" : "", c->mtp_layers > 1 ? "their" : "its");
}

/* The architecture in full (the yaml's defaults are a GPT's) and the layer spec that builds what
 * the default spec cannot. */
static void nemo1_model(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const int rope = c->position == MODEL_POS_ROPE;
    /* the layer spec that builds QK norms, MLA and a dense/MoE layer pattern */
    const int block_spec = c->qk_norm || c->mla.kv_lora_rank > 0 ||
                           (c->moe.experts > 0 && (c->moe.first_dense > 0 || c->moe.layer_freq > 1));
    fprintf(f, "model.num_layers=%d model.hidden_size=%d model.ffn_hidden_size=%d model.num_attention_heads=%d\n",
            c->layers, c->hidden, c->ffn_hidden, c->heads);
    fprintf(f, "model.num_query_groups=%d model.kv_channels=%d model.normalization=%s model.layernorm_epsilon=%g\n",
            c->kv_heads, c->head_dim, c->norm == MODEL_RMSNORM ? "rmsnorm" : "layernorm", c->norm_eps);
    fprintf(f, "model.activation=%s model.bias=%s model.share_embeddings_and_output_weights=%s\n",
            c->mlp == MODEL_SWIGLU ? "fast-swiglu" : "gelu", export_bool(c->bias), export_bool(c->tied_embeddings));
    fprintf(f, "model.position_embedding_type=%s", rope ? "rope" : "learned_absolute");
    if (rope)
        fprintf(f, " +model.rotary_base=%.0f", c->rope_theta);
    fprintf(f, " model.make_vocab_size_divisible_by=%d\n", p->spec.job.pad_vocab);
    if (!c->bias && c->qkv_bias)
        fprintf(f, "+model.qkv_bias=true\n# NeMo 1.23.0 does not read model.qkv_bias (NeMo 2.0 on): there the QKV projection has no bias\n");
    if (c->qk_norm)
        fprintf(f, "+model.qk_layernorm=true\n");
    if (block_spec)
        fprintf(f, "+model.name=decoder_block_gpt\n"
                   "# decoder_block_gpt: the layer spec (NeMo 2.3.0 on; 1.23.0 refuses the name) that builds %s\n",
                c->qk_norm ? "the QK norms" : c->mla.kv_lora_rank > 0 ? "multi-head latent attention and the dense layers"
                                                                      : "the dense layers between the MoE ones");
    fprintf(f, "# the vocabulary (%d, padded to %d) comes from model.tokenizer.*, the data's tokenizer\n",
            c->vocab, d->vocab_pad);
    if (c->attn_sinks)
        fprintf(f, "# NOT EXPRESSIBLE in NeMo 1.x: attention sinks (a learned logit per head)\n");
}

/* An uneven pipeline split: the first/last stage's layers where the middle stages are even. */
static void nemo1_split(FILE *f, const ModelLayout *l, const ModelDims *d)
{
    if (!d->uneven)
        return;
    char split[256];
    int first = -1, last = -1;
    model_split_format(l->stage_layers, l->n_stage_layers, split, sizeof split);
    if (export_megatron_split(l, &first, &last)) {
        /* build_transformer_config checks and passes them on (NeMo 2.3.0 on) */
        if (first >= 0)
            fprintf(f, "+model.num_layers_in_first_pipeline_stage=%d ", first);
        if (last >= 0)
            fprintf(f, "+model.num_layers_in_last_pipeline_stage=%d", last);
        fprintf(f, "\n# the uneven pipeline split %s: NeMo 2.3.0 on; 1.23.0 splits evenly\n", split);
    } else {
        fprintf(f, "# NOT EXPRESSIBLE in NeMo 1.x: the uneven pipeline split %s %s (num_layers_in_first/last_pipeline_stage\n"
                   "# leave the middle even, and build_transformer_config requires the middle stages' layers to divide evenly)\n",
                split, l->vpp > 1 ? "splits the virtual stages unevenly" : "has middle stages of different sizes");
    }
}

/* NeMo 1.x's CosineAnnealing (nemo/core/optim/lr_scheduler.py): linear warm-up, cosine to min_lr
 * at max_steps - constant_steps, then min_lr; max_steps is the trainer's unless the scheduler's
 * own is given. A decay that ends past the training goes as the scheduler's max_steps; one that
 * ends before it as constant_steps. It has no stable phase: a WSD schedule is NOT EXPRESSIBLE. */
static void nemo1_sched(FILE *f, const ExportTrain *tr)
{
    if (tr->wsd)
        fprintf(f, "# NOT EXPRESSIBLE: the peak held to iteration %d before the cosine decay (NeMo 1.x's CosineAnnealing\n"
                   "# decays from the warm-up's end): the decay below starts at the warm-up's end\n",
                tr->decay_iters - tr->wsd_iters);
    fprintf(f, "model.optim.sched.name=CosineAnnealing model.optim.sched.warmup_steps=%d model.optim.sched.constant_steps=%d "
               "model.optim.sched.min_lr=%g\n",
            tr->warmup, tr->decay_iters < tr->iters ? tr->iters - tr->decay_iters : 0, tr->min_lr);
    if (tr->decay_iters > tr->iters)
        fprintf(f, "+model.optim.sched.max_steps=%d\n", tr->decay_iters);
}

/* NeMo 1.x: Hydra overrides for megatron_gpt_pretraining.py, written for megatron_gpt_config.yaml
 * as NVIDIA/NeMo 8cfedd72 ships it (examples/nlp/language_modeling/conf/; the 1.x training path,
 * kept through NeMo 2.x) and composable with NeMo 1.23.0's, the last 1.x release. Hydra composes
 * in struct mode: a key the yaml lacks needs '+' (absent from both files) or '++' (absent from
 * 1.23.0's only), else "Could not override". The architecture goes in full, since the yaml's
 * defaults are a GPT (LayerNorm, GELU, learned positions, biases, tied embeddings, a vocabulary
 * padded to 128): normalization, activation (fast-swiglu for SwiGLU, as NeMo's own
 * megatron_llama_config.yaml), position_embedding_type, rotary_base (read with cfg.get, default
 * 10000), bias, share_embeddings_and_output_weights, layernorm_epsilon, kv_channels,
 * num_query_groups, make_vocab_size_divisible_by, max_position_embeddings. Keys that NeMo 1.23.0
 * composes but does not read are said in comments. */
void export_nemo1(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    /* devices per node from the plan's cluster profile */
    int nodes;
    const int per_node = export_node_size(p, &nodes);
    const char *prec = t->precision == PX_BF16 ? "bf16-mixed" : t->precision == PX_FP16 ? "16-mixed" : "32";
    fprintf(f, "# NeMo 1.x (megatron_gpt_pretraining.py) Hydra overrides for %s on %d GPUs\n", c->name, p->gpus);
    fprintf(f, "# for megatron_gpt_config.yaml as NeMo 8cfedd72 ships it: '+' adds a key that file lacks, '++' one\n"
               "# that NeMo 1.23.0's lacks; Megatron-Core reads the added keys through build_transformer_config\n");
    export_gpipe_note(f, l);
    ExportTrain tr;
    PxError err;
    (void)export_train(p, d, &tr, &err); /* export_plan checked it */
    export_train_comments(f, &tr);
    export_framework_note(f, p, MODEL_FW_NEMO);
    fprintf(f, "trainer.devices=%d trainer.num_nodes=%d trainer.precision=%s trainer.max_steps=%d\n",
            per_node, nodes, prec, tr.iters);
    /* Megatron-Core's GPT (the default from NeMo 2.0, not in 1.23.0) carries context parallelism,
     * grouped-query attention, MoE and the rotary base; O2 keeps 16-bit weights with fp32 main
     * copies in the optimizer, as parallax plans them */
    fprintf(f, "model.mcore_gpt=true model.megatron_amp_O2=%s\n", export_bool(t->precision != PX_FP32));
    fprintf(f, "model.tensor_model_parallel_size=%d model.pipeline_model_parallel_size=%d\n", l->tp, l->pp);
    fprintf(f, "model.virtual_pipeline_model_parallel_size=%s", l->vpp > 1 ? "" : "null");
    if (l->vpp > 1)
        fprintf(f, "%d", l->vpp);
    fprintf(f, " +model.context_parallel_size=%d model.sequence_parallel=%s\n", l->cp, export_bool(l->sp));
    /* NeMo 1.x hands model.* keys named as TransformerConfig's fields on to it; p2p is its default */
    if (l->cp > 1 && l->cp_comm != MODEL_CP_COMM_P2P)
        fprintf(f, "+model.cp_comm_type=%s\n", export_cp_comm_name(l->cp_comm));
    fprintf(f, "model.micro_batch_size=%d model.global_batch_size=%d model.encoder_seq_length=%d model.max_position_embeddings=%d\n",
            t->micro_batch, t->global_batch, d->s, c->position == MODEL_POS_ROPE ? d->s : c->seq_len);
    nemo1_model(f, p, d);
    nemo1_split(f, l, d);
    nemo1_moe(f, p);
    if (l->etp != l->tp && c->moe.experts > 0)
        fprintf(f, "# NeMo 1.23.0 does not read model.expert_tensor_parallel_size (expert tensor parallel %d, tp %d)\n",
                l->etp, l->tp);
    if (l->recompute == MODEL_RECOMPUTE_NONE)
        fprintf(f, "model.activations_checkpoint_granularity=null\n");
    else if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        fprintf(f, "model.activations_checkpoint_granularity=selective\n");
    else
        fprintf(f, "model.activations_checkpoint_granularity=full model.activations_checkpoint_method=uniform model.activations_checkpoint_num_layers=1\n");
    fprintf(f, "model.optim.name=%s model.optim.lr=%g model.optim.weight_decay=%g model.optim.betas=[%g,%g]\n",
            l->zero >= 1 ? "distributed_fused_adam" : "fused_adam", tr.lr, t->weight_decay, t->beta1, t->beta2);
    nemo1_sched(f, &tr);
    fprintf(f, "model.use_flash_attention=%s model.hidden_dropout=%g model.attention_dropout=%g\n",
            export_bool(t->flash_attn), t->dropout, t->dropout);
    nemo1_fp8(f, p);
    if (l->zero >= 2)
        fprintf(f, "# ZeRO-%d: NeMo 1.x shards optimizer state only (distributed_fused_adam)\n", l->zero);
}
