/* parallax-worker — the executor's program: `parallax-worker run PLAN.json` trains the plan on
 * this process and writes run.json. `parallax run` starts it: directly for one rank, through
 * mpirun or srun for several (one process per rank; rank 0 writes run.json).
 *
 * Failures: an error every rank meets before training (a bad plan, a world that does not
 * match it, a bad data file) is agreed on, printed once by the first rank that had it, and
 * every rank exits with its status. An error of one rank during training ends the whole job
 * with MPI_Abort, its message naming the rank, so no rank is left waiting in a collective.
 * Exit status 0 ok, 1 runtime failure, 2 bad input. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/comm/comm.h"
#include "exec/exec.h"

static const char *const usage_text =
    "usage: parallax-worker run PLAN.json [options]\n"
    "       parallax-worker calibrate --part compute|comm|assemble ... (see its --help)\n\n"
    "Trains the plan on this process and writes run.json: losses, memory per category,\n"
    "FLOPs and time per op under the simulator's names.\n\n"
    "options:\n"
    "  --steps N              training steps (default: the plan's training.steps)\n"
    "  -o, --output FILE      run.json to write (default run.json)\n"
    "  --metrics FILE         JSON-lines log, one line per step (default: FILE of -o with\n"
    "                         .metrics.jsonl for .json)\n"
    "  --data FILE            training data: a text file (byte tokens) or an llm.c .bin\n"
    "                         token file (default: the plan's training.data, else the\n"
    "                         built-in text)\n"
    "  --quiet                no progress lines\n"
    "  --no-prefetch          read each batch when it is needed (no loader thread)\n"
    "  --backend B            cpu, cuda or auto (default auto: cuda when the plan's\n"
    "                         cluster has GPUs, cpu for the cpu device)\n"
    "  --loss-scale S         fp16: the initial loss scale (default 65536)\n"
    "  --loss-scale-interval N  fp16: clean steps before the scale doubles (default 2000)\n"
    "  --comm-timeout S       end the job when a communication waits longer than S seconds\n"
    "                         (default 600; 0: no limit)\n"
    "  --fail-rank R --fail-step K  rank R dies (SIGKILL) at the start of step K, as a lost\n"
    "                         node (tests)\n"
    /* checkpoints */
    "  --checkpoint-dir DIR   where checkpoints are written (and resumed from)\n"
    "  --checkpoint-every N   write a checkpoint every N steps\n"
    "  --resume               continue from the latest complete checkpoint in DIR\n"
    "  -h, --help             show this help\n";

static int exit_code(int status) { return status == PX_EINPUT ? 2 : status ? 1 : 0; }

static int g_rank, g_world;

/* The message of an error all ranks agreed on: printed once, by the first rank that had it. */
static int agreed(int rc, const PxError *err)
{
    int first = 0;
    int worst = g_world > 1 ? comm_mpi_agree(rc, &first) : rc;
    if (worst && ((g_world == 1 && g_rank == 0) || (g_world > 1 && rc && first == g_rank))) {
        if (g_world > 1)
            fprintf(stderr, "parallax-worker run: rank %d of %d: %s\n", g_rank, g_world, err->msg);
        else
            fprintf(stderr, "parallax-worker run: %s\n", err->msg);
    }
    return worst;
}

static int cmd_run(int argc, char **argv)
{
    enum { OPT_STEPS = 1000, OPT_METRICS, OPT_DATA, OPT_QUIET, OPT_NO_PREFETCH, OPT_BACKEND,
           OPT_LOSS_SCALE, OPT_LOSS_SCALE_INTERVAL,
           OPT_COMM_TIMEOUT, OPT_FAIL_RANK, OPT_FAIL_STEP };
    /* checkpoints */
    enum { OPT_CHECKPOINT_DIR = 1100, OPT_CHECKPOINT_EVERY, OPT_RESUME };
    static const struct option lo[] = {
        {"steps", required_argument, NULL, OPT_STEPS},
        {"output", required_argument, NULL, 'o'},
        {"metrics", required_argument, NULL, OPT_METRICS},
        {"data", required_argument, NULL, OPT_DATA},
        {"quiet", no_argument, NULL, OPT_QUIET},
        {"no-prefetch", no_argument, NULL, OPT_NO_PREFETCH},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"loss-scale", required_argument, NULL, OPT_LOSS_SCALE},
        {"loss-scale-interval", required_argument, NULL, OPT_LOSS_SCALE_INTERVAL},
        {"comm-timeout", required_argument, NULL, OPT_COMM_TIMEOUT},
        {"fail-rank", required_argument, NULL, OPT_FAIL_RANK},
        {"fail-step", required_argument, NULL, OPT_FAIL_STEP},
        /* checkpoints */
        {"checkpoint-dir", required_argument, NULL, OPT_CHECKPOINT_DIR},
        {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
        {"resume", no_argument, NULL, OPT_RESUME},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.output = "run.json";
    PxError err = {0};
    const char *comm_timeout = NULL, *fail_rank = NULL, *fail_step = NULL; /* failure options */
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":ho:", lo, NULL)) != -1) {
        switch (c) {
        case 'h':
            if (g_rank == 0)
                fputs(usage_text, stdout);
            return 0;
        case 'o': opt.output = optarg; break;
        case OPT_STEPS:
            if (px_parse_int(optarg, "--steps", 1, 1 << 30, &opt.steps, &err)) {
                if (g_rank == 0)
                    fprintf(stderr, "parallax-worker run: %s\n", err.msg);
                return 2;
            }
            break;
        case OPT_METRICS: opt.metrics = optarg; break;
        case OPT_DATA: opt.data = optarg; break;
        case OPT_QUIET: opt.quiet = 1; break;
        case OPT_NO_PREFETCH: opt.prefetch = 0; break;
        case OPT_BACKEND:
            if (exec_backend_parse(optarg, &opt.backend, &err)) {
                if (g_rank == 0)
                    fprintf(stderr, "parallax-worker run: %s\n", err.msg);
                return 2;
            }
            break;
        case OPT_LOSS_SCALE: {
            char *end = NULL;
            opt.loss_scale = strtod(optarg, &end);
            if (end == optarg || *end || !(opt.loss_scale >= 1.0 && opt.loss_scale <= 0x1p100)) {
                if (g_rank == 0)
                    fprintf(stderr, "parallax-worker run: --loss-scale: expected a number from 1 "
                                    "to 2^100, got '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case OPT_LOSS_SCALE_INTERVAL:
            if (px_parse_int(optarg, "--loss-scale-interval", 1, 1 << 30, &opt.loss_scale_interval,
                             &err)) {
                if (g_rank == 0)
                    fprintf(stderr, "parallax-worker run: %s\n", err.msg);
                return 2;
            }
            break;
        case OPT_COMM_TIMEOUT: comm_timeout = optarg; break;
        case OPT_FAIL_RANK: fail_rank = optarg; break;
        case OPT_FAIL_STEP: fail_step = optarg; break;
        /* checkpoints: exec_init checks that they fit together */
        case OPT_CHECKPOINT_DIR: opt.checkpoint_dir = optarg; break;
        case OPT_CHECKPOINT_EVERY:
            if (px_parse_int(optarg, "--checkpoint-every", 1, 1 << 30, &opt.checkpoint_every,
                             &err)) {
                if (g_rank == 0)
                    fprintf(stderr, "parallax-worker run: %s\n", err.msg);
                return 2;
            }
            break;
        case OPT_RESUME: opt.resume = 1; break;
        case ':':
            if (g_rank == 0)
                fprintf(stderr, "parallax-worker run: option '%s' needs a value\n",
                        argv[optind - 1]);
            return 2;
        default:
            if (g_rank == 0)
                fprintf(stderr, "parallax-worker run: unknown option '%s' (see --help)\n",
                        argv[optind - 1]);
            return 2;
        }
    }
    if (optind != argc - 1) {
        if (g_rank == 0)
            fprintf(stderr, "parallax-worker run: expected one plan file (see --help)\n");
        return 2;
    }
    if (exec_failure_parse(comm_timeout, fail_rank, fail_step, &opt, &err)) {
        if (g_rank == 0)
            fprintf(stderr, "parallax-worker run: %s\n", err.msg);
        return 2;
    }
    opt.plan_path = argv[optind];
    char metrics[512];
    if (!opt.metrics && opt.output && *opt.output) {
        size_t n = strlen(opt.output);
        int json = n > 5 && strcmp(opt.output + n - 5, ".json") == 0;
        snprintf(metrics, sizeof metrics, "%.*s.metrics.jsonl", (int)(json ? n - 5 : n),
                 opt.output);
        opt.metrics = metrics;
    }
    ModelPlan plan;
    memset(&plan, 0, sizeof plan);
    int rc = agreed(model_plan_read(opt.plan_path, &plan, &err), &err);
    if (rc) {
        model_plan_free(&plan);
        return exit_code(rc);
    }
    /* the backend decides the communication layer; exec_init resolves it again itself, so that
     * its refusals say whether the backend was asked for or followed from the plan */
    ExecBackend backend = opt.backend;
    rc = agreed(exec_backend_for_plan(&plan, opt.backend, &backend, &err), &err);
    if (rc) {
        model_plan_free(&plan);
        return exit_code(rc);
    }
    CommLayer *comm = NULL;
    if (g_world > 1) {
        const ModelSpec *s = &plan.spec;
        int tied_pair = s->model.tied_embeddings && s->layout.pp * s->layout.vpp > 1;
        rc = agreed(comm_for_job(s, tied_pair, backend == EXEC_BACKEND_CUDA, &comm, &opt.comm_note,
                                 &err),
                    &err);
        if (rc) {
            comm_free(comm);
            model_plan_free(&plan);
            return exit_code(rc);
        }
        opt.comm = comm;
    }
    Exec *ex = NULL;
    rc = agreed(exec_init(&ex, &plan, &opt, &err), &err);
    if (!rc) {
        rc = exec_run(ex, &err);
        if (rc && g_world > 1 && !exec_error_is_collective(ex)) {
            /* only this rank failed: the others may be waiting for it in a collective */
            fprintf(stderr, "parallax-worker run: rank %d of %d: %s (ending the job)\n", g_rank,
                    g_world, err.msg);
            fflush(stderr);
            comm_mpi_abort(exit_code(rc));
        }
        if (rc && g_rank == 0)
            fprintf(stderr, "parallax-worker run: %s\n", err.msg);
    }
    exec_free(ex);
    comm_free(comm);
    model_plan_free(&plan);
    return exit_code(rc);
}

int main(int argc, char **argv)
{
    /* one rank of an MPI job (mpirun, srun), or a process on its own */
    int mpi = comm_mpi_start(&argc, &argv, &g_rank, &g_world);
    int status;
    if (argc >= 2 && !strcmp(argv[1], "run")) {
        status = cmd_run(argc - 1, argv + 1);
    } else if (argc >= 2 && !strcmp(argv[1], "calibrate")) {
        status = exec_calibrate_main(argc - 1, argv + 1, g_rank, g_world);
    } else if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
                             !strcmp(argv[1], "help"))) {
        if (g_rank == 0)
            fputs(usage_text, stdout);
        status = 0;
    } else {
        if (g_rank == 0) {
            if (argc >= 2)
                fprintf(stderr, "parallax-worker: unknown command '%s' (run or calibrate)\n",
                        argv[1]);
            fputs(usage_text, stderr);
        }
        status = 2;
    }
    if (mpi)
        comm_mpi_finish();
    return status;
}
