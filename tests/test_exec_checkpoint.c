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
 * - the state after step 6 (every rank's weights, master weights and optimizer state: its
 *   shard of the step 6 checkpoint, which the uninterrupted run writes too) the same bytes in
 *   both runs.
 * Cases: single (one rank, dropout), single_fp8_delayed (FP8 copies and amax histories),
 * dp2_pp2_zero1, dp2_pp2_zero3 (FSDP under a pipeline: the shards hold the state, the kept
 * gathers are rebuilt at the resumed step's start) and dp2_zero3 (label mpi; dp2_zero3 also
 * tries its checkpoint on a ZeRO-1 layout, which must be refused naming layout.zero), and
 * emu_fp16 (the CUDA code path on the emulator in fp16, with an overflow at step 2 so that the
 * loss scaler's state and the skipped step's unchanged AdamW count must carry over too) and
 * emu_dp2_zero1 (bf16, two ranks on the emulator through mpirun; label mpi) and
 * emu_dp2_zero1_offload_adam8 (the same with adam-8bit's state and the master in host memory,
 * read and written there); moe_ep2_pp2
 * (tiny-moe, ep 2 x pp 2 x dp 2, real routing whose dropless buffers grow in both runs; its
 * checkpoint is refused by an ep 1 layout naming layout.ep and both layouts, and by tiny-moe
 * with 4 experts naming model.moe.experts), moe_ep2_cp2 (tiny-moe, ep 2 over cp 2, real
 * routing and dropout; refused by ep 1 on the same cp 2 naming layout.ep), llama_cp2
 * (tiny-llama, cp 2 over the ring) and
 * hsdp_zero3 (dp_shard 2 x dp_replicate 2; refused by ZeRO-3 over dp 4 naming
 * layout.dp_shard), label mpi; the newer layouts: dp2_zero1_fp8pg_delayed_adam8 (FP8 weights
 * as the only weights below ZeRO-3, their histories, the fp32 master and adam-8bit's state;
 * refused without --fp8-param-gather naming training.fp8_param_gather; label mpi),
 * fp8_attention_delayed (the core's histories; refused without --fp8-attention naming
 * training.fp8_attention), sac_fp8_delayed (op-level selective recompute), qwen_ep2 (a gated
 * shared expert wider than the routed ones; label mpi) and llama_pp2_mtp2_stage0 (two
 * prediction modules on a stage of their own, their mtp_loss bit for bit too; label mpi);
 * dp2_zero1_fp8pg_tensorwise and gelu_ep2 run by name. A model changed from a named one
 * (model_edits) is written from a one-rank plan's copy.
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
    const char *model;
    int gpus;
    const char *cluster;
    const char *knobs; /* parallax plan's, layout pinned */
    int emu;           /* the run goes through parallax-worker-emu directly (one rank) */
} Case;

#define PIN1 "--vpp 1 --schedule 1f1b --no-sp"
static const Case cases[] = {
    {"single", "tiny", 1, "local", "--dp 1 --tp 1 --pp 1 --zero 0 --mbs 4 --dropout 0.1 " PIN1, 0},
    {"dp2_pp2_zero1", "tiny", 4, "local", "--dp 2 --tp 1 --pp 2 --zero 1 --mbs 1 --dropout 0.1 " PIN1, 0},
    {"dp2_zero3", "tiny", 2, "local", "--dp 2 --tp 1 --pp 1 --zero 3 --mbs 2 --dropout 0.1 " PIN1, 0},
    {"dp2_pp2_zero3", "tiny", 4, "local", "--dp 2 --tp 1 --pp 2 --zero 3 --fsdp --mbs 1 --dropout 0.1 " PIN1, 0},
    /* FP8 with delayed scaling: the weights' FP8 copies and the amax histories (4 entries, so
     * that they roll over before the kill) must come back too */
    {"single_fp8_delayed", "tiny", 1, "local", "--dp 1 --tp 1 --pp 1 --zero 0 --mbs 4 --fp8-recipe delayed "
     "--fp8-amax-history 4 " PIN1, 0},
    {"emu_fp16", "tiny", 1, "dgx-h100", "--dp 1 --tp 1 --pp 1 --zero 0 --precision fp16 --seq 16 --mbs 4 "
     PIN1, 1},
    {"emu_dp2_zero1", "tiny", 2, "dgx-h100", "--dp 2 --tp 1 --pp 1 --zero 1 --precision bf16 --seq 16 "
     "--mbs 1 " PIN1, 1},
    /* the optimizer offloaded with adam-8bit: the master, codes and absmax in host memory */
    {"emu_dp2_zero1_offload_adam8", "tiny", 2, "dgx-h100", "--dp 2 --tp 1 --pp 1 --zero 1 "
     "--precision bf16 --seq 16 --mbs 1 --offload-optimizer --optimizer adam-8bit " PIN1, 1},
    /* experts over ep 2 in a 2-stage pipeline, routed for real (the untrained router sends a
     * rank more token copies than the plan's buffers hold: dropless, they grow, in the resumed
     * run again from the plan's size); the expert shards, the router's weights and their AdamW
     * state come back (label mpi) */
    {"moe_ep2_pp2", "tiny-moe", 4, "local", "--dp 2 --tp 1 --pp 2 --ep 2 --zero 0 --mbs 2 " PIN1, 0},
    /* DeepSeek-V3's whole shape (tiny-dsv3: multi-head latent attention, group-limited sigmoid
     * routing for real, shared experts, its prediction module on the last stage) over ep 2 x
     * pp 2 x dp 2: the expert shards, the module's weights and the router's come back (label
     * mpi) */
    {"dsv3_ep2_pp2", "tiny-dsv3", 4, "local", "--dp 2 --tp 1 --pp 2 --ep 2 --zero 0 --mbs 2 " PIN1, 0},
    /* experts over ep 2 regrouping the two cp ranks (tiny-moe, routed for real, dropout on):
     * each cp rank routes its parts of the sequence, so the router's state, the dropless
     * buffers' growth and the dropout streams at the parts' global positions must all come
     * back; its checkpoint is refused by an ep 1 layout on the same cp 2, naming layout.ep
     * (label mpi) */
    {"moe_ep2_cp2", "tiny-moe", 2, "local", "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --ep 2 "
     "--zero 0 --mbs 2 --dropout 0.1 " PIN1, 0},
    /* the sequence over cp 2, K and V round the ring (label mpi) */
    {"llama_cp2", "tiny-llama", 2, "local", "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p "
     "--zero 0 --mbs 4 --seq 128 " PIN1, 0},
    /* HSDP: ZeRO-3's shards over dp_shard 2, replicated dp_replicate 2 times (label mpi) */
    {"hsdp_zero3", "tiny", 4, "local", "--dp 4 --dp-shard 2 --dp-replicate 2 --tp 1 --pp 1 --zero 3 "
     "--mbs 2 --dropout 0.1 " PIN1, 0},
    /* --fp8-param-gather below ZeRO-3 (Megatron's distributed optimizer): the FP8 weights are
     * the parameters (no act copy of them), quantized from the fp32 master shards and gathered
     * after the update: tensorwise, and delayed (the weights' amax histories of 2 entries, one
     * a step, rolled over before the kill) with adam-8bit's codes and absmax (label mpi) */
    {"dp2_zero1_fp8pg_tensorwise", "tiny", 2, "local", "--dp 2 --tp 1 --pp 1 --zero 1 "
     "--fp8-param-gather --fp8-recipe tensorwise --mbs 1 " PIN1, 0},
    {"dp2_zero1_fp8pg_delayed_adam8", "tiny", 2, "local", "--dp 2 --tp 1 --pp 1 --zero 1 "
     "--fp8-param-gather --fp8-recipe delayed --fp8-amax-history 2 --optimizer adam-8bit --mbs 1 "
     PIN1, 0},
    /* FP8 attention with delayed scaling: the core's Q, K, V, O and dO histories (the QKV
     * weight's <w>.fp8_amax, 4 entries, two micro-batches a step) */
    {"fp8_attention_delayed", "tiny", 1, "local", "--dp 1 --tp 1 --pp 1 --zero 0 --mbs 4 "
     "--fp8-recipe delayed --fp8-amax-history 4 --fp8-attention " PIN1, 0},
    /* Qwen2-MoE's shape (a gated shared expert of 192 over ffn_hidden 176) and GeLU experts,
     * tiny-moe over ep 2, routed for real: the shared expert's gate and the experts' shards
     * (label mpi) */
    {"qwen_ep2", "tiny-moe", 2, "local", "--dp 2 --tp 1 --pp 1 --ep 2 --zero 0 --mbs 2 " PIN1, 0},
    {"gelu_ep2", "tiny-moe", 2, "local", "--dp 2 --tp 1 --pp 1 --ep 2 --zero 0 --mbs 2 " PIN1, 0},
    /* torchtitan's op-level selective recompute with FP8 delayed scaling: the rerun matmuls
     * quantize again and record no amax twice */
    {"sac_fp8_delayed", "tiny", 1, "local", "--dp 1 --tp 1 --pp 1 --zero 0 --mbs 4 "
     "--framework torchtitan --recompute selective --fp8-recipe delayed --fp8-amax-history 4 " PIN1, 0},
    /* two prediction modules on a stage of their own after the first (tiny-llama, pp 2, the
     * layout Et*4mm|L): the modules' weights and their optimizer state (label mpi) */
    {"llama_pp2_mtp2_stage0", "tiny-llama", 2, "local", "--dp 1 --tp 1 --pp 2 --zero 0 --mbs 1 "
     "--pipeline-model-parallel-layout 'Et*4mm|L' " PIN1, 0},
};
enum { N_CASES = sizeof cases / sizeof cases[0], STEPS = 6, EVERY = 3, KILL_AT = 5 };

/* The cases whose model is the named one with some keys changed, as `KEY=VALUE ...` (a dotted
 * path into the model's JSON; true, false, a number or a word); NULL: the model as named. */
static const char *model_edits(const Case *C)
{
    static const struct {
        const char *name, *edits;
    } e[] = {
        /* Qwen2-MoE's shared expert wider than the dense layers' MLP (Qwen2-57B-A14B's 20480
         * over 18944), with its sigmoid gate */
        {"qwen_ep2", "moe.shared_gate=true moe.shared_ffn=192"},
        {"gelu_ep2", "mlp=gelu"},
        {"llama_pp2_mtp2_stage0", "mtp_layers=2"},
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        if (!strcmp(e[i].name, C->name))
            return e[i].edits;
    return NULL;
}

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
        if (cJSON_GetObjectItemCaseSensitive(a, "mtp_loss")) { /* the prediction modules' */
            const double u = num(a, "mtp_loss"), v = num(b, "mtp_loss");
            printf("        mtp_loss %.9g (%a)   %.9g (%a)%s\n", u, u, v, v,
                   bits(u) == bits(v) ? "" : "  DIFFERS");
            bad |= bits(u) != bits(v);
        }
        if (cJSON_GetObjectItemCaseSensitive(a, "loss_scale"))
            bad |= num(a, "loss_scale") != num(b, "loss_scale");
    }
    if (bad) {
        fprintf(stderr, "FAILED: %s: the losses (or loss scales) are not the uninterrupted run's "
                        "bit for bit (files kept in %s)\n", what, tmp);
        exit(1);
    }
}

/* The parameters, master weights and optimizer state at the end: every rank's shard of step 6
 * written by the resumed run equals, byte for byte, the uninterrupted run's (which checkpoints
 * at step 6 only). */
static void same_state(int ranks)
{
    for (int r = 0; r < ranks; r++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "fullck/step-%08d/rank-%05d.bin", STEPS, r);
        snprintf(b, sizeof b, "ck/step-%08d/rank-%05d.bin", STEPS, r);
        CHECK(exists(a) && exists(b));
        const int st = run_sh("cmp %s/%s %s/%s", tmp, a, tmp, b);
        if (st != 0) {
            fprintf(stderr, "FAILED: rank %d's state after step %d differs between the uninterrupted "
                            "and the resumed run (files kept in %s)\n", r, STEPS, tmp);
            exit(1);
        }
    }
    printf("  the state of step %d (weights, master, optimizer) of %d rank(s): the same bytes\n",
           STEPS, ranks);
}

/* After a run resumed from CKDIR with plan.json replaced by another layout's: status 2 and the
 * log names NEEDLE. */
static void refused(const char *run, const char *what, const char *needle)
{
    run_expect(2, run_sh("%s -o %s/other.json --checkpoint-dir %s/ck --resume", run, tmp, tmp), what);
    char path[400];
    snprintf(path, sizeof path, "%s/log", tmp);
    PxError err = {0};
    char *log = px_read_file(path, NULL, &err);
    if (!log || !strstr(log, needle)) {
        fprintf(stderr, "FAILED: %s: the log does not say '%s':\n%s\n", what, needle,
                log ? log : "(no log)");
        exit(1);
    }
    const char *at = strstr(log, "parallax-worker run");
    printf("  refused: %s", at ? at : needle);
    free(log);
}

/* tmp/FILE: the model of tmp/plan.json with EDITS (`KEY=VALUE ...`, model_edits) applied (a key
 * not there is added: the model's loader refuses one it does not know). */
static void write_model(const char *edits, const char *file)
{
    cJSON *plan = read_json("plan.json");
    cJSON *model = cJSON_DetachItemFromObjectCaseSensitive(plan, "model");
    char buf[256];
    px_strlcpy(buf, edits, sizeof buf);
    for (char *save = NULL, *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *val = strchr(kv, '=');
        CHECK(val != NULL);
        *val++ = '\0';
        cJSON *obj = model;
        char *key = kv, *dot;
        while ((dot = strchr(key, '.'))) { /* down the dotted path */
            *dot = '\0';
            obj = cJSON_GetObjectItemCaseSensitive(obj, key);
            CHECK(cJSON_IsObject(obj));
            key = dot + 1;
        }
        char *end;
        const double x = strtod(val, &end);
        cJSON *v = !strcmp(val, "true") || !strcmp(val, "false") ? cJSON_CreateBool(*val == 't')
                   : *end == '\0'                                 ? cJSON_CreateNumber(x)
                                                                  : cJSON_CreateString(val);
        if (cJSON_GetObjectItemCaseSensitive(obj, key))
            cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
        else
            cJSON_AddItemToObject(obj, key, v);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/%s", tmp, file);
    char *text = cJSON_Print(model);
    FILE *f = fopen(path, "w");
    CHECK(f && text && fputs(text, f) >= 0 && fclose(f) == 0);
    free(text);
    cJSON_Delete(model);
    cJSON_Delete(plan);
}

static void check_case(const Case *C)
{
    /* an edited model: the named one's keys changed (its copy in a one-rank plan) */
    const char *edits = model_edits(C);
    char model[400];
    snprintf(model, sizeof model, "%s", C->model);
    if (edits) {
        run_expect(0, run_sh("%s plan --model %s --cluster %s --gpus 1 --gbs 8 --steps %d --dp 1 "
                            "--tp 1 --pp 1 --zero 0 --mbs 4 " PIN1 " -o %s/plan.json",
                            px, C->model, C->cluster, STEPS, tmp), "parallax plan (the model to edit)");
        write_model(edits, "model.json");
        snprintf(model, sizeof model, "%s/model.json", tmp);
    }
    run_expect(0, run_sh("%s plan --model %s --cluster %s --gpus %d --gbs 8 --steps %d %s -o %s/plan.json",
                        px, model, C->cluster, C->gpus, STEPS, C->knobs, tmp), "parallax plan");
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
    run_expect(0, run_sh("%s%s -o %s/full.json --checkpoint-dir %s/fullck --checkpoint-every %d", inf,
                        run, tmp, tmp, STEPS), "the uninterrupted run");
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
    if (!strncmp(C->model, "tiny-moe", 8) || !strcmp(C->model, "tiny-dsv3")) {
        /* routed for real: the buffers grew past the plan's in both runs, dropping nothing */
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(full, "moe");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(res, "moe");
        CHECK(a && b);
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "routing")), "dropless"));
        CHECK(num(a, "extra_bytes") > 0);
        CHECK(num(b, "extra_bytes") > 0);
        printf("  dropless buffers grown by %.0f bytes in the uninterrupted run, %.0f in the resumed\n",
               num(a, "extra_bytes"), num(b, "extra_bytes"));
    }
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
    same_state(C->gpus);
    cJSON_Delete(full);
    cJSON_Delete(res);

    if (!strcmp(C->name, "dp2_zero3")) {
        /* the same job on ZeRO-1 cannot take ZeRO-3's shards */
        run_expect(0, run_sh("%s plan --model tiny --cluster local --gpus 2 --gbs 8 --steps 9 --dp 2 "
                            "--tp 1 --pp 1 --zero 1 --mbs 2 --dropout 0.1 " PIN1 " -o %s/plan.json",
                            px, tmp), "parallax plan (ZeRO-1)");
        refused(run, "a ZeRO-1 run on a ZeRO-3 checkpoint",
                "layout.zero: the checkpoint was written with 3, this run has 1 (the checkpoint's "
                "layout dp 2 tp 1 pp 1 cp 1 vpp 1 zero 3, this run's dp 2 tp 1 pp 1 cp 1 vpp 1 zero 1)");
    }
    if (!strcmp(C->name, "hsdp_zero3")) {
        /* ZeRO-3 over all 4 ranks cannot take shards of 2 replicated twice */
        run_expect(0, run_sh("%s plan --model tiny --cluster local --gpus 4 --gbs 8 --steps 9 --dp 4 "
                            "--tp 1 --pp 1 --zero 3 --mbs 2 --dropout 0.1 " PIN1 " -o %s/plan.json",
                            px, tmp), "parallax plan (ZeRO-3 over dp 4)");
        refused(run, "ZeRO-3 over 4 ranks on an HSDP checkpoint",
                "layout.dp_shard: the checkpoint was written with 2, this run has 4 (the "
                "checkpoint's layout dp 4 tp 1 pp 1 cp 1 vpp 1 zero 3 dp_shard 2 dp_replicate 2, "
                "this run's dp 4 tp 1 pp 1 cp 1 vpp 1 zero 3 dp_shard 4 dp_replicate 1)");
    }
    if (!strcmp(C->name, "dp2_zero1_fp8pg_delayed_adam8")) {
        /* the same job with act weights: the FP8 ones cannot stand in for them */
        run_expect(0, run_sh("%s plan --model tiny --cluster local --gpus 2 --gbs 8 --steps 9 --dp 2 "
                            "--tp 1 --pp 1 --zero 1 --fp8-recipe delayed --fp8-amax-history 2 "
                            "--optimizer adam-8bit --mbs 1 " PIN1 " -o %s/plan.json", px, tmp),
                   "parallax plan (no FP8 parameters)");
        refused(run, "a run without --fp8-param-gather on its checkpoint",
                "training.fp8_param_gather: the checkpoint has true, this run false");
    }
    if (!strcmp(C->name, "fp8_attention_delayed")) {
        /* without FP8 attention the QKV weight's histories have no columns for the core */
        run_expect(0, run_sh("%s plan --model tiny --cluster local --gpus 1 --gbs 8 --steps 9 --dp 1 "
                            "--tp 1 --pp 1 --zero 0 --mbs 4 --fp8-recipe delayed --fp8-amax-history 4 "
                            PIN1 " -o %s/plan.json", px, tmp), "parallax plan (no FP8 attention)");
        refused(run, "a run without --fp8-attention on its checkpoint",
                "training.fp8_attention: the checkpoint has true, this run false");
    }
    if (!strcmp(C->name, "moe_ep2_cp2")) {
        /* the same dense layout with every expert on each rank */
        run_expect(0, run_sh("%s plan --model tiny-moe --cluster local --gpus 2 --gbs 8 --steps 9 "
                            "--dp 1 --tp 1 --pp 1 --cp 2 --cp-comm-type p2p --ep 1 --zero 0 --mbs 2 "
                            "--dropout 0.1 " PIN1 " -o %s/plan.json", px, tmp), "parallax plan (ep 1)");
        refused(run, "an ep 1 x cp 2 run on an ep 2 x cp 2 checkpoint",
                "layout.ep: the checkpoint was written with 2, this run has 1 (the checkpoint's "
                "layout dp 1 tp 1 pp 1 cp 2 vpp 1 zero 0 ep 2 etp 1, this run's dp 1 tp 1 pp 1 "
                "cp 2 vpp 1 zero 0 ep 1 etp 1)");
    }
    if (!strcmp(C->name, "moe_ep2_pp2")) {
        /* another expert layout: the experts of ep 2 on ep 1 */
        run_expect(0, run_sh("%s plan --model tiny-moe --cluster local --gpus 4 --gbs 8 --steps 9 "
                            "--dp 2 --tp 1 --pp 2 --ep 1 --zero 0 --mbs 2 " PIN1 " -o %s/plan.json",
                            px, tmp), "parallax plan (ep 1)");
        refused(run, "an ep 1 run on an ep 2 checkpoint",
                "layout.ep: the checkpoint was written with 2, this run has 1 (the checkpoint's "
                "layout dp 2 tp 1 pp 2 cp 1 vpp 1 zero 0 ep 2 etp 1, this run's dp 2 tp 1 pp 2 "
                "cp 1 vpp 1 zero 0 ep 1 etp 1)");
        /* another expert count: tiny-moe with 4 experts (its model from the plan's copy) */
        write_model("moe.experts=4", "moe4.json");
        run_expect(0, run_sh("%s plan --model %s/moe4.json --cluster local --gpus 4 --gbs 8 --steps 9 "
                            "--dp 2 --tp 1 --pp 2 --ep 2 --zero 0 --mbs 2 " PIN1 " -o %s/plan.json",
                            px, tmp, tmp), "parallax plan (4 experts)");
        refused(run, "4 experts on a checkpoint of 8",
                "model.moe.experts: the checkpoint has 8, this run 4");
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
