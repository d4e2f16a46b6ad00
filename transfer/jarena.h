/* SPDX-License-Identifier: MIT */
/*
 * A private jemalloc arena per backend instance: host-tier arenas and staging buffers come from
 * it, so their pages never mix with the process's malloc heap and destroying the arena returns
 * everything at once. Destroyed arenas are kept, emptied, for the next backend (jarena.c says
 * why). The CUDA backend gives its arena extent hooks that hand out pinned memory.
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
/* Discards every allocation still in the arena and gives the arena back: its unused pages go
   back to the system, its address space to the next kvt_jarena_create. Safe on a never-created
   arena. */
void kvt_jarena_destroy(struct kvt_jarena *a);
/* Page-aligned (or align, if larger) allocation; NULL on failure or bytes == 0. */
void *kvt_jarena_alloc(struct kvt_jarena *a, size_t bytes, size_t align);
void kvt_jarena_free(struct kvt_jarena *a, void *p);

#endif /* KVT_JARENA_H */
