/* SPDX-License-Identifier: MIT */
/*
 * sched: argument errors, budgets (request, token, injection) and the working-set control of
 * recall.
 */
#include <unistd.h>

#include "test_sched.h"

/* ---- unit tests --------------------------------------------------------------------------- */

void test_create_errors(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_sched_config sc = sched_cfg(4, 64, 1024, 1), bad;
	struct kvt_manager *m = NULL;
	struct kvt_sched *s = NULL;
	struct kvt_sched_batch b;

	(void)state;
	CHECK_RC(t_manager_create(&c, &m), 0);
	CHECK_RC(kvt_sched_create(NULL, &sc, &s), -EINVAL);
	CHECK_RC(kvt_sched_create(m, NULL, &s), -EINVAL);
	CHECK_RC(kvt_sched_create(m, &sc, NULL), -EINVAL);
	bad = sc;
	bad.size = 4;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	bad = sc;
	bad.version = 99;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	bad = sc;
	bad.max_requests = 0;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	bad = sc;
	bad.max_tokens = 0;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	bad = sc;
	bad.max_inject_tokens = 0;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	bad = sc;
	bad.ws_control = 2;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	/* only the sizes the struct has had (before and after `stream`), reserved 0 */
	bad = sc;
	bad.size = sizeof(sc) - 4;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	bad.size = sizeof(sc) + 8;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	bad = sc;
	bad.reserved = 1;
	CHECK_RC(kvt_sched_create(m, &bad, &s), -EINVAL);
	assert_null(s);
	bad = sc;
	bad.size = (uint32_t)offsetof(struct kvt_sched_config, stream);
	bad.stream = (void *)&bad; /* past the caller's size: not read */
	CHECK_RC(kvt_sched_create(m, &bad, &s), 0);
	kvt_sched_destroy(s);
	s = NULL;
	kvt_sched_destroy(NULL);
	CHECK_EQ(kvt_sched_pending(NULL), 0);
	CHECK_RC(kvt_sched_step(NULL, &b), -EINVAL);
	CHECK_RC(kvt_sched_commit(NULL), -EINVAL);
	CHECK_RC(kvt_sched_submit(NULL, 1, 1), -EINVAL);
	CHECK_RC(kvt_sched_finish(NULL, 1), -EINVAL);

	CHECK_RC(kvt_sched_create(m, &sc, &s), 0);
	/* each refusal says what was refused and why (kvt_sched_last_error) */
	assert_string_equal(kvt_sched_last_error(s), "");
	assert_string_equal(kvt_sched_last_error(NULL), "no scheduler");
	CHECK_RC(kvt_sched_step(s, NULL), -EINVAL);
	CHECK_SERR(s, "step: NULL batch (");
	/* an empty iteration is an iteration */
	CHECK_RC(kvt_sched_commit(s), -EINVAL);
	CHECK_SERR(s, "commit: no batch to commit");
	CHECK_RC(kvt_sched_step(s, &b), 0);
	CHECK_EQ(b.n_items, 0);
	CHECK_EQ(b.it.iteration, 0);
	CHECK_SERR(s, "commit: no batch to commit"); /* (a call that works leaves it) */
	CHECK_RC(kvt_sched_step(s, &b), -EBUSY);
	CHECK_SERR(s, "step: the previous batch is not committed");
	CHECK_RC(kvt_sched_commit(s), 0);
	CHECK_RC(kvt_sched_commit(s), -EINVAL);
	CHECK_SERR(s, "commit: no batch to commit");
	CHECK_RC(kvt_sched_step(s, &b), 0);
	CHECK_EQ(b.it.iteration, 1);
	CHECK_RC(kvt_sched_commit(s), 0);
	kvt_sched_destroy(s);
	kvt_manager_destroy(m);
}

void test_submit_errors(void **state)
{
	uint64_t serial;
	/* 30 frames: L=40 needs 2 x 10 resident + 10 of full KV under ws_control = 30 */
	struct kvt_config c = cfg_frames(30, 0);
	struct kvt_sched_config sc = sched_cfg(4, 1024, 4096, 1);
	struct kvt_sched_iter li;
	struct kvt_sched_batch b;
	struct eng e;

	(void)state;
	assert_int_equal(fpl(&c, 40), 10);
	assert_int_equal(full_kv(&c, 40), 10);
	eng_init(&e, &c, &sc, 16, 128);
	CHECK_EQ(t_stats_of(e.m).device_frames_total, 30);
	CHECK_RC(kvt_sched_submit(e.s, 9, 1), -ENOENT);
	/* the manager's refusal, with what the scheduler was doing */
	{
		char want[300];

		snprintf(want, sizeof(want), "submit: %s", kvt_manager_last_error(e.m));
		assert_string_equal(kvt_sched_last_error(e.s), want);
		assert_non_null(strstr(want, "9"));
	}
	CHECK_RC(kvt_seq_create(e.m, 1, 40), 0);
	CHECK_RC(kvt_sched_submit(e.s, 1, 0), -EINVAL);
	CHECK_SERR(e.s, "submit: sequence 1: max_new_tokens is 0 (at least 1) (");
	CHECK_EQ(kvt_sched_pending(e.s), 0);
	CHECK_RC(kvt_seq_destroy(e.m, 1), 0);
	CHECK_RC(eng_add(&e, 1, 40, 3), 0);
	CHECK_RC(kvt_sched_submit(e.s, 1, 3), -EEXIST);
	CHECK_SERR(e.s, "submit: sequence 1: already queued (");
	CHECK_EQ(kvt_sched_pending(e.s), 1);
	/* 20 resident + 26 of full KV > 30 */
	CHECK_RC(eng_add(&e, 2, 100, 3), -E2BIG);
	CHECK_SERR(e.s, "submit: sequence 2 needs 46 device frames alone, the device tier has 30");
	/* a sequence the engine prefilled already */
	CHECK_RC(kvt_seq_create(e.m, 3, 40), 0);
	t_fill_prefill(&c, 3, 0, 40, e.k, e.v, e.q);
	CHECK_RC(t_prefill_layer(e.m, 3, 0, e.k, e.v, e.q, NULL), 0);
	CHECK_RC(kvt_sched_submit(e.s, 3, 3), -EINVAL);
	CHECK_SERR(e.s, "submit: sequence 3: prefilled already (1 layer");
	CHECK_RC(kvt_seq_destroy(e.m, 3), 0);
	CHECK_EQ(kvt_sched_pending(e.s), 1);
	CHECK_RC(kvt_sched_last(e.s, &li), -ENOENT);
	CHECK_RC(kvt_sched_last(NULL, &li), -EINVAL);

	/* finish: unknown, queued, running (its frames are freed, the sequence stays) */
	CHECK_RC(kvt_sched_finish(e.s, 2), -ENOENT);
	CHECK_SERR(e.s, "finish: sequence 2: not scheduled here (");
	CHECK_RC(eng_add(&e, 4, 16, 5), 0);
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:0-2");
	CHECK_RC(kvt_sched_last(e.s, &li), 0);
	CHECK_EQ(li.ws_touched_frames, 20);
	CHECK_RC(kvt_sched_finish(e.s, 4), 0);
	CHECK_EQ(kvt_sched_pending(e.s), 1);
	e.r[4].queued = false;
	CHECK_RC(kvt_sched_finish(e.s, 1), 0);
	CHECK_EQ(info_of(&e, 1).preempted, 1);
	CHECK_EQ(t_stats_of(e.m).device_frames_used, 0);
	e.r[1].queued = false;
	CHECK_READBACK(&e, 1);
	CHECK_RC(kvt_sched_finish(e.s, 1), -ENOENT);
	CHECK_EQ(kvt_sched_pending(e.s), 0);

	/* finishing a request named by the open batch: it counts as not executed */
	CHECK_RC(kvt_seq_destroy(e.m, 4), 0);
	e.r[4].live = false;
	CHECK_RC(eng_add(&e, 5, 16, 2), 0);
	CHECK_RC(kvt_sched_step(e.s, &b), 0);
	CHECK_ITEMS(&b, "5:0-2");
	CHECK_RC(kvt_sched_finish(e.s, 5), 0);
	e.r[5].queued = false;
	CHECK_RC(kvt_sched_commit(e.s), 0);
	CHECK_EQ(kvt_sched_pending(e.s), 0);
	CHECK_EQ(info_of(&e, 5).layers_prefilled, 0);
	CHECK_RC(kvt_sched_submit(e.s, 5, 2), 0); /* not prefilled: may come back */
	CHECK_RC(kvt_sched_finish(e.s, 5), 0);

	/* a sequence destroyed behind the scheduler's back is dropped, not an error */
	CHECK_RC(eng_add(&e, 6, 16, 4), 0);
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "6:0-2");
	CHECK_RC(kvt_seq_destroy(e.m, 6), 0);
	e.r[6].live = e.r[6].queued = false;
	CHECK_RC(eng_add(&e, 7, 16, 1), 0);
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "7:0-2");
	CHECK_EQ(kvt_sched_pending(e.s), 0); /* 7 completed with its prefill */
	CHECK_RC(kvt_sched_step(e.s, &b), 0);
	eng_reap(&e, &b);
	CHECK_EQ(b.n_items, 0);
	CHECK_RC(kvt_sched_commit(e.s), 0);

	/* destroyed and created again under its id: another sequence (kvt_seq_info.serial), not
	   the request's. Submitting the id while it is gone is -ENOENT and forgets the request;
	   submitting it once created again queues the new one, which starts with its prefill
	   (before, -EEXIST: the old request stayed, and its next step planned a decode for a
	   sequence never prefilled) */
	CHECK_RC(eng_add(&e, 8, 16, 4), 0);
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "8:0-2");
	serial = info_of(&e, 8).serial;
	assert_true(serial >= 1);
	CHECK_RC(kvt_seq_destroy(e.m, 8), 0);
	e.r[8].live = e.r[8].queued = false;
	CHECK_RC(kvt_sched_submit(e.s, 8, 2), -ENOENT);
	CHECK_EQ(kvt_sched_pending(e.s), 0);
	CHECK_RC(eng_add(&e, 9, 16, 4), 0);
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "9:0-2");
	assert_true(info_of(&e, 9).serial > serial); /* created after 8 */
	serial = info_of(&e, 9).serial;
	CHECK_RC(kvt_seq_destroy(e.m, 9), 0);
	e.r[9].live = e.r[9].queued = false;
	CHECK_RC(eng_add(&e, 9, 24, 2), 0);
	assert_true(info_of(&e, 9).serial > serial);
	CHECK_EQ(kvt_sched_pending(e.s), 1);
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "9:0-2");
	/* between a step and its commit: the request whose sequence was replaced is dropped at
	   the commit, and the new sequence is no request until submitted */
	CHECK_RC(kvt_sched_step(e.s, &b), 0);
	CHECK_ITEMS(&b, "9:d");
	CHECK_RC(kvt_seq_destroy(e.m, 9), 0);
	CHECK_RC(kvt_seq_create(e.m, 9, 16), 0);
	e.r[9] = (struct treq){.L = 16, .max_new = 2, .live = true};
	CHECK_RC(kvt_sched_commit(e.s), 0);
	CHECK_EQ(kvt_sched_pending(e.s), 0);
	CHECK_RC(kvt_sched_submit(e.s, 9, 2), 0);
	e.r[9].queued = true;
	e.r[9].arrival = e.n_submitted++;
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "9:0-2");
	eng_fini(&e);

	/* without ws_control the full-KV reservation is not counted: 20 frames fit in 30 */
	sc.ws_control = 0;
	eng_init(&e, &c, &sc, 16, 400);
	CHECK_RC(eng_add(&e, 2, 100, 3), 0);
	CHECK_RC(eng_add(&e, 3, 400, 3), 0);
	eng_drain(&e, 10);
	eng_fini(&e);
}

void test_budget_two_of_three(void **state)
{
	/* L=40: 10 frames per layer, 10 of full KV. Working sets: prefill of both layers 30,
	   decode 20. 60 frames hold two prefills (ws_control) or three (resident only). */
	struct kvt_config c = cfg_frames(60, 0);
	struct kvt_sched_config sc = sched_cfg(8, 1024, 4096, 1);
	struct kvt_sched_batch b;
	struct kvt_sched_iter it, li;
	struct eng e;

	(void)state;
	eng_init(&e, &c, &sc, 8, 64);
	for (uint64_t id = 1; id <= 3; id++)
		CHECK_RC(eng_add(&e, id, 40, 2), 0);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:0-2 2:0-2");
	CHECK_EQ(it.admitted, 2);
	CHECK_EQ(it.reset, 1);
	CHECK_EQ(it.queued, 1);
	CHECK_EQ(it.ws_estimate_frames, 60);
	CHECK_EQ(it.prefill_token_layers, 160);
	CHECK_EQ(it.preempted, 0);
	/* decodes 20 + 20, the third's prefill 30: 70 > 60 */
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:d 2:d");
	CHECK_EQ(it.reset, 1);
	CHECK_EQ(it.ws_estimate_frames, 40);
	CHECK_RC(kvt_sched_last(e.s, &li), 0);
	CHECK_EQ(li.iteration, 1);
	CHECK_EQ(li.ws_touched_frames, 40);
	CHECK_EQ(li.blocks_loaded, 0);
	/* both produced their two tokens: completed, frames freed; the third runs alone */
	CHECK_EQ(t_stats_of(e.m).device_frames_used, 0);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "3:0-2");
	CHECK_EQ(it.completed, 2);
	CHECK_EQ(it.reset, 0);
	eng_drain(&e, 4);
	CHECK_EQ(e.completed, 3);
	eng_fini(&e);

	/* resident sets only: all three at once */
	sc.ws_control = 0;
	eng_init(&e, &c, &sc, 8, 64);
	for (uint64_t id = 1; id <= 3; id++)
		CHECK_RC(eng_add(&e, id, 40, 2), 0);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:0-2 2:0-2 3:0-2");
	CHECK_EQ(it.reset, 0);
	CHECK_EQ(it.ws_estimate_frames, 60);
	eng_drain(&e, 4);
	eng_fini(&e);
}

void test_rmax_tmax(void **state)
{
	struct kvt_config c = cfg_frames(512, 0);
	struct kvt_sched_config sc = sched_cfg(2, 1024, 4096, 1);
	struct kvt_sched_batch b;
	struct kvt_sched_iter it;
	struct eng e;

	(void)state;
	/* R_max = 2: the rest is not considered (not reset) */
	eng_init(&e, &c, &sc, 8, 64);
	for (uint64_t id = 1; id <= 4; id++)
		CHECK_RC(eng_add(&e, id, 16, 3), 0);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:0-2 2:0-2");
	CHECK_EQ(it.reset, 0);
	CHECK_EQ(it.queued, 2);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:d 2:d");
	eng_drain(&e, 20);
	eng_fini(&e);

	/* T_max = 20: a prefill of both layers of 16 tokens counts 16, a decode 1 */
	sc = sched_cfg(8, 20, 4096, 1);
	eng_init(&e, &c, &sc, 8, 64);
	for (uint64_t id = 1; id <= 3; id++)
		CHECK_RC(eng_add(&e, id, 16, 3), 0);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:0-2");
	CHECK_EQ(it.reset, 0);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "2:0-2 1:d");
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "3:0-2 1:d 2:d");
	eng_drain(&e, 20);
	eng_fini(&e);

	/* the first item is always allowed: 40 prefill tokens against T_max = 4; a prefill of
	   one layer of 16 tokens counts ceil(16 * 1 / 2) = 8 */
	sc = sched_cfg(8, 4, 16, 1);
	eng_init(&e, &c, &sc, 8, 64);
	CHECK_RC(eng_add(&e, 1, 40, 2), 0);
	CHECK_RC(eng_add(&e, 2, 16, 2), 0);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:0-1");
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:1-2");
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:d"); /* 2's layer (8 tokens) would pass T_max */
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "2:0-1"); /* 1 completed; 2 alone */
	eng_drain(&e, 20);
	eng_fini(&e);
}

void test_injection(void **state)
{
	struct kvt_config c = cfg_frames(2048, 0);
	struct kvt_sched_config sc = sched_cfg(16, 4096, 110, 1);
	struct kvt_sched_batch b;
	struct kvt_sched_iter it;
	struct eng e;

	(void)state;
	c.n_layers = 4;
	/* B = 110 token-layers. A (100) gets 1 layer, W (100) and X (90) none, Y (10) the
	   remaining 10: one layer. Once A and Y are prefilled, W gets its layers and X waits
	   while Y, which arrived after X, decodes. */
	eng_init(&e, &c, &sc, 8, 128);
	CHECK_RC(eng_add(&e, 1, 100, 3), 0); /* A */
	CHECK_RC(eng_add(&e, 2, 100, 3), 0); /* W */
	CHECK_RC(eng_add(&e, 3, 90, 3), 0);  /* X */
	CHECK_RC(eng_add(&e, 4, 10, 6), 0);  /* Y */
	for (uint32_t l = 0; l < 4; l++) {
		char want[64];

		snprintf(want, sizeof(want), "1:%u-%u 4:%u-%u", l, l + 1, l, l + 1);
		it = eng_iter(&e, &b);
		CHECK_ITEMS(&b, want);
		CHECK_EQ(it.prefill_token_layers, 110);
		CHECK_EQ(it.reset, 0);
	}
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "2:0-1 1:d 4:d");
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "2:1-2 1:d 4:d");
	eng_drain(&e, 40);
	eng_fini(&e);

	/* A lone prefill larger than the budget gets one layer per iteration, and then nobody
	   else gets any. Budget 64: 2 (L=20) gets 3 layers the moment 1 (L=300) is done. */
	sc.max_inject_tokens = 64;
	eng_init(&e, &c, &sc, 8, 320);
	CHECK_RC(eng_add(&e, 1, 300, 2), 0);
	CHECK_RC(eng_add(&e, 2, 20, 2), 0);
	for (uint32_t l = 0; l < 4; l++) {
		char want[64];

		snprintf(want, sizeof(want), "1:%u-%u", l, l + 1);
		it = eng_iter(&e, &b);
		CHECK_ITEMS(&b, want);
		CHECK_EQ(it.prefill_token_layers, 300);
	}
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "2:0-3 1:d");
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "2:3-4");
	eng_drain(&e, 10);
	eng_fini(&e);
}

/* Reads K and V of every token of every prefilled layer and head of id into out. */
size_t snapshot(struct eng *e, uint64_t id, uint8_t *out, size_t cap)
{
	const struct treq *t = &e->r[id];
	size_t rb = t_rowb(&e->c), n = 0;

	for (uint32_t l = 0; l < t->layers; l++)
		for (uint32_t h = 0; h < e->c.n_kv_heads; h++)
			for (uint32_t p = 0; p < t->tokens; p++) {
				assert_true(n + 2 * rb <= cap);
				CHECK_RC(kvt_seq_read_token(e->m, id, l, h, p, out + n,
							    out + n + rb),
					 0);
				n += 2 * rb;
			}
	return n;
}

/* Recalls blocks 1..3 of every kv head and layer of the n sequences: 12 frames each. */
void recall_123(struct eng *e, const uint64_t *ids, uint32_t n)
{
	for (uint32_t l = 0; l < e->c.n_layers; l++) {
		for (uint32_t j = 0; j < n * e->c.n_kv_heads * 3; j++)
			e->blocks[j] = 1 + j % 3;
		CHECK_RC(kvt_recall_blocks(e->m, l, ids, n, e->blocks, 3, NULL), 0);
	}
}

/* A configuration without top-K: every prompt keeps sink + ring = 6 frames per layer, and
   the blocks between them are never resident, so recalling them always takes frames. */
static struct kvt_config cfg_no_topk(uint32_t frames, uint32_t recall)
{
	struct kvt_config c = cfg_frames(frames, recall);

	c.topk_tokens = 0;
	return c;
}

/* Two decoding requests whose recall working sets (12 frames each) fit the 16-frame recall
   cache alone but not together. */
static void run_recall_ws(uint32_t ws_control, uint32_t *third_step_items)
{
	struct kvt_config c = cfg_no_topk(512, 16);
	struct kvt_sched_config sc = sched_cfg(8, 1024, 4096, ws_control);
	struct kvt_sched_batch b;
	struct kvt_sched_iter it, li;
	uint64_t ids[2] = {1, 2};
	struct eng e;

	eng_init(&e, &c, &sc, 8, 256);
	assert_int_equal(fpl(&c, 200), 6);
	CHECK_EQ(t_stats_of(e.m).recall_frames_total, 16);
	CHECK_RC(eng_add(&e, 1, 200, 6), 0);
	CHECK_RC(eng_add(&e, 2, 200, 6), 0);
	eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:0-2 2:0-2");
	CHECK_RC(kvt_sched_step(e.s, &b), 0);
	CHECK_ITEMS(&b, "1:d 2:d");
	eng_exec(&e, &b);
	recall_123(&e, ids, 2);
	CHECK_RC(kvt_sched_commit(e.s), 0);
	CHECK_EQ(info_of(&e, 1).recall_ws_frames, 12);
	CHECK_EQ(info_of(&e, 2).recall_ws_frames, 12);
	CHECK_RC(kvt_sched_last(e.s, &li), 0);
	CHECK_EQ(li.ws_touched_frames, 2 * (12 + 12));
	CHECK_EQ(li.recall_lookups, 24);
	CHECK_EQ(li.recall_hits + li.blocks_loaded, 24);
	it = eng_iter(&e, &b);
	*third_step_items = b.n_items;
	if (ws_control) {
		CHECK_ITEMS(&b, "1:d");
		CHECK_EQ(it.reset, 1);
		CHECK_EQ(it.ws_estimate_frames, 12 + 12);
	} else {
		CHECK_ITEMS(&b, "1:d 2:d");
		CHECK_EQ(it.reset, 0);
		CHECK_EQ(it.ws_estimate_frames, 2 * 12);
	}
	eng_drain(&e, 30);
	CHECK_EQ(e.completed, 2);
	eng_fini(&e);
}

void test_ws_control_recall(void **state)
{
	uint32_t with = 0, without = 0;

	(void)state;
	run_recall_ws(1, &with);
	run_recall_ws(0, &without);
	CHECK_EQ(with, 1);
	CHECK_EQ(without, 2);
}

/* Geometry of the preemption tests: no top-K, L = 64, so 6 frames per layer, 12 per decode,
   16 of full KV (a prefill of both layers estimates 28); 64 frames of resident sets and a
   recall cache of 16. Requests 1..4 (10 tokens each) start two, one, one at a time, then all
   decode: 48 frames used. The n_recall requests of recall_ids recall 12 blocks each in that
   last step. */
void setup_four(struct eng *e, const uint64_t *recall_ids, uint32_t n_recall)
{
	struct kvt_config c = cfg_no_topk(64, 16);
	struct kvt_sched_config sc = sched_cfg(8, 1024, 4096, 1);
	struct kvt_sched_batch b;

	assert_int_equal(fpl(&c, 64), 6);
	eng_init(e, &c, &sc, 16, 64);
	for (uint64_t id = 1; id <= 4; id++)
		CHECK_RC(eng_add(e, id, 64, 10), 0);
	eng_iter(e, &b);
	CHECK_ITEMS(&b, "1:0-2 2:0-2");
	eng_iter(e, &b);
	CHECK_ITEMS(&b, "3:0-2 1:d 2:d");
	eng_iter(e, &b);
	CHECK_ITEMS(&b, "4:0-2 1:d 2:d 3:d");
	CHECK_RC(kvt_sched_step(e->s, &b), 0);
	CHECK_ITEMS(&b, "1:d 2:d 3:d 4:d");
	eng_exec(e, &b);
	if (n_recall)
		recall_123(e, recall_ids, n_recall);
	CHECK_RC(kvt_sched_commit(e->s), 0);
	CHECK_EQ(t_stats_of(e->m).device_frames_used, 48);
}

/* The engine creates and prefills a sequence of its own (outside the scheduler). */
void engine_seq_len(struct eng *e, uint64_t id, uint32_t L)
{
	CHECK_RC(kvt_seq_create(e->m, id, L), 0);
	e->r[id] = (struct treq){.L = L, .live = true, .layers = e->c.n_layers, .tokens = L};
	for (uint32_t l = 0; l < e->c.n_layers; l++) {
		t_fill_prefill(&e->c, id, l, L, e->k, e->v, e->q);
		CHECK_RC(t_prefill_layer(e->m, id, l, e->k, e->v, e->q, NULL), 0);
	}
}

void engine_seq(struct eng *e, uint64_t id)
{
	engine_seq_len(e, id, 64);
}

void engine_seq_gone(struct eng *e, uint64_t id)
{
	CHECK_READBACK(e, id);
	CHECK_RC(kvt_seq_destroy(e->m, id), 0);
	e->r[id].live = false;
}

/* With a disk tier, requests whose histories are several times the host tier run together
   (only one layer of a history must fit it) and read back bit-exact when they complete; one
   whose single layer could not fit is refused. */
void test_disk_history_beyond_host(void **state)
{
	struct kvt_config c = cfg_frames(400, 0);
	struct kvt_sched_config sc = sched_cfg(4, 1024, 4096, 0);
	char dir[] = "/tmp/kvt-sched-XXXXXX";
	struct kvt_stats st;
	struct eng e;

	(void)state;
	assert_non_null(mkdtemp(dir));
	c.n_layers = 4;
	c.spill_dir = dir;
	c.host_bytes = t_budget(&c, 12); /* 12 block groups, 24 blocks */
	eng_init(&e, &c, &sc, 8, 128);
	/* 80 + 10 tokens: 12 groups a layer, 48 for the history */
	CHECK_RC(eng_add(&e, 1, 80, 10), 0);
	CHECK_RC(eng_add(&e, 2, 75, 12), 0);
	CHECK_RC(eng_add(&e, 3, 60, 9), 0);
	/* 100 + 5 tokens: 14 groups a layer */
	CHECK_RC(eng_add(&e, 4, 100, 5), -E2BIG);
	CHECK_SERR(e.s, "submit: sequence 4: one layer of 105 tokens (prompt and max_new_tokens) "
			"takes 28 host blocks, the host tier has 24");
	CHECK_RC(kvt_seq_destroy(e.m, 4), 0);
	e.r[4].live = false;
	eng_drain(&e, 200);
	CHECK_EQ(e.completed, 3);
	st = t_stats_of(e.m);
	assert_true(st.disk_blocks_spilled > 0 && st.disk_blocks_fetched > 0);
	CHECK_EQ(st.seqs_lost, 0);
	eng_fini(&e);
	assert_int_equal(rmdir(dir), 0);
}
