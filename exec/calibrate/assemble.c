/* The assemble part: the base cluster profile with the parts' measurements added (and the
 * device's peak and bandwidth replaced by the measured ones on the generic CPU device, or its
 * efficiencies set from them otherwise), checked to load as a profile and written atomically. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "exec/calibrate/internal.h"

/* Sets o[key] (o may be NULL: nothing to set). */
static void set_item(cJSON *o, const char *key, cJSON *v)
{
    if (!o) {
        cJSON_Delete(v);
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, key))
        cJSON_ReplaceItemInObjectCaseSensitive(o, key, v);
    else
        cJSON_AddItemToObject(o, key, v);
}

static void set_num(cJSON *o, const char *key, double v) { set_item(o, key, cJSON_CreateNumber(v)); }

int calib_assemble(const CalibOptions *cal, PxError *err)
{
    ProfCluster base;
    int rc = prof_cluster_load(cal->base, NULL, 0, &base, err);
    if (rc)
        return rc;
    prof_measured_free(base.measured);
    base.measured = NULL;
    const int generic_cpu = !strcmp(base.device.name, "cpu");
    cJSON *prof = prof_cluster_to_json(&base);
    cJSON *gemm = cJSON_CreateArray(), *ops = cJSON_CreateArray(), *colls = NULL;
    double peak = 0, bw = 0;
    int max_c = 1, min_c = 1 << 30;
    char host[64] = "unknown";
    gethostname(host, sizeof host - 1);
    for (int i = 0; i < cal->n_parts && !rc; i++) {
        cJSON *p = px_json_read_file(cal->parts[i], err);
        if (!p) {
            rc = PX_EINPUT;
            break;
        }
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(p, "part");
        if (cJSON_IsString(kind) && !strcmp(kind->valuestring, "compute")) {
            int c = 1;
            if ((rc = px_json_int(p, cal->parts[i], "concurrency", 1, 1, 1 << 20, &c, err))) {
                cJSON_Delete(p);
                break;
            }
            if (c > max_c)
                max_c = c;
            if (c < min_c) {
                /* the device figures of the fewest ranks at once: a rank alone */
                min_c = c;
                peak = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p, "peak_flops"));
                bw = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(p, "memory_bandwidth"));
            }
            cJSON *g;
            cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(p, "gemm"))
            {
                cJSON *e = cJSON_Duplicate(g, 1);
                cJSON_AddItemToArray(e, cJSON_CreateNumber(c));
                cJSON_AddItemToArray(gemm, e);
            }
            cJSON *o;
            cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(p, "ops"))
            {
                cJSON *e = cJSON_Duplicate(o, 1);
                cJSON_AddNumberToObject(e, "concurrency", c);
                cJSON_AddItemToArray(ops, e);
            }
        } else if (cJSON_IsString(kind) && !strcmp(kind->valuestring, "comm")) {
            cJSON_Delete(colls);
            colls = cJSON_DetachItemFromObjectCaseSensitive(p, "collectives");
        } else {
            rc = px_fail(err, PX_EINPUT, "%s: not a calibration part", cal->parts[i]);
        }
        cJSON_Delete(p);
    }
    if (!rc && !(peak > 0 && bw > 0))
        rc = px_fail(err, PX_EINPUT, "no compute part among the calibration parts");
    if (!rc) {
        char date[32];
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(date, sizeof date, "%Y-%m-%d", &tm);
        cJSON *dev = cJSON_GetObjectItemCaseSensitive(prof, "device");
        cJSON *eff = cJSON_GetObjectItemCaseSensitive(dev, "efficiency");
        cJSON *sources = cJSON_GetObjectItemCaseSensitive(prof, "sources");
        if (!sources)
            sources = cJSON_AddObjectToObject(prof, "sources");
        char desc[160], note[320];
        snprintf(desc, sizeof desc, "%s, calibrated on %s by parallax calibrate (%d rank%s at most)",
                 host, date, max_c, max_c > 1 ? "s" : "");
        set_item(prof, "description", cJSON_CreateString(desc));
        const char *dt = base.device.peak_bf16 > 0 && !generic_cpu ? "bf16" : "fp32";
        if (generic_cpu) {
            /* a generic CPU profile has no data-sheet peak: the measured ones replace it */
            set_num(cJSON_GetObjectItemCaseSensitive(dev, "peak_flops"), "fp32", peak);
            set_num(dev, "memory_bandwidth", bw);
            set_num(eff, "matmul", 1.0);
            set_num(eff, "memory", 1.0);
            snprintf(note, sizeof note,
                     "peak_flops.fp32 and memory_bandwidth: measured by parallax calibrate on %s "
                     "(%s): a %s GEMM's best rate and a streaming add's bandwidth, one rank",
                     host, date, generic_cpu ? "1024^3 sgemm" : "square");
        } else {
            /* a data-sheet device keeps its peak: the measurement sets the efficiencies */
            double p0 = prof_peak_flops(&base.device, !strcmp(dt, "bf16") ? PX_BF16 : PX_FP32);
            if (p0 > 0)
                set_num(eff, "matmul", peak / p0 < 1 ? peak / p0 : 1);
            if (base.device.memory_bandwidth > 0)
                set_num(eff, "memory", bw / base.device.memory_bandwidth < 1
                                           ? bw / base.device.memory_bandwidth
                                           : 1);
            snprintf(note, sizeof note,
                     "efficiency.matmul and .memory: measured by parallax calibrate on %s (%s): "
                     "%.4g FLOP/s %s GEMM, %.4g B/s streaming, against the data sheet",
                     host, date, peak, dt, bw);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(sources, "calibration");
        cJSON_AddStringToObject(sources, "calibration", note);
        cJSON *me = cJSON_AddObjectToObject(prof, "measured");
        cJSON_AddStringToObject(me, "host", host);
        cJSON_AddStringToObject(me, "date", date);
        cJSON_AddNumberToObject(me, "ranks", max_c);
        cJSON_AddItemToObject(me, "gemm", gemm);
        cJSON_AddItemToObject(me, "ops", ops);
        gemm = ops = NULL;
        if (colls) {
            cJSON_AddItemToObject(me, "collectives", colls);
            colls = NULL;
        }
        /* the result must load as a profile before it replaces anything */
        char *text = cJSON_Print(prof);
        ProfCluster check;
        if (!text) {
            rc = px_fail(err, PX_ERUNTIME, "out of memory");
        } else if ((rc = prof_cluster_parse(text, cal->output, &check, err)) == PX_OK) {
            prof_cluster_free(&check);
            size_t n = strlen(text);
            char *t2 = realloc(text, n + 2);
            if (t2) {
                text = t2;
                text[n] = '\n';
                text[n + 1] = '\0';
            }
            rc = px_write_file_atomic(cal->output, text, err);
        }
        free(text);
        if (!rc && !cal->quiet)
            printf("calibrate: wrote %s (%s, %d GEMM shapes, %d op rates, %d collectives)\n",
                   cal->output, host,
                   cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(me, "gemm")),
                   cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(me, "ops")),
                   cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(me, "collectives")));
    }
    cJSON_Delete(gemm);
    cJSON_Delete(ops);
    cJSON_Delete(colls);
    cJSON_Delete(prof);
    prof_cluster_free(&base);
    return rc;
}
