/* The trainer's options: their defaults, the backends by name, and the failure options as a
 * command line gives them. The worker parses with them, and so does `parallax run`, which
 * checks --backend and the failure options before it starts anything: this file is a library of
 * its own (px_train_options) that needs neither the kernels nor MPI. */
#include <stddef.h>
#include <string.h>

#include "exec/train/train.h"

void exec_options_defaults(ExecOptions *o)
{
    memset(o, 0, sizeof *o);
    o->prefetch = 1;
    o->comm_timeout_s = EXEC_COMM_TIMEOUT_S;
}

const char *exec_cp_limit(const ModelSpec *s, const ModelDims *d)
{
    if (d->c <= 1)
        return NULL;
    const ModelConfig *m = &s->model;
    const int a2a = s->layout.cp_comm == MODEL_CP_COMM_A2A;
    return s->layout.cp_comm == MODEL_CP_COMM_P2P && !s->job.flash_attn
               ? "p2p runs the fused attention core (make the plan with --flash-attn)"
           : d->c > EXEC_CP_MAX ? "cp must be at most 64"
           : a2a && s->job.flash_attn
               ? "a2a runs the unfused attention core (make the plan with --no-flash-attn)"
           : a2a && (d->heads_loc % d->c || d->kv_loc % d->c)
               ? "a2a needs cp to divide the heads and the KV heads per tensor-parallel rank "
                 "(Ulysses splits them over the cp ranks)"
           : s->job.dropout > 0.0 ? "dropout must be 0"
           : d->moe               ? "mixture-of-experts layers are not supported"
           : m->mla.kv_lora_rank > 0 || m->mtp_layers > 0
               ? "MLA and multi-token prediction are not supported"
           : d->fp8 != MODEL_FP8_NONE ? "FP8 training is not supported"
           : d->s % (2 * d->c) != 0   ? "the sequence must split into 2 x cp chunks"
                                      : NULL;
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

/* --fail-rank R with --fail-step K kill one rank on purpose, so that a test can watch the job
 * end (docs/executor.md, "Failures"). */
int exec_failure_parse(const char *comm_timeout, const char *fail_rank, const char *fail_step,
                       ExecOptions *o, PxError *err)
{
    if (comm_timeout) {
        double t = 0;
        if (px_parse_double(comm_timeout, "--comm-timeout", &t, err))
            return PX_EINPUT;
        if (t < 0 || t > 1e7)
            return px_fail(err, PX_EINPUT,
                           "--comm-timeout: expected seconds from 0 (no limit) to 1e7, got '%s'",
                           comm_timeout);
        o->comm_timeout_s = t;
    }
    if (!fail_rank != !fail_step)
        return px_fail(err, PX_EINPUT, "%s needs %s too: which rank fails at which step",
                       fail_rank ? "--fail-rank" : "--fail-step",
                       fail_rank ? "--fail-step" : "--fail-rank");
    if (fail_rank &&
        (px_parse_int(fail_rank, "--fail-rank", 0, 1 << 30, &o->fail_rank, err) ||
         px_parse_int(fail_step, "--fail-step", 1, 1 << 30, &o->fail_step, err)))
        return PX_EINPUT;
    return PX_OK;
}
