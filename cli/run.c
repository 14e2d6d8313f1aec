/* parallax run: launches the executor on a plan. parallax-worker, found next to this
 * executable, runs once per rank: directly for a one-rank plan, through mpirun (or srun inside
 * a Slurm allocation) with the plan's world size for several. --launcher chooses: none runs the
 * worker directly whatever the plan, for a job that is already one rank of a launch
 * (mpirun -n 8 parallax run plan.json --launcher none). --backend and the fp16 loss-scale
 * options are checked here and passed through to the worker. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "exec/train/train.h"
#include "exec/launch/launch.h"

enum { RUN_STEPS = CLI_EXTRA, RUN_METRICS, RUN_DATA, RUN_QUIET, RUN_LAUNCHER, RUN_BACKEND,
       RUN_LOSS_SCALE, RUN_LOSS_SCALE_INTERVAL,
       RUN_COMM_TIMEOUT, RUN_FAIL_RANK, RUN_FAIL_STEP };
/* checkpoints (ids from the end of the extra range, apart from the options above) */
enum { RUN_CHECKPOINT_DIR = CLI_EXTRA_MAX - 3, RUN_CHECKPOINT_EVERY, RUN_RESUME };
/* launching across nodes (apart again) */
enum { RUN_HOSTFILE = CLI_EXTRA_MAX - 4 };
enum { RUN_TIMING = RUN_FAIL_STEP + 1 };

static const CliOption run_options[] = {
    {"steps", 1, "N", "training steps (default: the plan's training.steps)", RUN_STEPS, 0},
    {"output", 1, "FILE", "run.json to write (default run.json)", CLI_OUTPUT, 'o'},
    {"metrics", 1, "FILE", "JSON-lines log of every step (default: run.metrics.jsonl beside -o)",
     RUN_METRICS, 0},
    {"data", 1, "FILE", "text file (byte tokens) or llm.c .bin tokens (default: the built-in text)",
     RUN_DATA, 0},
    {"quiet", 0, NULL, "no progress lines", RUN_QUIET, 0},
    {"launcher", 1, "L", "mpirun, srun or none (default: srun under Slurm, else mpirun; none for one rank)",
     RUN_LAUNCHER, 0},
    {"hostfile", 1, "FILE", "mpirun's hostfile: the nodes the ranks run on and their slots (implies "
     "--launcher mpirun)", RUN_HOSTFILE, 0},
    {"backend", 1, "B", "cpu, cuda or auto (default auto: cuda when the plan's cluster has GPUs)",
     RUN_BACKEND, 0},
    {"loss-scale", 1, "S", "fp16: the initial loss scale (default 65536)", RUN_LOSS_SCALE, 0},
    {"loss-scale-interval", 1, "N", "fp16: clean steps before the loss scale doubles (default 2000)",
     RUN_LOSS_SCALE_INTERVAL, 0},
    {"comm-timeout", 1, "S", "end the job when a communication waits longer than S seconds "
     "(default 600; 0: no limit)", RUN_COMM_TIMEOUT, 0},
    {"fail-rank", 1, "R", "with --fail-step: rank R dies (SIGKILL) as a lost node (tests)",
     RUN_FAIL_RANK, 0},
    {"fail-step", 1, "K", "the step at whose start --fail-rank dies", RUN_FAIL_STEP, 0},
    /* checkpoints */
    {"checkpoint-dir", 1, "DIR", "where checkpoints are written and resumed from", RUN_CHECKPOINT_DIR, 0},
    {"checkpoint-every", 1, "N", "write a checkpoint every N steps (needs --checkpoint-dir)",
     RUN_CHECKPOINT_EVERY, 0},
    {"resume", 0, NULL, "continue from the latest complete checkpoint in --checkpoint-dir",
     RUN_RESUME, 0},
    {"timing", 1, "T", "op (default: every op timed) or step (one wait for the device per step)",
     RUN_TIMING, 0},
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

/* The command line, checked: every value is passed through to the worker as given. */
typedef struct {
    const char *plan, *output, *steps, *metrics, *data, *backend, *loss_scale, *loss_interval;
    const char *comm_timeout, *fail_rank, *fail_step; /* failures */
    const char *ck_dir, *ck_every;                    /* checkpoints */
    const char *hostfile;                             /* mpirun's */
    const char *timing;
    int quiet, resume;
    LaunchKind launcher;
    int world; /* the plan's ranks */
} RunArgs;

/* The options and the plan file: -1 to go on, or the exit status. */
static int parse_run(int argc, char **argv, CliArgs *a, RunArgs *r)
{
    const CliOption *const tables[] = {run_options, NULL};
    int status = cli_parse("run", run_usage, argc, argv, tables, 1, a);
    if (status >= 0)
        return status;
    r->plan = a->positional[0];
    r->output = a->output;
    r->steps = a->extra[RUN_STEPS - CLI_EXTRA];
    r->metrics = a->extra[RUN_METRICS - CLI_EXTRA];
    r->data = a->extra[RUN_DATA - CLI_EXTRA];
    r->quiet = a->extra[RUN_QUIET - CLI_EXTRA] != NULL;
    r->backend = a->extra[RUN_BACKEND - CLI_EXTRA];
    r->loss_scale = a->extra[RUN_LOSS_SCALE - CLI_EXTRA];
    r->loss_interval = a->extra[RUN_LOSS_SCALE_INTERVAL - CLI_EXTRA];
    r->timing = a->extra[RUN_TIMING - CLI_EXTRA];
    if (a->n_positional != 1) {
        fprintf(stderr, "parallax run: expected one plan file (see 'parallax run --help')\n");
        return 2;
    }
    return -1;
}

/* --steps, --launcher, --backend and the fp16 loss-scale options. */
static int check_values(const CliArgs *a, RunArgs *r)
{
    PxError err = {0};
    int n_steps = 0, interval = 0;
    double scale = 0;
    const char *launcher = a->extra[RUN_LAUNCHER - CLI_EXTRA];
    ExecBackend be = EXEC_BACKEND_AUTO;
    r->launcher = LAUNCH_DEFAULT;
    if (r->steps && px_parse_int(r->steps, "--steps", 1, 1 << 30, &n_steps, &err))
        return cli_fail("run", PX_EINPUT, &err);
    if (launcher && launch_kind_parse(launcher, &r->launcher, &err))
        return cli_fail("run", PX_EINPUT, &err);
    r->hostfile = a->extra[RUN_HOSTFILE - CLI_EXTRA];
    if (r->hostfile && r->launcher != LAUNCH_DEFAULT && r->launcher != LAUNCH_MPIRUN) {
        fprintf(stderr, "parallax run: --hostfile is for --launcher mpirun, not %s (srun runs on "
                        "the nodes of its Slurm allocation)\n", launcher);
        return 2;
    }
    if (r->hostfile && access(r->hostfile, R_OK) != 0) {
        fprintf(stderr, "parallax run: --hostfile %s: cannot read it (%s)\n", r->hostfile,
                strerror(errno));
        return 2;
    }
    if (r->backend && exec_backend_parse(r->backend, &be, &err))
        return cli_fail("run", PX_EINPUT, &err);
    if (r->loss_scale && (px_parse_double(r->loss_scale, "--loss-scale", &scale, &err) ||
                          !(scale >= 1.0 && scale <= 0x1p100))) {
        fprintf(stderr, "parallax run: --loss-scale: expected a number from 1 to 2^100, got '%s'\n",
                r->loss_scale);
        return 2;
    }
    if (r->loss_interval &&
        px_parse_int(r->loss_interval, "--loss-scale-interval", 1, 1 << 30, &interval, &err))
        return cli_fail("run", PX_EINPUT, &err);
    if (r->timing && strcmp(r->timing, "op") && strcmp(r->timing, "step")) {
        fprintf(stderr, "parallax run: --timing: expected op or step, got '%s'\n", r->timing);
        return 2;
    }
    return -1;
}

/* The failure options, the rank against the plan's world too (which is read here). */
static int check_failures(const CliArgs *a, RunArgs *r)
{
    PxError err = {0};
    r->comm_timeout = a->extra[RUN_COMM_TIMEOUT - CLI_EXTRA];
    r->fail_rank = a->extra[RUN_FAIL_RANK - CLI_EXTRA];
    r->fail_step = a->extra[RUN_FAIL_STEP - CLI_EXTRA];
    ExecOptions fo;
    memset(&fo, 0, sizeof fo);
    if (exec_failure_parse(r->comm_timeout, r->fail_rank, r->fail_step, &fo, &err))
        return cli_fail("run", PX_EINPUT, &err);
    ModelPlan plan = {0};
    /* only the world size is wanted here: the worker reads the plan again and warns about it */
    const int was_quiet = px_log_set_quiet(1);
    int rc = model_plan_read(r->plan, &plan, &err);
    px_log_set_quiet(was_quiet);
    r->world = rc ? 1 : plan.gpus;
    model_plan_free(&plan);
    if (rc)
        return cli_fail("run", rc, &err);
    if (r->fail_rank && fo.fail_rank >= r->world) {
        fprintf(stderr, "parallax run: --fail-rank %d: the plan has %d rank%s (0 to %d)\n",
                fo.fail_rank, r->world, r->world == 1 ? "" : "s", r->world - 1);
        return 2;
    }
    return -1;
}

/* --checkpoint-dir with --checkpoint-every N or --resume, and neither without it. */
static int check_checkpoints(const CliArgs *a, RunArgs *r)
{
    PxError err = {0};
    r->ck_dir = a->extra[RUN_CHECKPOINT_DIR - CLI_EXTRA];
    r->ck_every = a->extra[RUN_CHECKPOINT_EVERY - CLI_EXTRA];
    r->resume = a->extra[RUN_RESUME - CLI_EXTRA] != NULL;
    int every = 0;
    if (r->ck_every && px_parse_int(r->ck_every, "--checkpoint-every", 1, 1 << 30, &every, &err))
        return cli_fail("run", PX_EINPUT, &err);
    if ((r->ck_every || r->resume) && !r->ck_dir) {
        fprintf(stderr, "parallax run: %s needs --checkpoint-dir DIR\n",
                r->resume ? "--resume" : "--checkpoint-every");
        return 2;
    }
    if (r->ck_dir && !r->ck_every && !r->resume) {
        fprintf(stderr, "parallax run: --checkpoint-dir %s: give --checkpoint-every N to write "
                        "checkpoints, or --resume to continue from one\n", r->ck_dir);
        return 2;
    }
    return -1;
}

/* The worker's command line: `run PLAN` and every option given, as given. */
static void worker_args(const RunArgs *r, const char *wargv[32])
{
    const struct {
        const char *flag, *value;
        int given; /* a flag without a value (value NULL) when given */
    } pass[] = {{"--steps", r->steps, r->steps != NULL},
                {"--output", r->output, r->output != NULL},
                {"--metrics", r->metrics, r->metrics != NULL},
                {"--data", r->data, r->data != NULL},
                {"--quiet", NULL, r->quiet},
                {"--backend", r->backend, r->backend != NULL},
                {"--loss-scale", r->loss_scale, r->loss_scale != NULL},
                {"--loss-scale-interval", r->loss_interval, r->loss_interval != NULL},
                {"--comm-timeout", r->comm_timeout, r->comm_timeout != NULL},
                {"--fail-rank", r->fail_rank, r->fail_rank != NULL},
                {"--fail-step", r->fail_step, r->fail_rank != NULL},
                {"--checkpoint-dir", r->ck_dir, r->ck_dir != NULL},
                {"--checkpoint-every", r->ck_every, r->ck_every != NULL},
                {"--resume", NULL, r->resume},
                {"--timing", r->timing, r->timing != NULL}};
    int n = 0;
    wargv[n++] = "run";
    wargv[n++] = r->plan;
    for (size_t i = 0; i < sizeof pass / sizeof pass[0]; i++) {
        if (!pass[i].given)
            continue;
        wargv[n++] = pass[i].flag;
        if (pass[i].value)
            wargv[n++] = pass[i].value;
    }
    wargv[n] = NULL;
}

/* Starts the worker on the plan's ranks: its exit status, or 1 when the job died. */
static int launch(const RunArgs *r)
{
    const char *wargv[32];
    worker_args(r, wargv);
    PxError err = {0};
    int status = 0;
    LaunchJob l = {r->launcher, r->world, r->plan, r->hostfile};
    int rc = launch_worker(&l, wargv, &status, &err);
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
    CliArgs a = {0};
    RunArgs r = {0};
    int status = parse_run(argc, argv, &a, &r);
    if (status < 0)
        status = check_values(&a, &r);
    if (status < 0)
        status = check_failures(&a, &r);
    if (status < 0)
        status = check_checkpoints(&a, &r);
    return status >= 0 ? status : launch(&r);
}
