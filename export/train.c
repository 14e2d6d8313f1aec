/* The training length and the learning-rate schedule every export writes (docs/exports.md,
 * "Training length and schedule"): iterations from the plan's tokens, the warm-up and the
 * schedule from the plan's job when its user set them, else from the model's published recipe
 * (the zoo JSON's "recipe" object, with its citation), else parallax's defaults, said as a
 * warning. A figure equal to its field's default (model/fields.c) counts as not set: the
 * defaults are the executor's test-run settings, which a real job never wants silently. Called
 * by the format files; calls model/ only. */
#include "export/internal.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

/* The zoo's recipe as read from its JSON: tokens figures convert to the plan's iterations,
 * steps figures are taken as published (they are at the recipe's own batch). 0: not given. */
typedef struct {
    double lr, min_lr;
    int warmup_steps;
    double warmup_tokens;
    int wsd; /* decay_style "wsd": held at the peak, then cosine */
    int decay_end_steps;
    double decay_end_tokens, wsd_decay_tokens, train_tokens;
    char note[256], source[512];
} TrainRecipe;

static void say(ExportTrain *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(ExportTrain *t, const char *fmt, ...)
{
    size_t n = strlen(t->notes);
    if (n + 2 >= sizeof t->notes)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->notes + n, sizeof t->notes - n, fmt, ap);
    va_end(ap);
    n = strlen(t->notes);
    if (n + 1 < sizeof t->notes)
        strcat(t->notes, "\n");
}

/* 1 when the job's field differs from its default: the user set it */
static int job_set(const ModelJob *j, ModelFieldId id)
{
    const ModelField *f = model_field(id);
    const char *at = (const char *)j + f->at;
    if (f->type == MODEL_FT_INT) {
        int v;
        memcpy(&v, at, sizeof v);
        return v != (int)f->def;
    }
    double v;
    memcpy(&v, at, sizeof v);
    return v != f->def;
}

/* The plan's model's recipe, when the model is a zoo model with one, unchanged (a model
 * resized from the zoo's is another model): 1 and *r filled, 0 when none, PX_EINPUT (as a
 * negative number) when the zoo's recipe is malformed. */
static int recipe_of(const ModelConfig *c, TrainRecipe *r, PxError *err)
{
    memset(r, 0, sizeof *r);
    const char *text = model_zoo_text(c->name);
    if (!text)
        return 0;
    char where[128];
    snprintf(where, sizeof where, "zoo model %s: recipe:", c->name);
    cJSON *j = px_json_parse(text, where, err);
    if (!j)
        return -PX_EINPUT;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "recipe");
    ModelConfig zoo;
    int found = 0, rc = 0;
    if (o && model_config_from_json(j, where, &zoo, err) == PX_OK) {
        cJSON *a = model_config_to_json(&zoo), *b = model_config_to_json(c);
        found = cJSON_Compare(a, b, 1);
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
    char style[16] = "cosine";
    if (found)
        rc = px_json_double(o, where, "lr", 1, 1e-9, 10, &r->lr, err) ||
             px_json_double(o, where, "min_lr", 1, 0, 10, &r->min_lr, err) ||
             px_json_int(o, where, "warmup_steps", 0, 0, INT_MAX, &r->warmup_steps, err) ||
             px_json_double(o, where, "warmup_tokens", 0, 0, 1e30, &r->warmup_tokens, err) ||
             px_json_string(o, where, "decay_style", 0, style, sizeof style, err) ||
             px_json_int(o, where, "decay_end_steps", 0, 0, INT_MAX, &r->decay_end_steps, err) ||
             px_json_double(o, where, "decay_end_tokens", 0, 0, 1e30, &r->decay_end_tokens, err) ||
             px_json_double(o, where, "wsd_decay_tokens", 0, 0, 1e30, &r->wsd_decay_tokens, err) ||
             px_json_double(o, where, "train_tokens", 1, 1, 1e30, &r->train_tokens, err) ||
             px_json_string(o, where, "note", 0, r->note, sizeof r->note, err) ||
             px_json_string(o, where, "source", 1, r->source, sizeof r->source, err);
    r->wsd = strcmp(style, "wsd") == 0;
    if (found && !rc && (!(r->wsd || strcmp(style, "cosine") == 0) || (r->wsd && r->wsd_decay_tokens <= 0)))
        rc = px_fail(err, PX_EINPUT, "%s decay_style: \"cosine\", or \"wsd\" with wsd_decay_tokens", where);
    cJSON_Delete(j);
    return rc ? -PX_EINPUT : found;
}

/* a token count as people write it: 15T, 375M, 4096 */
static const char *tokens_str(char *buf, size_t cap, double v)
{
    static const struct { double unit; const char *suffix; } units[] = {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (v >= units[i].unit) {
            snprintf(buf, cap, "%.4g%s", v / units[i].unit, units[i].suffix);
            return buf;
        }
    snprintf(buf, cap, "%.4g", v);
    return buf;
}

/* tokens as iterations of the plan's batch, rounded up, at most INT_MAX (the frameworks'
 * iteration counters; train_length refuses a longer training, a recipe's figure past it is
 * past any training anyway) */
static int iters_of(double tokens, double batch_tokens)
{
    const double n = ceil(tokens / batch_tokens);
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* The iterations and where they come from: the plan's tokens, its --steps, the recipe's tokens,
 * parallax's default steps. */
static int train_length(const ModelPlan *p, const TrainRecipe *r, int has_recipe, double bt, ExportTrain *t,
                        PxError *err)
{
    const ModelJob *j = &p->spec.job;
    const double tokens = j->train_tokens > 0                                ? j->train_tokens
                          : has_recipe && !job_set(j, MODEL_FIELD_STEPS) ? r->train_tokens
                                                                         : 0;
    if (tokens > 0) {
        if (ceil(tokens / bt) > INT_MAX)
            return px_fail(err, PX_EINPUT,
                           "train_tokens %g: %.4g iterations of %g tokens (global batch x sequence) exceed %d, "
                           "the frameworks' iteration counters: plan a larger --global-batch",
                           tokens, ceil(tokens / bt), bt, INT_MAX);
        t->iters = iters_of(tokens, bt);
        t->recipe = j->train_tokens <= 0;
        char tok[32];
        say(t, "training length: %d iterations = %s tokens / (%d sequences x %d tokens), rounded up: %s", t->iters,
            tokens_str(tok, sizeof tok, tokens), j->global_batch, (int)(bt / j->global_batch),
            j->train_tokens > 0 ? "the plan's --tokens" : "the recipe's tokens (plan with --tokens N for another length)");
    } else if (job_set(j, MODEL_FIELD_STEPS)) {
        t->iters = j->steps;
        say(t, "training length: %d iterations, the plan's --steps", t->iters);
    } else {
        t->iters = j->steps;
        t->defaults = 1;
        say(t, "WARNING: training length %d iterations is parallax's default --steps, a test run: plan with "
               "--tokens N (or --steps N) for a real one", t->iters);
    }
    return PX_OK;
}

/* The decay: the recipe's when its learning rate is used, else cosine to the last iteration. */
static void train_decay(const TrainRecipe *r, int use_recipe, double bt, ExportTrain *t)
{
    t->decay_iters = t->iters;
    if (use_recipe && r->decay_end_tokens > 0)
        t->decay_iters = iters_of(r->decay_end_tokens, bt);
    else if (use_recipe && r->decay_end_steps > 0)
        t->decay_iters = r->decay_end_steps;
    if (use_recipe && r->wsd) {
        t->wsd = 1;
        t->wsd_iters = iters_of(r->wsd_decay_tokens, bt);
        if (t->wsd_iters > t->decay_iters)
            t->wsd_iters = t->decay_iters;
    }
    if (t->warmup >= t->decay_iters) {
        const int was = t->warmup;
        t->warmup = t->decay_iters > 1 ? t->decay_iters - 1 : 0;
        say(t, "WARNING: a warm-up of %d iterations does not end before the decay's end (%d): cut to %d", was,
            t->decay_iters, t->warmup);
    }
    if (t->wsd)
        say(t, "decay: warm-up-stable-decay, held at the peak to iteration %d, then cosine to the minimum at %d%s",
            t->decay_iters - t->wsd_iters, t->decay_iters,
            t->decay_iters < t->iters ? ", held there to the end" : "");
    else
        say(t, "decay: cosine from the warm-up's end to the minimum at iteration %d%s", t->decay_iters,
            t->decay_iters < t->iters   ? ", held there to the end"
            : t->decay_iters > t->iters ? " (past the last: the minimum is not reached)"
                                        : " (the last)");
}

int export_train(const ModelPlan *p, const ModelDims *d, ExportTrain *t, PxError *err)
{
    const ModelJob *j = &p->spec.job;
    memset(t, 0, sizeof *t);
    TrainRecipe r;
    const int has = recipe_of(&p->spec.model, &r, err);
    if (has < 0)
        return -has;
    const double bt = (double)j->global_batch * d->s;
    char tok[32];
    int rc = train_length(p, &r, has, bt, t, err);
    if (rc)
        return rc;

    /* the peak and the minimum go together: a recipe's minimum under the user's peak would be
     * neither's schedule */
    const int lr_set = job_set(j, MODEL_FIELD_LR) || job_set(j, MODEL_FIELD_MIN_LR);
    const int use_recipe = has && !lr_set;
    t->lr = use_recipe ? r.lr : j->lr;
    t->min_lr = use_recipe ? r.min_lr : j->min_lr;
    t->recipe |= use_recipe;
    if (lr_set)
        say(t, "learning rate: peak %g, minimum %g, the plan's --lr / --min-lr", t->lr, t->min_lr);
    else if (use_recipe)
        say(t, "learning rate: peak %g, minimum %g, the model's published recipe", t->lr, t->min_lr);
    else {
        t->defaults = 1;
        say(t, "WARNING: learning rate peak %g, minimum %g are parallax's defaults, not tuned for this model: plan "
               "with --lr X --min-lr X", t->lr, t->min_lr);
    }

    if (job_set(j, MODEL_FIELD_WARMUP_STEPS)) {
        t->warmup = j->warmup_steps;
        say(t, "warm-up: %d iterations, the plan's --warmup-steps", t->warmup);
    } else if (has && (r.warmup_steps > 0 || r.warmup_tokens > 0)) {
        t->warmup = r.warmup_tokens > 0 ? iters_of(r.warmup_tokens, bt) : r.warmup_steps;
        t->recipe = 1;
        if (r.warmup_tokens > 0)
            say(t, "warm-up: %d iterations = the recipe's %s tokens, rounded up", t->warmup,
                tokens_str(tok, sizeof tok, r.warmup_tokens));
        else
            say(t, "warm-up: %d iterations, the recipe's steps", t->warmup);
    } else {
        t->warmup = j->warmup_steps;
        t->defaults = 1;
        say(t, "WARNING: warm-up %d iterations is parallax's default: plan with --warmup-steps N", t->warmup);
    }
    train_decay(&r, use_recipe, bt, t);
    if (t->recipe)
        say(t, "schedule from: %s%s%s", r.source, r.note[0] ? "; " : "", r.note);
    return PX_OK;
}

void export_train_comments(FILE *f, const ExportTrain *t)
{
    for (const char *s = t->notes; *s;) {
        const char *e = strchr(s, '\n');
        const int n = e ? (int)(e - s) : (int)strlen(s);
        fprintf(f, "# %.*s\n", n, s);
        s += n + (e != NULL);
    }
}

void export_train_warn(const ExportTrain *t)
{
    for (const char *s = t->notes; *s;) {
        const char *e = strchr(s, '\n');
        const int n = e ? (int)(e - s) : (int)strlen(s);
        if (strncmp(s, "WARNING: ", 9) == 0)
            px_warn("%.*s", n - 9, s + 9);
        else
            px_warn("%.*s", n, s);
        s += n + (e != NULL);
    }
}
