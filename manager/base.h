/* SPDX-License-Identifier: MIT */
/*
 * The manager's state and the helpers every part of it shares (manager/base.c).
 *
 * The manager's files call each other in one direction only: a file calls functions of files
 * to its right, never of one to its left or beside it (test 'manager-dag', manager/check_dag.py,
 * checks it on the objects' symbols):
 *
 *   step.c -> manager.c, seq.c -> recall.c -> spill.c -> prefix.c -> base.c -> idmap.c, pool.c
 *   -> log.c, huge.c -> fault.c
 *
 * step.c runs decode steps on a batch named once (kvt_step_*); manager.c creates, destroys and
 * reports; seq.c runs sequences (create, prefill, decode, preempt, resume, reads); recall.c holds
 * block metadata, the recall cache and the working sets (recall.h); spill.c the disk tier
 * (spill.h); prefix.c the prefix cache of shared host groups (prefix.h); base.c the helpers below.
 * Each header declares the functions of its own file only, so a file's includes say what it may
 * call.
 *
 * A sequence keeps, per layer, three small tables: the device frame groups of its resident
 * slot space, the host block groups of its history, and its top-K positions per kv head. A
 * group is one block per kv head, contiguous, so heads share every table entry and decode
 * bookkeeping is O(1) per (sequence, layer).
 *
 * Resident slot space of one (sequence, layer, kv head), in slot units of one token row:
 *   [0, sink)                       sink tokens (position = slot)
 *   [sink, sink + recent)           the ring (docs/design.md ring rule)
 *   [sink + recent, + valid_topk)   top-K tokens, ascending positions, fixed after prefill
 * Slot s lives in frame group frames[s / block_tokens] at row s % block_tokens.
 */
#ifndef KVT_BASE_H
#define KVT_BASE_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "fault.h"
#include "idmap.h"
#include "kvtier.h"
#include "pool.h"
#include "region.h"
#include "util.h"

/* One cache line per layer (the sequence is allocated 64-byte aligned): a decode call touches
   exactly one line of each sequence's layer state. */
struct kvt_seq_layer {
	_Alignas(64) uint32_t n_tokens; /* tokens written; 0 = not prefilled */
	uint32_t ring_slot;		/* slot the next token goes to */
	/* Cursors for decode, so a token costs no table lookup except at a frame or block
	   boundary: head 0's K row address of ring_slot, and of position n_tokens in the host
	   history (0 when that position starts a block not allocated yet). */
	uint64_t dev_next, host_next;
	uint32_t n_groups, cap_groups;
	uint32_t *groups;	     /* host group of block index b, b < n_groups */
	uint32_t *frames;	     /* device frame group of frame index f, f < seq->n_frames */
	int32_t *topk;		     /* [n_kv_heads][seq->valid_topk] ascending */
	struct kvt_recall_layer *rc; /* block metadata and recall state (recall.h); NULL until
					needed */
};
_Static_assert(sizeof(struct kvt_seq_layer) == 64, "a sequence layer is one cache line");

#define KVT_NO_ENTRY UINT32_MAX
/* A group table entry with this bit holds a disk slot (manager/spill.c), not a host group. */
#define KVT_SPILLED 0x80000000u
#define KVT_WS_MAX 64u

/* The latest save that wrote into a block of a sequence's history by a decode append
   (kvt_seq.bt). */
struct kvt_blk_ticket {
	uint64_t ticket;
	uint32_t block;
};

/* What a batch call reads of every member (the stamp, the tickets, lost and preempted) sits in
   the first line. */
struct kvt_seq {
	uint64_t id;
	uint64_t serial;      /* m->seq_creates when it was created (kvt_seq_info.serial) */
	uint64_t stamp;	      /* last decode call that named it (duplicate detection) */
	uint64_t save_ticket; /* latest save that wrote into its host blocks */
	uint64_t bulk_ticket; /* latest save of rows other than a decode append's (a prefill's, a
				 chunk's, a prefix's spans) */
	/* [m->bt_n]: decode appends' saves by block, block b's at b % bt_n (its latest, where
	   block == b): what a recall's loads wait for (kvt_load_ticket). In the same allocation,
	   after layers[]. */
	struct kvt_blk_ticket *bt;
	int32_t lost;	    /* -EBADMSG once its history could not be read back, else 0 */
	uint32_t preempted; /* device frames freed (kvt_seq_preempt) */
	uint32_t prompt_tokens;
	uint32_t valid_topk; /* same for every layer and head: depends on the prompt length */
	uint32_t n_frames;   /* frame groups per layer */
	uint32_t layers_prefilled;
	uint32_t n_spilled;    /* group table entries (all layers) that are in the spill file */
	uint32_t slot;	       /* its place among the live sequences (kvt_manager.slots): where
				  its layers' recall states lie (recall.c, rc_slot) */
	uint64_t ws_counted;   /* the part of the recall cache's sum_ws of its layers' regions */
	uint64_t ws_snap;      /* ws_counted when the cache's sums were last frozen (snap_at), */
	uint64_t ws_snap_at;   /* copied when it first changes after that (recall.c, ws_freeze) */
	struct kvt_seq_px *px; /* prefix and chunk state (prefix.h), NULL when it has none */
	struct kvt_seq_layer layers[];
};

/* The recall cache (manager/recall.c): n single-block device frames, shared out as one region
   per (sequence, layer) that recalls (policy/region.h). A call sizes its members' regions:
   each gets at least what the call needs, and towards a part of the frames in proportion to
   its working set. */
/* A region's part of a call's sizing (struct kvt_recall_cache). */
struct kvt_size_op {
	struct kvt_recall_layer *rc;
	uint32_t n;   /* drops; slots before the grow */
	uint32_t off; /* stack offset: its first frame pushed; the stack's height before its pops */
	bool mark;    /* its drops make a view naming the slots stale (reclaim) */
};

struct kvt_recall_cache {
	uint32_t n;	/* frames */
	uint64_t base;	/* device address of frame 0; frame i at base + i * block_bytes */
	uint32_t *free; /* [n] stack of free frames */
	uint32_t n_free;
	uint64_t n_regions; /* (sequence, layer) regions holding frames */
	uint64_t n_held;    /* frames holding a block */
	uint64_t sum_ws;    /* the working sets of the regions holding frames, as last counted */
	uint64_t *layer_ws; /* [n_layers]: the part of sum_ws of each layer's regions */
	/* The sums a sizing reads (target_of): sum_ws and layer_ws as they were when last frozen,
	   at kvt_step_begin or, outside a step, by each call once its members are counted;
	   snap_at counts the freezes (a sequence's part: kvt_seq.ws_snap). */
	uint64_t snap_sum, snap_at;
	uint64_t *snap_layer;  /* [n_layers] */
	uint64_t *layer_done;  /* [n_layers]: each layer's recall calls that sized and succeeded */
	uint64_t *layer_swept; /* [n_layers]: layer_done + 1 of the layer's call that last swept
				  (recall_size): a call that fails and its retry sweep once */
	struct kvt_recall_layer *live_head, *live_tail; /* the regions holding frames */
	struct kvt_recall_layer *cursor; /* where the last round-robin reclaim stopped */
	struct kvt_recall_layer *sweep;	 /* where the region sweep stopped */
	uint64_t *layer_calls;		 /* [n_layers] recall calls per layer */
	/* per call: each member's slot floor and target, and what each load belongs to */
	uint32_t *need, *want;
	uint32_t need_cap, want_cap;
	struct kvt_recall_layer **mrc; /* each member's region (the layer's recall state) */
	uint32_t mrc_cap;
	uint32_t *xmember, *xslot;
	uint32_t x_cap, xslot_cap;
	struct kvt_region_load *ld; /* [threads][H * r]: each thread's scratch (by slot) */
	uint32_t ld_cap;
	struct kvt_par *par; /* config.recall_threads >= 2: the team sharing a call */
	/* The recall states (struct kvt_recall_layer) of layer l lie in slab[l], chunks of
	   RC_CHUNK by sequence slot (recall.c, rc_slot); each layer's table has slab_chunks
	   entries, a chunk NULL until a slot of it is used. Chunks live until the manager does. */
	struct kvt_recall_layer ***slab;
	uint32_t slab_chunks;
	/* The frames a call's sizing (recall_size) moves, applied when it ends so that a device
	   can replay them as one launch of drops and one of grows: every region's freed frames
	   pushed together, regions in the order of their first drop, then every grown region's
	   new slots given frames popped from the top, regions in the order of their first grow.
	   While sizing, top is the stack's height (n_free counts the frames promised away too)
	   and push_tag[p] names the region that pushed free[p] (its index in drop). */
	bool sizing;
	uint32_t top, seg0; /* free[seg0, top): pushed by the sizing under way */
	uint32_t *push_tag; /* [n] */
	uint32_t *tmp;	    /* [n] scratch of the regrouping */
	/* [KVT_REGION_MAX_SLOTS bits]: while region_shrink drops slots of a region whose view
	   it watches, bit s says the view names slot s; all clear otherwise */
	uint64_t *named;
	struct kvt_size_op *drop; /* regions that dropped, first drop first: their drops
				     (then, after frames_commit, where their frames went) */
	struct kvt_size_op *grow; /* regions that grew, first grow first: their slots before
				     (then where their frames came from) */
	uint32_t n_drop, drop_cap, n_grow, grow_cap;
	/* On the device (dev_regions): the free-frame stack (dstack, [n], set up at the first
	   call), a call's program (dcall, dcall_cap bytes, its upload part written at hblob) */
	uint64_t dstack, dcall, dcall_cap;
	uint64_t dver_seq; /* the latest version given a region's device tables (dver) */
	bool dstack_ready;
	uint8_t *hblob;
	uint32_t hblob_cap;
	int dbroken; /* a program failed (the device's state is unknown): every later call's */
	/* Calls whose program was queued without a wait (dev_regions): lane[l] is layer l's
	   latest (the backend's lane l + 1), its reads applied when it is settled: in the order
	   the calls were made (fifo holds their layers from fifo_head), at the layer's next call
	   at the latest (manager/recall.c, "Settling"). */
	struct kvt_dlane *lane; /* [n_layers] */
	uint32_t *fifo;		/* [n_layers] */
	uint32_t fifo_head, n_pending;
	uint64_t repairs; /* calls whose loads read blocks back from disk (dev_repair) */
};

struct kvt_spill_ref;
struct kvt_dlane;
struct kvt_par;
struct kvt_want;
struct kvt_pspan;
struct kvt_seq_px;
struct kvt_disk_io;
struct kvt_gpu_quest;
struct kvt_dcopy;

/* The prefix cache (prefix.h). */
struct kvt_prefix {
	struct kvt_idmap map;			 /* hash -> struct kvt_pspan */
	struct kvt_pspan *idle_head, *idle_tail; /* spans no sequence holds, LRU first */
	uint32_t *href; /* [host.n_units] owners beyond the first of each host group (calloc:
			   zero pages until a group is shared) */
	uint64_t groups, groups_idle, groups_disk; /* of the cached spans */
	struct kvt_disk_io *dio;		   /* I/O list of span writes and reads */
	uint32_t dio_cap;
	uint32_t *gids; /* host groups of a restore */
	uint32_t gids_cap;
};

/* The phases of a recall call whose host time a manager can keep (base.h's phase_on): settling
   the layer's previous call (its results applied), checking the batch (members, their tables,
   the spilled ones), sizing the regions, and the decisions and loads (on the device: the
   program written and queued). */
enum kvt_phase { KVT_PH_SETTLE, KVT_PH_CHECK, KVT_PH_SIZE, KVT_PH_RUN, KVT_PH_N };

struct kvt_manager {
	struct kvt_config cfg;
	const struct kvt_backend_ops *ops;
	struct kvt_be *be;

	/* derived geometry */
	uint32_t esize, row_bytes, group_q, lbt, slots_sr; /* slots_sr = sink + recent */
	uint32_t bt_n; /* entries of a sequence's bt: the blocks an append's token takes to leave
			  the ring (recent_tokens / block_tokens + 1), and two */
	uint64_t block_bytes, group_bytes, v_offset;

	uint64_t dev_base, host_base, dev_arena_bytes, host_arena_bytes;
	bool payload, cpu_device; /* bytes exist; device tier CPU-readable */
	/* Device work that reads host blocks or writes frames may be queued on some stream
	   since the last device-wide wait (backends whose device tier the CPU cannot read queue
	   their copies): kvt_dev_quiesce waits for it before either changes hands. */
	bool dev_queued;
	struct kvt_pool dev, host;
	struct kvt_idmap seqs; /* id -> struct kvt_seq (kvt_seqmap_get) */
	uint64_t stamp;
	/* sequence states freed and created so far: a step's members resolve again */
	uint64_t seq_frees, seq_creates;
	/* The live sequences' places (kvt_seq.slot), dense: n_made given out so far, the free
	   ones a stack (free[0, n_free)) taken from the top. */
	struct kvt_slots {
		uint32_t *free;
		uint32_t n_free, cap, n_made;
	} slots;
	uint64_t dmeta_bytes; /* device metadata tables held (kvt_stats.device_meta_bytes) */
	/* The open decode step (manager/step.c): its members named once at kvt_step_begin and
	   resolved to their states, so that its per-layer calls look nothing up by id. */
	struct kvt_step {
		uint64_t *ids;	     /* [n] the members, as named */
		struct kvt_seq **of; /* [n] their states (NULL: no longer live) */
		uint32_t n, cap;
		uint32_t missing;	 /* entries of of[] that are NULL */
		uint64_t frees, creates; /* seq_frees and seq_creates when of[] was resolved */
		bool open;
		bool active; /* a step call runs: batch lookups read of[] (kvt_member) */
	} step;

	/* scratch reused across calls (never shrinks) */
	struct kvt_xfer *xf;
	uint32_t xf_cap;
	struct kvt_append *ap;
	uint32_t ap_cap;
	uint32_t *fresh; /* batch indices that start a new host block */
	uint32_t fresh_cap;
	struct kvt_seq **batch;
	uint32_t batch_cap;
	void *sel_scratch;
	size_t sel_scratch_bytes;
	struct kvt_attend_rows *segs; /* kvt_attend: every head's, head h's from seg_off[h] */
	uint32_t segs_cap;
	uint32_t *seg_off;
	uint32_t seg_off_cap;
	uint64_t *tab; /* kvt_step_tables: the host copy of the tables, then its sort scratch */
	uint32_t tab_cap;
	uint64_t att_dev, att_dev_bytes; /* kvt_attend_batch's device buffer (tables, scratch) */

	/* recall */
	bool keep_meta;	     /* block metadata maintained (recall_blocks > 0, and the device tier is
				CPU-readable or the backend builds metadata itself) */
	uint32_t meta_bytes; /* 2 * row_bytes */
	bool dev_meta;	     /* metadata kept and scored on the backend's device (recall.h) */
	bool dev_regions;    /* recall regions kept and run there too (recall.c) */
	struct kvt_recall_cache rc;
	uint32_t *sel; /* [n][H][r] selection of the current recall call */
	uint32_t sel_cap;
	float *score; /* scoring scratch */
	uint32_t *cand;
	uint32_t score_cap, cand_cap;
	struct kvt_gpu_quest *dq; /* descriptors of a scoring on the device (dev_meta) */
	uint32_t dq_cap;
	float *qf; /* queries of one sequence in f32, and bound scratch */
	uint32_t qf_cap;
	/* Host copy of a caller's device tensor the CPU policy needs (decode keys for block
	   metadata, recall queries) when the device tier is not CPU-readable. */
	uint8_t *hcopy;
	uint32_t hcopy_cap;

	/* disk tier (manager/spill.c); disk is NULL without one */
	struct kvt_disk *disk;
	char *spill_dir; /* the manager's copy of cfg.spill_dir */
	struct kvt_disk_io *dio;
	struct kvt_spill_ref *sref; /* what each entry of dio belongs to (spill.h) */
	uint32_t dio_cap;
	/* [host.n_units] the low 32 bits of the stamp of the latest call that pinned each host
	   group (it needs the group in the host tier until it returns); zero pages until used */
	uint32_t *hpin;
	/* Spilled blocks the call stamped want_stamp needs back (spill.h): a list left by an
	   earlier call is dropped by the next kvt_spill_want; want_err is -ENOMEM once it could
	   not grow, reported by kvt_spill_fetch_wanted. */
	struct kvt_want *want;
	uint32_t n_want, want_cap;
	uint64_t want_stamp;
	int want_err;

	struct kvt_prefix px;

	struct kvt_stats st;
	/* The recall calls' host time by phase (enum kvt_phase), kept only with
	   KVTIER_TIME_PHASES=1 at create: each phase's wall time less the backend's time inside
	   the runtime's calls during it (kvt_be_stats.runtime_ns, zero unless the backend times
	   them), read by kvt_manager_phases. phase_t and phase_rt: the latest mark's. */
	bool phase_on;
	/* With the recall regions on the device, one call of a layer in time_every has its
	   program's device time measured (kvt_stats.recall_device_ns): the layer's calls whose
	   count plus the layer is a multiple of it, so the timed layer moves from step to step.
	   Timing costs two runtime calls (an event before the program, its elapsed time at the
	   settle). KVTIER_RECALL_TIME_EVERY at create: 0 none, 1 every call; KVT_TIME_EVERY
	   unless set. */
	uint32_t time_every;
#define KVT_TIME_EVERY 16u
	uint64_t phase_ns[KVT_PH_N];
	uint64_t phase_t, phase_rt;
	char err[256];
};

/* The live sequence id, or NULL: the sequence map's lookup, typed. */
static inline struct kvt_seq *kvt_seqmap_get(const struct kvt_idmap *seqs, uint64_t id)
{
	return kvt_idmap_get(seqs, id);
}

/* Geometry helpers shared by the manager's files. */
static inline uint64_t kvt_dev_row(const struct kvt_manager *m, const struct kvt_seq_layer *ly,
				   uint32_t h, uint32_t slot)
{
	return m->dev_base + (uint64_t)ly->frames[slot >> m->lbt] * m->group_bytes +
	       h * m->block_bytes + (uint64_t)(slot & (m->cfg.block_tokens - 1)) * m->row_bytes;
}

static inline uint64_t kvt_host_row(const struct kvt_manager *m, const struct kvt_seq_layer *ly,
				    uint32_t h, uint32_t pos)
{
	return m->host_base + (uint64_t)ly->groups[pos >> m->lbt] * m->group_bytes +
	       h * m->block_bytes + (uint64_t)(pos & (m->cfg.block_tokens - 1)) * m->row_bytes;
}

/* Blocks a layer of N tokens spans: DIV_UP(N, block_tokens) with a shift (block_tokens is a
   power of two), as the per-member loops of a recall call compute it for every member. */
static inline uint32_t kvt_blocks(const struct kvt_manager *m, uint32_t N)
{
	return (uint32_t)(((uint64_t)N + m->cfg.block_tokens - 1) >> m->lbt);
}

/* First position of the ring window of a layer holding N tokens: max(sink, N - recent). The
   resident set is [0, min(N, sink)) + top-K + [kvt_ring0, N). */
static inline uint32_t kvt_ring0(const struct kvt_manager *m, uint32_t N)
{
	uint32_t r = N > m->cfg.recent_tokens ? N - m->cfg.recent_tokens : 0;

	return r < m->cfg.sink_tokens ? m->cfg.sink_tokens : r;
}

/* The save that a recall's loads from layer ly of s wait for (0: none). A load reads a whole
   block holding a token outside the resident set, one of [sink, ring0) (kvt_ring0), so a block
   up to (ring0 - 1) / block_tokens: those blocks' rows came from the prompt's saves
   (bulk_ticket) and from the appends whose blocks' entries bt keeps. A decode append writes
   into the ring, which its token leaves recent_tokens appends later, so in a decode step
   (append, then recall, layer by layer) a recall does not wait for the saves of the step's
   appends: the device need not have reached them. */
/* The last block a load from layer ly can read, KVT_NO_ENTRY when none can (nothing is
   outside the resident set). */
static inline uint32_t kvt_load_block(const struct kvt_manager *m, const struct kvt_seq_layer *ly)
{
	uint32_t ring0 = kvt_ring0(m, ly->n_tokens);

	return ring0 > m->cfg.sink_tokens ? (ring0 - 1) >> m->lbt : KVT_NO_ENTRY;
}

static inline uint64_t kvt_load_ticket(const struct kvt_manager *m, const struct kvt_seq *s,
				       const struct kvt_seq_layer *ly)
{
	uint32_t b = kvt_load_block(m, ly);
	const struct kvt_blk_ticket *e;
	uint64_t t;

	if (b == KVT_NO_ENTRY)
		return 0;
	e = &s->bt[b % m->bt_n];
	/* The entry names block b (its latest append, after those of the blocks before it), an
	   older block (no append wrote into b, so none into a block before it) or a later one
	   (this layer trails the appends by more than bt_n blocks: every save, to be safe). */
	t = e->block == b ? e->ticket : e->block > b ? s->save_ticket : 0;
	return t > s->bulk_ticket ? t : s->bulk_ticket;
}

/* Asks for the entry kvt_load_ticket reads (a batch call's walk, members ahead). */
static inline void kvt_load_ticket_prefetch(const struct kvt_manager *m, const struct kvt_seq *s,
					    const struct kvt_seq_layer *ly)
{
	uint32_t b = kvt_load_block(m, ly);

	if (b != KVT_NO_ENTRY)
		__builtin_prefetch(&s->bt[b % m->bt_n]);
}

/* Records that a decode append's save `ticket` wrote into block b of s. */
static inline void kvt_note_append(const struct kvt_manager *m, struct kvt_seq *s, uint32_t b,
				   uint64_t ticket)
{
	struct kvt_blk_ticket *e = &s->bt[b % m->bt_n];

	if (e->block > b) /* a layer trailing the others: b's entry is gone, so waits take all */
		s->bulk_ticket = ticket > s->bulk_ticket ? ticket : s->bulk_ticket;
	else if (e->block < b || ticket > e->ticket)
		*e = (struct kvt_blk_ticket){.ticket = ticket, .block = b};
	s->save_ticket = ticket > s->save_ticket ? ticket : s->save_ticket;
}

/* Index of the first of the n ascending top-K positions t[] that is >= pos (n if none). */
static inline uint32_t kvt_topk_lower(const int32_t *t, uint32_t n, uint32_t pos)
{
	uint32_t lo = 0, hi = n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if ((uint32_t)t[mid] < pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The decode cursor of a layer's host history: head 0's K row of position n_tokens, or 0 when
   that position starts a block not allocated yet. */
static inline uint64_t kvt_host_cursor(const struct kvt_manager *m, const struct kvt_seq_layer *ly)
{
	return (ly->n_tokens & (m->cfg.block_tokens - 1)) ? kvt_host_row(m, ly, 0, ly->n_tokens)
							  : 0;
}

/* Records the detail of a failure for kvt_manager_last_error and logs it at debug level;
   returns err. */
int kvt_fail(struct kvt_manager *m, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Grows a scratch array to hold n elements of size sz (never shrinks), doubling from *cap (64
   when 0). 0 or -ENOMEM (nothing changed). */
int kvt_reserve(void **arr, uint32_t *cap, uint32_t n, size_t sz);
/* kvt_reserve with the array's own realloc (e.g. kvt_huge_realloc for table memory). */
int kvt_reserve_with(void *(*re)(void *, size_t), void **arr, uint32_t *cap, uint32_t n, size_t sz);

/* Calls backend transfer op `op` (copy_d2d, gather_h2d, save, append, read_d2h) unless the
   fault hook fails this transfer site, which then returns -EIO as a failed copy would. */
#define KVT_XFER(m, op, ...)                                                              \
	(kvt_fault(KVT_FAULT_XFER) ? kvt_be_fail((m)->be, -EIO, "injected fault in " #op) \
				   : (m)->ops->op((m)->be, __VA_ARGS__))

/* Copies bytes of a caller's device tensor at src into m->hcopy (synchronously, after the
   device work queued on stream before, the tensor's writer's; NULL: all the device's work).
   0, -ENOMEM (detail in the backend's err) or the backend's error. */
int kvt_host_copy(struct kvt_manager *m, const void *src, uint64_t bytes, void *stream);

/* Before a call queues device work that reads host blocks or writes frames. */
static inline void kvt_dev_queue(struct kvt_manager *m)
{
	m->dev_queued |= !m->cpu_device;
}

/* Waits for the device work queued on any stream since the last device-wide wait, so the host
   blocks it reads and the frames it writes can change hands (free, spill, reuse by another
   stream's work): nothing to do on a synchronous backend or when nothing was queued. 0, or
   the backend's error with its detail in m->be->err. After a failed wait nothing queued runs
   any more (the wait returns when the device is idle or its context is lost), so failure
   paths that only clean up may go on regardless. */
int kvt_dev_quiesce(struct kvt_manager *m);

/* Loads the nx entries of m->xf from host blocks into frames on stream (resume, recall): 0 or
   the backend's error, after which no part of the load is still queued. */
int kvt_dev_gather(struct kvt_manager *m, uint32_t nx, void *stream);

/* The live sequence id, or NULL with the error recorded: -ENOENT, or its loss (-EBADMSG)
   for every call but destroy and info. `what` prefixes the message (may be NULL). */
struct kvt_seq *kvt_seq_usable(struct kvt_manager *m, uint64_t id, const char *what, int *err);

/* The state of member i of a batch call naming ids[]: during a step call (ids is the step's)
   the one resolved at kvt_step_begin, else looked up by id. NULL when not live. */
static inline struct kvt_seq *kvt_member(const struct kvt_manager *m, const uint64_t *ids,
					 uint32_t i)
{
	return m->step.active ? m->step.of[i] : kvt_seqmap_get(&m->seqs, ids[i]);
}

/* Looks up member i of a batch call naming ids[] (decode, recall; `what` prefixes the error):
   live, not named before in this batch (stamp), resident, with `layer` prefilled. NULL with
   the error recorded in *err otherwise. Inline: it runs once per sequence of every decode
   call. */
static inline struct kvt_seq *kvt_batch_member(struct kvt_manager *m, const uint64_t *ids,
					       uint32_t i, uint32_t layer, uint64_t stamp,
					       const char *what, int *err)
{
	uint64_t id = ids[i];
	struct kvt_seq *s = kvt_member(m, ids, i);

	if (!s) {
		*err = kvt_fail(m, -ENOENT, "%s: sequence %llu is not live", what,
				(unsigned long long)id);
		return NULL;
	}
	if (s->stamp == stamp) {
		*err = kvt_fail(m, -EINVAL, "%s: sequence %llu appears twice in the batch", what,
				(unsigned long long)id);
		return NULL;
	}
	s->stamp = stamp;
	if (s->lost) {
		*err = kvt_fail(m, s->lost, "%s: sequence %llu: its history was lost", what,
				(unsigned long long)id);
		return NULL;
	}
	if (!s->layers[layer].n_tokens || s->preempted) {
		*err = kvt_fail(m, -EINVAL, "%s: sequence %llu: %s", what, (unsigned long long)id,
				s->preempted ? "preempted (resume it first)"
					     : "layer not prefilled");
		return NULL;
	}
	return s;
}

#endif /* KVT_BASE_H */
