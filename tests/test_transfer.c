/* SPDX-License-Identifier: MIT */
/*
 * transfer: the host backend (the reference every other backend is checked against), the save
 * thread pool it shares with the CUDA backend, the null backend and backend lookup.
 *
 * Every copy list is checked against a naive loop written from backend.h's definition of
 * struct kvt_xfer (piece r of an entry goes from src + r * src_stride to dst + r * dst_stride;
 * for saves src is an offset into the concatenated sources), on destinations pre-filled with a
 * pattern so that bytes written where they should not be are caught as well as bytes missed.
 * Saves run with 0, 1 and 4 save threads and with staging buffers far smaller than the job, so
 * chunking, entries straddling chunk boundaries and strided pieces spanning several chunks are
 * all exercised.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "plugin.h"
#include "savepool.h"
#include "t_backend.h"
#include "t_manager.h"

static const uint32_t thread_counts[] = {0, 1, 4};
#define N_THREAD_COUNTS (sizeof(thread_counts) / sizeof(thread_counts[0]))

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd64(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static uint32_t rnd(uint32_t bound)
{
	return (uint32_t)(rnd64() % bound);
}

static void fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rnd64() >> 24);
}

static inline uint64_t a64(const void *p)
{
	return (uint64_t)(uintptr_t)p;
}

/* Reference of a copy list whose src are addresses. */
static void naive_copy(const struct kvt_xfer *x, uint32_t n)
{
	for (uint32_t e = 0; e < n; e++)
		for (uint32_t r = 0; r < x[e].reps; r++)
			for (uint32_t i = 0; i < x[e].bytes; i++)
				((uint8_t *)(uintptr_t)(x[e].dst + r * x[e].dst_stride))[i] =
					((const uint8_t *)(uintptr_t)(x[e].src +
								      r * x[e].src_stride))[i];
}

/* Reference of a save list: src are offsets into concat. dst are addresses in dst_real; the
   copy goes to the same offset of dst_ref instead. */
static void naive_save(const uint8_t *concat, const struct kvt_xfer *x, uint32_t n,
		       const uint8_t *dst_real, uint8_t *dst_ref)
{
	for (uint32_t e = 0; e < n; e++)
		for (uint32_t r = 0; r < x[e].reps; r++) {
			uint64_t d = x[e].dst + r * x[e].dst_stride - a64(dst_real);

			for (uint32_t i = 0; i < x[e].bytes; i++)
				dst_ref[d + i] = concat[x[e].src + r * x[e].src_stride + i];
		}
}

/* Asserts two buffers are equal, reporting the first differing offset. */
static void check_bytes(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
			const char *file, int line)
{
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i]) {
			print_error("%s: first difference at byte %zu of %zu: got 0x%02x, want "
				    "0x%02x\n",
				    what, i, n, got[i], want[i]);
			_fail(file, line);
		}
}
#define CHECK_BYTES(got, want, n, what) check_bytes((got), (want), (n), (what), __FILE__, __LINE__)

static struct kvt_be *host_create(uint32_t threads, uint64_t staging)
{
	struct kvt_backend_params bp = {threads, staging};
	struct kvt_be *b = NULL;

	assert_int_equal(kvt_backend_host_ops.create(&bp, &b), 0);
	assert_non_null(b);
	return b;
}

/* Builds n entries with random sizes, reps (1..max_reps, some 0), strides and source offsets;
   destinations never overlap. src are offsets in [0, src_bytes); dst are offsets too. */
static uint32_t build_list(struct kvt_xfer *x, uint32_t n, uint64_t src_bytes, uint32_t max_bytes,
			   uint32_t max_reps, uint64_t *dst_bytes)
{
	uint64_t d = 0;

	for (uint32_t e = 0; e < n; e++) {
		uint32_t bytes = 1 + rnd(max_bytes);
		uint32_t reps = rnd(8) == 0 ? 0 : 1 + rnd(max_reps);
		uint64_t src_stride = bytes + rnd(3 * bytes + 1); /* >= bytes: disjoint pieces */
		uint64_t dst_stride = bytes + rnd(64);
		uint64_t span = reps ? (uint64_t)(reps - 1) * src_stride + bytes : bytes;

		if (rnd(6) == 0) /* stride 0 on the source: the same piece repeated */
			src_stride = 0, span = bytes;
		if (span > src_bytes) {
			reps = 1;
			span = bytes;
		}
		x[e] = (struct kvt_xfer){
			.src = rnd64() % (src_bytes - span + 1),
			.dst = d + rnd(16),
			.bytes = bytes,
			.reps = reps,
			.src_stride = src_stride,
			.dst_stride = dst_stride,
		};
		d = x[e].dst + (reps ? (uint64_t)(reps - 1) * dst_stride : 0) + bytes;
	}
	*dst_bytes = d + 16;
	return n;
}

static void offsets_to_addrs(struct kvt_xfer *x, uint32_t n, const void *src, const void *dst)
{
	for (uint32_t e = 0; e < n; e++) {
		if (src)
			x[e].src += a64(src);
		x[e].dst += a64(dst);
	}
}

/* ---- host backend ----------------------------------------------------------------------- */

static void test_host_create(void **state)
{
	(void)state;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct kvt_be *b = host_create(thread_counts[t], 4096);

		assert_ptr_equal(b->ops, &kvt_backend_host_ops);
		assert_true(b->flags & KVT_BE_DEVICE_CPU_READABLE);
		assert_false(b->flags & KVT_BE_NO_PAYLOAD);
		kvt_backend_host_ops.destroy(b);
	}
	assert_int_equal(kvt_backend_host_ops.version, KVT_BACKEND_OPS_VERSION);
	assert_string_equal(kvt_backend_host_ops.name, "host");

	/* The save pool's limits come through create; *out is untouched on failure. */
	struct kvt_be *sentinel = (struct kvt_be *)(uintptr_t)0x1234;
	struct kvt_be *b = sentinel;
	struct kvt_backend_params bad[] = {
		{65, 4096},
		{2, 4095},
		{0, 100},
		{UINT32_MAX, 1 << 20},
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(kvt_backend_host_ops.create(&bad[i], &b), -EINVAL);
		assert_ptr_equal(b, sentinel);
	}
	/* The limits themselves are accepted. */
	struct kvt_backend_params edge = {64, 4096};

	assert_int_equal(kvt_backend_host_ops.create(&edge, &b), 0);
	kvt_backend_host_ops.destroy(b);
}

static void test_host_arena(void **state)
{
	struct kvt_be *b = host_create(1, 1 << 16);
	const struct kvt_backend_ops *o = &kvt_backend_host_ops;
	uint64_t dev = 0, host = 0, base = 77;
	const uint64_t dev_bytes = 3 << 20, host_bytes = (1 << 20) + 4096;

	(void)state;
	assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, dev_bytes, &dev), 0);
	assert_int_equal(o->arena_alloc(b, KVT_TIER_HOST, host_bytes, &host), 0);
	assert_true(dev != 0 && host != 0);
	assert_int_equal(dev % 4096, 0);
	assert_int_equal(host % 4096, 0);
	assert_true(dev + dev_bytes <= host || host + host_bytes <= dev);
	/* Every byte usable (ASan would report otherwise) and the two arenas independent. */
	memset((void *)(uintptr_t)dev, 0x11, dev_bytes);
	memset((void *)(uintptr_t)host, 0x22, host_bytes);
	assert_int_equal(((uint8_t *)(uintptr_t)dev)[dev_bytes - 1], 0x11);
	assert_int_equal(((uint8_t *)(uintptr_t)host)[0], 0x22);

	/* Zero bytes: -EINVAL on both tiers, *base untouched, detail recorded. */
	b->err[0] = '\0';
	assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, 0, &base), -EINVAL);
	assert_int_equal(base, 77);
	assert_true(strlen(b->err) > 0);
	b->err[0] = '\0';
	assert_int_equal(o->arena_alloc(b, KVT_TIER_HOST, 0, &base), -EINVAL);
	assert_int_equal(base, 77);
	assert_true(strlen(b->err) > 0);

	o->arena_free(b, KVT_TIER_HOST, host, host_bytes);
	o->arena_free(b, KVT_TIER_DEVICE, dev, dev_bytes);
	/* Freed arenas can be allocated again. */
	assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, dev_bytes, &dev), 0);
	o->arena_free(b, KVT_TIER_DEVICE, dev, dev_bytes);
	o->destroy(b);
}

/* copy_d2d and gather_h2d are both "a list of kvt_xfer between addresses". */
static void check_copy_op(int (*op)(struct kvt_be *, const struct kvt_xfer *, uint32_t, void *))
{
	const uint64_t src_bytes = 256 << 10;
	struct kvt_be *b = host_create(2, 1 << 16);
	uint8_t *src = malloc(src_bytes);
	struct kvt_xfer x[300];
	uint64_t dst_bytes;
	uint32_t n;

	assert_non_null(src);
	fill_random(src, src_bytes);
	n = build_list(x, 300, src_bytes, 700, 12, &dst_bytes);
	/* Hand-written cases on top: a single long piece, a zero-byte entry, a zero-rep entry,
	   and reps with exactly adjacent pieces (stride == bytes). */
	x[0] = (struct kvt_xfer){.src = 0, .dst = x[0].dst, .bytes = x[0].bytes, .reps = 1};
	x[1].reps = 0;
	x[2].src = 0;
	x[2].src_stride = x[2].bytes;
	x[2].dst_stride = x[2].bytes;
	x[3].bytes = 0;

	uint8_t *dst = malloc(dst_bytes), *ref = malloc(dst_bytes);

	assert_non_null(dst);
	assert_non_null(ref);
	memset(dst, 0x5a, dst_bytes);
	memset(ref, 0x5a, dst_bytes);
	struct kvt_xfer xr[300];

	memcpy(xr, x, sizeof(x));
	offsets_to_addrs(x, n, src, dst);
	offsets_to_addrs(xr, n, src, ref);
	naive_copy(xr, n);
	assert_int_equal(op(b, x, n, NULL), 0);
	assert_int_equal(kvt_backend_host_ops.sync(b, NULL), 0);
	CHECK_BYTES(dst, ref, dst_bytes, "copy list");
	/* An empty list succeeds and writes nothing. */
	assert_int_equal(op(b, NULL, 0, NULL), 0);
	CHECK_BYTES(dst, ref, dst_bytes, "empty list");
	kvt_backend_host_ops.destroy(b);
	free(src);
	free(dst);
	free(ref);
}

static void test_host_copy_d2d(void **state)
{
	(void)state;
	rng_state = 0x9e3779b97f4a7c15ull;
	check_copy_op(kvt_backend_host_ops.copy_d2d);
}

static void test_host_gather_h2d(void **state)
{
	(void)state;
	rng_state = 0x0123456789abcdefull;
	check_copy_op(kvt_backend_host_ops.gather_h2d);
}

/* One save of a multi-source job: random list over the concatenated sources, checked against
   the naive reference. The sources are scribbled over as soon as save returns (the contract
   lets the caller reuse them), so a backend that reads them late is caught. */
static void check_save(uint32_t threads, uint64_t staging, uint32_t n_src, uint64_t max_src,
		       uint32_t n_items, uint32_t max_bytes, uint32_t max_reps)
{
	struct kvt_be *b = host_create(threads, staging);
	struct kvt_save_src *src = calloc(n_src, sizeof(*src));
	uint8_t **bufs = calloc(n_src, sizeof(*bufs));
	struct kvt_xfer *x = calloc(n_items, sizeof(*x));
	uint64_t total = 0, dst_bytes, ticket = 0;

	assert_non_null(src);
	assert_non_null(bufs);
	assert_non_null(x);
	for (uint32_t i = 0; i < n_src; i++) {
		uint64_t sz = 1 + rnd64() % max_src;

		if (i == 1 && n_src > 2)
			sz = 0; /* an empty source in the middle */
		bufs[i] = malloc(sz ? sz : 1);
		assert_non_null(bufs[i]);
		fill_random(bufs[i], sz);
		src[i] = (struct kvt_save_src){a64(bufs[i]), sz};
		total += sz;
	}
	uint8_t *concat = malloc(total);

	assert_non_null(concat);
	for (uint32_t i = 0, at = 0; i < n_src; at += (uint32_t)src[i].bytes, i++)
		memcpy(concat + at, bufs[i], src[i].bytes);
	build_list(x, n_items, total, max_bytes, max_reps, &dst_bytes);

	uint8_t *dst = malloc(dst_bytes), *ref = malloc(dst_bytes);

	assert_non_null(dst);
	assert_non_null(ref);
	memset(dst, 0xc3, dst_bytes);
	memset(ref, 0xc3, dst_bytes);
	offsets_to_addrs(x, n_items, NULL, dst);
	naive_save(concat, x, n_items, dst, ref);

	assert_int_equal(kvt_backend_host_ops.save(b, src, n_src, x, n_items, NULL, &ticket), 0);
	assert_int_equal(ticket, 1); /* first save of a fresh backend */
	for (uint32_t i = 0; i < n_src; i++)
		memset(bufs[i], 0xee, src[i].bytes);
	memset(x, 0, n_items * sizeof(*x)); /* the list may be reused too */
	assert_int_equal(kvt_backend_host_ops.save_wait(b, ticket), 0);
	char what[96];

	snprintf(what, sizeof(what), "save: %u threads, staging %llu, %llu bytes", threads,
		 (unsigned long long)staging, (unsigned long long)total);
	CHECK_BYTES(dst, ref, dst_bytes, what);
	kvt_backend_host_ops.destroy(b);
	for (uint32_t i = 0; i < n_src; i++)
		free(bufs[i]);
	free(bufs);
	free(src);
	free(x);
	free(concat);
	free(dst);
	free(ref);
}

static void test_host_save_multi_source(void **state)
{
	(void)state;
	rng_state = 0xfeedfacecafebeefull;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		/* Fits one staging buffer. */
		check_save(thread_counts[t], 1 << 20, 5, 3000, 200, 400, 4);
		/* Hand-made: entries straddling source boundaries. */
		uint8_t s0[100], s1[50], s2[300], concat[450], dst[600], ref[600];
		struct kvt_save_src src[3] = {{a64(s0), 100}, {a64(s1), 50}, {a64(s2), 300}};
		struct kvt_xfer x[3] = {
			{.src = 90, .dst = a64(dst), .bytes = 70, .reps = 1},	     /* s0|s1|s2 */
			{.src = 140, .dst = a64(dst + 100), .bytes = 20, .reps = 1}, /* s1|s2 */
			{.src = 0,
			 .dst = a64(dst + 200),
			 .bytes = 10,
			 .reps = 9,
			 .src_stride = 50, /* pieces in every source */
			 .dst_stride = 12},
		};
		struct kvt_be *b = host_create(thread_counts[t], 4096);
		uint64_t ticket;

		fill_random(s0, sizeof(s0));
		fill_random(s1, sizeof(s1));
		fill_random(s2, sizeof(s2));
		memcpy(concat, s0, 100);
		memcpy(concat + 100, s1, 50);
		memcpy(concat + 150, s2, 300);
		memset(dst, 0, sizeof(dst));
		memset(ref, 0, sizeof(ref));
		naive_save(concat, x, 3, dst, ref);
		assert_int_equal(kvt_backend_host_ops.save(b, src, 3, x, 3, NULL, &ticket), 0);
		assert_int_equal(kvt_backend_host_ops.save_wait(b, ticket), 0);
		CHECK_BYTES(dst, ref, sizeof(dst), "straddling sources");
		kvt_backend_host_ops.destroy(b);
	}
}

static void test_host_save_chunked(void **state)
{
	(void)state;
	rng_state = 0x5555aaaa3333ccccull;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		/* ~100-300 KiB through 4 KiB staging: dozens of chunks, entries of up to 5000
		   bytes (longer than a chunk) and strided pieces spanning many chunks. */
		check_save(thread_counts[t], 4096, 4, 80000, 150, 5000, 1);
		check_save(thread_counts[t], 4096, 3, 60000, 100, 1500, 40);
		/* Staging not a power of two: chunk boundaries fall at odd offsets. */
		check_save(thread_counts[t], 4096 + 1000, 6, 30000, 120, 3000, 10);
		/* Large chunks with many small items: the threads split a chunk into slices. */
		check_save(thread_counts[t], 512 << 10, 3, 800000, 4000, 512, 2);
	}
}

/* One hand-made case that pins the chunk arithmetic: every entry crosses a 4 KiB boundary and
   one strided entry has a piece in each of 8 chunks. */
static void test_host_save_chunk_edges(void **state)
{
	(void)state;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		const uint32_t total = 8 * 4096;
		uint8_t *s = malloc(total), *dst = calloc(1, 65536), *ref = calloc(1, 65536);
		struct kvt_save_src src = {a64(s), total};
		struct kvt_xfer x[10];
		uint32_t n = 0;
		uint64_t ticket;
		struct kvt_be *b = host_create(thread_counts[t], 4096);

		assert_non_null(s);
		assert_non_null(dst);
		assert_non_null(ref);
		fill_random(s, total);
		for (uint32_t c = 1; c < 8; c++) /* [c*4096 - 3, c*4096 + 5) */
			x[n++] = (struct kvt_xfer){.src = c * 4096 - 3,
						   .dst = a64(dst + c * 16),
						   .bytes = 8,
						   .reps = 1};
		x[n++] = (struct kvt_xfer){.src = 100,
					   .dst = a64(dst + 1024),
					   .bytes = 200,
					   .reps = 8,
					   .src_stride = 4096,
					   .dst_stride = 256};
		x[n++] = (struct kvt_xfer){.src = 4000,
					   .dst = a64(dst + 8192),
					   .bytes = 3 * 4096 + 200, /* spans 5 chunks */
					   .reps = 1};
		x[n++] = (struct kvt_xfer){.src = total - 1,
					   .dst = a64(dst + 65535),
					   .bytes = 1,
					   .reps = 1}; /* the very last byte */
		naive_save(s, x, n, dst, ref);
		assert_int_equal(kvt_backend_host_ops.save(b, &src, 1, x, n, NULL, &ticket), 0);
		memset(s, 0, total);
		assert_int_equal(kvt_backend_host_ops.save_wait(b, ticket), 0);
		CHECK_BYTES(dst, ref, 65536, "chunk edges");
		kvt_backend_host_ops.destroy(b);
		free(s);
		free(dst);
		free(ref);
	}
}

/* append: k, v are [n][n_heads][row]; sequence i's head h K row goes to a[i].dev + h *
   head_stride (device) and a[i].host + h * head_stride (host), V rows at + v_offset. */
static void check_append(uint32_t threads, uint64_t staging, uint32_t n, uint32_t n_heads,
			 uint32_t row_bytes)
{
	const uint32_t bt = 8; /* rows per block half */
	const uint64_t v_offset = (uint64_t)bt * row_bytes, block = 2 * v_offset;
	const uint64_t head_stride = block, group = block * n_heads;
	const uint64_t arena = group * n; /* one group per sequence, each tier */
	struct kvt_be *b = host_create(threads, staging);
	uint64_t half = (uint64_t)n * n_heads * row_bytes, ticket;
	uint8_t *k = malloc(half), *v = malloc(half), *k0 = malloc(half), *v0 = malloc(half);
	uint8_t *dev = malloc(arena), *host = malloc(arena);
	uint8_t *dev_ref = malloc(arena), *host_ref = malloc(arena);
	struct kvt_append *a = calloc(n, sizeof(*a));
	struct kvt_append_geom g = {n_heads, row_bytes, head_stride, v_offset};

	assert_true(k && v && k0 && v0 && dev && host && dev_ref && host_ref && a);
	fill_random(k, half);
	fill_random(v, half);
	memcpy(k0, k, half);
	memcpy(v0, v, half);
	fill_random(dev, arena);
	fill_random(host, arena);
	memcpy(dev_ref, dev, arena);
	memcpy(host_ref, host, arena);
	/* Sequence i writes row slot (i * 5) % bt of group i in both tiers (different rows in
	   the two tiers, as for a ring slot versus a history position). */
	for (uint32_t i = 0; i < n; i++) {
		uint32_t ds = (i * 5) % bt, hs = (i * 3 + 1) % bt;
		uint32_t gi = n - 1 - i; /* groups in reverse order */

		a[i].dev = a64(dev) + gi * group + (uint64_t)ds * row_bytes;
		a[i].host = a64(host) + i * group + (uint64_t)hs * row_bytes;
		for (uint32_t h = 0; h < n_heads; h++) {
			const uint8_t *ks = k0 + ((uint64_t)i * n_heads + h) * row_bytes;
			const uint8_t *vs = v0 + ((uint64_t)i * n_heads + h) * row_bytes;
			uint64_t d = gi * group + h * head_stride + (uint64_t)ds * row_bytes;
			uint64_t hh = i * group + h * head_stride + (uint64_t)hs * row_bytes;

			memcpy(dev_ref + d, ks, row_bytes);
			memcpy(dev_ref + d + v_offset, vs, row_bytes);
			memcpy(host_ref + hh, ks, row_bytes);
			memcpy(host_ref + hh + v_offset, vs, row_bytes);
		}
	}
	assert_int_equal(kvt_backend_host_ops.append(b, a64(k), a64(v), n, a, &g, NULL, &ticket),
			 0);
	assert_int_equal(ticket, 1);
	/* Sources and the description may be reused once the call returns. */
	memset(k, 0, half);
	memset(v, 0, half);
	memset(a, 0, n * sizeof(*a));
	assert_int_equal(kvt_backend_host_ops.sync(b, NULL), 0);
	CHECK_BYTES(dev, dev_ref, arena, "append: device rows");
	assert_int_equal(kvt_backend_host_ops.save_wait(b, ticket), 0);
	CHECK_BYTES(host, host_ref, arena, "append: host rows");
	kvt_backend_host_ops.destroy(b);
	free(k);
	free(v);
	free(k0);
	free(v0);
	free(dev);
	free(host);
	free(dev_ref);
	free(host_ref);
	free(a);
}

static void test_host_append(void **state)
{
	(void)state;
	rng_state = 0xabcdef0123456789ull;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		uint32_t th = thread_counts[t];

		check_append(th, 1 << 20, 1, 1, 32);	 /* one sequence, one head */
		check_append(th, 1 << 20, 7, 3, 32);	 /* whole job in one chunk */
		check_append(th, 4096, 64, 4, 48);	 /* 24 KiB in 4 KiB chunks; rows straddle */
		check_append(th, 4096, 3, 2, 4096 + 8);	 /* rows longer than a chunk */
		check_append(th, 256 << 10, 600, 8, 64); /* 600 KiB: several slices per chunk */
	}
}

static void test_host_read_d2h(void **state)
{
	struct kvt_be *b = host_create(0, 4096);
	uint8_t src[1000], dst[1000];

	(void)state;
	fill_random(src, sizeof(src));
	memset(dst, 0, sizeof(dst));
	assert_int_equal(kvt_backend_host_ops.read_d2h(b, dst + 10, a64(src + 7), 900, NULL), 0);
	CHECK_BYTES(dst + 10, src + 7, 900, "read_d2h");
	for (int i = 0; i < 10; i++)
		assert_int_equal(dst[i], 0);
	for (int i = 910; i < 1000; i++)
		assert_int_equal(dst[i], 0);
	assert_int_equal(kvt_backend_host_ops.read_d2h(b, dst, a64(src), 0, NULL), 0);
	kvt_backend_host_ops.destroy(b);
}

/* Many saves in flight: tickets go up by one per submit (saves and appends share them), a wait
   for an early ticket returns with that save landed, a wait for UINT64_MAX with all of them. */
static void test_host_many_saves(void **state)
{
	enum { N_JOBS = 48, JOB = 10000 };

	(void)state;
	rng_state = 0x1111222233334444ull;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct kvt_be *b = host_create(thread_counts[t], 4096);
		uint8_t *src = malloc((size_t)N_JOBS * JOB), *dst = calloc(N_JOBS, JOB);
		uint64_t tickets[N_JOBS + 2];

		assert_non_null(src);
		assert_non_null(dst);
		fill_random(src, (size_t)N_JOBS * JOB);
		for (uint32_t j = 0; j < N_JOBS; j++) {
			/* Job j: its source reversed in 100-byte pieces into its destination. */
			struct kvt_save_src s = {a64(src + (size_t)j * JOB), JOB};
			struct kvt_xfer x[JOB / 100];

			for (uint32_t p = 0; p < JOB / 100; p++)
				x[p] = (struct kvt_xfer){
					.src = (uint64_t)p * 100,
					.dst = a64(dst + (size_t)j * JOB + JOB - (p + 1) * 100),
					.bytes = 100,
					.reps = 1};
			assert_int_equal(kvt_backend_host_ops.save(b, &s, 1, x, JOB / 100, NULL,
								   &tickets[j]),
					 0);
			assert_int_equal(tickets[j], j + 1);
			if (j == 0) { /* an early ticket: that job, complete */
				assert_int_equal(kvt_backend_host_ops.save_wait(b, tickets[0]), 0);
				for (uint32_t p = 0; p < JOB / 100; p++)
					assert_memory_equal(dst + JOB - (p + 1) * 100,
							    src + p * 100, 100);
			}
		}
		/* A zero-byte job and an empty append still take the next tickets and complete. */
		struct kvt_save_src none = {a64(src), 0};
		struct kvt_append_geom g = {1, 16, 32, 16};

		assert_int_equal(
			kvt_backend_host_ops.save(b, &none, 1, NULL, 0, NULL, &tickets[N_JOBS]), 0);
		assert_int_equal(tickets[N_JOBS], N_JOBS + 1);
		assert_int_equal(kvt_backend_host_ops.append(b, a64(src), a64(src), 0, NULL, &g,
							     NULL, &tickets[N_JOBS + 1]),
				 0);
		assert_int_equal(tickets[N_JOBS + 1], N_JOBS + 2);
		assert_int_equal(kvt_backend_host_ops.save_wait(b, tickets[N_JOBS]), 0);
		assert_int_equal(kvt_backend_host_ops.save_wait(b, UINT64_MAX), 0);
		for (uint32_t j = 0; j < N_JOBS; j++)
			for (uint32_t p = 0; p < JOB / 100; p++)
				assert_memory_equal(dst + (size_t)j * JOB + JOB - (p + 1) * 100,
						    src + (size_t)j * JOB + p * 100, 100);
		kvt_backend_host_ops.destroy(b);
		free(src);
		free(dst);
	}
}

/* A save that writes the sources' own memory: correct only if the sources were copied into
   the stage before any destination was written (which the contract implies: sources may be
   reused once save returns). */
static void test_host_save_overlapping_dst(void **state)
{
	(void)state;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct kvt_be *b = host_create(thread_counts[t], 1 << 16);
		uint8_t buf[4096], orig[4096];
		struct kvt_save_src s = {a64(buf), 2048};
		/* Shift the first half up by 1000 bytes: overlaps itself. */
		struct kvt_xfer x = {.src = 0, .dst = a64(buf + 1000), .bytes = 2048, .reps = 1};
		uint64_t ticket;

		for (int i = 0; i < 4096; i++)
			buf[i] = (uint8_t)(i * 7 + 3);
		memcpy(orig, buf, sizeof(buf));
		assert_int_equal(kvt_backend_host_ops.save(b, &s, 1, &x, 1, NULL, &ticket), 0);
		assert_int_equal(kvt_backend_host_ops.save_wait(b, ticket), 0);
		CHECK_BYTES(buf, orig, 1000, "untouched head");
		CHECK_BYTES(buf + 1000, orig, 2048, "shifted copy");
		CHECK_BYTES(buf + 3048, orig + 3048, 4096 - 3048, "untouched tail");
		kvt_backend_host_ops.destroy(b);
	}
}

/* ---- savepool directly ------------------------------------------------------------------ */

static void *plain_alloc(void *actx, size_t bytes)
{
	(void)actx;
	return malloc(bytes);
}

static void plain_free(void *actx, void *p, size_t bytes)
{
	(void)actx;
	(void)bytes;
	free(p);
}

static const struct kvt_savepool_alloc plain = {plain_alloc, plain_free, NULL};

/* Stage copy over the concatenated sources, failing when cctx says so. */
struct copy_ctx {
	int fail_err;	    /* returned by every call once calls >= fail_from */
	uint32_t fail_from; /* index of the first failing call */
	uint32_t calls;
};

static int test_copy(void *cctx, int buf, void *stage, const struct kvt_save_src *src,
		     uint32_t n_src, uint64_t off, uint64_t len)
{
	struct copy_ctx *c = cctx;
	uint64_t base = 0;
	uint8_t *out = stage;

	(void)buf;
	if (c && c->fail_err && c->calls++ >= c->fail_from)
		return c->fail_err;
	for (uint32_t i = 0; i < n_src && len; i++) {
		uint64_t end = base + src[i].bytes;

		if (off < end) {
			uint64_t n = end - off < len ? end - off : len;

			memcpy(out, (const uint8_t *)(uintptr_t)src[i].addr + (off - base), n);
			out += n;
			off += n;
			len -= n;
		}
		base = end;
	}
	return 0;
}

static void test_savepool_create_validation(void **state)
{
	struct kvt_savepool *sp = (struct kvt_savepool *)(uintptr_t)0x99;

	(void)state;
	assert_int_equal(kvt_savepool_create(65, 4096, &plain, test_copy, NULL, NULL, &sp),
			 -EINVAL);
	assert_int_equal(kvt_savepool_create(UINT32_MAX, 4096, &plain, test_copy, NULL, NULL, &sp),
			 -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4095, &plain, test_copy, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 0, &plain, test_copy, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4096, NULL, test_copy, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4096, &plain, NULL, NULL, NULL, &sp), -EINVAL);
	assert_int_equal(kvt_savepool_create(1, 4096, &plain, test_copy, NULL, NULL, NULL),
			 -EINVAL);
	assert_ptr_equal(sp, (struct kvt_savepool *)(uintptr_t)0x99);
	/* The limits are accepted; last_ticket starts at 0; the threads block every signal. */
	assert_int_equal(kvt_savepool_create(64, 4096, &plain, test_copy, NULL, NULL, &sp), 0);
	assert_int_equal(kvt_savepool_last_ticket(sp), 0);
	{
		uint32_t n;

		assert_true(t_kvt_threads_block_signals(&n));
		assert_int_equal(n, 64);
	}
	kvt_savepool_destroy(sp);
	assert_int_equal(kvt_savepool_create(0, 4096, &plain, test_copy, NULL, NULL, &sp), 0);
	kvt_savepool_destroy(sp);
	kvt_savepool_destroy(NULL);
}

static uint32_t scatter_calls;

static void counting_scatter(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
			     uint64_t c0, uint64_t c1, const void *ctx)
{
	__atomic_add_fetch(&scatter_calls, 1, __ATOMIC_RELAXED);
	kvt_scatter_xfer(items, i0, i1, stage, c0, c1, ctx);
}

static void test_savepool_copy_fails(void **state)
{
	(void)state;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct copy_ctx cc = {.fail_err = -EIO, .fail_from = 0};
		struct kvt_savepool *sp;
		uint8_t s[10000], d[10000];
		struct kvt_save_src src = {a64(s), sizeof(s)};
		struct kvt_xfer x = {.src = 0, .dst = a64(d), .bytes = sizeof(s), .reps = 1};
		struct kvt_save_job job = {&src, 1, &x, 1, sizeof(x), counting_scatter, NULL, 0};
		uint64_t ticket = 4242;

		fill_random(s, sizeof(s));
		memset(d, 0, sizeof(d));
		assert_int_equal(kvt_savepool_create(thread_counts[t], 4096, &plain, test_copy,
						     NULL, &cc, &sp),
				 0);
		scatter_calls = 0;
		/* First chunk's copy fails: the error comes back, nothing is scattered. */
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EIO);
		kvt_savepool_wait(sp, UINT64_MAX);
		assert_int_equal(__atomic_load_n(&scatter_calls, __ATOMIC_RELAXED), 0);
		for (size_t i = 0; i < sizeof(d); i++)
			assert_int_equal(d[i], 0);
		/* A different error code is passed through as is. */
		cc.fail_err = -ENOMEM;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -ENOMEM);
		/* The second chunk's copy fails: the error still comes back, waiting does not
		   hang on the abandoned job, and the pool keeps working. */
		cc.fail_err = -EIO;
		cc.calls = 0;
		cc.fail_from = 1;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EIO);
		kvt_savepool_wait(sp, UINT64_MAX);
		/* The pool still works afterwards. */
		cc.fail_err = 0;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), 0);
		kvt_savepool_wait(sp, ticket);
		assert_memory_equal(d, s, sizeof(s));
		assert_int_equal(kvt_savepool_last_ticket(sp), ticket);
		kvt_savepool_destroy(sp);
	}
}

/* A stage copy that notes which job's sources each buffer holds, and a wait that fails for
   the chunks of one job (`doomed`), as an asynchronous copy that did not land would. */
struct tag_ctx {
	uint64_t held[2]; /* src[0].addr of the chunk in each buffer */
	uint64_t doomed;
	int fail_err;
	uint32_t waits, failed; /* atomic */
};

static int tag_copy(void *cctx, int buf, void *stage, const struct kvt_save_src *src,
		    uint32_t n_src, uint64_t off, uint64_t len)
{
	struct tag_ctx *c = cctx;

	c->held[buf] = src[0].addr;
	return test_copy(NULL, buf, stage, src, n_src, off, len);
}

static int tag_wait(void *cctx, int buf)
{
	struct tag_ctx *c = cctx;

	__atomic_add_fetch(&c->waits, 1, __ATOMIC_RELAXED);
	if (c->held[buf] != c->doomed)
		return 0;
	__atomic_add_fetch(&c->failed, 1, __ATOMIC_RELAXED);
	return c->fail_err;
}

enum { TAG_JOBS = 4, TAG_JOB = 6000 /* two chunks of a 4 KiB staging buffer */ };

/* A chunk whose wait fails is not scattered, and the waits that cover its job fail with the
   wait's error, those before it do not; the jobs after it are scattered as usual. */
static void test_savepool_wait_fails(void **state)
{
	(void)state;
	rng_state = 0x5eed5a1e0f0f0f0full;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct tag_ctx tc = {.fail_err = -ENODEV};
		struct kvt_savepool *sp;
		uint8_t *s = malloc((size_t)TAG_JOBS * TAG_JOB), *d = calloc(TAG_JOBS, TAG_JOB);
		struct kvt_save_src src[TAG_JOBS];
		struct kvt_xfer x[TAG_JOBS];
		uint64_t tk[TAG_JOBS];

		assert_non_null(s);
		assert_non_null(d);
		fill_random(s, (size_t)TAG_JOBS * TAG_JOB);
		tc.doomed = a64(s + TAG_JOB); /* job 1 */
		assert_int_equal(kvt_savepool_create(thread_counts[t], 4096, &plain, tag_copy,
						     tag_wait, &tc, &sp),
				 0);
		for (int j = 0; j < TAG_JOBS - 1; j++) {
			src[j] = (struct kvt_save_src){a64(s + (size_t)j * TAG_JOB), TAG_JOB};
			x[j] = (struct kvt_xfer){.src = 0,
						 .dst = a64(d + (size_t)j * TAG_JOB),
						 .bytes = TAG_JOB,
						 .reps = 1};
			assert_int_equal(kvt_savepool_submit_xfer(sp, &src[j], 1, &x[j], 1, &tk[j]),
					 0);
		}
		assert_int_equal(kvt_savepool_wait(sp, tk[0]), 0);
		CHECK_BYTES(d, s, TAG_JOB, "job 0, before the lost one");
		assert_int_equal(kvt_savepool_wait(sp, tk[1]), -ENODEV);
		for (size_t i = 0; i < TAG_JOB; i++)
			if (d[TAG_JOB + i])
				fail_msg("threads %u: the lost job's byte %zu was scattered",
					 thread_counts[t], i);
		assert_int_equal(kvt_savepool_wait(sp, tk[2]), -ENODEV);
		CHECK_BYTES(d + 2 * TAG_JOB, s + 2 * TAG_JOB, TAG_JOB, "job 2, after the lost one");
		assert_int_equal(kvt_savepool_wait(sp, tk[0]), 0);		    /* still */
		assert_int_equal(__atomic_load_n(&tc.failed, __ATOMIC_RELAXED), 2); /* 2 chunks */
		assert_int_equal(__atomic_load_n(&tc.waits, __ATOMIC_RELAXED), 6);
		/* a later job lands; waits that cover the lost one keep failing */
		src[3] = (struct kvt_save_src){a64(s + 3 * TAG_JOB), TAG_JOB};
		x[3] = (struct kvt_xfer){
			.src = 0, .dst = a64(d + 3 * TAG_JOB), .bytes = TAG_JOB, .reps = 1};
		assert_int_equal(kvt_savepool_submit_xfer(sp, &src[3], 1, &x[3], 1, &tk[3]), 0);
		assert_int_equal(kvt_savepool_wait(sp, UINT64_MAX), -ENODEV);
		CHECK_BYTES(d + 3 * TAG_JOB, s + 3 * TAG_JOB, TAG_JOB, "job 3");
		kvt_savepool_destroy(sp);
		free(s);
		free(d);
	}
}

/* A scatter that sleeps before it copies, then counts itself done. The job's ctx is a struct
   slow_ctx. Jobs are 128 KiB, as two 64 KiB items, and the staging buffers as large, so the
   pool hands them to its threads (small chunks may be scattered by the caller itself). */
struct slow_ctx {
	int *done;
	unsigned sleep_ms;
};

enum { SLOW_JOB = 128 << 10 };

static void slow_scatter(const void *items, uint32_t i0, uint32_t i1, const uint8_t *stage,
			 uint64_t c0, uint64_t c1, const void *ctx)
{
	struct slow_ctx sc;

	memcpy(&sc, ctx, sizeof(sc));
	usleep(sc.sleep_ms * 1000u);
	kvt_scatter_xfer(items, i0, i1, stage, c0, c1, NULL);
	__atomic_add_fetch(sc.done, 1, __ATOMIC_RELEASE);
}

struct slow_job {
	uint8_t *dst;
	struct kvt_xfer x[2];
	struct slow_ctx ctx;
	struct kvt_save_job job;
	int done;
};

/* src: SLOW_JOB bytes. dst gets them in two halves, swapped. */
static void slow_job_init(struct slow_job *j, const struct kvt_save_src *src, unsigned sleep_ms)
{
	const uint32_t half = SLOW_JOB / 2;

	j->dst = calloc(1, SLOW_JOB);
	assert_non_null(j->dst);
	j->x[0] = (struct kvt_xfer){.src = 0, .dst = a64(j->dst + half), .bytes = half, .reps = 1};
	j->x[1] = (struct kvt_xfer){.src = half, .dst = a64(j->dst), .bytes = half, .reps = 1};
	j->done = 0;
	j->ctx = (struct slow_ctx){&j->done, sleep_ms};
	j->job = (struct kvt_save_job){src,	     1,	      j->x,	     2, sizeof(j->x[0]),
				       slow_scatter, &j->ctx, sizeof(j->ctx)};
}

/* The job's destination holds its source, all of it. */
static void slow_job_check(struct slow_job *j, const uint8_t *src, const char *file, int line)
{
	const uint32_t half = SLOW_JOB / 2;

	_assert_true(__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) >= 1, "scatter ran", file, line);
	check_bytes(j->dst + half, src, half, "slow job, first half", file, line);
	check_bytes(j->dst, src + half, half, "slow job, second half", file, line);
}
#define SLOW_JOB_CHECK(j, src) slow_job_check((j), (src), __FILE__, __LINE__)

/* destroy lands every job: the one being scattered and the one still queued behind it. */
static void test_savepool_destroy_waits(void **state)
{
	(void)state;
	rng_state = 0x7777888899990000ull;
	for (uint32_t threads = 1; threads <= 2; threads++) {
		struct kvt_savepool *sp;
		uint8_t *s = calloc(1, SLOW_JOB);
		struct kvt_save_src src = {a64(s), SLOW_JOB};
		struct slow_job j1, j2;
		uint64_t t1, t2;

		assert_non_null(s);
		fill_random(s, SLOW_JOB);
		slow_job_init(&j1, &src, 150);
		slow_job_init(&j2, &src, 150);
		assert_int_equal(
			kvt_savepool_create(threads, SLOW_JOB, &plain, test_copy, NULL, NULL, &sp),
			0);
		assert_int_equal(kvt_savepool_submit(sp, &j1.job, &t1), 0);
		assert_int_equal(kvt_savepool_submit(sp, &j2.job, &t2), 0);
		assert_int_equal(t1, 1);
		assert_int_equal(t2, 2);
		/* The contexts were copied at submit: changing ours must not matter. */
		j1.ctx.sleep_ms = j2.ctx.sleep_ms = 100000;
		kvt_savepool_destroy(sp);
		SLOW_JOB_CHECK(&j1, s);
		SLOW_JOB_CHECK(&j2, s);
		free(j1.dst);
		free(j2.dst);
		free(s);
	}
}

/* wait(t) covers job t and every earlier one, including one still being scattered when the
   wait starts; a submit that needs a busy staging buffer waits for the job in it. Job 2 is
   much slower than jobs 1 and 3, so a wait that returned early would find it incomplete. */
static void test_savepool_wait_ticket(void **state)
{
	struct kvt_savepool *sp;
	uint8_t *s = calloc(1, SLOW_JOB);
	struct kvt_save_src src = {a64(s), SLOW_JOB};
	struct slow_job j1, j2, j3;
	uint64_t t1, t2, t3;

	(void)state;
	assert_non_null(s);
	rng_state = 0x1357924680acebdfull;
	fill_random(s, SLOW_JOB);
	slow_job_init(&j1, &src, 20);
	slow_job_init(&j2, &src, 400);
	slow_job_init(&j3, &src, 200);
	assert_int_equal(kvt_savepool_create(2, SLOW_JOB, &plain, test_copy, NULL, NULL, &sp), 0);
	assert_int_equal(kvt_savepool_submit(sp, &j1.job, &t1), 0);
	assert_int_equal(kvt_savepool_submit(sp, &j2.job, &t2), 0);
	/* Third job reuses job 1's buffer: its submit returns once job 1 is scattered. */
	assert_int_equal(kvt_savepool_submit(sp, &j3.job, &t3), 0);
	assert_int_equal(t2, t1 + 1);
	assert_int_equal(t3, t2 + 1);
	assert_int_equal(kvt_savepool_last_ticket(sp), t3);
	SLOW_JOB_CHECK(&j1, s);
	kvt_savepool_wait(sp, t2);
	SLOW_JOB_CHECK(&j2, s);
	kvt_savepool_wait(sp, UINT64_MAX);
	SLOW_JOB_CHECK(&j3, s);
	kvt_savepool_destroy(sp);
	free(j1.dst);
	free(j2.dst);
	free(j3.dst);
	free(s);
}

static void test_savepool_zero_and_invalid_jobs(void **state)
{
	(void)state;
	for (size_t t = 0; t < N_THREAD_COUNTS; t++) {
		struct kvt_savepool *sp;
		uint8_t s[16];
		struct kvt_save_src src = {a64(s), 0};
		struct kvt_xfer x = {.src = 0, .dst = a64(s), .bytes = 0, .reps = 1};
		struct kvt_save_job job = {&src, 1, &x, 1, sizeof(x), kvt_scatter_xfer, NULL, 0};
		uint8_t big_ctx[KVT_SAVE_CTX_MAX + 1] = {0};
		uint64_t ticket = 0, before;

		assert_int_equal(kvt_savepool_create(thread_counts[t], 4096, &plain, test_copy,
						     NULL, NULL, &sp),
				 0);
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), 0);
		assert_int_equal(ticket, 1);
		job.n_src = 0;
		job.n_items = 0;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), 0);
		assert_int_equal(ticket, 2);
		kvt_savepool_wait(sp, ticket);
		/* Invalid jobs: -EINVAL and no ticket taken. */
		before = kvt_savepool_last_ticket(sp);
		job.ctx = big_ctx;
		job.ctx_size = sizeof(big_ctx);
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EINVAL);
		job.ctx_size = 0;
		job.scatter = NULL;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EINVAL);
		job.scatter = kvt_scatter_xfer;
		job.items = NULL;
		job.n_items = 1;
		assert_int_equal(kvt_savepool_submit(sp, &job, &ticket), -EINVAL);
		assert_int_equal(kvt_savepool_last_ticket(sp), before);
		kvt_savepool_destroy(sp);
	}
}

/* ---- null backend ----------------------------------------------------------------------- */

static void test_null_backend(void **state)
{
	const struct kvt_backend_ops *o = &kvt_backend_null_ops;
	struct kvt_backend_params bp = {2, 4096};
	struct kvt_be *b = NULL;
	uint64_t dev, host, t1, t2, t3;
	/* (device, host) arena sizes; the last pair is a replay-scale host tier (docs/design.md:
	   ~10^9 host blocks) beside a GPU-sized device tier. */
	const uint64_t sizes[][2] = {
		{4096, 4096},
		{1ull << 30, 1ull << 30},
		{1ull << 40, 1ull << 40},
		{80ull << 30, 1ull << 46},
	};

	(void)state;
	assert_int_equal(o->version, KVT_BACKEND_OPS_VERSION);
	assert_int_equal(o->create(&bp, &b), 0);
	assert_non_null(b);
	assert_ptr_equal(b->ops, o);
	assert_true(b->flags & KVT_BE_NO_PAYLOAD);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, sizes[i][0], &dev), 0);
		assert_int_equal(o->arena_alloc(b, KVT_TIER_HOST, sizes[i][1], &host), 0);
		assert_true(dev != 0 && host != 0);
		assert_int_equal(dev % 4096, 0);
		assert_int_equal(host % 4096, 0);
		/* Disjoint, and neither wraps around the address space. */
		assert_true(dev + sizes[i][0] > dev && host + sizes[i][1] > host);
		assert_true(dev + sizes[i][0] <= host || host + sizes[i][1] <= dev);
		o->arena_free(b, KVT_TIER_HOST, host, sizes[i][1]);
		o->arena_free(b, KVT_TIER_DEVICE, dev, sizes[i][0]);
	}
	uint64_t base = 5;

	assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, 0, &base), -EINVAL);
	assert_int_equal(base, 5);

	/* Every op succeeds and dereferences nothing: the addresses below are unmapped. */
	struct kvt_xfer x[2] = {
		{.src = 16,
		 .dst = 32,
		 .bytes = 1 << 20,
		 .reps = 3,
		 .src_stride = 8,
		 .dst_stride = 8},
		{.src = 1ull << 44, .dst = 1ull << 45, .bytes = 64, .reps = 1},
	};
	struct kvt_save_src src = {48, 1 << 20};
	struct kvt_append ap = {64, 128};
	struct kvt_append_geom g = {8, 256, 4096, 2048};

	assert_int_equal(o->copy_d2d(b, x, 2, NULL), 0);
	assert_int_equal(o->gather_h2d(b, x, 2, NULL), 0);
	assert_int_equal(o->save(b, &src, 1, x, 2, NULL, &t1), 0);
	assert_int_equal(o->append(b, 16, 32, 1, &ap, &g, NULL, &t2), 0);
	assert_int_equal(o->save(b, &src, 1, x, 2, NULL, &t3), 0);
	assert_int_equal(t1, 1);
	assert_int_equal(t2, 2);
	assert_int_equal(t3, 3);
	assert_int_equal(o->save_wait(b, t2), 0);
	assert_int_equal(o->save_wait(b, UINT64_MAX), 0);
	assert_int_equal(o->sync(b, NULL), 0);
	/* Lists that are NULL with entries are refused. */
	assert_int_equal(o->copy_d2d(b, NULL, 1, NULL), -EINVAL);
	assert_int_equal(o->gather_h2d(b, NULL, 1, NULL), -EINVAL);

	/* No payload to read back. */
	uint8_t dst[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	b->err[0] = '\0';
	assert_int_equal(o->read_d2h(b, dst, 4096, sizeof(dst), NULL), -ENOTSUP);
	assert_true(strlen(b->err) > 0);
	assert_int_equal(dst[0], 1);
	o->destroy(b);
}

/* ---- lookup ----------------------------------------------------------------------------- */

static void test_backend_find(void **state)
{
	enum kvt_backend res;
	int err;

	(void)state;
	res = (enum kvt_backend)99;
	err = 0;
	if (t_auto_backend() == KVT_BACKEND_HOST) {
		assert_ptr_equal(kvt_backend_find(KVT_BACKEND_AUTO, &res, &err),
				 &kvt_backend_host_ops);
		assert_int_equal(res, KVT_BACKEND_HOST);
		err = 0;
		assert_null(kvt_backend_find(KVT_BACKEND_CUDA, &res, &err));
		assert_int_equal(err, -ENODEV);
	} else {
		const struct kvt_backend_ops *cuda = kvt_plugin_load(&err)->ops;

		assert_ptr_equal(kvt_backend_find(KVT_BACKEND_AUTO, &res, &err), cuda);
		assert_int_equal(res, KVT_BACKEND_CUDA);
		assert_ptr_equal(kvt_backend_find(KVT_BACKEND_CUDA, &res, &err), cuda);
	}
	res = (enum kvt_backend)99;
	assert_ptr_equal(kvt_backend_find(KVT_BACKEND_HOST, &res, &err), &kvt_backend_host_ops);
	assert_int_equal(res, KVT_BACKEND_HOST);

	err = 0;
	res = (enum kvt_backend)99;
	assert_ptr_equal(kvt_backend_find(KVT_BACKEND_MODEL, &res, &err), &kvt_backend_model_ops);
	assert_int_equal(res, KVT_BACKEND_MODEL);
	err = 0;
	assert_null(kvt_backend_find((enum kvt_backend)4, &res, &err));
	assert_int_equal(err, -EINVAL);
	err = 0;
	assert_null(kvt_backend_find((enum kvt_backend) - 1, &res, &err));
	assert_int_equal(err, -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_host_create),
		cmocka_unit_test(test_host_arena),
		cmocka_unit_test(test_host_copy_d2d),
		cmocka_unit_test(test_host_gather_h2d),
		cmocka_unit_test(test_host_save_multi_source),
		cmocka_unit_test(test_host_save_chunked),
		cmocka_unit_test(test_host_save_chunk_edges),
		cmocka_unit_test(test_host_append),
		cmocka_unit_test(test_host_read_d2h),
		cmocka_unit_test(test_host_many_saves),
		cmocka_unit_test(test_host_save_overlapping_dst),
		cmocka_unit_test(test_savepool_create_validation),
		cmocka_unit_test(test_savepool_copy_fails),
		cmocka_unit_test(test_savepool_destroy_waits),
		cmocka_unit_test(test_savepool_wait_ticket),
		cmocka_unit_test(test_savepool_wait_fails),
		cmocka_unit_test(test_savepool_zero_and_invalid_jobs),
		cmocka_unit_test(test_null_backend),
		cmocka_unit_test(test_backend_find),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
