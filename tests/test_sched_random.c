/* SPDX-License-Identifier: MIT */
/*
 * sched: randomized runs of the engine, with and without working-set control.
 */
#include "test_sched.h"

/* ---- randomized run ------------------------------------------------------------------------ */

static uint64_t test_seed(void)
{
	const char *s = getenv("KVT_TEST_SEED");

	return s && *s ? strtoull(s, NULL, 0) : 20240601;
}

/* Holders of device frames before a step, to check afterwards that the step preempted the
   latest arrivals among those it did not admit. */
static void check_victims(struct eng *e, const bool *held, const struct kvt_sched_batch *b)
{
	uint64_t min_victim = UINT64_MAX, max_kept = 0;
	uint32_t n_victims = 0;
	bool any_kept = false;

	for (uint64_t id = 0; id < e->n_ids; id++) {
		const struct treq *t = &e->r[id];
		bool admitted = false;

		if (!held[id] || !t->live || !t->queued)
			continue;
		for (uint32_t i = 0; i < b->n_items; i++)
			admitted |= b->items[i].seq == id;
		if (admitted)
			continue;
		if (info_of(e, id).preempted) {
			n_victims++;
			min_victim = t->arrival < min_victim ? t->arrival : min_victim;
		} else {
			any_kept = true;
			max_kept = t->arrival > max_kept ? t->arrival : max_kept;
		}
	}
	CHECK_EQ(n_victims, b->it.preempted);
	if (n_victims && any_kept && max_kept > min_victim)
		fail_at(__FILE__, __LINE__,
			"preempted arrival %llu while arrival %llu kept its frames",
			(unsigned long long)min_victim, (unsigned long long)max_kept);
}

static void run_random(uint32_t ws_control, uint32_t n_req, uint64_t seed)
{
	/* 160 frames of resident sets: a lone request takes at most 20 resident + 40 of full
	   KV (L <= 160); a recall cache of 64 single-block frames */
	struct kvt_config c = cfg_frames(160, 64);
	struct kvt_sched_config sc = sched_cfg(8, 96, 2 * 96, ws_control);
	struct eng e;
	bool *held;
	uint32_t next = 1, destroyed = 0, finished = 0, max_iters = 200000;
	uint32_t n_ext = 0, ext_until = 0, engine_preempts = 0;
	uint64_t peak_used = 0, ext = 0;

	eng_init(&e, &c, &sc, 2 * n_req + 1, 160);
	e.rng = seed ^ ws_control;
	held = t_xmalloc((size_t)e.n_ids * sizeof(*held));
	print_message("# random ws_control=%u: %u requests, seed %llu\n", ws_control, n_req,
		      (unsigned long long)seed);
	for (uint32_t iter = 0; next <= n_req || kvt_sched_pending(e.s); iter++) {
		struct kvt_sched_batch b;
		/* about as many arrivals as the budget lets complete, in bursts */
		uint32_t arrivals = rnd(&e) % 10 == 0 ? rnd_in(&e, 2, 6) : (uint32_t)(rnd(&e) % 2);

		if (iter == max_iters)
			fail_at(__FILE__, __LINE__, "%u requests pending after %u iterations",
				kvt_sched_pending(e.s), iter);
		for (uint32_t a = 0; a < arrivals && next <= n_req; a++, next++) {
			uint32_t L = rnd(&e) % 4 ? rnd_in(&e, 1, 60) : rnd_in(&e, 61, 160);

			CHECK_RC(eng_add(&e, next, L, rnd_in(&e, 1, 24)), 0);
		}
		/* now and then the engine drops a request: told (finish) or not (destroy) */
		if (next > 1 && rnd(&e) % 50 == 0) {
			uint64_t id = rnd_in(&e, 1, next - 1);
			struct treq *t = &e.r[id];

			/* one that completed at the last commit is no longer the scheduler's */
			if (t->queued && t->generated == t->max_new) {
				id = 0;
			} else if (t->queued && rnd(&e) % 2) {
				CHECK_RC(kvt_sched_finish(e.s, id), 0);
				CHECK_EQ(info_of(&e, id).device_frames, 0);
				finished++;
			} else if (t->queued) {
				destroyed++;
			} else {
				id = 0;
			}
			if (id) {
				CHECK_READBACK(&e, id);
				CHECK_RC(kvt_seq_destroy(e.m, id), 0);
				t->queued = t->live = false;
			}
		}
		/* the engine's own sequences come and go, taking frames the scheduler cannot
		   take back */
		if (ext && iter >= ext_until) {
			engine_seq_gone(&e, ext);
			ext = 0;
		}
		if (!ext && n_ext < n_req && rnd(&e) % 40 == 0) {
			uint32_t L = rnd_in(&e, 16, 100);

			if (t_stats_of(e.m).device_frames_free >= 2 * fpl(&c, L)) {
				ext = n_req + 1 + n_ext++;
				engine_seq_len(&e, ext, L);
				ext_until = iter + rnd_in(&e, 3, 30);
			}
		}
		/* and now and then it preempts a running request itself */
		if (next > 1 && rnd(&e) % 8 == 0) {
			uint64_t cand[64], id;
			uint32_t nc = 0;

			for (id = next > 64 ? next - 64 : 1; id < next; id++)
				if (e.r[id].queued && e.r[id].generated < e.r[id].max_new &&
				    info_of(&e, id).device_frames)
					cand[nc++] = id;
			if (nc) {
				CHECK_RC(kvt_seq_preempt(e.m, cand[rnd(&e) % nc]), 0);
				engine_preempts++;
			}
		}
		for (uint64_t id = 1; id < next; id++) {
			struct kvt_seq_info in;

			held[id] = false;
			if (!e.r[id].live)
				continue;
			in = info_of(&e, id);
			held[id] = !in.preempted && in.device_frames;
		}
		e.recall_r = rnd(&e) % 3 == 0 ? rnd_in(&e, 1, 3) : 0;
		CHECK_RC(kvt_sched_step(e.s, &b), 0);
		eng_reap(&e, &b);
		CHECK_BATCH(&e, &b);
		check_victims(&e, held, &b);
		CHECK_FRAMES(&e);
		for (uint64_t id = 1; id < next; id++)
			if (held[id] && e.r[id].live && info_of(&e, id).preempted)
				e.r[id].was_preempted = true;
		eng_exec(&e, &b);
		CHECK_RC(kvt_sched_commit(e.s), 0);
		CHECK_FRAMES(&e);
		{
			struct kvt_stats st = t_stats_of(e.m);

			peak_used = st.device_frames_used > peak_used ? st.device_frames_used
								      : peak_used;
		}
		e.iters++;
		e.items += b.n_items;
		e.preempted += b.it.preempted;
		e.resumed += b.it.resumed;
		e.reset += b.it.reset;
	}
	{
		struct kvt_sched_batch b;

		CHECK_RC(kvt_sched_step(e.s, &b), 0);
		eng_reap(&e, &b);
		CHECK_EQ(b.n_items, 0);
		CHECK_RC(kvt_sched_commit(e.s), 0);
	}
	if (ext)
		engine_seq_gone(&e, ext);
	/* every request completed, was finished, or was destroyed behind the scheduler */
	CHECK_EQ(e.completed + finished + destroyed, n_req);
	for (uint64_t id = 1; id <= n_req; id++)
		if (e.r[id].live)
			fail_at(__FILE__, __LINE__, "seq %llu still live", (unsigned long long)id);
	{
		struct kvt_stats st = t_stats_of(e.m);

		CHECK_EQ(st.device_frames_used, 0);
		CHECK_EQ(st.live_seqs, 0);
		print_message(
			"# random ws_control=%u: %llu iterations, %llu items, %llu completed, "
			"%u finished, %u destroyed, %u engine preemptions, %u engine "
			"sequences, %llu preempted, %llu resumed, %llu reset, "
			"%llu recall steps (%llu loads), peak %llu of %llu frames\n",
			ws_control, (unsigned long long)e.iters, (unsigned long long)e.items,
			(unsigned long long)e.completed, finished, destroyed, engine_preempts,
			n_ext, (unsigned long long)e.preempted, (unsigned long long)e.resumed,
			(unsigned long long)e.reset, (unsigned long long)e.recalls,
			(unsigned long long)st.recall_loads, (unsigned long long)peak_used,
			(unsigned long long)st.device_frames_total);
	}
	assert_true(e.completed > n_req / 2);
	free(held);
	eng_fini(&e);
}

void test_random_ws(void **state)
{
	(void)state;
	run_random(1, 2000, test_seed());
}

void test_random_resident(void **state)
{
	(void)state;
	run_random(0, 2000, test_seed() + 1);
}
