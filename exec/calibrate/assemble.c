/* The assemble part: the base cluster profile with the parts' measurements as its `measured`
 * section (and the device's peak and bandwidth replaced by the measured ones on the generic CPU
 * device, or its efficiencies set from them otherwise), written through profiles/' own writer,
 * checked to load as a profile and written atomically. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "exec/calibrate/internal.h"

/* What the parts say. */
typedef struct {
    ProfMeasured *m;    /* the compute parts' GEMM points and op rates */
    ProfMeasured *coll; /* the last comm part's collectives; NULL: none */
    double peak, bw;    /* the device figures of the fewest ranks at once: a rank alone */
    int quick;          /* they were measured by --quick */
    int max_c, min_c;   /* the most and fewest ranks at once */
} Parts;

/* Reads `key` of a part (a reference: the part keeps it) as a measured section whose entries
 * ran `concurrency` ranks at once, so that profiles/ reads it as it reads a profile. */
static int part_section(const cJSON *part, const char *path, const char *const *keys,
                        int concurrency, ProfMeasured **out, PxError *err)
{
    cJSON *me = cJSON_CreateObject();
    if (!me)
        return px_fail(err, PX_ERUNTIME, "out of memory reading %s", path);
    if (concurrency > 0)
        cJSON_AddNumberToObject(me, "ranks", concurrency);
    for (const char *const *k = keys; *k; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(part, *k);
        if (v)
            cJSON_AddItemReferenceToObject(me, *k, (cJSON *)v);
    }
    char where[1100];
    snprintf(where, sizeof where, "%s:", path);
    int rc = prof_measured_from_json(me, where, out, err);
    cJSON_Delete(me);
    return rc;
}

/* A compute part: its GEMM rows and op rates, with its concurrency as theirs. */
static int read_compute(const cJSON *part, const char *path, Parts *a, PxError *err)
{
    static const char *const keys[] = {"gemm", "ops", NULL};
    int c = 1;
    int rc = px_json_int(part, path, "concurrency", 1, 1, 1 << 20, &c, err);
    if (rc)
        return rc;
    if (c > a->max_c)
        a->max_c = c;
    if (c < a->min_c) {
        a->min_c = c;
        a->peak = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(part, "peak_flops"));
        a->bw = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(part, "memory_bandwidth"));
        a->quick = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(part, "quick"));
    }
    ProfMeasured *pm = NULL;
    if (!(rc = part_section(part, path, keys, c, &pm, err)))
        rc = prof_measured_append(a->m, pm, err);
    prof_measured_free(pm);
    return rc;
}

/* Every part's file into a; the last comm part's collectives count. */
static int read_parts(const CalibOptions *o, Parts *a, PxError *err)
{
    static const char *const coll_keys[] = {"collectives", NULL};
    int rc = PX_OK;
    for (int i = 0; i < o->n_parts && !rc; i++) {
        cJSON *p = px_json_read_file(o->parts[i], err);
        if (!p)
            return PX_EINPUT;
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(p, "part");
        if (cJSON_IsString(kind) && !strcmp(kind->valuestring, "compute")) {
            rc = read_compute(p, o->parts[i], a, err);
        } else if (cJSON_IsString(kind) && !strcmp(kind->valuestring, "comm")) {
            prof_measured_free(a->coll);
            a->coll = NULL;
            rc = part_section(p, o->parts[i], coll_keys, 0, &a->coll, err);
        } else {
            rc = px_fail(err, PX_EINPUT, "%s: not a calibration part", o->parts[i]);
        }
        cJSON_Delete(p);
    }
    if (!rc && !(a->peak > 0 && a->bw > 0))
        rc = px_fail(err, PX_EINPUT, "no compute part among the calibration parts");
    return rc;
}

/* The measured device figures into the base profile's device, and the sources note that says
 * so. */
static void set_device(ProfCluster *base, const Parts *a, const char *host, const char *date,
                       char *note, size_t cap)
{
    ProfDevice *d = &base->device;
    if (!strcmp(d->name, "cpu")) {
        /* a generic CPU profile has no data-sheet peak: the measured ones replace it */
        d->peak_fp32 = a->peak;
        /* the CPU's 16-bit kernels widen to fp32 and run the same sgemm (kern_cpu_with) */
        d->peak_bf16 = d->peak_fp16 = a->peak;
        d->memory_bandwidth = a->bw;
        d->matmul_eff = 1.0;
        d->memory_eff = d->memory_attn_eff = 1.0;
        snprintf(note, cap,
                 "peak_flops.fp32 (bf16 and fp16 the same) and memory_bandwidth: measured by "
                 "parallax calibrate on %s "
                 "(%s): a %d^3 sgemm GEMM's best rate and a streaming add's bandwidth, one rank",
                 host, date, a->quick ? 384 : 1024);
        return;
    }
    /* a data-sheet device keeps its peak: the measurement sets the efficiencies */
    const int bf16 = d->peak_bf16 > 0;
    const double p0 = prof_peak_flops(d, bf16 ? PX_BF16 : PX_FP32);
    if (p0 > 0)
        d->matmul_eff = a->peak / p0 < 1 ? a->peak / p0 : 1;
    if (d->memory_bandwidth > 0)
        d->memory_eff = a->bw / d->memory_bandwidth < 1 ? a->bw / d->memory_bandwidth : 1;
    /* one streaming measurement: the attention core's streams are timed as ops of their own */
    d->memory_attn_eff = d->memory_eff;
    snprintf(note, cap,
             "efficiency.matmul and .memory: measured by parallax calibrate on %s (%s): "
             "%.4g FLOP/s %s GEMM, %.4g B/s streaming, against the data sheet",
             host, date, a->peak, bf16 ? "bf16" : "fp32", a->bw);
}

/* Sets o[key], replacing what is there. */
static void set_item(cJSON *o, const char *key, cJSON *v)
{
    if (cJSON_GetObjectItemCaseSensitive(o, key))
        cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else
        cJSON_AddItemToObject(o, key, v);
}

/* The profile's text (with its trailing newline) into *out once it loads as a profile:
 * nothing is replaced by a file that would not. */
static int checked_text(const cJSON *prof, const char *origin, char **out, PxError *err)
{
    char *text = cJSON_Print(prof);
    if (!text)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    ProfCluster check;
    int rc = prof_cluster_parse(text, origin, &check, err);
    if (rc) {
        free(text);
        return rc;
    }
    prof_cluster_free(&check);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (t2) {
        text = t2;
        text[n] = '\n';
        text[n + 1] = '\0';
    }
    *out = text;
    return PX_OK;
}

/* The profile: the base with the device figures and the measured section, its description
 * and sources saying where and when. */
static int write_profile(const CalibOptions *o, ProfCluster *base, const Parts *a,
                         const char *host, const char *date, PxError *err)
{
    char desc[160], note[320];
    set_device(base, a, host, date, note, sizeof note);
    cJSON *prof = prof_cluster_to_json(base);
    snprintf(desc, sizeof desc, "%s, calibrated on %s by parallax calibrate (%d rank%s at most)",
             host, date, a->max_c, a->max_c > 1 ? "s" : "");
    set_item(prof, "description", cJSON_CreateString(desc));
    cJSON *sources = cJSON_GetObjectItemCaseSensitive(prof, "sources");
    if (!sources)
        sources = cJSON_AddObjectToObject(prof, "sources");
    set_item(sources, "calibration", cJSON_CreateString(note));
    char *text = NULL;
    int rc = checked_text(prof, o->output, &text, err);
    if (!rc)
        rc = px_write_file_atomic(o->output, text, err);
    free(text);
    cJSON_Delete(prof);
    return rc;
}

int calib_assemble(const CalibOptions *o, PxError *err)
{
    ProfCluster base;
    int rc = prof_cluster_load(o->base, NULL, 0, &base, err);
    if (rc)
        return rc;
    prof_measured_free(base.measured);
    base.measured = NULL;
    Parts a = {calloc(1, sizeof(ProfMeasured)), NULL, 0, 0, 0, 1, 1 << 30};
    if (!a.m)
        rc = px_fail(err, PX_ERUNTIME, "out of memory");
    if (!rc)
        rc = read_parts(o, &a, err);
    char host[64] = "unknown", date[32];
    gethostname(host, sizeof host - 1);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%d", &tm);
    if (!rc) {
        px_strlcpy(a.m->host, host, sizeof a.m->host);
        px_strlcpy(a.m->date, date, sizeof a.m->date);
        a.m->ranks = a.max_c;
        a.m->peak_flops = a.peak;
        a.m->memory_bandwidth = a.bw;
        a.m->quick = a.quick;
        if (a.coll)
            rc = prof_measured_append(a.m, a.coll, err);
    }
    if (!rc) {
        base.measured = a.m; /* the base owns it now */
        a.m = NULL;
        rc = write_profile(o, &base, &a, host, date, err);
    }
    if (!rc && !o->quiet)
        printf("calibrate: wrote %s (%s, %d GEMM shapes, %d op rates, %d collectives)\n",
               o->output, host, base.measured->n_gemm, base.measured->n_ops,
               base.measured->n_coll);
    prof_measured_free(a.m);
    prof_measured_free(a.coll);
    prof_cluster_free(&base);
    return rc;
}
