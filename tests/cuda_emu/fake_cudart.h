/* SPDX-License-Identifier: MIT */
/*
 * What the synchronous fake CUDA runtime (fake_cudart.c) lends the CPU kernels of the emulated
 * plugin (fake_kernels.c) beyond the runtime API itself: host views of device-accessible memory,
 * the checks a kernel launch makes, and the fake's error reporting.
 *
 * Every "die" below is a bug found in the code under test (an overrun, a pointer the device
 * cannot reach, conflicting copies in one launch): it prints what and where, then aborts, so the
 * test fails at the faulty call with a stack. Warnings are counted and fail the process at exit.
 */
#ifndef KVT_FAKE_CUDART_H
#define KVT_FAKE_CUDART_H

#include <stddef.h>
#include <stdint.h>

/* A host pointer to the n bytes a kernel reads or writes at device-accessible address addr:
   device memory (its writable shadow view) or pinned host memory (itself, as under UVA). Dies
   unless [addr, addr + n) lies inside one live allocation. n == 0 gives NULL. */
void *fake_cuda_kernel_view(uint64_t addr, size_t n, const char *what);

/* Starts a kernel launch on stream (a cudaStream_t; NULL = the legacy stream): 0, or
   cudaErrorInvalidResourceHandle (with a warning) for a stream that is not live. */
int fake_cuda_launch_begin(void *stream, const char *kernel);

/* Ends a launch started by fake_cuda_launch_begin: its writes are now ordered before any later
   synchronisation, on any thread (what a completed kernel guarantees). */
void fake_cuda_launch_end(void *stream);

/* A range of device-accessible addresses that a launch or a copy batch writes or reads. */
struct fake_range {
	uint64_t addr, bytes;
};

/* Dies when the writes of one launch or cudaMemcpyBatchAsync overlap each other or any of its
   reads: a GPU runs them in no particular order, so the CPU's sequential result would be one
   the device does not promise. O(n log n) in the writes; allocates a copy of them. */
void fake_cuda_check_footprint(const struct fake_range *w, size_t n_w, const struct fake_range *r,
			       size_t n_r, const char *what);

/* Reports a bug of the code under test and aborts. */
void fake_cuda_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Reports a suspicious call; the process fails at exit if there was any. */
void fake_cuda_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* KVT_FAKE_CUDART_H */
