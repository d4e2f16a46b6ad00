/* SPDX-License-Identifier: MIT */
/*
 * The kernels of kvtier-bench calibrate (calib_kernels.h): an empty one, whose launches time
 * the host's cost of a launch, and one that fills the GEMMs' operands. The GEMMs themselves are
 * cuBLAS's (transfer/cuda_calib.c).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "calib_kernels.h"

/* The argument only keeps the launch in the form every kernel of the plugin has. */
static __global__ void calib_empty(int unused)
{
	(void)unused;
}

/* bf16 bits built from integers alone: a random sign, exponent 120..126 and mantissa, so
   every value is finite and between 2^-7 and 1 in magnitude. */
static __global__ void calib_fill(uint16_t *p, uint64_t n, uint32_t seed)
{
	uint64_t step = (uint64_t)gridDim.x * blockDim.x;

	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
		uint32_t x = (uint32_t)i * 0x9e3779b1u ^ (uint32_t)(i >> 32) ^ seed;

		x ^= x >> 16;
		x *= 0x7feb352du;
		x ^= x >> 15;
		x *= 0x846ca68bu;
		x ^= x >> 16;
		p[i] = (uint16_t)((x & 0x8000u) | ((120u + (x >> 20) % 7u) << 7) | (x & 0x7fu));
	}
}

extern "C" int kvt_calib_empty_launch(void *stream)
{
	calib_empty<<<1, 1, 0, (cudaStream_t)stream>>>(0);
	return (int)cudaGetLastError();
}

extern "C" int kvt_calib_fill_launch(void *dst, uint64_t n, uint32_t seed, void *stream)
{
	uint64_t blocks = (n + 255) / 256;
	unsigned int grid = blocks < 4096 ? (unsigned int)blocks : 4096u;

	if (n == 0)
		return 0;
	calib_fill<<<grid, 256, 0, (cudaStream_t)stream>>>((uint16_t *)dst, n, seed);
	return (int)cudaGetLastError();
}
