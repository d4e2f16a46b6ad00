/* SPDX-License-Identifier: MIT */
/*
 * kernel-emu: the CUDA backend's real kernels (transfer/cuda_gather.cu, policy/snapkv.cu,
 * recall.cu, attend.cu), compiled for the CPU kernel emulator (kemu.h), against the host
 * references on the same inputs, as the GPU suite compares them on a GPU:
 *   - the gather and the decode append: every destination byte bit-exact, nothing else written,
 *     for each of the kernel's copy widths, and the CTA bound (<= 16 by default);
 *   - block metadata: bit-exact with kvt_meta_build, NaN, infinities and signed zeros included;
 *   - the decode fold of block metadata: bit-exact with kvt_meta_init/kvt_meta_add, sequences
 *     without metadata untouched, and folds token by token equal to kvt_meta_build;
 *   - SnapKV: pooled scores within f32 rounding of kvt_snapkv_scores, the selection identical up
 *     to ties at the cutoff (a differing position must score within 1e-4 of the cutoff);
 *   - decode attention: within f32 tolerance of kvt_attend_rows, heads without rows zeroed;
 *   - the wrappers' argument checks;
 *   - and the emulator itself: a __syncthreads() or shuffle some threads miss fails the launch.
 * Device memory is host memory here, so under ASan every kernel access is bounds-checked.
 */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "t_data.h"
#include "attn_row.h"
#include "gather.h"
#include "gpu.h"
#include "kemu_api.h"
#include "policy.h"
#include "selftest.h"

/* Uniform in [-1, 1). */
static float rndf(void)
{
	return (float)((double)(t_rng_next() >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static void fill_bytes(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)t_rng_next();
}

/* ---- gather and append ------------------------------------------------------------------ */

/* n pieces of about `bytes` each, aligned to `align` (1, 4 or 16), scattered over src and
   placed without overlap in dst; checks every byte of dst. */
static void gather_case(uint32_t n, uint32_t bytes, uint32_t align, uint32_t ctas,
			uint32_t want_grid)
{
	size_t slot = (size_t)bytes + 64, total = slot * n;
	uint8_t *src = t_xmalloc(total + 64), *dst = t_xmalloc(total + 64),
		*want = t_xmalloc(total + 64);
	struct kvt_gpu_piece *pc = t_xmalloc(n * sizeof(*pc));
	struct kemu_launch_info li;
	uint32_t *perm = t_xmalloc(n * sizeof(*perm));

	fill_bytes(src, total + 64);
	fill_bytes(dst, total + 64);
	memcpy(want, dst, total + 64);
	for (uint32_t i = 0; i < n; i++)
		perm[i] = i;
	for (uint32_t i = n; i > 1; i--) { /* sources in shuffled order */
		uint32_t j = (uint32_t)(t_rng_next() % i), t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
	for (uint32_t i = 0; i < n; i++) {
		/* offsets that are multiples of align and of nothing wider (align 1: odd) */
		size_t so = (size_t)perm[i] * slot + align, dofs = (size_t)i * slot + 2 * align;
		uint64_t len = bytes - (align == 16 ? 0 : align == 4 ? 4 : 1) * (t_rng_next() % 3);

		pc[i] = (struct kvt_gpu_piece){(uint64_t)(uintptr_t)(src + so),
					       (uint64_t)(uintptr_t)(dst + dofs), len};
		memcpy(want + dofs, src + so, len);
	}
	assert_int_equal(kvt_gather_launch(pc, n, ctas, NULL), 0);
	kemu_get_launch_info(&li);
	assert_int_equal(li.grid[0], want_grid);
	assert_int_equal(li.block[0], KVT_GATHER_THREADS);
	assert_memory_equal(dst, want, total + 64);
	free(perm);
	free(pc);
	free(want);
	free(dst);
	free(src);
}

static void test_gather(void **state)
{
	(void)state;
	t_rng_seed(1);
	gather_case(40, 16384, 16, 0, KVT_GATHER_CTAS_DEFAULT); /* 16-byte vectors, default CTAs */
	gather_case(5, 4096, 16, 0, 5);				/* fewer pieces than CTAs */
	gather_case(33, 4100, 4, 1, 1);				/* words, one CTA */
	gather_case(17, 777, 1, 3, 3);				/* bytes */
	gather_case(3000, 16, 16, 5000, KVT_GATHER_CTAS_MAX);	/* clamped to the maximum */
	gather_case(64, 65536, 16, 16, 16);			/* 64 KiB pieces */
}

static void append_case(uint32_t n, uint32_t n_heads, uint32_t row_bytes, uint32_t want_threads)
{
	size_t in_bytes = (size_t)n * n_heads * row_bytes;
	uint64_t head_stride = (uint64_t)row_bytes * 3, v_offset = row_bytes;
	size_t frame = head_stride * n_heads + 32, arena = frame * n;
	uint8_t *k = t_xmalloc(in_bytes), *v = t_xmalloc(in_bytes);
	uint8_t *dev = t_xmalloc(arena), *want = t_xmalloc(arena);
	uint64_t *at = t_xmalloc(n * sizeof(*at));
	struct kemu_launch_info li;

	fill_bytes(k, in_bytes);
	fill_bytes(v, in_bytes);
	fill_bytes(dev, arena);
	memcpy(want, dev, arena);
	for (uint32_t i = 0; i < n; i++) {
		size_t f = (size_t)(n - 1 - i) * frame + 16; /* frames in reverse order */

		at[i] = (uint64_t)(uintptr_t)(dev + f);
		for (uint32_t h = 0; h < n_heads; h++) {
			size_t r = ((size_t)i * n_heads + h) * row_bytes;

			memcpy(want + f + h * head_stride, k + r, row_bytes);
			memcpy(want + f + h * head_stride + v_offset, v + r, row_bytes);
		}
	}
	assert_int_equal(kvt_append_launch((uint64_t)(uintptr_t)k, (uint64_t)(uintptr_t)v, n, at,
					   n_heads, row_bytes, head_stride, v_offset, 0, NULL),
			 0);
	kemu_get_launch_info(&li);
	assert_int_equal(li.block[0], want_threads);
	assert_true(li.grid[0] <= KVT_GATHER_CTAS_DEFAULT);
	assert_memory_equal(dev, want, arena);
	free(at);
	free(want);
	free(dev);
	free(v);
	free(k);
}

static void test_append(void **state)
{
	(void)state;
	t_rng_seed(2);
	append_case(7, 8, 256, 32);   /* Llama-3-8B f16 rows: a warp per row */
	append_case(3, 2, 2048, 128); /* wide rows: four warps */
	append_case(20, 1, 36, 32);   /* 4-byte words */
	append_case(1, 3, 10, 32);    /* bytes */
	assert_int_equal(kvt_append_launch(0, 0, 0, NULL, 8, 256, 0, 0, 0, NULL), 0); /* no rows */
}

/* ---- block metadata ----------------------------------------------------------------------- */

static const uint32_t special32[] = {
	0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u, 0x00000000u,
	0x80000000u, 0x00000001u, 0x80000001u, 0x7f7fffffu, 0xff7fffffu,
};
static const uint16_t special16[] = {0x7e00u, 0xfe01u, 0x7c00u, 0xfc00u, 0x0000u,
				     0x8000u, 0x0001u, 0x8001u, 0x7bffu, 0xfbffu};
static const uint16_t specialbf[] = {0x7fc0u, 0xffc1u, 0x7f80u, 0xff80u, 0x0000u,
				     0x8000u, 0x0001u, 0x8001u, 0x7f7fu, 0xff7fu};

/* Writes special value s (0-9: NaNs, infinities, signed zeros, the smallest subnormals, the
   largest finite values) of dt at p. */
static void put_special(enum kvt_dtype dt, void *p, uint32_t s)
{
	if (dt == KVT_DTYPE_F32)
		memcpy(p, &special32[s], 4);
	else
		memcpy(p, dt == KVT_DTYPE_F16 ? &special16[s] : &specialbf[s], 2);
}

/* n random elements of dt in [-1, 1), with a special value in about 1 of `special_every`. */
static void *rand_tensor(enum kvt_dtype dt, size_t n, uint32_t special_every)
{
	uint32_t es = kvt_dtype_size(dt);
	uint8_t *p = t_xmalloc(n * es);

	for (size_t i = 0; i < n; i++) {
		float f = rndf();

		kvt_from_f32(dt, &f, p + i * es, 1);
		if (special_every && t_rng_next() % special_every == 0)
			put_special(dt, p + i * es, (uint32_t)(t_rng_next() % 10));
	}
	return p;
}

static void meta_case(enum kvt_dtype dt, uint32_t D, uint32_t H, uint32_t L, uint32_t bt,
		      uint32_t special_every)
{
	uint32_t es = kvt_dtype_size(dt), nb = (L + bt - 1) / bt;
	size_t mb = 2 * (size_t)D * es, all = (size_t)nb * H * mb;
	uint8_t *k = rand_tensor(dt, (size_t)H * L * D, special_every);
	uint8_t *got = t_xmalloc(all + 8), *want = t_xmalloc(all);

	memset(got, 0x5a, all + 8);
	for (uint32_t b = 0; b < nb; b++)
		for (uint32_t h = 0; h < H; h++) {
			uint32_t r0 = b * bt, nr = L - r0 < bt ? L - r0 : bt;

			kvt_meta_build(dt, D, want + ((size_t)b * H + h) * mb,
				       k + ((size_t)h * L + r0) * D * es, (size_t)D * es, nr);
		}
	assert_int_equal(kvt_gpu_block_meta(dt, D, H, L, bt, k, got, NULL), 0);
	assert_memory_equal(got, want, all);
	for (int i = 0; i < 8; i++)
		assert_int_equal(got[all + i], 0x5a); /* nothing past the end */
	free(want);
	free(got);
	free(k);
}

static void test_block_meta(void **state)
{
	(void)state;
	t_rng_seed(3);
	for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_BF16; dt++) {
		meta_case((enum kvt_dtype)dt, 128, 8, 100, 16, 0); /* last block partial */
		meta_case((enum kvt_dtype)dt, 72, 3, 64, 16, 4);   /* specials everywhere */
		meta_case((enum kvt_dtype)dt, 5, 2, 7, 3, 2);
		meta_case((enum kvt_dtype)dt, 64, 1, 1, 16, 0); /* one row */
	}
	assert_int_equal(kvt_gpu_block_meta(KVT_DTYPE_F16, 64, 2, 0, 16, NULL, NULL, NULL), 0);
	assert_int_equal(kvt_gpu_block_meta(KVT_DTYPE_F16, 64, 2, 16, 0, NULL, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_block_meta((enum kvt_dtype)7, 64, 2, 16, 16, NULL, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
}

/* ---- decode metadata fold ---------------------------------------------------------------- */

/* Folds the reference's way what kvt_gpu_meta_fold is asked to: at[i] names sequence i's entry
   in buf (an address inside the test's copy got, mapped to want), bit 0 = init. */
static void fold_want(enum kvt_dtype dt, uint32_t D, uint32_t H, uint32_t n, const uint8_t *k,
		      const uint64_t *at, const uint8_t *got, uint8_t *want)
{
	size_t row = (size_t)D * kvt_dtype_size(dt);

	for (uint32_t i = 0; i < n; i++) {
		uint8_t *e;

		if (!at[i])
			continue;
		e = want + ((const uint8_t *)(uintptr_t)(at[i] & ~(uint64_t)1) - got);
		for (uint32_t h = 0; h < H; h++) {
			const uint8_t *x = k + ((size_t)i * H + h) * row;

			if (at[i] & 1)
				kvt_meta_init(dt, D, e + h * 2 * row, x);
			else
				kvt_meta_add(dt, D, e + h * 2 * row, x);
		}
	}
}

/* One fold of n sequences, each entry (H heads) in its own slot of a buffer, the slots in a
   shuffled order with a gap between them: a random mix of init, add and skipped sequences,
   the existing metadata and k with a special value in about 1 of `special_every`. The whole
   buffer must equal the reference's: a skipped entry, the gaps and the tail keep their
   sentinel bytes. */
static void fold_case(enum kvt_dtype dt, uint32_t D, uint32_t H, uint32_t n, uint32_t special_every)
{
	uint32_t es = kvt_dtype_size(dt), kinds[3] = {0, 0, 0};
	size_t row = (size_t)D * es, entry = (size_t)H * 2 * row, slot = entry + 4 * es;
	size_t all = (size_t)n * slot + 8;
	uint8_t *k = rand_tensor(dt, (size_t)n * H * D, special_every);
	uint8_t *old = rand_tensor(dt, (size_t)n * H * 2 * D, special_every);
	uint8_t *got = t_xmalloc(all), *want = t_xmalloc(all);
	uint64_t *at = t_xmalloc(n * sizeof(*at));
	uint32_t *perm = t_xmalloc(n * sizeof(*perm));

	for (uint32_t i = 0; i < n; i++)
		perm[i] = i;
	for (uint32_t i = n; i > 1; i--) {
		uint32_t j = (uint32_t)(t_rng_next() % i), t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
	memset(got, 0x5a, all);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t *e = got + perm[i] * slot;
		uint32_t kind = i < 3 ? i : (uint32_t)(t_rng_next() % 3); /* every kind, n >= 3 */

		kinds[kind]++;
		at[i] = 0; /* skipped: its slot keeps the sentinel */
		if (kind == 0)
			continue;
		memcpy(e, old + i * entry, entry);
		at[i] = (uint64_t)(uintptr_t)e | (kind == 1);
	}
	memcpy(want, got, all);
	fold_want(dt, D, H, n, k, at, got, want);
	assert_int_equal(kvt_gpu_meta_fold(dt, D, H, n, k, at, NULL), 0);
	assert_memory_equal(got, want, all);
	assert_true(n < 3 || (kinds[0] && kinds[1] && kinds[2]));
	free(perm);
	free(at);
	free(want);
	free(got);
	free(old);
	free(k);
}

/* Every ordered pair of special values against every special key: sequence i folds special i
   into head h's metadata (min special h) channel d (max special d), as an add; then again with
   every sequence starting its block, so the specials are copied as they are. */
static void fold_specials(enum kvt_dtype dt)
{
	uint32_t es = kvt_dtype_size(dt);
	size_t entry = 10 * 2 * 10 * (size_t)es, all = 10 * entry;
	uint8_t *k = t_xmalloc(all / 2), *got = t_xmalloc(all), *want = t_xmalloc(all);
	uint64_t at[10];

	for (uint32_t i = 0; i < 10; i++)
		for (uint32_t h = 0; h < 10; h++)
			for (uint32_t d = 0; d < 10; d++) {
				uint8_t *e = got + i * entry + h * 2 * 10 * (size_t)es;

				put_special(dt, k + ((i * 10 + h) * 10 + d) * (size_t)es, i);
				put_special(dt, e + d * (size_t)es, h);
				put_special(dt, e + (10 + d) * (size_t)es, d);
			}
	for (int init = 0; init <= 1; init++) {
		for (uint32_t i = 0; i < 10; i++)
			at[i] = (uint64_t)(uintptr_t)(got + i * entry) | (uint64_t)init;
		memcpy(want, got, all);
		fold_want(dt, 10, 10, 10, k, at, got, want);
		assert_int_equal(kvt_gpu_meta_fold(dt, 10, 10, 10, k, at, NULL), 0);
		assert_memory_equal(got, want, all);
	}
	free(want);
	free(got);
	free(k);
}

/* A block built token by token: n sequences, sequence i folds m[i] rows (random, up to
   max_rows), one launch per step, the first with the init bit, none past m[i] (address 0);
   each entry must then equal kvt_meta_build over the sequence's rows. */
static void fold_steps(enum kvt_dtype dt, uint32_t D, uint32_t H, uint32_t n, uint32_t max_rows,
		       uint32_t special_every)
{
	uint32_t es = kvt_dtype_size(dt);
	size_t row = (size_t)D * es, entry = (size_t)H * 2 * row, step = (size_t)n * H * row;
	uint8_t *k = rand_tensor(dt, (size_t)max_rows * n * H * D, special_every);
	uint8_t *got = t_xmalloc((size_t)n * entry), *want = t_xmalloc(entry);
	uint64_t *at = t_xmalloc(n * sizeof(*at));
	uint32_t *m = t_xmalloc(n * sizeof(*m));

	memset(got, 0x5a, (size_t)n * entry);
	for (uint32_t i = 0; i < n; i++)
		m[i] = i == 0 ? max_rows : 1 + (uint32_t)(t_rng_next() % max_rows);
	for (uint32_t t = 0; t < max_rows; t++) {
		for (uint32_t i = 0; i < n; i++)
			at[i] = t < m[i] ? (uint64_t)(uintptr_t)(got + i * entry) | (t == 0) : 0;
		assert_int_equal(kvt_gpu_meta_fold(dt, D, H, n, k + t * step, at, NULL), 0);
	}
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t h = 0; h < H; h++)
			kvt_meta_build(dt, D, want + h * 2 * row, k + ((size_t)i * H + h) * row,
				       step, m[i]);
		assert_memory_equal(got + i * entry, want, entry);
	}
	free(m);
	free(at);
	free(want);
	free(got);
	free(k);
}

static void test_meta_fold(void **state)
{
	static const uint32_t heads[] = {1, 3, 8}, dims[] = {1, 7, 128};
	struct kemu_launch_info li;
	uint64_t launches;
	uint16_t k16[2] = {0, 0};
	uint64_t at = 0;

	(void)state;
	t_rng_seed(11);
	for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_BF16; dt++) {
		for (int h = 0; h < 3; h++)
			for (int d = 0; d < 3; d++) {
				fold_case((enum kvt_dtype)dt, dims[d], heads[h], 9, 0);
				fold_case((enum kvt_dtype)dt, dims[d], heads[h], 5, 3);
			}
		fold_case((enum kvt_dtype)dt, 128, 8, 1, 4);
		fold_case((enum kvt_dtype)dt, 7, 1, 300, 5); /* more threads than a CTA */
		fold_specials((enum kvt_dtype)dt);
		fold_steps((enum kvt_dtype)dt, 128, 8, 4, 16, 0);
		fold_steps((enum kvt_dtype)dt, 7, 3, 6, 12, 3);
		fold_steps((enum kvt_dtype)dt, 1, 1, 3, 20, 2);
	}
	/* the argument checks: nothing launched */
	kemu_get_launch_info(&li);
	launches = li.launches;
	assert_int_equal(kvt_gpu_meta_fold((enum kvt_dtype)7, 8, 2, 1, k16, &at, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_meta_fold(KVT_DTYPE_F16, 8, 2, 1, NULL, &at, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_meta_fold(KVT_DTYPE_F16, 8, 2, 1, k16, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_meta_fold(KVT_DTYPE_F16, 8, 2, 0, NULL, NULL, NULL), 0);
	assert_int_equal(kvt_gpu_meta_fold(KVT_DTYPE_F32, 8, 0, 4, NULL, NULL, NULL), 0);
	assert_int_equal(kvt_gpu_meta_fold(KVT_DTYPE_BF16, 0, 2, 4, NULL, NULL, NULL), 0);
	kemu_get_launch_info(&li);
	assert_int_equal(li.launches, launches);
	/* every sequence skipped: launched, nothing written */
	assert_int_equal(kvt_gpu_meta_fold(KVT_DTYPE_F16, 1, 2, 1, k16, &at, NULL), 0);
	kemu_get_launch_info(&li);
	assert_int_equal(li.launches, launches + 1);
}

/* ---- SnapKV ------------------------------------------------------------------------------ */

static bool same_float(float a, float b, float rel)
{
	if (isnan(a) || isnan(b))
		return isnan(a) && isnan(b);
	if (isinf(a) || isinf(b))
		return a == b;
	return fabsf(a - b) <= rel * fmaxf(fabsf(a), fabsf(b)) + 1e-30f;
}

/* Keys with a few heavy positions per head (so the vote is far from flat) and queries. */
static void snap_inputs(const struct kvt_snapkv *p, bool special, void **k, void **q)
{
	size_t nk = (size_t)p->n_kv_heads * p->prompt_tokens * p->head_dim;
	size_t nq = (size_t)p->n_q_heads * p->obs_window * p->head_dim;
	float *kf = t_xmalloc(nk * sizeof(float)), *qf = t_xmalloc((nq ? nq : 1) * sizeof(float));

	for (size_t i = 0; i < nq; i++)
		qf[i] = rndf();
	for (size_t i = 0; i < nk; i++)
		kf[i] = 0.3f * rndf();
	for (uint32_t h = 0; h < p->n_kv_heads; h++)
		for (uint32_t j = 0; j < p->prompt_tokens; j++)
			if (t_rng_next() % 7 ==
			    0) /* heavy: six times larger, its logits stand out */
				for (uint32_t d = 0; d < p->head_dim; d++)
					kf[((size_t)h * p->prompt_tokens + j) * p->head_dim + d] *=
						6.0f;
	*k = t_xmalloc(nk * kvt_dtype_size(p->dtype));
	*q = t_xmalloc((nq ? nq : 1) * kvt_dtype_size(p->dtype));
	kvt_from_f32(p->dtype, kf, *k, nk);
	kvt_from_f32(p->dtype, qf, *q, nq);
	if (special) { /* one NaN or infinite element in one key of head 0: it poisons that head
			  only, as on the CPU */
		uint32_t s = (uint32_t)(t_rng_next() % 4);
		size_t i = (size_t)(t_rng_next() % p->prompt_tokens) * p->head_dim +
			   t_rng_next() % p->head_dim;

		put_special(p->dtype, (uint8_t *)*k + i * kvt_dtype_size(p->dtype), s);
	}
	free(qf);
	free(kf);
}

static void snap_case(struct kvt_snapkv p, bool special)
{
	uint32_t H = p.n_kv_heads, L = p.prompt_tokens;
	uint32_t n = L > p.obs_window ? L - p.obs_window : 0, count = kvt_snapkv_count(&p);
	size_t gs = kvt_gpu_snapkv_scratch_bytes(&p), cs = kvt_snapkv_scratch_bytes(&p);
	float *want = t_xmalloc((size_t)H * (n ? n : 1) * sizeof(float));
	float *got = t_xmalloc((size_t)H * (n ? n : 1) * sizeof(float));
	int32_t *sel_g = t_xmalloc((size_t)H * (count ? count : 1) * sizeof(int32_t));
	int32_t *sel_c = t_xmalloc((size_t)H * (count ? count : 1) * sizeof(int32_t));
	void *cpu_scratch = t_xmalloc(cs), *gpu_scratch = NULL, *k, *q;

	snap_inputs(&p, special, &k, &q);
	if (gs)
		assert_int_equal(posix_memalign(&gpu_scratch, 256, gs), 0);
	for (uint32_t h = 0; h < H; h++)
		assert_int_equal(kvt_snapkv_scores(&p, h, k, q, want + (size_t)h * n, cpu_scratch),
				 0);
	assert_int_equal(kvt_gpu_snapkv_scores(&p, k, q, got, gpu_scratch, gs, NULL), 0);
	for (size_t i = 0; i < (size_t)H * n; i++)
		if (!same_float(got[i], want[i], 2e-5f))
			fail_msg("pooled[%zu] (L %u D %u dtype %d): gpu %.9g, cpu %.9g", i, L,
				 p.head_dim, (int)p.dtype, got[i], want[i]);

	assert_int_equal(kvt_snapkv_select(&p, k, q, sel_c, cpu_scratch), 0);
	memset(sel_g, 0xff, (size_t)H * (count ? count : 1) * sizeof(int32_t));
	assert_int_equal(kvt_gpu_snapkv_select(&p, k, q, sel_g, gpu_scratch, gs, NULL), 0);
	for (uint32_t h = 0; h < H && count; h++) {
		const int32_t *a = sel_g + (size_t)h * count, *b = sel_c + (size_t)h * count;
		const float *sc = want + (size_t)h * n;
		float cut = INFINITY;

		for (uint32_t i = 0; i < count; i++) {
			assert_true(a[i] >= (int32_t)p.sink && (uint32_t)a[i] < n);
			if (i)
				assert_true(a[i] > a[i - 1]); /* ascending, distinct */
			if (!isnan(sc[b[i]]) && sc[b[i]] < cut)
				cut = sc[b[i]];
		}
		for (uint32_t i = 0, j = 0; i < count || j < count;) {
			/* walk both ascending lists; a position one side lacks must tie the cutoff
			 */
			if (i < count && j < count && a[i] == b[j]) {
				i++, j++;
				continue;
			}
			int32_t only = (j >= count || (i < count && a[i] < b[j])) ? a[i++] : b[j++];

			if (!same_float(sc[only], cut, 1e-4f))
				fail_msg("head %u: position %d kept by one side only, score %.9g, "
					 "cutoff %.9g: not a tie",
					 h, only, sc[only], cut);
		}
	}
	free(gpu_scratch);
	free(cpu_scratch);
	free(q);
	free(k);
	free(sel_c);
	free(sel_g);
	free(got);
	free(want);
}

static void snapkv_cases(void)
{
	for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_BF16; dt++) {
		/* n_kv, n_q, D, dtype, L, L_obs, sink, recent, topk, pool */
		snap_case((struct kvt_snapkv){2, 8, 64, (enum kvt_dtype)dt, 300, 16, 4, 16, 40, 7},
			  false);
		snap_case((struct kvt_snapkv){1, 1, 40, (enum kvt_dtype)dt, 97, 5, 0, 3, 10, 1},
			  false);
	}
	/* several spans of key tiles per head, a head_dim that is not a multiple of the tile */
	snap_case((struct kvt_snapkv){3, 6, 72, KVT_DTYPE_F16, 1500, 33, 4, 32, 100, 13}, false);
	/* more than 32 spans of key tiles per head: sk_rowstats merges across warps */
	snap_case((struct kvt_snapkv){2, 4, 32, KVT_DTYPE_F32, 2600, 8, 4, 16, 64, 7}, false);
	/* more obs rows than one product tile, odd group */
	snap_case((struct kvt_snapkv){2, 6, 32, KVT_DTYPE_BF16, 400, 40, 2, 8, 64, 5}, false);
	/* topk larger than the candidates; L <= L_obs (no scores); Case 1 (nothing selected) */
	snap_case((struct kvt_snapkv){2, 4, 32, KVT_DTYPE_F32, 120, 8, 4, 8, 500, 3}, false);
	snap_case((struct kvt_snapkv){2, 4, 32, KVT_DTYPE_F32, 8, 16, 2, 2, 4, 3}, false);
	snap_case((struct kvt_snapkv){2, 4, 32, KVT_DTYPE_F32, 20, 4, 10, 10, 4, 3}, false);
	/* a NaN or infinite key: the pooled scores keep the reference's special values */
	for (int i = 0; i < 12; i++)
		snap_case(
			(struct kvt_snapkv){2, 4, 32, (enum kvt_dtype)(i % 3), 200, 8, 2, 8, 30, 5},
			true);
}

/* The cases under each schedule of the emulator, on the same inputs: a barrier the kernels
   lack would let a warp that runs ahead change what another reads. */
static void each_schedule(void (*cases)(void), uint64_t seed)
{
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_WARPS_REVERSE; mode++) {
		kemu_set_schedule(mode);
		t_rng_seed(seed);
		cases();
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
}

/* Long prompts, whose shapes the short cases never reach; under one schedule only, as they
   test the kernels' arithmetic over spans (the schedules above test the barriers, with the same
   code) and cost seconds each in the emulator. */
static void snapkv_long_cases(void)
{
	/* Spans as this build sizes them (meson.build: SK_STATS_CTAS = 272 here, 1024 on a GPU;
	   span = ceil(tiles * heads / SK_STATS_CTAS), at most SK_SPAN_MAX = 16 tiles). */
	/* four key tiles per span (71 tiles x 16 heads = 1,136 pairs), the last span three tiles,
	   so sk_stats loops over a span and stops at L; every case above has spans of one tile */
	snap_case((struct kvt_snapkv){16, 16, 32, KVT_DTYPE_BF16, 4500, 4, 8, 64, 200, 5}, false);
	/* more spans than sk_rowstats has threads (17000 keys of one kv head: 266 spans of one
	   tile), so each thread merges several before the warp reductions */
	snap_case((struct kvt_snapkv){1, 2, 32, KVT_DTYPE_F32, 17000, 4, 4, 64, 300, 7}, false);
	/* the span capped: 546 tiles x 8 heads = 4,368 pairs would make spans of 17 tiles; they
	   stay at 16 and the grid grows to 35 spans a head, the last of two tiles. Scores that
	   missed keys past the grid's end would be off by percents, far outside 2e-5. */
	snap_case((struct kvt_snapkv){8, 8, 32, KVT_DTYPE_F16, 34900, 4, 4, 64, 300, 5}, false);
}

static void test_snapkv(void **state)
{
	(void)state;
	each_schedule(snapkv_cases, 4);
	t_rng_seed(5);
	snapkv_long_cases();
}

static void test_snapkv_args(void **state)
{
	struct kvt_snapkv p = {2, 4, 32, KVT_DTYPE_F16, 200, 8, 2, 8, 30, 5};
	size_t gs = kvt_gpu_snapkv_scratch_bytes(&p);
	void *scratch = NULL, *k, *q;
	int32_t out[60];

	(void)state;
	t_rng_seed(5);
	snap_inputs(&p, false, &k, &q);
	assert_true(gs > 0);
	assert_int_equal(posix_memalign(&scratch, 256, gs + 256), 0);
	/* too little scratch, misaligned scratch, an even pool kernel */
	assert_int_equal(kvt_gpu_snapkv_select(&p, k, q, out, scratch, gs - 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_snapkv_select(&p, k, q, out, (char *)scratch + 8, gs, NULL),
			 KEMU_ERR_INVALID_VALUE);
	p.pool_kernel = 4;
	assert_int_equal(kvt_gpu_snapkv_scratch_bytes(&p), 0);
	assert_int_equal(kvt_gpu_snapkv_select(&p, k, q, out, scratch, gs, NULL),
			 KEMU_ERR_INVALID_VALUE);
	free(scratch);
	free(q);
	free(k);
}

/* ---- decode attention -------------------------------------------------------------------- */

static void attend_case(enum kvt_dtype dt, uint32_t D, uint32_t H, uint32_t G,
			const uint32_t *rows_per_seg, uint32_t segs_per_head)
{
	uint32_t es = kvt_dtype_size(dt), nseg = H * segs_per_head;
	struct kvt_attend_rows *seg = t_xmalloc(nseg * sizeof(*seg));
	uint32_t *off = t_xmalloc((H + 1) * sizeof(*off));
	float *q = t_xmalloc((size_t)H * G * D * sizeof(float));
	float *got = t_xmalloc((size_t)H * G * D * sizeof(float));
	float *want = t_xmalloc((size_t)H * G * D * sizeof(float));
	void **bufs = t_xmalloc(2 * nseg * sizeof(*bufs));

	for (size_t i = 0; i < (size_t)H * G * D; i++)
		q[i] = 2.0f * rndf();
	for (uint32_t h = 0; h <= H; h++)
		off[h] = h * segs_per_head;
	for (uint32_t s = 0; s < nseg; s++) {
		uint32_t n = rows_per_seg[s % segs_per_head];
		size_t ks = (size_t)D * es + (s % 2 ? 0 : 16); /* a padded stride too */

		bufs[2 * s] = rand_tensor(dt, (ks / es) * (n ? n : 1), 0);
		bufs[2 * s + 1] = rand_tensor(dt, (size_t)D * (n ? n : 1), 0);
		seg[s] = (struct kvt_attend_rows){bufs[2 * s], bufs[2 * s + 1], ks, (size_t)D * es,
						  n};
	}
	memset(got, 0x7f, (size_t)H * G * D * sizeof(float));
	assert_int_equal(kvt_gpu_attend(dt, D, H, G, seg, off, q, got, NULL), 0);
	for (uint32_t h = 0; h < H; h++)
		kvt_attend_rows(dt, D, q + (size_t)h * G * D, G, seg + off[h], off[h + 1] - off[h],
				want + (size_t)h * G * D);
	for (size_t i = 0; i < (size_t)H * G * D; i++)
		if (!(fabsf(got[i] - want[i]) <= 1e-5f + 1e-4f * fabsf(want[i])))
			fail_msg("out[%zu] (D %u dtype %d): gpu %.9g, cpu %.9g", i, D, (int)dt,
				 got[i], want[i]);
	for (uint32_t s = 0; s < 2 * nseg; s++)
		free(bufs[s]);
	free(bufs);
	free(want);
	free(got);
	free(q);
	free(off);
	free(seg);
}

static void attend_cases(void)
{
	static const uint32_t segs[] = {4, 33, 100}; /* sink, ring, top-K like */
	static const uint32_t one[] = {1}, none[] = {0, 0};

	for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_BF16; dt++) {
		attend_case((enum kvt_dtype)dt, 128, 2, 4, segs, 3);
		attend_case((enum kvt_dtype)dt, 72, 3, 1, one, 1);
	}
	attend_case(KVT_DTYPE_F16, 300, 1, 2, segs, 3); /* head_dim past the CTA's threads */
	attend_case(KVT_DTYPE_F32, 64, 2, 3, none, 2);	/* no rows: zeros */
	assert_int_equal(kvt_gpu_attend((enum kvt_dtype)9, 64, 1, 1, NULL, NULL, NULL, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
}

static void test_attend(void **state)
{
	(void)state;
	each_schedule(attend_cases, 6);
}

/* ---- batched decode attention over attention tables -------------------------------------- */

/* One case: n members x H kv heads of G query heads, head_dim D, blocks of bt tokens in a pool
   of random rows. Row r's resident tokens and recalled blocks follow kinds[r % n_kinds]:
   0 none at all, 1 a short prompt (a few resident tokens, no recall: SnapStream's case 1),
   2 a long one (many resident tokens, recalled blocks with some rows marked resident or past
   their tokens), 3 recall only. The kernel's out and lse against kvt_attend_table per row,
   with the splits given (0: kvt_gpu_attend_splits's). The pool starts attend_pool_shift bytes
   past an aligned address: with one element's size, no row is 16-byte aligned, and the kernel
   must take the path of element loads (ab_part) where it would otherwise take that of 16-byte
   loads (af_part). */
static uint32_t attend_pool_shift;

static void attend_batch_case(enum kvt_dtype dt, uint32_t n, uint32_t H, uint32_t G, uint32_t D,
			      uint32_t bt, const uint32_t *kinds, uint32_t n_kinds, uint32_t splits,
			      bool with_lse)
{
	uint32_t es = kvt_dtype_size(dt), rows = n * H, mf = 0, mr = 0;
	uint32_t nblocks = 64, block_bytes = 2 * bt * D * es;
	uint8_t *pool_mem = rand_tensor(dt, (size_t)nblocks * 2 * bt * D + 16, 0),
		*pool = pool_mem + attend_pool_shift;
	uint32_t *nt = t_xmalloc(rows * 4), *nr = t_xmalloc(rows * 4);
	uint32_t *fr, *rc, *rt;
	uint64_t *rs, most_t = 0;
	size_t qn = (size_t)rows * G * D;
	uint8_t *q = rand_tensor(dt, qn, 0), *got = t_xmalloc(qn * es), *want = t_xmalloc(qn * es);
	float *gl = t_xmalloc(rows * G * 4), *wl = t_xmalloc(rows * G * 4);
	float *scratch, *sc = t_xmalloc(kvt_attend_table_scratch(G, D) * 4);
	struct kvt_attn_desc d;

	for (uint32_t r = 0; r < rows; r++) {
		uint32_t k = kinds[r % n_kinds];

		nt[r] = k == 1	 ? 1 + (uint32_t)(t_rng_next() % (2 * bt))
			: k == 2 ? 20 * bt + (uint32_t)(t_rng_next() % bt)
				 : 0;
		nr[r] = k >= 2 ? 3 + (uint32_t)(t_rng_next() % 6) : 0;
		mf = (nt[r] + bt - 1) / bt > mf ? (nt[r] + bt - 1) / bt : mf;
		mr = nr[r] > mr ? nr[r] : mr;
	}
	mf = mf ? mf : 1;
	mr = mr ? mr : 1;
	fr = t_xmalloc((size_t)rows * mf * 4);
	rc = t_xmalloc((size_t)rows * mr * 4);
	rt = t_xmalloc((size_t)rows * mr * 4);
	rs = t_xmalloc((size_t)rows * mr * 8);
	for (uint32_t r = 0; r < rows; r++) {
		for (uint32_t f = 0; f < mf; f++)
			fr[(size_t)r * mf + f] = (uint32_t)(t_rng_next() % nblocks);
		for (uint32_t j = 0; j < mr; j++) {
			size_t x = (size_t)r * mr + j;

			rc[x] = (uint32_t)(t_rng_next() % nblocks); /* may repeat a resident one */
			rt[x] = j % 3 ? bt : 1 + (uint32_t)(t_rng_next() % bt);
			rs[x] = j % 2 ? t_rng_next() & t_rng_next() : 0;
			if (j == 1)
				rs[x] = ~0ull; /* every row resident: the block adds nothing */
		}
		most_t = nt[r] + (uint64_t)nr[r] * bt > most_t ? nt[r] + (uint64_t)nr[r] * bt
							       : most_t;
	}
	d = (struct kvt_attn_desc){
		.n_tokens = nt,
		.frames = fr,
		.n_recall = nr,
		.recall = rc,
		.recall_tokens = rt,
		.recall_skip = rs,
		.pool = (uint64_t)(uintptr_t)pool,
		.pool_blocks = nblocks,
		.block_bytes = block_bytes,
		.v_offset = (uint64_t)bt * D * es,
		.row_bytes = D * es,
		.block_tokens = bt,
		.n = n,
		.n_kv_heads = H,
		.g_count = G,
		.head_dim = D,
		.max_frames = mf,
		.max_recall = mr,
	};
	/* the kernel's row lookup (block sizes here are powers of two) against the reference's */
	for (uint32_t r = 0; r < rows; r++) {
		uint32_t nt_r = kvt_attn_resident(&d, r), bsh = 0;

		while ((1u << bsh) < bt)
			bsh++;
		for (uint32_t t = 0; t < kvt_attn_count(&d, r); t++)
			if (kvt_attn_row_p2(&d, r, t, nt_r, bsh) != kvt_attn_row(&d, r, t))
				fail_msg(
					"row %u token %u: kvt_attn_row_p2 %#llx, kvt_attn_row %#llx",
					r, t,
					(unsigned long long)kvt_attn_row_p2(&d, r, t, nt_r, bsh),
					(unsigned long long)kvt_attn_row(&d, r, t));
	}
	if (!splits)
		splits = kvt_gpu_attend_splits(rows, G, most_t);
	scratch = t_xmalloc(kvt_gpu_attend_batch_scratch(rows, G, D, splits));
	memset(got, 0x7f, qn * es);
	assert_int_equal(
		kvt_gpu_attend_batch(dt, d, q, got, with_lse ? gl : NULL, scratch, splits, NULL),
		0);
	for (uint32_t r = 0; r < rows; r++)
		kvt_attend_table(dt, &d, r, q + (size_t)r * G * D * es,
				 want + (size_t)r * G * D * es, wl + (size_t)r * G, sc);
	for (size_t i = 0; i < qn; i++) {
		float a, b,
			tol = dt == KVT_DTYPE_F32   ? 1e-5f
			      : dt == KVT_DTYPE_F16 ? 2e-3f
						    : 1.6e-2f;

		kvt_to_f32(dt, got + i * es, &a, 1);
		kvt_to_f32(dt, want + i * es, &b, 1);
		if (!(fabsf(a - b) <= tol * (1.0f + fabsf(b))))
			fail_msg("out[%zu] (dtype %d D %u G %u splits %u): gpu %.9g, cpu %.9g", i,
				 (int)dt, D, G, splits, a, b);
	}
	for (uint32_t i = 0; with_lse && i < rows * G; i++)
		if (!(isinf(wl[i]) ? gl[i] == wl[i]
				   : fabsf(gl[i] - wl[i]) <= 1e-4f * (1.0f + fabsf(wl[i]))))
			fail_msg("lse[%u] (splits %u): gpu %.9g, cpu %.9g", i, splits, gl[i],
				 wl[i]);
	free(scratch);
	free(sc);
	free(gl);
	free(wl);
	free(got);
	free(want);
	free(q);
	free(rs);
	free(rt);
	free(rc);
	free(fr);
	free(nr);
	free(nt);
	free(pool_mem);
}

static void attend_batch_cases(void)
{
	static const uint32_t mixed[] = {2, 1, 0, 3, 2}, shorts[] = {1}, longs[] = {2};

	for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_BF16; dt++) {
		attend_batch_case((enum kvt_dtype)dt, 3, 2, 4, 32, 16, mixed, 5, 0, true);
		attend_batch_case((enum kvt_dtype)dt, 2, 2, 1, 16, 8, mixed, 5, 3, true);
	}
	attend_batch_case(KVT_DTYPE_F32, 2, 1, 8, 64, 16, longs, 1, 5, true);	/* GQA 8 */
	attend_batch_case(KVT_DTYPE_BF16, 1, 2, 12, 40, 8, mixed, 5, 2, false); /* 2 parts */
	attend_batch_case(KVT_DTYPE_F16, 4, 1, 4, 160, 16, shorts, 1, 0, true); /* D past 128 */
	/* rows of 16-byte loads: a row a whole warp (512 bytes), a half warp, a quarter, a lane */
	attend_batch_case(KVT_DTYPE_F32, 2, 2, 1, 128, 16, mixed, 5, 0, true);
	attend_batch_case(KVT_DTYPE_F16, 1, 2, 8, 256, 8, mixed, 5, 3, true);
	attend_batch_case(KVT_DTYPE_BF16, 2, 2, 4, 128, 16, mixed, 5, 4, true);
	attend_batch_case(KVT_DTYPE_BF16, 2, 1, 8, 64, 16, longs, 1, 0, false);
	attend_batch_case(KVT_DTYPE_F16, 2, 2, 2, 8, 8, mixed, 5, 2, true); /* a lane a row */
}

static void test_attend_batch(void **state)
{
	static const uint32_t none[] = {0}, mixed[] = {2, 1, 0, 3, 2};
	struct kvt_attn_desc d = {0};
	float s;

	(void)state;
	each_schedule(attend_batch_cases, 8);
	/* rows nowhere 16-byte aligned: element loads, the same results */
	attend_pool_shift = 2;
	attend_batch_case(KVT_DTYPE_BF16, 2, 2, 4, 128, 16, mixed, 5, 4, true);
	attend_pool_shift = 4;
	attend_batch_case(KVT_DTYPE_F32, 1, 2, 2, 32, 8, mixed, 5, 0, true);
	attend_pool_shift = 0;
	/* rows without tokens: zeros and -inf, whatever the split */
	attend_batch_case(KVT_DTYPE_F32, 2, 2, 2, 16, 8, none, 1, 4, true);
	/* a long row at the split a GPU would pick (several parts), one schedule */
	{
		static const uint32_t longs[] = {2};

		t_rng_seed(9);
		attend_batch_case(KVT_DTYPE_F16, 1, 1, 4, 128, 32, longs, 1, 0, true);
	}
	assert_true(kvt_gpu_attend_splits(1, 4, 20 * 32 + 8 * 32) == 4);
	assert_true(kvt_gpu_attend_splits(2048, 4, 100000) == 1);
	assert_int_equal(
		kvt_gpu_attend_batch((enum kvt_dtype)9, d, NULL, NULL, NULL, NULL, 1, NULL),
		KEMU_ERR_INVALID_VALUE);
	d.n = d.n_kv_heads = d.g_count = d.head_dim = 1;
	assert_int_equal(kvt_gpu_attend_batch(KVT_DTYPE_F32, d, &s, &s, NULL, &s, 0, NULL),
			 KEMU_ERR_INVALID_VALUE);
}

/* ---- the emulator's own checks ----------------------------------------------------------- */

static void test_emulator(void **state)
{
	struct kemu_launch_info li;
	float sum = 0;

	(void)state;
	/* a correct block reduction through shuffles and shared memory, in every schedule */
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_WARPS_REVERSE; mode++) {
		assert_int_equal(kemu_set_schedule(mode), mode ? mode - 1 : KEMU_SCHED_LOCKSTEP);
		sum = 0;
		assert_int_equal(kemu_selftest_reduce(256, &sum), 0);
		assert_true(sum == 256.0f * 255.0f / 2.0f);
	}
	assert_int_equal(kemu_set_schedule(7), -1);
	/* votes and atomics, with the lanes in either order */
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		unsigned int out[3 * 64 + 1];

		kemu_set_schedule(mode);
		assert_int_equal(kemu_selftest_vote(64, out), 0);
		for (unsigned int t = 0; t < 64; t++) {
			unsigned int same = 0, w0 = t / 32 * 32;

			for (unsigned int l = 0; l < 32; l++)
				same |= ((w0 + l) / 4 % 3 == t / 4 % 3 ? 1u : 0u) << l;
			assert_int_equal(out[3 * t], 0xaaaaaaaau);
			assert_int_equal(out[3 * t + 1], same);
			assert_true(out[3 * t + 2] < 64 * 65 / 2);
			for (unsigned int o = 0; o < t; o++) /* each saw another count */
				assert_int_not_equal(out[3 * o + 2], out[3 * t + 2]);
		}
		assert_int_equal(out[3 * 64], 64 * 65 / 2);
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
	assert_int_equal(kemu_selftest_reduce(96, &sum), 0); /* three warps */
	assert_true(sum == 96.0f * 95.0f / 2.0f);
	/* a __syncthreads() half the CTA skips, one some threads return before */
	kemu_get_launch_info(&li);
	uint64_t faults = li.faults;
	assert_int_equal(kemu_selftest_divergent_sync(), KEMU_ERR_LAUNCH_FAILURE);
	assert_non_null(strstr(kemu_last_fault(), "__syncthreads() reached by 16 of 64"));
	assert_int_equal(kemu_selftest_early_return(), KEMU_ERR_LAUNCH_FAILURE);
	assert_non_null(strstr(kemu_last_fault(), "returned before it"));
	/* a full-mask shuffle a lane has left */
	assert_int_equal(kemu_selftest_partial_shuffle(), KEMU_ERR_LAUNCH_FAILURE);
	assert_non_null(strstr(kemu_last_fault(), "lanes at a shuffle"));
	/* lanes at a ballot and at a shuffle at once */
	assert_int_equal(kemu_selftest_mixed_vote(), KEMU_ERR_LAUNCH_FAILURE);
	assert_non_null(strstr(kemu_last_fault(), "lanes at different shuffles"));
	/* a full mask in a warp of 20 threads */
	assert_int_equal(kemu_selftest_reduce(20, &sum), KEMU_ERR_LAUNCH_FAILURE);
	assert_non_null(strstr(kemu_last_fault(), "shuffle mask"));
	kemu_get_launch_info(&li);
	assert_int_equal(li.faults, faults + 5);
	/* launch limits */
	assert_int_equal(kemu_selftest_reduce(2048, &sum), KEMU_ERR_INVALID_CONFIGURATION);
	assert_int_equal(kemu_selftest_reduce(0, &sum), KEMU_ERR_INVALID_CONFIGURATION);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_emulator),     cmocka_unit_test(test_gather),
		cmocka_unit_test(test_append),	     cmocka_unit_test(test_block_meta),
		cmocka_unit_test(test_meta_fold),    cmocka_unit_test(test_snapkv),
		cmocka_unit_test(test_snapkv_args),  cmocka_unit_test(test_attend),
		cmocka_unit_test(test_attend_batch),
	};

	return cmocka_run_group_tests_name("kernel-emu", tests, NULL, NULL);
}
