/* SPDX-License-Identifier: MIT */
/*
 * Dynamic recall (manager/recall.c): block metadata, the shared recall cache, the recall views
 * kvt_attend reads, and each sequence's recall working set. Calls spill.c and base.c only.
 */
#ifndef KVT_RECALL_H
#define KVT_RECALL_H

#include <stdbool.h>
#include <stdint.h>

#include "base.h"

/* Per (block, kv head) of a sequence layer: what the recall path reads together. */
struct kvt_rc_slot {
	uint32_t entry;	  /* recall cache entry holding the block, or KVT_NO_ENTRY */
	uint32_t touched; /* 1 + the step of its latest recall, 0 = never (working set) */
};

/* Recall state of one (sequence, layer), allocated when block metadata or recall first needs
   it. Tables are indexed [block][kv head], block < cap_blocks. */
struct kvt_recall_layer {
	uint8_t *meta; /* [block][head] metadata (policy.h), 2 * row_bytes each; NULL unless
			  the manager keeps metadata */
	struct kvt_rc_slot *slot; /* [block][head] */
	uint8_t *tk;		  /* [block][head] top-K positions inside the block */
	uint32_t cap_blocks;
	uint32_t meta_n; /* tokens folded into meta: decode tokens are folded in at the next
			    scoring, from the host history (so a decode append never waits for
			    the device to hand its keys to the CPU) */
	bool tk_ready;	 /* tk counted from the layer's top-K (done at its first recall) */
	/* view of the latest recall call naming this (sequence, layer): per head view_n[h]
	   entries (cache entry id, generation) at [h * view_cap ...] */
	uint32_t view_cap;
	bool view_failed; /* the latest recall naming it failed: its view reads as stale */
	uint32_t *view_n;
	uint32_t *view_ent, *view_gen;
};

/* One frame of the shared recall cache (single block of one (sequence, layer, kv head)). */
struct kvt_rc_entry {
	struct kvt_seq *owner; /* NULL: free */
	uint64_t pin;	       /* recall call that last used it: never evicted by that call */
	uint32_t layer, head, block;
	uint32_t n_valid;	 /* tokens of the block when loaded */
	uint32_t gen;		 /* bumped whenever the frame changes hands */
	uint32_t next;		 /* free list */
	uint32_t s_prev, s_next; /* the owner's list of entries */
};

/* One use of a cache entry in the LRU queue (struct kvt_recall_cache in base.h). */
struct kvt_rc_rec {
	uint32_t id, tick;
};

int kvt_recall_init(struct kvt_manager *m, uint64_t base, uint32_t n_frames);
void kvt_recall_fini(struct kvt_manager *m);

/* Whether a frame of head h's recall view of a layer went to another block since the view was
   made (the view must not be read). */
static inline bool kvt_view_stale(const struct kvt_manager *m, const struct kvt_recall_layer *rc,
				  uint32_t h)
{
	if (rc && rc->view_failed)
		return true;
	for (uint32_t i = 0; rc && rc->view_n && i < rc->view_n[h]; i++) {
		size_t at = (size_t)h * rc->view_cap + i;

		if (m->rc.e[rc->view_ent[at]].gen != rc->view_gen[at])
			return true;
	}
	return false;
}

/* Drops every recall cache entry of s and its views (preempt, destroy). */
void kvt_recall_drop_seq(struct kvt_manager *m, struct kvt_seq *s);
/* Frees one layer's recall state (NULL is a no-op). */
void kvt_recall_layer_free(struct kvt_recall_layer *rc);
/* Frees the recall state of every layer of s (destroy). */
void kvt_recall_free_seq(struct kvt_seq *s, uint32_t n_layers);
/* Block metadata of a prefilled layer from the caller's K tensor ([H][L][D]): 0 or -ENOMEM. */
int kvt_meta_prefill(struct kvt_manager *m, struct kvt_seq_layer *ly, const void *k, uint32_t L);
/* Makes room for the metadata of block index b of ly (decode boundary): 0 or -ENOMEM. */
int kvt_meta_reserve(struct kvt_manager *m, struct kvt_seq_layer *ly, uint32_t n_blocks);
/* Brings the block metadata of (s, layer ly) up to its tokens: folds the keys of positions
   [meta_n, n_tokens) in from the host history, after waiting for its saves; the caller has
   brought those blocks into the host tier (kvt_spill_want). 0 or the error, recorded. */
int kvt_meta_catch_up(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly);
/* Recall working set of s advanced to step t (frames recalled in the last w steps); the
   frames of step t alone in *step_frames. */
uint32_t kvt_ws_frames(struct kvt_manager *m, struct kvt_seq *s, uint32_t t, uint32_t *step_frames);
/* Resident mask of block b (bit i: position b * bt + i resident on the device), and whether
   it covers all n_valid tokens. */
uint64_t kvt_block_resident(const struct kvt_manager *m, const struct kvt_seq *s,
			    const struct kvt_seq_layer *ly, uint32_t h, uint32_t b,
			    uint32_t n_valid);

#endif /* KVT_RECALL_H */
