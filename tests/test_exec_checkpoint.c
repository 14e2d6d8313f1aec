/* Checkpoints and resume, end to end through `parallax run` (mpirun for several ranks):
 * - a 6-step run uninterrupted;
 * - the same run with --checkpoint-every 3, killed before step 5 (--fail-rank with several ranks,
 *   a rank lost by SIGKILL that must end the job within 30 s; else PARALLAX_TEST_FAIL: steps 1-4
 *   ran, the checkpoint of step 3 was committed, the one of step 4 never started);
 * - --resume from it to step 6: the losses of steps 4-6 equal the uninterrupted run's bit for
 *   bit (AdamW's step count, the optimizer state, the master weights, the data position and the
 *   dropout streams all restored), the run records where it resumed from, goes on writing
 *   checkpoints at the checkpoint's interval and removes the older one once the new one is
 *   committed.
 * Cases: single (one rank, dropout), single_fp8_delayed (FP8 copies and amax histories),
 * dp2_pp2_zero1 and dp2_zero3 (label mpi; dp2_zero3 also
 * tries its checkpoint on a ZeRO-1 layout, which must be refused naming layout.zero), and
 * emu_fp16 (the CUDA code path on the emulator in fp16, with an overflow at step 2 so that the
 * loss scaler's state and the skipped step's unchanged AdamW count must carry over too) and
 * emu_dp2_zero1 (bf16, two ranks on the emulator through mpirun; label mpi).
 * Usage: test_exec_checkpoint PARALLAX CASE [WORKER-EMU] (`list` prints the cases). */
#include <errno.h>
#include <time.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/px.h"
#include "tests/test.h"
#include "tests/runs.h"

typedef struct {
    const char *name;
    int gpus;
    const char *cluster;
    const char *knobs; /* parallax plan's, layout pinned */
    int emu;           /* the run goes through parallax-worker-emu directly (one rank) */
} Case;

#define PIN1 "--vpp 1 --schedule 1f1b --no-sp"
static const Case cases[] = {
    {"single", 1, "local", "--dp 1 --tp 1 --pp 1 --zero 0 --mbs 4 --dropout 0.1 " PIN1, 0},
    {"dp2_pp2_zero1", 4, "local", "--dp 2 --tp 1 --pp 2 --zero 1 --mbs 1 --dropout 0.1 " PIN1, 0},
    {"dp2_zero3", 2, "local", "--dp 2 --tp 1 --pp 1 --zero 3 --mbs 2 --dropout 0.1 " PIN1, 0},
    /* FP8 with delayed scaling: the weights' FP8 copies and the amax histories (4 entries, so
     * that they roll over before the kill) must come back too */
    {"single_fp8_delayed", 1, "local", "--dp 1 --tp 1 --pp 1 --zero 0 --mbs 4 --fp8-recipe delayed "
     "--fp8-amax-history 4 " PIN1, 0},
    {"emu_fp16", 1, "dgx-h100", "--dp 1 --tp 1 --pp 1 --zero 0 --precision fp16 --seq 16 --mbs 4 "
     PIN1, 1},
    {"emu_dp2_zero1", 2, "dgx-h100", "--dp 2 --tp 1 --pp 1 --zero 1 --precision bf16 --seq 16 "
     "--mbs 1 " PIN1, 1},
};
enum { N_CASES = sizeof cases / sizeof cases[0], STEPS = 6, EVERY = 3, KILL_AT = 5 };

static const char *px, *worker;

static int exists(const char *rel)
{
    char path[400];
    snprintf(path, sizeof path, "%s/%s", tmp, rel);
    struct stat st;
    return stat(path, &st) == 0;
}

static uint64_t bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* Steps [from, to] of `run` must carry exactly the losses of the same steps of `ref`. */
static void same_losses(const cJSON *ref, const cJSON *run, int from, int to, const char *what)
{
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(ref, "steps");
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(run, "steps");
    CHECK_EQ_INT(to - from + 1, cJSON_GetArraySize(ss));
    printf("%s\n  step  uninterrupted                           %s\n", what, what);
    int bad = 0;
    for (int k = from; k <= to; k++) {
        const cJSON *a = cJSON_GetArrayItem(rs, k - 1), *b = cJSON_GetArrayItem(ss, k - from);
        CHECK_EQ_INT(k, (int)num(a, "step"));
        CHECK_EQ_INT(k, (int)num(b, "step"));
        const double x = num(a, "loss"), y = num(b, "loss");
        printf("  %4d  %.9g (%a)   %.9g (%a)%s\n", k, x, x, y, y, bits(x) == bits(y) ? "" : "  DIFFERS");
        bad |= bits(x) != bits(y);
        if (cJSON_GetObjectItemCaseSensitive(a, "loss_scale"))
            bad |= num(a, "loss_scale") != num(b, "loss_scale");
    }
    if (bad) {
        fprintf(stderr, "FAILED: %s: the losses (or loss scales) are not the uninterrupted run's "
                        "bit for bit (files kept in %s)\n", what, tmp);
        exit(1);
    }
}

static void check_case(const Case *C)
{
    run_expect(0, run_sh("%s plan --model tiny --cluster %s --gpus %d --gbs 8 --steps %d %s -o %s/plan.json",
                        px, C->cluster, C->gpus, STEPS, C->knobs, tmp), "parallax plan");
    /* `parallax run` (mpirun for several ranks), or the emulator's worker (through mpirun for
     * several: two ranks share the emulated GPU, over MPI staged through host memory) */
    char run[1024];
    if (C->emu && C->gpus > 1)
        snprintf(run, sizeof run, "timeout 600 mpirun -n %d %s --oversubscribe --bind-to none "
                 "--mca mpi_yield_when_idle 1 %s run %s/plan.json --quiet --backend cuda",
                 C->gpus, geteuid() == 0 ? "--allow-run-as-root" : "", worker, tmp);
    else
        snprintf(run, sizeof run, "timeout 600 %s run %s/plan.json --quiet%s", C->emu ? worker : px,
                 tmp, C->emu ? " --backend cuda" : "");

    /* uninterrupted (fp16: every run overflows at step 2) */
    const int fp16 = strstr(C->knobs, "fp16") != NULL;
    const char *inf = fp16 ? "PARALLAX_TEST_INF=2 " : "";
    run_expect(0, run_sh("%s%s -o %s/full.json", inf, run, tmp), "the uninterrupted run");
    /* killed before step 5: the checkpoint of step 3 is committed, none of step 4. Through
     * `parallax run` with several ranks the last rank is lost abruptly (--fail-rank: SIGKILL,
     * as a node that goes away): the job must end within 30 s naming the rank and step. Else
     * the rank fails with a message of its own (PARALLAX_TEST_FAIL). */
    const int lost = !C->emu && C->gpus > 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int st = lost ? run_sh("%s -o %s/part.json --checkpoint-dir %s/ck --checkpoint-every %d "
                       "--fail-rank %d --fail-step %d", run, tmp, tmp, EVERY, C->gpus - 1, KILL_AT)
                  : run_sh("%sPARALLAX_TEST_FAIL=%d:step:%d %s -o %s/part.json --checkpoint-dir %s/ck "
                       "--checkpoint-every %d", inf, C->gpus - 1, KILL_AT, run, tmp, tmp, EVERY);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(st != 0 && st != 124);
    if (lost) {
        const double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        char needle[96], cmd[512];
        snprintf(needle, sizeof needle, "rank %d: step %d: killed on purpose", C->gpus - 1, KILL_AT);
        snprintf(cmd, sizeof cmd, "grep -qF '%s' %s/log", needle, tmp);
        printf("  rank %d lost at step %d: the job ended with status %d after %.1f s\n",
               C->gpus - 1, KILL_AT, st, sec);
        CHECK(st == 1);
        CHECK(sec < 30);
        CHECK(system(cmd) == 0);
    }
    CHECK(exists("ck/step-00000003/manifest.json"));
    CHECK(!exists("ck/step-00000004"));
    char shard[64];
    for (int r = 0; r < C->gpus; r++) {
        snprintf(shard, sizeof shard, "ck/step-00000003/rank-%05d.bin", r);
        CHECK(exists(shard));
    }
    /* resumed to the end, at the checkpoint's own interval */
    run_expect(0, run_sh("%s%s -o %s/res.json --checkpoint-dir %s/ck --resume", inf, run, tmp, tmp),
                  "the resumed run");
    cJSON *full = read_json("full.json"), *res = read_json("res.json");
    char what[128];
    snprintf(what, sizeof what, "%s: resumed at step %d", C->name, EVERY);
    same_losses(full, res, EVERY + 1, STEPS, what);
    if (C->gpus == 1) { /* one rank writes run.json when it fails; MPI_Abort ends the others */
        cJSON *part = read_json("part.json");
        snprintf(what, sizeof what, "%s: the run that was killed", C->name);
        same_losses(full, part, 1, KILL_AT - 1, what);
        cJSON_Delete(part);
    }
    if (fp16) { /* the overflow of step 2 is the scaler's history in both runs */
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(full, "loss_scale");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(res, "loss_scale");
        CHECK_EQ_INT(1, (int)num(a, "skipped_steps"));
        CHECK_EQ_INT(1, (int)num(b, "skipped_steps"));
        CHECK(num(a, "final") == num(b, "final"));
        CHECK(num(a, "final") == 32768); /* halved once */
    }
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(res, "checkpoint");
    CHECK_EQ_INT(EVERY, (int)num(ck, "resumed_from_step"));
    CHECK_EQ_INT(EVERY, (int)num(ck, "every"));
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(ck, "written");
    CHECK_EQ_INT(1, cJSON_GetArraySize(w));
    CHECK_EQ_INT(STEPS, (int)num(cJSON_GetArrayItem(w, 0), "step"));
    printf("  checkpoint of step %d: %.0f bytes in %.3f s\n", STEPS,
           num(cJSON_GetArrayItem(w, 0), "bytes"), num(cJSON_GetArrayItem(w, 0), "seconds"));
    CHECK(exists("ck/step-00000006/manifest.json"));
    CHECK(!exists("ck/step-00000003")); /* removed once step 6 was committed */
    cJSON_Delete(full);
    cJSON_Delete(res);

    if (!strcmp(C->name, "dp2_zero3")) {
        /* the same job on ZeRO-1 cannot take ZeRO-3's shards */
        run_expect(0, run_sh("%s plan --model tiny --cluster local --gpus 2 --gbs 8 --steps 9 --dp 2 "
                            "--tp 1 --pp 1 --zero 1 --mbs 2 --dropout 0.1 " PIN1 " -o %s/plan.json",
                            px, tmp), "parallax plan (ZeRO-1)");
        run_expect(2, run_sh("%s -o %s/z1.json --checkpoint-dir %s/ck --resume", run, tmp, tmp),
                      "a ZeRO-1 run on a ZeRO-3 checkpoint");
        char path[400];
        snprintf(path, sizeof path, "%s/log", tmp);
        PxError err = {0};
        char *log = px_read_file(path, NULL, &err);
        CHECK(log && strstr(log, "layout.zero: the checkpoint was written with 3, this run has 1"));
        printf("  refused: %s", strstr(log, "parallax-worker run"));
        free(log);
    }
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "list")) {
        for (int i = 0; i < N_CASES; i++)
            printf("%s\n", cases[i].name);
        return 0;
    }
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: test_exec_checkpoint PARALLAX CASE [WORKER-EMU] | list\n");
        return 2;
    }
    px = argv[1];
    worker = argc == 4 ? argv[3] : NULL;
    const Case *C = NULL;
    for (int i = 0; i < N_CASES; i++)
        if (!strcmp(cases[i].name, argv[2]))
            C = &cases[i];
    if (!C || (C->emu && !worker)) {
        fprintf(stderr, "test_exec_checkpoint: no case %s (see list; emu cases need the worker)\n",
                argv[2]);
        return 2;
    }
    if (C->gpus > 1 && system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("test_exec_checkpoint: mpirun is not installed: skipped\n");
        return 77;
    }
    char what[96];
    snprintf(what, sizeof what, "ckpt-%s", C->name);
    if (run_scratch(what))
        return 1;
    check_case(C);
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp);
    if (system(rm) != 0)
        fprintf(stderr, "test_exec_checkpoint: could not remove %s\n", tmp);
    TEST_DONE(C->name);
}
