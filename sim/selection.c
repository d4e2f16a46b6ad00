/* SPDX-License-Identifier: MIT */
/* Decode selection model (selection.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "simutil.h"
#include "selection.h"

/* Whether a draw of probability p succeeds: uniform in [0, 1) from the top 53 bits of the
   generator, m * 2^-53 < p, compared as integers (exactly the same test: m < ceil(p * 2^53),
   thr from threshold()). */
static bool draw(uint64_t *s, uint64_t thr)
{
	return (sim_splitmix64(s) >> 11) < thr;
}

/* draw()'s threshold for probability p, ceil(p * 2^53): 0 (never) for p <= 0 or NaN, 2^53
   (always) from 1. */
static uint64_t threshold(double p)
{
	double x = p * 0x1p53; /* exact: a power of two times p */
	uint64_t t;

	if (!(p > 0))
		return 0;
	if (p >= 1)
		return (uint64_t)1 << 53;
	t = (uint64_t)x; /* x < 2^53: truncated to floor(x) */
	return (double)t < x ? t + 1 : t;
}

static uint32_t below(uint64_t *s, uint32_t n)
{
	return (uint32_t)(((sim_splitmix64(s) >> 32) * n) >> 32);
}

/* i + 1 in a ring of cap entries. */
static uint32_t ring_next(uint32_t i, uint32_t cap)
{
	return i + 1 == cap ? 0 : i + 1;
}

/* Entry head + k of a ring of cap entries, k < cap. */
static uint32_t ring_at(uint32_t head, uint32_t k, uint32_t cap)
{
	uint32_t i = head + k;

	return i >= cap ? i - cap : i;
}

int sim_sel_check(const struct sim_sel_params *p)
{
	if (!p || p->r == 0 || p->r > 1024 || p->window == 0 || p->window > 64 ||
	    !(p->p_keep >= 0 && p->p_keep <= 1) || !(p->p_revisit >= 0 && p->p_revisit <= 1))
		return -EINVAL;
	return 0;
}

/* Bytes of one stream's arrays: its selection, padded to 8 bytes, then its ring; rounded up
   to a cache line, so that each stream of a group starts on one. */
static size_t stream_bytes(const struct sim_sel_params *p)
{
	size_t b =
		((size_t)p->r + 1) / 2 * 8 + (size_t)p->window * p->r * sizeof(struct sim_sel_drop);

	return (b + 63) / 64 * 64;
}

int sim_sel_group_init(const struct sim_sel_params *p, uint64_t first_id, uint32_t n,
		       struct sim_sel_stream *st)
{
	size_t sb = stream_bytes(p);
	char *mem;

	memset(st, 0, (size_t)n * sizeof(*st));
	if (!n)
		return 0;
	mem = aligned_alloc(64, sb * n);
	if (!mem)
		return -ENOMEM;
	for (uint32_t k = 0; k < n; k++) {
		st[k].cur = (uint32_t *)(void *)(mem + sb * k);
		st[k].drop = (struct sim_sel_drop *)(void *)(st[k].cur + (p->r + 1) / 2 * 2);
		st[k].rng = p->seed ^ ((first_id + k) * 0xd1b54a32d192ed03ull);
		sim_splitmix64(&st[k].rng);
	}
	return 0;
}

void sim_sel_group_fini(struct sim_sel_stream *st, uint32_t n)
{
	if (!n)
		return;
	free(st[0].cur);
	memset(st, 0, (size_t)n * sizeof(*st));
}

int sim_sel_stream_init(const struct sim_sel_params *p, uint64_t id, struct sim_sel_stream *st)
{
	return sim_sel_group_init(p, id, 1, st);
}

void sim_sel_stream_fini(struct sim_sel_stream *st)
{
	sim_sel_group_fini(st, 1);
}

/* Prefetches (for writing) the cache lines of [a, a + bytes), bytes > 0. */
static void prefetch_range(const void *a, size_t bytes)
{
	const char *c = a;

	for (size_t off = 0; off < bytes; off += 64)
		__builtin_prefetch(c + off, 1);
	__builtin_prefetch(c + bytes - 1, 1);
}

void sim_sel_prefetch(const struct sim_sel_params *p, const struct sim_sel_stream *st)
{
	uint32_t cap = p->window * p->r, n = st->n_drop + p->r, first;

	if (!st->cur)
		return;
	prefetch_range(st->cur, p->r * sizeof(*st->cur));
	/* the ring's live entries and the step's pushes after them, wrapping */
	n = n < cap ? n : cap;
	first = cap - st->drop_head < n ? cap - st->drop_head : n;
	prefetch_range(&st->drop[st->drop_head], first * sizeof(*st->drop));
	if (n > first)
		prefetch_range(st->drop, (n - first) * sizeof(*st->drop));
}

/* The blocks a step has picked so far, out[0..n), for the test that keeps them distinct. Up
   to PICK_SCAN blocks a step the test scans them, after a 64-bit filter of their low 6 bits
   that answers most tests without the scan; for more they are also kept in an open-addressed
   set of at least 2r slots (UINT32_MAX marks an empty one: a pick lies in [lo, hi), so it is
   never UINT32_MAX), so that a step costs O(r) rather than O(r^2). */
#define PICK_SCAN 16
#define PICK_SET_MAX 2048 /* slots for r = 1024, the most sim_sel_check allows */

struct picks {
	uint32_t *out, n;
	uint32_t bits; /* log2 of the set's slots; 0: no set */
	uint64_t seen; /* bit b % 64 of every pick b (no set) */
	uint32_t *set;
};

static uint32_t pick_slot(uint32_t b, uint32_t bits)
{
	return (b * 0x9e3779b1u) >> (32 - bits);
}

static void picks_init(struct picks *pk, uint32_t r, uint32_t *out, uint32_t *set)
{
	*pk = (struct picks){.out = out, .set = set};
	if (r <= PICK_SCAN)
		return;
	pk->bits = 1;
	while ((1u << pk->bits) < 2 * r)
		pk->bits++;
	memset(set, 0xff, sizeof(*set) << pk->bits);
}

static bool chosen(const struct picks *pk, uint32_t b)
{
	uint32_t mask = (1u << pk->bits) - 1;

	if (!pk->bits) {
		if (!((pk->seen >> (b & 63)) & 1))
			return false;
		for (uint32_t i = 0; i < pk->n; i++)
			if (pk->out[i] == b)
				return true;
		return false;
	}
	for (uint32_t i = pick_slot(b, pk->bits);; i = (i + 1) & mask) {
		if (pk->set[i] == b)
			return true;
		if (pk->set[i] == UINT32_MAX)
			return false;
	}
}

static void pick(struct picks *pk, uint32_t b)
{
	uint32_t mask = (1u << pk->bits) - 1, i;

	pk->out[pk->n++] = b;
	if (!pk->bits) {
		pk->seen |= (uint64_t)1 << (b & 63);
		return;
	}
	for (i = pick_slot(b, pk->bits); pk->set[i] != UINT32_MAX; i = (i + 1) & mask)
		;
	pk->set[i] = b;
}

/* The state of a stream while a step draws, in locals (the compiler cannot keep st's fields
   in registers: out[] might alias them). */
struct step {
	uint64_t rng;
	uint32_t head, n_drop, step, cap;
	struct sim_sel_drop *ring;
};

/* Records a dropped block (the ring keeps the latest window * r). */
static void push_drop(struct step *s, uint32_t b)
{
	if (s->n_drop == s->cap) {
		s->head = ring_next(s->head, s->cap);
		s->n_drop--;
	}
	s->ring[ring_at(s->head, s->n_drop, s->cap)] = (struct sim_sel_drop){b, s->step};
	s->n_drop++;
}

void sim_sel_next(const struct sim_sel_params *p, struct sim_sel_stream *st, uint32_t lo,
		  uint32_t hi, uint32_t *out)
{
	uint32_t span = hi > lo ? hi - lo : 0, k = span < p->r ? span : p->r;
	uint32_t n_cur = st->n_cur, set[PICK_SET_MAX];
	const uint32_t *cur = st->cur;
	uint64_t keep = threshold(p->p_keep), revisit = threshold(p->p_revisit);
	struct step s = {st->rng,      st->drop_head,	 st->n_drop,
			 st->step + 1, p->window * p->r, st->drop};
	struct picks pk;

	picks_init(&pk, p->r, out, set);
	/* forget drops older than the window */
	while (s.n_drop && s.step - s.ring[s.head].step > p->window) {
		s.head = ring_next(s.head, s.cap);
		s.n_drop--;
	}
	for (uint32_t j = 0; j < k; j++) {
		uint32_t b = UINT32_MAX;

		if (j < n_cur) {
			uint32_t prev = cur[j];

			if (prev >= lo && prev < hi && draw(&s.rng, keep) && !chosen(&pk, prev))
				b = prev;
			else
				push_drop(&s, prev);
		}
		if (b == UINT32_MAX && s.n_drop && draw(&s.rng, revisit)) {
			uint32_t d = s.ring[ring_at(s.head, below(&s.rng, s.n_drop), s.cap)].block;

			if (d >= lo && d < hi && !chosen(&pk, d) && !(j < n_cur && d == cur[j]))
				b = d;
		}
		for (int tries = 0; b == UINT32_MAX && tries < 64; tries++) {
			uint32_t c = lo + below(&s.rng, span);

			if (!chosen(&pk, c))
				b = c;
		}
		for (uint32_t c = lo; b == UINT32_MAX && c < hi; c++) /* dense corner */
			if (!chosen(&pk, c))
				b = c;
		pick(&pk, b);
	}
	for (uint32_t j = k; j < p->r; j++)
		out[j] = UINT32_MAX;
	memcpy(st->cur, out, k * sizeof(*out));
	st->n_cur = k;
	st->rng = s.rng;
	st->drop_head = s.head;
	st->n_drop = s.n_drop;
	st->step = s.step;
}
