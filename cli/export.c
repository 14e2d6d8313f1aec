/* parallax export: a plan as framework settings. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "export/export.h"

enum { OPT_FORMAT = CLI_EXTRA };
/* --format slurm's (ids from the end of the extra range, apart from the options above) */
enum { OPT_PLAN_PATH = CLI_EXTRA_MAX - 3, OPT_PARALLAX, OPT_TIME };

static const CliOption export_options[] = {
    {"format", 1, "F", "megatron (flags) | deepspeed (config JSON) | nemo (NeMo 1.x, then Megatron-Bridge overrides) | bridge (Megatron-Bridge) | torchtitan (torchtitan 0.3 command line) | torchtitan-toml (torchtitan 0.2 job file) | slurm (sbatch script)", OPT_FORMAT, 0},
    {"output", 1, "FILE", "write to FILE instead of standard output", CLI_OUTPUT, 'o'},
    {"plan-path", 1, "PATH", "slurm: the plan as the job's nodes read it (default: PLAN.json, absolute)", OPT_PLAN_PATH, 0},
    {"parallax", 1, "PATH", "slurm: the parallax executable on the nodes (default: this one, absolute)", OPT_PARALLAX, 0},
    {"time", 1, "T", "slurm: the job's time limit, as sbatch takes it (default: twice the plan's predicted time plus 10 minutes)", OPT_TIME, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

/* sbatch's --time forms (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) or UNLIMITED:
 * digits with ':' and '-' between them, checked loosely; sbatch has the last word. */
static int slurm_time_ok(const char *t)
{
    if (!strcasecmp(t, "unlimited") || !strcasecmp(t, "infinite"))
        return 1;
    size_t n = strlen(t);
    return n > 0 && n < 32 && strspn(t, "0123456789:-") == n && t[0] >= '0' && t[0] <= '9' &&
           t[n - 1] >= '0' && t[n - 1] <= '9';
}

/* The job's view of the files for --format slurm: the options, or the plan's and this
 * executable's absolute paths. -1 to go on, or the exit status. */
static int slurm_job(const CliArgs *a, ExportSlurmJob *job, char *plan_abs, char *self, size_t cap)
{
    job->plan_path = a->extra[OPT_PLAN_PATH - CLI_EXTRA];
    job->parallax = a->extra[OPT_PARALLAX - CLI_EXTRA];
    job->time = a->extra[OPT_TIME - CLI_EXTRA];
    if (job->time && !slurm_time_ok(job->time)) {
        fprintf(stderr, "parallax export: --time: expected minutes, HH:MM:SS, D-HH:MM:SS or UNLIMITED, "
                        "got '%s'\n", job->time);
        return 2;
    }
    if (!job->plan_path) {
        if (!realpath(a->positional[0], plan_abs)) {
            fprintf(stderr, "parallax export: %s: cannot resolve its absolute path for the job "
                            "(give --plan-path)\n", a->positional[0]);
            return 2;
        }
        job->plan_path = plan_abs;
    }
    if (!job->parallax) {
        ssize_t n = readlink("/proc/self/exe", self, cap - 1);
        if (n <= 0) {
            fprintf(stderr, "parallax export: cannot find this executable's path for the job "
                            "(give --parallax)\n");
            return 1;
        }
        self[n] = '\0';
        job->parallax = self;
    }
    return -1;
}

int cli_cmd_export(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    const CliOption *const tables[] = {export_options, NULL};
    int st = cli_parse("export", "PLAN.json --format megatron|deepspeed|nemo|bridge|torchtitan|torchtitan-toml|slurm\n"
                                 "       [-o FILE] [--plan-path PATH] [--parallax PATH] [--time T]   (slurm)\n\n"
                                 "Writes a plan's layout and training settings for the framework that runs it.",
                       argc, argv, tables, 1, &a);
    if (st >= 0)
        return st;
    const char *fmt_name = a.extra[OPT_FORMAT - CLI_EXTRA];
    if (a.n_positional != 1 || !fmt_name) {
        fprintf(stderr, "parallax export: a plan file and --format are required (see --help)\n");
        return 2;
    }
    int fmt = export_format_from_name(fmt_name);
    if (fmt < 0) {
        fprintf(stderr, "parallax export: --format: expected megatron, deepspeed, nemo, bridge, torchtitan, torchtitan-toml or slurm, got '%s'\n", fmt_name);
        return 2;
    }
    static const struct {
        int id;
        const char *flag;
    } slurm_only[] = {{OPT_PLAN_PATH, "--plan-path"}, {OPT_PARALLAX, "--parallax"}, {OPT_TIME, "--time"}};
    for (size_t i = 0; fmt != EXPORT_SLURM && i < sizeof slurm_only / sizeof slurm_only[0]; i++)
        if (a.extra[slurm_only[i].id - CLI_EXTRA]) {
            fprintf(stderr, "parallax export: %s applies to --format slurm only\n", slurm_only[i].flag);
            return 2;
        }
    PxError err = {0};
    ModelPlan plan;
    int rc = model_plan_read(a.positional[0], &plan, &err);
    if (rc)
        return cli_fail("export", rc, &err);
    ExportSlurmJob job = {0};
    char plan_abs[PATH_MAX], self[PATH_MAX];
    if (fmt == EXPORT_SLURM) {
        int st2 = slurm_job(&a, &job, plan_abs, self, sizeof self);
        if (st2 >= 0) {
            model_plan_free(&plan);
            return st2;
        }
    }
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
    rc = fmt == EXPORT_SLURM ? export_slurm_job(out, &plan, &job, &err)
                             : export_plan(out, &plan, (ExportFormat)fmt, &err);
    model_plan_free(&plan);
    if (a.output && rc) {
        px_atomic_abort(&file);
    } else if (a.output && px_atomic_commit(&file, &err)) {
        return cli_fail("export", PX_ERUNTIME, &err);
    }
    return rc ? cli_fail("export", rc, &err) : 0;
}
