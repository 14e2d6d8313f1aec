/* cuda_emu_runtime — the part of kernels/cuda/emu's CUDA runtime that C code calls as well:
 * types and functions with C linkage, so that exec/comm/nccl.c, which is C, compiles and runs
 * against the emulator (through kernels/cuda/emu/include's cuda_runtime_api.h) as it does
 * against CUDA. cuda_emu.h includes it for the kernels. */
#ifndef KERN_CUDA_EMU_RUNTIME_H
#define KERN_CUDA_EMU_RUNTIME_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600,
} cudaError_t;
typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
/* Streams: the legacy default stream (0) runs everything at once, in issue order. A stream
 * made with cudaStreamCreateWithFlags (non-blocking only: a blocking stream would serialize
 * with the legacy one) defers its work until something waits for it (an event it recorded,
 * cudaStreamSynchronize, cudaDeviceSynchronize): so a kernel that reads a copy's destination
 * without waiting for the copy reads what was there before, as it might on a GPU, and a host
 * buffer rewritten before the copy was waited for changes what the copy delivers. */
typedef struct KernEmuStream *cudaStream_t;
typedef struct KernEmuEvent *cudaEvent_t;
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
enum { cudaEventDefault = 0, cudaEventDisableTiming = 2 };
typedef struct {
    char name[256];
    int major, minor; /* compute capability: the emulator plays 9.0 (Hopper) */
    int multiProcessorCount;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
} cudaDeviceProp;

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value);

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);

/* An operation of a communication library on a non-default stream (the emulated NCCL): when it
 * reaches the head of the stream, start(arg) issues it; test(arg) returns nonzero once it is
 * complete, then finish(arg) releases it and the stream goes on. Unlike a copy, which waits to
 * be waited for, it starts as soon as the stream gets to it, as a GPU would start it, and every
 * wait of the emulator keeps all such operations moving while it waits. */
void kern_emu_enqueue_op(cudaStream_t stream, void (*start)(void *), int (*test)(void *),
                         void (*finish)(void *), void *arg);
/* Moves every stream's operations along without waiting for any: what a GPU keeps doing while
 * the host waits in a library call (the emulated NCCL's connection of a pair, for one). */
void kern_emu_progress(void);

#ifdef __cplusplus
}
#endif

#endif
