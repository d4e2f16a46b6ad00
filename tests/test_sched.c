/* SPDX-License-Identifier: MIT */
/*
 * scheduler: SparseServe Algorithm 1 over a real manager on the host backend. The unit tests
 * check admission decisions on hand-made queues against figures worked out here from the
 * geometry (frames per layer from docs/design.md's resident layout, the full-KV reservation, the
 * token and injection budgets); the randomized run executes every batch for real (prefill
 * layers and decode steps with the generator's data from common.h, recalls of random blocks)
 * and checks at every iteration that no device frame has two owners, that admitted requests
 * are resident, that preemption took the latest arrivals, and at the end of each request that
 * every token of every layer and head reads back bit-exact.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "policy.h"
#include "util.h"

/* ---- geometry ----------------------------------------------------------------------------- */

/* Device frames of one prefilled layer of a prompt of L tokens (all kv heads). */
static uint64_t fpl(const struct kvt_config *c, uint32_t L)
{
	return (uint64_t)DIV_UP(c->sink_tokens + c->recent_tokens + t_naive_count(c, L),
				c->block_tokens) *
	       c->n_kv_heads;
}

/* The one layer of full KV a prefilling request reserves under ws_control. */
static uint64_t full_kv(const struct kvt_config *c, uint32_t L)
{
	return (uint64_t)DIV_UP(L, c->block_tokens) * c->n_kv_heads;
}

/* A small configuration whose resident-set pool holds exactly `frames` device frames (plus a
   recall cache of `recall` single-block frames). */
static struct kvt_config cfg_frames(uint32_t frames, uint32_t recall)
{
	struct kvt_config c = t_small_config();

	c.device_bytes = (uint64_t)frames / c.n_kv_heads * t_group_bytes(&c) +
			 (uint64_t)recall * t_block_bytes(&c);
	c.recall_cache_bytes = (uint64_t)recall * t_block_bytes(&c);
	return c;
}

static struct kvt_sched_config sched_cfg(uint32_t rmax, uint32_t tmax, uint64_t inject, uint32_t ws)
{
	struct kvt_sched_config sc = KVT_SCHED_CONFIG_INIT;

	sc.max_requests = rmax;
	sc.max_tokens = tmax;
	sc.max_inject_tokens = inject;
	sc.ws_control = ws;
	return sc;
}

/* ---- a test engine: executes batches for real and tracks what each request must hold ----- */

struct treq {
	uint32_t L, max_new;
	uint32_t layers;    /* layers prefilled by the engine */
	uint32_t tokens;    /* tokens of every layer once all are prefilled */
	uint32_t generated; /* first token from the prefill, one per decode */
	uint64_t arrival;   /* submit order */
	bool live;	    /* the sequence exists in the manager */
	bool queued;	    /* submitted and neither completed nor finished */
	bool was_preempted;
};

struct eng {
	struct kvt_config c;
	struct kvt_manager *m;
	struct kvt_sched *s;
	uint32_t rmax;
	struct treq *r; /* indexed by sequence id */
	uint32_t n_ids;
	uint64_t n_submitted;
	uint8_t *k, *v, *q, *row_k, *row_v, *want_k, *want_v;
	size_t kv_cap;
	uint64_t *dseq;
	uint32_t *dpos, *blocks;
	uint64_t *frames; /* scratch of check_frames */
	size_t frames_cap;
	uint32_t recall_r; /* blocks per kv head recalled after a decode step (0 = none) */
	uint64_t rng;
	uint64_t *expect_done; /* completions the next step must report, in commit order */
	uint32_t n_expect_done;
	/* totals over the run */
	uint64_t iters, items, preempted, resumed, reset, completed, recalls;
};

static uint64_t rnd(struct eng *e)
{
	e->rng = t_mix(e->rng);
	return e->rng;
}

static uint32_t rnd_in(struct eng *e, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rnd(e) % (hi - lo + 1));
}

static void eng_init(struct eng *e, const struct kvt_config *c, const struct kvt_sched_config *sc,
		     uint32_t n_ids, uint32_t max_L)
{
	size_t rb = t_rowb(c);

	memset(e, 0, sizeof(*e));
	e->c = *c;
	CHECK_RC(t_manager_create(c, &e->m), 0);
	CHECK_RC(kvt_sched_create(e->m, sc, &e->s), 0);
	e->rmax = sc->max_requests;
	e->n_ids = n_ids;
	e->r = t_xmalloc((size_t)n_ids * sizeof(*e->r));
	e->kv_cap = (size_t)c->n_kv_heads * max_L * rb;
	e->k = t_xmalloc(e->kv_cap > (size_t)e->rmax * c->n_kv_heads * rb
				 ? e->kv_cap
				 : (size_t)e->rmax * c->n_kv_heads * rb);
	e->v = t_xmalloc(e->kv_cap > (size_t)e->rmax * c->n_kv_heads * rb
				 ? e->kv_cap
				 : (size_t)e->rmax * c->n_kv_heads * rb);
	e->q = t_xmalloc((size_t)c->n_q_heads * c->obs_window * rb);
	e->row_k = t_xmalloc(rb);
	e->row_v = t_xmalloc(rb);
	e->want_k = t_xmalloc(rb);
	e->want_v = t_xmalloc(rb);
	e->dseq = t_xmalloc((size_t)e->rmax * sizeof(*e->dseq));
	e->dpos = t_xmalloc((size_t)e->rmax * sizeof(*e->dpos));
	e->blocks = t_xmalloc((size_t)e->rmax * c->n_kv_heads * 16 * sizeof(*e->blocks));
	e->expect_done = t_xmalloc((size_t)e->rmax * sizeof(*e->expect_done));
	e->rng = 1;
}

static void eng_fini(struct eng *e)
{
	kvt_sched_destroy(e->s);
	kvt_manager_destroy(e->m);
	free(e->r);
	free(e->k);
	free(e->v);
	free(e->q);
	free(e->row_k);
	free(e->row_v);
	free(e->want_k);
	free(e->want_v);
	free(e->dseq);
	free(e->dpos);
	free(e->blocks);
	free(e->frames);
	free(e->expect_done);
}

/* Creates sequence id with a prompt of L tokens; returns what kvt_sched_submit returned. */
static int eng_add(struct eng *e, uint64_t id, uint32_t L, uint32_t max_new)
{
	struct treq *t = &e->r[id];
	int rc;

	assert_true(id < e->n_ids);
	CHECK_RC(kvt_seq_create(e->m, id, L), 0);
	*t = (struct treq){.L = L, .max_new = max_new, .live = true};
	rc = kvt_sched_submit(e->s, id, max_new);
	if (rc == 0) {
		t->queued = true;
		t->arrival = e->n_submitted++;
	}
	return rc;
}

static struct kvt_seq_info info_of(struct eng *e, uint64_t id)
{
	struct kvt_seq_info in = {.size = sizeof(in)};

	CHECK_RC(kvt_seq_info(e->m, id, &in), 0);
	return in;
}

/* Every token of every prefilled layer and head of id reads back as the generator made it. */
static void check_readback(struct eng *e, uint64_t id, const char *file, int line)
{
	const struct treq *t = &e->r[id];
	size_t rb = t_rowb(&e->c);

	for (uint32_t l = 0; l < t->layers; l++) {
		uint32_t n = t->layers == e->c.n_layers ? t->tokens : t->L, got = 0;

		CHECK_RC(kvt_seq_tokens(e->m, id, l, &got), 0);
		if (got != n)
			fail_at(file, line, "seq %llu layer %u holds %u tokens, expected %u",
				(unsigned long long)id, l, got, n);
		for (uint32_t h = 0; h < e->c.n_kv_heads; h++)
			for (uint32_t p = 0; p < n; p++) {
				CHECK_RC(kvt_seq_read_token(e->m, id, l, h, p, e->row_k, e->row_v),
					 0);
				t_fill_row(e->c.dtype, e->c.head_dim, e->want_k, id, l, h, p, 0);
				t_fill_row(e->c.dtype, e->c.head_dim, e->want_v, id, l, h, p, 1);
				if (memcmp(e->row_k, e->want_k, rb) ||
				    memcmp(e->row_v, e->want_v, rb))
					fail_at(file, line,
						"seq %llu layer %u head %u pos %u differs from what "
						"was written",
						(unsigned long long)id, l, h, p);
			}
	}
}
#define CHECK_READBACK(e, id) check_readback((e), (id), __FILE__, __LINE__)

/* Executes a batch as an engine would: the prefill layers it names, then one decode step of
   every layer for its decodes (and, when recall_r > 0, a recall of random blocks). */
static void eng_exec(struct eng *e, const struct kvt_sched_batch *b)
{
	const struct kvt_config *c = &e->c;
	uint32_t nd = 0, H = c->n_kv_heads;

	e->n_expect_done = 0;
	for (uint32_t i = 0; i < b->n_items; i++) {
		const struct kvt_sched_item *it = &b->items[i];
		struct treq *t = &e->r[it->seq];

		if (it->decode) {
			e->dseq[nd] = it->seq;
			e->dpos[nd++] = t->tokens;
			continue;
		}
		assert_true((size_t)H * t->L * t_rowb(c) <= e->kv_cap);
		for (uint32_t l = it->layer_begin; l < it->layer_end; l++) {
			t_fill_prefill(c, it->seq, l, t->L, e->k, e->v, e->q);
			CHECK_RC(t_prefill_layer(e->m, it->seq, l, e->k, e->v, e->q, NULL), 0);
		}
		t->layers = it->layer_end;
		if (t->layers == c->n_layers) {
			t->tokens = t->L;
			t->generated = 1;
		}
	}
	for (uint32_t l = 0; nd && l < c->n_layers; l++) {
		t_fill_decode(c, e->dseq, e->dpos, nd, l, e->k, e->v);
		CHECK_RC(t_decode_append(e->m, l, e->dseq, nd, e->k, e->v, NULL), 0);
	}
	if (nd && e->recall_r) {
		uint32_t r = e->recall_r;

		for (uint32_t l = 0; l < c->n_layers; l++) {
			for (uint32_t i = 0; i < nd; i++) {
				uint32_t nb = DIV_UP(e->dpos[i] + 1, c->block_tokens);

				for (uint32_t j = 0; j < H * r; j++)
					e->blocks[(size_t)i * H * r + j] =
						rnd(e) % 8 == 0 ? UINT32_MAX
								: (uint32_t)(rnd(e) % nb);
			}
			CHECK_RC(kvt_recall_blocks(e->m, l, e->dseq, nd, e->blocks, r, NULL), 0);
		}
		e->recalls++;
	}
	for (uint32_t i = 0; i < nd; i++) {
		struct treq *t = &e->r[e->dseq[i]];

		t->tokens++;
		t->generated++;
	}
	/* the commit walks the items in batch order: completions come out in that order */
	for (uint32_t i = 0; i < b->n_items; i++) {
		struct treq *t = &e->r[b->items[i].seq];

		if (t->generated == t->max_new)
			e->expect_done[e->n_expect_done++] = b->items[i].seq;
	}
}

/* Completed requests: reported as expected, frames freed, data intact; then destroyed. */
static void eng_reap(struct eng *e, const struct kvt_sched_batch *b)
{
	CHECK_EQ(b->n_completed, e->n_expect_done);
	CHECK_EQ(b->it.completed, e->n_expect_done);
	for (uint32_t i = 0; i < b->n_completed; i++) {
		uint64_t id = b->completed[i];
		struct kvt_seq_info in;

		CHECK_EQ(id, e->expect_done[i]);
		in = info_of(e, id);
		CHECK_EQ(in.device_frames, 0);
		CHECK_READBACK(e, id);
		CHECK_RC(kvt_seq_destroy(e->m, id), 0);
		e->r[id].live = false;
		e->r[id].queued = false;
		e->completed++;
	}
	e->n_expect_done = 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* No device frame has two owners, and the frames the live sequences own are exactly the ones
   the manager counts as used. */
static void check_frames(struct eng *e, const char *file, int line)
{
	const struct kvt_config *c = &e->c;
	struct kvt_stats st = t_stats_of(e->m);
	size_t n = 0;

	for (uint64_t id = 0; id < e->n_ids; id++) {
		const struct treq *t = &e->r[id];
		struct kvt_seq_info in;

		if (!t->live)
			continue;
		in = info_of(e, id);
		if (in.preempted || !in.layers_prefilled)
			continue;
		for (uint32_t l = 0; l < c->n_layers; l++) {
			uint32_t tok = 0;

			CHECK_RC(kvt_seq_tokens(e->m, id, l, &tok), 0);
			if (!tok)
				continue;
			for (uint32_t h = 0; h < c->n_kv_heads; h++) {
				uint32_t nf = 0, ns = 0;

				if (n + in.frames_per_layer > e->frames_cap) {
					e->frames_cap = 2 * (n + in.frames_per_layer);
					e->frames = realloc(e->frames,
							    e->frames_cap * sizeof(uint64_t));
					assert_non_null(e->frames);
				}
				CHECK_RC(kvt_seq_frames(e->m, id, l, h, e->frames + n,
							(uint32_t)(e->frames_cap - n), &nf, &ns),
					 0);
				n += nf;
			}
		}
	}
	if (st.device_frames_used > st.device_frames_total)
		fail_at(file, line, "%llu device frames used, budget %llu",
			(unsigned long long)st.device_frames_used,
			(unsigned long long)st.device_frames_total);
	if (n != st.device_frames_used)
		fail_at(file, line, "sequences own %zu frames, the manager counts %llu used", n,
			(unsigned long long)st.device_frames_used);
	if (n)
		qsort(e->frames, n, sizeof(uint64_t), cmp_u64);
	for (size_t i = 1; i < n; i++)
		if (e->frames[i] == e->frames[i - 1])
			fail_at(file, line, "device frame %#llx has two owners",
				(unsigned long long)e->frames[i]);
}
#define CHECK_FRAMES(e) check_frames((e), __FILE__, __LINE__)

/* The batch's shape and the residency of what it names. */
static void check_batch(struct eng *e, const struct kvt_sched_batch *b, const char *file, int line)
{
	const struct kvt_config *c = &e->c;
	uint32_t np = 0, nd = 0;
	uint64_t last_p = 0, last_d = 0, tl = 0;

	if (b->n_items > e->rmax)
		fail_at(file, line, "%u items, R_max %u", b->n_items, e->rmax);
	for (uint32_t i = 0; i < b->n_items; i++) {
		const struct kvt_sched_item *it = &b->items[i];
		const struct treq *t;
		struct kvt_seq_info in;

		if (it->seq >= e->n_ids || !e->r[it->seq].queued)
			fail_at(file, line, "item %u names seq %llu, not queued", i,
				(unsigned long long)it->seq);
		t = &e->r[it->seq];
		for (uint32_t j = 0; j < i; j++)
			if (b->items[j].seq == it->seq)
				fail_at(file, line, "seq %llu twice in the batch",
					(unsigned long long)it->seq);
		in = info_of(e, it->seq);
		if (in.preempted)
			fail_at(file, line, "item %u: seq %llu is preempted", i,
				(unsigned long long)it->seq);
		CHECK_EQ(in.layers_prefilled, t->layers);
		if (it->decode) {
			if (it->layer_begin || it->layer_end || t->layers != c->n_layers)
				fail_at(file, line, "decode item %u: layers [%u,%u), %u prefilled",
					i, it->layer_begin, it->layer_end, t->layers);
			if (nd && t->arrival < last_d)
				fail_at(file, line, "decodes out of arrival order at item %u", i);
			last_d = t->arrival;
			nd++;
		} else {
			if (nd)
				fail_at(file, line, "prefill item %u after a decode", i);
			if (it->layer_begin != t->layers || it->layer_end <= it->layer_begin ||
			    it->layer_end > c->n_layers)
				fail_at(file, line, "prefill item %u: layers [%u,%u), %u prefilled",
					i, it->layer_begin, it->layer_end, t->layers);
			if (np && t->arrival < last_p)
				fail_at(file, line, "prefills out of arrival order at item %u", i);
			last_p = t->arrival;
			tl += (uint64_t)(it->layer_end - it->layer_begin) * t->L;
			np++;
		}
		/* its prefilled layers are resident */
		CHECK_EQ(in.device_frames, (uint64_t)in.frames_per_layer * t->layers);
		for (uint32_t l = 0; l < t->layers; l++) {
			uint64_t fr[64];
			uint32_t nf = 0, ns = 0;

			CHECK_RC(kvt_seq_frames(e->m, it->seq, l, 0, fr, 64, &nf, &ns), 0);
			CHECK_EQ(nf, in.frames_per_layer / c->n_kv_heads);
		}
	}
	CHECK_EQ(b->it.n_prefill, np);
	CHECK_EQ(b->it.n_decode, nd);
	CHECK_EQ(b->it.batch_size, b->n_items);
	CHECK_EQ(b->it.prefill_token_layers, tl);
	CHECK_EQ(b->it.queued, kvt_sched_pending(e->s) - b->n_items);
}
#define CHECK_BATCH(e, b) check_batch((e), (b), __FILE__, __LINE__)

/* One iteration: step, checks, execute, commit. Returns the step's batch figures. */
static struct kvt_sched_iter eng_iter(struct eng *e, struct kvt_sched_batch *out)
{
	struct kvt_sched_batch b;

	CHECK_RC(kvt_sched_step(e->s, &b), 0);
	eng_reap(e, &b);
	CHECK_BATCH(e, &b);
	CHECK_FRAMES(e);
	eng_exec(e, &b);
	CHECK_RC(kvt_sched_commit(e->s), 0);
	CHECK_FRAMES(e);
	e->iters++;
	e->items += b.n_items;
	e->preempted += b.it.preempted;
	e->resumed += b.it.resumed;
	e->reset += b.it.reset;
	if (out)
		*out = b;
	return b.it;
}

/* Runs until nothing is pending (at most max_iters iterations), then reaps the last ones. */
static void eng_drain(struct eng *e, uint32_t max_iters)
{
	struct kvt_sched_batch b;

	for (uint32_t i = 0; kvt_sched_pending(e->s); i++) {
		if (i == max_iters)
			fail_at(__FILE__, __LINE__, "%u requests still pending after %u iterations",
				kvt_sched_pending(e->s), max_iters);
		eng_iter(e, NULL);
	}
	CHECK_RC(kvt_sched_step(e->s, &b), 0);
	eng_reap(e, &b);
	CHECK_EQ(b.n_items, 0);
	CHECK_RC(kvt_sched_commit(e->s), 0);
}

/* The items of a batch as "seq:begin-end" / "seq:d" text, for exact comparisons. */
static const char *items_str(const struct kvt_sched_batch *b, char *buf, size_t cap)
{
	size_t n = 0;

	buf[0] = 0;
	for (uint32_t i = 0; i < b->n_items && n < cap; i++) {
		const struct kvt_sched_item *it = &b->items[i];

		if (it->decode)
			n += (size_t)snprintf(buf + n, cap - n, "%s%llu:d", i ? " " : "",
					      (unsigned long long)it->seq);
		else
			n += (size_t)snprintf(buf + n, cap - n, "%s%llu:%u-%u", i ? " " : "",
					      (unsigned long long)it->seq, it->layer_begin,
					      it->layer_end);
	}
	return buf;
}

#define CHECK_ITEMS(b, want)                                                                  \
	do {                                                                                  \
		char buf_[512];                                                               \
		const char *got_ = items_str((b), buf_, sizeof(buf_));                        \
		if (strcmp(got_, (want)))                                                     \
			fail_at(__FILE__, __LINE__, "batch is \"%s\", expected \"%s\"", got_, \
				(want));                                                      \
	} while (0)

/* ---- unit tests --------------------------------------------------------------------------- */

static void test_create_errors(void **state)
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
	assert_null(s);
	kvt_sched_destroy(NULL);
	CHECK_EQ(kvt_sched_pending(NULL), 0);
	CHECK_RC(kvt_sched_step(NULL, &b), -EINVAL);
	CHECK_RC(kvt_sched_commit(NULL), -EINVAL);
	CHECK_RC(kvt_sched_submit(NULL, 1, 1), -EINVAL);
	CHECK_RC(kvt_sched_finish(NULL, 1), -EINVAL);

	CHECK_RC(kvt_sched_create(m, &sc, &s), 0);
	CHECK_RC(kvt_sched_step(s, NULL), -EINVAL);
	/* an empty iteration is an iteration */
	CHECK_RC(kvt_sched_commit(s), -EINVAL);
	CHECK_RC(kvt_sched_step(s, &b), 0);
	CHECK_EQ(b.n_items, 0);
	CHECK_EQ(b.it.iteration, 0);
	CHECK_RC(kvt_sched_step(s, &b), -EBUSY);
	CHECK_RC(kvt_sched_commit(s), 0);
	CHECK_RC(kvt_sched_commit(s), -EINVAL);
	CHECK_RC(kvt_sched_step(s, &b), 0);
	CHECK_EQ(b.it.iteration, 1);
	CHECK_RC(kvt_sched_commit(s), 0);
	kvt_sched_destroy(s);
	kvt_manager_destroy(m);
}

static void test_submit_errors(void **state)
{
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
	CHECK_RC(kvt_seq_create(e.m, 1, 40), 0);
	CHECK_RC(kvt_sched_submit(e.s, 1, 0), -EINVAL);
	CHECK_EQ(kvt_sched_pending(e.s), 0);
	CHECK_RC(kvt_seq_destroy(e.m, 1), 0);
	CHECK_RC(eng_add(&e, 1, 40, 3), 0);
	CHECK_RC(kvt_sched_submit(e.s, 1, 3), -EEXIST);
	CHECK_EQ(kvt_sched_pending(e.s), 1);
	/* 20 resident + 26 of full KV > 30 */
	CHECK_RC(eng_add(&e, 2, 100, 3), -E2BIG);
	/* a sequence the engine prefilled already */
	CHECK_RC(kvt_seq_create(e.m, 3, 40), 0);
	t_fill_prefill(&c, 3, 0, 40, e.k, e.v, e.q);
	CHECK_RC(t_prefill_layer(e.m, 3, 0, e.k, e.v, e.q, NULL), 0);
	CHECK_RC(kvt_sched_submit(e.s, 3, 3), -EINVAL);
	CHECK_RC(kvt_seq_destroy(e.m, 3), 0);
	CHECK_EQ(kvt_sched_pending(e.s), 1);
	CHECK_RC(kvt_sched_last(e.s, &li), -ENOENT);
	CHECK_RC(kvt_sched_last(NULL, &li), -EINVAL);

	/* finish: unknown, queued, running (its frames are freed, the sequence stays) */
	CHECK_RC(kvt_sched_finish(e.s, 2), -ENOENT);
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
	eng_fini(&e);

	/* without ws_control the full-KV reservation is not counted: 20 frames fit in 30 */
	sc.ws_control = 0;
	eng_init(&e, &c, &sc, 16, 400);
	CHECK_RC(eng_add(&e, 2, 100, 3), 0);
	CHECK_RC(eng_add(&e, 3, 400, 3), 0);
	eng_drain(&e, 10);
	eng_fini(&e);
}

static void test_budget_two_of_three(void **state)
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

static void test_rmax_tmax(void **state)
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

static void test_injection(void **state)
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
static size_t snapshot(struct eng *e, uint64_t id, uint8_t *out, size_t cap)
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
static void recall_123(struct eng *e, const uint64_t *ids, uint32_t n)
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

static void test_ws_control_recall(void **state)
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
static void setup_four(struct eng *e, const uint64_t *recall_ids, uint32_t n_recall)
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
static void engine_seq_len(struct eng *e, uint64_t id, uint32_t L)
{
	CHECK_RC(kvt_seq_create(e->m, id, L), 0);
	e->r[id] = (struct treq){.L = L, .live = true, .layers = e->c.n_layers, .tokens = L};
	for (uint32_t l = 0; l < e->c.n_layers; l++) {
		t_fill_prefill(&e->c, id, l, L, e->k, e->v, e->q);
		CHECK_RC(t_prefill_layer(e->m, id, l, e->k, e->v, e->q, NULL), 0);
	}
}

static void engine_seq(struct eng *e, uint64_t id)
{
	engine_seq_len(e, id, 64);
}

static void engine_seq_gone(struct eng *e, uint64_t id)
{
	CHECK_READBACK(e, id);
	CHECK_RC(kvt_seq_destroy(e->m, id), 0);
	e->r[id].live = false;
}

static void test_preempt_latest(void **state)
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

static void test_preempt_two(void **state)
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

static void test_preempt_resumed(void **state)
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

static void test_frames_held_outside(void **state)
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

static void test_random_ws(void **state)
{
	(void)state;
	run_random(1, 2000, test_seed());
}

static void test_random_resident(void **state)
{
	(void)state;
	run_random(0, 2000, test_seed() + 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_errors),
		cmocka_unit_test(test_submit_errors),
		cmocka_unit_test(test_budget_two_of_three),
		cmocka_unit_test(test_rmax_tmax),
		cmocka_unit_test(test_injection),
		cmocka_unit_test(test_ws_control_recall),
		cmocka_unit_test(test_preempt_latest),
		cmocka_unit_test(test_preempt_two),
		cmocka_unit_test(test_preempt_resumed),
		cmocka_unit_test(test_frames_held_outside),
		cmocka_unit_test(test_random_ws),
		cmocka_unit_test(test_random_resident),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
