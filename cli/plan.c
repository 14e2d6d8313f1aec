/* parallax plan: parse the request, hand it to the planner (sim/plan.c), print or write. */
#include <stdio.h>
#include <stdlib.h>
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
    {"output", 1, "FILE", "write the best layout as a plan (DESIGN.md's Plan format)", CLI_OUTPUT, 'o'},
    {"json", 0, NULL, "machine-readable output", CLI_JSON, 0},
    {NULL, 0, NULL, NULL, 0, 0}};

static const struct {
    int knob;
    unsigned pin;
} pins[] = {{CLI_TP, SIM_PIN_TP},         {CLI_PP, SIM_PIN_PP},
            {CLI_DP, SIM_PIN_DP},         {CLI_CP, SIM_PIN_CP},
            {CLI_VPP, SIM_PIN_VPP},       {CLI_ZERO, SIM_PIN_ZERO},
            {CLI_SP, SIM_PIN_SP},         {CLI_NO_SP, SIM_PIN_SP},
            {CLI_MBS, SIM_PIN_MBS},       {CLI_RECOMPUTE, SIM_PIN_RECOMPUTE},
            {CLI_SCHEDULE, SIM_PIN_SCHEDULE}, {CLI_PP_LAYERS, SIM_PIN_PP | SIM_PIN_PP_LAYERS}};

typedef struct {
    double start_s, drawn_s; /* when the search began; when the bar was last drawn */
    int shown;
} Progress;

/* The bar appears once a search has run half a second (short ones stay silent) and is redrawn
 * at most ten times a second. */
static void progress(void *ctx, long done, long total, int phase)
{
    Progress *p = ctx;
    const double t = px_now_s();
    if (p->start_s == 0)
        p->start_s = t;
    if (phase == 2) {
        if (p->shown)
            fputs("\r\033[K", stderr);
        memset(p, 0, sizeof *p);
        return;
    }
    if (t - p->start_s < 0.5 || t - p->drawn_s < 0.1)
        return;
    p->drawn_s = t;
    p->shown = 1;
    int width = 30, fill = total > 0 ? (int)(width * (double)done / (double)total) : 0;
    if (fill > width)
        fill = width;
    fprintf(stderr, "\r%s [%.*s%*s] %ld/%ld", phase ? "timing   " : "searching", fill,
            "##############################", width - fill, "", done, total);
    fflush(stderr);
}

typedef struct {
    int ok;
    char line[1200];
    double value, rank; /* the objective's figure; the same, lower better */
    cJSON *json;
} SweepRow;

/* The objective's figure for one row of a sweep: step seconds; GPU-hours per million tokens
 * (times the price of a GPU-hour when one is given); tokens per second per GPU. *rank gets it
 * with lower better. */
static double objective_value(SimObjective o, const SimCandidate *c, int gpus, double price, double *rank)
{
    switch (o) {
    case SIM_OBJ_COST:
        *rank = (double)gpus / 3600.0 / c->tokens_per_s * 1e6 * (price > 0 ? price : 1.0);
        return *rank;
    case SIM_OBJ_TOKENS_PER_GPU:
        *rank = -c->tokens_per_s / gpus;
        return -*rank;
    default: *rank = c->step_s; return c->step_s;
    }
}

static void objective_unit(char *buf, size_t cap, SimObjective o, int priced)
{
    snprintf(buf, cap, "%s",
             o == SIM_OBJ_COST ? (priced ? "cost per million tokens at the given GPU-hour prices"
                                         : "GPU-hours per million tokens")
             : o == SIM_OBJ_TOKENS_PER_GPU ? "tokens per second per GPU"
                                           : "step seconds");
}

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

static int fail(int status, const PxError *err)
{
    fprintf(stderr, "parallax plan: %s\n", err->msg);
    return status == PX_EINPUT ? 2 : 1;
}

static void print_json(cJSON *j)
{
    char *s = cJSON_Print(j);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

int cli_cmd_plan(int argc, char **argv)
{
    CliArgs a;
    memset(&a, 0, sizeof a);
    model_spec_defaults(&a.spec);
    const CliOption *const tables[] = {plan_options, cli_knob_options, NULL};
    int st = cli_parse("plan",
                       "--model M --cluster C --gpus N --gbs B [--seq S] [knobs to pin] [options]\n\n"
                       "Searches every layout (tp, pp, dp, cp, vpp, zero, sp, micro-batch, recompute,\n"
                       "schedule), rejects what breaks a rule or does not fit, ranks the rest. Knobs\n"
                       "given are pinned; the others are searched.",
                       argc, argv, tables, 0, &a);
    if (st >= 0)
        return st;
    PxError err = {0};
    const char *gpus_text = a.extra[OPT_GPUS - CLI_EXTRA];
    const int min_gpus = a.extra[OPT_MIN_GPUS - CLI_EXTRA] != NULL;
    if (!a.model || !a.cluster || (!gpus_text && !min_gpus) || !(a.given & (1ull << CLI_GBS))) {
        fprintf(stderr, "parallax plan: --model, --cluster, --gpus and --gbs are required (see --help)\n");
        return 2;
    }
    if (!gpus_text)
        gpus_text = "1"; /* --min-gpus: from the smallest size up */
    SimPlanRequest q;
    memset(&q, 0, sizeof q);
    q.base = a.spec;
    q.top = 5;
    q.headroom = 0.05;
    for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++)
        if (a.given & (1ull << pins[i].knob))
            q.pinned |= pins[i].pin;
    int rc;
    const char *v;
    if ((v = a.extra[OPT_OBJECTIVE - CLI_EXTRA])) {
        int o = sim_objective_from_name(v);
        if (o < 0) {
            fprintf(stderr, "parallax plan: --objective: expected time, cost or tokens-per-gpu, got '%s'\n", v);
            return 2;
        }
        q.objective = (SimObjective)o;
    }
    if ((v = a.extra[OPT_TOP - CLI_EXTRA]) && (rc = px_parse_int(v, "--top", 1, 1000, &q.top, &err)))
        return fail(rc, &err);
    if ((v = a.extra[OPT_HEADROOM - CLI_EXTRA])) {
        if ((rc = px_parse_double(v, "--headroom", &q.headroom, &err)))
            return fail(rc, &err);
        if (!(q.headroom >= 0 && q.headroom < 1)) {
            fprintf(stderr, "parallax plan: --headroom: must be in [0, 1), got %s\n", v);
            return 2;
        }
    }
    q.allow_cross_node_tp = a.extra[OPT_CROSS_TP - CLI_EXTRA] != NULL;
    q.brute_force = a.extra[OPT_BRUTE - CLI_EXTRA] != NULL;
    const int explain = a.extra[OPT_EXPLAIN - CLI_EXTRA] != NULL;
    double max_step = 0, max_days = 0;
    int limit = 65536;
    if ((v = a.extra[OPT_MAX_STEP - CLI_EXTRA]) && (rc = px_parse_double(v, "--max-step-s", &max_step, &err)))
        return fail(rc, &err);
    if ((v = a.extra[OPT_MAX_DAYS - CLI_EXTRA]) && (rc = px_parse_double(v, "--max-days", &max_days, &err)))
        return fail(rc, &err);
    if ((v = a.extra[OPT_LIMIT - CLI_EXTRA]) && (rc = px_parse_int(v, "--max-gpus", 1, 1 << 24, &limit, &err)))
        return fail(rc, &err);
    if (min_gpus && max_step <= 0 && max_days <= 0) {
        fprintf(stderr, "parallax plan: --min-gpus needs --max-step-s and/or --max-days\n");
        return 2;
    }
    if (max_days > 0 && !(a.spec.job.train_tokens > 0)) {
        fprintf(stderr, "parallax plan: --max-days needs --tokens (the tokens to train on)\n");
        return 2;
    }
    if ((rc = model_config_load(a.model, &q.base.model, &err)))
        return fail(rc, &err);
    if ((q.pinned & SIM_PIN_PP_LAYERS) && (rc = model_split_check(&q.base.layout, q.base.model.layers, &err))) {
        fprintf(stderr, "parallax plan: --pp-layers: %s (%s)\n", err.msg, q.base.model.name);
        return 2;
    }

    char clusters[8][256], sizes[64][256];
    int n_cl = split_list(a.cluster, "--cluster", clusters, 8);
    int n_sz = split_list(gpus_text, "--gpus", sizes, 64);
    if (n_cl < 1 || n_sz < 1)
        return 2;
    int gpus[64];
    for (int i = 0; i < n_sz; i++)
        if ((rc = px_parse_int(sizes[i], "--gpus", 1, 1 << 24, &gpus[i], &err)))
            return fail(rc, &err);
    double price[8] = {0};
    int n_price = 0;
    if ((v = a.extra[OPT_PRICE - CLI_EXTRA])) {
        char prices[8][256];
        if ((n_price = split_list(v, "--gpu-hour-price", prices, 8)) < 1)
            return 2;
        if (q.objective != SIM_OBJ_COST) {
            fprintf(stderr, "parallax plan: --gpu-hour-price applies to --objective cost\n");
            return 2;
        }
        if (n_price != 1 && n_price != n_cl) {
            fprintf(stderr, "parallax plan: --gpu-hour-price: give one price, or one per cluster (%d), got %d\n",
                    n_cl, n_price);
            return 2;
        }
        for (int i = 0; i < n_price; i++) {
            if ((rc = px_parse_double(prices[i], "--gpu-hour-price", &price[i], &err)))
                return fail(rc, &err);
            if (!(price[i] > 0)) {
                fprintf(stderr, "parallax plan: --gpu-hour-price: must be positive, got %s\n", prices[i]);
                return 2;
            }
        }
    }
    ProfCluster cl[8];
    int n_loaded = 0, status = 0;
    for (int i = 0; i < n_cl; i++) {
        if ((rc = prof_cluster_load(clusters[i], a.sets, a.n_sets, &cl[i], &err))) {
            status = fail(rc, &err);
            goto done;
        }
        n_loaded++;
    }
    const int single = n_cl == 1 && n_sz == 1;
    if (a.output && (!single || min_gpus)) {
        fprintf(stderr, "parallax plan: -o writes one plan: give one cluster and one GPU count\n");
        status = 2;
        goto done;
    }
    Progress bar = {0};
    if (!a.json && isatty(STDERR_FILENO)) {
        q.progress = progress;
        q.progress_ctx = &bar;
    }

    if (min_gpus) {
        if (n_sz > 1) {
            fprintf(stderr, "parallax plan: --min-gpus takes one --gpus, the least to try; got %d\n", n_sz);
            status = 2;
            goto done;
        }
        q.gpus = gpus[0];
        cJSON *arr = a.json ? cJSON_CreateArray() : NULL;
        for (int c = 0; c < n_cl; c++) {
            SimPlanResult res;
            int g = 0;
            if ((rc = sim_plan_min_gpus(&q, &cl[c], max_step, max_days, limit, &res, &g, &err))) {
                cJSON_Delete(arr);
                status = fail(rc, &err);
                goto done;
            }
            if (a.json) {
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "cluster", cl[c].name);
                cJSON_AddNumberToObject(e, "gpus", g);
                cJSON_AddItemToObject(e, "search", sim_plan_search_json(&res));
                cJSON_AddItemToArray(arr, e);
            } else {
                char line[256];
                sim_plan_summary_line(line, sizeof line, &res);
                printf("%s: fewest GPUs meeting the budget: %d\n  %s\n", cl[c].name, g, line);
            }
            sim_plan_free(&res);
        }
        if (a.json)
            print_json(arr);
        status = 0;
        goto done;
    }

    if (single) {
        q.gpus = gpus[0];
        SimPlanResult res;
        if ((rc = sim_plan(&q, &cl[0], &res, &err))) {
            status = fail(rc, &err);
            goto done;
        }
        ModelPlan plan;
        SimResult full;
        int need_full = a.output || a.json;
        if (need_full && (rc = sim_plan_best(&res, &cl[0], clusters[0], q.gpus, &plan, &full, &err))) {
            sim_plan_free(&res);
            status = fail(rc, &err);
            goto done;
        }
        if (a.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "cluster", cl[0].name);
            cJSON_AddNumberToObject(j, "gpus", q.gpus);
            cJSON_AddItemToObject(j, "model", model_config_to_json(&plan.spec.model));
            cJSON_AddItemToObject(j, "training", model_job_to_json(&full.spec.job, &full.dims));
            cJSON_AddItemToObject(j, "layout", model_layout_to_json(&plan.spec.layout));
            cJSON_AddItemToObject(j, "prediction", cJSON_Duplicate(plan.prediction, 1));
            cJSON_AddItemToObject(j, "search", sim_plan_search_json(&res));
            print_json(j);
        } else {
            sim_plan_print(stdout, &q, &cl[0], &res, explain);
        }
        if (a.output) {
            cJSON *pj = model_plan_to_json(&plan);
            rc = px_json_write_file(a.output, pj, &err);
            cJSON_Delete(pj);
            if (rc) {
                model_plan_free(&plan);
                sim_result_free(&full);
                sim_plan_free(&res);
                status = fail(rc, &err);
                goto done;
            }
            if (!a.json)
                printf("\nwrote %s (layout 1 with its prediction)\n", a.output);
        }
        if (need_full) {
            model_plan_free(&plan);
            sim_result_free(&full);
        }
        sim_plan_free(&res);
        status = 0;
        goto done;
    }

    /* sweeps and side-by-side clusters: the best layout of each (cluster, size), then the
     * objective ranks the rows: across sizes and clusters time, cost and tokens per GPU differ */
    const int n_rows = n_sz * n_cl;
    SweepRow *rows = calloc((size_t)n_rows, sizeof *rows);
    cJSON *arr = a.json ? cJSON_CreateArray() : NULL;
    if (!rows) {
        cJSON_Delete(arr);
        fprintf(stderr, "parallax plan: out of memory\n");
        status = 1;
        goto done;
    }
    int best = -1;
    for (int s = 0; s < n_sz; s++) {
        for (int c = 0; c < n_cl; c++) {
            SweepRow *row = &rows[s * n_cl + c];
            SimPlanRequest r = q;
            r.gpus = gpus[s];
            r.top = 1;
            SimPlanResult res;
            PxError e2 = {0};
            rc = sim_plan(&r, &cl[c], &res, &e2);
            if (rc == PX_ERUNTIME) {
                cJSON_Delete(arr);
                free(rows);
                status = fail(rc, &e2);
                goto done;
            }
            row->ok = rc == PX_OK;
            if (row->ok) {
                sim_plan_summary_line(row->line, sizeof row->line, &res);
                row->value = objective_value(q.objective, &res.top[0], gpus[s], price[n_price > 1 ? c : 0], &row->rank);
                if (best < 0 || row->rank < rows[best].rank)
                    best = (int)(row - rows);
            } else {
                snprintf(row->line, sizeof row->line, "none: %s", e2.msg);
            }
            if (a.json) {
                row->json = cJSON_CreateObject();
                cJSON_AddStringToObject(row->json, "cluster", cl[c].name);
                cJSON_AddNumberToObject(row->json, "gpus", gpus[s]);
                if (row->ok) {
                    cJSON_AddNumberToObject(row->json, "objective_value", row->value);
                    cJSON_AddItemToObject(row->json, "search", sim_plan_search_json(&res));
                } else {
                    cJSON_AddStringToObject(row->json, "error", e2.msg);
                }
                cJSON_AddItemToArray(arr, row->json);
            }
            if (row->ok)
                sim_plan_free(&res);
        }
    }
    char unit[64];
    objective_unit(unit, sizeof unit, q.objective, n_price > 0);
    if (a.json) {
        for (int i = 0; i < n_rows; i++)
            if (rows[i].json)
                cJSON_AddBoolToObject(rows[i].json, "best", i == best);
        print_json(arr);
    } else {
        printf("%s, global batch %d: best layout per size; objective %s (%s)\n", q.base.model.name,
               q.base.job.global_batch, sim_objective_name(q.objective), unit);
        for (int s = 0; s < n_sz; s++) {
            for (int c = 0; c < n_cl; c++) {
                const SweepRow *row = &rows[s * n_cl + c];
                char value[48] = "";
                if (row->ok && q.objective == SIM_OBJ_COST)
                    snprintf(value, sizeof value, "  %10.4g", row->value);
                else if (row->ok && q.objective == SIM_OBJ_TOKENS_PER_GPU)
                    snprintf(value, sizeof value, "  %10.0f", row->value);
                printf("%6d  %-10s %s%s%s\n", gpus[s], cl[c].name, row->line, value,
                       row - rows == best && n_rows > 1 ? "  <- best" : "");
            }
        }
        if (best >= 0 && n_rows > 1)
            printf("best by %s: %d GPUs of %s, %.5g %s\n", sim_objective_name(q.objective),
                   gpus[best / n_cl], cl[best % n_cl].name, rows[best].value, unit);
    }
    free(rows);
done:
    /* after every result, which share the clusters' measurements */
    for (int i = 0; i < n_loaded; i++)
        prof_cluster_free(&cl[i]);
    return status;
}
