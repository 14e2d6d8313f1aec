/* The plan is the whole hand-off (docs/formats.md, "Plan"): the resolved cluster profile, every
 * --set applied, and the prediction travel inline, so a plan read back anywhere predicts exactly
 * what the planner predicted. Checked here:
 * - every built-in cluster profile, and one with a measured section, survives
 *   prof_cluster_to_json -> prof_cluster_from_json unchanged (the JSON written again is the
 *   same text, and a simulation on the copy prints the same prediction);
 * - a plan made on a profile with an override carries the override: read back, its profile
 *   predicts the plan's own step time (not the built-in profile's);
 * - schema_version 1 plans (no profile) still load, their profile resolved by name;
 *   schema_version 2 without a profile, or version 3, are refused naming the key;
 * - model_predicted_read gives back the prediction's per-stage figures exactly. */
#include <stdlib.h>

#include "fixtures.h"
#include "test.h"

static char *print(const cJSON *j)
{
    char *t = cJSON_PrintUnformatted(j);
    CHECK(t != NULL);
    return t;
}

/* to_json, from_json, to_json: the same text; and the same prediction on both */
static void round_trip(const ProfCluster *c, const ModelSpec *spec, int gpus)
{
    PxError err = {0};
    cJSON *j = prof_cluster_to_json(c);
    ProfCluster back;
    CHECK_OK(prof_cluster_from_json(j, "round trip", &back, &err), err);
    cJSON *j2 = prof_cluster_to_json(&back);
    char *a = print(j), *b = print(j2);
    CHECK_STR(a, b);
    free(a);
    free(b);
    cJSON_Delete(j);
    cJSON_Delete(j2);
    if (spec) {
        SimResult r1, r2;
        CHECK_OK(sim_run(spec, c, gpus, &r1, &err), err);
        CHECK_OK(sim_run(spec, &back, gpus, &r2, &err), err);
        cJSON *p1 = sim_prediction_to_json(&r1), *p2 = sim_prediction_to_json(&r2);
        char *t1 = print(p1), *t2 = print(p2);
        CHECK_STR(t1, t2);
        free(t1);
        free(t2);
        cJSON_Delete(p1);
        cJSON_Delete(p2);
        sim_result_free(&r1);
        sim_result_free(&r2);
    }
    prof_cluster_free(&back);
}

static const char measured_profile[] =
    "{\"name\": \"m\", \"device\": \"a100-80gb\", \"node\": {\"devices\": 8, \"link\": "
    "{\"bandwidth\": 3e11, \"latency\": 1e-6}}, \"network\": {\"bandwidth_per_device\": 2.5e10, "
    "\"latency\": 5e-6}, \"measured\": {\"host\": \"h\", \"date\": \"d\", \"ranks\": 2, "
    "\"gemm\": [[2048, 2048, 2048, 1, 0.000123456789012345, 2]], \"ops\": [{\"kind\": \"norm\", "
    "\"phase\": \"fwd\", \"variant\": \"layernorm\", \"rate\": 1.23456789e11, \"overhead_s\": "
    "3.3e-6, \"concurrency\": 1}], \"collectives\": [{\"op\": \"allreduce\", \"ranks\": 2, "
    "\"nodes\": 1, \"points\": [[1024, 1e-5], [1048576, 0.000333]]}]}}";

static void test_profiles_round_trip(void)
{
    PxError err = {0};
    ModelSpec spec = fx_spec(fx_gpt(24, 2048, 16, 50257, 2048));
    spec.layout.tp = 2;
    spec.layout.pp = 2;
    spec.job.global_batch = 64;
    for (int i = 0; i < prof_cluster_count(); i++) {
        ProfCluster c;
        CHECK_OK(prof_cluster_load(prof_cluster_name(i), NULL, 0, &c, &err), err);
        ModelSpec s = spec;
        s.job.precision = sim_default_precision(&c.device);
        round_trip(&c, &s, 8);
        prof_cluster_free(&c);
    }
    ProfCluster m;
    CHECK_OK(prof_cluster_parse(measured_profile, "measured", &m, &err), err);
    CHECK(m.measured != NULL);
    round_trip(&m, &spec, 16);
    /* a copy owns its measurements: freeing the original leaves it whole */
    ProfCluster copy;
    CHECK_OK(prof_cluster_copy(&m, &copy, &err), err);
    CHECK(copy.measured != m.measured);
    prof_cluster_free(&m);
    CHECK_EQ_INT(1, copy.measured->n_gemm);
    CHECK_REL(0.000123456789012345, copy.measured->gemm[0].seconds, 0);
    CHECK_EQ_INT(2, copy.measured->coll[0].n);
    prof_cluster_free(&copy);
    printf("profiles round trip: %d checks passed\n", px_test_checks);
}

static void test_override_travels(void)
{
    PxError err = {0};
    ModelSpec spec = fx_spec(fx_gpt(4, 64, 4, 256, 64));
    spec.job.precision = PX_FP32;
    spec.job.global_batch = 8;
    spec.job.micro_batch = 4;
    const char *sets[] = {"device.peak_flops.fp32=1e9"};
    ProfCluster slow, plain;
    setenv("PARALLAX_UNCALIBRATED", "1", 1);
    CHECK_OK(prof_cluster_load("local", sets, 1, &slow, &err), err);
    CHECK_OK(prof_cluster_load("local", NULL, 0, &plain, &err), err);
    SimResult r;
    CHECK_OK(sim_run(&spec, &slow, 1, &r, &err), err);
    ModelPlan plan;
    CHECK_OK(sim_plan_make(&r, "local", &plan, &err), err);
    const double step = r.step_s;
    sim_result_free(&r);
    prof_cluster_free(&slow);
    CHECK_EQ_INT(MODEL_PLAN_SCHEMA, plan.schema_version);

    cJSON *j = model_plan_to_json(&plan);
    CHECK_EQ_INT(2, cJSON_GetObjectItemCaseSensitive(j, "schema_version")->valueint);
    CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "profile")));
    ModelPlan back;
    CHECK_OK(model_plan_from_json(j, "plan.json", &back, &err), err);
    cJSON_Delete(j);
    CHECK_REL(1e9, back.profile.device.peak_fp32, 0);
    CHECK_STR("local", back.cluster);
    /* the plan's own profile predicts the plan's step; the built-in one does not */
    SimResult again, other;
    CHECK_OK(sim_run(&back.spec, &back.profile, back.gpus, &again, &err), err);
    CHECK_OK(sim_run(&back.spec, &plain, back.gpus, &other, &err), err);
    CHECK_REL(step, again.step_s, 0);
    CHECK(other.step_s < 0.5 * step);
    sim_result_free(&again);
    sim_result_free(&other);

    ModelPredicted pr;
    CHECK_OK(model_predicted_read(&back, &pr, &err), err);
    CHECK_EQ_INT(1, pr.stages);
    CHECK_REL(step, pr.step_s[0], 0);
    CHECK_REL(step, pr.job_step_s, 0);
    const cJSON *ps = cJSON_GetArrayItem(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(back.prediction, "memory"),
                                         "per_stage"),
        0);
    CHECK_EQ_U64((uint64_t)cJSON_GetObjectItemCaseSensitive(ps, "weights")->valuedouble,
                 pr.mem[0][MODEL_WEIGHTS]);
    CHECK(pr.mem[0][MODEL_WEIGHTS] > 0);
    model_predicted_free(&pr);

    /* a deep copy survives the original */
    ModelPlan copy;
    CHECK_OK(model_plan_copy(&copy, &back, &err), err);
    model_plan_free(&back);
    CHECK_REL(1e9, copy.profile.device.peak_fp32, 0);
    CHECK(copy.prediction != NULL);
    model_plan_free(&copy);
    model_plan_free(&plan);
    prof_cluster_free(&plain);
    printf("an override travels with the plan: %d checks passed\n", px_test_checks);
}

static const char v1_plan[] =
    "{\"schema_version\": %d, \"cluster\": \"%s\", \"gpus\": 1, \"model\": {\"name\": \"m\", "
    "\"family\": \"gpt\", \"layers\": 4, \"hidden\": 64, \"heads\": 4, \"vocab\": 256, "
    "\"seq_len\": 64}, \"training\": {\"global_batch\": 8, \"micro_batch\": 4, \"seq_len\": 64, "
    "\"precision\": \"fp32\"}, \"layout\": {\"dp\": 1, \"tp\": 1, \"pp\": 1}}";

static void test_versions(void)
{
    PxError err = {0};
    char text[1024];
    ModelPlan p;
    /* version 1: the profile of that name, resolved here */
    snprintf(text, sizeof text, v1_plan, 1, "dgx-h100");
    cJSON *j = cJSON_Parse(text);
    CHECK_OK(model_plan_from_json(j, "old.json", &p, &err), err);
    CHECK_EQ_INT(1, p.schema_version);
    CHECK_STR("h100-sxm", p.profile.device.name);
    model_plan_free(&p);
    cJSON_Delete(j);
    /* version 1 naming a profile this host does not have */
    snprintf(text, sizeof text, v1_plan, 1, "no-such-cluster");
    j = cJSON_Parse(text);
    CHECK_INPUT_ERROR(model_plan_from_json(j, "old.json", &p, &err), err, "old.json: cluster:");
    cJSON_Delete(j);
    /* version 2 needs its profile */
    snprintf(text, sizeof text, v1_plan, 2, "dgx-h100");
    j = cJSON_Parse(text);
    CHECK_INPUT_ERROR(model_plan_from_json(j, "new.json", &p, &err), err, "new.json: profile: missing");
    cJSON_AddStringToObject(j, "profile", "dgx-h100");
    CHECK_INPUT_ERROR(model_plan_from_json(j, "new.json", &p, &err), err,
                      "new.json: profile: expected an object");
    cJSON_Delete(j);
    snprintf(text, sizeof text, v1_plan, 3, "dgx-h100");
    j = cJSON_Parse(text);
    CHECK_INPUT_ERROR(model_plan_from_json(j, "new.json", &p, &err), err, "schema_version");
    cJSON_Delete(j);
}

int main(void)
{
    px_log_set_quiet(1);
    test_profiles_round_trip();
    test_override_travels();
    test_versions();
    TEST_DONE("plan format");
}
