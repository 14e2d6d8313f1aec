/* AdamW and SGD with momentum on fp32 master weights, elementwise as kernels/cpu/optim.c, with
 * the act copy of the weights (param, when not NULL) refreshed from the master in the same
 * pass; the gradients are read in their dtype (KernBackend.grad) into the fp32 update, and
 * their sum of squares (the global norm's share) likewise. */
#include "kernels/cuda/common.cuh"

template <typename T, typename G>
__global__ void adamw_kernel(T *param, float *master, const G *grad, float *m, float *v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bc1, float bc2, float grad_scale)
{
    // param, master, grad, m, v are (n)
    GRID_STRIDE(i, n)
    {
        const float g = to_f(grad[i]) * grad_scale;
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

template <typename T, typename G>
__global__ void sgd_kernel(T *param, float *master, const G *grad, float *mom, size_t n,
                           float lr, float momentum, float weight_decay, float grad_scale)
{
    GRID_STRIDE(i, n)
    {
        const float g = to_f(grad[i]) * grad_scale + weight_decay * master[i];
        const float mo = momentum * mom[i] + g;
        mom[i] = mo;
        const float w = master[i] - lr * mo;
        master[i] = w;
        if (param)
            param[i] = from_f<T>(w);
    }
}

template <typename T, typename G>
static void adamw(void *param, float *master, const void *grad, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                  float grad_scale)
{
    KERN_CHECK(t >= 1, "adamw: the step t is 1-based");
    if (n == 0)
        return;
    // the corrections in double on the host, as the CPU computes them: 1 - beta2^t is ~1e-3
    // for early steps with beta2 = 0.999
    const float bc1 = (float)(1.0 - pow(beta1, t)), bc2 = (float)(1.0 - pow(beta2, t));
    KLAUNCH((adamw_kernel<T, G>), kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)param, master,
            (const G *)grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale);
}

template <typename T, typename G>
static void sgd_momentum(void *param, float *master, const void *grad, float *mom, size_t n,
                         float lr, float momentum, float weight_decay, float grad_scale)
{
    if (n == 0)
        return;
    KLAUNCH((sgd_kernel<T, G>), kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)param, master,
            (const G *)grad, mom, n, lr, momentum, weight_decay, grad_scale);
}

/* double: a gradient norm sums ~1e9 squares, where float would lose the small ones */
template <typename G> __global__ void grad_sumsq_kernel(double *sum, const G *x, size_t n)
{
    double s = 0.0;
    GRID_STRIDE(i, n)
    {
        const double v = to_f(x[i]);
        s += v * v;
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0)
        atomicAdd(sum, s);
}

template <typename G> static double grad_sumsq(const void *x, size_t n)
{
    if (n == 0)
        return 0.0;
    const KernCudaCtx *c = kern_cuda_ctx();
    double s = 0.0;
    cudaCheck(cudaMemsetAsync(c->sum, 0, sizeof *c->sum, 0));
    KLAUNCH_N(grad_sumsq_kernel<G>, n, c->sum, (const G *)x, n);
    cudaCheck(cudaMemcpy(&s, c->sum, sizeof s, cudaMemcpyDeviceToHost));
    return s;
}

template <typename T, typename G> static void fill(KernBackend *k)
{
    k->adamw = adamw<T, G>;
    k->sgd_momentum = sgd_momentum<T, G>;
    k->grad_sumsq = grad_sumsq<G>;
}

void kern_cuda_table_optim(KernBackend *k)
{
    // gradients in fp32 or in the act dtype (KernBackend.grad)
    if (k->act == PX_BF16)
        k->grad == PX_FP32 ? fill<__nv_bfloat16, float>(k) : fill<__nv_bfloat16, __nv_bfloat16>(k);
    else
        k->grad == PX_FP32 ? fill<__half, float>(k) : fill<__half, __half>(k);
}
