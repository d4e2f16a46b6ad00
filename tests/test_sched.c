/* SPDX-License-Identifier: MIT */
/*
 * scheduler: SparseServe Algorithm 1 over a real manager on the host backend. The unit tests
 * check admission decisions on hand-made queues against figures worked out here from the
 * geometry (frames per layer from docs/design.md's resident layout, the full-KV reservation, the
 * token and injection budgets); the randomized run executes every batch for real (prefill
 * layers and decode steps with the generator's data from lib/t_data.h, recalls of random blocks)
 * and checks at every iteration that no device frame has two owners, that admitted requests
 * are resident, that preemption took the latest arrivals, and at the end of each request that
 * every token of every layer and head reads back bit-exact.
 */
#include "test_sched.h"

/* ---- geometry ----------------------------------------------------------------------------- */

/* Device frames of one prefilled layer of a prompt of L tokens (all kv heads). */
uint64_t fpl(const struct kvt_config *c, uint32_t L)
{
	return (uint64_t)DIV_UP(c->sink_tokens + c->recent_tokens + t_naive_count(c, L),
				c->block_tokens) *
	       c->n_kv_heads;
}

/* The one layer of full KV a prefilling request reserves under ws_control. */
uint64_t full_kv(const struct kvt_config *c, uint32_t L)
{
	return (uint64_t)DIV_UP(L, c->block_tokens) * c->n_kv_heads;
}

/* A small configuration whose resident-set pool holds exactly `frames` device frames (plus a
   recall cache of `recall` single-block frames). */
struct kvt_config cfg_frames(uint32_t frames, uint32_t recall)
{
	struct kvt_config c = t_small_config();

	c.device_bytes = (uint64_t)frames / c.n_kv_heads * t_group_bytes(&c) +
			 (uint64_t)recall * t_block_bytes(&c);
	c.recall_cache_bytes = (uint64_t)recall * t_block_bytes(&c);
	return c;
}

struct kvt_sched_config sched_cfg(uint32_t rmax, uint32_t tmax, uint64_t inject, uint32_t ws)
{
	struct kvt_sched_config sc = KVT_SCHED_CONFIG_INIT;

	sc.max_requests = rmax;
	sc.max_tokens = tmax;
	sc.max_inject_tokens = inject;
	sc.ws_control = ws;
	return sc;
}

/* ---- a test engine: executes batches for real and tracks what each request must hold ----- */

uint64_t rnd(struct eng *e)
{
	e->rng = t_mix(e->rng);
	return e->rng;
}

uint32_t rnd_in(struct eng *e, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rnd(e) % (hi - lo + 1));
}

void eng_init(struct eng *e, const struct kvt_config *c, const struct kvt_sched_config *sc,
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

void eng_fini(struct eng *e)
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
int eng_add(struct eng *e, uint64_t id, uint32_t L, uint32_t max_new)
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

struct kvt_seq_info info_of(struct eng *e, uint64_t id)
{
	struct kvt_seq_info in = {.size = sizeof(in)};

	CHECK_RC(kvt_seq_info(e->m, id, &in), 0);
	return in;
}

/* Every token of every prefilled layer and head of id reads back as the generator made it. */
void check_readback(struct eng *e, uint64_t id, const char *file, int line)
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

/* Executes a batch as an engine would: the prefill layers it names, then one decode step of
   every layer for its decodes (and, when recall_r > 0, a recall of random blocks). */
void eng_exec(struct eng *e, const struct kvt_sched_batch *b)
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
void eng_reap(struct eng *e, const struct kvt_sched_batch *b)
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
void check_frames(struct eng *e, const char *file, int line)
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

/* The batch's shape and the residency of what it names. */
void check_batch(struct eng *e, const struct kvt_sched_batch *b, const char *file, int line)
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

/* One iteration: step, checks, execute, commit. Returns the step's batch figures. */
struct kvt_sched_iter eng_iter(struct eng *e, struct kvt_sched_batch *out)
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
void eng_drain(struct eng *e, uint32_t max_iters)
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
const char *items_str(const struct kvt_sched_batch *b, char *buf, size_t cap)
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_errors),
		cmocka_unit_test(test_submit_errors),
		cmocka_unit_test(test_disk_history_beyond_host),
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
