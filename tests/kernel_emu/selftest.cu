/* SPDX-License-Identifier: MIT */
/*
 * Kernels for the emulator's own checks (test_kernel_emu.c, test_emulator): a correct
 * reduction, a correct use of the warp votes and atomics, and four kernels that would hang or
 * misbehave on a GPU, which the emulator must fail. CUDA source, rewritten by cu2cc.py like the
 * backend's kernels.
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

/* out[t] for each thread t: the ballot of odd lanes, the lanes sharing t's value of t / 4 % 3
   (after a __syncwarp), and the old value of an atomicAdd on a shared counter; out[64] is the
   counter's total. */
static __global__ void vote_kernel(unsigned int *out)
{
	__shared__ unsigned int count;
	unsigned int t = threadIdx.x, odd, same, old;

	if (t == 0)
		count = 0;
	__syncthreads();
	odd = __ballot_sync(FULL, t % 2);
	__syncwarp();
	same = __match_any_sync(FULL, t / 4 % 3);
	old = atomicAdd(&count, t + 1);
	out[3 * t] = odd;
	out[3 * t + 1] = same;
	out[3 * t + 2] = old;
	__syncthreads();
	if (t == 0)
		out[3 * blockDim.x] = count;
}

/* Lanes 0-15 at a ballot, lanes 16-31 at a shuffle. */
static __global__ void mixed_vote_kernel(int *out)
{
	int v = (int)threadIdx.x;

	if (threadIdx.x < 16)
		out[threadIdx.x] = (int)__ballot_sync(FULL, v);
	else
		out[threadIdx.x] = __shfl_xor_sync(FULL, v, 1);
}

extern "C" int kemu_selftest_vote(unsigned int threads, unsigned int *out)
{
	vote_kernel<<<1, threads>>>(out);
	return (int)cudaGetLastError();
}

extern "C" int kemu_selftest_mixed_vote(void)
{
	static int out[32];

	mixed_vote_kernel<<<1, 32>>>(out);
	return (int)cudaGetLastError();
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
