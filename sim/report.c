/* Rendering a simulation: JSON with the prediction's keys (docs/formats.md), and tables for people. */
#include "sim/internal.h"

#include <string.h>

/* memory: the peak against the rank's memory (and the host's, with offload), then per stage
 * by category. */
static void add_memory(cJSON *j, const SimResult *r)
{
    const ModelDims *d = &r->dims;
    cJSON *mem = cJSON_AddObjectToObject(j, "memory");
    cJSON_AddNumberToObject(mem, "peak_bytes", (double)r->peak_bytes);
    cJSON_AddNumberToObject(mem, "peak_stage", r->peak_stage);
    cJSON_AddNumberToObject(mem, "rank_memory_bytes", (double)r->rank_memory_bytes);
    cJSON_AddBoolToObject(mem, "fits", r->peak_bytes <= r->rank_memory_bytes);
    const int offload = r->spec.layout.offload_optimizer || r->spec.layout.offload_activations;
    if (offload) {
        cJSON_AddNumberToObject(mem, "host_peak_bytes", (double)r->host_peak_bytes);
        cJSON_AddNumberToObject(mem, "host_rank_memory_bytes", (double)r->host_rank_memory_bytes);
        cJSON_AddBoolToObject(mem, "host_fits", r->host_peak_bytes <= r->host_rank_memory_bytes);
    }
    cJSON *ps = cJSON_AddArrayToObject(mem, "per_stage");
    for (int st = 0; st < d->p; st++) {
        cJSON *e = cJSON_CreateObject();
        int first;
        cJSON_AddNumberToObject(e, "stage", st);
        cJSON_AddNumberToObject(e, "layers", model_stage_layers(&r->spec, d, st, &first));
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            cJSON_AddNumberToObject(e, model_category_name((ModelCategory)c), (double)r->mem[st].cat[c]);
        cJSON_AddNumberToObject(e, "total", (double)r->mem[st].total);
        cJSON_AddNumberToObject(e, "activation_sets", r->mem[st].peak_live);
        if (offload) {
            cJSON *h = cJSON_AddObjectToObject(e, "host");
            for (int c = 0; c < MODEL_CAT_COUNT; c++)
                if (r->mem[st].host[c])
                    cJSON_AddNumberToObject(h, model_category_name((ModelCategory)c), (double)r->mem[st].host[c]);
            cJSON_AddNumberToObject(h, "total", (double)r->mem[st].host_total);
        }
        cJSON_AddItemToArray(ps, e);
    }
}

/* flops and comm: the job's FLOPs per step and each stage's rank's; the busiest stage's bytes
 * by kind, then every stage's. */
static void add_flops_comm(cJSON *j, const SimResult *r)
{
    const ModelDims *d = &r->dims;
    cJSON *fl = cJSON_AddObjectToObject(j, "flops");
    cJSON_AddNumberToObject(fl, "model_per_step", r->model_flops);
    cJSON_AddNumberToObject(fl, "hardware_per_step", r->hardware_flops);
    cJSON *pr = cJSON_AddArrayToObject(fl, "per_rank_per_step");
    for (int st = 0; st < d->p; st++)
        cJSON_AddItemToArray(pr, cJSON_CreateNumber(r->rank_flops[st]));

    cJSON *cm = cJSON_AddObjectToObject(j, "comm");
    int busiest = 0;
    uint64_t most = 0;
    for (int st = 0; st < d->p; st++) {
        uint64_t tot = 0;
        for (int k = 0; k < MODEL_COMM_COUNT; k++)
            tot += r->comm[st][k];
        if (tot > most) {
            most = tot;
            busiest = st;
        }
    }
    cJSON *pk = cJSON_AddObjectToObject(cm, "per_rank_bytes");
    for (int k = 0; k < MODEL_COMM_COUNT; k++)
        cJSON_AddNumberToObject(pk, model_comm_name((ModelComm)k), (double)r->comm[busiest][k]);
    cJSON_AddNumberToObject(cm, "per_rank_stage", busiest);
    cJSON *cs = cJSON_AddArrayToObject(cm, "per_stage");
    for (int st = 0; st < d->p; st++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "stage", st);
        uint64_t tot = 0;
        for (int k = 0; k < MODEL_COMM_COUNT; k++) {
            cJSON_AddNumberToObject(e, model_comm_name((ModelComm)k), (double)r->comm[st][k]);
            tot += r->comm[st][k];
        }
        cJSON_AddNumberToObject(e, "total_bytes", (double)tot);
        cJSON_AddItemToArray(cs, e);
    }
}

/* One stage's entry of time.per_stage: its step and its parts, with the keys only some layouts
 * have (MoE, CP, offload, ZeRO-2/3) where they apply. */
static cJSON *stage_time_json(const SimResult *r, int st)
{
    const ModelDims *d = &r->dims;
    const SimStageTime *t = &r->stage_time[st];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "stage", st);
    cJSON_AddNumberToObject(e, "step_s", t->step_s);
    cJSON_AddNumberToObject(e, "pipeline_s", t->pipeline_s);
    cJSON_AddNumberToObject(e, "bubble_fraction", t->bubble_fraction);
    cJSON_AddNumberToObject(e, "compute_s", t->compute_s);
    cJSON_AddNumberToObject(e, "tp_comm_s", t->tp_comm_s);
    cJSON_AddNumberToObject(e, "pp_comm_s", t->pp_comm_s);
    cJSON_AddNumberToObject(e, "dp_comm_exposed_s", t->dp_exposed_s);
    if (d->moe)
        cJSON_AddNumberToObject(e, "ep_comm_s", t->ep_comm_s);
    if (d->c > 1) {
        cJSON_AddNumberToObject(e, "cp_comm_s", t->cp_comm_s);
        cJSON_AddNumberToObject(e, "cp_comm_exposed_s", t->cp_exposed_s);
    }
    cJSON_AddNumberToObject(e, "optimizer_s", t->optimizer_s);
    if (r->spec.layout.offload_optimizer) {
        cJSON_AddNumberToObject(e, "offload_host_s", t->offload_host_s);
        cJSON_AddNumberToObject(e, "offload_down_s", t->offload_down_s);
        cJSON_AddNumberToObject(e, "offload_up_s", t->offload_up_s);
    }
    if (r->spec.layout.offload_activations)
        cJSON_AddNumberToObject(e, "offload_activations_s", t->offload_act_s);
    if (r->spec.layout.zero >= 2) {
        /* ZeRO's per-micro-batch collectives (docs/time.md, "Sharded data parallelism") */
        static const char *const zn[4] = {"gather_fwd", "gather_recompute", "gather_bwd", "reduce_scatter"};
        cJSON *z = cJSON_AddObjectToObject(e, "zero");
        for (int k = 0; k < 4; k++) {
            cJSON *zk = cJSON_AddObjectToObject(z, zn[k]);
            cJSON_AddNumberToObject(zk, "comm_s", t->zero_s[k]);
            cJSON_AddNumberToObject(zk, "latency_s", t->zero_latency_s[k]);
            cJSON_AddNumberToObject(zk, "exposed_s", t->zero_exposed_s[k]);
        }
    }
    return e;
}

/* time and throughput: the step of the stage that ends it last, every stage's, and what the
 * step gives (tokens, FLOP/s, MFU; days and GPU-hours for a token budget). */
static void add_time(cJSON *j, const SimResult *r)
{
    const ModelDims *d = &r->dims;
    cJSON *tm = cJSON_AddObjectToObject(j, "time");
    cJSON_AddNumberToObject(tm, "step_s", r->step_s);
    cJSON_AddNumberToObject(tm, "bubble_fraction", r->bubble_fraction);
    cJSON_AddNumberToObject(tm, "compute_s", r->compute_s);
    cJSON_AddNumberToObject(tm, "tp_comm_s", r->tp_comm_s);
    cJSON_AddNumberToObject(tm, "pp_comm_s", r->pp_comm_s);
    cJSON_AddNumberToObject(tm, "dp_comm_exposed_s", r->dp_comm_exposed_s);
    if (d->moe)
        cJSON_AddNumberToObject(tm, "ep_comm_s", r->ep_comm_s);
    cJSON_AddNumberToObject(tm, "optimizer_s", r->optimizer_s);
    cJSON_AddNumberToObject(tm, "critical_stage", r->critical_stage);
    cJSON *tps = cJSON_AddArrayToObject(tm, "per_stage");
    for (int st = 0; st < d->p; st++)
        cJSON_AddItemToArray(tps, stage_time_json(r, st));
    cJSON *tp = cJSON_AddObjectToObject(j, "throughput");
    cJSON_AddNumberToObject(tp, "tokens_per_s", r->tokens_per_s);
    cJSON_AddNumberToObject(tp, "tflops_per_gpu", r->tflops_per_gpu);
    cJSON_AddNumberToObject(tp, "mfu", r->mfu);
    cJSON_AddNumberToObject(tp, "hfu", r->hfu);
    if (r->spec.job.fp8 != MODEL_FP8_NONE)
        cJSON_AddNumberToObject(tp, "mfu_fp8_peak", r->mfu_fp8);
    if (r->spec.job.train_tokens > 0) {
        double days = r->spec.job.train_tokens / r->tokens_per_s / 86400.0;
        cJSON_AddNumberToObject(tp, "train_tokens", r->spec.job.train_tokens);
        cJSON_AddNumberToObject(tp, "days_to_train", days);
        cJSON_AddNumberToObject(tp, "gpu_hours", days * 24.0 * d->gpus);
    }
}

/* ops: every op of every stage per step (its calls, seconds, FLOPs and bytes over the step's
 * micro-batches and repeats). */
static void add_ops(cJSON *j, const SimResult *r)
{
    const ModelDims *d = &r->dims;
    cJSON *ops = cJSON_AddArrayToObject(j, "ops");
    for (int st = 0; st < d->p; st++) {
        const ModelOpGraph *g = &r->ops[st];
        for (int i = 0; i < g->count; i++) {
            const ModelOp *op = &g->op[i];
            double times = (op->per_microbatch ? d->m : 1) * (double)op->repeat;
            char name[80];
            model_op_fullname(op, name, sizeof name);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", name);
            cJSON_AddNumberToObject(e, "stage", st);
            cJSON_AddNumberToObject(e, "chunk", op->chunk);
            cJSON_AddNumberToObject(e, "calls", times * op->calls);
            cJSON_AddNumberToObject(e, "seconds", r->op_seconds[st][i] * times);
            cJSON_AddNumberToObject(e, "flops", op->flops * times);
            cJSON_AddNumberToObject(e, "bytes", op->bytes * times);
            if (op->kind == MODEL_OP_COMM) {
                cJSON_AddStringToObject(e, "comm", model_comm_name(op->comm));
                cJSON_AddNumberToObject(e, "group_size", op->group_size);
                cJSON_AddNumberToObject(e, "comm_bytes", (double)op->comm_bytes * op->calls * times);
            }
            cJSON_AddItemToArray(ops, e);
        }
    }
}

/* The prediction's keys in docs/formats.md's order. */
static void add_prediction(cJSON *j, const SimResult *r)
{
    add_memory(j, r);
    add_flops_comm(j, r);
    add_time(j, r);
    add_ops(j, r);
}

cJSON *sim_prediction_to_json(const SimResult *r)
{
    cJSON *j = cJSON_CreateObject();
    add_prediction(j, r);
    return j;
}

cJSON *sim_result_to_json(const SimResult *r)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "schema_version", 1);
    cJSON *m = model_config_to_json(&r->spec.model);
    cJSON_AddNumberToObject(m, "params", r->params);
    if (r->dims.moe)
        cJSON_AddNumberToObject(m, "active_params", model_config_active_params(&r->spec.model));
    cJSON_AddItemToObject(j, "model", m);
    cJSON_AddStringToObject(j, "cluster", r->cluster.name);
    cJSON_AddNumberToObject(j, "gpus", r->dims.gpus);
    cJSON_AddItemToObject(j, "layout", model_layout_to_json(&r->spec.layout));
    cJSON_AddItemToObject(j, "training", model_job_to_json(&r->spec.job, &r->dims));
    add_prediction(j, r);
    return j;
}

/* The largest binary unit that keeps the peak at or above 1. */
static void mem_unit(uint64_t peak, double *div, const char **name)
{
    *div = PX_GIB;
    *name = "GiB";
    if (peak < (1ull << 30)) {
        *div = 1024.0 * 1024.0;
        *name = "MiB";
    }
    if (peak < (1ull << 20)) {
        *div = 1024.0;
        *name = "KiB";
    }
}

/* The memory categories' column heads. */
static const char *const cat_head[MODEL_CAT_COUNT] = {"weights", "grads", "master", "optimizer",
                                                      "activations", "comm_bufs", "workspace", "runtime"};

/* What was simulated: the model on the cluster, the layout, the training job, the model's size. */
static void print_setup(FILE *f, const SimResult *r)
{
    const ModelSpec *s = &r->spec;
    const ModelLayout *l = &s->layout;
    const ModelJob *t = &s->job;
    const ModelDims *d = &r->dims;
    char buf[32];
    int nodes = (d->gpus + r->node_size - 1) / r->node_size;
    fprintf(f, "%s on %s: %d x %s (%d node%s of %d)\n", s->model.name, r->cluster.name, d->gpus,
            r->cluster.device.name, nodes, nodes == 1 ? "" : "s", r->node_size);
    fprintf(f, "layout    tp %d  pp %d  dp %d  cp %d  vpp %d  zero %d  sp %s  recompute %s  schedule %s\n",
            l->tp, l->pp, l->dp, l->cp, l->vpp, l->zero, l->sp ? "on" : "off",
            model_recompute_name(l->recompute), model_schedule_name(l->schedule));
    if (d->uneven) {
        char split[256];
        model_split_describe(l, split, sizeof split);
        fprintf(f, "split     layers per %sstage %s\n", l->vpp > 1 ? "virtual " : "", split);
    }
    fprintf(f, "training  gbs %d  mbs %d  seq %d  micro-batches %d  %s  grads %s  %s  flash-attn %s  dropout %g\n",
            t->global_batch, t->micro_batch, d->s, d->m, px_dtype_name(t->precision),
            px_dtype_name(t->grad_dtype), model_optimizer_name(t->optimizer),
            t->flash_attn ? "on" : "off", t->dropout);
    /* the prediction is for the framework that runs the job: megatron unless said */
    if (t->framework != MODEL_FW_MEGATRON)
        fprintf(f, "framework %s (profiles/frameworks/%s.json): dp overlap %s, selective recompute %s, "
                   "elementwise %s\n",
                model_framework_name(t->framework), model_framework_name(t->framework),
                l->overlap_dp ? "on" : "off", d->recompute_op ? "op by op" : "of the attention core",
                t->fused_kernels ? "fused (compiled)" : "eager");
    char refused[320];
    if (model_framework_refusal(&r->spec, d, refused, sizeof refused))
        fprintf(f, "          not a layout it runs: %s; priced as given\n", refused);
    if (t->fp8 != MODEL_FP8_NONE) {
        fprintf(f, "fp8       recipe %s  format %s  transposed copies %s  param gather %s  attention %s",
                model_fp8_recipe_name(t->fp8), model_fp8_format_name(t->fp8_format),
                d->fp8_wt ? "yes" : "no", t->fp8_param_gather ? "on" : "off",
                t->fp8_attention ? "fp8" : px_dtype_name(t->precision));
        if (t->fp8 == MODEL_FP8_DELAYED) /* the only recipe that keeps a history */
            fprintf(f, "  amax history %d", t->fp8_amax_history);
        if (t->fp8_dispatch)
            fprintf(f, "  dispatch fp8");
        fprintf(f, "\n");
    }
    fprintf(f, "model     %s parameters", px_fmt_count(buf, sizeof buf, r->params));
    if (d->moe)
        fprintf(f, ", %s active per token (MFU counts their work only)",
                px_fmt_count(buf, sizeof buf, model_config_active_params(&s->model)));
    if (d->vocab_pad != s->model.vocab)
        fprintf(f, ", vocabulary %d padded to %d", s->model.vocab, d->vocab_pad);
    const ModelRopeScaling *rs = &s->model.rope_scaling;
    if (rs->type != MODEL_ROPE_SCALING_NONE)
        fprintf(f, ", RoPE base %g with %s scaling x%g (low/high frequency factors %g/%g, original context %d)",
                s->model.rope_theta, model_rope_scaling_name(rs->type), rs->factor,
                rs->low_freq_factor, rs->high_freq_factor, rs->original_context);
}

/* Memory per rank: a row per stage by category, the peak against the rank's memory and, with
 * offload, what the host holds. */
static void print_memory(FILE *f, const SimResult *r)
{
    const ModelDims *d = &r->dims;
    double div;
    const char *unit;
    mem_unit(r->peak_bytes, &div, &unit);
    fprintf(f, "\n\nmemory per rank (%s)\n", unit);
    fprintf(f, "%5s", "stage");
    const int offload = r->spec.layout.offload_optimizer || r->spec.layout.offload_activations;
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        fprintf(f, " %11s", cat_head[c]);
    fprintf(f, " %9s %8s", "total", "in-flight");
    fprintf(f, offload ? " %9s\n" : "\n", "host");
    for (int st = 0; st < d->p; st++) {
        fprintf(f, "%5d", st);
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            fprintf(f, " %11.2f", (double)r->mem[st].cat[c] / div);
        fprintf(f, " %9.2f %8d", (double)r->mem[st].total / div, r->mem[st].peak_live);
        if (offload)
            fprintf(f, " %9.2f", (double)r->mem[st].host_total / div);
        fprintf(f, "\n");
    }
    int fits = r->peak_bytes <= r->rank_memory_bytes;
    fprintf(f, "peak %.2f %s on stage %d of %.2f GiB per rank: %s (%.0f%%)\n",
            (double)r->peak_bytes / div, unit, r->peak_stage,
            (double)r->rank_memory_bytes / PX_GIB, fits ? "fits" : "DOES NOT FIT",
            100.0 * (double)r->peak_bytes / (double)r->rank_memory_bytes);
    if (!offload)
        return;
    /* the host column by what moved there (docs/memory.md, "Offload") */
    const SimStageMemory *hm = &r->mem[r->peak_stage];
    for (int st = 0; st < d->p; st++)
        if (r->mem[st].host_total > hm->host_total)
            hm = &r->mem[st];
    fprintf(f, "host (%s per rank):", unit);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        if (hm->host[c])
            fprintf(f, " %s %.2f", cat_head[c], (double)hm->host[c] / div);
    const int hfits = r->host_peak_bytes <= r->host_rank_memory_bytes;
    fprintf(f, "; peak %.2f of %.2f GiB per rank (host memory over %d ranks per node): %s (%.0f%%)\n",
            (double)r->host_peak_bytes / div, (double)r->host_rank_memory_bytes / PX_GIB,
            r->node_size, hfits ? "fits" : "DOES NOT FIT",
            r->host_rank_memory_bytes ? 100.0 * (double)r->host_peak_bytes / (double)r->host_rank_memory_bytes : 0.0);
}

/* The lines under the time table for what only some layouts have: offload, CP, ZeRO-2/3, MoE. */
static void print_time_extras(FILE *f, const SimResult *r)
{
    const ModelSpec *s = &r->spec;
    const ModelDims *d = &r->dims;
    if (s->layout.offload_optimizer) {
        const SimStageTime *y = &r->stage_time[r->critical_stage];
        fprintf(f, "optimizer on the host (stage %d, s per step): step %.3f + gradients down %.3f + "
                "parameters up %.3f not hidden (PCIe %.1f GB/s, host memory %.1f GB/s over %d ranks)\n",
                r->critical_stage, y->offload_host_s, y->offload_down_s, y->offload_up_s,
                r->cluster.host_pcie_bandwidth / PX_GB, r->cluster.host_memory_bandwidth / PX_GB,
                r->node_size);
    }
    if (s->layout.offload_activations) {
        fprintf(f, "activation copies to and from the host not hidden (s per step, in the pipeline):");
        for (int st = 0; st < d->p; st++)
            fprintf(f, " %.3f", r->stage_time[st].offload_act_s);
        fprintf(f, "\n");
    }
    if (d->c > 1) {
        fprintf(f, "cp %s exchange per step (s): time exposed:", model_cp_comm_name(s->layout.cp_comm));
        for (int st = 0; st < d->p; st++)
            fprintf(f, "  %.3f %.3f", r->stage_time[st].cp_comm_s, r->stage_time[st].cp_exposed_s);
        fprintf(f, "\n");
    }
    if (s->layout.zero >= 2) {
        /* the critical stage's ZeRO collectives per micro-batch: time (of it latency) exposed */
        const SimStageTime *y = &r->stage_time[r->critical_stage];
        static const char *const zn[4] = {"gather fwd", "recompute", "bwd", "reduce-scatter"};
        fprintf(f, "zero per step (s, stage %d%s): time (latency) exposed:", r->critical_stage,
                d->zero_per_step ? ", once a step under the pipeline" : "");
        for (int k = 0; k < 4; k++)
            if (y->zero_s[k] > 0)
                fprintf(f, "%s %s %.3f (%.3f) %.3f", k ? "  " : "", zn[k], y->zero_s[k],
                        y->zero_latency_s[k], y->zero_exposed_s[k]);
        fprintf(f, "\n");
    }
    if (d->moe) {
        fprintf(f, "experts' all-to-all and ETP gathers not hidden (s per step):");
        for (int st = 0; st < d->p; st++)
            fprintf(f, " %.3f", r->stage_time[st].ep_comm_s);
        fprintf(f, "  (ep %d etp %d edp %d, %d experts per rank, imbalance %g)\n", d->ep, d->etp, d->edp,
                d->experts_loc, d->imbalance);
    }
}

/* FLOPs, then time: a row per stage, the layout's extras, the step and what it gives. */
static void print_time(FILE *f, const SimResult *r)
{
    const ModelJob *t = &r->spec.job;
    const ModelDims *d = &r->dims;
    fprintf(f, "\nFLOPs per step   model %.4g   hardware %.4g   (per rank: %.4g on stage 0)\n",
            r->model_flops, r->hardware_flops, r->rank_flops[0]);

    fprintf(f, "\ntime per step (s)\n%5s %10s %10s %10s %10s %8s %10s %10s %10s\n", "stage", "compute",
            "tp+cp comm", "pp comm", "pipeline", "bubble", "dp exposed", "optimizer", "step");
    for (int st = 0; st < d->p; st++) {
        const SimStageTime *y = &r->stage_time[st];
        fprintf(f, "%5d %10.3f %10.3f %10.3f %10.3f %7.1f%% %10.3f %10.3f %10.3f%s\n", st, y->compute_s,
                y->tp_comm_s, y->pp_comm_s, y->pipeline_s, 100 * y->bubble_fraction, y->dp_exposed_s,
                y->optimizer_s, y->step_s, st == r->critical_stage ? "  <- ends the step" : "");
    }
    print_time_extras(f, r);
    fprintf(f, "step %.3f s   %.0f tokens/s   %.1f TFLOP/s per GPU   MFU %.1f%%   HFU %.1f%%",
            r->step_s, r->tokens_per_s, r->tflops_per_gpu, 100 * r->mfu, 100 * r->hfu);
    if (t->fp8 != MODEL_FP8_NONE)
        fprintf(f, " (of the %s peak; MFU %.1f%% of the %s peak)", px_dtype_name(t->precision),
                100 * r->mfu_fp8, t->fp8 == MODEL_FP8_MXFP8 ? "MXFP8" : "FP8");
    fprintf(f, "\n");
    if (t->train_tokens > 0) {
        double days = t->train_tokens / r->tokens_per_s / 86400.0;
        char buf[32], hours[32];
        fprintf(f, "training on %s tokens: %.1f days, %s GPU-hours\n",
                px_fmt_count(buf, sizeof buf, t->train_tokens), days,
                px_fmt_count(hours, sizeof hours, days * 24 * d->gpus));
    }
}

/* Communication per rank: a row per stage, a column per kind any stage moves. */
static void print_comm(FILE *f, const SimResult *r)
{
    const ModelDims *d = &r->dims;
    int used[MODEL_COMM_COUNT] = {0}, any = 0;
    for (int st = 0; st < d->p; st++)
        for (int k = 0; k < MODEL_COMM_COUNT; k++)
            if (r->comm[st][k]) {
                used[k] = 1;
                any = 1;
            }
    fprintf(f, "\ncommunication per rank per step (GB)\n");
    if (!any) {
        fprintf(f, "none: a single rank\n");
        return;
    }
    fprintf(f, "%5s", "stage");
    for (int k = 0; k < MODEL_COMM_COUNT; k++)
        if (used[k])
            fprintf(f, " %17s", model_comm_name((ModelComm)k));
    fprintf(f, "\n");
    for (int st = 0; st < d->p; st++) {
        fprintf(f, "%5d", st);
        for (int k = 0; k < MODEL_COMM_COUNT; k++)
            if (used[k])
                fprintf(f, " %17.3f", (double)r->comm[st][k] / PX_GB);
        fprintf(f, "\n");
    }
}

void sim_result_print(FILE *f, const SimResult *r)
{
    print_setup(f, r);
    print_memory(f, r);
    print_time(f, r);
    print_comm(f, r);
}

int sim_list_models(FILE *f, int json, PxError *err)
{
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json)
        fprintf(f, "%-16s %-6s %6s %7s %6s %4s %7s %7s %6s %10s %10s %s\n", "name", "family",
                "layers", "hidden", "heads", "kv", "ffn", "vocab", "seq", "params", "active",
                "experts");
    for (int i = 0; i < model_zoo_count(); i++) {
        ModelConfig c;
        int rc = model_config_load(model_zoo_name(i), &c, err);
        if (rc) {
            cJSON_Delete(arr);
            return rc;
        }
        double p = model_config_params(&c), act = model_config_active_params(&c);
        if (json) {
            cJSON *m = model_config_to_json(&c);
            cJSON_AddNumberToObject(m, "params", p);
            cJSON_AddNumberToObject(m, "active_params", act);
            cJSON_AddItemToArray(arr, m);
        } else {
            char buf[32], abuf[32], ex[32] = "-";
            if (c.moe.experts > 0) /* routed experts, top-k, shared width */
                snprintf(ex, sizeof ex, "%d top-%d%s", c.moe.experts, c.moe.topk,
                         c.moe.shared_ffn > 0 ? " +shared" : "");
            fprintf(f, "%-16s %-6s %6d %7d %6d %4d %7d %7d %6d %10s %10s %s\n", c.name,
                    model_family_name(c.family), c.layers, c.hidden, c.heads, c.kv_heads,
                    c.ffn_hidden, c.vocab, c.seq_len, px_fmt_count(buf, sizeof buf, p),
                    px_fmt_count(abuf, sizeof abuf, act), ex);
        }
    }
    if (json) {
        char *s = cJSON_Print(arr);
        fprintf(f, "%s\n", s);
        cJSON_free(s);
        cJSON_Delete(arr);
    }
    return PX_OK;
}

int sim_list_profiles(FILE *f, int json, PxError *err)
{
    cJSON *root = json ? cJSON_CreateObject() : NULL;
    cJSON *devs = json ? cJSON_AddArrayToObject(root, "devices") : NULL;
    cJSON *cls = json ? cJSON_AddArrayToObject(root, "clusters") : NULL;
    if (!json)
        fprintf(f, "devices\n%-12s %9s %10s %10s %10s %4s  %s\n", "name", "memory", "bf16 TF/s",
                "fp32 TF/s", "HBM GB/s", "SMs", "description");
    for (int i = 0; i < prof_device_count(); i++) {
        ProfDevice d;
        int rc = prof_device_load(prof_device_name(i), &d, err);
        if (rc) {
            cJSON_Delete(root);
            return rc;
        }
        if (json) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", d.name);
            cJSON_AddNumberToObject(e, "memory_bytes", (double)d.memory_bytes);
            cJSON_AddNumberToObject(e, "peak_bf16", d.peak_bf16);
            cJSON_AddNumberToObject(e, "peak_fp32", d.peak_fp32);
            cJSON_AddNumberToObject(e, "memory_bandwidth", d.memory_bandwidth);
            cJSON_AddItemToArray(devs, e);
        } else {
            fprintf(f, "%-12s %5.0f GiB %10.1f %10.2f %10.0f %4d  %s\n", d.name,
                    (double)d.memory_bytes / PX_GIB, d.peak_bf16 / 1e12, d.peak_fp32 / 1e12,
                    d.memory_bandwidth / 1e9, d.sm_count, d.description);
        }
    }
    if (!json)
        fprintf(f, "\nclusters\n%-10s %-10s %12s %14s %14s %6s  %s\n", "name", "device",
                "devs/node", "link GB/s", "net GB/s/dev", "nodes", "description");
    for (int i = 0; i < prof_cluster_count(); i++) {
        ProfCluster c;
        int rc = prof_cluster_load(prof_cluster_name(i), NULL, 0, &c, err);
        if (rc) {
            cJSON_Delete(root);
            return rc;
        }
        if (json) {
            cJSON_AddItemToArray(cls, prof_cluster_to_json(&c));
            prof_cluster_free(&c);
        } else {
            char nd[16], nn[16];
            snprintf(nd, sizeof nd, c.node_devices ? "%d" : "any", c.node_devices);
            snprintf(nn, sizeof nn, c.nodes ? "%d" : "-", c.nodes);
            fprintf(f, "%-10s %-10s %12s %14.0f %14.1f %6s  %s\n", c.name, c.device.name, nd,
                    c.link_bandwidth / 1e9, c.net_bandwidth / 1e9, nn, c.description);
            prof_cluster_free(&c);
        }
    }
    if (json) {
        char *s = cJSON_Print(root);
        fprintf(f, "%s\n", s);
        cJSON_free(s);
        cJSON_Delete(root);
    }
    return PX_OK;
}
