/* SPDX-License-Identifier: MIT */
/*
 * kvtier: a KV cache manager for long-context LLM serving across GPU memory (device tier),
 * pinned host memory (host tier) and local disk (disk tier, optional: config.spill_dir).
 *
 * Every sequence keeps a fixed-size compressed cache on the device (SnapStream: attention-sink
 * tokens, the top-K prompt tokens chosen by a SnapKV observation-window vote, and a ring of the
 * most recent tokens) while every token it ever produced is also written through to the host
 * history, so nothing is lost and any token can be read back bit-exact.
 *
 * Conventions: every fallible call returns 0 or a negative errno (kvt_strerror names it) and
 * changes nothing visible when it fails (which tier holds a block is not visible: a failing
 * call may have spilled or fetched blocks, or evicted cached prefix spans no sequence holds;
 * kvt_decode_recall states its own exceptions);
 * results come back through out-parameters. Tensors are dense,
 * row-major, of config.dtype, in the backend's memory space: host pointers for the host and
 * model backends (the model backend never reads them), device pointers for the CUDA backend.
 * `stream` is a cudaStream_t or NULL: the device work of a call (copies into frames, loads of
 * host blocks, ring writes, the reads of the tensors passed in, which must be written on that
 * stream or ordered before it) is queued there, so calls that pass different streams must be
 * ordered by the caller (use one stream, or synchronize when switching); the manager itself
 * waits for the device before frames or host blocks change hands (preempt, destroy,
 * spilling). The CUDA backend makes its device current (cudaSetDevice) on the calling thread
 * in each call. Calls that need token bytes (kvt_seq_read_token, kvt_attend,
 * kvt_decode_recall's scoring) return -ENOTSUP on a backend without payload.
 *
 * Errors every fallible call on a manager shares: -EINVAL for a NULL manager; -EBADMSG for a
 * sequence whose history was lost (kvt_seq_fetch), from every call naming it but
 * kvt_seq_destroy and kvt_seq_info. Device errors: on the CUDA backend, a call that waits for
 * the device or works on it fails as CUDA's error says, -EIO (most failures, and a save lost on
 * the device), -ENOMEM (device or pinned memory), -ENODEV (the device cannot be used) or
 * -EINVAL (a stream handle CUDA refuses), with CUDA's text in kvt_manager_last_error; the host
 * and model backends have none. Each call's comment lists all of its codes.
 *
 * Concurrency contract.
 * - Ownership: a manager, its sequences and the scheduler made over it belong to one thread at
 *   a time (the owner). Calls on one manager, or on its scheduler, must not overlap; handing
 *   the manager to another thread needs the usual happens-before (a mutex, a thread join).
 *   Distinct managers share nothing and may be used from different threads at once (each has
 *   its own save threads, io_uring and spill file).
 * - Any thread, any time: kvt_version, kvt_strerror, kvt_log_set, kvt_log_set_level, the last
 *   two from inside a log callback as well. A log callback may be called from the owner's
 *   thread or from a save or recall thread, of several managers at once and with no library
 *   lock held, so it must be thread-safe; it must not call back into the manager, nor wait for
 *   a thread that is inside kvt_log_set (which may be waiting for that callback to return).
 * - Internal threads: config.save_threads threads per manager scatter the rows of saves (the
 *   second half of FlashD2H) from a staging buffer into host blocks. They touch nothing but
 *   staging buffers and the host blocks named by the save, never the bookkeeping. Every call
 *   that reads host blocks (read token, recall, resume, spill) or hands them to another owner
 *   (destroy, spilling) first waits for the saves that wrote them; kvt_manager_sync and
 *   kvt_manager_destroy wait for all of them. On the CUDA backend a save can be lost after
 *   its call returned (its staging copy failed on the device, as the save thread learns):
 *   then every wait that covers it fails with -EIO, detail in the last error (the reads,
 *   recalls, resumes and spills of sequences saved since, kvt_manager_sync), while what was
 *   saved before it stays readable. A device that failed once fails those calls anyway.
 * - With config.recall_threads = T >= 2, T - 1 more threads per manager ("kvt-par") share the
 *   work of a recall call with the calling thread, each on runs of the call's sequences it
 *   claims, and sleep between calls; the call returns when the runs are done (a thread that
 *   wakes after the caller claimed the last run takes no part in that call).
 * - The disk tier runs no thread: its io_uring batches are submitted and their completions
 *   reaped by the owner's thread inside the call that needs them, which returns only when the
 *   batch is done (spills free host blocks only after their write completed).
 * - Tensors passed in may be reused when the call returns (stream-ordered on a GPU); pointers
 *   returned (frames, views, last error) stay valid until the next call on the manager.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVT_BUILDING) && defined(__GNUC__)
#define KVT_API __attribute__((visibility("default")))
#else
#define KVT_API
#endif

#define KVT_VERSION_MAJOR 0
#define KVT_VERSION_MINOR 1
#define KVT_VERSION_PATCH 0

/* Version of struct kvt_config and struct kvt_stats understood by this header. */
#define KVT_CONFIG_VERSION 1
#define KVT_STATS_VERSION 1

enum kvt_dtype {
	KVT_DTYPE_F32 = 0,
	KVT_DTYPE_F16 = 1,
	KVT_DTYPE_BF16 = 2,
};

enum kvt_backend {
	KVT_BACKEND_AUTO = 0,  /* CUDA when built and a device is usable, else host */
	KVT_BACKEND_HOST = 1,  /* device tier emulated in RAM; the reference backend */
	KVT_BACKEND_CUDA = 2,  /* real GPU: the plugin libkvtier-cuda.so (found beside
				  libkvtier.so, or $KVTIER_CUDA_PLUGIN); -ENODEV when it is not
				  built or no device is usable */
	KVT_BACKEND_MODEL = 3, /* no payload bytes; every transfer timed by a bandwidth and
				  per-call model (config.model_*); never chosen by AUTO */
};

/* size is the caller's sizeof(struct kvt_config): this header's, or that of an earlier kvtier
   header of the same version, whose struct ended after backend (the design contract's fields),
   staging_bytes, recall_cache_bytes or model_fused (80, 88, 104 or 152 bytes on LP64; 184 for
   this header). Fields past the caller's struct keep their defaults. Any other size, or another
   version, is -EINVAL. */
struct kvt_config {
	uint32_t size, version; /* sizeof(struct kvt_config), KVT_CONFIG_VERSION */
	/* model geometry: n_q_heads is a multiple of n_kv_heads; block_tokens a power of two
	   in 8..64 */
	uint32_t n_layers, n_kv_heads, n_q_heads, head_dim, block_tokens;
	enum kvt_dtype dtype;
	/* SnapStream: sink tokens, recent (ring) tokens >= 1, top-K tokens (0 = none), SnapKV
	   observation window (>= 1 when top-K > 0), pooling kernel (odd) */
	uint32_t sink_tokens, recent_tokens, topk_tokens, obs_window, pool_kernel;
	uint64_t device_bytes, host_bytes; /* tier budgets, rounded down to whole block groups */
	enum kvt_backend backend;
	/* --- fields after this line are kvtier's additions to the design contract --- */
	uint32_t save_threads;	/* threads scattering saved rows into host blocks; 0 = the
				   calling thread does it before the call returns */
	uint64_t staging_bytes; /* size of each of the two staging buffers of the save path
				   (pinned host memory; on the CUDA backend, device memory too) */
	/* Dynamic recall (SparseServe/Quest). recall_blocks (r) host blocks per (sequence,
	   layer, kv head) are made resident by kvt_decode_recall; 0 = pure SnapStream, and then
	   no block metadata is kept. recall_cache_bytes of device_bytes are set aside as the
	   shared recall cache of single-block frames (required when recall_blocks > 0; may be
	   set without it for kvt_recall_blocks). ws_window (w, 1..64) is the number of decode
	   steps a sequence's recall working set spans. */
	uint32_t recall_blocks;
	uint32_t ws_window;
	uint64_t recall_cache_bytes;
	/* Transfer model of the model backend (read, and validated, only when backend is
	   KVT_BACKEND_MODEL). Bandwidths in GB/s (1e9 bytes/s), finite and > 0: h2d and d2h over
	   the host link, d2d the device memory copy bandwidth. model_call_ns: host-side cost of
	   one DMA copy call (cudaMemcpyAsync); model_launch_ns: one kernel launch.
	   model_fused: 1 = a gather of host blocks is one fused kernel (FlashH2D) costing
	   launch + bytes / (h2d * model_fused_eff), model_fused_eff in (0, 1]; 0 = one DMA call
	   per piece, pieces * call + bytes / h2d (SparseServe's per-block-copy ablation). Saves
	   cost one DMA call per source per staging chunk plus bytes / d2h (the CPU scatter is
	   overlapped, not timed); copies into device frames cost launch + bytes / d2d. Each
	   backend call's time is rounded to the nearest ns (halves up) and summed per direction
	   into kvt_stats.model_ns_*. */
	double model_h2d_gbps, model_d2h_gbps, model_d2d_gbps;
	double model_fused_eff;
	uint32_t model_call_ns, model_launch_ns;
	uint32_t model_fused;
	/* Disk tier (docs/design.md "Disk tier"). spill_dir: directory of the spill file (copied at
	   create); NULL = no disk tier, and a full host tier then fails the call with -ENOMEM.
	   With it, the host tier is a cache of every history: when it is full, blocks of the
	   sequences used least recently (never a block the call at hand touches) are written to
	   a private spill file there (mode 0600, unlinked: nothing is left behind), O_DIRECT
	   where the file system allows, through io_uring (preadv/pwritev where io_uring is
	   refused or with the environment variable KVTIER_DISK_IO=sync: see
	   kvt_stats.disk_uring), each block group with a CRC-32C. Each call reads back only the
	   blocks it touches, in one batched read (decode: the block each token goes to; recall:
	   the blocks it loads; resume: the resident set's; a token read: its block; prefill:
	   none), so a history may be any multiple of the host tier: only what one call touches
	   must fit it (at most one layer of one sequence). kvt_seq_fetch reads ahead.
	   disk_bytes: most bytes the spill file may hold (0 = as much as the file system
	   gives). disk_queue_depth: io_uring entries (1..4096), which is also the most I/Os in
	   flight. model_disk_gbps / model_disk_ns: the disk of the model backend (which moves
	   no bytes and writes no file): each batch of I/Os costs model_disk_ns plus
	   bytes / model_disk_gbps, summed into kvt_stats.model_ns_disk. */
	uint32_t disk_queue_depth;
	const char *spill_dir;
	uint64_t disk_bytes;
	double model_disk_gbps;
	uint32_t model_disk_ns;
	/* Threads, the caller's counted, that share the work of one recall call
	   (kvt_recall_blocks, kvt_decode_recall): the batch's sequences, whose recall state is
	   theirs alone, go in runs of consecutive ones to whichever thread is free, so the
	   decisions, the load list and every figure are those of one thread, and a call never
	   waits for a thread the system has not run yet (on cores busy with other work the call
	   runs on fewer). 0 or 1: the calling thread alone; at most 64. A header before this
	   field had `reserved` here, 0: one thread. */
	uint32_t recall_threads;
};

/* Defaults: Llama-3-8B geometry (32 layers, 8 kv heads, 32 q heads, d=128, bf16), 32-token
   blocks, sink 128, recent 512, top-K 4096, observation window 32, pool kernel 7, 1 GiB device,
   4 GiB host, automatic backend, 2 save threads, 2 x 32 MiB staging, no recall (r = 0, no
   recall cache), a 12-step working-set window; transfer model of an H100 on PCIe Gen5: 53 GB/s
   each way, 1500 GB/s device copies, 2 us per DMA call, 5 us per kernel launch, fused gather
   at 0.8 of the link; no disk tier (64 I/Os in flight when enabled; model disk: 6 GB/s,
   80 us per batch); recall calls on the calling thread alone (recall_threads 0). */
#define KVT_CONFIG_INIT                                                                           \
	{                                                                                         \
		.size = sizeof(struct kvt_config), .version = KVT_CONFIG_VERSION, .n_layers = 32, \
		.n_kv_heads = 8, .n_q_heads = 32, .head_dim = 128, .block_tokens = 32,            \
		.dtype = KVT_DTYPE_BF16, .sink_tokens = 128, .recent_tokens = 512,                \
		.topk_tokens = 4096, .obs_window = 32, .pool_kernel = 7,                          \
		.device_bytes = (uint64_t)1 << 30, .host_bytes = (uint64_t)4 << 30,               \
		.backend = KVT_BACKEND_AUTO, .save_threads = 2,                                   \
		.staging_bytes = (uint64_t)32 << 20, .recall_blocks = 0, .ws_window = 12,         \
		.recall_cache_bytes = 0, .model_h2d_gbps = 53.0, .model_d2h_gbps = 53.0,          \
		.model_d2d_gbps = 1500.0, .model_fused_eff = 0.8, .model_call_ns = 2000,          \
		.model_launch_ns = 5000, .model_fused = 1, .spill_dir = NULL, .disk_bytes = 0,    \
		.disk_queue_depth = 64, .model_disk_ns = 80000, .model_disk_gbps = 6.0,           \
	}

struct kvt_manager;

/* Counters of one manager since its creation. Set .size = sizeof(struct kvt_stats) and .version
   = KVT_STATS_VERSION (KVT_STATS_INIT does both) before calling kvt_manager_stats; fields past
   .size are not written. */
struct kvt_stats {
	uint32_t size, version;
	uint64_t device_frames_total, device_frames_used, device_frames_free;
	uint64_t host_blocks_total, host_blocks_used, host_blocks_free;
	uint64_t bytes_h2d;	  /* host blocks loaded into device frames */
	uint64_t bytes_d2h;	  /* rows saved into the host history, and device reads */
	uint64_t bytes_d2d;	  /* rows written into device frames from the caller's tensors */
	uint64_t tokens_saved;	  /* (layer, token) pairs written to the host history */
	uint64_t tokens_appended; /* (layer, token) pairs appended by decode */
	uint64_t tokens_prompt;	  /* (layer, token) pairs of prefilled prompts (shared prefixes
				     included; tokens_saved counts what was written) */
	uint64_t tokens_resident; /* of those, kept in device frames at prefill (sink+top-K+ring) */
	uint64_t prefill_layers;  /* layers prefilled (kvt_prefill_layer, or a last chunk) */
	uint64_t decode_calls;	  /* successful kvt_decode_append calls */
	uint64_t saves_submitted; /* save jobs handed to the save path */
	uint32_t live_seqs;
	uint32_t save_threads;
	uint64_t bytes_read; /* rows copied out of device frames by kvt_seq_read_token */
	/* recall cache, in single-block frames */
	uint64_t recall_frames_total, recall_frames_used; /* used: holding a block */
	uint64_t recall_calls;	   /* successful kvt_decode_recall / kvt_recall_blocks calls */
	uint64_t recall_lookups;   /* blocks asked for (not fully resident) */
	uint64_t recall_hits;	   /* of those, already in the recall cache */
	uint64_t recall_loads;	   /* of those, loaded from the host history (misses) */
	uint64_t recall_evictions; /* blocks dropped from a region (its LRU) */
	uint64_t preemptions, resumes;
	/* Modelled transfer time in ns (model backend; 0 on the others), per direction: h2d =
	   gathers of host blocks (recall loads, resume); d2h = saves to the host history (prefill,
	   decode); d2d = copies into device frames (prefill gather, decode ring writes). Their
	   bytes are bytes_h2d, bytes_d2h and bytes_d2d. Each is a serial sum of that direction's
	   calls: how directions overlap is the caller's model. */
	uint64_t model_ns_h2d, model_ns_d2h, model_ns_d2d;
	/* Host-side calls modelled per direction: DMA copy calls plus kernel launches. */
	uint64_t model_calls_h2d, model_calls_d2h, model_calls_d2d;
	/* Disk tier, in blocks (one block = one (layer, kv head) block of block_tokens tokens,
	   as host_blocks_*). total: what disk_bytes allows (0 = no disk tier; UINT64_MAX = no
	   limit). spilled / fetched: blocks written to / read back from the spill file. */
	uint64_t disk_blocks_total, disk_blocks_used;
	uint64_t disk_blocks_spilled, disk_blocks_fetched;
	uint64_t disk_bytes_written, disk_bytes_read; /* file bytes, padding included */
	uint64_t disk_io_errors;       /* I/Os the disk failed (each fails only its sequence);
					  not writes the spill file's limits refused (-ENOSPC),
					  nor calls that failed for any other reason */
	uint64_t disk_checksum_errors; /* blocks read back with a CRC-32C mismatch */
	uint64_t seqs_lost;	       /* sequences whose history could not be read back */
	uint64_t model_ns_disk;	       /* modelled disk time (model backend) */
	uint32_t disk_direct;	       /* 1: the spill file is O_DIRECT; 0: page cache (the file
					  system refused O_DIRECT) or no disk tier */
	uint32_t disk_uring;	       /* 1: disk I/O goes through io_uring; 0: pread/pwrite, one
					  I/O at a time (io_uring was refused, as by Docker's
					  default seccomp profile, or failed since, or
					  KVTIER_DISK_IO=sync), or no disk tier, or the model
					  backend */
	/* CUDA backend (0 on the others): how loads of host blocks into device frames ran, as one
	   fused gather kernel (FlashH2D) or one cudaMemcpyBatchAsync, and the calibration that
	   chooses between them, measured at create by the process's first manager on that device
	   (later ones reuse it): a load of at least
	   xfer_gather_min_* pieces of that size (<= 4 KiB, <= 16 KiB, larger) runs as the kernel,
	   a smaller one as DMA (UINT32_MAX: DMA always; 0: the kernel always). Loads on the NULL
	   stream always use the kernel (cudaMemcpyBatchAsync refuses the legacy stream). The
	   calibration's own runs are not counted. Recall calls on a CUDA backend that keeps the
	   recall regions on the device load through the regions' own fused kernel,
	   whose load list never leaves the device: one launch a call, counted in
	   h2d_kernel_launches even when the call loads nothing. */
	uint64_t h2d_kernel_launches, h2d_dma_batches;
	uint32_t xfer_calibrated; /* 1: measured; 0: not (the kernel always) */
	uint32_t xfer_gather_min_4k, xfer_gather_min_16k, xfer_gather_min_64k;
	/* Prefix cache (kvt_seq_create_prefix), in blocks of one (layer, kv head) and in spans
	   (one cached hash of hash_tokens tokens, all layers). */
	uint64_t prefix_spans;		/* spans cached now */
	uint64_t prefix_blocks;		/* blocks they hold (host tier and spill file) */
	uint64_t prefix_blocks_idle;	/* of those, of spans no live sequence shares (evictable) */
	uint64_t prefix_blocks_disk;	/* of those, in the spill file */
	uint64_t prefix_blocks_shared;	/* host blocks live sequences share with the cache */
	uint64_t prefix_tokens_asked;	/* prompt tokens of sequences created with a hash chain */
	uint64_t prefix_tokens_hit;	/* of those, shared from the cache at creation */
	uint64_t prefix_spans_evicted;	/* spans dropped from the cache */
	uint64_t prefix_spans_spilled;	/* spans written to the spill file by eviction */
	uint64_t prefix_spans_restored; /* spans read back from the spill file by a match */
	uint64_t bytes_h2d_history;	/* rows loaded from the host history into caller tensors
					   and prefill buffers (kvt_seq_load_kv, kvt_prefill_chunk) */
	/* Device memory outside device_bytes that the recall state takes now on the CUDA backend
	   with recall: the block metadata tables (about 1/block_tokens of each history's K and V
	   bytes), and, with the recall regions on the device, the regions' slots,
	   frames and views, the blocks' host addresses, the free-frame stack and a call's
	   program buffer; 0 on the other backends */
	uint64_t device_meta_bytes;
	/* Device time of the recall calls with the regions on the device (CUDA backend): a
	   sample of them is timed, one call of a layer in 16 (the timed layer moving from step to
	   step; KVTIER_RECALL_TIME_EVERY=N at create: one in N, 1 every call, 0 none), since
	   timing costs two runtime calls. recall_device_ns sums the timed calls whose reports
	   were read so far, per call from an event before its first kernel to one after its
	   last copy (launch gaps included); recall_device_timed counts them, so a call's mean
	   is the ratio. 0 on the other backends. */
	uint64_t recall_device_ns;
	uint64_t recall_device_timed;
};

#define KVT_STATS_INIT                                                         \
	{                                                                      \
		.size = sizeof(struct kvt_stats), .version = KVT_STATS_VERSION \
	}

enum kvt_log_level {
	KVT_LOG_ERROR = 0,
	KVT_LOG_WARN = 1,
	KVT_LOG_INFO = 2,
	KVT_LOG_DEBUG = 3,
};

typedef void (*kvt_log_fn)(void *user, enum kvt_log_level level, const char *msg);

/* Library version as "MAJOR.MINOR.PATCH". */
KVT_API const char *kvt_version(void);

/* Routes library messages (already prefixed "kvtier:") to fn, or back to stderr when fn is
   NULL. The level threshold comes from the environment (KVT_LOG=error|warn|info|debug, default
   warn) unless kvt_log_set_level overrides it. Process-wide; safe from any thread, a log
   callback included; messages logged after either call returns follow the new setting.
   Callbacks run concurrently, one per thread that logs, under no library lock. kvt_log_set
   called outside a callback returns once every call of the callbacks it replaced has returned
   (the old user data may then be freed); called from inside a callback it returns at once,
   and the old callback may still be running, in this thread and in others. */
KVT_API void kvt_log_set(kvt_log_fn fn, void *user);
KVT_API void kvt_log_set_level(enum kvt_log_level level);

/* Static text for an error code (negative or positive errno); never NULL. Every code a call of
   this library returns has its own text, worded for each call that returns it; other codes
   read "unknown error". */
KVT_API const char *kvt_strerror(int err);

/* Validates cfg and creates a manager: allocates both tier arenas, the pools and the save
   threads, and opens the disk tier (config.spill_dir). *out is untouched on failure, and why
   is logged (kvt_log_set) at KVT_LOG_WARN. Errors:
   -EINVAL: a NULL pointer; a size that is none of struct kvt_config's (see there), a version
     other than KVT_CONFIG_VERSION; a field out of its range (geometry that does
     not divide, zero sizes, the SnapStream, thread, staging, recall and queue-depth limits, an
     empty spill_dir, model_* figures when the model backend is asked for, an unknown backend);
     a budget that holds no block group, or more than 2^32 - 2 (the recall cache: 1 .. 2^30 - 1
     blocks when recall_blocks > 0; with a disk tier, at most 2^31 - 1 host groups, of at most
     1 GiB each); disk_bytes that hold no block group (padded to 4 KiB); the environment's
     KVTIER_DISK_IO neither uring nor sync.
   -ENOMEM: an arena, a table or a staging buffer cannot be allocated (heap, pinned or device
     memory, or the model backend's address range).
   -ENODEV: the CUDA backend is asked for and cannot be used (no plugin, no usable device).
   -EAGAIN: a save thread cannot be started.
   -EIO: the CUDA backend failed on its device while starting (or -ENOMEM, -ENODEV, -EINVAL,
     as CUDA's error says); or the spill file cannot be set up for a reason other than those
     below.
   spill_dir unusable: -ENOENT (it does not exist), -ENOTDIR (it, or a component of its path,
     is not a directory), -EACCES or -EPERM (the process may not create a file there), -EROFS
     (a read-only file system), -ENOSPC (no room or quota left there), -ENAMETOOLONG or -ELOOP
     (its path is too long, or loops through symbolic links), -EMFILE (no file descriptor
     left). */
KVT_API int kvt_manager_create(const struct kvt_config *cfg, struct kvt_manager **out);

/* Waits for pending saves, frees every sequence and both arenas. NULL is a no-op. */
KVT_API void kvt_manager_destroy(struct kvt_manager *m);

/* Detail of the latest failed call on m ("" when none failed yet; "no manager" when m is NULL).
   Owned by m; valid until the next call on m. */
KVT_API const char *kvt_manager_last_error(const struct kvt_manager *m);

/* Copies the effective configuration (backend resolved from AUTO) into *out, a whole struct
   kvt_config of this header: a program built against an earlier header, whose struct is
   smaller, must not call it. -EINVAL on NULL. */
KVT_API int kvt_manager_config(const struct kvt_manager *m, struct kvt_config *out);

/* Fills *out up to out->size (a larger size: the whole struct) and sets out->size to the bytes
   written. -EINVAL, with nothing written, on NULL, out->size smaller than the first two fields
   or out->version other than KVT_STATS_VERSION. With the recall regions on the device, the
   figures of recall calls the device has not reported yet are read first (a wait for their
   work, as a rule done already); a failure found there is the next recall call's error. */
KVT_API int kvt_manager_stats(const struct kvt_manager *m, struct kvt_stats *out);

/* Waits until every save handed to the save path so far has landed in the host history and
   every device operation queued on `stream` has completed, and, with the recall regions on the
   device, reads every recall call's report. -EINVAL on a NULL m; on the CUDA backend, -EIO when
   a save was lost on the device or a recall call's work failed there, and the device errors of
   the wait (-EIO, -ENOMEM, -ENODEV, -EINVAL for a stream CUDA refuses), detail in the last
   error. */
KVT_API int kvt_manager_sync(struct kvt_manager *m, void *stream);

/* Records into `event` (a cudaEvent_t the caller created) the point at which every save queued
   so far (the writes through of prefills, appends and prefill chunks) has left the device.
   The CUDA backend copies what a save reads into a device staging buffer on the call's stream,
   in its order (so the tensors passed in may be reused after the call, as everywhere), and
   from there to pinned host memory on a stream of its own, so the caller's next kernels do not
   wait behind the copy; an engine that wants to order work after the saves (vLLM's
   wait_for_save) waits for this event on its stream (cudaStreamWaitEvent) or on the host,
   without a device-wide sync. The rows reach the host history after that, on the save threads:
   kvt_manager_sync waits for those too. -EINVAL (NULL m or event), -ENOTSUP (a backend without
   device events: host, model, null), and the device's errors of recording it (-EINVAL for an
   event CUDA refuses, -EIO, -ENODEV), detail in the last error. Writes nothing on an error. */
KVT_API int kvt_manager_save_event(struct kvt_manager *m, void *event);

/* Registers sequence `seq` with a prompt of prompt_tokens (1..INT32_MAX) tokens. Allocates no
   tier memory yet; each kvt_prefill_layer allocates that layer's. -EEXIST if seq is live,
   -EINVAL on a NULL m or a zero or oversized prompt, -ENOMEM (no memory for its state). */
KVT_API int kvt_seq_create(struct kvt_manager *m, uint64_t seq, uint32_t prompt_tokens);

/* Waits for the sequence's pending saves (and, on the CUDA backend, for device work the
   manager queued that may still use its frames or host blocks), then frees its device frames
   and host blocks (a lost sequence's too). -EINVAL on a NULL m; -ENOENT if seq is not live;
   on the CUDA backend, the device error of that wait (-EIO, -ENOMEM, -ENODEV; detail in the
   last error), with nothing changed. */
KVT_API int kvt_seq_destroy(struct kvt_manager *m, uint64_t seq);

/* Prefills one layer of `seq`: k, v are [n_kv_heads][prompt_tokens][head_dim] and q_obs is
   [n_q_heads][obs_window][head_dim] (the post-RoPE queries of the last obs_window prompt
   positions; may be NULL when no selection happens: prompt_tokens <= sink + recent or
   topk_tokens == 0, or prompt_tokens <= obs_window). Selects the top-K tokens per kv head
   (SnapKV, docs/design.md), copies sink, top-K and ring tokens into newly allocated device frames
   and saves the whole layer into the host history; for a layer that already holds positions
   (a shared prefix, earlier chunks), k and v are still the whole layer and only the positions
   after those are saved (kvt_prefill_chunk from there, kv_from 0). The caller may reuse k, v
   and q_obs when the call returns (after the work queued on `stream`, for the CUDA backend).
   Errors: -ENOENT unknown seq; -EINVAL layer out of range, NULL tensors or seq preempted;
   -EEXIST layer already prefilled; -ENOMEM when either tier cannot hold the layer, with a
   disk tier after spilling every other block (nothing is allocated); -EBADMSG when seq was
   lost; -EIO (or -ENOTSUP: a backend that cannot select) when a device copy or the selection
   failed, with nothing allocated. */
KVT_API int kvt_prefill_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer, const void *k,
			      const void *v, const void *q_obs, void *stream);

/* Appends one new token to each of the n sequences for `layer`: k, v are
   [n][n_kv_heads][head_dim]. Writes each token into its ring slot (overwriting the oldest
   recent token, which stays in the host history) and saves it to the host history. Work per
   sequence is O(1) bookkeeping. All or nothing: errors are -ENOENT for an unknown id, -EINVAL
   for n == 0, NULL pointers, a repeated id or a layer not yet prefilled for some sequence,
   -EOVERFLOW when a sequence would pass INT32_MAX tokens, -ENOMEM when the host tier cannot
   hold the blocks the tokens go to (with a disk tier: after spilling every other block),
   -EBADMSG when a sequence was lost (also when reading one of its spilled blocks back finds
   it corrupted), -EIO when reading a spilled block or the device copy failed (a block read
   stays placed; no token is appended); the last error names the offending sequence. */
KVT_API int kvt_decode_append(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const void *k, const void *v, void *stream);

/* Positions resident on the device for (seq, layer, kv_head), ascending: sink, top-K and ring.
   *n_out receives the count; when cap is smaller, nothing is written to out, *n_out still
   receives the count and the call returns -ENOSPC. out may be NULL when cap is 0.
   -ENOENT unknown seq; -EINVAL NULL m or n_out, NULL out with cap > 0, bad layer/head, layer
   not prefilled; -EBADMSG its history was lost. */
KVT_API int kvt_seq_resident_positions(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				       uint32_t kv_head, int32_t *out, uint32_t cap,
				       uint32_t *n_out);

/* Copies the K and V rows (head_dim elements of config.dtype each) of token `pos` of
   (seq, layer, kv_head) into host memory, from the device frame when resident, else from the
   host history (after waiting for its save; with a disk tier, its block is read back when
   spilled). Bit-exact with what was written. -ENOENT unknown seq; -EINVAL bad layer/head,
   pos >= tokens of that layer, NULL pointers; -ENOTSUP on a backend without payload;
   -EBADMSG when seq was lost or its block fails the CRC check; -EIO when the device read or
   the disk read failed; -ENOMEM when the host tier has no room for the block (every other
   block pinned, or the spill file full). */
KVT_API int kvt_seq_read_token(struct kvt_manager *m, uint64_t seq, uint32_t layer,
			       uint32_t kv_head, uint32_t pos, void *k_out, void *v_out);

/* Number of tokens written to (seq, layer): 0 before its prefill. -ENOENT unknown seq; -EINVAL
   NULL m or n_out, layer out of range; -EBADMSG its history was lost. */
KVT_API int kvt_seq_tokens(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t *n_out);

/* Reference decode attention of one sequence and layer over its resident set plus the blocks
   recalled for that (sequence, layer) by the latest recall call naming it: for each query
   head g of kv head h = g / (n_q_heads / n_kv_heads), out[g] = softmax(q[g].K^T /
   sqrt(head_dim)) V over those tokens of h, each token counted once, accumulated in f32. q and
   out are [n_q_heads][head_dim] f32 in host memory. -ENOENT unknown seq; -EINVAL (NULL
   pointers, layer out of range or not prefilled, sequence preempted); -EBADMSG its history was
   lost; -ENOTSUP on a backend without payload; -ESTALE when a recalled block's cache frame was
   since given to another block (recall again); -ENOMEM (no memory for the lists of rows); on
   the CUDA backend its device errors (-EIO, -ENOMEM, -ENODEV, -EINVAL). */
KVT_API int kvt_attend(struct kvt_manager *m, uint64_t seq, uint32_t layer, const float *q,
		       float *out);

/* ---- Preemption, residency and working sets ------------------------------------------- */

/* Frees every device frame of seq (its resident set, all layers) and forgets its recall
   views; the host history keeps every token, so kvt_seq_read_token still works and
   kvt_seq_resume rebuilds the device state exactly. A preempted sequence takes no prefill,
   decode, recall or attention until resumed. On the CUDA backend the caller must have finished
   the work that reads its frames. -EINVAL on a NULL m; -ENOENT unknown seq; -EBADMSG its
   history was lost; -EALREADY when already preempted; on the CUDA backend, the device error of
   the wait for the device before the frames are freed (-EIO, -ENOMEM, -ENODEV), with nothing
   changed. */
KVT_API int kvt_seq_preempt(struct kvt_manager *m, uint64_t seq);

/* Reallocates the device frames of every prefilled layer of a preempted seq and reloads sink,
   top-K and ring slots from the host history with one gather: afterwards the device holds
   bit for bit what it held at preemption (no recomputation). With a disk tier, the resident
   set's blocks are read back first, all layers in one batch, or a chunk of layers at a time
   when they do not fit the host tier together. -ENOENT; -EALREADY when not preempted;
   -ENOMEM when the device tier cannot hold it, or the host tier one layer's resident
   blocks; -EBADMSG when seq was lost; -EIO when a read or the gather failed (blocks read
   stay placed; the sequence stays preempted). */
KVT_API int kvt_seq_resume(struct kvt_manager *m, uint64_t seq, void *stream);

/* What a sequence holds and needs, in frames (one frame = one block of one (layer, kv head)). */
struct kvt_seq_info {
	uint32_t size;		     /* sizeof(struct kvt_seq_info), set by the caller */
	uint32_t prompt_tokens;	     /* as created */
	uint32_t layers_prefilled;   /* 0 .. n_layers */
	uint32_t preempted;	     /* 1 between kvt_seq_preempt and kvt_seq_resume */
	uint32_t tokens;	     /* tokens of its most advanced layer */
	uint32_t frames_per_layer;   /* device frames one layer's resident set takes */
	uint64_t device_frames;	     /* device frames held now (resident sets; not recall) */
	uint64_t host_blocks;	     /* host blocks of its history, all layers */
	uint64_t recall_ws_frames;   /* distinct blocks it recalled over its last ws_window steps */
	uint64_t recall_step_frames; /* distinct blocks it recalled in its latest step */
	uint64_t disk_blocks;	     /* of host_blocks, those in the spill file now */
	int32_t lost;		     /* 0, or the error (-EBADMSG) that lost its history */
	uint32_t reserved;
	uint32_t prefix_tokens; /* leading tokens shared from the prefix cache at creation */
	uint32_t filled_tokens; /* tokens in the host history of its least advanced layer
				   (shared prefix, prefill chunks and decode tokens) */
	uint64_t shared_blocks; /* of host_blocks, those shared with the prefix cache */
	uint64_t serial;	/* its creation under this manager, from 1: a sequence destroyed and
				   created again under the same id has another (a scheduler, an engine,
				   tells a new request from the one it knew under that id) */
};

/* Fills *out up to out->size (at least the first two fields; a larger size: the whole struct)
   and sets out->size to the bytes written; for a lost sequence too (lost says so). -EINVAL
   (NULL m or out, out->size smaller than the first two fields), -ENOENT unknown seq. */
KVT_API int kvt_seq_info(struct kvt_manager *m, uint64_t seq, struct kvt_seq_info *out);

/* ---- Prefix reuse and prefill in pieces ------------------------------------------------ */

/* An engine names a prompt's prefix by a chain of hashes: hashes[i] stands for tokens
   [0, (i + 1) * hash_tokens) of the prompt (each hash covering all before it, as vLLM's and
   SGLang's block hashes do, or a Mooncake trace's hash_ids), hash_tokens a multiple of
   block_tokens. Once every layer of a sequence created with a chain is prefilled, each span
   of its chain is cached: its host blocks, all layers, become shared with the cache,
   reference counted and never written again (the history is append-only, and a span is
   whole within the prompt). A later sequence created on the same leading hashes shares those
   blocks instead of storing them again and prefills only the rest of its prompt. Spans no
   live sequence shares stay cached until the host tier needs their room, then are evicted
   least recently used (the latest spans of a chain first): written to the spill file first
   when there is a disk tier (a later match reads them back), else dropped. A block a live
   sequence shares is neither evicted nor spilled. The engine is responsible for its hashes:
   equal hashes must mean equal tokens (and equal hash_tokens). */

/* How many leading tokens of a prompt with this chain the cache holds: k * hash_tokens into
   *tokens, k the longest run hashes[0..k) of cached spans of hash_tokens tokens (0 when
   none; spans in the spill file count). Changes nothing (not even the LRU order), as vLLM's
   get_num_new_matched_tokens. -EINVAL: NULL m or tokens, NULL hashes with n_hashes > 0,
   hash_tokens not a positive multiple of block_tokens, or n_hashes * hash_tokens past
   INT32_MAX. */
KVT_API int kvt_prefix_match(struct kvt_manager *m, const uint64_t *hashes, uint32_t n_hashes,
			     uint32_t hash_tokens, uint32_t *tokens);

/* kvt_seq_create with the prompt's hash chain (n_hashes * hash_tokens <= prompt_tokens). The
   sequence shares the longest cached run, as kvt_prefix_match finds it, but always leaves
   the prompt's last max(1, obs_window) tokens to prefill (only the last token when the
   prefill selects nothing): the engine computes their queries (q_obs) and the last logits,
   and *matched_tokens receives its length: every layer then holds positions
   [0, *matched_tokens) in its host history, and its prefill is of the rest (kvt_prefill_chunk
   from there, or kvt_prefill_layer with the whole layer's tensors). Spans in the spill file
   are read back first, in one batch; where that fails (no host room, an I/O or checksum
   error) the match ends before the span that failed, which is evicted on a checksum error,
   and the call still succeeds. The rest of the chain is remembered, and cached once all
   layers are prefilled (spans already cached by another sequence, or with a block in the
   spill file then, are left out). Errors as kvt_seq_create, and -EINVAL for NULL hashes with
   n_hashes > 0, NULL matched_tokens, hash_tokens not a positive multiple of block_tokens, or
   a chain longer than the prompt; nothing changes on an error. */
KVT_API int kvt_seq_create_prefix(struct kvt_manager *m, uint64_t seq, uint32_t prompt_tokens,
				  const uint64_t *hashes, uint32_t n_hashes, uint32_t hash_tokens,
				  uint32_t *matched_tokens);

/* Prefills positions [pos, pos + n) of one layer of seq, n >= 1: chunked prefill, and the
   prompt's rest after a shared prefix. pos must be the number of the layer's positions in
   the host history (its shared prefix plus its earlier chunks; kvt_seq_info.prefix_tokens
   for the first chunk). k and v are [n_kv_heads][pos + n - kv_from][head_dim]: the rows of
   positions [kv_from, pos + n), kv_from <= pos (kv_from = pos: the chunk alone; 0: the layer
   from its start, as an engine holds it after kvt_seq_load_kv). The chunk's rows are saved
   into the host history. The last chunk (pos + n == prompt_tokens) takes q_obs as
   kvt_prefill_layer does and completes the layer: selection over all the layer's keys, the
   resident set in device frames, block metadata; rows below kv_from come from the host
   history in one gather into a transient device buffer of one layer's K and V (outside
   device_bytes, reused across calls). The result is bit for bit that of kvt_prefill_layer
   with the whole layer. Until its last chunk a layer is not prefilled (decode, recall and
   frame reads refuse it; kvt_seq_load_kv reads it). Errors as kvt_prefill_layer, and -EINVAL
   for n == 0, pos other than the layer's positions so far, pos + n past the prompt, kv_from
   > pos, NULL k or v, or NULL q_obs on a last chunk that selects; nothing changes on an
   error. */
KVT_API int kvt_prefill_chunk(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
			      uint32_t n, uint32_t kv_from, const void *k, const void *v,
			      const void *q_obs, void *stream);

/* Loads the K and V rows of positions [pos, pos + n) of (seq, layer) from the host history
   into k_out and v_out, [n_kv_heads][n][head_dim] of config.dtype in backend memory (device
   pointers on the CUDA backend): the matched prefix (and earlier chunks) that the engine's
   prefill of the rest attends over. One gather queued on stream (FlashH2D on the GPU), after
   the saves of those rows landed; spilled blocks are read back first. Bit-exact with what was
   written. -ENOENT; -EINVAL (NULL pointers, n == 0, layer out of range, positions not in its
   history); -EBADMSG (lost, or a spilled block failed its check); -EIO; -ENOMEM (the host tier
   cannot hold the blocks); -ENOTSUP is never returned: the model backend times the load. */
KVT_API int kvt_seq_load_kv(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
			    uint32_t n, void *k_out, void *v_out, void *stream);

/* ---- Disk tier ------------------------------------------------------------------------ */

/* Reads back, in one batched read, the spilled blocks that the next decode step of the n named
   sequences appends to (each prefilled layer's last block, when the next token goes into
   it), spilling other blocks, least recently used first, to make room. Every call reads the
   blocks it touches itself; an engine calls this ahead of time (kvt_sched_step does, for the
   batch it admits) so that the decode calls find them. Blocks already in the host tier cost
   nothing; without a disk tier it only validates. Blocks read stay placed when others fail.
   Errors: -EINVAL (NULL, n == 0), -ENOENT (not live), -ENOMEM (the host tier cannot hold
   them even after spilling every other block, or no memory for the list), -EIO (an I/O
   failed: those blocks stay on disk and a later call may retry), -EBADMSG (a block's
   CRC-32C did not match, or a sequence was lost before: that sequence's history is lost;
   every later call on it but kvt_seq_destroy and kvt_seq_info fails with -EBADMSG, and no
   other sequence is affected). The last error names the sequence. */
KVT_API int kvt_seq_fetch(struct kvt_manager *m, const uint64_t *seqs, uint32_t n);

/* Writes every host block of seq to the spill file now and frees them in the host tier (an
   engine parking a preempted request; tests), but those it shares with the prefix cache
   (kvt_seq_info.shared_blocks), which stay in the host tier while any sequence holds them. Its
   device frames stay as they are. Nothing to do (0) when it has no host blocks. -ENOENT;
   -ENOTSUP without a disk tier; -ENOSPC when the spill file cannot grow (disk_bytes, a full
   file system or quota, the process's file size limit), once it has dropped the prefix spans
   it held; -EIO when a write failed; -ENOMEM; -EBADMSG when it is lost; a device error
   when waiting for the loads queued on the device failed (nothing written). On -ENOSPC, -EIO
   or -ENOMEM the blocks written before the failure stay on disk and the others in the host
   tier (placement only: nothing is lost, and the next call that touches them fetches them). */
KVT_API int kvt_seq_spill(struct kvt_manager *m, uint64_t seq);

/* ---- Dynamic recall (decode) --------------------------------------------------------- */

/* Scores the host blocks of each of the n sequences for `layer` against its decode queries
   q ([n][n_q_heads][head_dim] of config.dtype, backend memory) with the Quest upper bound
   (per-channel key min/max of the block, maximised over the kv head's query heads), and makes
   the top config.recall_blocks blocks per kv head, among blocks not fully resident through
   sink/top-K/ring, resident in the recall cache, in the (sequence, layer)'s own region: hits
   are reused, misses are loaded in one batched gather, each evicting the least recently used
   block of its region. The call first sizes its members' regions (towards a part of the cache
   in proportion to each one's working set, estimated from its sequence's and its layer's
   totals; frames may be taken from other regions, whose
   views then may read as stale: docs/design.md, "Recall regions"). Ties go to the lower
   block. Replaces each (sequence, layer)'s recall view. Errors found before anything moves
   change nothing: -ENOENT, -EINVAL (NULL, n == 0, repeated id, layer not prefilled, sequence
   preempted, recall disabled), -ENOSPC when the blocks this call needs exceed the frames
   outside its members' regions, -ENOTSUP (backend keeps no block metadata: kvt_decode_recall),
   -EBADMSG for a lost sequence, -ENOMEM (no memory; or, with a disk tier, the blocks whose metadata
   a scored call folds in do not fit the host tier). Spilled blocks the call loads are read back
   after its bookkeeping, in one batch: when that read fails (-EIO, -EBADMSG, -ENOMEM when they do
   not fit the host tier) or the load itself fails (-EIO), the views of the named (sequence, layer)s
   read as stale (-ESTALE) until they are recalled again; frames this call took from other regions
   stay taken, and the working-set estimates keep this call's blocks. On the CUDA backend the
   regions are kept on the device and the call runs there (docs/design.md, "Recall on the
   device"), with the same decisions and errors: it queues its work on `stream` and waits for
   nothing (its counts and figures are read when the layer's next recall call, kvt_manager_stats,
   kvt_manager_sync, a view, kvt_attend, a preemption or a destroy needs them), and a failure
   queueing its load has the effect just described. A call with a member whose layer has
   blocks in the spill file is the exception: it waits for the calls before it and for its own
   work, reads back the spilled blocks its loads need, loads those on `stream` and waits again
   before it returns. When the device fails a call's work (a CUDA
   error found then), the call that finds it fails with that error (-EIO as a rule), that call's
   views read as stale, and every later recall call fails with it: the device's state cannot be
   told. */
KVT_API int kvt_decode_recall(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const void *q, void *stream);

/* As kvt_decode_recall with the selection given instead of scored: blocks is
   [n][n_kv_heads][r] host block indices (a block b holds positions [b * block_tokens, ...));
   UINT32_MAX entries are ignored, as are repeats and blocks fully resident. Serves engines
   with their own scoring, recorded selections and payload-free backends. -EINVAL also for a
   block past the sequence's history or r == 0. */
KVT_API int kvt_recall_blocks(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const uint32_t *blocks, uint32_t r, void *stream);

/* As kvt_recall_blocks with the selection in the backend's device memory (host memory on the
   host, model and null backends): an engine that selects blocks on the GPU (its own sparse
   indexer or scoring) hands its [n][n_kv_heads][r] output over as it lies, read in `stream`'s
   order. On the CUDA backend with the regions on the device (docs/design.md, "Recall on the
   device") the host never reads it: no copy, no wait, host work independent of r. Otherwise a
   device selection is copied to the host first (a wait). Two differences follow from the host
   not reading it, the same on every backend so that each makes the same decisions: the sizing
   counts n_kv_heads * r frames as what each member needs at least (kvt_recall_blocks counts
   the distinct blocks named and not fully resident), and a member whose selection names a
   block past its history is left out where the selection is read: the blocks its region holds
   stay as they were (the call's sizing may have resized the region) and its views are empty and
   stale (-ESTALE, saying why) until it is recalled again, while the other members' recall goes
   on and the call returns 0. The selection is read by the work the call queues on `stream`:
   it must not be written before that work has run (later work on `stream` runs after it). Errors
   otherwise as kvt_recall_blocks: -EINVAL for a NULL m, seqs or blocks, n == 0, r == 0 or a
   selection over UINT32_MAX entries; on the copy, its error. */
KVT_API int kvt_recall_device_blocks(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				     uint32_t n, const uint32_t *blocks, uint32_t r, void *stream);

/* One recalled block of a recall view. */
struct kvt_recall_ref {
	uint64_t frame;	   /* device address: K[block_tokens][head_dim], then V likewise */
	uint32_t block;	   /* host block index: positions block * block_tokens + i */
	uint32_t n_valid;  /* slots i < n_valid hold tokens */
	uint64_t resident; /* bit i set: token i is also resident (sink/top-K/ring): skip it */
};

/* The recall view of (seq, layer, kv_head) from the latest recall call naming (seq, layer),
   ascending block order; the resident masks are as of now. Count and -ENOSPC as for
   kvt_seq_resident_positions; -ESTALE when the call that made the view failed, or a frame of
   the view went to another region since (*n_out has the count). -ENOENT unknown seq; -EINVAL NULL m
   or n_out, NULL out with cap > 0, layer or kv head out of range, layer not prefilled, sequence
   preempted; -EBADMSG its history was lost. With the regions on the device, a view changed there
   since it was last read is read back first (a wait for the device), and that read's error is
   returned. */
KVT_API int kvt_seq_recall_view(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				uint32_t kv_head, struct kvt_recall_ref *out, uint32_t cap,
				uint32_t *n_out);

/* Device addresses of the frames of (seq, layer, kv_head)'s resident set: slot s (docs/design.md:
   sink, ring, then top-K) is row s % block_tokens of frames[s / block_tokens]; *n_slots
   receives how many slots hold tokens (from slot 0). *n_frames receives the frame count; when
   cap is smaller, nothing is written to frames and the call returns -ENOSPC (both counts
   set). -ENOENT unknown seq; -EINVAL NULL m, n_frames or n_slots, NULL frames with cap > 0,
   layer or kv head out of range, layer not prefilled, sequence preempted; -EBADMSG its history
   was lost. */
KVT_API int kvt_seq_frames(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t kv_head,
			   uint64_t *frames, uint32_t cap, uint32_t *n_frames, uint32_t *n_slots);

/* ---- Decode steps -------------------------------------------------------------------- */

/* An engine's decode step names its batch once: kvt_step_begin, then per layer
   kvt_step_append and kvt_step_recall (or kvt_step_recall_blocks, kvt_step_recall_device_blocks),
   then kvt_step_end. The per-layer calls are kvt_decode_append, kvt_decode_recall,
   kvt_recall_blocks and kvt_recall_device_blocks on the step's
   batch, in its order (row i of every tensor is member i), with the same results and errors,
   but they look no sequence up by id: a step costs O(layers) library calls and O(batch)
   lookups. One step is open per manager at a time; the plain calls stay usable beside it (on
   any batch). While a step is open, every recall call (the step's and the plain ones) sizes
   the recall regions by the working sets as counted when the step began; outside a step, each
   call by those counted up to it (docs/design.md, "Recall regions"). A member destroyed while
   the step is open fails the step's next call with -ENOENT, one preempted with -EINVAL, as
   the plain call would; the step stays open (end it and begin one without that member). */

/* Opens a decode step over the n sequences seqs (copied), closing the one open, if any. Each
   must be live, named once and not preempted. With a disk tier the blocks the step's appends
   write (each layer's last block) are read back from the spill file here, in one read
   (kvt_seq_fetch). Errors leave the open step, if any, as it was: -EINVAL (NULL m or seqs,
   n == 0, a repeated id, a preempted sequence), -ENOENT (not live), -EBADMSG (lost), -ENOMEM
   (no memory for the batch), and kvt_seq_fetch's (-ENOMEM, -EIO, -EBADMSG: blocks read stay
   placed). */
KVT_API int kvt_step_begin(struct kvt_manager *m, const uint64_t *seqs, uint32_t n);

/* kvt_decode_append(m, layer, <the step's batch>, k, v, stream); -EINVAL also when no step is
   open. */
KVT_API int kvt_step_append(struct kvt_manager *m, uint32_t layer, const void *k, const void *v,
			    void *stream);

/* kvt_decode_recall(m, layer, <the step's batch>, q, stream); -EINVAL also when no step is
   open. */
KVT_API int kvt_step_recall(struct kvt_manager *m, uint32_t layer, const void *q, void *stream);

/* kvt_recall_blocks(m, layer, <the step's batch>, blocks, r, stream); -EINVAL also when no
   step is open. */
KVT_API int kvt_step_recall_blocks(struct kvt_manager *m, uint32_t layer, const uint32_t *blocks,
				   uint32_t r, void *stream);

/* kvt_recall_device_blocks(m, layer, <the step's batch>, blocks, r, stream); -EINVAL also when
   no step is open. */
KVT_API int kvt_step_recall_device_blocks(struct kvt_manager *m, uint32_t layer,
					  const uint32_t *blocks, uint32_t r, void *stream);

/* Closes the open step: 0; -EALREADY when none is open; -EINVAL on a NULL m. */
KVT_API int kvt_step_end(struct kvt_manager *m);

/* ---- Attention tables: one call per layer ------------------------------------------ */

/* The device tier and the recall cache are one pool of blocks, each holding one kv head's
   rows of one block: block i lies at base + i * block_bytes, its K rows ([block_tokens] rows
   of row_bytes, head_dim elements of config.dtype each) first, its V rows at v_offset. Blocks
   [first_recall, n_blocks) are the recall cache. On the host backend base is host memory;
   on the model and null backends (no payload) it is an address nothing backs. */
struct kvt_pool_info {
	uint64_t base;
	uint64_t n_blocks;
	uint64_t first_recall;
	uint64_t block_bytes;
	uint64_t v_offset;
	uint32_t row_bytes;
	uint32_t block_tokens;
};

/* Fills *out. -EINVAL on a NULL pointer. */
KVT_API int kvt_manager_pool(const struct kvt_manager *m, struct kvt_pool_info *out);

/* One layer's attention inputs for the open step's batch, in buffers the caller owns (host
   memory on the host, model and null backends; device memory on the CUDA backend), with fixed
   strides so that an engine (or a captured CUDA graph) reads them at fixed addresses. Row
   (i, h) is member i of the step and kv head h, at index i * n_kv_heads + h of the [..][H]
   arrays and at (i * n_kv_heads + h) * max_frames (or max_recall) of the others. Pool indices
   are as in struct kvt_pool_info. Attention for row (i, h) runs over:
   - resident tokens: slots s < n_tokens[i][h], slot s being row s % block_tokens of pool block
     frames[i][h][s / block_tokens] (sink, ring, then top-K: docs/design.md);
   - recalled tokens: for j < n_recall[i][h], rows t < recall_tokens[..][j] of pool block
     recall[..][j] whose bit t of recall_skip[..][j] is clear (a set bit: the token is also
     resident, so it is counted there), blocks in ascending history order (those of the latest
     recall call naming the (sequence, layer), as kvt_seq_recall_view). */
struct kvt_attn_tables {
	uint32_t size;	     /* sizeof(struct kvt_attn_tables), set by the caller */
	uint32_t max_batch;  /* rows i < max_batch: the count arrays' rows past the batch read 0 */
	uint32_t max_frames; /* entries per row of frames */
	uint32_t max_recall; /* entries per row of the recall arrays */
	uint32_t *n_batch;   /* [1]: the step's batch size */
	uint32_t *n_tokens;  /* [max_batch][H] */
	uint32_t *frames;    /* [max_batch][H][max_frames]; UINT32_MAX past a row's frames */
	uint32_t *n_recall;  /* [max_batch][H] */
	uint32_t *recall;    /* [max_batch][H][max_recall]; UINT32_MAX past a row's count */
	uint32_t *recall_tokens; /* [max_batch][H][max_recall]; 0 past a row's count */
	uint64_t *recall_skip;	 /* [max_batch][H][max_recall]; 0 past a row's count */
};

/* Writes `layer`'s attention tables of the open step's batch into t's buffers: the counts of
   every row below t->max_batch, the entries of the batch's rows (rows past the batch keep
   their entries). On the CUDA backend the writes are copies queued on `stream` (the source
   is the library's, so nothing must outlive the call); elsewhere they are done when it
   returns. One call replaces n * n_kv_heads calls of kvt_seq_frames and kvt_seq_recall_view,
   and checks what they check. Errors write nothing: -EINVAL (NULL m or t, t->size too small,
   a NULL buffer, no step open, layer out of range, a member preempted or with the layer not
   prefilled), -ENOSPC (the batch exceeds max_batch, a member's frames max_frames, or a view
   max_recall), -ENOENT (a member no longer live), -EBADMSG (a member's history lost),
   -ESTALE (a member's recall view is stale: recall again), -ENOTSUP (a backend whose device
   memory the library cannot write), and the device's errors of reading a view back or of the
   copies (-EIO, -ENOMEM, -ENODEV, -EINVAL). With the recall regions on the device, the views
   changed there since they were last read are read back first, all of the batch's together
   (one wait for the whole device). */
KVT_API int kvt_step_tables(struct kvt_manager *m, uint32_t layer, const struct kvt_attn_tables *t,
			    void *stream);

/* One layer's attention inputs for the open step's batch in FlashInfer's paged-KV format, over
   the pool of struct kvt_pool_info seen as two paged caches: each (member i, kv head h) is one
   request of one kv head (row r = i * n_kv_heads + h; its n_q_heads / n_kv_heads query heads
   are q[i][h * G .. h * G + G), so q [n][n_q_heads][head_dim] is [n * n_kv_heads][G][head_dim]).
   - Resident part, page size block_tokens: row r's pages are indices[indptr[r] ..
     indptr[r + 1]) (pool blocks), the last one holding last_page_len[r] tokens; K pages at
     base + page * block_bytes, V pages at the same plus v_offset, rows row_bytes apart.
   - Recalled part, page size 1, tokens also resident removed: row r's tokens are r_indices[
     r_indptr[r] .. r_indptr[r + 1]), token x's K row at base + x * row_bytes and its V row at
     that plus v_offset (x = block * 2 * block_tokens + row).
   Merge the two parts' outputs by their log-sum-exp. Rows past the batch (up to max_batch *
   n_kv_heads) are empty: their indptr entries repeat, their last_page_len is 0. The arrays are
   int32, in the caller's buffers (host memory on the host, model and null backends, device
   memory on the CUDA backend, where the copies are queued on `stream`). Errors as
   kvt_step_tables's (-ENOSPC when the batch, its pages or its recalled tokens exceed
   max_batch, max_pages or max_tokens), writing nothing. */
struct kvt_paged_tables {
	uint32_t size;		/* sizeof(struct kvt_paged_tables), set by the caller */
	uint32_t max_batch;	/* rows: max_batch * n_kv_heads */
	uint32_t max_pages;	/* entries of indices */
	uint32_t max_tokens;	/* entries of r_indices */
	int32_t *indptr;	/* [max_batch * H + 1] */
	int32_t *indices;	/* [max_pages] */
	int32_t *last_page_len; /* [max_batch * H] */
	int32_t *r_indptr;	/* [max_batch * H + 1] */
	int32_t *r_indices;	/* [max_tokens] */
};

KVT_API int kvt_step_paged(struct kvt_manager *m, uint32_t layer, const struct kvt_paged_tables *t,
			   void *stream);

/* Batched decode attention of `layer` for the n sequences seqs (distinct, live, not
   preempted, the layer prefilled): for member i and query head g (kv head h = g / (n_q_heads /
   n_kv_heads)), out[i][g] = softmax(q[i][g] . K^T / sqrt(head_dim)) V over the tokens the
   attention tables name for (i, h) (its resident set and its latest recall view, each token
   once), accumulated in f32; lse[i][g] (lse may be NULL) = the log-sum-exp of those scaled
   logits (natural log; -INFINITY for no token), so that an engine can merge the result with
   attention it computes elsewhere. q and out are [n][n_q_heads][head_dim] of config.dtype and
   lse [n][n_q_heads] f32, all in backend memory. On the host backend the per-row reference
   runs on the calling thread; on the CUDA backend the call queues the tables' copy and two
   kernels on `stream` (each row's tokens split in parts for a small batch, merged by their
   log-sum-exp) and waits for nothing. Errors change nothing: -EINVAL (NULL m, seqs, q or out, n
   == 0, a repeated id, layer out of range or not prefilled, a member preempted), -ENOENT,
   -EBADMSG, -ESTALE (a member's recall view is stale: recall again), -ENOTSUP (a backend
   without payload), -ENOMEM, and the device's errors (-EIO, -ENOMEM, -ENODEV, -EINVAL). */
KVT_API int kvt_attend_batch(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			     uint32_t n, const void *q, void *out, float *lse, void *stream);

/* kvt_attend_batch(m, layer, <the step's batch>, q, out, lse, stream); -EINVAL also when no
   step is open. */
KVT_API int kvt_step_attend(struct kvt_manager *m, uint32_t layer, const void *q, void *out,
			    float *lse, void *stream);

/* Batched decode attention over attention tables the caller holds (written by kvt_step_tables, read
   where they lie), for an engine that captures its decode step in a CUDA graph: the work depends on
   t's capacities only, never on the batch. Member i < *t->n_batch (read when the work runs;
   min(*n_batch, max_batch) on the host) gets out[i] and lse[i] as kvt_attend_batch gives them over
   the tables' rows: bit for bit on the host backend, within f32 rounding on the CUDA backend, whose
   kernels split a row's tokens into parts by t's capacities here and by the batch's longest row
   there, parts that merge in another order; the rows of members past it are not written. q and out
   are [t->max_batch][n_q_heads][head_dim] of config.dtype, lse [t->max_batch][n_q_heads] f32 or
   NULL, all in backend memory. The tables are read as they are: counts past the capacities are
   clamped to them and blocks outside the pool skipped, so no table makes the call read outside the
   pool; tables written before a call that moves blocks (a recall, an append, a preemption) name the
   old ones. On the CUDA backend the call queues two kernels on `stream` over every row of t's
   capacities, reading n_batch and the counts on the device, and nothing else: no copy, no
   allocation, no wait, so it may be captured in a graph; `scratch` is device memory of at least
   kvt_attend_tables_scratch's bytes, which the kernels use until they finish. On the host backend
   it runs when called and scratch may be NULL. Errors change nothing: -EINVAL (NULL m, t, a buffer,
   q or out; t->size too small; a capacity of 0), -E2BIG (capacities too large for one launch),
   -ENOSPC (scratch NULL or too small on the CUDA backend), -ENOTSUP (a backend without payload),
   -ENOMEM, and the device's errors of the launch (-EIO, -ENODEV, -EINVAL). */
KVT_API int kvt_attend_tables(struct kvt_manager *m, const struct kvt_attn_tables *t, const void *q,
			      void *out, float *lse, void *scratch, uint64_t scratch_bytes,
			      void *stream);

/* Bytes of device scratch kvt_attend_tables needs for tables of t's capacities (its
   pointers are checked, not read): 0 on the host backend. Errors as kvt_attend_tables's
   checks of t. */
KVT_API int kvt_attend_tables_scratch(struct kvt_manager *m, const struct kvt_attn_tables *t,
				      uint64_t *bytes);

/* ---- Scheduler (SparseServe Algorithm 1) ---------------------------------------------- */

/* The scheduler decides, each iteration, which requests run: it reads the manager's memory
   accounting and calls kvt_seq_preempt / kvt_seq_resume, and never moves data otherwise. The
   engine owns sequences: it creates one (kvt_seq_create) before submitting it, executes each
   iteration's batch (prefill layers, decode steps), calls kvt_sched_commit, and destroys
   sequences the scheduler reports completed whenever it is done reading them. One scheduler per
   manager; same thread rules as the manager. */
struct kvt_sched;

#define KVT_SCHED_CONFIG_VERSION 1

struct kvt_sched_config {
	uint32_t size, version;	    /* sizeof(struct kvt_sched_config), KVT_SCHED_CONFIG_VERSION */
	uint32_t max_requests;	    /* R_max: requests per iteration */
	uint32_t max_tokens;	    /* T_max: tokens per iteration (decode tokens plus prefill
				       tokens, a prefilled layer of L tokens counting L/n_layers) */
	uint64_t max_inject_tokens; /* prefill (token x layer) per iteration: B x n_layers matches
				       chunked prefill of chunk B; a lone prefill always gets
				       one layer */
	uint32_t ws_control;	    /* 1: admit only while working sets fit (SparseServe); 0: by
				       R_max/T_max and device frames for resident sets only */
	uint32_t reserved;
	/* The engine's stream (a cudaStream_t): kvt_sched_step queues the loads of the requests
	   it resumes there, ordered before the engine's work on them. NULL: the legacy default
	   stream, which does not order with streams created non-blocking; an engine on such a
	   stream passes it here (or synchronizes after each step). Ignored off the GPU. */
	void *stream;
};

#define KVT_SCHED_CONFIG_INIT                                                                      \
	{                                                                                          \
		.size = sizeof(struct kvt_sched_config), .version = KVT_SCHED_CONFIG_VERSION,      \
		.max_requests = 256, .max_tokens = 8192, .max_inject_tokens = (uint64_t)2048 * 32, \
		.ws_control = 1,                                                                   \
	}

/* Work of one request in an iteration. */
struct kvt_sched_item {
	uint64_t seq;
	uint32_t layer_begin, layer_end; /* prefill layers [begin, end); both 0 for a decode step */
	uint32_t decode;		 /* 1: one decode step (every layer) */
	uint32_t reserved;
};

/* Per-iteration figures. Frames are single-block device frames. */
struct kvt_sched_iter {
	uint64_t iteration;
	uint32_t batch_size; /* items */
	uint32_t n_decode, n_prefill;
	uint32_t admitted;  /* candidates admitted */
	uint32_t reset;	    /* candidates considered and sent back to the queue */
	uint32_t preempted; /* requests whose frames were freed this iteration */
	uint32_t resumed;   /* requests rebuilt from the host history */
	uint32_t completed; /* requests that finished at the previous commit */
	uint64_t prefill_token_layers;
	uint64_t ws_estimate_frames; /* working sets of the admitted requests, as estimated */
	uint64_t ws_touched_frames; /* frames they actually used (resident + recalled), at commit */
	uint64_t blocks_loaded;	    /* recall misses between step and commit */
	uint64_t recall_lookups, recall_hits;
	uint32_t queued; /* requests waiting after admission */
	uint32_t reserved;
};

struct kvt_sched_batch {
	const struct kvt_sched_item *items; /* prefills first, then decodes, FCFS within each */
	uint32_t n_items;
	const uint64_t *completed; /* requests finished at the previous commit (frames freed) */
	uint32_t n_completed;
	/* Requests dropped by this step because their history was lost (a spilled block failed
	   its checksum: kvt_seq_fetch's -EBADMSG). They are no longer scheduled; the engine
	   fails them and destroys their sequences. */
	const uint64_t *failed;
	uint32_t n_failed;
	struct kvt_sched_iter it;
};

/* Creates a scheduler over m. -EINVAL (NULL, a size that is none of struct kvt_sched_config's
   (with or without `stream`), bad version, reserved not 0, zero limits), -ENOMEM. */
KVT_API int kvt_sched_create(struct kvt_manager *m, const struct kvt_sched_config *cfg,
			     struct kvt_sched **out);
/* NULL is a no-op. Leaves the manager's sequences as they are, except that it frees the frames
   of completed requests that kvt_sched_commit could not free (see there). */
KVT_API void kvt_sched_destroy(struct kvt_sched *s);
/* Queues live sequence seq (not prefilled yet) to produce max_new_tokens (>= 1) tokens: the
   first comes from its prefill, each further one from a decode step. -ENOENT (not live),
   -EEXIST (already queued; a request whose sequence the engine has destroyed since, perhaps
   creating another under the id, is forgotten here, as the next step would, and the id is
   then queued or refused as if it never had been), -EINVAL, -E2BIG when the device tier could never
   hold it alone, or, with a disk tier, when one layer of its history (prompt + max_new_tokens)
   would not fit the host tier (what one call may touch). With a disk tier, admission also keeps
   what the batch touches in an iteration within the host tier (per decode, the block each layer's
   token goes to and its recall working set; per prefill, one layer of its prompt), and
   kvt_sched_step reads the blocks the admitted decodes append to back (kvt_seq_fetch)
   before it returns. */
KVT_API int kvt_sched_submit(struct kvt_sched *s, uint64_t seq, uint32_t max_new_tokens);
/* Forms the next iteration's batch (preempting and resuming as needed) into *out, valid until
   the next call on s. Candidates are taken first come, first served; the first one that does
   not fit ends admission. A lone candidate is admitted even when its recall working set
   exceeds the whole recall cache (it could never run otherwise). A request's recall working
   set ages only as it decodes, so a reset request keeps its estimate until it runs again.
   -EBUSY when the previous batch is not committed yet. */
KVT_API int kvt_sched_step(struct kvt_sched *s, struct kvt_sched_batch *out);
/* The engine executed the current batch: advances each request; those that reached their
   max_new_tokens complete (their frames are freed; the sequence stays live for the engine).
   Where the device could not be waited for before freeing them (kvt_seq_preempt failed on the
   CUDA backend), the request completes all the same and the next kvt_sched_step (or
   kvt_sched_destroy) frees them, unless the engine destroyed the sequence first.
   -EINVAL when there is no batch to commit. */
KVT_API int kvt_sched_commit(struct kvt_sched *s);
/* Removes seq from the scheduler now (finished early, or failed): frees its device frames if
   it holds any; the sequence stays live. If the current batch names it, it counts as not
   executed. -ENOENT when not scheduled here. */
KVT_API int kvt_sched_finish(struct kvt_sched *s, uint64_t seq);
/* Requests queued or running (not completed). */
KVT_API uint32_t kvt_sched_pending(const struct kvt_sched *s);
/* Figures of the iteration committed last: the plan figures its step returned plus what only
   commit knows (ws_touched_frames, blocks_loaded, recall_lookups, recall_hits: the manager's
   recall counters between that step and its commit). -EINVAL on NULL, -ENOENT before the first
   commit. */
KVT_API int kvt_sched_last(const struct kvt_sched *s, struct kvt_sched_iter *out);
/* Detail of the latest failed call on s (kvt_sched_submit, kvt_sched_finish, kvt_sched_step,
   kvt_sched_commit): what was refused and why, with the manager's detail where a call of the
   manager's failed ("" when none failed yet; "no scheduler" when s is NULL). Owned by s; valid
   until the next call on s. kvt_sched_create's refusals of a configuration are logged
   (KVT_LOG_WARN) instead. */
KVT_API const char *kvt_sched_last_error(const struct kvt_sched *s);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_H */
