/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend plugin's C side (transfer/cuda.c), as its other C files see it.
 */
#ifndef KVT_CUDA_BE_H
#define KVT_CUDA_BE_H

#include <stdint.h>
#include <time.h>

#include "gather.h"
#include "plugin.h"

/* What libkvtier lent the plugin at load (set by the entry point before anything else runs). */
extern const struct kvt_plugin_host *kvt_cuda_host;

extern const struct kvt_backend_ops kvt_backend_cuda_ops;

/* The transfer calibration a backend instance measured at create (docs/design.md "FlashH2D": the
   backend picks DMA or the SM gather per (piece size, count)). For each piece-size class
   (4, 16, 64 KiB and larger: index 0, 1, 2), a gather of at least gather_min[c] pieces uses
   the fused kernel, a smaller one one cudaMemcpyBatchAsync; UINT32_MAX: DMA always wins. */
#define KVT_CALIB_CLASSES 3
struct kvt_cuda_calib {
	uint32_t measured; /* 0: not measured (defaults used) */
	uint32_t gather_min[KVT_CALIB_CLASSES];
	double gather_gbps[KVT_CALIB_CLASSES]; /* at the largest count measured */
	double batch_gbps[KVT_CALIB_CLASSES];
};

/* The calibration of backend instance b (created by kvt_backend_cuda_ops). */
const struct kvt_cuda_calib *kvt_cuda_calibration(const struct kvt_be *b);

/* The GPU's name and the driver and runtime versions, for reports. 0 or -ENODEV. */
int kvt_cuda_describe(char *gpu, size_t gpu_len, int *driver, int *runtime);

/* Seconds on the monotonic clock: the benchmarks' host timer. */
static inline double kvt_cuda_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort's ascending order of doubles (the benchmarks' medians). */
static inline int kvt_cuda_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* kvtier-bench transfer (transfer/cuda_bench.c); see struct kvt_plugin.bench. */
int kvt_cuda_bench(int argc, char **argv);

/* kvtier-bench calibrate's measurements (transfer/cuda_calib.c); see struct
   kvt_plugin.calibrate. */
int kvt_cuda_calibrate(const struct kvt_calib_request *rq, struct kvt_calib_result *out, char *err,
		       size_t err_len);

#endif /* KVT_CUDA_BE_H */
