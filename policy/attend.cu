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
