/* AdamW and SGD with momentum on fp32 master weights, elementwise as kernels/cpu/optim.c, with
 * the act copy of the weights (param, when not NULL) refreshed from the master in the same
 * pass; the gradients are read in their dtype (KernBackend.grad) into the fp32 update, and
 * their sum of squares (the global norm's share) likewise. 8-bit Adam's quantization blocks
 * decoded and coded as kernels/cpu/optim.c does, code for code. */
#include "kernels/cuda/common.cuh"

/* AdamW on one element (adamw_kernel's and adam8_kernel's; kern_host_adamw computes the same):
 * m and v updated in place, the master's new value returned. */
__device__ __forceinline__ float adamw_elem(float *master, float g, float *m, float *v, float lr,
                                            float beta1, float beta2, float eps,
                                            float weight_decay, float bc1, float bc2)
{
    const float mi = beta1 * *m + (1.0f - beta1) * g;
    const float vi = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mi;
    *v = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    const float w = *master - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * *master);
    *master = w;
    return w;
}

template <typename T, typename G>
__global__ void adamw_kernel(T *param, float *master, const G *grad, float *m, float *v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float bc1, float bc2, float grad_scale)
{
    // param, master, grad, m, v are (n)
    GRID_STRIDE(i, n)
    {
        const float w = adamw_elem(&master[i], to_f(grad[i]) * grad_scale, &m[i], &v[i], lr,
                                   beta1, beta2, eps, weight_decay, bc1, bc2);
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

/* ---- 8-bit Adam's quantization blocks (kernels/cpu/optim.c computes the same) ---- */

/* The code nearest x in the ascending table t: kernels/cpu/optim.c's adam8_code on the device,
 * so that both backends choose the same code for the same value. */
__device__ __forceinline__ uint8_t adam8_code(const float *t, float x, int keep_positive)
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

enum { ADAM8_PER_THREAD = KERN_ADAM8_BLOCK / KERN_THREADS };
static_assert(KERN_ADAM8_BLOCK % KERN_THREADS == 0, "a thread's share of a quantization block");
// the call travels by value among the kernel's parameters, which take 4 KiB
static_assert(sizeof(KernAdam8) + 128 <= 4096, "KernAdam8 fits a kernel's parameters");

/* One block a quantization block of the state, from the one holding element a.begin[0]: its
 * values decoded into registers, the segments' elements updated, the block's new absmax
 * (a maximum is exact in any order: the CPU's sequential one), and every value coded against
 * it. A block no segment touches returns at once, as the CPU skips it. */
template <typename T, typename G>
__global__ void adam8_kernel(T *param, float *master, const G *grad, uint8_t *m8, uint8_t *v8,
                             float *absmax, const KernAdam8 a, float bc1, float bc2)
{
    const uint64_t base = a.begin[0], nq = (a.state_n + KERN_ADAM8_BLOCK - 1) / KERN_ADAM8_BLOCK;
    const uint64_t q = base / KERN_ADAM8_BLOCK + blockIdx.x, q0 = q * KERN_ADAM8_BLOCK;
    const uint64_t len = a.state_n - q0 < KERN_ADAM8_BLOCK ? a.state_n - q0 : (uint64_t)KERN_ADAM8_BLOCK;
    int touched = 0;
    for (int s = 0; s < a.n; s++)
        touched |= a.begin[s] < q0 + len && a.end[s] > q0;
    if (!touched)
        return;
    const float am = absmax[q], av = absmax[nq + q];
    float m[ADAM8_PER_THREAD], v[ADAM8_PER_THREAD], nm = 0.0f, nv = 0.0f;
    int s = 0; /* the first segment that ends after the element (the elements ascend) */
    for (int k = 0; k < ADAM8_PER_THREAD; k++) {
        const uint64_t i = threadIdx.x + (uint64_t)k * KERN_THREADS, e = q0 + i;
        if (i >= len)
            break;
        m[k] = a.codes[m8[e]] * am;
        v[k] = a.codes[256 + v8[e]] * av;
        while (s < a.n && a.end[s] <= e)
            s++;
        if (s < a.n && a.begin[s] <= e) {
            const uint64_t o = e - base;
            const float w = adamw_elem(&master[o], to_f(grad[o]) * a.grad_scale, &m[k], &v[k],
                                       a.lr, a.beta1, a.beta2, a.eps, a.weight_decay[s], bc1,
                                       bc2);
            if (param)
                param[o] = from_f<T>(w);
        }
        nm = fabsf(m[k]) > nm ? fabsf(m[k]) : nm;
        nv = v[k] > nv ? v[k] : nv;
    }
    nm = block_max(nm);
    nv = block_max(nv);
    for (int k = 0; k < ADAM8_PER_THREAD; k++) {
        const uint64_t i = threadIdx.x + (uint64_t)k * KERN_THREADS;
        if (i >= len)
            break;
        m8[q0 + i] = adam8_code(a.codes, nm > 0.0f ? m[k] / nm : 0.0f, 0);
        v8[q0 + i] = adam8_code(a.codes + 256, nv > 0.0f ? v[k] / nv : 0.0f, 1);
    }
    if (threadIdx.x == 0) {
        absmax[q] = nm;
        absmax[nq + q] = nv;
    }
}

template <typename T, typename G>
static void adam8(void *param, float *master, const void *grad, uint8_t *m8, uint8_t *v8,
                  float *absmax, const KernAdam8 *a)
{
    KERN_CHECK(a->n >= 1 && a->n <= KERN_ADAM8_SEGMENTS, "adam8: 1 to KERN_ADAM8_SEGMENTS segments");
    KERN_CHECK(a->t >= 1, "adam8: the step t is 1-based");
    // the corrections in double on the host, as adamw's
    const float bc1 = (float)(1.0 - pow(a->beta1, a->t)), bc2 = (float)(1.0 - pow(a->beta2, a->t));
    const uint64_t q_first = a->begin[0] / KERN_ADAM8_BLOCK;
    const uint64_t q_last = (a->end[a->n - 1] - 1) / KERN_ADAM8_BLOCK;
    KLAUNCH((adam8_kernel<T, G>), (unsigned)(q_last - q_first + 1), KERN_THREADS, 0, (T *)param,
            master, (const G *)grad, m8, v8, absmax, *a, bc1, bc2);
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
    k->adam8 = adam8<T, G>;
}

void kern_cuda_table_optim(KernBackend *k)
{
    // gradients in fp32 or in the act dtype (KernBackend.grad); fp32 activations, fp32 ones
    if (k->act == PX_FP32)
        fill<float, float>(k);
    else if (k->act == PX_BF16)
        k->grad == PX_FP32 ? fill<__nv_bfloat16, float>(k) : fill<__nv_bfloat16, __nv_bfloat16>(k);
    else
        k->grad == PX_FP32 ? fill<__half, float>(k) : fill<__half, __half>(k);
}
