/* SPDX-License-Identifier: MIT */
/*
 * A pool of n equal units identified by 32-bit ids, used for device frame groups and host block
 * groups (a group is one block per kv head, contiguous, so a (sequence, layer, block index)
 * needs one id for all its heads). Allocation and free are O(1) per unit: ids never handed out
 * come from a high-water counter (ascending), returned ids from a stack (most recently freed
 * first), which is used first. A bitmap of units in use catches double frees and frees of ids
 * never handed out.
 *
 * Set-up is O(1) whatever n is: the stack and the bitmap are address space reserved at init
 * (mmap, MAP_NORESERVE: about 4.1 bytes per unit, 17.6 GiB for 2^32 units) whose pages the
 * kernel supplies only when first written, and they are written only below the high-water
 * mark. A tier of a few TB (hundreds of millions of units) costs nothing until it is used, and
 * then memory in proportion to the units that have been in use at once, never more than
 * before (4.1 bytes per unit).
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

#include <stdbool.h>
#include <stdint.h>

struct kvt_pool {
	uint32_t n_units;
	uint32_t n_free;    /* n_stacked + (n_units - fresh) */
	uint32_t fresh;	    /* ids [fresh, n_units) were never handed out */
	uint32_t n_stacked; /* free_ids[0 .. n_stacked) were returned; the top goes out next */
	uint32_t *free_ids; /* room for n_units ids (reserved, see above) */
	uint64_t *in_use;   /* bit per unit; only the words below fresh are ever written */
	/* When the pool's memory is host-addressable and the build has ASan, free units are
	   poisoned so a stale write into a freed block is reported. NULL: no poisoning. */
	uint8_t *poison_base;
	uint64_t unit_bytes;
};

/* Sets up a pool of n_units (>= 1, < UINT32_MAX) units, all free, handed out in ascending id
   order at first. O(1): no per-unit work (but the ASan poisoning of the whole memory, when
   poison_base is given). poison_base/unit_bytes as above (poison_base may be NULL). 0, -EINVAL,
   -ENOMEM (no address space for the tables), and then *p is a zeroed pool. */
int kvt_pool_init(struct kvt_pool *p, uint32_t n_units, void *poison_base, uint64_t unit_bytes);

/* Frees the pool's tables (not the memory its ids describe). Safe on a zeroed pool. */
void kvt_pool_fini(struct kvt_pool *p);

/* Takes n ids into ids[0 .. n): the most recently returned ids first, then ids never handed
   out, ascending. All or nothing: -ENOMEM when fewer than n are free, and then nothing is
   taken. Never allocates, so it cannot fail while n <= n_free. n == 0 succeeds. */
int kvt_pool_alloc(struct kvt_pool *p, uint32_t n, uint32_t *ids);

/* Returns n ids. -EINVAL (and nothing returned) if any id is out of range, not in use, or
   repeated within ids: the pool is never corrupted by a bad free. */
int kvt_pool_free(struct kvt_pool *p, const uint32_t *ids, uint32_t n);

static inline uint32_t kvt_pool_used(const struct kvt_pool *p)
{
	return p->n_units - p->n_free;
}

static inline bool kvt_pool_is_used(const struct kvt_pool *p, uint32_t id)
{
	return id < p->fresh && (p->in_use[id >> 6] >> (id & 63)) & 1;
}

/* Starts loading the bitmap word of id, which a free of id writes. */
static inline void kvt_pool_prefetch(const struct kvt_pool *p, uint32_t id)
{
	if (id < p->fresh)
		__builtin_prefetch(&p->in_use[id >> 6], 1);
}

#endif /* KVT_POOL_H */
