/* The CPU's FP8 kernels: quantization with per-tensor, blockwise (DeepSeek-V3) and MXFP8 (E8M0)
 * scaling, delayed scaling, saturation, subnormals and NaN, the transposed read, the round trip,
 * the FP8 matmul against sgemm of the decoded operands, and delayed scaling's amax history.
 * Expected bytes are worked out by hand in the comments: E4M3 is 2^(e-7) x 1.mmm (e the 4-bit
 * field, subnormals m x 2^-9), byte = sign<<7 | e<<3 | m; E5M2 is 2^(e-15) x 1.mm, byte =
 * sign<<7 | e<<2 | m. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "tests/test.h"

static const KernBackend *K;

static KernFp8 layout(int rows, int cols, int block_r, int block_c, int e5m2, int e8m0)
{
    KernFp8 f = {rows, cols, block_r, block_c, e5m2, e8m0};
    return f;
}

static uint8_t *fp8_alloc(const KernFp8 *f)
{
    uint8_t *q = malloc(kern_fp8_bytes(f));
    CHECK(q != NULL);
    return q;
}

/* Scale i of q: fp32 (unaligned, right after the elements) or the E8M0 byte's value. */
static float scale_at(const uint8_t *q, const KernFp8 *f, size_t i)
{
    const uint8_t *s = q + (size_t)f->rows * f->cols;
    if (f->e8m0)
        return ldexpf(1.0f, (int)s[i] - 127);
    float v;
    memcpy(&v, s + 4 * i, sizeof v);
    return v;
}

#define CHECK_BYTES(expected, q, n)                                                               \
    do {                                                                                          \
        for (int i_ = 0; i_ < (n); i_++)                                                          \
            CHECK_EQ_INT((expected)[i_], (q)[i_]);                                                \
    } while (0)

/* amax 7 over 448 is 1/64 exactly, so x / scale = 64 x:
 *   1 -> 64 = 2^6: e 13 -> 0x68;   -2 -> -128 = 2^7: e 14 -> 0xf0;   3 -> 192 = 1.5 2^7 -> 0x74;
 *   7 -> 448 -> 0x7e;   0.5 -> 32 = 2^5 -> 0x60;   -0.25 -> -16 = 2^4: e 11 -> 0xd8;
 *   4.25/64 -> 4.25, halfway between 4 (m 0) and 4.5 (m 1): even -> 4, e 9 -> 0x48;
 *   4.75/64 -> 4.75, halfway between 4.5 (m 1) and 5 (m 2): even -> 5 -> 0x4a. */
static void test_per_tensor_e4m3(void)
{
    const float x[8] = {1, -2, 3, 7, 0.5f, -0.25f, 4.25f / 64, 4.75f / 64};
    const int want[8] = {0x68, 0xf0, 0x74, 0x7e, 0x60, 0xd8, 0x48, 0x4a};
    KernFp8 f = layout(2, 4, 2, 4, 0, 0);
    CHECK_EQ_U64(1, kern_fp8_scales(&f));
    CHECK_EQ_U64(8 + 4, kern_fp8_bytes(&f));
    uint8_t *q = fp8_alloc(&f);
    float amax = -1;
    K->fp8_quantize(q, &amax, x, &f, 0, NULL);
    CHECK_EQ_INT(7, amax);
    CHECK(scale_at(q, &f, 0) == 1.0f / 64);
    CHECK_BYTES(want, q, 8);
    /* every value above is on the grid times 1/64, except the two ties */
    float d[8];
    K->fp8_dequantize(d, q, &f);
    const float back[8] = {1, -2, 3, 7, 0.5f, -0.25f, 4.0f / 64, 5.0f / 64};
    for (int i = 0; i < 8; i++)
        CHECK(d[i] == back[i]);
    free(q);
}

/* amax 7 over 57344 is 7 / (7 2^13) = 2^-13, so x / scale = 8192 x:
 *   1 -> 2^13: e 28 -> 0x70;   -2 -> 2^14: e 29 -> 0xf4;   3 -> 1.5 2^14 -> 0x76;
 *   7 -> 57344 = 1.75 2^15: e 30 m 3 -> 0x7b;   0.5 -> 2^12 -> 0x6c;   -0.25 -> 2^11 -> 0xe8;
 *   576/8192 -> 576, halfway between 512 (m 0) and 640 (m 1): even -> 512, e 24 -> 0x60;
 *   704/8192 -> 704, halfway between 640 (m 1) and 768 (m 2): even -> 768 -> 0x62. */
static void test_per_tensor_e5m2(void)
{
    const float x[8] = {1, -2, 3, 7, 0.5f, -0.25f, 576.0f / 8192, 704.0f / 8192};
    const int want[8] = {0x70, 0xf4, 0x76, 0x7b, 0x6c, 0xe8, 0x60, 0x62};
    KernFp8 f = layout(2, 4, 2, 4, 1, 0);
    uint8_t *q = fp8_alloc(&f);
    float amax = -1;
    K->fp8_quantize(q, &amax, x, &f, 0, NULL);
    CHECK_EQ_INT(7, amax);
    CHECK(scale_at(q, &f, 0) == 1.0f / 8192);
    CHECK_BYTES(want, q, 8);
    free(q);
}

/* 130 x 200: |x| <= 0.5 everywhere except one element per 128 x 128 block, -A_b, so each
 * block's amax is A_b and its scale A_b / 448; that element becomes -448 (0xfe). Blocks in
 * row-major order: (0,0) rows 0..127 cols 0..127, (0,1) cols 128..199, (1,0) rows 128..129,
 * (1,1) the 2 x 72 corner. */
enum { BR = 130, BC = 200 };

static float base_value(int r, int c) { return (float)((r * 31 + c * 17) % 101) / 101.0f - 0.5f; }

static void fill_blocks(float *x)
{
    for (int r = 0; r < BR; r++)
        for (int c = 0; c < BC; c++)
            x[r * BC + c] = base_value(r, c);
    x[5 * BC + 7] = -3.0f;       /* block 0 */
    x[100 * BC + 199] = -5.0f;   /* block 1 */
    x[128 * BC + 0] = -10.0f;    /* block 2 */
    x[129 * BC + 130] = -0.75f;  /* block 3 */
}

static void test_blockwise_128x128(void)
{
    float *x = malloc(sizeof(float) * BR * BC);
    fill_blocks(x);
    KernFp8 f = layout(BR, BC, 128, 128, 0, 0);
    CHECK_EQ_U64(4, kern_fp8_scales(&f)); /* ceil(130/128) x ceil(200/128) = 2 x 2 */
    CHECK_EQ_U64(BR * BC + 16, kern_fp8_bytes(&f));
    uint8_t *q = fp8_alloc(&f);
    float amax = 0;
    K->fp8_quantize(q, &amax, x, &f, 0, NULL);
    CHECK_EQ_INT(10, amax);
    const float a[4] = {3.0f, 5.0f, 10.0f, 0.75f};
    for (int b = 0; b < 4; b++)
        CHECK(scale_at(q, &f, b) == a[b] / 448.0f);
    CHECK_EQ_INT(0xfe, q[5 * BC + 7]);
    CHECK_EQ_INT(0xfe, q[100 * BC + 199]);
    CHECK_EQ_INT(0xfe, q[128 * BC + 0]);
    CHECK_EQ_INT(0xfe, q[129 * BC + 130]);
    /* an element of block 3 (scale 0.75/448, so x / scale = 597.33 x): base(129, 131) =
     * ((129 x 31 + 131 x 17) % 101) / 101 - 0.5 = 65/101 - 0.5 = 0.14356, x 597.33 = 85.75; in
     * [64, 128) the step is 8, so 88 = 1.375 2^6 (e 13 m 3) -> 0x6b */
    CHECK(x[129 * BC + 131] == 65.0f / 101.0f - 0.5f);
    CHECK_EQ_INT(0x6b, q[129 * BC + 131]);
    free(q);
    free(x);
}

/* 1 x 128 on 130 x 200: two blocks a row (cols 0..127, 128..199), 260 scales; each is its own
 * row-segment's amax / 448, found here by a plain scan. */
static void test_blockwise_1x128(void)
{
    float *x = malloc(sizeof(float) * BR * BC);
    fill_blocks(x);
    KernFp8 f = layout(BR, BC, 1, 128, 0, 0);
    CHECK_EQ_U64(260, kern_fp8_scales(&f));
    CHECK_EQ_U64(BR * BC + 260 * 4, kern_fp8_bytes(&f));
    uint8_t *q = fp8_alloc(&f);
    K->fp8_quantize(q, NULL, x, &f, 0, NULL);
    for (int r = 0; r < BR; r++)
        for (int b = 0; b < 2; b++) {
            float m = 0;
            for (int c = b * 128; c < (b ? BC : 128); c++)
                m = fmaxf(m, fabsf(x[r * BC + c]));
            CHECK(scale_at(q, &f, (size_t)r * 2 + b) == m / 448.0f);
        }
    /* row 5's first block has the -3: scale 3/448 (the 0.5-bounded neighbours do not count) */
    CHECK(scale_at(q, &f, 10) == 3.0f / 448.0f);
    CHECK_EQ_INT(0xfe, q[5 * BC + 7]);
    free(q);
    free(x);
}

/* MXFP8 1 x 32, E8M0: scale 2^(floor(log2 amax) - 8), byte exponent + 127.
 *   block 0: amax 3 -> floor(log2 3) = 1 -> 2^-7, byte 120; x 128: 3 -> 384 = 1.5 2^8, e 15 m 4
 *            -> 0x7c; 1 -> 128 = 2^7 -> 0x70; -0.5 -> -64 = 2^6 -> 0xe8
 *   block 1: amax 0.1 = 1.6 2^-4 -> 2^-12, byte 115; 0.1 x 4096 = 409.6, step 32 in [256, 512):
 *            416 = 1.625 2^8, e 15 m 5 -> 0x7d
 *   block 2: all zero -> scale 1, byte 127
 *   block 3: amax 3.9 -> 2^-7 again; 3.9 x 128 = 499.2 > 448 -> saturates, 0x7e (the OCP rule
 *            clips the top of the binade); -2 -> -256 = 2^8, e 15 -> 0xf8
 * E5M2 (emax 15): block 0 -> 2^(1 - 15) = 2^-14, byte 113; 3 x 2^14 = 1.5 2^15: e 30 m 2 -> 0x7a. */
static void test_mxfp8(void)
{
    float x[128] = {0};
    x[0] = 3.0f, x[1] = 1.0f, x[2] = -0.5f;
    x[32] = 0.1f;
    x[96] = 3.9f, x[97] = -2.0f;
    KernFp8 f = layout(1, 128, 1, 32, 0, 1);
    CHECK_EQ_U64(4, kern_fp8_scales(&f));
    CHECK_EQ_U64(128 + 4, kern_fp8_bytes(&f));
    uint8_t *q = fp8_alloc(&f);
    K->fp8_quantize(q, NULL, x, &f, 0, NULL);
    const uint8_t *s = q + 128;
    CHECK_EQ_INT(120, s[0]);
    CHECK_EQ_INT(115, s[1]);
    CHECK_EQ_INT(127, s[2]);
    CHECK_EQ_INT(120, s[3]);
    CHECK_EQ_INT(0x7c, q[0]);
    CHECK_EQ_INT(0x70, q[1]);
    CHECK_EQ_INT(0xe8, q[2]);
    CHECK_EQ_INT(0x7d, q[32]);
    CHECK_EQ_INT(0x7e, q[96]);
    CHECK_EQ_INT(0xf8, q[97]);
    for (int i = 64; i < 96; i++)
        CHECK_EQ_INT(0, q[i]);
    float d[128];
    K->fp8_dequantize(d, q, &f);
    CHECK(d[0] == 3.0f);
    CHECK(d[32] == 416.0f / 4096);
    CHECK(d[96] == 448.0f / 128);
    free(q);

    KernFp8 g = layout(1, 128, 1, 32, 1, 1);
    q = fp8_alloc(&g);
    K->fp8_quantize(q, NULL, x, &g, 0, NULL);
    CHECK_EQ_INT(113, q[128]);
    CHECK_EQ_INT(0x7a, q[0]);
    free(q);

    /* 130 x 200 in 1 x 32: ceil(200/32) = 7 blocks a row */
    KernFp8 h = layout(BR, BC, 1, 32, 0, 1);
    CHECK_EQ_U64(130 * 7, kern_fp8_scales(&h));
    CHECK_EQ_U64(BR * BC + 130 * 7, kern_fp8_bytes(&h));
}

/* Delayed scaling with a decode factor too small for the values: 1/256 makes x 256, so 2 ->
 * 512 and -3 -> -768 saturate to +-448 (0x7e, 0xfe), infinity too; 1 -> 256 = 2^8 -> 0x78. The
 * amax is still the largest |x| (infinite here). E5M2 with 2^-14: 4 -> 65536 > 57344 -> 0x7b,
 * -4 -> 0xfb. */
static void test_saturation(void)
{
    const float x[4] = {2.0f, -3.0f, 1.0f, INFINITY};
    KernFp8 f = layout(1, 4, 1, 4, 0, 0);
    uint8_t *q = fp8_alloc(&f);
    float s = 1.0f / 256, amax = 0;
    K->fp8_quantize(q, &amax, x, &f, 0, &s);
    CHECK(amax == INFINITY);
    CHECK(scale_at(q, &f, 0) == s);
    const int want[4] = {0x7e, 0xfe, 0x78, 0x7e};
    CHECK_BYTES(want, q, 4);
    free(q);

    const float y[2] = {4.0f, -4.0f};
    KernFp8 g = layout(1, 2, 1, 2, 1, 0);
    q = fp8_alloc(&g);
    s = ldexpf(1.0f, -14);
    K->fp8_quantize(q, &amax, y, &g, 0, &s);
    CHECK_EQ_INT(4, amax);
    CHECK_EQ_INT(0x7b, q[0]);
    CHECK_EQ_INT(0xfb, q[1]);
    free(q);

    /* a delayed E8M0 scale is stored as its byte: 2^-3 -> 124; 1 / 2^-3 = 8 = 2^3 -> e 10 */
    KernFp8 h = layout(1, 2, 1, 32, 0, 1);
    q = fp8_alloc(&h);
    s = 0.125f;
    const float z[2] = {1.0f, 0.0f};
    K->fp8_quantize(q, NULL, z, &h, 0, &s);
    CHECK_EQ_INT(124, q[2]);
    CHECK_EQ_INT(0x50, q[0]);
    free(q);
}

/* E4M3 subnormals are m x 2^-9 (m 1..7). amax 7 -> scale 1/64, so x / scale = 64 x:
 *   2^-14 -> 2^-8 = 2 x 2^-9 -> 0x02;   3 2^-16 -> 1.5 x 2^-9, halfway: even -> 2 -> 0x02;
 *   2^-16 -> 0.5 x 2^-9, halfway between 0 and 1: even -> 0 -> 0x00;   -2^-15 -> -2^-9 -> 0x81;
 *   7 2^-15 -> 7 x 2^-9 -> 0x07 (the largest subnormal);   5 2^-16 -> 2.5: even -> 2 -> 0x02. */
static void test_subnormals(void)
{
    const float x[8] = {7.0f,
                        ldexpf(1, -14),
                        ldexpf(3, -16),
                        ldexpf(1, -16),
                        -ldexpf(1, -15),
                        ldexpf(7, -15),
                        ldexpf(5, -16),
                        0.0f};
    const int want[8] = {0x7e, 0x02, 0x02, 0x00, 0x81, 0x07, 0x02, 0x00};
    KernFp8 f = layout(2, 4, 2, 4, 0, 0);
    uint8_t *q = fp8_alloc(&f);
    K->fp8_quantize(q, NULL, x, &f, 0, NULL);
    CHECK(scale_at(q, &f, 0) == 1.0f / 64);
    CHECK_BYTES(want, q, 8);
    float d[8];
    K->fp8_dequantize(d, q, &f);
    CHECK(d[5] == ldexpf(7, -15)); /* 7 2^-9 x 2^-6 */
    CHECK(d[4] == -ldexpf(1, -15));
    free(q);
}

/* NaN stays NaN with its sign (0x7f, 0xff) and makes the amax NaN; the block's scale comes from
 * its finite values: 2 / 448, so 1 -> 224 = 1.75 2^7 (e 14 m 6) -> 0x76 and 2 -> 0x7e. An
 * infinity saturates and leaves the scale to the finite values (1 -> scale 1/448). A block of
 * NaN only gets scale 1 (E8M0 byte 127). */
static void test_nan(void)
{
    const float x[4] = {NAN, 1.0f, -NAN, 2.0f};
    KernFp8 f = layout(1, 4, 1, 4, 0, 0);
    uint8_t *q = fp8_alloc(&f);
    float amax = 0;
    K->fp8_quantize(q, &amax, x, &f, 0, NULL);
    CHECK(isnan(amax));
    CHECK(scale_at(q, &f, 0) == 2.0f / 448);
    const int want[4] = {0x7f, 0x76, 0xff, 0x7e};
    CHECK_BYTES(want, q, 4);
    float d[4];
    K->fp8_dequantize(d, q, &f);
    CHECK(isnan(d[0]) && isnan(d[2]));
    free(q);

    const float y[4] = {-INFINITY, 1.0f, 0.5f, 0.0f};
    q = fp8_alloc(&f);
    K->fp8_quantize(q, &amax, y, &f, 0, NULL);
    CHECK(amax == INFINITY);
    CHECK(scale_at(q, &f, 0) == 1.0f / 448);
    CHECK_EQ_INT(0xfe, q[0]);
    CHECK_EQ_INT(0x7e, q[1]);
    free(q);

    const float z[2] = {NAN, NAN};
    KernFp8 g = layout(1, 2, 1, 32, 0, 1);
    q = fp8_alloc(&g);
    K->fp8_quantize(q, &amax, z, &g, 0, NULL);
    CHECK(isnan(amax));
    CHECK_EQ_INT(127, q[2]);
    CHECK_EQ_INT(0x7f, q[0]);
    free(q);
}

/* trans = 1 reads x as [cols, rows]: the bytes (elements and scales) equal those of quantizing
 * the explicit transpose, for blocks that straddle the transpose unevenly. */
static void test_trans(void)
{
    float *x = malloc(sizeof(float) * BR * BC), *xt = malloc(sizeof(float) * BR * BC);
    fill_blocks(x);
    for (int r = 0; r < BR; r++)
        for (int c = 0; c < BC; c++)
            xt[c * BR + r] = x[r * BC + c]; /* xt is [200, 130] */
    const KernFp8 ls[4] = {layout(BR, BC, 128, 128, 0, 0), layout(BR, BC, 1, 128, 0, 0),
                           layout(BR, BC, 32, 1, 0, 1), layout(BR, BC, 1, 32, 1, 1)};
    for (int i = 0; i < 4; i++) {
        size_t n = kern_fp8_bytes(&ls[i]);
        uint8_t *q1 = fp8_alloc(&ls[i]), *q2 = fp8_alloc(&ls[i]);
        float a1 = 0, a2 = 0;
        K->fp8_quantize(q1, &a1, x, &ls[i], 0, NULL);
        K->fp8_quantize(q2, &a2, xt, &ls[i], 1, NULL);
        CHECK(a1 == a2);
        for (size_t j = 0; j < n; j++)
            if (q1[j] != q2[j]) {
                fprintf(stderr, "layout %d byte %zu\n", i, j);
                CHECK_EQ_INT(q1[j], q2[j]);
            }
        free(q1);
        free(q2);
    }
    free(x);
    free(xt);
}

/* A deterministic spread of magnitudes (a few decades) and signs. */
static float spread(uint32_t *state)
{
    *state = *state * 1664525u + 1013904223u;
    float u = (float)(*state >> 8) / 16777216.0f;  /* [0, 1) */
    float v = ldexpf(0.5f + u, (int)(*state % 13) - 8); /* 2^-9 .. 2^5 */
    return (*state & 0x100) ? -v : v;
}

/* The decoded value of a normal element is within half a step, 2^-4 (E4M3) or 2^-3 (E5M2) of
 * |x| relative to the next power of two below, so |d - x| <= 2^-4 |x| (2^-3); a subnormal one
 * within half the subnormal step, 2^-10 (2^-17) times the scale. */
static void test_round_trip(void)
{
    enum { R = 7, C = 300 };
    static float x[R * C], d[R * C];
    uint32_t st = 12345;
    for (int i = 0; i < R * C; i++)
        x[i] = spread(&st);
    const KernFp8 ls[4] = {layout(R, C, 1, 128, 0, 0), layout(R, C, 128, 128, 1, 0),
                           layout(R, C, 1, 32, 0, 1), layout(R, C, 1, 32, 1, 1)};
    for (int i = 0; i < 4; i++) {
        const KernFp8 *f = &ls[i];
        uint8_t *q = fp8_alloc(f);
        K->fp8_quantize(q, NULL, x, f, 0, NULL);
        K->fp8_dequantize(d, q, f);
        double rel = f->e5m2 ? 0x1p-3 : 0x1p-4, sub = f->e5m2 ? 0x1p-17 : 0x1p-10;
        int nbc = (C + f->block_c - 1) / f->block_c;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                float s = scale_at(q, f, (size_t)(r / f->block_r) * nbc + c / f->block_c);
                double e = fabs((double)d[r * C + c] - x[r * C + c]);
                double bound = rel * fabs(x[r * C + c]) + sub * s;
                /* MXFP8 clips the top of the binade: amax up to 2^(emax+1) x scale */
                double fm = f->e5m2 ? 57344.0 : 448.0;
                if (f->e8m0 && fabs(x[r * C + c]) > fm * s)
                    bound = fabs(x[r * C + c]) - fm * s + 1e-6;
                if (!(e <= bound * (1 + 1e-6))) {
                    fprintf(stderr, "layout %d at [%d,%d]: x %.9g decoded %.9g\n", i, r, c,
                            x[r * C + c], d[r * C + c]);
                    CHECK(e <= bound);
                }
            }
        free(q);
    }
}

/* matmul_fp8 is sgemm on the decoded operands: the same fp32 values, bit for bit. Hand case
 * (MXFP8, powers of two decode exactly): A = [3 1], B = [2; 0.5], C0 = 4, alpha 2, beta 0.5:
 * 2 (3 x 2 + 1 x 0.5) + 0.5 x 4 = 15. */
static void test_matmul(void)
{
    {
        const float a[2] = {3, 1}, b[2] = {2, 0.5f};
        KernFp8 fa = layout(1, 2, 1, 32, 0, 1), fb = layout(2, 1, 1, 32, 0, 1);
        uint8_t *qa = fp8_alloc(&fa), *qb = fp8_alloc(&fb);
        K->fp8_quantize(qa, NULL, a, &fa, 0, NULL);
        K->fp8_quantize(qb, NULL, b, &fb, 0, NULL);
        float c = 4;
        K->matmul_fp8(&c, PX_FP32, qa, &fa, qb, &fb, 1, 1, 2, 0, 0, 2.0f, 0.5f);
        CHECK(c == 15.0f);
        c = NAN; /* beta 0 never reads C */
        K->matmul_fp8(&c, PX_FP32, qa, &fa, qb, &fb, 1, 1, 2, 0, 0, 1.0f, 0.0f);
        CHECK(c == 6.5f);
        free(qa);
        free(qb);
    }
    enum { M = 5, N = 7, KK = 9 };
    float a[M * KK], b[KK * N], ad[M * KK], bd[KK * N], c1[M * N], c2[M * N];
    uint32_t st = 7;
    for (int i = 0; i < M * KK; i++)
        a[i] = spread(&st);
    for (int i = 0; i < KK * N; i++)
        b[i] = spread(&st);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            /* A stored [M,KK] or [KK,M] in 1 x 4 blocks (E4M3); B [KK,N] or [N,KK] per tensor
             * (E5M2, the gradients' format) */
            KernFp8 fa = ta ? layout(KK, M, 1, 4, 0, 0) : layout(M, KK, 1, 4, 0, 0);
            KernFp8 fb = tb ? layout(N, KK, N, KK, 1, 0) : layout(KK, N, KK, N, 1, 0);
            uint8_t *qa = fp8_alloc(&fa), *qb = fp8_alloc(&fb);
            K->fp8_quantize(qa, NULL, a, &fa, 0, NULL);
            K->fp8_quantize(qb, NULL, b, &fb, 0, NULL);
            K->fp8_dequantize(ad, qa, &fa);
            K->fp8_dequantize(bd, qb, &fb);
            const float ab[3][2] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-2.0f, 0.25f}};
            for (int j = 0; j < 3; j++) {
                for (int i = 0; i < M * N; i++)
                    c1[i] = c2[i] = (float)i - 10.0f;
                K->matmul_fp8(c1, PX_FP32, qa, &fa, qb, &fb, M, N, KK, ta, tb, ab[j][0],
                              ab[j][1]);
                K->matmul(c2, PX_FP32, ad, bd, M, N, KK, ta, tb, ab[j][0], ab[j][1]);
                for (int i = 0; i < M * N; i++)
                    if (memcmp(&c1[i], &c2[i], sizeof c1[i]) != 0) {
                        fprintf(stderr, "trans %d %d alpha %g beta %g element %d\n", ta, tb,
                                ab[j][0], ab[j][1], i);
                        CHECK(c1[i] == c2[i]);
                    }
            }
            free(qa);
            free(qb);
        }
}

/* len 2, two tensors (E4M3, E5M2), history starting at 0:
 *   amax (7, 0):          rows (7, 0) (0, 0)            -> scales 7/448 = 1/64, 1 (max 0)
 *   amax (14, 114688):    rows (14, 114688) (7, 0)      -> 14/448 = 1/32, 114688/57344 = 2
 *   amax (3.5, 28672):    rows (3.5, 28672) (14, 114688) -> 1/32, 2
 *   amax (3.5, 28672):    rows (3.5, 28672) (3.5, 28672) -> 3.5/448 = 1/128, 0.5 (14 rolled out)
 *   amax (NaN, 0):        rows (NaN, 0) (3.5, 28672)    -> 1/128 kept (non-finite max), 0.5 */
static void test_amax_update(void)
{
    float hist[4] = {0}, scale[2] = {1, 1};
    const float fmax[2] = {448, 57344};
    const float amax[5][2] = {{7, 0}, {14, 114688}, {3.5f, 28672}, {3.5f, 28672}, {NAN, 0}};
    const float want_hist[5][4] = {{7, 0, 0, 0},
                                   {14, 114688, 7, 0},
                                   {3.5f, 28672, 14, 114688},
                                   {3.5f, 28672, 3.5f, 28672},
                                   {NAN, 0, 3.5f, 28672}};
    const float want_scale[5][2] = {
        {1.0f / 64, 1}, {1.0f / 32, 2}, {1.0f / 32, 2}, {1.0f / 128, 0.5f}, {1.0f / 128, 0.5f}};
    for (int t = 0; t < 5; t++) {
        K->fp8_amax_update(hist, scale, amax[t], fmax, 2, 2);
        for (int i = 0; i < 4; i++)
            CHECK(hist[i] == want_hist[t][i] || (isnan(hist[i]) && isnan(want_hist[t][i])));
        CHECK(scale[0] == want_scale[t][0]);
        CHECK(scale[1] == want_scale[t][1]);
    }
}

/* Delayed scaling is for one block only: a blockwise layout with a given scale breaks the
 * contract, and the kernel aborts rather than use one scale for every block. */
static void test_delayed_needs_one_block(void)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        CHECK(freopen("/dev/null", "w", stderr) != NULL);
        float x[256] = {0}, s = 1.0f;
        KernFp8 f = layout(1, 256, 1, 128, 0, 0);
        uint8_t q[256 + 8];
        K->fp8_quantize(q, NULL, x, &f, 0, &s);
        _exit(0); /* not reached when the check holds */
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

/* A per-tensor FP8 tensor transposed: the elements of test_per_tensor_e4m3's 2 x 4 in 4 x 2
 * order, the scale as it was; the same bytes as quantizing the transposed values. */
static void test_transpose(void)
{
    const float x[8] = {1, -2, 3, 7, 0.5f, -0.25f, 4.25f / 64, 4.75f / 64};
    const int want[8] = {0x68, 0x60, 0xf0, 0xd8, 0x74, 0x48, 0x7e, 0x4a};
    KernFp8 f = layout(2, 4, 2, 4, 0, 0), ft = layout(4, 2, 4, 2, 0, 0);
    uint8_t *q = fp8_alloc(&f), *qt = fp8_alloc(&ft), *qx = fp8_alloc(&ft);
    K->fp8_quantize(q, NULL, x, &f, 0, NULL);
    K->fp8_transpose(qt, q, &f);
    CHECK_BYTES(want, qt, 8);
    CHECK(scale_at(qt, &ft, 0) == 1.0f / 64);
    K->fp8_quantize(qx, NULL, x, &ft, 1, NULL);
    CHECK(memcmp(qx, qt, kern_fp8_bytes(&ft)) == 0);
    free(q);
    free(qt);
    free(qx);
}

/* A 128 x 128-tiled tensor transposed (130 x 200: a 2 x 2 grid of tiles, test_blockwise_128x128's
 * values): each tile's transpose is a tile of the same values, so qt's scales are q's grid
 * transposed (q's tile (1, 0), amax 10, is qt's (0, 1)), and qt is the bytes of quantizing the
 * transposed values, as Transformer Engine derives a 2D-scaled weight's columnwise copy. */
static void test_transpose_blockwise(void)
{
    float *x = malloc(sizeof(float) * BR * BC);
    fill_blocks(x);
    KernFp8 f = layout(BR, BC, 128, 128, 0, 0), ft = layout(BC, BR, 128, 128, 0, 0);
    uint8_t *q = fp8_alloc(&f), *qt = fp8_alloc(&ft), *qx = fp8_alloc(&ft);
    K->fp8_quantize(q, NULL, x, &f, 0, NULL);
    K->fp8_transpose(qt, q, &f);
    const float a[4] = {3.0f, 10.0f, 5.0f, 0.75f}; /* test_blockwise_128x128's, transposed */
    for (int b = 0; b < 4; b++)
        CHECK(scale_at(qt, &ft, b) == a[b] / 448.0f);
    CHECK_EQ_INT(q[129 * BC + 131], qt[131 * BR + 129]);
    K->fp8_quantize(qx, NULL, x, &ft, 1, NULL);
    CHECK(memcmp(qx, qt, kern_fp8_bytes(&ft)) == 0);
    free(q);
    free(qt);
    free(qx);
    free(x);
}

/* A weight quantized from flat pieces, as ranks hold it under ZeRO-3 (fp8_piece_amax,
 * fp8_block_scales, fp8_piece_quantize): a 64 x 96 matrix cut at 20 (inside row 0's first
 * 1 x 32 block), 1001, 3333 and 6000 gives, piece by piece, the scales and the bytes that
 * fp8_quantize writes for the whole, row-wise (1 x 32), column-wise in the weight's shape
 * (32 x 1: a block straddles every cut), E5M2, and with one fp32 scale. By hand: row 0's first
 * block holds 0.75 at element 3 (the first piece) and 3.0 at element 25 (the second): 0.75
 * alone, then 3 = 1.5 x 2^1 -> E8M0 2^(1 - 8) -> the byte 120. */
static void test_pieces(void)
{
    enum { R = 64, C = 96, N = R * C };
    const uint64_t cut[] = {0, 20, 1001, 3333, 6000, N};
    float *x = malloc(N * sizeof *x);
    CHECK(x != NULL);
    for (int i = 0; i < N; i++)
        x[i] = (float)((i * 37) % 101 - 50) / 64.0f * (float)(1 + i % 7);
    for (int i = 0; i < 32; i++)
        x[i] = i == 3 ? 0.75f : i == 25 ? 3.0f : 0.125f;
    x[4000] = NAN;
    const KernFp8 fs[] = {layout(R, C, 1, 32, 0, 1), layout(R, C, 32, 1, 0, 1),
                          layout(R, C, 32, 1, 1, 1), layout(R, C, R, C, 0, 0)};
    for (size_t l = 0; l < sizeof fs / sizeof fs[0]; l++) {
        const KernFp8 *f = &fs[l];
        const size_t ns = kern_fp8_scales(f), sb = f->e8m0 ? 1 : 4;
        uint8_t *whole = fp8_alloc(f), *q = fp8_alloc(f);
        float *amax = calloc(ns, sizeof *amax);
        CHECK(amax != NULL);
        K->fp8_quantize(whole, NULL, x, f, 0, NULL);
        for (int p = 0; p + 1 < 6; p++) {
            K->fp8_piece_amax(amax, x + cut[p], cut[p], cut[p + 1] - cut[p], f);
            if (l == 0 && p == 0)
                CHECK(amax[0] == 0.75f);
        }
        if (l == 0)
            CHECK(amax[0] == 3.0f);
        K->fp8_block_scales(q + N, amax, f);
        if (l == 0)
            CHECK_EQ_INT(120, q[N]);
        for (int p = 0; p + 1 < 6; p++)
            K->fp8_piece_quantize(q + cut[p], x + cut[p], cut[p], cut[p + 1] - cut[p], f, q + N);
        CHECK(memcmp(whole + N, q + N, ns * sb) == 0);
        CHECK(memcmp(whole, q, N) == 0);
        free(amax);
        free(whole);
        free(q);
    }
    free(x);
}

/* matmul_fp8_split: a weight's column-wise MXFP8 copy in the weight's own shape (64 x 96, 32 x 1
 * blocks), its elements in one buffer and its scales in another, read as B of dx = dy W: the
 * same C as matmul_fp8 on the copy with its scales after the elements, and as on the kernels'
 * transposed form (96 x 64, 1 x 32, read transposed): the same values. dy (A) keeps its own
 * scales after its elements (sa NULL). */
static void test_matmul_split(void)
{
    enum { M = 8, O = 64, I = 96 };
    float *w = malloc(O * I * sizeof *w), dy[M * O], c0[M * I], c1[M * I], c2[M * I];
    CHECK(w != NULL);
    for (int i = 0; i < O * I; i++)
        w[i] = (float)((i * 29) % 83 - 41) / 32.0f * (float)(1 + i % 5);
    for (int i = 0; i < M * O; i++)
        dy[i] = (float)((i * 13) % 19 - 9) / 8.0f;
    const KernFp8 fa = layout(M, O, 1, 32, 1, 1), fc = layout(O, I, 32, 1, 0, 1);
    const KernFp8 ft = layout(I, O, 1, 32, 0, 1);
    uint8_t *qa = fp8_alloc(&fa), *qc = fp8_alloc(&fc), *qt = fp8_alloc(&ft);
    K->fp8_quantize(qa, NULL, dy, &fa, 0, NULL);
    K->fp8_quantize(qc, NULL, w, &fc, 0, NULL);
    K->fp8_quantize(qt, NULL, w, &ft, 1, NULL);
    uint8_t *elems = malloc(O * I), *scales = malloc(kern_fp8_scales(&fc));
    CHECK(elems != NULL && scales != NULL);
    memcpy(elems, qc, O * I);
    memcpy(scales, qc + O * I, kern_fp8_scales(&fc));
    K->matmul_fp8(c0, PX_FP32, qa, &fa, qc, &fc, M, I, O, 0, 0, 1.0f, 0.0f);
    K->matmul_fp8_split(c1, PX_FP32, qa, &fa, NULL, elems, &fc, scales, M, I, O, 0, 0, 1.0f,
                        0.0f);
    K->matmul_fp8(c2, PX_FP32, qa, &fa, qt, &ft, M, I, O, 0, 1, 1.0f, 0.0f);
    CHECK(memcmp(c0, c1, sizeof c0) == 0);
    CHECK(memcmp(c0, c2, sizeof c0) == 0);
    free(w), free(qa), free(qc), free(qt), free(elems), free(scales);
}

int main(void)
{
    K = kern_cpu();
    test_per_tensor_e4m3();
    test_per_tensor_e5m2();
    test_blockwise_128x128();
    test_blockwise_1x128();
    test_mxfp8();
    test_saturation();
    test_subnormals();
    test_nan();
    test_trans();
    test_transpose();
    test_transpose_blockwise();
    test_round_trip();
    test_matmul();
    test_amax_update();
    test_delayed_needs_one_block();
    test_pieces();
    test_matmul_split();
    TEST_DONE("test_kernels_fp8");
}
