/* bf16 and fp16 on the host: the MPI layer's reductions of activations (16-bit sums, as NCCL's
 * are) and reading act weights back. Conversions to fp32 are exact; to 16 bits round to
 * nearest, ties to even, as the CUDA intrinsics do (kernels/cuda/emu has the same rules).
 * FP8 (E4M3, E5M2) the same way, saturating at the format's largest value. */
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

/* A normal value of exponent e (unbiased, within fp32's normal range) and mantissa m of mbits
 * bits, from its bits: exact, as ldexpf is, without the call (the conversions run per element
 * of every 16-bit and FP8 tensor). */
static float normal_of(int e, uint32_t m, int mbits)
{
    return float_of((uint32_t)(e + 127) << 23 | m << (23 - mbits));
}

float px_half_to_float(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e == 0 ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : normal_of(e - 15, (uint32_t)m, 10);
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

/* An 8-bit float of `mbits` mantissa bits and exponent bias `bias` whose largest finite code
 * (sign cleared) is `max_code`: decoded exactly. */
static float fp8_decode(uint8_t q, int mbits, int bias)
{
    const int e = (q & 0x7f) >> mbits, m = q & ((1 << mbits) - 1);
    float v = e == 0 ? ldexpf((float)m, 1 - bias - mbits) : normal_of(e - bias, (uint32_t)m, mbits);
    return (q & 0x80) ? -v : v;
}

/* Rounds |f| to nearest, ties to even, onto the format's grid; saturates at max_code. Works on
 * the bits, as px_float_to_half: the codes are the float's exponent rebiased and its top mbits
 * mantissa bits, rounded on the rest (a carry is the next binade's first value). */
static uint8_t fp8_encode(float f, int mbits, int bias, uint8_t max_code, uint8_t nan_code)
{
    const uint32_t u = bits_of(f), ua = u & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (ua > 0x7f800000u)
        return (uint8_t)(sign | nan_code);
    const int emin = 1 - bias; /* the smallest normal's exponent */
    const int e = (int)(ua >> 23) - 127;
    if (e < emin) /* subnormal or zero: a multiple of 2^(emin - mbits), scaled exactly */
        return (uint8_t)(sign | (uint32_t)nearbyintf(fabsf(f) * ldexpf(1.0f, mbits - emin)));
    if (e + bias > 0xff >> mbits) /* far beyond the largest (infinity too): saturate */
        return (uint8_t)(sign | max_code);
    const int shift = 23 - mbits;
    const uint32_t m = ua & 0x7fffffu, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    uint32_t code = ((uint32_t)(e + bias) << mbits) | (m >> shift);
    if (rest > half || (rest == half && (code & 1u)))
        code++;
    if (code > max_code)
        code = max_code;
    return (uint8_t)(sign | code);
}

float px_e4m3_to_float(uint8_t q)
{
    if ((q & 0x7f) == 0x7f)
        return NAN;
    return fp8_decode(q, 3, 7);
}

uint8_t px_float_to_e4m3(float f) { return fp8_encode(f, 3, 7, 0x7e, 0x7f); }

float px_e5m2_to_float(uint8_t q)
{
    if ((q & 0x7c) == 0x7c)
        return (q & 0x03) ? NAN : (q & 0x80) ? -INFINITY : INFINITY;
    return fp8_decode(q, 2, 15);
}

uint8_t px_float_to_e5m2(float f) { return fp8_encode(f, 2, 15, 0x7b, 0x7f); }

