/* GELU (tanh approximation, as GPT-2) and SwiGLU (as Llama), forward and backward, elementwise
 * in fp32. Backward outputs are overwritten. Each thread reads an element's inputs before it
 * writes its outputs, so dinp may alias dout (gelu) or inp (swiglu) as on the CPU. */
#include "kernels/cuda/common.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

template <typename T>
__global__ void gelu_fwd_kernel(T *out, const T *inp, size_t n)
{
    GRID_STRIDE(i, n)
    {
        const float x = to_f(inp[i]);
        const float u = GELU_K * (x + GELU_C * x * x * x);
        out[i] = from_f<T>(0.5f * x * (1.0f + tanhf(u)));
    }
}

template <typename T>
__global__ void gelu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n)
{
    GRID_STRIDE(i, n)
    {
        const float x = to_f(inp[i]);
        const float u = GELU_K * (x + GELU_C * x * x * x);
        const float th = tanhf(u);
        const float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        // d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx
        const float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] = from_f<T>(grad * to_f(dout[i]));
    }
}

/* 1 / (1 + e^-x): for x very negative e^-x overflows to inf and the result is the correct 0 */
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *inp, size_t n, int F)
{
    // out is (N,F) flattened to n; inp is (N,2F), each row [gate | up]
    GRID_STRIDE(i, n)
    {
        const size_t row = i / F, col = i % F;
        const T *gate = inp + row * 2 * F;
        const float g = to_f(gate[col]), u = to_f(gate[F + col]);
        out[i] = from_f<T>(g * sigmoid(g) * u);
    }
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dinp, const T *inp, const T *dout, size_t n, int F)
{
    // dinp, inp are (N,2F) as [gate | up]; dout is (N,F) flattened to n
    GRID_STRIDE(i, n)
    {
        const size_t row = i / F, col = i % F;
        const T *gate = inp + row * 2 * F;
        T *dgate = dinp + row * 2 * F;
        const float g = to_f(gate[col]), u = to_f(gate[F + col]), d = to_f(dout[i]);
        const float s = sigmoid(g);
        // silu'(g) = s (1 + g (1 - s))
        dgate[col] = from_f<T>(d * u * s * (1.0f + g * (1.0f - s)));
        dgate[F + col] = from_f<T>(d * g * s);
    }
}

template <typename T> static void gelu_fwd(void *out, const void *inp, size_t n)
{
    if (n)
        KLAUNCH(gelu_fwd_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)out,
                (const T *)inp, n);
}

template <typename T> static void gelu_bwd(void *dinp, const void *inp, const void *dout, size_t n)
{
    if (n)
        KLAUNCH(gelu_bwd_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)dinp,
                (const T *)inp, (const T *)dout, n);
}

template <typename T> static void swiglu_fwd(void *out, const void *inp, int N, int F)
{
    const size_t n = (size_t)N * F;
    if (n)
        KLAUNCH(swiglu_fwd_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)out,
                (const T *)inp, n, F);
}

template <typename T>
static void swiglu_bwd(void *dinp, const void *inp, const void *dout, int N, int F)
{
    const size_t n = (size_t)N * F;
    if (n)
        KLAUNCH(swiglu_bwd_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)dinp,
                (const T *)inp, (const T *)dout, n, F);
}

template <typename T> static void fill(KernBackend *k)
{
    k->gelu_fwd = gelu_fwd<T>;
    k->gelu_bwd = gelu_bwd<T>;
    k->swiglu_fwd = swiglu_fwd<T>;
    k->swiglu_bwd = swiglu_bwd<T>;
}

void kern_cuda_table_activations(KernBackend *k)
{
    if (k->act == PX_FP32)
        fill<float>(k);
    else if (k->act == PX_BF16)
        fill<__nv_bfloat16>(k);
    else
        fill<__half>(k);
}
