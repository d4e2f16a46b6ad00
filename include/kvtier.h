/* SPDX-License-Identifier: MIT */
/*
 * kvtier: a KV cache manager for long-context LLM serving across GPU memory (device tier),
 * pinned host memory (host tier) and, later, local disk.
 *
 * Every sequence keeps a fixed-size compressed cache on the device (SnapStream: attention-sink
 * tokens, the top-K prompt tokens chosen by a SnapKV observation-window vote, and a ring of the
 * most recent tokens) while every token it ever produced is also written through to the host
 * history, so nothing is lost and any token can be read back bit-exact.
 *
 * Conventions: every fallible call returns 0 or a negative errno (kvt_strerror names it) and
 * changes nothing when it fails; results come back through out-parameters. Tensors are dense,
 * row-major, of config.dtype, in the backend's memory space: host pointers for the host backend,
 * device pointers for the CUDA backend. `stream` is a cudaStream_t or NULL.
 *
 * Threads: a manager and everything reached through it belong to one thread at a time; calls
 * on one manager must not overlap (distinct managers are independent). The library runs its own
 * save threads (config.save_threads) that scatter saved rows into host blocks; they never touch
 * a manager's bookkeeping, and every call that reads the host history waits for the saves it
 * depends on. kvt_log_set and kvt_strerror may be called from any thread.
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
	KVT_BACKEND_CUDA = 2,  /* real GPU (not in this build yet: -ENODEV) */
	KVT_BACKEND_MODEL = 3, /* no payload, timed by a bandwidth model (not yet: -ENOTSUP) */
};

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
	uint64_t staging_bytes; /* size of each of the two staging buffers of the save path */
};

/* Defaults: Llama-3-8B geometry (32 layers, 8 kv heads, 32 q heads, d=128, bf16), 32-token
   blocks, sink 128, recent 512, top-K 4096, observation window 32, pool kernel 7, 1 GiB device,
   4 GiB host, automatic backend, 2 save threads, 2 x 32 MiB staging. */
#define KVT_CONFIG_INIT                                                                           \
	{                                                                                         \
		.size = sizeof(struct kvt_config), .version = KVT_CONFIG_VERSION, .n_layers = 32, \
		.n_kv_heads = 8, .n_q_heads = 32, .head_dim = 128, .block_tokens = 32,            \
		.dtype = KVT_DTYPE_BF16, .sink_tokens = 128, .recent_tokens = 512,                \
		.topk_tokens = 4096, .obs_window = 32, .pool_kernel = 7,                          \
		.device_bytes = (uint64_t)1 << 30, .host_bytes = (uint64_t)4 << 30,               \
		.backend = KVT_BACKEND_AUTO, .save_threads = 2,                                   \
		.staging_bytes = (uint64_t)32 << 20,                                              \
	}

struct kvt_manager;

/* Counters of one manager since its creation. Set .size = sizeof(struct kvt_stats) (or use
   KVT_STATS_INIT) before calling kvt_manager_stats; fields past .size are not written. */
struct kvt_stats {
	uint32_t size, version;
	uint64_t device_frames_total, device_frames_used, device_frames_free;
	uint64_t host_blocks_total, host_blocks_used, host_blocks_free;
	uint64_t bytes_h2d;	  /* host blocks loaded into device frames */
	uint64_t bytes_d2h;	  /* rows saved into the host history, and device reads */
	uint64_t bytes_d2d;	  /* rows written into device frames from the caller's tensors */
	uint64_t tokens_saved;	  /* (layer, token) pairs written to the host history */
	uint64_t tokens_appended; /* (layer, token) pairs appended by decode */
	uint64_t tokens_prompt;	  /* (layer, token) pairs of prefilled prompts */
	uint64_t tokens_resident; /* of those, kept in device frames at prefill (sink+top-K+ring) */
	uint64_t prefill_layers;  /* successful kvt_prefill_layer calls */
	uint64_t decode_calls;	  /* successful kvt_decode_append calls */
	uint64_t saves_submitted; /* save jobs handed to the save path */
	uint32_t live_seqs;
	uint32_t save_threads;
	uint64_t bytes_read; /* rows copied out of device frames by kvt_seq_read_token */
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
   warn) unless kvt_log_set_level overrides it. Process-wide; safe from any thread. */
KVT_API void kvt_log_set(kvt_log_fn fn, void *user);
KVT_API void kvt_log_set_level(enum kvt_log_level level);

/* Static text for an error code (negative or positive errno); never NULL. */
KVT_API const char *kvt_strerror(int err);

/* Validates cfg and creates a manager: allocates both tier arenas, the pools and the save
   threads. Errors: -EINVAL for a NULL pointer, an unknown size/version, geometry that does not
   divide, zero sizes or budgets that overflow the 32-bit block index; -ENOMEM when an arena
   cannot be allocated; -ENODEV when the CUDA backend is asked for and cannot be used;
   -ENOTSUP for the model backend. *out is untouched on failure. */
KVT_API int kvt_manager_create(const struct kvt_config *cfg, struct kvt_manager **out);

/* Waits for pending saves, frees every sequence and both arenas. NULL is a no-op. */
KVT_API void kvt_manager_destroy(struct kvt_manager *m);

/* Detail of the latest failed call on m ("" when none failed yet). Owned by m; valid until
   the next call on m. */
KVT_API const char *kvt_manager_last_error(const struct kvt_manager *m);

/* Copies the effective configuration (backend resolved from AUTO) into *out. -EINVAL on NULL. */
KVT_API int kvt_manager_config(const struct kvt_manager *m, struct kvt_config *out);

/* Fills *out up to out->size. -EINVAL on NULL or out->size smaller than the first two fields. */
KVT_API int kvt_manager_stats(const struct kvt_manager *m, struct kvt_stats *out);

/* Waits until every save handed to the save path so far has landed in the host history and
   every device operation queued on `stream` has completed. */
KVT_API int kvt_manager_sync(struct kvt_manager *m, void *stream);

/* Registers sequence `seq` with a prompt of prompt_tokens (1..INT32_MAX) tokens. Allocates no
   tier memory yet; each kvt_prefill_layer allocates that layer's. -EEXIST if seq is live,
   -EINVAL on a zero or oversized prompt, -ENOMEM. */
KVT_API int kvt_seq_create(struct kvt_manager *m, uint64_t seq, uint32_t prompt_tokens);

/* Waits for the sequence's pending saves, then frees its device frames and host blocks.
   -ENOENT if seq is not live. */
KVT_API int kvt_seq_destroy(struct kvt_manager *m, uint64_t seq);

/* Prefills one layer of `seq`: k, v are [n_kv_heads][prompt_tokens][head_dim] and q_obs is
   [n_q_heads][obs_window][head_dim] (the post-RoPE queries of the last obs_window prompt
   positions; may be NULL when no selection happens: prompt_tokens <= sink + recent or
   topk_tokens == 0, or prompt_tokens <= obs_window). Selects the top-K tokens per kv head
   (SnapKV, DESIGN.md), copies sink, top-K and ring tokens into newly allocated device frames
   and saves the whole layer into the host history. The caller may reuse k, v and q_obs when
   the call returns (after the work queued on `stream`, for the CUDA backend).
   Errors: -ENOENT unknown seq; -EINVAL layer out of range or NULL tensors; -EEXIST layer
   already prefilled; -ENOMEM when either tier cannot hold the layer (nothing is allocated). */
KVT_API int kvt_prefill_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer, const void *k,
			      const void *v, const void *q_obs, void *stream);

/* Appends one new token to each of the n sequences for `layer`: k, v are
   [n][n_kv_heads][head_dim]. Writes each token into its ring slot (overwriting the oldest
   recent token, which stays in the host history) and saves it to the host history. Work per
   sequence is O(1) bookkeeping. All or nothing: errors are -ENOENT for an unknown id, -EINVAL
   for n == 0, NULL pointers, a repeated id or a layer not yet prefilled for some sequence,
   -EOVERFLOW when a sequence would pass INT32_MAX tokens, -ENOMEM when the host tier cannot
   hold the new blocks; the last error names the offending sequence. */
KVT_API int kvt_decode_append(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const void *k, const void *v, void *stream);

/* Positions resident on the device for (seq, layer, kv_head), ascending: sink, top-K and ring.
   *n_out receives the count; when cap is smaller, nothing is written to out, *n_out still
   receives the count and the call returns -ENOSPC. out may be NULL when cap is 0.
   -ENOENT unknown seq; -EINVAL bad layer/head, layer not prefilled, NULL n_out. */
KVT_API int kvt_seq_resident_positions(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				       uint32_t kv_head, int32_t *out, uint32_t cap,
				       uint32_t *n_out);

/* Copies the K and V rows (head_dim elements of config.dtype each) of token `pos` of
   (seq, layer, kv_head) into host memory, from the device frame when resident, else from the
   host history (after waiting for its save). Bit-exact with what was written.
   -ENOENT unknown seq; -EINVAL bad layer/head, pos >= tokens of that layer, NULL pointers. */
KVT_API int kvt_seq_read_token(struct kvt_manager *m, uint64_t seq, uint32_t layer,
			       uint32_t kv_head, uint32_t pos, void *k_out, void *v_out);

/* Number of tokens written to (seq, layer): 0 before its prefill. -ENOENT, -EINVAL. */
KVT_API int kvt_seq_tokens(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t *n_out);

/* Reference decode attention of one sequence and layer over its resident set (plus, once
   recall exists, the blocks recalled for it by the latest recall call): for each query head g
   of kv head h = g / (n_q_heads / n_kv_heads), out[g] = softmax(q[g].K^T / sqrt(head_dim)) V
   over the resident tokens of h, accumulated in f32. q and out are [n_q_heads][head_dim] f32
   in host memory. -ENOENT, -EINVAL (layer not prefilled, NULL pointers). */
KVT_API int kvt_attend(struct kvt_manager *m, uint64_t seq, uint32_t layer, const float *q,
		       float *out);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_H */
