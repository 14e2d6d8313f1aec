/* Uneven pipeline splits (layout.stage_layers) through model/, the simulator, the planner and
 * the exports, with figures a person can recompute by hand.
 *
 * The tiny model: 4 layers, h 64, 4 heads, vocabulary 256, sequence 64, GPT-2 style (biases,
 * LayerNorm, learned positions, tied embeddings), trained in fp32 with micro-batches of 1.
 *   one layer:   12 h^2 + 13 h = 49984 parameters
 *   embedding:   V h + s h = 16384 + 4096 = 20480
 *   final block: 2 h (LayerNorm) + V h (the tied output layer's copy on the last stage) = 16512
 *   saved activations of one layer and micro-batch (flash attention, no dropout):
 *     16 b s h fp32 values (ln1, qkv in/out, proj, ln2, fc1 inputs; fc1/fc2 activations) plus
 *     the attention's row log-sum-exp b a s: 64 b s h + 4 b a s = 262144 + 1024 = 263168 bytes
 *   the last stage's extras: final_ln.in, logits.in (4 b s h each), loss.probs (4 b s V)
 *     = 16384 + 16384 + 65536 = 98304 bytes
 *   FLOPs of one micro-batch: a layer 3 x 24 b s h^2 (matmuls, forward and twice backward) +
 *     4 b s^2 h x (1 + 2.5) (attention, FlashAttention's backward) = 22544384; the output
 *     layer 3 x 2 b s h V = 6291456. */
#include "fixtures.h"
#include "export/export.h"
#include "sim/internal.h"
#include "test.h"

enum { LAYER_PARAMS = 49984, EMBED_PARAMS = 20480, FINAL_PARAMS = 16512 };
static const uint64_t layer_act = 263168, head_act = 98304;
static const double layer_flops = 22544384.0, head_flops = 6291456.0;

/* The tiny model on pp stages with the first n entries of split (n 0: no split). */
static ModelSpec tiny_split(int pp, const int *split, int n, int gbs)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny", &s.model, &err), err);
    s.job.precision = PX_FP32;
    s.job.global_batch = gbs;
    s.layout.pp = pp;
    s.layout.n_stage_layers = n;
    for (int i = 0; i < n; i++)
        s.layout.stage_layers[i] = split[i];
    return s;
}

static void expect_split_error(ModelSpec s, int gpus, const char *needle)
{
    PxError err = {0};
    ModelDims d;
    CHECK_INPUT_ERROR(model_spec_check(&s, gpus, &d, &err), err, needle);
}

/* The layout rules for a split, and what the checked spec holds. */
static void test_rules(void)
{
    PxError err = {0};
    ModelDims d;
    const int s112[3] = {1, 1, 2}, s22[2] = {2, 2}, s13[2] = {1, 3}, s103[3] = {1, 0, 3},
              s111[3] = {1, 1, 1}, sneg[2] = {-1, 5};
    ModelSpec s = tiny_split(3, s112, 3, 8);
    CHECK_OK(model_spec_check(&s, 3, &d, &err), err);
    CHECK(d.uneven && d.chunk_layers == 0);
    int first, n;
    n = model_chunk_layers(&s, &d, 0, &first);
    CHECK(n == 1 && first == 0);
    n = model_chunk_layers(&s, &d, 1, &first);
    CHECK(n == 1 && first == 1);
    n = model_stage_layers(&s, &d, 2, &first);
    CHECK(n == 2 && first == 2);

    /* an all-equal split is the even one */
    s = tiny_split(2, s22, 2, 8);
    CHECK_OK(model_spec_check(&s, 2, &d, &err), err);
    CHECK(!d.uneven && d.chunk_layers == 2 && s.layout.n_stage_layers == 0);

    expect_split_error(tiny_split(3, s13, 2, 8), 3, "stage_layers 1,3 has 2 entries: pp is 3");
    expect_split_error(tiny_split(3, s103, 3, 8), 3, "stage_layers 1,0,3: entry 2 (stage 1) is 0");
    expect_split_error(tiny_split(2, sneg, 2, 8), 2, "entry 1 (stage 0) is -1");
    expect_split_error(tiny_split(3, s111, 3, 8), 3, "stage_layers 1,1,1 sums to 3 layers: the model has 4");
    s = tiny_split(2, s13, 2, 8);
    s.layout.vpp = 2;
    expect_split_error(s, 2, "stage_layers 1,3 has 2 entries: pp 2 x vpp 2 = 4 (one entry per virtual stage");
    /* no split: pp must divide the layers, and the message offers the planner's split */
    expect_split_error(tiny_split(3, NULL, 0, 8), 3,
                       "pp 3 x vpp 1 = 3 must divide the 4 layers, or give each stage its layers "
                       "(--pp-layers, layout.stage_layers; e.g. 1,2,1), or count the embedding and the "
                       "loss each as a layer (--account-for-embedding-in-pipeline-split "
                       "--account-for-loss-in-pipeline-split: 4 + 2 = 6)");

    /* the balanced split: leftovers on the middle stages, the last middle one first, then the
     * chosen end */
    int out[8];
    model_split_balanced(4, 3, 0, out);
    CHECK(out[0] == 1 && out[1] == 2 && out[2] == 1);
    model_split_balanced(10, 4, 0, out);
    CHECK(out[0] == 2 && out[1] == 3 && out[2] == 3 && out[3] == 2);
    model_split_balanced(11, 4, 0, out);
    CHECK(out[0] == 3 && out[1] == 3 && out[2] == 3 && out[3] == 2);
    model_split_balanced(11, 4, 1, out);
    CHECK(out[0] == 2 && out[1] == 3 && out[2] == 3 && out[3] == 3);
    model_split_balanced(5, 2, 0, out);
    CHECK(out[0] == 3 && out[1] == 2);

    /* parsing --pp-layers */
    ModelLayout l;
    memset(&l, 0, sizeof l);
    CHECK_OK(model_split_parse("1,2,1", "--pp-layers", &l, &err), err);
    CHECK(l.n_stage_layers == 3 && l.stage_layers[1] == 2);
    CHECK_INPUT_ERROR(model_split_parse("1,,3", "--pp-layers", &l, &err), err, "--pp-layers: expected");
    CHECK_INPUT_ERROR(model_split_parse("2,0", "--pp-layers", &l, &err), err, "entry 2 is 0");
    CHECK_INPUT_ERROR(model_split_parse("3,-1", "--pp-layers", &l, &err), err, "entry 2 is -1");
}

/* Per-stage tensor tables and op graphs: parameters, layers and FLOPs of each stage. */
static void test_tables(void)
{
    PxError err = {0};
    const int s112[3] = {1, 1, 2}, s13[2] = {1, 3};
    const struct {
        int pp;
        const int *split;
        uint64_t params[3];
        const char *first_layer[3];
    } cases[2] = {
        {3, s112, {EMBED_PARAMS + LAYER_PARAMS, LAYER_PARAMS, 2 * LAYER_PARAMS + FINAL_PARAMS},
         {"layer.0.ln1.w", "layer.1.ln1.w", "layer.2.ln1.w"}},
        {2, s13, {EMBED_PARAMS + LAYER_PARAMS, 3 * LAYER_PARAMS + FINAL_PARAMS, 0},
         {"layer.0.ln1.w", "layer.1.ln1.w", NULL}},
    };
    for (int c = 0; c < 2; c++) {
        ModelSpec s = tiny_split(cases[c].pp, cases[c].split, cases[c].pp, 8);
        ModelDims d;
        CHECK_OK(model_spec_check(&s, cases[c].pp, &d, &err), err);
        uint64_t total = 0;
        for (int st = 0; st < cases[c].pp; st++) {
            ModelTensorTable tt, ct;
            ModelOpGraph g;
            CHECK_OK(model_tensors_build(&s, &d, st, &tt, &err), err);
            CHECK_OK(model_tensors_build_compact(&s, &d, st, &ct, &err), err);
            CHECK_EQ_U64(cases[c].params[st], tt.params);
            CHECK_EQ_U64(cases[c].params[st], ct.params);
            CHECK_EQ_U64(4 * cases[c].params[st], model_tensors_bytes(&tt, MODEL_WEIGHTS));
            for (int k = 0; k < MODEL_CAT_COUNT; k++)
                CHECK_EQ_U64(model_tensors_bytes(&tt, (ModelCategory)k), model_tensors_bytes(&ct, (ModelCategory)k));
            total += tt.params;
            /* the stage's layers are its own: the first is the one after the stages before */
            int first_found = -1, layers = 0;
            for (int i = 0; i < tt.count; i++) {
                if (first_found < 0 && tt.t[i].layer >= 0)
                    first_found = i;
                if (tt.t[i].cat == MODEL_WEIGHTS && strstr(tt.t[i].name, ".ln1.w"))
                    layers++;
            }
            CHECK(first_found >= 0);
            CHECK_STR(cases[c].first_layer[st], tt.t[first_found].name);
            int f;
            CHECK_EQ_INT(model_stage_layers(&s, &d, st, &f), layers);
            /* FLOPs of one micro-batch: the stage's layers, and the output layer on the last */
            CHECK_OK(model_ops_build(&s, &d, st, &g, &err), err);
            double flops = 0;
            for (int i = 0; i < g.count; i++)
                flops += g.op[i].per_microbatch ? g.op[i].flops * g.op[i].repeat : 0;
            CHECK_REL(layers * layer_flops + (st == cases[c].pp - 1 ? head_flops : 0), flops, 1e-12);
            model_ops_free(&g);
            model_tensors_free(&tt);
            model_tensors_free(&ct);
        }
        /* every parameter once, plus the tied output layer's copy */
        CHECK_EQ_U64(4 * LAYER_PARAMS + EMBED_PARAMS + FINAL_PARAMS, total);
    }
}

/* The simulator: memory, FLOPs, communication and time per stage of the two splits. */
static void test_sim(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    const int s112[3] = {1, 1, 2}, s13[2] = {1, 3};
    /* 8 micro-batches; under 1F1B stage s keeps p - s activation sets in flight */
    const struct {
        int pp;
        const int *split;
        uint64_t params[3], act[3], comm[3];
        double flops[3];
        int heaviest; /* most layers (with the output layer on the last stage) */
    } cases[2] = {
        {3,
         s112,
         {EMBED_PARAMS + LAYER_PARAMS, LAYER_PARAMS, 2 * LAYER_PARAMS + FINAL_PARAMS},
         {3 * layer_act, 2 * layer_act, 2 * layer_act + head_act},
         /* 8 sends and 8 receives of b s h fp32 (16384 bytes) per neighbour, the tied
          * embedding's gradient (V h fp32) on both ends */
         {2 * 8 * 16384 + 65536, 4 * 8 * 16384, 2 * 8 * 16384 + 65536},
         {8 * layer_flops, 8 * layer_flops, 8 * (2 * layer_flops + head_flops)},
         2},
        {2,
         s13,
         {EMBED_PARAMS + LAYER_PARAMS, 3 * LAYER_PARAMS + FINAL_PARAMS, 0},
         {2 * layer_act, 3 * layer_act + head_act, 0},
         {2 * 8 * 16384 + 65536, 2 * 8 * 16384 + 65536, 0},
         {8 * layer_flops, 8 * (3 * layer_flops + head_flops), 0},
         1},
    };
    for (int c = 0; c < 2; c++) {
        const int p = cases[c].pp;
        ModelSpec s = tiny_split(p, cases[c].split, p, 8);
        SimResult r, fast;
        CHECK_OK(sim_run(&s, &cl, p, &r, &err), err);
        CHECK_OK(sim_run_ex(&s, &cl, p, 1, SIM_FULL, &fast, &err), err);
        double slowest = 0;
        for (int st = 0; st < p; st++) {
            const uint64_t w = 4 * cases[c].params[st];
            CHECK_EQ_U64(w, r.mem[st].cat[MODEL_WEIGHTS]);
            CHECK_EQ_U64(w, r.mem[st].cat[MODEL_GRADS]);
            CHECK_EQ_U64(2 * w, r.mem[st].cat[MODEL_OPTIMIZER]);
            CHECK_EQ_U64(cases[c].act[st], r.mem[st].cat[MODEL_ACTIVATIONS]);
            CHECK_EQ_INT(p - st, r.mem[st].peak_live);
            uint64_t bytes = 0;
            for (int k = 0; k < MODEL_COMM_COUNT; k++)
                bytes += r.comm[st][k];
            CHECK_EQ_U64(cases[c].comm[st], bytes);
            CHECK_REL(cases[c].flops[st], r.rank_flops[st], 1e-12);
            /* the planner's fast path agrees */
            for (int k = 0; k < MODEL_CAT_COUNT; k++)
                CHECK_EQ_U64(r.mem[st].cat[k], fast.mem[st].cat[k]);
            CHECK_REL(r.rank_flops[st], fast.rank_flops[st], 1e-12);
            CHECK_REL(r.stage_time[st].step_s, fast.stage_time[st].step_s, 1e-9);
            if (r.stage_time[st].step_s > slowest)
                slowest = r.stage_time[st].step_s;
        }
        /* the step is the stage's that ends last (1F1B: the first, which runs the last
         * backward), and the heaviest stage sets its pace: no step is shorter than that
         * stage's m forwards and backwards after the first micro-batch reaches it and before
         * its last gradient returns to stage 0 */
        CHECK_EQ_INT(0, r.critical_stage);
        CHECK_REL(slowest, r.step_s, 1e-15);
        const int h = cases[c].heaviest;
        double bound = 8 * (r.work->pass_fwd[h] + r.work->pass_bwd[h]);
        for (int st = 0; st < h; st++)
            bound += r.work->pass_fwd[st] + r.work->pass_bwd[st];
        for (int st = 0; st < p; st++)
            CHECK(st == h || r.work->pass_fwd[st] + r.work->pass_bwd[st] < r.work->pass_fwd[h] + r.work->pass_bwd[h]);
        CHECK(r.step_s >= bound);
        /* a stage with fewer layers idles more: stage 0 waits on the heavier stages after it */
        CHECK(r.stage_time[0].bubble_fraction > r.stage_time[p - 1].bubble_fraction);
        /* JSON: the layout carries the split, every stage its layers */
        cJSON *j = sim_result_to_json(&r);
        const cJSON *sl = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "layout"), "stage_layers");
        CHECK(cJSON_IsArray(sl) && cJSON_GetArraySize(sl) == p);
        const cJSON *ps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "memory"), "per_stage");
        for (int st = 0; st < p; st++) {
            CHECK_EQ_INT(cases[c].split[st], cJSON_GetArrayItem(sl, st)->valueint);
            CHECK_EQ_INT(cases[c].split[st],
                         cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ps, st), "layers")->valueint);
        }
        cJSON_Delete(j);
        sim_result_free(&r);
        sim_result_free(&fast);
    }

    /* the heaviest stage sets the step: 1,3 is slower than the even 2,2, and on three stages
     * the planner's 1,2,1 (the extra layer away from the output layer) beats 1,1,2 */
    const int s22[2] = {2, 2}, s121[3] = {1, 2, 1};
    const struct {
        int pp;
        const int *faster, *slower;
    } pairs[2] = {{2, s22, s13}, {3, s121, s112}};
    for (int i = 0; i < 2; i++) {
        ModelSpec a = tiny_split(pairs[i].pp, pairs[i].faster, pairs[i].pp, 8);
        ModelSpec b = tiny_split(pairs[i].pp, pairs[i].slower, pairs[i].pp, 8);
        SimResult ra, rb;
        CHECK_OK(sim_run(&a, &cl, pairs[i].pp, &ra, &err), err);
        CHECK_OK(sim_run(&b, &cl, pairs[i].pp, &rb, &err), err);
        CHECK(ra.step_s < rb.step_s);
        sim_result_free(&ra);
        sim_result_free(&rb);
    }

    /* the compact path with middle stages of several sizes stands each group for itself */
    const int splits[3][4] = {{1, 3, 2, 2}, {2, 2, 3, 1}, {1, 2, 3, 2}};
    for (int i = 0; i < 3; i++) {
        ModelSpec s = fx_spec(fx_gpt(8, 64, 4, 256, 64));
        s.job.precision = PX_FP32;
        s.job.global_batch = 8;
        s.layout.pp = 4;
        s.layout.n_stage_layers = 4;
        memcpy(s.layout.stage_layers, splits[i], sizeof splits[i]);
        SimResult r, fast;
        CHECK_OK(sim_run(&s, &cl, 4, &r, &err), err);
        CHECK_OK(sim_run_ex(&s, &cl, 4, 1, SIM_FULL, &fast, &err), err);
        for (int st = 0; st < 4; st++) {
            for (int k = 0; k < MODEL_CAT_COUNT; k++)
                CHECK_EQ_U64(r.mem[st].cat[k], fast.mem[st].cat[k]);
            for (int k = 0; k < MODEL_COMM_COUNT; k++)
                CHECK_EQ_U64(r.comm[st][k], fast.comm[st][k]);
            CHECK_REL(r.rank_flops[st], fast.rank_flops[st], 1e-12);
            CHECK_REL(r.stage_time[st].step_s, fast.stage_time[st].step_s, 1e-9);
        }
        CHECK_REL(r.step_s, fast.step_s, 1e-9);
        sim_result_free(&r);
        sim_result_free(&fast);
    }
}

/* The planner: a balanced split where pp does not divide the layers, a pinned one kept, and
 * the plan it writes carries the split through the plan format. */
static void test_planner(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    q.base = tiny_split(3, NULL, 0, 8);
    q.pinned = SIM_PIN_PP;
    q.gpus = 3;
    q.top = 3;
    q.headroom = 0.05;
    SimPlanResult res;
    CHECK_OK(sim_plan(&q, &cl, &res, &err), err);
    const ModelLayout *l = &res.top[0].spec.layout;
    CHECK_EQ_INT(3, l->n_stage_layers);
    CHECK(l->stage_layers[0] == 1 && l->stage_layers[1] == 2 && l->stage_layers[2] == 1);
    CHECK_EQ_U64(0, (uint64_t)res.rejected[MODEL_RULE_LAYERS]);
    ModelPlan plan;
    SimResult full;
    CHECK_OK(sim_plan_best(&res, &cl, "local", 3, &plan, &full, &err), err);
    cJSON *pj = model_plan_to_json(&plan);
    ModelPlan back;
    CHECK_OK(model_plan_from_json(pj, "plan", &back, &err), err);
    CHECK_EQ_INT(3, back.spec.layout.n_stage_layers);
    CHECK_EQ_INT(2, back.spec.layout.stage_layers[1]);
    /* the Megatron export: first and last stage given, the middle one even */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    CHECK_OK(export_plan(f, &back, EXPORT_MEGATRON, &err), err);
    fclose(f);
    CHECK(strstr(text, "    --decoder-first-pipeline-num-layers 1\n") != NULL);
    CHECK(strstr(text, "    --decoder-last-pipeline-num-layers 1\n") != NULL);
    free(text);
    cJSON_Delete(pj);
    model_plan_free(&back);
    model_plan_free(&plan);
    sim_result_free(&full);
    sim_plan_free(&res);

    /* a pinned split is kept, and bad values in a plan name the key */
    const int s13[2] = {1, 3};
    q.base = tiny_split(2, s13, 2, 8);
    q.pinned = SIM_PIN_PP | SIM_PIN_PP_LAYERS;
    q.gpus = 2;
    CHECK_OK(sim_plan(&q, &cl, &res, &err), err);
    for (int i = 0; i < res.n_top; i++) {
        CHECK_EQ_INT(1, res.top[i].spec.layout.stage_layers[0]);
        CHECK_EQ_INT(3, res.top[i].spec.layout.stage_layers[1]);
        CHECK_EQ_INT(1, res.top[i].spec.layout.vpp);
    }
    CHECK_OK(sim_plan_best(&res, &cl, "local", 2, &plan, &full, &err), err);
    pj = model_plan_to_json(&plan);
    cJSON *lay = cJSON_GetObjectItemCaseSensitive(pj, "layout");
    cJSON_ReplaceItemInObject(lay, "stage_layers", cJSON_CreateIntArray((const int[]){2, -1}, 2));
    CHECK_INPUT_ERROR(model_plan_from_json(pj, "p.json", &back, &err), err,
                      "p.json: layout.stage_layers[1]: expected 0 to 100000 layers, got -1");
    model_plan_free(&back);
    cJSON_ReplaceItemInObject(lay, "stage_layers", cJSON_CreateIntArray((const int[]){2, 1}, 2));
    CHECK_INPUT_ERROR(model_plan_from_json(pj, "p.json", &back, &err), err,
                      "stage_layers 2,1 sums to 3 layers: the model has 4");
    model_plan_free(&back);
    cJSON_ReplaceItemInObject(lay, "stage_layers", cJSON_CreateString("1,3"));
    CHECK_INPUT_ERROR(model_plan_from_json(pj, "p.json", &back, &err), err,
                      "layout.stage_layers: expected an array of layers per stage, got a string");
    model_plan_free(&back);
    cJSON_Delete(pj);
    model_plan_free(&plan);
    sim_result_free(&full);
    sim_plan_free(&res);

    /* middle stages of different sizes: not first/last counts, Megatron-Core's layout */
    ModelPlan odd;
    memset(&odd, 0, sizeof odd);
    odd.spec = fx_spec(fx_gpt(8, 64, 4, 256, 64));
    odd.spec.job.precision = PX_FP32;
    odd.spec.job.global_batch = 8;
    odd.spec.layout.pp = 4;
    odd.spec.layout.n_stage_layers = 4;
    memcpy(odd.spec.layout.stage_layers, (const int[]){1, 3, 2, 2}, 4 * sizeof(int));
    odd.gpus = 4;
    px_strlcpy(odd.cluster, "local", sizeof odd.cluster);
    f = open_memstream(&text, &len);
    CHECK_OK(export_plan(f, &odd, EXPORT_MEGATRON, &err), err);
    fclose(f);
    CHECK(strstr(text, "# uneven pipeline split 1,3,2,2: its middle stages differ") != NULL);
    CHECK(strstr(text, "    --pipeline-model-parallel-layout 'Et|t*3|t*2|t*2L'\n") != NULL);
    CHECK(strstr(text, "--decoder-first-pipeline-num-layers") == NULL);
    free(text);
}

int main(void)
{
    px_log_set_quiet(1);
    test_rules();
    test_tables();
    test_sim();
    test_planner();
    TEST_DONE("uneven");
}
