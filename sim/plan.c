/* The planner: enumerate every layout of a model on N GPUs, reject what breaks a rule or does
 * not fit, rank the rest by an objective.
 *
 * Every candidate that passes the rules gets its memory (compact tables); every one that fits
 * gets a cheap floor on its step: its busiest stage's layers times one layer's compute, costed
 * once per (tp, cp, sp, micro-batch, recompute). Candidates are then taken in order of their
 * floors; each gets its exact bound (every op costed: the busiest stage's passes plus its
 * optimizer, which no schedule beats) and, if that can still enter the top k, the exact
 * pipeline, until the k-th best exact score is below the next floor. What is skipped cannot
 * enter the top k, so pruning never changes the answer (a test compares it with the brute
 * force that times every candidate exactly). */
#include "sim/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    short tp, pp, cp, vpp, zero, sp, mbs, rc, sched;
    short spill; /* pp not dividing the layers: the balanced split's leftover layer on the
                    first (0) or last (1) stage (model_split_balanced) */
    int dp;
} Knobs;

typedef struct {
    Knobs k;
    double bound;  /* lower bound of the objective */
    uint64_t peak; /* bytes */
} Pending;

const char *sim_objective_name(SimObjective o)
{
    static const char *const names[] = {"time", "cost", "tokens-per-gpu"};
    return (unsigned)o < 3 ? names[o] : "?";
}

int sim_objective_from_name(const char *s)
{
    for (int i = 0; i < 3; i++)
        if (s && strcmp(s, sim_objective_name((SimObjective)i)) == 0)
            return i;
    return -1;
}

const char *sim_reject_name(int reason)
{
    switch (reason) {
    case SIM_REJECT_CROSS_NODE_TP: return "tp spans nodes (--allow-cross-node-tp to allow)";
    case SIM_REJECT_MEMORY: return "does not fit in device memory";
    default: return model_rule_name((ModelRule)reason);
    }
}

/* Lower is better for every objective. With the GPUs and batch fixed they order layouts
 * alike; they differ across cluster sizes (sweeps, --min-gpus). */
static double score(SimObjective o, double step_s, const ModelDims *d, int gbs)
{
    double tokens = (double)gbs * d->s;
    switch (o) {
    case SIM_OBJ_COST: return step_s * d->gpus / tokens;          /* GPU-seconds per token */
    case SIM_OBJ_TOKENS_PER_GPU: return -(tokens / step_s / d->gpus); /* negated: maximise */
    default: return step_s;
    }
}

/* Compute seconds of one layer per (tp, cp, sp, micro-batch, recompute): sim_layer_seconds
 * builds a stage's graph, so each key is costed once. Open addressing on a packed key. */
typedef struct {
    uint64_t *key; /* 0: empty */
    double (*seconds)[2]; /* forward, backward */
    size_t cap, n;
} LayerCosts;

static int layer_cost(LayerCosts *m, const ModelSpec *s, const ProfCluster *cl, int gpus,
                      ModelTableCache *tables, double seconds[2], PxError *err)
{
    const ModelLayout *l = &s->layout;
    const uint64_t key = 1 + ((uint64_t)l->tp | (uint64_t)l->cp << 12 | (uint64_t)l->sp << 24 |
                              (uint64_t)l->recompute << 25 | (uint64_t)s->job.micro_batch << 28);
    if (m->n * 2 >= m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        uint64_t *k = calloc(cap, sizeof *k);
        double(*v)[2] = calloc(cap, sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return px_fail(err, PX_ERUNTIME, "out of memory planning");
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->key[i]) {
                size_t h = (size_t)(m->key[i] * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
                while (k[h])
                    h = (h + 1) & (cap - 1);
                k[h] = m->key[i];
                v[h][0] = m->seconds[i][0];
                v[h][1] = m->seconds[i][1];
            }
        free(m->key);
        free(m->seconds);
        m->key = k;
        m->seconds = v;
        m->cap = cap;
    }
    size_t h = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & (m->cap - 1);
    while (m->key[h] && m->key[h] != key)
        h = (h + 1) & (m->cap - 1);
    if (m->key[h] == key) {
        seconds[0] = m->seconds[h][0];
        seconds[1] = m->seconds[h][1];
        return PX_OK;
    }
    SimResult r;
    int rc = sim_run_cached(s, cl, gpus, tables, SIM_MEMORY, &r, err);
    if (!rc)
        rc = sim_layer_seconds(&r, &seconds[0], &seconds[1], err);
    sim_result_free(&r);
    if (rc)
        return rc;
    m->key[h] = key;
    m->seconds[h][0] = seconds[0];
    m->seconds[h][1] = seconds[1];
    m->n++;
    return PX_OK;
}

/* The memory rejection's example: the layout and how far it is from fitting. */
static void memory_example(SimPlanResult *res, const ModelSpec *s, const Knobs *k, int dp,
                           uint64_t peak, int peak_stage, double usable)
{
    char split[80] = "";
    if (s->layout.n_stage_layers > 0) {
        memcpy(split, " (", 3);
        model_split_format(s->layout.stage_layers, s->layout.n_stage_layers, split + 2, sizeof split - 3);
        strcat(split, ")");
    }
    const double over = (double)peak - usable;
    snprintf(res->example[SIM_REJECT_MEMORY], sizeof res->example[SIM_REJECT_MEMORY],
             "tp %d pp %d%s dp %d cp %d vpp %d zero %d sp %d mbs %d recompute %s %s: "
             "peak %.2f GiB on stage %d, %.1f %s over the %.2f GiB usable",
             k->tp, k->pp, split, dp, k->cp, k->vpp, k->zero, k->sp, k->mbs,
             model_recompute_name((ModelRecompute)k->rc), model_schedule_name((ModelSchedule)k->sched),
             (double)peak / PX_GIB, peak_stage,
             /* the closest can miss by less than the rounding */
             over < PX_GIB ? over / (1024.0 * 1024.0) : over / PX_GIB, over < PX_GIB ? "MiB" : "GiB",
             usable / PX_GIB);
}

static void apply(const SimPlanRequest *q, const Knobs *k, ModelSpec *s)
{
    *s = q->base;
    s->layout.tp = k->tp;
    s->layout.pp = k->pp;
    s->layout.cp = k->cp;
    s->layout.dp = k->dp;
    s->layout.vpp = k->vpp;
    s->layout.zero = k->zero;
    s->layout.sp = k->sp;
    s->layout.recompute = (ModelRecompute)k->rc;
    s->layout.schedule = (ModelSchedule)k->sched;
    s->job.micro_batch = k->mbs;
    /* a pinned split stays as given; else even where pp divides the layers, balanced where not */
    if (!(q->pinned & SIM_PIN_PP_LAYERS)) {
        s->layout.n_stage_layers = 0;
        if (k->pp > 1 && k->pp <= MODEL_MAX_STAGES && s->model.layers % k->pp != 0) {
            s->layout.n_stage_layers = k->pp;
            model_split_balanced(s->model.layers, k->pp, k->spill, s->layout.stage_layers);
        }
    }
}

/* Balanced splits worth trying for pp stages: one, unless the leftover layers outnumber the
 * middle stages, when the last one goes to either end (the output layer's cost against the
 * first stage's activations in flight: the simulator tells which is faster). */
static int spills(const SimPlanRequest *q, int pp)
{
    const int layers = q->base.model.layers;
    if ((q->pinned & SIM_PIN_PP_LAYERS) || pp < 2 || layers % pp == 0)
        return 1;
    return layers % pp > pp - 2 ? 2 : 1;
}

/* A total order: objective, then less memory, then the simpler layout (fewer ways of
 * parallelism, no recompute, larger micro-batch), so results are deterministic. */
static int cmp_knobs(const Knobs *a, const Knobs *b)
{
    const short ka[10] = {a->tp, a->pp, a->cp, a->vpp, a->zero, a->sp, a->rc, a->sched, (short)-a->mbs, a->spill};
    const short kb[10] = {b->tp, b->pp, b->cp, b->vpp, b->zero, b->sp, b->rc, b->sched, (short)-b->mbs, b->spill};
    for (int i = 0; i < 10; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

static int better(const SimCandidate *a, const Knobs *ka, const SimCandidate *b, const Knobs *kb)
{
    if (a->score != b->score)
        return a->score < b->score;
    if (a->peak_bytes != b->peak_bytes)
        return a->peak_bytes < b->peak_bytes;
    return cmp_knobs(ka, kb) < 0;
}

static int by_bound(const void *x, const void *y)
{
    const Pending *a = x, *b = y;
    if (a->bound != b->bound)
        return a->bound < b->bound ? -1 : 1;
    if (a->peak != b->peak)
        return a->peak < b->peak ? -1 : 1;
    return cmp_knobs(&a->k, &b->k);
}

static void candidate_from(SimCandidate *c, const SimResult *r, SimObjective o)
{
    memset(c, 0, sizeof *c);
    c->spec = r->spec;
    c->step_s = r->step_s;
    c->score = score(o, r->step_s, &r->dims, r->spec.job.global_batch);
    c->tokens_per_s = r->tokens_per_s;
    c->mfu = r->mfu;
    c->tflops_per_gpu = r->tflops_per_gpu;
    c->bubble_fraction = r->bubble_fraction;
    c->compute_s = r->compute_s;
    c->tp_comm_s = r->tp_comm_s;
    c->pp_comm_s = r->pp_comm_s;
    c->dp_comm_exposed_s = r->dp_comm_exposed_s;
    c->optimizer_s = r->optimizer_s;
    c->peak_bytes = r->peak_bytes;
}

/* Keeps the best `cap` candidates sorted, best first. */
static void keep(SimPlanResult *res, Knobs *kept, int cap, const SimCandidate *c, const Knobs *k)
{
    int n = res->n_top, at = n;
    while (at > 0 && better(c, k, &res->top[at - 1], &kept[at - 1]))
        at--;
    if (at >= cap)
        return;
    int last = n < cap ? n : cap - 1;
    memmove(&res->top[at + 1], &res->top[at], (size_t)(last - at) * sizeof *res->top);
    memmove(&kept[at + 1], &kept[at], (size_t)(last - at) * sizeof *kept);
    res->top[at] = *c;
    kept[at] = *k;
    if (n < cap)
        res->n_top++;
}

static void reject(SimPlanResult *res, int reason, const char *msg)
{
    if (res->rejected[reason]++ == 0)
        px_strlcpy(res->example[reason], msg, sizeof res->example[reason]);
}

/* Values a knob may take: the pinned one, or those worth trying. */
static int values(int pinned, int pin_value, const int *choices, int n, int *out)
{
    if (pinned) {
        out[0] = pin_value;
        return 1;
    }
    memcpy(out, choices, (size_t)n * sizeof *out);
    return n;
}

static int divisors(int n, int limit, int *out, int cap)
{
    int k = 0;
    for (int i = 1; i <= n && i <= limit && k < cap; i++)
        if (n % i == 0)
            out[k++] = i;
    return k;
}

int sim_plan(const SimPlanRequest *request, const ProfCluster *cl, SimPlanResult *res, PxError *err)
{
    memset(res, 0, sizeof *res);
    const double t0 = px_now_s();
    /* the precision resolved once, as the simulation resolves it, before any rule is checked */
    SimPlanRequest resolved = *request;
    if (resolved.base.job.precision == PX_DTYPE_COUNT)
        resolved.base.job.precision = sim_default_precision(&cl->device);
    const SimPlanRequest *q = &resolved;
    const int gpus = q->gpus, cap = q->top > 0 ? q->top : 1;
    const ModelConfig *mc = &q->base.model;
    const unsigned pin = q->pinned;
    int rc = PX_OK;
    LayerCosts costs = {0};
    ModelTableCache *tables = NULL;
    if (gpus < 1)
        return px_fail(err, PX_EINPUT, "--gpus must be at least 1");
    if (cl->nodes > 0 && (double)gpus > (double)cl->nodes * cl->node_devices)
        return px_fail(err, PX_EINPUT, "%d GPUs exceed cluster %s: %d nodes of %d", gpus, cl->name,
                       cl->nodes, cl->node_devices);
    int node = prof_node_size(cl, gpus);
    if (node > gpus)
        node = gpus;
    const uint64_t rank_memory = prof_rank_memory(cl, node);
    const double usable = (double)rank_memory * (1.0 - q->headroom);
    tables = model_table_cache_new();
    res->top = calloc((size_t)cap, sizeof *res->top);
    Knobs *kept = calloc((size_t)cap, sizeof *kept);
    size_t pend_cap = 4096, n_pend = 0;
    Pending *pend = malloc(pend_cap * sizeof *pend);
    if (!res->top || !kept || !pend || !tables) {
        rc = px_fail(err, PX_ERUNTIME, "out of memory planning");
        goto out;
    }
    const ModelLayout *pl = &q->base.layout;
    const ModelJob *pj = &q->base.job;
    const int seq = pj->seq_len > 0 ? pj->seq_len : mc->seq_len;
    int tps[64], pps[256], cps[16], dps[1], zeros[4] = {0, 1, 2, 3}, sps[2] = {0, 1};
    int rcs[3] = {0, 1, 2}, n_tp, n_pp_all, n_cp;
    int all_tp[64], all_pp[256];
    n_tp = values(pin & SIM_PIN_TP, pl->tp, all_tp, divisors(gpus, mc->heads, all_tp, 64), tps);
    n_pp_all = divisors(gpus, mc->layers, all_pp, 256);
    int cp_choices[6] = {1, 2, 4, 8, 16, 32}, n_cp_choices = 0;
    for (int i = 0; i < 6; i++)
        if (cp_choices[i] <= seq && gpus % cp_choices[i] == 0)
            cp_choices[n_cp_choices++] = cp_choices[i];
    n_cp = values(pin & SIM_PIN_CP, pl->cp, cp_choices, n_cp_choices, cps);
    (void)dps;
    long total = 0, done = 0;
    uint64_t closest = 0;
    /* With a progress bar the loops run twice: first only counting the layouts, so that the bar
     * shows a fraction of a known total. */
    int counting = q->progress != NULL;
count_again:
    /* Pass 1: rules, memory, op costs and bounds for every candidate. */
    for (int a = 0; a < n_tp; a++) {
        const int tp = tps[a];
        int n_pp = values(pin & SIM_PIN_PP, pl->pp, all_pp, n_pp_all, pps);
        for (int b = 0; b < n_pp; b++) {
            const int pp = pps[b];
            for (int c = 0; c < n_cp; c++) {
                const int cp = cps[c];
                /* not a factorisation of the GPUs (with a pinned dp: not the one that uses them
                 * all): nothing to count */
                if (gpus % (tp * pp * cp) != 0 ||
                    ((pin & SIM_PIN_DP) && (long)tp * pp * cp * pl->dp != gpus))
                    continue;
                const int dp = (pin & SIM_PIN_DP) ? pl->dp : gpus / (tp * pp * cp);
                int vpps[64], n_vpp;
                if (pin & SIM_PIN_VPP) {
                    vpps[0] = pl->vpp;
                    n_vpp = 1;
                } else {
                    /* an uneven split (pp not dividing the layers, or pinned) does not interleave */
                    n_vpp = pp > 1 && mc->layers % pp == 0 && !(pin & SIM_PIN_PP_LAYERS)
                                ? divisors(mc->layers / pp, 64, vpps, 64)
                                : 1;
                    if (n_vpp == 1)
                        vpps[0] = 1;
                    /* a pinned schedule pins interleaving: 1F1B over several chunks is the
                     * interleaved schedule, so 1f1b and gpipe take one chunk per stage */
                    if ((pin & SIM_PIN_SCHEDULE) && pl->schedule != MODEL_SCHED_INTERLEAVED)
                        n_vpp = 1;
                    else if ((pin & SIM_PIN_SCHEDULE) && n_vpp > 1)
                        memmove(vpps, vpps + 1, (size_t)--n_vpp * sizeof *vpps);
                }
                int mbss[256], n_mbs;
                if (pin & SIM_PIN_MBS) {
                    mbss[0] = pj->micro_batch;
                    n_mbs = 1;
                } else if (pj->global_batch > 0 && pj->global_batch % dp == 0) {
                    n_mbs = divisors(pj->global_batch / dp, 1 << 20, mbss, 256);
                } else {
                    mbss[0] = 1;
                    n_mbs = 1;
                }
                /* ZeRO shards over dp x cp: with a group of one every stage is ZeRO-0 */
                int zs[4], n_z = values(pin & SIM_PIN_ZERO, pl->zero, zeros, dp * cp > 1 ? 4 : 1, zs);
                int ss[2], n_s = values(pin & SIM_PIN_SP, pl->sp, sps, tp > 1 ? 2 : 1, ss);
                int rs[3], n_r = values(pin & SIM_PIN_RECOMPUTE, (int)pl->recompute, rcs, 3, rs);
                for (int e = 0; e < n_vpp; e++) {
                    const int vpp = vpps[e];
                    int scheds[2], n_sched;
                    if (pin & SIM_PIN_SCHEDULE) {
                        scheds[0] = (int)pl->schedule;
                        n_sched = 1;
                    } else if (vpp > 1) {
                        scheds[0] = MODEL_SCHED_INTERLEAVED;
                        n_sched = 1;
                    } else if (pp > 1) {
                        scheds[0] = MODEL_SCHED_1F1B;
                        scheds[1] = MODEL_SCHED_GPIPE;
                        n_sched = 2;
                    } else {
                        scheds[0] = MODEL_SCHED_1F1B;
                        n_sched = 1;
                    }
                    const int n_spill = spills(q, pp);
                    if (counting) {
                        int n_r_tried = n_r;
                        for (int i = 0; i < n_r; i++) /* the selective twins skipped below */
                            n_r_tried -= rs[i] == MODEL_RECOMPUTE_SELECTIVE && pj->flash_attn &&
                                         !(pin & SIM_PIN_RECOMPUTE);
                        total += (long)n_mbs * n_z * n_s * n_r_tried * n_sched * n_spill;
                        continue;
                    }
                    for (int sp_end = 0; sp_end < n_spill; sp_end++)
                    for (int f = 0; f < n_mbs; f++)
                        for (int g = 0; g < n_z; g++)
                            for (int h = 0; h < n_s; h++)
                                for (int i = 0; i < n_r; i++)
                                    for (int j = 0; j < n_sched; j++) {
                                        /* with flash attention selective recompute changes
                                         * nothing (FlashAttention recomputes the scores in its
                                         * backward): one of the two twins is enough */
                                        if (rs[i] == MODEL_RECOMPUTE_SELECTIVE && pj->flash_attn &&
                                            !(pin & SIM_PIN_RECOMPUTE))
                                            continue;
                                        Knobs k = {(short)tp, (short)pp, (short)cp, (short)vpp, (short)zs[g],
                                                   (short)ss[h], (short)mbss[f], (short)rs[i],
                                                   (short)scheds[j], (short)sp_end, dp};
                                        ModelSpec s;
                                        apply(q, &k, &s);
                                        res->considered++;
                                        if (q->progress && (++done & 255) == 0)
                                            q->progress(q->progress_ctx, done, total, 0);
                                        /* the rule's message only for its first example */
                                        PxError e2 = {.code_only = 1};
                                        ModelDims d;
                                        ModelSpec probe = s;
                                        if (model_spec_check(&probe, gpus, &d, &e2)) {
                                            int why = e2.code > 0 ? e2.code : MODEL_RULE_NONE;
                                            if (res->rejected[why] == 0) {
                                                e2.code_only = 0;
                                                probe = s;
                                                model_spec_check(&probe, gpus, &d, &e2);
                                            }
                                            reject(res, why, e2.msg);
                                            continue;
                                        }
                                        if ((tp > node || node % tp != 0) && !q->allow_cross_node_tp) {
                                            char msg[256];
                                            snprintf(msg, sizeof msg, "tp %d spans nodes of %d devices", tp, node);
                                            reject(res, SIM_REJECT_CROSS_NODE_TP, msg);
                                            continue;
                                        }
                                        uint64_t peak;
                                        int peak_stage;
                                        if ((rc = sim_memory_peak(&probe, &d, cl, tables, &peak, &peak_stage, err)))
                                            goto out;
                                        res->evaluated++;
                                        if ((double)peak > usable) {
                                            /* the example is the layout closest to fitting */
                                            if (res->rejected[SIM_REJECT_MEMORY]++ == 0 || peak < closest) {
                                                closest = peak;
                                                memory_example(res, &s, &k, dp, peak, peak_stage, usable);
                                            }
                                            continue;
                                        }
                                        res->feasible++;
                                        res->rank_memory_bytes = rank_memory;
                                        if (q->brute_force) {
                                            SimResult r;
                                            if ((rc = sim_run_cached(&s, cl, gpus, tables, SIM_FULL, &r, err)))
                                                goto out;
                                            SimCandidate cand;
                                            candidate_from(&cand, &r, q->objective);
                                            keep(res, kept, cap, &cand, &k);
                                            res->timed++;
                                            if (q->timed)
                                                q->timed(q->timed_ctx, &cand);
                                            sim_result_free(&r);
                                            continue;
                                        }
                                        /* the cheap bound: one layer's compute, the same for
                                         * every layout with these tp, cp, sp, micro-batch and
                                         * recompute, over the stages and the pipeline's fill */
                                        double layer_s[2];
                                        if ((rc = layer_cost(&costs, &s, cl, gpus, tables, layer_s, err)))
                                            goto out;
                                        const double floor_s = sim_step_floor(&probe, &d, layer_s[0], layer_s[1]);
                                        if (n_pend == pend_cap) {
                                            Pending *np = realloc(pend, 2 * pend_cap * sizeof *pend);
                                            if (!np) {
                                                rc = px_fail(err, PX_ERUNTIME, "out of memory planning");
                                                goto out;
                                            }
                                            pend = np;
                                            pend_cap *= 2;
                                        }
                                        pend[n_pend].k = k;
                                        pend[n_pend].bound = score(q->objective, floor_s, &d, probe.job.global_batch);
                                        pend[n_pend].peak = peak;
                                        n_pend++;
                                    }
                }
            }
        }
    }
    if (counting) {
        counting = 0;
        goto count_again;
    }
    /* Pass 2: exact pipelines in order of their bounds, until nothing left can enter the top k. */
    qsort(pend, n_pend, sizeof *pend, by_bound);
    for (size_t i = 0; i < n_pend; i++) {
        if (res->n_top == cap && pend[i].bound > res->top[cap - 1].score)
            break;
        ModelSpec s;
        apply(q, &pend[i].k, &s);
        SimResult r;
        if ((rc = sim_run_cached(&s, cl, gpus, tables, SIM_BOUND, &r, err)))
            goto out;
        /* the exact bound (every op, no pipeline) before the pipeline itself */
        if (res->n_top == cap &&
            score(q->objective, r.bound_s, &r.dims, s.job.global_batch) > res->top[cap - 1].score) {
            sim_result_free(&r);
            continue;
        }
        if ((rc = sim_continue(&r, SIM_FULL, err))) {
            sim_result_free(&r);
            goto out;
        }
        SimCandidate cand;
        candidate_from(&cand, &r, q->objective);
        keep(res, kept, cap, &cand, &pend[i].k);
        res->timed++;
        if (q->timed)
            q->timed(q->timed_ctx, &cand);
        sim_result_free(&r);
        if (q->progress && (i & 63) == 0)
            q->progress(q->progress_ctx, (long)i, (long)n_pend, 1);
    }
    if (q->progress)
        q->progress(q->progress_ctx, 1, 1, 2);
out:
    free(costs.key);
    free(costs.seconds);
    model_table_cache_free(tables);
    free(kept);
    free(pend);
    res->seconds = px_now_s() - t0;
    if (rc) {
        sim_plan_free(res);
        return rc;
    }
    if (res->n_top == 0) {
        sim_plan_free(res);
        /* say why: memory when some layout got that far, else the commonest rule broken */
        int worst = -1;
        for (int i = 0; i < SIM_REJECT_COUNT; i++)
            if (res->rejected[i] && (worst < 0 || res->rejected[i] > res->rejected[worst]))
                worst = i;
        if (res->rejected[SIM_REJECT_MEMORY])
            worst = SIM_REJECT_MEMORY;
        if (res->considered == 0) {
            char pins[96] = "";
            size_t n = 0;
            const struct {
                unsigned bit;
                const char *name;
                int value;
            } deg[] = {{SIM_PIN_TP, "tp", q->base.layout.tp}, {SIM_PIN_PP, "pp", q->base.layout.pp},
                       {SIM_PIN_CP, "cp", q->base.layout.cp}, {SIM_PIN_DP, "dp", q->base.layout.dp}};
            for (size_t i = 0; i < sizeof deg / sizeof deg[0]; i++)
                if ((pin & deg[i].bit) && n < sizeof pins)
                    n += (size_t)snprintf(pins + n, sizeof pins - n, " %s %d", deg[i].name, deg[i].value);
            return px_fail(err, PX_EINPUT,
                           "no layout of %s uses %d GPUs: the pinned degrees do not divide them "
                           "(pinned:%s; tp x pp x cp x dp must equal the GPUs)",
                           mc->name, gpus, n ? pins : " none");
        }
        return px_fail(err, PX_EINPUT, "no layout of %s works on %d GPUs of %s: %ld tried; %s (e.g. %s)",
                       mc->name, gpus, cl->name, res->considered,
                       worst >= 0 ? sim_reject_name(worst) : "rejected", worst >= 0 ? res->example[worst] : "");
    }
    return PX_OK;
}

void sim_plan_free(SimPlanResult *r)
{
    if (!r)
        return;
    free(r->top);
    r->top = NULL;
    r->n_top = 0;
}

/* GPU counts worth trying, in order: the node times 1, 2, 3, 4, 6, 8, 12, 16, ... (powers of two
 * and three times them), up to `limit`. */
static int next_size(int node, int prev)
{
    long k = prev / node;
    long next = k < 1 ? 1 : k < 2 ? 2 : k < 3 ? 3 : 0;
    if (!next) {
        long p2 = 1;
        while (p2 * 2 <= k)
            p2 *= 2;
        next = k < p2 * 3 / 2 ? p2 * 3 / 2 : p2 * 2; /* 4 -> 6 -> 8 -> 12 -> 16 ... */
        if (next <= k)
            next = p2 * 2;
    }
    return (int)(next * node);
}

int sim_plan_min_gpus(const SimPlanRequest *q, const ProfCluster *cl, double max_step_s,
                      double max_days, int limit, SimPlanResult *out, int *gpus_out,
                      PxError *err)
{
    const int node = cl->node_devices > 0 ? cl->node_devices : 1;
    if (cl->nodes > 0 && (long)cl->nodes * node < limit)
        limit = cl->nodes * node;
    char tried[256] = "", closest[160] = "";
    size_t n = 0;
    double closest_over = 0; /* how far the closest size missed the budget, as a ratio */
    for (int g = node; g <= limit; g = next_size(node, g)) {
        if (g < q->gpus) /* the smallest size to try */
            continue;
        SimPlanRequest r = *q;
        r.gpus = g;
        r.top = 1;
        SimPlanResult res;
        PxError e2 = {0};
        int rc = sim_plan(&r, cl, &res, &e2);
        if (rc == PX_ERUNTIME) {
            *err = e2;
            return rc;
        }
        if (rc == PX_OK) {
            const SimCandidate *c = &res.top[0];
            double days = max_days > 0 ? q->base.job.train_tokens / c->tokens_per_s / 86400.0 : 0;
            if ((max_step_s <= 0 || c->step_s <= max_step_s) && (max_days <= 0 || days <= max_days)) {
                *out = res;
                *gpus_out = g;
                return PX_OK;
            }
            double over = fmax(max_step_s > 0 ? c->step_s / max_step_s : 0, max_days > 0 ? days / max_days : 0);
            if (!closest[0] || over < closest_over) {
                closest_over = over;
                snprintf(closest, sizeof closest, "; the closest, %d GPUs, takes %.3g s a step%s", g, c->step_s, "");
                if (max_days > 0)
                    snprintf(closest + strlen(closest), sizeof closest - strlen(closest), " and %.3g days", days);
            }
            sim_plan_free(&res);
        }
        if (n < sizeof tried - 16)
            n += (size_t)snprintf(tried + n, sizeof tried - n, "%s%d", n ? "," : "", g);
    }
    return px_fail(err, PX_EINPUT, "no cluster size up to %d GPUs meets the budget (tried %s%s)",
                   limit, tried[0] ? tried : "none", closest);
}
