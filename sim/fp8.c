/* What FP8 training changes in a simulation, set beside the same layout without FP8: why the
 * step is faster by less than the FP8 peak promises, and why memory may not shrink
 * (docs/fp8.md). */
#include "sim/internal.h"

#include <string.h>

/* Seconds per step the FP8 ops of the stage take in r (their GEMMs, quantization and other
 * passes), and of them the quantization passes (the optimizer step's weight casts included). */
static void fp8_ops_seconds(const SimResult *r, const SimResult *base, int stage, SimFp8Effect *e)
{
    const int ms = sim_stage_model(r, stage), bs = sim_stage_model(base, stage);
    const ModelOpGraph *g = &r->ops[ms], *bg = &base->ops[bs];
    const double *t = r->op_seconds[ms], *bt = base->op_seconds[bs];
    const ProfDevice *dev = &r->cluster.device;
    const double bw = dev->memory_bandwidth * dev->memory_eff;
    for (int i = 0; i < g->count && i < bg->count; i++) {
        const ModelOp *op = &g->op[i];
        const double times = (op->per_microbatch ? r->dims.m : 1) * (double)op->repeat;
        if (op->fp8) {
            e->gemm_s += t[i] * times;
            e->base_gemm_s += bt[i] * times;
        }
        e->cast_s += op->fp8_cast_bytes / bw * times;
    }
}

/* The FP8 tensors of the stage's table by kind (full tables only: a compact one lists none). */
static void fp8_memory(const SimResult *r, int stage, SimFp8Effect *e)
{
    const ModelTensorTable *tt = &r->work->tables[sim_stage_model(r, stage)];
    /* the table lists one set of every chunk; the peak holds peak_live sets of one chunk's */
    const uint64_t live = (uint64_t)r->mem[stage].peak_live, v = (uint64_t)r->dims.v;
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *x = &tt->t[i];
        const uint64_t bytes = x->bytes * (uint64_t)x->repeat;
        const uint64_t scales = x->scale_bytes * (uint64_t)x->repeat;
        if (x->per_microbatch) {
            if (x->dtype == PX_FP8) {
                e->act_fp8 += bytes * live / v;
                e->act_fp8_as_16 +=
                    x->numel * (uint64_t)x->repeat * px_dtype_bytes(r->dims.act) * live / v;
                e->scales += scales * live / v;
            }
            continue;
        }
        switch (x->role) {
        case MODEL_TR_FP8_W: e->weight_copies += bytes - scales; break;
        case MODEL_TR_FP8_WT: e->transposes += bytes - scales; break;
        case MODEL_TR_FP8_AMAX: e->amax += bytes; break;
        case MODEL_TR_WS_FP8: e->workspace += bytes; break;
        case MODEL_TR_FP8_MX_SCALES: e->scales += bytes; break;
        default:
            if (x->dtype == PX_FP8 && x->cat == MODEL_WEIGHTS)
                e->fp8_params += bytes - scales;
            break;
        }
        if (!x->per_microbatch && x->dtype == PX_FP8)
            e->scales += scales;
    }
}

int sim_fp8_effect(const SimResult *r, SimFp8Effect *e, PxError *err)
{
    memset(e, 0, sizeof *e);
    if (r->spec.job.fp8 == MODEL_FP8_NONE)
        return PX_OK;
    if (sim_level(r) < SIM_FULL)
        return px_fail(err, PX_ERUNTIME, "the FP8 comparison needs a full simulation");
    ModelSpec spec = r->spec;
    spec.job.fp8 = MODEL_FP8_NONE;
    spec.job.fp8_param_gather = 0;
    spec.job.fp8_attention = 0;
    spec.job.fp8_dispatch = 0;
    SimResult base;
    int rc = sim_run_ex(&spec, &r->cluster, r->dims.gpus, r->work->compact, SIM_FULL, &base, err);
    if (rc)
        return rc;
    e->on = 1;
    e->step_s = r->step_s;
    e->base_step_s = base.step_s;
    fp8_ops_seconds(r, &base, r->critical_stage, e);
    e->stage = r->peak_stage;
    memcpy(e->mem, r->mem[r->peak_stage].cat, sizeof e->mem);
    memcpy(e->base_mem, base.mem[r->peak_stage].cat, sizeof e->base_mem);
    e->peak_bytes = r->peak_bytes;
    e->base_peak_bytes = base.peak_bytes;
    fp8_memory(r, r->peak_stage, e);
    e->mfu = r->mfu;
    e->mfu_fp8 = r->mfu_fp8;
    e->base_mfu = base.mfu;
    sim_result_free(&base);
    return PX_OK;
}

static double gib(uint64_t b) { return (double)b / PX_GIB; }

void sim_fp8_effect_print(FILE *f, const SimResult *r, const SimFp8Effect *e)
{
    if (!e->on)
        return;
    const ModelJob *j = &r->spec.job;
    const char *lo = px_dtype_name(j->precision);
    fprintf(f, "\nFP8 (%s recipe, %s format%s%s) against the same layout in %s\n",
            model_fp8_recipe_name(j->fp8), model_fp8_format_name(j->fp8_format),
            r->dims.fp8_wt ? ", transposed copies" : "",
            !j->fp8_param_gather ? ""
            : j->fp8 == MODEL_FP8_MXFP8 && r->spec.layout.zero < 3
                ? ", FP8 parameters gathered in 16 bits" /* model/ops.c's block_param_bytes */
                : ", FP8 parameters gathered in FP8",
            lo);
    fprintf(f, "%-28s %10s %10s %8s\n", "time per step (s)", "fp8", lo, "speedup");
    fprintf(f, "%-28s %10.3f %10.3f %7.2fx\n", "step", e->step_s, e->base_step_s,
            e->step_s > 0 ? e->base_step_s / e->step_s : 0.0);
    fprintf(f, "%-28s %10.3f %10.3f %7.2fx   stage %d\n", "ops with FP8 GEMMs", e->gemm_s,
            e->base_gemm_s, e->gemm_s > 0 ? e->base_gemm_s / e->gemm_s : 0.0, r->critical_stage);
    fprintf(f, "%-28s %10.3f %10s %8s   (in the line above, and the step's weight casts)\n",
            "  of which quantization", e->cast_s, "-", "");
    fprintf(f, "%-28s %10.3f %10.3f %8s   (attention, norms, elementwise, communication, "
               "bubble, optimizer)\n",
            "everything else", e->step_s - e->gemm_s, e->base_step_s - e->base_gemm_s, "");
    fprintf(f, "%-28s %10s %10s %8s   stage %d\n", "memory per rank (GiB)", "fp8", lo, "change",
            e->stage);
    static const char *const names[MODEL_CAT_COUNT] = {"weights", "grads", "master", "optimizer",
                                                       "activations", "comm_buffers", "workspace",
                                                       "runtime"};
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        if (!e->mem[c] && !e->base_mem[c])
            continue;
        fprintf(f, "%-28s %10.2f %10.2f %+8.2f\n", names[c], gib(e->mem[c]), gib(e->base_mem[c]),
                gib(e->mem[c]) - gib(e->base_mem[c]));
    }
    fprintf(f, "%-28s %10.2f %10.2f %+8.2f\n", "peak", gib(e->peak_bytes), gib(e->base_peak_bytes),
            gib(e->peak_bytes) - gib(e->base_peak_bytes));
    fprintf(f, "  FP8 weight copies %.2f, transposed copies %.2f, FP8 parameters %.2f, scales %.3f, "
               "amax history %.3f GiB\n",
            gib(e->weight_copies), gib(e->transposes), gib(e->fp8_params), gib(e->scales),
            gib(e->amax));
    fprintf(f, "  saved GEMM inputs in FP8 %.2f GiB (%.2f in %s); FP8 workspace %.3f GiB\n",
            gib(e->act_fp8), gib(e->act_fp8_as_16), lo, gib(e->workspace));
    fprintf(f, "MFU %.1f%% of the %s peak (%.1f%% without FP8), %.1f%% of the %s peak\n",
            100 * e->mfu, lo, 100 * e->base_mfu, 100 * e->mfu_fp8,
            j->fp8 == MODEL_FP8_MXFP8 ? "MXFP8" : "FP8");
}

cJSON *sim_fp8_effect_to_json(const SimResult *r, const SimFp8Effect *e)
{
    cJSON *o = cJSON_CreateObject();
    const ModelJob *j = &r->spec.job;
    cJSON_AddStringToObject(o, "recipe", model_fp8_recipe_name(j->fp8));
    cJSON_AddStringToObject(o, "format", model_fp8_format_name(j->fp8_format));
    cJSON_AddBoolToObject(o, "transposed_copies", r->dims.fp8_wt);
    cJSON_AddNumberToObject(o, "step_s", e->step_s);
    cJSON_AddNumberToObject(o, "base_step_s", e->base_step_s);
    cJSON_AddNumberToObject(o, "fp8_ops_s", e->gemm_s);
    cJSON_AddNumberToObject(o, "base_fp8_ops_s", e->base_gemm_s);
    cJSON_AddNumberToObject(o, "quantize_s", e->cast_s);
    cJSON_AddNumberToObject(o, "memory_stage", e->stage);
    cJSON *m = cJSON_AddObjectToObject(o, "memory");
    cJSON *bm = cJSON_AddObjectToObject(o, "base_memory");
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        cJSON_AddNumberToObject(m, model_category_name((ModelCategory)c), (double)e->mem[c]);
        cJSON_AddNumberToObject(bm, model_category_name((ModelCategory)c), (double)e->base_mem[c]);
    }
    cJSON_AddNumberToObject(o, "peak_bytes", (double)e->peak_bytes);
    cJSON_AddNumberToObject(o, "base_peak_bytes", (double)e->base_peak_bytes);
    cJSON *b = cJSON_AddObjectToObject(o, "fp8_bytes");
    cJSON_AddNumberToObject(b, "weight_copies", (double)e->weight_copies);
    cJSON_AddNumberToObject(b, "transposed_copies", (double)e->transposes);
    cJSON_AddNumberToObject(b, "fp8_params", (double)e->fp8_params);
    cJSON_AddNumberToObject(b, "scales", (double)e->scales);
    cJSON_AddNumberToObject(b, "amax_history", (double)e->amax);
    cJSON_AddNumberToObject(b, "saved_inputs", (double)e->act_fp8);
    cJSON_AddNumberToObject(b, "saved_inputs_in_16_bits", (double)e->act_fp8_as_16);
    cJSON_AddNumberToObject(b, "workspace", (double)e->workspace);
    cJSON_AddNumberToObject(o, "mfu", e->mfu);
    cJSON_AddNumberToObject(o, "base_mfu", e->base_mfu);
    cJSON_AddNumberToObject(o, "mfu_fp8_peak", e->mfu_fp8);
    return o;
}
