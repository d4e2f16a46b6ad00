/* SPDX-License-Identifier: MIT */
/*
 * manager: the public data path on the host backend. Every check is against an expectation
 * computed here, not by the library: token data comes from the generator in common.h (any row
 * can be regenerated), resident positions from docs/design.md's rule (sink, top-K, last `recent`),
 * the top-K set from kvt_snapkv_select run on the very tensors handed to prefill (and, once,
 * from hand-made tensors whose answer is known), attention from a double-precision loop over
 * the resident positions, and frame/block counts from the geometry.
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

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "internal.h"
#include "policy.h"
#include "util.h"

#define MAX_LAYERS 4

/* What the test knows of one sequence. */
struct tseq {
	uint64_t id;
	uint32_t L, count;
	uint32_t n[MAX_LAYERS];	   /* tokens per layer; 0 = not prefilled */
	int32_t *topk[MAX_LAYERS]; /* [n_kv_heads][count]: kvt_snapkv_select on the same data */
};

static void tseq_init(struct tseq *t, uint64_t id, uint32_t L)
{
	memset(t, 0, sizeof(*t));
	t->id = id;
	t->L = L;
}

static void tseq_fini(struct tseq *t)
{
	for (int l = 0; l < MAX_LAYERS; l++) {
		free(t->topk[l]);
		t->topk[l] = NULL;
		t->n[l] = 0;
	}
}

/* Prefills (seq, layer) with the generator's tensors. When topk is non-NULL it receives
   kvt_snapkv_select's choice on those very tensors ([n_kv_heads][count]). The tensors are
   overwritten right after the call, so a library that kept reading them would be caught. */
static int prefill_raw(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq,
		       uint32_t layer, uint32_t L, int32_t *topk, bool null_q)
{
	size_t rb = t_rowb(c), kv_bytes = (size_t)c->n_kv_heads * L * rb;
	size_t q_bytes = (size_t)c->n_q_heads * c->obs_window * rb;
	void *k = t_xmalloc(kv_bytes), *v = t_xmalloc(kv_bytes), *q = t_xmalloc(q_bytes);
	struct kvt_snapkv sp = t_snapkv_of(c, L);
	uint32_t count = kvt_snapkv_count(&sp);
	int rc;

	t_fill_prefill(c, seq, layer, L, k, v, q);
	if (topk && count) {
		void *scratch = t_xmalloc(kvt_snapkv_scratch_bytes(&sp));

		CHECK_RC(kvt_snapkv_select(&sp, k, q, topk, scratch), 0);
		free(scratch);
	}
	rc = t_prefill_layer(m, seq, layer, k, v, null_q ? NULL : q, NULL);
	memset(k, 0x5a, kv_bytes);
	memset(v, 0xa5, kv_bytes);
	memset(q, 0x3c, q_bytes);
	free(k);
	free(v);
	free(q);
	return rc;
}

/* Checks the structural promises of a top-K set: count, range, strictly ascending. */
static void check_topk_shape(const struct kvt_config *c, uint32_t L, const int32_t *t,
			     uint32_t count)
{
	int64_t hi = (int64_t)L - c->recent_tokens;

	if ((int64_t)L - (int64_t)c->obs_window < hi)
		hi = (int64_t)L - (int64_t)c->obs_window;
	for (uint32_t i = 0; i < count; i++) {
		if (t[i] < (int32_t)c->sink_tokens || t[i] >= hi)
			fail_at(__FILE__, __LINE__, "L=%u: top-K position %d outside [%u, %lld)", L,
				t[i], c->sink_tokens, (long long)hi);
		if (i && t[i] <= t[i - 1])
			fail_at(__FILE__, __LINE__, "L=%u: top-K not ascending at %u", L, i);
	}
}

/* Prefills one layer of a tracked sequence, which must succeed. */
static void tseq_prefill(struct kvt_manager *m, const struct kvt_config *c, struct tseq *t,
			 uint32_t layer)
{
	struct kvt_snapkv sp = t_snapkv_of(c, t->L);
	uint32_t got = 0;

	assert_true(layer < MAX_LAYERS);
	t->count = kvt_snapkv_count(&sp);
	if (t->count != t_naive_count(c, t->L))
		fail_at(__FILE__, __LINE__, "kvt_snapkv_count(L=%u) = %u, the design rule gives %u",
			t->L, t->count, t_naive_count(c, t->L));
	t->topk[layer] = t_xmalloc((size_t)c->n_kv_heads * t->count * sizeof(int32_t));
	CHECK_RC(prefill_raw(m, c, t->id, layer, t->L, t->topk[layer], t->count == 0), 0);
	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		check_topk_shape(c, t->L, t->topk[layer] + (size_t)h * t->count, t->count);
	t->n[layer] = t->L;
	CHECK_RC(kvt_seq_tokens(m, t->id, layer, &got), 0);
	assert_int_equal(got, t->L);
}

static void check_resident_at(struct kvt_manager *m, const struct kvt_config *c,
			      const struct tseq *t, uint32_t layer, const char *file, int line)
{
	size_t cap = (size_t)c->sink_tokens + c->recent_tokens + t->count + 8;
	int32_t *want = t_xmalloc(cap * sizeof(int32_t)), *got = t_xmalloc(cap * sizeof(int32_t));

	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t nw = t_expect_resident(
			c, t->n[layer], t->topk[layer] + (size_t)h * t->count, t->count, want);
		uint32_t ng = 0xdeadbeef;
		int rc = kvt_seq_resident_positions(m, t->id, layer, h, got, (uint32_t)cap, &ng);

		if (rc != 0)
			fail_at(file, line, "seq %llu layer %u head %u: resident positions: %d",
				(unsigned long long)t->id, layer, h, rc);
		if (ng != nw)
			fail_at(file, line,
				"seq %llu layer %u head %u (L=%u, N=%u): %u resident, expected %u",
				(unsigned long long)t->id, layer, h, t->L, t->n[layer], ng, nw);
		for (uint32_t i = 0; i < nw; i++)
			if (got[i] != want[i])
				fail_at(file, line,
					"seq %llu layer %u head %u (L=%u, N=%u): resident[%u] = %d, "
					"expected %d",
					(unsigned long long)t->id, layer, h, t->L, t->n[layer], i,
					got[i], want[i]);
	}
	free(want);
	free(got);
}
#define CHECK_RESIDENT(m, c, t, layer) check_resident_at((m), (c), (t), (layer), __FILE__, __LINE__)

/* Reads back every token of (seq, layer), every head, through both kvt_seq_read_token and the
   host-history-only read, and compares bit-exactly with the generator. */
static void check_readback_at(struct kvt_manager *m, const struct kvt_config *c,
			      const struct tseq *t, uint32_t layer, const char *file, int line)
{
	size_t rb = t_rowb(c);
	uint8_t *wk = t_xmalloc(rb), *wv = t_xmalloc(rb), *gk = t_xmalloc(rb), *gv = t_xmalloc(rb);
	int32_t *res = t_xmalloc(((size_t)c->sink_tokens + c->recent_tokens + t->count + 1) *
				 sizeof(int32_t));
	uint32_t N = t->n[layer];
	uint64_t resident = 0, read0 = t_stats_of(m).bytes_read;

	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		resident += t_expect_resident(c, N, t->topk[layer] + (size_t)h * t->count, t->count,
					      res);
	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		for (uint32_t p = 0; p < N; p++) {
			t_fill_row(c->dtype, c->head_dim, wk, t->id, layer, h, p, 0);
			t_fill_row(c->dtype, c->head_dim, wv, t->id, layer, h, p, 1);
			for (int tier = 0; tier < 2; tier++) {
				int rc = tier ? kvt_seq_read_token_host(m, t->id, layer, h, p, gk,
									gv)
					      : kvt_seq_read_token(m, t->id, layer, h, p, gk, gv);

				if (rc)
					fail_at(file, line,
						"%s(seq %llu, layer %u, head %u, pos %u) = %d",
						tier ? "read_token_host" : "read_token",
						(unsigned long long)t->id, layer, h, p, rc);
				if (memcmp(gk, wk, rb) || memcmp(gv, wv, rb))
					fail_at(file, line,
						"%s: seq %llu layer %u head %u pos %u (L=%u, N=%u): %s "
						"row differs",
						tier ? "host history" : "read_token",
						(unsigned long long)t->id, layer, h, p, t->L, N,
						memcmp(gk, wk, rb) ? "K" : "V");
			}
		}
	/* bytes_read counts device reads: exactly the resident rows came from the device tier
	   (the host-history pass reads none) */
	if (t_stats_of(m).bytes_read - read0 != 2 * rb * resident)
		fail_at(file, line,
			"seq %llu layer %u: %llu bytes read from the device tier, expected %llu "
			"(%llu resident rows)",
			(unsigned long long)t->id, layer,
			(unsigned long long)(t_stats_of(m).bytes_read - read0),
			(unsigned long long)(2 * rb * resident), (unsigned long long)resident);
	/* one past the end is out of range */
	CHECK_RC(kvt_seq_read_token(m, t->id, layer, 0, N, gk, gv), -EINVAL);
	free(res);
	free(wk);
	free(wv);
	free(gk);
	free(gv);
}
#define CHECK_READBACK(m, c, t, layer) check_readback_at((m), (c), (t), (layer), __FILE__, __LINE__)

/* Reads back only the resident positions (these come from device frames). */
static void check_resident_rows(struct kvt_manager *m, const struct kvt_config *c,
				const struct tseq *t, uint32_t layer)
{
	size_t rb = t_rowb(c), cap = (size_t)c->sink_tokens + c->recent_tokens + t->count + 8;
	uint8_t *wk = t_xmalloc(rb), *wv = t_xmalloc(rb), *gk = t_xmalloc(rb), *gv = t_xmalloc(rb);
	int32_t *pos = t_xmalloc(cap * sizeof(int32_t));
	uint32_t n = 0;

	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		CHECK_RC(kvt_seq_resident_positions(m, t->id, layer, h, pos, (uint32_t)cap, &n), 0);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t p = (uint32_t)pos[i];

			t_fill_row(c->dtype, c->head_dim, wk, t->id, layer, h, p, 0);
			t_fill_row(c->dtype, c->head_dim, wv, t->id, layer, h, p, 1);
			CHECK_RC(kvt_seq_read_token(m, t->id, layer, h, p, gk, gv), 0);
			if (memcmp(gk, wk, rb) || memcmp(gv, wv, rb))
				fail_at(__FILE__, __LINE__,
					"resident row: seq %llu layer %u head %u pos %u (N=%u) differs",
					(unsigned long long)t->id, layer, h, p, t->n[layer]);
		}
	}
	free(pos);
	free(wk);
	free(wv);
	free(gk);
	free(gv);
}

/* kvt_attend against a double-precision softmax over exactly the resident positions, with
   K and V taken from the generator (its values are exact in every dtype). */
static void check_attend_at(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
			    uint32_t layer, uint64_t salt, const char *file, int line)
{
	uint32_t D = c->head_dim, G = c->n_q_heads / c->n_kv_heads;
	size_t cap = (size_t)c->sink_tokens + c->recent_tokens + t->count + 8;
	float *q = t_xmalloc((size_t)c->n_q_heads * D * sizeof(float));
	float *out = t_xmalloc((size_t)c->n_q_heads * D * sizeof(float));
	int32_t *pos = t_xmalloc(cap * sizeof(int32_t));
	double *logit = t_xmalloc(cap * sizeof(double)), *ref = t_xmalloc(D * sizeof(double));
	double scale = 1.0 / sqrt((double)D);

	for (size_t i = 0; i < (size_t)c->n_q_heads * D; i++)
		q[i] = (float)((int)(t_mix(salt * 7919 + i) % 512) - 256) / 128.0f;
	CHECK_RC(kvt_attend(m, t->id, layer, q, out), 0);
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t n = 0;

		CHECK_RC(kvt_seq_resident_positions(m, t->id, layer, h, pos, (uint32_t)cap, &n), 0);
		assert_true(n > 0);
		for (uint32_t g = h * G; g < h * G + G; g++) {
			const float *qg = q + (size_t)g * D;
			double mx = -INFINITY, sum = 0;

			for (uint32_t j = 0; j < n; j++) {
				double s = 0;

				for (uint32_t d = 0; d < D; d++)
					s += (double)qg[d] *
					     t_value(t->id, layer, h, (uint32_t)pos[j], d, 0);
				logit[j] = s * scale;
				if (logit[j] > mx)
					mx = logit[j];
			}
			memset(ref, 0, D * sizeof(double));
			for (uint32_t j = 0; j < n; j++) {
				double w = exp(logit[j] - mx);

				sum += w;
				for (uint32_t d = 0; d < D; d++)
					ref[d] += w *
						  t_value(t->id, layer, h, (uint32_t)pos[j], d, 1);
			}
			for (uint32_t d = 0; d < D; d++) {
				double r = ref[d] / sum, o = out[(size_t)g * D + d];

				if (!(fabs(o - r) <= 1e-5 * (1.0 + fabs(r))))
					fail_at(file, line,
						"attend: seq %llu layer %u (N=%u) q head %u dim %u: %.9g, "
						"naive %.9g",
						(unsigned long long)t->id, layer, t->n[layer], g, d,
						o, r);
			}
		}
	}
	free(q);
	free(out);
	free(pos);
	free(logit);
	free(ref);
}
#define CHECK_ATTEND(m, c, t, layer, salt) \
	check_attend_at((m), (c), (t), (layer), (salt), __FILE__, __LINE__)

/* Appends the next token of each listed sequence to `layer` (generator data); returns the
   call's result and, on success, advances the model. */
static int decode_step(struct kvt_manager *m, const struct kvt_config *c, uint32_t layer,
		       struct tseq **ts, uint32_t n)
{
	size_t bytes = (size_t)n * c->n_kv_heads * t_rowb(c);
	uint64_t *ids = t_xmalloc(n * sizeof(uint64_t));
	uint32_t *pos = t_xmalloc(n * sizeof(uint32_t));
	void *k = t_xmalloc(bytes), *v = t_xmalloc(bytes);
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = ts[i]->id;
		pos[i] = ts[i]->n[layer];
	}
	t_fill_decode(c, ids, pos, n, layer, k, v);
	rc = t_decode_append(m, layer, ids, n, k, v, NULL);
	memset(k, 0x77, bytes);
	memset(v, 0x88, bytes);
	if (rc == 0)
		for (uint32_t i = 0; i < n; i++)
			ts[i]->n[layer]++;
	free(ids);
	free(pos);
	free(k);
	free(v);
	return rc;
}

static void check_tokens(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t)
{
	for (uint32_t l = 0; l < c->n_layers; l++) {
		uint32_t n = 0xdeadbeef;

		CHECK_RC(kvt_seq_tokens(m, t->id, l, &n), 0);
		if (n != t->n[l])
			fail_at(__FILE__, __LINE__, "seq %llu layer %u: %u tokens, expected %u",
				(unsigned long long)t->id, l, n, t->n[l]);
	}
}

/* Frames and blocks the model says are in use. */
static void check_usage(struct kvt_manager *m, const struct kvt_config *c, struct tseq *ts,
			uint32_t n)
{
	struct kvt_stats st = t_stats_of(m);
	uint64_t frames = 0, blocks = 0;

	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < c->n_layers; l++) {
			if (!ts[i].n[l])
				continue;
			frames += (uint64_t)c->n_kv_heads * t_frames_per_head(c, ts[i].L);
			blocks += (uint64_t)c->n_kv_heads * DIV_UP(ts[i].n[l], c->block_tokens);
		}
	assert_int_equal(st.device_frames_used, frames);
	assert_int_equal(st.host_blocks_used, blocks);
	assert_int_equal(st.device_frames_used + st.device_frames_free, st.device_frames_total);
	assert_int_equal(st.host_blocks_used + st.host_blocks_free, st.host_blocks_total);
}

/* ---- geometry, configuration, stats ----------------------------------------------------- */

static void test_config_and_geometry(void **state)
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
		CHECK_RC(kvt_manager_stats(m, &small), 0);
		assert_int_equal(small.device_frames_total, 7 * 4);
		assert_int_equal(small.device_frames_used, 0xeeeeeeeeeeeeeeeeull);
	}
	kvt_manager_destroy(m);
	kvt_manager_destroy(NULL);
}

static void test_stats_counters(void **state)
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

static void test_layout_small_config(void **state)
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

static void test_layout_other_windows(void **state)
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
static void test_topk_known(void **state)
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

static void test_resident_enospc(void **state)
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

static void test_ring_wrap_long(void **state)
{
	struct scen s = {KVT_DTYPE_F16, 2, 2, 16, 8, 8, 16, 16, 4, 2, 0, 3000};

	(void)state;
	run_scenario(&s);
}

static void test_dtypes_groups_windows(void **state)
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
static void test_save_threads_staging(void **state)
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

static void test_save_visibility(void **state)
{
	(void)state;
	save_visibility(1); /* one thread: the last chunk of a save is scattered slowly */
	save_visibility(3); /* chunks of >= 128 KiB are split between threads */
}

/* ---- batched decode interleaved with prefill -------------------------------------------- */

static void test_batched_interleaved(void **state)
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

/* ---- capacity ---------------------------------------------------------------------------- */

static void test_device_capacity(void **state)
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

static void test_host_capacity_prefill(void **state)
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

static void test_host_capacity_decode(void **state)
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

static void test_sync_tokens_errors(void **state)
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_and_geometry),
		cmocka_unit_test(test_stats_counters),
		cmocka_unit_test(test_layout_small_config),
		cmocka_unit_test(test_layout_other_windows),
		cmocka_unit_test(test_topk_known),
		cmocka_unit_test(test_resident_enospc),
		cmocka_unit_test(test_ring_wrap_long),
		cmocka_unit_test(test_dtypes_groups_windows),
		cmocka_unit_test(test_save_threads_staging),
		cmocka_unit_test(test_save_visibility),
		cmocka_unit_test(test_batched_interleaved),
		cmocka_unit_test(test_device_capacity),
		cmocka_unit_test(test_host_capacity_prefill),
		cmocka_unit_test(test_host_capacity_decode),
		cmocka_unit_test(test_sync_tokens_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
