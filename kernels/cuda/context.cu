/* The CUDA backend's context and its checks: the device's limits, one cuBLAS and one cuBLASLt handle, a grow-only workspace, the
 * reduction scratch and the copy stream, which every kernel file and the table (backend.cu)
 * use. It sits below both, so that a kernel file depends on nothing that depends on it. */
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

[[noreturn]] void kern_cuda_fatal(const char *file, int line, const char *what)
{
    fprintf(stderr, "parallax: %s:%d: CUDA kernel contract violated: %s\n", file, line, what);
    abort();
}

void kern_cuda_check(cudaError_t err, const char *file, int line)
{
    if (err == cudaSuccess)
        return;
    fprintf(stderr, "parallax: %s:%d: CUDA error %d: %s\n", file, line, (int)err,
            cudaGetErrorString(err));
    abort();
}

void kern_cublas_check(cublasStatus_t st, const char *file, int line)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return;
    fprintf(stderr, "parallax: %s:%d: cuBLAS error %d: %s\n", file, line, (int)st,
            cublasGetStatusString(st));
    abort();
}

static KernCudaCtx ctx;

const KernCudaCtx *kern_cuda_ctx(void) { return &ctx; }

void kern_cuda_smem_optin(const void *kernel, size_t bytes, const char *what)
{
    if (bytes > ctx.smem_optin) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "%s needs %zu bytes of shared memory per block; the device has %zu", what,
                 bytes, ctx.smem_optin);
        kern_cuda_fatal(__FILE__, __LINE__, msg);
    }
    if (bytes > ctx.smem_default)
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes));
}

static void *ws;
static size_t ws_bytes;

void *kern_cuda_workspace(size_t bytes)
{
    if (bytes <= ws_bytes)
        return ws;
    cudaCheck(cudaFree(ws));
    ws = NULL;
    ws_bytes = 0;
    cudaCheck(cudaMalloc(&ws, bytes));
    ws_bytes = bytes;
    return ws;
}

int kern_cuda_ctx_open(void)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count <= 0) {
        (void)cudaGetLastError(); /* no driver or no device: no backend, and no sticky error */
        return 0;
    }
    cudaCheck(cudaGetDevice(&ctx.device));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, ctx.device));
    ctx.cc = prop.major * 10 + prop.minor;
    ctx.sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    ctx.smem_default = prop.sharedMemPerBlock;
    ctx.smem_optin = prop.sharedMemPerBlockOptin > prop.sharedMemPerBlock
                         ? prop.sharedMemPerBlockOptin
                         : prop.sharedMemPerBlock;
    cublasCheck(cublasCreate(&ctx.blas));
    cublasCheck(cublasSetStream(ctx.blas, 0));
    /* With a bf16 or fp16 output cuBLAS may split k and add the partial products in the output
     * type, a rounding per split: beyond the one rounding of an fp32 accumulation that the
     * backend promises (docs/gpu.md) and its tests allow (1.5 u). Disallowed: the partial sums
     * stay in fp32 (split-K, if chosen, reduces in the compute type). No TF32: the default
     * math with CUBLAS_COMPUTE_32F multiplies fp32 operands in full fp32, which is what the
     * simulator prices an fp32 plan at (the device's fp32 peak, not its TF32 one; docs/gpu.md).
     * Transformer Engine differs here: its cuBLASLt GEMM takes CUBLAS_COMPUTE_32F_FAST_TF32
     * when A, B and D are all fp32 (common/gemm/cublaslt_gemm.cu). */
    const int math = CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    cublasCheck(cublasSetMathMode(ctx.blas, (cublasMath_t)math));
    cublasCheck(cublasLtCreate(&ctx.lt));
    cudaCheck(cudaMalloc((void **)&ctx.sum, sizeof *ctx.sum));
    cudaCheck(cudaMalloc((void **)&ctx.flag, sizeof *ctx.flag));
    cudaCheck(cudaStreamCreateWithFlags(&ctx.copy_stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&ctx.ev_compute, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&ctx.ev_copy, cudaEventDisableTiming));
    return 1;
}
