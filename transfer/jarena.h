/* SPDX-License-Identifier: MIT */
/*
 * A private jemalloc arena per backend instance: host-tier arenas and staging buffers come from
 * it, so their pages never mix with the process's malloc heap and destroying the arena returns
 * everything at once. Its extent hooks map anonymous memory and unmap it, so a destroyed arena
 * leaves no address space behind (jarena.c says why). The CUDA backend does not use it: its
 * pinned arena, with hooks of its own, is in cuda.c.
 */
#ifndef KVT_JARENA_H
#define KVT_JARENA_H

#include <stddef.h>

struct kvt_jarena {
	unsigned ind;
	int live;
};

/* 0 or -ENOMEM. */
int kvt_jarena_create(struct kvt_jarena *a);
/* Discards the arena and every allocation still in it. Safe on a never-created arena. */
void kvt_jarena_destroy(struct kvt_jarena *a);
/* Page-aligned (or align, if larger) allocation; NULL on failure or bytes == 0. */
void *kvt_jarena_alloc(struct kvt_jarena *a, size_t bytes, size_t align);
void kvt_jarena_free(struct kvt_jarena *a, void *p);

#endif /* KVT_JARENA_H */
