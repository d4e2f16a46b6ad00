/* SPDX-License-Identifier: MIT */
/*
 * manager/huge: table memory on transparent huge pages.
 *
 * Checked against huge.h's contract: realloc keeps contents and refuses n == 0 and a failed
 * allocation without touching the old block; calloc zeroes and refuses an overflowing size;
 * kvt_reserve_with(kvt_huge_realloc) doubles from 64 and leaves everything as it was on
 * failure; every call is a KVT_FAULT_ALLOC site. Where the arena is in use (unsanitized
 * builds), its blocks come from an arena of their own, not one of jemalloc's usual ones, and a
 * large table lies in a mapping the kernel may back with huge pages (THPeligible in
 * /proc/self/smaps) unless the system turned THP off.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jemalloc/jemalloc.h>

#include "base.h"
#include "fault.h"
#include "huge.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static void test_realloc_keeps(void **state)
{
	uint32_t *p, *q;

	(void)state;
	p = kvt_huge_realloc(NULL, 100 * sizeof(*p));
	assert_non_null(p);
	for (uint32_t i = 0; i < 100; i++)
		p[i] = i * 7 + 1;
	q = kvt_huge_realloc(p, 100000 * sizeof(*q)); /* past a small size class */
	assert_non_null(q);
	for (uint32_t i = 0; i < 100; i++)
		assert_int_equal(q[i], i * 7 + 1);
	q[99999] = 5;
	/* n == 0 is refused, the block stays */
	assert_null(kvt_huge_realloc(q, 0));
	assert_int_equal(q[99], 99 * 7 + 1);
	kvt_huge_free(q);
	kvt_huge_free(NULL);
}

static void test_calloc_zeroes(void **state)
{
	uint8_t *p;

	(void)state;
	/* a block handed back dirty comes back zeroed */
	p = kvt_huge_realloc(NULL, 4096);
	assert_non_null(p);
	memset(p, 0xab, 4096);
	kvt_huge_free(p);
	p = kvt_huge_calloc(512, 8);
	assert_non_null(p);
	for (size_t i = 0; i < 4096; i++)
		assert_int_equal(p[i], 0);
	kvt_huge_free(p);
	assert_null(kvt_huge_calloc(SIZE_MAX / 4, 8)); /* overflow */
	assert_null(kvt_huge_calloc(0, 8));
}

static void test_reserve(void **state)
{
	uint64_t *a = NULL;
	uint32_t cap = 0;

	(void)state;
	assert_int_equal(kvt_reserve_with(kvt_huge_realloc, (void **)&a, &cap, 1, sizeof(*a)), 0);
	assert_int_equal(cap, 64);
	a[63] = 11;
	assert_int_equal(kvt_reserve_with(kvt_huge_realloc, (void **)&a, &cap, 64, sizeof(*a)), 0);
	assert_int_equal(cap, 64); /* it fits: nothing done */
	assert_int_equal(kvt_reserve_with(kvt_huge_realloc, (void **)&a, &cap, 300, sizeof(*a)), 0);
	assert_int_equal(cap, 512);
	assert_int_equal(a[63], 11);
	kvt_huge_free(a);
}

/* Every entry point is one KVT_FAULT_ALLOC site; a failure changes nothing. */
static void test_faults(void **state)
{
	uint32_t *p = kvt_huge_realloc(NULL, 64 * sizeof(*p)), cap = 64;

	(void)state;
	assert_non_null(p);
	p[5] = 9;
	assert_int_equal(kvt_fault_arm(1u << KVT_FAULT_ALLOC, 1), 0);
	assert_null(kvt_huge_realloc(p, 1000 * sizeof(*p)));
	assert_true(kvt_fault_fired());
	assert_int_equal(kvt_fault_disarm(), 1);
	assert_int_equal(p[5], 9);

	assert_int_equal(kvt_fault_arm(1u << KVT_FAULT_ALLOC, 1), 0);
	assert_int_equal(kvt_reserve_with(kvt_huge_realloc, (void **)&p, &cap, 65, sizeof(*p)),
			 -ENOMEM);
	assert_int_equal(kvt_fault_disarm(), 1);
	assert_int_equal(cap, 64);
	assert_int_equal(p[5], 9);

	assert_int_equal(kvt_fault_arm(1u << KVT_FAULT_ALLOC, 1), 0);
	assert_null(kvt_huge_calloc(4, 4));
	assert_int_equal(kvt_fault_disarm(), 1);
	kvt_huge_free(p);
}

/* The value of the "THPeligible" field of the smaps entry whose range holds p (-1: none). */
static int thp_eligible(const void *p)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	char line[512];
	bool in = false;
	int v = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < line + 17) {
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			continue;
		}
		if (in && sscanf(line, "THPeligible: %d", &v) == 1)
			break;
	}
	fclose(f);
	return v;
}

/* The system's THP mode: 'a' (always), 'm' (madvise), 'n' (never, or not known). */
static char thp_mode(void)
{
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	char s[128] = "", m = 'n';

	if (!f)
		return 'n';
	if (fgets(s, sizeof(s), f))
		m = strstr(s, "[always]") ? 'a' : strstr(s, "[madvise]") ? 'm' : 'n';
	fclose(f);
	return m;
}

static void test_arena(void **state)
{
	size_t big = (size_t)16 << 20, sz = sizeof(unsigned);
	unsigned a_tab, a_usual;
	uint8_t *t, *h;

	(void)state;
	const char *off = getenv("KVTIER_HUGE_TABLES");

	assert_int_equal(kvt_huge_active(), !SANITIZED && !(off && strcmp(off, "0") == 0));
	if (!kvt_huge_active())
		return; /* the C library's allocator: nothing more to see */
	t = kvt_huge_realloc(NULL, big);
	h = mallocx(big, MALLOCX_TCACHE_NONE); /* jemalloc's own arenas (malloc may not be it) */
	assert_non_null(t);
	assert_non_null(h);
	memset(t, 1, big);
	memset(h, 1, big);
	assert_int_equal(mallctl("arenas.lookup", &a_tab, &sz, &t, sizeof(t)), 0);
	assert_int_equal(mallctl("arenas.lookup", &a_usual, &sz, &h, sizeof(h)), 0);
	assert_int_not_equal(a_tab, a_usual);
	if (thp_mode() != 'n')
		assert_int_equal(thp_eligible(t + big / 2), 1);
	/* Under "madvise" only the marking makes it so: a block of jemalloc's usual arenas is not
	   (unless it was told to mark everything). */
	if (thp_mode() == 'm' && !getenv("MALLOC_CONF"))
		assert_int_equal(thp_eligible(h + big / 2), 0);
	kvt_huge_free(t);
	dallocx(h, MALLOCX_TCACHE_NONE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_realloc_keeps), cmocka_unit_test(test_calloc_zeroes),
		cmocka_unit_test(test_reserve),	      cmocka_unit_test(test_faults),
		cmocka_unit_test(test_arena),
	};

	return cmocka_run_group_tests_name("huge", tests, NULL, NULL);
}
