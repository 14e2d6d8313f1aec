/* FP8 tensors of kernels.h's KernFp8 layout: their sizes (shared by every backend) and the CPU
 * backend's FP8 kernels, which decode to fp32 and multiply with sgemm. */
#include "kernels/kernels.h"

static size_t ceil_div(size_t a, size_t b) { return b ? (a + b - 1) / b : 0; }

size_t kern_fp8_scales(const KernFp8 *f)
{
    if (f->rows <= 0 || f->cols <= 0)
        return 0;
    return ceil_div((size_t)f->rows, (size_t)f->block_r) * ceil_div((size_t)f->cols, (size_t)f->block_c);
}

size_t kern_fp8_bytes(const KernFp8 *f)
{
    if (f->rows <= 0 || f->cols <= 0)
        return 0;
    return (size_t)f->rows * (size_t)f->cols + kern_fp8_scales(f) * (f->e8m0 ? 1 : 4);
}
