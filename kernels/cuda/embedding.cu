/* Token and learned-position embedding, vocabulary-parallel as kernels/cpu/embedding.c: this
 * rank holds rows v_start .. v_start+V-1 of wte and writes zeros for other tokens. The
 * backward scatters with fp32 atomics, because many rows of a batch carry the same token (and
 * every sequence the same positions). 16-bit gradients (KernBackend.grad) have one
 * thread per column instead, which adds the rows into it in order: each token's gradient row
 * read and written in the gradient dtype, as the op graph counts it (model/ops.c). */
#include "kernels/cuda/common.cuh"

template <typename T>
__global__ void embedding_fwd_kernel(T *out, const int32_t *tokens, const T *wte, const T *wpe,
                                     size_t n, int T_, int pos_offset, int C, int v_start, int V)
{
    // out is (N,C) flattened to n; tokens (N); wte (V,C); wpe (pos_offset+T, C) or NULL
    GRID_STRIDE(i, n)
    {
        const size_t row = i / C, c = i % C;
        // the difference in 64 bits: a token near INT32_MIN minus v_start must not wrap
        const long long local = (long long)tokens[row] - v_start;
        float e = local >= 0 && local < V ? to_f(wte[(size_t)local * C + c]) : 0.0f;
        if (wpe)
            e += to_f(wpe[(size_t)(pos_offset + (int)(row % T_)) * C + c]);
        out[i] = from_f<T>(e);
    }
}

template <typename T>
__global__ void embedding_bwd_kernel(float *dwte, float *dwpe, const T *dout,
                                     const int32_t *tokens, size_t n, int T_, int pos_offset,
                                     int C, int v_start, int V)
{
    GRID_STRIDE(i, n)
    {
        const size_t row = i / C, c = i % C;
        const float d = to_f(dout[i]);
        const long long local = (long long)tokens[row] - v_start;
        if (local >= 0 && local < V)
            atomicAdd(&dwte[(size_t)local * C + c], d);
        if (dwpe)
            atomicAdd(&dwpe[(size_t)(pos_offset + (int)(row % T_)) * C + c], d);
    }
}

/* 16-bit gradients: thread c owns column c of every row of dwte and dwpe */
template <typename T, typename G>
__global__ void embedding_bwd_cols_kernel(G *dwte, G *dwpe, const T *dout, const int32_t *tokens,
                                          int N, int T_, int pos_offset, int C, int v_start,
                                          int V)
{
    GRID_STRIDE(c, (size_t)C)
    {
        for (int row = 0; row < N; row++) {
            const float d = to_f(dout[(size_t)row * C + c]);
            const long long local = (long long)tokens[row] - v_start;
            if (local >= 0 && local < V)
                grad_add(&dwte[(size_t)local * C + c], d);
            if (dwpe)
                grad_add(&dwpe[(size_t)(pos_offset + row % T_) * C + c], d);
        }
    }
}

template <typename T>
static void embedding_fwd(void *out, const int32_t *tokens, const void *wte, const void *wpe,
                          int N, int T_, int pos_offset, int C, int v_start, int V)
{
    KERN_CHECK(T_ > 0 || !wpe, "embedding: positions need T > 0");
    const size_t n = (size_t)N * C;
    if (n)
        KLAUNCH(embedding_fwd_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)out,
                tokens, (const T *)wte, (const T *)wpe, n, T_ > 0 ? T_ : 1, pos_offset, C,
                v_start, V);
}

template <typename T, typename G>
static void embedding_bwd(void *dwte, void *dwpe, const void *dout, const int32_t *tokens,
                          int N, int T_, int pos_offset, int C, int v_start, int V)
{
    KERN_CHECK(T_ > 0 || !dwpe, "embedding: positions need T > 0");
    const size_t n = (size_t)N * C;
    if (!n)
        return;
    if (sizeof(G) < sizeof(float))
        KLAUNCH((embedding_bwd_cols_kernel<T, G>), kern_grid((size_t)C, KERN_THREADS), KERN_THREADS,
                0, (G *)dwte, (G *)dwpe, (const T *)dout, tokens, N, T_ > 0 ? T_ : 1, pos_offset,
                C, v_start, V);
    else
        KLAUNCH(embedding_bwd_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0,
                (float *)dwte, (float *)dwpe, (const T *)dout, tokens, n, T_ > 0 ? T_ : 1,
                pos_offset, C, v_start, V);
}

template <typename T, typename G> static void fill(KernBackend *k)
{
    k->embedding_fwd = embedding_fwd<T>;
    k->embedding_bwd = embedding_bwd<T, G>;
}

void kern_cuda_table_embedding(KernBackend *k)
{
    // gradients in fp32 or in the act dtype (KernBackend.grad); fp32 activations, fp32 ones
    if (k->act == PX_FP32)
        fill<float, float>(k);
    else if (k->act == PX_BF16)
        k->grad == PX_FP32 ? fill<__nv_bfloat16, float>(k) : fill<__nv_bfloat16, __nv_bfloat16>(k);
    else
        k->grad == PX_FP32 ? fill<__half, float>(k) : fill<__half, __half>(k);
}
