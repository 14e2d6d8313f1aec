/* FP8 tensors of kernels.h's KernFp8 layout: their sizes (shared by every backend) and the CPU
 * backend's FP8 kernels, which decode to fp32 and multiply with sgemm.
 *
 * Choices the interface leaves open, made here so that other backends can match them byte for
 * byte:
 * - Elements are px_float_to_e4m3/e5m2(x / scale) with an fp32 division (not x times 1/scale,
 *   which rounds differently in the last bit of fp32 and so, rarely, in the FP8 byte).
 * - The amax output is the largest |x| with NaN propagating: one NaN makes it NaN, so that
 *   delayed scaling and overflow checks see it. A block's own scale (current scaling) comes
 *   from its largest finite |x| instead, so that one NaN or infinity does not turn the whole
 *   block into NaN or zero: NaN stays NaN (0x7f / 0xff), infinities saturate to +-fmax.
 * - An fp32 scale amax / fmax that underflows to 0 (amax below fmax x 2^-149) becomes the
 *   smallest positive float, so that x / scale stays finite (it then saturates).
 * - An E8M0 exponent below -127 (amax below 2^(emax - 127)) is clamped to -127 (byte 0).
 * - E8M0 delayed scaling takes only a power of two from 2^-127 to 2^127 (anything else has no
 *   E8M0 byte); fp32 delayed scaling takes any positive finite decode factor. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

static size_t ceil_div(size_t a, size_t b) { return b ? (a + b - 1) / b : 0; }

size_t kern_fp8_scales(const KernFp8 *f)
{
    if (f->rows <= 0 || f->cols <= 0)
        return 0;
    return ceil_div((size_t)f->rows, (size_t)f->block_r) * ceil_div((size_t)f->cols, (size_t)f->block_c);
}

size_t kern_fp8_bytes(const KernFp8 *f)
{
    if (f->rows <= 0 || f->cols <= 0)
        return 0;
    return (size_t)f->rows * (size_t)f->cols + kern_fp8_scales(f) * (f->e8m0 ? 1 : 4);
}

/* The largest finite value (OCP FP8 specification, table 1) and the exponent of the largest
 * power of two (the OCP MX specification's emax_elem, section 6.3). */
static float fp8_fmax(int e5m2) { return e5m2 ? 57344.0f : 448.0f; }
static int fp8_emax(int e5m2) { return e5m2 ? 15 : 8; }

enum { E8M0_BIAS = 127, E8M0_NAN = 0xff };

static void check_layout(const KernFp8 *f, const char *what)
{
    KERN_CHECK(f != NULL && f->rows >= 0 && f->cols >= 0, what);
    KERN_CHECK(f->block_r >= 1 && f->block_c >= 1, what);
}

/* The scales sit right after the rows x cols bytes, so an fp32 scale may be unaligned. */
static float scale_load(const uint8_t *scales, size_t i, int e8m0)
{
    if (e8m0)
        return scales[i] == E8M0_NAN ? NAN : ldexpf(1.0f, (int)scales[i] - E8M0_BIAS);
    float s;
    memcpy(&s, scales + i * sizeof s, sizeof s);
    return s;
}

static void scale_store_f32(uint8_t *scales, size_t i, float s)
{
    memcpy(scales + i * sizeof s, &s, sizeof s);
}

/* The fp32 decode factor of a block whose largest finite |x| is amax (>= 0). */
static float scale_f32_of(float amax, float fmax)
{
    if (amax == 0.0f)
        return 1.0f;
    float s = amax / fmax;
    return s > 0.0f ? s : FLT_TRUE_MIN;
}

/* The E8M0 exponent of a block whose largest finite |x| is amax (>= 0): floor(log2 amax) -
 * emax, clamped to E8M0's range; 0 (a scale of 1) for an all-zero block. */
static int scale_e8m0_exp(float amax, int emax)
{
    if (amax == 0.0f)
        return 0;
    int e;
    frexpf(amax, &e); /* amax = m 2^e with m in [0.5, 1): floor(log2 amax) = e - 1 */
    e = e - 1 - emax;
    if (e < -E8M0_BIAS)
        e = -E8M0_BIAS;
    if (e > E8M0_BIAS)
        e = E8M0_BIAS;
    return e;
}

void kern_cpu_fp8_quantize(void *q, float *amax, const void *x, const KernFp8 *f, int trans,
                           const float *scale)
{
    // q is (rows,cols) bytes then the scales; x is (rows,cols), or (cols,rows) when trans
    check_layout(f, "fp8_quantize: bad layout (negative size or block)");
    const int rows = f->rows, cols = f->cols, br = f->block_r, bc = f->block_c;
    const float *xf = x;
    uint8_t *qb = q;
    uint8_t *scales = qb + (size_t)rows * cols;
    uint8_t (*encode)(float) = f->e5m2 ? px_float_to_e5m2 : px_float_to_e4m3;
    const float fmax = fp8_fmax(f->e5m2);
    const size_t xs_r = trans ? 1 : (size_t)cols, xs_c = trans ? (size_t)rows : 1;

    int e8m0_delayed = 0;
    if (scale) {
        KERN_CHECK(br >= rows && bc >= cols,
                   "fp8_quantize: delayed scaling (scale != NULL) needs one block of rows x cols");
        KERN_CHECK(*scale > 0.0f && isfinite(*scale),
                   "fp8_quantize: the delayed scale must be positive and finite");
        if (f->e8m0) {
            int e;
            float m = frexpf(*scale, &e);
            KERN_CHECK(m == 0.5f && e - 1 >= -E8M0_BIAS && e - 1 <= E8M0_BIAS,
                       "fp8_quantize: an E8M0 delayed scale must be a power of two in 2^-127..2^127");
            e8m0_delayed = e - 1;
        }
    }

    float total = 0.0f; /* NaN-propagating */
    int nbc = (cols + bc - 1) / bc;
    /* r0 = r1 rather than r0 += br: a block of "rows x cols or more" may be INT_MAX wide */
    for (int r0 = 0, r1; r0 < rows; r0 = r1) {
        r1 = rows - r0 < br ? rows : r0 + br;
        for (int c0 = 0, c1; c0 < cols; c0 = c1) {
            c1 = cols - c0 < bc ? cols : c0 + bc;
            float fin = 0.0f; /* largest finite |x| of the block */
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++) {
                    float a = fabsf(xf[r * xs_r + c * xs_c]);
                    if (isfinite(a) && a > fin)
                        fin = a;
                    if (isnan(a) || a > total)
                        total = isnan(total) ? total : a;
                }
            float s;
            size_t bi = (size_t)(r0 / br) * nbc + (size_t)(c0 / bc);
            if (f->e8m0) {
                int e = scale ? e8m0_delayed : scale_e8m0_exp(fin, fp8_emax(f->e5m2));
                s = ldexpf(1.0f, e);
                scales[bi] = (uint8_t)(e + E8M0_BIAS);
            } else {
                s = scale ? *scale : scale_f32_of(fin, fmax);
                scale_store_f32(scales, bi, s);
            }
            for (int r = r0; r < r1; r++)
                for (int c = c0; c < c1; c++)
                    qb[(size_t)r * cols + c] = encode(xf[r * xs_r + c * xs_c] / s);
        }
    }
    if (amax)
        *amax = total;
}

void kern_cpu_fp8_transpose(void *qt, const void *q, const KernFp8 *f)
{
    // q is (rows,cols) bytes then its scales [nbr, nbc]; qt gets (cols,rows) bytes then the
    // scales transposed [nbc, nbr]: a block_r x block_c block's transpose is a block_c x
    // block_r block of the same values, so of the same scale
    check_layout(f, "fp8_transpose: bad layout (negative size or block)");
    const uint8_t *a = q;
    uint8_t *b = qt;
    const size_t rows = (size_t)f->rows, cols = (size_t)f->cols, sb = f->e8m0 ? 1 : 4;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            b[c * rows + r] = a[r * cols + c];
    const size_t nbr = ceil_div(rows, (size_t)f->block_r), nbc = ceil_div(cols, (size_t)f->block_c);
    for (size_t i = 0; rows && cols && i < nbr; i++)
        for (size_t j = 0; j < nbc; j++)
            memcpy(b + rows * cols + (j * nbr + i) * sb, a + rows * cols + (i * nbc + j) * sb, sb);
}

/* Every code's value, E4M3's then E5M2's: decoding is a lookup (the conversions of common/ are
 * the definition, run once per code). */
static float decode_lut[2][256];
static pthread_once_t decode_once = PTHREAD_ONCE_INIT;

static void decode_init(void)
{
    for (int i = 0; i < 256; i++) {
        decode_lut[0][i] = px_e4m3_to_float((uint8_t)i);
        decode_lut[1][i] = px_e5m2_to_float((uint8_t)i);
    }
}

/* x from q's elements and the scales at given (NULL: right after the elements). */
static void dequantize_with(void *x, const void *q, const void *given, const KernFp8 *f)
{
    // x is (rows,cols); q is (rows,cols) bytes then the scales
    check_layout(f, "fp8_dequantize: bad layout (negative size or block)");
    const int rows = f->rows, cols = f->cols, br = f->block_r, bc = f->block_c;
    const uint8_t *qb = q;
    const uint8_t *scales = given ? (const uint8_t *)given : qb + (size_t)rows * cols;
    pthread_once(&decode_once, decode_init);
    const float *decode = decode_lut[f->e5m2 ? 1 : 0];
    float *xf = x;
    int nbc = (cols + bc - 1) / bc;
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = qb + (size_t)r * cols;
        float *out = xf + (size_t)r * cols;
        size_t b0 = (size_t)(r / br) * nbc;
        for (int c0 = 0, c1; c0 < cols; c0 = c1) {
            c1 = cols - c0 < bc ? cols : c0 + bc;
            const float s = scale_load(scales, b0 + (size_t)(c0 / bc), f->e8m0);
            for (int c = c0; c < c1; c++)
                out[c] = decode[row[c]] * s;
        }
    }
}

void kern_cpu_fp8_dequantize(void *x, const void *q, const KernFp8 *f)
{
    dequantize_with(x, q, NULL, f);
}

/* A decoded copy of q (its scales at given, NULL: after its elements) on the heap, which the
 * caller frees; aborts when out of memory (a kernel has no status to return). */
static float *dequantize_alloc(const void *q, const void *given, const KernFp8 *f)
{
    size_t n = (size_t)f->rows * (size_t)f->cols;
    float *x = malloc((n ? n : 1) * sizeof *x);
    KERN_CHECK(x != NULL, "matmul_fp8: out of memory decoding an operand");
    dequantize_with(x, q, given, f);
    return x;
}

void kern_cpu_matmul_fp8(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa,
                         const void *b, const KernFp8 *fb, int m, int n, int k, int trans_a,
                         int trans_b, float alpha, float beta)
{
    kern_cpu_matmul_fp8_split(c, c_dtype, a, fa, NULL, b, fb, NULL, m, n, k, trans_a, trans_b,
                              alpha, beta);
}

void kern_cpu_matmul_fp8_split(void *c, PxDtype c_dtype, const void *a, const KernFp8 *fa,
                               const void *sa, const void *b, const KernFp8 *fb, const void *sb,
                               int m, int n, int k, int trans_a, int trans_b, float alpha,
                               float beta)
{
    // c is (m,n); a is (m,k), or (k,m) when trans_a; b is (k,n), or (n,k) when trans_b
    // The operands are decoded whole into temporaries of this call (m*k + k*n floats), not into
    // the executor's arenas: the CPU backend is the reference, not the fast path.
    KERN_CHECK(c_dtype == PX_FP32, "matmul_fp8: c_dtype must be fp32 on the CPU");
    KERN_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul_fp8: negative size");
    check_layout(fa, "matmul_fp8: bad layout of A");
    check_layout(fb, "matmul_fp8: bad layout of B");
    KERN_CHECK(fa->rows == (trans_a ? k : m) && fa->cols == (trans_a ? m : k),
               "matmul_fp8: A's layout is not op(A) [m,k]");
    KERN_CHECK(fb->rows == (trans_b ? n : k) && fb->cols == (trans_b ? k : n),
               "matmul_fp8: B's layout is not op(B) [k,n]");
    float *ad = dequantize_alloc(a, sa, fa);
    float *bd = dequantize_alloc(b, sb, fb);
    kern_cpu_matmul(c, c_dtype, ad, bd, m, n, k, trans_a, trans_b, alpha, beta);
    free(ad);
    free(bd);
}

void kern_cpu_fp8_amax_update(float *history, float *scale, const float *amax,
                              const float *fmax, int len, int n)
{
    // history is (len,n), row 0 the newest; scale, amax and fmax are (n)
    // A column whose max is not finite (a NaN or infinite amax in the window) keeps its scale,
    // as Transformer Engine's default scaling-factor update does, rather than taking garbage.
    KERN_CHECK(len >= 1 && n >= 0, "fp8_amax_update: needs len >= 1 and n >= 0");
    if (len > 1)
        memmove(history + n, history, (size_t)(len - 1) * n * sizeof *history);
    for (int i = 0; i < n; i++) {
        history[i] = amax[i];
        float mx = 0.0f;
        for (int j = 0; j < len; j++) {
            float h = history[(size_t)j * n + i];
            if (isnan(h) || h > mx)
                mx = isnan(mx) ? mx : h;
        }
        if (isfinite(mx))
            scale[i] = scale_f32_of(mx, fmax[i]);
    }
}

/* The block (row-major block order) of element e of the row-major matrix of layout f. */
static size_t block_of(const KernFp8 *f, uint64_t e)
{
    const uint64_t cols = (uint64_t)f->cols, r = e / cols, c = e % cols;
    const size_t nbc = ceil_div((size_t)f->cols, (size_t)f->block_c);
    return (size_t)(r / (uint64_t)f->block_r) * nbc + (size_t)(c / (uint64_t)f->block_c);
}

static void check_piece(const KernFp8 *f, uint64_t off, uint64_t n, const char *what)
{
    check_layout(f, what);
    KERN_CHECK(off + n >= off && off + n <= (uint64_t)f->rows * (uint64_t)f->cols, what);
}

void kern_cpu_fp8_piece_amax(float *amax, const void *x, uint64_t off, uint64_t n,
                             const KernFp8 *f)
{
    // x is the n elements [off, off + n) of the (rows,cols) matrix; amax is f's block grid
    check_piece(f, off, n, "fp8_piece_amax: the piece lies outside its matrix");
    const float *xf = x;
    for (uint64_t i = 0; i < n; i++) {
        const float a = fabsf(xf[i]);
        const size_t b = block_of(f, off + i);
        if (isfinite(a) && a > amax[b])
            amax[b] = a;
    }
}

void kern_cpu_fp8_block_scales(void *scales, const float *amax, const KernFp8 *f)
{
    // amax holds each block's largest finite |x| (fp8_piece_amax's): finite, >= 0
    check_layout(f, "fp8_block_scales: bad layout (negative size or block)");
    const size_t n = kern_fp8_scales(f);
    uint8_t *s = scales;
    for (size_t i = 0; i < n; i++) {
        if (f->e8m0)
            s[i] = (uint8_t)(scale_e8m0_exp(amax[i], fp8_emax(f->e5m2)) + E8M0_BIAS);
        else
            scale_store_f32(s, i, scale_f32_of(amax[i], fp8_fmax(f->e5m2)));
    }
}

void kern_cpu_fp8_piece_quantize(uint8_t *q, const void *x, uint64_t off, uint64_t n,
                                 const KernFp8 *f, const void *scales)
{
    check_piece(f, off, n, "fp8_piece_quantize: the piece lies outside its matrix");
    uint8_t (*encode)(float) = f->e5m2 ? px_float_to_e5m2 : px_float_to_e4m3;
    const float *xf = x;
    for (uint64_t i = 0; i < n; i++)
        q[i] = encode(xf[i] / scale_load(scales, block_of(f, off + i), f->e8m0));
}
