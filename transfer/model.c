/* SPDX-License-Identifier: MIT */
/*
 * The model backend: no payload bytes exist (arenas are address ranges never dereferenced, as
 * in the null backend), but every transfer the manager asks for is checked against those
 * ranges and timed by a bandwidth + per-call-latency model, so the manager, policy and
 * scheduler run for real over traces far larger than this machine's memory. Time is modelled,
 * never slept: each successful call adds its figures to kvt_be.cost of its direction.
 *
 * The model (figures from struct kvt_model_params; GB/s = 1e9 bytes/s = bytes per ns):
 *
 *   copy_d2d    one kernel launch               launch_ns + bytes / d2d_gbps
 *   gather_h2d  fused (FlashH2D, one kernel)    launch_ns + bytes / (h2d_gbps * fused_eff)
 *               not fused (a DMA per piece)     pieces * call_ns + bytes / h2d_gbps
 *   save        FlashD2H: one DMA call per      calls * call_ns + bytes / d2h_gbps
 *               (source, staging chunk) pair the sources cross, their bytes at d2h_gbps;
 *               the CPU scatter from staging into host blocks runs on the save threads,
 *               overlapped with the next step, so it is off the critical path and not timed
 *   append      ring writes, one kernel (d2d)   launch_ns + bytes / d2d_gbps
 *               save of k and v as above (d2h)  calls * call_ns + bytes / d2h_gbps
 *   read_d2h    -ENOTSUP: there is no payload to read (the manager never asks, see
 *               KVT_BE_NO_PAYLOAD); a read would cost call_ns + bytes / d2h_gbps
 *
 * An entry of a copy list with reps r counts r pieces of `bytes`. Staging chunks are the
 * save path's (transfer/savepool.h): consecutive staging_bytes-sized ranges of the
 * concatenated sources, so a source that crosses c chunks costs c calls. Every save of the
 * manager has two sources (k and v are separate tensors, hence separate copies): 2 calls
 * when both fit one staging buffer. Each call's time per
 * direction is computed in double and rounded to the nearest ns (halves up), saturating at
 * UINT64_MAX, before it is added; a call that moves no bytes costs nothing. Calls count DMA
 * copy calls and kernel launches. Directions are summed separately: how H2D, D2H and device
 * work overlap is for the caller's execution model to decide.
 *
 * Checks, so that the model catches what the host backend would turn into a wild write: every
 * piece that lands in or is read from an arena lies inside it (destinations of copy_d2d, both
 * sides of gather_h2d, destinations of saves and both destinations of each append), and save
 * pieces read inside their sources. Sources in caller tensors are not checked (they are not
 * in an arena). A call that fails changes nothing, its cost included.
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "fault.h"
#include "backend.h"
#include "util.h"

/* Where the first arena goes, and the alignment of and gap between arenas. */
#define MODEL_ARENA_START ((uint64_t)1 << 32)
/* The scratch buffer's fake address: above any pair of arenas the address space can hold. */
#define MODEL_SCRATCH_BASE ((uint64_t)1 << 63)
#define MODEL_ARENA_ALIGN ((uint64_t)2 << 20)

struct model_range {
	uint64_t base, bytes; /* bytes == 0: not allocated */
};

struct model_backend {
	struct kvt_be base;
	struct kvt_model_params p;
	uint64_t staging_bytes;
	uint64_t ticket;
	struct model_range arena[2]; /* by enum kvt_tier */
	struct model_range scratch;  /* the scratch buffer, at MODEL_SCRATCH_BASE */
};

static inline struct model_backend *mb_of(struct kvt_be *b)
{
	return (struct model_backend *)b;
}

static bool gbps_ok(double g)
{
	return g > 0 && isfinite(g);
}

/* 0, or -EINVAL when a figure is out of range (the manager checks the same on the config). */
static int model_params_check(const struct kvt_model_params *p)
{
	if (!gbps_ok(p->h2d_gbps) || !gbps_ok(p->d2h_gbps) || !gbps_ok(p->d2d_gbps))
		return -EINVAL;
	if (!(p->fused_eff > 0 && p->fused_eff <= 1) || p->fused > 1)
		return -EINVAL;
	return 0;
}

static int model_create(const struct kvt_backend_params *p, struct kvt_be **out)
{
	struct model_backend *mb;

	if (!p || !out || p->staging_bytes == 0 || model_params_check(&p->model))
		return -EINVAL;
	mb = kvt_calloc(1, sizeof(*mb));
	if (!mb)
		return -ENOMEM;
	mb->base.ops = &kvt_backend_model_ops;
	mb->base.flags = KVT_BE_NO_PAYLOAD;
	mb->p = p->model;
	mb->staging_bytes = p->staging_bytes;
	*out = &mb->base;
	return 0;
}

static void model_destroy(struct kvt_be *b)
{
	free(b);
}

/* Arenas are placed one after the other from MODEL_ARENA_START, 2 MiB aligned with a 2 MiB
   gap, so any two whose sizes fit the address space are disjoint and neither wraps (unlike
   the null backend's fixed 16 TiB slots, a replay-sized device tier fits). One arena per tier
   at a time. */
static int model_arena_alloc(struct kvt_be *b, enum kvt_tier tier, uint64_t bytes, uint64_t *base)
{
	struct model_backend *mb = mb_of(b);
	const struct model_range *other;
	uint64_t start = MODEL_ARENA_START, end;

	if ((tier != KVT_TIER_DEVICE && tier != KVT_TIER_HOST) || !base || bytes == 0)
		return kvt_be_fail(b, -EINVAL, "arena of %llu bytes", (unsigned long long)bytes);
	if (mb->arena[tier].bytes)
		return kvt_be_fail(b, -EBUSY, "the %s arena is already allocated",
				   tier == KVT_TIER_DEVICE ? "device" : "host");
	other = &mb->arena[tier == KVT_TIER_DEVICE ? KVT_TIER_HOST : KVT_TIER_DEVICE];
	if (other->bytes && (__builtin_add_overflow(other->base, other->bytes, &start) ||
			     __builtin_add_overflow(start, 2 * MODEL_ARENA_ALIGN - 1, &start)))
		goto full;
	start &= ~(MODEL_ARENA_ALIGN - 1);
	if (__builtin_add_overflow(start, bytes, &end))
		goto full;
	mb->arena[tier] = (struct model_range){start, bytes};
	*base = start;
	return 0;
full:
	return kvt_be_fail(b, -ENOMEM, "no address range left for a %s arena of %llu bytes",
			   tier == KVT_TIER_DEVICE ? "device" : "host", (unsigned long long)bytes);
}

static void model_arena_free(struct kvt_be *b, enum kvt_tier tier, uint64_t base, uint64_t bytes)
{
	struct model_backend *mb = mb_of(b);

	(void)bytes;
	if ((tier == KVT_TIER_DEVICE || tier == KVT_TIER_HOST) && mb->arena[tier].bytes &&
	    mb->arena[tier].base == base)
		mb->arena[tier] = (struct model_range){0, 0};
}

/* Whether [a, a + span) lies inside r. */
static bool inside(const struct model_range *r, uint64_t a, uint64_t span)
{
	return a >= r->base && a - r->base <= r->bytes && r->bytes - (a - r->base) >= span;
}

/* Whether reps >= 1 pieces of bytes at a, a + stride, ... all lie inside r (strides are
   unsigned, so the first and the last piece bound the others). */
static bool pieces_inside(const struct model_range *r, uint64_t a, uint32_t bytes, uint32_t reps,
			  uint64_t stride)
{
	uint64_t span;

	if (__builtin_mul_overflow((uint64_t)(reps - 1), stride, &span) ||
	    __builtin_add_overflow(span, bytes, &span))
		return false;
	return inside(r, a, span);
}

/* What a copy list moves. */
struct list_sum {
	uint64_t bytes, pieces;
};

/* Sums x after checking it: sources inside src_r and destinations inside dst_r where those
   are not NULL (the names are for the error detail). Entries moving nothing (bytes or reps 0)
   are skipped. 0 or -EINVAL recorded. */
static int sum_list(struct kvt_be *b, const char *op, const struct kvt_xfer *x, uint32_t n,
		    const struct model_range *src_r, const char *src_name,
		    const struct model_range *dst_r, const char *dst_name, struct list_sum *out)
{
	struct list_sum s = {0, 0};

	if (n && !x)
		return kvt_be_fail(b, -EINVAL, "%s: NULL list of %u entries", op, n);
	for (uint32_t e = 0; e < n; e++) {
		const struct kvt_xfer *xe = &x[e];

		if (!xe->bytes || !xe->reps)
			continue;
		if (src_r && !pieces_inside(src_r, xe->src, xe->bytes, xe->reps, xe->src_stride))
			return kvt_be_fail(b, -EINVAL, "%s: entry %u reads outside the %s", op, e,
					   src_name);
		if (dst_r && !pieces_inside(dst_r, xe->dst, xe->bytes, xe->reps, xe->dst_stride))
			return kvt_be_fail(b, -EINVAL, "%s: entry %u writes outside the %s", op, e,
					   dst_name);
		/* bytes * reps < 2^64; only the running sum can overflow. */
		if (__builtin_add_overflow(s.bytes, (uint64_t)xe->bytes * xe->reps, &s.bytes))
			return kvt_be_fail(b, -EINVAL, "%s: list moves 2^64 bytes or more", op);
		s.pieces += xe->reps;
	}
	*out = s;
	return 0;
}

/* fixed_ns + bytes / gbps, rounded to the nearest ns (halves up), saturating. */
static uint64_t model_ns(double fixed_ns, uint64_t bytes, double gbps)
{
	double t = fixed_ns + (double)bytes / gbps + 0.5;

	return t >= 0x1p64 ? UINT64_MAX : (uint64_t)t;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void charge(struct kvt_be *b, enum kvt_dir d, uint64_t ns, uint64_t bytes, uint64_t calls)
{
	struct kvt_be_cost *c = &b->cost[d];

	c->ns = sat_add(c->ns, ns);
	c->bytes = sat_add(c->bytes, bytes);
	c->calls = sat_add(c->calls, calls);
}

/* DMA calls a save of these sources takes: one per (source, staging chunk) pair that share
   bytes, the chunks being consecutive staging_bytes ranges of the concatenated sources (as
   the save path cuts them). *total receives the sources' bytes. -EINVAL past 2^64 bytes. */
static int save_calls(const struct model_backend *mb, const struct kvt_save_src *src, uint32_t n,
		      uint64_t *calls, uint64_t *total)
{
	uint64_t at = 0, c = 0, S = mb->staging_bytes;

	for (uint32_t i = 0; i < n; i++) {
		uint64_t end;

		if (!src[i].bytes)
			continue;
		if (__builtin_add_overflow(at, src[i].bytes, &end))
			return -EINVAL;
		c += (end - 1) / S - at / S + 1;
		at = end;
	}
	*calls = c;
	*total = at;
	return 0;
}

/* Charges a FlashD2H save of `total` source bytes in `calls` DMA calls. */
static void charge_save(struct model_backend *mb, uint64_t calls, uint64_t total)
{
	if (!total)
		return;
	charge(&mb->base, KVT_DIR_D2H,
	       model_ns((double)calls * mb->p.call_ns, total, mb->p.d2h_gbps), total, calls);
}

/* Copies within the device: into frames (the device arena) or into the scratch buffer. */
static int model_copy_d2d(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream)
{
	struct model_backend *mb = mb_of(b);
	struct list_sum s = {0};
	int err;

	(void)stream;
	err = sum_list(b, "copy_d2d", x, n, NULL, NULL, &mb->arena[KVT_TIER_DEVICE], "device arena",
		       &s);
	if (err && mb->scratch.bytes)
		err = sum_list(b, "copy_d2d", x, n, NULL, NULL, &mb->scratch, "scratch buffer", &s);
	if (err)
		return err;
	if (s.bytes)
		charge(b, KVT_DIR_D2D, model_ns(mb->p.launch_ns, s.bytes, mb->p.d2d_gbps), s.bytes,
		       1);
	return 0;
}

/* Charges a gather of host blocks (FlashH2D, or a DMA per piece) of s. */
static void charge_gather(struct model_backend *mb, const struct list_sum *s)
{
	if (!s->bytes)
		return;
	if (mb->p.fused)
		charge(&mb->base, KVT_DIR_H2D,
		       model_ns(mb->p.launch_ns, s->bytes, mb->p.h2d_gbps * mb->p.fused_eff),
		       s->bytes, 1);
	else
		charge(&mb->base, KVT_DIR_H2D,
		       model_ns((double)s->pieces * mb->p.call_ns, s->bytes, mb->p.h2d_gbps),
		       s->bytes, s->pieces);
}

/* Host blocks into caller tensors or the scratch buffer: sources checked only. */
static int model_load_h2d(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream)
{
	struct model_backend *mb = mb_of(b);
	struct list_sum s = {0};
	int err;

	(void)stream;
	err = sum_list(b, "load_h2d", x, n, &mb->arena[KVT_TIER_HOST], "host arena", NULL, NULL,
		       &s);
	if (!err)
		charge_gather(mb, &s);
	return err;
}

static int model_scratch(struct kvt_be *b, uint64_t bytes, uint64_t *addr)
{
	struct model_backend *mb = mb_of(b);

	if (bytes > mb->scratch.bytes)
		mb->scratch = (struct model_range){MODEL_SCRATCH_BASE, bytes};
	*addr = MODEL_SCRATCH_BASE;
	return 0;
}

static int model_gather_h2d(struct kvt_be *b, const struct kvt_xfer *x, uint32_t n, void *stream)
{
	struct model_backend *mb = mb_of(b);
	struct list_sum s = {0};
	int err;

	(void)stream;
	err = sum_list(b, "gather_h2d", x, n, &mb->arena[KVT_TIER_HOST], "host arena",
		       &mb->arena[KVT_TIER_DEVICE], "device arena", &s);
	if (!err)
		charge_gather(mb, &s);
	return err;
}

static int model_save(struct kvt_be *b, const struct kvt_save_src *src, uint32_t n_src,
		      const struct kvt_xfer *x, uint32_t n, void *stream, uint64_t *ticket)
{
	struct model_backend *mb = mb_of(b);
	uint64_t calls, total;
	struct model_range concat;
	struct list_sum s = {0};
	int err;

	(void)stream;
	if ((n_src && !src) || !ticket)
		return kvt_be_fail(b, -EINVAL, "save: NULL %s", !ticket ? "ticket" : "sources");
	if (save_calls(mb, src, n_src, &calls, &total))
		return kvt_be_fail(b, -EINVAL, "save: sources of 2^64 bytes or more");
	/* Piece sources are offsets into the concatenated sources: a range based at 0. */
	concat = (struct model_range){0, total};
	err = sum_list(b, "save", x, n, &concat, "sources", &mb->arena[KVT_TIER_HOST], "host arena",
		       &s);
	if (err)
		return err;
	charge_save(mb, calls, total);
	*ticket = ++mb->ticket;
	return 0;
}

static int model_append(struct kvt_be *b, uint64_t k, uint64_t v, uint32_t n,
			const struct kvt_append *a, const struct kvt_append_geom *g, void *stream,
			uint64_t *ticket)
{
	struct model_backend *mb = mb_of(b);
	const struct model_range *dev = &mb->arena[KVT_TIER_DEVICE];
	const struct model_range *host = &mb->arena[KVT_TIER_HOST];
	uint64_t span, half, calls = 0, total = 0;

	(void)stream;
	if ((n && (!a || !g)) || !ticket)
		return kvt_be_fail(b, -EINVAL, "append: NULL %s",
				   !ticket ? "ticket"
				   : !a	   ? "destinations"
					   : "geometry");
	if (n && g->n_heads && g->row_bytes) {
		/* One sequence's rows span [a, a + span) in both tiers: K of head h at
		   + h * head_stride, its V at + v_offset. */
		if (__builtin_mul_overflow((uint64_t)g->n_heads - 1, g->head_stride, &span) ||
		    __builtin_add_overflow(span, g->v_offset, &span) ||
		    __builtin_add_overflow(span, g->row_bytes, &span) ||
		    __builtin_mul_overflow((uint64_t)n * g->n_heads, g->row_bytes, &half) ||
		    half > UINT64_MAX / 2)
			return kvt_be_fail(b, -EINVAL, "append: geometry overflows");
		for (uint32_t i = 0; i < n; i++) {
			if (!inside(dev, a[i].dev, span))
				return kvt_be_fail(b, -EINVAL,
						   "append: %u: outside the device arena", i);
			if (!inside(host, a[i].host, span))
				return kvt_be_fail(b, -EINVAL, "append: %u: outside the host arena",
						   i);
		}
		struct kvt_save_src kv[2] = {{k, half}, {v, half}};

		if (NEVER(save_calls(mb, kv, 2, &calls, &total) != 0)) /* 2 * half < 2^64 */
			return kvt_be_fail(b, -EINVAL, "append: geometry overflows");
		charge(b, KVT_DIR_D2D, model_ns(mb->p.launch_ns, total, mb->p.d2d_gbps), total, 1);
		charge_save(mb, calls, total);
	}
	*ticket = ++mb->ticket;
	return 0;
}

static int model_save_wait(struct kvt_be *b, uint64_t ticket)
{
	(void)b;
	(void)ticket;
	return 0; /* saves complete at once: nothing is scattered */
}

static int model_read(struct kvt_be *b, void *dst, uint64_t src, uint64_t bytes, void *stream)
{
	(void)dst;
	(void)stream;
	(void)src;
	(void)bytes;
	return kvt_be_fail(b, -ENOTSUP, "the model backend holds no payload");
}

static int model_sync(struct kvt_be *b, void *stream)
{
	(void)b;
	(void)stream;
	return 0;
}

const struct kvt_backend_ops kvt_backend_model_ops = {
	.version = KVT_BACKEND_OPS_VERSION,
	.name = "model",
	.create = model_create,
	.destroy = model_destroy,
	.arena_alloc = model_arena_alloc,
	.arena_free = model_arena_free,
	.copy_d2d = model_copy_d2d,
	.gather_h2d = model_gather_h2d,
	.load_h2d = model_load_h2d,
	.scratch = model_scratch,
	.save = model_save,
	.append = model_append,
	.save_wait = model_save_wait,
	.read_d2h = model_read,
	.sync = model_sync,
};
