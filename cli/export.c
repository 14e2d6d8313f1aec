/* parallax export: a plan as framework settings. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "sim/sim.h"

enum { OPT_FORMAT = CLI_EXTRA };

static const CliOption export_options[] = {
    {"format", 1, "F", "megatron (flags) | deepspeed (config JSON) | nemo (NeMo 1.x, then Megatron-Bridge overrides) | bridge (Megatron-Bridge) | torchtitan (torchtitan 0.3 command line) | torchtitan-toml (torchtitan 0.2 job file) | slurm (sbatch script)", OPT_FORMAT, 0},
    {"output", 1, "FILE", "write to FILE instead of standard output", CLI_OUTPUT, 'o'},
    {NULL, 0, NULL, NULL, 0, 0}};

int cli_cmd_export(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    const CliOption *const tables[] = {export_options, NULL};
    int st = cli_parse("export", "PLAN.json --format megatron|deepspeed|nemo|bridge|torchtitan|torchtitan-toml|slurm [-o FILE]\n\n"
                                 "Writes a plan's layout and training settings for the framework that runs it.",
                       argc, argv, tables, 1, &a);
    if (st >= 0)
        return st;
    const char *fmt_name = a.extra[OPT_FORMAT - CLI_EXTRA];
    if (a.n_positional != 1 || !fmt_name) {
        fprintf(stderr, "parallax export: a plan file and --format are required (see --help)\n");
        return 2;
    }
    int fmt = sim_export_from_name(fmt_name);
    if (fmt < 0) {
        fprintf(stderr, "parallax export: --format: expected megatron, deepspeed, nemo, bridge, torchtitan, torchtitan-toml or slurm, got '%s'\n", fmt_name);
        return 2;
    }
    PxError err = {0};
    ModelPlan plan;
    int rc = model_plan_read(a.positional[0], &plan, &err);
    if (rc)
        return cli_fail("export", rc, &err);
    /* -o: a file that appears whole or not at all, left untouched when the export fails */
    PxAtomicFile file;
    FILE *out = stdout;
    if (a.output) {
        if (px_atomic_open(&file, a.output, &err)) {
            model_plan_free(&plan);
            return cli_fail("export", PX_ERUNTIME, &err); /* 1: the plan was good, -o was not */
        }
        out = file.f;
    }
    rc = sim_export(out, &plan, (SimExportFormat)fmt, &err);
    model_plan_free(&plan);
    if (a.output && rc) {
        px_atomic_abort(&file);
    } else if (a.output && px_atomic_commit(&file, &err)) {
        return cli_fail("export", PX_ERUNTIME, &err);
    }
    return rc ? cli_fail("export", rc, &err) : 0;
}
