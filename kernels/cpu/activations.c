/* GELU (tanh approximation, as GPT-2 was trained with) and SwiGLU (Shazeer 2020, as Llama),
 * forward and backward. Backward outputs are overwritten, not accumulated (kernels.h marks
 * only "+=" outputs as accumulating). */
#include <math.h>

#include "kernels/cpu/cpu.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

void kern_cpu_gelu_fwd(void *out, const void *inp, size_t n)
{
    // out, inp are (n); out may alias inp
    float *o = out;
    const float *x = inp;
    for (size_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_K * (xi + GELU_C * xi * xi * xi);
        o[i] = 0.5f * xi * (1.0f + tanhf(u));
    }
}

void kern_cpu_gelu_bwd(void *dinp, const void *inp, const void *dout, size_t n)
{
    // dinp, inp, dout are (n); dinp may alias dout or inp (each element read before written)
    float *dx = dinp;
    const float *x = inp, *dy = dout;
    for (size_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_K * (xi + GELU_C * xi * xi * xi);
        float th = tanhf(u);
        float du = GELU_K * (1.0f + 3.0f * GELU_C * xi * xi);
        // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx
        float grad = 0.5f * (1.0f + th) + 0.5f * xi * (1.0f - th * th) * du;
        dx[i] = grad * dy[i];
    }
}

/* 1 / (1 + e^-x): for x very negative e^-x overflows to inf and the result is the correct 0. */
static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void kern_cpu_swiglu_fwd(void *out, const void *inp, int N, int F)
{
    // out is (N,F); inp is (N,2F), each row [gate | up]
    float *o = out;
    const float *x = inp;
    for (int n = 0; n < N; n++) {
        const float *gate = x + (size_t)n * 2 * F, *up = gate + F;
        float *orow = o + (size_t)n * F;
        for (int i = 0; i < F; i++)
            orow[i] = gate[i] * sigmoidf(gate[i]) * up[i];
    }
}

void kern_cpu_swiglu_bwd(void *dinp, const void *inp, const void *dout, int N, int F)
{
    // dinp, inp are (N,2F) as [gate | up]; dout is (N,F)
    float *dx = dinp;
    const float *x = inp, *dy = dout;
    for (int n = 0; n < N; n++) {
        const float *gate = x + (size_t)n * 2 * F, *up = gate + F;
        const float *drow = dy + (size_t)n * F;
        float *dgate = dx + (size_t)n * 2 * F, *dup = dgate + F;
        for (int i = 0; i < F; i++) {
            float g = gate[i], s = sigmoidf(g), d = drow[i];
            float u = up[i]; // read before writing: dinp may alias inp
            // silu'(g) = s (1 + g (1 - s))
            dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
            dup[i] = d * g * s;
        }
    }
}
