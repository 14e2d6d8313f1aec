/* Status, logging, dtypes, files and strict number parsing. */
#include "common/px.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int px_quiet;

int px_fail(PxError *err, int status, const char *fmt, ...)
{
    if (err) {
        if (!err->code_only) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err->msg, sizeof err->msg, fmt, ap);
            va_end(ap);
            /* messages echo what the user gave (names, keys, paths): a control character there
             * would reach the terminal raw, so each one prints as '?' */
            for (unsigned char *c = (unsigned char *)err->msg; *c; c++)
                if (*c < 0x20 || *c == 0x7f)
                    *c = '?';
        }
        err->code = 0;
    }
    return status;
}

int px_log_set_quiet(int quiet)
{
    const int was = px_quiet;
    px_quiet = quiet;
    return was;
}

void px_warn(const char *fmt, ...)
{
    if (px_quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("parallax: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void px_info(const char *fmt, ...)
{
    if (px_quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("parallax: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const char *const px_dtype_names[PX_DTYPE_COUNT] = {"fp32", "bf16", "fp16", "fp8", "int32",
                                                          "uint8"};
static const size_t px_dtype_sizes[PX_DTYPE_COUNT] = {4, 2, 2, 1, 4, 1};

size_t px_dtype_bytes(PxDtype t) { return (unsigned)t < PX_DTYPE_COUNT ? px_dtype_sizes[t] : 0; }

const char *px_dtype_name(PxDtype t)
{
    return (unsigned)t < PX_DTYPE_COUNT ? px_dtype_names[t] : "?";
}

int px_dtype_from_name(const char *s)
{
    for (int i = 0; i < PX_DTYPE_COUNT; i++)
        if (s && strcmp(s, px_dtype_names[i]) == 0)
            return i;
    return -1;
}

char *px_read_file(const char *path, size_t *len, PxError *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        px_fail(err, PX_EINPUT, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        px_fail(err, PX_EINPUT, "%s: not a regular file", path);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        px_fail(err, PX_ERUNTIME, "%s: out of memory reading %zu bytes", path, cap);
        return NULL;
    }
    n = fread(buf, 1, cap - 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        px_fail(err, PX_ERUNTIME, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* The temporary beside path: "<path>.tmp.<pid>". */
static void tmp_name(char *tmp, size_t cap, const char *path)
{
    snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
}

/* Syncs and closes fd (the temporary tmp) and renames it over path; on failure removes tmp. */
static int tmp_commit(int fd, const char *tmp, const char *path, PxError *err)
{
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return px_fail(err, PX_ERUNTIME, "%s: cannot finish writing: %s", path, strerror(e));
    }
    return PX_OK;
}

int px_atomic_open(PxAtomicFile *a, const char *path, PxError *err)
{
    memset(a, 0, sizeof *a);
    if (strlen(path) >= sizeof a->path)
        return px_fail(err, PX_EINPUT, "%s: path too long", path);
    px_strlcpy(a->path, path, sizeof a->path);
    tmp_name(a->tmp, sizeof a->tmp, path);
    if (!(a->f = fopen(a->tmp, "wb"))) {
        int e = errno;
        a->tmp[0] = '\0';
        return px_fail(err, PX_EINPUT, "%s: cannot write: %s", path, strerror(e));
    }
    return PX_OK;
}

int px_atomic_commit(PxAtomicFile *a, PxError *err)
{
    if (!a || !a->f)
        return PX_OK;
    FILE *f = a->f;
    a->f = NULL;
    if (fflush(f) != 0 || ferror(f)) {
        int e = errno;
        fclose(f);
        unlink(a->tmp);
        return px_fail(err, PX_ERUNTIME, "%s: write failed: %s", a->path, strerror(e));
    }
    /* the stream's descriptor is synced and closed by tmp_commit; the FILE's own buffer is
     * empty, so dropping it loses nothing */
    int fd = dup(fileno(f));
    fclose(f);
    if (fd < 0) {
        int e = errno;
        unlink(a->tmp);
        return px_fail(err, PX_ERUNTIME, "%s: cannot finish writing: %s", a->path, strerror(e));
    }
    return tmp_commit(fd, a->tmp, a->path, err);
}

void px_atomic_abort(PxAtomicFile *a)
{
    if (!a || !a->f)
        return;
    fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
}

int px_write_file_atomic(const char *path, const char *text, PxError *err)
{
    char tmp[1100];
    if (strlen(path) + 32 > sizeof tmp)
        return px_fail(err, PX_ERUNTIME, "%s: path too long", path);
    tmp_name(tmp, sizeof tmp, path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return px_fail(err, PX_ERUNTIME, "%s: cannot write: %s", path, strerror(errno));
    size_t left = strlen(text);
    const char *p = text;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return px_fail(err, PX_ERUNTIME, "%s: write failed: %s", path, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    return tmp_commit(fd, tmp, path, err);
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int px_mkdir_p(const char *path, PxError *err)
{
    char p[1024];
    if (!path || !*path)
        return px_fail(err, PX_EINPUT, "an empty directory name");
    if (strlen(path) >= sizeof p)
        return px_fail(err, PX_EINPUT, "%s: path too long", path);
    px_strlcpy(p, path, sizeof p);
    int e = 0;
    for (char *c = p + 1; *c && !e; c++) {
        if (*c != '/')
            continue;
        *c = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            e = errno;
        *c = '/';
    }
    if (!e && mkdir(p, 0755) != 0 && (errno != EEXIST || !is_dir(p)))
        e = errno == EEXIST ? ENOTDIR : errno;
    if (!e)
        return PX_OK;
    px_fail(err, PX_EINPUT, "%s: cannot create the directory: %s", path, strerror(e));
    errno = e; /* for callers that word the message themselves */
    return PX_EINPUT;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double px_median(const double *v, int n)
{
    if (n <= 0)
        return 0;
    double *t = malloc((size_t)n * sizeof *t);
    if (!t)
        return v[0];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

uint64_t px_mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

double px_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double px_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *px_basename(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int px_path_exists(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0;
}

int px_file_exists(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int px_parse_int(const char *s, const char *what, long long lo, long long hi, int *out,
                 PxError *err)
{
    if (!s || !*s)
        return px_fail(err, PX_EINPUT, "%s: expected an integer, got nothing", what);
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end != '\0')
        return px_fail(err, PX_EINPUT, "%s: expected an integer, got '%s'", what, s);
    if (v < lo || v > hi)
        return px_fail(err, PX_EINPUT, "%s: must be between %lld and %lld, got %lld", what, lo, hi,
                       v);
    *out = (int)v;
    return PX_OK;
}

int px_parse_double(const char *s, const char *what, double *out, PxError *err)
{
    if (!s || !*s)
        return px_fail(err, PX_EINPUT, "%s: expected a number, got nothing", what);
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end != '\0' || !isfinite(v))
        return px_fail(err, PX_EINPUT, "%s: expected a number, got '%s'", what, s);
    *out = v;
    return PX_OK;
}

void px_strlcpy(char *dst, const char *src, size_t cap)
{
    if (cap == 0)
        return;
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

const char *px_fmt_count(char *buf, size_t cap, double n)
{
    static const char *const suffix[] = {"", " K", " M", " B", " T"};
    int i = 0;
    double v = n;
    while (fabs(v) >= 1000.0 && i < 4) {
        v /= 1000.0;
        i++;
    }
    if (i == 0)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.*f%s", fabs(v) < 10 ? 2 : 1, v, suffix[i]);
    return buf;
}
