/* SPDX-License-Identifier: MIT */
/*
 * SnapKV selection, the CPU reference (docs/design.md, "SnapKV selection"). Every other backend is
 * checked against these functions, so the arithmetic is plain f32 in a fixed order: dot products
 * over d ascending, softmax sums over j ascending, votes accumulated query head by query head
 * and obs query by obs query, pooling sums over the window ascending. Nothing here allocates:
 * the caller passes kvt_snapkv_scratch_bytes() of scratch.
 *
 * Work per kv head: G * L_obs * L * head_dim multiply-adds for the vote (the causal mask halves
 * nothing: obs queries sit at the end of the prompt), (L - L_obs) * min(pool_kernel, L - L_obs)
 * adds for the pooling and O(n log K) for the top-K over n candidates.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

/* Scratch layout, in 4-byte elements from the start of the buffer: K of the head in f32, one
   query row, the logits / exponentials of one query, the vote, the pooled vote, and the top-K
   heap (uint32 positions). Every piece is 4-byte aligned when the buffer is. */
struct snapkv_layout {
	size_t keys, qrow, logits, vote, pooled, heap, total;
};

/* Parameters only, no checks: the caller guarantees p is non-NULL. */
static uint32_t snapkv_count_raw(const struct kvt_snapkv *p)
{
	uint64_t L = p->prompt_tokens, hi;

	if (!p->topk || L <= (uint64_t)p->sink + p->recent || L <= p->obs_window)
		return 0;
	hi = L - p->recent; /* > sink, so no underflow */
	if (L - p->obs_window < hi)
		hi = L - p->obs_window;
	if (hi <= p->sink)
		return 0;
	return hi - p->sink < p->topk ? (uint32_t)(hi - p->sink) : p->topk;
}

static bool add_elems(size_t *at, size_t n)
{
	if (n > SIZE_MAX / 4 - *at)
		return false;
	*at += n;
	return true;
}

/* Fills *lay for p; false when the sizes overflow a size_t of bytes. Needs p->head_dim != 0. */
static bool snapkv_layout(const struct kvt_snapkv *p, struct snapkv_layout *lay)
{
	size_t L = p->prompt_tokens, D = p->head_dim;
	size_t n = L > p->obs_window ? L - p->obs_window : 0;
	size_t at = 0;

	memset(lay, 0, sizeof(*lay));
	if (n == 0)
		return true; /* no vote: nothing is computed, nothing is needed */
	if (L > SIZE_MAX / 4 / D)
		return false;
	lay->keys = at;
	at = L * D;
	lay->qrow = at;
	if (!add_elems(&at, D))
		return false;
	lay->logits = at;
	if (!add_elems(&at, L))
		return false;
	lay->vote = at;
	if (!add_elems(&at, n))
		return false;
	lay->pooled = at;
	if (!add_elems(&at, n))
		return false;
	lay->heap = at;
	if (!add_elems(&at, snapkv_count_raw(p)))
		return false;
	lay->total = at;
	return true;
}

int kvt_snapkv_check(const struct kvt_snapkv *p)
{
	struct snapkv_layout lay;

	if (!p || !p->n_kv_heads || !p->n_q_heads || !p->head_dim)
		return -EINVAL;
	if (p->n_q_heads % p->n_kv_heads)
		return -EINVAL;
	if (!kvt_dtype_size(p->dtype))
		return -EINVAL;
	if (!(p->pool_kernel & 1u))
		return -EINVAL;
	/* positions are written as int32_t */
	if (p->prompt_tokens > INT32_MAX)
		return -EINVAL;
	if (!snapkv_layout(p, &lay))
		return -EINVAL;
	return 0;
}

uint32_t kvt_snapkv_count(const struct kvt_snapkv *p)
{
	return kvt_snapkv_check(p) ? 0 : snapkv_count_raw(p);
}

size_t kvt_snapkv_scratch_bytes(const struct kvt_snapkv *p)
{
	struct snapkv_layout lay;

	if (kvt_snapkv_check(p))
		return 0;
	snapkv_layout(p, &lay);
	return lay.total * 4;
}

/* docs/design.md steps 1-3 for kv head h: writes the pooled vote to pooled[0 .. L - L_obs).
   Requires L > L_obs and checked parameters; reads K of head h and Q_obs of its group. */
static void snapkv_pooled(const struct kvt_snapkv *p, uint32_t h, const void *k, const void *q_obs,
			  float *pooled, float *scratch, const struct snapkv_layout *lay)
{
	size_t esz = kvt_dtype_size(p->dtype);
	size_t D = p->head_dim, L = p->prompt_tokens, Lobs = p->obs_window;
	size_t n = L - Lobs, G = p->n_q_heads / p->n_kv_heads;
	size_t r = p->pool_kernel / 2, g, i, j, t, d;
	float *keys = scratch + lay->keys, *qrow = scratch + lay->qrow;
	float *e = scratch + lay->logits, *vote = scratch + lay->vote;
	float norm = sqrtf((float)p->head_dim);

	/* once per head: every obs query of the group reads every key */
	kvt_to_f32(p->dtype, (const char *)k + (size_t)h * L * D * esz, keys, L * D);
	memset(vote, 0, n * sizeof(*vote));
	for (g = (size_t)h * G; g < (size_t)h * G + G; g++) {
		for (i = 0; i < Lobs; i++) {
			size_t pi = n + i; /* absolute position of obs query i */
			float m = -INFINITY, sum = 0.0f;

			kvt_to_f32(p->dtype, (const char *)q_obs + (g * Lobs + i) * D * esz, qrow,
				   D);
			for (j = 0; j <= pi; j++) {
				const float *kj = keys + j * D;
				float dot = 0.0f;

				for (d = 0; d < D; d++)
					dot += qrow[d] * kj[d];
				e[j] = dot / norm;
				if (e[j] > m)
					m = e[j];
			}
			for (j = 0; j <= pi; j++) {
				e[j] = expf(e[j] - m);
				sum += e[j];
			}
			/* the obs window's own positions only feed the normalization */
			for (j = 0; j < n; j++)
				vote[j] += e[j] / sum;
		}
	}
	for (j = 0; j < n; j++)
		vote[j] /= (float)G;

	/* zero padding of r on each side counts in the divisor: edge positions score lower */
	for (j = 0; j < n; j++) {
		size_t lo = j >= r ? j - r : 0;
		size_t hi = r < n - j ? j + r : n - 1;
		float acc = 0.0f;

		for (t = lo; t <= hi; t++)
			acc += vote[t];
		pooled[j] = acc / (float)p->pool_kernel;
	}
}

/* Strict total order of step 5: a ranks above b. Higher score first, NaN below every number,
   then the lower position. */
static inline bool ranks_above(const float *score, uint32_t a, uint32_t b)
{
	float x = score[a], y = score[b];
	bool xn = isnan(x), yn = isnan(y);

	if (xn != yn)
		return yn;
	if (!xn && x != y)
		return x > y;
	return a < b;
}

/* heap[0] is the lowest-ranked kept position: every node ranks at or below its children */
static void heap_sift_up(uint32_t *heap, const float *score, size_t at)
{
	while (at > 0) {
		size_t parent = (at - 1) / 2;
		uint32_t tmp;

		if (!ranks_above(score, heap[parent], heap[at]))
			break;
		tmp = heap[parent];
		heap[parent] = heap[at];
		heap[at] = tmp;
		at = parent;
	}
}

static void heap_sift_down(uint32_t *heap, const float *score, size_t n)
{
	size_t at = 0;

	for (;;) {
		size_t lowest = at, c = 2 * at + 1;
		uint32_t tmp;

		if (c < n && ranks_above(score, heap[lowest], heap[c]))
			lowest = c;
		if (c + 1 < n && ranks_above(score, heap[lowest], heap[c + 1]))
			lowest = c + 1;
		if (lowest == at)
			return;
		tmp = heap[lowest];
		heap[lowest] = heap[at];
		heap[at] = tmp;
		at = lowest;
	}
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Steps 4-5: the count best of score[lo .. hi) (hi - lo >= count > 0), ascending, into out. */
static void snapkv_topk(const float *score, uint32_t lo, uint32_t hi, uint32_t count,
			uint32_t *heap, int32_t *out)
{
	uint32_t j, i;

	for (j = lo; j < lo + count; j++) {
		heap[j - lo] = j;
		heap_sift_up(heap, score, j - lo);
	}
	for (; j < hi; j++) {
		if (ranks_above(score, j, heap[0])) {
			heap[0] = j;
			heap_sift_down(heap, score, count);
		}
	}
	qsort(heap, count, sizeof(*heap), cmp_u32);
	for (i = 0; i < count; i++)
		out[i] = (int32_t)heap[i];
}

int kvt_snapkv_select(const struct kvt_snapkv *p, const void *k, const void *q_obs, int32_t *out,
		      void *scratch)
{
	struct snapkv_layout lay;
	uint32_t count, lo, hi, h;
	float *s = scratch;
	int err;

	err = kvt_snapkv_check(p);
	if (err)
		return err;
	count = snapkv_count_raw(p);
	if (count == 0)
		return 0;
	if (!k || (!q_obs && p->obs_window) || !out || !scratch)
		return -EINVAL;
	snapkv_layout(p, &lay);
	lo = p->sink;
	hi = p->prompt_tokens - p->recent;
	if (p->prompt_tokens - p->obs_window < hi)
		hi = p->prompt_tokens - p->obs_window;
	for (h = 0; h < p->n_kv_heads; h++) {
		snapkv_pooled(p, h, k, q_obs, s + lay.pooled, s, &lay);
		snapkv_topk(s + lay.pooled, lo, hi, count, (uint32_t *)(s + lay.heap),
			    out + (size_t)h * count);
	}
	return 0;
}

int kvt_snapkv_scores(const struct kvt_snapkv *p, uint32_t h, const void *k, const void *q_obs,
		      float *pooled, void *scratch)
{
	struct snapkv_layout lay;
	int err;

	err = kvt_snapkv_check(p);
	if (err)
		return err;
	if (h >= p->n_kv_heads)
		return -EINVAL;
	if (p->prompt_tokens <= p->obs_window)
		return 0;
	if (!k || (!q_obs && p->obs_window) || !pooled || !scratch)
		return -EINVAL;
	snapkv_layout(p, &lay);
	snapkv_pooled(p, h, k, q_obs, pooled, scratch, &lay);
	return 0;
}
