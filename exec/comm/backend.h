/* Private to exec/comm: the table of raw operations each backend fills, and the state every
 * layer shares. comm.c's wrapper does what is the same for all of them (checks the kind, decides
 * a group of one, counts bytes and calls, hands the timeout on) and calls a backend only for
 * real communication, so that a backend never counts and never sees a collective over a group
 * of fewer than two ranks, a send or receive over a group of one, an all-reduce of no elements
 * or a sharded call on an empty block, or a world-wide call in a world of one. Backends put
 * their layer's state after a CommLayer (the first member), which the raw operations cast
 * back. */
#ifndef COMM_BACKEND_H
#define COMM_BACKEND_H

#include "exec/comm/comm.h"

enum { COMM_GROUPS = MODEL_GROUP_ETP_EP + 1 }; /* every ModelGroup, the last one included */

/* Raw operations: the arguments as comm.h's calls, *req already -1 where req is given. An entry
 * a backend never gets (see above) may be NULL: the one-rank layer has almost none. */
typedef struct {
    int (*allreduce)(CommLayer *c, void *buf, size_t count, PxDtype dtype, CommRedOp op,
                     ModelComm kind, int *req, PxError *err);
    int (*all_gather)(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                      ModelComm kind, int *req, PxError *err);
    int (*reduce_scatter)(CommLayer *c, void *out, const void *in, size_t count, PxDtype dtype,
                          ModelComm kind, int *req, PxError *err);
    /* over MODEL_GROUP_DP only (the wrapper refuses other kinds), numel > 0 */
    int (*reduce_scatter_shard)(CommLayer *c, void *buf, size_t numel, size_t shard,
                                PxDtype dtype, ModelComm kind, int *req, PxError *err);
    int (*all_gather_shard)(CommLayer *c, void *buf, size_t numel, size_t shard, PxDtype dtype,
                            ModelComm kind, int *req, PxError *err);
    /* in place, counts[i] elements of rank i packed in group order */
    int (*all_gather_v)(CommLayer *c, void *buf, const int64_t *counts, PxDtype dtype,
                        ModelComm kind, int *req, PxError *err);
    int (*send)(CommLayer *c, const void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                int *req, PxError *err);
    int (*recv)(CommLayer *c, void *buf, size_t bytes, int peer, int tag, ModelComm kind,
                int *req, PxError *err);
    /* blocking only; counts in elements per peer of the kind's group, packed by peer */
    int (*all_to_allv)(CommLayer *c, void *out, const int64_t *recv_counts, const void *in,
                       const int64_t *send_counts, PxDtype dtype, ModelComm kind, PxError *err);
    /* host memory, one int64 per peer of the kind's group; NULL: the inner layer's */
    int (*all_to_all_counts)(CommLayer *c, const int64_t *send, int64_t *recv, ModelComm kind,
                             PxError *err);
    /* *req >= 0: a handle this backend gave out */
    int (*wait)(CommLayer *c, int *req, PxError *err);
    void (*progress)(CommLayer *c); /* NULL: nothing to advance from the host */
    /* world-wide, on the host; NULL: the inner layer's (comm.c goes down to it) */
    int (*control)(CommLayer *c, double *vals, int n, CommRedOp op, PxError *err);
    int (*gather_text)(CommLayer *c, const char *text, char ***out, PxError *err);
    int (*barrier)(CommLayer *c, PxError *err);
    /* frees the backend's state, the CommLayer in it and the layer it runs on */
    void (*free)(CommLayer *c);
    /* NULL: the layer takes any pointer */
    int (*attach)(CommLayer *c, void *base, size_t bytes, PxError *err);
    /* the copy of an all-gather or reduce-scatter over a group of one, out != in; NULL: host
     * memmove. A layer for device memory gives its device copy. */
    int (*copy)(CommLayer *c, void *dst, const void *src, size_t bytes, PxError *err);
} CommOps;

struct CommLayer {
    const CommOps *ops;
    const char *name;
    int rank, world;
    int group_size[COMM_GROUPS]; /* ranks in this rank's group, by ModelGroup */
    int group_rank[COMM_GROUPS]; /* this rank's place in each group */
    uint64_t bytes[MODEL_COMM_COUNT]; /* since creation, by kind: the wrapper's alone */
    uint64_t calls[MODEL_COMM_COUNT];
    double timeout_s; /* 0: none; read by the MPI backend's waits */
    int step;         /* for the timeout's message */
    CommLayer *inner; /* the layer this one runs on (the staged and NCCL layers' MPI): it gets
                         the same timeout and step */
};

/* The shared state of a new layer: every group of one rank, nothing counted. */
void comm_layer_init(CommLayer *c, const CommOps *ops, const char *name, int rank, int world);
/* The shared state of a layer that runs on `inner`: inner's rank, world and groups, nothing
 * counted, c->inner = inner (the layer's free frees it too). */
void comm_layer_wrap(CommLayer *c, const CommOps *ops, const char *name, CommLayer *inner);

/* This rank's place on its node (MPI's shared-memory split): *local_rank of *local_size; 0
 * and 1 without MPI. */
void comm_mpi_local(int *local_rank, int *local_size);

/* Collective over the world: *sharing gets the most ranks of one node that hold the same id
 * (a GPU's PCI bus id; "" counts as an id of its own), over every node, and the result is 1
 * when any rank passed failed != 0 (0 otherwise), so that all ranks take the same path. 1 and
 * failed without MPI. */
int comm_mpi_node_sharing(const char *id, int failed, int *sharing);

/* How every process group is split out of the world for `rank` of layout l (MPI_Comm_split's
 * color and key), for the TP, CP, DP, EMBED, (HSDP's DPR), EP, ETP, EDP and (when it is a group
 * of its own: etp > 1 and ep > 1) ETP_EP groups in that order;
 * the DP group is the ZeRO group, dp_shard x cp ranks (dp rank = shard + dp_shard x replica),
 * and DPR, made only when dp_replicate > 1, holds the dp_replicate replicas of one shard; color is
 * `undefined` (MPI_UNDEFINED) where the rank belongs to no such group (EMBED off the first and
 * last stages, or without a tied pair). The expert groups follow model_expert_coords (etp
 * fastest, then ep, then expert data parallel, inside a stage). Returns the splits to make:
 * all, or none of the expert ones when the experts are laid out as the dense layers (ep 1, etp tp): their
 * ETP and EDP groups are then the TP and DP groups themselves (comm_group_alias) and EP a group
 * of one, so a dense job makes no communicator more than it did. The MPI and NCCL layers both
 * split by it, so their groups agree. */
enum { COMM_SPLITS = 9 };
typedef struct {
    ModelGroup group;
    int color, key;
} CommGroupSplit;
int comm_group_splits(const ModelLayout *l, int rank, int tied_pair, int undefined,
                      CommGroupSplit split[COMM_SPLITS]);
/* The group whose communicator g shares: TP for ETP and DP for EDP when the experts are laid out
 * as the dense layers, and for ETP_EP the group it equals; g itself otherwise. */
static inline ModelGroup comm_group_alias(const ModelLayout *l, ModelGroup g)
{
    /* with HSDP the DP group is a shard group, while routed experts keep the whole expert-data-
     * parallel group */
    const int dense = l->ep <= 1 && (l->etp == 0 || l->etp == l->tp) && l->dp_replicate <= 1;
    if (dense && g == MODEL_GROUP_ETP)
        return MODEL_GROUP_TP;
    if (dense && g == MODEL_GROUP_EDP)
        return MODEL_GROUP_DP;
    /* the all-gather dispatcher's etp x ep group: TP's when dense, else EP's or ETP's when the
     * other is one rank wide */
    const int n_etp = l->etp > 0 ? l->etp : l->tp;
    if (g == MODEL_GROUP_ETP_EP)
        return dense ? MODEL_GROUP_TP : n_etp == 1 ? MODEL_GROUP_EP
                                      : l->ep <= 1 ? comm_group_alias(l, MODEL_GROUP_ETP) : g;
    return g;
}

/* Ranks in the group of a valid kind. */
static inline int comm_group_of(const CommLayer *c, ModelComm kind)
{
    return c->group_size[model_comm_group(kind)];
}

#endif
