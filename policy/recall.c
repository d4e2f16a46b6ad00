/* SPDX-License-Identifier: MIT */
/*
 * Recall scoring, the CPU reference: per-block key metadata (per-channel min and max, Quest),
 * the upper bound of a query's logit against a block, and the top-r choice of blocks.
 *
 * Metadata is kept in the model's dtype: the min and max of dtype values are dtype values, so
 * nothing is rounded, and it takes 1/block_tokens of the block's bytes. For 16-bit dtypes the
 * comparison runs on the bit patterns mapped to an order-preserving unsigned key, so updating a
 * block with a new key row costs no conversion.
 */
#include <math.h>
#include <string.h>

#include "policy.h"
#include "region.h"

/* Order-preserving key of an IEEE-like 16-bit pattern (sign-magnitude to unsigned). */
static inline uint16_t ord16(uint16_t u)
{
	return (u & 0x8000u) ? (uint16_t)~u : (uint16_t)(u | 0x8000u);
}

void kvt_meta_init(enum kvt_dtype dt, uint32_t head_dim, void *meta, const void *row)
{
	size_t bytes = (size_t)head_dim * kvt_dtype_size(dt);

	memcpy(meta, row, bytes);
	memcpy((uint8_t *)meta + bytes, row, bytes);
}

void kvt_meta_add(enum kvt_dtype dt, uint32_t head_dim, void *meta, const void *row)
{
	if (dt == KVT_DTYPE_F32) {
		float *mn = meta, *mx = mn + head_dim;
		const float *x = row;

		for (uint32_t d = 0; d < head_dim; d++) {
			if (x[d] < mn[d])
				mn[d] = x[d];
			if (x[d] > mx[d])
				mx[d] = x[d];
		}
		return;
	}
	uint16_t *mn = meta, *mx = mn + head_dim;
	const uint16_t *x = row;

	for (uint32_t d = 0; d < head_dim; d++) {
		uint16_t k = ord16(x[d]);

		if (k < ord16(mn[d]))
			mn[d] = x[d];
		if (k > ord16(mx[d]))
			mx[d] = x[d];
	}
}

void kvt_meta_build(enum kvt_dtype dt, uint32_t head_dim, void *meta, const void *rows,
		    size_t row_stride, uint32_t n)
{
	const uint8_t *r = rows;

	if (n == 0)
		return;
	kvt_meta_init(dt, head_dim, meta, r);
	for (uint32_t i = 1; i < n; i++)
		kvt_meta_add(dt, head_dim, meta, r + i * row_stride);
}

float kvt_meta_bound(enum kvt_dtype dt, uint32_t head_dim, const void *meta, const float *q,
		     uint32_t g_count, float *scratch)
{
	const float *mn, *mx;
	float best = -INFINITY;

	if (dt == KVT_DTYPE_F32) {
		mn = meta;
	} else {
		kvt_to_f32(dt, meta, scratch, 2 * (size_t)head_dim);
		mn = scratch;
	}
	mx = mn + head_dim;
	for (uint32_t g = 0; g < g_count; g++) {
		const float *qg = q + (size_t)g * head_dim;
		float s = 0.0f;

		for (uint32_t d = 0; d < head_dim; d++)
			s += qg[d] >= 0.0f ? qg[d] * mx[d] : qg[d] * mn[d];
		if (s > best || (g == 0 && isnan(s)))
			best = s;
	}
	return best;
}

/* a ranks above b: higher score, NaN below every number, ties to the lower id. */
static inline int above(float sa, uint32_t ia, float sb, uint32_t ib)
{
	if (isnan(sa) != isnan(sb))
		return isnan(sb);
	if (!isnan(sa) && sa != sb)
		return sa > sb;
	return ia < ib;
}

/* Min-heap on rank (the worst kept candidate at the root), of candidate indices into sc/id. */
static void sift_down(uint32_t *h, uint32_t n, uint32_t i, const float *sc, const uint32_t *id)
{
	for (;;) {
		uint32_t l = 2 * i + 1, w = i;

		if (l < n && above(sc[h[w]], id[h[w]], sc[h[l]], id[h[l]]))
			w = l;
		if (l + 1 < n && above(sc[h[w]], id[h[w]], sc[h[l + 1]], id[h[l + 1]]))
			w = l + 1;
		if (w == i)
			return;
		uint32_t t = h[i];

		h[i] = h[w];
		h[w] = t;
		i = w;
	}
}

uint32_t kvt_topr(const float *score, const uint32_t *id, uint32_t n, uint32_t r, uint32_t *out,
		  uint32_t *heap)
{
	uint32_t k = n < r ? n : r;

	if (k == 0)
		return 0;
	for (uint32_t i = 0; i < k; i++)
		heap[i] = i;
	for (uint32_t i = k / 2; i-- > 0;)
		sift_down(heap, k, i, score, id);
	for (uint32_t i = k; i < n; i++) {
		if (above(score[i], id[i], score[heap[0]], id[heap[0]])) {
			heap[0] = i;
			sift_down(heap, k, 0, score, id);
		}
	}
	for (uint32_t i = 0; i < k; i++)
		out[i] = id[heap[i]];
	/* ascending ids: k is small (r), insertion sort */
	for (uint32_t i = 1; i < k; i++) {
		uint32_t v = out[i], j = i;

		while (j > 0 && out[j - 1] > v) {
			out[j] = out[j - 1];
			j--;
		}
		out[j] = v;
	}
	return k;
}

void kvt_quest_select(enum kvt_dtype dt, uint32_t head_dim, uint32_t g_count,
		      const struct kvt_region *rg, const struct kvt_region_geom *g,
		      const void *meta, const void *q, uint32_t r, uint32_t *sel, float *score,
		      uint32_t *cand, float *qf)
{
	uint32_t H = g->n_heads, G = g_count, D = head_dim, bt = 1u << g->lbt;
	uint32_t N = g->n_tokens, nb = (uint32_t)(((uint64_t)N + bt - 1) >> g->lbt);
	size_t row = (size_t)D * kvt_dtype_size(dt);

	for (uint32_t h = 0; h < H; h++) {
		uint32_t nc = 0, k;

		kvt_to_f32(dt, (const uint8_t *)q + (size_t)h * G * row, qf, (size_t)G * D);
		for (uint32_t b = 0; b < nb; b++) {
			uint32_t nv = N - b * bt < bt ? N - b * bt : bt;

			if (kvt_region_resident(rg, g, h, b, nv))
				continue;
			score[nc] = kvt_meta_bound(
				dt, D, (const uint8_t *)meta + ((size_t)b * H + h) * 2 * row, qf, G,
				qf + (size_t)G * D);
			cand[nc++] = b;
		}
		k = kvt_topr(score, cand, nc, r, sel + (size_t)h * r, cand + nb);
		for (; k < r; k++)
			sel[(size_t)h * r + k] = KVT_REGION_NONE;
	}
}
