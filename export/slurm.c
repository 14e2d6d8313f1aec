/* A Slurm batch script export: the plan's ranks as nodes and tasks, and srun starting
 * `parallax run PLAN --launcher none` once per rank (docs/exports.md, "Slurm"). */
#include "export/internal.h"

#include <math.h>
#include <string.h>

/* A word for the shell: as it is when every character is safe, else in single quotes (a quote
 * inside as '\''). */
static void sh_word(FILE *f, const char *s)
{
    if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./+:=,@%-") == strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputs("'\\''", f);
        else
            fputc(*s, f);
    }
    fputc('\'', f);
}

/* Slurm's time format for whole minutes: HH:MM:00, or D-HH:MM:00 from a day on. */
static void slurm_time(char *buf, size_t cap, long minutes)
{
    const long days = minutes / (24 * 60), hours = minutes / 60 % 24, mins = minutes % 60;
    if (days > 0)
        snprintf(buf, cap, "%ld-%02ld:%02ld:00", days, hours, mins);
    else
        snprintf(buf, cap, "%02ld:%02ld:00", hours, mins);
}

/* The job's name: parallax-<model>, what sacct and squeue show, in characters any site takes. */
static void job_name(char *buf, size_t cap, const char *model)
{
    int n = snprintf(buf, cap, "parallax-");
    for (const char *c = model; *c && (size_t)n + 1 < cap && n < 64; c++)
        buf[n++] = strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-", *c) ? *c : '_';
    buf[n] = '\0';
}

/* The job's time limit in limit[cap] ("" for none): as given, else from the plan's predicted
 * step time (*step_s; 0 without a prediction). PX_EINPUT when the prediction cannot be read. */
static int slurm_limit(const ModelPlan *p, const char *given, int steps, char *limit, size_t cap, double *step_s,
                       PxError *err)
{
    limit[0] = '\0';
    *step_s = 0;
    if (p->prediction) {
        ModelPredicted pred;
        int rc = model_predicted_read(p, &pred, err);
        if (rc)
            return rc;
        *step_s = pred.job_step_s;
        model_predicted_free(&pred);
    }
    if (given) {
        snprintf(limit, cap, "%s", given);
    } else if (*step_s > 0) {
        /* twice the prediction, for a machine slower than its profile and the first steps'
         * warm-up, and 10 minutes to start the ranks, read the plan and build the weights */
        const double minutes = ceil((2.0 * *step_s * steps + 600.0) / 60.0);
        slurm_time(limit, cap, minutes < 1e9 ? (long)minutes : 1000000000L);
    }
    return PX_OK;
}

/* The training length (export_train's first note) and the schedule parallax run trains with: the
 * plan's own, which a recipe's figures do not replace (they are said, with the flags that plan
 * them). */
static void slurm_train_notes(FILE *f, const ModelPlan *p, const ExportTrain *tr)
{
    const ModelJob *j = &p->spec.job;
    const char *e = strchr(tr->notes, '\n');
    fprintf(f, "# %.*s\n", e ? (int)(e - tr->notes) : (int)strlen(tr->notes), tr->notes);
    fprintf(f, "# learning rate: parallax run trains with the plan's: peak %g, minimum %g, warm-up %d, cosine to the\n"
               "# last step\n", j->lr, j->min_lr, j->warmup_steps);
    if (tr->lr != j->lr || tr->min_lr != j->min_lr || tr->warmup != j->warmup_steps)
        fprintf(f, "# WARNING: not the model's published recipe (peak %g, minimum %g, warm-up %d): plan with --lr %g\n"
                   "# --min-lr %g --warmup-steps %d to train with it\n",
                tr->lr, tr->min_lr, tr->warmup, tr->lr, tr->min_lr, tr->warmup);
    else if (j->lr == model_field(MODEL_FIELD_LR)->def || j->warmup_steps == (int)model_field(MODEL_FIELD_WARMUP_STEPS)->def)
        fprintf(f, "# WARNING: parallax's defaults, not tuned for this model: plan with --lr X --min-lr X --warmup-steps N\n");
}

int export_slurm(FILE *f, const ModelPlan *p, const ModelDims *d, const ExportSlurmJob *job, PxError *err)
{
    const ModelSpec *s = &p->spec;
    const ExportSlurmJob none = {NULL, NULL, NULL};
    if (!job)
        job = &none;
    /* the time limit, checked before anything is written */
    char limit[48];
    double step_s;
    ExportTrain tr;
    int rc = export_train(p, d, &tr, err);
    if (rc)
        return rc;
    rc = slurm_limit(p, job->time, tr.iters, limit, sizeof limit, &step_s, err);
    if (rc)
        return rc;
    const int world = p->gpus, cpu = prof_device_is_cpu(&p->profile.device);
    int nodes;
    const int per_node = export_node_size(p, &nodes);
    /* CPU: one core per rank, as the local profile runs and calibrates them (the data loader's
     * thread shares it). GPU: the thread that drives the rank's GPU, its data loader's and
     * NCCL's proxy thread. */
    const int cpus = cpu ? 1 : 3;
    char name[80];
    job_name(name, sizeof name, s->model.name);

    fprintf(f, "#!/bin/bash\n");
    fprintf(f, "# parallax run: %s on %s, %d rank%s (dp %d x tp %d x pp %d x cp %d) on %d node%s, %d steps",
            s->model.name, p->cluster, world, world == 1 ? "" : "s", d->dp, d->t, d->p, d->c, nodes,
            nodes == 1 ? "" : "s", tr.iters);
    if (step_s > 0)
        fprintf(f, " (predicted %.4g s each)", step_s);
    fprintf(f, "\n# sbatch this file; run.json and run.metrics.jsonl land in the directory it is submitted from\n");
    fprintf(f, "#SBATCH --job-name=%s\n", name);
    fprintf(f, "#SBATCH --nodes=%d\n", nodes);
    fprintf(f, "#SBATCH --ntasks=%d\n", world);
    fprintf(f, "#SBATCH --ntasks-per-node=%d\n", per_node);
    fprintf(f, "#SBATCH --cpus-per-task=%d\n", cpus);
    if (!cpu)
        fprintf(f, "#SBATCH --gpus-per-task=1\n");
    if (limit[0])
        fprintf(f, "#SBATCH --time=%s\n", limit);
    else
        fprintf(f, "# no --time: the plan carries no prediction (export with --time)\n");
    slurm_train_notes(f, p, &tr);
    fprintf(f, "set -eu\n\n");
    fprintf(f, "# the same parallax build (parallax-worker beside it) and the same plan on every node\n");
    fprintf(f, "PARALLAX=");
    sh_word(f, job->parallax ? job->parallax : "parallax");
    fprintf(f, "\nPLAN=");
    sh_word(f, job->plan_path ? job->plan_path : "plan.json");
    fprintf(f, "\n\n");
    if (cpu)
        fprintf(f, "# one BLAS thread per rank, on its one core\n"
                   "export PARALLAX_BLAS_THREADS=1 OMP_NUM_THREADS=1\n");
    fprintf(f, "# the ranks join the MPI job through PMIx, which OpenMPI 4 speaks (srun's --mpi; submit with\n"
               "# SLURM_MPI_TYPE set for another)\n"
               "export SLURM_MPI_TYPE=${SLURM_MPI_TYPE:-pmix}\n\n");
    fprintf(f, "# srun is given --cpus-per-task again: Slurm 22.05 does not pass sbatch's on");
    if (!cpu)
        fprintf(f, ". Every rank sees\n# the node's GPUs and takes the one of its rank on the node");
    fprintf(f, "\nsrun --ntasks=%d --cpus-per-task=%d%s \"$PARALLAX\" run \"$PLAN\" --launcher none", world,
            cpus, cpu ? "" : " --gpu-bind=none");
    if (tr.iters != s->job.steps)
        fprintf(f, " --steps %d", tr.iters);
    fprintf(f, "\n");
    return PX_OK;
}
