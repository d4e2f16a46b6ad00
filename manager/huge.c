/* SPDX-License-Identifier: MIT */
/*
 * Table memory on transparent huge pages (huge.h): one jemalloc arena per process, made at the
 * first use, whose extent hooks are jemalloc's own except for the one that maps fresh memory:
 * it asks for 2 MiB alignment (so that whole huge pages fit in what it maps) and marks the
 * mapping MADV_HUGEPAGE. jemalloc grows an arena's mappings geometrically from 2 MiB, so a few
 * mappings hold every table.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <jemalloc/jemalloc.h>

#include "fault.h"
#include "huge.h"

/* Sanitized builds keep the C library's allocator, which the sanitizers intercept. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HUGE_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HUGE_SANITIZED 1
#endif
#endif
#ifndef HUGE_SANITIZED
#define HUGE_SANITIZED 0
#endif

#define HUGE_PAGE ((size_t)2 << 20)

static struct {
	pthread_once_t once;
	bool active;
	unsigned arena;
	int flags;	      /* mallocx flags of the arena */
	extent_hooks_t *dflt; /* jemalloc's default hooks (arena 0's) */
	extent_hooks_t hooks; /* the arena's: dflt's, but alloc */
} huge = {.once = PTHREAD_ONCE_INIT};

static void *huge_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
			bool *zero, bool *commit, unsigned arena_ind)
{
	void *p;

	(void)h;
	/* a fresh mapping of whole huge pages starts on one, so every page of it can be huge */
	if (!new_addr && size % HUGE_PAGE == 0 && alignment < HUGE_PAGE)
		alignment = HUGE_PAGE;
	p = huge.dflt->alloc(huge.dflt, new_addr, size, alignment, zero, commit, arena_ind);
	if (p)
		(void)madvise(p, size, MADV_HUGEPAGE); /* a hint: refused, the pages stay small */
	return p;
}

static void huge_init(void)
{
	const char *off = getenv("KVTIER_HUGE_TABLES");
	extent_hooks_t *hp = &huge.hooks;
	size_t sz = sizeof(huge.dflt);

	if (HUGE_SANITIZED || (off && strcmp(off, "0") == 0))
		return;
	if (mallctl("arena.0.extent_hooks", &huge.dflt, &sz, NULL, 0) != 0 || !huge.dflt ||
	    !huge.dflt->alloc)
		return;
	huge.hooks = *huge.dflt;
	huge.hooks.alloc = huge_alloc;
	sz = sizeof(huge.arena);
	if (mallctl("arenas.create", &huge.arena, &sz, &hp, sizeof(hp)) != 0)
		return;
	huge.flags = (int)(MALLOCX_ARENA(huge.arena) | MALLOCX_TCACHE_NONE);
	huge.active = true;
}

bool kvt_huge_active(void)
{
	pthread_once(&huge.once, huge_init);
	return huge.active;
}

void *kvt_huge_realloc(void *p, size_t n)
{
	if (n == 0 || kvt_fault(KVT_FAULT_ALLOC))
		return NULL;
	if (!kvt_huge_active())
		return realloc(p, n);
	return p ? rallocx(p, n, huge.flags) : mallocx(n, huge.flags);
}

void *kvt_huge_calloc(size_t n, size_t size)
{
	void *p;

	if (size && n > SIZE_MAX / size)
		return NULL;
	p = kvt_huge_realloc(NULL, n * size);
	if (p)
		memset(p, 0, n * size);
	return p;
}

void kvt_huge_free(void *p)
{
	if (!p)
		return;
	if (huge.active) /* set before any pointer was handed out */
		dallocx(p, MALLOCX_TCACHE_NONE);
	else
		free(p);
}
