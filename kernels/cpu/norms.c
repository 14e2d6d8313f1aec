/* LayerNorm and RMSNorm, forward and backward. The backward recomputes each row's mean and
 * 1/std from the input instead of reading saved statistics (kernels.h: statistics are never
 * saved), which costs one extra pass over a row but no activation memory. */
#include <math.h>

#include "kernels/cpu/cpu.h"

/* Rows of a chunk and columns of a block in the backward: the weight gradients of a chunk of
 * rows are summed in double per column block, so dw receives N/NORM_ROWS float additions per
 * element instead of N. */
enum { NORM_ROWS = 32, NORM_COLS = 64 };

/* Mean and 1/sqrt(var + eps) of one row, two passes in double: the one-pass E[x^2] - E[x]^2
 * cancels badly when the mean is large against the spread. */
static void layernorm_stats(double *mean, double *rstd, const float *x, int C, float eps)
{
    double s = 0.0;
    for (int i = 0; i < C; i++)
        s += x[i];
    double m = s / C, v = 0.0;
    for (int i = 0; i < C; i++) {
        double d = x[i] - m;
        v += d * d;
    }
    *mean = m;
    *rstd = 1.0 / sqrt(v / C + (double)eps);
}

static double rmsnorm_rstd(const float *x, int C, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < C; i++)
        ss += (double)x[i] * x[i];
    return 1.0 / sqrt(ss / C + (double)eps);
}

void kern_cpu_layernorm_fwd(void *out, const void *inp, const void *w, const void *b, int N,
                            int C, float eps)
{
    // out, inp are (N,C); w, b are (C)
    float *o = out;
    const float *x = inp, *wt = w, *bs = b;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *orow = o + (size_t)n * C;
        double mean, rstd;
        layernorm_stats(&mean, &rstd, xr, C, eps);
        for (int i = 0; i < C; i++) {
            float xhat = (float)((xr[i] - mean) * rstd);
            orow[i] = xhat * wt[i] + (bs ? bs[i] : 0.0f);
        }
    }
}

/* With xhat = (x - mean) rstd and g = dout * w:
 * dx = rstd (g - mean(g) - xhat mean(g xhat)); layernorm without the mean terms is rmsnorm's
 * dx = rstd (g - xhat mean(g xhat)). center selects the first. */
static void norm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, int N, int C, float eps, int center)
{
    for (int n0 = 0; n0 < N; n0 += NORM_ROWS) {
        int nr = N - n0 < NORM_ROWS ? N - n0 : NORM_ROWS;
        double mean[NORM_ROWS], rstd[NORM_ROWS];
        for (int r = 0; r < nr; r++) {
            size_t off = (size_t)(n0 + r) * C;
            const float *x = inp + off, *dy = dout + off;
            float *dx = dinp + off;
            if (center) {
                layernorm_stats(&mean[r], &rstd[r], x, C, eps);
            } else {
                mean[r] = 0.0;
                rstd[r] = rmsnorm_rstd(x, C, eps);
            }
            double sum_g = 0.0, sum_gx = 0.0;
            for (int i = 0; i < C; i++) {
                double g = (double)dy[i] * w[i];
                sum_g += g;
                sum_gx += g * ((x[i] - mean[r]) * rstd[r]);
            }
            double mg = center ? sum_g / C : 0.0, mgx = sum_gx / C;
            for (int i = 0; i < C; i++) {
                double xhat = (x[i] - mean[r]) * rstd[r];
                dx[i] += (float)(rstd[r] * ((double)dy[i] * w[i] - mg - xhat * mgx));
            }
        }
        for (int c0 = 0; c0 < C; c0 += NORM_COLS) {
            int nc = C - c0 < NORM_COLS ? C - c0 : NORM_COLS;
            double aw[NORM_COLS] = {0}, ab[NORM_COLS] = {0};
            for (int r = 0; r < nr; r++) {
                size_t off = (size_t)(n0 + r) * C + c0;
                const float *x = inp + off, *dy = dout + off;
                for (int c = 0; c < nc; c++) {
                    aw[c] += (double)dy[c] * ((x[c] - mean[r]) * rstd[r]);
                    ab[c] += dy[c];
                }
            }
            for (int c = 0; c < nc; c++) {
                dw[c0 + c] += (float)aw[c];
                if (db)
                    db[c0 + c] += (float)ab[c];
            }
        }
    }
}

void kern_cpu_layernorm_bwd(void *dinp, void *dw, void *db, const void *dout, const void *inp,
                            const void *w, int N, int C, float eps)
{
    // dinp, dout, inp are (N,C); dw, db, w are (C)
    norm_bwd(dinp, dw, db, dout, inp, w, N, C, eps, 1);
}

void kern_cpu_rmsnorm_fwd(void *out, const void *inp, const void *w, int N, int C, float eps)
{
    // out, inp are (N,C); w is (C)
    float *o = out;
    const float *x = inp, *wt = w;
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *orow = o + (size_t)n * C;
        double rstd = rmsnorm_rstd(xr, C, eps);
        for (int i = 0; i < C; i++)
            orow[i] = (float)(xr[i] * rstd) * wt[i];
    }
}

void kern_cpu_rmsnorm_bwd(void *dinp, void *dw, const void *dout, const void *inp,
                          const void *w, int N, int C, float eps)
{
    // dinp, dout, inp are (N,C); dw, w are (C)
    norm_bwd(dinp, dw, NULL, dout, inp, w, N, C, eps, 0);
}
