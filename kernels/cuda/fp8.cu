/* FP8 tensors (kernels.h's KernFp8) on the GPU: quantize with current or delayed scaling,
 * dequantize, the FP8 matmul, and delayed scaling's amax history.
 *
 * The rules kernels.h leaves open are the CPU backend's (kernels/cpu/fp8.c, its header), so
 * that both backends give the same bytes (tests/test_kernels_cuda.c checks it):
 * - Elements are x / scale with an IEEE division (__fdiv_rn, whatever -prec-div says), the
 *   scale being the very one a reader decodes from q's tail.
 * - The amax output is the largest |x| with NaN propagating: atomicMax on the bits of |x|
 *   (sign cleared), which order as +NaN > +inf > the finite values. A block's own scale
 *   (current scaling) comes from its largest finite |x| instead, so that one NaN or infinity
 *   does not poison the block: a NaN element stays NaN, an infinity saturates to +-fmax.
 * - An fp32 scale amax / fmax that underflows to 0 becomes the smallest positive float.
 * - An E8M0 exponent is clamped to -127..127 (a byte of 0..254); an all-zero (or all-NaN, all
 *   infinite) block gets a scale of 1.
 * - E8M0 delayed scaling takes the byte of the given power of two (the CPU backend checks that
 *   it is one; here it lives on the device and is not read on the host).
 * - fp8_amax_update leaves the scale of a column whose max is not finite unchanged.
 *
 * Casts are cuda_fp8.h's: __nv_cvt_float_to_fp8 with __NV_SATFINITE (cvt.rn.satfinite on
 * sm_89 and later: round to nearest even, saturating) and __nv_cvt_fp8_to_halfraw to decode
 * (exact: every E4M3 and E5M2 value is an fp16 value). The cast turns a NaN into 0x7f whatever
 * its sign, where the CPU's px_float_to_e4m3/e5m2 keep the sign (0xff for -NaN): the quantize
 * kernel encodes a NaN itself, with the sign bit of the act value as stored (a NaN's sign may
 * not survive the conversion to fp32: cuda_fp16.hpp's host twin of cvt.f32.f16 drops it).
 *
 * Quantizing takes three launches on the compute stream: the two maxima of each scaling block
 * (several thread blocks per scaling block when it is large, meeting through atomicMax on
 * float bits), the block scales written into q's tail, then the elements. With trans, x is
 * read column by column (strided, uncoalesced): a tiled transpose through shared memory is
 * what a faster version would do.
 *
 * matmul_fp8 takes cuBLASLt's FP8 GEMM where it applies (lt_applies below: per-tensor fp32
 * scales, passed as the A and B scale pointers, and the "TN" layout that sm_89/sm_90 FP8
 * kernels need, which is row-major op(A) op(B) with trans_a = 0 and trans_b = 1: a linear
 * layer's forward, y = x w^T). Every other case (the backward's two GEMMs, blockwise and MXFP8
 * scales, shapes off cuBLASLt's multiples of 16) dequantizes both operands into act temporaries
 * in the context's grow-only workspace and runs the act matmul: the same products accumulated
 * in fp32, except that each decoded value is rounded to act once first (exact for E8M0 and
 * other power-of-two scales under bf16; within 2^-9 relative otherwise). A workspace rather
 * than cudaMallocAsync because it allocates nothing once the largest GEMM has been seen
 * (STYLE.md: nothing allocates in the step loop), at the price of holding that much memory. */
#include "kernels/cuda/common.cuh"

#include <float.h>

#ifndef PX_CUDA_EMU
#include <cuda_fp8.h>
#endif

/* A KernFp8 layout as the kernels take it (by value). */
typedef struct {
    int rows, cols, br, bc; /* br, bc: the block, clipped to the tensor */
    int nbc;                /* blocks across a row of blocks */
    int e5m2, e8m0;
    size_t nscales;
} Fp8Geom;

static Fp8Geom fp8_geom(const KernFp8 *f, const char *what)
{
    KERN_CHECK(f->rows >= 0 && f->cols >= 0, what);
    KERN_CHECK(f->block_r > 0 && f->block_c > 0, what);
    Fp8Geom g;
    g.rows = f->rows;
    g.cols = f->cols;
    g.br = f->block_r < f->rows ? f->block_r : f->rows;
    g.bc = f->block_c < f->cols ? f->block_c : f->cols;
    g.nbc = g.bc ? (f->cols + g.bc - 1) / g.bc : 0;
    g.e5m2 = f->e5m2 != 0;
    g.e8m0 = f->e8m0 != 0;
    g.nscales = kern_fp8_scales(f);
    return g;
}

/* the largest finite value: 448 for E4M3, 57344 for E5M2 */
__device__ __forceinline__ float fp8_max(int e5m2) { return e5m2 ? 57344.0f : 448.0f; }

__device__ __forceinline__ float fp8_decode(uint8_t q, int e5m2)
{
    return __half2float(__nv_cvt_fp8_to_halfraw(q, e5m2 ? __NV_E5M2 : __NV_E4M3));
}

__device__ __forceinline__ uint8_t fp8_encode(float v, int e5m2)
{
    return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

/* The sign bit of an act value as stored (bit 15 of bf16 and fp16 alike, bit 31 of fp32) */
template <typename T> __device__ __forceinline__ unsigned act_sign(T v)
{
    uint16_t u;
    memcpy(&u, &v, sizeof u);
    return u >> 15;
}
template <> __device__ __forceinline__ unsigned act_sign<float>(float v)
{
    return __float_as_uint(v) >> 31;
}

/* The fp32 decode factor of a block whose largest finite |x| is amax (>= 0): amax / fmax, the
 * smallest positive float where that underflows, 1 for an all-zero block */
__device__ __forceinline__ float fp8_scale_f32_of(float amax, float fmax)
{
    if (amax == 0.0f)
        return 1.0f;
    const float s = __fdiv_rn(amax, fmax);
    return s > 0.0f ? s : FLT_TRUE_MIN;
}

/* E8M0: 2^(e - 127), 0xff NaN */
__device__ __forceinline__ float e8m0_decode(uint8_t e)
{
    return e == 0xff ? __uint_as_float(0x7fc00000u) : ldexpf(1.0f, (int)e - 127);
}

/* fp32 scales follow the rows x cols bytes directly (kernels.h), so they are 4-byte aligned
 * only when rows x cols is a multiple of 4: they are moved byte by byte (a misaligned float
 * access faults on the GPU) */
__device__ __forceinline__ float ld_f32(const void *p)
{
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

__device__ __forceinline__ void st_f32(void *p, float v) { memcpy(p, &v, sizeof v); }

/* The decode factor of block b, from q's tail */
__device__ __forceinline__ float fp8_scale_of(const void *scales, const Fp8Geom &g, size_t b)
{
    return g.e8m0 ? e8m0_decode(((const uint8_t *)scales)[b])
                  : ld_f32((const uint8_t *)scales + 4 * b);
}

__device__ __forceinline__ size_t fp8_block_of(const Fp8Geom &g, int r, int c)
{
    return (size_t)(r / g.br) * g.nbc + c / g.bc;
}

/* The largest of v over the thread block, returned to every thread (as block_max, on the bits
 * of non-negative floats, which order as the floats do with NaN above +inf). blockDim.x is a
 * multiple of 32; every thread must call it (it has barriers). */
__device__ __forceinline__ unsigned block_max_bits(unsigned v)
{
    __shared__ unsigned partu[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned w = __shfl_xor_sync(FULL_MASK, v, o);
        v = w > v ? w : v;
    }
    __syncthreads(); /* partu may still be read by a previous call */
    if (lane == 0)
        partu[warp] = v;
    __syncthreads();
    v = lane < warps ? partu[lane] : 0u;
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned w = __shfl_xor_sync(FULL_MASK, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* Per scaling block, its largest finite |x| into block_amax (its scale's amax); the largest
 * |x| of the whole tensor, NaN above +inf above the finite values, into tensor_amax when not
 * NULL: both as float bits, starting at 0. Thread block i works on part i % splits of scaling
 * block i / splits: chunk elements of its flattened block. */
template <typename T>
__global__ void fp8_amax_kernel(unsigned *block_amax, unsigned *tensor_amax, const T *x,
                                Fp8Geom g, int trans, int splits, size_t chunk)
{
    // x is (rows, cols), or (cols, rows) when trans
    const size_t b = blockIdx.x / splits, part = blockIdx.x % splits;
    const int r0 = (int)(b / g.nbc) * g.br, c0 = (int)(b % g.nbc) * g.bc;
    const int h = g.rows - r0 < g.br ? g.rows - r0 : g.br;
    const int w = g.cols - c0 < g.bc ? g.cols - c0 : g.bc;
    const size_t count = (size_t)h * w;
    const size_t end = (part + 1) * chunk < count ? (part + 1) * chunk : count;
    unsigned fin = 0u, all = 0u; /* |x| as bits: the finite ones, and all */
    for (size_t e = part * chunk + threadIdx.x; e < end; e += blockDim.x) {
        const int r = r0 + (int)(e / w), c = c0 + (int)(e % w);
        const T v = trans ? x[(size_t)c * g.rows + r] : x[(size_t)r * g.cols + c];
        /* the sign cleared by hand: fabsf of a NaN may give any NaN */
        const unsigned a = __float_as_uint(to_f(v)) & 0x7fffffffu;
        all = a > all ? a : all;
        if (a < 0x7f800000u && a > fin)
            fin = a;
    }
    fin = block_max_bits(fin);
    all = block_max_bits(all);
    if (threadIdx.x == 0) {
        if (fin > 0u)
            atomicMax(&block_amax[b], fin);
        if (tensor_amax && all > 0u)
            atomicMax(tensor_amax, all);
    }
}

/* Block scales into q's tail: the given decode factor (delayed scaling), or the block's own
 * from its largest finite |x| (kernels.h: amax / fmax; E8M0 2^(floor(log2 amax) - emax); 1
 * for zero) */
__global__ void fp8_scales_kernel(void *scales, const unsigned *block_amax, const float *given,
                                  Fp8Geom g)
{
    GRID_STRIDE(b, g.nscales)
    {
        if (!g.e8m0) {
            const float s = given ? *given
                                  : fp8_scale_f32_of(__uint_as_float(block_amax[b]),
                                                     fp8_max(g.e5m2));
            st_f32((uint8_t *)scales + 4 * b, s);
            continue;
        }
        int e = 0; /* the scale 2^e */
        if (given) {
            frexpf(*given, &e); /* a power of two 2^k = 0.5 2^(k + 1) */
            e -= 1;
        } else {
            const float amax = __uint_as_float(block_amax[b]);
            if (amax > 0.0f) {
                frexpf(amax, &e); /* amax = f 2^e, f in [0.5, 1): floor(log2 amax) = e - 1 */
                e = e - 1 - (g.e5m2 ? 15 : 8);
            }
        }
        e = e < -127 ? -127 : e > 127 ? 127 : e;
        ((uint8_t *)scales)[b] = (uint8_t)(e + 127);
    }
}

template <typename T>
__global__ void fp8_quantize_kernel(uint8_t *q, const T *x, Fp8Geom g, int trans)
{
    // q is (rows, cols) then its scales; x is (rows, cols), or (cols, rows) when trans
    const size_t n = (size_t)g.rows * g.cols;
    const void *scales = q + n;
    GRID_STRIDE(i, n)
    {
        const int r = (int)(i / g.cols), c = (int)(i % g.cols);
        const T v = trans ? x[(size_t)c * g.rows + r] : x[i];
        const float f = to_f(v);
        if (isnan(f))
            q[i] = act_sign(v) ? 0xff : 0x7f; /* the CPU's NaN, sign kept */
        else
            q[i] = fp8_encode(__fdiv_rn(f, fp8_scale_of(scales, g, fp8_block_of(g, r, c))),
                              g.e5m2);
    }
}

template <typename T>
__global__ void fp8_dequantize_kernel(T *x, const uint8_t *q, const void *given, Fp8Geom g)
{
    const size_t n = (size_t)g.rows * g.cols;
    const void *scales = given ? given : q + n;
    GRID_STRIDE(i, n)
    {
        const int r = (int)(i / g.cols), c = (int)(i % g.cols);
        x[i] = from_f<T>(fp8_decode(q[i], g.e5m2) * fp8_scale_of(scales, g, fp8_block_of(g, r, c)));
    }
}

/* elements one thread block of fp8_amax_kernel reduces, at most */
enum { FP8_AMAX_CHUNK = 16 * KERN_THREADS };

template <typename T>
static void fp8_quantize(void *q, float *amax, const void *x, const KernFp8 *f, int trans,
                         const float *scale)
{
    const Fp8Geom g = fp8_geom(f, "fp8_quantize: bad layout");
    KERN_CHECK(!scale || g.nscales <= 1, "fp8_quantize: a given scale needs a one-block layout");
    if (amax)
        cudaCheck(cudaMemsetAsync(amax, 0, sizeof *amax, 0));
    const size_t n = (size_t)g.rows * g.cols;
    if (n == 0)
        return;
    unsigned *block_amax = NULL;
    if (!scale || amax) {
        block_amax = (unsigned *)kern_cuda_workspace(g.nscales * sizeof *block_amax);
        cudaCheck(cudaMemsetAsync(block_amax, 0, g.nscales * sizeof *block_amax, 0));
        // small blocks (MXFP8's 32, 1 x 128) take a thread block of their size; large ones
        // (128 x 128, a whole tensor) are split into chunks
        const size_t per_block = (size_t)g.br * g.bc;
        const int threads =
            per_block >= KERN_THREADS ? KERN_THREADS : (int)((per_block + 31) / 32 * 32);
        const size_t splits = (per_block + FP8_AMAX_CHUNK - 1) / FP8_AMAX_CHUNK;
        const size_t chunk = (per_block + splits - 1) / splits;
        const size_t grid = g.nscales * splits;
        KERN_CHECK(grid <= 0x7fffffffu, "fp8_quantize: too many scaling blocks");
        KLAUNCH(fp8_amax_kernel<T>, (unsigned)grid, threads, 0, block_amax, (unsigned *)amax,
                (const T *)x, g, trans, (int)splits, chunk);
    }
    KLAUNCH_N(fp8_scales_kernel, g.nscales, (uint8_t *)q + n, block_amax, scale, g);
    KLAUNCH_N(fp8_quantize_kernel<T>, n, (uint8_t *)q, (const T *)x, g, trans);
}

/* x from q's elements and the scales at given (NULL: right after the elements) */
template <typename T>
static void fp8_dequantize_with(void *x, const void *q, const void *given, const KernFp8 *f)
{
    const Fp8Geom g = fp8_geom(f, "fp8_dequantize: bad layout");
    const size_t n = (size_t)g.rows * g.cols;
    if (n == 0)
        return;
    KLAUNCH_N(fp8_dequantize_kernel<T>, n, (T *)x, (const uint8_t *)q, given, g);
}

template <typename T> static void fp8_dequantize(void *x, const void *q, const KernFp8 *f)
{
    fp8_dequantize_with<T>(x, q, NULL, f);
}

/* q's transpose: element i of qt (cols x rows) from its place in q; past the elements, the
 * scales' grid transposed (qt's scale t = (j, i) of its nbc x nbr grid is q's (i, j)), byte by
 * byte (sb bytes a scale) */
__global__ void fp8_transpose_kernel(uint8_t *qt, const uint8_t *q, int rows, int cols, size_t nbr,
                                     size_t nbc, size_t sb, size_t total)
{
    const size_t n = (size_t)rows * cols;
    GRID_STRIDE(i, total)
    {
        if (i < n) {
            const size_t c = i / (size_t)rows, r = i % (size_t)rows;
            qt[i] = q[r * (size_t)cols + c];
        } else {
            const size_t t = (i - n) / sb, byte = (i - n) % sb;
            qt[i] = q[n + ((t % nbr) * nbc + t / nbr) * sb + byte];
        }
    }
}

static void fp8_transpose(void *qt, const void *q, const KernFp8 *f)
{
    const Fp8Geom g = fp8_geom(f, "fp8_transpose: bad layout");
    const size_t total = kern_fp8_bytes(f);
    if (total == 0)
        return;
    const size_t nbr = g.nscales / (size_t)g.nbc;
    KLAUNCH_N(fp8_transpose_kernel, total, (uint8_t *)qt, (const uint8_t *)q, g.rows, g.cols, nbr,
              (size_t)g.nbc, (size_t)(g.e8m0 ? 1 : 4), total);
}

/* ---- matmul_fp8 ---- */

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static int per_tensor_f32(const KernFp8 *f)
{
    return !f->e8m0 && f->block_r >= f->rows && f->block_c >= f->cols;
}

/* cuBLASLt's FP8 GEMM on sm_89/sm_90 (cuBLASLt documentation, cublasLtMatmul, "FP8"): A
 * transposed and B not in its column-major terms, not both E5M2, leading dimensions multiples
 * of 16 and 16-byte aligned pointers; one fp32 scale per operand. kernels.h is row-major, so
 * cuBLASLt's A is our B and its B our A (matmul.cu), and TN is trans_a = 0, trans_b = 1. */
static int lt_applies(const void *c, const void *a, const KernFp8 *fa,
                      const void *b, const KernFp8 *fb, int m, int n, int k, int trans_a,
                      int trans_b)
{
    /* m k and n k multiples of 16: the scale pointers after the elements are aligned too */
    return kern_cuda_ctx()->cc >= 89 && !trans_a && trans_b && per_tensor_f32(fa) &&
           per_tensor_f32(fb) && !(fa->e5m2 && fb->e5m2) && m % 16 == 0 && n % 16 == 0 &&
           k % 16 == 0 && k > 0 && aligned16(a) && aligned16(b) && aligned16(c);
}

enum { LT_WORKSPACE_BYTES = 32 << 20 }; /* what NVIDIA suggests for Hopper's cuBLASLt */

template <typename T>
static void lt_matmul(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa, const void *b,
                      const KernFp8 *fb, int m, int n, int k, float alpha, float beta)
{
    // c is (m,n); a is (m,k); b is (n,k): c^T (n x m column-major) = b^T-op(b) a
    const cudaDataType ta = fa->e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
    const cudaDataType tb = fb->e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
    const cudaDataType tc = c_dtype == PX_FP32 ? CUDA_R_32F : ActTraits<T>::blas;
    const float *scale_a = (const float *)((const uint8_t *)a + (size_t)m * k);
    const float *scale_b = (const float *)((const uint8_t *)b + (size_t)n * k);
    void *ws = kern_cuda_workspace(LT_WORKSPACE_BYTES);
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    cublasCheck(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
    cublasCheck(
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                               &scale_b, sizeof scale_b));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                               &scale_a, sizeof scale_a));
    cublasLtMatrixLayout_t la, lb, lc;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, tb, k, n, k)); /* our b, read transposed */
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, ta, k, m, k)); /* our a */
    cublasCheck(cublasLtMatrixLayoutCreate(&lc, tc, n, m, n));
    cublasCheck(cublasLtMatmul(kern_cuda_ctx()->lt, desc, &alpha, b, la, a, lb, &beta, c, lc, c,
                               lc, NULL, ws, LT_WORKSPACE_BYTES, 0));
    cublasCheck(cublasLtMatrixLayoutDestroy(lc));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

static size_t round256(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* matmul_fp8 with the operands' scales at sa and sb (NULL: after their elements); cuBLASLt's
 * path takes them from after the elements only */
template <typename T>
static void matmul_fp8_split(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa,
                             const void *sa, const void *b, const KernFp8 *fb, const void *sb,
                             int m, int n, int k, int trans_a, int trans_b, float alpha,
                             float beta)
{
    // c is (m,n); a is (m,k), or (k,m) when trans_a; b is (k,n), or (n,k) when trans_b
    KERN_CHECK(c_dtype == ActTraits<T>::px || c_dtype == PX_FP32,
               "matmul_fp8: c_dtype must be the act dtype or fp32");
    KERN_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul_fp8: negative size");
    KERN_CHECK(fa->rows == (trans_a ? k : m) && fa->cols == (trans_a ? m : k),
               "matmul_fp8: A's layout is not op(A) [m,k]");
    KERN_CHECK(fb->rows == (trans_b ? n : k) && fb->cols == (trans_b ? k : n),
               "matmul_fp8: B's layout is not op(B) [k,n]");
    KERN_CHECK(k > 0, "matmul_fp8: k must be positive (an FP8 operand has no empty layout)");
    if (m == 0 || n == 0)
        return;
    if (!sa && !sb && lt_applies(c, a, fa, b, fb, m, n, k, trans_a, trans_b)) {
        lt_matmul<T>(c, c_dtype, a, fa, b, fb, m, n, k, alpha, beta);
        return;
    }
    const size_t na = (size_t)m * k, nb = (size_t)k * n;
    unsigned char *ws = (unsigned char *)kern_cuda_workspace(round256(na * sizeof(T)) +
                                                             round256(nb * sizeof(T)) + 256);
    T *da = (T *)ws, *db = (T *)(ws + round256(na * sizeof(T)));
    fp8_dequantize_with<T>(da, a, sa, fa);
    fp8_dequantize_with<T>(db, b, sb, fb);
    kern_cuda_gemm(c, c_dtype == PX_FP32 ? CUDA_R_32F : ActTraits<T>::blas, n, 0, da,
                   trans_a ? m : k, 0, db, trans_b ? k : n, 0, ActTraits<T>::blas, m, n, k,
                   trans_a, trans_b, alpha, beta, 1);
}

template <typename T>
static void matmul_fp8(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa, const void *b,
                       const KernFp8 *fb, int m, int n, int k, int trans_a, int trans_b,
                       float alpha, float beta)
{
    matmul_fp8_split<T>(c, c_dtype, a, fa, NULL, b, fb, NULL, m, n, k, trans_a, trans_b, alpha,
                        beta);
}

/* ---- delayed scaling ---- */

__global__ void fp8_amax_update_kernel(float *history, float *scale, const float *amax,
                                       const float *fmax, int len, int n)
{
    // history is (len, n), row 0 the newest
    // A column whose max is not finite (a NaN or an infinity in the window) keeps its scale.
    GRID_STRIDE(i, (size_t)n)
    {
        float m = 0.0f; /* the largest, NaN propagating */
        for (int r = len; r > 0; r--) {
            const float h = r > 1 ? history[(size_t)(r - 2) * n + i] : amax[i];
            history[(size_t)(r - 1) * n + i] = h;
            if (isnan(h) || h > m)
                m = isnan(m) ? m : h;
        }
        if (isfinite(m))
            scale[i] = fp8_scale_f32_of(m, fmax[i]);
    }
}

static void fp8_amax_update(float *history, float *scale, const float *amax, const float *fmax,
                            int len, int n)
{
    KERN_CHECK(len >= 1 && n >= 0, "fp8_amax_update: len must be at least 1");
    if (n == 0)
        return;
    KLAUNCH_N(fp8_amax_update_kernel, (size_t)n, history, scale, amax, fmax, len, n);
}

/* ---- a weight quantized from flat pieces (kernels.h's fp8_piece_amax, fp8_block_scales,
 * fp8_piece_quantize): a thread an element, the block of element off + i found from its row
 * and column; the maxima meet through atomicMax on the bits of |x| (finite, non-negative:
 * they order as the floats do) ---- */

template <typename T>
__global__ void fp8_piece_amax_kernel(unsigned *amax, const T *x, size_t off, size_t n, Fp8Geom g)
{
    GRID_STRIDE(i, n)
    {
        const size_t e = off + i;
        const unsigned a = __float_as_uint(to_f(x[i])) & 0x7fffffffu;
        if (a < 0x7f800000u && a > 0u)
            atomicMax(&amax[fp8_block_of(g, (int)(e / g.cols), (int)(e % g.cols))], a);
    }
}

template <typename T>
__global__ void fp8_piece_quantize_kernel(uint8_t *q, const T *x, size_t off, size_t n,
                                          Fp8Geom g, const void *scales)
{
    GRID_STRIDE(i, n)
    {
        const size_t e = off + i;
        const float f = to_f(x[i]);
        if (isnan(f))
            q[i] = act_sign(x[i]) ? 0xff : 0x7f; /* the CPU's NaN, sign kept */
        else
            q[i] = fp8_encode(
                __fdiv_rn(f, fp8_scale_of(scales, g,
                                          fp8_block_of(g, (int)(e / g.cols), (int)(e % g.cols)))),
                g.e5m2);
    }
}

static void fp8_piece_check(const Fp8Geom &g, uint64_t off, uint64_t n, const char *what)
{
    KERN_CHECK(off + n >= off && off + n <= (uint64_t)g.rows * (uint64_t)g.cols, what);
}

template <typename T>
static void fp8_piece_amax(float *amax, const void *x, uint64_t off, uint64_t n, const KernFp8 *f)
{
    const Fp8Geom g = fp8_geom(f, "fp8_piece_amax: bad layout");
    fp8_piece_check(g, off, n, "fp8_piece_amax: the piece lies outside its matrix");
    if (n > 0)
        KLAUNCH_N(fp8_piece_amax_kernel<T>, (size_t)n, (unsigned *)amax, (const T *)x,
                  (size_t)off, (size_t)n, g);
}

static void fp8_block_scales(void *scales, const float *amax, const KernFp8 *f)
{
    const Fp8Geom g = fp8_geom(f, "fp8_block_scales: bad layout");
    if (g.nscales > 0)
        KLAUNCH_N(fp8_scales_kernel, g.nscales, scales, (const unsigned *)amax,
                  (const float *)NULL, g);
}

template <typename T>
static void fp8_piece_quantize(uint8_t *q, const void *x, uint64_t off, uint64_t n,
                               const KernFp8 *f, const void *scales)
{
    const Fp8Geom g = fp8_geom(f, "fp8_piece_quantize: bad layout");
    fp8_piece_check(g, off, n, "fp8_piece_quantize: the piece lies outside its matrix");
    if (n > 0)
        KLAUNCH_N(fp8_piece_quantize_kernel<T>, (size_t)n, q, (const T *)x, (size_t)off,
                  (size_t)n, g, scales);
}

template <typename T> static void fill(KernBackend *k)
{
    k->fp8_quantize = fp8_quantize<T>;
    k->fp8_dequantize = fp8_dequantize<T>;
    k->fp8_transpose = fp8_transpose;
    k->matmul_fp8 = matmul_fp8<T>;
    k->matmul_fp8_split = matmul_fp8_split<T>;
    k->fp8_amax_update = fp8_amax_update;
    k->fp8_piece_amax = fp8_piece_amax<T>;
    k->fp8_block_scales = fp8_block_scales;
    k->fp8_piece_quantize = fp8_piece_quantize<T>;
}

void kern_cuda_table_fp8(KernBackend *k)
{
    if (k->act == PX_FP32)
        fill<float>(k);
    else if (k->act == PX_BF16)
        fill<__nv_bfloat16>(k);
    else
        fill<__half>(k);
}
