/* SPDX-License-Identifier: MIT */
/*
 * transfer: the internal vtable every backend implements. The manager decides what moves where
 * and hands the backend lists of copies; a backend only moves bytes (and, optionally, runs the
 * policy on its own device). Addresses in lists are absolute (uint64_t) in the memory space the
 * entry names, so one list format serves RAM, device pointers and UVA-mapped host memory.
 */
#ifndef KVT_BACKEND_H
#define KVT_BACKEND_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvtier.h"

#define KVT_BACKEND_OPS_VERSION 9

enum kvt_tier {
	KVT_TIER_DEVICE = 0,
	KVT_TIER_HOST = 1,
};

/* One entry of a copy list: `reps` pieces of `bytes`, piece r from src + r * src_stride to
   dst + r * dst_stride. For saves, src is an offset into the concatenation of the job's
   sources rather than an address. */
struct kvt_xfer {
	uint64_t src, dst;
	uint32_t bytes, reps;
	uint64_t src_stride, dst_stride;
};

/* One sequence of a decode append: where head 0's K row goes in the ring slot's device frame
   and in the host history block. Head h is at + h * head_stride in both tiers; the V row at
   + v_offset from its K row. The source rows are k[i][h], v[i][h] of the batch tensors.
   meta (backends with meta_build only; 0 = none): the device address of the block metadata
   entry (block, kv head 0) the token goes to, bit 0 set when the token starts its block: the
   backend folds the token's K rows into it (kvt_meta_init when bit 0 is set, else
   kvt_meta_add, per kv head; head h's entry at + h * 2 * row_bytes), on the append's stream,
   before the ring write (a failed launch after the fold leaves it repeatable: min and max are
   idempotent). */
struct kvt_append {
	uint64_t dev, host;
	uint64_t meta;
};

struct kvt_append_geom {
	uint32_t n_heads, row_bytes;
	uint64_t head_stride, v_offset;
	enum kvt_dtype dtype; /* of the rows (the metadata fold's) */
	uint32_t head_dim;
};

/* A source of a save: bytes at addr in device memory (caller's tensors). */
struct kvt_save_src {
	uint64_t addr, bytes;
};

/* Figures of the model backend (struct kvt_config's model_* fields; see transfer/model.c). */
struct kvt_model_params {
	double h2d_gbps, d2h_gbps, d2d_gbps; /* GB/s = bytes per ns */
	double fused_eff;		     /* (0, 1]: share of h2d a fused gather reaches */
	uint32_t call_ns, launch_ns;	     /* one DMA copy call; one kernel launch */
	uint32_t fused;			     /* 1: fused gather kernel; 0: a DMA per piece */
};

/* Transfer figures of a backend for kvt_stats (the CUDA backend's; zero elsewhere). */
struct kvt_be_stats {
	uint64_t h2d_kernel_launches; /* gathers run as the fused kernel (FlashH2D) */
	uint64_t h2d_dma_batches;     /* gathers run as one cudaMemcpyBatchAsync */
	uint32_t calibrated;	      /* 1: gather_min was measured at create */
	uint32_t gather_min[3];	      /* per piece-size class (<= 4 KiB, <= 16 KiB, larger): the
					 fewest pieces the kernel takes; UINT32_MAX: DMA only */
	uint64_t region_ns;    /* device time of the timed lane programs (kvt_region_run.time)
				  whose fences were waited for: from an event before the first
				  stage to the fence */
	uint64_t region_timed; /* those programs */
	uint64_t runtime_ns;   /* host time inside the CUDA runtime's calls, counted only with
				  KVTIER_CUDA_TIME_CALLS=1 (with the fake runtime, its synchronous
				  kernels' CPU work included) */
};

struct kvt_snapkv;
struct kvt_attend_rows;
struct kvt_attn_desc;
struct kvt_gpu_quest;

/* One copy between host memory and the backend's device memory (region_run). */
struct kvt_dcopy {
	uint64_t dev; /* device address */
	void *host;   /* host memory (any) */
	uint64_t bytes;
};

/* The parts of a region program, in the order region_run queues them. */
enum kvt_region_stage {
	KVT_RS_UPLOAD,
	KVT_RS_GROUPS,
	KVT_RS_CLEAR,
	KVT_RS_DROP,
	KVT_RS_GROW,
	KVT_RS_SELECT,
	KVT_RS_RECALL,
	KVT_RS_GATHER,
	KVT_RS_EMPTY,
	KVT_RS_READ,
	KVT_RS_END
};

/* A program of recall-region work on the device (region_run; policy/gpu.h "recall regions").
   Every uint64_t is a device address (in memory of dmem_alloc), written by the uploads or
   earlier work; each array of descriptors is of struct kvt_gpu_region. A part with a count of
   0 is skipped. */
struct kvt_region_run {
	const struct kvt_dcopy *up; /* host -> device, first */
	uint32_t n_up;
	/* kvt_gpu_region_groups(group_at, group_val, n_groups); written by the recall's launch
	   instead (kvt_gpu_region_recall_groups) when the run queues the recall of n > 0 members */
	uint64_t group_at, group_val;
	uint32_t n_groups;
	/* kvt_gpu_region_clear(clear_rg, clear_gone, clear_off, stack) */
	uint64_t clear_rg, clear_gone, clear_off;
	uint32_t n_clear;
	/* kvt_gpu_region_drop(drop_rg, drop_k, drop_off, NULL, stack, drop_gone) */
	uint64_t drop_rg, drop_k, drop_off, drop_gone;
	uint32_t n_drop;
	/* kvt_gpu_region_grow(grow_rg, grow_n, stack, grow_off) */
	uint64_t grow_rg, grow_n, grow_off;
	uint32_t n_grow;
	uint64_t stack; /* the free-frame stack */
	/* The recall of n members: with qs, the Quest selection of their queries q (device) writes
	   sel ([n][n_heads][r]) first, as the quest op (qs: device array of n kvt_gpu_quest);
	   then kvt_gpu_region_recall(rg) (with the group entries above) and
	   kvt_gpu_region_gather(rg, block_bytes, frame_base, missing, fresh). */
	uint64_t rg, qs, sel, missing, fresh;
	uint32_t n;
	const void *q;
	enum kvt_dtype dt;
	uint32_t head_dim, g_count, n_heads, lbt, r;
	uint64_t block_bytes, frame_base;
	/* kvt_gpu_region_empty(empty_rg over n_empty_rg descriptors, empty_pairs) */
	uint64_t empty_rg, empty_pairs;
	uint32_t n_empty_rg, n_empty;
	const struct kvt_dcopy *rd; /* device -> host, last */
	uint32_t n_rd;
	uint32_t start, stop; /* the stages run: [start, stop), stop 0 = to the end */
	/* 0: region_run waits for stream at the end. k > 0: it does not; lane k's fence
	   (region_wait) is the end of this program, whose uploads and reads must then be in lane
	   k's pinned buffer (region_host). */
	uint32_t lane;
	/* with lane k > 0: the program's span on the device is timed (an event before its first
	   stage, read with its fence by region_wait: region_ns, region_timed); two runtime calls
	   more, so the manager times a sample of its calls */
	bool time;
};

struct kvt_backend_params {
	uint32_t save_threads;
	uint64_t staging_bytes;
	struct kvt_model_params model; /* read by the model backend only */
};

/* Backend flags. */
#define KVT_BE_DEVICE_CPU_READABLE (1u << 0) /* device arena and caller tensors are CPU memory */
#define KVT_BE_NO_PAYLOAD (1u << 1)	     /* moves no bytes (accounting/timing only) */

/* Directions of a transfer, for modelled costs. */
enum kvt_dir {
	KVT_DIR_H2D = 0, /* host blocks -> device frames (gather_h2d) */
	KVT_DIR_D2H = 1, /* device -> host (save, the save of append, read_d2h) */
	KVT_DIR_D2D = 2, /* device -> device (copy_d2d, the ring writes of append) */
	KVT_DIR_COUNT = 3,
};

/* Modelled cost of one direction's transfers so far: the model backend adds every successful
   call's figures; every other backend leaves them zero. */
struct kvt_be_cost {
	uint64_t ns;	/* sum of the calls' times, each rounded to the nearest ns */
	uint64_t bytes; /* payload bytes the calls described */
	uint64_t calls; /* host-side calls: DMA copy calls plus kernel launches */
};

/* The common head of every backend instance; implementations embed it first and allocate it
   zeroed. */
struct kvt_be {
	const struct kvt_backend_ops *ops;
	uint32_t flags;
	struct kvt_be_cost cost[KVT_DIR_COUNT];
	char err[256]; /* detail of the latest failure, copied into the manager's last error */
};

struct kvt_backend_ops {
	uint32_t version; /* KVT_BACKEND_OPS_VERSION */
	const char *name;

	int (*create)(const struct kvt_backend_params *p, struct kvt_be **out);
	void (*destroy)(struct kvt_be *b);

	/* One arena per tier: device frames, host blocks (host-addressable for every backend that
	   carries payload; mapped for the GPU where there is one). *base is the arena address. */
	int (*arena_alloc)(struct kvt_be *b, enum kvt_tier tier, uint64_t bytes, uint64_t *base);
	/* Cannot fail: waits for the device work that may still use the arena, then frees it. */
	void (*arena_free)(struct kvt_be *b, enum kvt_tier tier, uint64_t base, uint64_t bytes);

	/* Device -> device copies (caller tensors into frames, frame to frame). */
	int (*copy_d2d)(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream);

	/* Host blocks -> device frames (FlashH2D on the GPU: one fused gather). */
	int (*gather_h2d)(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream);

	/* Host blocks -> memory outside the arenas (the caller's tensors, the scratch buffer),
	   as gather_h2d: kvt_seq_load_kv, and the prefix of a chunked prefill's last chunk. */
	int (*load_h2d)(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream);

	/* A device buffer of at least bytes owned by the backend (a chunked prefill assembles
	   one layer there), reused across calls: *addr is valid until the next scratch call or
	   destroy. A buffer it outgrew must outlive the device work queued on it: the CUDA
	   backend keeps it until destroy (at most twice the largest request in all), the host
	   backend, synchronous, frees it at once. 0 or -ENOMEM (the old buffer stays). */
	int (*scratch)(struct kvt_be *b, uint64_t bytes, uint64_t *addr);

	/* Saves device rows into host blocks (FlashD2H): one contiguous copy of the sources into
	   a staging buffer, then the save threads scatter x (src = offsets into the sources).
	   *ticket identifies the save for save_wait. The sources may be reused when the call
	   returns (stream-ordered on a GPU); the destinations are written asynchronously. */
	int (*save)(struct kvt_be *b, const struct kvt_save_src *src, uint32_t n_src,
		    const struct kvt_xfer *x, uint32_t n, void *stream, uint64_t *ticket);

	/* A decode step of one layer: writes each sequence's rows into its ring slot (device)
	   and saves them to its host block, as copy_d2d plus save would, with O(1) description
	   per sequence. k, v: [n][n_heads][row]. */
	int (*append)(struct kvt_be *b, uint64_t k, uint64_t v, uint32_t n,
		      const struct kvt_append *a, const struct kvt_append_geom *g, void *stream,
		      uint64_t *ticket);

	/* Blocks until every save with a ticket <= ticket has landed in host memory. -EIO when
	   one of them was lost (an asynchronous staging copy failed): every later wait that
	   covers it fails too, waits for earlier tickets do not. */
	int (*save_wait)(struct kvt_be *b, uint64_t ticket);

	/* Optional (NULL: no device events): records into event (a cudaEvent_t) the point after
	   every save queued so far has left the device (the copies into the staging buffers, on
	   the backend's side stream). */
	int (*save_event)(struct kvt_be *b, void *event);

	/* Synchronous device -> host read of bytes at src into dst (host memory), after the work
	   queued on stream (the bytes' writer's); NULL: after all the device's work (the bytes
	   may have been written on any stream). */
	int (*read_d2h)(struct kvt_be *b, void *dst, uint64_t src, uint64_t bytes, void *stream);

	/* Optional (NULL: one read_d2h each): read_d2h(dst, src, bytes, NULL) of every piece of
	   x (src device addresses, dst host memory, reps 1), after one wait for the whole device,
	   the pieces moved together (the CUDA backend: one gather into pinned memory, then one
	   wait). On an error the destinations' contents are unspecified. */
	int (*read_many)(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n);

	/* Waits for the work queued on stream (NULL: the backend's default stream). */
	int (*sync)(struct kvt_be *b, void *stream);

	/* ---- Optional (NULL): the policy on the backend's own device. A backend whose device
	   tier is CPU-readable leaves them NULL and the manager runs policy/ on the CPU. ---- */

	/* SnapKV selection of one prefill layer, as kvt_snapkv_select: k and q_obs in device
	   memory, out (n_kv_heads x count positions) in host memory when the call returns. */
	int (*select)(struct kvt_be *b, const struct kvt_snapkv *p, const void *k,
		      const void *q_obs, int32_t *out, void *stream);

	/* Block metadata of one prefill layer (k [n_heads][L][head_dim] in device memory), as
	   kvt_meta_build per (block, head), into host memory meta [nb][n_heads][2][head_dim]. */
	int (*block_meta)(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
			  uint32_t L, uint32_t block_tokens, const void *k, void *meta,
			  void *stream);

	/* Reference decode attention of n_heads kv heads over device rows, as kvt_attend_rows per
	   head: head h uses seg[seg_off[h] .. seg_off[h + 1]) (host arrays; rows at device
	   addresses); q and out are [n_heads * g_count][head_dim] f32 in host memory. Waits for
	   all device work first (the rows may have been written on any stream). */
	int (*attend)(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
		      uint32_t g_count, const struct kvt_attend_rows *seg, const uint32_t *seg_off,
		      const float *q, float *out);

	/* Batched decode attention of one layer over tables in device memory (d's arrays; d
	   itself is host memory), as kvt_gpu_attend_batch: q, out [n][n_kv_heads * g_count]
	   [head_dim] of dt and lse [n][n_kv_heads * g_count] f32 (NULL: not written) in device
	   memory, scratch kvt_gpu_attend_batch_scratch bytes of device memory for `splits`;
	   queued on stream. With dmem_alloc. */
	int (*attend_batch)(struct kvt_be *b, enum kvt_dtype dt, const struct kvt_attn_desc *d,
			    const void *q, void *out, float *lse, uint64_t scratch, uint32_t splits,
			    void *stream);

	/* ---- Optional (NULL), all five or none: block metadata kept on the backend's device and
	   Quest scoring there (the CUDA backend). The manager then keeps each (sequence, layer)'s
	   metadata and top-K counts in device memory of dmem_alloc, builds it with meta_build at
	   prefill, folds decode tokens in through append's meta, and scores with quest. Device
	   addresses are uint64_t. ---- */

	/* bytes of device memory (256-byte aligned), zero-filled on stream before any work queued
	   there after the call. 0 or -ENOMEM. */
	int (*dmem_alloc)(struct kvt_be *b, uint64_t bytes, void *stream, uint64_t *addr);
	/* Gives back what dmem_alloc returned (0: nothing), once the device's work queued so far
	   (on any stream) is done; does not wait for it. Cannot fail. */
	void (*dmem_free)(struct kvt_be *b, uint64_t addr);
	/* Copies bytes to device memory at dst on stream: from device memory at src, or, when
	   src_host is not NULL, from host memory src_host (any memory; reusable when the call
	   returns). */
	int (*dmem_copy)(struct kvt_be *b, uint64_t dst, uint64_t src, const void *src_host,
			 uint64_t bytes, void *stream);
	/* Block metadata of one prefill layer, as block_meta, into device memory at meta (queued
	   on stream; no wait). */
	int (*meta_build)(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
			  uint32_t L, uint32_t block_tokens, const void *k, uint64_t meta,
			  void *stream);
	/* Quest selection of n (sequence, layer)s, as kvt_gpu_quest_select over the descriptors qs
	   (host array; device pointers) and the queries q (device): sel ([n][n_heads][r], host
	   memory) holds the result when the call returns (it waits for stream). Within the
	   kernel's limits (policy/gpu.h), which the manager checks at create. */
	int (*quest)(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
		     uint32_t g_count, uint32_t lbt, uint32_t r, const struct kvt_gpu_quest *qs,
		     uint32_t n, const void *q, uint32_t *sel, void *stream);

	/* ---- Optional (NULL), with the five above, all four or none: recall regions kept on the
	   device. ----
	   Queues the program's stages [start, stop) on stream in the order of enum
	   kvt_region_stage (uploads, group entries, clears, drops, grows, selection, recall,
	   gather, empties, reads) and waits for stream: the reads are in host memory when it
	   returns. 0, or the first error, with *done the stage that failed to be queued (the stages
	   before it were queued, and have run when the wait worked; it and those after it were
	   not), or KVT_RS_END when the wait failed. */
	int (*region_run)(struct kvt_be *b, const struct kvt_region_run *r, void *stream,
			  uint32_t *done);
	/* With a lane (r->lane > 0) region_run waits for nothing when every stage was queued: the
	   reads land when the device gets there. Whatever the stream, a program runs after the
	   one queued before it (the backend orders them). */
	/* Lane k's pinned host buffer (k >= 1) of at least bytes: *host, valid until the next
	   region_host call of the lane or destroy. Growing it first waits for the lane's fence;
	   its contents are then lost. 0 or -ENOMEM. */
	int (*region_host)(struct kvt_be *b, uint32_t lane, uint64_t bytes, void **host);
	/* Waits for lane k's fence (its latest program; none: returns at once): 0, or the error
	   of the device's work (a program that failed on the device; its reads did not land). */
	int (*region_wait)(struct kvt_be *b, uint32_t lane);
	/* Orders work the manager queues on stream outside the programs (a copy of a region's
	   tables into larger ones) with the programs, whatever their streams. before = true,
	   ahead of that work: it runs after the latest program. before = false, behind it: the
	   next program runs after stream's work so far. 0, or the error (nothing ordered: the
	   caller gives up what it queued). */
	int (*region_order)(struct kvt_be *b, void *stream, bool before);

	/* Transfer figures for kvt_stats. */
	void (*stats)(struct kvt_be *b, struct kvt_be_stats *out);
};

/* The backend for a kvt_backend value (AUTO resolved; AUTO never picks the model backend), or
   NULL with *err set to -ENODEV when it is not available in this build or on this machine,
   -EINVAL for an unknown value. */
const struct kvt_backend_ops *kvt_backend_find(enum kvt_backend which, enum kvt_backend *resolved,
					       int *err);

extern const struct kvt_backend_ops kvt_backend_host_ops;
/* Moves no payload: every op succeeds after validating its arguments. Used by benchmarks to
   measure the manager's own bookkeeping apart from the copies; not selectable from the API. */
extern const struct kvt_backend_ops kvt_backend_null_ops;
/* Moves no payload and times every call with a bandwidth + per-call model (transfer/model.c),
   adding it to kvt_be.cost; checks every address against its fake arenas. KVT_BACKEND_MODEL. */
extern const struct kvt_backend_ops kvt_backend_model_ops;

/* Records a formatted detail in b->err; returns err so a caller can `return kvt_be_fail(...)`. */
int kvt_be_fail(struct kvt_be *b, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif /* KVT_BACKEND_H */
