/* AdamW and SGD with momentum on fp32 master weights, elementwise as kernels/cpu/optim.c, with
 * the act copy of the weights (param, when not NULL) refreshed from the master in the same
 * pass. */
#include "kernels/cuda/common.cuh"

template <typename T>
__global__ void adamw_kernel(T *param, float *master, const float *grad, float *m, float *v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bc1, float bc2, float grad_scale)
{
    // param, master, grad, m, v are (n)
    GRID_STRIDE(i, n)
    {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / bc1, vhat = vi / bc2;
        const float w = master[i] - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * master[i]);
        master[i] = w;
        if (param)
            param[i] = from_f<T>(w);
    }
}

template <typename T>
__global__ void sgd_kernel(T *param, float *master, const float *grad, float *mom, size_t n,
                           float lr, float momentum, float weight_decay, float grad_scale)
{
    GRID_STRIDE(i, n)
    {
        const float g = grad[i] * grad_scale + weight_decay * master[i];
        const float mo = momentum * mom[i] + g;
        mom[i] = mo;
        const float w = master[i] - lr * mo;
        master[i] = w;
        if (param)
            param[i] = from_f<T>(w);
    }
}

template <typename T>
static void adamw(void *param, float *master, const float *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale)
{
    KERN_CHECK(t >= 1, "adamw: the step t is 1-based");
    if (n == 0)
        return;
    // the corrections in double on the host, as the CPU computes them: 1 - beta2^t is ~1e-3
    // for early steps with beta2 = 0.999
    const float bc1 = (float)(1.0 - pow(beta1, t)), bc2 = (float)(1.0 - pow(beta2, t));
    KLAUNCH(adamw_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)param, master, grad,
            m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale);
}

template <typename T>
static void sgd_momentum(void *param, float *master, const float *grad, float *mom, size_t n,
                         float lr, float momentum, float weight_decay, float grad_scale)
{
    if (n == 0)
        return;
    KLAUNCH(sgd_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)param, master, grad,
            mom, n, lr, momentum, weight_decay, grad_scale);
}

template <typename T> static void fill(KernBackend *k)
{
    k->adamw = adamw<T>;
    k->sgd_momentum = sgd_momentum<T>;
}

void kern_cuda_table_optim(KernBackend *k)
{
    if (k->act == PX_BF16)
        fill<__nv_bfloat16>(k);
    else
        fill<__half>(k);
}
