/* SPDX-License-Identifier: MIT */
/*
 * transfer: the host backend's operations (arena, copies, gathers, saves, appends, reads).
 */
#include "test_transfer.h"

/* ---- host backend ----------------------------------------------------------------------- */

void test_host_create(void **state)
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

void test_host_arena(void **state)
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

/* Virtual memory of the process, KiB (VmSize), or 0 when it cannot be read. */
static uint64_t vm_kib(void)
{
	char line[256];
	uint64_t kib = 0;
	FILE *f = fopen("/proc/self/status", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "VmSize:", 7) == 0)
			kib = strtoull(line + 7, NULL, 10);
	fclose(f);
	return kib;
}

/* Backends created and destroyed one after another, each with its tiers' arenas and staging
   buffers, leave the address space as it was: with jemalloc's default extent hooks a destroyed
   arena kept its address space (2 MiB and more a backend until 2026-12-06: 1 GiB over these
   500); the arenas' own hooks unmap it. */
void test_host_arena_reuse(void **state)
{
	const struct kvt_backend_ops *o = &kvt_backend_host_ops;
	uint64_t before = 0, after;

	(void)state;
	for (int i = 0; i < 500; i++) {
		struct kvt_be *b = host_create(i % 2, 1 << 16);
		uint64_t dev = 0, host = 0;

		assert_int_equal(o->arena_alloc(b, KVT_TIER_DEVICE, 1 << 20, &dev), 0);
		assert_int_equal(o->arena_alloc(b, KVT_TIER_HOST, 3 << 20, &host), 0);
		/* written: the hooks' pages are mapped and writable */
		for (uint64_t x = 0; x < (1 << 20); x += 4096)
			((volatile uint8_t *)(uintptr_t)dev)[x] = 0x5a;
		for (uint64_t x = 0; x < (3 << 20); x += 4096)
			((volatile uint8_t *)(uintptr_t)host)[x] = 0xa5;
		if (i % 3) /* and some left to the destroy */
			o->arena_free(b, KVT_TIER_HOST, host, 3 << 20);
		o->destroy(b);
		if (i == 9) /* the pool and jemalloc's own structures made */
			before = vm_kib();
	}
	after = vm_kib();
	assert_true(before > 0 && after > 0); /* Linux's /proc */
	print_message("# VmSize %llu KiB after 10 backends, %llu KiB after 500\n",
		      (unsigned long long)before, (unsigned long long)after);
	assert_true(after < before + (64 << 10));
}

void test_host_copy_d2d(void **state)
{
	(void)state;
	rng_state = 0x9e3779b97f4a7c15ull;
	check_copy_op(kvt_backend_host_ops.copy_d2d);
}

void test_host_gather_h2d(void **state)
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

void test_host_save_multi_source(void **state)
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

void test_host_save_chunked(void **state)
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
void test_host_save_chunk_edges(void **state)
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

void test_host_append(void **state)
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

void test_host_read_d2h(void **state)
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
void test_host_many_saves(void **state)
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
void test_host_save_overlapping_dst(void **state)
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
