/* SPDX-License-Identifier: MIT */
/*
 * Quest selection on the GPU (gpu.h): kvt_gpu_quest_select makes kvt_quest_select's decisions
 * (policy/recall.c) for a batch of (sequence, layer) entries, block for block.
 *
 * One CTA per (entry, kv head). The heads of a sequence share nothing but the descriptor (each
 * has its own queries, metadata column, resident test and top r), so a CTA per head needs no
 * coordination between heads, puts n * n_heads CTAs on the device instead of n (a decode batch
 * of a few sequences would leave most SMs idle with one CTA per sequence), and keeps one
 * head's g_count * head_dim query floats in shared memory for every block it scores.
 *
 * Scores. A thread per block: kvt_meta_bound's sums are sequential in d, so the reference's
 * rounding can only be had by one thread walking d in order; __fmul_rn and __fadd_rn keep nvcc
 * from contracting them into FMAs (the C side, reference included, is built with
 * -ffp-contract=off). The thread runs four query heads' sums side by side (each still in d
 * order, so the same bits) to share the metadata loads and hide the adds' latency; the maximum
 * over the heads is taken in head order, NaN of head 0 kept, as the reference does.
 *
 * Top r. A score maps to a 32-bit key whose unsigned order is kvt_topr's (NaN = 1 below every
 * number, -0 as +0, 0 = not a candidate), so "higher key, then lower block" is the reference's
 * total order. The blocks go through in chunks of QS_CHUNK, ascending; the best r so far (the
 * carry, ascending) sit in front of the chunk's keys, so the array is in block order. Per
 * chunk: when the carry and the chunk's candidates number more than r, a radix select (8-bit
 * digits, a shared histogram per digit) finds the r-th key T and the count `need` of keys equal
 * to T that make r; the new carry is every key above T and the first `need` equal to T in array
 * order (the lowest blocks: the tie rule), compacted in order by ballots and per-warp counts.
 * Any block count works in a fixed 36 KB of shared memory; a chunk of 4,096 costs 48 barriers.
 */
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype.cuh"
#include "gpu.h"
#include "shared.cuh"
#include "region.h"

#define QS_THREADS 256
#define QS_WARPS (QS_THREADS / 32)
#define QS_FULL 0xffffffffu
#define QS_MAXR KVT_GPU_QUEST_MAX_R
#define QS_QG 4 /* query heads summed side by side */

/* Blocks ranked at once; the emulator's build sets a small one so that its tests run many
   chunks. */
#ifndef QS_CHUNK
#define QS_CHUNK 4096
#endif
#define QS_SPAN (QS_MAXR + QS_CHUNK) /* the carry's room, then the chunk */

struct qs_smem {
	float q[KVT_GPU_QUEST_MAX_QDIM]; /* the head's g_count queries, f32 */
	uint32_t key[QS_SPAN];		 /* carry keys (0 past the carry), then the chunk's */
	uint32_t id[QS_MAXR];		 /* the carry's blocks */
	uint32_t hist[256];
	uint32_t n_gt[QS_WARPS], n_eq[QS_WARPS];
	uint32_t m, bin, below;
};

/* kvt_meta_bound of the block whose min and max rows are mn and mx (D elements each), against
   the G query heads q [G][D] (shared): the same products and sums, in the same order. */
template <typename T>
static __device__ float qs_bound(const T *mn, const T *mx, const float *q, uint32_t D, uint32_t G)
{
	float best = -INFINITY;

	for (uint32_t g0 = 0; g0 < G; g0 += QS_QG) {
		const float *qg[QS_QG];
		float s[QS_QG];

#pragma unroll
		for (uint32_t k = 0; k < QS_QG; k++) { /* heads past G repeat the last: discarded */
			qg[k] = q + (size_t)(g0 + k < G ? g0 + k : G - 1) * D;
			s[k] = 0.0f;
		}
		for (uint32_t d = 0; d < D; d++) {
			float lo = kvt_load(mn + d), hi = kvt_load(mx + d);

#pragma unroll
			for (uint32_t k = 0; k < QS_QG; k++) {
				float v = qg[k][d];

				s[k] = __fadd_rn(s[k],
						 v >= 0.0f ? __fmul_rn(v, hi) : __fmul_rn(v, lo));
			}
		}
#pragma unroll
		for (uint32_t k = 0; k < QS_QG; k++)
			if (g0 + k < G && (s[k] > best || (g0 + k == 0 && isnan(s[k]))))
				best = s[k];
	}
	return best;
}

/* The rank key of a candidate's score: unsigned order is kvt_topr's order of scores (NaN below
   every number, -0 equal to +0); 0 is left for "no candidate". */
static __device__ __forceinline__ uint32_t qs_key(float s)
{
	uint32_t u;

	if (isnan(s))
		return 1;
	u = __float_as_uint(s == 0.0f ? 0.0f : s);
	return (u & 0x80000000u) ? ~u : u | 0x80000000u; /* -inf: 0x007fffff, above 1 */
}

/* Grid: n * H CTAs; CTA x serves entry x / H, kv head x % H. Every loop bound around a
   __syncthreads() is uniform: it comes from the arguments, the descriptor or shared memory
   read after a barrier. */
template <typename T>
static __global__ void __launch_bounds__(QS_THREADS)
	quest_kernel(const struct kvt_gpu_quest *qs, const T *q, uint32_t *sel, uint32_t H,
		     uint32_t G, uint32_t D, uint32_t lbt, uint32_t r)
{
	__shared__ struct qs_smem sm;
	const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
	const uint32_t e = blockIdx.x / H, h = blockIdx.x % H;
	const struct kvt_gpu_quest *E = &qs[e];
	const uint32_t N = E->n_tokens, sink = E->sink, ring0 = E->ring0, bt = 1u << lbt;
	const uint64_t nb = ((uint64_t)N + bt - 1) >> lbt;
	const T *meta = (const T *)E->meta, *qh = q + ((size_t)e * H + h) * G * D;
	const struct kvt_region_key *key = E->key;
	uint32_t kc = 0; /* the carry's size */

	for (uint32_t x = tid; x < G * D; x += QS_THREADS)
		sm.q[x] = kvt_load(qh + x);
	for (uint32_t x = tid; x < QS_MAXR; x += QS_THREADS)
		sm.key[x] = 0;
	if (tid == 0)
		sm.m = 0;
	__syncthreads();

	for (uint64_t c0 = 0; c0 < nb; c0 += QS_CHUNK) {
		uint32_t cnt = 0, m, thr = 0, need = 0, gt_all = 0, eq_all = 0;

		/* the chunk's keys; its candidates added to sm.m, which holds the carry's size */
		for (uint32_t i = tid; i < QS_CHUNK; i += QS_THREADS) {
			uint32_t k = 0;

			if (c0 + i < nb) {
				uint32_t b = (uint32_t)(c0 + i), left = N - (b << lbt);
				uint32_t nv = left < bt ? left : bt;

				if (!dev_resident(key, H, lbt, sink, ring0, h, b, nv)) {
					const T *mb = meta + ((size_t)b * H + h) * 2 * D;

					k = qs_key(qs_bound<T>(mb, mb + D, sm.q, D, G));
				}
			}
			sm.key[QS_MAXR + i] = k;
			cnt += k != 0;
		}
		for (uint32_t o = 16; o; o /= 2)
			cnt += __shfl_xor_sync(QS_FULL, cnt, o);
		if (lane == 0 && cnt)
			atomicAdd(&sm.m, cnt);
		__syncthreads();
		m = sm.m;

		/* more than r: the r-th key thr, as the r-th smallest of the inverted keys (the
		   non-candidates' 0 inverts to the top, past the r-th) */
		if (m > r) {
			uint32_t want = r, pre = 0;

			for (int shift = 24; shift >= 0; shift -= 8) {
				for (uint32_t b = tid; b < 256; b += QS_THREADS)
					sm.hist[b] = 0;
				__syncthreads();
				for (uint32_t p = tid; p < QS_SPAN; p += QS_THREADS) {
					uint32_t v = ~sm.key[p];

					if (shift == 24 ||
					    (v >> (shift + 8)) == (pre >> (shift + 8)))
						atomicAdd(&sm.hist[(v >> shift) & 255], 1u);
				}
				__syncthreads();
				if (warp == 0) /* the digit's bin holding the want-th */
					warp_hist_find(sm.hist, want, lane, &sm.bin, &sm.below);
				__syncthreads();
				pre |= sm.bin << shift;
				want -= sm.below;
			}
			thr = ~pre;
			need = want; /* of the keys equal to thr, the first `need` */
		}

		/* the new carry: keys above thr, then the first `need` equal to it (none and none
		   when all of them fit: thr = 0), in array order, which is block order */
		for (uint32_t p0 = 0; p0 < QS_SPAN; p0 += QS_THREADS) {
			uint32_t p = p0 + tid, k = p < QS_SPAN ? sm.key[p] : 0, gt_below, eq_below;
			uint32_t id = p < QS_MAXR ? sm.id[p] : (uint32_t)(c0 + (p - QS_MAXR));
			bool gt = k > thr, eq = k == thr && k != 0;
			uint32_t bg = __ballot_sync(QS_FULL, gt), be = __ballot_sync(QS_FULL, eq);

			if (lane == 0) {
				sm.n_gt[warp] = __popc(bg);
				sm.n_eq[warp] = __popc(be);
			}
			gt_below = gt_all + __popc(bg & lanes_below(lane));
			eq_below = eq_all + __popc(be & lanes_below(lane));
			__syncthreads(); /* the tile read and counted */
			for (uint32_t w = 0; w < QS_WARPS; w++) {
				if (w < warp) {
					gt_below += sm.n_gt[w];
					eq_below += sm.n_eq[w];
				}
				gt_all += sm.n_gt[w];
				eq_all += sm.n_eq[w];
			}
			/* at <= p: a place this tile or an earlier one has read, before its
			   barrier */
			if (gt || (eq && eq_below < need)) {
				uint32_t at = gt_below + (eq_below < need ? eq_below : need);

				sm.key[at] = k;
				sm.id[at] = id;
			}
			__syncthreads(); /* the counts read before the next tile's */
		}
		kc = m < r ? m : r;
		for (uint32_t x = kc + tid; x < QS_MAXR; x += QS_THREADS)
			sm.key[x] = 0;
		if (tid == 0)
			sm.m = kc;
		__syncthreads();
	}

	uint32_t *out = sel + ((size_t)e * H + h) * r;

	for (uint32_t j = tid; j < r; j += QS_THREADS)
		out[j] = j < kc ? sm.id[j] : KVT_REGION_NONE;
}

extern "C" int kvt_gpu_quest_select(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
				    uint32_t g_count, uint32_t lbt, uint32_t r,
				    const struct kvt_gpu_quest *qs, const void *q, uint32_t *sel,
				    uint32_t n, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	unsigned int ctas = (unsigned int)((uint64_t)n * n_heads);

	if (n == 0)
		return cudaSuccess;
	if (!qs || !q || !sel || head_dim == 0 || g_count == 0 || n_heads == 0 || lbt >= 32 ||
	    r == 0 || r > KVT_GPU_QUEST_MAX_R ||
	    (uint64_t)g_count * head_dim > KVT_GPU_QUEST_MAX_QDIM ||
	    (uint64_t)n * n_heads > INT32_MAX)
		return cudaErrorInvalidValue;
	switch (dt) {
	case KVT_DTYPE_F32:
		quest_kernel<float><<<ctas, QS_THREADS, 0, st>>>(qs, (const float *)q, sel, n_heads,
								 g_count, head_dim, lbt, r);
		break;
	case KVT_DTYPE_F16:
		quest_kernel<kvt_f16><<<ctas, QS_THREADS, 0, st>>>(
			qs, (const kvt_f16 *)q, sel, n_heads, g_count, head_dim, lbt, r);
		break;
	case KVT_DTYPE_BF16:
		quest_kernel<kvt_bf16><<<ctas, QS_THREADS, 0, st>>>(
			qs, (const kvt_bf16 *)q, sel, n_heads, g_count, head_dim, lbt, r);
		break;
	default:
		return cudaErrorInvalidValue;
	}
	return cudaGetLastError();
}
