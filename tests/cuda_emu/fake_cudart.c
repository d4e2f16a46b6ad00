/* SPDX-License-Identifier: MIT */
/*
 * A fake of the CUDA runtime, so that builds without a GPU (CI, sanitizers) run the real CUDA
 * backend (transfer/cuda.c, cuda_bench.c) and the real GPU suite (tests/test_cuda.c) on the
 * CPU. Every call does its work before it returns, unless FAKE_CUDA_ASYNC asks for the
 * asynchronous mode (fake_queue.c); the kernels are fake_kernels.c. It is a shared library so
 * that the test binary and the dlopened plugin share one allocation table. Its files, which
 * share fake_internal.h:
 *
 * - fake_cudart.c (this one): the reporting, the ordering the waits give, the device and its
 *   attributes, error names, and the exit check.
 * - fake_memory.c: the allocation table, the check of unordered writes, and device and pinned
 *   memory, copies and memsets: their checks (overruns, memory the device cannot reach,
 *   conflicting writes of one launch or batch) are listed there.
 * - fake_queue.c: streams, events, kernel launches and the asynchronous fake.
 *
 * What it checks, which a real GPU would not report or only as a corrupt result, beyond those
 * of memory (fake_memory.c) and of the asynchronous fake (fake_queue.c):
 *
 * - Misuse that the runtime answers with an error (a wrong copy kind, an unknown pointer to
 *   cudaFree, a dead stream or event, an attribute the fake does not know) is also reported as a
 *   warning and counted.
 * - At exit (a destructor, which also runs when only the plugin loaded this library) it lists
 *   every device and pinned allocation, stream and event still live. Any leak or warning ends
 *   the process with status 1 (after flushing stdio), so meson sees the test fail even when
 *   the test binary itself passed.
 *
 * Ordering, synchronous (the default): the work is done by the calling thread, so there is
 * nothing to wait for, but a thread that waits (an event, a stream, the device) must see what
 * the work wrote, as on a GPU. Every queued operation ends with a release on one device-wide
 * timeline (and a recorded event keeps its own), every wait begins with the matching acquire:
 * TSan sees at least the order CUDA promises (a stream's wait also orders other streams' work:
 * coarser than CUDA, never finer). Work on device memory alone is hidden from TSan
 * (fake_tsan_hide).
 *
 * No thread-local variables: the bench loads this library only through the dlopened plugin, and
 * LeakSanitizer (GCC 12) can take wrong bounds for such a library's dynamic TLS block and crash
 * scanning them at exit ("Tracer caught signal 11").
 */
#include <execinfo.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "fake_cudart.h"
#include "fake_internal.h"

/* ---- Reporting --------------------------------------------------------------------------- */

static atomic_ulong n_warnings;

void fake_cuda_die(const char *fmt, ...)
{
	void *frames[32];
	va_list ap;

	fputs("cuda-emu: error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (a bug in the code under test)\n", stderr);
	backtrace_symbols_fd(frames, backtrace(frames, 32), STDERR_FILENO);
	fflush(NULL);
	abort();
}

void fake_cuda_warn(const char *fmt, ...)
{
	va_list ap;

	fputs("cuda-emu: warning: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	atomic_fetch_add(&n_warnings, 1);
}

/* ---- Ordering ------------------------------------------------------------------------------ */

static atomic_ulong timeline;

/* After an operation's work: what it wrote is visible to the next wait. */
void fake_queued(void)
{
	atomic_fetch_add_explicit(&timeline, 1, memory_order_release);
}

/* Before a wait returns: everything queued so far, on any thread, is visible. */
void fake_waited(void)
{
	(void)atomic_load_explicit(&timeline, memory_order_acquire);
}

/* ThreadSanitizer's dynamic annotations: weak, so NULL unless its runtime is loaded. */
void AnnotateIgnoreReadsBegin(const char *file, int line) __attribute__((weak));
void AnnotateIgnoreReadsEnd(const char *file, int line) __attribute__((weak));
void AnnotateIgnoreWritesBegin(const char *file, int line) __attribute__((weak));
void AnnotateIgnoreWritesEnd(const char *file, int line) __attribute__((weak));

/* Hides (on) or shows again the accesses of the calling thread from ThreadSanitizer, around
   work on device memory alone. Device memory is not host memory: nothing but this fake and the
   CPU kernels touch it, on the thread that queues the work, and its order is CUDA's (streams,
   events: the timeline above), not the host threads'. Checking its bulk writes (test_cuda's
   stalls alone are 64 GiB of cudaMemsetAsync) took TSan minutes, on memory no thread shares. */
void fake_tsan_hide(bool on)
{
	if (!AnnotateIgnoreReadsBegin || !AnnotateIgnoreWritesBegin || !AnnotateIgnoreReadsEnd ||
	    !AnnotateIgnoreWritesEnd)
		return;
	if (on) {
		AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
		AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
	} else {
		AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
		AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
	}
}

/* ---- The device ---------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n)
{
	if (!n)
		return cudaErrorInvalidValue;
	*n = 1;
	return cudaSuccess;
}

/* One device, so the current device is always 0. */
cudaError_t cudaGetDevice(int *d)
{
	if (!d)
		return cudaErrorInvalidValue;
	*d = 0;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
	return d == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t cudaDeviceSynchronize(void)
{
	fake_wait_for(NULL, true);
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int d)
{
	if (!v)
		return cudaErrorInvalidValue;
	if (d != 0)
		return cudaErrorInvalidDevice;
	switch (attr) {
	case cudaDevAttrUnifiedAddressing:
	case cudaDevAttrCanMapHostMemory:
	case cudaDevAttrMemoryPoolsSupported:
		*v = 1;
		return cudaSuccess;
	case cudaDevAttrMultiProcessorCount:
		*v = 132;
		return cudaSuccess;
	default:
		fake_cuda_warn("cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
		return cudaErrorInvalidValue;
	}
}

/* A bus with no sysfs entry, in CUDA's upper-case hex: the backend then finds no NUMA node. */
cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int d)
{
	if (!bus || len <= 0)
		return cudaErrorInvalidValue;
	if (d != 0)
		return cudaErrorInvalidDevice;
	snprintf(bus, (size_t)len, "0000:FE:1F.7");
	return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int d)
{
	if (!prop)
		return cudaErrorInvalidValue;
	if (d != 0)
		return cudaErrorInvalidDevice;
	memset(prop, 0, sizeof(*prop));
	snprintf(prop->name, sizeof(prop->name), "CPU emulation (tests/cuda_emu)");
	prop->totalGlobalMem = (size_t)80 << 30;
	prop->major = 9;
	prop->multiProcessorCount = 132;
	prop->canMapHostMemory = 1;
	prop->unifiedAddressing = 1;
	return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
	if (!v)
		return cudaErrorInvalidValue;
	*v = CUDART_VERSION;
	return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
	if (!v)
		return cudaErrorInvalidValue;
	*v = CUDART_VERSION;
	return cudaSuccess;
}

/* The codes the fake returns, and those the backend's fault injection uses (cudaErrorUnknown,
   cudaErrorLaunchFailure). */
const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "cudaSuccess";
	case cudaErrorInvalidValue:
		return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation:
		return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidDevice:
		return "cudaErrorInvalidDevice";
	case cudaErrorInvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle";
	case cudaErrorUnknown:
		return "cudaErrorUnknown";
	case cudaErrorLaunchFailure:
		return "cudaErrorLaunchFailure";
	case cudaErrorNotReady:
		return "cudaErrorNotReady";
	default:
		return "unrecognized error code";
	}
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "no error";
	case cudaErrorInvalidValue:
		return "invalid argument";
	case cudaErrorMemoryAllocation:
		return "out of memory";
	case cudaErrorInvalidDevice:
		return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle";
	case cudaErrorUnknown:
		return "unknown error";
	case cudaErrorLaunchFailure:
		return "unspecified launch failure";
	case cudaErrorNotReady:
		return "device not ready";
	default:
		return "unrecognized error code";
	}
}

/* ---- The exit check ------------------------------------------------------------------------ */

__attribute__((destructor)) static void exit_check(void)
{
	unsigned long warnings = atomic_load(&n_warnings);
	long streams = atomic_load(&fake_live_streams), events = atomic_load(&fake_live_events);
	size_t n = fake_list_leaks();

	fprintf(stderr,
		"cuda-emu: at exit: %zu allocations, %ld streams, %ld events live; %lu warnings\n",
		n, streams, events, warnings);
	fake_async_report();
	if (n == 0 && streams == 0 && events == 0 && warnings == 0)
		return;
	fputs("cuda-emu: failing the process (exit status 1) for the leaks or warnings above\n",
	      stderr);
	fflush(NULL);
	_exit(1);
}
