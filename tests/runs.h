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

#endif
