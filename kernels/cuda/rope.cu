/* Rotary position embedding in the rotate-half convention of Hugging Face Llama (pairs i and
 * i + D/2), as kernels/cpu/rope.c. One thread per (token, pair index i): it computes the
 * angle once and rotates that pair in every Q and K head of the token's packed row. */
#include "kernels/cuda/common.cuh"

template <typename T>
__global__ void rope_kernel(T *qkv, size_t rows, int T_, int H, int KV, int D, int pos_offset,
                            float theta, int dir)
{
    // qkv is (B*T, (H+2KV)*D): Q heads, K heads, V heads; only Q and K rotate
    const int half = D / 2, heads = H + KV;
    const size_t row_len = (size_t)(H + 2 * KV) * D;
    GRID_STRIDE(idx, rows * half)
    {
        const size_t r = idx / half;
        const int i = (int)(idx % half);
        const double pos = (double)pos_offset + (double)(r % T_);
        // double for the angle, as on the CPU: positions reach 1e5 and more, where a float
        // angle would be off by whole fractions of a turn
        const double ang = pos * pow((double)theta, -2.0 * i / D);
        const float c = (float)cos(ang), s = (float)(dir * sin(ang));
        T *x = qkv + r * row_len + i;
        for (int h = 0; h < heads; h++) {
            T *x1 = x + (size_t)h * D, *x2 = x1 + half;
            const float a = to_f(*x1), b = to_f(*x2);
            *x1 = from_f<T>(a * c - b * s);
            *x2 = from_f<T>(b * c + a * s);
        }
    }
}

/* dir = +1 rotates; dir = -1 rotates back, which is also the backward (a rotation's
 * transpose is its inverse). */
template <typename T>
static void rope_apply(void *qkv, int B, int T_, int H, int KV, int D, int pos_offset,
                       float theta, int dir)
{
    KERN_CHECK(D % 2 == 0, "rope: head dimension must be even");
    const size_t rows = (size_t)B * T_, n = rows * (size_t)(D / 2);
    if (n == 0)
        return;
    KLAUNCH(rope_kernel<T>, kern_grid(n, KERN_THREADS), KERN_THREADS, 0, (T *)qkv, rows, T_, H,
            KV, D, pos_offset, theta, dir);
}

template <typename T>
static void rope_fwd(void *qkv, int B, int T_, int H, int KV, int D, int pos_offset, float theta)
{
    rope_apply<T>(qkv, B, T_, H, KV, D, pos_offset, theta, 1);
}

template <typename T>
static void rope_bwd(void *dqkv, int B, int T_, int H, int KV, int D, int pos_offset, float theta)
{
    rope_apply<T>(dqkv, B, T_, H, KV, D, pos_offset, theta, -1);
}

template <typename T> static void fill(KernBackend *k)
{
    k->rope_fwd = rope_fwd<T>;
    k->rope_bwd = rope_bwd<T>;
}

void kern_cuda_table_rope(KernBackend *k)
{
    if (k->act == PX_FP32)
        fill<float>(k);
    else if (k->act == PX_BF16)
        fill<__nv_bfloat16>(k);
    else
        fill<__half>(k);
}
