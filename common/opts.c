/* Option tables: getopt_long's table and --help generated from one list per program. */
#include "common/px.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

struct PxOpts {
    struct option *lo;        /* getopt_long's table: every option, then help */
    const PxOption **by_index; /* lo[i]'s entry */
    char shorts[80];          /* ":h" and every short option ("o:") */
    int started;
};

PxOpts *px_opts_new(const PxOption *const *tables)
{
    int n = 0;
    for (const PxOption *const *t = tables; *t; t++)
        for (const PxOption *o = *t; o->name; o++)
            n++;
    PxOpts *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->lo = calloc((size_t)n + 2, sizeof *p->lo);
    p->by_index = calloc((size_t)n + 1, sizeof *p->by_index);
    if (!p->lo || !p->by_index) {
        px_opts_free(p);
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

void px_opts_free(PxOpts *p)
{
    if (!p)
        return;
    free(p->lo);
    free(p->by_index);
    free(p);
}

int px_opts_next(PxOpts *p, int argc, char **argv, const char **arg, const char *see,
                 PxError *err)
{
    if (!p->started) {
        /* 0, not 1: glibc then forgets all of an earlier scan (where it stopped inside a word
         * of short options, which operands it had moved), so a second parse starts clean */
        opterr = 0;
        optind = 0;
        p->started = 1;
    }
    *arg = NULL;
    int c = getopt_long(argc, argv, p->shorts, p->lo, NULL);
    if (c == -1)
        return PX_OPTS_END;
    if (c == 'h')
        return PX_OPTS_HELP;
    if (c == '?')
        return px_fail(err, PX_EINPUT, "unknown option '%s'%s%s", argv[optind - 1], see ? " " : "",
                       see ? see : ""),
               PX_OPTS_BAD;
    if (c == ':')
        return px_fail(err, PX_EINPUT, "option '%s' needs a value", argv[optind - 1]), PX_OPTS_BAD;
    const PxOption *o = NULL;
    if (c >= 1000) {
        o = p->by_index[c - 1000];
    } else {
        for (int i = 0; p->by_index[i] && !o; i++)
            if (p->by_index[i]->short_name == c)
                o = p->by_index[i];
    }
    if (!o)
        return px_fail(err, PX_EINPUT, "unknown option '%s'", argv[optind - 1]), PX_OPTS_BAD;
    *arg = o->has_arg ? optarg : NULL;
    return o->id;
}

int px_opts_index(const PxOpts *p)
{
    (void)p;
    return optind;
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
    PxOpts *p = px_opts_new(tables);
    if (!p)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    const char *arg;
    int rc = PX_OK, id;
    while (rc == PX_OK && (id = px_opts_next(p, argc, argv, &arg, see, err)) != PX_OPTS_END) {
        if (id == PX_OPTS_HELP)
            rc = PX_OPTS_HELP;
        else if (id == PX_OPTS_BAD)
            rc = PX_EINPUT;
        else if (on)
            rc = on(ctx, id, arg, err);
    }
    *first = px_opts_index(p);
    px_opts_free(p);
    if (rc == PX_OK && max_operands >= 0 && argc - *first > max_operands)
        rc = px_fail(err, PX_EINPUT, "unexpected argument '%s'%s%s", argv[*first + max_operands],
                     see ? " " : "", see ? see : "");
    return rc;
}
