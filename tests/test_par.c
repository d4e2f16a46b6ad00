/* SPDX-License-Identifier: MIT */
/*
 * manager/par: the fork-join team that shares a recall call's items.
 *
 * Checked against par.h's contract: every item of a job runs exactly once, on a slot below the
 * team's size that no two threads use at once; the call returns only when every item has run
 * (what an item wrote is then visible to the caller); a job waits for no worker that has not
 * joined it (a team whose workers cannot run, all of them on the caller's one CPU behind a
 * caller that never yields, still finishes every job); a NULL team runs the items in order on
 * the caller; a team is destroyed while its workers look for work or sleep.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "check.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "par.h"
#include "t_data.h"

#define MAX_ITEMS 1024u

struct job {
	uint32_t threads, n_items;
	atomic_uint runs[MAX_ITEMS];	  /* times each item ran */
	uint32_t slot_of[MAX_ITEMS];	  /* the slot it ran on */
	uint64_t out[MAX_ITEMS];	  /* what it wrote (read by the caller after the run) */
	atomic_uint busy[64];		  /* a slot in use now */
	atomic_uint overlap, bad_slot;	  /* slots used twice at once, or out of range */
	uint32_t spin;			  /* work per item */
	atomic_uint on_caller, on_others; /* items run on slot 0, and on others */
};

static void item_fn(void *ctx, uint32_t slot, uint32_t item)
{
	struct job *j = ctx;
	uint64_t x = item;

	if (slot >= j->threads || slot >= 64) {
		atomic_fetch_add(&j->bad_slot, 1);
		return;
	}
	if (atomic_exchange(&j->busy[slot], 1))
		atomic_fetch_add(&j->overlap, 1);
	for (uint32_t k = 0; k < j->spin; k++) /* some work, so that items overlap */
		x = t_mix(x);
	j->out[item] = x;
	j->slot_of[item] = slot;
	atomic_fetch_add(&j->runs[item], 1);
	atomic_fetch_add(slot ? &j->on_others : &j->on_caller, 1);
	atomic_store(&j->busy[slot], 0);
}

static void job_reset(struct job *j, uint32_t threads, uint32_t n_items, uint32_t spin)
{
	memset(j, 0, sizeof(*j));
	j->threads = threads;
	j->n_items = n_items;
	j->spin = spin;
}

/* Every item ran once, on a slot of its own at the time, and wrote what it should. */
static void job_check(struct job *j)
{
	CHECK_EQ(atomic_load(&j->bad_slot), 0);
	CHECK_EQ(atomic_load(&j->overlap), 0);
	for (uint32_t i = 0; i < j->n_items; i++) {
		uint64_t x = i;

		CHECK_EQ(atomic_load(&j->runs[i]), 1);
		for (uint32_t k = 0; k < j->spin; k++)
			x = t_mix(x);
		CHECK_EQ(j->out[i], x);
	}
	CHECK_EQ(atomic_load(&j->on_caller) + atomic_load(&j->on_others), j->n_items);
}

/* Many jobs of random sizes (none, one item, up to MAX_ITEMS) and work, on teams of 2 to 8,
   back to back and with pauses that let the workers fall asleep between jobs. */
static void test_par_items_once(void **state)
{
	struct job *j = t_xmalloc(sizeof(*j));
	uint64_t seed = t_pick_seed(), others = 0;
	long jobs = t_pick_ops(2000);
	(void)state;

	print_message("# par: seed %llu\n", (unsigned long long)seed);
	t_rng_seed(seed);
	for (uint32_t threads = 2; threads <= 8; threads *= 2) {
		struct kvt_par *p;

		CHECK_RC(kvt_par_create(threads, &p), 0);
		for (long k = 0; k < jobs; k++) {
			uint32_t n = t_rng_below(8) == 0
					     ? t_rng_below(3)
					     : 1 + t_rng_below(t_rng_below(4) ? 64 : MAX_ITEMS);

			job_reset(j, threads, n, t_rng_below(4) ? 50 : 1000);
			kvt_par_run(p, item_fn, j, n);
			job_check(j);
			others += atomic_load(&j->on_others);
			if (t_rng_below(50) == 0) /* past the workers' polling: they sleep */
				usleep(1000);
		}
		kvt_par_destroy(p);
	}
	print_message("# par: %llu items ran on workers\n", (unsigned long long)others);
	/* the workers took part (else the team would be the caller alone) */
	assert_true(others > 0);
	free(j);
}

/* A NULL team: the items in order, on slot 0. */
static uint32_t order[16], n_order;

static void order_fn(void *ctx, uint32_t slot, uint32_t item)
{
	(void)ctx;
	CHECK_EQ(slot, 0);
	order[n_order++] = item;
}

static void test_par_null_team(void **state)
{
	(void)state;
	n_order = 0;
	kvt_par_run(NULL, order_fn, NULL, 16);
	CHECK_EQ(n_order, 16);
	for (uint32_t i = 0; i < 16; i++)
		CHECK_EQ(order[i], i);
	kvt_par_run(NULL, order_fn, NULL, 0);
	CHECK_EQ(n_order, 16);
}

/* The caller and the team's workers on one CPU, the caller never yielding during a job: a job
   must not wait for a worker the CPU never ran (each finishes with its items on whoever
   claimed them), and the workers that do get the CPU between jobs find none to join, or a
   part of the next. */
static void test_par_workers_starved(void **state)
{
	struct job *j = t_xmalloc(sizeof(*j));
	cpu_set_t one, all;
	struct kvt_par *p;
	uint64_t others = 0;
	(void)state;

	if (sched_getaffinity(0, sizeof(all), &all)) {
		free(j);
		skip();
	}
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &all)) {
			CPU_SET(c, &one);
			break;
		}
	CHECK_RC(sched_setaffinity(0, sizeof(one), &one), 0);
	CHECK_RC(kvt_par_create(4, &p), 0); /* its threads inherit the one CPU */
	for (int k = 0; k < 500; k++) {
		job_reset(j, 4, 64, 200);
		kvt_par_run(p, item_fn, j, 64);
		job_check(j);
		others += atomic_load(&j->on_others);
	}
	print_message("# par on one CPU: %llu of %u items ran on workers\n",
		      (unsigned long long)others, 500 * 64);
	kvt_par_destroy(p);
	CHECK_RC(sched_setaffinity(0, sizeof(all), &all), 0);
	free(j);
}

/* Creation's bounds; destroy(NULL); a team destroyed at once, and while its workers look for
   work right after a job. */
static void test_par_create_destroy(void **state)
{
	struct job *j = t_xmalloc(sizeof(*j));
	struct kvt_par *p = (struct kvt_par *)1;
	(void)state;

	CHECK_RC(kvt_par_create(1, &p), -EINVAL);
	assert_null(p);
	CHECK_RC(kvt_par_create(KVT_PAR_MAX_THREADS + 1, &p), -EINVAL);
	assert_null(p);
	kvt_par_destroy(NULL);
	CHECK_RC(kvt_par_create(KVT_PAR_MAX_THREADS, &p), 0);
	kvt_par_destroy(p);
	CHECK_RC(kvt_par_create(3, &p), 0);
	job_reset(j, 3, 100, 100);
	kvt_par_run(p, item_fn, j, 100);
	job_check(j);
	kvt_par_destroy(p);
	free(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_par_items_once),
		cmocka_unit_test(test_par_null_team),
		cmocka_unit_test(test_par_workers_starved),
		cmocka_unit_test(test_par_create_destroy),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
