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

/* Whether row r is a member's at or past *n_batch (a padding row: no token, no output). */
static inline KVT_HD int kvt_attn_padding(const struct kvt_attn_desc *d, uint32_t r)
{
	return d->n_batch && r / d->n_kv_heads >= *d->n_batch;
}

/* Row r's resident token count, clamped to its max_frames blocks. */
static inline KVT_HD uint32_t kvt_attn_resident(const struct kvt_attn_desc *d, uint32_t r)
{
	uint64_t nt = d->n_tokens[r], most = (uint64_t)d->max_frames * d->block_tokens;

	return (uint32_t)(nt < most ? nt : most);
}

/* The length of row r's token list (resident slots, then block_tokens per recalled block, at
   most max_recall of them); 0 for a padding row. */
static inline KVT_HD uint64_t kvt_attn_count(const struct kvt_attn_desc *d, uint32_t r)
{
	uint32_t nr = d->n_recall[r];

	if (kvt_attn_padding(d, r))
		return 0;
	nr = nr < d->max_recall ? nr : d->max_recall;
	return kvt_attn_resident(d, r) + (uint64_t)nr * d->block_tokens;
}

/* Row `row` of block j of row r's resident frames (resident) or of its recalled blocks: its K
   row's address, or 0 when it is skipped (a recalled row past its block's tokens or marked
   resident, a block outside the pool). */
static inline KVT_HD uint64_t kvt_attn_block_row(const struct kvt_attn_desc *d, uint32_t r,
						 int resident, uint64_t j, uint32_t row)
{
	uint64_t blk;

	if (resident) {
		blk = d->frames[(size_t)r * d->max_frames + j];
	} else {
		size_t x = (size_t)r * d->max_recall + j;

		if (row >= d->recall_tokens[x] || ((d->recall_skip[x] >> row) & 1))
			return 0;
		blk = d->recall[x];
	}
	if (blk >= d->pool_blocks)
		return 0;
	return d->pool + blk * d->block_bytes + (uint64_t)row * d->row_bytes;
}

/* Token t < kvt_attn_count(d, r) of row r's list: its K row's address, or 0 when it is skipped
   (kvt_attn_block_row). */
static inline KVT_HD uint64_t kvt_attn_row(const struct kvt_attn_desc *d, uint32_t r, uint64_t t)
{
	uint32_t bt = d->block_tokens, nt = kvt_attn_resident(d, r);
	uint64_t u = t < nt ? t : t - nt; /* within the resident part or the recalled one */

	return kvt_attn_block_row(d, r, t < nt, u / bt, (uint32_t)(u % bt));
}

/* kvt_attn_row(d, r, t) where the block size is 1 << bsh and row r's resident count
   (kvt_attn_resident) is nt, in 32-bit arithmetic: the same address or 0, without the 64-bit
   division, for a table whose row lists are shorter than 2^32 tokens (the GPU kernel's loop). */
static inline KVT_HD uint64_t kvt_attn_row_p2(const struct kvt_attn_desc *d, uint32_t r, uint32_t t,
					      uint32_t nt, uint32_t bsh)
{
	uint32_t u = t < nt ? t : t - nt;

	return kvt_attn_block_row(d, r, t < nt, u >> bsh, u & (d->block_tokens - 1));
}

#endif /* KVT_ATTN_ROW_H */
