/* SPDX-License-Identifier: MIT */
/*
 * Warp-level helpers shared by the policy kernels (region.cu, quest.cu): lane masks, an
 * inclusive scan over a warp, and the step of a radix select that finds which bin of a
 * 256-bin histogram holds a given rank. Built by nvcc and by the kernel emulator alike.
 */
#ifndef KVT_WARP_CUH
#define KVT_WARP_CUH

#include <stdint.h>

#define KVT_WARP_FULL 0xffffffffu

/* The lanes below this one, as a mask. */
static __device__ __forceinline__ uint32_t lanes_below(uint32_t lane)
{
	return (1u << lane) - 1u;
}

/* Inclusive sum over the lanes up to this one. */
static __device__ __forceinline__ uint32_t warp_scan(uint32_t v, uint32_t lane)
{
	for (uint32_t d = 1; d < 32; d *= 2) {
		uint32_t o = __shfl_sync(KVT_WARP_FULL, v, lane >= d ? lane - d : lane);

		if (lane >= d)
			v += o;
	}
	return v;
}

/* One warp's part of a radix-select step: the bin of hist[256] that holds the want-th element
   (1-based, want <= the histogram's total) goes to *bin, and the count of the bins before it to
   *below (both in shared memory, written by the one lane that finds them). Lane l sums bins
   [8l, 8l + 8); every lane of the warp must call it. */
static __device__ __forceinline__ void warp_hist_find(const uint32_t *hist, uint32_t want,
						      uint32_t lane, uint32_t *bin,
						      uint32_t *below)
{
	uint32_t part = 0, incl;

	for (uint32_t b = 0; b < 8; b++)
		part += hist[lane * 8 + b];
	incl = warp_scan(part, lane);
	if (incl - part < want && want <= incl) {
		uint32_t under = incl - part;

		for (uint32_t b = lane * 8;; b++) {
			if (under + hist[b] >= want) {
				*bin = b;
				*below = under;
				break;
			}
			under += hist[b];
		}
	}
}

#endif /* KVT_WARP_CUH */
