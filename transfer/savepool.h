/* SPDX-License-Identifier: MIT */
/*
 * The save path shared by every backend that carries payload (FlashD2H's shape): a save job's
 * sources are copied, in chunks of at most staging_bytes, into one of two staging buffers
 * (ping-pong) by a backend-supplied copy; the save threads then scatter each chunk into host
 * blocks while the caller goes on. With 0 threads the caller scatters before submit returns.
 *
 * Completion: every submit gets a ticket (1, 2, ...); kvt_savepool_wait(t) returns once every
 * job with ticket <= t has been scattered. At most two chunks are in flight (one per staging
 * buffer), so a submit waits only for the chunk that last used its buffer.
 *
 * Failure: a chunk whose asynchronous copy failed (the wait function says so) is left
 * unscattered, and the pool remembers the lowest ticket that lost a chunk: a wait that covers
 * it fails from then on, one for earlier tickets does not (their saves landed).
 */
#ifndef KVT_SAVEPOOL_H
#define KVT_SAVEPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Scatters items [i0, i1) of a job, clipped to the chunk [c0, c1) of the concatenated
   sources, whose bytes are at stage. ctx is the job's copied context. */
typedef void (*kvt_scatter_fn)(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
			       uint64_t c0, uint64_t c1, const void *ctx);

/* Copies bytes [off, off + len) of the concatenated sources into stage (buffer index buf).
   Returns 0 or -errno (detail in the backend's err). */
typedef int (*kvt_stage_copy_fn)(void *cctx, int buf, void *stage, const struct kvt_save_src *src,
				 uint32_t n_src, uint64_t off, uint64_t len);

/* (optional) Called by the scattering thread before it reads buffer buf: waits for an
   asynchronous stage copy to land. 0, or -errno when the copy failed (the backend logs the
   detail): then the chunk is not scattered and every wait that covers its save fails. */
typedef int (*kvt_stage_wait_fn)(void *cctx, int buf);

/* Allocates host memory for staging and tables (the backend's allocator: pinned for CUDA). */
struct kvt_savepool_alloc {
	void *(*alloc)(void *actx, size_t bytes);
	void (*free)(void *actx, void *ptr, size_t bytes);
	void *actx;
};

struct kvt_save_job {
	const struct kvt_save_src *src;
	uint32_t n_src;
	const void *items; /* copied by submit */
	uint32_t n_items;
	uint32_t item_size;
	kvt_scatter_fn scatter;
	const void *ctx; /* copied by submit; at most KVT_SAVE_CTX_MAX bytes */
	uint32_t ctx_size;
};

#define KVT_SAVE_CTX_MAX 64
#define KVT_SAVE_MAX_THREADS 64

struct kvt_savepool;

/* threads <= KVT_SAVE_MAX_THREADS; staging_bytes >= 4096. 0, -EINVAL, -ENOMEM, -EAGAIN
   (a thread could not be started). */
int kvt_savepool_create(uint32_t threads, uint64_t staging_bytes,
			const struct kvt_savepool_alloc *alloc, kvt_stage_copy_fn copy,
			kvt_stage_wait_fn wait, void *cctx, struct kvt_savepool **out);

/* Waits for every job, stops the threads, frees everything. NULL is a no-op. */
void kvt_savepool_destroy(struct kvt_savepool *sp);

/* Submits a job. On failure (-ENOMEM growing the item tables, or a stage copy's error) the
   chunks handed over before the failure may still be scattering: a caller that frees the
   destinations must kvt_savepool_wait(UINT64_MAX) first. Nothing was scattered when the first
   chunk's copy failed. A job with zero source bytes completes at once. */
int kvt_savepool_submit(struct kvt_savepool *sp, const struct kvt_save_job *job, uint64_t *ticket);

/* Blocks until every job with ticket <= t is scattered or failed. 0, or the error of the
   failed wait of the lowest ticket that lost a chunk when that ticket is <= t. */
int kvt_savepool_wait(struct kvt_savepool *sp, uint64_t t);

/* Ticket of the latest submit (0 before the first). */
uint64_t kvt_savepool_last_ticket(const struct kvt_savepool *sp);

/* Scatter functions for the two job kinds the manager submits. */
void kvt_scatter_xfer(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
		      uint64_t c0, uint64_t c1, const void *ctx);
/* ctx: struct kvt_append_scatter_ctx. Sources: k then v, each n * n_heads rows. */
struct kvt_append_scatter_ctx {
	struct kvt_append_geom g;
	uint32_t n;
};
void kvt_scatter_append(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
			uint64_t c0, uint64_t c1, const void *ctx);

/* The two jobs every backend submits, as kvt_savepool_submit: a save (backend.h's save: x's src
   are offsets into the concatenated sources), and the save of a decode append (k, v: [n]
   [n_heads][row] each, scattered to a[i].host). */
int kvt_savepool_submit_xfer(struct kvt_savepool *sp, const struct kvt_save_src *src,
			     uint32_t n_src, const struct kvt_xfer *x, uint32_t n,
			     uint64_t *ticket);
int kvt_savepool_submit_append(struct kvt_savepool *sp, uint64_t k, uint64_t v, uint32_t n,
			       const struct kvt_append *a, const struct kvt_append_geom *g,
			       uint64_t *ticket);

#endif /* KVT_SAVEPOOL_H */
