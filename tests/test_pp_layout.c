/* Megatron-Core's forms of the pipeline split (model/split.c): the embedding and the loss
 * counted as layers, first/last stage layers, the layout string; what the simulator costs on
 * each virtual stage, what the planner tries, and what the exports say.
 *
 * The tiny model (tests/test_uneven.c derives its figures): 4 layers of 49984 parameters, the
 * embedding 20480, the final block (LayerNorm and the tied output layer's copy) 16512; a
 * micro-batch's FLOPs 22544384 per layer and 6291456 for the output layer. */
#include "fixtures.h"
#include "export/internal.h"
#include "sim/internal.h"
#include "test.h"

enum { LAYER_PARAMS = 49984, EMBED_PARAMS = 20480, FINAL_PARAMS = 16512 };
static const double layer_flops = 22544384.0, head_flops = 6291456.0;

static ModelSpec spec_of(const char *model, int pp, int vpp)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(model, &s.model, &err), err);
    s.layout.pp = pp;
    s.layout.vpp = vpp;
    s.job.global_batch = 4 * pp; /* interleaving needs micro-batches in multiples of pp */
    return s;
}

static void expect_split(ModelSpec s, int gpus, const int *want, int n, int vpp)
{
    PxError err = {0};
    ModelDims d;
    CHECK_OK(model_spec_check(&s, gpus, &d, &err), err);
    CHECK_EQ_INT(vpp, s.layout.vpp);
    CHECK_EQ_INT(n, s.layout.n_stage_layers);
    for (int i = 0; i < n && i < s.layout.n_stage_layers; i++)
        CHECK_EQ_INT(want[i], s.layout.stage_layers[i]);
}

static void expect_error(ModelSpec s, int gpus, const char *needle)
{
    PxError err = {0};
    ModelDims d;
    CHECK_INPUT_ERROR(model_spec_check(&s, gpus, &d, &err), err, needle);
}

static void test_accounting(void)
{
    /* Llama 3.1 405B in NVIDIA's recipes: 126 + 2 over pp 8 x vpp 8 = 64 chunks of 2, the
     * first holding the embedding and one layer, the last one layer and the loss */
    ModelSpec s = spec_of("llama3-405b", 8, 8);
    s.layout.tp = 8;
    s.layout.embed_in_split = s.layout.loss_in_split = 1;
    int want[64];
    for (int i = 0; i < 64; i++)
        want[i] = 2;
    want[0] = want[63] = 1;
    expect_split(s, 64, want, 64, 8);
    /* the embedding alone: 127 over 64 does not divide */
    s.layout.loss_in_split = 0;
    expect_error(s, 64, "126 layers + 1 counted for the embedding and the loss = 127 must divide into pp 8 x vpp 8 = 64 stages");
    /* without either, the rule says how Megatron-Core would split it */
    s.layout.embed_in_split = 0;
    expect_error(s, 64, "pp 8 x vpp 8 = 64 must divide the 126 layers, or count the embedding and the loss each as a "
                        "layer (--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split: "
                        "126 + 2 = 128), or give each stage its layers");
    /* tiny on pp 2 x vpp 3: (4 + 2) / 6 = 1, so the first and last chunks hold no layer */
    ModelSpec t = spec_of("tiny", 2, 3);
    t.layout.embed_in_split = t.layout.loss_in_split = 1;
    expect_split(t, 2, (const int[]){0, 1, 1, 1, 1, 0}, 6, 3);
}

static void test_first_last(void)
{
    /* llama3-8b, 32 layers on pp 4 x vpp 2: 6 on the first and the last rank (3 a chunk),
     * the 20 others 10 a middle rank (5 a chunk); virtual stage j * 4 + rank */
    ModelSpec s = spec_of("llama3-8b", 4, 2);
    s.layout.first_stage_layers = s.layout.last_stage_layers = 6;
    expect_split(s, 4, (const int[]){3, 5, 5, 3, 3, 5, 5, 3}, 8, 2);
    s.layout.first_stage_layers = 5;
    expect_error(s, 4, "first/last pipeline stage layers 5/6 must divide by vpp 2");
    s.layout.first_stage_layers = 8;
    expect_error(s, 4, "first/last pipeline stage layers 8/6 leave 18 layers, which 2 middle stages x vpp 2 cannot share evenly");
    s.layout.embed_in_split = 1;
    expect_error(s, 4, "give one way to split the pipeline");
}

static void test_layout_string(void)
{
    /* DeepSeek-V3 on 16 stages: 61 layers, the prediction module with the loss */
    ModelSpec s = spec_of("deepseek-v3", 16, 1);
    snprintf(s.layout.pp_layout, sizeof s.layout.pp_layout, "Et*3|(t*4|)*14,t*2mL");
    int want[16];
    for (int i = 0; i < 16; i++)
        want[i] = 4;
    want[0] = 3;
    want[15] = 2;
    expect_split(s, 16, want, 16, 1);
    /* vpp from the string: tiny on pp 2 as 4 stages, a chunk of one layer each, i.e. even */
    ModelSpec t = spec_of("tiny", 2, 1);
    snprintf(t.layout.pp_layout, sizeof t.layout.pp_layout, "Et|t|t|tL");
    expect_split(t, 2, NULL, 0, 2);
    snprintf(t.layout.pp_layout, sizeof t.layout.pp_layout, "E|t*2|t*2|L");
    expect_split(t, 2, (const int[]){0, 2, 2, 0}, 4, 2);
    /* errors point at the character */
    const struct {
        const char *text, *needle;
    } bad[] = {
        {"Et|tx|tL", "'Et|tx|tL': character 5 ('x'): expected E (embedding), t (layer)"},
        {"tE|t*3L", "character 2 ('E'): the embedding E comes first"},
        {"Et|t*3Lt", "character 8 ('t'): nothing may follow the loss L"},
        {"Et|(t*3L", "character 4 ('('): a '(' without its ')'"},
        {"Et|t*0L", "character 5 ('*'): a repeat needs a count from 1 to 100000"},
        {"Et|(tt)L", "character 7 (')'): a group needs a repeat count after it"},
        {"*3Et|t*4L", "character 1 ('*'): a repeat needs something before it"},
        {"Et|t|t|t|tL", "has 5 stages: it needs pp 2 x vpp 1 = 2"},
        {"Et|t*2L", "has 3 layers t: model tiny has 4"},
        {"Et|t*3", "no loss L: the last stage ends with it"},
        {"t|t*3L", "no embedding E"},
        {"Et|t*3mL", "has 1 prediction modules m: model tiny has 0"},
        {"Ett|t|tt||L", "has 5 stages: it needs pp 2 x vpp 1 = 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ModelSpec b = spec_of("tiny", 2, 1);
        snprintf(b.layout.pp_layout, sizeof b.layout.pp_layout, "%s", bad[i].text);
        expect_error(b, 2, bad[i].needle);
    }
    /* an empty middle stage holds nothing at all */
    ModelSpec e = spec_of("tiny", 2, 2);
    snprintf(e.layout.pp_layout, sizeof e.layout.pp_layout, "Et*2||t*2|L");
    expect_error(e, 2, "entry 2 (stage 1) is 0: a stage with neither the embedding nor the loss needs at least one layer");
    /* Megatron-LM's DeepSeek-V3 example: the prediction module on a stage of its own, the 31st
     * of 32, between the last layers and the loss; the resolved split counts layers t only */
    ModelSpec m = spec_of("deepseek-v3", 16, 2);
    snprintf(m.layout.pp_layout, sizeof m.layout.pp_layout, "Et*3|(tt|)*29,m|L");
    int want32[32];
    for (int i = 0; i < 32; i++)
        want32[i] = i == 0 ? 3 : i < 30 ? 2 : 0;
    expect_split(m, 16, want32, 32, 2);
    {
        PxError err = {0};
        ModelDims d;
        CHECK_OK(model_spec_check(&m, 16, &d, &err), err);
        CHECK_EQ_INT(1, m.layout.mtp_from_last);
        CHECK_EQ_INT(30, d.mtp_chunk);
        /* resolved again from the string alone (a plan read back), it lands the same */
        ModelSpec again = spec_of("deepseek-v3", 16, 1);
        snprintf(again.layout.pp_layout, sizeof again.layout.pp_layout, "%s", m.layout.pp_layout);
        CHECK_OK(model_spec_check(&again, 16, &d, &err), err);
        CHECK_EQ_INT(2, again.layout.vpp);
        CHECK_EQ_INT(30, d.mtp_chunk);
        /* with the loss, as parallax placed it before */
        ModelSpec with_loss = spec_of("deepseek-v3", 16, 1);
        snprintf(with_loss.layout.pp_layout, sizeof with_loss.layout.pp_layout, "Et*3|(t*4|)*14,t*2mL");
        CHECK_OK(model_spec_check(&with_loss, 16, &d, &err), err);
        CHECK_EQ_INT(0, with_loss.layout.mtp_from_last);
        CHECK_EQ_INT(15, d.mtp_chunk);
    }
    /* where the prediction modules may not go: the 15th stage (index 14), after every layer, is
     * pp rank 14's first virtual stage; a module split over two stages (two m for DeepSeek-V3's
     * one: the count would fail later, the split first); an m before a t */
    const struct {
        const char *text, *needle;
    } bad_m[] = {
        {"Et*3|(tt|)*13,t*32m|(|)*16,L",
         "character 19 ('m'): a prediction module sits on the last virtual stage of its pipeline rank "
         "(Megatron-Core asserts it): stage 14 is virtual stage 0 of pp rank 14"},
        {"Et*3|(tt|)*29,m|mL", "character 17 ('m'): the prediction modules sit together in one stage: "
                               "stage 30 holds some already"},
        {"Et*3|(tt|)*28,tm|t|L", "character 18 ('t'): a layer after a prediction module"},
    };
    for (size_t i = 0; i < sizeof bad_m / sizeof *bad_m; i++) {
        ModelSpec b = spec_of("deepseek-v3", 16, 2);
        snprintf(b.layout.pp_layout, sizeof b.layout.pp_layout, "%s", bad_m[i].text);
        expect_error(b, 16, bad_m[i].needle);
    }
}

/* Each virtual stage costed as what it holds: tiny on pp 2 x vpp 3 with the embedding and the
 * loss counted, chunks 0,1,1,1,1,0: stage 0 the embedding and two layers, stage 1 two layers
 * and the output layer; FLOPs per micro-batch as their layers and the output layer. */
static void test_costs(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    ModelSpec s = spec_of("tiny", 2, 3);
    s.job.precision = PX_FP32;
    s.job.global_batch = 8;
    s.layout.embed_in_split = s.layout.loss_in_split = 1;
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_U64(4ull * (EMBED_PARAMS + 2 * LAYER_PARAMS), r.mem[0].cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64(4ull * (2 * LAYER_PARAMS + FINAL_PARAMS), r.mem[1].cat[MODEL_WEIGHTS]);
    CHECK_REL(8 * 2 * layer_flops, r.rank_flops[0], 1e-12);
    CHECK_REL(8 * (2 * layer_flops + head_flops), r.rank_flops[1], 1e-12);
    /* the output layer makes stage 1's chunk 5 (no layer) heavier than stage 0's chunk 0 */
    CHECK(r.work->pass_fwd[1] > r.work->pass_fwd[0]);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* The first op of a stage's graph on local chunk j in phase ph of communication kind k (NULL:
 * none). */
static const ModelOp *find_comm(const ModelOpGraph *g, int j, ModelPhase ph, ModelComm k)
{
    for (int i = 0; i < g->count; i++)
        if (g->op[i].kind == MODEL_OP_COMM && g->op[i].chunk == j && g->op[i].phase == ph &&
            g->op[i].comm == k)
            return &g->op[i];
    return NULL;
}

/* DeepSeek-V3 as 'Et*3|(tt|)*29,m|L' on pp 16 x vpp 2, tp 2 with SP, bf16, no recompute, 64
 * micro-batches of one 4096-token sequence. Pp rank 13 holds virtual stages 13 and 29, four MoE
 * layers; rank 14 stages 14 (two MoE layers) and 30 (the prediction module: a MoE layer with
 * its enorm, hnorm, final norm and the eh projection, and a copy of the embedding); rank 15
 * stages 15 (two MoE layers) and 31 (the final norm, the untied output layer and two losses:
 * the main model's and the module's). So, from the model's dimensions alone (h 7168, vocab
 * 129280 = 505 x 256: 64640 rows per tp rank, eh 2h in, h / 2 out per rank):
 *   weights(14) - 3/4 weights(13) = 2 B x (3h + h/2 x 2h + 64640 h)
 *   weights(15) - 1/2 weights(13) = 2 B x (h + 64640 h)
 *   FLOPs(14) - 3/4 FLOPs(13) = 64 x 6 x 4096 x (h/2) x 2h       (the eh GEMM, fwd + bwd)
 *   FLOPs(15) - 1/2 FLOPs(13) = 64 x 2 x 6 x 4096 x 64640 x h    (two output layers)
 * and the transfer from stage 30 to 31 holds the main hidden states and the module's, each
 * b x s / tp x h x 2 B = 4096 / 2 x 7168 x 2 B, twice the 29,360,128 B of any other. */
static void test_mtp_stage(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    ModelSpec s = spec_of("deepseek-v3", 16, 1);
    snprintf(s.layout.pp_layout, sizeof s.layout.pp_layout, "Et*3|(tt|)*29,m|L");
    s.layout.tp = 2;
    s.layout.sp = 1;
    s.layout.recompute = MODEL_RECOMPUTE_NONE;
    s.job.precision = PX_BF16;
    s.job.micro_batch = 1;
    const double h = 7168, vloc = 64640, tokens = 4096, mb = 64;
    const uint64_t act = 4096 / 2 * 7168 * 2; /* one transfer: b x s/tp x h, bf16 */
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 32, &r, &err), err);
    CHECK_EQ_INT(30, r.dims.mtp_chunk);
    CHECK_EQ_INT(64, r.dims.m);
    const double w13 = (double)r.mem[13].cat[MODEL_WEIGHTS], w14 = (double)r.mem[14].cat[MODEL_WEIGHTS],
                 w15 = (double)r.mem[15].cat[MODEL_WEIGHTS];
    CHECK_REL(2.0 * (3 * h + h / 2 * 2 * h + vloc * h), w14 - 0.75 * w13, 1e-12);
    CHECK_REL(2.0 * (h + vloc * h), w15 - 0.5 * w13, 1e-12);
    const double f13 = r.rank_flops[13], f14 = r.rank_flops[14], f15 = r.rank_flops[15];
    CHECK_REL(mb * 6 * tokens * (h / 2) * 2 * h, f14 - 0.75 * f13, 1e-9);
    CHECK_REL(mb * 2 * 6 * tokens * vloc * h, f15 - 0.5 * f13, 1e-9);
    /* the transfers: rank 14's from stage 30 (its chunk 1) doubled, from stage 14 not; rank 15
     * receives stage 30's doubled and sends its gradient back doubled */
    const ModelOp *o;
    CHECK((o = find_comm(&r.ops[14], 1, MODEL_FWD, MODEL_PP_SEND)) && o->comm_bytes == 2 * act);
    CHECK((o = find_comm(&r.ops[14], 1, MODEL_BWD, MODEL_PP_RECV)) && o->comm_bytes == 2 * act);
    CHECK((o = find_comm(&r.ops[14], 0, MODEL_FWD, MODEL_PP_SEND)) && o->comm_bytes == act);
    CHECK((o = find_comm(&r.ops[15], 1, MODEL_FWD, MODEL_PP_RECV)) && o->comm_bytes == 2 * act);
    CHECK((o = find_comm(&r.ops[15], 1, MODEL_BWD, MODEL_PP_SEND)) && o->comm_bytes == 2 * act);
    CHECK((o = find_comm(&r.ops[15], 0, MODEL_FWD, MODEL_PP_SEND)) && o->comm_bytes == act);
    /* the MTP stage's copy of the embedding sums its gradient with the first stage's; the loss
     * stage of this untied model holds none */
    CHECK((o = find_comm(&r.ops[14], 1, MODEL_STEP, MODEL_EMBED_ALLREDUCE)) &&
          o->comm_bytes == (uint64_t)(4 * vloc * h)); /* fp32 gradients, Megatron's default */
    CHECK(!find_comm(&r.ops[15], 0, MODEL_STEP, MODEL_EMBED_ALLREDUCE) &&
          !find_comm(&r.ops[15], 1, MODEL_STEP, MODEL_EMBED_ALLREDUCE));
    sim_result_free(&r);
    /* a plan keeps the string alone: read back, it puts the module on stage 30 again */
    ModelPlan plan, back;
    CHECK_OK(sim_plan_for(&s, "dgx-h100", 32, &plan, &err), err);
    cJSON *j = model_plan_to_json(&plan);
    CHECK(j != NULL);
    CHECK_OK(model_plan_from_json(j, "round trip", &back, &err), err);
    cJSON_Delete(j);
    ModelDims d;
    back.spec.layout.mtp_from_last = 0; /* nothing but the string may say it */
    CHECK_OK(model_spec_check(&back.spec, 32, &d, &err), err);
    CHECK_EQ_INT(1, back.spec.layout.mtp_from_last);
    CHECK_EQ_INT(30, d.mtp_chunk);
    model_plan_free(&plan);
    model_plan_free(&back);
    prof_cluster_free(&cl);
}

/* A tied model's standalone MTP stage: tiny with one prediction module as 'Et*2|t*2m|L' on pp
 * 3, fp32. Stage 1 holds two layers, the module (a layer, enorm, hnorm and its final norm of h
 * each, eh of 2h x h) and a copy of the embedding (vocab x h); stage 2 the final block alone,
 * the LayerNorm and the output layer's copy. The three copies each join the embedding's
 * gradient all-reduce, one over the three stages (the executor's embedding group of 3). */
static void test_mtp_stage_tied(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    ModelSpec s = spec_of("tiny", 3, 1);
    s.model.mtp_layers = 1;
    s.job.precision = PX_FP32;
    snprintf(s.layout.pp_layout, sizeof s.layout.pp_layout, "Et*2|t*2m|L");
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 3, &r, &err), err);
    CHECK_EQ_INT(1, r.dims.mtp_chunk);
    const uint64_t h = 64, module = LAYER_PARAMS + 3 * h + 2 * h * h, wte = 256 * h;
    CHECK_EQ_U64(4ull * (EMBED_PARAMS + 2 * LAYER_PARAMS), r.mem[0].cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64(4ull * (2 * LAYER_PARAMS + module + wte), r.mem[1].cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64(4ull * FINAL_PARAMS, r.mem[2].cat[MODEL_WEIGHTS]);
    for (int st = 0; st < 3; st++) {
        const ModelOp *o = find_comm(&r.ops[st], 0, MODEL_STEP, MODEL_EMBED_ALLREDUCE);
        CHECK(o != NULL && o->comm_bytes == 4 * wte);
        CHECK_EQ_INT(3, o->group_size);
    }
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* The modules on the first pipeline rank's later chunk: tiny untied with one module as
 * 'Et|t|t*2m|L' on pp 2 x vpp 2, fp32. Rank 0 holds the embedding, three layers and the module,
 * which reads embed.wte there: no copy of the embedding, and no rank sums one. */
static void test_mtp_rank0_vpp(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    ModelSpec s = spec_of("tiny", 2, 2);
    s.model.mtp_layers = 1;
    s.model.tied_embeddings = 0;
    s.job.precision = PX_FP32;
    snprintf(s.layout.pp_layout, sizeof s.layout.pp_layout, "Et|t|t*2m|L");
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    CHECK_EQ_INT(2, r.dims.mtp_chunk);
    const uint64_t h = 64, module = LAYER_PARAMS + 3 * h + 2 * h * h;
    CHECK_EQ_U64(4ull * (EMBED_PARAMS + 3 * LAYER_PARAMS + module), r.mem[0].cat[MODEL_WEIGHTS]);
    for (int st = 0; st < 2; st++)
        for (int j = 0; j < 2; j++)
            CHECK(find_comm(&r.ops[st], j, MODEL_STEP, MODEL_EMBED_ALLREDUCE) == NULL);
    sim_result_free(&r);
    prof_cluster_free(&cl);
}

/* The planner tries the forms where they divide: tiny on pp 3 counts the embedding and loss
 * with vpp 2 (6 chunks of one layer, the end ones empty), and skips the count that gives the
 * balanced split itself (1,2,1). */
static void test_planner(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    model_spec_defaults(&q.base);
    CHECK_OK(model_config_load("tiny", &q.base.model, &err), err);
    q.base.job.precision = PX_FP32;
    q.base.job.global_batch = 6; /* interleaving needs micro-batches in multiples of pp */
    q.base.layout.pp = 3;
    q.base.job.micro_batch = 1;
    q.base.layout.recompute = MODEL_RECOMPUTE_NONE;
    q.pinned = SIM_PIN_PP | SIM_PIN_MBS | SIM_PIN_RECOMPUTE;
    q.gpus = 3;
    q.top = 50;
    q.headroom = 0.05;
    SimPlanResult res;
    CHECK_OK(sim_plan(&q, &cl, &res, &err), err);
    int counted = 0, balanced = 0;
    for (int i = 0; i < res.n_top; i++) {
        const ModelLayout *l = &res.top[i].spec.layout;
        if (l->embed_in_split && l->loss_in_split) {
            counted++;
            CHECK_EQ_INT(2, l->vpp);
            CHECK_EQ_INT(6, l->n_stage_layers);
            CHECK(l->stage_layers[0] == 0 && l->stage_layers[1] == 1 && l->stage_layers[5] == 0);
        } else if (l->n_stage_layers == 3) {
            balanced++;
            CHECK(l->stage_layers[0] == 1 && l->stage_layers[1] == 2 && l->stage_layers[2] == 1);
        }
    }
    /* vpp 2 interleaved; vpp 1 under 1F1B and GPipe, balanced */
    CHECK_EQ_INT(1, counted);
    CHECK_EQ_INT(2, balanced);
    sim_plan_free(&res);
    prof_cluster_free(&cl);
}

/* The exports say the split the way the plan says it. */
static void test_exports(void)
{
    PxError err = {0};
    ModelPlan p;
    memset(&p, 0, sizeof p);
    p.spec = spec_of("llama3-405b", 8, 8);
    p.spec.layout.tp = 8;
    p.spec.layout.embed_in_split = p.spec.layout.loss_in_split = 1;
    ModelDims d;
    CHECK_OK(model_spec_check(&p.spec, 64, &d, &err), err);
    ExportMegatronSplit ms;
    CHECK_EQ_INT(1, export_megatron_pipeline(&p, &d, &ms));
    CHECK(ms.embed == 1 && ms.loss == 1 && ms.first == -1 && ms.last == -1 && !ms.layout[0]);
    /* a split given per virtual stage goes as a layout string */
    ModelPlan q;
    memset(&q, 0, sizeof q);
    q.spec = spec_of("tiny", 2, 2);
    q.spec.layout.n_stage_layers = 4;
    memcpy(q.spec.layout.stage_layers, (const int[]){0, 2, 1, 1}, sizeof(int) * 4);
    CHECK_OK(model_spec_check(&q.spec, 2, &d, &err), err);
    CHECK_EQ_INT(1, export_megatron_pipeline(&q, &d, &ms));
    CHECK_STR("E|t*2|t|tL", ms.layout);
    char text[160];
    model_split_describe(&p.spec.layout, text, sizeof text);
    CHECK_STR("embedding and loss each counted as a layer: 1,2*62,1", text);
}

int main(void)
{
    test_accounting();
    test_first_last();
    test_layout_string();
    test_costs();
    test_mtp_stage();
    test_mtp_stage_tied();
    test_mtp_rank0_vpp();
    test_planner();
    test_exports();
    TEST_DONE("pp_layout");
}
