/* Layouts and training jobs: the divisibility rules, derived sizes, rank order (their fields
 * and defaults are fields.c's). */
#include "model/model.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static const char *const category_names[MODEL_CAT_COUNT] = {
    "weights", "grads", "master", "optimizer", "activations", "comm_buffers", "workspace", "runtime"};
static const char *const comm_names[MODEL_COMM_COUNT] = {
    "dp_allreduce", "dp_reduce_scatter", "dp_all_gather", "tp_allreduce",
    "tp_all_gather", "tp_reduce_scatter", "pp_send",      "pp_recv",
    "cp_all_gather", "cp_reduce_scatter", "embed_allreduce", "ep_all_to_all",
    "etp_all_gather", "etp_reduce_scatter", "edp_allreduce", "edp_reduce_scatter",
    "edp_all_gather", "dpr_allreduce", "cp_p2p", "cp_all_to_all", "ep_all_gather",
    "ep_reduce_scatter"};
static const char *const group_names[] = {"tp", "cp", "dp", "pp", "embed", "ep", "etp", "edp", "dpr", "etp_ep"};

static int name_index(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (s && strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

const char *model_category_name(ModelCategory c) { return category_names[c]; }

int model_category_on_host(const ModelLayout *l, ModelCategory c)
{
    /* ZeRO-Offload's split (Ren et al. 2021): fp32 master weights and optimizer state
     * on the host; the device keeps the low-precision parameters and gradients (docs/memory.md) */
    return l->offload_optimizer && (c == MODEL_MASTER || c == MODEL_OPTIMIZER);
}
const char *model_comm_name(ModelComm k) { return comm_names[k]; }
int model_comm_from_name(const char *s) { return name_index(s, comm_names, MODEL_COMM_COUNT); }
const char *model_group_name(ModelGroup g) { return group_names[g]; }

ModelCollective model_comm_collective(ModelComm k)
{
    switch (k) {
    case MODEL_DP_REDUCE_SCATTER:
    case MODEL_TP_REDUCE_SCATTER:
    case MODEL_CP_REDUCE_SCATTER:
    case MODEL_ETP_REDUCE_SCATTER:
    case MODEL_EDP_REDUCE_SCATTER:
    case MODEL_EP_REDUCE_SCATTER:
        return MODEL_COLL_REDUCE_SCATTER;
    case MODEL_DP_ALL_GATHER:
    case MODEL_TP_ALL_GATHER:
    case MODEL_CP_ALL_GATHER:
    case MODEL_ETP_ALL_GATHER:
    case MODEL_EDP_ALL_GATHER:
    case MODEL_EP_ALL_GATHER:
        return MODEL_COLL_ALL_GATHER;
    case MODEL_EP_ALL_TO_ALL:
    case MODEL_CP_ALL_TO_ALL:
        return MODEL_COLL_ALL_TO_ALL;
    case MODEL_PP_SEND:
    case MODEL_CP_P2P:
        return MODEL_COLL_SEND;
    case MODEL_PP_RECV:
        return MODEL_COLL_RECV;
    default:
        return MODEL_COLL_ALLREDUCE;
    }
}

ModelGroup model_comm_group(ModelComm k)
{
    switch (k) {
    case MODEL_DP_ALLREDUCE:
    case MODEL_DP_REDUCE_SCATTER:
    case MODEL_DP_ALL_GATHER:
        return MODEL_GROUP_DP;
    case MODEL_TP_ALLREDUCE:
    case MODEL_TP_ALL_GATHER:
    case MODEL_TP_REDUCE_SCATTER:
        return MODEL_GROUP_TP;
    case MODEL_CP_ALL_GATHER:
    case MODEL_CP_REDUCE_SCATTER:
    case MODEL_CP_P2P:
    case MODEL_CP_ALL_TO_ALL:
        return MODEL_GROUP_CP;
    case MODEL_EMBED_ALLREDUCE:
        return MODEL_GROUP_EMBED;
    case MODEL_EP_ALL_TO_ALL:
        return MODEL_GROUP_EP;
    case MODEL_ETP_ALL_GATHER:
    case MODEL_ETP_REDUCE_SCATTER:
        return MODEL_GROUP_ETP;
    case MODEL_EDP_ALLREDUCE:
    case MODEL_EDP_REDUCE_SCATTER:
    case MODEL_EDP_ALL_GATHER:
        return MODEL_GROUP_EDP;
    case MODEL_DPR_ALLREDUCE:
        return MODEL_GROUP_DPR;
    case MODEL_EP_ALL_GATHER:
    case MODEL_EP_REDUCE_SCATTER:
        return MODEL_GROUP_ETP_EP;
    default:
        return MODEL_GROUP_PP;
    }
}

const char *model_rule_name(ModelRule r)
{
    static const char *const names[MODEL_RULE_COUNT] = {
        "other",
        "degrees out of range",
        "tp x pp x cp x dp does not match the GPUs",
        "sequence longer than the learned positions",
        "tp (a2a: tp x cp) does not divide heads, kv heads or ffn",
        "sequence parallelism without tp",
        "virtual stages need pp > 1 and the interleaved schedule",
        "pp x vpp does not divide the layers",
        "ZeRO-2/3 with pipeline parallelism",
        "global batch not divisible by mbs x dp",
        "interleaving needs a multiple of pp micro-batches",
        "cp or sp does not divide the sequence",
        "training job settings",
        "bad split of the layers over the stages",
        "ep x etp does not divide the experts or the stage's ranks",
        "p2p context parallelism without the fused attention core"};
    return (unsigned)r < MODEL_RULE_COUNT ? names[r] : "other";
}

static int rule_fail(PxError *err, ModelRule code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int rule_fail(PxError *err, ModelRule code, const char *fmt, ...)
{
    if (err) {
        if (!err->code_only) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err->msg, sizeof err->msg, fmt, ap);
            va_end(ap);
        }
        err->code = code;
    }
    return PX_EINPUT;
}

int model_rank(const ModelLayout *l, int tp, int cp, int dp, int pp)
{
    return tp + l->tp * (cp + l->cp * (dp + l->dp * pp));
}

void model_rank_coords(const ModelLayout *l, int rank, int *tp, int *cp, int *dp, int *pp)
{
    *tp = rank % l->tp;
    rank /= l->tp;
    *cp = rank % l->cp;
    rank /= l->cp;
    *dp = rank % l->dp;
    *pp = rank / l->dp;
}

void model_expert_coords(const ModelLayout *l, int rank, int *etp, int *ep, int *edp, int *pp)
{
    const int stage_ranks = l->tp * l->cp * l->dp;
    const int e = l->etp > 0 ? l->etp : l->tp, p = l->ep > 0 ? l->ep : 1;
    int r = rank % stage_ranks;
    *pp = rank / stage_ranks;
    *etp = r % e;
    r /= e;
    *ep = r % p;
    *edp = r / p;
}

static int is_float_type(PxDtype t) { return t == PX_FP32 || t == PX_BF16 || t == PX_FP16; }

/* HSDP's split of dp (either part filled from the other, both from dp), then the sharded data
 * parallelism and offload knobs against the ZeRO stage. */
static int check_sharding(ModelLayout *l, PxError *err)
{
    if (l->dp_shard < 0 || l->dp_replicate < 0)
        return rule_fail(err, MODEL_RULE_DEGREES, "dp_shard and dp_replicate must be at least 1 (got %d, %d)",
                         l->dp_shard, l->dp_replicate);
    if (l->dp_shard == 0 && l->dp_replicate == 0) {
        l->dp_shard = l->dp;
        l->dp_replicate = 1;
    } else if (l->dp_shard == 0 || l->dp_replicate == 0) {
        const int given = l->dp_shard ? l->dp_shard : l->dp_replicate;
        if (l->dp % given != 0)
            return rule_fail(err, MODEL_RULE_DEGREES, "%s %d must divide dp %d",
                             l->dp_shard ? "dp_shard" : "dp_replicate", given, l->dp);
        if (l->dp_shard)
            l->dp_replicate = l->dp / l->dp_shard;
        else
            l->dp_shard = l->dp / l->dp_replicate;
    } else if (l->dp_shard * l->dp_replicate != l->dp) {
        return rule_fail(err, MODEL_RULE_DEGREES, "dp_shard %d x dp_replicate %d = %d does not equal dp %d",
                         l->dp_shard, l->dp_replicate, l->dp_shard * l->dp_replicate, l->dp);
    }
    if (l->dp_replicate > 1 && l->zero < 1)
        return rule_fail(err, MODEL_RULE_DEGREES,
                         "dp_replicate %d needs a ZeRO stage (zero 1-3, or fsdp): with zero 0 every "
                         "data-parallel rank is a replica already, so use dp",
                         l->dp_replicate);
    if (l->fsdp && l->zero != 3)
        return rule_fail(err, MODEL_RULE_DEGREES, "fsdp shards the parameters: it needs zero 3, got zero %d", l->zero);
    if (l->keep_gathered && l->zero != 3)
        return rule_fail(err, MODEL_RULE_DEGREES,
                         "keeping gathered parameters from forward to backward (no reshard after "
                         "forward) needs zero 3, got zero %d", l->zero);
    if (l->prefetch < -1 || l->prefetch > 16)
        return rule_fail(err, MODEL_RULE_DEGREES, "prefetch must be -1 (none), 0 (default) or 1 to 16 layers, got %d",
                         l->prefetch);
    if (!(l->bucket_bytes >= 0 && l->bucket_bytes <= 1e15))
        return rule_fail(err, MODEL_RULE_DEGREES, "bucket_bytes must be 0 (one call per block) or positive, got %g",
                         l->bucket_bytes);
    if (l->offload_optimizer && l->zero < 1)
        return rule_fail(err, MODEL_RULE_DEGREES,
                         "optimizer offload moves each rank's optimizer shard to the host: it needs zero 1-3 "
                         "(as DeepSpeed's offload_optimizer), got zero 0");
    return PX_OK;
}

/* The degrees: each at least 1, a ZeRO stage, and dp (filled from the GPUs when 0) such that
 * tp x pp x cp x dp uses every GPU; then HSDP and the sharding knobs (check_sharding). */
static int check_degrees(ModelLayout *l, int gpus, PxError *err)
{
    if (l->tp < 1 || l->pp < 1 || l->cp < 1 || l->vpp < 1 || l->dp < 0)
        return rule_fail(err, MODEL_RULE_DEGREES, "tp, pp, cp and vpp must be at least 1 (got tp %d pp %d cp %d vpp %d)",
                       l->tp, l->pp, l->cp, l->vpp);
    if (l->zero < 0 || l->zero > 3)
        return rule_fail(err, MODEL_RULE_DEGREES, "zero stage must be 0, 1, 2 or 3, got %d", l->zero);
    int mp = l->tp * l->pp * l->cp;
    if (l->dp == 0) {
        if (gpus <= 0)
            l->dp = 1;
        else if (gpus % mp != 0)
            return rule_fail(err, MODEL_RULE_GPUS,
                           "tp %d x pp %d x cp %d = %d does not divide the %d GPUs", l->tp, l->pp,
                           l->cp, mp, gpus);
        else
            l->dp = gpus / mp;
    }
    if (gpus > 0 && mp * l->dp != gpus)
        return rule_fail(err, MODEL_RULE_GPUS, "tp %d x pp %d x cp %d x dp %d = %d does not equal the %d GPUs",
                       l->tp, l->pp, l->cp, l->dp, mp * l->dp, gpus);
    return check_sharding(l, err);
}

/* Tensor parallelism against the model: the sequence within its positions, tp dividing the
 * heads and the FFN, sequence parallelism only with tp. s is the job's sequence length. */
static int check_tensor_split(const ModelConfig *c, const ModelLayout *l, int s, PxError *err)
{
    if (c->position == MODEL_POS_LEARNED && s > c->seq_len)
        return rule_fail(err, MODEL_RULE_POSITIONS,
                       "sequence length %d exceeds the %d learned positions of model %s", s,
                       c->seq_len, c->name);
    if (c->heads % l->tp != 0)
        return rule_fail(err, MODEL_RULE_HEADS, "tp %d must divide the %d attention heads", l->tp, c->heads);
    if (c->kv_heads % l->tp != 0)
        return rule_fail(err, MODEL_RULE_HEADS, "tp %d must divide the %d key/value heads", l->tp,
                       c->kv_heads);
    if (c->ffn_hidden % l->tp != 0)
        return rule_fail(err, MODEL_RULE_HEADS, "tp %d must divide ffn_hidden %d", l->tp, c->ffn_hidden);
    /* the prediction modules' eh projection (2h -> h) is column-parallel, as Megatron-Core's:
     * its h output columns split over tp */
    if (c->mtp_layers > 0 && c->hidden % l->tp != 0)
        return rule_fail(err, MODEL_RULE_HEADS,
                       "tp %d must divide the hidden size %d: the multi-token prediction modules' "
                       "eh projection splits its output columns over tp",
                       l->tp, c->hidden);
    if (l->sp && l->tp < 2)
        return rule_fail(err, MODEL_RULE_SP_TP, "sequence parallelism needs tp > 1");
    /* Ulysses turns the sequence split into a head split: each cp rank takes whole heads of
     * its tp rank's share, query and key/value alike */
    if (l->cp > 1 && l->cp_comm == MODEL_CP_COMM_A2A) {
        if ((c->heads / l->tp) % l->cp != 0)
            return rule_fail(err, MODEL_RULE_HEADS,
                           "cp comm type a2a needs cp %d to divide the %d attention heads per tp rank "
                           "(%d heads / tp %d)", l->cp, c->heads / l->tp, c->heads, l->tp);
        if ((c->kv_heads / l->tp) % l->cp != 0)
            return rule_fail(err, MODEL_RULE_HEADS,
                           "cp comm type a2a needs cp %d to divide the %d key/value heads per tp rank "
                           "(%d key/value heads / tp %d)", l->cp, c->kv_heads / l->tp, c->kv_heads, l->tp);
    }
    return PX_OK;
}

/* The pipeline: virtual stages and their schedule (vpp > 1 makes 1F1B interleaved), the split
 * of the layers (an even explicit split becomes the implicit one), ZeRO-2/3 without pp. */
static int check_pipeline(const ModelConfig *c, ModelLayout *l, PxError *err)
{
    {
        /* Megatron-Core's forms first: a layout string may set vpp */
        PxError e2 = {0};
        if (model_split_resolve(c, l, &e2))
            return rule_fail(err, MODEL_RULE_SPLIT, "%s", e2.msg);
    }
    if (l->mtp_from_last < 0 || l->mtp_from_last >= l->pp * l->vpp ||
        (l->mtp_from_last > 0 && c->mtp_layers == 0))
        return rule_fail(err, MODEL_RULE_SPLIT,
                         "the prediction modules' stage, %d before the last, needs a model with them and "
                         "one of the pp %d x vpp %d stages",
                         l->mtp_from_last, l->pp, l->vpp);
    if (l->vpp > 1) {
        if (l->pp < 2)
            return rule_fail(err, MODEL_RULE_VPP, "virtual pipeline stages (vpp %d) need pp > 1", l->vpp);
        if (l->schedule == MODEL_SCHED_GPIPE)
            return rule_fail(err, MODEL_RULE_VPP,
                           "the gpipe schedule cannot interleave (vpp %d): use the interleaved schedule",
                           l->vpp);
        l->schedule = MODEL_SCHED_INTERLEAVED; /* 1F1B over several chunks is the interleaved schedule */
    } else if (l->schedule == MODEL_SCHED_INTERLEAVED) {
        return rule_fail(err, MODEL_RULE_VPP, "the interleaved schedule needs vpp >= 2");
    }
    if (l->n_stage_layers > 0) {
        PxError e2 = {0};
        if (model_split_check(l, c->layers, &e2))
            return rule_fail(err, MODEL_RULE_SPLIT, "%s", e2.msg);
        int equal = 1;
        for (int i = 1; i < l->n_stage_layers; i++)
            equal &= l->stage_layers[i] == l->stage_layers[0];
        if (equal)
            l->n_stage_layers = 0; /* the even split, checked below as one */
    }
    if (l->n_stage_layers == 0 && c->layers % (l->pp * l->vpp) != 0) {
        const int chunks = l->pp * l->vpp;
        /* Megatron-Core's count of the embedding and the loss as layers, where it divides */
        char counted[200] = "";
        if ((c->layers + 2) % chunks == 0 || (c->layers + 1) % chunks == 0) {
            const int both = (c->layers + 2) % chunks == 0;
            snprintf(counted, sizeof counted,
                     ", or count %s as a layer (%s: %d + %d = %d)",
                     both ? "the embedding and the loss each" : "the embedding",
                     both ? "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
                          : "--account-for-embedding-in-pipeline-split",
                     c->layers, both ? 2 : 1, c->layers + (both ? 2 : 1));
        }
        if (l->vpp > 1 || l->pp > c->layers || l->pp > MODEL_MAX_STAGES)
            return rule_fail(err, MODEL_RULE_LAYERS,
                             "pp %d x vpp %d = %d must divide the %d layers%s, or give each stage its "
                             "layers (--pp-layers, --pipeline-model-parallel-layout)",
                             l->pp, l->vpp, chunks, c->layers, counted);
        int split[MODEL_MAX_STAGES];
        char text[64];
        model_split_balanced(c->layers, l->pp, 0, split);
        model_split_format(split, l->pp, text, sizeof text);
        return rule_fail(err, MODEL_RULE_LAYERS,
                         "pp %d x vpp %d = %d must divide the %d layers, or give each stage its "
                         "layers (--pp-layers, layout.stage_layers; e.g. %s)%s",
                         l->pp, l->vpp, chunks, c->layers, text, counted);
    }
    /* ZeRO-2/3 with pp > 1 is priced as torchtitan runs FSDP2 under a pipeline (gradients
     * reduce-scattered once per step, ZeRO-3's parameters gathered once per step): no rule */
    return PX_OK;
}

/* The batch (the global batch filled from mbs x dp when 0, then split into *m micro-batches
 * that the interleaved schedule needs in multiples of pp) and the sequence s over cp and sp. */
static int check_batch(ModelJob *j, const ModelLayout *l, int s, int *m, PxError *err)
{
    if (j->micro_batch < 1)
        return rule_fail(err, MODEL_RULE_BATCH, "micro-batch size must be at least 1, got %d",
                       j->micro_batch);
    if (j->global_batch < 0)
        return rule_fail(err, MODEL_RULE_BATCH, "global batch must be positive, got %d", j->global_batch);
    if (j->global_batch == 0)
        j->global_batch = j->micro_batch * l->dp;
    if (j->global_batch % (j->micro_batch * l->dp) != 0)
        return rule_fail(err, MODEL_RULE_BATCH,
                       "global batch %d must be divisible by micro-batch %d x dp %d = %d",
                       j->global_batch, j->micro_batch, l->dp, j->micro_batch * l->dp);
    *m = j->global_batch / (j->micro_batch * l->dp);
    if (l->schedule == MODEL_SCHED_INTERLEAVED && *m % l->pp != 0)
        return rule_fail(err, MODEL_RULE_INTERLEAVED_M,
                       "the interleaved schedule needs the %d micro-batches to be a multiple of pp %d",
                       *m, l->pp);
    if (s % l->cp != 0)
        return rule_fail(err, MODEL_RULE_SEQUENCE, "cp %d must divide the sequence length %d", l->cp, s);
    /* Megatron-LM's load balancing of the causal mask: the sequence in 2 x cp chunks, cp rank
     * i holding chunks i and 2 cp - 1 - i; every comm type's core runs on them and the ring's
     * buffers hold one (docs/executor.md, "Context parallelism") */
    if (l->cp > 1 && s % (2 * l->cp) != 0)
        return rule_fail(err, MODEL_RULE_SEQUENCE,
                         "cp %d needs the sequence length %d to split into 2 x cp = %d chunks (each "
                         "cp rank holds two: Megatron-LM's load balancing of the causal mask)",
                         l->cp, s, 2 * l->cp);
    if (l->sp && (s / l->cp) % l->tp != 0)
        return rule_fail(err, MODEL_RULE_SEQUENCE,
                       "sequence parallelism needs the %d tokens per cp rank to be divisible by tp %d",
                       s / l->cp, l->tp);
    return PX_OK;
}

/* Expert parallelism (ep 0 becomes 1, etp 0 becomes tp, Megatron's default): only with a MoE
 * model; ep dividing the experts, etp their width, ep x etp the stage's tp x cp x dp ranks;
 * tp > 1 with sequence parallelism, as Megatron-Core requires of MoE layers. */
static int check_experts(const ModelConfig *c, ModelLayout *l, const ModelJob *j, PxError *err)
{
    const ModelMoe *m = &c->moe;
    if (l->ep < 0 || l->etp < 0)
        return rule_fail(err, MODEL_RULE_DEGREES, "ep and etp must be at least 1 (got ep %d etp %d)",
                         l->ep, l->etp);
    if (l->ep == 0)
        l->ep = 1;
    if (m->experts <= 0) {
        if (l->ep > 1 || (l->etp > 0 && l->etp != l->tp))
            return rule_fail(err, MODEL_RULE_EXPERTS,
                             "ep %d / etp %d: model %s has no experts (expert parallelism needs a "
                             "mixture-of-experts model)",
                             l->ep, l->etp, c->name);
        if (j->fp8_dispatch)
            return rule_fail(err, MODEL_RULE_EXPERTS,
                             "FP8 dispatch: model %s has no experts to dispatch to", c->name);
        if (j->moe_dispatcher != MODEL_MOE_DISPATCH_ALLTOALL)
            return rule_fail(err, MODEL_RULE_EXPERTS,
                             "moe_dispatcher %s: model %s has no experts to dispatch to",
                             model_moe_dispatcher_name(j->moe_dispatcher), c->name);
        l->etp = l->tp;
        return PX_OK;
    }
    if (l->etp == 0)
        l->etp = l->tp;
    if (j->fp8_dispatch && j->moe_dispatcher == MODEL_MOE_DISPATCH_ALLGATHER)
        return rule_fail(err, MODEL_RULE_JOB,
                         "FP8 dispatch needs an all-to-all dispatcher (alltoall or flex), not "
                         "moe_dispatcher %s", model_moe_dispatcher_name(j->moe_dispatcher));
    /* Megatron-Core: "Flex token dispatcher with deepep backend does not support
     * moe_pad_expert_input_to_capacity" (transformer_config.py), and parallax's capacity
     * factor pads */
    if (j->moe_dispatcher == MODEL_MOE_DISPATCH_FLEX && m->capacity_factor > 0)
        return rule_fail(err, MODEL_RULE_EXPERTS,
                         "moe_dispatcher flex (DeepEP) does not pad the experts' inputs to a capacity: "
                         "capacity factor %g needs the alltoall or allgather dispatcher",
                         m->capacity_factor);
    if (m->experts % l->ep != 0)
        return rule_fail(err, MODEL_RULE_EXPERTS, "ep %d must divide the %d experts", l->ep,
                         m->experts);
    if (m->expert_ffn % l->etp != 0)
        return rule_fail(err, MODEL_RULE_EXPERTS, "etp %d must divide the experts' ffn %d", l->etp,
                         m->expert_ffn);
    if (m->shared_ffn % l->tp != 0)
        return rule_fail(err, MODEL_RULE_HEADS, "tp %d must divide the shared experts' ffn %d",
                         l->tp, m->shared_ffn);
    const int ranks = l->tp * l->cp * l->dp;
    if (ranks % (l->ep * l->etp) != 0)
        return rule_fail(err, MODEL_RULE_EXPERTS,
                         "ep %d x etp %d = %d must divide the %d ranks of a pipeline stage (tp %d x "
                         "cp %d x dp %d)",
                         l->ep, l->etp, l->ep * l->etp, ranks, l->tp, l->cp, l->dp);
    if (l->tp > 1 && !l->sp)
        return rule_fail(err, MODEL_RULE_SP_TP,
                         "a mixture-of-experts model with tp %d needs sequence parallelism (--sp), "
                         "as Megatron-Core requires",
                         l->tp);
    if (!(j->moe_imbalance >= 1.0 && j->moe_imbalance <= l->ep))
        return rule_fail(err, MODEL_RULE_JOB,
                         "moe imbalance %g must be between 1 (balanced) and ep %d (every token on "
                         "one rank)",
                         j->moe_imbalance, l->ep);
    return PX_OK;
}

/* FP8 training's settings against the job and the layout. */
static int check_fp8(ModelJob *j, PxError *err)
{
    if ((int)j->fp8 < MODEL_FP8_NONE || (int)j->fp8 > MODEL_FP8_MXFP8)
        return rule_fail(err, MODEL_RULE_JOB, "unknown FP8 recipe %d", (int)j->fp8);
    if (j->fp8 == MODEL_FP8_NONE) {
        if (j->fp8_param_gather)
            return rule_fail(err, MODEL_RULE_JOB,
                             "FP8 parameter gathering needs an FP8 recipe (--precision fp8 or "
                             "--fp8-recipe)");
        if (j->fp8_attention)
            return rule_fail(err, MODEL_RULE_JOB,
                             "FP8 attention needs an FP8 recipe (--precision fp8 or --fp8-recipe)");
        if (j->fp8_dispatch)
            return rule_fail(err, MODEL_RULE_JOB,
                             "FP8 dispatch needs an FP8 recipe (--precision fp8 or --fp8-recipe)");
        return PX_OK;
    }
    if (j->fp8_amax_history < 1 || j->fp8_amax_history > (1 << 16))
        return rule_fail(err, MODEL_RULE_JOB, "FP8 amax history length must be 1 to 65536, got %d",
                         j->fp8_amax_history);
    if (j->fp8_transpose < -1 || j->fp8_transpose > 1)
        return rule_fail(err, MODEL_RULE_JOB, "fp8_transpose must be -1 (auto), 0 or 1, got %d",
                         j->fp8_transpose);
    /* Transformer Engine has no attention backend for Float8BlockScaling: its backend filter
     * (attention/dot_product_attention/utils.py, "Filter: Execution type") turns the fused
     * backend off for block scaling, FlashAttention 3 takes FP8 only with delayed or current
     * scaling, FlashAttention 2 and 4 none, the unfused path only as emulation; and
     * NVTE_DPA_FP8_RECIPE (dot_product_attention.py, init_fp8_metadata) maps delayed, current,
     * MXFP8 and NVFP4 linear recipes to an attention recipe, never a blockwise one; its
     * DotProductAttention docstring names the recipe families it supports: delayed, current
     * scaling and MXFP8 */
    if (j->fp8_attention && j->fp8 == MODEL_FP8_BLOCKWISE)
        return rule_fail(err, MODEL_RULE_JOB,
                         "FP8 attention has no blockwise recipe: Transformer Engine runs no "
                         "attention backend with Float8BlockScaling (choose --fp8-recipe "
                         "tensorwise, delayed or mxfp8 for FP8 attention, or drop --fp8-attention)");
    return PX_OK;
}

/* The training job's numbers: precisions (bf16 when none was resolved), dropout, padding, FP8. */
static int check_job(ModelJob *j, PxError *err)
{
    if (j->precision == PX_DTYPE_COUNT)
        j->precision = PX_BF16;
    if (!is_float_type(j->precision))
        return rule_fail(err, MODEL_RULE_JOB, "precision must be fp32, bf16 or fp16, got %s",
                       px_dtype_name(j->precision));
    if (!is_float_type(j->grad_dtype))
        return rule_fail(err, MODEL_RULE_JOB, "grad dtype must be fp32, bf16 or fp16, got %s",
                       px_dtype_name(j->grad_dtype));
    if (j->precision == PX_FP32 && j->grad_dtype != PX_FP32)
        return rule_fail(err, MODEL_RULE_JOB, "fp32 training keeps fp32 gradients (grad dtype %s)",
                       px_dtype_name(j->grad_dtype));
    /* a 16-bit gradient is the weights' own type (Megatron-LM's main_grad is fp32 or the
     * parameters' dtype; FSDP2's reduce dtype is fp32 or its param dtype in practice): bf16
     * weights with fp16 gradients, or the reverse, is no job anyone runs */
    if (j->grad_dtype != PX_FP32 && j->grad_dtype != j->precision)
        return rule_fail(err, MODEL_RULE_JOB,
                       "16-bit gradients are kept in the weights' type: grad dtype %s with "
                       "precision %s (use --grad-dtype %s or fp32)",
                       px_dtype_name(j->grad_dtype), px_dtype_name(j->precision),
                       px_dtype_name(j->precision));
    if (!(j->dropout >= 0.0 && j->dropout < 1.0))
        return rule_fail(err, MODEL_RULE_JOB, "dropout must be in [0, 1), got %g", j->dropout);
    if (j->pad_vocab < 1)
        return rule_fail(err, MODEL_RULE_JOB, "vocabulary padding multiple must be at least 1, got %d",
                       j->pad_vocab);
    return check_fp8(j, err);
}

/* --fp8-param-gather with MXFP8 below ZeRO-3 gathers the updated weights in the weights'
 * dtype into the gradient buffer, free after the update, and each rank quantizes them itself
 * (Megatron-LM's distributed optimizer: param_and_grad_buffer.py's shared_buffer, param_data a
 * view of grad_data, whenever a parameter is an MXFP8Tensor). ZeRO-2 holds no whole gradients
 * to land them in, and Megatron-LM has no ZeRO-2 beside its distributed optimizer (ZeRO-1's
 * sharding): no job to price. */
static int check_fp8_gather(const ModelLayout *l, const ModelJob *j, PxError *err)
{
    if (j->fp8 == MODEL_FP8_MXFP8 && j->fp8_param_gather && l->zero == 2)
        return rule_fail(err, MODEL_RULE_JOB,
                         "fp8_param_gather with MXFP8 gathers the updated weights in their own "
                         "dtype into the whole gradient buffer (Megatron-LM's distributed "
                         "optimizer), which zero 2 shards: use --zero 1, 0 or 3");
    return PX_OK;
}

/* The ring (cp_comm p2p) runs the fused attention core only, as Megatron-LM's does: its context
 * parallelism is Transformer Engine's, whose ring runs FlashAttention or cuDNN's fused attention
 * and whose unfused attention refuses context parallelism. Unfused, each ring step would save
 * its s/cp x s/cp probabilities per head, s/cp x s in all: the all-gather's softmax, with the
 * ring's messages on top, for a layout whose point is to hold no whole-sequence tensor
 * (docs/executor.md, "Context parallelism"). Not a layout to price: refused here. */
static int check_cp_core(const ModelLayout *l, const ModelJob *j, PxError *err)
{
    if (l->cp > 1 && l->cp_comm == MODEL_CP_COMM_P2P && !j->flash_attn)
        return rule_fail(err, MODEL_RULE_CP_CORE,
                         "cp %d with cp comm type p2p runs the fused attention core (Transformer "
                         "Engine's ring attention, as Megatron-LM runs it): keep --flash-attn, or "
                         "choose --cp-comm-type allgather or a2a for the unfused core",
                         l->cp);
    /* FP8 attention under any kind: Transformer Engine's context parallelism never runs the
     * unfused core, and FP8 attention has the fused core only (its unfused path only emulates
     * FP8: attention/dot_product_attention/utils.py, get_attention_backend) */
    if (l->cp > 1 && j->fp8_attention && !j->flash_attn)
        return rule_fail(err, MODEL_RULE_CP_CORE,
                         "cp %d with --fp8-attention runs the fused attention core (Transformer "
                         "Engine's context parallelism takes FP8 attention with FusedAttention "
                         "only): keep --flash-attn, or drop --fp8-attention",
                         l->cp);
    return PX_OK;
}

/* MXFP8 attention's shapes: Transformer Engine quantizes Q, K and V for it in 32-element blocks
 * along head_dim and along the sequence, and asserts (attention/dot_product_attention/utils.py,
 * combine_and_quantize) a sequence of a multiple of 128 and query/key and value head widths of
 * multiples of 32; its fused and its emulating unfused core both quantize there. */
static int check_mxfp8_attention(const ModelConfig *c, const ModelJob *j, int s, PxError *err)
{
    if (!j->fp8_attention || j->fp8 != MODEL_FP8_MXFP8)
        return PX_OK;
    const ModelMla *mla = &c->mla;
    const int qk = mla->kv_lora_rank > 0 ? mla->qk_nope_dim + mla->qk_rope_dim : c->head_dim;
    const int v = mla->kv_lora_rank > 0 ? mla->v_dim : c->head_dim;
    if (s % 128 == 0 && qk % 32 == 0 && v % 32 == 0)
        return PX_OK;
    return rule_fail(err, MODEL_RULE_JOB,
                     "FP8 attention under mxfp8 needs a sequence of a multiple of 128 and head "
                     "widths of multiples of 32 (Transformer Engine's MXFP8 attention blocks Q, K "
                     "and V by 32 along both), got sequence %d, query/key head width %d, value head "
                     "width %d (choose --fp8-recipe tensorwise or delayed, or drop --fp8-attention)",
                     s, qk, v);
}

/* The sizes every table and graph is built from, once the spec has passed every rule. */
static void fill_dims(ModelDims *d, const ModelSpec *sp, int s, int m)
{
    const ModelConfig *c = &sp->model;
    const ModelLayout *l = &sp->layout;
    const ModelJob *j = &sp->job;
    d->gpus = l->tp * l->pp * l->cp * l->dp;
    d->m = m;
    d->p = l->pp;
    d->v = l->vpp;
    d->t = l->tp;
    d->c = l->cp;
    d->dp = l->dp;
    d->chunks = l->pp * l->vpp;
    d->uneven = l->n_stage_layers > 0;
    d->chunk_layers = d->uneven ? 0 : c->layers / d->chunks;
    d->b = j->micro_batch;
    d->s = s;
    d->s_loc = s / l->cp;
    d->s_sp = l->sp ? d->s_loc / l->tp : d->s_loc;
    d->h = c->hidden;
    d->hd = c->head_dim;
    d->heads_loc = c->heads / l->tp;
    d->kv_loc = c->kv_heads / l->tp;
    d->q_loc = d->heads_loc * d->hd;
    d->kv_width_loc = d->kv_loc * d->hd;
    d->kv2_loc = 2 * d->kv_width_loc;
    d->ffn_loc = c->ffn_hidden / l->tp;
    d->ffn_out_loc = c->mlp == MODEL_SWIGLU ? 2 * d->ffn_loc : d->ffn_loc;
    d->vocab_pad = (int)px_round_up((uint64_t)c->vocab, (uint64_t)j->pad_vocab * (uint64_t)l->tp);
    d->vocab_loc = d->vocab_pad / l->tp;
    d->dp_shard = l->dp_shard > 0 ? l->dp_shard : l->dp;
    d->dp_rep = l->dp / d->dp_shard;
    d->zero_group = d->dp_shard * l->cp;
    d->zero_per_step = l->zero >= 2 && l->pp > 1;
    d->mtp_chunk = d->chunks - 1 - l->mtp_from_last;
    d->pp_split = (l->tp > 1 && !l->sp && c->hidden % l->tp == 0) ? l->tp : 1;
    d->param = j->precision;
    d->act = j->precision;
    d->grad = j->grad_dtype;
    /* below ZeRO-3 FP8 parameters replace the weights the optimizer would update: an fp32
     * master keeps them, in fp32 training too (ZeRO-3 updates its fp32 shard itself) */
    d->master = j->precision != PX_FP32 ||
                (j->fp8 != MODEL_FP8_NONE && j->fp8_param_gather && l->zero < 3);
    d->fp8 = (int)j->fp8;
    d->fp8_wt = j->fp8 != MODEL_FP8_NONE && (j->fp8_transpose == 1 || j->fp8 == MODEL_FP8_MXFP8);
    const ModelMla *mla = &c->mla;
    d->qk_hd = mla->kv_lora_rank > 0 ? mla->qk_nope_dim + mla->qk_rope_dim : c->head_dim;
    d->v_hd = mla->kv_lora_rank > 0 ? mla->v_dim : c->head_dim;
    d->o_loc = d->heads_loc * d->v_hd;
    if (mla->kv_lora_rank > 0) {
        d->q_loc = d->heads_loc * d->qk_hd;
        /* keys qk_hd and values v_hd wide: a token's key and value per TP rank are kv2_loc
         * wide, and kv_width_loc their mean (rounded down where the sum is odd) */
        d->kv2_loc = d->heads_loc * (d->qk_hd + d->v_hd);
        d->kv_width_loc = d->kv2_loc / 2;
    }
    const ModelMoe *moe = &c->moe;
    d->ep = l->ep > 0 ? l->ep : 1;
    d->etp = l->etp > 0 ? l->etp : l->tp;
    d->edp = l->tp * l->cp * l->dp / (d->ep * d->etp);
    d->imbalance = 1.0;
    if (moe->experts > 0) {
        d->moe = 1;
        /* forced balance routes every rank its share, whatever imbalance the job names */
        d->imbalance = j->moe_force_balance ? 1.0 : j->moe_imbalance;
        d->experts_loc = moe->experts / d->ep;
        d->eff_loc = moe->expert_ffn / d->etp;
        d->eff_out_loc = c->mlp == MODEL_SWIGLU ? 2 * d->eff_loc : d->eff_loc;
        d->sff_loc = moe->shared_ffn / l->tp;
        d->sff_out_loc = c->mlp == MODEL_SWIGLU ? 2 * d->sff_loc : d->sff_loc;
        d->tokens = (int64_t)d->b * d->s_sp;
        if (moe->capacity_factor > 0) {
            /* Megatron's capacity: each rank sends an expert at most ceil(cf x its tokens x topk
             * / experts) tokens, padded to it; an expert gets ep such shares, etp times over */
            double cap = moe->capacity_factor * (double)d->tokens * moe->topk / moe->experts;
            int64_t per = (int64_t)cap;
            per += (double)per < cap;
            d->routed = per * d->ep * d->experts_loc * d->etp;
        } else {
            double r = (double)d->tokens * moe->topk * d->etp * d->imbalance;
            d->routed = (int64_t)r;
            d->routed += (double)d->routed < r;
        }
    }
}

/* The framework's settings (profiles/frameworks/<name>.json) over the layout's knobs: one that
 * always overlaps data-parallel communication sets overlap_dp; *op: it recomputes `selective`
 * op by op; *eager: its norms run eagerly (an uncompiled job). Megatron's (the default) take the
 * layout as given, so it is not read. */
static int apply_framework(const ModelJob *j, ModelLayout *l, int *op, int *eager, int *fa2,
                           ProfFramework *fw_out, PxError *err)
{
    *op = 0;
    *eager = 0;
    *fa2 = 0;
    memset(fw_out, 0, sizeof *fw_out);
    if ((int)j->framework < 0 || j->framework >= MODEL_FW_COUNT)
        return rule_fail(err, MODEL_RULE_JOB, "unknown framework %d", (int)j->framework);
    if (j->framework == MODEL_FW_MEGATRON)
        return PX_OK;
    ProfFramework fw;
    int rc = prof_framework_load(model_framework_name(j->framework), &fw, err);
    if (rc)
        return rc;
    if (fw.overlap_dp >= 0)
        l->overlap_dp = fw.overlap_dp;
    *op = fw.recompute_op && l->recompute == MODEL_RECOMPUTE_SELECTIVE;
    *eager = fw.eager_norms && !j->fused_kernels;
    *fa2 = fw.flash_attention_2;
    *fw_out = fw;
    return PX_OK;
}

int model_spec_check(ModelSpec *sp, int gpus, ModelDims *d, PxError *err)
{
    ModelConfig *c = &sp->model;
    ModelLayout *l = &sp->layout;
    ModelJob *j = &sp->job;
    /* --moe-capacity-factor sets the model's field, the one every reader takes */
    if (j->moe_capacity_factor > 0)
        c->moe.capacity_factor = j->moe_capacity_factor;
    int rc = model_config_check(c, c->name, err);
    if (rc)
        return rc;
    memset(d, 0, sizeof *d);
    const int s = j->seq_len > 0 ? j->seq_len : c->seq_len;
    int m = 0, op = 0, eager = 0, fa2 = 0;
    ProfFramework fw;
    if ((rc = check_degrees(l, gpus, err)) || (rc = check_tensor_split(c, l, s, err)) ||
        (rc = check_pipeline(c, l, err)) || (rc = check_batch(j, l, s, &m, err)) ||
        (rc = check_job(j, err)) || (rc = check_fp8_gather(l, j, err)) ||
        (rc = check_mxfp8_attention(c, j, s, err)) ||
        (rc = check_cp_core(l, j, err)) ||
        (rc = check_experts(c, l, j, err)) ||
        (rc = apply_framework(j, l, &op, &eager, &fa2, &fw, err)))
        return rc;
    fill_dims(d, sp, s, m);
    d->recompute_op = op;
    d->eager_norms = eager;
    d->attn_fa2 = fa2;
    if (!j->fused_kernels && c->position == MODEL_POS_ROPE) {
        d->rope_eager_bytes = fw.eager_rope_bytes;
        d->rope_eager_kernels = fw.eager_rope_kernels;
    }
    if (j->optimizer == MODEL_OPT_ADAMW)
        d->adamw_step_bytes = fw.adamw_step_bytes;
    d->fw_zero_stages = fw.zero_stages;
    d->fw_zero_stages_pp = fw.zero_stages_pp ? fw.zero_stages_pp : fw.zero_stages;
    d->fw_zero_stages_cp = fw.zero_stages_cp ? fw.zero_stages_cp : fw.zero_stages;
    for (int k = 0; k < fw.n_cp_comm_types; k++) {
        const int kind = model_cp_comm_from_name(fw.cp_comm_types[k]);
        if (kind >= 0)
            d->fw_cp_comm |= 1u << kind;
    }
    for (int k = 0; k < fw.n_moe_dispatchers; k++) {
        const int kind = model_moe_dispatcher_from_name(fw.moe_dispatchers[k]);
        if (kind >= 0)
            d->fw_moe_dispatch |= 1u << kind;
    }
    d->fw_dp_only = fw.dp_only;
    return PX_OK;
}

/* "0, 3" for bits 0 and 3 */
static void stage_list(unsigned mask, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int z = 0; z < 4 && n < cap; z++)
        if (mask & (1u << z))
            n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? ", " : "", z);
}

int model_framework_refusal(const ModelSpec *s, const ModelDims *d, char *why, size_t cap)
{
    const ModelLayout *l = &s->layout;
    const char *fw = model_framework_name(s->job.framework);
    char runs[32];
    if (d->fw_dp_only && (l->tp > 1 || l->pp > 1 || l->cp > 1 || d->ep > 1)) {
        snprintf(why, cap, "%s runs data parallelism only, not tp %d pp %d cp %d ep %d "
                 "(profiles/frameworks/%s.json)", fw, l->tp, l->pp, l->cp, d->ep, fw);
        return 1;
    }
    /* the stages it runs here (a mask of 0: every one), with pp > 1, with cp > 1, both */
    const unsigned all = 0xfu;
    unsigned zero = d->fw_zero_stages ? d->fw_zero_stages : all;
    if (l->pp > 1 && d->fw_zero_stages_pp)
        zero &= d->fw_zero_stages_pp;
    if (l->cp > 1 && d->fw_zero_stages_cp)
        zero &= d->fw_zero_stages_cp;
    /* a stage matters only where something is sharded: a ZeRO group (dp x cp) of 2 or more */
    if (zero != all && (long)l->dp * l->cp > 1 && !(zero & (1u << l->zero))) {
        stage_list(zero, runs, sizeof runs);
        snprintf(why, cap, "%s does not run ZeRO-%d%s%s (it runs ZeRO %s: profiles/frameworks/%s.json)",
                 fw, l->zero, l->pp > 1 ? " with pp > 1" : "", l->cp > 1 ? " with cp > 1" : "", runs, fw);
        return 1;
    }
    const ModelMoeDispatcher md = s->job.moe_dispatcher;
    if (d->fw_moe_dispatch && s->model.moe.experts > 0 && !(d->fw_moe_dispatch & (1u << md))) {
        snprintf(why, cap, "%s does not run the %s MoE dispatcher (profiles/frameworks/%s.json)", fw,
                 model_moe_dispatcher_name(md), fw);
        return 1;
    }
    if (d->fw_cp_comm && l->cp > 1 && !(d->fw_cp_comm & (1u << l->cp_comm))) {
        snprintf(why, cap, "%s does not run context parallelism of cp comm type %s "
                 "(profiles/frameworks/%s.json)", fw, model_cp_comm_name(l->cp_comm), fw);
        return 1;
    }
    return 0;
}

/* ---- the split of the layers over the pipeline ---- */

int model_chunk_layers(const ModelSpec *s, const ModelDims *d, int gc, int *first)
{
    if (!d->uneven) {
        *first = gc * d->chunk_layers;
        return d->chunk_layers;
    }
    /* the virtual stages before gc hold the layers before its first */
    int f = 0;
    for (int i = 0; i < gc; i++)
        f += s->layout.stage_layers[i];
    *first = f;
    return s->layout.stage_layers[gc];
}

int model_stage_layers(const ModelSpec *s, const ModelDims *d, int stage, int *first)
{
    int n = 0;
    for (int j = 0; j < d->v; j++) {
        int f, k = model_chunk_layers(s, d, model_global_chunk(d, stage, j), &f);
        if (j == 0)
            *first = f;
        n += k;
    }
    return n;
}

/* The forward-order number (from 1) of layer l's first matmul at role r under op-level
 * recompute, 0 for none; *count its matmuls (model_sac_op_matmuls). */
static int sac_first(const ModelSpec *s, int l, ModelOpRole r, int *count)
{
    const ModelMla *m = &s->model.mla;
    const int mla = m->kv_lora_rank > 0, qa = mla && m->q_lora_rank > 0;
    const int gated = s->model.mlp == MODEL_SWIGLU, moe = l >= 0 && model_layer_is_moe(&s->model, l);
    const int proj = 4 + qa; /* wq, wk, wv; or [q_a,] kv_a, q_b, kv_b */
    *count = 1;
    switch (r) {
    case MODEL_OPR_QKV:
        *count = 3;
        return mla ? 0 : 1;
    case MODEL_OPR_Q_A:
        return qa;
    case MODEL_OPR_KV_A:
        return mla ? 1 + qa : 0;
    case MODEL_OPR_Q_B:
        return mla ? 2 + qa : 0;
    case MODEL_OPR_KV_B:
        return mla ? 3 + qa : 0;
    case MODEL_OPR_PROJ:
        return proj;
    case MODEL_OPR_FC1:
        *count = gated ? 2 : 1;
        return moe ? 0 : proj + 1;
    case MODEL_OPR_FC2:
        return moe ? 0 : proj + 2 + gated;
    default:
        return 0;
    }
}

unsigned model_sac_op_matmuls(const ModelSpec *s, const ModelDims *d, int layer, ModelOpRole r)
{
    int count;
    const int first = sac_first(s, layer, r, &count);
    unsigned bits = 0;
    for (int i = 0; d->recompute_op && first > 0 && i < count; i++)
        if ((first + i) % 2 == 0)
            bits |= 1u << i;
    return bits;
}

int model_sac_op_role(const ModelSpec *s, const ModelDims *d, int layer, ModelOpRole r)
{
    const ModelMla *m = &s->model.mla;
    const int mla = m->kv_lora_rank > 0, moe = layer >= 0 && model_layer_is_moe(&s->model, layer);
    if (!d->recompute_op)
        return 0;
    switch (r) {
    case MODEL_OPR_LN1:
    case MODEL_OPR_PROJ:
    case MODEL_OPR_LN2:
        return 1;
    case MODEL_OPR_QKV:
        return !mla;
    case MODEL_OPR_Q_A:
        return mla && m->q_lora_rank > 0;
    case MODEL_OPR_KV_A:
    case MODEL_OPR_KV_B:
        return mla;
    case MODEL_OPR_ACT:
    case MODEL_OPR_FC2:
        return !moe;
    default:
        return model_sac_op_matmuls(s, d, layer, r) != 0;
    }
}
