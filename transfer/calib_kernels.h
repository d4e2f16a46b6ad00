/* SPDX-License-Identifier: MIT */
/*
 * The two kernels of kvtier-bench calibrate (transfer/cuda_calib.cu), as the plugin's C side
 * (transfer/cuda_calib.c) calls them. Each returns the cudaError_t of its launch (as int).
 */
#ifndef KVT_CALIB_KERNELS_H
#define KVT_CALIB_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A kernel of one thread that does nothing: what a launch costs the host. */
int kvt_calib_empty_launch(void *stream);

/* Fills n bf16 elements at device address dst with pseudo-random values of magnitude in
   [2^-7, 1) from seed, so that the timed GEMMs run on data that draws the power real data
   does (zeros would not). */
int kvt_calib_fill_launch(void *dst, uint64_t n, uint32_t seed, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVT_CALIB_KERNELS_H */
