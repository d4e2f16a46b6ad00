/* SPDX-License-Identifier: MIT */
/*
 * Recall regions: the recall cache of one (sequence, layer), a private "hot region" of frames,
 * each holding one block of one kv head. kvt_region_recall is the whole decision of one recall
 * call on one region: hit detection, duplicate removal, the resident skip, reloads of blocks
 * that grew, victim choice, the block -> slot map, the working set and the view. It is the CPU
 * reference every device version must match decision for decision (docs/design.md, "Recall
 * regions"): a device runs it with one CTA per region and compares equal, slot for slot.
 *
 * The rule, per call (clock c = the region's call count after this call):
 *  1. Lookups, in selection order (kv head h ascending, then j ascending): an entry is skipped
 *     when it names no block (KVT_REGION_NONE), when every token of its block is resident on
 *     the device (sink, ring and top-K ranges), or when an earlier entry of the same call named
 *     the same (block, head). Each other entry is a lookup with rank h * r + j: a hit when a
 *     slot holds its key with the block's current token count, a reload (same slot) when the
 *     block grew since, else a miss. Every slot used takes stamp c and the rank of its first
 *     use.
 *  2. Victims: the misses, in lookup order, take the slots not used by this call in ascending
 *     (stamp, rank) order; an empty slot has stamp 0 and rank equal to its index, so empty
 *     slots go first, lowest index first. A victim's old key is forgotten (an eviction).
 *  3. The view of head h lists the slots of its lookups in lookup order.
 *  4. The working set records each lookup's block at step n_tokens (kvt_ws_touch).
 * A region holding at least as many slots as the call's distinct lookups never runs out of
 * victims (the caller sizes it so).
 */
#ifndef KVT_REGION_H
#define KVT_REGION_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_REGION_NONE UINT32_MAX  /* no block (selection), no key (slot) */
#define KVT_REGION_MAX_SLOTS 65534u /* slot + 1 fits a uint16_t below the pending mark */
#define KVT_REGION_PENDING 0xffffu  /* key.slot of a miss inside a call */
#define KVT_REGION_VIEW_MISS 0x80000000u

/* Per (block, kv head) of the layer, at index block * n_heads + head. */
struct kvt_region_key {
	uint32_t touched; /* 1 + the step of its latest lookup, 0 = never (working set) */
	uint16_t slot;	  /* 1 + the slot holding it, 0 = none */
	uint8_t tk;	  /* top-K positions inside the block (resident test) */
	uint8_t pad;
};

/* One slot of the region: one device frame. */
struct kvt_region_slot {
	uint32_t key;	  /* block * n_heads + head, KVT_REGION_NONE when empty */
	uint32_t n_valid; /* tokens of the block when it was loaded */
	uint32_t stamp;	  /* clock of the call that last used it, 0 when empty */
	uint32_t rank;	  /* rank of its first use in that call; its index when empty */
};

/* A slot's neighbours in the order list (KVT_REGION_PENDING: none), side by side so that moving
   a slot reads one cache line of its own. */
struct kvt_region_link {
	uint16_t prev, next;
};

/* The region. slot and key are the state a device copy holds too; link/head/tail keep the
   slots in ascending (stamp, rank) order on the CPU, so a victim costs O(1). */
struct kvt_region {
	uint32_t n_slots; /* slots in use, <= KVT_REGION_MAX_SLOTS */
	uint32_t clock;	  /* calls made; every stamp <= clock */
	struct kvt_region_slot *slot;
	struct kvt_region_key *key; /* [cap_blocks * n_heads] */
	uint32_t cap_blocks;
	struct kvt_region_link *link; /* [n_slots]: the order list */
	uint16_t head, tail;
	/* 1 + the last empty slot (the empty ones lead the order list), KVT_REGION_PENDING when
	   none is empty, 0 when not known (found by a walk): a grow costs O(new slots). */
	uint16_t empty_end;
};

/* A sequence's recall working set over its last w steps: bucket[i] counts the blocks whose
   latest lookup happened at the step of bucket i (cur is step's bucket); total is their sum. */
struct kvt_ws {
	uint32_t *bucket; /* [w] */
	uint32_t w, step, cur, total;
};

/* Moves the window forward to step t (no-op when t <= step). */
void kvt_ws_advance(struct kvt_ws *ws, uint32_t t);
/* Records a lookup at step t of the block whose key has touched *touched. */
void kvt_ws_touch(struct kvt_ws *ws, uint32_t *touched, uint32_t t);

/* The layer a call works on. */
struct kvt_region_geom {
	uint32_t n_heads;  /* H */
	uint32_t lbt;	   /* log2 of the block's tokens */
	uint32_t n_tokens; /* N: the layer's tokens; the last block holds N - b * bt */
	uint32_t sink;	   /* positions [0, sink) are resident */
	uint32_t ring0;	   /* positions [ring0, N) are resident; ring0 >= sink (the ranges and
			      the top-K positions, which lie between them, never overlap) */
};

/* One load a call asks for: block `key` (its n_valid tokens) into slot `slot`, whose previous
   key was `old` (KVT_REGION_NONE: empty; equal to key: a reload of a block that grew). */
struct kvt_region_load {
	uint32_t slot, key, old, n_valid;
};

struct kvt_region_tally {
	uint32_t lookups, hits, loads, evictions;
};

/* Whether every one of the n_valid tokens of block b of head h is resident. */
static inline bool kvt_region_resident(const struct kvt_region *rg, const struct kvt_region_geom *g,
				       uint32_t h, uint32_t b, uint32_t n_valid)
{
	uint32_t p0 = b << g->lbt, end = p0 + n_valid, cnt = 0;

	if (p0 < g->sink)
		cnt += (end < g->sink ? end : g->sink) - p0;
	if (end > g->ring0)
		cnt += end - (p0 > g->ring0 ? p0 : g->ring0);
	return cnt + rg->key[(uint64_t)b * g->n_heads + h].tk == n_valid;
}

/* One recall call on the region (the rule above). sel is [n_heads][r] block indices, each
   below cap_blocks and below the layer's block count, or KVT_REGION_NONE. Writes per head h
   view_n[h] slots at view[h * r ...], the loads to queue at load[0 .. *n_load) (lookup order,
   at most n_heads * r), and adds to *t. ws may be NULL, or have no buckets (no working set
   kept). Returns 0, or -EOVERFLOW (the clock is spent: nothing changed), or -ENOSPC when the
   region lacks slots for the misses (the caller broke the sizing contract): the misses are
   dropped (not looked up, not in the views, though the working set counted them), the hits
   and reloads stand, and the reloads are in load[] and must be queued as on success. */
int kvt_region_recall(struct kvt_region *rg, const struct kvt_region_geom *g, const uint32_t *sel,
		      uint32_t r, struct kvt_ws *ws, uint32_t *view, uint32_t *view_n,
		      struct kvt_region_load *load, uint32_t *n_load, struct kvt_region_tally *t);

/* What kvt_region_recall_ahead prefetches while it works, head by head, so that the memory of
   the calls after it overlaps its lookups: the key entries that `keys`'s call of keys_sel will
   read, and the slots that `slots`'s call of slots_sel will read: all of them, with the order
   list, when the region holds at most 2 * n_heads * r slots (the call reads most of them),
   else those named by key entries prefetched earlier. Either region may be NULL; both have
   the call's n_heads and r. */
struct kvt_region_ahead {
	const struct kvt_region *keys, *slots;
	const uint32_t *keys_sel, *slots_sel;
};

/* kvt_region_recall, prefetching for the calls ahead (NULL: none) as it goes. The same
   decisions. */
int kvt_region_recall_ahead(struct kvt_region *rg, const struct kvt_region_geom *g,
			    const uint32_t *sel, uint32_t r, struct kvt_ws *ws, uint32_t *view,
			    uint32_t *view_n, struct kvt_region_load *load, uint32_t *n_load,
			    struct kvt_region_tally *t, const struct kvt_region_ahead *ahead);

/* Prefetches what kvt_region_recall of sel will read: with keys, the key table entries of its
   blocks; without, its slots and order list (as kvt_region_ahead's slots: whole, or those the
   entries name, fetched by an earlier call with keys). A batch calls it for the regions a few
   places ahead, so their misses overlap. */
void kvt_region_prefetch(const struct kvt_region *rg, uint32_t n_heads, const uint32_t *sel,
			 uint32_t r, bool keys);

/* Grows the region to n slots (<= KVT_REGION_MAX_SLOTS; the slot and link arrays hold n):
   the new slots are empty. No-op when n <= n_slots. */
void kvt_region_grow(struct kvt_region *rg, uint32_t n);

/* Drops one slot of a region (none when it holds none: *dropped and *freed are then
   KVT_REGION_NONE and it returns 0): the first in (stamp, rank) order (an empty
   one, lowest index first, else the least recently used). The last slot then moves into the
   dropped one's index, frame[] entries with it (frame may be NULL). Writes the dropped slot's
   index to *dropped and its frame (frame[dropped] before the move) to *freed; returns 1 when a
   key was forgotten, else 0. A device version makes the same moves. */
uint32_t kvt_region_drop(struct kvt_region *rg, uint32_t *frame, uint32_t *dropped,
			 uint32_t *freed);

/* Empties slot i (its key forgotten), e.g. after its load failed. Returns 1 when it held a
   key, else 0. */
uint32_t kvt_region_empty(struct kvt_region *rg, uint32_t i);

/* Drops every slot (the sequence lost its device tier): returns the count of keys forgotten. */
uint32_t kvt_region_clear(struct kvt_region *rg);

/* Checks every invariant of the region (map and slots agree, the order list is sorted and
   complete): 0, or a negative line-ish code of the first broken one. For tests. */
int kvt_region_check(const struct kvt_region *rg, uint32_t n_heads);

#ifdef __cplusplus
}
#endif

#endif /* KVT_REGION_H */
