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
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "t_data.h"
#include "policy.h"

static const enum kvt_dtype all_dtypes[] = {KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16};
static const char *const dtype_name[] = {"f32", "f16", "bf16"};

/* ---- helpers ---------------------------------------------------------------------------- */

static uint32_t bits_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float float_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static float to_f32_one(enum kvt_dtype dt, uint16_t h)
{
	float f;

	kvt_to_f32(dt, &h, &f, 1);
	return f;
}

static uint16_t from_f32_one(enum kvt_dtype dt, float f)
{
	uint16_t h;

	kvt_from_f32(dt, &f, &h, 1);
	return h;
}

static bool f16_is_nan(uint16_t h)
{
	return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

static bool bf16_is_nan(uint16_t h)
{
	return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
}

/* uniform integer in [lo, hi] */
static int rng_int(int lo, int hi)
{
	return lo + (int)(t_rng_next() % (uint64_t)(hi - lo + 1));
}

/* A tensor of n random values m/128, |m| <= 255, both as f32 (for the naive code) and as
   dtype (for the library). Exactness of the dtype copy is asserted, not assumed. */
struct tensor {
	float *f;
	void *raw;
};

static void tensor_make(struct tensor *t, enum kvt_dtype dt, size_t n)
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

static void tensor_free(struct tensor *t)
{
	free(t->f);
	free(t->raw);
}

/* Stores f32 values into a dtype buffer; the values must be exact in that dtype. */
static void *raw_of(enum kvt_dtype dt, const float *f, size_t n)
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
static void *scratch_for(const struct kvt_snapkv *p)
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
static void naive_pooled(const struct kvt_snapkv *p, uint32_t h, const float *k, const float *q,
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

static double max_swap_gap; /* largest relative score gap of an accepted near-tie swap */

/* Runs kvt_snapkv_select on random inputs and compares every head with the naive selection.
   The sets must be equal, except that positions whose naive scores lie within 1e-6 (relative)
   of the cutoff may trade places: f32 and double can order such near-ties differently. */
#define check_vs_naive(dt, p) check_vs_naive_at(__FILE__, __LINE__, dt, p)
static void check_vs_naive_at(const char *file, int line, enum kvt_dtype dt, struct kvt_snapkv p)
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

/* ---- dtype ------------------------------------------------------------------------------ */

/* Every f16 pattern: widening equals the value worked out from the fields with ldexp, and
   narrowing gives the pattern back (a NaN stays a NaN of the same sign). */
static void test_f16_every_pattern(void **state)
{
	uint32_t u;

	(void)state;
	for (u = 0; u <= 0xffff; u++) {
		uint16_t h = (uint16_t)u, back;
		int e = (h >> 10) & 0x1f, m = h & 0x3ff;
		double want;
		float f = to_f32_one(KVT_DTYPE_F16, h);

		if (e == 0x1f && m) {
			assert_true(isnan(f));
			back = from_f32_one(KVT_DTYPE_F16, f);
			assert_true(f16_is_nan(back));
			assert_int_equal(back & 0x8000u, h & 0x8000u);
			continue;
		}
		if (e == 0x1f)
			want = INFINITY;
		else if (e == 0)
			want = ldexp(m, -24);
		else
			want = ldexp(1024 + m, e - 25);
		if (h & 0x8000u)
			want = -want;
		if ((double)f != want)
			fail_at(__FILE__, __LINE__, "f16 %#06x -> %.9g, want %.9g", h, f, want);
		assert_int_equal(signbit(f) != 0, (h & 0x8000u) != 0);
		back = from_f32_one(KVT_DTYPE_F16, f);
		if (back != h)
			fail_at(__FILE__, __LINE__, "f16 %#06x -> %a -> %#06x", h, f, back);
	}
}

static void test_bf16_every_pattern(void **state)
{
	uint32_t u;

	(void)state;
	for (u = 0; u <= 0xffff; u++) {
		uint16_t h = (uint16_t)u, back;
		float f = to_f32_one(KVT_DTYPE_BF16, h);

		if (bf16_is_nan(h)) {
			assert_true(isnan(f));
			back = from_f32_one(KVT_DTYPE_BF16, f);
			assert_true(bf16_is_nan(back));
			assert_int_equal(back & 0x8000u, h & 0x8000u);
			continue;
		}
		assert_int_equal(bits_of(f), u << 16);
		back = from_f32_one(KVT_DTYPE_BF16, f);
		if (back != h)
			fail_at(__FILE__, __LINE__, "bf16 %#06x -> %a -> %#06x", h, f, back);
	}
}

static void test_known_values(void **state)
{
	static const struct {
		float f;
		uint16_t f16, bf16;
	} known[] = {
		{1.0f, 0x3c00, 0x3f80},
		{-2.5f, 0xc100, 0xc020},
		{65504.0f, 0x7bff, 0x4780},
		{0.0f, 0x0000, 0x0000},
		{-0.0f, 0x8000, 0x8000},
		{0x1p-24f, 0x0001, 0x3380},
		{0x1p-14f, 0x0400, 0x3880},
		{0x3ffp-24f, 0x03ff, 0x3880},
		{INFINITY, 0x7c00, 0x7f80},
		{-INFINITY, 0xfc00, 0xff80},
		{0.333251953125f, 0x3555, 0x3eab},
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		assert_int_equal(from_f32_one(KVT_DTYPE_F16, known[i].f), known[i].f16);
		assert_int_equal(from_f32_one(KVT_DTYPE_BF16, known[i].f), known[i].bf16);
		assert_int_equal(bits_of(to_f32_one(KVT_DTYPE_F16, known[i].f16)),
				 bits_of(known[i].f));
	}
	/* bf16 values that f16 cannot hold */
	assert_true(to_f32_one(KVT_DTYPE_BF16, 0x0001) == 0x1p-133f); /* smallest subnormal */
	assert_true(to_f32_one(KVT_DTYPE_BF16, 0x7f7f) == 0x1.fep127f);
	assert_true(to_f32_one(KVT_DTYPE_BF16, 0x4049) == 3.140625f);
	/* f32 is a copy, NaN payload and -0 included */
	{
		float src[3] = {float_of(0x7f800001u), -0.0f, 1.5f}, dst[3];

		kvt_to_f32(KVT_DTYPE_F32, src, dst, 3);
		assert_memory_equal(src, dst, sizeof(src));
		kvt_from_f32(KVT_DTYPE_F32, src, dst, 3);
		assert_memory_equal(src, dst, sizeof(src));
	}
}

static void test_rounding(void **state)
{
	static const struct {
		uint32_t in;
		uint16_t out;
	} bf16[] =
		{
			{0x3f808000u, 0x3f80}, /* 1 + 2^-8: tie, down to even */
			{0x3f818000u, 0x3f82}, /* tie, up to even */
			{0x3f808001u, 0x3f81}, /* just past the tie */
			{0x3f807fffu, 0x3f80}, /* just short of it */
			{0xbf818000u, 0xbf82}, /* sign does not matter */
			{0x7f7fffffu, 0x7f80}, /* FLT_MAX overflows to inf */
			{0x7f7f7fffu, 0x7f7f}, /* ... this does not */
			{0x00008000u, 0x0000}, /* f32 subnormal tie to even 0 */
			{0x00018000u, 0x0002}, /* f32 subnormal tie up to even */
			{0x007fffffu, 0x0080}, /* largest f32 subnormal rounds up to a normal */
		},
	  f16[] = {
		  {0x3f801000u, 0x3c00}, /* 1 + 2^-11: tie, down to even */
		  {0x3f803000u, 0x3c02}, /* 1 + 3*2^-11: tie, up to even */
		  {0x3f801001u, 0x3c01}, /* just past the tie */
		  {0x3f800fffu, 0x3c00},
		  {0x477fefffu, 0x7bff}, /* just below 65520: 65504 */
		  {0x477ff000u, 0x7c00}, /* 65520: tie between 65504 (odd) and 2^16: inf */
		  {0xc77ff000u, 0xfc00},
		  {0x7f7fffffu, 0x7c00}, /* FLT_MAX */
		  {0x33000000u, 0x0000}, /* 2^-25: tie between 0 and 2^-24, even is 0 */
		  {0x33000001u, 0x0001}, /* just past it */
		  {0xb3000001u, 0x8001},
		  {0x32ffffffu, 0x0000},
		  {0x33c00000u, 0x0002}, /* 3*2^-25 = 1.5 * 2^-24: tie up to 2 */
		  {0x34200000u, 0x0002}, /* 5*2^-25 = 2.5 * 2^-24: tie down to 2 */
		  {0x34600000u, 0x0004}, /* 7*2^-25 = 3.5 * 2^-24: tie up to 4 */
		  {0x387fe000u, 0x0400}, /* 1023.5 * 2^-24: tie, carries into the smallest normal */
		  {0x387fdfffu, 0x03ff},
		  {0x38801000u, 0x0400}, /* smallest normal + half an ulp: tie to even */
		  {0x00000001u, 0x0000}, /* f32 subnormal */
	  };
	size_t i;
	uint16_t h;

	(void)state;
	for (i = 0; i < sizeof(bf16) / sizeof(bf16[0]); i++) {
		h = from_f32_one(KVT_DTYPE_BF16, float_of(bf16[i].in));
		if (h != bf16[i].out)
			fail_at(__FILE__, __LINE__, "bf16(%#010x) = %#06x, want %#06x", bf16[i].in,
				h, bf16[i].out);
	}
	for (i = 0; i < sizeof(f16) / sizeof(f16[0]); i++) {
		h = from_f32_one(KVT_DTYPE_F16, float_of(f16[i].in));
		if (h != f16[i].out)
			fail_at(__FILE__, __LINE__, "f16(%#010x) = %#06x, want %#06x", f16[i].in, h,
				f16[i].out);
	}
	/* NaN: quiet NaN out, signaling in (payload only in the low bits) included */
	assert_true(f16_is_nan(from_f32_one(KVT_DTYPE_F16, float_of(0x7fc00000u))));
	assert_true(f16_is_nan(from_f32_one(KVT_DTYPE_F16, float_of(0x7f800001u))));
	assert_true(f16_is_nan(from_f32_one(KVT_DTYPE_F16, float_of(0xff800001u))));
	assert_true(bf16_is_nan(from_f32_one(KVT_DTYPE_BF16, float_of(0x7f800001u))));
	assert_true(bf16_is_nan(from_f32_one(KVT_DTYPE_BF16, float_of(0xffc00000u))));
	assert_int_equal(from_f32_one(KVT_DTYPE_F16, float_of(0x7f800001u)) & 0x200u, 0x200u);
	assert_int_equal(from_f32_one(KVT_DTYPE_BF16, float_of(0x7f800001u)) & 0x40u, 0x40u);
}

/* Random f32 inputs: the result must be a nearest representable value, the even one on a tie.
   Checked against both neighbours in double, which holds every f16/bf16/f32 value exactly. */
static void check_nearest(enum kvt_dtype dt, float x)
{
	uint16_t h = from_f32_one(dt, x), lo, hi;
	double v = to_f32_one(dt, h), d = fabs(v - x), dn;
	uint16_t mag = h & 0x7fffu, maxfin = dt == KVT_DTYPE_F16 ? 0x7bff : 0x7f7f;

	if (isinf(v)) {
		/* overflow: x must be at least halfway between the largest finite and the next
		   power of two */
		double big = to_f32_one(dt, maxfin), step = big - to_f32_one(dt, maxfin - 1);

		if (!(fabs(x) >= big + step / 2))
			fail_at(__FILE__, __LINE__, "%s(%a) overflowed", dtype_name[dt], x);
		return;
	}
	lo = mag ? (uint16_t)(h - 1) : h;
	hi = mag < maxfin ? (uint16_t)(h + 1) : h;
	dn = fabs((double)to_f32_one(dt, lo) - x);
	if (dn < d || (dn == d && lo != h && (h & 1)))
		fail_at(__FILE__, __LINE__, "%s(%a) = %#06x, lower neighbour nearer",
			dtype_name[dt], x, h);
	dn = fabs((double)to_f32_one(dt, hi) - x);
	if (dn < d || (dn == d && hi != h && (h & 1)))
		fail_at(__FILE__, __LINE__, "%s(%a) = %#06x, upper neighbour nearer",
			dtype_name[dt], x, h);
}

static void test_rounding_random(void **state)
{
	int i;

	(void)state;
	t_rng_seed(7);
	for (i = 0; i < 300000; i++) {
		uint32_t u = (uint32_t)t_rng_next();
		/* f16: exponents around its range (2^-30 .. 2^17), any mantissa and sign */
		uint32_t e16 = 97 + (uint32_t)(t_rng_next() % 48);
		float x16 = float_of((u & 0x807fffffu) | (e16 << 23));
		float xb = float_of(u);

		check_nearest(KVT_DTYPE_F16, x16);
		if (!isnan(xb))
			check_nearest(KVT_DTYPE_BF16, xb);
	}
}

/* ---- ring rule -------------------------------------------------------------------------- */

static void test_ring_slot(void **state)
{
	(void)state;
	/* sink 4, recent 8: sinks map to themselves, then slots 4..11 repeat every 8 */
	assert_int_equal(kvt_ring_slot(0, 4, 8), 0);
	assert_int_equal(kvt_ring_slot(3, 4, 8), 3);
	assert_int_equal(kvt_ring_slot(4, 4, 8), 4);
	assert_int_equal(kvt_ring_slot(11, 4, 8), 11);
	assert_int_equal(kvt_ring_slot(12, 4, 8), 4);
	assert_int_equal(kvt_ring_slot(13, 4, 8), 5);
	assert_int_equal(kvt_ring_slot(100, 4, 8), 4); /* 4 + 96 % 8 */
	assert_int_equal(kvt_ring_slot(101, 4, 8), 5);
	/* sink 0: a plain ring */
	assert_int_equal(kvt_ring_slot(0, 0, 8), 0);
	assert_int_equal(kvt_ring_slot(7, 0, 8), 7);
	assert_int_equal(kvt_ring_slot(8, 0, 8), 0);
	assert_int_equal(kvt_ring_slot(17, 0, 8), 1);
	/* recent 1: every non-sink position shares slot `sink` */
	assert_int_equal(kvt_ring_slot(1, 2, 1), 1);
	assert_int_equal(kvt_ring_slot(2, 2, 1), 2);
	assert_int_equal(kvt_ring_slot(5, 2, 1), 2);
	/* the design's numbers: sink 128, recent 512 */
	assert_int_equal(kvt_ring_slot(639, 128, 512), 639);
	assert_int_equal(kvt_ring_slot(640, 128, 512), 128);
	assert_int_equal(kvt_ring_slot(131071, 128, 512), 128 + (131071 - 128) % 512);
	/* the ring lays N consecutive positions into distinct slots while N <= recent */
	{
		uint32_t seen[8] = {0}, pos;

		for (pos = 37; pos < 37 + 8; pos++)
			seen[kvt_ring_slot(pos, 3, 8) - 3]++;
		for (pos = 0; pos < 8; pos++)
			assert_int_equal(seen[pos], 1);
	}
}

/* ---- count ------------------------------------------------------------------------------ */

static struct kvt_snapkv params(uint32_t L, uint32_t Lobs, uint32_t sink, uint32_t recent,
				uint32_t topk, uint32_t kernel)
{
	struct kvt_snapkv p = {
		.n_kv_heads = 1,
		.n_q_heads = 1,
		.head_dim = 1,
		.dtype = KVT_DTYPE_F32,
		.prompt_tokens = L,
		.obs_window = Lobs,
		.sink = sink,
		.recent = recent,
		.topk = topk,
		.pool_kernel = kernel,
	};
	return p;
}

static void test_count(void **state)
{
	struct kvt_snapkv p;

	(void)state;
	/* Case 1 boundary: sink 4 + recent 8 = 12 */
	p = params(12, 2, 4, 8, 16, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	p = params(13, 2, 4, 8, 16, 7); /* candidates [4, min(5, 11)) = {4} */
	assert_int_equal(kvt_snapkv_count(&p), 1);
	p = params(11, 2, 4, 8, 16, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	/* fewer candidates than K: [4, min(92, 98)) holds 88 */
	p = params(100, 2, 4, 8, 1000, 7);
	assert_int_equal(kvt_snapkv_count(&p), 88);
	p = params(100, 2, 4, 8, 88, 7);
	assert_int_equal(kvt_snapkv_count(&p), 88);
	p = params(100, 2, 4, 8, 87, 7);
	assert_int_equal(kvt_snapkv_count(&p), 87);
	/* obs window longer than the recent window: bound is L - L_obs = 70, so [4, 70) */
	p = params(100, 30, 4, 8, 1000, 7);
	assert_int_equal(kvt_snapkv_count(&p), 66);
	/* ... and it can empty the interval past Case 1: [4, min(12, 4)) */
	p = params(20, 16, 4, 8, 10, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	p = params(20, 15, 4, 8, 10, 7); /* [4, 5) */
	assert_int_equal(kvt_snapkv_count(&p), 1);
	/* L <= L_obs: no votes (and no underflow) */
	p = params(40, 40, 4, 8, 10, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	p = params(40, 4000, 4, 8, 10, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	/* topk 0 */
	p = params(1000, 8, 4, 8, 0, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	/* sink 0, recent 0, no obs: every position is a candidate */
	p = params(50, 0, 0, 0, 1000, 1);
	assert_int_equal(kvt_snapkv_count(&p), 50);
	/* sums that would wrap in 32 bits */
	p = params(100, 2, UINT32_MAX, 8, 10, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	p = params(100, 2, 4, UINT32_MAX, 10, 7);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	/* the design's numbers: sink 128, recent 512, K 4096, obs 32, L 128K */
	p = params(131072, 32, 128, 512, 4096, 7);
	assert_int_equal(kvt_snapkv_count(&p), 4096);
	/* count is 0 for parameters select would refuse */
	p = params(100, 2, 4, 8, 10, 4);
	assert_int_equal(kvt_snapkv_count(&p), 0);
	assert_int_equal(kvt_snapkv_count(NULL), 0);
}

/* ---- invalid parameters ----------------------------------------------------------------- */

static void test_invalid(void **state)
{
	float k[64] = {0}, q[8] = {0}, pooled[64];
	int32_t out[64];
	struct kvt_snapkv good = params(40, 4, 2, 4, 8, 3), p;
	void *scratch = scratch_for(&good);

	(void)state;
	assert_int_equal(kvt_snapkv_select(&good, k, q, out, scratch), 0);
	assert_int_equal(kvt_snapkv_scores(&good, 0, k, q, pooled, scratch), 0);

	assert_int_equal(kvt_snapkv_select(NULL, k, q, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scores(NULL, 0, k, q, pooled, scratch), -EINVAL);
	p = good;
	p.n_kv_heads = 0;
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scratch_bytes(&p), 0);
	p = good;
	p.n_q_heads = 0;
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	p = good;
	p.head_dim = 0;
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scores(&p, 0, k, q, pooled, scratch), -EINVAL);
	p = good;
	p.n_kv_heads = 2;
	p.n_q_heads = 3; /* not a multiple */
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scores(&p, 0, k, q, pooled, scratch), -EINVAL);
	p = good;
	p.pool_kernel = 4;
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	p.pool_kernel = 0;
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scores(&p, 0, k, q, pooled, scratch), -EINVAL);
	p = good;
	p.dtype = (enum kvt_dtype)7;
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	p = good;
	p.prompt_tokens = (uint32_t)INT32_MAX + 1u; /* positions would not fit an int32_t */
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	p = good;
	p.head_dim = UINT32_MAX;
	p.prompt_tokens = INT32_MAX; /* scratch size overflows */
	assert_int_equal(kvt_snapkv_select(&p, k, q, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scratch_bytes(&p), 0);
	/* NULL buffers where something must be read or written */
	assert_int_equal(kvt_snapkv_select(&good, NULL, q, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_select(&good, k, NULL, out, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_select(&good, k, q, NULL, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_select(&good, k, q, out, NULL), -EINVAL);
	assert_int_equal(kvt_snapkv_scores(&good, 0, NULL, q, pooled, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scores(&good, 0, k, q, NULL, scratch), -EINVAL);
	assert_int_equal(kvt_snapkv_scores(&good, 0, k, q, pooled, NULL), -EINVAL);
	/* head out of range */
	assert_int_equal(kvt_snapkv_scores(&good, 1, k, q, pooled, scratch), -EINVAL);
	/* count 0: nothing is read, so NULL tensors (and out, scratch) are fine */
	p = params(12, 2, 4, 8, 16, 7); /* Case 1 */
	assert_int_equal(kvt_snapkv_select(&p, NULL, NULL, NULL, NULL), 0);
	p = params(40, 4, 2, 4, 0, 3); /* topk 0 */
	assert_int_equal(kvt_snapkv_select(&p, NULL, NULL, NULL, NULL), 0);
	p = params(40, 40, 2, 4, 8, 3); /* L <= L_obs */
	assert_int_equal(kvt_snapkv_select(&p, NULL, NULL, NULL, NULL), 0);
	assert_int_equal(kvt_snapkv_scores(&p, 0, NULL, NULL, NULL, NULL), 0);
	assert_int_equal(kvt_snapkv_scratch_bytes(&p), 0);
	free(scratch);
}

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
static void test_hand_tie(void **state)
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
static void test_hand_pool(void **state)
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
static void test_hand_causal_gqa(void **state)
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
static void test_uniform_ties(void **state)
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
static void test_nan_scores(void **state)
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

static void test_random_vs_naive(void **state)
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
static void test_scores_vs_naive(void **state)
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

/* ---- attention -------------------------------------------------------------------------- */

/* Segment s row i lives at row (i * SPREAD + s) of a buffer of rows of KPITCH (keys) or VPITCH
   (values) elements, so the segments interleave, the strides are larger than a row and K and V
   strides differ. */
static void test_attend_vs_naive(void **state)
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
static void test_attend_exact(void **state)
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

static void test_attend_no_rows(void **state)
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
