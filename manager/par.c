/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "par.h"
#include "thread.h"
#include "fault.h"
#include "util.h"

struct par_worker {
	struct kvt_par *p;
	uint32_t part;
	pthread_t th;
};

struct kvt_par {
	pthread_mutex_t mu;
	pthread_cond_t go;   /* workers wait for a new job (gen moves) or stop */
	pthread_cond_t done; /* the caller waits for pending to reach 0 */
	uint64_t gen;	     /* jobs started */
	uint32_t pending;    /* parts of the job at hand still running on workers */
	bool stop;
	kvt_par_fn fn;
	void *ctx;
	uint32_t n, n_started;
	struct par_worker w[]; /* [n - 1] */
};

static void *par_main(void *arg)
{
	struct par_worker *w = arg;
	struct kvt_par *p = w->p;
	uint64_t seen = 0;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->mu);
		if (p->stop)
			break;
		seen = p->gen;
		kvt_par_fn fn = p->fn;
		void *ctx = p->ctx;

		pthread_mutex_unlock(&p->mu);
		fn(ctx, w->part, p->n);
		pthread_mutex_lock(&p->mu);
		if (--p->pending == 0)
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
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	for (uint32_t k = 1; k < threads; k++) {
		struct par_worker *w = &p->w[k - 1];
		int e;

		w->p = p;
		w->part = k;
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

void kvt_par_run(struct kvt_par *p, kvt_par_fn fn, void *ctx)
{
	pthread_mutex_lock(&p->mu);
	ALWAYS(p->pending == 0);
	p->fn = fn;
	p->ctx = ctx;
	p->pending = p->n - 1;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	fn(ctx, 0, p->n);
	pthread_mutex_lock(&p->mu);
	while (p->pending)
		pthread_cond_wait(&p->done, &p->mu);
	pthread_mutex_unlock(&p->mu);
}
