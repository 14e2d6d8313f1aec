/* The FLOP counts a published figure is read on (sim/published.c; docs/calibration.md, "FLOP
 * counts"): Megatron-LM's num_floating_point_operations in full and causal-halved and PaLM's
 * 6N + 12LHQT, each at a value computed by hand below; a row's flop_count turning its TFLOP/s
 * into the step it stands for; the bad names and metrics refused by name. */
#define _XOPEN_SOURCE 700
#include <stdlib.h>
#include <unistd.h>

#include "fixtures.h"
#include "test.h"

static ModelConfig zoo(const char *name)
{
    PxError err = {0};
    ModelConfig c;
    CHECK_OK(model_config_load(name, &c, &err), err);
    return c;
}

/* 12·B·s·L·h²·[(1 + g/a + s/h)·(d·a/h) + (f/h)·glu] + 6·B·s·h·V, by hand:
 *   Mixtral 8x22B, B 1024, s 16384, L 56, h 6144, a 48, g 8, d 128, f 2 x 16384 (top-2), glu
 *   3/2, V 32000: 5.0559414926070252e18 (the research file's 5.0559e18); with s/h halved
 *   4.4884879395583427e18 (4.4885e18);
 *   GPT-3 175B (GELU, glu 1, g = a = 96, f 49152), B 1, s 2048, V 50304: 2.2044198819594238e15.
 * PaLM: 2048 x 8192 tokens x (6N + 12·126·128·128·8192) with Llama 3 405B's N = 2·128256·16384
 * (embedding, output) + 126·(2·16384² + 2·16384·1024 + 3·16384·53248 + 2·16384) + 16384 =
 * 405,853,388,800: 4.425926112766958e19; attention halved 4.2556900468523532e19. */
static void test_counts(void)
{
    const ModelConfig mx = zoo("mixtral-8x22b"), g3 = zoo("gpt3-175b"), l3 = zoo("llama3-405b");
    CHECK_REL(5.0559414926070252e18, sim_flop_count_step(SIM_FLOPS_MEGATRON, &mx, 1024, 16384, 32000), 1e-13);
    CHECK_REL(4.4884879395583427e18,
              sim_flop_count_step(SIM_FLOPS_MEGATRON_CAUSAL, &mx, 1024, 16384, 32000), 1e-13);
    CHECK_REL(2.2044198819594238e15, sim_flop_count_step(SIM_FLOPS_MEGATRON, &g3, 1, 2048, 50304), 1e-13);
    CHECK_REL(405853388800.0, model_config_active_params(&l3), 1e-15);
    CHECK_REL(4.425926112766958e19, sim_flop_count_step(SIM_FLOPS_PALM, &l3, 2048, 8192, 128256), 1e-13);
    CHECK_REL(4.2556900468523532e19, sim_flop_count_step(SIM_FLOPS_PALM_CAUSAL, &l3, 2048, 8192, 128256),
              1e-13);
    /* multi-head latent attention is not in either formula */
    const ModelConfig dv = zoo("deepseek-v3");
    CHECK(sim_flop_count_step(SIM_FLOPS_MEGATRON, &dv, 1, 4096, 129280) == 0.0);
    CHECK_EQ_INT(SIM_FLOPS_MEGATRON_CAUSAL, sim_flop_count_from_name("megatron-causal"));
    CHECK_EQ_INT(-1, sim_flop_count_from_name("hardware"));
    CHECK_STR("palm-causal", sim_flop_count_name(SIM_FLOPS_PALM_CAUSAL));
}

/* The 128K MCore row of MoE Parallel Folding's Table 5 (378 TFLOP/s a GPU on 1024, GBS 128,
 * tp 4: the vocabulary padded to 32256) on the causal count: 8.4608211405735199e18 FLOPs, a
 * 21.858520225109334 s step. Its prediction is that count over parallax's step. */
static void test_row(void)
{
    PxError err = {0};
    SimPublished p;
    CHECK_OK(sim_published_run(PX_SOURCE_DIR "/published/moe-parallel-folding.json", &p, &err), err);
    int seen = 0;
    for (int i = 0; i < p.n_rows; i++) {
        const SimPublishedRow *r = &p.rows[i];
        if (strcmp(r->id, "mpf-t5-mixtral8x22b-mcore-1024-s128k") != 0)
            continue;
        CHECK_EQ_INT(SIM_FLOPS_MEGATRON_CAUSAL, r->flops);
        CHECK_REL(21.858520225109334, r->measured_step_s, 1e-12);
        CHECK_REL(8.4608211405735199e18 / (r->step_s * 1024) / 1e12, r->predicted, 1e-12);
        seen++;
    }
    CHECK_EQ_INT(1, seen);
    sim_published_free(&p);
    /* read on the full count instead, the same step stands for more FLOPs */
    CHECK_OK(sim_published_run_with(PX_SOURCE_DIR "/published/moe-parallel-folding.json", NULL,
                                    SIM_FLOPS_MEGATRON, &p, &err), err);
    for (int i = 0; i < p.n_rows; i++)
        if (strcmp(p.rows[i].id, "mpf-t5-mixtral8x22b-mcore-1024-s128k") == 0)
            CHECK_EQ_INT(SIM_FLOPS_MEGATRON, p.rows[i].flops);
    sim_published_free(&p);
}

/* A file of one row whose flop_count is `count` and whose figure is `metric`. */
static void write_row(const char *path, const char *count, const char *metric)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fprintf(f, "{\"source\": \"t\", \"rows\": [{\"id\": \"r\", \"model\": \"tiny\", \"cluster\": \"dgx-h100\", "
               "\"gpus\": 1, \"measured\": {\"%s\": 1}, \"flop_count\": \"%s\", \"tolerance\": 0.5}]}\n",
            metric, count);
    fclose(f);
}

static void test_refused(void)
{
    PxError err = {0};
    SimPublished p;
    char path[] = "/tmp/px_flop_countXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    write_row(path, "hardware", "tflops_per_gpu");
    CHECK_INPUT_ERROR(sim_published_run(path, &p, &err), err, "rows[0] flop_count: 'hardware'");
    write_row(path, "palm", "step_s");
    CHECK_INPUT_ERROR(sim_published_run(path, &p, &err), err, "flop_count: only a tflops_per_gpu");
    unlink(path);
}

int main(void)
{
    px_log_set_quiet(1);
    test_counts();
    test_row();
    test_refused();
    TEST_DONE("flop_count");
}
