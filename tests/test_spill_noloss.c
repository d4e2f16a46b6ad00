/* SPDX-License-Identifier: MIT */
/*
 * spill: the no-loss runs: random operations (lib/t_ops.h) on a host tier that holds a small
 * part of the live sequences' blocks, or less than one sequence's history; every token must
 * read back.
 */
#include "test_spill.h"

/* ---- the no-loss run ----------------------------------------------------------------------- */

#define NL 3
#define R_LIVE 100
#define R_BATCH 8

/* The checksum of each token written to layer l of s (t_ops.h's t_seq.layer[l], s->n[l] of
   them). */
static uint64_t *sums_of(const struct t_seq *s, uint32_t l)
{
	return s->layer[l];
}

/* The run (live sequences, manager, configuration) and what the manager's counters must say. */
struct rrun {
	struct t_run run; /* first: the ops get the run */
	const char *dir;
	uint64_t host_total, dev_frames_per_seq_max, max_live;
	/* buffers */
	uint8_t *k, *v, *q;
	float *f;
	size_t cap_tok; /* tokens the k/v buffers hold (all heads) */
	/* figures */
	uint64_t prefills, decodes, decoded, recalls, preempts, resumes;
	uint64_t spills, fetches, fetched_seqs;
	bool fault_ok;	   /* an I/O fault is armed: -EIO is a right answer too */
	bool disk_limited; /* disk_bytes set: -ENOMEM (-ENOSPC) may come whenever the file is full
			    */
	uint64_t enospc, unread; /* spills refused; read-backs refused for want of room */
	uint64_t io_faults;	 /* injected I/O failures that fired (disk_io_errors) */
	uint64_t eio;		 /* calls that failed with -EIO */
	uint64_t nomem_prefill, nomem_decode, nomem_resume, nomem_fetch, nomem_recall;
	uint64_t seqs_checked, tokens_checked, mismatches;
};

static uint64_t hash_bytes(uint64_t h, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t w;

		memcpy(&w, p, 8);
		h = t_mix(h ^ w);
		p += 8;
		n -= 8;
	}
	if (n) {
		uint64_t w = 0;

		memcpy(&w, p, n);
		h = t_mix(h ^ w ^ ((uint64_t)n << 56));
	}
	return h;
}

/* Checksum of one token: K then V row of each kv head in turn; head h's rows at k + h * stride. */
static uint64_t tok_sum(const struct rrun *r, const uint8_t *k, const uint8_t *v, size_t stride)
{
	uint64_t h = 0x6b7674696572ull;

	for (uint32_t hd = 0; hd < r->run.c.n_kv_heads; hd++) {
		h = hash_bytes(h, k + hd * stride, r->run.rb);
		h = hash_bytes(h, v + hd * stride, r->run.rb);
	}
	return h;
}

/* n random values (multiples of 1/128 in [-1, 1)) of the run's dtype into dst. */
static void fill_random(struct rrun *r, void *dst, size_t n)
{
	for (size_t i = 0; i < n; i++)
		r->f[i] = (float)((int)t_rng_below(256) - 128) / 128.0f;
	kvt_from_f32(r->run.c.dtype, r->f, dst, n);
}

static void reserve_tok(struct rrun *r, size_t tokens)
{
	size_t q_elems = (size_t)R_BATCH * r->run.c.n_q_heads * r->run.c.head_dim;

	if (tokens <= r->cap_tok)
		return;
	free(r->k);
	free(r->v);
	free(r->q);
	free(r->f);
	r->k = t_xmalloc(tokens * r->run.c.n_kv_heads * r->run.rb);
	r->v = t_xmalloc(tokens * r->run.c.n_kv_heads * r->run.rb);
	r->q = t_xmalloc(
		(q_elems + (size_t)r->run.c.n_q_heads * r->run.c.obs_window * r->run.c.head_dim) *
		4);
	r->f = t_xmalloc((tokens * r->run.c.n_kv_heads * r->run.c.head_dim + q_elems +
			  (size_t)r->run.c.n_q_heads * r->run.c.obs_window * r->run.c.head_dim) *
			 sizeof(float));
	r->cap_tok = tokens;
}

/* Records the checksum of the token appended to layer l of s (its n[l]-th). The array holds 64
   sums, then doubles whenever it is full: at n[l] = 64, 128, 256, ... */
static void push_sum(struct t_seq *s, uint32_t l, uint64_t h)
{
	uint32_t n = s->n[l];

	if (n == 0 || (n >= 64 && (n & (n - 1)) == 0)) {
		uint64_t *p = realloc(s->layer[l], (n ? 2 * n : 64) * sizeof(uint64_t));

		assert_non_null(p);
		s->layer[l] = p;
	}
	sums_of(s, l)[s->n[l]++] = h;
}

static struct rrun *rr_of(struct t_run *run)
{
	return (struct rrun *)run;
}

/* Frees what the run allocated (not its manager). */
void rrun_free(struct rrun *r)
{
	t_run_fini(&r->run);
	free(r->k);
	free(r->v);
	free(r->q);
	free(r->f);
	free(r);
}

/* Whether rc is an acceptable failure of a call that touches at most `need` host blocks:
   -ENOMEM when they could not all fit in the host tier together (or the spill file is limited
   and may be full), -EIO when an I/O failure was injected. */
static bool may_fail(const struct rrun *r, int rc, uint64_t need)
{
	return (rc == -ENOMEM && (need > r->host_total || r->disk_limited)) ||
	       (rc == -EIO && r->fault_ok);
}

/* All host blocks of s (on disk or not), from the model. */
static uint64_t blocks_of(const struct rrun *r, const struct t_seq *s)
{
	uint64_t b = 0;

	for (uint32_t l = 0; l < r->run.c.n_layers; l++)
		b += (uint64_t)r->run.c.n_kv_heads * DIV_UP(s->n[l], r->run.c.block_tokens);
	return b;
}

/* Host blocks of the largest layer of s: the most that resuming it touches at once. */
static uint64_t layer_blocks_max(const struct rrun *r, const struct t_seq *s)
{
	uint64_t b = 0;

	for (uint32_t l = 0; l < r->run.c.n_layers; l++) {
		uint64_t x = (uint64_t)r->run.c.n_kv_heads * DIV_UP(s->n[l], r->run.c.block_tokens);

		b = x > b ? x : b;
	}
	return b;
}

/* Host blocks each layer's next token goes to (kvt_seq_fetch): the last block unless full. */
static uint64_t tails_of(const struct rrun *r, const struct t_seq *s)
{
	uint64_t b = 0;

	for (uint32_t l = 0; l < r->run.c.n_layers; l++)
		b += s->n[l] % r->run.c.block_tokens ? r->run.c.n_kv_heads : 0;
	return b;
}

static uint64_t dev_need(const struct rrun *r, const struct t_seq *s)
{
	uint64_t f = 0;

	for (uint32_t l = 0; l < r->run.c.n_layers; l++)
		f += s->n[l] ? (uint64_t)r->run.c.n_kv_heads * s->fph : 0;
	return f;
}

/* After every operation: token counts, blocks on host and on disk, frames, counters. */
static void check_cheap(struct rrun *r)
{
	const struct kvt_config *c = &r->run.c;
	struct kvt_stats st = t_stats_of(r->run.m);
	uint64_t on_host = 0, on_disk = 0, frames = 0;

	for (uint32_t i = 0; i < r->run.n_live; i++) {
		const struct t_seq *s = &r->run.live[i];
		struct kvt_seq_info in = t_info_of(r->run.m, s->id);
		uint64_t hb = blocks_of(r, s);

		for (uint32_t l = 0; l < c->n_layers; l++) {
			uint32_t n = t_tokens_of(r->run.m, s->id, l);

			if (n != s->n[l])
				fail_at(__FILE__, __LINE__,
					"seq %llu layer %u: %u tokens, model %u",
					(unsigned long long)s->id, l, n, s->n[l]);
		}
		if (in.host_blocks != hb || in.disk_blocks > hb || in.lost ||
		    in.preempted != s->pre || in.device_frames != (s->pre ? 0 : dev_need(r, s)))
			fail_at(__FILE__, __LINE__,
				"seq %llu info: host blocks %llu (model %llu), disk %llu, lost %d, "
				"preempted %u (model %d), frames %llu (model %llu)",
				(unsigned long long)s->id, (unsigned long long)in.host_blocks,
				(unsigned long long)hb, (unsigned long long)in.disk_blocks, in.lost,
				in.preempted, s->pre, (unsigned long long)in.device_frames,
				(unsigned long long)(s->pre ? 0 : dev_need(r, s)));
		on_host += hb - in.disk_blocks;
		on_disk += in.disk_blocks;
		frames += in.device_frames;
	}
	t_run_check_stats(&r->run, &st);
	CHECK_EQ(st.host_blocks_used, on_host);
	CHECK_EQ(st.disk_blocks_used, on_disk);
	CHECK_EQ(st.device_frames_used, frames);
	CHECK_EQ(st.disk_io_errors, r->io_faults);
	assert_true(st.disk_blocks_used <= st.disk_blocks_total);
	CHECK_EQ(st.disk_checksum_errors, 0);
	CHECK_EQ(st.seqs_lost, 0);
}

/* Reads every token of s back (every head; also from the host history when host is set) and
   compares its checksum; mismatches are counted (the first few printed). 0, or -ENOMEM when
   the spill file is limited and full, so s could not be fetched. */
static int readback(struct rrun *r, const struct t_seq *s, bool host)
{
	const struct kvt_config *c = &r->run.c;
	uint8_t k[8 * 256], v[8 * 256];

	assert_true(c->n_kv_heads * r->run.rb <= sizeof(k));
	for (uint32_t l = 0; l < c->n_layers; l++)
		for (uint32_t p = 0; p < s->n[l]; p++)
			for (int pass = 0; pass < (host ? 2 : 1); pass++) {
				for (uint32_t h = 0; h < c->n_kv_heads; h++) {
					int rc = pass ? kvt_seq_read_token_host(r->run.m, s->id, l,
										h, p,
										k + h * r->run.rb,
										v + h * r->run.rb)
						      : kvt_seq_read_token(r->run.m, s->id, l, h, p,
									   k + h * r->run.rb,
									   v + h * r->run.rb);

					if (rc == -ENOMEM && r->disk_limited) {
						r->unread++;
						return rc; /* no room to fetch it now */
					}
					if (rc)
						fail_at(__FILE__, __LINE__,
							"%s seq %llu layer %u head %u pos %u: %d (%s)",
							pass ? "read_token_host" : "read_token",
							(unsigned long long)s->id, l, h, p, rc,
							kvt_strerror(rc));
				}
				if (tok_sum(r, k, v, r->run.rb) != sums_of(s, l)[p]) {
					if (r->mismatches < 10)
						print_error(
							"# MISMATCH (%s) seq %llu layer %u pos %u "
							"of %u (prompt %u, %u explicit spills, "
							"%s)\n",
							pass ? "host history" : "read_token",
							(unsigned long long)s->id, l, p, s->n[l],
							s->L, s->spills,
							s->pre ? "preempted" : "resident");
					r->mismatches++;
				}
				r->tokens_checked += !pass;
			}
	r->seqs_checked++;
	return 0;
}

/* Prefills layer l of s (not preempted, l not prefilled) with random data. Must succeed when
   the device has the frames and the host tier could hold the layer (everything else spilled,
   s's other layers too); -ENOMEM when the device is short; otherwise either. */
static void do_prefill(struct rrun *r, struct t_seq *s, uint32_t l)
{
	const struct kvt_config *c = &r->run.c;
	struct kvt_stats st = t_stats_of(r->run.m);
	uint64_t need = (uint64_t)c->n_kv_heads * DIV_UP(s->L, c->block_tokens);
	bool dev_short = (uint64_t)c->n_kv_heads * s->fph > st.device_frames_free;
	size_t nq = (size_t)c->n_q_heads * c->obs_window * c->head_dim;
	int rc;

	t_what = "prefill";
	reserve_tok(r, s->L);
	fill_random(r, r->k, (size_t)c->n_kv_heads * s->L * c->head_dim);
	fill_random(r, r->v, (size_t)c->n_kv_heads * s->L * c->head_dim);
	fill_random(r, r->q, nq);
	rc = t_prefill_layer(r->run.m, s->id, l, r->k, r->v, r->q, NULL);
	if (dev_short ? rc != -ENOMEM : rc != 0 && !may_fail(r, rc, need))
		fail_at(__FILE__, __LINE__,
			"prefill seq %llu layer %u (L %u: %llu blocks; seq holds %llu; host %llu; "
			"%s) returned %d (%s)",
			(unsigned long long)s->id, l, s->L, (unsigned long long)need,
			(unsigned long long)blocks_of(r, s), (unsigned long long)r->host_total,
			dev_short ? "device short" : "device has room", rc, kvt_strerror(rc));
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_prefill++;
		return;
	}
	for (uint32_t p = 0; p < s->L; p++)
		push_sum(s, l,
			 tok_sum(r, r->k + p * r->run.rb, r->v + p * r->run.rb, s->L * r->run.rb));
	/* the library must not read the caller's tensors after the call */
	memset(r->k, 0x5a, (size_t)c->n_kv_heads * s->L * r->run.rb);
	memset(r->v, 0xa5, (size_t)c->n_kv_heads * s->L * r->run.rb);
	r->run.tokens_prompt += s->L;
	r->run.prefill_layers++;
	r->prefills++;
}

/* Creates a sequence (t_run_create) while there is room for it, else destroys one; half of
   those created are prefilled at once, every layer. */
static void op_create(struct t_run *run)
{
	struct t_seq *s;

	if (run->n_live >= R_LIVE) {
		t_run_destroy(run);
		return;
	}
	s = t_run_create(run);
	if (s && t_rng_below(2))
		for (uint32_t l = 0; l < run->c.n_layers; l++) {
			do_prefill(rr_of(run), s, l);
			if (!s->n[l])
				break;
		}
}

/* Destroys a sequence while more than 10 live, else creates one. */
static void op_destroy(struct t_run *run)
{
	if (run->n_live > 10)
		t_run_destroy(run);
	else
		op_create(run);
}

/* One layer, or every layer left, of a sequence that is not preempted. */
static void op_prefill(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	const struct kvt_config *c = &r->run.c;
	struct t_seq *s = NULL;

	for (int tries = 0; tries < 8 && !s && r->run.n_live; tries++) {
		struct t_seq *t = &r->run.live[t_rng_below(r->run.n_live)];

		for (uint32_t l = 0; l < c->n_layers && !s; l++)
			if (!t->n[l] && !t->pre)
				s = t;
	}
	if (!s)
		return;
	if (t_rng_below(2)) {
		for (uint32_t l = 0; l < c->n_layers; l++)
			if (!s->n[l]) {
				do_prefill(r, s, l);
				if (!s->n[l])
					break;
			}
	} else {
		uint32_t l = t_rng_below(c->n_layers);

		while (s->n[l])
			l = (l + 1) % c->n_layers;
		do_prefill(r, s, l);
	}
}

/* One token for a random batch on a random layer. Must succeed when the host tier could hold
   the block each token goes to (everything else spilled). */
static void op_decode(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	const struct kvt_config *c = &r->run.c;
	struct t_seq *b[R_BATCH];
	uint64_t ids[R_BATCH], need = 0;
	uint32_t l = t_rng_below(c->n_layers), n = t_run_pick_batch(&r->run, l, b, R_BATCH);
	int rc;

	t_what = "decode";
	if (!n)
		return;
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = b[i]->id;
		need += c->n_kv_heads; /* the last block, or a new one */
	}
	reserve_tok(r, R_BATCH);
	fill_random(r, r->k, (size_t)n * c->n_kv_heads * c->head_dim);
	fill_random(r, r->v, (size_t)n * c->n_kv_heads * c->head_dim);
	rc = t_decode_append(r->run.m, l, ids, n, r->k, r->v, NULL);
	if (rc != 0 && !may_fail(r, rc, need))
		fail_at(__FILE__, __LINE__,
			"decode of %u sequences on layer %u (%llu blocks with the new ones; host "
			"%llu) returned %d (%s)",
			n, l, (unsigned long long)need, (unsigned long long)r->host_total, rc,
			kvt_strerror(rc));
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_decode++;
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		push_sum(b[i], l,
			 tok_sum(r, r->k + (size_t)i * c->n_kv_heads * r->run.rb,
				 r->v + (size_t)i * c->n_kv_heads * r->run.rb, r->run.rb));
	memset(r->k, 0x77, (size_t)n * c->n_kv_heads * r->run.rb);
	memset(r->v, 0x88, (size_t)n * c->n_kv_heads * r->run.rb);
	r->run.tokens_appended += n;
	r->run.decode_calls++;
	r->decodes++;
	r->decoded += n;
}

/* Scored (kvt_decode_recall) or explicit (kvt_recall_blocks) recall for a batch of up to 4.
   The cache holds every block either can ask for, so only -ENOMEM (host) may fail it: when
   the blocks it loads, and for a scored one the blocks whose metadata it folds in (at most
   the layer), could not fit the host tier together. */
static void op_recall(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	const struct kvt_config *c = &r->run.c;
	struct t_seq *b[4];
	uint64_t ids[4], need = 0;
	uint32_t l = t_rng_below(c->n_layers), n = t_run_pick_batch(&r->run, l, b, 4);
	uint32_t sel[4 * 8 * 3], rr = 1 + t_rng_below(3);
	int rc;

	t_what = "recall";
	if (!n)
		return;
	assert_true(c->n_kv_heads <= 8);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t nb = DIV_UP(b[i]->n[l], c->block_tokens);

		ids[i] = b[i]->id;
		need += (uint64_t)c->n_kv_heads * (nb + c->n_kv_heads * rr);
		for (uint32_t x = 0; x < c->n_kv_heads * rr; x++)
			sel[i * c->n_kv_heads * rr + x] =
				t_rng_below(8) ? t_rng_below(nb) : UINT32_MAX;
	}
	if (t_rng_below(2)) {
		reserve_tok(r, R_BATCH);
		fill_random(r, r->q, (size_t)n * c->n_q_heads * c->head_dim);
		rc = t_decode_recall(r->run.m, l, ids, n, r->q, NULL);
	} else {
		rc = kvt_recall_blocks(r->run.m, l, ids, n, sel, rr, NULL);
	}
	if (rc != 0 && !may_fail(r, rc, need))
		fail_at(__FILE__, __LINE__,
			"recall of %u sequences on layer %u (%llu blocks; host %llu) returned %d "
			"(%s)",
			n, l, (unsigned long long)need, (unsigned long long)r->host_total, rc,
			kvt_strerror(rc));
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_recall++;
		return;
	}
	r->recalls++;
}

/* Preempts a resident sequence or resumes a preempted one (which fetches its resident set's
   blocks, a layer at a time at worst). */
static void op_preempt(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	struct kvt_stats st = t_stats_of(r->run.m);
	struct t_seq *s;
	bool resume = t_rng_below(3) != 0;
	uint64_t dn;
	int rc;

	t_what = "preempt/resume";
	if (!r->run.n_live)
		return;
	s = t_run_pick(run, resume);
	if (!s->pre) {
		CHECK_RC(kvt_seq_preempt(r->run.m, s->id), 0);
		s->pre = true;
		r->preempts++;
		return;
	}
	dn = dev_need(r, s);
	rc = kvt_seq_resume(r->run.m, s->id, NULL);
	if (dn > st.device_frames_free ? rc != -ENOMEM
				       : rc != 0 && !may_fail(r, rc, layer_blocks_max(r, s)))
		fail_at(__FILE__, __LINE__,
			"resume of seq %llu (%llu frames, %llu free; %llu blocks) returned %d (%s)",
			(unsigned long long)s->id, (unsigned long long)dn,
			(unsigned long long)st.device_frames_free,
			(unsigned long long)blocks_of(r, s), rc, kvt_strerror(rc));
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_resume++;
		return;
	}
	s->pre = false;
	r->resumes++;
}

/* Spills a sequence that has blocks in the host tier (the disk is unlimited: must succeed). */
static void op_spill(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	struct t_seq *s = NULL;
	struct kvt_seq_info a, b;
	int rc;

	t_what = "spill";
	for (int tries = 0; tries < 8 && r->run.n_live; tries++) {
		struct t_seq *t = &r->run.live[t_rng_below(r->run.n_live)];

		a = t_info_of(r->run.m, t->id);
		s = t;
		if (a.host_blocks > a.disk_blocks)
			break;
	}
	if (!s)
		return;
	a = t_info_of(r->run.m, s->id);
	rc = kvt_seq_spill(r->run.m, s->id);
	b = t_info_of(r->run.m, s->id);
	if (r->fault_ok && rc == -EIO) {
		assert_true(b.disk_blocks < b.host_blocks); /* the failed blocks stay */
		return;
	}
	if (r->disk_limited && rc == -ENOSPC) {
		r->enospc++;
		return;
	}
	CHECK_RC(rc, 0);
	CHECK_EQ(b.disk_blocks, b.host_blocks);
	CHECK_EQ(b.device_frames, a.device_frames);
	s->spills++;
	r->spills++;
}

/* Fetches 1..4 sequences in one call (each layer's last block). Must succeed when the host tier
   could hold those blocks; after it, fetching them again reads nothing. */
static void op_fetch(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	struct t_seq *b[4];
	uint64_t ids[4], need = 0;
	uint32_t n;
	int rc;

	t_what = "fetch";
	if (!r->run.n_live)
		return;
	n = 1 + t_rng_below(r->run.n_live < 4 ? r->run.n_live : 4);
	for (uint32_t i = 0; i < n; i++) {
		struct t_seq *t;
		bool dup;

		do {
			t = &r->run.live[t_rng_below(r->run.n_live)];
			dup = false;
			for (uint32_t j = 0; j < i; j++)
				dup |= b[j] == t;
		} while (dup);
		b[i] = t;
		ids[i] = t->id;
		need += tails_of(r, t);
	}
	rc = kvt_seq_fetch(r->run.m, ids, n);
	if (rc != 0 && !may_fail(r, rc, need))
		fail_at(__FILE__, __LINE__,
			"fetch of %u sequences (%llu blocks; host %llu) returned %d (%s)", n,
			(unsigned long long)need, (unsigned long long)r->host_total, rc,
			kvt_strerror(rc));
	if (!rc) {
		uint64_t got = t_stats_of(r->run.m).disk_blocks_fetched;

		CHECK_RC(kvt_seq_fetch(r->run.m, ids, n), 0);
		CHECK_EQ(t_stats_of(r->run.m).disk_blocks_fetched, got);
	}
	if (rc) {
		if (rc == -EIO)
			r->eio++;
		else
			r->nomem_fetch++;
		return;
	}
	r->fetches++;
	r->fetched_seqs += n;
}

/* A spill, fetch, decode, recall or resume with one of its next few I/Os failing (fault hook):
   it may fail with -EIO, and must change nothing else than the failed call's blocks'
   whereabouts; every later check counts the failure in disk_io_errors. */
static void op_faulty(struct t_run *run)
{
	struct rrun *r = rr_of(run);
	uint32_t which = t_rng_below(5);

	kvt_fault_arm(1u << KVT_FAULT_IO, 1 + t_rng_below(6));
	r->fault_ok = true;
	if (which == 0)
		op_spill(run);
	else if (which == 1)
		op_fetch(run);
	else if (which == 2)
		op_decode(run);
	else if (which == 3)
		op_recall(run);
	else
		op_preempt(run);
	r->fault_ok = false;
	r->io_faults += kvt_fault_fired();
	kvt_fault_disarm();
	t_what = "after an I/O fault";
}

/* After every operation: the cheap checks; every 300, four sequences read back. */
static void after_op(struct t_run *run)
{
	struct rrun *r = rr_of(run);

	check_cheap(r);
	r->max_live = run->n_live > r->max_live ? run->n_live : r->max_live;
	if (t_op % 300 == 299 && run->n_live) {
		t_what = "read back (subset)";
		for (int i = 0; i < 4; i++)
			readback(r, &run->live[t_rng_below(run->n_live)], i == 0);
		if (r->mismatches)
			fail_at(__FILE__, __LINE__, "%llu tokens read back differ",
				(unsigned long long)r->mismatches);
	}
}

/* Phases of 500 operations, the last one filling (up to 100 live): create, prefill, decode,
   recall, preempt/resume, spill, fetch, one of those with an I/O failing; the rest destroys. */
static const struct t_mix noloss_mix = {
	.n = 9,
	.op = {op_create, op_prefill, op_decode, op_recall, op_preempt, op_spill, op_fetch,
	       op_faulty, op_destroy},
	.fill = {20, 38, 63, 70, 77, 83, 89, 92},
	.drain = {10, 26, 51, 58, 65, 71, 76, 79},
	.phase_ops = 500,
	.ends_filling = true,
};

/* The no-loss invariant: `ops` operations on a host tier of host_groups block groups, with
   prompts of up to prompt_span tokens. */
static void run_noloss(struct fix *fx, uint64_t seed, long ops, uint64_t disk_blocks,
		       uint32_t host_groups, uint32_t prompt_span)
{
	const char *dir = fx->dir;
	struct kvt_config c = t_small_config();
	struct rrun *r = g_run = t_xmalloc(sizeof(*r));
	struct kvt_stats st;
	uint64_t spilled, fetched;
	double t0 = t_now_s();

	c.n_layers = NL;
	c.n_kv_heads = 2;
	c.n_q_heads = 4;
	c.head_dim = 8;
	c.block_tokens = 8;
	c.sink_tokens = 4;
	c.recent_tokens = 12;
	c.topk_tokens = 10;
	c.obs_window = 4;
	c.pool_kernel = 3;
	c.save_threads = 2;
	c.staging_bytes = 16u << 10;
	c.host_bytes = t_budget(&c, host_groups);
	c.device_bytes = t_budget(&c, 700); /* resident sets: up to 12 groups a sequence */
	spill_recall(&c, 24);
	c.spill_dir = dir;
	c.disk_queue_depth = 64;
	if (disk_blocks) {
		/* disk_bytes for about disk_blocks blocks, from what 1 MiB holds */
		uint64_t t;

		c.disk_bytes = 1 << 20;
		fx->m = t_mk(&c);
		t = t_stats_of(fx->m).disk_blocks_total;
		fdestroy(fx);
		c.disk_bytes = (c.disk_bytes / t) * disk_blocks;
		r->disk_limited = true;
	}
	t_run_init(&r->run, &c, R_LIVE);
	r->run.id_small = 2000;
	r->run.prompt_span = prompt_span;
	r->dir = dir;
	t_rng_seed(seed);
	r->run.m = fx->m = t_mk(&c);
	st = t_stats_of(r->run.m);
	r->host_total = st.host_blocks_total;
	CHECK_EQ(r->host_total, 2ull * host_groups);
	if (disk_blocks)
		print_message("# disk_bytes %llu: %llu blocks\n", (unsigned long long)c.disk_bytes,
			      (unsigned long long)st.disk_blocks_total);
	reserve_tok(r, 512);
	check_cheap(r);
	t_run_loop(&r->run, ops, &noloss_mix, after_op);
	t_what = "final read back";
	CHECK_RC(kvt_manager_sync(r->run.m, NULL), 0);
	CHECK_DIR_EMPTY(dir);
	st = t_stats_of(r->run.m);
	spilled = st.disk_blocks_spilled;
	fetched = st.disk_blocks_fetched;
	{
		uint64_t before = r->seqs_checked;

		uint64_t checked_ids[R_LIVE];
		uint32_t n_checked = 0, n = r->run.n_live, order[R_LIVE], n_order = 0;

		/* Every live sequence once, those all in the host tier first. With a limited
		   file, one that cannot come back for want of room (host and file full) gets it
		   from sequences already checked, which go. */
		for (int pass = 0; pass < 2; pass++)
			for (uint32_t i = 0; i < n; i++)
				if ((DISK(r->run.m, r->run.live[i].id) == 0) == (pass == 0))
					order[n_order++] = i;
		CHECK_EQ(n_order, n);
		for (uint32_t i = 0; i < n; i++) {
			struct t_seq *s = &r->run.live[order[i]];

			while (readback(r, s, true) == -ENOMEM) {
				struct t_seq *t;

				if (!n_checked)
					fail_at(__FILE__, __LINE__,
						"seq %llu cannot be read back: no room",
						(unsigned long long)s->id);
				t = t_run_find(&r->run, checked_ids[--n_checked]);
				CHECK_RC(kvt_seq_destroy(r->run.m, t->id), 0);
				t->n[0] = UINT32_MAX; /* marks it gone (removed below) */
			}
			checked_ids[n_checked++] = s->id;
		}
		for (uint32_t i = 0; i < r->run.n_live;) {
			if (r->run.live[i].n[0] != UINT32_MAX) {
				i++;
				continue;
			}
			t_run_remove(&r->run, i);
		}
		check_cheap(r);
		st = t_stats_of(r->run.m);
		print_message("# no-loss: %llu sequences created, %llu live checked, %llu tokens "
			      "checked, %llu blocks spilled, %llu fetched, %llu lost\n",
			      (unsigned long long)r->run.created,
			      (unsigned long long)(r->seqs_checked - before),
			      (unsigned long long)r->tokens_checked,
			      (unsigned long long)st.disk_blocks_spilled,
			      (unsigned long long)st.disk_blocks_fetched,
			      (unsigned long long)(r->mismatches + st.seqs_lost));
	}
	print_message("# %ld ops in %.1f s: %llu prefills (-ENOMEM %llu), %llu decode calls "
		      "(%llu tokens, -ENOMEM %llu), %llu recalls (-ENOMEM %llu), %llu preempts, "
		      "%llu resumes (-ENOMEM %llu), %llu spills, %llu fetches of %llu sequences "
		      "(-ENOMEM %llu), %llu destroyed, at most %llu live; before the final read "
		      "back %llu blocks spilled, %llu fetched; %llu I/O failures injected, %llu "
		      "calls -EIO; %llu spills -ENOSPC, %llu read-backs put off; O_DIRECT %u\n",
		      ops, t_now_s() - t0, (unsigned long long)r->prefills,
		      (unsigned long long)r->nomem_prefill, (unsigned long long)r->decodes,
		      (unsigned long long)r->decoded, (unsigned long long)r->nomem_decode,
		      (unsigned long long)r->recalls, (unsigned long long)r->nomem_recall,
		      (unsigned long long)r->preempts, (unsigned long long)r->resumes,
		      (unsigned long long)r->nomem_resume, (unsigned long long)r->spills,
		      (unsigned long long)r->fetches, (unsigned long long)r->fetched_seqs,
		      (unsigned long long)r->nomem_fetch, (unsigned long long)r->run.destroyed,
		      (unsigned long long)r->max_live, (unsigned long long)spilled,
		      (unsigned long long)fetched, (unsigned long long)r->io_faults,
		      (unsigned long long)r->eio, (unsigned long long)r->enospc,
		      (unsigned long long)r->unread, st.disk_direct);
	CHECK_EQ(r->mismatches, 0);
	CHECK_EQ(st.seqs_lost, 0);
	if (ops >= 2000) {
		assert_true(spilled > 0 && fetched > 0);
		assert_true(r->spills > 0 && r->fetches > 0 && r->recalls > 0);
		assert_true(r->resumes > 0 && r->preempts > 0);
		assert_true(r->io_faults > 0);
		/* Whether an injected failure surfaces as -EIO or is absorbed (a write that
		   failed retried by the next spill, a fetch put off) is up to chance: 2,000
		   operations of a limited disk sometimes absorb all of them (seed
		   17397663152599261647 does); the 6,000-operation runs have three times the
		   chances. */
		if (ops >= 6000)
			assert_true(r->eio > 0);
	}
	t_what = "teardown";
	while (r->run.n_live) {
		t_run_destroy(&r->run);
		if (r->run.n_live % 16 == 0)
			check_cheap(r);
	}
	st = t_stats_of(r->run.m);
	CHECK_EQ(st.host_blocks_used, 0);
	CHECK_EQ(st.disk_blocks_used, 0);
	CHECK_EQ(st.device_frames_used, 0);
	fdestroy(fx);
	CHECK_DIR_EMPTY(dir);
	rrun_free(r);
	g_run = NULL;
	t_op = -1;
	t_what = "setup";
}

void test_spill_noloss(void **state)
{
	struct fix *f = *state;

	t_what = "no-loss";
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run_noloss(f, t_seed, t_pick_ops(24000), 0, 600, 120);
}

/* The same with a spill file that holds about a third of what the host tier cannot: -ENOSPC
   and -ENOMEM come often, and nothing may be lost either. */
void test_spill_noloss_limited(void **state)
{
	struct fix *f = *state;

	t_what = "no-loss, limited file";
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run_noloss(f, t_mix(t_seed ^ 1), t_pick_ops(24000) / 3, 1000, 600, 120);
}

/* A host tier of 32 block groups, while a sequence's history reaches 90 (3 layers of prompts
   up to 240 tokens) and the live ones hold thousands: every call fetches what it touches and
   spills what others touched, and nothing may be lost. */
void test_spill_noloss_tiny(void **state)
{
	struct fix *f = *state;

	t_what = "no-loss, tiny host tier";
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run_noloss(f, t_mix(t_seed ^ 2), t_pick_ops(24000) / 3, 0, 32, 240);
}
