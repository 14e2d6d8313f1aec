/* The trainer's options: their defaults, the backends by name, and the run options' one table
 * and parser. The worker parses with them, and so does `parallax run`, which checks the user's
 * options before it starts anything and hands them to the worker as given: this file is a
 * library of its own (px_train_options) that needs neither the kernels nor MPI. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "exec/train/train.h"

void exec_options_defaults(ExecOptions *o)
{
    memset(o, 0, sizeof *o);
    o->prefetch = 1;
    o->comm_timeout_s = EXEC_COMM_TIMEOUT_S;
}

int exec_backend_parse(const char *name, ExecBackend *out, PxError *err)
{
    if (!strcmp(name, "auto"))
        *out = EXEC_BACKEND_AUTO;
    else if (!strcmp(name, "cpu"))
        *out = EXEC_BACKEND_CPU;
    else if (!strcmp(name, "cuda"))
        *out = EXEC_BACKEND_CUDA;
    else
        return px_fail(err, PX_EINPUT, "--backend: expected cpu, cuda or auto, got '%s'", name);
    return PX_OK;
}

const char *exec_backend_name(ExecBackend b)
{
    return b == EXEC_BACKEND_CPU ? "cpu" : b == EXEC_BACKEND_CUDA ? "cuda" : "auto";
}

/* ---- the run options ---- */

enum { RUN_STEPS, RUN_OUTPUT, RUN_METRICS, RUN_DATA, RUN_QUIET, RUN_NO_PREFETCH, RUN_BACKEND,
       RUN_LOSS_SCALE, RUN_LOSS_SCALE_INTERVAL, RUN_COMM_TIMEOUT, RUN_FAIL_RANK, RUN_FAIL_STEP,
       RUN_CHECKPOINT_DIR, RUN_CHECKPOINT_EVERY, RUN_RESUME, RUN_TIMING, RUN_IDS };
_Static_assert((int)RUN_IDS <= (int)EXEC_RUN_OPTION_IDS, "the run options' ids stay below the callers'");

const PxOption exec_run_options[] = {
    {"steps", 1, "N", "training steps (default: the plan's training.steps)", RUN_STEPS, 0},
    {"output", 1, "FILE", "run.json to write (default run.json)", RUN_OUTPUT, 'o'},
    {"metrics", 1, "FILE",
     "JSON-lines log, one line per step (default: FILE of -o with .metrics.jsonl for .json)",
     RUN_METRICS, 0},
    {"data", 1, "FILE",
     "training data: a text file (byte tokens) or an llm.c .bin token file (default: the plan's "
     "training.data, else the built-in text)",
     RUN_DATA, 0},
    {"quiet", 0, NULL, "no progress lines", RUN_QUIET, 0},
    {"no-prefetch", 0, NULL, "read each batch when it is needed (no loader thread)",
     RUN_NO_PREFETCH, 0},
    {"backend", 1, "B",
     "cpu, cuda or auto (default auto: cuda when the plan's cluster has GPUs, cpu for the cpu "
     "device)",
     RUN_BACKEND, 0},
    {"loss-scale", 1, "S", "fp16: the initial loss scale (default 65536)", RUN_LOSS_SCALE, 0},
    {"loss-scale-interval", 1, "N", "fp16: clean steps before the loss scale doubles (default 2000)",
     RUN_LOSS_SCALE_INTERVAL, 0},
    {"comm-timeout", 1, "S",
     "end the job when a communication waits longer than S seconds (default 600; 0: no limit)",
     RUN_COMM_TIMEOUT, 0},
    {"fail-rank", 1, "R", "with --fail-step: rank R dies (SIGKILL) as a lost node (tests)",
     RUN_FAIL_RANK, 0},
    {"fail-step", 1, "K", "the step at whose start --fail-rank dies", RUN_FAIL_STEP, 0},
    {"checkpoint-dir", 1, "DIR", "where checkpoints are written and resumed from",
     RUN_CHECKPOINT_DIR, 0},
    {"checkpoint-every", 1, "N", "write a checkpoint every N steps (needs --checkpoint-dir)",
     RUN_CHECKPOINT_EVERY, 0},
    {"resume", 0, NULL, "continue from the latest complete checkpoint in --checkpoint-dir",
     RUN_RESUME, 0},
    {"timing", 1, "T",
     "op (default): every op timed, the device waited for at its start and end; step: one wait "
     "per step, the step time of a plain training run, no time per op",
     RUN_TIMING, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

void exec_run_args_init(ExecRunArgs *a)
{
    memset(a, 0, sizeof *a);
    exec_options_defaults(&a->opt);
    a->opt.output = "run.json";
}

int exec_run_option(void *ctx, int id, const char *arg, PxError *err)
{
    ExecRunArgs *a = ctx;
    ExecOptions *o = &a->opt;
    switch (id) {
    case RUN_STEPS: return px_parse_int(arg, "--steps", 1, 1 << 30, &o->steps, err);
    case RUN_OUTPUT: o->output = arg; break;
    case RUN_METRICS: o->metrics = arg; break;
    case RUN_DATA: o->data = arg; break;
    case RUN_QUIET: o->quiet = 1; break;
    case RUN_NO_PREFETCH: o->prefetch = 0; break;
    case RUN_BACKEND: return exec_backend_parse(arg, &o->backend, err);
    case RUN_LOSS_SCALE:
        if (px_parse_double(arg, "--loss-scale", &o->loss_scale, err) ||
            !(o->loss_scale >= 1.0 && o->loss_scale <= 0x1p100))
            return px_fail(err, PX_EINPUT, "--loss-scale: expected a number from 1 to 2^100, got '%s'",
                           arg);
        break;
    case RUN_LOSS_SCALE_INTERVAL:
        return px_parse_int(arg, "--loss-scale-interval", 1, 1 << 30, &o->loss_scale_interval, err);
    case RUN_COMM_TIMEOUT: a->comm_timeout = arg; break;
    case RUN_FAIL_RANK: a->fail_rank = arg; break;
    case RUN_FAIL_STEP: a->fail_step = arg; break;
    case RUN_CHECKPOINT_DIR: o->checkpoint_dir = arg; break;
    case RUN_CHECKPOINT_EVERY:
        return px_parse_int(arg, "--checkpoint-every", 1, 1 << 30, &o->checkpoint_every, err);
    case RUN_RESUME: o->resume = 1; break;
    case RUN_TIMING:
        if (strcmp(arg, "op") && strcmp(arg, "step"))
            return px_fail(err, PX_EINPUT, "--timing: expected op or step, got '%s'", arg);
        o->step_timing = !strcmp(arg, "step");
        break;
    default: break;
    }
    return PX_OK;
}

/* --fail-rank R with --fail-step K kill one rank on purpose, so that a test can watch the job
 * end (docs/executor.md, "Failures"). */
static int failures_check(ExecRunArgs *a, PxError *err)
{
    ExecOptions *o = &a->opt;
    if (a->comm_timeout) {
        double t = 0;
        if (px_parse_double(a->comm_timeout, "--comm-timeout", &t, err))
            return PX_EINPUT;
        if (t < 0 || t > 1e7)
            return px_fail(err, PX_EINPUT,
                           "--comm-timeout: expected seconds from 0 (no limit) to 1e7, got '%s'",
                           a->comm_timeout);
        o->comm_timeout_s = t;
    }
    if (!a->fail_rank != !a->fail_step)
        return px_fail(err, PX_EINPUT, "%s needs %s too: which rank fails at which step",
                       a->fail_rank ? "--fail-rank" : "--fail-step",
                       a->fail_rank ? "--fail-step" : "--fail-rank");
    if (a->fail_rank &&
        (px_parse_int(a->fail_rank, "--fail-rank", 0, 1 << 30, &o->fail_rank, err) ||
         px_parse_int(a->fail_step, "--fail-step", 1, 1 << 30, &o->fail_step, err)))
        return PX_EINPUT;
    return PX_OK;
}

/* A checkpoint directory with something to do in it, and nothing to do without one. */
static int checkpoints_check(const ExecOptions *o, PxError *err)
{
    if ((o->checkpoint_every || o->resume) && !o->checkpoint_dir)
        return px_fail(err, PX_EINPUT, "%s needs --checkpoint-dir DIR",
                       o->resume ? "--resume" : "--checkpoint-every");
    if (o->checkpoint_dir && !o->checkpoint_every && !o->resume)
        return px_fail(err, PX_EINPUT, "--checkpoint-dir %s: give --checkpoint-every N to write "
                                       "checkpoints, or --resume to continue from one",
                       o->checkpoint_dir);
    return PX_OK;
}

int exec_run_args_check(ExecRunArgs *a, PxError *err)
{
    int rc = failures_check(a, err);
    if (!rc)
        rc = checkpoints_check(&a->opt, err);
    ExecOptions *o = &a->opt;
    if (rc || o->metrics || !o->output || !*o->output)
        return rc;
    /* the metrics log beside run.json: its name with .metrics.jsonl for .json */
    size_t n = strlen(o->output);
    int json = n > 5 && strcmp(o->output + n - 5, ".json") == 0;
    snprintf(a->metrics, sizeof a->metrics, "%.*s.metrics.jsonl", (int)(json ? n - 5 : n),
             o->output);
    o->metrics = a->metrics;
    return PX_OK;
}
