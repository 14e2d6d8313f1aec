/* cuda_emu — just enough of the CUDA runtime, the device intrinsics and cuBLAS to run the
 * kernels of kernels/cuda on a CPU, so that their indexing, their barriers and shuffles, and the
 * row-major-to-cuBLAS mapping are tested on machines without a GPU (CI). Not a simulator of
 * performance or of the memory model: blocks run one after another, and the threads of a block
 * run as fibers (ucontext) that switch only at __syncthreads, __syncwarp and shuffles, so a
 * race between two threads that a barrier should have ordered goes unnoticed. What it does
 * check, and aborts on with the call site: launch configurations (block and grid limits,
 * dynamic shared memory beyond 48 KiB without cudaFuncSetAttribute), __syncthreads reached by
 * only part of a block or after some of its threads returned, shuffles and __syncwarp with
 * lanes missing (divergence), cuBLAS arguments that cuBLAS would reject (leading dimensions,
 * types) and GEMM operands outside their allocations, and copies between the wrong kinds of
 * memory. Device allocations are plain heap blocks of the exact size, so a build with
 * AddressSanitizer catches a kernel's out-of-bounds access.
 *
 * Compiled in by kernels/cuda/common.cuh when PX_CUDA_EMU is defined (kernels/CMakeLists.txt
 * builds px_kernels_emu and test_kernels_cuda_emu that way). */
#ifndef KERN_CUDA_EMU_H
#define KERN_CUDA_EMU_H

#include <functional>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* one block runs at a time, so a static is exactly one block's shared variable */
#define __shared__ static

/* ---- built-in variables (set by the scheduler before it resumes a thread) ---- */

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

/* ---- 16-bit floats: storage and round-to-nearest-even conversions ---- */

struct __nv_bfloat16 {
    uint16_t x;
};
struct __half {
    uint16_t x;
};
float __bfloat162float(__nv_bfloat16 h);
__nv_bfloat16 __float2bfloat16(float f);
float __half2float(__half h);
__half __float2half(float f);

/* ---- runtime ---- */

#include "kernels/cuda/emu/cuda_emu_runtime.h"

/* Work for a non-default stream (a copy, or a communication library's operation): run at once
 * on stream 0, else queued until waited for. The emulated NCCL uses it. */
void kern_emu_enqueue(cudaStream_t stream, const std::function<void()> &work);

/* ---- device functions ---- */

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
uint64_t kern_emu_shfl(unsigned mask, uint64_t bits, int lane_arg, int width, int xor_mode);

template <typename V> static inline V kern_emu_shfl_t(unsigned mask, V v, int arg, int width, int x)
{
    static_assert(sizeof(V) <= 8, "shuffle of more than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = kern_emu_shfl(mask, bits, arg, width, x);
    memcpy(&v, &bits, sizeof v);
    return v;
}
template <typename V> static inline V __shfl_xor_sync(unsigned mask, V v, int m, int width = 32)
{
    return kern_emu_shfl_t(mask, v, m, width, 1);
}
template <typename V> static inline V __shfl_sync(unsigned mask, V v, int src, int width = 32)
{
    return kern_emu_shfl_t(mask, v, src, width, 0);
}

/* one thread runs at a time: a plain read-modify-write is atomic */
static inline float atomicAdd(float *p, float v)
{
    float old = *p;
    *p = old + v;
    return old;
}
static inline double atomicAdd(double *p, double v)
{
    double old = *p;
    *p = old + v;
    return old;
}
static inline int atomicAdd(int *p, int v)
{
    int old = *p;
    *p = old + v;
    return old;
}

extern unsigned char *kern_emu_dyn_smem;
template <typename T> static inline T *dyn_smem() { return (T *)kern_emu_dyn_smem; }

/* Runs body once per thread of every block of grid; aborts naming file:line on a bad launch
 * configuration, a barrier mismatch or a deadlock. */
void kern_emu_launch(const char *file, int line, const void *kernel, dim3 grid, dim3 block,
                     size_t smem, const std::function<void()> &body);

/* ---- cuBLAS ---- */

typedef struct KernEmuBlas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
const char *cublasGetStatusString(cublasStatus_t st);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long strideA,
    const void *B, cudaDataType Btype, int ldb, long long strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long strideC, int batchCount, cublasComputeType_t compute,
    cublasGemmAlgo_t algo);

#endif
