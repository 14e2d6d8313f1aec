/* parallax validate: parse, load the model and this machine's profile, hand them to validate/. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "validate/validate.h"

enum { OPT_VSTEPS = CLI_EXTRA, OPT_VREPORT, OPT_MAXRANKS };

static const CliOption validate_options[] = {
    {"model", 1, "M", "the model to validate (default tiny)", CLI_MODEL, 0},
    {"cluster", 1, "PROFILE", "this machine's profile (default local: the calibrated one when present)", CLI_CLUSTER, 0},
    {"report", 1, "DIR", "plans, runs, logs and the report (default validation)", OPT_VREPORT, 0},
    {"steps", 1, "N", "steps per timing run (default 20; the median after the first)", OPT_VSTEPS, 0},
    {"max-ranks", 1, "N", "largest layout for the memory and communication checks (default 8)", OPT_MAXRANKS, 0},
    {"json", 0, NULL, "layouts[] with layout, predicted and measured figures", CLI_JSON, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

int cli_cmd_validate(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    model_spec_defaults(&a.spec);
    a.spec.job.global_batch = 8;
    const CliOption *const tables[] = {validate_options, cli_knob_options, NULL};
    int st = cli_parse("validate",
                       "[--model M] [--cluster PROFILE] [--report DIR] [--steps N] [--json]\n\n"
                       "Plans a spread of layouts on this machine's profile, runs them for real\n"
                       "(timing layouts on no more ranks than cores), compares and writes a report.",
                       argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    ValRequest q;
    val_request_defaults(&q);
    q.base = a.spec;
    if (a.extra[OPT_VREPORT - CLI_EXTRA])
        q.dir = a.extra[OPT_VREPORT - CLI_EXTRA];
    const char *v;
    int rc;
    if ((v = a.extra[OPT_VSTEPS - CLI_EXTRA]) && (rc = px_parse_int(v, "--steps", 2, 1 << 20, &q.steps, &err)))
        return cli_fail("validate", rc, &err);
    if ((v = a.extra[OPT_MAXRANKS - CLI_EXTRA]) && (rc = px_parse_int(v, "--max-ranks", 1, 64, &q.max_ranks, &err)))
        return cli_fail("validate", rc, &err);
    const char *cluster = a.cluster ? a.cluster : "local";
    ProfCluster cl;
    if ((rc = model_config_load(a.model ? a.model : "tiny", &q.base.model, &err)) ||
        (rc = prof_cluster_load(cluster, a.sets, a.n_sets, &cl, &err)))
        return cli_fail("validate", rc, &err);
    q.cluster = &cl;
    cJSON *j = NULL;
    if (!(rc = val_request_resolve(&q, cluster, &err))) {
        if (!a.json)
            val_print_header(stdout, &q);
        rc = val_run(&q, &j, a.json ? NULL : stdout, &err);
    }
    prof_cluster_free(&cl);
    if (rc)
        return cli_fail("validate", rc, &err);
    if (a.json) {
        cli_print_json(j);
    } else {
        printf("report: %s/report.md, %s/report.html\n", q.dir, q.dir);
        cJSON_Delete(j);
    }
    return 0;
}
