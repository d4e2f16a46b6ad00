/* SPDX-License-Identifier: MIT */
/*
 * manager: geometry, configuration and stats; the resident layout after prefill.
 */
#include "test_manager.h"

/* ---- geometry, configuration, stats ----------------------------------------------------- */

void test_config_and_geometry(void **state)
{
	struct kvt_config c = t_small_config(), got;
	struct kvt_manager *m;
	struct kvt_stats st;
	uint64_t gb;

	(void)state;
	if (t_auto_backend() == KVT_BACKEND_HOST) /* this suite's tensors are host memory */
		c.backend = KVT_BACKEND_AUTO;
	m = t_mk(&c);
	CHECK_RC(kvt_manager_config(m, &got), 0);
	assert_int_equal(got.backend, t_be->kind);
	assert_int_equal(got.n_layers, c.n_layers);
	assert_int_equal(got.n_kv_heads, c.n_kv_heads);
	assert_int_equal(got.n_q_heads, c.n_q_heads);
	assert_int_equal(got.head_dim, c.head_dim);
	assert_int_equal(got.block_tokens, c.block_tokens);
	assert_int_equal(got.dtype, c.dtype);
	assert_int_equal(got.sink_tokens, c.sink_tokens);
	assert_int_equal(got.recent_tokens, c.recent_tokens);
	assert_int_equal(got.topk_tokens, c.topk_tokens);
	assert_int_equal(got.save_threads, c.save_threads);
	assert_string_equal(kvt_manager_last_error(m), "");

	/* 2 heads x (K+V) x 8 tokens x 16 dims x 2 bytes = 1 KiB per group */
	gb = (uint64_t)c.n_kv_heads * 2 * c.block_tokens * c.head_dim * 2;
	assert_int_equal(gb, 1024);
	st = t_stats_of(m);
	assert_int_equal(st.size, sizeof(st));
	assert_int_equal(st.version, KVT_STATS_VERSION);
	assert_int_equal(st.device_frames_total, (c.device_bytes / gb) * c.n_kv_heads);
	assert_int_equal(st.device_frames_total, 8192);
	assert_int_equal(st.host_blocks_total, (c.host_bytes / gb) * c.n_kv_heads);
	assert_int_equal(st.device_frames_used, 0);
	assert_int_equal(st.device_frames_free, st.device_frames_total);
	assert_int_equal(st.host_blocks_used, 0);
	assert_int_equal(st.host_blocks_free, st.host_blocks_total);
	assert_int_equal(st.live_seqs, 0);
	assert_int_equal(st.save_threads, c.save_threads);
	assert_int_equal(st.tokens_saved, 0);
	assert_int_equal(st.prefill_layers, 0);
	kvt_manager_destroy(m);

	/* budgets are rounded down to whole groups; other dtypes and geometries */
	c = t_small_config();
	c.dtype = KVT_DTYPE_F32;
	c.n_kv_heads = 4;
	c.n_q_heads = 8;
	c.head_dim = 24;
	c.block_tokens = 32;
	gb = t_group_bytes(&c); /* 4 * 2 * 32 * 24 * 4 = 24 KiB */
	assert_int_equal(gb, 24576);
	c.device_bytes = 7 * gb + gb - 1;
	c.host_bytes = 11 * gb + 1;
	m = t_mk(&c);
	st = t_stats_of(m);
	assert_int_equal(st.device_frames_total, 7 * 4);
	assert_int_equal(st.host_blocks_total, 11 * 4);
	assert_int_equal(st.device_frames_free, 7 * 4);
	assert_int_equal(st.host_blocks_free, 11 * 4);
	kvt_manager_destroy(m);

	/* a short stats struct is filled only up to its size */
	m = t_mk(&c);
	{
		struct kvt_stats small;

		memset(&small, 0xee, sizeof(small));
		small.size = offsetof(struct kvt_stats, device_frames_used);
		small.version = KVT_STATS_VERSION;
		CHECK_RC(kvt_manager_stats(m, &small), 0);
		assert_int_equal(small.device_frames_total, 7 * 4);
		assert_int_equal(small.device_frames_used, 0xeeeeeeeeeeeeeeeeull);
	}
	kvt_manager_destroy(m);
	kvt_manager_destroy(NULL);
}

void test_stats_counters(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m = t_mk(&c);
	struct tseq a, b;
	struct tseq *batch[2];
	struct kvt_stats st;
	uint64_t rb = t_rowb(&c), H = c.n_kv_heads;

	(void)state;
	tseq_init(&a, 0x1234567890abcdefull, 100);
	tseq_init(&b, 7, 10);
	CHECK_RC(kvt_seq_create(m, a.id, a.L), 0);
	CHECK_RC(kvt_seq_create(m, b.id, b.L), 0);
	st = t_stats_of(m);
	assert_int_equal(st.live_seqs, 2);
	assert_int_equal(st.device_frames_used, 0); /* create allocates no tier memory */
	assert_int_equal(st.host_blocks_used, 0);

	tseq_prefill(m, &c, &a, 0);
	st = t_stats_of(m);
	/* sink 8 + recent 16 + top-K 16 = 40 slots = 5 frames per head; 100 tokens = 13 blocks */
	assert_int_equal(st.device_frames_used, 2 * 5);
	assert_int_equal(st.host_blocks_used, 2 * 13);
	assert_int_equal(st.device_frames_free, st.device_frames_total - 10);
	assert_int_equal(st.host_blocks_free, st.host_blocks_total - 26);
	assert_int_equal(st.tokens_prompt, 100);
	assert_int_equal(st.tokens_saved, 100);
	assert_int_equal(st.tokens_resident, 40);
	assert_int_equal(st.tokens_appended, 0);
	assert_int_equal(st.prefill_layers, 1);
	assert_int_equal(st.decode_calls, 0);
	assert_int_equal(st.saves_submitted, 1);
	assert_int_equal(st.bytes_d2d, 2 * 40 * rb * H);
	assert_int_equal(st.bytes_d2h, 2 * 100 * rb * H);
	assert_int_equal(st.bytes_h2d, 0);

	/* Case 1 prompt on layer 1: 10 tokens, all resident; frames still cover sink + recent */
	tseq_prefill(m, &c, &b, 1);
	st = t_stats_of(m);
	assert_int_equal(st.device_frames_used, 2 * 5 + 2 * 3);
	assert_int_equal(st.host_blocks_used, 2 * 13 + 2 * 2);
	assert_int_equal(st.tokens_prompt, 110);
	assert_int_equal(st.tokens_saved, 110);
	assert_int_equal(st.tokens_resident, 50);
	assert_int_equal(st.prefill_layers, 2);
	assert_int_equal(st.saves_submitted, 2);
	assert_int_equal(st.bytes_d2d, 2 * 50 * rb * H);
	assert_int_equal(st.bytes_d2h, 2 * 110 * rb * H);

	/* 9 decode steps of a on layer 0 (100 -> 109 crosses the block boundary at 104) */
	batch[0] = &a;
	for (int i = 0; i < 9; i++)
		CHECK_RC(decode_step(m, &c, 0, batch, 1), 0);
	st = t_stats_of(m);
	assert_int_equal(st.host_blocks_used, 2 * 14 + 2 * 2);
	assert_int_equal(st.device_frames_used, 2 * 5 + 2 * 3);
	assert_int_equal(st.tokens_appended, 9);
	assert_int_equal(st.tokens_saved, 119);
	assert_int_equal(st.tokens_prompt, 110);
	assert_int_equal(st.decode_calls, 9);
	assert_int_equal(st.saves_submitted, 11);
	assert_int_equal(st.bytes_d2d, 2 * 50 * rb * H + 9 * 2 * rb * H);
	assert_int_equal(st.bytes_d2h, 2 * 110 * rb * H + 9 * 2 * rb * H);

	/* a batch of two on layer 1 needs both prefilled there: a is not -> nothing changes */
	batch[0] = &b;
	batch[1] = &a;
	CHECK_RC(decode_step(m, &c, 1, batch, 2), -EINVAL);
	{
		struct kvt_stats st2 = t_stats_of(m);

		CHECK_STATS_EQUAL(&st, &st2);
	}
	tseq_prefill(m, &c, &a, 1);
	CHECK_RC(decode_step(m, &c, 1, batch, 2), 0);
	st = t_stats_of(m);
	assert_int_equal(st.tokens_appended, 11);
	assert_int_equal(st.decode_calls, 10);
	check_usage(m, &c, (struct tseq[]){a, b}, 2);
	check_tokens(m, &c, &a);
	check_tokens(m, &c, &b);

	/* a device read counts in bytes_read (not in the save traffic of bytes_d2h); a
	   host-history read counts in neither */
	{
		uint8_t k[64], v[64];
		struct kvt_stats before = t_stats_of(m);

		CHECK_RC(kvt_seq_read_token(m, a.id, 0, 1, 3, k, v), 0); /* sink: resident */
		assert_int_equal(t_stats_of(m).bytes_read, before.bytes_read + 2 * rb);
		assert_int_equal(t_stats_of(m).bytes_d2h, before.bytes_d2h);
		CHECK_RC(kvt_seq_read_token_host(m, a.id, 0, 1, 3, k, v), 0);
		assert_int_equal(t_stats_of(m).bytes_read, before.bytes_read + 2 * rb);
		assert_int_equal(t_stats_of(m).bytes_d2h, before.bytes_d2h);
	}

	CHECK_RC(kvt_seq_destroy(m, a.id), 0);
	st = t_stats_of(m);
	assert_int_equal(st.live_seqs, 1);
	assert_int_equal(st.device_frames_used, 2 * 3);
	assert_int_equal(st.host_blocks_used, 2 * DIV_UP(11, 8));
	CHECK_RC(kvt_seq_destroy(m, b.id), 0);
	st = t_stats_of(m);
	assert_int_equal(st.live_seqs, 0);
	assert_int_equal(st.device_frames_used, 0);
	assert_int_equal(st.host_blocks_used, 0);
	assert_int_equal(st.device_frames_free, st.device_frames_total);
	assert_int_equal(st.host_blocks_free, st.host_blocks_total);
	/* counters are cumulative: destroy does not roll them back */
	assert_int_equal(st.tokens_saved, 121 + 100);
	CHECK_RC(kvt_seq_destroy(m, b.id), -ENOENT);
	tseq_fini(&a);
	tseq_fini(&b);
	kvt_manager_destroy(m);
}

/* ---- resident layout after prefill ------------------------------------------------------ */

/* Prefills one sequence of length L on layer 0 and checks positions, top-K, rows and
   attention. */
static void layout_case(const struct kvt_config *c, uint32_t L, uint64_t id)
{
	struct kvt_manager *m = t_mk(c);
	struct tseq t;

	tseq_init(&t, id, L);
	CHECK_RC(kvt_seq_create(m, id, L), 0);
	tseq_prefill(m, c, &t, 0);
	CHECK_RESIDENT(m, c, &t, 0);
	CHECK_READBACK(m, c, &t, 0);
	CHECK_ATTEND(m, c, &t, 0, id);
	check_usage(m, c, &t, 1);
	tseq_fini(&t);
	kvt_manager_destroy(m);
}

void test_layout_small_config(void **state)
{
	struct kvt_config c = t_small_config(); /* sink 8, recent 16, top-K 16, obs 4 */
	static const uint32_t lens[] = {1, 5, 8, 9, 20, 23, 24, 25, 26, 27, 40, 300, 517};

	(void)state;
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		layout_case(&c, lens[i], 1000 + i);

	/* Case 1 and the edges written out: every prompt position resident */
	for (uint32_t L = 1; L <= 26; L++) {
		struct kvt_manager *m = t_mk(&c);
		int32_t pos[64];
		uint32_t n = 0;

		CHECK_RC(kvt_seq_create(m, 5, L), 0);
		/* q_obs may be NULL when no selection happens */
		CHECK_RC(prefill_raw(m, &c, 5, 1, L, NULL, L <= 24), 0);
		CHECK_RC(kvt_seq_resident_positions(m, 5, 1, 1, pos, 64, &n), 0);
		/* L = 25: one candidate (8); L = 26: two (8, 9): still every position */
		assert_int_equal(n, L);
		for (uint32_t i = 0; i < n; i++)
			assert_int_equal(pos[i], i);
		kvt_manager_destroy(m);
	}

	/* a long prompt: 8 sink + 16 top-K + 16 recent */
	{
		struct kvt_manager *m = t_mk(&c);
		struct tseq t;
		int32_t pos[64];
		uint32_t n = 0;

		tseq_init(&t, 77, 300);
		CHECK_RC(kvt_seq_create(m, 77, 300), 0);
		tseq_prefill(m, &c, &t, 1);
		assert_int_equal(t.count, 16);
		for (uint32_t h = 0; h < c.n_kv_heads; h++) {
			CHECK_RC(kvt_seq_resident_positions(m, 77, 1, h, pos, 64, &n), 0);
			assert_int_equal(n, 40);
			for (uint32_t i = 0; i < 8; i++)
				assert_int_equal(pos[i], i);
			for (uint32_t i = 0; i < 16; i++) {
				assert_true(pos[8 + i] >= 8 && pos[8 + i] < 284);
				assert_int_equal(pos[8 + i], t.topk[1][h * 16 + i]);
			}
			for (uint32_t i = 0; i < 16; i++)
				assert_int_equal(pos[24 + i], 284 + i);
		}
		/* a top-K set that differs between heads (generator data: heads see other keys) */
		assert_memory_not_equal(t.topk[1], t.topk[1] + 16, 16 * sizeof(int32_t));
		/* layer 0 is not prefilled */
		CHECK_RC(kvt_seq_resident_positions(m, 77, 0, 0, pos, 64, &n), -EINVAL);
		tseq_fini(&t);
		kvt_manager_destroy(m);
	}
}

void test_layout_other_windows(void **state)
{
	struct kvt_config c;

	(void)state;
	/* obs window binds the candidates: [2, min(L - 4, L - 20)) */
	c = t_small_config();
	c.sink_tokens = 2;
	c.recent_tokens = 4;
	c.topk_tokens = 3;
	c.obs_window = 20;
	for (uint32_t L = 5; L <= 30; L++)
		layout_case(&c, L, 40 + L);
	layout_case(&c, 200, 41);

	/* prompt above sink + recent but not above the obs window: no selection */
	c.obs_window = 8;
	layout_case(&c, 7, 50);
	layout_case(&c, 8, 51);
	layout_case(&c, 9, 52);
	{
		struct kvt_manager *m = t_mk(&c);
		int32_t pos[16];
		uint32_t n = 0;

		CHECK_RC(kvt_seq_create(m, 9, 7), 0);
		CHECK_RC(prefill_raw(m, &c, 9, 0, 7, NULL, true), 0);
		CHECK_RC(kvt_seq_resident_positions(m, 9, 0, 0, pos, 16, &n), 0);
		assert_int_equal(n, 6);
		assert_memory_equal(pos, ((int32_t[]){0, 1, 3, 4, 5, 6}), 6 * sizeof(int32_t));
		kvt_manager_destroy(m);
	}

	/* no top-K at all */
	c = t_small_config();
	c.topk_tokens = 0;
	layout_case(&c, 100, 60);
	layout_case(&c, 25, 61);

	/* sink 0: top-K may start at position 0 */
	c = t_small_config();
	c.sink_tokens = 0;
	for (uint32_t L = 1; L <= 40; L += 3)
		layout_case(&c, L, 70 + L);
	layout_case(&c, 333, 71);

	/* windows that are not multiples of the block: slots cross frame boundaries */
	c = t_small_config();
	c.sink_tokens = 5;
	c.recent_tokens = 13;
	c.topk_tokens = 11;
	for (uint32_t L = 1; L <= 40; L += 2)
		layout_case(&c, L, 90 + L);
	layout_case(&c, 401, 91);
	c.block_tokens = 64;
	layout_case(&c, 401, 92);
	layout_case(&c, 17, 93);
}

/* Hand-made tensors whose top-K is known without running SnapKV: every key is zero except at
   a few positions per head, where it points along the (shared) query direction. Those
   positions get the highest vote, and pooling (kernel 3) keeps each peak above its
   neighbours. */
void test_topk_known(void **state)
{
	struct kvt_config c = t_small_config();
	static const int32_t peaks[2][5] = {{40, 77, 123, 150, 183}, {10, 50, 90, 131, 170}};
	uint32_t L = 200, D = c.head_dim, K = 5;
	size_t n_kv = (size_t)c.n_kv_heads * L * D, n_q = (size_t)c.n_q_heads * c.obs_window * D;
	float *kf = calloc(n_kv, sizeof(float)), *vf = calloc(n_kv, sizeof(float));
	float *qf = calloc(n_q, sizeof(float));
	uint16_t *k = t_xmalloc(n_kv * 2), *v = t_xmalloc(n_kv * 2), *q = t_xmalloc(n_q * 2);
	struct kvt_manager *m;
	int32_t pos[64];
	uint32_t n = 0;

	(void)state;
	assert_non_null(kf);
	assert_non_null(vf);
	assert_non_null(qf);
	c.topk_tokens = K;
	c.pool_kernel = 1; /* with pooling, a peak and its neighbour would tie */
	for (size_t i = 0; i < n_q; i += D)
		qf[i] = 4.0f;
	for (uint32_t h = 0; h < 2; h++)
		for (uint32_t i = 0; i < K; i++)
			kf[((size_t)h * L + (uint32_t)peaks[h][i]) * D] = 4.0f;
	for (size_t i = 0; i < n_kv; i++)
		vf[i] = (float)(i % 7) / 8.0f;
	kvt_from_f32(c.dtype, kf, k, n_kv);
	kvt_from_f32(c.dtype, vf, v, n_kv);
	kvt_from_f32(c.dtype, qf, q, n_q);
	m = t_mk(&c);
	CHECK_RC(kvt_seq_create(m, 3, L), 0);
	CHECK_RC(t_prefill_layer(m, 3, 0, k, v, q, NULL), 0);
	for (uint32_t h = 0; h < 2; h++) {
		CHECK_RC(kvt_seq_resident_positions(m, 3, 0, h, pos, 64, &n), 0);
		assert_int_equal(n, 8 + K + 16);
		assert_memory_equal(pos + 8, peaks[h], K * sizeof(int32_t));
		/* the top-K rows themselves are resident and exact */
		for (uint32_t i = 0; i < K; i++) {
			uint16_t gk[16], gv[16];
			size_t off = ((size_t)h * L + (uint32_t)peaks[h][i]) * D;

			CHECK_RC(kvt_seq_read_token(m, 3, 0, h, (uint32_t)peaks[h][i], gk, gv), 0);
			assert_memory_equal(gk, k + off, D * 2);
			assert_memory_equal(gv, v + off, D * 2);
		}
	}
	kvt_manager_destroy(m);
	free(kf);
	free(vf);
	free(qf);
	free(k);
	free(v);
	free(q);
}

void test_resident_enospc(void **state)
{
	struct kvt_config c = t_small_config();
	struct kvt_manager *m = t_mk(&c);
	int32_t pos[64];
	uint32_t n;

	(void)state;
	CHECK_RC(kvt_seq_create(m, 11, 300), 0);
	CHECK_RC(prefill_raw(m, &c, 11, 0, 300, NULL, false), 0);
	for (int i = 0; i < 64; i++)
		pos[i] = -7;
	n = 0;
	CHECK_RC(kvt_seq_resident_positions(m, 11, 0, 1, pos, 39, &n), -ENOSPC);
	assert_int_equal(n, 40);
	for (int i = 0; i < 64; i++)
		assert_int_equal(pos[i], -7); /* nothing written */
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	n = 0;
	CHECK_RC(kvt_seq_resident_positions(m, 11, 0, 0, NULL, 0, &n), -ENOSPC);
	assert_int_equal(n, 40);
	n = 0;
	CHECK_RC(kvt_seq_resident_positions(m, 11, 0, 0, pos, 1, &n), -ENOSPC);
	assert_int_equal(n, 40);
	assert_int_equal(pos[0], -7);
	n = 0;
	CHECK_RC(kvt_seq_resident_positions(m, 11, 0, 0, pos, 40, &n), 0);
	assert_int_equal(n, 40);
	/* a short Case-1 prompt: cap 0 still reports the count */
	CHECK_RC(kvt_seq_create(m, 12, 3), 0);
	CHECK_RC(prefill_raw(m, &c, 12, 1, 3, NULL, true), 0);
	n = 0;
	CHECK_RC(kvt_seq_resident_positions(m, 12, 1, 0, NULL, 0, &n), -ENOSPC);
	assert_int_equal(n, 3);
	CHECK_RC(kvt_seq_resident_positions(m, 12, 1, 0, pos, 3, &n), 0);
	assert_memory_equal(pos, ((int32_t[]){0, 1, 2}), 3 * sizeof(int32_t));
	CHECK_RC(kvt_seq_resident_positions(m, 12, 1, 0, pos, 64, NULL), -EINVAL);
	CHECK_RC(kvt_seq_resident_positions(m, 12, 1, 2, pos, 64, &n), -EINVAL);
	CHECK_RC(kvt_seq_resident_positions(m, 13, 1, 0, pos, 64, &n), -ENOENT);
	kvt_manager_destroy(m);
}
