/* The report's header: the model, cluster, layout and the figures a team asks first (step time,
 * tokens/s, MFU, days and cost to train), with the date and the parallax commit that drew it, so
 * that a page read alone says what it is about. */
#include "reports/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "git_describe.h"

const char *rpt_commit(void) { return PX_GIT_DESCRIBE; }

void rpt_header_init(RptHeader *h)
{
    memset(h, 0, sizeof *h);
    snprintf(h->framework, sizeof h->framework, "Megatron-LM");
    h->step_s = h->tokens_per_s = h->mfu = h->tflops_per_gpu = h->bubble_fraction = NAN;
    h->measured_step_s = NAN;
}

static double num(const cJSON *j, const char *a, const char *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b)
        v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

int rpt_header_from_plan(RptHeader *h, const cJSON *plan_json, const cJSON *run, PxError *err)
{
    ModelPlan plan;
    int rc = model_plan_from_json(plan_json, "plan", &plan, err);
    if (rc)
        return rc;
    px_strlcpy(h->model, plan.spec.model.name, sizeof h->model);
    px_strlcpy(h->cluster, plan.profile.name, sizeof h->cluster);
    px_strlcpy(h->device, plan.profile.device.name, sizeof h->device);
    h->gpus = plan.gpus;
    h->cpu = prof_device_is_cpu(&plan.profile.device);
    h->node_devices = plan.profile.node_devices;
    h->spec = plan.spec;
    h->have_layout = 1;
    h->train_tokens = plan.spec.job.train_tokens;
    const cJSON *fw = cJSON_GetObjectItemCaseSensitive(plan_json, "framework");
    if (cJSON_IsString(fw) && fw->valuestring[0])
        px_strlcpy(h->framework, fw->valuestring, sizeof h->framework);
    const cJSON *pred = plan.prediction;
    h->step_s = num(pred, "time", "step_s");
    h->bubble_fraction = num(pred, "time", "bubble_fraction");
    h->tokens_per_s = num(pred, "throughput", "tokens_per_s");
    h->mfu = num(pred, "throughput", "mfu");
    h->tflops_per_gpu = num(pred, "throughput", "tflops_per_gpu");
    snprintf(h->basis, sizeof h->basis, "%s", pred ? "the plan's prediction" : "the plan (it carries no prediction)");
    if (run) {
        h->measured_step_s = num(run, "time", "step_s_median");
        if (isfinite(h->measured_step_s))
            snprintf(h->basis, sizeof h->basis, "the plan's prediction and the run's measured step");
    }
    snprintf(h->title, sizeof h->title, "%s on %s, %d %s%s", h->model, h->cluster, h->gpus,
             h->cpu ? "CPU rank" : "GPU", h->gpus == 1 ? "" : "s");
    model_plan_free(&plan);
    return PX_OK;
}

/* "tp 8 × pp 8 × dp 16" and what else the layout sets beyond the defaults. */
static void layout_text(char *buf, size_t cap, const ModelSpec *s)
{
    const ModelLayout *l = &s->layout;
    size_t n = (size_t)snprintf(buf, cap, "tp %d × pp %d × dp %d", l->tp, l->pp, l->dp);
    if (l->cp > 1 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, " × cp %d", l->cp);
    if (l->ep > 1 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, ", ep %d", l->ep);
    if (l->pp > 1 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; %s schedule", model_schedule_name(l->schedule));
    if (l->vpp > 1 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, ", %d model chunks per rank (vpp)", l->vpp);
    if (l->sp && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; sequence parallel");
    if (l->zero > 0 && n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; ZeRO-%d%s", l->zero, l->fsdp ? " (FSDP)" : "");
    else if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; no ZeRO");
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "; recompute %s", model_recompute_name(l->recompute));
    const int seq = s->job.seq_len ? s->job.seq_len : s->model.seq_len;
    if (n < cap)
        snprintf(buf + n, cap - n, "; micro-batch %d, global batch %d sequences of %d tokens",
                 s->job.micro_batch, s->job.global_batch, seq);
}

/* A count for people: "15T", "1.18M", "950". */
static const char *si(char *buf, size_t cap, double v)
{
    static const char *const suffix[] = {"", "K", "M", "B", "T", "P"};
    int k = 0;
    while (fabs(v) >= 1000 && k < 5) {
        v /= 1000;
        k++;
    }
    char num_text[32];
    rpt_fmt_sig(num_text, sizeof num_text, v, 3);
    snprintf(buf, cap, "%s%s", num_text, suffix[k]);
    return buf;
}

/* The rows that need a token budget: days and GPU-hours, then the cost. */
static void budget_rows(FILE *f, const RptHeader *h, double price, char *line, size_t cap)
{
    char a[32], b[32], c[32];
    if (!(h->train_tokens > 0) || !(h->tokens_per_s > 0)) {
        fputs("| days to train | not asked: give the token budget (`parallax plan --tokens 15T`, or "
              "`parallax report --tokens 15T`) |\n", f);
        line[0] = 0;
    } else {
        const double days = h->train_tokens / h->tokens_per_s / 86400.0;
        const double gpu_hours = days * 24.0 * h->gpus;
        fprintf(f, "| days to train | %s days for %s tokens (%s GPU-hours) |\n",
                rpt_fmt_sig(a, sizeof a, days, 3), si(b, sizeof b, h->train_tokens),
                si(c, sizeof c, gpu_hours));
        if (price > 0) {
            fprintf(f, "| cost to train | $%s at $%s per GPU-hour |\n", si(a, sizeof a, gpu_hours * price),
                    rpt_fmt_sig(b, sizeof b, price, 3));
            snprintf(line, cap, " · %s days, $%s to train", rpt_fmt_sig(c, sizeof c, days, 3),
                     si(a, sizeof a, gpu_hours * price));
        } else {
            snprintf(line, cap, " · %s days to train", rpt_fmt_sig(c, sizeof c, days, 3));
        }
    }
    if (!(price > 0))
        fputs("| cost to train | not priced: no cluster profile carries a price; give "
              "`parallax report --gpu-hour-price USD` |\n", f);
}

char *rpt_header_markdown(const RptHeader *h, double price, const char *date, const char *commit)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    char now[40], a[64], b[64], lay[400] = "", budget[128] = "";
    if (!date) {
        time_t t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(now, sizeof now, "%Y-%m-%d %H:%M UTC", &tm);
        date = now;
    }
    if (h->have_layout)
        layout_text(lay, sizeof lay, &h->spec);
    fputs("| figure | value |\n|---|---|\n", f);
    if (h->model[0])
        fprintf(f, "| model | %s |\n", h->model);
    if (h->cluster[0] && h->node_devices > 0)
        fprintf(f, "| cluster | %s: %s, %d per node |\n", h->cluster, h->device[0] ? h->device : "?",
                h->node_devices);
    else if (h->cluster[0])
        fprintf(f, "| cluster | %s: %s, one node |\n", h->cluster, h->device[0] ? h->device : "?");
    const char *per = h->cpu ? "CPU rank" : "GPU"; /* what one rank of the job is */
    if (h->gpus > 0)
        fprintf(f, "| %ss | %d |\n", per, h->gpus);
    if (lay[0])
        fprintf(f, "| layout | %s%s%s |\n", lay, h->note[0] ? "; " : "", h->note);
    if (h->have_layout) /* a run alone names no layout to export */
        fprintf(f, "| framework | %s (`parallax export` writes its settings, and those of the others) |\n",
                h->framework);
    if (isfinite(h->step_s)) {
        fprintf(f, "| step time | %s s predicted", rpt_fmt_sig(a, sizeof a, h->step_s, 3));
        if (isfinite(h->measured_step_s))
            fprintf(f, ", %s s measured (%+.1f%%)", rpt_fmt_sig(b, sizeof b, h->measured_step_s, 3),
                    100 * (h->measured_step_s - h->step_s) / h->step_s);
        fputs(" |\n", f);
    }
    if (isfinite(h->tokens_per_s))
        fprintf(f, "| tokens/s | %s (the whole job; %s per %s) |\n", si(a, sizeof a, h->tokens_per_s),
                si(b, sizeof b, h->gpus > 0 ? h->tokens_per_s / h->gpus : NAN), per);
    if (isfinite(h->mfu))
        fprintf(f, "| MFU | %.1f%% (model FLOPs, recompute not counted, over the dense 16-bit peak) |\n",
                100 * h->mfu);
    if (isfinite(h->tflops_per_gpu))
        fprintf(f, "| hardware TFLOP/s per %s | %s (recompute counted) |\n", per,
                rpt_fmt_sig(a, sizeof a, h->tflops_per_gpu, 3));
    if (isfinite(h->bubble_fraction))
        fprintf(f, "| pipeline bubble | %.1f%% of the busiest stage's compute time; %.1f%% of its pipeline time "
                   "idle |\n",
                100 * h->bubble_fraction, 100 * h->bubble_fraction / (1 + h->bubble_fraction));
    if (isfinite(h->step_s))
        budget_rows(f, h, price, budget, sizeof budget);
    fprintf(f, "| date | %s |\n| parallax | %s |\n", date, commit ? commit : rpt_commit());
    if (h->basis[0])
        fprintf(f, "| figures from | %s |\n", h->basis);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    /* the key figures in one line above the table */
    char *out = NULL;
    len = 0;
    f = open_memstream(&out, &len);
    if (!f) {
        free(text);
        return NULL;
    }
    if (isfinite(h->step_s) && h->gpus > 0 && lay[0]) {
        fprintf(f, "**tp %d × pp %d × dp %d", h->spec.layout.tp, h->spec.layout.pp, h->spec.layout.dp);
        if (h->spec.layout.vpp > 1)
            fprintf(f, " (vpp %d)", h->spec.layout.vpp);
        fprintf(f, " · step %s s · %s tokens/s", rpt_fmt_sig(a, sizeof a, h->step_s, 3),
                si(b, sizeof b, h->tokens_per_s));
        if (isfinite(h->mfu))
            fprintf(f, " · MFU %.1f%%", 100 * h->mfu);
        fprintf(f, "%s**\n\n", budget);
    }
    fputs(text, f);
    free(text);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}
