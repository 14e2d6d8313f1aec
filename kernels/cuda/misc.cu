/* Elementwise kernels: residual adds, inverted dropout on the counter-based stream of
 * kernels.h (the very function the CPU calls, compiled for the device), the fp32 helpers of
 * the optimizer step (gradient norm in double, finiteness, scaling) and the act <-> fp32
 * casts. sumsq and all_finite return to the host, so they wait for the device. */
#include "kernels/cuda/common.cuh"

/* out = op(x, y) elementwise, in fp32. When every pointer is 16-byte aligned each thread moves
 * 8 elements per access (16 bytes of act, 2 x 16 of fp32; HOPPER.md: wide, coalesced accesses
 * keep enough bytes in flight to approach the memory bandwidth), and the last n % 8 elements
 * go one by one; unaligned views (a slice at an odd offset) take the scalar loop throughout.
 * y may be NULL (unary ops). out may alias x or y: each element is read before it is written,
 * by the same thread. */
template <typename S, int N> struct alignas(16) Pack {
    S v[N];
};

template <typename O, typename X, typename Y, typename Op>
__global__ void map_kernel(O *out, const X *x, const Y *y, size_t n, int vec, Op op)
{
    size_t done = 0;
    if (vec) {
        const size_t nv = n / 8;
        GRID_STRIDE(i, nv)
        {
            const Pack<X, 8> a = reinterpret_cast<const Pack<X, 8> *>(x)[i];
            Pack<Y, 8> b;
            if (y)
                b = reinterpret_cast<const Pack<Y, 8> *>(y)[i];
            Pack<O, 8> o;
            for (int j = 0; j < 8; j++)
                o.v[j] = from_f<O>(op(to_f(a.v[j]), y ? to_f(b.v[j]) : 0.0f));
            reinterpret_cast<Pack<O, 8> *>(out)[i] = o;
        }
        done = nv * 8;
    }
    GRID_STRIDE(i, n - done)
    {
        const size_t k = done + i;
        out[k] = from_f<O>(op(to_f(x[k]), y ? to_f(y[k]) : 0.0f));
    }
}

struct OpAdd {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct OpCopy {
    __device__ float operator()(float a, float) const { return a; }
};
struct OpScale {
    float s;
    __device__ float operator()(float a, float) const { return a * s; }
};

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename O, typename X, typename Y, typename Op>
static void ew_map(O *out, const X *x, const Y *y, size_t n, Op op)
{
    if (n == 0)
        return;
    const int vec = aligned16(out) && aligned16(x) && (!y || aligned16(y));
    KLAUNCH_N((map_kernel<O, X, Y, Op>), vec ? n / 8 + 1 : n, out, x, y, n, vec, op);
}

template <typename T>
__global__ void dropout_fwd_kernel(T *out, uint8_t *mask, const T *inp, size_t n, float p,
                                   float scale, uint64_t seed)
{
    GRID_STRIDE(i, n)
    {
        const int keep = kern_dropout_keep(seed, i, p);
        mask[i] = (uint8_t)keep;
        out[i] = from_f<T>(keep ? to_f(inp[i]) * scale : 0.0f);
    }
}

template <typename T>
__global__ void dropout_bwd_kernel(T *dinp, const T *dout, const uint8_t *mask, size_t n,
                                   float scale)
{
    GRID_STRIDE(i, n)
        dinp[i] = from_f<T>(mask[i] ? to_f(dout[i]) * scale : 0.0f);
}

/* double: a gradient norm sums ~1e9 squares, where float would lose the small ones */
__global__ void sumsq_kernel(double *sum, const float *x, size_t n)
{
    double s = 0.0;
    GRID_STRIDE(i, n)
        s += (double)x[i] * x[i];
    s = block_sum_d(s);
    if (threadIdx.x == 0)
        atomicAdd(sum, s);
}

__global__ void all_finite_kernel(int *bad, const float *x, size_t n)
{
    GRID_STRIDE(i, n)
        if (!isfinite(x[i]))
            *bad = 1; /* every writer writes the same value */
}

template <typename T> static void add(void *out, const void *a, const void *b, size_t n)
{
    if (n)
        ew_map((T *)out, (const T *)a, (const T *)b, n, OpAdd());
}

template <typename T> static void add_inplace(void *out, const void *a, size_t n)
{
    if (n)
        ew_map((T *)out, (const T *)out, (const T *)a, n, OpAdd());
}

template <typename T>
__global__ void copy_cols_kernel(T *dst, int ldd, const T *src, int lds, int cols, size_t n, int add)
{
    GRID_STRIDE(i, n) {
        const size_t r = i / (size_t)cols, c = i % (size_t)cols;
        T *o = dst + r * (size_t)ldd + c;
        const T x = src[r * (size_t)lds + c];
        *o = add ? from_f<T>(to_f(*o) + to_f(x)) : x;
    }
}

template <typename T>
static void copy_cols(void *dst, int ldd, const void *src, int lds, int rows, int cols, int add)
{
    KERN_CHECK(rows >= 0 && cols >= 0 && ldd >= cols && lds >= cols, "copy_cols: bad shape");
    const size_t n = (size_t)rows * (size_t)cols;
    if (n)
        KLAUNCH_N(copy_cols_kernel<T>, n, (T *)dst, ldd, (const T *)src, lds, cols, n, add);
}

template <typename T>
static void dropout_fwd(void *out, uint8_t *mask, const void *inp, size_t n, float p,
                        uint64_t seed)
{
    KERN_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1)");
    if (n)
        KLAUNCH_N(dropout_fwd_kernel<T>, n, (T *)out, mask, (const T *)inp, n, p,
                1.0f / (1.0f - p), seed);
}

template <typename T>
static void dropout_bwd(void *dinp, const void *dout, const uint8_t *mask, size_t n, float p)
{
    KERN_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1)");
    if (n)
        KLAUNCH_N(dropout_bwd_kernel<T>, n, (T *)dinp, (const T *)dout, mask, n,
                1.0f / (1.0f - p));
}

static double sumsq(const float *x, size_t n)
{
    if (n == 0)
        return 0.0;
    const KernCudaCtx *c = kern_cuda_ctx();
    double s = 0.0;
    cudaCheck(cudaMemsetAsync(c->sum, 0, sizeof *c->sum, 0));
    KLAUNCH_N(sumsq_kernel, n, c->sum, x, n);
    cudaCheck(cudaMemcpy(&s, c->sum, sizeof s, cudaMemcpyDeviceToHost));
    return s;
}

static int all_finite(const float *x, size_t n)
{
    if (n == 0)
        return 1;
    const KernCudaCtx *c = kern_cuda_ctx();
    int bad = 0;
    cudaCheck(cudaMemsetAsync(c->flag, 0, sizeof *c->flag, 0));
    KLAUNCH_N(all_finite_kernel, n, c->flag, x, n);
    cudaCheck(cudaMemcpy(&bad, c->flag, sizeof bad, cudaMemcpyDeviceToHost));
    return !bad;
}

__global__ void fill_cols_kernel(float *x, int ld, int c0, int w, size_t n, float value)
{
    GRID_STRIDE(i, n)
        x[(i / (size_t)w) * (size_t)ld + (size_t)c0 + i % (size_t)w] = value;
}

static void fill_cols_f32(float *x, int N, int ld, int c0, int c1, float value)
{
    KERN_CHECK(N >= 0 && c0 >= 0 && c0 <= c1 && c1 <= ld, "fill_cols_f32: columns outside the row");
    const size_t n = (size_t)N * (size_t)(c1 - c0);
    if (n)
        KLAUNCH_N(fill_cols_kernel, n, x, ld, c0, c1 - c0, n, value);
}

static void add_f32(float *out, const float *a, size_t n)
{
    if (n)
        ew_map(out, (const float *)out, a, n, OpAdd());
}

static void scale_f32(float *x, size_t n, float s)
{
    if (n)
        ew_map(x, (const float *)x, (const float *)NULL, n, OpScale{s});
}

template <typename T> static void cast_to_act(void *out, const float *inp, size_t n)
{
    if (n)
        ew_map((T *)out, inp, (const float *)NULL, n, OpCopy());
}

template <typename T> static void cast_to_f32(float *out, const void *inp, size_t n)
{
    if (n)
        ew_map(out, (const T *)inp, (const T *)NULL, n, OpCopy());
}

template <typename T> static void acc_to_f32(float *out, const void *inp, size_t n)
{
    if (n)
        ew_map(out, (const float *)out, (const T *)inp, n, OpAdd());
}

template <typename T> static void fill(KernBackend *k)
{
    k->add = add<T>;
    k->add_inplace = add_inplace<T>;
    k->copy_cols = copy_cols<T>;
    k->dropout_fwd = dropout_fwd<T>;
    k->dropout_bwd = dropout_bwd<T>;
    k->cast_to_act = cast_to_act<T>;
    k->cast_to_f32 = cast_to_f32<T>;
    k->acc_to_f32 = acc_to_f32<T>;
}

void kern_cuda_table_misc(KernBackend *k)
{
    if (k->act == PX_FP32)
        fill<float>(k);
    else if (k->act == PX_BF16)
        fill<__nv_bfloat16>(k);
    else
        fill<__half>(k);
    k->sumsq = sumsq;
    k->all_finite = all_finite;
    k->scale_f32 = scale_f32;
    k->fill_cols_f32 = fill_cols_f32;
    k->add_f32 = add_f32;
}
