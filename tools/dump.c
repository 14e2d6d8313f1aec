/* exec_dump — what an outside implementation needs to check the executor's model: for a
 * single-rank plan, the initial weights, the first step's batch, and the loss and gradients of
 * that batch (exec_grads, before any update), written as one JSON file:
 *   exec_dump plan.json tiny.dump
 *   python3 scripts/pytorch_check.py tiny.dump     (scripts/gpu.sh's pytorch step)
 * {"schema_version": 1, "model": {config}, "tokens": [[s + 1 ints] x rows], "loss": x,
 *  "weights": {name: {"shape": [..], "data": [..]}}, "grads": {name: [..]}}
 * Built, not installed; the CPU backend in fp32 (the reference the CUDA backend is held to). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/train/train.h"

static cJSON *floats(const float *v, uint64_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (uint64_t i = 0; i < n && a; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

/* The parameter tensors of the table (weights, not ZeRO shards), in table order. */
static int is_weight(const ModelTensor *t)
{
    return t->cat == MODEL_WEIGHTS && !t->per_microbatch && t->role != MODEL_TR_W_SHARD;
}

/* The gradient tensor of weight w (the same role and layer). */
static const ModelTensor *grad_of(const ModelTensorTable *tt, const ModelTensor *w)
{
    for (int i = 0; i < tt->count; i++)
        if (tt->t[i].cat == MODEL_GRADS && tt->t[i].role == w->role && tt->t[i].layer == w->layer)
            return &tt->t[i];
    return NULL;
}

static int dump(Exec *ex, cJSON *j, const char *out, PxError *err)
{
    const ModelConfig *c = &exec_spec(ex)->model;
    const ModelDims *d = exec_dims(ex);
    const ModelTensorTable *tt = exec_table(ex);
    cJSON_AddNumberToObject(j, "schema_version", 1);
    cJSON *m = cJSON_AddObjectToObject(j, "model");
    cJSON_AddStringToObject(m, "name", c->name);
    cJSON_AddNumberToObject(m, "layers", c->layers);
    cJSON_AddNumberToObject(m, "hidden", c->hidden);
    cJSON_AddNumberToObject(m, "heads", c->heads);
    cJSON_AddNumberToObject(m, "kv_heads", c->kv_heads);
    cJSON_AddNumberToObject(m, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(m, "vocab", c->vocab);
    cJSON_AddStringToObject(m, "norm", c->norm == MODEL_LAYERNORM ? "layernorm" : "rmsnorm");
    cJSON_AddStringToObject(m, "mlp", c->mlp == MODEL_SWIGLU ? "swiglu" : "gelu");
    cJSON_AddStringToObject(m, "position", c->position == MODEL_POS_ROPE ? "rope" : "learned");
    cJSON_AddBoolToObject(m, "tied_embeddings", c->tied_embeddings);
    cJSON_AddNumberToObject(m, "norm_eps", c->norm_eps);
    cJSON_AddNumberToObject(m, "seq", d->s);
    cJSON_AddNumberToObject(m, "dropout", exec_spec(ex)->job.dropout);
    /* the first step's sequences: every micro-batch's, in order */
    const int32_t *batch = NULL;
    int rc = exec_batch(ex, 0, &batch, err);
    cJSON *toks = cJSON_AddArrayToObject(j, "tokens");
    const int rows = d->m * d->b, len = d->s + 1;
    for (int r = 0; !rc && r < rows; r++) {
        cJSON *row = cJSON_CreateArray();
        for (int t = 0; t < len; t++)
            cJSON_AddItemToArray(row, cJSON_CreateNumber(batch[(size_t)r * len + t]));
        cJSON_AddItemToArray(toks, row);
    }
    cJSON *w = cJSON_AddObjectToObject(j, "weights");
    for (int i = 0; !rc && i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i];
        if (!is_weight(t))
            continue;
        cJSON *e = cJSON_AddObjectToObject(w, t->name);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[0]));
        if (t->ndim > 1 && t->shape[1] > 1)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[1]));
        cJSON_AddItemToObject(e, "data", floats(exec_tensor(ex, t->name, NULL), t->numel));
    }
    double loss = 0;
    if (!rc)
        rc = exec_grads(ex, 0, &loss, err);
    cJSON_AddNumberToObject(j, "loss", loss);
    cJSON *g = cJSON_AddObjectToObject(j, "grads");
    for (int i = 0; !rc && i < tt->count; i++) {
        const ModelTensor *t = &tt->t[i], *gt = is_weight(t) ? grad_of(tt, t) : NULL;
        if (gt)
            cJSON_AddItemToObject(g, t->name, floats(exec_tensor(ex, gt->name, NULL), gt->numel));
    }
    return rc ? rc : px_json_write_file(out, j, err);
}

/* No options of its own: the table gives -h, --help and the parsing of operands. */
static const PxOption dump_options[] = {{NULL, 0, NULL, NULL, 0, 0}};

static const char *const dump_usage = "exec_dump PLAN.json OUT.json";
static const char *const dump_about =
    "Writes a single-rank plan's initial weights, its first step's batch, and the loss and\n"
    "gradients of that batch (before any update) as one JSON file, for an outside\n"
    "implementation to check (scripts/pytorch_check.py).";

/* The command line: *plan and *out from the operands; -1 to go on, else the exit status. */
static int parse(int argc, char **argv, const char **plan, const char **out)
{
    const PxOption *const tables[] = {dump_options, NULL};
    PxError err = {0};
    int first;
    int rc = px_opts_parse(tables, argc, argv, "(see 'exec_dump --help')", NULL, NULL, 2, &first,
                           &err);
    if (rc == PX_OPTS_HELP) {
        char usage[512];
        snprintf(usage, sizeof usage, "%s\n\n%s", dump_usage, dump_about);
        px_opts_help(stdout, usage, tables);
        return 0;
    }
    if (!rc && argc - first != 2)
        rc = px_fail(&err, PX_EINPUT, "expected PLAN.json and OUT.json (see 'exec_dump --help')");
    if (rc) {
        fprintf(stderr, "exec_dump: %s\n", err.msg);
        return rc;
    }
    *plan = argv[first];
    *out = argv[first + 1];
    return -1;
}

int main(int argc, char **argv)
{
    const char *plan_path = NULL, *out = NULL;
    int status = parse(argc, argv, &plan_path, &out);
    if (status >= 0)
        return status;
    PxError err = {0};
    ModelPlan plan;
    memset(&plan, 0, sizeof plan);
    ExecOptions opt;
    exec_options_defaults(&opt);
    opt.quiet = 1;
    opt.prefetch = 0;
    opt.backend = EXEC_BACKEND_CPU;
    opt.plan_path = plan_path;
    Exec *ex = NULL;
    int rc = model_plan_read(plan_path, &plan, &err);
    if (!rc && plan.gpus != 1)
        rc = px_fail(&err, PX_EINPUT, "%s: exec_dump takes single-rank plans", plan_path);
    if (!rc)
        rc = exec_init(&ex, &plan, &opt, &err);
    cJSON *j = rc ? NULL : cJSON_CreateObject();
    if (j)
        rc = dump(ex, j, out, &err);
    cJSON_Delete(j);
    exec_free(ex);
    model_plan_free(&plan);
    if (rc) {
        fprintf(stderr, "exec_dump: %s\n", err.msg);
        return rc == PX_EINPUT ? 2 : 1;
    }
    printf("wrote %s\n", out);
    return 0;
}
