/* SPDX-License-Identifier: MIT */
/*
 * The CPU kernel emulator's C face (tests/kernel_emu): the CUDA runtime's error values the
 * emulated launch wrappers return, and what a test asks the emulator about its launches.
 *
 * The emulator runs the real .cu kernels of the CUDA backend (transfer/cuda_gather.cu,
 * policy/snapkv.cu, recall.cu, attend.cu) on the CPU, every CUDA thread a fiber, with host
 * memory standing in for device memory. Launches run to completion before the launching call
 * returns; streams are accepted and ignored.
 */
#ifndef KEMU_API_H
#define KEMU_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cudaError_t values, as the real runtime numbers them. */
enum {
	KEMU_SUCCESS = 0,
	KEMU_ERR_INVALID_VALUE = 1,	    /* cudaErrorInvalidValue */
	KEMU_ERR_INVALID_CONFIGURATION = 9, /* cudaErrorInvalidConfiguration */
	KEMU_ERR_LAUNCH_FAILURE = 719,	    /* cudaErrorLaunchFailure */
};

/* The shape of the latest launch of the calling thread. */
struct kemu_launch_info {
	uint32_t grid[3], block[3];
	uint64_t launches; /* launches so far, valid or not */
	uint64_t faults;   /* launches that failed while running (see kemu_last_fault) */
};

void kemu_get_launch_info(struct kemu_launch_info *out);

/* The order in which the threads of a CTA run between the points where they wait (which
   changes nothing for a race-free kernel, and reorders the reads and writes of a racy one):
     LOCKSTEP       every warp in turn runs to its next shuffle or __syncthreads(), warp by
		    warp, then the shuffles resolve: the warps advance together (the default);
     WARPS_FORWARD  warp 0 runs alone until it waits at __syncthreads() or ends, its
		    shuffles resolved at once, then warp 1, and so on;
     WARPS_REVERSE  the same from the last warp: a warp that runs ahead reads and writes
		    shared memory before the warps below it, which a missing barrier shows;
     LANES_REVERSE  as LOCKSTEP, but the lanes of each warp run from the last to the first,
		    so that lanes of one warp that read what a lower lane writes between two
		    warp operations (where a GPU's lanes run together) see it unwritten.
   Returns the previous mode, or -1 for an unknown one. */
enum {
	KEMU_SCHED_LOCKSTEP = 0,
	KEMU_SCHED_WARPS_FORWARD = 1,
	KEMU_SCHED_WARPS_REVERSE = 2,
	KEMU_SCHED_LANES_REVERSE = 3,
};
int kemu_set_schedule(int mode);

/* What the latest failed launch did wrong ("" if none): a __syncthreads() that not every live
   thread of the CTA reached, a warp shuffle with absent lanes or lanes at different shuffles, a
   mask other than the warp's full one. Also printed to stderr when it happens. */
const char *kemu_last_fault(void);

/* ---- what the runtime the emulator is linked with provides (kemu_rt.cc standalone, kemu_fake.c
   over tests/cuda_emu's fake runtime) ---- */

/* Before a launch's first thread runs: 0, or the cudaError_t that fails the launch (a stream
   that is not live). */
int kemu_stream_begin(void *stream);
/* After a launch that kemu_stream_begin let run has finished. */
void kemu_stream_end(void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KEMU_API_H */
