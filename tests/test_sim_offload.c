/* Optimizer and activation offload (docs/memory.md and docs/time.md, "Offload"): the device
 * categories and the host column of a small model with offload on and off, worked by hand; the
 * host optimizer's time from the same bytes; the planner offloading only what does not fit
 * otherwise, and refusing what the host cannot hold; the profile and ZeRO rules. */
#include "fixtures.h"
#include "test.h"

/* 4 layers, h 64, 4 heads, vocabulary 128, sequence 32 (GPT: learned positions, biases, tied
 * embeddings), bf16 with fp32 gradients and AdamW, dp 4 with ZeRO-1, mbs 1, no recompute.
 * Blocks: embed 128 x 64 + 32 x 64 = 10240; a layer 2 x 64 (ln1) + 3 x 64 x 64 + 192 (qkv)
 * + 64 x 64 + 64 (proj) + 128 (ln2) + 4 x 64 x 64 + 256 (fc1) + 4 x 64 x 64 + 64 (fc2) = 49984;
 * final norm 128. Parameters 10240 + 4 x 49984 + 128 = 210304; shards over 4 ranks
 * 2560 + 4 x 12496 + 32 = 52576. */
static ModelSpec small(int offload_opt, int offload_act)
{
    ModelSpec s = fx_spec(fx_gpt(4, 64, 4, 128, 32));
    s.layout.dp = 4;
    s.layout.zero = 1;
    s.layout.recompute = MODEL_RECOMPUTE_NONE;
    s.layout.offload_optimizer = offload_opt;
    s.layout.offload_activations = offload_act;
    s.job.micro_batch = 1;
    s.job.global_batch = 4;
    return s;
}

static void load(ProfCluster *cl)
{
    PxError err = {0};
    CHECK_OK(prof_cluster_load("dgx-a100", NULL, 0, cl, &err), err);
}

static void test_memory(void)
{
    PxError err = {0};
    ProfCluster cl;
    load(&cl);
    SimResult off, opt, act;
    ModelSpec s0 = small(0, 0), s1 = small(1, 0), s2 = small(0, 1);
    CHECK_OK(sim_run(&s0, &cl, 4, &off, &err), err);
    CHECK_OK(sim_run(&s1, &cl, 4, &opt, &err), err);
    CHECK_OK(sim_run(&s2, &cl, 4, &act, &err), err);
    const SimStageMemory *m0 = &off.mem[0], *m1 = &opt.mem[0], *m2 = &act.mem[0];
    /* without offload: bf16 weights, fp32 gradients of every parameter, fp32 master and
     * AdamW's m and v of the shard, nothing on the host */
    CHECK_EQ_U64(2 * 210304, m0->cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64(4 * 210304, m0->cat[MODEL_GRADS]);
    CHECK_EQ_U64(4 * 52576, m0->cat[MODEL_MASTER]);
    CHECK_EQ_U64(8 * 52576, m0->cat[MODEL_OPTIMIZER]);
    CHECK_EQ_U64(0, m0->host_total);
    CHECK_EQ_U64(0, off.host_peak_bytes);
    /* optimizer offload: master and optimizer leave the device; the host holds them and a
     * gradient shard in fp32: 4 + 4 + 8 bytes of each of the 52576 shard elements */
    CHECK_EQ_U64(2 * 210304, m1->cat[MODEL_WEIGHTS]);
    CHECK_EQ_U64(4 * 210304, m1->cat[MODEL_GRADS]);
    CHECK_EQ_U64(0, m1->cat[MODEL_MASTER]);
    CHECK_EQ_U64(0, m1->cat[MODEL_OPTIMIZER]);
    CHECK_EQ_U64(210304, m1->host[MODEL_GRADS]);
    CHECK_EQ_U64(210304, m1->host[MODEL_MASTER]);
    CHECK_EQ_U64(420608, m1->host[MODEL_OPTIMIZER]);
    CHECK_EQ_U64(0, m1->host[MODEL_ACTIVATIONS]);
    CHECK_EQ_U64(841216, m1->host_total);
    CHECK_EQ_U64(841216, opt.host_peak_bytes);
    CHECK_EQ_U64(m0->total - 630912, m1->total);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        if (c != MODEL_MASTER && c != MODEL_OPTIMIZER)
            CHECK_EQ_U64(m0->cat[c], m1->cat[c]);
    /* 2 TB over the 4 ranks of the node this job uses */
    CHECK_EQ_U64(549755813888ull, opt.host_rank_memory_bytes);
    /* activation offload: a layer saves 32sbh + 4asb with flash attention and no dropout,
     * s 32, b 1, h 64, a 4: 65536 + 512 = 66048; one set of 4 layers (pp 1) goes to the host,
     * two layers stay on the device */
    CHECK_EQ_U64(66048, model_layer_activation_bytes(&off.spec, &off.dims));
    CHECK_EQ_U64(4 * 66048, m2->host[MODEL_ACTIVATIONS]);
    CHECK_EQ_U64(4 * 66048, m2->host_total);
    CHECK_EQ_U64(m0->cat[MODEL_ACTIVATIONS] - 2 * 66048, m2->cat[MODEL_ACTIVATIONS]);
    CHECK_EQ_U64(m0->cat[MODEL_MASTER], m2->cat[MODEL_MASTER]);
    /* the JSON carries the host column only where something is offloaded */
    cJSON *j0 = sim_result_to_json(&off), *j1 = sim_result_to_json(&opt);
    const cJSON *st0 = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(j0, "memory"), "per_stage"), 0);
    const cJSON *mem1 = cJSON_GetObjectItem(j1, "memory");
    const cJSON *st1 = cJSON_GetArrayItem(cJSON_GetObjectItem(mem1, "per_stage"), 0);
    CHECK(cJSON_GetObjectItem(st0, "host") == NULL);
    CHECK(cJSON_GetObjectItem(j0, "host_peak_bytes") == NULL);
    const cJSON *h = cJSON_GetObjectItem(st1, "host");
    CHECK_EQ_U64(420608, (uint64_t)cJSON_GetObjectItem(h, "optimizer")->valuedouble);
    CHECK_EQ_U64(841216, (uint64_t)cJSON_GetObjectItem(h, "total")->valuedouble);
    CHECK_EQ_U64(0, (uint64_t)cJSON_GetObjectItem(st1, "master")->valuedouble);
    CHECK_EQ_U64(841216, (uint64_t)cJSON_GetObjectItem(mem1, "host_peak_bytes")->valuedouble);
    cJSON_Delete(j0);
    cJSON_Delete(j1);
    sim_result_free(&off);
    sim_result_free(&opt);
    sim_result_free(&act);
    prof_cluster_free(&cl);
}

/* The host optimizer (no overlap of the DP communication, the default): gradients down 4 x
 * 52576 = 210304 B and bf16 parameters up 2 x 52576 = 105152 B at 25 GB/s, 8.41216 us and
 * 4.20608 us; the step reads the gradients, reads and writes master and state (2 x 630912)
 * and writes the parameters: 1577280 B at 409.6 GB/s over 4 ranks, 15.403125 us. Total
 * 28.021365 us, in place of the device optimizer; the rest of the step is unchanged. */
static void test_time(void)
{
    PxError err = {0};
    ProfCluster cl;
    load(&cl);
    SimResult off, opt;
    ModelSpec s0 = small(0, 0), s1 = small(1, 0);
    CHECK(!s0.layout.overlap_dp);
    CHECK_OK(sim_run(&s0, &cl, 4, &off, &err), err);
    CHECK_OK(sim_run(&s1, &cl, 4, &opt, &err), err);
    const SimStageTime *t = &opt.stage_time[0];
    CHECK_REL(15.403125e-6, t->offload_host_s, 1e-12);
    CHECK_REL(8.41216e-6, t->offload_down_s, 1e-12);
    CHECK_REL(4.20608e-6, t->offload_up_s, 1e-12);
    CHECK_REL(28.021365e-6, t->optimizer_s, 1e-12);
    CHECK_REL(28.021365e-6, opt.optimizer_s, 1e-12);
    CHECK(off.optimizer_s > 0);
    CHECK_REL(off.step_s - off.optimizer_s, opt.step_s - opt.optimizer_s, 1e-12);
    /* with the DP overlap, the copies hide under the last backward and the first forward,
     * costing only the compute slowdown (0.1) of what they hide under */
    ModelSpec s2 = small(1, 0);
    s2.layout.overlap_dp = 1;
    SimResult ov;
    CHECK_OK(sim_run(&s2, &cl, 4, &ov, &err), err);
    CHECK_REL(15.403125e-6, ov.stage_time[0].offload_host_s, 1e-12);
    CHECK(ov.stage_time[0].offload_down_s < t->offload_down_s);
    sim_result_free(&ov);
    sim_result_free(&off);
    sim_result_free(&opt);
    prof_cluster_free(&cl);
}

static SimPlanRequest pinned(void)
{
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    q.base = small(0, 0);
    q.pinned = SIM_PIN_TP | SIM_PIN_PP | SIM_PIN_DP | SIM_PIN_CP | SIM_PIN_VPP | SIM_PIN_ZERO |
               SIM_PIN_SP | SIM_PIN_MBS | SIM_PIN_RECOMPUTE | SIM_PIN_SCHEDULE;
    q.base.layout.tp = q.base.layout.pp = q.base.layout.cp = q.base.layout.vpp = 1;
    q.gpus = 4;
    q.top = 3;
    q.headroom = 0.05;
    return q;
}

/* The planner offloads only when nothing fits: a device between the layout's peak with and
 * without optimizer offload gets the offloaded layout; a larger one the plain layout; a host
 * too small for the offloaded bytes a refusal naming it. */
static void test_plan(void)
{
    PxError err = {0};
    ProfCluster cl;
    load(&cl);
    cl.device.runtime_bytes = 0;
    SimResult off, opt;
    ModelSpec s0 = small(0, 0), s1 = small(1, 0);
    CHECK_OK(sim_run(&s0, &cl, 4, &off, &err), err);
    CHECK_OK(sim_run(&s1, &cl, 4, &opt, &err), err);
    CHECK_EQ_U64(off.peak_bytes - 630912, opt.peak_bytes);
    SimPlanRequest q = pinned();
    SimPlanResult r;
    /* fits without offload: the plan is the plain layout */
    cl.device.memory_bytes = (uint64_t)((double)off.peak_bytes / 0.95) + 1024;
    CHECK_OK(sim_plan(&q, &cl, &r, &err), err);
    CHECK_EQ_INT(1, r.n_top);
    CHECK_EQ_INT(0, r.top[0].spec.layout.offload_optimizer);
    CHECK_EQ_INT(0, r.top[0].spec.layout.offload_activations);
    CHECK_EQ_U64(off.peak_bytes, r.top[0].peak_bytes);
    CHECK_EQ_U64(0, r.top[0].host_peak_bytes);
    sim_plan_free(&r);
    /* fits only with the optimizer offloaded */
    cl.device.memory_bytes = (uint64_t)((double)(off.peak_bytes + opt.peak_bytes) / 2 / 0.95);
    CHECK_OK(sim_plan(&q, &cl, &r, &err), err);
    CHECK_EQ_INT(1, r.n_top);
    CHECK_EQ_INT(1, r.top[0].spec.layout.offload_optimizer);
    CHECK_EQ_INT(0, r.top[0].spec.layout.offload_activations);
    CHECK_EQ_U64(opt.peak_bytes, r.top[0].peak_bytes);
    CHECK_EQ_U64(841216, r.top[0].host_peak_bytes);
    CHECK_REL(opt.step_s, r.top[0].step_s, 1e-12);
    sim_plan_free(&r);
    /* the host cannot hold the 841216 bytes (nor activation offload's): nothing works */
    cl.host_memory_bytes = 4.0 * 500000;
    CHECK_INPUT_ERROR(sim_plan(&q, &cl, &r, &err), err, "host memory");
    prof_cluster_free(&cl);
    sim_result_free(&off);
    sim_result_free(&opt);
}

/* The offload search prunes as the plain one does: the brute force that times every layout
 * agrees with it, where only offloaded layouts fit (micro-batch and recompute searched). */
static void test_plan_pruning(void)
{
    PxError err = {0};
    ProfCluster cl;
    load(&cl);
    cl.device.runtime_bytes = 0;
    ModelSpec s0 = small(0, 0), s1 = small(1, 0);
    s0.layout.recompute = s1.layout.recompute = MODEL_RECOMPUTE_FULL;
    s0.job.global_batch = s1.job.global_batch = 16;
    SimResult off, opt;
    CHECK_OK(sim_run(&s0, &cl, 4, &off, &err), err);
    CHECK_OK(sim_run(&s1, &cl, 4, &opt, &err), err);
    cl.device.memory_bytes = (uint64_t)((double)(off.peak_bytes + opt.peak_bytes) / 2 / 0.95);
    SimPlanRequest q = pinned();
    q.base.job.global_batch = 16;
    q.pinned &= ~(unsigned)(SIM_PIN_MBS | SIM_PIN_RECOMPUTE);
    SimPlanResult pruned, brute;
    CHECK_OK(sim_plan(&q, &cl, &pruned, &err), err);
    q.brute_force = 1;
    CHECK_OK(sim_plan(&q, &cl, &brute, &err), err);
    CHECK(pruned.n_top >= 1);
    CHECK_EQ_INT(brute.n_top, pruned.n_top);
    for (int i = 0; i < pruned.n_top; i++) {
        const ModelLayout *a = &pruned.top[i].spec.layout, *b = &brute.top[i].spec.layout;
        CHECK(a->offload_optimizer || a->offload_activations);
        CHECK_EQ_INT(b->offload_optimizer, a->offload_optimizer);
        CHECK_EQ_INT(b->offload_activations, a->offload_activations);
        CHECK_EQ_INT(b->recompute, a->recompute);
        CHECK_EQ_INT(brute.top[i].spec.job.micro_batch, pruned.top[i].spec.job.micro_batch);
        CHECK(brute.top[i].score == pruned.top[i].score);
    }
    sim_plan_free(&pruned);
    sim_plan_free(&brute);
    sim_result_free(&off);
    sim_result_free(&opt);
    prof_cluster_free(&cl);
}

/* The planner's compact tables give the full tables' device and host bytes (pp 2, both kinds
 * of offload, interleaved stages with uneven activation sets). */
static void test_compact(void)
{
    PxError err = {0};
    ProfCluster cl;
    load(&cl);
    ModelSpec s = small(1, 1);
    s.layout.pp = 2;
    s.layout.dp = 2;
    s.job.global_batch = 8;
    SimResult full, compact;
    CHECK_OK(sim_run(&s, &cl, 4, &full, &err), err);
    CHECK_OK(sim_run_ex(&s, &cl, 4, 1, SIM_FULL, &compact, &err), err);
    for (int st = 0; st < 2; st++) {
        CHECK(full.mem[st].host_total > 0);
        CHECK_EQ_U64(full.mem[st].host_total, compact.mem[st].host_total);
        CHECK_EQ_U64(full.mem[st].total, compact.mem[st].total);
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            CHECK_EQ_U64(full.mem[st].host[c], compact.mem[st].host[c]);
    }
    CHECK_REL(full.step_s, compact.step_s, 1e-12);
    sim_result_free(&full);
    sim_result_free(&compact);
    prof_cluster_free(&cl);
}

/* Offload needs ZeRO for the optimizer, and a profile that describes the host. */
static void test_rules(void)
{
    PxError err = {0};
    ProfCluster cl;
    load(&cl);
    SimResult r;
    ModelSpec s = small(1, 0);
    s.layout.zero = 0;
    CHECK_INPUT_ERROR(sim_run(&s, &cl, 4, &r, &err), err, "it needs zero 1-3");
    prof_cluster_free(&cl);
    CHECK_OK(prof_cluster_load("local", NULL, 0, &cl, &err), err);
    s = small(0, 1);
    CHECK_INPUT_ERROR(sim_run(&s, &cl, 4, &r, &err), err, "cluster local describes no host");
    prof_cluster_free(&cl);
    /* the host figures read back from a plan's inline profile */
    load(&cl);
    cJSON *j = prof_cluster_to_json(&cl);
    ProfCluster back;
    CHECK_OK(prof_cluster_from_json(j, "inline", &back, &err), err);
    CHECK(back.host_memory_bytes == cl.host_memory_bytes);
    CHECK(back.host_pcie_bandwidth == 25e9);
    CHECK(back.host_memory_bandwidth == 409.6e9);
    CHECK_EQ_INT(128, back.host_cores);
    cJSON_Delete(j);
    prof_cluster_free(&back);
    prof_cluster_free(&cl);
}

int main(void)
{
    px_log_set_quiet(1);
    test_memory();
    test_time();
    test_plan();
    test_plan_pruning();
    test_compact();
    test_rules();
    TEST_DONE("sim_offload");
}
