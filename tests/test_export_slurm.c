/* The Slurm export, whole: a CPU plan (one node, a core per rank, no GPUs) and a GPU plan (two
 * nodes of eight, a GPU per task), each script compared line by line; then the parts that
 * change with the plan: a job that does not fill its last node, no prediction, a time limit
 * given, paths the shell must have quoted. The predictions' step times are set by hand, so
 * that --time can be recomputed: twice steps x step_s, plus 600 s, rounded up to a minute. */
#include "export/export.h"
#include "fixtures.h"
#include "test.h"

#include <stdlib.h>

static ModelSpec spec(const char *model, int tp, int pp, int steps)
{
    PxError err = {0};
    ModelSpec s;
    model_spec_defaults(&s);
    CHECK_OK(model_config_load(model, &s.model, &err), err);
    s.layout.tp = tp;
    s.layout.pp = pp;
    s.job.micro_batch = 1;
    s.job.global_batch = 64;
    s.job.steps = steps;
    return s;
}

/* The plan of s on `gpus` ranks of `cluster`, its predicted step time set to step_s (0: the
 * plan carries no prediction). */
static void plan_of(const ModelSpec *s, const char *cluster, int gpus, double step_s, ModelPlan *plan)
{
    PxError err = {0};
    CHECK_OK(sim_plan_for(s, cluster, gpus, plan, &err), err);
    CHECK(plan->prediction != NULL);
    if (step_s > 0) {
        cJSON *t = cJSON_GetObjectItem(cJSON_GetObjectItem(plan->prediction, "time"), "step_s");
        CHECK(t != NULL);
        cJSON_SetNumberValue(t, step_s);
    } else {
        cJSON_Delete(plan->prediction);
        plan->prediction = NULL;
    }
}

static char *script_of(const ModelPlan *plan, const ExportSlurmJob *job)
{
    PxError err = {0};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    CHECK_OK(export_slurm_job(f, plan, job, &err), err);
    fclose(f);
    return buf;
}

/* got must be want exactly; the first line that differs is printed with both versions. */
static void expect_script(const char *what, const char *want, const char *got)
{
    px_test_checks++;
    if (!strcmp(want, got))
        return;
    int line = 1;
    const char *w = want, *g = got;
    while (*w && *w == *g) {
        line += *w == '\n';
        w++, g++;
    }
    while (w > want && w[-1] != '\n')
        w--, g--;
    fprintf(stderr, "FAILED: %s differs at line %d\n  expected: %.*s\n  actual:   %.*s\n--- got:\n%s", what,
            line, (int)strcspn(w, "\n"), w, (int)strcspn(g, "\n"), g, got);
    exit(1);
}

/* the line must be one of the script's whole lines */
static void expect_line(const char *what, const char *text, const char *line)
{
    px_test_checks++;
    const size_t n = strlen(line);
    for (const char *at = text; (at = strstr(at, line)) != NULL; at++)
        if ((at == text || at[-1] == '\n') && (at[n] == '\n' || at[n] == '\0'))
            return;
    fprintf(stderr, "FAILED: %s lacks the line\n%s\n--- got:\n%s", what, line, text);
    exit(1);
}

/* tiny on this machine's CPU profile, dp 2: 400 steps of 0.75 s, 2 x 300 s + 600 s = 20 min */
static void test_cpu(void)
{
    ModelSpec s = spec("tiny", 1, 1, 400);
    ModelPlan plan;
    plan_of(&s, "local", 2, 0.75, &plan);
    const ExportSlurmJob job = {"/shared/plans/tiny.json", "/opt/parallax/bin/parallax", NULL};
    char *got = script_of(&plan, &job);
    expect_script("the CPU plan's script",
                  "#!/bin/bash\n"
                  "# parallax run: tiny on local, 2 ranks (dp 2 x tp 1 x pp 1 x cp 1) on 1 node, 400 steps (predicted 0.75 s each)\n"
                  "# sbatch this file; run.json and run.metrics.jsonl land in the directory it is submitted from\n"
                  "#SBATCH --job-name=parallax-tiny\n"
                  "#SBATCH --nodes=1\n"
                  "#SBATCH --ntasks=2\n"
                  "#SBATCH --ntasks-per-node=2\n"
                  "#SBATCH --cpus-per-task=1\n"
                  "#SBATCH --time=00:20:00\n"
                  "# training length: 400 iterations, the plan's --steps\n"
                  "# learning rate: parallax run trains with the plan's: peak 0.001, minimum 0.0001, warm-up 10, cosine to the\n"
                  "# last step\n"
                  "# WARNING: parallax's defaults, not tuned for this model: plan with --lr X --min-lr X --warmup-steps N\n"
                  "set -eu\n"
                  "\n"
                  "# the same parallax build (parallax-worker beside it) and the same plan on every node\n"
                  "PARALLAX=/opt/parallax/bin/parallax\n"
                  "PLAN=/shared/plans/tiny.json\n"
                  "\n"
                  "# one BLAS thread per rank, on its one core\n"
                  "export PARALLAX_BLAS_THREADS=1 OMP_NUM_THREADS=1\n"
                  "# the ranks join the MPI job through PMIx, which OpenMPI 4 speaks (srun's --mpi; submit with\n"
                  "# SLURM_MPI_TYPE set for another)\n"
                  "export SLURM_MPI_TYPE=${SLURM_MPI_TYPE:-pmix}\n"
                  "\n"
                  "# srun is given --cpus-per-task again: Slurm 22.05 does not pass sbatch's on\n"
                  "srun --ntasks=2 --cpus-per-task=1 \"$PARALLAX\" run \"$PLAN\" --launcher none\n",
                  got);
    free(got);
    model_plan_free(&plan);
}

/* llama3-8b on DGX H100 nodes (8 GPUs each), 16 GPUs as tp 2 x pp 2 x dp 4: two full nodes,
 * a GPU per task; 1000 steps of 43.2 s: 2 x 43,200 s + 600 s = 87,000 s = 1 day 10 min */
static void test_gpu(void)
{
    ModelSpec s = spec("llama3-8b", 2, 2, 1000);
    ModelPlan plan;
    plan_of(&s, "dgx-h100", 16, 43.2, &plan);
    const ExportSlurmJob job = {"plans/llama.json", "parallax", NULL};
    char *got = script_of(&plan, &job);
    expect_script("the GPU plan's script",
                  "#!/bin/bash\n"
                  "# parallax run: llama3-8b on dgx-h100, 16 ranks (dp 4 x tp 2 x pp 2 x cp 1) on 2 nodes, 1000 steps (predicted 43.2 s each)\n"
                  "# sbatch this file; run.json and run.metrics.jsonl land in the directory it is submitted from\n"
                  "#SBATCH --job-name=parallax-llama3-8b\n"
                  "#SBATCH --nodes=2\n"
                  "#SBATCH --ntasks=16\n"
                  "#SBATCH --ntasks-per-node=8\n"
                  "#SBATCH --cpus-per-task=3\n"
                  "#SBATCH --gpus-per-task=1\n"
                  "#SBATCH --time=1-00:10:00\n"
                  "# training length: 1000 iterations, the plan's --steps\n"
                  "# learning rate: parallax run trains with the plan's: peak 0.001, minimum 0.0001, warm-up 10, cosine to the\n"
                  "# last step\n"
                  "# WARNING: parallax's defaults, not tuned for this model: plan with --lr X --min-lr X --warmup-steps N\n"
                  "set -eu\n"
                  "\n"
                  "# the same parallax build (parallax-worker beside it) and the same plan on every node\n"
                  "PARALLAX=parallax\n"
                  "PLAN=plans/llama.json\n"
                  "\n"
                  "# the ranks join the MPI job through PMIx, which OpenMPI 4 speaks (srun's --mpi; submit with\n"
                  "# SLURM_MPI_TYPE set for another)\n"
                  "export SLURM_MPI_TYPE=${SLURM_MPI_TYPE:-pmix}\n"
                  "\n"
                  "# srun is given --cpus-per-task again: Slurm 22.05 does not pass sbatch's on. Every rank sees\n"
                  "# the node's GPUs and takes the one of its rank on the node\n"
                  "srun --ntasks=16 --cpus-per-task=3 --gpu-bind=none \"$PARALLAX\" run \"$PLAN\" --launcher none\n",
                  got);
    free(got);
    model_plan_free(&plan);
}

/* 12 GPUs on 8-GPU nodes: two nodes, 8 tasks at most on each; the plan without a prediction
 * gets no --time, a time given is written as given; paths with a space and a quote are quoted
 * for the shell; no job description: plan.json and parallax on PATH */
static void test_parts(void)
{
    ModelSpec s = spec("llama3-8b", 2, 2, 10);
    s.job.global_batch = 48; /* dp 3 */
    ModelPlan plan;
    plan_of(&s, "dgx-h100", 12, 0, &plan);
    const ExportSlurmJob quoted = {"/data/my plans/it's.json", "/opt/p x/parallax", NULL};
    char *got = script_of(&plan, &quoted);
    expect_line("12 GPUs", got, "#SBATCH --nodes=2");
    expect_line("12 GPUs", got, "#SBATCH --ntasks=12");
    expect_line("12 GPUs", got, "#SBATCH --ntasks-per-node=8");
    expect_line("12 GPUs", got, "# no --time: the plan carries no prediction (export with --time)");
    expect_line("12 GPUs", got, "PLAN='/data/my plans/it'\\''s.json'");
    expect_line("12 GPUs", got, "PARALLAX='/opt/p x/parallax'");
    expect_line("12 GPUs", got, "srun --ntasks=12 --cpus-per-task=3 --gpu-bind=none \"$PARALLAX\" run \"$PLAN\" --launcher none");
    CHECK(strstr(got, "#SBATCH --time") == NULL);
    CHECK(strstr(got, "predicted") == NULL);
    free(got);
    const ExportSlurmJob timed = {NULL, NULL, "2-00:00:00"};
    got = script_of(&plan, &timed);
    expect_line("a time given", got, "#SBATCH --time=2-00:00:00");
    expect_line("no paths given", got, "PARALLAX=parallax");
    expect_line("no paths given", got, "PLAN=plan.json");
    free(got);
    model_plan_free(&plan);
}

/* --tokens 1e9 on llama3-8b, 64 x 8192 = 524,288 tokens a step: 1,907.3 -> 1,908 steps, which
 * parallax run is told (--steps) and --time counts: 2 x 1,908 x 43.2 s + 600 s = 165,451 s, up to
 * 2,758 min = 1 day 21:58 */
static void test_tokens(void)
{
    ModelSpec s = spec("llama3-8b", 2, 2, 1000);
    s.job.seq_len = 8192;
    s.job.train_tokens = 1e9;
    ModelPlan plan;
    plan_of(&s, "dgx-h100", 16, 43.2, &plan);
    char *got = script_of(&plan, NULL);
    expect_line("1e9 tokens", got, "#SBATCH --time=1-21:58:00");
    expect_line("1e9 tokens", got, "# training length: 1908 iterations = 1B tokens / (64 sequences x 8192 tokens), rounded up: the plan's --tokens");
    expect_line("1e9 tokens", got, "srun --ntasks=16 --cpus-per-task=3 --gpu-bind=none \"$PARALLAX\" run \"$PLAN\" --launcher none --steps 1908");
    free(got);
    model_plan_free(&plan);
}

int main(void)
{
    /* the local profile as built in, not this machine's calibration */
    setenv("PARALLAX_UNCALIBRATED", "1", 1);
    px_log_set_quiet(1);
    test_cpu();
    test_gpu();
    test_parts();
    test_tokens();
    TEST_DONE("export_slurm");
}
