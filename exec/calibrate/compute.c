/* The compute part: on every rank of the part at once, the GEMMs at the op graphs' shapes, the
 * device's peak and bandwidth, and the op rates of real training steps (gemm.c, rates.c); the
 * ranks' figures averaged, because they ran side by side and shared caches and memory bandwidth
 * as a job of that many ranks does. Rank 0 prints the fits and writes the part's JSON, which
 * assemble reads. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "exec/calibrate/internal.h"

/* What the part measured: GEMM times, device figures, op samples and their fits. */
typedef struct {
    CalibShapes sh;
    double peak, bw;
    CalibSamples ss;
    int configs;
    CalibFit *fits;
    int n_fits;
} Measured;

static const KernBackend *pick_backend(const CalibOptions *o, PxError *err)
{
    if (!strcmp(o->backend, "cpu"))
        return kern_cpu();
    if (!strcmp(o->backend, "cuda")) {
        const KernBackend *k = kern_cuda();
        if (!k)
            px_fail(err, PX_EINPUT,
                    "--backend cuda: this build has no CUDA backend or no GPU is visible");
        return k;
    }
    px_fail(err, PX_EINPUT, "--backend: expected cpu or cuda, got '%s'", o->backend);
    return NULL;
}

/* Averages n doubles over the ranks (each rank passes its own; all get the mean). */
static int average(CommLayer *c, double *v, int n, PxError *err)
{
    if (comm_world(c) == 1 || n == 0)
        return PX_OK;
    int rc = comm_control(c, v, n, COMM_SUM, err);
    for (int i = 0; i < n && !rc; i++)
        v[i] /= comm_world(c);
    return rc;
}

/* Averages one double field (at `offset` in records of `stride` bytes) of n records over the
 * ranks, as average does for an array. */
static int average_field(CommLayer *c, void *records, size_t stride, size_t offset, int n,
                         PxError *err)
{
    if (comm_world(c) == 1 || n == 0)
        return PX_OK;
    double *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    char *base = records;
    for (int i = 0; i < n; i++)
        memcpy(&v[i], base + (size_t)i * stride + offset, sizeof v[i]);
    int rc = average(c, v, n, err);
    for (int i = 0; i < n && !rc; i++)
        memcpy(base + (size_t)i * stride + offset, &v[i], sizeof v[i]);
    free(v);
    return rc;
}

/* The GEMM shapes and the device's peak and bandwidth, every rank at once. */
static int measure_gemms(const CalibOptions *o, const KernBackend *k, CommLayer *c, int loud,
                         Measured *me, PxError *err)
{
    const int ranks = comm_world(c);
    const double t_start = px_now_s();
    int rc = calib_shapes_collect(o, &me->sh, err);
    if (rc)
        return rc;
    calib_say(loud, "calibrate: %d rank%s at once (%s backend): %d GEMM shapes of %s\n", ranks,
              ranks > 1 ? "s" : "", k->name, me->sh.n, o->models);
    if ((rc = comm_barrier(c, err)) || (rc = calib_shapes_time(o, k, &me->sh, err)) ||
        (rc = average_field(c, me->sh.s, sizeof *me->sh.s, offsetof(CalibShape, seconds),
                            me->sh.n, err)) ||
        (rc = comm_barrier(c, err)))
        return rc;
    double v[2];
    v[0] = calib_peak_flops(o, k); /* apart: an initialiser list would not fix their order */
    v[1] = calib_bandwidth(o, k);
    if ((rc = average(c, v, 2, err)))
        return rc;
    me->peak = v[0];
    me->bw = v[1];
    calib_say(loud,
              "  GEMMs timed in %.1f s; peak %.1f GFLOP/s (%s), stream bandwidth %.1f GB/s per "
              "rank\n",
              px_now_s() - t_start, me->peak / 1e9, px_dtype_name(k->act), me->bw / 1e9);
    return PX_OK;
}

/* With an even number of ranks, each calibration model's fused configurations once more, the
 * ranks together, with context parallelism 2 over a ring (p2p): its attention core runs as
 * blocks of s/4 tokens merged by their log-sum-exp, with messages in flight, and gets a rate
 * of its own ("hd16/ring"). A model that does not split so is passed over, said. */
static int measure_rings(const CalibOptions *o, CommLayer *c, int loud, const ProfCluster *base,
                         Measured *me, PxError *err)
{
    const int world = comm_world(c);
    if (world < 2 || world % 2)
        return PX_OK;
    const char *p = o->models;
    char model[128];
    int rc = PX_OK;
    while (!rc && calib_next_model(&p, model, sizeof model))
        for (int bi = 0; bi < CALIB_SIZES && !rc; bi++) {
            const int mbs = calib_mbs_sizes[bi];
            if (calib_quick_skips(o, 1, mbs) || (rc = comm_barrier(c, err)))
                continue;
            const double t0 = px_now_s();
            rc = calib_config_samples(o, base, model, mbs, 1, c, &me->sh, &me->ss, err);
            if (rc == PX_EINPUT) { /* the same on every rank: the layout does not take it */
                calib_say(loud, "  no ring for %s: %s\n", model, err->msg);
                rc = PX_OK;
                break;
            }
            me->configs++;
            if (!rc)
                calib_say(loud, "  trained %s, micro-batch %d, fused attention, cp 2 ring over "
                          "%d ranks: %.1f s\n", model, mbs, world, px_now_s() - t0);
        }
    return rc;
}

/* Training steps of each calibration configuration, every rank its own, and the fits of their
 * samples averaged over the ranks (every rank ran the same ops in the same order). */
static int measure_rates(const CalibOptions *o, CommLayer *c, int loud, Measured *me,
                         PxError *err)
{
    const char *p = o->models;
    char model[128];
    int rc = PX_OK;
    /* the base profile is read once, at the first configuration: a part that trains none
     * never needs it */
    ProfCluster base;
    int have_base = 0;
    while (!rc && calib_next_model(&p, model, sizeof model))
        for (int bi = 0; bi < CALIB_SIZES && !rc; bi++) {
            const int mbs = calib_mbs_sizes[bi];
            if (calib_quick_skips(o, 1, mbs))
                continue;
            for (int flash = 1; flash >= 0 && !rc; flash--) {
                if ((rc = comm_barrier(c, err)))
                    break;
                if (!have_base && !(rc = prof_cluster_load(o->base, NULL, 0, &base, err)))
                    have_base = 1;
                const double t0 = px_now_s();
                if (!rc)
                    rc = calib_config_samples(o, &base, model, mbs, flash, NULL, &me->sh,
                                              &me->ss, err);
                me->configs++;
                /* a configuration of a large model takes seconds to minutes: say each one */
                if (!rc)
                    calib_say(loud, "  trained %s, micro-batch %d, %s attention: %.1f s\n", model,
                              mbs, flash ? "fused" : "unfused", px_now_s() - t0);
            }
        }
    if (!rc && have_base)
        rc = measure_rings(o, c, loud, &base, me, err);
    if (have_base)
        prof_cluster_free(&base);
    if (!rc)
        rc = average_field(c, me->ss.s, sizeof *me->ss.s, offsetof(CalibSample, y), me->ss.n,
                           err);
    return rc ? rc : calib_fit_all(&me->ss, &me->fits, &me->n_fits, err);
}

/* --samples: every op sample as CSV, to look at the fits. */
static int write_samples(const char *path, const CalibSamples *ss, PxError *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return px_fail(err, PX_EINPUT, "--samples %s: cannot write: %s", path, strerror(errno));
    fprintf(f, "kind,phase,variant,flash,x,seconds,op\n");
    for (int i = 0; i < ss->n; i++)
        fprintf(f, "%s,%s,%s,%d,%.9g,%.9g,%s\n", ss->s[i].kind, ss->s[i].phase, ss->s[i].variant,
                ss->s[i].flash, ss->s[i].x, ss->s[i].y, ss->s[i].op);
    fclose(f);
    return PX_OK;
}

static void print_fits(const Measured *me, int loud)
{
    for (int i = 0; i < me->n_fits; i++) {
        const CalibFit *f = &me->fits[i];
        const int attn = !strcmp(f->kind, "attention");
        char what[64];
        snprintf(what, sizeof what, "%s %s %s%s", f->kind, f->phase, f->variant,
                 attn ? (f->flash ? " flash" : " plain") : "");
        char rate[32] = "-";
        if (f->rate < 1e18)
            snprintf(rate, sizeof rate, "%.3g", f->rate / 1e9);
        calib_say(loud, "    %-32s %4d points  %8s %s + %8.2f us  (rms %.1f us)\n", what,
                  f->points, rate, attn ? "GFLOP/s" : "GB/s   ", 1e6 * f->overhead_s,
                  1e6 * f->rms_abs);
    }
}

/* The part's JSON: what assemble reads (gemm rows and ops in the measured section's form). */
static cJSON *part_json(const CalibOptions *o, const Measured *me, const KernBackend *k, int ranks)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "part", "compute");
    cJSON_AddNumberToObject(j, "concurrency", ranks);
    cJSON_AddStringToObject(j, "backend", k->name);
    cJSON_AddStringToObject(j, "dtype", px_dtype_name(k->act));
    cJSON_AddNumberToObject(j, "peak_flops", me->peak);
    cJSON_AddNumberToObject(j, "memory_bandwidth", me->bw);
    cJSON_AddBoolToObject(j, "quick", o->quick);
    cJSON *g = cJSON_AddArrayToObject(j, "gemm");
    for (int i = 0; i < me->sh.n; i++) {
        const CalibShape *s = &me->sh.s[i];
        if (!(s->seconds > 0))
            continue;
        double v[5] = {(double)s->m, (double)s->n, (double)s->k, (double)s->batch, s->seconds};
        cJSON_AddItemToArray(g, cJSON_CreateDoubleArray(v, 5));
    }
    cJSON *ops = cJSON_AddArrayToObject(j, "ops");
    for (int i = 0; i < me->n_fits; i++) {
        const CalibFit *f = &me->fits[i];
        cJSON *op = cJSON_CreateObject();
        cJSON_AddStringToObject(op, "kind", f->kind);
        cJSON_AddStringToObject(op, "phase", f->phase);
        if (!strcmp(f->kind, "attention"))
            cJSON_AddBoolToObject(op, "flash", f->flash);
        if (f->variant[0])
            cJSON_AddStringToObject(op, "variant", f->variant);
        cJSON_AddNumberToObject(op, "rate", f->rate);
        cJSON_AddNumberToObject(op, "overhead_s", f->overhead_s);
        cJSON_AddNumberToObject(op, "points", f->points);
        cJSON_AddItemToArray(ops, op);
    }
    return j;
}

int calib_compute(const CalibOptions *o, CommLayer *world, PxError *err)
{
    const KernBackend *k = pick_backend(o, err);
    if (!k)
        return PX_EINPUT;
    const int rank0 = comm_rank(world) == 0, loud = rank0 && !o->quiet;
    Measured me;
    memset(&me, 0, sizeof me);
    int rc = measure_gemms(o, k, world, loud, &me, err);
    const double t_ops = px_now_s();
    if (!rc)
        rc = measure_rates(o, world, loud, &me, err);
    if (!rc && rank0 && o->samples)
        rc = write_samples(o->samples, &me.ss, err);
    if (!rc) {
        calib_say(loud, "  %d training configurations, %d op samples in %.1f s; fitted rates:\n",
                  me.configs, me.ss.n, px_now_s() - t_ops);
        print_fits(&me, loud);
    }
    if (!rc && rank0) {
        cJSON *j = part_json(o, &me, k, comm_world(world));
        rc = px_json_write_file(o->output, j, err);
        cJSON_Delete(j);
    }
    free(me.sh.s);
    free(me.ss.s);
    free(me.fits);
    return rc;
}

int calib_probe_part(const CalibOptions *o, PxError *err)
{
    const KernBackend *k = pick_backend(o, err);
    if (!k)
        return PX_EINPUT;
    const double peak = calib_peak_flops(o, k), bw = calib_bandwidth(o, k);
    if (!(peak > 0 && bw > 0))
        return px_fail(err, PX_ERUNTIME, "the probe's buffers could not be allocated");
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "part", "probe");
    cJSON_AddStringToObject(j, "backend", k->name);
    cJSON_AddNumberToObject(j, "peak_flops", peak);
    cJSON_AddNumberToObject(j, "memory_bandwidth", bw);
    cJSON_AddBoolToObject(j, "quick", o->quick);
    int rc = px_json_write_file(o->output, j, err);
    cJSON_Delete(j);
    return rc;
}
