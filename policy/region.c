/* SPDX-License-Identifier: MIT */
/*
 * Recall regions (region.h): the CPU reference of one recall call on one (sequence, layer)'s
 * private cache. Everything a call touches lies in the region's own tables (its key table is
 * about 8 bytes a block and head, its slots 16 bytes each), so a call costs O(lookups) with no
 * structure shared between sequences; the order list makes each victim O(1).
 */
#include <errno.h>
#include <stddef.h>

#include "region.h"

#define END KVT_REGION_PENDING

/* ---- working set ---- */

void kvt_ws_advance(struct kvt_ws *ws, uint32_t t)
{
	uint32_t d, at;

	if (!ws->bucket || !ws->w || t <= ws->step)
		return;
	d = t - ws->step < ws->w ? t - ws->step : ws->w;
	at = ws->cur;
	for (uint32_t i = 1; i <= d; i++) {
		at = at + 1 == ws->w ? 0 : at + 1;
		ws->total -= ws->bucket[at]; /* total is the buckets' sum */
		ws->bucket[at] = 0;
	}
	ws->cur = (uint32_t)((ws->cur + (uint64_t)(t - ws->step)) % ws->w);
	ws->step = t;
}

/* Step x is inside the window ending at ws->step. */
static inline bool in_window(const struct kvt_ws *ws, uint32_t x)
{
	return x <= ws->step && ws->step - x < ws->w;
}

/* Bucket of step x inside the window: cur is step's, so no division. */
static inline uint32_t bucket_of(const struct kvt_ws *ws, uint32_t x)
{
	uint32_t d = ws->step - x;

	return ws->cur >= d ? ws->cur - d : ws->cur + ws->w - d;
}

/* kvt_ws_touch of a working set that is kept (buckets and a window), inlined in the recall
   loop: after its first lookup the window is at t already, so the move costs one test. */
static inline void ws_touch(struct kvt_ws *ws, uint32_t *touched, uint32_t t)
{
	if (t > ws->step)
		kvt_ws_advance(ws, t);
	if (*touched) {
		uint32_t p = *touched - 1;

		if (p >= t)
			return; /* already counted at this step or a later one */
		if (in_window(ws, p)) {
			/* the block was counted in the bucket of step p */
			ws->bucket[bucket_of(ws, p)]--;
			ws->total--;
		}
	}
	*touched = t + 1;
	if (in_window(ws, t)) {
		ws->bucket[bucket_of(ws, t)]++;
		ws->total++;
	}
}

/* A working set's window as one call's loop holds it: at step t, bucket[cur] that step's. */
struct ws_now {
	uint32_t *bucket;
	uint32_t w, cur, t;
	uint32_t add;  /* lookups counted at t (bucket[cur] takes them when the call ends) */
	int32_t total; /* change of the total (likewise) */
};

/* ws_touch when the window ends at the call's step (ws->step == t, w >= 1): the step's own
   bucket and the total change only by what the call gathers in n (a decrement never falls in
   the step's bucket: it is a step before t, less than w steps back). */
static inline void ws_touch_now(struct ws_now *n, uint32_t *touched)
{
	uint32_t x = *touched;

	if (x) {
		uint32_t d = n->t - (x - 1); /* steps since its latest lookup */

		if (x - 1 >= n->t)
			return; /* already counted at this step or a later one */
		if (d < n->w) {
			n->bucket[n->cur >= d ? n->cur - d : n->cur + n->w - d]--;
			n->total--;
		}
	}
	*touched = n->t + 1;
	n->add++;
	n->total++;
}

void kvt_ws_touch(struct kvt_ws *ws, uint32_t *touched, uint32_t t)
{
	if (!ws->bucket || !ws->w)
		return; /* no working set kept */
	ws_touch(ws, touched, t);
}

/* ---- the order list: slots in ascending (stamp, rank) ---- */

static inline void unlink_slot(struct kvt_region *rg, uint16_t i)
{
	struct kvt_region_link l = rg->link[i];
	uint16_t p = l.prev, n = l.next;

	if (p != END)
		rg->link[p].next = n;
	else
		rg->head = n;
	if (n != END)
		rg->link[n].prev = p;
	else
		rg->tail = p;
}

static inline void append_slot(struct kvt_region *rg, uint16_t i)
{
	rg->link[i] = (struct kvt_region_link){rg->tail, END};
	if (rg->tail != END)
		rg->link[rg->tail].next = i;
	else
		rg->head = i;
	rg->tail = i;
}

/* Links slot i between p and n (END: the list's ends). */
static inline void link_between(struct kvt_region *rg, uint16_t i, uint16_t p, uint16_t n)
{
	rg->link[i] = (struct kvt_region_link){p, n};
	if (p != END)
		rg->link[p].next = i;
	else
		rg->head = i;
	if (n != END)
		rg->link[n].prev = i;
	else
		rg->tail = i;
}

/* Puts empty slot i among the empty slots at the front, in index order. */
static void insert_empty(struct kvt_region *rg, uint16_t i)
{
	uint16_t at = rg->head, before = END;

	while (at != END && rg->slot[at].stamp == 0 && at < i) {
		before = at;
		at = rg->link[at].next;
	}
	link_between(rg, i, before, at);
}

/* After insert_empty(rg, i): the hint of the last empty slot, when i is now that one. */
static void note_empty(struct kvt_region *rg, uint16_t i)
{
	uint16_t n = rg->link[i].next;

	if (n == END || rg->slot[n].stamp != 0)
		rg->empty_end = (uint16_t)(i + 1);
}

/* The last empty slot of the order list (END: none), from the hint or by a walk over the
   empty ones. */
static uint16_t last_empty(const struct kvt_region *rg)
{
	uint16_t at, before = END;

	if (rg->empty_end == END)
		return END;
	if (rg->empty_end)
		return (uint16_t)(rg->empty_end - 1);
	for (at = rg->head; at != END && rg->slot[at].stamp == 0; at = rg->link[at].next)
		before = at;
	return before;
}

/* Forgets slot i's key and makes it empty (still linked where it was). */
static bool forget(struct kvt_region *rg, uint32_t i)
{
	struct kvt_region_slot *s = &rg->slot[i];
	bool had = s->key != KVT_REGION_NONE;

	if (had)
		rg->key[s->key].slot = 0;
	*s = (struct kvt_region_slot){.key = KVT_REGION_NONE, .rank = i};
	return had;
}

uint32_t kvt_region_empty(struct kvt_region *rg, uint32_t i)
{
	bool had;

	if (i >= rg->n_slots)
		return 0;
	unlink_slot(rg, (uint16_t)i);
	had = forget(rg, i);
	insert_empty(rg, (uint16_t)i);
	note_empty(rg, (uint16_t)i);
	return had;
}

void kvt_region_grow(struct kvt_region *rg, uint32_t n)
{
	uint16_t at, before = END;

	if (n > KVT_REGION_MAX_SLOTS)
		n = KVT_REGION_MAX_SLOTS;
	if (rg->n_slots == 0) { /* a zeroed region: an empty list */
		rg->head = rg->tail = END;
		rg->empty_end = END;
	}
	if (n <= rg->n_slots)
		return;
	/* The new slots have the highest indices: they go after every empty slot, in order. */
	before = last_empty(rg);
	at = before != END ? rg->link[before].next : rg->head;
	for (uint32_t i = rg->n_slots; i < n; i++) {
		/* new memory: nothing to forget */
		rg->slot[i] = (struct kvt_region_slot){.key = KVT_REGION_NONE, .rank = i};
		rg->link[i].prev = before;
		if (before != END)
			rg->link[before].next = (uint16_t)i;
		else
			rg->head = (uint16_t)i;
		before = (uint16_t)i;
	}
	rg->link[before].next = at;
	if (at != END)
		rg->link[at].prev = before;
	else
		rg->tail = before;
	rg->n_slots = n;
	rg->empty_end = (uint16_t)n; /* 1 + the last new slot */
}

uint32_t kvt_region_clear(struct kvt_region *rg)
{
	uint32_t gone = 0;

	for (uint32_t i = 0; i < rg->n_slots; i++)
		gone += forget(rg, i);
	rg->n_slots = 0;
	rg->head = rg->tail = END;
	rg->empty_end = END;
	return gone;
}

uint32_t kvt_region_drop(struct kvt_region *rg, uint32_t *frame, uint32_t *dropped, uint32_t *freed)
{
	uint16_t i = rg->head, j;
	bool had;

	if (rg->n_slots == 0 || i == END) { /* nothing to drop */
		*dropped = *freed = KVT_REGION_NONE;
		return 0;
	}
	*dropped = i;
	*freed = frame ? frame[i] : i;
	unlink_slot(rg, i);
	had = forget(rg, i);
	if (rg->empty_end == i + 1) /* the head was the last empty slot: none is left */
		rg->empty_end = END;
	j = (uint16_t)(--rg->n_slots);
	if (j != i) { /* the last slot moves into i, keeping its place in the order */
		struct kvt_region_slot s = rg->slot[j];
		uint16_t p = rg->link[j].prev, n = rg->link[j].next;

		rg->slot[i] = s;
		if (frame)
			frame[i] = frame[j];
		if (s.key != KVT_REGION_NONE) {
			rg->key[s.key].slot = (uint16_t)(i + 1);
			link_between(rg, i, p, n);
		} else { /* an empty slot's rank is its index: it moves among the empty ones */
			unlink_slot(rg, j);
			rg->slot[i].rank = i;
			if (rg->empty_end == j + 1)
				rg->empty_end = 0; /* unknown, unless i is the last now */
			insert_empty(rg, i);
			note_empty(rg, i);
		}
	}
	if (rg->n_slots == 0) {
		rg->head = rg->tail = END;
		rg->empty_end = END;
	}
	return had;
}

/* ---- one call ---- */

/* A prefetch for writing that the compiler keeps: GCC finds a function whose only effect is
   __builtin_prefetch const and deletes every call of it; the empty volatile asm is an effect
   it must keep. */
static inline void prefetch_w(const void *p)
{
	__builtin_prefetch(p, 1);
	__asm__ volatile("");
}

/* Head h's part of kvt_region_prefetch. */
static inline void prefetch_head(const struct kvt_region *rg, uint32_t n_heads, uint32_t h,
				 const uint32_t *hs, uint32_t r, bool keys)
{
	const struct kvt_region_key *key = rg->key;
	const uint32_t cap = rg->cap_blocks;

	for (uint32_t j = 0; j < r; j++) {
		uint32_t b = hs[j];
		const struct kvt_region_key *ke;

		if (b >= cap) /* KVT_REGION_NONE too */
			continue;
		ke = &key[(size_t)b * n_heads + h];
		if (keys)
			prefetch_w(ke);
		else if (ke->slot && ke->slot <= rg->n_slots) {
			/* the slot, and its place in the order list, which step 3 moves */
			prefetch_w(&rg->slot[ke->slot - 1u]);
			prefetch_w(&rg->link[ke->slot - 1u]);
		}
	}
}

/* Whether a call of n_heads * r lookups on rg reads most of its slots: the order list and
   the slots are then fetched whole, in order, rather than slot by slot through the key
   entries (whose reads stall until those entries arrive). */
static inline bool slots_whole(const struct kvt_region *rg, uint32_t n_heads, uint32_t r)
{
	return rg->n_slots <= 2u * n_heads * r;
}

/* Part h of n_heads of a whole fetch of rg's slots and order list. */
static inline void prefetch_slots_part(const struct kvt_region *rg, uint32_t n_heads, uint32_t h)
{
	size_t sb = (size_t)rg->n_slots * sizeof(*rg->slot),
	       lb = (size_t)rg->n_slots * sizeof(*rg->link);
	const char *sp = (const char *)rg->slot, *lp = (const char *)rg->link;

	for (size_t o = sb * h / n_heads / 64 * 64; o < sb * (h + 1) / n_heads; o += 64)
		prefetch_w(sp + o);
	for (size_t o = lb * h / n_heads / 64 * 64; o < lb * (h + 1) / n_heads; o += 64)
		prefetch_w(lp + o);
}

/* Head h's part of the slot fetch for a call of sel on rg. */
static inline void prefetch_slots(const struct kvt_region *rg, uint32_t n_heads, uint32_t h,
				  const uint32_t *hs, uint32_t r)
{
	if (slots_whole(rg, n_heads, r))
		prefetch_slots_part(rg, n_heads, h);
	else
		prefetch_head(rg, n_heads, h, hs, r, false);
}

void kvt_region_prefetch(const struct kvt_region *rg, uint32_t n_heads, const uint32_t *sel,
			 uint32_t r, bool keys)
{
	for (uint32_t h = 0; h < n_heads; h++)
		if (keys)
			prefetch_head(rg, n_heads, h, sel + (size_t)h * r, r, true);
		else
			prefetch_slots(rg, n_heads, h, sel + (size_t)h * r, r);
}

int kvt_region_recall(struct kvt_region *rg, const struct kvt_region_geom *g, const uint32_t *sel,
		      uint32_t r, struct kvt_ws *ws, uint32_t *view, uint32_t *view_n,
		      struct kvt_region_load *load, uint32_t *n_load, struct kvt_region_tally *t)
{
	return kvt_region_recall_ahead(rg, g, sel, r, ws, view, view_n, load, n_load, t, NULL);
}

int kvt_region_recall_ahead(struct kvt_region *rg, const struct kvt_region_geom *g,
			    const uint32_t *sel, uint32_t r, struct kvt_ws *ws, uint32_t *view,
			    uint32_t *view_n, struct kvt_region_load *load, uint32_t *n_load,
			    struct kvt_region_tally *t, const struct kvt_region_ahead *ahead)
{
	const uint32_t H = g->n_heads, N = g->n_tokens, bt = 1u << g->lbt;
	uint32_t c, nl = 0, n_new = 0;
	uint16_t v;
	int err = 0;

	*n_load = 0;
	if (rg->clock == UINT32_MAX)
		return -EOVERFLOW; /* 4 billion calls on one region */
	c = ++rg->clock;
	if (ws && (!ws->bucket || !ws->w))
		ws = NULL; /* no working set kept: kvt_ws_touch would do nothing */

	/* 1. Lookups: hits and reloads keep their slots; misses are listed (their keys marked
	   pending, so a repeat is seen) and get slots in step 2. The loop keeps its tables and
	   counts in locals (the stores through slots and keys would otherwise make the compiler
	   reload them every lookup). Blocks [mid_lo, mid_hi) are whole and overlap neither the
	   sink nor the ring: resident exactly when all their tokens are top-K ones. */
	struct kvt_region_key *const key = rg->key;
	struct kvt_region_slot *const slot = rg->slot;
	const uint32_t mid_lo = (g->sink + bt - 1) >> g->lbt,
		       mid_hi = (g->ring0 >> g->lbt) < (N >> g->lbt) ? g->ring0 >> g->lbt
								     : N >> g->lbt;
	const uint32_t mid_n = mid_hi > mid_lo ? mid_hi - mid_lo : 0;
	uint32_t n_look = 0, n_hit = 0, n_reload = 0;
	struct ws_now wn = {0};
	bool ws_at = false; /* the window is at N: ws_touch_now applies */

	for (uint32_t h = 0; h < H; h++) {
		const uint32_t *hs = sel + (size_t)h * r;
		uint32_t *hv = view + (size_t)h * r, vn = 0;

		/* the memory of the calls ahead comes in while this head's lookups run */
		if (ahead && ahead->keys)
			prefetch_head(ahead->keys, H, h, ahead->keys_sel + (size_t)h * r, r, true);
		if (ahead && ahead->slots)
			prefetch_slots(ahead->slots, H, h, ahead->slots_sel + (size_t)h * r, r);

		for (uint32_t j = 0; j < r; j++) {
			uint32_t b = hs[j], nv, k;
			struct kvt_region_key *ke;

			if (b == KVT_REGION_NONE)
				continue;
			k = b * H + h;
			ke = &key[k];
			if (b - mid_lo < mid_n) { /* mid_lo <= b < mid_hi */
				nv = bt;
				if (ke->tk == bt)
					continue;
			} else {
				nv = N - (b << g->lbt) < bt ? N - (b << g->lbt) : bt;
				if (kvt_region_resident(rg, g, h, b, nv))
					continue;
			}
			if (ke->slot == KVT_REGION_PENDING)
				continue; /* a repeated miss */
			if (ke->slot) {
				uint32_t i = ke->slot - 1u;
				struct kvt_region_slot *sl = &slot[i];

				if (sl->stamp == c)
					continue; /* a repeated hit */
				sl->stamp = c;
				sl->rank = h * r + j;
				if (sl->n_valid != nv) { /* the block grew since: reload it */
					load[nl++] = (struct kvt_region_load){i, k, k, nv};
					sl->n_valid = nv;
					n_reload++;
				} else {
					n_hit++;
				}
				hv[vn++] = i;
			} else {
				ke->slot = KVT_REGION_PENDING;
				load[nl] =
					(struct kvt_region_load){KVT_REGION_NONE, k, h * r + j, nv};
				hv[vn++] = KVT_REGION_VIEW_MISS | nl++;
				n_new++;
			}
			n_look++;
			if (!ws)
				continue;
			if (!wn.bucket) { /* the call's first lookup moves the window */
				if (N > ws->step)
					kvt_ws_advance(ws, N);
				ws_at = ws->step == N;
				wn = (struct ws_now){ws->bucket, ws->w, ws->cur, N, 0, 0};
			}
			if (ws_at)
				ws_touch_now(&wn, &ke->touched);
			else
				ws_touch(ws, &ke->touched, N);
		}
		view_n[h] = vn;
	}
	if (ws_at) {
		ws->bucket[ws->cur] += wn.add;
		ws->total += (uint32_t)wn.total;
	}
	t->lookups += n_look;
	t->hits += n_hit;
	t->loads += n_reload;

	/* 2. Victims in ascending (stamp, rank), skipping the slots this call used (their
	   stamp is c, so they sort last: the walk passes at most the call's hits). Every slot
	   not used by this call is a candidate, so the misses fit when n_new <= n_slots -
	   used. */
	if (n_new > rg->n_slots - (nl - n_new) - n_hit) {
		/* The caller's sizing contract is broken: the misses are dropped (their
		   pending marks undone, gone from the views), the rest of the call stands. */
		uint32_t kept = 0;

		for (uint32_t x = 0; x < nl; x++)
			if (load[x].slot == KVT_REGION_NONE)
				rg->key[load[x].key].slot = 0;
			else
				load[kept++] = load[x];
		for (uint32_t h = 0; h < H; h++) {
			uint32_t *hv = view + (size_t)h * r, vn = 0;

			for (uint32_t i = 0; i < view_n[h]; i++)
				if (!(hv[i] & KVT_REGION_VIEW_MISS))
					hv[vn++] = hv[i];
			view_n[h] = vn;
		}
		t->lookups -= n_new;
		nl = kept;
		err = -ENOSPC;
	}
	v = rg->head;
	for (uint32_t x = 0; !err && x < nl; x++) {
		struct kvt_region_load *ld = &load[x];
		struct kvt_region_slot *s;
		uint32_t rank;

		if (ld->slot != KVT_REGION_NONE)
			continue;	       /* a reload */
		while (rg->slot[v].stamp == c) /* the count above: v never runs off the end */
			v = rg->link[v].next;
		s = &rg->slot[v];
		if (rg->empty_end == v + 1u) /* the empty slots lead: this was the last one */
			rg->empty_end = END;
		rank = ld->old;
		ld->old = s->key;
		if (s->key != KVT_REGION_NONE) {
			rg->key[s->key].slot = 0;
			t->evictions++;
		}
		*s = (struct kvt_region_slot){ld->key, ld->n_valid, c, rank};
		rg->key[ld->key].slot = (uint16_t)(v + 1);
		ld->slot = v;
		v = rg->link[v].next;
		t->loads++;
	}

	/* 3. Views get their slots; the slots used move to the back of the order, by rank
	   (view order is rank order). */
	for (uint32_t h = 0; h < H; h++) {
		uint32_t *hv = view + (size_t)h * r;

		for (uint32_t i = 0; i < view_n[h]; i++) {
			if (hv[i] & KVT_REGION_VIEW_MISS)
				hv[i] = load[hv[i] & ~KVT_REGION_VIEW_MISS].slot;
			unlink_slot(rg, (uint16_t)hv[i]);
			append_slot(rg, (uint16_t)hv[i]);
		}
	}
	*n_load = nl;
	return err;
}

/* ---- checks ---- */

static inline bool before(const struct kvt_region_slot *a, const struct kvt_region_slot *b)
{
	return a->stamp < b->stamp || (a->stamp == b->stamp && a->rank < b->rank);
}

int kvt_region_check(const struct kvt_region *rg, uint32_t n_heads)
{
	uint32_t seen = 0, keys = 0;
	uint16_t at = rg->head, last = END;

	if (rg->n_slots > KVT_REGION_MAX_SLOTS)
		return -1;
	for (; at != END; last = at, at = rg->link[at].next) {
		const struct kvt_region_slot *s;

		if (at >= rg->n_slots || ++seen > rg->n_slots || rg->link[at].prev != last)
			return -2;
		s = &rg->slot[at];
		if (last != END && !before(&rg->slot[last], s))
			return -3; /* out of (stamp, rank) order */
		if (s->stamp > rg->clock)
			return -4;
		if (s->stamp == 0 && (s->key != KVT_REGION_NONE || s->rank != at))
			return -5;
		if (s->key != KVT_REGION_NONE) {
			if (s->key / n_heads >= rg->cap_blocks || rg->key[s->key].slot != at + 1)
				return -6;
			keys++;
		}
	}
	if (seen != rg->n_slots || rg->tail != last)
		return -7;
	if (rg->empty_end && rg->n_slots && rg->empty_end != END) {
		uint16_t e = (uint16_t)(rg->empty_end - 1), n;

		if (e >= rg->n_slots || rg->slot[e].stamp != 0)
			return -10; /* the hint names no empty slot */
		n = rg->link[e].next;
		if (n != END && rg->slot[n].stamp == 0)
			return -10; /* an empty slot follows the one it names */
	} else if (rg->empty_end == END && rg->n_slots && rg->slot[rg->head].stamp == 0) {
		return -10; /* an empty slot where it says there is none */
	}
	for (uint64_t k = 0; k < (uint64_t)rg->cap_blocks * n_heads; k++) {
		uint16_t sl = rg->key[k].slot;

		if (sl &&
		    (sl == KVT_REGION_PENDING || sl > rg->n_slots || rg->slot[sl - 1].key != k))
			return -8;
		keys -= sl != 0;
	}
	return keys ? -9 : 0;
}
