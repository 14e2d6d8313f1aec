/* Matrix products on OpenBLAS (row-major sgemm), and the bias add and bias gradient that go
 * with a linear layer. */
#include <cblas.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_matmul(void *c, PxDtype c_dtype, const void *a, const void *b, int m, int n, int k,
                     int trans_a, int trans_b, float alpha, float beta)
{
    // c is (m,n); a is (m,k), or (k,m) when trans_a; b is (k,n), or (n,k) when trans_b
    // The CPU's act dtype is fp32, so "act" and PX_FP32 name the same C.
    KERN_CHECK(c_dtype == PX_FP32, "matmul: c_dtype must be fp32 on the CPU");
    KERN_CHECK(m >= 0 && n >= 0 && k >= 0, "matmul: negative size");
    float *cf = c;
    if (m == 0 || n == 0)
        return;
    if (k == 0) {
        // An empty product; BLAS would reject the leading dimension 0 of A, so apply beta here.
        for (size_t i = 0; i < (size_t)m * n; i++)
            cf[i] = beta == 0.0f ? 0.0f : beta * cf[i];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, trans_a ? m : k, b,
                trans_b ? k : n, beta, cf, n);
}

void kern_cpu_add_bias(void *out, const void *bias, int N, int C)
{
    // out is (N,C), bias is (C)
    float *o = out;
    const float *bs = bias;
    for (int n = 0; n < N; n++) {
        float *row = o + (size_t)n * C;
        for (int c = 0; c < C; c++)
            row[c] += bs[c];
    }
}

enum { BIAS_COLS = 64 };

void kern_cpu_bias_grad(void *dbias_out, const void *dout, int N, int C)
{
    float *dbias = dbias_out; /* the CPU's gradients are fp32 */
    // dbias is (C), dout is (N,C)
    // Columns go in blocks so that each column's sum over N rows (tens of thousands of tokens)
    // stays in double while the rows are still read contiguously.
    const float *d = dout;
    for (int c0 = 0; c0 < C; c0 += BIAS_COLS) {
        int nc = C - c0 < BIAS_COLS ? C - c0 : BIAS_COLS;
        double acc[BIAS_COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = d + (size_t)n * C + c0;
            for (int c = 0; c < nc; c++)
                acc[c] += row[c];
        }
        for (int c = 0; c < nc; c++)
            dbias[c0 + c] += (float)acc[c];
    }
}
