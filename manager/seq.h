/* SPDX-License-Identifier: MIT */
/*
 * Sequences and the SnapStream data path (manager/seq.c), beyond the public API. Calls
 * recall.c, spill.c and base.c.
 */
#ifndef KVT_SEQ_H
#define KVT_SEQ_H

#include <stdint.h>

#include "base.h"

/* Reads one token of (seq, layer, head) from the host history even when it is resident, so
   tests can check both tiers hold the same bytes. Same errors as kvt_seq_read_token. */
int kvt_seq_read_token_host(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t head,
			    uint32_t pos, void *k_out, void *v_out);

#endif /* KVT_SEQ_H */
