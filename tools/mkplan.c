/* exec_mkplan — a plan without the planner, for trying the executor by hand:
 *   exec_mkplan --model tiny --gbs 8 --mbs 4 --output plan.json
 *   parallax run plan.json --steps 60
 * It takes the simulator's layout and training knobs, simulates the layout on the cluster
 * (default: local, one rank) and writes the plan with its prediction. Built, not installed:
 * `parallax plan` is the real front end. */
#include <stdio.h>

#include "cli/options.h"
#include "sim/sim.h"

int main(int argc, char **argv)
{
    static const CliOption target[] = {
        {"model", 1, "M", "zoo model name or JSON file", CLI_MODEL, 0},
        {"cluster", 1, "C", "cluster profile (default local)", CLI_CLUSTER, 0},
        {"gpus", 1, "N", "ranks (default 1)", CLI_GPUS, 0},
        {"output", 1, "FILE", "plan to write (default plan.json)", CLI_OUTPUT, 'o'},
        {NULL, 0, NULL, NULL, 0, 0}};
    const CliOption *const tables[] = {target, cli_knob_options(), NULL};
    CliArgs a = {0};
    model_spec_defaults(&a.spec);
    int st = cli_parse_as("exec_mkplan", "--model M [--cluster C] [--gpus N] [knobs] [--output FILE]\n\n"
                                 "Writes a plan (layout, training job, prediction) for parallax run.",
                       argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    if (!a.model) {
        fprintf(stderr, "exec_mkplan: --model is required (see --help)\n");
        return 2;
    }
    int rc = model_config_load(a.model, &a.spec.model, &err);
    ModelPlan plan = {0};
    if (!rc)
        rc = sim_plan_for(&a.spec, a.cluster ? a.cluster : "local", a.gpus ? a.gpus : 1, &plan,
                            &err);
    if (!rc) {
        cJSON *j = model_plan_to_json(&plan);
        rc = px_json_write_file(a.output ? a.output : "plan.json", j, &err);
        cJSON_Delete(j);
    }
    model_plan_free(&plan);
    if (rc) {
        fprintf(stderr, "exec_mkplan: %s\n", err.msg);
        return rc == PX_EINPUT ? 2 : 1;
    }
    printf("wrote %s\n", a.output ? a.output : "plan.json");
    return 0;
}
