/* parallax — front end: subcommand dispatch. Each command parses its options and hands the
 * work to the library modules; exit status 0 ok, 1 runtime failure, 2 bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "sim/sim.h"

#define PARALLAX_VERSION "0.1.0"

static const CliOption json_option[] = {
    {"json", 0, NULL, "machine-readable output", CLI_JSON, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static const CliOption target_options[] = {
    {"model", 1, "M", "zoo model name or JSON file (parallax or Hugging Face config.json)", CLI_MODEL, 0},
    {"cluster", 1, "C", "cluster profile name or JSON file", CLI_CLUSTER, 0},
    {"gpus", 1, "N", "number of GPUs (ranks)", CLI_GPUS, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static int cmd_models(int argc, char **argv)
{
    CliArgs a = {0};
    const CliOption *const tables[] = {json_option, NULL};
    int st = cli_parse("models", "[--json]\n\nLists the built-in model zoo.", argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    int rc = sim_list_models(stdout, a.json, &err);
    return rc ? cli_fail("models", rc, &err) : 0;
}

static int cmd_profiles(int argc, char **argv)
{
    CliArgs a = {0};
    const CliOption *const tables[] = {json_option, NULL};
    int st = cli_parse("profiles", "[--json]\n\nLists the built-in device and cluster profiles.",
                       argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    int rc = sim_list_profiles(stdout, a.json, &err);
    return rc ? cli_fail("profiles", rc, &err) : 0;
}

enum { OPT_LAYER_TIME = CLI_EXTRA };

static const CliOption simulate_options[] = {
    {"layer-time", 0, NULL, "one transformer layer's forward and backward by kind of work", OPT_LAYER_TIME, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static int cmd_simulate(int argc, char **argv)
{
    CliArgs a = {0};
    model_spec_defaults(&a.spec);
    const CliOption *const tables[] = {target_options, cli_knob_options(), simulate_options, json_option, NULL};
    int st = cli_parse("simulate",
                       "--model M --cluster C --gpus N [knobs] [--json]\n\n"
                       "Predicts memory per GPU by category and pipeline stage, FLOPs and\n"
                       "communication per step for one layout of a model on a cluster.",
                       argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    if (!a.model || !a.cluster || !a.gpus) {
        fprintf(stderr, "parallax simulate: --model, --cluster and --gpus are required (see --help)\n");
        return 2;
    }
    int rc = model_config_load(a.model, &a.spec.model, &err);
    if (rc)
        return cli_fail("simulate", rc, &err);
    ProfCluster cl;
    if ((rc = prof_cluster_load(a.cluster, a.sets, a.n_sets, &cl, &err)))
        return cli_fail("simulate", rc, &err);
    SimResult r;
    if ((rc = sim_run(&a.spec, &cl, a.gpus, &r, &err))) {
        prof_cluster_free(&cl);
        return cli_fail("simulate", rc, &err);
    }
    SimFp8Effect fp8;
    if ((rc = sim_fp8_effect(&r, &fp8, &err))) {
        sim_result_free(&r);
        prof_cluster_free(&cl);
        return cli_fail("simulate", rc, &err);
    }
    SimLayerTime lt;
    const int layer_time = a.extra[OPT_LAYER_TIME - CLI_EXTRA] != NULL;
    if (layer_time && (rc = sim_layer_time(&r, &lt, &err))) {
        sim_result_free(&r);
        prof_cluster_free(&cl);
        return cli_fail("simulate", rc, &err);
    }
    if (a.json) {
        cJSON *j = sim_result_to_json(&r);
        if (fp8.on)
            cJSON_AddItemToObject(j, "fp8", sim_fp8_effect_to_json(&r, &fp8));
        if (layer_time)
            cJSON_AddItemToObject(j, "layer_time", sim_layer_time_to_json(&lt));
        cli_print_json(j);
    } else {
        sim_result_print(stdout, &r);
        sim_fp8_effect_print(stdout, &r, &fp8);
        if (layer_time)
            sim_layer_time_print(stdout, &r, &lt);
    }
    sim_result_free(&r);
    prof_cluster_free(&cl); /* after the result, which shares its measurements */
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: parallax <command> [options]\n\n"
            "Plans, simulates and runs parallel layouts for transformer training.\n\n"
            "commands:\n"
            "  models      list the built-in model zoo\n"
            "  profiles    list the built-in device and cluster profiles\n"
            "  simulate    predict memory, FLOPs, communication and time of one layout\n"
            "  plan        search every layout, rank them, write the best as a plan\n"
            "  export      write a plan as Megatron-LM, DeepSpeed or NeMo settings\n"
            "  run         train a plan for real\n"
            "  compare     a plan's prediction against a run's measurements\n"
            "  report      charts, traces and pages: memory, timelines, scaling, landscape\n"
            "  calibrate   measure this machine: GEMMs, op rates, collectives -> a profile\n"
            "  validate    plan, run and compare a spread of layouts on this machine\n"
            "  published   price the published runs (published/*.json) against their measurements\n"
            "  help        show this help ('parallax <command> --help' for a command's)\n"
            "  version     print the version\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "models"))
        return cmd_models(argc - 1, argv + 1);
    if (!strcmp(cmd, "profiles"))
        return cmd_profiles(argc - 1, argv + 1);
    if (!strcmp(cmd, "simulate"))
        return cmd_simulate(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan"))
        return cli_cmd_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "export"))
        return cli_cmd_export(argc - 1, argv + 1);
    if (!strcmp(cmd, "report"))
        return cli_cmd_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "compare"))
        return cli_cmd_compare(argc - 1, argv + 1);
    if (!strcmp(cmd, "validate"))
        return cli_cmd_validate(argc - 1, argv + 1);
    if (!strcmp(cmd, "run"))
        return cli_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate"))
        return cli_cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "published"))
        return cli_cmd_published(argc - 1, argv + 1);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("parallax %s\n", PARALLAX_VERSION);
        return 0;
    }
    fprintf(stderr, "parallax: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
