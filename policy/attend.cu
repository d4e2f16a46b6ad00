/* SPDX-License-Identifier: MIT */
/*
 * Reference decode attention on the GPU: kvt_gpu_attend computes, for every kv head at once,
 * what kvt_attend_rows (policy/attend.c) computes for one, within f32 tolerance.
 *
 * One CTA per (kv head, query head of its group). Like the reference it makes two passes over
 * the head's rows, so the softmax is exactly max-subtracted rather than rescaled on the fly: the
 * first finds the max logit, the second sums exp(logit - max) and the weighted values. Logits
 * come from one warp per row (lanes split head_dim, so key reads are coalesced, then a shuffle
 * sum); the second pass stages AT_CHUNK weights in shared memory and each thread accumulates its
 * own channels of out. The accumulator is out itself, so any head_dim works without scratch or
 * dynamic shared memory; each channel is only ever touched by one thread.
 */
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "attn_row.h"
#include "dtype.cuh"
#include "gpu.h"

#define AT_THREADS 256
#define AT_WARPS (AT_THREADS / 32)
#define AT_CHUNK 32 /* rows whose weights are staged at once */
#define AT_FULL 0xffffffffu

static __device__ __forceinline__ const void *at_row(const void *base, size_t stride, uint64_t i)
{
	return (const char *)base + i * stride;
}

/* q . row / norm by the whole warp; every lane gets lane 0's value, so every warp computing the
   same row gets the same bits (pass 1's max is then exactly one of pass 2's logits). */
template <typename T>
static __device__ __forceinline__ float at_logit(const float *__restrict__ q, const void *row,
						 uint32_t D, float norm, uint32_t lane)
{
	const T *r = (const T *)row;
	float acc = 0.0f;

	for (size_t d = lane; d < D; d += 32)
		acc = fmaf(q[d], kvt_load(r + d), acc);
#pragma unroll
	for (int o = 16; o > 0; o /= 2)
		acc += __shfl_xor_sync(AT_FULL, acc, o);
	return __shfl_sync(AT_FULL, acc, 0) / norm;
}

/* Grid: n_heads * g_count CTAs; CTA x serves query head x of q/out, kv head x / g_count. Every
   loop bound below is read from the same memory by all threads, so the trip counts around
   __syncthreads() are uniform. */
template <typename T>
static __global__ void __launch_bounds__(AT_THREADS, 2)
	at_kernel(uint32_t D, uint32_t g_count, const struct kvt_attend_rows *__restrict__ seg,
		  const uint32_t *__restrict__ seg_off, const float *__restrict__ q,
		  float *__restrict__ out, float norm)
{
	__shared__ float wmax[AT_WARPS];
	__shared__ float w[AT_CHUNK];
	const uint32_t h = blockIdx.x / g_count;
	const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const float *qg = q + (size_t)blockIdx.x * D;
	float *og = out + (size_t)blockIdx.x * D;
	const uint32_t s0 = seg_off[h], s1 = seg_off[h + 1];
	uint64_t rows = 0;
	float m = -INFINITY, sum = 0.0f;

	for (uint32_t s = s0; s < s1; s++)
		rows += seg[s].n;
	for (size_t d = threadIdx.x; d < D; d += AT_THREADS)
		og[d] = 0.0f;
	if (rows == 0)
		return; /* zeros, as the reference */

	/* pass 1: the max logit (fmaxf skips NaN, as the reference's l > m does) */
	for (uint32_t s = s0; s < s1; s++) {
		const void *kb = seg[s].k;
		size_t ks = seg[s].k_stride;
		uint32_t n = seg[s].n;

		for (uint64_t i = warp; i < n; i += AT_WARPS)
			m = fmaxf(m, at_logit<T>(qg, at_row(kb, ks, i), D, norm, lane));
	}
	if (lane == 0)
		wmax[warp] = m;
	__syncthreads();
	m = wmax[0];
	for (int i = 1; i < AT_WARPS; i++)
		m = fmaxf(m, wmax[i]);

	/* pass 2: weights of AT_CHUNK rows at a time, then every thread folds them into its own
	   channels in row order */
	for (uint32_t s = s0; s < s1; s++) {
		const void *kb = seg[s].k, *vb = seg[s].v;
		size_t ks = seg[s].k_stride, vs = seg[s].v_stride;
		uint32_t n = seg[s].n;

		for (uint64_t i0 = 0; i0 < n; i0 += AT_CHUNK) {
			uint32_t cn = n - i0 < AT_CHUNK ? (uint32_t)(n - i0) : AT_CHUNK;

			for (uint32_t c = warp; c < cn; c += AT_WARPS) {
				float l = at_logit<T>(qg, at_row(kb, ks, i0 + c), D, norm, lane);

				if (lane == 0)
					w[c] = expf(l - m);
			}
			__syncthreads();
			for (uint32_t c = 0; c < cn; c++)
				sum += w[c];
			for (size_t d = threadIdx.x; d < D; d += AT_THREADS) {
				float acc = og[d];

				for (uint32_t c = 0; c < cn; c++)
					acc = fmaf(w[c],
						   kvt_load((const T *)at_row(vb, vs, i0 + c) + d),
						   acc);
				og[d] = acc;
			}
			__syncthreads(); /* w is rewritten by the next chunk */
		}
	}
	for (size_t d = threadIdx.x; d < D; d += AT_THREADS)
		og[d] = og[d] / sum;
}

extern "C" int kvt_gpu_attend(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
			      uint32_t g_count, const struct kvt_attend_rows *seg,
			      const uint32_t *seg_off, const float *q, float *out, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	uint64_t ctas = (uint64_t)n_heads * g_count;
	float norm = sqrtf((float)head_dim);

	if (!kvt_dtype_size(dt))
		return cudaErrorInvalidValue;
	if (ctas == 0 || head_dim == 0)
		return cudaSuccess; /* out has no element */
	if (ctas > INT32_MAX || !seg_off || !q || !out)
		return cudaErrorInvalidValue;
	switch (dt) {
	case KVT_DTYPE_F32:
		at_kernel<float><<<(unsigned int)ctas, AT_THREADS, 0, st>>>(head_dim, g_count, seg,
									    seg_off, q, out, norm);
		break;
	case KVT_DTYPE_F16:
		at_kernel<kvt_f16><<<(unsigned int)ctas, AT_THREADS, 0, st>>>(
			head_dim, g_count, seg, seg_off, q, out, norm);
		break;
	case KVT_DTYPE_BF16:
		at_kernel<kvt_bf16><<<(unsigned int)ctas, AT_THREADS, 0, st>>>(
			head_dim, g_count, seg, seg_off, q, out, norm);
		break;
	}
	return cudaGetLastError();
}

/* ---- batched decode attention over the attention tables (kvt_gpu_attend_batch) ---------- */

#define AB_THREADS 128
#define AB_WARPS (AB_THREADS / 32)
#define AB_CHUNK 32 /* tokens whose weights are staged at once */

/* q . K row / norm by the whole warp, q of dtype T; every lane gets lane 0's value. */
template <typename T>
static __device__ __forceinline__ float ab_logit(const T *__restrict__ q, uint64_t row, uint32_t D,
						 float norm, uint32_t lane)
{
	const T *k = (const T *)(uintptr_t)row;
	float acc = 0.0f;

	for (uint32_t x = lane; x < D; x += 32)
		acc = fmaf(kvt_load(q + x), kvt_load(k + x), acc);
#pragma unroll
	for (int o = 16; o > 0; o /= 2)
		acc += __shfl_xor_sync(AT_FULL, acc, o);
	return __shfl_sync(AT_FULL, acc, 0) / norm;
}

/* Grid (rows * splits, query-head parts): CTA (r * splits + sp, y) takes part sp of row r's
   tokens for query heads y * KVT_ATT_G .. of the row's group. Two passes, as at_kernel: the
   part's max logit per head, then its weights AB_CHUNK tokens at a time and each thread's
   channels of the weighted sum, accumulated in the part's scratch. Every loop bound around
   __syncthreads() is the same for all threads. */
template <typename T>
static __global__ void __launch_bounds__(AB_THREADS)
	ab_part(struct kvt_attn_desc d, const T *__restrict__ q, float *__restrict__ scratch,
		uint32_t splits, float norm)
{
	__shared__ float wmax[AB_WARPS][KVT_ATT_G];
	__shared__ float w[KVT_ATT_G][AB_CHUNK];
	__shared__ uint64_t vrow[AB_CHUNK];
	const uint32_t r = blockIdx.x / splits, sp = blockIdx.x % splits;
	const uint32_t G = d.g_count, D = d.head_dim, g0 = blockIdx.y * KVT_ATT_G;
	const uint32_t gc = G - g0 < KVT_ATT_G ? G - g0 : KVT_ATT_G;
	const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const uint64_t total = kvt_attn_count(&d, r);
	const uint64_t per = (total + splits - 1) / splits;
	const uint64_t t0 = sp * per < total ? sp * per : total;
	const uint64_t t1 = t0 + per < total ? t0 + per : total;
	/* query heads of the row: member r / H, heads (r % H) * G + g0 .. */
	const T *qr = q + ((size_t)(r / d.n_kv_heads) * d.n_kv_heads * G +
			   (size_t)(r % d.n_kv_heads) * G + g0) *
				  D;
	float m[KVT_ATT_G], sum[KVT_ATT_G];
	size_t part = ((size_t)r * splits + sp) * G + g0;
	float *ml = scratch + part * 2;
	float *acc = scratch + (size_t)gridDim.x * G * 2 + part * D;

	if (kvt_attn_padding(&d, r))
		return; /* the same for the whole CTA: merge skips the row */
	for (uint32_t g = 0; g < KVT_ATT_G; g++)
		m[g] = -INFINITY, sum[g] = 0.0f;
	for (uint32_t g = 0; g < gc; g++)
		for (uint32_t x = threadIdx.x; x < D; x += AB_THREADS)
			acc[(size_t)g * D + x] = 0.0f;

	/* pass 1: the part's max logit of each head */
	for (uint64_t t = t0 + warp; t < t1; t += AB_WARPS) {
		uint64_t a = kvt_attn_row(&d, r, t);

		if (!a)
			continue;
		for (uint32_t g = 0; g < gc; g++)
			m[g] = fmaxf(m[g], ab_logit<T>(qr + (size_t)g * D, a, D, norm, lane));
	}
	if (lane == 0)
		for (uint32_t g = 0; g < gc; g++)
			wmax[warp][g] = m[g];
	__syncthreads();
	for (uint32_t g = 0; g < gc; g++) {
		m[g] = wmax[0][g];
		for (uint32_t x = 1; x < AB_WARPS; x++)
			m[g] = fmaxf(m[g], wmax[x][g]);
	}

	/* pass 2: weights of AB_CHUNK tokens, then every thread folds them into its channels */
	for (uint64_t c0 = t0; c0 < t1; c0 += AB_CHUNK) {
		uint32_t cn = t1 - c0 < AB_CHUNK ? (uint32_t)(t1 - c0) : AB_CHUNK;

		for (uint32_t c = warp; c < cn; c += AB_WARPS) {
			uint64_t a = kvt_attn_row(&d, r, c0 + c);

			for (uint32_t g = 0; g < gc; g++) {
				float l = a ? ab_logit<T>(qr + (size_t)g * D, a, D, norm, lane)
					    : 0.0f;

				if (lane == 0)
					w[g][c] = a ? expf(l - m[g]) : 0.0f;
			}
			if (lane == 0)
				vrow[c] = a ? a + d.v_offset : 0;
		}
		__syncthreads();
		for (uint32_t g = 0; g < gc; g++) {
			for (uint32_t c = 0; c < cn; c++)
				sum[g] += w[g][c];
			for (uint32_t x = threadIdx.x; x < D; x += AB_THREADS) {
				float v = acc[(size_t)g * D + x];

				for (uint32_t c = 0; c < cn; c++)
					if (vrow[c])
						v = fmaf(
							w[g][c],
							kvt_load((const T *)(uintptr_t)vrow[c] + x),
							v);
				acc[(size_t)g * D + x] = v;
			}
		}
		__syncthreads(); /* w and vrow are rewritten by the next chunk */
	}
	if (threadIdx.x == 0)
		for (uint32_t g = 0; g < gc; g++) {
			ml[2 * g] = m[g];
			ml[2 * g + 1] = sum[g];
		}
}

/* ---- the same parts, single pass with 16-byte loads (af_part) ---------------------------- */

/* af_part computes what ab_part computes, the part's max logit, sum of weights and weighted
   values per query head (the same scratch, merged by the same ab_merge), in one pass that reads
   each K and V row once, 16 bytes per lane, several rows in flight per warp. (ab_part's two
   passes, one row per warp at a time and one element per lane, reached 0.05 of an H200's copy
   bandwidth; see bench/RESULTS.md.)

   A row of D elements is LPR = D * sizeof(T) / 16 lanes (a power of two up to 32), so a warp
   holds TPW = 32 / LPR tokens at once, AF_UNROLL times over. Each lane group (LPR lanes, one
   token) keeps per query head a running max, sum and weighted values of its EPL channels, the
   online softmax of flash-decoding: the logits of AF_UNROLL steps, then one rescale to their
   max, then their weights. Logits are in base 2 (q is scaled by log2(e) / sqrt(D) once, so
   each weight is one exp2f) and the max is stored in base e, as ab_part's. Rows are found by
   kvt_attn_row_p2 (32-bit, no division). The lane groups of a warp, then the warps of the CTA
   (in shared memory), are merged the same way. af_fits says when the tables allow all this
   (aligned pool, blocks and rows, power-of-two blocks); otherwise ab_part runs. */
#define AF_WARPS 4
#define AF_THREADS (AF_WARPS * 32)
/* Token steps each warp has in flight: 2 measured best on an H200 (2026-12-04: 0.34 of the copy
   bandwidth at 32 sequences, against 0.27 with 4, 0.22 with 8, 0.29 with 1; 2 or 1 warps per
   CTA no better), 128 registers a thread, 4 CTAs an SM. */
#define AF_UNROLL 2
#define AF_MAX_D (512 / sizeof(kvt_f16)) /* channels of the widest row (512 bytes) */

/* The EPL = 16 / sizeof(T) elements of a 16-byte load, as f32 (exactly as kvt_load). */
static __device__ __forceinline__ void af_unpack(const uint4 &v, float *f, const float *)
{
	f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y);
	f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
}

template <typename T>
static __device__ __forceinline__ void af_unpack(const uint4 &v, float *f, const T *)
{
	const uint32_t w[4] = {v.x, v.y, v.z, v.w};

#pragma unroll
	for (int i = 0; i < 4; i++) {
		T lo = {(uint16_t)(w[i] & 0xffffu)}, hi = {(uint16_t)(w[i] >> 16)};

		f[2 * i] = kvt_load(&lo), f[2 * i + 1] = kvt_load(&hi);
	}
}

/* Folds (m2, s2, a2) into the running (m, s, a) of one query head: both rescaled to the larger
   max (base-2 logits). A state with max -inf holds nothing (its sum and values are 0). */
template <int EPL>
static __device__ __forceinline__ void af_fold(float &m, float &s, float *a, float m2, float s2,
					       const float *a2)
{
	float M = fmaxf(m, m2), x, y;

	if (M == -INFINITY)
		return;
	x = exp2f(m - M), y = exp2f(m2 - M);
	s = s * x + s2 * y;
#pragma unroll
	for (int e = 0; e < EPL; e++)
		a[e] = a[e] * x + a2[e] * y;
	m = M;
}

/* Grid and scratch as ab_part's; GC >= the CTA's query heads (gc), a power of two up to
   KVT_ATT_G, so that q and the accumulators stay in registers. */
template <typename T, int GC>
static __global__ void __launch_bounds__(AF_THREADS)
	af_part(struct kvt_attn_desc d, const T *__restrict__ q, float *__restrict__ scratch,
		uint32_t splits, float norm)
{
	constexpr int EPL = 16 / sizeof(T);
	__shared__ float sm[AF_WARPS][GC], ss[AF_WARPS][GC];
	__shared__ float sa[AF_WARPS][GC][AF_MAX_D];
	const uint32_t r = blockIdx.x / splits, sp = blockIdx.x % splits;
	const uint32_t G = d.g_count, D = d.head_dim, g0 = blockIdx.y * KVT_ATT_G;
	const uint32_t gc = G - g0 < GC ? G - g0 : GC;
	const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
	const uint32_t LPR = D / EPL, TPW = 32 / LPR, sub = lane % LPR, grp = lane / LPR;
	const uint32_t step = AF_WARPS * TPW; /* tokens the CTA takes per step */
	/* below 2^31 (af_fits) */
	const uint32_t total = (uint32_t)kvt_attn_count(&d, r), nt = kvt_attn_resident(&d, r);
	const uint32_t per = (total + splits - 1) / splits;
	const uint32_t t0 = sp * per < total ? sp * per : total;
	const uint32_t t1 = t0 + per < total ? t0 + per : total;
	uint32_t bsh = 0; /* log2 of the block size, a power of two (af_fits) */
	const T *qr = q + ((size_t)(r / d.n_kv_heads) * d.n_kv_heads * G +
			   (size_t)(r % d.n_kv_heads) * G + g0) *
				  D;
	size_t part = ((size_t)r * splits + sp) * G + g0;
	/* q scaled by log2(e) / sqrt(D): the logits come out in base 2, for exp2f */
	const float qs = 1.4426950408889634f / norm;
	float qf[GC][EPL], m[GC], s[GC], a[GC][EPL];

	if (kvt_attn_padding(&d, r))
		return; /* the same for the whole CTA: merge skips the row */
	while ((1u << bsh) < d.block_tokens)
		bsh++;
#pragma unroll
	for (int g = 0; g < GC; g++) {
		m[g] = -INFINITY, s[g] = 0.0f;
#pragma unroll
		for (int e = 0; e < EPL; e++) {
			qf[g][e] = (uint32_t)g < gc
					   ? kvt_load(qr + (size_t)g * D + sub * EPL + e) * qs
					   : 0.0f;
			a[g][e] = 0.0f;
		}
	}

	/* the warp's tokens: t0 + warp * TPW + grp, then every step-th, AF_UNROLL steps at a
	   time: their K and V rows loaded, their logits, one rescale to the steps' max, their
	   weights and values. The loop bound is the warp's (its first lane group's), so every
	   lane meets every shuffle. */
	for (uint32_t base = t0 + warp * TPW; base < t1; base += step * AF_UNROLL) {
		uint4 kv[AF_UNROLL], vv[AF_UNROLL];
		float l[AF_UNROLL][GC];
		bool ok[AF_UNROLL];

#pragma unroll
		for (int u = 0; u < AF_UNROLL; u++) {
			uint32_t t = base + u * step + grp;
			uint64_t row = t < t1 ? kvt_attn_row_p2(&d, r, t, nt, bsh) : 0;

			ok[u] = row != 0;
			kv[u] = vv[u] = uint4{0, 0, 0, 0};
			if (ok[u]) {
				kv[u] = *(const uint4 *)(uintptr_t)(row + 16u * sub);
				vv[u] = *(const uint4 *)(uintptr_t)(row + d.v_offset + 16u * sub);
			}
		}
#pragma unroll
		for (int u = 0; u < AF_UNROLL; u++) {
			float kf[EPL];

			af_unpack(kv[u], kf, (const T *)0);
#pragma unroll
			for (int g = 0; g < GC; g++) {
				float x = 0.0f;

				if ((uint32_t)g >= gc)
					continue; /* gc is the CTA's: uniform */
#pragma unroll
				for (int e = 0; e < EPL; e++)
					x = fmaf(qf[g][e], kf[e], x);
#pragma unroll
				for (uint32_t o = 16; o > 0; o /= 2)
					if (o < LPR) /* the row's lanes */
						x += __shfl_xor_sync(AT_FULL, x, o);
				l[u][g] = ok[u] ? x : -INFINITY;
			}
		}
#pragma unroll
		for (int g = 0; g < GC; g++) {
			float cm = m[g], x;

			if ((uint32_t)g >= gc)
				continue;
#pragma unroll
			for (int u = 0; u < AF_UNROLL; u++)
				cm = fmaxf(cm, l[u][g]); /* skips a NaN logit, as ab_part's max */
			if (cm == -INFINITY || cm == m[g])
				continue;
			x = exp2f(m[g] - cm); /* 0 from -inf */
			s[g] *= x;
#pragma unroll
			for (int e = 0; e < EPL; e++)
				a[g][e] *= x;
			m[g] = cm;
		}
#pragma unroll
		for (int u = 0; u < AF_UNROLL; u++) {
			float vf[EPL];

			af_unpack(vv[u], vf, (const T *)0);
#pragma unroll
			for (int g = 0; g < GC; g++) {
				float p;

				if ((uint32_t)g >= gc || m[g] == -INFINITY)
					continue; /* nothing yet: every logit so far -inf */
				p = exp2f(l[u][g] - m[g]); /* 0 for a skipped row, NaN for NaN */
				s[g] += p;
#pragma unroll
				for (int e = 0; e < EPL; e++)
					a[g][e] = fmaf(p, vf[e], a[g][e]);
			}
		}
	}

	/* the warp's lane groups into its first, then the warps into shared memory */
	for (uint32_t o = LPR; o < 32; o *= 2)
#pragma unroll
		for (int g = 0; g < GC; g++) {
			float a2[EPL], m2 = __shfl_xor_sync(AT_FULL, m[g], o),
				       s2 = __shfl_xor_sync(AT_FULL, s[g], o);

#pragma unroll
			for (int e = 0; e < EPL; e++)
				a2[e] = __shfl_xor_sync(AT_FULL, a[g][e], o);
			af_fold<EPL>(m[g], s[g], a[g], m2, s2, a2);
		}
	if (grp == 0)
#pragma unroll
		for (int g = 0; g < GC; g++) {
			if (sub == 0)
				sm[warp][g] = m[g], ss[warp][g] = s[g];
#pragma unroll
			for (int e = 0; e < EPL; e++)
				sa[warp][g][sub * EPL + e] = a[g][e];
		}
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < gc * D; i += AF_THREADS) {
		uint32_t g = i / D, x = i % D;
		float M = -INFINITY, v = 0.0f;

		for (int w = 0; w < AF_WARPS; w++)
			M = fmaxf(M, sm[w][g]);
		for (int w = 0; w < AF_WARPS; w++)
			if (sm[w][g] != -INFINITY)
				v += sa[w][g][x] * exp2f(sm[w][g] - M);
		scratch[(size_t)gridDim.x * G * 2 + (part + g) * D + x] = v;
	}
	if (threadIdx.x < gc) {
		uint32_t g = threadIdx.x;
		float M = -INFINITY, sum = 0.0f;

		for (int w = 0; w < AF_WARPS; w++)
			M = fmaxf(M, sm[w][g]);
		for (int w = 0; w < AF_WARPS; w++)
			if (sm[w][g] != -INFINITY)
				sum += ss[w][g] * exp2f(sm[w][g] - M);
		scratch[(part + g) * 2] = M * 0.6931471805599453f; /* base e, as ab_part's */
		scratch[(part + g) * 2 + 1] = sum;
	}
}

/* Whether af_part can read d's rows with dtype T: rows of 16 to 512 bytes, a power of two,
   16-byte aligned wherever a row can start; blocks of a power-of-two size up to 64 tokens, and
   row lists shorter than 2^31 tokens. */
template <typename T> static bool af_fits(const struct kvt_attn_desc &d)
{
	uint64_t rb = (uint64_t)d.head_dim * sizeof(T), bt = d.block_tokens;

	return rb >= 16 && rb <= 512 && !(rb & (rb - 1)) && d.row_bytes % 16 == 0 &&
	       d.pool % 16 == 0 && d.block_bytes % 16 == 0 && d.v_offset % 16 == 0 && bt &&
	       bt <= 64 && !(bt & (bt - 1)) &&
	       ((uint64_t)d.max_frames + d.max_recall) * bt <= INT32_MAX;
}

/* Grid rows * G: CTA (r * G + g) merges the splits of row r's query head g by their
   log-sum-exp into out (dtype T) and lse; a padding row's CTAs write nothing. */
template <typename T>
static __global__ void __launch_bounds__(AB_THREADS)
	ab_merge(struct kvt_attn_desc d, const float *__restrict__ scratch, uint32_t splits,
		 uint64_t parts, T *__restrict__ out, float *__restrict__ lse)
{
	const uint32_t G = d.g_count, D = d.head_dim, r = blockIdx.x / G, g = blockIdx.x % G;
	const float *ml = scratch, *acc = scratch + parts * G * 2;
	float M = -INFINITY, L = 0.0f;

	if (kvt_attn_padding(&d, r))
		return;

	for (uint32_t sp = 0; sp < splits; sp++) {
		size_t part = ((size_t)r * splits + sp) * G + g;

		if (ml[2 * part + 1] > 0.0f)
			M = fmaxf(M, ml[2 * part]);
	}
	for (uint32_t sp = 0; sp < splits; sp++) {
		size_t part = ((size_t)r * splits + sp) * G + g;

		if (ml[2 * part + 1] > 0.0f)
			L += ml[2 * part + 1] * expf(ml[2 * part] - M);
	}
	for (uint32_t x = threadIdx.x; x < D; x += AB_THREADS) {
		float v = 0.0f;

		for (uint32_t sp = 0; sp < splits; sp++) {
			size_t part = ((size_t)r * splits + sp) * G + g;

			if (ml[2 * part + 1] > 0.0f)
				v += acc[part * D + x] * expf(ml[2 * part] - M);
		}
		kvt_store(out + (size_t)blockIdx.x * D + x, L > 0.0f ? v / L : 0.0f);
	}
	if (lse && threadIdx.x == 0)
		lse[blockIdx.x] = L > 0.0f ? M + logf(L) : -INFINITY;
}

template <typename T>
static int ab_launch(const struct kvt_attn_desc &d, const void *q, void *out, float *lse,
		     float *scratch, uint32_t splits, cudaStream_t st)
{
	uint64_t rows = (uint64_t)d.n * d.n_kv_heads;
	float norm = sqrtf((float)d.head_dim);
	dim3 grid((unsigned int)(rows * splits), (d.g_count + KVT_ATT_G - 1) / KVT_ATT_G);

	uint32_t gmax = d.g_count < KVT_ATT_G ? d.g_count : KVT_ATT_G;

	if (!af_fits<T>(d))
		ab_part<T><<<grid, AB_THREADS, 0, st>>>(d, (const T *)q, scratch, splits, norm);
	else if (gmax <= 2)
		af_part<T, 2><<<grid, AF_THREADS, 0, st>>>(d, (const T *)q, scratch, splits, norm);
	else if (gmax <= 4)
		af_part<T, 4><<<grid, AF_THREADS, 0, st>>>(d, (const T *)q, scratch, splits, norm);
	else
		af_part<T, 8><<<grid, AF_THREADS, 0, st>>>(d, (const T *)q, scratch, splits, norm);
	ab_merge<T><<<(unsigned int)(rows * d.g_count), AB_THREADS, 0, st>>>(
		d, scratch, splits, rows * splits, (T *)out, lse);
	return cudaGetLastError();
}

extern "C" int kvt_gpu_attend_batch(enum kvt_dtype dt, struct kvt_attn_desc d, const void *q,
				    void *out, float *lse, float *scratch, uint32_t splits,
				    void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	uint64_t rows = (uint64_t)d.n * d.n_kv_heads;

	if (!kvt_dtype_size(dt))
		return cudaErrorInvalidValue;
	if (rows == 0 || d.g_count == 0 || d.head_dim == 0)
		return cudaSuccess; /* out has no element */
	if (!q || !out || !scratch || splits == 0 || splits > 64 || rows * splits > INT32_MAX ||
	    rows * d.g_count > INT32_MAX)
		return cudaErrorInvalidValue;
	switch (dt) {
	case KVT_DTYPE_F32:
		return ab_launch<float>(d, q, out, lse, scratch, splits, st);
	case KVT_DTYPE_F16:
		return ab_launch<kvt_f16>(d, q, out, lse, scratch, splits, st);
	case KVT_DTYPE_BF16:
		return ab_launch<kvt_bf16>(d, q, out, lse, scratch, splits, st);
	}
	return cudaErrorInvalidValue;
}
