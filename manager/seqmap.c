/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "internal.h"

static inline uint32_t slot_of(uint64_t id, uint32_t cap)
{
	/* splitmix64 finalizer: sequence ids are often small consecutive integers */
	id ^= id >> 30;
	id *= 0xbf58476d1ce4e5b9ull;
	id ^= id >> 27;
	id *= 0x94d049bb133111ebull;
	id ^= id >> 31;
	return (uint32_t)id & (cap - 1);
}

static int alloc_tables(struct kvt_seqmap *sm, uint32_t cap)
{
	sm->keys = calloc(cap, sizeof(*sm->keys));
	sm->vals = calloc(cap, sizeof(*sm->vals));
	if (!sm->keys || !sm->vals) {
		free(sm->keys);
		free(sm->vals);
		return -ENOMEM;
	}
	sm->cap = cap;
	return 0;
}

int kvt_seqmap_init(struct kvt_seqmap *sm)
{
	*sm = (struct kvt_seqmap){0};
	return alloc_tables(sm, 64);
}

void kvt_seqmap_fini(struct kvt_seqmap *sm)
{
	free(sm->keys);
	free(sm->vals);
	*sm = (struct kvt_seqmap){0};
}

struct kvt_seq *kvt_seqmap_get(const struct kvt_seqmap *sm, uint64_t id)
{
	for (uint32_t i = slot_of(id, sm->cap);; i = (i + 1) & (sm->cap - 1)) {
		if (!sm->vals[i])
			return NULL;
		if (sm->keys[i] == id)
			return sm->vals[i];
	}
}

static void insert(struct kvt_seqmap *sm, struct kvt_seq *s)
{
	uint32_t i = slot_of(s->id, sm->cap);

	while (sm->vals[i])
		i = (i + 1) & (sm->cap - 1);
	sm->keys[i] = s->id;
	sm->vals[i] = s;
	sm->n++;
}

int kvt_seqmap_put(struct kvt_seqmap *sm, struct kvt_seq *s)
{
	if (2 * (sm->n + 1) > sm->cap) {
		struct kvt_seqmap old = *sm;

		if (old.cap > UINT32_MAX / 2 || alloc_tables(sm, old.cap * 2)) {
			*sm = old;
			return -ENOMEM;
		}
		sm->n = 0;
		for (uint32_t i = 0; i < old.cap; i++)
			if (old.vals[i])
				insert(sm, old.vals[i]);
		free(old.keys);
		free(old.vals);
	}
	insert(sm, s);
	return 0;
}

void kvt_seqmap_del(struct kvt_seqmap *sm, uint64_t id)
{
	uint32_t mask = sm->cap - 1, i = slot_of(id, sm->cap), j;

	while (sm->vals[i] && sm->keys[i] != id)
		i = (i + 1) & mask;
	if (!sm->vals[i])
		return;
	/* Backward shift: pull later entries of the probe run into the hole when their home
	   slot does not lie cyclically in (hole, their slot]. */
	for (j = (i + 1) & mask; sm->vals[j]; j = (j + 1) & mask) {
		uint32_t home = slot_of(sm->keys[j], sm->cap);

		if (((j - home) & mask) >= ((j - i) & mask)) {
			sm->keys[i] = sm->keys[j];
			sm->vals[i] = sm->vals[j];
			i = j;
		}
	}
	sm->vals[i] = NULL;
	sm->n--;
}
