/* The CPU backend's table: memory on the host heap, and the kernels of the other files in this
 * directory. One BLAS thread per rank by default, because a CPU run already places one rank per
 * core (or per few cores) and BLAS threads would oversubscribe them. */
#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* 64-byte alignment (a cache line, an AVX-512 vector) and a size rounded up to it, so that a
 * vectorized loop may read a whole line at the tail of a buffer. */
static void *cpu_alloc(size_t bytes)
{
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes)
        return NULL; /* overflow */
    if (rounded == 0)
        rounded = 64; /* a unique pointer, so that alloc(0) is not mistaken for a failure */
    void *p = NULL;
    if (posix_memalign(&p, 64, rounded) != 0)
        return NULL;
    memset(p, 0, rounded);
    return p;
}

static void cpu_free(void *p) { free(p); }

/* The guards on bytes keep memset/memcpy from ever seeing a NULL pointer with a 0 length,
 * which is undefined behaviour (and UBSan's nonnull check says so). */
static void cpu_memset0(void *p, size_t bytes)
{
    if (bytes)
        memset(p, 0, bytes);
}

static void cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

static void cpu_sync(void) {}

/* The CPU has one memory: staging is a plain copy, and there is no device to report. */
static void cpu_noop(void) {}

static void cpu_fill_cols_f32(float *x, int N, int ld, int c0, int c1, float value)
{
    KERN_CHECK(N >= 0 && c0 >= 0 && c0 <= c1 && c1 <= ld, "fill_cols_f32: columns outside the row");
    for (int n = 0; n < N; n++)
        for (int c = c0; c < c1; c++)
            x[(size_t)n * ld + c] = value;
}

static void cpu_add_f32(float *out, const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] += a[i];
}

static int cpu_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    return 0;
}

static const KernBackend kern_cpu_backend = {
    .name = "cpu",
    .act = PX_FP32,
    .grad = PX_FP32,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .copy = cpu_copy,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .sync = cpu_sync,
    .matmul = kern_cpu_matmul,
    .add_bias = kern_cpu_add_bias,
    .bias_grad = kern_cpu_bias_grad,
    .layernorm_fwd = kern_cpu_layernorm_fwd,
    .layernorm_bwd = kern_cpu_layernorm_bwd,
    .rmsnorm_fwd = kern_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = kern_cpu_rmsnorm_bwd,
    .gelu_fwd = kern_cpu_gelu_fwd,
    .gelu_bwd = kern_cpu_gelu_bwd,
    .swiglu_fwd = kern_cpu_swiglu_fwd,
    .swiglu_bwd = kern_cpu_swiglu_bwd,
    .rope_fwd = kern_cpu_rope_fwd,
    .rope_bwd = kern_cpu_rope_bwd,
    .attention_fwd = kern_cpu_attention_fwd,
    .attention_bwd = kern_cpu_attention_bwd,
    .attention_merge = kern_cpu_attention_merge,
    .add = kern_cpu_add,
    .add_inplace = kern_cpu_add_inplace,
    .copy_cols = kern_cpu_copy_cols,
    .dropout_fwd = kern_cpu_dropout_fwd,
    .dropout_bwd = kern_cpu_dropout_bwd,
    .embedding_fwd = kern_cpu_embedding_fwd,
    .embedding_bwd = kern_cpu_embedding_bwd,
    .xent_rowmax = kern_cpu_xent_rowmax,
    .xent_expsum = kern_cpu_xent_expsum,
    .xent_finish = kern_cpu_xent_finish,
    .xent_bwd = kern_cpu_xent_bwd,
    .adamw = kern_cpu_adamw,
    .sgd_momentum = kern_cpu_sgd_momentum,
    .adam8 = kern_cpu_adam8,
    .sumsq = kern_cpu_sumsq,
    .grad_sumsq = kern_cpu_grad_sumsq,
    .all_finite = kern_cpu_all_finite,
    .scale_f32 = kern_cpu_scale_f32,
    .cast_to_act = kern_cpu_cast_to_act,
    .cast_to_f32 = kern_cpu_cast_to_f32,
    .acc_to_f32 = kern_cpu_acc_to_f32,
    .moe_route_fwd = kern_cpu_moe_route_fwd,
    .moe_route_bwd = kern_cpu_moe_route_bwd,
    .moe_counts = kern_cpu_moe_counts,
    .moe_drop = kern_cpu_moe_drop,
    .moe_aux_fwd = kern_cpu_moe_aux_fwd,
    .moe_aux_bwd = kern_cpu_moe_aux_bwd,
    .moe_permute = kern_cpu_moe_permute,
    .moe_permute_bwd = kern_cpu_moe_permute_bwd,
    .moe_unpermute = kern_cpu_moe_unpermute,
    .moe_unpermute_bwd = kern_cpu_moe_unpermute_bwd,
    .moe_dense = kern_cpu_moe_dense,
    .moe_sparse = kern_cpu_moe_sparse,
    .moe_pick = kern_cpu_moe_pick,
    .fp8_quantize = kern_cpu_fp8_quantize,
    .fp8_dequantize = kern_cpu_fp8_dequantize,
    .fp8_transpose = kern_cpu_fp8_transpose,
    .matmul_fp8 = kern_cpu_matmul_fp8,
    .matmul_fp8_split = kern_cpu_matmul_fp8_split,
    .fp8_amax_update = kern_cpu_fp8_amax_update,
    .fp8_piece_amax = kern_cpu_fp8_piece_amax,
    .fp8_block_scales = kern_cpu_fp8_block_scales,
    .fp8_piece_quantize = kern_cpu_fp8_piece_quantize,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .to_device_async = cpu_copy,
    .copy_wait = cpu_noop,
    .copy_sync = cpu_noop,
    .add_f32 = cpu_add_f32,
    .fill_cols_f32 = cpu_fill_cols_f32,
    .mem_info = cpu_mem_info,
    .add_bias_f32 = kern_cpu_add_bias_f32,
    .gate_fwd = kern_cpu_gate_fwd,
    .gate_bwd = kern_cpu_gate_bwd,
    .gate_wgrad = kern_cpu_gate_wgrad,
    .attention_sink_bwd = kern_cpu_attention_sink_bwd,
};

static pthread_once_t kern_cpu_once = PTHREAD_ONCE_INIT;

/* PARALLAX_BLAS_THREADS: a whole number >= 1; anything else warns and keeps 1, because a typo
 * should not silently change the speed of every rank. */
static void kern_cpu_init(void)
{
    int threads = 1;
    const char *s = getenv("PARALLAX_BLAS_THREADS");
    if (s && *s) {
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno == 0 && end != s && *end == '\0' && v >= 1 && v <= 4096)
            threads = (int)v;
        else
            px_warn("PARALLAX_BLAS_THREADS=%s: expected a whole number from 1 to 4096; using 1",
                    s);
    }
    openblas_set_num_threads(threads);
}

const KernBackend *kern_cpu(void)
{
    pthread_once(&kern_cpu_once, kern_cpu_init);
    return &kern_cpu_backend;
}
