/* Optimizer updates on fp32 master weights: AdamW (Loshchilov & Hutter 2019, decoupled weight
 * decay) and SGD with momentum (PyTorch's torch.optim.SGD without dampening or Nesterov: weight
 * decay added to the gradient), and 8-bit Adam's block-wise quantization of its state
 * (Dettmers et al. 2022). When param is not NULL it is the act copy of the weights that
 * forward reads, refreshed from the master after the update. The kern_host_ functions are the
 * same loops for optimizer offload's host step on any backend, reading 16-bit gradients too:
 * their arithmetic is the CUDA kernels' (kernels/cuda/optim.cu), operation for operation. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static float grad_at(const void *grad, PxDtype dtype, size_t i)
{
    if (dtype == PX_BF16)
        return px_bf16_to_float(((const uint16_t *)grad)[i]);
    if (dtype == PX_FP16)
        return px_half_to_float(((const uint16_t *)grad)[i]);
    return ((const float *)grad)[i];
}

void kern_host_adamw(float *master, const void *grad, PxDtype grad_dtype, float *m, float *v,
                     size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                     int t, float grad_scale)
{
    // master, grad, m, v are (n)
    KERN_CHECK(t >= 1, "adamw: the step t is 1-based");
    // the corrections in double: 1 - beta2^t is ~1e-3 for early steps with beta2 = 0.999
    const float bc1 = (float)(1.0 - pow(beta1, t)), bc2 = (float)(1.0 - pow(beta2, t));
    for (size_t i = 0; i < n; i++) {
        const float g = grad_at(grad, grad_dtype, i) * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / bc1, vhat = vi / bc2;
        master[i] = master[i] - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * master[i]);
    }
}

void kern_host_sgd_momentum(float *master, const void *grad, PxDtype grad_dtype, float *mom,
                            size_t n, float lr, float momentum, float weight_decay,
                            float grad_scale)
{
    // master, grad, mom are (n)
    // mom starts at 0 (alloc zero-fills), so the first step gives mom = g as PyTorch's does
    for (size_t i = 0; i < n; i++) {
        const float g = grad_at(grad, grad_dtype, i) * grad_scale + weight_decay * master[i];
        const float mo = momentum * mom[i] + g;
        mom[i] = mo;
        master[i] = master[i] - lr * mo;
    }
}

void kern_host_round(void *out, PxDtype dtype, const float *x, size_t n)
{
    uint16_t *o = out;
    if (dtype == PX_BF16)
        for (size_t i = 0; i < n; i++)
            o[i] = px_float_to_bf16(x[i]);
    else if (dtype == PX_FP16)
        for (size_t i = 0; i < n; i++)
            o[i] = px_float_to_half(x[i]);
    else
        memmove(out, x, n * sizeof *x);
}

void kern_cpu_adamw(void *param, float *master, const void *grad, float *m, float *v, size_t n,
                    float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale)
{
    /* the CPU's weights and gradients are fp32 */
    kern_host_adamw(master, grad, PX_FP32, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                    grad_scale);
    if (param)
        memcpy(param, master, n * sizeof *master);
}

void kern_cpu_sgd_momentum(void *param, float *master, const void *grad, float *mom, size_t n,
                           float lr, float momentum, float weight_decay, float grad_scale)
{
    kern_host_sgd_momentum(master, grad, PX_FP32, mom, n, lr, momentum, weight_decay,
                           grad_scale);
    if (param)
        memcpy(param, master, n * sizeof *master);
}

/* ---- adam-8bit: block-wise quantized state (Dettmers et al. 2022) ---- */

/* One table of 256 values, ascending: dynamic (exponent, fraction) codes after the paper's
 * Sec. 2.2. A code's bits after the sign (m's table only) are E zeros, a one, and F linear
 * fraction bits: 10^-E x (0.1 + 0.9 (i + 1) / 2^F), i < 2^F. m (signed): 7 bits, E 0..6, 127
 * magnitudes a sign and zero (the 256th a second zero); v (non-negative): 8 bits, E 0..7, 255
 * magnitudes and zero. So the smallest nonzero value is 1e-6 of m's absmax and 1e-7 of v's,
 * and the precision is relative, as the states' spread over orders of magnitude wants. */
static void adam8_table(float *t, int is_signed)
{
    const int bits = is_signed ? 7 : 8;
    float mag[255];
    int n = 0;
    for (int E = bits - 1; E >= 0; E--) { /* ascending: the smallest exponent first */
        const int F = bits - 1 - E;
        for (int i = 0; i < (1 << F); i++)
            mag[n++] = (float)(pow(10.0, -E) * (0.1 + 0.9 * (i + 1) / (double)(1 << F)));
    }
    int k = 0;
    if (is_signed) {
        for (int i = n - 1; i >= 0; i--)
            t[k++] = -mag[i];
        t[k++] = 0.0f;
    }
    t[k++] = 0.0f;
    for (int i = 0; i < n; i++)
        t[k++] = mag[i];
}

void kern_adam8_tables(float tables[512])
{
    adam8_table(tables, 1);
    adam8_table(tables + 256, 0);
}

/* The code nearest x (a fraction of the absmax, in the table's range); positive v is never
 * rounded to zero (its square root divides the update). kernels/cuda/optim.cu's adam8_code
 * is this function on the device. */
static uint8_t adam8_code(const float *t, float x, int keep_positive)
{
    int lo = 0, hi = 255;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (t[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    int q = x - t[lo] <= t[hi] - x ? lo : hi;
    if (keep_positive && x > 0.0f && t[q] == 0.0f)
        q = hi;
    return (uint8_t)q;
}

/* Whether segment i of a overlaps state elements [lo, hi), and the overlap. */
static int seg_overlap(const KernAdam8 *a, int i, uint64_t lo, uint64_t hi, uint64_t *b,
                       uint64_t *e)
{
    *b = a->begin[i] > lo ? a->begin[i] : lo;
    *e = a->end[i] < hi ? a->end[i] : hi;
    return *e > *b;
}

void kern_host_adam8(float *param, float *master, const void *grad, PxDtype grad_dtype,
                     uint8_t *m8, uint8_t *v8, float *absmax, const KernAdam8 *a)
{
    KERN_CHECK(a->n >= 1 && a->n <= KERN_ADAM8_SEGMENTS, "adam8: 1 to KERN_ADAM8_SEGMENTS segments");
    float m[KERN_ADAM8_BLOCK], v[KERN_ADAM8_BLOCK];
    const uint64_t base = a->begin[0], nq = (a->state_n + KERN_ADAM8_BLOCK - 1) / KERN_ADAM8_BLOCK;
    const size_t gb = px_dtype_bytes(grad_dtype);
    for (uint64_t q = base / KERN_ADAM8_BLOCK; q <= (a->end[a->n - 1] - 1) / KERN_ADAM8_BLOCK; q++) {
        const uint64_t q0 = q * KERN_ADAM8_BLOCK;
        const uint64_t q1 = a->state_n - q0 < KERN_ADAM8_BLOCK ? a->state_n : q0 + KERN_ADAM8_BLOCK;
        uint64_t b, e;
        int touched = 0;
        for (int i = 0; i < a->n && !touched; i++)
            touched = seg_overlap(a, i, q0, q1, &b, &e);
        if (!touched) /* between segments: not decoded, not coded again */
            continue;
        const float am = absmax[q], av = absmax[nq + q];
        for (uint64_t i = 0; i < q1 - q0; i++) {
            m[i] = a->codes[m8[q0 + i]] * am;
            v[i] = a->codes[256 + v8[q0 + i]] * av;
        }
        for (int i = 0; i < a->n; i++) {
            if (!seg_overlap(a, i, q0, q1, &b, &e))
                continue;
            kern_host_adamw(master + (b - base), (const char *)grad + (b - base) * gb, grad_dtype,
                            m + (b - q0), v + (b - q0), e - b, a->lr, a->beta1, a->beta2, a->eps,
                            a->weight_decay[i], a->t, a->grad_scale);
            if (param)
                memcpy(param + (b - base), master + (b - base), (e - b) * sizeof *master);
        }
        float nm = 0.0f, nv = 0.0f;
        for (uint64_t i = 0; i < q1 - q0; i++) {
            nm = fabsf(m[i]) > nm ? fabsf(m[i]) : nm;
            nv = v[i] > nv ? v[i] : nv;
        }
        for (uint64_t i = 0; i < q1 - q0; i++) {
            m8[q0 + i] = adam8_code(a->codes, nm > 0.0f ? m[i] / nm : 0.0f, 0);
            v8[q0 + i] = adam8_code(a->codes + 256, nv > 0.0f ? v[i] / nv : 0.0f, 1);
        }
        absmax[q] = nm;
        absmax[nq + q] = nv;
    }
}

void kern_cpu_adam8(void *param, float *master, const void *grad, uint8_t *m8, uint8_t *v8,
                    float *absmax, const KernAdam8 *a)
{
    kern_host_adam8(param, master, grad, PX_FP32, m8, v8, absmax, a); /* the CPU's are fp32 */
}
