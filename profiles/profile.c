/* Device and cluster profiles: loading, device resolution, overrides. */
#include "profiles/profile.h"

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
                                        "runtime_bytes", "efficiency", "sources", NULL};
    static const char *const known_eff[] = {"matmul", "matmul_k_half", "misaligned", "tiles",
                                            "memory", "attention_fwd", "attention_bwd",
                                            "kernel_overhead_s", NULL};
    static const char *const known_peak[] = {"fp32", "tf32", "bf16", "fp16", "fp8", NULL};
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
        (rc = px_json_object(j, where, "peak_flops", 1, &peak, err)))
        return rc;
    px_json_path(pw, sizeof pw, where, "peak_flops");
    px_json_warn_unknown(peak, pw, known_peak);
    if ((rc = px_json_double(peak, pw, "fp32", 1, 1e6, 1e18, &d->peak_fp32, err)) ||
        (rc = px_json_double(peak, pw, "tf32", 0, 0, 1e18, &d->peak_tf32, err)) ||
        (rc = px_json_double(peak, pw, "bf16", 0, 0, 1e18, &d->peak_bf16, err)) ||
        (rc = px_json_double(peak, pw, "fp16", 0, 0, 1e18, &d->peak_fp16, err)) ||
        (rc = px_json_double(peak, pw, "fp8", 0, 0, 1e18, &d->peak_fp8, err)))
        return rc;
    /* Efficiency defaults: an ideal device; the built-in profiles all set them. */
    d->matmul_eff = 1.0;
    d->matmul_k_half = 0;
    d->misaligned_eff = 1.0;
    d->memory_eff = 1.0;
    d->attn_fwd_eff = 1.0;
    d->attn_bwd_eff = 1.0;
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
            (rc = px_json_double(eff, ew, "memory", 0, 0.01, 1, &d->memory_eff, err)) ||
            (rc = px_json_double(eff, ew, "attention_fwd", 0, 0.01, 1, &d->attn_fwd_eff, err)) ||
            (rc = px_json_double(eff, ew, "attention_bwd", 0, 0.01, 1, &d->attn_bwd_eff, err)) ||
            (rc = px_json_double(eff, ew, "kernel_overhead_s", 0, 0, 1, &d->kernel_overhead_s, err)))
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

int prof_cluster_load(const char *name_or_path, const char *const *sets, int n_sets,
                      ProfCluster *c, PxError *err)
{
    char origin[512];
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

/* Parses a cluster profile; resolves a device given by name in place. */
static int cluster_from_json(cJSON *j, const char *origin, const char *const *sets, int n_sets,
                             ProfCluster *c, PxError *err)
{
    static const char *const known[] = {"schema_version", "name", "description", "device", "node",
                                        "network", "nodes", "shared_memory", "overlap", "sources",
                                        NULL};
    static const char *const known_node[] = {"devices", "link", NULL};
    static const char *const known_link[] = {"bandwidth", "latency", "efficiency", NULL};
    static const char *const known_net[] = {"bandwidth_per_device", "latency", "efficiency", NULL};
    static const char *const known_overlap[] = {"compute_slowdown", NULL};
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
    for (int i = 0; i < n_sets; i++) {
        const char *eq = strchr(sets[i], '=');
        if (!eq || eq == sets[i]) {
            rc = px_fail(err, PX_EINPUT, "--set '%s': expected key=value", sets[i]);
            goto out;
        }
        char key[256];
        size_t kn = (size_t)(eq - sets[i]);
        if (kn >= sizeof key) {
            rc = px_fail(err, PX_EINPUT, "--set '%s': key too long", sets[i]);
            goto out;
        }
        memcpy(key, sets[i], kn);
        key[kn] = '\0';
        if ((rc = px_json_set_path(j, key, eq + 1, err)))
            goto out;
    }
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
out:
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

int prof_node_size(const ProfCluster *c, int gpus)
{
    return c->node_devices > 0 ? c->node_devices : (gpus > 0 ? gpus : 1);
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
    cJSON_AddNumberToObject(d, "memory_bandwidth", c->device.memory_bandwidth);
    if (c->device.sm_count)
        cJSON_AddNumberToObject(d, "sm_count", c->device.sm_count);
    cJSON_AddNumberToObject(d, "runtime_bytes", (double)c->device.runtime_bytes);
    cJSON *eff = cJSON_AddObjectToObject(d, "efficiency");
    cJSON_AddNumberToObject(eff, "matmul", c->device.matmul_eff);
    cJSON_AddNumberToObject(eff, "matmul_k_half", c->device.matmul_k_half);
    cJSON_AddNumberToObject(eff, "misaligned", c->device.misaligned_eff);
    cJSON *tiles = cJSON_AddArrayToObject(eff, "tiles");
    for (int i = 0; i < c->device.n_tiles; i++) {
        double t[3] = {c->device.tile_m[i], c->device.tile_n[i], c->device.tile_eff[i]};
        cJSON_AddItemToArray(tiles, cJSON_CreateDoubleArray(t, 3));
    }
    cJSON_AddNumberToObject(eff, "memory", c->device.memory_eff);
    cJSON_AddNumberToObject(eff, "attention_fwd", c->device.attn_fwd_eff);
    cJSON_AddNumberToObject(eff, "attention_bwd", c->device.attn_bwd_eff);
    cJSON_AddNumberToObject(eff, "kernel_overhead_s", c->device.kernel_overhead_s);
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
    cJSON *ov = cJSON_AddObjectToObject(j, "overlap");
    cJSON_AddNumberToObject(ov, "compute_slowdown", c->overlap_slowdown);
    if (c->nodes)
        cJSON_AddNumberToObject(j, "nodes", c->nodes);
    if (c->shared_memory)
        cJSON_AddBoolToObject(j, "shared_memory", 1);
    return j;
}
