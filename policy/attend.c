/* SPDX-License-Identifier: MIT */
/*
 * Reference decode attention over rows gathered from several places (sink/top-K/ring frames,
 * recalled blocks). Two passes per query head, so the softmax is exactly max-subtracted rather
 * than rescaled on the fly: the first finds the max logit, the second sums exp(s - max) and the
 * weighted values in row order; logits are recomputed, not stored, so no scratch is needed.
 * Rows are converted to f32 in small chunks on the stack.
 */
#include <math.h>
#include <string.h>

#include "attn_row.h"
#include "policy.h"

#define ATTEND_CHUNK 64

static float row_dot(enum kvt_dtype dt, size_t esz, const float *q, const void *row, uint32_t D)
{
	float buf[ATTEND_CHUNK], acc = 0.0f;
	uint32_t off, n, t;

	for (off = 0; off < D; off += n) {
		n = D - off < ATTEND_CHUNK ? D - off : ATTEND_CHUNK;
		kvt_to_f32(dt, (const char *)row + off * esz, buf, n);
		for (t = 0; t < n; t++)
			acc += q[off + t] * buf[t];
	}
	return acc;
}

/* acc[0 .. D) += w * row */
static void row_axpy(enum kvt_dtype dt, size_t esz, float w, const void *row, uint32_t D,
		     float *acc)
{
	float buf[ATTEND_CHUNK];
	uint32_t off, n, t;

	for (off = 0; off < D; off += n) {
		n = D - off < ATTEND_CHUNK ? D - off : ATTEND_CHUNK;
		kvt_to_f32(dt, (const char *)row + off * esz, buf, n);
		for (t = 0; t < n; t++)
			acc[off + t] += w * buf[t];
	}
}

static inline const void *row_at(const void *base, size_t stride, uint32_t i)
{
	return (const char *)base + (size_t)i * stride;
}

void kvt_attend_rows(enum kvt_dtype dt, uint32_t head_dim, const float *q, uint32_t g_count,
		     const struct kvt_attend_rows *seg, uint32_t n_seg, float *out)
{
	size_t esz = kvt_dtype_size(dt);
	float norm = sqrtf((float)head_dim);
	uint64_t rows = 0;
	uint32_t g, s, i, d;

	memset(out, 0, (size_t)g_count * head_dim * sizeof(*out));
	for (s = 0; s < n_seg; s++)
		rows += seg[s].n;
	/* an unknown dtype has nothing to read: out stays zeroed */
	if (rows == 0 || esz == 0 || head_dim == 0)
		return;

	for (g = 0; g < g_count; g++) {
		const float *qg = q + (size_t)g * head_dim;
		float *og = out + (size_t)g * head_dim;
		float m = -INFINITY, sum = 0.0f;

		for (s = 0; s < n_seg; s++) {
			for (i = 0; i < seg[s].n; i++) {
				float l = row_dot(dt, esz, qg, row_at(seg[s].k, seg[s].k_stride, i),
						  head_dim) /
					  norm;

				if (l > m)
					m = l;
			}
		}
		for (s = 0; s < n_seg; s++) {
			for (i = 0; i < seg[s].n; i++) {
				float l = row_dot(dt, esz, qg, row_at(seg[s].k, seg[s].k_stride, i),
						  head_dim) /
					  norm;
				float w = expf(l - m);

				sum += w;
				row_axpy(dt, esz, w, row_at(seg[s].v, seg[s].v_stride, i), head_dim,
					 og);
			}
		}
		for (d = 0; d < head_dim; d++)
			og[d] /= sum;
	}
}

/* q . row over D f32 elements, summed in order (as row_dot's chunks sum them). */
static inline float dot(const float *q, const float *row, uint32_t D)
{
	float acc = 0.0f;

	for (uint32_t x = 0; x < D; x++)
		acc += q[x] * row[x];
	return acc;
}

void kvt_attend_table(enum kvt_dtype dt, const struct kvt_attn_desc *d, uint32_t r, const void *q,
		      void *out, float *lse, float *scratch)
{
	uint32_t D = d->head_dim, G = d->g_count;
	uint64_t total = kvt_attn_count(d, r);
	float norm = sqrtf((float)D), *qf = scratch, *acc = qf + (size_t)G * D;
	float *row = acc + (size_t)G * D, *m = row + D, *sum = m + G, *w = sum + G;

	/* each row is converted once for every query head; per head the sums run in token
	   order, as kvt_attend_rows's */
	kvt_to_f32(dt, q, qf, (size_t)G * D);
	memset(acc, 0, (size_t)G * D * sizeof(*acc));
	for (uint32_t g = 0; g < G; g++)
		m[g] = -INFINITY, sum[g] = 0.0f;
	for (uint64_t t = 0; t < total; t++) {
		uint64_t a = kvt_attn_row(d, r, t);

		if (!a)
			continue;
		kvt_to_f32(dt, (const void *)(uintptr_t)a, row, D);
		for (uint32_t g = 0; g < G; g++) {
			float l = dot(qf + (size_t)g * D, row, D) / norm;

			if (l > m[g])
				m[g] = l;
		}
	}
	for (uint64_t t = 0; t < total; t++) {
		uint64_t a = kvt_attn_row(d, r, t);

		if (!a)
			continue;
		kvt_to_f32(dt, (const void *)(uintptr_t)a, row, D);
		for (uint32_t g = 0; g < G; g++)
			w[g] = expf(dot(qf + (size_t)g * D, row, D) / norm - m[g]);
		kvt_to_f32(dt, (const void *)(uintptr_t)(a + d->v_offset), row, D); /* its V */
		for (uint32_t g = 0; g < G; g++) {
			float *og = acc + (size_t)g * D;

			sum[g] += w[g];
			for (uint32_t x = 0; x < D; x++)
				og[x] += w[g] * row[x];
		}
	}
	for (uint32_t g = 0; g < G; g++) {
		for (uint32_t x = 0; sum[g] > 0 && x < D; x++)
			acc[(size_t)g * D + x] /= sum[g];
		if (lse)
			lse[g] = sum[g] > 0 ? m[g] + logf(sum[g]) : -INFINITY;
	}
	kvt_from_f32(dt, acc, out, (size_t)G * D);
}
