/* SPDX-License-Identifier: MIT */
/*
 * dtype: f32 <-> f16 (IEEE 754 binary16) and bf16 conversion by bit manipulation, so the result
 * does not depend on the compiler's _Float16 support or on the FPU's rounding mode. Widening is
 * exact; narrowing rounds to nearest, ties to even, like a GPU's __float2half_rn and
 * __float2bfloat16_rn.
 */
#include <string.h>

#include "policy.h"

static inline uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float f32_from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

/* Exact: every binary16 value, subnormals included, is a normal f32; NaN payloads are kept
   (shifted into the top of the f32 mantissa, so a quiet NaN stays quiet). */
static inline uint32_t f16_to_f32_bits(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;

	if (exp == 0x1f)
		return sign | 0x7f800000u | (mant << 13);
	if (exp != 0)
		return sign | ((exp + 112) << 23) | (mant << 13);
	if (mant == 0)
		return sign;
	/* subnormal mant * 2^-24: normalize so the leading one becomes the implicit bit */
	exp = 113;
	while (!(mant & 0x400u)) {
		mant <<= 1;
		exp--;
	}
	return sign | (exp << 23) | ((mant & 0x3ffu) << 13);
}

/* Round to nearest even. |x| >= 65520 (halfway between 65504 and 2^16) gives inf; results below
   2^-14 are binary16 subnormals rounded on their own 2^-24 grid; NaN gives a quiet NaN with as
   much of the payload as fits. */
static inline uint16_t f32_bits_to_f16(uint32_t x)
{
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t mant, rem, half, shift, h;

	x &= 0x7fffffffu;
	if (x > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
	if (x >= 0x477ff000u)
		return (uint16_t)(sign | 0x7c00u);
	if (x >= 0x38800000u) {
		/* normal: rebias the exponent, keep 10 mantissa bits, round on the 13 dropped; a
		   carry out of the mantissa correctly bumps the exponent */
		h = ((x - 0x38000000u) >> 13);
		rem = x & 0x1fffu;
		if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	if (x <= 0x33000000u) /* <= 2^-25: rounds to zero (2^-25 itself is a tie to even 0) */
		return sign;
	/* subnormal result: value = mant * 2^(e - 150) with the implicit bit, and the result is
	   round(value * 2^24) = mant >> (126 - e) */
	mant = (x & 0x7fffffu) | 0x800000u;
	shift = 126 - (x >> 23);
	h = mant >> shift;
	rem = mant & ((1u << shift) - 1);
	half = 1u << (shift - 1);
	if (rem > half || (rem == half && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

/* Round to nearest even on the 16 dropped bits; overflow carries into inf by itself. */
static inline uint16_t f32_bits_to_bf16(uint32_t x)
{
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

void kvt_to_f32(enum kvt_dtype dt, const void *src, float *dst, size_t n)
{
	const uint16_t *s16 = src;
	size_t i;

	switch (dt) {
	case KVT_DTYPE_F32:
		memmove(dst, src, n * sizeof(float));
		break;
	case KVT_DTYPE_F16:
		for (i = 0; i < n; i++)
			dst[i] = f32_from_bits(f16_to_f32_bits(s16[i]));
		break;
	case KVT_DTYPE_BF16:
		for (i = 0; i < n; i++)
			dst[i] = f32_from_bits((uint32_t)s16[i] << 16);
		break;
	}
}

void kvt_from_f32(enum kvt_dtype dt, const float *src, void *dst, size_t n)
{
	uint16_t *d16 = dst;
	size_t i;

	switch (dt) {
	case KVT_DTYPE_F32:
		memmove(dst, src, n * sizeof(float));
		break;
	case KVT_DTYPE_F16:
		for (i = 0; i < n; i++)
			d16[i] = f32_bits_to_f16(f32_bits(src[i]));
		break;
	case KVT_DTYPE_BF16:
		for (i = 0; i < n; i++)
			d16[i] = f32_bits_to_bf16(f32_bits(src[i]));
		break;
	}
}
