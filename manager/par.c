/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "par.h"
#include "thread.h"
#include "fault.h"
#include "util.h"

struct par_worker {
	struct kvt_par *p;
	uint32_t slot; /* its scratch slot: 1 .. n - 1 */
	pthread_t th;
};

struct kvt_par {
	pthread_mutex_t mu;
	pthread_cond_t go;   /* workers wait for a new job (gen moves) or stop */
	pthread_cond_t done; /* the caller waits for pending to reach 0 */
	atomic_ullong gen;   /* jobs started (changed under mu; read without it by par_poll) */
	uint32_t pending;    /* workers that joined the job at hand and have not left it */
	bool open;	     /* the job at hand may still be joined */
	bool stop;
	kvt_par_fn fn;
	void *ctx;
	uint32_t n_items;
	atomic_uint next; /* the job's next item to claim */
	uint32_t n, n_started;
	struct par_worker w[]; /* [n - 1] */
};

/* Claims and runs the job's items until none is left. */
static void par_claim(struct kvt_par *p, kvt_par_fn fn, void *ctx, uint32_t n_items, uint32_t slot)
{
	for (;;) {
		uint32_t item = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);

		if (item >= n_items)
			return;
		fn(ctx, slot, item);
	}
}

/* How long a worker that finished a job looks for the next before it sleeps. A decode step's
   calls come back to back, tens of microseconds apart in a replay, and a worker woken from
   sleep takes about that long to run: one that sleeps between them joins late and takes
   little. OpenMP runtimes spin far longer (KMP_BLOCKTIME: 200 ms). */
#define PAR_POLL_NS 250000

/* Looks for a job after `seen` for up to PAR_POLL_NS, giving the CPU to any other runnable
   thread between looks (so a busy machine loses nothing to it but the looks). */
static void par_poll(struct kvt_par *p, uint64_t seen)
{
	uint64_t t0 = kvt_now_ns();

	while (atomic_load_explicit(&p->gen, memory_order_relaxed) == seen &&
	       kvt_now_ns() - t0 < PAR_POLL_NS)
		sched_yield();
}

static void *par_main(void *arg)
{
	struct par_worker *w = arg;
	struct kvt_par *p = w->p;
	uint64_t seen = 0;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		if (!p->stop && p->gen == seen) {
			pthread_mutex_unlock(&p->mu);
			par_poll(p, seen);
			pthread_mutex_lock(&p->mu);
		}
		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->mu);
		if (p->stop)
			break;
		seen = p->gen;
		if (!p->open) /* woken too late: the caller has claimed every item */
			continue;
		p->pending++;
		kvt_par_fn fn = p->fn;
		void *ctx = p->ctx;
		uint32_t n_items = p->n_items;

		pthread_mutex_unlock(&p->mu);
		par_claim(p, fn, ctx, n_items, w->slot);
		pthread_mutex_lock(&p->mu);
		if (--p->pending == 0 && !p->open)
			pthread_cond_signal(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int kvt_par_create(uint32_t threads, struct kvt_par **out)
{
	struct kvt_par *p;
	int err = 0;

	*out = NULL;
	if (threads < 2 || threads > KVT_PAR_MAX_THREADS)
		return -EINVAL;
	p = kvt_calloc(1, sizeof(*p) + (threads - 1) * sizeof(p->w[0]));
	if (!p)
		return -ENOMEM;
	p->n = threads;
	atomic_init(&p->next, 0);
	atomic_init(&p->gen, 0);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	for (uint32_t k = 1; k < threads; k++) {
		struct par_worker *w = &p->w[k - 1];
		int e;

		w->p = p;
		w->slot = k;
		e = kvt_thread_create(&w->th, "kvt-par", par_main, w);
		if (e) {
			err = -e;
			goto fail;
		}
		p->n_started++;
	}
	*out = p;
	return 0;
fail:
	kvt_par_destroy(p);
	return err;
}

void kvt_par_destroy(struct kvt_par *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	for (uint32_t k = 0; k < p->n_started; k++)
		pthread_join(p->w[k].th, NULL);
	pthread_cond_destroy(&p->done);
	pthread_cond_destroy(&p->go);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

void kvt_par_run(struct kvt_par *p, kvt_par_fn fn, void *ctx, uint32_t n_items)
{
	if (!p || n_items < 2) { /* nothing to share */
		for (uint32_t item = 0; item < n_items; item++)
			fn(ctx, 0, item);
		return;
	}
	pthread_mutex_lock(&p->mu);
	ALWAYS(p->pending == 0 && !p->open);
	p->fn = fn;
	p->ctx = ctx;
	p->n_items = n_items;
	atomic_store_explicit(&p->next, 0, memory_order_relaxed);
	p->open = true;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	par_claim(p, fn, ctx, n_items, 0);
	/* every item is claimed: those of workers that joined may still run */
	pthread_mutex_lock(&p->mu);
	p->open = false;
	while (p->pending)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
}
