/* Nothing is allocated in the step loop: every tensor lives in the arenas carved at exec_init,
 * and a step (the schedule's passes, the optimizer, the loader thread's prefetch, the progress
 * line and the metrics log) neither allocates nor frees heap memory.
 *
 * The test replaces malloc and its family for the whole process (glibc supports this: its own
 * calls, OpenBLAS's and the loader thread's all come here) and counts every call. exec_run
 * flushes the metrics log once per step, after the step's line; fflush is wrapped too, so the
 * count is read at the end of every step. From the end of step 1 (which may pay first-use
 * costs: stdio buffers, BLAS buffers) to the end of the last step the counts must not move.
 * Several configurations: a text file read by the loader thread, dropout, recompute, unfused
 * and flash attention, gradient accumulation, AdamW, SGD and adam-8bit, ZeRO-1, op-level
 * selective recompute.
 *
 * glibc only, and not under the sanitizers (they own malloc): exit 77 (skipped) otherwise. */
#include <stdatomic.h>
#include <unistd.h>

#include "tests/test_exec_common.h"

#if defined(__SANITIZE_ADDRESS__)
#define NOALLOC_SKIP 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NOALLOC_SKIP 1
#endif
#endif
#if !defined(NOALLOC_SKIP) && !defined(__GLIBC__)
#define NOALLOC_SKIP 1
#endif

#ifndef NOALLOC_SKIP

/* glibc's allocator under its exported names */
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);
void *__libc_memalign(size_t align, size_t n);
int _IO_fflush(FILE *f);

static atomic_ulong allocs, frees;

/* The replacements are the process's allocator: they carry glibc's own names and contracts. */
void *malloc(size_t n);
void *calloc(size_t n, size_t size);
void *realloc(void *p, size_t n);
void free(void *p);
int posix_memalign(void **out, size_t align, size_t n);
void *aligned_alloc(size_t align, size_t n);
void *memalign(size_t align, size_t n);
void *valloc(size_t n);
void *pvalloc(size_t n);
int fflush(FILE *f);

void *malloc(size_t n)
{
    atomic_fetch_add(&allocs, 1);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    atomic_fetch_add(&allocs, 1);
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    atomic_fetch_add(&allocs, 1);
    return __libc_realloc(p, n);
}

void free(void *p)
{
    if (p)
        atomic_fetch_add(&frees, 1);
    __libc_free(p);
}

void *memalign(size_t align, size_t n)
{
    atomic_fetch_add(&allocs, 1);
    return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return 22; /* EINVAL */
    void *p = memalign(align, n);
    if (!p)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }

void *valloc(size_t n) { return memalign((size_t)sysconf(_SC_PAGESIZE), n); }

void *pvalloc(size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return memalign(page, (n + page - 1) / page * page);
}

/* The counts at each flush of the metrics log (every stream but stdout and stderr): one per
 * step. */
enum { MAX_STEPS = 64 };
static unsigned long at_allocs[MAX_STEPS], at_frees[MAX_STEPS];
static int flushes;

int fflush(FILE *f)
{
    if (f && f != stdout && f != stderr && flushes < MAX_STEPS) {
        at_allocs[flushes] = atomic_load(&allocs);
        at_frees[flushes] = atomic_load(&frees);
        flushes++;
    }
    return _IO_fflush(f);
}

static char dir[64];

static void check_run(const char *what, ModelSpec s, const char *data, int steps)
{
    char out[128], metrics[128];
    snprintf(out, sizeof out, "%s/run.json", dir);
    snprintf(metrics, sizeof metrics, "%s/run.metrics.jsonl", dir);
    PxError err = {0};
    ModelPlan plan;
    CHECK_OK(sim_plan_for(&s, "local", 1, &plan, &err), err);
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.steps = steps;
    opt.prefetch = 1; /* the loader thread, as parallax-worker runs */
    opt.data = data;
    opt.output = out;
    opt.metrics = metrics;
    Exec *ex = NULL;
    CHECK_OK(exec_init(&ex, &plan, &opt, &err), err);
    model_plan_free(&plan);
    flushes = 0;
    CHECK_OK(exec_run(ex, &err), err);
    exec_free(ex);
    CHECK_EQ_INT(steps, flushes);
    for (int k = 1; k < steps; k++) {
        if (at_allocs[k] != at_allocs[0] || at_frees[k] != at_frees[0]) {
            fprintf(stderr,
                    "%s: from the end of step 1 to the end of step %d: %lu allocations and %lu "
                    "frees (expected none)\n",
                    what, k + 1, at_allocs[k] - at_allocs[0], at_frees[k] - at_frees[0]);
            exit(1);
        }
    }
    unlink(out);
    unlink(metrics);
    printf("%s: %d steps, no allocation after step 1\n", what, steps);
}

int main(void)
{
    px_log_set_quiet(1);
    snprintf(dir, sizeof dir, "/tmp/test_exec_noalloc.XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    /* a text file, so that the loader thread reads with pread while the steps compute */
    char text[128];
    snprintf(text, sizeof text, "%s/text.txt", dir);
    FILE *f = fopen(text, "wb");
    CHECK(f != NULL);
    for (int i = 0; i < 20000; i++)
        fputc("the quick brown fox jumps over the lazy dog\n"[i % 44], f);
    CHECK(fclose(f) == 0);

    ModelSpec s = tx_spec("tiny", 16, 8, 2); /* four micro-batches */
    s.job.dropout = 0.1;
    s.job.flash_attn = 0;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    check_run("tiny, text file, unfused attention, dropout, selective recompute", s, text, 6);
    s = tx_spec("tiny-llama", 16, 4, 2);
    s.layout.recompute = MODEL_RECOMPUTE_FULL;
    s.layout.schedule = MODEL_SCHED_GPIPE;
    check_run("tiny-llama, built-in text, flash attention, full recompute, GPipe", s, NULL, 6);
    s = tx_spec("tiny", 16, 4, 1);
    s.job.optimizer = MODEL_OPT_SGD_MOMENTUM;
    s.layout.zero = 1;
    check_run("tiny, SGD with momentum, ZeRO-1", s, text, 6);
    /* adam-8bit (its dequantized block is scratch from exec_init) with torchtitan's op-level
     * selective recompute */
    s = tx_spec("tiny-llama", 16, 4, 1);
    s.job.optimizer = MODEL_OPT_ADAM_8BIT;
    s.job.framework = MODEL_FW_TORCHTITAN;
    s.layout.recompute = MODEL_RECOMPUTE_SELECTIVE;
    check_run("tiny-llama, adam-8bit, op-level selective recompute", s, text, 6);
    unlink(text);
    rmdir(dir);
    TEST_DONE("test_exec_noalloc");
}

#else

int main(void)
{
    printf("test_exec_noalloc: skipped (it replaces malloc: glibc only, no sanitizers)\n");
    return 77;
}

#endif
