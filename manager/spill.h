/* SPDX-License-Identifier: MIT */
/*
 * The disk tier in the manager (manager/spill.c): the host tier as a cache of a sequence's
 * history, spilling host block groups to the spill file and fetching back only the blocks a
 * call touches. Calls base.c only.
 */
#ifndef KVT_SPILL_H
#define KVT_SPILL_H

#include <stdint.h>

#include "base.h"
#include "disk.h"

/* What an entry of m->dio belongs to. */
struct kvt_spill_ref {
	struct kvt_seq *s;
	uint32_t layer, block;
	uint32_t group; /* fetch: the host group read into */
};

/* A spilled block a call needs back (m->want). */
struct kvt_want {
	struct kvt_seq *s;
	uint32_t layer, block;
	uint32_t slot; /* its disk slot */
};

/* Opens the disk tier when cfg.spill_dir is set (0 otherwise). 0 or -errno, logged. */
int kvt_spill_open(struct kvt_manager *m);
void kvt_spill_close(struct kvt_manager *m);

/* Makes `need` host groups free: first by evicting cached prefix spans no sequence holds (to
   the spill file, or dropped without a disk tier), then by spilling groups least recently
   used sequence first (smallest stamp; the sequences the call names carry the newest), never
   a group pinned by the call at hand (kvt_spill_want) nor one shared with the prefix cache,
   and each layer's last group only when the others do not suffice; a full spill file first
   drops the prefix spans it holds. 0, -ENOMEM, or the error of waiting for queued device work
   first (kvt_dev_quiesce; nothing spilled). Without a disk tier it only evicts spans. */
int kvt_spill_room(struct kvt_manager *m, uint32_t need);

/* Room for n more entries in the call's list of wanted blocks, so that kvt_spill_want cannot
   fail for them. 0 or -ENOMEM. */
int kvt_spill_want_reserve(struct kvt_manager *m, uint32_t n);

/* The call at hand (m->stamp, which it has advanced) needs block `block` of (s, layer) in the
   host tier: a host group is pinned (no spill of this call takes it), a spilled one is listed
   for kvt_spill_fetch_wanted. Nothing without a disk tier. 0, or -ENOMEM when the list could
   not grow (never after kvt_spill_want_reserve made room), which kvt_spill_fetch_wanted then
   reports: callers need not check. */
int kvt_spill_want(struct kvt_manager *m, struct kvt_seq *s, uint32_t layer, uint32_t block);

/* kvt_spill_want of the blocks of (s, layer) holding positions [from, to). */
void kvt_spill_want_range(struct kvt_manager *m, struct kvt_seq *s, uint32_t layer, uint32_t from,
			  uint32_t to);

/* Reads the blocks the call at hand listed back in one batched read (spilling others to make
   room) and pins them, then empties the list. Blocks read are placed even when others fail.
   The number of groups read, or a negative errno recorded with `what` as the prefix: -ENOMEM
   (the list could not grow, or the host tier cannot hold them beside the call's pinned
   groups), -EIO (a read failed: those blocks stay on disk), -EBADMSG (a CRC-32C mismatch:
   that sequence is lost), or a device wait's error. */
int kvt_spill_fetch_wanted(struct kvt_manager *m, const char *what);

/* Returns every host group and disk slot of a layer's table (destroy). */
void kvt_spill_release_layer(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly);
/* Test hook: corrupts the spilled group of (seq, layer, block index) in the file, so its next
   read fails the CRC check. 0, -ENOENT (not spilled), -ENOTSUP (model backend). */
int kvt_disk_corrupt_block(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t block);

#endif /* KVT_SPILL_H */
