/* SPDX-License-Identifier: MIT */
/*
 * The token rows of an attention table's row (struct kvt_attn_desc, policy.h), shared by the
 * host's batched attention (policy/attend.c) and the GPU's (policy/attend.cu), so that both
 * walk the same tokens in the same order.
 */
#ifndef KVT_ATTN_ROW_H
#define KVT_ATTN_ROW_H

#include <stdint.h>

#include "dtype_bits.h"
#include "policy.h"

/* Token t of row r's list (resident slots, then the recalled blocks' rows): its K row's
   address, or 0 when it is skipped (a recalled row past its block's tokens or marked
   resident). */
static inline KVT_HD uint64_t kvt_attn_row(const struct kvt_attn_desc *d, uint32_t r, uint64_t t)
{
	uint32_t bt = d->block_tokens, nt = d->n_tokens[r], row;
	uint64_t blk;

	if (t < nt) {
		blk = d->frames[(size_t)r * d->max_frames + t / bt];
		row = (uint32_t)(t % bt);
	} else {
		size_t x = (size_t)r * d->max_recall + (t - nt) / bt;

		row = (uint32_t)((t - nt) % bt);
		if (row >= d->recall_tokens[x] || ((d->recall_skip[x] >> row) & 1))
			return 0;
		blk = d->recall[x];
	}
	return d->pool + blk * d->block_bytes + (uint64_t)row * d->row_bytes;
}

#endif /* KVT_ATTN_ROW_H */
