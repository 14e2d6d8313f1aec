/* Op rates from real training steps: each calibration configuration trains a few steps on this
 * rank alone, every op timed under its op-graph name by the trainer itself; an op's seconds per
 * call (its median step's) against its size are the samples, and per kind of op, phase and
 * variant a fixed cost and a rate are fitted to them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec/calibrate/internal.h"
#include "exec/train/train.h"

static int samples_add(CalibSamples *ss, const CalibSample *s)
{
    if (ss->n == ss->cap) {
        int cap = ss->cap ? 2 * ss->cap : 256;
        CalibSample *p = realloc(ss->s, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        ss->s = p;
        ss->cap = cap;
    }
    ss->s[ss->n++] = *s;
    return 0;
}

/* A plan of one configuration on the base profile (o->base's, loaded), without a prediction:
 * only the measurements count. world > 1: context parallelism 2 over a ring (p2p), the world's
 * other ranks data parallel, each rank's micro-batch mbs. */
static int config_plan(const CalibOptions *o, const ProfCluster *base, const char *model, int mbs,
                       int flash, int steps, int world, ModelPlan *plan, PxError *err)
{
    ModelSpec s;
    ModelDims d;
    int rc = calib_spec(model, 1, mbs, flash, calib_precision(o), &s, &d, err);
    if (rc)
        return rc;
    if (world > 1) {
        s.layout.cp = 2;
        s.layout.cp_comm = MODEL_CP_COMM_P2P;
        s.layout.dp = world / 2;
        s.job.global_batch = mbs * s.layout.dp;
        if ((rc = model_spec_check(&s, world, &d, err)))
            return rc;
    }
    s.job.steps = steps;
    /* the cpu profile prices bf16 as the CPU's 16-bit kernels run it (widened to fp32): no
     * base for timing the CUDA backend's bf16 */
    if (s.job.precision != PX_FP32 && prof_device_is_cpu(&base->device))
        return px_fail(err, PX_EINPUT,
                       "device %s is a CPU: the CUDA backend's %s calibration needs a GPU "
                       "profile as --base",
                       base->device.name, px_dtype_name(s.job.precision));
    if (prof_peak_flops(&base->device, s.job.precision) <= 0)
        return px_fail(err, PX_EINPUT, "device %s has no %s peak FLOP/s: choose another precision",
                       base->device.name, px_dtype_name(s.job.precision));
    return model_plan_init(plan, &s, o->base, base, world > 1 ? world : 1, NULL, err);
}

/* Runs `steps` steps and leaves in per[o * (steps - 1) + t] op o's seconds in timed step t: every
 * step after the first, from the trainer's running averages. *n_ops gets the ops reported. */
static int time_steps(Exec *ex, int steps, double *per, double *prev, int *n_ops, PxError *err)
{
    const int graph_ops = exec_graph(ex)->count, timed = steps - 1;
    int rc = PX_OK;
    *n_ops = 0;
    for (int i = 0; i < steps && !rc; i++) {
        ExecStepStats st;
        if ((rc = exec_step(ex, i, &st, err)) || i == 0)
            continue;
        const ExecOpReport *rep = exec_ops(ex, n_ops);
        for (int op = 0; op < *n_ops && op < graph_ops; op++) {
            double cum = rep[op].seconds * i; /* i timed steps so far */
            per[(size_t)op * timed + (i - 1)] = cum - prev[op];
            prev[op] = cum;
        }
    }
    return rc;
}

/* Each op's median over the timed steps into med[op]: a step disturbed by another process
 * counts once. */
static void op_medians(const double *per, int n_ops, int timed, double *med)
{
    for (int op = 0; op < n_ops; op++)
        med[op] = px_median(per + (size_t)op * timed, timed);
}

/* The sample of op i of the configuration's graph, seconds per call `y`; 0 when it gives none
 * (communication, an op not run, a matmul with a GEMM that was not timed). */
static int op_sample(Exec *ex, int i, const ExecOpReport *rep, double y, const char *model,
                     int mbs, const CalibShapes *sh, CalibSample *smp)
{
    const ModelOp *op = &exec_graph(ex)->op[i];
    const int ring = exec_spec(ex)->layout.cp > 1;
    /* of a ring, the attention core only: the other ops are the whole sequence's, halved */
    if (op->kind == MODEL_OP_COMM || rep->calls <= 0 || y <= 0 ||
        (ring && op->kind != MODEL_OP_ATTENTION))
        return 0;
    memset(smp, 0, sizeof *smp);
    snprintf(smp->op, sizeof smp->op, "%s/b%d%s/%s", model, mbs, ring ? "/cp2" : "", rep->name);
    ModelOpKey key;
    model_op_key(exec_spec(ex), exec_dims(ex), op, &key);
    px_strlcpy(smp->kind, key.kind, sizeof smp->kind);
    px_strlcpy(smp->phase, key.phase, sizeof smp->phase);
    px_strlcpy(smp->variant, key.variant, sizeof smp->variant);
    smp->flash = key.flash;
    smp->x = key.x;
    smp->y = y / rep->calls;
    if (op->kind != MODEL_OP_MATMUL)
        return 1;
    /* what the measured GEMMs leave: bias, RoPE, dropout, residual add */
    for (int j = 0; j < op->n_gemm; j++) {
        const CalibShape *m = calib_shape_find(sh, &op->gemm[j]);
        if (!m)
            return 0;
        smp->y -= m->seconds;
    }
    return 1;
}

int calib_config_samples(const CalibOptions *o, const ProfCluster *base, const char *model,
                         int mbs, int flash, CommLayer *ring, const CalibShapes *sh,
                         CalibSamples *ss, PxError *err)
{
    const int steps = o->quick ? 4 : 10, timed = steps - 1;
    const int world = ring ? comm_world(ring) : 1;
    ModelPlan plan;
    int rc = config_plan(o, base, model, mbs, flash, steps, world, &plan, err);
    if (rc)
        return rc;
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.quiet = 1;
    opt.steps = steps;
    opt.plan_path = model;
    opt.backend = strcmp(o->backend, "cuda") ? EXEC_BACKEND_CPU : EXEC_BACKEND_CUDA;
    CommLayer *layer = NULL;
    const char *note = NULL; /* the job's own choice of layer: MPI, NCCL or staged */
    if (ring && (rc = comm_for_job(&plan.spec, 0, opt.backend == EXEC_BACKEND_CUDA, &layer, &note,
                                   err))) {
        model_plan_free(&plan);
        return rc;
    }
    opt.comm = layer;
    Exec *ex = NULL;
    if ((rc = exec_init(&ex, &plan, &opt, err))) {
        comm_free(layer);
        model_plan_free(&plan);
        return rc;
    }
    const int graph_ops = exec_graph(ex)->count;
    double *per = calloc((size_t)graph_ops * (size_t)timed + 1, sizeof *per);
    double *prev = calloc((size_t)graph_ops + 1, sizeof *prev);
    int n = 0;
    if (!per || !prev)
        rc = px_fail(err, PX_ERUNTIME, "out of memory timing ops");
    if (!rc && !(rc = time_steps(ex, steps, per, prev, &n, err)))
        op_medians(per, n, timed, prev);
    const ExecOpReport *rep = rc ? NULL : exec_ops(ex, &n);
    for (int i = 0; i < n && !rc; i++) {
        CalibSample smp;
        if (op_sample(ex, i, &rep[i], prev[i], model, mbs, sh, &smp) && samples_add(ss, &smp))
            rc = px_fail(err, PX_ERUNTIME, "out of memory collecting op samples");
    }
    free(per);
    free(prev);
    exec_free(ex);
    comm_free(layer);
    model_plan_free(&plan);
    return rc;
}

/* y = a + x / rate by least squares on relative errors (weights 1/y^2), so that small and large
 * ops count alike; through the origin when the intercept comes out negative or the sizes are
 * too close to tell, a constant when the slope comes out negative (y does not grow with x over
 * the sizes seen). */
static CalibFit fit_samples(const CalibSample *s, const int *idx, int n)
{
    CalibFit f;
    memset(&f, 0, sizeof f);
    px_strlcpy(f.kind, s[idx[0]].kind, sizeof f.kind);
    px_strlcpy(f.phase, s[idx[0]].phase, sizeof f.phase);
    px_strlcpy(f.variant, s[idx[0]].variant, sizeof f.variant);
    f.flash = s[idx[0]].flash;
    f.points = n;
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, xmin = INFINITY, xmax = 0;
    for (int i = 0; i < n; i++) {
        const CalibSample *p = &s[idx[i]];
        double y = p->y > 1e-9 ? p->y : 1e-9, w = 1.0 / (y * y);
        sw += w;
        sx += w * p->x;
        sy += w * p->y;
        sxx += w * p->x * p->x;
        sxy += w * p->x * p->y;
        if (p->x < xmin)
            xmin = p->x;
        if (p->x > xmax)
            xmax = p->x;
    }
    /* sizes within a factor 1.5 cannot separate a fixed cost from a rate: the rate alone,
     * which carries over to other sizes (an optimizer over another stage's parameters) */
    const int spread = xmax > 1.5 * xmin;
    double a = 0, b = 0;
    double det = sw * sxx - sx * sx;
    if (spread && det > 0) {
        b = (sw * sxy - sx * sy) / det;
        a = (sy - b * sx) / sw;
    }
    if (!spread || b <= 0 || a < 0) {
        if (sxx > 0 && sxy > 0 && !(spread && b <= 0)) {
            a = 0;
            b = sxy / sxx; /* through the origin */
        } else {
            a = sy / sw > 0 ? sy / sw : 0;
            b = 0; /* a constant */
        }
    }
    f.overhead_s = a;
    f.rate = b > 0 ? 1.0 / b : 1e18;
    double e2 = 0;
    for (int i = 0; i < n; i++) {
        const CalibSample *p = &s[idx[i]];
        double pred = a + b * p->x;
        e2 += (pred - p->y) * (pred - p->y);
    }
    f.rms_abs = sqrt(e2 / n);
    return f;
}

static int same_rate(const CalibSample *a, const CalibSample *b)
{
    return !strcmp(a->kind, b->kind) && !strcmp(a->phase, b->phase) && a->flash == b->flash &&
           !strcmp(a->variant, b->variant);
}

int calib_fit_all(const CalibSamples *ss, CalibFit **out, int *n_out, PxError *err)
{
    const size_t n_alloc = (size_t)(ss->n > 0 ? ss->n : 1);
    CalibFit *fits = calloc(n_alloc, sizeof *fits);
    int *idx = calloc(n_alloc, sizeof *idx);
    char *done = calloc(n_alloc, 1);
    if (!fits || !idx || !done) {
        free(fits);
        free(idx);
        free(done);
        return px_fail(err, PX_ERUNTIME, "out of memory fitting op rates");
    }
    int nf = 0;
    for (int i = 0; i < ss->n; i++) {
        if (done[i])
            continue;
        int n = 0;
        for (int j = i; j < ss->n; j++)
            if (!done[j] && same_rate(&ss->s[i], &ss->s[j])) {
                idx[n++] = j;
                done[j] = 1;
            }
        fits[nf++] = fit_samples(ss->s, idx, n);
    }
    free(idx);
    free(done);
    *out = fits;
    *n_out = nf;
    return PX_OK;
}
