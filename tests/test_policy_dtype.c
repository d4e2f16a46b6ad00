/* SPDX-License-Identifier: MIT */
/*
 * policy: dtype conversions, the ring rule, valid_topk's count and invalid parameters.
 */
#include "test_policy.h"

/* ---- dtype ------------------------------------------------------------------------------ */

/* Every f16 pattern: widening equals the value worked out from the fields with ldexp, and
   narrowing gives the pattern back (a NaN stays a NaN of the same sign). */
void test_f16_every_pattern(void **state)
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

void test_bf16_every_pattern(void **state)
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

void test_known_values(void **state)
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

void test_rounding(void **state)
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

void test_rounding_random(void **state)
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

void test_ring_slot(void **state)
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

struct kvt_snapkv params(uint32_t L, uint32_t Lobs, uint32_t sink, uint32_t recent, uint32_t topk,
			 uint32_t kernel)
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

void test_count(void **state)
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

void test_invalid(void **state)
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
