/* The executor's life cycle: checks that the plan can run here, binds every tensor of the
 * stage's table to a category arena, maps the op graph's names, and runs training steps
 * (schedule, gradient reduction, clipping, learning-rate schedule, optimizer). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/internal.h"

#define EXEC_PI 3.14159265358979323846

void exec_options_defaults(ExecOptions *o)
{
    memset(o, 0, sizeof *o);
    o->prefetch = 1;
}

/* ---- arenas ---- */

void *exec_arena_carve(ExecArena *a, uint64_t bytes, size_t align)
{
    uint64_t off = px_round_up(a->used, align ? align : 1);
    a->used = off + bytes;
    if (!a->base || a->used > a->cap)
        return NULL;
    return a->base + off;
}

/* ---- saved activations of a layer: what each field is and how big ---- */

typedef struct {
    const char *suffix; /* after "layer.<i>." */
    size_t off;         /* offsetof in ExecLayerActs */
    int u8;             /* uint8 mask (else fp32) */
    uint64_t numel;
    int needed; /* the executor writes it in this configuration */
} ActField;

enum { ACT_FIELDS = 14 };

static void act_fields(const Exec *ex, ActField f[ACT_FIELDS])
{
    const ModelDims *d = &ex->d;
    const uint64_t N = (uint64_t)d->b * d->s, h = (uint64_t)d->h;
    const uint64_t qkv = (uint64_t)d->q_loc + 2u * (uint64_t)d->kv_width_loc;
    const uint64_t sq = (uint64_t)d->b * d->heads_loc * d->s * d->s;
    const int flash = ex->spec.job.flash_attn, drop = ex->dropout > 0.0f;
    const ActField t[ACT_FIELDS] = {
        {"ln1.in", offsetof(ExecLayerActs, ln1_in), 0, N * h, 1},
        {"attn.qkv.in", offsetof(ExecLayerActs, qkv_in), 0, N * h, 1},
        {"attn.qkv.out", offsetof(ExecLayerActs, qkv_out), 0, N * qkv, 1},
        {"attn.lse", offsetof(ExecLayerActs, lse), 0, (uint64_t)d->b * d->heads_loc * d->s, flash},
        {"attn.softmax", offsetof(ExecLayerActs, softmax), 0, sq, !flash},
        {"attn.softmax_mask", offsetof(ExecLayerActs, softmax_mask), 1, sq, ex->attn_dropout},
        {"attn.softmax_drop", offsetof(ExecLayerActs, softmax_drop), 0, sq, ex->attn_dropout},
        {"attn.proj.in", offsetof(ExecLayerActs, proj_in), 0, N * (uint64_t)d->q_loc, 1},
        {"attn.drop_mask", offsetof(ExecLayerActs, attn_drop_mask), 1, N * h, drop},
        {"ln2.in", offsetof(ExecLayerActs, ln2_in), 0, N * h, 1},
        {"mlp.fc1.in", offsetof(ExecLayerActs, fc1_in), 0, N * h, 1},
        {"mlp.act.in", offsetof(ExecLayerActs, act_in), 0, N * (uint64_t)d->ffn_out_loc, 1},
        {"mlp.fc2.in", offsetof(ExecLayerActs, fc2_in), 0, N * (uint64_t)d->ffn_loc, 1},
        {"mlp.drop_mask", offsetof(ExecLayerActs, mlp_drop_mask), 1, N * h, drop},
    };
    memcpy(f, t, sizeof t);
}

static void act_set(ExecLayerActs *a, const ActField *f, void *p)
{
    if (f->u8)
        *(uint8_t **)((char *)a + f->off) = p;
    else
        *(float **)((char *)a + f->off) = p;
}

static void *act_get(const ExecLayerActs *a, const ActField *f)
{
    if (f->u8)
        return *(uint8_t *const *)((const char *)a + f->off);
    return *(float *const *)((const char *)a + f->off);
}

static int act_field_index(const ActField *f, const char *suffix)
{
    for (int i = 0; i < ACT_FIELDS; i++)
        if (strcmp(f[i].suffix, suffix) == 0)
            return i;
    return -1;
}

/* "layer.12.attn.qkv.w" -> 12 and the suffix; -1 when the name is not a layer's. */
static int layer_of(const char *name, const char **suffix)
{
    int l = -1, n = 0;
    if (sscanf(name, "layer.%d.%n", &l, &n) != 1 || n == 0)
        return -1;
    *suffix = name + n;
    return l;
}

/* ---- parameters by name ---- */

static float **layer_param(ExecLayerParams *p, const char *suffix)
{
    static const struct {
        const char *s;
        size_t off;
    } map[] = {
        {"ln1.w", offsetof(ExecLayerParams, ln1_w)},
        {"ln1.b", offsetof(ExecLayerParams, ln1_b)},
        {"attn.qkv.w", offsetof(ExecLayerParams, qkv_w)},
        {"attn.qkv.b", offsetof(ExecLayerParams, qkv_b)},
        {"attn.proj.w", offsetof(ExecLayerParams, proj_w)},
        {"attn.proj.b", offsetof(ExecLayerParams, proj_b)},
        {"ln2.w", offsetof(ExecLayerParams, ln2_w)},
        {"ln2.b", offsetof(ExecLayerParams, ln2_b)},
        {"mlp.fc1.w", offsetof(ExecLayerParams, fc1_w)},
        {"mlp.fc1.b", offsetof(ExecLayerParams, fc1_b)},
        {"mlp.fc2.w", offsetof(ExecLayerParams, fc2_w)},
        {"mlp.fc2.b", offsetof(ExecLayerParams, fc2_b)},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i].s, suffix) == 0)
            return (float **)((char *)p + map[i].off);
    return NULL;
}

/* The pointer a weight (grad 0) or gradient (grad 1) named `name` binds to; NULL if unknown. */
static float **param_slot(Exec *ex, const char *name, int grad)
{
    const char *suffix;
    int l = layer_of(name, &suffix);
    if (l >= 0)
        return l < ex->spec.model.layers ? layer_param(grad ? &ex->lg[l] : &ex->lw[l], suffix) : NULL;
    if (!strcmp(name, "embed.wte"))
        return grad ? &ex->g_wte : &ex->wte;
    if (!strcmp(name, "embed.wpe"))
        return grad ? &ex->g_wpe : &ex->wpe;
    if (!strcmp(name, "final_ln.w"))
        return grad ? &ex->g_lnf_w : &ex->lnf_w;
    if (!strcmp(name, "final_ln.b"))
        return grad ? &ex->g_lnf_b : &ex->lnf_b;
    if (!strcmp(name, "logits.w"))
        return grad ? &ex->g_out_w : &ex->out_w;
    return NULL;
}

/* ---- binding the table to the arenas ---- */

static int unknown_tensor(const ModelTensor *t, PxError *err)
{
    return px_fail(err, PX_ERUNTIME,
                   "the executor has no use for tensor %s (%s) of the tensor table: model/ and "
                   "exec/ disagree",
                   t->name, model_category_name(t->cat));
}

static int bind_static(Exec *ex, int pass, PxError *err)
{
    const ModelTensorTable *tt = &ex->tt;
    int np = 0;
    /* weights and gradients in table order, so that a block's parameters are contiguous */
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->per_microbatch || (t->cat != MODEL_WEIGHTS && t->cat != MODEL_GRADS))
            continue;
        void *p = exec_arena_carve(&ex->arena[t->cat], t->bytes, px_dtype_bytes(t->dtype));
        char base[64];
        px_strlcpy(base, t->name, sizeof base);
        int grad = t->cat == MODEL_GRADS;
        if (grad) {
            size_t n = strlen(base);
            if (n < 5 || strcmp(base + n - 5, ".grad") != 0)
                return unknown_tensor(t, err);
            base[n - 5] = '\0';
        }
        float **slot = param_slot(ex, base, grad);
        if (!slot)
            return unknown_tensor(t, err);
        if (pass) {
            *slot = p;
            if (!grad) {
                ExecParam *q = &ex->params[np++];
                q->tensor = i;
                q->w = p;
                q->numel = t->numel;
                q->block = t->block;
                q->decay = t->ndim >= 2;
            }
        }
    }
    /* optimizer state: one flat buffer per block and kind */
    for (int i = 0; i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (t->cat != MODEL_OPTIMIZER && t->cat != MODEL_MASTER)
            continue;
        void *p = exec_arena_carve(&ex->arena[t->cat], t->bytes, px_dtype_bytes(t->dtype));
        const char *dot = strrchr(t->name, '.');
        if (t->cat != MODEL_OPTIMIZER || !dot || t->block < 0)
            return unknown_tensor(t, err);
        if (!strcmp(dot, ".adam_m") || !strcmp(dot, ".momentum")) {
            if (pass)
                ex->opt_m[t->block] = p;
        } else if (!strcmp(dot, ".adam_v")) {
            if (pass)
                ex->opt_v[t->block] = p;
        } else {
            return unknown_tensor(t, err);
        }
    }
    /* workspace: by element size, largest first, so that no tensor needs padding; ws.recompute
     * (bytes that hold fp32 tensors and masks) after the 4-byte ones, where it is aligned */
    for (int pass_size = 8; pass_size >= 1; pass_size /= 2) {
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (t->per_microbatch || t->cat != MODEL_WORKSPACE)
                continue;
            int is_re = !strcmp(t->name, "ws.recompute");
            size_t es = is_re ? 2 : px_dtype_bytes(t->dtype);
            if (es != (size_t)pass_size)
                continue;
            void *p = exec_arena_carve(&ex->arena[MODEL_WORKSPACE], t->bytes, is_re ? 4 : es);
            if (!pass)
                continue;
            const char *n = t->name;
            if (is_re) {
                ex->re_base = p;
                ex->re_bytes = t->bytes;
            } else if (!strcmp(n, "ws.out")) {
                ex->ws_out = p;
            } else if (!strcmp(n, "ws.dx_a")) {
                ex->ws_dx_a = p;
            } else if (!strcmp(n, "ws.dx_b")) {
                ex->ws_dx_b = p;
            } else if (!strcmp(n, "ws.dhid")) {
                ex->ws_dhid = p;
            } else if (!strcmp(n, "ws.dqkv")) {
                ex->ws_dqkv = p;
            } else if (!strcmp(n, "ws.dffn")) {
                ex->ws_dffn = p;
            } else if (!strcmp(n, "ws.dact")) {
                ex->ws_dact = p;
            } else if (!strcmp(n, "ws.dscores")) {
                ex->ws_dscores = p;
            } else if (!strcmp(n, "ws.flash_d")) {
                ex->ws_flash_d = p;
            } else if (!strcmp(n, "ws.xent")) {
                ex->ws_xent = p;
            } else if (!strcmp(n, "data.batch")) {
                ex->batch[0] = p;
                ex->batch[1] = (int32_t *)p + t->numel / 2;
            } else {
                return unknown_tensor(t, err);
            }
        }
    }
    for (int i = 0; i < tt->count; i++)
        if (tt->t[i].cat == MODEL_COMM_BUFFERS)
            return unknown_tensor(&tt->t[i], err);
    return PX_OK;
}

/* ws.recompute holds what the recompute mode does not save: one layer's worth, reused by every
 * layer (forward scratch, then the re-created tensors before the layer's backward). */
static int bind_region(Exec *ex, uint8_t *base, uint64_t bytes, PxError *err)
{
    ActField f[ACT_FIELDS];
    act_fields(ex, f);
    ExecArena r = {.base = base, .cap = bytes};
    ExecLayerActs view;
    memset(&view, 0, sizeof view);
    for (int u8 = 0; u8 <= 1; u8++) {
        for (int i = 0; i < ACT_FIELDS; i++) {
            if (!f[i].needed || f[i].u8 != u8)
                continue;
            /* saved in the slot? then it does not live here (every layer saves the same set) */
            int saved = 0;
            for (int k = 0; k < ex->tt.count && !saved; k++) {
                const char *suffix;
                const ModelTensor *t = &ex->tt.t[k];
                saved = t->per_microbatch && layer_of(t->name, &suffix) == 0 &&
                        !strcmp(suffix, f[i].suffix);
            }
            if (saved)
                continue;
            void *p = exec_arena_carve(&r, f[i].numel * (u8 ? 1 : 4), u8 ? 1 : 4);
            act_set(&view, &f[i], p);
        }
    }
    if (r.used != bytes)
        return px_fail(err, PX_ERUNTIME,
                       "ws.recompute holds %llu bytes but the %s recompute needs %llu: model/ and "
                       "exec/ disagree",
                       (unsigned long long)bytes, model_recompute_name(ex->spec.layout.recompute),
                       (unsigned long long)r.used);
    ex->region = view;
    return PX_OK;
}

/* Saved activations: a pool of n_slots layer sets and one of n_xslots extras, each tensor's
 * copies side by side, fp32 tensors before the uint8 masks so that nothing needs padding. */
static int bind_activations(Exec *ex, int pass, PxError *err)
{
    const ModelTensorTable *tt = &ex->tt;
    const int L = ex->spec.model.layers;
    ActField f[ACT_FIELDS];
    act_fields(ex, f);
    ex->slot_bytes = ex->xslot_bytes = 0;
    for (int es = 8; es >= 1; es /= 2) {
        for (int i = 0; i < tt->count; i++) {
            const ModelTensor *t = &tt->t[i];
            if (!t->per_microbatch || px_dtype_bytes(t->dtype) != (size_t)es)
                continue;
            const char *suffix = NULL;
            int l = layer_of(t->name, &suffix);
            int fi = l >= 0 ? act_field_index(f, suffix) : -1;
            if (l >= 0) {
                if (l >= L || fi < 0 || !f[fi].needed || f[fi].numel != t->numel ||
                    (size_t)es != (f[fi].u8 ? 1u : 4u))
                    return unknown_tensor(t, err);
                ex->slot_bytes += t->bytes;
            } else {
                ex->xslot_bytes += t->bytes;
            }
            int copies = l >= 0 ? ex->n_slots : ex->n_xslots;
            for (int k = 0; k < copies; k++) {
                void *p = exec_arena_carve(&ex->arena[MODEL_ACTIVATIONS], t->bytes, (size_t)es);
                if (!pass)
                    continue;
                if (l >= 0) {
                    act_set(&ex->acts[(size_t)k * L + l], &f[fi], p);
                    continue;
                }
                ExecHeadActs *x = &ex->xacts[k];
                if (!strcmp(t->name, "embed.drop_mask"))
                    x->embed_drop_mask = p;
                else if (!strcmp(t->name, "final_ln.in"))
                    x->final_ln_in = p;
                else if (!strcmp(t->name, "logits.in"))
                    x->logits_in = p;
                else if (!strcmp(t->name, "loss.probs"))
                    x->probs = p;
                else
                    return unknown_tensor(t, err);
            }
        }
    }
    if (!pass)
        return PX_OK;
    /* every slot's layers: what is not saved lives in ws.recompute */
    for (int k = 0; k < ex->n_slots; k++)
        for (int l = 0; l < L; l++)
            for (int i = 0; i < ACT_FIELDS; i++) {
                ExecLayerActs *a = &ex->acts[(size_t)k * L + l];
                if (f[i].needed && !act_get(a, &f[i])) {
                    void *p = act_get(&ex->region, &f[i]);
                    if (!p)
                        return px_fail(err, PX_ERUNTIME,
                                       "layer %d's %s is neither saved nor in ws.recompute: model/ "
                                       "and exec/ disagree",
                                       l, f[i].suffix);
                    act_set(a, &f[i], p);
                }
            }
    for (int k = 0; k < ex->n_xslots; k++) {
        const ExecHeadActs *x = &ex->xacts[k];
        if (!x->final_ln_in || !x->logits_in || !x->probs || (ex->dropout > 0 && !x->embed_drop_mask))
            return px_fail(err, PX_ERUNTIME, "the output layer's saved tensors are incomplete: model/ "
                                             "and exec/ disagree");
    }
    return PX_OK;
}

/* pass 0 sizes the arenas, pass 1 carves them and points every view at its tensor. */
static int bind(Exec *ex, int pass, PxError *err)
{
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        ex->arena[c].used = 0;
    ex->re_base = NULL;
    ex->re_bytes = 0;
    int rc = bind_static(ex, pass, err);
    if (!rc && pass)
        rc = bind_region(ex, ex->re_base, ex->re_bytes, err);
    if (!rc)
        rc = bind_activations(ex, pass, err);
    return rc;
}

static int allocate(Exec *ex, PxError *err)
{
    int rc = bind(ex, 0, err);
    if (rc)
        return rc;
    for (int c = 0; c < MODEL_CAT_COUNT; c++) {
        ExecArena *a = &ex->arena[c];
        a->cap = a->used;
        if (a->cap == 0)
            continue;
        a->base = ex->k->alloc(a->cap);
        if (!a->base)
            return px_fail(err, PX_ERUNTIME, "out of memory: %.3f GiB of %s",
                           (double)a->cap / PX_GIB, model_category_name((ModelCategory)c));
    }
    rc = bind(ex, 1, err);
    for (int c = 0; !rc && c < MODEL_CAT_COUNT; c++)
        if (ex->arena[c].used != ex->arena[c].cap)
            rc = px_fail(err, PX_ERUNTIME, "the %s arena was sized %llu bytes but carved %llu",
                         model_category_name((ModelCategory)c),
                         (unsigned long long)ex->arena[c].cap,
                         (unsigned long long)ex->arena[c].used);
    return rc;
}

/* ---- the op graph's names ---- */

static int phase_slot(ModelPhase p) { return p == MODEL_STEP ? 0 : (int)p; }

static int map_ops(Exec *ex, PxError *err)
{
    static const char *const layer_names[EX_LAYER_OPS] = {
        "ln1", "attn.qkv", "attn.core", "attn.proj", "ln2", "mlp.fc1", "mlp.act", "mlp.fc2"};
    static const char *const other_names[EX_OTHER_OPS] = {"embed", "final_ln", "logits", "loss",
                                                          "optimizer"};
    const int L = ex->spec.model.layers;
    const ModelOpGraph *g = &ex->graph;
    ex->ops = calloc((size_t)(g->count > 0 ? g->count : 1), sizeof *ex->ops);
    ex->report = calloc((size_t)(g->count > 0 ? g->count : 1), sizeof *ex->report);
    ex->layer_op = malloc((size_t)L * EX_LAYER_OPS * EX_PHASES * sizeof *ex->layer_op);
    if (!ex->ops || !ex->report || !ex->layer_op)
        return px_fail(err, PX_ERUNTIME, "out of memory for the op table");
    for (int i = 0; i < L * EX_LAYER_OPS * EX_PHASES; i++)
        ex->layer_op[i] = -1;
    for (int i = 0; i < EX_OTHER_OPS; i++)
        for (int p = 0; p < EX_PHASES; p++)
            ex->other_op[i][p] = -1;
    for (int i = 0; i < g->count; i++) {
        const ModelOp *op = &g->op[i];
        model_op_fullname(op, ex->ops[i].name, sizeof ex->ops[i].name);
        ex->ops[i].compute = op->kind != MODEL_OP_COMM;
        if (!ex->ops[i].compute)
            continue;
        const char *suffix;
        int l = layer_of(op->name, &suffix);
        int found = 0;
        if (l >= 0 && l < L) {
            for (int k = 0; k < EX_LAYER_OPS && !found; k++)
                if (!strcmp(suffix, layer_names[k])) {
                    ex->layer_op[(l * EX_LAYER_OPS + k) * EX_PHASES + phase_slot(op->phase)] = i;
                    found = 1;
                }
        } else {
            for (int k = 0; k < EX_OTHER_OPS && !found; k++)
                if (!strcmp(op->name, other_names[k])) {
                    ex->other_op[k][phase_slot(op->phase)] = i;
                    found = 1;
                }
        }
        if (!found)
            return px_fail(err, PX_ERUNTIME, "the executor does not run op %s of the op graph",
                           ex->ops[i].name);
    }
    /* and every op the executor runs must be in the graph */
    const ModelRecompute rc = ex->spec.layout.recompute;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < EX_LAYER_OPS; k++)
            for (int p = 0; p < EX_PHASES; p++) {
                int want = p != MODEL_RECOMPUTE || rc == MODEL_RECOMPUTE_FULL ||
                           (k == EX_CORE && rc == MODEL_RECOMPUTE_SELECTIVE && !ex->spec.job.flash_attn);
                if (want && ex->layer_op[(l * EX_LAYER_OPS + k) * EX_PHASES + p] < 0)
                    return px_fail(err, PX_ERUNTIME, "the op graph has no layer.%d.%s.%s", l,
                                   layer_names[k], model_phase_name((ModelPhase)p));
            }
    for (int k = 0; k < EX_OTHER_OPS; k++)
        for (int p = 0; p < 2; p++)
            if ((k == EX_OPTIMIZER ? p == 0 : 1) && ex->other_op[k][p] < 0)
                return px_fail(err, PX_ERUNTIME, "the op graph has no %s.%s", other_names[k],
                               k == EX_OPTIMIZER ? "step" : model_phase_name((ModelPhase)p));
    ex->cur_op = -1;
    return PX_OK;
}

/* ---- what this build can run ---- */

static int check_supported(const Exec *ex, const char *origin, PxError *err)
{
    const ModelSpec *s = &ex->spec;
    const ModelDims *d = &ex->d;
    if (d->gpus > 1)
        return px_fail(err, PX_EINPUT,
                       "%s: the layout needs %d ranks (dp %d x tp %d x pp %d x cp %d); the executor "
                       "runs single-rank plans only so far (launching ranks with mpirun or srun "
                       "comes later)",
                       origin, d->gpus, d->dp, d->t, d->p, d->c);
    if (s->job.precision != PX_FP32)
        return px_fail(err, PX_EINPUT,
                       "%s: training.precision %s: the CPU backend trains in fp32 (make the plan "
                       "with --precision fp32)",
                       origin, px_dtype_name(s->job.precision));
    if (s->job.optimizer == MODEL_OPT_ADAM_8BIT)
        return px_fail(err, PX_EINPUT,
                       "%s: training.optimizer adam-8bit is not implemented by the executor yet: "
                       "use adamw or sgd-momentum",
                       origin);
    if (s->layout.zero >= 2)
        return px_fail(err, PX_EINPUT,
                       "%s: layout.zero %d: ZeRO-2 and ZeRO-3 come with the data-parallel "
                       "executor; with one rank use zero 0 or 1",
                       origin, s->layout.zero);
    if (s->model.position == MODEL_POS_ROPE && s->model.head_dim % 2 != 0)
        return px_fail(err, PX_EINPUT, "%s: rotary embeddings need an even head_dim, got %d", origin,
                       s->model.head_dim);
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

/* ---- init and free ---- */

int exec_init(Exec **out, const ModelPlan *plan, const ExecOptions *opt, PxError *err)
{
    *out = NULL;
    Exec *ex = calloc(1, sizeof *ex);
    if (!ex)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    ex->opt = *opt;
    ex->plan = *plan;
    ex->plan.prediction = plan->prediction ? cJSON_Duplicate(plan->prediction, 1) : NULL;
    px_strlcpy(ex->plan_path, opt->plan_path ? opt->plan_path : "plan", sizeof ex->plan_path);
    if (opt->output)
        px_strlcpy(ex->output, opt->output, sizeof ex->output);
    if (opt->metrics)
        px_strlcpy(ex->metrics, opt->metrics, sizeof ex->metrics);
    ex->spec = plan->spec;
    if (opt->data)
        px_strlcpy(ex->spec.job.data, opt->data, sizeof ex->spec.job.data);
    int rc = model_spec_check(&ex->spec, plan->gpus, &ex->d, err);
    if (rc) {
        char msg[sizeof err->msg];
        px_strlcpy(msg, err->msg, sizeof msg);
        rc = px_fail(err, PX_EINPUT, "%s: %s", ex->plan_path, msg);
        goto fail;
    }
    ex->plan.spec = ex->spec;
    if ((rc = check_supported(ex, ex->plan_path, err)))
        goto fail;
    /* a run.json that cannot be written is found out now, not after the training */
    if (ex->output[0] && (rc = check_writable(ex->output, err)))
        goto fail;
    if (ex->metrics[0] && (rc = check_writable(ex->metrics, err)))
        goto fail;
    ex->steps = opt->steps > 0 ? opt->steps : ex->spec.job.steps;
    if (ex->steps < 1) {
        rc = px_fail(err, PX_EINPUT, "%s: training.steps is 0: nothing to run (give --steps N)",
                     ex->plan_path);
        goto fail;
    }
    /* run.json records the job as run: --steps and --data included */
    ex->spec.job.steps = ex->steps;
    ex->plan.spec = ex->spec;
    ex->dropout = (float)ex->spec.job.dropout;
    /* The fused (flash) kernel has no dropout of the attention probabilities; the residual and
     * embedding dropouts still apply. */
    ex->attn_dropout = ex->dropout > 0.0f && !ex->spec.job.flash_attn;
    if ((rc = prof_cluster_load(plan->cluster, NULL, 0, &ex->cluster, err))) {
        char msg[sizeof err->msg];
        px_strlcpy(msg, err->msg, sizeof msg);
        rc = px_fail(err, rc, "%s: cluster: %s", ex->plan_path, msg);
        goto fail;
    }
    if ((rc = sim_run(&ex->spec, &ex->cluster, ex->d.gpus, &ex->sim, err)))
        goto fail;
    ex->have_sim = 1;
    ex->k = kern_cpu();
    ex->comm = exec_comm_single();
    if (!ex->comm) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory");
        goto fail;
    }
    ex->stage = 0;
    if ((rc = model_tensors_build(&ex->spec, &ex->d, ex->stage, &ex->tt, err)) ||
        (rc = model_ops_build(&ex->spec, &ex->d, ex->stage, &ex->graph, err)))
        goto fail;

    /* the schedule and the live sets it needs */
    const ModelDims *d = &ex->d;
    const int L = ex->spec.model.layers;
    ex->actions = malloc((size_t)2 * d->m * d->v * sizeof *ex->actions);
    ex->mb_slot = malloc((size_t)d->m * sizeof *ex->mb_slot);
    ex->mb_xslot = malloc((size_t)d->m * sizeof *ex->mb_xslot);
    if (!ex->actions || !ex->mb_slot || !ex->mb_xslot) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory for the schedule");
        goto fail;
    }
    ex->n_actions = model_schedule_build(d, ex->spec.layout.schedule, ex->stage, ex->actions);
    int max_live[1] = {0};
    model_schedule_live(ex->actions, ex->n_actions, d->v, &ex->n_slots, max_live);
    ex->n_xslots = max_live[0];

    /* the data, before memory: a bad file should fail fast */
    if ((rc = exec_data_open(&ex->data, ex->spec.job.data, ex->spec.model.vocab,
                             ex->spec.job.global_batch, d->s, err)))
        goto fail;

    int n_params = 0;
    for (int i = 0; i < ex->tt.count; i++)
        n_params += ex->tt.t[i].cat == MODEL_WEIGHTS;
    ex->params = calloc((size_t)(n_params > 0 ? n_params : 1), sizeof *ex->params);
    ex->n_params = n_params;
    ex->lw = calloc((size_t)(L > 0 ? L : 1), sizeof *ex->lw);
    ex->lg = calloc((size_t)(L > 0 ? L : 1), sizeof *ex->lg);
    ex->opt_m = calloc((size_t)(ex->tt.n_blocks > 0 ? ex->tt.n_blocks : 1), sizeof *ex->opt_m);
    ex->opt_v = calloc((size_t)(ex->tt.n_blocks > 0 ? ex->tt.n_blocks : 1), sizeof *ex->opt_v);
    ex->acts = calloc((size_t)(ex->n_slots > 0 ? ex->n_slots : 1) * (size_t)(L > 0 ? L : 1),
                      sizeof *ex->acts);
    ex->xacts = calloc((size_t)(ex->n_xslots > 0 ? ex->n_xslots : 1), sizeof *ex->xacts);
    ex->slot_busy = calloc((size_t)(ex->n_slots > 0 ? ex->n_slots : 1), sizeof *ex->slot_busy);
    ex->xslot_busy = calloc((size_t)(ex->n_xslots > 0 ? ex->n_xslots : 1), sizeof *ex->xslot_busy);
    ex->step_loss = calloc((size_t)ex->steps, sizeof *ex->step_loss);
    ex->step_time = calloc((size_t)ex->steps, sizeof *ex->step_time);
    ex->step_tps = calloc((size_t)ex->steps, sizeof *ex->step_tps);
    if (!ex->params || !ex->lw || !ex->lg || !ex->opt_m || !ex->opt_v || !ex->acts || !ex->xacts ||
        !ex->slot_busy || !ex->xslot_busy || !ex->step_loss || !ex->step_time || !ex->step_tps) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory");
        goto fail;
    }
    if ((rc = allocate(ex, err)))
        goto fail;
    /* the pools are what the simulator counts for this schedule */
    if (ex->arena[MODEL_ACTIVATIONS].cap != model_activation_bytes(&ex->tt, d->v, ex->n_slots, max_live)) {
        rc = px_fail(err, PX_ERUNTIME,
                     "the activation pools hold %llu bytes but model_activation_bytes counts %llu: "
                     "model/ and exec/ disagree",
                     (unsigned long long)ex->arena[MODEL_ACTIVATIONS].cap,
                     (unsigned long long)model_activation_bytes(&ex->tt, d->v, ex->n_slots, max_live));
        goto fail;
    }
    if (ex->spec.model.tied_embeddings) {
        ex->out_w = ex->wte;
        ex->g_out_w = ex->g_wte;
    }
    /* gradients of each parameter, and its place in its block's optimizer state */
    {
        uint64_t *off = calloc((size_t)(ex->tt.n_blocks > 0 ? ex->tt.n_blocks : 1), sizeof *off);
        if (!off) {
            rc = px_fail(err, PX_ERUNTIME, "out of memory");
            goto fail;
        }
        for (int i = 0; i < ex->n_params; i++) {
            ExecParam *p = &ex->params[i];
            char gname[72];
            snprintf(gname, sizeof gname, "%s.grad", ex->tt.t[p->tensor].name);
            uint64_t n = 0;
            p->g = exec_tensor(ex, gname, &n);
            p->state_off = off[p->block];
            off[p->block] += p->numel;
        }
        free(off);
    }
    ex->grads_base = (float *)ex->arena[MODEL_GRADS].base;
    ex->grads_numel = ex->arena[MODEL_GRADS].used / sizeof(float);
    if ((rc = map_ops(ex, err)))
        goto fail;
    exec_init_params(ex);

    ExecLoader *ld = &ex->loader;
    ld->src = &ex->data;
    ld->buf[0] = ex->batch[0];
    ld->buf[1] = ex->batch[1];
    ld->rows = d->m * d->b;
    ld->row_len = d->s + 1;
    ld->seq_len = d->s;
    ld->global_batch = ex->spec.job.global_batch;
    ld->first_seq = 0; /* dp rank 0 */
    ld->key = exec_hash_name(ex->spec.job.seed, "data");
    if ((rc = exec_loader_start(ld, 0, err)))
        goto fail;
    ex->loader_started = 1;
    *out = ex;
    return PX_OK;
fail:
    exec_free(ex);
    return rc;
}

void exec_free(Exec *ex)
{
    if (!ex)
        return;
    if (ex->loader_started)
        exec_loader_stop(&ex->loader);
    exec_data_close(&ex->data);
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        if (ex->k && ex->arena[c].base)
            ex->k->free(ex->arena[c].base);
    if (ex->comm)
        ex->comm->free(ex->comm);
    if (ex->have_sim)
        sim_result_free(&ex->sim);
    model_tensors_free(&ex->tt);
    model_ops_free(&ex->graph);
    model_plan_free(&ex->plan);
    free(ex->params);
    free(ex->lw);
    free(ex->lg);
    free(ex->opt_m);
    free(ex->opt_v);
    free(ex->acts);
    free(ex->xacts);
    free(ex->slot_busy);
    free(ex->xslot_busy);
    free(ex->actions);
    free(ex->mb_slot);
    free(ex->mb_xslot);
    free(ex->ops);
    free(ex->report);
    free(ex->layer_op);
    free(ex->step_loss);
    free(ex->step_time);
    free(ex->step_tps);
    free(ex);
}

/* ---- accessors ---- */

float *exec_tensor(Exec *ex, const char *name, uint64_t *numel)
{
    for (int i = 0; i < ex->tt.count; i++) {
        const ModelTensor *t = &ex->tt.t[i];
        if (t->per_microbatch || strcmp(t->name, name) != 0)
            continue;
        if (t->cat != MODEL_WEIGHTS && t->cat != MODEL_GRADS)
            return NULL;
        char base[64];
        px_strlcpy(base, name, sizeof base);
        int grad = t->cat == MODEL_GRADS;
        if (grad)
            base[strlen(base) - 5] = '\0';
        float **slot = param_slot(ex, base, grad);
        if (numel)
            *numel = t->numel;
        return slot ? *slot : NULL;
    }
    return NULL;
}

const ModelTensorTable *exec_table(const Exec *ex) { return &ex->tt; }

void exec_memory(const Exec *ex, uint64_t bytes[MODEL_CAT_COUNT])
{
    for (int c = 0; c < MODEL_CAT_COUNT; c++)
        bytes[c] = ex->arena[c].cap;
    bytes[MODEL_RUNTIME] = ex->cluster.device.runtime_bytes;
}

uint64_t exec_activations_in_use_peak(const Exec *ex)
{
    return (uint64_t)ex->peak_live * ex->slot_bytes + (uint64_t)ex->peak_xlive * ex->xslot_bytes;
}

/* ---- a training step ---- */

static int acquire(int *busy, int n, int *live, int *peak)
{
    for (int i = 0; i < n; i++)
        if (!busy[i]) {
            busy[i] = 1;
            if (++*live > *peak)
                *peak = *live;
            return i;
        }
    return -1;
}

static void release(int *busy, int i, int *live)
{
    busy[i] = 0;
    --*live;
}

/* Every micro-batch's forward and backward in the schedule's order; gradients are zeroed first
 * and accumulate over the micro-batches. */
static int run_microbatches(Exec *ex, int step, int backward, double *loss, PxError *err)
{
    const ModelDims *d = &ex->d;
    const int32_t *batch = NULL;
    int rc = exec_loader_get(&ex->loader, step, &batch, err);
    if (rc)
        return rc;
    ex->cur_step = step;
    ex->seq_base = (long long)step * ex->spec.job.global_batch + ex->loader.first_seq;
    if (backward)
        ex->k->memset0(ex->grads_base, ex->grads_numel * sizeof(float));
    const size_t mb_tokens = (size_t)d->b * (size_t)(d->s + 1);
    double sum = 0.0;
    for (int i = 0; i < ex->n_actions; i++) {
        const ModelAction *a = &ex->actions[i];
        const int32_t *tok = batch + (size_t)a->mb * mb_tokens;
        if (!backward) {
            if (a->backward)
                continue;
            /* forward only: one slot serves every micro-batch in turn */
            ex->live = ex->xlive = 0;
            exec_forward(ex, a->mb, 0, 0, tok, &sum);
            continue;
        }
        if (!a->backward) {
            int s = acquire(ex->slot_busy, ex->n_slots, &ex->live, &ex->peak_live);
            int x = acquire(ex->xslot_busy, ex->n_xslots, &ex->xlive, &ex->peak_xlive);
            if (s < 0 || x < 0)
                return px_fail(err, PX_ERUNTIME,
                               "no free activation slot for micro-batch %d: the schedule holds more "
                               "sets than model_schedule_live counted",
                               a->mb);
            ex->mb_slot[a->mb] = s;
            ex->mb_xslot[a->mb] = x;
            exec_forward(ex, a->mb, s, x, tok, &sum);
        } else {
            exec_backward(ex, a->mb, ex->mb_slot[a->mb], ex->mb_xslot[a->mb], tok);
            release(ex->slot_busy, ex->mb_slot[a->mb], &ex->live);
            release(ex->xslot_busy, ex->mb_xslot[a->mb], &ex->xlive);
        }
    }
    if (!backward) {
        *loss = sum / ((double)ex->spec.job.global_batch * d->s);
        return PX_OK;
    }
    /* Gradients are reduced per block over the data-parallel group (Megatron's buckets); with
     * one rank the call moves nothing. */
    for (int i = 0; i < ex->n_params; i++) {
        const ExecParam *p = &ex->params[i];
        if ((rc = ex->comm->allreduce(ex->comm, p->g, p->numel, PX_FP32, MODEL_DP_ALLREDUCE, err)))
            return rc;
    }
    *loss = sum / ((double)ex->spec.job.global_batch * d->s);
    return PX_OK;
}

int exec_grads(Exec *ex, int step, double *loss, PxError *err)
{
    exec_ops_step_begin(ex);
    int rc = run_microbatches(ex, step, 1, loss, err);
    exec_ops_step_end(ex, 0);
    return rc;
}

int exec_loss(Exec *ex, int step, double *loss, PxError *err)
{
    exec_ops_step_begin(ex);
    int rc = run_microbatches(ex, step, 0, loss, err);
    exec_ops_step_end(ex, 0);
    return rc;
}

/* Linear warm-up over warmup_steps, then cosine decay to min_lr at the last step. */
static double lr_at(const ModelJob *j, int step, int steps)
{
    if (j->warmup_steps > 0 && step < j->warmup_steps)
        return j->lr * (double)(step + 1) / j->warmup_steps;
    int decay = steps - j->warmup_steps;
    if (decay <= 1)
        return j->lr;
    double progress = (double)(step - j->warmup_steps) / (double)(decay - 1);
    if (progress > 1.0)
        progress = 1.0;
    return j->min_lr + 0.5 * (j->lr - j->min_lr) * (1.0 + cos(EXEC_PI * progress));
}

static int optimizer_step(Exec *ex, int step, double *lr_out, double *norm_out, PxError *err)
{
    const ModelJob *j = &ex->spec.job;
    const KernBackend *k = ex->k;
    exec_op_begin(ex, ex->other_op[EX_OPTIMIZER][0]);
    double norm = sqrt(k->sumsq(ex->grads_base, ex->grads_numel));
    *norm_out = norm;
    if (!isfinite(norm)) {
        exec_op_end(ex);
        return px_fail(err, PX_ERUNTIME,
                       "step %d: the gradient norm is %g: training diverged (lower training.lr)",
                       step + 1, norm);
    }
    float scale = j->grad_clip > 0 && norm > j->grad_clip ? (float)(j->grad_clip / norm) : 1.0f;
    double lr = lr_at(j, step, ex->steps);
    *lr_out = lr;
    for (int i = 0; i < ex->n_params; i++) {
        const ExecParam *p = &ex->params[i];
        float wd = p->decay ? (float)j->weight_decay : 0.0f;
        float *m = ex->opt_m[p->block] + p->state_off;
        if (j->optimizer == MODEL_OPT_ADAMW)
            k->adamw(NULL, p->w, p->g, m, ex->opt_v[p->block] + p->state_off, p->numel, (float)lr,
                     (float)j->beta1, (float)j->beta2, (float)j->adam_eps, wd, step + 1, scale);
        else
            k->sgd_momentum(NULL, p->w, p->g, m, p->numel, (float)lr, (float)j->momentum, wd,
                            scale);
    }
    exec_op_end(ex);
    return PX_OK;
}

int exec_step(Exec *ex, int step, ExecStepStats *st, PxError *err)
{
    double t0 = exec_now();
    exec_ops_step_begin(ex);
    double loss = 0, lr = 0, norm = 0;
    int rc = run_microbatches(ex, step, 1, &loss, err);
    if (!rc)
        rc = optimizer_step(ex, step, &lr, &norm, err);
    ex->k->sync();
    double dt = exec_now() - t0;
    exec_ops_step_end(ex, ex->steps_done > 0 || ex->steps == 1);
    if (rc)
        return rc;
    memset(st, 0, sizeof *st);
    st->step = step + 1;
    st->loss = loss;
    st->lr = lr;
    st->grad_norm = norm;
    st->time_s = dt;
    st->tokens_per_s = dt > 0 ? (double)ex->spec.job.global_batch * ex->d.s / dt : 0;
    if (ex->steps_done < ex->steps) {
        ex->step_loss[ex->steps_done] = loss;
        ex->step_time[ex->steps_done] = dt;
        ex->step_tps[ex->steps_done] = st->tokens_per_s;
        ex->steps_done++;
    }
    return PX_OK;
}
