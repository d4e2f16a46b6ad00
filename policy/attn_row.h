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

/* Token t < kvt_attn_count(d, r) of row r's list: its K row's address, or 0 when it is skipped
   (a recalled row past its block's tokens or marked resident, a block outside the pool). */
static inline KVT_HD uint64_t kvt_attn_row(const struct kvt_attn_desc *d, uint32_t r, uint64_t t)
{
	uint32_t bt = d->block_tokens, nt = kvt_attn_resident(d, r), row;
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
	if (blk >= d->pool_blocks)
		return 0;
	return d->pool + blk * d->block_bytes + (uint64_t)row * d->row_bytes;
}

/* kvt_attn_row(d, r, t) where the block size is 1 << bsh and row r's resident count
   (kvt_attn_resident) is nt, in 32-bit arithmetic: the same address or 0, without the 64-bit
   division, for a table whose row lists are shorter than 2^32 tokens (the GPU kernel's loop). */
static inline KVT_HD uint64_t kvt_attn_row_p2(const struct kvt_attn_desc *d, uint32_t r, uint32_t t,
					      uint32_t nt, uint32_t bsh)
{
	uint32_t bm = d->block_tokens - 1, row;
	uint64_t blk;

	if (t < nt) {
		blk = d->frames[(size_t)r * d->max_frames + (t >> bsh)];
		row = t & bm;
	} else {
		size_t x = (size_t)r * d->max_recall + ((t - nt) >> bsh);

		row = (t - nt) & bm;
		if (row >= d->recall_tokens[x] || ((d->recall_skip[x] >> row) & 1))
			return 0;
		blk = d->recall[x];
	}
	if (blk >= d->pool_blocks)
		return 0;
	return d->pool + blk * d->block_bytes + (uint64_t)row * d->row_bytes;
}

#endif /* KVT_ATTN_ROW_H */
