/* Elementwise kernels: residual adds, inverted dropout on the counter-based stream of
 * kernels.h, and the fp32 helpers of the optimizer step (gradient norm, finiteness check,
 * scaling) and the act <-> fp32 casts, which are copies on the CPU (act is fp32). */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_add(void *out, const void *a, const void *b, size_t n)
{
    // out, a, b are (n); out may alias a or b
    float *o = out;
    const float *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        o[i] = x[i] + y[i];
}

void kern_cpu_add_inplace(void *out, const void *a, size_t n)
{
    float *o = out;
    const float *x = a;
    for (size_t i = 0; i < n; i++)
        o[i] += x[i];
}

void kern_cpu_copy_cols(void *dst, int ldd, const void *src, int lds, int rows, int cols, int add)
{
    KERN_CHECK(rows >= 0 && cols >= 0 && ldd >= cols && lds >= cols, "copy_cols: bad shape");
    for (int r = 0; r < rows; r++) {
        float *o = (float *)dst + (size_t)r * ldd;
        const float *x = (const float *)src + (size_t)r * lds;
        if (add)
            for (int c = 0; c < cols; c++)
                o[c] += x[c];
        else
            memcpy(o, x, (size_t)cols * sizeof *o);
    }
}

void kern_cpu_dropout_fwd(void *out, uint8_t *mask, const void *inp, size_t n, float p,
                          uint64_t seed)
{
    // out, mask, inp are (n); out may alias inp
    KERN_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1)");
    float *o = out;
    const float *x = inp;
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) {
        const int keep = kern_dropout_keep(seed, i, p);
        mask[i] = (uint8_t)keep;
        o[i] = keep ? x[i] * scale : 0.0f;
    }
}

void kern_cpu_dropout_bwd(void *dinp, const void *dout, const uint8_t *mask, size_t n, float p)
{
    // dinp, dout, mask are (n); dinp may alias dout
    KERN_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1)");
    float *dx = dinp;
    const float *dy = dout;
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++)
        dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

double kern_cpu_grad_sumsq(const void *g, size_t n) { return kern_cpu_sumsq(g, n); }

double kern_cpu_sumsq(const float *x, size_t n)
{
    // double: a gradient norm sums ~1e9 squares, where float would lose the small ones
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

int kern_cpu_all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

void kern_cpu_scale_f32(float *x, size_t n, float s)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

void kern_cpu_cast_to_act(void *out, const float *inp, size_t n)
{
    if (n && out != inp)
        memmove(out, inp, n * sizeof *inp);
}

void kern_cpu_cast_to_f32(float *out, const void *inp, size_t n)
{
    if (n && out != inp)
        memmove(out, inp, n * sizeof *out);
}

void kern_cpu_acc_to_f32(float *out, const void *inp, size_t n)
{
    kern_cpu_add_inplace(out, inp, n);
}
