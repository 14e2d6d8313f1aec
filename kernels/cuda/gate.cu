/* GPT-OSS's and Qwen2-MoE's extras on CUDA (kernels.h, "GPT-OSS's and Qwen2-MoE's extras"): the
 * router's bias on its fp32 logits, the shared experts' sigmoid gate forward and backward, and
 * the attention sinks' gradient (their forward is the attention core's). Rows are short (the
 * hidden width), so a thread takes a whole row, and a column sum a thread per column: plain
 * loops in a fixed order, the same sums on every run. */
#include "kernels/cuda/common.cuh"

template <typename T>
__global__ void add_bias_f32_kernel(float *out, const T *bias, size_t n, int C)
{
    GRID_STRIDE(i, n)
        out[i] += to_f(bias[i % C]);
}

template <typename T> static void add_bias_f32(float *out, const void *bias, int N, int C)
{
    const size_t n = (size_t)N * C;
    if (n)
        KLAUNCH_N(add_bias_f32_kernel<T>, n, out, (const T *)bias, n, C);
}

template <typename T> __device__ float gate_of(const T *x, const T *w, int C)
{
    float s = 0.0f;
    for (int c = 0; c < C; c++)
        s += to_f(x[c]) * to_f(w[c]);
    return 1.0f / (1.0f + expf(-s));
}

template <typename T> __global__ void gate_fwd_kernel(T *y, const T *x, const T *w, int N, int C)
{
    GRID_STRIDE(n, (size_t)N)
    {
        const float g = gate_of(x + n * C, w, C);
        for (int c = 0; c < C; c++)
            y[n * C + c] = from_f<T>(to_f(y[n * C + c]) * g);
    }
}

template <typename T> static void gate_fwd(void *y, const void *x, const void *w, int N, int C)
{
    if (N > 0)
        KLAUNCH_N(gate_fwd_kernel<T>, (size_t)N, (T *)y, (const T *)x, (const T *)w, N, C);
}

template <typename T>
__global__ void gate_bwd_kernel(float *dlogit, T *dhid, T *hid, const T *x, const T *w, int N,
                                int C, int F)
{
    GRID_STRIDE(n, (size_t)N)
    {
        const float g = gate_of(x + n * C, w, C);
        T *dr = dhid + n * F, *hr = hid + n * F;
        float dot = 0.0f;
        for (int f = 0; f < F; f++)
            dot += to_f(dr[f]) * to_f(hr[f]);
        dlogit[n] = dot * g * (1.0f - g);
        for (int f = 0; f < F; f++) {
            dr[f] = from_f<T>(to_f(dr[f]) * g);
            hr[f] = from_f<T>(to_f(hr[f]) * g);
        }
    }
}

template <typename T>
static void gate_bwd(float *dlogit, void *dhid, void *hid, const void *x, const void *w, int N,
                     int C, int F)
{
    if (N > 0)
        KLAUNCH_N(gate_bwd_kernel<T>, (size_t)N, dlogit, (T *)dhid, (T *)hid, (const T *)x,
                  (const T *)w, N, C, F);
}

template <typename T>
__global__ void gate_dx_kernel(T *dx, const float *dlogit, const T *w, size_t n, int C)
{
    GRID_STRIDE(i, n)
        dx[i] = from_f<T>(to_f(dx[i]) + dlogit[i / C] * to_f(w[i % C]));
}

/* A thread per column: its N rows' sum in fp32, added once (a 16-bit gradient rounded once). */
template <typename T, typename G>
__global__ void gate_dw_kernel(G *dw, const float *dlogit, const T *x, int N, int C)
{
    GRID_STRIDE(c, (size_t)C)
    {
        float s = 0.0f;
        for (int n = 0; n < N; n++)
            s += dlogit[n] * to_f(x[(size_t)n * C + c]);
        grad_add(&dw[c], s);
    }
}

template <typename T, typename G>
static void gate_wgrad(void *dx, void *dw, const float *dlogit, const void *x, const void *w,
                       int N, int C)
{
    const size_t n = (size_t)N * C;
    if (n == 0)
        return;
    if (dx)
        KLAUNCH_N(gate_dx_kernel<T>, n, (T *)dx, dlogit, (const T *)w, n, C);
    KLAUNCH_N((gate_dw_kernel<T, G>), (size_t)C, (G *)dw, dlogit, (const T *)x, N, C);
}

/* A thread per head: its B x Tq queries' sum in a fixed order, added to the head's gradient
 * once (a 16-bit one rounded once per call). */
template <typename T, typename G>
__global__ void sink_bwd_kernel(G *dsinks, const T *sinks, const float *lse,
                                const float *drow, const T *dS, int B, int H, int Tq, int Tk)
{
    GRID_STRIDE(h, (size_t)H)
    {
        float acc = 0.0f;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++) {
                const size_t i = ((size_t)b * H + h) * Tq + t;
                if (lse) {
                    acc += expf(to_f(sinks[h]) - lse[i]) * drow[i];
                } else {
                    for (int j = 0; j < Tk; j++)
                        acc += to_f(dS[i * Tk + j]);
                }
            }
        grad_add(&dsinks[h], -acc);
    }
}

template <typename T, typename G>
static void attention_sink_bwd(void *dsinks, const void *sinks, const float *lse,
                               const float *drow, const void *dscores, int B, int H, int Tq,
                               int Tk)
{
    KERN_CHECK((lse && drow) || dscores, "attention_sink_bwd: needs lse and drow, or dscores");
    if (H > 0)
        KLAUNCH_N((sink_bwd_kernel<T, G>), (size_t)H, (G *)dsinks, (const T *)sinks, lse, drow,
                  (const T *)dscores, B, H, Tq, Tk);
}

template <typename T, typename G> static void fill(KernBackend *k)
{
    k->add_bias_f32 = add_bias_f32<T>;
    k->gate_fwd = gate_fwd<T>;
    k->gate_bwd = gate_bwd<T>;
    k->gate_wgrad = gate_wgrad<T, G>;
    k->attention_sink_bwd = attention_sink_bwd<T, G>;
}

void kern_cuda_table_gate(KernBackend *k)
{
    // gradients in fp32 or in the act dtype (KernBackend.grad); fp32 activations, fp32 ones
    if (k->act == PX_FP32)
        fill<float, float>(k);
    else if (k->act == PX_BF16)
        k->grad == PX_FP32 ? fill<__nv_bfloat16, float>(k) : fill<__nv_bfloat16, __nv_bfloat16>(k);
    else
        k->grad == PX_FP32 ? fill<__half, float>(k) : fill<__half, __half>(k);
}
