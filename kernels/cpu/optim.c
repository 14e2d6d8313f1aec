/* Optimizer updates on fp32 master weights: AdamW (Loshchilov & Hutter 2019, decoupled weight
 * decay) and SGD with momentum (PyTorch's torch.optim.SGD without dampening or Nesterov: weight
 * decay added to the gradient). When param is not NULL it is the act copy of the weights that
 * forward reads, refreshed from the master after the update. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_adamw(void *param, float *master, const void *grad_in, float *m, float *v, size_t n,
                    float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                    float grad_scale)
{
    const float *grad = grad_in; /* the CPU's gradients are fp32 */
    // param, master, grad, m, v are (n)
    KERN_CHECK(t >= 1, "adamw: the step t is 1-based");
    float *p = param;
    // the corrections in double: 1 - beta2^t is ~1e-3 for early steps with beta2 = 0.999
    const float bc1 = (float)(1.0 - pow(beta1, t)), bc2 = (float)(1.0 - pow(beta2, t));
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        const float mhat = m[i] / bc1, vhat = v[i] / bc2;
        master[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * master[i]);
        if (p)
            p[i] = master[i];
    }
}

void kern_cpu_sgd_momentum(void *param, float *master, const void *grad_in, float *mom, size_t n,
                           float lr, float momentum, float weight_decay, float grad_scale)
{
    const float *grad = grad_in; /* the CPU's gradients are fp32 */
    // param, master, grad, mom are (n)
    // mom starts at 0 (alloc zero-fills), so the first step gives mom = g as PyTorch's does
    float *p = param;
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] * grad_scale + weight_decay * master[i];
        mom[i] = momentum * mom[i] + g;
        master[i] -= lr * mom[i];
        if (p)
            p[i] = master[i];
    }
}
