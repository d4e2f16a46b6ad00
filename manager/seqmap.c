/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "fault.h"
#include "internal.h"

static inline uint32_t home_of(const struct kvt_seqmap *sm, uint64_t id)
{
	/* Fibonacci hashing: spreads consecutive ids (the common case) over the table with one
	   multiply; the top bits are the best mixed. */
	return (uint32_t)((id * 0x9e3779b97f4a7c15ull) >> sm->shift);
}

static int alloc_slots(struct kvt_seqmap *sm, uint32_t cap)
{
	sm->slots = kvt_calloc(cap, sizeof(*sm->slots));
	if (!sm->slots)
		return -ENOMEM;
	sm->cap = cap;
	sm->shift = 64 - (uint32_t)__builtin_ctz(cap);
	return 0;
}

int kvt_seqmap_init(struct kvt_seqmap *sm)
{
	*sm = (struct kvt_seqmap){0};
	return alloc_slots(sm, 64);
}

void kvt_seqmap_fini(struct kvt_seqmap *sm)
{
	free(sm->slots);
	*sm = (struct kvt_seqmap){0};
}

struct kvt_seq *kvt_seqmap_get(const struct kvt_seqmap *sm, uint64_t id)
{
	for (uint32_t i = home_of(sm, id);; i = (i + 1) & (sm->cap - 1)) {
		const struct kvt_seqmap_slot *e = &sm->slots[i];

		if (!e->val || e->key == id)
			return e->val;
	}
}

static void insert(struct kvt_seqmap *sm, struct kvt_seq *s)
{
	uint32_t i = home_of(sm, s->id);

	while (sm->slots[i].val)
		i = (i + 1) & (sm->cap - 1);
	sm->slots[i] = (struct kvt_seqmap_slot){s->id, s};
	sm->n++;
}

int kvt_seqmap_put(struct kvt_seqmap *sm, struct kvt_seq *s)
{
	if (2 * (sm->n + 1) > sm->cap) {
		struct kvt_seqmap old = *sm;

		if (old.cap > UINT32_MAX / 2 || alloc_slots(sm, old.cap * 2)) {
			*sm = old;
			return -ENOMEM;
		}
		sm->n = 0;
		for (uint32_t i = 0; i < old.cap; i++)
			if (old.slots[i].val)
				insert(sm, old.slots[i].val);
		free(old.slots);
	}
	insert(sm, s);
	return 0;
}

void kvt_seqmap_del(struct kvt_seqmap *sm, uint64_t id)
{
	uint32_t mask = sm->cap - 1, i = home_of(sm, id), j;

	while (sm->slots[i].val && sm->slots[i].key != id)
		i = (i + 1) & mask;
	if (!sm->slots[i].val)
		return;
	/* Backward shift: pull later entries of the probe run into the hole unless their home
	   lies cyclically in (hole, their slot]. */
	for (j = (i + 1) & mask; sm->slots[j].val; j = (j + 1) & mask) {
		uint32_t home = home_of(sm, sm->slots[j].key);

		if (((j - home) & mask) >= ((j - i) & mask)) {
			sm->slots[i] = sm->slots[j];
			i = j;
		}
	}
	sm->slots[i].val = NULL;
	sm->n--;
}
