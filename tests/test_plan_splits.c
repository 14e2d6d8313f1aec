/* The planner's pipeline splits: on DeepSeek-V3 under the layout of docs/pipeline.md's table
 * (dgx-h100, 1024 GPUs, tp 2 SP etp 1 pp 16 ep 64, ZeRO-1, full recompute) its choice is at
 * least as fast as the hand split 4*15,1 that beats the balanced 3,3,4*13,3 by an eighth; no
 * layout is listed twice where two kinds of split come to the same layers per stage; a pinned
 * pp x vpp that cannot split the layers says so, with a layout string that can. */
#include "sim/sim.h"
#include "test.h"

static SimPlanRequest deepseek_request(void)
{
    PxError err = {0};
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    model_spec_defaults(&q.base);
    CHECK_OK(model_config_load("deepseek-v3", &q.base.model, &err), err);
    ModelLayout *l = &q.base.layout;
    ModelJob *j = &q.base.job;
    j->global_batch = 4096;
    j->seq_len = 4096;
    j->micro_batch = 1;
    l->tp = 2;
    l->sp = 1;
    l->etp = 1;
    l->pp = 16;
    l->ep = 64;
    l->cp = 1;
    l->zero = 1;
    l->recompute = MODEL_RECOMPUTE_FULL;
    q.pinned = SIM_PIN_TP | SIM_PIN_SP | SIM_PIN_ETP | SIM_PIN_PP | SIM_PIN_EP | SIM_PIN_CP |
               SIM_PIN_ZERO | SIM_PIN_RECOMPUTE | SIM_PIN_MBS;
    q.gpus = 1024;
    q.top = 5;
    q.headroom = 0.05;
    return q;
}

/* The planner's best against the hand splits, simulated as `parallax simulate --pp-layers`. */
static void test_deepseek_split(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    SimPlanRequest q = deepseek_request();
    SimPlanResult r;
    CHECK_OK(sim_plan(&q, &cl, &r, &err), err);
    const SimCandidate *best = &r.top[0];
    char split[160];
    model_split_describe(&best->spec.layout, split, sizeof split);
    printf("planner: %s, step %.9f s\n", split, best->step_s);
    CHECK_STR("4*15,1", split);
    CHECK_REL(41.659810941, best->step_s, 1e-9);
    /* the hand splits, timed by the simulation alone */
    static const struct {
        const char *name;
        int first, mid, last; /* stage 0, stages 1..14, stage 15 */
        double step_s;
    } hand[] = {{"4*15,1", 4, 4, 1, 41.659810941}, {"3,4*14,2", 3, 4, 2, 41.715014524},
                {"3,3,4*13,3 (the balanced split the planner picked before)", 3, 0, 3, 47.540318285}};
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        ModelSpec s = q.base;
        s.layout.dp = 32;
        s.layout.n_stage_layers = 16;
        for (int k = 0; k < 16; k++)
            s.layout.stage_layers[k] = k == 0 ? hand[i].first : k == 15 ? hand[i].last : hand[i].mid;
        if (hand[i].mid == 0) { /* 3,3,4*13,3 */
            s.layout.stage_layers[1] = 3;
            for (int k = 2; k < 15; k++)
                s.layout.stage_layers[k] = 4;
        }
        SimResult full;
        CHECK_OK(sim_run(&s, &cl, q.gpus, &full, &err), err);
        printf("hand split %s: step %.9f s\n", hand[i].name, full.step_s);
        CHECK_REL(hand[i].step_s, full.step_s, 1e-9);
        CHECK(best->step_s <= full.step_s * (1 + 1e-12));
        sim_result_free(&full);
    }
    sim_plan_free(&r);
    prof_cluster_free(&cl);
}

/* Two entries of the top list are the same layout: every knob and the resolved layers per
 * stage equal (the form that said them aside). */
static int same_layout(const SimCandidate *a, const SimCandidate *b)
{
    ModelLayout la = a->spec.layout, lb = b->spec.layout;
    PxError err = {0};
    CHECK_OK(model_split_resolve(&a->spec.model, &la, &err), err);
    CHECK_OK(model_split_resolve(&b->spec.model, &lb, &err), err);
    if (la.n_stage_layers != lb.n_stage_layers ||
        memcmp(la.stage_layers, lb.stage_layers, sizeof(int) * (size_t)la.n_stage_layers))
        return 0;
    return la.tp == lb.tp && la.pp == lb.pp && la.dp == lb.dp && la.cp == lb.cp && la.vpp == lb.vpp &&
           la.zero == lb.zero && la.sp == lb.sp && la.recompute == lb.recompute &&
           la.schedule == lb.schedule && la.ep == lb.ep && la.etp == lb.etp && la.cp_comm == lb.cp_comm &&
           la.offload_optimizer == lb.offload_optimizer &&
           la.offload_activations == lb.offload_activations &&
           a->spec.job.micro_batch == b->spec.job.micro_batch;
}

/* DeepSeek-V3 on pp 2 (61 layers: balanced 31,30 is also the loss counted as a layer) and
 * Llama 2 on pp 2 (32 layers: even 16,16 is also the embedding and loss counted) listed each
 * layout twice. */
static void test_no_twice(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    static const struct {
        const char *model;
        int gpus, gbs;
    } cases[] = {{"deepseek-v3", 2048, 4096}, {"llama2-7b", 64, 256}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        SimPlanRequest q = deepseek_request();
        CHECK_OK(model_config_load(cases[c].model, &q.base.model, &err), err);
        q.base.layout.pp = 2;
        q.base.layout.vpp = 1;
        q.base.job.global_batch = cases[c].gbs;
        q.gpus = cases[c].gpus;
        q.pinned = SIM_PIN_PP | SIM_PIN_VPP | SIM_PIN_ZERO | SIM_PIN_RECOMPUTE;
        if (q.base.model.moe.experts > 0)
            q.pinned |= SIM_PIN_EP;
        q.top = 12;
        SimPlanResult r;
        CHECK_OK(sim_plan(&q, &cl, &r, &err), err);
        CHECK_EQ_INT(12, r.n_top);
        int twice = 0;
        for (int i = 0; i < r.n_top; i++)
            for (int k = i + 1; k < r.n_top; k++)
                twice += same_layout(&r.top[i], &r.top[k]);
        printf("%s pp 2: %d of the top %d listed twice\n", cases[c].model, twice, r.n_top);
        CHECK_EQ_INT(0, twice);
        sim_plan_free(&r);
    }
    prof_cluster_free(&cl);
}

/* pp 8 x vpp 4 = 32 virtual stages for 61 layers: the split is at fault, not the GPUs. */
static void test_no_split_message(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &cl, &err), err);
    SimPlanRequest q = deepseek_request();
    q.gpus = 2048;
    q.base.layout.pp = 8;
    q.base.layout.vpp = 4;
    q.pinned = SIM_PIN_PP | SIM_PIN_VPP;
    SimPlanResult r;
    CHECK_INPUT_ERROR(sim_plan(&q, &cl, &r, &err), err,
                      "no layout of deepseek-v3 on 2048 GPUs: pp 8 x vpp 4 = 32 virtual stages cannot "
                      "split its 61 layers evenly (nor 62 or 63 with the embedding and/or the loss counted "
                      "as layers); a vpp that can with pp 8: 1 (an uneven split, balanced); or give each "
                      "virtual stage its layers, e.g. --pipeline-model-parallel-layout 'Et|(tt|)*30,mL'");
    /* the example string is one the pipeline takes: planned with it, a layout ranks */
    px_strlcpy(q.base.layout.pp_layout, "Et|(tt|)*30,mL", sizeof q.base.layout.pp_layout);
    q.pinned |= SIM_PIN_PP_LAYERS;
    q.top = 1;
    CHECK_OK(sim_plan(&q, &cl, &r, &err), err);
    CHECK_EQ_INT(1, r.n_top);
    sim_plan_free(&r);
    prof_cluster_free(&cl);
}

int main(void)
{
    px_log_set_quiet(1);
    test_deepseek_split();
    test_no_twice();
    test_no_split_message();
    TEST_DONE("plan_splits");
}
