/* SPDX-License-Identifier: MIT */
/*
 * manager/pool: the id pools behind device frame groups and host block groups.
 *
 * Checked against pool.h's contract: ids 0, 1, 2, ... first, all-or-nothing allocation, frees
 * that validate every id before changing anything, LIFO reuse, and a long random run against a
 * shadow bitmap kept by the test (an id is never handed out twice while in use, the pool's own
 * bitmap and counters always agree with the shadow). Set-up does no work per unit: a pool of
 * 2^28 units takes no memory until used, and the largest pool (2^32 - 2 units) works.
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

#include "pool.h"
#include "t_manager.h"

#if defined(__SANITIZE_ADDRESS__)
#define T_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_HAVE_ASAN 1
#endif
#endif
#ifdef T_HAVE_ASAN
#include <sanitizer/asan_interface.h>
#endif

/* Asserts that the pool's bitmap says exactly `used` for every id (and nothing past n_units). */
static void check_bitmap(const struct kvt_pool *p, const bool *used, const char *file, int line)
{
	uint32_t count = 0;

	for (uint32_t id = 0; id < p->n_units; id++) {
		if (kvt_pool_is_used(p, id) != used[id]) {
			print_error("id %u: pool says %s, expected %s\n", id,
				    kvt_pool_is_used(p, id) ? "used" : "free",
				    used[id] ? "used" : "free");
			_fail(file, line);
		}
		count += used[id];
	}
	_assert_int_equal(kvt_pool_used(p), count, file, line);
	_assert_int_equal(p->n_free, p->n_units - count, file, line);
	_assert_true(!kvt_pool_is_used(p, p->n_units), "is_used(n_units)", file, line);
	_assert_true(!kvt_pool_is_used(p, UINT32_MAX), "is_used(UINT32_MAX)", file, line);
}
#define CHECK_BITMAP(p, used) check_bitmap((p), (used), __FILE__, __LINE__)

static void test_init_errors(void **state)
{
	struct kvt_pool p;

	(void)state;
	memset(&p, 0xa5, sizeof(p));
	assert_int_equal(kvt_pool_init(&p, 0, NULL, 0), -EINVAL);
	/* A failed init leaves a pool fini accepts. */
	assert_int_equal(p.n_units, 0);
	assert_null(p.free_ids);
	assert_null(p.in_use);
	kvt_pool_fini(&p);

	memset(&p, 0xa5, sizeof(p));
	assert_int_equal(kvt_pool_init(&p, UINT32_MAX, NULL, 0), -EINVAL);
	assert_int_equal(p.n_units, 0);
	kvt_pool_fini(&p);

	/* One unit is the smallest valid pool. */
	assert_int_equal(kvt_pool_init(&p, 1, NULL, 0), 0);
	assert_int_equal(p.n_units, 1);
	assert_int_equal(p.n_free, 1);
	assert_int_equal(kvt_pool_used(&p), 0);
	assert_false(kvt_pool_is_used(&p, 0));
	kvt_pool_fini(&p);
}

static void test_ascending_at_first(void **state)
{
	const uint32_t n = 200; /* not a multiple of 64: the last bitmap word is partial */
	struct kvt_pool p;
	uint32_t ids[200];

	(void)state;
	assert_int_equal(kvt_pool_init(&p, n, NULL, 0), 0);
	/* One at a time, then in batches of varying size: always the next id up. */
	for (uint32_t i = 0; i < 10; i++) {
		assert_int_equal(kvt_pool_alloc(&p, 1, &ids[i]), 0);
		assert_int_equal(ids[i], i);
	}
	uint32_t next = 10;

	for (uint32_t b = 1; next < n; b++) {
		uint32_t take = b < n - next ? b : n - next;

		assert_int_equal(kvt_pool_alloc(&p, take, ids), 0);
		for (uint32_t i = 0; i < take; i++)
			assert_int_equal(ids[i], next + i);
		next += take;
	}
	assert_int_equal(kvt_pool_used(&p), n);
	assert_int_equal(p.n_free, 0);
	for (uint32_t id = 0; id < n; id++)
		assert_true(kvt_pool_is_used(&p, id));
	kvt_pool_fini(&p);
}

static void test_alloc_all_or_nothing(void **state)
{
	const uint32_t n = 70;
	struct kvt_pool p;
	uint32_t ids[80], more[80];
	bool used[70] = {0};

	(void)state;
	assert_int_equal(kvt_pool_init(&p, n, NULL, 0), 0);
	/* Asking for more than the pool holds fails on an empty pool too. */
	memset(more, 0xee, sizeof(more));
	assert_int_equal(kvt_pool_alloc(&p, n + 1, more), -ENOMEM);
	assert_int_equal(p.n_free, n);
	CHECK_BITMAP(&p, used);

	assert_int_equal(kvt_pool_alloc(&p, 60, ids), 0);
	for (uint32_t i = 0; i < 60; i++)
		used[ids[i]] = true;
	CHECK_BITMAP(&p, used);

	/* 10 free: 11 fails and takes nothing, whatever the shortfall. */
	uint32_t asks[] = {11, 12, 69, 70, 71, UINT32_MAX};

	for (size_t a = 0; a < sizeof(asks) / sizeof(asks[0]); a++) {
		assert_int_equal(kvt_pool_alloc(&p, asks[a], asks[a] <= 80 ? more : NULL), -ENOMEM);
		assert_int_equal(p.n_free, 10);
		CHECK_BITMAP(&p, used);
	}
	/* The 10 left are exactly the ids a full-pool run would have handed out next. */
	assert_int_equal(kvt_pool_alloc(&p, 10, more), 0);
	for (uint32_t i = 0; i < 10; i++) {
		assert_int_equal(more[i], 60 + i);
		used[more[i]] = true;
	}
	CHECK_BITMAP(&p, used);
	assert_int_equal(kvt_pool_alloc(&p, 1, more), -ENOMEM);
	CHECK_BITMAP(&p, used);
	kvt_pool_fini(&p);
}

static void test_zero_counts(void **state)
{
	struct kvt_pool p;
	uint32_t ids[4];
	bool used[4] = {0};

	(void)state;
	assert_int_equal(kvt_pool_init(&p, 4, NULL, 0), 0);
	/* n == 0 succeeds and touches nothing (ids may be NULL). */
	assert_int_equal(kvt_pool_alloc(&p, 0, NULL), 0);
	assert_int_equal(kvt_pool_free(&p, NULL, 0), 0);
	CHECK_BITMAP(&p, used);
	assert_int_equal(kvt_pool_alloc(&p, 4, ids), 0);
	for (int i = 0; i < 4; i++)
		used[ids[i]] = true;
	/* ... also on a full pool. */
	assert_int_equal(kvt_pool_alloc(&p, 0, NULL), 0);
	assert_int_equal(kvt_pool_free(&p, ids, 0), 0);
	CHECK_BITMAP(&p, used);
	kvt_pool_fini(&p);
}

static void test_free_validation(void **state)
{
	const uint32_t n = 100;
	struct kvt_pool p;
	uint32_t ids[10];
	bool used[100] = {0};

	(void)state;
	assert_int_equal(kvt_pool_init(&p, n, NULL, 0), 0);
	assert_int_equal(kvt_pool_alloc(&p, 10, ids), 0); /* 0 .. 9 */
	for (int i = 0; i < 10; i++)
		used[ids[i]] = true;

	/* Each bad list is rejected whole: good ids before and after the bad one stay in use. */
	const uint32_t bad[][4] = {
		{2, 3, 100, 4},	       /* out of range (== n_units) */
		{2, 3, 4, UINT32_MAX}, /* out of range, last */
		{UINT32_MAX - 63, 1, 2, 3},
		{5, 6, 50, 7}, /* never handed out */
		{1, 2, 1, 3},  /* repeated within the call */
		{7, 8, 9, 9},  /* repeated, adjacent, last */
		{0, 0, 0, 0},
	};
	for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
		assert_int_equal(kvt_pool_free(&p, bad[b], 4), -EINVAL);
		CHECK_BITMAP(&p, used);
	}
	/* A failed free must not have pushed anything on the free stack: the next ids out are
	   still 10, 11, ... */
	uint32_t nx[2];

	assert_int_equal(kvt_pool_alloc(&p, 2, nx), 0);
	assert_int_equal(nx[0], 10);
	assert_int_equal(nx[1], 11);
	used[10] = used[11] = true;

	/* Double free across calls. */
	assert_int_equal(kvt_pool_free(&p, &ids[4], 1), 0);
	used[4] = false;
	CHECK_BITMAP(&p, used);
	assert_int_equal(kvt_pool_free(&p, &ids[4], 1), -EINVAL);
	CHECK_BITMAP(&p, used);
	/* A list that includes an already-freed id is rejected whole. */
	uint32_t mix[3] = {3, 4, 5};

	assert_int_equal(kvt_pool_free(&p, mix, 3), -EINVAL);
	CHECK_BITMAP(&p, used);
	/* The one free id (4) is what comes out next, once. */
	assert_int_equal(kvt_pool_alloc(&p, 1, nx), 0);
	assert_int_equal(nx[0], 4);
	used[4] = true;
	assert_int_equal(kvt_pool_alloc(&p, 1, nx), 0);
	assert_int_equal(nx[0], 12);
	used[12] = true;
	CHECK_BITMAP(&p, used);
	kvt_pool_fini(&p);
}

static void test_lifo_reuse(void **state)
{
	struct kvt_pool p;
	uint32_t ids[8], got[8];

	(void)state;
	assert_int_equal(kvt_pool_init(&p, 8, NULL, 0), 0);
	assert_int_equal(kvt_pool_alloc(&p, 5, ids), 0); /* 0..4 */
	const uint32_t fr[2] = {1, 3};

	assert_int_equal(kvt_pool_free(&p, fr, 2), 0);
	assert_int_equal(kvt_pool_used(&p), 3);
	/* Last freed first out, then the untouched ascending ids. */
	assert_int_equal(kvt_pool_alloc(&p, 4, got), 0);
	assert_int_equal(got[0], 3);
	assert_int_equal(got[1], 1);
	assert_int_equal(got[2], 5);
	assert_int_equal(got[3], 6);

	/* Separate frees stack up as well. */
	const uint32_t a = 0, b = 6, c = 2;

	assert_int_equal(kvt_pool_free(&p, &a, 1), 0);
	assert_int_equal(kvt_pool_free(&p, &b, 1), 0);
	assert_int_equal(kvt_pool_free(&p, &c, 1), 0);
	assert_int_equal(kvt_pool_alloc(&p, 3, got), 0);
	assert_int_equal(got[0], 2);
	assert_int_equal(got[1], 6);
	assert_int_equal(got[2], 0);
	kvt_pool_fini(&p);
}

static void test_used_and_is_used(void **state)
{
	struct kvt_pool p;
	uint32_t ids[130];

	(void)state;
	assert_int_equal(kvt_pool_init(&p, 130, NULL, 0), 0);
	assert_int_equal(kvt_pool_used(&p), 0);
	assert_int_equal(kvt_pool_alloc(&p, 130, ids), 0);
	assert_int_equal(kvt_pool_used(&p), 130);
	/* Free the ids on both sides of each bitmap word boundary. */
	const uint32_t fr[6] = {0, 63, 64, 127, 128, 129};

	assert_int_equal(kvt_pool_free(&p, fr, 6), 0);
	assert_int_equal(kvt_pool_used(&p), 124);
	for (uint32_t id = 0; id < 130; id++) {
		bool expect =
			!(id == 0 || id == 63 || id == 64 || id == 127 || id == 128 || id == 129);

		assert_int_equal(kvt_pool_is_used(&p, id), expect);
	}
	assert_false(kvt_pool_is_used(&p, 130));
	assert_false(kvt_pool_is_used(&p, 191)); /* inside the last bitmap word, past n_units */
	assert_false(kvt_pool_is_used(&p, UINT32_MAX));
	kvt_pool_fini(&p);
}

static uint64_t rng_state;

static uint32_t rnd(uint32_t bound)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state % bound);
}

static void test_random_run(void **state)
{
	const uint32_t n = 1000;
	struct kvt_pool p;
	bool *shadow = calloc(n, sizeof(*shadow));
	uint32_t *held = malloc(n * sizeof(*held)); /* ids the test holds, any order */
	uint32_t n_held = 0, ids[40];

	(void)state;
	assert_non_null(shadow);
	assert_non_null(held);
	rng_state = 0x1234567887654321ull;
	assert_int_equal(kvt_pool_init(&p, n, NULL, 0), 0);
	for (int step = 0; step < 40000; step++) {
		uint32_t op = rnd(10);

		if (op < 5) { /* alloc 0..32 */
			uint32_t k = rnd(33);
			int rc = kvt_pool_alloc(&p, k, ids);

			if (k > n - n_held) {
				assert_int_equal(rc, -ENOMEM);
				continue;
			}
			assert_int_equal(rc, 0);
			for (uint32_t i = 0; i < k; i++) {
				assert_true(ids[i] < n);
				assert_false(shadow[ids[i]]); /* never handed out twice */
				shadow[ids[i]] = true;
				held[n_held++] = ids[i];
			}
		} else if (op < 9) { /* free a random subset of what is held */
			uint32_t k = n_held ? rnd(n_held < 33 ? n_held + 1 : 33) : 0;

			for (uint32_t i = 0; i < k; i++) {
				uint32_t j = rnd(n_held);

				ids[i] = held[j];
				held[j] = held[--n_held];
			}
			/* Sometimes poison the list: the whole call must then be refused. */
			if (k && rnd(4) == 0) {
				uint32_t bad_kind = rnd(3), at = rnd(k + 1);
				uint32_t bad = bad_kind == 0   ? n + rnd(100)
					       : bad_kind == 1 ? ids[rnd(k)]
							       : UINT32_MAX;

				memmove(&ids[at + 1], &ids[at], (k - at) * sizeof(ids[0]));
				ids[at] = bad;
				assert_int_equal(kvt_pool_free(&p, ids, k + 1), -EINVAL);
				/* Nothing freed: put them back in the held list. */
				memmove(&ids[at], &ids[at + 1], (k - at) * sizeof(ids[0]));
				for (uint32_t i = 0; i < k; i++) {
					assert_true(kvt_pool_is_used(&p, ids[i]));
					held[n_held++] = ids[i];
				}
				continue;
			}
			assert_int_equal(kvt_pool_free(&p, ids, k), 0);
			for (uint32_t i = 0; i < k; i++)
				shadow[ids[i]] = false;
		} else { /* a free of an id not in use */
			uint32_t id = rnd(n);

			if (!shadow[id])
				assert_int_equal(kvt_pool_free(&p, &id, 1), -EINVAL);
		}
		assert_int_equal(kvt_pool_used(&p), n_held);
		if (step % 997 == 0)
			CHECK_BITMAP(&p, shadow);
	}
	CHECK_BITMAP(&p, shadow);
	/* Drain: every id not held comes out exactly once. */
	uint32_t rest = n - n_held;

	for (uint32_t i = 0; i < rest; i++) {
		assert_int_equal(kvt_pool_alloc(&p, 1, ids), 0);
		assert_false(shadow[ids[0]]);
		shadow[ids[0]] = true;
	}
	assert_int_equal(kvt_pool_alloc(&p, 1, ids), -ENOMEM);
	for (uint32_t id = 0; id < n; id++)
		assert_true(shadow[id]);
	kvt_pool_fini(&p);
	free(shadow);
	free(held);
}

static void test_fini_zeroed(void **state)
{
	struct kvt_pool p = {0};

	(void)state;
	kvt_pool_fini(&p);
	kvt_pool_fini(&p);
	assert_int_equal(p.n_units, 0);
	/* And fini of a live pool leaves a zeroed one, so a second fini is harmless. */
	assert_int_equal(kvt_pool_init(&p, 3, NULL, 0), 0);
	kvt_pool_fini(&p);
	assert_int_equal(p.n_units, 0);
	assert_null(p.free_ids);
	assert_null(p.in_use);
	kvt_pool_fini(&p);
}

/* Memory a test may see the process take besides what it checks for (stdio buffers, cmocka). */
#define RSS_SLACK ((uint64_t)16 << 20)

#define CHECK_RSS_BELOW(limit, what)                                          \
	do {                                                                  \
		uint64_t rss_ = t_rss_bytes();                                \
		if (rss_ > (limit))                                           \
			fail_at(__FILE__, __LINE__,                           \
				"%s: resident memory %llu MiB, at most %llu " \
				"MiB expected",                               \
				(what), (unsigned long long)(rss_ >> 20),     \
				(unsigned long long)((limit) >> 20));         \
	} while (0)

/* A pool of 2^28 units (1 GiB of free-id stack and 32 MiB of bitmap, were the tables written
   at set-up) takes no memory at set-up, and then memory in proportion to the ids handed out;
   ids come out ascending, returned ones first, as in any pool. */
static void test_lazy_tables(void **state)
{
	const uint32_t n = 1u << 28, k = 100000;
	struct kvt_pool p;
	uint32_t *ids = malloc(k * sizeof(*ids));
	uint64_t rss0;

	(void)state;
	assert_non_null(ids);
	memset(ids, 0, k * sizeof(*ids));
	rss0 = t_rss_bytes();
	assert_int_equal(kvt_pool_init(&p, n, NULL, 0), 0);
	CHECK_RSS_BELOW(rss0 + RSS_SLACK, "after init of 2^28 units");
	assert_int_equal(p.n_free, n);
	assert_int_equal(kvt_pool_used(&p), 0);
	assert_false(kvt_pool_is_used(&p, 0));
	assert_false(kvt_pool_is_used(&p, n - 1));

	assert_int_equal(kvt_pool_alloc(&p, k, ids), 0);
	for (uint32_t i = 0; i < k; i++)
		assert_int_equal(ids[i], i);
	/* Every other id back, then out again most recently freed first, then fresh ids. */
	for (uint32_t i = 0; i < k; i += 2)
		assert_int_equal(kvt_pool_free(&p, &ids[i], 1), 0);
	assert_int_equal(kvt_pool_used(&p), k / 2);
	assert_int_equal(kvt_pool_alloc(&p, k / 2 + 2, ids), 0);
	for (uint32_t i = 0; i < k / 2; i++)
		assert_int_equal(ids[i], k - 2 - 2 * i);
	assert_int_equal(ids[k / 2], k);
	assert_int_equal(ids[k / 2 + 1], k + 1);
	assert_true(kvt_pool_is_used(&p, k + 1));
	assert_false(kvt_pool_is_used(&p, k + 2));
	assert_int_equal(kvt_pool_free(&p, (const uint32_t[]){k + 2}, 1), -EINVAL);
	assert_int_equal(kvt_pool_free(&p, (const uint32_t[]){n - 1}, 1), -EINVAL);
	assert_int_equal(kvt_pool_used(&p), k + 2);
	/* 100002 ids cost their 400 KB of stack and 12.5 KB of bitmap, not the whole tables. */
	CHECK_RSS_BELOW(rss0 + RSS_SLACK, "after 100002 ids of 2^28");
	kvt_pool_fini(&p);
	free(ids);
}

/* The largest pool, 2^32 - 2 units (17 GB of tables, were they written), set up, used at both
   ends of its id range and torn down, in no time and memory. */
static void test_largest_pool(void **state)
{
	const uint32_t n = UINT32_MAX - 1;
	uint32_t ids[4];
	struct kvt_pool p;
	uint64_t rss0 = t_rss_bytes();

	(void)state;
	assert_int_equal(kvt_pool_init(&p, n, NULL, 0), 0);
	assert_int_equal(p.n_units, n);
	assert_int_equal(p.n_free, n);
	assert_int_equal(kvt_pool_alloc(&p, 3, ids), 0);
	assert_int_equal(ids[0], 0);
	assert_int_equal(ids[2], 2);
	assert_int_equal(kvt_pool_free(&p, &ids[1], 1), 0);
	assert_int_equal(kvt_pool_free(&p, &ids[1], 1), -EINVAL); /* double free */
	assert_int_equal(kvt_pool_alloc(&p, 2, ids), 0);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 3);
	assert_int_equal(kvt_pool_used(&p), 4);
	assert_int_equal(p.n_free, n - 4);
	/* Ids the pool has never handed out, at the top of the range, and past it. */
	const uint32_t top[3] = {n - 1, n, UINT32_MAX};

	for (int i = 0; i < 3; i++) {
		assert_false(kvt_pool_is_used(&p, top[i]));
		assert_int_equal(kvt_pool_free(&p, &top[i], 1), -EINVAL);
	}
	assert_int_equal(kvt_pool_alloc(&p, n - 3, NULL), -ENOMEM); /* one short */
	assert_int_equal(kvt_pool_used(&p), 4);
	CHECK_RSS_BELOW(rss0 + RSS_SLACK, "a pool of 2^32 - 2 units");
	kvt_pool_fini(&p);
	assert_int_equal(p.n_units, 0);
	assert_null(p.free_ids);
}

#ifdef T_HAVE_ASAN
/* With ASan, the units of a pool that has a poison base are poisoned exactly while free. Only
   ASan builds register it (CI runs one): without ASan there is nothing to observe. */
static void test_poison(void **state)
{
	const uint64_t unit = 256;
	struct kvt_pool p;
	uint8_t *mem = aligned_alloc(64, 4 * unit);
	uint32_t ids[4];

	(void)state;
	assert_non_null(mem);
	assert_int_equal(kvt_pool_init(&p, 4, mem, unit), 0);
	for (int u = 0; u < 4; u++)
		assert_true(__asan_address_is_poisoned(mem + u * unit + unit / 2));
	assert_int_equal(kvt_pool_alloc(&p, 2, ids), 0); /* 0, 1 */
	assert_null(__asan_region_is_poisoned(mem, 2 * unit));
	assert_true(__asan_address_is_poisoned(mem + 2 * unit));
	memset(mem, 1, 2 * unit); /* usable */
	assert_int_equal(kvt_pool_free(&p, &ids[1], 1), 0);
	assert_true(__asan_address_is_poisoned(mem + unit));
	assert_true(__asan_address_is_poisoned(mem + 2 * unit - 1));
	assert_false(__asan_address_is_poisoned(mem + unit - 1));
	/* A refused free poisons nothing. */
	const uint32_t bad[2] = {0, 3};

	assert_int_equal(kvt_pool_free(&p, bad, 2), -EINVAL);
	assert_null(__asan_region_is_poisoned(mem, unit));
	kvt_pool_fini(&p);
	assert_null(__asan_region_is_poisoned(mem, 4 * unit));
	free(mem);
}
#endif

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init_errors),
		cmocka_unit_test(test_ascending_at_first),
		cmocka_unit_test(test_alloc_all_or_nothing),
		cmocka_unit_test(test_zero_counts),
		cmocka_unit_test(test_free_validation),
		cmocka_unit_test(test_lifo_reuse),
		cmocka_unit_test(test_used_and_is_used),
		cmocka_unit_test(test_random_run),
		cmocka_unit_test(test_fini_zeroed),
		cmocka_unit_test(test_lazy_tables),
		cmocka_unit_test(test_largest_pool),
#ifdef T_HAVE_ASAN
		cmocka_unit_test(test_poison),
#endif
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
