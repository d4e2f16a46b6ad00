/* SPDX-License-Identifier: MIT */
/* Kernels that check the CPU kernel emulator itself (selftest.cu); each returns the launch's
   cudaError_t. */
#ifndef KEMU_SELFTEST_H
#define KEMU_SELFTEST_H

#ifdef __cplusplus
extern "C" {
#endif

/* Sum of threadIdx.x over one CTA of `threads` threads, through full-mask warp shuffles and
   shared memory, into *sum. */
int kemu_selftest_reduce(unsigned int threads, float *sum);
/* 64 threads; only the first 16 call __syncthreads(). */
int kemu_selftest_divergent_sync(void);
/* 64 threads; thread 5 returns before a __syncthreads() the rest call. */
int kemu_selftest_early_return(void);
/* 32 threads; lane 3 returns before a full-mask shuffle. */
int kemu_selftest_partial_shuffle(void);

#ifdef __cplusplus
}
#endif

#endif /* KEMU_SELFTEST_H */
