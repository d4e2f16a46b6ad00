/* SPDX-License-Identifier: MIT */
/*
 * Device helpers shared by the policy kernels (region.cu, quest.cu): the resident test of a
 * block, lane masks, an inclusive scan over a warp, and the step of a radix select that finds
 * which bin of a 256-bin histogram holds a given rank. Built by nvcc and by the kernel
 * emulator alike.
 */
#ifndef KVT_SHARED_CUH
#define KVT_SHARED_CUH

#include <stdint.h>

#include "region.h"

#define KVT_WARP_FULL 0xffffffffu

/* The reference's kvt_region_resident (policy/region.h): whether all nv tokens of block b of
   head h are resident (sink and ring ranges, and the top-K count of its key entry). */
static __device__ __forceinline__ bool dev_resident(const struct kvt_region_key *key, uint32_t H,
						    uint32_t lbt, uint32_t sink, uint32_t ring0,
						    uint32_t h, uint32_t b, uint32_t nv)
{
	uint32_t p0 = b << lbt, end = p0 + nv, cnt = 0;

	if (p0 < sink)
		cnt += (end < sink ? end : sink) - p0;
	if (end > ring0)
		cnt += end - (p0 > ring0 ? p0 : ring0);
	return cnt + key[(uint64_t)b * H + h].tk == nv;
}

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

#endif /* KVT_SHARED_CUH */
