/* SPDX-License-Identifier: MIT */
/*
 * CPU stand-ins for the recall-region kernels (policy/region.cu; the contract is policy/gpu.h,
 * "recall regions"), linked into the emulated plugin beside fake_kernels.c, whose conventions
 * they keep: the GPU version's argument checks and cudaError_t results at the call, the work
 * handed to the fake runtime (fake_cuda_launch) and run over host views of device memory, every
 * range bounds-checked, and the writes of one launch checked not to overlap each other or its
 * reads (so regions of one launch sharing state, which gpu.h forbids, stop the process).
 *
 * The work is the CPU reference (policy/region.c) on each descriptor's device state. The device
 * keeps no order list, so each call builds one: a struct kvt_region over the device's slot and
 * key arrays with a scratch link array in ascending (stamp, rank) order (an empty slot has
 * stamp 0 and rank = its index) and the empty_end hint set, the order region.cu's kernels find
 * by argmin and radix select. A state that order cannot represent (two slots with one (stamp,
 * rank), an empty slot with a key or another rank) is a bug of the code under test: the fake
 * dies. So do the broken preconditions a GPU would fault on or silently corrupt with: a grow
 * popping more frames than its stack offset holds or without frame[], a view count above r, a
 * gather source or frame base not 16-byte aligned, a slot count above KVT_REGION_MAX_SLOTS
 * outside recall (which answers -EINVAL for it).
 *
 * Grow, drop, empty and clear use slot, key, n_slots and frame only (gpu.h): the key table they
 * may touch is found from the keys the region's slots hold, not from cap_blocks and n_heads.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fake_cudart.h"
#include "gpu.h"
#include "region.h"

#define VIEW(addr, n, what) fake_cuda_kernel_view((uint64_t)(uintptr_t)(addr), (n), (what))
#define END KVT_REGION_PENDING /* the reference's end of the order list */
#define MAX_GRID 0x7fffffffu   /* region.cu's limit on the regions of one launch */

/* ---- footprints ------------------------------------------------------------------------------ */

/* A growing list of the ranges one launch writes or reads. */
struct ranges {
	struct fake_range *r;
	size_t n, cap;
};

static void add(struct ranges *s, const void *addr, uint64_t bytes)
{
	if (!bytes)
		return;
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 16;
		struct fake_range *r = realloc(s->r, cap * sizeof(*r));

		if (!r)
			fake_cuda_die("recall regions: no memory for %zu footprint ranges", cap);
		s->r = r;
		s->cap = cap;
	}
	s->r[s->n++] = (struct fake_range){(uint64_t)(uintptr_t)addr, bytes};
}

/* Checks the launch's footprint and frees the lists. */
static void check(struct ranges *w, struct ranges *r, const char *what)
{
	fake_cuda_check_footprint(w->r, w->n, r->r, r->n, what);
	free(w->r);
	free(r->r);
	*w = *r = (struct ranges){0};
}

/* ---- a reference region over device state ---------------------------------------------------- */

static uint32_t u32_at(const uint32_t *p, const char *what)
{
	return *(const uint32_t *)VIEW(p, sizeof(*p), what);
}

/* *R->n_slots for the calls other than recall, which must find it within the reference's
   limit. */
static uint32_t slots_of(const struct kvt_gpu_region *R, uint32_t i, const char *what)
{
	uint32_t n = u32_at(R->n_slots, what);

	if (n > KVT_REGION_MAX_SLOTS)
		fake_cuda_die("%s: region %u holds %u slots, above KVT_REGION_MAX_SLOTS", what, i,
			      n);
	return n;
}

/* Entries of the key table that slots [0, n) name: 1 + the largest key they hold. */
static uint64_t key_span(const struct kvt_region_slot *slot, uint32_t n)
{
	uint64_t span = 0;

	for (uint32_t s = 0; s < n; s++)
		if (slot[s].key != KVT_REGION_NONE && slot[s].key >= span)
			span = (uint64_t)slot[s].key + 1;
	return span;
}

struct order {
	uint64_t o; /* stamp << 32 | rank */
	uint32_t i;
};

static int cmp_order(const void *a, const void *b)
{
	const struct order *x = a, *y = b;

	return (x->o > y->o) - (x->o < y->o);
}

/* Makes rg the reference's region over the n slots at slot and the key table at key (a host
   view, of cap_blocks blocks of n_heads where the caller knows them), with clock, and an order
   list of link_cap >= n entries (rg->link, malloc'd: the caller frees it) in ascending (stamp,
   rank). Dies on a state that order does not describe. */
static void region_open(struct kvt_region *rg, struct kvt_region_slot *slot,
			struct kvt_region_key *key, uint32_t n, uint32_t clock, uint32_t cap_blocks,
			uint32_t link_cap, const char *what, uint32_t ri)
{
	struct order *ord = malloc((n ? n : 1) * sizeof(*ord));
	uint16_t prev = END;

	*rg = (struct kvt_region){.n_slots = n,
				  .clock = clock,
				  .slot = slot,
				  .key = key,
				  .cap_blocks = cap_blocks,
				  .link = malloc((link_cap ? link_cap : 1) * sizeof(*rg->link)),
				  .head = END,
				  .tail = END,
				  .empty_end = END};
	if (!ord || !rg->link)
		fake_cuda_die("%s: no memory for the order of %u slots", what, link_cap);
	for (uint32_t s = 0; s < n; s++) {
		if (slot[s].stamp == 0 && (slot[s].key != KVT_REGION_NONE || slot[s].rank != s))
			fake_cuda_die("%s: region %u: slot %u has stamp 0 (empty) but key %#x, "
				      "rank %u",
				      what, ri, s, slot[s].key, slot[s].rank);
		ord[s] = (struct order){(uint64_t)slot[s].stamp << 32 | slot[s].rank, s};
	}
	qsort(ord, n, sizeof(*ord), cmp_order);
	for (uint32_t x = 0; x < n; x++) {
		uint16_t i = (uint16_t)ord[x].i;

		if (x && ord[x].o == ord[x - 1].o)
			fake_cuda_die(
				"%s: region %u: slots %u and %u share (stamp, rank) = (%u, %u)",
				what, ri, ord[x - 1].i, i, slot[i].stamp, slot[i].rank);
		rg->link[i] =
			(struct kvt_region_link){prev, x + 1 < n ? (uint16_t)ord[x + 1].i : END};
		if (slot[i].stamp == 0)
			rg->empty_end = (uint16_t)(i + 1); /* the empty ones lead */
		prev = i;
	}
	if (n) {
		rg->head = (uint16_t)ord[0].i;
		rg->tail = prev;
	}
	free(ord);
}

/* The region's slots [0, n) and the key table entries they name, as host views. */
static void state_views(const struct kvt_gpu_region *R, uint32_t n, struct kvt_region_slot **slot,
			struct kvt_region_key **key, const char *what)
{
	*slot = VIEW(R->slot, (size_t)n * sizeof(**slot), what);
	*key = VIEW(R->key, key_span(*slot, n) * sizeof(**key), what);
}

/* ---- group-table entries (kvt_gpu_region_groups, kvt_gpu_region_recall_groups) ----------- */

/* Views n entries *at[i] = val[i] of a launch and adds them to its footprint: the arrays read,
   each entry's 8 bytes written (two entries at one address collide at check()). Returns the
   host view of at (val's in *val_view); dies on an entry not 8-byte aligned. */
static const uint64_t *groups_open(const uint64_t *at_dev, const uint64_t *val_dev, uint32_t n,
				   struct ranges *w, struct ranges *r, const char *what,
				   const uint64_t **val_view)
{
	const uint64_t *at = VIEW(at_dev, (size_t)n * sizeof(*at), what);

	*val_view = VIEW(val_dev, (size_t)n * sizeof(**val_view), what);
	add(r, at_dev, (size_t)n * sizeof(*at));
	add(r, val_dev, (size_t)n * sizeof(**val_view));
	for (uint32_t i = 0; i < n; i++) {
		if (at[i] % 8)
			fake_cuda_die("%s: entry %u's address %#llx is not 8-byte aligned", what, i,
				      (unsigned long long)at[i]);
		VIEW(at[i], sizeof(uint64_t), what);
		add(w, (const void *)(uintptr_t)at[i], sizeof(uint64_t));
	}
	return at;
}

/* Writes the entries groups_open viewed (after the launch's check). */
static void groups_write(const uint64_t *at, const uint64_t *val, uint32_t n, const char *what)
{
	for (uint32_t i = 0; i < n; i++)
		*(uint64_t *)VIEW(at[i], sizeof(uint64_t), what) = val[i];
}

/* ---- kvt_gpu_region_recall ------------------------------------------------------------------- */

struct recall_args {
	const struct kvt_gpu_region *rg;
	uint32_t n;
	const uint64_t *g_at, *g_val; /* kvt_gpu_region_recall_groups' entries */
	uint32_t n_groups;
};

/* The kernel's verdict before anything changes (region.cu's check_call): 0, -EOVERFLOW (which
   comes first) or -EINVAL. *sel_read: the selection is read (the scalars passed). */
static int32_t recall_verdict(const struct kvt_gpu_region *R, uint32_t clock, uint32_t n_slots,
			      bool *sel_read)
{
	const uint64_t H = R->n_heads, hr = H * R->r;
	const int32_t over = clock == UINT32_MAX ? -EOVERFLOW : 0;
	const uint32_t *sel;
	uint64_t nb;

	*sel_read = false;
	if (H > KVT_GPU_REGION_MAX_HEADS || n_slots > KVT_REGION_MAX_SLOTS || R->lbt >= 32 ||
	    hr > UINT32_MAX || R->cap_blocks * H > UINT32_MAX || R->ring0 < R->sink)
		return over ? over : -EINVAL;
	*sel_read = true;
	nb = ((uint64_t)R->n_tokens + (1ull << R->lbt) - 1) >> R->lbt;
	sel = VIEW(R->sel, hr * sizeof(*sel), "kvt_gpu_region_recall: selection");
	for (uint64_t x = 0; !over && x < hr; x++)
		if (sel[x] != KVT_REGION_NONE && (sel[x] >= R->cap_blocks || sel[x] >= nb))
			return -EINVAL;
	return over;
}

/* The working set the call keeps (NULL: none), and its buckets. */
static struct kvt_ws *ws_of(const struct kvt_gpu_region *R, uint32_t **bucket)
{
	struct kvt_ws *ws;

	*bucket = NULL;
	if (!R->ws)
		return NULL;
	ws = VIEW(R->ws, sizeof(*ws), "kvt_gpu_region_recall: working set");
	if (!ws->bucket || !ws->w)
		return NULL;
	*bucket = VIEW(ws->bucket, (size_t)ws->w * sizeof(**bucket),
		       "kvt_gpu_region_recall: working set buckets");
	return ws;
}

static void recall_work(void *args)
{
	const struct recall_args *a = args;
	const char *what = "kvt_gpu_region_recall";
	const struct kvt_gpu_region *D = VIEW(a->rg, (size_t)a->n * sizeof(*D), what);
	int32_t *verdict = malloc((size_t)a->n * sizeof(*verdict));
	bool *empty = malloc((size_t)a->n * sizeof(*empty)); /* the view emptied (sel) */
	struct ranges w = {0}, r = {0};
	const uint64_t *g_at = NULL, *g_val = NULL;

	if (!verdict || !empty)
		fake_cuda_die("%s: no memory for %u regions", what, a->n);
	add(&r, a->rg, (size_t)a->n * sizeof(*D));
	/* the group entries first (the kernel's CTAs write them before any decides): writes of
	   the launch too, so one that overlaps a region's table, or another entry, is caught */
	if (a->n_groups)
		g_at = groups_open(a->g_at, a->g_val, a->n_groups, &w, &r, what, &g_val);
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		const size_t hr = (size_t)R->n_heads * R->r;
		uint32_t clock = u32_at(R->clock, what), ns = u32_at(R->n_slots, what), *bucket;
		struct kvt_ws *ws;
		bool sel_read;

		verdict[i] = recall_verdict(R, clock, ns, &sel_read);
		empty[i] = verdict[i] == -EINVAL && sel_read;
		VIEW(R->n_load, sizeof(*R->n_load), what);
		VIEW(R->err, sizeof(*R->err), what);
		add(&w, R->n_load, sizeof(*R->n_load));
		add(&w, R->err, sizeof(*R->err));
		add(&r, R->n_slots, sizeof(*R->n_slots));
		if (sel_read)
			add(&r, R->sel, hr * sizeof(*R->sel));
		if (verdict[i]) {
			add(&r, R->clock, sizeof(*R->clock));
			/* a selection past the layer: the view is emptied */
			if (empty[i]) {
				VIEW(R->view_n, R->n_heads * sizeof(*R->view_n), what);
				add(&w, R->view_n, R->n_heads * sizeof(*R->view_n));
			}
			continue;
		}
		VIEW(R->slot, (size_t)ns * sizeof(*R->slot), what);
		VIEW(R->key, (size_t)R->cap_blocks * R->n_heads * sizeof(*R->key), what);
		VIEW(R->view, hr * sizeof(*R->view), what);
		VIEW(R->view_n, R->n_heads * sizeof(*R->view_n), what);
		VIEW(R->load, hr * sizeof(*R->load), what);
		VIEW(R->tally, sizeof(*R->tally), what);
		add(&w, R->slot, (size_t)ns * sizeof(*R->slot));
		add(&w, R->key, (size_t)R->cap_blocks * R->n_heads * sizeof(*R->key));
		add(&w, R->clock, sizeof(*R->clock));
		add(&w, R->view, hr * sizeof(*R->view));
		add(&w, R->view_n, R->n_heads * sizeof(*R->view_n));
		add(&w, R->load, hr * sizeof(*R->load));
		/* the tally is added to with atomics: regions may share it */
		if ((ws = ws_of(R, &bucket))) {
			add(&w, R->ws, sizeof(*ws));
			add(&w, ws->bucket, (size_t)ws->w * sizeof(*bucket));
		} else if (R->ws) {
			add(&r, R->ws, sizeof(*ws));
		}
	}
	check(&w, &r, what);

	groups_write(g_at, g_val, a->n_groups, what);
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		const size_t hr = (size_t)R->n_heads * R->r;
		const struct kvt_region_geom g = {R->n_heads, R->lbt, R->n_tokens, R->sink,
						  R->ring0};
		uint32_t *clock = VIEW(R->clock, sizeof(*clock), what);
		uint32_t ns = u32_at(R->n_slots, what), *bucket, *n_load;
		struct kvt_region_tally t = {0}, *dt;
		struct kvt_ws *dws, ws;
		struct kvt_region rg;
		int32_t *err;

		n_load = VIEW(R->n_load, sizeof(*n_load), what);
		err = VIEW(R->err, sizeof(*err), what);
		if (verdict[i]) {
			*n_load = 0;
			*err = verdict[i];
			if (empty[i])
				memset(VIEW(R->view_n, R->n_heads * sizeof(*R->view_n), what), 0,
				       R->n_heads * sizeof(*R->view_n));
			continue;
		}
		region_open(
			&rg, VIEW(R->slot, (size_t)ns * sizeof(*rg.slot), what),
			VIEW(R->key, (size_t)R->cap_blocks * R->n_heads * sizeof(*rg.key), what),
			ns, *clock, R->cap_blocks, ns, what, i);
		/* the reference's working set: the device's, its buckets a host view */
		if ((dws = ws_of(R, &bucket))) {
			ws = *dws;
			ws.bucket = bucket;
		}
		*err = kvt_region_recall(
			&rg, &g, VIEW(R->sel, hr * sizeof(uint32_t), what), R->r, dws ? &ws : NULL,
			VIEW(R->view, hr * sizeof(uint32_t), what),
			VIEW(R->view_n, R->n_heads * sizeof(uint32_t), what),
			VIEW(R->load, hr * sizeof(struct kvt_region_load), what), n_load, &t);
		if (dws) {
			dws->step = ws.step;
			dws->cur = ws.cur;
			dws->total = ws.total;
		}
		*clock = rg.clock;
		dt = VIEW(R->tally, sizeof(*dt), what);
		dt->lookups += t.lookups;
		dt->hits += t.hits;
		dt->loads += t.loads;
		dt->evictions += t.evictions;
		free(rg.link);
	}
	free(verdict);
	free(empty);
}

int kvt_gpu_region_recall_groups(const struct kvt_gpu_region *rg, uint32_t n, const uint64_t *at,
				 const uint64_t *val, uint32_t n_groups, void *stream)
{
	struct recall_args a = {rg, n, at, val, n_groups};

	if (n == 0)
		return cudaSuccess;
	if (!rg || n > MAX_GRID || (n_groups && (!at || !val)) || n_groups > 0x7fffffffu)
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_region_recall", recall_work, &a, sizeof(a), NULL,
				0);
}

int kvt_gpu_region_recall(const struct kvt_gpu_region *rg, uint32_t n, void *stream)
{
	return kvt_gpu_region_recall_groups(rg, n, NULL, NULL, 0, stream);
}

/* ---- kvt_gpu_region_grow --------------------------------------------------------------------- */

struct grow_args {
	const struct kvt_gpu_region *rg;
	const uint32_t *n_new, *stack, *in_off;
	uint32_t n;
};

static void grow_work(void *args)
{
	const struct grow_args *a = args;
	const char *what = "kvt_gpu_region_grow";
	const size_t nb = (size_t)a->n * sizeof(uint32_t);
	const struct kvt_gpu_region *D = VIEW(a->rg, (size_t)a->n * sizeof(*D), what);
	const uint32_t *n_new = VIEW(a->n_new, nb, what);
	const uint32_t *in_off = a->stack ? VIEW(a->in_off, nb, what) : NULL;
	struct ranges w = {0}, r = {0};

	add(&r, a->rg, (size_t)a->n * sizeof(*D));
	add(&r, a->n_new, nb);
	if (in_off)
		add(&r, a->in_off, nb);
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t had = slots_of(R, i, what);
		uint32_t want = n_new[i] < KVT_REGION_MAX_SLOTS ? n_new[i] : KVT_REGION_MAX_SLOTS;

		if (want <= had) {
			add(&r, R->n_slots, sizeof(*R->n_slots));
			continue;
		}
		VIEW(R->slot, (size_t)want * sizeof(*R->slot), what);
		add(&w, R->slot, (size_t)want * sizeof(*R->slot));
		add(&w, R->n_slots, sizeof(*R->n_slots));
		if (!a->stack)
			continue;
		if (!R->frame)
			fake_cuda_die("%s: region %u grows with a free-frame stack but keeps no "
				      "frame[]",
				      what, i);
		if (in_off[i] < want - had)
			fake_cuda_die("%s: region %u pops %u frames from a stack offset of %u",
				      what, i, want - had, in_off[i]);
		VIEW(R->frame + had, (size_t)(want - had) * sizeof(uint32_t), what);
		VIEW(a->stack + (in_off[i] - (want - had)), (size_t)(want - had) * sizeof(uint32_t),
		     what);
		add(&w, R->frame + had, (size_t)(want - had) * sizeof(uint32_t));
		add(&r, a->stack + (in_off[i] - (want - had)),
		    (size_t)(want - had) * sizeof(uint32_t));
	}
	check(&w, &r, what);

	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t *n_slots = VIEW(R->n_slots, sizeof(*n_slots), what), had = *n_slots;
		uint32_t want = n_new[i] < KVT_REGION_MAX_SLOTS ? n_new[i] : KVT_REGION_MAX_SLOTS;
		struct kvt_region_slot *slot;
		struct kvt_region_key *key;
		struct kvt_region rg;

		if (want <= had)
			continue;
		slot = VIEW(R->slot, (size_t)want * sizeof(*slot), what);
		key = VIEW(R->key, key_span(slot, had) * sizeof(*key), what);
		region_open(&rg, slot, key, had, 0, 0, want, what, i);
		kvt_region_grow(&rg, want);
		*n_slots = rg.n_slots;
		if (a->stack) {
			uint32_t *frame = VIEW(R->frame, (size_t)want * sizeof(*frame), what);
			const uint32_t *top =
				VIEW(a->stack, (size_t)in_off[i] * sizeof(*top), what);

			/* the reference's free[--n_free], from the top down */
			for (uint32_t t = 0; t < want - had; t++)
				frame[had + t] = top[in_off[i] - 1 - t];
		}
		free(rg.link);
	}
}

int kvt_gpu_region_grow(const struct kvt_gpu_region *rg, const uint32_t *n_new,
			const uint32_t *stack, const uint32_t *in_off, uint32_t n, void *stream)
{
	struct grow_args a = {rg, n_new, stack, in_off, n};

	if (n == 0)
		return cudaSuccess;
	if (!rg || !n_new || n > MAX_GRID || !stack != !in_off)
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_region_grow", grow_work, &a, sizeof(a), NULL, 0);
}

/* ---- kvt_gpu_region_drop --------------------------------------------------------------------- */

struct drop_args {
	const struct kvt_gpu_region *rg;
	const uint32_t *k, *out_off;
	uint32_t *dropped, *freed, *gone;
	uint32_t n;
};

/* Region R's view (its view counts checked against r). */
static const uint32_t *view_of(const struct kvt_gpu_region *R, const uint32_t **vn,
			       const char *what, uint32_t ri)
{
	*vn = VIEW(R->view_n, R->n_heads * sizeof(**vn), what);
	for (uint32_t h = 0; h < R->n_heads; h++)
		if ((*vn)[h] > R->r)
			fake_cuda_die("%s: region %u: view_n[%u] = %u, above r = %u", what, ri, h,
				      (*vn)[h], R->r);
	return VIEW(R->view, (size_t)R->n_heads * R->r * sizeof(uint32_t), what);
}

/* Whether region R's view names slot s. */
static bool view_has(const struct kvt_gpu_region *R, uint32_t s, const char *what, uint32_t ri)
{
	const uint32_t *vn, *v = view_of(R, &vn, what, ri);

	for (uint32_t h = 0; h < R->n_heads; h++)
		for (uint32_t x = 0; x < vn[h]; x++)
			if (v[(size_t)h * R->r + x] == s)
				return true;
	return false;
}

static void drop_work(void *args)
{
	const struct drop_args *a = args;
	const char *what = "kvt_gpu_region_drop";
	const size_t nb = (size_t)a->n * sizeof(uint32_t);
	const struct kvt_gpu_region *D = VIEW(a->rg, (size_t)a->n * sizeof(*D), what);
	const uint32_t *k = VIEW(a->k, nb, what);
	const uint32_t *off = a->dropped || a->freed ? VIEW(a->out_off, nb, what) : NULL;
	struct ranges w = {0}, r = {0};

	add(&r, a->rg, (size_t)a->n * sizeof(*D));
	add(&r, a->k, nb);
	if (off)
		add(&r, a->out_off, nb);
	if (a->gone) {
		VIEW(a->gone, nb, what);
		add(&w, a->gone, nb);
	}
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t ns = slots_of(R, i, what), cnt = k[i] < ns ? k[i] : ns;
		struct kvt_region_slot *slot;
		struct kvt_region_key *key;

		if (!cnt) {
			add(&r, R->n_slots, sizeof(*R->n_slots));
			continue;
		}
		state_views(R, ns, &slot, &key, what);
		add(&w, R->slot, (size_t)ns * sizeof(*slot));
		add(&w, R->key, key_span(slot, ns) * sizeof(*key));
		add(&w, R->n_slots, sizeof(*R->n_slots));
		if (R->frame) {
			VIEW(R->frame, (size_t)ns * sizeof(uint32_t), what);
			add(&w, R->frame, (size_t)ns * sizeof(uint32_t));
		}
		if (a->dropped) {
			VIEW(a->dropped + off[i], (size_t)cnt * sizeof(uint32_t), what);
			add(&w, a->dropped + off[i], (size_t)cnt * sizeof(uint32_t));
		}
		if (a->freed) {
			VIEW(a->freed + off[i], (size_t)cnt * sizeof(uint32_t), what);
			add(&w, a->freed + off[i], (size_t)cnt * sizeof(uint32_t));
		}
		if (R->stale) {
			const uint32_t *vn;

			VIEW(R->stale, sizeof(*R->stale), what);
			view_of(R, &vn, what, i);
			add(&w, R->stale, sizeof(*R->stale));
			add(&r, R->view, (size_t)R->n_heads * R->r * sizeof(*R->view));
			add(&r, R->view_n, R->n_heads * sizeof(*R->view_n));
		}
	}
	check(&w, &r, what);

	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t *n_slots = VIEW(R->n_slots, sizeof(*n_slots), what), ns = *n_slots;
		uint32_t cnt = k[i] < ns ? k[i] : ns, gone = 0;
		struct kvt_region_slot *slot;
		struct kvt_region_key *key;
		struct kvt_region rg;
		uint32_t *frame;

		if (!cnt) {
			if (a->gone)
				((uint32_t *)VIEW(a->gone, nb, what))[i] = 0;
			continue;
		}
		state_views(R, ns, &slot, &key, what);
		frame = R->frame ? VIEW(R->frame, (size_t)ns * sizeof(*frame), what) : NULL;
		region_open(&rg, slot, key, ns, 0, 0, ns, what, i);
		for (uint32_t t = 0; t < cnt; t++) {
			uint32_t dropped, freed;

			gone += kvt_region_drop(&rg, frame, &dropped, &freed);
			if (a->dropped)
				*(uint32_t *)VIEW(a->dropped + off[i] + t, sizeof(uint32_t), what) =
					dropped;
			if (a->freed)
				*(uint32_t *)VIEW(a->freed + off[i] + t, sizeof(uint32_t), what) =
					freed;
			/* the slot taken, or the last one moved into its place (region_shrink's
			   mark in manager/recall.c) */
			if (R->stale &&
			    (view_has(R, dropped, what, i) || view_has(R, rg.n_slots, what, i)))
				*(uint32_t *)VIEW(R->stale, sizeof(uint32_t), what) = 1;
		}
		*n_slots = rg.n_slots;
		if (a->gone)
			((uint32_t *)VIEW(a->gone, nb, what))[i] = gone;
		free(rg.link);
	}
}

int kvt_gpu_region_drop(const struct kvt_gpu_region *rg, const uint32_t *k, const uint32_t *out_off,
			uint32_t *dropped, uint32_t *freed, uint32_t *gone, uint32_t n,
			void *stream)
{
	struct drop_args a = {rg, k, out_off, dropped, freed, gone, n};

	if (n == 0)
		return cudaSuccess;
	if (!rg || !k || ((dropped || freed) && !out_off) || n > MAX_GRID)
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_region_drop", drop_work, &a, sizeof(a), NULL, 0);
}

/* ---- kvt_gpu_region_empty -------------------------------------------------------------------- */

struct empty_args {
	const struct kvt_gpu_region *rg;
	const uint32_t *pairs;
	uint32_t *had;
	uint32_t n_regions, n;
};

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* The region index of pair x when it names a slot, else n_regions. */
static uint32_t pair_region(const struct empty_args *a, const uint32_t *pairs, uint32_t x,
			    const char *what)
{
	uint32_t ri = pairs[2 * (size_t)x], s = pairs[2 * (size_t)x + 1];
	const struct kvt_gpu_region *R;

	if (ri >= a->n_regions)
		return a->n_regions;
	R = VIEW(a->rg + ri, sizeof(*R), what);
	return s < slots_of(R, ri, what) ? ri : a->n_regions;
}

static void empty_work(void *args)
{
	const struct empty_args *a = args;
	const char *what = "kvt_gpu_region_empty";
	const uint32_t *pairs = VIEW(a->pairs, (size_t)a->n * 2 * sizeof(*pairs), what);
	uint32_t *had = a->had ? VIEW(a->had, (size_t)a->n * sizeof(*had), what) : NULL;
	uint32_t *touched = malloc((size_t)a->n * sizeof(*touched)), n_t = 0, open = a->n_regions;
	struct ranges w = {0}, r = {0};
	struct kvt_region rg = {0};

	if (!touched)
		fake_cuda_die("%s: no memory for %u pairs", what, a->n);
	add(&r, a->pairs, (size_t)a->n * 2 * sizeof(*pairs));
	if (had)
		add(&w, a->had, (size_t)a->n * sizeof(*had));
	/* each region a pair names once: the copies of a pair write the same slot */
	for (uint32_t x = 0; x < a->n; x++) {
		uint32_t ri = pairs[2 * (size_t)x];

		if (ri < a->n_regions) {
			const struct kvt_gpu_region *R = VIEW(a->rg + ri, sizeof(*R), what);

			add(&r, a->rg + ri, sizeof(*R));
			add(&r, R->n_slots, sizeof(*R->n_slots));
		}
		if ((ri = pair_region(a, pairs, x, what)) < a->n_regions)
			touched[n_t++] = ri;
	}
	qsort(touched, n_t, sizeof(*touched), cmp_u32);
	for (uint32_t x = 0; x < n_t; x++) {
		const struct kvt_gpu_region *R = VIEW(a->rg + touched[x], sizeof(*R), what);
		uint32_t ns = slots_of(R, touched[x], what);
		struct kvt_region_slot *slot;
		struct kvt_region_key *key;

		if (x && touched[x] == touched[x - 1])
			continue;
		state_views(R, ns, &slot, &key, what);
		add(&w, R->slot, (size_t)ns * sizeof(*slot));
		add(&w, R->key, key_span(slot, ns) * sizeof(*key));
	}
	check(&w, &r, what);

	/* pair by pair, a region's order list kept while its pairs follow each other */
	for (uint32_t x = 0; x < a->n; x++) {
		uint32_t ri = pair_region(a, pairs, x, what), got = 0;

		if (ri < a->n_regions) {
			if (ri != open) {
				const struct kvt_gpu_region *R = VIEW(a->rg + ri, sizeof(*R), what);
				uint32_t ns = slots_of(R, ri, what);
				struct kvt_region_slot *slot;
				struct kvt_region_key *key;

				free(rg.link);
				state_views(R, ns, &slot, &key, what);
				region_open(&rg, slot, key, ns, 0, 0, ns, what, ri);
				open = ri;
			}
			got = kvt_region_empty(&rg, pairs[2 * (size_t)x + 1]);
		}
		if (had)
			had[x] = got;
	}
	free(rg.link);
	free(touched);
}

int kvt_gpu_region_empty(const struct kvt_gpu_region *rg, uint32_t n_regions, const uint32_t *pairs,
			 uint32_t *had, uint32_t n, void *stream)
{
	struct empty_args a = {rg, pairs, had, n_regions, n};

	if (n == 0)
		return cudaSuccess;
	if (!rg || !pairs)
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_region_empty", empty_work, &a, sizeof(a), NULL, 0);
}

/* ---- kvt_gpu_region_clear -------------------------------------------------------------------- */

struct clear_args {
	const struct kvt_gpu_region *rg;
	const uint32_t *out_off;
	uint32_t *gone, *freed;
	uint32_t n;
};

static void clear_work(void *args)
{
	const struct clear_args *a = args;
	const char *what = "kvt_gpu_region_clear";
	const size_t nb = (size_t)a->n * sizeof(uint32_t);
	const struct kvt_gpu_region *D = VIEW(a->rg, (size_t)a->n * sizeof(*D), what);
	const uint32_t *off = a->freed ? VIEW(a->out_off, nb, what) : NULL;
	uint32_t *gone = a->gone ? VIEW(a->gone, nb, what) : NULL;
	struct ranges w = {0}, r = {0};

	add(&r, a->rg, (size_t)a->n * sizeof(*D));
	if (off)
		add(&r, a->out_off, nb);
	if (gone)
		add(&w, a->gone, nb);
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t ns = slots_of(R, i, what);
		struct kvt_region_slot *slot;
		struct kvt_region_key *key;

		state_views(R, ns, &slot, &key, what);
		add(&w, R->slot, (size_t)ns * sizeof(*slot));
		add(&w, R->key, key_span(slot, ns) * sizeof(*key));
		add(&w, R->n_slots, sizeof(*R->n_slots));
		if (!off)
			continue;
		VIEW(a->freed + off[i], (size_t)ns * sizeof(uint32_t), what);
		add(&w, a->freed + off[i], (size_t)ns * sizeof(uint32_t));
		if (R->frame) {
			VIEW(R->frame, (size_t)ns * sizeof(uint32_t), what);
			add(&r, R->frame, (size_t)ns * sizeof(uint32_t));
		}
	}
	check(&w, &r, what);

	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t *n_slots = VIEW(R->n_slots, sizeof(*n_slots), what), ns = *n_slots, g;
		struct kvt_region_slot *slot;
		struct kvt_region_key *key;
		struct kvt_region rg;

		if (off) { /* the frames pushed in index order, before the slots go */
			uint32_t *out = VIEW(a->freed + off[i], (size_t)ns * sizeof(*out), what);
			const uint32_t *frame =
				R->frame ? VIEW(R->frame, (size_t)ns * sizeof(*frame), what) : NULL;

			for (uint32_t s = 0; s < ns; s++)
				out[s] = frame ? frame[s] : s;
		}
		state_views(R, ns, &slot, &key, what);
		region_open(&rg, slot, key, ns, 0, 0, ns, what, i);
		g = kvt_region_clear(&rg);
		*n_slots = rg.n_slots;
		if (gone)
			gone[i] = g;
		free(rg.link);
	}
}

int kvt_gpu_region_clear(const struct kvt_gpu_region *rg, uint32_t *gone, const uint32_t *out_off,
			 uint32_t *freed, uint32_t n, void *stream)
{
	struct clear_args a = {rg, out_off, gone, freed, n};

	if (n == 0)
		return cudaSuccess;
	if (!rg || n > MAX_GRID || !out_off != !freed)
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_region_clear", clear_work, &a, sizeof(a), NULL, 0);
}

/* ---- kvt_gpu_region_gather ------------------------------------------------------------------- */

struct gather_args {
	const struct kvt_gpu_region *rg;
	uint64_t block_bytes, frame_base;
	uint32_t *missing, *fresh;
	uint32_t n;
};

/* Where load ld of region R copies from (0: its block is not in DRAM) and to. */
static uint64_t gather_src(const struct kvt_gpu_region *R, const struct kvt_region_load *ld,
			   uint64_t block_bytes, const char *what, uint32_t ri)
{
	uint32_t b;
	uint64_t g;

	if (!R->n_heads)
		fake_cuda_die("%s: region %u: a load without heads", what, ri);
	b = ld->key / R->n_heads;
	if (b >= R->cap_blocks || !R->group)
		return 0; /* past the table, or no table: not in DRAM (gpu.h) */
	g = *(const uint64_t *)VIEW(R->group + b, sizeof(uint64_t), what);
	if (g % 16)
		fake_cuda_die("%s: region %u: block %u's group %#llx is not 16-byte aligned", what,
			      ri, b, (unsigned long long)g);
	return g ? g + (uint64_t)(ld->key % R->n_heads) * block_bytes : 0;
}

static uint64_t gather_dst(const struct gather_args *a, const struct kvt_gpu_region *R,
			   const struct kvt_region_load *ld, const char *what)
{
	uint32_t f = R->frame ? *(const uint32_t *)VIEW(R->frame + ld->slot, sizeof(uint32_t), what)
			      : ld->slot;

	return a->frame_base + (uint64_t)f * a->block_bytes;
}

/* Region R's loads (*n_load of them), as host views. */
static const struct kvt_region_load *loads_of(const struct kvt_gpu_region *R, uint32_t *n,
					      const char *what)
{
	*n = u32_at(R->n_load, what);
	return VIEW(R->load, (size_t)*n * sizeof(struct kvt_region_load), what);
}

static void gather_work(void *args)
{
	const struct gather_args *a = args;
	const char *what = "kvt_gpu_region_gather";
	const uint64_t bb = a->block_bytes;
	const struct kvt_gpu_region *D = VIEW(a->rg, (size_t)a->n * sizeof(*D), what);
	struct ranges w = {0}, r = {0};
	uint32_t n_missing = 0;

	if (a->frame_base % 16)
		fake_cuda_die("%s: frame base %#llx is not 16-byte aligned", what,
			      (unsigned long long)a->frame_base);
	add(&r, a->rg, (size_t)a->n * sizeof(*D));
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t nl;
		const struct kvt_region_load *ld = loads_of(R, &nl, what);
		bool miss = false;

		add(&r, R->n_load, sizeof(uint32_t));
		add(&r, R->load, (size_t)nl * sizeof(*ld));
		for (uint32_t x = 0; x < nl; x++) {
			uint64_t src = gather_src(R, &ld[x], bb, what, i);

			if (R->group && ld[x].key / R->n_heads < R->cap_blocks)
				add(&r, R->group + ld[x].key / R->n_heads, sizeof(uint64_t));
			if (R->frame)
				add(&r, R->frame + ld[x].slot, sizeof(uint32_t));
			if (!src) {
				miss = true;
				continue;
			}
			VIEW(src, bb, what);
			VIEW(gather_dst(a, R, &ld[x], what), bb, what);
			add(&r, (const void *)(uintptr_t)src, bb);
			add(&w, (const void *)(uintptr_t)gather_dst(a, R, &ld[x], what), bb);
		}
		n_missing += miss;
		if (miss && R->stale) {
			VIEW(R->stale, sizeof(uint32_t), what);
			add(&w, R->stale, sizeof(uint32_t));
		}
	}
	if (n_missing && a->missing) { /* the count is added to with atomics */
		VIEW(a->missing, sizeof(uint32_t), what);
		add(&r, a->missing, sizeof(uint32_t));
	}
	if (a->fresh) { /* likewise */
		VIEW(a->fresh, sizeof(uint32_t), what);
		add(&r, a->fresh, sizeof(uint32_t));
	}
	check(&w, &r, what);

	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_region *R = &D[i];
		uint32_t nl;
		const struct kvt_region_load *ld = loads_of(R, &nl, what);

		for (uint32_t x = 0; x < nl; x++) {
			uint64_t src = gather_src(R, &ld[x], bb, what, i), dst;

			if (a->fresh && ld[x].old == KVT_REGION_NONE)
				++*(uint32_t *)VIEW(a->fresh, sizeof(uint32_t), what);
			if (!src) { /* not in DRAM: the view is stale */
				if (R->stale)
					*(uint32_t *)VIEW(R->stale, sizeof(uint32_t), what) = 1;
				if (a->missing)
					++*(uint32_t *)VIEW(a->missing, sizeof(uint32_t), what);
				continue;
			}
			dst = gather_dst(a, R, &ld[x], what);
			if (bb)
				memcpy(VIEW(dst, bb, what), VIEW(src, bb, what), bb);
		}
	}
}

int kvt_gpu_region_gather(const struct kvt_gpu_region *rg, uint32_t n, uint64_t block_bytes,
			  uint64_t frame_base, uint32_t ctas, uint32_t *missing, uint32_t *fresh,
			  void *stream)
{
	struct gather_args a = {rg, block_bytes, frame_base, missing, fresh, n};
	const struct kvt_gpu_region *D;
	struct ranges rd = {0};
	int err;

	(void)ctas;
	if (n == 0)
		return cudaSuccess;
	if (!rg || n > 0x7fffffffu || block_bytes == 0 || block_bytes % 16 ||
	    block_bytes > UINT32_MAX || frame_base == 0 || frame_base % 16)
		return cudaErrorInvalidValue;
	/* the host rows, watched while the launch is queued (the asynchronous fake; the other
	   runs it now), where the loads and groups can be told now (no kernel queued before it
	   writes them) */
	D = fake_cuda_async() ? fake_cuda_peek((uint64_t)(uintptr_t)rg, (size_t)n * sizeof(*D))
			      : NULL;
	for (uint32_t i = 0; D && i < n; i++) {
		const uint32_t *nl = fake_cuda_peek((uint64_t)(uintptr_t)D[i].n_load, sizeof(*nl));
		const struct kvt_region_load *ld =
			nl ? fake_cuda_peek((uint64_t)(uintptr_t)D[i].load, *nl * sizeof(*ld))
			   : NULL;

		for (uint32_t x = 0; ld && D[i].n_heads && x < *nl; x++) {
			uint32_t b = ld[x].key / D[i].n_heads;
			const uint64_t *g =
				b < D[i].cap_blocks
					? fake_cuda_peek((uint64_t)(uintptr_t)(D[i].group + b),
							 sizeof(*g))
					: NULL;

			if (g && *g)
				add(&rd,
				    (const void *)(uintptr_t)(*g +
							      (uint64_t)(ld[x].key % D[i].n_heads) *
								      block_bytes),
				    block_bytes);
		}
	}
	err = fake_cuda_launch(stream, "kvt_gpu_region_gather", gather_work, &a, sizeof(a), rd.r,
			       rd.n);
	free(rd.r);
	return err;
}

/* ---- kvt_gpu_region_groups ------------------------------------------------------------------ */

struct groups_args {
	const uint64_t *at, *val;
	uint32_t n;
};

static void groups_work(void *args)
{
	const struct groups_args *a = args;
	const char *what = "kvt_gpu_region_groups";
	struct ranges w = {0}, r = {0};
	const uint64_t *val, *at = groups_open(a->at, a->val, a->n, &w, &r, what, &val);

	check(&w, &r, what); /* two entries at one address collide */
	groups_write(at, val, a->n, what);
}

int kvt_gpu_region_groups(const uint64_t *at, const uint64_t *val, uint32_t n, void *stream)
{
	struct groups_args a = {at, val, n};

	if (n == 0)
		return cudaSuccess;
	if (!at || !val || n > 0x7fffffffu)
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_region_groups", groups_work, &a, sizeof(a), NULL,
				0);
}
