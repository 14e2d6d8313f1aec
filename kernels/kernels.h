/* kern — the compute kernels of parallax behind one plain-C interface, implemented for the CPU
 * (OpenBLAS sgemm and C loops, fp32: the reference) and for CUDA (cuBLAS and kernels in
 * kernels/cuda, bf16 or fp16 activations with fp32 accumulation, master weights and gradients).
 *
 * Conventions (llm.c's): outputs first, then inputs, then sizes. Matrices are row-major.
 * "act" pointers (void *) hold the backend's activation dtype (KernBackend.act: fp32 on the
 * CPU); float * pointers are always fp32 (master weights, optimizer state, norm and softmax
 * statistics, logits). The gradients of parameters are void * in KernBackend.grad: fp32, or on
 * CUDA the act dtype (training.grad_dtype, kern_cuda_with_grads); the backwards that write
 * them below and the optimizer that reads them take that dtype, as matmul's c_dtype does for
 * a weight gradient's GEMM. Parameter gradients and activation gradients
 * marked "+=" are accumulated into; everything else is overwritten (gelu_bwd and swiglu_bwd
 * overwrite their dinp, unlike llm.c's). N is the number of token rows (B*T), C a row width.
 * All pointers are device pointers of the backend. With beta = 0 a matmul never reads C;
 * norm backwards need dinp not to alias dout; gelu_bwd's dinp may alias dout and swiglu_bwd's
 * dinp may alias inp. Every call is ordered on the backend's compute stream; to_device,
 * to_host, sumsq and all_finite wait for it (call sumsq once over a contiguous buffer, not per
 * tensor). The one exception is to_device_async, which copies on a second (copy) stream so
 * that the next batch travels while the current step computes; copy_wait and copy_sync order
 * it (below).
 *
 * Example (a linear layer, Y = X W^T + b, and its backward):
 *   const KernBackend *k = kern_cpu();
 *   k->matmul(y, k->act, x, w, N, OUT, IN, 0, 1, 1.0f, 0.0f);     // y[N,OUT] = x[N,IN] w[OUT,IN]^T
 *   k->add_bias(y, bias, N, OUT);
 *   k->matmul(dx, k->act, dy, w, N, IN, OUT, 0, 0, 1.0f, 0.0f);   // dx[N,IN] = dy[N,OUT] w[OUT,IN]
 *   k->matmul(dw, PX_FP32, dy, x, OUT, IN, N, 1, 0, 1.0f, 1.0f);  // dw[OUT,IN] += dy^T x
 *   k->bias_grad(dbias, dy, N, OUT);
 */
#ifndef KERNELS_H
#define KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "common/px.h"

#ifdef __cplusplus
extern "C" { /* kernels/cuda is compiled as CUDA C++ */
#endif

/* One causal self-attention call for one micro-batch on one TP rank. Query t of batch b and
 * head h is q + (b*Tq + t)*q_stride + h*D; key/value t of KV group g is k + (b*Tk + t)*k_stride
 * + g*D (heads h use group h / (H/KV): grouped-query attention). Query t has position
 * q_offset + t and sees keys 0 .. q_offset + t (context parallelism gathers all Tk keys). */
typedef struct {
    int B, Tq, Tk, H, KV, D;
    int Dv; /* value (and output) head width; 0: D (multi-head latent attention's differ) */
    int q_offset;
    float scale; /* usually 1/sqrt(D) */
    const void *q, *k, *v;
    int q_stride, k_stride, v_stride; /* in elements */
    void *out;                        /* [B, Tq, H*D] */
    /* Unfused path (probs != NULL): the softmax [B, H, Tq, Tk] is written (and saved by the
     * caller); with dropout > 0 its mask (uint8, 1 = kept) and the dropped, rescaled copy that
     * multiplies V are written too. Masked entries (key after query) hold 0. */
    void *probs;
    float dropout;
    /* dropout stream: the same seed reproduces the same mask (recompute). Every entry of
     * [B,H,Tq,Tk] draws with its flat index, masked ones included, so backends agree byte for
     * byte. */
    uint64_t seed;
    /* Where the entries of the stream lie (0: the call's own [B,H,Tq,Tk]): entry (b, h, t, j)
     * draws element (b*H + h) * drop_head + t * drop_row + j, so that a call holding a block of
     * a larger score matrix (context parallelism's query parts against their keys) draws what
     * the whole matrix's call would. The mask and probs_drop stay [B,H,Tq,Tk]. */
    uint64_t drop_row, drop_head;
    uint8_t *mask;
    void *probs_drop;
    /* Fused path (probs == NULL, flash-style, no s x s storage): log-sum-exp of each row's
     * scaled scores, [B, H, Tq]. Dropout is not supported on this path. */
    float *lse;
    /* Attention sinks (NULL: none): sinks[h] (act) joins head h's softmax denominator as
     * exp(sinks[h]) against the scaled scores, with no value; lse then includes it, and the
     * backward needs nothing else (the saved probabilities or lse carry it; attention_sink_bwd
     * gives the sinks' gradient). Context parallelism passes them to one part of a query's
     * keys only. */
    const void *sinks;
    /* MXFP8 attention (docs/fp8.md, "FP8 attention"): a second decoded copy of V (NULL: v
     * itself), in v's layout and stride, which O = P V reads. Each GEMM reads the copy whose
     * 32-element scaling blocks run along its reduction dimension: the scores (over head_dim)
     * the row-wise q, k; O = P V (over the keys) the column-wise V. */
    const void *v_col;
} KernAttnFwd;

typedef struct {
    int B, Tq, Tk, H, KV, D;
    int Dv; /* as KernAttnFwd's */
    int q_offset;
    float scale;
    const void *q, *k, *v;
    int q_stride, k_stride, v_stride;
    const void *out;  /* forward output (fused path) */
    const void *dout; /* [B, Tq, H*D] */
    /* outputs, overwritten; strides as the inputs' (they may point into packed buffers) */
    void *dq, *dk, *dv;
    int dq_stride, dk_stride, dv_stride;
    /* unfused path: the saved softmax (and mask / dropped copy when dropout > 0) and a
     * workspace of B*H*Tq*Tk act elements */
    const void *probs;
    float dropout;
    const uint8_t *mask;
    const void *probs_drop;
    void *dscores;
    /* fused path: the saved log-sum-exp and a workspace of B*H*Tq floats */
    const float *lse;
    float *drow;
    /* MXFP8 attention's second decoded copies (NULL: q, k, dout themselves), in the layouts
     * and strides of q, k and dout: the GEMMs that reduce over a sequence read them, dQ = dS K
     * k_col, dK = dS^T Q q_col, dV = P^T dO dout_col; the scores and dP = dO V^T (over
     * head_dim) read q, k, v and dout (KernAttnFwd.v_col) */
    const void *q_col, *k_col, *dout_col;
} KernAttnBwd;

/* Mixture-of-experts routing of N token rows over E experts (docs/moe.md). Scores are fp32:
 * softmax or sigmoid of the router's logits. Each token picks topk distinct experts by score;
 * with groups > 0 (DeepSeek-V3's group-limited routing) the E experts form `groups` groups of
 * E/groups, each scored by the sum of its two best scores (its best when it holds one), and
 * only the topk_groups best groups are eligible. Ties go to the lower index. A chosen expert's
 * weight is its score; softmax weights are renormalised over the chosen when norm_topk,
 * sigmoid weights always (as Megatron-Core). With force_balance the choice ignores the scores:
 * copy k of the token with global id g goes to expert (g * topk + k) % E (Megatron's
 * --moe-router-force-load-balancing, made layout-independent); the weights are still the
 * chosen scores. Row n's global id is first + (n / seq_rows) * seq_stride + n % seq_rows (a
 * rank's rows are b sequences of seq_rows tokens out of seq_stride). */
typedef enum { KERN_MOE_SOFTMAX = 0, KERN_MOE_SIGMOID } KernMoeScore;
typedef struct {
    int N, E, topk;
    KernMoeScore score;
    int groups, topk_groups; /* 0: every expert eligible */
    int norm_topk;
    int force_balance;
    uint64_t first;
    int seq_rows;
    int64_t seq_stride;
} KernMoeRoute;

/* Experts one routing call can hold (the permutation's counting sort keeps them on the stack). */
enum { KERN_MOE_MAX_EXPERTS = 1024 };

/* A copy dropped by an expert's capacity (moe_drop) keeps its expert e encoded as idx = -1 - e:
 * the counts, the permutation and its inverse skip it (it reaches no expert and its token keeps
 * only its residual), unpermute_bwd gives it a zero weight gradient, and route_bwd still finds
 * its score, which the kept copies' renormalised weights depend on (Megatron-Core masks the
 * dropped probabilities after the top-k in the same way). */
static inline int kern_moe_expert_of(int32_t i) { return i < 0 ? -1 - i : i; }

/* An FP8 tensor as parallax stores it (docs/fp8.md): rows x cols one-byte elements, row-major,
 * then its scales, one per block_r x block_c block in row-major block order (the last blocks of
 * a row or column may be partial). A scale is the decode factor (scale_inv in Transformer
 * Engine's words): element value = fp8 value x scale. fp32 scales, or E8M0 (one byte, 2^(e -
 * 127), 0xff NaN) for MXFP8. Per-tensor scaling is one block of rows x cols; DeepSeek-V3's
 * blockwise scaling 128 x 128 for weights and 1 x 128 for activations; MXFP8 1 x 32 (or 32 x 1
 * for a column-wise copy) with E8M0. */
typedef struct {
    int rows, cols;
    int block_r, block_c; /* the scaling block; rows x cols (or more): one scale */
    int e5m2;             /* elements are E5M2 (gradients of the hybrid format), else E4M3 */
    int e8m0;             /* scales are E8M0, else fp32 */
} KernFp8;

/* Bytes of a KernFp8 tensor: rows x cols, then its scales. */
size_t kern_fp8_bytes(const KernFp8 *f);
/* Its scales: ceil(rows / block_r) x ceil(cols / block_c). */
size_t kern_fp8_scales(const KernFp8 *f);

/* 8-bit Adam's call (KernBackend.adam8, kern_host_adam8): every quantization block of
 * KERN_ADAM8_BLOCK state values that a segment touches is decoded whole (value = codes[code] x
 * the block's absmax), AdamW updates the segments' elements exactly as adamw does (on fp32
 * master, m and v, with the segment's weight decay), and the block is coded back against its
 * new absmax (the largest |m| and v, 0 when all are 0): each value becomes the table's nearest
 * code to value / absmax, ties to the lower code, a positive v never zero. A quantization
 * block must not be touched by two calls of one step (it is coded once). */
enum { KERN_ADAM8_BLOCK = 2048, KERN_ADAM8_SEGMENTS = 48 };
typedef struct KernAdam8 {
    float codes[512];   /* kern_adam8_tables: m's 256 values, then v's */
    uint64_t state_n;   /* the block's state elements */
    int n;              /* segments, at most KERN_ADAM8_SEGMENTS */
    /* segment i: state elements [begin[i], end[i]), ascending and apart */
    uint64_t begin[KERN_ADAM8_SEGMENTS], end[KERN_ADAM8_SEGMENTS];
    float weight_decay[KERN_ADAM8_SEGMENTS];
    float lr, beta1, beta2, eps, grad_scale;
    int t; /* AdamW's step, 1-based */
} KernAdam8;

typedef struct KernBackend KernBackend;
struct KernBackend {
    const char *name; /* "cpu", "cuda" */
    PxDtype act;      /* dtype of weights and activations: fp32 on the CPU */
    PxDtype grad;     /* dtype of parameter gradients: fp32, or act (kern_cuda_with_grads) */

    /* ---- memory ---- */
    void *(*alloc)(size_t bytes); /* NULL on failure; zero-filled */
    void (*free)(void *p);        /* accepts NULL */
    void (*memset0)(void *p, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*to_device)(void *dst, const void *host, size_t bytes);
    void (*to_host)(void *host, const void *src, size_t bytes);
    void (*sync)(void); /* the host waits for the compute stream (not for the copy stream) */

    /* ---- matrix products ---- */
    /* C[m,n] = alpha * op(A) op(B) + beta * C. op(A) is [m,k] (A stored [m,k], or [k,m] when
     * trans_a); op(B) is [k,n] (B stored [k,n], or [n,k] when trans_b). A and B hold act
     * elements; C holds c_dtype (act or PX_FP32), accumulated in fp32. */
    void (*matmul)(void *c, PxDtype c_dtype, const void *a, const void *b, int m, int n, int k,
                   int trans_a, int trans_b, float alpha, float beta);
    void (*add_bias)(void *out, const void *bias, int N, int C);     /* out[N,C] += bias[C] */
    void (*bias_grad)(void *dbias, const void *dout, int N, int C); /* dbias[C] += sum_n dout */

    /* ---- norms: statistics are recomputed in backward, never saved ---- */
    void (*layernorm_fwd)(void *out, const void *inp, const void *w, const void *b, int N, int C,
                          float eps); /* b may be NULL */
    /* dinp += ; dw += ; db += (db may be NULL) */
    void (*layernorm_bwd)(void *dinp, void *dw, void *db, const void *dout, const void *inp,
                          const void *w, int N, int C, float eps);
    void (*rmsnorm_fwd)(void *out, const void *inp, const void *w, int N, int C, float eps);
    void (*rmsnorm_bwd)(void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                        int N, int C, float eps);

    /* ---- activations ---- */
    /* GELU, tanh approximation (GPT-2): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    void (*gelu_fwd)(void *out, const void *inp, size_t n);
    void (*gelu_bwd)(void *dinp, const void *inp, const void *dout, size_t n);
    /* SwiGLU: inp row is [gate (F) | up (F)]; out[N,F] = silu(gate) * up */
    void (*swiglu_fwd)(void *out, const void *inp, int N, int F);
    void (*swiglu_bwd)(void *dinp, const void *inp, const void *dout, int N, int F);

    /* ---- positions ---- */
    /* Rotary embedding in place on the Q and K heads of packed rows [(H + 2 KV) * D] (Q heads,
     * then K heads, then V heads), rotate-half convention (pairs i and i + D/2, as Hugging Face
     * Llama): token t of each sequence has position pos_offset + t, frequency theta^(-2i/D).
     * rope_bwd applies the inverse rotation to a gradient in the same layout. */
    void (*rope_fwd)(void *qkv, int B, int T, int H, int KV, int D, int pos_offset, float theta);
    void (*rope_bwd)(void *dqkv, int B, int T, int H, int KV, int D, int pos_offset, float theta);

    /* ---- attention ---- */
    void (*attention_fwd)(const KernAttnFwd *a);
    void (*attention_bwd)(const KernAttnBwd *a);
    /* The online softmax's merge of two fused-path results for the same T queries over two
     * disjoint sets of keys (context parallelism's K, V ring): out [T, H*D] and lse [H, T] hold
     * the first and get the result over both, L = log(e^lse + e^lse_b), out = out e^(lse - L)
     * + out_b e^(lse_b - L). NULL in a backend without it (the ring is refused there). */
    void (*attention_merge)(void *out, float *lse, const void *out_b, const float *lse_b, int T,
                            int H, int D);

    /* ---- elementwise ---- */
    void (*add)(void *out, const void *a, const void *b, size_t n); /* out = a + b (out may alias) */
    void (*add_inplace)(void *out, const void *a, size_t n);        /* out += a */
    /* dst[r * ldd + c] = src[r * lds + c] (add: +=) for r < rows, c < cols: a block of
     * columns between strided views of act rows (multi-head latent attention's head parts);
     * dst and src do not overlap */
    void (*copy_cols)(void *dst, int ldd, const void *src, int lds, int rows, int cols, int add);
    /* Inverted dropout with a counter-based stream: element i of stream (seed) is kept with
     * probability 1 - p; out = inp * mask / (1 - p). The same (seed, i) always draws the same. */
    void (*dropout_fwd)(void *out, uint8_t *mask, const void *inp, size_t n, float p,
                        uint64_t seed);
    void (*dropout_bwd)(void *dinp, const void *dout, const uint8_t *mask, size_t n, float p);

    /* ---- embedding (vocabulary-parallel: this rank holds rows v_start .. v_start+V-1) ---- */
    /* out[N,C] = wte[tok - v_start] (0 for tokens outside the shard) + wpe[pos] (wpe may be
     * NULL; pos = pos_offset + n % T). Under vocabulary parallelism the shards' outputs are
     * summed across TP ranks, so pass wpe on one rank only (or add it after the reduction). */
    void (*embedding_fwd)(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                          int N, int T, int pos_offset, int C, int v_start, int V);
    /* dwte += (rows of this shard), dwpe += (may be NULL) */
    void (*embedding_bwd)(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                          int N, int T, int pos_offset, int C, int v_start, int V);

    /* ---- softmax cross-entropy over fp32 logits [N, V] (vocabulary-parallel in steps, so
     * the caller can all-reduce rowmax (max) and rowsum/target (sum) across TP ranks) ---- */
    void (*xent_rowmax)(float *rowmax, const float *logits, int N, int V);
    /* logits <- exp(logits - rowmax) in place; rowsum = sum of the row; target = the target's
     * raw logit when the target falls in this shard (tok - v_start in [0, V)), else 0 */
    void (*xent_expsum)(float *rowsum, float *target, float *logits, const float *rowmax,
                        const int32_t *targets, int N, int V, int v_start);
    /* probs = exp / rowsum in place; loss[n] = log(rowsum) + rowmax - target. Every target
     * must fall in exactly one shard: there is no ignore index (mask such rows yourself). */
    void (*xent_finish)(float *loss, float *probs, const float *rowsum, const float *rowmax,
                        const float *target, int N, int V);
    /* dlogits = (probs - onehot(target)) * dloss, in place over probs */
    void (*xent_bwd)(float *probs, const int32_t *targets, int N, int V, int v_start, float dloss);

    /* ---- optimizer (on fp32 master weights; `param` is the act copy to refresh, or NULL
     * when the master is the parameter itself) ---- */
    /* AdamW (Loshchilov & Hutter 2019) with bias correction for step t (1-based); each
     * gradient is first multiplied by grad_scale (clipping, loss-scale removal) */
    void (*adamw)(void *param, float *master, const void *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale);
    /* PyTorch's SGD: g = grad*grad_scale + wd*master; mom = momentum*mom + g; master -= lr*mom
     * (no dampening, no Nesterov) */
    void (*sgd_momentum)(void *param, float *master, const void *grad, float *mom, size_t n,
                         float lr, float momentum, float weight_decay, float grad_scale);
    /* 8-bit Adam (Dettmers et al. 2022) on part of one parameter block's state (KernAdam8
     * below): param (or NULL), master and grad point at state element a->begin[0] (element e
     * at offset e - a->begin[0]); m8, v8 hold the block's codes from element 0, absmax its
     * [2][ceil(a->state_n / KERN_ADAM8_BLOCK)] fp32 absmax (m's, then v's). */
    void (*adam8)(void *param, float *master, const void *grad, uint8_t *m8, uint8_t *v8,
                  float *absmax, const struct KernAdam8 *a);

    /* ---- fp32 helpers and casts ---- */
    double (*sumsq)(const float *x, size_t n); /* sum of squares, accumulated in double */
    double (*grad_sumsq)(const void *g, size_t n); /* sumsq of gradients in KernBackend.grad */
    int (*all_finite)(const float *x, size_t n);
    void (*scale_f32)(float *x, size_t n, float s);
    void (*cast_to_act)(void *out, const float *inp, size_t n);
    void (*cast_to_f32)(float *out, const void *inp, size_t n);
    void (*acc_to_f32)(float *out, const void *inp, size_t n); /* out += inp */

    /* ---- staging: batches copied ahead of the step that uses them ---- */
    /* Page-locked host memory (cudaMallocHost; the CPU's heap), zero-filled: what
     * to_device_async copies from. NULL on failure; host_free accepts NULL. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    /* Starts copying bytes from host (from host_alloc) to dst on the copy stream and returns at
     * once. The copy starts after the work issued to the compute stream so far, so it never
     * overwrites what a kernel still reads; host must stay unchanged until copy_sync. */
    void (*to_device_async)(void *dst, const void *host, size_t bytes);
    /* The compute stream's next work waits for every copy started so far (the host does not). */
    void (*copy_wait)(void);
    /* The host waits for every copy started so far: their host buffers may be reused. */
    void (*copy_sync)(void);

    /* ---- mixture of experts: routing, auxiliary loss, permutation (KernMoeRoute above) ----
     * The permutation puts copy k of token n at row row(n, k) of the expert-grouped order:
     * by expert, then token, then k (a stable counting sort of idx, recomputed from idx by every
     * call, so only idx need be kept). */
    /* probs[N,E] = scores of logits[N,E] (probs may be logits: in place); idx[N,topk] the
     * chosen experts, w[N,topk] their weights */
    void (*moe_route_fwd)(float *probs, int32_t *idx, float *w, const float *logits,
                          const KernMoeRoute *r);
    /* dlogits[N,E] (overwritten) from the weights' gradient dw[N,topk] and a gradient of the
     * scores themselves dprobs[N,E] (the auxiliary loss's; may be NULL, or dlogits itself: in
     * place). The choice is
     * piecewise constant: no gradient flows through it. */
    void (*moe_route_bwd)(float *dlogits, const float *dprobs, const float *dw, const float *probs,
                          const int32_t *idx, const KernMoeRoute *r);
    /* Megatron-Core's token dropping, policy "probs": each expert keeps at most `capacity` of
     * its copies, those of the highest weight w[N,topk] (ties to the lower copy index); the rest
     * are marked dropped in idx (kern_moe_expert_of above). Copies already dropped stay so. */
    void (*moe_drop)(int32_t *idx, const float *w, int N, int topk, int E, int capacity);
    /* counts[E] (overwritten): copies routed to each expert, as fp32 (to be summed over ranks);
     * dropped copies not counted */
    void (*moe_counts)(float *counts, const int32_t *idx, int N, int topk, int E);
    /* The Switch / GShard load-balancing loss, coeff * E * sum_e f_e * P_e with f_e = counts_e /
     * copies and P_e = sum_n probs[n,e] / tokens; the caller folds coeff * E / (copies * tokens)
     * (and any loss weight) into scale: *loss (one fp32, overwritten) = scale * sum_e counts_e *
     * sum_n probs[n,e]; its gradient dprobs[n,e] = scale * counts_e (overwritten; the counts are
     * constants, as in Megatron-Core). */
    void (*moe_aux_fwd)(float *loss, const float *probs, const float *counts, int N, int E,
                        float scale);
    void (*moe_aux_bwd)(float *dprobs, const float *counts, int N, int E, float scale);
    /* out[row(n,k)] = x[n] for the N*topk copies (x[N,C], out[N*topk,C]); counts[E] (int32,
     * overwritten) the rows of each expert; row_of[N*topk] (may be NULL) row(n, k) */
    void (*moe_permute)(void *out, int32_t *counts, int32_t *row_of, const void *x,
                        const int32_t *idx, int N, int C, int topk, int E);
    /* dx[n] = sum_k dout[row(n,k)] (overwritten) */
    void (*moe_permute_bwd)(void *dx, const void *dout, const int32_t *idx, int N, int C,
                            int topk, int E);
    /* y[n] = sum_k w[n,k] * eout[row(n,k)] (overwritten; eout[N*topk,C] expert-grouped) */
    void (*moe_unpermute)(void *y, const void *eout, const float *w, const int32_t *idx, int N,
                          int C, int topk, int E);
    /* deout[row(n,k)] = w[n,k] * dy[n] (overwritten); dw[n,k] = dot(dy[n], eout[row(n,k)])
     * (overwritten, fp32) */
    void (*moe_unpermute_bwd)(void *deout, float *dw, const void *dy, const void *eout,
                              const float *w, const int32_t *idx, int N, int C, int topk, int E);
    /* Megatron-Core's all-gather dispatcher (docs/moe.md, "The all-gather dispatcher") sends
     * the routing as dense [N,E] rows. probs[n,e] = w[n,k] where idx[n,k] = e, 0 elsewhere
     * (overwritten); map[n,e] (may be NULL) 1 there, 0 elsewhere. Dropped copies are left
     * out. */
    void (*moe_dense)(float *probs, uint8_t *map, const int32_t *idx, const float *w, int N,
                      int topk, int E);
    /* Back from dense rows, for the experts e0 <= e < e1: idx[n,j], w[n,j] (overwritten) the
     * token's experts of map[n,:] in ascending order with their probs, those outside [e0, e1)
     * marked dropped (kern_moe_expert_of); slots past the map's ones dropped, weight 0. */
    void (*moe_sparse)(int32_t *idx, float *w, const float *probs, const uint8_t *map, int N,
                       int topk, int E, int e0, int e1);
    /* dw[n,k] = probs[n, idx[n,k]] (overwritten; 0 for a dropped copy) */
    void (*moe_pick)(float *dw, const float *probs, const int32_t *idx, int N, int topk, int E);

    /* ---- FP8 (KernFp8 above; docs/fp8.md) ---- */
    /* q (a KernFp8 tensor of layout f) from x: x holds act elements [rows, cols], or [cols,
     * rows] when trans (q is then x's transpose). Each block's scale: with scale == NULL the
     * block's own (current scaling): amax / fmax (448 for E4M3, 57344 for E5M2), or for E8M0
     * the power of two 2^(floor(log2 amax) - emax) (emax 8 for E4M3, 15 for E5M2: the OCP MX
     * rule), 1 for an all-zero block; with scale != NULL (delayed scaling, one block only) the
     * given decode factor *scale. Elements are x / scale rounded to nearest even, saturating.
     * amax (may be NULL; one fp32) gets the largest |x| of the whole tensor. */
    void (*fp8_quantize)(void *q, float *amax, const void *x, const KernFp8 *f, int trans,
                         const float *scale);
    /* x (act elements [rows, cols]) = the values of q. */
    void (*fp8_dequantize)(void *x, const void *q, const KernFp8 *f);
    /* qt = q's transpose: its cols x rows elements, then q's scales transposed (the scale of
     * q's block (i, j) at (j, i)): qt has layout {cols, rows, block_c, block_r}, each block
     * the transpose of one of q's, of the same values and so the same scale (a per-tensor
     * scale as it is; a 128 x 128 tile's, Transformer Engine's columnwise copy of a 2D-scaled
     * Float8BlockwiseQTensor, _create_columnwise). */
    void (*fp8_transpose)(void *qt, const void *q, const KernFp8 *f);
    /* The matmul above on FP8 operands: A is a KernFp8 tensor of layout fa, B of layout fb,
     * with op(A) [m,k] and op(B) [k,n] as in matmul; products of the decoded values
     * accumulated in fp32 into C (c_dtype act or PX_FP32). */
    void (*matmul_fp8)(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa, const void *b,
                       const KernFp8 *fb, int m, int n, int k, int trans_a, int trans_b,
                       float alpha, float beta);
    /* A weight quantized from flat pieces (MXFP8 parameters under ZeRO-3, docs/fp8.md: a rank
     * holds elements [off, off + n) of the row-major rows x cols matrix, a cut that may split a
     * 1 x 32 or 32 x 1 block between two ranks; Transformer Engine's
     * mxfp8_scaling_compute_partial_amax and mxfp8_scaling_partial_cast). fp8_piece_amax: x
     * holds the piece's n act elements; each finite |x| is folded (max) into amax[b], b its
     * block of layout f (kern_fp8_scales(f) fp32 entries, row-major block order), the other
     * entries as they were; the maxima of every piece's call are the blocks' largest finite
     * |x|, fp8_quantize's current scaling's amax. */
    void (*fp8_piece_amax)(float *amax, const void *x, uint64_t off, uint64_t n,
                           const KernFp8 *f);
    /* scales (f's scale grid: E8M0 bytes, or fp32) from the blocks' largest finite |x| in
     * amax (finite, >= 0: fp8_piece_amax's), by fp8_quantize's current-scaling rule. */
    void (*fp8_block_scales)(void *scales, const float *amax, const KernFp8 *f);
    /* q[0, n) = elements [off, off + n) of the matrix of layout f (x holds them, act dtype),
     * each divided by its block's scale in `scales` (f's grid, as fp8_block_scales writes it)
     * and rounded as fp8_quantize rounds: the pieces of every rank laid end to end are the
     * bytes fp8_quantize writes for the whole matrix (without its scales). */
    void (*fp8_piece_quantize)(uint8_t *q, const void *x, uint64_t off, uint64_t n,
                               const KernFp8 *f, const void *scales);
    /* matmul_fp8 with each operand's scales read from a grid of its own, sa for A and sb for
     * B (f's grid; NULL: right after the elements, as matmul_fp8 reads them): MXFP8 parameters
     * under ZeRO-3, whose gathered copies carry no scales (every rank keeps the whole weight's,
     * docs/fp8.md). */
    void (*matmul_fp8_split)(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa,
                             const void *sa, const void *b, const KernFp8 *fb, const void *sb,
                             int m, int n, int k, int trans_a, int trans_b, float alpha,
                             float beta);
    /* Delayed scaling's bookkeeping for n tensors (Transformer Engine's DelayedScaling with
     * amax_compute_algo "max", margin 0): history [len, n] fp32, row 0 the newest. Rolls the
     * history down one row, writes amax[i] into row 0, and sets scale[i] (a decode factor) to
     * max over the history of column i / fmax[i] (1 when that max is 0). */
    void (*fp8_amax_update)(float *history, float *scale, const float *amax, const float *fmax,
                            int len, int n);

    /* ---- small helpers of the executor ---- */
    void (*add_f32)(float *out, const float *a, size_t n); /* out += a in fp32 (gradients) */
    /* x[n][c0 .. c1) = value for each of the N fp32 rows of length ld (the logits of a padded
     * vocabulary get -inf) */
    void (*fill_cols_f32)(float *x, int N, int ld, int c0, int c1, float value);
    /* The device's free and total memory (cudaMemGetInfo); returns 0 where the backend has no
     * memory of its own to report (the CPU), 1 otherwise. */
    int (*mem_info)(size_t *free_bytes, size_t *total_bytes);

    /* ---- GPT-OSS's and Qwen2-MoE's extras (docs/moe.md, "Biases, the shared gate, sinks") ---- */
    /* out[N,C] += bias[C] over fp32 rows (the router's logits; bias holds act elements) */
    void (*add_bias_f32)(float *out, const void *bias, int N, int C);
    /* The shared experts' sigmoid gate (Qwen2-MoE): y[n] *= sigmoid(dot(x[n], w)) in place,
     * y[N,C], x[N,C], w[C]; the dot product accumulated in fp32. */
    void (*gate_fwd)(void *y, const void *x, const void *w, int N, int C);
    /* Its backward through the shared experts' last GEMM y = hid W^T: with g = sigmoid(dot(x[n],
     * w)) recomputed, dlogit[n] = g (1 - g) dot(dhid[n], hid[n]) (fp32, overwritten), where
     * dhid[N,F] holds the ungated dy W; then dhid[n] and hid[n] are scaled by g in place (the
     * gated output's gradients: the data gradient, and the weight gradient's dy^T (g hid)). */
    void (*gate_bwd)(float *dlogit, void *dhid, void *hid, const void *x, const void *w, int N,
                     int C, int F);
    /* dx[n] += dlogit[n] w (dx may be NULL), dw[C] += sum_n dlogit[n] x[n] (summed in fp32;
     * dw in KernBackend.grad, a 16-bit one rounded once per call) */
    void (*gate_wgrad)(void *dx, void *dw, const float *dlogit, const void *x, const void *w,
                       int N, int C);
    /* Attention sinks (GPT-OSS: a learned logit per head in every query's softmax denominator,
     * with no value; KernAttnFwd.sinks): dsinks[h] += -sum over the B x Tq queries of head h of
     * p_sink D, where p_sink is the sink's probability and D = rowsum(dO o O) the softmax's
     * row term. The fused path gives lse [B,H,Tq] (with the sink) and drow [B,H,Tq] (the
     * backward's D), p_sink = exp(sinks[h] - lse); the unfused path gives dscores [B,H,Tq,Tk]
     * (the backward's dS = P (dP - D)), whose row sum is p_sink D (lse and drow NULL).
     * dsinks is in KernBackend.grad (a 16-bit one rounded once per call). */
    void (*attention_sink_bwd)(void *dsinks, const void *sinks, const float *lse,
                               const float *drow, const void *dscores, int B, int H, int Tq,
                               int Tk);
};

/* The CPU backend (always present). BLAS threads: 1 unless PARALLAX_BLAS_THREADS says more. */
const KernBackend *kern_cpu(void);
/* The CPU backend with activations in act (PX_BF16 or PX_FP16; PX_FP32: kern_cpu()), under
 * the CUDA backend's precision contract: each kernel widens its act operands to fp32, runs
 * kern_cpu()'s kernel and rounds what it writes once, to nearest even; master weights,
 * gradients, optimizer state, statistics and logits fp32 (loss scaling is the caller's
 * business); FP8 codes and scales pass as they are (an FP8 entry widens the act input it
 * quantizes and rounds the act output it decodes or multiplies into). NULL for another
 * dtype. */
const KernBackend *kern_cpu_with(PxDtype act);
/* The same with parameter gradients in grad: PX_FP32 (kern_cpu_with's) or act (16-bit
 * gradients, each accumulation rounded once); NULL otherwise. */
const KernBackend *kern_cpu_with_grads(PxDtype act, PxDtype grad);
/* The CUDA backend, or NULL when parallax was built without CUDA or no GPU is visible. */
const KernBackend *kern_cuda(void);
/* The CUDA backend with activations in act: PX_BF16 (what kern_cuda() returns) or PX_FP16 (loss
 * scaling is the caller's business); NULL for another dtype, without CUDA or without a GPU. It
 * binds to the device current at the first call (cudaSetDevice before it). */
const KernBackend *kern_cuda_with(PxDtype act);
/* The same with parameter gradients in grad: PX_FP32 (kern_cuda_with's) or act (16-bit
 * gradients, as Megatron without --accumulate-allreduce-grads-in-fp32); NULL otherwise. */
const KernBackend *kern_cuda_with_grads(PxDtype act, PxDtype grad);
/* ---- the optimizer on the host, whatever the backend (optimizer offload) ----
 * These run in host memory and compute exactly what the backends' adamw and sgd_momentum
 * compute, element by element (same operations in the same order, fp32), reading grad in
 * grad_dtype (fp32, bf16 or fp16, widened exactly) and updating the fp32 master; the caller
 * rounds the master into the weights' dtype with kern_host_round. */

/* The 512 values 8-bit Adam's codes stand for, as fractions of a block's absmax, ascending: m's
 * 256 (signed), then v's 256 (non-negative): dynamic (exponent, fraction) codes after Dettmers
 * et al. 2022, Sec. 2.2 (kernels/cpu/optim.c gives the construction). */
void kern_adam8_tables(float tables[512]);
void kern_host_adamw(float *master, const void *grad, PxDtype grad_dtype, float *m, float *v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     int t, float grad_scale);
void kern_host_sgd_momentum(float *master, const void *grad, PxDtype grad_dtype, float *mom,
                            size_t n, float lr, float momentum, float weight_decay,
                            float grad_scale);
/* KernBackend.adam8 on the host, with grad in grad_dtype and param (fp32) or NULL. */
void kern_host_adam8(float *param, float *master, const void *grad, PxDtype grad_dtype,
                     uint8_t *m8, uint8_t *v8, float *absmax, const KernAdam8 *a);
/* out[i] = x[i] in dtype (fp32 copied; bf16 and fp16 rounded to nearest even, as the CUDA
 * kernels' stores round), n elements in host memory. */
void kern_host_round(void *out, PxDtype dtype, const float *x, size_t n);

/* Visible CUDA devices: 0 without CUDA, without a driver or without a GPU. */
int kern_cuda_device_count(void);
/* Makes `device` the current one, before the first kern_cuda_with (a rank of a node with
 * several GPUs takes its own). PX_OK, or PX_ERUNTIME without that device. */
int kern_cuda_set_device(int device);
/* The current device's name ("NVIDIA H100 80GB HBM3") into buf; PX_ERUNTIME without one. */
int kern_cuda_device_name(char *buf, size_t cap);
/* The current device's PCI bus id ("0000:18:00.0") into buf: the same physical GPU gives the
 * same id in every process, whatever index CUDA_VISIBLE_DEVICES gives it there. PX_ERUNTIME
 * without a device. */
int kern_cuda_device_bus_id(char *buf, size_t cap);

/* nvcc compiles the dropout stream for the device too, so that both backends draw from this one
 * definition. */
#ifdef __CUDACC__
#define KERN_HOST_DEVICE __host__ __device__
#else
#define KERN_HOST_DEVICE
#endif

/* The dropout stream: a keep decision for element i of stream seed (counter-based, so any
 * backend and any recomputation draw the same mask). */
static inline KERN_HOST_DEVICE int kern_dropout_keep(uint64_t seed, uint64_t i, float p)
{
    /* splitmix64 of (seed, i) */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0) >= (double)p;
}

#ifdef __cplusplus
}
#endif

#endif
