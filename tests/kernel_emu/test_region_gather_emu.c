/* SPDX-License-Identifier: MIT */
/*
 * region-gather-emu: the FlashH2D of recall regions (policy/region_gather.cu,
 * kvt_gpu_region_gather) on the CPU kernel emulator against a memcpy per load: after each
 * launch the whole frame pool (the frames no load names, and guard bytes on both sides,
 * included) must equal the reference's byte for byte, and so each region's stale flag and the
 * missing count.
 *
 * Random batches with hand-made load lists: regions of 1, 2, 8 or 37 kv heads, with 0 loads or
 * up to their slot count (distinct slots, keys of any (block, head), reloads where old ==
 * key), entries past the load count that look valid (a kernel that reads past *n_load copies
 * them and shows), blocks with a group entry of 0 (not copied, counted, the region made stale),
 * a region without a group array (all missing), regions with and without a frame array (none:
 * frame = slot), with and without a stale flag, a missing counter or none; block sizes of 16,
 * 48, 2064 (a chunk and one vector), 4096, 16384 and random multiples of 16; 0, 1, 3, 16 and
 * more than the maximum of CTAs; batches of more regions than a CTA scans at once (512), so the
 * load numbering spans windows. Host groups overlap at random 16-byte offsets of one random
 * host pool (sources are only read), so a wrong block or head reads other bytes. Each batch
 * runs under the emulator's four schedules (a missing barrier shows).
 *
 * Then the pipeline: load lists from the CPU reference kvt_region_recall (policy/region.c)
 * over successive calls (misses into empty and evicted slots, reloads of a growing last block,
 * -ENOSPC calls that list only reloads), gathered call after call into one pool, while blocks
 * come and go from DRAM. Finally the argument checks: nothing launched, nothing written.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gather.h"
#include "gpu.h"
#include "kemu_api.h"
#include "region.h"
#include "t_data.h"

#define GUARD 256u /* bytes of the pool's guards, before and after the frames */

/* One region of a batch, as the test builds it (the descriptor points into it). */
struct greg {
	uint32_t H, r, cap_blocks, n_slots;
	struct kvt_region_load *load; /* [H * r] */
	uint32_t n_load;
	uint32_t *frame;  /* [n_slots], or NULL */
	uint64_t *group;  /* [cap_blocks], or NULL */
	uint32_t stale;	  /* the device's flag */
	bool has_stale;	  /* the descriptor names it */
	uint32_t stale0;  /* its value before the launch */
	uint32_t missing; /* the reference's count of its loads without a group */
};

/* The frame pool as the device sees it, and the reference's copy. */
struct pool {
	uint8_t *dev, *ref; /* GUARD + n_frames * bb + GUARD bytes each */
	uint32_t n_frames;
	uint64_t bb;
};

static uint32_t rnd(uint32_t n)
{
	return t_rng_below(n);
}

static bool chance(uint32_t percent)
{
	return rnd(100) < percent;
}

static void fill_bytes(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)t_rng_next();
}

/* Memory at a 16-byte boundary, zeroed; n may be 0. */
static void *xalloc16(size_t n)
{
	void *p = aligned_alloc(16, (n + 15) / 16 * 16 + 16);

	assert_non_null(p);
	memset(p, 0, (n + 15) / 16 * 16 + 16);
	return p;
}

static void pool_init(struct pool *p, uint32_t n_frames, uint64_t bb)
{
	size_t bytes = 2 * GUARD + (size_t)n_frames * bb;

	p->n_frames = n_frames;
	p->bb = bb;
	p->dev = xalloc16(bytes);
	p->ref = t_xmalloc(bytes);
	fill_bytes(p->dev, bytes);
	memcpy(p->ref, p->dev, bytes);
}

static void pool_free(struct pool *p)
{
	free(p->dev);
	free(p->ref);
}

static uint64_t frame_base(const struct pool *p)
{
	return (uint64_t)(uintptr_t)(p->dev + GUARD);
}

/* Fails at the first byte of the pool that differs, naming its frame. */
static void pool_compare(const struct pool *p, const char *what)
{
	size_t bytes = 2 * GUARD + (size_t)p->n_frames * p->bb;

	for (size_t i = 0; i < bytes; i++) {
		if (p->dev[i] == p->ref[i])
			continue;
		if (i < GUARD || i >= bytes - GUARD)
			fail_msg("%s: guard byte %zu written", what, i);
		fail_msg("%s: frame %zu differs at byte %zu (block of %llu bytes)", what,
			 (i - GUARD) / p->bb, (i - GUARD) % p->bb, (unsigned long long)p->bb);
	}
}

/* The reference: each load of each region copied with memcpy, in order (the loads of a batch
   name distinct frames, so the order does not matter); stale flags and missing counts. */
static uint32_t ref_gather(struct pool *p, struct greg *rs, uint32_t n)
{
	uint32_t missing = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct greg *g = &rs[i];

		g->missing = 0;
		for (uint32_t k = 0; k < g->n_load; k++) {
			const struct kvt_region_load *ld = &g->load[k];
			uint32_t b = ld->key / g->H, h = ld->key % g->H;
			uint32_t f = g->frame ? g->frame[ld->slot] : ld->slot;
			uint64_t src = g->group && b < g->cap_blocks ? g->group[b] : 0;

			assert_true(f < p->n_frames);
			if (b >= g->cap_blocks)
				src = 0; /* past the table: as not in DRAM */
			if (src == 0) {
				g->missing++;
				continue;
			}
			memcpy(p->ref + GUARD + (size_t)f * p->bb,
			       (const uint8_t *)(uintptr_t)src + (size_t)h * p->bb, p->bb);
		}
		missing += g->missing;
	}
	return missing;
}

static struct kvt_gpu_region desc_of(struct greg *g)
{
	return (struct kvt_gpu_region){
		.load = g->load,
		.n_load = &g->n_load,
		.frame = g->frame,
		.stale = g->has_stale ? &g->stale : NULL,
		.group = g->group,
		.n_heads = g->H,
		.r = g->r,
		.cap_blocks = g->cap_blocks,
	};
}

/* Runs the gather on the n regions and checks pool, flags and count against the reference
   (which the caller has not run yet). */
static void check_launch(struct pool *p, struct greg *rs, uint32_t n, uint32_t ctas,
			 bool with_missing, const char *what)
{
	struct kvt_gpu_region *d = t_xmalloc(n * sizeof(*d));
	uint32_t missing0 = (uint32_t)t_rng_next() >> 1, missing = missing0, want_missing;
	uint32_t fresh0 = (uint32_t)t_rng_next() >> 1, fresh = fresh0, want_fresh = 0;
	uint32_t want_grid = ctas == 0			  ? KVT_GATHER_CTAS_DEFAULT
			     : ctas > KVT_GATHER_CTAS_MAX ? KVT_GATHER_CTAS_MAX
							  : ctas;
	struct kemu_launch_info li;

	for (uint32_t i = 0; i < n; i++) {
		rs[i].stale0 = rs[i].stale;
		d[i] = desc_of(&rs[i]);
	}
	for (uint32_t i = 0; i < n; i++) /* loads into empty slots, copied or not */
		for (uint32_t x = 0; d[i].load && x < *d[i].n_load; x++)
			want_fresh += d[i].load[x].old == KVT_REGION_NONE;
	want_missing = ref_gather(p, rs, n);
	assert_int_equal(kvt_gpu_region_gather(d, n, p->bb, frame_base(p), ctas,
					       with_missing ? &missing : NULL,
					       with_missing ? &fresh : NULL, NULL),
			 0);
	kemu_get_launch_info(&li);
	assert_int_equal(li.grid[0], want_grid);
	assert_int_equal(li.block[0], KVT_GATHER_THREADS);
	pool_compare(p, what);
	if (with_missing && missing != missing0 + want_missing)
		fail_msg("%s: missing %u, want %u", what, missing - missing0, want_missing);
	if (with_missing && fresh != fresh0 + want_fresh)
		fail_msg("%s: loads into empty slots %u, want %u", what, fresh - fresh0,
			 want_fresh);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t want = rs[i].missing ? 1 : rs[i].stale0;

		if (rs[i].has_stale && rs[i].stale != want)
			fail_msg("%s: region %u stale %u, want %u", what, i, rs[i].stale, want);
		if (!rs[i].has_stale && rs[i].stale != rs[i].stale0)
			fail_msg("%s: region %u's flag written without a descriptor", what, i);
	}
	free(d);
}

/* ---- random batches with hand-made load lists ------------------------------------------- */

/* What the batches went through, so that a run that stops reaching a case shows. */
static struct {
	uint64_t loads, reloads, missing, empty_regions, no_frame, no_group, windows;
} seen;

/* A batch of n regions with block size bb into a pool; the host pool holds the groups, at
   random 16-byte offsets, overlapping. */
static void batch_case(uint32_t n, uint64_t bb, uint32_t ctas, uint32_t max_slots)
{
	static const uint32_t heads[] = {1, 2, 8, 37};
	struct greg *rs = t_xmalloc(n * sizeof(*rs));
	uint32_t no_frame = chance(50) ? rnd(n) : UINT32_MAX, n_frames = 0, *perm, next = 0;
	size_t host_bytes = (size_t)37 * bb + 64 * 16;
	uint8_t *host = xalloc16(host_bytes);
	struct pool p;
	char what[96];

	fill_bytes(host, host_bytes);
	for (uint32_t i = 0; i < n; i++) {
		struct greg *g = &rs[i];

		g->H = heads[rnd(4)];
		g->r = 1 + rnd(12);
		g->cap_blocks = 1 + rnd(40);
		g->n_slots = chance(10) ? 0 : rnd(max_slots + 1);
		n_frames += g->n_slots;
	}
	/* frames: the region without a frame array has [0, its slots); the others a shuffled
	   share of the rest */
	if (no_frame != UINT32_MAX)
		next = rs[no_frame].n_slots;
	perm = t_xmalloc((n_frames + 1) * sizeof(*perm));
	for (uint32_t f = 0; f < n_frames; f++)
		perm[f] = f;
	for (uint32_t f = n_frames - next; f > 1; f--) {
		uint32_t j = rnd(f), t = perm[next + f - 1];

		perm[next + f - 1] = perm[next + j];
		perm[next + j] = t;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct greg *g = &rs[i];
		uint32_t cap = g->H * g->r < g->n_slots ? g->H * g->r : g->n_slots;
		uint32_t *slots = t_xmalloc((g->n_slots + 1) * sizeof(uint32_t));

		g->load = t_xmalloc(g->H * g->r * sizeof(*g->load));
		g->n_load = chance(15) ? 0 : cap == 0 ? 0 : chance(30) ? cap : rnd(cap + 1);
		if (i == no_frame) {
			g->frame = NULL;
			seen.no_frame++;
		} else {
			g->frame = t_xmalloc((g->n_slots + 1) * sizeof(uint32_t));
			for (uint32_t s = 0; s < g->n_slots; s++)
				g->frame[s] = perm[next++];
		}
		if (chance(4)) {
			g->group = NULL;
			seen.no_group++;
		} else {
			g->group = t_xmalloc(g->cap_blocks * sizeof(uint64_t));
			for (uint32_t b = 0; b < g->cap_blocks; b++)
				g->group[b] =
					chance(15) ? 0 : (uint64_t)(uintptr_t)(host + 16 * rnd(64));
		}
		/* distinct slots: a partial shuffle */
		for (uint32_t s = 0; s < g->n_slots; s++)
			slots[s] = s;
		for (uint32_t x = 0; x < g->H * g->r; x++) {
			struct kvt_region_load *ld = &g->load[x];
			uint32_t key = rnd(g->cap_blocks * g->H);

			if (x < g->n_load) {
				uint32_t j = x + rnd(g->n_slots - x), t = slots[x];

				slots[x] = slots[j];
				slots[j] = t;
				ld->slot = slots[x];
			} else { /* past the count: valid-looking, never to be copied */
				ld->slot = g->n_slots ? rnd(g->n_slots) : 0;
			}
			ld->key = key;
			ld->old = chance(30)   ? key
				  : chance(40) ? KVT_REGION_NONE
					       : rnd(g->cap_blocks * g->H);
			ld->n_valid = 1 + rnd(16);
			if (x < g->n_load) {
				seen.loads++;
				seen.reloads += ld->old == key;
				seen.missing += !g->group || !g->group[key / g->H];
			}
		}
		seen.empty_regions += g->n_load == 0;
		g->has_stale = chance(80);
		g->stale = chance(50) ? 0 : 2;
		free(slots);
	}
	seen.windows += n > KVT_GATHER_THREADS;
	pool_init(&p, n_frames, bb);
	snprintf(what, sizeof(what), "%u regions, %llu-byte blocks, %u ctas", n,
		 (unsigned long long)bb, ctas);
	for (int mode = KEMU_SCHED_LOCKSTEP; mode <= KEMU_SCHED_LANES_REVERSE; mode++) {
		kemu_set_schedule(mode);
		for (uint32_t i = 0; i < n; i++)
			rs[i].stale = rs[i].stale0 = chance(50) ? 0 : 2;
		check_launch(&p, rs, n, ctas, mode != KEMU_SCHED_WARPS_FORWARD, what);
		/* the next launch from a fresh pool: the same frames, other bytes */
		fill_bytes(p.dev, 2 * GUARD + (size_t)n_frames * bb);
		memcpy(p.ref, p.dev, 2 * GUARD + (size_t)n_frames * bb);
	}
	kemu_set_schedule(KEMU_SCHED_LOCKSTEP);
	pool_free(&p);
	for (uint32_t i = 0; i < n; i++) {
		free(rs[i].load);
		free(rs[i].frame);
		free(rs[i].group);
	}
	free(perm);
	free(host);
	free(rs);
}

static void test_gather_batches(void **state)
{
	uint64_t seed = t_pick_seed();

	(void)state;
	memset(&seen, 0, sizeof(seen));
	t_rng_seed(seed);
	print_message("# seed %llu\n", (unsigned long long)seed);
	batch_case(1, 16, 0, 8);
	batch_case(7, 16, 1, 40);
	batch_case(12, 48, 3, 30);
	batch_case(9, 2064, 16, 20);
	batch_case(10, 4096, 0, 24);
	batch_case(6, 16384, 16, 12);
	batch_case(8, 16384, 1, 12);
	batch_case(5, 16 * (1 + rnd(512)), 5, 16);
	batch_case(1100, 48, 0, 6);    /* three windows of regions */
	batch_case(600, 16, 2, 4);     /* two windows */
	batch_case(3, 4096, 5000, 16); /* clamped to the maximum of CTAs */
	print_message("# %llu loads: %llu reloads, %llu missing; %llu regions without loads, "
		      "%llu without frames, %llu without groups\n",
		      (unsigned long long)seen.loads, (unsigned long long)seen.reloads,
		      (unsigned long long)seen.missing, (unsigned long long)seen.empty_regions,
		      (unsigned long long)seen.no_frame, (unsigned long long)seen.no_group);
	assert_true(seen.reloads > 0);
	assert_true(seen.missing > 0);
	assert_true(seen.empty_regions > 0);
	assert_true(seen.loads > seen.missing + 1000);
	assert_int_equal(seen.windows, 2);
}

/* One region, one load at a time: each head and each vector of a block lands where it must
   (a case small enough to reason about when the random batches fail). */
static void test_gather_single(void **state)
{
	enum { H = 3, CAP = 4, SLOTS = 5 };
	static const uint64_t sizes[] = {16, 48, 4096};
	uint8_t *host;
	uint64_t group[CAP];
	uint32_t frame[SLOTS] = {4, 0, 3, 1, 2};
	struct kvt_region_load load[H];

	(void)state;
	t_rng_seed(7);
	for (uint32_t z = 0; z < 3; z++) {
		uint64_t bb = sizes[z];
		struct pool p;
		struct greg g = {.H = H, .r = 1, .cap_blocks = CAP, .n_slots = SLOTS};

		host = xalloc16((size_t)CAP * H * bb);
		fill_bytes(host, (size_t)CAP * H * bb);
		for (uint32_t b = 0; b < CAP; b++)
			group[b] = b == 2 ? 0 : (uint64_t)(uintptr_t)(host + (size_t)b * H * bb);
		pool_init(&p, SLOTS, bb);
		g.load = load;
		g.frame = frame;
		g.group = group;
		g.has_stale = true;
		for (uint32_t key = 0; key < CAP * H; key++) {
			load[0] = (struct kvt_region_load){key % SLOTS, key, KVT_REGION_NONE, 1};
			g.n_load = 1;
			g.stale = 0;
			check_launch(&p, &g, 1, 1, true, "single load");
		}
		/* three loads, a reload among them, and nothing for a region with none */
		load[0] = (struct kvt_region_load){2, 4, 4, 3};
		load[1] = (struct kvt_region_load){0, 11, KVT_REGION_NONE, 1};
		load[2] = (struct kvt_region_load){4, 7, 1, 2};
		g.n_load = 3;
		g.stale = 0;
		check_launch(&p, &g, 1, 0, true, "three loads");
		assert_int_equal(g.stale, 1); /* key 7: block 2, not in DRAM */
		/* a block past the table: not copied, counted */
		load[0] = (struct kvt_region_load){1, CAP * H + 1, KVT_REGION_NONE, 1};
		load[1] = (struct kvt_region_load){3, 5, KVT_REGION_NONE, 1};
		g.n_load = 2;
		g.stale = 0;
		check_launch(&p, &g, 1, 3, true, "block past the table");
		assert_int_equal(g.stale, 1);
		g.n_load = 0;
		g.stale = 0;
		check_launch(&p, &g, 1, 2, true, "no load");
		assert_int_equal(g.stale, 0);
		pool_free(&p);
		free(host);
	}
}

/* ---- load lists from the reference's recall calls --------------------------------------- */

#define P_REGIONS 5
#define P_CALLS 12

static void test_gather_recall(void **state)
{
	static const uint32_t heads[P_REGIONS] = {1, 2, 8, 37, 4};
	const uint64_t bb = 64;
	struct greg rs[P_REGIONS];
	struct kvt_region ref[P_REGIONS];
	struct kvt_region_slot *slot[P_REGIONS];
	struct kvt_region_key *key[P_REGIONS];
	uint32_t *sel[P_REGIONS], *view[P_REGIONS], view_n[P_REGIONS][KVT_GPU_REGION_MAX_HEADS];
	uint32_t N[P_REGIONS], lbt = 2, n_frames = 0, enospc = 0, reloads = 0, evictions = 0;
	size_t host_bytes = 4096 * bb;
	uint8_t *host = xalloc16(host_bytes);
	struct kvt_region_tally tally = {0};
	struct pool p;

	(void)state;
	t_rng_seed(t_pick_seed());
	fill_bytes(host, host_bytes);
	memset(rs, 0, sizeof(rs));
	for (uint32_t i = 0; i < P_REGIONS; i++) {
		struct greg *g = &rs[i];

		g->H = heads[i];
		g->r = 2 + rnd(6);
		g->cap_blocks = 64;
		/* region 4 runs short of slots now and then (-ENOSPC) */
		g->n_slots = i == 4 ? g->H * g->r * 2 / 3 : g->H * g->r + rnd(8);
		n_frames += g->n_slots;
	}
	pool_init(&p, n_frames, bb);
	n_frames = 0;
	for (uint32_t i = 0; i < P_REGIONS; i++) {
		struct greg *g = &rs[i];

		slot[i] = t_xmalloc(g->n_slots * sizeof(*slot[i]));
		key[i] = t_xmalloc((size_t)g->cap_blocks * g->H * sizeof(*key[i]));
		sel[i] = t_xmalloc(g->H * g->r * sizeof(uint32_t));
		view[i] = t_xmalloc(g->H * g->r * sizeof(uint32_t));
		g->load = t_xmalloc(g->H * g->r * sizeof(*g->load));
		g->frame = t_xmalloc(g->n_slots * sizeof(uint32_t));
		g->group = t_xmalloc(g->cap_blocks * sizeof(uint64_t));
		for (uint32_t s = 0; s < g->n_slots; s++) /* frames in reverse: not the slots */
			g->frame[s] = n_frames + g->n_slots - 1 - s;
		n_frames += g->n_slots;
		g->has_stale = true;
		ref[i] = (struct kvt_region){
			.slot = slot[i],
			.key = key[i],
			.cap_blocks = g->cap_blocks,
			.link = t_xmalloc(g->n_slots * sizeof(struct kvt_region_link)),
			.head = KVT_REGION_PENDING,
			.tail = KVT_REGION_PENDING};
		kvt_region_grow(&ref[i], g->n_slots);
		N[i] = 17 + rnd(24);
	}
	for (uint32_t c = 0; c < P_CALLS; c++) {
		for (uint32_t i = 0; i < P_REGIONS; i++) {
			struct greg *g = &rs[i];
			uint32_t nb = (N[i] + (1u << lbt) - 1) >> lbt;
			struct kvt_region_geom geo = {g->H, lbt, N[i], 0, N[i]};
			int err;

			for (uint32_t x = 0; x < g->H * g->r; x++) /* recent blocks, hits */
				sel[i][x] = chance(10)	 ? KVT_REGION_NONE
					    : chance(50) ? nb - 1 - rnd(nb < 4 ? nb : 4)
							 : rnd(nb);
			/* region 4: more distinct lookups than slots (nb >= 5: -ENOSPC), or H */
			for (uint32_t x = 0; i == 4 && c % 4 == 0 && x < g->H * g->r; x++)
				sel[i][x] = x % g->r % nb;
			for (uint32_t x = 0; i == 4 && c % 4 == 3 && x < g->H * g->r; x++)
				sel[i][x] = nb - 1;
			/* blocks leave and enter DRAM; the host rows of a block move */
			for (uint32_t b = 0; b < g->cap_blocks; b++)
				if (c == 0 || chance(20))
					g->group[b] =
						chance(10) ? 0
							   : (uint64_t)(uintptr_t)(host +
										   16 * rnd(4096 -
											    40));
			err = kvt_region_recall(&ref[i], &geo, sel[i], g->r, NULL, view[i],
						view_n[i], g->load, &g->n_load, &tally);
			assert_true(err == 0 || err == -ENOSPC);
			enospc += err == -ENOSPC;
			for (uint32_t k = 0; k < g->n_load; k++)
				reloads += g->load[k].old == g->load[k].key;
			g->stale = 0;
			/* the last block grows between calls: reloads */
			N[i] += rnd(3);
			if (N[i] > g->cap_blocks << lbt)
				N[i] = g->cap_blocks << lbt;
		}
		check_launch(&p, rs, P_REGIONS,
			     c % 3 == 0	  ? 0
			     : c % 3 == 1 ? 1
					  : 7,
			     true, "recall loads");
	}
	evictions = tally.evictions;
	print_message("# %u calls: %u loads, %u reloads, %u evictions, %u -ENOSPC\n",
		      P_CALLS * P_REGIONS, tally.loads, reloads, evictions, enospc);
	assert_true(reloads > 0);
	assert_true(evictions > 0);
	assert_true(enospc > 0 && enospc < P_CALLS);
	pool_free(&p);
	for (uint32_t i = 0; i < P_REGIONS; i++) {
		free(slot[i]);
		free(key[i]);
		free(sel[i]);
		free(view[i]);
		free(ref[i].link);
		free(rs[i].load);
		free(rs[i].frame);
		free(rs[i].group);
	}
	free(host);
}

/* ---- argument checks -------------------------------------------------------------------- */

static void test_gather_invalid(void **state)
{
	static uint8_t frames[64] __attribute__((aligned(16)));
	struct kvt_region_load load = {0, 0, KVT_REGION_NONE, 1};
	uint32_t n_load = 1, frame = 0, stale = 0, missing = 5;
	uint64_t group[1] = {0};
	struct kvt_gpu_region d = {.load = &load,
				   .n_load = &n_load,
				   .frame = &frame,
				   .stale = &stale,
				   .group = group,
				   .n_heads = 1,
				   .r = 1,
				   .cap_blocks = 1};
	uint64_t base = (uint64_t)(uintptr_t)frames;
	struct kemu_launch_info li;
	uint64_t launches;

	(void)state;
	kemu_get_launch_info(&li);
	launches = li.launches;
	assert_int_equal(kvt_gpu_region_gather(NULL, 0, 16, base, 0, &missing, NULL, NULL), 0);
	assert_int_equal(kvt_gpu_region_gather(&d, 0, 0, 0, 0, &missing, NULL, NULL), 0);
	assert_int_equal(kvt_gpu_region_gather(NULL, 1, 16, base, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_gather(&d, 1, 0, base, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_gather(&d, 1, 8, base, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_gather(&d, 1, 24, base, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_gather(&d, 1, 1ull << 32, base, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_gather(&d, 1, 16, 0, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_gather(&d, 1, 16, base + 8, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_gather(&d, 0x80000000u, 16, base, 0, &missing, NULL, NULL),
			 KEMU_ERR_INVALID_VALUE);
	kemu_get_launch_info(&li);
	assert_int_equal(li.launches, launches); /* nothing launched */
	assert_int_equal(missing, 5);
	assert_int_equal(stale, 0);
	/* the same call with valid arguments launches, and counts the load without a group */
	assert_int_equal(kvt_gpu_region_gather(&d, 1, 16, base, 0, &missing, NULL, NULL), 0);
	kemu_get_launch_info(&li);
	assert_int_equal(li.launches, launches + 1);
	assert_int_equal(missing, 6);
	assert_int_equal(stale, 1);
}

/* kvt_gpu_region_groups: entries written at distinct random places of a table, the rest
   untouched; argument checks launch nothing. */
static void test_groups(void **state)
{
	enum { TABLE = 4096 };
	static const uint32_t ns[] = {0, 1, 255, 256, 257, 1000, TABLE};
	uint64_t *table = t_xmalloc(TABLE * sizeof(*table)),
		 *want = t_xmalloc(TABLE * sizeof(*want));
	uint64_t *at = t_xmalloc(TABLE * sizeof(*at)), *val = t_xmalloc(TABLE * sizeof(*val));
	uint32_t *perm = t_xmalloc(TABLE * sizeof(*perm));
	struct kemu_launch_info li;
	uint64_t launches;

	(void)state;
	for (size_t c = 0; c < sizeof(ns) / sizeof(ns[0]); c++) {
		uint32_t n = ns[c];

		for (uint32_t i = 0; i < TABLE; i++) {
			table[i] = want[i] = t_rng_next();
			perm[i] = i;
		}
		for (uint32_t i = 0; i < n; i++) { /* n distinct places, in a random order */
			uint32_t j = i + (uint32_t)(t_rng_next() % (TABLE - i)), x = perm[i];

			perm[i] = perm[j];
			perm[j] = x;
			at[i] = (uint64_t)(uintptr_t)&table[perm[i]];
			val[i] = want[perm[i]] = t_rng_next();
		}
		kemu_get_launch_info(&li);
		launches = li.launches;
		assert_int_equal(kvt_gpu_region_groups(at, val, n, NULL), 0);
		kemu_get_launch_info(&li);
		assert_int_equal(li.launches, launches + (n > 0));
		assert_memory_equal(table, want, TABLE * sizeof(*table));
	}
	kemu_get_launch_info(&li);
	launches = li.launches;
	assert_int_equal(kvt_gpu_region_groups(NULL, val, 1, NULL), KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_groups(at, NULL, 1, NULL), KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_groups(at, val, 0x80000000u, NULL), KEMU_ERR_INVALID_VALUE);
	assert_int_equal(kvt_gpu_region_groups(NULL, NULL, 0, NULL), 0);
	kemu_get_launch_info(&li);
	assert_int_equal(li.launches, launches);
	free(table);
	free(want);
	free(at);
	free(val);
	free(perm);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gather_invalid), cmocka_unit_test(test_gather_single),
		cmocka_unit_test(test_gather_batches), cmocka_unit_test(test_gather_recall),
		cmocka_unit_test(test_groups),
	};

	return cmocka_run_group_tests_name("region-gather-emu", tests, NULL, NULL);
}
