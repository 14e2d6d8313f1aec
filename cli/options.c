/* The layout and training knobs' table, and parsing a command's options (common/px.h's option
 * tables) into CliArgs. */
#include "cli/options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(CLI_KNOB_COUNT <= CLI_MODEL, "knob ids come before the other options'");

const CliOption cli_knob_options[] = {
    {"tp", 1, "N", "tensor-parallel degree", CLI_TP, 0},
    {"pp", 1, "N", "pipeline-parallel degree (stages)", CLI_PP, 0},
    {"pp-layers", 1, "N,N...", "layers of each pipeline stage, e.g. 1,3 (sets pp; default: even)", CLI_PP_LAYERS, 0},
    {"account-for-embedding-in-pipeline-split", 0, NULL, "the input embedding counts as one layer in the pipeline split", CLI_EMBED_SPLIT, 0},
    {"account-for-loss-in-pipeline-split", 0, NULL, "the output layer and loss count as one layer in the pipeline split", CLI_LOSS_SPLIT, 0},
    {"decoder-first-pipeline-num-layers", 1, "N", "layers of the first pipeline stage, the rest even", CLI_FIRST_LAYERS, 0},
    {"decoder-last-pipeline-num-layers", 1, "N", "layers of the last pipeline stage, the rest even", CLI_LAST_LAYERS, 0},
    {"pipeline-model-parallel-layout", 1, "S", "Megatron layout string of the pp x vpp stages, e.g. \"Et*3|(t*4|)*14,t*2L\"", CLI_PP_LAYOUT, 0},
    {"dp", 1, "N", "data-parallel degree (default: what the GPUs leave)", CLI_DP, 0},
    {"cp", 1, "N", "context-parallel degree", CLI_CP, 0},
    {"cp-comm-type", 1, "T", "context-parallel attention: p2p (K/V ring, default) | allgather | a2a (Ulysses)", CLI_CP_COMM, 0},
    {"vpp", 1, "N", "model chunks per pipeline rank (>1: interleaved schedule)", CLI_VPP, 0},
    {"zero", 1, "0-3", "ZeRO stage: 1 optimizer+master, 2 +grads, 3 +params sharded", CLI_ZERO, 0},
    {"fsdp", 0, NULL, "FSDP2 / Megatron-FSDP sharding: zero 3 whose backward gather also serves the recompute", CLI_FSDP, 0},
    {"no-reshard-after-forward", 0, NULL, "zero 3: keep each layer's gathered parameters from its forward to its backward", CLI_KEEP_GATHERED, 0},
    {"reshard-after-forward", 0, NULL, "zero 3: free them after the forward, gather again in the backward (default)", CLI_RESHARD, 0},
    {"fsdp-prefetch", 1, "N", "zero 3: layers whose parameter gathers run ahead of the compute (default 1; 0: none)", CLI_PREFETCH, 0},
    {"zero-bucket-bytes", 1, "B", "ZeRO gathers and gradient reductions in calls of at most B bytes, e.g. 5e8 (default: one per layer)", CLI_BUCKET, 0},
    {"dp-shard", 1, "N", "HSDP: data-parallel ranks that shard the ZeRO state (default: dp)", CLI_DP_SHARD, 0},
    {"dp-replicate", 1, "N", "HSDP: replicas of the sharded state; dp = dp-shard x dp-replicate (default 1)", CLI_DP_REPLICATE, 0},
    {"offload-optimizer", 0, NULL, "master weights and optimizer state in host memory, the optimizer step on the host", CLI_OFFLOAD_OPT, 0},
    {"offload-activations", 0, NULL, "saved activations to host memory in the forward, back before the backward", CLI_OFFLOAD_ACT, 0},
    {"sp", 0, NULL, "sequence parallelism (needs tp > 1)", CLI_SP, 0},
    {"no-sp", 0, NULL, "no sequence parallelism (default)", CLI_NO_SP, 0},
    {"recompute", 1, "MODE", "activation recompute: none | selective | full", CLI_RECOMPUTE, 0},
    {"schedule", 1, "S", "pipeline schedule: 1f1b | gpipe | interleaved", CLI_SCHEDULE, 0},
    {"mbs", 1, "N", "micro-batch size in sequences (default 1)", CLI_MBS, 0},
    {"gbs", 1, "N", "global batch size in sequences (default: mbs x dp)", CLI_GBS, 0},
    {"seq", 1, "N", "sequence length (default: the model's)", CLI_SEQ, 0},
    {"precision", 1, "T", "fp32 | bf16 | fp16 | fp8 (bf16 with FP8 GEMMs; default: bf16 on GPUs, fp32 on CPUs)", CLI_PRECISION, 0},
    {"fp8-recipe", 1, "R", "FP8 GEMMs scaled delayed | tensorwise | blockwise | mxfp8 (default with --precision fp8: delayed)", CLI_FP8_RECIPE, 0},
    {"fp8-format", 1, "F", "hybrid (E4M3 forward, E5M2 gradients; default) | e4m3", CLI_FP8_FORMAT, 0},
    {"fp8-param-gather", 0, NULL, "keep weights in FP8 only and gather them in FP8 (no bf16 copy)", CLI_FP8_PARAM_GATHER, 0},
    {"fp8-amax-history", 1, "N", "delayed scaling's amax history length (default 1024)", CLI_FP8_AMAX_HISTORY, 0},
    {"fp8-attention", 0, NULL, "the attention core in FP8 too (default: bf16)", CLI_FP8_ATTENTION, 0},
    {"fp8-dispatch", 0, NULL, "MoE tokens dispatched in FP8 with their scales, as DeepSeek-V3 (default: bf16)", CLI_FP8_DISPATCH, 0},
    {"grad-dtype", 1, "T", "gradient dtype: fp32 (default) | bf16 | fp16", CLI_GRAD_DTYPE, 0},
    {"optimizer", 1, "O", "adamw (default) | sgd-momentum | adam-8bit", CLI_OPTIMIZER, 0},
    {"flash-attn", 0, NULL, "flash attention: no s x s matrices saved (default)", CLI_FLASH, 0},
    {"no-flash-attn", 0, NULL, "unfused attention that saves the softmax", CLI_NO_FLASH, 0},
    {"dropout", 1, "P", "dropout probability (default 0: no dropout)", CLI_DROPOUT, 0},
    {"overlap-dp", 0, NULL, "overlap DP reduction and ZeRO gathers with compute", CLI_OVERLAP_DP, 0},
    {"no-overlap-dp", 0, NULL, "do not overlap DP communication (default)", CLI_NO_OVERLAP_DP, 0},
    {"overlap-tp", 0, NULL, "overlap TP communication with compute", CLI_OVERLAP_TP, 0},
    {"no-overlap-tp", 0, NULL, "do not overlap TP communication (default)", CLI_NO_OVERLAP_TP, 0},
    {"ep", 1, "N|LIST|auto", "expert-parallel degree: routed experts split over N ranks (plan: a list like 1,2,4,8, or auto, to search)", CLI_EP, 0},
    {"etp", 1, "N|LIST|auto", "expert tensor-parallel degree (default: tp, as Megatron-Core; plan: a list or auto)", CLI_ETP, 0},
    {"overlap-ep", 0, NULL, "overlap the experts' all-to-all with the shared experts and another micro-batch", CLI_OVERLAP_EP, 0},
    {"no-overlap-ep", 0, NULL, "do not overlap the experts' all-to-all (default)", CLI_NO_OVERLAP_EP, 0},
    {"moe-imbalance", 1, "X", "busiest expert-parallel rank's tokens over the balanced share, >= 1 (default 1)", CLI_MOE_IMBALANCE, 0},
    {"moe-force-balance", 0, NULL, "route tokens round-robin (Megatron's --moe-router-force-load-balancing): imbalance 1", CLI_MOE_FORCE_BALANCE, 0},
    {"pad-vocab", 1, "N", "pad the vocabulary to a multiple of N x tp (Megatron: 128; default 1)", CLI_PAD_VOCAB, 0},
    {"causal-flops", 0, NULL, "count only the causal half of attention FLOPs", CLI_CAUSAL, 0},
    {"fused-kernels", 0, NULL, "fused elementwise kernels: bias-GeLU, bias-dropout-add, softmax (default)", CLI_FUSED, 0},
    {"no-fused-kernels", 0, NULL, "one kernel per elementwise step", CLI_NO_FUSED, 0},
    {"async-tp-grad", 0, NULL, "QKV's and fc1's backward TP collectives under their own GEMMs (Megatron since late 2021; default)", CLI_ASYNC_TP, 0},
    {"no-async-tp-grad", 0, NULL, "their backward TP collectives exposed, as Megatron of early 2021 (Narayanan et al.)", CLI_NO_ASYNC_TP, 0},
    {"tokens", 1, "N", "tokens to train on: report days and GPU-hours (e.g. 300e9)", CLI_TOKENS, 0},
    {"lr", 1, "X", "peak learning rate (default 1e-3)", CLI_LR, 0},
    {"min-lr", 1, "X", "learning rate at the end of the cosine decay (default 1e-4)", CLI_MIN_LR, 0},
    {"warmup-steps", 1, "N", "linear warm-up steps (default 10)", CLI_WARMUP, 0},
    {"steps", 1, "N", "training steps (default 100)", CLI_STEPS, 0},
    {"seed", 1, "N", "initialisation and data seed (default 1234)", CLI_SEED, 0},
    {"weight-decay", 1, "X", "decoupled weight decay (default 0.1)", CLI_WD, 0},
    {"grad-clip", 1, "X", "clip the global gradient norm to X, 0 for none (default 1.0)", CLI_CLIP, 0},
    {"data", 1, "FILE", "training data: a text file or llm.c .bin tokens (default: built-in text)", CLI_DATA, 0},
    {"set", 1, "KEY=V", "override a profile figure, e.g. network.bandwidth_per_device=100e9 (repeatable)", CLI_SET, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

int cli_fail(const char *cmd, int status, const PxError *err)
{
    fprintf(stderr, "parallax %s: %s\n", cmd, err->msg);
    return status == PX_EINPUT ? 2 : 1;
}

void cli_print_json(cJSON *j)
{
    char *s = cJSON_Print(j);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

static void print_help_as(const char *prog, const char *usage, const CliOption *const *tables)
{
    char line[2048];
    snprintf(line, sizeof line, "%s %s", prog, usage);
    px_opts_help(stdout, line, tables);
}

/* --ep / --etp: one degree (into *one), a list of them (lists only when the command searches:
 * the planner), or "auto" (search every degree; *n 0). */
static int degree_list(const char *arg, const char *flag, int allow_lists, int *one, int *list,
                       int *n, PxError *err)
{
    *n = 0;
    if (!strcmp(arg, "auto")) {
        if (!allow_lists)
            return px_fail(err, PX_EINPUT, "%s auto: only parallax plan searches the degree; give one value", flag);
        *one = 0;
        return PX_OK;
    }
    const char *p = arg;
    while (*p) {
        const char *comma = strchr(p, ',');
        char item[32];
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item)
            return px_fail(err, PX_EINPUT, "%s: expected a degree, a list like 1,2,4,8 or auto, got '%s'", flag, arg);
        if (*n == CLI_MAX_LIST)
            return px_fail(err, PX_EINPUT, "%s: at most %d values, got '%s'", flag, CLI_MAX_LIST, arg);
        memcpy(item, p, len);
        item[len] = '\0';
        int rc = px_parse_int(item, flag, 1, 1 << 16, &list[*n], err);
        if (rc)
            return rc;
        (*n)++;
        p = comma ? comma + 1 : p + len;
        if (comma && !*p)
            return px_fail(err, PX_EINPUT, "%s: expected a degree, a list like 1,2,4,8 or auto, got '%s'", flag, arg);
    }
    if (*n > 1 && !allow_lists)
        return px_fail(err, PX_EINPUT, "%s %s: only parallax plan searches a list of degrees; give one value", flag, arg);
    *one = *n == 1 ? list[0] : 0;
    return PX_OK;
}

/* One knob of the spec into a: PX_OK, or PX_EINPUT naming the option and the value. */
static int knob(int id, const char *arg, CliArgs *a, PxError *err)
{
    ModelLayout *l = &a->spec.layout;
    ModelJob *j = &a->spec.job;
    int rc = PX_OK, v;
    switch (id) {
    case CLI_TP: rc = px_parse_int(arg, "--tp", 1, 1 << 16, &l->tp, err); break;
    case CLI_PP: rc = px_parse_int(arg, "--pp", 1, 1 << 16, &l->pp, err); break;
    case CLI_PP_LAYERS:
        /* the stages are the entries, unless --pp says otherwise (the layout rules then
         * name the mismatch) */
        if (!(rc = model_split_parse(arg, "--pp-layers", l, err)) && !cli_given(a, CLI_PP))
            l->pp = l->n_stage_layers;
        break;
    case CLI_DP: rc = px_parse_int(arg, "--dp", 1, 1 << 24, &l->dp, err); break;
    case CLI_CP: rc = px_parse_int(arg, "--cp", 1, 1 << 16, &l->cp, err); break;
    case CLI_VPP: rc = px_parse_int(arg, "--vpp", 1, 1 << 16, &l->vpp, err); break;
    case CLI_ZERO: rc = px_parse_int(arg, "--zero", 0, 3, &l->zero, err); break;
    case CLI_FSDP:
        l->fsdp = 1;
        l->zero = 3;
        break;
    case CLI_KEEP_GATHERED: l->keep_gathered = 1; break;
    case CLI_RESHARD: l->keep_gathered = 0; break;
    case CLI_PREFETCH:
        if (!(rc = px_parse_int(arg, "--fsdp-prefetch", 0, 16, &v, err)))
            l->prefetch = v == 0 ? -1 : v;
        break;
    case CLI_BUCKET:
        rc = px_parse_double(arg, "--zero-bucket-bytes", &l->bucket_bytes, err);
        if (!rc && !(l->bucket_bytes >= 1 && l->bucket_bytes <= 1e15))
            rc = px_fail(err, PX_EINPUT, "--zero-bucket-bytes: expected a positive number of bytes, e.g. 5e8, got %s", arg);
        break;
    case CLI_DP_SHARD: rc = px_parse_int(arg, "--dp-shard", 1, 1 << 24, &l->dp_shard, err); break;
    case CLI_DP_REPLICATE: rc = px_parse_int(arg, "--dp-replicate", 1, 1 << 24, &l->dp_replicate, err); break;
    case CLI_OFFLOAD_OPT: l->offload_optimizer = 1; break;
    case CLI_OFFLOAD_ACT: l->offload_activations = 1; break;
    case CLI_CP_COMM:
        if ((v = model_cp_comm_from_name(arg)) < 0)
            rc = px_fail(err, PX_EINPUT, "--cp-comm-type: expected p2p, allgather or a2a, got '%s'", arg);
        else
            l->cp_comm = (ModelCpComm)v;
        break;
    case CLI_EMBED_SPLIT: l->embed_in_split = 1; break;
    case CLI_LOSS_SPLIT: l->loss_in_split = 1; break;
    case CLI_FIRST_LAYERS:
        rc = px_parse_int(arg, "--decoder-first-pipeline-num-layers", 1, 100000, &l->first_stage_layers, err);
        break;
    case CLI_LAST_LAYERS:
        rc = px_parse_int(arg, "--decoder-last-pipeline-num-layers", 1, 100000, &l->last_stage_layers, err);
        break;
    case CLI_PP_LAYOUT:
        if (strlen(arg) >= sizeof l->pp_layout)
            rc = px_fail(err, PX_EINPUT, "--pipeline-model-parallel-layout: at most %zu characters, got %zu",
                         sizeof l->pp_layout - 1, strlen(arg));
        else
            snprintf(l->pp_layout, sizeof l->pp_layout, "%s", arg);
        break;
    case CLI_SP: l->sp = 1; break;
    case CLI_NO_SP: l->sp = 0; break;
    case CLI_RECOMPUTE:
        if ((v = model_recompute_from_name(arg)) < 0)
            rc = px_fail(err, PX_EINPUT, "--recompute: expected none, selective or full, got '%s'", arg);
        else
            l->recompute = (ModelRecompute)v;
        break;
    case CLI_SCHEDULE:
        if ((v = model_schedule_from_name(arg)) < 0)
            rc = px_fail(err, PX_EINPUT, "--schedule: expected 1f1b, gpipe or interleaved, got '%s'", arg);
        else
            l->schedule = (ModelSchedule)v;
        break;
    case CLI_MBS: rc = px_parse_int(arg, "--mbs", 1, 1 << 24, &j->micro_batch, err); break;
    case CLI_GBS: rc = px_parse_int(arg, "--gbs", 1, 1 << 30, &j->global_batch, err); break;
    case CLI_SEQ: rc = px_parse_int(arg, "--seq", 1, 1 << 24, &j->seq_len, err); break;
    case CLI_PRECISION:
        v = px_dtype_from_name(arg);
        if (v == PX_FP8) {
            /* FP8 GEMMs on bf16 weights and activations, as Megatron's --bf16 --fp8-format */
            j->precision = PX_BF16;
            if (j->fp8 == MODEL_FP8_NONE)
                j->fp8 = MODEL_FP8_DELAYED;
        } else if (v != PX_FP32 && v != PX_BF16 && v != PX_FP16)
            rc = px_fail(err, PX_EINPUT, "--precision: expected fp32, bf16, fp16 or fp8, got '%s'", arg);
        else
            j->precision = (PxDtype)v;
        break;
    case CLI_FP8_RECIPE:
        if ((v = model_fp8_recipe_from_name(arg)) < 0)
            rc = px_fail(err, PX_EINPUT,
                         "--fp8-recipe: expected delayed, tensorwise, blockwise, mxfp8 or none, got '%s'", arg);
        else
            j->fp8 = (ModelFp8Recipe)v;
        break;
    case CLI_FP8_FORMAT:
        if ((v = model_fp8_format_from_name(arg)) < 0)
            rc = px_fail(err, PX_EINPUT, "--fp8-format: expected hybrid or e4m3, got '%s'", arg);
        else
            j->fp8_format = (ModelFp8Format)v;
        break;
    case CLI_FP8_PARAM_GATHER: j->fp8_param_gather = 1; break;
    case CLI_FP8_AMAX_HISTORY: rc = px_parse_int(arg, "--fp8-amax-history", 1, 1 << 16, &j->fp8_amax_history, err); break;
    case CLI_FP8_ATTENTION: j->fp8_attention = 1; break;
    case CLI_FP8_DISPATCH: j->fp8_dispatch = 1; break;
    case CLI_GRAD_DTYPE:
        v = px_dtype_from_name(arg);
        if (v != PX_FP32 && v != PX_BF16 && v != PX_FP16)
            rc = px_fail(err, PX_EINPUT, "--grad-dtype: expected fp32, bf16 or fp16, got '%s'", arg);
        else
            j->grad_dtype = (PxDtype)v;
        break;
    case CLI_OPTIMIZER:
        if ((v = model_optimizer_from_name(arg)) < 0)
            rc = px_fail(err, PX_EINPUT, "--optimizer: expected adamw, sgd-momentum or adam-8bit, got '%s'", arg);
        else
            j->optimizer = (ModelOptimizer)v;
        break;
    case CLI_FLASH: j->flash_attn = 1; break;
    case CLI_NO_FLASH: j->flash_attn = 0; break;
    case CLI_DROPOUT:
        rc = px_parse_double(arg, "--dropout", &j->dropout, err);
        if (!rc && !(j->dropout >= 0 && j->dropout < 1))
            rc = px_fail(err, PX_EINPUT, "--dropout: must be in [0, 1), got %s", arg);
        break;
    case CLI_OVERLAP_DP: l->overlap_dp = 1; break;
    case CLI_NO_OVERLAP_DP: l->overlap_dp = 0; break;
    case CLI_OVERLAP_TP: l->overlap_tp = 1; break;
    case CLI_NO_OVERLAP_TP: l->overlap_tp = 0; break;
    case CLI_ASYNC_TP: l->tp_bwd_exposed = 0; break;
    case CLI_NO_ASYNC_TP: l->tp_bwd_exposed = 1; break;
    case CLI_EP: rc = degree_list(arg, "--ep", a->allow_lists, &l->ep, a->ep_list, &a->n_ep, err); break;
    case CLI_ETP: rc = degree_list(arg, "--etp", a->allow_lists, &l->etp, a->etp_list, &a->n_etp, err); break;
    case CLI_OVERLAP_EP: l->overlap_ep = 1; break;
    case CLI_NO_OVERLAP_EP: l->overlap_ep = 0; break;
    case CLI_MOE_IMBALANCE:
        rc = px_parse_double(arg, "--moe-imbalance", &j->moe_imbalance, err);
        if (!rc && !(j->moe_imbalance >= 1.0 && j->moe_imbalance <= 1e6))
            rc = px_fail(err, PX_EINPUT, "--moe-imbalance: must be at least 1 (1: balanced), got %s", arg);
        break;
    case CLI_MOE_FORCE_BALANCE: j->moe_force_balance = 1; break;
    case CLI_PAD_VOCAB: rc = px_parse_int(arg, "--pad-vocab", 1, 1 << 16, &j->pad_vocab, err); break;
    case CLI_CAUSAL: j->causal_flops = 1; break;
    case CLI_LR: rc = px_parse_double(arg, "--lr", &j->lr, err); break;
    case CLI_MIN_LR: rc = px_parse_double(arg, "--min-lr", &j->min_lr, err); break;
    case CLI_WARMUP: rc = px_parse_int(arg, "--warmup-steps", 0, 1 << 30, &j->warmup_steps, err); break;
    case CLI_STEPS: rc = px_parse_int(arg, "--steps", 1, 1 << 30, &j->steps, err); break;
    case CLI_SEED:
        rc = px_parse_int(arg, "--seed", 0, 2147483647, &v, err);
        j->seed = (uint64_t)v;
        break;
    case CLI_WD: rc = px_parse_double(arg, "--weight-decay", &j->weight_decay, err); break;
    case CLI_CLIP: rc = px_parse_double(arg, "--grad-clip", &j->grad_clip, err); break;
    case CLI_DATA:
        if (strlen(arg) >= sizeof j->data)
            rc = px_fail(err, PX_EINPUT, "--data: path longer than %zu characters", sizeof j->data - 1);
        else
            px_strlcpy(j->data, arg, sizeof j->data);
        break;
    case CLI_FUSED: j->fused_kernels = 1; break;
    case CLI_NO_FUSED: j->fused_kernels = 0; break;
    case CLI_TOKENS:
        rc = px_parse_double(arg, "--tokens", &j->train_tokens, err);
        if (!rc && !(j->train_tokens > 0))
            rc = px_fail(err, PX_EINPUT, "--tokens: must be positive, got %s", arg);
        break;
    case CLI_SET:
        if (a->n_sets == CLI_MAX_SETS)
            rc = px_fail(err, PX_EINPUT, "--set: at most %d overrides", CLI_MAX_SETS);
        else if (!strchr(arg, '='))
            rc = px_fail(err, PX_EINPUT, "--set '%s': expected key=value", arg);
        else
            a->sets[a->n_sets++] = arg;
        break;
    default: break;
    }
    if (rc)
        return rc;
    if (id < CLI_KNOB_COUNT)
        a->given[id] = 1;
    return PX_OK;
}

int cli_parse(const char *cmd, const char *usage, int argc, char **argv,
              const CliOption *const *tables, int max_positional, CliArgs *a)
{
    char prog[96];
    snprintf(prog, sizeof prog, "parallax %s", cmd);
    return cli_parse_as(prog, usage, argc, argv, tables, max_positional, a);
}

/* Any option of a command into ctx (a CliArgs). */
static int cli_option(void *ctx, int id, const char *arg, PxError *err)
{
    CliArgs *a = ctx;
    switch (id) {
    case CLI_MODEL: a->model = arg; break;
    case CLI_CLUSTER: a->cluster = arg; break;
    case CLI_OUTPUT: a->output = arg; break;
    case CLI_JSON: a->json = 1; break;
    case CLI_GPUS: return px_parse_int(arg, "--gpus", 1, 1 << 24, &a->gpus, err);
    default:
        if (id >= CLI_EXTRA && id < CLI_EXTRA_MAX)
            a->extra[id - CLI_EXTRA] = arg ? arg : "1";
        else
            return knob(id, arg, a, err);
        break;
    }
    return PX_OK;
}

int cli_parse_as(const char *prog, const char *usage, int argc, char **argv,
                 const CliOption *const *tables, int max_positional, CliArgs *a)
{
    char see[96];
    snprintf(see, sizeof see, "(see '%s --help')", prog);
    const int max = max_positional < 8 ? max_positional : 8;
    PxError err = {0};
    int first;
    int rc = px_opts_parse(tables, argc, argv, see, cli_option, a, max, &first, &err);
    if (rc == PX_OPTS_HELP) {
        print_help_as(prog, usage, tables);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return rc;
    }
    if (a->spec.job.moe_force_balance && a->spec.job.moe_imbalance != 1.0) {
        fprintf(stderr, "%s: --moe-force-balance routes tokens round-robin: --moe-imbalance %g cannot go with it\n",
                prog, a->spec.job.moe_imbalance);
        return 2;
    }
    for (int i = first; i < argc; i++)
        a->positional[a->n_positional++] = argv[i];
    return -1;
}
