/* What a run reports: its header lines, the predicted-against-measured summary (memory per
 * category, communication per kind, FLOPs, step time and bubble, set against the plan's own
 * prediction), and the run's JSON (docs/formats.md's Run) from every rank's figures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "exec/train/internal.h"

void exec_report_header(const Exec *ex)
{
    const ModelDims *d = &ex->c.d;
    const ModelSpec *s = &ex->c.spec;
    char params[32];
    px_fmt_count(params, sizeof params, model_config_params(&s->model));
    char compute[160], comm[192];
    if (ex->device_name[0])
        snprintf(compute, sizeof compute, "%s compute on %s", ex->c.k->name, ex->device_name);
    else
        snprintf(compute, sizeof compute, "%s compute", ex->c.k->name);
    if (ex->comm_note)
        snprintf(comm, sizeof comm, "%s comm, %s", comm_name(ex->c.comm), ex->comm_note);
    else
        snprintf(comm, sizeof comm, "%s comm", comm_name(ex->c.comm));
    if (ex->c.g.world > 1)
        printf("parallax-worker: %s on %s, %d ranks: dp %d x tp %d x pp %d (%s, %s)\n",
               s->model.name, ex->plan.profile.name, ex->c.g.world, d->dp, d->t, d->p, compute, comm);
    else
        printf("parallax-worker: %s on %s, 1 rank (%s, %s)\n", s->model.name, ex->plan.profile.name,
               compute, comm);
    printf("model     %d layers, hidden %d, %d heads, vocab %d: %s parameters\n", s->model.layers,
           s->model.hidden, s->model.heads, s->model.vocab, params);
    printf("training  gbs %d  mbs %d (%d micro-batches)  seq %d  %s  %s  lr %g -> %g (warm-up %d)  "
           "%d steps\n",
           s->job.global_batch, s->job.micro_batch, d->m, d->s, px_dtype_name(s->job.precision),
           model_optimizer_name(s->job.optimizer), s->job.lr, s->job.min_lr, s->job.warmup_steps,
           ex->c.steps);
    if (ex->c.d.master)
        printf("precision %s weights and activations, fp32 master weights, gradients and optimizer "
               "state\n", px_dtype_name(ex->c.act));
    if (ex->fp8.on) {
        const ModelJob *j = &s->job;
        printf("fp8       %s GEMMs on one-byte operands: recipe %s, %s%s%s\n",
               s->model.moe.experts > 0 ? "the linear layers' and experts'" : "the linear layers'",
               model_fp8_recipe_name(j->fp8),
               j->fp8_format == MODEL_FP8_HYBRID ? "E4M3 forward, E5M2 gradients" : "E4M3 throughout",
               ex->fp8.wt ? ", transposed copies" : "",
               j->fp8_param_gather && s->layout.zero == 0
                   ? ", FP8 weights quantized from the fp32 master"
               : j->fp8_param_gather && s->layout.zero < 3
                   ? ", FP8 weights quantized from the fp32 master shards and gathered in FP8 "
                     "(their amaxes all-reduced)"
               : s->layout.zero != 3 ? ""
               : j->fp8_param_gather ? ", weights gathered in FP8 (ZeRO-3, per-tensor scales all-reduced)"
                                     : ", weights cast per use (ZeRO-3)");
    }
    if (ex->optim.scaler.enabled)
        printf("loss      dynamic fp16 loss scaling: scale %g, halved and the step skipped on an "
               "Inf or NaN gradient, doubled after %d clean steps\n",
               ex->optim.scaler.scale, ex->optim.scaler.interval);
    printf("layout    schedule %s  recompute %s  flash-attn %s  dropout %g  zero %d%s\n",
           model_schedule_name(s->layout.schedule), model_recompute_name(s->layout.recompute),
           s->job.flash_attn ? "on" : "off", s->job.dropout, s->layout.zero,
           s->layout.sp ? "  sp on" : "");
    const ExecData *data = &ex->batches.data;
    if (data->kind == EXEC_DATA_BUILTIN)
        printf("data      the built-in text (%.1f MiB, byte tokens)\n",
               (double)data->ntok / (1024.0 * 1024.0));
    else
        printf("data      %s (%llu %s)\n", data->path, (unsigned long long)data->ntok,
               data->kind == EXEC_DATA_TOKENS ? "tokens" : "byte tokens");
    if (ex->init_s > 0)
        printf("weights   initial values drawn on %d host thread%s in %.2f s\n", ex->init_threads,
               ex->init_threads == 1 ? "" : "s", ex->init_s);
    if (ex->c.dropout > 0 && !ex->c.attn_dropout)
        printf("note      flash attention has no attention-probability dropout on the CPU; the "
               "embedding and residual dropouts apply\n");
    if (ex->meter.step_timing)
        printf("timing    per step (one wait for the device per step): no time per op\n");
    fflush(stdout);
}

/* The device's own account of its memory beside the arenas: what the runtime category stands
 * for (CUDA context, cuBLAS workspace, NCCL) measured, against the profile's allowance. */
static void print_device_memory(const Exec *ex, uint64_t arenas, uint64_t allowance)
{
    uint64_t u0, up, ut;
    if (!exec_device_memory(ex, &u0, &up, &ut))
        return;
    printf("device    cudaMemGetInfo: %.3f GiB in use at the peak of %.2f GiB (%.3f GiB before "
           "the arenas); beyond the arenas %.3f GiB, against the runtime allowance of %.3f GiB\n",
           (double)up / PX_GIB, (double)ut / PX_GIB, (double)u0 / PX_GIB,
           (double)(up > arenas ? up - arenas : 0) / PX_GIB, (double)allowance / PX_GIB);
}

/* The CPU's FP8 kernels are the reference, not the fast path: each GEMM decodes its operands
 * and each quantize encodes element by element, which no profile of a GPU's FP8 rates times. */
static void print_fp8_note(const Exec *ex)
{
    if (ex->fp8.on && strcmp(ex->c.k->name, "cpu") == 0)
        printf("note: the CPU's FP8 kernels decode every operand before an fp32 GEMM (the "
               "reference for the GPU's): their step time is not what the plan predicts\n");
}

/* The CPU's 16-bit kernels (kern_cpu_with) widen each operand to fp32 around the fp32 kernel,
 * which the plan prices (sim/cost.c, sim_cpu16_pass_bytes): bf16 runs hold the prediction as
 * fp32 runs do, fp16 runs take longer than priced (docs/executor.md, "16 bits on the CPU"). */
static void print_cpu16_note(const Exec *ex)
{
    if (ex->c.act == PX_FP16 && strcmp(ex->c.k->name, "cpu") == 0)
        printf("note: the CPU's fp16 runs take longer than the plan prices their kernels' "
               "widening to fp32 (memory and bytes as on the GPU): their step time is not "
               "what the plan predicts\n");
}

static void print_loss_scale(const Exec *ex)
{
    if (ex->optim.scaler.enabled)
        printf("loss scale %g at the end; %ld of %d steps skipped (gradients not finite)\n",
               ex->optim.scaler.scale, ex->optim.scaler.skipped, ex->hist.done);
}

/* With the router's own choice (not forced balance) a MoE run sends and computes the copies
 * the router chose: the experts' all-to-all bytes and GEMM FLOPs are then at most the plan's,
 * which sized the buffers for moe_imbalance, and equal them only when routing is balanced. */
static int routes_freely(const Exec *ex)
{
    return ex->c.spec.model.moe.experts > 0 && !ex->c.spec.job.moe_force_balance;
}

/* "equal", "bound" (real routing, within the plan's), or "DIFFERS"; *ok gets whether it is
 * not a difference. */
static const char *verdict(double predicted, double measured, int bound_ok, int *ok)
{
    if (fabs(predicted - measured) <= 1e-9 * fabs(predicted)) {
        *ok = 1;
        return "equal";
    }
    *ok = bound_ok && measured <= predicted * (1 + 1e-9);
    return *ok ? "bound" : "DIFFERS";
}

static double jnum(const cJSON *o, const char *k)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

/* The bytes a rank's grown MoE buffers hold in category k (run.json's
 * memory.per_rank[].moe_dropless_bytes; 0 when it grew none). */
static uint64_t dropless_bytes(const cJSON *mem, int k)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(mem, "moe_dropless_bytes");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(g, model_category_name((ModelCategory)k));
    return cJSON_IsNumber(v) ? (uint64_t)v->valuedouble : 0;
}

static void print_grown_note(const Exec *ex, const cJSON *run)
{
    printf("grown: the router sent a rank's experts more token copies than the plan's buffers "
           "(training.moe_imbalance %g): they grew, no copy was dropped (run.json's moe.layers[] "
           "has the measured imbalance and the bytes per layer and step)\n",
           ex->c.d.imbalance);
    const cJSON *l;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "moe"), "layers"))
    printf("  MoE layer %d: imbalance %.3f measured, %.0f bytes grown\n", (int)jnum(l, "layer"),
           jnum(l, "imbalance"), jnum(l, "extra_bytes"));
}

static void print_bound_note(const Exec *ex)
{
    if (ex->moe.capacity > 0)
        printf("bound: with a capacity factor the all-to-all sends the kept copies only (each "
               "expert rank pads its rows to capacity itself), at most the plan's padded rows\n");
    else if (routes_freely(ex))
        printf("bound: the router's own choice moved and computed at most the plan's buffers "
               "(training.moe_imbalance %g); force the balance for exact figures\n",
               ex->c.spec.job.moe_imbalance);
}

static void summary_one(Exec *ex)
{
    uint64_t mem[MODEL_CAT_COUNT];
    exec_memory(ex, mem);
    const uint64_t *pm = ex->pred.mem[ex->c.g.stage];
    printf("\nmemory of rank 0 (bytes)  predicted      measured\n");
    int all_equal = 1;
    uint64_t psum = 0, msum = 0;
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        const char *note = c == MODEL_RUNTIME ? "profile allowance, not measured"
                           : pm[c] == mem[c] ? "equal"
                                                  : "DIFFERS";
        if (c != MODEL_RUNTIME && pm[c] != mem[c])
            all_equal = 0;
        if (c != MODEL_RUNTIME) {
            psum += pm[c];
            msum += mem[c];
        }
        printf("  %-14s %14llu %14llu  %s\n", model_category_name((ModelCategory)c),
               (unsigned long long)pm[c], (unsigned long long)mem[c], note);
    }
    printf("  %-14s %14llu %14llu  %s\n", "arenas", (unsigned long long)psum,
           (unsigned long long)msum, psum == msum ? "equal (peak: allocated once)" : "DIFFERS");
    print_device_memory(ex, msum, mem[MODEL_RUNTIME]);
    double fp = ex->pred.rank_flops[ex->c.g.stage], fm = exec_step_flops(ex);
    int flops_equal;
    const char *fv = verdict(fp, fm, routes_freely(ex), &flops_equal);
    printf("FLOPs per step            %14.6e %14.6e  %s\n", fp, fm, fv);
    printf("step time (s)             %14.4f %14.4f  (measured: median; predicted by the plan on its %s "
           "profile)\n",
           ex->pred.step_s[ex->c.g.stage], exec_median_step_s(ex), ex->plan.profile.name);
    print_fp8_note(ex);
    print_cpu16_note(ex);
    print_loss_scale(ex);
    if (strcmp(fv, "bound") == 0)
        print_bound_note(ex);
    if (!all_equal || !flops_equal)
        printf("warning: measured memory or FLOPs differ from the prediction: a bug in model/ or "
               "exec/\n");
}

/* Every rank's memory (all categories but runtime), communication per kind, FLOPs and
 * bubble against its stage's prediction, from the gathered run. */
static void summary_ranks(Exec *ex, const cJSON *run)
{
    const cJSON *mr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "memory"), "per_rank");
    const cJSON *cr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "comm"), "per_rank");
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(run, "flops"), "per_rank_per_step");
    const cJSON *tl = cJSON_GetObjectItemCaseSensitive(run, "timeline");
    const int W = cJSON_GetArraySize(mr), pipe = ex->c.d.p > 1, free_routing = routes_freely(ex);
    int bad = 0, bound = 0, grown_any = 0;
    printf("\nper rank        memory (bytes, runtime excluded)      communication per step (bytes)      "
           "FLOPs per step%s\n", pipe ? "        bubble" : "");
    printf("rank stage      predicted       measured             predicted       measured             "
           "predicted  measured%s\n", pipe ? "   predicted measured" : "");
    for (int i = 0; i < W; i++) {
        const cJSON *m = cJSON_GetArrayItem(mr, i), *c = cJSON_GetArrayItem(cr, i);
        const int st = (int)jnum(m, "stage");
        uint64_t pm = 0, mm = 0, pc = 0, mc = 0;
        int mem_eq = 1, comm_eq = 1, comm_bound = 0, grown = 0;
        for (int k = 0; k < MODEL_RUNTIME; k++) {
            uint64_t p = ex->pred.mem[st][k], v = (uint64_t)jnum(m, model_category_name((ModelCategory)k));
            const uint64_t g = dropless_bytes(m, k);
            pm += p;
            mm += v;
            mem_eq &= p + g == v; /* the grown buffers are the whole difference */
            grown |= g > 0;
        }
        grown_any |= grown;
        const cJSON *by = cJSON_GetObjectItemCaseSensitive(c, "by_kind");
        for (int k = 0; k < MODEL_COMM_COUNT; k++) {
            uint64_t p = ex->pred.comm[st][k], v = (uint64_t)jnum(by, model_comm_name((ModelComm)k));
            pc += p;
            mc += v;
            /* the experts' rows: the all-to-all and, with etp > 1, their gather and
             * reduce-scatter (padded to the plan's buffer, more where an etp rank grew); a
             * capacity's all-to-all sends the kept copies only, not the padding */
            const int rows_kind = k == MODEL_EP_ALL_TO_ALL || k == MODEL_ETP_ALL_GATHER ||
                                  k == MODEL_ETP_REDUCE_SCATTER;
            if ((free_routing || ex->moe.capacity > 0) && rows_kind && (v < p || grown))
                comm_bound = 1; /* what the router chose, within the plan's buffers */
            else
                comm_eq &= p == v;
        }
        double pf = ex->pred.rank_flops[st], mf = cJSON_GetNumberValue(cJSON_GetArrayItem(fr, i));
        int fl_ok;
        const char *fv = verdict(pf, mf, free_routing, &fl_ok);
        if (!fl_ok && grown) { /* the grown rows' GEMMs */
            fl_ok = 1;
            fv = "grown";
        }
        bad |= !mem_eq || !comm_eq || !fl_ok;
        bound |= (comm_eq && comm_bound) || strcmp(fv, "bound") == 0;
        printf("%4d %5d %14llu %14llu %-7s %14llu %14llu %-7s %12.4e %9s", (int)jnum(m, "rank"), st,
               (unsigned long long)pm, (unsigned long long)mm,
               !mem_eq ? "DIFFERS" : grown ? "grown" : "equal", (unsigned long long)pc,
               (unsigned long long)mc, !comm_eq ? "DIFFERS" : grown && mc > pc ? "grown" : comm_bound ? "bound" : "equal", pf,
               fv);
        if (pipe)
            printf("   %8.1f%% %7.1f%%", 100 * ex->pred.bubble_fraction[st],
                   100 * jnum(cJSON_GetArrayItem(tl, i), "bubble_fraction"));
        printf("\n");
    }
    printf("step time (s)   %14.4f %14.4f  (measured: median; predicted by the plan on its %s profile)\n",
           ex->pred.job_step_s, exec_median_step_s(ex), ex->plan.profile.name);
    print_fp8_note(ex);
    print_cpu16_note(ex);
    /* every rank's device peak, from the gathered run */
    int have_dev = 0;
    for (int i = 0; i < W; i++)
        have_dev |= cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(mr, i),
                                                     "device_used_peak_bytes") != NULL;
    if (have_dev) {
        printf("device memory in use at the peak (cudaMemGetInfo, GiB):");
        for (int i = 0; i < W; i++)
            printf(" %d: %.3f", i,
                   jnum(cJSON_GetArrayItem(mr, i), "device_used_peak_bytes") / PX_GIB);
        printf("\n");
    }
    print_loss_scale(ex);
    if (pipe)
        printf("bubble          %13.1f%% %13.1f%%  (idle over busy time of the stage that ends "
               "last)\n",
               100 * ex->pred.job_bubble_fraction,
               100 * jnum(cJSON_GetObjectItemCaseSensitive(run, "time"), "bubble_fraction"));
    if (bound)
        print_bound_note(ex);
    if (grown_any)
        print_grown_note(ex, run);
    if (bad)
        printf("warning: measured memory, communication or FLOPs differ from the prediction: a bug "
               "in model/ or exec/\n");
}

/* Every rank's experts (dropless routing): the most rows a micro-batch gave them per MoE
 * layer, the bytes the layer's grown buffers hold, and the growth log ([layer, step, bytes]). */
static void moe_rows_json(const Exec *ex, cJSON *r)
{
    const ExecMoe *mo = &ex->moe;
    if (!ex->c.d.moe || !mo->rows_max)
        return;
    cJSON *mx = cJSON_AddObjectToObject(r, "moe_rows");
    cJSON *rm = cJSON_AddArrayToObject(mx, "rows_max");
    cJSON *eb = cJSON_AddArrayToObject(mx, "extra_bytes");
    for (int i = 0; i < mo->layers; i++) {
        cJSON_AddItemToArray(rm, cJSON_CreateNumber((double)mo->rows_max[i]));
        cJSON_AddItemToArray(eb, cJSON_CreateNumber((double)mo->layer_extra[i]));
    }
    cJSON *gl = cJSON_AddArrayToObject(mx, "growth");
    for (int i = 0; i < mo->n_growth; i++) {
        const double e[3] = {mo->growth[i].layer, ex->hist.first_step + mo->growth[i].step,
                             (double)mo->growth[i].bytes};
        cJSON_AddItemToArray(gl, cJSON_CreateDoubleArray(e, 3));
    }
    /* token dropping: the copies this rank dropped per step ([steps][layers]) */
    if (mo->capacity > 0) {
        cJSON *dl = cJSON_AddArrayToObject(mx, "dropped");
        const int steps = mo->steps_begun < mo->drop_steps ? mo->steps_begun : mo->drop_steps;
        for (int st = 0; st < steps; st++) {
            cJSON *row = cJSON_CreateArray();
            for (int i = 0; i < mo->layers; i++)
                cJSON_AddItemToArray(row, cJSON_CreateNumber(
                                              (double)mo->dropped[(size_t)st * mo->layers + i]));
            cJSON_AddItemToArray(dl, row);
        }
    }
}

/* This rank's figures: memory, communication and FLOPs per step, ops, the recorded step's
 * passes. */
static cJSON *rank_json(Exec *ex)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "rank", ex->c.g.rank);
    cJSON_AddNumberToObject(r, "stage", ex->c.g.stage);

    uint64_t mem[MODEL_CAT_COUNT], total = 0;
    exec_memory(ex, mem);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        total += mem[c];
    cJSON *m = cJSON_AddObjectToObject(r, "memory");
    cJSON_AddNumberToObject(m, "rank", ex->c.g.rank);
    cJSON_AddNumberToObject(m, "stage", ex->c.g.stage);
    cJSON_AddNumberToObject(m, "peak_bytes", (double)total);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        cJSON_AddNumberToObject(m, model_category_name((ModelCategory)c), (double)mem[c]);
    /* dropless MoE routing past the plan's buffers: what the grown ones hold, by category
     * (counted in the categories above; docs/moe.md, "Dropless routing") */
    if (ex->c.d.moe) {
        cJSON *g = NULL;
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            if (ex->moe.extra[c]) {
                if (!g)
                    g = cJSON_AddObjectToObject(m, "moe_dropless_bytes");
                cJSON_AddNumberToObject(g, model_category_name((ModelCategory)c),
                                        (double)ex->moe.extra[c]);
            }
    }
    /* runtime is not measured: it is the profile's allowance for the process image and
     * libraries; the process's real peak resident size is given beside it */
    cJSON_AddStringToObject(m, "runtime_source", "profile");
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        cJSON_AddNumberToObject(m, "process_peak_rss_bytes", (double)ru.ru_maxrss * 1024.0);
    uint64_t host[MODEL_CAT_COUNT], host_w;
    ExecOffloadTimes ot;
    if (exec_host_memory(ex, host, &host_w, &ot)) {
        /* optimizer offload: what lives in host memory, by category as the plan's host column,
         * the weight copy the host step updates beside it, and the step's host-side seconds */
        cJSON *h = cJSON_AddObjectToObject(m, "host");
        uint64_t sum = 0;
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            if (host[c]) {
                cJSON_AddNumberToObject(h, model_category_name((ModelCategory)c), (double)host[c]);
                sum += host[c];
            }
        cJSON_AddNumberToObject(h, "total", (double)sum);
        cJSON_AddNumberToObject(h, "weights_fp32_copy", (double)host_w);
        cJSON *o = cJSON_AddObjectToObject(r, "offload");
        cJSON_AddNumberToObject(o, "host_updates", (double)ot.steps);
        cJSON_AddNumberToObject(o, "grads_to_host_s", ot.d2h_s);
        cJSON_AddNumberToObject(o, "host_optimizer_s", ot.host_step_s);
        cJSON_AddNumberToObject(o, "weights_to_device_s", ot.h2d_s);
        const double n = ot.steps > 0 ? (double)ot.steps : 1.0;
        cJSON_AddNumberToObject(o, "grads_to_host_s_per_step", ot.d2h_s / n);
        cJSON_AddNumberToObject(o, "host_optimizer_s_per_step", ot.host_step_s / n);
        cJSON_AddNumberToObject(o, "weights_to_device_s_per_step", ot.h2d_s / n);
    }
    /* ZeRO-3's further gather slots (prefetch beyond one layer), kept gathers and bucket
     * staging: beside the arenas, since the memory table sizes the two param_gather halves
     * only */
    if (ex->zero.extra_bytes)
        cJSON_AddNumberToObject(m, "zero_gather_extra_bytes", (double)ex->zero.extra_bytes);
    cJSON_AddNumberToObject(m, "activation_sets", ex->acts.peak_live);
    cJSON_AddNumberToObject(m, "activations_in_use_peak", (double)exec_activations_in_use_peak(ex));
    /* the peak two ways: the arenas (every category but runtime, allocated once) and the
     * device's own account (cudaMemGetInfo), which adds the CUDA context, cuBLAS's workspace,
     * NCCL's buffers and anything else the process holds on the device */
    cJSON_AddNumberToObject(m, "arena_bytes", (double)(total - mem[MODEL_RUNTIME]));
    uint64_t u0, up, ut;
    if (exec_device_memory(ex, &u0, &up, &ut)) {
        cJSON_AddStringToObject(m, "device_source", "cudaMemGetInfo");
        cJSON_AddNumberToObject(m, "device_used_peak_bytes", (double)up);
        cJSON_AddNumberToObject(m, "device_used_before_arenas_bytes", (double)u0);
        cJSON_AddNumberToObject(m, "device_total_bytes", (double)ut);
    }

    cJSON *c0 = cJSON_AddObjectToObject(r, "comm");
    cJSON_AddNumberToObject(c0, "rank", ex->c.g.rank);
    cJSON_AddNumberToObject(c0, "stage", ex->c.g.stage);
    uint64_t ctot = 0;
    cJSON *kinds = cJSON_CreateObject();
    for (int k = 0; k < MODEL_COMM_COUNT; k++) {
        ctot += ex->meter.step_bytes[k];
        cJSON_AddNumberToObject(kinds, model_comm_name((ModelComm)k), (double)ex->meter.step_bytes[k]);
    }
    cJSON_AddNumberToObject(c0, "total_bytes", (double)ctot);
    cJSON_AddItemToObject(c0, "by_kind", kinds);
    /* ZeRO-3's prefetch: gathers issued before the layer ahead of them computed (the run's) */
    if (ex->c.spec.layout.zero == 3)
        cJSON_AddNumberToObject(c0, "zero3_gathers_prefetched", (double)ex->zero.prefetched);

    cJSON_AddNumberToObject(r, "flops", exec_step_flops(ex));
    int n = 0;
    const ExecOpReport *ops = exec_ops(ex, &n);
    cJSON *oa = cJSON_AddArrayToObject(r, "ops");
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", ops[i].name);
        cJSON_AddNumberToObject(o, "stage", ex->c.g.stage);
        cJSON_AddNumberToObject(o, "calls", ops[i].calls);
        cJSON_AddNumberToObject(o, "seconds", ops[i].seconds);
        cJSON_AddNumberToObject(o, "flops", ops[i].flops);
        cJSON_AddItemToArray(oa, o);
    }

    /* a MoE model: the copies this rank routed to each expert of each MoE layer in the last
     * step; TP ranks without SP route the same tokens, so one of them tells */
    const ExecMoe *mo = &ex->moe;
    if (ex->c.d.moe && mo->tokens_per_expert && (ex->c.spec.layout.sp || ex->c.g.tp_rank == 0)) {
        cJSON *ml = cJSON_AddArrayToObject(r, "moe_routed");
        for (int i = 0; i < mo->layers; i++) {
            cJSON *row = cJSON_CreateDoubleArray(mo->tokens_per_expert + (size_t)i * (size_t)mo->E,
                                                 mo->E);
            cJSON_AddItemToArray(ml, row);
        }
    }
    moe_rows_json(ex, r);

    cJSON *tl = cJSON_AddObjectToObject(r, "timeline");
    cJSON_AddNumberToObject(tl, "rank", ex->c.g.rank);
    cJSON_AddNumberToObject(tl, "stage", ex->c.g.stage);
    double busy, idle, bubble = exec_meter_bubble(&ex->meter, &busy, &idle);
    cJSON_AddNumberToObject(tl, "busy_s", busy);
    cJSON_AddNumberToObject(tl, "idle_s", idle);
    cJSON_AddNumberToObject(tl, "bubble_fraction", bubble);
    cJSON *ev = cJSON_AddArrayToObject(tl, "events");
    for (int i = 0; ex->meter.have_events && i < ex->meter.n_events; i++) {
        const ExecEvent *e = &ex->meter.last_events[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "chunk", e->chunk);
        cJSON_AddNumberToObject(o, "mb", e->mb);
        cJSON_AddBoolToObject(o, "backward", e->backward);
        cJSON_AddNumberToObject(o, "start_s", e->start_s);
        cJSON_AddNumberToObject(o, "end_s", e->end_s);
        cJSON_AddItemToArray(ev, o);
    }
    return r;
}

static cJSON *detach(cJSON *obj, const char *key)
{
    return cJSON_DetachItemFromObjectCaseSensitive(obj, key);
}

/* "moe": per MoE layer, the token copies routed to each expert in the last step over the whole
 * job (every rank's own tokens summed; a layer of another stage counts zero there), and the
 * busiest expert's over the mean: 1 is perfect balance, E that every copy went to one expert. */
/* Dropless routing per MoE layer over every rank (rank_json's moe_rows): the most rows a
 * micro-batch gave one rank's experts, the bytes grown past the plan summed over the ranks, and
 * the growth by step (summed over the ranks). */
typedef struct {
    double rows_max, extra;
    cJSON *growth;  /* [{step, bytes}] */
    cJSON *dropped; /* [per step]: copies dropped by the capacity, summed over the ranks */
    double dropped_total;
} MoeRowsSum;

/* Each rank's dropped copies per step ([steps][layers], rank_json) summed into L[].dropped. */
static void moe_dropped_gather(MoeRowsSum *L, int layers, const cJSON *mx)
{
    int st = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(mx, "dropped"))
    {
        for (int l = 0; l < layers; l++) {
            const double v = cJSON_GetNumberValue(cJSON_GetArrayItem(row, l));
            if (!L[l].dropped || v != v)
                continue;
            cJSON *at = cJSON_GetArrayItem(L[l].dropped, st);
            while (!at) {
                cJSON_AddItemToArray(L[l].dropped, cJSON_CreateNumber(0));
                at = cJSON_GetArrayItem(L[l].dropped, st);
            }
            cJSON_SetNumberValue(at, cJSON_GetNumberValue(at) + v);
            L[l].dropped_total += v;
        }
        st++;
    }
}

static void moe_rows_gather(MoeRowsSum *L, int layers, cJSON *const *ranks, int n)
{
    for (int i = 0; i < n; i++) {
        const cJSON *mx = cJSON_GetObjectItemCaseSensitive(ranks[i], "moe_rows");
        const cJSON *rm = cJSON_GetObjectItemCaseSensitive(mx, "rows_max");
        const cJSON *eb = cJSON_GetObjectItemCaseSensitive(mx, "extra_bytes");
        moe_dropped_gather(L, layers, mx);
        for (int l = 0; l < layers && rm && eb; l++) {
            const double r = cJSON_GetNumberValue(cJSON_GetArrayItem(rm, l));
            L[l].rows_max = r > L[l].rows_max ? r : L[l].rows_max;
            L[l].extra += cJSON_GetNumberValue(cJSON_GetArrayItem(eb, l));
        }
        const cJSON *g;
        cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(mx, "growth"))
        {
            const int l = (int)cJSON_GetNumberValue(cJSON_GetArrayItem(g, 0));
            const double st = cJSON_GetNumberValue(cJSON_GetArrayItem(g, 1));
            const double b = cJSON_GetNumberValue(cJSON_GetArrayItem(g, 2));
            if (l < 0 || l >= layers)
                continue;
            cJSON *e = NULL, *it;
            cJSON_ArrayForEach(it, L[l].growth)
            if (cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(it, "step")) == st)
                e = it;
            if (e) {
                cJSON *bv = cJSON_GetObjectItemCaseSensitive(e, "bytes");
                cJSON_SetNumberValue(bv, cJSON_GetNumberValue(bv) + b);
            } else {
                e = cJSON_CreateObject();
                cJSON_AddNumberToObject(e, "step", st);
                cJSON_AddNumberToObject(e, "bytes", b);
                cJSON_AddItemToArray(L[l].growth, e);
            }
        }
        cJSON_DeleteItemFromObjectCaseSensitive(ranks[i], "moe_rows");
    }
}

static void moe_json(const Exec *ex, cJSON *j, cJSON *const *ranks, int n)
{
    const ExecMoe *mo = &ex->moe;
    if (!ex->c.d.moe || mo->layers == 0)
        return;
    double *sum = calloc((size_t)mo->layers * (size_t)mo->E, sizeof *sum);
    MoeRowsSum *rows = calloc((size_t)mo->layers, sizeof *rows);
    if (!sum || !rows) {
        free(sum);
        free(rows);
        return;
    }
    for (int l = 0; l < mo->layers; l++) {
        rows[l].growth = cJSON_CreateArray();
        rows[l].dropped = mo->capacity > 0 ? cJSON_CreateArray() : NULL;
    }
    moe_rows_gather(rows, mo->layers, ranks, n);
    for (int i = 0; i < n; i++) {
        const cJSON *ml = cJSON_GetObjectItemCaseSensitive(ranks[i], "moe_routed");
        for (int l = 0; l < mo->layers && ml; l++) {
            const cJSON *row = cJSON_GetArrayItem(ml, l);
            for (int e = 0; e < mo->E && row; e++)
                sum[(size_t)l * mo->E + e] += cJSON_GetNumberValue(cJSON_GetArrayItem(row, e));
        }
        cJSON_DeleteItemFromObjectCaseSensitive(ranks[i], "moe_routed");
    }
    cJSON *m = cJSON_AddObjectToObject(j, "moe");
    cJSON_AddNumberToObject(m, "step", ex->hist.first_step + ex->hist.done);
    cJSON_AddNumberToObject(m, "experts", mo->E);
    cJSON_AddNumberToObject(m, "topk", ex->c.spec.model.moe.topk);
    cJSON_AddBoolToObject(m, "force_balance", ex->c.spec.job.moe_force_balance);
    /* the imbalance the plan sized the experts' rows for, and those rows per micro-batch: a
     * layer's measured imbalance is its busiest rank's rows over the balanced share */
    const double share = (double)ex->c.d.tokens * ex->c.spec.model.moe.topk * ex->c.d.etp;
    cJSON_AddNumberToObject(m, "planned_imbalance", ex->c.d.imbalance);
    cJSON_AddNumberToObject(m, "planned_rows", (double)ex->c.d.routed);
    cJSON_AddStringToObject(m, "routing", mo->capacity > 0 ? "capacity" : "dropless");
    if (mo->capacity > 0) {
        /* Megatron-Core's token dropping: each expert takes at most `capacity` of a rank's
         * copies per micro-batch (docs/moe.md, "Token dropping") */
        cJSON_AddNumberToObject(m, "capacity_factor", ex->c.spec.model.moe.capacity_factor);
        cJSON_AddNumberToObject(m, "capacity", mo->capacity);
    }
    double extra_all = 0, dropped_all = 0;
    cJSON *layers = cJSON_AddArrayToObject(m, "layers");
    for (int l = 0, idx = 0; l < ex->c.spec.model.layers; l++) {
        if (mo->index[l] < 0)
            continue;
        const double *t = sum + (size_t)idx++ * mo->E;
        double mx = 0, tot = 0;
        for (int e = 0; e < mo->E; e++) {
            mx = t[e] > mx ? t[e] : mx;
            tot += t[e];
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", l);
        cJSON_AddItemToObject(o, "tokens_per_expert", cJSON_CreateDoubleArray(t, mo->E));
        cJSON_AddNumberToObject(o, "max_over_mean", tot > 0 ? mx / (tot / mo->E) : 0.0);
        const MoeRowsSum *R = &rows[idx - 1];
        cJSON_AddNumberToObject(o, "rows_max", R->rows_max);
        cJSON_AddNumberToObject(o, "imbalance", share > 0 ? R->rows_max / share : 0.0);
        cJSON_AddNumberToObject(o, "extra_bytes", R->extra);
        cJSON_AddItemToObject(o, "growth", R->growth);
        rows[idx - 1].growth = NULL;
        if (R->dropped) {
            cJSON_AddItemToObject(o, "dropped", R->dropped);
            cJSON_AddNumberToObject(o, "dropped_total", R->dropped_total);
            dropped_all += R->dropped_total;
            rows[idx - 1].dropped = NULL;
        }
        extra_all += R->extra;
        cJSON_AddItemToArray(layers, o);
    }
    cJSON_AddNumberToObject(m, "extra_bytes", extra_all);
    if (mo->capacity > 0)
        cJSON_AddNumberToObject(m, "dropped_total", dropped_all);
    for (int l = 0; l < mo->layers; l++) {
        cJSON_Delete(rows[l].growth);
        cJSON_Delete(rows[l].dropped);
    }
    free(rows);
    free(sum);
}

/* The run (docs/formats.md's Run) from every rank's figures, in rank order. */
static cJSON *run_json(Exec *ex, cJSON *const *ranks, int n)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "schema_version", 1);
    cJSON_AddItemToObject(j, "plan", model_plan_to_json(&ex->plan));
    cJSON_AddStringToObject(j, "plan_path", ex->plan_path);

    cJSON *be = cJSON_AddObjectToObject(j, "backend");
    char host[256] = "unknown";
    if (gethostname(host, sizeof host - 1) != 0)
        px_strlcpy(host, "unknown", sizeof host);
    host[sizeof host - 1] = '\0';
    cJSON_AddStringToObject(be, "compute", ex->c.k->name);
    cJSON_AddStringToObject(be, "precision", px_dtype_name(ex->c.act));
    if (ex->device_name[0])
        cJSON_AddStringToObject(be, "device", ex->device_name);
    cJSON_AddStringToObject(be, "comm", comm_name(ex->c.comm));
    if (ex->comm_note)
        cJSON_AddStringToObject(be, "comm_note", ex->comm_note);
    cJSON_AddNumberToObject(be, "world", ex->c.g.world);
    cJSON_AddStringToObject(be, "host", host);

    cJSON *steps = cJSON_AddArrayToObject(j, "steps");
    const ExecHistory *H = &ex->hist;
    for (int i = 0; i < H->done; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddNumberToObject(s, "step", H->first_step + i + 1);
        cJSON_AddNumberToObject(s, "loss", H->loss[i]);
        if (ex->c.spec.model.mtp_layers > 0)
            cJSON_AddNumberToObject(s, "mtp_loss", H->mtp_loss[i]);
        cJSON_AddNumberToObject(s, "time_s", H->time[i]);
        cJSON_AddNumberToObject(s, "tokens_per_s", H->tps[i]);
        if (ex->optim.scaler.enabled) {
            cJSON_AddNumberToObject(s, "loss_scale", H->scale[i]);
            cJSON_AddBoolToObject(s, "skipped", H->skipped[i]);
        }
        cJSON_AddItemToArray(steps, s);
    }
    cJSON_AddBoolToObject(j, "interrupted", H->interrupted);
    /* a loss or gradient norm that was not finite stopped the run at this step (not in steps) */
    if (ex->optim.diverged_at > 0)
        cJSON_AddNumberToObject(j, "diverged_at_step", ex->optim.diverged_at);
    ckpt_json(ex->ckpt, j);
    if (ex->optim.scaler.enabled) {
        cJSON *ls = cJSON_AddObjectToObject(j, "loss_scale");
        cJSON_AddNumberToObject(ls, "final", ex->optim.scaler.scale);
        cJSON_AddNumberToObject(ls, "skipped_steps", (double)ex->optim.scaler.skipped);
        cJSON_AddNumberToObject(ls, "growth_interval", ex->optim.scaler.interval);
    }

    cJSON *mr = cJSON_AddArrayToObject(cJSON_AddObjectToObject(j, "memory"), "per_rank");
    cJSON *cr = cJSON_AddArrayToObject(cJSON_AddObjectToObject(j, "comm"), "per_rank");
    cJSON *oa = cJSON_AddArrayToObject(j, "ops");
    cJSON *opr = n > 1 ? cJSON_AddArrayToObject(j, "ops_per_rank") : NULL;
    cJSON *fr = cJSON_AddArrayToObject(cJSON_AddObjectToObject(j, "flops"), "per_rank_per_step");
    cJSON *tl = ex->c.d.p > 1 ? cJSON_AddArrayToObject(j, "timeline") : NULL;
    /* optimizer offload: each rank's copy and host-step seconds */
    cJSON *ofr = ex->c.spec.layout.offload_optimizer
                     ? cJSON_AddArrayToObject(cJSON_AddObjectToObject(j, "offload"), "per_rank")
                     : NULL;
    double crit_end = -1, crit_bubble = 0;
    int *stage_seen = calloc((size_t)ex->c.d.p, sizeof *stage_seen);
    for (int i = 0; i < n; i++) {
        cJSON *r = ranks[i];
        int rank = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "rank"));
        int stage = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "stage"));
        cJSON_AddItemToArray(mr, detach(r, "memory"));
        cJSON_AddItemToArray(cr, detach(r, "comm"));
        cJSON_AddItemToArray(fr, detach(r, "flops"));
        cJSON *off = detach(r, "offload");
        if (ofr && off) {
            cJSON_AddNumberToObject(off, "rank", rank);
            cJSON_AddItemToArray(ofr, off);
        } else {
            cJSON_Delete(off);
        }
        cJSON *ops = detach(r, "ops");
        /* ops[]: one rank per stage (the stage's first), so that the names compare with the
         * prediction's ops of that stage; ops_per_rank[]: all of them */
        if (stage_seen && stage >= 0 && stage < ex->c.d.p && !stage_seen[stage]) {
            stage_seen[stage] = 1;
            cJSON *o;
            cJSON_ArrayForEach(o, ops)
            {
                cJSON *c = cJSON_Duplicate(o, 1);
                cJSON_AddNumberToObject(c, "rank", rank);
                cJSON_AddItemToArray(oa, c);
            }
        }
        if (opr) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "rank", rank);
            cJSON_AddNumberToObject(e, "stage", stage);
            cJSON_AddItemToObject(e, "ops", ops);
            cJSON_AddItemToArray(opr, e);
        } else {
            cJSON_Delete(ops);
        }
        cJSON *t = detach(r, "timeline");
        const cJSON *evs = cJSON_GetObjectItemCaseSensitive(t, "events");
        double end = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, evs)
        {
            double x = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "end_s"));
            if (x > end)
                end = x;
        }
        /* the run's bubble is the one of the rank that ends its pipeline last, as the
         * simulator reports the stage that ends the step */
        if (end > crit_end) {
            crit_end = end;
            crit_bubble = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(t, "bubble_fraction"));
        }
        if (tl)
            cJSON_AddItemToArray(tl, t);
        else
            cJSON_Delete(t);
    }
    free(stage_seen);

    moe_json(ex, j, ranks, n);

    cJSON *tm = cJSON_AddObjectToObject(j, "time");
    cJSON_AddNumberToObject(tm, "step_s_median", exec_median_step_s(ex));
    /* one stage: no pipeline, no bubble */
    cJSON_AddNumberToObject(tm, "bubble_fraction", ex->c.d.p > 1 ? crit_bubble : 0.0);
    cJSON_AddNumberToObject(tm, "timed_steps", ex->meter.timed_steps);
    /* "op": every op timed (the device waited for at its start and end); "step": once per
     * step, the ops' seconds 0 */
    cJSON_AddStringToObject(tm, "timing", ex->meter.step_timing ? "step" : "op");
    return j;
}

cJSON *exec_run_to_json(Exec *ex)
{
    cJSON *r = rank_json(ex);
    cJSON *j = run_json(ex, &r, 1);
    cJSON_Delete(r);
    return j;
}

int exec_run_gather_json(Exec *ex, cJSON **out, PxError *err)
{
    *out = NULL;
    cJSON *r = rank_json(ex);
    char *text = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    if (!text)
        return px_fail(err, PX_ERUNTIME, "out of memory writing rank %d's figures", ex->c.g.rank);
    char **all = NULL;
    int rc = comm_gather_text(ex->c.comm, text, &all, err);
    free(text);
    if (rc || !all)
        return rc;
    const int W = ex->c.g.world;
    cJSON **ranks = calloc((size_t)W, sizeof *ranks);
    for (int i = 0; i < W; i++) {
        if (ranks && !(ranks[i] = cJSON_Parse(all[i])))
            rc = px_fail(err, PX_ERUNTIME, "rank %d's figures do not parse", i);
        free(all[i]);
    }
    free(all);
    if (!ranks)
        return px_fail(err, PX_ERUNTIME, "out of memory gathering the ranks' figures");
    if (!rc)
        *out = run_json(ex, ranks, W);
    for (int i = 0; i < W; i++)
        cJSON_Delete(ranks[i]);
    free(ranks);
    return rc;
}

/* One line on token dropping: the copies the capacity dropped, in all and per MoE layer. */
static void print_dropped(const Exec *ex, const cJSON *run)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(run, "moe");
    if (!ex->c.d.moe || ex->moe.capacity <= 0 || !m)
        return;
    printf("token dropping (capacity factor %g, %d copies per expert and rank): %.0f copies "
           "dropped over %d step(s); per MoE layer",
           ex->c.spec.model.moe.capacity_factor, ex->moe.capacity, jnum(m, "dropped_total"),
           ex->hist.done);
    const cJSON *l;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(m, "layers"))
    printf(" %d: %.0f", (int)jnum(l, "layer"), jnum(l, "dropped_total"));
    printf("\n");
}

void exec_report_summary(Exec *ex, const cJSON *run)
{
    print_dropped(ex, run);
    if (!ex->pred.stages)
        printf("\nthe plan carries no prediction: nothing to set the measurements beside\n");
    else if (ex->c.g.world > 1 && run)
        summary_ranks(ex, run);
    else if (ex->c.g.world == 1)
        summary_one(ex);
}
