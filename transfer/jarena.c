/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

#include <jemalloc/jemalloc.h>

#include "jarena.h"

/*
 * The arenas' extent hooks: plain anonymous mappings, unmapped when jemalloc lets an extent go
 * and when the arena is destroyed. With jemalloc's default hooks an arena retains its address
 * space (opt.retain, on by default on 64-bit Linux) and `arena.<i>.destroy` never gives back
 * the blocks of its metadata, so every backend created and destroyed left 2 MiB and more of
 * address space behind (3,000 managers: 0.6 -> 6.2 GiB of VmSize). Anonymous mappings may be
 * split and merged anywhere, so both are accepted; they are always committed.
 */
static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment,
			bool *zero, bool *commit, unsigned arena_ind)
{
	size_t align = alignment > 4096 ? alignment : 4096;
	size_t total = size + (align - 4096);
	uintptr_t a;
	char *p;

	(void)h, (void)arena_ind;
	if (new_addr || size == 0 || total < size) /* in-place growth is never offered */
		return NULL;
	p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	a = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
	if (a > (uintptr_t)p) /* the over-mapped head and tail go back at once */
		munmap(p, a - (uintptr_t)p);
	if ((uintptr_t)p + total > a + size)
		munmap((void *)(a + size), (uintptr_t)p + total - (a + size));
	*zero = true; /* fresh anonymous pages */
	*commit = true;
	return (void *)a;
}

static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed,
			unsigned arena_ind)
{
	(void)h, (void)committed, (void)arena_ind;
	return munmap(addr, size) != 0; /* false: gone, jemalloc forgets it */
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed,
			 unsigned arena_ind)
{
	(void)h, (void)committed, (void)arena_ind;
	munmap(addr, size);
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
			unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)offset, (void)length, (void)arena_ind;
	return false; /* always committed */
}

static bool hook_decommit(extent_hooks_t *h, void *addr, size_t size, size_t offset, size_t length,
			  unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)offset, (void)length, (void)arena_ind;
	return true; /* refused: jemalloc purges instead */
}

static bool hook_purge_forced(extent_hooks_t *h, void *addr, size_t size, size_t offset,
			      size_t length, unsigned arena_ind)
{
	(void)h, (void)size, (void)arena_ind;
	return madvise((char *)addr + offset, length, MADV_DONTNEED) != 0;
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
		       bool committed, unsigned arena_ind)
{
	(void)h, (void)addr, (void)size, (void)size_a, (void)size_b, (void)committed,
		(void)arena_ind;
	return false;
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
		       bool committed, unsigned arena_ind)
{
	(void)h, (void)addr_a, (void)size_a, (void)addr_b, (void)size_b, (void)committed,
		(void)arena_ind;
	return false;
}

/* jemalloc keeps a pointer to it for the arena's life: one table, never written, for all. */
static extent_hooks_t jarena_hooks = {
	.alloc = hook_alloc,
	.dalloc = hook_dalloc,
	.destroy = hook_destroy,
	.commit = hook_commit,
	.decommit = hook_decommit,
	.purge_forced = hook_purge_forced,
	.split = hook_split,
	.merge = hook_merge,
};

int kvt_jarena_create(struct kvt_jarena *a)
{
	extent_hooks_t *hp = &jarena_hooks;
	size_t sz = sizeof(a->ind);

	a->live = 0;
	if (mallctl("arenas.create", &a->ind, &sz, &hp, sizeof(hp)) != 0)
		return -ENOMEM;
	a->live = 1;
	return 0;
}

void kvt_jarena_destroy(struct kvt_jarena *a)
{
	char name[64];

	if (!a->live)
		return;
	snprintf(name, sizeof(name), "arena.%u.destroy", a->ind);
	mallctl(name, NULL, NULL, NULL, 0);
	a->live = 0;
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
