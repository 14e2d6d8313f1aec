/* GPT-OSS's and Qwen2-MoE's extras on the CPU (kernels.h, "GPT-OSS's and Qwen2-MoE's extras"):
 * the router's bias on its fp32 logits, the shared experts' sigmoid gate forward and backward,
 * and the attention sinks' gradient (the sinks' forward is the attention core's). Sums run in
 * double, as the other reductions of the CPU reference. */
#include <math.h>

#include "kernels/cpu/cpu.h"

void kern_cpu_add_bias_f32(float *out, const void *bias, int N, int C)
{
    // out is (N,C) fp32, bias is (C)
    const float *b = bias;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] += b[c];
}

static float gate_of(const float *x, const float *w, int C)
{
    double s = 0.0;
    for (int c = 0; c < C; c++)
        s += (double)x[c] * w[c];
    return (float)(1.0 / (1.0 + exp(-s)));
}

void kern_cpu_gate_fwd(void *y, const void *x, const void *w, int N, int C)
{
    // y, x are (N,C), w is (C)
    float *yy = y;
    const float *xx = x;
    for (int n = 0; n < N; n++) {
        const float g = gate_of(xx + (size_t)n * C, w, C);
        for (int c = 0; c < C; c++)
            yy[(size_t)n * C + c] *= g;
    }
}

void kern_cpu_gate_bwd(float *dlogit, void *dhid, void *hid, const void *x, const void *w, int N,
                       int C, int F)
{
    // dhid, hid are (N,F); x is (N,C); dlogit is (N)
    float *dh = dhid, *hh = hid;
    const float *xx = x;
    for (int n = 0; n < N; n++) {
        const float g = gate_of(xx + (size_t)n * C, w, C);
        float *dr = dh + (size_t)n * F, *hr = hh + (size_t)n * F;
        double dot = 0.0;
        for (int f = 0; f < F; f++)
            dot += (double)dr[f] * hr[f];
        dlogit[n] = (float)(dot * g * (1.0 - g));
        for (int f = 0; f < F; f++) {
            dr[f] *= g;
            hr[f] *= g;
        }
    }
}

void kern_cpu_gate_wgrad(void *dx, void *dw_, const float *dlogit, const void *x, const void *w,
                         int N, int C)
{
    // dx, x are (N,C); w, dw are (C)
    float *d = dx, *dw = dw_;
    const float *xx = x, *ww = w;
    for (int n = 0; n < N && d; n++)
        for (int c = 0; c < C; c++)
            d[(size_t)n * C + c] += dlogit[n] * ww[c];
    for (int c = 0; c < C; c++) {
        double s = 0.0;
        for (int n = 0; n < N; n++)
            s += (double)dlogit[n] * xx[(size_t)n * C + c];
        dw[c] += (float)s;
    }
}

void kern_cpu_attention_sink_bwd(void *dsinks_, const void *sinks, const float *lse,
                                 const float *drow, const void *dscores, int B, int H, int Tq,
                                 int Tk)
{
    // lse, drow are (B,H,Tq); dscores is (B,H,Tq,Tk)
    float *dsinks = dsinks_;
    const float *s = sinks, *dS = dscores;
    KERN_CHECK((lse && drow) || dS, "attention_sink_bwd: needs lse and drow, or dscores");
    for (int h = 0; h < H; h++) {
        double acc = 0.0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++) {
                const size_t i = ((size_t)b * H + h) * Tq + t;
                if (lse) {
                    acc += exp((double)s[h] - lse[i]) * drow[i];
                } else {
                    const float *row = dS + i * (size_t)Tk;
                    for (int j = 0; j < Tk; j++)
                        acc += row[j];
                }
            }
        dsinks[h] -= (float)acc;
    }
}
