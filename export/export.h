/* export — a plan written for the framework that runs it: Megatron-LM's command-line flags, a
 * DeepSpeed config, NeMo 1.x and Megatron-Bridge overrides, torchtitan's command line or job
 * file, and a Slurm batch script that runs the plan with `parallax run`. It reads a plan
 * (model/: the layout, the job, the cluster profile and the prediction the plan carries) and
 * simulates nothing. Names follow each framework's own documentation and code (the files cite
 * the versions); what a framework cannot express is said in a "# NOT EXPRESSIBLE:" comment or a
 * warning, never dropped silently (docs/exports.md).
 *
 * Example:
 *   ModelPlan plan;
 *   if (model_plan_read("plan.json", &plan, &err) == PX_OK) {
 *       int fmt = export_format_from_name("megatron");      // -1 when unknown
 *       if (export_plan(stdout, &plan, (ExportFormat)fmt, &err))
 *           fprintf(stderr, "parallax export: %s\n", err.msg); // a layout rule broken
 *       model_plan_free(&plan);
 *   }
 */
#ifndef EXPORT_H
#define EXPORT_H

#include <stdio.h>

#include "common/px.h"
#include "model/model.h"

typedef enum {
    EXPORT_MEGATRON = 0,
    EXPORT_DEEPSPEED,
    EXPORT_NEMO,            /* NeMo 1.x Hydra overrides, then Megatron-Bridge's */
    EXPORT_BRIDGE,          /* Megatron-Bridge ConfigContainer overrides */
    EXPORT_TORCHTITAN,      /* torchtitan 0.3's command line */
    EXPORT_SLURM,           /* an sbatch script that runs the plan with parallax run */
    EXPORT_TORCHTITAN_TOML, /* torchtitan 0.2's TOML job file */
    EXPORT_COUNT
} ExportFormat;

/* Writes the plan in the format: Megatron-LM flags, a DeepSpeed config JSON, NeMo /
 * Megatron-Bridge overrides, torchtitan's command line or TOML, or an sbatch script (with
 * export_slurm_job's defaults). What the format cannot say goes to f as comments or to stderr
 * as warnings. PX_EINPUT when the plan's layout breaks a rule or the format is unknown. */
int export_plan(FILE *f, const ModelPlan *plan, ExportFormat fmt, PxError *err);
/* "megatron", "deepspeed", ... as --format takes them; "?" for none. */
const char *export_format_name(ExportFormat fmt);
int export_format_from_name(const char *s); /* -1 when unknown */

/* What an sbatch script needs beyond the plan: where the job finds things. */
typedef struct {
    const char *plan_path; /* the plan as every node of the job reads it (NULL: plan.json) */
    const char *parallax;  /* the parallax executable on every node (NULL: parallax, on PATH) */
    const char *time;      /* #SBATCH --time as given (NULL: from the plan's prediction) */
} ExportSlurmJob;
/* The plan as an sbatch script (docs/exports.md, "Slurm"): nodes and tasks from the plan's
 * cluster profile, a GPU per task unless its device is a CPU, the environment, and srun starting
 * `parallax run PLAN --launcher none` once per rank. --time is twice the predicted time of the
 * plan's steps plus 10 minutes, rounded up to a minute, when job->time is NULL and the plan
 * carries a prediction. job NULL: every default. PX_EINPUT when the plan's layout breaks a rule
 * or its prediction cannot be read; nothing is written then. */
int export_slurm_job(FILE *f, const ModelPlan *plan, const ExportSlurmJob *job, PxError *err);

#endif
