/* cuda_emu: see cuda_emu.h. The scheduler runs a block's threads as fibers in thread order;
 * each runs until it reaches a barrier (or returns). When every live thread of the block waits
 * at __syncthreads, all are released; when every lane of a warp waits at a warp barrier (the
 * two halves of a shuffle, __syncwarp), that warp is released. Anything else that leaves no
 * thread able to run is a deadlock on a GPU too, and aborts with the states of the threads. */
#include "kernels/cuda/emu/cuda_emu.h"

#include "common/px.h"

#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <vector>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

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

/* ---- 16-bit floats: common/px.h's conversions (the same bits for every input), except
 * __half2float, which keeps a NaN's payload as the device does ---- */

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float __bfloat162float(__nv_bfloat16 h) { return px_bf16_to_float(h.x); }

__nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{px_float_to_bf16(f)}; }

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

__half __float2half(float f) { return __half{px_float_to_half(f)}; }

__nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat,
                                         __nv_fp8_interpretation_t fmt)
{
    if (sat != __NV_SATFINITE)
        emu_fail(NULL, 0, "__nv_cvt_float_to_fp8: only __NV_SATFINITE is emulated");
    if (x != x)
        return 0x7f;
    return fmt == __NV_E5M2 ? px_float_to_e5m2(x) : px_float_to_e4m3(x);
}

/* every E4M3 and E5M2 value is exact in fp16 */
__half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t fmt)
{
    const float f = fmt == __NV_E5M2 ? px_e5m2_to_float(x) : px_e4m3_to_float(x);
    return __half_raw{px_float_to_half(f)};
}

static cudaError_t last_error = cudaSuccess;

/* ---- devices: PX_CUDA_EMU_DEVICES physical GPUs (1 by default), of which CUDA_VISIBLE_DEVICES
 * shows some, in its order, as the CUDA runtime does: device i of this process is physical GPU
 * visible[i], and cudaDeviceGetPCIBusId names the physical one, so that processes which see
 * the same GPU under different indices (or each its own under index 0) can tell. ---- */

static int current_device;

/* The physical index of visible device `device`, or -1 (no such device). */
static int physical_device(int device)
{
    const char *none = getenv("PX_CUDA_EMU_NO_DEVICE");
    if (none && *none && *none != '0')
        return -1;
    const char *n = getenv("PX_CUDA_EMU_DEVICES");
    const int phys = n && atoi(n) > 0 ? atoi(n) : 1;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis)
        return device >= 0 && device < phys ? device : -1;
    /* a comma-separated list, read up to its first entry that names no device (as CUDA does) */
    int i = 0;
    for (const char *s = vis; *s;) {
        char *end = NULL;
        const long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v >= phys || (*end && *end != ','))
            break;
        if (i++ == device)
            return (int)v;
        s = *end ? end + 1 : end;
    }
    return -1;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    int n = 0;
    while (physical_device(n) >= 0)
        n++;
    *count = n;
    return n ? cudaSuccess : (last_error = cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int *device)
{
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (physical_device(device) < 0)
        return last_error = cudaErrorInvalidDevice;
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device)
{
    const int p = physical_device(device);
    if (p < 0 || len <= 0)
        return last_error = cudaErrorInvalidDevice;
    snprintf(bus_id, (size_t)len, "0000:%02x:00.0", 0x18 + p);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device)
{
    (void)device;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuda_emu");
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 2; /* small grids: grid-stride loops run several rounds */
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    return cudaSuccess;
}

/* ---- device memory: pages the host cannot touch ----
 *
 * On a GPU, host code that dereferences a device pointer faults. So here: each allocation is a
 * mapping of its own, inaccessible (PROT_NONE) while host code runs. The emulator's own work --
 * a kernel, a copy, a memset, a GEMM, a communication library's operation -- runs inside a
 * "device window" (EmuWindow), and its first access to a part of an allocation faults into
 * on_segv, which opens that part (OPEN_BYTES around the fault, within the allocation) until the
 * outermost window closes: opening and closing cost in proportion to what the work touched,
 * not to the allocation (an arena of hundreds of MiB). A fault on device memory
 * outside a window is host code reading or writing it: reported with the allocation, and the
 * process aborts. The data ends where its pages end, 256-byte aligned (cudaMalloc's alignment),
 * between two guard pages that are never opened, so that an access beyond the rounded size
 * faults too, inside a window or not; under AddressSanitizer the slack between the data and
 * the guards is poisoned, which makes the bounds exact. A window belongs to one host thread
 * (thread_local): another thread's access faults and is reported, unless the allocation
 * happens to be open for the window at that moment. ---- */

struct EmuAlloc {
    size_t bytes;
    unsigned char *map; /* the mapping: guard page, data pages, guard page */
    size_t map_bytes;
};

/* a part of an allocation that a window opened */
struct EmuOpen {
    unsigned char *lo;
    size_t bytes;
};

enum { OPEN_BYTES = 64 * 1024, OPEN_MAX = 1 << 16 };

static std::map<uintptr_t, EmuAlloc> allocs; /* by the pointer cudaMalloc returned */
static EmuOpen opened[OPEN_MAX];             /* the window's; fixed: the handler never allocates */
static size_t n_opened;
static int all_opened; /* the table overflowed: whole allocations were opened too */
/* volatile, with signal fences below: the compiler must not move the window's count across a
 * memset or memmove of device memory, which it knows touch nothing else */
static thread_local volatile int window_depth;
static size_t page_bytes;
static struct sigaction prev_segv;
static const char *kernel_file; /* the kernel running, for a fault's message */
static int kernel_line;

static int is_device(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin())
        return 0;
    --it;
    return a >= it->first && a - it->first + bytes <= it->second.bytes;
}

static void emu_check_range(const void *p, size_t bytes, const char *what)
{
    if (bytes && !is_device(p, bytes))
        emu_fail(NULL, 0, "%s: %zu bytes at %p are not inside one device allocation", what, bytes,
                 p);
}

/* The allocation whose mapping holds address a (its guards included), or NULL; *ptr gets the
 * pointer cudaMalloc returned for it. */
static EmuAlloc *mapping_of(uintptr_t a, uintptr_t *ptr)
{
    auto it = allocs.upper_bound(a);
    for (int k = 0; k < 2; k++) {
        if (it != allocs.end()) {
            EmuAlloc &m = it->second;
            if (a >= (uintptr_t)m.map && a < (uintptr_t)m.map + m.map_bytes) {
                *ptr = it->first;
                return &m;
            }
        }
        if (it == allocs.begin())
            break;
        --it;
    }
    return NULL;
}

/* write(2) rather than stdio: the fault may have happened inside stdio */
__attribute__((format(printf, 1, 2))) static void segv_say(const char *fmt, ...)
{
    char buf[640];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0 && write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1) < 0)
        _exit(134);
}

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    const uintptr_t a = (uintptr_t)si->si_addr;
    uintptr_t ptr = 0;
    EmuAlloc *m = mapping_of(a, &ptr);
    if (!m) {
        /* not device memory: whoever handled it before (by default a core dump) */
        sigaction(sig, &prev_segv, NULL);
        return;
    }
    const uintptr_t lo = (uintptr_t)m->map + page_bytes;
    const uintptr_t hi = (uintptr_t)m->map + m->map_bytes - page_bytes;
    if (window_depth > 0 && a >= lo && a < hi) {
        /* the OPEN_BYTES-aligned part around the fault; when the table is full (a window that
         * touched gigabytes), the whole allocation, and the window's end closes every one */
        uintptr_t plo = a & ~(uintptr_t)(OPEN_BYTES - 1), phi = plo + OPEN_BYTES;
        if (plo < lo)
            plo = lo;
        if (phi > hi)
            phi = hi;
        if (n_opened < OPEN_MAX && mprotect((void *)plo, phi - plo, PROT_READ | PROT_WRITE) == 0) {
            opened[n_opened].lo = (unsigned char *)plo;
            opened[n_opened].bytes = phi - plo;
            n_opened++;
            return;
        }
        if (n_opened == OPEN_MAX && mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) == 0) {
            all_opened = 1;
            return;
        }
    }
    if (window_depth > 0 && kernel_file)
        segv_say("parallax: cuda_emu: %s:%d: the kernel launched here ", kernel_file, kernel_line);
    else if (window_depth > 0)
        segv_say("parallax: cuda_emu: a copy, memset, GEMM or communication ");
    else
        segv_say("parallax: cuda_emu: host code (not a kernel, copy or memset) ");
    if (a < ptr)
        segv_say("touched %p, %zu bytes before the device allocation of %zu bytes at %p\n",
                 (void *)a, (size_t)(ptr - a), m->bytes, (void *)ptr);
    else if (a >= ptr + m->bytes)
        segv_say("touched %p, %zu bytes past the end of the device allocation of %zu bytes at "
                 "%p\n", (void *)a, (size_t)(a - ptr - m->bytes), m->bytes, (void *)ptr);
    else
        segv_say("touched %p, byte %zu of the device allocation of %zu bytes at %p: on a GPU "
                 "host code cannot read or write device memory; copy it (cudaMemcpy, kernels.h's "
                 "to_host and to_device)\n", (void *)a, (size_t)(a - ptr), m->bytes, (void *)ptr);
    signal(SIGABRT, SIG_DFL);
    abort();
}

/* Makes on_segv the SIGSEGV handler; again after someone else took it over (MPI installs its
 * own at MPI_Init), keeping theirs for the faults that are not on device memory. */
static void install_segv(void)
{
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
        cur.sa_sigaction == on_segv)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &prev_segv);
}

/* Closes what the window opened (the outermost one, on its way out). */
static void close_opened(void)
{
    for (size_t i = 0; i < n_opened; i++)
        if (mprotect(opened[i].lo, opened[i].bytes, PROT_NONE) != 0)
            emu_fail(NULL, 0, "mprotect: cannot close the device memory at %p",
                     (void *)opened[i].lo);
    n_opened = 0;
    for (auto &a : allocs)
        if (all_opened &&
            mprotect(a.second.map + page_bytes, a.second.map_bytes - 2 * page_bytes, PROT_NONE) != 0)
            emu_fail(NULL, 0, "mprotect: cannot close the device memory at %p", (void *)a.first);
    all_opened = 0;
}

struct EmuWindow {
    EmuWindow()
    {
        window_depth = window_depth + 1;
        std::atomic_signal_fence(std::memory_order_seq_cst);
    }
    ~EmuWindow()
    {
        std::atomic_signal_fence(std::memory_order_seq_cst);
        window_depth = window_depth - 1;
        if (window_depth == 0 && (n_opened || all_opened))
            close_opened();
    }
    EmuWindow(const EmuWindow &) = delete;
    EmuWindow &operator=(const EmuWindow &) = delete;
};

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = NULL;
    if (bytes == 0)
        return cudaSuccess; /* as CUDA: success and a NULL pointer */
    if (!page_bytes)
        page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    install_segv();
    const size_t rounded = (bytes + 255) & ~(size_t)255;
    const size_t data = (rounded + page_bytes - 1) / page_bytes * page_bytes;
    const size_t map_bytes = data + 2 * page_bytes;
    void *map =
        mmap(NULL, map_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED)
        return last_error = cudaErrorMemoryAllocation;
    unsigned char *q = (unsigned char *)map + page_bytes + (data - rounded);
#ifdef EMU_ASAN
    ASAN_POISON_MEMORY_REGION((unsigned char *)map + page_bytes, data - rounded);
    ASAN_POISON_MEMORY_REGION(q + bytes, rounded - bytes);
#endif
    EmuAlloc &m = allocs[(uintptr_t)q];
    m.bytes = bytes;
    m.map = (unsigned char *)map;
    m.map_bytes = map_bytes;
    EmuWindow w;
    memset(q, 0xA5, bytes); /* cudaMalloc does not zero: let a missing memset show */
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
    const EmuAlloc m = it->second;
    for (size_t i = 0; i < n_opened;) /* (freed inside a window: not by parallax) */
        if (opened[i].lo >= m.map && opened[i].lo < m.map + m.map_bytes)
            opened[i] = opened[--n_opened];
        else
            i++;
    allocs.erase(it);
#ifdef EMU_ASAN
    /* the shadow outlives the mapping: a later mapping here must not start poisoned */
    ASAN_UNPOISON_MEMORY_REGION(m.map + page_bytes, m.map_bytes - 2 * page_bytes);
#endif
    munmap(m.map, m.map_bytes);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    emu_check_range(p, bytes, "cudaMemset");
    EmuWindow w;
    if (bytes)
        memset(p, value, bytes);
    return cudaSuccess;
}

/* ---- streams and events ---- */

/* A stream's work: a copy (lazy: it runs when something waits for it), or an operation of a
 * communication library (it starts when it reaches the head of the stream and completes on its
 * own; the emulator polls it). */
struct EmuItem {
    std::function<void()> run; /* a copy */
    void (*start)(void *);     /* an operation */
    int (*test)(void *);
    void (*finish)(void *);
    void *arg;
    int started;
};

struct KernEmuStream {
    std::deque<EmuItem> pending;
    unsigned long long issued, done; /* work items queued and completed so far */
};

struct KernEmuEvent {
    cudaStream_t stream; /* NULL: recorded on stream 0, or never (complete) */
    unsigned long long seq;
};

static std::set<cudaStream_t> streams;

/* Moves a stream's operations along without waiting: the one at the head starts, and leaves
 * when complete; a copy at the head waits to be waited for. */
static void stream_progress(cudaStream_t s)
{
    while (!s->pending.empty()) {
        EmuItem &w = s->pending.front();
        if (!w.start)
            return;
        if (!w.started) {
            w.started = 1;
            w.start(w.arg);
        }
        if (!w.test(w.arg))
            return;
        w.finish(w.arg);
        s->pending.pop_front();
        s->done++;
    }
}

static void progress_all(void)
{
    EmuWindow w;
    for (cudaStream_t s : streams)
        stream_progress(s);
}

/* Runs a stream's work up to item `upto` (its sequence number), copies included; while an
 * operation is not complete every stream's operations keep moving (the peer that this one
 * waits for may need one of them). */
static void stream_flush(cudaStream_t s, unsigned long long upto)
{
    EmuWindow w;
    while (s && s->done < upto && !s->pending.empty()) {
        EmuItem &w = s->pending.front();
        if (!w.start) {
            std::function<void()> run = w.run;
            s->pending.pop_front();
            s->done++;
            run();
            continue;
        }
        if (!w.started) {
            w.started = 1;
            w.start(w.arg);
        }
        if (w.test(w.arg)) {
            w.finish(w.arg);
            s->pending.pop_front();
            s->done++;
            continue;
        }
        progress_all();
    }
}

static void enqueue_item(cudaStream_t stream, const EmuItem &item)
{
    if (!streams.count(stream))
        emu_fail(NULL, 0, "work for a stream that cudaStreamCreateWithFlags did not make");
    stream->pending.push_back(item);
    stream->issued++;
    progress_all();
}

void kern_emu_enqueue(cudaStream_t stream, const std::function<void()> &work)
{
    if (!stream) {
        EmuWindow w;
        work();
        return;
    }
    EmuItem item = {work, NULL, NULL, NULL, NULL, 0};
    enqueue_item(stream, item);
}

void kern_emu_enqueue_op(cudaStream_t stream, void (*start)(void *), int (*test)(void *),
                         void (*finish)(void *), void *arg)
{
    EmuItem item = {std::function<void()>(), start, test, finish, arg, 0};
    if (!stream) {
        EmuWindow w;
        start(arg);
        while (!test(arg))
            progress_all();
        finish(arg);
        return;
    }
    enqueue_item(stream, item);
}

void kern_emu_progress(void) { progress_all(); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned flags, int priority)
{
    (void)priority; /* one stream runs at a time here */
    return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    *least = 0;
    *greatest = -5; /* as an H100 says */
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    if (flags != cudaStreamNonBlocking)
        emu_fail(NULL, 0, "cudaStreamCreateWithFlags(%u): only cudaStreamNonBlocking is emulated (a "
                          "blocking stream serializes with the legacy default stream)", flags);
    *stream = new KernEmuStream();
    streams.insert(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream || !streams.count(stream))
        return last_error = cudaErrorInvalidValue;
    stream_flush(stream, stream->issued); /* CUDA lets queued work finish */
    streams.erase(stream);
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    if (stream)
        stream_flush(stream, stream->issued);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    (void)flags;
    *event = new KernEmuEvent();
    (*event)->stream = NULL;
    (*event)->seq = 0;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (stream && !streams.count(stream))
        return last_error = cudaErrorInvalidValue;
    event->stream = stream;
    event->seq = stream ? stream->issued : 0;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    stream_flush(event->stream, event->seq);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    progress_all();
    return !event->stream || event->stream->done >= event->seq ? cudaSuccess : cudaErrorNotReady;
}

/* Stream 0 runs at once, so whatever waits on an event may need the event's work now: running
 * it here keeps issue order on every stream. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
    (void)flags;
    if (stream && !streams.count(stream))
        return last_error = cudaErrorInvalidValue;
    if (!stream || event->stream != stream)
        stream_flush(event->stream, event->seq);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream)
{
    emu_check_range(p, bytes, "cudaMemsetAsync");
    kern_emu_enqueue(stream, [=]() {
        if (bytes)
            memset(p, value, bytes);
    });
    return cudaSuccess;
}

/* ---- host memory: page-locked in CUDA, plain heap here ---- */

static std::map<uintptr_t, size_t> host_allocs;

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    if (!*p)
        return last_error = cudaErrorMemoryAllocation;
    host_allocs[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    auto it = host_allocs.find((uintptr_t)p);
    if (it == host_allocs.end())
        emu_fail(NULL, 0, "cudaFreeHost(%p): not a pointer that cudaMallocHost returned", p);
    host_allocs.erase(it);
    free(p);
    return cudaSuccess;
}

static int is_pinned(const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    auto it = host_allocs.upper_bound(a);
    if (it == host_allocs.begin())
        return 0;
    --it;
    return a >= it->first && a - it->first + bytes <= it->second;
}

/* An 80 GiB device (an H100's), less what is allocated: what cudaMemGetInfo would say beyond
 * the context's own memory. PX_CUDA_EMU_MEMORY=BYTES plays another size. The driver maps device
 * memory in 2 MiB pages and packs small allocations into pages it holds already, so on a GPU
 * free memory moves in steps of 2 MiB and a small allocation may not move it at all: played here
 * by counting what is allocated in whole 2 MiB pages (PX_CUDA_EMU_PAGE_BYTES=N counts in pages
 * of N bytes; 1 counts bytes exactly). */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    const char *m = getenv("PX_CUDA_EMU_MEMORY"), *pg = getenv("PX_CUDA_EMU_PAGE_BYTES");
    const size_t total = m && atoll(m) > 0 ? (size_t)atoll(m) : (size_t)80 << 30;
    const size_t page = pg && atoll(pg) > 0 ? (size_t)atoll(pg) : (size_t)2 << 20;
    size_t used = 0;
    for (auto &a : allocs)
        used += a.second.bytes;
    used = (used + page - 1) / page * page;
    *total_bytes = total;
    *free_bytes = used < total ? total - used : 0;
    return cudaSuccess;
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
    EmuWindow w;
    memmove(dst, src, bytes);
    return cudaSuccess;
}

/* An asynchronous copy from host memory must come from cudaMallocHost to be asynchronous on a
 * GPU (pageable memory makes it synchronous, silently): insisted on here. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    if (!stream)
        return cudaMemcpy(dst, src, bytes, kind);
    if (bytes && kind == cudaMemcpyHostToDevice && !is_pinned(src, bytes))
        emu_fail(NULL, 0, "cudaMemcpyAsync on a stream from %zu bytes of pageable memory at %p: "
                          "use cudaMallocHost", bytes, src);
    if (bytes && kind == cudaMemcpyDeviceToHost && !is_pinned(dst, bytes))
        emu_fail(NULL, 0, "cudaMemcpyAsync on a stream into %zu bytes of pageable memory at %p: "
                          "use cudaMallocHost", bytes, dst);
    /* the kinds are checked now, the copy runs when the stream is waited for */
    const int dd = is_device(dst, bytes), sd = is_device(src, bytes);
    const int want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (bytes && kind != cudaMemcpyDefault && (dd != want_dd || sd != want_sd))
        emu_fail(NULL, 0, "cudaMemcpyAsync kind %d, but the destination is %sdevice memory and "
                          "the source %sdevice memory",
                 (int)kind, dd ? "" : "not ", sd ? "" : "not ");
    kern_emu_enqueue(stream, [=]() {
        if (bytes)
            memmove(dst, src, bytes);
    });
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    for (cudaStream_t s : streams)
        stream_flush(s, s->issued);
    return cudaSuccess;
}

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
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
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
/* Where in its stack a fiber starts: up to 32 KiB below the top, 128 bytes more for each
 * thread. Stacks a power of two apart would put every fiber's frames in the same cache sets,
 * so that each switch missed the caches; staggered, a block's fibers share them. */
#define STACK_COLOR(i) ((size_t)((i) % 256) * 128)

/* Switching between fibers. glibc's swapcontext saves and restores the signal mask with a
 * system call each time, which made it most of the emulator's run time (the executor's tests
 * train whole models through it); on x86-64 a switch is instead the dozen instructions below,
 * which save the callee-saved registers on the running stack, store its pointer and load the
 * other's. The SSE and x87 control words are not switched: nothing in the emulator or the
 * kernels changes the rounding mode or the exception masks, so every fiber runs with the
 * process's, and loading them (ldmxcsr, fldcw) made four fifths of a switch's time. The slot
 * they took stays, so that the stack keeps its alignment. Elsewhere ucontext does the work. */
#if defined(__x86_64__)
#define EMU_FAST_SWITCH 1
extern "C" void kern_emu_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl kern_emu_switch\n"
        ".type kern_emu_switch, @function\n"
        "kern_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size kern_emu_switch, .-kern_emu_switch\n"
        ".section .note.GNU-stack,\"\",@progbits\n"
        ".text\n");
#endif

typedef struct {
#ifdef EMU_FAST_SWITCH
    void *sp; /* its saved stack pointer while it does not run */
#else
    ucontext_t ctx;
#endif
    int state;
    int stack; /* the index of the stack it runs on */
    uint3 tid;
    void *fake_stack; /* AddressSanitizer's bookkeeping across switches */
} Fiber;

static Fiber fibers[MAX_THREADS];
static unsigned char *stacks;
static int nthreads, cur;
/* Set while the block's first fiber runs its threads one after another (run_block): until one
 * of them waits at a barrier, a thread that returns hands the fiber to the next thread. */
static int run_plain;
/* Kept as the threads wait and return, so that a round's end need not look at every thread:
 * how many wait at __syncthreads and have returned, and per warp how many wait at a warp
 * barrier and have returned */
static int n_block_bar, n_done;
static int warp_bar[MAX_THREADS / 32], warp_done[MAX_THREADS / 32];
#ifdef EMU_FAST_SWITCH
static void *sched_sp;
#else
static ucontext_t sched_ctx;
#endif
static const std::function<void()> *body;
static const char *launch_file;
static int launch_line;
static uint64_t shfl_slot[MAX_THREADS]; /* a lane's value in a shuffle */
/* While a lane waits at a shuffle's first barrier: the thread whose value it reads (else -1),
 * and once the scheduler has read it, that value (run_block) */
static int shfl_src[MAX_THREADS];
static uint64_t shfl_got[MAX_THREADS];
#ifdef EMU_ASAN
static const void *main_stack_bottom;
static size_t main_stack_size;
#endif

#ifdef EMU_ASAN
/* set by the scheduler when it switches to a fiber: the fiber then learns the scheduler's stack
 * (a fiber may also be switched to by the fiber before it in the round) */
static int from_sched;

/* After a switch into a fiber: AddressSanitizer's fake stack back, and the scheduler's stack
 * when the scheduler switched here. */
static void asan_arrived(void *fake)
{
    const void *bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(fake, &bottom, &size);
    if (from_sched) {
        main_stack_bottom = bottom;
        main_stack_size = size;
        from_sched = 0;
    }
}
#endif

static void switch_to_fiber(int i)
{
    cur = i;
    threadIdx = fibers[i].tid;
#ifdef EMU_ASAN
    void *fake = NULL;
    from_sched = 1;
    __sanitizer_start_switch_fiber(&fake, stacks + (size_t)fibers[i].stack * STACK_BYTES,
                                   STACK_BYTES);
#endif
#ifdef EMU_FAST_SWITCH
    kern_emu_switch(&sched_sp, fibers[i].sp);
#else
    swapcontext(&sched_ctx, &fibers[i].ctx);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

#ifdef EMU_ASAN
/* How deep below its starting point a fiber has been when it switched away, the deepest of
 * all: the frames a switch leaves behind lie above it. */
static size_t switch_depth;

static void note_depth(void)
{
    unsigned char here;
    const int s = fibers[cur].stack;
    const unsigned char *top = stacks + (size_t)(s + 1) * STACK_BYTES - STACK_COLOR(s);
    const size_t depth = (size_t)(top - &here);
    if (depth > switch_depth)
        switch_depth = depth;
}
#endif

#ifdef EMU_FAST_SWITCH
typedef void *FiberSave; /* what a switch away from a fiber saves: its stack pointer */
static FiberSave *fiber_save(Fiber *f) { return &f->sp; }
static FiberSave dead_save;
#else
typedef ucontext_t FiberSave;
static FiberSave *fiber_save(Fiber *f) { return &f->ctx; }
static FiberSave dead_save;
#endif

/* From the running fiber (saved into *save; fake: AddressSanitizer's fake stack of it, NULL
 * when it is done) to the next thread of the round, the first ready one after it, else back to
 * the scheduler. A round runs the ready threads in order as the scheduler's loop would, a
 * switch each rather than two through the scheduler. */
static void leave_fiber(FiberSave *save, void **fake)
{
#ifdef EMU_ASAN
    note_depth();
#else
    (void)fake;
#endif
    int next = cur + 1;
    while (next < nthreads && fibers[next].state != F_READY)
        next++;
    if (next == nthreads) {
#ifdef EMU_ASAN
        __sanitizer_start_switch_fiber(fake, main_stack_bottom, main_stack_size);
#endif
#ifdef EMU_FAST_SWITCH
        kern_emu_switch(save, sched_sp);
#else
        swapcontext(save, &sched_ctx);
#endif
        return;
    }
    cur = next;
    threadIdx = fibers[next].tid;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(fake, stacks + (size_t)fibers[next].stack * STACK_BYTES,
                                   STACK_BYTES);
#endif
#ifdef EMU_FAST_SWITCH
    kern_emu_switch(save, fibers[next].sp);
#else
    swapcontext(save, &fibers[next].ctx);
#endif
}

static void fiber_init(int i, int s);

/* from a fiber to the rest of the round; it resumes here when released */
static void yield_state(int state)
{
    Fiber *f = &fibers[cur];
    f->state = state;
    if (state == F_BLOCK_BAR)
        n_block_bar++;
    else
        warp_bar[cur / 32]++;
    if (run_plain) { /* the threads after this one start in fibers of their own */
        run_plain = 0;
        for (int i = cur + 1; i < nthreads; i++)
            fiber_init(i, i);
    }
    leave_fiber(fiber_save(f), &f->fake_stack);
#ifdef EMU_ASAN
    asan_arrived(f->fake_stack);
#endif
}

static void trampoline(void)
{
#ifdef EMU_ASAN
    asan_arrived(NULL);
#endif
    for (;;) {
        (*body)();
        fibers[cur].state = F_DONE;
        n_done++;
        warp_done[cur / 32]++;
        if (!run_plain || cur + 1 == nthreads)
            break;
        /* the next thread, in this fiber: what the scheduler would run next, without the two
         * switches and a fresh stack (no thread before it has reached a barrier) */
        fibers[cur + 1].stack = fibers[cur].stack;
        cur++;
        threadIdx = fibers[cur].tid;
    }
    leave_fiber(&dead_save, NULL); /* never comes back: the fiber is done */
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
    shfl_src[me] = warp0 + (xor_mode ? (lane ^ arg) & 31 : arg & 31);
    /* Two barriers: every lane has written its value, then every lane has read before a next
     * shuffle overwrites. When the whole warp waits at the first, the scheduler reads for
     * every lane, which so goes straight to the second: the same rounds as when each lane
     * reads for itself in the round between, without switching to it for a read. A warp
     * whose lanes wait at different warp barriers is released as it is, and reads here. */
    yield_state(F_WARP_BAR);
    if (shfl_src[me] < 0)
        return shfl_got[me];
    const uint64_t v = shfl_slot[shfl_src[me]];
    shfl_src[me] = -1;
    yield_state(F_WARP_BAR);
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

/* Threads lo..hi-1, a warp all of whose lanes wait at a warp barrier: when every one waits at
 * a shuffle's first barrier, reads what each one's shuffle reads (kern_emu_shfl) and returns
 * 1; else 0. */
static int warp_reads(int lo, int hi)
{
    for (int i = lo; i < hi; i++)
        if (shfl_src[i] < 0)
            return 0;
    for (int i = lo; i < hi; i++)
        shfl_got[i] = shfl_slot[shfl_src[i]];
    for (int i = lo; i < hi; i++)
        shfl_src[i] = -1;
    return 1;
}

/* Makes fiber i a fresh start of the trampoline on stack s. */
static void fiber_init(int i, int s)
{
    Fiber *f = &fibers[i];
    f->stack = s;
#ifdef EMU_FAST_SWITCH
        /* the frame kern_emu_switch pops: a slot it skips, six registers, then a return into
         * the trampoline, which starts as if called (its stack pointer 8 past a 16-byte
         * boundary) */
    uint64_t *top = (uint64_t *)(void *)(stacks + (size_t)(s + 1) * STACK_BYTES - STACK_COLOR(s));
    top[-1] = 0;                                /* the trampoline's return address: none */
    top[-2] = (uint64_t)(uintptr_t)&trampoline; /* where the first switch returns to */
    for (int r = 3; r <= 8; r++)
        top[-r] = 0;                            /* rbp, rbx, r12-r15 */
    top[-9] = 0;                                /* the skipped slot */
    f->sp = &top[-9];
#else
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = stacks + (size_t)s * STACK_BYTES;
    f->ctx.uc_stack.ss_size = STACK_BYTES;
    f->ctx.uc_link = NULL;
    makecontext(&f->ctx, trampoline, 0);
#endif
    f->fake_stack = NULL;
}

/* Runs the current block to completion, in rounds: each runs the ready threads in order, each
 * until it reaches a barrier or returns. So thread 0's fiber runs them all one after another
 * (run_plain) until one waits at a barrier, and only the threads after that one get fibers of
 * their own: most kernels reach no barrier, and a block of them costs two switches, not two
 * per thread. */
static void run_block(void)
{
    uint3 t = {0, 0, 0};
    for (int i = 0; i < nthreads; i++) {
        fibers[i].state = F_READY;
        fibers[i].tid = t;
        shfl_src[i] = -1;
        if (++t.x == blockDim.x) {
            t.x = 0;
            if (++t.y == blockDim.y)
                t.y = 0, t.z++;
        }
    }
    const int warps = (nthreads + 31) / 32;
    n_block_bar = n_done = 0;
    for (int w = 0; w < warps; w++)
        warp_bar[w] = warp_done[w] = 0;
    fiber_init(0, 0);
    run_plain = 1; /* until a thread waits at a barrier (yield_state) */
    /* a round: the ready threads in order from `first`, each to its next barrier or its end,
     * each switching to the next (leave_fiber); none is ready after it */
    for (int first = 0;;) {
        if (first < nthreads)
            switch_to_fiber(first);
        run_plain = 0;
        const int live = nthreads - n_done;
        if (live == 0)
            return;
        if (n_block_bar == live) {
            if (live != nthreads) /* undefined on a GPU: count on no hardware to forgive it */
                emu_fail(launch_file, launch_line,
                         "__syncthreads reached after %d of %d threads returned", nthreads - live,
                         nthreads);
            for (int i = 0; i < nthreads; i++)
                fibers[i].state = F_READY;
            n_block_bar = 0;
            first = 0;
            continue;
        }
        int released = 0;
        first = nthreads;
        for (int w = 0; w < warps; w++) {
            const int lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads;
            const int at_warp = warp_bar[w], done = warp_done[w];
            if (at_warp == 0 || at_warp + done != hi - lo)
                continue;
            if (done)
                emu_fail(launch_file, launch_line,
                         "a shuffle or __syncwarp in warp %d after %d of its lanes returned", w,
                         done);
            released = 1;
            if (warp_reads(lo, hi))
                continue; /* at the shuffle's second barrier now */
            for (int i = lo; i < hi; i++)
                fibers[i].state = F_READY;
            warp_bar[w] = 0;
            if (first == nthreads)
                first = lo;
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
    /* frames that a fiber left by switching away, not by returning, are still poisoned: they
     * lie at most switch_depth below the top of each stack this launch uses (unpoisoning every
     * stack whole, 256 MiB, cleared 32 MiB of shadow per launch: most of a sanitized run) */
    for (unsigned i = 0; i < threads; i++) {
        unsigned char *lo = stacks + (size_t)i * STACK_BYTES, *hi = lo + STACK_BYTES;
        const size_t keep = STACK_COLOR(i) + switch_depth + 4096;
        if (keep < STACK_BYTES)
            lo = hi - keep;
        ASAN_UNPOISON_MEMORY_REGION(lo, (size_t)(hi - lo));
    }
#endif
    /* a fresh, exact-size buffer per block: ASan sees overruns, and no block sees another's
     * leftovers (0xA5 rather than zeros, so a read before write shows) */
    unsigned char *dyn = (unsigned char *)malloc(smem ? smem : 1);
    body = &fn;
    launch_file = file;
    launch_line = line;
    EmuWindow w;
    kernel_file = file;
    kernel_line = line;
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
    kernel_file = NULL;
}

/* ---- cuBLAS: a plain column-major GEMM with cuBLAS's argument rules (bf16, fp16 or fp32
 * operands; fp32 ones multiplied in full fp32, so a TF32 handle aborts) ---- */

struct KernEmuBlas {
    int math_mode;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    static KernEmuBlas h;
    h.math_mode = CUBLAS_DEFAULT_MATH;
    *handle = &h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math_mode = (int)mode;
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

/* The rows x k matrix op(M) of a GEMM operand as fp32 rows of k: M is column-major with leading
 * dimension ld, and row r's element l sits at M[r + l * ld] when `strided` (A untransposed, B
 * transposed), else at M[l + r * ld]. */
static void gemm_pack(std::vector<float> *out, const void *M, cudaDataType t, int strided,
                      int rows, int k, int ld)
{
    out->resize((size_t)rows * (size_t)(k > 0 ? k : 1));
    float *o = out->data();
    for (int r = 0; r < rows; r++)
        for (int l = 0; l < k; l++)
            o[(size_t)r * k + l] = dt_load(M, t, strided ? (size_t)r + (size_t)l * ld
                                                         : (size_t)l + (size_t)r * ld);
}

/* op(B)'s n columns of k, widened to fp32, in panels of GEMM_NB columns interleaved: element l
 * of column j at out[(j / GEMM_NB * k + l) * GEMM_NB + j % GEMM_NB], the last panel padded with
 * zeros (computed, never stored), so that one load gives GEMM_NB columns' element l. Read as
 * gemm_pack reads it. */
enum { GEMM_NB = 8, GEMM_MR = 4 };

static void gemm_pack_panels(std::vector<float> *out, const void *M, cudaDataType t, int strided,
                             int cols, int k, int ld)
{
    const size_t panels = ((size_t)cols + GEMM_NB - 1) / GEMM_NB;
    out->assign(panels * (size_t)(k > 0 ? k : 1) * GEMM_NB, 0.0f);
    float *o = out->data();
    for (int j = 0; j < cols; j++) {
        float *p = o + (size_t)(j / GEMM_NB) * k * GEMM_NB + j % GEMM_NB;
        for (int l = 0; l < k; l++)
            p[(size_t)l * GEMM_NB] = dt_load(M, t, strided ? (size_t)j + (size_t)l * ld
                                                            : (size_t)l + (size_t)j * ld);
    }
}

typedef float EmuV4 __attribute__((vector_size(16)));

/* The sums of R rows of op(A) (rows of k at a) with one panel of op(B) (bp): acc[r][h] holds
 * the panel's columns 4h..4h+3 for row r. Each sum is the plain loop's, acc = 0, then acc +=
 * a[l] * b[l] for l = 0..k-1 in order: the same roundings, so the same bits; the columns and
 * rows only run side by side, in the vector lanes and registers. */
template <int R>
static void gemm_tile(const float *a, const float *bp, int k, EmuV4 (*acc)[2])
{
    for (int r = 0; r < R; r++)
        acc[r][0] = acc[r][1] = EmuV4{0.0f, 0.0f, 0.0f, 0.0f};
    for (int l = 0; l < k; l++) {
        EmuV4 b0, b1;
        memcpy(&b0, bp + (size_t)l * GEMM_NB, sizeof b0);
        memcpy(&b1, bp + (size_t)l * GEMM_NB + 4, sizeof b1);
        for (int r = 0; r < R; r++) {
            const float x = a[(size_t)r * k + l];
            acc[r][0] += x * b0;
            acc[r][1] += x * b1;
        }
    }
}

/* C's rows i0..i0+R-1 in the panel of columns j0.. (at most GEMM_NB of them: up to n):
 * C = al * sum + be * C, C not read when be = 0 */
template <int R>
static void gemm_rows(const float *a_rows, const float *panel, int k, int i0, int j0, int n,
                      float al, float be, void *C, cudaDataType Ctype, int ldc)
{
    EmuV4 acc[R][2];
    gemm_tile<R>(a_rows + (size_t)i0 * k, panel, k, acc);
    for (int jj = 0; jj < GEMM_NB && j0 + jj < n; jj++)
        for (int r = 0; r < R; r++) {
            const float sum = acc[r][jj / 4][jj % 4];
            const size_t ic = (size_t)(i0 + r) + (size_t)(j0 + jj) * ldc;
            const float v = al * sum + (be == 0.0f ? 0.0f : be * dt_load(C, Ctype, ic));
            dt_store(C, Ctype, ic, v);
        }
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
        (Atype != CUDA_R_16BF && Atype != CUDA_R_16F && Atype != CUDA_R_32F) ||
        (Ctype != Atype && Ctype != CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (Atype == CUDA_R_32F && (handle->math_mode & 15) == CUBLAS_TF32_TENSOR_OP_MATH)
        emu_fail(NULL, 0, "cuBLAS GEMM of fp32 operands on a handle in "
                          "CUBLAS_TF32_TENSOR_OP_MATH: cuBLAS would round them to TF32 (10-bit "
                          "mantissa), which no emulated GEMM (full fp32 products) would show, and "
                          "which the simulator's fp32 price (the fp32 peak) does not assume");
    if (Ctype != CUDA_R_32F && !(handle->math_mode & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION))
        emu_fail(NULL, 0, "cuBLAS GEMM with a %s output on a handle that allows reduced-precision "
                          "reductions: cuBLAS may add split-K partial sums in the output type "
                          "(cublasSetMathMode with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION "
                          "keeps them in fp32)", Ctype == CUDA_R_16BF ? "bf16" : "fp16");
    EmuWindow w;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    static thread_local std::vector<float> a_rows, b_cols;
    for (int b = 0; b < batchCount; b++) {
        const unsigned char *Ab = (const unsigned char *)A + (size_t)b * strideA * dt_bytes(Atype);
        const unsigned char *Bb = (const unsigned char *)B + (size_t)b * strideB * dt_bytes(Btype);
        unsigned char *Cb = (unsigned char *)C + (size_t)b * strideC * dt_bytes(Ctype);
        if (k > 0) {
            emu_check_range(Ab, span(ar, ac, lda, Atype), "cuBLAS GEMM operand A");
            emu_check_range(Bb, span(br, bc, ldb, Btype), "cuBLAS GEMM operand B");
        }
        emu_check_range(Cb, span(m, n, ldc, Ctype), "cuBLAS GEMM operand C");
        /* op(A)'s rows and op(B)'s columns widened to fp32 once, each k contiguous, so that
         * every element of C is the same products added in the same order as the plain triple
         * loop adds them (bit for bit its results), without converting every operand m or n
         * times; GEMM_MR rows by GEMM_NB columns at a time, for the registers and the vector
         * lanes. beta = 0: C is not read (it may hold NaN), as cuBLAS documents */
        gemm_pack(&a_rows, Ab, Atype, transa == CUBLAS_OP_N, m, k, lda);
        gemm_pack_panels(&b_cols, Bb, Btype, transb != CUBLAS_OP_N, n, k, ldb);
        for (int j0 = 0; j0 < n; j0 += GEMM_NB) {
            const float *panel = b_cols.data() + (size_t)(j0 / GEMM_NB) * k * GEMM_NB;
            int i0 = 0;
            for (; i0 + GEMM_MR <= m; i0 += GEMM_MR)
                gemm_rows<GEMM_MR>(a_rows.data(), panel, k, i0, j0, n, al, be, Cb, Ctype, ldc);
            for (; i0 < m; i0++)
                gemm_rows<1>(a_rows.data(), panel, k, i0, j0, n, al, be, Cb, Ctype, ldc);
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

/* ---- cuBLASLt: the FP8 GEMM (cuda_emu.h lists what is checked) ---- */

struct KernEmuLt {
    int unused;
};
struct KernEmuLtDesc {
    cublasOperation_t transa, transb;
    const float *a_scale, *b_scale;
};
struct KernEmuLtLayout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    static KernEmuLt h;
    *handle = &h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType scale_type)
{
    if (compute != CUBLAS_COMPUTE_32F || scale_type != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *desc = new KernEmuLtDesc{CUBLAS_OP_N, CUBLAS_OP_N, NULL, NULL};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t bytes)
{
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        /* cuBLASLt takes a cublasOperation_t (an int32) */
        if (bytes != sizeof(int32_t))
            return CUBLAS_STATUS_INVALID_VALUE;
        int32_t op;
        memcpy(&op, buf, sizeof op);
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->transa : desc->transb) =
            (cublasOperation_t)op;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: {
        if (bytes != sizeof(void *))
            return CUBLAS_STATUS_INVALID_VALUE;
        const float *p;
        memcpy(&p, buf, sizeof p);
        (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? desc->a_scale : desc->b_scale) = p;
        return CUBLAS_STATUS_SUCCESS;
    }
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    *layout = new KernEmuLtLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

static int lt_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

static float lt_load(const void *p, cudaDataType t, size_t i)
{
    const uint8_t q = ((const uint8_t *)p)[i];
    if (t == CUDA_R_8F_E4M3)
        return px_e4m3_to_float(q);
    if (t == CUDA_R_8F_E5M2)
        return px_e5m2_to_float(q);
    return dt_load(p, t, i);
}

static size_t lt_span(const KernEmuLtLayout *l)
{
    if (l->rows == 0 || l->cols == 0)
        return 0;
    const size_t elem = lt_fp8(l->type) ? 1 : dt_bytes(l->type);
    return ((size_t)(l->cols - 1) * (size_t)l->ld + l->rows) * elem;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    (void)stream;
    if (!handle || !desc)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (algo)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* only the implicit heuristic is emulated */
    if (workspace_bytes)
        emu_check_range(workspace, workspace_bytes, "cuBLASLt workspace");
    /* sm_90's FP8 GEMMs: TN only, not both E5M2, C and D alike and not FP8 */
    if (!lt_fp8(Adesc->type) || !lt_fp8(Bdesc->type) ||
        (Adesc->type == CUDA_R_8F_E5M2 && Bdesc->type == CUDA_R_8F_E5M2) ||
        desc->transa != CUBLAS_OP_T || desc->transb != CUBLAS_OP_N ||
        Cdesc->type != Ddesc->type || lt_fp8(Cdesc->type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* op(A) = A^T is m x k, B is k x n, C and D m x n */
    const uint64_t m = Adesc->cols, k = Adesc->rows, n = Bdesc->cols;
    if (Bdesc->rows != k || Cdesc->rows != m || Cdesc->cols != n || Ddesc->rows != m ||
        Ddesc->cols != n || Cdesc->ld != Ddesc->ld)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (Adesc->ld < (int64_t)k || Bdesc->ld < (int64_t)k || Ddesc->ld < (int64_t)m ||
        Adesc->ld % 16 || Bdesc->ld % 16 || !aligned16(A) || !aligned16(B) || !aligned16(C) ||
        !aligned16(D))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    emu_check_range(A, lt_span(Adesc), "cuBLASLt operand A");
    emu_check_range(B, lt_span(Bdesc), "cuBLASLt operand B");
    emu_check_range(C, lt_span(Cdesc), "cuBLASLt operand C");
    emu_check_range(D, lt_span(Ddesc), "cuBLASLt operand D");
    EmuWindow w;
    float sa = 1.0f, sb = 1.0f;
    if (desc->a_scale) {
        emu_check_range(desc->a_scale, sizeof(float), "cuBLASLt A scale");
        sa = *desc->a_scale;
    }
    if (desc->b_scale) {
        emu_check_range(desc->b_scale, sizeof(float), "cuBLASLt B scale");
        sb = *desc->b_scale;
    }
    const float al = *(const float *)alpha, be = *(const float *)beta;
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            float acc = 0.0f;
            for (uint64_t l = 0; l < k; l++)
                acc += lt_load(A, Adesc->type, l + i * (size_t)Adesc->ld) *
                       lt_load(B, Bdesc->type, l + j * (size_t)Bdesc->ld);
            const size_t ic = i + j * (size_t)Cdesc->ld;
            const float v = al * (sa * sb * acc) +
                            (be == 0.0f ? 0.0f : be * dt_load(C, Cdesc->type, ic));
            dt_store(D, Ddesc->type, ic, v);
        }
    return CUBLAS_STATUS_SUCCESS;
}
