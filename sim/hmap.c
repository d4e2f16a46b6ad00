/* SPDX-License-Identifier: MIT */
/* The simulator's u64 -> u32 map (hmap.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hmap.h"

/* A 64-bit mix (splitmix64's finaliser): trace ids are small consecutive integers, which
   would cluster in a table indexed by their low bits. */
static size_t slot_of(const struct sim_hmap *h, uint64_t key)
{
	key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ull;
	key = (key ^ (key >> 27)) * 0x94d049bb133111ebull;
	return (size_t)(key ^ (key >> 31)) & (h->cap - 1);
}

void sim_hmap_fini(struct sim_hmap *h)
{
	free(h->keys);
	free(h->vals);
	memset(h, 0, sizeof(*h));
}

uint32_t sim_hmap_get(const struct sim_hmap *h, uint64_t key)
{
	if (!h->cap)
		return SIM_HMAP_NONE;
	for (size_t i = slot_of(h, key);; i = (i + 1) & (h->cap - 1)) {
		if (h->vals[i] == SIM_HMAP_NONE)
			return SIM_HMAP_NONE;
		if (h->keys[i] == key)
			return h->vals[i];
	}
}

/* Puts key at its place in a table known to have room and not to hold it. */
static void insert(struct sim_hmap *h, uint64_t key, uint32_t val)
{
	size_t i = slot_of(h, key);

	while (h->vals[i] != SIM_HMAP_NONE)
		i = (i + 1) & (h->cap - 1);
	h->keys[i] = key;
	h->vals[i] = val;
	h->n++;
}

static int grow(struct sim_hmap *h)
{
	struct sim_hmap g = {0};

	g.cap = h->cap ? h->cap * 2 : 64;
	g.keys = malloc(g.cap * sizeof(*g.keys));
	g.vals = malloc(g.cap * sizeof(*g.vals));
	if (!g.keys || !g.vals) {
		free(g.keys);
		free(g.vals);
		return -ENOMEM;
	}
	memset(g.vals, 0xff, g.cap * sizeof(*g.vals)); /* SIM_HMAP_NONE */
	for (size_t i = 0; i < h->cap; i++)
		if (h->vals[i] != SIM_HMAP_NONE)
			insert(&g, h->keys[i], h->vals[i]);
	sim_hmap_fini(h);
	*h = g;
	return 0;
}

int sim_hmap_put(struct sim_hmap *h, uint64_t key, uint32_t val)
{
	if (h->cap) {
		for (size_t i = slot_of(h, key); h->vals[i] != SIM_HMAP_NONE;
		     i = (i + 1) & (h->cap - 1))
			if (h->keys[i] == key) {
				h->vals[i] = val;
				return 0;
			}
	}
	if ((h->n + 1) * 2 > h->cap && grow(h))
		return -ENOMEM;
	insert(h, key, val);
	return 0;
}

void sim_hmap_del(struct sim_hmap *h, uint64_t key)
{
	size_t i, j, mask = h->cap - 1;

	if (!h->cap)
		return;
	for (i = slot_of(h, key);; i = (i + 1) & mask) {
		if (h->vals[i] == SIM_HMAP_NONE)
			return;
		if (h->keys[i] == key)
			break;
	}
	/* backward shift: move each later entry of the run into the hole when its home slot
	   does not lie (cyclically) between the hole and it */
	for (j = (i + 1) & mask; h->vals[j] != SIM_HMAP_NONE; j = (j + 1) & mask) {
		size_t home = slot_of(h, h->keys[j]);

		if (((j - home) & mask) >= ((j - i) & mask)) {
			h->keys[i] = h->keys[j];
			h->vals[i] = h->vals[j];
			i = j;
		}
	}
	h->vals[i] = SIM_HMAP_NONE;
	h->n--;
}
