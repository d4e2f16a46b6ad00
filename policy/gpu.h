/* SPDX-License-Identifier: MIT */
/*
 * GPU versions of the policy (policy/snapkv.cu, recall.cu, attend.cu), called by the CUDA
 * backend plugin. Each matches its CPU reference in policy.h on the same inputs: selection
 * identical up to ties at the cutoff (f32 sums in another order), block metadata bit-exact,
 * attention within f32 tolerance.
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

/* Reference decode attention for n_heads kv heads at once (as kvt_attend_rows per head): head
   h uses segments seg[seg_off[h] .. seg_off[h + 1]) (device arrays; the segments' k and v are
   device addresses), q [n_heads * g_count][head_dim] f32 and out likewise. A head without
   rows gets zeros. */
int kvt_gpu_attend(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t g_count,
		   const struct kvt_attend_rows *seg, const uint32_t *seg_off, const float *q,
		   float *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* KVT_POLICY_GPU_H */
