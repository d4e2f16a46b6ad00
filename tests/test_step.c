/* SPDX-License-Identifier: MIT */
/*
 * step: decode steps (manager/step.c): a batch named once by kvt_step_begin, then the per-layer
 * kvt_step_append / kvt_step_recall / kvt_step_recall_blocks, then kvt_step_end. They must be
 * the plain calls on that batch: two managers, one driven by the plain calls and one by steps,
 * agree after every call. And their own contract: what begin refuses, what no open step
 * refuses, members destroyed or preempted while a step is open.
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
#include "fault.h"
#include "base.h"
#include "policy.h"
#include "recall.h"
#include "util.h"

#define NONE UINT32_MAX
#define SEQS 16
#define R 3

/* t_small_config with recall: bt 8, d 16, f16 (2 layers, 2 kv heads, 4 query heads). */
static struct kvt_config step_config(uint64_t cache_frames)
{
	struct kvt_config c = t_small_config();

	c.recall_blocks = R;
	c.recall_cache_bytes = cache_frames * 2 * c.block_tokens * t_rowb(&c);
	c.device_bytes += c.recall_cache_bytes;
	return c;
}

/* The decode tokens of a batch for layer (generator rows at each member's next position);
   members that are not live or not prefilled get position 0 (the call refuses them). */
static void batch_tokens(struct kvt_manager *m, const struct kvt_config *c, const uint64_t *batch,
			 uint32_t n, uint32_t layer, void *k, void *v)
{
	uint32_t pos[SEQS];

	for (uint32_t i = 0; i < n; i++)
		if (kvt_seq_tokens(m, batch[i], layer, &pos[i]))
			pos[i] = 0;
	t_fill_decode(c, batch, pos, n, layer, k, v);
}

static void same_stats(struct kvt_manager *const mm[2])
{
	struct kvt_stats a = t_stats_of(mm[0]), b = t_stats_of(mm[1]);

	/* Regions on the device take its memory, and load with their own kernel, every call. */
	if (mm[0]->dev_regions != mm[1]->dev_regions) {
		a.device_meta_bytes = b.device_meta_bytes = 0;
		a.h2d_kernel_launches = b.h2d_kernel_launches = 0;
		a.h2d_dma_batches = b.h2d_dma_batches = 0;
	}
	CHECK_STATS_EQUAL(&a, &b);
}

/* ---- attention tables (kvt_step_tables) ---- */

#define TAB_ROWS (SEQS + 2) /* two padding rows past the largest batch */
#define TAB_FRAMES 40
#define TAB_SENTINEL 0xa5a5a5a5u
#define TAB_POS (TAB_FRAMES * 8)

/* Host buffers of a table set (the fixture copies them to the device and back on CUDA). */
struct tab {
	struct kvt_attn_tables t;
	uint32_t n_batch;
};

static void tab_init(struct tab *x, const struct kvt_config *c, uint32_t max_batch,
		     uint32_t max_frames, uint32_t max_recall)
{
	size_t rows = (size_t)max_batch * c->n_kv_heads;

	x->t = (struct kvt_attn_tables){
		.size = sizeof(x->t),
		.max_batch = max_batch,
		.max_frames = max_frames,
		.max_recall = max_recall,
		.n_batch = &x->n_batch,
		.n_tokens = t_xmalloc(rows * 4),
		.frames = t_xmalloc(rows * max_frames * 4 + 4),
		.n_recall = t_xmalloc(rows * 4),
		.recall = t_xmalloc(rows * max_recall * 4 + 4),
		.recall_tokens = t_xmalloc(rows * max_recall * 4 + 4),
		.recall_skip = t_xmalloc(rows * max_recall * 8 + 8),
	};
}

/* Fills every buffer with the sentinel (so that what a call leaves is seen). */
static void tab_poison(struct tab *x, uint32_t H)
{
	size_t rows = (size_t)x->t.max_batch * H;

	x->n_batch = TAB_SENTINEL;
	memset(x->t.n_tokens, 0xa5, rows * 4);
	memset(x->t.frames, 0xa5, rows * x->t.max_frames * 4);
	memset(x->t.n_recall, 0xa5, rows * 4);
	memset(x->t.recall, 0xa5, rows * x->t.max_recall * 4);
	memset(x->t.recall_tokens, 0xa5, rows * x->t.max_recall * 4);
	memset(x->t.recall_skip, 0xa5, rows * x->t.max_recall * 8);
}

/* Whether every buffer still holds the sentinel. */
static bool tab_untouched(const struct tab *x, uint32_t H)
{
	size_t rows = (size_t)x->t.max_batch * H;
	bool ok = x->n_batch == TAB_SENTINEL;

	for (size_t i = 0; i < rows; i++)
		ok &= x->t.n_tokens[i] == TAB_SENTINEL && x->t.n_recall[i] == TAB_SENTINEL;
	for (size_t i = 0; i < rows * x->t.max_frames; i++)
		ok &= x->t.frames[i] == TAB_SENTINEL;
	for (size_t i = 0; i < rows * x->t.max_recall; i++)
		ok &= x->t.recall[i] == TAB_SENTINEL && x->t.recall_tokens[i] == TAB_SENTINEL &&
		      x->t.recall_skip[i] == ((uint64_t)TAB_SENTINEL << 32 | TAB_SENTINEL);
	return ok;
}

static void tab_free(struct tab *x)
{
	free(x->t.n_tokens);
	free(x->t.frames);
	free(x->t.n_recall);
	free(x->t.recall);
	free(x->t.recall_tokens);
	free(x->t.recall_skip);
}

/* Plain decode attention over the n K rows at addr[] (their V rows v_offset further on) for
   the G query heads qg ([G][head_dim] f32): two passes, double sums; out [G][head_dim], lse
   [G] (NULL: not written). */
static void rows_attend(const struct kvt_pool_info *p, const struct kvt_config *c,
			const uint64_t *addr, uint32_t n, const float *qg, uint32_t G, float *out,
			float *lse)
{
	uint32_t D = c->head_dim;
	uint8_t raw[16 * 4];
	float k[16], v[16];

	assert_true(D <= 16 && p->row_bytes <= sizeof(raw));
	for (uint32_t g = 0; g < G; g++, qg += D) {
		double m = -INFINITY, sum = 0, acc[16] = {0};

		for (int pass = 0; pass < 2; pass++)
			for (uint32_t e = 0; e < n; e++) {
				double l = 0;

				t_dev_read(raw, addr[e], p->row_bytes);
				kvt_to_f32(c->dtype, raw, k, D);
				for (uint32_t d = 0; d < D; d++)
					l += (double)qg[d] * k[d];
				l /= sqrt((double)D);
				if (pass == 0) {
					m = l > m ? l : m;
					continue;
				}
				t_dev_read(raw, addr[e] + p->v_offset, p->row_bytes);
				kvt_to_f32(c->dtype, raw, v, D);
				sum += exp(l - m);
				for (uint32_t d = 0; d < D; d++)
					acc[d] += exp(l - m) * v[d];
			}
		for (uint32_t d = 0; d < D; d++)
			out[(size_t)g * D + d] = sum > 0 ? (float)(acc[d] / sum) : 0.0f;
		if (lse)
			lse[g] = sum > 0 ? (float)(m + log(sum)) : -INFINITY;
	}
}

/* Plain decode attention of row (i, h) of the tables, from the tables and the pool alone, for
   the query heads of kv head h (q: [n_q_heads][head_dim]). */
static void tab_attend(const struct tab *x, const struct kvt_pool_info *p,
		       const struct kvt_config *c, uint32_t i, uint32_t h, const float *q,
		       float *out, float *lse)
{
	const struct kvt_attn_tables *t = &x->t;
	uint32_t H = c->n_kv_heads, G = c->n_q_heads / H, bt = p->block_tokens, n = 0;
	size_t row = (size_t)i * H + h;
	uint32_t total = t->n_tokens[row] + t->n_recall[row] * bt;
	uint64_t *addr = t_xmalloc((total + 1) * sizeof(*addr));

	for (uint32_t e = 0; e < total; e++) {
		uint32_t idx, r;

		if (e < t->n_tokens[row]) { /* resident slot e */
			idx = t->frames[row * t->max_frames + e / bt];
			r = e % bt;
		} else { /* recalled: row r of entry j, unless skipped */
			size_t at = row * t->max_recall + (e - t->n_tokens[row]) / bt;

			r = (e - t->n_tokens[row]) % bt;
			if (r >= t->recall_tokens[at] || (t->recall_skip[at] >> r & 1))
				continue;
			idx = t->recall[at];
		}
		assert_true(idx < p->n_blocks);
		addr[n++] = p->base + idx * p->block_bytes + (uint64_t)r * p->row_bytes;
	}
	rows_attend(p, c, addr, n, q + (size_t)h * G * c->head_dim, G, out, lse);
	free(addr);
}

/* Plain decode attention of row r of the paged form px, from it and the pool alone (as
   FlashInfer's paged decode reads them: the resident part at page size block_tokens, the
   recalled part at page size 1, merged by their log-sum-exp), for the query heads of kv head
   r % H. */
static void paged_attend(const struct kvt_paged_tables *px, const struct kvt_pool_info *p,
			 const struct kvt_config *c, uint32_t r, const float *q, float *out)
{
	uint32_t H = c->n_kv_heads, G = c->n_q_heads / H, bt = p->block_tokens;
	int32_t p0 = px->indptr[r], p1 = px->indptr[r + 1];
	int32_t t0 = px->r_indptr[r], t1 = px->r_indptr[r + 1];
	uint64_t nres = p1 > p0 ? (uint64_t)(p1 - p0 - 1) * bt + (uint64_t)px->last_page_len[r] : 0;
	uint64_t *addr, n = 0;

	assert_true(p0 <= p1 && t0 <= t1);
	addr = t_xmalloc((nres + (uint64_t)(t1 - t0) + 1) * sizeof(*addr));
	for (uint64_t e = 0; e < nres; e++) /* pages of block_tokens rows */
		addr[n++] = p->base + (uint64_t)px->indices[p0 + e / bt] * p->block_bytes +
			    e % bt * p->row_bytes;
	for (int32_t e = t0; e < t1; e++) /* pages of one row */
		addr[n++] = p->base + (uint64_t)px->r_indices[e] * p->row_bytes;
	rows_attend(p, c, addr, (uint32_t)n, q + (size_t)(r % H) * G * c->head_dim, G, out, NULL);
	free(addr);
}

/* The tables of the open step's batch (n members, layer l) on manager m: the counts of the
   padding rows 0, the entries equal to what kvt_seq_frames and kvt_seq_recall_view give, and
   attention run from the tables and the pool alone equal (within f32 rounding) to kvt_attend.
   Returns how many recalled blocks the tables named. */
static uint32_t check_tables(struct kvt_manager *m, const struct kvt_config *c,
			     const uint64_t *batch, uint32_t n, uint32_t l, uint64_t op)
{
	struct kvt_pool_info p;
	struct kvt_recall_ref ref[R];
	uint64_t fr[TAB_FRAMES];
	int32_t pos[TAB_POS];
	uint32_t H = c->n_kv_heads, D = c->head_dim, named = 0, np;
	struct tab x;
	float q[4 * 16], want[4 * 16], got[2 * 16], lse[2];
	size_t qn = (size_t)c->n_q_heads * D, es = kvt_dtype_size(c->dtype);
	uint8_t *qb = t_xmalloc(n * qn * es), *ob = t_xmalloc(n * qn * es);
	float *ql = t_xmalloc(n * qn * sizeof(float)), *bl = t_xmalloc(n * c->n_q_heads * 4);
	float *bo = t_xmalloc(n * qn * sizeof(float));

	CHECK_RC(kvt_manager_pool(m, &p), 0);
	tab_init(&x, c, TAB_ROWS, TAB_FRAMES, R);
	tab_poison(&x, H);
	CHECK_RC(t_step_tables(m, l, &x.t, NULL), 0);
	CHECK_EQ(x.n_batch, n);
	/* the paged form: room for every frame and recalled row of the batch; the padding rows
	   empty */
	struct kvt_paged_tables px = {
		.size = sizeof(px),
		.max_batch = TAB_ROWS,
		.max_pages = TAB_ROWS * 2 * TAB_FRAMES,
		.max_tokens = TAB_ROWS * 2 * R * 8,
		.indptr = t_xmalloc((TAB_ROWS * 2 + 1) * 4),
		.indices = t_xmalloc(TAB_ROWS * 2 * TAB_FRAMES * 4),
		.last_page_len = t_xmalloc(TAB_ROWS * 2 * 4),
		.r_indptr = t_xmalloc((TAB_ROWS * 2 + 1) * 4),
		.r_indices = t_xmalloc(TAB_ROWS * 2 * R * 8 * 4),
	};
	assert_true(H <= 2 && c->block_tokens <= 8);
	CHECK_RC(t_step_paged(m, l, &px, NULL), 0);
	for (uint32_t r = n * H; r < TAB_ROWS * H; r++) {
		CHECK_EQ(px.indptr[r + 1], px.indptr[n * H]);
		CHECK_EQ(px.r_indptr[r + 1], px.r_indptr[n * H]);
		CHECK_EQ(px.last_page_len[r], 0);
	}
	for (uint32_t i = n; i < TAB_ROWS; i++)
		for (uint32_t h = 0; h < H; h++) {
			CHECK_EQ(x.t.n_tokens[i * H + h], 0);
			CHECK_EQ(x.t.n_recall[i * H + h], 0);
			CHECK_EQ(x.t.frames[(i * H + h) * TAB_FRAMES], TAB_SENTINEL);
		}
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t h = 0; h < H; h++) {
			size_t row = (size_t)i * H + h;
			uint32_t nf, ns, nr;

			CHECK_RC(kvt_seq_frames(m, batch[i], l, h, fr, TAB_FRAMES, &nf, &ns), 0);
			CHECK_EQ(x.t.n_tokens[row], ns);
			for (uint32_t f = 0; f < TAB_FRAMES; f++)
				CHECK_EQ(x.t.frames[row * TAB_FRAMES + f],
					 f < nf ? (fr[f] - p.base) / p.block_bytes : UINT32_MAX);
			CHECK_RC(kvt_seq_recall_view(m, batch[i], l, h, ref, R, &nr), 0);
			CHECK_EQ(x.t.n_recall[row], nr);
			/* the skip masks against the resident positions, by position */
			CHECK_RC(kvt_seq_resident_positions(m, batch[i], l, h, pos, TAB_POS, &np),
				 0);
			for (uint32_t j = 0; j < nr; j++) {
				uint64_t mask = 0;

				for (uint32_t k = 0; k < np; k++)
					if ((uint32_t)pos[k] / c->block_tokens == ref[j].block &&
					    (uint32_t)pos[k] % c->block_tokens < ref[j].n_valid)
						mask |= 1ull << (pos[k] % c->block_tokens);
				CHECK_EQ(ref[j].resident, mask);
			}
			for (uint32_t j = 0; j < R; j++) {
				size_t at = row * R + j;

				CHECK_EQ(x.t.recall[at],
					 j < nr ? (ref[j].frame - p.base) / p.block_bytes
						: UINT32_MAX);
				if (j < nr)
					assert_true(x.t.recall[at] >= p.first_recall);
				CHECK_EQ(x.t.recall_tokens[at], j < nr ? ref[j].n_valid : 0);
				CHECK_EQ(x.t.recall_skip[at], j < nr ? ref[j].resident : 0);
			}
			named += nr;
		}
		/* the queries, in the manager's dtype (and back: kvt_attend takes f32) */
		for (uint32_t e = 0; e < c->n_q_heads * D; e++)
			q[e] = (float)((int)(t_mix(op * 131 + i * 64 + e) % 100) - 50) / 50.0f;
		kvt_from_f32(c->dtype, q, qb + i * qn * es, qn);
		kvt_to_f32(c->dtype, qb + i * qn * es, q, qn);
		memcpy(ql + i * qn, q, qn * sizeof(float));
		CHECK_RC(kvt_attend(m, batch[i], l, q, want), 0);
		for (uint32_t h = 0; h < H; h++) {
			uint32_t G = c->n_q_heads / H;

			tab_attend(&x, &p, c, i, h, q, got, lse);
			for (uint32_t e = 0; e < G * D; e++)
				assert_float_equal(got[e], want[h * G * D + e],
						   1e-5f + 1e-4f * fabsf(want[h * G * D + e]));
			paged_attend(&px, &p, c, i * H + h, q, got);
			for (uint32_t e = 0; e < G * D; e++)
				assert_float_equal(got[e], want[h * G * D + e],
						   1e-5f + 1e-4f * fabsf(want[h * G * D + e]));
			memcpy(bl + i * c->n_q_heads + h * G, lse, G * sizeof(float));
		}
		memcpy(bo + i * qn, want, qn * sizeof(float));
	}
	/* the batched attention: kvt_attend's output (in the manager's dtype) and the plain
	   reference's log-sum-exp, for every member at once */
	memset(ob, 0xa5, n * qn * es);
	memset(lse, 0, sizeof(lse));
	{
		float *lo = t_xmalloc(n * c->n_q_heads * 4), *of = t_xmalloc(n * qn * 4);

		uint8_t *ob2 = t_xmalloc(n * qn * es);
		float *lo2 = t_xmalloc(n * c->n_q_heads * 4);

		CHECK_RC(t_step_attend(m, l, n, qb, ob, lo, NULL), 0);
		kvt_to_f32(c->dtype, ob, of, n * qn);
		for (size_t e = 0; e < n * qn; e++)
			assert_float_equal(of[e], bo[e],
					   (es == 2 ? 2e-3f : 1e-5f) * (1.0f + fabsf(bo[e])));
		for (size_t e = 0; e < (size_t)n * c->n_q_heads; e++)
			assert_float_equal(lo[e], bl[e], 1e-4f * (1.0f + fabsf(bl[e])));
		/* the plain call on the step's ids: the same, bit for bit */
		memset(ob2, 0x5a, n * qn * es);
		CHECK_RC(t_attend_batch(m, l, batch, n, qb, ob2, lo2, NULL), 0);
		assert_memory_equal(ob2, ob, n * qn * es);
		assert_memory_equal(lo2, lo, (size_t)n * c->n_q_heads * 4);
		free(ob2);
		free(lo2);
		free(lo);
		free(of);
	}
	/* the same over the tables as written, padded to their capacity: the members' rows as
	   above, the padding members' out and lse not written */
	{
		size_t qa = (size_t)TAB_ROWS * qn * es;
		uint8_t *qt = t_xmalloc(qa), *ot = t_xmalloc(qa);
		float *lo = t_xmalloc(TAB_ROWS * c->n_q_heads * 4), *of = t_xmalloc(n * qn * 4);

		memcpy(qt, qb, n * qn * es);
		memset(qt + n * qn * es, 0x3c, qa - n * qn * es);
		memset(ot, 0xa5, qa);
		for (size_t e = 0; e < (size_t)TAB_ROWS * c->n_q_heads; e++)
			lo[e] = 7.0f;
		CHECK_RC(t_attend_tables(m, &x.t, qt, ot, lo, 0, NULL), 0);
		kvt_to_f32(c->dtype, ot, of, n * qn);
		for (size_t e = 0; e < n * qn; e++)
			assert_float_equal(of[e], bo[e],
					   (es == 2 ? 2e-3f : 1e-5f) * (1.0f + fabsf(bo[e])));
		for (size_t e = 0; e < (size_t)n * c->n_q_heads; e++)
			assert_float_equal(lo[e], bl[e], 1e-4f * (1.0f + fabsf(bl[e])));
		for (size_t e = n * qn * es; e < qa; e++)
			CHECK_EQ(ot[e], 0xa5);
		for (size_t e = (size_t)n * c->n_q_heads; e < (size_t)TAB_ROWS * c->n_q_heads; e++)
			assert_true(lo[e] == 7.0f);
		free(qt);
		free(ot);
		free(lo);
		free(of);
	}
	free(qb);
	free(ob);
	free(ql);
	free(bl);
	free(bo);
	free(px.indptr);
	free(px.indices);
	free(px.last_page_len);
	free(px.r_indptr);
	free(px.r_indices);
	tab_free(&x);
	return named;
}

/* kvt_step_tables' contract: what it refuses (writing nothing), padding rows, the pool. */
static void test_step_tables_contract(void **state)
{
	struct kvt_config c = step_config(64);
	struct kvt_manager *m = t_mk(&c);
	uint64_t ids[3] = {1, 2, 3};
	uint32_t H = c.n_kv_heads, sel[3 * 2 * R];
	struct kvt_pool_info p;
	struct kvt_attn_tables bad;
	struct tab x;
	uint8_t qb[3 * 4 * 16 * 2], ob[3 * 4 * 16 * 2];
	float lo[3 * 4];
	int rc;
	(void)state;

	memset(qb, 0, sizeof(qb));

	for (uint32_t i = 0; i < 3 * H * R; i++)
		sel[i] = 2 + (i * 7) % 20;
	for (uint64_t id = 1; id <= 3; id++)
		t_prefill_seq(m, &c, id, 200);
	tab_init(&x, &c, 4, TAB_FRAMES, R);

	CHECK_RC(kvt_manager_pool(NULL, &p), -EINVAL);
	CHECK_RC(kvt_manager_pool(m, NULL), -EINVAL);
	CHECK_RC(kvt_manager_pool(m, &p), 0);
	CHECK_EQ(p.block_tokens, c.block_tokens);
	CHECK_EQ(p.row_bytes, t_rowb(&c));
	CHECK_EQ(p.v_offset, (uint64_t)c.block_tokens * p.row_bytes);
	CHECK_EQ(p.block_bytes, 2 * p.v_offset);
	/* the recall cache is the pool's tail: step_config's frames */
	CHECK_EQ(p.n_blocks - p.first_recall, 64);

	/* refused before a step, or with bad arguments: nothing written */
	tab_poison(&x, H);
	CHECK_RC(kvt_step_tables(NULL, 0, &x.t, NULL), -EINVAL);
	CHECK_RC(t_step_tables(m, 0, &x.t, NULL), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "no step begun"));
	CHECK_RC(kvt_step_attend(NULL, 0, qb, ob, lo, NULL), -EINVAL);
	CHECK_RC(t_step_attend(m, 0, 3, qb, ob, lo, NULL), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "no step begun"));
	CHECK_RC(kvt_attend_batch(NULL, 0, ids, 3, qb, ob, lo, NULL), -EINVAL);
	CHECK_RC(kvt_attend_batch(m, 0, NULL, 3, qb, ob, lo, NULL), -EINVAL);
	CHECK_RC(kvt_attend_batch(m, 0, ids, 0, qb, ob, lo, NULL), -EINVAL);
	CHECK_RC(kvt_attend_batch(m, 0, (uint64_t[]){1, 1}, 2, qb, ob, lo, NULL), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "twice"));
	CHECK_RC(kvt_attend_batch(m, 0, (uint64_t[]){1, 77}, 2, qb, ob, lo, NULL), -ENOENT);
	CHECK_RC(kvt_attend_batch(m, 0, ids, 3, NULL, ob, lo, NULL), -EINVAL);
	CHECK_RC(kvt_attend_batch(m, 0, ids, 3, qb, NULL, lo, NULL), -EINVAL);
	CHECK_RC(kvt_attend_batch(m, c.n_layers, ids, 3, qb, ob, lo, NULL), -EINVAL);
	assert_true(tab_untouched(&x, H));
	CHECK_RC(kvt_step_begin(m, ids, 3), 0);
	CHECK_RC(kvt_step_tables(m, 0, NULL, NULL), -EINVAL);
	bad = x.t;
	bad.size = 8;
	CHECK_RC(t_step_tables(m, 0, &bad, NULL), -EINVAL);
	bad = x.t;
	bad.recall_skip = NULL;
	CHECK_RC(kvt_step_tables(m, 0, &bad, NULL), -EINVAL);
	CHECK_RC(t_step_tables(m, c.n_layers, &x.t, NULL), -EINVAL);
	bad = x.t;
	bad.max_batch = 2;
	CHECK_RC(t_step_tables(m, 0, &bad, NULL), -ENOSPC);
	bad = x.t;
	bad.max_frames = 2;
	CHECK_RC(t_step_tables(m, 0, &bad, NULL), -ENOSPC);
	assert_non_null(strstr(kvt_manager_last_error(m), "frames"));
	assert_true(tab_untouched(&x, H));

	/* before any recall: resident parts only, the padding row's counts 0 */
	CHECK_EQ(check_tables(m, &c, ids, 3, 0, 1), 0);
	CHECK_RC(t_step_tables(m, 0, &x.t, NULL), 0);
	CHECK_EQ(x.n_batch, 3);
	for (uint32_t h = 0; h < H; h++) {
		CHECK_EQ(x.t.n_tokens[3 * H + h], 0);
		CHECK_EQ(x.t.n_recall[3 * H + h], 0);
		CHECK_EQ(x.t.frames[(3 * H + h) * TAB_FRAMES], TAB_SENTINEL); /* left alone */
	}

	/* attention over the caller's tables: what it refuses; tables naming blocks outside the
	   pool or counts past the capacities are read as clamped, never outside the pool */
	{
		enum { QA = 4 * 4 * 16 * 2 };
		uint8_t qa[QA], oa[QA], ok[QA];
		float la[4 * 4], lk[4 * 4];
		uint32_t G = c.n_q_heads / H, r = 1 * H + 1; /* member 1, kv head 1 */
		uint64_t need = 7;
		size_t es = kvt_dtype_size(c.dtype), hb = (size_t)G * c.head_dim * es;

		for (size_t i = 0; i < QA; i++)
			qa[i] = (uint8_t)(t_mix(i) % 61); /* small finite f16/bf16 values */
		bad = x.t;
		CHECK_RC(kvt_attend_tables(NULL, &bad, qa, oa, la, NULL, 0, NULL), -EINVAL);
		CHECK_RC(kvt_attend_tables(m, NULL, qa, oa, la, NULL, 0, NULL), -EINVAL);
		CHECK_RC(kvt_attend_tables_scratch(m, &bad, NULL), -EINVAL);
		CHECK_RC(kvt_attend_tables_scratch(NULL, &bad, &need), -EINVAL);
		bad.size = 8;
		CHECK_RC(kvt_attend_tables_scratch(m, &bad, &need), -EINVAL);
		CHECK_EQ(need, 7);
		bad = x.t;
		bad.frames = NULL;
		CHECK_RC(kvt_attend_tables(m, &bad, qa, oa, la, NULL, 0, NULL), -EINVAL);
		bad = x.t;
		bad.max_recall = 0;
		CHECK_RC(kvt_attend_tables(m, &bad, qa, oa, la, NULL, 0, NULL), -EINVAL);
		assert_non_null(strstr(kvt_manager_last_error(m), "capacity"));
		CHECK_RC(t_attend_tables(m, &x.t, NULL, oa, la, 0, NULL), -EINVAL);
		CHECK_RC(t_attend_tables(m, &x.t, qa, NULL, la, 0, NULL), -EINVAL);
		CHECK_RC(kvt_attend_tables_scratch(m, &x.t, &need), 0);
		if (t_be->kind == KVT_BACKEND_HOST) {
			CHECK_EQ(need, 0);
		} else {
			assert_true(need > 0);
			CHECK_RC(t_attend_tables(m, &x.t, qa, oa, la, 1, NULL), -ENOSPC);
		}
		CHECK_RC(t_attend_tables(m, &x.t, qa, ok, lk, 0, NULL), 0);
		/* row r names nothing in the pool, with counts past every capacity */
		bad = x.t;
		bad.n_tokens = t_xmalloc(4 * H * 4);
		bad.frames = t_xmalloc(4 * H * TAB_FRAMES * 4);
		bad.n_recall = t_xmalloc(4 * H * 4);
		bad.recall = t_xmalloc(4 * H * R * 4);
		memcpy(bad.n_tokens, x.t.n_tokens, 4 * H * 4);
		memcpy(bad.frames, x.t.frames, 4 * H * TAB_FRAMES * 4);
		memcpy(bad.n_recall, x.t.n_recall, 4 * H * 4);
		memcpy(bad.recall, x.t.recall, 4 * H * R * 4);
		bad.n_tokens[r] = UINT32_MAX;
		bad.n_recall[r] = R + 3;
		for (uint32_t f = 0; f < TAB_FRAMES; f++)
			bad.frames[r * TAB_FRAMES + f] = (uint32_t)p.n_blocks + f;
		for (uint32_t j = 0; j < R; j++)
			bad.recall[r * R + j] = UINT32_MAX - j;
		memset(oa, 0xa5, sizeof(oa));
		CHECK_RC(t_attend_tables(m, &bad, qa, oa, la, 0, NULL), 0);
		for (uint32_t rr = 0; rr < 3 * H; rr++) {
			for (size_t e = 0; e < hb; e++)
				CHECK_EQ(oa[rr * hb + e], rr == r ? 0 : ok[rr * hb + e]);
			for (uint32_t g = 0; g < G; g++)
				assert_true(rr == r ? la[rr * G + g] == -INFINITY
						    : la[rr * G + g] == lk[rr * G + g]);
		}
		free(bad.n_tokens);
		free(bad.frames);
		free(bad.n_recall);
		free(bad.recall);
	}

	/* the paged form: refused without room for the pages or the recalled tokens, writing
	   nothing */
	{
		int32_t ip[4 * 2 + 1], ix[4], lp[4 * 2], rp[4 * 2 + 1], rx[4];
		struct kvt_paged_tables pt = {sizeof(pt), 4, 4, 4, ip, ix, lp, rp, rx};

		memset(ip, 0x5a, sizeof(ip));
		CHECK_RC(kvt_step_paged(NULL, 0, &pt, NULL), -EINVAL);
		CHECK_RC(kvt_step_paged(m, 0, NULL, NULL), -EINVAL);
		pt.size = 4;
		CHECK_RC(kvt_step_paged(m, 0, &pt, NULL), -EINVAL);
		pt.size = sizeof(pt);
		pt.max_batch = 2;
		CHECK_RC(t_step_paged(m, 0, &pt, NULL), -ENOSPC);
		pt.max_batch = 4;
		CHECK_RC(t_step_paged(m, 0, &pt, NULL), -ENOSPC); /* 4 pages: far too few */
		assert_non_null(strstr(kvt_manager_last_error(m), "pages"));
		for (size_t i = 0; i < sizeof(ip) / sizeof(ip[0]); i++)
			CHECK_EQ((uint32_t)ip[i], 0x5a5a5a5au);
	}

	/* after a recall: the views too; a view that does not fit is refused */
	CHECK_RC(kvt_step_recall_blocks(m, 0, sel, R, NULL), 0);
	assert_true(check_tables(m, &c, ids, 3, 0, 2) > 0);
	tab_poison(&x, H);
	bad = x.t;
	bad.max_recall = 1;
	CHECK_RC(t_step_tables(m, 0, &bad, NULL), -ENOSPC);
	assert_true(tab_untouched(&x, H));

	/* a recall whose load fails leaves its views stale: refused until recalled again */
	for (uint32_t i = 0; i < 3 * H * R; i++)
		sel[i] = 22 - (i * 5) % 18;
	CHECK_RC(kvt_fault_arm(1u << KVT_FAULT_XFER, 1), 0);
	rc = kvt_step_recall_blocks(m, 0, sel, R, NULL);
	kvt_fault_disarm();
	CHECK_RC(rc, -EIO);
	CHECK_RC(t_step_tables(m, 0, &x.t, NULL), -ESTALE);
	CHECK_RC(t_step_attend(m, 0, 3, qb, ob, lo, NULL), -ESTALE);
	assert_true(tab_untouched(&x, H));
	CHECK_RC(kvt_step_recall_blocks(m, 0, sel, R, NULL), 0);
	assert_true(check_tables(m, &c, ids, 3, 0, 3) > 0);

	/* members preempted or destroyed inside the step; the batched attention refuses what
	   the tables refuse, and writes nothing either */
	tab_poison(&x, H);
	memset(ob, 0xa5, sizeof(ob));
	CHECK_RC(kvt_seq_preempt(m, 2), 0);
	CHECK_RC(t_step_tables(m, 1, &x.t, NULL), -EINVAL);
	CHECK_RC(t_step_attend(m, 1, 3, qb, ob, lo, NULL), -EINVAL);
	assert_true(tab_untouched(&x, H));
	CHECK_RC(kvt_seq_destroy(m, 2), 0);
	CHECK_RC(t_step_tables(m, 1, &x.t, NULL), -ENOENT);
	CHECK_RC(t_step_attend(m, 1, 3, qb, ob, lo, NULL), -ENOENT);
	assert_true(tab_untouched(&x, H));
	for (size_t i = 0; i < sizeof(ob); i++)
		CHECK_EQ(ob[i], 0xa5);
	CHECK_RC(kvt_step_end(m), 0);
	CHECK_RC(kvt_step_begin(m, (uint64_t[]){3, 1}, 2), 0);
	CHECK_EQ(check_tables(m, &c, (uint64_t[]){3, 1}, 2, 1, 4), 0);
	assert_true(check_tables(m, &c, (uint64_t[]){3, 1}, 2, 0, 5) > 0);
	CHECK_RC(kvt_step_end(m), 0);
	CHECK_RC(kvt_recall_check(m), 0);
	tab_free(&x);
	kvt_manager_destroy(m);
}

/* The stream of manager 1's next call on layer l (walk's `streams`; NULL without): one of st[3]
   at random, ordered after that layer's latest call (lay[l]). */
static void *layer_stream(void *const *st, void **lay, uint32_t l, bool streams)
{
	void *s;

	if (!streams)
		return NULL;
	s = st[t_rng_below(3)];
	t_be->stream_after(s, lay[l]);
	lay[l] = s;
	return s;
}

/* The legacy stream after every stream's work so far, and each layer's next call after it. */
static void streams_join(void *const *st, void **lay, uint32_t n_layers, bool streams)
{
	if (!streams)
		return;
	for (int x = 0; x < 3; x++)
		t_be->stream_after(NULL, st[x]);
	for (uint32_t l = 0; l < n_layers; l++)
		lay[l] = NULL;
}

/* Steps are the plain calls: manager 0 runs each decode step as kvt_step_begin (which reads the
   batch's spilled blocks back and freezes the sums the recall's sizing reads) and, per layer,
   the plain kvt_decode_append and kvt_decode_recall or kvt_recall_blocks naming the batch;
   manager 1 as kvt_step_begin, kvt_step_append, kvt_step_recall or kvt_step_recall_blocks,
   both then kvt_step_end. Random batches in random order, a
   host tier a third of the histories (the disk tier reads blocks back), a recall cache small
   enough to evict; between steps preempt, resume, destroy and prefill again; inside a step a
   member destroyed (and sometimes created and prefilled again under its id: the step must
   find the new one, not the freed state) or preempted. After every call: the same result,
   every counter, the views of the batch and attention over them.
   With `twin_cpu`, manager 0 keeps its recall regions on the CPU: on a backend that keeps them
   on its device (dev_regions), the two must still agree, call for call, frame for frame; with
   a disk tier too, the device's calls read spilled blocks back (dev_repair) as the CPU's
   do. With `streams`, manager 1's step calls go to three streams of their own at random
   (non-blocking on the CUDA backend), ordered as an engine orders them: a layer's calls after
   that layer's calls before (its tokens, its recall), everything after the legacy stream's
   work and the legacy stream after everything before a call that is not a step call and
   before the checks. Calls of different layers are left unordered, and a lazy step checks
   nothing until later: what orders their work is the manager's own doing. */
static void walk(bool disk, bool twin_cpu, bool streams)
{
	struct kvt_config c = step_config(72);
	struct kvt_manager *mm[2];
	char dir[] = "/tmp/kvt-step-XXXXXX";
	uint64_t seed = t_pick_seed(), ids[SEQS], batch[SEQS], origin[2] = {0, 0};
	bool live[SEQS], pre[SEQS];
	uint32_t sel[SEQS * 2 * R], steps = 0, unbegun = 0, scored = 0, broken = 0, reborn = 0,
				    refused = 0, lazies = 0, tabled = 0, devsel = 0, badsel = 0;
	size_t row = t_rowb(&c), qs = (size_t)c.n_q_heads * row;
	uint8_t *k = t_xmalloc(SEQS * c.n_kv_heads * row),
		*v = t_xmalloc(SEQS * c.n_kv_heads * row);
	uint8_t *q = t_xmalloc(SEQS * qs);
	long ops = t_pick_ops(1600);
	/* streams: manager 1's, and the one each layer's latest call went to */
	void *st[3] = {NULL, NULL, NULL}, *lay[4] = {NULL, NULL, NULL, NULL};

	print_message("# step: seed %llu%s%s%s\n", (unsigned long long)seed,
		      disk ? "" : ", no disk", twin_cpu ? ", the twin's regions on the CPU" : "",
		      streams ? ", three streams" : "");
	assert_true(c.n_layers <= 4);
	for (int x = 0; streams && x < 3; x++)
		st[x] = t_be->stream_new();
	t_rng_seed(seed);
	assert_non_null(mkdtemp(dir));
	c.spill_dir = disk ? dir : NULL;
	c.host_bytes = t_budget(&c, disk ? 220 : 4000);
	c.device_bytes = t_budget(&c, 300) + c.recall_cache_bytes;
	for (int m = 0; m < 2; m++)
		mm[m] = t_mk(&c);
	if (twin_cpu) {
		print_message("# step: recall regions on the device: %s\n",
			      mm[1]->dev_regions ? "yes (the twin's on the CPU)" : "no");
		mm[0]->dev_regions = false;
	}
	for (uint32_t i = 0; i < SEQS; i++) {
		ids[i] = 500 + i;
		for (int m = 0; m < 2; m++)
			t_prefill_seq(mm[m], &c, ids[i], 60 + 9 * i);
		live[i] = true;
		pre[i] = false;
	}
	for (long op = 0; op < ops; op++) {
		uint32_t what = t_rng_below(100), i = t_rng_below(SEQS), n = 0, bad = NONE;
		/* a third of the steps look at nothing but the calls' results until a later
		   operation: the device's calls are settled late (at the layer's next call, a
		   sequence given back, the figures read) */
		bool lazy = t_rng_below(3) == 0;
		int rc[2];

		if (what < 75) { /* a decode step over live sequences in random order */
			uint32_t want = 1 + t_rng_below(SEQS), hit = NONE;

			for (uint32_t x = 0; x < SEQS && n < want; x++) {
				uint32_t y = (i + x * 5) % SEQS;

				if (live[y] && !pre[y])
					batch[n++] = ids[y];
			}
			if (!n)
				continue;
			rc[0] = kvt_step_begin(mm[0], batch, n);
			rc[1] = kvt_step_begin(mm[1], batch, n);
			CHECK_EQ(rc[0], rc[1]);
			if (rc[1]) {
				unbegun++;
				continue;
			}
			steps++;
			if (t_rng_below(8) == 0)
				hit = t_rng_below(n); /* a member goes away inside the step */
			for (uint32_t l = 0; l < c.n_layers; l++) {
				if (hit != NONE && l == 1) {
					uint32_t y = (uint32_t)(batch[hit] - 500);
					bool kill = pre[y] || t_rng_below(2);

					streams_join(st, lay, c.n_layers, streams);

					broken++;
					for (int m = 0; m < 2; m++)
						CHECK_RC(kill ? kvt_seq_destroy(mm[m], batch[hit])
							      : kvt_seq_preempt(mm[m], batch[hit]),
							 0);
					live[y] = !kill;
					pre[y] = !kill;
					if (!live[y] && t_rng_below(2)) { /* back under its id */
						for (int m = 0; m < 2; m++)
							t_prefill_seq(mm[m], &c, batch[hit],
								      50 + op % 90);
						live[y] = true;
						reborn++;
					}
				}
				batch_tokens(mm[0], &c, batch, n, l, k, v);
				rc[0] = t_decode_append(mm[0], l, batch, n, k, v, NULL);
				rc[1] = t_step_append(mm[1], l, n, k, v,
						      layer_stream(st, lay, l, streams));
				CHECK_EQ(rc[0], rc[1]);
				if (!lazy) {
					streams_join(st, lay, c.n_layers, streams);
					same_stats(mm);
				}
				bad = NONE;
				if (t_rng_below(2)) { /* Quest: the managers score */
					for (uint32_t x = 0; x < n; x++)
						for (uint32_t g = 0; g < c.n_q_heads; g++)
							t_fill_row(c.dtype, c.head_dim,
								   q + x * qs + g * row, batch[x],
								   77, 2000 + g, (uint32_t)op, 0);
					rc[0] = t_decode_recall(mm[0], l, batch, n, q, NULL);
					rc[1] = t_step_recall(mm[1], l, n, q,
							      layer_stream(st, lay, l, streams));
					scored++;
				} else {
					/* a third given in device memory, a quarter of those with
					   a member's naming a block past its history */
					bool dev = t_rng_below(3) == 0;

					bad = dev && t_rng_below(4) == 0 ? t_rng_below(n) : NONE;
					for (uint32_t x = 0; x < n; x++) {
						uint32_t tok = 0, nb;

						if (kvt_seq_tokens(mm[0], batch[x], l, &tok))
							tok = 0;
						nb = DIV_UP(tok, c.block_tokens);
						for (uint32_t j = 0; j < c.n_kv_heads * R; j++)
							sel[x * c.n_kv_heads * R + j] =
								!nb || t_rng_below(10) == 0
									? NONE
									: t_rng_below(nb);
						if (x == bad)
							sel[x * c.n_kv_heads * R +
							    t_rng_below(c.n_kv_heads * R)] =
								nb + t_rng_below(3);
					}
					if (dev) {
						rc[0] = t_recall_device_blocks(mm[0], l, batch, n,
									       sel, R, NULL);
						rc[1] = t_step_recall_device_blocks(
							mm[1], l, n, sel, R,
							layer_stream(st, lay, l, streams));
						devsel++;
					} else {
						rc[0] = kvt_recall_blocks(mm[0], l, batch, n, sel,
									  R, NULL);
						rc[1] = kvt_step_recall_blocks(
							mm[1], l, sel, R,
							layer_stream(st, lay, l, streams));
					}
				}
				CHECK_EQ(rc[0], rc[1]);
				refused += rc[0] != 0;
				lazies += lazy;
				if (lazy)
					continue;
				streams_join(st, lay, c.n_layers, streams);
				same_stats(mm);
				for (uint32_t x = 0; x < n; x++)
					t_same_views(mm, &c, batch[x], l, R, origin);
				if (origin[0])
					for (uint32_t x = 0; x < n; x++)
						t_same_region(mm, batch[x], l, origin);
				if (rc[0] == 0 && bad != NONE) {
					/* left out, the others recalled: its views say why */
					struct kvt_recall_ref one[R];
					uint32_t got;

					for (int m = 0; m < 2; m++) {
						CHECK_RC(kvt_seq_recall_view(mm[m], batch[bad], l,
									     0, one, R, &got),
							 -ESTALE);
						assert_non_null(
							strstr(kvt_manager_last_error(mm[m]),
							       "selection named a block"));
					}
					badsel++;
					continue;
				}
				if (rc[0] == 0) {
					float qa[4 * 16], o[2][4 * 16];

					for (uint32_t x = 0; x < 4 * 16; x++)
						qa[x] = (float)((int)(t_mix(op * 64 + x) % 100) -
								50) /
							50.0f;
					for (int m = 0; m < 2; m++)
						CHECK_RC(kvt_attend(mm[m], batch[0], l, qa, o[m]),
							 0);
					assert_memory_equal(o[0], o[1], sizeof(o[0]));
					tabled += check_tables(mm[1], &c, batch, n, l, op);
				}
			}
			for (int m = 0; m < 2; m++)
				CHECK_RC(kvt_step_end(mm[m]), 0);
			if (lazy)
				continue;
		} else if (what < 90 && live[i]) { /* preempt or resume */
			streams_join(st, lay, c.n_layers, streams);
			for (int m = 0; m < 2; m++)
				rc[m] = pre[i] ? kvt_seq_resume(mm[m], ids[i], NULL)
					       : kvt_seq_preempt(mm[m], ids[i]);
			CHECK_EQ(rc[0], rc[1]);
			if (rc[0] == 0)
				pre[i] = !pre[i];
		} else if (live[i]) { /* destroy, and prefill again */
			streams_join(st, lay, c.n_layers, streams);
			for (int m = 0; m < 2; m++) {
				CHECK_RC(kvt_seq_destroy(mm[m], ids[i]), 0);
				t_prefill_seq(mm[m], &c, ids[i], 40 + t_mix(op) % 120);
			}
			pre[i] = false;
		} else { /* a sequence destroyed inside a step comes back */
			streams_join(st, lay, c.n_layers, streams);
			for (int m = 0; m < 2; m++)
				t_prefill_seq(mm[m], &c, ids[i], 40 + t_mix(op) % 120);
			live[i] = true;
			pre[i] = false;
		}
		streams_join(st, lay, c.n_layers, streams);
		same_stats(mm);
		/* frames conserved, regions consistent (the sizing regroups their frames) */
		for (int m = 0; m < 2; m++)
			CHECK_RC(kvt_recall_check(mm[m]), 0);
	}
	struct kvt_stats a = t_stats_of(mm[0]);

	print_message("# step: %u steps (%u refused at begin; %u recalls scored, %u with a member "
		      "gone, %u reborn, %u calls refused, %u left unchecked until later), %llu "
		      "recall loads, %llu evictions, %llu disk reads\n",
		      steps, unbegun, scored, broken, reborn, refused, lazies,
		      (unsigned long long)a.recall_loads, (unsigned long long)a.recall_evictions,
		      (unsigned long long)a.disk_blocks_fetched);
	print_message(
		"# step: the attention tables named %u recalled blocks; %u selections given in "
		"device memory, %u with a member's past its history\n",
		tabled, devsel, badsel);
	/* the walk reached what it is about */
	assert_true(steps > 0 && scored > 0 && broken > 0 && refused > 0 && lazies > 0);
	assert_true(tabled > 0 && devsel > 0 && badsel > 0);
	assert_true(a.recall_evictions > 0);
	assert_true(disk ? a.disk_blocks_fetched > 0 : a.disk_blocks_fetched == 0);
	if (disk && mm[1]->dev_regions) { /* the device's calls read spilled blocks back */
		print_message("# step: %llu device calls read blocks back from disk\n",
			      (unsigned long long)mm[1]->rc.repairs);
		assert_true(mm[1]->rc.repairs > 0);
	}
	streams_join(st, lay, c.n_layers, streams);
	CHECK_RC(kvt_manager_sync(mm[1], NULL), 0);
	for (int x = 0; x < 3; x++)
		t_be->stream_free(st[x]);
	for (int m = 0; m < 2; m++)
		kvt_manager_destroy(mm[m]);
	free(k);
	free(v);
	free(q);
	rmdir(dir);
}

static void test_step_same_as_plain(void **state)
{
	(void)state;
	walk(true, false, false);
}

static void test_step_device_as_host(void **state)
{
	(void)state;
	walk(false, true, false);
}

/* The same, manager 1's calls on three streams of their own (see walk): a layer's calls on
   the device unordered with the other layer's, as an engine leaves them. */
static void test_step_device_as_host_streams(void **state)
{
	(void)state;
	walk(true, true, true);
}

static void test_step_device_as_host_disk(void **state)
{
	(void)state;
	walk(true, true, false);
}

/* A recall call whose loads read spilled blocks back, each disk I/O of that read failed in turn
   (KVT_FAULT_IO) on both managers: manager 1 keeps its recall regions on the device where the
   backend can (its call reads the blocks back and loads them again: dev_repair), manager 0 on
   the CPU. Each failed call fails alike, leaves the regions equal (its loads undone) and its
   views stale, and changes no figure differently; the walk ends with the call succeeding
   alike. */
static void test_step_recall_disk_faults(void **state)
{
	struct kvt_config c = step_config(64);
	struct kvt_manager *mm[2];
	char dir[] = "/tmp/kvt-step-r-XXXXXX";
	uint64_t ids[3] = {1, 2, 3}, origin[2] = {0, 0};
	uint32_t H = c.n_kv_heads, sel[3 * 8 * R], walked = 0;
	(void)state;

	assert_true(H <= 8);
	assert_non_null(mkdtemp(dir));
	c.spill_dir = dir;
	for (int m = 0; m < 2; m++) {
		mm[m] = t_mk(&c);
		for (uint32_t i = 0; i < 3; i++)
			t_prefill_seq(mm[m], &c, ids[i], 240);
	}
	mm[0]->dev_regions = false;
	/* blocks between the sink and the ring, some of them repeated across heads */
	for (uint32_t x = 0; x < 3 * H * R; x++)
		sel[x] = 2 + (x * 7) % 24;
	for (uint32_t l = 0; l < c.n_layers; l++) /* the regions hold blocks */
		for (int m = 0; m < 2; m++)
			CHECK_RC(kvt_recall_blocks(mm[m], l, ids, 3, sel, R, NULL), 0);
	for (uint32_t x = 0; x < 3 * H * R; x++) /* other blocks: loads */
		sel[x] = 3 + (x * 5) % 23;
	for (uint64_t nth = 1;; nth++) {
		int rc[2];

		for (int m = 0; m < 2; m++) {
			CHECK_RC(kvt_seq_spill(mm[m], 3), 0);
			CHECK_RC(kvt_fault_arm(1u << KVT_FAULT_IO, nth), 0);
			rc[m] = kvt_recall_blocks(mm[m], 0, ids, 3, sel, R, NULL);
			kvt_fault_disarm();
		}
		CHECK_EQ(rc[0], rc[1]);
		same_stats(mm);
		for (uint32_t i = 0; i < 3; i++) {
			t_same_views(mm, &c, ids[i], 0, R, origin);
			if (origin[0])
				t_same_region(mm, ids[i], 0, origin);
		}
		for (int m = 0; m < 2; m++)
			CHECK_RC(kvt_recall_check(mm[m]), 0);
		if (rc[0] == 0)
			break;
		walked++;
		assert_true(rc[0] == -EIO || rc[0] == -EBADMSG || rc[0] == -ENOMEM);
		assert_true(nth < 1000);
	}
	print_message("# step recall disk faults: %u failed calls walked; the device's calls read "
		      "blocks back %llu times\n",
		      walked, (unsigned long long)mm[1]->rc.repairs);
	assert_true(walked > 0);
	assert_true(t_stats_of(mm[0]).disk_blocks_fetched > 0);
	if (mm[1]->dev_regions) /* every call read blocks back: the failed ones, the last */
		CHECK_EQ(mm[1]->rc.repairs, walked + 1);
	for (int m = 0; m < 2; m++)
		kvt_manager_destroy(mm[m]);
	rmdir(dir);
}

/* Tokens of (seq, layer 0). */
static uint32_t toks(struct kvt_manager *m, uint64_t seq)
{
	return t_tokens_of(m, seq, 0);
}

/* The step's own contract: what needs an open step, what begin refuses (leaving the open step
   as it was), a begin replacing the open step, members destroyed, re-created or preempted
   while it is open. */
static void test_step_contract(void **state)
{
	struct kvt_config c = step_config(64);
	struct kvt_manager *m = t_mk(&c);
	uint64_t a[2] = {1, 2}, b[2] = {3, 1}, dup[2] = {1, 1}, unk[2] = {1, 99};
	size_t row = t_rowb(&c);
	uint8_t *k = t_xmalloc(2 * c.n_kv_heads * row), *v = t_xmalloc(2 * c.n_kv_heads * row);
	uint8_t *q = t_xmalloc(2 * c.n_q_heads * row);
	uint32_t sel[2 * 2 * R];
	struct kvt_stats s0, s1;
	(void)state;

	for (uint32_t i = 0; i < 2 * 2 * R; i++)
		sel[i] = i % 3 ? 0 : NONE;
	memset(q, 0, 2 * c.n_q_heads * row);
	for (uint64_t id = 1; id <= 4; id++)
		t_prefill_seq(m, &c, id, 64);

	/* NULL manager */
	CHECK_RC(kvt_step_begin(NULL, a, 2), -EINVAL);
	CHECK_RC(kvt_step_append(NULL, 0, k, v, NULL), -EINVAL);
	CHECK_RC(kvt_step_recall(NULL, 0, q, NULL), -EINVAL);
	CHECK_RC(kvt_step_recall_blocks(NULL, 0, sel, R, NULL), -EINVAL);
	CHECK_RC(kvt_step_end(NULL), -EINVAL);

	/* no step open: nothing runs, nothing changes */
	s0 = t_stats_of(m);
	CHECK_RC(t_step_append(m, 0, 2, k, v, NULL), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "no step begun"));
	CHECK_RC(t_step_recall(m, 0, 2, q, NULL), -EINVAL);
	CHECK_RC(kvt_step_recall_blocks(m, 0, sel, R, NULL), -EINVAL);
	CHECK_RC(kvt_step_end(m), -EALREADY);
	s1 = t_stats_of(m);
	CHECK_STATS_EQUAL(&s0, &s1);
	CHECK_EQ(toks(m, 1), 64);

	/* begin's refusals leave the open step (a) as it was */
	CHECK_RC(kvt_step_begin(m, a, 2), 0);
	CHECK_RC(kvt_step_begin(m, NULL, 2), -EINVAL);
	CHECK_RC(kvt_step_begin(m, a, 0), -EINVAL);
	CHECK_RC(kvt_step_begin(m, dup, 2), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "twice"));
	CHECK_RC(kvt_step_begin(m, unk, 2), -ENOENT);
	CHECK_RC(kvt_seq_preempt(m, 4), 0);
	uint64_t pre[2] = {3, 4};

	CHECK_RC(kvt_step_begin(m, pre, 2), -EINVAL);
	assert_non_null(strstr(kvt_manager_last_error(m), "preempted"));
	t_fill_decode(&c, a, (uint32_t[]){64, 64}, 2, 0, k, v);
	CHECK_RC(t_step_append(m, 0, 2, k, v, NULL), 0);
	CHECK_EQ(toks(m, 1), 65);
	CHECK_EQ(toks(m, 2), 65);
	CHECK_EQ(toks(m, 3), 64);
	CHECK_RC(kvt_step_recall_blocks(m, 0, sel, R, NULL), 0);
	CHECK_RC(t_step_recall(m, 0, 2, q, NULL), 0);

	/* a begin replaces the open step, in its order: row 0 is sequence 3 now */
	CHECK_RC(kvt_step_begin(m, b, 2), 0);
	t_fill_decode(&c, b, (uint32_t[]){64, 65}, 2, 0, k, v);
	CHECK_RC(t_step_append(m, 0, 2, k, v, NULL), 0);
	CHECK_EQ(toks(m, 1), 66);
	CHECK_EQ(toks(m, 2), 65);
	CHECK_EQ(toks(m, 3), 65);
	{
		uint8_t got[2][64], want[2][64];

		assert_true(row <= sizeof(got[0]));
		CHECK_RC(kvt_seq_read_token(m, 3, 0, 0, 64, got[0], got[1]), 0);
		t_fill_row(c.dtype, c.head_dim, want[0], 3, 0, 0, 64, 0);
		t_fill_row(c.dtype, c.head_dim, want[1], 3, 0, 0, 64, 1);
		assert_memory_equal(got[0], want[0], row);
		assert_memory_equal(got[1], want[1], row);
	}

	/* a member destroyed while the step is open: the next call fails as the plain one
	   would, and changes nothing; re-created under its id, the step finds the new one */
	CHECK_RC(kvt_seq_destroy(m, 3), 0);
	s0 = t_stats_of(m);
	CHECK_RC(t_step_append(m, 1, 2, k, v, NULL), -ENOENT);
	CHECK_RC(t_step_recall(m, 1, 2, q, NULL), -ENOENT);
	s1 = t_stats_of(m);
	CHECK_STATS_EQUAL(&s0, &s1);
	CHECK_EQ(t_tokens_of(m, 1, 1), 64);
	t_prefill_seq(m, &c, 3, 40);
	t_fill_decode(&c, b, (uint32_t[]){40, 64}, 2, 1, k, v);
	CHECK_RC(t_step_append(m, 1, 2, k, v, NULL), 0);
	CHECK_EQ(t_tokens_of(m, 3, 1), 41);
	CHECK_EQ(t_tokens_of(m, 1, 1), 65);

	/* preempted while open: -EINVAL, as the plain call; resumed, the step goes on */
	CHECK_RC(kvt_seq_preempt(m, 1), 0);
	CHECK_RC(t_step_recall(m, 1, 2, q, NULL), -EINVAL);
	CHECK_RC(kvt_seq_resume(m, 1, NULL), 0);
	CHECK_RC(t_step_recall(m, 1, 2, q, NULL), 0);
	CHECK_RC(kvt_step_end(m), 0);
	CHECK_RC(kvt_step_end(m), -EALREADY);
	CHECK_RC(t_step_append(m, 0, 2, k, v, NULL), -EINVAL);

	kvt_manager_destroy(m);
	free(k);
	free(v);
	free(q);
}

/* A sequence's part of the sums the sizing reads, as the recall cache froze them. */
static uint64_t frozen_part(const struct kvt_manager *m, uint64_t id)
{
	const struct kvt_seq *s = kvt_seqmap_get(&m->seqs, id);

	assert_non_null(s);
	return s->ws_snap_at == m->rc.snap_at ? s->ws_snap : s->ws_counted;
}

/* The slots of a sequence's region of layer l. */
static uint32_t slots_of(const struct kvt_manager *m, uint64_t id, uint32_t l)
{
	const struct kvt_seq *s = kvt_seqmap_get(&m->seqs, id);

	assert_non_null(s);
	return s->layers[l].rc ? s->layers[l].rc->rg.n_slots : 0;
}

/* Every recall of a step sizes its regions by the working sets as they were counted when the
   step began (kvt_step_begin freezes the cache's sum, each layer's and each sequence's): the
   layers' calls count their members' working sets meanwhile, which moves the live sums, and
   the frozen ones stay put until the next step. Outside a step each call freezes them. */
static void test_step_sizing_frozen(void **state)
{
	struct kvt_config c = step_config(24);
	struct kvt_manager *m, *twin;
	uint64_t ids[4] = {1, 2, 3, 4}, part[4], lay[4], sum, at;
	uint32_t sel[4 * 2 * R], moved = 0, parts_moved = 0, sized_apart = 0;
	(void)state;

	t_rng_seed(t_pick_seed());
	m = t_mk(&c);
	twin = t_mk(&c); /* the same calls outside a step: each freezes the sums anew */
	assert_true(c.n_layers <= 4 && c.n_kv_heads <= 2);
	for (uint32_t i = 0; i < 4; i++) {
		t_prefill_seq(m, &c, ids[i], 100 + 40 * i);
		t_prefill_seq(twin, &c, ids[i], 100 + 40 * i);
	}
	for (uint32_t step = 0; step < 24; step++) {
		uint32_t n = 2 + step % 3, first = n < 4 ? step % 2 : 0; /* batches that change */

		CHECK_RC(kvt_step_begin(m, ids + first, n), 0);
		sum = m->rc.snap_sum;
		at = m->rc.snap_at;
		CHECK_EQ(sum, m->rc.sum_ws);
		for (uint32_t l = 0; l < c.n_layers; l++) {
			lay[l] = m->rc.snap_layer[l];
			CHECK_EQ(lay[l], m->rc.layer_ws[l]);
		}
		for (uint32_t i = 0; i < 4; i++) {
			part[i] = frozen_part(m, ids[i]);
			CHECK_EQ(part[i], kvt_seqmap_get(&m->seqs, ids[i])->ws_counted);
		}
		for (uint32_t l = 0; l < c.n_layers; l++) {
			for (uint32_t x = 0; x < n; x++) {
				uint32_t nb =
					DIV_UP(t_tokens_of(m, ids[first + x], l), c.block_tokens);

				for (uint32_t j = 0; j < c.n_kv_heads * R; j++)
					sel[x * c.n_kv_heads * R + j] = t_rng_below(nb);
			}
			CHECK_RC(kvt_step_recall_blocks(m, l, sel, R, NULL), 0);
			CHECK_RC(kvt_recall_blocks(twin, l, ids + first, n, sel, R, NULL), 0);
			for (uint32_t x = 0; x < n; x++)
				sized_apart += slots_of(m, ids[first + x], l) !=
					       slots_of(twin, ids[first + x], l);
			CHECK_EQ(m->rc.snap_at, at);
			CHECK_EQ(m->rc.snap_sum, sum);
			for (uint32_t y = 0; y < c.n_layers; y++)
				CHECK_EQ(m->rc.snap_layer[y], lay[y]);
			for (uint32_t i = 0; i < 4; i++) {
				CHECK_EQ(frozen_part(m, ids[i]), part[i]);
				parts_moved +=
					kvt_seqmap_get(&m->seqs, ids[i])->ws_counted != part[i];
			}
			moved += m->rc.sum_ws != sum;
		}
		CHECK_RC(kvt_step_end(m), 0);
		CHECK_RC(kvt_recall_check(m), 0);
	}
	print_message("# step sizing: the live sum moved in %u calls, a sequence's part %u times; "
		      "%u regions sized apart from the twin's\n",
		      moved, parts_moved, sized_apart);
	assert_true(moved > 0 && parts_moved > 0); /* else nothing was shown */
	/* the sizing reads the frozen sums: the twin, freezing at each call, sizes otherwise */
	assert_true(sized_apart > 0);
	/* outside a step, each call freezes the sums once (when its members are counted) */
	at = m->rc.snap_at;
	for (uint32_t l = 0; l < c.n_layers; l++) {
		for (uint32_t j = 0; j < c.n_kv_heads * R; j++)
			sel[j] = t_rng_below(DIV_UP(t_tokens_of(m, ids[0], l), c.block_tokens));
		CHECK_RC(kvt_recall_blocks(m, l, ids, 1, sel, R, NULL), 0);
		CHECK_EQ(m->rc.snap_at, at + 1 + l);
	}
	kvt_manager_destroy(twin);
	kvt_manager_destroy(m);
}

/* kvt_step_begin reading a spilled member's block back: every allocation and disk I/O of the
   call failed in turn (a walk over its fault sites) fails it with -ENOMEM or -EIO and leaves
   the open step as it was (its next append goes to its own members); the walk ends with the
   begin succeeding, and the new step's append goes to the new members. */
static void test_step_begin_faults(void **state)
{
	struct kvt_config c = step_config(64);
	struct kvt_manager *m;
	char dir[] = "/tmp/kvt-step-f-XXXXXX";
	uint64_t a[2] = {1, 2}, b[2] = {3, 1};
	uint32_t tok[4] = {0, 61, 61, 61}, walked = 0, eio = 0;
	size_t row = t_rowb(&c);
	uint8_t *k = t_xmalloc(2 * c.n_kv_heads * row), *v = t_xmalloc(2 * c.n_kv_heads * row);
	(void)state;

	assert_non_null(mkdtemp(dir));
	c.spill_dir = dir;
	m = t_mk(&c);
	for (uint64_t id = 1; id <= 3; id++)
		t_prefill_seq(m, &c, id, 61);
	CHECK_RC(kvt_step_begin(m, a, 2), 0);
	for (uint64_t nth = 1;; nth++) {
		int rc;

		CHECK_RC(kvt_seq_spill(m, 3), 0); /* its last blocks must come back */
		assert_true(t_info_of(m, 3).disk_blocks > 0);
		CHECK_RC(kvt_fault_arm((1u << KVT_FAULT_ALLOC) | (1u << KVT_FAULT_IO), nth), 0);
		rc = kvt_step_begin(m, b, 2);
		kvt_fault_disarm();
		if (rc == 0)
			break;
		walked++;
		eio += rc == -EIO;
		assert_true(rc == -ENOMEM || rc == -EIO);
		/* the open step is still a: its append goes to 1 and 2 */
		t_fill_decode(&c, a, (uint32_t[]){tok[1], tok[2]}, 2, 0, k, v);
		CHECK_RC(t_step_append(m, 0, 2, k, v, NULL), 0);
		tok[1]++;
		tok[2]++;
		for (uint64_t id = 1; id <= 3; id++)
			CHECK_EQ(toks(m, id), tok[id]);
		assert_true(nth < 1000);
	}
	print_message("# step begin faults: %u failed begins walked (%u -EIO)\n", walked, eio);
	assert_true(walked > eio && eio > 0); /* both kinds of site */
	t_fill_decode(&c, b, (uint32_t[]){tok[3], tok[1]}, 2, 0, k, v);
	CHECK_RC(t_step_append(m, 0, 2, k, v, NULL), 0);
	tok[3]++;
	tok[1]++;
	for (uint64_t id = 1; id <= 3; id++)
		CHECK_EQ(toks(m, id), tok[id]);
	for (uint32_t p = 0; p < tok[3]; p += 7) { /* 3's history read back intact */
		uint8_t got[2][64], want[2][64];

		CHECK_RC(kvt_seq_read_token(m, 3, 0, 1, p, got[0], got[1]), 0);
		t_fill_row(c.dtype, c.head_dim, want[0], 3, 0, 1, p, 0);
		t_fill_row(c.dtype, c.head_dim, want[1], 3, 0, 1, p, 1);
		assert_memory_equal(got[0], want[0], row);
		assert_memory_equal(got[1], want[1], row);
	}
	CHECK_RC(kvt_step_end(m), 0);
	kvt_manager_destroy(m);
	free(k);
	free(v);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_step_contract),
		cmocka_unit_test(test_step_tables_contract),
		cmocka_unit_test(test_step_same_as_plain),
		cmocka_unit_test(test_step_device_as_host),
		cmocka_unit_test(test_step_device_as_host_disk),
		cmocka_unit_test(test_step_device_as_host_streams),
		cmocka_unit_test(test_step_recall_disk_faults),
		cmocka_unit_test(test_step_begin_faults),
		cmocka_unit_test(test_step_sizing_frozen),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
