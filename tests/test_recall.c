/* SPDX-License-Identifier: MIT */
/*
 * recall: block metadata and the Quest bound (policy/recall.c), the shared recall cache (LRU,
 * hit detection, capacity), recall views and their resident masks, attention over recalled
 * blocks, the recall working set, and preemption/resume (manager/recall.c, manager/seq.c), on
 * the host backend. Expectations come from the generator in lib/t_data.h and plain loops here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "base.h"
#include "policy.h"
#include "recall.h"
#include "util.h"

#define NONE UINT32_MAX

/* t_small_config with recall: bt 8, d 16, f16, 512-byte blocks; 2048 recall frames. */
static struct kvt_config recall_config(uint32_t r, uint64_t cache_frames)
{
	struct kvt_config c = t_small_config();

	c.recall_blocks = r;
	c.recall_cache_bytes = cache_frames * 2 * c.block_tokens * t_rowb(&c);
	c.device_bytes += c.recall_cache_bytes;
	return c;
}

/* Appends one token to seq on layer l (at its current length). */
static void decode_layer(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
			 uint32_t l)
{
	size_t row = t_rowb(c);
	void *k = t_xmalloc(c->n_kv_heads * row), *v = t_xmalloc(c->n_kv_heads * row);
	uint32_t pos;

	CHECK_RC(kvt_seq_tokens(m, seq, l, &pos), 0);
	t_fill_decode(c, &seq, &pos, 1, l, k, v);
	CHECK_RC(t_decode_append(m, l, &seq, 1, k, v, NULL), 0);
	free(k);
	free(v);
}

/* Appends `steps` tokens to seq on every layer (positions from its current length). */
static void decode(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t steps)
{
	for (uint32_t t = 0; t < steps; t++)
		for (uint32_t l = 0; l < c->n_layers; l++)
			decode_layer(m, c, seq, l);
}

/* Decode queries of one sequence ([n_q_heads][D] of dtype) and the same in f32. */
static void make_query(const struct kvt_config *c, uint64_t seq, uint32_t salt, void *q, float *qf)
{
	size_t row = t_rowb(c);

	for (uint32_t g = 0; g < c->n_q_heads; g++)
		t_fill_row(c->dtype, c->head_dim, (uint8_t *)q + g * row, seq, 77, 2000 + g, salt,
			   0);
	kvt_to_f32(c->dtype, q, qf, (size_t)c->n_q_heads * c->head_dim);
}

/* Dense attention over positions [0, N) of (seq, layer) from the generator. */
static void full_attention(const struct kvt_config *c, uint64_t seq, uint32_t layer, uint32_t N,
			   const float *q, float *out)
{
	size_t row = t_rowb(c);
	uint8_t *k = t_xmalloc(N * row), *v = t_xmalloc(N * row);
	uint32_t G = c->n_q_heads / c->n_kv_heads;

	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		for (uint32_t p = 0; p < N; p++) {
			t_fill_row(c->dtype, c->head_dim, k + p * row, seq, layer, h, p, 0);
			t_fill_row(c->dtype, c->head_dim, v + p * row, seq, layer, h, p, 1);
		}
		struct kvt_attend_rows seg = {k, v, row, row, N};

		kvt_attend_rows(c->dtype, c->head_dim, q + (size_t)h * G * c->head_dim, G, &seg, 1,
				out + (size_t)h * G * c->head_dim);
	}
	free(k);
	free(v);
}

static bool is_resident(const int32_t *pos, uint32_t n, uint32_t p)
{
	for (uint32_t i = 0; i < n; i++)
		if ((uint32_t)pos[i] == p)
			return true;
	return false;
}

/* ---- policy: metadata, bound, top-r ------------------------------------------------------ */

static void test_meta_bound(void **state)
{
	static const enum kvt_dtype dts[] = {KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16};
	enum { D = 24, NR = 32, G = 3 };
	uint64_t rng = 12345;
	(void)state;

	for (int di = 0; di < 3; di++) {
		enum kvt_dtype dt = dts[di];
		uint32_t es = kvt_dtype_size(dt);

		for (int trial = 0; trial < 200; trial++) {
			uint8_t rows[NR * D * 4], meta[2 * D * 4], meta2[2 * D * 4];
			float kf[NR * D], mf[2 * D], q[G * D], scratch[2 * D];
			uint32_t n = 1 + (uint32_t)(t_mix(rng++) % NR);

			for (uint32_t i = 0; i < n * D; i++)
				kf[i] = (float)((int64_t)(t_mix(rng++) % 2001) - 1000) / 64.0f;
			kvt_from_f32(dt, kf, rows, (size_t)n * D);
			kvt_to_f32(dt, rows, kf, (size_t)n * D); /* the values as stored */
			for (uint32_t i = 0; i < G * D; i++)
				q[i] = (float)((int64_t)(t_mix(rng++) % 2001) - 1000) / 100.0f;
			kvt_meta_build(dt, D, meta, rows, (size_t)D * es, n);
			/* incremental equals batch */
			kvt_meta_init(dt, D, meta2, rows);
			for (uint32_t i = 1; i < n; i++)
				kvt_meta_add(dt, D, meta2, rows + (size_t)i * D * es);
			assert_memory_equal(meta, meta2, 2 * D * es);
			/* min/max per channel equal the naive ones */
			kvt_to_f32(dt, meta, mf, 2 * D);
			for (uint32_t d = 0; d < D; d++) {
				float mn = kf[d], mx = kf[d];

				for (uint32_t i = 1; i < n; i++) {
					mn = fminf(mn, kf[i * D + d]);
					mx = fmaxf(mx, kf[i * D + d]);
				}
				assert_true(mf[d] == mn && mf[D + d] == mx);
			}
			/* the bound is never below any q.k (f32, d ascending) */
			float bound = kvt_meta_bound(dt, D, meta, q, G, scratch), best = -INFINITY;

			for (uint32_t g = 0; g < G; g++)
				for (uint32_t i = 0; i < n; i++) {
					float s = 0.0f;

					for (uint32_t d = 0; d < D; d++)
						s += q[g * D + d] * kf[i * D + d];
					best = fmaxf(best, s);
				}
			if (bound < best) {
				print_error("dtype %d trial %d: bound %g below true max %g\n", dt,
					    trial, bound, best);
				fail();
			}
			/* one row: the bound is exactly the max dot product */
			if (n == 1)
				assert_true(bound == best);
		}
	}
}

static void test_topr(void **state)
{
	float sc[] = {1.0f, 5.0f, NAN, 5.0f, -INFINITY, 3.0f, 5.0f, 0.5f};
	uint32_t id[] = {10, 20, 30, 40, 50, 60, 70, 80}, out[8], heap[8];
	(void)state;

	/* 5.0 at ids 20, 40, 70: ties to the lower ids; then 3.0 (60) */
	assert_int_equal(kvt_topr(sc, id, 8, 2, out, heap), 2);
	assert_int_equal(out[0], 20);
	assert_int_equal(out[1], 40);
	assert_int_equal(kvt_topr(sc, id, 8, 4, out, heap), 4);
	assert_int_equal(out[0], 20);
	assert_int_equal(out[1], 40);
	assert_int_equal(out[2], 60);
	assert_int_equal(out[3], 70);
	/* everything: NaN last, -inf before it; output ascending ids */
	assert_int_equal(kvt_topr(sc, id, 8, 8, out, heap), 8);
	for (int i = 0; i < 8; i++)
		assert_int_equal(out[i], id[i]);
	assert_int_equal(kvt_topr(sc, id, 8, 7, out, heap), 7);
	for (int i = 0; i < 7; i++)
		assert_int_not_equal(out[i], 30); /* NaN ranks lowest */
	assert_int_equal(kvt_topr(sc, id, 0, 3, out, heap), 0);
	assert_int_equal(kvt_topr(sc, id, 8, 0, out, heap), 0);

	/* random cross-check against a naive selection */
	uint64_t rng = 99;

	for (int trial = 0; trial < 300; trial++) {
		float s[64];
		uint32_t ids[64], o[64], hp[64], n = 1 + (uint32_t)(t_mix(rng++) % 64);
		uint32_t r = 1 + (uint32_t)(t_mix(rng++) % 20);
		bool taken[64] = {0};

		for (uint32_t i = 0; i < n; i++) {
			s[i] = (float)(t_mix(rng++) % 7); /* many ties */
			ids[i] = i * 3;
		}
		uint32_t k = kvt_topr(s, ids, n, r, o, hp);

		assert_int_equal(k, n < r ? n : r);
		for (uint32_t j = 0; j < k; j++) { /* naive: best remaining, lowest id */
			uint32_t b = NONE;

			for (uint32_t i = 0; i < n; i++)
				if (!taken[i] && (b == NONE || s[i] > s[b]))
					b = i;
			taken[b] = true;
		}
		for (uint32_t j = 0; j < k; j++) {
			assert_true(taken[o[j] / 3]);
			if (j)
				assert_true(o[j] > o[j - 1]);
		}
	}
}

/* ---- manager: recall ---------------------------------------------------------------------- */

/* With r large enough to recall every block, attention equals full attention over all N
   tokens, both through scoring (kvt_decode_recall) and an explicit list. Views: blocks are not
   fully resident, masks are exactly the resident positions. */
static void test_recall_all_equals_full(void **state)
{
	struct kvt_config c = recall_config(64, 1024);
	struct kvt_manager *m = t_mk(&c);
	size_t row = t_rowb(&c);
	uint64_t seq = 5;
	uint32_t L = 203, N, nb;
	(void)state;

	t_prefill_seq(m, &c, seq, L);
	decode(m, &c, seq, 37); /* the ring has moved past prompt tokens */
	CHECK_RC(kvt_seq_tokens(m, seq, 0, &N), 0);
	assert_int_equal(N, L + 37);
	nb = DIV_UP(N, c.block_tokens);

	void *q = t_xmalloc(c.n_q_heads * row);
	float *qf = t_xmalloc(c.n_q_heads * c.head_dim * sizeof(float));
	float *want = t_xmalloc(c.n_q_heads * c.head_dim * sizeof(float));
	float *got = t_xmalloc(c.n_q_heads * c.head_dim * sizeof(float));
	float *before = t_xmalloc(c.n_q_heads * c.head_dim * sizeof(float));
	int32_t pos[512];
	struct kvt_recall_ref refs[64];

	for (uint32_t l = 0; l < c.n_layers; l++) {
		uint32_t np, nr;

		make_query(&c, seq, l, q, qf);
		CHECK_RC(kvt_attend(m, seq, l, qf, before), 0); /* resident set only */
		CHECK_RC(t_decode_recall(m, l, &seq, 1, q, NULL), 0);
		CHECK_RC(kvt_attend(m, seq, l, qf, got), 0);
		full_attention(&c, seq, l, N, qf, want);
		float diff = 0, moved = 0;

		for (uint32_t i = 0; i < c.n_q_heads * c.head_dim; i++) {
			diff = fmaxf(diff, fabsf(got[i] - want[i]));
			moved = fmaxf(moved, fabsf(before[i] - want[i]));
		}
		print_message("# layer %u: |recall - full| %.3g, |resident only - full| %.3g\n", l,
			      diff, moved);
		assert_true(diff < 1e-5f);
		assert_true(moved > 1e-3f); /* the recalled blocks matter */

		for (uint32_t h = 0; h < c.n_kv_heads; h++) {
			uint32_t covered = 0;

			CHECK_RC(kvt_seq_resident_positions(m, seq, l, h, pos, 512, &np), 0);
			CHECK_RC(kvt_seq_recall_view(m, seq, l, h, refs, 64, &nr), 0);
			assert_true(nr > 0 && nr <= nb);
			for (uint32_t i = 0; i < nr; i++) {
				uint64_t full = (1ull << refs[i].n_valid) - 1;

				if (i)
					assert_true(refs[i].block > refs[i - 1].block);
				assert_true(refs[i].resident != full); /* not fully resident */
				for (uint32_t j = 0; j < refs[i].n_valid; j++) {
					uint32_t p = refs[i].block * c.block_tokens + j;
					bool res = (refs[i].resident >> j) & 1;

					assert_int_equal(res, is_resident(pos, np, p));
					covered += !res;
					/* the frame holds the token, bit for bit */
					uint8_t *kk = t_xmalloc(row), *kgot = t_xmalloc(row);

					t_fill_row(c.dtype, c.head_dim, kk, seq, l, h, p, 0);
					t_dev_read(kgot, refs[i].frame + j * row, row);
					assert_memory_equal(kgot, kk, row);
					free(kk);
					free(kgot);
				}
			}
			assert_int_equal(covered + np, N); /* every token exactly once */
		}
	}

	/* Explicit list of every block (fully resident ones and repeats are ignored) gives the
	   same attention; all hits now. */
	struct kvt_stats s0 = t_stats_of(m);
	uint32_t *sel = t_xmalloc((size_t)c.n_kv_heads * (nb + 2) * sizeof(uint32_t));

	for (uint32_t h = 0; h < c.n_kv_heads; h++) {
		for (uint32_t b = 0; b < nb; b++)
			sel[h * (nb + 2) + b] = b;
		sel[h * (nb + 2) + nb] = 3;	   /* repeat */
		sel[h * (nb + 2) + nb + 1] = NONE; /* ignored */
	}
	make_query(&c, seq, 0, q, qf);
	CHECK_RC(kvt_recall_blocks(m, 0, &seq, 1, sel, nb + 2, NULL), 0);
	struct kvt_stats s1 = t_stats_of(m);

	assert_int_equal(s1.recall_loads, s0.recall_loads);
	assert_int_equal(s1.recall_hits - s0.recall_hits, s1.recall_lookups - s0.recall_lookups);
	CHECK_RC(kvt_attend(m, seq, 0, qf, got), 0);
	full_attention(&c, seq, 0, N, qf, want);
	for (uint32_t i = 0; i < c.n_q_heads * c.head_dim; i++)
		assert_true(fabsf(got[i] - want[i]) < 1e-5f);

	/* After one more token the partial last block grew: it is reloaded, not reused. */
	decode(m, &c, seq, 1);
	s0 = t_stats_of(m);
	CHECK_RC(kvt_recall_blocks(m, 0, &seq, 1, sel, nb + 2, NULL), 0);
	s1 = t_stats_of(m);
	print_message("# after one token: %llu loads\n",
		      (unsigned long long)(s1.recall_loads - s0.recall_loads));
	CHECK_RC(kvt_seq_tokens(m, seq, 0, &N), 0);
	CHECK_RC(kvt_attend(m, seq, 0, qf, got), 0);
	full_attention(&c, seq, 0, N, qf, want);
	for (uint32_t i = 0; i < c.n_q_heads * c.head_dim; i++)
		assert_true(fabsf(got[i] - want[i]) < 1e-5f);

	free(sel);
	free(q);
	free(qf);
	free(want);
	free(got);
	free(before);
	kvt_manager_destroy(m);
}

/* Quest scoring finds a planted block: keys of block 9 of head 1 align with the query. */
static void test_recall_finds_needle(void **state)
{
	struct kvt_config c = recall_config(1, 64);
	struct kvt_manager *m;
	uint32_t L = 300, D;
	size_t row;
	(void)state;

	c.dtype = KVT_DTYPE_F32;
	c.recall_cache_bytes = 64 * 2 * c.block_tokens * c.head_dim * 4;
	c.device_bytes = (4u << 20) + c.recall_cache_bytes;
	c.topk_tokens = 0; /* the needle must come from recall, not SnapKV */
	m = t_mk(&c);
	D = c.head_dim;
	row = t_rowb(&c);
	float *k = t_xmalloc(c.n_kv_heads * L * row), *v = t_xmalloc(c.n_kv_heads * L * row);
	float q[4 * 16];

	for (uint32_t i = 0; i < c.n_kv_heads * L * D; i++) {
		k[i] = (float)((int)(t_mix(i) % 200) - 100) / 400.0f; /* |k| <= 0.25 */
		v[i] = (float)((int)(t_mix(i + 1000000) % 200) - 100) / 100.0f;
	}
	for (uint32_t p = 9 * 8; p < 10 * 8; p++)
		for (uint32_t d = 0; d < D; d++)
			k[(1 * L + p) * D + d] = d % 2 ? 3.0f : -3.0f;
	for (uint32_t g = 0; g < 4; g++)
		for (uint32_t d = 0; d < D; d++)
			q[g * D + d] = d % 2 ? 1.0f : -1.0f;
	CHECK_RC(kvt_seq_create(m, 1, L), 0);
	CHECK_RC(t_prefill_layer(m, 1, 0, k, v, NULL, NULL), 0);
	uint64_t seq = 1;

	CHECK_RC(t_decode_recall(m, 0, &seq, 1, q, NULL), 0);
	struct kvt_recall_ref ref;
	uint32_t n;

	CHECK_RC(kvt_seq_recall_view(m, 1, 0, 1, &ref, 1, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(ref.block, 9);
	assert_int_equal(ref.resident, 0);
	uint8_t got[16 * 64 * sizeof(float)];

	assert_true(16 * row <= sizeof(got));
	t_dev_read(got, ref.frame, 16 * row);
	assert_memory_equal(got, k + (1 * L + 72) * D, 8 * row);
	assert_memory_equal(got + 8 * row, v + (1 * L + 72) * D, 8 * row);
	free(k);
	free(v);
	kvt_manager_destroy(m);
}

/* One block per call from sequences A, B and C into an 8-frame cache, one kv head: each
   (sequence, layer) has its own region; hits are never loaded again; a region grows towards a
   share of the cache in proportion to its working set, out of free frames (every call's sweep,
   eight regions, trims the other regions to their shares first), and past it evicts its least
   recently used block; a call that finds no frame takes another region's least recently used
   one, and a view naming a slot that went or moved that way reads as stale. */
static void test_recall_regions(void **state)
{
	struct kvt_config c = recall_config(1, 4);
	struct kvt_manager *m;
	uint64_t A = 1, B = 2, C = 3;
	struct kvt_stats s0, s1;
	float qf[4 * 16], out[4 * 16];
	struct kvt_recall_ref ref;
	uint32_t n;
	enum { EVICTIONS_BEFORE_C = 1 };
	(void)state;

	c.n_kv_heads = 1;
	c.n_q_heads = 2;
	c.n_layers = 1;
	c.recall_cache_bytes = 8 * 2 * c.block_tokens * t_rowb(&c);
	m = t_mk(&c);
	t_prefill_seq(m, &c, A, 200); /* blocks 1..21 hold non-resident tokens */
	t_prefill_seq(m, &c, B, 200);
	t_prefill_seq(m, &c, C, 200);
	memset(qf, 0, sizeof(qf));

#define RECALL(seq, blk)                                                    \
	do {                                                                \
		uint64_t s_ = (seq);                                        \
		uint32_t b_ = (blk);                                        \
		CHECK_RC(kvt_recall_blocks(m, 0, &s_, 1, &b_, 1, NULL), 0); \
	} while (0)
#define LOADS() (t_stats_of(m).recall_loads - s0.recall_loads)
#define EVICTIONS() (t_stats_of(m).recall_evictions - s0.recall_evictions)
#define HELD() (t_stats_of(m).recall_frames_used)

	s0 = t_stats_of(m);
	assert_int_equal(s0.recall_frames_total, 8);
	/* A alone: its region may hold the whole cache; repeats are hits */
	RECALL(A, 5);
	RECALL(A, 6);
	RECALL(A, 7);
	RECALL(A, 5);
	RECALL(A, 6);
	RECALL(A, 7);
	assert_int_equal(LOADS(), 3);
	assert_int_equal(t_stats_of(m).recall_hits - s0.recall_hits, 3);
	assert_int_equal(HELD(), 3);
	/* B's region grows with its working set out of A's unused frames: nothing evicted, and
	   every block of both stays cached */
	RECALL(B, 5);
	RECALL(B, 6);
	RECALL(B, 7);
	assert_int_equal(LOADS(), 6);
	RECALL(A, 5);
	RECALL(A, 6);
	RECALL(A, 7);
	RECALL(B, 5);
	RECALL(B, 6);
	RECALL(B, 7);
	assert_int_equal(LOADS(), 6);
	assert_int_equal(EVICTIONS(), 0);
	assert_int_equal(HELD(), 6);
	RECALL(B, 8); /* into A's last spare frame */
	assert_int_equal(LOADS(), 7);
	assert_int_equal(EVICTIONS(), 0);
	/* B's share is reached (4 of 7 working-set blocks, rounded up, of 8 frames): its next
	   block evicts its own least recently used one, B5 */
	RECALL(B, 9);
	assert_int_equal(LOADS(), 8);
	assert_int_equal(EVICTIONS(), 1);
	RECALL(B, 6);
	RECALL(B, 7);
	RECALL(B, 8);
	RECALL(B, 9);
	assert_int_equal(LOADS(), 8);
	assert_int_equal(HELD(), 7);
	RECALL(B, 5); /* gone: loaded again, into the free frame (B's share grew with its
			 working set) */
	assert_int_equal(LOADS(), 9);
	assert_int_equal(EVICTIONS(), 1);
	CHECK_RC(kvt_attend(m, A, 0, qf, out), 0);
	CHECK_RC(kvt_attend(m, B, 0, qf, out), 0);
	/* C's first call finds the cache full, every region at its share: one slot goes from
	   each other region in turn, the first in the cache's list (A) first, which loses its
	   least recently used block; A's view named a slot that went, so it reads as stale until
	   A recalls */
	RECALL(C, 5);
	s1 = t_stats_of(m);
	assert_int_equal(s1.recall_loads - s0.recall_loads, 10);
	assert_int_equal(s1.recall_evictions - s0.recall_evictions, EVICTIONS_BEFORE_C + 1);
	assert_int_equal(HELD(), 8);
	CHECK_RC(kvt_attend(m, A, 0, qf, out), -ESTALE);
	CHECK_RC(kvt_seq_recall_view(m, A, 0, 0, &ref, 1, &n), -ESTALE);
	CHECK_RC(kvt_attend(m, B, 0, qf, out), 0);
	CHECK_RC(kvt_attend(m, C, 0, qf, out), 0);
	RECALL(A, 5); /* recall again: fine */
	CHECK_RC(kvt_attend(m, A, 0, qf, out), 0);
	CHECK_RC(kvt_seq_recall_view(m, A, 0, 0, &ref, 1, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(ref.block, 5);

	/* Destroying a sequence gives its frames back. */
	uint64_t used = HELD();

	CHECK_RC(kvt_seq_destroy(m, A), 0);
	assert_true(HELD() < used);
	CHECK_RC(kvt_seq_destroy(m, B), 0);
	CHECK_RC(kvt_seq_destroy(m, C), 0);
	assert_int_equal(HELD(), 0);
	/* and a new region may take the whole cache again */
	uint64_t D = 4, ids8[1] = {D};
	uint32_t sel8[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	t_prefill_seq(m, &c, D, 200);
	CHECK_RC(kvt_recall_blocks(m, 0, ids8, 1, sel8, 8, NULL), 0);
	assert_int_equal(HELD(), 8);
	kvt_manager_destroy(m);
#undef RECALL
#undef LOADS
#undef EVICTIONS
#undef HELD
}

/* A device call leaves each member's clock and working set in its cell of the layer's lane and
   sends them from there at the layer's next call when the member keeps its place (the same
   batch size and r), else from the host's copy, brought home first. Through calls that keep
   the members' places, swap them, shrink the batch and read the working sets in between (the
   scheduler's kvt_seq_info), each region's clock counts every call that named it and its
   working set every block it touched (all at one step: no token appended), on every backend. */
static void test_lane_places(void **state)
{
	struct kvt_config c = recall_config(2, 64);
	static const uint64_t order[][3] = {{1, 2, 3}, {1, 2, 3}, {3, 1, 2}, {3, 1, 2},
					    {2, 1, 0}, {2, 1, 0}, {1, 2, 0}, {1, 2, 3}};
	uint32_t calls[4] = {0}, last[4] = {0};
	struct kvt_manager *m;
	(void)state;

	c.n_layers = 1;
	m = t_mk(&c);
	for (uint64_t id = 1; id <= 3; id++)
		t_prefill_seq(m, &c, id, 200);
	for (uint32_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
		uint32_t n = order[k][2] ? 3 : 2, sel[3 * 16];

		for (uint32_t i = 0; i < n; i++) {
			uint64_t id = order[k][i];

			/* two blocks a head, one further on each call of the sequence */
			for (uint32_t h = 0; h < c.n_kv_heads; h++) {
				sel[(i * c.n_kv_heads + h) * 2] = 1 + calls[id] % 6;
				sel[(i * c.n_kv_heads + h) * 2 + 1] = 2 + calls[id] % 6;
			}
			last[id] = 2 + calls[id] % 6 > last[id] ? 2 + calls[id] % 6 : last[id];
			calls[id]++;
		}
		CHECK_RC(kvt_recall_blocks(m, 0, order[k], n, sel, 2, NULL), 0);
		if (k == 5) { /* the working sets read between two calls of the same places */
			struct kvt_seq_info in = {.size = sizeof(in)};

			CHECK_RC(kvt_seq_info(m, 2, &in), 0);
			assert_int_equal(in.recall_ws_frames, c.n_kv_heads * last[2]);
		}
	}
	for (uint64_t id = 1; id <= 3; id++) {
		struct kvt_recall_layer *rc = kvt_seqmap_get(&m->seqs, id)->layers[0].rc;
		uint32_t sum = 0;

		CHECK_RC(kvt_recall_sync(m, rc), 0);
		assert_int_equal(rc->rg.clock, calls[id]);
		assert_int_equal(rc->ws.total, c.n_kv_heads * last[id]); /* blocks 1 .. last */
		for (uint32_t x = 0; x < rc->ws.w; x++)
			sum += rc->ws.bucket[x];
		assert_int_equal(sum, rc->ws.total);
	}
	CHECK_RC(kvt_recall_check(m), 0);
	kvt_manager_destroy(m);
}

/* The recall states of a layer lie in one slab by sequence slot (recall.c, rc_slot): the live
   sequences' slots are dense, a destroyed sequence's slot and places go to the next one created,
   which starts from a clean state. */
static void test_state_slots(void **state)
{
	struct kvt_config c = recall_config(2, 64);
	struct kvt_manager *m;
	struct kvt_recall_layer *was[2][2];
	uint32_t slot[2], sel[2] = {1, 2};
	(void)state;

	c.n_layers = 2;
	m = t_mk(&c);
	for (uint64_t id = 1; id <= 5; id++) {
		t_prefill_seq(m, &c, id, 200);
		for (uint32_t l = 0; l < c.n_layers; l++) {
			uint32_t s2[16];

			for (uint32_t h = 0; h < c.n_kv_heads; h++)
				memcpy(s2 + h * 2, sel, sizeof(sel));
			CHECK_RC(kvt_recall_blocks(m, l, &id, 1, s2, 2, NULL), 0);
		}
	}
	assert_int_equal(m->slots.n_made, 5);
	for (uint32_t l = 0; l < c.n_layers; l++) /* a layer's states side by side, by slot */
		for (uint64_t id = 2; id <= 5; id++) {
			const struct kvt_seq *a = kvt_seqmap_get(&m->seqs, id - 1),
					     *b = kvt_seqmap_get(&m->seqs, id);

			assert_int_equal(b->slot, a->slot + 1);
			assert_ptr_equal(b->layers[l].rc, a->layers[l].rc + 1);
			/* and so are their working sets' buckets */
			assert_ptr_equal(b->layers[l].rc->ws.bucket,
					 a->layers[l].rc->ws.bucket + c.ws_window);
		}
	CHECK_RC(kvt_recall_check(m), 0);
	for (uint32_t j = 0; j < 2; j++) {
		const struct kvt_seq *s = kvt_seqmap_get(&m->seqs, 2 + 2 * j);

		slot[j] = s->slot;
		for (uint32_t l = 0; l < c.n_layers; l++)
			was[j][l] = s->layers[l].rc;
		CHECK_RC(kvt_seq_destroy(m, 2 + 2 * j), 0);
	}
	CHECK_RC(kvt_recall_check(m), 0);
	/* 6 and 7 take the slots of 4 and 2 (the latest freed first) and their places, clean:
	   their recalls load what they name, as a new sequence's do */
	for (uint64_t id = 6; id <= 7; id++) {
		const struct kvt_seq *s;
		struct kvt_stats s0 = t_stats_of(m);
		uint32_t j = id == 6 ? 1 : 0, s2[16];

		t_prefill_seq(m, &c, id, 200);
		s = kvt_seqmap_get(&m->seqs, id);
		assert_int_equal(s->slot, slot[j]);
		for (uint32_t l = 0; l < c.n_layers; l++) {
			assert_ptr_equal(s->layers[l].rc, was[j][l]);
			for (uint32_t h = 0; h < c.n_kv_heads; h++)
				memcpy(s2 + h * 2, sel, sizeof(sel));
			CHECK_RC(kvt_recall_blocks(m, l, &id, 1, s2, 2, NULL), 0);
			/* its working set is its own call's: the buckets came back zeroed (the
			   device's in its lane until synced) */
			const struct kvt_ws *ws = &s->layers[l].rc->ws;
			uint32_t sum = 0;

			CHECK_RC(kvt_recall_sync(m, s->layers[l].rc), 0);
			for (uint32_t x = 0; x < ws->w; x++)
				sum += ws->bucket[x];
			assert_int_equal(ws->total, c.n_kv_heads * 2);
			assert_int_equal(sum, ws->total);
		}
		assert_int_equal(t_stats_of(m).recall_hits, s0.recall_hits);
		assert_int_equal(t_stats_of(m).recall_loads - s0.recall_loads,
				 (uint64_t)c.n_layers * c.n_kv_heads * 2);
	}
	assert_int_equal(m->slots.n_made, 5);
	assert_int_equal(m->slots.n_free, 0);
	CHECK_RC(kvt_recall_check(m), 0);
	CHECK_RC(kvt_seq_create(m, 8, 100), 0); /* a sixth live one: a new slot */
	assert_int_equal(kvt_seqmap_get(&m->seqs, 8)->slot, 5);
	CHECK_RC(kvt_seq_create(m, 8, 100), -EEXIST); /* refused: no slot taken */
	assert_int_equal(m->slots.n_made, 6);
	CHECK_RC(kvt_recall_check(m), 0);
	kvt_manager_destroy(m);
}

/* Errors change nothing: the cache and counters stay as they were. */
static void test_recall_errors(void **state)
{
	struct kvt_config c = recall_config(4, 8);
	struct kvt_manager *m = t_mk(&c);
	uint64_t seqs[2] = {1, 2}, dup[2] = {1, 1}, ghost = 9;
	uint32_t sel[2 * 2 * 4];
	size_t row = t_rowb(&c);
	void *q = t_xmalloc(2 * c.n_q_heads * row);
	struct kvt_stats s0, s1;
	(void)state;

	t_prefill_seq(m, &c, 1, 120);
	t_prefill_seq(m, &c, 2, 120);
	for (uint32_t i = 0; i < 16; i++)
		sel[i] = 2 + i % 4; /* blocks 2..5, not resident (sink 8, ring 104..119) */
	s0 = t_stats_of(m);
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 0, sel, 4, NULL), -EINVAL);
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 2, sel, 0, NULL), -EINVAL);
	CHECK_RC(kvt_recall_blocks(m, 0, NULL, 2, sel, 4, NULL), -EINVAL);
	CHECK_RC(kvt_recall_blocks(m, 2, seqs, 2, sel, 4, NULL), -EINVAL);
	CHECK_RC(kvt_recall_blocks(m, 0, dup, 2, sel, 4, NULL), -EINVAL);
	CHECK_RC(kvt_recall_blocks(m, 0, &ghost, 1, sel, 4, NULL), -ENOENT);
	sel[15] = 15; /* past the 15 blocks of 120 tokens */
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 2, sel, 4, NULL), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "block 15"));
	sel[15] = 5;
	/* 2 seqs x 2 heads x 4 distinct blocks = 16 > 8 frames */
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 2, sel, 4, NULL), -ENOSPC);
	CHECK_RC(t_decode_recall(m, 0, seqs, 2, NULL, NULL), -EINVAL);
	s1 = t_stats_of(m);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	/* 1 seq x 2 heads x 4 = 8 fits exactly; repeats do not count against it */
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 1, sel, 4, NULL), 0);
	for (uint32_t i = 0; i < 8; i++)
		sel[i] = 2 + i % 2; /* 2,3,2,3: 4 distinct over two heads */
	CHECK_RC(kvt_recall_blocks(m, 0, &seqs[1], 1, sel, 4, NULL), 0);
	/* a preempted sequence takes no recall */
	CHECK_RC(kvt_seq_preempt(m, 2), 0);
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 2, sel, 2, NULL), -EINVAL);
	CHECK_RC(t_decode_recall(m, 0, seqs, 2, q, NULL), -EINVAL);
	kvt_manager_destroy(m);

	/* recall disabled / no cache */
	c = t_small_config();
	m = t_mk(&c);
	t_prefill_seq(m, &c, 1, 120);
	CHECK_RC(t_decode_recall(m, 0, seqs, 1, q, NULL), -EINVAL);
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 1, sel, 4, NULL), -EINVAL);
	assert_int_equal(t_stats_of(m).recall_frames_total, 0);
	kvt_manager_destroy(m);
	/* config: cache needed when r > 0, within device_bytes, ws window 1..64 */
	c = t_small_config();
	c.recall_blocks = 4;
	assert_int_equal(t_manager_create(&c, &m), -EINVAL);
	c.recall_cache_bytes = c.device_bytes;
	assert_int_equal(t_manager_create(&c, &m), -EINVAL);
	c.recall_cache_bytes = 1 << 20;
	c.ws_window = 0;
	assert_int_equal(t_manager_create(&c, &m), -EINVAL);
	c.ws_window = 65;
	assert_int_equal(t_manager_create(&c, &m), -EINVAL);
	free(q);
}

/* kvt_recall_device_blocks: the selection in the backend's device memory (the fixture's copy
   on CUDA). Argument errors as kvt_recall_blocks's, changing nothing; the floor is n_kv_heads *
   r frames per member whatever the selection names; a member naming a block past its history
   is left out (its region as it was, its views stale and saying why), the others recalled, and
   the call returns 0; a later call naming it well recalls it. The step form is the same call. */
static void test_recall_device_blocks(void **state)
{
	struct kvt_config c = recall_config(4, 8);
	struct kvt_manager *m = t_mk(&c);
	uint64_t seqs[2] = {1, 2}, dup[2] = {1, 1}, ghost = 9;
	uint32_t sel[2 * 2 * 4], two[4] = {2, 2, 2, 2}, got;
	struct kvt_recall_ref ref[4];
	struct kvt_stats s0, s1;
	(void)state;

	t_prefill_seq(m, &c, 1, 120);
	t_prefill_seq(m, &c, 2, 120);
	for (uint32_t i = 0; i < 16; i++)
		sel[i] = 2; /* one block per head (not resident: sink 8, ring 104..119) */
	s0 = t_stats_of(m);
	CHECK_RC(kvt_recall_device_blocks(NULL, 0, seqs, 2, sel, 4, NULL), -EINVAL);
	CHECK_RC(t_recall_device_blocks(m, 0, seqs, 0, sel, 4, NULL), -EINVAL);
	CHECK_RC(t_recall_device_blocks(m, 0, seqs, 2, sel, 0, NULL), -EINVAL);
	CHECK_RC(t_recall_device_blocks(m, 0, NULL, 2, sel, 4, NULL), -EINVAL);
	CHECK_RC(t_recall_device_blocks(m, 0, seqs, 2, NULL, 4, NULL), -EINVAL);
	CHECK_RC(kvt_recall_device_blocks(m, 0, seqs, 2, sel, UINT32_MAX / 2, NULL), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "too large"));
	CHECK_RC(t_recall_device_blocks(m, 2, seqs, 2, sel, 4, NULL), -EINVAL);
	CHECK_RC(t_recall_device_blocks(m, 0, dup, 2, sel, 4, NULL), -EINVAL);
	CHECK_RC(t_recall_device_blocks(m, 0, &ghost, 1, sel, 4, NULL), -ENOENT);
	/* 2 sequences x 2 heads x r 4 = 16 frames against 8, though it names one block a head,
	   which kvt_recall_blocks counts (4 frames) */
	CHECK_RC(t_recall_device_blocks(m, 0, seqs, 2, sel, 4, NULL), -ENOSPC);
	CHECK_RC(t_step_recall_device_blocks(m, 0, 2, sel, 2, NULL), -EINVAL); /* no step */
	s1 = t_stats_of(m);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	CHECK_RC(kvt_recall_blocks(m, 0, seqs, 2, sel, 4, NULL), 0);

	/* r 2: 2 x 2 x 2 = 8 frames; sequence 2 names block 15, past its 15 blocks */
	for (uint32_t i = 0; i < 8; i++)
		sel[i] = 3 + i % 2; /* blocks 3 and 4 in each head */
	sel[4 + 3] = 15;
	s0 = t_stats_of(m);
	CHECK_RC(t_recall_device_blocks(m, 0, seqs, 2, sel, 2, NULL), 0);
	s1 = t_stats_of(m);
	assert_int_equal(s1.recall_lookups - s0.recall_lookups, 4); /* sequence 1's */
	assert_int_equal(s1.recall_loads - s0.recall_loads, 4);
	for (uint32_t h = 0; h < 2; h++) {
		CHECK_RC(kvt_seq_recall_view(m, 1, 0, h, ref, 4, &got), 0);
		assert_int_equal(got, 2);
		assert_int_equal(ref[0].block, 3);
		assert_int_equal(ref[1].block, 4);
		CHECK_RC(kvt_seq_recall_view(m, 2, 0, h, ref, 4, &got), -ESTALE);
		assert_non_null(strstr(kvt_manager_last_error(m), "selection named a block"));
	}
	/* its region kept block 2 of each head: recalled again, two hits and no load */
	s0 = t_stats_of(m);
	CHECK_RC(kvt_recall_blocks(m, 0, &seqs[1], 1, two, 2, NULL), 0);
	s1 = t_stats_of(m);
	assert_int_equal(s1.recall_hits - s0.recall_hits, 2);
	assert_int_equal(s1.recall_loads - s0.recall_loads, 0);
	CHECK_RC(kvt_seq_recall_view(m, 2, 0, 1, ref, 4, &got), 0);
	assert_int_equal(got, 1);
	assert_int_equal(ref[0].block, 2);

	/* the step's form: the plain call on the step's batch */
	sel[4 + 3] = 4;
	CHECK_RC(kvt_step_begin(m, seqs, 2), 0);
	s0 = t_stats_of(m);
	CHECK_RC(t_step_recall_device_blocks(m, 0, 2, sel, 2, NULL), 0);
	s1 = t_stats_of(m);
	assert_int_equal(s1.recall_lookups - s0.recall_lookups, 8);
	assert_int_equal(s1.recall_hits - s0.recall_hits, 4); /* sequence 1's */
	CHECK_RC(kvt_seq_recall_view(m, 2, 0, 1, ref, 4, &got), 0);
	assert_int_equal(got, 2);
	CHECK_RC(kvt_step_end(m), 0);
	kvt_manager_destroy(m);
}

/* What a recall's loads wait for (kvt_load_ticket): nothing while every block a load could read
   lies in the resident set; the prompt's save while those blocks hold prompt rows only; then
   the latest append's save into the last block before the ring's start. In a decode step made
   as an engine makes it (append, then recall, layer by layer), never the save of the step's
   own append, which the device may not have reached: the recall would wait for it on the host.
   A layer trailing the appends by more than the entries kept waits for every save. */
static void test_load_ticket(void **state)
{
	struct kvt_config c = recall_config(2, 64);
	struct kvt_manager *m = t_mk(&c);
	uint32_t bt = c.block_tokens, S = c.sink_tokens, P = 20, steps = 12 * bt, n_sel = 0;
	uint64_t seq = 1, bulk, *tk = calloc(P + steps + 16 * bt, sizeof(*tk));
	uint32_t sel[2 * 2], n_kind[3] = {0};
	struct kvt_seq *s;
	(void)state;

	assert_non_null(tk);
	t_prefill_seq(m, &c, seq, P);
	s = kvt_seqmap_get(&m->seqs, seq);
	bulk = s->save_ticket;
	assert_true(bulk > 0);
	assert_int_equal(s->bulk_ticket, bulk);
	for (uint32_t t = 0; t < steps; t++)
		for (uint32_t l = 0; l < c.n_layers; l++) {
			const struct kvt_seq_layer *ly = &s->layers[l];
			uint32_t N = P + t + 1,
				 ring0 = N > c.recent_tokens ? N - c.recent_tokens : 0, B, last;
			uint64_t want;

			decode_layer(m, &c, seq, l);
			tk[P + t] = s->save_ticket; /* the last layer's: the block's latest */
			ring0 = ring0 < S ? S : ring0;
			B = (ring0 - 1) / bt;
			last = (B + 1) * bt - 1; /* the block's last row, appended long since */
			want = ring0 <= S ? 0 : last < P ? bulk : tk[last];
			assert_true(last < N - 1 || ring0 <= S);
			n_kind[ring0 <= S ? 0 : last < P ? 1 : 2]++;
			assert_int_equal(kvt_load_ticket(m, s, ly), want);
			assert_true(kvt_load_ticket(m, s, ly) < s->save_ticket);
			/* the recall the step makes next: a block outside the ring, loaded */
			if (ring0 <= S + bt)
				continue;
			for (uint32_t h = 0; h < 2; h++) {
				sel[h * 2] = S / bt + n_sel++ % (B - S / bt + 1);
				sel[h * 2 + 1] = NONE;
			}
			CHECK_RC(kvt_recall_blocks(m, l, &seq, 1, sel, 2, NULL), 0);
		}
	for (int k = 0; k < 3; k++) /* none, the prompt's, an append's: each was seen */
		assert_true(n_kind[k] > 0);
	/* layer 0 runs 7 blocks ahead of layer 1, more than the 5 entries kept: layer 1's loads
	   wait for every save, and once it appends into a block whose entry is gone, so do the
	   loads of every layer */
	assert_int_equal(m->bt_n, c.recent_tokens / bt + 3);
	for (uint32_t t = 0; t < 7 * bt; t++)
		decode_layer(m, &c, seq, 0);
	assert_int_equal(kvt_load_ticket(m, s, &s->layers[1]), s->save_ticket);
	assert_true(s->bulk_ticket < s->save_ticket);
	decode_layer(m, &c, seq, 1);
	assert_int_equal(s->bulk_ticket, s->save_ticket);
	assert_int_equal(kvt_load_ticket(m, s, &s->layers[1]), s->save_ticket);
	free(tk);
	kvt_manager_destroy(m);
}

/* The recall working set is the union of blocks recalled over the last w steps. */
static void test_working_set_window(void **state)
{
	struct kvt_config c = recall_config(2, 256);
	struct kvt_manager *m;
	struct kvt_seq_info in = {.size = sizeof(in)};
	uint64_t seq = 3;
	(void)state;

	c.ws_window = 3;
	c.n_layers = 1;
	m = t_mk(&c);
	t_prefill_seq(m, &c, seq, 300);
	CHECK_RC(kvt_seq_info(m, seq, &in), 0);
	assert_int_equal(in.recall_ws_frames, 0);
	assert_int_equal(in.prompt_tokens, 300);
	assert_int_equal(in.layers_prefilled, 1);
	assert_int_equal(in.frames_per_layer, DIV_UP(8 + 16 + 16, 8) * 2);
	assert_int_equal(in.device_frames, in.frames_per_layer);
	assert_int_equal(in.host_blocks, DIV_UP(300, 8) * 2);

	/* per step: head 0 and head 1 lists (r = 2) */
	static const uint32_t steps[][4] = {
		{2, 3, 2, 3},	/* step 1: {h0:2,3  h1:2,3} -> 4 */
		{3, 4, 10, 11}, /* step 2: +h0:4, h1:10,11 -> 7 */
		{2, 5, 2, 3},	/* step 3: +h0:5 -> 8 */
		{5, 6, 10, 12}, /* step 4: window 2..4: h0 {2..6}, h1 {2,3,10,11,12} */
		{6, 6, 12, 12}, /* step 5: window 3..5: h0 {2,5,6}, h1 {2,3,10,12} */
	};
	/* expected union over the last 3 steps, computed by hand */
	static const uint32_t want_ws[] = {4, 7, 8, 10, 7};
	static const uint32_t want_step[] = {4, 4, 4, 4, 2};

	for (uint32_t t = 0; t < 5; t++) {
		decode(m, &c, seq, 1);
		CHECK_RC(kvt_recall_blocks(m, 0, &seq, 1, steps[t], 2, NULL), 0);
		CHECK_RC(kvt_seq_info(m, seq, &in), 0);
		print_message("# step %u: ws %llu (want %u), step %llu (want %u)\n", t + 1,
			      (unsigned long long)in.recall_ws_frames, want_ws[t],
			      (unsigned long long)in.recall_step_frames, want_step[t]);
		assert_int_equal(in.recall_ws_frames, want_ws[t]);
		assert_int_equal(in.recall_step_frames, want_step[t]);
	}
	/* steps without recall: the window empties */
	decode(m, &c, seq, 2);
	CHECK_RC(kvt_seq_info(m, seq, &in), 0);
	assert_int_equal(in.recall_ws_frames, 2); /* step 5's blocks, 2 steps ago */
	assert_int_equal(in.recall_step_frames, 0);
	decode(m, &c, seq, 1);
	CHECK_RC(kvt_seq_info(m, seq, &in), 0);
	assert_int_equal(in.recall_ws_frames, 0);
	kvt_manager_destroy(m);
}

/* Snapshot of every valid slot of every frame of seq (all layers, heads). */
static uint8_t *snapshot(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
			 size_t *bytes)
{
	size_t row = t_rowb(c), at = 0, cap = 1 << 20;
	uint8_t *buf = t_xmalloc(cap);
	uint64_t fr[64];

	for (uint32_t l = 0; l < c->n_layers; l++)
		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			uint32_t nf, ns;

			CHECK_RC(kvt_seq_frames(m, seq, l, h, fr, 64, &nf, &ns), 0);
			for (uint32_t s = 0; s < ns; s++) {
				uint64_t a = fr[s / c->block_tokens] + (s % c->block_tokens) * row;

				assert_true(at + 2 * row <= cap);
				t_dev_read(buf + at, a, row);
				t_dev_read(buf + at + row, a + c->block_tokens * row, row);
				at += 2 * row;
			}
		}
	*bytes = at;
	return buf;
}

/* Preempt frees the device frames; resume rebuilds them bit for bit from the host history. */
static void test_preempt_resume(void **state)
{
	struct kvt_config c = recall_config(2, 64);
	struct kvt_manager *m;
	struct kvt_seq_info in = {.size = sizeof(in)};
	uint64_t seq = 11, other = 12;
	size_t row = t_rowb(&c), nb0, nb1;
	float qf[4 * 16], o0[4 * 16], o1[4 * 16];
	uint8_t kk[64], vv[64];
	(void)state;

	c.host_bytes = 64u << 20; /* the device tier fills first below */
	m = t_mk(&c);
	t_prefill_seq(m, &c, seq, 150);
	decode(m, &c, seq, 29); /* ring wrapped */
	t_prefill_seq(m, &c, other, 60);
	uint32_t sel[4] = {3, 4, 3, 5};

	CHECK_RC(kvt_recall_blocks(m, 1, &seq, 1, sel, 2, NULL), 0);
	for (uint32_t i = 0; i < 4 * 16; i++)
		qf[i] = (float)((int)(t_mix(i) % 100) - 50) / 50.0f;
	CHECK_RC(kvt_attend(m, seq, 0, qf, o0), 0);
	uint8_t *before = snapshot(m, &c, seq, &nb0);
	struct kvt_stats s0 = t_stats_of(m);

	CHECK_RC(kvt_seq_preempt(m, seq), 0);
	CHECK_RC(kvt_seq_preempt(m, seq), -EALREADY);
	struct kvt_stats s1 = t_stats_of(m);

	CHECK_RC(kvt_seq_info(m, seq, &in), 0);
	assert_int_equal(in.preempted, 1);
	assert_int_equal(in.device_frames, 0);
	assert_int_equal(s1.device_frames_free - s0.device_frames_free,
			 (uint64_t)in.frames_per_layer * c.n_layers);
	assert_int_equal(s1.recall_frames_used, s0.recall_frames_used - 4);
	assert_int_equal(s1.preemptions, 1);
	/* what a preempted sequence refuses, and what still works */
	void *k = t_xmalloc(c.n_kv_heads * row), *v = t_xmalloc(c.n_kv_heads * row);
	uint32_t np, nf, ns;

	CHECK_RC(t_decode_append(m, 0, &seq, 1, k, v, NULL), -EINVAL);
	CHECK_RC(kvt_attend(m, seq, 0, qf, o1), -EINVAL);
	CHECK_RC(kvt_seq_frames(m, seq, 0, 0, NULL, 0, &nf, &ns), -EINVAL);
	CHECK_RC(kvt_seq_resident_positions(m, seq, 0, 0, NULL, 0, &np), 0);
	assert_int_equal(np, 0);
	for (uint32_t p = 0; p < 179; p += 7) {
		CHECK_RC(kvt_seq_read_token(m, seq, 1, 1, p, kk, vv), 0);
		t_fill_row(c.dtype, c.head_dim, k, seq, 1, 1, p, 0);
		t_fill_row(c.dtype, c.head_dim, v, seq, 1, 1, p, 1);
		assert_memory_equal(kk, k, row);
		assert_memory_equal(vv, v, row);
	}
	/* the other sequence goes on */
	decode(m, &c, other, 3);

	/* Resume needs room: fill the device, fail with nothing changed, free, resume. */
	uint64_t hog = 99;
	uint32_t fits = 0;

	while (kvt_seq_create(m, hog + fits, 150) == 0) {
		size_t bytes = (size_t)c.n_kv_heads * 150 * row;
		void *hk = t_xmalloc(bytes), *hv = t_xmalloc(bytes);
		void *hq = t_xmalloc((size_t)c.n_q_heads * c.obs_window * row);
		int rc = t_prefill_layer(m, hog + fits, 0, hk, hv, hq, NULL);

		free(hk);
		free(hv);
		free(hq);
		fits++;
		if (rc)
			break;
	}
	struct kvt_stats s2 = t_stats_of(m);

	CHECK_RC(kvt_seq_resume(m, seq, NULL), -ENOMEM);
	struct kvt_stats s3 = t_stats_of(m);

	assert_memory_equal(&s2, &s3, sizeof(s2));
	for (uint32_t i = 0; i < fits; i++)
		CHECK_RC(kvt_seq_destroy(m, hog + i), 0);
	CHECK_RC(kvt_seq_resume(m, seq, NULL), 0);
	CHECK_RC(kvt_seq_resume(m, seq, NULL), -EALREADY);
	uint8_t *after = snapshot(m, &c, seq, &nb1);

	assert_int_equal(nb0, nb1);
	assert_memory_equal(before, after, nb0);
	assert_int_equal(t_stats_of(m).resumes, 1);
	/* the recall view was forgotten: attention over the resident set only now; recall
	   again and it is the same as before the preemption */
	CHECK_RC(kvt_recall_blocks(m, 1, &seq, 1, sel, 2, NULL), 0);
	CHECK_RC(kvt_attend(m, seq, 0, qf, o1), 0);
	assert_memory_equal(o0, o1, sizeof(o0));
	/* decoding resumes where it stopped */
	decode(m, &c, seq, 20);
	for (uint32_t p = 170; p < 199; p++) {
		CHECK_RC(kvt_seq_read_token(m, seq, 0, 0, p, kk, vv), 0);
		t_fill_row(c.dtype, c.head_dim, k, seq, 0, 0, p, 0);
		assert_memory_equal(kk, k, row);
	}
	CHECK_RC(kvt_seq_preempt(m, 4242), -ENOENT);
	CHECK_RC(kvt_seq_resume(m, 4242, NULL), -ENOENT);
	free(before);
	free(after);
	free(k);
	free(v);
	kvt_manager_destroy(m);
}

/* ---- config.recall_threads -------------------------------------------------------------- */

#define TW_SEQS 24
#define TW_R 3

/* config.recall_threads changes who does a call's work, never what is done: two managers, one
   thread and three (parts of unequal size), run the same random calls (batches of 1 to 24
   sequences in random order; given selections with repeated and empty entries, or Quest's
   from the managers' own scoring; decode appends, preempt/resume, destroy and prefill again;
   a host tier small enough that recalls read spilled blocks back from the disk tier; a recall
   cache small enough to evict and to refuse) and agree after every call: its result, every
   counter, the views of its sequences (frames included) and attention over them. */
static void test_recall_threads_same(void **state)
{
	struct kvt_config c = recall_config(TW_R, 72);
	struct kvt_manager *mm[2];
	char dir[] = "/tmp/kvt-recall-XXXXXX";
	uint64_t seed = t_pick_seed(), ids[TW_SEQS], batch[TW_SEQS], origin[2] = {0, 0};
	bool live[TW_SEQS], pre[TW_SEQS];
	uint32_t sel[TW_SEQS * 2 * TW_R], calls = 0, split = 0, refused = 0, scored = 0;
	long ops = t_pick_ops(1200);
	(void)state;

	print_message("# recall threads: seed %llu\n", (unsigned long long)seed);
	t_rng_seed(seed);
	assert_non_null(mkdtemp(dir));
	c.spill_dir = dir;
	c.host_bytes = t_budget(&c, 300); /* about a third of the histories */
	c.device_bytes = t_budget(&c, 400) + c.recall_cache_bytes;
	for (int k = 0; k < 2; k++) {
		c.recall_threads = k ? 3 : 1;
		mm[k] = t_mk(&c);
	}
	for (uint32_t i = 0; i < TW_SEQS; i++) {
		ids[i] = 100 + i;
		for (int k = 0; k < 2; k++)
			t_prefill_seq(mm[k], &c, ids[i], 60 + 7 * i);
		live[i] = true;
		pre[i] = false;
	}
	for (long op = 0; op < ops; op++) {
		uint32_t what = t_rng_below(100), i = t_rng_below(TW_SEQS), n = 0;
		int rc[2];

		if (what < 70) { /* a recall call over live sequences in random order */
			uint32_t layer = t_rng_below(c.n_layers), want = 1 + t_rng_below(TW_SEQS);

			for (uint32_t x = 0; x < TW_SEQS && n < want; x++) {
				uint32_t y = (i + x * 7) % TW_SEQS;

				if (live[y] && !pre[y])
					batch[n++] = ids[y];
			}
			if (!n)
				continue;
			for (uint32_t m = 0; m < n; m++) {
				uint32_t nb =
					DIV_UP(t_tokens_of(mm[0], batch[m], layer), c.block_tokens);

				for (uint32_t j = 0; j < c.n_kv_heads * TW_R; j++) {
					uint32_t *e = &sel[m * c.n_kv_heads * TW_R + j];

					*e = t_rng_below(10) == 0	? NONE
					     : j && t_rng_below(6) == 0 ? e[-1]
									: t_rng_below(nb);
				}
			}
			if (t_rng_below(3) == 0) { /* Quest: the managers score */
				size_t qs = (size_t)c.n_q_heads * t_rowb(&c);
				uint8_t *qq = t_xmalloc(n * qs);
				float *qf =
					t_xmalloc((size_t)c.n_q_heads * c.head_dim * sizeof(*qf));

				for (uint32_t m = 0; m < n; m++)
					make_query(&c, batch[m], (uint32_t)op, qq + m * qs, qf);
				for (int k = 0; k < 2; k++)
					rc[k] = t_decode_recall(mm[k], layer, batch, n, qq, NULL);
				scored++;
				free(qq);
				free(qf);
			} else {
				for (int k = 0; k < 2; k++)
					rc[k] = kvt_recall_blocks(mm[k], layer, batch, n, sel, TW_R,
								  NULL);
			}
			CHECK_EQ(rc[0], rc[1]);
			calls++;
			split += n >= 16;
			refused += rc[0] != 0;
			for (uint32_t m = 0; m < n; m++)
				t_same_views(mm, &c, batch[m], layer, TW_R, origin);
			if (rc[0] == 0) {
				float q[4 * 16], o[2][4 * 16];

				for (uint32_t x = 0; x < 4 * 16; x++)
					q[x] = (float)((int)(t_mix(op * 64 + x) % 100) - 50) /
					       50.0f;
				for (int k = 0; k < 2; k++)
					CHECK_RC(kvt_attend(mm[k], batch[0], layer, q, o[k]), 0);
				assert_memory_equal(o[0], o[1], sizeof(o[0]));
			}
		} else if (what < 85 && live[i] && !pre[i]) { /* a decode step of one sequence */
			for (int k = 0; k < 2; k++)
				decode(mm[k], &c, ids[i], 1);
		} else if (what < 93 && live[i]) { /* preempt or resume */
			for (int k = 0; k < 2; k++)
				rc[k] = pre[i] ? kvt_seq_resume(mm[k], ids[i], NULL)
					       : kvt_seq_preempt(mm[k], ids[i]);
			CHECK_EQ(rc[0], rc[1]);
			if (rc[0] == 0)
				pre[i] = !pre[i];
		} else if (live[i]) { /* destroy, and prefill again */
			for (int k = 0; k < 2; k++) {
				CHECK_RC(kvt_seq_destroy(mm[k], ids[i]), 0);
				t_prefill_seq(mm[k], &c, ids[i], 40 + t_mix(op) % 150);
			}
			pre[i] = false;
		}
		struct kvt_stats a = t_stats_of(mm[0]), b = t_stats_of(mm[1]);

		CHECK_STATS_EQUAL(&a, &b);
	}
	struct kvt_stats a = t_stats_of(mm[0]);

	print_message(
		"# recall threads: %u calls (%u scored, %u of 16+ sequences, %u refused), %llu "
		"loads, %llu evictions, %llu disk reads\n",
		calls, scored, split, refused, (unsigned long long)a.recall_loads,
		(unsigned long long)a.recall_evictions, (unsigned long long)a.disk_blocks_fetched);
	/* the walk reached what it is about */
	assert_true(split > 0);
	assert_true(scored > 0);
	assert_true(a.recall_evictions > 0);
	assert_true(a.disk_blocks_fetched > 0);
	for (int k = 0; k < 2; k++)
		kvt_manager_destroy(mm[k]);
	rmdir(dir);
}

/* kvt_stats.device_meta_bytes: the device metadata tables of the CUDA backend (per layer
   [cap][H] metadata entries of 2 rows and key entries, and [cap] group addresses when the
   regions are on the device, cap doubling from 8 blocks), outside device_bytes; 0 on the host
   backend, which keeps them in host memory. */
static void test_device_meta_bytes(void **state)
{
	struct kvt_config c = recall_config(3, 64);
	struct kvt_manager *m = t_mk(&c);
	bool dev = t_be->kind == KVT_BACKEND_CUDA;
	/* with the regions on the device, each block's host group address too */
	uint64_t per_block =
		(uint64_t)c.n_kv_heads * (2 * t_rowb(&c) + 8) + (m->dev_regions ? 8 : 0);
	(void)state;

	CHECK_EQ(t_stats_of(m).device_meta_bytes, 0);
	t_prefill_seq(m, &c, 1, 60); /* 8 blocks: a table of 8 per layer */
	CHECK_EQ(t_stats_of(m).device_meta_bytes, dev ? c.n_layers * 8 * per_block : 0);
	decode(m, &c, 1, 4); /* 64 tokens: still 8 blocks */
	CHECK_EQ(t_stats_of(m).device_meta_bytes, dev ? c.n_layers * 8 * per_block : 0);
	decode(m, &c, 1, 1); /* block 8 opens: each layer's table doubles */
	CHECK_EQ(t_stats_of(m).device_meta_bytes, dev ? c.n_layers * 16 * per_block : 0);
	t_prefill_seq(m, &c, 2, 100); /* 13 blocks: 16 */
	CHECK_EQ(t_stats_of(m).device_meta_bytes, dev ? c.n_layers * 32 * per_block : 0);
	CHECK_RC(kvt_seq_destroy(m, 1), 0);
	CHECK_EQ(t_stats_of(m).device_meta_bytes, dev ? c.n_layers * 16 * per_block : 0);
	CHECK_RC(kvt_seq_destroy(m, 2), 0);
	CHECK_EQ(t_stats_of(m).device_meta_bytes, 0);
	kvt_manager_destroy(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_meta_bound),
		cmocka_unit_test(test_topr),
		cmocka_unit_test(test_recall_all_equals_full),
		cmocka_unit_test(test_recall_finds_needle),
		cmocka_unit_test(test_recall_regions),
		cmocka_unit_test(test_state_slots),
		cmocka_unit_test(test_lane_places),
		cmocka_unit_test(test_recall_errors),
		cmocka_unit_test(test_recall_device_blocks),
		cmocka_unit_test(test_load_ticket),
		cmocka_unit_test(test_working_set_window),
		cmocka_unit_test(test_preempt_resume),
		cmocka_unit_test(test_recall_threads_same),
		cmocka_unit_test(test_device_meta_bytes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
