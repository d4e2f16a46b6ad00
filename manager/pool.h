/* SPDX-License-Identifier: MIT */
/*
 * A pool of n equal units identified by 32-bit ids, used for device frame groups and host block
 * groups (a group is one block per kv head, contiguous, so a (sequence, layer, block index)
 * needs one id for all its heads). Allocation and free are O(1) per unit: a stack of free ids.
 * A bitmap of units in use catches double frees and frees of ids never handed out.
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

#include <stdbool.h>
#include <stdint.h>

struct kvt_pool {
	uint32_t n_units;
	uint32_t n_free;
	uint32_t *free_ids; /* free_ids[0 .. n_free) are free; the top is handed out next */
	uint64_t *in_use;   /* bit per unit */
	/* When the pool's memory is host-addressable and the build has ASan, free units are
	   poisoned so a stale write into a freed block is reported. NULL: no poisoning. */
	uint8_t *poison_base;
	uint64_t unit_bytes;
};

/* Sets up a pool of n_units (>= 1, < UINT32_MAX) units, all free, handed out in ascending id
   order at first. poison_base/unit_bytes as above (poison_base may be NULL). 0, -EINVAL,
   -ENOMEM. */
int kvt_pool_init(struct kvt_pool *p, uint32_t n_units, void *poison_base, uint64_t unit_bytes);

/* Frees the pool's tables (not the memory its ids describe). Safe on a zeroed pool. */
void kvt_pool_fini(struct kvt_pool *p);

/* Takes n ids into ids[0 .. n). All or nothing: -ENOMEM when fewer than n are free, and
   then nothing is taken. n == 0 succeeds. */
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
	return id < p->n_units && (p->in_use[id >> 6] >> (id & 63)) & 1;
}

#endif /* KVT_POOL_H */
