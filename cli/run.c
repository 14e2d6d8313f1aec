/* parallax run: launches the executor on a plan. parallax-worker, found next to this
 * executable, runs once per rank: directly for a one-rank plan, through mpirun (or srun inside
 * a Slurm allocation) with the plan's world size for several. --launcher chooses: none runs the
 * worker directly whatever the plan, for a job that is already one rank of a launch
 * (mpirun -n 8 parallax run plan.json --launcher none). The trainer's options are checked
 * here with the worker's own table and parser (exec_run_options) and handed to it as given. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "exec/train/train.h"
#include "exec/launch/launch.h"

/* the launcher's own options, which stay here; every other is the trainer's (exec_run_options) */
enum { RUN_LAUNCHER = EXEC_RUN_OPTION_IDS, RUN_HOSTFILE };

static const CliOption launch_options[] = {
    {"launcher", 1, "L", "mpirun, srun or none (default: srun under Slurm, else mpirun; none for one rank)",
     RUN_LAUNCHER, 0},
    {"hostfile", 1, "FILE", "mpirun's hostfile: the nodes the ranks run on and their slots (implies "
     "--launcher mpirun)", RUN_HOSTFILE, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static const char *const run_usage =
    "PLAN.json [--steps N] [-o FILE] [--metrics FILE] [--data FILE] [--quiet] [--launcher L]\n"
    "          [--hostfile FILE]\n"
    "          [--backend B] [--loss-scale S] [--loss-scale-interval N] [--comm-timeout S]\n"
    "          [--fail-rank R --fail-step K]\n"
    "          [--checkpoint-dir DIR [--checkpoint-every N] [--resume]] [--timing op|step]\n\n"
    "Trains the plan for real and measures it under the simulator's names: a progress line\n"
    "per step, a metrics log, and run.json with losses, memory, communication, FLOPs and time\n"
    "per op of every rank. A single-rank plan runs parallax-worker directly; a plan of several\n"
    "ranks starts it with mpirun (--oversubscribe when the ranks outnumber the cores; across the\n"
    "nodes of --hostfile) or, inside a Slurm allocation, srun.";

/* The command line: the trainer's options checked as the worker checks them, the launcher's. */
typedef struct {
    ExecRunArgs run;
    const char *plan;
    const char *launcher_name, *hostfile;
    LaunchKind launcher;
    int world; /* the plan's ranks */
} RunArgs;

static int run_option(void *ctx, int id, const char *arg, PxError *err)
{
    RunArgs *r = ctx;
    switch (id) {
    case RUN_LAUNCHER: r->launcher_name = arg; return launch_kind_parse(arg, &r->launcher, err);
    case RUN_HOSTFILE: r->hostfile = arg; return PX_OK;
    default: return exec_run_option(&r->run, id, arg, err);
    }
}

/* The options and the plan file: -1 to go on, or the exit status. */
static int parse_run(int argc, char **argv, RunArgs *r)
{
    const CliOption *const tables[] = {exec_run_options, launch_options, NULL};
    exec_run_args_init(&r->run);
    r->launcher = LAUNCH_DEFAULT;
    int first;
    int status = cli_parse_with("parallax run", run_usage, argc, argv, tables, 1, run_option, r, &first);
    if (status >= 0)
        return status;
    if (first != argc - 1) {
        fprintf(stderr, "parallax run: expected one plan file (see 'parallax run --help')\n");
        return 2;
    }
    r->plan = argv[first];
    PxError err = {0};
    if (exec_run_args_check(&r->run, &err))
        return cli_fail("run", PX_EINPUT, &err);
    return -1;
}

/* --hostfile: readable, and for mpirun. */
static int check_hostfile(const RunArgs *r)
{
    if (r->hostfile && r->launcher != LAUNCH_DEFAULT && r->launcher != LAUNCH_MPIRUN) {
        fprintf(stderr, "parallax run: --hostfile is for --launcher mpirun, not %s (srun runs on "
                        "the nodes of its Slurm allocation)\n", r->launcher_name);
        return 2;
    }
    if (r->hostfile && access(r->hostfile, R_OK) != 0) {
        fprintf(stderr, "parallax run: --hostfile %s: cannot read it (%s)\n", r->hostfile,
                strerror(errno));
        return 2;
    }
    return -1;
}

/* The plan's world (the plan is read here for it), and --fail-rank within it. */
static int check_world(RunArgs *r)
{
    PxError err = {0};
    ModelPlan plan = {0};
    /* only the world size is wanted here: the worker reads the plan again and warns about it */
    const int was_quiet = px_log_set_quiet(1);
    int rc = model_plan_read(r->plan, &plan, &err);
    px_log_set_quiet(was_quiet);
    r->world = rc ? 1 : plan.gpus;
    model_plan_free(&plan);
    if (rc)
        return cli_fail("run", rc, &err);
    const int fail_rank = r->run.opt.fail_rank;
    if (r->run.fail_rank && fail_rank >= r->world) {
        fprintf(stderr, "parallax run: --fail-rank %d: the plan has %d rank%s (0 to %d)\n",
                fail_rank, r->world, r->world == 1 ? "" : "s", r->world - 1);
        return 2;
    }
    return -1;
}

/* The worker's command line: `run`, then the user's arguments as given but the launcher's own
 * options. getopt_long has put the options first (the plan file after them), so a second scan
 * of argv sees each option's words end at optind and keeps those of the trainer's. */
typedef struct {
    char **argv;
    int next; /* the first word not yet kept or dropped */
    const char **out;
    int n;
} WorkerArgs;

static int keep_option(void *ctx, int id, const char *arg, PxError *err)
{
    (void)arg, (void)err;
    WorkerArgs *w = ctx;
    for (; w->next < optind; w->next++)
        if (id != RUN_LAUNCHER && id != RUN_HOSTFILE)
            w->out[w->n++] = w->argv[w->next];
    return PX_OK;
}

static int worker_args(int argc, char **argv, const char **wargv)
{
    const CliOption *const tables[] = {exec_run_options, launch_options, NULL};
    WorkerArgs w = {argv, 1, wargv, 0};
    PxError err = {0};
    int first;
    w.out[w.n++] = "run";
    int rc = px_opts_parse(tables, argc, argv, NULL, keep_option, &w, 1, &first, &err);
    for (; w.next < argc; w.next++) /* a "--" that ended the options, and the plan */
        w.out[w.n++] = argv[w.next];
    w.out[w.n] = NULL;
    return rc;
}

/* Starts the worker on the plan's ranks with argv's options: its exit status, or 1 when the
 * job died. */
static int launch(const RunArgs *r, int argc, char **argv)
{
    const char **wargv = calloc((size_t)argc + 2, sizeof *wargv);
    PxError err = {0};
    int status = 0;
    int rc = wargv ? worker_args(argc, argv, wargv) : px_fail(&err, PX_ERUNTIME, "out of memory");
    LaunchJob l = {r->launcher, r->world, r->plan, r->hostfile};
    if (!rc)
        rc = launch_worker(&l, wargv, &status, &err);
    free(wargv);
    if (rc) {
        status = cli_fail("run", rc, &err);
    } else if (status > 2) {
        /* the launcher's own status when a rank died (mpirun: 128 + the signal): the job
         * failed, as the lines above say which rank and where */
        fprintf(stderr, "parallax run: the job ended abnormally (the launcher exited with status "
                        "%d): a rank died or was lost; its message above names it\n", status);
        status = 1;
    }
    return status;
}

int cli_cmd_run(int argc, char **argv)
{
    RunArgs r = {0};
    int status = parse_run(argc, argv, &r);
    if (status < 0)
        status = check_hostfile(&r);
    if (status < 0)
        status = check_world(&r);
    return status >= 0 ? status : launch(&r, argc, argv);
}
