/* SPDX-License-Identifier: MIT */
/*
 * The prefix cache (manager/prefix.c): spans of prompts named by the engine's hash chains, whose
 * host block groups (every layer) are shared by reference count between the cache and the
 * sequences created on them. Calls base.c only (and the disk engine).
 *
 * Ownership of a host group is counted in m->px.href: 0 means one owner (a sequence's table, or
 * a span alone), n means n + 1 owners. kvt_host_release is the only way a group a prefix
 * sequence or a span holds goes back to the pool, so a shared group is freed by its last owner.
 * A shared group (href > 0) is never written (spans are whole, below every sequence's decode
 * position) and never spilled from a sequence's table; a span that no live sequence shares
 * (users == 0, on the idle list) is evicted as a whole: written to the spill file when there is
 * a disk tier, else dropped.
 */
#ifndef KVT_PREFIX_H
#define KVT_PREFIX_H

#include <stdbool.h>
#include <stdint.h>

#include "base.h"

/* One cached span: tokens [index * hash_tokens, (index + 1) * hash_tokens) of every prompt
   whose chain has `hash` at `index`. */
struct kvt_pspan {
	uint64_t hash;
	uint64_t ticket; /* latest save that wrote its blocks */
	uint32_t index, hash_tokens;
	uint32_t users; /* live sequences sharing it */
	uint32_t n_ids; /* n_layers * hash_tokens / block_tokens */
	bool on_disk;	/* ids are disk slots */
	bool bad;	/* a block failed its checksum: evicted once no sequence holds it */
	struct kvt_pspan *prev, *next; /* idle list (users == 0), least recently used first */
	uint32_t ids[];		       /* [n_layers][blocks]: host groups, or disk slots */
};

/* A sequence's prefix and chunk state (kvt_seq.px); NULL for a sequence created without a
   chain whose layers were each prefilled whole. */
struct kvt_seq_px {
	uint32_t prefix_tokens; /* shared at creation */
	uint32_t hash_tokens;
	uint32_t n_chain;	  /* hashes of its prompt */
	uint32_t n_spans;	  /* spans it shares: matched ones, then those it registered */
	uint64_t *chain;	  /* [n_chain] */
	struct kvt_pspan **spans; /* [n_chain] */
	uint32_t fill[];	  /* [n_layers]: positions in the host history of each layer not
				     prefilled yet (prefix and chunks) */
};

/* Sets up the cache (0 or -ENOMEM) and frees it (spans only: their groups and slots go with
   the arenas and the spill file). */
int kvt_prefix_init(struct kvt_manager *m);
void kvt_prefix_fini(struct kvt_manager *m);

/* A sequence's prefix state with room for a chain of n_chain hashes, zeroed (NULL without
   memory), and its release (NULL is a no-op; the spans' holds are the caller's). */
struct kvt_seq_px *kvt_seq_px_new(const struct kvt_manager *m, uint32_t n_chain);
void kvt_seq_px_free(struct kvt_seq_px *px);

/* Gives back one owner's hold on n host groups: a shared group loses an owner, the others go
   back to the pool. */
void kvt_host_release(struct kvt_manager *m, const uint32_t *ids, uint32_t n);

/* Whether host group g has more than one owner. */
static inline bool kvt_host_shared(const struct kvt_manager *m, uint32_t g)
{
	return m->px.href && m->px.href[g] != 0;
}

/* Host groups of the spans live sequences hold: shared, so no spill frees them. */
static inline uint64_t kvt_prefix_held_groups(const struct kvt_manager *m)
{
	return m->px.groups - m->px.groups_idle;
}

/* The length k of the run hashes[0..k) of cached spans of hash_tokens (at most max_spans). */
uint32_t kvt_prefix_run(const struct kvt_manager *m, const uint64_t *hashes, uint32_t n,
			uint32_t hash_tokens, uint32_t max_spans);

/* The span of hashes[i], cached (kvt_prefix_run found it). */
struct kvt_pspan *kvt_prefix_span(const struct kvt_manager *m, uint64_t hash);

/* Takes a user's hold on sp (off the idle list when it was idle). */
void kvt_prefix_hold(struct kvt_manager *m, struct kvt_pspan *sp);
/* Gives back the holds of spans[n - 1] .. spans[0] (idle ones go to the idle list, the latest
   of a chain first, so it is evicted first). */
void kvt_prefix_unhold(struct kvt_manager *m, struct kvt_pspan *const *spans, uint32_t n);

/* Host groups the spans on disk among sp[0..n) need to be read back. */
uint64_t kvt_prefix_disk_groups(struct kvt_pspan *const *sp, uint32_t n);

/* Reads back the spans on disk among sp[0..n) (held by the caller, which made the host room),
   in one batch. Returns how many leading spans are in the host tier afterwards; a span that
   failed stays on disk (-EIO, -ENOMEM) or is evicted once unheld (-EBADMSG: marked bad). */
uint32_t kvt_prefix_restore(struct kvt_manager *m, struct kvt_pspan *const *sp, uint32_t n);

/* Caches the spans of s's chain that it completed (every layer prefilled): for each hash past
   its match not cached yet whose blocks are all in the host tier, a span sharing them. Adds
   them to s->px->spans. Best effort: no memory means no span. */
void kvt_prefix_register(struct kvt_manager *m, struct kvt_seq *s);

/* Whether an idle span could give host groups back. */
bool kvt_prefix_idle(const struct kvt_manager *m);

/* Evicts idle spans in the host tier, least recently used first, until target host groups are
   free or none is left: each is written to the spill file when there is a disk tier (and
   dropped when that fails), else dropped. The caller waited for the device work queued on the
   host tier (kvt_dev_quiesce). */
void kvt_prefix_evict(struct kvt_manager *m, uint32_t target);

/* Drops every idle span in the spill file (room for spilling live sequences). Returns how many
   went. */
uint32_t kvt_prefix_drop_disk(struct kvt_manager *m);

/* Test hook: corrupts unit `unit` (layer unit / (hash_tokens / block_tokens), its block in the
   span) of the cached span of `hash` in the spill file, so its next read fails the CRC check.
   0, -ENOENT (no such span, not in the spill file, or unit out of range), -ENOTSUP (model
   backend). */
int kvt_prefix_corrupt_span(struct kvt_manager *m, uint64_t hash, uint32_t unit);

#endif /* KVT_PREFIX_H */
