/* validate's host check: the probe's figures against the calibrated profile's, the 10% bar
 * both ways, and what it prints. */
#include "test.h"
#include "validate/validate.h"

/* what val_host_print writes for h, in a buffer */
static char *printed(const ValHostCheck *h, const ProfMeasured *m)
{
    static char buf[1024];
    buf[0] = '\0'; /* nothing written leaves the buffer as it was */
    FILE *f = fmemopen(buf, sizeof buf, "w");
    val_host_print(f, h, m);
    fclose(f);
    return buf;
}

/* a profile calibrated on 2026-11-20 at 100 GFLOP/s and 40 GB/s */
static ProfMeasured calibrated(void)
{
    ProfMeasured m;
    memset(&m, 0, sizeof m);
    snprintf(m.date, sizeof m.date, "2026-11-20");
    m.peak_flops = 100e9;
    m.memory_bandwidth = 40e9;
    return m;
}

static void test_compare(void)
{
    ProfMeasured m = calibrated();
    ValHostCheck h;
    /* 5% faster GEMMs, 2% less bandwidth: within */
    val_host_compare(&m, 105e9, 39.2e9, &h);
    CHECK_EQ_INT(1, h.probed);
    CHECK_EQ_INT(0, h.drifted);
    CHECK_REL(0.05, h.peak_change, 1e-12);
    CHECK_REL(-0.02, h.bw_change, 1e-12);
    CHECK_STR("host check: GEMM 105.0 GFLOP/s now, 100.0 when calibrated on 2026-11-20 (+5.0%); "
              "memory 39.2 GB/s now, 40.0 (-2.0%): within 10%\n",
              printed(&h, &m));
    /* exactly at the bar is still within; just beyond it is not */
    val_host_compare(&m, 110e9, 40e9, &h);
    CHECK_EQ_INT(0, h.drifted);
    val_host_compare(&m, 100e9, 35.9e9, &h);
    CHECK_EQ_INT(1, h.drifted);
    /* 25% slower GEMMs outweigh 12% more bandwidth in the verdict */
    val_host_compare(&m, 75e9, 44.8e9, &h);
    CHECK_EQ_INT(1, h.drifted);
    CHECK_STR("host check: GEMM 75.0 GFLOP/s now, 100.0 when calibrated on 2026-11-20 (-25.0%); "
              "memory 44.8 GB/s now, 40.0 (+12.0%)\n"
              "host check: this host runs 25% slower than when it was calibrated (GEMMs): "
              "predictions made with its profile are off by about as much; run `parallax "
              "calibrate` (or validate --recalibrate) to calibrate it again\n",
              printed(&h, &m));
    val_host_compare(&m, 100e9, 60e9, &h);
    CHECK(strstr(printed(&h, &m), "runs 50% faster than when it was calibrated (memory bandwidth)"));
    /* a profile without the figures, or no profile: no check, nothing printed */
    m.peak_flops = 0;
    val_host_compare(&m, 100e9, 40e9, &h);
    CHECK_EQ_INT(0, h.probed);
    CHECK_STR("", printed(&h, &m));
    val_host_compare(NULL, 100e9, 40e9, &h);
    CHECK_EQ_INT(0, h.probed);
}

/* a probe while other processes took the cores: a slower one is the load's doing, not judged;
 * ten times slower, or faster, is the profile's, still drifted */
static void test_busy(void)
{
    ProfMeasured m = calibrated();
    ValQuiet w;
    memset(&w, 0, sizeof w);
    w.measured = 1;
    w.other_share = 0.89;
    w.steal_share = 0;
    ValHostCheck h;
    val_host_compare(&m, 25e9, 18e9, &h);
    CHECK_EQ_INT(1, h.drifted);
    val_host_busy(&h, &w);
    CHECK_EQ_INT(1, h.busy);
    CHECK_EQ_INT(0, h.drifted);
    CHECK_STR("host check: GEMM 25.0 GFLOP/s now, 100.0 when calibrated on 2026-11-20 (-75.0%); "
              "memory 18.0 GB/s now, 40.0 (-55.0%): not judged: during the probe other processes "
              "took 89% of the cores' time (quiet is under 5%), so the change says how busy the "
              "machine was, not how fast the host is (do not calibrate now)\n",
              printed(&h, &m));
    cJSON *j = val_host_json(&h);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "busy")));
    CHECK_STR(h.busy_why, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "busy_why")));
    cJSON_Delete(j);
    /* ten times slower or more: no load explains it */
    val_host_compare(&m, 10e9, 30e9, &h);
    val_host_busy(&h, &w);
    CHECK_EQ_INT(0, h.busy);
    CHECK_EQ_INT(1, h.drifted);
    /* faster than calibrated: neither */
    val_host_compare(&m, 125e9, 40e9, &h);
    val_host_busy(&h, &w);
    CHECK_EQ_INT(0, h.busy);
    CHECK_EQ_INT(1, h.drifted);
    /* a quiet window judges as before; steal alone does not make the probe busy */
    val_host_compare(&m, 75e9, 40e9, &h);
    w.other_share = 0.04;
    w.steal_share = 0.05;
    val_host_busy(&h, &w);
    CHECK_EQ_INT(0, h.busy);
    CHECK_EQ_INT(1, h.drifted);
}

/* the figures travel through the profile's JSON */
static void test_profile_json(void)
{
    PxError err = {0};
    cJSON *j = cJSON_Parse("{\"host\":\"h\",\"date\":\"2026-11-20\",\"ranks\":2,"
                           "\"peak_flops\":1.5e11,\"memory_bandwidth\":4e10,\"quick\":true}");
    ProfMeasured *m = NULL;
    CHECK_OK(prof_measured_from_json(j, "p.json:", &m, &err), err);
    CHECK_REL(1.5e11, m->peak_flops, 0);
    CHECK_REL(4e10, m->memory_bandwidth, 0);
    CHECK_EQ_INT(1, m->quick);
    cJSON *back = prof_measured_to_json(m);
    CHECK_REL(1.5e11, cJSON_GetNumberValue(cJSON_GetObjectItem(back, "peak_flops")), 0);
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(back, "quick")));
    cJSON_Delete(back);
    prof_measured_free(m);
    cJSON_Delete(j);
    /* a negative figure names its key */
    j = cJSON_Parse("{\"peak_flops\":-1}");
    CHECK_INPUT_ERROR(prof_measured_from_json(j, "p.json:", &m, &err), err, "peak_flops");
    cJSON_Delete(j);
}

int main(void)
{
    px_log_set_quiet(1);
    test_compare();
    test_busy();
    test_profile_json();
    TEST_DONE("validate_host");
}
