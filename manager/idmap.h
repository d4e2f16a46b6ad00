/* SPDX-License-Identifier: MIT */
/*
 * A map from 64-bit ids to non-NULL pointers: the manager's sequences and the scheduler's
 * requests. Open addressing with linear probing and backward-shift deletion (no tombstones),
 * Fibonacci hashing, at most half full; key and value share a slot, so a lookup touches one
 * cache line.
 *
 * Iteration (kvt_idmap_next) goes in slot order, which depends only on the keys and the order
 * of the puts and deletes, never on addresses: the manager's victim order for spilling, which
 * iterates its sequences, is the same on every run.
 */
#ifndef KVT_IDMAP_H
#define KVT_IDMAP_H

#include <stdint.h>

struct kvt_idmap_slot {
	uint64_t key;
	void *val; /* NULL = empty slot */
};

struct kvt_idmap {
	struct kvt_idmap_slot *slots;
	uint32_t cap, n; /* cap is a power of two */
	uint32_t shift;	 /* 64 - log2(cap) */
};

/* An empty map of 64 slots: 0 or -ENOMEM (then the map is zeroed). */
int kvt_idmap_init(struct kvt_idmap *map);
/* Frees the slots, not the values. Safe on a zeroed map. */
void kvt_idmap_fini(struct kvt_idmap *map);
/* The value of key, or NULL when it is absent. */
void *kvt_idmap_get(const struct kvt_idmap *map, uint64_t key);
/* Adds key -> val (val not NULL, key absent), doubling the slots when the map would be more
   than half full: 0 or -ENOMEM, and then nothing changed. */
int kvt_idmap_put(struct kvt_idmap *map, uint64_t key, void *val);
/* Grows the slots so that `more` puts cannot fail: 0 or -ENOMEM (nothing changed). */
int kvt_idmap_reserve(struct kvt_idmap *map, uint32_t more);
/* Removes key; an absent key is no error. */
void kvt_idmap_del(struct kvt_idmap *map, uint64_t key);

/* Iteration in slot order: the value of the first occupied slot at or after *pos, with *pos
   moved past it, or NULL when none is left. Start with *pos = 0; the map must not change
   until the iteration ends. */
static inline void *kvt_idmap_next(const struct kvt_idmap *map, uint32_t *pos)
{
	for (; *pos < map->cap; (*pos)++)
		if (map->slots[*pos].val)
			return map->slots[(*pos)++].val;
	return NULL;
}

#endif /* KVT_IDMAP_H */
