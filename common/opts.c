/* Option tables: getopt_long's table and --help generated from one list per program. */
#include "common/px.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

/* What opts_next returns besides an option's id (ids are >= 0; PX_OPTS_HELP is public). */
enum { OPTS_END = -1, OPTS_BAD = -3 };

typedef struct {
    struct option *lo;         /* getopt_long's table: every option, then help */
    const PxOption **by_index; /* lo[i]'s entry */
    char shorts[80];           /* ":h" and every short option ("o:") */
} Opts;

static void opts_free(Opts *p)
{
    if (!p)
        return;
    free(p->lo);
    free(p->by_index);
    free(p);
}

/* A parser over the NULL-terminated list of tables; -h and --help are implied. NULL when out of
 * memory. */
static Opts *opts_new(const PxOption *const *tables)
{
    int n = 0;
    for (const PxOption *const *t = tables; *t; t++)
        for (const PxOption *o = *t; o->name; o++)
            n++;
    Opts *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->lo = calloc((size_t)n + 2, sizeof *p->lo);
    p->by_index = calloc((size_t)n + 1, sizeof *p->by_index);
    if (!p->lo || !p->by_index) {
        opts_free(p);
        return NULL;
    }
    size_t k = 0;
    p->shorts[k++] = ':';
    p->shorts[k++] = 'h';
    int i = 0;
    for (const PxOption *const *t = tables; *t; t++) {
        for (const PxOption *o = *t; o->name; o++, i++) {
            p->lo[i] = (struct option){o->name, o->has_arg ? required_argument : no_argument, NULL,
                                       1000 + i};
            p->by_index[i] = o;
            if (o->short_name && k + 3 < sizeof p->shorts) {
                p->shorts[k++] = o->short_name;
                if (o->has_arg)
                    p->shorts[k++] = ':';
            }
        }
    }
    p->lo[n] = (struct option){"help", no_argument, NULL, 'h'};
    return p;
}

/* The next option's id with *arg (NULL for a flag); PX_OPTS_HELP for -h or --help;
 * OPTS_BAD for an unknown option or a missing value (err names it; `see` is appended as the
 * place to look: "(see 'parallax plan --help')"); OPTS_END after the last option. */
static int opts_next(Opts *p, int argc, char **argv, const char **arg, const char *see,
                     PxError *err)
{
    *arg = NULL;
    int c = getopt_long(argc, argv, p->shorts, p->lo, NULL);
    if (c == -1)
        return OPTS_END;
    if (c == 'h')
        return PX_OPTS_HELP;
    if (c == '?')
        return px_fail(err, PX_EINPUT, "unknown option '%s'%s%s", argv[optind - 1], see ? " " : "",
                       see ? see : ""),
               OPTS_BAD;
    if (c == ':')
        return px_fail(err, PX_EINPUT, "option '%s' needs a value", argv[optind - 1]), OPTS_BAD;
    const PxOption *o = NULL;
    if (c >= 1000) {
        o = p->by_index[c - 1000];
    } else {
        for (int i = 0; p->by_index[i] && !o; i++)
            if (p->by_index[i]->short_name == c)
                o = p->by_index[i];
    }
    if (!o)
        return px_fail(err, PX_EINPUT, "unknown option '%s'", argv[optind - 1]), OPTS_BAD;
    *arg = o->has_arg ? optarg : NULL;
    return o->id;
}

void px_opts_help(FILE *f, const char *usage, const PxOption *const *tables)
{
    fprintf(f, "usage: %s\n\noptions:\n", usage);
    for (const PxOption *const *t = tables; *t; t++) {
        for (const PxOption *o = *t; o->name; o++) {
            char left[64], sh[8] = "";
            if (o->short_name)
                snprintf(sh, sizeof sh, "-%c, ", o->short_name);
            snprintf(left, sizeof left, "%s--%s%s%s", sh, o->name, o->has_arg ? " " : "",
                     o->has_arg ? o->arg : "");
            fprintf(f, "  %-22s %s\n", left, o->help);
        }
    }
    fprintf(f, "  %-22s %s\n", "-h, --help", "show this help");
}

int px_opts_parse(const PxOption *const *tables, int argc, char **argv, const char *see,
                  PxOptFn on, void *ctx, int max_operands, int *first, PxError *err)
{
    Opts *p = opts_new(tables);
    if (!p)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    /* 0, not 1: glibc then forgets all of an earlier scan (where it stopped inside a word of
     * short options, which operands it had moved), so a second parse starts clean */
    opterr = 0;
    optind = 0;
    const char *arg;
    int rc = PX_OK, id;
    while (rc == PX_OK && (id = opts_next(p, argc, argv, &arg, see, err)) != OPTS_END) {
        if (id == PX_OPTS_HELP)
            rc = PX_OPTS_HELP;
        else if (id == OPTS_BAD)
            rc = PX_EINPUT;
        else if (on)
            rc = on(ctx, id, arg, err);
    }
    *first = optind;
    opts_free(p);
    if (rc == PX_OK && max_operands >= 0 && argc - *first > max_operands)
        rc = px_fail(err, PX_EINPUT, "unexpected argument '%s'%s%s", argv[*first + max_operands],
                     see ? " " : "", see ? see : "");
    return rc;
}
