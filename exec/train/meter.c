/* Measurement: every op timed under its op of the graph (found by role, never by name), FLOPs
 * counted from the kernel calls made inside it, the communication bytes of each step, the
 * pipeline's passes as they ran (the measured bubble), and the device's own account of its
 * memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/train/internal.h"

/* ---- the op index ---- */

/* (role, layer or block, chunk, phase, comm kind) packed into one key. */
static uint64_t key_of(ModelOpRole role, int index, int chunk, ModelPhase phase, int kind)
{
    return (uint64_t)role | (uint64_t)(unsigned)kind << 8 | (uint64_t)phase << 16 |
           (uint64_t)(unsigned)(chunk + 1) << 24 | (uint64_t)(unsigned)(index + 1) << 40;
}

static uint64_t key_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    return k ^ (k >> 33);
}

static int is_block_role(ModelOpRole r)
{
    return r == MODEL_OPR_BLOCK_PARAMS || r == MODEL_OPR_BLOCK_GRADS ||
           r == MODEL_OPR_BLOCK_SP_GRADS;
}

static uint64_t op_key(const ModelOp *op)
{
    return key_of(op->role, is_block_role(op->role) ? op->block : op->layer, op->chunk, op->phase,
                  op->kind == MODEL_OP_COMM ? (int)op->comm : MODEL_COMM_COUNT);
}

int exec_meter_find(const ExecMeter *M, ModelOpRole role, int index, int chunk, ModelPhase phase,
                    int kind, int occurrence)
{
    const uint64_t key = key_of(role, index, chunk, phase, kind);
    const uint64_t mask = (uint64_t)(M->cap - 1);
    for (uint64_t h = key_hash(key) & mask;; h = (h + 1) & mask) {
        int i = M->slots[h];
        if (i < 0)
            return -1;
        if (M->keys[h] == key) {
            while (occurrence-- > 0 && i >= 0)
                i = M->ops[i].next_same;
            return i;
        }
    }
}

int exec_meter_need(const ExecMeter *M, const ExecCtx *c, ModelOpRole role, int index, int chunk,
                    ModelPhase phase, int kind, int occurrence, const char *what, int *op,
                    PxError *err)
{
    *op = exec_meter_find(M, role, index, chunk, phase, kind, occurrence);
    return *op < 0 ? exec_meter_missing(c, what, err) : PX_OK;
}

int exec_meter_missing(const ExecCtx *c, const char *what, PxError *err)
{
    return px_fail(err, PX_ERUNTIME, "stage %d: the op graph has no %s: model/ and exec/ disagree",
                   c->g.stage, what);
}

int exec_meter_comm_op(const ExecMeter *M, const ExecCtx *c, ModelOpRole role, int layer,
                       int chunk, ModelPhase phase, ModelComm kind, PxError *err)
{
    const int op = exec_meter_find(M, role, layer, chunk, phase, (int)kind, 0);
    if (op < 0) {
        /* the op's name is made only when it is missing: the lookup runs every pass */
        char at[48], what[128];
        if (layer >= 0)
            snprintf(at, sizeof at, "layer.%d.%s", layer, model_op_role_name(role));
        else
            snprintf(at, sizeof at, "%s", model_op_role_name(role));
        snprintf(what, sizeof what, "%s.%s.%s", at, model_comm_name(kind),
                 model_phase_name(phase));
        exec_meter_missing(c, what, err);
    }
    return op;
}

static int phase_slot(ModelPhase p) { return p == MODEL_STEP ? 0 : (int)p; }

int exec_meter_layer_op(const ExecMeter *M, int layer, ModelOpRole role, ModelPhase phase)
{
    return M->layer_op[(layer * EXEC_LAYER_OPS + (role - MODEL_OPR_LN1)) * EXEC_PHASES +
                       phase_slot(phase)];
}

int exec_meter_other_op(const ExecMeter *M, ModelOpRole role, ModelPhase phase)
{
    return M->other_op[role][phase_slot(phase)];
}

static int is_layer_role(ModelOpRole r)
{
    return (r >= MODEL_OPR_LN1 && r <= MODEL_OPR_FC2) || (r >= MODEL_OPR_ROUTER && r <= MODEL_OPR_KV_B);
}

/* Files op i under its key (repeats chain in graph order: ZeRO-3 gathers a tied embedding
 * twice per pass) and under the compute-op tables. */
static int index_op(ExecMeter *M, const ExecCtx *c, int i, PxError *err)
{
    const ModelOp *op = &M->graph->op[i];
    const uint64_t key = op_key(op), mask = (uint64_t)(M->cap - 1);
    for (uint64_t h = key_hash(key) & mask;; h = (h + 1) & mask) {
        int k = M->slots[h];
        if (k < 0) {
            M->slots[h] = i;
            M->keys[h] = key;
            break;
        }
        if (M->keys[h] == key) {
            while (M->ops[k].next_same >= 0)
                k = M->ops[k].next_same;
            M->ops[k].next_same = i;
            break;
        }
    }
    if (op->kind == MODEL_OP_COMM)
        return PX_OK;
    const int L = c->spec.model.layers, mtp = op->layer >= L && op->layer < L + c->spec.model.mtp_layers;
    /* a prediction module's layer: its layer's ops, its final norm, output layer and loss are
     * filed under it; its own (the norms and eh projection) are found by key (mtp.c) */
    if (mtp && op->role == MODEL_OPR_MTP)
        return PX_OK;
    if ((is_layer_role(op->role) || (mtp && op->role >= MODEL_OPR_FINAL_LN &&
                                     op->role <= MODEL_OPR_LOSS)) &&
        op->layer >= 0 && op->layer < L + c->spec.model.mtp_layers) {
        /* the first of a role's ops (the router's GEMM before its permutation; moe.c finds
         * the others by kind) */
        int *slot = &M->layer_op[(op->layer * EXEC_LAYER_OPS + (op->role - MODEL_OPR_LN1)) *
                                     EXEC_PHASES + phase_slot(op->phase)];
        if (*slot < 0)
            *slot = i;
        return PX_OK;
    }
    if (op->role == MODEL_OPR_EMBED || op->role == MODEL_OPR_FINAL_LN ||
        op->role == MODEL_OPR_LOGITS || op->role == MODEL_OPR_LOSS ||
        op->role == MODEL_OPR_OPTIMIZER) {
        M->other_op[op->role][phase_slot(op->phase)] = i;
        return PX_OK;
    }
    return px_fail(err, PX_ERUNTIME, "the trainer does not run op %s of the op graph",
                   M->ops[i].name);
}

/* Every op the trainer runs must be in the graph: the stage's layers (recompute ops as the
 * mode asks), its embedding and output layer, the optimizer. */
static int check_complete(const ExecMeter *M, const ExecCtx *c, PxError *err)
{
    const ModelRecompute rc = c->spec.layout.recompute;
    for (int j = 0; j < c->d.v; j++)
        for (int l = c->g.chunk_l0[j]; l < c->g.chunk_l0[j] + c->g.chunk_cl[j]; l++)
            for (int r = MODEL_OPR_LN1; r <= MODEL_OPR_KV_B; r++)
                for (int p = 0; p < EXEC_PHASES; p++) {
                    /* a MoE layer runs its router, experts and combine (the dispatch is
                     * communication only) and an MLP when it has shared experts; MLA's
                     * projections replace QKV's (q_a only with a query latent) */
                    const int moe = c->d.moe && model_layer_is_moe(&c->spec.model, l);
                    const int mlp = r >= MODEL_OPR_FC1 && r <= MODEL_OPR_FC2;
                    const int mla_r = r >= MODEL_OPR_Q_A && r <= MODEL_OPR_KV_B;
                    const int mla = exec_mla_on(c);
                    if (!is_layer_role((ModelOpRole)r) || r == MODEL_OPR_DISPATCH ||
                        (r >= MODEL_OPR_ROUTER && r <= MODEL_OPR_COMBINE && !moe) ||
                        (mlp && moe && c->d.sff_loc == 0) || (mla_r && !mla) ||
                        (r == MODEL_OPR_QKV && mla) ||
                        (r == MODEL_OPR_Q_A && c->spec.model.mla.q_lora_rank <= 0))
                        continue;
                    /* op-level selective recompute: the ops sac_recompute reruns */
                    const int sac = model_sac_op_role(&c->spec, &c->d, l, (ModelOpRole)r);
                    int want = p != MODEL_RECOMPUTE || rc == MODEL_RECOMPUTE_FULL || sac ||
                               (r == MODEL_OPR_CORE && rc == MODEL_RECOMPUTE_SELECTIVE &&
                                !c->spec.job.flash_attn);
                    if (want && exec_meter_layer_op(M, l, (ModelOpRole)r, (ModelPhase)p) < 0)
                        return px_fail(err, PX_ERUNTIME, "the op graph has no layer.%d.%s.%s", l,
                                       model_op_role_name((ModelOpRole)r),
                                       model_phase_name((ModelPhase)p));
                }
    int has_embed = 0;
    for (int j = 0; j < c->d.v; j++)
        has_embed |= c->g.chunk_g[j] == 0;
    static const ModelOpRole others[] = {MODEL_OPR_EMBED, MODEL_OPR_FINAL_LN, MODEL_OPR_LOGITS,
                                         MODEL_OPR_LOSS, MODEL_OPR_OPTIMIZER};
    for (size_t k = 0; k < sizeof others / sizeof others[0]; k++) {
        const ModelOpRole r = others[k];
        const int optimizer = r == MODEL_OPR_OPTIMIZER;
        const int here = optimizer || (r == MODEL_OPR_EMBED ? has_embed : c->g.has_loss);
        for (int p = 0; p < 2 && here; p++)
            if ((!optimizer || p == 0) && M->other_op[r][p] < 0)
                return px_fail(err, PX_ERUNTIME, "the op graph has no %s.%s",
                               model_op_role_name(r),
                               optimizer ? "step" : model_phase_name((ModelPhase)p));
    }
    return PX_OK;
}

int exec_meter_init(ExecMeter *M, const ExecCtx *c, const ModelOpGraph *g, int n_actions,
                    PxError *err)
{
    /* the device's memory was sampled before the arenas: the rest starts from zero (calloc) */
    M->graph = g;
    M->pass_end = -1;
    const int L = c->spec.model.layers + c->spec.model.mtp_layers, n = g->count > 0 ? g->count : 1;
    int cap = 16;
    while (cap < 2 * g->count)
        cap *= 2;
    M->cap = cap;
    M->ops = calloc((size_t)n, sizeof *M->ops);
    M->report = calloc((size_t)n, sizeof *M->report);
    M->layer_op = malloc((size_t)(L > 0 ? L : 1) * EXEC_LAYER_OPS * EXEC_PHASES * sizeof *M->layer_op);
    M->keys = calloc((size_t)cap, sizeof *M->keys);
    M->slots = malloc((size_t)cap * sizeof *M->slots);
    M->events = calloc((size_t)(n_actions > 0 ? n_actions : 1), sizeof *M->events);
    M->last_events = calloc((size_t)(n_actions > 0 ? n_actions : 1), sizeof *M->last_events);
    M->cap_bubbles = c->steps > 0 ? c->steps : 1;
    M->step_bubble = calloc((size_t)M->cap_bubbles, sizeof *M->step_bubble);
    if (!M->ops || !M->report || !M->layer_op || !M->keys || !M->slots || !M->events ||
        !M->last_events || !M->step_bubble)
        return px_fail(err, PX_ERUNTIME, "out of memory for the op table");
    for (int i = 0; i < cap; i++)
        M->slots[i] = -1;
    for (int i = 0; i < L * EXEC_LAYER_OPS * EXEC_PHASES; i++)
        M->layer_op[i] = -1;
    for (int r = 0; r < MODEL_OPR_COUNT; r++)
        for (int p = 0; p < EXEC_PHASES; p++)
            M->other_op[r][p] = -1;
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        ExecOpStat *o = &M->ops[i];
        model_op_fullname(op, o->name, sizeof o->name);
        o->compute = op->kind != MODEL_OP_COMM;
        o->chunk = op->chunk;
        o->phase = op->phase;
        o->next_same = -1;
    }
    for (int i = 0; i < g->count; i++) {
        int rc = index_op(M, c, i, err);
        if (rc)
            return rc;
    }
    return check_complete(M, c, err);
}

void exec_meter_free(ExecMeter *M)
{
    free(M->ops);
    free(M->report);
    free(M->layer_op);
    free(M->keys);
    free(M->slots);
    free(M->events);
    free(M->last_events);
    free(M->step_bubble);
    memset(M, 0, sizeof *M);
}

/* ---- op scopes ---- */

/* The clock at an op's boundary: with op timing the device is waited for first, so that the
 * kernels queued so far are the time of the op that queued them. */
static double boundary(const ExecMeter *M, const KernBackend *k)
{
    if (!M->step_timing)
        k->sync();
    return px_now_s();
}

/* The innermost open op's seconds since it last started or resumed. Step timing keeps none:
 * an op's kernels are only queued when it ends, so the host's clock would time the queueing. */
static void charge(ExecMeter *M, double now)
{
    if (M->depth == 0 || M->step_timing)
        return;
    const int op = M->open[M->depth - 1];
    if (op >= 0)
        M->ops[op].step_s += now - M->op_t0;
}

/* The first scope that did not pair, for exec_meter_scopes_check: op, and the op open at the
 * time (or none open, or too many). */
enum { TOP_NONE = -2, TOP_FULL = -3 };

static void misuse(ExecMeter *M, int op, int top)
{
    if (M->misused)
        return;
    M->misused = 1;
    M->misuse_op = op;
    M->misuse_top = top;
}

static void open_op(ExecMeter *M, const KernBackend *k, int op, int call)
{
    const double now = boundary(M, k);
    charge(M, now); /* the op below pauses */
    if (M->depth == EXEC_METER_DEPTH) {
        misuse(M, op, TOP_FULL);
        return;
    }
    M->open[M->depth++] = op;
    if (call && op >= 0)
        M->ops[op].step_calls += 1;
    M->op_t0 = now;
}

void exec_meter_open(ExecMeter *M, const KernBackend *k, int op) { open_op(M, k, op, 1); }

void exec_meter_open_again(ExecMeter *M, const KernBackend *k, int op) { open_op(M, k, op, 0); }

void exec_meter_close(ExecMeter *M, const KernBackend *k, int op)
{
    const double now = boundary(M, k);
    charge(M, now);
    if (M->depth == 0) {
        misuse(M, op, TOP_NONE);
        return;
    }
    if (M->open[M->depth - 1] != op)
        misuse(M, op, M->open[M->depth - 1]);
    M->depth--;
    M->op_t0 = now; /* the op below resumes */
}

static const char *op_name(const ExecMeter *M, int op)
{
    return op >= 0 ? M->ops[op].name : "one the graph lacks";
}

int exec_meter_scopes_check(const ExecMeter *M, PxError *err)
{
    if (M->misused && M->misuse_top == TOP_FULL)
        return px_fail(err, PX_ERUNTIME, "the trainer opened op %s within %d open ops",
                       op_name(M, M->misuse_op), EXEC_METER_DEPTH);
    if (M->misused && M->misuse_top == TOP_NONE)
        return px_fail(err, PX_ERUNTIME, "the trainer closed op %s, which was not open",
                       op_name(M, M->misuse_op));
    if (M->misused)
        return px_fail(err, PX_ERUNTIME, "the trainer closed op %s while op %s was open within it",
                       op_name(M, M->misuse_op), op_name(M, M->misuse_top));
    if (M->depth > 0)
        return px_fail(err, PX_ERUNTIME, "the step ended with op %s open",
                       op_name(M, M->open[M->depth - 1]));
    return PX_OK;
}

void exec_meter_flops(ExecMeter *M, double flops)
{
    const int op = M->depth > 0 ? M->open[M->depth - 1] : -1;
    if (op >= 0)
        M->ops[op].step_flops += flops;
    else
        M->unattributed_flops += flops;
}

void exec_meter_step_begin(ExecMeter *M, const CommLayer *comm)
{
    for (int i = 0; i < M->graph->count; i++) {
        ExecOpStat *o = &M->ops[i];
        o->step_calls = o->step_flops = o->step_s = 0;
    }
    M->unattributed_flops = 0;
    /* a failed step may have returned from within scopes: this one starts with none open */
    M->depth = 0;
    M->misused = 0;
    for (int k = 0; comm && k < MODEL_COMM_COUNT; k++)
        M->bytes_at_step[k] = comm_bytes(comm, (ModelComm)k);
}

void exec_meter_step_end(ExecMeter *M, const CommLayer *comm, int timed)
{
    for (int i = 0; i < M->graph->count; i++) {
        ExecOpStat *o = &M->ops[i];
        o->last_calls = o->step_calls;
        o->last_flops = o->step_flops;
        if (timed)
            o->timed_s += o->step_s;
    }
    if (timed)
        M->timed_steps++;
    for (int k = 0; comm && k < MODEL_COMM_COUNT; k++)
        M->step_bytes[k] = comm_bytes(comm, (ModelComm)k) - M->bytes_at_step[k];
}

double exec_meter_step_flops(const ExecMeter *M)
{
    double f = M->unattributed_flops;
    for (int i = 0; i < M->graph->count; i++)
        f += M->ops[i].last_flops;
    return f;
}

const ExecOpReport *exec_meter_ops(ExecMeter *M, int *n)
{
    int k = 0;
    for (int i = 0; i < M->graph->count; i++) {
        const ExecOpStat *o = &M->ops[i];
        ExecOpReport *r = &M->report[k++];
        r->name = o->name;
        r->calls = o->last_calls;
        r->flops = o->last_flops;
        r->seconds = M->timed_steps > 0 ? o->timed_s / M->timed_steps : o->step_s;
    }
    *n = k;
    return M->report;
}

/* ---- the pipeline's passes ---- */

void exec_meter_schedule_begin(ExecMeter *M) { M->step_t0 = px_now_s(); }

void exec_meter_pass_input(ExecMeter *M) { M->pass_start = px_now_s(); }

void exec_meter_pass_output(ExecMeter *M) { M->pass_end = px_now_s(); }

void exec_meter_pass_end(ExecMeter *M, int i, int chunk, int mb, int backward)
{
    ExecEvent *ev = &M->events[i];
    ev->chunk = chunk;
    ev->mb = mb;
    ev->backward = backward;
    ev->start_s = M->pass_start - M->step_t0;
    ev->end_s = (M->pass_end >= 0 ? M->pass_end : px_now_s()) - M->step_t0;
    M->pass_end = -1;
}

void exec_meter_schedule_end(ExecMeter *M, int n_actions)
{
    memcpy(M->last_events, M->events, (size_t)n_actions * sizeof *M->events);
    M->n_events = n_actions;
    M->have_events = 1;
}

/* The busy and idle pipeline time of the last recorded step: idle is the time from the step's
 * start to the stage's last pass that no pass used, as the simulator counts a stage's bubble. */
static void bubble_of_step(const ExecMeter *M, double *busy_s, double *idle_s)
{
    double busy = 0, end = 0;
    for (int i = 0; M->have_events && i < M->n_events; i++) {
        const ExecEvent *e = &M->last_events[i];
        busy += e->end_s - e->start_s;
        if (e->end_s > end)
            end = e->end_s;
    }
    *busy_s = busy;
    *idle_s = end > busy ? end - busy : 0;
}

void exec_meter_keep_bubble(ExecMeter *M)
{
    /* every timed step's bubble: one step of a few milliseconds is at the mercy of the
     * scheduler, their median is not */
    double busy, idle;
    bubble_of_step(M, &busy, &idle);
    if (busy > 0 && M->n_bubbles < M->cap_bubbles)
        M->step_bubble[M->n_bubbles++] = idle / busy;
}

double exec_meter_bubble(const ExecMeter *M, double *busy_s, double *idle_s)
{
    double busy, idle;
    bubble_of_step(M, &busy, &idle);
    if (busy_s)
        *busy_s = busy;
    if (idle_s)
        *idle_s = idle;
    if (M->n_bubbles == 0)
        return busy > 0 ? idle / busy : 0;
    return px_median(M->step_bubble, M->n_bubbles);
}

/* ---- the device's memory ---- */

void exec_meter_device_memory(ExecMeter *M, const KernBackend *k, int at_start)
{
    size_t fb = 0, tb = 0;
    if (at_start) {
        if (k->mem_info && k->mem_info(&fb, &tb)) {
            M->have_dev_mem = 1;
            M->dev_total = tb;
            M->dev_used_start = M->dev_used_peak = tb - fb;
        }
        return;
    }
    /* every step samples it: a device without an account (the CPU) is not asked again */
    if (!M->have_dev_mem || !k->mem_info(&fb, &tb))
        return;
    if (tb - fb > M->dev_used_peak)
        M->dev_used_peak = tb - fb;
}
