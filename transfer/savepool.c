/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "savepool.h"
#include "thread.h"

/* Slices of a chunk are at least this many bytes: waking a thread costs more than copying
   less. A chunk smaller than one slice is scattered by the submitting thread itself, unless
   its staging copy is asynchronous (then one thread waits for it and scatters). */
#define SLICE_MIN_BYTES (64u << 10)

struct stage_buf {
	uint8_t *mem;
	uint64_t ticket;  /* ticket of the chunk held */
	uint32_t pending; /* slices still to scatter; 0 = idle */
	uint64_t c0, c1;  /* the chunk's range in the concatenated sources */
	uint8_t *items;	  /* copy of the job's items */
	size_t items_cap; /* bytes */
	uint32_t n_items, item_size;
	kvt_scatter_fn scatter;
	uint8_t ctx[KVT_SAVE_CTX_MAX];
};

struct work {
	uint32_t buf, i0, i1;
};

#define QUEUE_CAP (2 * KVT_SAVE_MAX_THREADS)

struct kvt_savepool {
	pthread_mutex_t mu;
	pthread_cond_t work_cv; /* workers wait for slices */
	pthread_cond_t done_cv; /* submitters and waiters wait for idle buffers */
	struct stage_buf buf[2];
	uint32_t next_buf;
	uint64_t ticket;
	struct work q[QUEUE_CAP];
	uint32_t q_head, q_len;
	bool stop;
	uint32_t n_threads, n_started;
	pthread_t th[KVT_SAVE_MAX_THREADS];
	uint64_t staging_bytes;
	struct kvt_savepool_alloc alloc;
	kvt_stage_copy_fn copy;
	kvt_stage_wait_fn wait;
	void *cctx;
	/* The lowest ticket that lost a chunk to a failed wait (UINT64_MAX: none), and that
	   wait's error. Guarded by mu. */
	uint64_t failed_ticket;
	int failed_err;
};

static void run_slice(struct kvt_savepool *sp, const struct work *w)
{
	struct stage_buf *b = &sp->buf[w->buf];
	int err = sp->wait ? sp->wait(sp->cctx, (int)w->buf) : 0;

	/* A failed wait leaves the stage unreadable: scattering it would store garbage as
	   history. The waits that cover this save fail instead (kvt_savepool_wait). */
	if (err) {
		pthread_mutex_lock(&sp->mu);
		if (b->ticket < sp->failed_ticket) {
			sp->failed_ticket = b->ticket;
			sp->failed_err = err < 0 ? err : -EIO;
		}
		pthread_mutex_unlock(&sp->mu);
		return;
	}
	b->scatter(b->items, w->i0, w->i1, b->mem, b->c0, b->c1, b->ctx);
}

static void *worker(void *arg)
{
	struct kvt_savepool *sp = arg;

	pthread_mutex_lock(&sp->mu);
	for (;;) {
		while (!sp->stop && sp->q_len == 0)
			pthread_cond_wait(&sp->work_cv, &sp->mu);
		if (sp->q_len == 0)
			break; /* stopping and drained */
		struct work w = sp->q[sp->q_head];

		sp->q_head = (sp->q_head + 1) % QUEUE_CAP;
		sp->q_len--;
		pthread_mutex_unlock(&sp->mu);
		run_slice(sp, &w);
		pthread_mutex_lock(&sp->mu);
		if (--sp->buf[w.buf].pending == 0)
			pthread_cond_broadcast(&sp->done_cv);
	}
	pthread_mutex_unlock(&sp->mu);
	return NULL;
}

int kvt_savepool_create(uint32_t threads, uint64_t staging_bytes,
			const struct kvt_savepool_alloc *alloc, kvt_stage_copy_fn copy,
			kvt_stage_wait_fn wait, void *cctx, struct kvt_savepool **out)
{
	struct kvt_savepool *sp;
	int err = -ENOMEM;

	if (threads > KVT_SAVE_MAX_THREADS || staging_bytes < 4096 || !alloc || !copy || !out)
		return -EINVAL;
	sp = kvt_calloc(1, sizeof(*sp));
	if (!sp)
		return -ENOMEM;
	sp->staging_bytes = staging_bytes;
	sp->alloc = *alloc;
	sp->copy = copy;
	sp->wait = wait;
	sp->cctx = cctx;
	sp->failed_ticket = UINT64_MAX;
	pthread_mutex_init(&sp->mu, NULL);
	pthread_cond_init(&sp->work_cv, NULL);
	pthread_cond_init(&sp->done_cv, NULL);
	for (int i = 0; i < 2; i++) {
		sp->buf[i].mem = alloc->alloc(alloc->actx, staging_bytes);
		if (!sp->buf[i].mem)
			goto fail;
	}
	sp->n_threads = threads;
	for (uint32_t i = 0; i < threads; i++) {
		if (kvt_thread_create(&sp->th[i], "kvt-save", worker, sp) != 0) {
			err = -EAGAIN;
			goto fail;
		}
		sp->n_started++;
	}
	*out = sp;
	return 0;
fail:
	kvt_savepool_destroy(sp);
	return err;
}

void kvt_savepool_destroy(struct kvt_savepool *sp)
{
	if (!sp)
		return;
	(void)kvt_savepool_wait(sp, sp->ticket); /* a lost chunk is the waiters' to report */
	pthread_mutex_lock(&sp->mu);
	sp->stop = true;
	pthread_cond_broadcast(&sp->work_cv);
	pthread_mutex_unlock(&sp->mu);
	for (uint32_t i = 0; i < sp->n_started; i++)
		pthread_join(sp->th[i], NULL);
	for (int i = 0; i < 2; i++) {
		if (sp->buf[i].mem)
			sp->alloc.free(sp->alloc.actx, sp->buf[i].mem, sp->staging_bytes);
		free(sp->buf[i].items);
	}
	pthread_cond_destroy(&sp->work_cv);
	pthread_cond_destroy(&sp->done_cv);
	pthread_mutex_destroy(&sp->mu);
	free(sp);
}

/* Waits (mu held) until buffer i holds no unscattered chunk. */
static void wait_idle_locked(struct kvt_savepool *sp, uint32_t i)
{
	while (sp->buf[i].pending)
		pthread_cond_wait(&sp->done_cv, &sp->mu);
}

/* Makes buffer i's item table hold bytes; waits for the buffer to go idle first. */
static int reserve_items(struct kvt_savepool *sp, uint32_t i, size_t bytes)
{
	struct stage_buf *b = &sp->buf[i];
	uint8_t *p;
	size_t cap;

	if (bytes <= b->items_cap)
		return 0;
	pthread_mutex_lock(&sp->mu);
	wait_idle_locked(sp, i);
	pthread_mutex_unlock(&sp->mu);
	cap = b->items_cap ? b->items_cap : 4096;
	while (cap < bytes)
		cap *= 2;
	p = kvt_realloc(b->items, cap);
	if (!p)
		return -ENOMEM;
	b->items = p;
	b->items_cap = cap;
	return 0;
}

int kvt_savepool_submit(struct kvt_savepool *sp, const struct kvt_save_job *job, uint64_t *ticket)
{
	uint64_t total = 0, c0;
	size_t items_bytes;
	int err;

	if (job->ctx_size > KVT_SAVE_CTX_MAX || !job->scatter || (job->n_items && !job->items) ||
	    (job->ctx_size && !job->ctx))
		return -EINVAL;
	for (uint32_t i = 0; i < job->n_src; i++)
		total += job->src[i].bytes;
	items_bytes = (size_t)job->n_items * job->item_size;
	if (total == 0 || job->n_items == 0) {
		*ticket = ++sp->ticket;
		return 0;
	}
	/* Reserve every table the job's chunks will use before handing any chunk over, so a
	   failure leaves nothing half saved. */
	err = reserve_items(sp, sp->next_buf, items_bytes);
	if (!err && total > sp->staging_bytes)
		err = reserve_items(sp, sp->next_buf ^ 1, items_bytes);
	if (err)
		return err;

	/* The ticket is taken once the first chunk is handed over: a submit that fails before
	   that leaves no trace. */
	uint64_t t = sp->ticket + 1;

	for (c0 = 0; c0 < total; c0 += sp->staging_bytes) {
		uint64_t len = total - c0 < sp->staging_bytes ? total - c0 : sp->staging_bytes;
		uint32_t bi = sp->next_buf;
		struct stage_buf *b = &sp->buf[bi];

		sp->next_buf ^= 1;
		if (sp->n_threads) {
			pthread_mutex_lock(&sp->mu);
			wait_idle_locked(sp, bi);
			pthread_mutex_unlock(&sp->mu);
		}
		err = sp->copy(sp->cctx, (int)bi, b->mem, job->src, job->n_src, c0, len);
		if (err)
			return err; /* earlier chunks of this job stay scattered; this one is not */
		sp->ticket = t;
		memcpy(b->items, job->items, items_bytes);
		if (job->ctx_size)
			memcpy(b->ctx, job->ctx, job->ctx_size);
		b->n_items = job->n_items;
		b->item_size = job->item_size;
		b->scatter = job->scatter;
		b->c0 = c0;
		b->c1 = c0 + len;
		b->ticket = t;
		/* Small chunks are scattered here, unless the copy is asynchronous (a wait
		   function): then waiting for it here would hold the owner until the device got
		   that far. */
		if (sp->n_threads == 0 || (len < SLICE_MIN_BYTES && !sp->wait)) {
			struct work w = {bi, 0, job->n_items};

			run_slice(sp, &w);
			continue;
		}
		uint64_t want = len / SLICE_MIN_BYTES;
		uint32_t slices = want < 1		 ? 1
				  : want > sp->n_threads ? sp->n_threads
							 : (uint32_t)want;

		if (slices > job->n_items)
			slices = job->n_items;
		pthread_mutex_lock(&sp->mu);
		b->pending = slices;
		for (uint32_t s = 0; s < slices; s++) {
			struct work *w = &sp->q[(sp->q_head + sp->q_len++) % QUEUE_CAP];

			w->buf = bi;
			w->i0 = (uint32_t)((uint64_t)job->n_items * s / slices);
			w->i1 = (uint32_t)((uint64_t)job->n_items * (s + 1) / slices);
		}
		if (slices == 1)
			pthread_cond_signal(&sp->work_cv);
		else
			pthread_cond_broadcast(&sp->work_cv);
		pthread_mutex_unlock(&sp->mu);
	}
	*ticket = t;
	return 0;
}

int kvt_savepool_wait(struct kvt_savepool *sp, uint64_t t)
{
	int err;

	pthread_mutex_lock(&sp->mu);
	for (uint32_t i = 0; i < 2; i++)
		while (sp->buf[i].pending && sp->buf[i].ticket <= t)
			pthread_cond_wait(&sp->done_cv, &sp->mu);
	err = sp->failed_ticket <= t ? sp->failed_err : 0;
	pthread_mutex_unlock(&sp->mu);
	return err;
}

uint64_t kvt_savepool_last_ticket(const struct kvt_savepool *sp)
{
	return sp->ticket;
}

static inline void *addr(uint64_t a)
{
	return (void *)(uintptr_t)a;
}

void kvt_scatter_xfer(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
		      uint64_t c0, uint64_t c1, const void *ctx)
{
	const struct kvt_xfer *x = items;

	(void)ctx;
	for (uint32_t e = i0; e < i1; e++) {
		for (uint32_t r = 0; r < x[e].reps; r++) {
			uint64_t s = x[e].src + r * x[e].src_stride;
			uint64_t lo = s > c0 ? s : c0;
			uint64_t hi = s + x[e].bytes < c1 ? s + x[e].bytes : c1;

			if (lo < hi)
				memcpy(addr(x[e].dst + r * x[e].dst_stride + (lo - s)),
				       stage + (lo - c0), hi - lo);
		}
	}
}

/* Copies the part of source range [s, s + len) that lies in [c0, c1) to dst. */
static inline void clip_copy(uint64_t dst, uint64_t s, uint64_t len, const uint8_t *stage,
			     uint64_t c0, uint64_t c1)
{
	uint64_t lo = s > c0 ? s : c0;
	uint64_t hi = s + len < c1 ? s + len : c1;

	if (lo < hi)
		memcpy(addr(dst + (lo - s)), stage + (lo - c0), hi - lo);
}

void kvt_scatter_append(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
			uint64_t c0, uint64_t c1, const void *ctx)
{
	const struct kvt_append *a = items;
	const struct kvt_append_scatter_ctx *sc = ctx;
	const struct kvt_append_geom *g = &sc->g;
	uint64_t row = g->row_bytes;
	uint64_t half = (uint64_t)sc->n * g->n_heads * row; /* V rows start here */

	if (c0 == 0 && c1 == 2 * half) { /* the whole job is in this chunk: no clipping */
		for (uint32_t i = i0; i < i1; i++) {
			const uint8_t *ks = stage + (uint64_t)i * g->n_heads * row;

			for (uint32_t h = 0; h < g->n_heads; h++) {
				uint64_t d = a[i].host + h * g->head_stride;

				memcpy(addr(d), ks + h * row, row);
				memcpy(addr(d + g->v_offset), ks + half + h * row, row);
			}
		}
		return;
	}
	for (uint32_t i = i0; i < i1; i++) {
		for (uint32_t h = 0; h < g->n_heads; h++) {
			uint64_t s = ((uint64_t)i * g->n_heads + h) * row;
			uint64_t d = a[i].host + h * g->head_stride;

			clip_copy(d, s, row, stage, c0, c1);
			clip_copy(d + g->v_offset, half + s, row, stage, c0, c1);
		}
	}
}

int kvt_savepool_submit_xfer(struct kvt_savepool *sp, const struct kvt_save_src *src,
			     uint32_t n_src, const struct kvt_xfer *x, uint32_t n, uint64_t *ticket)
{
	struct kvt_save_job job = {
		.src = src,
		.n_src = n_src,
		.items = x,
		.n_items = n,
		.item_size = sizeof(*x),
		.scatter = kvt_scatter_xfer,
	};

	return kvt_savepool_submit(sp, &job, ticket);
}

int kvt_savepool_submit_append(struct kvt_savepool *sp, uint64_t k, uint64_t v, uint32_t n,
			       const struct kvt_append *a, const struct kvt_append_geom *g,
			       uint64_t *ticket)
{
	uint64_t half = (uint64_t)n * g->n_heads * g->row_bytes;
	struct kvt_save_src src[2] = {{k, half}, {v, half}};
	struct kvt_append_scatter_ctx ctx = {*g, n};
	struct kvt_save_job job = {
		.src = src,
		.n_src = 2,
		.items = a,
		.n_items = n,
		.item_size = sizeof(*a),
		.scatter = kvt_scatter_append,
		.ctx = &ctx,
		.ctx_size = sizeof(ctx),
	};

	return kvt_savepool_submit(sp, &job, ticket);
}
