/* SPDX-License-Identifier: MIT */
/*
 * What the files of the scheduler suite share (test_sched.c: geometry and the test engine that
 * executes batches for real, main; test_sched_*.c: the tests by topic).
 */

#ifndef TEST_SCHED_H
#define TEST_SCHED_H

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

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "policy.h"
#include "util.h"

struct treq {
	uint32_t L, max_new;
	uint32_t layers;    /* layers prefilled by the engine */
	uint32_t tokens;    /* tokens of every layer once all are prefilled */
	uint32_t generated; /* first token from the prefill, one per decode */
	uint64_t arrival;   /* submit order */
	bool live;	    /* the sequence exists in the manager */
	bool queued;	    /* submitted and neither completed nor finished */
	bool was_preempted;
};

struct eng {
	struct kvt_config c;
	struct kvt_manager *m;
	struct kvt_sched *s;
	uint32_t rmax;
	struct treq *r; /* indexed by sequence id */
	uint32_t n_ids;
	uint64_t n_submitted;
	uint8_t *k, *v, *q, *row_k, *row_v, *want_k, *want_v;
	size_t kv_cap;
	uint64_t *dseq;
	uint32_t *dpos, *blocks;
	uint64_t *frames; /* scratch of check_frames */
	size_t frames_cap;
	uint32_t recall_r; /* blocks per kv head recalled after a decode step (0 = none) */
	uint64_t rng;
	uint64_t *expect_done; /* completions the next step must report, in commit order */
	uint32_t n_expect_done;
	/* totals over the run */
	uint64_t iters, items, preempted, resumed, reset, completed, recalls;
};

#define CHECK_READBACK(e, id) check_readback((e), (id), __FILE__, __LINE__)

#define CHECK_FRAMES(e) check_frames((e), __FILE__, __LINE__)

/* The scheduler's latest failure detail (kvt_sched_last_error) holds text. */
#define CHECK_SERR(s, text)                                                     \
	do {                                                                    \
		const char *e_ = kvt_sched_last_error(s);                       \
		if (!strstr(e_, (text)))                                        \
			fail_at(__FILE__, __LINE__,                             \
				"kvt_sched_last_error: \"%s\", expected it to " \
				"hold \"%s\"",                                  \
				e_, (text));                                    \
	} while (0)

#define CHECK_BATCH(e, b) check_batch((e), (b), __FILE__, __LINE__)

#define CHECK_ITEMS(b, want)                                                                  \
	do {                                                                                  \
		char buf_[512];                                                               \
		const char *got_ = items_str((b), buf_, sizeof(buf_));                        \
		if (strcmp(got_, (want)))                                                     \
			fail_at(__FILE__, __LINE__, "batch is \"%s\", expected \"%s\"", got_, \
				(want));                                                      \
	} while (0)

/* test_sched.c */
uint64_t fpl(const struct kvt_config *c, uint32_t L);
uint64_t full_kv(const struct kvt_config *c, uint32_t L);
struct kvt_config cfg_frames(uint32_t frames, uint32_t recall);
struct kvt_sched_config sched_cfg(uint32_t rmax, uint32_t tmax, uint64_t inject, uint32_t ws);
uint64_t rnd(struct eng *e);
uint32_t rnd_in(struct eng *e, uint32_t lo, uint32_t hi);
void eng_init(struct eng *e, const struct kvt_config *c, const struct kvt_sched_config *sc,
	      uint32_t n_ids, uint32_t max_L);
void eng_fini(struct eng *e);
int eng_add(struct eng *e, uint64_t id, uint32_t L, uint32_t max_new);
struct kvt_seq_info info_of(struct eng *e, uint64_t id);
void check_readback(struct eng *e, uint64_t id, const char *file, int line);
void eng_exec(struct eng *e, const struct kvt_sched_batch *b);
void eng_reap(struct eng *e, const struct kvt_sched_batch *b);
void check_frames(struct eng *e, const char *file, int line);
void check_batch(struct eng *e, const struct kvt_sched_batch *b, const char *file, int line);
struct kvt_sched_iter eng_iter(struct eng *e, struct kvt_sched_batch *out);
void eng_drain(struct eng *e, uint32_t max_iters);
const char *items_str(const struct kvt_sched_batch *b, char *buf, size_t cap);

/* test_sched_unit.c */
void test_create_errors(void **state);
void test_submit_errors(void **state);
void test_disk_history_beyond_host(void **state);
void test_budget_two_of_three(void **state);
void test_rmax_tmax(void **state);
void test_injection(void **state);
size_t snapshot(struct eng *e, uint64_t id, uint8_t *out, size_t cap);
void recall_123(struct eng *e, const uint64_t *ids, uint32_t n);
void test_ws_control_recall(void **state);
void setup_four(struct eng *e, const uint64_t *recall_ids, uint32_t n_recall);
void engine_seq_len(struct eng *e, uint64_t id, uint32_t L);
void engine_seq(struct eng *e, uint64_t id);
void engine_seq_gone(struct eng *e, uint64_t id);

/* test_sched_preempt.c */
void test_preempt_latest(void **state);
void test_preempt_two(void **state);
void test_preempt_resumed(void **state);
void test_frames_held_outside(void **state);

/* test_sched_random.c */
void test_random_ws(void **state);
void test_random_resident(void **state);

#endif /* TEST_SCHED_H */
