/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "fault.h"
#include "idmap.h"
#include "util.h"

static inline uint32_t home_of(const struct kvt_idmap *map, uint64_t key)
{
	/* Fibonacci hashing: spreads consecutive ids (the common case) over the table with one
	   multiply; the top bits are the best mixed. */
	return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> map->shift);
}

static int alloc_slots(struct kvt_idmap *map, uint32_t cap)
{
	map->slots = kvt_calloc(cap, sizeof(*map->slots));
	if (!map->slots)
		return -ENOMEM;
	map->cap = cap;
	map->shift = 64 - (uint32_t)__builtin_ctz(cap);
	return 0;
}

int kvt_idmap_init(struct kvt_idmap *map)
{
	*map = (struct kvt_idmap){0};
	return alloc_slots(map, 64);
}

void kvt_idmap_fini(struct kvt_idmap *map)
{
	free(map->slots);
	*map = (struct kvt_idmap){0};
}

void *kvt_idmap_get(const struct kvt_idmap *map, uint64_t key)
{
	for (uint32_t i = home_of(map, key);; i = (i + 1) & (map->cap - 1)) {
		const struct kvt_idmap_slot *e = &map->slots[i];

		if (!e->val || e->key == key)
			return e->val;
	}
}

/* Puts key -> val in the first free slot of its probe run; the map has room. */
static void insert(struct kvt_idmap *map, uint64_t key, void *val)
{
	uint32_t i = home_of(map, key);

	while (map->slots[i].val)
		i = (i + 1) & (map->cap - 1);
	map->slots[i] = (struct kvt_idmap_slot){key, val};
	map->n++;
}

int kvt_idmap_reserve(struct kvt_idmap *map, uint32_t more)
{
	while (2 * ((uint64_t)map->n + more) > map->cap) {
		struct kvt_idmap old = *map;

		if (old.cap > UINT32_MAX / 2 || alloc_slots(map, old.cap * 2)) {
			*map = old;
			return -ENOMEM;
		}
		map->n = 0;
		for (uint32_t i = 0; i < old.cap; i++)
			if (old.slots[i].val)
				insert(map, old.slots[i].key, old.slots[i].val);
		ALWAYS(map->n == old.n);
		free(old.slots);
	}
	return 0;
}

int kvt_idmap_put(struct kvt_idmap *map, uint64_t key, void *val)
{
	/* The callers looked the key up first (a live id is the caller's -EEXIST). */
	if (NEVER(!val) || NEVER(kvt_idmap_get(map, key) != NULL))
		return -EINVAL;
	if (kvt_idmap_reserve(map, 1))
		return -ENOMEM;
	insert(map, key, val);
	return 0;
}

void kvt_idmap_del(struct kvt_idmap *map, uint64_t key)
{
	uint32_t mask = map->cap - 1, i = home_of(map, key), j;

	while (map->slots[i].val && map->slots[i].key != key)
		i = (i + 1) & mask;
	if (!map->slots[i].val)
		return;
	/* Backward shift: pull later entries of the probe run into the hole unless their home
	   lies cyclically in (hole, their slot]. */
	for (j = (i + 1) & mask; map->slots[j].val; j = (j + 1) & mask) {
		uint32_t home = home_of(map, map->slots[j].key);

		if (((j - home) & mask) >= ((j - i) & mask)) {
			map->slots[i] = map->slots[j];
			i = j;
		}
	}
	map->slots[i].val = NULL;
	map->n--;
}
