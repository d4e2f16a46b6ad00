/* SPDX-License-Identifier: MIT */
/*
 * Block metadata for recall on the GPU: kvt_gpu_block_meta writes, for every block of every head
 * of a prefilled layer, what kvt_meta_build (policy/recall.c) writes for the block's rows, bit
 * for bit.
 *
 * One thread per (block, head, channel) walks the block's rows in order with the reference's
 * rule: start from the first row, replace the minimum when a row is strictly lower and the
 * maximum when strictly higher. Everything stays in the dtype's bit patterns, so nothing is
 * rounded or canonicalised: f32 compares with IEEE semantics done on integers (NaN unordered,
 * -0 == +0; immune to flush-to-zero build flags), f16/bf16 on the reference's order-preserving
 * 16-bit key, which orders NaN patterns beyond the infinities and -0 below +0 exactly as
 * kvt_meta_add does. Consecutive threads take consecutive channels, so the row reads and the
 * metadata writes are coalesced.
 *
 * kvt_gpu_meta_fold is the decode step's part: each sequence's new key row folded into the
 * metadata of the block it goes to, kvt_meta_init or kvt_meta_add per kv head, one thread per
 * (sequence, head, channel) with the same comparisons. A channel's min and max are written
 * only when they change, so an add that changes nothing writes nothing.
 */
#include <stdint.h>

#include <cuda_runtime.h>

#include "gpu.h"

#define META_THREADS 256
#define META_GRID_MAX 65536u

/* Order-preserving key of an IEEE sign-magnitude pattern, as recall.c's ord16. */
static __device__ __forceinline__ uint32_t meta_ord32(uint32_t u)
{
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ uint16_t meta_ord16(uint16_t u)
{
	return (u & 0x8000u) ? (uint16_t)~u : (uint16_t)(u | 0x8000u);
}

/* The f32 x < y of the reference on bit patterns: false when either is NaN, false for -0 < +0. */
static __device__ __forceinline__ bool meta_lt32(uint32_t x, uint32_t y)
{
	uint32_t ax = x & 0x7fffffffu, ay = y & 0x7fffffffu;

	if (ax > 0x7f800000u || ay > 0x7f800000u)
		return false;
	if ((ax | ay) == 0)
		return false;
	return meta_ord32(x) < meta_ord32(y);
}

static __device__ __forceinline__ bool meta_lt(uint32_t x, uint32_t y)
{
	return meta_lt32(x, y);
}

static __device__ __forceinline__ bool meta_lt(uint16_t x, uint16_t y)
{
	return meta_ord16(x) < meta_ord16(y);
}

/* U: uint32_t for f32, uint16_t for f16 and bf16. total = nb * H * D threads' work; entry
   i = (b * H + h) * D + d. */
template <typename U>
static __global__ void __launch_bounds__(META_THREADS)
	meta_kernel(const U *__restrict__ k, uint32_t D, uint32_t H, uint32_t L, uint32_t bt,
		    size_t total, U *__restrict__ meta)
{
	for (size_t i = blockIdx.x * (size_t)META_THREADS + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * META_THREADS) {
		size_t d = i % D, bh = i / D;
		size_t h = bh % H, b = bh / H;
		size_t r0 = b * bt, r1 = r0 + bt < L ? r0 + bt : L;
		const U *x = k + (h * L + r0) * D + d;
		U mn = *x, mx = mn;

		for (size_t r = r0 + 1; r < r1; r++) {
			U v;

			x += D;
			v = *x;
			if (meta_lt(v, mn))
				mn = v;
			if (meta_lt(mx, v))
				mx = v;
		}
		meta[bh * 2 * D + d] = mn;
		meta[(bh * 2 + 1) * D + d] = mx;
	}
}

extern "C" int kvt_gpu_block_meta(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
				  uint32_t L, uint32_t block_tokens, const void *k, void *meta,
				  void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	int ok = kvt_gpu_block_meta_args(dt, head_dim, n_heads, L, block_tokens, k, meta);
	size_t nb, total, blocks;
	unsigned int grid;

	if (ok <= 0)
		return ok ? cudaErrorInvalidValue : cudaSuccess;
	nb = ((size_t)L + block_tokens - 1) / block_tokens;
	total = nb * n_heads * head_dim;
	blocks = (total + META_THREADS - 1) / META_THREADS;
	grid = blocks < META_GRID_MAX ? (unsigned int)blocks : META_GRID_MAX;
	if (dt == KVT_DTYPE_F32)
		meta_kernel<uint32_t><<<grid, META_THREADS, 0, st>>>((const uint32_t *)k, head_dim,
								     n_heads, L, block_tokens,
								     total, (uint32_t *)meta);
	else
		meta_kernel<uint16_t><<<grid, META_THREADS, 0, st>>>((const uint16_t *)k, head_dim,
								     n_heads, L, block_tokens,
								     total, (uint16_t *)meta);
	return cudaGetLastError();
}

/* total = n * H * D threads' work; entry i = (s * H + h) * D + d: sequence s's key element
   k[i] folded into channel d of head h of the entry at meta[s] (bit 0: init; 0: none). */
template <typename U>
static __global__ void __launch_bounds__(META_THREADS)
	fold_kernel(const U *__restrict__ k, const uint64_t *__restrict__ meta, uint32_t D,
		    uint32_t H, size_t total)
{
	for (size_t i = blockIdx.x * (size_t)META_THREADS + threadIdx.x; i < total;
	     i += (size_t)gridDim.x * META_THREADS) {
		size_t d = i % D, sh = i / D;
		size_t h = sh % H, s = sh / H;
		uint64_t at = meta[s];
		U v, *mn, *mx;

		if (at == 0)
			continue;
		v = k[i];
		mn = (U *)(uintptr_t)(at & ~(uint64_t)1) + h * 2 * D + d;
		mx = mn + D;
		if (at & 1) {
			*mn = v;
			*mx = v;
			continue;
		}
		if (meta_lt(v, *mn))
			*mn = v;
		if (meta_lt(*mx, v))
			*mx = v;
	}
}

extern "C" int kvt_gpu_meta_fold(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t n,
				 const void *k, const uint64_t *meta, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	int ok = kvt_gpu_meta_fold_args(dt, head_dim, n_heads, n, k, meta);
	size_t total, blocks;
	unsigned int grid;

	if (ok <= 0)
		return ok ? cudaErrorInvalidValue : cudaSuccess;
	total = (size_t)n * n_heads * head_dim;
	blocks = (total + META_THREADS - 1) / META_THREADS;
	grid = blocks < META_GRID_MAX ? (unsigned int)blocks : META_GRID_MAX;
	if (dt == KVT_DTYPE_F32)
		fold_kernel<uint32_t><<<grid, META_THREADS, 0, st>>>((const uint32_t *)k, meta,
								     head_dim, n_heads, total);
	else
		fold_kernel<uint16_t><<<grid, META_THREADS, 0, st>>>((const uint16_t *)k, meta,
								     head_dim, n_heads, total);
	return cudaGetLastError();
}
