/* The trainer's life cycle: exec_init checks that the plan can run here, places this rank in
 * the layout's grid, builds its stage's tensor table and op graph, sizes the parts, binds every
 * tensor to a category arena, initializes the weights (or resumes a checkpoint) and gets the
 * data ready; exec_free undoes it. Each phase is a function below; the parts themselves live in
 * their own files (internal.h lists them). Also the accessors of train.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/train/internal.h"

/* ---- the backend ---- */

int exec_backend_for_plan(const ModelPlan *plan, ExecBackend override, ExecBackend *out,
                          PxError *err)
{
    (void)err;
    *out = override;
    if (override == EXEC_BACKEND_AUTO)
        *out = prof_device_is_cpu(&plan->profile.device) ? EXEC_BACKEND_CPU : EXEC_BACKEND_CUDA;
    return PX_OK;
}

/* A backend may leave the MoE entries NULL until its kernels are written: a MoE plan is then
 * refused at start rather than crashing in the first MoE layer. */
int exec_backend_has_moe(const KernBackend *k)
{
    return k->moe_route_fwd && k->moe_route_bwd && k->moe_counts && k->moe_aux_fwd &&
           k->moe_aux_bwd && k->moe_permute && k->moe_permute_bwd && k->moe_unpermute &&
           k->moe_unpermute_bwd && k->moe_dense && k->moe_sparse && k->moe_pick;
}

/* The kernels for the plan: its precision on the chosen backend. PX_EINPUT names what does not
 * fit (each trains fp32, bf16 or fp16; no CUDA device here). */
static int choose_backend(Exec *ex, PxError *err)
{
    ExecCtx *c = &ex->c;
    const char *origin = ex->plan_path;
    const PxDtype prec = c->spec.job.precision;
    const ProfDevice *dev = &ex->plan.profile.device;
    ExecBackend b;
    int rc = exec_backend_for_plan(&ex->plan, ex->opt.backend, &b, err);
    if (rc)
        return rc;
    /* the precision each backend trains in and optimizer offload's backend are
     * model_exec_refusal's (check_supported) */
    if (b == EXEC_BACKEND_CPU) {
        /* fp32, or bf16 / fp16 with gradients in fp32 or in the precision's type */
        c->k = kern_cpu_with_grads(prec, c->spec.job.grad_dtype);
        if (!c->k)
            return px_fail(err, PX_EINPUT, "%s: training.precision %s with grad_dtype %s: the CPU "
                           "backend has no such kernels", origin, px_dtype_name(prec),
                           px_dtype_name(c->spec.job.grad_dtype));
    } else {
        /* gradients in fp32 or in the precision's 16-bit type (model_exec_refusal) */
        c->k = kern_cuda_with_grads(prec, c->spec.job.grad_dtype);
        if (!c->k) {
            if (ex->opt.backend == EXEC_BACKEND_AUTO)
                return px_fail(err, PX_EINPUT,
                               "%s: this machine has no CUDA device for the plan's %s "
                               "(parallax-worker built without CUDA, or no driver or GPU "
                               "visible): run it on a GPU machine, or on the CPU with "
                               "--backend cpu (training.precision %s)",
                               origin, dev->name, px_dtype_name(prec));
            return px_fail(err, PX_EINPUT,
                           "%s: --backend cuda, but this machine has no CUDA device "
                           "(parallax-worker built without CUDA, or no driver or GPU visible)",
                           origin);
        }
        kern_cuda_device_name(ex->device_name, sizeof ex->device_name);
    }
    if (c->d.moe && !exec_backend_has_moe(c->k))
        return px_fail(err, PX_EINPUT,
                       "%s: model %s has %d experts, but the %s backend has no mixture-of-experts "
                       "kernels (routing, permutation) in this build: make the plan with --precision "
                       "fp32 and run it with --backend cpu",
                       origin, c->spec.model.name, c->spec.model.moe.experts, c->k->name);
    c->act = c->k->act;
    c->ab = px_dtype_bytes(c->act);
    c->grad = c->k->grad;
    c->gb = px_dtype_bytes(c->grad);
    if (c->act != prec)
        return px_fail(err, PX_ERUNTIME, "the %s backend computes in %s, not the plan's %s",
                       c->k->name, px_dtype_name(c->act), px_dtype_name(prec));
    if (c->grad != c->spec.job.grad_dtype)
        return px_fail(err, PX_ERUNTIME, "the %s backend's gradients are %s, not the plan's %s",
                       c->k->name, px_dtype_name(c->grad), px_dtype_name(c->spec.job.grad_dtype));
    return PX_OK;
}

void exec_ckpt_state(const Exec *ex, CkptState *st)
{
    static const ModelCategory cats[CKPT_SECTIONS] = {MODEL_WEIGHTS, MODEL_MASTER, MODEL_OPTIMIZER};
    const ExecCtx *c = &ex->c;
    memset(st, 0, sizeof *st);
    st->rank = c->g.rank;
    st->world = c->g.world;
    st->stage = c->g.stage;
    st->tp_rank = c->g.tp_rank;
    st->dp_rank = c->g.dp_rank;
    st->k = c->k;
    st->comm = c->comm;
    st->spec = &c->spec;
    st->d = &c->d;
    st->plan_path = ex->plan_path;
    st->steps = c->steps;
    for (int i = 0; i < CKPT_SECTIONS; i++) {
        st->region[i].base = ex->mem.a[cats[i]].base;
        st->region[i].bytes = ex->mem.a[cats[i]].cap;
        st->region[i].cat = cats[i];
        st->region[i].host = ex->mem.a[cats[i]].host;
    }
    st->opt_steps = ex->optim.opt_steps;
    st->loss_scale = ex->optim.scaler.scale;
    st->scale_clean = ex->optim.scaler.clean;
    st->skipped = ex->optim.scaler.skipped;
    st->have_loss = ex->hist.done > 0;
    st->last_loss = st->have_loss ? ex->hist.loss[ex->hist.done - 1] : 0;
}

/* ---- phases of exec_init ---- */

/* What this build can run of the plan, on this job. */
static int check_supported(const Exec *ex, PxError *err)
{
    const ModelSpec *s = &ex->c.spec;
    const ModelDims *d = &ex->c.d;
    const char *origin = ex->plan_path;
    const int world = comm_world(ex->c.comm);
    /* What of the plan this executor runs: the one statement the planner and validate
     * consult too (model_exec_refusal), for the backend the plan will run on */
    ExecBackend b = EXEC_BACKEND_CPU;
    char why[512];
    (void)exec_backend_for_plan(&ex->plan, ex->opt.backend, &b, err);
    if (model_exec_refusal(s, d, b == EXEC_BACKEND_CUDA, why, sizeof why))
        return px_fail(err, PX_EINPUT, "%s: %s", origin, why);
    if (d->gpus != world) {
        if (world == 1 && !comm_mpi_available())
            return px_fail(err, PX_EINPUT,
                           "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d) but this "
                           "parallax-worker was built without MPI: it runs single-rank plans only "
                           "(install libopenmpi-dev and rebuild)",
                           origin, d->gpus, d->dp, d->t, d->p, d->c);
        /* srun started several tasks, but without the PMI this MPI speaks each is alone */
        const char *step_tasks = getenv("SLURM_STEP_NUM_TASKS");
        if (world == 1 && step_tasks && atoi(step_tasks) > 1)
            return px_fail(err, PX_EINPUT,
                           "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d): srun "
                           "started %s tasks but each runs alone, not joined by MPI: give srun "
                           "--mpi=pmix (OpenMPI; SLURM_MPI_TYPE=pmix does the same), or start the "
                           "job with parallax run --launcher srun",
                           origin, d->gpus, d->dp, d->t, d->p, d->c, step_tasks);
        if (world == 1)
            return px_fail(err, PX_EINPUT,
                           "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d) but this "
                           "process runs alone: start it with parallax run (mpirun / srun)",
                           origin, d->gpus, d->dp, d->t, d->p, d->c);
        return px_fail(err, PX_EINPUT,
                       "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d) but the job "
                       "has %d",
                       origin, d->gpus, d->dp, d->t, d->p, d->c, world);
    }
    return PX_OK;
}

/* The directory of path must exist and take new files (run.json is written through a
 * temporary file beside it and renamed). */
static int check_writable(const char *path, PxError *err)
{
    char dir[256];
    px_strlcpy(dir, path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (!slash)
        px_strlcpy(dir, ".", sizeof dir);
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    if (access(dir, W_OK) != 0)
        return px_fail(err, PX_EINPUT, "%s: cannot write into %s: %s", path, dir, strerror(errno));
    return PX_OK;
}

/* A message from a lower layer, prefixed with the plan's path. */
static int with_origin(const Exec *ex, int rc, PxError *err)
{
    char msg[sizeof err->msg];
    px_strlcpy(msg, err->msg, sizeof msg);
    return px_fail(err, rc, "%s: %s", ex->plan_path, msg);
}

/* The plan copied, its layout checked against its world and normalised, the options and the
 * job as this run has them (--data, --steps), the failures asked for. */
static int phase_plan(Exec *ex, const ModelPlan *plan, const ExecOptions *opt, PxError *err)
{
    ExecCtx *c = &ex->c;
    int rc;
    if ((rc = model_plan_copy(&ex->plan, plan, err)))
        return rc;
    if (opt->comm) {
        c->comm = opt->comm;
    } else if (!(c->comm = ex->own_comm = comm_single())) {
        return px_fail(err, PX_ERUNTIME, "out of memory");
    }
    /* only rank 0 writes run.json and the metrics log, and prints */
    c->quiet = opt->quiet || comm_rank(c->comm) != 0;
    if (comm_rank(c->comm) == 0) {
        if (opt->output)
            px_strlcpy(ex->output, opt->output, sizeof ex->output);
        if (opt->metrics)
            px_strlcpy(ex->metrics, opt->metrics, sizeof ex->metrics);
    }
    c->spec = plan->spec;
    if (opt->data)
        px_strlcpy(c->spec.job.data, opt->data, sizeof c->spec.job.data);
    if ((rc = model_spec_check(&c->spec, plan->gpus, &c->d, err)))
        return with_origin(ex, PX_EINPUT, err);
    if ((rc = check_supported(ex, err)))
        return rc;
    if (!(opt->comm_timeout_s >= 0))
        return px_fail(err, PX_EINPUT, "--comm-timeout: expected 0 (none) or a number of seconds, "
                       "got %g", opt->comm_timeout_s);
    comm_set_timeout(c->comm, opt->comm_timeout_s);
    comm_set_step(c->comm, 0);
    if ((rc = exec_faults_init(&ex->faults, opt, comm_rank(c->comm), comm_world(c->comm), err)))
        return rc;
    /* a run.json that cannot be written is found out now, not after the training */
    if ((ex->output[0] && (rc = check_writable(ex->output, err))) ||
        (ex->metrics[0] && (rc = check_writable(ex->metrics, err))))
        return rc;
    c->steps = opt->steps > 0 ? opt->steps : c->spec.job.steps;
    if (c->steps < 1)
        return px_fail(err, PX_EINPUT, "%s: training.steps is 0: nothing to run (give --steps N)",
                       ex->plan_path);
    /* run.json records the job as run: --steps and --data included */
    c->spec.job.steps = c->steps;
    ex->plan.spec = c->spec;
    c->dropout = (float)c->spec.job.dropout;
    /* The fused (flash) kernel has no dropout of the attention probabilities; the residual and
     * embedding dropouts still apply. */
    c->attn_dropout = c->dropout > 0.0f && !c->spec.job.flash_attn;
    if ((rc = model_predicted_read(&ex->plan, &ex->pred, err)))
        return with_origin(ex, rc, err);
    return PX_OK;
}

/* The kernels, the loss scaler, and the device memory in use before anything is allocated. */
static int phase_backend(Exec *ex, PxError *err)
{
    int rc = choose_backend(ex, err);
    if (rc)
        return rc;
    exec_scaler_init(&ex->optim.scaler, ex->c.act == PX_FP16, ex->opt.loss_scale,
                     ex->opt.loss_scale_interval);
    exec_meter_device_memory(&ex->meter, ex->c.k, 1);
    return PX_OK;
}

/* This rank's stage, its tables and graph, and its place in the grid, checked against the
 * communication layer's groups. */
static int phase_grid(Exec *ex, PxError *err)
{
    ExecCtx *c = &ex->c;
    const int rank = comm_rank(c->comm), world = comm_world(c->comm);
    int tp, cp, dp, stage;
    model_rank_coords(&c->spec.layout, rank, &tp, &cp, &dp, &stage);
    ModelSpec plain = c->spec;
    plain.layout.zero = 0;
    int rc;
    if ((rc = model_tensors_build(&c->spec, &c->d, stage, &ex->tt, err)) ||
        (rc = model_tensors_build(&plain, &c->d, stage, &ex->twin, err)) ||
        (rc = model_ops_build(&c->spec, &c->d, stage, &ex->graph, err)))
        return rc;
    if ((rc = exec_grid_init(&c->g, &c->spec, &c->d, rank, world, &ex->tt, err)))
        return rc;
    if (comm_group_size(c->comm, MODEL_GROUP_DP) != c->g.zero_n ||
        comm_group_rank(c->comm, MODEL_GROUP_DP) != c->g.zero_rank ||
        comm_group_size(c->comm, MODEL_GROUP_TP) != c->d.t ||
        comm_group_rank(c->comm, MODEL_GROUP_TP) != c->g.tp_rank ||
        (c->d.moe && (comm_group_size(c->comm, MODEL_GROUP_EP) != c->d.ep ||
                      comm_group_rank(c->comm, MODEL_GROUP_EP) != c->g.ep_rank ||
                      comm_group_size(c->comm, MODEL_GROUP_EDP) != c->d.edp ||
                      comm_group_rank(c->comm, MODEL_GROUP_EDP) != c->g.edp_rank)))
        return px_fail(err, PX_ERUNTIME, "the communication layer's groups do not follow the layout");
    return PX_OK;
}

/* The parts sized for the stage: its schedule and the activation pools it needs, the pipeline,
 * the reductions, the run's record; the data opened (a bad file fails before memory is). */
static int phase_parts(Exec *ex, PxError *err)
{
    ExecCtx *c = &ex->c;
    int rc;
    if ((rc = exec_sched_init(&ex->sched, c, err)) ||
        (rc = exec_acts_init(&ex->acts, c, ex->sched.actions, ex->sched.n, err)) ||
        (rc = exec_pipe_init(&ex->pipe, ex->sched.n, err)) ||
        (rc = exec_zero_init(&ex->zero, ex->tt.n_blocks, err)) ||
        (rc = exec_history_init(&ex->hist, c->steps, err)) ||
        (c->d.moe && (rc = exec_moe_init(&ex->moe, c, err))) ||
        (rc = exec_batches_open(&ex->batches, c, err)))
        return rc;
    if (c->g.has_loss &&
        !(ex->work.host_loss = calloc((size_t)c->d.b * (size_t)c->d.s_loc, sizeof(float))))
        return px_fail(err, PX_ERUNTIME, "out of memory");
    /* Ulysses' all-to-all counts, one a rank of the cp group, whatever its size */
    if (!(ex->work.cp_cnt = calloc((size_t)(c->d.c > 0 ? c->d.c : 1), sizeof *ex->work.cp_cnt)))
        return px_fail(err, PX_ERUNTIME, "out of memory for the cp group's %d counts", c->d.c);
    return PX_OK;
}

/* The memory the communication layer may be handed (the staged fallback mirrors it on the
 * host). */
static int comm_memory(Exec *ex, PxError *err)
{
    int rc = PX_OK;
    for (int c = 0; c < MODEL_CAT_COUNT && !rc; c++)
        if (ex->mem.a[c].base && c != MODEL_OPTIMIZER && c != MODEL_MASTER)
            rc = comm_attach(ex->c.comm, ex->mem.a[c].base, ex->mem.a[c].cap, err);
    /* ZeRO-3's further gather slots, kept gathers and bucket staging (zero.c) */
    if (!rc && ex->zero.extra_bytes)
        rc = comm_attach(ex->c.comm, ex->zero.extra, ex->zero.extra_bytes, err);
    /* the FP8 parameter gather's amaxes and scales, and where a padding lands (fp8gather.c) */
    if (!rc && ex->zero.pg.amax)
        rc = comm_attach(ex->c.comm, ex->zero.pg.amax, ex->zero.pg.scales_bytes, err);
    if (!rc && ex->zero.pg.pad)
        rc = comm_attach(ex->c.comm, ex->zero.pg.pad, ex->zero.pg.pad_bytes, err);
    return rc;
}

/* FP8 parameters below ZeRO-3 with the optimizer offloaded: the master is the host's, so they
 * are quantized from the act values it rounds the master to (exec_pg_updated's G->up), the
 * initial ones too. */
static void pg_from_host(Exec *ex)
{
    ExecFp8Gather *G = &ex->zero.pg;
    if (!G->after || !ex->c.spec.layout.offload_optimizer)
        return;
    G->up = ex->optim.host_g;
    G->up_off = ex->optim.host_off;
    exec_optim_offload_round(&ex->optim, &ex->c, &ex->params);
}

/* Every tensor of the table in its arena, bound to its part; the pools are what the simulator
 * counts for this schedule; the op graph indexed; the initial weights. */
static int phase_memory(Exec *ex, PxError *err)
{
    ExecCtx *c = &ex->c;
    int rc;
    if ((rc = exec_params_build(&ex->params, c, &ex->tt, &ex->twin, err)) ||
        (rc = exec_fp8_init(&ex->fp8, c, &ex->params, err)) ||
        (rc = exec_pg_init(&ex->zero.pg, &ex->fp8, c, &ex->params, err)) ||
        (rc = exec_bind_all(&ex->mem, &ex->tt, c, &ex->params, &ex->acts, &ex->work, &ex->pipe,
                            &ex->zero, &ex->batches, &ex->fp8, err)))
        return rc;
    const uint64_t want = model_activation_bytes(&ex->tt, c->d.v, ex->acts.n_slots,
                                                 ex->acts.n_xslots);
    if (ex->mem.a[MODEL_ACTIVATIONS].cap != want)
        return px_fail(err, PX_ERUNTIME,
                       "the activation pools hold %llu bytes but model_activation_bytes counts %llu: "
                       "model/ and exec/ disagree",
                       (unsigned long long)ex->mem.a[MODEL_ACTIVATIONS].cap,
                       (unsigned long long)want);
    /* SP's packed replicated gradients of a MoE layer or an MLA one: the experts' workspace or
     * MLA's, the larger, free then */
    ex->zero.scratch = NULL;
    ex->zero.scratch_elems = 0;
    for (int i = 0; i < ex->tt.count; i++) {
        const ModelTensor *t = &ex->tt.t[i];
        if ((t->role == MODEL_TR_WS_EXP_DFFN || t->role == MODEL_TR_WS_MLA) &&
            t->bytes / sizeof(float) > ex->zero.scratch_elems) {
            ex->zero.scratch = t->role == MODEL_TR_WS_MLA ? ex->work.mla : ex->work.exp_dffn;
            ex->zero.scratch_elems = t->bytes / sizeof(float);
        }
    }
    if ((rc = exec_params_finish(&ex->params, c, ex->zero.bucket, ex->zero.bucket_elems,
                                 ex->zero.gather[0], err)) ||
        (rc = exec_meter_init(&ex->meter, c, &ex->graph, ex->sched.n, err)) ||
        (rc = exec_zero_buffers(&ex->zero, c, &ex->params, err)) ||
        (rc = exec_optim_offload_init(&ex->optim, c, &ex->params, err)))
        return rc;
    const double t0 = px_now_s();
    if ((rc = exec_params_init_values(&ex->params, c, &ex->mem, ex->zero.bucket,
                                      ex->zero.bucket_elems, &ex->init_threads, err)))
        return rc;
    ex->init_s = px_now_s() - t0;
    /* the FP8 copies of the initial weights (a resumed checkpoint brings its own), and FP8
     * parameters from their initial master (before any step: not metered; the communication
     * layer has its memory by then) */
    if ((rc = exec_fp8_start(&ex->fp8, c, err)) || (rc = comm_memory(ex, err)))
        return rc;
    pg_from_host(ex);
    return exec_pg_updated(&ex->zero, c, &ex->params, NULL, err);
}

/* Checkpoints: the directory checked, and with --resume the state loaded over the initial one
 * and the counters taken from it. */
static int phase_checkpoint(Exec *ex, PxError *err)
{
    const CkptOptions o = {ex->opt.checkpoint_dir, ex->opt.checkpoint_every, ex->opt.resume};
    CkptState st;
    exec_ckpt_state(ex, &st);
    int rc = ckpt_open(&ex->ckpt, &o, &st, err);
    const int from = ckpt_resumed_from(ex->ckpt);
    if (!rc && from > 0) {
        ex->optim.opt_steps = st.opt_steps;
        ex->optim.scaler.scale = st.loss_scale;
        ex->optim.scaler.clean = st.scale_clean;
        ex->optim.scaler.skipped = st.skipped;
        ex->hist.first_step = from;
    }
    return rc;
}

/* The batches' loader (the communication layer has its memory: comm_memory). */
static int phase_ready(Exec *ex, PxError *err)
{
    exec_meter_device_memory(&ex->meter, ex->c.k, 0);
    return exec_batches_start(&ex->batches, &ex->c, err);
}

int exec_init(Exec **out, const ModelPlan *plan, const ExecOptions *opt, PxError *err)
{
    *out = NULL;
    Exec *ex = calloc(1, sizeof *ex);
    if (!ex)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    ex->opt = *opt;
    ex->comm_note = opt->comm_note;
    /* exec_free may follow a failure before the parts are opened, and a stage that reads no
     * tokens never opens its data: no descriptor 0 to close */
    ex->batches.data.fd = -1;
    ex->meter.step_timing = opt->step_timing;
    px_strlcpy(ex->plan_path, opt->plan_path ? opt->plan_path : "plan", sizeof ex->plan_path);
    int rc;
    if ((rc = phase_plan(ex, plan, opt, err)) || (rc = phase_backend(ex, err)) ||
        (rc = phase_grid(ex, err)) || (rc = phase_parts(ex, err)) ||
        (rc = phase_memory(ex, err)) || (rc = phase_checkpoint(ex, err)) ||
        (rc = phase_ready(ex, err))) {
        exec_free(ex);
        return rc;
    }
    *out = ex;
    return PX_OK;
}

void exec_free(Exec *ex)
{
    if (!ex)
        return;
    exec_batches_free(&ex->batches, &ex->c);
    exec_arenas_free(&ex->mem, ex->c.k);
    ckpt_free(ex->ckpt);
    free(ex->work.host_loss);
    free(ex->work.cp_cnt);
    comm_free(ex->own_comm);
    model_predicted_free(&ex->pred);
    model_tensors_free(&ex->tt);
    model_tensors_free(&ex->twin);
    model_ops_free(&ex->graph);
    model_plan_free(&ex->plan);
    exec_params_free(&ex->params);
    exec_acts_free(&ex->acts, &ex->c);
    exec_sched_free(&ex->sched);
    exec_pipe_free(&ex->pipe);
    exec_zero_free(&ex->zero, ex->c.k);
    exec_optim_offload_free(&ex->optim);
    exec_moe_free(&ex->moe);
    exec_fp8_free(&ex->fp8);
    exec_meter_free(&ex->meter);
    exec_history_free(&ex->hist);
    exec_grid_free(&ex->c.g);
    free(ex);
}

/* ---- accessors ---- */

/* A weight or gradient tensor of the table by name: its parameter and whether it is the
 * gradient; NULL when absent. */
static const ExecParam *tensor_param(const Exec *ex, const char *name, int *grad, uint64_t *numel)
{
    for (int i = 0; i < ex->tt.count; i++) {
        const ModelTensor *t = &ex->tt.t[i];
        if (t->per_microbatch || strcmp(t->name, name) != 0)
            continue;
        if ((t->cat != MODEL_WEIGHTS && t->cat != MODEL_GRADS) || t->role == MODEL_TR_W_SHARD ||
            t->role == MODEL_TR_GRAD_SHARD)
            return NULL;
        *grad = t->cat == MODEL_GRADS;
        if (numel)
            *numel = t->numel;
        return exec_params_of(&ex->params, t->role, t->layer);
    }
    return NULL;
}

float *exec_tensor(Exec *ex, const char *name, uint64_t *numel)
{
    int grad = 0;
    const ExecParam *p = tensor_param(ex, name, &grad, numel);
    /* host-visible fp32 only: the CPU backend's, when its weights (or gradients) are fp32 */
    if (!p || strcmp(ex->c.k->name, "cpu") != 0 || (grad ? ex->c.k->grad : ex->c.k->act) != PX_FP32)
        return NULL;
    return grad ? p->g : (float *)p->w;
}

int exec_tensor_read(Exec *ex, const char *name, float *out, uint64_t cap, uint64_t *numel)
{
    int grad = 0;
    uint64_t n = 0;
    const ExecParam *p = tensor_param(ex, name, &grad, &n);
    if (numel)
        *numel = n;
    /* ZeRO-3's weights and ZeRO-2/3's gradients live as shards: no whole tensor to read */
    const int zero = ex->c.spec.layout.zero;
    if (!p || n > cap || (!grad && (!p->w || zero == 3)) || (grad && zero >= 2))
        return PX_ERUNTIME;
    const KernBackend *k = ex->c.k;
    const PxDtype dt = grad ? ex->c.grad : ex->c.act;
    k->sync();
    if (dt == PX_FP32) {
        k->to_host(out, grad ? (const void *)p->g : p->w, n * sizeof(float));
        return PX_OK;
    }
    /* 16-bit weights or gradients: read into the back half of out, widened front to back */
    uint16_t *h = (uint16_t *)(void *)(out + n) - n;
    k->to_host(h, grad ? (const void *)p->g : p->w, n * sizeof *h);
    for (uint64_t i = 0; i < n; i++)
        out[i] = dt == PX_BF16 ? px_bf16_to_float(h[i]) : px_half_to_float(h[i]);
    return PX_OK;
}

const ModelTensorTable *exec_table(const Exec *ex) { return &ex->tt; }

const ModelOpGraph *exec_graph(const Exec *ex) { return &ex->graph; }

const ModelSpec *exec_spec(const Exec *ex) { return &ex->c.spec; }

const ModelDims *exec_dims(const Exec *ex) { return &ex->c.d; }

int exec_batch(Exec *ex, long step, const int32_t **batch, PxError *err)
{
    if (!ex->c.g.has_data)
        return px_fail(err, PX_EINPUT, "stage %d reads no tokens", ex->c.g.stage);
    return exec_loader_get(&ex->batches.loader, step, batch, err);
}

void exec_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT])
{
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        bytes[c] = (ex->mem.a[c].host ? 0 : ex->mem.a[c].cap) + ex->moe.extra[c];
    bytes[MODEL_RUNTIME] = ex->plan.profile.device.runtime_bytes;
}

int exec_host_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT], uint64_t *weights,
                     ExecOffloadTimes *t)
{
    memset(bytes, 0, MODEL_CAT_COUNT * sizeof *bytes);
    *weights = 0;
    memset(t, 0, sizeof *t);
    if (!ex->c.spec.layout.offload_optimizer)
        return 0;
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        bytes[c] = ex->mem.a[c].host ? ex->mem.a[c].cap : 0;
    bytes[MODEL_GRADS] = ex->optim.host_elems * ex->c.gb;
    *weights = ex->optim.host_w ? ex->optim.host_elems * sizeof(float) : 0;
    /* fp32 training has no master: the host's fp32 weight copy stands in its place, as the
     * plan's host column counts it (sim/simulate.c) */
    if (!ex->c.d.master)
        bytes[MODEL_MASTER] = *weights;
    t->d2h_s = ex->optim.d2h_s;
    t->h2d_s = ex->optim.h2d_s;
    t->host_step_s = ex->optim.host_step_s;
    t->steps = ex->optim.host_steps;
    return 1;
}

int exec_device_memory(const Exec *ex, uint64_t *used_start, uint64_t *used_peak, uint64_t *total)
{
    const ExecMeter *M = &ex->meter;
    *used_start = M->dev_used_start;
    *used_peak = M->dev_used_peak;
    *total = M->dev_total;
    return M->have_dev_mem;
}

double exec_loss_scale(const Exec *ex, long *skipped)
{
    if (skipped)
        *skipped = ex->optim.scaler.skipped;
    return ex->optim.scaler.scale;
}

uint64_t exec_activations_in_use_peak(const Exec *ex)
{
    return exec_acts_in_use_peak(&ex->acts, &ex->c);
}

double exec_step_flops(const Exec *ex) { return exec_meter_step_flops(&ex->meter); }

double exec_unattributed_flops(const Exec *ex) { return ex->meter.unattributed_flops; }

const ExecOpReport *exec_ops(Exec *ex, int *n) { return exec_meter_ops(&ex->meter, n); }

int exec_error_is_collective(const Exec *ex) { return ex->optim.collective || ex->hist.collective; }
