/* SPDX-License-Identifier: MIT */
/*
 * FlashH2D: the fused gather kernel (docs/design.md "FlashH2D"), and the ring-write kernel of a
 * decode append. One launch moves every piece of a list, so a recall of thousands of scattered
 * 16 KiB host blocks costs one host call instead of one DMA call per block.
 *
 * Each CTA walks the piece list with a stride of gridDim.x and copies a piece with all its
 * threads; the loads of a piece that lives in mapped pinned host memory travel over PCIe as
 * 16-byte reads, and a few CTAs (16 by default) keep enough of them in flight to fill the link
 * without taking the SMs from the model's kernels.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "gather.h"

/* Copies bytes from s to d with the threads of one CTA, in the widest unit all three allow. */
static __device__ __forceinline__ void cta_copy(uint8_t *d, const uint8_t *s, uint64_t bytes)
{
	uint64_t t = threadIdx.x, step = blockDim.x;

	if (((uintptr_t)d | (uintptr_t)s | bytes) % 16 == 0) {
		const uint4 *s4 = (const uint4 *)s;
		uint4 *d4 = (uint4 *)d;
		uint64_t n = bytes / 16, i = t;

		/* Two loads in flight per thread before the stores: PCIe latency is long. */
		for (; i + step < n; i += 2 * step) {
			uint4 a = s4[i], b = s4[i + step];

			d4[i] = a;
			d4[i + step] = b;
		}
		for (; i < n; i += step)
			d4[i] = s4[i];
	} else if (((uintptr_t)d | (uintptr_t)s | bytes) % 4 == 0) {
		const uint32_t *s1 = (const uint32_t *)s;
		uint32_t *d1 = (uint32_t *)d;

		for (uint64_t i = t; i < bytes / 4; i += step)
			d1[i] = s1[i];
	} else {
		for (uint64_t i = t; i < bytes; i += step)
			d[i] = s[i];
	}
}

static __global__ void gather_kernel(const struct kvt_gpu_piece *pieces, uint32_t n)
{
	for (uint32_t p = blockIdx.x; p < n; p += gridDim.x) {
		struct kvt_gpu_piece pc = pieces[p];

		cta_copy((uint8_t *)(uintptr_t)pc.dst, (const uint8_t *)(uintptr_t)pc.src,
			 pc.bytes);
	}
}

/* One CTA per (sequence, head) row pair at a time: K row then V row. */
static __global__ void append_kernel(const uint8_t *k, const uint8_t *v, uint32_t n,
				     const uint64_t *dev, uint32_t n_heads, uint32_t row_bytes,
				     uint64_t head_stride, uint64_t v_offset)
{
	uint64_t rows = (uint64_t)n * n_heads;

	for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		uint64_t i = r / n_heads, h = r % n_heads;
		uint8_t *d = (uint8_t *)(uintptr_t)(dev[i] + h * head_stride);

		cta_copy(d, k + r * row_bytes, row_bytes);
		cta_copy(d + v_offset, v + r * row_bytes, row_bytes);
	}
}

static uint32_t clamp_ctas(uint32_t ctas, uint64_t work)
{
	if (ctas == 0)
		ctas = KVT_GATHER_CTAS_DEFAULT;
	if (ctas > KVT_GATHER_CTAS_MAX)
		ctas = KVT_GATHER_CTAS_MAX;
	return work < ctas ? (uint32_t)work : ctas;
}

extern "C" int kvt_gather_launch(const struct kvt_gpu_piece *pieces, uint32_t n, uint32_t ctas,
				 void *stream)
{
	if (n == 0)
		return 0;
	gather_kernel<<<clamp_ctas(ctas, n), KVT_GATHER_THREADS, 0, (cudaStream_t)stream>>>(pieces,
											    n);
	return (int)cudaGetLastError();
}

extern "C" int kvt_append_launch(uint64_t k, uint64_t v, uint32_t n, const uint64_t *dev,
				 uint32_t n_heads, uint32_t row_bytes, uint64_t head_stride,
				 uint64_t v_offset, uint32_t ctas, void *stream)
{
	uint64_t rows = (uint64_t)n * n_heads;
	/* A row is 128-512 bytes: a warp or two per row is plenty, and many CTAs hide latency. */
	uint32_t threads = row_bytes >= 16 * 128 ? 128 : 32;

	if (rows == 0)
		return 0;
	append_kernel<<<clamp_ctas(ctas, rows), threads, 0, (cudaStream_t)stream>>>(
		(const uint8_t *)(uintptr_t)k, (const uint8_t *)(uintptr_t)v, n, dev, n_heads,
		row_bytes, head_stride, v_offset);
	return (int)cudaGetLastError();
}
