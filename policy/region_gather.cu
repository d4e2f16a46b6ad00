/* SPDX-License-Identifier: MIT */
/*
 * FlashH2D of recall regions (gpu.h, kvt_gpu_region_gather): after kvt_gpu_region_recall, the
 * loads each region listed go from the host tier (mapped pinned memory, read over UVA) into
 * their slots' device frames in one launch, with no piece list built by the host: the kernel
 * reads the regions' load lists where recall left them.
 *
 * The copy is transfer/cuda_gather.cu's: 16-byte vector loads, several in flight per thread
 * before their stores (PCIe latency is long), over a few CTAs (16 by default), which fill the
 * link without taking the SMs from the model's kernels.
 *
 * Sharing the work. Regions' load counts differ widely (none where a call hit everywhere,
 * hundreds where the selection jumped), so neither a CTA per region nor a fixed share of
 * regions per CTA keeps the CTAs alike busy. The unit of work is a chunk of one load: up to
 * RGG_CHUNK_VECS vectors (2 KiB) of its block, four per lane of a warp. The units of all
 * regions are numbered in region order, load order, then chunk order, and the grid's warps
 * take them round robin (warp w of W takes units w, w + W, ...): every warp gets the same
 * count of units to within one, whatever the regions' counts, and a 16 KiB block spreads over
 * 8 warps, so a recall of a few blocks still keeps many reads in flight. Warps rather than
 * cuda_gather.cu's whole CTA per piece, because here each unit first resolves its load (the
 * region's load entry, then its group entry and frame: dependent reads), which the 16 warps of
 * a CTA do independently, overlapping them; and a 16- or 48-byte block idles 31 lanes, not 511.
 *
 * The numbering needs each region's first load, a prefix over the counts *n_load, which lie in
 * device memory: each CTA scans them itself, RGG_THREADS regions (one per thread) at a time in
 * shared memory, copies that window's units, and finds a unit's region by a binary search over
 * the window's prefix. A CTA thus reads every region's count (n / RGG_THREADS windows of three
 * barriers), which spares a second launch or a grid-wide synchronisation.
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "gather.h"
#include "gpu.h"
#include "region.h"
#include "shared.cuh"

#define RGG_THREADS KVT_GATHER_THREADS
#define RGG_WARPS (RGG_THREADS / 32)
#define RGG_LANE_VECS 4			    /* 16-byte vectors a lane has in flight */
#define RGG_CHUNK_VECS (32 * RGG_LANE_VECS) /* the vectors of one unit: 2 KiB */

struct rgg_smem {
	uint32_t first[RGG_THREADS]; /* each region's first load, counted from the window's */
	uint32_t warp_sum[RGG_WARPS];
};

/* The loads of region g to copy: *n_load, never past its load array (n_heads * r entries) nor
   past the slots a region may have (its loads name distinct slots), so that a window's sum fits
   32 bits whatever the descriptor says. */
static __device__ uint32_t rgg_count(const struct kvt_gpu_region *g)
{
	uint64_t cap = (uint64_t)g->n_heads * g->r, c;

	if (!g->n_load || cap == 0)
		return 0;
	c = *g->n_load;
	c = c < cap ? c : cap;
	return c < KVT_REGION_MAX_SLOTS ? (uint32_t)c : KVT_REGION_MAX_SLOTS;
}

/* Copies chunk `chunk` of load q of the window (the window's regions start at rg, m of them, at
   first[]) with the calling warp; every lane calls it with the same unit. A load whose block has
   no host group (or names a block past the table) is counted once, by chunk 0's lane 0. */
static __device__ __forceinline__ void rgg_unit(const struct kvt_gpu_region *rg, uint32_t m,
						const uint32_t *first, uint32_t q, uint64_t chunk,
						uint32_t lane, uint64_t vecs, uint64_t block_bytes,
						uint64_t frame_base, uint32_t *missing,
						uint32_t *fresh)
{
	uint32_t lo = 0, hi = m - 1;

	/* the last region whose first load is at or before q: the one holding it, as a region
	   without loads shares its first with the next */
	while (lo < hi) {
		uint32_t mid = (lo + hi + 1) / 2;

		if (first[mid] <= q)
			lo = mid;
		else
			hi = mid - 1;
	}

	const struct kvt_gpu_region *g = &rg[lo];
	struct kvt_region_load ld = g->load[q - first[lo]];
	uint32_t H = g->n_heads, b = ld.key / H, h = ld.key % H; /* H > 0: the region has loads */
	uint64_t src = b < g->cap_blocks && g->group ? g->group[b] : 0;

	if (fresh && ld.old == KVT_REGION_NONE && chunk == 0 && lane == 0)
		atomicAdd(fresh, 1u); /* its slot holds a block now, copied or not */
	if (src == 0) {
		if (chunk == 0 && lane == 0) {
			if (g->stale)
				*g->stale = 1;
			if (missing)
				atomicAdd(missing, 1u);
		}
		return;
	}

	uint64_t f = g->frame ? g->frame[ld.slot] : ld.slot;
	const uint4 *s4 = (const uint4 *)(uintptr_t)(src + h * block_bytes);
	uint4 *d4 = (uint4 *)(uintptr_t)(frame_base + f * block_bytes);
	uint64_t v0 = chunk * RGG_CHUNK_VECS + lane;
	uint4 a[RGG_LANE_VECS] = {};

	/* every read of the chunk issued before the first write */
#pragma unroll
	for (uint32_t k = 0; k < RGG_LANE_VECS; k++)
		if (v0 + 32 * k < vecs)
			a[k] = s4[v0 + 32 * k];
#pragma unroll
	for (uint32_t k = 0; k < RGG_LANE_VECS; k++)
		if (v0 + 32 * k < vecs)
			d4[v0 + 32 * k] = a[k];
}

static __global__ void __launch_bounds__(RGG_THREADS)
	region_gather_kernel(const struct kvt_gpu_region *rg, uint32_t n, uint64_t block_bytes,
			     uint64_t frame_base, uint32_t *missing, uint32_t *fresh)
{
	__shared__ struct rgg_smem sm;
	uint32_t t = threadIdx.x, lane = t % 32, warp = t / 32;
	uint64_t vecs = block_bytes / 16, per_load = (vecs + RGG_CHUNK_VECS - 1) / RGG_CHUNK_VECS;
	uint64_t W = (uint64_t)gridDim.x * RGG_WARPS, w = (uint64_t)blockIdx.x * RGG_WARPS + warp;
	uint64_t base = 0; /* the units of the windows before this one */

	for (uint32_t w0 = 0; w0 < n; w0 += RGG_THREADS) {
		uint32_t m = n - w0 < RGG_THREADS ? n - w0 : RGG_THREADS;
		uint32_t c = t < m ? rgg_count(&rg[w0 + t]) : 0, incl = warp_scan(c, lane);
		uint64_t units;

		if (lane == 31)
			sm.warp_sum[warp] = incl;
		__syncthreads();
		if (warp == 0) {
			uint32_t v = lane < RGG_WARPS ? sm.warp_sum[lane] : 0;

			v = warp_scan(v, lane);
			if (lane < RGG_WARPS)
				sm.warp_sum[lane] = v;
		}
		__syncthreads();
		sm.first[t] = (warp ? sm.warp_sum[warp - 1] : 0) + incl - c;
		units = (uint64_t)sm.warp_sum[RGG_WARPS - 1] * per_load;
		__syncthreads();
		/* this warp's units of the window: those congruent to w modulo W, counted from the
		   first unit of all */
		for (uint64_t u = (w + W - base % W) % W; u < units; u += W)
			rgg_unit(rg + w0, m, sm.first, (uint32_t)(u / per_load), u % per_load, lane,
				 vecs, block_bytes, frame_base, missing, fresh);
		/* No barrier before the next window: its first writes (warp_sum) come after every
		   read of warp_sum here (before the barrier above), and first[] is written only
		   after two more barriers, which a warp still copying holds up. */
		base += units;
	}
}

extern "C" int kvt_gpu_region_gather(const struct kvt_gpu_region *rg, uint32_t n,
				     uint64_t block_bytes, uint64_t frame_base, uint32_t ctas,
				     uint32_t *missing, uint32_t *fresh, void *stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!rg || n > 0x7fffffffu || block_bytes == 0 || block_bytes % 16 ||
	    block_bytes > UINT32_MAX || frame_base == 0 || frame_base % 16)
		return cudaErrorInvalidValue;
	if (ctas == 0)
		ctas = KVT_GATHER_CTAS_DEFAULT;
	if (ctas > KVT_GATHER_CTAS_MAX)
		ctas = KVT_GATHER_CTAS_MAX;
	region_gather_kernel<<<ctas, RGG_THREADS, 0, (cudaStream_t)stream>>>(
		rg, n, block_bytes, frame_base, missing, fresh);
	return cudaGetLastError();
}

/* kvt_gpu_region_groups: one thread per entry. */
static __global__ void region_groups_kernel(const uint64_t *at, const uint64_t *val, uint32_t n)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		*(uint64_t *)(uintptr_t)at[i] = val[i];
}

extern "C" int kvt_gpu_region_groups(const uint64_t *at, const uint64_t *val, uint32_t n,
				     void *stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!at || !val || n > 0x7fffffffu)
		return cudaErrorInvalidValue;
	region_groups_kernel<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(at, val, n);
	return cudaGetLastError();
}
