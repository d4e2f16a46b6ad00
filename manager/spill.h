/* SPDX-License-Identifier: MIT */
/*
 * The disk tier in the manager (manager/spill.c): spilling host block groups to the spill
 * file and fetching them back. Calls base.c only.
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

/* Opens the disk tier when cfg.spill_dir is set (0 otherwise). 0 or -errno, logged. */
int kvt_spill_open(struct kvt_manager *m);
void kvt_spill_close(struct kvt_manager *m);
/* Makes `need` host groups free, spilling the least recently used sequences whose stamp is not
   m->stamp (the caller stamps the sequences its call names). 0, -ENOMEM, or the error of
   waiting for queued device work first (kvt_dev_quiesce; nothing spilled). */
int kvt_spill_room(struct kvt_manager *m, uint32_t need);
/* Brings back every spilled group of v[0..n) (stamped by the caller, none lost): the number of
   groups read, or a negative errno recorded with `what` as the prefix (see kvt_seq_fetch). */
int kvt_spill_fetch(struct kvt_manager *m, struct kvt_seq *const *v, uint32_t n, const char *what);
/* kvt_spill_fetch of one sequence (stamped here) when it has anything on disk: 0 or the
   error, recorded. */
int kvt_spill_fetch_seq(struct kvt_manager *m, struct kvt_seq *s, const char *what);
/* Returns every host group and disk slot of a layer's table (destroy). */
void kvt_spill_release_layer(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly);
/* Test hook: corrupts the spilled group of (seq, layer, block index) in the file, so its next
   read fails the CRC check. 0, -ENOENT (not spilled), -ENOTSUP (model backend). */
int kvt_disk_corrupt_block(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t block);

#endif /* KVT_SPILL_H */
