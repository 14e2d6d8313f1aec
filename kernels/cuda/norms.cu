/* LayerNorm and RMSNorm, forward and backward: one warp per row, statistics in fp32 from two
 * passes over the row (the mean, then the squares about it: E[x^2] - E[x]^2 cancels badly
 * when the mean is large against the spread), recomputed in the backward (kernels.h: never
 * saved). The weight (and bias) gradients sum over every row: each block adds its rows into
 * shared-memory columns, then adds those into dw (db) with one atomic per column, so global
 * atomics number blocks x C rather than N x C. 16-bit gradients (KernBackend.grad) are summed
 * by one block in shared memory and added once, each column rounded once per call. */
#include "kernels/cuda/common.cuh"

enum { NORM_WARPS = 8 };

/* Mean (0 for RMSNorm) and 1/sqrt(var + eps) of one row, on every lane of the warp. */
template <typename T>
__device__ __forceinline__ void norm_stats(float *mean, float *rstd, const T *x, int C,
                                           float eps, int center, int lane)
{
    float m = 0.0f;
    if (center) {
        float s = 0.0f;
        for (int i = lane; i < C; i += 32)
            s += to_f(x[i]);
        m = warp_sum(s) / C;
    }
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = to_f(x[i]) - m;
        v += d * d;
    }
    v = warp_sum(v) / C;
    *mean = m;
    *rstd = 1.0f / sqrtf(v + eps);
}

template <typename T>
__global__ void norm_fwd_kernel(T *out, const T *inp, const T *w, const T *b, int N, int C,
                                float eps, int center)
{
    // out, inp are (N,C); w, b are (C); b may be NULL
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int row = blockIdx.x * NORM_WARPS + warp; row < N; row += gridDim.x * NORM_WARPS) {
        const T *x = inp + (size_t)row * C;
        T *o = out + (size_t)row * C;
        float mean, rstd;
        norm_stats(&mean, &rstd, x, C, eps, center, lane);
        for (int i = lane; i < C; i += 32) {
            float xhat = (to_f(x[i]) - mean) * rstd;
            o[i] = from_f<T>(xhat * to_f(w[i]) + (b ? to_f(b[i]) : 0.0f));
        }
    }
}

/* With xhat = (x - mean) rstd and g = dout * w:
 * dx = rstd (g - mean(g) - xhat mean(g xhat)) for LayerNorm, and without the mean(g) term for
 * RMSNorm (center = 0, mean = 0). dw += dout xhat, db += dout. */
template <typename T, typename G>
__global__ void norm_bwd_kernel(T *dinp, G *dw, G *db, const T *dout, const T *inp,
                                const T *w, int N, int C, float eps, int center, int use_smem)
{
    // dinp, dout, inp are (N,C); dw, db, w are (C); db may be NULL
    float *sdw = dyn_smem<float>(), *sdb = sdw + C;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (use_smem) {
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            sdw[i] = 0.0f;
            if (db)
                sdb[i] = 0.0f;
        }
    }
    __syncthreads();
    for (int row = blockIdx.x * NORM_WARPS + warp; row < N; row += gridDim.x * NORM_WARPS) {
        const size_t off = (size_t)row * C;
        const T *x = inp + off, *dy = dout + off;
        T *dx = dinp + off;
        float mean, rstd;
        norm_stats(&mean, &rstd, x, C, eps, center, lane);
        float sg = 0.0f, sgx = 0.0f;
        for (int i = lane; i < C; i += 32) {
            float g = to_f(dy[i]) * to_f(w[i]);
            sg += g;
            sgx += g * ((to_f(x[i]) - mean) * rstd);
        }
        const float mg = center ? warp_sum(sg) / C : 0.0f, mgx = warp_sum(sgx) / C;
        for (int i = lane; i < C; i += 32) {
            const float d = to_f(dy[i]), xhat = (to_f(x[i]) - mean) * rstd;
            dx[i] = from_f<T>(to_f(dx[i]) + rstd * (d * to_f(w[i]) - mg - xhat * mgx));
            if (use_smem) { // branches rather than a select, so that these are shared atomics
                atomicAdd(&sdw[i], d * xhat);
                if (db)
                    atomicAdd(&sdb[i], d);
            } else { // fp32 gradients only (norm_bwd)
                grad_add(&dw[i], d * xhat);
                if (db)
                    grad_add(&db[i], d);
            }
        }
    }
    __syncthreads();
    if (use_smem) {
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            grad_add(&dw[i], sdw[i]);
            if (db)
                grad_add(&db[i], sdb[i]);
        }
    }
}

static unsigned norm_grid(int N, int most)
{
    unsigned want = (unsigned)((N + NORM_WARPS - 1) / NORM_WARPS);
    return want < (unsigned)most ? (want ? want : 1u) : (unsigned)most;
}

template <typename T>
static void norm_fwd(void *out, const void *inp, const void *w, const void *b, int N, int C,
                     float eps, int center)
{
    KERN_CHECK(N >= 0 && C > 0, "norm: bad sizes");
    if (N == 0)
        return;
    KLAUNCH(norm_fwd_kernel<T>, norm_grid(N, kern_cuda_ctx()->sms * 16), NORM_WARPS * 32, 0,
            (T *)out, (const T *)inp, (const T *)w, (const T *)b, N, C, eps, center);
}

template <typename T, typename G>
static void norm_bwd(void *dinp, void *dw, void *db, const void *dout, const void *inp,
                     const void *w, int N, int C, float eps, int center)
{
    KERN_CHECK(N >= 0 && C > 0, "norm: bad sizes");
    KERN_CHECK(dinp != dout, "norm backward: dinp must not alias dout");
    if (N == 0)
        return;
    // Columns in shared memory when they fit (C up to ~28k floats on an H100 with both dw and
    // db); otherwise straight to global atomics, slower but the same sums.
    size_t smem = (size_t)C * sizeof(float) * (db ? 2 : 1);
    int use_smem = smem <= kern_cuda_ctx()->smem_optin;
    // 16-bit gradients: one block, whose shared columns are the only writer of each element
    const int one = sizeof(G) < sizeof(float);
    KERN_CHECK(use_smem || !one, "norm backward: 16-bit gradients need the columns in shared "
                                 "memory");
    if (use_smem)
        kern_cuda_smem_optin((const void *)norm_bwd_kernel<T, G>, smem, "norm backward");
    else
        smem = 0;
    KLAUNCH((norm_bwd_kernel<T, G>), one ? 1u : norm_grid(N, kern_cuda_ctx()->sms * 2),
            NORM_WARPS * 32, smem, (T *)dinp, (G *)dw, (G *)db, (const T *)dout, (const T *)inp,
            (const T *)w, N, C, eps, center, use_smem);
}

template <typename T>
static void layernorm_fwd(void *out, const void *inp, const void *w, const void *b, int N, int C,
                          float eps)
{
    norm_fwd<T>(out, inp, w, b, N, C, eps, 1);
}

template <typename T, typename G>
static void layernorm_bwd(void *dinp, void *dw, void *db, const void *dout, const void *inp,
                          const void *w, int N, int C, float eps)
{
    norm_bwd<T, G>(dinp, dw, db, dout, inp, w, N, C, eps, 1);
}

template <typename T>
static void rmsnorm_fwd(void *out, const void *inp, const void *w, int N, int C, float eps)
{
    norm_fwd<T>(out, inp, w, NULL, N, C, eps, 0);
}

template <typename T, typename G>
static void rmsnorm_bwd(void *dinp, void *dw, const void *dout, const void *inp, const void *w,
                        int N, int C, float eps)
{
    norm_bwd<T, G>(dinp, dw, NULL, dout, inp, w, N, C, eps, 0);
}

template <typename T, typename G> static void fill(KernBackend *k)
{
    k->layernorm_fwd = layernorm_fwd<T>;
    k->layernorm_bwd = layernorm_bwd<T, G>;
    k->rmsnorm_fwd = rmsnorm_fwd<T>;
    k->rmsnorm_bwd = rmsnorm_bwd<T, G>;
}

void kern_cuda_table_norms(KernBackend *k)
{
    // gradients in fp32 or in the act dtype (KernBackend.grad); fp32 activations, fp32 ones
    if (k->act == PX_FP32)
        fill<float, float>(k);
    else if (k->act == PX_BF16)
        k->grad == PX_FP32 ? fill<__nv_bfloat16, float>(k) : fill<__nv_bfloat16, __nv_bfloat16>(k);
    else
        k->grad == PX_FP32 ? fill<__half, float>(k) : fill<__half, __half>(k);
}
