/* parallax run: launches the executor on a plan. parallax-worker, found next to this
 * executable, runs once per rank: directly for a one-rank plan, through mpirun (or srun inside
 * a Slurm allocation) with the plan's world size for several. --launcher chooses: none runs the
 * worker directly whatever the plan, for a job that is already one rank of a launch
 * (mpirun -n 8 parallax run plan.json --launcher none). --backend and the fp16 loss-scale
 * options are checked here and passed through to the worker. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "exec/exec.h"
#include "exec/launch/launch.h"

enum { RUN_STEPS = CLI_EXTRA, RUN_METRICS, RUN_DATA, RUN_QUIET, RUN_LAUNCHER, RUN_BACKEND,
       RUN_LOSS_SCALE, RUN_LOSS_SCALE_INTERVAL,
       RUN_COMM_TIMEOUT, RUN_FAIL_RANK, RUN_FAIL_STEP };
/* checkpoints (ids from the end of the extra range, apart from the options above) */
enum { RUN_CHECKPOINT_DIR = CLI_EXTRA_MAX - 3, RUN_CHECKPOINT_EVERY, RUN_RESUME };

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
    {NULL, 0, NULL, NULL, 0, 0}};

static const char *const run_usage =
    "PLAN.json [--steps N] [-o FILE] [--metrics FILE] [--data FILE] [--quiet] [--launcher L]\n"
    "          [--backend B] [--loss-scale S] [--loss-scale-interval N] [--comm-timeout S]\n"
    "          [--fail-rank R --fail-step K]\n"
    "          [--checkpoint-dir DIR [--checkpoint-every N] [--resume]]\n\n"
    "Trains the plan for real and measures it under the simulator's names: a progress line\n"
    "per step, a metrics log, and run.json with losses, memory, communication, FLOPs and time\n"
    "per op of every rank. A single-rank plan runs parallax-worker directly; a plan of several\n"
    "ranks starts it with mpirun (--oversubscribe when the ranks outnumber the cores) or, inside\n"
    "a Slurm allocation, srun.";

int cli_cmd_run(int argc, char **argv)
{
    CliArgs a = {0};
    const CliOption *const tables[] = {run_options, NULL};
    int status = cli_parse("run", run_usage, argc, argv, tables, 1, &a);
    const char *steps = NULL, *metrics = NULL, *data = NULL, *launcher_name = NULL;
    const char *backend = NULL, *loss_scale = NULL, *loss_interval = NULL;
    int quiet = 0;
    if (status < 0) {
        steps = a.extra[RUN_STEPS - CLI_EXTRA];
        metrics = a.extra[RUN_METRICS - CLI_EXTRA];
        data = a.extra[RUN_DATA - CLI_EXTRA];
        quiet = a.extra[RUN_QUIET - CLI_EXTRA] != NULL;
        launcher_name = a.extra[RUN_LAUNCHER - CLI_EXTRA];
        backend = a.extra[RUN_BACKEND - CLI_EXTRA];
        loss_scale = a.extra[RUN_LOSS_SCALE - CLI_EXTRA];
        loss_interval = a.extra[RUN_LOSS_SCALE_INTERVAL - CLI_EXTRA];
        if (a.n_positional != 1) {
            fprintf(stderr, "parallax run: expected one plan file (see 'parallax run --help')\n");
            status = 2;
        }
    }
    PxError err = {0};
    int n_steps = 0;
    if (status < 0 && steps && px_parse_int(steps, "--steps", 1, 1 << 30, &n_steps, &err)) {
        fprintf(stderr, "parallax run: %s\n", err.msg);
        status = 2;
    }
    LaunchKind launcher = LAUNCH_DEFAULT;
    if (status < 0 && launcher_name && launch_kind_parse(launcher_name, &launcher, &err)) {
        fprintf(stderr, "parallax run: %s\n", err.msg);
        status = 2;
    }
    ExecBackend be = EXEC_BACKEND_AUTO;
    if (status < 0 && backend && exec_backend_parse(backend, &be, &err)) {
        fprintf(stderr, "parallax run: %s\n", err.msg);
        status = 2;
    }
    double scale = 0;
    if (status < 0 && loss_scale &&
        (px_parse_double(loss_scale, "--loss-scale", &scale, &err) || !(scale >= 1.0 && scale <= 0x1p100))) {
        fprintf(stderr, "parallax run: --loss-scale: expected a number from 1 to 2^100, got '%s'\n",
                loss_scale);
        status = 2;
    }
    int interval = 0;
    if (status < 0 && loss_interval &&
        px_parse_int(loss_interval, "--loss-scale-interval", 1, 1 << 30, &interval, &err)) {
        fprintf(stderr, "parallax run: %s\n", err.msg);
        status = 2;
    }
    /* failures: checked here (the rank against the plan's world too), passed on */
    const char *comm_timeout = status < 0 ? a.extra[RUN_COMM_TIMEOUT - CLI_EXTRA] : NULL;
    const char *fail_rank = status < 0 ? a.extra[RUN_FAIL_RANK - CLI_EXTRA] : NULL;
    const char *fail_step = status < 0 ? a.extra[RUN_FAIL_STEP - CLI_EXTRA] : NULL;
    ExecOptions fo;
    memset(&fo, 0, sizeof fo);
    if (status < 0 && exec_failure_parse(comm_timeout, fail_rank, fail_step, &fo, &err)) {
        fprintf(stderr, "parallax run: %s\n", err.msg);
        status = 2;
    }
    ModelPlan plan = {0};
    int world = 1;
    if (status < 0) {
        int rc = model_plan_read(a.positional[0], &plan, &err);
        if (rc) {
            fprintf(stderr, "parallax run: %s\n", err.msg);
            status = rc == PX_EINPUT ? 2 : 1;
        } else {
            world = plan.gpus;
        }
        model_plan_free(&plan);
        if (status < 0 && fail_rank && fo.fail_rank >= world) {
            fprintf(stderr, "parallax run: --fail-rank %d: the plan has %d rank%s (0 to %d)\n",
                    fo.fail_rank, world, world == 1 ? "" : "s", world - 1);
            status = 2;
        }
    }
    /* checkpoints: checked here, passed on */
    const char *ck_dir = NULL, *ck_every = NULL;
    int resume = 0;
    if (status < 0) {
        ck_dir = a.extra[RUN_CHECKPOINT_DIR - CLI_EXTRA];
        ck_every = a.extra[RUN_CHECKPOINT_EVERY - CLI_EXTRA];
        resume = a.extra[RUN_RESUME - CLI_EXTRA] != NULL;
        int every = 0;
        if (ck_every && px_parse_int(ck_every, "--checkpoint-every", 1, 1 << 30, &every, &err)) {
            fprintf(stderr, "parallax run: %s\n", err.msg);
            status = 2;
        } else if ((ck_every || resume) && !ck_dir) {
            fprintf(stderr, "parallax run: %s needs --checkpoint-dir DIR\n",
                    resume ? "--resume" : "--checkpoint-every");
            status = 2;
        } else if (ck_dir && !ck_every && !resume) {
            fprintf(stderr, "parallax run: --checkpoint-dir %s: give --checkpoint-every N to write "
                            "checkpoints, or --resume to continue from one\n", ck_dir);
            status = 2;
        }
    }
    if (status >= 0)
        return status;

    const char *wargv[32];
    int n = 0;
    wargv[n++] = "run";
    wargv[n++] = a.positional[0];
    if (steps) {
        wargv[n++] = "--steps";
        wargv[n++] = steps;
    }
    if (a.output) {
        wargv[n++] = "--output";
        wargv[n++] = a.output;
    }
    if (metrics) {
        wargv[n++] = "--metrics";
        wargv[n++] = metrics;
    }
    if (data) {
        wargv[n++] = "--data";
        wargv[n++] = data;
    }
    if (quiet)
        wargv[n++] = "--quiet";
    if (backend) {
        wargv[n++] = "--backend";
        wargv[n++] = backend;
    }
    if (loss_scale) {
        wargv[n++] = "--loss-scale";
        wargv[n++] = loss_scale;
    }
    if (loss_interval) {
        wargv[n++] = "--loss-scale-interval";
        wargv[n++] = loss_interval;
    }
    if (comm_timeout) {
        wargv[n++] = "--comm-timeout";
        wargv[n++] = comm_timeout;
    }
    if (fail_rank) {
        wargv[n++] = "--fail-rank";
        wargv[n++] = fail_rank;
        wargv[n++] = "--fail-step";
        wargv[n++] = fail_step;
    }
    /* checkpoints */
    if (ck_dir) {
        wargv[n++] = "--checkpoint-dir";
        wargv[n++] = ck_dir;
    }
    if (ck_every) {
        wargv[n++] = "--checkpoint-every";
        wargv[n++] = ck_every;
    }
    if (resume)
        wargv[n++] = "--resume";
    wargv[n] = NULL;
    LaunchJob l = {launcher, world, a.positional[0]};
    int rc = launch_worker(&l, wargv, &status, &err);
    if (rc) {
        fprintf(stderr, "parallax run: %s\n", err.msg);
        status = rc == PX_EINPUT ? 2 : 1;
    } else if (status > 2) {
        /* the launcher's own status when a rank died (mpirun: 128 + the signal): the job
         * failed, as the lines above say which rank and where */
        fprintf(stderr, "parallax run: the job ended abnormally (the launcher exited with status "
                        "%d): a rank died or was lost; its message above names it\n", status);
        status = 1;
    }
    return status;
}
