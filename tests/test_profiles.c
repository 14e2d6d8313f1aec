/* The built-in device and cluster profiles: every one the docs promise is there, its headline
 * figures are the datasheets' (dense peaks, HBM bandwidth; docs/profiles.md), and every figure
 * of every file cites its source in the file's `sources` object: a source may name the figure
 * itself (`peak_flops`), any object that holds it (`node` for node.link.bandwidth) or its last
 * key (`latency` for network.latency). The FP8 keys (peak_flops.mxfp8, efficiency.matmul_fp8,
 * fp8_tn_only) parse, are refused naming the key when malformed, travel through
 * prof_cluster_to_json exactly, and can be overridden with --set. */
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

/* A device with every FP8 key, figures that no built-in profile has. */
static const char fp8_device[] =
    "{\"name\": \"fp8dev\", \"memory_bytes\": 1073741824, \"memory_bandwidth\": 2e12, "
    "\"sm_count\": 100, \"fp8_tn_only\": true, "
    "\"peak_flops\": {\"fp32\": 5e13, \"bf16\": 1e15, \"fp8\": 2e15, \"mxfp8\": 1.75e15}, "
    "\"efficiency\": {\"matmul\": 0.7, \"matmul_fp8\": 0.6125}}";

/* The same device inside a cluster, with one key replaced (NULL: none) by `bad`. */
static int parse_fp8_cluster(const char *from, const char *to, ProfCluster *c, PxError *err)
{
    char dev[1024], text[2048];
    snprintf(dev, sizeof dev, "%s", fp8_device);
    if (from) {
        char *at = strstr(dev, from);
        CHECK(at != NULL);
        char tail[1024];
        snprintf(tail, sizeof tail, "%s", at + strlen(from));
        snprintf(at, sizeof dev - (size_t)(at - dev), "%s%s", to, tail);
    }
    snprintf(text, sizeof text,
             "{\"name\": \"c\", \"device\": %s, \"node\": {\"devices\": 8, \"link\": "
             "{\"bandwidth\": 3e11, \"latency\": 1e-6}}, \"network\": "
             "{\"bandwidth_per_device\": 2.5e10, \"latency\": 5e-6}}",
             dev);
    return prof_cluster_parse(text, "fp8.json", c, err);
}

static void check_fp8_keys(void)
{
    PxError err = {0};
    ProfDevice d;
    CHECK_OK(prof_device_parse(fp8_device, "fp8dev.json", &d, &err), err);
    CHECK_EQ_INT(1, d.fp8_transpose);
    CHECK_REL(2e15, prof_peak_flops(&d, PX_FP8), 0);
    CHECK_REL(1.75e15, prof_peak_mxfp8(&d), 0);
    CHECK_REL(0.6125, d.eff_matmul_fp8, 0);
    CHECK_REL(0.6125, prof_matmul_eff(&d, PX_FP8), 0);
    CHECK_REL(0.7, prof_matmul_eff(&d, PX_BF16), 0);

    /* without them: no MXFP8, no layout rule, an FP8 GEMM at the bf16 fraction */
    CHECK_OK(prof_device_parse("{\"name\": \"plain\", \"memory_bytes\": 1, \"memory_bandwidth\": "
                               "1e12, \"peak_flops\": {\"fp32\": 1e13, \"fp8\": 4e14}, "
                               "\"efficiency\": {\"matmul\": 0.55}}",
                               "plain.json", &d, &err),
             err);
    CHECK_EQ_INT(0, d.fp8_transpose);
    CHECK_REL(0, prof_peak_mxfp8(&d), 0);
    CHECK_REL(0.55, prof_matmul_eff(&d, PX_FP8), 0);

    /* exactly through the plan's inline profile */
    ProfCluster c, back;
    CHECK_OK(parse_fp8_cluster(NULL, NULL, &c, &err), err);
    cJSON *j = prof_cluster_to_json(&c);
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(j, "device");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(dev, "fp8_tn_only")));
    CHECK_REL(1.75e15, cJSON_GetObjectItemCaseSensitive(
                           cJSON_GetObjectItemCaseSensitive(dev, "peak_flops"), "mxfp8")->valuedouble, 0);
    CHECK_OK(prof_cluster_from_json(j, "round trip", &back, &err), err);
    cJSON_Delete(j);
    CHECK_EQ_INT(1, back.device.fp8_transpose);
    CHECK_REL(1.75e15, back.device.peak_mxfp8, 0);
    CHECK_REL(0.6125, back.device.eff_matmul_fp8, 0);
    prof_cluster_free(&back);
    prof_cluster_free(&c);

    /* malformed: refused naming the key */
    CHECK_INPUT_ERROR(parse_fp8_cluster("\"mxfp8\": 1.75e15", "\"mxfp8\": -1e15", &c, &err), err,
                      "peak_flops.mxfp8: must be between 0");
    CHECK_INPUT_ERROR(parse_fp8_cluster("\"fp8_tn_only\": true", "\"fp8_tn_only\": 1", &c, &err), err,
                      "fp8.json: device.fp8_tn_only: expected true or false, got a number");
    CHECK_INPUT_ERROR(parse_fp8_cluster("\"fp8_tn_only\": true", "\"fp8_tn_only\": \"yes\"", &c, &err),
                      err, "device.fp8_tn_only: expected true or false, got a string");
    CHECK_INPUT_ERROR(parse_fp8_cluster("\"matmul_fp8\": 0.6125", "\"matmul_fp8\": 1.5", &c, &err), err,
                      "efficiency.matmul_fp8: must be between 0.01 and 1");
    CHECK_INPUT_ERROR(prof_device_parse("{\"name\": \"x\", \"memory_bytes\": 1, \"memory_bandwidth\": "
                                        "1e12, \"peak_flops\": {\"fp32\": 1e13, \"mxfp8\": \"fast\"}}",
                                        "x.json", &d, &err),
                      err, "x.json: peak_flops.mxfp8: expected a number");

    /* --set reaches each of them, the switch with true/false */
    const char *sets[] = {"device.fp8_tn_only=false", "device.peak_flops.mxfp8=1e15",
                          "device.efficiency.matmul_fp8=0.5"};
    CHECK_OK(prof_cluster_load("dgx-h100", sets, 3, &c, &err), err);
    CHECK_EQ_INT(0, c.device.fp8_transpose);
    CHECK_REL(1e15, prof_peak_mxfp8(&c.device), 0);
    CHECK_REL(0.5, c.device.eff_matmul_fp8, 0);
    prof_cluster_free(&c);
    const char *on[] = {"device.fp8_tn_only=true"};
    CHECK_OK(prof_cluster_load("dgx-b200", on, 1, &c, &err), err);
    CHECK_EQ_INT(1, c.device.fp8_transpose);
    prof_cluster_free(&c);
    const char *bad[] = {"device.fp8_tn_only=maybe"};
    CHECK_INPUT_ERROR(prof_cluster_load("dgx-h100", bad, 1, &c, &err), err,
                      "--set device.fp8_tn_only: expected true or false, got 'maybe'");
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
                   {"b200", 2250e12, 8e12}, {"gb200", 2500e12, 8e12},
                   {"h800", 989.4e12, 3.35e12}, {"h20", 148e12, 4.0e12},
                   {"l40s", 362.05e12, 864e9}, {"mi300x", 1307.4e12, 5.3e12}};
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
                    {"leonardo", "a100-64gb", 4}, {"local", "cpu", 0},
                    {"gb200-nvl72", "gb200", 72}, {"deepseek-h800", "h800", 8},
                    {"hgx-h20", "h20", 8},        {"l40s-pcie", "l40s", 8},
                    {"mi300x-platform", "mi300x", 8}};
    for (size_t i = 0; i < sizeof clusters / sizeof *clusters; i++) {
        ProfCluster c;
        CHECK_OK(prof_cluster_load(clusters[i].name, NULL, 0, &c, &err), err);
        CHECK_STR(clusters[i].device, c.device.name);
        CHECK_EQ_INT(clusters[i].per_node, c.node_devices);
        prof_cluster_free(&c);
    }
    /* FP8: name, dense FP8 and MXFP8 FLOP/s, FP8 GEMMs TN-only (datasheets; docs/profiles.md) */
    static const struct {
        const char *name;
        double fp8, mxfp8;
        int tn_only;
    } fp8[] = {{"a100-40gb", 0, 0, 0},       {"a100-64gb", 0, 0, 0},
               {"a100-80gb", 0, 0, 0},       {"h100-sxm", 1978.9e12, 0, 1},
               {"h200", 1978.9e12, 0, 1},    {"b200", 4.5e15, 4.5e15, 0},
               {"gb200", 5e15, 5e15, 0},     {"cpu", 50e9, 50e9, 0},
               {"h800", 1978.9e12, 0, 1},    {"h20", 296e12, 0, 1},
               {"l40s", 733e12, 0, 1},       {"mi300x", 2614.9e12, 0, 0}};
    for (size_t i = 0; i < sizeof fp8 / sizeof *fp8; i++) {
        ProfDevice d;
        CHECK_OK(prof_device_load(fp8[i].name, &d, &err), err);
        CHECK_REL(fp8[i].fp8, prof_peak_flops(&d, PX_FP8), 0);
        CHECK_REL(fp8[i].mxfp8, prof_peak_mxfp8(&d), 0);
        CHECK_EQ_INT(fp8[i].tn_only, d.fp8_transpose);
    }
    {
        ProfDevice d;
        CHECK_OK(prof_device_load("h100-sxm", &d, &err), err);
        CHECK_REL(0.627, prof_matmul_eff(&d, PX_FP8), 0);
        CHECK_REL(0.66, prof_matmul_eff(&d, PX_BF16), 0);
        /* the CPU path decodes FP8 to fp32: the same peak */
        CHECK_OK(prof_device_load("cpu", &d, &err), err);
        CHECK_REL(d.peak_fp32, prof_peak_flops(&d, PX_FP8), 0);
        /* and its 16-bit kernels widen bf16 and fp16 to fp32 (kern_cpu_with): the same peak */
        CHECK_REL(d.peak_fp32, prof_peak_flops(&d, PX_BF16), 0);
        CHECK_REL(d.peak_fp32, prof_peak_flops(&d, PX_FP16), 0);
        CHECK_OK(prof_device_load("gb200", &d, &err), err);
        CHECK_EQ_U64(186ull << 30, d.memory_bytes);
        CHECK_REL(1.25e15, d.peak_tf32, 0);
    }
    {
        /* one NVLink domain of 72 GPUs per rack, 400 Gb/s per GPU between racks */
        ProfCluster c;
        CHECK_OK(prof_cluster_load("gb200-nvl72", NULL, 0, &c, &err), err);
        CHECK_EQ_INT(72, c.node_devices);
        CHECK_EQ_INT(72, prof_node_size(&c, 1024));
        CHECK_REL(900e9, c.link_bandwidth, 0);
        CHECK_REL(50e9, c.net_bandwidth, 0);
        prof_cluster_free(&c);
    }
    {
        /* DeepSeek-V3's cluster (arXiv:2412.19437 section 3.1): 2,048 H800 in nodes of 8, NVLink
         * 400 GB/s both ways (200 each way, 160 measured = 0.8), 50 GB/s of InfiniBand per GPU */
        ProfCluster c;
        CHECK_OK(prof_cluster_load("deepseek-h800", NULL, 0, &c, &err), err);
        CHECK_EQ_INT(256, c.nodes);
        CHECK_REL(200e9, c.link_bandwidth, 0);
        CHECK_REL(50e9, c.net_bandwidth, 0);
        CHECK_EQ_U64(80ull << 30, c.device.memory_bytes);
        prof_cluster_free(&c);
    }
    check_fp8_keys();
    TEST_DONE("profiles");
}
