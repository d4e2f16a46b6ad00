/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend (plugin libkvtier-cuda.so; see plugin.h for how libkvtier finds it).
 *
 * - Device tier: one cudaMalloc of the configured budget, carved into frames by the manager.
 * - Host tier: one cudaHostAlloc, mapped and portable, so kernels read host blocks over UVA;
 *   preferred on the GPU's NUMA node when sysfs names one. Variable-size pinned allocations
 *   (staging buffers, piece lists) come from a private jemalloc arena whose extent hooks hand
 *   out cudaHostAlloc memory.
 * - FlashH2D (gather_h2d): the piece list goes to the device in one small copy and one launch of
 *   the fused gather kernel (cuda_gather.cu) moves every piece; small gathers, where the
 *   start-up calibration found DMA faster, go out as one cudaMemcpyBatchAsync instead.
 * - FlashD2H (save, append): one cudaMemcpyAsync per source of the contiguous new rows into a
 *   device staging buffer on the caller's stream (in its order: the sources may be reused
 *   after it), then one copy from there into a pinned staging buffer (two of each, ping-pong,
 *   the pinned ones owned by the save pool) on the backend's side stream, ordered by events, so
 *   that the caller's next kernels do not wait behind PCIe; an event per buffer, and the save
 *   threads wait for that event and scatter into host blocks while the GPU goes on.
 * - The policy on the device: SnapKV selection, block metadata and the reference attention
 *   (policy/snapkv.cu, recall.cu, attend.cu), so a prefill layer's K never leaves the GPU.
 *
 * Every CUDA error becomes a negative errno with the CUDA text in the backend's err; injected
 * faults (KVT_FAULT_CUDA) replace a call by cudaErrorUnknown before it runs, and those of a save
 * thread's staging wait (KVT_FAULT_STAGE) its result by cudaErrorLaunchFailure. Nothing aborts.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <jemalloc/jemalloc.h>

#include "cuda_be.h"
#include "gpu.h"
#include "policy.h"

/* Piece lists in flight: a call takes the next slot and waits, on the host, for the kernel
   that used it LIST_SLOTS list-using calls before (one per layer for decode appends), so this
   bounds how far the CPU can run ahead of the GPU. */
#define LIST_SLOTS 16
#define ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))

const struct kvt_plugin_host *kvt_cuda_host;

/* A device buffer that only grows. The buffers it outgrew stay allocated until it is freed
   (`old`): cudaFree waits for the whole device, the serving engine's own kernels included,
   which a call that only needs a larger buffer must not do. Capacities only ever double (a
   failed growth keeps the old buffer), so the outgrown ones add up to less than `cap` and
   number fewer than the bits of a size_t. */
struct dev_buf {
	void *p;
	size_t cap;
	uint8_t n_old;
	void *old[8 * sizeof(size_t)];
};

/* A piece list (or row address list) in flight: written into pinned host memory (`host`, of
   dev.cap bytes), copied to the device, read by a kernel; `done` fires when the kernel that
   read it has finished. Capacities start at 4 KiB (under 2 MiB of outgrown device buffers a
   slot for 65536 pieces). */
struct list_slot {
	void *host;
	struct dev_buf dev;
	cudaEvent_t done;
	bool recorded;
};

struct pinned_region {
	void *base;
};

struct cuda_backend {
	struct kvt_be base;
	extent_hooks_t hooks; /* the pinned arena's; jemalloc hands back its address */
	int device, numa_node;
	uint32_t gather_ctas, copy_ctas;

	unsigned arena;
	bool arena_live;
	pthread_mutex_t reg_lock;
	struct pinned_region *reg;
	size_t n_reg, cap_reg;

	struct kvt_savepool *sp;
	/* Per staging buffer: a device twin (dstage) the caller's stream fills (in_ready), and
	   the copy from it into the pinned buffer on the side stream (stage_done). */
	void *dstage[2];
	cudaEvent_t in_ready[2], stage_done[2];
	cudaStream_t side;	  /* the saves' device-to-host copies (non-blocking) */
	cudaStream_t save_stream; /* stream of the save being submitted (owner thread only) */
	/* The CUDA error of the first failed wait of a save thread, for save_wait's message. An
	   event wait fails on a broken context (an earlier kernel fault): the saves after it fail
	   too, while those that landed before it stay readable (the pool fails the waits that
	   cover a lost chunk only). */
	atomic_int save_cuerr;

	struct list_slot slot[LIST_SLOTS];
	uint32_t next_slot;

	void *rd; /* read_many's pinned buffer (rd_cap bytes), grown as needed */
	size_t rd_cap;
	struct kvt_xfer *rd_x; /* its gather list (rd_n entries) */
	size_t rd_n;

	void *dev_arena, *host_arena;
	uint64_t host_lo, host_hi; /* host arena range, for address translation */
	int64_t host_delta;	   /* device address - host address of the host arena */

	/* Device scratch of the policy ops, from 1 MiB: the first prefill of a longer prompt than
	   any before grows it without waiting for the whole device. */
	struct dev_buf io;
	struct dev_buf layer;  /* the scratch buffer of a chunked prefill's last chunk */
	void **b_dst, **b_src; /* cudaMemcpyBatchAsync arrays */
	size_t *b_size;
	size_t b_cap;

	struct kvt_cuda_calib calib;
	uint64_t kernel_launches, dma_batches;

	/* The manager's device tables (dmem_alloc): from a memory pool of the backend's own,
	   allocated in stream order (cudaMallocFromPoolAsync: no cudaMalloc, which may wait, on
	   the decode path) and kept by the pool once given back; NULL where the device has no
	   pools or the pool could not be made: cudaMalloc. */
	cudaMemPool_t tpool;
	/* Tables given back by dmem_free: work still queued may read them, so they are freed at
	   the next device-wide wait of sync, or after one when an allocation fails, when
	   GRAVE_MAX have gathered, or at destroy. */
	void **grave;
	size_t n_grave, cap_grave;

	/* region_run's lanes (index k - 1 for lane k): a pinned buffer, the fence of the lane's
	   latest program; and the event that ends the latest program of any lane or the latest
	   copy of a region's tables (rr_last: that lane's fence, or rr_done), and the id of its
	   stream (cudaStreamGetId), which the next program waits for when it is queued on another
	   stream. By id, not by handle: a stream made after one was destroyed may get its handle,
	   and cudaStreamPerThread names another stream on each thread. */
	struct lane {
		void *host;
		uint64_t cap;
		cudaEvent_t start, done; /* the program's span (region_ns) when timed */
		bool fenced;
		bool timed; /* the fenced program recorded start */
	} * lane;
	uint64_t region_ns, region_timed;
	bool time_calls;		  /* KVTIER_CUDA_TIME_CALLS=1: CU times the calls */
	atomic_uint_least64_t runtime_ns; /* their host time so far (cu_end) */
	uint32_t n_lane;
	cudaEvent_t rr_done, rr_last;
	unsigned long long rr_stream;
	bool rr_fenced;
};

#define GRAVE_MAX 4096

/* ---- Errors ----------------------------------------------------------------------------- */

static int be_fail(struct kvt_be *b, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int be_fail(struct kvt_be *b, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->err, sizeof(b->err), fmt, ap);
	va_end(ap);
	return err;
}

static int errno_of(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidResourceHandle:
	case cudaErrorInvalidPitchValue:
		return -EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorDevicesUnavailable:
	case cudaErrorCallRequiresNewerDriver:
		return -ENODEV;
	default:
		return -EIO;
	}
}

/* 0, or the errno of e with "what: CUDA's text" recorded. */
static int cu_result(struct cuda_backend *cb, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	return be_fail(&cb->base, errno_of(e), "%s: %s (%s)", what, cudaGetErrorString(e),
		       cudaGetErrorName(e));
}

/* With KVTIER_CUDA_TIME_CALLS=1 (cb->time_calls), the host time of every call CU makes counts
   in cb->runtime_ns (kvt_be_stats.runtime_ns): the runtime's share of the host's time, which
   kvtier-bench recall --backend cuda prints apart. cu_t0: the calling thread's call's start. */
static _Thread_local uint64_t cu_t0;

static inline uint64_t cu_clock(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void cu_begin(const struct cuda_backend *cb)
{
	if (cb->time_calls)
		cu_t0 = cu_clock();
}

static inline cudaError_t cu_end(struct cuda_backend *cb, cudaError_t e)
{
	if (cb->time_calls)
		atomic_fetch_add_explicit(&cb->runtime_ns, cu_clock() - cu_t0,
					  memory_order_relaxed);
	return e;
}

/* Runs a CUDA call unless fault injection says this hit fails (then the call never runs), timed
   when asked (cu_begin, then the call as cu_end's argument). */
#define CU(cb, expr, what)                                                                         \
	(cu_begin(cb),                                                                             \
	 cu_result((cb),                                                                           \
		   cu_end((cb), kvt_cuda_host->fault(KVT_FAULT_CUDA) ? cudaErrorUnknown : (expr)), \
		   (what)))

/* ---- The pinned jemalloc arena ------------------------------------------------------------ */

static struct cuda_backend *of_hooks(extent_hooks_t *h)
{
	return (struct cuda_backend *)((char *)h - offsetof(struct cuda_backend, hooks));
}

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
			bool *zero, bool *commit, unsigned arena_ind)
{
	struct cuda_backend *cb = of_hooks(h);
	size_t extra = alignment > 4096 ? alignment : 0;
	uintptr_t a;
	void *p;

	(void)arena_ind;
	if (new_addr) /* only fresh memory can be pinned */
		return NULL;
	pthread_mutex_lock(&cb->reg_lock);
	if (cb->n_reg == cb->cap_reg) {
		size_t cap = cb->cap_reg ? 2 * cb->cap_reg : 16;
		void *r = realloc(cb->reg, cap * sizeof(*cb->reg));

		if (!r)
			goto fail;
		cb->reg = r;
		cb->cap_reg = cap;
	}
	if (cudaHostAlloc(&p, size + extra, cudaHostAllocMapped | cudaHostAllocPortable) !=
	    cudaSuccess)
		goto fail;
	cb->reg[cb->n_reg++].base = p;
	pthread_mutex_unlock(&cb->reg_lock);
	a = ALIGN_UP((uintptr_t)p, alignment ? alignment : 1);
	if (*zero)
		memset((void *)a, 0, size);
	*commit = true;
	return (void *)a;
fail:
	pthread_mutex_unlock(&cb->reg_lock);
	return NULL;
}

/* Pinned extents are never handed back one by one (opt out: jemalloc retains and reuses them);
   the backend frees every region at destroy, after the arena is gone. */
static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed,
			unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
	return true;
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed,
			 unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)committed, (void)arena_ind;
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
			unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)offset, (void)length, (void)arena_ind;
	return false; /* pinned memory is always committed */
}

static bool hook_decommit(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
			  unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)offset, (void)length, (void)arena_ind;
	return true; /* refused: it stays committed */
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
		       bool committed, unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)size_a, (void)size_b, (void)committed,
		(void)arena_ind;
	return false; /* extents are never freed one by one, so any split is fine */
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
		       bool committed, unsigned arena_ind)
{
	(void)h, (void)addr_a, (void)size_a, (void)addr_b, (void)size_b, (void)committed,
		(void)arena_ind;
	/* Refused: two cudaHostAlloc regions may happen to be adjacent, and a buffer spanning
	   both is not one pinned allocation for the copy engines. */
	return true;
}

static int pinned_arena_create(struct cuda_backend *cb)
{
	extent_hooks_t *hp = &cb->hooks;
	size_t sz = sizeof(cb->arena);

	cb->hooks = (extent_hooks_t){
		.alloc = hook_alloc,
		.dalloc = hook_dalloc,
		.destroy = hook_destroy,
		.commit = hook_commit,
		.decommit = hook_decommit,
		.split = hook_split,
		.merge = hook_merge,
	};
	if (mallctl("arenas.create", &cb->arena, &sz, &hp, sizeof(hp)) != 0)
		return be_fail(&cb->base, -ENOMEM, "cannot create the pinned jemalloc arena");
	cb->arena_live = true;
	return 0;
}

static void pinned_arena_destroy(struct cuda_backend *cb)
{
	char name[64];

	if (cb->arena_live) {
		snprintf(name, sizeof(name), "arena.%u.destroy", cb->arena);
		mallctl(name, NULL, NULL, NULL, 0);
		cb->arena_live = false;
	}
	for (size_t i = 0; i < cb->n_reg; i++)
		cudaFreeHost(cb->reg[i].base);
	free(cb->reg);
	cb->reg = NULL;
	cb->n_reg = cb->cap_reg = 0;
}

static void *pinned_alloc(void *actx, size_t bytes)
{
	struct cuda_backend *cb = actx;

	if (!cb->arena_live || bytes == 0 || kvt_cuda_host->fault(KVT_FAULT_ALLOC))
		return NULL;
	return mallocx(bytes, MALLOCX_ARENA(cb->arena) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(4096));
}

static void pinned_free(void *actx, void *p, size_t bytes)
{
	(void)actx;
	(void)bytes;
	if (p)
		dallocx(p, MALLOCX_TCACHE_NONE);
}

/* ---- NUMA: the host arena on the GPU's node ---------------------------------------------- */

#ifndef MPOL_DEFAULT
#define MPOL_DEFAULT 0
#define MPOL_PREFERRED 1
#endif

static int gpu_numa_node(int device)
{
	char bus[32], path[128];
	int node = -1;
	FILE *f;

	if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess)
		return -1;
	for (char *c = bus; *c; c++)
		*c = (char)(*c >= 'A' && *c <= 'F' ? *c - 'A' + 'a' : *c);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", bus);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &node) != 1)
		node = -1;
	fclose(f);
	return node;
}

/* Prefers node for the pages this thread faults in next (cudaHostAlloc pins, so touches, them
   in the calling thread); -1 restores the default. Best effort: a refusal only costs locality. */
static void prefer_node(int node)
{
	unsigned long mask[16] = {0};

	if (node < 0 || node >= (int)(8 * sizeof(mask))) {
		syscall(SYS_set_mempolicy, MPOL_DEFAULT, NULL, 0);
		return;
	}
	mask[node / (8 * sizeof(mask[0]))] |= 1ul << (node % (8 * sizeof(mask[0])));
	syscall(SYS_set_mempolicy, MPOL_PREFERRED, mask, 8 * sizeof(mask));
}

/* ---- Growing device buffers --------------------------------------------------------------- */

/* The capacity a buffer of cap bytes doubles to, from `first` when it has none yet, to hold
   bytes; 0 on overflow. */
static size_t grow_cap(size_t cap, size_t first, size_t bytes)
{
	if (!cap)
		cap = first;
	while (cap < bytes) {
		if (cap > SIZE_MAX / 2)
			return 0;
		cap *= 2;
	}
	return cap;
}

/* The capacity b doubles to (grow_cap). */
static size_t dev_buf_cap(const struct dev_buf *b, size_t first, size_t bytes)
{
	return grow_cap(b->cap, first, bytes);
}

/* Makes a new cudaMalloc of cap bytes b's buffer, keeping the one it replaces; a failure
   changes nothing. */
static int dev_buf_grow(struct cuda_backend *cb, struct dev_buf *b, size_t cap, const char *what)
{
	void *p;
	int err = CU(cb, cudaMalloc(&p, cap), what);

	if (err)
		return err;
	if (b->p)
		b->old[b->n_old++] = b->p;
	b->p = p;
	b->cap = cap;
	return 0;
}

/* Frees b's buffer and those it outgrew (cudaFree: after the whole device's work). */
static void dev_buf_free(struct dev_buf *b)
{
	if (b->p)
		cudaFree(b->p);
	for (int j = 0; j < b->n_old; j++)
		cudaFree(b->old[j]);
	b->p = NULL;
	b->cap = 0;
	b->n_old = 0;
}

/* ---- Piece lists ------------------------------------------------------------------------- */

/* The next list slot with room for bytes, once the kernel that last read it has finished. */
static int slot_get(struct cuda_backend *cb, size_t bytes, struct list_slot **out)
{
	struct list_slot *s = &cb->slot[cb->next_slot];
	int err;

	cb->next_slot = (cb->next_slot + 1) % LIST_SLOTS;
	if (s->recorded) {
		err = CU(cb, cudaEventSynchronize(s->done), "piece list: wait for its last use");
		if (err)
			return err;
		s->recorded = false;
	}
	if (bytes > s->dev.cap) {
		size_t cap = dev_buf_cap(&s->dev, 4096, bytes), old_cap = s->dev.cap;
		void *host;

		/* The new buffers first: a failure leaves the slot as it was. */
		host = cap ? pinned_alloc(cb, cap) : NULL;
		if (!host)
			return be_fail(&cb->base, -ENOMEM,
				       "piece list: no pinned memory for %zu bytes", cap);
		err = dev_buf_grow(cb, &s->dev, cap, "piece list: device buffer");
		if (err) {
			pinned_free(cb, host, cap);
			return err;
		}
		pinned_free(cb, s->host, old_cap); /* back to the pinned arena: no CUDA call */
		s->host = host;
	}
	*out = s;
	return 0;
}

/* Copies the slot's first bytes to the device on stream (before the kernel that reads them). */
static int slot_upload(struct cuda_backend *cb, struct list_slot *s, size_t bytes,
		       cudaStream_t stream)
{
	return CU(cb, cudaMemcpyAsync(s->dev.p, s->host, bytes, cudaMemcpyHostToDevice, stream),
		  "piece list: copy to the device");
}

/* Marks the slot busy until the work queued on stream so far is done. Runs after the work was
   queued, so a failure here must not fail the call (the work would stay done): it waits for
   the stream instead, and only a failure of that (a broken context) is an error. */
static int slot_done(struct cuda_backend *cb, struct list_slot *s, cudaStream_t stream)
{
	s->recorded = cudaEventRecord(s->done, stream) == cudaSuccess;
	if (s->recorded)
		return 0;
	return cu_result(cb, cudaStreamSynchronize(stream), "piece list: wait for its use");
}

/* A host-arena address as the device sees it (identical under UVA, else shifted). */
static inline uint64_t dev_addr(const struct cuda_backend *cb, uint64_t a)
{
	return a >= cb->host_lo && a < cb->host_hi ? (uint64_t)((int64_t)a + cb->host_delta) : a;
}

/* Flattens a copy list into pieces (one per rep); *n_out pieces, their largest size. */
static int count_pieces(struct cuda_backend *cb, const struct kvt_xfer *x, uint32_t n,
			uint32_t *n_out, uint64_t *largest)
{
	uint64_t total = 0, big = 0;

	for (uint32_t e = 0; e < n; e++) {
		total += x[e].reps;
		big = x[e].bytes > big ? x[e].bytes : big;
	}
	if (total > UINT32_MAX)
		return be_fail(&cb->base, -EINVAL, "copy list of %llu pieces",
			       (unsigned long long)total);
	*n_out = (uint32_t)total;
	*largest = big;
	return 0;
}

static void fill_pieces(const struct cuda_backend *cb, const struct kvt_xfer *x, uint32_t n,
			struct kvt_gpu_piece *p)
{
	for (uint32_t e = 0; e < n; e++)
		for (uint32_t r = 0; r < x[e].reps; r++)
			*p++ = (struct kvt_gpu_piece){
				.src = dev_addr(cb, x[e].src + r * x[e].src_stride),
				.dst = dev_addr(cb, x[e].dst + r * x[e].dst_stride),
				.bytes = x[e].bytes,
			};
}

/* One launch of the fused gather over a copy list, on stream; h2d: a load of host blocks
   (counted in the stats), else a copy within the device. */
static int run_kernel(struct cuda_backend *cb, const struct kvt_xfer *x, uint32_t n,
		      uint32_t pieces, uint32_t ctas, bool h2d, cudaStream_t stream)
{
	size_t bytes = (size_t)pieces * sizeof(struct kvt_gpu_piece);
	struct list_slot *s;
	int err = slot_get(cb, bytes, &s), e2;

	if (err)
		return err;
	fill_pieces(cb, x, n, s->host);
	err = slot_upload(cb, s, bytes, stream);
	if (!err)
		err = CU(cb, (cudaError_t)kvt_gather_launch(s->dev.p, pieces, ctas, (void *)stream),
			 "fused gather: launch");
	if (!err && h2d)
		cb->kernel_launches++;
	/* The list was maybe copied even when the launch failed: let the copy finish first. */
	e2 = slot_done(cb, s, stream);
	return err ? err : e2;
}

static int grow_batch(struct cuda_backend *cb, size_t n)
{
	void **d, **s;
	size_t *z;

	if (n <= cb->b_cap)
		return 0;
	d = kvt_cuda_host->realloc(cb->b_dst, n * sizeof(*d));
	if (d)
		cb->b_dst = d;
	s = kvt_cuda_host->realloc(cb->b_src, n * sizeof(*s));
	if (s)
		cb->b_src = s;
	z = kvt_cuda_host->realloc(cb->b_size, n * sizeof(*z));
	if (z)
		cb->b_size = z;
	if (!d || !s || !z)
		return be_fail(&cb->base, -ENOMEM, "no memory for a batch of %zu copies", n);
	cb->b_cap = n;
	return 0;
}

/* One cudaMemcpyBatchAsync over a copy list (host -> device, stream-ordered). */
static int run_batch(struct cuda_backend *cb, const struct kvt_xfer *x, uint32_t n, uint32_t pieces,
		     cudaStream_t stream)
{
	struct cudaMemcpyAttributes attr = {
		.srcAccessOrder = cudaMemcpySrcAccessOrderStream,
		.srcLocHint = {.type = cudaMemLocationTypeHost},
		.dstLocHint = {.type = cudaMemLocationTypeDevice, .id = cb->device},
		.flags = cudaMemcpyFlagPreferOverlapWithCompute,
	};
	size_t attr_idx = 0, k = 0;
	int err = grow_batch(cb, pieces);

	if (err)
		return err;
	for (uint32_t e = 0; e < n; e++)
		for (uint32_t r = 0; r < x[e].reps; r++, k++) {
			cb->b_dst[k] = (void *)(uintptr_t)(x[e].dst + r * x[e].dst_stride);
			cb->b_src[k] = (void *)(uintptr_t)(x[e].src + r * x[e].src_stride);
			cb->b_size[k] = x[e].bytes;
		}
	err = CU(cb,
		 cudaMemcpyBatchAsync(cb->b_dst, (const void *const *)cb->b_src, cb->b_size, pieces,
				      &attr, &attr_idx, 1, stream),
		 "gather: cudaMemcpyBatchAsync");
	if (!err)
		cb->dma_batches++;
	return err;
}

static inline uint32_t size_class(uint64_t bytes)
{
	return bytes <= 4096 ? 0 : bytes <= 16384 ? 1 : 2;
}

/* ---- Calibration --------------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x > y) - (x < y);
}

/* Median ms of reps runs of one gather of count pieces of size bytes, by kernel or DMA. */
static int time_gather(struct cuda_backend *cb, struct kvt_xfer *x, uint32_t count, bool kernel,
		       cudaStream_t st, cudaEvent_t t0, cudaEvent_t t1, float *ms)
{
	float runs[3] = {0};
	int err = 0;

	for (int i = -1; i < 3 && !err; i++) { /* run -1 warms up */
		err = CU(cb, cudaEventRecord(t0, st), "calibration: event");
		if (!err)
			err = kernel ? run_kernel(cb, x, count, count, cb->gather_ctas, true, st)
				     : run_batch(cb, x, count, count, st);
		if (!err)
			err = CU(cb, cudaEventRecord(t1, st), "calibration: event");
		if (!err)
			err = CU(cb, cudaEventSynchronize(t1), "calibration: wait");
		if (!err && i >= 0)
			err = CU(cb, cudaEventElapsedTime(&runs[i], t0, t1), "calibration: time");
	}
	qsort(runs, 3, sizeof(runs[0]), cmp_float);
	*ms = runs[1];
	return err;
}

/* For each piece-size class, where the fused kernel starts to beat one cudaMemcpyBatchAsync
   on this machine (docs/design.md "FlashH2D": no public system picks per (size, count) yet). */
static int calibrate(struct cuda_backend *cb)
{
	static const uint32_t sizes[KVT_CALIB_CLASSES] = {4096, 16384, 65536};
	static const uint32_t counts[] = {8, 32, 128, 512};
	enum { N_COUNTS = sizeof(counts) / sizeof(counts[0]), MOST = 512 };
	size_t span = (size_t)MOST * 65536;
	cudaEvent_t t0 = NULL, t1 = NULL;
	cudaStream_t st = NULL;
	struct kvt_xfer *x = NULL;
	void *host = NULL, *dev = NULL;
	int err;

	x = kvt_cuda_host->calloc(MOST, sizeof(*x));
	if (!x)
		return be_fail(&cb->base, -ENOMEM, "calibration: no memory");
	err = CU(cb, cudaHostAlloc(&host, span, cudaHostAllocMapped | cudaHostAllocPortable),
		 "calibration: pinned buffer");
	if (!err)
		err = CU(cb, cudaMalloc(&dev, span), "calibration: device buffer");
	if (!err)
		err = CU(cb, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking),
			 "calibration: stream");
	if (!err)
		err = CU(cb, cudaEventCreate(&t0), "calibration: event");
	if (!err)
		err = CU(cb, cudaEventCreate(&t1), "calibration: event");
	if (err)
		goto out;
	memset(host, 0x5a, span);
	for (uint32_t c = 0; c < KVT_CALIB_CLASSES && !err; c++) {
		bool wins[N_COUNTS];
		float k_ms = 0, b_ms = 0;

		/* Blocks in reverse order, so neither side sees one contiguous run. */
		for (uint32_t i = 0; i < MOST; i++)
			x[i] = (struct kvt_xfer){
				.src = (uint64_t)(uintptr_t)host +
				       (uint64_t)(MOST - 1 - i) * sizes[c],
				.dst = (uint64_t)(uintptr_t)dev + (uint64_t)i * sizes[c],
				.bytes = sizes[c],
				.reps = 1,
			};
		for (uint32_t j = 0; j < N_COUNTS && !err; j++) {
			err = time_gather(cb, x, counts[j], true, st, t0, t1, &k_ms);
			if (!err)
				err = time_gather(cb, x, counts[j], false, st, t0, t1, &b_ms);
			wins[j] = k_ms <= b_ms;
		}
		if (err)
			break;
		cb->calib.gather_min[c] = UINT32_MAX;
		for (int j = N_COUNTS - 1; j >= 0 && wins[j]; j--)
			cb->calib.gather_min[c] = j == 0 ? 0 : counts[j];
		cb->calib.gather_gbps[c] = (double)counts[N_COUNTS - 1] * sizes[c] / (k_ms * 1e6);
		cb->calib.batch_gbps[c] = (double)counts[N_COUNTS - 1] * sizes[c] / (b_ms * 1e6);
	}
	if (!err)
		cb->calib.measured = 1;
out:
	if (st)
		cudaStreamSynchronize(st);
	if (t0)
		cudaEventDestroy(t0);
	if (t1)
		cudaEventDestroy(t1);
	if (st)
		cudaStreamDestroy(st);
	if (dev)
		cudaFree(dev);
	if (host)
		cudaFreeHost(host);
	free(x);
	cb->kernel_launches = cb->dma_batches = 0; /* the calibration's own runs do not count */
	return err;
}

/* A machine's figures do not change between managers: the first manager of a process measures
   them for its (device, gather CTAs), the later ones reuse them. */
#define CALIB_CACHE 16
struct calib_entry {
	int device;
	uint32_t ctas;
	struct kvt_cuda_calib calib;
};
static struct calib_entry calib_cache[CALIB_CACHE];
static uint32_t calib_cached_n;
static pthread_mutex_t calib_lock = PTHREAD_MUTEX_INITIALIZER;

static bool calib_cached(struct cuda_backend *cb)
{
	bool hit = false;

	pthread_mutex_lock(&calib_lock);
	for (uint32_t i = 0; i < calib_cached_n && !hit; i++)
		if (calib_cache[i].device == cb->device && calib_cache[i].ctas == cb->gather_ctas) {
			cb->calib = calib_cache[i].calib;
			hit = true;
		}
	pthread_mutex_unlock(&calib_lock);
	return hit;
}

static void calib_keep(const struct cuda_backend *cb)
{
	pthread_mutex_lock(&calib_lock);
	if (calib_cached_n < CALIB_CACHE)
		calib_cache[calib_cached_n++] =
			(struct calib_entry){cb->device, cb->gather_ctas, cb->calib};
	pthread_mutex_unlock(&calib_lock);
}

/* ---- The save path (FlashD2H) --------------------------------------------------------------- */

static int stage_copy(void *cctx, int buf, void *stage, const struct kvt_save_src *src,
		      uint32_t n_src, uint64_t off, uint64_t len)
{
	struct cuda_backend *cb = cctx;
	uint8_t *dst = cb->dstage[buf];
	uint64_t base = 0, total = len;
	int err;

	/* On the caller's stream, in its order: the sources into the device twin, once the
	   previous copy out of it is done. The copy to the host goes on the side stream, so the
	   caller's next kernels do not queue behind PCIe. */
	err = CU(cb, cudaStreamWaitEvent(cb->save_stream, cb->stage_done[buf], 0),
		 "save: wait for the staging buffer");
	for (uint32_t i = 0; i < n_src && len && !err; i++) {
		uint64_t end = base + src[i].bytes;

		if (off < end) {
			uint64_t n = end - off < len ? end - off : len;

			err = CU(cb,
				 cudaMemcpyAsync(
					 dst, (const void *)(uintptr_t)(src[i].addr + off - base),
					 n, cudaMemcpyDeviceToDevice, cb->save_stream),
				 "save: copy into the device staging buffer");
			dst += n;
			off += n;
			len -= n;
		}
		base = end;
	}
	if (!err)
		err = CU(cb, cudaEventRecord(cb->in_ready[buf], cb->save_stream),
			 "save: record the device staging copy");
	if (!err)
		err = CU(cb, cudaStreamWaitEvent(cb->side, cb->in_ready[buf], 0),
			 "save: order the side stream");
	if (!err)
		err = CU(cb,
			 cudaMemcpyAsync(stage, cb->dstage[buf], total, cudaMemcpyDeviceToHost,
					 cb->side),
			 "save: copy into the staging buffer");
	if (!err)
		err = CU(cb, cudaEventRecord(cb->stage_done[buf], cb->side),
			 "save: record the staging copy");
	if (err) { /* the buffers may still be written: let them land before the pool reuses them */
		cudaStreamSynchronize(cb->save_stream);
		cudaStreamSynchronize(cb->side);
	}
	return err;
}

/* On a save thread: the staging copy must have landed before the scatter reads it. */
static int stage_wait(void *cctx, int buf)
{
	struct cuda_backend *cb = cctx;
	cudaError_t e = cudaSetDevice(cb->device);

	if (e == cudaSuccess)
		e = cudaEventSynchronize(cb->stage_done[buf]);
	/* KVT_FAULT_STAGE: the copy landed, but fail as an asynchronous error reported here
	   would (its hits are counted on every thread: this runs on a save thread). */
	if (e == cudaSuccess && kvt_cuda_host->fault(KVT_FAULT_STAGE))
		e = cudaErrorLaunchFailure;
	if (e != cudaSuccess) {
		int expected = 0;

		atomic_compare_exchange_strong(&cb->save_cuerr, &expected, (int)e);
		kvt_cuda_host->log(KVT_LOG_ERROR, "cuda: save: staging copy failed: %s",
				   cudaGetErrorString(e));
		/* -EIO whatever the CUDA error: the save's rows are lost, and its readers are
		   told so as for a failed disk write, not as for a bad argument of theirs. */
		return -EIO;
	}
	return 0;
}

/* ---- Operations ----------------------------------------------------------------------------- */

static int bind(struct cuda_backend *cb)
{
	return CU(cb, cudaSetDevice(cb->device), "select the backend's device");
}

static uint32_t env_u32(const char *name, uint32_t dflt, uint32_t lo, uint32_t hi)
{
	const char *s = getenv(name);
	char *end;
	unsigned long v;

	if (!s || !*s)
		return dflt;
	v = strtoul(s, &end, 10);
	if (*end || v < lo || v > hi) {
		kvt_cuda_host->log(KVT_LOG_WARN, "%s=%s ignored (want %u..%u)", name, s, lo, hi);
		return dflt;
	}
	return (uint32_t)v;
}

static void cuda_destroy(struct kvt_be *b);
static void grave_flush(struct cuda_backend *cb, bool idle);
static void tpool_create(struct cuda_backend *cb);

static int cuda_create(const struct kvt_backend_params *p, struct kvt_be **out)
{
	struct cuda_backend *cb = kvt_cuda_host->calloc(1, sizeof(*cb));
	struct kvt_savepool_alloc alloc = {pinned_alloc, pinned_free, NULL};
	int uva = 0, map = 0, sms = 0, err;

	if (!cb)
		return -ENOMEM;
	cb->time_calls = env_u32("KVTIER_CUDA_TIME_CALLS", 0, 0, 1) != 0;
	cb->base.ops = &kvt_backend_cuda_ops;
	pthread_mutex_init(&cb->reg_lock, NULL);
	cb->numa_node = -1;
	err = CU(cb, cudaGetDevice(&cb->device), "current device");
	if (!err)
		err = bind(cb);
	if (!err)
		err = CU(cb, cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, cb->device),
			 "device attributes");
	if (!err)
		err = CU(cb, cudaDeviceGetAttribute(&map, cudaDevAttrCanMapHostMemory, cb->device),
			 "device attributes");
	if (!err)
		err = CU(cb,
			 cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cb->device),
			 "device attributes");
	if (!err && (!uva || !map))
		err = be_fail(&cb->base, -ENODEV,
			      "device %d cannot map host memory into a unified address space",
			      cb->device);
	if (err)
		goto fail;
	cb->numa_node = gpu_numa_node(cb->device);
	tpool_create(cb);
	cb->gather_ctas =
		env_u32("KVTIER_GATHER_CTAS", KVT_GATHER_CTAS_DEFAULT, 1, KVT_GATHER_CTAS_MAX);
	/* Copies within the device are bounded by HBM, not PCIe: a few CTAs per SM. */
	cb->copy_ctas = sms > 0 && 4u * (uint32_t)sms < KVT_GATHER_CTAS_MAX ? 4u * (uint32_t)sms
									    : KVT_GATHER_CTAS_MAX;
	err = pinned_arena_create(cb);
	for (int i = 0; i < 2 && !err; i++) {
		/* blocking: a save thread waiting for its copy sleeps instead of spinning */
		err = CU(cb,
			 cudaEventCreateWithFlags(&cb->stage_done[i],
						  cudaEventDisableTiming | cudaEventBlockingSync),
			 "save: events");
		if (!err)
			err = CU(cb,
				 cudaEventCreateWithFlags(&cb->in_ready[i], cudaEventDisableTiming),
				 "save: events");
		if (!err)
			err = CU(cb, cudaMalloc(&cb->dstage[i], p->staging_bytes),
				 "save: device staging buffers");
	}
	if (!err)
		err = CU(cb, cudaStreamCreateWithFlags(&cb->side, cudaStreamNonBlocking),
			 "save: side stream");
	for (int i = 0; i < LIST_SLOTS && !err; i++)
		err = CU(cb, cudaEventCreateWithFlags(&cb->slot[i].done, cudaEventDisableTiming),
			 "piece lists: events");
	if (err)
		goto fail;
	alloc.actx = cb;
	err = kvt_cuda_host->savepool_create(p->save_threads, p->staging_bytes, &alloc, stage_copy,
					     stage_wait, cb, &cb->sp);
	if (err) {
		be_fail(&cb->base, err, "save threads or pinned staging buffers");
		goto fail;
	}
	if (env_u32("KVTIER_CUDA_CALIBRATE", 1, 0, 1) && !calib_cached(cb)) {
		err = calibrate(cb);
		if (!err)
			calib_keep(cb);
		if (err) {
			/* Not fatal: the defaults (kernel for every gather) still work. */
			kvt_cuda_host->log(KVT_LOG_WARN,
					   "cuda: calibration failed (%s): every "
					   "gather uses the fused kernel",
					   cb->base.err);
			cb->base.err[0] = '\0';
			err = 0;
		}
	}
	if (!cb->calib.measured)
		memset(cb->calib.gather_min, 0, sizeof(cb->calib.gather_min));
	kvt_cuda_host->log(KVT_LOG_INFO,
			   "cuda: device %d (NUMA node %d), gather %u CTAs; calibration: kernel "
			   "from %u/%u/%u pieces of 4/16/64 KiB",
			   cb->device, cb->numa_node, cb->gather_ctas, cb->calib.gather_min[0],
			   cb->calib.gather_min[1], cb->calib.gather_min[2]);
	*out = &cb->base;
	return 0;
fail:
	/* The caller reads b->err only from a live backend: log the detail before freeing. */
	kvt_cuda_host->log(KVT_LOG_WARN, "cuda: cannot start: %s", cb->base.err);
	cuda_destroy(&cb->base);
	return err;
}

static void cuda_destroy(struct kvt_be *b)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;

	if (!cb)
		return;
	cudaSetDevice(cb->device);
	if (cb->sp)
		kvt_cuda_host->savepool_destroy(cb->sp);
	cudaDeviceSynchronize();
	for (int i = 0; i < LIST_SLOTS; i++) {
		pinned_free(cb, cb->slot[i].host, cb->slot[i].dev.cap);
		dev_buf_free(&cb->slot[i].dev);
		if (cb->slot[i].done)
			cudaEventDestroy(cb->slot[i].done);
	}
	for (int i = 0; i < 2; i++) {
		if (cb->stage_done[i])
			cudaEventDestroy(cb->stage_done[i]);
		if (cb->in_ready[i])
			cudaEventDestroy(cb->in_ready[i]);
		if (cb->dstage[i])
			cudaFree(cb->dstage[i]);
	}
	if (cb->side)
		cudaStreamDestroy(cb->side);
	for (uint32_t i = 0; i < cb->n_lane; i++) {
		pinned_free(cb, cb->lane[i].host, cb->lane[i].cap);
		if (cb->lane[i].start)
			cudaEventDestroy(cb->lane[i].start);
		if (cb->lane[i].done)
			cudaEventDestroy(cb->lane[i].done);
	}
	free(cb->lane);
	if (cb->rr_done)
		cudaEventDestroy(cb->rr_done);
	pinned_free(cb, cb->rd, cb->rd_cap);
	free(cb->rd_x);
	dev_buf_free(&cb->io);
	dev_buf_free(&cb->layer);
	grave_flush(cb, true); /* (waited for above) */
	free(cb->grave);
	if (cb->tpool) {
		cudaStreamSynchronize(NULL); /* the frees just queued */
		cudaMemPoolDestroy(cb->tpool);
	}
	pinned_arena_destroy(cb);
	free(cb->b_dst);
	free(cb->b_src);
	free(cb->b_size);
	pthread_mutex_destroy(&cb->reg_lock);
	free(cb);
}

static int cuda_arena_alloc(struct kvt_be *b, enum kvt_tier tier, uint64_t bytes, uint64_t *base)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	void *p = NULL, *d = NULL;
	int err;

	if (bytes == 0 || bytes > SIZE_MAX)
		return be_fail(b, -EINVAL, "arena of %llu bytes", (unsigned long long)bytes);
	err = bind(cb);
	if (err)
		return err;
	if (tier == KVT_TIER_DEVICE) {
		err = CU(cb, cudaMalloc(&p, (size_t)bytes), "device arena (cudaMalloc)");
		if (err)
			return err;
		cb->dev_arena = p;
		*base = (uint64_t)(uintptr_t)p;
		return 0;
	}
	prefer_node(cb->numa_node);
	err = CU(cb, cudaHostAlloc(&p, (size_t)bytes, cudaHostAllocMapped | cudaHostAllocPortable),
		 "host arena (cudaHostAlloc, pinned and mapped)");
	prefer_node(-1);
	if (err)
		return err;
	err = CU(cb, cudaHostGetDevicePointer(&d, p, 0), "host arena: device address");
	if (err) {
		cudaFreeHost(p);
		return err;
	}
	cb->host_arena = p;
	cb->host_lo = (uint64_t)(uintptr_t)p;
	cb->host_hi = cb->host_lo + bytes;
	cb->host_delta = (int64_t)((uint64_t)(uintptr_t)d - cb->host_lo);
	*base = cb->host_lo;
	return 0;
}

static void cuda_arena_free(struct kvt_be *b, enum kvt_tier tier, uint64_t base, uint64_t bytes)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;

	(void)bytes;
	cudaSetDevice(cb->device);
	/* Kernels or copies may still use the arena. */
	cudaDeviceSynchronize();
	if (tier == KVT_TIER_DEVICE) {
		cudaFree((void *)(uintptr_t)base);
		cb->dev_arena = NULL;
	} else {
		cudaFreeHost((void *)(uintptr_t)base);
		cb->host_arena = NULL;
		cb->host_lo = cb->host_hi = 0;
	}
}

/* A copy list on stream: h2d, a load of host blocks (FlashH2D: the kernel, or DMA where the
   calibration found it faster), else a copy within the device (the kernel, with more CTAs). */
static int copy_list(struct cuda_backend *cb, const struct kvt_xfer *x, uint32_t n, bool h2d,
		     cudaStream_t stream)
{
	uint64_t largest = 0;
	uint32_t pieces = 0;
	int err = bind(cb);

	if (!err)
		err = count_pieces(cb, x, n, &pieces, &largest);
	if (err || pieces == 0)
		return err;
	/* cudaMemcpyBatchAsync refuses the legacy default stream (NULL or its explicit handle):
	   DMA only on another stream. */
	if (h2d && stream && stream != cudaStreamLegacy &&
	    pieces < cb->calib.gather_min[size_class(largest)])
		return run_batch(cb, x, n, pieces, stream);
	return run_kernel(cb, x, n, pieces, h2d ? cb->gather_ctas : cb->copy_ctas, h2d, stream);
}

static int cuda_copy_d2d(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream)
{
	return copy_list((struct cuda_backend *)b, x, n, false, (cudaStream_t)stream);
}

static int cuda_gather_h2d(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream)
{
	return copy_list((struct cuda_backend *)b, x, n, true, (cudaStream_t)stream);
}

/* The scratch buffer: a buffer it outgrew stays allocated until destroy (work queued on it may
   still run), so growing waits for nothing. */
static int cuda_scratch(struct kvt_be *b, uint64_t bytes, uint64_t *addr)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	size_t cap;
	int err;

	if (bytes > cb->layer.cap) {
		err = bind(cb);
		if (err)
			return err;
		cap = bytes > SIZE_MAX ? 0
				       : dev_buf_cap(&cb->layer, (size_t)1 << 20, (size_t)bytes);
		if (!cap || cb->layer.n_old == sizeof(cb->layer.old) / sizeof(cb->layer.old[0]))
			return be_fail(b, -ENOMEM, "prefill buffer of %llu bytes",
				       (unsigned long long)bytes);
		err = dev_buf_grow(cb, &cb->layer, cap, "prefill buffer (cudaMalloc)");
		if (err)
			return err;
	}
	*addr = (uint64_t)(uintptr_t)cb->layer.p;
	return 0;
}

static int cuda_save(struct kvt_be *b, const struct kvt_save_src *src, uint32_t n_src,
		     const struct kvt_xfer *x, uint32_t n, void *stream, uint64_t *ticket)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	int err = bind(cb);

	if (err)
		return err;
	cb->save_stream = (cudaStream_t)stream;
	b->err[0] = '\0'; /* a failing stage copy leaves its own detail */
	err = kvt_cuda_host->savepool_submit_xfer(cb->sp, src, n_src, x, n, ticket);
	if (err && !b->err[0])
		be_fail(b, err, "save of %u entries", n);
	return err;
}

static int cuda_append(struct kvt_be *b, uint64_t k, uint64_t v, uint32_t n,
		       const struct kvt_append *a, const struct kvt_append_geom *g, void *stream,
		       uint64_t *ticket)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	struct list_slot *s;
	uint64_t *dev;
	bool fold = false;
	int err = bind(cb);

	if (err)
		return err;
	for (uint32_t i = 0; i < n && !fold; i++)
		fold = a[i].meta != 0;
	/* The list slot first and the save second: once the save is submitted, only a launch
	   failure (a broken context) can still fail the call. With metadata to fold, the slot
	   holds the ring addresses, then the metadata entries. */
	err = slot_get(cb, (size_t)n * (fold ? 2 : 1) * sizeof(uint64_t), &s);
	if (err)
		return err;
	cb->save_stream = (cudaStream_t)stream;
	b->err[0] = '\0';
	err = kvt_cuda_host->savepool_submit_append(cb->sp, k, v, n, a, g, ticket);
	if (err) {
		if (!b->err[0])
			be_fail(b, err, "save of a %u-sequence append", n);
		return err;
	}
	dev = s->host;
	for (uint32_t i = 0; i < n; i++) {
		dev[i] = dev_addr(cb, a[i].dev);
		if (fold)
			dev[n + i] = a[i].meta;
	}
	err = slot_upload(cb, s, (size_t)n * (fold ? 2 : 1) * sizeof(uint64_t),
			  (cudaStream_t)stream);
	/* The fold first: when the ring write's launch fails after it, the metadata holds keys of
	   tokens that were not appended, which the same call made again folds in again to the
	   same values (min and max are idempotent); a failed fold launch leaves everything. */
	if (!err && fold)
		err = CU(cb,
			 (cudaError_t)kvt_gpu_meta_fold(g->dtype, g->head_dim, g->n_heads, n,
							(const void *)(uintptr_t)k,
							(const uint64_t *)s->dev.p + n, stream),
			 "append: block metadata launch");
	if (!err)
		err = CU(cb,
			 (cudaError_t)kvt_append_launch(k, v, n, s->dev.p, g->n_heads, g->row_bytes,
							g->head_stride, g->v_offset, cb->copy_ctas,
							stream),
			 "append: ring write launch");
	if (!err)
		err = slot_done(cb, s, (cudaStream_t)stream);
	else
		slot_done(cb, s, (cudaStream_t)stream); /* the list copy may be queued */
	return err;
}

static int cuda_save_event(struct kvt_be *b, void *event)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	int err = bind(cb);

	if (!err)
		err = CU(cb, cudaEventRecord((cudaEvent_t)event, cb->side), "save event: record");
	return err;
}

static int cuda_save_wait(struct kvt_be *b, uint64_t ticket)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	int err;

	err = kvt_cuda_host->savepool_wait(cb->sp, ticket);
	if (err)
		return be_fail(b, err,
			       "save: the staging copy of a save this wait covers failed: %s",
			       cudaGetErrorString((cudaError_t)atomic_load(&cb->save_cuerr)));
	return 0;
}

/* Ends a call whose work went on st and returns its error err: waits for st even after a
   failure (what was queued may still use the scratch, which the next call reuses, or write
   the destination); with none, the wait's own error. */
static int stream_finish(struct cuda_backend *cb, int err, cudaStream_t st, const char *what)
{
	if (err) {
		cudaStreamSynchronize(st);
		return err;
	}
	return CU(cb, cudaStreamSynchronize(st), what);
}

static int cuda_read_d2h(struct kvt_be *b, void *dst, uint64_t src, uint64_t bytes, void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	const void *s = (const void *)(uintptr_t)dev_addr(cb, src);
	cudaStream_t st = (cudaStream_t)stream;
	int err = bind(cb);

	if (err)
		return err;
	if (!st) { /* the bytes may have been written on any stream of the caller's */
		err = CU(cb, cudaDeviceSynchronize(), "read: wait for the device");
		if (!err)
			err = CU(cb, cudaMemcpy(dst, s, bytes, cudaMemcpyDefault),
				 "read: copy to host");
		return err;
	}
	/* behind the writer's work on its stream only, as a serving engine's other streams run */
	err = CU(cb, cudaMemcpyAsync(dst, s, bytes, cudaMemcpyDefault, st), "read: copy to host");
	return stream_finish(cb, err, st, "read: wait for the copy");
}

/* One wait for the device, then the pieces gathered into a pinned buffer by one launch of the
   fused gather (the device writes the mapped pages over UVA), one wait for it, and the copies
   out of the buffer on the CPU: a few calls however many regions, not two each. */
static int cuda_read_many(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	size_t total = 0, off = 0;
	int err = bind(cb);

	if (err)
		return err;
	for (uint32_t e = 0; e < n; e++) {
		if (x[e].reps != 1)
			return be_fail(b, -EINVAL, "read: a piece of %u repetitions", x[e].reps);
		total += ALIGN_UP((size_t)x[e].bytes, 16);
	}
	err = CU(cb, cudaDeviceSynchronize(), "read: wait for the device");
	if (err || n == 0)
		return err;
	if (total > cb->rd_cap) {
		void *p = pinned_alloc(cb, total);

		if (!p)
			return be_fail(b, -ENOMEM, "read: a pinned buffer of %zu bytes", total);
		pinned_free(cb, cb->rd, cb->rd_cap);
		cb->rd = p;
		cb->rd_cap = total;
	}
	if (n > cb->rd_n) {
		struct kvt_xfer *y = kvt_cuda_host->realloc(cb->rd_x, n * sizeof(*y));

		if (!y)
			return be_fail(b, -ENOMEM, "read: a list of %u pieces", n);
		cb->rd_x = y;
		cb->rd_n = n;
	}
	for (uint32_t e = 0; e < n; e++) {
		cb->rd_x[e] = (struct kvt_xfer){.src = x[e].src,
						.dst = (uint64_t)(uintptr_t)cb->rd + off,
						.bytes = x[e].bytes,
						.reps = 1};
		off += ALIGN_UP((size_t)x[e].bytes, 16);
	}
	err = run_kernel(cb, cb->rd_x, n, n, cb->gather_ctas, false, NULL);
	if (!err)
		err = CU(cb, cudaStreamSynchronize(NULL), "read: wait for the gather");
	else
		cudaStreamSynchronize(NULL);	 /* the list's copy may be queued */
	for (uint32_t e = 0; e < n && !err; e++) /* each piece from where the gather put it */
		memcpy((void *)(uintptr_t)x[e].dst, (const void *)(uintptr_t)cb->rd_x[e].dst,
		       x[e].bytes);
	return err;
}

static int cuda_sync(struct kvt_be *b, void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	int err = bind(cb);

	if (err)
		return err;
	if (stream)
		return CU(cb, cudaStreamSynchronize((cudaStream_t)stream), "stream synchronize");
	err = CU(cb, cudaDeviceSynchronize(), "device synchronize");
	if (!err)
		grave_flush(cb, true); /* nothing queued can read them now */
	return err;
}

/* ---- The policy on the device ------------------------------------------------------------- */

/* Device scratch of at least bytes (256-byte aligned, as cudaMalloc gives). */
static int io_reserve(struct cuda_backend *cb, size_t bytes)
{
	size_t cap;

	if (bytes <= cb->io.cap)
		return 0;
	cap = dev_buf_cap(&cb->io, (size_t)1 << 20, bytes);
	if (!cap)
		return be_fail(&cb->base, -ENOMEM, "policy scratch of %zu bytes", bytes);
	return dev_buf_grow(cb, &cb->io, cap, "policy scratch (cudaMalloc)");
}

static int cuda_select(struct kvt_be *b, const struct kvt_snapkv *p, const void *k,
		       const void *q_obs, int32_t *out, void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	uint32_t count = kvt_snapkv_count(p);
	size_t out_bytes = (size_t)p->n_kv_heads * count * sizeof(int32_t), scratch;
	cudaStream_t st = (cudaStream_t)stream;
	int err = bind(cb); /* CUB's scratch query reads the current device */

	if (err || count == 0)
		return err;
	scratch = ALIGN_UP(kvt_gpu_snapkv_scratch_bytes(p), 256);
	err = io_reserve(cb, scratch + out_bytes);
	if (!err)
		err = CU(cb,
			 (cudaError_t)kvt_gpu_snapkv_select(p, k, q_obs,
							    (int32_t *)((char *)cb->io.p + scratch),
							    cb->io.p, scratch, stream),
			 "SnapKV selection: launch");
	if (!err)
		err = CU(cb,
			 cudaMemcpyAsync(out, (char *)cb->io.p + scratch, out_bytes,
					 cudaMemcpyDeviceToHost, st),
			 "SnapKV selection: copy the positions back");
	return stream_finish(cb, err, st, "SnapKV selection: wait");
}

static int cuda_block_meta(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
			   uint32_t L, uint32_t block_tokens, const void *k, void *meta,
			   void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	size_t nb = (L + block_tokens - 1) / block_tokens;
	size_t bytes = nb * n_heads * 2 * head_dim * kvt_dtype_size(dt);
	cudaStream_t st = (cudaStream_t)stream;
	int err = bind(cb);

	if (err || bytes == 0)
		return err;
	err = io_reserve(cb, bytes);
	if (!err)
		err = CU(cb,
			 (cudaError_t)kvt_gpu_block_meta(dt, head_dim, n_heads, L, block_tokens, k,
							 cb->io.p, stream),
			 "block metadata: launch");
	if (!err)
		err = CU(cb, cudaMemcpyAsync(meta, cb->io.p, bytes, cudaMemcpyDeviceToHost, st),
			 "block metadata: copy back");
	return stream_finish(cb, err, st, "block metadata: wait");
}

static int cuda_attend(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
		       uint32_t g_count, const struct kvt_attend_rows *seg, const uint32_t *seg_off,
		       const float *q, float *out)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	size_t n_seg = seg_off[n_heads];
	size_t seg_b = ALIGN_UP(n_seg * sizeof(*seg), 256);
	size_t off_b = ALIGN_UP((n_heads + 1) * sizeof(*seg_off), 256);
	size_t q_b = (size_t)n_heads * g_count * head_dim * sizeof(float);
	char *io;
	int err = bind(cb);

	if (!err)
		err = CU(cb, cudaDeviceSynchronize(), "attention: wait for the device");
	if (!err)
		err = io_reserve(cb, seg_b + off_b + 2 * ALIGN_UP(q_b, 256));
	if (err)
		return err;
	io = cb->io.p;
	if (n_seg)
		err = CU(cb, cudaMemcpy(io, seg, n_seg * sizeof(*seg), cudaMemcpyHostToDevice),
			 "attention: segments");
	if (!err)
		err = CU(cb,
			 cudaMemcpy(io + seg_b, seg_off, (n_heads + 1) * sizeof(*seg_off),
				    cudaMemcpyHostToDevice),
			 "attention: segment offsets");
	if (!err)
		err = CU(cb, cudaMemcpy(io + seg_b + off_b, q, q_b, cudaMemcpyHostToDevice),
			 "attention: queries");
	if (!err)
		err = CU(cb,
			 (cudaError_t)kvt_gpu_attend(
				 dt, head_dim, n_heads, g_count, (const void *)io,
				 (const uint32_t *)(io + seg_b),
				 (const float *)(io + seg_b + off_b),
				 (float *)(io + seg_b + off_b + ALIGN_UP(q_b, 256)), NULL),
			 "attention: launch");
	if (!err)
		err = CU(cb,
			 cudaMemcpy(out, io + seg_b + off_b + ALIGN_UP(q_b, 256), q_b,
				    cudaMemcpyDeviceToHost),
			 "attention: copy the output back");
	return err;
}

/* ---- Block metadata on the device (dmem_*, meta_build, quest) ----------------------------- */

/* One device table of bytes on stream: from the pool (struct cuda_backend's tpool), else
   cudaMalloc. */
static cudaError_t table_alloc(struct cuda_backend *cb, void **p, size_t bytes, cudaStream_t st)
{
	return cb->tpool ? cudaMallocFromPoolAsync(p, bytes, cb->tpool, st) : cudaMalloc(p, bytes);
}

/* Gives back a table that no work queued anywhere but on st before now touches. */
static void table_release(struct cuda_backend *cb, void *p, cudaStream_t st)
{
	if (cb->tpool)
		cudaFreeAsync(p, st);
	else
		cudaFree(p);
}

/* Frees the tables in the grave (see struct cuda_backend), after the whole device unless idle
   says it just waited for it. The pool then keeps at most TPOOL_KEEP bytes of what it was given
   back, for the tables to come; the rest goes back to the driver, for the engine's own
   allocations. */
#define TPOOL_KEEP ((size_t)256 << 20)
static void grave_flush(struct cuda_backend *cb, bool idle)
{
	if (!cb->n_grave)
		return;
	if (!idle)
		cudaDeviceSynchronize();
	for (size_t i = 0; i < cb->n_grave; i++)
		table_release(cb, cb->grave[i], NULL); /* the device is idle: no order to keep */
	cb->n_grave = 0;
	if (cb->tpool)
		cudaMemPoolTrimTo(cb->tpool, TPOOL_KEEP);
}

/* The pool of the device tables (struct cuda_backend's tpool), where the device has pools: it
   keeps what is given back (release threshold at its maximum), so that later tables come from
   it without the driver. A device or driver that refuses leaves tpool NULL (cudaMalloc). */
static void tpool_create(struct cuda_backend *cb)
{
	struct cudaMemPoolProps pp;
	uint64_t keep = UINT64_MAX;
	int pools = 0;

	if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, cb->device) !=
		    cudaSuccess ||
	    !pools)
		return;
	memset(&pp, 0, sizeof(pp));
	pp.allocType = cudaMemAllocationTypePinned;
	pp.location.type = cudaMemLocationTypeDevice;
	pp.location.id = cb->device;
	if (cudaMemPoolCreate(&cb->tpool, &pp) != cudaSuccess) {
		cb->tpool = NULL;
		return;
	}
	if (cudaMemPoolSetAttribute(cb->tpool, cudaMemPoolAttrReleaseThreshold, &keep) !=
	    cudaSuccess) {
		cudaMemPoolDestroy(cb->tpool);
		cb->tpool = NULL;
	}
}

static int cuda_dmem_alloc(struct kvt_be *b, uint64_t bytes, void *stream, uint64_t *addr)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	void *p = NULL;
	cudaError_t e;
	int err = bind(cb);

	if (err)
		return err;
	if (bytes == 0 || bytes > SIZE_MAX)
		return be_fail(b, -EINVAL, "device table of %llu bytes", (unsigned long long)bytes);
	if (kvt_cuda_host->fault(KVT_FAULT_CUDA))
		return be_fail(b, -ENOMEM, "device table of %llu bytes: injected fault",
			       (unsigned long long)bytes);
	e = table_alloc(cb, &p, (size_t)bytes, (cudaStream_t)stream);
	if (e == cudaErrorMemoryAllocation && cb->n_grave) {
		grave_flush(cb, false); /* what waits to be freed may make the room */
		e = table_alloc(cb, &p, (size_t)bytes, (cudaStream_t)stream);
	}
	if (e != cudaSuccess)
		return be_fail(b, -ENOMEM, "device table of %llu bytes: %s",
			       (unsigned long long)bytes, cudaGetErrorString(e));
	err = CU(cb, cudaMemsetAsync(p, 0, (size_t)bytes, (cudaStream_t)stream),
		 "device table: zero fill");
	if (err) {
		table_release(cb, p, (cudaStream_t)stream);
		return err;
	}
	*addr = (uint64_t)(uintptr_t)p;
	return 0;
}

static void cuda_dmem_free(struct kvt_be *b, uint64_t addr)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	void *p = (void *)(uintptr_t)addr;

	if (!p)
		return;
	cudaSetDevice(cb->device); /* the frees' (a failure shows at the next call's bind) */
	if (cb->n_grave >= GRAVE_MAX)
		grave_flush(cb, false);
	if (cb->n_grave == cb->cap_grave) {
		size_t cap = cb->cap_grave ? 2 * cb->cap_grave : 64;
		void **g = realloc(cb->grave, cap * sizeof(*g));

		if (!g) { /* no room to defer it: free it now, after the device */
			cudaDeviceSynchronize();
			table_release(cb, p, NULL);
			return;
		}
		cb->grave = g;
		cb->cap_grave = cap;
	}
	cb->grave[cb->n_grave++] = p;
}

static int cuda_dmem_copy(struct kvt_be *b, uint64_t dst, uint64_t src, const void *src_host,
			  uint64_t bytes, void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	int err = bind(cb);

	if (err || bytes == 0)
		return err;
	return CU(cb,
		  cudaMemcpyAsync((void *)(uintptr_t)dst,
				  src_host ? src_host : (const void *)(uintptr_t)src, (size_t)bytes,
				  src_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
				  (cudaStream_t)stream),
		  src_host ? "device table: upload" : "device table: copy");
}

static int cuda_attend_batch(struct kvt_be *b, enum kvt_dtype dt, const struct kvt_attn_desc *d,
			     const void *q, void *out, float *lse, uint64_t scratch,
			     uint32_t splits, void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	int err = bind(cb);

	if (err)
		return err;
	return CU(cb,
		  (cudaError_t)kvt_gpu_attend_batch(dt, *d, q, out, lse,
						    (float *)(uintptr_t)scratch, splits, stream),
		  "batched attention: launch");
}

static int cuda_meta_build(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
			   uint32_t L, uint32_t block_tokens, const void *k, uint64_t meta,
			   void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	int err = bind(cb);

	if (err)
		return err;
	return CU(cb,
		  (cudaError_t)kvt_gpu_block_meta(dt, head_dim, n_heads, L, block_tokens, k,
						  (void *)(uintptr_t)meta, stream),
		  "block metadata: launch");
}

static int cuda_quest(struct kvt_be *b, enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
		      uint32_t g_count, uint32_t lbt, uint32_t r, const struct kvt_gpu_quest *qs,
		      uint32_t n, const void *q, uint32_t *sel, void *stream)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	size_t d_bytes = (size_t)n * sizeof(*qs), s_bytes = (size_t)n * n_heads * r * sizeof(*sel);
	cudaStream_t st = (cudaStream_t)stream;
	struct list_slot *ls;
	int err = bind(cb);

	if (err || n == 0)
		return err;
	err = io_reserve(cb, s_bytes);
	if (!err)
		err = slot_get(cb, d_bytes, &ls);
	if (err)
		return err;
	memcpy(ls->host, qs, d_bytes);
	err = slot_upload(cb, ls, d_bytes, st);
	if (!err)
		err = CU(cb,
			 (cudaError_t)kvt_gpu_quest_select(dt, head_dim, n_heads, g_count, lbt, r,
							   ls->dev.p, q, cb->io.p, n, stream),
			 "Quest selection: launch");
	if (!err)
		err = CU(cb, cudaMemcpyAsync(sel, cb->io.p, s_bytes, cudaMemcpyDeviceToHost, st),
			 "Quest selection: copy the blocks back");
	slot_done(cb, ls, st); /* the wait below covers a failure of this */
	return stream_finish(cb, err, st, "Quest selection: wait");
}

#define DPTR(a) ((void *)(uintptr_t)(a))

/* The id of stream st (cudaStreamGetId: NULL the legacy stream's, cudaStreamPerThread the
   calling thread's). 0 or the error. */
static int rr_id(struct cuda_backend *cb, cudaStream_t st, unsigned long long *id)
{
	return CU(cb, cudaStreamGetId(st, id), "recall regions: the stream's id");
}

/* Work queued on st (whose id is *id, which this sets) from now on runs after the latest
   program, whatever its stream (none fenced: it was waited for). 0 or the error. */
static int rr_after(struct cuda_backend *cb, cudaStream_t st, unsigned long long *id)
{
	int err = rr_id(cb, st, id);

	if (err || !cb->rr_fenced || cb->rr_stream == *id)
		return err;
	return CU(cb, cudaStreamWaitEvent(st, cb->rr_last, 0),
		  "recall regions: order after the program before");
}

/* Event e, recorded on the stream of id `id`, is the point the next program comes after. */
static void rr_mark(struct cuda_backend *cb, cudaEvent_t e, unsigned long long id)
{
	cb->rr_last = e;
	cb->rr_fenced = true;
	cb->rr_stream = id;
}

/* The next program runs after the work so far of st (of id `id`, from rr_after): the fence
   moves behind it. 0, or the error (the fence as it was). */
static int rr_fence(struct cuda_backend *cb, cudaStream_t st, unsigned long long id)
{
	int err = CU(cb, cudaEventRecord(cb->rr_done, st), "recall regions: fence");

	if (!err)
		rr_mark(cb, cb->rr_done, id);
	return err;
}

static int cuda_region_run(struct kvt_be *b, const struct kvt_region_run *r, void *stream,
			   uint32_t *done)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	cudaStream_t st = (cudaStream_t)stream;
	const struct kvt_gpu_region *rg = DPTR(r->rg);
	uint32_t stop = r->stop ? r->stop : KVT_RS_END, at = r->start;
	/* The group entries go with the regions' decisions, in their launch, when this run
	   queues that (a run resumed after the groups and before the decisions writes them
	   again there: the same values at the same places); else in a launch of their own. */
	bool groups_late = r->n && at <= KVT_RS_RECALL && stop > KVT_RS_RECALL;
	struct lane *ln = NULL;
	unsigned long long sid = 0;
	int err = bind(cb);

	*done = at;
	if (err)
		return err;
	if (r->lane) {
		if (r->lane > cb->n_lane || !cb->lane[r->lane - 1].host)
			return be_fail(b, -EINVAL, "recall regions: lane %u has no buffer",
				       r->lane);
		ln = &cb->lane[r->lane - 1];
	}
	/* after the program before it, whatever its stream (programs share the regions) */
	err = rr_after(cb, st, &sid);
	if (!err && ln) {
		ln->fenced = false;
		ln->timed = r->time;
		if (r->time)
			err = CU(cb, cudaEventRecord(ln->start, st), "recall regions: start");
	}
	if (err)
		return err;
	for (; at < stop && !err; at++) {
		*done = at;
		switch (at) {
		case KVT_RS_UPLOAD:
			for (uint32_t i = 0; i < r->n_up && !err; i++)
				err = CU(cb,
					 cudaMemcpyAsync(DPTR(r->up[i].dev), r->up[i].host,
							 (size_t)r->up[i].bytes,
							 cudaMemcpyHostToDevice, st),
					 "recall regions: upload");
			break;
		case KVT_RS_GROUPS:
			if (r->n_groups && !groups_late)
				err = CU(cb,
					 (cudaError_t)kvt_gpu_region_groups(DPTR(r->group_at),
									    DPTR(r->group_val),
									    r->n_groups, stream),
					 "recall regions: group tables");
			break;
		case KVT_RS_CLEAR:
			if (r->n_clear)
				err = CU(cb,
					 (cudaError_t)kvt_gpu_region_clear(
						 DPTR(r->clear_rg), DPTR(r->clear_gone),
						 DPTR(r->clear_off), DPTR(r->stack), r->n_clear,
						 stream),
					 "recall regions: clear");
			break;
		case KVT_RS_DROP:
			if (r->n_drop)
				err = CU(cb,
					 (cudaError_t)kvt_gpu_region_drop(
						 DPTR(r->drop_rg), DPTR(r->drop_k),
						 DPTR(r->drop_off), NULL, DPTR(r->stack),
						 DPTR(r->drop_gone), r->n_drop, stream),
					 "recall regions: drop");
			break;
		case KVT_RS_GROW:
			if (r->n_grow)
				err = CU(cb,
					 (cudaError_t)kvt_gpu_region_grow(
						 DPTR(r->grow_rg), DPTR(r->grow_n), DPTR(r->stack),
						 DPTR(r->grow_off), r->n_grow, stream),
					 "recall regions: grow");
			break;
		case KVT_RS_SELECT:
			if (r->n && r->qs)
				err = CU(cb,
					 (cudaError_t)kvt_gpu_quest_select(
						 r->dt, r->head_dim, r->n_heads, r->g_count, r->lbt,
						 r->r, DPTR(r->qs), r->q, DPTR(r->sel), r->n,
						 stream),
					 "recall regions: Quest selection");
			break;
		case KVT_RS_RECALL:
			if (r->n)
				err = CU(cb,
					 (cudaError_t)kvt_gpu_region_recall_groups(
						 rg, r->n, DPTR(r->group_at), DPTR(r->group_val),
						 groups_late ? r->n_groups : 0, stream),
					 "recall regions: recall");
			break;
		case KVT_RS_GATHER:
			if (r->n) {
				err = CU(cb,
					 (cudaError_t)kvt_gpu_region_gather(
						 rg, r->n, r->block_bytes,
						 dev_addr(cb, r->frame_base), cb->gather_ctas,
						 DPTR(r->missing), DPTR(r->fresh), stream),
					 "recall regions: gather");
				cb->kernel_launches += !err;
			}
			break;
		case KVT_RS_EMPTY:
			if (r->n_empty)
				err = CU(cb,
					 (cudaError_t)kvt_gpu_region_empty(
						 DPTR(r->empty_rg), r->n_empty_rg,
						 DPTR(r->empty_pairs), NULL, r->n_empty, stream),
					 "recall regions: empty");
			break;
		case KVT_RS_READ:
			for (uint32_t i = 0; i < r->n_rd && !err; i++)
				err = CU(cb,
					 cudaMemcpyAsync(r->rd[i].host, DPTR(r->rd[i].dev),
							 (size_t)r->rd[i].bytes,
							 cudaMemcpyDeviceToHost, st),
					 "recall regions: read back");
			break;
		}
	}
	if (!err)
		*done = KVT_RS_END;
	if (!err && ln) {
		/* no wait: the lane's fence, which the next program comes after */
		err = CU(cb, cudaEventRecord(ln->done, st), "recall regions: fence");
		if (!err) {
			rr_mark(cb, ln->done, sid);
			ln->fenced = true;
			return 0;
		}
	}
	/* waited for: nothing to order after */
	cb->rr_fenced = false;
	if (ln)
		ln->fenced = false;
	return stream_finish(cb, err, st, "recall regions: wait");
}

/* Creates *e with flags unless it exists: 0, or the error (*e stays NULL). */
static int event_once(struct cuda_backend *cb, cudaEvent_t *e, unsigned int flags)
{
	int err;

	if (*e)
		return 0;
	err = CU(cb, cudaEventCreateWithFlags(e, flags), "recall regions: event");
	if (err)
		*e = NULL;
	return err;
}

static int cuda_region_host(struct kvt_be *b, uint32_t lane, uint64_t bytes, void **host)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	struct lane *ln;
	void *p;
	int err;

	if (lane == 0 || bytes > SIZE_MAX)
		return be_fail(b, -EINVAL, "recall regions: lane %u, %llu bytes", lane,
			       (unsigned long long)bytes);
	err = bind(cb);
	if (err)
		return err;
	if (lane > cb->n_lane) {
		struct lane *l = kvt_cuda_host->realloc(cb->lane, lane * sizeof(*l));

		if (!l)
			return be_fail(b, -ENOMEM, "recall regions: no memory for %u lanes", lane);
		memset(l + cb->n_lane, 0, (lane - cb->n_lane) * sizeof(*l));
		cb->lane = l;
		cb->n_lane = lane;
	}
	ln = &cb->lane[lane - 1];
	err = event_once(cb, &ln->start, cudaEventDefault);
	if (!err)
		err = event_once(cb, &ln->done, cudaEventBlockingSync);
	if (err)
		return err;
	if (bytes > ln->cap) {
		size_t cap = grow_cap((size_t)ln->cap, 1 << 16, (size_t)bytes);

		if (!cap)
			return be_fail(b, -ENOMEM, "recall regions: %llu bytes of pinned memory",
				       (unsigned long long)bytes);
		/* the device may still read or write the old one */
		if (ln->fenced) {
			err = CU(cb, cudaEventSynchronize(ln->done), "recall regions: lane wait");
			if (err)
				return err;
			ln->fenced = false;
		}
		p = pinned_alloc(cb, (size_t)cap);
		if (!p)
			return be_fail(b, -ENOMEM,
				       "recall regions: no pinned memory for %llu bytes",
				       (unsigned long long)cap);
		pinned_free(cb, ln->host, ln->cap);
		ln->host = p;
		ln->cap = cap;
	}
	*host = ln->host;
	return 0;
}

static int cuda_region_order(struct kvt_be *b, void *stream, bool before)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	cudaStream_t st = (cudaStream_t)stream;
	unsigned long long sid;
	int err = bind(cb);

	if (err)
		return err;
	if (before)
		return rr_after(cb, st, &sid);
	/* (on failure rr_done as it was: the caller gives up the work it ordered) */
	err = event_once(cb, &cb->rr_done, cudaEventDisableTiming);
	if (!err)
		err = rr_id(cb, st, &sid);
	return err ? err : rr_fence(cb, st, sid);
}

static int cuda_region_wait(struct kvt_be *b, uint32_t lane)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;
	struct lane *ln;
	cudaError_t e;
	int err;

	if (lane == 0 || lane > cb->n_lane)
		return 0;
	ln = &cb->lane[lane - 1];
	if (!ln->fenced)
		return 0;
	/* (no bind: an event is queried, waited for and timed from any device's thread) */
	/* done already (a step ago, as a rule): no wait (timed as CU's calls are) */
	cu_begin(cb);
	e = cudaEventQuery(ln->done);
	if (e == cudaErrorNotReady)
		e = cudaEventSynchronize(ln->done);
	e = cu_end(cb, e);
	ln->fenced = false;
	err = CU(cb, e, "recall regions: a program on the device");
	if (!err && ln->timed) {
		float ms = 0;

		/* a figure only: a failure here costs the figure, not the call */
		cu_begin(cb);
		if (cu_end(cb, cudaEventElapsedTime(&ms, ln->start, ln->done)) == cudaSuccess &&
		    ms > 0) {
			cb->region_ns += (uint64_t)((double)ms * 1e6 + 0.5);
			cb->region_timed++;
		}
	}
	return err;
}

static void cuda_stats(struct kvt_be *b, struct kvt_be_stats *out)
{
	struct cuda_backend *cb = (struct cuda_backend *)b;

	*out = (struct kvt_be_stats){
		.h2d_kernel_launches = cb->kernel_launches,
		.h2d_dma_batches = cb->dma_batches,
		.region_ns = cb->region_ns,
		.region_timed = cb->region_timed,
		.runtime_ns = atomic_load_explicit(&cb->runtime_ns, memory_order_relaxed),
		.calibrated = cb->calib.measured,
	};
	memcpy(out->gather_min, cb->calib.gather_min, sizeof(out->gather_min));
}

const struct kvt_backend_ops kvt_backend_cuda_ops = {
	.version = KVT_BACKEND_OPS_VERSION,
	.name = "cuda",
	.create = cuda_create,
	.destroy = cuda_destroy,
	.arena_alloc = cuda_arena_alloc,
	.arena_free = cuda_arena_free,
	.copy_d2d = cuda_copy_d2d,
	.gather_h2d = cuda_gather_h2d,
	.load_h2d = cuda_gather_h2d,
	.scratch = cuda_scratch,
	.save = cuda_save,
	.append = cuda_append,
	.save_wait = cuda_save_wait,
	.save_event = cuda_save_event,
	.read_many = cuda_read_many,
	.read_d2h = cuda_read_d2h,
	.sync = cuda_sync,
	.select = cuda_select,
	.block_meta = cuda_block_meta,
	.attend = cuda_attend,
	.attend_batch = cuda_attend_batch,
	.dmem_alloc = cuda_dmem_alloc,
	.dmem_free = cuda_dmem_free,
	.dmem_copy = cuda_dmem_copy,
	.meta_build = cuda_meta_build,
	.quest = cuda_quest,
	.region_run = cuda_region_run,
	.region_host = cuda_region_host,
	.region_wait = cuda_region_wait,
	.region_order = cuda_region_order,
	.stats = cuda_stats,
};

const struct kvt_cuda_calib *kvt_cuda_calibration(const struct kvt_be *b)
{
	return &((const struct cuda_backend *)b)->calib;
}

int kvt_cuda_describe(char *gpu, size_t gpu_len, int *driver, int *runtime)
{
	struct cudaDeviceProp prop;
	int dev = 0;

	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaGetDeviceProperties(&prop, dev) != cudaSuccess ||
	    cudaDriverGetVersion(driver) != cudaSuccess ||
	    cudaRuntimeGetVersion(runtime) != cudaSuccess)
		return -ENODEV;
	snprintf(gpu, gpu_len, "%s", prop.name);
	return 0;
}

/* ---- The plugin's face ---------------------------------------------------------------------- */

static int cuda_probe(char *why, size_t why_len)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		snprintf(why, why_len, "no usable CUDA device: %s", cudaGetErrorString(e));
		return -ENODEV;
	}
	if (n == 0) {
		snprintf(why, why_len, "no CUDA device");
		return -ENODEV;
	}
	return 0;
}

static const struct kvt_plugin plugin = {
	.abi = KVT_PLUGIN_ABI,
	.size = sizeof(struct kvt_plugin),
	.ops = &kvt_backend_cuda_ops,
	.probe = cuda_probe,
	.bench = kvt_cuda_bench,
	.calibrate = kvt_cuda_calibrate,
};

__attribute__((visibility("default"))) const struct kvt_plugin *
kvt_cuda_plugin_entry(const struct kvt_plugin_host *host);

__attribute__((visibility("default"))) const struct kvt_plugin *
kvt_cuda_plugin_entry(const struct kvt_plugin_host *host)
{
	if (!host || host->abi != KVT_PLUGIN_ABI || host->size < sizeof(*host))
		return NULL;
	kvt_cuda_host = host;
	return &plugin;
}
