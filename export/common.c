/* What several exports share: the command-line printer, the job's nodes, Megatron-Core's ways
 * of saying an uneven pipeline split, the notes that read alike in every format (GPipe, a
 * routing imbalance) and when FP8-only weights are expressible. Called by the format files
 * (megatron.c, nemo.c, bridge.c, titan.c, ...); it calls none of them. */
#include "export/internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void export_vflag(FILE *f, const char *end, const char *name, const char *fmt, va_list ap)
{
    fprintf(f, "    %s", name);
    if (fmt) {
        fputc(' ', f);
        vfprintf(f, fmt, ap);
    }
    fputs(end, f);
}

int export_node_size(const ModelPlan *p, int *nodes)
{
    int per_node = prof_node_size(&p->profile, p->gpus);
    if (per_node > p->gpus)
        per_node = p->gpus;
    *nodes = (p->gpus + per_node - 1) / per_node;
    return per_node;
}

const char *export_bool(int b) { return b ? "true" : "false"; }

double export_ratio(double a, double b)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.12g", b != 0 ? a / b : 0);
    return strtod(buf, NULL);
}

const char *export_router_score(const ModelMoe *m)
{
    return m->score == MODEL_ROUTER_SIGMOID ? "sigmoid" : "softmax";
}

void export_imbalance_note(FILE *f, const ModelPlan *p, const char *what)
{
    const ModelJob *j = &p->spec.job;
    if (p->spec.model.moe.experts > 0 && j->moe_imbalance > 1.0 && !j->moe_force_balance)
        fprintf(f, "# planned for a routing imbalance of %g (the busiest EP rank's tokens over the balanced\n"
                   "# share): a planning assumption, not a %s\n",
                j->moe_imbalance, what);
}

/* The differences, "a; b; c" into buf: 0 when none (or the target's settings cannot be read) */
static int framework_differences(const ModelPlan *p, ModelFramework runs_on, char *buf, size_t cap)
{
    ModelSpec here = p->spec, there = p->spec;
    there.job.framework = runs_on;
    ModelDims dh, dt;
    PxError err = {0};
    if (model_spec_check(&here, p->gpus, &dh, &err) || model_spec_check(&there, p->gpus, &dt, &err))
        return 0;
    const char *plan_fw = model_framework_name(p->spec.job.framework);
    const char *to = model_framework_name(runs_on);
    size_t n = 0;
    buf[0] = '\0';
    if (dh.recompute_op != dt.recompute_op)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s recomputes `selective` %s (%s: %s)",
                              n ? "; " : "", to, dt.recompute_op ? "op by op" : "as the attention core",
                              plan_fw, dh.recompute_op ? "op by op" : "the attention core");
    if (here.layout.overlap_dp != there.layout.overlap_dp && p->spec.layout.dp > 1)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0,
                              "%s%s %s data-parallel communication (%s: %s)", n ? "; " : "", to,
                              there.layout.overlap_dp ? "always overlaps" : "does not overlap", plan_fw,
                              here.layout.overlap_dp ? "overlapped" : "not overlapped");
    if (dh.eager_norms != dt.eager_norms)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s runs the norms %s (%s: %s)",
                              n ? "; " : "", to,
                              dt.eager_norms ? "as eager modules, uncompiled" : "as fused kernels",
                              plan_fw, dh.eager_norms ? "eager" : "fused");
    return n > 0;
}

void export_framework_note(FILE *f, const ModelPlan *p, ModelFramework runs_on)
{
    char diff[600], text[1200];
    if (p->spec.job.framework == runs_on || !framework_differences(p, runs_on, diff, sizeof diff))
        return;
    const char *plan_fw = model_framework_name(p->spec.job.framework);
    const char *to = model_framework_name(runs_on);
    snprintf(text, sizeof text,
             "the plan was priced as %s runs it (training.framework), and %s runs it otherwise: %s. "
             "Its predicted step is %s's: plan with --framework %s for %s's prediction and ranking",
             plan_fw, to, diff, plan_fw, to, to);
    if (!f) {
        px_warn("%s", text);
        return;
    }
    /* "# WARNING: " then the text, broken at spaces into lines of at most 100 */
    const char *s = text;
    int first = 1;
    while (*s) {
        const int room = first ? 100 - 11 : 100 - 2;
        int len = (int)strlen(s);
        if (len > room) {
            len = room;
            while (len > 0 && s[len] != ' ')
                len--;
            if (len == 0)
                len = room;
        }
        fprintf(f, "# %s%.*s\n", first ? "WARNING: " : "", len, s);
        s += len;
        while (*s == ' ')
            s++;
        first = 0;
    }
}

const char *export_cp_comm_name(ModelCpComm c)
{
    static const char *const names[] = {"p2p", "all_gather", "a2a"};
    return (unsigned)c < 3 ? names[c] : "p2p";
}

/* An uneven split as Megatron-Core takes it: the first and/or the last stage's layers given
 * (--decoder-first/last-pipeline-num-layers), the other stages sharing the rest evenly
 * (get_transformer_layer_offset). *first and *last get -1 when not needed. Returns 0 when the
 * split is not of that form: its middle stages differ. */
int export_megatron_split(const ModelLayout *l, int *first, int *last)
{
    const int p = l->n_stage_layers, *n = l->stage_layers;
    *first = *last = -1;
    /* with chunks, the first/last counts split each end stage's chunks evenly: a layout string
     * says the rest */
    if (l->vpp > 1 || p < 2)
        return 0;
    if (p == 2) {
        *first = n[0];
        *last = n[1];
        return 1;
    }
    for (int i = 2; i < p - 1; i++)
        if (n[i] != n[1])
            return 0;
    if (n[0] != n[1])
        *first = n[0];
    if (n[p - 1] != n[1])
        *last = n[p - 1];
    return 1;
}

/* GPipe (every forward, then every backward) is not a schedule Megatron-LM, NeMo or
 * Megatron-Bridge offer: their non-interleaved pipeline is 1F1B. */
void export_gpipe_note(FILE *f, const ModelLayout *l)
{
    if (l->schedule == MODEL_SCHED_GPIPE && l->pp > 1)
        fprintf(f, "# NOT EXPRESSIBLE: the plan's GPipe schedule; Megatron runs 1F1B here, with the same bubble and\n"
                   "# fewer activations in flight (plan with --schedule 1f1b for its exact prediction)\n");
}

/* Megatron-Core's experimental --pipeline-model-parallel-layout for a split whose middle stages
 * differ: "Et*2|t*3|tL", the stages' decoder layers ('t'), the embedding first ('E'), the loss
 * last ('L') and the multi-token prediction modules, which a split given as layers per stage
 * places on the last stage, just before the loss ('m' each: PipelineParallelLayerLayout.
 * validate_layer_layout counts them against --mtp-num-layers). A plan's own layout string goes
 * as given (export_megatron_pipeline), a standalone "m|L" included. */
void export_megatron_layout(char *buf, size_t cap, const ModelLayout *l, int mtp)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < l->n_stage_layers && n < cap; i++) {
        const int k = l->stage_layers[i];
        int w = snprintf(buf + n, cap - n, "%s%s%s", i ? "|" : "", i == 0 ? "E" : "",
                         k > 1 ? "t*" : k == 1 ? "t" : "");
        if (w < 0)
            return;
        n += (size_t)w;
        if (k > 1 && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%d", k);
    }
    for (int i = 0; i < mtp && n + 1 < cap; i++)
        buf[n++] = 'm';
    if (n < cap)
        snprintf(buf + n, cap - n, "L");
}

int export_megatron_pipeline(const ModelPlan *p, const ModelDims *d, ExportMegatronSplit *out)
{
    const ModelLayout *l = &p->spec.layout;
    memset(out, 0, sizeof *out);
    out->first = out->last = -1;
    if (l->pp_layout[0]) {
        snprintf(out->layout, sizeof out->layout, "%s", l->pp_layout);
        return 1;
    }
    if (l->embed_in_split || l->loss_in_split) {
        out->embed = l->embed_in_split;
        out->loss = l->loss_in_split;
        return 1;
    }
    if (l->first_stage_layers || l->last_stage_layers) {
        out->first = l->first_stage_layers > 0 ? l->first_stage_layers : -1;
        out->last = l->last_stage_layers > 0 ? l->last_stage_layers : -1;
        return 1;
    }
    if (!d->uneven)
        return 0;
    if (!export_megatron_split(l, &out->first, &out->last))
        export_megatron_layout(out->layout, sizeof out->layout, l, p->spec.model.mtp_layers);
    return 1;
}

/* --fp8-param-gather and its equivalents: FP8-only weights, which Megatron takes only with the
 * distributed optimizer or FSDP (ZeRO 1 and up). */
int export_fp8_param_gather_ok(const ModelPlan *p)
{
    return p->spec.job.fp8_param_gather && p->spec.layout.zero >= 1;
}

