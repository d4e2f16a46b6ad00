/* SPDX-License-Identifier: MIT */
/*
 * errors: prefill and decode on bad arguments and on full tiers.
 */
#include "test_errors.h"

/* ---- prefill ---------------------------------------------------------------------------- */

struct tensors {
	void *k, *v, *q;
};

static struct tensors make_prefill(const struct fx *f, uint64_t seq, uint32_t layer, uint32_t L)
{
	size_t kv = (size_t)f->c.n_kv_heads * L * f->row;
	size_t qb = (size_t)f->c.n_q_heads * (f->c.obs_window ? f->c.obs_window : 1) * f->row;
	struct tensors t = {malloc(kv), malloc(kv), malloc(qb)};

	assert_true(t.k && t.v && t.q);
	t_fill_prefill(&f->c, seq, layer, L, t.k, t.v, f->c.obs_window ? t.q : NULL);
	return t;
}

static void free_tensors(struct tensors *t)
{
	free(t->k);
	free(t->v);
	free(t->q);
}

void test_prefill_errors(void **state)
{
	struct fx *f = *state;
	struct tensors a1 = make_prefill(f, SEQ_A, 1, 40), a0 = make_prefill(f, SEQ_A, 0, 40);
	struct tensors c0 = make_prefill(f, SEQ_C, 0, 30);

	assert_int_equal(t_prefill_layer(NULL, SEQ_A, 1, a1.k, a1.v, a1.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_NONE, 0, c0.k, c0.v, c0.q, NULL), -ENOENT);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_C, 2, c0.k, c0.v, c0.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_C, UINT32_MAX, c0.k, c0.v, c0.q, NULL), -EINVAL);
	/* Second prefill of a layer, with perfectly good tensors. */
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 0, a0.k, a0.v, a0.q, NULL), -EEXIST);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_B, 1, a0.k, a0.v, NULL, NULL), -EEXIST);
	/* NULL tensors. */
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, NULL, a1.v, a1.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, a1.k, NULL, a1.q, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, NULL, NULL, NULL, NULL), -EINVAL);
	/* A's prompt (40 > sink 8 + recent 16) needs the observation queries. */
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_A, 1, a1.k, a1.v, NULL, NULL), -EINVAL);
	EXPECT_FAIL(f, t_prefill_layer(f->m, SEQ_C, 0, c0.k, c0.v, NULL, NULL), -EINVAL);

	/* After all that, the same layers prefill normally and read back exactly. */
	assert_int_equal(t_prefill_layer(f->m, SEQ_A, 1, a1.k, a1.v, a1.q, NULL), 0);
	f->ntok[0][1] = 40;
	assert_int_equal(t_prefill_layer(f->m, SEQ_C, 0, c0.k, c0.v, c0.q, NULL), 0);
	f->ntok[2][0] = 30;
	fx_snapshot_positions(f);
	assert_int_equal(f->npos[0][1][0], 40);		/* 8 sink + 16 top-K + 16 ring */
	assert_int_equal(f->npos[2][0][1], 8 + 6 + 16); /* candidates [8, 14) */
	CHECK_STATE(f);
	free_tensors(&a1);
	free_tensors(&a0);
	free_tensors(&c0);
}

/* q_obs may be NULL exactly when no selection happens. */
void test_prefill_q_obs_optional(void **state)
{
	struct fx *f = *state;
	/* Case 1: prompt <= sink + recent (24); also a prompt shorter than the sink, and one
	   no longer than the observation window. */
	const uint32_t no_sel[] = {24, 23, 9, 8, 5, 4, 1};

	for (size_t i = 0; i < sizeof(no_sel) / sizeof(no_sel[0]); i++) {
		uint32_t L = no_sel[i], n;
		uint64_t id = 500 + i;
		struct tensors t = make_prefill(f, id, 0, L);
		int32_t pos[MAX_POS];
		uint8_t k[64], v[64], ek[64], ev[64];

		assert_int_equal(kvt_seq_create(f->m, id, L), 0);
		assert_int_equal(t_prefill_layer(f->m, id, 0, t.k, t.v, NULL, NULL), 0);
		/* Every prompt token is resident. */
		assert_int_equal(kvt_seq_resident_positions(f->m, id, 0, 1, pos, MAX_POS, &n), 0);
		assert_int_equal(n, L);
		for (uint32_t p = 0; p < L; p++) {
			assert_int_equal(pos[p], (int32_t)p);
			assert_int_equal(kvt_seq_read_token(f->m, id, 0, 1, p, k, v), 0);
			t_fill_row(f->c.dtype, f->c.head_dim, ek, id, 0, 1, p, 0);
			t_fill_row(f->c.dtype, f->c.head_dim, ev, id, 0, 1, p, 1);
			assert_memory_equal(k, ek, f->row);
			assert_memory_equal(v, ev, f->row);
		}
		assert_int_equal(kvt_seq_destroy(f->m, id), 0);
		free_tensors(&t);
	}
	/* One token past Case 1 selects one token: q_obs is required. */
	{
		struct tensors t = make_prefill(f, 600, 0, 25);

		assert_int_equal(kvt_seq_create(f->m, 600, 25), 0);
		EXPECT_FAIL(f, t_prefill_layer(f->m, 600, 0, t.k, t.v, NULL, NULL), -EINVAL);
		uint32_t n;

		assert_int_equal(kvt_seq_tokens(f->m, 600, 0, &n), 0);
		assert_int_equal(n, 0);
		assert_int_equal(t_prefill_layer(f->m, 600, 0, t.k, t.v, t.q, NULL), 0);
		assert_int_equal(kvt_seq_destroy(f->m, 600), 0);
		free_tensors(&t);
	}
	/* Without top-K there is never a selection. */
	{
		struct kvt_config c = t_small_config();
		struct kvt_manager *m;
		struct fx g = *f;
		uint32_t n;

		c.topk_tokens = 0;
		c.obs_window = 0;
		g.c = c;
		struct tensors t = make_prefill(&g, 1, 0, 100);

		assert_int_equal(t_manager_create(&c, &m), 0);
		assert_int_equal(kvt_seq_create(m, 1, 100), 0);
		assert_int_equal(t_prefill_layer(m, 1, 0, t.k, t.v, NULL, NULL), 0);
		assert_int_equal(kvt_seq_resident_positions(m, 1, 0, 0, NULL, 0, &n), -ENOSPC);
		assert_int_equal(n, 8 + 16);
		kvt_manager_destroy(m);
		free_tensors(&t);
	}
}

/* A tier that cannot hold the layer: -ENOMEM and nothing allocated, in either tier. */
void test_prefill_tier_full(void **state)
{
	(void)state;
	for (int which = 0; which < 2; which++) {
		struct fx g = {0};
		struct kvt_manager *m;
		struct kvt_stats s0, s1;

		g.c = t_small_config();
		g.row = (size_t)g.c.head_dim * 2;
		/* Prompt 40: 5 frame groups (sink + recent + top-K = 40 slots) and 5 host groups
		   per layer. The short tier holds one layer and a bit. */
		if (which == 0)
			g.c.device_bytes = 7 * 1024;
		else
			g.c.host_bytes = 7 * 1024;
		struct tensors t1 = make_prefill(&g, 1, 0, 40), t2 = make_prefill(&g, 2, 0, 40);

		assert_int_equal(t_manager_create(&g.c, &m), 0);
		assert_int_equal(kvt_seq_create(m, 1, 40), 0);
		assert_int_equal(kvt_seq_create(m, 2, 40), 0);
		assert_int_equal(t_prefill_layer(m, 1, 0, t1.k, t1.v, t1.q, NULL), 0);
		s0 = t_stats_of(m);
		m->err[0] = '\0';
		assert_int_equal(t_prefill_layer(m, 2, 0, t2.k, t2.v, t2.q, NULL), -ENOMEM);
		assert_true(strlen(kvt_manager_last_error(m)) > 0);
		s1 = t_stats_of(m);
		assert_memory_equal(&s0, &s1, sizeof(s0));
		uint32_t n = 1;

		assert_int_equal(kvt_seq_tokens(m, 2, 0, &n), 0);
		assert_int_equal(n, 0);
		/* Room made: the very same call now succeeds, and both groups of memory it
		   took come back on destroy. */
		assert_int_equal(kvt_seq_destroy(m, 1), 0);
		assert_int_equal(t_prefill_layer(m, 2, 0, t2.k, t2.v, t2.q, NULL), 0);
		s1 = t_stats_of(m);
		assert_int_equal(s1.device_frames_used, 5 * 2);
		assert_int_equal(s1.host_blocks_used, 5 * 2);
		uint8_t k[32], v[32], ek[32];

		assert_int_equal(kvt_seq_read_token(m, 2, 0, 1, 39, k, v), 0);
		t_fill_row(g.c.dtype, g.c.head_dim, ek, 2, 0, 1, 39, 0);
		assert_memory_equal(k, ek, 32);
		assert_int_equal(kvt_seq_destroy(m, 2), 0);
		s1 = t_stats_of(m);
		assert_int_equal(s1.device_frames_used, 0);
		assert_int_equal(s1.host_blocks_used, 0);
		kvt_manager_destroy(m);
		free_tensors(&t1);
		free_tensors(&t2);
	}
}

/* ---- decode ----------------------------------------------------------------------------- */

/* Decode tensors for ids with junk contents (so a call that wrongly writes anything shows up
   in the read-back). */
static void junk_decode(const struct fx *f, uint32_t n, void **k, void **v)
{
	size_t bytes = (size_t)n * f->c.n_kv_heads * f->row;

	*k = malloc(bytes);
	*v = malloc(bytes);
	assert_true(*k && *v);
	memset(*k, 0x7b, bytes);
	memset(*v, 0x3d, bytes);
}

void test_decode_errors(void **state)
{
	struct fx *f = *state;
	const uint64_t a[1] = {SEQ_A}, ab[2] = {SEQ_A, SEQ_B};
	void *k, *v;

	junk_decode(f, 3, &k, &v);
	assert_int_equal(t_decode_append(NULL, 0, a, 1, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, NULL, 1, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, a, 1, NULL, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, a, 1, k, NULL, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, a, 0, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 0, ab, 0, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, 2, a, 1, k, v, NULL), -EINVAL);
	EXPECT_FAIL(f, t_decode_append(f->m, UINT32_MAX, ab, 2, k, v, NULL), -EINVAL);
	{
		const uint64_t none[1] = {SEQ_NONE};

		EXPECT_FAIL(f, t_decode_append(f->m, 0, none, 1, k, v, NULL), -ENOENT);
	}
	/* Decode before prefill: C has no layer at all, A has no layer 1. */
	{
		const uint64_t c[1] = {SEQ_C};

		EXPECT_FAIL(f, t_decode_append(f->m, 0, c, 1, k, v, NULL), -EINVAL);
		EXPECT_FAIL(f, t_decode_append(f->m, 1, a, 1, k, v, NULL), -EINVAL);
	}
	/* A repeated id. */
	{
		const uint64_t aa[2] = {SEQ_A, SEQ_A}, aba[3] = {SEQ_A, SEQ_B, SEQ_A};

		EXPECT_FAIL(f, t_decode_append(f->m, 0, aa, 2, k, v, NULL), -EINVAL);
		EXPECT_FAIL(f, t_decode_append(f->m, 0, aba, 3, k, v, NULL), -EINVAL);
	}
	free(k);
	free(v);
	DECODE_ROUNDS(f, 20);
}

/* All or nothing: only the last id of the batch is bad; the earlier ones (B sits at a block
   boundary, so it needs a new host block) must not have moved at all. Then the same earlier
   ids decode normally, at the positions they had. */
void test_decode_last_bad(void **state)
{
	struct fx *f = *state;
	void *k, *v;
	struct {
		uint64_t ids[3];
		int code;
	} cases[] = {
		{{SEQ_A, SEQ_B, SEQ_NONE}, -ENOENT},
		{{SEQ_A, SEQ_B, SEQ_C}, -EINVAL}, /* C not prefilled */
		{{SEQ_A, SEQ_B, SEQ_B}, -EINVAL}, /* repeat, last */
		{{SEQ_B, SEQ_A, SEQ_B}, -EINVAL}, /* repeat of the first */
		{{SEQ_B, SEQ_A, SEQ_A}, -EINVAL},
	};

	junk_decode(f, 3, &k, &v);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		EXPECT_FAIL(f, t_decode_append(f->m, 0, cases[i].ids, 3, k, v, NULL),
			    cases[i].code);
	/* Layer 1: B is prefilled there, A is not (last). */
	{
		const uint64_t ba[2] = {SEQ_B, SEQ_A};

		EXPECT_FAIL(f, t_decode_append(f->m, 1, ba, 2, k, v, NULL), -EINVAL);
	}
	free(k);
	free(v);
	/* The same batch heads decode for real now: tokens land at 45 (A) and 24 (B). */
	const int ab[2] = {0, 1};

	fx_decode(f, 0, ab, 2);
	assert_int_equal(f->ntok[0][0], 46);
	assert_int_equal(f->ntok[1][0], 25);
	fx_snapshot_positions(f);
	CHECK_STATE(f);
	DECODE_ROUNDS(f, 20);
}

/* -EOVERFLOW at INT32_MAX tokens (reached here by setting the count directly: 2^31 real
   appends are out of reach), as the last sequence of a batch. */
void test_decode_overflow(void **state)
{
	struct fx *f = *state;
	struct kvt_seq *s = kvt_seqmap_get(&f->m->seqs, SEQ_B);
	const uint64_t ab[2] = {SEQ_A, SEQ_B};
	uint32_t saved;
	void *k, *v;

	assert_non_null(s);
	saved = s->layers[0].n_tokens;
	s->layers[0].n_tokens = INT32_MAX;
	junk_decode(f, 2, &k, &v);
	{
		struct kvt_stats before = t_stats_of(f->m), after;
		uint32_t n;

		f->m->err[0] = '\0';
		assert_int_equal(t_decode_append(f->m, 0, ab, 2, k, v, NULL), -EOVERFLOW);
		assert_true(strlen(kvt_manager_last_error(f->m)) > 0);
		after = t_stats_of(f->m);
		assert_memory_equal(&before, &after, sizeof(before));
		assert_int_equal(kvt_seq_tokens(f->m, SEQ_B, 0, &n), 0);
		assert_int_equal(n, INT32_MAX);
	}
	s->layers[0].n_tokens = saved;
	CHECK_STATE(f);
	free(k);
	free(v);
	DECODE_ROUNDS(f, 20);
}

/* Host tier full at the last sequence: -ENOMEM, and the groups counted for the earlier ones
   are not taken. */
void test_decode_host_full(void **state)
{
	struct fx g = {0};
	struct kvt_manager *m;
	struct kvt_stats s0, s1;
	const uint64_t ids[3] = {1, 2, 3};
	void *k, *v;

	(void)state;
	g.c = t_small_config();
	g.row = (size_t)g.c.head_dim * 2;
	/* Three sequences of 8 tokens (1 host group each, full), 4 groups in the tier: the
	   next token of each needs a group, only one is left. */
	g.c.host_bytes = 4 * 1024;
	assert_int_equal(t_manager_create(&g.c, &m), 0);
	for (uint64_t i = 1; i <= 3; i++) {
		struct tensors t = make_prefill(&g, i, 0, 8);

		assert_int_equal(kvt_seq_create(m, i, 8), 0);
		assert_int_equal(t_prefill_layer(m, i, 0, t.k, t.v, NULL, NULL), 0);
		free_tensors(&t);
	}
	junk_decode(&g, 3, &k, &v);
	s0 = t_stats_of(m);
	assert_int_equal(s0.host_blocks_free, 1 * 2);
	m->err[0] = '\0';
	assert_int_equal(t_decode_append(m, 0, ids, 3, k, v, NULL), -ENOMEM);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	m->err[0] = '\0';
	assert_int_equal(t_decode_append(m, 0, ids, 2, k, v, NULL), -ENOMEM);
	assert_true(strlen(kvt_manager_last_error(m)) > 0);
	s1 = t_stats_of(m);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	for (uint64_t i = 1; i <= 3; i++) {
		uint32_t n;
		uint8_t rk[32], rv[32], ek[32];

		assert_int_equal(kvt_seq_tokens(m, i, 0, &n), 0);
		assert_int_equal(n, 8);
		for (uint32_t p = 0; p < 8; p++) {
			assert_int_equal(kvt_seq_read_token(m, i, 0, 0, p, rk, rv), 0);
			t_fill_row(g.c.dtype, g.c.head_dim, ek, i, 0, 0, p, 0);
			assert_memory_equal(rk, ek, 32);
		}
	}
	/* One sequence fits. */
	{
		uint32_t p8 = 8;

		t_fill_decode(&g.c, &ids[2], &p8, 1, 0, k, v);
		assert_int_equal(t_decode_append(m, 0, &ids[2], 1, k, v, NULL), 0);
		s1 = t_stats_of(m);
		assert_int_equal(s1.host_blocks_free, 0);
	}
	kvt_manager_destroy(m);
	free(k);
	free(v);
}
