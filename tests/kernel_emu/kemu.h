/* SPDX-License-Identifier: MIT */
/*
 * The CPU kernel emulator (tests/kernel_emu), its C++ face: what a .cu file of the CUDA backend
 * needs from nvcc and the CUDA headers to compile with g++ and run on the CPU. The shim headers
 * cuda_runtime.h, cuda_fp16.h and cub/cub.cuh include this; cu2cc.py turns each launch into
 * kemu::launch(grid, block, shmem, stream).run(kernel, args...).
 *
 * The execution model: a launch runs its CTAs one after the other; the threads of a CTA are
 * fibers (kemu.cc) that run until they finish or reach __syncthreads() or a warp shuffle or
 * vote (__ballot_sync, __match_any_sync, __syncwarp), where they wait until the whole CTA
 * (resp. warp) is there. A CTA whose live threads cannot all meet fails the launch
 * (cudaErrorLaunchFailure) instead of hanging: a __syncthreads() some threads skip or left by
 * return, a shuffle a lane of the warp is absent from, a mask that is not the warp's full one.
 * __shared__ variables are function statics, shared by the CTA's fibers (the CTAs do not
 * overlap). Device memory is host memory, so ASan sees every kernel access. Atomics are plain
 * read-modify-writes: a fiber runs alone until it waits.
 */
#ifndef KEMU_H
#define KEMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "kemu_api.h"

/* ---- the CUDA C++ dialect ---------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static

enum cudaError {
	cudaSuccess = KEMU_SUCCESS,
	cudaErrorInvalidValue = KEMU_ERR_INVALID_VALUE,
	cudaErrorInvalidConfiguration = KEMU_ERR_INVALID_CONFIGURATION,
	cudaErrorLaunchFailure = KEMU_ERR_LAUNCH_FAILURE,
};
typedef enum cudaError cudaError_t;
typedef struct kemu_stream *cudaStream_t;

struct uint3 {
	unsigned int x, y, z;
};
struct alignas(16) uint4 {
	unsigned int x, y, z, w;
};
struct dim3 {
	unsigned int x, y, z;
	constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
	    : x(vx), y(vy), z(vz)
	{
	}
};

namespace kemu
{

/* The calling fiber's coordinates, set by the scheduler before it runs a fiber. */
struct coords {
	uint3 tid, bid;
	dim3 bdim, gdim;
};
extern coords cur; /* valid while a launch runs (one at a time) */

/* Waits for every thread of the CTA (__syncthreads). */
void sync_cta();
/* Exchanges v with the lanes of the warp: returns lane src's value, where src is lane ^ arg for
   xor shuffles and arg otherwise (both modulo width). */
uint64_t shuffle(unsigned int mask, uint64_t v, unsigned int arg, int width, bool xor_lanes);

/* The warp votes: like a shuffle, a point where the whole warp meets with the warp's full mask.
   Ballot: bit l of the result is lane l's v != 0; match: the lanes whose v equals the caller's;
   sync: nothing (__syncwarp). */
enum vote_op { VOTE_BALLOT = 1, VOTE_MATCH = 2, VOTE_SYNC = 3 };
unsigned int vote(unsigned int mask, uint64_t v, enum vote_op op);

/* Runs fn(closure) once per thread of every CTA of grid; the launch's cudaError_t. */
cudaError_t run_grid(dim3 grid, dim3 block, size_t shmem, cudaStream_t stream, void (*fn)(void *),
		     void *closure);

template <typename T> static inline uint64_t bits_of(T v)
{
	static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a value over 8 bytes");
	uint64_t u = 0;

	memcpy(&u, &v, sizeof(v));
	return u;
}

template <typename T> static inline T of_bits(uint64_t u)
{
	T v;

	memcpy(&v, &u, sizeof(v));
	return v;
}

struct launch {
	dim3 grid, block;
	size_t shmem;
	cudaStream_t stream; /* the launch runs now: stream order holds trivially */

	launch(dim3 g, dim3 b, size_t sh = 0, cudaStream_t st = nullptr)
	    : grid(g), block(b), shmem(sh), stream(st)
	{
	}

	/* Like a CUDA launch, the arguments are converted to the kernel's parameter types once
	   and every thread gets its own copies (the kernel takes them by value). */
	template <typename... P, typename... A> cudaError_t run(void (*kernel)(P...), A &&...a)
	{
		struct closure {
			void (*kernel)(P...);
			std::tuple<std::decay_t<P>...> args;
		} c{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(a)...)};

		return run_grid(
			grid, block, shmem, stream,
			[](void *p) {
				closure *cl = (closure *)p;

				std::apply(cl->kernel, cl->args);
			},
			&c);
	}
};

} /* namespace kemu */

#define threadIdx (kemu::cur.tid)
#define blockIdx (kemu::cur.bid)
#define blockDim (kemu::cur.bdim)
#define gridDim (kemu::cur.gdim)
#define warpSize 32

static inline void __syncthreads(void)
{
	kemu::sync_cta();
}

template <typename T>
static inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32)
{
	return kemu::of_bits<T>(
		kemu::shuffle(mask, kemu::bits_of(v), (unsigned int)lane_mask, width, true));
}

template <typename T>
static inline T __shfl_sync(unsigned int mask, T v, int src_lane, int width = 32)
{
	return kemu::of_bits<T>(
		kemu::shuffle(mask, kemu::bits_of(v), (unsigned int)src_lane, width, false));
}

static inline unsigned int __ballot_sync(unsigned int mask, int pred)
{
	return kemu::vote(mask, pred != 0, kemu::VOTE_BALLOT);
}

template <typename T> static inline unsigned int __match_any_sync(unsigned int mask, T v)
{
	return kemu::vote(mask, kemu::bits_of(v), kemu::VOTE_MATCH);
}

static inline void __syncwarp(unsigned int mask = 0xffffffffu)
{
	kemu::vote(mask, 0, kemu::VOTE_SYNC);
}

static inline int __popc(unsigned int x)
{
	return __builtin_popcount(x);
}

/* Atomics: a fiber runs alone until it waits, so a plain read-modify-write is atomic here. */
template <typename T> static inline T atomicAdd(T *p, T v)
{
	T old = *p;

	*p = old + v;
	return old;
}

template <typename T> static inline T atomicSub(T *p, T v)
{
	T old = *p;

	*p = old - v;
	return old;
}

template <typename T> static inline T atomicExch(T *p, T v)
{
	T old = *p;

	*p = v;
	return old;
}

template <typename T> static inline T atomicOr(T *p, T v)
{
	T old = *p;

	*p = old | v;
	return old;
}

static inline float __uint_as_float(unsigned int u)
{
	return kemu::of_bits<float>(u);
}

static inline unsigned int __float_as_uint(float f)
{
	return (unsigned int)kemu::bits_of(f);
}

/* f32 add and multiply rounded once each, never fused: the emulator is built with
   -ffp-contract=off, so the host's own operations are exactly these. */
static inline float __fadd_rn(float a, float b)
{
	return a + b;
}

static inline float __fmul_rn(float a, float b)
{
	return a * b;
}

/* CUDA's integer min/max overloads that the kernels use. */
static inline unsigned int min(unsigned int a, unsigned int b)
{
	return a < b ? a : b;
}

static inline unsigned int max(unsigned int a, unsigned int b)
{
	return a > b ? a : b;
}

/* ---- the runtime API the launch wrappers call ------------------------------------------- */

/* cudaGetLastError and cudaPeekAtLastError: kemu.cc (the launches' errors); the rest: the
   runtime the emulator is linked with (kemu_rt.cc, or the fake runtime through kemu_fake.c). */
extern "C" {
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream);
}

#endif /* KEMU_H */
