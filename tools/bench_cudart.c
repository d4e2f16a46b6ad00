/* SPDX-License-Identifier: MIT */
/* The CUDA runtime for kvtier-bench's CUDA modes, opened with dlopen (bench_cudart.h). */
#include "bench_cudart.h"

#ifdef KVT_BENCH_CUDART

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

#ifndef KVT_CUDA_ROOT
#define KVT_CUDA_ROOT "/usr/local/cuda"
#endif
/* The name a runtime function has in the library: the one its header's macros give it. */
#define SYM_(f) #f
#define SYM(f) SYM_(f)

/* Looks up each function by name: 0, or -1 naming the one missing in why. */
static int rt_symbols(struct bench_rt *rt, const char *lib, char *why, size_t why_len)
{
	static const struct {
		const char *name;
		size_t off;
	} f[] = {
		{SYM(cudaGetDeviceCount), offsetof(struct bench_rt, device_count)},
		{SYM(cudaGetDevice), offsetof(struct bench_rt, get_device)},
		{SYM(cudaGetDeviceProperties), offsetof(struct bench_rt, properties)},
		{SYM(cudaGetErrorString), offsetof(struct bench_rt, error_string)},
		{SYM(cudaMalloc), offsetof(struct bench_rt, malloc)},
		{SYM(cudaFree), offsetof(struct bench_rt, free)},
		{SYM(cudaMemGetInfo), offsetof(struct bench_rt, mem_info)},
		{SYM(cudaMemcpy), offsetof(struct bench_rt, memcpy)},
		{SYM(cudaMemcpyAsync), offsetof(struct bench_rt, memcpy_async)},
		{SYM(cudaStreamCreate), offsetof(struct bench_rt, stream_create)},
		{SYM(cudaStreamDestroy), offsetof(struct bench_rt, stream_destroy)},
		{SYM(cudaStreamSynchronize), offsetof(struct bench_rt, stream_sync)},
		{SYM(cudaEventCreate), offsetof(struct bench_rt, event_create)},
		{SYM(cudaEventDestroy), offsetof(struct bench_rt, event_destroy)},
		{SYM(cudaEventRecord), offsetof(struct bench_rt, event_record)},
		{SYM(cudaEventSynchronize), offsetof(struct bench_rt, event_sync)},
		{SYM(cudaEventElapsedTime), offsetof(struct bench_rt, elapsed)},
	};

	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		void *sym = dlsym(rt->lib, f[i].name);

		if (!sym) {
			snprintf(why, why_len, "%.900s has no %s", lib, f[i].name);
			return -1;
		}
		memcpy((char *)rt + f[i].off, &sym, sizeof(sym));
	}
	/* the fake runtime's only (tests/cuda_emu/fake_cudart.h) */
	*(void **)&rt->work_seconds = dlsym(rt->lib, "fake_cuda_work_seconds");
	*(void **)&rt->copy_seconds = dlsym(rt->lib, "fake_cuda_copy_seconds");
	return 0;
}

/* Opens the CUDA runtime ($KVTIER_CUDART alone when set; else the soname of the headers' major
   version and the development link, through the dynamic linker, then in the toolkit's library
   directories). 0, or -1 with every dlopen error (or the missing function) in why. */
static int rt_open(struct bench_rt *rt, char *why, size_t why_len)
{
	const char *env = getenv("KVTIER_CUDART"), *lib = NULL;
	char names[6][512];
	size_t n = 0, used = 0;

	if (env && *env) {
		snprintf(names[n++], sizeof(names[0]), "%s", env);
	} else {
		const char *root = getenv("CUDA_HOME");

		snprintf(names[n++], sizeof(names[0]), "libcudart.so.%d", CUDART_VERSION / 1000);
		snprintf(names[n++], sizeof(names[0]), "libcudart.so");
		if (root && *root)
			snprintf(names[n++], sizeof(names[0]), "%s/lib64/libcudart.so.%d", root,
				 CUDART_VERSION / 1000);
		snprintf(names[n++], sizeof(names[0]), "%s/lib64/libcudart.so.%d", KVT_CUDA_ROOT,
			 CUDART_VERSION / 1000);
		snprintf(names[n++], sizeof(names[0]), "%s/lib/libcudart.so.%d", KVT_CUDA_ROOT,
			 CUDART_VERSION / 1000);
	}
	why[0] = '\0';
	for (size_t i = 0; !rt->lib && i < n; i++) {
		const char *e;

		lib = names[i];
		rt->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
		e = rt->lib ? NULL : dlerror();
		if (e && used < why_len)
			used += (size_t)snprintf(why + used, why_len - used, "%s%s",
						 used ? "; " : "", e);
	}
	if (!rt->lib)
		return -1;
	/* kept open to the end of the process, as the plugin is (the fake runtime checks for
	   leaks at exit) */
	return rt_symbols(rt, lib, why, why_len);
}

int bench_rt_start(struct bench_rt *rt, const char *tool)
{
	const struct kvt_plugin *p;
	struct cudaDeviceProp prop;
	char why[1024];
	int err = 0, n = 0, dev = 0;
	cudaError_t e;

	rt->tool = tool;
	p = kvt_plugin_load(&err);
	if (!p) {
		fprintf(stderr, "%s: the CUDA backend plugin is not available (%s): skipped\n",
			tool,
			kvt_plugin_error()[0] ? kvt_plugin_error() : "not built or not found");
		return BENCH_SKIP;
	}
	if (p->probe(why, sizeof(why))) {
		fprintf(stderr, "%s: %s: skipped\n", tool, why); /* "no usable CUDA device: ..." */
		return BENCH_SKIP;
	}
	if (rt_open(rt, why, sizeof(why))) {
		fprintf(stderr, "%s: cannot load the CUDA runtime (%s): skipped\n", tool, why);
		return BENCH_SKIP;
	}
	e = rt->device_count(&n);
	if (e != cudaSuccess || n == 0) {
		fprintf(stderr, "%s: no CUDA device (%s): skipped\n", tool,
			e != cudaSuccess ? rt->error_string(e) : "the runtime reports none");
		return BENCH_SKIP;
	}
	memset(&prop, 0, sizeof(prop));
	if (bench_cu_failed(rt, rt->get_device(&dev), "cudaGetDevice") ||
	    bench_cu_failed(rt, rt->properties(&prop, dev), "cudaGetDeviceProperties"))
		return 1;
	snprintf(rt->device, sizeof(rt->device), "%s", prop.name);
	return 0;
}

bool bench_rt_emulated(const struct bench_rt *rt)
{
	return strncmp(rt->device, "CPU emulation", 13) == 0;
}

bool bench_cu_failed(const struct bench_rt *rt, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return false;
	fprintf(stderr, "%s: %s: %s (CUDA error %d)\n", rt->tool, what, rt->error_string(e),
		(int)e);
	return true;
}

void *bench_dev_buf(const struct bench_rt *rt, const void *src, size_t n, const char *what)
{
	void *d = NULL;

	if (bench_cu_failed(rt, rt->malloc(&d, n), what))
		return NULL;
	if (src && bench_cu_failed(rt, rt->memcpy(d, src, n, cudaMemcpyHostToDevice), what)) {
		(void)rt->free(d);
		return NULL;
	}
	return d;
}

#endif /* KVT_BENCH_CUDART */
