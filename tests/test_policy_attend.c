/* SPDX-License-Identifier: MIT */
/*
 * policy: attention over resident rows against the naive reference.
 */
#include "test_policy.h"

/* ---- attention -------------------------------------------------------------------------- */

/* Segment s row i lives at row (i * SPREAD + s) of a buffer of rows of KPITCH (keys) or VPITCH
   (values) elements, so the segments interleave, the strides are larger than a row and K and V
   strides differ. */
void test_attend_vs_naive(void **state)
{
	enum { D = 5, G = 3, NSEG = 4, KPITCH = 7, VPITCH = 6, SPREAD = 5 };
	static const uint32_t seg_rows[NSEG] = {6, 0, 1, 11};
	size_t d, s, i, g, t;

	(void)state;
	t_rng_seed(4242);
	for (d = 0; d < 3; d++) {
		enum kvt_dtype dt = all_dtypes[d];
		size_t esz = kvt_dtype_size(dt), nbuf = 11 * SPREAD + NSEG;
		struct tensor kb, vb, qt;
		struct kvt_attend_rows seg[NSEG];
		float out[G * D];

		tensor_make(&kb, dt, nbuf * KPITCH);
		tensor_make(&vb, dt, nbuf * VPITCH);
		tensor_make(&qt, KVT_DTYPE_F32, G * D);
		for (i = 0; i < G * D; i++)
			qt.f[i] *= 2.0f; /* sharper softmax */
		for (s = 0; s < NSEG; s++) {
			seg[s].k = (const char *)kb.raw + s * KPITCH * esz;
			seg[s].v = (const char *)vb.raw + s * VPITCH * esz;
			seg[s].k_stride = SPREAD * KPITCH * esz;
			seg[s].v_stride = SPREAD * VPITCH * esz;
			seg[s].n = seg_rows[s];
		}
		seg[1].k = NULL; /* an empty segment is not read */
		seg[1].v = NULL;
		kvt_attend_rows(dt, D, qt.f, G, seg, NSEG, out);
		for (g = 0; g < G; g++) {
			double m = -INFINITY, sum = 0, acc[D] = {0};

			for (s = 0; s < NSEG; s++)
				for (i = 0; i < seg_rows[s]; i++) {
					const float *kr = kb.f + (i * SPREAD + s) * KPITCH;
					double dot = 0;

					for (t = 0; t < D; t++)
						dot += (double)qt.f[g * D + t] * kr[t];
					m = fmax(m, dot / sqrt(D));
				}
			for (s = 0; s < NSEG; s++)
				for (i = 0; i < seg_rows[s]; i++) {
					const float *kr = kb.f + (i * SPREAD + s) * KPITCH;
					const float *vr = vb.f + (i * SPREAD + s) * VPITCH;
					double dot = 0, w;

					for (t = 0; t < D; t++)
						dot += (double)qt.f[g * D + t] * kr[t];
					w = exp(dot / sqrt(D) - m);
					sum += w;
					for (t = 0; t < D; t++)
						acc[t] += w * vr[t];
				}
			for (t = 0; t < D; t++) {
				double want = acc[t] / sum;

				if (!(fabs(out[g * D + t] - want) <= 1e-5 * (1 + fabs(want))))
					fail_at(__FILE__, __LINE__, "%s g%zu d%zu: %.9g vs %.9g",
						dtype_name[d], g, t, out[g * D + t], want);
			}
		}
		tensor_free(&kb);
		tensor_free(&vb);
		tensor_free(&qt);
	}
}

/* A single row gives exactly that row's value; logits of +-2000 neither overflow nor lose the
   winner, wherever the largest sits (the max is over every row of every segment). */
void test_attend_exact(void **state)
{
	float k[2][4] = {{100, 100, 100, 100}, {-100, -100, -100, -100}};
	float v[2][4] = {{1, 2, 3, 4}, {5, 6, 7, 8}};
	float q[4] = {10, 10, 10, 10}, out[4];
	struct kvt_attend_rows seg[2] = {
		{.k = k[1], .v = v[1], .k_stride = sizeof(k[0]), .v_stride = sizeof(v[0]), .n = 1},
		{.k = k[0], .v = v[0], .k_stride = sizeof(k[0]), .v_stride = sizeof(v[0]), .n = 1},
	};
	size_t t;

	(void)state;
	kvt_attend_rows(KVT_DTYPE_F32, 4, q, 1, &seg[1], 1, out);
	assert_memory_equal(out, v[0], sizeof(out));
	/* logits -2000 then 2000 (q.k / sqrt(4)): exp(4000) would overflow against the first */
	kvt_attend_rows(KVT_DTYPE_F32, 4, q, 1, seg, 2, out);
	for (t = 0; t < 4; t++)
		assert_true(out[t] == v[0][t]);
	/* the same two rows as one segment, largest first, then largest second (k[1], k[0] as
	   rows 0 and 2 of a stride-2 walk starting at k[1]) */
	seg[1].n = 2;
	kvt_attend_rows(KVT_DTYPE_F32, 4, q, 1, &seg[1], 1, out);
	for (t = 0; t < 4; t++)
		assert_true(out[t] == v[0][t]);
	{
		float k3[3][4] = {{-100, -100, -100, -100}, {0}, {100, 100, 100, 100}};
		float v3[3][4] = {{5, 6, 7, 8}, {0}, {1, 2, 3, 4}};
		struct kvt_attend_rows one = {.k = k3,
					      .v = v3,
					      .k_stride = 2 * sizeof(k3[0]),
					      .v_stride = 2 * sizeof(v3[0]),
					      .n = 2};

		kvt_attend_rows(KVT_DTYPE_F32, 4, q, 1, &one, 1, out);
		for (t = 0; t < 4; t++)
			assert_true(out[t] == v3[2][t]);
	}
	/* equal logits: the plain mean */
	q[0] = q[1] = q[2] = q[3] = 0;
	kvt_attend_rows(KVT_DTYPE_F32, 4, q, 1, &seg[1], 1, out);
	for (t = 0; t < 4; t++)
		assert_true(out[t] == (v[0][t] + v[1][t]) / 2);
}

void test_attend_no_rows(void **state)
{
	float q[2 * 3] = {1, 2, 3, 4, 5, 6}, out[2 * 3];
	struct kvt_attend_rows seg[2] = {{.n = 0}, {.n = 0}};
	size_t i;

	(void)state;
	for (i = 0; i < 6; i++)
		out[i] = 123.0f;
	kvt_attend_rows(KVT_DTYPE_BF16, 3, q, 2, seg, 2, out);
	for (i = 0; i < 6; i++)
		assert_true(out[i] == 0.0f);
	for (i = 0; i < 6; i++)
		out[i] = NAN;
	kvt_attend_rows(KVT_DTYPE_F32, 3, q, 2, NULL, 0, out);
	for (i = 0; i < 6; i++)
		assert_true(out[i] == 0.0f);
}
