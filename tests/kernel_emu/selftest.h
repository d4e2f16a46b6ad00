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
/* Votes and atomics in one CTA of `threads` threads (a multiple of 32): out[3 * t ...] of
   thread t gets the ballot of t % 2, the lanes matching t / 4 % 3, and the old value of its
   atomicAdd of t + 1 to a shared counter; out[3 * threads] the counter. */
int kemu_selftest_vote(unsigned int threads, unsigned int *out);
/* 32 threads; lanes 0-15 at a ballot while lanes 16-31 are at a shuffle. */
int kemu_selftest_mixed_vote(void);
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
