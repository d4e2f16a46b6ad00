/* SPDX-License-Identifier: MIT */
/*
 * manager/idmap: the id -> pointer map of the manager's sequences and the scheduler's requests.
 *
 * Checked against idmap.h's contract and its layout, which the manager's spill victim order
 * (slot order) depends on: Fibonacci hashing into 64 slots at first, doubling past half full,
 * linear probing, backward-shift deletion that leaves no tombstone, slot-order iteration, and
 * a put that fails for want of memory changing nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "idmap.h"
#include "kvtier.h"

/* The map's hash, restated: the layout (and so iteration order) must not change. */
static uint32_t home(const struct kvt_idmap *map, uint64_t key)
{
	return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> map->shift);
}

/* A distinct non-NULL value per key. */
static void *val_of(uint64_t key)
{
	return (void *)(uintptr_t)(key * 2 + 1);
}

/* Slot of key, or -1 when absent. */
static int64_t slot_of(const struct kvt_idmap *map, uint64_t key)
{
	for (uint32_t i = 0; i < map->cap; i++)
		if (map->slots[i].val && map->slots[i].key == key)
			return i;
	return -1;
}

/* The linear-probing invariant: every entry is reachable from its home without crossing an
   empty slot, the count agrees, the map is at most half full, and get finds every entry. */
static void check_map(const struct kvt_idmap *map, const char *file, int line)
{
	uint32_t mask = map->cap - 1, n = 0;

	_assert_int_equal(map->shift, 64 - (uint32_t)__builtin_ctz(map->cap), file, line);
	for (uint32_t j = 0; j < map->cap; j++) {
		const struct kvt_idmap_slot *e = &map->slots[j];

		if (!e->val)
			continue;
		n++;
		for (uint32_t i = home(map, e->key); i != j; i = (i + 1) & mask)
			_assert_true(map->slots[i].val != NULL, "no gap in the probe run", file,
				     line);
		_assert_true(kvt_idmap_get(map, e->key) == e->val, "get finds it", file, line);
	}
	_assert_int_equal(n, map->n, file, line);
	_assert_true(2 * map->n <= map->cap, "at most half full", file, line);
}
#define CHECK_MAP(map) check_map((map), __FILE__, __LINE__)

/* The first `want` keys from `from` up whose home is h. */
static void keys_at(const struct kvt_idmap *map, uint32_t h, uint64_t from, uint64_t *out,
		    uint32_t want)
{
	for (uint64_t k = from; want; k++)
		if (home(map, k) == h) {
			*out++ = k;
			want--;
		}
}

static void test_basic(void **state)
{
	struct kvt_idmap map;
	const uint64_t keys[] = {0, 1, 2, 42, UINT64_MAX, 0x8000000000000000ull};
	const size_t nk = sizeof(keys) / sizeof(keys[0]);

	(void)state;
	CHECK_RC(kvt_idmap_init(&map), 0);
	CHECK_EQ(map.cap, 64);
	CHECK_EQ(map.n, 0);
	for (size_t i = 0; i < nk; i++)
		assert_null(kvt_idmap_get(&map, keys[i]));
	for (size_t i = 0; i < nk; i++) {
		CHECK_RC(kvt_idmap_put(&map, keys[i], val_of(keys[i])), 0);
		CHECK_MAP(&map);
	}
	CHECK_EQ(map.n, nk);
	for (size_t i = 0; i < nk; i++) {
		assert_ptr_equal(kvt_idmap_get(&map, keys[i]), val_of(keys[i]));
		CHECK_EQ(slot_of(&map, keys[i]) >= 0, 1);
	}
	assert_null(kvt_idmap_get(&map, 3));
	kvt_idmap_del(&map, 3); /* absent: nothing to do */
	CHECK_EQ(map.n, nk);
	for (size_t i = 0; i < nk; i++) {
		kvt_idmap_del(&map, keys[i]);
		assert_null(kvt_idmap_get(&map, keys[i]));
		CHECK_MAP(&map);
	}
	CHECK_EQ(map.n, 0);
	kvt_idmap_fini(&map);
	assert_null(map.slots);
	kvt_idmap_fini(&map); /* a zeroed map: harmless */
}

/* Consecutive ids (the common case) double the table once it would be more than half full,
   and every entry stays reachable. */
static void test_grow(void **state)
{
	struct kvt_idmap map;

	(void)state;
	CHECK_RC(kvt_idmap_init(&map), 0);
	for (uint64_t k = 1; k <= 32; k++)
		CHECK_RC(kvt_idmap_put(&map, k, val_of(k)), 0);
	CHECK_EQ(map.cap, 64);
	CHECK_RC(kvt_idmap_put(&map, 33, val_of(33)), 0);
	CHECK_EQ(map.cap, 128);
	CHECK_EQ(map.shift, 57);
	CHECK_MAP(&map);
	for (uint64_t k = 34; k <= 5000; k++)
		CHECK_RC(kvt_idmap_put(&map, k, val_of(k)), 0);
	CHECK_EQ(map.cap, 16384);
	CHECK_EQ(map.n, 5000);
	CHECK_MAP(&map);
	for (uint64_t k = 1; k <= 5000; k++)
		assert_ptr_equal(kvt_idmap_get(&map, k), val_of(k));
	assert_null(kvt_idmap_get(&map, 5001));
	kvt_idmap_fini(&map);
}

/* Deleting from a probe run pulls later entries back unless that would move one before its
   home; no tombstone stays behind. */
static void test_backward_shift(void **state)
{
	struct kvt_idmap map;
	uint64_t a[3], b[1];
	uint32_t h = 10;

	(void)state;
	CHECK_RC(kvt_idmap_init(&map), 0);
	keys_at(&map, h, 1, a, 3);
	keys_at(&map, h + 1, 1, b, 1);
	/* a0 a1 a2 at h .. h+2 (home h), b0 at h+3 (home h+1) */
	for (int i = 0; i < 3; i++)
		CHECK_RC(kvt_idmap_put(&map, a[i], val_of(a[i])), 0);
	CHECK_RC(kvt_idmap_put(&map, b[0], val_of(b[0])), 0);
	CHECK_EQ(slot_of(&map, a[0]), h);
	CHECK_EQ(slot_of(&map, a[2]), h + 2);
	CHECK_EQ(slot_of(&map, b[0]), h + 3);
	kvt_idmap_del(&map, a[0]);
	CHECK_EQ(slot_of(&map, a[1]), h);
	CHECK_EQ(slot_of(&map, a[2]), h + 1);
	CHECK_EQ(slot_of(&map, b[0]), h + 2);
	assert_null(map.slots[h + 3].val);
	CHECK_MAP(&map);
	/* Deleting a1 (at h) moves a2 to h and b0 (home h + 1) to h + 1, its home. */
	kvt_idmap_del(&map, a[1]);
	CHECK_EQ(slot_of(&map, a[2]), h);
	CHECK_EQ(slot_of(&map, b[0]), h + 1);
	/* An entry at its home stays there when the slot before it empties. */
	kvt_idmap_del(&map, a[2]);
	CHECK_EQ(slot_of(&map, b[0]), h + 1);
	assert_null(map.slots[h].val);
	CHECK_MAP(&map);
	kvt_idmap_fini(&map);

	/* The run wraps around the end of the table. */
	CHECK_RC(kvt_idmap_init(&map), 0);
	keys_at(&map, 63, 1, a, 3);
	for (int i = 0; i < 3; i++)
		CHECK_RC(kvt_idmap_put(&map, a[i], val_of(a[i])), 0);
	CHECK_EQ(slot_of(&map, a[1]), 0);
	CHECK_EQ(slot_of(&map, a[2]), 1);
	kvt_idmap_del(&map, a[0]);
	CHECK_EQ(slot_of(&map, a[1]), 63);
	CHECK_EQ(slot_of(&map, a[2]), 0);
	assert_null(map.slots[1].val);
	CHECK_MAP(&map);
	kvt_idmap_fini(&map);
}

/* Iteration visits every value once, in slot order. */
static void test_iteration(void **state)
{
	struct kvt_idmap map;
	uint32_t pos = 0, seen = 0, last = 0;
	void *v;

	(void)state;
	CHECK_RC(kvt_idmap_init(&map), 0);
	assert_null(kvt_idmap_next(&map, &pos));
	for (uint64_t k = 100; k < 140; k++)
		CHECK_RC(kvt_idmap_put(&map, k, val_of(k)), 0);
	kvt_idmap_del(&map, 120);
	pos = 0;
	while ((v = kvt_idmap_next(&map, &pos))) {
		uint64_t k = ((uintptr_t)v - 1) / 2;

		CHECK_EQ(slot_of(&map, k), pos - 1);
		CHECK_EQ(seen == 0 || pos - 1 > last, 1);
		last = pos - 1;
		seen++;
	}
	CHECK_EQ(seen, 39);
	assert_null(kvt_idmap_next(&map, &pos));
	kvt_idmap_fini(&map);
}

/* A put that must grow the table and cannot allocate fails with -ENOMEM and leaves the map
   exactly as it was; an init that cannot allocate leaves a zeroed map. */
static void test_put_alloc_fault(void **state)
{
	struct kvt_idmap map, before;
	struct kvt_idmap_slot snap[64];

	(void)state;
	CHECK_RC(kvt_fault_arm(1u << KVT_FAULT_ALLOC, 1), 0);
	CHECK_RC(kvt_idmap_init(&map), -ENOMEM);
	assert_true(kvt_fault_fired());
	kvt_fault_disarm();
	assert_null(map.slots);
	CHECK_EQ(map.cap, 0);
	kvt_idmap_fini(&map);

	CHECK_RC(kvt_idmap_init(&map), 0);
	for (uint64_t k = 1; k <= 32; k++)
		CHECK_RC(kvt_idmap_put(&map, k, val_of(k)), 0);
	before = map;
	memcpy(snap, map.slots, sizeof(snap));
	CHECK_RC(kvt_fault_arm(1u << KVT_FAULT_ALLOC, 1), 0);
	CHECK_RC(kvt_idmap_put(&map, 33, val_of(33)), -ENOMEM);
	assert_true(kvt_fault_fired());
	kvt_fault_disarm();
	assert_memory_equal(&map, &before, sizeof(map));
	assert_memory_equal(map.slots, snap, sizeof(snap));
	assert_null(kvt_idmap_get(&map, 33));
	/* A put that needs no growth allocates nothing: an armed fault does not touch it. */
	kvt_idmap_del(&map, 32);
	CHECK_RC(kvt_fault_arm(1u << KVT_FAULT_ALLOC, 1), 0);
	CHECK_RC(kvt_idmap_put(&map, 33, val_of(33)), 0);
	assert_false(kvt_fault_fired());
	kvt_fault_disarm();
	CHECK_RC(kvt_idmap_put(&map, 32, val_of(32)), 0);
	CHECK_EQ(map.cap, 128);
	CHECK_MAP(&map);
	kvt_idmap_fini(&map);
}

/* Random puts and deletes over a small key space against a shadow table. */
static void test_random_run(void **state)
{
	enum { KEYS = 512, OPS = 20000 };
	static bool in[KEYS];
	struct kvt_idmap map;
	uint64_t x = 0x243f6a8885a308d3ull;

	(void)state;
	memset(in, 0, sizeof(in));
	CHECK_RC(kvt_idmap_init(&map), 0);
	for (int op = 0; op < OPS; op++) {
		uint32_t k;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		k = (uint32_t)(x % KEYS);
		/* keys spread over 64 bits */
		uint64_t key = (uint64_t)k << 40 | k;

		if (in[k]) {
			kvt_idmap_del(&map, key);
			in[k] = false;
		} else {
			CHECK_RC(kvt_idmap_put(&map, key, val_of(key)), 0);
			in[k] = true;
		}
		if (op % 1000 == 0)
			CHECK_MAP(&map);
	}
	CHECK_MAP(&map);
	for (uint32_t k = 0; k < KEYS; k++) {
		uint64_t key = (uint64_t)k << 40 | k;

		assert_ptr_equal(kvt_idmap_get(&map, key), in[k] ? val_of(key) : NULL);
	}
	kvt_idmap_fini(&map);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_basic),		cmocka_unit_test(test_grow),
		cmocka_unit_test(test_backward_shift),	cmocka_unit_test(test_iteration),
		cmocka_unit_test(test_put_alloc_fault), cmocka_unit_test(test_random_run),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
