/* The built-in device and cluster profiles: every one the docs promise is there, its headline
 * figures are the datasheets' (dense peaks, HBM bandwidth; docs/profiles.md), and every figure
 * of every file cites its source in the file's `sources` object: a source may name the figure
 * itself (`peak_flops`), any object that holds it (`node` for node.link.bandwidth) or its last
 * key (`latency` for network.latency). */
#include "fixtures.h"
#include "test.h"

extern const PxEmbedded prof_device_data[];
extern const int prof_device_data_count;
extern const PxEmbedded prof_cluster_data[];
extern const int prof_cluster_data_count;

static int uncited;

static int cited(const cJSON *sources, const char *path, const char *leaf)
{
    if (cJSON_GetObjectItemCaseSensitive(sources, leaf))
        return 1;
    char prefix[200];
    for (size_t i = 0; path[i]; i++) {
        if (path[i + 1] == '.' || path[i + 1] == '\0') {
            memcpy(prefix, path, i + 1);
            prefix[i + 1] = '\0';
            if (cJSON_GetObjectItemCaseSensitive(sources, prefix))
                return 1;
        }
    }
    return 0;
}

static void walk(const char *file, const cJSON *sources, const cJSON *obj, const char *path)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        if (!path[0] && (!strcmp(it->string, "schema_version") || !strcmp(it->string, "name") ||
                         !strcmp(it->string, "description") || !strcmp(it->string, "sources") ||
                         !strcmp(it->string, "device")))
            continue;
        char p[200];
        snprintf(p, sizeof p, "%s%s%s", path, path[0] ? "." : "", it->string);
        if (cJSON_IsObject(it)) {
            walk(file, sources, it, p);
        } else if (!cited(sources, p, it->string)) {
            fprintf(stderr, "%s: %s has no source\n", file, p);
            uncited++;
        }
    }
}

static void check_sources(const PxEmbedded *table, int count)
{
    for (int i = 0; i < count; i++) {
        cJSON *j = cJSON_Parse(table[i].text);
        CHECK(j != NULL);
        const cJSON *src = cJSON_GetObjectItemCaseSensitive(j, "sources");
        CHECK(cJSON_IsObject(src));
        walk(table[i].name, src, j, "");
        cJSON_Delete(j);
    }
}

int main(void)
{
    px_log_set_quiet(1);
    PxError err = {0};
    check_sources(prof_device_data, prof_device_data_count);
    check_sources(prof_cluster_data, prof_cluster_data_count);
    px_test_checks++;
    if (uncited) {
        fprintf(stderr, "FAILED: %d profile figures without a source\n", uncited);
        return 1;
    }

    /* name, dense bf16 FLOP/s, HBM bytes/s (datasheets; seed 000's table for B200) */
    static const struct {
        const char *name;
        double bf16, hbm;
    } devices[] = {{"a100-40gb", 312e12, 1555e9}, {"a100-80gb", 312e12, 2039e9},
                   {"h100-sxm", 989.4e12, 3.35e12}, {"h200", 989.4e12, 4.8e12},
                   {"b200", 2250e12, 8e12}};
    for (size_t i = 0; i < sizeof devices / sizeof *devices; i++) {
        ProfDevice d;
        CHECK_OK(prof_device_load(devices[i].name, &d, &err), err);
        CHECK_REL(devices[i].bf16, prof_peak_flops(&d, PX_BF16), 1e-12);
        CHECK_REL(devices[i].hbm, d.memory_bandwidth, 1e-12);
    }
    /* name, device, devices per node (0: the local machine, any number of ranks) */
    static const struct {
        const char *name, *device;
        int per_node;
    } clusters[] = {{"dgx-a100", "a100-80gb", 8}, {"dgx-h100", "h100-sxm", 8},
                    {"dgx-h200", "h200", 8},      {"dgx-b200", "b200", 8},
                    {"leonardo", "a100-64gb", 4}, {"local", "cpu", 0}};
    for (size_t i = 0; i < sizeof clusters / sizeof *clusters; i++) {
        ProfCluster c;
        CHECK_OK(prof_cluster_load(clusters[i].name, NULL, 0, &c, &err), err);
        CHECK_STR(clusters[i].device, c.device.name);
        CHECK_EQ_INT(clusters[i].per_node, c.node_devices);
        prof_cluster_free(&c);
    }
    TEST_DONE("profiles");
}
