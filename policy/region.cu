/* SPDX-License-Identifier: MIT */
/*
 * Recall regions on the GPU (gpu.h): kvt_gpu_region_recall runs kvt_region_recall
 * (policy/region.c) on a batch of regions, one CTA per region, with the reference's decisions;
 * grow, drop, empty and clear are the reference's too, and keep the caller's free-frame stack
 * and stale flag as the manager does (manager/recall.c). The device keeps no order list: the
 * victim order is ascending (stamp, rank), a pair unique to each slot (an empty slot has stamp
 * 0 and rank = its index), which is the order the reference's list keeps.
 *
 * A call, in phases separated by __syncthreads():
 *  A. Lookups, a warp per kv head (keys of different heads never meet), 32 entries of the
 *     head's selection at a time in selection order. An entry repeating an earlier one of its
 *     32 is found by __match_any_sync; one repeating an earlier group finds the key marked by
 *     it (pending, or a slot stamped by this call), as in the reference. Hits and reloads stamp
 *     their slots; misses mark their keys pending. The lookups are compacted into the head's
 *     view (ballots) in lookup order, tagged hit, reload or miss (with its j).
 *  S. Per-head counts scanned by warp 0: each head's first load, miss and reload index; the
 *     call's totals; -ENOSPC when the misses outnumber the slots this call did not use.
 *  W. The working set (when kept and the call has lookups): the window moves to step N (its
 *     buckets cleared in parallel), then every lookup touches its key. All touches are at step
 *     N and their keys distinct, so they commute: a key's previous bucket is decremented with
 *     an atomic, the increments of bucket N are counted in shared memory and added once.
 *  B. Each head's view again, a warp per head: the loads are written at their final positions
 *     (reloads complete; a miss with its miss index and rank, its slot to come), a miss's view
 *     entry names its load. Under -ENOSPC instead: the misses' pending marks are undone, the
 *     views compacted without them and only the reloads listed.
 *  V. Victims, in rounds of up to RG_VICTIM_ROUND misses: the round's count of smallest (stamp,
 *     rank) keys among the slots the call has not used is found by a radix select (8-bit
 *     digits, a shared histogram per digit), those slots ranked among themselves by counting,
 *     and miss lo + i takes the i-th. A victim's old key is forgotten, its slot filled (stamp
 *     c: it is used from then on, so the next round selects among the rest).
 *  C. The views of misses get their slots; thread 0 writes the tally, clock, load count and
 *     result.
 * Distinct victims and distinct keys mean the writes of phases A, B and V never collide.
 */
#include <errno.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "gpu.h"
#include "shared.cuh"
#include "region.h"

#define RG_THREADS 256
#define RG_WARPS (RG_THREADS / 32)
#define FULL 0xffffffffu
#define MAXH KVT_GPU_REGION_MAX_HEADS

/* Misses whose victims one round of phase V finds (shared arrays of this many); the emulator's
   build sets a small one so that its tests run several rounds. */
#ifndef RG_VICTIM_ROUND
#define RG_VICTIM_ROUND 1024
#endif

/* Tags of the view entries between phases A and C. */
#define V_MISS KVT_REGION_VIEW_MISS /* | j (phase A), | its load index (phase B) */
#define V_RELOAD 0x40000000u	    /* | slot */
/* load.slot of a miss between phases B and V: | its miss index. */
#define L_MISS 0x80000000u

struct rg_smem {
	uint32_t n_hit[MAXH], n_rel[MAXH], n_miss[MAXH];
	uint32_t b_load[MAXH], b_miss[MAXH], b_rel[MAXH]; /* first index of each head's */
	uint32_t hist[256];
	unsigned long long ckey[RG_VICTIM_ROUND]; /* the round's victims: (stamp, rank) */
	uint16_t cslot[RG_VICTIM_ROUND], vict[RG_VICTIM_ROUND];
	uint32_t bad[RG_WARPS];
	uint32_t c, status;
	uint32_t lookups, hits, reloads, misses;
	uint32_t bin, below, ncand;
	uint32_t ws_cleared, ws_inc, ws_dec, evictions;
};

static __device__ __forceinline__ uint32_t rg_min(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* The victim order: a slot's (stamp, rank). */
static __device__ __forceinline__ unsigned long long slot_order(const struct kvt_region_slot *s)
{
	return (unsigned long long)s->stamp << 32 | s->rank;
}

/* Tokens of block b in a layer of N tokens (b below its block count). */
static __device__ __forceinline__ uint32_t block_tokens(uint32_t N, uint32_t lbt, uint32_t b)
{
	uint32_t bt = 1u << lbt, left = N - (b << lbt);

	return left < bt ? left : bt;
}

/* The working set after its move to a step: the reference's in_window and bucket_of. */
struct rg_window {
	uint32_t step, cur, w;
};

static __device__ __forceinline__ bool in_window(struct rg_window win, uint32_t x)
{
	return x <= win.step && win.step - x < win.w;
}

static __device__ __forceinline__ uint32_t bucket_of(struct rg_window win, uint32_t x)
{
	uint32_t d = win.step - x;

	return win.cur >= d ? win.cur - d : win.cur + win.w - d;
}

/* The contract of kvt_region_recall, checked before anything changes: 0 or -EINVAL. Every
   thread checks part of the selection; the CTA's verdict is in sm->status afterwards. Returns
   whether the region's scalars are within it (so that a -EINVAL is the selection's). Contains
   __syncthreads(). */
static __device__ bool check_call(const struct kvt_gpu_region *R, uint32_t n_slots,
				  struct rg_smem *sm)
{
	const uint32_t tid = threadIdx.x, lane = tid % 32, H = R->n_heads;
	const uint64_t hr = (uint64_t)H * R->r;
	const bool scalars =
		!(H > MAXH || n_slots > KVT_REGION_MAX_SLOTS || R->lbt >= 32 || hr > UINT32_MAX ||
		  (uint64_t)R->cap_blocks * H > UINT32_MAX || R->ring0 < R->sink);
	bool bad = false;

	if (!scalars) {
		bad = true;
	} else {
		/* blocks of the layer: ceil(N / bt) */
		uint64_t nb = ((uint64_t)R->n_tokens + (1ull << R->lbt) - 1) >> R->lbt;

		for (uint64_t x = tid; x < hr; x += RG_THREADS) {
			uint32_t b = R->sel[x];

			if (b != KVT_REGION_NONE && (b >= R->cap_blocks || b >= nb))
				bad = true;
		}
	}
	bad = __ballot_sync(FULL, bad) != 0;
	if (lane == 0)
		sm->bad[tid / 32] = bad;
	__syncthreads();
	if (tid == 0) {
		uint32_t any = 0;

		for (uint32_t w = 0; w < RG_WARPS; w++)
			any |= sm->bad[w];
		if (sm->status == 0 && any)
			sm->status = (uint32_t)-EINVAL;
	}
	return scalars;
}

/* The group-table entries a recall launch writes besides its regions' decisions
   (kvt_gpu_region_recall_groups): its threads share them out; no region reads them. */
static __device__ void recall_groups(const uint64_t *at, const uint64_t *val, uint32_t n)
{
	for (uint64_t i = (uint64_t)blockIdx.x * RG_THREADS + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * RG_THREADS)
		*(uint64_t *)(uintptr_t)at[i] = val[i];
}

static __global__ void __launch_bounds__(RG_THREADS)
	region_recall_kernel(const struct kvt_gpu_region *rgs, const uint64_t *g_at,
			     const uint64_t *g_val, uint32_t n_groups)
{
	__shared__ struct rg_smem sm;
	const struct kvt_gpu_region *R = &rgs[blockIdx.x];
	const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
	const uint32_t H = R->n_heads, r = R->r, N = R->n_tokens, lbt = R->lbt;
	const uint32_t n_slots = *R->n_slots;
	struct kvt_ws *const ws = R->ws && R->ws->bucket && R->ws->w ? R->ws : nullptr;
	struct kvt_region_slot *slot = R->slot;
	struct kvt_region_key *key = R->key;
	const uint32_t *sel = R->sel;
	uint32_t *view = R->view;
	struct kvt_region_load *load = R->load;
	uint32_t c, status, lookups, hits, reloads, misses, nl;
	bool enospc, scalars;

	recall_groups(g_at, g_val, n_groups); /* (before any CTA returns) */

	if (tid == 0) {
		uint32_t clock = *R->clock;

		sm.status = clock == UINT32_MAX ? (uint32_t)-EOVERFLOW : 0;
		sm.c = clock + 1;
		sm.ws_cleared = sm.ws_inc = sm.ws_dec = sm.evictions = 0;
	}
	scalars = check_call(R, n_slots, &sm); /* its barrier also publishes the above */
	__syncthreads();
	status = sm.status;
	c = sm.c;
	if (status) {
		if (tid == 0) {
			*R->n_load = 0;
			*R->err = (int32_t)status;
		}
		/* a selection naming a block past the layer: the view is emptied too */
		if (status == (uint32_t)-EINVAL && scalars)
			for (uint32_t h = tid; h < H; h += RG_THREADS)
				R->view_n[h] = 0;
		return; /* the whole CTA */
	}

	/* A. Lookups: a warp per head, 32 entries at a time in selection order. */
	for (uint32_t h = warp; h < H; h += RG_WARPS) {
		const uint32_t *hs = sel + (size_t)h * r;
		uint32_t *hv = view + (size_t)h * r;
		uint32_t vn = 0, nh = 0, nr = 0, nm = 0;

		for (uint32_t j0 = 0; j0 < r; j0 += 32) {
			uint32_t j = j0 + lane, b = j < r ? hs[j] : KVT_REGION_NONE, nv = 0;
			uint32_t tag = 0, cls = 0, same, look;
			bool cand = false;

			if (b != KVT_REGION_NONE) {
				nv = block_tokens(N, lbt, b);
				cand = !dev_resident(key, H, lbt, R->sink, R->ring0, h, b, nv);
			}
			/* the same block earlier in these 32: a repeat */
			same = __match_any_sync(FULL, cand ? b : KVT_REGION_NONE);
			if (cand && (same & lanes_below(lane)))
				cand = false;
			if (cand) {
				uint32_t k = b * H + h;
				uint16_t ks = key[k].slot;

				if (ks == KVT_REGION_PENDING) {
					/* a repeated miss */
				} else if (ks) {
					uint32_t i = ks - 1u;
					struct kvt_region_slot *s = &slot[i];

					if (s->stamp != c) { /* else a repeated hit */
						s->stamp = c;
						s->rank = h * r + j;
						if (s->n_valid != nv) { /* grew: reload */
							s->n_valid = nv;
							cls = 2;
							tag = V_RELOAD | i;
						} else {
							cls = 1;
							tag = i;
						}
					}
				} else {
					key[k].slot = KVT_REGION_PENDING;
					cls = 3;
					tag = V_MISS | j;
				}
			}
			look = __ballot_sync(FULL, cls != 0);
			if (cls)
				hv[vn + __popc(look & lanes_below(lane))] = tag;
			vn += __popc(look);
			nh += __popc(__ballot_sync(FULL, cls == 1));
			nr += __popc(__ballot_sync(FULL, cls == 2));
			nm += __popc(__ballot_sync(FULL, cls == 3));
			__syncwarp(); /* the marks above, before the next 32 read them */
		}
		if (lane == 0) {
			sm.n_hit[h] = nh;
			sm.n_rel[h] = nr;
			sm.n_miss[h] = nm;
		}
	}
	__syncthreads();

	/* S. Each head's first load, miss and reload index; the totals. */
	if (warp == 0) {
		uint32_t cl = 0, cm = 0, cr = 0, ch = 0;

		for (uint32_t h0 = 0; h0 < H; h0 += 32) {
			uint32_t h = h0 + lane, nh = 0, nr = 0, nm = 0, il, im, ir, ih;

			if (h < H) {
				nh = sm.n_hit[h];
				nr = sm.n_rel[h];
				nm = sm.n_miss[h];
			}
			il = warp_scan(nr + nm, lane);
			im = warp_scan(nm, lane);
			ir = warp_scan(nr, lane);
			ih = warp_scan(nh, lane);
			if (h < H) {
				sm.b_load[h] = cl + il - (nr + nm);
				sm.b_miss[h] = cm + im - nm;
				sm.b_rel[h] = cr + ir - nr;
			}
			cl += __shfl_sync(FULL, il, 31);
			cm += __shfl_sync(FULL, im, 31);
			cr += __shfl_sync(FULL, ir, 31);
			ch += __shfl_sync(FULL, ih, 31);
		}
		if (lane == 0) {
			sm.hits = ch;
			sm.reloads = cr;
			sm.misses = cm;
			sm.lookups = ch + cr + cm;
		}
	}
	__syncthreads();
	hits = sm.hits;
	reloads = sm.reloads;
	misses = sm.misses;
	lookups = sm.lookups;
	nl = reloads + misses;
	/* every slot not used by this call is a victim candidate */
	enospc = misses > n_slots - (hits + reloads);

	/* W. The working set: to step N, then a touch per lookup (the misses an -ENOSPC drops
	   included, as in the reference). */
	if (ws && lookups) {
		uint32_t *bucket = ws->bucket;
		struct rg_window win = {ws->step, ws->cur, ws->w};
		uint32_t cleared = 0, inc = 0, dec = 0;

		if (N > win.step) {
			uint32_t d = rg_min(N - win.step, win.w);

			for (uint64_t i = 1 + tid; i <= d; i += RG_THREADS) {
				uint32_t at = (uint32_t)((win.cur + i) % win.w);

				cleared += bucket[at];
				bucket[at] = 0;
			}
			win.cur = (uint32_t)(((uint64_t)win.cur + (N - win.step)) % win.w);
			win.step = N;
		}
		if (cleared)
			atomicAdd(&sm.ws_cleared, cleared);
		/* every thread has read the window, and the buckets are cleared before a touch
		   decrements one (a key touched at a step past a restarted window's) */
		__syncthreads();
		for (uint32_t x = tid; x < H * r; x += RG_THREADS) {
			uint32_t h = x / r, i = x % r, tag, k, *tp;

			if (i >= sm.n_hit[h] + sm.n_rel[h] + sm.n_miss[h])
				continue;
			tag = view[x];
			if (tag & V_MISS)
				k = sel[(size_t)h * r + (tag & ~V_MISS)] * H + h;
			else
				k = slot[tag & ~V_RELOAD].key;
			tp = &key[k].touched;
			if (*tp) {
				uint32_t p = *tp - 1;

				if (p >= N)
					continue; /* counted at this step or a later one */
				if (in_window(win, p)) {
					atomicSub(&bucket[bucket_of(win, p)], 1u);
					dec++;
				}
			}
			*tp = N + 1;
			inc += in_window(win, N);
		}
		if (inc)
			atomicAdd(&sm.ws_inc, inc);
		if (dec)
			atomicAdd(&sm.ws_dec, dec);
		__syncthreads();
		if (tid == 0) {
			if (sm.ws_inc)
				bucket[bucket_of(win, N)] += sm.ws_inc;
			ws->total = ws->total - sm.ws_cleared - sm.ws_dec + sm.ws_inc;
			ws->step = win.step;
			ws->cur = win.cur;
		}
	}

	/* B. The loads at their final positions; under -ENOSPC the misses dropped instead. */
	for (uint32_t h = warp; h < H; h += RG_WARPS) {
		const uint32_t *hs = sel + (size_t)h * r;
		uint32_t *hv = view + (size_t)h * r;
		const uint32_t nh = sm.n_hit[h], nr = sm.n_rel[h], vn = nh + nr + sm.n_miss[h];
		uint32_t lpos = enospc ? sm.b_rel[h] : sm.b_load[h], mpos = sm.b_miss[h], vpos = 0;

		for (uint32_t i0 = 0; i0 < vn; i0 += 32) {
			uint32_t i = i0 + lane, tag = i < vn ? hv[i] : 0, cls = 0, ld, mi;

			if (i < vn)
				cls = (tag & V_MISS) ? 3 : (tag & V_RELOAD) ? 2 : 1;
			__syncwarp(); /* the 32 tags read before any is rewritten */
			if (!enospc) {
				ld = __ballot_sync(FULL, cls >= 2);
				mi = __ballot_sync(FULL, cls == 3);
				uint32_t x = lpos + __popc(ld & lanes_below(lane));

				if (cls == 2) {
					uint32_t si = tag & ~V_RELOAD;
					const struct kvt_region_slot *s = &slot[si];

					load[x] = kvt_region_load{si, s->key, s->key, s->n_valid};
					hv[i] = si;
				} else if (cls == 3) {
					uint32_t j = tag & ~V_MISS, b = hs[j];

					load[x] = kvt_region_load{
						L_MISS | (mpos + __popc(mi & lanes_below(lane))),
						b * H + h, h * r + j, block_tokens(N, lbt, b)};
					hv[i] = V_MISS | x;
				}
				lpos += __popc(ld);
				mpos += __popc(mi);
			} else {
				uint32_t keep = __ballot_sync(FULL, cls == 1 || cls == 2);

				ld = __ballot_sync(FULL, cls == 2);
				if (cls == 3)
					key[hs[tag & ~V_MISS] * H + h].slot = 0;
				else if (cls)
					hv[vpos + __popc(keep & lanes_below(lane))] =
						tag & ~V_RELOAD;
				if (cls == 2) {
					uint32_t si = tag & ~V_RELOAD;
					const struct kvt_region_slot *s = &slot[si];

					load[lpos + __popc(ld & lanes_below(lane))] =
						kvt_region_load{si, s->key, s->key, s->n_valid};
				}
				vpos += __popc(keep);
				lpos += __popc(ld);
			}
		}
		if (lane == 0)
			R->view_n[h] = enospc ? nh + nr : vn;
	}

	/* V. Victims, RG_VICTIM_ROUND misses at a time. Phase B's loads are read after the
	   round's first barrier. */
	for (uint32_t lo = 0; !enospc && lo < misses; lo += RG_VICTIM_ROUND) {
		const uint32_t cnt = rg_min(RG_VICTIM_ROUND, misses - lo);
		unsigned long long want_key = 0;
		uint32_t want = cnt; /* the cnt-th smallest among the unused slots */
		uint32_t ev = 0;

		for (int shift = 56; shift >= 0; shift -= 8) {
			for (uint32_t b = tid; b < 256; b += RG_THREADS)
				sm.hist[b] = 0;
			if (tid == 0)
				sm.ncand = 0;
			__syncthreads();
			for (uint32_t s = tid; s < n_slots; s += RG_THREADS) {
				unsigned long long o;

				if (slot[s].stamp == c)
					continue; /* used by this call */
				o = slot_order(&slot[s]);
				if (shift == 56 || (o >> (shift + 8)) == (want_key >> (shift + 8)))
					atomicAdd(&sm.hist[(o >> shift) & 255], 1u);
			}
			__syncthreads();
			if (warp == 0) /* the digit's bin holding the want-th */
				warp_hist_find(sm.hist, want, lane, &sm.bin, &sm.below);
			__syncthreads();
			want_key |= (unsigned long long)sm.bin << shift;
			want -= sm.below;
		}
		/* the round's victims: the unused slots up to want_key, exactly cnt */
		for (uint32_t s = tid; s < n_slots; s += RG_THREADS) {
			unsigned long long o = slot_order(&slot[s]);

			if (slot[s].stamp != c && o <= want_key) {
				uint32_t at = atomicAdd(&sm.ncand, 1u);

				if (at < RG_VICTIM_ROUND) { /* always: the orders are distinct */
					sm.ckey[at] = o;
					sm.cslot[at] = (uint16_t)s;
				}
			}
		}
		__syncthreads();
		for (uint32_t x = tid; x < cnt; x += RG_THREADS) {
			uint32_t rank = 0;

			for (uint32_t y = 0; y < cnt; y++)
				rank += sm.ckey[y] < sm.ckey[x];
			sm.vict[rank] = sm.cslot[x];
		}
		__syncthreads();
		for (uint32_t x = tid; x < nl; x += RG_THREADS) {
			struct kvt_region_load ld = load[x];
			struct kvt_region_slot *s;
			uint32_t m = ld.slot & ~L_MISS, v, old;

			if (!(ld.slot & L_MISS) || m < lo || m - lo >= cnt)
				continue;
			v = sm.vict[m - lo];
			s = &slot[v];
			old = s->key;
			if (old != KVT_REGION_NONE) {
				key[old].slot = 0;
				ev++;
			}
			*s = kvt_region_slot{ld.key, ld.n_valid, c, ld.old};
			key[ld.key].slot = (uint16_t)(v + 1);
			load[x].slot = v;
			load[x].old = old;
		}
		if (ev)
			atomicAdd(&sm.evictions, ev);
		__syncthreads(); /* the slots taken, before the next round looks */
	}

	/* C. The misses' views; the call's results. */
	if (!enospc && misses) {
		for (uint32_t x = tid; x < H * r; x += RG_THREADS) {
			uint32_t h = x / r;

			if (x % r < sm.n_hit[h] + sm.n_rel[h] + sm.n_miss[h] && (view[x] & V_MISS))
				view[x] = load[view[x] & ~V_MISS].slot;
		}
	}
	if (tid == 0) {
		struct kvt_region_tally *t = R->tally;

		if (hits)
			atomicAdd(&t->hits, hits);
		if (lookups - (enospc ? misses : 0))
			atomicAdd(&t->lookups, lookups - (enospc ? misses : 0));
		if (enospc ? reloads : nl)
			atomicAdd(&t->loads, enospc ? reloads : nl);
		if (sm.evictions)
			atomicAdd(&t->evictions, sm.evictions);
		*R->clock = c;
		*R->n_load = enospc ? reloads : nl;
		*R->err = enospc ? -ENOSPC : 0;
	}
}

/* Words of the drop's bitmap of the slots a view names: one bit per possible slot. */
#define RG_NAMED_WORDS ((KVT_REGION_MAX_SLOTS + 31) / 32)

/* Bit s of the first nw words of bits (0 past them). */
static __device__ __forceinline__ bool named(const uint32_t *bits, uint32_t nw, uint32_t s)
{
	return s / 32 < nw && (bits[s / 32] >> s % 32 & 1);
}

/* Forgets slot i's key and empties it (the reference's forget); false if it held none. */
static __device__ __forceinline__ bool forget(const struct kvt_gpu_region *R, uint32_t i)
{
	struct kvt_region_slot *s = &R->slot[i];
	uint32_t k = s->key;

	if (k != KVT_REGION_NONE)
		R->key[k].slot = 0;
	*s = kvt_region_slot{KVT_REGION_NONE, 0, 0, i};
	return k != KVT_REGION_NONE;
}

/* Grow of region blockIdx.x to n_new[blockIdx.x] slots: the reference's kvt_region_grow without
   the order list, whose place for the new slots (after the empty ones, in index order) is their
   (stamp, rank) = (0, index). With a stack, new slot old + t takes the frame t places below
   the region's top, in_off[blockIdx.x]: the manager's region_grow pops free[--n_free] for
   slots old, old + 1, ... in turn. The stack is read only where the region grows and keeps
   frames. */
static __global__ void __launch_bounds__(RG_THREADS)
	region_grow_kernel(const struct kvt_gpu_region *rgs, const uint32_t *n_new,
			   const uint32_t *stack, const uint32_t *in_off)
{
	const struct kvt_gpu_region *R = &rgs[blockIdx.x];
	const uint32_t old = *R->n_slots, n = rg_min(n_new[blockIdx.x], KVT_REGION_MAX_SLOTS);
	const bool pop = stack && R->frame && n > old;
	const uint32_t top = pop ? in_off[blockIdx.x] : 0;

	for (uint32_t i = old + threadIdx.x; i < n; i += RG_THREADS) {
		R->slot[i] = kvt_region_slot{KVT_REGION_NONE, 0, 0, i};
		if (pop)
			R->frame[i] = stack[top - 1 - (i - old)];
	}
	__syncthreads(); /* every thread has read the old count */
	if (threadIdx.x == 0 && n > old)
		*R->n_slots = n;
}

/* k[blockIdx.x] drops of region blockIdx.x, one after the other as the reference's
   kvt_region_drop: each finds the slot of least (stamp, rank), which heads the reference's
   order list (the orders are distinct: an empty slot's is (0, index), a used slot's rank is
   unique in its call), by an argmin over the slots, then thread 0 drops it and moves the last
   slot into its index. A moved slot holding a key keeps its (stamp, rank), as it keeps its
   place in the reference's list; an empty one takes its new index as rank, as the reference
   re-inserts it among the empty ones.
   With a stale flag, the slots the view names (below the count: no other is dropped or moved)
   are first marked in a shared bitmap, so each drop tests its dropped and its last slot in
   O(1): the manager's region_shrink with mark, the view naming the dropped or the last slot. */
static __global__ void __launch_bounds__(RG_THREADS)
	region_drop_kernel(const struct kvt_gpu_region *rgs, const uint32_t *k,
			   const uint32_t *out_off, uint32_t *dropped, uint32_t *freed,
			   uint32_t *gone)
{
	__shared__ unsigned long long sm_order[RG_WARPS];
	__shared__ uint32_t sm_at[RG_WARPS];
	__shared__ uint32_t sm_named[RG_NAMED_WORDS]; /* bit s: the view names slot s */
	const struct kvt_gpu_region *R = &rgs[blockIdx.x];
	const uint32_t tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
	struct kvt_region_slot *slot = R->slot;
	uint32_t n = *R->n_slots, cnt = rg_min(k[blockIdx.x], n), n_gone = 0;
	const uint32_t off = dropped || freed ? out_off[blockIdx.x] : 0;
	const bool check = R->stale && cnt; /* the same in every thread: barriers below */
	const uint32_t nw = check ? rg_min((n + 31) / 32, RG_NAMED_WORDS) : 0;
	bool stale = false;

	if (check) {
		const uint32_t H = R->n_heads, r = R->r;

		for (uint32_t w = tid; w < nw; w += RG_THREADS)
			sm_named[w] = 0;
		__syncthreads();
		for (uint32_t h = warp; h < H; h += RG_WARPS) {
			const uint32_t *hv = R->view + (size_t)h * r, vn = rg_min(R->view_n[h], r);

			for (uint32_t x = lane; x < vn; x += 32) {
				uint32_t s = hv[x];

				if (s < n && s / 32 < nw) /* else never dropped nor moved */
					atomicOr(&sm_named[s / 32], 1u << s % 32);
			}
		}
		/* the first drop's barrier publishes the bits before thread 0 reads them */
	}
	for (uint32_t t = 0; t < cnt; t++, n--) {
		unsigned long long best = ~0ull, mine; /* above every slot's order */
		uint32_t at = 0;

		for (uint32_t s = tid; s < n; s += RG_THREADS) {
			unsigned long long o = slot_order(&slot[s]);

			if (o < best) {
				best = o;
				at = s;
			}
		}
		mine = best;
		for (uint32_t d = 16; d; d /= 2) {
			unsigned long long o = __shfl_xor_sync(FULL, best, d);

			best = o < best ? o : best;
		}
		if (lane == 0)
			sm_order[warp] = best;
		if (mine == best && best != ~0ull) /* the one lane holding it: orders differ */
			sm_at[warp] = at;
		__syncthreads();
		if (tid == 0) {
			uint32_t i, j = n - 1, fr;

			best = sm_order[0];
			at = sm_at[0];
			for (uint32_t w = 1; w < RG_WARPS; w++)
				if (sm_order[w] < best) {
					best = sm_order[w];
					at = sm_at[w];
				}
			i = at;
			if (named(sm_named, nw, i) || named(sm_named, nw, j))
				stale = true;
			fr = R->frame ? R->frame[i] : i;
			n_gone += forget(R, i);
			if (j != i) { /* the last slot moves into i */
				struct kvt_region_slot m = slot[j];

				if (m.key != KVT_REGION_NONE)
					R->key[m.key].slot = (uint16_t)(i + 1);
				else
					m.rank = i;
				slot[i] = m;
				if (R->frame)
					R->frame[i] = R->frame[j];
			}
			if (dropped)
				dropped[off + t] = i;
			if (freed)
				freed[off + t] = fr;
		}
		__syncthreads(); /* the slots moved, before the next drop reads them */
	}
	if (tid == 0) {
		if (cnt) /* after the loop's barriers: every thread has read the old count */
			*R->n_slots = n;
		if (gone)
			gone[blockIdx.x] = n_gone;
		if (stale)
			*R->stale = 1;
	}
}

/* Clear of region blockIdx.x: every slot emptied, none left; with freed, slot i's frame (i
   without frames) at freed[out_off[blockIdx.x] + i], as the manager pushes them in index
   order. */
static __global__ void __launch_bounds__(RG_THREADS)
	region_clear_kernel(const struct kvt_gpu_region *rgs, uint32_t *gone,
			    const uint32_t *out_off, uint32_t *freed)
{
	__shared__ uint32_t sm_gone;
	const struct kvt_gpu_region *R = &rgs[blockIdx.x];
	const uint32_t n = *R->n_slots;
	uint32_t *const out = freed ? freed + out_off[blockIdx.x] : nullptr;
	uint32_t cnt = 0;

	if (threadIdx.x == 0)
		sm_gone = 0;
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < n; i += RG_THREADS) {
		if (out)
			out[i] = R->frame ? R->frame[i] : i;
		cnt += forget(R, i);
	}
	if (cnt)
		atomicAdd(&sm_gone, cnt);
	__syncthreads(); /* the counts added, and every thread has read the old count */
	if (threadIdx.x == 0) {
		*R->n_slots = 0;
		if (gone)
			gone[blockIdx.x] = sm_gone;
	}
}

/* Empties of pairs [n][2], a thread each. Copies of a pair race for the slot's key: the one
   whose exchange takes it forgets it; they all write the same empty slot. */
static __global__ void __launch_bounds__(RG_THREADS)
	region_empty_kernel(const struct kvt_gpu_region *rgs, uint32_t n_regions,
			    const uint32_t *pairs, uint32_t *had, uint32_t n)
{
	uint32_t x = blockIdx.x * RG_THREADS + threadIdx.x, ri, i, k = KVT_REGION_NONE;

	if (x >= n)
		return;
	ri = pairs[2 * x];
	i = pairs[2 * x + 1];
	if (ri < n_regions && i < *rgs[ri].n_slots) {
		const struct kvt_gpu_region *R = &rgs[ri];
		struct kvt_region_slot *s = &R->slot[i];

		k = atomicExch(&s->key, KVT_REGION_NONE);
		if (k != KVT_REGION_NONE)
			R->key[k].slot = 0;
		s->n_valid = 0;
		s->stamp = 0;
		s->rank = i;
	}
	if (had)
		had[x] = k != KVT_REGION_NONE;
}

extern "C" int kvt_gpu_region_recall_groups(const struct kvt_gpu_region *rg, uint32_t n,
					    const uint64_t *at, const uint64_t *val,
					    uint32_t n_groups, void *stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!rg || n > 0x7fffffffu || (n_groups && (!at || !val)) || n_groups > 0x7fffffffu)
		return cudaErrorInvalidValue;
	region_recall_kernel<<<n, RG_THREADS, 0, (cudaStream_t)stream>>>(rg, at, val, n_groups);
	return cudaGetLastError();
}

extern "C" int kvt_gpu_region_recall(const struct kvt_gpu_region *rg, uint32_t n, void *stream)
{
	return kvt_gpu_region_recall_groups(rg, n, nullptr, nullptr, 0, stream);
}

extern "C" int kvt_gpu_region_grow(const struct kvt_gpu_region *rg, const uint32_t *n_new,
				   const uint32_t *stack, const uint32_t *in_off, uint32_t n,
				   void *stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!rg || !n_new || n > 0x7fffffffu || !stack != !in_off)
		return cudaErrorInvalidValue;
	region_grow_kernel<<<n, RG_THREADS, 0, (cudaStream_t)stream>>>(rg, n_new, stack, in_off);
	return cudaGetLastError();
}

extern "C" int kvt_gpu_region_drop(const struct kvt_gpu_region *rg, const uint32_t *k,
				   const uint32_t *out_off, uint32_t *dropped, uint32_t *freed,
				   uint32_t *gone, uint32_t n, void *stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!rg || !k || ((dropped || freed) && !out_off) || n > 0x7fffffffu)
		return cudaErrorInvalidValue;
	region_drop_kernel<<<n, RG_THREADS, 0, (cudaStream_t)stream>>>(rg, k, out_off, dropped,
								       freed, gone);
	return cudaGetLastError();
}

extern "C" int kvt_gpu_region_clear(const struct kvt_gpu_region *rg, uint32_t *gone,
				    const uint32_t *out_off, uint32_t *freed, uint32_t n,
				    void *stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!rg || n > 0x7fffffffu || !out_off != !freed)
		return cudaErrorInvalidValue;
	region_clear_kernel<<<n, RG_THREADS, 0, (cudaStream_t)stream>>>(rg, gone, out_off, freed);
	return cudaGetLastError();
}

extern "C" int kvt_gpu_region_empty(const struct kvt_gpu_region *rg, uint32_t n_regions,
				    const uint32_t *pairs, uint32_t *had, uint32_t n, void *stream)
{
	if (n == 0)
		return cudaSuccess;
	if (!rg || !pairs)
		return cudaErrorInvalidValue;
	region_empty_kernel<<<(n + RG_THREADS - 1) / RG_THREADS, RG_THREADS, 0,
			      (cudaStream_t)stream>>>(rg, n_regions, pairs, had, n);
	return cudaGetLastError();
}
