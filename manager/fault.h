/* SPDX-License-Identifier: MIT */
/*
 * Fault injection, a test-only hook compiled into every build: a test arms it so that the N-th
 * hit of a fault site fails as the real failure would (an allocation returns NULL, a transfer
 * returns -EIO, an io_uring completion reports -EIO). Sites:
 *   KVT_FAULT_ALLOC  every heap allocation of the library (kvt_malloc and friends below)
 *   KVT_FAULT_XFER   every backend transfer call (copy_d2d, gather_h2d, save, append, read_d2h)
 *   KVT_FAULT_IO     every io_uring completion of the disk tier (and each modelled disk I/O)
 *   KVT_FAULT_CUDA   every CUDA runtime call of the CUDA backend (when it is built)
 * Hits are counted on the thread that armed the hook only, so the library's own threads (save
 * threads) never fire it; unarmed, a site costs one relaxed atomic load.
 */
#ifndef KVT_FAULT_H
#define KVT_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

enum kvt_fault_site {
	KVT_FAULT_ALLOC = 0,
	KVT_FAULT_XFER = 1,
	KVT_FAULT_IO = 2,
	KVT_FAULT_CUDA = 3,
	KVT_FAULT_SITES = 4,
};

#define KVT_FAULT_ALL ((1u << KVT_FAULT_SITES) - 1)

/* Non-zero while some thread has the hook armed. */
extern atomic_uint kvt_fault_armed;

/* Arms the hook on the calling thread: from now on, hits of the sites in `mask` (bits
   1 << site) are counted, and the hit numbered nth (1-based) fails; nth == 0 only counts.
   Replaces any earlier arming of this thread. */
void kvt_fault_arm(uint32_t mask, uint64_t nth);
/* Disarms the calling thread's hook; returns the hits counted since it was armed. */
uint64_t kvt_fault_disarm(void);
/* Hits counted so far on the calling thread, and whether the armed hit has fired. */
uint64_t kvt_fault_hits(void);
bool kvt_fault_fired(void);
/* Site of the hit that fired (KVT_FAULT_SITES when none). */
enum kvt_fault_site kvt_fault_fired_site(void);

bool kvt_fault_slow(enum kvt_fault_site site);

/* Whether this hit of `site` must fail. */
static inline bool kvt_fault(enum kvt_fault_site site)
{
	if (__builtin_expect(!atomic_load_explicit(&kvt_fault_armed, memory_order_relaxed), 1))
		return false;
	return kvt_fault_slow(site);
}

/* The library's allocation functions: the C library's, behind the ALLOC site. */
static inline void *kvt_malloc(size_t n)
{
	return kvt_fault(KVT_FAULT_ALLOC) ? NULL : malloc(n);
}

static inline void *kvt_calloc(size_t n, size_t size)
{
	return kvt_fault(KVT_FAULT_ALLOC) ? NULL : calloc(n, size);
}

static inline void *kvt_realloc(void *p, size_t n)
{
	return kvt_fault(KVT_FAULT_ALLOC) ? NULL : realloc(p, n);
}

static inline void *kvt_aligned_alloc(size_t align, size_t n)
{
	return kvt_fault(KVT_FAULT_ALLOC) ? NULL : aligned_alloc(align, n);
}

#endif /* KVT_FAULT_H */
