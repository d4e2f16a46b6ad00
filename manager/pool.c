/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "fault.h"
#include "pool.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVT_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVT_HAVE_ASAN 1
#endif
#endif

#ifdef KVT_HAVE_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(a, n) ASAN_POISON_MEMORY_REGION((a), (n))
#define UNPOISON(a, n) ASAN_UNPOISON_MEMORY_REGION((a), (n))
#else
#define POISON(a, n) ((void)(a), (void)(n))
#define UNPOISON(a, n) ((void)(a), (void)(n))
#endif

static void set_used(struct kvt_pool *p, uint32_t id, bool used)
{
	uint64_t bit = (uint64_t)1 << (id & 63);

	if (used)
		p->in_use[id >> 6] |= bit;
	else
		p->in_use[id >> 6] &= ~bit;
}

static void poison_unit(const struct kvt_pool *p, uint32_t id, bool poison)
{
	if (!p->poison_base)
		return;
	if (poison)
		POISON(p->poison_base + (uint64_t)id * p->unit_bytes, p->unit_bytes);
	else
		UNPOISON(p->poison_base + (uint64_t)id * p->unit_bytes, p->unit_bytes);
}

int kvt_pool_init(struct kvt_pool *p, uint32_t n_units, void *poison_base, uint64_t unit_bytes)
{
	*p = (struct kvt_pool){0};
	if (n_units == 0 || n_units == UINT32_MAX)
		return -EINVAL;
	p->free_ids = kvt_malloc((size_t)n_units * sizeof(*p->free_ids));
	p->in_use = kvt_calloc(((size_t)n_units + 63) / 64, sizeof(*p->in_use));
	if (!p->free_ids || !p->in_use) {
		kvt_pool_fini(p);
		return -ENOMEM;
	}
	p->n_units = n_units;
	p->n_free = n_units;
	/* The top of the stack is handed out first: put id 0 there. */
	for (uint32_t i = 0; i < n_units; i++)
		p->free_ids[i] = n_units - 1 - i;
	p->poison_base = poison_base;
	p->unit_bytes = unit_bytes;
	if (poison_base)
		POISON(poison_base, (uint64_t)n_units * unit_bytes);
	return 0;
}

void kvt_pool_fini(struct kvt_pool *p)
{
	if (p->poison_base && p->n_units)
		UNPOISON(p->poison_base, (uint64_t)p->n_units * p->unit_bytes);
	free(p->free_ids);
	free(p->in_use);
	*p = (struct kvt_pool){0};
}

int kvt_pool_alloc(struct kvt_pool *p, uint32_t n, uint32_t *ids)
{
	if (n > p->n_free)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t id = p->free_ids[--p->n_free];

		set_used(p, id, true);
		poison_unit(p, id, false);
		ids[i] = id;
	}
	return 0;
}

int kvt_pool_free(struct kvt_pool *p, const uint32_t *ids, uint32_t n)
{
	uint32_t i;
	int err = 0;

	/* Validate before changing anything; clearing the bits as we go detects repeats. */
	for (i = 0; i < n; i++) {
		if (!kvt_pool_is_used(p, ids[i])) {
			err = -EINVAL;
			break;
		}
		set_used(p, ids[i], false);
	}
	if (err) {
		while (i-- > 0)
			set_used(p, ids[i], true);
		return err;
	}
	for (i = 0; i < n; i++) {
		poison_unit(p, ids[i], true);
		p->free_ids[p->n_free++] = ids[i];
	}
	return 0;
}
