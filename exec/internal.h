/* Private to exec/: the executor's state shared by its files. */
#ifndef EXEC_INTERNAL_H
#define EXEC_INTERNAL_H

#include <pthread.h>
#include <signal.h>

#include "exec/comm/comm.h"
#include "exec/exec.h"
#include "kernels/kernels.h"

/* ---- arenas ---- */

/* One allocation per memory category, carved by the tensor table. The executor binds twice:
 * a sizing pass (base NULL: only offsets advance, as ggml's no_alloc) and the real one. Any
 * alignment padding counts as used, so a measured figure that equals the table's sum proves
 * nothing was wasted. */
typedef struct {
    uint8_t *base;
    uint64_t cap;  /* bytes allocated */
    uint64_t used; /* bytes carved */
} ExecArena;

/* NULL in the sizing pass; PX_ERUNTIME-worthy overflow is reported by exec_arena_check. */
void *exec_arena_carve(ExecArena *a, uint64_t bytes, size_t align);

/* Element i of a tensor whose elements take es bytes: the act-dtype tensors (weights,
 * activations, their gradients) are void * and indexed with the backend's act size. */
#define EXEC_AT(p, i, es) ((void *)((char *)(p) + (size_t)(i) * (size_t)(es)))

/* ---- tensors the kernels read and write ----
 * Dtypes follow the tensor table (model/tensors.c): weights and activations in the backend's
 * act dtype (fp32 on the CPU, bf16 or fp16 on CUDA), hence void *; parameter gradients, master
 * weights, optimizer state, lse, logits and the cross-entropy's statistics in fp32 (float *);
 * dropout masks in uint8. */

/* A layer's parameters (act dtype) and, with the same fields, its gradients (fp32). */
#define EXEC_LAYER_PARAM_FIELDS(T)                                                                \
    T *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;                                           \
    T *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
typedef struct {
    EXEC_LAYER_PARAM_FIELDS(void)
} ExecLayerParams;
typedef struct {
    EXEC_LAYER_PARAM_FIELDS(float)
} ExecLayerGrads;

/* One layer's saved activations for one micro-batch (pointers into a slot of the pool, or into
 * ws.recompute for what the recompute mode re-creates instead of saving). */
typedef struct {
    void *ln1_in, *qkv_in, *qkv_out, *softmax, *softmax_drop, *proj_in;
    void *ln2_in, *fc1_in, *act_in, *fc2_in;
    float *lse;
    uint8_t *softmax_mask, *attn_drop_mask, *mlp_drop_mask;
} ExecLayerActs;

/* The embedding's and output layer's saved tensors of one micro-batch. probs holds the fp32
 * logits, then the probabilities, then their gradient; for the backward GEMMs that gradient is
 * narrowed in place to the act dtype (model.c), which then occupies the first half of it. */
typedef struct {
    uint8_t *embed_drop_mask;
    void *final_ln_in, *logits_in;
    float *probs;
} ExecHeadActs;

/* How a parameter's local elements map to the full, unsharded tensor (initialization). */
typedef enum {
    EXEC_MAP_FULL = 0, /* replicated: the same index */
    EXEC_MAP_QKV,      /* rows: this rank's Q heads, then its K heads, then its V heads */
    EXEC_MAP_ROWS,     /* a row slice: rows tp * rows_local ... (fc1 of GeLU, vocabulary) */
    EXEC_MAP_SWIGLU,   /* rows [gate slice | up slice] */
    EXEC_MAP_COLS      /* a column slice (row-parallel attention projection, fc2) */
} ExecMap;

/* One parameter: its views, its place in its block, and how it is initialized and counted. */
typedef struct {
    char name[56];     /* the table's name ("layer.3.attn.qkv.w") */
    char init_name[56]; /* the stream it is drawn from (a tied copy draws embed.wte's) */
    void **wslot;       /* the executor's named views (ExecLayerParams fields, wte ...) */
    float **gslot;      /* (ExecLayerGrads fields, g_wte ...) */
    void *w;            /* where its weights (act) and gradients (fp32) are (ZeRO-3: in the */
    float *g;           /* gather buffer while its block is gathered; ZeRO-2/3: the bucket) */
    uint64_t numel, off;    /* off: elements before it in its block's flat layout */
    int64_t rows, cols;     /* local shape (cols 1 for vectors) */
    int block;
    int decay;      /* weight decay applies (matrices and embeddings, not biases or norms) */
    int replicated; /* the same on every TP rank: its gradient norm is counted on TP rank 0 */
    int tied_copy;  /* the output layer's copy of embed.wte on the last stage: counted on the
                       first stage only */
    int norm;       /* a norm weight or bias (SP: its gradient is summed over TP) */
    ExecMap map;
} ExecParam;

/* A parameter block (the embedding, a layer, the final norm and output layer): the unit of
 * gradient reduction and of ZeRO sharding. */
typedef struct {
    int chunk, layer;
    uint64_t numel, shard;    /* elements on this rank; shard = ceil(numel / zero group) */
    uint64_t own_off, own_n;  /* this rank's shard of the block: [own_off, own_off + own_n) */
    int first_param, n_params;
    void *w;                  /* ZeRO < 3: the block's weights (act), contiguous */
    float *g;                 /* ZeRO < 2: its gradients (fp32), contiguous */
    void *w_shard;            /* ZeRO 3: this rank's shard of the weights */
    float *g_shard;           /* ZeRO >= 2: this rank's shard of the gradients */
    float *m, *v;             /* optimizer state: numel (ZeRO 0) or shard elements */
    float *master;            /* fp32 master weights (act not fp32), laid out as m */
    int tied;  /* holds the tied embedding and must sum it with the other stage first */
    int dp_req;  /* the pending data-parallel reduction */
    int reduced; /* its reduction has started this step */
    int op_dp;   /* that reduction's op in the graph */
} ExecBlock;

/* Ops timed per layer and around the layers. */
enum { EX_LN1 = 0, EX_QKV, EX_CORE, EX_PROJ, EX_LN2, EX_FC1, EX_ACT, EX_FC2, EX_LAYER_OPS };
enum { EX_EMBED = 0, EX_FINAL_LN, EX_LOGITS, EX_LOSS, EX_OPTIMIZER, EX_OTHER_OPS };
enum { EX_PHASES = 3 }; /* fwd, bwd, recompute */

typedef struct {
    char name[64];
    int compute;              /* a compute op (1) or communication (0) */
    int chunk;
    ModelPhase phase;
    int next_same;            /* the next op of the graph with the same (name, chunk), or -1 */
    double step_calls, step_flops, step_s; /* the current step */
    double last_calls, last_flops;         /* the last finished step */
    double timed_s;                        /* summed over the timed steps */
} ExecOpStat;

/* One pass of the pipeline schedule as it ran: seconds from the start of the step. */
typedef struct {
    int chunk, mb, backward;
    double start_s, end_s;
} ExecEvent;

/* ---- data (data.c) ---- */

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

/* ---- the executor ---- */

/* ---- fp16 loss scaling (scale.c), as PyTorch's GradScaler: the loss is multiplied by `scale`
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

/* ---- checkpoints (checkpoint.c) ---- */

enum { EXEC_CKPT_PATH = 512 };

typedef struct {
    int step;       /* steps completed when it was written */
    uint64_t bytes; /* every rank's shards (rank 0), this rank's (the others) */
    double seconds; /* from the first shard byte to the agreed commit */
} ExecCkptRecord;

typedef struct {
    char dir[EXEC_CKPT_PATH]; /* empty: no checkpoints */
    int every;                /* steps between checkpoints (0: none) */
    int resume;
    int resumed_from;         /* the step of the checkpoint this run resumed from (0: none) */
    char resumed_dir[EXEC_CKPT_PATH + 32];
    char note[256];           /* the settings that differ from the checkpoint's run */
    ExecCkptRecord *written;  /* [cap_written] the checkpoints this run wrote */
    int n_written, cap_written;
    uint8_t *bounce;          /* host staging between the arenas and the files */
} ExecCkpt;

/* At the end of exec_init: checks the options and the directory (PX_EINPUT: a bad value, a
 * directory that cannot be written, one that already holds a checkpoint without --resume, or
 * --resume without one), and with --resume loads this rank's shard of the latest committed
 * checkpoint (PX_EINPUT names the file and the key or the check that failed; the executor's
 * state is then undefined and must be freed). No communication. */
int exec_ckpt_init(Exec *ex, PxError *err);
void exec_ckpt_free(Exec *ex);
/* After each step (steps_done: the steps completed so far): the checkpoint, every `every`
 * steps. Collective. A write failure is PX_ERUNTIME on every rank alike, the previous
 * checkpoint intact. */
int exec_ckpt_after_step(Exec *ex, int steps_done, PxError *err);
/* rank 0's lines about the resume (none without one) */
void exec_ckpt_print_resume(const Exec *ex);
/* run.json's "checkpoint" (nothing without --checkpoint-dir) */
void exec_ckpt_json(const Exec *ex, cJSON *run);

struct Exec {
    const KernBackend *k;
    PxDtype act;    /* the backend's activation (and weight) dtype */
    size_t ab;      /* its bytes */
    CommLayer *comm;
    int own_comm; /* the single-rank table made here (freed with the executor) */
    ModelPlan plan; /* a copy: spec normalised by model_spec_check, its profile and prediction */
    ModelSpec spec;
    ModelDims d;
    ExecOptions opt;
    char plan_path[256], output[256], metrics[256];
    int steps;

    /* this rank in the grid (model_rank_coords) */
    int stage, tp_rank, cp_rank, dp_rank;
    int zero_rank, zero_n; /* place in the dp x cp group and its size */
    int prev_rank, next_rank; /* the world ranks of the neighbouring stages (ring) */
    int *chunk_g;  /* [v] global chunk of each local chunk */
    int *chunk_l0; /* [v] its first (global) layer: model_chunk_layers */
    int cl;        /* layers per chunk of this stage (its own count in an uneven split) */
    int has_data, has_loss;

    ModelTensorTable tt;
    ModelTensorTable twin; /* the same stage without ZeRO: every parameter's name and shape */
    ModelOpGraph graph;
    ModelPredicted pred; /* the plan's prediction, which this run is compared with */

    ExecArena arena[MODEL_CAT_COUNT];

    /* parameters and blocks */
    ExecParam *params;
    int n_params;
    ExecBlock *blocks;
    int n_blocks;
    void *wte, *wpe, *lnf_w, *lnf_b, *out_w; /* out_w is wte when tied on this chunk */
    float *g_wte, *g_wpe, *g_lnf_w, *g_lnf_b, *g_out_w;
    ExecLayerParams *lw; /* [layers] weights and gradients (this stage's layers bound) */
    ExecLayerGrads *lg;
    int embed_block, final_block; /* indices in blocks, or -1 */
    int tied_here;  /* the output layer reads embed.wte on this stage */
    int tied_pair;  /* the output layer is a copy on the last stage: embed_allreduce */
    int defer_logits_wgrad; /* ZeRO-2/3 + tied here: the output layer's weight gradient is
                               computed when the embedding block is in the bucket */

    /* communication buffers */
    void *pp_send, *pp_recv, *sp_gather, *param_gather[2];
    float *grad_bucket;
    uint64_t pp_elems, bucket_elems, gather_elems;
    int send_req, recv_req; /* the pending pipeline send, the posted receive */
    int gather_next;        /* the ZeRO-3 gather slot the next gather fills */
    /* the pipeline's expected receives of a step, in schedule order: chunk, mb, backward */
    ModelAction *recvs;
    int n_recvs, next_recv;

    /* activations: slots of the layer sets (cl layers each) and per-chunk slots of the extras */
    int n_slots;
    int *n_xslots;        /* [v] */
    ExecLayerActs *acts;  /* [n_slots][cl] */
    ExecHeadActs **xacts; /* [v][n_xslots[j]] */
    ExecLayerActs region; /* the parts of a layer that live in ws.recompute */
    uint8_t *re_base;     /* ws.recompute */
    uint64_t re_bytes;
    uint64_t slot_bytes, *xslot_bytes; /* one layer set; [v] one chunk's extras */
    int *slot_busy, **xslot_busy;
    int live, peak_live;
    int *xlive, *peak_xlive; /* [v] */

    /* workspace and data */
    void *ws_out, *ws_dx_a, *ws_dx_b, *ws_dhid, *ws_dqkv, *ws_dffn, *ws_dact, *ws_dscores;
    float *ws_flash_d, *ws_xent;
    int32_t *batch[2];    /* data.batch on the device, one per step in flight */
    int32_t *stage_buf[2]; /* the loader's host staging (backend host_alloc) */
    long staged;          /* the step whose batch was copied ahead (-1: none) */
    float *host_loss;     /* the micro-batch's per-token losses, read back (b * s floats) */

    /* schedule */
    ModelAction *actions;
    int n_actions;
    int *mb_slot, *mb_xslot; /* [v][m] */
    int *bwd_done;           /* [v] backwards of each chunk done this step */
    ExecEvent *events;       /* [n_actions] the current step's passes */
    ExecEvent *last_events;  /* the last finished step's */
    int have_events;
    double step_t0;
    double pass_start; /* when the running pass got its input */
    double pass_end;   /* when its output was ready to send (-1: at its return) */
    double *step_bubble; /* [steps] idle over busy pipeline time of each timed step */
    int n_bubbles;
    int stop_agreed;   /* every rank was asked to stop (SIGINT/SIGTERM on any) */

    /* ops */
    ExecOpStat *ops;     /* [graph.count] */
    ExecOpReport *report;
    int *layer_op;       /* [layers][EX_LAYER_OPS][EX_PHASES]: index into ops or -1 */
    int other_op[EX_OTHER_OPS][EX_PHASES];
    int *op_hash;        /* open addressing over (name, chunk): first op of each */
    int op_hash_cap;
    int cur_op;
    int cur_counts;      /* the running op counts a call when it ends */
    double op_t0;
    double unattributed_flops;
    int timed_steps;
    uint64_t step_bytes[MODEL_COMM_COUNT]; /* bytes of the last finished step, by kind */
    uint64_t bytes_at_step[MODEL_COMM_COUNT];

    /* device memory as the device reports it (cudaMemGetInfo); 0 where there is none */
    int have_dev_mem;
    uint64_t dev_total, dev_used_start, dev_used_peak;
    char device_name[96];
    const char *comm_note; /* why this comm layer (the staged fallback), for the header */

    /* data */
    ExecData data;
    ExecLoader loader;
    int loader_started;

    /* training state */
    int attn_dropout; /* dropout of the attention probabilities (unfused path only) */
    float dropout;
    long long seq_base; /* global index of this step's first sequence on this rank */
    int cur_step;
    double loss_sum;    /* this rank's share of the step's summed token losses */
    double *step_loss, *step_time, *step_tps; /* [steps] */
    int steps_done;
    int interrupted;
    int collective_error; /* the last error was seen by every rank alike (no abort needed) */
    int fail_step;        /* PARALLAX_TEST_FAIL: this rank fails at this step (-1: never) */
    uint64_t inf_steps;   /* PARALLAX_TEST_INF: bit k: an Inf lands in a gradient at step k */
    int hang_step;        /* PARALLAX_TEST_HANG: this rank stalls forever at this step (-1: never) */
    uint64_t nan_loss_steps; /* PARALLAX_TEST_NAN_LOSS: bit k: rank 0's loss is a NaN at step k */
    int stopped_step;     /* the step at which a non-finite loss or gradient stopped the run */

    /* mixed precision */
    ExecScaler scaler;
    int opt_steps;        /* optimizer updates made (skipped steps do not count: AdamW's t) */
    int *step_skipped;    /* [steps] */
    double *step_scale;   /* [steps] the loss scale the step ran with */

    /* checkpoints: the steps before first_step were run by the run this one resumes */
    int first_step;
    ExecCkpt ckpt;
};

/* run.c: SIGINT / SIGTERM arrived; the ranks agree on it at the end of each step */
extern volatile sig_atomic_t exec_stop_flag;

/* init.c: the layout-independent initial value of every parameter (and its master copy) */
int exec_init_params(Exec *ex, PxError *err);

/* model.c: one chunk's forward and backward of one micro-batch */
int exec_forward(Exec *ex, int chunk, int mb, int slot, int xslot, const int32_t *tokens,
                 PxError *err);
int exec_backward(Exec *ex, int chunk, int mb, int slot, int xslot, const int32_t *tokens,
                  int last_mb, PxError *err);

/* step.c: the pipeline's transfers of (chunk, mb, direction): take waits for the posted
 * receive and moves it into dst; give sends src (this TP rank's part of it) on */
int exec_pp_take(Exec *ex, int chunk, int mb, int backward, void *dst, PxError *err);
int exec_pp_give(Exec *ex, int chunk, int mb, int backward, const void *src, PxError *err);

/* step.c: gradient reduction of a block whose gradients are complete for the step */
int exec_block_done(Exec *ex, int block, PxError *err);
/* ZeRO-3: gathers a block's parameters and points its views at them */
int exec_gather_block(Exec *ex, int block, ModelPhase phase, int occurrence, PxError *err);
/* ZeRO-2/3: zeroes the gradient bucket before a block's backward, reduce-scatters it after */
void exec_bucket_zero(Exec *ex, int block);
int exec_bucket_reduce(Exec *ex, int block, PxError *err);
/* the op of the graph named printf-style, on chunk (-1: per step) in phase; occurrence k
 * picks the k-th op of that name (0: the first); -1 when the graph has none */
int exec_op_find(const Exec *ex, int chunk, ModelPhase phase, int occurrence, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* half.c: 16-bit floats on the host (to fp32 exactly; from fp32 to nearest, ties to even) */
float exec_bf16_to_float(uint16_t h);
uint16_t exec_float_to_bf16(float f);
float exec_half_to_float(uint16_t h);
uint16_t exec_float_to_half(float f);

/* measure.c: samples the device's memory in use (peak) */
void exec_sample_device_memory(Exec *ex);

/* measure.c: op timing and FLOP counting */
double exec_now(void);
void exec_op_begin(Exec *ex, int op);
/* continues timing an op that a communication interrupted, without counting another call */
void exec_op_resume(Exec *ex, int op);
void exec_op_end(Exec *ex);
void exec_count_flops(Exec *ex, double flops);
void exec_ops_step_begin(Exec *ex);
void exec_ops_step_end(Exec *ex, int timed);
double exec_median_step_s(const Exec *ex);
/* This rank's bubble: idle over busy pipeline time, the median over the timed steps (the recorded
 * step's when none is timed yet); busy_s and idle_s (optional) get the recorded step's. */
double exec_bubble(const Exec *ex, double *busy_s, double *idle_s);
/* The busy and idle pipeline time of the last recorded step. */
void exec_bubble_of_step(const Exec *ex, double *busy_s, double *idle_s);

/* seeds of the dropout streams */
enum { EXEC_SITE_EMBED = 1, EXEC_SITE_ATTN = 2, EXEC_SITE_ATTN_OUT = 3, EXEC_SITE_MLP_OUT = 4 };
uint64_t exec_mix64(uint64_t x);
uint64_t exec_hash_name(uint64_t seed, const char *name);
/* The stream whose element i is element i + offset of stream `seed` (kern_dropout_keep draws
 * element i from seed + golden * (i + 1)): a shard of a row draws what the whole row would. */
static inline uint64_t exec_stream_at(uint64_t seed, uint64_t offset)
{
    return seed + 0x9E3779B97F4A7C15ull * offset;
}

#endif
