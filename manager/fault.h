/* SPDX-License-Identifier: MIT */
/*
 * Fault injection, a test-only hook compiled into every build: a test arms it so that the N-th
 * hit of a fault site fails as the real failure would (an allocation returns NULL, a transfer
 * returns -EIO, an io_uring completion reports -EIO). Sites:
 *   KVT_FAULT_ALLOC  every heap allocation of the library (kvt_malloc and friends below)
 *   KVT_FAULT_XFER   every backend transfer call (copy_d2d, gather_h2d, save, append, read_d2h)
 *   KVT_FAULT_IO     every io_uring completion of the disk tier (and each modelled disk I/O)
 *   KVT_FAULT_CUDA   every CUDA runtime call of the CUDA backend (when it is built)
 *   KVT_FAULT_STAGE  every wait of the CUDA backend for a staging copy of the save path, made
 *                    after the copy landed, failing as an asynchronous CUDA error would
 * Hits of the first four are counted on the thread that armed the hook only, so the library's
 * own threads never fire them and a count does not depend on their timing. KVT_FAULT_STAGE is
 * the exception (KVT_FAULT_SHARED): its waits run on the save threads, so its hits are counted
 * on every thread, in one process-wide count. Unarmed, a site costs one relaxed atomic load.
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
	KVT_FAULT_STAGE = 4,
	KVT_FAULT_SITES = 5,
};

/* The sites counted on the arming thread only, and those counted on every thread. */
#define KVT_FAULT_ALL                                                              \
	((1u << KVT_FAULT_ALLOC) | (1u << KVT_FAULT_XFER) | (1u << KVT_FAULT_IO) | \
	 (1u << KVT_FAULT_CUDA))
#define KVT_FAULT_SHARED (1u << KVT_FAULT_STAGE)

/* Non-zero while some thread has the hook armed. */
extern atomic_uint kvt_fault_armed;

/* Arms the hook on the calling thread: from now on, hits of the sites in `mask` (bits
   1 << site) are counted, and the hit numbered nth (1-based) fails; nth == 0 only counts.
   Replaces any earlier arming of this thread. A mask with a KVT_FAULT_SHARED site arms it for
   every thread and must name nothing else; one thread at a time may hold it. -EINVAL (a mask
   naming an unknown site, or a shared site with others) or -EBUSY (another thread holds the
   shared site), and nothing changes; else 0. */
int kvt_fault_arm(uint32_t mask, uint64_t nth);
/* Disarms the calling thread's hook (and the shared site, if it holds it); returns the hits
   counted since it was armed. */
uint64_t kvt_fault_disarm(void);
/* Hits counted so far for the calling thread's arming (a shared site's: on every thread), and
   whether the armed hit has fired. */
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
