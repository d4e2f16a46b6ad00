/* SPDX-License-Identifier: MIT */
/*
 * f32 -> f16 (IEEE 754 binary16) and bf16 narrowing by bit manipulation, shared by the host's
 * conversions (policy/dtype.c) and the GPU kernels' stores (policy/dtype.cuh), so that both
 * round alike: to nearest, ties to even, like a GPU's __float2half_rn and __float2bfloat16_rn.
 */
#ifndef KVT_DTYPE_BITS_H
#define KVT_DTYPE_BITS_H

#include <stdint.h>

#if defined(__CUDACC__)
#define KVT_HD __host__ __device__
#else
#define KVT_HD
#endif

/* Round to nearest even. |x| >= 65520 (halfway between 65504 and 2^16) gives inf; results below
   2^-14 are binary16 subnormals rounded on their own 2^-24 grid; NaN gives a quiet NaN with as
   much of the payload as fits. */
static inline KVT_HD uint16_t kvt_f32_bits_to_f16(uint32_t x)
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
static inline KVT_HD uint16_t kvt_f32_bits_to_bf16(uint32_t x)
{
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

#endif /* KVT_DTYPE_BITS_H */
