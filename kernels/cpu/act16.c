/* The CPU backend with 16-bit activations (kern_cpu_with, kern_cpu_with_grads): the CUDA
 * backend's precision contract (docs/gpu.md, "Precision") kept by the fp32 kernels of this
 * directory. Each entry widens its act operands (and 16-bit gradients) into fp32 scratch,
 * calls the fp32 kernel, and rounds what the kernel wrote back once, to nearest even: a kernel
 * that loads act values into fp32, computes in fp32 and rounds on the store, as the CUDA
 * kernels do. fp32 operands (statistics, logits, master weights, optimizer state) pass
 * straight through, so the fp32 table (backend.c) stays the one the others are checked
 * against, untouched and as fast as it was.
 *
 * Scratch: a few per-thread buffers that grow to the largest operand and are then reused, so
 * the first step allocates them and later steps do not. They are host heap outside the
 * executor's arenas: the scratch a fused GPU kernel keeps in registers, which no category of
 * the simulator counts. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/act16.h"

typedef struct {
    float *p;
    size_t cap; /* floats */
} Act16Slot;

static _Thread_local Act16Slot act16_slots[ACT16_OPERANDS];

static float *act16_scratch(int slot, size_t n)
{
    Act16Slot *s = &act16_slots[slot];
    if (n > s->cap) {
        free(s->p);
        s->p = malloc((n ? n : 1) * sizeof *s->p);
        KERN_CHECK(s->p, "cpu 16-bit: out of memory for the fp32 scratch");
        s->cap = n;
    }
    return s->p;
}

/* The extent of rows x cols elements with row stride ld, in elements. */
static size_t act16_extent(size_t rows, size_t cols, size_t ld)
{
    return rows && cols ? (rows - 1) * ld + cols : 0;
}

/* n 16-bit elements widened to fp32: bf16, fp32's top half, by a shift; fp16 likewise. A
 * call per element (px_bf16_to_float, px_half_to_float) took most of a pass's time, which the
 * simulator prices at the streaming rate (sim/cost.c, sim_cpu16_pass_bytes). */
static void act16_widen(PxDtype dt, float *restrict f, const uint16_t *restrict h, size_t n)
{
    if (dt == PX_BF16) {
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&f[i], &u, sizeof u);
        }
    } else {
        /* a normal half is fp32's bits shifted and rebiased (exact); then zero, subnormals,
         * infinity and NaN (exponent 0 or 31) again by px_half_to_float */
        for (size_t i = 0; i < n; i++) {
            const uint32_t u = ((uint32_t)(h[i] & 0x8000u) << 16) |
                               (((uint32_t)(h[i] & 0x7fffu) << 13) + (112u << 23));
            memcpy(&f[i], &u, sizeof u);
        }
        for (size_t i = 0; i < n; i++)
            if ((uint32_t)(h[i] & 0x7c00u) - 0x400u >= 0x7800u)
                f[i] = px_half_to_float(h[i]);
    }
}

/* f (bits u) rounded to fp16 as a normal half, bit for bit px_float_to_half's rounding to
 * nearest even there (2^-14 <= |f| < 65520; a carry into the exponent is the next binade, as
 * there), without a branch: the rest is as good as random, and a loop of these vectorizes. */
static uint16_t act16_half_normal(uint32_t u)
{
    const uint32_t a = u & 0x7fffffffu, m = a & 0x7fffffu, rest = m & 0x1fffu;
    const uint32_t r = (((a >> 23) - 112u) << 10 | m >> 13) & 0x7fffu;
    const uint32_t up = (uint32_t)(rest > 0x1000u) | ((uint32_t)(rest == 0x1000u) & r);
    return (uint16_t)((u >> 16 & 0x8000u) | (r + (up & 1u)));
}

/* n fp32 elements rounded to 16 bits, to nearest even, inline for the same reason: bf16 bit
 * for bit px_float_to_bf16 (a NaN stays a quiet NaN); fp16 as a normal half, then the few
 * outside that range (zero, subnormals, infinity, NaN) again by px_float_to_half. */
static void act16_narrow(PxDtype dt, uint16_t *restrict h, const float *restrict f, size_t n)
{
    if (dt != PX_BF16) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &f[i], sizeof u);
            h[i] = act16_half_normal(u);
        }
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &f[i], sizeof u);
            if ((u & 0x7fffffffu) - 0x38800000u >= 0x477ff000u - 0x38800000u)
                h[i] = px_float_to_half(f[i]);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &f[i], sizeof u);
        h[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40)
                                                : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

/* The scratch already standing for p in this call (an in-place operand), or NULL. */
static float *act16_find(const Act16Call *w, const void *p)
{
    for (int i = 0; i < w->n; i++)
        if (w->src[i] == p)
            return w->f[i];
    return NULL;
}

static float *act16_take(Act16Call *w, const void *p, size_t n)
{
    KERN_CHECK(w->n < ACT16_OPERANDS, "cpu 16-bit: too many operands in one call");
    float *f = act16_scratch(w->n, n);
    w->src[w->n] = p;
    w->f[w->n++] = f;
    return f;
}

float *act16_in2(Act16Call *w, PxDtype dt, const void *p, size_t rows, size_t cols, size_t ld)
{
    if (!p || dt == PX_FP32)
        return (float *)p;
    float *f = act16_find(w, p);
    if (f)
        return f;
    f = act16_take(w, p, act16_extent(rows, cols, ld));
    for (size_t r = 0; r < rows; r++)
        act16_widen(dt, f + r * ld, (const uint16_t *)p + r * ld, cols);
    return f;
}

float *act16_out2(Act16Call *w, PxDtype dt, void *p, size_t rows, size_t cols, size_t ld)
{
    if (!p || dt == PX_FP32)
        return p;
    float *f = act16_find(w, p);
    return f ? f : act16_take(w, p, act16_extent(rows, cols, ld));
}

void act16_round2(PxDtype dt, void *p, const float *f, size_t rows, size_t cols, size_t ld)
{
    if (!p || dt == PX_FP32)
        return;
    for (size_t r = 0; r < rows; r++)
        act16_narrow(dt, (uint16_t *)p + r * ld, f + r * ld, cols);
}

/* The rows of a (rows, cols) table that ids - base select (ids out of range select none),
 * widened into their places of the table's scratch; the other rows of the scratch are left
 * unset, so the caller's kernel must read only these (an embedding's lookup or its gradient's
 * scatter-add): a step then widens the rows its tokens name, not the whole table. */
float *act16_in_rows(Act16Call *w, PxDtype dt, const void *p, const int32_t *ids, int n,
                     int64_t base, int64_t rows, size_t cols)
{
    if (!p || dt == PX_FP32)
        return (float *)p;
    float *f = act16_find(w, p);
    if (f)
        return f;
    f = act16_take(w, p, (size_t)rows * cols);
    for (int i = 0; i < n; i++) {
        const int64_t r = (int64_t)ids[i] - base;
        if (r >= 0 && r < rows)
            act16_widen(dt, f + (size_t)r * cols, (const uint16_t *)p + (size_t)r * cols, cols);
    }
    return f;
}

void act16_round_rows(PxDtype dt, void *p, const float *f, const int32_t *ids, int n,
                      int64_t base, int64_t rows, size_t cols)
{
    if (!p || dt == PX_FP32)
        return;
    for (int i = 0; i < n; i++) {
        const int64_t r = (int64_t)ids[i] - base;
        if (r >= 0 && r < rows)
            act16_narrow(dt, (uint16_t *)p + (size_t)r * cols, f + (size_t)r * cols, cols);
    }
}

/* The four tables: each inclusion of act16_table.inc defines one set of entries. */
#define ACT16_ACT PX_BF16
#define ACT16_GRAD PX_FP32
#define ACT16_FN(name) bf16_##name
#define ACT16_TABLE kern_cpu_bf16
#include "kernels/cpu/act16_table.inc"
#undef ACT16_ACT
#undef ACT16_GRAD
#undef ACT16_FN
#undef ACT16_TABLE

#define ACT16_ACT PX_FP16
#define ACT16_GRAD PX_FP32
#define ACT16_FN(name) fp16_##name
#define ACT16_TABLE kern_cpu_fp16
#include "kernels/cpu/act16_table.inc"
#undef ACT16_ACT
#undef ACT16_GRAD
#undef ACT16_FN
#undef ACT16_TABLE

#define ACT16_ACT PX_BF16
#define ACT16_GRAD PX_BF16
#define ACT16_FN(name) bf16g_##name
#define ACT16_TABLE kern_cpu_bf16g
#include "kernels/cpu/act16_table.inc"
#undef ACT16_ACT
#undef ACT16_GRAD
#undef ACT16_FN
#undef ACT16_TABLE

#define ACT16_ACT PX_FP16
#define ACT16_GRAD PX_FP16
#define ACT16_FN(name) fp16g_##name
#define ACT16_TABLE kern_cpu_fp16g
#include "kernels/cpu/act16_table.inc"

static pthread_once_t act16_once = PTHREAD_ONCE_INIT;

static void act16_fill_all(void)
{
    bf16_fill();
    fp16_fill();
    bf16g_fill();
    fp16g_fill();
}

const KernBackend *kern_cpu_with_grads(PxDtype act, PxDtype grad)
{
    if (act == PX_FP32)
        return grad == PX_FP32 ? kern_cpu() : NULL;
    if ((act != PX_BF16 && act != PX_FP16) || (grad != PX_FP32 && grad != act))
        return NULL;
    pthread_once(&act16_once, act16_fill_all);
    if (act == PX_BF16)
        return grad == PX_FP32 ? &kern_cpu_bf16 : &kern_cpu_bf16g;
    return grad == PX_FP32 ? &kern_cpu_fp16 : &kern_cpu_fp16g;
}

const KernBackend *kern_cpu_with(PxDtype act) { return kern_cpu_with_grads(act, PX_FP32); }
