/* SPDX-License-Identifier: MIT */
/*
 * A map of 64-bit keys to 32-bit values for the replay simulator (the trace's prefix figures,
 * the vLLM baseline's prefix cache): open addressing with linear probing, kept at most half
 * full, deletion by backward shift (no tombstones, so a long run of puts and deletes keeps
 * lookups short). Not part of the library.
 */
#ifndef SIM_HMAP_H
#define SIM_HMAP_H

#include <stddef.h>
#include <stdint.h>

#define SIM_HMAP_NONE UINT32_MAX /* what a lookup of a missing key returns */

struct sim_hmap {
	uint64_t *keys;
	uint32_t *vals; /* SIM_HMAP_NONE marks an empty slot */
	size_t cap;	/* a power of two, or 0 before the first put */
	size_t n;
};

/* An empty map needs no call: zero the struct. Releases the map's memory and zeroes it. */
void sim_hmap_fini(struct sim_hmap *h);
/* The value of key, or SIM_HMAP_NONE. Expected O(1). */
uint32_t sim_hmap_get(const struct sim_hmap *h, uint64_t key);
/* Sets key to val (val != SIM_HMAP_NONE), replacing an earlier value: 0, or -ENOMEM with the
   map unchanged. */
int sim_hmap_put(struct sim_hmap *h, uint64_t key, uint32_t val);
/* Removes key if present. */
void sim_hmap_del(struct sim_hmap *h, uint64_t key);

#endif /* SIM_HMAP_H */
