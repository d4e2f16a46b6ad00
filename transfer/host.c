/* SPDX-License-Identifier: MIT */
/*
 * The host backend: the device tier is a RAM arena and every transfer is a memcpy, so it runs
 * anywhere and is the reference other backends are checked against. Its save path has
 * FlashD2H's shape (contiguous copy into a staging buffer, scatter by the save threads), so the
 * manager's completion tracking is exercised here exactly as on a GPU.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "backend.h"
#include "jarena.h"
#include "savepool.h"

struct host_backend {
	struct kvt_be base;
	struct kvt_jarena arena;
	struct kvt_savepool *sp;
	void *scratch; /* the scratch buffer (malloc), of scratch_bytes */
	uint64_t scratch_bytes;
};

static inline void *ptr(uint64_t a)
{
	return (void *)(uintptr_t)a;
}

static void *stage_alloc(void *actx, size_t bytes)
{
	return kvt_jarena_alloc(actx, bytes, 4096);
}

static void stage_free(void *actx, void *p, size_t bytes)
{
	(void)bytes;
	kvt_jarena_free(actx, p);
}

static int stage_copy(void *cctx, int buf, void *stage, const struct kvt_save_src *src,
		      uint32_t n_src, uint64_t off, uint64_t len)
{
	uint8_t *out = stage;
	uint64_t base = 0;

	(void)cctx;
	(void)buf;
	for (uint32_t i = 0; i < n_src && len; i++) {
		uint64_t end = base + src[i].bytes;

		if (off < end) {
			uint64_t n = end - off < len ? end - off : len;

			memcpy(out, (const uint8_t *)ptr(src[i].addr) + (off - base), n);
			out += n;
			off += n;
			len -= n;
		}
		base = end;
	}
	return 0;
}

static int host_create(const struct kvt_backend_params *p, struct kvt_be **out)
{
	struct host_backend *hb = kvt_calloc(1, sizeof(*hb));
	struct kvt_savepool_alloc alloc = {stage_alloc, stage_free, NULL};
	int err;

	if (!hb)
		return -ENOMEM;
	hb->base.ops = &kvt_backend_host_ops;
	hb->base.flags = KVT_BE_DEVICE_CPU_READABLE;
	err = kvt_jarena_create(&hb->arena);
	if (err)
		goto fail;
	alloc.actx = &hb->arena;
	err = kvt_savepool_create(p->save_threads, p->staging_bytes, &alloc, stage_copy, NULL, hb,
				  &hb->sp);
	if (err)
		goto fail;
	*out = &hb->base;
	return 0;
fail:
	kvt_jarena_destroy(&hb->arena);
	free(hb);
	return err;
}

static void host_destroy(struct kvt_be *b)
{
	struct host_backend *hb = (struct host_backend *)b;

	free(hb->scratch);
	kvt_savepool_destroy(hb->sp);
	kvt_jarena_destroy(&hb->arena);
	free(hb);
}

static int host_arena_alloc(struct kvt_be *b, enum kvt_tier tier, uint64_t bytes, uint64_t *base)
{
	struct host_backend *hb = (struct host_backend *)b;
	void *p;

	if (bytes == 0 || bytes > SIZE_MAX)
		return kvt_be_fail(b, -EINVAL, "arena of %llu bytes", (unsigned long long)bytes);
	/* 2 MiB alignment lets the kernel back large arenas with huge pages. */
	p = kvt_jarena_alloc(&hb->arena, (size_t)bytes, (size_t)2 << 20);
	if (!p)
		return kvt_be_fail(b, -ENOMEM, "cannot allocate the %s arena (%llu bytes)",
				   tier == KVT_TIER_DEVICE ? "device" : "host",
				   (unsigned long long)bytes);
	*base = (uint64_t)(uintptr_t)p;
	return 0;
}

static void host_arena_free(struct kvt_be *b, enum kvt_tier tier, uint64_t base, uint64_t bytes)
{
	(void)tier;
	(void)bytes;
	kvt_jarena_free(&((struct host_backend *)b)->arena, ptr(base));
}

static int host_scratch(struct kvt_be *b, uint64_t bytes, uint64_t *addr)
{
	struct host_backend *hb = (struct host_backend *)b;

	if (bytes > hb->scratch_bytes) {
		void *p = bytes > SIZE_MAX ? NULL : kvt_malloc((size_t)bytes);

		if (!p)
			return kvt_be_fail(b, -ENOMEM, "scratch buffer of %llu bytes",
					   (unsigned long long)bytes);
		free(hb->scratch);
		hb->scratch = p;
		hb->scratch_bytes = bytes;
	}
	*addr = (uint64_t)(uintptr_t)hb->scratch;
	return 0;
}

static void copy_list(const struct kvt_xfer *x, uint32_t n)
{
	for (uint32_t e = 0; e < n; e++)
		for (uint32_t r = 0; r < x[e].reps; r++)
			memcpy(ptr(x[e].dst + r * x[e].dst_stride),
			       ptr(x[e].src + r * x[e].src_stride), x[e].bytes);
}

static int host_copy(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream)
{
	(void)b;
	(void)stream;
	copy_list(x, n);
	return 0;
}

static int host_save(struct kvt_be *b, const struct kvt_save_src *src, uint32_t n_src,
		     const struct kvt_xfer *x, uint32_t n, void *stream, uint64_t *ticket)
{
	struct host_backend *hb = (struct host_backend *)b;
	int err;

	(void)stream;
	err = kvt_savepool_submit_xfer(hb->sp, src, n_src, x, n, ticket);
	if (err)
		return kvt_be_fail(b, err, "save of %u entries", n);
	return 0;
}

static int host_append(struct kvt_be *b, uint64_t k, uint64_t v, uint32_t n,
		       const struct kvt_append *a, const struct kvt_append_geom *g, void *stream,
		       uint64_t *ticket)
{
	struct host_backend *hb = (struct host_backend *)b;
	int err;

	(void)stream;
	/* Save first: the save can fail (tables), the ring write cannot; so a failed call leaves
	   the ring untouched. */
	err = kvt_savepool_submit_append(hb->sp, k, v, n, a, g, ticket);
	if (err)
		return kvt_be_fail(b, err, "save of a %u-sequence append", n);
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *ks =
			(const uint8_t *)ptr(k) + (uint64_t)i * g->n_heads * g->row_bytes;
		const uint8_t *vs =
			(const uint8_t *)ptr(v) + (uint64_t)i * g->n_heads * g->row_bytes;

		for (uint32_t h = 0; h < g->n_heads; h++) {
			uint8_t *d = ptr(a[i].dev + h * g->head_stride);

			memcpy(d, ks + (uint64_t)h * g->row_bytes, g->row_bytes);
			memcpy(d + g->v_offset, vs + (uint64_t)h * g->row_bytes, g->row_bytes);
		}
	}
	return 0;
}

static int host_save_wait(struct kvt_be *b, uint64_t ticket)
{
	return kvt_savepool_wait(((struct host_backend *)b)->sp, ticket); /* no wait: never fails */
}

static int host_read(struct kvt_be *b, void *dst, uint64_t src, uint64_t bytes, void *stream)
{
	(void)b;
	(void)stream;
	memcpy(dst, ptr(src), bytes);
	return 0;
}

static int host_sync(struct kvt_be *b, void *stream)
{
	(void)b;
	(void)stream;
	return 0; /* device-side work is synchronous here */
}

const struct kvt_backend_ops kvt_backend_host_ops = {
	.version = KVT_BACKEND_OPS_VERSION,
	.name = "host",
	.create = host_create,
	.destroy = host_destroy,
	.arena_alloc = host_arena_alloc,
	.arena_free = host_arena_free,
	.copy_d2d = host_copy,
	.gather_h2d = host_copy,
	.load_h2d = host_copy,
	.scratch = host_scratch,
	.save = host_save,
	.append = host_append,
	.save_wait = host_save_wait,
	.read_d2h = host_read,
	.sync = host_sync,
};
