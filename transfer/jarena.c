/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>

#include <jemalloc/jemalloc.h>

#include "jarena.h"

int kvt_jarena_create(struct kvt_jarena *a)
{
	size_t sz = sizeof(a->ind);

	a->live = 0;
	if (mallctl("arenas.create", &a->ind, &sz, NULL, 0) != 0)
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
