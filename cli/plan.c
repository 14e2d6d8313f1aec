/* parallax plan: parse the request, hand it to the planner (sim/plan.c: one search; sim/sweep.c:
 * sweeps, clusters side by side, the fewest GPUs meeting a budget), print or write. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "sim/sim.h"

enum {
    OPT_GPUS = CLI_EXTRA, OPT_OBJECTIVE, OPT_TOP, OPT_HEADROOM, OPT_CROSS_TP, OPT_EXPLAIN,
    OPT_MIN_GPUS, OPT_MAX_STEP, OPT_MAX_DAYS, OPT_BRUTE, OPT_LIMIT, OPT_PRICE
};

static const CliOption plan_options[] = {
    {"model", 1, "M", "zoo model name or JSON file (parallax or Hugging Face config.json)", CLI_MODEL, 0},
    {"cluster", 1, "C[,C2]", "cluster profile(s): several are compared side by side", CLI_CLUSTER, 0},
    {"gpus", 1, "N[,N2...]", "GPUs: several sweep sizes, printing the best layout at each", OPT_GPUS, 0},
    {"objective", 1, "O", "time (default) | cost (GPU-hours per token) | tokens-per-gpu", OPT_OBJECTIVE, 0},
    {"gpu-hour-price", 1, "P[,P2...]", "price of a GPU-hour on each cluster: cost compares money", OPT_PRICE, 0},
    {"top", 1, "K", "layouts to show (default 5)", OPT_TOP, 0},
    {"headroom", 1, "F", "fraction of device memory to keep free (default 0.05)", OPT_HEADROOM, 0},
    {"allow-cross-node-tp", 0, NULL, "let tensor parallelism span nodes", OPT_CROSS_TP, 0},
    {"explain", 0, NULL, "show an example of each rejection reason", OPT_EXPLAIN, 0},
    {"min-gpus", 0, NULL, "find the fewest GPUs meeting --max-step-s and/or --max-days (--gpus: the least to try)", OPT_MIN_GPUS, 0},
    {"max-step-s", 1, "S", "step-time budget for --min-gpus", OPT_MAX_STEP, 0},
    {"max-days", 1, "D", "days-to-train budget for --min-gpus (needs --tokens)", OPT_MAX_DAYS, 0},
    {"max-gpus", 1, "N", "largest size --min-gpus tries (default: the cluster, or 65536)", OPT_LIMIT, 0},
    {"brute-force", 0, NULL, "time every feasible layout exactly (no pruning; slower, same answer)", OPT_BRUTE, 0},
    {"output", 1, "FILE", "write the best layout as a plan (docs/formats.md's Plan)", CLI_OUTPUT, 'o'},
    {"json", 0, NULL, "machine-readable output", CLI_JSON, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

/* The fields whose flags pin a dimension of the search. */
static const struct {
    ModelFieldId knob;
    unsigned pin;
} pins[] = {{MODEL_FIELD_TP, SIM_PIN_TP},         {MODEL_FIELD_PP, SIM_PIN_PP},
            {MODEL_FIELD_DP, SIM_PIN_DP},         {MODEL_FIELD_CP, SIM_PIN_CP},
            {MODEL_FIELD_VPP, SIM_PIN_VPP},       {MODEL_FIELD_ZERO, SIM_PIN_ZERO},
            {MODEL_FIELD_SP, SIM_PIN_SP},         /* --sp and --no-sp */
            {MODEL_FIELD_MICRO_BATCH, SIM_PIN_MBS}, {MODEL_FIELD_RECOMPUTE, SIM_PIN_RECOMPUTE},
            {MODEL_FIELD_SCHEDULE, SIM_PIN_SCHEDULE},
            {MODEL_FIELD_STAGE_LAYERS, SIM_PIN_PP | SIM_PIN_PP_LAYERS},
            /* Megatron-Core's forms of the split pin it, and the layout string the pipeline */
            {MODEL_FIELD_EMBED_IN_SPLIT, SIM_PIN_PP_LAYERS}, {MODEL_FIELD_LOSS_IN_SPLIT, SIM_PIN_PP_LAYERS},
            {MODEL_FIELD_FIRST_STAGE_LAYERS, SIM_PIN_PP_LAYERS},
            {MODEL_FIELD_LAST_STAGE_LAYERS, SIM_PIN_PP_LAYERS},
            {MODEL_FIELD_PP_LAYOUT, SIM_PIN_PP | SIM_PIN_VPP | SIM_PIN_PP_LAYERS},
            {MODEL_FIELD_CP_COMM, SIM_PIN_CP_COMM}};

static int split_list(const char *text, const char *what, char items[][256], int cap)
{
    int n = 0;
    const char *p = text;
    while (*p && n < cap) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= 256) {
            fprintf(stderr, "parallax plan: %s: empty or overlong item in '%s'\n", what, text);
            return -1;
        }
        memcpy(items[n], p, len);
        items[n][len] = '\0';
        n++;
        p = comma ? comma + 1 : p + len;
    }
    return n;
}

/* The command line, parsed into the planner's request and what the command does with it. */
typedef struct {
    CliArgs a;
    SimPlanRequest q;
    int min_gpus, explain;
    double max_step_s, max_days; /* --min-gpus's budget (0: none) */
    int limit;                   /* --max-gpus */
    char clusters[8][256];
    int n_clusters;
    int gpus[64], n_gpus;
    double price[8];
    int n_price;
} PlanArgs;

/* --ep and --etp: one value pins the degree, a list restricts the search to it, auto (or
 * nothing) searches every degree that divides the experts and the stage's ranks. A dense model
 * has no experts to split: a degree above 1 is bad input, named here rather than as every
 * candidate's rejection. */
static int expert_axes(PlanArgs *p)
{
    const CliArgs *a = &p->a;
    SimPlanRequest *q = &p->q;
    const ModelConfig *mc = &q->base.model;
    const struct {
        const char *flag;
        const int *list;
        int n;
        int *out, *n_out;
        unsigned pin;
    } ax[2] = {{"--ep", a->ep_list, a->n_ep, q->ep_values, &q->n_ep_values, SIM_PIN_EP},
               {"--etp", a->etp_list, a->n_etp, q->etp_values, &q->n_etp_values, SIM_PIN_ETP}};
    for (int i = 0; i < 2; i++) {
        if (ax[i].n == 0)
            continue;
        /* a dense model's only etp is tp (Megatron's default), its only ep 1 */
        const int dense_ok = i == 1 && cli_given(a, MODEL_FIELD_TP) ? q->base.layout.tp : 1;
        if (mc->moe.experts <= 0)
            for (int k = 0; k < ax[i].n; k++)
                if (ax[i].list[k] != dense_ok) {
                    fprintf(stderr, "parallax plan: %s %d: model %s has no experts (expert parallelism needs a "
                                    "mixture-of-experts model)\n", ax[i].flag, ax[i].list[k], mc->name);
                    return 2;
                }
        if (ax[i].n == 1) {
            q->pinned |= ax[i].pin;
            continue;
        }
        memcpy(ax[i].out, ax[i].list, (size_t)ax[i].n * sizeof *ax[i].out);
        *ax[i].n_out = ax[i].n;
    }
    return -1;
}

/* --objective, --top, --headroom and the search's flags into the request. */
static int parse_search(PlanArgs *p)
{
    const CliArgs *a = &p->a;
    SimPlanRequest *q = &p->q;
    PxError err = {0};
    const char *v;
    int rc;
    if ((v = a->extra[OPT_OBJECTIVE - CLI_EXTRA])) {
        int o = sim_objective_from_name(v);
        if (o < 0) {
            fprintf(stderr, "parallax plan: --objective: expected time, cost or tokens-per-gpu, got '%s'\n", v);
            return 2;
        }
        q->objective = (SimObjective)o;
    }
    if ((v = a->extra[OPT_TOP - CLI_EXTRA]) && (rc = px_parse_int(v, "--top", 1, 1000, &q->top, &err)))
        return cli_fail("plan", rc, &err);
    if ((v = a->extra[OPT_HEADROOM - CLI_EXTRA])) {
        if ((rc = px_parse_double(v, "--headroom", &q->headroom, &err)))
            return cli_fail("plan", rc, &err);
        if (!(q->headroom >= 0 && q->headroom < 1)) {
            fprintf(stderr, "parallax plan: --headroom: must be in [0, 1), got %s\n", v);
            return 2;
        }
    }
    q->allow_cross_node_tp = a->extra[OPT_CROSS_TP - CLI_EXTRA] != NULL;
    q->brute_force = a->extra[OPT_BRUTE - CLI_EXTRA] != NULL;
    p->explain = a->extra[OPT_EXPLAIN - CLI_EXTRA] != NULL;
    return -1;
}

/* --max-step-s, --max-days and --max-gpus: the budget --min-gpus needs. */
static int parse_budget(PlanArgs *p)
{
    const CliArgs *a = &p->a;
    PxError err = {0};
    const char *v;
    int rc;
    p->limit = 65536;
    if ((v = a->extra[OPT_MAX_STEP - CLI_EXTRA]) && (rc = px_parse_double(v, "--max-step-s", &p->max_step_s, &err)))
        return cli_fail("plan", rc, &err);
    if ((v = a->extra[OPT_MAX_DAYS - CLI_EXTRA]) && (rc = px_parse_double(v, "--max-days", &p->max_days, &err)))
        return cli_fail("plan", rc, &err);
    if ((v = a->extra[OPT_LIMIT - CLI_EXTRA]) && (rc = px_parse_int(v, "--max-gpus", 1, 1 << 24, &p->limit, &err)))
        return cli_fail("plan", rc, &err);
    if (p->min_gpus && p->max_step_s <= 0 && p->max_days <= 0) {
        fprintf(stderr, "parallax plan: --min-gpus needs --max-step-s and/or --max-days\n");
        return 2;
    }
    if (p->max_days > 0 && !(a->spec.job.train_tokens > 0)) {
        fprintf(stderr, "parallax plan: --max-days needs --tokens (the tokens to train on)\n");
        return 2;
    }
    return -1;
}

/* --gpu-hour-price: one price, or one per cluster, each positive, for --objective cost. */
static int parse_prices(PlanArgs *p, const char *text)
{
    PxError err = {0};
    char prices[8][256];
    int rc;
    if ((p->n_price = split_list(text, "--gpu-hour-price", prices, 8)) < 1)
        return 2;
    if (p->q.objective != SIM_OBJ_COST) {
        fprintf(stderr, "parallax plan: --gpu-hour-price applies to --objective cost\n");
        return 2;
    }
    if (p->n_price != 1 && p->n_price != p->n_clusters) {
        fprintf(stderr, "parallax plan: --gpu-hour-price: give one price, or one per cluster (%d), got %d\n",
                p->n_clusters, p->n_price);
        return 2;
    }
    for (int i = 0; i < p->n_price; i++) {
        if ((rc = px_parse_double(prices[i], "--gpu-hour-price", &p->price[i], &err)))
            return cli_fail("plan", rc, &err);
        if (!(p->price[i] > 0)) {
            fprintf(stderr, "parallax plan: --gpu-hour-price: must be positive, got %s\n", prices[i]);
            return 2;
        }
    }
    return -1;
}

/* --cluster, --gpus and --gpu-hour-price: the lists a sweep runs over. */
static int parse_lists(PlanArgs *p, const char *gpus_text)
{
    PxError err = {0};
    char sizes[64][256];
    int rc;
    p->n_clusters = split_list(p->a.cluster, "--cluster", p->clusters, 8);
    p->n_gpus = split_list(gpus_text, "--gpus", sizes, 64);
    if (p->n_clusters < 1 || p->n_gpus < 1)
        return 2;
    for (int i = 0; i < p->n_gpus; i++)
        if ((rc = px_parse_int(sizes[i], "--gpus", 1, 1 << 24, &p->gpus[i], &err)))
            return cli_fail("plan", rc, &err);
    const char *v = p->a.extra[OPT_PRICE - CLI_EXTRA];
    return v ? parse_prices(p, v) : -1;
}

/* The whole command line, the model loaded: -1 to go on, or the exit status. */
static int parse_plan(int argc, char **argv, PlanArgs *p)
{
    CliArgs *a = &p->a;
    memset(p, 0, sizeof *p);
    model_spec_defaults(&a->spec);
    a->allow_lists = 1;
    const CliOption *const tables[] = {plan_options, cli_knob_options(), NULL};
    int st = cli_parse("plan",
                       "--model M --cluster C --gpus N --gbs B [--seq S] [knobs to pin] [options]\n\n"
                       "Searches every layout (tp, pp, dp, cp, vpp, zero, sp, micro-batch, recompute,\n"
                       "schedule; ep and etp for mixture-of-experts models), rejects what breaks a rule\n"
                       "or does not fit, ranks the rest. Knobs given are pinned; the others are\n"
                       "searched (--ep and --etp also take a list to search, or auto).",
                       argc, argv, tables, 0, a);
    if (st >= 0)
        return st;
    PxError err = {0};
    const char *gpus_text = a->extra[OPT_GPUS - CLI_EXTRA];
    p->min_gpus = a->extra[OPT_MIN_GPUS - CLI_EXTRA] != NULL;
    if (!a->model || !a->cluster || (!gpus_text && !p->min_gpus) || !cli_given(a, MODEL_FIELD_GLOBAL_BATCH)) {
        fprintf(stderr, "parallax plan: --model, --cluster, --gpus and --gbs are required (see --help)\n");
        return 2;
    }
    if (!gpus_text)
        gpus_text = "1"; /* --min-gpus: from the smallest size up */
    SimPlanRequest *q = &p->q;
    q->base = a->spec;
    q->top = 5;
    q->headroom = 0.05;
    for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++)
        if (cli_given(a, pins[i].knob))
            q->pinned |= pins[i].pin;
    if ((st = parse_search(p)) >= 0 || (st = parse_budget(p)) >= 0)
        return st;
    int rc;
    if ((rc = model_config_load(a->model, &q->base.model, &err)))
        return cli_fail("plan", rc, &err);
    if (q->pinned & SIM_PIN_PP_LAYERS) {
        /* a Megatron-Core form needs pp (and the layout string sets vpp): checked per layout */
        ModelLayout l = q->base.layout;
        const int form = l.embed_in_split || l.loss_in_split || l.first_stage_layers || l.last_stage_layers || l.pp_layout[0];
        if (l.pp_layout[0] && !(rc = model_split_resolve(&q->base.model, &l, &err)))
            q->base.layout.vpp = l.vpp;
        else if (!form)
            rc = model_split_check(&l, q->base.model.layers, &err);
        if (rc) {
            fprintf(stderr, "parallax plan: %s: %s (%s)\n", form ? "the pipeline split" : "--pp-layers", err.msg,
                    q->base.model.name);
            return 2;
        }
    }
    if ((st = expert_axes(p)) >= 0)
        return st;
    return parse_lists(p, gpus_text);
}

/* --min-gpus: the fewest GPUs meeting the budget on each cluster. */
static int plan_min_gpus(const PlanArgs *p, const ProfCluster *cl)
{
    if (p->n_gpus > 1) {
        fprintf(stderr, "parallax plan: --min-gpus takes one --gpus, the least to try; got %d\n", p->n_gpus);
        return 2;
    }
    SimPlanRequest q = p->q;
    q.gpus = p->gpus[0];
    cJSON *arr = p->a.json ? cJSON_CreateArray() : NULL;
    for (int c = 0; c < p->n_clusters; c++) {
        SimPlanResult res;
        PxError err = {0};
        int g = 0;
        int rc = sim_plan_min_gpus(&q, &cl[c], p->max_step_s, p->max_days, p->limit, &res, &g, &err);
        if (rc) {
            cJSON_Delete(arr);
            return cli_fail("plan", rc, &err);
        }
        if (arr)
            cJSON_AddItemToArray(arr, sim_min_gpus_to_json(&cl[c], g, &res));
        else
            sim_min_gpus_print(stdout, &cl[c], g, &res);
        sim_plan_free(&res);
    }
    if (arr)
        cli_print_json(arr);
    return 0;
}

/* One size on one cluster: the ranked table (or JSON), and the best layout as a plan (-o). */
static int plan_one(const PlanArgs *p, const ProfCluster *cl)
{
    SimPlanRequest q = p->q;
    q.gpus = p->gpus[0];
    PxError err = {0};
    SimPlanResult res;
    int rc = sim_plan(&q, cl, &res, &err);
    if (rc)
        return cli_fail("plan", rc, &err);
    ModelPlan plan;
    SimResult full;
    const char *output = p->a.output;
    const int need_full = output || p->a.json;
    if (need_full && (rc = sim_plan_best(&res, cl, p->clusters[0], q.gpus, &plan, &full, &err))) {
        sim_plan_free(&res);
        return cli_fail("plan", rc, &err);
    }
    if (p->a.json)
        cli_print_json(sim_plan_answer_json(&res, cl, q.gpus, &plan, &full));
    else
        sim_plan_print(stdout, &q, cl, &res, p->explain);
    if (output) {
        cJSON *pj = model_plan_to_json(&plan);
        rc = px_json_write_file(output, pj, &err);
        cJSON_Delete(pj);
        if (!rc && !p->a.json)
            printf("\nwrote %s (layout 1 with its prediction)\n", output);
    }
    if (need_full) {
        model_plan_free(&plan);
        sim_result_free(&full);
    }
    sim_plan_free(&res);
    return rc ? cli_fail("plan", rc, &err) : 0;
}

/* Several sizes or clusters: the best layout of each, ranked by the objective. */
static int plan_sweep(const PlanArgs *p, const ProfCluster *cl)
{
    PxError err = {0};
    SimSweep sweep;
    int rc = sim_sweep(&p->q, cl, p->n_clusters, p->gpus, p->n_gpus, p->price, p->n_price,
                       &sweep, &err);
    if (rc)
        return cli_fail("plan", rc, &err);
    if (p->a.json)
        cli_print_json(sim_sweep_to_json(&sweep));
    else
        sim_sweep_print(stdout, &p->q, &sweep);
    sim_sweep_free(&sweep);
    return 0;
}

int cli_cmd_plan(int argc, char **argv)
{
    PlanArgs p;
    int status = parse_plan(argc, argv, &p);
    if (status >= 0)
        return status;
    ProfCluster cl[8];
    int n_loaded = 0;
    PxError err = {0};
    for (int i = 0; i < p.n_clusters && status < 0; i++) {
        int rc = prof_cluster_load(p.clusters[i], p.a.sets, p.a.n_sets, &cl[i], &err);
        if (rc)
            status = cli_fail("plan", rc, &err);
        else
            n_loaded++;
    }
    const int single = p.n_clusters == 1 && p.n_gpus == 1;
    if (status < 0 && p.a.output && (!single || p.min_gpus)) {
        fprintf(stderr, "parallax plan: -o writes one plan: give one cluster and one GPU count\n");
        status = 2;
    }
    /* progress on stderr, stdout (and --json) untouched: a bar on a terminal, else a line per
     * phase of a search that outlasts 2 s (a log or CI shows the run is alive and where) */
    SimProgressBar bar = {.f = stderr, .lines = !isatty(STDERR_FILENO), .what = "parallax plan"};
    p.q.progress = sim_progress_bar;
    p.q.progress_ctx = &bar;
    if (status < 0)
        status = p.min_gpus ? plan_min_gpus(&p, cl) : single ? plan_one(&p, cl) : plan_sweep(&p, cl);
    /* after every result, which share the clusters' measurements */
    for (int i = 0; i < n_loaded; i++)
        prof_cluster_free(&cl[i]);
    return status;
}
