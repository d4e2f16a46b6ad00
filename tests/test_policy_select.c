/* SPDX-License-Identifier: MIT */
/*
 * policy: SnapKV selections computed by hand (ties, pooling, causal GQA, uniform scores, NaN)
 * and random ones against the naive reference.
 */
#include "test_policy.h"

/* ---- hand-computed selections ----------------------------------------------------------- */

/* One kv head, head_dim 1, f32 -> each dtype; returns select's result into out. */
static void select_small(enum kvt_dtype dt, const struct kvt_snapkv *p0, const float *k,
			 const float *q, int32_t *out)
{
	struct kvt_snapkv p = *p0;
	void *kr, *qr, *scratch;

	p.dtype = dt;
	kr = raw_of(dt, k, (size_t)p.n_kv_heads * p.prompt_tokens * p.head_dim);
	qr = raw_of(dt, q, (size_t)p.n_q_heads * p.obs_window * p.head_dim);
	scratch = scratch_for(&p);
	assert_int_equal(kvt_snapkv_select(&p, kr, qr, out, scratch), 0);
	free(scratch);
	free(kr);
	free(qr);
}

static void scores_small(enum kvt_dtype dt, const struct kvt_snapkv *p0, uint32_t h, const float *k,
			 const float *q, float *pooled)
{
	struct kvt_snapkv p = *p0;
	void *kr, *qr, *scratch;

	p.dtype = dt;
	kr = raw_of(dt, k, (size_t)p.n_kv_heads * p.prompt_tokens * p.head_dim);
	qr = raw_of(dt, q, (size_t)p.n_q_heads * p.obs_window * p.head_dim);
	scratch = scratch_for(&p);
	assert_int_equal(kvt_snapkv_scores(&p, h, kr, qr, pooled, scratch), 0);
	free(scratch);
	free(kr);
	free(qr);
}

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

/*
 * Ties go to the lower position. head_dim 1, L 5, L_obs 1, sink 0, recent 1, kernel 1.
 * k = [0, 1, 0, 1, 0], the one obs query (p = 4) is q = 1, so s = [0, 1, 0, 1, 0], max 1,
 * exp(s - 1) = [1/e, 1, 1/e, 1, 1/e], sum = 2 + 3/e = 3.103638,
 * w = [0.118532, 0.322202, 0.118532, 0.322202, 0.118532]; vote = w[0 .. 4).
 * Candidates [0, min(5 - 1, 5 - 1)) = [0, 4). Positions 1 and 3 tie exactly (the same
 * arithmetic on the same values), as do 0 and 2.
 *   topk 1 -> {1};  topk 2 -> {1, 3};  topk 3 -> {0, 1, 3} (0 beats 2).
 */
void test_hand_tie(void **state)
{
	static const float k[] = {0, 1, 0, 1, 0}, q[] = {1};
	struct kvt_snapkv p = params(5, 1, 0, 1, 1, 1);
	int32_t out[4];
	float pooled[4];
	size_t d;

	(void)state;
	for (d = 0; d < 3; d++) {
		p.topk = 1;
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 1);
		p.topk = 2;
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 1);
		assert_int_equal(out[1], 3);
		p.topk = 3;
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 0);
		assert_int_equal(out[1], 1);
		assert_int_equal(out[2], 3);
		scores_small(all_dtypes[d], &p, 0, k, q, pooled);
		assert_near(pooled[0], 0.118532, 1e-6);
		assert_near(pooled[1], 0.322202, 1e-6);
		assert_true(pooled[0] == pooled[2]);
		assert_true(pooled[1] == pooled[3]);
	}
}

/*
 * Pooling with zero padding changes the winner. head_dim 1, L 6, L_obs 1, sink 0, recent 1,
 * kernel 3. k = [1, 1, 0, 0, 0, 0], q = 1 at p = 5: exp(s - 1) = [1, 1, 1/e, 1/e, 1/e, 1/e],
 * sum = 2 + 4/e = 3.471518, w = [a, a, b, b, b, b] with a = 0.288058, b = 0.105971.
 * vote (positions 0..4) = [a, a, b, b, b]; candidates [0, 5).
 * Unpooled, 0 and 1 tie and 0 would win. Pooled (padding 1 each side, divide by 3):
 *   p0 = (0 + a + a) / 3 = 0.192039    p1 = (a + a + b) / 3 = 0.227363
 *   p2 = (a + b + b) / 3 = 0.166667    p3 = (b + b + b) / 3 = 0.105971
 *   p4 = (b + b + 0) / 3 = 0.070647
 * topk 1 -> {1}; topk 2 -> {0, 1}. Dividing the edges by the taps inside (2) instead would
 * give p0 = a = 0.288 and pick 0.
 */
void test_hand_pool(void **state)
{
	static const float k[] = {1, 1, 0, 0, 0, 0}, q[] = {1};
	static const double want[] = {0.192039, 0.227363, 0.166667, 0.105971, 0.070647};
	struct kvt_snapkv p = params(6, 1, 0, 1, 1, 3);
	int32_t out[2];
	float pooled[5];
	size_t d, j;

	(void)state;
	for (d = 0; d < 3; d++) {
		p.topk = 1;
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 1);
		p.topk = 2;
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 0);
		assert_int_equal(out[1], 1);
		scores_small(all_dtypes[d], &p, 0, k, q, pooled);
		for (j = 0; j < 5; j++)
			assert_near(pooled[j], want[j], 1e-6);
		/* the unpooled vote picks 0 (tie with 1, lower wins) */
		p.pool_kernel = 1;
		p.topk = 1;
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 0);
		p.pool_kernel = 3;
	}
}

/*
 * GQA (G = 2), two obs queries, causal mask, obs window longer than the recent window.
 * head_dim 1, L 4, L_obs 2 (queries at p = 2 and p = 3), sink 0, recent 1, kernel 1:
 * candidates [0, min(4 - 1, 4 - 2)) = [0, 2). k = [2, 1.5, 0, 4]; query head 0 has q = 1 for
 * both obs queries, query head 1 has q = -1.
 *   g0, p=2: s = [2, 1.5, 0], exp(s-2) = [1, 0.606531, 0.135335], sum 1.741866,
 *            w0 = 0.574097, w1 = 0.348207
 *   g0, p=3: s = [2, 1.5, 0, 4], exp(s-4) = [0.135335, 0.082085, 0.018316, 1], sum 1.235736,
 *            w0 = 0.109518, w1 = 0.066426
 *   g1, p=2: s = [-2, -1.5, 0], exp(s) = [0.135335, 0.223130, 1], sum 1.358465,
 *            w0 = 0.099624, w1 = 0.164252
 *   g1, p=3: s = [-2, -1.5, 0, -4], sum 1.376781, w0 = 0.098298, w1 = 0.162067
 *   vote0 = (0.574097 + 0.109518 + 0.099624 + 0.098298) / 2 = 0.440768
 *   vote1 = (0.348207 + 0.066426 + 0.164252 + 0.162067) / 2 = 0.370476
 * topk 1 -> {0}. Without the causal mask the p=2 query would also see k[3] and weigh like the
 * p=3 one: vote0 = (2 * 0.109518 + 2 * 0.098298) / 2 = 0.207816 < vote1 = 0.228493, picking 1.
 */
void test_hand_causal_gqa(void **state)
{
	static const float k[] = {2, 1.5f, 0, 4}, q[] = {1, 1, -1, -1};
	struct kvt_snapkv p = params(4, 2, 0, 1, 1, 1);
	int32_t out[2];
	float pooled[2];
	size_t d;

	(void)state;
	p.n_q_heads = 2;
	for (d = 0; d < 3; d++) {
		p.topk = 1;
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 0);
		p.topk = 5;
		assert_int_equal(kvt_snapkv_count(&p), 2);
		select_small(all_dtypes[d], &p, k, q, out);
		assert_int_equal(out[0], 0);
		assert_int_equal(out[1], 1);
		scores_small(all_dtypes[d], &p, 0, k, q, pooled);
		assert_near(pooled[0], 0.440768, 2e-6);
		assert_near(pooled[1], 0.370476, 2e-6);
	}
}

/*
 * All keys zero: every logit is 0, so every query spreads 1/(p+1) uniformly and the vote is the
 * same number v at every position (bitwise: the same operations on the same values). With
 * kernel 5 (padding 2) over 36 vote positions the pooled score is 3v/5, 4v/5, v ... v, 4v/5,
 * 3v/5: ties everywhere, resolved toward lower positions. Exercises the heap on many ties.
 */
void test_uniform_ties(void **state)
{
	struct kvt_snapkv p = params(40, 4, 0, 4, 10, 5);
	float k[2 * 40 * 3] = {0}, q[4 * 4 * 3];
	int32_t out[2 * 36];
	size_t d, i;
	uint32_t h;

	(void)state;
	p.n_kv_heads = 2;
	p.n_q_heads = 4;
	p.head_dim = 3;
	for (i = 0; i < sizeof(q) / sizeof(q[0]); i++)
		q[i] = (float)(int)(i % 7) - 3.0f;
	for (d = 0; d < 3; d++) {
		p.topk = 10; /* interior ties: 2 .. 11 */
		select_small(all_dtypes[d], &p, k, q, out);
		for (h = 0; h < 2; h++)
			for (i = 0; i < 10; i++)
				assert_int_equal(out[h * 10 + i], 2 + i);
		p.topk = 33; /* all 32 interior ones (2 .. 33), then 1 beats 34 */
		select_small(all_dtypes[d], &p, k, q, out);
		for (h = 0; h < 2; h++)
			for (i = 0; i < 33; i++)
				assert_int_equal(out[h * 33 + i], 1 + i);
		p.topk = 35; /* ... then 0 beats 35 */
		select_small(all_dtypes[d], &p, k, q, out);
		for (h = 0; h < 2; h++)
			for (i = 0; i < 35; i++)
				assert_int_equal(out[h * 35 + i], i);
		p.sink = 3; /* candidates [3, 36): 3..33 first, then 34 */
		p.topk = 32;
		select_small(all_dtypes[d], &p, k, q, out);
		for (h = 0; h < 2; h++)
			for (i = 0; i < 32; i++)
				assert_int_equal(out[h * 32 + i], 3 + i);
		p.sink = 0;
	}
}

/* A NaN key makes every weight NaN (it is in every obs query's softmax), so every score is NaN;
   they all tie and the lowest candidates win. A NaN must not poison the order otherwise. */
void test_nan_scores(void **state)
{
	struct kvt_snapkv p = params(30, 2, 3, 4, 5, 3);
	float k[30], q[2], pooled[28];
	void *scratch = scratch_for(&p);
	int32_t out[5];
	size_t i;

	(void)state;
	for (i = 0; i < 30; i++)
		k[i] = (float)(i % 5) / 4.0f;
	k[17] = NAN;
	q[0] = 1;
	q[1] = -1;
	assert_int_equal(kvt_snapkv_scores(&p, 0, k, q, pooled, scratch), 0);
	for (i = 0; i < 28; i++)
		assert_true(isnan(pooled[i]));
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), 0);
	for (i = 0; i < 5; i++)
		assert_int_equal(out[i], 3 + i);
	free(scratch);
}

/* ---- random against naive --------------------------------------------------------------- */

void test_random_vs_naive(void **state)
{
	static const struct {
		uint32_t L, Lobs, sink, recent, topk, kernel, D;
	} combos[] = {
		{64, 8, 4, 8, 16, 7, 4},      /* the usual shape */
		{50, 12, 0, 4, 10, 5, 3},     /* sink 0; obs longer than recent */
		{40, 4, 2, 6, 100, 1, 2},     /* fewer candidates than K, no pooling */
		{33, 1, 1, 1, 5, 3, 1},	      /* head_dim 1, one obs query */
		{20, 19, 0, 1, 3, 9, 2},      /* one candidate, kernel wider than the vote */
		{30, 30, 2, 2, 4, 3, 2},      /* L == L_obs: count 0 */
		{12, 4, 4, 8, 4, 3, 2},	      /* L == sink + recent: Case 1 */
		{13, 1, 4, 8, 4, 3, 2},	      /* L == sink + recent + 1: one candidate */
		{300, 16, 8, 32, 40, 7, 8},   /* larger, heap busy */
		{257, 3, 5, 0, 64, 11, 5},    /* recent 0 */
		{90, 7, 1, 3, 1, 3, 6},	      /* K = 1 */
		{90, 7, 1, 3, 0, 3, 6},	      /* K = 0 */
		{2000, 4, 16, 64, 100, 7, 4}, /* long vote, small K */
	};
	static const uint32_t groups[] = {1, 2, 4, 8};
	size_t c, g, d;

	(void)state;
	t_rng_seed(1234);
	max_swap_gap = 0;
	for (c = 0; c < sizeof(combos) / sizeof(combos[0]); c++) {
		for (g = 0; g < 4; g++) {
			for (d = 0; d < 3; d++) {
				struct kvt_snapkv p =
					params(combos[c].L, combos[c].Lobs, combos[c].sink,
					       combos[c].recent, combos[c].topk, combos[c].kernel);

				if (combos[c].L >= 2000 && groups[g] > 2)
					continue; /* keeps the sanitizer build quick */
				p.n_kv_heads = 2;
				p.n_q_heads = 2 * groups[g];
				p.head_dim = combos[c].D;
				check_vs_naive(all_dtypes[d], p);
			}
		}
	}
	if (max_swap_gap > 0)
		print_message("# near-tie swaps accepted, largest relative gap %.3g\n",
			      max_swap_gap);
}

/* kvt_snapkv_scores against the naive pooled vote, within 1e-5 relative, every head. */
void test_scores_vs_naive(void **state)
{
	static const struct {
		uint32_t L, Lobs, kernel, D, G;
	} combos[] = {
		{64, 8, 7, 4, 1}, {50, 12, 5, 3, 2}, {200, 16, 7, 8, 4},
		{33, 1, 1, 1, 8}, {20, 19, 9, 2, 2}, {257, 0, 3, 5, 2}, /* no obs: all 0 */
	};
	size_t c, d, j;
	uint32_t h;

	(void)state;
	t_rng_seed(99);
	for (c = 0; c < sizeof(combos) / sizeof(combos[0]); c++) {
		for (d = 0; d < 3; d++) {
			struct kvt_snapkv p =
				params(combos[c].L, combos[c].Lobs, 0, 1, 8, combos[c].kernel);
			size_t n = combos[c].L - combos[c].Lobs;
			struct tensor k, q;
			double *want = malloc(n * sizeof(double));
			float *got = malloc(n * sizeof(float));
			void *scratch;

			assert_non_null(want);
			assert_non_null(got);
			p.dtype = all_dtypes[d];
			p.n_kv_heads = 3;
			p.n_q_heads = 3 * combos[c].G;
			p.head_dim = combos[c].D;
			tensor_make(&k, p.dtype,
				    (size_t)p.n_kv_heads * p.prompt_tokens * p.head_dim);
			tensor_make(&q, p.dtype, (size_t)p.n_q_heads * p.obs_window * p.head_dim);
			scratch = scratch_for(&p);
			for (h = 0; h < p.n_kv_heads; h++) {
				assert_int_equal(
					kvt_snapkv_scores(&p, h, k.raw, q.raw, got, scratch), 0);
				naive_pooled(&p, h, k.f, q.f, want);
				for (j = 0; j < n; j++) {
					double err = fabs(got[j] - want[j]);

					if (!(err <= 1e-5 * fabs(want[j]) + 1e-30))
						fail_at(__FILE__, __LINE__,
							"%s combo %zu h%u pos %zu: %.9g vs %.9g",
							dtype_name[d], c, h, j, got[j], want[j]);
				}
			}
			free(scratch);
			free(want);
			free(got);
			tensor_free(&k);
			tensor_free(&q);
		}
	}
}
