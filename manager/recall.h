/* SPDX-License-Identifier: MIT */
/*
 * Dynamic recall (manager/recall.c): block metadata, the recall cache (a pool of frames shared
 * out as one region per (sequence, layer)), the recall views kvt_attend reads, and each
 * sequence's recall working set. Calls spill.c and base.c only.
 */
#ifndef KVT_RECALL_H
#define KVT_RECALL_H

#include <stdbool.h>
#include <stdint.h>

#include "base.h"
#include "region.h"

#define KVT_RC_MOVED 8u /* moved blocks a recall state lists (kvt_recall_group_moved) */

/* Recall state of one (sequence, layer), allocated when block metadata or recall first needs
   it: its block metadata and its region of the recall cache (policy/region.h), whose key table
   holds cap_blocks blocks. */
struct kvt_recall_layer {
	/* ---- What every recall call reads or writes of a member, in its first three lines
	   (rc_prefetch asks for these alone) ---- */
	struct kvt_region rg; /* slots [0, rg.n_slots) hold frames frame[slot] of the cache */
	struct kvt_ws ws;     /* its recall working set; bucket (in the slab: rc_bucket) NULL
				 until its first recall */
	struct kvt_seq *seq;  /* its sequence (set with layer by each call naming it) */
	uint64_t stamp;	      /* the latest recall call naming it (m->stamp) */
	uint64_t last_call;   /* rc.layer_calls[layer] at that call */
	uint64_t dn0_stamp;
	uint64_t cell_stamp;
	uint64_t view_stamp; /* on the device: the call that made its view (m->stamp) */
	uint64_t dver; /* the version of dmeta, dcap, dreg, dscap and dvcap (unique across regions:
			  rc.dver_seq), as a program descriptor written from them remembers it */
	uint32_t cap_slots; /* the slots the region may hold (on the device: its tables' room) */
	uint32_t dcap;	    /* (below, with dmeta) */
	uint32_t layer;
	uint32_t ws_counted; /* its working set as counted in the cache's sum_ws (0 unless live):
				n_kv_heads * r at its first call, then ws_next at each later one */
	uint32_t ws_next;    /* ws.total after its latest call, counted at its next call (a
				device keeping the working set hands it back a step late) */
	uint32_t view_cap;   /* (below, with view) */
	uint32_t dscap, dvcap, dview_r; /* (below, with dreg) */
	uint32_t dgroups;		/* blocks of the device group table written (those from it
					   on are written by the next call's program) */
	uint32_t n_moved;		/* entries of moved[] */
	uint32_t dn0;			/* rg.n_slots before the sizing of dn0_stamp changed it */
	uint32_t cell;	   /* its place in the call's program (cell_stamp: that call) */
	uint32_t lcell;	   /* with in_lane: its cell in its layer's lane */
	bool tk_ready;	   /* rg.key[].tk counted from the layer's top-K (at its first recall) */
	bool dtk;	   /* the top-K counts are on the device */
	bool dirty;	   /* the host copies are older than the device's state */
	bool in_lane;	   /* on the device: rg.clock, ws (its scalars and buckets) and ws_next
			      are those of cell lcell of lane[layer]'s pinned buffer, which its
			      latest call read back there, until rc_sync copies them here */
	bool view_failed;  /* the latest recall naming it failed: its view reads as stale */
	bool view_bad_sel; /* ... because the caller's device selection named a block past the
			      layer's history (kvt_recall_device_blocks) */
	/* ---- The rest: read when a sizing changes the region, by a read-back, or by the host's
	   own calls ---- */
	uint64_t drop_stamp, grow_stamp; /* the latest sizing it dropped, grew in (m->stamp) */
	uint32_t drop_tag;		 /* its index in rc.drop in that sizing */
	/* Device copy, on a backend with device metadata (m->dev_meta), instead of meta: the
	   metadata [dcap][H][2][head_dim] at dmeta, then the key table [dcap * H] (only its top-K
	   counts are read: kvt_gpu_quest) at kvt_dkey(); 0 until the layer's prefill. Decode
	   appends fold their keys in on the device, so it is always current. */
	uint64_t dmeta;
	/* On the device (m->dev_regions): the region's slots, frames and view live at dreg
	   (dreg_layout: slot [dscap], frame [dscap], view_n [H], view [H][dview_r of dvcap]),
	   written by the device's calls; dscap is 0 until dreg is. The host keeps the counts
	   (rg.n_slots, rg.clock) and the working set (ws), sends them with each call and reads
	   them back after it, into the lane's buffer (in_lane), where the next call of the
	   layer sends them from again when the region keeps its place; rg.slot, rg.key, frame,
	   view_n and view are copies made by kvt_recall_pull when dirty (rg.slot, rg.link and frame
	   allocated there, not as the region grows). */
	uint64_t dreg;
	uint32_t n_spilled; /* the layer's blocks in the spill file (counted at its creation,
			       then kept by the spill tier: kvt_recall_group_moved) */
	uint32_t moved[KVT_RC_MOVED]; /* blocks below dgroups that moved in the host tier since
					 the last program: it writes their entries again */
	/* A Quest call's floor (quest_need): per head, the blocks not fully resident among the
	   first qsettled, which lie wholly below the ring and do not change; NULL until its first
	   recall (allocated before ws.bucket) */
	uint32_t *qcand;
	uint32_t qsettled;
	uint8_t *meta;	     /* [block][head] metadata (policy.h), 2 * row_bytes each; NULL unless
				the manager keeps metadata */
	uint32_t *frame;     /* [hcap_slots] */
	uint32_t hcap_slots; /* the room of rg.slot, rg.link and frame: cap_slots on the host; on
				the device what the last read-back needed (kvt_recall_pull) */
	uint32_t meta_n;     /* tokens folded into meta: decode tokens are folded in at the next
				scoring, from the host history (so a decode append never waits for
				the device to hand its keys to the CPU) */
	/* the cache's list of regions holding frames, oldest first */
	struct kvt_recall_layer *lprev, *lnext;
	/* view of the latest recall call naming this (sequence, layer): per head view_n[h]
	   slots at [h * view_cap ...] (view_n allocated before view_cap is set) */
	uint32_t *view_n;
	uint32_t *view;
};

int kvt_recall_init(struct kvt_manager *m, uint64_t base, uint32_t n_frames);
void kvt_recall_fini(struct kvt_manager *m);

/* Whether head h's recall view of a layer must not be read: the call that made it failed.
   (Only the region's own calls change its slots, and each rewrites the view.) */
static inline bool kvt_view_stale(const struct kvt_recall_layer *rc)
{
	return rc && rc->view_failed;
}

/* Why a stale view (kvt_view_stale) is stale, for the error the reads of it return. */
static inline const char *kvt_view_stale_why(const struct kvt_recall_layer *rc)
{
	return rc->view_bad_sel ? "its selection named a block past its history (recall again)"
				: "a recalled block was evicted since (recall again)";
}

/* The cache frame of slot i of a layer's region. */
static inline uint64_t kvt_slot_frame(const struct kvt_manager *m,
				      const struct kvt_recall_layer *rc, uint32_t i)
{
	return m->rc.base + (uint64_t)rc->frame[i] * m->block_bytes;
}

/* Returns every region frame of s to the cache and empties its views (preempt, destroy). */
void kvt_recall_drop_seq(struct kvt_manager *m, struct kvt_seq *s);

/* Freezes the sums the sizing of the recall calls reads (each region's aim, target_of) as they
   stand: kvt_step_begin's, so that every call of a step sizes by the same figures. O(layers). */
void kvt_recall_freeze(struct kvt_manager *m);

/* Checks the recall cache's invariants: every frame is free (once) or held by one slot of one
   live region; the live list, the region count, n_held and sum_ws (its parts per layer and per
   sequence too) agree with the regions; each region passes kvt_region_check; each layer's
   top-K counts agree with its top-K positions, its count of spilled blocks is right, and so
   is every entry of its device group table (dev_regions) that did not move since; each live
   sequence has a slot of its own, the others are free once, and each recall state lies at
   its slot's place in its layer's slab, its working set's buckets at theirs. 0, or a negative code
   of the first broken one. For tests: O(frames + the regions' key tables + the histories' blocks
   and top-K positions). */
int kvt_recall_check(struct kvt_manager *m);
/* The device key table of a layer's recall state (dev_meta). */
static inline uint64_t kvt_dkey(const struct kvt_manager *m, const struct kvt_recall_layer *rc)
{
	return rc->dmeta + (uint64_t)rc->dcap * m->cfg.n_kv_heads * m->meta_bytes;
}

/* The device table of the layer's blocks' host groups (m->dev_regions), after the key table:
   [dcap] addresses the device reads the blocks from (0: not in host memory). */
static inline uint64_t kvt_dgroup(const struct kvt_manager *m, const struct kvt_recall_layer *rc)
{
	return kvt_dkey(m, rc) +
	       (uint64_t)rc->dcap * m->cfg.n_kv_heads * sizeof(struct kvt_region_key);
}

/* The entry of a device group table for a block whose group table entry is g: its host
   group's address, 0 when it is in the spill file. */
static inline uint64_t kvt_dgroup_val(const struct kvt_manager *m, uint32_t g)
{
	return g & KVT_SPILLED ? 0 : m->host_base + (uint64_t)g * m->group_bytes;
}

/* Whether block b is listed in rc's moved blocks. */
static inline bool kvt_recall_moved(const struct kvt_recall_layer *rc, uint32_t b)
{
	for (uint32_t i = 0; i < rc->n_moved; i++)
		if (rc->moved[i] == b)
			return true;
	return false;
}

/* Block b of the layer whose recall state is rc (may be NULL) moved in the host tier: spilled
   (no host group) or read back (a new one). The device group table learns it from the next
   call's program, which writes b's entry again: listed in moved, or, when the list is full,
   as every entry from the lowest block listed on. Whatever a program still queued reads was
   waited for before the host group was given up (kvt_dev_quiesce). */
static inline void kvt_recall_group_moved(struct kvt_recall_layer *rc, uint32_t b, bool spilled)
{
	if (!rc)
		return;
	if (b < rc->dgroups && !kvt_recall_moved(rc, b)) {
		if (rc->n_moved < KVT_RC_MOVED) {
			rc->moved[rc->n_moved++] = b;
		} else { /* full: from the lowest on */
			for (uint32_t i = 0; i < rc->n_moved; i++)
				b = rc->moved[i] < b ? rc->moved[i] : b;
			rc->dgroups = b;
			rc->n_moved = 0;
		}
	}
	if (spilled)
		rc->n_spilled++;
	else if (ALWAYS(rc->n_spilled > 0))
		rc->n_spilled--;
}

/* Applies the reads of every recall program still pending on the device (dev_regions: the
   counts, working sets, figures and stale views its calls left), waiting for them as needed,
   oldest first. Cheap when none is pending. 0, or the first error of a program that failed on
   the device (recorded; every later recall call fails). */
int kvt_recall_settle(struct kvt_manager *m);

/* Brings the host copies of a region kept on the device up to date (rg.slot, rg.key and its
   order list, frame, view_n, view): a synchronous read, after kvt_recall_settle. 0 or the
   error, recorded. */
int kvt_recall_pull(struct kvt_manager *m, struct kvt_recall_layer *rc);

/* rc's clock and working set (rg.clock, ws, ws_next) as its latest call left them, copied to
   the host's fields where the device path keeps them in its lane (in_lane), after settling
   every pending call. 0, or the settling's error, recorded (nothing copied). The reads of the
   views (kvt_recall_pull) do not need them. */
int kvt_recall_sync(struct kvt_manager *m, struct kvt_recall_layer *rc);

/* kvt_recall_pull of every region of rcs[0 .. n) (NULL entries skipped) at once: one wait for
   the device and one read of all the dirty ones (the backend's read_many where it has one).
   0, or the error, recorded: regions read before it may be clean, the others stay dirty. */
int kvt_recall_pull_many(struct kvt_manager *m, struct kvt_recall_layer *const *rcs, uint32_t n);

/* Frees one layer's recall state (NULL is a no-op), its device copy through the backend; its
   place in the layer's slab (rc_slot) is left zeroed for the next sequence given its slot. */
void kvt_recall_layer_free(struct kvt_manager *m, struct kvt_recall_layer *rc);
/* Frees the recall state of every layer of s (destroy). */
void kvt_recall_free_seq(struct kvt_manager *m, struct kvt_seq *s);
/* In the two calls below, ly is layer `layer` of s, or the copy of it that a prefill builds
   (its recall state, when it makes one, is s's for that layer all the same). */
/* Block metadata of a prefilled layer from the caller's K tensor ([H][L][D]): 0 or -ENOMEM. */
int kvt_meta_prefill(struct kvt_manager *m, const struct kvt_seq *s, uint32_t layer,
		     struct kvt_seq_layer *ly, const void *k, uint32_t L);
/* Makes room for the metadata of n_blocks blocks of ly (prefill, decode boundary); a device copy
   grows on stream (its contents copied there). 0 or -ENOMEM (nothing a caller sees changed;
   the backend's detail in m->be->err for a device copy). */
int kvt_meta_reserve(struct kvt_manager *m, const struct kvt_seq *s, uint32_t layer,
		     struct kvt_seq_layer *ly, uint32_t n_blocks, void *stream);
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
