/* cuda_emu: see cuda_emu.h. The scheduler runs a block's threads as fibers in thread order;
 * each runs until it reaches a barrier (or returns). When every live thread of the block waits
 * at __syncthreads, all are released; when every lane of a warp waits at a warp barrier (the
 * two halves of a shuffle, __syncwarp), that warp is released. Anything else that leaves no
 * thread able to run is a deadlock on a GPU too, and aborts with the states of the threads. */
#include "kernels/cuda/emu/cuda_emu.h"

#include <map>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
unsigned char *kern_emu_dyn_smem;

[[noreturn]] __attribute__((format(printf, 3, 4))) static void
emu_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "parallax: cuda_emu: %s:%d: ", file ? file : "(runtime)", line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* ---- 16-bit floats ---- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float __bfloat162float(__nv_bfloat16 h) { return u2f((uint32_t)h.x << 16); }

__nv_bfloat16 __float2bfloat16(float f)
{
    uint32_t u = f2u(f);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN stays a (quiet) NaN */
        h.x = (uint16_t)((u >> 16) | 0x40);
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    h.x = (uint16_t)(u >> 16);
    return h;
}

float __half2float(__half h)
{
    const uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16;
    const int exp = (h.x >> 10) & 0x1f;
    const uint32_t man = h.x & 0x3ffu;
    if (exp == 0x1f)
        return u2f(sign | 0x7f800000u | (man << 13));
    if (exp == 0) /* zero and subnormals: man * 2^-24 */
        return sign ? -ldexpf((float)man, -24) : ldexpf((float)man, -24);
    return u2f(sign | ((uint32_t)(exp - 15 + 127) << 23) | (man << 13));
}

__half __float2half(float f)
{
    const uint32_t u = f2u(f), sign = (u >> 16) & 0x8000u;
    const float a = fabsf(f);
    __half h;
    if (a != a) {
        h.x = (uint16_t)(sign | 0x7e00u);
        return h;
    }
    if (a >= 65520.0f) { /* rounds to infinity */
        h.x = (uint16_t)(sign | 0x7c00u);
        return h;
    }
    if (a < 6.103515625e-05f) { /* subnormal half: a multiple of 2^-24, rounded to even */
        h.x = (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
        return h;
    }
    /* normal: keep 10 of the 23 mantissa bits, round to nearest even on the 13 dropped */
    uint32_t e = ((u >> 23) & 0xffu) - 127 + 15, m = u & 0x7fffffu;
    uint32_t r = (e << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u)))
        r++; /* a carry into the exponent is the correct next binade */
    h.x = (uint16_t)(sign | r);
    return h;
}

/* ---- memory: exact-size heap blocks, registered so that copies and GEMM operands can be
 * checked against them ---- */

static std::map<uintptr_t, size_t> allocs;
static cudaError_t last_error = cudaSuccess;

static int is_device(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin())
        return 0;
    --it;
    return a >= it->first && a - it->first + bytes <= it->second;
}

static void emu_check_range(const void *p, size_t bytes, const char *what)
{
    if (bytes && !is_device(p, bytes))
        emu_fail(NULL, 0, "%s: %zu bytes at %p are not inside one device allocation", what, bytes,
                 p);
}

cudaError_t cudaGetDeviceCount(int *count)
{
    /* PX_CUDA_EMU_NO_DEVICE=1 plays a machine without a GPU */
    const char *none = getenv("PX_CUDA_EMU_NO_DEVICE");
    if (none && *none && *none != '0') {
        *count = 0;
        return last_error = cudaErrorNoDevice;
    }
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device)
{
    (void)device;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuda_emu");
    prop->multiProcessorCount = 2; /* small grids: grid-stride loops run several rounds */
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = NULL;
    if (bytes == 0)
        return cudaSuccess; /* as CUDA: success and a NULL pointer */
    void *q = malloc(bytes);
    if (!q)
        return last_error = cudaErrorMemoryAllocation;
    memset(q, 0xA5, bytes); /* cudaMalloc does not zero: let a missing memset show */
    allocs[(uintptr_t)q] = bytes;
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end())
        emu_fail(NULL, 0, "cudaFree(%p): not a pointer that cudaMalloc returned", p);
    allocs.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    emu_check_range(p, bytes, "cudaMemset");
    if (bytes)
        memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream)
{
    (void)stream;
    return cudaMemset(p, value, bytes);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    if (bytes == 0)
        return cudaSuccess;
    const int dd = is_device(dst, bytes), sd = is_device(src, bytes);
    const int want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && (dd != want_dd || sd != want_sd))
        emu_fail(NULL, 0,
                 "cudaMemcpy kind %d, but the destination is %sdevice memory and the source "
                 "%sdevice memory",
                 (int)kind, dd ? "" : "not ", sd ? "" : "not ");
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    (void)stream;
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    }
    return "unknown error";
}

static std::map<const void *, int> smem_limit;

cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
        return last_error = cudaErrorInvalidValue;
    smem_limit[func] = value;
    return cudaSuccess;
}

/* ---- the scheduler ---- */

enum { F_READY, F_BLOCK_BAR, F_WARP_BAR, F_DONE };
enum { MAX_THREADS = 1024, STACK_BYTES = 256 * 1024 };

typedef struct {
    ucontext_t ctx;
    int state;
    uint3 tid;
    void *fake_stack; /* AddressSanitizer's bookkeeping across switches */
} Fiber;

static Fiber fibers[MAX_THREADS];
static unsigned char *stacks;
static int nthreads, cur;
static ucontext_t sched_ctx;
static const std::function<void()> *body;
static const char *launch_file;
static int launch_line;
static uint64_t shfl_slot[MAX_THREADS];
#ifdef EMU_ASAN
static const void *main_stack_bottom;
static size_t main_stack_size;
#endif

static void switch_to_fiber(int i)
{
    cur = i;
    threadIdx = fibers[i].tid;
#ifdef EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, stacks + (size_t)i * STACK_BYTES, STACK_BYTES);
#endif
    swapcontext(&sched_ctx, &fibers[i].ctx);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

/* from a fiber back to the scheduler; it resumes here when released */
static void yield_state(int state)
{
    Fiber *f = &fibers[cur];
    f->state = state;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake_stack, main_stack_bottom, main_stack_size);
#endif
    swapcontext(&f->ctx, &sched_ctx);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, &main_stack_bottom, &main_stack_size);
#endif
}

static void trampoline(void)
{
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &main_stack_bottom, &main_stack_size);
#endif
    (*body)();
    fibers[cur].state = F_DONE;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(NULL, main_stack_bottom, main_stack_size);
#endif
    setcontext(&sched_ctx);
}

void __syncthreads(void) { yield_state(F_BLOCK_BAR); }

void __syncwarp(unsigned mask)
{
    if (mask != 0xffffffffu)
        emu_fail(launch_file, launch_line, "__syncwarp with a partial mask is not emulated");
    yield_state(F_WARP_BAR);
}

uint64_t kern_emu_shfl(unsigned mask, uint64_t bits, int arg, int width, int xor_mode)
{
    if (mask != 0xffffffffu || width != 32)
        emu_fail(launch_file, launch_line, "shuffle with a partial mask or width is not emulated");
    const int me = cur, lane = me % 32, warp0 = me - lane;
    shfl_slot[me] = bits;
    yield_state(F_WARP_BAR); /* every lane has written its value */
    const int src = xor_mode ? (lane ^ arg) & 31 : arg & 31;
    uint64_t v = shfl_slot[warp0 + src];
    yield_state(F_WARP_BAR); /* every lane has read before a next shuffle overwrites */
    return v;
}

static void deadlock(void)
{
    fprintf(stderr, "parallax: cuda_emu: %s:%d: block (%u,%u,%u) cannot go on; thread states "
                    "(R ready, B __syncthreads, W warp barrier, D returned):\n  ",
            launch_file, launch_line, blockIdx.x, blockIdx.y, blockIdx.z);
    for (int i = 0; i < nthreads; i++)
        fputc("RBWD"[fibers[i].state], stderr);
    fputc('\n', stderr);
    abort();
}

/* Runs the current block to completion. */
static void run_block(void)
{
    for (int i = 0; i < nthreads; i++) {
        Fiber *f = &fibers[i];
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = stacks + (size_t)i * STACK_BYTES;
        f->ctx.uc_stack.ss_size = STACK_BYTES;
        f->ctx.uc_link = NULL;
        makecontext(&f->ctx, trampoline, 0);
        f->state = F_READY;
        f->fake_stack = NULL;
        f->tid.x = i % blockDim.x;
        f->tid.y = i / blockDim.x % blockDim.y;
        f->tid.z = i / (blockDim.x * blockDim.y);
    }
    for (;;) {
        for (int i = 0; i < nthreads; i++)
            if (fibers[i].state == F_READY)
                switch_to_fiber(i);
        int live = 0, at_block = 0;
        for (int i = 0; i < nthreads; i++) {
            live += fibers[i].state != F_DONE;
            at_block += fibers[i].state == F_BLOCK_BAR;
        }
        if (live == 0)
            return;
        if (at_block == live) {
            if (live != nthreads) /* undefined on a GPU: count on no hardware to forgive it */
                emu_fail(launch_file, launch_line,
                         "__syncthreads reached after %d of %d threads returned", nthreads - live,
                         nthreads);
            for (int i = 0; i < nthreads; i++)
                fibers[i].state = F_READY;
            continue;
        }
        int released = 0;
        for (int w = 0; w * 32 < nthreads; w++) {
            const int lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads;
            int at_warp = 0, done = 0;
            for (int i = lo; i < hi; i++) {
                at_warp += fibers[i].state == F_WARP_BAR;
                done += fibers[i].state == F_DONE;
            }
            if (at_warp == 0 || at_warp + done != hi - lo)
                continue;
            if (done)
                emu_fail(launch_file, launch_line,
                         "a shuffle or __syncwarp in warp %d after %d of its lanes returned", w,
                         done);
            for (int i = lo; i < hi; i++)
                fibers[i].state = F_READY;
            released = 1;
        }
        if (!released)
            deadlock();
    }
}

void kern_emu_launch(const char *file, int line, const void *kernel, dim3 grid, dim3 block,
                     size_t smem, const std::function<void()> &fn)
{
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > MAX_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64)
        emu_fail(file, line, "launch: a block of %u x %u x %u threads is invalid", block.x,
                 block.y, block.z);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
        grid.z > 65535)
        emu_fail(file, line, "launch: a grid of %u x %u x %u blocks is invalid", grid.x, grid.y,
                 grid.z);
    size_t limit = 48 * 1024;
    auto it = smem_limit.find(kernel);
    if (it != smem_limit.end() && (size_t)it->second > limit)
        limit = (size_t)it->second;
    if (smem > limit)
        emu_fail(file, line,
                 "launch: %zu bytes of dynamic shared memory, above the kernel's limit of %zu "
                 "(cudaFuncSetAttribute raises it)",
                 smem, limit);
    if (!stacks) {
        stacks = (unsigned char *)mmap(NULL, (size_t)MAX_THREADS * STACK_BYTES,
                                       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (stacks == MAP_FAILED)
            emu_fail(file, line, "no memory for fiber stacks");
    }
#ifdef EMU_ASAN
    /* frames that a fiber left by switching away, not by returning, are still poisoned */
    ASAN_UNPOISON_MEMORY_REGION(stacks, (size_t)MAX_THREADS * STACK_BYTES);
#endif
    /* a fresh, exact-size buffer per block: ASan sees overruns, and no block sees another's
     * leftovers (0xA5 rather than zeros, so a read before write shows) */
    unsigned char *dyn = (unsigned char *)malloc(smem ? smem : 1);
    body = &fn;
    launch_file = file;
    launch_line = line;
    nthreads = (int)threads;
    blockDim = block;
    gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx.x = x, blockIdx.y = y, blockIdx.z = z;
                memset(dyn, 0xA5, smem ? smem : 1);
                kern_emu_dyn_smem = dyn;
                run_block();
            }
    free(dyn);
    kern_emu_dyn_smem = NULL;
}

/* ---- cuBLAS: a plain column-major GEMM with cuBLAS's argument rules ---- */

struct KernEmuBlas {
    int unused;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    static KernEmuBlas h;
    *handle = &h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    (void)stream;
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *cublasGetStatusString(cublasStatus_t st)
{
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "unknown cuBLAS status";
}

static size_t dt_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

static float dt_load(const void *p, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    if (t == CUDA_R_16BF)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return __half2float(((const __half *)p)[i]);
}

static void dt_store(void *p, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else if (t == CUDA_R_16BF)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
    else
        ((__half *)p)[i] = __float2half(v);
}

/* bytes spanned by a column-major rows x cols matrix with leading dimension ld */
static size_t span(int rows, int cols, int ld, cudaDataType t)
{
    if (rows == 0 || cols == 0)
        return 0;
    return ((size_t)(cols - 1) * ld + rows) * dt_bytes(t);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long strideA,
    const void *B, cudaDataType Btype, int ldb, long long strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long strideC, int batchCount, cublasComputeType_t compute,
    cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    const int ar = transa == CUBLAS_OP_N ? m : k, ac = transa == CUBLAS_OP_N ? k : m;
    const int br = transb == CUBLAS_OP_N ? k : n, bc = transb == CUBLAS_OP_N ? n : k;
    if (m < 0 || n < 0 || k < 0 || batchCount < 0 || lda < (ar > 1 ? ar : 1) ||
        ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (compute != CUBLAS_COMPUTE_32F || Atype != Btype ||
        (Atype != CUDA_R_16BF && Atype != CUDA_R_16F) || (Ctype != Atype && Ctype != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    for (int b = 0; b < batchCount; b++) {
        const unsigned char *Ab = (const unsigned char *)A + (size_t)b * strideA * dt_bytes(Atype);
        const unsigned char *Bb = (const unsigned char *)B + (size_t)b * strideB * dt_bytes(Btype);
        unsigned char *Cb = (unsigned char *)C + (size_t)b * strideC * dt_bytes(Ctype);
        if (k > 0) {
            emu_check_range(Ab, span(ar, ac, lda, Atype), "cuBLAS GEMM operand A");
            emu_check_range(Bb, span(br, bc, ldb, Btype), "cuBLAS GEMM operand B");
        }
        emu_check_range(Cb, span(m, n, ldc, Ctype), "cuBLAS GEMM operand C");
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float acc = 0.0f;
                for (int l = 0; l < k; l++) {
                    const size_t ia = transa == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda
                                                             : (size_t)l + (size_t)i * lda;
                    const size_t ib = transb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb
                                                             : (size_t)j + (size_t)l * ldb;
                    acc += dt_load(Ab, Atype, ia) * dt_load(Bb, Btype, ib);
                }
                const size_t ic = (size_t)i + (size_t)j * ldc;
                /* beta = 0: C is not read (it may hold NaN), as cuBLAS documents */
                const float v = al * acc + (be == 0.0f ? 0.0f : be * dt_load(Cb, Ctype, ic));
                dt_store(Cb, Ctype, ic, v);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B,
                                      Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, compute, algo);
}
