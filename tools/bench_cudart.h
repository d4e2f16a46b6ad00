/* SPDX-License-Identifier: MIT */
/*
 * The CUDA runtime for kvtier-bench's CUDA modes (attend --backend cuda, recall --backend cuda),
 * opened with dlopen: kvtier-bench links no CUDA library, so that it builds and runs where there
 * is none. The benchmarks drive the manager's public calls, which live in kvtier-bench (linked
 * with the library's objects), not in the CUDA plugin; they need the runtime only for their own
 * device buffers, stream and events. Device memory and streams are the device's primary
 * context's, shared with the plugin's own (static) runtime. Over the CPU emulator (tests/cuda_emu)
 * KVTIER_CUDART names the fake runtime the emulated plugin is linked with, so both see one
 * device; bench_rt.work_seconds is then the fake's count of its kernels' CPU time.
 *
 * Only with the runtime's headers (KVT_BENCH_CUDART): without them the CUDA modes say so and
 * exit 77.
 */
#ifndef KVT_BENCH_CUDART_H
#define KVT_BENCH_CUDART_H

#ifdef KVT_BENCH_CUDART

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#define BENCH_SKIP 77 /* the test harness's skip status */

/* The CUDA runtime as dlopen found it: the functions' types are those its header declares. */
struct bench_rt {
	void *lib;
	const char *tool; /* the messages' prefix ("kvtier-bench attend") */
	__typeof__(cudaGetDeviceCount) *device_count;
	__typeof__(cudaGetDevice) *get_device;
	__typeof__(cudaGetDeviceProperties) *properties;
	__typeof__(cudaGetErrorString) *error_string;
	__typeof__(cudaMalloc) *malloc;
	__typeof__(cudaFree) *free;
	__typeof__(cudaMemGetInfo) *mem_info;
	__typeof__(cudaMemcpy) *memcpy;
	__typeof__(cudaMemcpyAsync) *memcpy_async;
	__typeof__(cudaStreamCreate) *stream_create;
	__typeof__(cudaStreamDestroy) *stream_destroy;
	__typeof__(cudaStreamSynchronize) *stream_sync;
	__typeof__(cudaEventCreate) *event_create;
	__typeof__(cudaEventDestroy) *event_destroy;
	__typeof__(cudaEventRecord) *event_record;
	__typeof__(cudaEventSynchronize) *event_sync;
	__typeof__(cudaEventElapsedTime) *elapsed;
	/* the fake runtime's fake_cuda_work_seconds (its kernels' CPU time so far); NULL on a
	   real runtime */
	double (*work_seconds)(void);
	/* and its fake_cuda_copy_seconds (the CPU time of its copies between pinned and device
	   memory, a copy engine's work on a GPU); NULL on a real runtime */
	double (*copy_seconds)(void);
	char device[256]; /* the device's name (cudaGetDeviceProperties) */
};

/* Loads the CUDA plugin and checks that it finds a device, opens the runtime
   ($KVTIER_CUDART alone when set; else the soname of the headers' major version and the
   development link, through the dynamic linker, then in the toolkit's library directories)
   and finds its device: 0, or BENCH_SKIP with the reason reported on stderr after `tool`. */
int bench_rt_start(struct bench_rt *rt, const char *tool);

/* Whether the device is the CPU emulator's (its event times are made up). */
bool bench_rt_emulated(const struct bench_rt *rt);

/* Whether e is an error (then reported, naming what failed). */
bool bench_cu_failed(const struct bench_rt *rt, cudaError_t e, const char *what);

/* A device copy of n bytes of src (n bytes uninitialized when src is NULL): NULL on an error
   (reported). */
void *bench_dev_buf(const struct bench_rt *rt, const void *src, size_t n, const char *what);

#endif /* KVT_BENCH_CUDART */

#endif /* KVT_BENCH_CUDART_H */
