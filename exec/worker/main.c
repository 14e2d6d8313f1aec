/* parallax-worker — the executor's program, one process per rank: `parallax-worker run PLAN.json`
 * trains the plan on this process and writes run.json; `parallax-worker calibrate --part P` runs
 * one part of a calibration. `parallax run` and `parallax calibrate` start it: directly for one
 * rank, through mpirun or srun for several (rank 0 prints and writes).
 *
 * Failures: an error every rank meets before training (a bad plan, a world that does not match
 * it, a bad data file) is agreed on, printed once by the first rank that had it, and every rank
 * exits with its status. An error of one rank during training or a calibration part ends the
 * whole job with MPI_Abort, its message naming the rank, so no rank is left waiting in a
 * collective. Exit status 0 ok, 1 runtime failure, 2 bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/calibrate/calibrate.h"
#include "exec/comm/comm.h"
#include "exec/train/train.h"

/* This process's place in the job: only rank 0 prints what every rank would say alike. */
typedef struct {
    int rank, world;
} Job;

static int exit_code(int status) { return status == PX_EINPUT ? 2 : status ? 1 : 0; }

/* ---- the commands ---- */

typedef struct {
    const char *name, *usage, *help;
} Command;

static const Command commands[] = {
    {"run", "run PLAN.json [options]", "train the plan on this process and write run.json"},
    {"calibrate", "calibrate --part compute|comm|assemble|probe -o FILE [options] [PARTS...]",
     "one part of `parallax calibrate` (which runs them in turn)"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void top_help(FILE *f)
{
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "%s parallax-worker %s\n", i == 0 ? "usage:" : "      ", commands[i].usage);
    fprintf(f, "\nThe executor's program, one process per rank: `parallax run` and `parallax "
               "calibrate`\nstart it.\n\ncommands:\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-22s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n'parallax-worker COMMAND --help' lists a command's options.\n");
}

/* A command's --help from its option table: its usage line, what it does, its options. */
static void command_help(const Command *c, const char *about, const PxOption *const *tables)
{
    char usage[1024];
    snprintf(usage, sizeof usage, "parallax-worker %s\n\n%s", c->usage, about);
    px_opts_help(stdout, usage, tables);
}

/* ---- run ---- */

static const char *const run_about =
    "Trains the plan on this process and writes run.json: losses, memory per category,\n"
    "FLOPs and time per op under the simulator's names.";

/* `run`'s command line into a, with the run options' table and parser (`parallax run` checked
 * the same before it started this): -1 to go on, else the exit status (help: 0, bad input: 2;
 * rank 0 says why). */
static int run_parse(const Job *job, int argc, char **argv, ExecRunArgs *a)
{
    static const PxOption *const tables[] = {exec_run_options, NULL};
    PxError err = {0};
    int first;
    int rc = px_opts_parse(tables, argc, argv, "(see --help)", exec_run_option, a, 1, &first, &err);
    if (rc == PX_OPTS_HELP) {
        if (job->rank == 0)
            command_help(&commands[0], run_about, tables);
        return 0;
    }
    if (!rc && first != argc - 1)
        rc = px_fail(&err, PX_EINPUT, "expected one plan file (see --help)");
    if (!rc)
        rc = exec_run_args_check(a, &err);
    if (rc) {
        if (job->rank == 0)
            fprintf(stderr, "parallax-worker run: %s\n", err.msg);
        return rc;
    }
    a->opt.plan_path = argv[first];
    return -1;
}

/* The message of an error all ranks agreed on: printed once, by the first rank that had it. */
static int agreed(const Job *job, int rc, const PxError *err)
{
    int first = 0;
    int worst = job->world > 1 ? comm_mpi_agree(rc, &first) : rc;
    const int says = job->world == 1 ? job->rank == 0 : rc && first == job->rank;
    if (worst && says) {
        if (job->world > 1)
            fprintf(stderr, "parallax-worker run: rank %d of %d: %s\n", job->rank, job->world,
                    err->msg);
        else
            fprintf(stderr, "parallax-worker run: %s\n", err->msg);
    }
    return worst;
}

/* The plan, its backend and the job's communication layer, every rank agreeing on failures. */
static int run_setup(const Job *job, ModelPlan *plan, ExecOptions *opt, CommLayer **comm,
                     PxError *err)
{
    /* every rank reads the same file: rank 0 alone warns about it */
    const int was_quiet = job->rank != 0 ? px_log_set_quiet(1) : -1;
    int rc = model_plan_read(opt->plan_path, plan, err);
    if (was_quiet >= 0)
        px_log_set_quiet(was_quiet);
    if ((rc = agreed(job, rc, err)))
        return rc;
    /* the backend decides the communication layer; exec_init resolves it again itself, so that
     * its refusals say whether the backend was asked for or followed from the plan */
    ExecBackend backend = opt->backend;
    if ((rc = agreed(job, exec_backend_for_plan(plan, opt->backend, &backend, err), err)))
        return rc;
    if (job->world > 1) {
        const ModelSpec *s = &plan->spec;
        /* the first and last stages sum a tied output layer's or the prediction modules'
         * copy of the embedding (exec/train/mtp.c) */
        const ModelLayout *l = &s->layout;
        int tied_pair = (s->model.tied_embeddings || s->model.mtp_layers > 0) && l->pp * l->vpp > 1;
        /* a tied model whose modules sit on a stage of their own after the first: a third copy
         * there (comm_mpi's tied_pair 2) */
        if (tied_pair && s->model.tied_embeddings && s->model.mtp_layers > 0 &&
            l->mtp_from_last > 0 && (l->pp * l->vpp - 1 - l->mtp_from_last) % l->pp != 0)
            tied_pair = 2;
        rc = agreed(job, comm_for_job(s, tied_pair, backend == EXEC_BACKEND_CUDA, comm,
                                      &opt->comm_note, err),
                    err);
        opt->comm = *comm;
    }
    return rc;
}

static int cmd_run(const Job *job, int argc, char **argv)
{
    ExecRunArgs a;
    exec_run_args_init(&a);
    int status = run_parse(job, argc, argv, &a);
    if (status >= 0)
        return status;
    PxError err = {0};
    ModelPlan plan;
    memset(&plan, 0, sizeof plan);
    CommLayer *comm = NULL;
    Exec *ex = NULL;
    int rc = run_setup(job, &plan, &a.opt, &comm, &err);
    if (!rc && !(rc = agreed(job, exec_init(&ex, &plan, &a.opt, &err), &err))) {
        rc = exec_run(ex, &err);
        if (rc && job->world > 1 && !exec_error_is_collective(ex)) {
            /* only this rank failed: the others may be waiting for it in a collective */
            fprintf(stderr, "parallax-worker run: rank %d of %d: %s (ending the job)\n", job->rank,
                    job->world, err.msg);
            fflush(stderr);
            comm_mpi_abort(exit_code(rc));
        }
        if (rc && job->rank == 0)
            fprintf(stderr, "parallax-worker run: %s\n", err.msg);
    }
    exec_free(ex);
    comm_free(comm);
    model_plan_free(&plan);
    return exit_code(rc);
}

/* ---- calibrate ---- */

enum { CAL_PART, CAL_OUTPUT, CAL_MODELS, CAL_BASE, CAL_BACKEND, CAL_QUICK, CAL_SAMPLES,
       CAL_QUIET };

static const PxOption calibrate_options[] = {
    {"part", 1, "P", "compute, comm, assemble or probe (required)", CAL_PART, 0},
    {"output", 1, "FILE", "the part's JSON, or the profile (assemble)", CAL_OUTPUT, 'o'},
    {"models", 1, "LIST", "calibration models, comma-separated (default tiny,tiny-llama)",
     CAL_MODELS, 0},
    {"base", 1, "PROFILE", "cluster profile the measurements extend (default local)", CAL_BASE, 0},
    {"backend", 1, "B", "cpu or cuda (default cpu)", CAL_BACKEND, 0},
    {"quick", 0, NULL, "fewer shapes, sizes and repetitions", CAL_QUICK, 0},
    {"samples", 1, "FILE",
     "compute: write every op sample (seconds per call against its bytes or FLOPs) as CSV, to "
     "look at the fits",
     CAL_SAMPLES, 0},
    {"quiet", 0, NULL, "no progress lines", CAL_QUIET, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static const char *const calibrate_about =
    "One part of `parallax calibrate` (which runs them in turn; see its --help):\n"
    "  compute   time GEMMs and train the calibration models on every rank at once\n"
    "  comm      time collectives over the ranks through the MPI layer\n"
    "  assemble  write the cluster profile from the parts' files (one rank)\n"
    "  probe     the device's GEMM rate and streaming bandwidth alone, as compute measures them\n"
    "            (one rank; `parallax validate` compares them with the profile's)";

/* What `calibrate` was given: the options, and --part as text until it is checked. */
typedef struct {
    CalibOptions *o;
    const char *part;
} CalibArgs;

static int calibrate_option(void *ctx, int id, const char *arg, PxError *err)
{
    (void)err;
    CalibArgs *a = ctx;
    CalibOptions *o = a->o;
    switch (id) {
    case CAL_PART: a->part = arg; break;
    case CAL_OUTPUT: o->output = arg; break;
    case CAL_MODELS: o->models = arg; break;
    case CAL_BASE: o->base = arg; break;
    case CAL_BACKEND: o->backend = arg; break;
    case CAL_QUICK: o->quick = 1; break;
    case CAL_SAMPLES: o->samples = arg; break;
    case CAL_QUIET: o->quiet = 1; break;
    default: break;
    }
    return PX_OK;
}

/* The part files are the operands, after every option: getopt_long moved any that stood
 * between the options to the end, which comparing with argv before parsing (orig) tells. */
static int parts_last(char *const *orig, int argc, char *const *argv, int first)
{
    for (int i = first; i < argc; i++)
        if (orig[i] != argv[i])
            return 0;
    return 1;
}

/* The part and the options together, once parsed. */
static int calibrate_check(const Job *job, const char *part, CalibOptions *o, PxError *err)
{
    int rc = part ? calib_part_parse(part, &o->part, err)
                  : px_fail(err, PX_EINPUT, "--part is required");
    if (!rc)
        rc = calib_options_check(o, job->world, err);
    if (rc) {
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof err->msg - n, " (see --help)");
    }
    return rc;
}

/* `calibrate`'s command line into o: -1 to go on, else the exit status (rank 0 says why). */
static int calibrate_parse(const Job *job, int argc, char **argv, CalibOptions *o)
{
    static const PxOption *const tables[] = {calibrate_options, NULL};
    char **orig = calloc((size_t)argc + 1, sizeof *orig);
    if (!orig) {
        fprintf(stderr, "parallax-worker calibrate: out of memory\n");
        return 1;
    }
    memcpy(orig, argv, (size_t)argc * sizeof *orig);
    PxError err = {0};
    CalibArgs a = {o, NULL};
    int first;
    int rc = px_opts_parse(tables, argc, argv, "(see --help)", calibrate_option, &a, -1, &first,
                           &err);
    if (rc == PX_OPTS_HELP) {
        free(orig);
        if (job->rank == 0)
            command_help(&commands[1], calibrate_about, tables);
        return 0;
    }
    o->parts = (const char *const *)argv + first;
    o->n_parts = argc - first;
    if (!rc && !parts_last(orig, argc, argv, first))
        rc = px_fail(&err, PX_EINPUT, "the part files go last");
    if (!rc)
        rc = calibrate_check(job, a.part, o, &err);
    free(orig);
    if (rc && job->rank == 0)
        fprintf(stderr, "parallax-worker calibrate: %s\n", err.msg);
    return rc ? rc : -1;
}

static int cmd_calibrate(const Job *job, int argc, char **argv)
{
    CalibOptions o;
    calib_options_defaults(&o);
    int status = calibrate_parse(job, argc, argv, &o);
    if (status >= 0)
        return status;
    PxError err = {0};
    int rc = calib_part_run(&o, job->world, &err);
    if (rc && job->world > 1) {
        /* a rank failing alone must not leave the others in a collective */
        fprintf(stderr, "parallax-worker calibrate: rank %d of %d: %s\n", job->rank, job->world,
                err.msg);
        fflush(stderr);
        comm_mpi_abort(exit_code(rc));
    }
    if (rc)
        fprintf(stderr, "parallax-worker calibrate: %s\n", err.msg);
    return exit_code(rc);
}

int main(int argc, char **argv)
{
    /* one rank of an MPI job (mpirun, srun), or a process on its own */
    Job job = {0, 1};
    int mpi = comm_mpi_start(&argc, &argv, &job.rank, &job.world);
    int status;
    const char *cmd = argc >= 2 ? argv[1] : NULL;
    if (cmd && !strcmp(cmd, "run")) {
        status = cmd_run(&job, argc - 1, argv + 1);
    } else if (cmd && !strcmp(cmd, "calibrate")) {
        status = cmd_calibrate(&job, argc - 1, argv + 1);
    } else if (cmd && (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))) {
        if (job.rank == 0)
            top_help(stdout);
        status = 0;
    } else {
        if (job.rank == 0) {
            if (cmd)
                fprintf(stderr, "parallax-worker: unknown command '%s' (run or calibrate)\n", cmd);
            top_help(stderr);
        }
        status = 2;
    }
    if (mpi)
        comm_mpi_finish();
    return status;
}
