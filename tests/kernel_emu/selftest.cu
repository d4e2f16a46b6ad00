/* SPDX-License-Identifier: MIT */
/*
 * Kernels for the emulator's own checks (test_kernel_emu.c, test_emulator): one correct
 * reduction and three kernels that would hang or misbehave on a GPU, which the emulator must
 * fail. CUDA source, rewritten by cu2cc.py like the backend's kernels.
 */
#include <cuda_runtime.h>

#include "selftest.h"

#define FULL 0xffffffffu

static __global__ void reduce_kernel(float *sum)
{
	__shared__ float part[32];
	float v = (float)threadIdx.x;

	for (int o = 16; o > 0; o /= 2)
		v += __shfl_xor_sync(FULL, v, o);
	if (threadIdx.x % 32 == 0)
		part[threadIdx.x / 32] = v;
	__syncthreads();
	v = 0.0f;
	if (threadIdx.x % 32 == 0) /* lane 0 of every warp sums the parts; the rest take its sum */
		for (unsigned int w = 0; w < (blockDim.x + 31) / 32; w++)
			v += part[w];
	v = __shfl_sync(FULL, v, 0);
	if (threadIdx.x == blockDim.x - 1)
		*sum = v;
}

static __global__ void divergent_sync_kernel(int *out)
{
	if (threadIdx.x < 16)
		__syncthreads();
	out[threadIdx.x] = 1;
}

static __global__ void early_return_kernel(int *out)
{
	if (threadIdx.x == 5)
		return;
	__syncthreads();
	out[threadIdx.x] = 1;
}

static __global__ void partial_shuffle_kernel(int *out)
{
	int v = (int)threadIdx.x;

	if (threadIdx.x == 3)
		return;
	out[threadIdx.x] = __shfl_xor_sync(FULL, v, 1);
}

extern "C" int kemu_selftest_reduce(unsigned int threads, float *sum)
{
	reduce_kernel<<<1, threads>>>(sum);
	return (int)cudaGetLastError();
}

extern "C" int kemu_selftest_divergent_sync(void)
{
	static int out[64];

	divergent_sync_kernel<<<1, 64>>>(out);
	return (int)cudaGetLastError();
}

extern "C" int kemu_selftest_early_return(void)
{
	static int out[64];

	early_return_kernel<<<1, 64>>>(out);
	return (int)cudaGetLastError();
}

extern "C" int kemu_selftest_partial_shuffle(void)
{
	static int out[32];

	partial_shuffle_kernel<<<1, 32>>>(out);
	return (int)cudaGetLastError();
}
