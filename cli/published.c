/* parallax published: the published runs in published/ (or the files given) priced, each row's
 * prediction against its measurement (docs/calibration.md, "Published runs"). */
/* glob */
#define _XOPEN_SOURCE 700
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "sim/sim.h"

/* files on the command line (CliArgs.positional's room), and from the directory */
enum { MAX_GIVEN = 8, MAX_FILES = 64 };

enum { OPT_FRAMEWORK = CLI_EXTRA, OPT_FLOP_COUNT };

static const CliOption published_options[] = {
    {"framework", 1, "F", "price every row as framework F runs it, not as its own (to see what the framework changes)", OPT_FRAMEWORK, 0},
    {"flop-count", 1, "C", "read every row that names a FLOP count on count C instead: parallax (its hardware FLOPs), megatron, megatron-causal, palm, palm-causal (to see what the count changes)", OPT_FLOP_COUNT, 0},
    {"json", 0, NULL,
     "an array of sources, each with rows[]: id, metric, measured, predicted, error, tolerance, inside, step_s, fits",
     CLI_JSON, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

int cli_cmd_published(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    const CliOption *const tables[] = {published_options, NULL};
    int st = cli_parse("published",
                       "[FILE...] [--framework F] [--flop-count C] [--json]\n\n"
                       "Prices every published run of each FILE (default: published/*.json, or\n"
                       "$PARALLAX_PUBLISHED/*.json) and prints its measured and predicted figure,\n"
                       "the error and the row's tolerance. Exit status 1 when a row is outside\n"
                       "its tolerance.",
                       argc, argv, tables, MAX_GIVEN, &a);
    if (st >= 0)
        return st;
    const char *fc = a.extra[OPT_FLOP_COUNT - CLI_EXTRA];
    const int flops = fc ? sim_flop_count_from_name(fc) : -1;
    if (flops < 0 && fc) {
        fprintf(stderr, "parallax published: --flop-count '%s' is none of parallax, megatron, "
                        "megatron-causal, palm, palm-causal\n", fc);
        return 2;
    }
    const char *files[MAX_FILES];
    int n = 0;
    glob_t g;
    memset(&g, 0, sizeof g);
    for (int i = 0; i < a.n_positional; i++)
        files[n++] = a.positional[i];
    if (n == 0) {
        const char *dir = getenv("PARALLAX_PUBLISHED");
        char pattern[1024];
        snprintf(pattern, sizeof pattern, "%s/*.json", dir && dir[0] ? dir : "published");
        if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
            fprintf(stderr, "parallax published: no published runs: %s matches nothing (give the files, "
                            "run from the source tree, or set PARALLAX_PUBLISHED)\n", pattern);
            globfree(&g);
            return 2;
        }
        for (size_t i = 0; i < g.gl_pathc && n < MAX_FILES; i++)
            files[n++] = g.gl_pathv[i];
    }
    SimPublished *p = calloc((size_t)n, sizeof *p);
    if (!p) {
        globfree(&g);
        fprintf(stderr, "parallax published: out of memory\n");
        return 1;
    }
    PxError err = {0};
    int rc = PX_OK, done = 0;
    for (; done < n && !rc; done++)
        rc = sim_published_run_with(files[done], a.extra[OPT_FRAMEWORK - CLI_EXTRA], (SimFlopCount)flops,
                                    &p[done], &err);
    int out = 0;
    if (!rc) {
        for (int k = 0; k < n; k++)
            for (int i = 0; i < p[k].n_rows; i++)
                out += !p[k].rows[i].inside;
        if (a.json)
            cli_print_json(sim_published_to_json(p, n));
        else
            sim_published_print(stdout, p, n);
    }
    for (int k = 0; k < n; k++)
        sim_published_free(&p[k]);
    free(p);
    globfree(&g);
    if (rc)
        return cli_fail("published", rc, &err);
    return out ? 1 : 0;
}
