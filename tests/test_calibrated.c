/* Calibrated profiles: the `measured` section parses and round-trips, bad measurements are
 * refused with the key named, and the simulator uses what was measured: GEMM times by shape,
 * per-kind op rates, collectives interpolated log-log. */
#include <stdlib.h>

#include "fixtures.h"
#include "sim/internal.h"
#include "test.h"

static const char *profile_text =
    "{\"schema_version\": 1, \"name\": \"local-test\", \"device\": \"cpu\","
    " \"node\": {\"devices\": 0, \"link\": {\"bandwidth\": 5e9, \"latency\": 1e-6}},"
    " \"network\": {\"bandwidth_per_device\": 5e9, \"latency\": 1e-6}, \"shared_memory\": true,"
    " \"measured\": {\"host\": \"testhost\", \"date\": \"2026-11-21\", \"ranks\": 2,"
    "   \"gemm\": [[256, 192, 64, 1, 0.001]],"
    "   \"ops\": [{\"kind\": \"norm\", \"phase\": \"fwd\", \"rate\": 1e9, \"overhead_s\": 2e-5},"
    "             {\"kind\": \"attention\", \"phase\": \"fwd\", \"flash\": true, \"rate\": 1e10, \"overhead_s\": 0}],"
    "   \"collectives\": [{\"op\": \"allreduce\", \"ranks\": 2, \"nodes\": 1,"
    "                      \"points\": [[1024, 1e-5], [1048576, 1e-4]]}]}}";

/* Two concurrency levels and several variants: the lookups pick the variant first, then the
 * concurrency nearest to the job's ranks per node. */
static const char *levels_text =
    "{\"schema_version\": 1, \"name\": \"local-levels\", \"device\": \"cpu\","
    " \"node\": {\"devices\": 0, \"link\": {\"bandwidth\": 5e9, \"latency\": 1e-6}},"
    " \"network\": {\"bandwidth_per_device\": 5e9, \"latency\": 1e-6}, \"shared_memory\": true,"
    " \"measured\": {\"host\": \"testhost\", \"date\": \"2026-11-21\", \"ranks\": 2,"
    "   \"gemm\": [[256, 192, 64, 1, 0.001, 1], [256, 192, 64, 1, 0.0015, 2]],"
    "   \"ops\": [{\"kind\": \"norm\", \"phase\": \"fwd\", \"variant\": \"layernorm\", \"rate\": 1e9, \"overhead_s\": 0, \"concurrency\": 1},"
    "             {\"kind\": \"norm\", \"phase\": \"fwd\", \"variant\": \"layernorm\", \"rate\": 5e8, \"overhead_s\": 0, \"concurrency\": 2},"
    "             {\"kind\": \"norm\", \"phase\": \"fwd\", \"variant\": \"rmsnorm\", \"rate\": 2e9, \"overhead_s\": 0, \"concurrency\": 1},"
    "             {\"kind\": \"attention\", \"phase\": \"fwd\", \"flash\": true, \"variant\": \"hd16\", \"rate\": 1e10, \"overhead_s\": 0},"
    "             {\"kind\": \"attention\", \"phase\": \"fwd\", \"flash\": true, \"variant\": \"hd8\", \"rate\": 5e9, \"overhead_s\": 0},"
    "             {\"kind\": \"matmul\", \"phase\": \"fwd\", \"variant\": \"attn.qkv/learned\", \"rate\": 1e9, \"overhead_s\": 1e-6}]}}";

/* tiny with micro-batches of 4 and a global batch of 8: the layout every check costs */
static ModelSpec tiny_mbs4(void)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load("tiny", &s.model, &err), err);
    s.job.micro_batch = 4;
    s.job.global_batch = 8;
    return s;
}

static void check_levels(void)
{
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_parse(levels_text, "levels", &cl, &err), err);
    const ProfMeasured *m = cl.measured;
    /* GEMMs: the level nearest in ratio, the higher on a tie */
    CHECK_REL(0.001, prof_measured_gemm(m, 256, 192, 64, 1, 1), 1e-12);
    CHECK_REL(0.0015, prof_measured_gemm(m, 256, 192, 64, 1, 2), 1e-12);
    CHECK_REL(0.0015, prof_measured_gemm(m, 256, 192, 64, 1, 16), 1e-12);
    /* ops: the variant first, then the level */
    CHECK_REL(1e9, prof_measured_op(m, "norm", "fwd", 0, "layernorm", 1)->rate, 1e-12);
    CHECK_REL(5e8, prof_measured_op(m, "norm", "fwd", 0, "layernorm", 2)->rate, 1e-12);
    CHECK_REL(5e8, prof_measured_op(m, "norm", "fwd", 0, "layernorm", 3)->rate, 1e-12);
    CHECK_REL(2e9, prof_measured_op(m, "norm", "fwd", 0, "rmsnorm", 2)->rate, 1e-12);
    CHECK_REL(5e9, prof_measured_op(m, "attention", "fwd", 1, "hd8", 1)->rate, 1e-12);
    CHECK_REL(1e10, prof_measured_op(m, "attention", "fwd", 1, "hd128", 1)->rate, 1e-12); /* "hd1" */
    CHECK(prof_measured_op(m, "attention", "fwd", 0, "hd16", 1) == NULL); /* no plain kernel */
    CHECK(prof_measured_op(m, "activation", "fwd", 0, "gelu", 1) == NULL);

    /* the simulator: tiny, mbs 4, the same layer on 1 rank and on 2 (both on this machine) */
    ModelSpec s = tiny_mbs4();
    for (int ranks = 1; ranks <= 2; ranks++) {
        SimResult r;
        CHECK_OK(sim_run(&s, &cl, ranks, &r, &err), err);
        int found = 0;
        for (int i = 0; i < r.ops[0].count; i++) {
            const ModelOp *op = &r.ops[0].op[i];
            char name[96];
            model_op_fullname(op, name, sizeof name);
            double t = r.op_seconds[0][i];
            if (strcmp(name, "layer.0.ln1.fwd") == 0) {
                CHECK_REL(op->bytes / (ranks == 1 ? 1e9 : 5e8), t, 1e-12);
                found++;
            } else if (strcmp(name, "layer.0.attn.qkv.fwd") == 0) {
                /* its GEMM as measured at the level, plus the fitted epilogue over the GEMM's
                 * output (256 x 192 fp32) and what the epilogue adds */
                ModelOpKey key;
                model_op_key(&r.spec, &r.dims, op, &key);
                CHECK_REL(256.0 * 192 * 4 + op->epilogue_bytes, key.x, 1e-12);
                CHECK(strcmp(key.variant, "attn.qkv/learned") == 0);
                CHECK_REL((ranks == 1 ? 0.001 : 0.0015) + 1e-6 + key.x / 1e9, t, 1e-12);
                found++;
            } else if (strcmp(name, "layer.0.attn.core.fwd") == 0) {
                CHECK_REL(op->flops / 1e10, t, 1e-12); /* hd16 */
                found++;
            }
        }
        CHECK_EQ_INT(3, found);
        sim_result_free(&r);
    }
    prof_cluster_free(&cl);
}

/* Context parallelism's ring: its attention core has a rate of its own ("hd16/ring", which
 * calibrate measures on a cp 2 ring), never standing for the whole core's nor it for the ring's;
 * on a profile without one the ring is priced at the whole core's rate. */
static const char *ring_text =
    "{\"schema_version\": 1, \"name\": \"local-ring\", \"device\": \"cpu\","
    " \"node\": {\"devices\": 0, \"link\": {\"bandwidth\": 5e9, \"latency\": 1e-6}},"
    " \"network\": {\"bandwidth_per_device\": 5e9, \"latency\": 1e-6}, \"shared_memory\": true,"
    " \"measured\": {\"host\": \"testhost\", \"date\": \"2026-11-29\", \"ranks\": 2,"
    "   \"gemm\": [[256, 192, 64, 1, 0.001, 2]],"
    "   \"ops\": [{\"kind\": \"attention\", \"phase\": \"fwd\", \"flash\": true, \"variant\": \"hd16/ring\", \"rate\": 4e9, \"overhead_s\": 1e-5, \"concurrency\": 2},"
    "             {\"kind\": \"attention\", \"phase\": \"fwd\", \"flash\": true, \"variant\": \"hd16\", \"rate\": 1e10, \"overhead_s\": 0, \"concurrency\": 2}]}}";

static void check_ring(void)
{
    PxError err = {0};
    ProfCluster ring, plain;
    CHECK_OK(prof_cluster_parse(ring_text, "ring", &ring, &err), err);
    CHECK_OK(prof_cluster_parse(levels_text, "levels", &plain, &err), err);
    CHECK_REL(1e10, prof_measured_op(ring.measured, "attention", "fwd", 1, "hd16", 2)->rate, 1e-12);
    CHECK_REL(4e9, prof_measured_op(ring.measured, "attention", "fwd", 1, "hd16/ring", 2)->rate, 1e-12);
    CHECK_REL(1e10, prof_measured_op(ring.measured, "attention", "fwd", 1, "hd128", 2)->rate, 1e-12);
    CHECK(prof_measured_op(plain.measured, "attention", "fwd", 1, "hd16/ring", 2) == NULL);
    /* tiny, mbs 4, cp 2 over a ring on 2 ranks: the core at the ring's rate, else the whole's */
    ModelSpec s = tiny_mbs4();
    s.layout.cp = 2;
    s.layout.cp_comm = MODEL_CP_COMM_P2P;
    s.job.flash_attn = 1;
    const ProfCluster *profiles[2] = {&ring, &plain};
    for (int k = 0; k < 2; k++) {
        SimResult r;
        CHECK_OK(sim_run(&s, profiles[k], 2, &r, &err), err);
        int found = 0;
        for (int i = 0; i < r.ops[0].count; i++) {
            const ModelOp *op = &r.ops[0].op[i];
            char name[96];
            model_op_fullname(op, name, sizeof name);
            if (strcmp(name, "layer.0.attn.core.fwd") != 0)
                continue;
            ModelOpKey key;
            model_op_key(&r.spec, &r.dims, op, &key);
            CHECK(strcmp(key.variant, "hd16/ring") == 0);
            CHECK_REL(k == 0 ? 1e-5 + op->flops / 4e9 : op->flops / 1e10, r.op_seconds[0][i],
                      1e-12);
            found++;
        }
        CHECK_EQ_INT(1, found);
        sim_result_free(&r);
    }
    /* without context parallelism the core is the whole one's */
    ModelSpec whole = tiny_mbs4();
    SimResult r;
    CHECK_OK(sim_run(&whole, &ring, 2, &r, &err), err);
    for (int i = 0; i < r.ops[0].count; i++) {
        char name[96];
        model_op_fullname(&r.ops[0].op[i], name, sizeof name);
        if (strcmp(name, "layer.0.attn.core.fwd") == 0)
            CHECK_REL(r.ops[0].op[i].flops / 1e10, r.op_seconds[0][i], 1e-12);
    }
    sim_result_free(&r);
    prof_cluster_free(&ring);
    prof_cluster_free(&plain);
}

/* The measured section on its own: a compute part's rows read with its concurrency as their
 * default, the fits' point counts kept, and two parts appended into one section. */
static void check_section(void)
{
    PxError err = {0};
    cJSON *part = cJSON_Parse(
        "{\"ranks\": 4, \"gemm\": [[256, 192, 64, 1, 0.002]],"
        " \"ops\": [{\"kind\": \"norm\", \"phase\": \"fwd\", \"rate\": 1e9, \"points\": 36}]}");
    CHECK(part != NULL);
    ProfMeasured *m = NULL, *all = NULL;
    CHECK_OK(prof_measured_from_json(part, "part.json:", &m, &err), err);
    CHECK_EQ_INT(4, m->gemm[0].concurrency);
    CHECK_EQ_INT(4, m->ops[0].concurrency);
    CHECK_EQ_INT(36, m->ops[0].points);
    cJSON_Delete(part);
    ProfCluster cl;
    CHECK_OK(prof_cluster_parse(profile_text, "test", &cl, &err), err);
    all = cl.measured;
    CHECK_OK(prof_measured_append(all, m, &err), err);
    CHECK_EQ_INT(2, all->n_gemm);
    CHECK_EQ_INT(3, all->n_ops);
    CHECK_EQ_INT(1, all->n_coll);
    CHECK_EQ_INT(4, all->gemm[1].concurrency);
    /* through JSON and back: the points and every concurrency survive */
    cJSON *j = prof_measured_to_json(all);
    ProfMeasured *back = NULL;
    CHECK_OK(prof_measured_from_json(j, "back:", &back, &err), err);
    CHECK_EQ_INT(36, back->ops[2].points);
    CHECK_EQ_INT(4, back->ops[2].concurrency);
    CHECK_EQ_INT(2, back->ops[0].concurrency);
    CHECK(back->gemm[1].seconds == 0.002);
    cJSON_Delete(j);
    prof_measured_free(back);
    prof_measured_free(m);
    prof_cluster_free(&cl);
}

/* The op layer.0.ln1.fwd of tiny (mbs 4) costed on cl in precision p; *pass_bytes gets the
 * bytes of its 16-bit widen and round passes. */
static const ModelOp *ln1_fwd(SimResult *r, const ProfCluster *cl, PxDtype p, double *t,
                              double *pass_bytes)
{
    PxError err = {0};
    ModelSpec s = tiny_mbs4();
    s.job.precision = p;
    CHECK_OK(sim_run(&s, cl, 2, r, &err), err);
    SimCtx c;
    sim_ctx_init(&c, &r->cluster, &r->spec, &r->dims, r->node_size);
    for (int i = 0; i < r->ops[0].count; i++) {
        char name[96];
        model_op_fullname(&r->ops[0].op[i], name, sizeof name);
        if (strcmp(name, "layer.0.ln1.fwd") == 0) {
            *t = r->op_seconds[0][i];
            *pass_bytes = sim_cpu16_pass_bytes(&c, &r->ops[0].op[i]);
            return &r->ops[0].op[i];
        }
    }
    CHECK(!"layer.0.ln1.fwd in tiny's op graph");
    return NULL;
}

/* A bf16 plan on CPU ranks: the fp32 kernel at its measured rate on the widened copies (twice
 * the op's 16-bit bytes) plus the widen and round passes (three times them) at the device's
 * streaming rate (sim/cost.c, sim_cpu16_pass_bytes); on a GPU, no passes. */
static void check_cpu16(void)
{
    PxError err = {0};
    ProfCluster cl, gpu;
    CHECK_OK(prof_cluster_parse(profile_text, "test", &cl, &err), err);
    CHECK_OK(prof_cluster_load("dgx-h100", NULL, 0, &gpu, &err), err);
    SimResult r32, r16, rg;
    double t32, t16, tg, pass32, pass16, passg;
    const ModelOp *o32 = ln1_fwd(&r32, &cl, PX_FP32, &t32, &pass32);
    const ModelOp *o16 = ln1_fwd(&r16, &cl, PX_BF16, &t16, &pass16);
    ln1_fwd(&rg, &gpu, PX_BF16, &tg, &passg);
    /* 256 tokens x 64: x read and y written, 2 bytes an element in bf16, 4 in fp32 */
    printf("ln1.fwd bytes: fp32 %.0f, bf16 %.0f, bf16 passes %.0f\n", o32->bytes, o16->bytes,
           pass16);
    CHECK(pass32 == 0.0);
    CHECK(passg == 0.0);
    CHECK(pass16 == 3.0 * o16->bytes);
    CHECK(o32->bytes == 131072.0 && o16->bytes == 65536.0);
    CHECK(pass16 == 196608.0);
    const double bw = cl.device.memory_bandwidth * cl.device.memory_eff;
    CHECK_REL(2e-5 + 2.0 * o16->bytes / 1e9 + pass16 / bw, t16, 1e-12);
    CHECK_REL(2e-5 + o32->bytes / 1e9, t32, 1e-12);
    sim_result_free(&r32);
    sim_result_free(&r16);
    sim_result_free(&rg);
    prof_cluster_free(&cl);
    prof_cluster_free(&gpu);
}

int main(void)
{
    px_log_set_quiet(1);
    /* "local" below means the generic profile, whatever this machine's calibration */
    setenv("PARALLAX_UNCALIBRATED", "1", 1);
    PxError err = {0};
    ProfCluster cl;
    CHECK_OK(prof_cluster_parse(profile_text, "test", &cl, &err), err);
    CHECK(cl.measured != NULL);
    CHECK_EQ_INT(1, cl.measured->n_gemm);
    CHECK_EQ_INT(2, cl.measured->n_ops);
    CHECK_EQ_INT(2, cl.measured->ranks);
    /* round trip through JSON */
    cJSON *j = prof_cluster_to_json(&cl);
    char *text = cJSON_Print(j);
    ProfCluster back;
    CHECK_OK(prof_cluster_parse(text, "roundtrip", &back, &err), err);
    cJSON_free(text);
    cJSON_Delete(j);
    CHECK_EQ_INT(cl.measured->n_gemm, back.measured->n_gemm);
    CHECK(back.measured->coll[0].seconds[1] == 1e-4);
    prof_cluster_free(&back);

    /* lookups */
    CHECK_REL(0.001, prof_measured_gemm(cl.measured, 256, 192, 64, 1, 1), 1e-12);
    CHECK_REL(0.002, prof_measured_gemm(cl.measured, 512, 192, 64, 1, 1), 1e-12); /* scaled by FLOPs */
    /* 32 KiB is halfway between 1 KiB and 1 MiB in log size: sqrt(1e-5 * 1e-4) */
    CHECK_REL(sqrt(1e-9), prof_measured_collective(cl.measured, "allreduce", 2, 1, 32768), 1e-12);
    CHECK(prof_measured_collective(cl.measured, "allreduce", 4, 1, 32768) < 0); /* not measured */
    CHECK(prof_measured_collective(cl.measured, "all_gather", 2, 1, 32768) < 0);
    CHECK(prof_measured_op(cl.measured, "norm", "bwd", 0, "layernorm", 1) == NULL);

    /* the simulator uses them: tiny, tp 1, mbs 4, seq 64: qkv forward is 256 x 192 x 64 */
    ModelSpec s = tiny_mbs4();
    SimResult r;
    CHECK_OK(sim_run(&s, &cl, 2, &r, &err), err);
    int found = 0;
    for (int i = 0; i < r.ops[0].count; i++) {
        const ModelOp *op = &r.ops[0].op[i];
        char name[96];
        model_op_fullname(op, name, sizeof name);
        double t = r.op_seconds[0][i];
        if (strcmp(name, "layer.0.ln1.fwd") == 0) {
            CHECK_REL(2e-5 + op->bytes / 1e9, t, 1e-12);
            found++;
        } else if (strcmp(name, "layer.0.attn.core.fwd") == 0) {
            CHECK_REL(op->flops / 1e10, t, 1e-12);
            found++;
        } else if (strcmp(name, "layer.0.attn.qkv.fwd") == 0) {
            CHECK_EQ_INT(256, op->gemm[0].m);
            CHECK_EQ_INT(192, op->gemm[0].n);
            CHECK_EQ_INT(64, op->gemm[0].k);
            found++;
        } else if (strcmp(name, "layer.0.grads.dp_allreduce.step") == 0) {
            CHECK_REL(prof_measured_collective(cl.measured, "allreduce", 2, 1, (double)op->comm_bytes), t, 1e-12);
            found++;
        }
    }
    CHECK_EQ_INT(4, found);
    double calibrated = r.step_s;
    sim_result_free(&r);
    /* and it changes the prediction against the generic profile */
    ProfCluster plain;
    CHECK_OK(prof_cluster_load("local", NULL, 0, &plain, &err), err);
    CHECK_OK(sim_run(&s, &plain, 2, &r, &err), err);
    CHECK(fabs(r.step_s - calibrated) > 1e-3 * calibrated);
    sim_result_free(&r);
    prof_cluster_free(&cl);

    /* bad measurements are refused, naming the key */
    const char *bad[][2] = {
        {"\"gemm\": [[256, 192, 64, 1]]", "measured.gemm[0]: expected [m, n, k, batch, seconds]"},
        {"\"gemm\": [[256, 192, 64, 1, -1]]", "measured.gemm[0]"},
        {"\"ops\": [{\"kind\": \"norm\", \"phase\": \"fwd\"}]", "measured.ops[0].rate: missing required key"},
        {"\"collectives\": [{\"op\": \"allreduce\", \"ranks\": 2, \"points\": [[2048, 1e-5], [1024, 2e-5]]}]",
         "bytes increasing"},
        {"\"collectives\": {}", "measured.collectives: expected an array"},
    };
    for (int i = 0; i < 5; i++) {
        char t[1024];
        snprintf(t, sizeof t,
                 "{\"name\": \"x\", \"device\": \"cpu\", \"node\": {\"devices\": 0, \"link\": {\"bandwidth\": 5e9, \"latency\": 1e-6}},"
                 " \"network\": {\"bandwidth_per_device\": 5e9, \"latency\": 1e-6}, \"measured\": {%s}}",
                 bad[i][0]);
        ProfCluster x;
        CHECK_INPUT_ERROR(prof_cluster_parse(t, "bad", &x, &err), err, bad[i][1]);
    }
    check_levels();
    check_ring();
    check_section();
    check_cpu16();
    TEST_DONE("calibrated");
}
