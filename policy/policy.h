/* SPDX-License-Identifier: MIT */
/*
 * policy: what to keep. CPU reference versions of SnapKV selection (docs/design.md, "SnapKV
 * selection"), the StreamingLLM ring rule, dtype conversion and decode attention. A backend that
 * computes any of these on its own device must match these functions on the same inputs.
 */
#ifndef KVT_POLICY_H
#define KVT_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one element of dtype: 4, 2 or 2; 0 for an unknown dtype. */
static inline uint32_t kvt_dtype_size(enum kvt_dtype dt)
{
	switch (dt) {
	case KVT_DTYPE_F32:
		return 4;
	case KVT_DTYPE_F16:
	case KVT_DTYPE_BF16:
		return 2;
	}
	return 0;
}

/* Converts n elements of dtype at src to f32 at dst (exact: every f16/bf16 value, subnormals,
   infinities and NaN included, has an f32 equal). */
void kvt_to_f32(enum kvt_dtype dt, const void *src, float *dst, size_t n);

/* Converts n f32 values to dtype with round-to-nearest-even (NaN stays NaN, overflow gives inf). */
void kvt_from_f32(enum kvt_dtype dt, const float *src, void *dst, size_t n);

/* Ring rule (docs/design.md): the slot of position p in the sink+ring slot space. recent >= 1. */
static inline uint32_t kvt_ring_slot(uint32_t p, uint32_t sink, uint32_t recent)
{
	return p < sink ? p : sink + (p - sink) % recent;
}

struct kvt_snapkv {
	uint32_t n_kv_heads, n_q_heads, head_dim; /* n_q_heads % n_kv_heads == 0 */
	enum kvt_dtype dtype;
	uint32_t prompt_tokens;			  /* L */
	uint32_t obs_window;			  /* L_obs */
	uint32_t sink, recent, topk, pool_kernel; /* pool_kernel odd */
};

/* The parameter checks of every SnapKV entry point (and of the GPU versions, policy/gpu.h): 0,
   or -EINVAL for zero heads/dims, n_q_heads not a multiple of n_kv_heads, an unknown dtype, an
   even pool_kernel, a prompt past INT32_MAX or a scratch size that overflows. */
int kvt_snapkv_check(const struct kvt_snapkv *p);

/* valid_topk of docs/design.md step 5/6: min(topk, #candidates) where candidates are
   [sink, min(L - recent, L - L_obs)); 0 when L <= sink + recent (Case 1), when topk == 0, or
   when that interval is empty. Depends only on the parameters, never on the data. */
uint32_t kvt_snapkv_count(const struct kvt_snapkv *p);

/* Bytes of f32 scratch kvt_snapkv_select needs (a caller-owned buffer, so selection itself
   never allocates). */
size_t kvt_snapkv_scratch_bytes(const struct kvt_snapkv *p);

/* SnapKV selection exactly as docs/design.md defines it. k is [n_kv_heads][L][head_dim], q_obs is
   [n_q_heads][L_obs][head_dim], both of p->dtype; computation in f32. Writes, for each kv head
   h, kvt_snapkv_count(p) positions in ascending order to out[h * count ...]. Ties of the
   pooled score go to the lower position; NaN scores rank below every number. When the count
   is 0 nothing is read (k and q_obs may be NULL). Returns 0, or -EINVAL for invalid
   parameters (zero heads/dims, n_q_heads not a multiple of n_kv_heads, even pool_kernel). */
int kvt_snapkv_select(const struct kvt_snapkv *p, const void *k, const void *q_obs, int32_t *out,
		      void *scratch);

/* Pooled vote of docs/design.md steps 1-3 for kv head h, written to pooled[0 .. L - L_obs)
   (nothing when L <= L_obs). Exposed so tests and other backends can compare scores, not just
   the final choice. scratch as for kvt_snapkv_select. */
int kvt_snapkv_scores(const struct kvt_snapkv *p, uint32_t h, const void *k, const void *q_obs,
		      float *pooled, void *scratch);

/* One key/value row source for kvt_attend_rows: n rows of head_dim elements of dtype. */
struct kvt_attend_rows {
	const void *k; /* row i at k + i * k_stride bytes */
	const void *v;
	size_t k_stride, v_stride;
	uint32_t n;
};

/* Reference decode attention for one kv head: for each of the g_count query heads q[g]
   ([g_count][head_dim] f32), out[g] = sum_j softmax_j(q[g].k_j / sqrt(head_dim)) v_j over every
   row of every segment (n_seg segments), f32 accumulation, max-subtracted softmax. With no rows
   at all, out is zeroed. */
void kvt_attend_rows(enum kvt_dtype dt, uint32_t head_dim, const float *q, uint32_t g_count,
		     const struct kvt_attend_rows *seg, uint32_t n_seg, float *out);

/* One layer's attention tables as the batched attention reads them: struct kvt_attn_tables's
   arrays (row r = member i * n_kv_heads + kv head h; addresses in the memory the reader runs
   in) and the pool of blocks they index. Row r attends over its resident slots s <
   n_tokens[r] (row s % block_tokens of block frames[r * max_frames + s / block_tokens]), then
   for j < n_recall[r] the rows t < recall_tokens[x] of block recall[x] (x = r * max_recall +
   j) whose bit t of recall_skip[x] is clear; block i at pool + i * block_bytes, K rows first,
   V rows at v_offset, rows row_bytes apart. Query heads h * g_count .. + g_count of member i
   read the row's kv head (GQA). With n_batch set, the rows of members i >= *n_batch have no
   token and their out and lse are not written (a captured CUDA graph's fixed grid over the
   capacities); counts past the capacities are clamped to them and blocks outside the pool
   skipped (kvt_attn_count, kvt_attn_row), so no table makes a reader leave the pool. */
struct kvt_attn_desc {
	const uint32_t *n_tokens, *frames, *n_recall, *recall, *recall_tokens;
	const uint64_t *recall_skip;
	const uint32_t *n_batch; /* [1], or NULL: every member's rows */
	uint64_t pool, pool_blocks, block_bytes, v_offset;
	uint32_t row_bytes, block_tokens;
	uint32_t n, n_kv_heads, g_count, head_dim; /* members, kv heads, query heads per kv head */
	uint32_t max_frames, max_recall;
};

/* Reference decode attention of row r of d: for each of its g_count query heads g, out[g] =
   softmax(q[g] . K^T / sqrt(head_dim)) V over the row's tokens in table order (resident slots,
   then recalled rows not skipped), f32 accumulation, max-subtracted softmax; lse[g] (NULL: not
   written) = that max + log(sum of exp), the natural log-sum-exp of the scaled logits. q and
   out are [g_count][head_dim] of dt (host memory); scratch holds
   kvt_attend_table_scratch(g_count, head_dim) floats. A row without tokens gets zeros and lse
   -INFINITY. */
void kvt_attend_table(enum kvt_dtype dt, const struct kvt_attn_desc *d, uint32_t r, const void *q,
		      void *out, float *lse, float *scratch);

/* Floats of kvt_attend_table's scratch. */
static inline size_t kvt_attend_table_scratch(uint32_t g_count, uint32_t head_dim)
{
	return 2 * (size_t)g_count * head_dim + head_dim + 3 * (size_t)g_count;
}

/* Block metadata for recall (Quest): meta is [2][head_dim] elements of dtype, the per-channel
   minimum of the block's key rows, then the maximum. kvt_meta_init starts a block with its
   first row, kvt_meta_add folds in one more, kvt_meta_build does n >= 1 rows row_stride bytes
   apart. NaN keys are not ordered: they are kept only as a block's first row. */
void kvt_meta_init(enum kvt_dtype dt, uint32_t head_dim, void *meta, const void *row);
void kvt_meta_add(enum kvt_dtype dt, uint32_t head_dim, void *meta, const void *row);
void kvt_meta_build(enum kvt_dtype dt, uint32_t head_dim, void *meta, const void *rows,
		    size_t row_stride, uint32_t n);

/* Upper bound of q[g].k over every key k of the block, maximised over the g_count query heads
   q ([g_count][head_dim] f32): sum over d of max(q_d * min_d, q_d * max_d), f32, d ascending
   (so it is never below q.k computed in f32 in the same order). scratch: 2 * head_dim floats
   (unused for f32). Not scaled by 1/sqrt(head_dim): ranking only. */
float kvt_meta_bound(enum kvt_dtype dt, uint32_t head_dim, const void *meta, const float *q,
		     uint32_t g_count, float *scratch);

/* The min(r, n) best of n candidates (score[i], id[i]): higher score first, NaN below every
   number, ties to the lower id. Writes their ids to out in ascending order; returns the count.
   heap: min(r, n) uint32 of scratch. O(n log r). */
uint32_t kvt_topr(const float *score, const uint32_t *id, uint32_t n, uint32_t r, uint32_t *out,
		  uint32_t *heap);

struct kvt_region;
struct kvt_region_geom;

/* Quest selection of one (sequence, layer), the decision kvt_decode_recall makes and every
   device version must make (policy/quest.cu): for each kv head h of g->n_heads, the blocks of
   the layer (g->n_tokens tokens in blocks of 1 << g->lbt) that are not fully resident
   (kvt_region_resident, which reads rg->key only), scored by kvt_meta_bound with the head's
   g_count query heads, the best r of them by kvt_topr (ties to the lower block, NaN last) in
   sel[h * r ...], ascending, then KVT_REGION_NONE up to r. meta: [nb][n_heads][2][head_dim] of
   dt (kvt_meta_build's layout per (block, head)); q: [n_heads * g_count][head_dim] of dt.
   Scratch: score nb floats, cand nb + r uint32, qf (g_count + 2) * head_dim floats. */
void kvt_quest_select(enum kvt_dtype dt, uint32_t head_dim, uint32_t g_count,
		      const struct kvt_region *rg, const struct kvt_region_geom *g,
		      const void *meta, const void *q, uint32_t r, uint32_t *sel, float *score,
		      uint32_t *cand, float *qf);

#ifdef __cplusplus
}
#endif

#endif /* KVT_POLICY_H */
