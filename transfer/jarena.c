/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <jemalloc/jemalloc.h>

#include "jarena.h"

/* Arenas given back by kvt_jarena_destroy, emptied, for the next kvt_jarena_create. jemalloc
   never reuses the address space that a destroyed arena retained (arena.<i>.destroy): a process
   creating and destroying backends in turn grew by 2 MiB and more each time (and 4 KiB of
   jemalloc's own structures), 6 GiB of address space over 3,000 managers. A reset arena keeps
   its mappings for the next owner instead; its pages are purged, so its memory goes back to the
   system as a destroyed one's did. The pool holds at most as many arenas as backends were ever
   live at once; it lives as long as the process. */
static struct {
	pthread_mutex_t lock;
	unsigned *ind;
	size_t n, cap;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Takes an arena from the pool into *ind: true, or false when it is empty. */
static bool pool_take(unsigned *ind)
{
	bool got;

	pthread_mutex_lock(&pool.lock);
	got = pool.n > 0;
	if (got)
		*ind = pool.ind[--pool.n];
	pthread_mutex_unlock(&pool.lock);
	return got;
}

/* Puts emptied arena ind in the pool: true, or false when the pool has no room for it (no
   memory). */
static bool pool_put(unsigned ind)
{
	bool put = true;

	pthread_mutex_lock(&pool.lock);
	if (pool.n == pool.cap) {
		size_t cap = pool.cap ? 2 * pool.cap : 8;
		unsigned *p = realloc(pool.ind, cap * sizeof(*p));

		if (p) {
			pool.ind = p;
			pool.cap = cap;
		}
	}
	if (pool.n < pool.cap)
		pool.ind[pool.n++] = ind;
	else
		put = false;
	pthread_mutex_unlock(&pool.lock);
	return put;
}

/* mallctl "arena.<ind>.<what>": 0 or jemalloc's error. */
static int arena_ctl(unsigned ind, const char *what)
{
	char name[64];

	snprintf(name, sizeof(name), "arena.%u.%s", ind, what);
	return mallctl(name, NULL, NULL, NULL, 0);
}

int kvt_jarena_create(struct kvt_jarena *a)
{
	size_t sz = sizeof(a->ind);

	a->live = 0;
	if (!pool_take(&a->ind) && mallctl("arenas.create", &a->ind, &sz, NULL, 0) != 0)
		return -ENOMEM;
	a->live = 1;
	return 0;
}

void kvt_jarena_destroy(struct kvt_jarena *a)
{
	if (!a->live)
		return;
	a->live = 0;
	/* every allocation discarded, the unused pages handed back; an arena that cannot be
	   reset or kept is destroyed (its address space then stays retained) */
	if (arena_ctl(a->ind, "reset") == 0 && arena_ctl(a->ind, "purge") == 0 && pool_put(a->ind))
		return;
	(void)arena_ctl(a->ind, "destroy");
}

void *kvt_jarena_alloc(struct kvt_jarena *a, size_t bytes, size_t align)
{
	if (!a->live || bytes == 0)
		return NULL;
	if (align < 4096)
		align = 4096;
	return mallocx(bytes, MALLOCX_ARENA(a->ind) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(align));
}

void kvt_jarena_free(struct kvt_jarena *a, void *p)
{
	(void)a;
	if (p)
		dallocx(p, MALLOCX_TCACHE_NONE);
}
