/* SPDX-License-Identifier: MIT */
/*
 * manager: decode scenarios (ring wrap, dtypes, groups and windows, save threads and staging,
 * save visibility) and batched decode interleaved with prefill.
 */
#include "test_manager.h"

/* ---- decode scenarios -------------------------------------------------------------------- */

struct scen {
	enum kvt_dtype dt;
	uint32_t kv, G, D, bt, sink, recent, topk, obs;
	uint32_t threads;
	uint64_t staging; /* 0: the small config's */
	uint32_t steps;
};

#define SCEN_SEQS 6
#define SCEN_LONG 250

static struct kvt_config scen_config(const struct scen *s)
{
	struct kvt_config c = t_small_config();
	uint32_t fr, bl;

	c.dtype = s->dt;
	c.n_kv_heads = s->kv;
	c.n_q_heads = s->kv * s->G;
	c.head_dim = s->D;
	c.block_tokens = s->bt;
	c.sink_tokens = s->sink;
	c.recent_tokens = s->recent;
	c.topk_tokens = s->topk;
	c.obs_window = s->obs;
	c.save_threads = s->threads;
	if (s->staging)
		c.staging_bytes = s->staging;
	/* room for every sequence on both layers, plus a little */
	fr = DIV_UP(s->sink + s->recent + s->topk, s->bt);
	bl = DIV_UP(SCEN_LONG + s->steps + 1, s->bt);
	c.device_bytes = t_group_bytes(&c) * (2 * SCEN_SEQS * fr + 4);
	c.host_bytes = t_group_bytes(&c) * (2 * SCEN_SEQS * bl + 4);
	return c;
}

/* Six sequences (Case 1 and long prompts) on two layers, prefilled in mixed layer order,
   decoded `steps` tokens in batches; resident positions checked after every step, attention
   at several steps before and after the ring wraps, and every token of every head and layer
   read back from both tiers at the end. */
static void run_scenario(const struct scen *s)
{
	struct kvt_config c = scen_config(s);
	struct kvt_manager *m;
	struct tseq ts[SCEN_SEQS];
	struct tseq *batch[SCEN_SEQS];
	uint32_t lens[SCEN_SEQS] = {
		1, s->sink ? s->sink : 2, s->sink + s->recent, s->sink + s->recent + 1, SCEN_LONG,
		61};
	uint32_t attend_at[] = {s->recent / 2, s->recent + 1, 2 * s->recent + 3, s->steps - 1};

	print_message("# %s G=%u kv=%u D=%u bt=%u sink=%u recent=%u topk=%u obs=%u threads=%u "
		      "staging=%llu steps=%u\n",
		      t_dt_name(s->dt), s->G, s->kv, s->D, s->bt, s->sink, s->recent, s->topk,
		      s->obs, s->threads, (unsigned long long)c.staging_bytes, s->steps);
	m = t_mk(&c);
	for (uint32_t i = 0; i < SCEN_SEQS; i++) {
		tseq_init(&ts[i], 0xabc0000000000000ull + i * 0x10001ull, lens[i]);
		CHECK_RC(kvt_seq_create(m, ts[i].id, lens[i]), 0);
	}
	for (uint32_t i = 0; i < SCEN_SEQS; i++) {
		tseq_prefill(m, &c, &ts[i], i % 2 ? 0 : 1);
		check_usage(m, &c, ts, SCEN_SEQS);
	}
	for (uint32_t i = SCEN_SEQS; i-- > 0;) {
		tseq_prefill(m, &c, &ts[i], i % 2 ? 1 : 0);
		check_usage(m, &c, ts, SCEN_SEQS);
	}
	for (uint32_t i = 0; i < SCEN_SEQS; i++)
		for (uint32_t l = 0; l < 2; l++) {
			CHECK_RESIDENT(m, &c, &ts[i], l);
			CHECK_ATTEND(m, &c, &ts[i], l, i * 2 + l);
			check_resident_rows(m, &c, &ts[i], l);
		}

	for (uint32_t step = 0; step < s->steps; step++) {
		/* layer 0: all in order; layer 1: reversed, and the two shortest skip odd steps */
		for (uint32_t i = 0; i < SCEN_SEQS; i++)
			batch[i] = &ts[i];
		CHECK_RC(decode_step(m, &c, 0, batch, SCEN_SEQS), 0);
		{
			uint32_t n = 0;

			for (uint32_t i = SCEN_SEQS; i-- > 0;)
				if (i >= 2 || step % 2 == 0)
					batch[n++] = &ts[i];
			CHECK_RC(decode_step(m, &c, 1, batch, n), 0);
		}
		for (uint32_t i = 0; i < SCEN_SEQS; i++)
			for (uint32_t l = 0; l < 2; l++)
				CHECK_RESIDENT(m, &c, &ts[i], l);
		{
			bool attend = step % 500 == 499;

			for (size_t a = 0; a < sizeof(attend_at) / sizeof(attend_at[0]); a++)
				attend |= step == attend_at[a];
			for (uint32_t i = 0; attend && i < SCEN_SEQS; i++)
				for (uint32_t l = 0; l < 2; l++)
					CHECK_ATTEND(m, &c, &ts[i], l, step * 131 + i * 2 + l);
		}
		if (step % 97 == 0)
			for (uint32_t i = 0; i < SCEN_SEQS; i++)
				check_resident_rows(m, &c, &ts[i], step % 2);
	}
	check_usage(m, &c, ts, SCEN_SEQS);
	for (uint32_t i = 0; i < SCEN_SEQS; i++) {
		check_tokens(m, &c, &ts[i]);
		for (uint32_t l = 0; l < 2; l++) {
			CHECK_READBACK(m, &c, &ts[i], l);
			CHECK_ATTEND(m, &c, &ts[i], l, 99991 + i * 2 + l);
		}
	}
	/* destroy in an odd order; everything returns */
	for (uint32_t i = 0; i < SCEN_SEQS; i++) {
		uint32_t j = (i * 5 + 3) % SCEN_SEQS;

		CHECK_RC(kvt_seq_destroy(m, ts[j].id), 0);
		tseq_fini(&ts[j]);
		check_usage(m, &c, ts, SCEN_SEQS);
	}
	{
		struct kvt_stats st = t_stats_of(m);

		assert_int_equal(st.device_frames_used, 0);
		assert_int_equal(st.host_blocks_used, 0);
		assert_int_equal(st.live_seqs, 0);
	}
	kvt_manager_destroy(m);
}

void test_ring_wrap_long(void **state)
{
	struct scen s = {KVT_DTYPE_F16, 2, 2, 16, 8, 8, 16, 16, 4, 2, 0, 3000};

	(void)state;
	run_scenario(&s);
}

void test_dtypes_groups_windows(void **state)
{
	static const enum kvt_dtype dts[] = {KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16};
	static const uint32_t groups[] = {1, 2, 4, 8};
	/* sink, recent: not multiples of the block, sink 0, a ring longer than a block */
	static const uint32_t win[][2] = {{5, 13}, {0, 13}, {8, 16}, {3, 70}};

	(void)state;
	for (uint32_t i = 0; i < 12; i++) {
		struct scen s = {
			.dt = dts[i % 3],
			.kv = 2,
			.G = groups[i % 4],
			.D = i % 2 ? 32 : 16,
			.bt = (i / 2) % 2 ? 64 : 8,
			.sink = win[(i / 3) % 4][0],
			.recent = win[(i / 3) % 4][1],
			.topk = i % 5 == 4 ? 40 : 11,
			.obs = i % 4 == 3 ? 20 : 4,
			.threads = i % 3,
			.steps = 0,
		};

		s.steps = 2 * s.recent + 9;
		run_scenario(&s);
	}
	/* one kv head with 8 query heads; block 32 */
	{
		struct scen s = {KVT_DTYPE_BF16, 1, 8, 24, 32, 5, 13, 16, 6, 1, 0, 40};

		run_scenario(&s);
	}
	/* a ring of one token, with and without sink; odd head dims (rows of 14 and 10 bytes) */
	{
		struct scen s = {KVT_DTYPE_F16, 2, 2, 7, 8, 0, 1, 5, 3, 2, 0, 20};

		run_scenario(&s);
		s.dt = KVT_DTYPE_BF16;
		s.D = 5;
		s.sink = 7;
		s.threads = 0;
		run_scenario(&s);
	}
}

/* Chunked saves (4 KiB staging: prefill and decode both split, rows cut at chunk edges) with
   0, 1 and 4 save threads: read-back must match the generator in every case, and the three
   runs must agree on every counter. */
void test_save_threads_staging(void **state)
{
	static const uint32_t threads[] = {0, 1, 4};
	struct kvt_stats st[3];

	(void)state;
	for (int t = 0; t < 3; t++) {
		struct scen s = {KVT_DTYPE_F32, 4, 2, 40, 8, 5, 13, 16, 4, threads[t], 4096, 40};
		struct kvt_config c = scen_config(&s);
		struct kvt_manager *m;

		run_scenario(&s);

		/* direct check that a multi-chunk append lands intact */
		m = t_mk(&c);
		{
			struct tseq ts[9];
			struct tseq *batch[9];

			for (uint32_t i = 0; i < 9; i++) {
				tseq_init(&ts[i], 500 + i, 20 + i * 31);
				CHECK_RC(kvt_seq_create(m, ts[i].id, ts[i].L), 0);
				tseq_prefill(m, &c, &ts[i], 0);
				batch[i] = &ts[i];
			}
			/* 9 seqs x 4 heads x 160 B x 2 = 11.25 KiB per step: 3 chunks */
			for (int step = 0; step < 20; step++)
				CHECK_RC(decode_step(m, &c, 0, batch, 9), 0);
			CHECK_RC(kvt_manager_sync(m, NULL), 0);
			for (uint32_t i = 0; i < 9; i++) {
				CHECK_READBACK(m, &c, &ts[i], 0);
				CHECK_RESIDENT(m, &c, &ts[i], 0);
			}
			st[t] = t_stats_of(m);
			for (uint32_t i = 0; i < 9; i++)
				tseq_fini(&ts[i]);
		}
		kvt_manager_destroy(m);
	}
	for (int t = 1; t < 3; t++) {
		st[t].save_threads = st[0].save_threads;
		CHECK_STATS_EQUAL(&st[0], &st[t]);
	}
	assert_int_equal(st[0].tokens_appended, 180);
}

/* Reads of the host history right after the call that saved into it: the save threads are
   still scattering (large multi-chunk prefill saves, appends just handed over), so a read that
   did not wait for the right save would see stale bytes. */
static void save_visibility(uint32_t threads)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m;
	struct tseq small[32];
	struct tseq *bt[32];
	uint8_t wk[1024], wv[1024], gk[1024], gv[1024];

	print_message("# %u save threads\n", threads);
	c.dtype = KVT_DTYPE_F32;
	c.n_kv_heads = 4;
	c.n_q_heads = 4;
	c.head_dim = 256; /* 1 KiB rows: a 2048-token layer saves 16 MiB */
	c.block_tokens = 64;
	c.save_threads = threads;
	c.staging_bytes = 8u << 20; /* 2 chunks per prefill: the second one is still being scattered
				       when the call returns */
	c.device_bytes = 40 * t_group_bytes(&c);
	c.host_bytes = 48 * t_group_bytes(&c);
	m = t_mk(&c);
	for (uint32_t r = 0; r < 3; r++) {
		uint32_t L = 2048 - r * 37;
		uint64_t id = 900 + r;

		CHECK_RC(kvt_seq_create(m, id, L), 0);
		CHECK_RC(prefill_raw(m, &c, id, r % 2, L, NULL, false), 0);
		for (uint32_t i = 0; i < 4; i++) {
			uint32_t h = 3 - i, p = L - 1 - i * 3;

			t_fill_row(c.dtype, c.head_dim, wk, id, r % 2, h, p, 0);
			t_fill_row(c.dtype, c.head_dim, wv, id, r % 2, h, p, 1);
			CHECK_RC(kvt_seq_read_token_host(m, id, r % 2, h, p, gk, gv), 0);
			assert_memory_equal(gk, wk, sizeof(wk));
			assert_memory_equal(gv, wv, sizeof(wv));
		}
		CHECK_RC(kvt_seq_destroy(m, id), 0);
	}
	/* destroy right behind a large save: its blocks go back to the pool (ASan-poisoned)
	   and are handed out again, so the save must have landed before destroy returns */
	{
		size_t kv_bytes = (size_t)c.n_kv_heads * 2048 * t_rowb(&c);
		void *k = t_xmalloc(kv_bytes), *v = t_xmalloc(kv_bytes);
		void *q = t_xmalloc((size_t)c.n_q_heads * c.obs_window * t_rowb(&c));

		t_fill_prefill(&c, 920, 1, 2048, k, v, q);
		for (uint32_t r = 0; r < 6; r++) {
			CHECK_RC(kvt_seq_create(m, 920, 2048), 0);
			CHECK_RC(t_prefill_layer(m, 920, 1, k, v, q, NULL), 0);
			CHECK_RC(kvt_seq_destroy(m, 920), 0);
		}
		free(k);
		free(v);
		free(q);
	}
	for (uint32_t i = 0; i < 32; i++) {
		tseq_init(&small[i], 950 + i, 2 + i);
		CHECK_RC(kvt_seq_create(m, small[i].id, small[i].L), 0);
		tseq_prefill(m, &c, &small[i], 0);
		bt[i] = &small[i];
	}
	for (int step = 0; step < 30; step++) {
		CHECK_RC(decode_step(m, &c, 0, bt, 32), 0);
		/* newest first: the save threads scatter a batch in order */
		for (uint32_t i = 32; i-- > 0;) {
			uint32_t p = small[i].n[0] - 1, h = (uint32_t)(step + i) % 4;

			t_fill_row(c.dtype, c.head_dim, wk, small[i].id, 0, h, p, 0);
			t_fill_row(c.dtype, c.head_dim, wv, small[i].id, 0, h, p, 1);
			CHECK_RC(kvt_seq_read_token_host(m, small[i].id, 0, h, p, gk, gv), 0);
			assert_memory_equal(gk, wk, sizeof(wk));
			assert_memory_equal(gv, wv, sizeof(wv));
		}
	}
	for (uint32_t i = 0; i < 32; i++) {
		CHECK_READBACK(m, &c, &small[i], 0);
		tseq_fini(&small[i]);
	}
	kvt_manager_destroy(m);
}

void test_save_visibility(void **state)
{
	(void)state;
	save_visibility(1); /* one thread: the last chunk of a save is scattered slowly */
	save_visibility(3); /* chunks of >= 128 KiB are split between threads */
}

/* ---- batched decode interleaved with prefill -------------------------------------------- */

void test_batched_interleaved(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m;
	struct tseq a, b, cc, d, e;
	struct tseq *all[5] = {&a, &b, &cc, &d, &e};
	struct tseq *bt[5];
	struct kvt_stats st, st2;

	(void)state;
	c.n_layers = 3;
	c.sink_tokens = 5;
	c.recent_tokens = 13;
	m = t_mk(&c);
	tseq_init(&a, 1, 300);
	tseq_init(&b, 2, 5);
	tseq_init(&cc, 3, 18);
	tseq_init(&d, 4, 40);
	tseq_init(&e, 5, 19);
	for (int i = 0; i < 5; i++)
		CHECK_RC(kvt_seq_create(m, all[i]->id, all[i]->L), 0);

	tseq_prefill(m, &c, &a, 1);
	tseq_prefill(m, &c, &b, 1);
	bt[0] = &a;
	bt[1] = &b;
	CHECK_RC(decode_step(m, &c, 1, bt, 2), 0);
	tseq_prefill(m, &c, &cc, 1);
	bt[0] = &cc;
	bt[1] = &a;
	bt[2] = &b;
	for (int i = 0; i < 7; i++)
		CHECK_RC(decode_step(m, &c, 1, bt, 3), 0);
	tseq_prefill(m, &c, &a, 0); /* layer 0 after layer 1 */
	tseq_prefill(m, &c, &a, 2);
	bt[0] = &a;
	CHECK_RC(decode_step(m, &c, 0, bt, 1), 0);

	/* layer 0 is prefilled for a only: a batch naming b fails whole */
	st = t_stats_of(m);
	bt[0] = &a;
	bt[1] = &b;
	CHECK_RC(decode_step(m, &c, 0, bt, 2), -EINVAL);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	st2 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st, &st2);
	/* a repeated id fails whole */
	bt[0] = &a;
	bt[1] = &cc;
	bt[2] = &a;
	CHECK_RC(decode_step(m, &c, 1, bt, 3), -EINVAL);
	st2 = t_stats_of(m);
	CHECK_STATS_EQUAL(&st, &st2);
	for (int i = 0; i < 5; i++)
		check_tokens(m, &c, all[i]);

	tseq_prefill(m, &c, &d, 2);
	tseq_prefill(m, &c, &d, 1);
	tseq_prefill(m, &c, &e, 0);
	tseq_prefill(m, &c, &b, 0);
	for (int step = 0; step < 60; step++) {
		uint32_t n = 0;

		/* layer 1: a, b, cc, d in a rotating order */
		for (int i = 0; i < 4; i++)
			bt[n++] = all[(step + i) % 4];
		CHECK_RC(decode_step(m, &c, 1, bt, n), 0);
		/* layer 0: a, e, b on alternate steps; layer 2: d then a */
		n = 0;
		if (step % 2) {
			bt[n++] = &e;
			bt[n++] = &a;
		} else {
			bt[n++] = &b;
		}
		CHECK_RC(decode_step(m, &c, 0, bt, n), 0);
		bt[0] = &d;
		bt[1] = &a;
		CHECK_RC(decode_step(m, &c, 2, bt, step % 3 ? 2 : 1), 0);
		if (step == 30) {
			/* cc goes away mid-run; its id is reused by a new sequence */
			CHECK_RC(kvt_seq_destroy(m, cc.id), 0);
			tseq_fini(&cc);
			cc.L = 33;
			CHECK_RC(kvt_seq_create(m, cc.id, cc.L), 0);
			CHECK_RC(kvt_seq_create(m, cc.id, cc.L), -EEXIST);
			tseq_prefill(m, &c, &cc, 1);
		}
		for (int i = 0; i < 5; i++)
			for (uint32_t l = 0; l < 3; l++)
				if (all[i]->n[l])
					CHECK_RESIDENT(m, &c, all[i], l);
		check_usage(m, &c, (struct tseq[]){a, b, cc, d, e}, 5);
	}
	for (int i = 0; i < 5; i++) {
		check_tokens(m, &c, all[i]);
		for (uint32_t l = 0; l < 3; l++)
			if (all[i]->n[l]) {
				CHECK_READBACK(m, &c, all[i], l);
				CHECK_ATTEND(m, &c, all[i], l, 17 + i * 3 + l);
			} else {
				float q[64], o[64];

				CHECK_RC(kvt_attend(m, all[i]->id, l, q, o), -EINVAL);
			}
	}
	for (int i = 0; i < 5; i++)
		tseq_fini(all[i]);
	kvt_manager_destroy(m);
}
