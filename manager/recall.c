/* SPDX-License-Identifier: MIT */
/*
 * Dynamic recall: block metadata kept as blocks fill, the recall cache (a pool of single-block
 * device frames shared out as one region per (sequence, layer): policy/region.h makes every
 * decision inside a region), the recall views kvt_attend reads, and each sequence's recall
 * working set over its last w steps.
 *
 * Costs: a recall call is O(blocks asked for) bookkeeping inside its members' own regions, plus
 * one batched gather of the misses; scoring (kvt_decode_recall) reads every block's metadata of
 * the layer once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "gpu.h"
#include "huge.h"
#include "manager.h"
#include "par.h"
#include "policy.h"
#include "recall.h"
#include "spill.h"

int kvt_recall_init(struct kvt_manager *m, uint64_t base, uint32_t n_frames)
{
	struct kvt_recall_cache *rc = &m->rc;

	*rc = (struct kvt_recall_cache){.n = n_frames, .base = base};
	if (!n_frames)
		return 0;
	rc->free = kvt_malloc((size_t)n_frames * sizeof(*rc->free));
	rc->push_tag = kvt_malloc((size_t)n_frames * sizeof(*rc->push_tag));
	rc->tmp = kvt_malloc((size_t)n_frames * sizeof(*rc->tmp));
	rc->named = kvt_calloc(DIV_UP(KVT_REGION_MAX_SLOTS, 64), sizeof(*rc->named));
	rc->layer_calls = kvt_calloc(m->cfg.n_layers, sizeof(*rc->layer_calls));
	rc->layer_ws = kvt_calloc(m->cfg.n_layers, sizeof(*rc->layer_ws));
	rc->snap_layer = kvt_calloc(m->cfg.n_layers, sizeof(*rc->snap_layer));
	rc->layer_done = kvt_calloc(m->cfg.n_layers, sizeof(*rc->layer_done));
	rc->layer_swept = kvt_calloc(m->cfg.n_layers, sizeof(*rc->layer_swept));
	if (!rc->free || !rc->push_tag || !rc->tmp || !rc->named || !rc->layer_calls ||
	    !rc->layer_ws || !rc->snap_layer || !rc->layer_done || !rc->layer_swept)
		return -ENOMEM; /* kvt_recall_fini frees what was allocated */
	/* frame 0 on top: a fresh cache hands out frames in ascending order */
	for (uint32_t i = 0; i < n_frames; i++)
		rc->free[i] = n_frames - 1 - i;
	rc->n_free = rc->top = n_frames;
	if (m->cfg.recall_threads >= 2)
		return kvt_par_create(m->cfg.recall_threads, &rc->par);
	return 0;
}

static void lanes_free(struct kvt_manager *m);

void kvt_recall_fini(struct kvt_manager *m)
{
	struct kvt_recall_cache *rc = &m->rc;

	if (m->be && rc->dstack)
		m->ops->dmem_free(m->be, rc->dstack);
	if (m->be && rc->dcall)
		m->ops->dmem_free(m->be, rc->dcall);
	free(rc->hblob);
	lanes_free(m);
	free(rc->free);
	free(rc->push_tag);
	free(rc->tmp);
	free(rc->named);
	free(rc->drop);
	free(rc->grow);
	free(rc->layer_calls);
	free(rc->layer_ws);
	free(rc->snap_layer);
	free(rc->layer_done);
	free(rc->layer_swept);
	free(rc->need);
	free(rc->want);
	free(rc->mrc);
	free(rc->xmember);
	free(rc->xslot);
	free(rc->ld);
	for (uint32_t l = 0; rc->slab && l < m->cfg.n_layers; l++) {
		for (uint32_t k = 0; rc->slab[l] && k < rc->slab_chunks; k++)
			kvt_huge_free(rc->slab[l][k]);
		free(rc->slab[l]);
	}
	free(rc->slab);
	kvt_par_destroy(rc->par);
	*rc = (struct kvt_recall_cache){0};
}

/* Bytes of a device metadata table of cap blocks: the metadata, then the key table, then (with
   the regions on the device) the group table. */
static uint64_t dmeta_size(const struct kvt_manager *m, uint64_t cap)
{
	return cap * m->cfg.n_kv_heads * (m->meta_bytes + sizeof(struct kvt_region_key)) +
	       (m->dev_regions ? cap * sizeof(uint64_t) : 0);
}

/* Where a region kept on the device has its parts, at capacities of scap slots and vcap view
   entries per head (16-byte aligned). */
struct dreg_layout {
	uint64_t slot, frame, view_n, view, bytes;
};

#define ALIGN16(x) (((x) + 15) & ~(uint64_t)15)

static struct dreg_layout dreg_layout(const struct kvt_manager *m, uint64_t scap, uint64_t vcap)
{
	uint64_t H = m->cfg.n_kv_heads;
	struct dreg_layout l = {.slot = 0};

	l.frame = scap * sizeof(struct kvt_region_slot);
	l.view_n = ALIGN16(l.frame + scap * sizeof(uint32_t));
	l.view = ALIGN16(l.view_n + H * sizeof(uint32_t));
	l.bytes = l.view + H * vcap * sizeof(uint32_t);
	return l;
}

void kvt_recall_layer_free(struct kvt_manager *m, struct kvt_recall_layer *rc)
{
	if (!rc)
		return;
	(void)kvt_recall_settle(m); /* a pending call may name it */
	if (rc->dmeta) {
		m->ops->dmem_free(m->be, rc->dmeta);
		m->dmeta_bytes -= dmeta_size(m, rc->dcap);
	}
	if (rc->dreg) {
		m->ops->dmem_free(m->be, rc->dreg);
		m->dmeta_bytes -= dreg_layout(m, rc->dscap, rc->dvcap).bytes;
	}
	kvt_huge_free(rc->meta);
	kvt_huge_free(rc->rg.slot);
	kvt_huge_free(rc->rg.key);
	kvt_huge_free(rc->rg.link);
	kvt_huge_free(rc->frame);
	kvt_huge_free(rc->view_n);
	kvt_huge_free(rc->view);
	if (rc->ws.bucket) /* in the slab (rc_bucket), for the next sequence of its slot */
		memset(rc->ws.bucket, 0, (size_t)m->cfg.ws_window * sizeof(*rc->ws.bucket));
	kvt_huge_free(rc->qcand);
	memset(rc, 0, sizeof(*rc)); /* its place in the slab, for the next sequence of its slot */
}

void kvt_recall_free_seq(struct kvt_manager *m, struct kvt_seq *s)
{
	for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
		kvt_recall_layer_free(m, s->layers[l].rc);
		s->layers[l].rc = NULL;
	}
}

/* The layer's group table entries that are in the spill file. */
static uint32_t count_spilled(const struct kvt_seq_layer *ly)
{
	uint32_t k = 0;

	for (uint32_t b = 0; b < ly->n_groups; b++)
		k += !!(ly->groups[b] & KVT_SPILLED);
	return k;
}

/* Grows one table of n_old to n_new elements of sz bytes, new ones filled with byte `fill`.
   The tables a call reads at random live in table memory (huge.h). */
static int grow(void **p, size_t n_old, size_t n_new, size_t sz, int fill)
{
	void *q = kvt_huge_realloc(*p, n_new * sz);

	if (!q)
		return -ENOMEM;
	memset((uint8_t *)q + n_old * sz, fill, (n_new - n_old) * sz);
	*p = q;
	return 0;
}

/* Capacity for n blocks, doubling from cap (8 when none). */
static size_t cap_for(size_t cap, uint32_t n)
{
	cap = cap ? cap : 8;
	while (cap < n)
		cap *= 2;
	return cap;
}

/* Orders the copy of a region's device tables into larger ones, queued on stream, with the
   programs: after the latest one (a program of another layer may have dropped slots of the
   region, on another stream, and forgotten their keys) and before the next (which writes the
   new tables). before: ahead of the copy, else behind it. 0 or the error. Nothing to order
   while the programs keep no regions on the device. */
static int dtables_order(struct kvt_manager *m, void *stream, bool before)
{
	return m->dev_regions ? m->ops->region_order(m->be, stream, before) : 0;
}

/* The device copy of the layer's metadata and key table with room for n_blocks blocks: a new
   one takes the old one's contents on stream, in order with the programs (dtables_order; the
   old one goes back to the backend once the device is done with it). 0 or the error, nothing
   changed. */
static int dmeta_grow(struct kvt_manager *m, struct kvt_recall_layer *rc, uint32_t n_blocks,
		      void *stream)
{
	uint64_t H = m->cfg.n_kv_heads, mb = m->meta_bytes, kb = sizeof(struct kvt_region_key);
	uint64_t want = cap_for(rc->dcap, n_blocks), addr, old_key;
	int err;

	if (n_blocks <= rc->dcap)
		return 0;
	if (want > UINT32_MAX)
		return kvt_be_fail(m->be, -ENOMEM, "block metadata of %u blocks", n_blocks);
	err = m->ops->dmem_alloc(m->be, dmeta_size(m, want), stream, &addr);
	if (err)
		return err;
	if (rc->dmeta) {
		old_key = kvt_dkey(m, rc);
		err = dtables_order(m, stream, true);
		if (!err)
			err = m->ops->dmem_copy(m->be, addr, rc->dmeta, NULL, rc->dcap * H * mb,
						stream);
		if (!err)
			err = m->ops->dmem_copy(m->be, addr + want * H * mb, old_key, NULL,
						rc->dcap * H * kb, stream);
		if (!err && m->dev_regions)
			err = m->ops->dmem_copy(m->be, addr + want * H * (mb + kb),
						kvt_dgroup(m, rc), NULL,
						rc->dcap * sizeof(uint64_t), stream);
		if (!err)
			err = dtables_order(m, stream, false);
		if (err) {
			m->ops->dmem_free(m->be, addr);
			return err;
		}
		m->ops->dmem_free(m->be, rc->dmeta);
		m->dmeta_bytes -= dmeta_size(m, rc->dcap);
	}
	m->dmeta_bytes += dmeta_size(m, want);
	rc->dmeta = addr;
	rc->dcap = (uint32_t)want;
	rc->dver = ++m->rc.dver_seq;
	return 0;
}

/* The recall states of a layer lie together, by sequence slot (kvt_seq.slot), in chunks of this
   many: a layer's call walks its members' states through one stretch of memory, not one
   allocation per sequence apart from the others. Until 2026-12-07 each state was an allocation
   of its own, made at the sequence's prefill, so a sequence's layers lay side by side and the
   members of one layer's call about 156 KiB apart: a cold line each that no prefetch hid on the
   2-core VM. Laid out by layer, kvtier-bench recall --backend cuda (256 x 32 x 8, r = 16) took
   8-20% less host time a step (1.85-2.22 against 2.06-2.54 ms, alternating). */
#define RC_CHUNK 64u

/* Where the recall state of slot `slot`'s layer `layer` lies, NULL while its chunk is not
   made. */
static inline struct kvt_recall_layer *rc_place(const struct kvt_recall_cache *c, uint32_t slot,
						uint32_t layer)
{
	uint32_t k = slot / RC_CHUNK;

	return c->slab && k < c->slab_chunks && c->slab[layer][k]
		       ? c->slab[layer][k] + slot % RC_CHUNK
		       : NULL;
}

/* Where the recall state of slot `slot`'s layer `layer` lies (zeroed while no sequence holds
   it): the layer's chunk of it made, the layers' tables grown as needed. NULL: no memory
   (nothing else changed but room). */
static struct kvt_recall_layer *rc_slot(struct kvt_manager *m, uint32_t slot, uint32_t layer)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t k = slot / RC_CHUNK, L = m->cfg.n_layers;
	struct kvt_recall_layer **t;

	if (!c->slab && !(c->slab = kvt_calloc(L, sizeof(*c->slab))))
		return NULL;
	if (k >= c->slab_chunks) {
		uint32_t want = c->slab_chunks ? 2 * c->slab_chunks : 4;

		if (want <= k)
			want = k + 1;
		/* each layer's table grown; one that failed leaves the count as it was (those
		   grown keep their room, nothing named past it) */
		for (uint32_t l = 0; l < L; l++) {
			t = kvt_realloc(c->slab[l], (size_t)want * sizeof(*t));
			if (!t)
				return NULL;
			memset(t + c->slab_chunks, 0, (size_t)(want - c->slab_chunks) * sizeof(*t));
			c->slab[l] = t;
		}
		c->slab_chunks = want;
	}
	t = c->slab[layer];
	/* the chunk's states, then their working sets' buckets (rc_bucket) */
	if (!t[k] &&
	    !(t[k] = kvt_huge_calloc(RC_CHUNK, sizeof(**t) + m->cfg.ws_window * sizeof(uint32_t))))
		return NULL;
	return rc_place(c, slot, layer);
}

/* The working-set buckets ([ws_window]) of the recall state of slot `slot`'s layer `layer`,
   after its chunk's states: those of a layer's members lie together, as the states do.
   Zeroed while no sequence's first recall of the layer has taken them (rc->ws.bucket NULL). */
static inline uint32_t *rc_bucket(const struct kvt_manager *m, uint32_t slot, uint32_t layer)
{
	const struct kvt_recall_cache *c = &m->rc;

	return (uint32_t *)(c->slab[layer][slot / RC_CHUNK] + RC_CHUNK) +
	       (size_t)(slot % RC_CHUNK) * m->cfg.ws_window;
}

/* rc_layer_get's work when the state is missing or its tables are too small. */
static int rc_layer_grow(struct kvt_manager *m, struct kvt_seq_layer *ly, uint32_t slot,
			 uint32_t layer, uint32_t n_blocks, void *stream)
{
	struct kvt_recall_layer *rc = ly->rc;
	size_t H = m->cfg.n_kv_heads, old, want;

	if (!rc) {
		rc = rc_slot(m, slot, layer);
		if (!rc)
			return kvt_be_fail(m->be, -ENOMEM, "no memory for the recall state");
		/* no other sequence holds it (kvt_recall_layer_free zeroed it) */
		if (NEVER(rc->rg.head != 0 || rc->rg.cap_blocks != 0))
			return kvt_be_fail(m->be, -EEXIST, "recall state of slot %u in use", slot);
		rc->rg.head = rc->rg.tail = KVT_REGION_PENDING;
		rc->n_spilled = count_spilled(ly); /* then kept by the spill tier */
		ly->rc = rc;
	}
	if (m->dev_meta) {
		int err = dmeta_grow(m, rc, n_blocks, stream);

		if (err)
			return err;
	}
	if (n_blocks <= rc->rg.cap_blocks)
		return 0;
	old = rc->rg.cap_blocks;
	want = cap_for(old, n_blocks);
	if ((m->keep_meta && !m->dev_meta &&
	     grow((void **)&rc->meta, old * H, want * H, m->meta_bytes, 0)) ||
	    grow((void **)&rc->rg.key, old * H, want * H, sizeof(*rc->rg.key), 0))
		/* the tables that grew keep their contents: still consistent */
		return kvt_be_fail(m->be, -ENOMEM, "no memory for the tables of %u blocks",
				   n_blocks);
	rc->rg.cap_blocks = (uint32_t)want;
	return 0;
}

/* The recall state of ly (layer `layer` of the sequence of slot `slot`, or a prefill's copy of
   it) with room for n_blocks blocks (capacity only: nothing a caller can see changes); a device
   copy of its metadata grows on stream. 0 or -ENOMEM. Every recall call asks for each member:
   the tables almost always fit. */
static inline int rc_layer_get(struct kvt_manager *m, struct kvt_seq_layer *ly, uint32_t slot,
			       uint32_t layer, uint32_t n_blocks, void *stream)
{
	const struct kvt_recall_layer *rc = ly->rc;

	if (rc && n_blocks <= rc->rg.cap_blocks && (!m->dev_meta || n_blocks <= rc->dcap))
		return 0;
	return rc_layer_grow(m, ly, slot, layer, n_blocks, stream);
}

/* The host's slot arrays of a region (rg.slot, rg.link, frame) with room for n slots, their
   contents kept. 0 or -ENOMEM. */
static int rc_host_slots(struct kvt_recall_layer *rc, uint32_t n)
{
	if (n <= rc->hcap_slots)
		return 0;
	if (grow((void **)&rc->rg.slot, rc->hcap_slots, n, sizeof(*rc->rg.slot), 0) ||
	    grow((void **)&rc->rg.link, rc->hcap_slots, n, sizeof(*rc->rg.link), 0) ||
	    grow((void **)&rc->frame, rc->hcap_slots, n, sizeof(*rc->frame), 0))
		return -ENOMEM; /* (those that grew keep their contents) */
	rc->hcap_slots = n;
	return 0;
}

/* Room for n slots in the layer's region (capacity only), doubling. On the host its slot
   arrays grow; on the device (dev_regions) only the count, which its device tables follow
   (dreg_reserve): the host's copies are made when it is read back (pull_unpack), so a step on
   the device never grows host memory for them (8,192 regions growing at once cost a step 60 ms
   and more at 256 x 32, mostly fresh pages, 2026-12-05). 0 or -ENOMEM. */
static int rc_slots_reserve(struct kvt_manager *m, struct kvt_recall_layer *rc, uint32_t n)
{
	uint32_t want;

	if (n <= rc->cap_slots)
		return 0;
	want = rc->cap_slots ? rc->cap_slots : 16;
	while (want < n)
		want *= 2;
	if (want > KVT_REGION_MAX_SLOTS)
		want = KVT_REGION_MAX_SLOTS;
	if (!m->dev_regions && rc_host_slots(rc, want))
		return -ENOMEM;
	rc->cap_slots = want;
	return 0;
}

/* The device copy of a region kept there with room for scap slots and vcap view entries per
   head: a new one takes the old one's parts on stream, in order with the programs
   (dtables_order), without waiting for them. 0 or the error (nothing changed). */
static int dreg_reserve(struct kvt_manager *m, struct kvt_recall_layer *rc, uint32_t scap,
			uint32_t vcap, void *stream)
{
	struct dreg_layout o, l;
	uint64_t addr;
	int err;

	if (scap <= rc->dscap && vcap <= rc->dvcap)
		return 0;
	scap = scap > rc->dscap ? scap : rc->dscap;
	vcap = vcap > rc->dvcap ? vcap : rc->dvcap;
	o = dreg_layout(m, rc->dscap, rc->dvcap);
	l = dreg_layout(m, scap, vcap);
	err = m->ops->dmem_alloc(m->be, l.bytes, stream, &addr);
	if (err)
		return err;
	if (rc->dreg) {
		err = dtables_order(m, stream, true);
		if (!err)
			err = m->ops->dmem_copy(
				m->be, addr + l.slot, rc->dreg + o.slot, NULL,
				(uint64_t)rc->dscap * sizeof(struct kvt_region_slot), stream);
		if (!err)
			err = m->ops->dmem_copy(m->be, addr + l.frame, rc->dreg + o.frame, NULL,
						(uint64_t)rc->dscap * sizeof(uint32_t), stream);
		if (!err) /* view_n and the view, laid out the same (the stride is a call's r) */
			err = m->ops->dmem_copy(m->be, addr + l.view_n, rc->dreg + o.view_n, NULL,
						o.bytes - o.view_n, stream);
		if (!err)
			err = dtables_order(m, stream, false);
		if (err) {
			m->ops->dmem_free(m->be, addr);
			return err;
		}
		m->ops->dmem_free(m->be, rc->dreg);
		m->dmeta_bytes -= o.bytes;
	}
	m->dmeta_bytes += l.bytes;
	rc->dreg = addr;
	rc->dscap = scap;
	rc->dvcap = vcap;
	rc->dver = ++m->rc.dver_seq;
	return 0;
}

/* Where a recall call's selection comes from: given in host memory (kvt_recall_blocks), made by
   Quest scoring (kvt_decode_recall: on the host, or on the device with no host copy), or given
   in the backend's device memory (kvt_recall_device_blocks), which the host does not read when
   the regions are on the device. */
enum sel_kind { SEL_GIVEN, SEL_QUEST, SEL_DEVICE };

/* ---- regions on the device (dev_regions) ---- */

/* A region's counts and working set as a call's program carries them (struct kvt_gpu_region's
   clock, n_slots, n_load, err, tally and ws point here): written by the host, run on, and
   read back. */
struct dcell {
	uint32_t clock, n_slots, n_load;
	int32_t err;
	struct kvt_region_tally tally;
	struct kvt_ws ws; /* bucket: the cell's buckets in the program */
};

/* Where a program of n members, nc cells (members first, then the other regions that drop),
   nd drops, ng grows, r entries per head and H heads has its parts (the Quest descriptors
   when the call scores: quest). The members' loads and descriptors come first, at places that
   depend on n, H and r only (dev_run keeps the descriptors of a lane's previous call). [rd0,
   rd) is read back, [up0, up) uploaded ([up0, sel_end) with the selection when the host gives
   it), the rest is the device's. */
struct prog_layout {
	uint64_t load, rg;
	uint64_t cell, bucket, gone, stale, missing, fresh, rd; /* read back */
	uint64_t drg, grg, qs, drop_k, drop_off, grow_n, grow_off, gat, gval, up;
	uint64_t sel, sel_end, pairs, fix, bytes;
	uint64_t rd0, up0;
};

static struct prog_layout prog_layout(const struct kvt_manager *m, uint64_t n, uint64_t nc,
				      uint64_t nd, uint64_t ng, uint64_t r, uint64_t gup,
				      bool quest)
{
	uint64_t H = m->cfg.n_kv_heads, w = m->cfg.ws_window;
	struct prog_layout l = {.load = 0};

	l.rg = ALIGN16(n * H * r * sizeof(struct kvt_region_load));
	/* the members' buckets and cells at places that depend on n, H and r only: a member
	   at the place it had in the lane's previous call finds its own there (in_lane) */
	l.bucket = ALIGN16(l.rg + n * sizeof(struct kvt_gpu_region));
	l.cell = ALIGN16(l.bucket + n * w * sizeof(uint32_t));
	l.gone = ALIGN16(l.cell + nc * sizeof(struct dcell));
	l.stale = ALIGN16(l.gone + nd * sizeof(uint32_t));
	l.missing = ALIGN16(l.stale + nd * sizeof(uint32_t));
	l.fresh = l.missing + sizeof(uint32_t);
	l.rd = ALIGN16(l.fresh + sizeof(uint32_t));
	l.drg = l.rd;
	l.grg = ALIGN16(l.drg + nd * sizeof(struct kvt_gpu_region));
	l.qs = ALIGN16(l.grg + ng * sizeof(struct kvt_gpu_region));
	l.drop_k = ALIGN16(l.qs + (quest ? n * sizeof(struct kvt_gpu_quest) : 0));
	l.drop_off = ALIGN16(l.drop_k + nd * sizeof(uint32_t));
	l.grow_n = ALIGN16(l.drop_off + nd * sizeof(uint32_t));
	l.grow_off = ALIGN16(l.grow_n + ng * sizeof(uint32_t));
	l.gat = ALIGN16(l.grow_off + ng * sizeof(uint32_t));
	l.gval = l.gat + gup * sizeof(uint64_t);
	l.up = ALIGN16(l.gval + gup * sizeof(uint64_t));
	l.sel = l.up;
	l.sel_end = ALIGN16(l.sel + n * H * r * sizeof(uint32_t));
	l.pairs = l.sel_end;
	/* with a disk tier, dev_repair's group entries: [n * H * r] addresses, then values */
	l.fix = ALIGN16(l.pairs + n * H * r * 2 * sizeof(uint32_t));
	l.bytes = ALIGN16(l.fix + (m->disk ? n * H * r * 2 * sizeof(uint64_t) : 0));
	l.rd0 = l.bucket;
	l.up0 = l.rg;
	return l;
}

/* ---- Settling ----
   A call's program is queued without a wait: its reads (each member's clock, working set and
   tally, what the drops forgot, the stale views they made) land in the lane's pinned buffer
   when the device gets there, and are applied when the call is settled. That is at the
   layer's next call, before anything reads them (its members' working sets are counted a
   step late in any case), or earlier for whatever reads the host's counts of every region:
   the figures, the views, a sequence given back, a check. Calls are settled in the order
   they were made, so the latest verdict on a view is the one that stands: a call's on the
   views it made, a later drop's on the views it made stale. (A layer's call settles the
   layer's previous one before it makes new views.) */

/* What the members' descriptors of a call read besides their regions' tables and tokens: the
   program's device buffer, the call's selection, r, and n (which with r sets the places of
   the members' cells and loads: prog_layout). */
struct desc_key {
	uint64_t dcall, sel;
	uint32_t n, r;
};

/* A call made and not yet settled (lane[layer]). */
struct kvt_dlane {
	bool pending;
	bool repair;   /* settled at once, its loads of spilled blocks repaired (dev_repair) */
	void *stream;  /* the call's, while repair */
	uint8_t *blob; /* the lane's pinned buffer (region_host), blob_cap bytes */
	uint64_t blob_cap;
	struct prog_layout l;
	uint32_t n, nd, r, cap;
	uint64_t stamp; /* the call's (m->stamp) */
	bool dsel; /* the selection was the caller's (SEL_DEVICE): a member's -EINVAL is its own */
	struct kvt_recall_layer **rc; /* [n + nd]: the members, then the regions that dropped */
	uint32_t *n_slots;	      /* [n]: the members' slot counts after the sizing */
	/* The members' descriptors stay in the blob from one call to the next: the one at place
	   i was written from region tables of version dver[i], in a program keyed desc (zero:
	   none kept); dev_run rewrites only their tokens while both still hold. */
	uint64_t *dver;
	struct desc_key desc;
};

/* Region rc's clock and working set where its latest device call left them: in its lane's
   buffer (in_lane), which the call's read-back wrote, until a reader on the host wants them
   here (settled first: the lane's buffer holds the read-back once its call is settled).
   Settling a call copies none of them, and a call that finds a member at the place it had
   in the lane's previous call sends them from there again (dev_run). */
static void rc_sync(struct kvt_manager *m, struct kvt_recall_layer *rc)
{
	const struct kvt_dlane *ln;
	const struct dcell *e;
	uint32_t w = m->cfg.ws_window;

	if (!rc->in_lane)
		return;
	ln = &m->rc.lane[rc->layer];
	rc->in_lane = false;
	if (NEVER(ln->pending) || NEVER(rc->lcell >= ln->n))
		return;
	e = (const struct dcell *)(ln->blob + ln->l.cell) + rc->lcell;
	rc->rg.clock = e->clock;
	rc->ws.step = e->ws.step;
	rc->ws.cur = e->ws.cur;
	rc->ws.total = e->ws.total;
	memcpy(rc->ws.bucket, (const uint32_t *)(ln->blob + ln->l.bucket) + (size_t)rc->lcell * w,
	       (size_t)w * sizeof(*rc->ws.bucket));
	rc->ws_next = rc->ws.total;
}

/* rc->ws_next as rc_sync would make it, without copying the rest. */
static inline uint32_t rc_ws_next(const struct kvt_manager *m, const struct kvt_recall_layer *rc)
{
	const struct kvt_dlane *ln;

	if (!rc->in_lane)
		return rc->ws_next;
	ln = &m->rc.lane[rc->layer];
	return ((const struct dcell *)(ln->blob + ln->l.cell))[rc->lcell].ws.total;
}

/* Before lane's buffer is written again or given up: the regions whose state is in it
   (rc_sync), but those at the places of keep[] (NULL: none), which take the same places. */
static void lane_sync(struct kvt_manager *m, struct kvt_dlane *ln,
		      struct kvt_recall_layer *const *keep)
{
	for (uint32_t i = 0; i < ln->n; i++) {
		struct kvt_recall_layer *rc = ln->rc[i];

		/* (kept: its state is not read, so a steady call's pass reads two arrays; a region
		   given back since: its state cleared, in_lane with it) */
		if (!(keep && keep[i] == rc) && rc->in_lane && rc->lcell == i &&
		    &m->rc.lane[rc->layer] == ln)
			rc_sync(m, rc);
	}
}

/* Frees the lanes' tables (their pinned buffers are the backend's). */
static void lanes_free(struct kvt_manager *m)
{
	struct kvt_recall_cache *c = &m->rc;

	for (uint32_t l = 0; c->lane && l < m->cfg.n_layers; l++) {
		free(c->lane[l].rc);
		free(c->lane[l].n_slots);
		free(c->lane[l].dver);
	}
	free(c->lane);
	free(c->fifo);
}

/* Room for the program of a call of n members among at most nx regions that may drop (its
   device buffer, layer's lane with its pinned upload of gup group addresses and more, and the
   stack, set up at the first call), before the sizing changes anything; settles the layer's
   pending call. 0 or the error, recorded. */
static int prog_reserve(struct kvt_manager *m, uint32_t layer, uint32_t n, uint32_t nx, uint32_t r,
			uint64_t gup, void *stream)
{
	struct kvt_recall_cache *c = &m->rc;
	struct prog_layout l = prog_layout(m, n, n + (uint64_t)nx, nx, n, r, gup, true);
	/* and dev_drop_seq's program: a clear per layer */
	uint64_t up = prog_layout(m, 0, m->cfg.n_layers, m->cfg.n_layers, 0, 0, 0, false).up, addr;
	struct kvt_dlane *ln;
	int err;

	if (!c->lane) {
		c->lane = kvt_calloc(m->cfg.n_layers, sizeof(*c->lane));
		c->fifo = kvt_calloc(m->cfg.n_layers, sizeof(*c->fifo));
		if (!c->lane || !c->fifo) {
			free(c->lane);
			free(c->fifo);
			c->lane = NULL;
			c->fifo = NULL;
			return kvt_fail(m, -ENOMEM, "recall: no memory for the lanes");
		}
	}
	ln = &c->lane[layer];
	if (NEVER(ln->pending)) /* recall_core settled it */
		return kvt_fail(m, -EBUSY, "recall: layer %u has a call pending", layer);
	if (n + (uint64_t)nx > UINT32_MAX)
		return kvt_fail(m, -ENOMEM, "recall: no memory for a call's program");
	if (n + nx > ln->cap) {
		uint32_t c1 = ln->cap, c2 = ln->cap, c3 = ln->cap;

		if (kvt_reserve((void **)&ln->rc, &c1, n + nx, sizeof(*ln->rc)) ||
		    kvt_reserve((void **)&ln->n_slots, &c2, n + nx, sizeof(*ln->n_slots)) ||
		    kvt_reserve((void **)&ln->dver, &c3, n + nx, sizeof(*ln->dver)))
			return kvt_fail(m, -ENOMEM, "recall: no memory for a call's program");
		ln->cap = c1 < c2 ? c1 : c2;
		ln->cap = ln->cap < c3 ? ln->cap : c3;
	}
	/* the host side holds all of it (dev_undo reads the loads back) */
	if (l.bytes > ln->blob_cap) {
		void *host;

		lane_sync(m, ln, NULL); /* the buffer goes */
		err = KVT_XFER(m, region_host, layer + 1, l.bytes, &host);
		if (err)
			return kvt_fail(m, err, "recall: no pinned memory for a call's program: %s",
					m->be->err);
		ln->blob = host;
		ln->blob_cap = l.bytes;
		ln->desc = (struct desc_key){0}; /* it keeps no descriptors */
	}
	if (!c->dstack_ready) {
		if (!c->dstack) {
			err = KVT_XFER(m, dmem_alloc, (uint64_t)c->n * sizeof(*c->free), stream,
				       &c->dstack);
			if (err)
				return kvt_fail(m, err,
						"recall: no device memory for the free "
						"frames: %s",
						m->be->err);
			m->dmeta_bytes += (uint64_t)c->n * sizeof(*c->free);
		}
		err = KVT_XFER(m, dmem_copy, c->dstack, 0, c->free,
			       (uint64_t)c->n_free * sizeof(*c->free), stream);
		if (err)
			return kvt_fail(m, err, "recall: the free frames: %s", m->be->err);
		c->dstack_ready = true;
	}
	if (l.bytes < up)
		l.bytes = up;
	if (l.bytes > c->dcall_cap) {
		uint64_t cap = c->dcall_cap ? c->dcall_cap : 1 << 16;

		while (cap < l.bytes)
			cap *= 2;
		err = KVT_XFER(m, dmem_alloc, cap, stream, &addr);
		if (err)
			return kvt_fail(m, err, "recall: no device memory for a call's program: %s",
					m->be->err);
		m->ops->dmem_free(m->be, c->dcall);
		m->dmeta_bytes += cap - c->dcall_cap;
		c->dcall = addr;
		c->dcall_cap = cap;
	}
	/* and room for dev_drop_seq's clears of one sequence, in pageable memory (it waits) */
	if (gup > UINT32_MAX || kvt_reserve((void **)&c->hblob, &c->hblob_cap, (uint32_t)up, 1))
		return kvt_fail(m, -ENOMEM, "recall: no memory for a call's program");
	return 0;
}

/* The Quest descriptor of a layer whose metadata and top-K counts are on the device. */
static struct kvt_gpu_quest quest_desc(const struct kvt_manager *m, const struct kvt_seq_layer *ly)
{
	return (struct kvt_gpu_quest){
		.meta = (const void *)(uintptr_t)ly->rc->dmeta,
		.key = (const struct kvt_region_key *)(uintptr_t)kvt_dkey(m, ly->rc),
		.n_tokens = ly->n_tokens,
		.sink = m->cfg.sink_tokens,
		.ring0 = kvt_ring0(m, ly->n_tokens),
	};
}

/* The first block of region rc's layer, of nb blocks, that its device group table has not
   seen: a program writes the entries from it on, and those of the moved blocks below it. (A
   block's host group changes only when it is spilled or read back, which lists it as moved:
   the decode appends write a block's tokens into the group it was given, and the prefix spans
   a sequence shares are whole blocks below its prompt's end, never written again.) */
static inline uint32_t dgroup_from(const struct kvt_recall_layer *rc, uint32_t nb)
{
	return rc->dgroups < nb ? rc->dgroups : nb;
}

/* The group-table entries a program of region rc's layer, of nb blocks, writes (dgroup_from). */
static uint32_t dgroup_writes(const struct kvt_recall_layer *rc, uint32_t nb)
{
	uint32_t from = dgroup_from(rc, nb), k = nb - from;

	for (uint32_t x = 0; x < rc->n_moved; x++)
		k += rc->moved[x] < from;
	return k;
}

/* Writes entry b of rc's device group table (the block's host group, 0 when spilled) into a
   program's lists at *n. */
static void dgroup_write(const struct kvt_manager *m, const struct kvt_recall_layer *rc,
			 const struct kvt_seq_layer *ly, uint32_t b, uint64_t *gat, uint64_t *gval,
			 uint32_t *n)
{
	gat[*n] = kvt_dgroup(m, rc) + (uint64_t)b * sizeof(uint64_t);
	gval[(*n)++] = kvt_dgroup_val(m, ly->groups[b]);
}

/* Writes to *out the descriptor of region rc in a program: its state, its cell x's counts and
   working set (ws: a member's), member i's selection (its part of the call's [n][H][r] at
   device address sel) and loads (i < n), its layer's N tokens (0 for a region that only drops
   or grows), view stride vr. */
static void dev_desc(struct kvt_gpu_region *out, const struct kvt_manager *m,
		     const struct kvt_recall_layer *rc, const struct prog_layout *l, uint32_t x,
		     uint32_t i, uint32_t n, uint32_t N, uint32_t vr, uint32_t r, uint64_t sel)
{
	struct dreg_layout g = dreg_layout(m, rc->dscap, rc->dvcap);
	uint64_t H = m->cfg.n_kv_heads, cell = m->rc.dcall + l->cell + x * sizeof(struct dcell);

#define DEV(t, a) ((t)(uintptr_t)(a))
	/* field by field: an initializer would clear the whole descriptor first (a rep stos a
	   member), then write it again; every field is written (the size below says none was
	   added since) */
	_Static_assert(sizeof(struct kvt_gpu_region) == 15 * 8 + 8 * 4,
		       "dev_desc writes each field of struct kvt_gpu_region");
	out->slot = DEV(struct kvt_region_slot *, rc->dreg + g.slot);
	out->key = DEV(struct kvt_region_key *, kvt_dkey(m, rc));
	out->clock = DEV(uint32_t *, cell + offsetof(struct dcell, clock));
	out->n_slots = DEV(uint32_t *, cell + offsetof(struct dcell, n_slots));
	out->frame = DEV(uint32_t *, rc->dreg + g.frame);
	out->ws = i < n ? DEV(struct kvt_ws *, cell + offsetof(struct dcell, ws)) : NULL;
	out->sel = i < n ? DEV(const uint32_t *, sel + i * H * r * 4) : NULL;
	out->view = DEV(uint32_t *, rc->dreg + g.view);
	out->view_n = DEV(uint32_t *, rc->dreg + g.view_n);
	out->load = i < n ? DEV(struct kvt_region_load *,
				m->rc.dcall + l->load + i * H * r * sizeof(struct kvt_region_load))
			  : NULL;
	out->n_load = DEV(uint32_t *, cell + offsetof(struct dcell, n_load));
	out->tally = DEV(struct kvt_region_tally *, cell + offsetof(struct dcell, tally));
	out->err = DEV(int32_t *, cell + offsetof(struct dcell, err));
	out->stale = NULL;
	out->group = DEV(const uint64_t *, kvt_dgroup(m, rc));
	out->n_heads = (uint32_t)H;
	out->r = vr;
	out->lbt = m->lbt;
	out->n_tokens = N;
	out->sink = m->cfg.sink_tokens;
	out->ring0 = kvt_ring0(m, N);
	out->cap_blocks = rc->dcap;
#undef DEV
}

/* Counts the layer's top-K positions per (block, head) once, so "is this block fully
   resident" costs O(1) on the recall path. Needs tables covering the prompt's blocks. A
   head's positions ascend strictly (topk_in_order), so block b's are those from i on below
   the next block's first position, at most as many as that position's distance from t[i]:
   one test finds the end of a block whose positions are all kept, a halving search the
   others. */
static void tk_count(const struct kvt_manager *m, const struct kvt_seq *s, struct kvt_seq_layer *ly)
{
	uint32_t H = m->cfg.n_kv_heads, K = s->valid_topk;

	for (uint32_t h = 0; K && h < H; h++) { /* (no top-K: topk may be NULL) */
		const int32_t *t = ly->topk + (size_t)h * K;

		for (uint32_t i = 0, j; i < K; i = j) {
			uint32_t b = (uint32_t)t[i] >> m->lbt, end = (b + 1) << m->lbt;
			/* positions from i that can be in block b (they ascend strictly) */
			uint32_t n = end - (uint32_t)t[i] < K - i ? end - (uint32_t)t[i] : K - i;

			/* all n in block b: one test; else the halving search */
			j = i + ((uint32_t)t[i + n - 1] < end ? n : kvt_topk_lower(t + i, n, end));
			ly->rc->rg.key[(size_t)b * H + h].tk += (uint8_t)(j - i);
		}
	}
	ly->rc->tk_ready = true;
	ly->rc->qsettled = 0; /* quest_need's counts read the top-K counts */
	if (ly->rc->qcand)
		memset(ly->rc->qcand, 0, H * sizeof(*ly->rc->qcand));
}

/* The region geometry of a layer holding N tokens. */
static inline struct kvt_region_geom geom_of(const struct kvt_manager *m, uint32_t N)
{
	return (struct kvt_region_geom){
		.n_heads = m->cfg.n_kv_heads,
		.lbt = m->lbt,
		.n_tokens = N,
		.sink = m->cfg.sink_tokens,
		.ring0 = kvt_ring0(m, N),
	};
}

int kvt_meta_reserve(struct kvt_manager *m, const struct kvt_seq *s, uint32_t layer,
		     struct kvt_seq_layer *ly, uint32_t n_blocks, void *stream)
{
	return rc_layer_get(m, ly, s->slot, layer, n_blocks, stream);
}

int kvt_meta_prefill(struct kvt_manager *m, const struct kvt_seq *s, uint32_t layer,
		     struct kvt_seq_layer *ly, const void *k, uint32_t L)
{
	const struct kvt_config *c = &m->cfg;
	uint32_t nb = DIV_UP(L, c->block_tokens);
	int err = rc_layer_get(m, ly, s->slot, layer, nb, NULL);

	if (err)
		return err;
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		const uint8_t *rows = (const uint8_t *)k + (size_t)h * L * m->row_bytes;

		for (uint32_t b = 0; b < nb; b++) {
			uint32_t p0 = b * c->block_tokens;
			uint32_t n = L - p0 < c->block_tokens ? L - p0 : c->block_tokens;

			kvt_meta_build(c->dtype, c->head_dim,
				       ly->rc->meta +
					       ((size_t)b * c->n_kv_heads + h) * m->meta_bytes,
				       rows + (size_t)p0 * m->row_bytes, m->row_bytes, n);
		}
	}
	ly->rc->meta_n = L;
	return 0;
}

int kvt_meta_catch_up(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly)
{
	const struct kvt_config *c = &m->cfg;
	struct kvt_recall_layer *rc = ly->rc;
	int err;

	if (rc->meta_n >= ly->n_tokens)
		return 0;
	err = m->ops->save_wait(m->be, s->save_ticket);
	if (err)
		return kvt_fail(m, err, "recall: sequence %llu: its saves: %s",
				(unsigned long long)s->id, m->be->err);
	/* Ascending positions, as the tokens arrived: the same result as folding each at its
	   append. */
	for (uint32_t pos = rc->meta_n; pos < ly->n_tokens; pos++) {
		uint8_t *meta = rc->meta + (size_t)(pos >> m->lbt) * c->n_kv_heads * m->meta_bytes;
		bool first = (pos & (c->block_tokens - 1)) == 0;

		for (uint32_t h = 0; h < c->n_kv_heads; h++, meta += m->meta_bytes) {
			const void *k = (const void *)(uintptr_t)kvt_host_row(m, ly, h, pos);

			if (first)
				kvt_meta_init(c->dtype, c->head_dim, meta, k);
			else
				kvt_meta_add(c->dtype, c->head_dim, meta, k);
		}
	}
	rc->meta_n = ly->n_tokens;
	return 0;
}

/* Whether the key table of a layer's recall state says block b of head h holds no top-K
   position (so that no search of the top-K list is needed): known once its top-K counts are
   (at the first recall, on the CPU or the device; a region on the device's copy is read with
   its views, kvt_recall_pull), for the blocks the table covers there. */
static inline bool tk_none(const struct kvt_manager *m, const struct kvt_recall_layer *rc,
			   uint32_t h, uint32_t b)
{
	uint32_t nb;

	if (!rc || !(m->dev_regions ? rc->dtk : rc->tk_ready))
		return false;
	nb = m->dev_regions && rc->dcap < rc->rg.cap_blocks ? rc->dcap : rc->rg.cap_blocks;
	return b < nb && rc->rg.key[(size_t)b * m->cfg.n_kv_heads + h].tk == 0;
}

uint64_t kvt_block_resident(const struct kvt_manager *m, const struct kvt_seq *s,
			    const struct kvt_seq_layer *ly, uint32_t h, uint32_t b,
			    uint32_t n_valid)
{
	uint32_t sink = m->cfg.sink_tokens, N = ly->n_tokens, ring0 = kvt_ring0(m, N);
	uint32_t p0 = b << m->lbt, end = p0 + n_valid;
	uint64_t mask = 0;

	if (s->preempted)
		return 0;
	if (p0 < sink) {
		uint32_t e = end < sink ? end : sink;

		mask |= e - p0 >= 64 ? ~0ull : ((1ull << (e - p0)) - 1);
	}
	if (end > ring0) {
		uint32_t a = ring0 > p0 ? ring0 - p0 : 0, e = (N < end ? N : end) - p0;

		if (e > a)
			mask |= (e - a >= 64 ? ~0ull : ((1ull << (e - a)) - 1)) << a;
	}
	if (s->valid_topk && end > sink && p0 < ring0 && !tk_none(m, ly->rc, h, b)) {
		const int32_t *t = ly->topk + (size_t)h * s->valid_topk;
		uint32_t lo = kvt_topk_lower(t, s->valid_topk, p0);

		for (; lo < s->valid_topk && (uint32_t)t[lo] < end; lo++)
			mask |= 1ull << ((uint32_t)t[lo] - p0);
	}
	return mask;
}

/* ---- working set ---- */

uint32_t kvt_ws_frames(struct kvt_manager *m, struct kvt_seq *s, uint32_t t, uint32_t *step_frames)
{
	uint32_t total = 0;

	*step_frames = 0;
	(void)kvt_recall_settle(m); /* the working sets the device counted */
	for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
		struct kvt_ws *ws = s->layers[l].rc ? &s->layers[l].rc->ws : NULL;

		if (!ws || !ws->bucket)
			continue;
		rc_sync(m, s->layers[l].rc); /* (it moves the window on) */
		kvt_ws_advance(ws, t);
		if (ws->step == t)
			*step_frames += ws->bucket[ws->cur];
		total += ws->total;
	}
	return total;
}

/* ---- the cache ---- */

/* Sets (on) or clears the bits of m->rc.named of the slots the layer's latest view names. The
   view's entries are slot indices, below KVT_REGION_MAX_SLOTS. */
static void view_name(struct kvt_manager *m, const struct kvt_recall_layer *rc, bool on)
{
	uint64_t *nm = m->rc.named;

	for (uint32_t h = 0; rc->view_n && h < m->cfg.n_kv_heads; h++)
		for (uint32_t x = 0; x < rc->view_n[h]; x++) {
			uint32_t s = rc->view[(size_t)h * rc->view_cap + x];

			if (NEVER(s >= KVT_REGION_MAX_SLOTS))
				continue;
			if (on)
				nm[s / 64] |= 1ull << (s % 64);
			else
				nm[s / 64] &= ~(1ull << (s % 64));
		}
}

/* Whether slot i is in the latest view (after view_name(..., true)). */
static inline bool view_named(const struct kvt_manager *m, uint32_t i)
{
	return i < KVT_REGION_MAX_SLOTS && (m->rc.named[i / 64] >> (i % 64) & 1);
}

static void region_unlink(struct kvt_manager *m, struct kvt_recall_layer *rc);

/* Keeps a sequence's part of the sums as last frozen (kvt_recall_freeze) before it changes:
   the freeze copies the cache's and the layers' sums, O(layers), and each sequence's on its
   first change after it. */
static inline void ws_freeze(const struct kvt_recall_cache *c, struct kvt_seq *s)
{
	if (s->ws_snap_at != c->snap_at) {
		s->ws_snap = s->ws_counted;
		s->ws_snap_at = c->snap_at;
	}
}

/* A sequence's part of the sums as last frozen. */
static inline uint64_t ws_frozen(const struct kvt_recall_cache *c, const struct kvt_seq *s)
{
	return s->ws_snap_at == c->snap_at ? s->ws_snap : s->ws_counted;
}

void kvt_recall_freeze(struct kvt_manager *m)
{
	struct kvt_recall_cache *c = &m->rc;

	if (!c->n)
		return;
	c->snap_at++;
	c->snap_sum = c->sum_ws;
	memcpy(c->snap_layer, c->layer_ws, m->cfg.n_layers * sizeof(*c->snap_layer));
}

/* Counts a region's working set as now in the sums: the cache's, its layer's and its
   sequence's, which the sizing reads as last frozen (target_of). */
static inline void ws_recount(struct kvt_recall_cache *c, struct kvt_recall_layer *rc, uint32_t now)
{
	ws_freeze(c, rc->seq);
	c->sum_ws += now;
	c->sum_ws -= rc->ws_counted;
	c->layer_ws[rc->layer] += now;
	c->layer_ws[rc->layer] -= rc->ws_counted;
	rc->seq->ws_counted += now;
	rc->seq->ws_counted -= rc->ws_counted;
	rc->ws_counted = now;
}

/* On the device (dev_regions), the slot count a region had before the sizing under way first
   changed it: the program's drops and grows start from there. */
static void note_n0(struct kvt_manager *m, struct kvt_recall_layer *rc)
{
	if (rc->dn0_stamp != m->stamp) {
		rc->dn0_stamp = m->stamp;
		rc->dn0 = rc->rg.n_slots;
	}
}

/* Shrinks a layer's region to n slots, dropping its least recently used ones (empty ones
   first; policy/region.h), their frames back to the cache. With `mark`, the view reads as
   stale when a slot it names was dropped or moved. On the device (dev_regions, inside a
   sizing only) the drops are counted here and made by the call's program (dev_run), which
   reports the keys forgotten and the views gone stale. */
static void region_shrink(struct kvt_manager *m, struct kvt_recall_layer *rc, uint32_t n, bool mark)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t gone = 0, tag = 0;
	bool watch;

	if (n >= rc->rg.n_slots || NEVER(m->dev_regions && !c->sizing))
		return;
	if (n == 0 && !mark && !c->sizing) { /* outside a call: frames pushed in index order */
		for (uint32_t i = 0; i < rc->rg.n_slots; i++)
			c->free[c->top++] = rc->frame[i];
		c->n_free += rc->rg.n_slots;
		gone = kvt_region_clear(&rc->rg);
	}
	if (c->sizing && rc->rg.n_slots > n) {
		/* A region that grew in this sizing has no frames yet: it never shrinks after
		   (recall_size grows members last; reclaim leaves them alone). */
		if (NEVER(rc->grow_stamp == m->stamp))
			return;
		if (rc->drop_stamp != m->stamp) {
			rc->drop_stamp = m->stamp;
			rc->drop_tag = c->n_drop;
			c->drop[c->n_drop++] = (struct kvt_size_op){.rc = rc, .mark = mark};
		}
		tag = rc->drop_tag;
		c->drop[tag].n += rc->rg.n_slots - n;
	}
	if (m->dev_regions) {
		note_n0(m, rc);
		c->top += rc->rg.n_slots - n;
		c->n_free += rc->rg.n_slots - n;
		rc->rg.n_slots = n;
		rc->dirty = true;
	}
	/* A drop makes the view stale when the view names the slot dropped or the last slot,
	   which moves into its place (the view's indices, as before the first drop). */
	watch = mark && !rc->view_failed && rc->rg.n_slots > n;
	if (watch)
		view_name(m, rc, true);
	while (rc->rg.n_slots > n) {
		uint32_t dropped, freed;

		gone += kvt_region_drop(&rc->rg, rc->frame, &dropped, &freed);
		c->push_tag[c->top] = tag;
		c->free[c->top++] = freed;
		c->n_free++;
		if (watch && (view_named(m, dropped) || view_named(m, rc->rg.n_slots)))
			rc->view_failed = true;
	}
	if (watch)
		view_name(m, rc, false);
	m->st.recall_evictions += gone;
	if (ALWAYS(c->n_held >= gone))
		c->n_held -= gone;
	if (n == 0)
		region_unlink(m, rc);
}

/* A region that holds no slot any more leaves the cache's list of live regions. */
static void region_unlink(struct kvt_manager *m, struct kvt_recall_layer *rc)
{
	struct kvt_recall_cache *c = &m->rc;

	if (ALWAYS(c->n_regions > 0)) {
		c->n_regions--;
		ws_recount(c, rc, 0);
		if (c->cursor == rc)
			c->cursor = rc->lnext;
		if (c->sweep == rc)
			c->sweep = rc->lnext;
		if (rc->lprev)
			rc->lprev->lnext = rc->lnext;
		else
			c->live_head = rc->lnext;
		if (rc->lnext)
			rc->lnext->lprev = rc->lprev;
		else
			c->live_tail = rc->lprev;
		rc->lprev = rc->lnext = NULL;
	}
}

/* Grows a layer's region to n slots with free frames (the caller reserved the slots and
   checked that enough frames are free). */
static void region_grow(struct kvt_manager *m, struct kvt_recall_layer *rc, uint32_t n)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t had = rc->rg.n_slots;

	if (n <= had || NEVER(n - had > c->n_free || n > rc->cap_slots) || NEVER(!c->sizing))
		return;
	/* frames_commit gives the new slots their frames when the sizing ends */
	if (rc->grow_stamp != m->stamp) {
		rc->grow_stamp = m->stamp;
		c->grow[c->n_grow++] = (struct kvt_size_op){.rc = rc, .n = had};
	}
	c->n_free -= n - had;
	if (m->dev_regions) {
		note_n0(m, rc);
		rc->rg.n_slots = n;
		rc->dirty = true;
	} else {
		kvt_region_grow(&rc->rg, n);
	}
	if (had == 0) {
		c->n_regions++;
		rc->lprev = c->live_tail;
		rc->lnext = NULL;
		if (c->live_tail)
			c->live_tail->lnext = rc;
		else
			c->live_head = rc;
		c->live_tail = rc;
	}
}

/* Whether a region's (sequence, layer) was left out of its layer's last ws_window recall calls
   (a sequence not decoding): it aims at nothing, and its working set stops counting. */
static inline bool region_idle(const struct kvt_manager *m, const struct kvt_recall_layer *rc)
{
	return m->rc.layer_calls[rc->layer] - rc->last_call > m->cfg.ws_window;
}

/* a * b / d (d > 0), rounded up or down; in long double where a * b passes 64 bits. */
static inline uint64_t mul_div(uint64_t a, uint64_t b, uint64_t d, bool up)
{
	uint64_t p;

	if (!__builtin_mul_overflow(a, b, &p))
		return up ? p / d + (p % d != 0) : p / d;
	return (uint64_t)((long double)a * (long double)b / (long double)d);
}

/* The size a region aims at when `regions` regions hold frames: a part of the cache in
   proportion to its working set, or an equal part while no region has one; at most a slot per
   block and head of its layer. The working set it aims by is not its own count but its
   sequence's (the sum over its layers) spread over the layers as all sequences' are: ws(s) *
   ws(l) / sum_ws, as last frozen (kvt_recall_freeze: at the step's begin, or outside a step
   at each call once its members are counted). So every region's aim follows from a number per
   sequence and one per layer that stay put for a step, which a device can be handed once a
   step; on the traces it loads as many blocks as the region's own count (docs/design.md). A
   new region aims at nothing until its first call counts its working set: it takes what its
   calls need meanwhile. Until the sums are frozen with its sequence counted (a sequence's
   first step), it aims by its own count instead: aiming at nothing for that step loaded 4.2%
   more blocks on the bundled trace (2026-12-06). */
static uint64_t target_of(const struct kvt_manager *m, const struct kvt_recall_layer *rc,
			  uint64_t regions)
{
	const struct kvt_recall_cache *c = &m->rc;
	uint64_t ws = 0, t, most = (uint64_t)rc->rg.cap_blocks * m->cfg.n_kv_heads;

	if (!regions)
		regions = 1;
	if (region_idle(m, rc))
		return 0;
	/* (a region with a count has had a call: seq is set; the frozen sum >= either frozen
	   factor) */
	if (rc->ws_counted && c->snap_sum) {
		uint64_t sw = ws_frozen(c, rc->seq);

		ws = sw ? mul_div(sw, c->snap_layer[rc->layer], c->snap_sum, false)
			: rc->ws_counted;
	}
	if (!c->snap_sum)
		t = DIV_UP(c->n, regions);
	else /* rounded up: the frames rounding down would leave go to the first to grow */
		t = mul_div(ws, c->n, c->snap_sum, true);
	if (t > most)
		t = most;
	return t > KVT_REGION_MAX_SLOTS ? KVT_REGION_MAX_SLOTS : t;
}

/* Shrinks regions outside the call at hand (stamp) until want frames are free, each losing its
   least recently used slots. First those above their target (target_of) down to it, in turn
   from where the last such walk stopped, at most one lap; then, with `below`, one slot at a
   time from each region in turn, so the loss is spread. A view naming a slot that went reads
   as stale. */
static void reclaim(struct kvt_manager *m, uint64_t stamp, uint64_t regions, uint64_t want,
		    bool below)
{
	struct kvt_recall_cache *c = &m->rc;
	struct kvt_recall_layer *rc, *next;
	uint64_t seen = 0, idle = 0;

	rc = c->cursor ? c->cursor : c->live_head;
	for (; rc && c->n_free < want && seen++ < c->n_regions; rc = next ? next : c->live_head) {
		uint64_t tg = target_of(m, rc, regions);
		uint64_t give = rc->rg.n_slots > tg ? rc->rg.n_slots - tg : 0;

		next = rc->lnext; /* before the shrink, which may unlink rc */
		if (rc->stamp == stamp || !give)
			continue;
		if (give > want - c->n_free)
			give = want - c->n_free;
		region_shrink(m, rc, rc->rg.n_slots - (uint32_t)give, true);
	}
	/* Round robin; a lap that frees nothing ends it (recall_room counted enough). */
	while (below && c->n_free < want && rc && idle <= c->n_regions) {
		next = rc->lnext;
		if (rc->stamp != stamp && rc->rg.n_slots) {
			region_shrink(m, rc, rc->rg.n_slots - 1, true);
			idle = 0;
		} else {
			idle++;
		}
		rc = next ? next : c->live_head;
	}
	c->cursor = rc;
}

/* kvt_recall_drop_seq on the device: one program clears the sequence's regions, their frames
   pushed on the stack in slot order as the host's clear pushes them. A failure leaves the
   device's state unknown (dbroken); the host's counts go on as if it had worked. */
static void dev_drop_seq(struct kvt_manager *m, struct kvt_seq *s)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t L = m->cfg.n_layers, k = 0;
	/* a program of a drop per layer: its cells, descriptors, offsets and reports */
	struct prog_layout pl = prog_layout(m, 0, L, L, 0, 0, 0, false);
	struct kvt_dcopy cp, back;
	struct kvt_region_run run;
	uint32_t done;
	uint64_t gone = 0;
	int err;

	(void)kvt_recall_settle(m); /* (a failure there is dbroken's) */
	err = c->dbroken;
	for (uint32_t l = 0; l < L; l++)
		k += s->layers[l].rc && s->layers[l].rc->rg.n_slots;
	if (!k)
		return;
	if (!err && (pl.up > c->hblob_cap || pl.up > c->dcall_cap))
		err = -ENOMEM; /* prog_reserve keeps room for this */
	if (!err) {
		struct dcell *cell = (struct dcell *)(c->hblob + pl.cell);
		uint32_t *gn = (uint32_t *)(c->hblob + pl.gone), j = 0, top = c->top;

		memset(c->hblob, 0, pl.up);
		for (uint32_t l = 0; l < L; l++) {
			struct kvt_recall_layer *rc = s->layers[l].rc;
			struct kvt_gpu_region *g = (struct kvt_gpu_region *)(c->hblob + pl.drg) + j;

			if (!rc || !rc->rg.n_slots)
				continue;
			cell[j].n_slots = rc->rg.n_slots;
			dev_desc(g, m, rc, &pl, j, 1, 0, 0, rc->dview_r, 0, 0);
			((uint32_t *)(c->hblob + pl.drop_off))[j] = top;
			top += rc->rg.n_slots;
			j++;
		}
		cp = (struct kvt_dcopy){.dev = c->dcall + pl.up0,
					.host = c->hblob + pl.up0,
					.bytes = pl.up - pl.up0};
		back = (struct kvt_dcopy){.dev = c->dcall + pl.rd0,
					  .host = c->hblob + pl.rd0,
					  .bytes = pl.rd - pl.rd0};
		run = (struct kvt_region_run){
			.up = &cp,
			.n_up = 1,
			.clear_rg = c->dcall + pl.drg,
			.clear_gone = c->dcall + pl.gone,
			.clear_off = c->dcall + pl.drop_off,
			.n_clear = k,
			.stack = c->dstack,
			.rd = &back,
			.n_rd = 1,
		};
		/* A stage that failed is queued again, once, from where it stopped (uploads and
		   reads may repeat; the clear runs once). */
		for (int tries = 0; tries < 2; tries++) {
			done = run.start;
			err = KVT_XFER(m, region_run, &run, NULL, &done);
			if (!err)
				break;
			run.start = done < KVT_RS_END ? done : KVT_RS_READ;
		}
		for (uint32_t x = 0; !err && x < k; x++)
			gone += gn[x];
	}
	if (err) {
		c->dbroken = err;
		kvt_log(KVT_LOG_WARN,
			"recall: giving back the regions of sequence %llu on the "
			"device failed: %s",
			(unsigned long long)s->id, m->be->err);
	}
	for (uint32_t l = 0; l < L; l++) {
		struct kvt_recall_layer *rc = s->layers[l].rc;

		if (!rc || !rc->rg.n_slots)
			continue;
		c->n_free += rc->rg.n_slots;
		c->top += rc->rg.n_slots;
		rc->rg.n_slots = 0;
		rc->dirty = false;
		region_unlink(m, rc);
	}
	m->st.recall_evictions += gone;
	if (ALWAYS(c->n_held >= gone))
		c->n_held -= gone;
}

void kvt_recall_drop_seq(struct kvt_manager *m, struct kvt_seq *s)
{
	if (m->dev_regions)
		dev_drop_seq(m, s);
	for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
		struct kvt_recall_layer *rc = s->layers[l].rc;

		if (!rc)
			continue;
		region_shrink(m, rc, 0, false);
		if (rc->view_n)
			memset(rc->view_n, 0, m->cfg.n_kv_heads * sizeof(*rc->view_n));
		rc->view_failed = false;
		rc->view_bad_sel = false;
		if (m->dev_regions) { /* the keys forgotten there: read them at the next use */
			rc->dirty = rc->dreg != 0;
			rc->dview_r = 0; /* and no view since */
		}
	}
}

struct order_key {
	uint64_t key; /* (stamp, rank) */
	uint32_t i;
};

static int order_cmp(const void *a, const void *b)
{
	const struct order_key *x = a, *y = b;

	return x->key < y->key ? -1 : x->key > y->key;
}

/* A region read back from the device (tmp: its state as dreg_layout lays it out; its keys
   already in rc->rg.key) made the host's copy again. 0 or -ENOMEM. */
static int pull_unpack(struct kvt_manager *m, struct kvt_recall_layer *rc, const uint8_t *tmp)
{
	uint32_t H = m->cfg.n_kv_heads, n = rc->rg.n_slots;
	struct dreg_layout g = dreg_layout(m, rc->dscap, rc->dvcap);
	struct order_key *ok = kvt_malloc((n ? n : 1) * sizeof(*ok));

	if (!ok || (n > rc->hcap_slots && rc_host_slots(rc, rc->cap_slots))) {
		free(ok);
		return -ENOMEM;
	}
	if (n) { /* (a region given back may have no slot arrays) */
		memcpy(rc->rg.slot, tmp + g.slot, (size_t)n * sizeof(*rc->rg.slot));
		memcpy(rc->frame, tmp + g.frame, (size_t)n * sizeof(*rc->frame));
	}
	if (rc->view_n && !rc->dview_r) { /* no call since its regions were given back */
		memset(rc->view_n, 0, H * sizeof(*rc->view_n));
	} else if (rc->view_n) {
		memcpy(rc->view_n, tmp + g.view_n, H * sizeof(*rc->view_n));
		for (uint32_t h = 0; h < H; h++)
			if (NEVER(rc->view_n[h] > rc->view_cap))
				rc->view_n[h] = 0;
			else
				memcpy(rc->view + (size_t)h * rc->view_cap,
				       tmp + g.view + (size_t)h * rc->dview_r * 4,
				       rc->view_n[h] * sizeof(*rc->view));
	}
	/* the order list the device keeps no copy of: ascending (stamp, rank) */
	for (uint32_t i = 0; i < n; i++)
		ok[i] = (struct order_key){
			(uint64_t)rc->rg.slot[i].stamp << 32 | rc->rg.slot[i].rank, i};
	qsort(ok, n, sizeof(*ok), order_cmp);
	rc->rg.head = rc->rg.tail = KVT_REGION_PENDING;
	for (uint32_t x = 0; x < n; x++) {
		uint16_t i = (uint16_t)ok[x].i;

		rc->rg.link[i].prev = x ? (uint16_t)ok[x - 1].i : KVT_REGION_PENDING;
		rc->rg.link[i].next = x + 1 < n ? (uint16_t)ok[x + 1].i : KVT_REGION_PENDING;
	}
	if (n) {
		rc->rg.head = (uint16_t)ok[0].i;
		rc->rg.tail = (uint16_t)ok[n - 1].i;
	}
	rc->rg.empty_end = 0; /* not known: found by a walk */
	free(ok);
	rc->dirty = false;
	return 0;
}

int kvt_recall_pull_many(struct kvt_manager *m, struct kvt_recall_layer *const *rcs, uint32_t n)
{
	const uint32_t H = m->cfg.n_kv_heads;
	struct kvt_xfer *x = NULL;
	uint32_t nd = 0, nx = 0;
	uint64_t total = 0, off = 0;
	uint8_t *tmp = NULL;
	int err;

	if (!m->dev_regions || !n)
		return 0;
	err = kvt_recall_settle(m);
	if (err)
		return err;
	for (uint32_t i = 0; i < n; i++)
		if (rcs[i] && rcs[i]->dirty) {
			nd++;
			total += ALIGN16(dreg_layout(m, rcs[i]->dscap, rcs[i]->dvcap).bytes);
		}
	if (!nd)
		return 0;
	if (m->rc.dbroken)
		return kvt_fail(
			m, m->rc.dbroken,
			"recall: an earlier call failed on the device: its regions' state is "
			"unknown");
	tmp = total <= SIZE_MAX ? kvt_malloc((size_t)total) : NULL;
	x = kvt_malloc(2 * (size_t)nd * sizeof(*x));
	if (!tmp || !x) {
		err = kvt_fail(m, -ENOMEM, "recall: no memory to read %u regions", nd);
		goto out;
	}
	/* each dirty region's state into tmp, its keys into its own key table */
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_recall_layer *rc = rcs[i];
		uint64_t nb, bytes;

		if (!rc || !rc->dirty)
			continue;
		bytes = dreg_layout(m, rc->dscap, rc->dvcap).bytes;
		nb = rc->dcap < rc->rg.cap_blocks ? rc->dcap : rc->rg.cap_blocks;
		x[nx++] = (struct kvt_xfer){.src = rc->dreg,
					    .dst = (uint64_t)(uintptr_t)(tmp + off),
					    .bytes = (uint32_t)bytes,
					    .reps = 1};
		x[nx++] = (struct kvt_xfer){.src = kvt_dkey(m, rc),
					    .dst = (uint64_t)(uintptr_t)rc->rg.key,
					    .bytes = (uint32_t)(nb * H * sizeof(*rc->rg.key)),
					    .reps = 1};
		off += ALIGN16(bytes);
	}
	if (m->ops->read_many) {
		err = KVT_XFER(m, read_many, x, nx);
	} else {
		err = 0;
		for (uint32_t k = 0; k < nx && !err; k++)
			err = KVT_XFER(m, read_d2h, (void *)(uintptr_t)x[k].dst, x[k].src,
				       x[k].bytes, NULL);
	}
	if (err) {
		err = kvt_fail(m, err, "recall: reading %u regions from the device: %s", nd,
			       m->be->err);
		goto out;
	}
	/* each dirty region's state where its read put it: x[k], k = 0, 2, 4, ... */
	for (uint32_t i = 0, k = 0; i < n && !err; i++) {
		struct kvt_recall_layer *rc = rcs[i];

		if (!rc || !rc->dirty)
			continue;
		err = pull_unpack(m, rc, (const uint8_t *)(uintptr_t)x[k].dst);
		if (err)
			err = kvt_fail(m, err, "recall: no memory to read a region");
		k += 2;
	}
out:
	free(tmp);
	free(x);
	return err;
}

int kvt_recall_sync(struct kvt_manager *m, struct kvt_recall_layer *rc)
{
	int err = kvt_recall_settle(m);

	if (!err)
		rc_sync(m, rc);
	return err;
}

int kvt_recall_pull(struct kvt_manager *m, struct kvt_recall_layer *rc)
{
	return kvt_recall_pull_many(m, &rc, 1);
}

/* kvt_recall_check of a layer's device group table: every entry the device has seen (below
   dgroups) that did not move since is the block's host group, or 0 when it is spilled. */
static int check_dgroups(struct kvt_manager *m, const struct kvt_seq_layer *ly)
{
	const struct kvt_recall_layer *rc = ly->rc;
	uint64_t *dg;
	int err = 0;

	if (!rc->dgroups || !rc->dmeta)
		return 0;
	if (rc->dgroups > ly->n_groups || rc->dgroups > rc->dcap)
		return -15;
	dg = kvt_malloc((size_t)rc->dgroups * sizeof(*dg));
	if (!dg)
		return -ENOMEM;
	if (KVT_XFER(m, read_d2h, dg, kvt_dgroup(m, rc), (uint64_t)rc->dgroups * sizeof(*dg), NULL))
		err = -11;
	for (uint32_t b = 0; b < rc->dgroups && !err; b++)
		if (!kvt_recall_moved(rc, b) && dg[b] != kvt_dgroup_val(m, ly->groups[b]))
			err = -15;
	free(dg);
	return err;
}

/* Whether a layer's top-K counts (tk_count) differ from a count position by position. */
static bool tk_check(const struct kvt_manager *m, const struct kvt_seq *s,
		     const struct kvt_seq_layer *ly)
{
	uint32_t H = m->cfg.n_kv_heads, nb = ly->rc->rg.cap_blocks;
	uint8_t *tk = kvt_calloc((size_t)nb * H + 1, 1);
	bool bad = !tk;

	for (uint32_t h = 0; h < H && !bad; h++)
		for (uint32_t i = 0; i < s->valid_topk && !bad; i++) {
			uint32_t b = (uint32_t)ly->topk[(size_t)h * s->valid_topk + i] >> m->lbt;

			bad = b >= nb;
			if (!bad)
				tk[(size_t)b * H + h]++;
		}
	for (size_t k = 0; k < (size_t)nb * H && !bad; k++)
		bad = ly->rc->rg.key[k].tk != tk[k];
	free(tk);
	return bad;
}

int kvt_recall_check(struct kvt_manager *m)
{
	struct kvt_recall_cache *c = &m->rc;
	uint64_t regions = 0, held = 0, ws = 0;
	uint8_t *seen;
	int err = 0;

	if (m->dev_regions && kvt_recall_settle(m))
		return -13;
	if (c->sizing || c->top != c->n_free || c->n_free > c->n)
		return -1;
	if (m->dev_regions && c->dstack_ready) { /* the device's state, read */
		if (KVT_XFER(m, read_d2h, c->free, c->dstack, (uint64_t)c->n_free * 4, NULL))
			return -11;
		for (struct kvt_recall_layer *rc = c->live_head; rc; rc = rc->lnext) {
			if (kvt_recall_pull(m, rc))
				return -12;
			rc_sync(m, rc); /* (its clock, which the slots' stamps are checked by) */
		}
	}
	seen = kvt_calloc(c->n ? c->n : 1, 1);
	if (!seen)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->n_free && !err; i++)
		if (c->free[i] >= c->n || seen[c->free[i]]++)
			err = -2; /* a frame free twice, or not a frame */
	for (const struct kvt_recall_layer *rc = c->live_head; rc && !err; rc = rc->lnext) {
		if (++regions > c->n_regions || !rc->rg.n_slots ||
		    (rc->lnext ? rc->lnext->lprev != rc : c->live_tail != rc))
			err = -3; /* the live list */
		else if (kvt_region_check(&rc->rg, m->cfg.n_kv_heads))
			err = -4;
		for (uint32_t i = 0; i < rc->rg.n_slots && !err; i++) {
			if (rc->frame[i] >= c->n || seen[rc->frame[i]]++)
				err = -5; /* a frame held twice, or held and free */
			held += rc->rg.slot[i].key != KVT_REGION_NONE;
		}
		ws += rc->ws_counted;
	}
	for (uint32_t i = 0; i < c->n && !err; i++)
		if (!seen[i])
			err = -6; /* a frame lost */
	if (!err && (regions != c->n_regions || held != c->n_held || ws != c->sum_ws))
		err = -7;
	/* each layer's count of its blocks in the spill file; the working sets' sums of each
	   sequence and each layer */
	struct kvt_seq *s;
	uint64_t *lws = kvt_calloc(m->cfg.n_layers, sizeof(*lws)), live = 0;
	/* the sequences' slots: each live one's its own, the others free (once) */
	uint8_t *taken = kvt_calloc(m->slots.n_made ? m->slots.n_made : 1, 1);

	if (!lws || !taken)
		err = err ? err : -ENOMEM;
	for (uint32_t i = 0; !err && i < m->slots.n_free; i++)
		if (m->slots.free[i] >= m->slots.n_made || taken[m->slots.free[i]]++)
			err = -19;
	for (uint32_t pos = 0; !err && (s = kvt_idmap_next(&m->seqs, &pos));) {
		uint64_t sws = 0;

		live++;
		if (s->slot >= m->slots.n_made || taken[s->slot]++)
			err = -19;
		for (uint32_t l = 0; l < m->cfg.n_layers && !err; l++) {
			const struct kvt_seq_layer *ly = &s->layers[l];

			if (!ly->rc)
				continue;
			if (ly->rc != rc_place(c, s->slot, l) || /* where rc_slot put it */
			    (ly->rc->ws.bucket && ly->rc->ws.bucket != rc_bucket(m, s->slot, l)))
				err = -18;
			else if (ly->rc->ws_counted && (ly->rc->seq != s || ly->rc->layer != l))
				err = -15;
			sws += ly->rc->ws_counted;
			lws[l] += ly->rc->ws_counted;
			if (ly->rc->tk_ready && tk_check(m, s, ly))
				err = -17;
			else if (count_spilled(ly) != ly->rc->n_spilled)
				err = -14;
			else if (m->dev_regions)
				err = check_dgroups(m, ly);
		}
		if (!err && sws != s->ws_counted)
			err = -16;
	}
	for (uint32_t l = 0; l < m->cfg.n_layers && !err; l++)
		if (lws[l] != c->layer_ws[l])
			err = -16;
	if (!err && live + m->slots.n_free != m->slots.n_made)
		err = -19; /* a slot lost */
	free(taken);
	free(lws);
	free(seen);
	return err;
}

/* Grows the view arrays of a layer to r entries per head (capacity only). */
static int view_reserve(struct kvt_manager *m, struct kvt_recall_layer *rc, uint32_t r)
{
	size_t H = m->cfg.n_kv_heads;
	uint32_t *v;

	if (r <= rc->view_cap) /* (every recall call asks; view_n is there once view_cap is) */
		return 0;
	if (!rc->view_n) {
		rc->view_n = kvt_huge_calloc(H, sizeof(*rc->view_n));
		if (!rc->view_n)
			return -ENOMEM;
	}
	if (r <= rc->view_cap)
		return 0;
	/* The old view is laid out for the old capacity: re-lay it out per head. */
	v = kvt_huge_realloc(NULL, H * r * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t h = 0; h < H; h++)
		if (rc->view_n[h])
			memcpy(v + h * r, rc->view + h * rc->view_cap, rc->view_n[h] * sizeof(*v));
	kvt_huge_free(rc->view);
	rc->view = v;
	rc->view_cap = r;
	return 0;
}

/* Distinct blocks of one (sequence, head) list sel[0..r) that are not fully resident: what the
   call needs of the region for it at least. */
static uint32_t exact_need(const struct kvt_manager *m, const struct kvt_seq_layer *ly, uint32_t h,
			   const uint32_t *sel, uint32_t r)
{
	struct kvt_region_geom g = geom_of(m, ly->n_tokens);
	uint32_t bt = m->cfg.block_tokens, need = 0;

	for (uint32_t j = 0; j < r; j++) {
		uint32_t b = sel[j], nv;
		bool dup = false;

		if (b == KVT_NO_ENTRY)
			continue;
		for (uint32_t i = 0; i < j && !dup; i++)
			dup = sel[i] == b;
		nv = ly->n_tokens - b * bt < bt ? ly->n_tokens - b * bt : bt;
		if (!dup && !kvt_region_resident(&ly->rc->rg, &g, h, b, nv))
			need++;
	}
	return need;
}

/* What a Quest selection of one (sequence, layer) needs of its region at least: per head, its
   r best blocks among those not fully resident, all distinct, so min(r, such blocks). Equal to
   exact_need of the selection, without reading it (a device's selection stays there). */
static uint32_t quest_need(const struct kvt_manager *m, const struct kvt_seq *s,
			   const struct kvt_seq_layer *ly, uint32_t r)
{
	struct kvt_recall_layer *rc = ly->rc;
	struct kvt_region_geom g = geom_of(m, ly->n_tokens);
	uint32_t H = m->cfg.n_kv_heads, bt = m->cfg.block_tokens, nb = kvt_blocks(m, ly->n_tokens);
	/* blocks [0, lo) lie wholly below the ring and the history; [lo, hi) reach into
	   [lo * bt, ring0) */
	uint32_t lo = (g.ring0 < ly->n_tokens ? g.ring0 : ly->n_tokens) >> m->lbt,
		 hi = kvt_blocks(m, g.ring0) < nb ? kvt_blocks(m, g.ring0) : nb, need = 0;
	uint64_t full;

	/* At most this many blocks of a head are fully resident: those touching the sink or the
	   ring (the last one, possibly partial, among them), and blocks of bt top-K positions
	   (each position counts in one block's top-K count). With r more blocks than that,
	   every head has r candidates: no block needs reading. */
	full = kvt_blocks(m, m->cfg.sink_tokens) + (s->valid_topk >> m->lbt) + 1 +
	       (g.ring0 < ly->n_tokens ? kvt_blocks(m, ly->n_tokens - g.ring0) + 1 : 0);
	if (nb >= full + r)
		return H * r;
	/* Otherwise the candidates are counted, a block at most once in the layer's life: a
	   block wholly below the ring (and within the history) is full and never changes (the
	   ring only moves up; the top-K positions lie below it), so those blocks' candidates
	   per head are kept (rc->qcand over the first rc->qsettled blocks). A block from the
	   ring's start on holds ring positions only and is resident, but the one the ring
	   starts in, and, while the history is shorter than the sink (ring0 past N), the blocks
	   left, which are tested as they are. */
	if (rc->qsettled > lo) { /* a shorter history than counted (not seen): count again */
		rc->qsettled = 0;
		memset(rc->qcand, 0, H * sizeof(*rc->qcand));
	}
	for (uint32_t b = rc->qsettled; b < lo; b++)
		for (uint32_t h = 0; h < H; h++)
			rc->qcand[h] += !kvt_region_resident(&rc->rg, &g, h, b, bt);
	rc->qsettled = lo;
	for (uint32_t h = 0; h < H; h++) {
		uint32_t cand = rc->qcand[h];

		for (uint32_t b = lo; b < hi && cand < r; b++)
			cand += !kvt_region_resident(&rc->rg, &g, h, b,
						     b + 1 < nb ? bt : ly->n_tokens - b * bt);
		need += cand < r ? cand : r;
	}
	return need;
}

/* How far ahead a walk of a call's members asks for their cold state (a call's first walk,
   after the layer's 31 other calls and, on the emulator, their kernels' stand-ins have pushed
   it out of the caches): a member's walk takes a few tens of nanoseconds, a line from memory
   about a hundred, so four members ahead left each waiting. 16 (32 for the lines a region's
   address is read from) against 4 (6): the host time a step 1.09 times lower at 256 x 32 x 8
   (kvtier-bench recall --backend cuda, emulated runtime, median of 16 alternating rounds,
   2026-12-05), the CPU reference's the same. */
#define RC_AHEAD 16u

/* Prefetches the lines of a region's host state that a call reads and writes per member: with
   the regions on the device the struct's first part, up to drop_stamp (its counts, working set
   and stamps); on the host, whose calls read the host tables' addresses too, all of it. */
static inline void rc_prefetch(const struct kvt_manager *m, const struct kvt_recall_layer *rc)
{
	const char *p = (const char *)rc;
	/* (constant bounds: the loops unroll; the last byte's line, for a state not aligned) */
	const size_t hot = offsetof(struct kvt_recall_layer, drop_stamp), all = sizeof(*rc);

	for (size_t o = 0; o < hot; o += 64)
		__builtin_prefetch(p + o, 1);
	__builtin_prefetch(p + hot - 1, 1);
	if (m->dev_regions)
		return;
	for (size_t o = hot; o < all; o += 64)
		__builtin_prefetch(p + o, 1);
	__builtin_prefetch(p + all - 1, 1);
}

/* Validates a recall batch (pass 1): every sequence live, once, prefilled for layer, resident,
   every block index of a selection in host memory inside its history; grows the tables the call
   will write (those on the device on stream). Fills m->batch, and rc.need[i] with an upper bound of
   what member i needs (its entries naming a block; a Quest selection's exact floor; n_kv_heads * r
   for a SEL_DEVICE one, which is not read here). */
static int recall_validate(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
			   const uint32_t *sel, enum sel_kind kind, uint32_t r, void *stream)
{
	uint32_t H = m->cfg.n_kv_heads;
	uint64_t stamp = ++m->stamp;
	int err = 0;

	m->rc.layer_calls[layer]++;
	if (kvt_reserve((void **)&m->batch, &m->batch_cap, n, sizeof(*m->batch)) ||
	    kvt_reserve((void **)&m->rc.need, &m->rc.need_cap, n, sizeof(*m->rc.need)) ||
	    kvt_reserve((void **)&m->rc.want, &m->rc.want_cap, n, sizeof(*m->rc.want)) ||
	    kvt_reserve((void **)&m->rc.mrc, &m->rc.mrc_cap, n, sizeof(*m->rc.mrc)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for a batch of %u", n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s;
		struct kvt_seq_layer *ly;
		uint32_t nb, need = 0;

		/* The members' state, cold since the layer's last call, comes in RC_AHEAD members
		   ahead: the sequence and its layer's line first, then (once that line is in) the
		   region it points to. A member not live is reported when its turn comes. */
		const struct kvt_seq *far = i + 2 * RC_AHEAD < n
						    ? kvt_member(m, seqs, i + 2 * RC_AHEAD)
						    : NULL,
				     *near = i + RC_AHEAD < n ? kvt_member(m, seqs, i + RC_AHEAD)
							      : NULL;

		if (far) {
			__builtin_prefetch(far, 1);
			__builtin_prefetch(&far->layers[layer], 1);
		}
		if (near && near->layers[layer].rc) {
			rc_prefetch(m, near->layers[layer].rc);
			kvt_load_ticket_prefetch(m, near, &near->layers[layer]);
		}
		s = kvt_batch_member(m, seqs, i, layer, stamp, "recall", &err);
		if (!s)
			return err;
		ly = &s->layers[layer];
		nb = kvt_blocks(m, ly->n_tokens);
		for (size_t j = 0; sel && kind != SEL_DEVICE && j < (size_t)H * r; j++) {
			uint32_t b = sel[((size_t)i * H) * r + j];

			if (b == KVT_NO_ENTRY)
				continue;
			if (b >= nb)
				return kvt_fail(m, -EINVAL,
						"recall: sequence %llu layer %u: block %u past "
						"its %u blocks",
						(unsigned long long)seqs[i], layer, b, nb);
			need++;
		}
		if (rc_layer_get(m, ly, s->slot, layer, ly->n_groups, stream) ||
		    view_reserve(m, ly->rc, r) ||
		    (!ly->rc->ws.bucket &&
		     ((!ly->rc->qcand &&
		       !(ly->rc->qcand = kvt_huge_calloc(H, sizeof(*ly->rc->qcand)))) ||
		      !(ly->rc->ws.bucket = rc_bucket(m, s->slot, layer)))))
			return kvt_fail(m, -ENOMEM,
					"recall: sequence %llu: no memory for its "
					"recall tables",
					(unsigned long long)seqs[i]);
		ly->rc->ws.w = m->cfg.ws_window;
		ly->rc->layer = layer;
		ly->rc->seq = s;
		/* the working set its previous call left, counted now (recall_member) */
		if (ly->rc->rg.n_slots) {
			uint32_t next = rc_ws_next(m, ly->rc);

			if (next != ly->rc->ws_counted)
				ws_recount(&m->rc, ly->rc, next);
		}
		ly->rc->stamp = stamp;
		ly->rc->last_call = m->rc.layer_calls[layer];
		if (!ly->rc->tk_ready)
			tk_count(m, s, ly);
		/* A Quest selection's floor is known without reading it (a device's stays
		   there); the two agree. A selection the caller keeps on the device is not read:
		   its floor is what it can name. */
		if (kind == SEL_QUEST) {
			uint32_t q = quest_need(m, s, ly, r);

			if (sel)
				(void)NEVER(q != need);
			need = q;
		} else if (kind == SEL_DEVICE) {
			need = H * r;
		}
		/* On the device, the region's resident test reads the top-K counts there. */
		if (m->dev_regions && !ly->rc->dtk) {
			err = KVT_XFER(m, dmem_copy, kvt_dkey(m, ly->rc), 0, ly->rc->rg.key,
				       (uint64_t)nb * H * sizeof(*ly->rc->rg.key), stream);
			if (err)
				return kvt_fail(m, err, "recall: sequence %llu: top-K counts: %s",
						(unsigned long long)seqs[i], m->be->err);
			ly->rc->dtk = true;
		}
		m->batch[i] = s;
		m->rc.mrc[i] = ly->rc;
		m->rc.need[i] = need;
	}
	return 0;
}

/* The threads that share a call (each with its scratch slot). */
static uint32_t recall_slots(const struct kvt_manager *m)
{
	return m->rc.par ? m->cfg.recall_threads : 1;
}

/* Pass 2 and the Quest scoring split the batch into this many items of consecutive members,
   claimed by the team's threads as they come (kvt_par_run): four a thread, so that a thread
   the system runs late leaves less to wait for, but at least 8 members an item (fewer cost
   more to hand over than to run). One item when a call has one thread. */
#define RECALL_MAX_ITEMS 64u
static uint32_t recall_items(const struct kvt_manager *m, uint32_t n)
{
	uint32_t t = recall_slots(m), k = t > 1 ? 4 * t : 1;

	if (k > n / 8)
		k = n / 8 ? n / 8 : 1;
	return k < RECALL_MAX_ITEMS ? k : RECALL_MAX_ITEMS;
}

/* A region's first table on the device holds what this many calls can look up (n_kv_heads * r
   each), or its host capacity if larger. A region outgrowing its table gets a new one: an
   allocation, three copies (ordered after the pending programs on the device) and a deferred
   free; until 2026-12-05 every pending program was settled first. Two calls' worth left regions
   still growing after 30 steps at 256 x 32 x 8 (0.26 growths a call, more than half of
   recall_room's host time); four leave none after the first call (bench_recall_emu --head-dim 8,
   2026-12-05), for 20 bytes a slot: 10 KiB a region at r = 16, under 1% of the recall cache. */
#define DREG_FIRST 4u

/* What recall_room counts for the rest of the call: the regions the targets count (for
   recall_size) and, with the regions on the device, the group entries the program writes and
   the latest save ticket of the members (for dev_run). */
struct room_out {
	uint64_t regions;
	uint32_t gup;
	uint64_t wait;
};

/* Sizes the regions of a call (before anything changes): member i needs at least need[i] slots
   and aims at its target (target_of); frames come from the free ones, from members above
   their target, and when those are not enough from other regions (reclaim). Sets rc.want[i],
   *out, and, on the device, each member's program cell; reserves the slots, the load list and
   the working tables. 0, or -ENOSPC or -ENOMEM recorded (nothing changed). */
static int recall_room(struct kvt_manager *m, uint32_t layer, const uint32_t *sel,
		       enum sel_kind kind, uint32_t n, uint32_t r, struct room_out *out,
		       void *stream)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t H = m->cfg.n_kv_heads;
	uint64_t regions = c->n_regions, avail = c->n_free, floor = 0, loads = 0, other = 0,
		 mine = 0, gup = 0, wait = 0;
	bool exact = false;

	for (uint32_t i = 0; i < n; i++) {
		regions += c->mrc[i]->rg.n_slots == 0;
		mine += c->mrc[i]->rg.n_slots;
	}
	out->regions = regions;
	/* Every frame is free or held by a live region: the other regions hold the rest. */
	if (ALWAYS(c->n - c->n_free >= mine))
		other = c->n - c->n_free - mine;
	for (;;) {
		avail = c->n_free;
		floor = 0;
		for (uint32_t i = 0; i < n; i++) {
			const struct kvt_recall_layer *rc = c->mrc[i];
			uint64_t want, have;

			if (i + 4 < n) /* the fields below, of a member further on */
				__builtin_prefetch(&c->mrc[i + 4]->ws_counted);
			want = target_of(m, rc, regions);
			have = rc->rg.n_slots;

			if (want < c->need[i])
				want = c->need[i];
			c->want[i] = (uint32_t)want;
			if (have > c->need[i]) /* what a member holds beyond its floor */
				avail += have - c->need[i];
			if (c->need[i] > have)
				floor += c->need[i] - have;
		}
		if (floor <= avail + other || exact)
			break;
		/* The quick bounds do not fit: count what each member really needs (a Quest
		   selection's is exact already; a device one is not read). */
		if (kind != SEL_GIVEN)
			break;
		for (uint32_t i = 0; i < n; i++) {
			const struct kvt_seq_layer *ly = &m->batch[i]->layers[layer];

			c->need[i] = 0;
			for (uint32_t h = 0; h < H; h++)
				c->need[i] +=
					exact_need(m, ly, h, sel + ((size_t)i * H + h) * r, r);
		}
		exact = true;
	}
	if (floor > avail + other)
		return kvt_fail(m, -ENOSPC,
				"recall: the batch needs %llu more frames at once, %llu can be "
				"had (%u in the cache)",
				(unsigned long long)floor, (unsigned long long)avail, c->n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_recall_layer *rc = c->mrc[i];

		if (c->want[i] > KVT_REGION_MAX_SLOTS || c->need[i] > KVT_REGION_MAX_SLOTS)
			return kvt_fail(m, -ENOSPC, "recall: more than %u blocks of one layer",
					KVT_REGION_MAX_SLOTS);
		if (rc_slots_reserve(m, rc, c->want[i]))
			return kvt_fail(m, -ENOMEM, "recall: no memory for a region of %u frames",
					c->want[i]);
		/* on the device, room for what DREG_FIRST calls can look up at first (above) */
		if (m->dev_regions) {
			uint32_t nb = kvt_blocks(m, m->batch[i]->layers[layer].n_tokens);
			int err = dreg_reserve(m, rc,
					       rc->dscap || rc->cap_slots >= DREG_FIRST * H * r
						       ? rc->cap_slots
						       : (DREG_FIRST * H * r < KVT_REGION_MAX_SLOTS
								  ? DREG_FIRST * H * r
								  : KVT_REGION_MAX_SLOTS),
					       rc->view_cap, stream);

			if (err)
				return kvt_fail(m, err, "recall: a region on the device: %s",
						m->be->err);
			gup += dgroup_writes(rc, nb);
			/* what dev_run needs of the member before it writes its program: its
			   cell, and the saves its loads must wait for */
			rc->cell = i;
			rc->cell_stamp = m->stamp;
			uint64_t t = kvt_load_ticket(m, m->batch[i], &m->batch[i]->layers[layer]);

			if (t > wait)
				wait = t;
		}
		loads += (uint64_t)H * r;
	}
	if (m->dev_regions) {
		int err = prog_reserve(m, layer, n, (uint32_t)(c->n_regions + n), r, gup, stream);

		if (err)
			return err;
		out->gup = (uint32_t)gup;
		out->wait = wait;
	}
	/* the sizing's logs (recall_size): any live region and any member may drop, a member
	   may grow */
	if (c->n_regions + n > UINT32_MAX ||
	    kvt_reserve((void **)&c->drop, &c->drop_cap, (uint32_t)(c->n_regions + n),
			sizeof(*c->drop)) ||
	    kvt_reserve((void **)&c->grow, &c->grow_cap, n, sizeof(*c->grow)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for the sizing");
	if (loads > UINT32_MAX ||
	    kvt_reserve((void **)&m->xf, &m->xf_cap, (uint32_t)loads, sizeof(*m->xf)) ||
	    kvt_reserve((void **)&c->xmember, &c->x_cap, (uint32_t)loads, sizeof(*c->xmember)) ||
	    kvt_reserve((void **)&c->xslot, &c->xslot_cap, (uint32_t)loads, sizeof(*c->xslot)) ||
	    /* two lists a slot: a member's loads are written out during the next one's call */
	    kvt_reserve((void **)&c->ld, &c->ld_cap, 2 * recall_slots(m) * H * r, sizeof(*c->ld)) ||
	    kvt_spill_want_reserve(m, (uint32_t)loads))
		return kvt_fail(m, -ENOMEM, "recall: no memory for the load list");
	return 0;
}

/* Ends a sizing: the frames its drops pushed are regrouped region by region (in the order of
   their first drop, each region's in its drop order), then the grown regions' new slots take
   frames from the top, region by region in the order of their first grow. */
static void frames_commit(struct kvt_manager *m)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t at = c->seg0;

	if (m->dev_regions) { /* the offsets only: the program moves the frames */
		for (uint32_t t = 0; t < c->n_drop; t++) {
			c->drop[t].off = at;
			at += c->drop[t].n;
		}
		ALWAYS(at == c->top);
		for (uint32_t t = 0; t < c->n_grow; t++) {
			c->grow[t].off = c->top;
			c->top -= c->grow[t].rc->rg.n_slots - c->grow[t].n;
		}
		ALWAYS(c->top == c->n_free);
		c->sizing = false;
		return;
	}
	for (uint32_t t = 0; t < c->n_drop; t++) {
		uint32_t k = c->drop[t].n;

		c->drop[t].n = at; /* where its frames go, for now */
		at += k;
	}
	if (NEVER(at != c->top))
		return;
	if (c->n_drop > 1) {
		for (uint32_t p = c->seg0; p < c->top; p++)
			c->tmp[c->drop[c->push_tag[p]].n++] = c->free[p];
		memcpy(c->free + c->seg0, c->tmp + c->seg0,
		       (size_t)(c->top - c->seg0) * sizeof(*c->free));
	}
	for (uint32_t t = 0, off = c->seg0; t < c->n_drop; t++) {
		uint32_t end = c->n_drop > 1 ? c->drop[t].n : c->top;

		c->drop[t].n = end - off; /* its drops again */
		c->drop[t].off = off;
		off = end;
	}
	for (uint32_t t = 0; t < c->n_grow; t++) {
		struct kvt_recall_layer *rc = c->grow[t].rc;

		c->grow[t].off = c->top;
		for (uint32_t i = c->grow[t].n; i < rc->rg.n_slots; i++)
			rc->frame[i] = c->free[--c->top];
	}
	ALWAYS(c->top == c->n_free);
	c->sizing = false;
}

/* Applies recall_room's sizes: a few regions outside the call more than a sixteenth above their
   target are trimmed to it (the sweep); members above it by as much give frames back; those
   below their floor take what they need (free frames, then other regions'); then the others
   grow towards their target with free frames, in batch order. */
static void recall_size(struct kvt_manager *m, uint32_t n, uint64_t regions)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t layer = c->mrc[0]->layer;
	uint64_t floor = 0, round = c->layer_done[layer] + 1;
	struct kvt_recall_layer *sw = c->sweep ? c->sweep : c->live_head;

	ALWAYS(c->top == c->n_free);
	c->sizing = true;
	c->seg0 = c->top;
	c->n_drop = c->n_grow = 0;

	/* The sweep: eight regions a call, round robin over the live ones (a call that fails and
	   its retry sweep once: the retry's round, its layer's count of calls that succeeded
	   plus one, is the failed call's). Those gone idle stop counting in the working sets' sum
	   (their frames go to whoever grows next: they aim at nothing); those outside the call
	   more than a sixteenth above their target are trimmed to it. A region in a call is
	   trimmed there instead (below), so a call's sizing touches no region but its members'
	   and these eight, unless its floors need more than the free frames: per step, O(batch)
	   regions are visited, not every live one. The sixteenth spares the regions that the
	   working sets' small swings put a few slots above their targets, which would lose those
	   slots every step and take them back at their next call. */
	if (c->layer_swept[layer] != round) {
		c->layer_swept[layer] = round;
		for (uint32_t k = 0; k < 8 && sw; k++) {
			/* (next before the shrink, which may unlink sw) */
			struct kvt_recall_layer *next = sw->lnext;
			uint64_t tg;

			if (sw->ws_counted && region_idle(m, sw))
				ws_recount(c, sw, 0);
			tg = target_of(m, sw, regions);
			if (sw->stamp != m->stamp && sw->rg.n_slots > tg + tg / 16)
				region_shrink(m, sw, (uint32_t)tg, true);
			sw = next ? next : c->live_head;
		}
		c->sweep = sw;
	}
	/* Members above their target by more than a sixteenth shrink to it, as the sweep trims
	   the regions outside the call. */
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_recall_layer *rc = c->mrc[i];

		if (rc->rg.n_slots > c->want[i] + c->want[i] / 16)
			region_shrink(m, rc, c->want[i], false);
		if (c->need[i] > rc->rg.n_slots)
			floor += c->need[i] - rc->rg.n_slots;
	}
	/* Floors first, from (recall_room counted them all): members above their target,
	   other regions above theirs, members above their floor, then other regions. */
	for (uint32_t i = 0; i < n && floor > c->n_free; i++)
		region_shrink(m, c->mrc[i], c->want[i], false);
	if (floor > c->n_free)
		reclaim(m, m->stamp, regions, floor, false);
	for (uint32_t i = 0; i < n && floor > c->n_free; i++) {
		struct kvt_recall_layer *rc = c->mrc[i];
		uint64_t keep = rc->rg.n_slots - (floor - c->n_free);

		if (rc->rg.n_slots > c->need[i])
			region_shrink(m, rc,
				      keep > c->need[i] && keep < rc->rg.n_slots ? (uint32_t)keep
										 : c->need[i],
				      false);
	}
	if (floor > c->n_free)
		reclaim(m, m->stamp, regions, floor, true);
	for (uint32_t i = 0; i < n; i++)
		region_grow(m, c->mrc[i], c->need[i]);
	/* then free frames, in batch order, to members below their aim */
	for (uint32_t i = 0; i < n && c->n_free; i++) {
		struct kvt_recall_layer *rc = c->mrc[i];
		uint32_t want = c->want[i], have = rc->rg.n_slots;

		if (want > have)
			region_grow(m, rc, want - have < c->n_free ? want : have + c->n_free);
	}
	frames_commit(m);
}

/* One item of pass 2: members [i0, i1) of the batch. Its loads go to m->xf (and xmember,
   xslot) from `base` = i0 * H * r on, its scratch is ld (its thread's); what it counts is its
   own until recall_pass2 sums the items in batch order. */
struct recall_part {
	uint32_t i0, i1, base;
	uint32_t nx;		       /* loads written from base */
	uint64_t held;		       /* loads into empty slots (frames newly holding a block) */
	int64_t ws;		       /* change of the working sets' sum */
	uint64_t wait;		       /* the latest save ticket of a member that loads */
	struct kvt_region_load *ld[2]; /* the loads of members of even and odd index */
	uint32_t nl[2];
	struct kvt_region_tally r;
};

struct recall_job {
	struct kvt_manager *m;
	uint32_t layer, r, n_parts;
	const uint32_t *sel;
	bool dsel; /* the caller's SEL_DEVICE selection, read here: checked member by member */
	struct recall_part part[RECALL_MAX_ITEMS];
};

/* Whether member ly's part sel[H][r] of a SEL_DEVICE selection names a block past the layer's
   history (the kernel's check). */
static bool dsel_bad(const struct kvt_manager *m, const struct kvt_seq_layer *ly,
		     const uint32_t *sel, uint32_t r)
{
	uint32_t nb = kvt_blocks(m, ly->n_tokens);

	for (size_t j = 0; j < (size_t)m->cfg.n_kv_heads * r; j++)
		if (sel[j] != KVT_REGION_NONE && sel[j] >= nb)
			return true;
	return false;
}

/* Pass 2 for one member (s, layer) and its selection sel[H][r] (dsel: a SEL_DEVICE one): the
   region's decisions (policy/region.h) and its view; its loads go to p->ld[i & 1] (p->nl[i &
   1] of them), whose group entries and frames are requested here and read by recall_fill
   after the next member's call. Touches only the member's own state and the part's. Nothing
   fails. */
static void recall_member(struct kvt_manager *m, uint32_t i, struct kvt_seq *s, uint32_t layer,
			  const uint32_t *sel, bool dsel, uint32_t r, struct recall_part *p,
			  const struct kvt_region_ahead *ahead)
{
	struct kvt_seq_layer *ly = &s->layers[layer];
	struct kvt_recall_layer *rc = ly->rc;
	struct kvt_region_geom g = geom_of(m, ly->n_tokens);
	struct kvt_region_load *ld = p->ld[i & 1];
	uint32_t H = m->cfg.n_kv_heads, nl = 0;
	/* A selection the caller keeps on the device is checked where it lies, member by member:
	   one naming a block past its history leaves the member's region as it was and its views
	   empty and stale, as the device's kernel does (kvt_gpu_region_recall's -EINVAL). */
	bool bad = dsel && dsel_bad(m, ly, sel, r);
	int err = 0;

	p->nl[i & 1] = 0;
	if (NEVER(r > rc->view_cap)) /* recall_validate made room for the view */
		return;
	/* views are laid out view_cap apart per head: the region writes r apart, so a call with
	   r < view_cap spreads them after */
	if (!bad)
		err = kvt_region_recall_ahead(&rc->rg, &g, sel, r, &rc->ws, rc->view, rc->view_n,
					      ld, &nl, &p->r, ahead);
	/* A live region's working set counts from its next call on (recall_validate): a device
	   doing this call's lookups reports the total a step late. Until it has one counted, it
	   counts as all its call can look up, so that a new region aims at a part of the cache
	   at once (a member left out too, as dev_run counts every member). */
	if (rc->rg.n_slots && !rc->ws_counted) {
		/* (the cache's and the layer's sums take p->ws when the parts are joined; the
		   sequence is no other member's) */
		p->ws += (int64_t)m->cfg.n_kv_heads * r;
		rc->ws_counted = m->cfg.n_kv_heads * r;
		ws_freeze(&m->rc, rc->seq);
		rc->seq->ws_counted += rc->ws_counted;
	}
	rc->ws_next = rc->ws.total;
	if (bad) {
		memset(rc->view_n, 0, H * sizeof(*rc->view_n));
		rc->view_failed = true;
		rc->view_bad_sel = true;
		return;
	}
	ALWAYS(err == 0); /* recall_room sized the region for the call */
	if (r < rc->view_cap)
		for (uint32_t h = H; h-- > 1;)
			memmove(rc->view + (size_t)h * rc->view_cap, rc->view + (size_t)h * r,
				rc->view_n[h] * sizeof(*rc->view));
	/* The group entries and frames the loads read, cold: requested now, read a member's
	   call later. A call loads a few blocks, so fetching the member's whole group table ahead
	   would bring in far more lines than it reads. */
	for (uint32_t x = 0; x < nl; x++) {
		__builtin_prefetch(&ly->groups[ld[x].key / H]);
		__builtin_prefetch(&rc->frame[ld[x].slot]);
	}
	p->nl[i & 1] = nl;
	rc->view_failed = false;
	rc->view_bad_sel = false;
	if (nl) {
		uint64_t t = kvt_load_ticket(m, s, ly);

		if (t > p->wait)
			p->wait = t;
	}
}

/* Writes member i's loads (recall_member's list) in its part's stretch of m->xf. */
static void recall_fill(struct kvt_manager *m, uint32_t i, uint32_t layer, struct recall_part *p)
{
	struct kvt_recall_cache *c = &m->rc;
	const struct kvt_seq_layer *ly = &m->batch[i]->layers[layer];
	const struct kvt_recall_layer *rc = ly->rc;
	const struct kvt_region_load *ld = p->ld[i & 1];
	uint32_t H = m->cfg.n_kv_heads;

	for (uint32_t x = 0; x < p->nl[i & 1]; x++) {
		uint32_t b = ld[x].key / H, h = ld[x].key % H, at = p->base + p->nx++;

		/* A spilled block is read back after this pass (src 0 until then; recall_core
		   lists it). recall_room reserved the list. */
		p->held += ld[x].old == KVT_REGION_NONE;
		c->xmember[at] = i;
		c->xslot[at] = ld[x].slot;
		m->xf[at] = (struct kvt_xfer){
			.src = ly->groups[b] & KVT_SPILLED ? 0
							   : kvt_host_row(m, ly, h, b << m->lbt),
			.dst = kvt_slot_frame(m, rc, ld[x].slot),
			.bytes = (uint32_t)m->block_bytes,
			.reps = 1,
		};
	}
}

/* Runs pass 2 over one item's members, with the scratch of slot `slot`. Each member's tables
   are its own but cold: while member i works, the key entries of member i + 2 and the slots of
   member i + 1 come in (kvt_region_ahead), and member i - 1's loads, whose entries were
   requested during its call, are written out. */
static void recall_run_part(void *ctx, uint32_t slot, uint32_t k)
{
	struct recall_job *j = ctx;
	struct kvt_manager *m = j->m;
	struct recall_part *p = &j->part[k];
	uint32_t H = m->cfg.n_kv_heads, r = j->r, layer = j->layer;
	const uint32_t *sel = j->sel;

	p->ld[0] = m->rc.ld + (size_t)slot * 2 * H * r;
	p->ld[1] = p->ld[0] + (size_t)H * r;
	for (uint32_t i = p->i0; i < p->i0 + 2 && i < p->i1; i++)
		kvt_region_prefetch(&m->rc.mrc[i]->rg, H, sel + (size_t)i * H * r, r, true);
	if (p->i0 < p->i1)
		kvt_region_prefetch(&m->rc.mrc[p->i0]->rg, H, sel + (size_t)p->i0 * H * r, r,
				    false);
	for (uint32_t i = p->i0; i < p->i1; i++) {
		struct kvt_region_ahead ahead = {0};

		if (i + 2 < p->i1) {
			ahead.keys = &m->rc.mrc[i + 2]->rg;
			ahead.keys_sel = sel + (size_t)(i + 2) * H * r;
		}
		if (i + 1 < p->i1) {
			ahead.slots = &m->rc.mrc[i + 1]->rg;
			ahead.slots_sel = sel + (size_t)(i + 1) * H * r;
		}
		recall_member(m, i, m->batch[i], layer, sel + (size_t)i * H * r, j->dsel, r, p,
			      &ahead);
		if (i > p->i0)
			recall_fill(m, i - 1, layer, p);
	}
	if (p->i1 > p->i0)
		recall_fill(m, p->i1 - 1, layer, p);
}

/* Pass 2 of a call of n members: the items run (shared by the team when there is one), then
   their loads are joined in batch order, so the list, and everything after, is what one thread
   makes. Returns the loads listed; sums the items' counts into *t and *wait. */
static uint32_t recall_pass2(struct kvt_manager *m, struct recall_job *j, uint32_t n,
			     struct kvt_region_tally *t, uint64_t *wait)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t H = m->cfg.n_kv_heads, nx = 0;
	int64_t ws = 0;

	j->n_parts = recall_items(m, n);
	for (uint32_t k = 0; k < j->n_parts; k++) {
		struct recall_part *p = &j->part[k];

		*p = (struct recall_part){
			.i0 = (uint32_t)((uint64_t)n * k / j->n_parts),
			.i1 = (uint32_t)((uint64_t)n * (k + 1) / j->n_parts),
		};
		p->base = p->i0 * H * j->r;
	}
	kvt_par_run(c->par, recall_run_part, j, j->n_parts);
	for (uint32_t k = 0; k < j->n_parts; k++) {
		const struct recall_part *p = &j->part[k];

		if (p->base != nx && p->nx) { /* close the gap left by the parts before */
			memmove(m->xf + nx, m->xf + p->base, p->nx * sizeof(*m->xf));
			memmove(c->xmember + nx, c->xmember + p->base, p->nx * sizeof(*c->xmember));
			memmove(c->xslot + nx, c->xslot + p->base, p->nx * sizeof(*c->xslot));
		}
		nx += p->nx;
		c->n_held += p->held;
		ws += p->ws;
		t->lookups += p->r.lookups;
		t->hits += p->r.hits;
		t->loads += p->r.loads;
		t->evictions += p->r.evictions;
		if (p->wait > *wait)
			*wait = p->wait;
	}
	ALWAYS(ws >= 0 || c->sum_ws >= (uint64_t)-ws);
	c->sum_ws += (uint64_t)ws;
	c->layer_ws[j->layer] += (uint64_t)ws;
	/* The spilled blocks to read back, and the others pinned in the host tier until the
	   gather is queued, in load order (the spill tier's lists are not the parts'). */
	for (uint32_t x = 0; m->disk && x < nx; x++) {
		const struct kvt_seq_layer *ly = &m->batch[c->xmember[x]]->layers[j->layer];

		ALWAYS(kvt_spill_want(m, m->batch[c->xmember[x]], j->layer,
				      ly->rc->rg.slot[c->xslot[x]].key / H) == 0);
	}
	return nx;
}

/* What a call's program read back into its lane's buffer (cells, drops' reports) into the
   host's counts, working sets and figures. With `failed`, its loads were undone (dev_undo:
   nl of them, fresh into empty slots): the figures take its evictions alone, its views read
   as stale, and the slots the loads took hold nothing. */
static void dev_apply(struct kvt_manager *m, const struct kvt_dlane *ln, bool failed, uint32_t nl,
		      uint32_t fresh)
{
	struct kvt_recall_cache *c = &m->rc;
	const struct prog_layout *l = &ln->l;
	const struct dcell *cell = (const struct dcell *)(ln->blob + l->cell);
	const uint32_t *gone = (const uint32_t *)(ln->blob + l->gone),
		       *stale = (const uint32_t *)(ln->blob + l->stale);
	uint32_t n = ln->n;
	struct kvt_region_tally t = {0};
	uint64_t lost = 0, nx = 0;

	/* The members' clocks and working sets stay in their cells (in_lane, set by dev_run,
	   which also read their views as fresh): their host state is not touched unless the
	   call failed for them. */
	for (uint32_t i = 0; i < n; i++) {
		const struct dcell *e = &cell[i];

		if (i + RC_AHEAD < n) /* the read-back, cold since the layer's previous call */
			__builtin_prefetch(&cell[i + RC_AHEAD]);
		/* a caller's selection naming a block past the member's history: the kernel
		   changed nothing of that region (recall_member's rule) */
		bool bad = ln->dsel && e->err == -EINVAL;

		NEVER((e->err != 0 && !bad) || e->n_slots != ln->n_slots[i]); /* sized for it */
		t.lookups += e->tally.lookups;
		t.hits += e->tally.hits;
		t.evictions += e->tally.evictions;
		nx += e->n_load;
		if (failed || bad) {
			ln->rc[i]->view_failed = true;
			ln->rc[i]->view_bad_sel = bad;
		}
	}
	for (uint32_t d = 0; d < ln->nd; d++) {
		lost += gone[d];
		/* (a view made since, by a call of its layer queued after this one, stands) */
		if (stale[d] && ln->rc[n + d]->view_stamp <= ln->stamp)
			ln->rc[n + d]->view_failed = true;
	}
	if (!failed) {
		fresh = *(const uint32_t *)(ln->blob + l->fresh);
		nl = 0; /* every load holds its block */
		/* no disk tier: every block a load reads is in host memory */
		NEVER(*(const uint32_t *)(ln->blob + l->missing) != 0);
		m->st.recall_lookups += t.lookups;
		m->st.recall_hits += t.hits;
		m->st.recall_loads += nx;
		m->st.bytes_h2d += nx * m->block_bytes;
	}
	/* as the host's, failed or not */
	m->st.recall_evictions += t.evictions + lost;
	/* frames holding a block: less those the drops emptied, plus those loads filled,
	   less, after an undo, every load's (each held its block, and holds nothing now) */
	if (ALWAYS(c->n_held + fresh >= lost + nl))
		c->n_held = c->n_held + fresh - lost - nl;
}

/* Settles layer's pending call (its program has run, or is waited for): its reads applied,
   or, when the device failed it, its views and those its drops saw read as stale and every
   later call fails (the device's state cannot be told). 0 or that error, recorded. */
static int dev_repair(struct kvt_manager *m, struct kvt_dlane *ln, uint32_t layer);

static int dev_settle(struct kvt_manager *m, uint32_t layer)
{
	struct kvt_recall_cache *c = &m->rc;
	struct kvt_dlane *ln = &c->lane[layer];
	bool repair = ln->repair;
	int err;

	if (!ln->pending)
		return 0;
	err = m->ops->region_wait(m->be, layer + 1);
	ln->pending = false;
	ln->repair = false;
	c->n_pending--;
	if (!err && repair)
		return dev_repair(m, ln, layer);
	if (!err) {
		dev_apply(m, ln, false, 0, 0);
		return 0;
	}
	if (!c->dbroken)
		c->dbroken = err;
	for (uint32_t i = 0; i < ln->n + ln->nd; i++)
		if (ln->rc[i]->view_stamp <= ln->stamp) /* (as dev_apply's drops) */
			ln->rc[i]->view_failed = true;
	return kvt_fail(m, err, "recall: layer %u on the device: %s", layer, m->be->err);
}

/* Settles the pending calls in the order they were made, up to layer's (UINT32_MAX: all).
   0, or the first error, recorded. */
static int settle_through(struct kvt_manager *m, uint32_t layer)
{
	struct kvt_recall_cache *c = &m->rc;
	uint32_t L = m->cfg.n_layers;
	int first = 0;

	while (c->n_pending) {
		uint32_t l = c->fifo[c->fifo_head];
		int err;

		c->fifo_head = (c->fifo_head + 1) % L;
		err = dev_settle(m, l);
		if (err && !first)
			first = err;
		if (l == layer)
			break;
	}
	if (first) /* the first error's message */
		return kvt_fail(m, first, "recall: a program on the device failed: %s", m->be->err);
	return 0;
}

int kvt_recall_settle(struct kvt_manager *m)
{
	return m->rc.n_pending ? settle_through(m, UINT32_MAX) : 0;
}

/* After a call's program failed at stage `done` (enum kvt_region_stage): its decisions are
   made all the same (the stages before the gather it had not queued run now), then the slots
   its loads took are emptied, as the host's recall_undo does, and dev_apply reports it
   failed. 0, or the error when the device did not take even that (its state unknown). */
static int dev_undo(struct kvt_manager *m, struct kvt_dlane *ln, const struct kvt_region_run *run,
		    uint32_t done, void *stream)
{
	struct kvt_recall_cache *c = &m->rc;
	const struct prog_layout *l = &ln->l;
	uint64_t H = m->cfg.n_kv_heads, n = ln->n, r = ln->r;
	const struct dcell *cell = (const struct dcell *)(ln->blob + l->cell);
	const struct kvt_region_load *ld = (const struct kvt_region_load *)(ln->blob + l->load);
	uint32_t *pairs = (uint32_t *)(ln->blob + l->pairs), np = 0, fresh = 0, dd;
	struct kvt_dcopy back[2] = {
		{.dev = c->dcall + l->rd0, .host = ln->blob + l->rd0, .bytes = l->rd - l->rd0},
		{.dev = c->dcall + l->load,
		 .host = ln->blob + l->load,
		 .bytes = n * H * r * sizeof(struct kvt_region_load)},
	};
	struct kvt_dcopy up;
	struct kvt_region_run u;
	int err = 0;

	if (done < KVT_RS_GATHER) {
		u = *run;
		u.start = done;
		u.stop = KVT_RS_GATHER;
		u.lane = 0;
		err = KVT_XFER(m, region_run, &u, stream, &dd);
	}
	if (!err)
		err = KVT_XFER(
			m, region_run,
			&(struct kvt_region_run){
				.rd = back, .n_rd = 2, .start = KVT_RS_READ, .stop = KVT_RS_END},
			stream, &dd);
	if (err)
		return err;
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t x = 0; x < cell[i].n_load && ALWAYS(x < H * r); x++) {
			const struct kvt_region_load *e = &ld[(size_t)i * H * r + x];

			pairs[2 * np] = i;
			pairs[2 * np + 1] = e->slot;
			np++;
			fresh += e->old == KVT_REGION_NONE;
		}
	up = (struct kvt_dcopy){.dev = c->dcall + l->pairs, .host = pairs, .bytes = np * 8ull};
	if (np)
		err = KVT_XFER(m, region_run,
			       &(struct kvt_region_run){.up = &up,
							.n_up = 1,
							.empty_rg = run->rg,
							.n_empty_rg = (uint32_t)n,
							.empty_pairs = c->dcall + l->pairs,
							.n_empty = np,
							.start = KVT_RS_UPLOAD,
							.stop = KVT_RS_READ},
			       stream, &dd);
	if (err)
		return err;
	dev_apply(m, ln, true, np, fresh);
	return 0;
}

/* A call whose loads failed after stage `done` (err; why: its message): its loads undone
   (dev_undo) and err recorded as "head: why". When even the undo fails, the device's state
   cannot be told: the call's views read as stale and every later call fails (dbroken). */
static int dev_give_up(struct kvt_manager *m, struct kvt_dlane *ln,
		       const struct kvt_region_run *run, uint32_t done, void *stream, int err,
		       const char *head, const char *why)
{
	if (dev_undo(m, ln, run, done, stream)) {
		m->rc.dbroken = err;
		for (uint32_t i = 0; i < ln->n; i++)
			ln->rc[i]->view_failed = true;
		return kvt_fail(m, err, "%s: %s; then, finishing the call without its loads: %s",
				head, why, m->be->err);
	}
	return kvt_fail(m, err, "%s: %s", head, why);
}

/* Whether a member of the call at hand (m->batch[0 .. n), validated) has blocks of the layer
   in the spill file: its loads may read blocks the device cannot (a group entry of 0), so the
   call is repaired (dev_repair) before it returns. */
static bool batch_spilled(const struct kvt_manager *m, uint32_t n, uint32_t layer)
{
	for (uint32_t i = 0; m->disk && i < n; i++)
		if (m->batch[i]->layers[layer].rc->n_spilled)
			return true;
	return false;
}

/* Settles a call with a member whose layer has spilled blocks (dev_run, at once, with no
   other call pending; m->batch is the call's): when its gather found loads of blocks not in host
   memory, the call's loads are read back, each block listed for the spill tier in load order (as
   the CPU's pass 2 lists them: spilled ones read back, the others pinned), the spilled ones read
   back in one batch, the members' group entries for their loads written again, and the gather
   run again (it copies every load of the call, the ones it had copied too). Waited for, so
   the blocks read back stay in host memory while the device reads them. Then the call's
   reads are applied as on success; when a read or a stage fails, its loads are undone as a
   failed gather's (dev_undo: as the CPU's recall_undo). 0 or the error, recorded. */
static int dev_repair(struct kvt_manager *m, struct kvt_dlane *ln, uint32_t layer)
{
	struct kvt_recall_cache *c = &m->rc;
	const struct prog_layout *l = &ln->l;
	uint64_t H = m->cfg.n_kv_heads, n = ln->n, per = H * ln->r;
	const struct dcell *cell = (const struct dcell *)(ln->blob + l->cell);
	const struct kvt_region_load *ld = (const struct kvt_region_load *)(ln->blob + l->load);
	uint32_t *missing = (uint32_t *)(ln->blob + l->missing), nl = 0, k = 0, zero = 0, dd;
	uint64_t *gat = (uint64_t *)(ln->blob + l->fix), *gval = gat + n * per;
	struct kvt_dcopy back = {.dev = c->dcall + l->load,
				 .host = ln->blob + l->load,
				 .bytes = n * per * sizeof(*ld)};
	struct kvt_dcopy up[3], rd = {.dev = c->dcall + l->missing, .host = missing, .bytes = 4};
	char why[sizeof(m->err)], head[64];
	int err;

	for (uint32_t i = 0; i < n; i++)
		nl += cell[i].n_load;
	if (*missing == 0) { /* every load's block was in host memory */
		dev_apply(m, ln, false, 0, 0);
		return 0;
	}
	c->repairs++;
	err = KVT_XFER(m, region_run,
		       &(struct kvt_region_run){
			       .rd = &back, .n_rd = 1, .start = KVT_RS_READ, .stop = KVT_RS_END},
		       ln->stream, &dd);
	if (err) {
		snprintf(why, sizeof(why), "%s", m->be->err);
		goto undo;
	}
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t x = 0; x < cell[i].n_load && ALWAYS(x < per); x++)
			ALWAYS(kvt_spill_want(m, m->batch[i], layer, ld[i * per + x].key / H) == 0);
	err = kvt_spill_fetch_wanted(m, "recall");
	if (err < 0) {
		snprintf(why, sizeof(why), "%s", m->err);
		goto undo;
	}
	/* each member's blocks once (a group entry is written by one thread) */
	for (uint32_t i = 0; i < n; i++) {
		const struct kvt_seq_layer *ly = &m->batch[i]->layers[layer];
		uint32_t k0 = k;

		for (uint32_t x = 0; x < cell[i].n_load && x < per; x++) {
			uint32_t b = ld[i * per + x].key / H, y = k0;
			uint64_t at = kvt_dgroup(m, ln->rc[i]) + (uint64_t)b * sizeof(uint64_t);

			while (y < k && gat[y] != at)
				y++;
			if (y < k)
				continue;
			if (NEVER(ly->groups[b] & KVT_SPILLED)) { /* the fetch placed them all */
				err = -EIO;
				snprintf(why, sizeof(why),
					 "a block read back is not in host memory");
				goto undo;
			}
			gat[k] = at;
			gval[k++] = kvt_dgroup_val(m, ly->groups[b]);
		}
	}
	up[0] = (struct kvt_dcopy){.dev = c->dcall + l->fix, .host = gat, .bytes = k * 8ull};
	up[1] = (struct kvt_dcopy){
		.dev = c->dcall + l->fix + n * per * 8, .host = gval, .bytes = k * 8ull};
	up[2] = (struct kvt_dcopy){.dev = c->dcall + l->missing, .host = &zero, .bytes = 4};
	err = KVT_XFER(m, region_run,
		       &(struct kvt_region_run){.up = up,
						.n_up = 3,
						.group_at = c->dcall + l->fix,
						.group_val = c->dcall + l->fix + n * per * 8,
						.n_groups = k,
						.start = KVT_RS_UPLOAD,
						.stop = KVT_RS_CLEAR},
		       ln->stream, &dd);
	if (!err)
		err = KVT_XFER(m, region_run,
			       &(struct kvt_region_run){.rg = c->dcall + l->rg,
							.n = (uint32_t)n,
							.block_bytes = m->block_bytes,
							.frame_base = c->base,
							.missing = c->dcall + l->missing,
							.rd = &rd,
							.n_rd = 1,
							.start = KVT_RS_GATHER,
							.stop = KVT_RS_END},
			       ln->stream, &dd);
	if (err) {
		snprintf(why, sizeof(why), "%s", m->be->err);
		goto undo;
	}
	if (NEVER(*missing != 0)) { /* every block was written again */
		err = -EIO;
		snprintf(why, sizeof(why), "%u blocks still not in host memory", *missing);
		goto undo;
	}
	dev_apply(m, ln, false, 0, 0);
	return 0;
undo:
	snprintf(head, sizeof(head), "recall: layer %u: loading %u blocks", layer, nl);
	return dev_give_up(m, ln, &(struct kvt_region_run){.rg = c->dcall + l->rg}, KVT_RS_END,
			   ln->stream, err, head, why);
}

/* Pass 2 on the device: one program (struct kvt_region_run) makes the sizing's drops and
   grows, the members' selection (sel uploaded, or Quest's of the device queries q), their
   recall and their gather, queued on the layer's lane without a wait; what it reads back goes
   into the host's counts, working sets and figures when the call is settled ("Settling").
   What the host knows without it (the views remade, the working sets first counted) is
   applied now. With repair (batch_spilled), the call is settled and repaired before it
   returns (dev_repair). 0 or the error, recorded (a program that could not be queued whole is
   finished without its loads, and waited for). */
static int dev_run(struct kvt_manager *m, uint32_t layer, uint32_t n, const uint32_t *sel,
		   enum sel_kind kind, const void *q, uint32_t r, const struct room_out *ro,
		   bool repair, void *stream)
{
	struct kvt_recall_cache *c = &m->rc;
	struct kvt_dlane *ln = &c->lane[layer];
	uint8_t *hb = ln->blob;
	const struct kvt_config *cf = &m->cfg;
	uint32_t H = cf->n_kv_heads, w = cf->ws_window, nc = n, nd = c->n_drop, ng = c->n_grow;
	uint32_t n_g = 0, gup = ro->gup; /* (recall_room counted them, set the members' cells) */
	uint64_t stamp = m->stamp, wait = ro->wait, *gat, *gval, dsel;
	struct prog_layout l;
	struct dcell *cell;
	struct kvt_gpu_region *g;
	struct desc_key key;
	bool same, keep;
	uint32_t *bkt;
	struct kvt_region_run run;
	struct kvt_dcopy rd, up;
	char why[sizeof(m->err)], head[64];
	uint32_t done;
	int err;

	for (uint32_t d = 0; d < nd; d++)
		if (c->drop[d].rc->cell_stamp != stamp) {
			c->drop[d].rc->cell = nc++;
			c->drop[d].rc->cell_stamp = stamp;
		}
	l = prog_layout(m, n, nc, nd, ng, r, gup, q != NULL);
	if (NEVER(l.bytes > ln->blob_cap)) /* prog_reserve made room */
		return kvt_fail(m, -ENOMEM, "recall: a call's program outgrew its lane");
	/* The regions whose state the lane's previous call left in the buffer keep it there when
	   they take the same places in a program laid out alike (its cells at the same device
	   address); the others' is copied out before the buffer is written. */
	keep = ln->n == n && ln->r == r && ln->desc.dcall == c->dcall && ln->l.cell == l.cell;
	lane_sync(m, ln, keep ? c->mrc : NULL);
	ln->l = l;
	ln->n = n;
	ln->r = r;
	/* what the kernels add to or the host does not write below: the cells' counts and tallies
	   (the members' below), the drops' reports, the missing and fresh counts (the rest of
	   the upload is written in full) */
	memset(hb + l.cell + (size_t)n * sizeof(struct dcell), 0,
	       (size_t)(nc - n) * sizeof(struct dcell));
	memset(hb + l.gone, 0, l.rd - l.gone);
	/* the members' selections: the caller's on the device, else the program's (uploaded,
	   or written there by the Quest selection) */
	dsel = kind == SEL_DEVICE ? (uint64_t)(uintptr_t)sel : c->dcall + l.sel;
	cell = (struct dcell *)(hb + l.cell);
	bkt = (uint32_t *)(hb + l.bucket);
	g = (struct kvt_gpu_region *)(hb + l.rg);
	key = (struct desc_key){.dcall = c->dcall, .sel = dsel, .n = n, .r = r};
	same = !memcmp(&key, &ln->desc, sizeof(key));
	ln->desc = key;
	gat = (uint64_t *)(hb + l.gat);
	gval = (uint64_t *)(hb + l.gval);
	/* The regions that drop, and those that grow, first: the drops' descriptors name the view
	   as its region's last call left it (dview_r), which a member's own turn below moves on.
	   The call as its settling will see it: the members (ln->rc[i]), then the regions that
	   dropped. */
	for (uint32_t d = 0; d < nd; d++) {
		struct kvt_recall_layer *rc = c->drop[d].rc;
		struct kvt_gpu_region *dg = (struct kvt_gpu_region *)(hb + l.drg) + d;

		if (rc->cell >= n) /* not a member: its count is carried by its own cell */
			cell[rc->cell].n_slots = rc->dn0;
		dev_desc(dg, m, rc, &l, rc->cell, n, n, 0, rc->dview_r, r, 0);
		if (c->drop[d].mark)
			dg->stale = (uint32_t *)(uintptr_t)(c->dcall + l.stale + (uint64_t)d * 4);
		((uint32_t *)(hb + l.drop_k))[d] = c->drop[d].n;
		((uint32_t *)(hb + l.drop_off))[d] = c->drop[d].off;
		ln->rc[n + d] = rc; /* (region_shrink marked it dirty) */
	}
	for (uint32_t k = 0; k < ng; k++) {
		struct kvt_recall_layer *rc = c->grow[k].rc;

		dev_desc((struct kvt_gpu_region *)(hb + l.grg) + k, m, rc, &l, rc->cell, n, n, 0, r,
			 r, 0);
		((uint32_t *)(hb + l.grow_n))[k] = rc->rg.n_slots;
		((uint32_t *)(hb + l.grow_off))[k] = c->grow[k].off;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_recall_layer *rc = c->mrc[i];
		const struct kvt_seq_layer *ly = &m->batch[i]->layers[layer];
		uint32_t nb = kvt_blocks(m, ly->n_tokens), from;

		/* the descriptor's tokens, written a step ago: cold (the rest is warm from the
		   sizing) */
		if (i + RC_AHEAD < n)
			__builtin_prefetch(&g[i + RC_AHEAD].n_tokens, 1);
		/* its clock and working set: in its cell still (from the read-back), or from
		   the host's copy */
		if (!rc->in_lane) {
			cell[i].clock = rc->rg.clock;
			cell[i].ws = rc->ws;
			cell[i].ws.bucket =
				(uint32_t *)(uintptr_t)(c->dcall + l.bucket + (uint64_t)i * w * 4);
			memcpy(bkt + (size_t)i * w, rc->ws.bucket, (size_t)w * sizeof(*bkt));
			rc->in_lane = true;
			rc->lcell = i;
		} else {
			NEVER(rc->lcell != i || !keep);
		}
		cell[i].n_slots = rc->dn0_stamp == stamp ? rc->dn0 : rc->rg.n_slots;
		cell[i].n_load = 0;
		cell[i].err = 0;
		cell[i].tally = (struct kvt_region_tally){0};
		/* its view is made again: read as fresh unless the call fails (dev_apply); the
		   verdicts of earlier calls' drops, settled later, are on the old one */
		rc->view_failed = false;
		rc->view_bad_sel = false;
		rc->view_stamp = stamp;
		/* the descriptor of the same region's tables in the same place: its tokens */
		if (same && ln->dver[i] == rc->dver) {
			g[i].n_tokens = ly->n_tokens;
			g[i].ring0 = kvt_ring0(m, ly->n_tokens);
		} else {
			dev_desc(g + i, m, rc, &l, i, i, n, ly->n_tokens, r, r, dsel);
			ln->dver[i] = rc->dver;
		}
		if (kvt_invariant_aborts) { /* (test builds) the one it would write now */
			struct kvt_gpu_region full;

			dev_desc(&full, m, rc, &l, i, i, n, ly->n_tokens, r, r, dsel);
			NEVER(memcmp(&full, g + i,
				     offsetof(struct kvt_gpu_region, cap_blocks) + 4));
		}
		if (q)
			((struct kvt_gpu_quest *)(hb + l.qs))[i] = quest_desc(m, ly);
		/* the blocks' host groups the device has not seen, and those that moved */
		from = dgroup_from(rc, nb);
		for (uint32_t x = 0; x < rc->n_moved; x++)
			if (rc->moved[x] < from)
				dgroup_write(m, rc, ly, rc->moved[x], gat, gval, &n_g);
		for (uint32_t b = from; b < nb; b++)
			dgroup_write(m, rc, ly, b, gat, gval, &n_g);
		ln->rc[i] = rc;
		ln->n_slots[i] = rc->rg.n_slots;
		/* as recall_member */
		if (rc->rg.n_slots && !rc->ws_counted)
			ws_recount(c, rc, H * r);
		rc->dview_r = r;
		rc->dirty = true;
		rc->dgroups = nb;
		rc->n_moved = 0;
	}
	ALWAYS(n_g == gup);
	if (kind == SEL_GIVEN)
		memcpy(hb + l.sel, sel, (size_t)n * H * r * sizeof(*sel));
	up = (struct kvt_dcopy){.dev = c->dcall + l.up0,
				.host = hb + l.up0,
				.bytes = (kind == SEL_GIVEN ? l.sel_end : l.up) - l.up0};
	rd = (struct kvt_dcopy){.dev = c->dcall + l.rd0, .host = hb + l.rd0, .bytes = l.rd - l.rd0};
	run = (struct kvt_region_run){
		.up = &up,
		.n_up = 1,
		.group_at = c->dcall + l.gat,
		.group_val = c->dcall + l.gval,
		.n_groups = gup,
		.drop_rg = c->dcall + l.drg,
		.drop_k = c->dcall + l.drop_k,
		.drop_off = c->dcall + l.drop_off,
		.drop_gone = c->dcall + l.gone,
		.n_drop = nd,
		.grow_rg = c->dcall + l.grg,
		.grow_n = c->dcall + l.grow_n,
		.grow_off = c->dcall + l.grow_off,
		.n_grow = ng,
		.stack = c->dstack,
		.rg = c->dcall + l.rg,
		.qs = q ? c->dcall + l.qs : 0,
		.sel = c->dcall + l.sel,
		.missing = c->dcall + l.missing,
		.fresh = c->dcall + l.fresh,
		.n = n,
		.q = q,
		.dt = cf->dtype,
		.head_dim = cf->head_dim,
		.g_count = m->group_q,
		.n_heads = H,
		.lbt = m->lbt,
		.r = r,
		.block_bytes = m->block_bytes,
		.frame_base = c->base,
		.rd = &rd,
		.n_rd = 1,
		.lane = layer + 1,
		.time = m->time_every && (c->layer_calls[layer] + layer) % m->time_every == 0,
	};
	ln->nd = nd;
	ln->stamp = stamp;
	ln->dsel = kind == SEL_DEVICE;
	/* the blocks a load reads must have landed in the host history */
	done = KVT_RS_UPLOAD;
	err = wait ? m->ops->save_wait(m->be, wait) : 0;
	if (!err)
		err = KVT_XFER(m, region_run, &run, stream, &done);
	if (!err) {
		ln->pending = true;
		c->fifo[(c->fifo_head + c->n_pending) % cf->n_layers] = layer;
		c->n_pending++;
		kvt_dev_queue(m); /* its gather reads host groups: a spill waits for it */
		if (!repair)
			return 0;
		/* its loads may want blocks from disk: settled now (recall_core settled the
		   others), repaired, before the caller's next work reads the frames */
		ln->repair = true;
		ln->stream = stream;
		if (ALWAYS(c->n_pending == 1)) { /* its error as it is */
			c->fifo_head = (c->fifo_head + 1) % cf->n_layers;
			return dev_settle(m, layer);
		}
		return settle_through(m, layer);
	}
	snprintf(why, sizeof(why), "%s", m->be->err);
	snprintf(head, sizeof(head), "recall: layer %u: loading on the device", layer);
	return dev_give_up(m, ln, &run, done, stream, err, head, why);
}

/* After the gather of a recall call failed: the slots meant for its loads hold nothing valid,
   so they are emptied, and the views of the call read as stale (the previous ones were
   overwritten), so no attention silently runs without its recalled blocks. The regions keep
   their hits and their sizes; the working sets keep the call's blocks (an estimate, erring
   high). */
static void recall_undo(struct kvt_manager *m, uint32_t layer, uint32_t n, uint32_t nx)
{
	for (uint32_t x = 0; x < nx; x++) {
		uint32_t had = kvt_region_empty(&m->batch[m->rc.xmember[x]]->layers[layer].rc->rg,
						m->rc.xslot[x]);

		if (ALWAYS(m->rc.n_held >= had))
			m->rc.n_held -= had;
	}
	for (uint32_t i = 0; i < n; i++)
		m->batch[i]->layers[layer].rc->view_failed = true;
}

/* Reads back the spilled blocks that pass 2 listed (kvt_spill_want) and points the loads of
   m->xf[0..nx) that wait for them (src 0) at their host rows. 0 or the error, recorded. */
static int recall_fetch(struct kvt_manager *m, uint32_t layer, uint32_t nx)
{
	uint32_t H = m->cfg.n_kv_heads;
	int err = kvt_spill_fetch_wanted(m, "recall");

	if (err <= 0) /* nothing was on disk, or the error */
		return err;
	for (uint32_t x = 0; x < nx; x++) {
		const struct kvt_seq_layer *ly;
		uint32_t key;

		if (m->xf[x].src)
			continue;
		ly = &m->batch[m->rc.xmember[x]]->layers[layer];
		key = ly->rc->rg.slot[m->rc.xslot[x]].key;
		m->xf[x].src = kvt_host_row(m, ly, key % H, (key / H) << m->lbt);
	}
	return 0;
}

/* ---- Phase timing (base.h's phase_on: kvt_manager_phases) ---- */

/* Now (ns), and the backend's time inside the runtime's calls so far in *rt. */
static uint64_t phase_clock(const struct kvt_manager *m, uint64_t *rt)
{
	struct kvt_be_stats bs;

	kvt_manager_be_stats(m, &bs);
	*rt = bs.runtime_ns;
	return kvt_now_ns();
}

/* A phase begins now. */
static inline void phase_mark(struct kvt_manager *m)
{
	if (m->phase_on)
		m->phase_t = phase_clock(m, &m->phase_rt);
}

/* Phase k ends now: the time since the latest mark, less the runtime's part of it, is its; the
   next phase begins. */
static inline void phase_end(struct kvt_manager *m, enum kvt_phase k)
{
	uint64_t rt, t, wall, inrt;

	if (!m->phase_on)
		return;
	t = phase_clock(m, &rt);
	wall = t - m->phase_t;
	inrt = rt - m->phase_rt;
	m->phase_ns[k] += wall > inrt ? wall - inrt : 0;
	m->phase_t = t;
	m->phase_rt = rt;
}

/* One recall call: the selection sel ([n][H][r]) of the given kind: host memory for SEL_GIVEN;
   SEL_QUEST: Quest's, in host memory or, on the device (dev_regions, sel NULL), made there from
   the device queries q; SEL_DEVICE: the caller's, in device memory with the regions on the
   device, host memory otherwise. */
static int recall_core(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
		       const uint32_t *sel, enum sel_kind kind, uint32_t r, const void *q,
		       void *stream)
{
	struct kvt_recall_cache *rc = &m->rc;
	struct recall_job j = {
		.m = m, .layer = layer, .r = r, .sel = sel, .dsel = kind == SEL_DEVICE};
	struct kvt_region_tally t = {0};
	struct room_out ro = {0};
	uint64_t wait = 0;
	uint32_t nx = 0;
	bool repair;
	int err;

	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "recall: layer %u out of range (%u layers)", layer,
				m->cfg.n_layers);
	if (rc->n == 0)
		return kvt_fail(m, -EINVAL, "recall: no recall cache (config.recall_cache_bytes)");
	/* the layer's previous call first: its members' working sets are counted now */
	phase_mark(m);
	if (m->dev_regions && rc->lane && rc->lane[layer].pending) {
		err = settle_through(m, layer);
		if (err)
			return err;
	}
	phase_end(m, KVT_PH_SETTLE);
	if (m->dev_regions && rc->dbroken)
		return kvt_fail(
			m, rc->dbroken,
			"recall: an earlier call failed on the device: its regions' state is "
			"unknown");
	err = recall_validate(m, layer, seqs, n, sel, kind, r, stream);
	/* outside a step, the call sizes by the sums as its members' counts left them */
	if (!err && !m->step.open)
		kvt_recall_freeze(m);
	/* a call whose loads may read blocks back from disk is settled at once (dev_run), in
	   its turn: the calls before it first (nothing below spills or reads back) */
	repair = !err && m->dev_regions && batch_spilled(m, n, layer);
	if (repair)
		err = kvt_recall_settle(m);
	phase_end(m, KVT_PH_CHECK);
	if (!err)
		err = recall_room(m, layer, sel, kind, n, r, &ro, stream);
	if (err)
		return err;

	/* Pass 2: sizes, then each member's region decides. Nothing below fails except the
	   fetch and the gather. */
	recall_size(m, n, ro.regions);
	phase_end(m, KVT_PH_SIZE);
	if (m->dev_regions) { /* the figures come when the call is settled */
		err = dev_run(m, layer, n, sel, kind, q, r, &ro, repair, stream);
		phase_end(m, KVT_PH_RUN);
		if (!err) {
			m->st.recall_calls++;
			rc->layer_done[layer]++;
		}
		return err;
	}
	nx = recall_pass2(m, &j, n, &t, &wait);
	m->st.recall_evictions += t.evictions;

	/* Spilled blocks come back (one read), and the blocks must have landed in the host
	   history before the device reads them. */
	err = recall_fetch(m, layer, nx);
	if (err) {
		char why[sizeof(m->err)];

		recall_undo(m, layer, n, nx);
		memcpy(why, m->err, sizeof(why));
		return kvt_fail(m, err, "recall: layer %u: loading %u blocks: %s", layer, nx, why);
	}
	err = wait ? m->ops->save_wait(m->be, wait) : 0;
	if (!err && nx)
		err = kvt_dev_gather(m, nx, stream);
	if (err) {
		recall_undo(m, layer, n, nx);
		return kvt_fail(m, err, "recall: layer %u: loading %u blocks: %s", layer, nx,
				m->be->err);
	}
	phase_end(m, KVT_PH_RUN);
	m->st.recall_calls++;
	rc->layer_done[layer]++;
	m->st.recall_lookups += t.lookups;
	m->st.recall_hits += t.hits;
	m->st.recall_loads += nx;
	m->st.bytes_h2d += (uint64_t)nx * m->block_bytes;
	return 0;
}

/* The arguments of a call given its selection (m not NULL): 0 or -EINVAL recorded. */
static int given_args(struct kvt_manager *m, const uint64_t *seqs, uint32_t n,
		      const uint32_t *blocks, uint32_t r)
{
	if (!seqs || !blocks || n == 0 || r == 0)
		return kvt_fail(m, -EINVAL, "recall: %s",
				!seqs || !blocks ? "NULL pointer"
				: n == 0	 ? "empty batch"
						 : "r == 0");
	if ((uint64_t)n * m->cfg.n_kv_heads * r > UINT32_MAX)
		return kvt_fail(m, -EINVAL, "recall: selection of %u x %u x %u is too large", n,
				m->cfg.n_kv_heads, r);
	return 0;
}

KVT_API int kvt_recall_blocks(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const uint32_t *blocks, uint32_t r, void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = given_args(m, seqs, n, blocks, r);
	return err ? err : recall_core(m, layer, seqs, n, blocks, SEL_GIVEN, r, NULL, stream);
}

KVT_API int kvt_recall_device_blocks(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				     uint32_t n, const uint32_t *blocks, uint32_t r, void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = given_args(m, seqs, n, blocks, r);
	if (err)
		return err;
	/* With the regions on the device the selection stays there; device memory the CPU
	   reads otherwise, or a copy of it (a wait). */
	if (!m->dev_regions && m->payload && !m->cpu_device) {
		err = kvt_host_copy(m, blocks,
				    (uint64_t)n * m->cfg.n_kv_heads * r * sizeof(*blocks), stream);
		if (err)
			return kvt_fail(m, err, "recall: the selection: %s", m->be->err);
		blocks = (const uint32_t *)m->hcopy;
	}
	return recall_core(m, layer, seqs, n, blocks, SEL_DEVICE, r, NULL, stream);
}

/* Quest scoring of a recall call's members (m->batch[i]; NULL: left alone): member i's top-r
   blocks per kv head, among blocks not fully resident, into sel[i][h][r] (KVT_NO_ENTRY where
   fewer exist), from its queries ([n_q_heads][head_dim] at q + i * qstride). The batch is
   split into items as pass 2 is; each thread has its own scratch (by slot) in m->score (stride
   floats), m->cand (stride + r) and m->qf ((G + 2) * D floats). */
struct score_job {
	struct kvt_manager *m;
	uint32_t layer, r, n, n_parts;
	const uint8_t *q;
	uint64_t qstride;
	uint32_t *sel;
	size_t stride; /* the most blocks of a member's layer */
};

static void score_part(void *ctx, uint32_t slot, uint32_t k)
{
	struct score_job *j = ctx;
	struct kvt_manager *m = j->m;
	const struct kvt_config *c = &m->cfg;
	uint32_t H = c->n_kv_heads, G = m->group_q, D = c->head_dim;
	uint32_t i0 = (uint32_t)((uint64_t)j->n * k / j->n_parts);
	uint32_t i1 = (uint32_t)((uint64_t)j->n * (k + 1) / j->n_parts);
	float *score = m->score + slot * j->stride, *qf = m->qf + (size_t)slot * (G + 2) * D;
	uint32_t *cand = m->cand + slot * (j->stride + j->r);

	for (uint32_t i = i0; i < i1; i++) {
		const struct kvt_seq *s = m->batch[i];
		const struct kvt_seq_layer *ly = s ? &s->layers[j->layer] : NULL;
		struct kvt_region_geom g;

		if (!s)
			continue;
		g = geom_of(m, ly->n_tokens);
		kvt_quest_select(c->dtype, D, G, &ly->rc->rg, &g, ly->rc->meta,
				 j->q + i * j->qstride, j->r, j->sel + (size_t)i * H * j->r, score,
				 cand, qf);
	}
}

/* Member i of a recall call naming ids[] when it can be scored for layer (recall_core reports
   the others), else NULL. */
static struct kvt_seq *scorable(struct kvt_manager *m, const uint64_t *ids, uint32_t i,
				uint32_t layer)
{
	struct kvt_seq *s = kvt_member(m, ids, i);
	const struct kvt_seq_layer *ly = s ? &s->layers[layer] : NULL;

	return !s || s->lost || !ly->n_tokens || s->preempted || !ly->rc ||
			       !(m->dev_meta ? ly->rc->dmeta : (uint64_t)(uintptr_t)ly->rc->meta)
		       ? NULL
		       : s;
}

/* kvt_decode_recall's scoring on the backend's device (dev_meta): each member's top-K counts
   go there at its first recall, then one Quest selection of the whole batch writes m->sel.
   Members that cannot be scored get no entries (recall_core reports them). 0 or the error,
   recorded; nothing a caller sees changes. */
static int score_dev(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
		     const void *q, void *stream)
{
	const struct kvt_config *c = &m->cfg;
	uint32_t H = c->n_kv_heads, r = c->recall_blocks;
	int err;

	if (kvt_reserve((void **)&m->dq, &m->dq_cap, n, sizeof(*m->dq)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for a batch of %u", n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = scorable(m, seqs, i, layer);
		struct kvt_seq_layer *ly = s ? &s->layers[layer] : NULL;
		struct kvt_recall_layer *rc = ly ? ly->rc : NULL;

		m->dq[i] = (struct kvt_gpu_quest){0};
		if (!s)
			continue;
		if (!rc->tk_ready)
			tk_count(m, s, ly);
		if (!rc->dtk) {
			/* The prompt's blocks: later ones hold no top-K position (tk 0, as the
			   device table was zero-filled). */
			uint64_t bytes = (uint64_t)DIV_UP(ly->n_tokens, c->block_tokens) * H *
					 sizeof(*rc->rg.key);

			err = KVT_XFER(m, dmem_copy, kvt_dkey(m, rc), 0, rc->rg.key, bytes, stream);
			if (err)
				return kvt_fail(m, err, "recall: sequence %llu: top-K counts: %s",
						(unsigned long long)seqs[i], m->be->err);
			rc->dtk = true;
		}
		m->dq[i] = quest_desc(m, ly);
	}
	err = KVT_XFER(m, quest, c->dtype, c->head_dim, H, m->group_q, m->lbt, r, m->dq, n, q,
		       m->sel, stream);
	if (err)
		return kvt_fail(m, err, "recall: scoring on the device: %s", m->be->err);
	return 0;
}

/* Brings back the spilled host blocks that kvt_meta_catch_up of the batch will read, in one
   read (pinned for this call). 0 or the error, recorded. */
static int catch_up_fetch(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n)
{
	int err;

	if (!m->disk)
		return 0;
	++m->stamp;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = scorable(m, seqs, i, layer);
		struct kvt_seq_layer *ly = s ? &s->layers[layer] : NULL;

		if (s && ly->rc->meta_n < ly->n_tokens)
			kvt_spill_want_range(m, s, layer, ly->rc->meta_n, ly->n_tokens);
	}
	err = kvt_spill_fetch_wanted(m, "recall");
	return err < 0 ? err : 0;
}

KVT_API int kvt_decode_recall(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			      uint32_t n, const void *q, void *stream)
{
	uint32_t H, r, nb = 1;
	uint64_t qstride, stamp;
	int err = 0;

	if (!m)
		return -EINVAL;
	H = m->cfg.n_kv_heads;
	r = m->cfg.recall_blocks;
	if (!seqs || !q || n == 0)
		return kvt_fail(m, -EINVAL, "recall: %s", n == 0 ? "empty batch" : "NULL pointer");
	if (r == 0)
		return kvt_fail(m, -EINVAL, "recall: disabled (config.recall_blocks == 0)");
	if (!m->keep_meta)
		return kvt_fail(m, -ENOTSUP, "recall: backend %s keeps no block metadata",
				m->ops->name);
	if (layer >= m->cfg.n_layers)
		return kvt_fail(m, -EINVAL, "recall: layer %u out of range (%u layers)", layer,
				m->cfg.n_layers);
	if ((uint64_t)n * H * r > UINT32_MAX ||
	    kvt_reserve((void **)&m->sel, &m->sel_cap, n * H * r, sizeof(*m->sel)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for the selection of %u sequences",
				n);
	if (m->dev_regions) /* the selection stays on the device */
		return recall_core(m, layer, seqs, n, NULL, SEL_QUEST, r, q, stream);
	/* The batch first: one that names a member twice, or one that cannot be recalled, fails
	   before any scoring, copy or read from disk (which could otherwise fail first, for a
	   reason the call's arguments already ruled out), and fails in recall_validate, as it
	   does where the selection stays on the device: the same error, and the same counts
	   left behind (a call's validation counts it in its layer's calls, region_idle). */
	if (!m->rc.n) /* (fails: no recall cache) */
		return recall_core(m, layer, seqs, n, NULL, SEL_QUEST, r, NULL, stream);
	stamp = ++m->stamp;
	for (uint32_t i = 0; i < n; i++)
		if (!kvt_batch_member(m, seqs, i, layer, stamp, "recall", &err)) {
			err = recall_validate(m, layer, seqs, n, NULL, SEL_QUEST, r, stream);
			if (NEVER(!err)) /* it fails at member i at the latest */
				return kvt_fail(m, -EIO, "recall: inconsistent batch check");
			return err;
		}
	if (m->dev_meta) {
		err = score_dev(m, layer, seqs, n, q, stream);
		return err ? err
			   : recall_core(m, layer, seqs, n, m->sel, SEL_QUEST, r, NULL, stream);
	}
	qstride = (uint64_t)m->cfg.n_q_heads * m->row_bytes;
	if (!m->cpu_device) { /* the scoring runs on the CPU: the queries come over first */
		err = kvt_host_copy(m, q, n * qstride, stream);
		if (err)
			return kvt_fail(m, err, "recall: queries: %s", m->be->err);
		q = m->hcopy;
	}
	/* Metadata not folded in yet is built from the host history: its spilled blocks come
	   back first, all in one read. */
	err = catch_up_fetch(m, layer, seqs, n);
	if (err)
		return err;
	/* Metadata caught up and top-K counted here, then the scoring, shared by the recall
	   threads: each member's is its own. */
	if (kvt_reserve((void **)&m->batch, &m->batch_cap, n, sizeof(*m->batch)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for a batch of %u", n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = scorable(m, seqs, i, layer);
		struct kvt_seq_layer *ly = s ? &s->layers[layer] : NULL;

		m->batch[i] = s;
		/* recall_core reports every invalid sequence; score only valid ones. */
		if (!s) {
			for (size_t x = 0; x < (size_t)H * r; x++)
				m->sel[(size_t)i * H * r + x] = KVT_NO_ENTRY;
			continue;
		}
		err = kvt_meta_catch_up(m, s, ly);
		if (err)
			return err;
		if (!ly->rc->tk_ready)
			tk_count(m, s, ly);
		if (DIV_UP(ly->n_tokens, m->cfg.block_tokens) > nb)
			nb = DIV_UP(ly->n_tokens, m->cfg.block_tokens);
	}
	struct score_job j = {.m = m,
			      .layer = layer,
			      .r = r,
			      .n = n,
			      .q = q,
			      .qstride = qstride,
			      .sel = m->sel,
			      .stride = nb,
			      .n_parts = recall_items(m, n)};
	size_t qf_n = (size_t)(m->group_q + 2) * m->cfg.head_dim;
	uint32_t slots = recall_slots(m);

	if ((uint64_t)slots * (nb + r) > UINT32_MAX || (uint64_t)slots * qf_n > UINT32_MAX ||
	    kvt_reserve((void **)&m->score, &m->score_cap, slots * nb, sizeof(*m->score)) ||
	    kvt_reserve((void **)&m->cand, &m->cand_cap, slots * (nb + r), sizeof(*m->cand)) ||
	    kvt_reserve((void **)&m->qf, &m->qf_cap, (uint32_t)(slots * qf_n), sizeof(*m->qf)))
		return kvt_fail(m, -ENOMEM, "recall: no memory for scoring");
	kvt_par_run(m->rc.par, score_part, &j, j.n_parts);
	return recall_core(m, layer, seqs, n, m->sel, SEL_QUEST, r, NULL, stream);
}

KVT_API int kvt_seq_recall_view(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				uint32_t kv_head, struct kvt_recall_ref *out, uint32_t cap,
				uint32_t *n_out)
{
	const struct kvt_recall_layer *lrc;
	const struct kvt_seq_layer *ly;
	struct kvt_seq *s;
	uint32_t cnt;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!n_out || (cap && !out))
		return kvt_fail(m, -EINVAL, "recall view: NULL pointer");
	if (layer >= m->cfg.n_layers || kv_head >= m->cfg.n_kv_heads)
		return kvt_fail(m, -EINVAL, "recall view: %s out of range",
				layer >= m->cfg.n_layers ? "layer" : "kv head");
	s = kvt_seq_usable(m, seq, "recall view", &err);
	if (!s)
		return err;
	ly = &s->layers[layer];
	if (!ly->n_tokens || s->preempted)
		return kvt_fail(m, -EINVAL, "recall view: sequence %llu: %s",
				(unsigned long long)seq,
				s->preempted ? "preempted" : "layer not prefilled");
	lrc = ly->rc;
	err = kvt_recall_pull(m, ly->rc);
	if (err)
		return err;
	cnt = lrc && lrc->view_n ? lrc->view_n[kv_head] : 0;
	*n_out = cnt;
	if (kvt_view_stale(lrc))
		return kvt_fail(m, -ESTALE, "recall view: sequence %llu layer %u: %s",
				(unsigned long long)seq, layer, kvt_view_stale_why(lrc));
	if (cap < cnt)
		return kvt_fail(m, -ENOSPC, "recall view: %u needed, room for %u", cnt, cap);
	for (uint32_t i = 0; i < cnt; i++) {
		uint32_t id = lrc->view[(size_t)kv_head * lrc->view_cap + i];
		const struct kvt_region_slot *e = &lrc->rg.slot[id];
		uint32_t block = e->key / m->cfg.n_kv_heads;
		struct kvt_recall_ref ref = {
			.frame = kvt_slot_frame(m, lrc, id),
			.block = block,
			.n_valid = e->n_valid,
			.resident = kvt_block_resident(m, s, ly, kv_head, block, e->n_valid),
		};
		uint32_t j = i;

		while (j > 0 && out[j - 1].block > ref.block) {
			out[j] = out[j - 1];
			j--;
		}
		out[j] = ref;
	}
	return 0;
}
