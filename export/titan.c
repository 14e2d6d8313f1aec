/* torchtitan export: a plan as torchtitan 0.3's command line (--format torchtitan: torchrun -m
 * torchtitan.train --module M --config C and overrides of that config function's values) or as
 * torchtitan 0.2's TOML job file (--format torchtitan-toml, read through --job.config_file).
 *
 * The keys are each version's own, read from the PyPI wheels: torchtitan 0.2.1's
 * torchtitan/config/job_config.py (JobConfig: one TOML table per section) and manager.py;
 * torchtitan 0.3.0's Trainer.Config (torchtitan/trainer.py) with torchtitan/config/configs.py
 * (TrainingConfig, ParallelismConfig, CompileConfig, DebugConfig), the activation-checkpoint
 * policy as a tyro subcommand (distributed/activation_checkpoint.py), the optimizer's
 * param_groups (components/optimizer/optimizer.py, default_adamw) and the config functions of
 * models/<module>/config_registry.py. What torchtitan cannot say is a "# NOT EXPRESSIBLE:"
 * line, never dropped silently (docs/exports.md#torchtitan---format-torchtitan). */
#include "export/internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* A model torchtitan builds: its module (0.2's model.name, 0.3's --module), flavor, and the
 * shape parallax compares a plan's model with. From torchtitan 0.2.1's models/llama3, qwen3 and
 * deepseek_v3 __init__.py (llama3's FFN width from ffn_dim_multiplier and multiple_of), the
 * same in 0.3.0's model registries. */
typedef struct {
    const char *module, *flavor;
    const char *config;       /* 0.3 config function for the flavor; NULL: none */
    const char *config_fp8;   /* 0.3 config function whose model converts its linears to float8
                                 (rowwise); NULL: none */
    const char *config_mxfp8; /* ... to MXFP8; NULL: none */
    int layers, hidden, heads, kv_heads, head_dim, ffn, vocab; /* ffn 0: every layer is MoE */
    int experts, topk, expert_ffn, shared_ffn, first_dense;
    int q_lora_rank, kv_lora_rank; /* MLA (kv_lora_rank > 0): kv_heads not compared */
    int qk_norm;
    double rope_theta, norm_eps;
    /* GPT-OSS's extras: biases on QKV, the attention output, the router and the experts, and
     * attention sinks (0.3's models/gpt_oss, 0.2's experiments/gpt_oss) */
    int gpt_oss;
} TitanFlavor;

static const TitanFlavor titan_flavors[] = {
    {"llama3", "8B", "llama3_8b", NULL, "llama3_8b_mxfp8", 32, 4096, 32, 8, 128, 14336, 128256,
     0, 0, 0, 0, 0, 0, 0, 0, 500000, 1e-5, 0},
    {"llama3", "70B", "llama3_70b", NULL, NULL, 80, 8192, 64, 8, 128, 28672, 128256,
     0, 0, 0, 0, 0, 0, 0, 0, 500000, 1e-5, 0},
    /* 0.3's llama3_405b converts the linears to float8 (rowwise) itself */
    {"llama3", "405B", "llama3_405b", "llama3_405b", NULL, 126, 16384, 128, 8, 128, 53248, 128256,
     0, 0, 0, 0, 0, 0, 0, 0, 500000, 1e-5, 0},
    {"qwen3", "8B", NULL, NULL, NULL, 36, 4096, 32, 8, 128, 12288, 151936, 0, 0, 0, 0, 0, 0, 0, 1, 1e6, 1e-6, 0},
    {"qwen3", "14B", "qwen3_14b", NULL, NULL, 40, 5120, 40, 8, 128, 17408, 151936, 0, 0, 0, 0, 0, 0, 0, 1, 1e6, 1e-6, 0},
    {"qwen3", "32B", "qwen3_32b", NULL, NULL, 64, 5120, 64, 8, 128, 25600, 151936, 0, 0, 0, 0, 0, 0, 0, 1, 1e6, 1e-6, 0},
    {"qwen3", "30B-A3B", "qwen3_30b_a3b", NULL, NULL, 48, 2048, 32, 4, 128, 0, 151936,
     128, 8, 768, 0, 0, 0, 0, 1, 1e6, 1e-6, 0},
    {"qwen3", "235B-A22B", NULL, NULL, NULL, 94, 4096, 64, 4, 128, 0, 151936,
     128, 8, 1536, 0, 0, 0, 0, 1, 5e6, 1e-6, 0},
    {"deepseek_v3", "16B", "deepseek_v3_16b", NULL, NULL, 27, 2048, 16, 0, 192, 10944, 102400,
     64, 6, 1408, 2816, 1, 0, 512, 0, 10000, 1e-5, 0},
    {"deepseek_v3", "671B", "deepseek_v3_671b", "deepseek_v3_671b_float8", NULL, 61, 7168, 128, 0, 192, 18432,
     129280, 256, 8, 2048, 2048, 3, 1536, 512, 0, 10000, 1e-5, 0},
    /* 0.3.0's models/gpt_oss/__init__.py _120b and config_registry.py gpt_oss_120b; 0.2.2's
     * experiments/gpt_oss gptoss_configs["120b"] with GptOssModelArgs' defaults */
    {"gpt_oss", "120b", "gpt_oss_120b", NULL, NULL, 36, 2880, 64, 8, 64, 0, 201088,
     128, 4, 2880, 0, 0, 0, 0, 0, 150000, 1e-5, 1},
};

/* The flavor whose shape the model has, or NULL. RoPE base and norm epsilon are not compared:
 * where they differ the export says so. */
static const TitanFlavor *titan_flavor(const ModelConfig *c)
{
    const ModelMoe *m = &c->moe;
    /* GPT-OSS has all five extras; every other flavor none */
    const int extras = !!c->qkv_bias + !!c->proj_bias + !!c->attn_sinks + !!m->router_bias + !!m->expert_bias;
    const int oss = extras == 5;
    if (c->family != MODEL_LLAMA || c->norm != MODEL_RMSNORM || c->mlp != MODEL_SWIGLU ||
        c->position != MODEL_POS_ROPE || c->tied_embeddings || c->bias || (extras && !oss))
        return NULL;
    const int dense = m->experts == 0 || m->first_dense > 0 || m->layer_freq > 1;
    for (size_t i = 0; i < sizeof titan_flavors / sizeof titan_flavors[0]; i++) {
        const TitanFlavor *t = &titan_flavors[i];
        if (t->gpt_oss != oss)
            continue;
        if (c->layers != t->layers || c->hidden != t->hidden || c->heads != t->heads || c->vocab != t->vocab ||
            c->head_dim != t->head_dim || c->qk_norm != t->qk_norm || (dense && c->ffn_hidden != t->ffn) ||
            c->mla.kv_lora_rank != t->kv_lora_rank || (t->kv_lora_rank == 0 && c->kv_heads != t->kv_heads))
            continue;
        if (t->kv_lora_rank > 0 && c->mla.q_lora_rank != t->q_lora_rank)
            continue;
        if (m->experts != t->experts)
            continue;
        if (m->experts > 0 && (m->topk != t->topk || m->expert_ffn != t->expert_ffn ||
                               m->shared_ffn != t->shared_ffn || m->first_dense != t->first_dense ||
                               m->layer_freq > 1))
            continue;
        return t;
    }
    return NULL;
}

/* The shortest %g that reads back as v ("inf" for no limit). */
static void num(char *buf, size_t cap, double v)
{
    if (isinf(v)) {
        snprintf(buf, cap, "%s", v > 0 ? "inf" : "-inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* A TOML float: a fraction or an exponent, so that 1 reads as 1.0 and not as an integer. */
static void toml_float(char *buf, size_t cap, double v)
{
    num(buf, cap, v);
    if (!strpbrk(buf, ".en") && strlen(buf) + 2 < cap)
        strcat(buf, ".0");
}

/* What the plan becomes in one torchtitan version. */
typedef struct {
    int v03;               /* 1: 0.3's command line; 0: 0.2's TOML */
    const TitanFlavor *fl; /* NULL: not a model torchtitan builds */
    const char *config;    /* 0.3's config function; NULL: none for the model */
    int replicate, shard;  /* data_parallel_replicate_degree, data_parallel_shard_degree */
    const char *reshard;   /* fsdp_reshard_after_forward */
    int fsdp;              /* FSDP/HSDP is applied (a sharded dimension over > 1 rank, or 0.3) */
    const char *schedule;  /* pipeline_parallel_schedule (pp > 1) */
    int local_batch;       /* training.local_batch_size */
    const char *ac;        /* activation checkpointing: none, selective, full */
    const char *param_dtype;
    int etp;               /* 0.2's expert_tensor_parallel_degree */
    int async_tp;          /* enable_async_tensor_parallel (and compile) */
    int fp8;               /* the plan's FP8 GEMMs are written (0.2's converters, 0.3's config) */
    int fp8_mx;            /* ... as MXFP8 */
    int fp8_rowwise;       /* 0.2's float8 recipe_name rowwise (else tensorwise: no recipe_name) */
    int fp8_gather;        /* 0.2's enable_fsdp_float8_all_gather */
    int cuda_graphs_off;   /* 0.3: --training.disable_cuda_graphs (pipeline or expert parallel) */
    int cpu_offload;       /* training.enable_cpu_offload (FSDP2's CPUOffloadPolicy) */
    ExportTrain tr;         /* the training length and schedule */
} Titan;

static void titan_resolve(Titan *t, const ModelPlan *p, const ModelDims *d, int v03)
{
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *j = &p->spec.job;
    memset(t, 0, sizeof *t);
    t->v03 = v03;
    PxError err;
    (void)export_train(p, d, &t->tr, &err); /* export_plan checked it */
    t->fl = titan_flavor(&p->spec.model);
    t->config = t->fl ? t->fl->config : NULL;
    /* Data parallelism. torchtitan's FSDP shards over dp_shard x cp (cp always: its
     * ParallelDims' fsdp mesh), as parallax's ZeRO group is dp x cp. Plain DP is
     * data_parallel_replicate_degree; 0.2 takes it alone or beside cp only (DDP "has not
     * supported > 1D parallelism"), and expert parallelism borrows its ranks from the shard
     * dimension in both versions (efsdp = dp_shard x cp x tp / ep). */
    t->replicate = 1;
    t->shard = l->dp;
    const int ddp_ok = d->ep <= 1 && l->dp > 1 && (v03 || l->cp > 1 || (l->tp == 1 && l->pp == 1));
    if (l->zero == 0 && ddp_ok) {
        t->replicate = l->dp;
        t->shard = 1;
    }
    if (l->dp_replicate > 1) {
        /* HSDP: torchtitan's own two dimensions (its dp_replicate mesh outermost, as parallax's
         * replicas stride over whole shard groups) */
        t->replicate = l->dp_replicate;
        t->shard = l->dp_shard;
    }
    t->reshard = l->zero == 3 ? (l->keep_gathered ? "never" : "always") : t->shard * l->cp > 1 ? "never" : "default";
    t->cpu_offload = l->offload_optimizer;
    t->fsdp = v03 || t->shard > 1 || l->cp > 1;
    if (l->pp > 1)
        t->schedule = l->vpp > 1 ? "Interleaved1F1B" : l->schedule == MODEL_SCHED_GPIPE ? "GPipe" : "1F1B";
    /* with pipeline parallelism a step's micro-batches are pipeline micro-batches of one local
     * batch; without, gradient accumulation steps of local_batch_size each */
    t->local_batch = l->pp > 1 ? j->micro_batch * d->m : j->micro_batch;
    t->ac = l->recompute == MODEL_RECOMPUTE_FULL ? "full" : l->recompute == MODEL_RECOMPUTE_SELECTIVE ? "selective" : "none";
    t->param_dtype = j->precision == PX_FP32 ? "float32" : "bfloat16";
    t->etp = d->ep > 1 && (d->etp == 1 || d->etp == l->tp) ? d->etp : 1;
    t->async_tp = l->overlap_tp && l->tp > 1;
    if (j->fp8 != MODEL_FP8_NONE) {
        t->fp8_mx = j->fp8 == MODEL_FP8_MXFP8;
        if (!v03) {
            t->fp8 = 1;
            t->fp8_rowwise = j->fp8 == MODEL_FP8_BLOCKWISE;
            t->fp8_gather = !t->fp8_mx && !t->fp8_rowwise && j->fp8_param_gather && t->shard > 1;
        } else if (t->fl && (t->fp8_mx ? t->fl->config_mxfp8 : t->fl->config_fp8)) {
            t->fp8 = 1;
            t->config = t->fp8_mx ? t->fl->config_mxfp8 : t->fl->config_fp8;
        }
    }
    t->cuda_graphs_off = v03 && (l->pp > 1 || d->ep > 1);
}

static void titan_model_notes(FILE *f, const Titan *t, const ModelPlan *p)
{
    const ModelConfig *c = &p->spec.model;
    const TitanFlavor *fl = t->fl;
    if (!fl) {
        fprintf(f, "# NOT EXPRESSIBLE: the model %s: torchtitan builds only its own model families (llama3,\n"
                   "# llama4, qwen3, deepseek_v3, ...), none of this shape:\n"
                   "# %s, %d layers, hidden %d, %s, %s%s%s",
                c->name, c->family == MODEL_GPT ? "GPT" : "Llama-like", c->layers, c->hidden,
                c->norm == MODEL_RMSNORM ? "RMSNorm" : "LayerNorm", c->mlp == MODEL_SWIGLU ? "SwiGLU" : "GELU",
                c->bias ? ", biases" : "", c->tied_embeddings ? ", tied embeddings" : "");
        if (c->moe.experts > 0)
            fprintf(f, ", %d experts (top %d)", c->moe.experts, c->moe.topk);
        fprintf(f, ".\n");
        if (t->v03)
            fprintf(f, "# Replace MODULE and CONFIG with a config_registry module of your own that builds it\n");
        else
            fprintf(f, "# Replace MODEL and FLAVOR with a TrainSpec of your own (register_train_spec) that builds it\n");
        return;
    }
    if (t->v03 && !fl->config)
        fprintf(f, "# NOT EXPRESSIBLE: torchtitan 0.3 has the %s flavor %s in its model registry but no config function\n"
                   "# for it: replace CONFIG with one of your own that builds model_registry(\"%s\")\n",
                fl->module, fl->flavor, fl->flavor);
    /* model settings are the flavor's: neither version takes them from a job's settings.
     * torchtitan's llama3 flavors are Llama 3.1's: RoPE scaled (llama3, factor 8 over 8192
     * positions: RoPEScalingArgs in 0.2.1, scaling="llama" in 0.3.0), which parallax's model
     * description does not carry; it changes no cost parallax predicts. */
    if (strcmp(fl->module, "llama3") == 0)
        fprintf(f, "# torchtitan's llama3 %s is Llama 3.1's, RoPE scaled (factor 8 over 8192 positions)\n",
                fl->flavor);
    /* GptOssModelArgs (0.2.2) and _120b (0.3.0): banded attention of 128 tokens on every other
     * layer, YaRN-scaled RoPE (factor 32 over 4096 positions), the SwiGLU clamp at 7 */
    if (fl->gpt_oss)
        fprintf(f, "# torchtitan's gpt_oss %s is GPT-OSS's own: banded attention (128 tokens) on every other layer,\n"
                   "# which parallax plans as full causal attention, and YaRN-scaled RoPE (factor 32 over 4096 positions)\n",
                fl->flavor);
    if (c->rope_theta != fl->rope_theta)
        fprintf(f, "# NOT EXPRESSIBLE: the model's RoPE base %.0f: torchtitan's %s %s flavor has %.0f\n", c->rope_theta,
                fl->module, fl->flavor, fl->rope_theta);
    if (c->norm_eps != fl->norm_eps)
        fprintf(f, "# NOT EXPRESSIBLE: the model's norm epsilon %g: torchtitan's %s %s flavor has %g\n", c->norm_eps,
                fl->module, fl->flavor, fl->norm_eps);
    if (c->mtp_layers > 0)
        fprintf(f, "# NOT EXPRESSIBLE: the model's %d multi-token prediction module%s: %s\n", c->mtp_layers,
                c->mtp_layers > 1 ? "s" : "",
                t->v03 ? "torchtitan 0.3's\n# model_registry takes num_mtp_layers, but its config functions build "
                         "none and the command\n# line cannot change the model"
                       : "torchtitan 0.2's\n# deepseek_v3 has none");
    /* a layout string's stage of prediction modules alone keeps no module torchtitan builds */
    const ModelLayout *l = &p->spec.layout;
    for (int i = 1; i + 1 < l->n_stage_layers; i++)
        if (l->stage_layers[i] == 0)
            fprintf(f, "# NOT EXPRESSIBLE: pipeline stage %d of the layout string, which holds only the prediction\n"
                       "# module%s: torchtitan builds none, and module_fqns_per_model_part has no stage of no module\n",
                    i, c->mtp_layers > 1 ? "s" : "");
}

/* torchtitan's context parallelism is PyTorch's, which passes K, V shards round the cp ranks:
 * all-gathered after the first block ("allgather") or rotated one rank a step ("alltoall", the
 * ring); 0.2 names the method, 0.3 keeps PyTorch's default, allgather. Neither splits heads. */
static const char *titan_rotate(const ModelLayout *l)
{
    return l->cp_comm == MODEL_CP_COMM_ALLGATHER ? "allgather" : "alltoall";
}

static void titan_cp_notes(FILE *f, const Titan *t, const ModelLayout *l)
{
    if (l->cp < 2)
        return;
    if (l->cp_comm == MODEL_CP_COMM_A2A)
        fprintf(f, "# NOT EXPRESSIBLE: Ulysses context parallelism (cp comm type a2a): torchtitan passes K and V\n"
                   "# shards round the cp ranks and never splits the heads; %s\n",
                t->v03 ? "0.3 gathers them" : "written as the ring (context_parallel_rotate_method alltoall)");
    else if (t->v03 && l->cp_comm == MODEL_CP_COMM_P2P)
        fprintf(f, "# NOT EXPRESSIBLE: the K/V ring (cp comm type p2p): torchtitan 0.3 has no rotate method and\n"
                   "# gathers K and V (parallax's allgather); torchtitan 0.2 rotates them\n");
}

/* Data parallelism and ZeRO (titan_resolve's mapping). */
static void titan_dp_notes(FILE *f, const Titan *t, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    if (l->dp * l->cp == 1)
        return;
    if (l->zero == 0 && l->cp > 1 && (t->replicate > 1 || l->dp == 1))
        fprintf(f, "# NOT EXPRESSIBLE: parameters replicated over the %d context-parallel ranks: torchtitan\n"
                   "# always shards them over cp (FSDP; fsdp_reshard_after_forward never)\n",
                l->cp);
    else if (l->zero == 0 && t->replicate == 1)
        fprintf(f, "# NOT EXPRESSIBLE: plain data parallelism (ZeRO-0) here:\n# %s;\n"
                   "# written as FSDP that keeps the gathered parameters from forward to backward\n"
                   "# (fsdp_reshard_after_forward never)\n",
                d->ep > 1 ? "expert parallelism borrows its ranks from the sharded data-parallel dimension"
                          : "torchtitan 0.2's DDP takes no other parallelism (\"DDP has not supported > 1D parallelism\")");
    else if (l->zero == 1 || l->zero == 2)
        fprintf(f, "# NOT EXPRESSIBLE: ZeRO-%d: torchtitan has no ZeRO-1/2 (FSDP2 shards the parameters as\n"
                   "# well); written as FSDP with fsdp_reshard_after_forward never: parameters gathered once\n"
                   "# per micro-batch and kept until its backward, gradients reduce-scattered after each\n"
                   "# micro-batch%s\n",
                l->zero, l->zero == 1 ? " (ZeRO-1 reduces once per step)" : "");
    if (!l->overlap_dp)
        fprintf(f, "# NOT EXPRESSIBLE: data-parallel communication not overlapped: torchtitan's %s always\n"
                   "# overlaps it with compute (plan with --overlap-dp for its behaviour)\n",
                t->fsdp ? "FSDP prefetch" : "DDP");
}

static void titan_fp8_notes(FILE *f, const Titan *t, const ModelPlan *p)
{
    const ModelJob *j = &p->spec.job;
    const TitanFlavor *fl = t->fl;
    if (j->fp8 == MODEL_FP8_NONE) {
        if (t->v03 && t->config && fl && fl->config_fp8 && strcmp(t->config, fl->config_fp8) == 0)
            fprintf(f, "# NOT EXPRESSIBLE: no FP8: torchtitan 0.3's %s converts the linear layers to float8\n"
                       "# (rowwise) in its model, which the command line cannot change: write a config function\n"
                       "# without the converter\n",
                    t->config);
        return;
    }
    const char *recipe = model_fp8_recipe_name(j->fp8);
    if (t->v03 && !t->fp8) {
        fprintf(f, "# NOT EXPRESSIBLE: FP8 GEMMs (%s): torchtitan 0.3 keeps its float8/MXFP8 converters in the\n"
                   "# model (Trainer.Config.model_spec), which the command line does not set, and has no config\n"
                   "# function with them for this model: write one whose model_registry(...) takes\n"
                   "# converters=[%s.Config(...)]\n",
                recipe, t->fp8_mx ? "MXFP8LinearConverter" : "Float8LinearConverter");
        return;
    }
    if (t->v03)
        fprintf(f, "# FP8 GEMMs (%s) through the config function %s, which converts the linear\n"
                   "# layers to %s; loading it needs torchao and a GPU that runs them (%s)\n",
                recipe, t->config, t->fp8_mx ? "MXFP8" : "float8 (rowwise)", t->fp8_mx ? "SM100" : "SM89 or later");
    if (j->fp8 == MODEL_FP8_DELAYED)
        fprintf(f, "# NOT EXPRESSIBLE: delayed scaling (an amax history of %d): torchtitan's float8 scales each\n"
                   "# tensor from itself; written as %s\n",
                j->fp8_amax_history, t->v03 ? "its rowwise recipe" : "tensorwise (current) scaling");
    else if (j->fp8 == MODEL_FP8_TENSORWISE && t->v03)
        fprintf(f, "# NOT EXPRESSIBLE: tensorwise scaling: torchtitan 0.3's float8 converter is rowwise only\n");
    else if (j->fp8 == MODEL_FP8_BLOCKWISE)
        fprintf(f, "# NOT EXPRESSIBLE: blockwise scaling (128 x 128 weights, 1 x 128 activations): torchtitan's\n"
                   "# float8 recipes are tensorwise and rowwise; written as rowwise, the nearer\n");
    if (!t->fp8_mx)
        fprintf(f, "# the FP8 format (%s) is torchao's recipe's own choice, not a torchtitan setting\n",
                model_fp8_format_name(j->fp8_format));
    if (j->fp8_param_gather && !t->fp8_gather)
        fprintf(f, "# NOT EXPRESSIBLE: FP8 parameters gathered in FP8: torchtitan %s\n",
                t->v03 ? "0.3 has no FSDP float8 all-gather setting"
                       : "0.2 gathers float8 only\n# with tensorwise scaling over a sharded data-parallel dimension "
                         "(enable_fsdp_float8_all_gather)");
    if (j->fp8_attention)
        fprintf(f, "# NOT EXPRESSIBLE: FP8 attention: torchtitan's converters replace linear layers only\n");
    if (j->fp8_dispatch && p->spec.model.moe.experts > 0)
        fprintf(f, "# NOT EXPRESSIBLE: FP8 token dispatch: torchtitan dispatches in the activation dtype\n");
}

static void titan_moe_notes(FILE *f, const Titan *t, const ModelPlan *p, const ModelDims *d)
{
    const ModelMoe *m = &p->spec.model.moe;
    const ModelLayout *l = &p->spec.layout;
    if (m->experts <= 0)
        return;
    fprintf(f, "# experts: %d routed (top %d) over ep %d x etp %d; routing and balancing are the model's own\n",
            m->experts, m->topk, d->ep, d->etp);
    if (t->v03 && d->etp != 1)
        fprintf(f, "# NOT EXPRESSIBLE: expert tensor parallel %d: torchtitan 0.3 has expert_parallel_degree only\n"
                   "# (EP borrows its ranks from FSDP and TP; the experts are not split over tp)\n",
                d->etp);
    else if (!t->v03 && d->ep > 1 && t->etp != d->etp)
        fprintf(f, "# NOT EXPRESSIBLE: expert tensor parallel %d: torchtitan 0.2 takes 1 or tp (%d) only\n", d->etp, l->tp);
    else if (!t->v03 && d->ep <= 1 && l->tp > 1 && d->etp != l->tp)
        fprintf(f, "# NOT EXPRESSIBLE: expert tensor parallel %d: without expert parallelism torchtitan 0.2\n"
                   "# splits the experts over the tp ranks (%d)\n",
                d->etp, l->tp);
    if (m->capacity_factor > 0)
        fprintf(f, "# NOT EXPRESSIBLE: capacity factor %g: torchtitan's token-choice experts drop no tokens\n",
                m->capacity_factor);
    export_imbalance_note(f, p, "torchtitan setting");
    if (l->overlap_ep)
        fprintf(f, "# NOT EXPRESSIBLE: the experts' all-to-all overlapped with compute: torchtitan overlaps it\n"
                   "# only in its DualPipeV pipeline schedule\n");
    if (p->spec.job.moe_dispatcher == MODEL_MOE_DISPATCH_FLEX && t->v03)
        fprintf(f, "# NOT EXPRESSIBLE: the flex dispatcher (DeepEP): torchtitan 0.3 chooses its expert-parallel\n"
                   "# communication in its model config functions (comm_backend), not on the command line\n");
    if (p->spec.job.moe_dispatcher == MODEL_MOE_DISPATCH_ALLGATHER)
        fprintf(f, "# NOT EXPRESSIBLE: the allgather dispatcher: torchtitan dispatches by all-to-all\n");
}

/* HSDP, FSDP2's gathers, prefetch, buckets and offload against the plan's. */
static void titan_sharding_notes(FILE *f, const Titan *t, const ModelPlan *p)
{
    const ModelLayout *l = &p->spec.layout;
    if (l->dp_replicate > 1)
        fprintf(f, "# HSDP: parameters sharded over %d ranks (x cp %d), replicated %d times\n", l->dp_shard, l->cp,
                l->dp_replicate);
    if (l->zero == 3 && !l->fsdp && l->recompute == MODEL_RECOMPUTE_FULL && !l->keep_gathered)
        fprintf(f, "# the plan predicts DeepSpeed ZeRO-3's gathers (a recomputed forward gathers again); FSDP2's\n"
                   "# pre-backward gather serves the recompute: plan with --fsdp for torchtitan's figures\n");
    if (l->zero == 3 && l->prefetch > 1)
        fprintf(f, "# NOT EXPRESSIBLE: prefetch of %d layers: FSDP2 prefetches the next block only (torchtitan\n"
                   "# sets no explicit prefetch)\n", l->prefetch);
    if (l->bucket_bytes > 0)
        fprintf(f, "# NOT EXPRESSIBLE: buckets of %.0f bytes: FSDP2 gathers and reduces one transformer block\n"
                   "# (one fully_shard unit) per call\n", l->bucket_bytes);
    if (t->cpu_offload)
        fprintf(f, "# optimizer offload as FSDP2's CPU offload (enable_cpu_offload), which keeps the sharded\n"
                   "# parameters and gradients on the host too: device memory below the plan's, more PCIe traffic\n");
    if (l->offload_activations)
        fprintf(f, "# NOT EXPRESSIBLE: activation offload: torchtitan has no setting for it\n");
}

/* torchtitan's schedule (components/optimizer/lr_scheduler.py, 0.2's components/lr_scheduler.py):
 * linear warm-up, the peak held, then the last decay_ratio x steps decaying to min_lr_factor at
 * the last step (None: every step after the warm-up). A WSD decay is its ratio of the steps. */
static void titan_decay_ratio(char *buf, size_t cap, const ExportTrain *tr)
{
    if (tr->wsd)
        num(buf, cap, export_ratio(tr->wsd_iters, tr->iters));
    else
        snprintf(buf, cap, "None");
}

/* Where the training figures come from, and the decay torchtitan cannot end anywhere but at
 * the last step. */
static void titan_train_notes(FILE *f, const ExportTrain *tr)
{
    export_train_comments(f, tr);
    if (tr->decay_iters != tr->iters)
        fprintf(f, "# NOT EXPRESSIBLE: the minimum learning rate at iteration %d: torchtitan's decay ends at the last\n"
                   "# step (%d)\n",
                tr->decay_iters, tr->iters);
}

static void titan_notes(FILE *f, const Titan *t, const ModelPlan *p, const ModelDims *d)
{
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *j = &p->spec.job;
    titan_model_notes(f, t, p);
    titan_train_notes(f, &t->tr);
    export_framework_note(f, p, MODEL_FW_TORCHTITAN);
    titan_dp_notes(f, t, p, d);
    titan_cp_notes(f, t, &p->spec.layout);
    if (l->tp > 1 && l->sp)
        fprintf(f, "# tensor parallelism with sequence parallelism: %s\n",
                t->v03 ? "enable_sequence_parallel, torchtitan's default" : "torchtitan 0.2's TP always applies it");
    else if (l->tp > 1 && t->v03)
        fprintf(f, "# tensor parallelism without sequence parallelism (enable_sequence_parallel off)\n");
    else if (l->tp > 1)
        fprintf(f, "# NOT EXPRESSIBLE: tensor parallelism without sequence parallelism: torchtitan 0.2's TP always\n"
                   "# applies SequenceParallel\n");
    if (d->uneven)
        fprintf(f, "# uneven pipeline split: each stage's modules listed in module_fqns_per_model_part\n");
    titan_sharding_notes(f, t, p);
    if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        fprintf(f, "# NOT EXPRESSIBLE: selective recompute of the attention core: torchtitan's selective policy\n"
                   "# works per op (saves matmul outputs but every second one, attention and reduce-scatter\n"
                   "# outputs; recomputes the rest), so its activation memory differs from the plan's\n");
    if (j->precision == PX_FP16)
        fprintf(f, "# NOT EXPRESSIBLE: fp16 mixed precision (and its loss scaling): torchtitan's\n"
                   "# mixed_precision_param is bfloat16 or float32; written as bfloat16, the same bytes\n");
    if (j->precision != PX_FP32 && j->grad_dtype != PX_FP32)
        fprintf(f, "# NOT EXPRESSIBLE: %s gradient reduction: torchtitan's mixed_precision_reduce is float32 only\n",
                px_dtype_name(j->grad_dtype));
    if (!t->v03 && !t->fsdp && t->replicate == 1 && (l->tp > 1 || l->pp > 1) && j->precision != PX_FP32)
        fprintf(f, "# NOT EXPRESSIBLE: %s with TP or PP and no FSDP or CP: torchtitan 0.2 then trains in float32\n"
                   "# (maybe_enable_amp: mixed precision comes from fully_shard, or autocast without TP and PP)\n",
                px_dtype_name(j->precision));
    if (t->async_tp)
        fprintf(f, "# TP communication overlapped with the GEMMs: torchtitan's async TP, which needs torch.compile\n");
    titan_fp8_notes(f, t, p);
    titan_moe_notes(f, t, p, d);
    if (j->optimizer == MODEL_OPT_SGD_MOMENTUM)
        fprintf(f, "# NOT EXPRESSIBLE: SGD with momentum %g: torchtitan's optimizers are Adam and AdamW%s; written as\n"
                   "# AdamW with the plan's learning rate and weight decay\n",
                j->momentum, t->v03 ? " (and DistMuon)" : "");
    else if (j->optimizer == MODEL_OPT_ADAM_8BIT)
        fprintf(f, "# NOT EXPRESSIBLE: 8-bit Adam: torchtitan keeps AdamW's states in %s; its memory was planned\n",
                t->v03 ? "fp32 (or bf16: implementation fused_opt_states_bf16)" : "fp32");
    if (j->dropout > 0)
        fprintf(f, "# NOT EXPRESSIBLE: dropout %g: torchtitan's models have no dropout\n", j->dropout);
    if (!j->flash_attn)
        fprintf(f, "# NOT EXPRESSIBLE: attention that saves its s x s scores: torchtitan's is a fused kernel\n");
    if (d->vocab_pad != p->spec.model.vocab)
        fprintf(f, "# NOT EXPRESSIBLE: the vocabulary padded to %d: torchtitan keeps the model's %d\n", d->vocab_pad,
                p->spec.model.vocab);
    if (j->data[0])
        fprintf(f, "# the plan's training data (%s) is parallax's: name torchtitan's dataset with %s\n", j->data,
                t->v03 ? "--dataloader.dataset" : "training.dataset");
    if (t->cuda_graphs_off)
        fprintf(f, "# torchtitan 0.3 captures CUDA graphs unless told not to, and refuses them with %s\n",
                l->pp > 1 ? "pipeline parallelism" : "its expert-parallel dispatch");
}

/* The modules of pipeline stage i of an uneven split (vpp 1) as module_fqns_per_model_part
 * lists them: a TOML array of strings, or one comma-separated word of the command line. 0.2's
 * output layer is "output", 0.3's "lm_head". */
static void titan_stage_fqns(FILE *f, const ModelLayout *l, int i, int v03, int toml)
{
    const char *q = toml ? "\"" : "", *sep = toml ? ", " : ",";
    int first = 0, n = 0;
    for (int k = 0; k < i; k++)
        first += l->stage_layers[k];
    fputs(toml ? "    [" : " ", f);
    if (i == 0)
        fprintf(f, "%stok_embeddings%s", q, q), n++;
    for (int k = first; k < first + l->stage_layers[i]; k++)
        fprintf(f, "%s%slayers.%d%s", n++ ? sep : "", q, k, q);
    if (i == l->n_stage_layers - 1)
        fprintf(f, "%s%snorm%s%s%s%s%s", n ? sep : "", q, q, sep, q, v03 ? "lm_head" : "output", q);
    if (toml)
        fputs("],\n", f);
}

static void arg(FILE *f, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One word of the torchrun command, continued on the next line: a flag and, with fmt, its value. */
static void arg(FILE *f, const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    export_vflag(f, " \\\n", name, fmt, ap);
    va_end(ap);
}

/* torchtitan 0.3's command line. tyro takes both spellings of a key; parallax writes the
 * underscore one, and the activation-checkpoint policy last, as the subcommand it is. */
void export_torchtitan(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *j = &p->spec.job;
    Titan t;
    titan_resolve(&t, p, d, 1);
    int nodes;
    const int per_node = export_node_size(p, &nodes);
    fprintf(f, "# torchtitan 0.3 command line for %s on %d GPUs (%s), written by parallax:\n"
               "# --module and --config name torchtitan's config function, the flags after them override it.\n"
               "# torchtitan 0.2 reads a TOML job file instead: parallax export PLAN --format torchtitan-toml\n",
            c->name, p->gpus, p->cluster);
    titan_notes(f, &t, p, d);
    char x[32];
    fprintf(f, "torchrun --nnodes %d --nproc_per_node %d -m torchtitan.train \\\n", nodes, per_node);
    arg(f, "--module", "%s", t.fl ? t.fl->module : "MODULE");
    arg(f, "--config", "%s", t.config ? t.config : "CONFIG");
    arg(f, "--parallelism.data_parallel_replicate_degree", "%d", t.replicate);
    arg(f, "--parallelism.data_parallel_shard_degree", "%d", t.shard);
    arg(f, "--parallelism.fsdp_reshard_after_forward", "%s", t.reshard);
    arg(f, "--parallelism.tensor_parallel_degree", "%d", l->tp);
    if (l->tp > 1)
        arg(f, l->sp ? "--parallelism.enable_sequence_parallel" : "--parallelism.no_enable_sequence_parallel", NULL);
    arg(f, "--parallelism.context_parallel_degree", "%d", l->cp);
    arg(f, "--parallelism.pipeline_parallel_degree", "%d", l->pp);
    if (l->pp > 1) {
        arg(f, "--parallelism.pipeline_parallel_schedule", "%s", t.schedule);
        arg(f, "--parallelism.pipeline_parallel_microbatch_size", "%d", j->micro_batch);
        if (d->uneven) {
            fprintf(f, "    --parallelism.module_fqns_per_model_part");
            for (int i = 0; i < l->n_stage_layers; i++)
                titan_stage_fqns(f, l, i, 1, 0);
            fputs(" \\\n", f);
        } else {
            arg(f, "--parallelism.pipeline_parallel_layers_per_stage", "%d", d->chunk_layers);
            arg(f, "--parallelism.pipeline_parallel_first_stage_less_layers", "0");
            arg(f, "--parallelism.pipeline_parallel_last_stage_less_layers", "0");
        }
    }
    arg(f, "--parallelism.expert_parallel_degree", "%d", d->ep > 1 ? d->ep : 1);
    if (t.async_tp) {
        arg(f, "--compile.enable", NULL);
        arg(f, "--compile.enable_async_tensor_parallel", NULL);
    } else {
        arg(f, "--compile.no_enable_async_tensor_parallel", NULL);
    }
    arg(f, "--training.local_batch_size", "%d", t.local_batch);
    arg(f, "--training.global_batch_size", "%d", j->global_batch);
    arg(f, "--training.seq_len", "%d", d->s);
    arg(f, "--training.steps", "%d", t.tr.iters);
    num(x, sizeof x, j->grad_clip > 0 ? j->grad_clip : INFINITY);
    arg(f, "--training.max_norm", "%s", x);
    arg(f, "--training.mixed_precision_param", "%s", t.param_dtype);
    arg(f, "--training.mixed_precision_reduce", "float32");
    if (t.cuda_graphs_off)
        arg(f, "--training.disable_cuda_graphs", NULL);
    if (t.cpu_offload)
        arg(f, "--training.enable_cpu_offload", NULL);
    arg(f, "--optimizer.param_groups.0.optimizer_name", "AdamW");
    num(x, sizeof x, t.tr.lr);
    arg(f, "--optimizer.param_groups.0.optimizer_kwargs.lr", "%s", x);
    char b2[32];
    num(x, sizeof x, j->beta1);
    num(b2, sizeof b2, j->beta2);
    arg(f, "--optimizer.param_groups.0.optimizer_kwargs.betas", "%s %s", x, b2);
    num(x, sizeof x, j->adam_eps);
    arg(f, "--optimizer.param_groups.0.optimizer_kwargs.eps", "%s", x);
    num(x, sizeof x, j->weight_decay);
    arg(f, "--optimizer.param_groups.0.optimizer_kwargs.weight_decay", "%s", x);
    arg(f, "--lr_scheduler.warmup_steps", "%d", t.tr.warmup);
    titan_decay_ratio(x, sizeof x, &t.tr);
    arg(f, "--lr_scheduler.decay_ratio", "%s", x);
    arg(f, "--lr_scheduler.decay_type", "cosine");
    num(x, sizeof x, export_ratio(t.tr.min_lr, t.tr.lr));
    arg(f, "--lr_scheduler.min_lr_factor", "%s", x);
    if (j->moe_force_balance && c->moe.experts > 0)
        arg(f, "--debug.moe_force_load_balance", NULL);
    arg(f, "--debug.seed", "%llu", (unsigned long long)j->seed);
    fprintf(f, "    activation-checkpoint:%s\n", t.ac);
}

/* 0.2's [optimizer] and [lr_scheduler] tables: AdamW, warmed up linearly, then cosine. */
static void titan_toml_optimizer(FILE *f, const ModelJob *j, const ExportTrain *tr)
{
    char x[32];
    fprintf(f, "\n[optimizer]\nname = \"AdamW\"\n");
    toml_float(x, sizeof x, tr->lr);
    fprintf(f, "lr = %s\n", x);
    toml_float(x, sizeof x, j->beta1);
    fprintf(f, "beta1 = %s\n", x);
    toml_float(x, sizeof x, j->beta2);
    fprintf(f, "beta2 = %s\n", x);
    toml_float(x, sizeof x, j->adam_eps);
    fprintf(f, "eps = %s\n", x);
    toml_float(x, sizeof x, j->weight_decay);
    fprintf(f, "weight_decay = %s\n", x);
    fprintf(f, "\n[lr_scheduler]\nwarmup_steps = %d\ndecay_type = \"cosine\"\n", tr->warmup);
    if (tr->wsd) {
        toml_float(x, sizeof x, export_ratio(tr->wsd_iters, tr->iters));
        fprintf(f, "decay_ratio = %s\n", x);
    }
    toml_float(x, sizeof x, export_ratio(tr->min_lr, tr->lr));
    fprintf(f, "min_lr_factor = %s\n", x);
}

/* 0.2's quantize tables for the FP8 converters of [model]: float8 (tensorwise or rowwise, FP8
 * gathers where FSDP takes them) or MXFP8, on the linear layers and the experts' grouped GEMMs. */
static void titan_toml_fp8(FILE *f, const Titan *t, int moe)
{
    if (t->fp8 && !t->fp8_mx) {
        /* the output layer and the router stay in high precision, as in the plan */
        fprintf(f, "\n[quantize.linear.float8]\nfilter_fqns = [\"output\"%s]\n", moe ? ", \"router.gate\"" : "");
        if (t->fp8_rowwise)
            fprintf(f, "recipe_name = \"rowwise\"\n");
        if (t->fp8_gather)
            fprintf(f, "enable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true\n");
        if (moe)
            fprintf(f, "\n[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\n");
    } else if (t->fp8) {
        fprintf(f, "\n[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"\nfilter_fqns = [\"output\"%s]\n",
                moe ? ", \"router.gate\"" : "");
        if (moe)
            fprintf(f, "\n[quantize.grouped_mm.mx]\nrecipe_name = \"mxfp8\"\nfqns = [\"experts\"]\n");
    }
}

/* torchtitan 0.2's TOML job file: JobConfig's sections as tables. */
void export_torchtitan_toml(FILE *f, const ModelPlan *p, const ModelDims *d)
{
    const ModelConfig *c = &p->spec.model;
    const ModelLayout *l = &p->spec.layout;
    const ModelJob *j = &p->spec.job;
    Titan t;
    titan_resolve(&t, p, d, 0);
    int nodes;
    const int per_node = export_node_size(p, &nodes);
    fprintf(f, "# torchtitan 0.2 job file for %s on %d GPUs (%s), written by parallax; run it as\n"
               "# torchrun --nnodes %d --nproc_per_node %d -m torchtitan.train --job.config_file FILE\n"
               "# torchtitan 0.3 takes no job file: parallax export PLAN --format torchtitan\n",
            c->name, p->gpus, p->cluster, nodes, per_node);
    titan_notes(f, &t, p, d);
    char x[32];
    fprintf(f, "\n[job]\ndescription = \"%s on %d GPUs (%s), planned by parallax\"\n", c->name, p->gpus, p->cluster);
    fprintf(f, "\n[model]\nname = \"%s\"\nflavor = \"%s\"\n", t.fl ? t.fl->module : "MODEL", t.fl ? t.fl->flavor : "FLAVOR");
    const int moe = c->moe.experts > 0;
    if (t.fp8) {
        const char *kind = t.fp8_mx ? "mx" : "float8";
        fprintf(f, "converters = [\"quantize.linear.%s\"%s%s%s]\n", kind, moe ? ", \"quantize.grouped_mm." : "",
                moe ? kind : "", moe ? "\"" : "");
    }
    titan_toml_optimizer(f, j, &t.tr);
    fprintf(f, "\n[training]\nlocal_batch_size = %d\nglobal_batch_size = %d\nseq_len = %d\nsteps = %d\n",
            t.local_batch, j->global_batch, d->s, t.tr.iters);
    toml_float(x, sizeof x, j->grad_clip > 0 ? j->grad_clip : INFINITY);
    fprintf(f, "max_norm = %s\nmixed_precision_param = \"%s\"\nmixed_precision_reduce = \"float32\"\n", x, t.param_dtype);
    if (t.cpu_offload)
        fprintf(f, "enable_cpu_offload = true\n");
    fprintf(f, "\n[parallelism]\ndata_parallel_replicate_degree = %d\ndata_parallel_shard_degree = %d\n"
               "fsdp_reshard_after_forward = \"%s\"\ntensor_parallel_degree = %d\nenable_async_tensor_parallel = %s\n"
               "context_parallel_degree = %d\npipeline_parallel_degree = %d\n",
            t.replicate, t.shard, t.reshard, l->tp, export_bool(t.async_tp), l->cp, l->pp);
    if (l->cp > 1)
        fprintf(f, "context_parallel_rotate_method = \"%s\"\n", titan_rotate(l));
    if (l->pp > 1) {
        fprintf(f, "pipeline_parallel_schedule = \"%s\"\npipeline_parallel_microbatch_size = %d\n", t.schedule,
                j->micro_batch);
        if (d->uneven) {
            fprintf(f, "module_fqns_per_model_part = [\n");
            for (int i = 0; i < l->n_stage_layers; i++)
                titan_stage_fqns(f, l, i, 0, 1);
            fprintf(f, "]\n");
        } else {
            fprintf(f, "pipeline_parallel_layers_per_stage = %d\npipeline_parallel_first_stage_less_layers = 0\n"
                       "pipeline_parallel_last_stage_less_layers = 0\n",
                    d->chunk_layers);
        }
    }
    fprintf(f, "expert_parallel_degree = %d\nexpert_tensor_parallel_degree = %d\n", d->ep > 1 ? d->ep : 1, t.etp);
    if (p->spec.job.moe_dispatcher == MODEL_MOE_DISPATCH_FLEX)
        fprintf(f, "expert_parallel_comm_backend = \"deepep\"\n");
    fprintf(f, "\n[activation_checkpoint]\nmode = \"%s\"\n", t.ac);
    if (l->recompute == MODEL_RECOMPUTE_SELECTIVE)
        fprintf(f, "selective_ac_option = \"op\"\n");
    if (t.async_tp)
        fprintf(f, "\n[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]\n");
    titan_toml_fp8(f, &t, moe);
    fprintf(f, "\n[debug]\nseed = %llu\n", (unsigned long long)j->seed);
    if (j->moe_force_balance && moe)
        fprintf(f, "moe_force_load_balance = true\n");
}
