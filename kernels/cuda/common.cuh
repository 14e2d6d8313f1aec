/* Private to kernels/cuda: what the CUDA kernels share. Error checks that name the call site
 * (cudaCheck, cublasCheck, KERN_CHECK: a kernel has no status to return, so a failure aborts,
 * as the CPU backend's KERN_CHECK does), the backend's context (one cuBLAS handle, device
 * limits, a scratch for reductions that return to the host), conversions between the act
 * dtype and fp32, warp and block reductions, the row-major GEMM on cuBLAS, and the kernel
 * launch helper.
 *
 * Every kernel is a template on the act type T (__nv_bfloat16, __half or float): values are
 * loaded into fp32, computed in fp32 and rounded once on the store (fp32 activations: stored as
 * computed). Everything runs on the legacy
 * default stream (the compute stream), so kernels, cuBLAS calls and cudaMemcpy follow each
 * other in issue order; only to_device_async uses a second, non-blocking stream (backend.cu).
 *
 * Built with PX_CUDA_EMU, the same sources compile as host C++ against kernels/cuda/emu, which
 * runs each block's threads as fibers; that is how the kernels' indexing and synchronization
 * are tested on machines without a GPU (tests/test_kernels_cuda.c, ctest test_kernels_cuda_emu).
 * Kernels therefore launch through KLAUNCH rather than <<<>>>, and take dynamic shared
 * memory through dyn_smem<T>(). */
#ifndef KERN_CUDA_COMMON_CUH
#define KERN_CUDA_COMMON_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef PX_CUDA_EMU
#include "kernels/cuda/emu/cuda_emu.h"
#else
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include "kernels/kernels.h"

/* ---- errors ---- */

[[noreturn]] void kern_cuda_fatal(const char *file, int line, const char *what);
void kern_cuda_check(cudaError_t err, const char *file, int line);
void kern_cublas_check(cublasStatus_t st, const char *file, int line);

#define cudaCheck(err) kern_cuda_check((err), __FILE__, __LINE__)
#define cublasCheck(st) kern_cublas_check((st), __FILE__, __LINE__)
#define KERN_CHECK(cond, what)                                                                    \
    do {                                                                                          \
        if (!(cond))                                                                              \
            kern_cuda_fatal(__FILE__, __LINE__, (what));                                          \
    } while (0)

/* ---- the backend's context (context.cu) ---- */

typedef struct {
    int device;
    int sms;                /* multiprocessors: grid sizes of grid-stride kernels */
    size_t smem_default;    /* dynamic shared memory a block gets without opting in */
    size_t smem_optin;      /* the most a block may opt in to */
    int cc;                 /* compute capability, major * 10 + minor (90: Hopper) */
    cublasHandle_t blas;
    cublasLtHandle_t lt;    /* the FP8 GEMMs (fp8.cu): cuBLASLt takes their scale pointers */
    double *sum;            /* device scratch of sumsq */
    int *flag;              /* device scratch of all_finite */
    /* to_device_async: its own non-blocking stream (a blocking one would serialize with the
     * legacy default stream the kernels run on), an event marking the compute stream's
     * position when a copy is issued, and one marking the last copy */
    cudaStream_t copy_stream;
    cudaEvent_t ev_compute, ev_copy;
} KernCudaCtx;

const KernCudaCtx *kern_cuda_ctx(void);
/* Fills the context for the current device, once (backend.cu calls it under pthread_once):
 * 1 when there is a device, 0 when there is no driver or no device (no error left pending). */
int kern_cuda_ctx_open(void);

/* A device scratch of at least bytes (256-byte aligned), owned by the context and grown, never
 * shrunk: the FP8 kernels' block maxima, dequantized GEMM operands and cuBLASLt workspace. Its
 * contents last until the next call; growing frees the old one (cudaFree waits for the device,
 * so no queued kernel still reads it). Once the step's largest request has been seen, later
 * calls allocate nothing. */
void *kern_cuda_workspace(size_t bytes);

/* Raises kernel's dynamic shared memory limit when bytes need more than the default, and
 * aborts with the size when the device cannot give that much. */
void kern_cuda_smem_optin(const void *kernel, size_t bytes, const char *what);

/* Each file fills its entries of the table for the table's act dtype (backend.cu gathers them). */
void kern_cuda_table_matmul(KernBackend *k);
void kern_cuda_table_norms(KernBackend *k);
void kern_cuda_table_activations(KernBackend *k);
void kern_cuda_table_rope(KernBackend *k);
void kern_cuda_table_attention(KernBackend *k);
void kern_cuda_table_embedding(KernBackend *k);
void kern_cuda_table_xent(KernBackend *k);
void kern_cuda_table_optim(KernBackend *k);
void kern_cuda_table_misc(KernBackend *k);
void kern_cuda_table_moe(KernBackend *k);
void kern_cuda_table_fp8(KernBackend *k);
void kern_cuda_table_gate(KernBackend *k);

/* ---- act dtype <-> fp32 ---- */

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

/* round to nearest even, as the host test rounds its inputs */
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x)
{
    return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

/* A parameter gradient of dtype G (KernBackend.grad) gets x: an fp32 atomic, or, for 16-bit
 * gradients, one read, add in fp32 and rounding by the element's only writer (the caller
 * arranges that one thread owns each element of a 16-bit gradient, so that a call rounds it
 * once, as a 16-bit GEMM's beta = 1 store does). */
template <typename G> __device__ __forceinline__ void grad_add(G *g, float x)
{
    *g = from_f<G>(to_f(*g) + x);
}
template <> __device__ __forceinline__ void grad_add<float>(float *g, float x) { atomicAdd(g, x); }

template <typename T> struct ActTraits;
template <> struct ActTraits<__nv_bfloat16> {
    static const PxDtype px = PX_BF16;
    static const cudaDataType blas = CUDA_R_16BF;
};
template <> struct ActTraits<__half> {
    static const PxDtype px = PX_FP16;
    static const cudaDataType blas = CUDA_R_16F;
};
/* fp32 activations: cuBLAS in CUDA_R_32F with CUBLAS_COMPUTE_32F on a handle without TF32 math
 * (context.cu), full fp32 products, as the simulator prices an fp32 plan (the device's fp32
 * peak, not TF32: docs/gpu.md) */
template <> struct ActTraits<float> {
    static const PxDtype px = PX_FP32;
    static const cudaDataType blas = CUDA_R_32F;
};

/* ---- reductions (every lane of the warp must take part) ---- */

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

/* The sum (or max) over the whole block, returned to every thread. blockDim.x is a multiple
 * of 32 and at most 1024; every thread of the block must call it (it has barriers). */
__device__ __forceinline__ float block_sum(float v)
{
    __shared__ float part[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads(); /* part may still be read by a previous call */
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < warps ? part[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ double block_sum_d(double v)
{
    __shared__ double partd[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0)
        partd[warp] = v;
    __syncthreads();
    v = lane < warps ? partd[lane] : 0.0;
    return warp_sum_d(v);
}

__device__ __forceinline__ float block_max(float v)
{
    __shared__ float partm[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        partm[warp] = v;
    __syncthreads();
    v = lane < warps ? partm[lane] : -INFINITY;
    return warp_max(v);
}

/* ---- dynamic shared memory ---- */

#ifndef PX_CUDA_EMU
template <typename T> __device__ __forceinline__ T *dyn_smem()
{
    extern __shared__ __align__(16) unsigned char kern_smem[];
    return reinterpret_cast<T *>(kern_smem);
}
#endif

/* ---- launches ---- */

enum { KERN_THREADS = 256 };

/* for (i = this thread's first; i < n; i += all threads of the grid) */
#define GRID_STRIDE(i, n)                                                                         \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                      \
         i += (size_t)gridDim.x * blockDim.x)

/* Blocks for a grid-stride loop over n items: enough to fill the device several times over,
 * never more than the items need (and at least 1, so that n = 0 still launches cleanly). */
static inline unsigned kern_grid(size_t n, int threads)
{
    size_t want = (n + (size_t)threads - 1) / (size_t)threads;
    size_t cap = (size_t)kern_cuda_ctx()->sms * 32;
    if (want > cap)
        want = cap;
    return want ? (unsigned)want : 1u;
}

/* Launches kernel<<<grid, block, smem>>> on the default stream and checks the launch; a
 * failure names the call site. Under PX_CUDA_EMU the emulator runs it instead. */
template <typename... KArgs, typename... Args>
static void kern_launch(const char *file, int line, void (*kernel)(KArgs...), dim3 grid,
                        dim3 block, size_t smem, Args... args)
{
#ifdef PX_CUDA_EMU
    kern_emu_launch(file, line, (const void *)kernel, grid, block, smem,
                    [=]() { kernel(args...); });
#else
    kernel<<<grid, block, smem, 0>>>(args...);
    kern_cuda_check(cudaGetLastError(), file, line);
#endif
}
#define KLAUNCH(kernel, grid, block, smem, ...)                                                   \
    kern_launch(__FILE__, __LINE__, kernel, (grid), (block), (smem), __VA_ARGS__)
/* a grid-stride kernel over n items, KERN_THREADS a block */
#define KLAUNCH_N(kernel, n, ...)                                                                 \
    KLAUNCH(kernel, kern_grid((n), KERN_THREADS), KERN_THREADS, 0, __VA_ARGS__)

/* ---- matrix products (matmul.cu) ---- */

/* Row-major, batched: for i < batch, C_i[m,n] = alpha op(A_i) op(B_i) + beta C_i with op(A)
 * [m,k] (A stored [m,k], or [k,m] when trans_a) and op(B) [k,n] (B stored [k,n], or [n,k]);
 * lda, ldb, ldc are the row lengths as stored, strides the elements between batch members.
 * A and B hold ab_type, C holds c_type; fp32 accumulation. With beta = 0, C is not read. */
void kern_cuda_gemm(void *c, cudaDataType c_type, int ldc, long long stride_c, const void *a,
                    int lda, long long stride_a, const void *b, int ldb, long long stride_b,
                    cudaDataType ab_type, int m, int n, int k, int trans_a, int trans_b,
                    float alpha, float beta, int batch);

#endif
