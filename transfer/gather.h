/* SPDX-License-Identifier: MIT */
/*
 * Internals of the CUDA backend plugin shared by its files (transfer/cuda.c, cuda_gather.cu,
 * cuda_bench.c). Nothing here is seen by libkvtier, which knows the plugin only through
 * transfer/plugin.h.
 */
#ifndef KVT_GATHER_H
#define KVT_GATHER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One piece of a fused gather: bytes from src to dst. src and dst are device-accessible
   addresses: device memory, or pinned host memory mapped into the device's address space (UVA).
   The kernel moves 16-byte vectors when src, dst and bytes are all multiples of 16, else 4-byte
   words when they are multiples of 4, else bytes. */
struct kvt_gpu_piece {
	uint64_t src, dst, bytes;
};

/* Default and largest CTA count of the fused gather (docs/design.md: PCIe saturated with <= 16). */
#define KVT_GATHER_CTAS_DEFAULT 16
#define KVT_GATHER_CTAS_MAX 1024
#define KVT_GATHER_THREADS 512

/* FlashH2D: one launch of the fused gather over n pieces; pieces is a device-accessible array
   (device memory, or mapped pinned host memory). Each of the `ctas` CTAs takes pieces
   blockIdx.x, blockIdx.x + ctas, ... and copies each with all its threads. Returns the
   cudaError_t of the launch (as int). n == 0 launches nothing; ctas 0 means
   KVT_GATHER_CTAS_DEFAULT and more than KVT_GATHER_CTAS_MAX are clamped. */
int kvt_gather_launch(const struct kvt_gpu_piece *pieces, uint32_t n, uint32_t ctas, void *stream);

/* The ring writes of a decode append (kvt_backend_ops.append): for each sequence i and head h,
   the K row at k + (i * n_heads + h) * row_bytes goes to dev[i] + h * head_stride and the V row
   likewise to + v_offset. dev: device-accessible uint64 array of n entries. */
int kvt_append_launch(uint64_t k, uint64_t v, uint32_t n, const uint64_t *dev, uint32_t n_heads,
		      uint32_t row_bytes, uint64_t head_stride, uint64_t v_offset, uint32_t ctas,
		      void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVT_GATHER_H */
