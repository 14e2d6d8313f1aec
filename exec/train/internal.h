/* Private to the trainer (exec/train) and to the tests that look inside it.
 *
 * The trainer's state is a set of parts, each owned by one file: only that file writes its
 * fields, others read them or call its functions, and functions receive the parts they use as
 * arguments. struct Exec (trainer.c) holds one of each; the orchestrating files (trainer.c,
 * step.c, schedule.c, run.c, report.c) see it whole, the others only the parts they are given.
 *
 *   part          file        what
 *   ExecCtx       trainer.c   fixed after init: kernels, spec and dims, this rank's grid, comm
 *   ExecGrid      grid.c      this rank's place: stage, TP/CP/DP/ZeRO ranks, chunks, neighbours
 *   ExecArenas    bind.c      one allocation per memory category, carved by the tensor table
 *   ExecParams    params.c    parameters and blocks, the named weight and gradient views
 *   ExecActs      acts.c      saved activations: pools of the schedule's live sets
 *   ExecWork      layers.c    workspace views the layers compute in; layers.c runs a chunk's
 *                             passes op by op, calling tp.c (tensor and sequence parallelism)
 *                             and cp.c (context parallelism, the sequence split) for theirs
 *   ExecPipe      pipeline.c  the pipeline's send and receive buffers and posted requests
 *   ExecZero      zero.c      data-parallel reductions, ZeRO's gathers and gradient bucket
 *   ExecFp8Gather fp8gather.c the FP8 parameter gather, ZeRO-3's and below (a part of ExecZero)
 *   ExecSched     schedule.c  the stage's actions and which slot holds which micro-batch
 *   ExecOptim     optim.c     the optimizer step, learning rate, gradient norm, loss scaler
 *   ExecMeter     meter.c     op timing (one scope an op), FLOP counting, the pipeline's
 *                             events, device memory
 *   ExecFaults    faults.c    failures on purpose (tests): kill, hang, Inf, NaN
 *   ExecBatches   data.c      the data source, its loader thread and the batches on the device
 *   ExecHistory   run.c       the run's per-step record, interruption
 *
 * Adding a parallel dimension touches model/ (layout, roles, op graph), grid.c (the rank's
 * place), the parts whose tensors it shards, a file of its own for its communication (as tp.c,
 * cp.c, moe.c and zero.c are), and the communication layer's groups (exec/comm);
 * docs/architecture.md has the list. */
#ifndef EXEC_TRAIN_INTERNAL_H
#define EXEC_TRAIN_INTERNAL_H

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "exec/checkpoint/checkpoint.h"
#include "exec/comm/comm.h"
#include "exec/train/train.h"
#include "kernels/kernels.h"

/* Element i of a tensor whose elements take es bytes: the act-dtype tensors (weights,
 * activations, their gradients) are void * and indexed with the backend's act size. */
#define EXEC_AT(p, i, es) ((void *)((char *)(p) + (size_t)(i) * (size_t)(es)))
/* Returns a nonzero status at once (the layer files' calls, each of which may fail). */
#define EXEC_TRY(x)                                                                               \
    do {                                                                                          \
        int rc_ = (x);                                                                            \
        if (rc_)                                                                                  \
            return rc_;                                                                           \
    } while (0)

/* calloc of n elements, where n may be 0 (a stage without such sets): never NULL unless out of
 * memory. */
static inline void *exec_zalloc(size_t n, size_t size) { return calloc(n > 0 ? n : 1, size); }

/* ---- grid.c: this rank's place in the layout ---- */

typedef struct {
    int rank, world;
    int stage, tp_rank, cp_rank, dp_rank;
    int ep_rank, edp_rank;    /* place among the expert-parallel and expert-data-parallel ranks
                                 (model_expert_coords) */
    int etp_rank;             /* place among the expert-tensor-parallel ranks: the slice of each
                                 local expert's width this rank holds */
    int zero_rank, zero_n;    /* place in the dp_shard x cp group that shards ZeRO state, its size */
    int dp_replica;           /* HSDP: which of the dp_replicate replicas of the ZeRO state (0
                                 without it) */
    int prev_rank, next_rank; /* the world ranks of the neighbouring stages (a ring) */
    /* [v] each, one allocation (exec_grid_free), whatever the chunks a stage holds: */
    int *chunk_g;             /* global chunk of each local chunk */
    int *chunk_l0;            /* its first (global) layer */
    int *chunk_cl;            /* its layers (0: a first chunk of the embedding only, a last
                                 chunk of the output layer and loss only) */
    int *chunk_mtp;           /* the prediction modules it holds after its layers (mtp.c):
                                 their layers' sets follow the chunk's in a slot */
    int cl;                   /* the most layers a chunk of this stage holds, its prediction
                                 modules' counted (an activation slot's layer sets) */
    int has_data, has_loss;   /* the stage reads tokens; computes the loss */
    int tied_here;            /* the output layer reads embed.wte on this chunk */
    int tied_pair;            /* the output layer is a copy on the last stage: embed_allreduce */
    int mtp_pair;             /* the prediction modules' copy of the embedding (mtp.wte) away
                                 from the first stage: an untied model's (on the last stage, or
                                 theirs), a tied one's on theirs (a third copy): embed_allreduce
                                 as tied_pair */
    int defer_logits_wgrad;   /* ZeRO-2/3 + tied here: the output layer's weight gradient waits
                                 until the embedding's block is in the bucket */
} ExecGrid;

/* Places `rank` of the layout (Megatron-Core's rank order); tt: the stage's table (which tells
 * whether it reads data and computes the loss). PX_ERUNTIME when out of memory for its chunks. */
int exec_grid_init(ExecGrid *g, const ModelSpec *s, const ModelDims *d, int rank, int world,
                   const ModelTensorTable *tt, PxError *err);
void exec_grid_free(ExecGrid *g);

/* ---- trainer.c: what every part reads and nobody changes after init ---- */

typedef struct ExecCtx {
    const KernBackend *k;
    PxDtype act;    /* the backend's activation (and weight) dtype */
    size_t ab;      /* its bytes */
    PxDtype grad;   /* the parameter gradients' dtype (training.grad_dtype, KernBackend.grad) */
    size_t gb;      /* its bytes */
    ModelSpec spec; /* normalised; job.steps and job.data as this run has them */
    ModelDims d;
    ExecGrid g;
    CommLayer *comm;
    float dropout;
    int attn_dropout; /* dropout of the attention probabilities (unfused path only) */
    int steps;        /* the run's steps (its last step's number) */
    int quiet;
} ExecCtx;

/* ---- arena.c and bind.c: the category arenas ---- */

/* One allocation per memory category, carved by the tensor table in two passes: a sizing pass
 * (base NULL: only offsets advance, as ggml's no_alloc) and the real one. Any alignment padding
 * counts as used, so a measured figure that equals the table's sum proves nothing was wasted. */
typedef struct {
    uint8_t *base;
    uint64_t cap;  /* bytes allocated */
    uint64_t used; /* bytes carved */
    int host;      /* in host memory, not the backend's (optimizer offload: master, optimizer) */
} ExecArena;

typedef struct {
    ExecArena a[MODEL_CAT_COUNT];
} ExecArenas;

/* NULL in the sizing pass (or past the end, which the second pass reports). */
void *exec_arena_carve(ExecArena *a, uint64_t bytes, size_t align);

struct ExecPipe;
struct ExecZero;
struct ExecWork;
struct ExecBatches;
struct ExecActs;
struct ExecParams;
struct ExecFp8;

/* Sizes the arenas from the table, allocates them and binds every tensor to the part that owns
 * it; PX_ERUNTIME naming a tensor no part takes, or when the two passes disagree. */
int exec_bind_all(ExecArenas *A, const ModelTensorTable *tt, const struct ExecCtx *c,
                  struct ExecParams *P, struct ExecActs *X, struct ExecWork *W,
                  struct ExecPipe *pipe, struct ExecZero *Z, struct ExecBatches *B,
                  struct ExecFp8 *F, PxError *err);
void exec_arenas_free(ExecArenas *A, const KernBackend *k);
/* arena.c: the binding's failures when model/ and exec/ disagree, one wording for every part: a
 * tensor the part has no use for, one in another dtype than the part keeps it in. PX_ERUNTIME. */
int exec_bind_unused(const ModelTensor *t, PxError *err);
int exec_bind_wrong_dtype(const ModelTensor *t, PxDtype want, PxError *err);

/* ---- params.c: parameters, blocks and their views ---- */

/* A layer's parameters (act dtype) or their gradients (fp32), by role: index r - MODEL_TR_LN1_W
 * for r in MODEL_TR_LN1_W ... MODEL_TR_FC2_B. */
enum { EXEC_LAYER_PARAMS = MODEL_TR_FC2_B - MODEL_TR_LN1_W + 1 };
/* A MoE layer's further parameters, by role: index r - MODEL_TR_ROUTER_W for r in
 * MODEL_TR_ROUTER_W ... MODEL_TR_SHARED_GATE_W (the routed experts in their own block). */
enum { EXEC_MOE_PARAMS = MODEL_TR_SHARED_GATE_W - MODEL_TR_ROUTER_W + 1 };
/* Multi-head latent attention's, by role: index r - MODEL_TR_Q_A_W for r in MODEL_TR_Q_A_W ...
 * MODEL_TR_KV_B_W (mla.c; the QKV projection's views are NULL then). */
enum { EXEC_MLA_PARAMS = MODEL_TR_KV_B_W - MODEL_TR_Q_A_W + 1 };
/* A prediction module's own parameters, by role: index r - MODEL_TR_MTP_ENORM_W (mtp.c). */
enum { EXEC_MTP_PARAMS = MODEL_TR_MTP_NORM_W - MODEL_TR_MTP_ENORM_W + 1 };
typedef struct {
    void *t[EXEC_LAYER_PARAMS];
    void *m[EXEC_MOE_PARAMS];
    void *sinks; /* attention sinks [heads_loc] (GPT-OSS), or NULL */
    void *a[EXEC_MLA_PARAMS];
    void *mtp[EXEC_MTP_PARAMS];
} ExecLayerParams;
typedef struct {
    float *t[EXEC_LAYER_PARAMS];
    float *m[EXEC_MOE_PARAMS];
    float *sinks;
    float *a[EXEC_MLA_PARAMS];
    float *mtp[EXEC_MTP_PARAMS];
} ExecLayerGrads;
#define EXEC_LP(p, R) ((p)->t[MODEL_TR_##R - MODEL_TR_LN1_W])
#define EXEC_LPM(p, R) ((p)->m[MODEL_TR_##R - MODEL_TR_ROUTER_W])
#define EXEC_LPA(p, R) ((p)->a[MODEL_TR_##R - MODEL_TR_Q_A_W])
#define EXEC_LPT(p, R) ((p)->mtp[MODEL_TR_MTP_##R - MODEL_TR_MTP_ENORM_W])

/* How a parameter's local elements map to the full, unsharded tensor (initialization). */
typedef enum {
    EXEC_MAP_FULL = 0, /* replicated: the same index */
    EXEC_MAP_QKV,      /* rows: this rank's Q heads, then its K heads, then its V heads */
    EXEC_MAP_ROWS,     /* a row slice: rows tp * rows_local ... (fc1 of GeLU, vocabulary) */
    EXEC_MAP_SWIGLU,   /* rows [gate slice | up slice] */
    EXEC_MAP_COLS,     /* a column slice (row-parallel attention projection, fc2) */
    EXEC_MAP_EXPERTS,  /* a MoE layer's routed experts: rows ep * rows_local ... (this rank's
                          experts, whole: etp 1) */
    EXEC_MAP_EXPERTS_FC1, /* etp > 1: this rank's experts, each its [gate | up] slice of rows */
    EXEC_MAP_EXPERTS_FC2, /* etp > 1: this rank's experts, each its slice of columns */
    EXEC_MAP_KV_B         /* MLA's kv_b: rows [its heads' keys | its heads' values] (mla.c) */
} ExecMap;

/* One parameter: its place in its block, how it is initialized and counted, where it is. */
typedef struct {
    char name[56];      /* the table's name ("layer.3.attn.qkv.w") */
    char init_name[56]; /* the stream it is drawn from (a tied copy draws embed.wte's) */
    ModelTensorRole role;
    int layer;          /* -1 outside the layers */
    void *w;            /* its weights (act) and gradients (fp32); ZeRO-3: in the gather */
    float *g;           /* buffer while its block is gathered; ZeRO-2/3: in the bucket */
    uint64_t numel, off;    /* off: elements before it in its block's flat layout */
    int64_t rows, cols;     /* local shape (cols 1 for vectors) */
    int block;
    int decay;      /* weight decay applies (matrices and embeddings, not biases or norms) */
    int replicated; /* the same on every TP rank: its gradient norm is counted on TP rank 0 */
    int tied_copy;  /* the output layer's copy of embed.wte on the last stage: counted on the
                       first stage only */
    int norm;       /* a norm weight or bias */
    int sp_sum;     /* replicated over TP while each rank sees its sequence shard (norms, a MoE
                       layer's router): SP sums its gradient over TP */
    int fp8;        /* an FP8 GEMM's weight kept in FP8 only (--fp8-param-gather below ZeRO-3):
                       no act weights (w NULL), its FP8 tensor is ExecFp8Weight.q */
    ExecMap map;
} ExecParam;

/* A parameter block (the embedding, a layer, the final norm and output layer): the unit of
 * gradient reduction and of ZeRO sharding. */
typedef struct {
    int chunk, layer;
    uint64_t numel, shard;   /* elements on this rank; shard = ceil(numel / zero group) */
    uint64_t own_off, own_n; /* this rank's shard of the block: [own_off, own_off + own_n) */
    int first_param, n_params;
    void *w;        /* ZeRO < 3: the block's weights (act), contiguous; NULL when it holds FP8
                       parameters (fp8: its weights are each parameter's own) */
    float *g;       /* ZeRO < 2: its gradients (fp32), contiguous */
    void *w_shard;  /* ZeRO 3: this rank's shard of the weights */
    float *g_shard; /* ZeRO >= 2: this rank's shard of the gradients */
    float *m, *v;   /* optimizer state: numel (ZeRO 0) or shard elements */
    /* adam-8bit's state instead (optim.c): m and v one code a value, an fp32 absmax per
     * MODEL_ADAM8_BLOCK values of each ([2][blocks]: m's, then v's) */
    uint8_t *m8, *v8;
    float *absmax;
    float *master;  /* fp32 master weights (act not fp32), laid out as m */
    int tied;       /* holds the tied embedding and must sum it with the other stage first */
    int experts;    /* a MoE layer's routed experts: reduced over the expert-data-parallel group */
    int group, group_rank; /* the ranks that shard its ZeRO state and reduce its gradients (dp x
                              cp; edp for experts) and this rank's place among them: its shard */
    int fp8;        /* holds FP8 parameters (ExecParam.fp8): fp8gather.c gathers its update */
} ExecBlock;

typedef struct ExecParams {
    ExecParam *p;
    int n;
    ExecBlock *b;
    int nb;
    int embed_block, final_block; /* indices in b, or -1 */
    int *layer_block;             /* [layers + mtp_layers]: the block of each layer of the stage
                                     (a prediction module's after the model's), or -1 */
    int *expert_block;            /* [layers + mtp_layers]: a MoE layer's routed experts' block,
                                     or -1 */
    /* the named views the layers read (ZeRO-3: pointed into the gather buffer per block) */
    ExecLayerParams *lw; /* [layers + mtp_layers] (this stage's layers bound) */
    ExecLayerGrads *lg;
    void *wte, *wpe, *lnf_w, *lnf_b, *out_w; /* out_w is wte when tied on this chunk */
    float *g_wte, *g_wpe, *g_lnf_w, *g_lnf_b, *g_out_w;
} ExecParams;

/* The stage's parameters and blocks from its tables: tt (this run's ZeRO stage: the blocks and
 * their shards) and twin (the same stage without ZeRO: every parameter's name, role and shape,
 * which ZeRO-3's table no longer lists). */
int exec_params_build(ExecParams *P, const ExecCtx *c, const ModelTensorTable *tt,
                      const ModelTensorTable *twin, PxError *err);
/* Binds tensor t of the table (weights, gradients, shards, master, optimizer state) to p (NULL
 * in the sizing pass). PX_ERUNTIME naming t when the parameters have no use for it. */
int exec_params_bind(ExecParams *P, const ExecCtx *c, const ModelTensor *t, void *p,
                     PxError *err);
/* After binding: every parameter's views at its memory (ZeRO 2/3 gradients in the bucket of
 * bucket_elems elements), with the checks that its block is laid out as one flat buffer and
 * that ZeRO has its buffers (the bucket; ZeRO-3 the gather, which the views point into later). */
int exec_params_finish(ExecParams *P, const ExecCtx *c, float *bucket, uint64_t bucket_elems,
                       const void *gather, PxError *err);
/* Points block b's weight views at base (ZeRO-3's gather buffer). */
void exec_params_point(ExecParams *P, const ExecCtx *c, int b, void *base);
/* The same with the block's act parameters packed (ZeRO-3's FP8 parameter gather): its i-th
 * parameter at base + off[i] elements, or none (NULL views) where off[i] is UINT64_MAX. */
void exec_params_point_packed(ExecParams *P, const ExecCtx *c, int b, void *base,
                              const uint64_t *off);
/* The part of parameter p this rank owns (updates, counts in the norm): [*lo, *hi) in block
 * offsets; 0 when empty. */
int exec_params_own(const ExecParams *P, const ExecParam *p, uint64_t *lo, uint64_t *hi);
/* The parameter of (role, layer) on this stage (layer ignored outside the layers), or NULL. */
const ExecParam *exec_params_of(const ExecParams *P, ModelTensorRole role, int layer);
void exec_params_free(ExecParams *P);

/* A bias (of a layer, a norm, a MoE layer's router or its experts): initialized to 0. */
static inline int exec_is_bias(ModelTensorRole r)
{
    return r == MODEL_TR_LN1_B || r == MODEL_TR_QKV_B || r == MODEL_TR_PROJ_B ||
           r == MODEL_TR_LN2_B || r == MODEL_TR_FC1_B || r == MODEL_TR_FC2_B ||
           r == MODEL_TR_FINAL_LN_B || r == MODEL_TR_ROUTER_B || r == MODEL_TR_EXP_FC1_B ||
           r == MODEL_TR_EXP_FC2_B;
}

/* An FP8 weight's copy, transposed copy, amax history or (MXFP8 parameters under ZeRO-3) its
 * scale grids (fp8.c's, not a parameter). */
static inline int exec_is_fp8_copy(ModelTensorRole r)
{
    return r == MODEL_TR_FP8_W || r == MODEL_TR_FP8_WT || r == MODEL_TR_FP8_AMAX ||
           r == MODEL_TR_FP8_MX_SCALES;
}

/* init.c: the layout-independent initial value of every parameter (and its master copy),
 * through an fp32 scratch (bucket, ZeRO 2/3) that is zeroed again after, drawn on *threads
 * host threads (the cores this rank may run on). */
int exec_params_init_values(ExecParams *P, const ExecCtx *c, ExecArenas *A, float *bucket,
                            uint64_t bucket_elems, int *threads, PxError *err);
/* seeds of the dropout streams */
enum { EXEC_SITE_EMBED = 1, EXEC_SITE_ATTN = 2, EXEC_SITE_ATTN_OUT = 3, EXEC_SITE_MLP_OUT = 4 };
uint64_t exec_hash_name(uint64_t seed, const char *name);
/* The stream whose element i is element i + offset of stream `seed` (kern_dropout_keep draws
 * element i from seed + golden * (i + 1)): a shard of a row draws what the whole row would. */
static inline uint64_t exec_stream_at(uint64_t seed, uint64_t offset)
{
    return seed + 0x9E3779B97F4A7C15ull * offset;
}

/* ---- acts.c: saved activations ---- */

/* One layer's activations for one micro-batch, by role: index r - MODEL_TR_LN1_IN (pointers into
 * a slot of the pool, or into ws.recompute for what the recompute mode re-creates). */
enum { EXEC_LAYER_ACTS = MODEL_LAYER_ACTS + MODEL_MOE_ACTS + MODEL_MLA_ACTS };
/* A prediction module's layer also saves mtp.eh.in (EXEC_MTP_ACT, after MLA's). */
enum { EXEC_MTP_ACT = EXEC_LAYER_ACTS };
typedef struct {
    void *t[EXEC_LAYER_ACTS + 1]; /* a MoE layer's (model_moe_acts), then MLA's (model_mla_acts),
                                     then a prediction module's eh.in */
} ExecLayerActs;
#define EXEC_LA(a, R) ((a)->t[MODEL_TR_##R - MODEL_TR_LN1_IN])
#define EXEC_LMA(a, R) ((a)->t[MODEL_LAYER_ACTS + MODEL_TR_##R - MODEL_TR_ROUTER_PROBS])
#define EXEC_LAA(a, R) ((a)->t[MODEL_LAYER_ACTS + MODEL_MOE_ACTS + MODEL_TR_##R - MODEL_TR_Q_LAT])

/* The embedding's and output layer's saved tensors of one micro-batch, by role: index
 * r - MODEL_TR_EMBED_DROP_MASK. loss.probs holds the fp32 logits, then the probabilities,
 * then their gradient; for the backward GEMMs that gradient is narrowed in place to the act
 * dtype (layers.c), which then occupies the first half of it. */
enum { EXEC_HEAD_ACTS = MODEL_TR_LOSS_PROBS - MODEL_TR_EMBED_DROP_MASK + 1 };
enum { EXEC_MTP_MAX = 16 }; /* prediction modules (model/config.c's limit) */
typedef struct {
    void *t[EXEC_HEAD_ACTS];
    /* each prediction module's output (its final norm's input), that norm's output and its
     * loss's fp32 probabilities: mtp.N.final_ln.in, mtp.N.logits.in, mtp.N.loss.probs */
    void *mtp_out[EXEC_MTP_MAX], *mtp_logits_in[EXEC_MTP_MAX], *mtp_probs[EXEC_MTP_MAX];
} ExecHeadActs;
#define EXEC_HA(x, R) ((x)->t[MODEL_TR_##R - MODEL_TR_EMBED_DROP_MASK])

typedef struct ExecActs {
    int n_slots;              /* layer sets (cl layers each) alive at once */
    /* per chunk ([v] each, allocated at init whatever v is): */
    int *n_xslots;            /* its extras' sets alive at once */
    ExecLayerActs *acts;      /* [v][n_slots][cl]: each chunk's views of the same slots */
    ExecHeadActs **xacts;     /* [v][n_xslots[j]] */
    ExecLayerActs region;     /* the parts of a layer that live in ws.recompute */
    ExecLayerActs region_moe; /* a MoE layer's (its router's and experts' too: full recompute) */
    uint64_t slot_bytes, *xslot_bytes;  /* xslot_bytes: [v] */
    int *slot_busy, **xslot_busy;       /* xslot_busy: [v][n_xslots[j]] */
    int live, peak_live, *xlive, *peak_xlive; /* the last two: [v] */
    uint64_t *used;           /* [v]: exec_acts_bind's bytes of each chunk carved so far */
} ExecActs;

/* Pools for the live sets the schedule's actions need (model_schedule_live). */
int exec_acts_init(ExecActs *X, const ExecCtx *c, const ModelAction *actions, int n,
                   PxError *err);
/* The activation pass of the binding: every saved activation of the table carved from the
 * activation arena, slot by slot (pass 0 sizes, 1 binds). */
int exec_acts_bind(ExecActs *X, const ExecCtx *c, const ModelTensorTable *tt, ExecArena *arena,
                   int pass, PxError *err);
/* ws.recompute: what the recompute mode does not save, one layer's worth reused by every layer.
 * Called when the workspace is bound (before exec_acts_bind's pass 1). */
int exec_acts_region(ExecActs *X, const ExecCtx *c, uint8_t *base, uint64_t bytes, PxError *err);
/* A free slot (and extras slot of chunk j when the chunk has extras) for a micro-batch's
 * forward; PX_ERUNTIME when the schedule holds more sets than counted. */
int exec_acts_acquire(ExecActs *X, int j, int *slot, int *xslot, PxError *err);
void exec_acts_release(ExecActs *X, int j, int slot, int xslot);
/* Chunk j's layer sets in the slot and the chunk's extras of an xslot. */
ExecLayerActs *exec_acts_layers(const ExecActs *X, const ExecCtx *c, int j, int slot);
ExecHeadActs *exec_acts_extras(const ExecActs *X, int j, int xslot);
/* Forward-only passes: one slot serves every micro-batch in turn. */
void exec_acts_reset(ExecActs *X, int j);
uint64_t exec_acts_in_use_peak(const ExecActs *X, const ExecCtx *c);
void exec_acts_free(ExecActs *X, const ExecCtx *c);

/* ---- meter.c: what was measured ---- */

typedef struct {
    char name[64];
    int compute; /* a compute op (1) or communication (0) */
    int chunk;
    ModelPhase phase;
    int next_same;                         /* the next op with the same key, or -1 */
    double step_calls, step_flops, step_s; /* the current step */
    double last_calls, last_flops;         /* the last finished step */
    double timed_s;                        /* summed over the timed steps */
} ExecOpStat;

/* One pass of the pipeline schedule as it ran: seconds from the start of the step. */
typedef struct {
    int chunk, mb, backward;
    double start_s, end_s;
} ExecEvent;

/* The ops a layer runs, by role (MODEL_OPR_LN1 ... MODEL_OPR_COMBINE: a MoE layer's router,
 * experts and combine among them; the roles between that no layer runs stay -1). */
/* a layer's ops: LN1 ... COMBINE, then MLA's Q_A ... KV_B */
enum { EXEC_LAYER_OPS = MODEL_OPR_KV_B - MODEL_OPR_LN1 + 1, EXEC_PHASES = 3 };
/* The most ops open at once (an op, the communication within it, a wait within that). */
enum { EXEC_METER_DEPTH = 8 };

typedef struct {
    const ModelOpGraph *graph;
    ExecOpStat *ops;          /* [graph->count] */
    ExecOpReport *report;
    int *layer_op;            /* [layers][EXEC_LAYER_OPS][EXEC_PHASES]: index into ops or -1 */
    int other_op[MODEL_OPR_COUNT][EXEC_PHASES];
    uint64_t *keys;           /* open addressing: every op's key, and its first op */
    int *slots;
    int cap;
    int open[EXEC_METER_DEPTH]; /* the ops open, innermost last: it runs, the others wait */
    int depth;
    int misused, misuse_op, misuse_top; /* the first scope that did not pair (meter.c) */
    int step_timing;          /* no wait for the device around ops, no op seconds */
    double op_t0;             /* when the innermost open op started or resumed */
    double unattributed_flops;
    int timed_steps;
    /* the pipeline's passes of the current and the last finished step */
    ExecEvent *events, *last_events;
    int n_events, have_events;
    double step_t0, pass_start, pass_end; /* pass_end < 0: at the pass's return */
    double *step_bubble;      /* [steps]: idle over busy pipeline time of each timed step */
    int n_bubbles, cap_bubbles;
    uint64_t step_bytes[MODEL_COMM_COUNT], bytes_at_step[MODEL_COMM_COUNT];
    /* the device's own account of its memory (cudaMemGetInfo); 0 where there is none */
    int have_dev_mem;
    uint64_t dev_total, dev_used_start, dev_used_peak;
} ExecMeter;

/* Indexes every op of the graph by its role key and checks that the trainer runs each one and
 * that every op the trainer runs is in the graph (PX_ERUNTIME naming it). */
int exec_meter_init(ExecMeter *M, const ExecCtx *c, const ModelOpGraph *g, int n_actions,
                    PxError *err);
void exec_meter_free(ExecMeter *M);
/* The op at (role, layer or block, chunk, phase, comm kind: MODEL_COMM_COUNT for a compute
 * op); occurrence k picks the k-th (0: the first); -1 when the graph has none. */
int exec_meter_find(const ExecMeter *M, ModelOpRole role, int index, int chunk, ModelPhase phase,
                    int kind, int occurrence);
/* The same op, which the trainer is about to run: PX_ERUNTIME when the graph has none, naming
 * `what` (exec_meter_missing). */
int exec_meter_need(const ExecMeter *M, const ExecCtx *c, ModelOpRole role, int index, int chunk,
                    ModelPhase phase, int kind, int occurrence, const char *what, int *op,
                    PxError *err);
/* PX_ERUNTIME: the trainer makes a communication (`what`) that stage's op graph does not list. */
int exec_meter_missing(const ExecCtx *c, const char *what, PxError *err);
/* A layer's compute op, or one outside the layers (index -1). */
int exec_meter_layer_op(const ExecMeter *M, int layer, ModelOpRole role, ModelPhase phase);
int exec_meter_other_op(const ExecMeter *M, ModelOpRole role, ModelPhase phase);
/* The op of communication `kind` at (role, layer: -1 outside the layers, chunk, phase): -1 with
 * err filled (exec_meter_missing, naming it as the graph does) when the graph has none. */
int exec_meter_comm_op(const ExecMeter *M, const ExecCtx *c, ModelOpRole role, int layer,
                       int chunk, ModelPhase phase, ModelComm kind, PxError *err);

/* Op timing: one scope an op, exec_meter_open where it starts and exec_meter_close (naming the
 * same op) where it ends, both in the function that runs it. Scopes nest: an op opened within
 * another (the TP all-gather within QKV's op, a CP ring's messages within the attention core)
 * pauses it until it closes, so that each second of the step and each FLOP counted
 * (exec_meter_flops) goes to the innermost op open. Opening counts a call of the op;
 * exec_meter_open_again times more of a call already counted (the wait for a non-blocking
 * communication posted earlier, a MoE layer's router and combine whose work lies on both sides
 * of another op). An error return may leave scopes open: the step fails, and the next one
 * starts with none (exec_meter_step_begin). */
void exec_meter_open(ExecMeter *M, const KernBackend *k, int op);
void exec_meter_open_again(ExecMeter *M, const KernBackend *k, int op);
void exec_meter_close(ExecMeter *M, const KernBackend *k, int op);
/* At the end of a step that succeeded: PX_ERUNTIME naming the op when its scopes did not pair
 * (an op closed that was not the innermost open, or left open). */
int exec_meter_scopes_check(const ExecMeter *M, PxError *err);
void exec_meter_flops(ExecMeter *M, double flops);
void exec_meter_step_begin(ExecMeter *M, const CommLayer *comm);
/* Timed steps exclude the first of a run (page faults, BLAS warm-up) unless it is the only one. */
void exec_meter_step_end(ExecMeter *M, const CommLayer *comm, int timed);
/* The schedule's passes: the step starts, a pass gets its input, a pass is ready to send its
 * output (what follows, waiting for the send buffer, is the pipeline's idle), a pass ends. */
void exec_meter_schedule_begin(ExecMeter *M);
void exec_meter_pass_input(ExecMeter *M);
void exec_meter_pass_output(ExecMeter *M);
void exec_meter_pass_end(ExecMeter *M, int i, int chunk, int mb, int backward);
void exec_meter_schedule_end(ExecMeter *M, int n_actions);
/* This rank's bubble: idle over busy pipeline time, the median over the timed steps (the
 * recorded step's when none is timed yet); busy_s and idle_s (optional) get the recorded
 * step's. */
double exec_meter_bubble(const ExecMeter *M, double *busy_s, double *idle_s);
/* Records the last step's bubble among the timed steps. */
void exec_meter_keep_bubble(ExecMeter *M);
double exec_meter_step_flops(const ExecMeter *M);
const ExecOpReport *exec_meter_ops(ExecMeter *M, int *n);
/* Samples the device's memory in use (the peak). */
void exec_meter_device_memory(ExecMeter *M, const KernBackend *k, int at_start);

/* ---- fp8.c: FP8 training (docs/fp8.md) ---- */

/* The three tensors each FP8 GEMM quantizes, as delayed scaling keeps their histories: the
 * input, the weight, the output gradient. */
enum { EXEC_FP8_X = 0, EXEC_FP8_W = 1, EXEC_FP8_DY = 2 };

/* One FP8 GEMM's weight: its FP8 copy and transposed copy (KernFp8 tensors, `groups` of them
 * for a MoE layer's experts, one per local expert), and delayed scaling's state. */
typedef struct {
    const ExecParam *p; /* the parameter (its act values are what is cast) */
    void *q, *qt;       /* <w>.fp8 (NULL until bound) and <w>.fp8_t (NULL without copies) */
    float *hist;        /* <w>.fp8_amax: column c of group g at (3g + c) * len, newest first */
    float *scale;       /* then the decode factors delayed scaling quantizes with: [hist_cols] */
    int groups, rows, cols; /* one group's [rows, cols] */
    int hist_cols;      /* 3 x groups, and for the experts' fc1 under --fp8-dispatch with delayed
                           scaling one more: the dispatched rows' (model_fp8_dispatch_history);
                           for the QKV weight (MLA's kv_b: model_fp8_attn_weight) FP8
                           attention's (model_fp8_attn_history) */
    const void *gq;     /* ZeRO-3 with --fp8-param-gather: the weight as its block's gather left
                           it in FP8 (elements, then its scale), which its GEMMs read; NULL
                           otherwise; MXFP8's: the row-wise copy's elements only */
    const void *gqt;    /* MXFP8's under ZeRO-3: the gathered column-wise copy (the weight's
                           shape, 32 x 1 blocks; elements only) */
    uint8_t *mxs;       /* MXFP8's under ZeRO-3: <w>.fp8_scales, every rank's E8M0 scales of the
                           whole weight, a local expert's after another's: its row-wise grid
                           (1 x 32 blocks), then its column-wise one (32 x 1); NULL otherwise */
} ExecFp8Weight;

/* An FP8 operand on the device: its bytes (elements, then scales) and its layout. */
typedef struct {
    const void *q;
    KernFp8 f;
} ExecFp8Ref;

typedef struct ExecFp8 {
    int on;             /* the job has an FP8 recipe */
    ModelFp8Recipe recipe;
    int hybrid;         /* output gradients in E5M2 */
    int wt;             /* transposed copies: the backward GEMMs take the TN layout */
    int len;            /* delayed scaling's history length (0: another recipe) */
    ExecFp8Weight *w;   /* [n], by parameter; p NULL where the parameter is not an FP8 GEMM's
                           weight; q NULL under ZeRO-3, which casts per use */
    int n;
    int *of_layer;      /* [layers + mtp_layers][EXEC_FP8_ROLES]: index into w, or -1 */
    ModelFp8Workspace lay;
    uint8_t *ws;        /* ws.fp8 */
    float *amax, *fmax; /* in its scratch: the amax of the tensor being quantized; E4M3's and
                           E5M2's largest values */
    void *act;          /* its act part: a GEMM input before it is quantized */
    void *q0, *q1;      /* its FP8 copies */
    void *wq, *wqt;     /* ZeRO-3: a weight cast for its GEMM, its transpose (NULL otherwise) */
    int params;         /* the FP8 weights are the parameters (--fp8-param-gather below ZeRO-3):
                           fp8gather.c writes them after each update, nothing casts them */
} ExecFp8;

/* The weights whose GEMMs the executor runs in FP8, by role: index into of_layer's rows. */
enum { EXEC_FP8_ROLES = 10 };
int exec_fp8_role_index(ModelTensorRole r); /* 0 .. EXEC_FP8_ROLES - 1, or -1 */

/* Sized for the stage's parameters (exec_params_build first). */
int exec_fp8_init(ExecFp8 *F, const ExecCtx *c, const ExecParams *P, PxError *err);
/* Binds <w>.fp8, <w>.fp8_t, <w>.fp8_amax and ws.fp8 (p NULL in the sizing pass): PX_ERUNTIME
 * when their sizes are not what the executor computes in them (model/ and exec/ disagree). */
int exec_fp8_bind(ExecFp8 *F, const ExecParams *P, const ModelTensor *t, void *p, PxError *err);
/* After binding and the weights' initial values: every FP8 weight has its copies, delayed
 * scaling starts from decode factors of 1, and the copies are cast. */
int exec_fp8_start(ExecFp8 *F, const ExecCtx *c, PxError *err);
/* Casts every FP8 weight's act values into its FP8 copies (after each update). */
void exec_fp8_cast(ExecFp8 *F, const ExecCtx *c);
/* The FP8 weight of (role, layer), or NULL when that weight's GEMMs are not FP8. */
const ExecFp8Weight *exec_fp8_weight(const ExecFp8 *F, ModelTensorRole role, int layer);
/* Group g of w's copy (transposed: its transposed copy, [cols, rows]). */
ExecFp8Ref exec_fp8_weight_ref(const ExecFp8 *F, const ExecFp8Weight *w, int g, int transposed);
/* The bytes after each of w's matrices in ZeRO-3's FP8 gather (fp8gather.c): its fp32 scales
 * (one, or blockwise's a tile), padded to MODEL_FP8_GATHER_SCALE_BYTES. */
uint64_t exec_fp8_gather_room(const ExecFp8 *F, const ExecFp8Weight *w);
/* MXFP8 parameters under ZeRO-3 (fp8gather.c): the layout of w's row-wise copy (1 x 32
 * blocks) or column-wise one (colwise: the weight's shape, 32 x 1 blocks), and the E8M0 scales
 * of the two grids of one of its matrices (<w>.fp8_scales holds groups of them). */
KernFp8 exec_fp8_mx_desc(const ExecFp8 *F, const ExecFp8Weight *w, int colwise);
uint64_t exec_fp8_mx_grids(const ExecFp8 *F, const ExecFp8Weight *w);
/* The layout of an operand (not a weight) of rows x cols; grad: an output gradient (E5M2 in
 * the hybrid format). */
KernFp8 exec_fp8_desc(const ExecFp8 *F, int rows, int cols, int weight, int grad);
/* q (a KernFp8 tensor of rows x cols) from x (act [rows, cols], or [cols, rows] when trans:
 * q is then its transpose) as tensor `which` (EXEC_FP8_X or EXEC_FP8_DY) of group g of w's
 * GEMMs: delayed scaling quantizes with that tensor's decode factor and, with record, rolls
 * the tensor's amax into its history; the other recipes scale each block by its own amax. */
ExecFp8Ref exec_fp8_quantize(ExecFp8 *F, const ExecCtx *c, void *q, const void *x, int rows,
                             int cols, int trans, int which, const ExecFp8Weight *w, int g,
                             int record);
/* FP8 attention's tensors (--fp8-attention): Q, K and V (one scale), the output gradient, the
 * fused core's output (delayed scaling: model_fp8_attn_out), the Q, K, V gradients where they
 * travel in FP8 (model_fp8_attn_dqkv: context parallelism's ring and Ulysses, cp.c). */
enum { EXEC_FP8_CORE_QKV = 0, EXEC_FP8_CORE_DO = 1, EXEC_FP8_CORE_O = 2, EXEC_FP8_CORE_DQKV = 3 };
/* q (a KernFp8 tensor of rows x cols) from x (act [rows, cols]) as FP8 attention's tensor
 * `which` (EXEC_FP8_CORE_*) of the layer whose QKV weight (multi-head latent attention's kv_b:
 * model_fp8_attn_weight) is fq: delayed scaling quantizes with that tensor's decode factor,
 * column 3 + which of fq's history (model_fp8_attn_history), and with rec rolls its amax into
 * that history; tensorwise scales by the tensor's own amax. */
ExecFp8Ref exec_fp8_core_quantize(ExecFp8 *F, const ExecCtx *c, void *q, const void *x, int rows,
                                  int cols, int which, const ExecFp8Weight *fq, int rec);
/* MXFP8 attention's two copies of rows x cols act values x (each sequence's rows a whole
 * number of 32-row blocks) for a core that quantizes after an exchange (the ring's blocks with
 * cp: cp.c): the column-wise copy (32 x 1 blocks) and the row-wise one (1 x 32) quantized one
 * at a time through F->q0, decoded into col and row. */
void exec_fp8_mx_copies(ExecFp8 *F, const ExecCtx *c, void *row, void *col, const void *x,
                        int rows, int cols, int grad);
/* The same into saved (the row-wise copy's codes and scales, then the column-wise one's, as a
 * saved attn.qkv.out holds them: Ulysses' head split), or with x NULL the saved copies decoded
 * only. */
void exec_fp8_mx_saved(ExecFp8 *F, const ExecCtx *c, void *saved, void *row, void *col,
                       const void *x, int rows, int cols);
/* A saved FP8 input of rows x cols (its layout as exec_fp8_quantize made it). */
ExecFp8Ref exec_fp8_saved(const ExecFp8 *F, const void *q, int rows, int cols);
/* The kernels' FP8 GEMM (kernels.h's matmul_fp8, alpha 1), its FLOPs counted as an act
 * GEMM's: 2*m*n*k. */
void exec_fp8_mm(const ExecCtx *c, ExecMeter *M, void *out, PxDtype ct, ExecFp8Ref a,
                 ExecFp8Ref b, int m, int n, int k, int ta, int tb, float beta);
/* A linear layer y[N,O] = x W^T on FP8: y (act) from the quantized input and group g of w's
 * copy (under ZeRO-3 the gathered weight cast now; rec: a forward, whose cast delayed scaling
 * records). */
void exec_fp8_linear_fwd(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *y, ExecFp8Ref x,
                         const ExecFp8Weight *w, int g, int N, int rec);
/* Rows [row0, row0 + rows) of w's copy (its one matrix) as a GEMM operand of their own, copied
 * into ws.fp8's second copy with the scales of the blocks from row0's on (ZeRO-3: from the
 * weight cast now, recording nothing): op-level recompute's rerun of one matmul of a packed
 * weight (wk of QKV, w3 of SwiGLU's fc1; layers.c's sac_recompute). Under a per-tensor recipe
 * or 1 x 32 blocks they are those rows' values, and under 128 x 128 blocks when row0 starts a
 * block or the rows end in row0's; else the rows past that block read the scales of the blocks
 * before theirs: only a GEMM whose output nothing reads may take them (the rerun's, whose
 * outputs the saved tensors already hold). */
ExecFp8Ref exec_fp8_weight_rows(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, int row0,
                                int rows);
/* Its backward: dx[N,K] (act, overwritten) = dy W and dw[O,K] (the gradient dtype, c->grad)
 * += dy^T x, with dy (act [N,O]) quantized as an output gradient into ws.fp8's first copy. x
 * is the saved FP8 input, or (x.q NULL) x_act [N,K] quantized after the input gradient's GEMM
 * into the copy that leaves free. Where transposed copies are kept every GEMM takes the TN
 * layout: the input gradient reads the weight's transposed copy, the weight gradient dy's
 * column-wise copy. */
void exec_fp8_linear_bwd(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *dx, float *dw,
                         const void *dy, ExecFp8Ref x, const void *x_act, const ExecFp8Weight *w,
                         int g, int N);
/* The same with rec 0: dy quantized with the current factors and recorded nowhere (a
 * capacity's padding rows, which are part of their expert's input: exec/train/moe.c). */
void exec_fp8_linear_bwd_rec(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *dx, float *dw,
                             const void *dy, ExecFp8Ref x, const void *x_act,
                             const ExecFp8Weight *w, int g, int N, int rec);
/* Its two halves, for a caller that works between them (the shared experts' gate: layers.c):
 * the input gradient's GEMM, dy quantized into ws.fp8 (and its column-wise copy where
 * transposed copies are kept), which *dyq keeps; then the weight gradient's from *dyq, x or
 * x_act as above. Nothing may write ws.fp8's q0 and q1 in between. */
typedef struct {
    ExecFp8Ref row, col; /* dy's copy, and its column-wise one (col.q NULL without) */
} ExecFp8Dy;
void exec_fp8_linear_dgrad(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, void *dx, const void *dy,
                           const ExecFp8Weight *w, int g, int N, int rec, ExecFp8Dy *dyq);
void exec_fp8_linear_wgrad(ExecFp8 *F, const ExecCtx *c, ExecMeter *M, float *dw,
                           const ExecFp8Dy *dyq, ExecFp8Ref x, const void *x_act,
                           const ExecFp8Weight *w, int g, int N);
/* --fp8-dispatch under delayed scaling: rows x cols act rows x quantized into q (one
 * per-tensor KernFp8 tensor) with the dispatched rows' decode factor, w's last history column
 * (w: this MoE layer's experts' fc1); rec rolls their amax into that history (a forward's, not
 * a recompute's). No rows: a zero scale, and rec records an amax of 0. */
void exec_fp8_dispatch_quantize(ExecFp8 *F, const ExecCtx *c, const ExecFp8Weight *w, void *q,
                                const void *x, int rows, int cols, int rec);
void exec_fp8_free(ExecFp8 *F);

/* ---- layers.c: one chunk's passes of one micro-batch, op by op ---- */

/* Workspace views the layers compute in (the table's ws.* tensors and sp.gather). */
typedef struct ExecWork {
    void *out, *dx_a, *dx_b, *dhid, *dqkv, *dffn, *dact, *dscores, *sp_gather;
    void *exp_dffn, *exp_dx, *ep_send, *ep_recv; /* a MoE layer's (ep.* only when ep > 1) */
    void *ep_gather;                             /* the all-gather dispatcher's (ep.*) */
    float *ep_probs, *ep_dw;
    uint8_t *ep_map;
    void *cp_kv, *cp_kv_full, *cp_dkv;           /* context parallelism's all-gather */
    void *cp_send, *cp_recv;                     /* and its all-to-all */
    int64_t *cp_cnt; /* its counts, one a rank of the cp group (host memory, sized at init) */
    void *cp_out_part, *cp_dkv_part;             /* and its ring, with cp_kv */
    float *cp_lse_part;
    void *mla;                                   /* multi-head latent attention's (mla.c) */
    float *flash_d, *xent;
    float *host_loss; /* the micro-batch's per-token losses, read back (b * s floats) */
} ExecWork;

/* Binds a workspace or sp.gather tensor (by role) to p; PX_ERUNTIME naming an unknown one. */
int exec_work_bind(ExecWork *W, const ExecCtx *c, const ModelTensor *t, void *p, PxError *err);

/* The state of the step the passes run in (schedule.c's): its index, the global index of this
 * rank's first sequence, the summed token losses of this rank's share, the loss scale. */
typedef struct {
    int step;
    long long seq_base;
    double loss_sum;
    double mtp_loss_sum; /* the prediction modules' (mtp.c): each module's token losses over its
                            targets' count, times s / mtp_layers, so that over global_batch x s
                            it is the modules' mean loss */
    double loss_scale;
} ExecPass;

struct ExecPipe;
struct ExecZero;

/* What a pass runs with: the parts it reads and the ones it drives. */
typedef struct {
    const ExecCtx *c;
    ExecParams *P;
    ExecWork *W;
    ExecMeter *M;
    struct ExecPipe *pipe;
    struct ExecZero *Z;
    ExecPass *pass;
    struct ExecMoe *moe;
    ExecFp8 *fp8;
} ExecLayerRun;

/* The global index of sequence q of micro-batch mb: the same on every tp and cp rank that
 * holds a part of it. */
static inline long long exec_seq_index(const ExecLayerRun *r, int mb, int q)
{
    return r->pass->seq_base + (long long)mb * r->c->d.b + q;
}

/* The dropout stream of one (step, sequence, layer, site): counter-based, so a recompute, any
 * micro-batch size, any data-parallel split and any rank holding a part of the sequence (tp,
 * SP, cp) draw the same mask for the same element. */
static inline uint64_t exec_drop_seed(const ExecLayerRun *r, long long seq, int layer, int site)
{
    uint64_t z = px_mix64(r->c->spec.job.seed ^ 0x64726f70ull);
    z = px_mix64(z ^ (uint64_t)r->pass->step);
    z = px_mix64(z ^ (uint64_t)seq);
    z = px_mix64(z ^ (uint64_t)(layer + 1));
    return px_mix64(z ^ (uint64_t)site);
}

int exec_layers_forward(const ExecLayerRun *r, int chunk, int mb, ExecLayerActs *A,
                        ExecHeadActs *x, const int32_t *tokens, PxError *err);
int exec_layers_backward(const ExecLayerRun *r, int chunk, int mb, ExecLayerActs *A,
                         const ExecHeadActs *x, const int32_t *tokens, int last_mb, PxError *err);
/* One layer's forward (output to out) and backward (dres: its output's gradient in, its input's
 * out), for the prediction modules' layers (mtp.c). */
int exec_layers_one_fwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *out,
                        int mb, PxError *err);
int exec_layers_one_bwd(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a, void *dres,
                        int mb, PxError *err);

/* An output layer's weight gradient, within its backward op: g_out_w += probs^T in (probs: the
 * logits' gradient in the act dtype; in gathered over the sequence under SP, the gather under
 * the op's layer l, -1 for the main one). */
int exec_layers_logits_wgrad(const ExecLayerRun *r, int chunk, int l, const void *in,
                             const void *probs, PxError *err);
/* The logits' gradient (fp32, in place) narrowed to the act dtype for the output layer's GEMMs. */
const void *exec_layers_dlogits_act(const ExecLayerRun *r, float *probs, size_t n);

/* ---- mtp.c: multi-token prediction modules (DeepSeek-V3 sec. 2.2) ---- */

/* The modules of the last chunk after the main loss: each one's norms, eh projection, layer,
 * final norm, the shared output layer and its loss over the tokens k + 1 ahead (A: the chunk's
 * layer sets, the modules' after its layers). */
int exec_mtp_forward(const ExecLayerRun *r, int chunk, int mb, ExecLayerActs *A, ExecHeadActs *x,
                     const int32_t *tok, PxError *err);
/* Their backward, last module first, before the main loss's: leaves the main hidden state's
 * gradient from the modules in x->mtp_out[0] (spent by then), where the main loss's backward
 * (layers.c) adds it. The schedule runs both around exec_layers_forward and _backward. */
int exec_mtp_backward(const ExecLayerRun *r, int chunk, int mb, ExecLayerActs *A,
                      const ExecHeadActs *x, const int32_t *tok, PxError *err);
/* Where a module's extra tensor (mtp.N.*) of the table lives in x: NULL when t is not one, or
 * names a module past EXEC_MTP_MAX. */
void **exec_mtp_extra_slot(ExecHeadActs *x, const ModelTensor *t);

/* ---- mtp_tokens.c: the tokens the prediction modules read ---- */

/* A run of tokens: n of them at tok, for the positions from `at` of a part on. */
typedef struct {
    const int32_t *tok;
    int at, n;
} ExecMtpTokRun;
/* The tokens past each of a sequence's parts that the modules read under context parallelism
 * (D = mtp_layers when cp > 1, else 0: one row holds the whole sequence), the ints they take
 * for `rows` sequences (after the step's rows in data.batch), and their pick from the loader's
 * whole rows (s + 1 tokens each) into dst. */
int exec_mtp_lookahead(const ExecCtx *c);
size_t exec_mtp_lookahead_ints(const ExecCtx *c, int rows);
void exec_mtp_pick_lookahead(const ExecCtx *c, int32_t *dst, const int32_t *src, int rows);
/* Tokens i0 .. i0 + n - 1 of sequence q's part j in micro-batch mb (counted from the token at
 * the part's first position) as at most two runs (the count returned): the part's own row and,
 * under context parallelism, its lookahead after the step's rows. */
int exec_mtp_tok_runs(const ExecLayerRun *r, const int32_t *tok, int mb, int q, int j, int i0,
                      int n, ExecMtpTokRun run[2]);
/* Part j's positions p with p + ahead < s among its own: for ahead k - 1 those with a token k
 * on (module k embeds it), for ahead k those with a target. */
int exec_mtp_part_count(const ExecCtx *c, int j, int ahead);
/* Module k's shifted tokens' embedding into out [b*s/cp, h] (rows past the sequence's last
 * token zero), and its backward from dy into this rank's vocabulary shard's rows. */
void exec_mtp_embed_shifted(const ExecLayerRun *r, void *out, const int32_t *tok, int mb, int k);
void exec_mtp_embed_shifted_bwd(const ExecLayerRun *r, const void *dy, const int32_t *tok, int mb,
                                int k);
/* ZeRO-2/3 sum each block's gradients through one bucket as soon as the block's backward is over
 * (zero.c), so a block's gradients of a micro-batch must all be computed in that window. The
 * modules add to two blocks whose windows come later in the main backward: the output layer's
 * weight (their heads) and the embedding's rows (their enorm inputs). Under ZeRO-2/3 without a
 * pipeline those wait (exec_mtp_deferred): each head's logits gradient stays in mtp.N.loss.probs and its input in
 * mtp.N.logits.in (layers.c's head_bwd or, tied, embed_bwd adds them), and each enorm input's
 * gradient is kept in its module's spent mtp.eh.in (b x s/cp x h; under SP this rank's
 * b x s/(cp tp) rows of h, gathered over the sequence in the embedding's window: either fits
 * eh.in's rows of 2h), looked up into the embedding's gradient by exec_mtp_deferred_embed in the
 * embedding's window (A: the chunk's layer sets). */
int exec_mtp_deferred(const ExecCtx *c);
/* Whether the prediction modules gather the embedding and the output layer again for each read
 * (ZeRO-3 without the forward's gathers kept: mtp_tokens.c); and how many of the embedding's
 * (embed) or the final block's backward gathers of a micro-batch they make before the main
 * model's, the occurrence of the main model's first. */
int exec_mtp_regathers(const ExecCtx *c);
int exec_mtp_gathers_bwd(const ExecCtx *c, int embed);
int exec_mtp_deferred_embed(const ExecLayerRun *r, int chunk, int mb, const ExecLayerActs *A,
                            const int32_t *tok, PxError *err);

/* ---- tp.c: tensor and sequence parallelism (Megatron-LM) ----
 *
 * Each collective is timed under its op of the graph (role, layer: -1 outside the layers,
 * chunk, phase), opened within the layer's op that the caller has open. */

/* Sequence parallelism runs: the layout asks for it and TP shards the layer. */
static inline int exec_sp_on(const ExecCtx *c) { return c->spec.layout.sp && c->d.t > 1; }
/* MoE layers dispatch by Megatron-Core's all-gather dispatcher (moe.c, docs/moe.md) */
static inline int exec_moe_allgather(const ExecCtx *c)
{
    return c->d.moe && c->spec.job.moe_dispatcher == MODEL_MOE_DISPATCH_ALLGATHER;
}

/* ---- mla.c: multi-head latent attention's projections ---- */

/* Whether the model's attention is multi-head latent attention. */
static inline int exec_mla_on(const ExecCtx *c) { return c->spec.model.mla.kv_lora_rank > 0; }
/* Layer l's queries, keys and values into attn.qkv.out from its attn.qkv.in, under the ops
 * q_a, kv_a, q_b and kv_b (the rotary parts rotated), or their backward from ws.dqkv: the
 * input gradient of the sequence shard lands in *dn (ws.dhid). */
int exec_mla_forward(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                     ModelPhase ph, PxError *err);
int exec_mla_backward(const ExecLayerRun *r, int chunk, int l, const ExecLayerActs *a,
                      const void **dn, PxError *err);
/* Op-level selective recompute of layer l's projections (layers.c's sac_recompute, after its
 * first norm): the matmuls model_sac_op_matmuls reruns, into scratch, and the latents' norms
 * and the rotary embedding, no collective. */
void exec_mla_sac_recompute(const ExecLayerRun *r, int l, const ExecLayerActs *a);
/* Sequence q's queries, keys and values in attn.qkv.out's (or ws.dqkv's) layout: packed rows
 * [Q | K | V], or with MLA three planes [N, heads x qk] [N, heads x qk] [N, heads x v]
 * (mla.c); strides in elements. */
typedef struct {
    void *q, *k, *v;
    int q_stride, k_stride, v_stride;
} ExecQkv;
static inline ExecQkv exec_qkv_at(const ExecCtx *c, void *base, int q)
{
    const ModelDims *d = &c->d;
    const size_t es = c->ab, row0 = (size_t)q * d->s_loc;
    ExecQkv x;
    if (!exec_mla_on(c)) {
        const int w = d->q_loc + d->kv2_loc;
        x.q = EXEC_AT(base, row0 * w, es);
        x.k = EXEC_AT(x.q, d->q_loc, es);
        x.v = EXEC_AT(x.k, d->kv_width_loc, es);
        x.q_stride = x.k_stride = x.v_stride = w;
        return x;
    }
    const size_t N = (size_t)d->b * d->s_loc, qk = (size_t)d->heads_loc * d->qk_hd;
    x.q = EXEC_AT(base, row0 * qk, es);
    x.k = EXEC_AT(base, N * qk + row0 * qk, es);
    x.v = EXEC_AT(base, 2 * N * qk + row0 * (size_t)d->heads_loc * d->v_hd, es);
    x.q_stride = x.k_stride = (int)qk;
    x.v_stride = d->heads_loc * d->v_hd;
    return x;
}

/* In-place sum of n act elements over TP (nothing without TP). */
int exec_tp_allreduce(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                      ModelPhase ph, void *buf, size_t n, PxError *err);
/* The same on fp32 values, summed or their maximum taken (the vocabulary-parallel loss). */
int exec_tp_allreduce_f32(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                          ModelPhase ph, float *buf, size_t n, CommRedOp how, PxError *err);
/* out[t * n] = every TP rank's n elements of in */
int exec_tp_all_gather(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                       ModelPhase ph, void *out, const void *in, size_t n, PxError *err);
/* out[n] = this rank's n of the sum of in[t * n] */
int exec_tp_reduce_scatter(const ExecLayerRun *r, ModelOpRole role, int layer, int chunk,
                           ModelPhase ph, void *out, const void *in, size_t n, PxError *err);
/* The input of a column-parallel layer (QKV, fc1) from x, this rank's region of it (act): with
 * SP all-gathered into sp.gather (*xin; x itself without SP). Under FP8 (w) the layer's saved
 * input `saved` (when it is not x itself) is the region quantized, and the GEMM's input is the
 * whole input quantized (*xq: the saved copy, or ws.fp8's first copy); a forward records its
 * amax once. */
int exec_tp_column_input(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, ModelPhase ph,
                         const ExecFp8Weight *w, void *saved, const void *x, const void **xin,
                         ExecFp8Ref *xq, PxError *err);
/* The input a column-parallel layer's weight gradient reads, from its saved input (an FP8 copy
 * of this rank's region when in_fp8): the saved FP8 copy itself (*xq) or an act input
 * (*x_act), which SP all-gathers into sp.gather (an FP8 copy dequantized into ws.fp8 first). */
int exec_tp_column_bwd_input(const ExecLayerRun *r, int chunk, int l, ModelOpRole role,
                             const void *saved, int in_fp8, const void **x_act, ExecFp8Ref *xq,
                             PxError *err);
/* The g operator of a row-parallel layer (attention projection, fc2): ws.out holds this rank's
 * partial product over the full sequence; summed over TP in place (*y = ws.out), or with SP
 * reduce-scattered into `region`, this rank's rows (*y = region). */
int exec_tp_row_reduce(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, ModelPhase ph,
                       void *region, void **y, PxError *err);
/* The output gradient of a row-parallel layer over the full sequence from this rank's region
 * of it (dres): with SP all-gathered into sp.gather, else dres itself. */
int exec_tp_row_dy(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, const void *dres,
                   const void **dy, PxError *err);
/* The f operator: the input gradient of a column-parallel layer in ws.dhid is partial; summed
 * over TP in place, or with SP reduce-scattered into ws.dx_a's region. *dn gets where it is. */
int exec_tp_column_dx(const ExecLayerRun *r, int chunk, int l, ModelOpRole role, const void **dn,
                      PxError *err);

/* ---- cp.c: context parallelism ----
 *
 * The split (Megatron-LM's load balancing): a sequence is cut into 2 cp chunks of
 * exec_cp_part_len tokens and cp rank i holds chunks i and 2 cp - 1 - i, its parts 0 and 1
 * (cp 1: one part, the sequence). A sequence's row in data.batch holds each part's tokens and
 * the token after its last (exec_cp_tok_row ints; part j's at j x (part length + 1)). */
int exec_cp_parts(const ExecCtx *c);
int exec_cp_part_len(const ExecCtx *c);
/* the global position of part j's first token on cp rank `cp_rank` */
int exec_cp_part_pos(const ExecCtx *c, int cp_rank, int j);
int exec_cp_tok_row(const ExecCtx *c);
/* This rank's parts of `rows` whole sequences (s + 1 tokens each, from src) into dst's rows. */
void exec_cp_pick_rows(const ExecCtx *c, int32_t *dst, const int32_t *src, int rows);
/* Part j's queries see keys 0 .. its last position: *tk of them, the first at *q_offset. */
void exec_cp_part_keys(const ExecCtx *c, int j, int *q_offset, int *tk);
/* The attention core talks to the other cp ranks itself (p2p, a2a): exec_cp_attention_* runs
 * it. Otherwise (cp 1, allgather) the layers' core runs, over cp.kv_full's keys with cp > 1. */
int exec_cp_owns_core(const ExecCtx *c);
/* Ulysses under delayed FP8 attention (model_fp8_attn_out with a2a): the core's output is
 * quantized in the head split, saved there and moved back in its codes by cp.c, not by the
 * layers' core after it. */
int exec_cp_quantizes_out(const ExecCtx *c);
/* Where FP8 attention's fused core writes its output under delayed scaling
 * (model_fp8_attn_out; layers.c): ws.fp8's act part after Q, K and V, decoded there from its
 * FP8 copy for the projection and the core's backward; NULL otherwise. */
void *exec_fp8_core_out(const ExecLayerRun *r);
/* allgather: K and V of every cp rank into cp.kv_full in global token order (before the core's
 * forward, and again before its backward); and back, the K, V gradient of the full sequence
 * (cp.dkv) reduce-scattered to its owners, this rank's into the K, V columns of ws.dqkv. Within
 * the core's op, each collective under its own. */
int exec_cp_gather_kv(const ExecLayerRun *r, const ExecLayerActs *a, int l, int chunk,
                      ModelPhase ph, PxError *err);
int exec_cp_scatter_dkv(const ExecLayerRun *r, int l, int chunk, PxError *err);
/* The core of p2p (the ring: the fused core) and a2a (Ulysses: the unfused one), within the
 * core's op, each message or collective under its own. Forward: out (attn.proj.in) and the
 * saved softmax or log-sum-exp; a2a with `comm` moves Q, K, V to the head split first and the
 * output back after (the forward's, a full recompute's), without (selective recompute) it
 * scores the head split attn.qkv.out already holds. Backward: ws.dhid's output gradient into
 * ws.dqkv. */
int exec_cp_attention_fwd(const ExecLayerRun *r, const ExecLayerActs *a, void *out, int mb,
                          int l, int chunk, ModelPhase ph, int comm, PxError *err);
int exec_cp_attention_bwd(const ExecLayerRun *r, const ExecLayerActs *a, int l, int chunk,
                          PxError *err);

/* ---- moe.c: a MoE layer's routed experts (router, dispatch, experts, combine) ---- */

/* One MoE layer's views for one micro-batch, bound by role: parameters (act) and their fp32
 * gradients, the saved activations (model_moe_acts), the all-to-all buffers and scratch. With
 * ep 1 there are no all-to-all buffers (ep_send, ep_recv NULL): the rows stay in place. */
typedef struct {
    const void *router_w, *fc1_w, *fc2_w; /* [E,h]; [L,eff_out,h]; [L,h,eff] */
    float *g_router_w, *g_fc1_w, *g_fc2_w;
    float *probs;  /* [tokens,E] fp32: the router's scores (its logits first) */
    int32_t *idx;  /* [tokens,topk] */
    float *w;      /* [tokens,topk] */
    void *exp_in, *exp_act_in, *exp_fc2_in; /* [routed,h], [routed,eff_out], [routed,eff] */
    void *exp_out;                          /* [tokens*topk,h] */
    void *ep_send, *ep_recv;                /* [tokens*topk,h], [routed,h] (ep > 1) */
    /* the all-gather dispatcher (NULL with the all-to-all's; n = etp x ep ranks): the saved
     * routing of the n tokens gathered to this rank's experts [n tokens,topk] (idx_g, w_g),
     * and the buffers ep.gather [n tokens,h], ep.probs, ep.map [n tokens,E], ep.dw [n tokens,
     * topk]; exp_out then holds the experts' outputs, [routed,h] */
    int32_t *idx_g;
    float *w_g;
    void *ag_x;
    float *ag_probs, *ag_dw;
    uint8_t *ag_map;
    void *ws_dx;                            /* [routed,h] */
    float *dlogits, *dw;                    /* [tokens,E], [tokens,topk] scratch */
    void *dlogits_act; /* [tokens,E] act: dlogits narrowed for the GEMMs (dlogits on fp32) */
    float *counts_f, *aux_dev;              /* [E], [1] */
    int32_t *counts_i;                      /* [E] */
    /* FP8 GEMMs (fp8.c): the experts' weights' FP8 copies (NULL without FP8); exp_in and
     * exp_fc2_in then hold one FP8 tensor per local expert, expert after expert, and the rows
     * pass through ws.fp8's act part on their way in */
    const ExecFp8Weight *f1, *f2;
    /* GPT-OSS's biases (NULL without): the router's [E], the experts' fc1 [L,eff_out] (its
     * etp slice) and fc2 [L,h] (whole on every etp rank, added by etp rank 0 before the
     * reduce-scatter), and their fp32 gradients */
    const void *router_b, *fc1_b, *fc2_b;
    float *g_router_b, *g_fc1_b, *g_fc2_b;
} ExecMoeViews;

/* The host side of the exchanges (sized at init) and the per-expert token counts of a step. */
typedef struct ExecMoe {
    int E, ep, L, layers, m;
    int etp, etp_rank; /* expert tensor parallelism: each local expert's width over etp ranks */
    int *index;    /* [model layers]: a MoE layer's place among the model's MoE layers, or -1 */
    int64_t *cnt;  /* [E] this rank's copies routed to each expert */
    float *cntf;   /* [E] the same as the device counts them */
    /* [ep], [ep], [etp*ep*L], [max(ep, etp)] twice: blk[(i * ep + j) * L + l] the rows source j
     * sends local expert l of etp rank i (this rank's own at i = etp_rank) */
    int64_t *send, *recv, *blk, *one_s, *one_r;
    int64_t pad; /* etp > 1: the rows each etp rank's part of the gathered buffer holds (the
                    largest part, at least the plan's routed / etp) */
    int64_t rows_real; /* etp > 1: the rows the etp group received, unpadded */
    double *tokens_per_expert; /* [layers][E]: copies this rank routed this step */
    float *gcount; /* [layers][m][E]: the micro-batch's counts over its whole sequence (SP:
                      summed over TP), kept from the forward for the aux loss's backward */
    double aux_sum; /* this rank's share of the step's load-balancing loss */
    /* Dropless routing (docs/moe.md, "Dropless routing"): the plan sizes the experts' rows for
     * d.routed (training.moe_imbalance); a micro-batch whose routing sends this rank's experts
     * more gets grown buffers of its own, allocated when first needed and kept (no copy is
     * dropped), counted in extra[] beside the arenas. */
    void **spill;        /* [layers][m]: the saved rows (exp_in, exp_act_in, exp_fc2_in) of a
                            (layer, micro-batch) past the plan, one allocation; NULL: fits */
    int64_t *spill_rows; /* [layers][m]: the rows each spill holds */
    void *ep_recv, *ws_dx; /* the shared scratch grown past the plan ([scratch_rows,h] each) */
    int64_t scratch_rows;
    int64_t *rows_max;     /* [layers]: the most rows this rank's experts took in a micro-batch */
    uint64_t *layer_extra; /* [layers]: bytes the layer's spills hold */
    uint64_t extra[MODEL_CAT_COUNT]; /* bytes held beyond the arenas, by category */
    int steps_begun;       /* exec_moe_step_begin's calls: the growth log's step */
    struct ExecMoeGrowth {
        int layer, step; /* MoE layer index, 1-based count of steps begun */
        uint64_t bytes;  /* the bytes it grew by */
    } *growth;
    int n_growth, cap_growth;
    const KernBackend *k; /* what the grown buffers were allocated with */
    /* A capacity factor (moe.capacity_factor > 0; docs/moe.md, "Token dropping"): each expert
     * takes at most `capacity` of a rank's copies per micro-batch, the rest dropped; an expert
     * rank's rows are padded to d.routed = ep x L x capacity. */
    int capacity;      /* 0: dropless */
    int64_t *dropped;  /* [steps][layers]: copies this rank dropped in each step's forwards */
    int drop_steps;    /* the steps dropped[] holds */
    /* FP8 experts: the bytes of the saved inputs' tensors (moe.experts.fc1.in, .fc2.in), which
     * every segment's FP8 tensor must fit in together (moe.c's fp8_fits) */
    uint64_t fp8_in_bytes, fp8_hid_bytes;
} ExecMoe;

int exec_moe_init(ExecMoe *M, const ExecCtx *c, PxError *err);
void exec_moe_free(ExecMoe *M);
void exec_moe_step_begin(ExecMoe *M);
/* The busiest expert's copies over the mean, for the MoE layer index i (0 before any). */
double exec_moe_imbalance(const ExecMoe *M, int layer_index);
/* y[tokens,h] = the routed experts' weighted sum for x[tokens,h] (the normed input); the
 * micro-batch's load-balancing loss times loss_weight is added to M->aux_sum. phase
 * MODEL_RECOMPUTE (full recompute, in backward) re-creates the same tensors with the same
 * communication under the recompute's ops, and counts neither tokens nor loss again. first_seq: the
 * global index of the micro-batch's first sequence (forced balance); mb its index in the step.
 * Timed under the layer's ops (r's meter). PX_ERUNTIME when the routed rows exceed the plan's
 * buffers. */
int exec_moe_forward(ExecMoe *M, const ExecLayerRun *r, int chunk, int layer, ModelPhase phase,
                     const ExecMoeViews *v, void *y, const void *x, long long first_seq, int mb,
                     double loss_weight, PxError *err);
/* dx[tokens,h] (overwritten; may be v->exp_in, spent by then) from dy; the experts' and
 * router's gradients accumulated. The saved expert activations are spent. */
int exec_moe_backward(ExecMoe *M, const ExecLayerRun *r, int chunk, int layer,
                      const ExecMoeViews *v, void *dx, const void *dy, const void *x,
                      long long first_seq, int mb, double loss_weight, PxError *err);

/* ---- pipeline.c: the pipeline's transfers ---- */

typedef struct ExecPipe {
    void *send, *recv;   /* pp.send and pp.recv */
    uint64_t elems;
    uint64_t part;       /* one activation's elements: a transfer carries one, or past a stage of
                            the prediction modules' own 1 + mtp_layers (pipeline.c) */
    int send_req, recv_req; /* the pending send, the posted receive */
    ModelAction *recvs;  /* the expected receives of a step, in schedule order */
    int n_recvs, next_recv;
} ExecPipe;

int exec_pipe_init(ExecPipe *pp, int n_actions, PxError *err);
int exec_pipe_bind(ExecPipe *pp, const ModelTensor *t, void *p, PxError *err);
/* Plans the step's receives from the schedule (forward only, or both directions) and posts the
 * first. */
int exec_pipe_start(ExecPipe *pp, const ExecCtx *c, const ModelAction *actions, int n,
                    int backward, PxError *err);
/* Waits for the input of (chunk, mb, direction) and moves it into dst (TP-gathered with
 * Megatron's scatter/gather), then posts the next receive. */
int exec_pipe_take(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb, int backward,
                   void *dst, PxError *err);
/* Sends the output (forward) or input gradient (backward) of (chunk, mb) on. */
int exec_pipe_give(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb, int backward,
                   const void *src, PxError *err);
/* The same for a transfer of n parts (the main hidden states and the prediction modules'
 * outputs past their own stage): into dst[k], from src[k] (a src[k] already at its place in
 * pp.send, this rank's slice under the scatter/gather split, is not copied). A dst[k] at its
 * place in pp.send keeps this rank's slice there under the split, gathered when it is read
 * (exec_pipe_gather_part). */
int exec_pipe_take_parts(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb,
                         int backward, void *const *dst, int n, PxError *err);
int exec_pipe_give_parts(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int mb,
                         int backward, const void *const *src, int n, PxError *err);
/* Part k of the transfer into (chunk, mb, direction) kept at its place in pp.send, into dst
 * (the whole activation): TP-gathered under the scatter/gather split, as more of the
 * transfer's pp.tp_all_gather op, else copied. */
int exec_pipe_gather_part(ExecPipe *pp, const ExecCtx *c, ExecMeter *M, int chunk, int backward,
                          int k, void *dst, PxError *err);
/* The last message has left (pp.send may be written again). */
int exec_pipe_drain(ExecPipe *pp, const ExecCtx *c, PxError *err);
void exec_pipe_free(ExecPipe *pp);

/* ---- zero.c: data-parallel reduction and ZeRO ---- */

enum { EXEC_MAX_RING = 18 };

/* ZeRO-3's FP8 parameter gather (--fp8-param-gather; fp8gather.c, docs/fp8.md): each block's
 * FP8 GEMM weights travel in one byte, quantized by their owners with a per-tensor scale all
 * ranks agree on (the step's amax of the whole weight, all-reduced over the block's ZeRO
 * group: the expert-data-parallel one for the experts' blocks), its other parameters in the
 * act dtype; each slot of the gather is an act part (ring[i], the other parameters packed) and
 * an FP8 part (ring8[i]: each weight's elements, then its scale; an expert weight's matrices
 * one by one, each with its own) in zero.param_gather_fp8. */
typedef struct {
    int on;                   /* ZeRO-3's gathers */
    int after;                /* below ZeRO-3: the updated weights quantized from the fp32
                                 master and gathered after the step (exec_pg_updated) */
    struct ExecFp8 *fp8;
    uint8_t *buf;             /* zero.param_gather_fp8 */
    uint64_t bytes;
    uint64_t slot8;           /* a ring slot's FP8 part: any block's weights with their scales */
    uint8_t *ring8[EXEC_MAX_RING];
    uint8_t **kept8;          /* [blocks], keep_gathered only */
    int *req8;                /* [blocks]: the FP8 part's gather in flight (-1: none) */
    int mx;                   /* MXFP8 (Megatron-FSDP): an amax a 1 x 32 and a 32 x 1 block,
                                 the scales in <w>.fp8_scales, a gather carrying the copies its
                                 pass reads (model_fp8_mx_gather_copies), no scales */
    int mx_most;              /* MXFP8: the most copies one gather carries (a slot's room) */
    int *req8c;               /* [blocks], MXFP8: the second copy's gather in flight */
    int *carried;             /* [blocks], MXFP8: the copies its slot holds (1 row-wise, 2
                                 column-wise, 3 both: row-wise first) */
    int *spread;              /* [blocks]: its FP8 part is laid out for the GEMMs */
    int n_w;                  /* the stage's FP8 matrices' scales (an expert weight's matrix
                                 one a local expert; below ZeRO-3 with blockwise one a tile):
                                 the dense blocks' first, in parameter order */
    int n_dense;              /* of them, the dense blocks' */
    int *w_of;                /* [parameters]: its first matrix's index among them, or -1 */
    float *amax;              /* [n_w] backend memory: the step's amaxes, all-reduced */
    float *scale;             /* [n_w] after them: the decode factors the shards take (NULL
                                 for MXFP8 under ZeRO-3: <w>.fp8_scales) */
    size_t scales_bytes;      /* the two, one allocation */
    uint64_t *off;            /* [parameters of the largest block]: exec_params_point_packed's */
    void *pad;                /* after: where a block's padding lands (group - 1 act elements) */
    size_t pad_bytes;
    float *host;              /* after: [n_w] host memory, the amaxes gathered run by run */
    /* after, with the optimizer offloaded: the master lives on the host, which rounds the
     * updated master to the act dtype into its gradient shards (ExecOptim's host_g: block b's
     * from up_off[b] elements of the gradient dtype, packed in the act dtype); the pieces of the
     * FP8 parameters are copied up from there, where they are cast on the device without it */
    const void *up;
    const uint64_t *up_off;
} ExecFp8Gather;

typedef struct ExecZero {
    float *bucket;           /* zero.grad_bucket (ZeRO 2/3 without a pipeline) */
    uint64_t bucket_elems;
    void *gather[2];         /* zero.param_gather's two halves (ZeRO 3) */
    uint64_t gather_elems;   /* zero.param_gather's elements, both halves */
    /* ZeRO-3's gathers (docs/executor.md, "Sharded data parallelism"): a ring of n_ring slots
     * of the largest padded block, filled in the order the gathers are issued, or with
     * keep_gathered a buffer per block (kept[b]), all carved from zero.param_gather, which the
     * memory table sizes for them (model/tensors.c); the staging of bucketed calls in `extra`.
     * ahead: layers gathered ahead of the compute (0: none). */
    void *ring[EXEC_MAX_RING];
    int n_ring, ring_next, ahead;
    void **kept;             /* [blocks], keep_gathered or ZeRO-3 under a pipeline only */
    void **slot_of;          /* [blocks]: the buffer the block's last gather filled */
    int *gather_req;         /* [blocks]: a prefetched gather in flight (-1: none) */
    int *gather_op;          /* [blocks]: its op */
    int *gather_phase;       /* [blocks]: the phase it was issued for + 1, negated once used
                                (0: never gathered) */
    void *stage;             /* bucketed calls' staging: one call's send and receive sides */
    void *extra;             /* what the three above take beside the arenas (the memory table
                                sizes zero.param_gather's two halves only) */
    uint64_t extra_bytes;
    long prefetched;         /* gathers issued ahead of their layer, over the run */
    int *req, *reduced, *op; /* [blocks]: the pending reduction, started this step, its op */
    float *scratch;          /* SP's packed replicated gradients of a MoE layer (ws.exp_dffn,
                                free at the reduction), or NULL */
    uint64_t scratch_elems;
    ExecFp8Gather pg;        /* --fp8-param-gather (fp8gather.c) */
} ExecZero;

/* Gradients go through zero.grad_bucket, reduce-scattered every micro-batch: ZeRO-2/3 without a
 * pipeline. Under one (ModelDims.zero_per_step) they accumulate unsharded over the stage's
 * micro-batches and are reduce-scattered once a step, as ZeRO-1's (docs/executor.md). */
static inline int exec_zero_bucketed(const ExecCtx *c)
{
    return c->spec.layout.zero >= 2 && !c->d.zero_per_step;
}

/* ZeRO-3 with full recompute without --fsdp (DeepSpeed's): a layer is gathered for its
 * recomputed forward and again for its backward (docs/time.md's contract); none with
 * keep_gathered, whose forward's parameters serve both. */
static inline int exec_zero_twice_gathered(const ExecCtx *c)
{
    const ModelLayout *l = &c->spec.layout;
    return l->zero == 3 && l->recompute == MODEL_RECOMPUTE_FULL && !l->fsdp && !l->keep_gathered;
}

int exec_zero_init(ExecZero *Z, int n_blocks, PxError *err);
/* ZeRO-3's ring, kept buffers and bucket staging, once the blocks and the arenas are known. */
int exec_zero_buffers(ExecZero *Z, const ExecCtx *c, const ExecParams *P, PxError *err);
/* Issues block b's gather for `phase` ahead of its use (non-blocking where the layer can; the
 * wait is exec_zero_gather's); nothing when it is issued already or needs none. */
int exec_zero_prefetch(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                       ModelPhase phase, PxError *err);
int exec_zero_bind(ExecZero *Z, const ExecCtx *c, const ModelTensor *t, void *p, PxError *err);
/* A backward step begins: no block reduced yet. */
void exec_zero_step_begin(ExecZero *Z, int n_blocks);
/* ZeRO-3: gathers block b's parameters for (phase, occurrence) and points its views at them. */
int exec_zero_gather(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                     ModelPhase phase, int occurrence, PxError *err);
/* ZeRO-2/3 without a pipeline: zeroes the bucket before block b's backward; reduce-scatters it
 * after. */
void exec_zero_bucket_clear(ExecZero *Z, const ExecCtx *c, const ExecParams *P, int b);
int exec_zero_bucket_reduce(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                            PxError *err);
/* Block b's gradients are complete for the step: its reduction starts (non-blocking). */
int exec_zero_block_done(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                         PxError *err);
/* The end of the backward: the tied embedding's copies summed, every reduction complete. */
int exec_zero_finish(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err);
/* ZeRO-3 under a pipeline, before the stage's first forward: every block gathered once into
 * its kept buffer, which serves the step's micro-batches (nothing otherwise). */
int exec_zero_gather_step(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M,
                          PxError *err);
/* ZeRO-1/2 after the update: every rank's shard of the weights gathered (but a block holding
 * FP8 parameters: exec_pg_updated). */
int exec_zero_gather_updated(const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err);
void exec_zero_free(ExecZero *Z, const KernBackend *k);

/* ---- fp8gather.c: the FP8 parameter gather (ExecFp8Gather above) ---- */

/* Sets it up when the job gathers FP8 parameters (nothing otherwise): under ZeRO-3 its
 * gathers' FP8 part (on), below it the gather of the updated weights (after). */
int exec_pg_init(ExecFp8Gather *G, struct ExecFp8 *F, const ExecCtx *c, const ExecParams *P,
                 PxError *err);
int exec_pg_bind(ExecFp8Gather *G, const ModelTensor *t, void *p, PxError *err);
/* exec_zero_buffers' ZeRO-3 part under it: the ring's (or kept blocks') two parts. */
int exec_pg_buffers(ExecZero *Z, const ExecCtx *c, const ExecParams *P, PxError *err);
/* The step's scales: every FP8 weight's amax over this rank's shards, all-reduced (max) over
 * the ZeRO group in one call, and the decode factor each shard is quantized with this step. */
int exec_pg_scales(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err);
/* issue_gather's work into act slot dst: the FP8 weights' shards quantized and both parts
 * gathered (non-blocking when async), the views pointed once complete. */
int exec_pg_issue(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, int b,
                  ModelPhase phase, int occurrence, int async, void *dst, PxError *err);
/* After the act part's wait: the FP8 part waited for and laid out, the views pointed. */
int exec_pg_finish(ExecZero *Z, const ExecCtx *c, ExecParams *P, int b, PxError *err);
/* Below ZeRO-3, after the update (and once at the start, M NULL: not metered): every FP8
 * matrix's amax over this rank's master shard all-reduced (max) over its ZeRO group (none
 * without ZeRO), its scale taken, this rank's pieces quantized from the master into the FP8
 * weights and each block holding FP8 parameters gathered: its act parameters and its FP8
 * matrices in place, each scale written after its matrix, the transposed copies made. */
int exec_pg_updated(ExecZero *Z, const ExecCtx *c, ExecParams *P, ExecMeter *M, PxError *err);
void exec_pg_free(ExecFp8Gather *G, const KernBackend *k);

/* ---- data.c: data sources, the loader thread, the batches ---- */

typedef enum { EXEC_DATA_BUILTIN = 0, EXEC_DATA_TEXT, EXEC_DATA_TOKENS } ExecDataKind;

typedef struct {
    ExecDataKind kind;
    char path[256];
    int fd;
    char *text;    /* the built-in text */
    uint64_t ntok; /* tokens available */
} ExecData;

/* Opens and validates a data source (missing file, wrong magic or version, truncation, tokens
 * beyond the vocabulary, fewer tokens than one step's global batch reads): PX_EINPUT naming the
 * file and the problem. An empty path is the built-in text. */
int exec_data_open(ExecData *d, const char *path, int vocab, int global_batch, int seq_len,
                   PxError *err);
/* count tokens from position start into dst. */
int exec_data_read(const ExecData *d, int32_t *dst, uint64_t start, int count, PxError *err);
void exec_data_close(ExecData *d);

/* The batch of a step on this rank, read by a thread while the previous step computes, into
 * host staging buffers (the backend's host_alloc: page-locked on CUDA) from which the main
 * thread copies it to the device (data.batch) on the backend's copy stream; on the CPU the two
 * buffers are data.batch's own halves and nothing is copied. Buffer b holds step
 * `have[b]`; the main thread asks for a step by setting want[] (only for a buffer it is not
 * copying from), the thread fills it. */
typedef struct {
    const ExecData *src;
    int32_t *buf[2];  /* host staging (the CPU: data.batch): [2][m][b][s + 1] */
    int rows, row_len;   /* m*b sequences of s + 1 tokens per step on this rank */
    long long global_batch, first_seq; /* sequences per step; this rank's first of them */
    int seq_len;
    uint64_t key;        /* from the seed: which windows each sequence reads */
    int threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long want[2], have[2];
    int quit, rc;
    PxError err;
} ExecLoader;

int exec_loader_start(ExecLoader *l, int threaded, PxError *err);
/* Waits until buffer step % 2 holds `step` (loading it if nobody asked yet), then asks for
 * step + 1 in the other buffer. */
int exec_loader_get(ExecLoader *l, long step, const int32_t **batch, PxError *err);
/* 1 with *batch when buffer step % 2 already holds `step` (the thread loaded it), without
 * waiting and without asking for more; 0 otherwise. */
int exec_loader_ready(ExecLoader *l, long step, const int32_t **batch);
void exec_loader_stop(ExecLoader *l);
/* First token of sequence g (0-based over the whole run) in the source. */
uint64_t exec_loader_window(const ExecLoader *l, long long g);

typedef struct ExecBatches {
    ExecData data;
    ExecLoader loader;
    int loader_started;
    int32_t *batch[2];     /* data.batch on the device, one per step in flight */
    int32_t *stage_buf[2]; /* the loader's host staging (backend host_alloc) */
    int32_t *pick[2];      /* context parallelism: this rank's chunks of the staged rows */
    long staged;           /* the step whose batch was copied ahead (-1: none) */
} ExecBatches;

int exec_batches_bind(ExecBatches *B, const ModelTensor *t, void *p, PxError *err);
/* Opens the source (the stage reads tokens) before anything is allocated: a bad file fails
 * fast. */
int exec_batches_open(ExecBatches *B, const ExecCtx *c, PxError *err);
/* After binding: the staging buffers and the loader, reading synchronously (exec_run starts
 * the thread). */
int exec_batches_start(ExecBatches *B, const ExecCtx *c, PxError *err);
/* (Re)starts the loader, with the thread or without. */
int exec_batches_restart(ExecBatches *B, int threaded, PxError *err);
void exec_batches_stop(ExecBatches *B);
/* The step's batch on the device (data.batch[step % 2]): copied ahead during the previous step,
 * or now. */
int exec_batches_get(ExecBatches *B, const ExecCtx *c, int step, const int32_t **out,
                     PxError *err);
/* Copies step `next`'s batch to the device ahead of its step when the loader has it. */
void exec_batches_stage_next(ExecBatches *B, const ExecCtx *c, int next);
void exec_batches_free(ExecBatches *B, const ExecCtx *c);

/* ---- schedule.c: the stage's passes in the schedule's order ---- */

typedef struct {
    ModelAction *actions;
    int n;
    int *mb_slot, *mb_xslot; /* [v][m] */
    int *bwd_done; /* [v]: backwards of each chunk done this step */
} ExecSched;

int exec_sched_init(ExecSched *S, const ExecCtx *c, PxError *err);
void exec_sched_free(ExecSched *S);

/* ---- scale.c: fp16 loss scaling, as PyTorch's GradScaler: the loss is multiplied by `scale`
 * before the backward; a step whose gradients hold an Inf or NaN is skipped and the scale
 * halved; after `interval` clean steps in a row it is doubled. ---- */
typedef struct {
    double scale;    /* current loss scale (1: no scaling) */
    int interval;    /* clean steps before the scale doubles */
    int clean;       /* clean steps since the last change */
    int enabled;     /* fp16: dynamic; otherwise scale stays 1 and nothing is skipped */
    long skipped;    /* steps skipped so far */
} ExecScaler;

void exec_scaler_init(ExecScaler *s, int enabled, double initial, int interval);
/* The step's verdict once every rank knows whether any gradient was not finite: 1 when the
 * step must be skipped. Updates the scale either way. */
int exec_scaler_update(ExecScaler *s, int found_inf);

/* ---- optim.c: the update ---- */

typedef struct {
    ExecScaler scaler;
    int opt_steps;     /* updates made (skipped steps do not count: AdamW's t) */
    int stop_agreed;   /* every rank was asked to stop (SIGINT/SIGTERM on any) */
    int diverged_at;   /* the step at which a non-finite loss or gradient stopped the run */
    int collective;    /* the last error was every rank's */
    /* optimizer offload (docs/memory.md, "Offload"): per block, offsets into the host buffers
     * of the gradient shard copied out of the device each step (in the gradient dtype; it then
     * stages the updated weights back in the act dtype) and, without an fp32 master table (fp32
     * weights: the CPU), the fp32 copy of the weight shard the host step updates (else NULL);
     * the seconds spent copying and stepping on the host, summed over the run */
    void *host_g;
    float *host_w;
    uint64_t *host_off, host_elems;
    int host_w_ready;
    double d2h_s, h2d_s, host_step_s;
    long host_steps;
    struct ExecAdam8 *adam8; /* adam-8bit's kernel call being gathered (else NULL) */
} ExecOptim;

/* Optimizer offload's host buffers, sized by the blocks' shards (nothing when the layout does
 * not offload), and adam-8bit's call (its code tables and constants). */
int exec_optim_offload_init(ExecOptim *O, const ExecCtx *c, const ExecParams *P, PxError *err);
void exec_optim_offload_free(ExecOptim *O);
/* The offloaded step's master (host memory) rounded to the act dtype into each block's host
 * gradient shard (to nearest even, as the device's update kernels round), which the step has
 * read: what goes up to the device after the step, and before the first step what FP8
 * parameters below ZeRO-3 are quantized from (exec_pg_updated, G->up). Nothing without a
 * master table (the CPU's fp32 weights: their host copy goes up as it is). */
void exec_optim_offload_round(const ExecOptim *O, const ExecCtx *c, const ExecParams *P);

typedef struct {
    double loss, lr, norm;
    double mtp_loss; /* the prediction modules' mean loss (0 without them) */
    int skipped;
} ExecUpdate;

/* The step's end on every rank alike: one control reduction of (loss, squared gradient norm,
 * stop flag), the loss scaler's verdict, clipping, AdamW or SGD on this rank's shard, ZeRO-1/2's
 * gather of the updated weights (under its own op). Runs within the optimizer's op, which the
 * step opens. nan_loss: this rank's share of the loss is a NaN (tests); stop: this rank was asked
 * to stop. */
int exec_optim_step(ExecOptim *O, const ExecCtx *c, ExecParams *P, ExecMeter *M, int step,
                    double loss_sum, double mtp_loss_sum, int nan_loss, int stop, ExecUpdate *u,
                    PxError *err);
/* The reduced gradient of block offset lo of p's block (where a fault test writes an Inf). */
float *exec_optim_grad_at(const ExecCtx *c, const ExecParams *P, const ExecParam *p, uint64_t lo);

/* ---- faults.c: failures on purpose (docs/executor.md, "Failures") ---- */

typedef struct {
    int fail_step;           /* PARALLAX_TEST_FAIL: this rank fails at this step (-1: never) */
    int hang_step;           /* PARALLAX_TEST_HANG: this rank stalls forever here (-1: never) */
    uint64_t inf_steps;      /* PARALLAX_TEST_INF: bit k: an Inf lands in a gradient at step k */
    uint64_t nan_loss_steps; /* PARALLAX_TEST_NAN_LOSS: bit k: rank 0's loss is a NaN at step k */
    int kill_rank, kill_step; /* --fail-rank, --fail-step (1-based step; 0: none) */
} ExecFaults;

/* From the options and the environment; PX_EINPUT naming a malformed variable or option
 * (and PX_ERUNTIME for PARALLAX_TEST_FAIL=RANK:init on that rank). */
int exec_faults_init(ExecFaults *F, const ExecOptions *o, int rank, int world, PxError *err);
/* At the start of step `step` (0-based): kills or stalls this rank, or fails it. */
int exec_faults_step(const ExecFaults *F, int rank, int step, PxError *err);
int exec_faults_inf(const ExecFaults *F, int rank, int step);
int exec_faults_nan_loss(const ExecFaults *F, int rank, int step);

/* ---- history.c: the run's record ---- */

typedef struct {
    double *loss, *time, *tps, *scale; /* [steps] */
    double *mtp_loss;                  /* [steps]: the prediction modules' (mtp.c) */
    int *skipped;
    int done;       /* steps recorded */
    int first_step; /* the steps before it were run by the run this one resumed */
    int interrupted;
    int collective; /* the run's last error was every rank's (interruption, checkpoint) */
} ExecHistory;

/* SIGINT / SIGTERM arrived (run.c's handler); the ranks agree on it at the end of each step
 * (step.c) */
extern volatile sig_atomic_t exec_stop_flag;

int exec_history_init(ExecHistory *H, int steps, PxError *err);
void exec_history_free(ExecHistory *H);
/* A finished step's figures (nothing beyond `steps`). */
void exec_history_record(ExecHistory *H, int steps, const ExecStepStats *st);
/* The median step time over the timed steps (all but the first when there are several). */
double exec_median_step_s(const Exec *ex);

/* ---- trainer.c: the whole ---- */

struct Exec {
    ExecCtx c;
    ModelPlan plan; /* a copy: its profile and prediction */
    ModelPredicted pred;
    ExecOptions opt;
    char plan_path[256], output[256], metrics[256];
    const char *comm_note; /* why this comm layer (the staged fallback), for the header */
    double init_s;         /* drawing the initial weights, and on how many host threads */
    int init_threads;
    char device_name[96];
    CommLayer *own_comm;   /* the one-rank layer made here, or NULL */

    ModelTensorTable tt;
    ModelTensorTable twin; /* the same stage without ZeRO: every parameter's name and shape */
    ModelOpGraph graph;

    ExecArenas mem;
    ExecParams params;
    ExecActs acts;
    ExecWork work;
    ExecPipe pipe;
    ExecZero zero;
    ExecSched sched;
    ExecOptim optim;
    ExecMeter meter;
    ExecFaults faults;
    ExecBatches batches;
    ExecHistory hist;
    ExecPass pass;
    ExecMoe moe;
    ExecFp8 fp8;
    Ckpt *ckpt;
};

/* schedule.c: the parts a pass runs with */
ExecLayerRun exec_layer_run(Exec *ex);
/* schedule.c: every micro-batch's forward (and backward) in the schedule's order */
int exec_schedule_run(Exec *ex, int step, int backward, PxError *err);
/* report.c: the predicted-against-measured summary (rank 0, after the run) */
void exec_report_summary(Exec *ex, const cJSON *run);
/* report.c: the header lines of a run */
void exec_report_header(const Exec *ex);
/* trainer.c: what a checkpoint holds of this rank */
void exec_ckpt_state(const Exec *ex, CkptState *st);
/* trainer.c: 1 when k has every entry a MoE layer calls (kernels.h's moe_*), 0 when one is
 * NULL: exec_init then refuses a MoE plan on it, naming the backend (PX_EINPUT) */
int exec_backend_has_moe(const KernBackend *k);

#endif
