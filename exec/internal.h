/* Private to exec/: the executor's state shared by its files. */
#ifndef EXEC_INTERNAL_H
#define EXEC_INTERNAL_H

#include <pthread.h>

#include "exec/exec.h"
#include "kernels/kernels.h"

/* ---- arenas (arena.c) ---- */

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

/* ---- tensors the kernels read and write ---- */

typedef struct {
    float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b;
    float *ln2_w, *ln2_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
} ExecLayerParams;

/* One layer's saved activations for one micro-batch (pointers into a slot of the pool, or into
 * ws.recompute for what the recompute mode re-creates instead of saving). */
typedef struct {
    float *ln1_in, *qkv_in, *qkv_out, *lse, *softmax, *softmax_drop, *proj_in;
    float *ln2_in, *fc1_in, *act_in, *fc2_in;
    uint8_t *softmax_mask, *attn_drop_mask, *mlp_drop_mask;
} ExecLayerActs;

/* The embedding's and output layer's saved tensors of one micro-batch. */
typedef struct {
    uint8_t *embed_drop_mask;
    float *final_ln_in, *logits_in, *probs;
} ExecHeadActs;

/* One parameter of the table with its gradient and its place in its block's optimizer state. */
typedef struct {
    int tensor;   /* index in the table */
    float *w, *g;
    uint64_t numel;
    int block;
    uint64_t state_off; /* offset in the block's flat optimizer state */
    int decay;          /* weight decay applies (matrices and embeddings, not biases or norms) */
} ExecParam;

/* Ops timed per layer and around the layers. */
enum { EX_LN1 = 0, EX_QKV, EX_CORE, EX_PROJ, EX_LN2, EX_FC1, EX_ACT, EX_FC2, EX_LAYER_OPS };
enum { EX_EMBED = 0, EX_FINAL_LN, EX_LOGITS, EX_LOSS, EX_OPTIMIZER, EX_OTHER_OPS };
enum { EX_PHASES = 3 }; /* fwd, bwd, recompute */

typedef struct {
    char name[64];
    int compute;              /* a compute op (1) or communication (0) */
    double step_calls, step_flops, step_s; /* the current step */
    double last_calls, last_flops;         /* the last finished step */
    double timed_s;                        /* summed over the timed steps */
} ExecOpStat;

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

/* The batch of a step on this rank, read by a thread while the previous step computes. Buffer
 * b holds step `have[b]`; the main thread asks for a step by setting want[] (only for a buffer
 * it is not computing on), the thread fills it. */
typedef struct {
    const ExecData *src;
    int32_t *buf[2];  /* data.batch: [2][m][b][s + 1] */
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
void exec_loader_stop(ExecLoader *l);
/* First token of sequence g (0-based over the whole run) in the source. */
uint64_t exec_loader_window(const ExecLoader *l, long long g);

/* ---- the executor ---- */

struct Exec {
    const KernBackend *k;
    ExecComm *comm;
    ModelPlan plan; /* spec normalised by model_spec_check; prediction owned */
    ModelSpec spec;
    ModelDims d;
    ProfCluster cluster;
    ExecOptions opt;
    char plan_path[256], output[256], metrics[256];
    int steps;
    int stage;

    ModelTensorTable tt;
    ModelOpGraph graph;
    SimResult sim; /* the prediction this run is compared with */
    int have_sim;

    ExecArena arena[MODEL_CAT_COUNT];

    /* parameters */
    ExecParam *params;
    int n_params;
    float *wte, *wpe, *lnf_w, *lnf_b, *out_w; /* out_w is wte when tied */
    float *g_wte, *g_wpe, *g_lnf_w, *g_lnf_b, *g_out_w;
    ExecLayerParams *lw, *lg; /* [layers] weights and gradients */
    float **opt_m, **opt_v;   /* [blocks] (SGD: opt_m is the momentum) */
    float *grads_base;
    uint64_t grads_numel;

    /* activations: slots of the layer sets and of the extras */
    int n_slots, n_xslots;
    ExecLayerActs *acts; /* [n_slots][layers] */
    ExecHeadActs *xacts; /* [n_xslots] */
    ExecLayerActs region; /* the parts of a layer that live in ws.recompute */
    uint8_t *re_base;     /* ws.recompute */
    uint64_t re_bytes;
    uint64_t slot_bytes, xslot_bytes;
    int *slot_busy, *xslot_busy;
    int live, xlive, peak_live, peak_xlive;

    /* workspace and data */
    float *ws_out, *ws_dx_a, *ws_dx_b, *ws_dhid, *ws_dqkv, *ws_dffn, *ws_dact;
    float *ws_dscores, *ws_flash_d, *ws_xent;
    int32_t *batch[2];

    /* schedule */
    ModelAction *actions;
    int n_actions;
    int *mb_slot, *mb_xslot; /* [m] */

    /* ops */
    ExecOpStat *ops;     /* [graph.count] */
    ExecOpReport *report;
    int *layer_op;       /* [layers][EX_LAYER_OPS][EX_PHASES]: index into ops or -1 */
    int other_op[EX_OTHER_OPS][EX_PHASES];
    int cur_op;
    double op_t0;
    double unattributed_flops;
    int timed_steps;

    /* data */
    ExecData data;
    ExecLoader loader;
    int loader_started;

    /* training state */
    int attn_dropout; /* dropout of the attention probabilities (unfused path only) */
    float dropout;
    long long seq_base; /* global index of this step's first sequence on this rank */
    int cur_step;
    double *step_loss, *step_time, *step_tps; /* [steps] */
    int steps_done;
    int interrupted;
};

/* init.c: the layout-independent initial value of every parameter */
void exec_init_params(Exec *ex);

/* model.c: one micro-batch's forward and backward */
void exec_forward(Exec *ex, int mb, int slot, int xslot, const int32_t *tokens, double *loss_sum);
void exec_backward(Exec *ex, int mb, int slot, int xslot, const int32_t *tokens);

/* measure.c: op timing and FLOP counting */
double exec_now(void);
void exec_op_begin(Exec *ex, int op);
void exec_op_end(Exec *ex);
void exec_count_flops(Exec *ex, double flops);
void exec_ops_step_begin(Exec *ex);
void exec_ops_step_end(Exec *ex, int timed);
double exec_median_step_s(const Exec *ex);

/* seeds of the dropout streams */
enum { EXEC_SITE_EMBED = 1, EXEC_SITE_ATTN = 2, EXEC_SITE_ATTN_OUT = 3, EXEC_SITE_MLP_OUT = 4 };
uint64_t exec_mix64(uint64_t x);
uint64_t exec_hash_name(uint64_t seed, const char *name);

#endif
