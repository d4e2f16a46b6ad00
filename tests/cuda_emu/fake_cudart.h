/* SPDX-License-Identifier: MIT */
/*
 * What the fake CUDA runtime (fake_cudart.c, fake_memory.c, fake_queue.c) lends the CPU kernels
 * of the emulated plugin (fake_kernels.c) beyond the runtime API itself: host views of
 * device-accessible memory, the checks a kernel launch makes, and the fake's error reporting.
 *
 * Every "die" below is a bug found in the code under test (an overrun, a pointer the device
 * cannot reach, conflicting copies in one launch): it prints what and where, then aborts, so the
 * test fails at the faulty call with a stack. Warnings are counted and fail the process at exit.
 */
#ifndef KVT_FAKE_CUDART_H
#define KVT_FAKE_CUDART_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A host pointer to the n bytes a kernel reads or writes at device-accessible address addr:
   device memory (its writable shadow view) or pinned host memory (itself, as under UVA). Dies
   unless [addr, addr + n) lies inside one live allocation. n == 0 gives NULL. */
void *fake_cuda_kernel_view(uint64_t addr, size_t n, const char *what);

/* The work of one kernel launch, run on the host over views of device-accessible memory
   (fake_cuda_kernel_view); args is the launch's own copy of its arguments. */
typedef void (*fake_cuda_work)(void *args);

/* A range of device-accessible addresses that a launch or a copy batch writes or reads. */
struct fake_range {
	uint64_t addr, bytes;
};

/* Launches a kernel on stream (a cudaStream_t; NULL = the legacy stream): fn on a copy of the
   size bytes at args. The synchronous fake runs it now; the asynchronous one (FAKE_CUDA_ASYNC)
   queues it, to run when a later wait needs it, as a GPU would, so everything it reads is read
   then, and everything it writes is seen only by code that waited for it. reads[0, n_reads):
   ranges it will read that are named only by memory it reads (a gather's piece sources,
   found with fake_cuda_peek); those in pinned memory are watched until it runs, and the fake
   dies if the host changes them meanwhile. 0, or cudaErrorInvalidResourceHandle (with a
   warning) for a stream that is not live. */
int fake_cuda_launch(void *stream, const char *kernel, fake_cuda_work fn, const void *args,
		     size_t size, const struct fake_range *reads, size_t n_reads);

/* Seconds the launches' CPU work (fake_cuda_launch's fn) has taken so far on the calling thread:
   what a benchmark of the host side subtracts, since a GPU would do that work. With the
   asynchronous fake the work runs on the fake's own thread, whose time is not the caller's: a
   wait of the caller's for it stays in the caller's figure, as a wait for a GPU would. */
double fake_cuda_work_seconds(void);

/* Seconds the copies between pinned host memory and device memory have taken so far on the
   calling thread (as fake_cuda_work_seconds): a GPU's copy engine does them, so a benchmark of
   the host side may count them apart (they stay in its figure otherwise). */
double fake_cuda_copy_seconds(void);

/* Whether this is the asynchronous fake (FAKE_CUDA_ASYNC): work queued runs later, on its own
   thread. A stand-in that only prepares for that (watching what its queued work will read)
   skips it otherwise. */
bool fake_cuda_async(void);

/* What the n bytes at device-accessible address addr will hold once the work queued so far
   has run, where the fake can tell without running it: the memory itself when no queued
   operation writes it, the pinned source of the queued copy that last writes all of it;
   else NULL (a queued kernel writes what it writes). Dies unless the range lies in one live
   allocation. For a launch's reads argument; the launch itself reads at run time. */
const void *fake_cuda_peek(uint64_t addr, size_t n);

/* A launch whose work the caller runs itself between these two calls (tests/kernel_emu's
   emulated kernels). Begin waits, in the asynchronous fake, for the work the stream's next
   operation depends on; 0, or cudaErrorInvalidResourceHandle (with a warning) for a stream
   that is not live. End orders the work's writes before any later wait, on any thread. */
int fake_cuda_launch_begin(void *stream, const char *kernel);
void fake_cuda_launch_end(void *stream);

/* Dies when the writes of one launch or cudaMemcpyBatchAsync overlap each other or any of its
   reads: a GPU runs them in no particular order, so the CPU's sequential result would be one
   the device does not promise. O(n log n) in the writes; allocates a copy of them. */
void fake_cuda_check_footprint(const struct fake_range *w, size_t n_w, const struct fake_range *r,
			       size_t n_r, const char *what);

/* How many calls so far waited for the whole device (cudaDeviceSynchronize, cudaFree,
   cudaFreeHost), which a GPU makes wait for every stream's work, a serving engine's kernels
   included: the tests count those a call makes. */
uint64_t fake_cuda_device_waits(void);

/* How many cudaMalloc calls the process made so far (not the stream-ordered allocations,
   cudaMallocAsync and cudaMallocFromPoolAsync): the tests count those on a call's path. */
uint64_t fake_cuda_mallocs(void);

/* How many waits (stream, event or device synchronisation) the calling thread made so far:
   the tests count those of a call that should queue its work and return. */
uint64_t fake_cuda_thread_waits(void);

/* Reports a bug of the code under test and aborts. */
void fake_cuda_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Reports a suspicious call; the process fails at exit if there was any. */
void fake_cuda_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* KVT_FAKE_CUDART_H */
