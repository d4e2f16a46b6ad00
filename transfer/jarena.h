/* SPDX-License-Identifier: MIT */
/*
 * A private jemalloc arena per backend instance: host-tier arenas and staging buffers come from
 * it, so their pages never mix with the process's malloc heap and destroying the arena returns
 * everything at once. The CUDA backend gives its arena extent hooks that hand out pinned memory.
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
