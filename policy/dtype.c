/* SPDX-License-Identifier: MIT */
/*
 * dtype: f32 <-> f16 (IEEE 754 binary16) and bf16 conversion by bit manipulation, so the result
 * does not depend on the compiler's _Float16 support or on the FPU's rounding mode. Widening is
 * exact; narrowing rounds to nearest, ties to even, like a GPU's __float2half_rn and
 * __float2bfloat16_rn.
 */
#include <string.h>

#include "dtype_bits.h"
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
			d16[i] = kvt_f32_bits_to_f16(f32_bits(src[i]));
		break;
	case KVT_DTYPE_BF16:
		for (i = 0; i < n; i++)
			d16[i] = kvt_f32_bits_to_bf16(f32_bits(src[i]));
		break;
	}
}
