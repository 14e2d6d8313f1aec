/* The split of the layers over the pipeline's (virtual) stages: its checks, the planner's
 * balanced split, its text forms, and Megatron-Core's forms resolved into layout.stage_layers
 * (the embedding and the loss counted as layers, the first and last stages' layer counts, the
 * layout string). docs/pipeline.md describes each form and the checks. model/spec.c calls in
 * here; nothing here calls back. */
#include "model/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One virtual stage of a layout string, counted. */
typedef struct {
    int t, m, e, l;
    int pos_m; /* 1-based character of its first 'm' (0: none) */
} LayoutStage;

typedef struct {
    const char *text; /* the string as given, for messages */
    const char *what; /* the option or key that gave it */
    LayoutStage st[MODEL_MAX_STAGES];
    int n;            /* stages so far, the current one included */
    int pos_e, pos_l; /* 1-based characters of E and L (0: none) */
    int n_e, n_l;
    int pos_t_after_m;  /* a decoder layer after a prediction module */
    int pos_first_m;
    int seen; /* layer characters and boundaries so far */
    PxError *err;
} LayoutParse;

static int layout_fail(LayoutParse *p, int pos, const char *why)
{
    return px_fail(p->err, PX_EINPUT, "%s '%s': character %d ('%c'): %s", p->what, p->text, pos,
                   p->text[pos - 1], why);
}

/* One layer character or a stage boundary at 1-based position pos. */
static int layout_put(LayoutParse *p, char ch, int pos)
{
    LayoutStage *s = &p->st[p->n - 1];
    if (p->n_l && strchr("|EtmL", ch))
        return layout_fail(p, pos, "nothing may follow the loss L: it ends the last stage");
    if (ch == 'E' && p->seen)
        return layout_fail(p, pos, "the embedding E comes first, in the first stage");
    p->seen += strchr("|EtmL", ch) != NULL;
    switch (ch) {
    case '|':
        if (p->n == MODEL_MAX_STAGES)
            return layout_fail(p, pos, "more stages than parallax takes (256)");
        memset(&p->st[p->n], 0, sizeof p->st[p->n]);
        p->n++;
        return PX_OK;
    case 'E':
        s->e++;
        if (!p->n_e++)
            p->pos_e = pos;
        return PX_OK;
    case 'L':
        s->l++;
        if (!p->n_l++)
            p->pos_l = pos;
        return PX_OK;
    case 't':
        s->t++;
        if (p->pos_first_m && !p->pos_t_after_m)
            p->pos_t_after_m = pos;
        return PX_OK;
    case 'm':
        s->m++;
        if (!s->pos_m)
            s->pos_m = pos;
        if (!p->pos_first_m)
            p->pos_first_m = pos;
        return PX_OK;
    default:
        return layout_fail(p, pos, "expected E (embedding), t (layer), m (prediction module), L (loss), "
                                   "| (stage boundary), ',' or a repeat such as t*4 or (tt|)*3");
    }
}

/* "*N" at text[i] (0-based): the count, *end after it; 0 when there is none (a bad count
 * fails). */
static int layout_count(LayoutParse *p, size_t i, size_t *end, int *count)
{
    const char *t = p->text;
    *count = 0;
    if (t[i] != '*') {
        *end = i;
        return PX_OK;
    }
    size_t k = i + 1;
    long v = 0;
    while (t[k] >= '0' && t[k] <= '9' && v <= 100000)
        v = v * 10 + (t[k++] - '0');
    if (k == i + 1 || v < 1 || v > 100000)
        return layout_fail(p, (int)i + 1, "a repeat needs a count from 1 to 100000, as in t*4");
    *count = (int)v;
    *end = k;
    return PX_OK;
}

static int layout_parse(LayoutParse *p)
{
    const char *t = p->text;
    size_t i = 0;
    memset(&p->st[0], 0, sizeof p->st[0]);
    p->n = 1;
    while (t[i]) {
        size_t end;
        int n, rc;
        if (t[i] == ',') { /* cosmetic, as in Megatron-Core */
            i++;
            continue;
        }
        if (t[i] == ')')
            return layout_fail(p, (int)i + 1, "a ')' without its '('");
        if (t[i] == '*')
            return layout_fail(p, (int)i + 1, "a repeat needs something before it, as in t*4");
        if (t[i] == '(') {
            const char *close = strchr(t + i + 1, ')');
            const char *open = strchr(t + i + 1, '(');
            if (!close)
                return layout_fail(p, (int)i + 1, "a '(' without its ')'");
            if (open && open < close)
                return layout_fail(p, (int)(open - t) + 1, "groups do not nest");
            const size_t c = (size_t)(close - t);
            if (c == i + 1)
                return layout_fail(p, (int)i + 1, "an empty group");
            if ((rc = layout_count(p, c + 1, &end, &n)))
                return rc;
            if (n == 0)
                return layout_fail(p, (int)c + 1, "a group needs a repeat count after it, as in (tt|)*3");
            for (int r = 0; r < n; r++)
                for (size_t k = i + 1; k < c; k++) {
                    if (t[k] == ',')
                        continue;
                    /* a repeat inside a group: t*2 within (t*2|)*3 */
                    size_t e2;
                    int n2;
                    if (t[k] == '*')
                        return layout_fail(p, (int)k + 1, "a repeat needs something before it, as in t*4");
                    if ((rc = layout_count(p, k + 1, &e2, &n2)))
                        return rc;
                    for (int q = 0; q < (n2 ? n2 : 1); q++)
                        if ((rc = layout_put(p, t[k], (int)k + 1)))
                            return rc;
                    k = e2 - 1;
                }
            i = end;
            continue;
        }
        if ((rc = layout_count(p, i + 1, &end, &n)))
            return rc;
        for (int r = 0; r < (n ? n : 1); r++)
            if ((rc = layout_put(p, t[i], (int)i + 1)))
                return rc;
        i = end;
    }
    return PX_OK;
}

int model_layout_string_parse(const char *text, const char *what, const ModelConfig *c,
                              ModelLayout *l, PxError *err)
{
    LayoutParse p; /* about 5 KB: 256 stages */
    memset(&p, 0, sizeof p);
    p.text = text;
    p.what = what;
    p.err = err;
    if (!text[0])
        return px_fail(err, PX_EINPUT, "%s: an empty layout string", what);
    int rc = layout_parse(&p);
    if (rc)
        return rc;
    const int chunks = l->pp * l->vpp;
    if (p.n % l->pp != 0 || (l->vpp > 1 && p.n != chunks))
        return px_fail(err, PX_EINPUT,
                       "%s '%s' has %d stages: it needs pp %d x vpp %d = %d (or a multiple of pp %d "
                       "when vpp is not given)",
                       what, text, p.n, l->pp, l->vpp, chunks, l->pp);
    if (p.n_e != 1)
        return p.n_e ? layout_fail(&p, p.pos_e, "the embedding E appears more than once")
                     : px_fail(err, PX_EINPUT, "%s '%s': no embedding E: the first stage begins with it",
                               what, text);
    if (p.n_l != 1)
        return p.n_l ? layout_fail(&p, p.pos_l, "the loss L appears more than once")
                     : px_fail(err, PX_EINPUT, "%s '%s': no loss L: the last stage ends with it", what,
                               text);
    if (!p.st[p.n - 1].l)
        return layout_fail(&p, p.pos_l, "the loss L must be in the last stage");
    if (p.pos_t_after_m)
        return layout_fail(&p, p.pos_t_after_m, "a layer after a prediction module: the m come after every t");
    /* the prediction modules: together in one stage (parallax builds them as one run), which
     * Megatron-Core's MultiTokenPredictionBlock asserts is the last virtual stage of its
     * pipeline rank; any stage with vpp 1, the loss's own or one before it */
    int n_t = 0, n_m = 0, mtp = -1;
    const int vpp = p.n / l->pp;
    for (int i = 0; i < p.n; i++) {
        n_t += p.st[i].t;
        n_m += p.st[i].m;
        if (!p.st[i].m)
            continue;
        if (mtp >= 0) {
            char why[160];
            snprintf(why, sizeof why,
                     "the prediction modules sit together in one stage: stage %d holds some already", mtp);
            return layout_fail(&p, p.st[i].pos_m, why);
        }
        mtp = i;
        if (i / l->pp != vpp - 1) {
            char why[200];
            snprintf(why, sizeof why,
                     "a prediction module sits on the last virtual stage of its pipeline rank "
                     "(Megatron-Core asserts it): stage %d is virtual stage %d of pp rank %d",
                     i, i / l->pp, i % l->pp);
            return layout_fail(&p, p.st[i].pos_m, why);
        }
    }
    if (n_t != c->layers)
        return px_fail(err, PX_EINPUT, "%s '%s' has %d layers t: model %s has %d", what, text, n_t,
                       c->name, c->layers);
    if (n_m != c->mtp_layers)
        return px_fail(err, PX_EINPUT, "%s '%s' has %d prediction modules m: model %s has %d", what,
                       text, n_m, c->name, c->mtp_layers);
    if (l->vpp <= 1 && p.n > l->pp)
        l->vpp = p.n / l->pp;
    for (int i = 0; i < p.n; i++)
        l->stage_layers[i] = p.st[i].t;
    l->n_stage_layers = p.n;
    l->mtp_from_last = mtp >= 0 ? p.n - 1 - mtp : 0;
    return PX_OK;
}

/* The split Megatron-Core makes with the embedding and/or the loss counted as layers. */
static int split_accounting(const ModelConfig *c, ModelLayout *l, int *out, PxError *err)
{
    const int chunks = l->pp * l->vpp, total = c->layers + l->embed_in_split + l->loss_in_split;
    if (total % chunks != 0)
        return px_fail(err, PX_EINPUT,
                       "%d layers + %d counted for the embedding and the loss = %d must divide "
                       "into pp %d x vpp %d = %d stages",
                       c->layers, l->embed_in_split + l->loss_in_split, total, l->pp, l->vpp, chunks);
    for (int i = 0; i < chunks; i++)
        out[i] = total / chunks;
    out[0] -= l->embed_in_split;
    out[chunks - 1] -= l->loss_in_split;
    return PX_OK;
}

/* Megatron-Core's first/last pipeline stage counts, the middle stages sharing the rest. */
static int split_first_last(const ModelConfig *c, ModelLayout *l, int *out, PxError *err)
{
    const int p = l->pp, v = l->vpp, f = l->first_stage_layers, z = l->last_stage_layers;
    if (p < 2)
        return px_fail(err, PX_EINPUT, "first/last pipeline stage layers need pp > 1");
    if (f % v || z % v)
        return px_fail(err, PX_EINPUT,
                       "first/last pipeline stage layers %d/%d must divide by vpp %d (each stage's chunks "
                       "hold equally many)",
                       f, z, v);
    const int mid_stages = p - (f > 0) - (z > 0), mid_layers = c->layers - f - z;
    if (mid_layers < 0 || (mid_stages == 0) != (mid_layers == 0))
        return px_fail(err, PX_EINPUT,
                       "first/last pipeline stage layers %d/%d leave %d layers for %d middle stages "
                       "of model %s (%d layers)",
                       f, z, mid_layers, mid_stages, c->name, c->layers);
    if (mid_stages && (mid_layers % mid_stages || (mid_layers / mid_stages) % v))
        return px_fail(err, PX_EINPUT,
                       "first/last pipeline stage layers %d/%d leave %d layers, which %d middle stages x "
                       "vpp %d cannot share evenly",
                       f, z, mid_layers, mid_stages, v);
    const int per_mid = mid_stages ? mid_layers / mid_stages / v : 0;
    for (int j = 0; j < v; j++)
        for (int s = 0; s < p; s++)
            out[j * p + s] = s == 0 && f ? f / v : s == p - 1 && z ? z / v : per_mid;
    return PX_OK;
}

int model_split_resolve(const ModelConfig *c, ModelLayout *l, PxError *err)
{
    const int acc = l->embed_in_split || l->loss_in_split;
    const int fl = l->first_stage_layers > 0 || l->last_stage_layers > 0;
    const int str = l->pp_layout[0] != '\0';
    if (!acc && !fl && !str) {
        l->mtp_from_last = 0;
        return PX_OK;
    }
    if (str + fl + acc > 1)
        return px_fail(err, PX_EINPUT,
                       "give one way to split the pipeline: the layout string, first/last stage "
                       "layers, or the embedding/loss counted in the split (as Megatron-Core takes one)");
    ModelLayout r = *l;
    int rc;
    r.mtp_from_last = 0; /* only a layout string moves the prediction modules */
    if (str) {
        rc = model_layout_string_parse(l->pp_layout, "pipeline layout", c, &r, err);
    } else {
        if (l->pp * l->vpp > MODEL_MAX_STAGES)
            return px_fail(err, PX_EINPUT, "pp %d x vpp %d: parallax splits at most %d stages unevenly",
                           l->pp, l->vpp, MODEL_MAX_STAGES);
        rc = acc ? split_accounting(c, &r, r.stage_layers, err)
                 : split_first_last(c, &r, r.stage_layers, err);
        r.n_stage_layers = l->pp * l->vpp;
    }
    if (rc)
        return rc;
    /* a plan read back carries both the form and its split: they must agree */
    if (l->n_stage_layers > 0 &&
        (l->n_stage_layers != r.n_stage_layers ||
         memcmp(l->stage_layers, r.stage_layers, sizeof(int) * (size_t)r.n_stage_layers))) {
        char a[128], b[128];
        model_split_format(l->stage_layers, l->n_stage_layers, a, sizeof a);
        model_split_format(r.stage_layers, r.n_stage_layers, b, sizeof b);
        return px_fail(err, PX_EINPUT, "stage_layers %s disagrees with the split its pipeline form gives, %s", a, b);
    }
    l->vpp = r.vpp;
    l->mtp_from_last = r.mtp_from_last;
    l->n_stage_layers = r.n_stage_layers;
    memcpy(l->stage_layers, r.stage_layers, sizeof(int) * (size_t)r.n_stage_layers);
    return PX_OK;
}

void model_split_describe(const ModelLayout *l, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap == 0)
        return;
    buf[0] = '\0';
    if (l->pp_layout[0])
        n = (size_t)snprintf(buf, cap, "layout %s: ", l->pp_layout);
    else if (l->embed_in_split || l->loss_in_split)
        n = (size_t)snprintf(buf, cap, "%s counted as a layer: ",
                             l->embed_in_split && l->loss_in_split ? "embedding and loss each"
                             : l->embed_in_split                   ? "embedding"
                                                                   : "loss");
    else if (l->first_stage_layers || l->last_stage_layers)
        n = (size_t)snprintf(buf, cap, "first/last stage %d/%d layers: ", l->first_stage_layers,
                             l->last_stage_layers);
    if (n >= cap)
        return;
    /* runs of three or more as N*k: 1,2*62,1 */
    for (int i = 0; i < l->n_stage_layers && n < cap;) {
        int k = i;
        while (k < l->n_stage_layers && l->stage_layers[k] == l->stage_layers[i])
            k++;
        const int run = k - i;
        for (int r = 0; r < (run >= 3 ? 1 : run) && n < cap; r++)
            n += (size_t)snprintf(buf + n, cap - n, "%s%d", i + r ? "," : "", l->stage_layers[i]);
        if (run >= 3 && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "*%d", run);
        i = k;
    }
}

void model_split_format(const int *n, int count, char *buf, size_t cap)
{
    size_t at = 0;
    if (cap == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; i < count && at < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%d", i ? "," : "", n[i]);
        if (w < 0 || (size_t)w >= cap - at) {
            /* too long for buf: end it with an ellipsis */
            if (cap >= 4)
                memcpy(buf + cap - 4, "...", 4);
            return;
        }
        at += (size_t)w;
    }
}

int model_split_check(const ModelLayout *l, int layers, PxError *err)
{
    const int n = l->n_stage_layers, chunks = l->pp * l->vpp;
    char text[64];
    long long sum = 0;
    int bad = -1;
    /* the first stage also holds the embedding, the last the output layer and a standalone MTP
     * stage the prediction modules: each may hold no layer (Megatron-Core's "E|...", "...|L"
     * and "...,m|L"); any other stage needs one */
    for (int i = 0; i < n && bad < 0; i++) {
        const int floor = i == 0 || i == n - 1 || i == n - 1 - l->mtp_from_last ? 0 : 1;
        if (l->stage_layers[i] < floor)
            bad = i;
        sum += l->stage_layers[i];
    }
    if (n == chunks && bad < 0 && sum == layers)
        return PX_OK;
    model_split_format(l->stage_layers, n, text, sizeof text); /* for the message only */
    if (n != chunks)
        return l->vpp > 1 ? px_fail(err, PX_EINPUT,
                                    "stage_layers %s has %d entries: pp %d x vpp %d = %d (one entry per "
                                    "virtual stage, in Megatron-Core's order)",
                                    text, n, l->pp, l->vpp, chunks)
                          : px_fail(err, PX_EINPUT, "stage_layers %s has %d entries: pp is %d (one entry per stage)",
                                    text, n, l->pp);
    if (bad >= 0)
        return px_fail(err, PX_EINPUT,
                       "stage_layers %s: entry %d (stage %d) is %d: %s", text, bad + 1, bad,
                       l->stage_layers[bad],
                       l->stage_layers[bad] < 0 ? "layers cannot be negative"
                                                : "a stage with neither the embedding nor the loss needs at least one layer");
    return px_fail(err, PX_EINPUT, "stage_layers %s sums to %lld layers: the model has %d", text, sum,
                   layers);
}

void model_split_balanced(int layers, int pp, int spill_last, int *out)
{
    const int base = layers / pp;
    int extra = layers % pp;
    for (int i = 0; i < pp; i++)
        out[i] = base;
    /* the middle stages, last first: no embedding or output layer, and under 1F1B stage s
     * keeps p - s activation sets in flight, so later stages pay least for a layer */
    for (int i = pp - 2; i >= 1 && extra > 0; i--, extra--)
        out[i]++;
    /* then one end: extra <= 1 here (it is below pp) */
    if (extra > 0)
        out[spill_last ? pp - 1 : 0]++;
}

int model_split_parse(const char *text, const char *what, ModelLayout *l, PxError *err)
{
    int n = 0;
    const char *p = text;
    if (!text || !*text)
        return px_fail(err, PX_EINPUT, "%s: expected layers per stage such as 1,3, got nothing", what);
    for (;;) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || (*end && *end != ','))
            return px_fail(err, PX_EINPUT, "%s: expected layers per stage such as 1,3, got '%s'",
                           what, text);
        if (n == MODEL_MAX_STAGES)
            return px_fail(err, PX_EINPUT, "%s: at most %d stages, got more in '%s'", what,
                           MODEL_MAX_STAGES, text);
        if (v < 1)
            return px_fail(err, PX_EINPUT,
                           "%s '%s': entry %d is %ld: every stage needs at least one layer", what,
                           text, n + 1, v);
        if (v > 100000)
            return px_fail(err, PX_EINPUT, "%s '%s': entry %d is %ld: more than a model's 100000 layers",
                           what, text, n + 1, v);
        l->stage_layers[n++] = (int)v;
        if (!*end)
            break;
        p = end + 1;
    }
    l->n_stage_layers = n;
    return PX_OK;
}

/* "t", "tt" or "t*k" (nothing for 0) at buf + *n. */
static void layers_run(char *buf, size_t cap, size_t *n, int k)
{
    if (*n >= cap || k <= 0)
        return;
    *n += (size_t)snprintf(buf + *n, cap - *n, k == 1 ? "t" : k == 2 ? "tt" : "t*%d", k);
}

int model_split_layout_example(const ModelConfig *c, int pp, int vpp, char *buf, size_t cap)
{
    const int n = pp * vpp, total = c->layers + 2;
    if (cap == 0 || n < 2 || n > MODEL_MAX_STAGES || total < n)
        return 0;
    /* Megatron-Core's accounting made flexible: the embedding and the loss each a layer's
     * worth, the remainder on the middle stages, so every virtual stage has work */
    int cnt[MODEL_MAX_STAGES];
    model_split_balanced(total, n, 0, cnt);
    cnt[0]--;
    cnt[n - 1]--;
    /* every stage but the last ends in a bar; runs of like middle stages as "(tt|)*30," */
    size_t at = (size_t)snprintf(buf, cap, "E");
    layers_run(buf, cap, &at, cnt[0]);
    if (at < cap)
        at += (size_t)snprintf(buf + at, cap - at, "|");
    for (int i = 1; i < n - 1 && at < cap;) {
        int k = i;
        while (k < n - 1 && cnt[k] == cnt[i])
            k++;
        if (k - i >= 2 && at < cap)
            at += (size_t)snprintf(buf + at, cap - at, "(");
        layers_run(buf, cap, &at, cnt[i]);
        if (at < cap)
            at += (size_t)snprintf(buf + at, cap - at, k - i >= 2 ? "|)*%d," : "|", k - i);
        i = k;
    }
    layers_run(buf, cap, &at, cnt[n - 1]);
    for (int m = 0; m < c->mtp_layers && at < cap; m++)
        at += (size_t)snprintf(buf + at, cap - at, "m");
    if (at < cap)
        at += (size_t)snprintf(buf + at, cap - at, "L");
    if (at >= cap)
        return 0;
    /* only a string the parser takes is offered */
    ModelLayout l;
    memset(&l, 0, sizeof l);
    l.pp = pp;
    l.vpp = vpp;
    PxError e = {0};
    return model_layout_string_parse(buf, "example", c, &l, &e) == PX_OK;
}
