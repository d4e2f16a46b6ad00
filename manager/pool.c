/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stddef.h>
#include <sys/mman.h>

#include "fault.h"
#include "pool.h"
#include "util.h"

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

/* One reservation holds both tables: the free-id stack, then the bitmap (8-byte aligned). */
static size_t stack_bytes(uint32_t n_units)
{
	return ((size_t)n_units * sizeof(uint32_t) + 7) & ~(size_t)7;
}

static size_t table_bytes(uint32_t n_units)
{
	return stack_bytes(n_units) + ((size_t)n_units + 63) / 64 * sizeof(uint64_t);
}

/* How many ids ahead a loop over ids fetches their bitmap words. */
#define POOL_AHEAD 16

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
	void *t;

	*p = (struct kvt_pool){0};
	if (n_units == 0 || n_units == UINT32_MAX)
		return -EINVAL;
	/* Reserved, not committed: anonymous pages read as zero (a clear bitmap) and take memory
	   only once written, which alloc and free do below the high-water mark only. The ALLOC
	   fault site stands for the mapping's failure. */
	if (kvt_fault(KVT_FAULT_ALLOC))
		return -ENOMEM;
	t = mmap(NULL, table_bytes(n_units), PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (t == MAP_FAILED)
		return -ENOMEM;
	p->free_ids = t;
	p->in_use = (uint64_t *)((uint8_t *)t + stack_bytes(n_units));
	p->n_units = n_units;
	p->n_free = n_units;
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
	if (p->free_ids)
		munmap(p->free_ids, table_bytes(p->n_units));
	*p = (struct kvt_pool){0};
}

int kvt_pool_alloc(struct kvt_pool *p, uint32_t n, uint32_t *ids)
{
	uint32_t i = 0;

	if (n > p->n_free)
		return -ENOMEM;
	if (NEVER(p->n_free != p->n_stacked + (p->n_units - p->fresh)))
		return -ENOMEM;
	for (; i < n && p->n_stacked; i++)
		ids[i] = p->free_ids[--p->n_stacked];
	for (; i < n; i++)
		ids[i] = p->fresh++;
	p->n_free -= n;
	for (i = 0; i < n; i++) {
		/* returned ids lie anywhere in the bitmap: their words come in a few ids ahead */
		if (i + POOL_AHEAD < n)
			__builtin_prefetch(&p->in_use[ids[i + POOL_AHEAD] >> 6], 1);
		set_used(p, ids[i], true);
		poison_unit(p, ids[i], false);
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
	/* Every id was in use, so below fresh: the stack (room for n_units) never overflows,
	   and it is written no deeper than the high-water mark. */
	if (NEVER((uint64_t)p->n_stacked + n > p->fresh)) {
		for (i = 0; i < n; i++)
			set_used(p, ids[i], true);
		return -EINVAL;
	}
	for (i = 0; i < n; i++) {
		poison_unit(p, ids[i], true);
		p->free_ids[p->n_stacked++] = ids[i];
	}
	p->n_free += n;
	return 0;
}
