/* common/'s helpers that every program leans on: the option loop (options, help, bad values,
 * operands between options, too many operands), mkdir -p, the atomic file, the median and the
 * splitmix64 finalizer. */
#include "common/px.h"
#include "test.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

enum { T_STEPS, T_QUIET, T_OUT };

static const PxOption test_options[] = {{"steps", 1, "N", "steps", T_STEPS, 0},
                                        {"quiet", 0, NULL, "no progress", T_QUIET, 'q'},
                                        {"output", 1, "FILE", "where", T_OUT, 'o'},
                                        {NULL, 0, NULL, NULL, 0, 0}};

typedef struct {
    int steps, quiet, calls;
    const char *out;
} Seen;

static int on_option(void *ctx, int id, const char *arg, PxError *err)
{
    Seen *s = ctx;
    s->calls++;
    switch (id) {
    case T_STEPS: return px_parse_int(arg, "--steps", 1, 100, &s->steps, err);
    case T_QUIET: s->quiet = 1; break;
    case T_OUT: s->out = arg; break;
    default: break;
    }
    return PX_OK;
}

/* Parses the words of line (at most 15, split at spaces) as argv after a program name. */
static int parse(const char *line, int max_operands, Seen *s, int *first, char ***argv_out,
                 PxError *err)
{
    static char buf[256];
    static char *argv[16];
    snprintf(buf, sizeof buf, "%s", line);
    int argc = 0;
    argv[argc++] = "prog";
    for (char *w = strtok(buf, " "); w && argc < 15; w = strtok(NULL, " "))
        argv[argc++] = w;
    argv[argc] = NULL;
    memset(s, 0, sizeof *s);
    memset(err, 0, sizeof *err);
    const PxOption *const tables[] = {test_options, NULL};
    *argv_out = argv;
    int rc = px_opts_parse(tables, argc, argv, "(see --help)", on_option, s, max_operands, first,
                           err);
    return rc;
}

static void test_opts_parse(void)
{
    Seen s;
    PxError err;
    int first;
    char **argv;
    /* options and operands mixed: getopt_long moves the operands to the end */
    CHECK_EQ_INT(PX_OK, parse("a --steps 7 b -q -o f.json", 2, &s, &first, &argv, &err));
    CHECK_EQ_INT(7, s.steps);
    CHECK_EQ_INT(1, s.quiet);
    CHECK_STR("f.json", s.out);
    CHECK_EQ_INT(3, s.calls);
    CHECK_EQ_INT(6, first);
    CHECK_STR("a", argv[first]);
    CHECK_STR("b", argv[first + 1]);
    /* -h and --help stop at once, whatever else is there */
    CHECK_EQ_INT(PX_OPTS_HELP, parse("--steps 3 --help --bogus", 0, &s, &first, &argv, &err));
    CHECK_EQ_INT(PX_OPTS_HELP, parse("-h", 0, &s, &first, &argv, &err));
    /* a bad value: the callback's message, and no later option is looked at */
    CHECK_EQ_INT(PX_EINPUT, parse("--steps 0 -q", 0, &s, &first, &argv, &err));
    CHECK_STR("--steps: must be between 1 and 100, got 0", err.msg);
    CHECK_EQ_INT(0, s.quiet);
    CHECK_EQ_INT(PX_EINPUT, parse("--bogus", 0, &s, &first, &argv, &err));
    CHECK_STR("unknown option '--bogus' (see --help)", err.msg);
    CHECK_EQ_INT(PX_EINPUT, parse("--steps", 0, &s, &first, &argv, &err));
    CHECK_STR("option '--steps' needs a value", err.msg);
    /* one operand too many names the first extra one; -1 takes any number */
    CHECK_EQ_INT(PX_EINPUT, parse("a b c", 1, &s, &first, &argv, &err));
    CHECK_STR("unexpected argument 'b' (see --help)", err.msg);
    CHECK_EQ_INT(PX_EINPUT, parse("a", 0, &s, &first, &argv, &err));
    CHECK_STR("unexpected argument 'a' (see --help)", err.msg);
    CHECK_EQ_INT(PX_OK, parse("a b c d", -1, &s, &first, &argv, &err));
    CHECK_EQ_INT(1, first);
    /* "--" ends the options: what follows is an operand even when it looks like one */
    CHECK_EQ_INT(PX_OK, parse("-- --steps", 1, &s, &first, &argv, &err));
    CHECK_EQ_INT(0, s.calls);
    CHECK_STR("--steps", argv[first]);
    /* no callback for a program without options of its own */
    const PxOption none[] = {{NULL, 0, NULL, NULL, 0, 0}};
    const PxOption *const tables[] = {none, NULL};
    char *args[] = {"prog", "x", NULL};
    CHECK_EQ_INT(PX_OK, px_opts_parse(tables, 2, args, NULL, NULL, NULL, 1, &first, &err));
    CHECK_EQ_INT(1, first);
}

static void test_mkdir_p(void)
{
    char root[] = "/tmp/px_test_common_XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char deep[256], file[256];
    snprintf(deep, sizeof deep, "%s/a/b/c", root);
    PxError err = {0};
    CHECK_EQ_INT(PX_OK, px_mkdir_p(deep, &err));
    struct stat st;
    CHECK(stat(deep, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ_INT(PX_OK, px_mkdir_p(deep, &err)); /* already there */
    /* a file in the way names the path and leaves ENOTDIR */
    snprintf(file, sizeof file, "%s/a/f", root);
    CHECK_EQ_INT(PX_OK, px_write_file_atomic(file, "x", &err));
    snprintf(deep, sizeof deep, "%s/a/f/g", root);
    CHECK_EQ_INT(PX_EINPUT, px_mkdir_p(deep, &err));
    CHECK_EQ_INT(ENOTDIR, errno);
    CHECK(strstr(err.msg, "/a/f") != NULL);

    /* the atomic file: nothing at path until commit; abort leaves nothing behind */
    PxAtomicFile a;
    snprintf(file, sizeof file, "%s/out.txt", root);
    CHECK_EQ_INT(PX_OK, px_atomic_open(&a, file, &err));
    fputs("hello\n", a.f);
    CHECK(!px_path_exists(file));
    CHECK_EQ_INT(PX_OK, px_atomic_commit(&a, &err));
    size_t len = 0;
    char *text = px_read_file(file, &len, &err);
    CHECK(text != NULL);
    CHECK_STR("hello\n", text);
    free(text);
    char other[256];
    snprintf(other, sizeof other, "%s/gone.txt", root);
    CHECK_EQ_INT(PX_OK, px_atomic_open(&a, other, &err));
    char tmp[sizeof a.tmp];
    memcpy(tmp, a.tmp, sizeof tmp);
    fputs("lost\n", a.f);
    px_atomic_abort(&a);
    CHECK(!px_path_exists(other));
    CHECK(!px_path_exists(tmp));

    unlink(file);
    snprintf(file, sizeof file, "%s/a/f", root);
    unlink(file);
    snprintf(deep, sizeof deep, "%s/a/b/c", root);
    rmdir(deep);
    snprintf(deep, sizeof deep, "%s/a/b", root);
    rmdir(deep);
    snprintf(deep, sizeof deep, "%s/a", root);
    rmdir(deep);
    CHECK(rmdir(root) == 0); /* nothing else was left in it */
}

static void test_median_mix(void)
{
    const double odd[] = {5, 1, 3}, even[] = {4, 1, 3, 2};
    CHECK(px_median(odd, 3) == 3.0);
    CHECK(px_median(even, 4) == 2.5);
    CHECK(px_median(odd, 0) == 0.0);
    CHECK(odd[0] == 5 && odd[1] == 1); /* unchanged */
    /* splitmix64 from seed 0: its first output is the finalizer of the golden-ratio increment,
     * 0xe220a8397b1dcdaf (Steele et al. 2014's reference generator) */
    CHECK_EQ_U64(0xe220a8397b1dcdafull, px_mix64(0));
    CHECK_EQ_U64(0x6e789e6aa1b965f4ull, px_mix64(0x9E3779B97F4A7C15ull));
}

/* FP8 by hand (OCP FP8 spec). E4M3 = s eeee mmm, bias 7; E5M2 = s eeeee mm, bias 15.
 *   1.0:    E4M3 0 0111 000 = 0x38;   E5M2 0 01111 00 = 0x3c
 *   0.1 = 1.6 x 2^-4: E4M3 mantissa 0.6 x 8 = 4.8 -> 5: 0 0011 101 = 0x1d = 1.625/16 = 0.1015625;
 *                     E5M2 0.6 x 4 = 2.4 -> 2: 0 01011 10 = 0x2e = 1.5/16 = 0.09375
 *   ties to even: 1 + 1/16 lies between 1 (m 0) and 1.125 (m 1) -> 0x38; 1 + 3/16 -> m 2, 0x3a
 *   largest: E4M3 0 1111 110 = 0x7e = 1.75 x 2^8 = 448 (1111 111 is NaN); E5M2 0 11110 11 = 0x7b
 *     = 1.75 x 2^15 = 57344; beyond, and infinity, saturate to them
 *   subnormals: E4M3 0x01 = 2^-9, 0x07 = 7 x 2^-9; half of 2^-9 ties to 0, 1.5 x 2^-9 to 2 (0x02);
 *     7.5 x 2^-9 ties to 8 = 0x08, the smallest normal 2^-6; E5M2 0x01 = 2^-16 */
static void test_fp8(void)
{
    CHECK(px_float_to_e4m3(1.0f) == 0x38);
    CHECK(px_float_to_e5m2(1.0f) == 0x3c);
    CHECK(px_float_to_e4m3(0.1f) == 0x1d);
    CHECK(px_e4m3_to_float(0x1d) == 0.1015625f);
    CHECK(px_float_to_e5m2(0.1f) == 0x2e);
    CHECK(px_e5m2_to_float(0x2e) == 0.09375f);
    CHECK(px_float_to_e4m3(1.0625f) == 0x38);
    CHECK(px_float_to_e4m3(1.1875f) == 0x3a);
    CHECK(px_float_to_e4m3(-1.1875f) == 0xba);
    CHECK(px_float_to_e4m3(448.0f) == 0x7e);
    CHECK(px_e4m3_to_float(0x7e) == 448.0f);
    CHECK(px_float_to_e4m3(470.0f) == 0x7e);
    CHECK(px_float_to_e4m3(1e9f) == 0x7e);
    CHECK(px_float_to_e4m3(-INFINITY) == 0xfe);
    CHECK(px_float_to_e5m2(57344.0f) == 0x7b);
    CHECK(px_e5m2_to_float(0x7b) == 57344.0f);
    CHECK(px_float_to_e5m2(INFINITY) == 0x7b);
    CHECK(px_float_to_e5m2(-1e6f) == 0xfb);
    CHECK(px_float_to_e4m3(NAN) == 0x7f);
    CHECK(isnan(px_e4m3_to_float(0x7f)) && isnan(px_e4m3_to_float(0xff)));
    CHECK(px_float_to_e5m2(NAN) == 0x7f);
    CHECK(isnan(px_e5m2_to_float(0x7d)));
    CHECK(isinf(px_e5m2_to_float(0x7c)) && px_e5m2_to_float(0xfc) < 0);
    CHECK(px_float_to_e4m3(0.0f) == 0x00 && px_float_to_e4m3(-0.0f) == 0x80);
    CHECK(px_float_to_e4m3(ldexpf(1, -9)) == 0x01);
    CHECK(px_e4m3_to_float(0x07) == ldexpf(7, -9));
    CHECK(px_float_to_e4m3(ldexpf(1, -10)) == 0x00);
    CHECK(px_float_to_e4m3(ldexpf(3, -10)) == 0x02);
    CHECK(px_float_to_e4m3(ldexpf(15, -10)) == 0x08);
    CHECK(px_e4m3_to_float(0x08) == ldexpf(1, -6));
    CHECK(px_float_to_e5m2(ldexpf(1, -16)) == 0x01);
    /* every finite code decodes and encodes back to itself */
    for (int q = 0; q < 256; q++) {
        float v4 = px_e4m3_to_float((uint8_t)q), v5 = px_e5m2_to_float((uint8_t)q);
        if (!isnan(v4))
            CHECK(px_float_to_e4m3(v4) == q);
        if (isfinite(v5))
            CHECK(px_float_to_e5m2(v5) == q);
    }
}

int main(void)
{
    px_log_set_quiet(1);
    test_opts_parse();
    test_mkdir_p();
    test_median_mix();
    test_fp8();
    TEST_DONE("common");
}
