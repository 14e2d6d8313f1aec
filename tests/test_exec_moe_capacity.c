/* Token dropping by a capacity factor (docs/moe.md, "Token dropping"), on one rank:
 * - forced balance, tiny-moe (8 experts, top-2, 3 MoE layers), micro-batches of 1 x 32 tokens,
 *   capacity factor 0.5: each micro-batch sends every expert 32 x 2 / 8 = 8 copies, of which it
 *   keeps ceil(0.5 x 32 x 2 / 8) = 4, so 8 x 4 = 32 copies are dropped per micro-batch and MoE
 *   layer, 4 micro-batches (global batch 4) x 32 = 128 per layer and step; run.json's
 *   moe.layers[].dropped says 128 for every step, dropped_total 3 steps x 3 layers x 128;
 * - with the capacity's padding the memory per category and the FLOPs per step equal the
 *   simulator's prediction exactly (d.routed rows, Megatron-Core's padded capacity);
 * - a capacity factor nothing reaches (8 / 2 = 4: every expert may take every token of the
 *   micro-batch) trains bit-identically to dropless routing, with the router's own choice, and
 *   drops nothing; so does forced balance at 1.5, whose experts' rows are padded (8 copies for
 *   12 places each: the padding's zero rows change no sum); a capacity of 0.5 with the
 *   router's own choice trains otherwise, its rows still the plan's, and full recompute
 *   (routing and dropping again before each backward) gives its losses bit for bit. */
#include <math.h>
#include <string.h>

#include "tests/test_exec_common.h"

enum { STEPS = 3, MOE_LAYERS = 3 };

static ModelSpec spec(double cf, int force)
{
    ModelSpec s = tx_spec("tiny-moe", 32, 4, 1);
    s.model.moe.capacity_factor = cf;
    s.job.moe_force_balance = force;
    return s;
}

static void train(Exec *ex, double *loss)
{
    PxError err = {0};
    for (int i = 0; i < STEPS; i++) {
        ExecStepStats st;
        CHECK_OK(exec_step(ex, i, &st, &err), err);
        CHECK(isfinite(st.loss));
        loss[i] = st.loss;
    }
}

static const cJSON *get(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) {
        fprintf(stderr, "FAILED: run.json has no \"%s\"\n", k);
        exit(1);
    }
    return v;
}

/* Trains s for STEPS steps (losses into loss) and checks the memory per category and the FLOPs
 * of a step against the simulator's prediction, whose experts' rows are `routed`; returns the
 * executor, for its run.json. */
static Exec *check_predicted(const ModelSpec *s, int routed, double *loss)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    SimResult r;
    CHECK_OK(sim_run(s, &cl, 1, &r, &err), err);
    CHECK_EQ_INT(routed, (int)r.dims.routed);
    Exec *ex = tx_exec(s);
    train(ex, loss);
    uint64_t mem[MODEL_CAT_COUNT];
    exec_memory(ex, mem);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        if (mem[c] != r.mem[0].cat[c]) {
            fprintf(stderr, "FAILED: %s: predicted %llu bytes, measured %llu\n",
                    model_category_name((ModelCategory)c), (unsigned long long)r.mem[0].cat[c],
                    (unsigned long long)mem[c]);
            exit(1);
        }
    if (exec_step_flops(ex) != r.rank_flops[0]) {
        fprintf(stderr, "FAILED: FLOPs per step: predicted %.17g, counted %.17g\n",
                r.rank_flops[0], exec_step_flops(ex));
        exit(1);
    }
    sim_result_free(&r);
    return ex;
}

/* forced balance at capacity factor 0.5: the drops counted by hand, memory and FLOPs as
 * predicted (the plan's rows: 8 experts x capacity 4, every one filled) */
static void test_forced_drops(void)
{
    ModelSpec s = spec(0.5, 1);
    double loss[STEPS];
    Exec *ex = check_predicted(&s, 32, loss);
    cJSON *run = exec_run_to_json(ex);
    const cJSON *moe = get(run, "moe");
    CHECK_STR("capacity", cJSON_GetStringValue(get(moe, "routing")));
    CHECK_EQ_INT(4, (int)cJSON_GetNumberValue(get(moe, "capacity")));
    CHECK_EQ_INT(STEPS * MOE_LAYERS * 128, (int)cJSON_GetNumberValue(get(moe, "dropped_total")));
    const cJSON *layers = get(moe, "layers");
    CHECK_EQ_INT(MOE_LAYERS, cJSON_GetArraySize(layers));
    const cJSON *l;
    cJSON_ArrayForEach(l, layers)
    {
        const cJSON *d = get(l, "dropped");
        CHECK_EQ_INT(STEPS, cJSON_GetArraySize(d));
        for (int i = 0; i < STEPS; i++)
            CHECK_EQ_INT(128, (int)cJSON_GetArrayItem(d, i)->valuedouble);
        CHECK_EQ_INT(STEPS * 128, (int)cJSON_GetNumberValue(get(l, "dropped_total")));
        /* the router's choice, before the drops: 4 x 32 x 2 / 8 = 32 copies per expert */
        const cJSON *t = get(l, "tokens_per_expert");
        for (int e = 0; e < cJSON_GetArraySize(t); e++)
            CHECK_EQ_INT(32, (int)cJSON_GetArrayItem(t, e)->valuedouble);
    }
    cJSON_Delete(run);
    exec_free(ex);
    printf("forced balance, capacity factor 0.5: 128 copies dropped per MoE layer and step, "
           "memory and FLOPs as predicted; losses %.6f %.6f %.6f\n",
           loss[0], loss[1], loss[2]);
}

/* the router's own choice: a capacity nothing reaches trains as dropless does, to the bit */
static void test_no_drop_equivalence(void)
{
    double dropless[STEPS], roomy[STEPS], tight[STEPS];
    ModelSpec s = spec(0, 0);
    Exec *ex = tx_exec(&s);
    train(ex, dropless);
    exec_free(ex);

    s = spec(4.0, 0);
    ex = tx_exec(&s);
    train(ex, roomy);
    cJSON *run = exec_run_to_json(ex);
    CHECK_EQ_INT(0, (int)cJSON_GetNumberValue(get(get(run, "moe"), "dropped_total")));
    CHECK_EQ_INT(32, (int)cJSON_GetNumberValue(get(get(run, "moe"), "capacity")));
    cJSON_Delete(run);
    exec_free(ex);
    /* the capacity's padding: forced balance at 1.5 gives each expert 8 copies for
     * ceil(1.5 x 8) = 12 places, 4 zero rows each, 96 rows in all, which the GEMMs run on as
     * the plan prices them; nothing dropped */
    s = spec(1.5, 1);
    double padded[STEPS];
    ex = check_predicted(&s, 96, padded);
    run = exec_run_to_json(ex);
    CHECK_EQ_INT(0, (int)cJSON_GetNumberValue(get(get(run, "moe"), "dropped_total")));
    cJSON_Delete(run);
    exec_free(ex);
    s = spec(0, 1);
    double forced[STEPS];
    ex = tx_exec(&s);
    train(ex, forced);
    exec_free(ex);
    CHECK(memcmp(forced, padded, sizeof forced) == 0);
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&dropless[i], &roomy[i], sizeof(double)) != 0) {
            fprintf(stderr, "FAILED: step %d: dropless loss %.17g, capacity factor 4 %.17g\n", i,
                    dropless[i], roomy[i]);
            exit(1);
        }

    /* the router's own choice at 0.5: some experts overflow, others are padded, and the rows
     * are still the plan's */
    s = spec(0.5, 0);
    ex = check_predicted(&s, 32, tight);
    run = exec_run_to_json(ex);
    const double dropped = cJSON_GetNumberValue(get(get(run, "moe"), "dropped_total"));
    cJSON_Delete(run);
    exec_free(ex);
    CHECK(dropped > 0);
    CHECK(tight[0] != dropless[0]);
    /* full recompute routes and drops again before each backward: the same bits, the drops
     * counted once */
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    double again[STEPS];
    ex = tx_exec(&s);
    train(ex, again);
    run = exec_run_to_json(ex);
    CHECK(cJSON_GetNumberValue(get(get(run, "moe"), "dropped_total")) == dropped);
    cJSON_Delete(run);
    exec_free(ex);
    CHECK(memcmp(again, tight, sizeof again) == 0);
    printf("router's own choice: capacity factor 4 equals dropless bit for bit (%.6f %.6f "
           "%.6f); 0.5 drops %.0f copies (losses %.6f %.6f %.6f)\n",
           roomy[0], roomy[1], roomy[2], dropped, tight[0], tight[1], tight[2]);
}

int main(void)
{
    px_log_set_quiet(1);
    test_forced_drops();
    test_no_drop_equivalence();
    TEST_DONE("test_exec_moe_capacity");
}
