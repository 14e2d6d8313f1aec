/* Private to kernels/cpu: the helpers of the 16-bit tables (act16.c, act16_table.inc). One
 * kernel call declares an Act16Call, widens its 16-bit inputs with act16_in (each gets its own
 * fp32 scratch, in the operand's own layout), takes scratch for its outputs with act16_out (the
 * same scratch as an input of the same pointer: an in-place call), runs the fp32 kernel and
 * rounds its outputs back with act16_round. An operand of dtype fp32 is its own scratch, and
 * every helper leaves it as it is. The 2 variants take a block of rows x cols with row stride
 * ld (strided views into packed rows: only the block is read and written back). */
#ifndef KERN_CPU_ACT16_H
#define KERN_CPU_ACT16_H

#include "kernels/cpu/cpu.h"

enum { ACT16_OPERANDS = 16 };

typedef struct {
    int n;
    const void *src[ACT16_OPERANDS];
    float *f[ACT16_OPERANDS];
} Act16Call;

float *act16_in2(Act16Call *w, PxDtype dt, const void *p, size_t rows, size_t cols, size_t ld);
float *act16_out2(Act16Call *w, PxDtype dt, void *p, size_t rows, size_t cols, size_t ld);
void act16_round2(PxDtype dt, void *p, const float *f, size_t rows, size_t cols, size_t ld);
/* The rows ids - base of a (rows, cols) table, ids out of range skipped: an embedding's. */
float *act16_in_rows(Act16Call *w, PxDtype dt, const void *p, const int32_t *ids, int n,
                     int64_t base, int64_t rows, size_t cols);
void act16_round_rows(PxDtype dt, void *p, const float *f, const int32_t *ids, int n,
                      int64_t base, int64_t rows, size_t cols);

static inline float *act16_in(Act16Call *w, PxDtype dt, const void *p, size_t n)
{
    return act16_in2(w, dt, p, 1, n, n);
}
static inline float *act16_out(Act16Call *w, PxDtype dt, void *p, size_t n)
{
    return act16_out2(w, dt, p, 1, n, n);
}
static inline void act16_round(PxDtype dt, void *p, const float *f, size_t n)
{
    act16_round2(dt, p, f, 1, n, n);
}

#endif
