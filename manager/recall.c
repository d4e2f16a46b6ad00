/* SPDX-License-Identifier: MIT */
/*
 * Dynamic recall: block metadata kept as blocks fill, the shared recall cache of single-block
 * device frames (exact LRU across sequences, hit detection through a per-(sequence, layer)
 * table so a cached block is never loaded twice), the recall views kvt_attend reads, and each
 * sequence's recall working set over its last w steps.
 *
 * Costs: a recall call is O(blocks asked for) bookkeeping plus one batched gather of the
 * misses; scoring (kvt_decode_recall) reads every block's metadata of the layer once.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "policy.h"
#include "recall.h"
#include "spill.h"

int kvt_recall_init(struct kvt_manager *m, uint64_t base, uint32_t n_frames)
{
	struct kvt_recall_cache *rc = &m->rc;

	*rc = (struct kvt_recall_cache){
		.n = n_frames,
		.base = base,
		.free_head = n_frames ? 0 : KVT_NO_ENTRY,
	};
	if (!n_frames)
		return 0;
	rc->q_cap = 64; /* a power of two >= 2n + 64, so positions wrap with a mask */
	while (rc->q_cap < 2ull * n_frames + 64)
		rc->q_cap *= 2;
	rc->e = kvt_calloc(n_frames, sizeof(*rc->e));
	rc->tick_of = kvt_calloc(n_frames, sizeof(*rc->tick_of));
	rc->q = kvt_malloc((size_t)rc->q_cap * sizeof(*rc->q));
	if (!rc->e || !rc->tick_of || !rc->q)
		return -ENOMEM; /* kvt_recall_fini frees what was allocated */
	for (uint32_t i = 0; i < n_frames; i++)
		rc->e[i].next = i + 1 < n_frames ? i + 1 : KVT_NO_ENTRY;
	return 0;
}

void kvt_recall_fini(struct kvt_manager *m)
{
	free(m->rc.e);
	free(m->rc.tick_of);
	free(m->rc.q);
	m->rc.e = NULL;
	m->rc.tick_of = NULL;
	m->rc.q = NULL;
}

void kvt_recall_layer_free(struct kvt_recall_layer *rc)
{
	if (!rc)
		return;
	free(rc->meta);
	free(rc->slot);
	free(rc->tk);
	free(rc->view_n);
	free(rc->view_ent);
	free(rc->view_gen);
	free(rc);
}

void kvt_recall_free_seq(struct kvt_seq *s, uint32_t n_layers)
{
	for (uint32_t l = 0; l < n_layers; l++) {
		kvt_recall_layer_free(s->layers[l].rc);
		s->layers[l].rc = NULL;
	}
	free(s->ws_bucket);
	s->ws_bucket = NULL;
}

/* Grows one table of n_old to n_new elements of sz bytes, new ones filled with byte `fill`. */
static int grow(void **p, size_t n_old, size_t n_new, size_t sz, int fill)
{
	void *q = kvt_realloc(*p, n_new * sz);

	if (!q)
		return -ENOMEM;
	memset((uint8_t *)q + n_old * sz, fill, (n_new - n_old) * sz);
	*p = q;
	return 0;
}

/* The layer's recall state with room for n_blocks blocks (capacity only: nothing a caller can
   see changes). 0 or -ENOMEM. */
static int rc_layer_get(struct kvt_manager *m, struct kvt_seq_layer *ly, uint32_t n_blocks)
{
	struct kvt_recall_layer *rc = ly->rc;
	size_t H = m->cfg.n_kv_heads, old, want;

	if (!rc) {
		rc = kvt_calloc(1, sizeof(*rc));
		if (!rc)
			return -ENOMEM;
		ly->rc = rc;
	}
	if (n_blocks <= rc->cap_blocks)
		return 0;
	old = rc->cap_blocks;
	want = old ? old : 8;
	while (want < n_blocks)
		want *= 2;
	if ((m->keep_meta && grow((void **)&rc->meta, old * H, want * H, m->meta_bytes, 0)) ||
	    grow((void **)&rc->slot, old * H, want * H, sizeof(*rc->slot), 0) ||
	    grow((void **)&rc->tk, old * H, want * H, sizeof(*rc->tk), 0))
		return -ENOMEM; /* the tables that grew keep their contents: still consistent */
	for (size_t i = old * H; i < want * H; i++)
		rc->slot[i].entry = KVT_NO_ENTRY;
	rc->cap_blocks = (uint32_t)want;
	return 0;
}

/* Counts the layer's top-K positions per (block, head) once, so "is this block fully
   resident" costs O(1) on the recall path. Needs tables covering the prompt's blocks. */
static void tk_count(const struct kvt_manager *m, const struct kvt_seq *s, struct kvt_seq_layer *ly)
{
	uint32_t H = m->cfg.n_kv_heads;

	for (uint32_t h = 0; h < H; h++)
		for (uint32_t i = 0; i < s->valid_topk; i++)
			ly->rc->tk[(size_t)((uint32_t)ly->topk[(size_t)h * s->valid_topk + i] >>
					    m->lbt) *
					   H +
				   h]++;
	ly->rc->tk_ready = true;
}

/* Whether every token of block b (n_valid of them) of head h is resident, in O(1): sink and
   ring are ranges, and top-K positions (which lie between them) are counted per block. */
static inline bool fully_resident(const struct kvt_manager *m, const struct kvt_seq_layer *ly,
				  uint32_t h, uint32_t b, uint32_t n_valid)
{
	uint32_t sink = m->cfg.sink_tokens, ring0 = kvt_ring0(m, ly->n_tokens);
	uint32_t p0 = b << m->lbt, end = p0 + n_valid, cnt = 0;

	if (p0 < sink)
		cnt += (end < sink ? end : sink) - p0;
	if (end > ring0)
		cnt += end - (p0 > ring0 ? p0 : ring0);
	return cnt + ly->rc->tk[(size_t)b * m->cfg.n_kv_heads + h] == n_valid;
}

int kvt_meta_reserve(struct kvt_manager *m, struct kvt_seq_layer *ly, uint32_t n_blocks)
{
	return rc_layer_get(m, ly, n_blocks);
}

int kvt_meta_prefill(struct kvt_manager *m, struct kvt_seq_layer *ly, const void *k, uint32_t L)
{
	const struct kvt_config *c = &m->cfg;
	uint32_t nb = DIV_UP(L, c->block_tokens);
	int err = rc_layer_get(m, ly, nb);

	if (err)
		return err;
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		const uint8_t *rows = (const uint8_t *)k + (size_t)h * L * m->row_bytes;

		for (uint32_t b = 0; b < nb; b++) {
			uint32_t p0 = b * c->block_tokens;
			uint32_t n = L - p0 < c->block_tokens ? L - p0 : c->block_tokens;

			kvt_meta_build(c->dtype, c->head_dim,
				       ly->rc->meta +
					       ((size_t)b * c->n_kv_heads + h) * m->meta_bytes,
				       rows + (size_t)p0 * m->row_bytes, m->row_bytes, n);
		}
	}
	ly->rc->meta_n = L;
	return 0;
}

int kvt_meta_catch_up(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly)
{
	const struct kvt_config *c = &m->cfg;
	struct kvt_recall_layer *rc = ly->rc;
	int err;

	if (rc->meta_n >= ly->n_tokens)
		return 0;
	err = m->ops->save_wait(m->be, s->save_ticket);
	if (err)
		return kvt_fail(m, err, "recall: sequence %llu: its saves: %s",
				(unsigned long long)s->id, m->be->err);
	/* Ascending positions, as the tokens arrived: the same result as folding each at its
	   append. */
	for (uint32_t pos = rc->meta_n; pos < ly->n_tokens; pos++) {
		uint8_t *meta = rc->meta + (size_t)(pos >> m->lbt) * c->n_kv_heads * m->meta_bytes;
		bool first = (pos & (c->block_tokens - 1)) == 0;

		for (uint32_t h = 0; h < c->n_kv_heads; h++, meta += m->meta_bytes) {
			const void *k = (const void *)(uintptr_t)kvt_host_row(m, ly, h, pos);

			if (first)
				kvt_meta_init(c->dtype, c->head_dim, meta, k);
			else
				kvt_meta_add(c->dtype, c->head_dim, meta, k);
		}
	}
	rc->meta_n = ly->n_tokens;
	return 0;
}

uint64_t kvt_block_resident(const struct kvt_manager *m, const struct kvt_seq *s,
			    const struct kvt_seq_layer *ly, uint32_t h, uint32_t b,
			    uint32_t n_valid)
{
	uint32_t sink = m->cfg.sink_tokens, N = ly->n_tokens, ring0 = kvt_ring0(m, N);
	uint32_t p0 = b << m->lbt, end = p0 + n_valid;
	uint64_t mask = 0;

	if (s->preempted)
		return 0;
	if (p0 < sink) {
		uint32_t e = end < sink ? end : sink;

		mask |= e - p0 >= 64 ? ~0ull : ((1ull << (e - p0)) - 1);
	}
	if (end > ring0) {
		uint32_t a = ring0 > p0 ? ring0 - p0 : 0, e = (N < end ? N : end) - p0;

		if (e > a)
			mask |= (e - a >= 64 ? ~0ull : ((1ull << (e - a)) - 1)) << a;
	}
	if (s->valid_topk && end > sink && p0 < ring0) {
		const int32_t *t = ly->topk + (size_t)h * s->valid_topk;
		uint32_t lo = kvt_topk_lower(t, s->valid_topk, p0);

		for (; lo < s->valid_topk && (uint32_t)t[lo] < end; lo++)
			mask |= 1ull << ((uint32_t)t[lo] - p0);
	}
	return mask;
}

/* ---- working set ---- */

/* Moves s's window forward to step t, forgetting the steps that fall out of it. */
static void ws_advance(const struct kvt_manager *m, struct kvt_seq *s, uint32_t t)
{
	uint32_t w = m->cfg.ws_window, d, at;

	if (!s->ws_bucket || t <= s->ws_step)
		return;
	d = t - s->ws_step < w ? t - s->ws_step : w;
	at = s->ws_cur;
	for (uint32_t i = 1; i <= d; i++) {
		at = at + 1 == w ? 0 : at + 1;
		if (ALWAYS(s->ws_total >= s->ws_bucket[at])) /* ws_total is the buckets' sum */
			s->ws_total -= s->ws_bucket[at];
		s->ws_bucket[at] = 0;
	}
	s->ws_cur = (uint32_t)((s->ws_cur + (uint64_t)(t - s->ws_step)) % w);
	s->ws_step = t;
}

/* Step x is inside the window ending at ws_step. */
static inline bool in_window(const struct kvt_manager *m, const struct kvt_seq *s, uint32_t x)
{
	return x <= s->ws_step && s->ws_step - x < m->cfg.ws_window;
}

/* Bucket of step x inside the window: ws_cur is ws_step's, so no division. */
static inline uint32_t bucket_of(const struct kvt_manager *m, const struct kvt_seq *s, uint32_t x)
{
	uint32_t d = s->ws_step - x;

	return s->ws_cur >= d ? s->ws_cur - d : s->ws_cur + m->cfg.ws_window - d;
}

/* Records that a block (its touched slot) was recalled at step t. */
static void ws_touch(const struct kvt_manager *m, struct kvt_seq *s, uint32_t *touched, uint32_t t)
{
	ws_advance(m, s, t);
	if (*touched) {
		uint32_t p = *touched - 1;

		if (p >= t)
			return; /* already counted at this step or a later one */
		if (in_window(m, s, p)) {
			uint32_t *bucket = &s->ws_bucket[bucket_of(m, s, p)];

			/* the block was counted in the bucket of step p */
			if (ALWAYS(*bucket > 0 && s->ws_total > 0)) {
				(*bucket)--;
				s->ws_total--;
			}
		}
	}
	*touched = t + 1;
	if (in_window(m, s, t)) {
		s->ws_bucket[bucket_of(m, s, t)]++;
		s->ws_total++;
	}
}

uint32_t kvt_ws_frames(struct kvt_manager *m, struct kvt_seq *s, uint32_t t, uint32_t *step_frames)
{
	*step_frames = 0;
	if (!s->ws_bucket)
		return 0;
	ws_advance(m, s, t);
	if (s->ws_step == t)
		*step_frames = s->ws_bucket[s->ws_cur];
	return s->ws_total;
}

/* ---- the cache ---- */

/* A prefetch for writing that the compiler keeps: GCC finds a function whose only effect is
   __builtin_prefetch const and deletes every call of it (inlined or not); the empty volatile
   asm is an effect it must keep. */
static inline void prefetch(const void *p)
{
	__builtin_prefetch(p, 1);
	__asm__ volatile("");
}

static inline bool rec_live(const struct kvt_recall_cache *rc, struct kvt_rc_rec r)
{
	return rc->tick_of[r.id] == r.tick;
}

/* Prefetches both cache lines entry id may straddle. */
static inline void prefetch_entry(const struct kvt_recall_cache *rc, uint32_t id)
{
	prefetch(&rc->e[id]);
	prefetch((const char *)&rc->e[id + 1] - 1);
}

#define LRU_AHEAD 8u

/* Prefetches the tick of the record k places after the oldest one, and with entry its entry
   too (eviction reads it). */
static inline void prefetch_rec(const struct kvt_recall_cache *rc, uint32_t k, bool entry)
{
	if (k < rc->q_len) {
		uint32_t id = rc->q[(rc->q_head + k) & (rc->q_cap - 1)].id;

		prefetch(&rc->tick_of[id]);
		if (entry)
			prefetch_entry(rc, id);
	}
}

/* Drops the records that no longer name a live use, keeping the order of the others. */
static void lru_compact(struct kvt_recall_cache *rc)
{
	uint32_t w = 0;

	for (uint32_t i = 0; i < rc->q_len; i++) {
		struct kvt_rc_rec r = rc->q[(rc->q_head + i) & (rc->q_cap - 1)];

		prefetch_rec(rc, i + 4 * LRU_AHEAD, false); /* a short loop: further ahead */
		if (rec_live(rc, r))
			rc->q[(rc->q_head + w++) & (rc->q_cap - 1)] = r;
	}
	rc->q_len = w;
}

/* Marks entry id most recently used. */
static void lru_touch(struct kvt_recall_cache *rc, uint32_t id)
{
	if (rc->q_len == rc->q_cap) {
		lru_compact(rc);
		/* at most n live records remain, and q_cap >= 2n + 64: room again */
		if (NEVER(rc->q_len == rc->q_cap))
			return;
	}
	if (++rc->tick == 0) /* 0 marks an entry holding no block */
		rc->tick = 1;
	rc->tick_of[id] = rc->tick;
	rc->q[(rc->q_head + rc->q_len++) & (rc->q_cap - 1)] = (struct kvt_rc_rec){id, rc->tick};
}

static void owner_unlink(struct kvt_recall_cache *rc, uint32_t id)
{
	struct kvt_rc_entry *e = &rc->e[id];

	if (e->s_prev != KVT_NO_ENTRY)
		rc->e[e->s_prev].s_next = e->s_next;
	else
		e->owner->rc_head = e->s_next;
	if (e->s_next != KVT_NO_ENTRY)
		rc->e[e->s_next].s_prev = e->s_prev;
}

/* Detaches entry id from its block (the owner's table forgets it) and bumps its generation, so
   views naming it read as stale. Its LRU records go stale too (tick_of 0) and stay queued
   until popped or compacted away. */
static void entry_release(struct kvt_manager *m, uint32_t id)
{
	struct kvt_rc_entry *e = &m->rc.e[id];
	struct kvt_recall_layer *lrc = e->owner->layers[e->layer].rc;

	lrc->slot[(size_t)e->block * m->cfg.n_kv_heads + e->head].entry = KVT_NO_ENTRY;
	owner_unlink(&m->rc, id);
	e->owner = NULL;
	e->gen++;
	m->rc.tick_of[id] = 0;
}

/* Releases entry id (its LRU records go stale) and puts its frame on the free list. */
static void entry_free(struct kvt_manager *m, uint32_t id)
{
	struct kvt_recall_cache *rc = &m->rc;

	entry_release(m, id);
	rc->e[id].next = rc->free_head;
	rc->free_head = id;
	if (ALWAYS(rc->n_used > 0)) /* it held a block: it was counted */
		rc->n_used--;
}

void kvt_recall_drop_seq(struct kvt_manager *m, struct kvt_seq *s)
{
	while (s->rc_head != KVT_NO_ENTRY)
		entry_free(m, s->rc_head);
	for (uint32_t l = 0; l < m->cfg.n_layers; l++)
		if (s->layers[l].rc && s->layers[l].rc->view_n) {
			memset(s->layers[l].rc->view_n, 0,
			       m->cfg.n_kv_heads * sizeof(*s->layers[l].rc->view_n));
			s->layers[l].rc->view_failed = false;
		}
}

/* A frame for a new block: a free one, else the least recently used one not used by this call.
   KVT_NO_ENTRY when every frame is pinned by this call. */
static uint32_t take_frame(struct kvt_manager *m)
{
	struct kvt_recall_cache *rc = &m->rc;
	uint32_t id = rc->free_head;

	if (id != KVT_NO_ENTRY) {
		rc->free_head = rc->e[id].next;
		ALWAYS(rc->n_used < rc->n); /* a free frame is an unused one */
		rc->n_used++;
		return id;
	}
	/* The oldest live record names the least recently used entry. If this call pinned it,
	   this call touched every entry. Records name entries at random: fetching those of the
	   records a few places on overlaps the misses of the next evictions. */
	while (rc->q_len && !rec_live(rc, rc->q[rc->q_head])) {
		rc->q_head = (rc->q_head + 1) & (rc->q_cap - 1);
		rc->q_len--;
		prefetch_rec(rc, LRU_AHEAD, true);
	}
	if (!rc->q_len)
		return KVT_NO_ENTRY;
	id = rc->q[rc->q_head].id;
	if (rc->e[id].pin == rc->call)
		return KVT_NO_ENTRY;
	rc->q_head = (rc->q_head + 1) & (rc->q_cap - 1);
	rc->q_len--;
	prefetch_rec(rc, LRU_AHEAD, true);
	entry_release(m, id);
	m->st.recall_evictions++;
	return id;
}

/* Grows the view arrays of a layer to r entries per head (capacity only). */
static int view_reserve(struct kvt_manager *m, struct kvt_recall_layer *rc, uint32_t r)
{
	size_t H = m->cfg.n_kv_heads;

	if (!rc->view_n) {
		rc->view_n = kvt_calloc(H, sizeof(*rc->view_n));
		if (!rc->view_n)
			return -ENOMEM;
	}
	if (r <= rc->view_cap)
		return 0;
	/* The old view is laid out for the old capacity: re-lay it out per head. */
	uint32_t *ent = kvt_malloc(H * r * sizeof(*ent)), *gen = kvt_malloc(H * r * sizeof(*gen));

	if (!ent || !gen) {
		free(ent);
		free(gen);
		return -ENOMEM;
	}
	for (size_t h = 0; h < H; h++) {
		if (rc->view_n[h]) {
			memcpy(ent + h * r, rc->view_ent + h * rc->view_cap,
			       rc->view_n[h] * sizeof(*ent));
			memcpy(gen + h * r, rc->view_gen + h * rc->view_cap,
			       rc->view_n[h] * sizeof(*gen));
		}
	}
	free(rc->view_ent);
	free(rc->view_gen);
	rc->view_ent = ent;
	rc->view_gen = gen;
	rc->view_cap = r;
	return 0;
}

/* Distinct blocks of sel (one (sequence, head) list of r) that are not fully resident. The slow
   path of the capacity check, taken only when the quick upper bound exceeds the cache. */
static uint64_t exact_need(const struct kvt_manager *m, const struct kvt_seq_layer *ly, uint32_t h,
			   const uint32_t *sel, uint32_t r)
{
	uint32_t bt = m->cfg.block_tokens;
	uint64_t need = 0;

	for (uint32_t j = 0; j < r; j++) {
		uint32_t b = sel[j], nv;
		bool dup = false;

		if (b == KVT_NO_ENTRY)
			continue;
		for (uint32_t i = 0; i < j && !dup; i++)
			dup = sel[i] == b;
		nv = ly->n_tokens - b * bt < bt ? ly->n_tokens - b * bt : bt;
		if (!dup && !fully_resident(m, ly, h, b, nv))
			need++;
	}
	return need;
}

/* Validates a recall batch (pass 1): every sequence live, once, prefilled for layer, resident,
   every block index inside its history; grows the tables the call will write. Fills
   m->batch. */
static int recall_validate(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
			   const uint32_t *sel, uint32_t r, uint64_t *upper)
{
	uint32_t H = m->cfg.n_kv_heads, bt = m->cfg.block_tokens;
	uint64_t stamp = ++m->stamp, need = 0;
	int err = 0;

	if (kvt_reserve((void **)&m->batch, &m->batch_cap, n, sizeof(*m->batch)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for a batch of %u", n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = kvt_batch_member(m, seqs[i], layer, stamp, "recall", &err);
		struct kvt_seq_layer *ly;
		uint32_t nb;

		if (!s)
			return err;
		ly = &s->layers[layer];
		nb = DIV_UP(ly->n_tokens, bt);
		for (size_t j = 0; j < (size_t)H * r; j++) {
			uint32_t b = sel[((size_t)i * H) * r + j];

			if (b == KVT_NO_ENTRY)
				continue;
			if (b >= nb)
				return kvt_fail(m, -EINVAL,
						"recall: sequence %llu layer %u: block %u past "
						"its %u blocks",
						(unsigned long long)seqs[i], layer, b, nb);
			need++;
		}
		if (rc_layer_get(m, ly, ly->n_groups) || view_reserve(m, ly->rc, r) ||
		    (!s->ws_bucket &&
		     !(s->ws_bucket = kvt_calloc(m->cfg.ws_window, sizeof(*s->ws_bucket)))))
			return kvt_fail(m, -ENOMEM,
					"recall: sequence %llu: no memory for its "
					"recall tables",
					(unsigned long long)seqs[i]);
		if (!ly->rc->tk_ready)
			tk_count(m, s, ly);
		m->batch[i] = s;
	}
	*upper = need;
	return 0;
}

/* Pass 2 of a recall call costs memory latency: a step of 256 sequences x 32 layers reads slot
   tables, top-K counts and cache entries of over 100 MB, two or three cache misses per block
   asked for. So while it works on list g (the selection of (sequence g / H, head g % H)), it
   prefetches the slots and counts of list g + 2, and the cache entries that list g + 1's slots
   name (those slots were fetched one list earlier). This does one list t: its slots and counts,
   or with entries the cache entries its slots name. Lists past the batch are ignored. */
static void prefetch_list(const struct kvt_manager *m, uint32_t layer, const uint32_t *sel,
			  uint32_t n, uint32_t r, uint64_t t, bool entries)
{
	uint64_t H = m->cfg.n_kv_heads;

	if (t >= (uint64_t)n * H)
		return;
	const struct kvt_recall_layer *lrc = m->batch[t / H]->layers[layer].rc;
	const uint32_t *hs = sel + t * r;
	uint32_t h = (uint32_t)(t % H);

	for (uint32_t j = 0; j < r; j++) {
		size_t at = (size_t)hs[j] * H + h;
		uint32_t id;

		if (hs[j] == KVT_NO_ENTRY)
			continue;
		if (!entries) {
			prefetch(&lrc->slot[at]);
			prefetch(&lrc->tk[at]);
		} else if ((id = lrc->slot[at].entry) != KVT_NO_ENTRY) {
			prefetch_entry(&m->rc, id);
			prefetch(&m->rc.tick_of[id]); /* the LRU touch */
		}
	}
}

/* The exact capacity check of a recall call, taken only when recall_validate's quick upper
   bound `need` exceeds the cache, then room in m->xf for the loads: 0, or -ENOSPC or -ENOMEM
   recorded. */
static int recall_room(struct kvt_manager *m, uint32_t layer, const uint32_t *sel, uint32_t n,
		       uint32_t r, uint64_t need)
{
	uint32_t H = m->cfg.n_kv_heads;

	if (need > m->rc.n) {
		need = 0;
		for (uint32_t i = 0; i < n; i++)
			for (uint32_t h = 0; h < H; h++)
				need += exact_need(m, &m->batch[i]->layers[layer], h,
						   sel + ((size_t)i * H + h) * r, r);
		if (need > m->rc.n)
			return kvt_fail(m, -ENOSPC,
					"recall: %llu blocks needed at once, the cache holds %u",
					(unsigned long long)need, m->rc.n);
	}
	if (kvt_reserve((void **)&m->xf, &m->xf_cap, (uint32_t)need, sizeof(*m->xf)) ||
	    kvt_spill_want_reserve(m, (uint32_t)need))
		return kvt_fail(m, -ENOMEM, "recall: no memory for the load list");
	return 0;
}

/* What pass 2 of a recall call counts. */
struct recall_tally {
	uint32_t nx; /* loads queued in m->xf */
	uint64_t lookups, hits;
};

/* Takes a frame for block b of (s, layer, head h) holding nv tokens, and links it into s's
   list of entries and the block's slot. KVT_NO_ENTRY when every frame is pinned by this
   call. */
static uint32_t entry_claim(struct kvt_manager *m, struct kvt_seq *s, uint32_t layer, uint32_t h,
			    uint32_t b, uint32_t nv, struct kvt_rc_slot *slot)
{
	struct kvt_recall_cache *rc = &m->rc;
	uint32_t id = take_frame(m);
	struct kvt_rc_entry *e;

	if (id == KVT_NO_ENTRY)
		return id;
	e = &rc->e[id];
	*e = (struct kvt_rc_entry){
		.owner = s,
		.layer = layer,
		.head = h,
		.block = b,
		.n_valid = nv,
		.gen = e->gen,
		.s_prev = KVT_NO_ENTRY,
		.s_next = s->rc_head,
	};
	if (s->rc_head != KVT_NO_ENTRY)
		rc->e[s->rc_head].s_prev = id;
	s->rc_head = id;
	slot->entry = id;
	return id;
}

/* Pass 2 for one list, the selection hs[0..r) of (s, layer, head h): hits, misses (their
   loads queued in m->xf), LRU order, the working set, and the head's view. Nothing fails.
   Returns whether it queued a load. */
static bool recall_list(struct kvt_manager *m, struct kvt_seq *s, uint32_t layer, uint32_t h,
			const uint32_t *hs, uint32_t r, struct recall_tally *t)
{
	struct kvt_recall_cache *rc = &m->rc;
	struct kvt_seq_layer *ly = &s->layers[layer];
	struct kvt_recall_layer *lrc = ly->rc;
	uint32_t H = m->cfg.n_kv_heads, bt = m->cfg.block_tokens, N = ly->n_tokens;
	uint32_t *vent = lrc->view_ent + (size_t)h * lrc->view_cap;
	uint32_t *vgen = lrc->view_gen + (size_t)h * lrc->view_cap;
	uint32_t nv_out = 0;
	bool loaded = false;

	if (NEVER(r > lrc->view_cap)) /* recall_validate made room for the view */
		return false;
	for (uint32_t j = 0; j < r; j++) {
		uint32_t b = hs[j], nv, id;
		struct kvt_rc_slot *slot;
		bool load;

		if (b == KVT_NO_ENTRY)
			continue;
		nv = N - (b << m->lbt) < bt ? N - (b << m->lbt) : bt;
		/* Blocks whose every token is resident need no frame. */
		if (fully_resident(m, ly, h, b, nv))
			continue;
		slot = &lrc->slot[(size_t)b * H + h];
		id = slot->entry;
		if (id != KVT_NO_ENTRY && rc->e[id].pin == rc->call)
			continue; /* repeated in this list */
		t->lookups++;
		if (id == KVT_NO_ENTRY) {
			id = entry_claim(m, s, layer, h, b, nv, slot);
			/* recall_room counted every block this call pins: one is free or unpinned
			 */
			if (NEVER(id == KVT_NO_ENTRY))
				continue;
			load = true;
		} else {
			load = rc->e[id].n_valid != nv; /* the block grew since: reload it */
			rc->e[id].n_valid = nv;
			t->hits += !load;
		}
		if (load) {
			/* A spilled block is read back after this pass (src 0 until then); the
			   others stay pinned in the host tier until the load is queued.
			   recall_room reserved the list. */
			ALWAYS(kvt_spill_want(m, s, layer, b) == 0);
			m->xf[t->nx++] = (struct kvt_xfer){
				.src = ly->groups[b] & KVT_SPILLED
					       ? 0
					       : kvt_host_row(m, ly, h, b << m->lbt),
				.dst = rc->base + (uint64_t)id * m->block_bytes,
				.bytes = (uint32_t)m->block_bytes,
				.reps = 1,
			};
			loaded = true;
		}
		rc->e[id].pin = rc->call;
		lru_touch(rc, id);
		vent[nv_out] = id;
		vgen[nv_out++] = rc->e[id].gen;
		ws_touch(m, s, &slot->touched, N);
	}
	lrc->view_n[h] = nv_out;
	lrc->view_failed = false;
	return loaded;
}

/* After the gather of a recall call failed: the frames meant for its misses hold nothing
   valid, so they are freed, and the views of the call read as stale (the previous ones were
   overwritten), so no attention silently runs without its recalled blocks. The cache keeps
   its hits; frames taken from other sequences stay taken, as any recall may take them; the
   working sets keep the call's blocks (an estimate, erring high). */
static void recall_undo(struct kvt_manager *m, uint32_t layer, uint32_t n, uint32_t nx)
{
	for (uint32_t x = 0; x < nx; x++)
		entry_free(m, (uint32_t)((m->xf[x].dst - m->rc.base) / m->block_bytes));
	for (uint32_t i = 0; i < n; i++)
		m->batch[i]->layers[layer].rc->view_failed = true;
}

/* Reads back the spilled blocks that pass 2 listed (kvt_spill_want) and points the loads of
   m->xf[0..nx) that wait for them (src 0) at their host rows. 0 or the error, recorded. */
static int recall_fetch(struct kvt_manager *m, uint32_t nx)
{
	int err = kvt_spill_fetch_wanted(m, "recall");

	if (err <= 0) /* nothing was on disk, or the error */
		return err;
	for (uint32_t x = 0; x < nx; x++) {
		const struct kvt_rc_entry *e;

		if (m->xf[x].src)
			continue;
		e = &m->rc.e[(m->xf[x].dst - m->rc.base) / m->block_bytes];
		m->xf[x].src =
			kvt_host_row(m, &e->owner->layers[e->layer], e->head, e->block << m->lbt);
	}
	return 0;
}

static int recall_core(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
		       const uint32_t *sel, uint32_t r, void *stream)
{
	struct kvt_recall_cache *rc = &m->rc;
	struct recall_tally t = {0};
	uint32_t H = m->cfg.n_kv_heads;
	uint64_t need = 0, wait = 0;
	int err;

	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "recall: layer %u out of range (%u layers)", layer,
				m->cfg.n_layers);
	if (rc->n == 0)
		return kvt_fail(m, -EINVAL, "recall: no recall cache (config.recall_cache_bytes)");
	err = recall_validate(m, layer, seqs, n, sel, r, &need);
	if (!err)
		err = recall_room(m, layer, sel, n, r, need);
	if (err)
		return err;

	/* Pass 2: hits, misses, LRU order, views. Nothing below fails except the gather. */
	rc->call++;
	prefetch_list(m, layer, sel, n, r, 0, false);
	prefetch_list(m, layer, sel, n, r, 1, false);
	prefetch_list(m, layer, sel, n, r, 0, true);
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = m->batch[i];
		bool loaded = false;

		for (uint32_t h = 0; h < H; h++) {
			prefetch_list(m, layer, sel, n, r, (uint64_t)i * H + h + 2, false);
			prefetch_list(m, layer, sel, n, r, (uint64_t)i * H + h + 1, true);
			loaded |= recall_list(m, s, layer, h, sel + ((size_t)i * H + h) * r, r, &t);
		}
		if (loaded && s->save_ticket > wait)
			wait = s->save_ticket;
	}

	/* Spilled blocks come back (one read), and the blocks must have landed in the host
	   history before the device reads them. */
	err = recall_fetch(m, t.nx);
	if (err) {
		recall_undo(m, layer, n, t.nx);
		return err;
	}
	err = wait ? m->ops->save_wait(m->be, wait) : 0;
	if (!err && t.nx)
		err = kvt_dev_gather(m, t.nx, stream);
	if (err) {
		recall_undo(m, layer, n, t.nx);
		return kvt_fail(m, err, "recall: layer %u: loading %u blocks: %s", layer, t.nx,
				m->be->err);
	}

	m->st.recall_calls++;
	m->st.recall_lookups += t.lookups;
	m->st.recall_hits += t.hits;
	m->st.recall_loads += t.nx;
	m->st.bytes_h2d += (uint64_t)t.nx * m->block_bytes;
	return 0;
}

KVT_API int kvt_recall_blocks(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const uint32_t *blocks, uint32_t r, void *stream)
{
	if (!m)
		return -EINVAL;
	if (!seqs || !blocks || n == 0 || r == 0)
		return kvt_fail(m, -EINVAL, "recall: %s",
				!seqs || !blocks ? "NULL pointer"
				: n == 0	 ? "empty batch"
						 : "r == 0");
	if ((uint64_t)n * m->cfg.n_kv_heads * r > UINT32_MAX)
		return kvt_fail(m, -EINVAL, "recall: selection of %u x %u x %u is too large", n,
				m->cfg.n_kv_heads, r);
	return recall_core(m, layer, seqs, n, blocks, r, stream);
}

/* Quest scoring of one (sequence, layer): the top-r blocks per kv head, among blocks not fully
   resident, into sel[h][r] (KVT_NO_ENTRY where fewer exist). q: the sequence's
   [n_q_heads][head_dim] queries. */
static int score_seq(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly,
		     const uint8_t *q, uint32_t r, uint32_t *sel)
{
	const struct kvt_config *c = &m->cfg;
	uint32_t H = c->n_kv_heads, G = m->group_q, D = c->head_dim, bt = c->block_tokens;
	uint32_t N = ly->n_tokens, nb = DIV_UP(N, bt);
	float *qf;

	if (kvt_reserve((void **)&m->score, &m->score_cap, nb, sizeof(*m->score)) ||
	    kvt_reserve((void **)&m->cand, &m->cand_cap, nb + r, sizeof(*m->cand)) ||
	    kvt_reserve((void **)&m->qf, &m->qf_cap, (G + 2) * D, sizeof(*m->qf)))
		return -ENOMEM;
	qf = m->qf;
	if (!ly->rc->tk_ready)
		tk_count(m, s, ly);
	for (uint32_t h = 0; h < H; h++) {
		uint32_t nc = 0, k;

		kvt_to_f32(c->dtype, q + (size_t)h * G * m->row_bytes, qf, (size_t)G * D);
		for (uint32_t b = 0; b < nb; b++) {
			uint32_t nv = N - b * bt < bt ? N - b * bt : bt;

			if (fully_resident(m, ly, h, b, nv))
				continue;
			m->score[nc] = kvt_meta_bound(
				c->dtype, D, ly->rc->meta + ((size_t)b * H + h) * m->meta_bytes, qf,
				G, qf + (size_t)G * D);
			m->cand[nc++] = b;
		}
		k = kvt_topr(m->score, m->cand, nc, r, sel + (size_t)h * r, m->cand + nb);
		for (; k < r; k++)
			sel[(size_t)h * r + k] = KVT_NO_ENTRY;
	}
	return 0;
}

/* The sequence id of a recall call when it can be scored for layer (recall_core reports the
   others), else NULL. */
static struct kvt_seq *scorable(struct kvt_manager *m, uint64_t id, uint32_t layer)
{
	struct kvt_seq *s = kvt_seqmap_get(&m->seqs, id);
	const struct kvt_seq_layer *ly = s ? &s->layers[layer] : NULL;

	return !s || s->lost || !ly->n_tokens || s->preempted || !ly->rc || !ly->rc->meta ? NULL
											  : s;
}

/* Brings back the spilled host blocks that kvt_meta_catch_up of the batch will read, in one
   read (pinned for this call). 0 or the error, recorded. */
static int catch_up_fetch(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n)
{
	int err;

	if (!m->disk)
		return 0;
	++m->stamp;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = scorable(m, seqs[i], layer);
		struct kvt_seq_layer *ly = s ? &s->layers[layer] : NULL;

		if (s && ly->rc->meta_n < ly->n_tokens)
			kvt_spill_want_range(m, s, layer, ly->rc->meta_n, ly->n_tokens);
	}
	err = kvt_spill_fetch_wanted(m, "recall");
	return err < 0 ? err : 0;
}

KVT_API int kvt_decode_recall(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const void *q, void *stream)
{
	uint32_t H, r;
	uint64_t qstride;
	int err;

	if (!m)
		return -EINVAL;
	H = m->cfg.n_kv_heads;
	r = m->cfg.recall_blocks;
	if (!seqs || !q || n == 0)
		return kvt_fail(m, -EINVAL, "recall: %s", n == 0 ? "empty batch" : "NULL pointer");
	if (r == 0)
		return kvt_fail(m, -EINVAL, "recall: disabled (config.recall_blocks == 0)");
	if (!m->keep_meta)
		return kvt_fail(m, -ENOTSUP, "recall: backend %s keeps no block metadata",
				m->ops->name);
	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "recall: layer %u out of range (%u layers)", layer,
				m->cfg.n_layers);
	if ((uint64_t)n * H * r > UINT32_MAX ||
	    kvt_reserve((void **)&m->sel, &m->sel_cap, n * H * r, sizeof(*m->sel)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for the selection of %u sequences",
				n);
	qstride = (uint64_t)m->cfg.n_q_heads * m->row_bytes;
	if (!m->cpu_device) { /* the scoring runs on the CPU: the queries come over first */
		err = kvt_host_copy(m, q, n * qstride, stream);
		if (err)
			return kvt_fail(m, err, "recall: queries: %s", m->be->err);
		q = m->hcopy;
	}
	/* Metadata not folded in yet is built from the host history: its spilled blocks come
	   back first, all in one read. */
	err = catch_up_fetch(m, layer, seqs, n);
	if (err)
		return err;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = scorable(m, seqs[i], layer);
		struct kvt_seq_layer *ly = s ? &s->layers[layer] : NULL;

		/* recall_core reports every invalid sequence; score only valid ones. */
		if (!s) {
			for (size_t j = 0; j < (size_t)H * r; j++)
				m->sel[(size_t)i * H * r + j] = KVT_NO_ENTRY;
			continue;
		}
		err = kvt_meta_catch_up(m, s, ly);
		if (err)
			return err;
		if (score_seq(m, s, ly, (const uint8_t *)q + i * qstride, r,
			      m->sel + (size_t)i * H * r))
			return kvt_fail(m, -ENOMEM, "recall: no memory for scoring");
	}
	return recall_core(m, layer, seqs, n, m->sel, r, stream);
}

KVT_API int kvt_seq_recall_view(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				uint32_t kv_head, struct kvt_recall_ref *out, uint32_t cap,
				uint32_t *n_out)
{
	const struct kvt_recall_layer *lrc;
	const struct kvt_seq_layer *ly;
	struct kvt_seq *s;
	uint32_t cnt;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!n_out || (cap && !out))
		return kvt_fail(m, -EINVAL, "recall view: NULL pointer");
	if (layer >= m->cfg.n_layers || kv_head >= m->cfg.n_kv_heads)
		return kvt_fail(m, -EINVAL, "recall view: %s out of range",
				layer >= m->cfg.n_layers ? "layer" : "kv head");
	s = kvt_seq_usable(m, seq, "recall view", &err);
	if (!s)
		return err;
	ly = &s->layers[layer];
	if (!ly->n_tokens || s->preempted)
		return kvt_fail(m, -EINVAL, "recall view: sequence %llu: %s",
				(unsigned long long)seq,
				s->preempted ? "preempted" : "layer not prefilled");
	lrc = ly->rc;
	cnt = lrc && lrc->view_n ? lrc->view_n[kv_head] : 0;
	*n_out = cnt;
	if (kvt_view_stale(m, lrc, kv_head))
		return kvt_fail(m, -ESTALE,
				"recall view: sequence %llu layer %u: a recalled block was evicted "
				"since (recall again)",
				(unsigned long long)seq, layer);
	if (cap < cnt)
		return kvt_fail(m, -ENOSPC, "recall view: %u needed, room for %u", cnt, cap);
	for (uint32_t i = 0; i < cnt; i++) {
		uint32_t id = lrc->view_ent[(size_t)kv_head * lrc->view_cap + i];
		const struct kvt_rc_entry *e = &m->rc.e[id];
		struct kvt_recall_ref ref = {
			.frame = m->rc.base + (uint64_t)id * m->block_bytes,
			.block = e->block,
			.n_valid = e->n_valid,
			.resident = kvt_block_resident(m, s, ly, kv_head, e->block, e->n_valid),
		};
		uint32_t j = i;

		while (j > 0 && out[j - 1].block > ref.block) {
			out[j] = out[j - 1];
			j--;
		}
		out[j] = ref;
	}
	return 0;
}
