/* SPDX-License-Identifier: MIT */
/*
 * The manager's internal state. A sequence keeps, per layer, three small tables: the device
 * frame groups of its resident slot space, the host block groups of its history, and its top-K
 * positions per kv head. A group is one block per kv head, contiguous, so heads share every
 * table entry and decode bookkeeping is O(1) per (sequence, layer).
 *
 * Resident slot space of one (sequence, layer, kv head), in slot units of one token row:
 *   [0, sink)                       sink tokens (position = slot)
 *   [sink, sink + recent)           the ring (DESIGN.md ring rule)
 *   [sink + recent, + valid_topk)   top-K tokens, ascending positions, fixed after prefill
 * Slot s lives in frame group frames[s / block_tokens] at row s % block_tokens.
 */
#ifndef KVT_INTERNAL_H
#define KVT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "kvtier.h"
#include "policy.h"
#include "pool.h"

/* One cache line per layer (the sequence is allocated 64-byte aligned): a decode call touches
   exactly one line of each sequence's layer state. */
struct kvt_seq_layer {
	_Alignas(64) uint32_t n_tokens; /* tokens written; 0 = not prefilled */
	uint32_t ring_slot;		/* slot the next token goes to */
	/* Cursors for decode, so a token costs no table lookup except at a frame or block
	   boundary: head 0's K row address of ring_slot, and of position n_tokens in the host
	   history (0 when that position starts a block not allocated yet). */
	uint64_t dev_next, host_next;
	uint32_t n_groups, cap_groups;
	uint32_t *groups; /* host group of block index b, b < n_groups */
	uint32_t *frames; /* device frame group of frame index f, f < seq->n_frames */
	int32_t *topk;	  /* [n_kv_heads][seq->valid_topk] ascending */
};

struct kvt_seq {
	uint64_t id;
	uint64_t stamp;	      /* last decode call that named it (duplicate detection) */
	uint64_t save_ticket; /* latest save that wrote into its host blocks */
	uint32_t prompt_tokens;
	uint32_t valid_topk; /* same for every layer and head: depends on the prompt length */
	uint32_t n_frames;   /* frame groups per layer */
	uint32_t layers_prefilled;
	struct kvt_seq_layer layers[];
};

/* Open-addressing map from sequence id to sequence, linear probing with backward-shift
   deletion (no tombstones), at most half full; key and value share a slot so a lookup touches
   one cache line. */
struct kvt_seqmap_slot {
	uint64_t key;
	struct kvt_seq *val; /* NULL = empty slot */
};

struct kvt_seqmap {
	struct kvt_seqmap_slot *slots;
	uint32_t cap, n; /* cap is a power of two */
	uint32_t shift;	 /* 64 - log2(cap) */
};

int kvt_seqmap_init(struct kvt_seqmap *sm);
void kvt_seqmap_fini(struct kvt_seqmap *sm);
struct kvt_seq *kvt_seqmap_get(const struct kvt_seqmap *sm, uint64_t id);
/* Grows as needed: 0 or -ENOMEM (then nothing changed). id must not be present. */
int kvt_seqmap_put(struct kvt_seqmap *sm, struct kvt_seq *s);
void kvt_seqmap_del(struct kvt_seqmap *sm, uint64_t id);

struct kvt_manager {
	struct kvt_config cfg;
	const struct kvt_backend_ops *ops;
	struct kvt_be *be;

	/* derived geometry */
	uint32_t esize, row_bytes, group_q, lbt, slots_sr; /* slots_sr = sink + recent */
	uint64_t block_bytes, group_bytes, v_offset;

	uint64_t dev_base, host_base, dev_arena_bytes, host_arena_bytes;
	bool payload, cpu_device; /* bytes exist; device tier CPU-readable */
	struct kvt_pool dev, host;
	struct kvt_seqmap seqs;
	uint64_t stamp;

	/* scratch reused across calls (never shrinks) */
	struct kvt_xfer *xf;
	uint32_t xf_cap;
	struct kvt_append *ap;
	uint32_t ap_cap;
	uint32_t *fresh; /* batch indices that start a new host block */
	uint32_t fresh_cap;
	struct kvt_seq **batch;
	uint32_t batch_cap;
	void *sel_scratch;
	size_t sel_scratch_bytes;
	struct kvt_attend_rows *segs;
	uint32_t segs_cap;

	struct kvt_stats st;
	char err[256];
};

/* Records the detail of a failure for kvt_manager_last_error and logs it at debug level;
   returns err. */
int kvt_fail(struct kvt_manager *m, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Logging (manager/log.c). */
bool kvt_log_enabled(enum kvt_log_level level);
void kvt_log(enum kvt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Creates a manager on an explicit backend, bypassing the public backend choice (benchmarks
   use the null backend this way). */
int kvt_manager_create_with(const struct kvt_config *cfg, const struct kvt_backend_ops *ops,
			    struct kvt_manager **out);

/* Reads one token of (seq, layer, head) from the host history even when it is resident, so
   tests can check both tiers hold the same bytes. Same errors as kvt_seq_read_token. */
int kvt_seq_read_token_host(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t head,
			    uint32_t pos, void *k_out, void *v_out);

#endif /* KVT_INTERNAL_H */
