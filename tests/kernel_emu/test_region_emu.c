/* SPDX-License-Identifier: MIT */
/*
 * region-emu: the recall-region kernels (policy/region.cu: kvt_gpu_region_recall, _grow, _drop,
 * _empty, _clear) on the CPU kernel emulator against the CPU reference (policy/region.c), after
 * every call and every other operation, byte for byte: each region's slots (all of the array,
 * past n_slots too), slot count, frame array (all of it), key table (touched, slot, and tk and
 * pad untouched), clock, tally, result, load list, views and view counts, each sequence's
 * working set (buckets, step, cur, total, w), and what grow, drop, empty and clear report.
 * Frames live on a free-frame stack kept as the manager keeps it (manager/recall.c): grows pop
 * the new slots' frames from its top (the device's by the kernel, from a copy of the stack at
 * offsets, or written by the test as a caller), drops and clears push the frames they free,
 * a clear's read back from the kernel's `freed` in index order; every frame is on the stack or
 * in one slot. A drop's stale flag is checked against region_shrink's rule over a random view
 * (none, the last slot only, a few slots, many; entries past the count), from 0 and from 1,
 * or not asked for; the view stays as it was.
 *
 * A seeded random run: sequences of 1, 2, 8 or 37 kv heads (more heads than the CTA has warps,
 * and than one warp scans at once), r from 1 to 32 (and past 32, where a head's selection spans
 * several warp passes), two layers each sharing the sequence's working set (a region per
 * (sequence, layer); a launch takes one layer of a random subset of the sequences, in random
 * order, so no working set appears twice in a launch, as gpu.h asks). Token counts grow
 * between calls (the last block grows: reloads), jump past the window, and now and then fall
 * back; sink, ring and top-K counts make blocks resident; selections repeat blocks, hold
 * KVT_REGION_NONE and favour recent blocks (hits). Between calls regions grow and drop slots in
 * batches (to random sizes, to exactly the call's distinct lookups, to one fewer: -ENOSPC, to
 * none, and drops of more slots than a region holds), slots are emptied (in batches, slots past
 * n_slots and repeats included) and regions cleared; most regions keep a frame array, which a
 * drop permutes, some none. The slots and frames past a region's count start as garbage, which
 * a grow must not read. A call now and then finds its clock at UINT32_MAX (-EOVERFLOW) or its
 * working set without buckets or window (none kept), and a working set restarts behind its
 * keys' touches. Clocks start at 0 or high (stamps with high bytes set, which the radix select
 * walks), and the emulator's build finds victims in rounds of 16, so calls take several
 * rounds. The run repeats under each of the emulator's schedules: the three that reorder the
 * warps (a missing barrier shows), and the one that runs each warp's lanes last to first (a
 * lane that depends on a lower lane's write between two warp operations, where a GPU's lanes
 * run together, sees it unwritten).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu.h"
#include "kemu_api.h"
#include "region.h"
#include "t_data.h"

#define N_SEQS 6
#define N_LAYERS 2
#define N_REGIONS (N_SEQS * N_LAYERS)
#define CAP_SLOTS 300u
#define GUARD 0x5au
#define CANARY 0xa5u

/* One copy of a region's state and one call's outputs: the reference's or the device's. */
struct side {
	struct kvt_region_slot *slot; /* [CAP_SLOTS] */
	struct kvt_region_key *key;   /* [cap_blocks * H] */
	uint32_t *frame;	      /* [CAP_SLOTS] */
	uint32_t clock, n_slots;      /* the reference's: ref.clock and ref.n_slots, copied */
	uint32_t *view, *view_n;      /* [H * r + 4], [H + 4]: the last 4 guards */
	struct kvt_region_load *load; /* [H * r + 1]: the last a guard */
	uint32_t n_load;
	int32_t err;
	struct kvt_region_tally tally; /* of the launches where the region has its own */
};

struct seq {
	uint32_t H, r, lbt, cap_blocks, N;
	bool has_ws;
	struct kvt_ws ws[2]; /* the reference's, the device's */
};

struct reg {
	struct seq *s;
	struct kvt_region ref; /* over side[0]'s slot and key */
	struct side side[2];
	bool has_frame;	      /* side[].frame passed to drops (else NULL) */
	struct kvt_ws off[2]; /* a working set without buckets or window, per side */
	bool ws_off;	      /* this call passes off[] */
	uint32_t *sel, *prev_sel;
	uint32_t N, sink, ring0;
};

static struct seq seqs[N_SEQS];
static struct reg regs[N_REGIONS];
static struct kvt_region_tally shared_tally[2]; /* the launches where all regions share one */
static uint32_t next_frame; /* frames made: a grow short of free ones pushes fresh ones */
/* The free frames, as the manager's free[] and n_free: pushed and popped at the top. */
#define STACK_CAP (N_REGIONS * CAP_SLOTS)
static uint32_t free_stack[STACK_CAP], n_free;

/* What a run went through, so that a run that stops reaching a case shows. */
static struct {
	uint64_t calls, enospc, eoverflow, ws_off, lookups, hits, reloads, misses, evictions;
	uint64_t rounds2, resident, repeats, none, grows, drops, drops_key, moves_key, moves_empty;
	uint64_t overdrops, empties, empties_key, clears;
	uint64_t grows_stack, popped, stale_drop, stale_moved, stale_set, stale_moved_only;
	uint64_t stale_kept, stale_null, clears_freed, pushed_clear;
	uint64_t group_calls, groups; /* launches writing group entries too, and the entries */
} seen;

/* A group table the recall launches write entries of (kvt_gpu_region_recall_groups), and what
   it must hold. */
#define GROUP_CAP (3u * N_SEQS * 256u) /* three entries a thread of the largest launch */
static uint64_t group_table[GROUP_CAP], group_want[GROUP_CAP], group_at[GROUP_CAP],
	group_val[GROUP_CAP];

static uint32_t rnd(uint32_t n)
{
	return t_rng_below(n);
}

static bool chance(uint32_t percent)
{
	return rnd(100) < percent;
}

static size_t n_keys(const struct reg *g)
{
	return (size_t)g->s->cap_blocks * g->s->H;
}

static size_t n_entries(const struct reg *g)
{
	return (size_t)g->s->H * g->s->r;
}

static struct kvt_region_geom geom_of(const struct reg *g)
{
	return (struct kvt_region_geom){g->s->H, g->s->lbt, g->N, g->sink, g->ring0};
}

static void ws_init(struct kvt_ws *ws, uint32_t w, uint32_t step, uint32_t cur)
{
	*ws = (struct kvt_ws){t_xmalloc(w * sizeof(uint32_t)), w, step, cur, 0};
}

static void setup(void)
{
	static const uint32_t heads[] = {1, 2, 8, 37}; /* 37: heads past the warps and a scan */
	static const uint32_t windows[] = {1, 3, 8, 20};
	static const uint32_t clocks[] = {0, 7, 0x00fffff0u, 0xfffff000u};

	memset(shared_tally, 0, sizeof(shared_tally));
	next_frame = 0;
	n_free = 0;
	for (uint32_t i = 0; i < N_SEQS; i++) {
		struct seq *s = &seqs[i];

		s->H = heads[i % 4];
		/* r 1..32, and two sequences past one warp pass */
		s->r = i == 4 ? 33 + rnd(40) : i == 5 ? 65 + rnd(20) : 1 + rnd(32);
		if (i == 0 || i == 3)
			s->r = 1 + rnd(i ? 6 : 3);
		s->lbt = 2 + rnd(3);
		s->cap_blocks = 16 + rnd(33);
		s->N = 1 + rnd(s->cap_blocks << s->lbt);
		s->has_ws = i != 3;
		if (s->has_ws) {
			uint32_t w = windows[rnd(4)], step = rnd(s->N + 1), cur = rnd(w);

			ws_init(&s->ws[0], w, step, cur);
			ws_init(&s->ws[1], w, step, cur);
		}
	}
	for (uint32_t i = 0; i < N_REGIONS; i++) {
		struct reg *g = &regs[i];
		struct seq *s = &seqs[i % N_SEQS];
		uint32_t clock = clocks[rnd(4)];

		g->s = s;
		g->sel = t_xmalloc(n_entries(g) * sizeof(uint32_t));
		g->prev_sel = t_xmalloc(n_entries(g) * sizeof(uint32_t));
		for (size_t x = 0; x < n_entries(g); x++)
			g->prev_sel[x] = KVT_REGION_NONE;
		for (int d = 0; d < 2; d++) {
			struct side *sd = &g->side[d];

			sd->slot = t_xmalloc(CAP_SLOTS * sizeof(*sd->slot));
			sd->key = t_xmalloc(n_keys(g) * sizeof(*sd->key));
			sd->view = t_xmalloc((n_entries(g) + 4) * sizeof(uint32_t));
			sd->view_n = t_xmalloc((s->H + 4) * sizeof(uint32_t));
			sd->load = t_xmalloc((n_entries(g) + 1) * sizeof(*sd->load));
			sd->frame = t_xmalloc(CAP_SLOTS * sizeof(uint32_t));
			sd->clock = clock;
			sd->n_slots = 0;
		}
		/* garbage the kernels must not read (slots and frames past the count) or leave
		   alone (the pad bytes) */
		for (uint32_t k = 0; k < CAP_SLOTS; k++) {
			g->side[0].slot[k] = (struct kvt_region_slot){
				(uint32_t)t_rng_next(), (uint32_t)t_rng_next(),
				(uint32_t)t_rng_next(), (uint32_t)t_rng_next()};
			g->side[0].frame[k] = (uint32_t)t_rng_next();
		}
		for (size_t k = 0; k < n_keys(g); k++)
			g->side[0].key[k].pad = (uint8_t)rnd(256);
		memcpy(g->side[1].slot, g->side[0].slot, CAP_SLOTS * sizeof(*g->side[0].slot));
		memcpy(g->side[1].frame, g->side[0].frame, CAP_SLOTS * sizeof(uint32_t));
		memcpy(g->side[1].key, g->side[0].key, n_keys(g) * sizeof(*g->side[0].key));
		g->has_frame = i % 5 != 4;
		for (int d = 0; d < 2; d++) /* no buckets; buckets but no window */
			g->off[d] = i % 2 ? (struct kvt_ws){NULL, 4, 3, 1, 9}
					  : (struct kvt_ws){s->has_ws ? s->ws[d].bucket : NULL, 0,
							    3, 0, 9};
		g->ref = (struct kvt_region){
			.slot = g->side[0].slot,
			.key = g->side[0].key,
			.clock = clock,
			.cap_blocks = s->cap_blocks,
			.link = t_xmalloc(CAP_SLOTS * sizeof(struct kvt_region_link)),
			.head = KVT_REGION_PENDING, /* an empty list */
			.tail = KVT_REGION_PENDING};
	}
}

static void teardown(void)
{
	for (uint32_t i = 0; i < N_REGIONS; i++) {
		struct reg *g = &regs[i];

		for (int d = 0; d < 2; d++) {
			free(g->side[d].slot);
			free(g->side[d].key);
			free(g->side[d].view);
			free(g->side[d].view_n);
			free(g->side[d].load);
			free(g->side[d].frame);
		}
		free(g->ref.link);
		free(g->sel);
		free(g->prev_sel);
	}
	for (uint32_t i = 0; i < N_SEQS; i++)
		if (seqs[i].has_ws) {
			free(seqs[i].ws[0].bucket);
			free(seqs[i].ws[1].bucket);
		}
}

/* The descriptor of region g's device side for a call (tally: where it adds). */
static struct kvt_gpu_region desc_of(struct reg *g, struct kvt_region_tally *tally)
{
	struct side *d = &g->side[1];

	return (struct kvt_gpu_region){
		.slot = d->slot,
		.key = d->key,
		.clock = &d->clock,
		.n_slots = &d->n_slots,
		.frame = g->has_frame ? d->frame : NULL,
		.ws = g->ws_off	     ? &g->off[1]
		      : g->s->has_ws ? &g->s->ws[1]
				     : NULL,
		.sel = g->sel,
		.view = d->view,
		.view_n = d->view_n,
		.load = d->load,
		.n_load = &d->n_load,
		.tally = tally,
		.err = &d->err,
		.n_heads = g->s->H,
		.r = g->s->r,
		.lbt = g->s->lbt,
		.n_tokens = g->N,
		.sink = g->sink,
		.ring0 = g->ring0,
		.cap_blocks = g->s->cap_blocks,
	};
}

/* Fails with where and what, for a state that differs. */
static void differ(const char *what, uint32_t step, uint32_t g, size_t at)
{
	fail_msg("step %u, region %u: %s differs (at %zu)", step, g, what, at);
}

static void cmp_bytes(const void *a, const void *b, size_t n, const char *what, uint32_t step,
		      uint32_t g)
{
	const uint8_t *x = a, *y = b;

	for (size_t i = 0; i < n; i++)
		if (x[i] != y[i])
			differ(what, step, g, i);
}

/* Pushes frame f on the free-frame stack (the manager's free[n_free++] = f). */
static void push_frame(uint32_t f)
{
	assert_true(n_free < STACK_CAP);
	free_stack[n_free++] = f;
}

/* The test's own bookkeeping: every frame made is either free (once on the stack) or held by
   one slot of a region that keeps frames. */
static void check_frames(uint32_t step)
{
	static uint8_t where[STACK_CAP];
	uint32_t count = n_free;

	assert_true(next_frame <= STACK_CAP);
	memset(where, 0, next_frame);
	for (uint32_t x = 0; x < n_free; x++) {
		if (free_stack[x] >= next_frame || where[free_stack[x]]++)
			fail_msg("step %u: free frame %u twice or unknown", step, free_stack[x]);
	}
	for (uint32_t i = 0; i < N_REGIONS; i++) {
		const struct reg *g = &regs[i];

		if (!g->has_frame)
			continue;
		for (uint32_t s = 0; s < g->ref.n_slots; s++) {
			uint32_t f = g->side[0].frame[s];

			if (f >= next_frame || where[f]++)
				fail_msg(
					"step %u, region %u: frame %u of slot %u held twice or free",
					step, i, f, s);
		}
		count += g->ref.n_slots;
	}
	assert_int_equal(count, next_frame);
}

/* Every region's state and every sequence's working set; the reference's invariants too. */
static void compare_state(uint32_t step)
{
	check_frames(step);
	for (uint32_t i = 0; i < N_REGIONS; i++) {
		struct reg *g = &regs[i];

		g->side[0].clock = g->ref.clock;
		g->side[0].n_slots = g->ref.n_slots;
		assert_int_equal(kvt_region_check(&g->ref, g->s->H), 0);
		if (g->side[0].n_slots != g->side[1].n_slots)
			fail_msg("step %u, region %u: %u slots, reference %u", step, i,
				 g->side[1].n_slots, g->side[0].n_slots);
		cmp_bytes(g->side[0].slot, g->side[1].slot, CAP_SLOTS * sizeof(*g->side[0].slot),
			  "slots", step, i);
		cmp_bytes(g->side[0].frame, g->side[1].frame, CAP_SLOTS * sizeof(uint32_t),
			  "frames", step, i);
		cmp_bytes(g->side[0].key, g->side[1].key, n_keys(g) * sizeof(*g->side[0].key),
			  "key table", step, i);
		if (g->side[0].clock != g->side[1].clock)
			differ("clock", step, i, 0);
		cmp_bytes(&g->side[0].tally, &g->side[1].tally, sizeof(g->side[0].tally), "tally",
			  step, i);
	}
	cmp_bytes(&shared_tally[0], &shared_tally[1], sizeof(shared_tally[0]), "shared tally", step,
		  0);
	for (uint32_t i = 0; i < N_REGIONS; i++) {
		const struct kvt_ws *a = &regs[i].off[0], *b = &regs[i].off[1];

		if (a->w != b->w || a->step != 3 || b->step != 3 || a->cur != b->cur ||
		    a->total != 9 || b->total != 9)
			differ("working set kept off", step, i, 0);
	}
	for (uint32_t i = 0; i < N_SEQS; i++) {
		const struct kvt_ws *a = &seqs[i].ws[0], *b = &seqs[i].ws[1];

		if (!seqs[i].has_ws)
			continue;
		if (a->w != b->w || a->step != b->step || a->cur != b->cur || a->total != b->total)
			differ("working set", step, i, 0);
		cmp_bytes(a->bucket, b->bucket, a->w * sizeof(uint32_t), "working set buckets",
			  step, i);
	}
}

/* A call's outputs: result, loads, view counts (all, canaries where none was written) and views
   up to them; nothing written past the arrays. */
static void compare_call(uint32_t step, uint32_t i)
{
	struct reg *g = &regs[i];
	struct side *a = &g->side[0], *b = &g->side[1];
	uint32_t H = g->s->H, r = g->s->r;

	if (a->err != b->err)
		fail_msg("step %u, region %u: result %d, reference %d", step, i, b->err, a->err);
	if (a->n_load != b->n_load)
		fail_msg("step %u, region %u: %u loads, reference %u", step, i, b->n_load,
			 a->n_load);
	cmp_bytes(a->load, b->load, a->n_load * sizeof(*a->load), "load list", step, i);
	cmp_bytes(a->view_n, b->view_n, (H + 4) * sizeof(uint32_t), "view counts", step, i);
	for (uint32_t h = 0; h < H; h++)
		cmp_bytes(a->view + (size_t)h * r, b->view + (size_t)h * r,
			  (a->err == -EOVERFLOW ? 0 : a->view_n[h]) * sizeof(uint32_t), "view",
			  step, i);
	for (uint32_t k = 0; k < 4 * sizeof(uint32_t); k++)
		if (((uint8_t *)(b->view + (size_t)H * r))[k] != GUARD)
			differ("view guard", step, i, k);
	for (uint32_t k = 0; k < sizeof(*b->load); k++)
		if (((uint8_t *)(b->load + (size_t)H * r))[k] != GUARD)
			differ("load guard", step, i, k);
}

/* Distinct lookups of g's selection as it stands (the slots that make a call fit exactly). */
static uint32_t distinct_lookups(struct reg *g)
{
	struct kvt_region_geom geo = geom_of(g);
	uint32_t H = g->s->H, r = g->s->r, n = 0, bt = 1u << g->s->lbt;

	for (uint32_t h = 0; h < H; h++)
		for (uint32_t j = 0; j < r; j++) {
			uint32_t b = g->sel[h * r + j], nv, x;

			if (b == KVT_REGION_NONE)
				continue;
			nv = g->N - (b << g->s->lbt) < bt ? g->N - (b << g->s->lbt) : bt;
			if (kvt_region_resident(&g->ref, &geo, h, b, nv))
				continue;
			for (x = 0; x < j && g->sel[h * r + x] != b; x++)
				;
			n += x == j;
		}
	return n;
}

/* The next call of region g: token count, resident ranges, top-K counts, selection. */
static void next_call(struct reg *g)
{
	struct seq *s = g->s;
	uint32_t H = s->H, r = s->r, bt = 1u << s->lbt, nb;

	g->N = s->N;
	if (chance(10) && g->N > 1)
		g->N -= 1 + rnd(g->N - 1 < 2 * bt ? g->N - 1 : 2 * bt); /* behind the sequence */
	nb = (g->N + bt - 1) >> s->lbt;
	g->sink = chance(30) ? 0 : rnd(2 * bt + 1);
	g->ring0 = chance(20) ? g->N + rnd(3) : g->N - rnd(g->N < 2 * bt ? g->N + 1 : 2 * bt + 1);
	if (g->ring0 < g->sink)
		g->ring0 = g->sink; /* region.h's contract */
	for (uint32_t b = 0; b < nb; b++)
		for (uint32_t h = 0; h < H; h++) {
			struct kvt_region_key *k = &g->side[0].key[(size_t)b * H + h];
			uint32_t p0 = b << s->lbt, nv = g->N - p0 < bt ? g->N - p0 : bt,
				 end = p0 + nv;
			uint32_t cov = 0, q = rnd(100);

			if (p0 < g->sink)
				cov += (end < g->sink ? end : g->sink) - p0;
			if (end > g->ring0)
				cov += end - (p0 > g->ring0 ? p0 : g->ring0);
			if (q < 12 && cov <= nv)
				k->tk = (uint8_t)(nv - cov); /* resident */
			else if (q < 20)
				k->tk = (uint8_t)rnd(bt + 1);
			else
				k->tk = 0;
			g->side[1].key[(size_t)b * H + h].tk = k->tk;
		}
	memcpy(g->prev_sel, g->sel, n_entries(g) * sizeof(uint32_t));
	for (uint32_t h = 0; h < H; h++)
		for (uint32_t j = 0; j < r; j++) {
			uint32_t *e = &g->sel[h * r + j], q = rnd(100), p;

			if (q < 10) {
				*e = KVT_REGION_NONE;
			} else if (q < 20 && j > 0) {
				*e = g->sel[h * r + rnd(j)]; /* a repeat */
			} else if (q < 60) {		     /* last call's (hits) */
				p = g->prev_sel[h * r + rnd(r)];
				*e = p != KVT_REGION_NONE && p < nb ? p : rnd(nb);
			} else if (q < 70) {
				*e = nb - 1 - rnd(nb < 3 ? nb : 3); /* recent: grows, reloads */
			} else {
				*e = rnd(nb);
			}
		}
	if (chance(3)) /* one block everywhere */
		for (size_t x = 0; x < n_entries(g); x++)
			g->sel[x] = nb - 1;
}

/* Grows the regions idx[0 .. n) to want[] slots: both sides, one device launch. The new slots
   of a region keeping frames pop theirs from the free-frame stack (fresh frames pushed first
   when it runs short), in batch order, as the manager's region_grow: the reference's side by
   the test, the device's by the kernel from a copy of the stack (the region's offset its top
   when its pops begin), or, without a stack, by the test as a caller. The offsets of the
   regions that pop nothing are left at 0, whose read would be out of bounds. */
static void grow_batch(const uint32_t *idx, const uint32_t *want, uint32_t n)
{
	static uint32_t dstack[STACK_CAP];
	struct kvt_gpu_region d[N_REGIONS];
	uint32_t in_off[N_REGIONS], need = 0, had_free;
	const bool with_stack = chance(70);

	for (uint32_t x = 0; x < n; x++) {
		const struct reg *g = &regs[idx[x]];

		assert_true(want[x] <= CAP_SLOTS);
		if (g->has_frame && want[x] > g->ref.n_slots)
			need += want[x] - g->ref.n_slots;
	}
	while (n_free < need)
		push_frame(next_frame++);
	had_free = n_free;
	memcpy(dstack, free_stack, n_free * sizeof(uint32_t));
	for (uint32_t x = 0; x < n; x++) {
		struct reg *g = &regs[idx[x]];

		d[x] = desc_of(g, NULL);
		in_off[x] = 0;
		if (g->has_frame && want[x] > g->ref.n_slots) {
			in_off[x] = n_free;
			for (uint32_t i = g->ref.n_slots; i < want[x]; i++) {
				g->side[0].frame[i] = free_stack[--n_free];
				if (!with_stack)
					g->side[1].frame[i] = g->side[0].frame[i];
			}
			seen.grows_stack += with_stack;
		}
		kvt_region_grow(&g->ref, want[x]);
	}
	assert_int_equal(kvt_gpu_region_grow(d, want, with_stack ? dstack : NULL,
					     with_stack ? in_off : NULL, n, NULL),
			 0);
	assert_memory_equal(dstack, free_stack, had_free * sizeof(uint32_t)); /* only read */
	seen.popped += with_stack ? had_free - n_free : 0;
	seen.grows += n;
}

/* Whether the view of region g (the reference's copy) names slot i, as region_shrink asks. */
static bool view_has(const struct reg *g, uint32_t i)
{
	for (uint32_t h = 0; h < g->s->H; h++)
		for (uint32_t x = 0; x < g->side[0].view_n[h]; x++)
			if (g->side[0].view[(size_t)h * g->s->r + x] == i)
				return true;
	return false;
}

/* Names slot i in head h of region g's view (the reference's copy), a place or two past its
   last entry (the skipped one names a slot past the count), if the head has room. */
static void view_add(struct reg *g, uint32_t h, uint32_t i)
{
	uint32_t *vn = &g->side[0].view_n[h], at = *vn + rnd(2);

	if (at >= g->s->r)
		return;
	if (at > *vn)
		g->side[0].view[(size_t)h * g->s->r + *vn] = g->ref.n_slots + 1;
	g->side[0].view[(size_t)h * g->s->r + at] = i;
	*vn = at + 1;
}

/* A random view of region g on both sides for a drop's stale check: no entry, the last slot
   only, a few slots, or up to r per head, slots below the count or just past it. The entries
   past view_n[h] name slots as well, which the check must ignore. */
static void random_view(struct reg *g)
{
	const uint32_t H = g->s->H, n = g->ref.n_slots, q = rnd(100);
	struct side *a = &g->side[0], *b = &g->side[1];

	for (size_t x = 0; x < n_entries(g); x++)
		a->view[x] = rnd(n + 2);
	for (uint32_t h = 0; h < H; h++)
		a->view_n[h] = q < 75 ? 0 : rnd(g->s->r + 1);
	if (n && q >= 15 && q < 45)
		view_add(g, rnd(H), n - 1);
	for (uint32_t c = q >= 45 && q < 75 ? 1 + rnd(3) : 0; c; c--)
		view_add(g, rnd(H), rnd(n + 1));
	memcpy(b->view, a->view, n_entries(g) * sizeof(uint32_t));
	memcpy(b->view_n, a->view_n, H * sizeof(uint32_t));
}

/* k[x] drops of each region idx[0 .. n) (past its slots: as many as it has), both sides, one
   device launch; what the drops report compared, and nothing written past it. */
static void drop_batch(const uint32_t *idx, const uint32_t *k, uint32_t n, uint32_t step)
{
	enum { CAP = N_REGIONS * (CAP_SLOTS + 4) };
	static uint32_t dropped[2][CAP + 1], freed[2][CAP + 1];
	struct kvt_gpu_region d[N_REGIONS];
	uint32_t off[N_REGIONS], gone[N_REGIONS], total = 0, q = rnd(100), stale[2][N_REGIONS];
	uint32_t stale_in[N_REGIONS];
	bool no_out = q < 10, no_gone = q >= 5 && q < 15;

	for (uint32_t x = 0; x < n; x++) {
		struct reg *g = &regs[idx[x]];

		d[x] = desc_of(g, NULL);
		off[x] = total;
		total += k[x];
		gone[x] = 0xdeadbeefu;
		random_view(g);
		stale_in[x] = stale[0][x] = stale[1][x] = chance(10); /* set before: stays set */
		if (chance(90))
			d[x].stale = &stale[1][x];
	}
	assert_true(total <= CAP);
	memset(dropped, CANARY, sizeof(dropped));
	memset(freed, CANARY, sizeof(freed));
	assert_int_equal(kvt_gpu_region_drop(d, k, no_out ? NULL : off, no_out ? NULL : dropped[1],
					     no_out ? NULL : freed[1], no_gone ? NULL : gone, n,
					     NULL),
			 0);
	for (uint32_t x = 0; x < n; x++) {
		struct reg *g = &regs[idx[x]];
		uint32_t *fr = g->has_frame ? g->side[0].frame : NULL, ref_gone = 0, t;

		bool moved_only = true; /* every drop that marks the view marks it by a move */

		for (t = 0; t < k[x] && g->ref.n_slots; t++) {
			uint32_t last = g->ref.n_slots - 1, had;
			bool by_drop, by_move;

			had = kvt_region_drop(&g->ref, fr, &dropped[0][off[x] + t],
					      &freed[0][off[x] + t]);
			if (fr)
				push_frame(freed[0][off[x] + t]);
			/* region_shrink's mark: the dropped slot, or the last one (n_slots now) */
			by_drop = view_has(g, dropped[0][off[x] + t]);
			by_move = view_has(g, g->ref.n_slots);
			if (by_drop || by_move) {
				seen.stale_drop += by_drop;
				seen.stale_moved += !by_drop;
				moved_only &= !by_drop;
				stale[0][x] = 1;
			}
			ref_gone += had;
			seen.drops++;
			seen.drops_key += had;
			if (dropped[0][off[x] + t] != last) {
				bool key =
					g->ref.slot[dropped[0][off[x] + t]].key != KVT_REGION_NONE;

				seen.moves_key += key;
				seen.moves_empty += !key;
			}
		}
		seen.overdrops += t < k[x];
		if (!no_gone && gone[x] != ref_gone)
			fail_msg("step %u, region %u: drops forgot %u keys, reference %u", step,
				 idx[x], gone[x], ref_gone);
		if (!d[x].stale) {
			seen.stale_null += t > 0;
		} else if (t > 0 && !stale_in[x]) {
			seen.stale_set += stale[0][x];
			seen.stale_moved_only += stale[0][x] && moved_only;
			seen.stale_kept += !stale[0][x];
		}
		if (d[x].stale && stale[1][x] != stale[0][x])
			fail_msg("step %u, region %u: stale %u after %u drops, reference %u", step,
				 idx[x], stale[1][x], t, stale[0][x]);
		cmp_bytes(g->side[0].view, g->side[1].view, n_entries(g) * sizeof(uint32_t),
			  "view after drops", step, idx[x]);
		cmp_bytes(g->side[0].view_n, g->side[1].view_n, g->s->H * sizeof(uint32_t),
			  "view counts after drops", step, idx[x]);
		if (no_out)
			continue;
		for (uint32_t y = 0; y < k[x]; y++) {
			uint32_t a = y < t ? dropped[0][off[x] + y] : 0xa5a5a5a5u,
				 b = y < t ? freed[0][off[x] + y] : 0xa5a5a5a5u;

			if (dropped[1][off[x] + y] != a || freed[1][off[x] + y] != b)
				fail_msg("step %u, region %u: drop %u: slot %u frame %u, reference "
					 "%u %u",
					 step, idx[x], y, dropped[1][off[x] + y],
					 freed[1][off[x] + y], a, b);
		}
	}
	if (!no_out && (dropped[1][total] != 0xa5a5a5a5u || freed[1][total] != 0xa5a5a5a5u))
		differ("drop output guard", step, idx[0], total);
}

/* Sizes the regions idx[0 .. n) to want[] slots: a grow launch for those below, a drop launch
   for those above. */
static void size_batch(const uint32_t *idx, const uint32_t *want, uint32_t n, uint32_t step)
{
	uint32_t gi[N_REGIONS], gw[N_REGIONS], di[N_REGIONS], dk[N_REGIONS], ng = 0, nd = 0;

	for (uint32_t x = 0; x < n; x++) {
		uint32_t have = regs[idx[x]].ref.n_slots;

		if (want[x] > have || chance(5)) { /* and now and then a grow to fewer: no-op */
			gi[ng] = idx[x];
			gw[ng++] = want[x];
		} else if (want[x] < have || chance(20)) { /* or a drop of none */
			di[nd] = idx[x];
			dk[nd++] = have - want[x];
		}
	}
	if (ng)
		grow_batch(gi, gw, ng);
	if (nd)
		drop_batch(di, dk, nd, step);
}

/* Random grows, drops, empties and clears between calls. */
static void between_calls(uint32_t step)
{
	uint32_t idx[N_REGIONS], want[N_REGIONS], n = 0;

	for (uint32_t i = 0; i < N_REGIONS; i++) {
		struct reg *g = &regs[i];
		uint32_t q = rnd(100), lookups = g->s->H * g->s->r;

		if (q >= 12)
			continue;
		idx[n] = i;
		want[n] = q < 4 ? rnd(CAP_SLOTS + 1) : q < 11 ? lookups / 3 + rnd(lookups + 1) : 0;
		if (want[n] > CAP_SLOTS)
			want[n] = CAP_SLOTS;
		n++;
	}
	if (n)
		size_batch(idx, want, n, step);
	compare_state(step);
	n = 0;
	for (uint32_t i = 0; i < N_REGIONS; i++) /* drops of a few slots, or past the count */
		if (chance(8)) {
			uint32_t have = regs[i].ref.n_slots;

			idx[n] = i;
			want[n++] = chance(10) ? have + rnd(4) : rnd(have < 8 ? have + 1 : 8);
		}
	if (n) {
		drop_batch(idx, want, n, step);
		compare_state(step);
	}
	if (chance(25)) { /* empties, in one batch */
		struct kvt_gpu_region d[N_REGIONS];
		uint32_t pairs[2 * 40], had[2][40 + 1], np = 1 + rnd(40);
		bool no_had = chance(10);

		for (uint32_t i = 0; i < N_REGIONS; i++)
			d[i] = desc_of(&regs[i], NULL);
		for (uint32_t x = 0; x < np; x++) {
			uint32_t i = rnd(N_REGIONS), sl = rnd(regs[i].ref.n_slots + 3);

			if (x && chance(10)) {
				i = pairs[2 * (x - 1)];
				sl = pairs[2 * (x - 1) + 1];
			}
			if (chance(3))
				i = N_REGIONS + rnd(3); /* past the batch: left alone */
			pairs[2 * x] = i;
			pairs[2 * x + 1] = sl;
			had[0][x] = i < N_REGIONS ? kvt_region_empty(&regs[i].ref, sl) : 0;
			seen.empties_key += had[0][x];
		}
		memset(had[1], CANARY, sizeof(had[1]));
		assert_int_equal(
			kvt_gpu_region_empty(d, N_REGIONS, pairs, no_had ? NULL : had[1], np, NULL),
			0);
		seen.empties += np;
		/* copies of a pair: one of them (any) reports the key */
		for (uint32_t x = 0; !no_had && x < np; x++) {
			uint32_t a = 0, b = 0;

			for (uint32_t y = 0; y < np; y++)
				if (pairs[2 * y] == pairs[2 * x] &&
				    pairs[2 * y + 1] == pairs[2 * x + 1]) {
					a += had[0][y];
					b += had[1][y];
				}
			if (had[1][x] > 1 || a != b)
				fail_msg(
					"step %u: empty %u (region %u, slot %u) reports %u, reference "
					"%u (its copies: %u, %u)",
					step, x, pairs[2 * x], pairs[2 * x + 1], had[1][x],
					had[0][x], b, a);
		}
		if (!no_had && had[1][np] != 0xa5a5a5a5u)
			differ("empty output guard", step, 0, np);
		compare_state(step);
	}
	if (chance(8)) { /* clears, in one batch */
		enum { FREED = 3 * (CAP_SLOTS + 2) + 3 };
		struct kvt_gpu_region d[3];
		uint32_t ci[3], gone[3], nc = 1 + rnd(3), out_off[3], end = rnd(3);
		uint32_t freed[2][FREED + 1]; /* the reference's, the device's; a guard after */
		const bool with_freed = chance(75);

		for (uint32_t x = 0; x < nc; x++) {
			uint32_t y;

			do {
				ci[x] = rnd(N_REGIONS);
				for (y = 0; y < x && ci[y] != ci[x]; y++)
					;
			} while (y < x);
			d[x] = desc_of(&regs[ci[x]], NULL);
			gone[x] = 0xdeadbeefu;
			out_off[x] = end; /* the slots it has, and a gap of 0 to 2 */
			end += regs[ci[x]].ref.n_slots + rnd(3);
		}
		assert_true(end <= FREED);
		memset(freed, CANARY, sizeof(freed));
		assert_int_equal(kvt_gpu_region_clear(d, chance(10) ? NULL : gone,
						      with_freed ? out_off : NULL,
						      with_freed ? freed[1] : NULL, nc, NULL),
				 0);
		for (uint32_t x = 0; x < nc; x++) {
			struct reg *g = &regs[ci[x]];
			uint32_t ref_gone;

			/* the manager's kvt_recall_drop_seq: frame[0 .. n_slots) pushed in order */
			for (uint32_t s = 0; s < g->ref.n_slots; s++) {
				freed[0][out_off[x] + s] = g->has_frame ? g->side[0].frame[s] : s;
				if (g->has_frame)
					push_frame(g->side[0].frame[s]);
			}
			seen.pushed_clear += g->has_frame ? g->ref.n_slots : 0;
			ref_gone = kvt_region_clear(&g->ref);
			if (gone[x] != 0xdeadbeefu && gone[x] != ref_gone)
				fail_msg("step %u, region %u: clear forgot %u keys, reference %u",
					 step, ci[x], gone[x], ref_gone);
		}
		if (with_freed) /* canaries in the gaps and after */
			cmp_bytes(freed[0], freed[1], sizeof(freed[0]), "frames a clear freed",
				  step, ci[0]);
		seen.clears_freed += with_freed ? nc : 0;
		seen.clears += nc;
		compare_state(step);
	}
}

/* One launch: layer `layer` of a random subset of the sequences, in random order. */
static void launch(uint32_t step, uint32_t layer)
{
	struct kvt_gpu_region d[N_SEQS];
	uint32_t idx[N_SEQS], n = 0, fit[N_SEQS], n_fit = 0, fit_want[N_SEQS];
	bool overflow[N_SEQS] = {false};
	bool shared = step % 2;

	for (uint32_t i = 0; i < N_SEQS; i++)
		if (chance(80))
			idx[n++] = layer * N_SEQS + i;
	for (uint32_t x = n; x > 1; x--) {
		uint32_t y = rnd(x), t = idx[x - 1];

		idx[x - 1] = idx[y];
		idx[y] = t;
	}
	for (uint32_t x = 0; x < n; x++) {
		struct reg *g = &regs[idx[x]];
		uint32_t q;

		next_call(g);
		q = rnd(100);
		if (q < 10) { /* exactly enough slots, or one fewer */
			uint32_t L = distinct_lookups(g);

			if (q < 7 || L == 0)
				fit_want[n_fit] = L;
			else
				fit_want[n_fit] = L - 1;
			if (fit_want[n_fit] <= CAP_SLOTS)
				fit[n_fit++] = idx[x];
		}
	}
	if (n_fit) {
		size_batch(fit, fit_want, n_fit, step);
		compare_state(step);
	}
	for (uint32_t x = 0; x < n; x++) {
		struct reg *g = &regs[idx[x]];

		for (int s = 0; s < 2; s++) {
			struct side *sd = &g->side[s];

			memset(sd->view, CANARY, n_entries(g) * sizeof(uint32_t));
			memset(sd->view + n_entries(g), GUARD, 4 * sizeof(uint32_t));
			memset(sd->view_n, CANARY, (g->s->H + 4) * sizeof(uint32_t));
			memset(sd->load, CANARY, n_entries(g) * sizeof(*sd->load));
			memset(sd->load + n_entries(g), GUARD, sizeof(*sd->load));
			sd->n_load = 0xdeadbeefu;
			sd->err = 12345;
		}
		g->ws_off = g->s->has_ws && chance(5); /* a working set kept off */
		seen.ws_off += g->ws_off;
		if (chance(3)) { /* 4 billion calls made */
			overflow[x] = true;
			g->side[1].clock = g->ref.clock = UINT32_MAX;
		}
		d[x] = desc_of(g, shared ? &shared_tally[1] : &g->side[1].tally);
	}
	if (n && chance(50)) {
		/* with entries of a group table to write, more or fewer than its threads, at
		   distinct places: the decisions must not change, and the table holds exactly
		   them after */
		uint32_t k = rnd(3 * n * 256 + 1), base = rnd(GROUP_CAP - k + 1);

		for (uint32_t x = 0; x < k; x++) {
			/* a permutation of [base, base + k): 7919 is prime, above GROUP_CAP */
			uint32_t y = base + (uint32_t)(((uint64_t)x * 7919u) % k);

			group_at[x] = (uint64_t)(uintptr_t)&group_table[y];
			group_val[x] =
				((uint64_t)step << 32) ^ ((uint64_t)layer << 20) ^ x ^ 0x5a5a0000u;
			group_want[y] = group_val[x];
		}
		assert_int_equal(kvt_gpu_region_recall_groups(d, n, group_at, group_val, k, NULL),
				 0);
		assert_memory_equal(group_table, group_want, sizeof(group_table));
		seen.group_calls++;
		seen.groups += k;
	} else {
		assert_int_equal(kvt_gpu_region_recall(d, n, NULL), 0);
	}
	for (uint32_t x = 0; x < n; x++) {
		struct reg *g = &regs[idx[x]];
		struct kvt_region_geom geo = geom_of(g);
		struct side *a = &g->side[0];

		a->err = kvt_region_recall(&g->ref, &geo, g->sel, g->s->r,
					   g->ws_off	  ? &g->off[0]
					   : g->s->has_ws ? &g->s->ws[0]
							  : NULL,
					   a->view, a->view_n, a->load, &a->n_load,
					   shared ? &shared_tally[0] : &a->tally);
		g->ws_off = false;
		compare_call(step, idx[x]);
		seen.calls++;
		seen.enospc += a->err == -ENOSPC;
		seen.eoverflow += a->err == -EOVERFLOW;
		for (uint32_t l = 0, m = 0; l < a->n_load; l++) {
			seen.reloads += a->load[l].old == a->load[l].key;
			seen.misses += a->load[l].old != a->load[l].key;
			seen.evictions += a->load[l].old != a->load[l].key &&
					  a->load[l].old != KVT_REGION_NONE;
			m += a->load[l].old != a->load[l].key;
			seen.rounds2 += m == 17; /* a second round of victims */
		}
		for (uint32_t h = 0; h < g->s->H; h++)
			for (uint32_t j = 0; j < g->s->r; j++) {
				uint32_t b = g->sel[h * g->s->r + j], bt = 1u << g->s->lbt, nv;

				if (b == KVT_REGION_NONE) {
					seen.none++;
					continue;
				}
				nv = g->N - (b << g->s->lbt) < bt ? g->N - (b << g->s->lbt) : bt;
				seen.resident += kvt_region_resident(&g->ref, &geo, h, b, nv);
				for (uint32_t y = 0; y < j; y++)
					if (g->sel[h * g->s->r + y] == b) {
						seen.repeats++;
						break;
					}
			}
	}
	for (uint32_t x = 0; x < n; x++)
		if (overflow[x]) { /* back to where it was, both sides */
			struct reg *g = &regs[idx[x]];
			uint32_t c = 0;

			for (uint32_t k = 0; k < g->ref.n_slots; k++)
				c = g->side[0].slot[k].stamp > c ? g->side[0].slot[k].stamp : c;
			g->side[1].clock = g->ref.clock = c + rnd(3);
		}
	compare_state(step);
}

static void random_run(uint64_t seed, uint32_t steps)
{
	uint32_t first[N_REGIONS], want[N_REGIONS];

	t_rng_seed(seed);
	memset(&seen, 0, sizeof(seen));
	setup();
	for (uint32_t i = 0; i < N_REGIONS; i++) {
		struct reg *g = &regs[i];
		uint32_t lookups = g->s->H * g->s->r, q = rnd(4);

		first[i] = i;
		/* plenty, about the calls' lookups, half of them, none */
		want[i] = q == 0   ? CAP_SLOTS
			  : q == 1 ? lookups
			  : q == 2 ? lookups / 2
				   : lookups / 4;
		if (want[i] > CAP_SLOTS)
			want[i] = CAP_SLOTS;
	}
	grow_batch(first, want, N_REGIONS);
	compare_state(0);
	for (uint32_t step = 1; step <= steps; step++) {
		for (uint32_t i = 0; i < N_SEQS; i++) {
			struct seq *s = &seqs[i];
			uint32_t bt = 1u << s->lbt, max = s->cap_blocks << s->lbt, q = rnd(100);

			if (q < 70)
				s->N += rnd(bt + 1);
			else if (q < 80)
				s->N += 20 + rnd(30); /* past the window */
			else if (q < 85)
				s->N = 1 + rnd(s->N); /* truncated */
			if (s->N > max)
				s->N = max / 2 + rnd(max / 2) + 1;
		}
		if (chance(15)) { /* a working set restarted behind its keys' touches */
			struct seq *s = &seqs[rnd(N_SEQS)];
			uint32_t at = s->has_ws ? s->ws[0].step : 0;
			/* far back, or just behind: the next call's move then clears a few buckets
			   that hold its keys' latest touches */
			uint32_t back = chance(50) ? at / 2 : at - (at > 0);

			for (int d = 0; s->has_ws && d < 2; d++) {
				memset(s->ws[d].bucket, 0, s->ws[d].w * sizeof(uint32_t));
				s->ws[d].step = back;
				s->ws[d].cur = 0;
				s->ws[d].total = 0;
			}
		}
		between_calls(step);
		for (uint32_t layer = 0; layer < N_LAYERS; layer++)
			launch(step, layer);
	}
	teardown();
}

static void test_region_random(void **state)
{
	uint64_t seed = t_pick_seed();
	uint32_t steps = (uint32_t)t_pick_ops(480);

	(void)state;
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		double t0 = t_now_s();

		kemu_set_schedule(mode);
		random_run(seed, steps);
		print_message("# schedule %d: %u steps, seed %llu: %.2f s\n", mode, steps,
			      (unsigned long long)seed, t_now_s() - t0);
		print_message(
			"#   %llu calls (%llu -ENOSPC, %llu -EOVERFLOW, %llu without working set): "
			"%llu misses (%llu evicting; %llu calls past one victim round), %llu "
			"reloads; entries: %llu resident, %llu repeated, %llu none\n",
			(unsigned long long)seen.calls, (unsigned long long)seen.enospc,
			(unsigned long long)seen.eoverflow, (unsigned long long)seen.ws_off,
			(unsigned long long)seen.misses, (unsigned long long)seen.evictions,
			(unsigned long long)seen.rounds2, (unsigned long long)seen.reloads,
			(unsigned long long)seen.resident, (unsigned long long)seen.repeats,
			(unsigned long long)seen.none);
		print_message(
			"#   %llu grows; %llu drops (%llu forgetting a key; moved: %llu holding "
			"a key, %llu empty; %llu asked past the count); %llu empties (%llu "
			"forgetting a key); %llu clears\n",
			(unsigned long long)seen.grows, (unsigned long long)seen.drops,
			(unsigned long long)seen.drops_key, (unsigned long long)seen.moves_key,
			(unsigned long long)seen.moves_empty, (unsigned long long)seen.overdrops,
			(unsigned long long)seen.empties, (unsigned long long)seen.empties_key,
			(unsigned long long)seen.clears);
		print_message(
			"#   %llu grows popping the stack on the device (%llu frames); stale: %llu "
			"drops of a slot in the view, %llu moves of one; drops from 0: %llu marked "
			"(%llu by moves only), %llu not; %llu without a flag; %llu clears with freed "
			"(%llu frames pushed by clears)\n",
			(unsigned long long)seen.grows_stack, (unsigned long long)seen.popped,
			(unsigned long long)seen.stale_drop, (unsigned long long)seen.stale_moved,
			(unsigned long long)seen.stale_set,
			(unsigned long long)seen.stale_moved_only,
			(unsigned long long)seen.stale_kept, (unsigned long long)seen.stale_null,
			(unsigned long long)seen.clears_freed,
			(unsigned long long)seen.pushed_clear);
		print_message("#   %llu launches writing %llu group entries too\n",
			      (unsigned long long)seen.group_calls,
			      (unsigned long long)seen.groups);
		/* the frequent cases (tens a run of 120 steps; clears are too rare to count on:
		   frames_case has them) */
		if (steps >= 100)
			assert_true(seen.grows_stack && seen.stale_drop && seen.stale_moved_only &&
				    seen.stale_kept && seen.stale_null && seen.group_calls);
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
}

/* Calls that break the reference's contract, or find the clock at its end, change nothing but
 *n_load (and *err), and the view when the flaw is the selection's (a block past the layer or
 its key table: kvt_recall_device_blocks leaves such a member out with an empty view); the flaw
 may lie in any warp's share of the selection. */
static void invalid_cases(void)
{
	enum { H = 2, R = 40 };
	struct kvt_region_slot slot[4];
	struct kvt_region_key key[8 * H];
	uint32_t sel[H * R], view[H * R], view_n[H], n_load, clock = 5, n_slots = 4,
							     bucket[2] = {0};
	struct kvt_region_load load[H * R];
	struct kvt_region_tally tally = {0};
	struct kvt_ws ws = {bucket, 2, 0, 0, 0};
	int32_t err = 0;
	struct kvt_gpu_region d = {
		.slot = slot,
		.key = key,
		.clock = &clock,
		.n_slots = &n_slots,
		.ws = &ws,
		.sel = sel,
		.view = view,
		.view_n = view_n,
		.load = load,
		.n_load = &n_load,
		.tally = &tally,
		.err = &err,
		.n_heads = H,
		.r = R,
		.lbt = 2,
		.n_tokens = 20, /* blocks 0..4 of 4 tokens */
		.sink = 0,
		.ring0 = 20,
		.cap_blocks = 8,
	};
	uint8_t before[sizeof(slot) + sizeof(key)];
	uint32_t k = 2, gone, off = 0, dropped[3], freed[3];

	for (uint32_t i = 0; i < 4; i++)
		slot[i] = (struct kvt_region_slot){KVT_REGION_NONE, 0, 0, i};
	memset(key, 0, sizeof(key));
	for (uint32_t i = 0; i < H * R; i++)
		sel[i] = KVT_REGION_NONE;
	sel[0] = 0, sel[1] = 1, sel[2] = 2; /* head 0 */
	sel[R] = 3, sel[2 * R - 1] = 3;	    /* head 1: block 3 twice, 39 entries apart */
	memcpy(before, slot, sizeof(slot));
	memcpy(before + sizeof(slot), key, sizeof(key));
	for (int c = 0; c < 6; c++) {
		n_load = 7;
		err = 0;
		sel[70] = c == 0 ? 5 : KVT_REGION_NONE; /* past the layer's blocks, warp 2's */
		d.n_heads = c == 1 ? KVT_GPU_REGION_MAX_HEADS + 1 : H;
		d.sink = c == 2 ? 21 : 0;      /* the sink past ring0 */
		d.cap_blocks = c == 3 ? 3 : 8; /* block 3 past the table, warp 1's */
		clock = c == 4 ? UINT32_MAX : 5;
		n_slots = c == 5 ? KVT_REGION_MAX_SLOTS + 1 : 4;
		view_n[0] = view_n[1] = 9;
		assert_int_equal(kvt_gpu_region_recall(&d, 1, NULL), 0);
		assert_int_equal(err, c == 4 ? -EOVERFLOW : -EINVAL);
		assert_int_equal(n_load, 0);
		assert_int_equal(clock, c == 4 ? UINT32_MAX : 5);
		assert_memory_equal(before, slot, sizeof(slot));
		assert_memory_equal(before + sizeof(slot), key, sizeof(key));
		assert_int_equal(ws.step, 0);
		assert_int_equal(tally.lookups, 0);
		assert_int_equal(view_n[0], c == 0 || c == 3 ? 0 : 9);
		assert_int_equal(view_n[1], c == 0 || c == 3 ? 0 : 9);
	}
	/* within the contract the call runs; a working set without window is left alone */
	n_slots = 4;
	clock = 5;
	ws.w = 0;
	assert_int_equal(kvt_gpu_region_recall(&d, 1, NULL), 0);
	assert_int_equal(err, 0);
	assert_int_equal(clock, 6);
	assert_int_equal(tally.lookups, 4); /* 0, 1, 2 of head 0; 3 of head 1 (once) */
	assert_int_equal(n_load, 4);
	assert_int_equal(view_n[1], 1);
	assert_int_equal(ws.step, 0);
	assert_int_equal(key[0].touched, 0);
	/* two drops: slots 0 and 1 (blocks 0 and 1 of head 0, ranks 0 and 1); the last slot
	   (block 3 of head 1, rank R) moves into 0, then slot 2 (block 2, rank 2) into 1 */
	dropped[2] = freed[2] = 77;
	assert_int_equal(kvt_gpu_region_drop(&d, &k, &off, dropped, freed, &gone, 1, NULL), 0);
	assert_int_equal(gone, 2);
	assert_int_equal(n_slots, 2);
	assert_int_equal(dropped[0], 0);
	assert_int_equal(dropped[1], 1);
	assert_int_equal(freed[1], 1); /* no frame array: the slot's index */
	assert_int_equal(dropped[2], 77);
	assert_int_equal(slot[0].key, 3 * H + 1);
	assert_int_equal(slot[1].key, 2 * H);
	assert_int_equal(key[3 * H + 1].slot, 1);
	assert_int_equal(key[2 * H].slot, 2);
	assert_int_equal(key[0].slot, 0);
}

/* A working set restarted just behind its keys' touches, both sides: the next call's move
   clears the buckets of steps 198..202 (threads 0..4 clear one each), among them step 200's,
   which holds every key's touch of the call before, and each of its 80 lookups (threads 0..79)
   then takes its key's touch out of that bucket. Every schedule runs some of those before the
   clear where a barrier between them is missing. */
static void ws_restart_case(void)
{
	enum { H = 2, R = 40, CAP = 64, SLOTS = 80, W = 8 };
	static struct kvt_region_slot slot[2][SLOTS];
	static struct kvt_region_key key[2][CAP * H];
	static struct kvt_region_link link[SLOTS];
	uint32_t sel[H * R], view[2][H * R], view_n[2][H], n_load[2], clock = 0, n_slots = 0;
	uint32_t bucket[2][W], grow = SLOTS;
	struct kvt_region_load load[2][H * R];
	struct kvt_region_tally tally[2] = {{0}};
	struct kvt_ws ws[2] = {{bucket[0], W, 0, 0, 0}, {bucket[1], W, 0, 0, 0}};
	struct kvt_region rg = {.slot = slot[0],
				.key = key[0],
				.cap_blocks = CAP,
				.link = link,
				.head = KVT_REGION_PENDING,
				.tail = KVT_REGION_PENDING};
	int32_t err = 0;
	struct kvt_gpu_region d = {
		.slot = slot[1],
		.key = key[1],
		.clock = &clock,
		.n_slots = &n_slots,
		.ws = &ws[1],
		.sel = sel,
		.view = view[1],
		.view_n = view_n[1],
		.load = load[1],
		.n_load = &n_load[1],
		.tally = &tally[1],
		.err = &err,
		.n_heads = H,
		.r = R,
		.lbt = 2,
		.sink = 0,
		.cap_blocks = CAP,
	};

	memset(key, 0, sizeof(key));
	memset(bucket, 0, sizeof(bucket));
	for (uint32_t x = 0; x < H * R; x++)
		sel[x] = x % R;
	kvt_region_grow(&rg, SLOTS);
	assert_int_equal(kvt_gpu_region_grow(&d, &grow, NULL, NULL, 1, NULL), 0);
	for (uint32_t N = 200; N <= 202; N += 2) {
		struct kvt_region_geom geo = {H, 2, N, 0, N};

		if (N == 202) /* restarted at step 197 */
			for (int s = 0; s < 2; s++) {
				memset(bucket[s], 0, sizeof(bucket[s]));
				ws[s] = (struct kvt_ws){bucket[s], W, 197, 0, 0};
			}
		d.n_tokens = d.ring0 = N;
		assert_int_equal(kvt_gpu_region_recall(&d, 1, NULL), 0);
		assert_int_equal(kvt_region_recall(&rg, &geo, sel, R, &ws[0], view[0], view_n[0],
						   load[0], &n_load[0], &tally[0]),
				 0);
		assert_int_equal(err, 0);
		assert_int_equal(n_load[1], n_load[0]);
		assert_memory_equal(slot[0], slot[1], sizeof(slot[0]));
		assert_memory_equal(key[0], key[1], sizeof(key[0]));
		assert_memory_equal(bucket[0], bucket[1], sizeof(bucket[0]));
		assert_int_equal(ws[0].total, ws[1].total);
		assert_int_equal(ws[0].step, ws[1].step);
		assert_int_equal(ws[0].cur, ws[1].cur);
	}
	assert_int_equal(tally[0].hits, H * R); /* the second call */
}

static void test_region_ws_restart(void **state)
{
	(void)state;
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		kemu_set_schedule(mode);
		ws_restart_case();
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
}

/* The free-frame stack, the stale flag and a clear's freed frames on three small regions, worked
   out by hand. Every slot stays empty (rank = index), so each drop takes slot 0 and moves the
   last slot into it. Region 0 and 1 keep frames, region 2 none. */
static void frames_case(void)
{
	enum { H = 2, R = 3, CAP = 8, C = 0xa5a5a5a5u };
	static struct kvt_region_slot slot[3][CAP];
	static struct kvt_region_key key[3][4 * H];
	uint32_t frame[2][CAP], n_slots[3] = {0}, clock[3] = {0}, view[3][H * R], view_n[3][H];
	uint32_t stale[3] = {0, 1, 0}, stack[6] = {10, 11, 12, 13, 14, 99}, in_off[3] = {5, 2, 0};
	uint32_t want[3] = {3, 2, 6}, k[3] = {1, 1, 1}, off[3] = {0, 1, 2}, freed[8], gone[3];
	uint32_t view_was[3][H * R], view_n_was[3][H];
	struct kvt_gpu_region d[3];

	memset(slot, 0, sizeof(slot));
	memset(key, 0, sizeof(key));
	memset(frame, 0xee, sizeof(frame));
	for (uint32_t i = 0; i < 3; i++)
		d[i] = (struct kvt_gpu_region){.slot = slot[i],
					       .key = key[i],
					       .clock = &clock[i],
					       .n_slots = &n_slots[i],
					       .frame = i < 2 ? frame[i] : NULL,
					       .view = view[i],
					       .view_n = view_n[i],
					       .stale = &stale[i],
					       .n_heads = H,
					       .r = R,
					       .lbt = 2,
					       .cap_blocks = 4};
	/* a stack without offsets, offsets without a stack: nothing done */
	assert_int_equal(kvt_gpu_region_grow(d, want, stack, NULL, 3, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_grow(d, want, NULL, in_off, 3, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(n_slots[0], 0);
	/* region 0 pops 14, 13, 12 for slots 0, 1, 2; region 1 then 11, 10; region 2 has no
	   frames: its offset (0) is not read */
	assert_int_equal(kvt_gpu_region_grow(d, want, stack, in_off, 3, NULL), 0);
	assert_int_equal(n_slots[0], 3);
	assert_int_equal(n_slots[1], 2);
	assert_int_equal(n_slots[2], 6);
	assert_int_equal(frame[0][0], 14);
	assert_int_equal(frame[0][1], 13);
	assert_int_equal(frame[0][2], 12);
	assert_int_equal(frame[0][3], 0xeeeeeeeeu);
	assert_int_equal(frame[1][0], 11);
	assert_int_equal(frame[1][1], 10);
	assert_int_equal(frame[1][2], 0xeeeeeeeeu);
	assert_int_equal(stack[5], 99);

	/* One drop each. Region 0's view names only its last slot (2, head 1), which moves into
	   slot 0: stale. Region 1's view is empty, its flag set before: it stays set. Region 2's
	   names slot 1 (the entries past view_n name 0 and 5): slot 0 dropped, 5 moved, stale
	   stays 0. */
	memset(view, 0, sizeof(view));
	memset(view_n, 0, sizeof(view_n));
	view[0][R] = 2;
	view_n[0][1] = 1;
	view[2][0] = 1;
	view[2][1] = 0;
	view[2][R] = 5;
	view_n[2][0] = 1;
	memcpy(view_was, view, sizeof(view));
	memcpy(view_n_was, view_n, sizeof(view_n));
	memset(freed, CANARY, sizeof(freed));
	assert_int_equal(kvt_gpu_region_drop(d, k, off, NULL, freed, gone, 3, NULL), 0);
	assert_int_equal(stale[0], 1);
	assert_int_equal(stale[1], 1);
	assert_int_equal(stale[2], 0);
	assert_int_equal(freed[0], 14);
	assert_int_equal(freed[1], 11);
	assert_int_equal(freed[2], 0); /* no frames: the slot */
	assert_int_equal(frame[0][0], 12);
	assert_int_equal(frame[1][0], 10);
	assert_memory_equal(view, view_was, sizeof(view));
	assert_memory_equal(view_n, view_n_was, sizeof(view_n));

	/* Region 2 (5 slots) again, its view naming slot 0 (head 1): the dropped slot, the last
	   (4) not named: stale. Region 0 (slots 0, 1: frames 12, 13) without a flag. */
	view[2][R] = 0;
	view_n[2][0] = 0;
	view_n[2][1] = 1;
	d[0].stale = NULL;
	stale[0] = 0;
	assert_int_equal(kvt_gpu_region_drop(d, k, NULL, NULL, NULL, NULL, 3, NULL), 0);
	assert_int_equal(stale[0], 0);
	assert_int_equal(stale[2], 1);
	assert_int_equal(frame[0][0], 13);
	assert_int_equal(n_slots[0], 1);
	assert_int_equal(n_slots[1], 0);
	assert_int_equal(n_slots[2], 4);

	/* Region 2 (4 slots), two drops, its view naming slot 2 (head 1, behind an entry past
	   the count): the first drop takes 0 and moves 3, the second takes 0 and moves 2 into it:
	   stale by the second drop's move only. */
	view[2][R] = 4;
	view[2][R + 1] = 2;
	view_n[2][1] = 2;
	stale[2] = 0;
	k[2] = 2;
	assert_int_equal(kvt_gpu_region_drop(&d[2], &k[2], NULL, NULL, NULL, NULL, 1, NULL), 0);
	assert_int_equal(stale[2], 1);
	assert_int_equal(n_slots[2], 2);

	/* A clear of the three: region 0's frame 13 at 1, region 2's slots 0 and 1 at 4 and 5,
	   region 1 (no slot) nothing; the rest untouched. Freed without offsets, offsets without
	   freed: nothing done. */
	off[0] = 1, off[1] = 3, off[2] = 4;
	memset(freed, CANARY, sizeof(freed));
	assert_int_equal(kvt_gpu_region_clear(d, gone, NULL, freed, 3, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_clear(d, gone, off, NULL, 3, NULL), KEMU_ERR_INVALID_VALUE);
	assert_int_equal(n_slots[0], 1);
	assert_int_equal(kvt_gpu_region_clear(d, gone, off, freed, 3, NULL), 0);
	{
		const uint32_t want_freed[8] = {C, 13, C, C, 0, 1, C, C};

		assert_memory_equal(freed, want_freed, sizeof(freed));
	}
	assert_int_equal(n_slots[0], 0);
	assert_int_equal(n_slots[2], 0);
	assert_int_equal(frame[0][0], 13); /* not touched */
}

static void test_region_frames(void **state)
{
	(void)state;
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		kemu_set_schedule(mode);
		frames_case();
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
}

static void test_region_invalid(void **state)
{
	struct kvt_gpu_region d = {0};
	uint32_t n = 1, out;

	(void)state;
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		kemu_set_schedule(mode);
		invalid_cases();
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
	/* the wrappers */
	assert_int_equal(kvt_gpu_region_recall(NULL, 1, NULL), KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_recall(NULL, 0, NULL), 0);
	assert_int_equal(kvt_gpu_region_recall_groups(&d, 1, NULL, &group_want[0], 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_recall_groups(&d, 1, &group_want[0], NULL, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_recall_groups(&d, 1, &group_want[0], &group_want[0],
						      0x80000000u, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_recall_groups(NULL, 0, NULL, NULL, 5, NULL), 0);
	assert_int_equal(kvt_gpu_region_grow(&d, NULL, NULL, NULL, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_grow(NULL, &n, NULL, NULL, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_drop(&d, NULL, NULL, NULL, NULL, NULL, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_drop(&d, &n, NULL, &out, NULL, NULL, 1, NULL),
			 KEMU_ERR_INVALID_VALUE); /* outputs without offsets */
	assert_int_equal(kvt_gpu_region_drop(&d, &n, NULL, NULL, &out, NULL, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_drop(NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL), 0);
	assert_int_equal(kvt_gpu_region_empty(&d, 1, NULL, NULL, 1, NULL), KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_clear(NULL, NULL, NULL, NULL, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_region_invalid),
		cmocka_unit_test(test_region_ws_restart),
		cmocka_unit_test(test_region_frames),
		cmocka_unit_test(test_region_random),
	};

	return cmocka_run_group_tests_name("region-emu", tests, NULL, NULL);
}
