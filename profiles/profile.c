/* Device and cluster profiles: loading, device resolution, overrides. */
/* realpath */
#define _XOPEN_SOURCE 700
#include "profiles/profile.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const PxEmbedded prof_device_data[];
extern const int prof_device_data_count;
extern const PxEmbedded prof_cluster_data[];
extern const int prof_cluster_data_count;

int prof_device_count(void) { return prof_device_data_count; }
const char *prof_device_name(int i) { return i >= 0 && i < prof_device_data_count ? prof_device_data[i].name : NULL; }
int prof_cluster_count(void) { return prof_cluster_data_count; }
const char *prof_cluster_name(int i) { return i >= 0 && i < prof_cluster_data_count ? prof_cluster_data[i].name : NULL; }

/* A name with a slash or a .json suffix is a file; anything else is looked up built-in. */
static int looks_like_path(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 5 && strcmp(s + n - 5, ".json") == 0);
}

static cJSON *load_json(const char *name_or_path, const PxEmbedded *table, int count,
                        const char *what, const char *lister, char *origin, size_t cap,
                        PxError *err)
{
    if (!looks_like_path(name_or_path)) {
        for (int i = 0; i < count; i++) {
            if (strcmp(table[i].name, name_or_path) == 0) {
                snprintf(origin, cap, "%s.json", table[i].name);
                return px_json_parse(table[i].text, origin, err);
            }
        }
        if (!px_path_exists(name_or_path)) {
            px_fail(err, PX_EINPUT, "unknown %s '%s' ('%s' lists the built-in ones)", what,
                    name_or_path, lister);
            return NULL;
        }
    }
    px_strlcpy(origin, name_or_path, cap);
    return px_json_read_file(name_or_path, err);
}

static int parse_device(const cJSON *j, const char *where, ProfDevice *d, PxError *err)
{
    static const char *const known[] = {"schema_version", "name", "description", "memory_bytes",
                                        "peak_flops", "memory_bandwidth", "sm_count",
                                        "runtime_bytes", "fp8_tn_only", "efficiency",
                                        "sources", NULL};
    static const char *const known_eff[] = {"matmul", "matmul_fp8", "matmul_k_half",
                                            "misaligned", "tiles", "clock_headroom", "memory",
                                            "memory_attention", "attention_fwd", "attention_bwd",
                                            "attention_fa2_fwd", "attention_fa2_bwd",
                                            "kernel_overhead_s", "host_sync_s", NULL};
    static const char *const known_peak[] = {"fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8",
                                             NULL};
    memset(d, 0, sizeof *d);
    px_json_warn_unknown(j, where, known);
    int rc, version = 1;
    const cJSON *peak;
    char pw[256];
    if ((rc = px_json_int(j, where, "schema_version", 0, 1, 1, &version, err)) ||
        (rc = px_json_string(j, where, "name", 1, d->name, sizeof d->name, err)) ||
        (rc = px_json_string(j, where, "description", 0, d->description, sizeof d->description, err)) ||
        (rc = px_json_u64(j, where, "memory_bytes", 1, &d->memory_bytes, err)) ||
        (rc = px_json_double(j, where, "memory_bandwidth", 1, 1e6, 1e15, &d->memory_bandwidth, err)) ||
        (rc = px_json_int(j, where, "sm_count", 0, 1, 1 << 20, &d->sm_count, err)) ||
        (rc = px_json_u64(j, where, "runtime_bytes", 0, &d->runtime_bytes, err)) ||
        (rc = px_json_bool(j, where, "fp8_tn_only", 0, &d->fp8_transpose, err)) ||
        (rc = px_json_object(j, where, "peak_flops", 1, &peak, err)))
        return rc;
    px_json_path(pw, sizeof pw, where, "peak_flops");
    px_json_warn_unknown(peak, pw, known_peak);
    if ((rc = px_json_double(peak, pw, "fp32", 1, 1e6, 1e18, &d->peak_fp32, err)) ||
        (rc = px_json_double(peak, pw, "tf32", 0, 0, 1e18, &d->peak_tf32, err)) ||
        (rc = px_json_double(peak, pw, "bf16", 0, 0, 1e18, &d->peak_bf16, err)) ||
        (rc = px_json_double(peak, pw, "fp16", 0, 0, 1e18, &d->peak_fp16, err)) ||
        (rc = px_json_double(peak, pw, "fp8", 0, 0, 1e18, &d->peak_fp8, err)) ||
        (rc = px_json_double(peak, pw, "mxfp8", 0, 0, 1e18, &d->peak_mxfp8, err)))
        return rc;
    /* Efficiency defaults: an ideal device; the built-in profiles all set them. */
    d->matmul_eff = 1.0;
    d->matmul_k_half = 0;
    d->misaligned_eff = 1.0;
    d->clock_headroom = 1.0;
    d->memory_eff = 1.0;
    d->memory_attn_eff = 1.0;
    d->attn_fwd_eff = 1.0;
    d->attn_bwd_eff = 1.0;
    d->attn_fa2_fwd_eff = d->attn_fa2_bwd_eff = 1.0;
    d->eff_matmul_fp8 = 1.0;
    const cJSON *eff;
    if ((rc = px_json_object(j, where, "efficiency", 0, &eff, err)))
        return rc;
    if (eff) {
        char ew[256];
        px_json_path(ew, sizeof ew, where, "efficiency");
        px_json_warn_unknown(eff, ew, known_eff);
        if ((rc = px_json_double(eff, ew, "matmul", 0, 0.01, 1, &d->matmul_eff, err)) ||
            (rc = px_json_double(eff, ew, "matmul_k_half", 0, 0, 1e6, &d->matmul_k_half, err)) ||
            (rc = px_json_double(eff, ew, "misaligned", 0, 0.01, 1, &d->misaligned_eff, err)) ||
            (rc = px_json_double(eff, ew, "clock_headroom", 0, 1, 4, &d->clock_headroom, err)) ||
            (rc = px_json_double(eff, ew, "memory", 0, 0.01, 1, &d->memory_eff, err)) ||
            (rc = px_json_double(eff, ew, "attention_fwd", 0, 0.01, 1, &d->attn_fwd_eff, err)) ||
            (rc = px_json_double(eff, ew, "attention_bwd", 0, 0.01, 1, &d->attn_bwd_eff, err)) ||
            (rc = px_json_double(eff, ew, "kernel_overhead_s", 0, 0, 1, &d->kernel_overhead_s, err)) ||
            (rc = px_json_double(eff, ew, "host_sync_s", 0, 0, 1, &d->host_sync_s, err)))
            return rc;
        d->memory_attn_eff = d->memory_eff;
        if ((rc = px_json_double(eff, ew, "memory_attention", 0, 0.01, 1, &d->memory_attn_eff, err)))
            return rc;
        /* a device whose FlashAttention-2 is not measured apart runs it at its fused rate */
        d->attn_fa2_fwd_eff = d->attn_fwd_eff;
        d->attn_fa2_bwd_eff = d->attn_bwd_eff;
        if ((rc = px_json_double(eff, ew, "attention_fa2_fwd", 0, 0.01, 1, &d->attn_fa2_fwd_eff, err)) ||
            (rc = px_json_double(eff, ew, "attention_fa2_bwd", 0, 0.01, 1, &d->attn_fa2_bwd_eff, err)))
            return rc;
        /* without its own figure an FP8 GEMM reaches the bf16 fraction of its peak */
        d->eff_matmul_fp8 = d->matmul_eff;
        if ((rc = px_json_double(eff, ew, "matmul_fp8", 0, 0.01, 1, &d->eff_matmul_fp8, err)))
            return rc;
        const cJSON *tiles = cJSON_GetObjectItemCaseSensitive(eff, "tiles");
        if (tiles) {
            char tw[300];
            px_json_path(tw, sizeof tw, ew, "tiles");
            if (!cJSON_IsArray(tiles) || cJSON_GetArraySize(tiles) > 8)
                return px_fail(err, PX_EINPUT, "%s: expected an array of at most 8 [m, n, efficiency] tiles", tw);
            const cJSON *t;
            cJSON_ArrayForEach(t, tiles)
            {
                const cJSON *a = cJSON_GetArrayItem(t, 0), *b = cJSON_GetArrayItem(t, 1),
                            *e = cJSON_GetArrayItem(t, 2);
                if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) != 3 || !cJSON_IsNumber(a) ||
                    !cJSON_IsNumber(b) || !cJSON_IsNumber(e) || a->valuedouble < 1 ||
                    b->valuedouble < 1 || e->valuedouble <= 0 || e->valuedouble > 1)
                    return px_fail(err, PX_EINPUT, "%s[%d]: expected [m, n, efficiency] with m, n >= 1 and 0 < efficiency <= 1",
                                   tw, d->n_tiles);
                d->tile_m[d->n_tiles] = a->valuedouble;
                d->tile_n[d->n_tiles] = b->valuedouble;
                d->tile_eff[d->n_tiles] = e->valuedouble;
                d->n_tiles++;
            }
        }
    }
    if (d->memory_bytes == 0) {
        /* 0 asks for this machine's physical memory (the local CPU profile). */
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || page <= 0) {
            char path[256];
            px_json_path(path, sizeof path, where, "memory_bytes");
            return px_fail(err, PX_ERUNTIME, "%s: 0 means this machine's memory, which cannot be read", path);
        }
        d->memory_bytes = (uint64_t)pages * (uint64_t)page;
    }
    return PX_OK;
}

int prof_device_parse(const char *text, const char *origin, ProfDevice *out, PxError *err)
{
    cJSON *j = px_json_parse(text, origin, err);
    if (!j)
        return PX_EINPUT;
    char where[520];
    snprintf(where, sizeof where, "%s:", origin);
    int rc = cJSON_IsObject(j) ? parse_device(j, where, out, err)
                               : px_fail(err, PX_EINPUT, "%s expected a JSON object", where);
    cJSON_Delete(j);
    return rc;
}

int prof_device_load(const char *name_or_path, ProfDevice *out, PxError *err)
{
    char origin[512];
    cJSON *j = load_json(name_or_path, prof_device_data, prof_device_data_count, "device",
                         "parallax profiles", origin, sizeof origin, err);
    if (!j)
        return PX_EINPUT;
    char where[520];
    snprintf(where, sizeof where, "%s:", origin);
    int rc = cJSON_IsObject(j) ? parse_device(j, where, out, err)
                               : px_fail(err, PX_EINPUT, "%s expected a JSON object", where);
    cJSON_Delete(j);
    return rc;
}

static int cluster_from_json(cJSON *j, const char *origin, const char *const *sets, int n_sets,
                             ProfCluster *c, PxError *err);

int prof_calibrated_path(char *buf, size_t cap)
{
    char host[128] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0)
        px_strlcpy(host, "localhost", sizeof host);
    host[sizeof host - 1] = '\0';
    const char *env = getenv("PARALLAX_PROFILE_DIR");
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    /* $PARALLAX_PROFILE_DIR alone when it is set (a calibration there must not read or
     * overwrite another folder's profile); else ./profiles, then the profiles/ beside the build
     * directory */
    char abs[PATH_MAX];
    if (env && *env) {
        const char *dir = realpath(env, abs) ? abs : env;
        snprintf(buf, cap, "%s/local-%s.json", dir, host);
        return px_file_exists(buf);
    }
    const char *dirs[3] = {NULL, "profiles", NULL};
    char beside[1100];
    snprintf(beside, sizeof beside, "%s/../profiles", exe);
    dirs[2] = n > 0 ? beside : NULL;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        /* absolute, so that plans naming it work from any directory */
        const char *dir = realpath(dirs[i], abs) ? abs : dirs[i];
        snprintf(buf, cap, "%s/local-%s.json", dir, host);
        if (px_file_exists(buf))
            return 1;
    }
    /* where calibrate writes it: the profiles/ of the source tree beside the build directory,
     * else ./profiles */
    const char *dir = n > 0 && realpath(beside, abs) ? abs : "profiles";
    if (dir != abs && realpath(dir, abs))
        dir = abs;
    snprintf(buf, cap, "%s/local-%s.json", dir, host);
    return 0;
}

int prof_cluster_load(const char *name_or_path, const char *const *sets, int n_sets,
                      ProfCluster *c, PxError *err)
{
    char origin[512], calibrated[1200];
    /* `local` is this machine: its calibration, when `parallax calibrate` wrote one */
    if (strcmp(name_or_path, "local") == 0 && prof_calibrated_path(calibrated, sizeof calibrated) &&
        !getenv("PARALLAX_UNCALIBRATED"))
        name_or_path = calibrated;
    cJSON *j = load_json(name_or_path, prof_cluster_data, prof_cluster_data_count, "cluster",
                         "parallax profiles", origin, sizeof origin, err);
    if (!j)
        return PX_EINPUT;
    int rc = cluster_from_json(j, origin, sets, n_sets, c, err);
    cJSON_Delete(j);
    return rc;
}

int prof_cluster_parse(const char *text, const char *origin, ProfCluster *c, PxError *err)
{
    cJSON *j = px_json_parse(text, origin, err);
    if (!j)
        return PX_EINPUT;
    int rc = cluster_from_json(j, origin, NULL, 0, c, err);
    cJSON_Delete(j);
    return rc;
}

int prof_cluster_from_json(const cJSON *j, const char *origin, ProfCluster *c, PxError *err)
{
    memset(c, 0, sizeof *c);
    /* the reader resolves and overrides in place: work on a copy */
    cJSON *dup = cJSON_Duplicate(j, 1);
    if (!dup)
        return px_fail(err, PX_ERUNTIME, "%s: out of memory", origin);
    int rc = cluster_from_json(dup, origin, NULL, 0, c, err);
    cJSON_Delete(dup);
    return rc;
}

int prof_cluster_copy(const ProfCluster *src, ProfCluster *out, PxError *err)
{
    *out = *src;
    out->measured = NULL;
    const ProfMeasured *m = src->measured;
    if (!m)
        return PX_OK;
    ProfMeasured *c = calloc(1, sizeof *c);
    if (!c)
        return px_fail(err, PX_ERUNTIME, "out of memory copying the profile %s", src->name);
    px_strlcpy(c->host, m->host, sizeof c->host);
    px_strlcpy(c->date, m->date, sizeof c->date);
    c->ranks = m->ranks;
    c->peak_flops = m->peak_flops;
    c->memory_bandwidth = m->memory_bandwidth;
    c->quick = m->quick;
    /* appending to an empty section is a copy of the lists */
    if (prof_measured_append(c, m, err)) {
        prof_measured_free(c);
        return px_fail(err, PX_ERUNTIME, "out of memory copying the profile %s", src->name);
    }
    out->measured = c;
    return PX_OK;
}

/* The optional array `key` of the measured section: *n its entries (0 when absent) and *out a
 * zeroed list of that many elements of `size` bytes (at least one, so never NULL on success). */
static int measured_list(const cJSON *me, const char *mw, const char *key, const char *shape,
                         size_t size, void **out, int *n, PxError *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(me, key);
    *n = 0;
    *out = NULL;
    if (!a)
        return PX_OK;
    if (!cJSON_IsArray(a))
        return px_fail(err, PX_EINPUT, "%s.%s: expected an array%s", mw, key, shape);
    *n = cJSON_GetArraySize(a);
    *out = calloc((size_t)(*n > 0 ? *n : 1), size);
    if (!*out)
        return px_fail(err, PX_ERUNTIME, "out of memory reading %s", mw);
    return PX_OK;
}

/* Reads a non-negative finite number from a JSON array element. */
static int array_num(const cJSON *a, int i, double *out)
{
    const cJSON *v = cJSON_GetArrayItem(a, i);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return 0;
    *out = v->valuedouble;
    return 1;
}

/* The measured section's concurrency for entries that give none: the most ranks at once. */
static int default_concurrency(const ProfMeasured *m) { return m->ranks > 0 ? m->ranks : 1; }

/* measured.gemm: rows of [m, n, k, batch, seconds] with an optional concurrency. */
static int measured_gemm(const cJSON *me, const char *mw, ProfMeasured *m, PxError *err)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(me, "gemm");
    int n;
    int rc = measured_list(me, mw, "gemm", " of [m, n, k, batch, seconds]", sizeof *m->gemm,
                           (void **)&m->gemm, &n, err);
    for (int i = 0; i < n && !rc; i++) {
        const cJSON *e = cJSON_GetArrayItem(g, i);
        ProfGemmPoint *p = &m->gemm[m->n_gemm];
        const int len = cJSON_IsArray(e) ? cJSON_GetArraySize(e) : 0;
        double conc = default_concurrency(m);
        if ((len != 5 && len != 6) || !array_num(e, 0, &p->m) || !array_num(e, 1, &p->n) ||
            !array_num(e, 2, &p->k) || !array_num(e, 3, &p->batch) ||
            !array_num(e, 4, &p->seconds) || (len == 6 && !array_num(e, 5, &conc)) ||
            p->m < 1 || p->n < 1 || p->k < 1 || p->batch < 1 || !(p->seconds > 0) ||
            conc < 1 || conc > (1 << 20) || conc != floor(conc))
            return px_fail(err, PX_EINPUT,
                           "%s.gemm[%d]: expected [m, n, k, batch, seconds] or [m, n, k, batch, "
                           "seconds, concurrency], all positive",
                           mw, i);
        p->concurrency = (int)conc;
        m->n_gemm++;
    }
    return rc;
}

/* measured.ops: one fitted rate per kind, phase and variant at a concurrency. */
static int measured_ops(const cJSON *me, const char *mw, ProfMeasured *m, PxError *err)
{
    static const char *const known_op[] = {"kind",   "phase",       "flash",   "variant", "rate",
                                           "overhead_s", "points", "concurrency", NULL};
    const cJSON *ops = cJSON_GetObjectItemCaseSensitive(me, "ops");
    char w2[700];
    int n;
    int rc = measured_list(me, mw, "ops", "", sizeof *m->ops, (void **)&m->ops, &n, err);
    for (int i = 0; i < n && !rc; i++) {
        const cJSON *e = cJSON_GetArrayItem(ops, i);
        ProfOpRate *o = &m->ops[m->n_ops];
        snprintf(w2, sizeof w2, "%s.ops[%d]", mw, i);
        if (!cJSON_IsObject(e))
            return px_fail(err, PX_EINPUT, "%s: expected an object", w2);
        px_json_warn_unknown(e, w2, known_op);
        o->concurrency = default_concurrency(m);
        if ((rc = px_json_string(e, w2, "kind", 1, o->kind, sizeof o->kind, err)) ||
            (rc = px_json_string(e, w2, "phase", 1, o->phase, sizeof o->phase, err)) ||
            (rc = px_json_bool(e, w2, "flash", 0, &o->flash, err)) ||
            (rc = px_json_string(e, w2, "variant", 0, o->variant, sizeof o->variant, err)) ||
            (rc = px_json_double(e, w2, "rate", 1, 1e-3, 1e18, &o->rate, err)) ||
            (rc = px_json_double(e, w2, "overhead_s", 0, 0, 10, &o->overhead_s, err)) ||
            (rc = px_json_int(e, w2, "points", 0, 0, 1 << 30, &o->points, err)) ||
            (rc = px_json_int(e, w2, "concurrency", 0, 1, 1 << 20, &o->concurrency, err)))
            return rc;
        m->n_ops++;
    }
    return rc;
}

/* One collective's [bytes, seconds] points, bytes increasing. */
static int collective_points(const cJSON *pts, const char *w2, ProfCollective *c, PxError *err)
{
    if (!cJSON_IsArray(pts) || cJSON_GetArraySize(pts) < 1 ||
        cJSON_GetArraySize(pts) > PROF_MAX_POINTS)
        return px_fail(err, PX_EINPUT, "%s.points: expected 1 to %d [bytes, seconds] pairs", w2,
                       PROF_MAX_POINTS);
    for (int k = 0; k < cJSON_GetArraySize(pts); k++) {
        const cJSON *pt = cJSON_GetArrayItem(pts, k);
        if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 || !array_num(pt, 0, &c->bytes[k]) ||
            !array_num(pt, 1, &c->seconds[k]) || !(c->bytes[k] > 0) || !(c->seconds[k] > 0) ||
            (k > 0 && !(c->bytes[k] > c->bytes[k - 1])))
            return px_fail(err, PX_EINPUT,
                           "%s.points[%d]: expected [bytes, seconds], positive, bytes increasing",
                           w2, k);
        c->n++;
    }
    return PX_OK;
}

/* measured.collectives: times against message size per collective and group. */
static int measured_collectives(const cJSON *me, const char *mw, ProfMeasured *m, PxError *err)
{
    static const char *const known_coll[] = {"op", "ranks", "nodes", "points", NULL};
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(me, "collectives");
    char w2[700];
    int n;
    int rc = measured_list(me, mw, "collectives", "", sizeof *m->coll, (void **)&m->coll, &n, err);
    for (int i = 0; i < n && !rc; i++) {
        const cJSON *e = cJSON_GetArrayItem(co, i);
        ProfCollective *c = &m->coll[m->n_coll];
        snprintf(w2, sizeof w2, "%s.collectives[%d]", mw, i);
        if (!cJSON_IsObject(e))
            return px_fail(err, PX_EINPUT, "%s: expected an object", w2);
        px_json_warn_unknown(e, w2, known_coll);
        c->nodes = 1;
        if ((rc = px_json_string(e, w2, "op", 1, c->op, sizeof c->op, err)) ||
            (rc = px_json_int(e, w2, "ranks", 1, 1, 1 << 24, &c->ranks, err)) ||
            (rc = px_json_int(e, w2, "nodes", 0, 1, 1 << 24, &c->nodes, err)) ||
            (rc = collective_points(cJSON_GetObjectItemCaseSensitive(e, "points"), w2, c, err)))
            return rc;
        m->n_coll++;
    }
    return rc;
}

int prof_measured_from_json(const cJSON *me, const char *where, ProfMeasured **out, PxError *err)
{
    static const char *const known[] = {"host", "date",       "ranks",
                                        "peak_flops", "memory_bandwidth", "quick", "gemm",
                                        "ops",  "collectives", NULL};
    char mw[600];
    snprintf(mw, sizeof mw, "%s measured", where);
    *out = NULL;
    px_json_warn_unknown(me, mw, known);
    ProfMeasured *m = calloc(1, sizeof *m);
    if (!m)
        return px_fail(err, PX_ERUNTIME, "out of memory reading %s", mw);
    int rc;
    if ((rc = px_json_string(me, mw, "host", 0, m->host, sizeof m->host, err)) ||
        (rc = px_json_string(me, mw, "date", 0, m->date, sizeof m->date, err)) ||
        (rc = px_json_int(me, mw, "ranks", 0, 1, 1 << 20, &m->ranks, err)) ||
        (rc = px_json_double(me, mw, "peak_flops", 0, 0, 1e20, &m->peak_flops, err)) ||
        (rc = px_json_double(me, mw, "memory_bandwidth", 0, 0, 1e16, &m->memory_bandwidth, err)) ||
        (rc = px_json_bool(me, mw, "quick", 0, &m->quick, err)) ||
        (rc = measured_gemm(me, mw, m, err)) || (rc = measured_ops(me, mw, m, err)) ||
        (rc = measured_collectives(me, mw, m, err))) {
        prof_measured_free(m);
        return rc;
    }
    *out = m;
    return PX_OK;
}

/* Grows *list of *n elements of `size` bytes by the `add` elements of src. */
static int append_array(void **list, int *n, const void *src, int add, size_t size)
{
    if (add <= 0)
        return 0;
    char *p = realloc(*list, (size_t)(*n + add) * size);
    if (!p)
        return -1;
    memcpy(p + (size_t)*n * size, src, (size_t)add * size);
    *list = p;
    *n += add;
    return 0;
}

int prof_measured_append(ProfMeasured *into, const ProfMeasured *from, PxError *err)
{
    const int n_gemm = into->n_gemm, n_ops = into->n_ops;
    if (append_array((void **)&into->gemm, &into->n_gemm, from->gemm, from->n_gemm,
                     sizeof *from->gemm) ||
        append_array((void **)&into->ops, &into->n_ops, from->ops, from->n_ops,
                     sizeof *from->ops) ||
        append_array((void **)&into->coll, &into->n_coll, from->coll, from->n_coll,
                     sizeof *from->coll)) {
        /* the lists that grew keep their new room, but not the entries: into is unchanged */
        into->n_gemm = n_gemm;
        into->n_ops = n_ops;
        return px_fail(err, PX_ERUNTIME, "out of memory adding measurements");
    }
    return PX_OK;
}

void prof_measured_free(ProfMeasured *m)
{
    if (!m)
        return;
    free(m->gemm);
    free(m->ops);
    free(m->coll);
    free(m);
}

void prof_cluster_free(ProfCluster *c)
{
    if (!c)
        return;
    prof_measured_free(c->measured);
    c->measured = NULL;
}

double prof_measured_collective(const ProfMeasured *m, const char *op, int ranks, int nodes,
                                double bytes)
{
    if (!m || !(bytes > 0))
        return -1.0;
    for (int i = 0; i < m->n_coll; i++) {
        const ProfCollective *c = &m->coll[i];
        if (c->ranks != ranks || c->nodes != nodes || strcmp(c->op, op) != 0 || c->n < 1)
            continue;
        if (c->n == 1)
            return c->seconds[0] * (bytes >= c->bytes[0] ? bytes / c->bytes[0] : 1.0);
        /* the segment around bytes (the first or last one beyond the range), log-log */
        int k = 1;
        while (k < c->n - 1 && bytes > c->bytes[k])
            k++;
        double x0 = log(c->bytes[k - 1]), x1 = log(c->bytes[k]);
        double y0 = log(c->seconds[k - 1]), y1 = log(c->seconds[k]);
        double y = y0 + (y1 - y0) * (log(bytes) - x0) / (x1 - x0);
        if (bytes < c->bytes[0] && y < y0)
            y = y0; /* below the smallest size the latency stays */
        return exp(y);
    }
    return -1.0;
}

/* The better of two concurrency levels for `want` ranks at once: the nearer in ratio; on a tie
 * the higher (more contention is the safer guess). */
static int nearer_level(int have, int cand, int want)
{
    if (have <= 0)
        return cand;
    double dh = fabs(log((double)have / want)), dc = fabs(log((double)cand / want));
    return dc < dh - 1e-12 || (fabs(dc - dh) <= 1e-12 && cand > have) ? cand : have;
}

/* Characters two variants share from their start (a whole variant equal counts one more, so
 * that "hd1" does not tie with "hd16" for "hd16"). */
static size_t common_prefix(const char *a, const char *b)
{
    if (!b)
        return 0;
    size_t n = 0;
    while (a[n] && a[n] == b[n])
        n++;
    return n + (a[n] == '\0' && b[n] == '\0');
}

const ProfOpRate *prof_measured_op(const ProfMeasured *m, const char *kind, const char *phase,
                                   int flash, const char *variant, int concurrency)
{
    if (!m)
        return NULL;
    /* the variant asked for when it was measured, else the nearest: the longest common
     * prefix ("attn.qkv/rope" for "attn.qkv/learned", "hd16" for "hd128"); a context-parallel
     * ring's core ("hd16/ring") only for a ring's, and a ring's only from one (the caller falls
     * back to the whole core's) */
    const int ring = strstr(variant, "/ring") != NULL;
    size_t want = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ProfOpRate *o = &m->ops[i];
        if ((strstr(o->variant, "/ring") != NULL) != ring)
            continue;
        if (!strcmp(o->kind, kind) && !strcmp(o->phase, phase) &&
            (strcmp(kind, "attention") != 0 || o->flash == flash)) {
            size_t n = common_prefix(o->variant, variant);
            if (n > want)
                want = n;
        }
    }
    const ProfOpRate *best = NULL;
    int level = 0;
    for (int i = 0; i < m->n_ops; i++) {
        const ProfOpRate *o = &m->ops[i];
        if ((strstr(o->variant, "/ring") != NULL) != ring)
            continue;
        if (strcmp(o->kind, kind) == 0 && strcmp(o->phase, phase) == 0 &&
            (strcmp(kind, "attention") != 0 || o->flash == flash) &&
            common_prefix(o->variant, variant) == want) {
            int l = nearer_level(level, o->concurrency, concurrency > 0 ? concurrency : 1);
            if (l != level || !best) {
                level = l;
                best = o;
            }
        }
    }
    return best;
}

double prof_measured_gemm(const ProfMeasured *m, double M, double N, double K, double batch,
                          int concurrency)
{
    if (!m || m->n_gemm == 0)
        return -1.0;
    int level = 0;
    for (int i = 0; i < m->n_gemm; i++)
        level = nearer_level(level, m->gemm[i].concurrency, concurrency > 0 ? concurrency : 1);
    int best = -1;
    double best_d = 0;
    for (int i = 0; i < m->n_gemm; i++) {
        const ProfGemmPoint *p = &m->gemm[i];
        if (p->concurrency != level)
            continue;
        double dist = fabs(log(p->m / M)) + fabs(log(p->n / N)) + fabs(log(p->k / K)) +
                      fabs(log(p->batch / batch));
        if (best < 0 || dist < best_d) {
            best = i;
            best_d = dist;
        }
    }
    const ProfGemmPoint *p = &m->gemm[best];
    return p->seconds * (M * N * K * batch) / (p->m * p->n * p->k * p->batch);
}

/* The value at a dotted path of the profile's JSON; NULL when a part is missing. */
static cJSON *at_path(cJSON *j, const char *dotted)
{
    char buf[256];
    if (strlen(dotted) >= sizeof buf)
        return NULL;
    px_strlcpy(buf, dotted, sizeof buf);
    char *save = NULL;
    for (char *part = strtok_r(buf, ".", &save); part && j; part = strtok_r(NULL, ".", &save))
        j = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, part) : NULL;
    return j;
}

/* A true/false switch of the profile (device.fp8_tn_only): true/false, or 1/0. */
static int set_bool(cJSON *node, const char *key, const char *text, PxError *err)
{
    int v;
    if (!strcmp(text, "true") || !strcmp(text, "1"))
        v = 1;
    else if (!strcmp(text, "false") || !strcmp(text, "0"))
        v = 0;
    else
        return px_fail(err, PX_EINPUT, "--set %s: expected true or false, got '%s'", key, text);
    node->type = (node->type & ~(cJSON_True | cJSON_False)) | (v ? cJSON_True : cJSON_False);
    return PX_OK;
}

/* Whether a member can be overridden: a number, a switch, or an object holding one (the
 * sources and descriptions are text, which --set does not take). */
static int settable(const cJSON *v)
{
    if (v->string && !strcmp(v->string, "schema_version"))
        return 0;
    if (cJSON_IsNumber(v) || cJSON_IsBool(v))
        return 1;
    if (!cJSON_IsObject(v))
        return 0;
    for (const cJSON *c = v->child; c; c = c->next)
        if (settable(c))
            return 1;
    return 0;
}

/* The dotted path of the first settable member named `name` below j (prefix: j's own path), into
 * buf; 0 when there is none. */
static int find_member(const cJSON *j, const char *name, const char *prefix, char *buf, size_t cap)
{
    for (const cJSON *c = j->child; c; c = c->next) {
        if (!c->string || !settable(c))
            continue;
        char path[256];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", c->string);
        if (!strcmp(c->string, name) && !cJSON_IsObject(c)) {
            px_strlcpy(buf, path, cap);
            return 1;
        }
        if (cJSON_IsObject(c) && find_member(c, name, path, buf, cap))
            return 1;
    }
    return 0;
}

/* A --set key that names nothing: PX_EINPUT listing the keys the level it broke at has
 * ("node.*" for an object), and the key it may have meant when a member of that name exists
 * elsewhere ("cluster.nodes": the profile is the cluster, so "nodes"). */
static int unknown_key(const cJSON *root, const char *key, PxError *err)
{
    char buf[256];
    px_strlcpy(buf, key, sizeof buf);
    const cJSON *at = root;
    char where[256] = "", *save = NULL, *part;
    for (part = strtok_r(buf, ".", &save); part; part = strtok_r(NULL, ".", &save)) {
        const cJSON *next = cJSON_IsObject(at) ? cJSON_GetObjectItemCaseSensitive(at, part) : NULL;
        if (!next || !settable(next))
            break;
        size_t w = strlen(where);
        snprintf(where + w, sizeof where - w, "%s%s", w ? "." : "", part);
        at = next;
    }
    if (!part || !cJSON_IsObject(at))
        return PX_OK; /* the path is there: px_json_set_path says what else is wrong */
    char keys[600] = "";
    size_t n = 0;
    for (const cJSON *c = at->child; c && n < sizeof keys; c = c->next)
        if (c->string && settable(c))
            n += (size_t)snprintf(keys + n, sizeof keys - n, "%s%s%s%s%s", n ? ", " : "", where,
                                  *where ? "." : "", c->string, cJSON_IsObject(c) ? ".*" : "");
    char guess[300] = "", found[256];
    const char *dot = strrchr(key, '.');
    if (find_member(root, dot ? dot + 1 : key, "", found, sizeof found))
        snprintf(guess, sizeof guess, "; did you mean %s?", found);
    return px_fail(err, PX_EINPUT, "--set %s: no key '%s' in %s%s; its keys: %s%s", key, part,
                   *where ? "the profile's " : "the profile", where, keys, guess);
}

/* The `key=value` overrides, in order, into the profile's JSON (its device resolved): numbers,
 * and the switches that are true or false. */
static int apply_sets(cJSON *j, const char *const *sets, int n_sets, PxError *err)
{
    for (int i = 0; i < n_sets; i++) {
        const char *eq = strchr(sets[i], '=');
        if (!eq || eq == sets[i])
            return px_fail(err, PX_EINPUT, "--set '%s': expected key=value", sets[i]);
        char key[256];
        size_t kn = (size_t)(eq - sets[i]);
        if (kn >= sizeof key)
            return px_fail(err, PX_EINPUT, "--set '%s': key too long", sets[i]);
        memcpy(key, sets[i], kn);
        key[kn] = '\0';
        cJSON *node = at_path(j, key);
        int rc = node ? PX_OK : unknown_key(j, key, err);
        if (rc)
            return rc;
        rc = cJSON_IsBool(node) ? set_bool(node, key, eq + 1, err)
                                    : px_json_set_path(j, key, eq + 1, err);
        if (rc)
            return rc;
    }
    return PX_OK;
}

/* Parses a cluster profile; resolves a device given by name in place. */
static int cluster_from_json(cJSON *j, const char *origin, const char *const *sets, int n_sets,
                             ProfCluster *c, PxError *err)
{
    static const char *const known[] = {"schema_version", "name", "description", "device", "node",
                                        "network", "nodes", "shared_memory", "overlap", "measured",
                                        "host", "sources", NULL};
    static const char *const known_node[] = {"devices", "link", NULL};
    static const char *const known_link[] = {"bandwidth", "latency", "efficiency", NULL};
    static const char *const known_net[] = {"bandwidth_per_device", "latency", "efficiency",
                                            "all_to_all_efficiency", NULL};
    static const char *const known_overlap[] = {"compute_slowdown", NULL};
    static const char *const known_host[] = {"memory_bytes", "pcie_bandwidth", "memory_bandwidth",
                                             "cores", NULL};
    char where[520], w2[600];
    snprintf(where, sizeof where, "%s:", origin);
    int rc = PX_OK;
    memset(c, 0, sizeof *c);
    if (!cJSON_IsObject(j)) {
        rc = px_fail(err, PX_EINPUT, "%s expected a JSON object", where);
        goto out;
    }
    /* Resolve a device given by name into the tree, so that overrides reach its figures. */
    cJSON *dev = cJSON_GetObjectItemCaseSensitive(j, "device");
    if (cJSON_IsString(dev)) {
        char dorigin[512];
        cJSON *dj = load_json(dev->valuestring, prof_device_data, prof_device_data_count, "device",
                              "parallax profiles", dorigin, sizeof dorigin, err);
        if (!dj) {
            char msg[sizeof err->msg];
            px_strlcpy(msg, err->msg, sizeof msg);
            rc = px_fail(err, PX_EINPUT, "%s device: %s", where, msg);
            goto out;
        }
        cJSON_ReplaceItemInObjectCaseSensitive(j, "device", dj);
    } else if (!cJSON_IsObject(dev)) {
        rc = px_fail(err, PX_EINPUT, "%s device: expected a device name or object", where);
        goto out;
    }
    if ((rc = apply_sets(j, sets, n_sets, err)))
        goto out;
    px_json_warn_unknown(j, where, known);
    int version = 1;
    const cJSON *node, *link, *net;
    if ((rc = px_json_int(j, where, "schema_version", 0, 1, 1, &version, err)) ||
        (rc = px_json_string(j, where, "name", 1, c->name, sizeof c->name, err)) ||
        (rc = px_json_string(j, where, "description", 0, c->description, sizeof c->description, err)) ||
        (rc = px_json_int(j, where, "nodes", 0, 0, 1 << 24, &c->nodes, err)) ||
        (rc = px_json_bool(j, where, "shared_memory", 0, &c->shared_memory, err)) ||
        (rc = px_json_object(j, where, "node", 1, &node, err)) ||
        (rc = px_json_object(j, where, "network", 1, &net, err)))
        goto out;
    snprintf(w2, sizeof w2, "%s device", where);
    if ((rc = parse_device(cJSON_GetObjectItemCaseSensitive(j, "device"), w2, &c->device, err)))
        goto out;
    snprintf(w2, sizeof w2, "%s node", where);
    px_json_warn_unknown(node, w2, known_node);
    if ((rc = px_json_int(node, w2, "devices", 1, 0, 1 << 20, &c->node_devices, err)) ||
        (rc = px_json_object(node, w2, "link", 1, &link, err)))
        goto out;
    snprintf(w2, sizeof w2, "%s node.link", where);
    px_json_warn_unknown(link, w2, known_link);
    c->link_eff = c->net_eff = 1.0;
    if ((rc = px_json_double(link, w2, "bandwidth", 1, 1e6, 1e15, &c->link_bandwidth, err)) ||
        (rc = px_json_double(link, w2, "latency", 1, 0, 1, &c->link_latency, err)) ||
        (rc = px_json_double(link, w2, "efficiency", 0, 0.01, 1, &c->link_eff, err)))
        goto out;
    snprintf(w2, sizeof w2, "%s network", where);
    px_json_warn_unknown(net, w2, known_net);
    if ((rc = px_json_double(net, w2, "bandwidth_per_device", 1, 1e6, 1e15, &c->net_bandwidth, err)) ||
        (rc = px_json_double(net, w2, "latency", 1, 0, 1, &c->net_latency, err)) ||
        (rc = px_json_double(net, w2, "efficiency", 0, 0.01, 1, &c->net_eff, err)))
        goto out;
    /* the all-to-all's own rate across nodes (docs/time.md, "Expert parallelism"); a profile
     * that does not measure it gets the ring collectives' */
    c->net_a2a_eff = c->net_eff;
    if ((rc = px_json_double(net, w2, "all_to_all_efficiency", 0, 0.01, 1, &c->net_a2a_eff, err)))
        goto out;
    {
        const cJSON *ov;
        if ((rc = px_json_object(j, where, "overlap", 0, &ov, err)))
            goto out;
        if (ov) {
            snprintf(w2, sizeof w2, "%s overlap", where);
            px_json_warn_unknown(ov, w2, known_overlap);
            if ((rc = px_json_double(ov, w2, "compute_slowdown", 0, 0, 1, &c->overlap_slowdown, err)))
                goto out;
        }
    }
    {
        const cJSON *ho;
        if ((rc = px_json_object(j, where, "host", 0, &ho, err)))
            goto out;
        if (ho) {
            snprintf(w2, sizeof w2, "%s host", where);
            px_json_warn_unknown(ho, w2, known_host);
            if ((rc = px_json_double(ho, w2, "memory_bytes", 1, 1e6, 1e18, &c->host_memory_bytes, err)) ||
                (rc = px_json_double(ho, w2, "pcie_bandwidth", 1, 1e6, 1e15, &c->host_pcie_bandwidth, err)) ||
                (rc = px_json_double(ho, w2, "memory_bandwidth", 1, 1e6, 1e15, &c->host_memory_bandwidth, err)) ||
                (rc = px_json_int(ho, w2, "cores", 0, 0, 1 << 20, &c->host_cores, err)))
                goto out;
        }
    }
    {
        const cJSON *me;
        if ((rc = px_json_object(j, where, "measured", 0, &me, err)))
            goto out;
        if (me && (rc = prof_measured_from_json(me, where, &c->measured, err)))
            goto out;
    }
out:
    if (rc)
        prof_cluster_free(c);
    return rc;
}

double prof_peak_flops(const ProfDevice *d, PxDtype t)
{
    switch (t) {
    case PX_BF16: return d->peak_bf16;
    case PX_FP16: return d->peak_fp16;
    case PX_FP8: return d->peak_fp8;
    default: return d->peak_fp32;
    }
}

double prof_peak_mxfp8(const ProfDevice *d) { return d->peak_mxfp8; }

double prof_matmul_eff(const ProfDevice *d, PxDtype t)
{
    return t == PX_FP8 ? d->eff_matmul_fp8 : d->matmul_eff;
}

uint64_t prof_host_rank_memory(const ProfCluster *c, int ranks_per_node)
{
    return (uint64_t)(c->host_memory_bytes / (ranks_per_node > 1 ? ranks_per_node : 1));
}

int prof_node_size(const ProfCluster *c, int gpus)
{
    return c->node_devices > 0 ? c->node_devices : (gpus > 0 ? gpus : 1);
}

int prof_device_is_cpu(const ProfDevice *d)
{
    return !strncmp(d->name, "cpu", 3) || (d->peak_bf16 <= 0 && d->peak_fp16 <= 0);
}

uint64_t prof_rank_memory(const ProfCluster *c, int ranks_per_node)
{
    if (c->shared_memory && ranks_per_node > 1)
        return c->device.memory_bytes / (uint64_t)ranks_per_node;
    return c->device.memory_bytes;
}

cJSON *prof_cluster_to_json(const ProfCluster *c)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "schema_version", 1);
    cJSON_AddStringToObject(j, "name", c->name);
    if (c->description[0])
        cJSON_AddStringToObject(j, "description", c->description);
    cJSON *d = cJSON_AddObjectToObject(j, "device");
    cJSON_AddStringToObject(d, "name", c->device.name);
    cJSON_AddNumberToObject(d, "memory_bytes", (double)c->device.memory_bytes);
    cJSON *pk = cJSON_AddObjectToObject(d, "peak_flops");
    cJSON_AddNumberToObject(pk, "fp32", c->device.peak_fp32);
    cJSON_AddNumberToObject(pk, "tf32", c->device.peak_tf32);
    cJSON_AddNumberToObject(pk, "bf16", c->device.peak_bf16);
    cJSON_AddNumberToObject(pk, "fp16", c->device.peak_fp16);
    cJSON_AddNumberToObject(pk, "fp8", c->device.peak_fp8);
    cJSON_AddNumberToObject(pk, "mxfp8", c->device.peak_mxfp8);
    cJSON_AddNumberToObject(d, "memory_bandwidth", c->device.memory_bandwidth);
    if (c->device.sm_count)
        cJSON_AddNumberToObject(d, "sm_count", c->device.sm_count);
    cJSON_AddNumberToObject(d, "runtime_bytes", (double)c->device.runtime_bytes);
    cJSON_AddBoolToObject(d, "fp8_tn_only", c->device.fp8_transpose);
    cJSON *eff = cJSON_AddObjectToObject(d, "efficiency");
    cJSON_AddNumberToObject(eff, "matmul", c->device.matmul_eff);
    cJSON_AddNumberToObject(eff, "matmul_fp8", c->device.eff_matmul_fp8);
    cJSON_AddNumberToObject(eff, "matmul_k_half", c->device.matmul_k_half);
    cJSON_AddNumberToObject(eff, "misaligned", c->device.misaligned_eff);
    cJSON *tiles = cJSON_AddArrayToObject(eff, "tiles");
    for (int i = 0; i < c->device.n_tiles; i++) {
        double t[3] = {c->device.tile_m[i], c->device.tile_n[i], c->device.tile_eff[i]};
        cJSON_AddItemToArray(tiles, cJSON_CreateDoubleArray(t, 3));
    }
    cJSON_AddNumberToObject(eff, "clock_headroom", c->device.clock_headroom);
    cJSON_AddNumberToObject(eff, "memory", c->device.memory_eff);
    cJSON_AddNumberToObject(eff, "memory_attention", c->device.memory_attn_eff);
    cJSON_AddNumberToObject(eff, "attention_fwd", c->device.attn_fwd_eff);
    cJSON_AddNumberToObject(eff, "attention_bwd", c->device.attn_bwd_eff);
    cJSON_AddNumberToObject(eff, "attention_fa2_fwd", c->device.attn_fa2_fwd_eff);
    cJSON_AddNumberToObject(eff, "attention_fa2_bwd", c->device.attn_fa2_bwd_eff);
    cJSON_AddNumberToObject(eff, "kernel_overhead_s", c->device.kernel_overhead_s);
    cJSON_AddNumberToObject(eff, "host_sync_s", c->device.host_sync_s);
    cJSON *node = cJSON_AddObjectToObject(j, "node");
    cJSON_AddNumberToObject(node, "devices", c->node_devices);
    cJSON *link = cJSON_AddObjectToObject(node, "link");
    cJSON_AddNumberToObject(link, "bandwidth", c->link_bandwidth);
    cJSON_AddNumberToObject(link, "latency", c->link_latency);
    cJSON_AddNumberToObject(link, "efficiency", c->link_eff);
    cJSON *net = cJSON_AddObjectToObject(j, "network");
    cJSON_AddNumberToObject(net, "bandwidth_per_device", c->net_bandwidth);
    cJSON_AddNumberToObject(net, "latency", c->net_latency);
    cJSON_AddNumberToObject(net, "efficiency", c->net_eff);
    cJSON_AddNumberToObject(net, "all_to_all_efficiency", c->net_a2a_eff);
    cJSON *ov = cJSON_AddObjectToObject(j, "overlap");
    cJSON_AddNumberToObject(ov, "compute_slowdown", c->overlap_slowdown);
    if (c->nodes)
        cJSON_AddNumberToObject(j, "nodes", c->nodes);
    if (c->shared_memory)
        cJSON_AddBoolToObject(j, "shared_memory", 1);
    if (c->host_memory_bytes > 0) {
        cJSON *ho = cJSON_AddObjectToObject(j, "host");
        cJSON_AddNumberToObject(ho, "memory_bytes", c->host_memory_bytes);
        cJSON_AddNumberToObject(ho, "pcie_bandwidth", c->host_pcie_bandwidth);
        cJSON_AddNumberToObject(ho, "memory_bandwidth", c->host_memory_bandwidth);
        if (c->host_cores)
            cJSON_AddNumberToObject(ho, "cores", c->host_cores);
    }
    if (c->measured)
        cJSON_AddItemToObject(j, "measured", prof_measured_to_json(c->measured));
    return j;
}

cJSON *prof_measured_to_json(const ProfMeasured *m)
{
    cJSON *me = cJSON_CreateObject();
    cJSON_AddStringToObject(me, "host", m->host);
    cJSON_AddStringToObject(me, "date", m->date);
    cJSON_AddNumberToObject(me, "ranks", m->ranks);
    if (m->peak_flops > 0)
        cJSON_AddNumberToObject(me, "peak_flops", m->peak_flops);
    if (m->memory_bandwidth > 0)
        cJSON_AddNumberToObject(me, "memory_bandwidth", m->memory_bandwidth);
    if (m->quick)
        cJSON_AddBoolToObject(me, "quick", 1);
    cJSON *g = cJSON_AddArrayToObject(me, "gemm");
    for (int i = 0; i < m->n_gemm; i++) {
        double v[6] = {m->gemm[i].m,     m->gemm[i].n,       m->gemm[i].k,
                       m->gemm[i].batch, m->gemm[i].seconds, m->gemm[i].concurrency};
        cJSON_AddItemToArray(g, cJSON_CreateDoubleArray(v, 6));
    }
    cJSON *ops = cJSON_AddArrayToObject(me, "ops");
    for (int i = 0; i < m->n_ops; i++) {
        const ProfOpRate *r = &m->ops[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "kind", r->kind);
        cJSON_AddStringToObject(o, "phase", r->phase);
        if (strcmp(r->kind, "attention") == 0)
            cJSON_AddBoolToObject(o, "flash", r->flash);
        if (r->variant[0])
            cJSON_AddStringToObject(o, "variant", r->variant);
        cJSON_AddNumberToObject(o, "rate", r->rate);
        cJSON_AddNumberToObject(o, "overhead_s", r->overhead_s);
        if (r->points > 0)
            cJSON_AddNumberToObject(o, "points", r->points);
        cJSON_AddNumberToObject(o, "concurrency", r->concurrency);
        cJSON_AddItemToArray(ops, o);
    }
    cJSON *co = cJSON_AddArrayToObject(me, "collectives");
    for (int i = 0; i < m->n_coll; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "op", m->coll[i].op);
        cJSON_AddNumberToObject(e, "ranks", m->coll[i].ranks);
        cJSON_AddNumberToObject(e, "nodes", m->coll[i].nodes);
        cJSON *pts = cJSON_AddArrayToObject(e, "points");
        for (int k = 0; k < m->coll[i].n; k++) {
            double v[2] = {m->coll[i].bytes[k], m->coll[i].seconds[k]};
            cJSON_AddItemToArray(pts, cJSON_CreateDoubleArray(v, 2));
        }
        cJSON_AddItemToArray(co, e);
    }
    return me;
}
