/* SPDX-License-Identifier: MIT */
/*
 * The CPU kernel emulator's stand-in for cuda_fp16.h (see ../kemu.h): __half as its bits, and
 * the exact binary16 -> f32 conversion the kernels' loads use.
 */
#ifndef KEMU_SHIM_CUDA_FP16_H
#define KEMU_SHIM_CUDA_FP16_H

#include "kemu.h"

struct __half {
	unsigned short x;
};

static inline __half __ushort_as_half(unsigned short u)
{
	return __half{u};
}

static inline float __half2float(__half h)
{
	uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu;

	if (e == 0x1f) /* inf, NaN (payload kept) */
		return __uint_as_float(sign | 0x7f800000u | m << 13);
	if (e == 0) { /* zero, subnormal: m * 2^-24, exact in f32 */
		float f = ldexpf((float)m, -24);

		return sign ? -f : f;
	}
	return __uint_as_float(sign | (e + 112) << 23 | m << 13);
}

#endif /* KEMU_SHIM_CUDA_FP16_H */
