/* SPDX-License-Identifier: MIT */
/*
 * sched: preemption (the latest, two at once, resumed requests) and frames held outside the
 * scheduler.
 */
#include "test_sched.h"

void test_preempt_latest(void **state)
{
	/* The engine preempts 1 and gives 24 of the freed frames to two sequences of its own.
	   Next step: 1 (resume, 12) and 2 (12 + 12 recalled) are admitted; 3 (12 more recalled)
	   does not fit the recall cache and ends admission. 1 needs 12 frames, 4 are free: the
	   latest holder not admitted, 4, is preempted, and that is enough: 3 keeps its frames. */
	struct kvt_sched_batch b;
	const size_t cap = 1 << 16;
	uint8_t *before[5], *after = t_xmalloc(cap);
	size_t nb[5];
	float q[4 * 16], o1[4 * 16], o2[4 * 16];
	const uint64_t ids23[2] = {2, 3};
	struct eng e;

	(void)state;
	setup_four(&e, ids23, 2);
	for (uint64_t id = 1; id <= 4; id++) {
		before[id] = t_xmalloc(cap);
		nb[id] = snapshot(&e, id, before[id], cap);
	}
	for (int i = 0; i < 4 * 16; i++)
		q[i] = (float)((i * 37) % 17 - 8) / 8.0f;
	CHECK_RC(kvt_attend(e.m, 1, 1, q, o1), 0);

	CHECK_RC(kvt_seq_preempt(e.m, 1), 0);
	engine_seq(&e, 9);
	engine_seq(&e, 10);
	CHECK_EQ(t_stats_of(e.m).device_frames_free, 4);

	CHECK_RC(kvt_sched_step(e.s, &b), 0);
	CHECK_ITEMS(&b, "1:d 2:d");
	CHECK_EQ(b.it.preempted, 1);
	CHECK_EQ(b.it.resumed, 1);
	CHECK_EQ(b.it.reset, 2); /* 3 did not fit, 4 lost its frames */
	CHECK_EQ(b.it.ws_estimate_frames, 12 + 12 + 12);
	CHECK_EQ(info_of(&e, 4).preempted, 1);
	CHECK_EQ(info_of(&e, 3).preempted, 0);
	CHECK_EQ(info_of(&e, 1).preempted, 0);
	CHECK_EQ(t_stats_of(e.m).device_frames_free, 4);
	CHECK_BATCH(&e, &b);
	CHECK_FRAMES(&e);
	/* bit-exact: the resumed one attends and reads as before, the preempted one reads as
	   before from the host history */
	CHECK_RC(kvt_attend(e.m, 1, 1, q, o2), 0);
	assert_memory_equal(o1, o2, sizeof(o1));
	CHECK_EQ(snapshot(&e, 1, after, cap), nb[1]);
	assert_memory_equal(after, before[1], nb[1]);
	CHECK_EQ(snapshot(&e, 4, after, cap), nb[4]);
	assert_memory_equal(after, before[4], nb[4]);
	eng_exec(&e, &b);
	CHECK_RC(kvt_sched_commit(e.s), 0);

	/* the engine's sequences go away; 1 and 2 finish early: 3 decodes, 4 is resumed */
	engine_seq_gone(&e, 9);
	engine_seq_gone(&e, 10);
	for (uint64_t id = 1; id <= 2; id++) {
		CHECK_RC(kvt_sched_finish(e.s, id), 0);
		CHECK_READBACK(&e, id);
		e.r[id].queued = false;
	}
	CHECK_RC(kvt_sched_step(e.s, &b), 0);
	CHECK_ITEMS(&b, "3:d 4:d");
	CHECK_EQ(b.it.resumed, 1);
	CHECK_EQ(b.it.preempted, 0);
	CHECK_EQ(snapshot(&e, 4, after, cap), nb[4]);
	assert_memory_equal(after, before[4], nb[4]);
	eng_exec(&e, &b);
	CHECK_RC(kvt_sched_commit(e.s), 0);
	CHECK_READBACK(&e, 4);
	eng_drain(&e, 20);
	CHECK_EQ(e.completed, 2);
	for (uint64_t id = 1; id <= 4; id++)
		free(before[id]);
	free(after);
	eng_fini(&e);
}

/* The squeeze both preemption tests end with: the engine preempts 1 and 2 and fills 36 of
   the free frames with its own (4 stay free). 1 and 2 are admitted and resumed; 3 and 4 must
   lose their frames, latest first. want_reset < 0: not checked. Then everything drains. */
static void squeeze_1_2(struct eng *e, int want_reset)
{
	struct kvt_sched_batch b;

	CHECK_RC(kvt_seq_preempt(e->m, 1), 0);
	CHECK_RC(kvt_seq_preempt(e->m, 2), 0);
	for (uint64_t id = 9; id <= 11; id++)
		engine_seq(e, id);
	CHECK_EQ(t_stats_of(e->m).device_frames_free, 4);
	CHECK_RC(kvt_sched_step(e->s, &b), 0);
	CHECK_ITEMS(&b, "1:d 2:d");
	CHECK_EQ(b.it.preempted, 2);
	CHECK_EQ(b.it.resumed, 2);
	if (want_reset >= 0)
		CHECK_EQ(b.it.reset, want_reset);
	CHECK_EQ(info_of(e, 3).preempted, 1);
	CHECK_EQ(info_of(e, 4).preempted, 1);
	CHECK_BATCH(e, &b);
	CHECK_FRAMES(e);
	eng_exec(e, &b);
	CHECK_RC(kvt_sched_commit(e->s), 0);
	for (uint64_t id = 9; id <= 11; id++)
		engine_seq_gone(e, id);
	eng_drain(e, 40);
	CHECK_EQ(e->completed, 4);
	eng_fini(e);
}

void test_preempt_two(void **state)
{
	/* The engine preempts 1 and 2 and fills 36 of the 40 free frames with its own. 1 and 2
	   are admitted (24 frames to resume), 3 is reset on its recall working set: 4 frames
	   free, so 4 and then 3 lose theirs, latest first. */
	const uint64_t ids23[2] = {2, 3};
	struct eng e;

	(void)state;
	setup_four(&e, ids23, 2);
	squeeze_1_2(&e, 2);
}

void test_preempt_resumed(void **state)
{
	/* A request the scheduler resumed holds frames like any other: later, when it is not
	   admitted, it can be a victim. 2 and 4 recall 12 blocks each; the engine preempts 3.
	   Step A: 1, 2, 3 (resumed) are admitted, 4 is reset on its recall working set; 3 then
	   recalls 12 blocks. The engine preempts 1 and 2 and fills 36 frames itself (4 free).
	   Step B: 1 and 2 are admitted (24 frames to resume), 3 is reset on its recall working
	   set; 4 and then 3 must be preempted. */
	const uint64_t ids24[2] = {2, 4}, id3 = 3;
	struct kvt_sched_batch b;
	struct eng e;

	(void)state;
	setup_four(&e, ids24, 2);
	CHECK_RC(kvt_seq_preempt(e.m, 3), 0);
	CHECK_RC(kvt_sched_step(e.s, &b), 0);
	CHECK_ITEMS(&b, "1:d 2:d 3:d");
	CHECK_EQ(b.it.resumed, 1);
	CHECK_EQ(b.it.preempted, 0);
	CHECK_EQ(b.it.reset, 1);
	CHECK_BATCH(&e, &b);
	eng_exec(&e, &b);
	recall_123(&e, &id3, 1);
	CHECK_RC(kvt_sched_commit(e.s), 0);
	CHECK_FRAMES(&e);

	squeeze_1_2(&e, -1);
}

void test_frames_held_outside(void **state)
{
	/* No recall: all four are admitted (48 of 64 frames by estimate). The engine preempted
	   1 and 2 and holds 36 frames itself: 4 are free, nothing the scheduler holds may go, so
	   the latest admitted that need frames (2, then 1) wait instead of failing the engine's
	   calls; they come back once the engine lets go. */
	struct kvt_sched_batch b;
	struct kvt_sched_iter it;
	struct eng e;

	(void)state;
	setup_four(&e, NULL, 0);
	CHECK_RC(kvt_seq_preempt(e.m, 1), 0);
	CHECK_RC(kvt_seq_preempt(e.m, 2), 0);
	for (uint64_t id = 9; id <= 11; id++)
		engine_seq(&e, id);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "3:d 4:d");
	CHECK_EQ(it.preempted, 0);
	CHECK_EQ(it.resumed, 0);
	CHECK_EQ(it.reset, 2);
	CHECK_EQ(it.queued, 2);
	engine_seq_gone(&e, 11);
	it = eng_iter(&e, &b); /* 16 free: 1 comes back, 2 still waits */
	CHECK_ITEMS(&b, "1:d 3:d 4:d");
	CHECK_EQ(it.resumed, 1);
	CHECK_EQ(it.reset, 1);
	engine_seq_gone(&e, 10);
	it = eng_iter(&e, &b);
	CHECK_ITEMS(&b, "1:d 2:d 3:d 4:d");
	CHECK_EQ(it.resumed, 1);
	engine_seq_gone(&e, 9);
	eng_drain(&e, 40);
	CHECK_EQ(e.completed, 4);
	eng_fini(&e);
}
