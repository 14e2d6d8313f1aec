/* Private to kernels/cpu: the CPU kernels that backend.c gathers into the KernBackend table.
 * The CPU's activation dtype is fp32, so every act pointer (void *) of kernels.h is a float *
 * here. Sizes come from the caller and are trusted; the few contract violations that would
 * silently give wrong numbers are checked with KERN_CHECK, which aborts (a kernel has no
 * status to return, and a wrong gradient is worse than a crash). */
#ifndef KERN_CPU_H
#define KERN_CPU_H

#include "kernels/kernels.h"

#define KERN_CHECK(cond, what)                                                                    \
    do {                                                                                          \
        if (!(cond))                                                                              \
            kern_cpu_fatal(__FILE__, __LINE__, (what));                                           \
    } while (0)

/* check.c */
_Noreturn void kern_cpu_fatal(const char *file, int line, const char *what);

/* matmul.c */
void kern_cpu_matmul(void *c, PxDtype c_dtype, const void *a, const void *b, int m, int n, int k,
                     int trans_a, int trans_b, float alpha, float beta);
void kern_cpu_add_bias(void *out, const void *bias, int N, int C);
void kern_cpu_bias_grad(void *dbias, const void *dout, int N, int C);

/* norms.c */
void kern_cpu_layernorm_fwd(void *out, const void *inp, const void *w, const void *b, int N,
                            int C, float eps);
void kern_cpu_layernorm_bwd(void *dinp, void *dw, void *db, const void *dout, const void *inp,
                            const void *w, int N, int C, float eps);
void kern_cpu_rmsnorm_fwd(void *out, const void *inp, const void *w, int N, int C, float eps);
void kern_cpu_rmsnorm_bwd(void *dinp, void *dw, const void *dout, const void *inp,
                          const void *w, int N, int C, float eps);

/* activations.c */
void kern_cpu_gelu_fwd(void *out, const void *inp, size_t n);
void kern_cpu_gelu_bwd(void *dinp, const void *inp, const void *dout, size_t n);
void kern_cpu_swiglu_fwd(void *out, const void *inp, int N, int F);
void kern_cpu_swiglu_bwd(void *dinp, const void *inp, const void *dout, int N, int F);

/* rope.c */
void kern_cpu_rope_fwd(void *qkv, int B, int T, int H, int KV, int D, int pos_offset,
                       float theta);
void kern_cpu_rope_bwd(void *dqkv, int B, int T, int H, int KV, int D, int pos_offset,
                       float theta);

/* attention.c */
void kern_cpu_attention_fwd(const KernAttnFwd *a);
void kern_cpu_attention_bwd(const KernAttnBwd *a);
void kern_cpu_attention_merge(void *out, float *lse, const void *out_b, const float *lse_b, int T,
                              int H, int D);

/* embedding.c */
void kern_cpu_embedding_fwd(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                            int N, int T, int pos_offset, int C, int v_start, int V);
void kern_cpu_embedding_bwd(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                            int N, int T, int pos_offset, int C, int v_start, int V);

/* xent.c */
void kern_cpu_xent_rowmax(float *rowmax, const float *logits, int N, int V);
void kern_cpu_xent_expsum(float *rowsum, float *target, float *logits, const float *rowmax,
                          const int32_t *targets, int N, int V, int v_start);
void kern_cpu_xent_finish(float *loss, float *probs, const float *rowsum, const float *rowmax,
                          const float *target, int N, int V);
void kern_cpu_xent_bwd(float *probs, const int32_t *targets, int N, int V, int v_start,
                       float dloss);

/* optim.c */
void kern_cpu_adamw(void *param, float *master, const void *grad, float *m, float *v, size_t n,
                    float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale);
void kern_cpu_sgd_momentum(void *param, float *master, const void *grad, float *mom, size_t n,
                           float lr, float momentum, float weight_decay, float grad_scale);
void kern_cpu_adam8(void *param, float *master, const void *grad, uint8_t *m8, uint8_t *v8,
                    float *absmax, const KernAdam8 *a);

/* moe.c */
void kern_cpu_moe_route_fwd(float *probs, int32_t *idx, float *w, const float *logits,
                            const KernMoeRoute *r);
void kern_cpu_moe_route_bwd(float *dlogits, const float *dprobs, const float *dw,
                            const float *probs, const int32_t *idx, const KernMoeRoute *r);
void kern_cpu_moe_counts(float *counts, const int32_t *idx, int N, int topk, int E);
void kern_cpu_moe_drop(int32_t *idx, const float *w, int N, int topk, int E, int capacity);
void kern_cpu_moe_aux_fwd(float *loss, const float *probs, const float *counts, int N, int E,
                          float scale);
void kern_cpu_moe_aux_bwd(float *dprobs, const float *counts, int N, int E, float scale);
void kern_cpu_moe_permute(void *out, int32_t *counts, int32_t *row_of, const void *x,
                          const int32_t *idx, int N, int C, int topk, int E);
void kern_cpu_moe_permute_bwd(void *dx, const void *dout, const int32_t *idx, int N, int C,
                              int topk, int E);
void kern_cpu_moe_unpermute(void *y, const void *eout, const float *w, const int32_t *idx, int N,
                            int C, int topk, int E);
void kern_cpu_moe_unpermute_bwd(void *deout, float *dw, const void *dy, const void *eout,
                                const float *w, const int32_t *idx, int N, int C, int topk,
                                int E);
void kern_cpu_moe_dense(float *probs, uint8_t *map, const int32_t *idx, const float *w, int N,
                        int topk, int E);
void kern_cpu_moe_sparse(int32_t *idx, float *w, const float *probs, const uint8_t *map, int N,
                         int topk, int E, int e0, int e1);
void kern_cpu_moe_pick(float *dw, const float *probs, const int32_t *idx, int N, int topk, int E);

/* fp8.c */
void kern_cpu_fp8_quantize(void *q, float *amax, const void *x, const KernFp8 *f, int trans,
                           const float *scale);
void kern_cpu_fp8_dequantize(void *x, const void *q, const KernFp8 *f);
void kern_cpu_fp8_transpose(void *qt, const void *q, const KernFp8 *f);
void kern_cpu_matmul_fp8(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa,
                         const void *b, const KernFp8 *fb, int m, int n, int k, int trans_a,
                         int trans_b, float alpha, float beta);
void kern_cpu_fp8_piece_amax(float *amax, const void *x, uint64_t off, uint64_t n,
                             const KernFp8 *f);
void kern_cpu_fp8_block_scales(void *scales, const float *amax, const KernFp8 *f);
void kern_cpu_fp8_piece_quantize(uint8_t *q, const void *x, uint64_t off, uint64_t n,
                                 const KernFp8 *f, const void *scales);
void kern_cpu_matmul_fp8_split(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa,
                               const void *sa, const void *b, const KernFp8 *fb, const void *sb,
                               int m, int n, int k, int trans_a, int trans_b, float alpha,
                               float beta);
void kern_cpu_fp8_amax_update(float *history, float *scale, const float *amax,
                              const float *fmax, int len, int n);

/* misc.c */
void kern_cpu_add(void *out, const void *a, const void *b, size_t n);
void kern_cpu_add_inplace(void *out, const void *a, size_t n);
void kern_cpu_copy_cols(void *dst, int ldd, const void *src, int lds, int rows, int cols, int add);
void kern_cpu_dropout_fwd(void *out, uint8_t *mask, const void *inp, size_t n, float p,
                          uint64_t seed);
void kern_cpu_dropout_bwd(void *dinp, const void *dout, const uint8_t *mask, size_t n, float p);
double kern_cpu_sumsq(const float *x, size_t n);
double kern_cpu_grad_sumsq(const void *g, size_t n);
int kern_cpu_all_finite(const float *x, size_t n);
void kern_cpu_scale_f32(float *x, size_t n, float s);
void kern_cpu_cast_to_act(void *out, const float *inp, size_t n);
void kern_cpu_cast_to_f32(float *out, const void *inp, size_t n);
void kern_cpu_acc_to_f32(float *out, const void *inp, size_t n);

/* gate.c */
void kern_cpu_add_bias_f32(float *out, const void *bias, int N, int C);
void kern_cpu_gate_fwd(void *y, const void *x, const void *w, int N, int C);
void kern_cpu_gate_bwd(float *dlogit, void *dhid, void *hid, const void *x, const void *w, int N,
                       int C, int F);
void kern_cpu_gate_wgrad(void *dx, void *dw, const float *dlogit, const void *x, const void *w,
                         int N, int C);
void kern_cpu_attention_sink_bwd(void *dsinks, const void *sinks, const float *lse,
                                 const float *drow, const void *dscores, int B, int H, int Tq,
                                 int Tk);

#endif
