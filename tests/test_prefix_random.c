/* SPDX-License-Identifier: MIT */
/*
 * prefix: the seeded random run of the prefix cache (lib/t_ops.h's driver). Sequences are
 * created plain or with hash chains drawn from a few shared prefix families (so matches are
 * frequent) and some rare ones, at 8 or 16 tokens a hash; they are prefilled whole or in chunks
 * of random sizes whose tensors start at random rows, decoded, preempted and resumed, spilled,
 * read back and finished, in a host tier small enough that spans are evicted (to the spill file
 * or dropped) and histories spilled all the time. Three runs: no disk tier, an unlimited spill
 * file, a spill file of a few dozen groups; with a file, one of a call's I/Os fails now and
 * then (fault hook).
 *
 * Every token's value is a function of (key, layer, head, position), the key being the
 * family's below the chain's end and the sequence's own above it, so every read-back is
 * checked bit for bit without stored copies. After every operation: every live sequence's
 * info against the run's model; the stats' prefix, host and disk accounting, exactly where the
 * model determines it (host blocks used = the live sequences' blocks not shared with the cache
 * + the cached spans' blocks in the host tier; disk blocks used = theirs in the spill file);
 * that every span a live sequence holds still matches; one sequence read back whole (all of it
 * every 50 operations and at the end). Each call must succeed where the model says the tiers
 * have room, and a call that fails must change nothing visible (which tier holds a block and
 * which idle spans are cached are not visible). A match never reports spans that no finished
 * sequence of that chain could have cached, and a sequence created on a match shares exactly
 * what the match reported unless reading spans back from the file failed or had no room.
 *
 * The seed is printed; KVT_TEST_SEED=<n> repeats a run, KVT_TEST_OPS=<n> sets its length.
 */
#include "test_prefix.h"

#include "fault.h"

#define NL 2	     /* layers */
#define N_FAM 48     /* families: 0..3 common, the others rare */
#define N_COMMON 4   /* common families */
#define MAX_CHAIN 6  /* hashes of a chain */
#define MAX_EXTRA 24 /* prompt tokens past the chain */
#define MAX_LIVE 20  /* live sequences */
#define MAX_BATCH 6  /* decode batch */
#define MAX_TOK 160  /* tokens a sequence can reach (prompt and decode) */
#define FAM_PLAIN UINT32_MAX

/* The run's record of a live sequence (t_ops.h's t_seq.layer[0]). t_seq.n[l] is the layer's
   tokens once prefilled (0 before), t_seq.L its prompt. */
struct pseq {
	uint64_t key;	   /* t_value's key of its own positions */
	uint32_t fam;	   /* family of its chain, FAM_PLAIN: created by kvt_seq_create */
	uint32_t ht;	   /* hash_tokens of its chain */
	uint32_t n_chain;  /* hashes; positions below n_chain * ht hold the family's values */
	uint32_t k;	   /* spans it shares from its creation */
	uint32_t held;	   /* leading spans of its chain it holds for sure: k, or n_chain once it
			      holds its whole chain */
	bool complete;	   /* every layer prefilled */
	uint32_t fill[NL]; /* positions in the history of each layer */
};

struct prun {
	struct t_run run;   /* first: the ops get the run */
	bool disk;	    /* a spill file */
	bool limited;	    /* of a few dozen groups: -ENOSPC and -ENOMEM whenever it is full */
	bool fault_ok;	    /* an I/O fault is armed: -EIO (or -ENOMEM, a spill failing) may come */
	uint64_t io_faults; /* injected I/O failures that fired (disk_io_errors) */
	uint64_t H, spb8;   /* kv heads; blocks of a span of block_tokens tokens, all layers */
	uint64_t total;	    /* host groups */
	uint64_t next_key;
	uint64_t salt; /* of the hashes: each run its own */
	/* the highest chain length of a finished sequence per (family, hash_tokens / bt - 1):
	   no match can report more */
	uint32_t maxreg[N_FAM][2];
	/* what the stats must count */
	uint64_t tokens_saved, asked, hit, preempts, resumes, bytes_history;
	/* figures */
	uint64_t creates, creates_chain, matched_creates, short_creates, prefills, chunks, decodes,
		spills, loads, matches, finished, fails, enomem, enospc, eio, checks,
		tokens_checked;
	uint8_t *k, *v, *q, *kk, *vv; /* scratch: one layer of MAX_TOK tokens */
};

static struct prun *pr_of(struct t_run *run)
{
	return (struct prun *)run;
}

static struct pseq *ps_of(const struct t_seq *s)
{
	return s->layer[0];
}

static uint64_t fam_key(uint32_t fam)
{
	return 0xfa0000000ull + fam;
}

static uint64_t hash_of(const struct prun *r, uint32_t fam, uint32_t ht, uint32_t i)
{
	return t_mix(r->salt ^ ((uint64_t)fam << 40 | (uint64_t)ht << 20 | i));
}

static void chain(const struct prun *r, uint32_t fam, uint32_t ht, uint32_t n, uint64_t *h)
{
	for (uint32_t i = 0; i < n; i++)
		h[i] = hash_of(r, fam, ht, i);
}

/* The key of position pos of p. */
static uint64_t key_at(const struct pseq *p, uint32_t pos)
{
	return p->fam != FAM_PLAIN && pos < p->n_chain * p->ht ? fam_key(p->fam) : p->key;
}

/* Rows [from, to) of layer l of p, every head, as [H][to - from][D]: K into k, V into v. */
static void rows(const struct prun *r, const struct pseq *p, uint32_t l, uint32_t from, uint32_t to,
		 uint8_t *k, uint8_t *v)
{
	const struct kvt_config *c = &r->run.c;

	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		for (uint32_t pos = from; pos < to; pos++) {
			size_t at = ((size_t)h * (to - from) + pos - from) * r->run.rb;

			t_fill_row(c->dtype, c->head_dim, k + at, key_at(p, pos), l, h, pos, 0);
			t_fill_row(c->dtype, c->head_dim, v + at, key_at(p, pos), l, h, pos, 1);
		}
}

/* The observation queries of a last chunk: its own, for any prompt length. */
static void queries(const struct prun *r, const struct pseq *p, uint32_t l, uint32_t L)
{
	const struct kvt_config *c = &r->run.c;

	for (uint32_t g = 0; g < c->n_q_heads; g++)
		for (uint32_t i = 0; i < c->obs_window; i++)
			t_fill_row(c->dtype, c->head_dim,
				   r->q + ((size_t)g * c->obs_window + i) * r->run.rb, p->key, l,
				   1000 + g, L + i, 0);
}

/* ---- what is visible ------------------------------------------------------------------- */

/* Everything of a sequence's info but where its blocks are (disk_blocks). */
static bool info_same(const struct kvt_seq_info *a, const struct kvt_seq_info *b)
{
	return a->prompt_tokens == b->prompt_tokens && a->layers_prefilled == b->layers_prefilled &&
	       a->preempted == b->preempted && a->tokens == b->tokens &&
	       a->frames_per_layer == b->frames_per_layer && a->device_frames == b->device_frames &&
	       a->host_blocks == b->host_blocks && a->lost == b->lost &&
	       a->prefix_tokens == b->prefix_tokens && a->filled_tokens == b->filled_tokens &&
	       a->shared_blocks == b->shared_blocks;
}

/* The counters a failed call must leave alone (not the tiers' placement, nor the idle spans
   it may have evicted for room), all uint64_t. */
#define F(f)                                      \
	{                                         \
#f, offsetof(struct kvt_stats, f) \
	}
static const struct {
	const char *name;
	size_t off;
} same_stats[] = {
	F(device_frames_used),
	F(tokens_saved),
	F(tokens_appended),
	F(tokens_prompt),
	F(tokens_resident),
	F(prefill_layers),
	F(decode_calls),
	F(saves_submitted),
	F(bytes_d2h),
	F(bytes_d2d),
	F(bytes_h2d),
	F(bytes_read),
	F(preemptions),
	F(resumes),
	F(prefix_blocks_shared),
	F(prefix_tokens_asked),
	F(prefix_tokens_hit),
	F(bytes_h2d_history),
	F(seqs_lost),
	F(disk_checksum_errors),
};
#undef F

static uint64_t stat_at(const struct kvt_stats *st, size_t off)
{
	uint64_t x;

	memcpy(&x, (const char *)st + off, sizeof(x));
	return x;
}

struct snap {
	struct kvt_stats st;
	uint32_t n;
	struct kvt_seq_info in[MAX_LIVE];
};

static void snap_take(struct prun *r, struct snap *s)
{
	s->st = t_stats_of(r->run.m);
	s->n = r->run.n_live;
	for (uint32_t i = 0; i < s->n; i++)
		s->in[i] = t_info_of(r->run.m, r->run.live[i].id);
}

/* A call that failed with rc changed nothing visible since s. */
static void snap_check(struct prun *r, const struct snap *s, int rc, const char *call)
{
	struct snap now;

	snap_take(r, &now);
	for (size_t i = 0; i < sizeof(same_stats) / sizeof(same_stats[0]); i++) {
		uint64_t was = stat_at(&s->st, same_stats[i].off),
			 is = stat_at(&now.st, same_stats[i].off);

		if (is != was)
			fail_at(__FILE__, __LINE__,
				"%s failed (%d, %s) but changed %s: %llu -> %llu", call, rc,
				kvt_strerror(rc), same_stats[i].name, (unsigned long long)was,
				(unsigned long long)is);
	}
	CHECK_EQ(now.st.live_seqs, s->st.live_seqs);
	CHECK_EQ(now.n, s->n);
	for (uint32_t i = 0; i < s->n; i++)
		if (!info_same(&now.in[i], &s->in[i]))
			fail_at(__FILE__, __LINE__,
				"%s failed (%d, %s) but changed the info of seq %llu: host blocks "
				"%llu -> %llu, shared %llu -> %llu, filled %u -> %u, tokens %u -> "
				"%u, frames %llu -> %llu",
				call, rc, kvt_strerror(rc), (unsigned long long)r->run.live[i].id,
				(unsigned long long)s->in[i].host_blocks,
				(unsigned long long)now.in[i].host_blocks,
				(unsigned long long)s->in[i].shared_blocks,
				(unsigned long long)now.in[i].shared_blocks, s->in[i].filled_tokens,
				now.in[i].filled_tokens, s->in[i].tokens, now.in[i].tokens,
				(unsigned long long)s->in[i].device_frames,
				(unsigned long long)now.in[i].device_frames);
	r->fails++;
}

/* Host groups the call at hand may count on (the model's room): free ones plus, without a spill
   file, the idle spans' (evicted first), or with one everything but the groups shared with the
   cache (which nothing spills) and the `pinned` ones the call itself needs in place. */
static bool has_room(const struct prun *r, uint64_t need, uint64_t pinned)
{
	struct kvt_stats st = t_stats_of(r->run.m);

	if (!r->disk)
		return (st.host_blocks_free + st.prefix_blocks_idle) / r->H >= need;
	return r->total >= st.prefix_blocks_shared / r->H + pinned + need;
}

/* rc of a call that needed `need` host groups (and `pinned` of its own in place), a failure
   (-ENOMEM) allowed only where the model finds no room: without a spill file exactly when
   there is none; with a limited one whenever the file may be full. With an I/O fault armed,
   -EIO too (and -ENOMEM, when a spill for its room failed). */
static void check_room_rc(struct prun *r, int rc, uint64_t need, uint64_t pinned, bool room,
			  const char *call)
{
	if (rc == 0)
		return;
	if (rc == -ENOMEM && (!room || r->limited)) {
		r->enomem++;
		return;
	}
	if ((rc == -EIO || rc == -ENOMEM) && r->fault_ok) {
		r->eio++;
		return;
	}
	fail_at(__FILE__, __LINE__, "%s (%llu host groups, %llu pinned; %s) returned %d (%s)", call,
		(unsigned long long)need, (unsigned long long)pinned,
		room ? "the model finds room" : "no room", rc, kvt_strerror(rc));
}

/* ---- the checks ----------------------------------------------------------------------- */

/* Host blocks of a layer holding n positions. */
static uint64_t blocks(const struct prun *r, uint32_t n)
{
	return r->H * DIV_UP(n, r->run.c.block_tokens);
}

static uint64_t span_blocks(const struct prun *r, uint32_t ht)
{
	return r->spb8 * (ht / r->run.c.block_tokens);
}

/* kvt_prefix_match of the first n hashes of (fam, ht), in tokens. */
static uint32_t match(struct prun *r, uint32_t fam, uint32_t ht, uint32_t n)
{
	uint64_t h[MAX_CHAIN];
	uint32_t got = UINT32_MAX;

	chain(r, fam, ht, n, h);
	CHECK_RC(kvt_prefix_match(r->run.m, h, n, ht, &got), 0);
	if (got % ht || got > n * ht)
		fail_at(__FILE__, __LINE__, "a chain of %u hashes of %u tokens: %u tokens match", n,
			ht, got);
	if (got / ht > r->maxreg[fam][ht / r->run.c.block_tokens - 1])
		fail_at(__FILE__, __LINE__,
			"family %u (%u tokens a hash): %u spans match, no finished sequence had "
			"more than %u",
			fam, ht, got / ht, r->maxreg[fam][ht / r->run.c.block_tokens - 1]);
	return got;
}

/* Every live sequence's info and token counts against the model; the stats' accounting;
   every span a live sequence holds still matches. */
static void check_cheap(struct prun *r)
{
	const struct kvt_config *c = &r->run.c;
	struct kvt_stats st = t_stats_of(r->run.m);
	uint64_t host = 0, disk = 0, frames = 0, shared_sum = 0, shared_min = 0;
	uint32_t maxheld[N_FAM][2] = {{0}};
	bool exact = true;

	for (uint32_t i = 0; i < r->run.n_live; i++) {
		const struct t_seq *s = &r->run.live[i];
		const struct pseq *p = ps_of(s);
		struct kvt_seq_info in = t_info_of(r->run.m, s->id);
		uint64_t hb = 0, sb = 0, fr = 0;
		uint32_t filled = UINT32_MAX, tokens = 0, lp = 0;

		for (uint32_t l = 0; l < NL; l++) {
			hb += blocks(r, p->fill[l]);
			filled = p->fill[l] < filled ? p->fill[l] : filled;
			tokens = s->n[l] > tokens ? s->n[l] : tokens;
			lp += s->n[l] != 0;
			fr += s->n[l] && !s->pre ? r->H * s->fph : 0;
			CHECK_EQ(t_tokens_of(r->run.m, s->id, l), s->n[l]);
			if (s->n[l])
				CHECK_EQ(p->fill[l], s->n[l]);
		}
		if (p->fam != FAM_PLAIN) {
			uint32_t x = p->ht / c->block_tokens - 1;

			sb = in.shared_blocks;
			CHECK_EQ(sb % span_blocks(r, p->ht), 0);
			assert_true(sb >= p->held * span_blocks(r, p->ht));
			assert_true(sb <= p->n_chain * span_blocks(r, p->ht));
			if (!p->complete)
				CHECK_EQ(sb, p->k * span_blocks(r, p->ht));
			/* known exactly: it holds [0, held) and nothing more */
			exact &= sb == p->held * span_blocks(r, p->ht);
			maxheld[p->fam][x] =
				p->held > maxheld[p->fam][x] ? p->held : maxheld[p->fam][x];
			/* no span it holds went: they match, all of them */
			if (match(r, p->fam, p->ht, p->held) != p->held * p->ht)
				fail_at(__FILE__, __LINE__,
					"seq %llu holds %u spans of family %u (%u tokens each); "
					"%u tokens match",
					(unsigned long long)s->id, p->held, p->fam, p->ht,
					match(r, p->fam, p->ht, p->held));
		}
		if (in.prompt_tokens != s->L || in.host_blocks != hb ||
		    in.filled_tokens != filled || in.tokens != tokens ||
		    in.layers_prefilled != lp || in.lost || in.preempted != s->pre ||
		    in.device_frames != fr || in.prefix_tokens != p->k * p->ht ||
		    in.shared_blocks != sb || in.disk_blocks > hb - sb ||
		    (!r->disk && in.disk_blocks))
			fail_at(__FILE__, __LINE__,
				"seq %llu info: prompt %u (model %u), host blocks %llu (%llu), "
				"filled %u (%u), tokens %u (%u), layers %u (%u), lost %d, preempted "
				"%u (%d), frames %llu (%llu), prefix %u (%u), shared %llu (%llu), "
				"disk %llu",
				(unsigned long long)s->id, in.prompt_tokens, s->L,
				(unsigned long long)in.host_blocks, (unsigned long long)hb,
				in.filled_tokens, filled, in.tokens, tokens, in.layers_prefilled,
				lp, in.lost, in.preempted, s->pre,
				(unsigned long long)in.device_frames, (unsigned long long)fr,
				in.prefix_tokens, p->k * p->ht,
				(unsigned long long)in.shared_blocks, (unsigned long long)sb,
				(unsigned long long)in.disk_blocks);
		host += hb - sb - in.disk_blocks;
		disk += in.disk_blocks;
		frames += fr;
		shared_sum += sb;
	}
	/* the spans live sequences hold: of each (family, hash_tokens), at least [0, max held) */
	for (uint32_t f = 0; f < N_FAM; f++)
		for (uint32_t x = 0; x < 2; x++)
			shared_min += maxheld[f][x] * span_blocks(r, (x + 1) * c->block_tokens);
	CHECK_EQ(st.live_seqs, r->run.n_live);
	CHECK_EQ(st.device_frames_used, frames);
	CHECK_EQ(st.host_blocks_used + st.host_blocks_free, st.host_blocks_total);
	CHECK_EQ(st.host_blocks_used, host + st.prefix_blocks - st.prefix_blocks_disk);
	CHECK_EQ(st.disk_blocks_used, disk + st.prefix_blocks_disk);
	CHECK_EQ(st.prefix_blocks_shared + st.prefix_blocks_idle, st.prefix_blocks);
	assert_true(st.prefix_blocks_disk <= st.prefix_blocks_idle);
	assert_true(st.prefix_blocks >= st.prefix_spans * r->spb8);
	assert_true(st.prefix_blocks <= st.prefix_spans * 2 * r->spb8);
	if (st.prefix_blocks_shared < shared_min || st.prefix_blocks_shared > shared_sum ||
	    (exact && st.prefix_blocks_shared != shared_min))
		fail_at(__FILE__, __LINE__,
			"prefix_blocks_shared %llu: the live sequences hold at least %llu, at "
			"most %llu%s",
			(unsigned long long)st.prefix_blocks_shared, (unsigned long long)shared_min,
			(unsigned long long)shared_sum, exact ? " (exactly the least)" : "");
	CHECK_EQ(st.tokens_prompt, r->run.tokens_prompt);
	CHECK_EQ(st.tokens_appended, r->run.tokens_appended);
	CHECK_EQ(st.prefill_layers, r->run.prefill_layers);
	CHECK_EQ(st.decode_calls, r->run.decode_calls);
	CHECK_EQ(st.tokens_saved, r->tokens_saved);
	CHECK_EQ(st.prefix_tokens_asked, r->asked);
	CHECK_EQ(st.prefix_tokens_hit, r->hit);
	CHECK_EQ(st.preemptions, r->preempts);
	CHECK_EQ(st.resumes, r->resumes);
	CHECK_EQ(st.bytes_h2d_history, r->bytes_history);
	CHECK_EQ(st.seqs_lost, 0);
	CHECK_EQ(st.disk_checksum_errors, 0);
	CHECK_EQ(st.disk_io_errors, r->io_faults);
	if (!r->disk)
		assert_true(st.prefix_blocks_disk == 0 && st.prefix_spans_spilled == 0 &&
			    st.prefix_spans_restored == 0 && st.disk_blocks_used == 0);
}

/* Reads s back: every layer's history in pieces (kvt_seq_load_kv), and every token of its
   prefilled layers through kvt_seq_read_token (the device frame where resident), each head;
   all bit for bit. */
static void readback(struct prun *r, const struct t_seq *s)
{
	const struct kvt_config *c = &r->run.c;
	const struct pseq *p = ps_of(s);
	size_t rb = r->run.rb;

	for (uint32_t l = 0; l < NL; l++) {
		for (uint32_t pos = 0; pos < p->fill[l];) {
			uint32_t n = 1 + t_rng_below(4 * c->block_tokens);
			uint64_t need;
			int rc;

			n = n < p->fill[l] - pos ? n : p->fill[l] - pos;
			need = DIV_UP(pos + n, c->block_tokens) - pos / c->block_tokens;
			rc = t_load_kv(r->run.m, s->id, l, pos, n, r->kk, r->vv, NULL);
			if (rc) { /* no room for its blocks: the rest waits */
				check_room_rc(r, rc, need, 0, has_room(r, need, 0), "load");
				return;
			}
			rows(r, p, l, pos, pos + n, r->k, r->v);
			if (memcmp(r->kk, r->k, (size_t)c->n_kv_heads * n * rb) ||
			    memcmp(r->vv, r->v, (size_t)c->n_kv_heads * n * rb))
				fail_at(__FILE__, __LINE__,
					"seq %llu (family %u, chain %u x %u, shared %u) layer %u: "
					"history [%u, %u) differs",
					(unsigned long long)s->id, p->fam, p->n_chain, p->ht,
					p->k * p->ht, l, pos, pos + n);
			r->bytes_history += 2ull * c->n_kv_heads * n * rb;
			pos += n;
		}
		for (uint32_t pos = 0; pos < s->n[l]; pos++)
			for (uint32_t h = 0; h < c->n_kv_heads; h++) {
				uint8_t k[256], v[256], ek[256], ev[256];
				int rc = kvt_seq_read_token(r->run.m, s->id, l, h, pos, k, v);

				if (rc) {
					check_room_rc(r, rc, 1, 0, has_room(r, 1, 0), "read token");
					return;
				}
				t_fill_row(c->dtype, c->head_dim, ek, key_at(p, pos), l, h, pos, 0);
				t_fill_row(c->dtype, c->head_dim, ev, key_at(p, pos), l, h, pos, 1);
				if (memcmp(k, ek, rb) || memcmp(v, ev, rb))
					fail_at(__FILE__, __LINE__,
						"seq %llu layer %u head %u pos %u (of %u, prompt %u, "
						"family %u, shared %u, %s) reads back wrong",
						(unsigned long long)s->id, l, h, pos, s->n[l], s->L,
						p->fam, p->k * p->ht,
						s->pre ? "preempted" : "resident");
				r->tokens_checked++;
			}
	}
	r->checks++;
}

/* ---- the operations --------------------------------------------------------------------- */

/* Prefills [pos, pos + n) of layer l of s, the tensors holding rows from kv_from (whole
   tensors through kvt_prefill_layer when whole is set: the rest of the layer). */
static void prefill_call(struct prun *r, struct t_seq *s, uint32_t l, uint32_t n, uint32_t kv_from,
			 bool whole)
{
	const struct kvt_config *c = &r->run.c;
	struct pseq *p = ps_of(s);
	uint32_t pos = p->fill[l], L = s->L, bt = c->block_tokens;
	bool last = pos + n == L;
	uint64_t had = DIV_UP(pos, bt), need = DIV_UP(pos + n, bt) - had;
	struct kvt_stats st = t_stats_of(r->run.m);
	bool dev_short = last && r->H * s->fph > st.device_frames_free;
	bool room = has_room(r, need, DIV_UP(pos + n, bt) /* the layer, all of it */);
	struct snap before;
	int rc;

	t_what = whole ? "prefill (whole)" : "prefill (chunk)";
	if (whole)
		kv_from = 0;
	rows(r, p, l, kv_from, pos + n, r->k, r->v);
	queries(r, p, l, L);
	snap_take(r, &before);
	rc = whole ? t_prefill_layer(r->run.m, s->id, l, r->k, r->v, r->q, NULL)
		   : t_prefill_chunk(r->run.m, s->id, l, pos, n, kv_from, r->k, r->v,
				     last ? r->q : NULL, NULL);
	if (rc) {
		if (dev_short && rc == -EIO && r->fault_ok) {
			r->eio++; /* reading its blocks back failed first */
		} else if (dev_short) {
			CHECK_RC(rc, -ENOMEM);
			/* no host room was made for a call the device refuses (spans evicted to
			   an unlimited file would still count) */
			if (!r->limited)
				CHECK_EQ(t_stats_of(r->run.m).prefix_spans, st.prefix_spans);
			r->enomem++;
		} else {
			check_room_rc(r, rc, need, DIV_UP(pos + n, bt), room, t_what);
		}
		snap_check(r, &before, rc, t_what);
		return;
	}
	if (dev_short)
		fail_at(__FILE__, __LINE__, "prefill of seq %llu layer %u took frames it lacks",
			(unsigned long long)s->id, l);
	if (!r->disk && !room)
		fail_at(__FILE__, __LINE__, "prefill took %llu host groups the model has not",
			(unsigned long long)need);
	/* the library must not read the caller's tensors after the call */
	memset(r->k, 0x5a, (size_t)c->n_kv_heads * (pos + n - kv_from) * r->run.rb);
	memset(r->v, 0xa5, (size_t)c->n_kv_heads * (pos + n - kv_from) * r->run.rb);
	p->fill[l] = pos + n;
	r->tokens_saved += n;
	r->chunks += !whole;
	if (last && kv_from)
		r->bytes_history += 2ull * c->n_kv_heads * kv_from * r->run.rb;
	if (!last)
		return;
	s->n[l] = L;
	r->run.tokens_prompt += L;
	r->run.prefill_layers++;
	r->prefills++;
	for (uint32_t x = 0; x < NL; x++)
		if (!s->n[x])
			return;
	/* every layer done: its chain's spans are cached (those not cached, and in the host
	   tier: all of them when none of its blocks is in the file) */
	p->complete = true;
	if (p->fam == FAM_PLAIN)
		return;
	{
		struct kvt_seq_info in = t_info_of(r->run.m, s->id);
		uint32_t *mr = &r->maxreg[p->fam][p->ht / bt - 1];

		*mr = p->n_chain > *mr ? p->n_chain : *mr;
		if (in.shared_blocks == p->n_chain * span_blocks(r, p->ht))
			p->held = p->n_chain;
		if (in.disk_blocks == 0 &&
		    match(r, p->fam, p->ht, p->n_chain) != p->n_chain * p->ht)
			fail_at(__FILE__, __LINE__,
				"seq %llu finished its prefill, every block in the host tier, but "
				"%u of the %u tokens of its chain match",
				(unsigned long long)s->id, match(r, p->fam, p->ht, p->n_chain),
				p->n_chain * p->ht);
	}
}

/* A layer of s not prefilled: the rest of it whole (kvt_prefill_layer, or one chunk), or a
   chunk of random size with rows from its start, from 0 or from between. */
static void prefill_step(struct prun *r, struct t_seq *s, uint32_t l)
{
	struct pseq *p = ps_of(s);
	uint32_t pos = p->fill[l], rest = s->L - pos, n, kv_from;

	switch (t_rng_below(4)) {
	case 0:
		prefill_call(r, s, l, rest, 0, true);
		return;
	case 1:
		n = rest;
		break;
	default:
		n = 1 + t_rng_below(t_rng_below(2) ? rest : (rest < 12 ? rest : 12));
		break;
	}
	switch (t_rng_below(3)) {
	case 0:
		kv_from = pos;
		break;
	case 1:
		kv_from = 0;
		break;
	default:
		kv_from = t_rng_below(pos + 1);
		break;
	}
	prefill_call(r, s, l, n, kv_from, false);
}

/* Creates a sequence: plain 1 time in 5, else with a chain of a common family (or a rare one,
   1 time in 4) at 8 or 16 tokens a hash, 0..6 hashes and up to 24 tokens past them. The match
   just before must be what it shares (less only when spans in the file found no room). */
static struct t_seq *create(struct prun *r)
{
	const struct kvt_config *c = &r->run.c;
	uint32_t fam = FAM_PLAIN, ht = c->block_tokens, n_chain = 0, L, got = UINT32_MAX, want;
	uint64_t h[MAX_CHAIN], id;
	struct pseq *p;
	struct t_seq *s;
	struct kvt_stats st0, st;
	int rc;

	t_what = "create";
	if (r->run.n_live >= r->run.max_live)
		return NULL;
	if (r->run.n_dead && t_rng_below(4) == 0) {
		uint32_t k = t_rng_below(r->run.n_dead);

		id = r->run.dead[k];
		r->run.dead[k] = r->run.dead[--r->run.n_dead];
	} else {
		id = t_rng_below(4) ? t_rng_next() : t_rng_below(64);
	}
	if (t_run_find(&r->run, id)) {
		/* a live id: -EEXIST, nothing changes */
		struct snap before;

		snap_take(r, &before);
		chain(r, 0, ht, 1, h);
		rc = t_rng_below(2) ? kvt_seq_create(r->run.m, id, 8)
				    : kvt_seq_create_prefix(r->run.m, id, 8, h, 1, ht, &got);
		CHECK_RC(rc, -EEXIST);
		snap_check(r, &before, rc, "create of a live id");
		return NULL;
	}
	if (t_rng_below(5)) {
		fam = t_rng_below(4) ? t_rng_below(N_COMMON)
				     : N_COMMON + t_rng_below(N_FAM - N_COMMON);
		ht = c->block_tokens << t_rng_below(2);
		n_chain = t_rng_below(MAX_CHAIN + 1);
	}
	L = n_chain * ht + t_rng_below(MAX_EXTRA + 1);
	L = L ? L : 1;
	s = &r->run.live[r->run.n_live];
	memset(s, 0, sizeof(*s));
	p = s->layer[0] = t_xmalloc(sizeof(*p));
	p->key = ++r->next_key;
	p->fam = fam;
	p->ht = ht;
	p->n_chain = n_chain;
	if (fam == FAM_PLAIN) {
		CHECK_RC(kvt_seq_create(r->run.m, id, L), 0);
	} else {
		chain(r, fam, ht, n_chain, h);
		want = match(r, fam, ht, n_chain);
		{
			/* never the observation window when the prefill selects, never all of
			   it */
			struct kvt_snapkv sp = t_snapkv_of(c, L);
			uint32_t rest =
				kvt_snapkv_count(&sp) && c->obs_window > 1 ? c->obs_window : 1;
			uint32_t most = L > rest ? (L - rest) / ht * ht : 0;

			want = want < most ? want : most;
		}
		st0 = t_stats_of(r->run.m);
		CHECK_RC(kvt_seq_create_prefix(r->run.m, id, L, h, n_chain, ht, &got), 0);
		st = t_stats_of(r->run.m);
		if (got % ht || got > want)
			fail_at(__FILE__, __LINE__, "seq %llu shares %u tokens, the match said %u",
				(unsigned long long)id, got, want);
		/* less than the match only when reading spans back failed or found no room:
		   spans were in the file, and the host tier could not hold every matched span
		   beside the groups shared before (or the file was full) */
		if (got < want && !(r->fault_ok && st0.prefix_blocks_disk) &&
		    (st0.prefix_blocks_disk == 0 ||
		     (!r->limited && r->total >= st0.prefix_blocks_shared / r->H +
							 want / ht * span_blocks(r, ht) / r->H)))
			fail_at(__FILE__, __LINE__,
				"seq %llu shares %u tokens, the match said %u (%llu blocks on disk, "
				"%llu shared, host %llu groups)",
				(unsigned long long)id, got, want,
				(unsigned long long)st0.prefix_blocks_disk,
				(unsigned long long)st0.prefix_blocks_shared,
				(unsigned long long)r->total);
		/* spans read back after one that failed stay cached, not shared */
		if (st.prefix_spans_restored - st0.prefix_spans_restored >
		    (r->fault_ok ? want : got) / ht)
			fail_at(__FILE__, __LINE__, "%llu spans restored for a match of %u",
				(unsigned long long)(st.prefix_spans_restored -
						     st0.prefix_spans_restored),
				got / ht);
		p->k = p->held = got / ht;
		for (uint32_t l = 0; l < NL; l++)
			p->fill[l] = got;
		r->asked += L;
		r->hit += got;
		r->creates_chain++;
		r->matched_creates += got > 0;
		r->short_creates += got < want;
	}
	s->id = id;
	s->L = L;
	{
		struct kvt_snapkv sp = t_snapkv_of(c, L);

		s->count = kvt_snapkv_count(&sp);
		s->fph = DIV_UP(c->sink_tokens + c->recent_tokens + s->count, c->block_tokens);
	}
	r->run.n_live++;
	r->run.created++;
	r->creates++;
	return s;
}

static void op_create(struct t_run *run)
{
	struct prun *r = pr_of(run);
	struct t_seq *s;

	if (run->n_live >= run->max_live) {
		t_run_destroy(run);
		r->finished++;
		return;
	}
	s = create(r);
	/* half of them prefilled at once, layer after layer until one fails */
	for (uint32_t l = 0; s && t_rng_below(2) && l < NL; l++) {
		while (!s->n[l]) {
			uint32_t before = ps_of(s)->fill[l];

			prefill_step(r, s, l);
			if (ps_of(s)->fill[l] == before)
				return;
		}
	}
}

/* One prefill step of a layer of a sequence that has one to prefill (not preempted). */
static void op_prefill(struct t_run *run)
{
	struct prun *r = pr_of(run);

	for (int tries = 0; tries < 8 && run->n_live; tries++) {
		struct t_seq *s = &run->live[t_rng_below(run->n_live)];
		uint32_t l = t_rng_below(NL);

		if (s->pre)
			continue;
		for (uint32_t x = 0; x < NL && s->n[l]; x++)
			l = (l + 1) % NL;
		if (s->n[l])
			continue;
		prefill_step(r, s, l);
		return;
	}
}

/* One token for a batch of sequences prefilled on a layer. */
static void op_decode(struct t_run *run)
{
	struct prun *r = pr_of(run);
	const struct kvt_config *c = &run->c;
	struct t_seq *b[MAX_BATCH];
	uint64_t ids[MAX_BATCH], fresh = 0;
	uint32_t l = t_rng_below(NL), n = t_run_pick_batch(run, l, b, MAX_BATCH), m = 0;
	struct snap before;
	bool room;
	int rc;

	t_what = "decode";
	for (uint32_t i = 0; i < n; i++)
		if (b[i]->n[l] < MAX_TOK) {
			b[m] = b[i];
			ids[m++] = b[i]->id;
			fresh += b[i]->n[l] % c->block_tokens == 0;
		}
	if (!m)
		return;
	for (uint32_t i = 0; i < m; i++) {
		size_t at = (size_t)i * c->n_kv_heads * run->rb;
		struct pseq *p = ps_of(b[i]);

		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			t_fill_row(c->dtype, c->head_dim, r->k + at + h * run->rb, p->key, l, h,
				   b[i]->n[l], 0);
			t_fill_row(c->dtype, c->head_dim, r->v + at + h * run->rb, p->key, l, h,
				   b[i]->n[l], 1);
		}
	}
	room = has_room(r, fresh, m);
	snap_take(r, &before);
	rc = t_decode_append(run->m, l, ids, m, r->k, r->v, NULL);
	if (rc) {
		check_room_rc(r, rc, fresh, m, room, "decode");
		snap_check(r, &before, rc, "decode");
		return;
	}
	if (!r->disk && !room)
		fail_at(__FILE__, __LINE__, "decode took %llu host groups the model has not",
			(unsigned long long)fresh);
	for (uint32_t i = 0; i < m; i++) {
		b[i]->n[l]++;
		ps_of(b[i])->fill[l]++;
	}
	run->tokens_appended += m;
	run->decode_calls++;
	r->tokens_saved += m;
	r->decodes++;
}

/* Preempts a resident sequence or resumes a preempted one. */
static void op_preempt(struct t_run *run)
{
	struct prun *r = pr_of(run);
	struct t_seq *s;
	struct snap before;
	uint64_t frames = 0, layer_max = 0;
	bool room;
	int rc;

	t_what = "preempt/resume";
	if (!run->n_live)
		return;
	s = t_run_pick(run, t_rng_below(3) != 0);
	if (!s->pre) {
		CHECK_RC(kvt_seq_preempt(run->m, s->id), 0);
		s->pre = true;
		r->preempts++;
		return;
	}
	for (uint32_t l = 0; l < NL; l++) {
		uint64_t g = DIV_UP(ps_of(s)->fill[l], run->c.block_tokens);

		frames += s->n[l] ? r->H * s->fph : 0;
		layer_max = g > layer_max ? g : layer_max;
	}
	/* the device must have its frames; the host tier one layer's resident blocks, with
	   a spill file */
	room = frames <= t_stats_of(run->m).device_frames_free &&
	       (!r->disk || has_room(r, layer_max, 0));
	snap_take(r, &before);
	rc = kvt_seq_resume(run->m, s->id, NULL);
	if (rc) {
		check_room_rc(r, rc, layer_max, 0, room, "resume");
		snap_check(r, &before, rc, "resume");
		return;
	}
	s->pre = false;
	r->resumes++;
}

/* kvt_seq_spill of a sequence: every block not shared with the cache goes to the file. */
static void op_spill(struct t_run *run)
{
	struct prun *r = pr_of(run);
	struct t_seq *s;
	struct kvt_seq_info a;
	struct snap before;
	int rc;

	t_what = "spill";
	if (!run->n_live)
		return;
	s = &run->live[t_rng_below(run->n_live)];
	snap_take(r, &before);
	rc = kvt_seq_spill(run->m, s->id);
	a = t_info_of(run->m, s->id);
	if (!r->disk) {
		CHECK_RC(rc, -ENOTSUP);
		snap_check(r, &before, rc, "spill");
		return;
	}
	if (rc == -EIO && r->fault_ok) {
		snap_check(r, &before, rc, "spill");
		r->eio++;
		return;
	}
	if (rc == -ENOSPC && r->limited) {
		/* the file gave up every cached span before refusing a live history */
		CHECK_EQ(t_stats_of(run->m).prefix_blocks_disk, 0);
		snap_check(r, &before, rc, "spill");
		r->enospc++;
		return;
	}
	CHECK_RC(rc, 0);
	CHECK_EQ(a.disk_blocks, a.host_blocks - a.shared_blocks);
	r->spills++;
}

/* kvt_seq_load_kv of a random range of a random layer of a sequence: its values. */
static void op_load(struct t_run *run)
{
	struct prun *r = pr_of(run);
	const struct kvt_config *c = &run->c;
	struct t_seq *s;
	struct pseq *p;
	uint32_t l = t_rng_below(NL), pos, n;
	uint64_t need;
	struct snap before;
	int rc;

	t_what = "load";
	if (!run->n_live)
		return;
	s = &run->live[t_rng_below(run->n_live)];
	p = ps_of(s);
	if (!p->fill[l]) {
		snap_take(r, &before);
		rc = t_load_kv(run->m, s->id, l, 0, 1, r->kk, r->vv, NULL);
		CHECK_RC(rc, -EINVAL);
		snap_check(r, &before, rc, "load of nothing");
		return;
	}
	pos = t_rng_below(p->fill[l]);
	n = 1 + t_rng_below(p->fill[l] - pos);
	need = DIV_UP(pos + n, c->block_tokens) - pos / c->block_tokens;
	snap_take(r, &before);
	rc = t_load_kv(run->m, s->id, l, pos, n, r->kk, r->vv, NULL);
	if (rc) {
		check_room_rc(r, rc, need, 0, has_room(r, need, 0), "load");
		snap_check(r, &before, rc, "load");
		return;
	}
	rows(r, p, l, pos, pos + n, r->k, r->v);
	if (memcmp(r->kk, r->k, (size_t)c->n_kv_heads * n * run->rb) ||
	    memcmp(r->vv, r->v, (size_t)c->n_kv_heads * n * run->rb))
		fail_at(__FILE__, __LINE__, "seq %llu layer %u: history [%u, %u) differs",
			(unsigned long long)s->id, l, pos, pos + n);
	r->bytes_history += 2ull * c->n_kv_heads * n * run->rb;
	r->loads++;
	/* and past what is written: -EINVAL, nothing changes */
	snap_take(r, &before);
	rc = t_load_kv(run->m, s->id, l, pos, p->fill[l] - pos + 1, r->kk, r->vv, NULL);
	CHECK_RC(rc, -EINVAL);
	snap_check(r, &before, rc, "load past the history");
}

/* kvt_prefix_match of a random family's chain: at least what live sequences hold of it. */
static void op_match(struct t_run *run)
{
	struct prun *r = pr_of(run);
	uint32_t fam = t_rng_below(N_COMMON + 4), ht = run->c.block_tokens << t_rng_below(2);
	uint32_t n = t_rng_below(MAX_CHAIN + 1), least = 0, got;
	struct kvt_stats st0 = t_stats_of(run->m), st;

	t_what = "match";
	for (uint32_t i = 0; i < run->n_live; i++) {
		const struct pseq *p = ps_of(&run->live[i]);

		if (p->fam == fam && p->ht == ht && p->held > least)
			least = p->held;
	}
	least = least < n ? least : n;
	got = match(r, fam, ht, n);
	if (got < least * ht)
		fail_at(__FILE__, __LINE__,
			"family %u (%u tokens a hash): %u tokens match, live sequences hold %u",
			fam, ht, got, least * ht);
	/* the same hashes a position later, or at the other granularity, name no span */
	if (n > 1) {
		uint64_t h[MAX_CHAIN];
		uint32_t other = UINT32_MAX;

		chain(r, fam, ht, n, h);
		CHECK_RC(kvt_prefix_match(run->m, h + 1, n - 1, ht, &other), 0);
		CHECK_EQ(other, 0);
		CHECK_RC(kvt_prefix_match(run->m, h, n, 3 * run->c.block_tokens - ht, &other), 0);
		CHECK_EQ(other, 0);
	}
	st = t_stats_of(run->m);
	CHECK_STATS_EQUAL(&st0, &st); /* a match changes nothing */
	r->matches++;
}

/* Finishes a sequence. */
static void op_finish(struct t_run *run)
{
	t_what = "finish";
	t_run_destroy(run);
	pr_of(run)->finished++;
}

/* With a spill file, a create (and its prefill), a prefill, a spill, a load or a resume with one
   of its next few I/Os failing (fault hook): -EIO may fail it (-ENOMEM too, when a spill for
   its room failed), a create may share less than the match; nothing else changes, and every
   later check counts the failure in disk_io_errors. Without one, a create. */
static void op_faulty(struct t_run *run)
{
	struct prun *r = pr_of(run);
	void (*const ops[])(struct t_run *) = {op_create, op_prefill, op_spill, op_load,
					       op_preempt};

	if (!r->disk) {
		op_create(run);
		return;
	}
	CHECK_RC(kvt_fault_arm(1u << KVT_FAULT_IO, 1 + t_rng_below(4)), 0);
	r->fault_ok = true;
	ops[t_rng_below(5)](run);
	r->fault_ok = false;
	r->io_faults += kvt_fault_fired();
	kvt_fault_disarm();
	t_what = "after an I/O fault";
}

/* After every operation: the cheap checks and one sequence read back; every 50, all. */
static void after_op(struct t_run *run)
{
	struct prun *r = pr_of(run);

	t_what = "check";
	check_cheap(r);
	if (!run->n_live)
		return;
	t_what = "read back";
	if (t_op % 50 == 49) {
		for (uint32_t i = 0; i < run->n_live; i++)
			readback(r, &run->live[i]);
		check_cheap(r);
	} else {
		readback(r, &run->live[t_rng_below(run->n_live)]);
	}
}

/* Phases of 150 operations, filling (up to MAX_LIVE live) then draining. */
static const struct t_mix prefix_mix = {
	.n = 9,
	.op = {op_create, op_prefill, op_decode, op_preempt, op_spill, op_load, op_match, op_faulty,
	       op_finish},
	.fill = {18, 45, 62, 70, 76, 82, 88, 92},
	.drain = {8, 30, 44, 51, 57, 63, 69, 71},
	.phase_ops = 150,
};

/* A run of `ops` operations on a host tier of host_groups groups; a spill file when dir is set
   (disk_groups groups of it, 0 = no limit). */
static void run_prefix(uint64_t seed, long ops, uint32_t host_groups, const char *dir,
		       uint32_t disk_groups)
{
	struct kvt_config c = t_small_config();
	struct prun *r = t_xmalloc(sizeof(*r));
	struct kvt_stats st;
	double t0 = t_now_s();

	c.n_layers = NL;
	c.n_kv_heads = 2;
	c.n_q_heads = 4;
	c.head_dim = 8;
	c.block_tokens = 8;
	c.sink_tokens = 4;
	c.recent_tokens = 12;
	c.topk_tokens = 8;
	c.obs_window = 4;
	c.pool_kernel = 3;
	c.save_threads = 2;
	c.staging_bytes = 16u << 10;
	c.device_bytes = t_budget(&c, 100); /* resident sets: 6 groups a sequence at most */
	c.host_bytes = t_budget(&c, host_groups);
	c.spill_dir = dir;
	if (dir && disk_groups) {
		struct kvt_manager *m;

		/* file bytes of one group, from what 1 MiB holds */
		c.disk_bytes = 1 << 20;
		m = t_mk(&c);
		c.disk_bytes = c.disk_bytes / (t_stats_of(m).disk_blocks_total / c.n_kv_heads) *
			       disk_groups;
		kvt_manager_destroy(m);
	}
	t_run_init(&r->run, &c, MAX_LIVE);
	r->disk = dir != NULL;
	r->limited = dir && disk_groups;
	r->H = c.n_kv_heads;
	r->spb8 = (uint64_t)NL * c.n_kv_heads;
	r->total = host_groups;
	r->salt = t_mix(seed ^ 0x70726566ull);
	r->k = t_xmalloc((size_t)c.n_kv_heads * MAX_TOK * r->run.rb);
	r->v = t_xmalloc((size_t)c.n_kv_heads * MAX_TOK * r->run.rb);
	r->kk = t_xmalloc((size_t)c.n_kv_heads * MAX_TOK * r->run.rb);
	r->vv = t_xmalloc((size_t)c.n_kv_heads * MAX_TOK * r->run.rb);
	r->q = t_xmalloc((size_t)c.n_q_heads * c.obs_window * r->run.rb);
	assert_true(MAX_CHAIN * 16 + MAX_EXTRA + 1 <= MAX_TOK);
	t_rng_seed(seed);
	r->run.m = t_mk(&c);
	CHECK_EQ(t_stats_of(r->run.m).host_blocks_total, host_groups * r->H);
	check_cheap(r);
	t_run_loop(&r->run, ops, &prefix_mix, after_op);
	/* A run may end before its limited file was ever full when a spill came: it goes on
	   (a few hundred operations at a time) until one is refused, which is what it is for. */
	for (int more = 0; r->limited && ops >= 1000 && !r->enospc && more < 16; more++) {
		t_run_loop(&r->run, 500, &prefix_mix, after_op);
		ops += 500;
	}

	t_what = "final read back";
	for (uint32_t i = 0; i < r->run.n_live; i++)
		readback(r, &r->run.live[i]);
	check_cheap(r);
	st = t_stats_of(r->run.m);
	print_message("# %ld ops in %.1f s: %llu creates (%llu with a chain, %llu matched, %llu "
		      "short of the match), %llu layers prefilled (%llu chunks), %llu decode "
		      "calls, %llu spills, %llu loads, %llu matches, %llu finished; %llu failed "
		      "calls, -ENOMEM %llu times (read-backs put off too), -ENOSPC %llu, -EIO "
		      "%llu (%llu I/O failures injected); %llu read-backs, %llu tokens; spans: "
		      "%llu cached now, %llu evicted, %llu spilled, %llu restored; %llu of "
		      "%llu prompt tokens from the cache; %llu blocks spilled, %llu fetched\n",
		      ops, t_now_s() - t0, (unsigned long long)r->creates,
		      (unsigned long long)r->creates_chain, (unsigned long long)r->matched_creates,
		      (unsigned long long)r->short_creates, (unsigned long long)r->prefills,
		      (unsigned long long)r->chunks, (unsigned long long)r->decodes,
		      (unsigned long long)r->spills, (unsigned long long)r->loads,
		      (unsigned long long)r->matches, (unsigned long long)r->finished,
		      (unsigned long long)r->fails, (unsigned long long)r->enomem,
		      (unsigned long long)r->enospc, (unsigned long long)r->eio,
		      (unsigned long long)r->io_faults, (unsigned long long)r->checks,
		      (unsigned long long)r->tokens_checked, (unsigned long long)st.prefix_spans,
		      (unsigned long long)st.prefix_spans_evicted,
		      (unsigned long long)st.prefix_spans_spilled,
		      (unsigned long long)st.prefix_spans_restored,
		      (unsigned long long)st.prefix_tokens_hit,
		      (unsigned long long)st.prefix_tokens_asked,
		      (unsigned long long)st.disk_blocks_spilled,
		      (unsigned long long)st.disk_blocks_fetched);
	if (ops >= 1000) { /* the run did what it is for */
		assert_true(r->matched_creates > 0 && r->chunks > 0 && r->fails > 0);
		assert_true(r->decodes > 0 && r->resumes > 0 && r->loads > 0);
		/* spans are dropped without a file, or when it is full */
		if (!r->disk || r->limited)
			assert_true(st.prefix_spans_evicted > 0);
		if (r->disk)
			assert_true(st.prefix_spans_spilled > 0 && st.prefix_spans_restored > 0 &&
				    r->spills > 0 && r->io_faults > 0);
		if (r->limited)
			assert_true(r->enospc > 0);
	}

	t_what = "teardown";
	while (r->run.n_live) {
		t_run_destroy(&r->run);
		check_cheap(r);
	}
	st = t_stats_of(r->run.m);
	CHECK_EQ(st.prefix_blocks_shared, 0);
	CHECK_EQ(st.host_blocks_used, st.prefix_blocks - st.prefix_blocks_disk);
	CHECK_EQ(st.disk_blocks_used, st.prefix_blocks_disk);
	CHECK_EQ(st.device_frames_used, 0);
	kvt_manager_destroy(r->run.m);
	if (dir)
		CHECK_EQ(t_dir_entries(dir), 0);
	t_run_fini(&r->run);
	free(r->k);
	free(r->v);
	free(r->kk);
	free(r->vv);
	free(r->q);
	free(r);
	t_op = -1;
	t_what = "setup";
}

/* No disk tier: idle spans are dropped for room; a host tier of 120 groups (four of the longest
   prompts). */
void test_prefix_random_host(void **state)
{
	(void)state;
	print_message("# seed %llu (KVT_TEST_SEED=%llu repeats this run)\n",
		      (unsigned long long)t_seed, (unsigned long long)t_seed);
	run_prefix(t_seed, t_pick_ops(24000), 120, NULL, 0);
}

/* An unlimited spill file and a host tier of 48 groups (a long prompt's history takes 30):
   spans go to the file and come back, histories are spilled by nearly every call. */
void test_prefix_random_disk(void **state)
{
	const char *dir = *state;

	run_prefix(t_mix(t_seed ^ 1), t_pick_ops(8000), 48, dir, 0);
}

/* A spill file of 64 groups: -ENOSPC and -ENOMEM whenever it is full, and the cached spans it
   holds give way to live histories. */
void test_prefix_random_disk_limited(void **state)
{
	const char *dir = *state;

	run_prefix(t_mix(t_seed ^ 2), t_pick_ops(8000), 48, dir, 64);
}
