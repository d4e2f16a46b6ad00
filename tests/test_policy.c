/* SPDX-License-Identifier: MIT */
/*
 * policy: dtype conversion, the ring rule, SnapKV selection and reference attention.
 *
 * SnapKV is checked three ways: small cases worked out by hand (the arithmetic is in the
 * comments), a naive double-precision implementation written straight from docs/design.md (full
 * sort, no heap, no scratch) on random inputs, and structural properties (ties, padding, NaN).
 * Random inputs are multiples of 1/128 in [-2, 2], exactly representable in f16 and bf16, so
 * the naive code reads the very same values as the library without going through its
 * conversions.
 */
#include "test_policy.h"

const enum kvt_dtype all_dtypes[] = {KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16};
const char *const dtype_name[] = {"f32", "f16", "bf16"};

/* ---- helpers ---------------------------------------------------------------------------- */

uint32_t bits_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

float float_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

float to_f32_one(enum kvt_dtype dt, uint16_t h)
{
	float f;

	kvt_to_f32(dt, &h, &f, 1);
	return f;
}

uint16_t from_f32_one(enum kvt_dtype dt, float f)
{
	uint16_t h;

	kvt_from_f32(dt, &f, &h, 1);
	return h;
}

bool f16_is_nan(uint16_t h)
{
	return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

bool bf16_is_nan(uint16_t h)
{
	return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
}

/* uniform integer in [lo, hi] */
static int rng_int(int lo, int hi)
{
	return lo + (int)(t_rng_next() % (uint64_t)(hi - lo + 1));
}

void tensor_make(struct tensor *t, enum kvt_dtype dt, size_t n)
{
	float *back = malloc((n ? n : 1) * sizeof(float));
	size_t i;

	t->f = malloc((n ? n : 1) * sizeof(float));
	t->raw = malloc((n ? n : 1) * kvt_dtype_size(dt));
	assert_non_null(t->f);
	assert_non_null(t->raw);
	assert_non_null(back);
	for (i = 0; i < n; i++)
		t->f[i] = (float)rng_int(-255, 255) / 128.0f;
	kvt_from_f32(dt, t->f, t->raw, n);
	kvt_to_f32(dt, t->raw, back, n);
	assert_memory_equal(back, t->f, n * sizeof(float));
	free(back);
}

void tensor_free(struct tensor *t)
{
	free(t->f);
	free(t->raw);
}

/* Stores f32 values into a dtype buffer; the values must be exact in that dtype. */
void *raw_of(enum kvt_dtype dt, const float *f, size_t n)
{
	void *raw = malloc((n ? n : 1) * kvt_dtype_size(dt));
	float *back = malloc((n ? n : 1) * sizeof(float));

	assert_non_null(raw);
	assert_non_null(back);
	kvt_from_f32(dt, f, raw, n);
	kvt_to_f32(dt, raw, back, n);
	assert_memory_equal(back, f, n * sizeof(float));
	free(back);
	return raw;
}

/* Scratch of exactly the advertised size (ASan catches any overrun), filled with NaN bytes so
   a result that depends on stale scratch shows. */
void *scratch_for(const struct kvt_snapkv *p)
{
	size_t n = kvt_snapkv_scratch_bytes(p);
	void *s = malloc(n ? n : 1);

	assert_non_null(s);
	memset(s, 0xff, n);
	return s;
}

/* ---- naive SnapKV, straight from docs/design.md, in double ---------------------------------- */

static int64_t naive_count(const struct kvt_snapkv *p)
{
	int64_t L = p->prompt_tokens, hi, c;

	if (p->topk == 0 || L <= (int64_t)p->sink + p->recent)
		return 0;
	hi = L - p->recent;
	if (L - (int64_t)p->obs_window < hi)
		hi = L - (int64_t)p->obs_window;
	c = hi - (int64_t)p->sink;
	if (c <= 0)
		return 0;
	return c < p->topk ? c : p->topk;
}

/* pooled[0 .. L - L_obs) of kv head h; k and q are f32 copies of the inputs */
void naive_pooled(const struct kvt_snapkv *p, uint32_t h, const float *k, const float *q,
		  double *pooled)
{
	int64_t L = p->prompt_tokens, Lobs = p->obs_window, n = L - Lobs, D = p->head_dim;
	int64_t G = p->n_q_heads / p->n_kv_heads, r = p->pool_kernel / 2;
	double *vote = calloc((size_t)n, sizeof(double));
	double *s = malloc((size_t)L * sizeof(double));
	int64_t g, i, j, t, d;

	assert_non_null(vote);
	assert_non_null(s);
	for (g = h * G; g < h * G + G; g++) {
		for (i = 0; i < Lobs; i++) {
			const float *qi = q + (g * Lobs + i) * D;
			int64_t pi = L - Lobs + i;
			double m = -INFINITY, sum = 0;

			for (j = 0; j <= pi; j++) {
				double dot = 0;

				for (d = 0; d < D; d++)
					dot += (double)qi[d] * k[((int64_t)h * L + j) * D + d];
				s[j] = dot / sqrt((double)D);
				if (s[j] > m)
					m = s[j];
			}
			for (j = 0; j <= pi; j++)
				sum += exp(s[j] - m);
			for (j = 0; j < n; j++)
				vote[j] += exp(s[j] - m) / sum;
		}
	}
	for (j = 0; j < n; j++) {
		double acc = 0;

		for (t = j - r; t <= j + r; t++)
			acc += (t >= 0 && t < n) ? vote[t] / (double)G : 0.0;
		pooled[j] = acc / (double)p->pool_kernel;
	}
	free(vote);
	free(s);
}

struct scored {
	double score;
	int32_t pos;
};

static int cmp_rank(const void *a, const void *b)
{
	const struct scored *x = a, *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	return (x->pos > y->pos) - (x->pos < y->pos);
}

static int cmp_i32(const void *a, const void *b)
{
	int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;

	return (x > y) - (x < y);
}

/* Naive selection of head h: full sort of the candidates. Returns the count; *cutoff gets the
   lowest kept score. */
static int64_t naive_select(const struct kvt_snapkv *p, const double *pooled, int32_t *out,
			    double *cutoff)
{
	int64_t c = naive_count(p), L = p->prompt_tokens, hi, j, n;
	struct scored *cand;

	if (c == 0)
		return 0;
	hi = L - p->recent;
	if (L - (int64_t)p->obs_window < hi)
		hi = L - (int64_t)p->obs_window;
	n = hi - p->sink;
	cand = malloc((size_t)n * sizeof(*cand));
	assert_non_null(cand);
	for (j = 0; j < n; j++) {
		cand[j].pos = (int32_t)(p->sink + j);
		cand[j].score = pooled[p->sink + j];
	}
	qsort(cand, (size_t)n, sizeof(*cand), cmp_rank);
	for (j = 0; j < c; j++)
		out[j] = cand[j].pos;
	*cutoff = cand[c - 1].score;
	qsort(out, (size_t)c, sizeof(*out), cmp_i32);
	free(cand);
	return c;
}

static bool contains(const int32_t *v, int64_t n, int32_t x)
{
	int64_t i;

	for (i = 0; i < n; i++)
		if (v[i] == x)
			return true;
	return false;
}

double max_swap_gap; /* largest relative score gap of an accepted near-tie swap */

void check_vs_naive_at(const char *file, int line, enum kvt_dtype dt, struct kvt_snapkv p)
{
	size_t L = p.prompt_tokens, D = p.head_dim, Lobs = p.obs_window;
	uint32_t count, h;
	struct tensor k, q;
	int32_t *out, *ref;
	double *pooled;
	void *scratch;
	int64_t c, i;
	int err;

	p.dtype = dt;
	count = kvt_snapkv_count(&p);
	if ((int64_t)count != naive_count(&p))
		fail_at(file, line, "count %u, naive %lld", count, (long long)naive_count(&p));
	tensor_make(&k, dt, p.n_kv_heads * L * D);
	tensor_make(&q, dt, p.n_q_heads * Lobs * D);
	out = malloc(((size_t)p.n_kv_heads * count + 1) * sizeof(*out));
	ref = malloc(((size_t)count + 1) * sizeof(*ref));
	pooled = malloc((L + 1) * sizeof(*pooled));
	scratch = scratch_for(&p);
	assert_non_null(out);
	assert_non_null(ref);
	assert_non_null(pooled);
	/* a sentinel past the end: select must write exactly n_kv_heads * count */
	out[(size_t)p.n_kv_heads * count] = -12345;
	err = kvt_snapkv_select(&p, k.raw, q.raw, out, scratch);
	if (err)
		fail_at(file, line, "select returned %d", err);
	if (out[(size_t)p.n_kv_heads * count] != -12345)
		fail_at(file, line, "select wrote past n_kv_heads * count");
	for (h = 0; h < p.n_kv_heads && count; h++) {
		const int32_t *got = out + (size_t)h * count;
		double cutoff = 0;

		naive_pooled(&p, h, k.f, q.f, pooled);
		c = naive_select(&p, pooled, ref, &cutoff);
		if (c != count)
			fail_at(file, line, "naive count %lld", (long long)c);
		for (i = 0; i < c; i++) {
			if (got[i] < (int32_t)p.sink || got[i] >= (int32_t)(L - p.recent) ||
			    got[i] >= (int32_t)(L - Lobs))
				fail_at(file, line, "%s h%u: position %d outside the candidates",
					dtype_name[dt], h, got[i]);
			if (i > 0 && got[i] <= got[i - 1])
				fail_at(file, line, "%s h%u: not strictly ascending at %lld",
					dtype_name[dt], h, (long long)i);
		}
		/* a position on one side only is a swap: it must be a near-tie with the cutoff */
		for (i = 0; i < 2 * c; i++) {
			int32_t x = i < c ? got[i] : ref[i - c];
			double gap;

			if (contains(got, c, x) && contains(ref, c, x))
				continue;
			gap = fabs(pooled[x] - cutoff) / fmax(fabs(cutoff), 1e-300);
			if (!(gap <= 1e-6))
				fail_at(file, line,
					"%s G=%u L=%u Lobs=%u sink=%u recent=%u topk=%u kernel=%u "
					"h%u: position %d (naive score %.9g, cutoff %.9g) differs",
					dtype_name[dt], p.n_q_heads / p.n_kv_heads, p.prompt_tokens,
					p.obs_window, p.sink, p.recent, p.topk, p.pool_kernel, h, x,
					pooled[x], cutoff);
			if (gap > max_swap_gap)
				max_swap_gap = gap;
		}
	}
	free(scratch);
	free(pooled);
	free(ref);
	free(out);
	tensor_free(&k);
	tensor_free(&q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_f16_every_pattern),
		cmocka_unit_test(test_bf16_every_pattern),
		cmocka_unit_test(test_known_values),
		cmocka_unit_test(test_rounding),
		cmocka_unit_test(test_rounding_random),
		cmocka_unit_test(test_ring_slot),
		cmocka_unit_test(test_count),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_hand_tie),
		cmocka_unit_test(test_hand_pool),
		cmocka_unit_test(test_hand_causal_gqa),
		cmocka_unit_test(test_uniform_ties),
		cmocka_unit_test(test_nan_scores),
		cmocka_unit_test(test_random_vs_naive),
		cmocka_unit_test(test_scores_vs_naive),
		cmocka_unit_test(test_attend_vs_naive),
		cmocka_unit_test(test_attend_exact),
		cmocka_unit_test(test_attend_no_rows),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
