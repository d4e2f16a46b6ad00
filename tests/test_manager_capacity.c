/* SPDX-License-Identifier: MIT */
/*
 * manager: what happens when either tier is full, and the small calls' errors.
 */
#include "test_manager.h"

/* ---- capacity ---------------------------------------------------------------------------- */

void test_device_capacity(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m;
	struct tseq a, b, s3;
	struct kvt_stats st, st2;
	uint32_t n = 0;
	int32_t pos[64];

	(void)state;
	/* exactly one (sequence, layer) of a 100-token prompt: 5 frame groups (+ a spare byte
	   short of a sixth) */
	c.device_bytes = 5 * t_group_bytes(&c) + t_group_bytes(&c) - 1;
	m = t_mk(&c);
	assert_int_equal(t_stats_of(m).device_frames_total, 5 * c.n_kv_heads);
	tseq_init(&a, 100, 100);
	tseq_init(&b, 200, 100);
	tseq_init(&s3, 300, 3);
	CHECK_RC(kvt_seq_create(m, a.id, a.L), 0);
	CHECK_RC(kvt_seq_create(m, b.id, b.L), 0);
	CHECK_RC(kvt_seq_create(m, s3.id, s3.L), 0);
	tseq_prefill(m, &c, &a, 0);
	st = t_stats_of(m);
	assert_int_equal(st.device_frames_free, 0);

	CHECK_RC(prefill_raw(m, &c, b.id, 0, b.L, NULL, false), -ENOMEM);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	st2 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st, &st2);
	CHECK_RC(prefill_raw(m, &c, a.id, 1, a.L, NULL, false), -ENOMEM);
	CHECK_RC(prefill_raw(m, &c, s3.id, 1, s3.L, NULL, true), -ENOMEM);
	st2 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st, &st2);
	check_tokens(m, &c, &b);
	check_tokens(m, &c, &s3);
	CHECK_RC(kvt_seq_resident_positions(m, b.id, 0, 0, pos, 64, &n), -EINVAL);
	CHECK_RESIDENT(m, &c, &a, 0);
	CHECK_READBACK(m, &c, &a, 0);

	/* decode needs no new frames: it still works with the device tier full */
	{
		struct tseq *bt[1] = {&a};

		for (int i = 0; i < 20; i++)
			CHECK_RC(decode_step(m, &c, 0, bt, 1), 0);
		CHECK_RESIDENT(m, &c, &a, 0);
	}

	CHECK_RC(kvt_seq_destroy(m, a.id), 0);
	tseq_fini(&a);
	tseq_prefill(m, &c, &b, 0);
	CHECK_RESIDENT(m, &c, &b, 0);
	CHECK_READBACK(m, &c, &b, 0);
	check_usage(m, &c, (struct tseq[]){b, s3}, 2);
	CHECK_RC(kvt_seq_destroy(m, b.id), 0);
	tseq_fini(&b);
	/* the short prompt needs only sink + recent = 3 groups: it fits now */
	tseq_prefill(m, &c, &s3, 1);
	CHECK_READBACK(m, &c, &s3, 1);
	tseq_fini(&s3);
	kvt_manager_destroy(m);
}

void test_host_capacity_prefill(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m;
	struct tseq a, b;
	struct kvt_stats st, st2;

	(void)state;
	/* 100 tokens = 13 host groups; room for 20 */
	c.host_bytes = 20 * t_group_bytes(&c);
	m = t_mk(&c);
	tseq_init(&a, 1, 100);
	tseq_init(&b, 2, 100);
	CHECK_RC(kvt_seq_create(m, a.id, a.L), 0);
	CHECK_RC(kvt_seq_create(m, b.id, b.L), 0);
	tseq_prefill(m, &c, &a, 0);
	st = t_stats_of(m);
	/* the device tier has room, the host tier not: no device frame may stay taken */
	CHECK_RC(prefill_raw(m, &c, b.id, 1, b.L, NULL, false), -ENOMEM);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	st2 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st, &st2);
	check_tokens(m, &c, &b);
	CHECK_RC(kvt_seq_destroy(m, a.id), 0);
	tseq_prefill(m, &c, &b, 1);
	CHECK_READBACK(m, &c, &b, 1);
	check_usage(m, &c, &b, 1);
	tseq_fini(&a);
	tseq_fini(&b);
	kvt_manager_destroy(m);
}

void test_host_capacity_decode(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m;
	struct tseq a, b;
	struct tseq *bt[2];
	struct kvt_stats st, st2;

	(void)state;
	/* a: 16 tokens (2 groups), b: 12 tokens (2 groups); one group to spare */
	c.host_bytes = 5 * t_group_bytes(&c);
	m = t_mk(&c);
	tseq_init(&a, 10, 16);
	tseq_init(&b, 20, 12);
	CHECK_RC(kvt_seq_create(m, a.id, a.L), 0);
	CHECK_RC(kvt_seq_create(m, b.id, b.L), 0);
	tseq_prefill(m, &c, &a, 0);
	tseq_prefill(m, &c, &b, 0);
	bt[0] = &a;
	bt[1] = &b;
	CHECK_RC(decode_step(m, &c, 0, bt, 2), 0); /* a takes the spare group */
	assert_int_equal(t_stats_of(m).host_blocks_free, 0);
	bt[0] = &b;
	bt[1] = &a;
	for (int i = 0; i < 3; i++)
		CHECK_RC(decode_step(m, &c, 0, bt, 2), 0);
	assert_int_equal(a.n[0], 20);
	assert_int_equal(b.n[0], 16);

	/* b needs a new group now: the whole batch fails, a included */
	st = t_stats_of(m);
	bt[0] = &a;
	bt[1] = &b;
	CHECK_RC(decode_step(m, &c, 0, bt, 2), -ENOMEM);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	st2 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st, &st2);
	check_tokens(m, &c, &a);
	check_tokens(m, &c, &b);
	CHECK_RESIDENT(m, &c, &a, 0);
	CHECK_RESIDENT(m, &c, &b, 0);
	CHECK_READBACK(m, &c, &a, 0);
	CHECK_READBACK(m, &c, &b, 0);

	/* the other sequence still decodes until it needs a group itself */
	bt[0] = &a;
	for (int i = 0; i < 4; i++)
		CHECK_RC(decode_step(m, &c, 0, bt, 1), 0);
	st = t_stats_of(m);
	CHECK_RC(decode_step(m, &c, 0, bt, 1), -ENOMEM);
	st2 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st, &st2);
	assert_int_equal(a.n[0], 24);
	CHECK_RESIDENT(m, &c, &a, 0);
	CHECK_READBACK(m, &c, &a, 0);

	/* freeing b makes room for a again */
	CHECK_RC(kvt_seq_destroy(m, b.id), 0);
	for (int i = 0; i < 16; i++)
		CHECK_RC(decode_step(m, &c, 0, bt, 1), 0);
	CHECK_RC(decode_step(m, &c, 0, bt, 1), -ENOMEM);
	CHECK_RESIDENT(m, &c, &a, 0);
	CHECK_READBACK(m, &c, &a, 0);
	CHECK_ATTEND(m, &c, &a, 0, 5);
	b.n[0] = 0;
	check_usage(m, &c, &a, 1);
	tseq_fini(&a);
	tseq_fini(&b);
	kvt_manager_destroy(m);
}

/* ---- small calls ------------------------------------------------------------------------- */

void test_sync_tokens_errors(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m = t_mk(&c);
	struct tseq a;
	struct tseq *bt[1] = {&a};
	uint32_t n = 0;

	(void)state;
	assert_string_equal(kvt_manager_last_error(m), "");
	CHECK_RC(kvt_manager_sync(m, NULL), 0);
	CHECK_RC(kvt_seq_tokens(m, 42, 0, &n), -ENOENT);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	assert_non_null(kvt_strerror(-ENOENT));
	assert_true(strlen(kvt_strerror(-ENOMEM)) > 0);

	tseq_init(&a, 42, 50);
	CHECK_RC(kvt_seq_create(m, 42, 50), 0);
	CHECK_RC(kvt_seq_tokens(m, 42, 0, &n), 0);
	assert_int_equal(n, 0);
	CHECK_RC(kvt_seq_tokens(m, 42, 2, &n), -EINVAL);
	CHECK_RC(kvt_seq_tokens(m, 42, 0, NULL), -EINVAL);
	tseq_prefill(m, &c, &a, 1);
	CHECK_RC(prefill_raw(m, &c, 42, 1, 50, NULL, false), -EEXIST);
	CHECK_RC(kvt_seq_tokens(m, 42, 1, &n), 0);
	assert_int_equal(n, 50);
	CHECK_RC(kvt_seq_tokens(m, 42, 0, &n), 0);
	assert_int_equal(n, 0);
	for (int i = 0; i < 10; i++) {
		CHECK_RC(decode_step(m, &c, 1, bt, 1), 0);
		CHECK_RC(kvt_seq_tokens(m, 42, 1, &n), 0);
		assert_int_equal(n, 51 + i);
	}
	/* after sync every save has landed: the host history is complete */
	CHECK_RC(kvt_manager_sync(m, NULL), 0);
	CHECK_READBACK(m, &c, &a, 1);
	CHECK_RC(decode_step(m, &c, 0, bt, 1), -EINVAL); /* layer 0 not prefilled */
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	CHECK_RC(kvt_seq_destroy(m, 42), 0);
	CHECK_RC(kvt_seq_tokens(m, 42, 1, &n), -ENOENT);
	tseq_fini(&a);
	kvt_manager_destroy(m);
}
