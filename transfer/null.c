/* SPDX-License-Identifier: MIT */
/*
 * A backend that moves nothing. Arenas are address ranges that are never dereferenced, so the
 * manager's bookkeeping (pools, tables, copy lists) runs in full while payload costs nothing:
 * what kvtier-bench uses to separate the manager's CPU cost from the copies.
 */
#include <errno.h>
#include <stdlib.h>

#include "fault.h"
#include "backend.h"

struct null_backend {
	struct kvt_be base;
	uint64_t ticket;
};

static int null_create(const struct kvt_backend_params *p, struct kvt_be **out)
{
	struct null_backend *nb = kvt_calloc(1, sizeof(*nb));

	(void)p;
	if (!nb)
		return -ENOMEM;
	nb->base.ops = &kvt_backend_null_ops;
	nb->base.flags = KVT_BE_NO_PAYLOAD;
	*out = &nb->base;
	return 0;
}

static void null_destroy(struct kvt_be *b)
{
	free(b);
}

static int null_arena_alloc(struct kvt_be *b, enum kvt_tier tier, uint64_t bytes, uint64_t *base)
{
	(void)b;
	if (bytes == 0)
		return -EINVAL;
	/* Disjoint, page-aligned, never mapped: 16 TiB apart per tier (a larger device budget
	   would overlap; the null backend is for benchmarks of realistic sizes). */
	*base = ((uint64_t)1 << 44) * (tier + 1);
	return 0;
}

static void null_arena_free(struct kvt_be *b, enum kvt_tier tier, uint64_t base, uint64_t bytes)
{
	(void)b;
	(void)tier;
	(void)base;
	(void)bytes;
}

static int null_scratch(struct kvt_be *b, uint64_t bytes, uint64_t *addr)
{
	(void)b;
	(void)bytes;
	*addr = (uint64_t)3 << 44; /* beside the arenas, never mapped */
	return 0;
}

static int null_copy(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream)
{
	(void)b;
	(void)stream;
	return n && !x ? -EINVAL : 0;
}

static int null_save(struct kvt_be *b, const struct kvt_save_src *src, uint32_t n_src,
		     const struct kvt_xfer *x, uint32_t n, void *stream, uint64_t *ticket)
{
	(void)src;
	(void)n_src;
	(void)stream;
	if (n && !x)
		return -EINVAL;
	*ticket = ++((struct null_backend *)b)->ticket;
	return 0;
}

static int null_append(struct kvt_be *b, uint64_t k, uint64_t v, uint32_t n,
		       const struct kvt_append *a, const struct kvt_append_geom *g, void *stream,
		       uint64_t *ticket)
{
	(void)k;
	(void)v;
	(void)g;
	(void)stream;
	if (n && !a)
		return -EINVAL;
	*ticket = ++((struct null_backend *)b)->ticket;
	return 0;
}

static int null_save_wait(struct kvt_be *b, uint64_t ticket)
{
	(void)b;
	(void)ticket;
	return 0;
}

static int null_read(struct kvt_be *b, void *dst, uint64_t src, uint64_t bytes, void *stream)
{
	(void)dst;
	(void)stream;
	(void)src;
	(void)bytes;
	return kvt_be_fail(b, -ENOTSUP, "the null backend holds no payload");
}

static int null_sync(struct kvt_be *b, void *stream)
{
	(void)b;
	(void)stream;
	return 0;
}

const struct kvt_backend_ops kvt_backend_null_ops = {
	.version = KVT_BACKEND_OPS_VERSION,
	.name = "null",
	.create = null_create,
	.destroy = null_destroy,
	.arena_alloc = null_arena_alloc,
	.arena_free = null_arena_free,
	.copy_d2d = null_copy,
	.gather_h2d = null_copy,
	.load_h2d = null_copy,
	.scratch = null_scratch,
	.save = null_save,
	.append = null_append,
	.save_wait = null_save_wait,
	.read_d2h = null_read,
	.sync = null_sync,
};
