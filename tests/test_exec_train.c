/* Training end to end on one rank:
 * - tiny learns the built-in text (the loss falls well below its start);
 * - exec_run writes run.json (docs/formats.md's Run keys) and a metrics log of one JSON line per step;
 * - the loader thread gives the same batches as reading in place (bit-identical losses), and
 *   it is the one that reads: step k + 1's batch arrives while nobody asks for it after step k,
 *   and the main thread reads nothing;
 * - text files and llm.c .bin token files are read token for token;
 * - the learning rate of every step is the warm-up + cosine schedule, and the update applies
 *   it with the clip factor: SGD without momentum moves each weight by exactly
 *   -lr * g * min(1, clip / norm);
 * - initial weights are exec_init_normal's layout-independent values;
 * - the built-in text is deterministic ASCII. */
/* syscall(), to reach the kernel's pread under the pread defined below */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "exec/train/internal.h"
#include "sim/sim.h"
#include "tests/test_exec_common.h"

static char dir[64];

/* Every read of a data file (exec/data.c reads with pread) comes here first, so the test knows
 * which thread made it. */
static pthread_t main_thread;
static atomic_int reads_main, reads_loader;

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    atomic_fetch_add(pthread_equal(pthread_self(), main_thread) ? &reads_main : &reads_loader, 1);
    return (ssize_t)syscall(SYS_pread64, fd, buf, n, off);
}

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

static Exec *exec_with(const ModelSpec *s, const char *data, const char *output,
                       const char *metrics, int prefetch)
{
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(s, "local", 1, &plan, &err), err);
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.quiet = 1;
    opt.prefetch = prefetch;
    opt.data = data;
    opt.output = output;
    opt.metrics = metrics;
    Exec *ex = NULL;
    CHECK_OK(exec_init(&ex, &plan, &opt, &err), err);
    model_plan_free(&plan);
    return ex;
}

static void test_learns(void)
{
    ModelSpec s = tx_spec("tiny", 32, 8, 4);
    s.job.steps = 40;
    s.job.lr = 3e-3;
    Exec *ex = tx_exec(&s);
    PxError err = {0};
    double first = 0, last = 0;
    for (int i = 0; i < 40; i++) {
        ExecStepStats st;
        CHECK_OK(exec_step(ex, i, &st, &err), err);
        CHECK(st.step == i + 1 && st.lr > 0 && st.grad_norm > 0 && st.tokens_per_s > 0);
        if (i < 3)
            first += st.loss / 3;
        if (i >= 37)
            last += st.loss / 3;
    }
    exec_free(ex);
    printf("tiny on the built-in text: loss %.3f -> %.3f in 40 steps\n", first, last);
    CHECK(first > 5.0);
    CHECK(last < first - 1.5);
}

static void test_run_files(void)
{
    char out[128], metrics[128];
    path_in(out, sizeof out, "run.json");
    path_in(metrics, sizeof metrics, "run.metrics.jsonl");
    ModelSpec s = tx_spec("tiny", 16, 4, 2);
    s.job.steps = 4;
    PxError err = {0};
    double loss_thread[4], loss_plain[4];
    for (int prefetch = 1; prefetch >= 0; prefetch--) {
        Exec *ex = exec_with(&s, NULL, out, metrics, prefetch);
        CHECK_OK(exec_run(ex, &err), err);
        exec_free(ex);
        cJSON *j = px_json_read_file(out, &err);
        CHECK(j != NULL);
        const char *keys[] = {"plan", "backend", "steps", "memory", "comm", "ops", "time"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            CHECK(cJSON_GetObjectItemCaseSensitive(j, keys[k]) != NULL);
        const cJSON *steps = cJSON_GetObjectItemCaseSensitive(j, "steps");
        CHECK_EQ_INT(4, cJSON_GetArraySize(steps));
        for (int i = 0; i < 4; i++) {
            const cJSON *st = cJSON_GetArrayItem(steps, i);
            double loss = cJSON_GetObjectItemCaseSensitive(st, "loss")->valuedouble;
            (prefetch ? loss_thread : loss_plain)[i] = loss;
            CHECK(cJSON_GetObjectItemCaseSensitive(st, "time_s")->valuedouble > 0);
            CHECK(cJSON_GetObjectItemCaseSensitive(st, "tokens_per_s")->valuedouble > 0);
        }
        const cJSON *rank =
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(
                                   cJSON_GetObjectItemCaseSensitive(j, "memory"), "per_rank"),
                               0);
        CHECK(rank != NULL);
        for (int c = 0; c < MODEL_CAT_COUNT; c++)
            CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(rank, model_category_name((ModelCategory)c))));
        CHECK(cJSON_GetObjectItemCaseSensitive(rank, "peak_bytes")->valuedouble > 0);
        const cJSON *backend = cJSON_GetObjectItemCaseSensitive(j, "backend");
        CHECK_STR("cpu", cJSON_GetObjectItemCaseSensitive(backend, "compute")->valuestring);
        CHECK_EQ_INT(1, cJSON_GetObjectItemCaseSensitive(backend, "world")->valueint);
        const cJSON *ops = cJSON_GetObjectItemCaseSensitive(j, "ops");
        CHECK(cJSON_GetArraySize(ops) > 10);
        CHECK_STR("embed.fwd",
                  cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ops, 0), "name")->valuestring);
        const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "time");
        CHECK(cJSON_GetObjectItemCaseSensitive(tm, "step_s_median")->valuedouble > 0);
        CHECK(cJSON_GetObjectItemCaseSensitive(tm, "bubble_fraction")->valuedouble == 0);
        /* the plan travels with the run, prediction included */
        CHECK(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "plan"),
                                               "prediction") != NULL);
        cJSON_Delete(j);

        /* one parseable line per step, as the run went */
        char *text = px_read_file(metrics, NULL, &err);
        CHECK(text != NULL);
        int lines = 0;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
            cJSON *m = px_json_parse(line, metrics, &err);
            CHECK(m != NULL);
            const char *mk[] = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "ms_per_step"};
            for (size_t k = 0; k < sizeof mk / sizeof mk[0]; k++)
                CHECK(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(m, mk[k])));
            CHECK_EQ_INT(lines + 1, cJSON_GetObjectItemCaseSensitive(m, "step")->valueint);
            cJSON_Delete(m);
        }
        CHECK_EQ_INT(4, lines);
        free(text);
    }
    /* the loader thread prefetches exactly the batches that reading in place gets */
    CHECK(memcmp(loss_thread, loss_plain, sizeof loss_thread) == 0);
    unlink(out);
    unlink(metrics);
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, n, f) == n);
    CHECK(fclose(f) == 0);
}

static void test_data_files(void)
{
    PxError err = {0};
    enum { NTOK = 5000 };
    char bin[128], txt[128];
    path_in(bin, sizeof bin, "tokens.bin");
    path_in(txt, sizeof txt, "text.txt");
    /* an llm.c token file: header, then uint16 tokens i * 7 % 251 */
    unsigned char *buf = calloc(EXEC_BIN_HEADER_INTS * 4 + 2 * NTOK, 1);
    CHECK(buf != NULL);
    int32_t hdr[3] = {EXEC_BIN_MAGIC, EXEC_BIN_VERSION, NTOK};
    memcpy(buf, hdr, sizeof hdr);
    for (int i = 0; i < NTOK; i++) {
        unsigned v = (unsigned)(i * 7 % 251);
        buf[EXEC_BIN_HEADER_INTS * 4 + 2 * i] = (unsigned char)(v & 0xff);
        buf[EXEC_BIN_HEADER_INTS * 4 + 2 * i + 1] = (unsigned char)(v >> 8);
    }
    write_file(bin, buf, EXEC_BIN_HEADER_INTS * 4 + 2 * NTOK);
    free(buf);
    char text[NTOK];
    for (int i = 0; i < NTOK; i++)
        text[i] = (char)('a' + i % 26);
    write_file(txt, text, NTOK);

    ExecData d;
    int32_t tok[40];
    CHECK_OK(exec_data_open(&d, bin, 256, 8, 32, &err), err);
    CHECK_EQ_U64(NTOK, d.ntok);
    CHECK_OK(exec_data_read(&d, tok, 1234, 40, &err), err);
    for (int i = 0; i < 40; i++)
        CHECK_EQ_INT((1234 + i) * 7 % 251, tok[i]);
    exec_data_close(&d);
    CHECK_OK(exec_data_open(&d, txt, 256, 8, 32, &err), err);
    CHECK_OK(exec_data_read(&d, tok, 777, 40, &err), err);
    for (int i = 0; i < 40; i++)
        CHECK_EQ_INT('a' + (777 + i) % 26, tok[i]);
    exec_data_close(&d);
    /* a vocabulary below the tokens is refused at open */
    CHECK_INPUT_ERROR(exec_data_open(&d, bin, 200, 8, 32, &err), err, "beyond the model's vocabulary");
    exec_data_close(&d);

    /* and both train */
    ModelSpec s = tx_spec("tiny", 16, 4, 2);
    const char *files[] = {bin, txt};
    for (int f = 0; f < 2; f++) {
        Exec *ex = exec_with(&s, files[f], NULL, NULL, 1);
        ExecStepStats st;
        CHECK_OK(exec_step(ex, 0, &st, &err), err);
        CHECK(isfinite(st.loss) && st.loss > 4.0);
        exec_free(ex);
    }
    unlink(bin);
    unlink(txt);
}

/* The loader thread reads the next step's batch while the current one computes: exec_step(k)
 * asks for step k + 1 as it takes step k's batch, so once step k has returned, step k + 1's
 * batch arrives without anyone asking for it; the main thread never reads the file. */
static void test_prefetch(void)
{
    enum { NTOK = 5000 };
    char txt[128];
    path_in(txt, sizeof txt, "prefetch.txt");
    char text[NTOK];
    for (int i = 0; i < NTOK; i++)
        text[i] = (char)('a' + i * 7 % 26);
    write_file(txt, text, NTOK);
    ModelSpec s = tx_spec("tiny", 16, 4, 2); /* 2 micro-batches of 2: 4 sequences a step */
    Exec *ex = exec_with(&s, txt, NULL, NULL, 1);
    PxError err = {0};
    /* the thread, as exec_run starts it */
    exec_loader_stop(&ex->batches.loader);
    CHECK_OK(exec_loader_start(&ex->batches.loader, 1, &err), err);
    main_thread = pthread_self();
    atomic_store(&reads_main, 0);
    atomic_store(&reads_loader, 0);
    enum { STEPS = 5 };
    for (int k = 0; k < STEPS; k++) {
        ExecStepStats st;
        CHECK_OK(exec_step(ex, k, &st, &err), err);
        CHECK(isfinite(st.loss));
        const int32_t *batch = NULL;
        int ready = 0;
        /* up to 10 s: the thread may be descheduled on a busy machine, but it must come */
        for (int w = 0; w < 10000 && !(ready = exec_loader_ready(&ex->batches.loader, k + 1, &batch)); w++)
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        if (!ready) {
            fprintf(stderr, "step %d: the batch of step %d was not read ahead\n", k + 1, k + 2);
            exit(1);
        }
    }
    /* one pread per sequence: steps 1 .. STEPS + 1, four sequences each, all by the thread */
    CHECK_EQ_INT(0, atomic_load(&reads_main));
    CHECK_EQ_INT((STEPS + 1) * 4, atomic_load(&reads_loader));
    exec_free(ex);
    unlink(txt);
}

/* Every weight and gradient in table order (the order the arenas hold them). */
static void snapshot(Exec *ex, ModelCategory cat, float *out, uint64_t cap, uint64_t *n_out)
{
    const ModelTensorTable *tt = exec_table(ex);
    uint64_t n = 0;
    for (int i = 0; i < tt->count; i++) {
        if (tt->t[i].cat != cat)
            continue;
        uint64_t k = 0;
        const float *p = exec_tensor(ex, tt->t[i].name, &k);
        CHECK(p != NULL && n + k <= cap);
        memcpy(out + n, p, k * sizeof *p);
        n += k;
    }
    *n_out = n;
}

static void test_lr_and_clip(double grad_clip)
{
    ModelSpec s = tx_spec("tiny", 16, 4, 2);
    s.job.optimizer = MODEL_OPT_SGD_MOMENTUM;
    s.job.momentum = 0;
    s.job.weight_decay = 0;
    s.job.lr = 1e-2;
    s.job.min_lr = 1e-3;
    s.job.warmup_steps = 3;
    s.job.steps = 10;
    s.job.grad_clip = grad_clip;
    Exec *ex = tx_exec(&s);
    enum { CAP = 1 << 20 };
    float *w0 = malloc(CAP * sizeof *w0), *g0 = malloc(CAP * sizeof *g0), *w1 = malloc(CAP * sizeof *w1);
    CHECK(w0 && g0 && w1);
    PxError err = {0};
    int clipped = 0;
    for (int k = 0; k < s.job.steps; k++) {
        uint64_t nw = 0, ng = 0;
        double loss = 0;
        /* the step's gradients, then the step itself (the same batch: the same gradients) */
        CHECK_OK(exec_grads(ex, k, &loss, &err), err);
        snapshot(ex, MODEL_WEIGHTS, w0, CAP, &nw);
        snapshot(ex, MODEL_GRADS, g0, CAP, &ng);
        CHECK_EQ_U64(nw, ng);
        ExecStepStats st;
        CHECK_OK(exec_step(ex, k, &st, &err), err);
        CHECK(st.loss == loss);
        /* warm-up over 3 steps, then a cosine from lr at step 4 to min_lr at step 10 */
        if (k < 3) {
            CHECK(st.lr == s.job.lr * (double)(k + 1) / 3);
        } else {
            const double progress = (double)(k - 3) / 6.0;
            CHECK_REL(s.job.min_lr + 0.5 * (s.job.lr - s.job.min_lr) * (1.0 + cos(acos(-1.0) * progress)),
                      st.lr, 1e-15);
        }
        if (k == 3)
            CHECK_REL(s.job.lr, st.lr, 1e-15);
        if (k == s.job.steps - 1)
            CHECK(st.lr == s.job.min_lr);
        /* the norm before clipping, over every gradient */
        double sq = 0;
        for (uint64_t i = 0; i < ng; i++)
            sq += (double)g0[i] * g0[i];
        CHECK_REL(sqrt(sq), st.grad_norm, 1e-12);
        const double factor = grad_clip > 0 && st.grad_norm > grad_clip ? grad_clip / st.grad_norm : 1.0;
        clipped += factor < 1.0;
        const float scale = (float)factor, lr = (float)st.lr;
        snapshot(ex, MODEL_WEIGHTS, w1, CAP, &nw);
        for (uint64_t i = 0; i < nw; i++) {
            const float want = w0[i] - lr * (g0[i] * scale);
            if (w1[i] != want) {
                fprintf(stderr,
                        "step %d, weight %llu: expected %.9g - %.9g * %.9g * %.9g = %.9g, got %.9g\n",
                        k + 1, (unsigned long long)i, w0[i], lr, g0[i], scale, want, w1[i]);
                exit(1);
            }
        }
    }
    /* at initialization the norm is about 1-4: a clip of 0.5 cuts every step, none cuts none */
    CHECK_EQ_INT(grad_clip > 0 ? s.job.steps : 0, clipped);
    free(w0), free(g0), free(w1);
    exec_free(ex);
}

static void test_init_and_text(void)
{
    ModelSpec s = tx_spec("tiny-llama", 16, 2, 1);
    Exec *ex = tx_exec(&s);
    const ModelTensorTable *tt = exec_table(ex);
    int checked = 0;
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_WEIGHTS)
            continue;
        const float *w = exec_tensor(ex, t->name, NULL);
        double std = strstr(t->name, "attn.proj.w") || strstr(t->name, "mlp.fc2.w")
                         ? 0.02 / sqrt(2.0 * s.model.layers)
                         : 0.02;
        if (t->ndim == 1) {
            CHECK(w[0] == 1.0f && w[t->numel - 1] == 1.0f); /* RMSNorm weights */
            continue;
        }
        for (uint64_t j = 0; j < t->numel; j += t->numel / 7 + 1, checked++)
            CHECK(w[j] == (float)(std * exec_init_normal(s.job.seed, t->name, j)));
    }
    CHECK(checked > 20);
    exec_free(ex);
    /* roughly standard normal */
    double sum = 0, sq = 0;
    for (int i = 0; i < 20000; i++) {
        double z = exec_init_normal(7, "x", (uint64_t)i);
        sum += z;
        sq += z * z;
    }
    CHECK(fabs(sum / 20000) < 0.03 && fabs(sq / 20000 - 1.0) < 0.05);

    char a[4096], b[4096];
    CHECK_EQ_U64(sizeof a, exec_text_generate(a, sizeof a));
    exec_text_generate(b, sizeof b);
    CHECK(memcmp(a, b, sizeof a) == 0);
    for (size_t i = 0; i < sizeof a; i++)
        CHECK(a[i] == '\n' || (a[i] >= 32 && a[i] < 127));
}

int main(void)
{
    px_log_set_quiet(1);
    snprintf(dir, sizeof dir, "/tmp/test_exec_train.XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    test_init_and_text();
    test_data_files();
    test_prefetch();
    test_lr_and_clip(0.5);
    test_lr_and_clip(0);
    test_run_files();
    test_learns();
    rmdir(dir);
    TEST_DONE("test_exec_train");
}
