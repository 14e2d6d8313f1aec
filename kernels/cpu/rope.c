/* Rotary position embedding (Su et al. 2021) in the rotate-half convention of Hugging Face
 * Llama: for i < D/2 the pair (x[i], x[i + D/2]) is rotated by pos * theta^(-2i/D). Checkpoints
 * imported from Hugging Face were trained with this pairing, not the interleaved one of the
 * paper, so it is the one that reproduces their outputs. */
#include <math.h>

#include "kernels/cpu/cpu.h"

/* dir = +1 rotates (forward); dir = -1 rotates back, which is also the backward: a rotation's
 * Jacobian is the rotation, and its transpose is the inverse rotation. */
static void rope_apply(float *qkv, int B, int T, int H, int KV, int D, int pos_offset,
                       float theta, int dir)
{
    // qkv is (B,T,(H+2KV)*D): Q heads, K heads, V heads; only Q and K rotate
    KERN_CHECK(D % 2 == 0, "rope: head dimension must be even");
    int half = D / 2, heads = H + KV;
    size_t row = (size_t)(H + 2 * KV) * D;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float *x = qkv + ((size_t)b * T + t) * row;
            double pos = (double)pos_offset + t;
            for (int i = 0; i < half; i++) {
                // double for the angle: positions reach 1e5 and more, where a float angle
                // would be off by whole fractions of a turn
                double ang = pos * pow((double)theta, -2.0 * i / D);
                float c = (float)cos(ang), s = (float)(dir * sin(ang));
                for (int h = 0; h < heads; h++) {
                    float *x1 = x + (size_t)h * D + i, *x2 = x1 + half;
                    float a = *x1, bv = *x2;
                    *x1 = a * c - bv * s;
                    *x2 = bv * c + a * s;
                }
            }
        }
    }
}

void kern_cpu_rope_fwd(void *qkv, int B, int T, int H, int KV, int D, int pos_offset,
                       float theta)
{
    rope_apply(qkv, B, T, H, KV, D, pos_offset, theta, 1);
}

void kern_cpu_rope_bwd(void *dqkv, int B, int T, int H, int KV, int D, int pos_offset,
                       float theta)
{
    rope_apply(dqkv, B, T, H, KV, D, pos_offset, theta, -1);
}
