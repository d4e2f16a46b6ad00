/* SPDX-License-Identifier: MIT */
/*
 * Element loads and stores of the GPU policy kernels (policy/snapkv.cu, attend.cu): f16 and bf16
 * carried as tag types of their bits, so one kernel template serves every dtype, each load
 * exact as kvt_to_f32 (every binary16 and bfloat16 value is an f32 value), each store rounded
 * as kvt_from_f32.
 */
#ifndef KVT_DTYPE_CUH
#define KVT_DTYPE_CUH

#include <stdint.h>

#include <cuda_fp16.h>

#include "dtype_bits.h"

struct kvt_f16 {
	uint16_t bits;
};
struct kvt_bf16 {
	uint16_t bits;
};

static __device__ __forceinline__ float kvt_load(const float *p)
{
	return *p;
}

static __device__ __forceinline__ float kvt_load(const kvt_f16 *p)
{
	return __half2float(__ushort_as_half(p->bits));
}

static __device__ __forceinline__ float kvt_load(const kvt_bf16 *p)
{
	return __uint_as_float((uint32_t)p->bits << 16);
}

/* Element stores: f32 narrowed as kvt_from_f32 narrows (dtype_bits.h). */
static __device__ __forceinline__ void kvt_store(float *p, float v)
{
	*p = v;
}

static __device__ __forceinline__ void kvt_store(kvt_f16 *p, float v)
{
	p->bits = kvt_f32_bits_to_f16(__float_as_uint(v));
}

static __device__ __forceinline__ void kvt_store(kvt_bf16 *p, float v)
{
	p->bits = kvt_f32_bits_to_bf16(__float_as_uint(v));
}

#endif /* KVT_DTYPE_CUH */
