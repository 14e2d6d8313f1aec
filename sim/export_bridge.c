/* Megatron-Bridge export: ConfigContainer overrides (model.*, train.*, optimizer.*, ddp.*,
 * mixed_precision) for a plan. */
#include "sim/internal.h"

#include <stdio.h>

/* Megatron-Bridge's mixed-precision recipe for an FP8 plan and where the plan differs from its
 * defaults (NVIDIA-NeMo/Megatron-Bridge 067f987d, src/megatron/bridge/training/
 * mixed_precision.py): delayed is *_with_fp8_delayed_scaling_mixed (hybrid, history 1024, max,
 * FP8 parameters), tensorwise *_with_fp8_current_scaling_mixed (hybrid, FP8 parameters, the
 * first and last layers in bf16, which parallax does not plan), blockwise
 * *_with_fp8_subchannel_scaling_mixed (hybrid, no FP8 parameters), mxfp8 *_with_mxfp8_mixed
 * (e4m3, FP8 parameters with reuse_grad_buf_for_mxfp8_param_ag, which Megatron-Core's DDP
 * config allows only with them). The recipe's setup() copies its fields over the model's, so
 * the differences go to mixed_precision.*: keys of a MixedPrecisionConfig, which a recipe
 * that names its precision by string does not hold. */
static void bridge_fp8(FILE *f, const ModelPlan *p)
{
    const ModelJob *t = &p->spec.job;
    static const char *const names[] = {NULL, "fp8_delayed_scaling", "fp8_current_scaling",
                                        "fp8_subchannel_scaling", "mxfp8"};
    if (t->precision == PX_FP32) {
        fprintf(f, "mixed_precision=null\n# NOT EXPRESSIBLE: FP8 GEMMs on fp32 weights (Megatron-Bridge's FP8 recipes are bf16_with_* and fp16_with_*)\n");
        return;
    }
    fprintf(f, "mixed_precision=%s_with_%s_mixed\n", t->precision == PX_FP16 ? "fp16" : "bf16", names[t->fp8]);
    const int want_e4m3 = t->fp8 == MODEL_FP8_MXFP8, want_pg = t->fp8 != MODEL_FP8_BLOCKWISE;
    const int pg = sim_export_fp8_param_gather_ok(p);
    char diff[512] = "";
    size_t n = 0;
    if ((t->fp8_format == MODEL_FP8_E4M3) != want_e4m3)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8=%s", model_fp8_format_name(t->fp8_format));
    if (t->fp8 == MODEL_FP8_DELAYED && t->fp8_amax_history != 1024)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8_amax_history_len=%d", t->fp8_amax_history);
    if (pg != want_pg)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8_param_gather=%s", pg ? "true" : "false");
    if (t->fp8 == MODEL_FP8_MXFP8 && !pg)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.reuse_grad_buf_for_mxfp8_param_ag=false");
    if (t->fp8 == MODEL_FP8_TENSORWISE)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.first_last_layers_bf16=false");
    if (t->fp8_attention)
        n += (size_t)snprintf(diff + n, sizeof diff - n, " mixed_precision.fp8_dot_product_attention=true");
    if (n > 0)
        fprintf(f, "# the plan differs from that recipe in these MixedPrecisionConfig keys (overrides where the recipe\n"
                   "# holds the object, not its name; else set them on it in Python):\n#%s\n", diff);
    if (t->fp8_param_gather && !pg)
        fprintf(f, "# NOT EXPRESSIBLE: FP8-only weights without the distributed optimizer (ZeRO-0): they stay 16-bit\n");
}

void sim_export_bridge(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *t = &p->spec.job;
    char split[256] = "";
    int split_first = -1, split_last = -1, split_ok = 1;
    if (d->uneven) {
        model_split_format(l->stage_layers, l->n_stage_layers, split, sizeof split);
        split_ok = sim_export_megatron_split(l, &split_first, &split_last);
    }
    fprintf(f, "\n# Megatron-Bridge (ConfigContainer) overrides\n");
    fprintf(f, "model.tensor_model_parallel_size=%d model.pipeline_model_parallel_size=%d", l->tp, l->pp);
    if (l->vpp > 1)
        fprintf(f, " model.virtual_pipeline_model_parallel_size=%d", l->vpp);
    fprintf(f, " model.context_parallel_size=%d model.sequence_parallel=%s\n", l->cp, l->sp ? "true" : "false");
    if (d->uneven && split_ok) {
        if (split_first >= 0)
            fprintf(f, "model.num_layers_in_first_pipeline_stage=%d%s", split_first, split_last >= 0 ? " " : "\n");
        if (split_last >= 0)
            fprintf(f, "model.num_layers_in_last_pipeline_stage=%d\n", split_last);
    } else if (d->uneven) {
        fprintf(f, "# NOT EXPRESSIBLE: the uneven pipeline split %s has middle stages of different sizes "
                   "(num_layers_in_first/last_pipeline_stage leave the middle even)\n", split);
    }
    fprintf(f, "model.seq_length=%d dataset.sequence_length=%d\n", d->s, d->s);
    sim_export_moe_overrides(f, p, 1);
    if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        fprintf(f, "model.recompute_granularity=selective\n");
    else if (l->recompute == MODEL_RECOMPUTE_FULL)
        fprintf(f, "model.recompute_granularity=full model.recompute_method=uniform model.recompute_num_layers=1\n");
    fprintf(f, "train.micro_batch_size=%d train.global_batch_size=%d train.train_iters=%d\n",
            t->micro_batch, t->global_batch, t->steps);
    fprintf(f, "optimizer.lr=%g optimizer.min_lr=%g optimizer.weight_decay=%g optimizer.clip_grad=%g optimizer.use_distributed_optimizer=%s\n",
            t->lr, t->min_lr, t->weight_decay, t->grad_clip, l->zero >= 1 ? "true" : "false");
    fprintf(f, "ddp.use_distributed_optimizer=%s ddp.overlap_grad_reduce=%s ddp.overlap_param_gather=%s\n",
            l->zero >= 1 ? "true" : "false", l->overlap_dp ? "true" : "false",
            l->overlap_dp && l->zero >= 1 ? "true" : "false");
    if (l->zero >= 2)
        fprintf(f, "dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true ddp.data_parallel_sharding_strategy=%s checkpoint.ckpt_format=fsdp_dtensor\n",
                l->zero == 2 ? "optim_grads" : "optim_grads_params");
    fprintf(f, "scheduler.lr_warmup_iters=%d scheduler.lr_decay_style=cosine", t->warmup_steps);
    if (t->fp8 != MODEL_FP8_NONE) {
        fprintf(f, "\n");
        bridge_fp8(f, p);
    } else {
        fprintf(f, " mixed_precision=%s\n",
                t->precision == PX_BF16 ? "bf16_mixed" : t->precision == PX_FP16 ? "fp16_mixed" : "null");
    }
}

