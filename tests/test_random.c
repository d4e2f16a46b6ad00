/* SPDX-License-Identifier: MIT */
/*
 * random: a long seeded run of interleaved operations on the host backend (create, prefill of
 * random layers in random order, batched decode of random subsets, destroy in random order,
 * preempt and resume, recall of random blocks into a small shared cache, plus calls that must
 * fail) against a simple model of every live sequence, with budgets small enough that both
 * tiers run out now and then. After every operation the manager must agree with the model:
 * token counts, frames and blocks in use, counters, resident positions. Attention is checked
 * against a double-precision loop over the resident set plus the recalled tokens, whose frames
 * must hold the tokens' exact bytes. Every token of every live sequence is read back
 * bit-exactly, from both tiers, every few hundred operations and at the end.
 *
 * The seed is printed; KVT_TEST_SEED=<n> repeats a run, KVT_TEST_OPS=<n> changes its length.
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
#include <time.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "t_manager.h"
#include "t_ops.h"
#include "recall.h"
#include "seq.h"
#include "policy.h"
#include "util.h"

#define MAX_LIVE 48
#define MAX_BATCH 16

/* ---- the model --------------------------------------------------------------------------- */

/* What the model keeps of each prefilled layer of a live sequence (t_ops.h's t_seq.layer): its
   top-K positions, [n_kv_heads][count], kvt_snapkv_select on the layer's data. */
static int32_t *topk_of(const struct t_seq *s, uint32_t l)
{
	return s->layer[l];
}

/* The run (live sequences, manager, configuration) and what the manager's stats must say. */
struct model {
	struct t_run run; /* first: the ops get the run, which is the model */
	/* cumulative counters the manager's stats must match */
	uint64_t tokens_resident;
	uint64_t bytes_d2d, bytes_d2h, bytes_read;
	/* what happened, for the summary */
	uint64_t prefills, decodes, decoded_tokens;
	uint64_t enomem_prefill, enomem_decode, rejected, short_dev, short_host;
	uint64_t preempts, resumes, resume_enomem, recalls, recall_enospc, recalled, stale;
	void *buf_k, *buf_v, *buf_q, *scratch;
	size_t buf_kv_bytes, scratch_bytes;
};

static struct model *md_of(struct t_run *r)
{
	return (struct model *)r;
}

static void model_init(struct model *md, const struct kvt_config *c)
{
	memset(md, 0, sizeof(*md));
	t_run_init(&md->run, c, MAX_LIVE);
	CHECK_RC(t_manager_create(c, &md->run.m), 0);
}

static void model_fini(struct model *md)
{
	kvt_manager_destroy(md->run.m);
	t_run_fini(&md->run);
	free(md->buf_k);
	free(md->buf_v);
	free(md->buf_q);
	free(md->scratch);
}

/* Tensors of at least kv_bytes each for K and V (reused across operations). */
static void reserve_bufs(struct model *md, size_t kv_bytes)
{
	if (kv_bytes <= md->buf_kv_bytes && md->buf_q)
		return;
	free(md->buf_k);
	free(md->buf_v);
	free(md->buf_q);
	md->buf_k = t_xmalloc(kv_bytes);
	md->buf_v = t_xmalloc(kv_bytes);
	md->buf_q = t_xmalloc((size_t)md->run.c.n_q_heads * md->run.c.obs_window * md->run.rb);
	md->buf_kv_bytes = kv_bytes;
}

/* ---- invariants -------------------------------------------------------------------------- */

static void check_resident(struct model *md, const struct t_seq *s, uint32_t l)
{
	const struct kvt_config *c = &md->run.c;
	int32_t want[512], got[512];

	assert_true(c->sink_tokens + c->recent_tokens + s->count < 500);
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t nw =
			s->pre ? 0
			       : t_expect_resident(c, s->n[l], topk_of(s, l) + (size_t)h * s->count,
						   s->count, want);
		uint32_t ng = 0;

		CHECK_RC(kvt_seq_resident_positions(md->run.m, s->id, l, h, got, 512, &ng), 0);
		if (ng != nw || memcmp(got, want, nw * sizeof(int32_t))) {
			uint32_t i = 0;

			while (i < nw && i < ng && got[i] == want[i])
				i++;
			fail_at(__FILE__, __LINE__,
				"seq %llu layer %u head %u (L=%u, N=%u, top-K %u): %u resident, "
				"expected %u; first difference at %u: %d vs %d",
				(unsigned long long)s->id, l, h, s->L, s->n[l], s->count, ng, nw, i,
				i < ng ? got[i] : -1, i < nw ? want[i] : -1);
		}
	}
}

/* Everything cheap enough to check after every operation. */
static void check_all(struct model *md)
{
	const struct kvt_config *c = &md->run.c;
	struct kvt_stats st = t_stats_of(md->run.m);
	uint64_t frames = 0, blocks = 0;

	for (uint32_t i = 0; i < md->run.n_live; i++) {
		const struct t_seq *s = &md->run.live[i];

		for (uint32_t l = 0; l < c->n_layers; l++) {
			uint32_t n = 0xdeadbeef;

			CHECK_RC(kvt_seq_tokens(md->run.m, s->id, l, &n), 0);
			if (n != s->n[l])
				fail_at(__FILE__, __LINE__,
					"seq %llu layer %u: %u tokens, model %u",
					(unsigned long long)s->id, l, n, s->n[l]);
			if (!s->n[l])
				continue;
			frames += s->pre ? 0 : (uint64_t)c->n_kv_heads * s->fph;
			blocks += (uint64_t)c->n_kv_heads * DIV_UP(s->n[l], c->block_tokens);
			check_resident(md, s, l);
		}
	}
	t_run_check_stats(&md->run, &st);
	CHECK_EQ(st.device_frames_used, frames);
	CHECK_EQ(st.host_blocks_used, blocks);
	CHECK_EQ(st.tokens_resident, md->tokens_resident);
	CHECK_EQ(st.bytes_d2d, md->bytes_d2d);
	CHECK_EQ(st.bytes_d2h, md->bytes_d2h);
	CHECK_EQ(st.bytes_read, md->bytes_read);
}

/* Every token of every live sequence, every layer and head, from both tiers. Reads of
   resident tokens come from the device tier and count in bytes_read; host-history reads do not. */
static void check_readback(struct model *md)
{
	const struct kvt_config *c = &md->run.c;
	uint8_t wk[256], wv[256], gk[256], gv[256];
	int32_t res[512];

	assert_true(md->run.rb <= sizeof(wk));
	for (uint32_t i = 0; i < md->run.n_live; i++) {
		const struct t_seq *s = &md->run.live[i];

		for (uint32_t l = 0; l < c->n_layers; l++)
			for (uint32_t h = 0; h < c->n_kv_heads; h++) {
				if (s->n[l] && !s->pre)
					md->bytes_read +=
						2ull * md->run.rb *
						t_expect_resident(c, s->n[l],
								  topk_of(s, l) +
									  (size_t)h * s->count,
								  s->count, res);
				for (uint32_t p = 0; p < s->n[l]; p++) {
					t_fill_row(c->dtype, c->head_dim, wk, s->id, l, h, p, 0);
					t_fill_row(c->dtype, c->head_dim, wv, s->id, l, h, p, 1);
					CHECK_RC(kvt_seq_read_token(md->run.m, s->id, l, h, p, gk,
								    gv),
						 0);
					if (memcmp(gk, wk, md->run.rb) ||
					    memcmp(gv, wv, md->run.rb))
						fail_at(__FILE__, __LINE__,
							"read_token: seq %llu layer %u head %u pos %u "
							"(L=%u, N=%u) differs",
							(unsigned long long)s->id, l, h, p, s->L,
							s->n[l]);
					CHECK_RC(kvt_seq_read_token_host(md->run.m, s->id, l, h, p,
									 gk, gv),
						 0);
					if (memcmp(gk, wk, md->run.rb) ||
					    memcmp(gv, wv, md->run.rb))
						fail_at(__FILE__, __LINE__,
							"host history: seq %llu layer %u head %u pos %u "
							"(L=%u, N=%u) differs",
							(unsigned long long)s->id, l, h, p, s->L,
							s->n[l]);
				}
			}
	}
}

/* kvt_attend of one (seq, layer) against a double-precision softmax over the model's
   resident positions plus the tokens of its recall view that are not resident. The view's
   masks must name exactly the resident tokens and its frames hold the tokens' bytes; a stale
   view (a frame taken by another block since) must make kvt_attend fail with -ESTALE. */
static void check_attend(struct model *md, const struct t_seq *s, uint32_t l)
{
	const struct kvt_config *c = &md->run.c;
	uint32_t D = c->head_dim, G = c->n_q_heads / c->n_kv_heads, bt = c->block_tokens;
	float q[64 * 64], out[64 * 64];
	int32_t pos[1024];
	double logit[1024], ref[64];
	struct kvt_recall_ref refs[64];
	uint8_t want[256], got[256];
	uint32_t nv[16];
	bool stale = false;

	assert_true((size_t)c->n_q_heads * D <= 64 * 64 && D <= 64 && c->n_kv_heads <= 16);
	for (uint32_t h = 0; h < c->n_kv_heads && !stale; h++) {
		int rc = kvt_seq_recall_view(md->run.m, s->id, l, h, refs, 64, &nv[h]);

		if (rc == -ESTALE)
			stale = true;
		else
			CHECK_RC(rc, 0);
	}
	for (size_t i = 0; i < (size_t)c->n_q_heads * D; i++)
		q[i] = (float)((int)t_rng_below(512) - 256) / 128.0f;
	if (stale) {
		CHECK_RC(kvt_attend(md->run.m, s->id, l, q, out), -ESTALE);
		md->stale++;
		return;
	}
	CHECK_RC(kvt_attend(md->run.m, s->id, l, q, out), 0);
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t n = t_expect_resident(c, s->n[l], topk_of(s, l) + (size_t)h * s->count,
					       s->count, pos);
		uint32_t n_res = n;

		CHECK_RC(kvt_seq_recall_view(md->run.m, s->id, l, h, refs, 64, &nv[h]), 0);
		for (uint32_t i = 0; i < nv[h]; i++) {
			for (uint32_t j = 0; j < refs[i].n_valid; j++) {
				uint32_t p = refs[i].block * bt + j;
				bool res = false;

				for (uint32_t x = 0; x < n_res && !res; x++)
					res = (uint32_t)pos[x] == p;
				if (res != (bool)((refs[i].resident >> j) & 1))
					fail_at(__FILE__, __LINE__,
						"view: seq %llu layer %u head %u pos %u: mask says "
						"%d, resident set says %d",
						(unsigned long long)s->id, l, h, p, !res, res);
				t_fill_row(c->dtype, D, want, s->id, l, h, p, 0);
				t_dev_read(got, refs[i].frame + j * md->run.rb, md->run.rb);
				if (memcmp(got, want, md->run.rb))
					fail_at(__FILE__, __LINE__,
						"recalled frame: seq %llu layer %u head %u pos %u "
						"differs",
						(unsigned long long)s->id, l, h, p);
				if (!res)
					pos[n++] = (int32_t)p;
			}
			md->recalled += refs[i].n_valid;
		}
		assert_true(n <= 1024);
		for (uint32_t g = h * G; g < h * G + G; g++) {
			double mx = -INFINITY, sum = 0;

			for (uint32_t j = 0; j < n; j++) {
				double dot = 0;

				for (uint32_t d = 0; d < D; d++)
					dot += (double)q[g * D + d] *
					       t_value(s->id, l, h, (uint32_t)pos[j], d, 0);
				logit[j] = dot / sqrt((double)D);
				mx = logit[j] > mx ? logit[j] : mx;
			}
			memset(ref, 0, sizeof(ref));
			for (uint32_t j = 0; j < n; j++) {
				double w = exp(logit[j] - mx);

				sum += w;
				for (uint32_t d = 0; d < D; d++)
					ref[d] += w * t_value(s->id, l, h, (uint32_t)pos[j], d, 1);
			}
			for (uint32_t d = 0; d < D; d++) {
				double r = ref[d] / sum, o = out[g * D + d];

				if (!(fabs(o - r) <= 1e-5 * (1.0 + fabs(r))))
					fail_at(__FILE__, __LINE__,
						"attend: seq %llu layer %u (N=%u, %u recalled) q "
						"head %u dim %u: %.9g, naive %.9g",
						(unsigned long long)s->id, l, s->n[l], n - n_res, g,
						d, o, r);
			}
		}
	}
}

/* ---- operations -------------------------------------------------------------------------- */

/* Creates a sequence (t_run_create) while there is room for it, else destroys one. */
static void op_create(struct t_run *r)
{
	if (r->n_live < MAX_LIVE)
		t_run_create(r);
	else
		t_run_destroy(r);
}

/* Destroys a sequence while more than 4 live, else creates one. */
static void op_destroy(struct t_run *r)
{
	if (r->n_live > 4)
		t_run_destroy(r);
	else
		t_run_create(r);
}

/* Prefills a random layer that is not prefilled yet of a random live sequence. The outcome is
   predicted from the free frames and blocks: -ENOMEM exactly when either tier is short. */
static void op_prefill(struct t_run *r)
{
	struct model *md = md_of(r);
	const struct kvt_config *c = &md->run.c;
	struct kvt_stats before = t_stats_of(md->run.m), after;
	struct t_seq *s = NULL;
	uint32_t l = 0, need_blocks;
	struct kvt_snapkv sp;
	int want, rc;

	t_what = "prefill";
	for (int tries = 0; tries < 8 && !s; tries++) {
		struct t_seq *t;

		if (!md->run.n_live)
			return;
		t = &md->run.live[t_rng_below(md->run.n_live)];
		l = t_rng_below(c->n_layers);
		if (!t->n[l] && !t->pre)
			s = t;
	}
	if (!s)
		return;
	sp = t_snapkv_of(c, s->L);
	need_blocks = DIV_UP(s->L, c->block_tokens);
	want = s->fph > before.device_frames_free / c->n_kv_heads ||
			       need_blocks > before.host_blocks_free / c->n_kv_heads
		       ? -ENOMEM
		       : 0;
	reserve_bufs(md, (size_t)c->n_kv_heads * s->L * md->run.rb);
	t_fill_prefill(c, s->id, l, s->L, md->buf_k, md->buf_v, md->buf_q);
	if (want == 0 && s->count) {
		size_t need = kvt_snapkv_scratch_bytes(&sp);

		if (need > md->scratch_bytes) {
			free(md->scratch);
			md->scratch = t_xmalloc(need);
			md->scratch_bytes = need;
		}
		s->layer[l] = t_xmalloc((size_t)c->n_kv_heads * s->count * sizeof(int32_t));
		CHECK_RC(kvt_snapkv_select(&sp, md->buf_k, md->buf_q, topk_of(s, l), md->scratch),
			 0);
	}
	rc = t_prefill_layer(md->run.m, s->id, l, md->buf_k, md->buf_v,
			     s->count || t_rng_below(2) ? md->buf_q : NULL, NULL);
	/* the library must not read the caller's tensors after the call */
	memset(md->buf_k, 0x5a, (size_t)c->n_kv_heads * s->L * md->run.rb);
	memset(md->buf_v, 0xa5, (size_t)c->n_kv_heads * s->L * md->run.rb);
	if (rc != want)
		fail_at(__FILE__, __LINE__,
			"prefill seq %llu layer %u (L=%u: %u frames, %u blocks per head; %llu "
			"frames, %llu blocks free) returned %d, expected %d",
			(unsigned long long)s->id, l, s->L, s->fph, need_blocks,
			(unsigned long long)before.device_frames_free,
			(unsigned long long)before.host_blocks_free, rc, want);
	if (rc) {
		after = t_stats_of(md->run.m);
		CHECK_STATS_EQUAL(&before, &after);
		if (strlen(kvt_manager_last_error(md->run.m)) == 0)
			fail_at(__FILE__, __LINE__, "no last error after a failed prefill");
		md->enomem_prefill++;
		md->short_dev += s->fph > before.device_frames_free / c->n_kv_heads;
		md->short_host += need_blocks > before.host_blocks_free / c->n_kv_heads;
		return;
	}
	if (!s->layer[l])
		s->layer[l] = t_xmalloc(0);
	s->n[l] = s->L;
	md->run.tokens_prompt += s->L;
	md->tokens_resident +=
		(s->L < c->sink_tokens + c->recent_tokens ? s->L
							  : c->sink_tokens + c->recent_tokens) +
		s->count;
	md->bytes_d2d +=
		2ull * md->run.rb * c->n_kv_heads *
		((s->L < c->sink_tokens + c->recent_tokens ? s->L
							   : c->sink_tokens + c->recent_tokens) +
		 s->count);
	md->bytes_d2h += 2ull * md->run.rb * c->n_kv_heads * s->L;
	md->run.prefill_layers++;
	md->prefills++;
}

/* Appends one token to a random subset (random order) of the live sequences prefilled on a
   random layer. -ENOMEM exactly when more of them start a new block than the host has free. */
static void op_decode(struct t_run *r)
{
	struct model *md = md_of(r);
	const struct kvt_config *c = &md->run.c;
	struct kvt_stats before = t_stats_of(md->run.m), after;
	struct t_seq *batch[MAX_BATCH];
	uint64_t ids[MAX_BATCH];
	uint32_t pos[MAX_BATCH], n, fresh = 0;
	uint32_t l = t_rng_below(c->n_layers);
	int want, rc;

	t_what = "decode";
	n = t_run_pick_batch(r, l, batch, MAX_BATCH);
	if (!n)
		return;
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = batch[i]->id;
		pos[i] = batch[i]->n[l];
		fresh += pos[i] % c->block_tokens == 0;
	}
	want = fresh > before.host_blocks_free / c->n_kv_heads ? -ENOMEM : 0;
	reserve_bufs(md, (size_t)MAX_BATCH * c->n_kv_heads * md->run.rb);
	t_fill_decode(c, ids, pos, n, l, md->buf_k, md->buf_v);
	rc = t_decode_append(md->run.m, l, ids, n, md->buf_k, md->buf_v, NULL);
	memset(md->buf_k, 0x77, (size_t)n * c->n_kv_heads * md->run.rb);
	memset(md->buf_v, 0x88, (size_t)n * c->n_kv_heads * md->run.rb);
	if (rc != want)
		fail_at(__FILE__, __LINE__,
			"decode of %u sequences on layer %u (%u need a new block, %llu blocks "
			"free) returned %d, expected %d",
			n, l, fresh, (unsigned long long)before.host_blocks_free, rc, want);
	if (rc) {
		after = t_stats_of(md->run.m);
		CHECK_STATS_EQUAL(&before, &after);
		md->enomem_decode++;
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		batch[i]->n[l]++;
	md->run.tokens_appended += n;
	md->bytes_d2d += 2ull * n * c->n_kv_heads * md->run.rb;
	md->bytes_d2h += 2ull * n * c->n_kv_heads * md->run.rb;
	md->run.decode_calls++;
	md->decodes++;
	md->decoded_tokens += n;
}

/* Preempts a random resident sequence, or resumes a preempted one: -ENOMEM (and nothing
   changes) exactly when the device tier cannot hold its prefilled layers. */
static void op_preempt(struct t_run *r)
{
	struct model *md = md_of(r);
	const struct kvt_config *c = &md->run.c;
	struct kvt_stats before = t_stats_of(md->run.m), after;
	struct t_seq *s;
	uint64_t need = 0;
	int want;

	t_what = "preempt/resume";
	if (!md->run.n_live)
		return;
	/* resumes twice as often as preemptions, so most sequences stay resident */
	s = t_run_pick(r, t_rng_below(3) != 0);
	if (!s->pre) {
		CHECK_RC(kvt_seq_preempt(md->run.m, s->id), 0);
		s->pre = true;
		md->preempts++;
		return;
	}
	for (uint32_t l = 0; l < c->n_layers; l++)
		need += s->n[l] ? (uint64_t)c->n_kv_heads * s->fph : 0;
	want = need > before.device_frames_free ? -ENOMEM : 0;
	CHECK_RC(kvt_seq_resume(md->run.m, s->id, NULL), want);
	if (want) {
		after = t_stats_of(md->run.m);
		CHECK_STATS_EQUAL(&before, &after);
		md->resume_enomem++;
		return;
	}
	s->pre = false;
	md->resumes++;
}

/* Recalls random blocks (some past-resident, some repeated, some UINT32_MAX) of a random batch
   of resident sequences on a random layer. It must succeed when r blocks per head for every
   sequence fit in the cache; otherwise -ENOSPC is allowed and changes nothing. */
static void op_recall(struct t_run *r)
{
	struct model *md = md_of(r);
	const struct kvt_config *c = &md->run.c;
	struct kvt_stats before = t_stats_of(md->run.m), after;
	struct t_seq *batch[4];
	uint64_t ids[4];
	uint32_t sel[4 * 8 * 4], n, rr = 1 + t_rng_below(4);
	uint32_t l = t_rng_below(c->n_layers);
	int rc;

	t_what = "recall";
	if (!before.recall_frames_total)
		return;
	assert_true(c->n_kv_heads <= 8);
	n = t_run_pick_batch(r, l, batch, 4);
	if (!n)
		return;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t nb = DIV_UP(batch[i]->n[l], c->block_tokens);

		ids[i] = batch[i]->id;
		for (uint32_t x = 0; x < c->n_kv_heads * rr; x++)
			sel[i * c->n_kv_heads * rr + x] =
				t_rng_below(8) ? t_rng_below(nb) : UINT32_MAX;
	}
	rc = kvt_recall_blocks(md->run.m, l, ids, n, sel, rr, NULL);
	if ((uint64_t)n * c->n_kv_heads * rr <= before.recall_frames_total)
		CHECK_RC(rc, 0);
	else if (rc != 0 && rc != -ENOSPC)
		fail_at(__FILE__, __LINE__, "recall of %u x %u x %u blocks returned %d", n,
			c->n_kv_heads, rr, rc);
	if (rc) {
		after = t_stats_of(md->run.m);
		CHECK_STATS_EQUAL(&before, &after);
		md->recall_enospc++;
		return;
	}
	md->recalls++;
	after = t_stats_of(md->run.m);
	CHECK_EQ(after.recall_lookups - before.recall_lookups,
		 (after.recall_hits - before.recall_hits) +
			 (after.recall_loads - before.recall_loads));
	assert_true(after.recall_frames_used <= after.recall_frames_total);
	CHECK_RC(kvt_recall_check(md->run.m), 0); /* frames conserved, regions consistent */
}

/* Calls that must fail and change nothing. */
static void op_reject(struct t_run *r)
{
	struct model *md = md_of(r);
	const struct kvt_config *c = &md->run.c;
	struct kvt_stats before = t_stats_of(md->run.m), after;
	uint64_t ids[3];
	uint32_t kind = t_rng_below(6), l = t_rng_below(c->n_layers);
	struct t_seq *s;
	int want = 0, rc = 0;

	t_what = "reject";
	if (!md->run.n_live)
		return;
	s = &md->run.live[t_rng_below(md->run.n_live)];
	reserve_bufs(md, (size_t)MAX_BATCH * c->n_kv_heads * md->run.rb);
	memset(md->buf_k, 0, 3 * c->n_kv_heads * md->run.rb);
	memset(md->buf_v, 0, 3 * c->n_kv_heads * md->run.rb);
	/* A batch is validated in order and any failure ends it, so a valid sequence put
	   before the bad one must not need a new host block (a full host tier would fail it
	   first with -ENOMEM, which is also correct). */
	switch (kind) {
	case 0: /* a repeated id */
		if (s->n[l] % c->block_tokens == 0 || s->pre)
			return;
		ids[0] = ids[1] = s->id;
		want = -EINVAL;
		rc = t_decode_append(md->run.m, l, ids, 2, md->buf_k, md->buf_v, NULL);
		break;
	case 1: /* an unknown id after a valid one */
		if (!s->n[l] || s->n[l] % c->block_tokens == 0 || s->pre)
			return;
		ids[0] = s->id;
		ids[1] = t_rng_next();
		if (t_run_find(r, ids[1]))
			return;
		want = -ENOENT;
		rc = t_decode_append(md->run.m, l, ids, 2, md->buf_k, md->buf_v, NULL);
		break;
	case 2: /* a layer that is not prefilled, after a valid one */
		if (s->n[l])
			return;
		for (uint32_t i = 0; i < md->run.n_live && !want; i++) {
			const struct t_seq *o = &md->run.live[i];

			if (o->n[l] % c->block_tokens == 0 || o->pre)
				continue; /* not prefilled, or needs a block */
			ids[0] = o->id;
			ids[1] = s->id;
			want = -EINVAL;
			rc = t_decode_append(md->run.m, l, ids, 2, md->buf_k, md->buf_v, NULL);
		}
		if (!want)
			return;
		break;
	case 3: /* a second prefill of a layer */
		if (!s->n[l])
			return;
		want = -EEXIST;
		/* the CUDA build's shim copies the whole prompt to the device before the call */
		reserve_bufs(md, (size_t)md->run.c.n_kv_heads * s->L * md->run.rb);
		rc = t_prefill_layer(md->run.m, s->id, l, md->buf_k, md->buf_v, md->buf_q, NULL);
		break;
	case 4: /* decode, prefill or recall of a preempted sequence */
		if (!s->pre)
			return;
		want = -EINVAL;
		if (!s->n[l]) {
			reserve_bufs(md, (size_t)md->run.c.n_kv_heads * s->L * md->run.rb);
			rc = t_prefill_layer(md->run.m, s->id, l, md->buf_k, md->buf_v, md->buf_q,
					     NULL);
		} else if (t_rng_below(2)) {
			rc = t_decode_append(md->run.m, l, &s->id, 1, md->buf_k, md->buf_v, NULL);
		} else {
			uint32_t b = 0;

			if (!before.recall_frames_total)
				return;
			rc = kvt_recall_blocks(md->run.m, l, &s->id, 1, &b, 1, NULL);
		}
		break;
	default: /* a live id again */
		want = -EEXIST;
		rc = kvt_seq_create(md->run.m, s->id, 10);
		break;
	}
	if (rc != want)
		fail_at(__FILE__, __LINE__, "rejected call (kind %u) returned %d, expected %d",
			kind, rc, want);
	after = t_stats_of(md->run.m);
	CHECK_STATS_EQUAL(&before, &after);
	if (strlen(kvt_manager_last_error(md->run.m)) == 0)
		fail_at(__FILE__, __LINE__, "no last error after a rejected call");
	md->rejected++;
}

/* ---- runs -------------------------------------------------------------------------------- */

/* After every operation: the cheap checks; attention every 10, a full read-back every 250. */
static void after_op(struct t_run *r)
{
	struct model *md = md_of(r);

	check_all(md);
	if (t_op % 10 == 9 && r->n_live) {
		struct t_seq *s = &r->live[t_rng_below(r->n_live)];
		uint32_t l = t_rng_below(r->c.n_layers);

		t_what = "attend";
		if (s->n[l] && !s->pre)
			check_attend(md, s, l);
	}
	if (t_op % 250 == 249) {
		t_what = "read back";
		check_readback(md);
	}
}

/* Phases of 400 operations, the first filling; the rest of 100 rejects. */
static const struct t_mix mix = {
	.n = 7,
	.op = {op_create, op_prefill, op_decode, op_destroy, op_preempt, op_recall, op_reject},
	.fill = {16, 48, 80, 84, 88, 95},
	.drain = {10, 28, 60, 88, 92, 97},
	.phase_ops = 400,
};

/* Runs `ops` operations. The budgets of each configuration are chosen so that one tier or the
   other runs out during the filling phases; want_dev / want_host ask the run to prove it did
   (a prefill refused for want of device frames; prefills and decodes refused for want of host
   blocks). */
static void run(const struct kvt_config *c, uint64_t seed, long ops, bool want_dev, bool want_host)
{
	struct model *md = t_xmalloc(sizeof(*md));

	t_rng_seed(seed);
	model_init(md, c);
	check_all(md);
	t_run_loop(&md->run, ops, &mix, after_op);
	t_what = "final read back";
	CHECK_RC(kvt_manager_sync(md->run.m, NULL), 0);
	check_readback(md);
	print_message(
		"# %ld ops: %llu created, %llu destroyed, %llu prefills, %llu decode calls "
		"(%llu tokens), -ENOMEM %llu prefill (device short %llu, host short %llu) / %llu "
		"decode, %llu rejected, %u live\n",
		ops, (unsigned long long)md->run.created, (unsigned long long)md->run.destroyed,
		(unsigned long long)md->prefills, (unsigned long long)md->decodes,
		(unsigned long long)md->decoded_tokens, (unsigned long long)md->enomem_prefill,
		(unsigned long long)md->short_dev, (unsigned long long)md->short_host,
		(unsigned long long)md->enomem_decode, (unsigned long long)md->rejected,
		md->run.n_live);
	print_message("# %llu preempts, %llu resumes (%llu -ENOMEM), %llu recalls (%llu "
		      "-ENOSPC), %llu recalled tokens checked, %llu stale views\n",
		      (unsigned long long)md->preempts, (unsigned long long)md->resumes,
		      (unsigned long long)md->resume_enomem, (unsigned long long)md->recalls,
		      (unsigned long long)md->recall_enospc, (unsigned long long)md->recalled,
		      (unsigned long long)md->stale);
	/* the run must have exercised what it is for */
	if (ops >= 2000) {
		assert_true(md->run.created >= 200);
		assert_true(md->preempts > 0 && md->resumes > 0);
		if (c->recall_cache_bytes)
			assert_true(md->recalls > 0 && md->recalled > 0);
		if (want_dev)
			assert_true(md->short_dev > 0);
		if (want_host) {
			assert_true(md->short_host > 0);
			assert_true(md->enomem_decode > 0);
		}
	}
	t_what = "teardown";
	while (md->run.n_live) {
		t_run_destroy(&md->run);
		check_all(md);
	}
	{
		struct kvt_stats st = t_stats_of(md->run.m);

		CHECK_EQ(st.device_frames_used, 0);
		CHECK_EQ(st.host_blocks_used, 0);
		CHECK_EQ(st.live_seqs, 0);
	}
	model_fini(md);
	free(md);
	t_op = -1;
	t_what = "setup";
}

/* f16, 3 layers, 8-token blocks, sink 4 + recent 12 + top-K 10, threaded saves; the device
   tier is the one that runs out. */
static void test_random_f16(void **state)
{
	struct kvt_config c = t_small_config();

	(void)state;
	c.n_layers = 3;
	c.n_kv_heads = 2;
	c.n_q_heads = 4;
	c.head_dim = 8;
	c.block_tokens = 8;
	c.sink_tokens = 4;
	c.recent_tokens = 12;
	c.topk_tokens = 10;
	c.obs_window = 4;
	c.pool_kernel = 3;
	c.device_bytes = t_budget(&c, 190);
	c.host_bytes = t_budget(&c, 800);
	c.save_threads = 2;
	c.recall_cache_bytes = 20 * 2 * c.block_tokens * c.head_dim * 2; /* 20 frames */
	c.device_bytes += c.recall_cache_bytes;
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run(&c, t_seed, t_pick_ops(6000), true, false);
}

/* bf16, 4 layers, GQA 4, 16-token blocks, no sink, windows off the block grid, an obs window
   wider than the ring, inline saves through a 4 KiB staging buffer; the host tier runs out. */
static void test_random_bf16(void **state)
{
	struct kvt_config c = t_small_config();

	(void)state;
	c.dtype = KVT_DTYPE_BF16;
	c.n_layers = 4;
	c.n_kv_heads = 2;
	c.n_q_heads = 8;
	c.head_dim = 64; /* a 16-sequence decode batch is 8 KiB: appends are chunked too */
	c.block_tokens = 16;
	c.sink_tokens = 0;
	c.recent_tokens = 13;
	c.topk_tokens = 7;
	c.obs_window = 17;
	c.pool_kernel = 5;
	c.device_bytes = t_budget(&c, 140);
	c.host_bytes = t_budget(&c, 240);
	c.save_threads = 0;
	c.staging_bytes = 4096;
	c.recall_cache_bytes = 40 * 2 * c.block_tokens * c.head_dim * 2; /* 40 frames */
	c.device_bytes += c.recall_cache_bytes;
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run(&c, t_mix(t_seed ^ 1), t_pick_ops(6000), false, true);
}

/* f32, GQA 1, 3 kv heads, 64-token blocks, sink 5 + recent 13, four save threads, small
   staging; the host tier runs out. */
static void test_random_f32(void **state)
{
	struct kvt_config c = t_small_config();

	(void)state;
	c.dtype = KVT_DTYPE_F32;
	c.n_layers = 2;
	c.n_kv_heads = 3;
	c.n_q_heads = 3;
	c.head_dim = 8;
	c.block_tokens = 64;
	c.sink_tokens = 5;
	c.recent_tokens = 13;
	c.topk_tokens = 16;
	c.obs_window = 4;
	c.pool_kernel = 3;
	c.device_bytes = t_budget(&c, 60);
	c.host_bytes = t_budget(&c, 80);
	c.save_threads = 4;
	c.staging_bytes = 8192;
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run(&c, t_mix(t_seed ^ 2), t_pick_ops(6000), false, true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_f16),
		cmocka_unit_test(test_random_bf16),
		cmocka_unit_test(test_random_f32),
	};

	check_context = t_run_context;
	t_seed = t_pick_seed();
	print_message("# random: seed %llu\n", (unsigned long long)t_seed);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
