/* Helpers for tests that run parallax's programs through the shell: a scratch folder `tmp`
 * (the test fills it, e.g. with mkdtemp), commands whose output goes to tmp/log, and the JSON
 * they write read back. Every failure prints what failed, keeps the folder and exits 1. */
#ifndef PX_TEST_RUNS_H
#define PX_TEST_RUNS_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/px.h"

static char tmp[256];

/* Makes tmp a fresh folder px-<what>-XXXXXX under $TMPDIR (else /tmp); 0, or -1 after saying
 * why on stderr. */
static inline int run_scratch(const char *what)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp, sizeof tmp, "%s/px-%s-XXXXXX", base && *base ? base : "/tmp", what);
    if (mkdtemp(tmp))
        return 0;
    fprintf(stderr, "cannot make a directory %s: %s\n", tmp, strerror(errno));
    return -1;
}

/* Removes tmp once a test has passed (a failure keeps it for a look). */
static inline void run_scratch_remove(const char *prog)
{
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp);
    if (system(rm) != 0)
        fprintf(stderr, "%s: could not remove %s\n", prog, tmp);
}

/* How a layout driver takes its worker (RUN_WORKER_NONE: it has none). */
enum { RUN_WORKER_NONE = 0, RUN_WORKER_AFTER, RUN_WORKER_BEFORE };

/* A layout driver's command line (the test_exec_*_mpi programs, one ctest per layout):
 * `PROG list` prints every layout's name, name_of(0 .. n - 1), and returns -1 (the driver exits
 * 0); else `PROG PARALLAX LAYOUT` (RUN_WORKER_AFTER: `... LAYOUT [WORKER]`; RUN_WORKER_BEFORE:
 * `PROG PARALLAX WORKER LAYOUT`) sets *px and *worker (NULL when not given; worker may be NULL
 * with RUN_WORKER_NONE) and returns the layout's index. A wrong command line or a layout not in
 * the list: a message naming it, and exit 2. */
static inline int run_layout_arg(const char *prog, int argc, char **argv, int n,
                                 const char *(*name_of)(int), int how, const char **px,
                                 const char **worker)
{
    static const char *const forms[] = {"LAYOUT", "LAYOUT [WORKER]", "WORKER LAYOUT"};
    if (argc == 2 && !strcmp(argv[1], "list")) {
        for (int i = 0; i < n; i++)
            printf("%s\n", name_of(i));
        return -1;
    }
    const int ok = how == RUN_WORKER_AFTER ? argc == 3 || argc == 4
                                           : argc == (how == RUN_WORKER_NONE ? 3 : 4);
    if (!ok) {
        fprintf(stderr, "usage: %s PARALLAX %s | list\n", prog, forms[how]);
        exit(2);
    }
    const char *name = argv[how == RUN_WORKER_BEFORE ? 3 : 2];
    *px = argv[1];
    if (worker)
        *worker = how == RUN_WORKER_BEFORE ? argv[2] : argc == 4 ? argv[3] : NULL;
    for (int i = 0; i < n; i++)
        if (!strcmp(name_of(i), name))
            return i;
    fprintf(stderr, "%s: no layout %s (see list)\n", prog, name);
    exit(2);
}

static inline int run_vsh(const char *fmt, va_list ap, char *cmd, size_t cap)
{
    char full[2400];
    vsnprintf(cmd, cap, fmt, ap);
    snprintf(full, sizeof full, "%s >%s/log 2>&1", cmd, tmp);
    int st = system(full);
    return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Runs a shell command, its output into tmp/log; returns its exit status (128 + the signal
 * when one ended it). */
static inline int run_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int run_sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    int code = run_vsh(fmt, ap, cmd, sizeof cmd);
    va_end(ap);
    return code;
}

/* `got` must be `want`; else the end of tmp/log is printed and the test fails. */
static inline void run_expect(int want, int got, const char *what)
{
    if (got == want)
        return;
    fprintf(stderr, "FAILED: %s\n  exit %d, expected %d (files kept in %s); output:\n", what, got,
            want, tmp);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "tail -c 3000 %s/log >&2", tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "  (no output)\n");
    exit(1);
}

/* Runs a shell command whose status must be `want`. */
static inline void sh(int want, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void sh(int want, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    int code = run_vsh(fmt, ap, cmd, sizeof cmd);
    va_end(ap);
    run_expect(want, code, cmd);
}

/* ---- single-rank references, run once per build ----
 * The layout drivers compare each layout with a single-rank run of the same job, and many
 * layouts share a job (test_exec_mpi's 107 layouts 67 jobs, test_exec_cuda_mpi's 53 tests 21):
 * run_ref keeps a reference's output files in $PX_TEST_REF_CACHE (the build's test-refs/, set
 * by the root CMakeLists.txt), under a key of everything that decides them: the command (tmp
 * read as one name), the plan's bytes, the programs' identity (size, modification time and
 * inode of the command's program and the workers beside it: a rebuild is a new key) and the
 * PX_* and PARALLAX_* variables. The first test of a job runs it; the others copy its files,
 * which hold the same bits (a single rank's run is deterministic). Unset, or with
 * PX_TEST_NO_REF_CACHE=1 (scripts/sanitize_set.py, which counts each test's own lines), every
 * test runs its reference. */

extern char **environ;

static inline uint64_t run_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The identity of the program at `path` (nothing when there is none). */
static inline uint64_t run_fnv_program(uint64_t h, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return run_fnv(h, "-", 1);
    const long long id[5] = {(long long)st.st_ino, (long long)st.st_size, (long long)st.st_dev,
                             (long long)st.st_mtim.tv_sec, (long long)st.st_mtim.tv_nsec};
    return run_fnv(h, id, sizeof id);
}

/* The file `path` as bytes into h; -1 when it cannot be read. */
static inline int run_fnv_file(uint64_t *h, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        *h = run_fnv(*h, buf, n);
    fclose(f);
    return 0;
}

/* Copies `from` to `to` (through to.PID and a rename when `atomic`); 0, or -1. */
static inline int run_copy(const char *from, const char *to, int atomic)
{
    char part[700];
    snprintf(part, sizeof part, atomic ? "%s.%ld" : "%s", to, (long)getpid());
    FILE *in = fopen(from, "rb"), *out = in ? fopen(part, "wb") : NULL;
    int ok = in && out;
    char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0)
        ok = fwrite(buf, 1, n, out) == n;
    if (in)
        fclose(in);
    if (out && fclose(out) != 0)
        ok = 0;
    if (ok && atomic && rename(part, to) != 0)
        ok = 0;
    if (!ok && out)
        remove(part);
    return ok ? 0 : -1;
}

/* The key of a reference: the command (tmp as "@"), tmp/plan's bytes, the programs, the
 * environment's PX_* and PARALLAX_* variables but PX_CUDA_EMU_DEVICES (how many emulated GPUs
 * the process sees: a single rank computes on its first alike) and the cache's own. */
static inline uint64_t run_ref_key(const char *cmd, const char *plan)
{
    uint64_t h = 14695981039346656037ull;
    const size_t nt = strlen(tmp);
    for (const char *c = cmd; *c;) {
        if (!strncmp(c, tmp, nt)) {
            h = run_fnv(h, "@", 1);
            c += nt;
        } else {
            h = run_fnv(h, c++, 1);
        }
    }
    char path[600];
    snprintf(path, sizeof path, "%s/%s", tmp, plan);
    if (run_fnv_file(&h, path) != 0)
        return 0;
    char prog[512];
    const size_t np = strcspn(cmd, " ");
    snprintf(prog, sizeof prog, "%.*s", (int)(np < sizeof prog - 32 ? np : sizeof prog - 32), cmd);
    h = run_fnv_program(h, prog);
    char *slash = strrchr(prog, '/');
    const char *workers[] = {"parallax-worker", "parallax-worker-emu"};
    for (int i = 0; slash && i < 2; i++) {
        snprintf(slash + 1, sizeof prog - (size_t)(slash + 1 - prog), "%s", workers[i]);
        h = run_fnv_program(h, prog);
    }
    for (char **e = environ; *e; e++)
        if ((!strncmp(*e, "PX_", 3) || !strncmp(*e, "PARALLAX_", 9)) &&
            strncmp(*e, "PX_CUDA_EMU_DEVICES=", 20) && strncmp(*e, "PX_TEST_REF_CACHE=", 18))
            h = run_fnv(h, *e, strlen(*e) + 1);
    return h;
}

/* Runs the single-rank reference command (status 0) that reads tmp/plan and writes the files
 * `outs` (NULL-terminated) into tmp, or copies them from an earlier run of the same key. */
static inline void run_ref(const char *plan, const char *const *outs, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void run_ref(const char *plan, const char *const *outs, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    const char *dir = getenv("PX_TEST_REF_CACHE"), *off = getenv("PX_TEST_NO_REF_CACHE");
    const uint64_t key = dir && *dir && !(off && !strcmp(off, "1")) ? run_ref_key(cmd, plan) : 0;
    char from[700], to[700];
    int have = key != 0;
    for (int i = 0; have && outs[i]; i++) {
        snprintf(from, sizeof from, "%s/%016llx.%s", dir, (unsigned long long)key, outs[i]);
        snprintf(to, sizeof to, "%s/%s", tmp, outs[i]);
        have = run_copy(from, to, 0) == 0;
    }
    if (have) {
        printf("single-rank reference: the files of an earlier run of this build (%s/%016llx.*)\n",
               dir, (unsigned long long)key);
        return;
    }
    sh(0, "%s", cmd);
    if (!key || (mkdir(dir, 0777) != 0 && errno != EEXIST))
        return;
    for (int i = 0; outs[i]; i++) {
        snprintf(from, sizeof from, "%s/%s", tmp, outs[i]);
        snprintf(to, sizeof to, "%s/%016llx.%s", dir, (unsigned long long)key, outs[i]);
        if (run_copy(from, to, 1) != 0)
            fprintf(stderr, "note: could not keep %s as %s\n", from, to);
    }
}

/* tmp/name as JSON. */
static inline cJSON *read_json(const char *name)
{
    char path[400];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    PxError err = {0};
    cJSON *j = px_json_read_file(path, &err);
    if (!j) {
        fprintf(stderr, "FAILED: %s\n", err.msg);
        exit(1);
    }
    return j;
}

/* o.a, or o.a.b */
static inline const cJSON *at(const cJSON *o, const char *a, const char *b)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    return b ? cJSON_GetObjectItemCaseSensitive(x, b) : x;
}

/* The number o.k, which must be there. */
static inline double num(const cJSON *o, const char *k)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x)) {
        fprintf(stderr, "FAILED: no number %s\n", k);
        exit(1);
    }
    return x->valuedouble;
}

/* The entry of `arr` whose "stage" is `stage`, which must be there. */
static inline const cJSON *stage_entry(const cJSON *arr, int stage)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) if ((int)num(e, "stage") == stage) return e;
    fprintf(stderr, "FAILED: no prediction for stage %d\n", stage);
    exit(1);
}

/* Optimizer offload (docs/memory.md): when the plan's stage entry `pm` has a host column, rank
 * r's measured memory `m` holds the same bytes per category in host memory and run.json's
 * offload block counts a host update every step. Returns the host column, or NULL. */
static inline const cJSON *run_check_host(const char *name, int r, const cJSON *pm,
                                          const cJSON *m, const cJSON *run, int steps)
{
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(pm, "host");
    if (!ph)
        return NULL;
    const cJSON *mh = at(m, "host", NULL), *e;
    cJSON_ArrayForEach(e, ph)
    {
        if ((uint64_t)e->valuedouble != (uint64_t)num(mh, e->string)) {
            fprintf(stderr, "FAILED: %s rank %d host %s: predicted %.0f, measured %.0f\n", name, r,
                    e->string, e->valuedouble, num(mh, e->string));
            exit(1);
        }
    }
    const cJSON *of = cJSON_GetArrayItem(at(run, "offload", "per_rank"), r);
    CHECK_EQ_INT(steps, (int)num(of, "host_updates"));
    return ph;
}

#endif
