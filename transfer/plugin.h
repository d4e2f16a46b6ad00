/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend is a plugin (libkvtier-cuda.so) that libkvtier loads with dlopen the first
 * time a manager asks for the CUDA backend (or AUTO): libkvtier itself never links libcudart,
 * so it builds, loads and runs on machines with no GPU and no driver.
 *
 * The plugin is a thin CUDA layer. The machinery it shares with the other backends (the save
 * thread pool with the two save jobs every backend submits, the library's allocator with its
 * fault-injection sites, the log) stays in libkvtier and reaches the plugin through struct
 * kvt_plugin_host, so there is one copy of each and one fault-injection state per process.
 *
 * Search order of kvt_plugin_load: $KVTIER_CUDA_PLUGIN (a path), the directory libkvtier was
 * loaded from (libkvtier-cuda.so, then kvtier/libkvtier-cuda.so), the configured install
 * directory (KVT_PLUGIN_DIR), then the dynamic linker's own search.
 */
#ifndef KVT_PLUGIN_H
#define KVT_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "calibrate.h"
#include "fault.h"
#include "savepool.h"

/* Raised whenever either struct below changes: libkvtier takes only a plugin of its own ABI
   (3: struct kvt_plugin gained calibrate). */
#define KVT_PLUGIN_ABI 3
#define KVT_PLUGIN_ENTRY "kvt_cuda_plugin_entry"
#define KVT_PLUGIN_SONAME "libkvtier-cuda.so"

/* What libkvtier lends the plugin. */
struct kvt_plugin_host {
	uint32_t abi, size; /* KVT_PLUGIN_ABI, sizeof(struct kvt_plugin_host) */
	/* The library's allocator (KVT_FAULT_ALLOC site included); free() releases. */
	void *(*malloc)(size_t n);
	void *(*calloc)(size_t n, size_t size);
	void *(*realloc)(void *p, size_t n);
	/* Whether this hit of a fault site must fail (the plugin asks for KVT_FAULT_CUDA before
	   every CUDA runtime call of an operation, and KVT_FAULT_XFER is counted by the
	   manager). */
	bool (*fault)(enum kvt_fault_site site);
	void (*log)(enum kvt_log_level level, const char *fmt, ...)
		__attribute__((format(printf, 2, 3)));
	/* The save thread pool (transfer/savepool.h). */
	int (*savepool_create)(uint32_t threads, uint64_t staging_bytes,
			       const struct kvt_savepool_alloc *alloc, kvt_stage_copy_fn copy,
			       kvt_stage_wait_fn wait, void *cctx, struct kvt_savepool **out);
	void (*savepool_destroy)(struct kvt_savepool *sp);
	int (*savepool_submit_xfer)(struct kvt_savepool *sp, const struct kvt_save_src *src,
				    uint32_t n_src, const struct kvt_xfer *x, uint32_t n,
				    uint64_t *ticket);
	int (*savepool_submit_append)(struct kvt_savepool *sp, uint64_t k, uint64_t v, uint32_t n,
				      const struct kvt_append *a, const struct kvt_append_geom *g,
				      uint64_t *ticket);
	int (*savepool_wait)(struct kvt_savepool *sp, uint64_t t);
};

/* What the plugin gives back. */
struct kvt_plugin {
	uint32_t abi, size; /* KVT_PLUGIN_ABI, sizeof(struct kvt_plugin) */
	const struct kvt_backend_ops *ops;
	/* 0 when a CUDA device is usable now; else -ENODEV (no driver, no device, driver older
	   than the runtime) with the reason in why. */
	int (*probe)(char *why, size_t why_len);
	/* kvtier-bench's transfer mode (transfer/cuda_bench.c): argv after the mode name;
	   returns the process exit status (0, 1 on failure, 2 on bad usage, 77 without a device).
	 */
	int (*bench)(int argc, char **argv);
	/* kvtier-bench calibrate's measurements (transfer/cuda_calib.c, transfer/calibrate.h):
	   fills *out as rq asks. 0; -ENODEV when no device is usable or cuBLAS cannot be loaded
	   (dlopen of libcublas.so.13, .so.12, .so, or $KVTIER_CUBLAS alone when set); -EINVAL
	   for a malformed request; -ENOMEM when host or device memory runs out; -EIO when a CUDA
	   or cuBLAS call fails. Every failure says what in err, and leaves *out unwritten. Frees
	   all it allocated. */
	int (*calibrate)(const struct kvt_calib_request *rq, struct kvt_calib_result *out,
			 char *err, size_t err_len);
};

/* Entry point exported by the plugin under KVT_PLUGIN_ENTRY. Returns NULL when the host's
   ABI is not the plugin's. */
typedef const struct kvt_plugin *(*kvt_plugin_entry_fn)(const struct kvt_plugin_host *host);

/* Loads the plugin once per process (thread-safe) and returns it, or NULL with *err = -ENODEV
   (not found, or not loadable: the reason is logged and kept for kvt_plugin_error). */
const struct kvt_plugin *kvt_plugin_load(int *err);
/* Why the latest load failed ("" when it did not). */
const char *kvt_plugin_error(void);

#endif /* KVT_PLUGIN_H */
