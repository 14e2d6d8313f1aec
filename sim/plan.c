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

#include <stdlib.h>
#include <string.h>

typedef struct {
    short tp, pp, cp, vpp, zero, sp, mbs, rc, sched;
    short spill; /* how the layers split over the stages: SPLIT_* */
    int dp;
    short ep, etp; /* expert degrees (1 and tp for a dense model) */
    short off;     /* offload the planner turned on to make the layout fit: OFF_* */
    short cpc;     /* context-parallel comm type (ModelCpComm); p2p without cp */
} Knobs;

/* The pipeline splits the planner tries (docs/planner.md, "Uneven pipeline splits"): even or,
 * where pp does not divide the layers, balanced with the leftover layer on the first stage
 * (model_split_balanced); balanced with it on the last; Megatron-Core's embedding and loss
 * (or one of them) counted as layers; the even split with the last stage a layer lighter,
 * its layer on the last middle stage (a large output layer makes the last stage the slowest);
 * where pp does not divide the layers, every stage but the last (or the first) full at
 * ceil(layers / pp) and that one the rest: DeepSeek-V3's 61 over 16 as 4*15,1, which leaves
 * the stage with the output layer and the prediction module one layer. Kinds that come to the
 * same split as an earlier one are not tried (spills). */
enum { SPLIT_EVEN = 0, SPLIT_SPILL_LAST, SPLIT_ACCOUNT_BOTH, SPLIT_ACCOUNT_LOSS, SPLIT_ACCOUNT_EMBED,
       SPLIT_LIGHT_LAST, SPLIT_REST_LAST, SPLIT_REST_FIRST, SPLIT_KINDS };

/* What the planner may offload when a layout does not fit on the device (docs/planner.md) */
enum { OFF_OPTIMIZER = 1, OFF_ACTIVATIONS = 2 };

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
    case SIM_REJECT_HOST_MEMORY: return "fits the device only with offload, which does not fit in host memory";
    case SIM_REJECT_EXECUTOR: return "the executor does not run it (planning for this machine)";
    case SIM_REJECT_FRAMEWORK: return "the framework does not run it (--framework)";
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
    uint64_t *key2; /* the expert degrees (a MoE layer's compute depends on them) and the cp
                       comm type (Transformer Engine's passes around the core differ by it:
                       model/ops.c cp_passes) */
    double (*seconds)[2]; /* forward, backward */
    size_t cap, n;
} LayerCosts;

static int layer_cost(LayerCosts *m, const ModelSpec *s, const ProfCluster *cl, int gpus,
                      ModelTableCache *tables, double seconds[2], PxError *err)
{
    const ModelLayout *l = &s->layout;
    const uint64_t key = 1 + ((uint64_t)l->tp | (uint64_t)l->cp << 12 | (uint64_t)l->sp << 24 |
                              (uint64_t)l->recompute << 25 | (uint64_t)s->job.micro_batch << 28);
    const uint64_t key2 = (uint64_t)l->ep | (uint64_t)l->etp << 32 |
                          (uint64_t)(l->cp > 1 ? l->cp_comm : 0) << 62;
    if (m->n * 2 >= m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        uint64_t *k = calloc(cap, sizeof *k), *k2 = calloc(cap, sizeof *k2);
        double(*v)[2] = calloc(cap, sizeof *v);
        if (!k || !k2 || !v) {
            free(k);
            free(k2);
            free(v);
            return px_fail(err, PX_ERUNTIME, "out of memory planning");
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->key[i]) {
                size_t h = (size_t)((m->key[i] ^ m->key2[i] * 31) * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
                while (k[h])
                    h = (h + 1) & (cap - 1);
                k[h] = m->key[i];
                k2[h] = m->key2[i];
                v[h][0] = m->seconds[i][0];
                v[h][1] = m->seconds[i][1];
            }
        free(m->key);
        free(m->key2);
        free(m->seconds);
        m->key = k;
        m->key2 = k2;
        m->seconds = v;
        m->cap = cap;
    }
    size_t h = (size_t)((key ^ key2 * 31) * 0x9E3779B97F4A7C15ull >> 20) & (m->cap - 1);
    while (m->key[h] && (m->key[h] != key || m->key2[h] != key2))
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
    m->key2[h] = key2;
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
    char experts[40] = "";
    if (s->model.moe.experts > 0)
        snprintf(experts, sizeof experts, " ep %d etp %d", k->ep, k->etp);
    const double over = (double)peak - usable;
    snprintf(res->example[SIM_REJECT_MEMORY], sizeof res->example[SIM_REJECT_MEMORY],
             "tp %d pp %d%s dp %d cp %d%s vpp %d zero %d sp %d mbs %d recompute %s %s: "
             "peak %.2f GiB on stage %d, %.1f %s over the %.2f GiB usable",
             k->tp, k->pp, split, dp, k->cp, experts, k->vpp, k->zero, k->sp, k->mbs,
             model_recompute_name((ModelRecompute)k->rc), model_schedule_name((ModelSchedule)k->sched),
             (double)peak / PX_GIB, peak_stage,
             /* the closest can miss by less than the rounding */
             over < PX_GIB ? over / (1024.0 * 1024.0) : over / PX_GIB, over < PX_GIB ? "MiB" : "GiB",
             usable / PX_GIB);
}

/* The layers of each of the pp x vpp virtual stages that split kind `kind` gives `layers`
 * (the Megatron-Core forms as model_split_resolve resolves them): their count, or 0 when the
 * kind does not apply (a remainder it cannot place, a stage left with none). */
static int split_counts(int layers, int kind, int pp, int vpp, int *out)
{
    const int n = pp * vpp, L = layers;
    if (n > MODEL_MAX_STAGES || n < 1)
        return 0;
    switch (kind) {
    case SPLIT_EVEN:
    case SPLIT_SPILL_LAST:
        if (L % n == 0) {
            for (int i = 0; i < n; i++)
                out[i] = L / n;
            return kind == SPLIT_EVEN ? n : 0;
        }
        if (vpp != 1 || pp > L)
            return 0;
        model_split_balanced(L, pp, kind == SPLIT_SPILL_LAST, out);
        return n;
    case SPLIT_ACCOUNT_BOTH:
    case SPLIT_ACCOUNT_LOSS:
    case SPLIT_ACCOUNT_EMBED: {
        const int e = kind != SPLIT_ACCOUNT_LOSS, l = kind != SPLIT_ACCOUNT_EMBED;
        if ((L + e + l) % n != 0)
            return 0;
        for (int i = 0; i < n; i++)
            out[i] = (L + e + l) / n;
        out[0] -= e;
        out[n - 1] -= l;
        return n;
    }
    case SPLIT_LIGHT_LAST:
        if (vpp != 1 || pp < 2 || L % pp != 0 || L / pp < 2)
            return 0;
        for (int i = 0; i < pp; i++)
            out[i] = L / pp;
        out[pp - 1]--;
        out[pp > 2 ? pp - 2 : 0]++;
        return n;
    case SPLIT_REST_LAST:
    case SPLIT_REST_FIRST: {
        const int full = (L + pp - 1) / pp, rest = L - (pp - 1) * full;
        if (vpp != 1 || pp < 2 || L % pp == 0 || rest < 1)
            return 0;
        for (int i = 0; i < pp; i++)
            out[i] = full;
        out[kind == SPLIT_REST_LAST ? pp - 1 : 0] = rest;
        return n;
    }
    default: return 0;
    }
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
    s->layout.ep = k->ep;
    s->layout.etp = k->etp;
    s->layout.cp_comm = (ModelCpComm)k->cpc;
    if (k->off & OFF_OPTIMIZER)
        s->layout.offload_optimizer = 1;
    if (k->off & OFF_ACTIVATIONS)
        s->layout.offload_activations = 1;
    /* a pinned split stays as given; else the kind the knob names */
    if (!(q->pinned & SIM_PIN_PP_LAYERS)) {
        ModelLayout *l = &s->layout;
        const int L = s->model.layers;
        l->n_stage_layers = 0;
        l->embed_in_split = k->spill == SPLIT_ACCOUNT_BOTH || k->spill == SPLIT_ACCOUNT_EMBED;
        l->loss_in_split = k->spill == SPLIT_ACCOUNT_BOTH || k->spill == SPLIT_ACCOUNT_LOSS;
        l->first_stage_layers = l->last_stage_layers = 0;
        l->pp_layout[0] = '\0';
        l->mtp_from_last = 0;
        const int explicit_kind = k->spill == SPLIT_LIGHT_LAST || k->spill == SPLIT_REST_LAST ||
                                  k->spill == SPLIT_REST_FIRST ||
                                  (k->spill <= SPLIT_SPILL_LAST && L % k->pp != 0);
        if (explicit_kind && k->pp > 1 && k->pp <= MODEL_MAX_STAGES)
            l->n_stage_layers = split_counts(L, k->spill, k->pp, 1, l->stage_layers);
    }
}

/* The output layer is a layer's worth of work or more: its GEMM, 2·V·h per token, against a
 * layer's 24·h² (the attention's s-terms aside), i.e. V >= 12 h. */
static int big_output(const ModelConfig *c)
{
    return (double)c->vocab >= 12.0 * c->hidden;
}

/* Splits worth trying for pp stages of vpp chunks, each a different split of the layers
 * (two kinds that come to the same counts would list one layout twice: the first kind keeps
 * it). Balanced: one, unless the leftover layers outnumber the middle stages, when the last
 * one goes to either end (the output layer's cost against the first stage's activations in
 * flight: the simulator tells which is faster). The even split with the last stage lighter
 * where the output layer is large; the Megatron-Core forms; the remainder on one end. */
static int spills(const SimPlanRequest *q, int pp, int vpp, int out[SPLIT_KINDS])
{
    const int L = q->base.model.layers, n = pp * vpp;
    if ((q->pinned & SIM_PIN_PP_LAYERS) || pp < 2) {
        out[0] = SPLIT_EVEN;
        return 1;
    }
    int wanted[SPLIT_KINDS], n_wanted = 0;
    if (L % n == 0 || (vpp == 1 && pp <= L)) {
        wanted[n_wanted++] = SPLIT_EVEN;
        if (L % n != 0 && L % pp > pp - 2)
            wanted[n_wanted++] = SPLIT_SPILL_LAST;
    }
    if (L % n == 0 && big_output(&q->base.model))
        wanted[n_wanted++] = SPLIT_LIGHT_LAST;
    wanted[n_wanted++] = SPLIT_ACCOUNT_BOTH;
    wanted[n_wanted++] = SPLIT_ACCOUNT_LOSS;
    wanted[n_wanted++] = SPLIT_ACCOUNT_EMBED;
    wanted[n_wanted++] = SPLIT_REST_LAST;
    wanted[n_wanted++] = SPLIT_REST_FIRST;
    int k = 0;
    int counts[SPLIT_KINDS][MODEL_MAX_STAGES]; /* 8 KiB at 256 stages */
    int n_counts[SPLIT_KINDS];
    for (int w = 0; w < n_wanted; w++) {
        const int got = split_counts(L, wanted[w], pp, vpp, counts[k]);
        if (got == 0)
            continue;
        int seen = 0;
        for (int i = 0; i < k && !seen; i++)
            seen = n_counts[i] == got && !memcmp(counts[i], counts[k], sizeof(int) * (size_t)got);
        if (seen)
            continue;
        n_counts[k] = got;
        out[k++] = wanted[w];
    }
    return k;
}

/* A total order: objective, then less memory, then the simpler layout (fewer ways of
 * parallelism, no recompute, larger micro-batch), so results are deterministic. */
static int cmp_knobs(const Knobs *a, const Knobs *b)
{
    const short ka[14] = {a->tp, a->pp, a->cp, a->cpc, a->ep, a->etp, a->vpp, a->zero, a->sp, a->rc, a->sched, (short)-a->mbs, a->spill, a->off};
    const short kb[14] = {b->tp, b->pp, b->cp, b->cpc, b->ep, b->etp, b->vpp, b->zero, b->sp, b->rc, b->sched, (short)-b->mbs, b->spill, b->off};
    for (int i = 0; i < 14; i++)
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
    c->host_peak_bytes = r->host_peak_bytes;
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

/* One search: the request (its precision resolved), the cluster, and what the passes share. */
typedef struct {
    const SimPlanRequest *q;
    const ProfCluster *cl;
    SimPlanResult *res;
    PxError *err;
    int gpus, cap, node;
    uint64_t rank_memory;
    double usable; /* bytes a rank may fill: its memory less the headroom */
    double host_usable; /* host bytes a rank may fill for offload, less the headroom (0: none) */
    int offload;        /* the second search, when nothing fit: offload tried where needed */
    LayerCosts costs;
    ModelTableCache *tables;
    Knobs *kept;   /* the knobs of res->top, in its order */
    Pending *pend; /* feasible layouts waiting for their exact timing */
    size_t n_pend, pend_cap;
    int counting;     /* this walk only counts the layouts (for the progress bar) */
    long total, done; /* layouts in all, and walked so far */
    long grids;       /* (tp, pp, cp) that factor the GPUs: none means the degrees are at fault */
    uint64_t closest; /* peak bytes of the layout closest to fitting */
    uint64_t closest_host; /* host bytes of the offloaded layout closest to fitting the host */
    /* the degrees worth trying */
    int tps[64], n_tp, pps[256], n_pp, cps[16], n_cp;
} Search;

/* The values of the other knobs for one (tp, pp, cp). */
typedef struct {
    int tp, pp, cp, dp;
    int vpps[64], n_vpp;
    int mbss[256], n_mbs;
    int zs[4], n_z, ss[2], n_s, rs[3], n_r;
    int cpcs[3], n_cpc; /* context-parallel comm types (p2p alone without cp) */
    /* expert degrees: (ep, etp) pairs that divide the experts, their width and the stage's
     * tp x cp x dp ranks (one pair, (1, tp), for a dense model) */
    short eps[256], etps[256];
    int n_e;
} Grid;

/* The request against the cluster: PX_EINPUT before anything is allocated. */
static int check_size(const SimPlanRequest *q, const ProfCluster *cl, PxError *err)
{
    if (q->gpus < 1)
        return px_fail(err, PX_EINPUT, "--gpus must be at least 1");
    return sim_cluster_holds(cl, q->gpus, err);
}

/* tp divides the heads, pp the layers, cp the sequence (each of them the GPUs), unless pinned. */
static void degree_choices(Search *s)
{
    const SimPlanRequest *q = s->q;
    const ModelConfig *mc = &q->base.model;
    const ModelLayout *pl = &q->base.layout;
    const unsigned pin = q->pinned;
    const int gpus = s->gpus;
    const int seq = q->base.job.seq_len > 0 ? q->base.job.seq_len : mc->seq_len;
    int all_tp[64], all_pp[256];
    const int n_tp_all = divisors(gpus, mc->heads, all_tp, 64);
    s->n_tp = values(pin & SIM_PIN_TP, pl->tp, all_tp, n_tp_all, s->tps);
    const int n_pp_all = divisors(gpus, mc->layers, all_pp, 256);
    s->n_pp = values(pin & SIM_PIN_PP, pl->pp, all_pp, n_pp_all, s->pps);
    int cp_choices[6] = {1, 2, 4, 8, 16, 32}, n_cp_choices = 0;
    for (int i = 0; i < 6; i++)
        if (cp_choices[i] <= seq && gpus % cp_choices[i] == 0)
            cp_choices[n_cp_choices++] = cp_choices[i];
    s->n_cp = values(pin & SIM_PIN_CP, pl->cp, cp_choices, n_cp_choices, s->cps);
}

/* Sizes the search on the cluster and allocates what it keeps. */
static int search_open(Search *s, const SimPlanRequest *q, const ProfCluster *cl,
                       SimPlanResult *res, PxError *err)
{
    memset(s, 0, sizeof *s);
    s->q = q;
    s->cl = cl;
    s->res = res;
    s->err = err;
    s->gpus = q->gpus;
    s->cap = q->top > 0 ? q->top : 1;
    s->node = prof_node_size(cl, s->gpus);
    if (s->node > s->gpus)
        s->node = s->gpus;
    s->rank_memory = prof_rank_memory(cl, s->node);
    s->usable = (double)s->rank_memory * (1.0 - q->headroom);
    s->host_usable = (double)prof_host_rank_memory(cl, s->node) * (1.0 - q->headroom);
    s->tables = model_table_cache_new();
    res->top = calloc((size_t)s->cap, sizeof *res->top);
    s->kept = calloc((size_t)s->cap, sizeof *s->kept);
    s->pend_cap = 4096;
    s->pend = malloc(s->pend_cap * sizeof *s->pend);
    if (!res->top || !s->kept || !s->pend || !s->tables)
        return px_fail(err, PX_ERUNTIME, "out of memory planning");
    degree_choices(s);
    return PX_OK;
}

static void search_close(Search *s)
{
    free(s->costs.key);
    free(s->costs.key2);
    free(s->costs.seconds);
    model_table_cache_free(s->tables);
    free(s->kept);
    free(s->pend);
}

/* The (ep, etp) pairs of a grid. A pinned degree is tried as given (the rules then name it if it
 * breaks one: a rejection by MODEL_RULE_EXPERTS explains itself); a listed one over its values;
 * otherwise ep over the divisors of the experts and etp over 1 and tp (Megatron-Core's default
 * and the usual choice for fine-grained experts), both as far as ep x etp divides the stage's
 * ranks. A dense model has the one pair (1, tp). */
static void expert_pairs(const Search *s, Grid *g)
{
    const SimPlanRequest *q = s->q;
    const ModelMoe *moe = &q->base.model.moe;
    const ModelLayout *pl = &q->base.layout;
    const unsigned pin = q->pinned;
    g->n_e = 0;
    if (moe->experts <= 0) {
        g->eps[0] = 1;
        g->etps[0] = (short)g->tp;
        g->n_e = 1;
        return;
    }
    int eps[256], n_ep, etps[16], n_etp;
    if (pin & SIM_PIN_EP) {
        eps[0] = pl->ep > 0 ? pl->ep : 1;
        n_ep = 1;
    } else if (q->n_ep_values > 0) {
        n_ep = q->n_ep_values;
        memcpy(eps, q->ep_values, (size_t)n_ep * sizeof *eps);
    } else {
        n_ep = divisors(moe->experts, 1 << 15, eps, 256);
    }
    if (pin & SIM_PIN_ETP) {
        etps[0] = pl->etp > 0 ? pl->etp : g->tp;
        n_etp = 1;
    } else if (q->n_etp_values > 0) {
        n_etp = q->n_etp_values;
        memcpy(etps, q->etp_values, (size_t)n_etp * sizeof *etps);
    } else {
        etps[0] = 1;
        etps[1] = g->tp;
        n_etp = g->tp > 1 ? 2 : 1;
    }
    const long ranks = (long)g->tp * g->cp * g->dp;
    const int given = (pin & (SIM_PIN_EP | SIM_PIN_ETP)) || q->n_ep_values || q->n_etp_values;
    for (int i = 0; i < n_ep; i++)
        for (int j = 0; j < n_etp && g->n_e < 256; j++) {
            /* degrees the user named reach the rules, which say why they fail; the search's
             * own only where they can work */
            if (!given && ranks % ((long)eps[i] * etps[j]) != 0)
                continue;
            g->eps[g->n_e] = (short)eps[i];
            g->etps[g->n_e] = (short)etps[j];
            g->n_e++;
        }
}

/* The other knobs' values for (tp, pp, cp); 0 when tp x pp x cp is not a factorisation of the
 * GPUs (with a pinned dp: not the one that uses them all), leaving nothing to try. */
static int grid_for(const Search *s, int tp, int pp, int cp, Grid *g)
{
    const SimPlanRequest *q = s->q;
    const ModelConfig *mc = &q->base.model;
    const ModelLayout *pl = &q->base.layout;
    const ModelJob *pj = &q->base.job;
    const unsigned pin = q->pinned;
    static const int zeros[4] = {0, 1, 2, 3}, sps[2] = {0, 1}, rcs[3] = {0, 1, 2};
    if (s->gpus % (tp * pp * cp) != 0 ||
        ((pin & SIM_PIN_DP) && (long)tp * pp * cp * pl->dp != s->gpus))
        return 0;
    g->tp = tp, g->pp = pp, g->cp = cp;
    g->dp = (pin & SIM_PIN_DP) ? pl->dp : s->gpus / (tp * pp * cp);
    if (pin & SIM_PIN_VPP) {
        g->vpps[0] = pl->vpp;
        g->n_vpp = 1;
    } else {
        /* interleaving divides the stage's layers into chunks: of an even split, or of one
         * counting the embedding and/or the loss as layers (a pinned split keeps its own) */
        g->n_vpp = 0;
        if (pp > 1 && !(pin & SIM_PIN_PP_LAYERS))
            for (int extra = 0; extra <= 2; extra++) {
                if ((mc->layers + extra) % pp)
                    continue;
                int dv[64];
                const int nd = divisors((mc->layers + extra) / pp, 64, dv, 64);
                for (int i = 0; i < nd; i++) {
                    int seen = 0;
                    for (int k = 0; k < g->n_vpp; k++)
                        seen |= g->vpps[k] == dv[i];
                    if (!seen && g->n_vpp < 64)
                        g->vpps[g->n_vpp++] = dv[i];
                }
            }
        if (pp > 1 && (pin & SIM_PIN_PP_LAYERS) && pl->vpp > 1) {
            g->vpps[0] = pl->vpp;
            g->n_vpp = 1;
        }
        if (g->n_vpp == 0) {
            g->vpps[0] = 1;
            g->n_vpp = 1;
        }
        for (int i = 1; i < g->n_vpp; i++) /* ascending, as before */
            for (int k = i; k > 0 && g->vpps[k] < g->vpps[k - 1]; k--) {
                int t = g->vpps[k];
                g->vpps[k] = g->vpps[k - 1];
                g->vpps[k - 1] = t;
            }
        /* a pinned schedule pins interleaving: 1F1B over several chunks is the interleaved
         * schedule, so 1f1b and gpipe take one chunk per stage */
        if ((pin & SIM_PIN_SCHEDULE) && pl->schedule != MODEL_SCHED_INTERLEAVED)
            g->n_vpp = 1;
        else if ((pin & SIM_PIN_SCHEDULE) && g->n_vpp > 1)
            memmove(g->vpps, g->vpps + 1, (size_t)--g->n_vpp * sizeof *g->vpps);
    }
    if (pin & SIM_PIN_MBS) {
        g->mbss[0] = pj->micro_batch;
        g->n_mbs = 1;
    } else if (pj->global_batch > 0 && pj->global_batch % g->dp == 0) {
        g->n_mbs = divisors(pj->global_batch / g->dp, 1 << 20, g->mbss, 256);
    } else {
        g->mbss[0] = 1;
        g->n_mbs = 1;
    }
    /* ZeRO shards over dp x cp: with a group of one every stage is ZeRO-0. Under a pipeline
     * ZeRO-2/3 move ZeRO-1's bytes in its time and hold more memory (docs/time.md, "Sharded
     * data parallelism with a pipeline"): tried only when pinned */
    g->n_z = values(pin & SIM_PIN_ZERO, pl->zero, zeros, g->dp * cp > 1 ? (g->pp > 1 ? 2 : 4) : 1, g->zs);
    g->n_s = values(pin & SIM_PIN_SP, pl->sp, sps, tp > 1 ? 2 : 1, g->ss);
    g->n_r = values(pin & SIM_PIN_RECOMPUTE, (int)pl->recompute, rcs, 3, g->rs);
    /* every comm type where there is context parallelism: the ring hides behind long
     * sequences' attention, Ulysses' all-to-alls move less across many ranks */
    static const int cpcs[3] = {MODEL_CP_COMM_P2P, MODEL_CP_COMM_ALLGATHER, MODEL_CP_COMM_A2A};
    g->n_cpc = cp > 1 ? values(pin & SIM_PIN_CP_COMM, (int)pl->cp_comm, cpcs, 3, g->cpcs) : 1;
    if (cp == 1)
        g->cpcs[0] = MODEL_CP_COMM_P2P;
    expert_pairs(s, g);
    return 1;
}

/* Schedules worth trying for pp stages of vpp chunks: the pinned one; interleaved with
 * several chunks; 1F1B and GPipe with a pipeline; 1F1B alone without one. */
static int schedules_for(const SimPlanRequest *q, int pp, int vpp, int scheds[2])
{
    if (q->pinned & SIM_PIN_SCHEDULE) {
        scheds[0] = (int)q->base.layout.schedule;
        return 1;
    }
    if (vpp > 1) {
        scheds[0] = MODEL_SCHED_INTERLEAVED;
        return 1;
    }
    scheds[0] = MODEL_SCHED_1F1B;
    if (pp > 1) {
        scheds[1] = MODEL_SCHED_GPIPE;
        return 2;
    }
    return 1;
}

/* With flash attention selective recompute changes nothing (FlashAttention recomputes the
 * scores in its backward): unless recompute is pinned, one of the two twins is enough. */
static int twin_skipped(const SimPlanRequest *q, int recompute)
{
    return recompute == MODEL_RECOMPUTE_SELECTIVE && q->base.job.flash_attn &&
           !(q->pinned & SIM_PIN_RECOMPUTE);
}

/* A plan for this machine's cluster ("local", or its calibration "local-<host>") is run here:
 * a layout the executor would refuse (model_exec_refusal, the statement the executor itself
 * refuses by) is not ranked but counted as refused with its reason, 1. */
static int runs_here(Search *s, const ModelSpec *probe, const ModelDims *d)
{
    if (strncmp(s->cl->name, "local", 5) != 0)
        return 0;
    char why[320];
    if (!model_exec_refusal(probe, d, !prof_device_is_cpu(&s->cl->device), why, sizeof why))
        return 0;
    reject(s->res, SIM_REJECT_EXECUTOR, why);
    return 1;
}

/* The layout breaks one of model's rules, or spreads tp over nodes: counted under its reason
 * (the first of each with its message), 1. *probe gets the normalised spec and *d its dims. */
static int broken_rule(Search *s, const ModelSpec *spec, const Knobs *k, ModelSpec *probe,
                       ModelDims *d)
{
    SimPlanResult *res = s->res;
    /* the rule's message only for its first example */
    PxError e2 = {.code_only = 1};
    *probe = *spec;
    if (model_spec_check(probe, s->gpus, d, &e2)) {
        int why = e2.code > 0 ? e2.code : MODEL_RULE_NONE;
        if (res->rejected[why] == 0) {
            e2.code_only = 0;
            *probe = *spec;
            model_spec_check(probe, s->gpus, d, &e2);
        }
        reject(res, why, e2.msg);
        return 1;
    }
    if ((k->tp > s->node || s->node % k->tp != 0) && !s->q->allow_cross_node_tp) {
        char msg[256];
        snprintf(msg, sizeof msg, "tp %d spans nodes of %d devices", k->tp, s->node);
        reject(res, SIM_REJECT_CROSS_NODE_TP, msg);
        return 1;
    }
    /* ranked for the framework that runs the job: only what it runs */
    char why[320];
    if (model_framework_refusal(probe, d, why, sizeof why)) {
        reject(res, SIM_REJECT_FRAMEWORK, why);
        return 1;
    }
    return runs_here(s, probe, d);
}

/* Brute force: the layout simulated in full and kept if it ranks. */
static int time_exactly(Search *s, const ModelSpec *spec, const Knobs *k)
{
    SimResult r;
    int rc = sim_run_cached(spec, s->cl, s->gpus, s->tables, SIM_FULL, &r, s->err);
    if (rc)
        return rc;
    SimCandidate cand;
    candidate_from(&cand, &r, s->q->objective);
    keep(s->res, s->kept, s->cap, &cand, k);
    s->res->timed++;
    if (s->q->timed)
        s->q->timed(s->q->timed_ctx, &cand);
    sim_result_free(&r);
    return PX_OK;
}

/* The cheap bound: one layer's compute, the same for every layout with these tp, cp, sp,
 * micro-batch and recompute, over the stages and the pipeline's fill; the layout waits with
 * it for pass 2. */
static int add_pending(Search *s, const ModelSpec *spec, const Knobs *k, const ModelSpec *probe,
                       const ModelDims *d, uint64_t peak)
{
    double layer_s[2];
    int rc = layer_cost(&s->costs, spec, s->cl, s->gpus, s->tables, layer_s, s->err);
    if (rc)
        return rc;
    const double floor_s = sim_step_floor(probe, d, layer_s[0], layer_s[1]);
    if (s->n_pend == s->pend_cap) {
        Pending *np = realloc(s->pend, 2 * s->pend_cap * sizeof *s->pend);
        if (!np)
            return px_fail(s->err, PX_ERUNTIME, "out of memory planning");
        s->pend = np;
        s->pend_cap *= 2;
    }
    Pending *p = &s->pend[s->n_pend++];
    p->k = *k;
    p->bound = score(s->q->objective, floor_s, d, probe->job.global_batch);
    p->peak = peak;
    return PX_OK;
}

/* The offload that makes a layout fit (docs/planner.md, "Offload"): optimizer offload where
 * ZeRO allows it, else activation offload, else both, the first whose device peak fits and
 * whose host bytes fit too; the layout asked for stays as it is when the request set them.
 * k->off gets the choice (0: none fits), *peak and *peak_stage its device figures;
 * *host_over is 1 when some choice fit the device but not the host. */
static int try_offload(Search *s, const ModelSpec *probe, const ModelDims *d,
                       Knobs *k, uint64_t *peak, int *peak_stage, int *host_over)
{
    static const short tries[] = {OFF_OPTIMIZER, OFF_ACTIVATIONS, OFF_OPTIMIZER | OFF_ACTIVATIONS};
    *host_over = 0;
    k->off = 0;
    if (s->host_usable <= 0 ||
        s->cl->host_pcie_bandwidth <= 0 || s->cl->host_memory_bandwidth <= 0)
        return PX_OK;
    for (size_t i = 0; i < sizeof tries / sizeof *tries; i++) {
        const short off = tries[i];
        if ((off & OFF_OPTIMIZER) && (probe->layout.zero < 1 || probe->layout.offload_optimizer))
            continue;
        if ((off & OFF_ACTIVATIONS) && probe->layout.offload_activations)
            continue;
        ModelSpec with = *probe;
        with.layout.offload_optimizer |= (off & OFF_OPTIMIZER) != 0;
        with.layout.offload_activations |= (off & OFF_ACTIVATIONS) != 0;
        uint64_t p, h;
        int ps, rc = sim_memory_peaks(&with, d, s->cl, s->tables, &p, &ps, &h, s->err);
        if (rc)
            return rc;
        if ((double)p > s->usable)
            continue;
        if ((double)h > s->host_usable) {
            *host_over = 1;
            continue;
        }
        k->off = off;
        *peak = p;
        *peak_stage = ps;
        return PX_OK;
    }
    return PX_OK;
}

/* The host bytes of the smallest offload that fits the device (for the rejection's example). */
static uint64_t host_over_bytes(Search *s, const ModelSpec *probe, const ModelDims *d)
{
    uint64_t best = 0;
    static const short tries[] = {OFF_OPTIMIZER, OFF_ACTIVATIONS, OFF_OPTIMIZER | OFF_ACTIVATIONS};
    for (size_t i = 0; i < sizeof tries / sizeof *tries; i++) {
        if ((tries[i] & OFF_OPTIMIZER) && probe->layout.zero < 1)
            continue;
        ModelSpec with = *probe;
        with.layout.offload_optimizer |= (tries[i] & OFF_OPTIMIZER) != 0;
        with.layout.offload_activations |= (tries[i] & OFF_ACTIVATIONS) != 0;
        uint64_t p, h;
        int ps;
        if (sim_memory_peaks(&with, d, s->cl, s->tables, &p, &ps, &h, s->err) == PX_OK &&
            (double)p <= s->usable && (best == 0 || h < best))
            best = h;
    }
    return best;
}

/* Pass 1 for one layout: the rules, then its memory, then (when it fits) its exact timing
 * under brute force or its bound for pass 2. */
static int evaluate(Search *s, const Knobs *k)
{
    const SimPlanRequest *q = s->q;
    SimPlanResult *res = s->res;
    ModelSpec spec, probe;
    ModelDims d;
    apply(q, k, &spec);
    res->considered++;
    if (q->progress && (++s->done & 255) == 0)
        q->progress(q->progress_ctx, s->done, s->total, 0);
    if (broken_rule(s, &spec, k, &probe, &d))
        return PX_OK;
    uint64_t peak, host;
    int peak_stage, rc;
    if ((rc = sim_memory_peaks(&probe, &d, s->cl, s->tables, &peak, &peak_stage, &host, s->err)))
        return rc;
    res->evaluated++;
    Knobs ko = *k;
    if ((double)peak > s->usable || (double)host > s->host_usable) {
        int host_over = 0;
        if (s->offload && (rc = try_offload(s, &probe, &d, &ko, &peak, &peak_stage, &host_over)))
            return rc;
        if (!ko.off) {
            if (host_over || (double)peak <= s->usable) {
                /* the device would hold it; the host cannot hold what moved there */
                char msg[320];
                const uint64_t need = host_over ? host_over_bytes(s, &probe, &d) : host;
                snprintf(msg, sizeof msg, "tp %d pp %d dp %d zero %d mbs %d %s: fits the device with "
                         "offload, which needs %.2f GiB of host memory per rank of the %.2f GiB usable",
                         k->tp, k->pp, k->dp, k->zero, k->mbs, model_recompute_name((ModelRecompute)k->rc),
                         (double)need / PX_GIB, s->host_usable / PX_GIB);
                /* the example is the layout whose offload comes closest to fitting the host */
                if (res->rejected[SIM_REJECT_HOST_MEMORY]++ == 0 || need < s->closest_host) {
                    s->closest_host = need;
                    px_strlcpy(res->example[SIM_REJECT_HOST_MEMORY], msg, sizeof res->example[SIM_REJECT_HOST_MEMORY]);
                }
                return PX_OK;
            }
            /* the example is the layout closest to fitting */
            if (res->rejected[SIM_REJECT_MEMORY]++ == 0 || peak < s->closest) {
                s->closest = peak;
                memory_example(res, &spec, k, k->dp, peak, peak_stage, s->usable);
            }
            return PX_OK;
        }
        k = &ko;
        apply(q, k, &spec);
        probe.layout.offload_optimizer = spec.layout.offload_optimizer;
        probe.layout.offload_activations = spec.layout.offload_activations;
    }
    res->feasible++;
    res->rank_memory_bytes = s->rank_memory;
    if (q->brute_force)
        return time_exactly(s, &spec, k);
    return add_pending(s, &spec, k, &probe, &d, peak);
}

/* Every layout of one grid: counted, or evaluated in the order the answer's ties expect. */
static int walk_grid(Search *s, const Grid *g)
{
    for (int e = 0; e < g->n_vpp; e++) {
        const int vpp = g->vpps[e];
        int scheds[2];
        const int n_sched = schedules_for(s->q, g->pp, vpp, scheds);
        int spl[SPLIT_KINDS];
        const int n_spill = spills(s->q, g->pp, vpp, spl);
        if (s->counting) {
            int n_r_tried = g->n_r;
            for (int i = 0; i < g->n_r; i++) /* the selective twins skipped below */
                n_r_tried -= twin_skipped(s->q, g->rs[i]);
            s->total += (long)g->n_mbs * g->n_z * g->n_s * n_r_tried * n_sched * n_spill * g->n_e * g->n_cpc;
            continue;
        }
        for (int sp_end = 0; sp_end < n_spill; sp_end++)
            for (int f = 0; f < g->n_mbs; f++)
                for (int z = 0; z < g->n_z; z++)
                    for (int h = 0; h < g->n_s; h++)
                        for (int i = 0; i < g->n_r; i++)
                            for (int j = 0; j < n_sched; j++)
                                for (int x = 0; x < g->n_e; x++)
                                    for (int y = 0; y < g->n_cpc; y++) {
                                        if (twin_skipped(s->q, g->rs[i]))
                                            continue;
                                        Knobs k = {(short)g->tp, (short)g->pp, (short)g->cp, (short)vpp,
                                                   (short)g->zs[z], (short)g->ss[h], (short)g->mbss[f],
                                                   (short)g->rs[i], (short)scheds[j], (short)spl[sp_end], g->dp,
                                                   g->eps[x], g->etps[x], 0, (short)g->cpcs[y]};
                                        int rc = evaluate(s, &k);
                                        if (rc)
                                            return rc;
                                    }
    }
    return PX_OK;
}

/* Pass 1 over every (tp, pp, cp) and the grid of the other knobs. */
static int walk(Search *s)
{
    Grid g;
    for (int a = 0; a < s->n_tp; a++)
        for (int b = 0; b < s->n_pp; b++)
            for (int c = 0; c < s->n_cp; c++) {
                if (!grid_for(s, s->tps[a], s->pps[b], s->cps[c], &g))
                    continue;
                s->grids += !s->counting;
                int rc = walk_grid(s, &g);
                if (rc)
                    return rc;
            }
    return PX_OK;
}

/* Pass 2: exact pipelines in order of their bounds, until nothing left can enter the top k. */
static int time_in_bound_order(Search *s)
{
    const SimPlanRequest *q = s->q;
    SimPlanResult *res = s->res;
    const int cap = s->cap;
    qsort(s->pend, s->n_pend, sizeof *s->pend, by_bound);
    for (size_t i = 0; i < s->n_pend; i++) {
        if (res->n_top == cap && s->pend[i].bound > res->top[cap - 1].score)
            break;
        if (q->progress) /* a clock read: cheap beside a timing, and a timing can take 50 ms */
            q->progress(q->progress_ctx, (long)i, (long)s->n_pend, 1);
        ModelSpec spec;
        apply(q, &s->pend[i].k, &spec);
        SimResult r;
        int rc = sim_run_cached(&spec, s->cl, s->gpus, s->tables, SIM_BOUND, &r, s->err);
        if (rc)
            return rc;
        /* the exact bound (every op, no pipeline) before the pipeline itself */
        const double bound = score(q->objective, r.work->bound_s, &r.dims, spec.job.global_batch);
        if (res->n_top == cap && bound > res->top[cap - 1].score) {
            sim_result_free(&r);
            continue;
        }
        if ((rc = sim_continue(&r, SIM_FULL, s->err))) {
            sim_result_free(&r);
            return rc;
        }
        SimCandidate cand;
        candidate_from(&cand, &r, q->objective);
        keep(res, s->kept, cap, &cand, &s->pend[i].k);
        res->timed++;
        if (q->timed)
            q->timed(q->timed_ctx, &cand);
        sim_result_free(&r);
    }
    return PX_OK;
}

/* The degrees factor the GPUs, yet nothing was tried: no split of the layers over the pinned
 * pp x vpp virtual stages is one the planner makes (an even one, or one counting the embedding
 * and/or the loss as layers). Names the stages and the layers, the vpp that split them, and a
 * layout string that does. */
static int no_split(const SimPlanRequest *q, PxError *err)
{
    const ModelConfig *mc = &q->base.model;
    const ModelLayout *pl = &q->base.layout;
    const int L = mc->layers, pp = pl->pp, vpp = pl->vpp > 0 ? pl->vpp : 1;
    if (!(q->pinned & SIM_PIN_PP) || !(q->pinned & SIM_PIN_VPP))
        return px_fail(err, PX_EINPUT, "no layout of %s uses %d GPUs: no pipeline split of its %d layers "
                       "fits the pinned degrees", mc->name, q->gpus, L);
    char ok[160] = "1 (an uneven split, balanced)";
    size_t n = strlen(ok);
    for (int v = 2; v <= 64 && n < sizeof ok; v++)
        for (int e = 0; e <= 2; e++)
            if ((L + e) % (pp * v) == 0 && (e == 0 || pp * v <= MODEL_MAX_STAGES)) {
                n += (size_t)snprintf(ok + n, sizeof ok - n, ", %d", v);
                break;
            }
    char example[512], with[600] = "";
    if (model_split_layout_example(mc, pp, vpp, example, sizeof example))
        snprintf(with, sizeof with, "; or give each virtual stage its layers, e.g. "
                 "--pipeline-model-parallel-layout '%s'", example);
    return px_fail(err, PX_EINPUT,
                   "no layout of %s on %d GPUs: pp %d x vpp %d = %d virtual stages cannot split its %d "
                   "layers evenly (nor %d or %d with the embedding and/or the loss counted as layers); "
                   "a vpp that can with pp %d: %s%s",
                   mc->name, q->gpus, pp, vpp, pp * vpp, L, L + 1, L + 2, pp, ok, with);
}

/* Why no layout ranked: the pinned degrees when nothing was even enumerated; else memory when
 * some layout got that far, else the commonest rule broken, with its example. */
static int no_layout(const SimPlanRequest *q, const ProfCluster *cl, const SimPlanResult *res,
                     long grids, PxError *err)
{
    const ModelConfig *mc = &q->base.model;
    int worst = -1;
    for (int i = 0; i < SIM_REJECT_COUNT; i++)
        if (res->rejected[i] && (worst < 0 || res->rejected[i] > res->rejected[worst]))
            worst = i;
    if (res->rejected[SIM_REJECT_MEMORY])
        worst = SIM_REJECT_MEMORY;
    if (res->considered == 0 && grids > 0)
        return no_split(q, err);
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
            if ((q->pinned & deg[i].bit) && n < sizeof pins)
                n += (size_t)snprintf(pins + n, sizeof pins - n, " %s %d", deg[i].name,
                                      deg[i].value);
        return px_fail(err, PX_EINPUT,
                       "no layout of %s uses %d GPUs: the pinned degrees do not divide them "
                       "(pinned:%s; tp x pp x cp x dp must equal the GPUs)",
                       mc->name, q->gpus, n ? pins : " none");
    }
    /* offload would have made some fit the device: say what the host lacked as well */
    char host[400] = "";
    const long host_n = res->rejected[SIM_REJECT_HOST_MEMORY];
    if (host_n && worst != SIM_REJECT_HOST_MEMORY)
        snprintf(host, sizeof host, "; %ld fit the device only with offload, which does not fit in "
                 "host memory (e.g. %s)", host_n, res->example[SIM_REJECT_HOST_MEMORY]);
    return px_fail(err, PX_EINPUT,
                   "no layout of %s works on %d GPUs of %s: %ld tried; %s (e.g. %s)%s", mc->name,
                   q->gpus, cl->name, res->considered,
                   worst >= 0 ? sim_reject_name(worst) : "rejected",
                   worst >= 0 ? res->example[worst] : "", host);
}

int sim_plan(const SimPlanRequest *request, const ProfCluster *cl, SimPlanResult *res, PxError *err)
{
    memset(res, 0, sizeof *res);
    const double t0 = px_now_s();
    /* the precision resolved once, as the simulation resolves it, before any rule is checked */
    SimPlanRequest resolved = *request;
    int rc = sim_resolve_job(&resolved.base.job, &cl->device, err);
    if (!rc)
        rc = check_size(&resolved, cl, err);
    if (rc)
        return rc;
    Search s;
    rc = search_open(&s, &resolved, cl, res, err);
    /* with a progress bar the layouts are walked twice: first only counted, so that the bar
     * shows a fraction of a known total */
    if (!rc && resolved.progress) {
        s.counting = 1;
        rc = walk(&s);
        s.counting = 0;
    }
    if (!rc)
        rc = walk(&s);
    if (!rc)
        rc = time_in_bound_order(&s);
    if (!rc && res->n_top == 0 && s.host_usable > 0) {
        /* Nothing fits the device: search again, offloading what a layout needs to fit
         * (docs/planner.md, "Offload"). Layouts that fit without it never reach here, so
         * their plans stay what they were. */
        res->considered = res->evaluated = res->feasible = res->timed = 0;
        memset(res->rejected, 0, sizeof res->rejected);
        memset(res->example, 0, sizeof res->example);
        s.closest = s.closest_host = 0;
        s.n_pend = 0;
        s.done = 0;
        s.offload = 1;
        rc = walk(&s);
        if (!rc)
            rc = time_in_bound_order(&s);
    }
    if (!rc && resolved.progress)
        resolved.progress(resolved.progress_ctx, 1, 1, 2);
    const long grids = s.grids;
    search_close(&s);
    res->seconds = px_now_s() - t0;
    if (rc) {
        sim_plan_free(res);
        return rc;
    }
    if (res->n_top == 0) {
        sim_plan_free(res);
        return no_layout(&resolved, cl, res, grids, err);
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
