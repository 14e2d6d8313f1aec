/* parallax validate: parse, load the model and this machine's profile, hand them to validate/. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "validate/validate.h"

enum { OPT_VSTEPS = CLI_EXTRA, OPT_VREPORT, OPT_MAXRANKS, OPT_RECAL, OPT_NOCHECK, OPT_CHECKONLY, OPT_LAYOUTS, OPT_LIST, OPT_TRIES };

static const CliOption validate_options[] = {
    {"model", 1, "M", "the model to validate (default tiny)", CLI_MODEL, 0},
    {"cluster", 1, "PROFILE", "this machine's profile (default local: the calibrated one when present)", CLI_CLUSTER, 0},
    {"report", 1, "DIR", "plans, runs, logs and the report (default validation)", OPT_VREPORT, 0},
    {"steps", 1, "N", "steps per timing run (default 20; the median after the first)", OPT_VSTEPS, 0},
    {"tries", 1, "N", "timed runs of each timed layout, spread over the validation, the fastest kept (default 5; 1 on a busy machine)", OPT_TRIES, 0},
    {"max-ranks", 1, "N", "largest layout for the memory and communication checks (default 8)", OPT_MAXRANKS, 0},
    {"layouts", 1, "N", "only the first N layouts, the planner's best first (default: all)", OPT_LAYOUTS, 0},
    {"json", 0, NULL, "layouts[] with layout, predicted and measured figures", CLI_JSON, 0},
    {"recalibrate", 0, NULL, "when the host check finds this machine more than 10% faster or slower than when calibrated, calibrate it again in place first", OPT_RECAL, 0},
    {"no-host-check", 0, NULL, "skip the host check (a second's probe of GEMM rate and memory bandwidth against the profile's)", OPT_NOCHECK, 0},
    {"check-host", 0, NULL, "only the host check: print it and stop", OPT_CHECKONLY, 0},
    {"list", 0, NULL, "only list the layouts it would run, each with why one would be skipped, and stop", OPT_LIST, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

int cli_cmd_validate(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    model_spec_defaults(&a.spec);
    a.spec.job.global_batch = 8;
    const CliOption *const tables[] = {validate_options, cli_knob_options(), NULL};
    int st = cli_parse("validate",
                       "[--model M] [--cluster PROFILE] [--report DIR] [--steps N] [--tries N]\n"
                       "       [--layouts N] [--json] [--recalibrate | --no-host-check | --check-host | --list]\n\n"
                       "Checks that this machine runs as fast as when its profile was calibrated,\n"
                       "plans a spread of layouts on that profile, runs them for real (timing\n"
                       "layouts on no more ranks than cores, each several times, the fastest\n"
                       "compared), compares and writes a report.",
                       argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    ValRequest q;
    val_request_defaults(&q);
    /* the host from now on: the window before the timed runs (host check and planning) */
    val_host_snap(&q.start);
    q.base = a.spec;
    if (a.extra[OPT_VREPORT - CLI_EXTRA])
        q.dir = a.extra[OPT_VREPORT - CLI_EXTRA];
    const char *v;
    int rc = 0;
    if (((v = a.extra[OPT_VSTEPS - CLI_EXTRA]) &&
         (rc = px_parse_int(v, "--steps", 2, 1 << 20, &q.steps, &err))) ||
        ((v = a.extra[OPT_MAXRANKS - CLI_EXTRA]) &&
         (rc = px_parse_int(v, "--max-ranks", 1, 64, &q.max_ranks, &err))) ||
        ((v = a.extra[OPT_TRIES - CLI_EXTRA]) &&
         (rc = px_parse_int(v, "--tries", 1, VAL_MAX_TRIES, &q.tries, &err))) ||
        ((v = a.extra[OPT_LAYOUTS - CLI_EXTRA]) &&
         (rc = px_parse_int(v, "--layouts", 1, 1000, &q.max_layouts, &err)))) {
        val_host_snap_free(&q.start);
        return cli_fail("validate", rc, &err);
    }
    const char *cluster = a.cluster ? a.cluster : "local";
    ProfCluster cl;
    if ((rc = model_config_load(a.model ? a.model : "tiny", &q.base.model, &err)) ||
        (rc = prof_cluster_load(cluster, a.sets, a.n_sets, &cl, &err))) {
        val_host_snap_free(&q.start);
        return cli_fail("validate", rc, &err);
    }
    q.cluster = &cl;
    cJSON *j = NULL;
    FILE *log = a.json ? NULL : stdout;
    const int list = a.extra[OPT_LIST - CLI_EXTRA] != NULL;
    const int check = !a.extra[OPT_NOCHECK - CLI_EXTRA] && !list,
              only = a.extra[OPT_CHECKONLY - CLI_EXTRA] != NULL;
    if (!(rc = val_request_resolve(&q, cluster, &err))) {
        if (log)
            val_print_header(log, &q);
        if (check || only)
            rc = val_host_check(&q, a.extra[OPT_RECAL - CLI_EXTRA] != NULL, a.json && only ? NULL : log, &err);
    }
    if (!rc && q.host.recalibrated) {
        /* the profile was written again: plan with what was measured now */
        ValHostCheck h = q.host;
        prof_cluster_free(&cl);
        if (!(rc = prof_cluster_load(cluster, a.sets, a.n_sets, &cl, &err)) &&
            !(rc = val_request_resolve(&q, cluster, &err)) && log)
            val_print_header(log, &q);
        q.host = h;
    }
    if (!rc && only) {
        if (a.json)
            cli_print_json(val_host_json(&q.host));
        else if (!cl.measured)
            printf("host check: none: the profile is not calibrated (run parallax calibrate)\n");
        prof_cluster_free(&cl);
        val_host_snap_free(&q.start);
        return 0;
    }
    if (!rc && list) {
        rc = val_list(&q, stdout, &err);
        prof_cluster_free(&cl);
        val_host_snap_free(&q.start);
        return rc ? cli_fail("validate", rc, &err) : 0;
    }
    if (!rc)
        rc = val_run(&q, &j, log, &err);
    prof_cluster_free(&cl);
    val_host_snap_free(&q.start);
    if (rc)
        return cli_fail("validate", rc, &err);
    if (a.json) {
        cli_print_json(j);
    } else {
        printf("report: %s/report.md, %s/report.html; figures in %s/validation.json\n", q.dir,
               q.dir, q.dir);
        cJSON_Delete(j);
    }
    return 0;
}
