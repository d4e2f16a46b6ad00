/* SPDX-License-Identifier: MIT */
/*
 * quest-emu: the Quest selection kernel (policy/quest.cu: kvt_gpu_quest_select) on the CPU
 * kernel emulator against the CPU reference (kvt_quest_select, policy/recall.c), entry for
 * entry: every selection word equal, nothing written past the batch's selection.
 *
 * A seeded random run of batches of 1 to 4 entries (each its own token count, sink, ring and
 * top-K counts, and its own kind of data), over f32, f16 and bf16, kv heads 1 to 8, query
 * groups of 1, 3, 4, 5 and 8 (3 and 5 leave part of the kernel's four side-by-side sums
 * unused), head_dim 64 and 128 (and 8 and 40 now and then), r from 1 to 256, layers from no
 * token to 4,096 blocks, where the emulator's build ranks 384 blocks at a time (many chunks,
 * and a carry across them). The kinds of data:
 *  - random: full-precision values, so scores rarely tie;
 *  - pool: each block's metadata one of a few rows, queries on a coarse grid: many exactly
 *    equal scores, so the cutoff falls inside a tie and the tie rule (lower block) decides;
 *  - permuted: each query head's queries one value, each block's metadata a permutation of one
 *    row of widely spread magnitudes: the exact bounds are all equal and only the f32 rounding
 *    of the sums, in d order, tells them apart (a sum in another order, or fused, differs);
 *  - special: random, with NaN, infinities, -0 and subnormals in a third of the blocks'
 *    metadata and now and then in a query (NaN scores, infinite scores, NaN of head 0 against
 *    NaN of another head).
 * Sinks, rings and top-K counts leave blocks fully resident (skipped) or partly resident
 * (scored), here and there or in alternate runs of up to 100 blocks (chunks whose first warp
 * has no candidate, and a carry that fills late); some layers have fewer candidates than r
 * (padding), some none. Two fixed layers of 4,096 and 16,384 blocks follow, and a small case
 * whose answer is known independently of the reference. Each batch is launched under each of
 * the emulator's schedules (the three that reorder warps, which a missing barrier shows, and
 * the one that runs each warp's lanes last to first).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu.h"
#include "kemu_api.h"
#include "policy.h"
#include "region.h"
#include "t_data.h"

#define MAX_BATCH 4
#define GUARD 0x5a5a5a5au

enum kind { K_RANDOM, K_POOL, K_PERM, K_SPECIAL, K_KINDS };

/* The layer's shape, shared by the entries of a batch. */
struct shape {
	enum kvt_dtype dt;
	uint32_t H, G, D, lbt, r;
};

struct entry {
	uint32_t N, sink, ring0, nb;
	enum kind kind;
	uint32_t run; /* > 0: blocks resident by top-K in alternate runs of this many */
	uint32_t hot; /* special: the channel most specials go to */
	void *meta;   /* [nb][H][2][D] of dt */
	struct kvt_region_key *key; /* [nb * H] */
};

/* What a run went through, so that a run that stops reaching a case shows. */
static struct {
	uint64_t batches, entries, heads, blocks, resident, padded, none, cut, tie_cut, nan_cand,
		inf_cand, chunks2;
} seen;

static uint32_t rnd(uint32_t n)
{
	return t_rng_below(n);
}

static bool chance(uint32_t percent)
{
	return rnd(100) < percent;
}

/* Uniform in [-1, 1) with a full 24-bit mantissa's worth of randomness. */
static float unit(void)
{
	return (float)((int32_t)rnd(1u << 25) - (1 << 24)) / (float)(1 << 24);
}

static float special(enum kvt_dtype dt)
{
	switch (rnd(8)) {
	case 0:
		return NAN;
	case 1:
		return -NAN;
	case 2:
		return INFINITY;
	case 3:
		return -INFINITY;
	case 4:
		return -0.0f;
	case 5:
		return 0.0f;
	default: /* subnormal in dt (f32 and bf16 share their range; f16's is 2^-24 .. 2^-14) */
		return (chance(50) ? -1.0f : 1.0f) *
		       (dt == KVT_DTYPE_F16 ? ldexpf(1.0f + (float)rnd(1023), -24)
					    : ldexpf(1.0f + (float)rnd(1u << 22), -149));
	}
}

/* Tokens of block b of a layer of N tokens in blocks of 1 << lbt. */
static uint32_t tokens_of(uint32_t N, uint32_t lbt, uint32_t b)
{
	uint32_t bt = 1u << lbt, left = N - b * bt;

	return left < bt ? left : bt;
}

/* Tokens of block b in the sink and ring ranges (kvt_region_resident's count). */
static uint32_t in_ranges(const struct entry *e, uint32_t lbt, uint32_t b, uint32_t nv)
{
	uint32_t p0 = b << lbt, end = p0 + nv, cnt = 0;

	if (p0 < e->sink)
		cnt += (end < e->sink ? end : e->sink) - p0;
	if (end > e->ring0)
		cnt += end - (p0 > e->ring0 ? p0 : e->ring0);
	return cnt;
}

/* Metadata of an entry: kind's values for every (block, head), and top-K counts. */
static void fill_entry(const struct shape *s, struct entry *e)
{
	uint32_t H = s->H, D = s->D, esz = kvt_dtype_size(s->dt), n_pool = 1 + rnd(4);
	float *row = t_xmalloc(2 * D * sizeof(float));
	float *pool = t_xmalloc((size_t)n_pool * 2 * D * sizeof(float));
	uint32_t *perm = t_xmalloc(D * sizeof(uint32_t));

	e->nb = (uint32_t)(((uint64_t)e->N + (1u << s->lbt) - 1) >> s->lbt);
	e->meta = t_xmalloc((size_t)e->nb * H * 2 * D * esz);
	e->key = t_xmalloc((size_t)e->nb * H * sizeof(*e->key));
	for (uint32_t i = 0; i < n_pool * 2 * D; i++) {
		if (e->kind == K_PERM) /* magnitudes 2^-12 .. 2^12: sums that round */
			pool[i] = ldexpf(0.5f + fabsf(unit()) / 2, (int)rnd(25) - 12) *
				  (chance(25) ? -1.0f : 1.0f);
		else
			pool[i] = (float)((int)rnd(17) - 8) / 8.0f;
	}
	for (uint32_t b = 0; b < e->nb; b++) {
		uint32_t nv = tokens_of(e->N, s->lbt, b), mid = nv - in_ranges(e, s->lbt, b, nv);

		for (uint32_t h = 0; h < H; h++) {
			struct kvt_region_key *k = &e->key[(size_t)b * H + h];
			uint8_t *dst = (uint8_t *)e->meta + ((size_t)b * H + h) * 2 * D * esz;

			/* the top-K positions lie between sink and ring: all of them (resident),
			   none, or some */
			if (e->run)
				k->tk = (uint8_t)(b / e->run % 2 ? mid : mid ? rnd(mid) : 0);
			else
				k->tk = (uint8_t)(chance(15) ? mid : chance(50) ? 0 : rnd(mid + 1));
			switch (e->kind) {
			case K_RANDOM:
			case K_SPECIAL:
				for (uint32_t d = 0; d < 2 * D; d++)
					row[d] = 2.0f * unit();
				if (e->kind == K_SPECIAL && chance(33))
					for (uint32_t x = 1 + rnd(3); x; x--)
						row[(chance(50) ? e->hot : rnd(D)) + D * rnd(2)] =
							special(s->dt);
				break;
			case K_POOL:
				memcpy(row, pool + (size_t)rnd(n_pool) * 2 * D,
				       2 * D * sizeof(float));
				break;
			case K_PERM:
				for (uint32_t d = 0; d < D; d++)
					perm[d] = d;
				for (uint32_t d = D; d > 1; d--) {
					uint32_t j = rnd(d), t = perm[d - 1];

					perm[d - 1] = perm[j];
					perm[j] = t;
				}
				for (uint32_t d = 0; d < D; d++) {
					row[d] = pool[perm[d]];
					row[D + d] = pool[D + perm[d]];
				}
				break;
			default:
				break;
			}
			kvt_from_f32(s->dt, row, dst, 2 * D);
		}
	}
	free(row);
	free(pool);
	free(perm);
}

/* Queries of an entry: [H * G][D] of dt at q. */
static void fill_queries(const struct shape *s, const struct entry *e, void *q)
{
	uint32_t n = s->H * s->G, D = s->D;
	float *row = t_xmalloc(D * sizeof(float));

	for (uint32_t g = 0; g < n; g++) {
		float c = (float)((int)rnd(15) - 7) / 4.0f;

		for (uint32_t d = 0; d < D; d++)
			row[d] = e->kind == K_PERM
					 ? (g % 3 == 2 ? -1.0f : 1.0f) * (0.75f + unit() / 8)
				 : e->kind == K_POOL ? (float)((int)rnd(9) - 4) / 4.0f
						     : unit();
		if (e->kind == K_PERM) /* one value per query head */
			for (uint32_t d = 1; d < D; d++)
				row[d] = row[0];
		if (e->kind == K_POOL && chance(20)) /* a head with one value throughout */
			for (uint32_t d = 0; d < D; d++)
				row[d] = c;
		if (e->kind == K_SPECIAL && chance(25)) /* -0 meets infinities at hot */
			row[chance(50) ? e->hot : rnd(D)] = special(s->dt);
		kvt_from_f32(s->dt, row, (uint8_t *)q + (size_t)g * D * kvt_dtype_size(s->dt), D);
	}
	free(row);
}

/* The run's figures for one entry's reference selection: resident blocks, padding, cuts, and
   cuts inside a tie (the best block left out scores as the worst one taken). */
static void count_entry(const struct shape *s, const struct entry *e, const void *q,
			const uint32_t *sel)
{
	uint32_t H = s->H, G = s->G, D = s->D, esz = kvt_dtype_size(s->dt);
	float *qf = t_xmalloc((size_t)(G + 2) * D * sizeof(float));
	uint8_t *taken = t_xmalloc(e->nb);

	seen.entries++;
	seen.chunks2 += e->nb > 384;
	for (uint32_t h = 0; h < H; h++) {
		uint32_t nc = 0;
		float worst_in = INFINITY, best_out = -INFINITY;
		bool nan_in = false, nan_out = false;

		seen.heads++;
		kvt_to_f32(s->dt, (const uint8_t *)q + (size_t)h * G * D * esz, qf, (size_t)G * D);
		memset(taken, 0, e->nb);
		for (uint32_t j = 0; j < s->r; j++) {
			if (sel[h * s->r + j] == KVT_REGION_NONE)
				seen.none++;
			else
				taken[sel[h * s->r + j]] = 1;
		}
		for (uint32_t b = 0; b < e->nb; b++) {
			uint32_t nv = tokens_of(e->N, s->lbt, b);
			float sc;

			seen.blocks++;
			if (in_ranges(e, s->lbt, b, nv) + e->key[(size_t)b * H + h].tk == nv) {
				seen.resident++;
				continue;
			}
			nc++;
			sc = kvt_meta_bound(s->dt, D,
					    (const uint8_t *)e->meta +
						    ((size_t)b * H + h) * 2 * D * esz,
					    qf, G, qf + (size_t)G * D);
			seen.nan_cand += isnan(sc);
			seen.inf_cand += isinf(sc);
			if (taken[b]) {
				nan_in |= isnan(sc);
				if (sc < worst_in)
					worst_in = sc;
			} else {
				nan_out |= isnan(sc);
				if (sc > best_out)
					best_out = sc;
			}
		}
		seen.padded += nc < s->r;
		if (nc > s->r) {
			seen.cut++;
			seen.tie_cut += (nan_in && nan_out) || (!nan_in && worst_in == best_out);
		}
	}
	free(qf);
	free(taken);
}

/* Seconds the launches took under each schedule. */
static double sched_s[KEMU_SCHED_LANES_REVERSE + 1];

/* The batch under each of the emulator's schedules, one launch each, against the reference on
   each entry. what: for failures. */
static void check_batch(const struct shape *s, struct entry *e, uint32_t n, const char *what,
			bool count)
{
	size_t per = (size_t)s->H * s->r, qper = (size_t)s->H * s->G * s->D * kvt_dtype_size(s->dt);
	uint32_t *ref = t_xmalloc(n * per * sizeof(uint32_t));
	uint32_t *dev = t_xmalloc((n * per + 4) * sizeof(uint32_t));
	uint8_t *q = t_xmalloc(n * qper);
	struct kvt_gpu_quest desc[MAX_BATCH];
	uint32_t nb_max = 1;

	for (uint32_t i = 0; i < n; i++) {
		fill_queries(s, &e[i], q + i * qper);
		desc[i] =
			(struct kvt_gpu_quest){e[i].meta, e[i].key, e[i].N, e[i].sink, e[i].ring0};
		if (e[i].nb > nb_max)
			nb_max = e[i].nb;
	}
	{
		float *score = t_xmalloc(nb_max * sizeof(float));
		uint32_t *cand = t_xmalloc((nb_max + s->r) * sizeof(uint32_t));
		float *qf = t_xmalloc((size_t)(s->G + 2) * s->D * sizeof(float));

		for (uint32_t i = 0; i < n; i++) {
			struct kvt_region rg = {.key = e[i].key};
			struct kvt_region_geom g = {s->H, s->lbt, e[i].N, e[i].sink, e[i].ring0};

			kvt_quest_select(s->dt, s->D, s->G, &rg, &g, e[i].meta, q + i * qper, s->r,
					 ref + i * per, score, cand, qf);
			if (count)
				count_entry(s, &e[i], q + i * qper, ref + i * per);
		}
		free(score);
		free(cand);
		free(qf);
	}
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		double t0 = t_now_s();

		kemu_set_schedule(mode);
		for (size_t x = 0; x < n * per + 4; x++)
			dev[x] = GUARD;
		assert_int_equal(kvt_gpu_quest_select(s->dt, s->D, s->H, s->G, s->lbt, s->r, desc,
						      q, dev, n, NULL),
				 0);
		sched_s[mode] += t_now_s() - t0;
		for (uint32_t i = 0; i < n; i++)
			for (size_t x = 0; x < per; x++)
				if (dev[i * per + x] != ref[i * per + x])
					fail_msg(
						"%s, schedule %d: %s H %u G %u D %u bt %u r %u; "
						"entry %u of %u (kind %d, N %u, sink %u, ring0 %u, "
						"run %u): head %zu, sel[%zu] = %u, reference %u",
						what, mode, t_dt_name(s->dt), s->H, s->G, s->D,
						1u << s->lbt, s->r, i, n, (int)e[i].kind, e[i].N,
						e[i].sink, e[i].ring0, e[i].run, x / s->r, x % s->r,
						dev[i * per + x], ref[i * per + x]);
		for (size_t x = n * per; x < n * per + 4; x++)
			assert_int_equal(dev[x], GUARD);
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
	free(ref);
	free(dev);
	free(q);
}

static void free_entries(struct entry *e, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		free(e[i].meta);
		free(e[i].key);
	}
}

/* A token count with about nb blocks, the last one partial or full. */
static uint32_t tokens_for(uint32_t nb, uint32_t lbt)
{
	return nb == 0 ? 0 : ((nb - 1) << lbt) + 1 + rnd(1u << lbt);
}

static void random_run(uint64_t seed, uint32_t batches)
{
	static const enum kvt_dtype dts[] = {KVT_DTYPE_F32, KVT_DTYPE_F16, KVT_DTYPE_BF16};
	static const uint32_t heads[] = {1, 2, 3, 8}, groups[] = {1, 3, 4, 5, 8};

	t_rng_seed(seed);
	memset(&seen, 0, sizeof(seen));
	for (uint32_t step = 0; step < batches; step++) {
		struct shape s = {
			.dt = dts[rnd(3)],
			.H = heads[rnd(4)],
			.G = groups[rnd(5)],
			.D = chance(10)	  ? (chance(50) ? 8 : 40)
			     : chance(50) ? 64
					  : 128,
			.lbt = 2 + rnd(5),
		};
		struct entry e[MAX_BATCH];
		uint32_t n = 1 + rnd(MAX_BATCH);
		char what[32];

		switch (rnd(8)) {
		case 0:
			s.r = 1;
			break;
		case 1:
			s.r = chance(50) ? 32 : 33;
			break;
		case 2:
			s.r = 64;
			break;
		case 3:
			s.r = chance(50) ? KVT_GPU_QUEST_MAX_R : 65 + rnd(KVT_GPU_QUEST_MAX_R - 65);
			break;
		default:
			s.r = 1 + rnd(64);
		}
		for (uint32_t i = 0; i < n; i++) {
			uint32_t q = rnd(100), nb, edge, bt = 1u << s.lbt;

			nb = q < 3    ? 0				  /* no token */
			     : q < 28 ? 1 + rnd(s.r / 2 + 1)		  /* fewer than r */
			     : q < 85 ? s.r / 2 + rnd(1000)		  /* a few chunks */
			     : q < 95 ? 1000 + rnd(1500)		  /* several */
				      : (4096u >> (s.lbt / 2)) + rnd(64); /* up to 4,096 */
			e[i].N = tokens_for(nb, s.lbt);
			e[i].kind = (enum kind)rnd(K_KINDS);
			e[i].run = chance(30) ? 1 + rnd(100) : 0;
			e[i].hot = rnd(s.D);
			/* sink and ring a few blocks long, or none; now and then the whole layer */
			edge = e[i].N < 4 * bt ? e[i].N : 4 * bt;
			e[i].sink = chance(30) ? 0 : rnd(edge + 1);
			e[i].ring0 = e[i].N - (chance(20) ? 0 : rnd(edge + 1));
			if (chance(3))
				e[i].sink = e[i].N;
			if (e[i].ring0 < e[i].sink)
				e[i].ring0 = e[i].sink; /* region.h's contract */
			fill_entry(&s, &e[i]);
		}
		snprintf(what, sizeof(what), "batch %u", step);
		check_batch(&s, e, n, what, true);
		free_entries(e, n);
		seen.batches++;
	}
}

static void test_quest_random(void **state)
{
	uint64_t seed = t_pick_seed();
	uint32_t batches = (uint32_t)t_pick_ops(240);
	double t0 = t_now_s();

	(void)state;
	memset(sched_s, 0, sizeof(sched_s));
	random_run(seed, batches);
	print_message("# %u batches, seed %llu: %.2f s, of which the launches under schedule 0, "
		      "1, 2, 3: %.2f, %.2f, %.2f, %.2f s\n",
		      batches, (unsigned long long)seed, t_now_s() - t0, sched_s[0], sched_s[1],
		      sched_s[2], sched_s[3]);
	print_message("#   %llu entries (%llu past one chunk), %llu heads: %llu blocks (%llu "
		      "resident); %llu heads padded (%llu entries none), %llu cut (%llu inside a "
		      "tie); candidates: %llu NaN, %llu infinite\n",
		      (unsigned long long)seen.entries, (unsigned long long)seen.chunks2,
		      (unsigned long long)seen.heads, (unsigned long long)seen.blocks,
		      (unsigned long long)seen.resident, (unsigned long long)seen.padded,
		      (unsigned long long)seen.none, (unsigned long long)seen.cut,
		      (unsigned long long)seen.tie_cut, (unsigned long long)seen.nan_cand,
		      (unsigned long long)seen.inf_cand);
}

/* Long layers: 4,096 blocks of 32 tokens (128K tokens), r = 64, and 16,384 of 8, r = 256, with
   the tie-heavy and the rounding-decided data. */
static void test_quest_long(void **state)
{
	struct shape s = {KVT_DTYPE_BF16, 2, 4, 128, 5, 64};
	struct entry e[2] = {
		{.N = 4096u << 5, .kind = K_POOL},
		{.N = 4096u << 5, .sink = 4, .ring0 = (4096u << 5) - 1000, .kind = K_PERM}};
	double t0 = t_now_s();

	(void)state;
	t_rng_seed(0x5eed);
	fill_entry(&s, &e[0]);
	fill_entry(&s, &e[1]);
	check_batch(&s, e, 2, "4,096 blocks", false);
	free_entries(e, 2);

	s = (struct shape){KVT_DTYPE_F32, 1, 8, 64, 3, KVT_GPU_QUEST_MAX_R};
	e[0] = (struct entry){.N = (16384u << 3) - 3, .kind = K_PERM};
	fill_entry(&s, &e[0]);
	check_batch(&s, e, 1, "16,384 blocks", false);
	free_entries(e, 1);
	print_message("# 4,096 and 16,384 blocks, every schedule: %.2f s\n", t_now_s() - t0);
}

/* A layer whose answer is known without the reference: 12 blocks of 4 tokens, f32, one kv head
   of two query heads (1, 0) and (0, -1), r = 4, 9 and 11. Blocks 3 and 7 are resident by their
   top-K counts; the others score max(1 * mx0 + 0 * mx1, 0 * mx0 - mn1) = max(1, 0.25) = 1 (a
   tie), except block 10, whose mx0 is NaN (query head 0's sum NaN: the bound NaN), and block 11,
   whose mx0 is 2 and mn1 NaN (query head 1's sum NaN, which the maximum ignores: 2). */
static void test_quest_known(void **state)
{
	enum { NB = 12, D = 2 };
	float meta[NB][2][D], q[2][D] = {{1.0f, 0.0f}, {0.0f, -1.0f}};
	struct kvt_region_key key[NB];
	struct kvt_gpu_quest desc = {meta, key, NB * 4, 0, NB * 4};
	uint32_t sel[11];
	const uint32_t want4[4] = {0, 1, 2, 11}, want9[9] = {0, 1, 2, 4, 5, 6, 8, 9, 11},
		       want11[11] = {0, 1, 2, 4, 5, 6, 8, 9, 10, 11, KVT_REGION_NONE};

	(void)state;
	memset(key, 0, sizeof(key));
	for (uint32_t b = 0; b < NB; b++) {
		meta[b][0][0] = -5.0f;
		meta[b][0][1] = -0.25f;
		meta[b][1][0] = 1.0f;
		meta[b][1][1] = 0.5f;
	}
	key[3].tk = key[7].tk = 4;
	meta[10][1][0] = NAN;
	meta[11][1][0] = 2.0f;
	meta[11][0][1] = NAN;
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		kemu_set_schedule(mode);
		assert_int_equal(
			kvt_gpu_quest_select(KVT_DTYPE_F32, D, 1, 2, 2, 4, &desc, q, sel, 1, NULL),
			0);
		assert_memory_equal(sel, want4, sizeof(want4));
		assert_int_equal(
			kvt_gpu_quest_select(KVT_DTYPE_F32, D, 1, 2, 2, 9, &desc, q, sel, 1, NULL),
			0);
		assert_memory_equal(sel, want9, sizeof(want9));
		assert_int_equal(
			kvt_gpu_quest_select(KVT_DTYPE_F32, D, 1, 2, 2, 11, &desc, q, sel, 1, NULL),
			0);
		assert_memory_equal(sel, want11, sizeof(want11));
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
	{ /* the reference agrees */
		struct kvt_region rg = {.key = key};
		struct kvt_region_geom g = {1, 2, NB * 4, 0, NB * 4};
		float score[NB], qf[4 * D];
		uint32_t cand[NB + 11];

		kvt_quest_select(KVT_DTYPE_F32, D, 2, &rg, &g, meta, q, 11, sel, score, cand, qf);
		assert_memory_equal(sel, want11, sizeof(want11));
		kvt_quest_select(KVT_DTYPE_F32, D, 2, &rg, &g, meta, q, 4, sel, score, cand, qf);
		assert_memory_equal(sel, want4, sizeof(want4));
	}
}

static void test_quest_invalid(void **state)
{
	uint16_t meta[2 * 2 * 8] = {0}, q[4 * 8] = {0}; /* one block of two heads */
	struct kvt_region_key key[2] = {{0}};
	struct kvt_gpu_quest desc = {meta, key, 4, 0, 4};
	uint32_t sel[2 * KVT_GPU_QUEST_MAX_R + 1];

	(void)state;
	for (size_t x = 0; x < sizeof(sel) / sizeof(sel[0]); x++)
		sel[x] = GUARD;
	/* n == 0: nothing to do, whatever else */
	assert_int_equal(
		kvt_gpu_quest_select(KVT_DTYPE_F16, 0, 0, 0, 40, 0, NULL, NULL, NULL, 0, NULL), 0);
	assert_int_equal(kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 2, 2, 0, &desc, q, sel, 1, NULL),
			 KEMU_ERR_INVALID_VALUE); /* r == 0 */
	assert_int_equal(kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 2, 2, KVT_GPU_QUEST_MAX_R + 1,
					      &desc, q, sel, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(
		kvt_gpu_quest_select(KVT_DTYPE_F16, 4097, 2, 1, 2, 1, &desc, q, sel, 1, NULL),
		KEMU_ERR_INVALID_VALUE); /* g_count * head_dim */
	assert_int_equal(
		kvt_gpu_quest_select(KVT_DTYPE_F16, 1024, 2, 5, 2, 1, &desc, q, sel, 1, NULL),
		KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_quest_select(KVT_DTYPE_F16, 0, 2, 2, 2, 1, &desc, q, sel, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 0, 2, 2, 1, &desc, q, sel, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 0, 2, 1, &desc, q, sel, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(
		kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 2, 32, 1, &desc, q, sel, 1, NULL),
		KEMU_ERR_INVALID_VALUE); /* lbt */
	assert_int_equal(
		kvt_gpu_quest_select((enum kvt_dtype)7, 8, 2, 2, 2, 1, &desc, q, sel, 1, NULL),
		KEMU_ERR_INVALID_VALUE);
	assert_int_equal(
		kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 65536, 2, 2, 1, &desc, q, sel, 32768, NULL),
		KEMU_ERR_INVALID_VALUE); /* n * n_heads past INT32_MAX */
	assert_int_equal(kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 2, 2, 1, NULL, q, sel, 1, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(
		kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 2, 2, 1, &desc, NULL, sel, 1, NULL),
		KEMU_ERR_INVALID_VALUE);
	assert_int_equal(
		kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 2, 2, 1, &desc, q, NULL, 1, NULL),
		KEMU_ERR_INVALID_VALUE);
	for (size_t x = 0; x < sizeof(sel) / sizeof(sel[0]); x++)
		assert_int_equal(sel[x], GUARD);
	/* at the limits it runs: r = KVT_GPU_QUEST_MAX_R of a layer with one block per head */
	assert_int_equal(kvt_gpu_quest_select(KVT_DTYPE_F16, 8, 2, 2, 2, KVT_GPU_QUEST_MAX_R, &desc,
					      q, sel, 1, NULL),
			 0);
	for (uint32_t h = 0; h < 2; h++) {
		assert_int_equal(sel[h * KVT_GPU_QUEST_MAX_R], 0);
		assert_int_equal(sel[h * KVT_GPU_QUEST_MAX_R + 1], KVT_REGION_NONE);
		assert_int_equal(sel[h * KVT_GPU_QUEST_MAX_R + KVT_GPU_QUEST_MAX_R - 1],
				 KVT_REGION_NONE);
	}
	assert_int_equal(sel[2 * KVT_GPU_QUEST_MAX_R], GUARD);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quest_invalid),
		cmocka_unit_test(test_quest_known),
		cmocka_unit_test(test_quest_random),
		cmocka_unit_test(test_quest_long),
	};

	return cmocka_run_group_tests_name("quest-emu", tests, NULL, NULL);
}
