/* The CUDA backend's tables (bf16 and fp16 activations, each with fp32 or 16-bit parameter
 * gradients; fp32 activations with fp32 gradients) and its memory functions, on the
 * context of context.cu. kern_cuda() must never crash a CPU-only machine: without a driver or a
 * device, cudaGetDeviceCount fails (or counts 0) and the backend is simply absent (NULL). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

/* bf16, fp16 with fp32 gradients; bf16, fp16 with their own; fp32 (its gradients fp32) */
static KernBackend tables[5];
static int ctx_ok;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT; /* pthread, not std::call_once: no libstdc++ */

/* ---- memory ---- */

/* One cudaMalloc per call (the executor's arena asks once per memory category), zero-filled
 * as kern_cpu's is. NULL when the device is out of memory; cudaMalloc's out-of-memory error is
 * not sticky, so it is read and cleared here and the caller may report it. */
static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    /* a unique pointer for 0 bytes, so that alloc(0) is not mistaken for a failure */
    size_t want = bytes ? bytes : 256;
    cudaError_t err = cudaMalloc(&p, want);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    cudaCheck(cudaMemset(p, 0, want));
    return p;
}

static void cuda_free(void *p)
{
    if (p)
        cudaCheck(cudaFree(p));
}

static void cuda_memset0(void *p, size_t bytes)
{
    if (bytes)
        cudaCheck(cudaMemsetAsync(p, 0, bytes, 0));
}

static void cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

/* cudaMemcpy with pageable host memory returns once the host buffer may be reused (to_device)
 * or holds the data (to_host), after the work queued before it. */
static void cuda_to_device(void *dst, const void *host, size_t bytes)
{
    if (bytes)
        cudaCheck(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice));
}

static void cuda_to_host(void *host, const void *src, size_t bytes)
{
    if (bytes)
        cudaCheck(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost));
}

/* The compute stream only: a communication layer's own streams (NCCL) keep running, so that a
 * gradient reduction can overlap the backward while the executor times its ops. */
static void cuda_sync(void) { cudaCheck(cudaStreamSynchronize(0)); }

/* ---- staging ---- */

static void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    size_t want = bytes ? bytes : 64;
    if (cudaMallocHost(&p, want) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    memset(p, 0, want);
    return p;
}

static void cuda_host_free(void *p)
{
    if (p)
        cudaCheck(cudaFreeHost(p));
}

static void cuda_to_device_async(void *dst, const void *host, size_t bytes)
{
    if (!bytes)
        return;
    const KernCudaCtx *ctx = kern_cuda_ctx();
    cudaCheck(cudaEventRecord(ctx->ev_compute, 0));
    cudaCheck(cudaStreamWaitEvent(ctx->copy_stream, ctx->ev_compute, 0));
    cudaCheck(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx->copy_stream));
    cudaCheck(cudaEventRecord(ctx->ev_copy, ctx->copy_stream));
}

/* ev_copy is recorded after the last copy; waiting for an event never recorded returns at once */
static void cuda_copy_wait(void)
{
    cudaCheck(cudaStreamWaitEvent(0, kern_cuda_ctx()->ev_copy, 0));
}

static void cuda_copy_sync(void) { cudaCheck(cudaEventSynchronize(kern_cuda_ctx()->ev_copy)); }

static int cuda_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    cudaCheck(cudaMemGetInfo(free_bytes, total_bytes));
    return 1;
}

/* ---- initialization ---- */

static void table_fill(KernBackend *k, PxDtype act, PxDtype grad)
{
#ifdef PX_CUDA_EMU
    k->name = "cuda-emu";
#else
    k->name = "cuda";
#endif
    k->act = act;
    k->grad = grad;
    k->alloc = cuda_alloc;
    k->free = cuda_free;
    k->memset0 = cuda_memset0;
    k->copy = cuda_copy;
    k->to_device = cuda_to_device;
    k->to_host = cuda_to_host;
    k->sync = cuda_sync;
    k->host_alloc = cuda_host_alloc;
    k->host_free = cuda_host_free;
    k->to_device_async = cuda_to_device_async;
    k->copy_wait = cuda_copy_wait;
    k->copy_sync = cuda_copy_sync;
    k->mem_info = cuda_mem_info;
    kern_cuda_table_matmul(k);
    kern_cuda_table_norms(k);
    kern_cuda_table_activations(k);
    kern_cuda_table_rope(k);
    kern_cuda_table_attention(k);
    kern_cuda_table_embedding(k);
    kern_cuda_table_xent(k);
    kern_cuda_table_optim(k);
    kern_cuda_table_misc(k);
    kern_cuda_table_moe(k);
    kern_cuda_table_fp8(k);
    kern_cuda_table_gate(k);
}

static void ctx_init(void)
{
    if (!kern_cuda_ctx_open())
        return;
    table_fill(&tables[0], PX_BF16, PX_FP32);
    table_fill(&tables[1], PX_FP16, PX_FP32);
    table_fill(&tables[2], PX_BF16, PX_BF16);
    table_fill(&tables[3], PX_FP16, PX_FP16);
    table_fill(&tables[4], PX_FP32, PX_FP32);
    ctx_ok = 1;
}

extern "C" const KernBackend *kern_cuda_with_grads(PxDtype act, PxDtype grad)
{
    if ((act != PX_BF16 && act != PX_FP16 && act != PX_FP32) || (grad != PX_FP32 && grad != act))
        return NULL;
    pthread_once(&ctx_once, ctx_init);
    if (!ctx_ok)
        return NULL;
    if (act == PX_FP32)
        return &tables[4];
    return &tables[(act == PX_BF16 ? 0 : 1) + (grad == PX_FP32 ? 0 : 2)];
}

extern "C" const KernBackend *kern_cuda_with(PxDtype act)
{
    return kern_cuda_with_grads(act, PX_FP32);
}

extern "C" const KernBackend *kern_cuda(void) { return kern_cuda_with(PX_BF16); }

extern "C" int kern_cuda_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count > 0 ? count : 0;
}

extern "C" int kern_cuda_set_device(int device)
{
    if (device < 0 || device >= kern_cuda_device_count() || cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        return PX_ERUNTIME;
    }
    return PX_OK;
}

extern "C" int kern_cuda_device_bus_id(char *buf, size_t cap)
{
    int dev = 0;
    if (cap == 0)
        return PX_ERUNTIME;
    buf[0] = '\0';
    if (kern_cuda_device_count() == 0 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetPCIBusId(buf, cap > 64 ? 64 : (int)cap, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        buf[0] = '\0';
        return PX_ERUNTIME;
    }
    return PX_OK;
}

extern "C" int kern_cuda_device_name(char *buf, size_t cap)
{
    int dev = 0;
    cudaDeviceProp prop;
    if (cap == 0)
        return PX_ERUNTIME;
    buf[0] = '\0';
    if (kern_cuda_device_count() == 0 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return PX_ERUNTIME;
    }
    snprintf(buf, cap, "%s", prop.name);
    return PX_OK;
}
