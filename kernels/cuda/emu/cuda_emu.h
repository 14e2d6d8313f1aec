/* cuda_emu — just enough of the CUDA runtime, the device intrinsics, cuBLAS and cuBLASLt to run
 * the kernels of kernels/cuda on a CPU, so that their indexing, their barriers and shuffles, and the
 * row-major-to-cuBLAS mapping are tested on machines without a GPU (CI). Not a simulator of
 * performance or of the memory model: blocks run one after another, and the threads of a block
 * run as fibers (ucontext) that switch only at __syncthreads, __syncwarp and shuffles, so a
 * race between two threads that a barrier should have ordered goes unnoticed. What it does
 * check, and aborts on with the call site: launch configurations (block and grid limits,
 * dynamic shared memory beyond 48 KiB without cudaFuncSetAttribute), __syncthreads reached by
 * only part of a block or after some of its threads returned, shuffles and __syncwarp with
 * lanes missing (divergence), cuBLAS arguments that cuBLAS would reject (leading dimensions,
 * types) and GEMM operands outside their allocations, copies between the wrong kinds of memory,
 * and host code touching device memory: each allocation is a mapping closed to the host outside
 * the emulator's own kernels, copies and GEMMs, between guard pages, its slack poisoned for
 * AddressSanitizer, which so catches a kernel's out-of-bounds access (cuda_emu.cpp).
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

/* ---- 8-bit floats (cuda_fp8.h): the two conversions the FP8 kernels use, on common/px.h's
 * host codecs. __NV_SATFINITE only (what kernels/cuda asks for); a NaN becomes 0x7f whatever
 * its sign, as the device's cvt.rn.satfinite does. The decode goes through __half_raw, so a
 * kernel writes __half2float(__nv_cvt_fp8_to_halfraw(q, t)) under both compilers. ---- */

typedef unsigned char __nv_fp8_storage_t;
typedef enum { __NV_NOSAT = 0, __NV_SATFINITE = 1 } __nv_saturation_t;
typedef enum { __NV_E4M3 = 0, __NV_E5M2 = 1 } __nv_fp8_interpretation_t;
struct __half_raw {
    unsigned short x;
};
__nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat,
                                         __nv_fp8_interpretation_t fmt);
__half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t fmt);
static inline float __half2float(__half_raw h) { return __half2float(__half{h.x}); }

/* bit casts */
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE division rounded to nearest even (the host's float division) */
static inline float __fdiv_rn(float a, float b) { return a / b; }

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
static inline unsigned atomicMax(unsigned *p, unsigned v)
{
    unsigned old = *p;
    *p = old > v ? old : v;
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
typedef enum {
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
    CUDA_R_8F_E4M3 = 28,
    CUDA_R_8F_E5M2 = 29,
} cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
} cublasMath_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
/* Kept per handle: a GEMM with a bf16 or fp16 output on a handle without
 * CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION aborts, since cuBLAS may then add split-K
 * partial sums in the output type, which no emulated GEMM (one fp32 sum) would show; so does a
 * GEMM of fp32 operands on a CUBLAS_TF32_TENSOR_OP_MATH handle (TF32's rounded operands). */
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
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

/* ---- cuBLASLt: the FP8 GEMM of kernels/cuda/fp8.cu and nothing more. One matmul descriptor
 * (compute 32F, scale type 32F) with TRANSA, TRANSB and the A and B scale pointers (device
 * fp32 decode factors); matrix layouts of type, rows, cols, ld (column-major, no batching);
 * cublasLtMatmul with algo NULL, which computes D = alpha * scale_A * scale_B * op(A) op(B) +
 * beta * C in fp32 from the decoded FP8 values. It rejects, as cuBLASLt on sm_90 does, what is
 * not an FP8 "TN" GEMM (A transposed, B not), E5M2 x E5M2, leading dimensions that are not
 * multiples of 16, and operands that are not 16-byte aligned; C and D must be the same matrix
 * type (bf16, fp16 or fp32). ---- */

typedef struct KernEmuLt *cublasLtHandle_t;
typedef struct KernEmuLtDesc *cublasLtMatmulDesc_t;
typedef struct KernEmuLtLayout *cublasLtMatrixLayout_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
} cublasLtMatmulDescAttributes_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t bytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream);

#endif
