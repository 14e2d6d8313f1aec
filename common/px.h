/* px — the common layer of parallax: status codes and error messages, logging, data types,
 * JSON helpers on cJSON (typed getters that name the key path in their errors), whole-file
 * I/O with atomic writes and `mkdir -p`, a monotonic clock, strict number parsing for
 * command-line values, and option tables from which every program's getopt_long table and
 * --help are generated.
 *
 * Every library function that can fail returns an int status (PX_OK, PX_EINPUT for bad input
 * the user can fix, PX_ERUNTIME for everything else) and fills a PxError with one line naming
 * the input at fault; only cli/ and the worker's main turn a status into an exit code.
 *
 * Example:
 *   PxError err = {0};
 *   cJSON *root = px_json_read_file("model.json", &err);
 *   int layers = 0;
 *   if (!root || px_json_int(root, "model.json:", "layers", 1, 1, 100000, &layers, &err))
 *       fprintf(stderr, "parallax: %s\n", err.msg);   // "model.json: layers: expected ..."
 */
#ifndef PX_H
#define PX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#ifdef __cplusplus
extern "C" { /* included by kernels/cuda, which nvcc compiles as C++ */
#endif

enum { PX_OK = 0, PX_ERUNTIME = 1, PX_EINPUT = 2 };

typedef struct {
    char msg[1024];
    int code;      /* optional detail for callers that act on the kind of error (0: none) */
    int code_only; /* set by a caller that counts failures: code is filled, msg left alone */
} PxError;

/* Fills err->msg (printf-style, one line: control characters print as '?') and returns status,
 * so callers write `return px_fail(...)`. */
int px_fail(PxError *err, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Logging to stderr. Warnings can be silenced (tests, or a reader whose file another process
 * reads and warns about too) with px_log_set_quiet(1), which returns the setting it replaced. */
void px_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void px_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int px_log_set_quiet(int quiet);

/* Element types of tensors. Enums only grow at the end. */
typedef enum {
    PX_FP32 = 0,
    PX_BF16,
    PX_FP16,
    PX_FP8,
    PX_INT32,
    PX_UINT8,
    PX_DTYPE_COUNT
} PxDtype;

size_t px_dtype_bytes(PxDtype t);
const char *px_dtype_name(PxDtype t);
/* Parses "fp32", "bf16", ...; returns -1 when unknown. */
int px_dtype_from_name(const char *s);

/* 16-bit floats on the host (half.c): to fp32 exactly; from fp32 to nearest, ties to even, as
 * the CUDA intrinsics round. */
float px_bf16_to_float(uint16_t h);
uint16_t px_float_to_bf16(float f);
float px_half_to_float(uint16_t h);
uint16_t px_float_to_half(float f);

/* 8-bit floats of the OCP FP8 formats (OCP 8-bit Floating Point Specification, 2023) on the host:
 * E4M3 (bias 7, no infinities, NaN S.1111.111, largest 448) and E5M2 (bias 15, IEEE-like, largest
 * 57344). To fp32 exactly; from fp32 to nearest, ties to even, saturating (NVIDIA's .satfinite,
 * as FP8 training casts): values beyond the largest, infinities included, become the largest of
 * their sign; NaN stays NaN (0x7f / 0xff). */
float px_e4m3_to_float(uint8_t q);
uint8_t px_float_to_e4m3(float f);
float px_e5m2_to_float(uint8_t q);
uint8_t px_float_to_e5m2(float f);

/* A file compiled into a binary (model zoo, built-in profiles): name is the file's stem. */
typedef struct {
    const char *name;
    const char *text;
} PxEmbedded;

/* ---- files ---- */

/* Reads a whole file, NUL-terminated; *len (optional) gets its size. NULL and err on failure. */
char *px_read_file(const char *path, size_t *len, PxError *err);
/* Writes text to path through a temporary file, fsync and rename: readers never see half a file. */
int px_write_file_atomic(const char *path, const char *text, PxError *err);
/* A file written the same way by stream: px_atomic_open gives a->f, a temporary beside path;
 * px_atomic_commit flushes, syncs and renames it over path (on failure it removes the
 * temporary, path untouched, and names the error); px_atomic_abort removes it. Each takes a
 * NULL or already finished a. */
typedef struct {
    FILE *f;
    char path[1024];
    char tmp[1056];
} PxAtomicFile;
int px_atomic_open(PxAtomicFile *a, const char *path, PxError *err);
int px_atomic_commit(PxAtomicFile *a, PxError *err);
void px_atomic_abort(PxAtomicFile *a);
/* Creates a directory and its missing parents (mode 0755), as `mkdir -p`: PX_OK when it exists
 * already; PX_EINPUT naming the path that cannot be made, with errno set (ENOTDIR where a file
 * stands in the way). */
int px_mkdir_p(const char *path, PxError *err);
/* The last path component, without directories. */
const char *px_basename(const char *path);
int px_file_exists(const char *path); /* a regular file */
int px_path_exists(const char *path);  /* anything */

/* ---- JSON ---- */

/* Parses text; on error the message names origin, line and column. Caller owns the result. */
cJSON *px_json_parse(const char *text, const char *origin, PxError *err);
cJSON *px_json_read_file(const char *path, PxError *err);
/* Pretty-prints j to path atomically. */
int px_json_write_file(const char *path, const cJSON *j, PxError *err);

/* Typed getters. `where` names the object for messages: "model.json:" for a file's top level,
 * "dgx-a100.json: device" for a nested object; the key is appended ("... device.memory_bytes").
 * A missing key is an error only when required; otherwise *out keeps its value (the default).
 * Values outside [lo, hi] and wrong types are PX_EINPUT. */
int px_json_int(const cJSON *obj, const char *where, const char *key, int required, long long lo,
                long long hi, int *out, PxError *err);
int px_json_u64(const cJSON *obj, const char *where, const char *key, int required,
                uint64_t *out, PxError *err);
int px_json_double(const cJSON *obj, const char *where, const char *key, int required, double lo,
                   double hi, double *out, PxError *err);
int px_json_bool(const cJSON *obj, const char *where, const char *key, int required, int *out,
                 PxError *err);
int px_json_string(const cJSON *obj, const char *where, const char *key, int required, char *out,
                   size_t cap, PxError *err);
/* A string that must be one of names[0..count); *out gets its index. */
int px_json_enum(const cJSON *obj, const char *where, const char *key, int required,
                 const char *const *names, int count, int *out, PxError *err);
/* A nested object: *out is NULL when absent and not required. */
int px_json_object(const cJSON *obj, const char *where, const char *key, int required,
                   const cJSON **out, PxError *err);
/* Warns once per key of obj that is not in the NULL-terminated list known. */
void px_json_warn_unknown(const cJSON *obj, const char *where, const char *const *known);
/* Writes "where.key" (or "where key" after a colon) into buf. */
void px_json_path(char *buf, size_t cap, const char *where, const char *key);
/* Sets the number at a dotted path ("network.bandwidth_per_device") inside root, which must
 * already exist there as a number, from text. PX_EINPUT names the path when it does not. */
int px_json_set_path(cJSON *root, const char *dotted, const char *text, PxError *err);

/* ---- statistics ---- */

/* The median of v[0..n) (v unchanged; the mean of the middle two when n is even); 0 for n 0,
 * and the first element when out of memory. */
double px_median(const double *v, int n);

/* ---- counters that look random ---- */

/* splitmix64's finalizer (Steele et al. 2014): a bijection that scatters nearby counters, the
 * root of every layout-independent stream (weights, data windows, dropout masks). */
uint64_t px_mix64(uint64_t x);

/* ---- time ---- */

/* Seconds on the monotonic clock (an arbitrary origin): for intervals, never for dates. */
double px_now_s(void);
/* CPU seconds this process has used (all its threads). */
double px_cpu_s(void);

/* ---- option tables ----
 * Each program lists its options once; getopt_long's table and --help come from that list.
 *   static const PxOption opts[] = {{"steps", 1, "N", "training steps", OPT_STEPS, 0},
 *                                   {"output", 1, "FILE", "run.json to write", OPT_OUT, 'o'},
 *                                   {NULL, 0, NULL, NULL, 0, 0}};
 *   const PxOption *const tables[] = {opts, NULL};
 *   static int on_option(void *ctx, int id, const char *arg, PxError *err)
 *   {
 *       Args *a = ctx;
 *       if (id == OPT_STEPS)
 *           return px_parse_int(arg, "--steps", 1, 1000000, &a->steps, err);
 *       a->out = arg; // OPT_OUT
 *       return PX_OK;
 *   }
 *   int first;
 *   int rc = px_opts_parse(tables, argc, argv, "(see --help)", on_option, &a, 1, &first, &err);
 *   if (rc == PX_OPTS_HELP)
 *       px_opts_help(stdout, "prog [options] [FILE]", tables);
 *   else if (rc)
 *       fprintf(stderr, "prog: %s\n", err.msg);
 * Operands may stand between the options (getopt_long moves them to the end): argv[first] is
 * the first one. */
typedef struct {
    const char *name; /* long option without dashes; NULL ends a table */
    int has_arg;      /* 0 or 1 */
    const char *arg;  /* metavariable shown in --help */
    const char *help; /* one line */
    int id;           /* what the PxOptFn is given for it (>= 0) */
    char short_name;  /* 'o' for -o; 0: none */
} PxOption;

/* px_opts_parse's status for -h or --help; apart from PX_OK, PX_ERUNTIME and PX_EINPUT. */
enum { PX_OPTS_HELP = -2 };
/* "usage: <usage>", a blank line, then "options:" and one aligned line per option of the
 * tables (short form first where there is one), and -h, --help last. */
void px_opts_help(FILE *f, const char *usage, const PxOption *const *tables);
/* What a program does with one of its options: PX_OK, or a status with err set (a bad value). */
typedef int (*PxOptFn)(void *ctx, int id, const char *arg, PxError *err);
/* The whole loop: every option of argv goes to on(ctx, ...) (on may be NULL when the tables
 * are empty), then at most max_operands operands may follow (-1: any number). Returns PX_OK
 * with *first the index of the first operand; PX_OPTS_HELP for -h or --help (nothing printed:
 * the caller prints its help); else a status with err set: PX_EINPUT for an unknown option, a
 * missing or bad value or one operand too many (`see` closes those messages). */
int px_opts_parse(const PxOption *const *tables, int argc, char **argv, const char *see,
                  PxOptFn on, void *ctx, int max_operands, int *first, PxError *err);

/* ---- strict parsing of command-line values ---- */

/* Whole-string integer/double parsing: "12x" and "" are errors naming `what`. */
int px_parse_int(const char *s, const char *what, long long lo, long long hi, int *out,
                 PxError *err);
int px_parse_double(const char *s, const char *what, double *out, PxError *err);
/* Copies at most cap-1 bytes and always terminates. */
void px_strlcpy(char *dst, const char *src, size_t cap);

/* ---- units ---- */

#define PX_GIB (1024.0 * 1024.0 * 1024.0)
#define PX_GB 1e9

/* Round n up to a multiple of m (m > 0). */
static inline uint64_t px_round_up(uint64_t n, uint64_t m) { return (n + m - 1) / m * m; }
static inline uint64_t px_ceil_div(uint64_t n, uint64_t m) { return (n + m - 1) / m; }

/* Formats a count with an SI suffix ("174.6 B", "85.0 M") into buf. */
const char *px_fmt_count(char *buf, size_t cap, double n);

#ifdef __cplusplus
}
#endif

#endif
