/* The planner over several cluster sizes and cluster profiles: the best layout at each
 * (size, cluster) ranked by the objective, which across sizes and clusters weighs time, cost
 * and tokens per GPU differently; and the fewest GPUs whose best layout meets a budget. */
#include "sim/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The objective's figure for one row of a sweep: step seconds; GPU-hours per million tokens
 * (times the price of a GPU-hour when one is given); tokens per second per GPU. *rank gets it
 * with lower better. */
static double objective_value(SimObjective o, const SimCandidate *c, int gpus, double price,
                              double *rank)
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

const char *sim_objective_unit(SimObjective o, int priced)
{
    return o == SIM_OBJ_COST ? (priced ? "cost per million tokens at the given GPU-hour prices"
                                       : "GPU-hours per million tokens")
           : o == SIM_OBJ_TOKENS_PER_GPU ? "tokens per second per GPU"
                                         : "step seconds";
}

/* The prices against the clusters and the objective that reads them. */
static int check_prices(SimObjective o, int n_clusters, const double *price, int n_price,
                        PxError *err)
{
    if (n_price == 0)
        return PX_OK;
    if (o != SIM_OBJ_COST)
        return px_fail(err, PX_EINPUT, "GPU-hour prices apply to the cost objective");
    if (n_price != 1 && n_price != n_clusters)
        return px_fail(err, PX_EINPUT, "GPU-hour prices: give one, or one per cluster (%d), got %d",
                       n_clusters, n_price);
    for (int i = 0; i < n_price; i++)
        if (!(price[i] > 0))
            return px_fail(err, PX_EINPUT, "GPU-hour prices must be positive, got %g", price[i]);
    return PX_OK;
}

/* The best layout at `gpus` GPUs into *res. A size with none is not a failure of the search
 * over sizes: its reason goes to *why, while PX_ERUNTIME (out of memory) is copied to err
 * too, for the caller to stop on. */
static int plan_size(const SimPlanRequest *q, const ProfCluster *cl, int gpus,
                     SimPlanResult *res, PxError *why, PxError *err)
{
    SimPlanRequest r = *q;
    r.gpus = gpus;
    r.top = 1;
    *why = (PxError){0};
    int rc = sim_plan(&r, cl, res, why);
    if (rc == PX_ERUNTIME)
        *err = *why;
    return rc;
}

/* One (size, cluster): its best layout and the objective's figure, or why none works. */
static int sweep_row(const SimPlanRequest *q, const ProfCluster *cl, int gpus, double price,
                     SimSweepRow *row, PxError *err)
{
    row->gpus = gpus;
    row->cluster = cl;
    PxError e2;
    int rc = plan_size(q, cl, gpus, &row->plan, &e2, err);
    if (rc == PX_ERUNTIME)
        return rc;
    row->ok = rc == PX_OK;
    if (row->ok)
        row->value = objective_value(q->objective, &row->plan.top[0], gpus, price, &row->rank);
    else
        px_strlcpy(row->error, e2.msg, sizeof row->error);
    return PX_OK;
}

int sim_sweep(const SimPlanRequest *q, const ProfCluster *clusters, int n_clusters,
              const int *gpus, int n_gpus, const double *price, int n_price, SimSweep *out,
              PxError *err)
{
    memset(out, 0, sizeof *out);
    out->best = -1;
    out->objective = q->objective;
    out->priced = n_price > 0;
    int rc = check_prices(q->objective, n_clusters, price, n_price, err);
    if (rc)
        return rc;
    if (n_clusters < 1 || n_gpus < 1)
        return px_fail(err, PX_EINPUT, "a sweep needs a cluster and a size");
    out->rows = calloc((size_t)n_gpus * (size_t)n_clusters, sizeof *out->rows);
    if (!out->rows)
        return px_fail(err, PX_ERUNTIME, "out of memory");
    out->n_gpus = n_gpus;
    out->n_clusters = n_clusters;
    for (int s = 0; s < n_gpus; s++) {
        for (int c = 0; c < n_clusters; c++) {
            SimSweepRow *row = &out->rows[out->n_rows++];
            const double p = n_price > 1 ? price[c] : n_price == 1 ? price[0] : 0;
            if ((rc = sweep_row(q, &clusters[c], gpus[s], p, row, err))) {
                sim_sweep_free(out);
                return rc;
            }
            if (row->ok && (out->best < 0 || row->rank < out->rows[out->best].rank))
                out->best = (int)(row - out->rows);
            if (q->progress)
                q->progress(q->progress_ctx, out->n_rows, (long)n_gpus * n_clusters, 3);
        }
    }
    return PX_OK;
}

void sim_sweep_free(SimSweep *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_rows; i++)
        sim_plan_free(&s->rows[i].plan);
    free(s->rows);
    memset(s, 0, sizeof *s);
    s->best = -1;
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
    char more[160] = ""; /* when the cluster, not --max-gpus, ended the scan: how to go on */
    if (cl->nodes > 0 && (long)cl->nodes * node < limit) {
        limit = cl->nodes * node;
        snprintf(more, sizeof more, "; cluster %s ends there (%d nodes of %d): --set nodes=N for more",
                 cl->name, cl->nodes, node);
    }
    char tried[256] = "", closest[160] = "";
    size_t n = 0;
    double closest_over = 0; /* how far the closest size missed the budget, as a ratio */
    for (int g = node; g <= limit; g = next_size(node, g)) {
        if (g < q->gpus) /* the smallest size to try */
            continue;
        SimPlanResult res;
        PxError why;
        int rc = plan_size(q, cl, g, &res, &why, err);
        if (rc == PX_ERUNTIME)
            return rc;
        if (rc == PX_OK) {
            const SimCandidate *c = &res.top[0];
            double days = max_days > 0 ? q->base.job.train_tokens / c->tokens_per_s / 86400.0 : 0;
            if ((max_step_s <= 0 || c->step_s <= max_step_s) &&
                (max_days <= 0 || days <= max_days)) {
                *out = res;
                *gpus_out = g;
                return PX_OK;
            }
            double over = fmax(max_step_s > 0 ? c->step_s / max_step_s : 0,
                               max_days > 0 ? days / max_days : 0);
            if (!closest[0] || over < closest_over) {
                closest_over = over;
                snprintf(closest, sizeof closest, "; the closest, %d GPUs, takes %.3g s a step%s",
                         g, c->step_s, "");
                if (max_days > 0)
                    snprintf(closest + strlen(closest), sizeof closest - strlen(closest),
                             " and %.3g days", days);
            }
            sim_plan_free(&res);
        }
        if (n < sizeof tried - 16)
            n += (size_t)snprintf(tried + n, sizeof tried - n, "%s%d", n ? "," : "", g);
        if (q->progress)
            q->progress(q->progress_ctx, g, limit, 4);
    }
    return px_fail(err, PX_EINPUT, "no cluster size up to %d GPUs meets the budget (tried %s%s)%s",
                   limit, tried[0] ? tried : "none", closest, more);
}
