/* SPDX-License-Identifier: MIT */
/*
 * GPU versions of the policy (policy/snapkv.cu, recall.cu, attend.cu, region.cu,
 * region_gather.cu, quest.cu), called by the CUDA backend plugin. Each matches its CPU
 * reference in policy.h or region.h on the same inputs: SnapKV selection identical up to ties
 * at the cutoff (f32 sums in another order), block metadata bit-exact, attention within f32
 * tolerance, recall regions and the Quest selection decision for decision.
 *
 * Every function queues its work on `stream` (a cudaStream_t; NULL = the legacy default
 * stream), does not synchronise, allocates nothing, and returns a cudaError_t value as int
 * (0 = cudaSuccess). Pointers are device pointers unless said otherwise.
 */
#ifndef KVT_POLICY_GPU_H
#define KVT_POLICY_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "policy.h"
#include "region.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of device scratch kvt_gpu_snapkv_select and _scores need for p: 0 when L <= L_obs or
   p is invalid. Needs a current CUDA device (CUB's size queries read it); 0 if that fails, and
   the call then returns CUB's error. Limits beyond the CPU version's (cudaErrorInvalidValue):
   n_kv_heads <= 65535, n_q_heads * L_obs and n_heads * g_count <= INT32_MAX. Build without
   --use_fast_math or -ftz: the f32 expf, division and subnormals assume the defaults. */
size_t kvt_gpu_snapkv_scratch_bytes(const struct kvt_snapkv *p);

/* SnapKV selection (docs/design.md "SnapKV selection", as kvt_snapkv_select): k [n_kv_heads][L]
   [head_dim] and q_obs [n_q_heads][L_obs][head_dim] of p->dtype; writes kvt_snapkv_count(p)
   positions per kv head, ascending, to out[h * count ...] (device int32). Ties of the pooled
   score go to the lower position; NaN ranks below every number. scratch: device memory of at
   least kvt_gpu_snapkv_scratch_bytes(p), 256-byte aligned. */
int kvt_gpu_snapkv_select(const struct kvt_snapkv *p, const void *k, const void *q_obs,
			  int32_t *out, void *scratch, size_t scratch_bytes, void *stream);

/* Pooled votes of steps 1-3 for every kv head: pooled [n_kv_heads][L - L_obs] f32 (nothing
   when L <= L_obs). scratch as above. For tests comparing scores with kvt_snapkv_scores. */
int kvt_gpu_snapkv_scores(const struct kvt_snapkv *p, const void *k, const void *q_obs,
			  float *pooled, void *scratch, size_t scratch_bytes, void *stream);

/* Block metadata of a prefilled layer: k [n_heads][L][head_dim] of dt; writes meta
   [nb][n_heads][2][head_dim] of dt (nb = ceil(L / block_tokens)), entry (b, h) exactly as
   kvt_meta_build over the rows [b * block_tokens, min(L, (b + 1) * block_tokens)) of head h. */
int kvt_gpu_block_meta(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t L,
		       uint32_t block_tokens, const void *k, void *meta, void *stream);

/* kvt_gpu_block_meta's argument checks, which its CPU stand-in (tests/cuda_emu) shares: 1 =
   launch, 0 = nothing to do (cudaSuccess), -1 = cudaErrorInvalidValue. */
static inline int kvt_gpu_block_meta_args(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
					  uint32_t L, uint32_t block_tokens, const void *k,
					  const void *meta)
{
	size_t nb;

	if (!kvt_dtype_size(dt) || block_tokens == 0)
		return -1;
	if (L == 0 || n_heads == 0 || head_dim == 0)
		return 0; /* no block: nothing to write */
	if (!k || !meta)
		return -1;
	nb = ((size_t)L + block_tokens - 1) / block_tokens;
	return nb * n_heads > SIZE_MAX / 4 / head_dim ? -1 : 1; /* past any address space */
}

/* Folds one decode token's key rows per sequence into block metadata, as kvt_meta_init (a token
   that starts its block) or kvt_meta_add per kv head: k [n][n_heads][head_dim] of dt (the
   append's key tensor); meta[i] (a device array of n) is the device address of sequence i's
   entry (block, kv head 0) of its metadata ([n_heads][2][head_dim] of dt from there, head h at
   + h * 2 * head_dim elements), with bit 0 set when the token starts the block (init); 0 = no
   metadata: sequence i is skipped. Entries of different sequences must not overlap. Bit-exact
   with the reference, NaN, infinities, signed zeros and subnormals included. */
int kvt_gpu_meta_fold(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t n,
		      const void *k, const uint64_t *meta, void *stream);

/* kvt_gpu_meta_fold's argument checks, shared as kvt_gpu_block_meta_args's. */
static inline int kvt_gpu_meta_fold_args(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads,
					 uint32_t n, const void *k, const uint64_t *meta)
{
	if (!kvt_dtype_size(dt))
		return -1;
	if (n == 0 || n_heads == 0 || head_dim == 0)
		return 0; /* no row: nothing to fold */
	if (!k || !meta)
		return -1;
	return (uint64_t)n * n_heads > SIZE_MAX / 4 / head_dim ? -1 : 1;
}

/* Reference decode attention for n_heads kv heads at once (as kvt_attend_rows per head): head
   h uses segments seg[seg_off[h] .. seg_off[h + 1]) (device arrays; the segments' k and v are
   device addresses), q [n_heads * g_count][head_dim] f32 and out likewise. A head without
   rows gets zeros. */
int kvt_gpu_attend(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t g_count,
		   const struct kvt_attend_rows *seg, const uint32_t *seg_off, const float *q,
		   float *out, void *stream);

/* Query heads one CTA of kvt_gpu_attend_batch serves (a kv head's group is split in parts of
   at most this many), and the fewest tokens a split of a row gets. */
#define KVT_ATT_G 8u
#define KVT_ATT_SPLIT_MIN 256u

/* How many parts kvt_gpu_attend_batch splits each row's token list into (flash-decoding):
   enough CTAs to fill a GPU (about 1024) when the batch is small, no part under
   KVT_ATT_SPLIT_MIN tokens of the longest row, 1..64. */
static inline uint32_t kvt_gpu_attend_splits(uint64_t rows, uint32_t g_count, uint64_t max_tokens)
{
	uint64_t ctas = rows * ((g_count + KVT_ATT_G - 1) / KVT_ATT_G), s, most;

	if (!ctas || !max_tokens)
		return 1;
	s = (1024 + ctas - 1) / ctas;
	most = (max_tokens + KVT_ATT_SPLIT_MIN - 1) / KVT_ATT_SPLIT_MIN;
	s = s < most ? s : most;
	return s < 1 ? 1 : s > 64 ? 64 : (uint32_t)s;
}

/* Bytes of device scratch kvt_gpu_attend_batch needs: per (row, split, query head) the part's
   max logit, its sum and its head_dim weighted values, f32. */
static inline uint64_t kvt_gpu_attend_batch_scratch(uint64_t rows, uint32_t g_count,
						    uint32_t head_dim, uint32_t splits)
{
	return rows * splits * g_count * ((uint64_t)head_dim + 2) * sizeof(float);
}

/* Batched decode attention (kvt_attend_batch): every row of d (d->n * d->n_kv_heads, the
   tables in device memory) for its g_count query heads, within f32 tolerance of
   kvt_attend_table: q and out [n][n_kv_heads * g_count][head_dim] of dt, lse (NULL: not
   written) [n][n_kv_heads * g_count] f32. Each row's tokens are split in `splits` parts
   (kvt_gpu_attend_splits), each a CTA with an online softmax per query head, whose partial
   results (scratch: kvt_gpu_attend_batch_scratch bytes) a second kernel merges by their
   log-sum-exp. */
int kvt_gpu_attend_batch(enum kvt_dtype dt, struct kvt_attn_desc d, const void *q, void *out,
			 float *lse, float *scratch, uint32_t splits, void *stream);

/* ---- recall regions (policy/region.cu; the CPU reference is policy/region.h) ---- */

#define KVT_GPU_REGION_MAX_HEADS 256u /* n_heads of one region */

/* One region of a batch: its state (slot, key, clock, n_slots; frame where the caller keeps
   one), the sequence's working set, one call's selection and outputs, and the layer's geometry.
   The descriptors of a batch lie in device memory; every pointer is a device pointer. The
   regions of one launch must not share state (slot, key, clock, n_slots, frame, ws, outputs
   other than tally): one launch is one call on each region, as if the reference ran on each in
   turn. A working set shared by the layers of a sequence is shared across launches (stream
   order), not inside one. The slot count lives in device memory (*n_slots, the reference's
   kvt_region.n_slots): grow, drop and clear update it there, so a batch's descriptors stay
   valid from launch to launch. Grow, drop, empty and clear use slot, key, n_slots and frame
   only. */
struct kvt_gpu_region {
	struct kvt_region_slot *slot; /* [max slots the region may grow to] */
	struct kvt_region_key *key;   /* [cap_blocks * n_heads]; tk is input */
	uint32_t *clock;	      /* the region's calls made (kvt_region.clock) */
	uint32_t *n_slots;	      /* the slots in use (kvt_region.n_slots) */
	uint32_t *frame;	      /* [as slot]: the frame of each slot, which a drop moves with
					 its slot (kvt_region_drop's frame[]); NULL: none kept */
	struct kvt_ws *ws;	      /* the sequence's working set, bucket a device array; NULL,
					 or no bucket or w == 0: none kept */
	const uint32_t *sel;	      /* [n_heads][r] block ids or KVT_REGION_NONE */
	uint32_t *view;		      /* [n_heads][r]: view_n[h] slots at view[h * r ...] */
	uint32_t *view_n;	      /* [n_heads] */
	struct kvt_region_load *load; /* [n_heads * r]: *n_load loads, in lookup order */
	uint32_t *n_load;
	struct kvt_region_tally *tally; /* added to with atomics: regions may share one */
	int32_t *err;			/* the call's result (kvt_gpu_region_recall) */
	uint32_t *stale;		/* set to 1 by a drop that takes or moves a slot the view
					   names (kvt_gpu_region_drop); NULL: not checked */
	const uint64_t *group;		/* [cap_blocks]: device-accessible address of block b's
					   host group, 0 when not in DRAM (kvt_gpu_region_gather) */
	uint32_t n_heads, r;
	uint32_t lbt, n_tokens, sink, ring0; /* kvt_region_geom */
	uint32_t cap_blocks;
};

/* One kvt_region_recall on each of the n regions of rg (a device array), one CTA each, with the
   reference's decisions: the same loads in the same order, views, tallies, slots, key table
   (slot and touched), working set and clock. Writes each region's *err: 0; -ENOSPC (fewer free
   slots than misses: the misses are dropped, the hits and reloads stand and the reloads are in
   load[], to be queued, as the reference); -EOVERFLOW (clock at UINT32_MAX: *n_load = 0,
   nothing else written); -EINVAL (nothing but *n_load = 0 written) where the reference's
   contract is broken: n_heads above KVT_GPU_REGION_MAX_HEADS, *n_slots above
   KVT_REGION_MAX_SLOTS, lbt >= 32, n_heads * r or cap_blocks * n_heads above UINT32_MAX, ring0
   below sink; or (with view_n[] = 0 written too, the other fields within it) a block of sel
   at or past cap_blocks or past the layer's last block. Entries of
   view and load past view_n[h] and *n_load are scratch. */
int kvt_gpu_region_recall(const struct kvt_gpu_region *rg, uint32_t n, void *stream);

/* kvt_gpu_region_recall that also writes n_groups entries of group tables as
   kvt_gpu_region_groups(at, val, n_groups) does, in the same launch (its CTAs share them out):
   a recall program's new blocks reach the device without a launch of their own. No region of
   the call reads a group table (kvt_gpu_region_gather, queued after it, does). Returns
   cudaErrorInvalidValue, nothing launched, for kvt_gpu_region_recall's cases and for at or val
   NULL with n_groups > 0 or n_groups above INT32_MAX; n == 0 launches nothing (entries
   included: kvt_gpu_region_groups writes them alone). (policy/region.cu) */
int kvt_gpu_region_recall_groups(const struct kvt_gpu_region *rg, uint32_t n, const uint64_t *at,
				 const uint64_t *val, uint32_t n_groups, void *stream);

/* kvt_region_grow on each of the n regions of rg to n_new[i] slots (device array; clamped to
   KVT_REGION_MAX_SLOTS; no-op where not above *n_slots): the new slots are empty (their old
   memory is not read) and *n_slots is set. With a free-frame stack (stack and in_off device
   arrays; both NULL or neither), region i's new slots had + t (had its *n_slots before) take
   stack[in_off[i] - 1 - t], popped from the top as the reference's free[--n_free]: in_off[i]
   is at least the count of its new slots. The stack is not written. A region without frame[],
   or one that does not grow, reads neither in_off[i] nor the stack. Without a stack, frame[]
   is not touched: the caller writes the new slots' frames. */
int kvt_gpu_region_grow(const struct kvt_gpu_region *rg, const uint32_t *n_new,
			const uint32_t *stack, const uint32_t *in_off, uint32_t n, void *stream);

/* k[i] successive kvt_region_drop on region i of the n regions of rg (k a device array; the
   drops stop when the region has no slot left), one CTA each: the same slots dropped, the same
   slots moved, the same permutation of frame[] (when the descriptor has one), *n_slots lowered.
   Region i reports its t-th drop at out_off[i] + t (out_off a device array) of dropped (the
   slot's index, before the move) and freed (its frame before the move; its index when frame is
   NULL); either may be NULL (out_off too, when both are). gone[i] (may be NULL): the keys
   forgotten. A region with a stale flag gets *stale = 1 when a drop takes a slot its view
   (view_n[h] entries at view[h * r ...]) names, or moves the last slot, named there, into the
   dropped one's place (the reference's region_shrink with `mark`); *stale is never cleared,
   the view not changed, and view and view_n are read only where a stale flag is given. Each
   drop is a parallel argmin over the region's slots: O(k * n_slots / 256) a region, plus
   O(n_heads * r / 256) for the view. */
int kvt_gpu_region_drop(const struct kvt_gpu_region *rg, const uint32_t *k, const uint32_t *out_off,
			uint32_t *dropped, uint32_t *freed, uint32_t *gone, uint32_t n,
			void *stream);

/* kvt_region_empty for each of the n pairs (region index into rg, slot) of pairs [n][2] (device
   array): a slot at or past its region's *n_slots, or a region index at or past n_regions, is
   left alone; a pair may repeat. had[x] (may be NULL): 1 when pair x forgot a key, else 0; of
   the copies of a repeated pair, one (which is not fixed) reports the key. */
int kvt_gpu_region_empty(const struct kvt_gpu_region *rg, uint32_t n_regions, const uint32_t *pairs,
			 uint32_t *had, uint32_t n, void *stream);

/* kvt_region_clear on each of the n regions of rg: every slot dropped (its key forgotten, the
   slot left empty), *n_slots = 0; gone[i] (may be NULL): the keys forgotten. frame[] is not
   touched: every frame of the region is free afterwards. With freed (and out_off, device
   arrays; both NULL or neither), region i writes frame[s] of each slot s it had, in index
   order, to freed[out_off[i] + s] (pushed on a free-frame stack as the reference pushes them);
   a region without frame[] writes s. */
int kvt_gpu_region_clear(const struct kvt_gpu_region *rg, uint32_t *gone, const uint32_t *out_off,
			 uint32_t *freed, uint32_t n, void *stream);

/* FlashH2D of recall regions (policy/region_gather.cu): after kvt_gpu_region_recall on the
   same descriptors, copies each load of each of the n regions, block_bytes from the block's
   host row to its slot's frame: from group[key / n_heads] + (key % n_heads) * block_bytes
   (device-accessible host memory, mapped pinned) to frame_base + frame[slot] * block_bytes
   (device memory); every load of load[0 .. *n_load) whatever its n_valid (the block's unused
   rows are copied too), as the host path's gather. A load whose group entry is 0 (its block is
   not in DRAM), or whose block is at or past cap_blocks, is not copied: the region's *stale is
   set to 1 (when it has one) and *missing (may be NULL) counts it. A region without frame[]
   copies to frame index = slot; one without group has no block in DRAM. The loads of one
   launch must name distinct frames. *fresh (may be NULL) counts the loads into empty slots
   (old KVT_REGION_NONE: slots that hold a block now), copied or not. ctas: CTAs the copy is
   spread over (0: the FlashH2D
   default, KVT_GATHER_CTAS_DEFAULT of transfer/gather.h; clamped to KVT_GATHER_CTAS_MAX);
   group entries 16-byte aligned. Returns cudaErrorInvalidValue, nothing launched, for rg NULL,
   n above INT32_MAX, block_bytes 0, above UINT32_MAX or not a multiple of 16, frame_base 0 or
   not 16-byte aligned; n == 0 launches nothing. */
int kvt_gpu_region_gather(const struct kvt_gpu_region *rg, uint32_t n, uint64_t block_bytes,
			  uint64_t frame_base, uint32_t ctas, uint32_t *missing, uint32_t *fresh,
			  void *stream);

/* Writes n entries of regions' group tables (struct kvt_gpu_region.group) in one launch:
   *(uint64_t *)at[i] = val[i] (at, val: device arrays of n; the addresses 8-byte aligned and
   distinct), so a batch's new blocks reach the device without a copy per region. Returns
   cudaErrorInvalidValue, nothing launched, for at or val NULL or n above INT32_MAX; n == 0
   launches nothing. (policy/region_gather.cu) */
int kvt_gpu_region_groups(const uint64_t *at, const uint64_t *val, uint32_t n, void *stream);

/* ---- Quest selection (policy/quest.cu; the CPU reference is kvt_quest_select, policy.h) ---- */

#define KVT_GPU_QUEST_MAX_R 256u     /* r */
#define KVT_GPU_QUEST_MAX_QDIM 4096u /* g_count * head_dim: a head's queries, in shared memory */

/* One (sequence, layer) of a batch: kvt_quest_select's per-sequence inputs. The descriptors lie
   in device memory; the pointers are device pointers. */
struct kvt_gpu_quest {
	const void *meta;		  /* [nb][n_heads][2][head_dim] of the dtype */
	const struct kvt_region_key *key; /* [nb * n_heads]: tk read (the region's key table) */
	uint32_t n_tokens, sink, ring0;	  /* kvt_region_geom */
};

/* kvt_quest_select on each of the n entries of qs (a device array) with the layer's n_heads,
   lbt, g_count, head_dim and dt: entry i's queries are q + i * n_heads * g_count * head_dim
   elements of dt, its selection goes to sel[i * n_heads * r ...], block for block the
   reference's (the same f32 sums in the same order, no contraction). One CTA per (entry, kv
   head). Any n_tokens works (the blocks are ranked in chunks of shared memory); an entry with
   n_tokens == 0 gets KVT_REGION_NONE throughout, its meta and key not read (they may be NULL;
   its queries are read all the same). Limits beyond the reference's (cudaErrorInvalidValue,
   nothing launched): 1 <= r <= KVT_GPU_QUEST_MAX_R, g_count * head_dim <=
   KVT_GPU_QUEST_MAX_QDIM (both >= 1), lbt < 32, n * n_heads <= INT32_MAX (n_heads >= 1), dt
   f32, f16 or bf16. Build without --use_fast_math or -ftz (subnormals). */
int kvt_gpu_quest_select(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t g_count,
			 uint32_t lbt, uint32_t r, const struct kvt_gpu_quest *qs, const void *q,
			 uint32_t *sel, uint32_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVT_POLICY_GPU_H */
