/* The comm part: all-reduce, all-gather and reduce-scatter over groups of 2, 4, ... ranks (every
 * group at once, as in a job) and send/recv between pairs, over message sizes, through the MPI
 * communication layer. Each time is the slowest rank's; the table printed uses nccl-tests'
 * conventions (algbw = size / time, busbw by what each link carries). Rank 0 writes the part's
 * JSON, which assemble reads: the measured section's collectives. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec/calibrate/internal.h"

typedef enum {
    COLL_ALLREDUCE = 0,
    COLL_ALL_GATHER,
    COLL_REDUCE_SCATTER,
    COLL_SENDRECV,
    COLL_COUNT
} Coll;

static const char *const coll_names[COLL_COUNT] = {"allreduce", "all_gather", "reduce_scatter",
                                                   "sendrecv"};

/* One timed op over the layer of a (collective, group size); peer: the pair's other rank. */
typedef struct {
    CommLayer *c;
    Coll op;
    int group, peer;
    float *buf;
} Timed;

/* The distinct hosts of the job's ranks, on every rank. */
static int host_count(CommLayer *c, int *nodes, PxError *err)
{
    char host[64] = "unknown";
    gethostname(host, sizeof host - 1);
    char **all = NULL;
    int rc = comm_gather_text(c, host, &all, err);
    double v[1] = {1};
    if (!rc && comm_rank(c) == 0) {
        int n = 0;
        for (int i = 0; i < comm_world(c); i++) {
            int seen = 0;
            for (int j = 0; j < i && !seen; j++)
                seen = !strcmp(all[i], all[j]);
            n += !seen;
        }
        v[0] = n;
    }
    if (all) {
        for (int i = 0; i < comm_world(c); i++)
            free(all[i]);
        free(all);
    }
    if (!rc) {
        if (comm_rank(c) != 0)
            v[0] = 0;
        rc = comm_control(c, v, 1, COMM_SUM, err);
    }
    *nodes = (int)v[0];
    return rc;
}

/* One call of the op over bytes of t->buf. */
static int call_once(const Timed *t, size_t bytes, PxError *err)
{
    CommLayer *c = t->c;
    const size_t elems = bytes / sizeof(float), share = elems / (size_t)t->group;
    switch (t->op) {
    case COLL_ALLREDUCE:
        return comm_allreduce(c, t->buf, elems, PX_FP32, COMM_SUM, MODEL_TP_ALLREDUCE, NULL, err);
    case COLL_ALL_GATHER:
        return comm_all_gather(c, t->buf, t->buf + comm_group_rank(c, MODEL_GROUP_TP) * share,
                               share, PX_FP32, MODEL_TP_ALL_GATHER, NULL, err);
    case COLL_REDUCE_SCATTER:
        return comm_reduce_scatter(c, t->buf, t->buf, share, PX_FP32, MODEL_TP_REDUCE_SCATTER,
                                   NULL, err);
    default:
        /* the first half of the ranks send to the second */
        return t->peer > comm_rank(c)
                   ? comm_send(c, t->buf, bytes, t->peer, 7, MODEL_PP_SEND, NULL, err)
                   : comm_recv(c, t->buf, bytes, t->peer, 7, MODEL_PP_RECV, NULL, err);
    }
}

/* Seconds per call of the op at one size, the slowest rank's: two warm-up calls, then as many
 * as the budget allows, agreed by all. */
static int time_collective(const CalibOptions *o, const Timed *t, size_t bytes, double *seconds,
                           PxError *err)
{
    int rc = PX_OK;
    int iters = 0;
    const double budget = o->quick ? 0.005 : 0.05;
    *seconds = 0;
    for (int round = 0; round < 2 && !rc; round++) {
        int n = round == 0 ? 2 : iters;
        if ((rc = comm_barrier(t->c, err)))
            break;
        double t0 = px_now_s();
        for (int i = 0; i < n && !rc; i++)
            rc = call_once(t, bytes, err);
        double dt = px_now_s() - t0;
        double v[1] = {round == 0 ? dt / 2 : dt / n};
        if (!rc)
            rc = comm_control(t->c, v, 1, COMM_MAX, err);
        if (round == 0) {
            iters = (int)(budget / (v[0] > 1e-7 ? v[0] : 1e-7));
            iters = iters < 3 ? 3 : iters > 1000 ? 1000 : iters;
        } else {
            *seconds = v[0];
        }
    }
    return rc;
}

/* The layer for op over groups of g of the world's ranks: a TP group of g (the pipeline's pairs
 * for send/recv), all groups at once. */
static int layer_for(Coll op, int g, int world, CommLayer **out, PxError *err)
{
    ModelLayout l;
    memset(&l, 0, sizeof l);
    l.tp = op == COLL_SENDRECV ? 1 : g;
    l.pp = op == COLL_SENDRECV ? 2 : 1;
    l.dp = op == COLL_SENDRECV ? world / 2 : world / g;
    l.cp = 1;
    l.vpp = 1;
    return comm_mpi(&l, 0, out, err);
}

/* One collective over groups of g ranks at every size: a table on stdout (rank 0), and the
 * entry of the part's JSON. */
static int measure_op(const CalibOptions *o, Coll op, int g, int world, int nodes, float *buf,
                      int loud, cJSON *entry, PxError *err)
{
    const size_t lo = o->quick ? 4096 : 1024, hi = o->quick ? 1 << 20 : 64u << 20;
    Timed t = {NULL, op, g, -1, buf};
    int rc = layer_for(op, g, world, &t.c, err);
    if (rc)
        return rc;
    if (op == COLL_SENDRECV)
        t.peer = (comm_rank(t.c) + world / 2) % world;
    int gnodes = nodes > 1 ? (g * nodes + world - 1) / world : 1; /* ranks fill nodes in order */
    calib_say(loud, "%s over %d ranks%s\n%12s %12s %12s %12s\n", coll_names[op], g,
              op == COLL_SENDRECV ? " (pairs)" : "", "size (B)", "time (us)", "algbw (GB/s)",
              "busbw (GB/s)");
    cJSON_AddStringToObject(entry, "op", coll_names[op]);
    cJSON_AddNumberToObject(entry, "ranks", g);
    cJSON_AddNumberToObject(entry, "nodes", gnodes < 1 ? 1 : gnodes);
    cJSON *pts = cJSON_AddArrayToObject(entry, "points");
    for (size_t s = lo; s <= hi && !rc; s *= 4) {
        /* all-gather and reduce-scatter move whole per-rank shares */
        size_t elems = s / sizeof(float);
        if (op == COLL_ALL_GATHER || op == COLL_REDUCE_SCATTER)
            elems = (elems / (size_t)g > 0 ? elems / (size_t)g : 1) * (size_t)g;
        const size_t bytes = elems * sizeof(float);
        double sec = 0;
        if ((rc = time_collective(o, &t, bytes, &sec, err)))
            break;
        /* nccl-tests: algbw = size / time; busbw scales it by what each link carries */
        const double alg = bytes / sec;
        const double factor = op == COLL_ALLREDUCE  ? 2.0 * (g - 1) / g
                              : op == COLL_SENDRECV ? 1.0
                                                    : (double)(g - 1) / g;
        calib_say(loud, "%12zu %12.1f %12.3f %12.3f\n", bytes, 1e6 * sec, alg / 1e9,
                  alg * factor / 1e9);
        double v[2] = {(double)bytes, sec};
        cJSON_AddItemToArray(pts, cJSON_CreateDoubleArray(v, 2));
    }
    comm_free(t.c);
    return rc;
}

/* Group sizes: powers of two dividing the world, and the world itself. */
static int group_sizes(int world, int groups[16])
{
    int ng = 0;
    for (int g = 2; g <= world && ng < 15; g *= 2)
        if (world % g == 0)
            groups[ng++] = g;
    if (world > 1 && (ng == 0 || groups[ng - 1] != world))
        groups[ng++] = world;
    return ng;
}

int calib_collectives(const CalibOptions *o, CommLayer *world_layer, PxError *err)
{
    const int world = comm_world(world_layer), rank0 = comm_rank(world_layer) == 0;
    const int loud = rank0 && !o->quiet;
    if (world < 2)
        return px_fail(err, PX_EINPUT, "the comm part needs at least 2 ranks");
    int nodes = 1;
    int rc = host_count(world_layer, &nodes, err);
    if (rc)
        return rc;
    const size_t hi = o->quick ? 1 << 20 : 64u << 20;
    float *buf = malloc(hi + 64);
    cJSON *list = cJSON_CreateArray();
    if (!buf || !list) {
        free(buf);
        cJSON_Delete(list);
        return px_fail(err, PX_ERUNTIME, "out of memory");
    }
    for (size_t i = 0; i < hi / sizeof(float) + 16; i++)
        buf[i] = 1.0f / (float)(1 + i % 7);
    int groups[16];
    const int ng = group_sizes(world, groups);
    for (int op = 0; op < COLL_COUNT && !rc; op++)
        for (int gi = 0; gi < ng && !rc; gi++) {
            if (op == COLL_SENDRECV && (groups[gi] != 2 || world % 2))
                continue; /* point to point: pairs, first half of the ranks to the second */
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToArray(list, e);
            rc = measure_op(o, (Coll)op, groups[gi], world, nodes, buf, loud, e, err);
        }
    if (!rc && rank0) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "part", "comm");
        cJSON_AddNumberToObject(j, "ranks", world);
        cJSON_AddNumberToObject(j, "nodes", nodes);
        cJSON_AddItemToObject(j, "collectives", list);
        list = NULL;
        rc = px_json_write_file(o->output, j, err);
        cJSON_Delete(j);
    }
    cJSON_Delete(list);
    free(buf);
    return rc;
}
