/* parallax report and parallax compare: parse, load the JSON, hand it to reports/. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "reports/report.h"

enum { OPT_PLAN = CLI_EXTRA, OPT_RUN, OPT_DIR, OPT_TITLE, OPT_GPUS, OPT_LANDSCAPE, OPT_ALL_OPS, OPT_PRICE, OPT_VALIDATION };

static const CliOption report_options[] = {
    {"plan", 1, "FILE", "a plan (its prediction): memory per stage, simulated timeline and trace", OPT_PLAN, 0},
    {"run", 1, "FILE", "a run.json: measured timeline and trace; with --plan, predicted against measured", OPT_RUN, 0},
    {"model", 1, "M", "with --cluster, --gpus and --gbs: scaling curves (strong and weak)", CLI_MODEL, 0},
    {"cluster", 1, "C", "cluster profile for the scaling curves and landscape", CLI_CLUSTER, 0},
    {"gpus", 1, "N1,N2...", "GPU counts for the scaling curves; the landscape uses the first", OPT_GPUS, 0},
    {"landscape", 0, NULL, "also every feasible layout at the first size: step time against memory", OPT_LANDSCAPE, 0},
    {"dir", 1, "DIR", "where to write (default: report)", OPT_DIR, 0},
    {"title", 1, "T", "the pages' title", OPT_TITLE, 0},
    {"gpu-hour-price", 1, "USD", "price of a GPU-hour: the header's cost to train (with --tokens)", OPT_PRICE, 0},
    {"validation", 1, "FILE", "a validation's JSON (validate --json): its host and quiet checks on the page", OPT_VALIDATION, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

int cli_cmd_report(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    model_spec_defaults(&a.spec);
    const CliOption *const tables[] = {report_options, cli_knob_options(), NULL};
    int st = cli_parse("report",
                       "[--plan P] [--run R] [--model M --cluster C --gpus N,... --gbs B [--landscape]] [--dir DIR]\n\n"
                       "Draws charts with gnuplot (PNG and SVG), Perfetto traces, and report.md / report.html\n"
                       "(one self-contained file, the charts inline) under a header of the plan's figures.\n"
                       "A line per phase goes to standard error.",
                       argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    RptRequest q;
    memset(&q, 0, sizeof q);
    q.dir = a.extra[OPT_DIR - CLI_EXTRA] ? a.extra[OPT_DIR - CLI_EXTRA] : "report";
    q.title = a.extra[OPT_TITLE - CLI_EXTRA];
    q.landscape = a.extra[OPT_LANDSCAPE - CLI_EXTRA] != NULL;
    q.progress = stderr;
    if (cli_given(&a, MODEL_FIELD_TRAIN_TOKENS))
        q.train_tokens = a.spec.job.train_tokens;
    const char *v;
    if ((v = a.extra[OPT_PRICE - CLI_EXTRA])) {
        int prc = px_parse_double(v, "--gpu-hour-price", &q.gpu_hour_price, &err);
        if (prc || !(q.gpu_hour_price > 0) || !isfinite(q.gpu_hour_price)) {
            fprintf(stderr, "parallax report: --gpu-hour-price: expected a positive price in USD, got '%s'\n", v);
            return 2;
        }
    }
    cJSON *plan = NULL, *run = NULL, *val = NULL;
    int rc = 0, gpus[64], n_gpus = 0;
    ProfCluster cl;
    memset(&cl, 0, sizeof cl);
    if ((v = a.extra[OPT_PLAN - CLI_EXTRA]) && !(plan = px_json_read_file(v, &err)))
        return cli_fail("report", PX_EINPUT, &err);
    if ((v = a.extra[OPT_RUN - CLI_EXTRA]) && !(run = px_json_read_file(v, &err))) {
        cJSON_Delete(plan);
        return cli_fail("report", PX_EINPUT, &err);
    }
    if ((v = a.extra[OPT_VALIDATION - CLI_EXTRA]) && !(val = px_json_read_file(v, &err))) {
        cJSON_Delete(plan);
        cJSON_Delete(run);
        return cli_fail("report", PX_EINPUT, &err);
    }
    q.plan = plan;
    q.run = run;
    q.validation = val;
    if (a.model || a.cluster || a.extra[OPT_GPUS - CLI_EXTRA]) {
        if (!a.model || !a.cluster || !a.extra[OPT_GPUS - CLI_EXTRA] || !cli_given(&a, MODEL_FIELD_GLOBAL_BATCH)) {
            fprintf(stderr, "parallax report: scaling curves need --model, --cluster, --gpus and --gbs\n");
            rc = 2;
            goto out;
        }
        const char *p = a.extra[OPT_GPUS - CLI_EXTRA];
        while (*p && n_gpus < 64) {
            char *end;
            long g = strtol(p, &end, 10);
            if (end == p || g < 1 || g > (1 << 24) || (*end && *end != ',')) {
                fprintf(stderr, "parallax report: --gpus: expected a list of counts like 8,16,32, got '%s'\n",
                        a.extra[OPT_GPUS - CLI_EXTRA]);
                rc = 2;
                goto out;
            }
            gpus[n_gpus++] = (int)g;
            p = *end ? end + 1 : end;
        }
        if ((rc = model_config_load(a.model, &a.spec.model, &err)) ||
            (rc = prof_cluster_load(a.cluster, a.sets, a.n_sets, &cl, &err))) {
            rc = cli_fail("report", rc, &err);
            goto out;
        }
        q.base = &a.spec;
        q.cluster = &cl;
        q.gpus = gpus;
        q.n_gpus = n_gpus;
    }
    if ((rc = rpt_build(&q, stdout, &err)))
        rc = cli_fail("report", rc, &err);
out:
    prof_cluster_free(&cl);
    cJSON_Delete(plan);
    cJSON_Delete(run);
    cJSON_Delete(val);
    return rc;
}

static const CliOption compare_options[] = {
    {"json", 0, NULL, "machine-readable output", CLI_JSON, 0},
    {"all-ops", 0, NULL, "list every op, not only those above 1% of the step", OPT_ALL_OPS, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

int cli_cmd_compare(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    const CliOption *const tables[] = {compare_options, NULL};
    int st = cli_parse("compare", "PLAN.json RUN.json [--json] [--all-ops]\n\n"
                                  "Predicted against measured: step time, bubble, per-op time, memory per category\n"
                                  "and rank, communication bytes per kind and rank, FLOPs, with relative errors.",
                       argc, argv, tables, 2, &a);
    if (st >= 0)
        return st;
    if (a.n_positional != 2) {
        fprintf(stderr, "parallax compare: a plan and a run are required (see --help)\n");
        return 2;
    }
    PxError err = {0};
    cJSON *plan = px_json_read_file(a.positional[0], &err), *run = NULL;
    if (!plan || !(run = px_json_read_file(a.positional[1], &err))) {
        cJSON_Delete(plan);
        return cli_fail("compare", PX_EINPUT, &err);
    }
    RptCompare c;
    int rc = rpt_compare(plan, run, &c, &err);
    cJSON_Delete(plan);
    cJSON_Delete(run);
    if (rc)
        return cli_fail("compare", rc, &err);
    if (a.json)
        cli_print_json(rpt_compare_to_json(&c));
    else
        rpt_compare_print(stdout, &c, a.extra[OPT_ALL_OPS - CLI_EXTRA] != NULL);
    rpt_compare_free(&c);
    return 0;
}
