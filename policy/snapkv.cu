/* SPDX-License-Identifier: MIT */
/*
 * SnapKV selection on the GPU (docs/design.md, "SnapKV selection"): kvt_gpu_snapkv_select and
 * kvt_gpu_snapkv_scores match kvt_snapkv_select and kvt_snapkv_scores (policy/snapkv.c) on the
 * same inputs. The arithmetic is the reference's, f32 throughout, in another order: the pooled
 * scores agree within f32 rounding, so the selection is identical up to ties at the cutoff.
 *
 * Steps 1-2 are two passes of a tiled Q_obs K^T product per kv head (the G * L_obs obs rows of
 * the group against every key), so each key row is read from DRAM twice in all rather than once
 * per obs row:
 *   sk_stats     per (span of keys, kv head): the max logit and sum of exp(logit - max) of every
 *                obs row over the span's causal keys;
 *   sk_rowstats  per obs row: merges the spans into the row's softmax max and denominator;
 *   sk_vote      per (64 keys below L - L_obs, kv head): recomputes the logits and sums the
 *                softmax weights over all obs rows of the group, then divides by G. Each key's
 *                vote is summed by one CTA in a fixed order: no atomics, deterministic.
 * Step 3 (sk_pool) sums the window in the reference's order, so it is bit-exact given the votes.
 * Steps 4-6 rank the candidates with one stable CUB radix sort over every head at once (key:
 * head, then pooled score mapped to an order-preserving integer with NaN lowest; the stable sort
 * keeps equal scores in position order), flag the first count of each head and compact the flags
 * with cub::DeviceSelect::Flagged, which yields each head's positions in ascending order.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cub/cub.cuh>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "dtype.cuh"
#include "gpu.h"

#define SK_R 32	       /* obs rows per product tile */
#define SK_TK 64       /* keys per product tile */
#define SK_DC 32       /* head_dim chunk staged in shared memory */
#define SK_THREADS 256 /* every kernel here; the tile mapping below assumes it */
#define SK_SPAN_MAX 16 /* key tiles per sk_stats CTA, at most */
/* sk_stats grid size aimed at when choosing the span (kernel-emu sets it lower, so that its
   long cases reach SK_SPAN_MAX) */
#ifndef SK_STATS_CTAS
#define SK_STATS_CTAS 1024
#endif
#define SK_ALIGN 256	   /* every scratch piece; also what CUB's temp storage wants */
#define SK_GRID_MAX 65536u /* 1D grid-stride kernels: enough CTAs to fill any current GPU */
#define SK_FULL 0xffffffffu

/* Shapes every kernel needs; passed by value. Row r of kv head h's group is obs query r % L_obs
   of query head h * G + r / L_obs, i.e. row h * GL + r of q_obs, at position n + r % L_obs. */
struct sk_dims {
	uint32_t L, n, Lobs, G, GL, D;
	uint32_t span, nspan; /* sk_stats: key tiles per CTA, CTAs per head */
	float norm;	      /* sqrtf(head_dim), computed on the host as the reference does */
};

struct sk_tile {
	/* +1 column: the inner loop reads k down a column, 16 rows apart in a warp */
	float q[SK_R][SK_DC + 1];
	float k[SK_TK][SK_DC + 1];
};

/* Logits of a tile: acc[a][c] = q_r . k_j / norm for r = ty + 16 a, j = tx + 16 c (tx = tid % 16,
   ty = tid / 16). Rows >= nrows and keys >= nkeys are read as zeros (their logits are garbage
   the callers mask). Contains __syncthreads(): every thread of the CTA must call it. */
template <typename T>
static __device__ __forceinline__ void
sk_logits(const T *__restrict__ q, uint32_t nrows, const T *__restrict__ k, uint32_t nkeys,
	  uint32_t D, float norm, struct sk_tile *sm, float acc[2][4])
{
	const uint32_t tid = threadIdx.x, tx = tid % 16, ty = tid / 16;

#pragma unroll
	for (int a = 0; a < 2; a++) {
#pragma unroll
		for (int c = 0; c < 4; c++)
			acc[a][c] = 0.0f;
	}
	for (size_t d0 = 0; d0 < D; d0 += SK_DC) {
		/* a warp loads 32 consecutive elements of one row: coalesced */
		for (uint32_t e = tid; e < SK_R * SK_DC; e += SK_THREADS) {
			uint32_t r = e / SK_DC, dd = e % SK_DC;

			sm->q[r][dd] = r < nrows && d0 + dd < D
					       ? kvt_load(q + (size_t)r * D + d0 + dd)
					       : 0.0f;
		}
		for (uint32_t e = tid; e < SK_TK * SK_DC; e += SK_THREADS) {
			uint32_t j = e / SK_DC, dd = e % SK_DC;

			sm->k[j][dd] = j < nkeys && d0 + dd < D
					       ? kvt_load(k + (size_t)j * D + d0 + dd)
					       : 0.0f;
		}
		__syncthreads();
		for (uint32_t dd = 0; dd < SK_DC; dd++) {
			float a0 = sm->q[ty][dd], a1 = sm->q[ty + 16][dd];

#pragma unroll
			for (int c = 0; c < 4; c++) {
				float b = sm->k[tx + 16 * c][dd];

				acc[0][c] = fmaf(a0, b, acc[0][c]);
				acc[1][c] = fmaf(a1, b, acc[1][c]);
			}
		}
		__syncthreads(); /* the next chunk overwrites the tile */
	}
#pragma unroll
	for (int a = 0; a < 2; a++) {
#pragma unroll
		for (int c = 0; c < 4; c++)
			acc[a][c] = acc[a][c] / norm; /* a division, as the reference */
	}
}

/* Merges softmax partials (m, s) of two disjoint key sets, s being the sum of exp(logit - m).
   It keeps the reference's special values: a set whose max is -inf holds only -inf and NaN
   logits and has s 0 or NaN, which the merge multiplies by exp(-inf) = 0 (NaN stays NaN); a
   +inf max turns the sum NaN as exp(inf - inf) does on the CPU. When the merged max is -inf the
   sum does not matter: every weight exp(-inf - -inf) / S is NaN, as on the CPU. */
static __device__ __forceinline__ void sk_merge(float *m, float *s, float m2, float s2)
{
	float M = fmaxf(*m, m2); /* never NaN: maxima start at -inf and fmaxf drops NaN */

	if (M == -INFINITY) {
		*s = *s + s2;
		return;
	}
	*s = *s * expf(*m - M) + s2 * expf(m2 - M);
	*m = M;
}

/* Pass 1 of step 1. Grid (nspan, n_kv_heads): CTA (x, h) covers the keys
   [x * span * SK_TK, min(L, (x + 1) * span * SK_TK)) for every obs row of head h's group and
   writes the row's partial (max, sum of exp) to pm/ps[(h * GL + r) * nspan + x].
   The product kernels ask for 2 CTAs per SM: given only the thread count, ptxas 13 held them to
   32 registers and spilled the accumulators. */
template <typename T>
static __global__ void __launch_bounds__(SK_THREADS, 2)
	sk_stats(const T *__restrict__ k, const T *__restrict__ q, struct sk_dims dm,
		 float *__restrict__ pm, float *__restrict__ ps)
{
	__shared__ struct sk_tile sm;
	const uint32_t h = blockIdx.y, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
	const uint32_t jspan = blockIdx.x * dm.span * SK_TK; /* < L */
	const T *qh = q + (size_t)h * dm.GL * dm.D;

	for (uint32_t r0 = 0; r0 < dm.GL; r0 += SK_R) {
		uint32_t nrows = min((uint32_t)SK_R, dm.GL - r0);
		float m[2] = {-INFINITY, -INFINITY}, s[2] = {0.0f, 0.0f};

		for (uint32_t t = 0; t < dm.span; t++) {
			uint32_t j0 = jspan + t * SK_TK;
			uint32_t nkeys;
			float acc[2][4];

			if (j0 >= dm.L)
				break; /* the same for the whole CTA */
			nkeys = min((uint32_t)SK_TK, dm.L - j0);
			sk_logits(qh + (size_t)r0 * dm.D, nrows, k + ((size_t)h * dm.L + j0) * dm.D,
				  nkeys, dm.D, dm.norm, &sm, acc);
#pragma unroll
			for (int a = 0; a < 2; a++) {
				/* rows past GL compute garbage but take part in the shuffles */
				uint32_t p = dm.n + (r0 + ty + 16 * a) % dm.Lobs;
				float tm = -INFINITY, ts = 0.0f;

#pragma unroll
				for (int c = 0; c < 4; c++) {
					uint32_t jc = tx + 16 * c;

					if (jc < nkeys && j0 + jc <= p)
						tm = fmaxf(tm, acc[a][c]);
				}
				/* the 16 threads of a row are lanes 0-15 or 16-31 of one warp */
#pragma unroll
				for (int o = 8; o > 0; o /= 2)
					tm = fmaxf(tm, __shfl_xor_sync(SK_FULL, tm, o));
#pragma unroll
				for (int c = 0; c < 4; c++) {
					uint32_t jc = tx + 16 * c;
					float x = acc[a][c];

					if (jc < nkeys && j0 + jc <= p)
						ts += tm == -INFINITY ? (isnan(x) ? x : 0.0f)
								      : expf(x - tm);
				}
#pragma unroll
				for (int o = 8; o > 0; o /= 2)
					ts += __shfl_xor_sync(SK_FULL, ts, o);
				sk_merge(&m[a], &s[a], tm, ts);
			}
		}
		if (tx == 0) {
#pragma unroll
			for (int a = 0; a < 2; a++) {
				uint32_t r = r0 + ty + 16 * a;
				size_t at = ((size_t)h * dm.GL + r) * dm.nspan + blockIdx.x;

				if (r < dm.GL) {
					pm[at] = m[a];
					ps[at] = s[a];
				}
			}
		}
	}
}

/* Merges the nspan partials of each obs row (grid: one CTA per row of q_obs) into the row's
   softmax max rm[row] and denominator rs[row]. */
static __global__ void __launch_bounds__(SK_THREADS)
	sk_rowstats(const float *__restrict__ pm, const float *__restrict__ ps, uint32_t nspan,
		    float *__restrict__ rm, float *__restrict__ rs)
{
	__shared__ float wm[SK_THREADS / 32], ws[SK_THREADS / 32];
	const size_t row = blockIdx.x;
	const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	float m = -INFINITY, s = 0.0f;

	for (uint32_t t = threadIdx.x; t < nspan; t += SK_THREADS)
		sk_merge(&m, &s, pm[row * nspan + t], ps[row * nspan + t]);
#pragma unroll
	for (int o = 16; o > 0; o /= 2) {
		float m2 = __shfl_xor_sync(SK_FULL, m, o), s2 = __shfl_xor_sync(SK_FULL, s, o);

		sk_merge(&m, &s, m2, s2);
	}
	if (lane == 0) {
		wm[warp] = m;
		ws[warp] = s;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		m = wm[0];
		s = ws[0];
#pragma unroll
		for (int w = 1; w < SK_THREADS / 32; w++)
			sk_merge(&m, &s, wm[w], ws[w]);
		rm[row] = m;
		rs[row] = s;
	}
}

/* Pass 2 of step 1, and step 2. Grid (ceil(n / SK_TK), n_kv_heads): CTA (x, h) writes
   vote[h * n + j] for j in [x * SK_TK, min(n, (x + 1) * SK_TK)). Keys below n = L - L_obs lie
   before every obs position, so no causal mask is needed here. */
template <typename T>
static __global__ void __launch_bounds__(SK_THREADS, 2)
	sk_vote(const T *__restrict__ k, const T *__restrict__ q, struct sk_dims dm,
		const float *__restrict__ rm, const float *__restrict__ rs,
		float *__restrict__ vote)
{
	__shared__ struct sk_tile sm;
	__shared__ float red[SK_THREADS / 16][SK_TK];
	const uint32_t h = blockIdx.y, tx = threadIdx.x % 16, ty = threadIdx.x / 16;
	const uint32_t j0 = blockIdx.x * SK_TK; /* < n */
	const uint32_t nkeys = min((uint32_t)SK_TK, dm.n - j0);
	const T *qh = q + (size_t)h * dm.GL * dm.D;
	float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};

	for (uint32_t r0 = 0; r0 < dm.GL; r0 += SK_R) {
		uint32_t nrows = min((uint32_t)SK_R, dm.GL - r0);
		float acc[2][4];

		sk_logits(qh + (size_t)r0 * dm.D, nrows, k + ((size_t)h * dm.L + j0) * dm.D, nkeys,
			  dm.D, dm.norm, &sm, acc);
#pragma unroll
		for (int a = 0; a < 2; a++) {
			uint32_t r = r0 + ty + 16 * a;
			float M, S;

			if (r >= dm.GL)
				continue;
			M = rm[(size_t)h * dm.GL + r];
			S = rs[(size_t)h * dm.GL + r];
#pragma unroll
			for (int c = 0; c < 4; c++)
				if (tx + 16 * c < nkeys)
					v[c] += expf(acc[a][c] - M) / S;
		}
	}
#pragma unroll
	for (int c = 0; c < 4; c++)
		red[ty][tx + 16 * c] = v[c];
	__syncthreads();
	if (threadIdx.x < nkeys) {
		float sum = 0.0f;

#pragma unroll
		for (int y = 0; y < SK_THREADS / 16; y++)
			sum += red[y][threadIdx.x];
		vote[(size_t)h * dm.n + j0 + threadIdx.x] = sum / (float)dm.G;
	}
}

/* Step 3 over total = n_kv_heads * n entries, the window summed in ascending order and divided
   by the kernel (padding counts), exactly as the reference. */
static __global__ void __launch_bounds__(SK_THREADS)
	sk_pool(const float *__restrict__ vote, uint32_t n, size_t total, uint32_t r, float kdiv,
		float *__restrict__ pooled)
{
	for (size_t i = blockIdx.x * (size_t)SK_THREADS + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * SK_THREADS) {
		size_t j = i % n;
		const float *vh = vote + (i - j);
		size_t lo = j >= r ? j - r : 0;
		size_t hi = r < n - j ? j + r : n - 1;
		float acc = 0.0f;

		for (size_t t = lo; t <= hi; t++)
			acc += vh[t];
		pooled[i] = acc / kdiv;
	}
}

/* Order-preserving key of a pooled score: higher score, higher key; NaN lowest (0, below -inf's
   0x007fffff); -0 and +0 equal, as the reference compares them. On the bits, so a flush-to-zero
   build cannot merge subnormal scores with zero here. */
static __device__ __forceinline__ uint32_t sk_rank(float f)
{
	uint32_t u = __float_as_uint(f), mag = u & 0x7fffffffu;

	if (mag > 0x7f800000u)
		return 0;
	if (mag == 0)
		u = 0;
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Sort input over total = n_kv_heads * ncand candidates: key (h << 32) | ~rank sorts ascending
   by head, then by descending score; value = position. Positions go in ascending, so the stable
   sort breaks ties to the lower position. */
static __global__ void __launch_bounds__(SK_THREADS)
	sk_keys(const float *__restrict__ pooled, uint32_t n, uint32_t lo, uint32_t ncand,
		size_t total, uint64_t *__restrict__ keys, int32_t *__restrict__ pos)
{
	for (size_t i = blockIdx.x * (size_t)SK_THREADS + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * SK_THREADS) {
		size_t h = i / ncand, c = i % ncand;

		keys[i] = (uint64_t)h << 32 | (uint32_t)~sk_rank(pooled[h * n + lo + c]);
		pos[i] = (int32_t)(lo + c);
	}
}

/* Flags the count best of each head (the first count of its sorted segment), total =
   n_kv_heads * count; flags is zeroed before. */
static __global__ void __launch_bounds__(SK_THREADS)
	sk_flag(const int32_t *__restrict__ sorted, uint32_t ncand, uint32_t count, uint32_t lo,
		size_t total, uint8_t *__restrict__ flags)
{
	for (size_t i = blockIdx.x * (size_t)SK_THREADS + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * SK_THREADS) {
		size_t h = i / count, rank = i % count;
		int32_t p = sorted[h * ncand + rank];

		flags[h * ncand + (uint32_t)(p - (int32_t)lo)] = 1;
	}
}

/* ---- host side ---- */

/* Where everything lives in the caller's scratch, as byte offsets (each SK_ALIGN-aligned):
   pm, ps   [n_q_heads * L_obs][nspan] f32   softmax partials of sk_stats
   rm, rs   [n_q_heads * L_obs] f32          row max and denominator
   vote     [n_kv_heads][n] f32              steps 1-2
   -- scores_bytes: what kvt_gpu_snapkv_scores needs; select goes on with --
   pooled   [n_kv_heads][n] f32
   kin,kout [n_kv_heads][ncand] u64          sort keys
   vin,vout [n_kv_heads][ncand] i32          positions
   flags    [n_kv_heads][ncand] u8
   nsel     1 i64                             DeviceSelect's count, unused
   temp     CUB temp storage, the larger of the sort's and the select's */
struct sk_plan {
	struct sk_dims dm;
	uint32_t H, count, lo, ncand, nvt;
	size_t rows;  /* n_q_heads * L_obs */
	size_t items; /* n_kv_heads * ncand */
	int end_bit;  /* bits of the sort key in use */
	size_t pm, ps, rm, rs, vote, pooled, kin, kout, vin, vout, flags, nsel, temp;
	size_t temp_bytes;
	size_t scores_bytes; /* 0 when L <= L_obs */
	size_t select_bytes; /* 0 when count is 0 */
};

/* Adds a piece of bytes at *at, rounded up to SK_ALIGN; false on size_t overflow. */
static bool sk_take(size_t *at, size_t *off, size_t n, size_t size)
{
	size_t bytes;

	if (size && n > SIZE_MAX / size)
		return false;
	bytes = n * size;
	if (*at > SIZE_MAX - (SK_ALIGN - 1) || bytes > SIZE_MAX - (SK_ALIGN - 1) - *at)
		return false;
	*off = *at;
	*at += (bytes + SK_ALIGN - 1) / SK_ALIGN * SK_ALIGN;
	return true;
}

/* Fills *pl for p. with_temp: also size CUB's temp storage, which asks the current device
   (cudaGetDevice, PTX version), so it needs a working CUDA context; selection needs it, the
   scores do not. Returns a cudaError_t. */
static cudaError_t sk_plan_make(const struct kvt_snapkv *p, bool with_temp, struct sk_plan *pl)
{
	size_t at = 0, nkt, span;
	uint32_t hi, hbits;
	cudaError_t err;

	memset(pl, 0, sizeof(*pl));
	if (kvt_snapkv_check(p))
		return cudaErrorInvalidValue;
	/* the head is blockIdx.y; obs rows are one CTA each in sk_rowstats */
	if (p->n_kv_heads > 65535)
		return cudaErrorInvalidValue;
	pl->rows = (size_t)p->n_q_heads * p->obs_window;
	if (pl->rows > INT32_MAX)
		return cudaErrorInvalidValue;
	pl->H = p->n_kv_heads;
	pl->dm.L = p->prompt_tokens;
	pl->dm.Lobs = p->obs_window;
	pl->dm.n = pl->dm.L > pl->dm.Lobs ? pl->dm.L - pl->dm.Lobs : 0;
	pl->dm.G = p->n_q_heads / p->n_kv_heads;
	pl->dm.GL = pl->dm.G * pl->dm.Lobs; /* <= rows */
	pl->dm.D = p->head_dim;
	pl->dm.norm = sqrtf((float)p->head_dim);
	if (pl->dm.n == 0)
		return cudaSuccess;

	/* Spans of several key tiles keep the partials small at long L, while at least about
	   SK_STATS_CTAS CTAs keep the GPU busy at short L. */
	nkt = ((size_t)pl->dm.L + SK_TK - 1) / SK_TK;
	span = (nkt * pl->H + SK_STATS_CTAS - 1) / SK_STATS_CTAS;
	span = span < 1 ? 1 : span > SK_SPAN_MAX ? SK_SPAN_MAX : span;
	pl->dm.span = (uint32_t)span;
	pl->dm.nspan = (uint32_t)((nkt + span - 1) / span);
	pl->nvt = (pl->dm.n + SK_TK - 1) / SK_TK;

	if (!sk_take(&at, &pl->pm, pl->rows * pl->dm.nspan, 4) ||
	    !sk_take(&at, &pl->ps, pl->rows * pl->dm.nspan, 4) ||
	    !sk_take(&at, &pl->rm, pl->rows, 4) || !sk_take(&at, &pl->rs, pl->rows, 4) ||
	    !sk_take(&at, &pl->vote, (size_t)pl->H * pl->dm.n, 4))
		return cudaErrorInvalidValue;
	pl->scores_bytes = at;

	pl->count = kvt_snapkv_count(p);
	if (pl->count == 0)
		return cudaSuccess;
	pl->lo = p->sink;
	hi = pl->dm.L - p->recent; /* count > 0: L > sink + recent */
	if (pl->dm.n < hi)
		hi = pl->dm.n;
	pl->ncand = hi - pl->lo;
	pl->items = (size_t)pl->H * pl->ncand;
	for (hbits = 0; (1u << hbits) < pl->H; hbits++)
		;
	pl->end_bit = 32 + (int)hbits;
	if (!sk_take(&at, &pl->pooled, (size_t)pl->H * pl->dm.n, 4) ||
	    !sk_take(&at, &pl->kin, pl->items, 8) || !sk_take(&at, &pl->kout, pl->items, 8) ||
	    !sk_take(&at, &pl->vin, pl->items, 4) || !sk_take(&at, &pl->vout, pl->items, 4) ||
	    !sk_take(&at, &pl->flags, pl->items, 1) || !sk_take(&at, &pl->nsel, 1, 8))
		return cudaErrorInvalidValue;
	if (with_temp) {
		size_t sort_bytes = 0, sel_bytes = 0;

		/* size queries only (NULL temp): no launch; the real calls pass the same types,
		   item count and bits */
		err = cub::DeviceRadixSort::SortPairs(
			nullptr, sort_bytes, (const uint64_t *)nullptr, (uint64_t *)nullptr,
			(const int32_t *)nullptr, (int32_t *)nullptr, (int64_t)pl->items, 0,
			pl->end_bit);
		if (err != cudaSuccess)
			return err;
		err = cub::DeviceSelect::Flagged(nullptr, sel_bytes, (const int32_t *)nullptr,
						 (const uint8_t *)nullptr, (int32_t *)nullptr,
						 (int64_t *)nullptr, (int64_t)pl->items);
		if (err != cudaSuccess)
			return err;
		pl->temp_bytes = sort_bytes > sel_bytes ? sort_bytes : sel_bytes;
		if (!sk_take(&at, &pl->temp, pl->temp_bytes, 1))
			return cudaErrorInvalidValue;
	}
	pl->select_bytes = at;
	return cudaSuccess;
}

static unsigned int sk_grid(size_t total)
{
	size_t b = (total + SK_THREADS - 1) / SK_THREADS;

	return b < SK_GRID_MAX ? (unsigned int)b : SK_GRID_MAX;
}

/* Steps 1-2 into the scratch's vote; requires n > 0. */
template <typename T>
static cudaError_t sk_votes_t(const struct sk_plan *pl, const void *k, const void *q_obs, char *s,
			      cudaStream_t st)
{
	const T *kt = (const T *)k, *qt = (const T *)q_obs;
	float *pm = (float *)(s + pl->pm), *ps = (float *)(s + pl->ps);
	float *rm = (float *)(s + pl->rm), *rs = (float *)(s + pl->rs);
	cudaError_t err;

	/* without obs rows every vote is 0 (the reference's memset) and sk_vote reads no stats */
	if (pl->dm.GL) {
		sk_stats<T>
			<<<dim3(pl->dm.nspan, pl->H), SK_THREADS, 0, st>>>(kt, qt, pl->dm, pm, ps);
		err = cudaGetLastError();
		if (err != cudaSuccess)
			return err;
		sk_rowstats<<<(unsigned int)pl->rows, SK_THREADS, 0, st>>>(pm, ps, pl->dm.nspan, rm,
									   rs);
		err = cudaGetLastError();
		if (err != cudaSuccess)
			return err;
	}
	sk_vote<T><<<dim3(pl->nvt, pl->H), SK_THREADS, 0, st>>>(kt, qt, pl->dm, rm, rs,
								(float *)(s + pl->vote));
	return cudaGetLastError();
}

/* Steps 1-3: pooled [n_kv_heads][n]; requires n > 0. */
static cudaError_t sk_pooled(const struct kvt_snapkv *p, const struct sk_plan *pl, const void *k,
			     const void *q_obs, float *pooled, char *s, cudaStream_t st)
{
	size_t total = (size_t)pl->H * pl->dm.n;
	cudaError_t err = cudaErrorInvalidValue;

	switch (p->dtype) {
	case KVT_DTYPE_F32:
		err = sk_votes_t<float>(pl, k, q_obs, s, st);
		break;
	case KVT_DTYPE_F16:
		err = sk_votes_t<kvt_f16>(pl, k, q_obs, s, st);
		break;
	case KVT_DTYPE_BF16:
		err = sk_votes_t<kvt_bf16>(pl, k, q_obs, s, st);
		break;
	}
	if (err != cudaSuccess)
		return err;
	sk_pool<<<sk_grid(total), SK_THREADS, 0, st>>>((const float *)(s + pl->vote), pl->dm.n,
						       total, p->pool_kernel / 2,
						       (float)p->pool_kernel, pooled);
	return cudaGetLastError();
}

extern "C" size_t kvt_gpu_snapkv_scratch_bytes(const struct kvt_snapkv *p)
{
	struct sk_plan pl;

	if (sk_plan_make(p, true, &pl) != cudaSuccess)
		return 0;
	return pl.count ? pl.select_bytes : pl.scores_bytes;
}

extern "C" int kvt_gpu_snapkv_select(const struct kvt_snapkv *p, const void *k, const void *q_obs,
				     int32_t *out, void *scratch, size_t scratch_bytes,
				     void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	char *s = (char *)scratch;
	struct sk_plan pl;
	size_t bytes;
	cudaError_t err;

	if (kvt_snapkv_check(p))
		return cudaErrorInvalidValue;
	if (kvt_snapkv_count(p) == 0)
		return cudaSuccess; /* nothing is read, as the reference */
	err = sk_plan_make(p, true, &pl);
	if (err != cudaSuccess)
		return err;
	if (!k || (!q_obs && p->obs_window) || !out || !scratch || (uintptr_t)scratch % SK_ALIGN ||
	    scratch_bytes < pl.select_bytes)
		return cudaErrorInvalidValue;

	err = sk_pooled(p, &pl, k, q_obs, (float *)(s + pl.pooled), s, st);
	if (err != cudaSuccess)
		return err;
	sk_keys<<<sk_grid(pl.items), SK_THREADS, 0, st>>>(
		(const float *)(s + pl.pooled), pl.dm.n, pl.lo, pl.ncand, pl.items,
		(uint64_t *)(s + pl.kin), (int32_t *)(s + pl.vin));
	err = cudaGetLastError();
	if (err != cudaSuccess)
		return err;
	bytes = pl.temp_bytes;
	err = cub::DeviceRadixSort::SortPairs(
		s + pl.temp, bytes, (const uint64_t *)(s + pl.kin), (uint64_t *)(s + pl.kout),
		(const int32_t *)(s + pl.vin), (int32_t *)(s + pl.vout), (int64_t)pl.items, 0,
		pl.end_bit, st);
	if (err != cudaSuccess)
		return err;
	err = cudaMemsetAsync(s + pl.flags, 0, pl.items, st);
	if (err != cudaSuccess)
		return err;
	sk_flag<<<sk_grid((size_t)pl.H * pl.count), SK_THREADS, 0, st>>>(
		(const int32_t *)(s + pl.vout), pl.ncand, pl.count, pl.lo, (size_t)pl.H * pl.count,
		(uint8_t *)(s + pl.flags));
	err = cudaGetLastError();
	if (err != cudaSuccess)
		return err;
	/* every head flags exactly count positions, so head h's land at out[h * count ...],
	   in the ascending order of vin */
	bytes = pl.temp_bytes;
	return cub::DeviceSelect::Flagged(s + pl.temp, bytes, (const int32_t *)(s + pl.vin),
					  (const uint8_t *)(s + pl.flags), out,
					  (int64_t *)(s + pl.nsel), (int64_t)pl.items, st);
}

extern "C" int kvt_gpu_snapkv_scores(const struct kvt_snapkv *p, const void *k, const void *q_obs,
				     float *pooled, void *scratch, size_t scratch_bytes,
				     void *stream)
{
	struct sk_plan pl;
	cudaError_t err;

	err = sk_plan_make(p, false, &pl);
	if (err != cudaSuccess)
		return err;
	if (pl.dm.n == 0)
		return cudaSuccess;
	if (!k || (!q_obs && p->obs_window) || !pooled || !scratch ||
	    (uintptr_t)scratch % SK_ALIGN || scratch_bytes < pl.scores_bytes)
		return cudaErrorInvalidValue;
	return sk_pooled(p, &pl, k, q_obs, pooled, (char *)scratch, (cudaStream_t)stream);
}
