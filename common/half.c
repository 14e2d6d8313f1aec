/* bf16 and fp16 on the host: the MPI layer's reductions of activations (16-bit sums, as NCCL's
 * are) and reading act weights back. Conversions to fp32 are exact; to 16 bits round to
 * nearest, ties to even, as the CUDA intrinsics do (kernels/cuda/emu has the same rules). */
#include <math.h>
#include <string.h>

#include "common/px.h"

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float px_bf16_to_float(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t px_float_to_bf16(float f)
{
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* NaN stays a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float px_half_to_float(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

uint16_t px_float_to_half(float f)
{
    const uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u;
    const float a = fabsf(f);
    if (a != a)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) /* rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) /* subnormal: a multiple of 2^-24, rounded to even */
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    uint32_t e = ((u >> 23) & 0xffu) - 127 + 15, m = u & 0x7fffffu;
    uint32_t r = (e << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (r & 1u)))
        r++; /* a carry into the exponent is the correct next binade */
    return (uint16_t)(sign | r);
}
