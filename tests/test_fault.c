/* SPDX-License-Identifier: MIT */
/*
 * fault: every fault site of a scripted workload, failed one at a time (manager/fault.h).
 *
 * The workload (host backend, t_small_config geometry, one save thread so saves are real,
 * recall of 2 blocks into an 8-frame cache, a host tier small enough that blocks spill to a
 * disk tier in a mkdtemp directory) creates a manager and seven sequences, prefills every
 * layer (in both orders), decodes in batches across block boundaries, recalls (scored and
 * given, evicting other sequences' frames), attends, reads resident and host-only tokens,
 * preempts and resumes, spills and fetches (explicitly, and through reads, decode and
 * resume), runs the scheduler over three requests (it preempts and resumes one), destroys
 * sequences and the manager. Every library call of it is one numbered step whose result is
 * known in advance (0; -ENOTSUP for spill and fetch in a build without the disk tier).
 *
 *   1. Counting runs (kvt_fault_arm(mask, 0)) give K, the hits of the whole workload, and the
 *      hits after every step; one run per site class gives the split.
 *   2. A fault-free snapshot run records the visible state before every step: the stats, the
 *      scheduler's pending count, and per sequence its info, token counts, resident
 *      positions, frames, recall views and attention output; also the outputs of the attend
 *      steps and the state and attention at the end.
 *   3. For N in 1..K a run fails hit N. The call that takes it must return a negative errno
 *      and change nothing visible: the state right after it must equal the fault-free
 *      state before it, except where blocks sit between host and disk (the documented
 *      exceptions: a fetch keeps the sequences that came back, a spill the blocks it wrote,
 *      and stats.disk_io_errors counts the failure). Every token of every live sequence must
 *      then read back bit-exact through kvt_seq_read_token and kvt_seq_read_token_host. The
 *      call is retried once with the hook disarmed: it must succeed and leave the state the
 *      fault-free run had after it. Every later step must return what it did without the
 *      fault (attention outputs bit for bit); at the end every token is read back again, the
 *      state is compared with the fault-free end, and attention after a recall of fixed
 *      blocks must match. The ASan build's leak check covers every failure path.
 *      A call may take its fault and succeed only where nothing is lost (see absorbed()).
 *
 * Problems are collected (the first of each run) and listed at the end, grouped by the call
 * that took the fault, the site and the kind; the test fails if there is any. Environment:
 * KVT_FAULT_ONLY=<n> walks hit n only, KVT_FAULT_VERBOSE=1 prints every problem,
 * KVT_FAULT_STEPS=1 prints the steps and their hits; TMPDIR chooses where the spill
 * directory is made (default /tmp).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "fault.h"
#include "internal.h"

/* Geometry of t_small_config, which the workload uses. */
#define NL 2
#define NH 2
#define NQ 4
#define HD 16
#define BT 8
#define RB 2		/* recall_blocks */
#define RC_FRAMES 8	/* recall cache frames */
#define DEV_GROUPS 36	/* device groups of resident sets: the scheduler preempts */
#define HOST_GROUPS 256 /* host groups without a disk tier */
#define HOST_GROUPS_DISK 48
#define RES_CAP 48 /* sink + recent + top-K = 40 */
#define FR_CAP 8
#define VIEW_CAP 8
#define MAX_STEPS 1024
#define MAX_PROBLEMS 64
#define MAX_BATCH 4

#define F_ABSORB (1u << 0)  /* may absorb the fault and succeed (see absorbed()) */
#define F_VOID (1u << 1)    /* returns nothing */
#define F_MCREATE (1u << 2) /* kvt_manager_create: *out must stay untouched */
#define F_SCREATE (1u << 3) /* kvt_sched_create: likewise */

#define M_SENTINEL ((struct kvt_manager *)(uintptr_t)0x5a5a5a50)
#define S_SENTINEL ((struct kvt_sched *)(uintptr_t)0x5a5a5a60)

enum { A = 0, B, C, D, E, F, G, N_IDS };
static const uint64_t seq_id[N_IDS] = {11, 12, 13, 14, 21, 22, 23};
static const uint32_t seq_prompt[N_IDS] = {48, 40, 20, 64, 32, 44, 16};
static const uint32_t seq_max_new[N_IDS] = {0, 0, 0, 0, 6, 5, 4}; /* scheduler requests */

static const char *const site_name[KVT_FAULT_SITES + 1] = {"alloc", "xfer",  "io",
							   "cuda",  "stage", "none"};

/* ---- what the fault-free runs recorded ---------------------------------------------------- */

struct shead {
	int res_rc, fr_rc, view_rc;
	uint32_t n_res, n_fr, n_slots, n_view;
	int32_t res[RES_CAP];
	uint64_t fr[FR_CAP];
	struct kvt_recall_ref view[VIEW_CAP];
};

struct slayer {
	int tok_rc, att_rc;
	uint32_t tok;
	struct shead h[NH];
	float att[NQ * HD];
};

struct sseq {
	int info_rc;
	struct kvt_seq_info info;
	struct slayer l[NL];
};

/* The visible state of the manager (and scheduler) at one moment. */
struct snap {
	struct kvt_stats st;
	uint32_t pending; /* kvt_sched_pending, UINT32_MAX without a scheduler */
	struct sseq s[N_IDS];
};

static struct kvt_config g_cfg;
static bool g_disk;	 /* the build has a disk tier (spill does not say -ENOTSUP) */
static char g_dir[256];	 /* spill directory */
static uint32_t g_steps; /* steps of the fault-free workload */
static const char *g_name[MAX_STEPS];
static uint64_t g_hits_after[MAX_STEPS]; /* hits (all sites) after each step */
static uint64_t g_k;			 /* hits of the whole workload, all sites */
static uint64_t g_k_site[KVT_FAULT_SITES];
static struct snap *g_snap[MAX_STEPS + 1]; /* before each step */
/* g_snap[i] is not the state right after step i - 1: the end checks ran in between */
static bool g_snap_gap[MAX_STEPS + 1];
static float *g_att[MAX_STEPS]; /* output of each attend step */
static struct snap *g_end;	/* at the end of the workload */
static int g_end_att_rc[N_IDS][NL];
static float g_end_att[N_IDS][NL][NQ * HD];
static uint32_t g_sched_preempted, g_sched_resumed, g_sched_iters;

/* figures of the walk */
static uint64_t g_walked[KVT_FAULT_SITES], g_failed, g_absorbed, g_retried, g_placement;
static uint64_t g_tokens, g_lost, g_create_failed, g_log_msgs;

/* Faults a call absorbed and succeeded anyway, by call and site (reported, not failures). */
struct absorbed {
	const char *call;
	enum kvt_fault_site site;
	uint32_t count;
	uint64_t first_n;
};

static struct absorbed g_abs[32];
static uint32_t g_n_abs;

/* What the failed calls returned, by call. */
struct errs {
	const char *call;
	int rc[8];
	uint32_t count[8];
	uint32_t placement; /* failures that moved blocks between host and disk */
};

static struct errs g_errs[32];
static uint32_t g_n_errs;

static struct errs *count_error(const char *call, int rc)
{
	uint32_t i, k;

	for (i = 0; i < g_n_errs && strcmp(g_errs[i].call, call); i++)
		;
	if (i == g_n_errs) {
		if (g_n_errs == sizeof(g_errs) / sizeof(g_errs[0]))
			return NULL;
		g_errs[g_n_errs++].call = call;
	}
	for (k = 0; k < 8 && g_errs[i].count[k] && g_errs[i].rc[k] != rc; k++)
		;
	if (k < 8) {
		g_errs[i].rc[k] = rc;
		g_errs[i].count[k]++;
	}
	return &g_errs[i];
}

/* ---- problems ------------------------------------------------------------------------------ */

struct problem {
	char key[160];
	char first[2000];
	uint32_t count;
};

static struct problem g_prob[MAX_PROBLEMS];
static uint32_t g_n_prob;
static uint64_t g_prob_total, g_prob_dropped;
static bool g_verbose;

enum mode { MODE_COUNT, MODE_SNAP, MODE_FAULT };

struct mseq {
	uint64_t id;
	uint32_t L;
	bool live;
	uint32_t n[NL]; /* tokens per layer; 0 = not prefilled */
};

struct run {
	enum mode mode;
	uint32_t mask;
	uint64_t nth;
	bool armed;	   /* the hook counts for this run (paused or not) */
	bool paused;	   /* disarmed for checks that are not part of the workload */
	uint64_t hit_base; /* hits counted before the latest arming */
	bool fired;	   /* the armed hit fired */
	bool aligned;	   /* the steps so far are those of the fault-free run */
	bool tainted;	   /* a problem was recorded: further ones are not */
	uint32_t step;
	const char *what;     /* step under way */
	const char *fault_at; /* step that took the fault */
	uint32_t fault_step;
	enum kvt_fault_site site;
	struct kvt_config c;
	struct kvt_manager *m;
	struct kvt_sched *s;
	struct mseq q[N_IDS];
	size_t rb;
	uint8_t *k, *v, *qo, *qd;
};

static struct run *g_run; /* for check_context */

static void run_context(char *buf, size_t len)
{
	if (g_run)
		snprintf(buf, len, "mode %d, N=%llu, step %u (%s): ", (int)g_run->mode,
			 (unsigned long long)g_run->nth, g_run->step,
			 g_run->what ? g_run->what : "-");
}

static void problem(struct run *r, const char *kind, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Records a problem of run r; only its first one counts (what follows is usually a
   consequence). The key groups problems by the call that took the fault, the site and kind. */
static void problem(struct run *r, const char *kind, const char *fmt, ...)
{
	char msg[1800], key[160], first[2000];
	va_list ap;
	uint32_t i;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r->tainted) {
		g_prob_dropped++;
		return;
	}
	r->tainted = true;
	g_prob_total++;
	if (r->mode == MODE_FAULT)
		snprintf(key, sizeof(key), "%s, %s hit: %s", r->fault_at ? r->fault_at : r->what,
			 site_name[r->fault_at ? r->site : KVT_FAULT_SITES], kind);
	else
		snprintf(key, sizeof(key), "fault-free run (mode %d): %s", (int)r->mode, kind);
	snprintf(first, sizeof(first), "N=%llu, fault in step %u (%s), at step %u (%s): %s",
		 (unsigned long long)r->nth, r->fault_at ? r->fault_step : 0,
		 r->fault_at ? r->fault_at : "-", r->step, r->what ? r->what : "-", msg);
	if (g_verbose)
		print_message("# problem: %s\n", first);
	for (i = 0; i < g_n_prob; i++)
		if (!strcmp(g_prob[i].key, key))
			break;
	if (i == g_n_prob) {
		if (g_n_prob == MAX_PROBLEMS)
			return;
		g_n_prob++;
		snprintf(g_prob[i].key, sizeof(g_prob[i].key), "%s", key);
		snprintf(g_prob[i].first, sizeof(g_prob[i].first), "%s", first);
	}
	g_prob[i].count++;
}

/* ---- the hook ------------------------------------------------------------------------------ */

static uint64_t hits_now(const struct run *r)
{
	return r->hit_base + (r->armed && !r->paused ? kvt_fault_hits() : 0);
}

/* Stops counting for checks that are not part of the workload (snapshots, read-back). */
static void pause_hook(struct run *r)
{
	if (!r->armed || r->paused)
		return;
	r->hit_base += kvt_fault_disarm();
	r->paused = true;
}

static void resume_hook(struct run *r)
{
	if (!r->armed || !r->paused)
		return;
	r->paused = false;
	kvt_fault_arm(r->mask, r->mode == MODE_FAULT ? r->nth - r->hit_base : 0);
}

/* ---- deterministic data ---------------------------------------------------------------------- */

/* Attention queries of (seq, layer), f32 [NQ][HD]. */
static void attend_q(uint64_t id, uint32_t l, float *q)
{
	for (uint32_t g = 0; g < NQ; g++)
		for (uint32_t d = 0; d < HD; d++)
			q[g * HD + d] = t_value(id, l, 3000 + g, 0, d, 0);
}

/* ---- snapshots ------------------------------------------------------------------------------- */

static struct snap *snapshot(struct run *r)
{
	struct snap *sn = t_xmalloc(sizeof(*sn));
	float q[NQ * HD];

	sn->st = (struct kvt_stats)KVT_STATS_INIT;
	CHECK_RC(kvt_manager_stats(r->m, &sn->st), 0);
	sn->pending = r->s && r->s != S_SENTINEL ? kvt_sched_pending(r->s) : UINT32_MAX;
	for (uint32_t j = 0; j < N_IDS; j++) {
		struct sseq *ss = &sn->s[j];

		ss->info.size = sizeof(ss->info);
		ss->info_rc = kvt_seq_info(r->m, seq_id[j], &ss->info);
		if (ss->info_rc)
			continue;
		for (uint32_t l = 0; l < NL; l++) {
			struct slayer *sl = &ss->l[l];

			sl->tok_rc = kvt_seq_tokens(r->m, seq_id[j], l, &sl->tok);
			if (sl->tok_rc || !sl->tok)
				continue;
			for (uint32_t h = 0; h < NH; h++) {
				struct shead *sh = &sl->h[h];

				sh->res_rc = kvt_seq_resident_positions(
					r->m, seq_id[j], l, h, sh->res, RES_CAP, &sh->n_res);
				sh->fr_rc = kvt_seq_frames(r->m, seq_id[j], l, h, sh->fr, FR_CAP,
							   &sh->n_fr, &sh->n_slots);
				sh->view_rc = kvt_seq_recall_view(r->m, seq_id[j], l, h, sh->view,
								  VIEW_CAP, &sh->n_view);
				/* addresses as offsets into the device arena, which each run
				   allocates anew */
				for (uint32_t f = 0; !sh->fr_rc && f < sh->n_fr && f < FR_CAP; f++)
					sh->fr[f] -= r->m->dev_base;
				for (uint32_t f = 0; !sh->view_rc && f < sh->n_view && f < VIEW_CAP;
				     f++)
					sh->view[f].frame -= r->m->dev_base;
			}
			attend_q(seq_id[j], l, q);
			sl->att_rc = kvt_attend(r->m, seq_id[j], l, q, sl->att);
		}
	}
	return sn;
}

/* Accounting that must hold at every moment: frames and blocks in use are those the live
   sequences hold, and the sequences are those of the model with its token counts. */
static void check_invariants(struct run *r, const struct snap *sn, const char *where)
{
	uint64_t dev = 0, host = 0, live = 0;

	for (uint32_t j = 0; j < N_IDS; j++) {
		const struct sseq *ss = &sn->s[j];

		if (ss->info_rc != (r->q[j].live ? 0 : -ENOENT)) {
			problem(r, "sequence table wrong",
				"%s: seq %llu: info returned %d, model %s", where,
				(unsigned long long)seq_id[j], ss->info_rc,
				r->q[j].live ? "live" : "not live");
			return;
		}
		if (ss->info_rc)
			continue;
		live++;
		dev += ss->info.device_frames;
		host += ss->info.host_blocks - ss->info.disk_blocks;
		for (uint32_t l = 0; l < NL; l++)
			if (ss->l[l].tok_rc || ss->l[l].tok != r->q[j].n[l]) {
				problem(r, "token count wrong",
					"%s: seq %llu layer %u: %u tokens (rc %d), model %u", where,
					(unsigned long long)seq_id[j], l, ss->l[l].tok,
					ss->l[l].tok_rc, r->q[j].n[l]);
				return;
			}
		if (ss->info.lost)
			problem(r, "sequence lost", "%s: seq %llu lost (%d)", where,
				(unsigned long long)seq_id[j], ss->info.lost);
	}
	if (sn->st.live_seqs != live || sn->st.device_frames_used != dev ||
	    sn->st.host_blocks_used != host)
		problem(r, "pool accounting wrong",
			"%s: live %u (seqs %llu), device frames used %llu (seqs hold %llu), host "
			"blocks used %llu (seqs hold %llu)",
			where, sn->st.live_seqs, (unsigned long long)live,
			(unsigned long long)sn->st.device_frames_used, (unsigned long long)dev,
			(unsigned long long)sn->st.host_blocks_used, (unsigned long long)host);
}

enum cmp {
	CMP_FAILED, /* a failed call: nothing visible may change but block placement */
	CMP_RECALL, /* a recall whose load failed (kvtier.h): as CMP_FAILED, except that recall
		       views and attention may turn stale (-ESTALE, never silently different),
		       cache frames may have been taken and working sets may have grown */
	CMP_AFTER,  /* a retried call against the fault-free run: the same content */
	CMP_END,    /* the end of the workload: as CMP_AFTER, preemption counts aside */
	CMP_LOOSE,  /* the end of a run whose scheduler batches differed: content only (tokens,
		       resident sets, tier accounting), not how it was batched or recalled */
};

/* Stats fields: compared after a failure (F), after a retry and at the end (S), changed
   only by block placement between host and disk (P), not at the end (N), depending on how
   work was batched (B: not compared loosely). */
#define SF_F 1u
#define SF_S 2u
#define SF_P 4u
#define SF_N 8u
#define SF_B 16u
#define STAT(f, cls)                                                                       \
	{                                                                                  \
#f, offsetof(struct kvt_stats, f), sizeof(((struct kvt_stats *)0)->f), cls \
	}

static const struct {
	const char *name;
	size_t off, size;
	unsigned cls;
} stat_fields[] = {
	STAT(device_frames_used, SF_F | SF_S),
	STAT(host_blocks_used, SF_F | SF_S | SF_P),
	STAT(bytes_h2d, SF_F),
	STAT(bytes_d2h, SF_F | SF_S),
	STAT(bytes_d2d, SF_F | SF_S),
	STAT(tokens_saved, SF_F | SF_S),
	STAT(tokens_appended, SF_F | SF_S),
	STAT(tokens_prompt, SF_F | SF_S),
	STAT(tokens_resident, SF_F | SF_S),
	STAT(prefill_layers, SF_F | SF_S),
	STAT(decode_calls, SF_F | SF_S | SF_B),
	STAT(saves_submitted, SF_F | SF_S | SF_B),
	STAT(live_seqs, SF_F | SF_S),
	STAT(bytes_read, SF_F),
	STAT(recall_frames_used, SF_F),
	STAT(recall_calls, SF_F | SF_S | SF_B),
	STAT(recall_lookups, SF_F),
	STAT(recall_hits, SF_F),
	STAT(recall_loads, SF_F),
	STAT(recall_evictions, SF_F),
	STAT(preemptions, SF_F | SF_S | SF_N),
	STAT(resumes, SF_F | SF_S | SF_N),
	STAT(disk_blocks_used, SF_F | SF_P),
	STAT(disk_blocks_spilled, SF_F | SF_P),
	STAT(disk_blocks_fetched, SF_F | SF_P),
	STAT(disk_bytes_written, SF_F | SF_P),
	STAT(disk_bytes_read, SF_F | SF_P),
	STAT(disk_io_errors, SF_F | SF_P),
	STAT(disk_checksum_errors, SF_F | SF_S),
	STAT(seqs_lost, SF_F | SF_S),
};

static uint64_t stat_get(const struct kvt_stats *st, size_t i)
{
	const uint8_t *p = (const uint8_t *)st + stat_fields[i].off;

	if (stat_fields[i].size == 4)
		return *(const uint32_t *)p;
	return *(const uint64_t *)p;
}

struct diff {
	char buf[1600];
	size_t len;
	uint32_t n, n_ws; /* differences; of them, in the recall working set */
	bool placement;	  /* only block placement differed */
};

static void diff_add(struct diff *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void diff_add(struct diff *d, const char *fmt, ...)
{
	va_list ap;

	if (d->n++ >= 16 || d->len >= sizeof(d->buf) - 1)
		return;
	if (d->len)
		d->len += (size_t)snprintf(d->buf + d->len, sizeof(d->buf) - d->len, "; ");
	if (d->len >= sizeof(d->buf) - 1)
		return;
	va_start(ap, fmt);
	d->len += (size_t)vsnprintf(d->buf + d->len, sizeof(d->buf) - d->len, fmt, ap);
	va_end(ap);
	if (d->len > sizeof(d->buf) - 1)
		d->len = sizeof(d->buf) - 1;
}

#define DIFF_U(d, what, a, b, ...)                                                     \
	do {                                                                           \
		if ((a) != (b))                                                        \
			diff_add(d, what " %lld -> %lld", __VA_ARGS__, (long long)(a), \
				 (long long)(b));                                      \
	} while (0)

static void cmp_head(struct diff *d, enum cmp how, uint64_t id, uint32_t l, uint32_t h,
		     const struct shead *a, const struct shead *b)
{
	DIFF_U(d, "seq %llu l%u h%u: resident positions rc", a->res_rc, b->res_rc,
	       (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: resident count", a->n_res, b->n_res, (unsigned long long)id, l,
	       h);
	if (!a->res_rc && a->n_res == b->n_res &&
	    memcmp(a->res, b->res, a->n_res * sizeof(a->res[0])))
		diff_add(d, "seq %llu l%u h%u: resident positions differ", (unsigned long long)id,
			 l, h);
	DIFF_U(d, "seq %llu l%u h%u: frames rc", a->fr_rc, b->fr_rc, (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: frame count", a->n_fr, b->n_fr, (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: slots", a->n_slots, b->n_slots, (unsigned long long)id, l, h);
	if ((how == CMP_FAILED || how == CMP_RECALL) && !a->fr_rc && a->n_fr == b->n_fr &&
	    memcmp(a->fr, b->fr, a->n_fr * sizeof(a->fr[0])))
		diff_add(d, "seq %llu l%u h%u: frame addresses moved", (unsigned long long)id, l,
			 h);
	if (how == CMP_LOOSE || (how == CMP_RECALL && b->view_rc == -ESTALE))
		return;
	DIFF_U(d, "seq %llu l%u h%u: recall view rc", a->view_rc, b->view_rc,
	       (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: recall view blocks", a->n_view, b->n_view,
	       (unsigned long long)id, l, h);
	if (!a->view_rc && !b->view_rc && a->n_view == b->n_view)
		for (uint32_t i = 0; i < a->n_view && i < VIEW_CAP; i++) {
			const struct kvt_recall_ref *x = &a->view[i], *y = &b->view[i];

			if (x->block != y->block || x->n_valid != y->n_valid ||
			    x->resident != y->resident ||
			    ((how == CMP_FAILED || how == CMP_RECALL) && x->frame != y->frame)) {
				diff_add(d,
					 "seq %llu l%u h%u: recall view entry %u differs "
					 "(block %u -> %u, n_valid %u -> %u)",
					 (unsigned long long)id, l, h, i, x->block, y->block,
					 x->n_valid, y->n_valid);
				break;
			}
		}
}

/* Differences of b from a (what `how` compares), into d. */
static void compare(const struct snap *a, const struct snap *b, enum cmp how, struct diff *d)
{
	memset(d, 0, sizeof(*d));
	for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
		unsigned cls = stat_fields[i].cls;
		uint64_t x = stat_get(&a->st, i), y = stat_get(&b->st, i);

		if (how == CMP_FAILED || how == CMP_RECALL ? !(cls & SF_F) : !(cls & SF_S))
			continue;
		if (how == CMP_RECALL && !strncmp(stat_fields[i].name, "recall_", 7))
			continue;
		if ((how == CMP_END || how == CMP_LOOSE) && (cls & SF_N))
			continue;
		if (how == CMP_LOOSE && (cls & SF_B))
			continue;
		if (x == y)
			continue;
		if ((cls & SF_P) && g_disk) {
			if (how == CMP_FAILED || how == CMP_RECALL)
				d->placement = true;
			continue;
		}
		diff_add(d, "stats.%s %llu -> %llu", stat_fields[i].name, (unsigned long long)x,
			 (unsigned long long)y);
	}
	DIFF_U(d, "%s", a->pending, b->pending, "scheduler pending");
	for (uint32_t j = 0; j < N_IDS; j++) {
		const struct sseq *x = &a->s[j], *y = &b->s[j];
		unsigned long long id = (unsigned long long)seq_id[j];

		DIFF_U(d, "seq %llu: info rc", x->info_rc, y->info_rc, id);
		if (x->info_rc || y->info_rc)
			continue;
		DIFF_U(d, "seq %llu: prompt_tokens", x->info.prompt_tokens, y->info.prompt_tokens,
		       id);
		DIFF_U(d, "seq %llu: layers_prefilled", x->info.layers_prefilled,
		       y->info.layers_prefilled, id);
		DIFF_U(d, "seq %llu: preempted", x->info.preempted, y->info.preempted, id);
		DIFF_U(d, "seq %llu: tokens", x->info.tokens, y->info.tokens, id);
		DIFF_U(d, "seq %llu: frames_per_layer", x->info.frames_per_layer,
		       y->info.frames_per_layer, id);
		DIFF_U(d, "seq %llu: device_frames", x->info.device_frames, y->info.device_frames,
		       id);
		DIFF_U(d, "seq %llu: host_blocks", x->info.host_blocks, y->info.host_blocks, id);
		if (how != CMP_LOOSE && how != CMP_RECALL) {
			uint32_t n_before = d->n;

			DIFF_U(d, "seq %llu: recall_ws_frames", x->info.recall_ws_frames,
			       y->info.recall_ws_frames, id);
			DIFF_U(d, "seq %llu: recall_step_frames", x->info.recall_step_frames,
			       y->info.recall_step_frames, id);
			d->n_ws += d->n - n_before;
		}
		DIFF_U(d, "seq %llu: lost", x->info.lost, y->info.lost, id);
		if (x->info.disk_blocks != y->info.disk_blocks) {
			if (!g_disk)
				diff_add(d, "seq %llu: disk_blocks %llu -> %llu", id,
					 (unsigned long long)x->info.disk_blocks,
					 (unsigned long long)y->info.disk_blocks);
			else if (how == CMP_FAILED || how == CMP_RECALL)
				d->placement = true;
		}
		for (uint32_t l = 0; l < NL; l++) {
			const struct slayer *p = &x->l[l], *q = &y->l[l];

			DIFF_U(d, "seq %llu l%u: tokens rc", p->tok_rc, q->tok_rc, id, l);
			DIFF_U(d, "seq %llu l%u: tokens", p->tok, q->tok, id, l);
			if (p->tok_rc || q->tok_rc || !p->tok || p->tok != q->tok)
				continue;
			for (uint32_t h = 0; h < NH; h++)
				cmp_head(d, how, seq_id[j], l, h, &p->h[h], &q->h[h]);
			if (how == CMP_LOOSE)
				continue; /* views and attention follow the recall history */
			if (how == CMP_RECALL && q->att_rc == -ESTALE)
				continue;
			DIFF_U(d, "seq %llu l%u: attend rc", p->att_rc, q->att_rc, id, l);
			if (!p->att_rc && !q->att_rc && memcmp(p->att, q->att, sizeof(p->att)))
				diff_add(d, "seq %llu l%u: attention output differs", id, l);
		}
	}
	if (d->n)
		d->placement = false;
}

/* ---- read-back ------------------------------------------------------------------------------- */

/* Reads every token of every live sequence through both paths; each must be bit-exact. */
static void check_tokens(struct run *r, const char *where)
{
	uint8_t k[HD * 4], v[HD * 4], ek[HD * 4], ev[HD * 4];

	for (uint32_t j = 0; j < N_IDS; j++) {
		const struct mseq *s = &r->q[j];

		if (!s->live)
			continue;
		for (uint32_t l = 0; l < NL; l++)
			for (uint32_t h = 0; h < NH; h++)
				for (uint32_t p = 0; p < s->n[l]; p++) {
					int rc1, rc2, bad;

					t_fill_row(r->c.dtype, HD, ek, s->id, l, h, p, 0);
					t_fill_row(r->c.dtype, HD, ev, s->id, l, h, p, 1);
					rc1 = kvt_seq_read_token(r->m, s->id, l, h, p, k, v);
					bad = rc1 || memcmp(k, ek, r->rb) || memcmp(v, ev, r->rb);
					rc2 = kvt_seq_read_token_host(r->m, s->id, l, h, p, k, v);
					bad |= rc2 || memcmp(k, ek, r->rb) || memcmp(v, ev, r->rb);
					g_tokens++;
					if (bad) {
						g_lost++;
						problem(r, "token lost or corrupted",
							"%s: seq %llu l%u h%u pos %u: read rc %d, host "
							"read rc %d, or bytes differ",
							where, (unsigned long long)s->id, l, h, p,
							rc1, rc2);
					}
				}
	}
}

/* ---- steps ----------------------------------------------------------------------------------- */

static void step_begin(struct run *r, const char *name)
{
	uint32_t i = r->step;

	r->what = name;
	if (i >= MAX_STEPS) {
		fail_at(__FILE__, __LINE__, "more than %d steps", MAX_STEPS);
		return;
	}
	switch (r->mode) {
	case MODE_COUNT:
		if (r->mask == KVT_FAULT_ALL) {
			g_name[i] = name;
			if (hits_now(r) != (i ? g_hits_after[i - 1] : 0))
				problem(r, "hits between steps", "%llu hits outside a step",
					(unsigned long long)(hits_now(r) -
							     (i ? g_hits_after[i - 1] : 0)));
		}
		break;
	case MODE_SNAP:
		if (i >= g_steps || strcmp(g_name[i], name))
			problem(r, "steps differ", "step %u is %s, counting run had %s", i, name,
				i < g_steps ? g_name[i] : "none");
		g_snap[i] = r->m && r->m != M_SENTINEL ? snapshot(r) : NULL;
		if (g_snap[i])
			check_invariants(r, g_snap[i], "before step");
		break;
	case MODE_FAULT:
		if (r->aligned && (i >= g_steps || strcmp(g_name[i], name)))
			r->aligned = false;
		break;
	}
}

/* The failed call changed nothing: compare with the fault-free state before step i, read
   every token back. */
static void after_failure(struct run *r, uint32_t i, int rc, unsigned flags)
{
	struct snap *now;
	struct errs *e;
	struct diff d;
	bool load_failed;

	if (rc >= 0 || rc < -4095) {
		problem(r, "not a negative errno", "returned %d after the fault", rc);
		return;
	}
	g_failed++;
	e = count_error(r->what, rc);
	if (flags & F_MCREATE) {
		g_create_failed++;
		if (r->m != M_SENTINEL)
			problem(r, "*out written on failure",
				"kvt_manager_create returned %d and wrote *out", rc);
		return;
	}
	if (flags & F_SCREATE) {
		if (r->s != S_SENTINEL)
			problem(r, "*out written on failure",
				"kvt_sched_create returned %d and wrote *out", rc);
		r->s = NULL;
	}
	if (!r->m || !r->aligned || !g_snap[i])
		return;
	/* A recall whose load failed (any site inside the backend's load: the transfer call, a
	   CUDA call, the backend's allocations) says so in its message (recall.c); read it
	   before the snapshot's calls replace it. */
	load_failed =
		(!strcmp(r->what, "kvt_decode_recall") || !strcmp(r->what, "kvt_recall_blocks")) &&
		strstr(kvt_manager_last_error(r->m), ": loading ");
	now = snapshot(r);
	check_invariants(r, now, "after the failed call");
	compare(g_snap[i], now, load_failed ? CMP_RECALL : CMP_FAILED, &d);
	if (d.n)
		problem(r,
			d.n == d.n_ws ? "failed call changed the recall working set"
				      : "failed call changed state",
			"returned %d (%s) but: %s", rc, kvt_strerror(rc), d.buf);
	else if (d.placement) {
		g_placement++;
		if (e)
			e->placement++;
	}
	free(now);
	check_tokens(r, "after the failed call");
	if (flags & F_SCREATE)
		r->s = S_SENTINEL; /* the retry writes it */
}

/* A call that took the fault and succeeded all the same may have lost nothing:
   - kvt_manager_create and kvt_sched_step (flag F_ABSORB): the manager registers io_uring
     buffers only when it can (plain reads and writes do the same job); the scheduler leaves
     a request whose resume failed queued for a later iteration (its batches differ from
     here, so the rest of the run is compared by content only);
   - an I/O error of a spill write that the call made to find host room: the block stays in
     the host tier and others go instead; the error is counted in stats.disk_io_errors;
   - a CUDA error in kvt_sched_commit: the device wait of a completed request's preempt
     failed; the next kvt_sched_step frees its frames, so the run goes on as the fault-free
     one (still compared step by step).
   Anything else that succeeds although its hit failed is a problem. Every token is read back
   after an absorbed fault. */
static bool absorbed(struct run *r, uint32_t i, unsigned flags)
{
	bool ok = false;
	uint32_t a;

	if (flags & F_ABSORB) {
		ok = true;
		if (!strcmp(r->what, "kvt_sched_step"))
			r->aligned = false;
	} else if (r->site == KVT_FAULT_CUDA && !strcmp(r->what, "kvt_sched_commit")) {
		ok = true;
	} else if (r->site == KVT_FAULT_IO && r->m && r->aligned && g_snap[i]) {
		struct kvt_stats st = KVT_STATS_INIT;

		CHECK_RC(kvt_manager_stats(r->m, &st), 0);
		ok = st.disk_io_errors > g_snap[i]->st.disk_io_errors;
	}
	if (!ok)
		return false;
	g_absorbed++;
	for (a = 0; a < g_n_abs; a++)
		if (!strcmp(g_abs[a].call, r->what) && g_abs[a].site == r->site)
			break;
	if (a == g_n_abs && g_n_abs < sizeof(g_abs) / sizeof(g_abs[0]))
		g_abs[g_n_abs++] = (struct absorbed){r->what, r->site, 0, r->nth};
	if (a < g_n_abs)
		g_abs[a].count++;
	if (r->m)
		check_tokens(r, "after an absorbed fault");
	return true;
}

/* Ends step r->step of result rc (want: its expected result). Returns whether to retry the
   call (it failed through the injected fault). */
static bool step_end(struct run *r, int rc, int want, unsigned flags)
{
	uint32_t i = r->step++;

	switch (r->mode) {
	case MODE_COUNT:
		if (r->mask == KVT_FAULT_ALL)
			g_hits_after[i] = hits_now(r);
		if (rc != want)
			problem(r, "unexpected result", "%s returned %d (%s), expected %d", r->what,
				rc, kvt_strerror(rc), want);
		return false;
	case MODE_SNAP:
		if (rc != want)
			problem(r, "unexpected result", "%s returned %d (%s), expected %d", r->what,
				rc, kvt_strerror(rc), want);
		return false;
	case MODE_FAULT:
		break;
	}
	if (r->armed && !r->fired && !r->paused) {
		if (kvt_fault_fired()) {
			r->site = kvt_fault_fired_site();
			r->fired = true;
			r->hit_base += kvt_fault_disarm();
			r->armed = false;
			r->fault_at = r->what;
			r->fault_step = i;
			if (r->site < KVT_FAULT_SITES)
				g_walked[r->site]++;
			if (rc == want) {
				if (absorbed(r, i, flags))
					return false;
				problem(r,
					(flags & F_VOID) ? "fault in a call that cannot fail"
							 : "fault fired, call succeeded",
					"returned %d although its hit failed", rc);
				r->aligned = false;
				return false;
			}
			after_failure(r, i, rc, flags);
			return true;
		}
		if (r->aligned && g_hits_after[i] >= r->nth)
			problem(r, "hit did not fire",
				"hit %llu belongs to this step (%llu hits after it) but did not fire",
				(unsigned long long)r->nth, (unsigned long long)g_hits_after[i]);
	}
	if (rc != want)
		problem(r, r->fired ? "workload diverged after the fault" : "unexpected result",
			"%s returned %d (%s), expected %d", r->what, rc, kvt_strerror(rc), want);
	return false;
}

/* After the retry of step r->step - 1. */
static void step_retried(struct run *r, int rc, int want, unsigned flags)
{
	uint32_t i = r->step - 1;
	struct snap *now;
	struct diff d;

	g_retried++;
	if (rc != want) {
		problem(r, "retry failed", "retry returned %d (%s), expected %d", rc,
			kvt_strerror(rc), want);
		return;
	}
	if ((flags & (F_MCREATE | F_VOID)) || !r->m || !r->aligned || i + 1 > g_steps ||
	    !g_snap[i + 1] || g_snap_gap[i + 1])
		return;
	now = snapshot(r);
	compare(g_snap[i + 1], now, CMP_AFTER, &d);
	if (d.n)
		problem(r, "state after retry differs", "after the retry: %s", d.buf);
	free(now);
}

#define STEP(r, rc, want, flags, name, call)              \
	do {                                              \
		step_begin(r, name);                      \
		rc = (call);                              \
		if (step_end(r, rc, want, flags)) {       \
			rc = (call);                      \
			step_retried(r, rc, want, flags); \
		}                                         \
	} while (0)

/* ---- the workload ---------------------------------------------------------------------------- */

static int disk_rc(void)
{
	return g_disk ? 0 : -ENOTSUP;
}

static void w_create(struct run *r, int j)
{
	int rc;

	STEP(r, rc, 0, 0, "kvt_seq_create", kvt_seq_create(r->m, r->q[j].id, r->q[j].L));
	if (!rc)
		r->q[j].live = true;
}

static void w_prefill(struct run *r, int j, uint32_t l)
{
	struct mseq *s = &r->q[j];
	int rc;

	t_fill_prefill(&r->c, s->id, l, s->L, r->k, r->v, r->qo);
	STEP(r, rc, 0, 0, "kvt_prefill_layer",
	     t_prefill_layer(r->m, s->id, l, r->k, r->v, r->qo, NULL));
	if (!rc)
		s->n[l] = s->L;
}

/* `steps` decode steps of the batch js (every layer in turn). */
static void w_decode(struct run *r, const int *js, uint32_t n, uint32_t steps)
{
	uint64_t ids[MAX_BATCH];
	uint32_t pos[MAX_BATCH];
	int rc;

	for (uint32_t t = 0; t < steps; t++)
		for (uint32_t l = 0; l < NL; l++) {
			for (uint32_t i = 0; i < n; i++) {
				ids[i] = r->q[js[i]].id;
				pos[i] = r->q[js[i]].n[l];
			}
			t_fill_decode(&r->c, ids, pos, n, l, r->k, r->v);
			STEP(r, rc, 0, 0, "kvt_decode_append",
			     t_decode_append(r->m, l, ids, n, r->k, r->v, NULL));
			if (!rc)
				for (uint32_t i = 0; i < n; i++)
					r->q[js[i]].n[l]++;
		}
}

/* Scored recall of layer l for the batch js (queries of its current position). */
static void w_recall(struct run *r, uint32_t l, const int *js, uint32_t n)
{
	uint64_t ids[MAX_BATCH];
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = r->q[js[i]].id;
		for (uint32_t g = 0; g < NQ; g++)
			t_fill_row(r->c.dtype, HD, r->qd + ((size_t)i * NQ + g) * r->rb, ids[i], l,
				   2000 + g, r->q[js[i]].n[l], 0);
	}
	STEP(r, rc, 0, 0, "kvt_decode_recall", t_decode_recall(r->m, l, ids, n, r->qd, NULL));
}

/* Given recall of layer l of sequence j: blocks b0, b1 for head 0, b1, b0 + 1 for head 1. */
static void w_recall_blocks(struct run *r, uint32_t l, int j, uint32_t b0, uint32_t b1)
{
	uint32_t sel[NH * RB] = {b0, b1, b1, b0 + 1};
	int rc;

	STEP(r, rc, 0, 0, "kvt_recall_blocks",
	     kvt_recall_blocks(r->m, l, &r->q[j].id, 1, sel, RB, NULL));
}

static void w_attend(struct run *r, int j, uint32_t l)
{
	float q[NQ * HD], out[NQ * HD];
	uint32_t i = r->step;
	int rc;

	attend_q(r->q[j].id, l, q);
	STEP(r, rc, 0, 0, "kvt_attend", kvt_attend(r->m, r->q[j].id, l, q, out));
	if (rc)
		return;
	if (r->mode == MODE_SNAP) {
		g_att[i] = t_xmalloc(sizeof(out));
		memcpy(g_att[i], out, sizeof(out));
	} else if (r->mode == MODE_FAULT && r->fired && r->aligned && g_att[i] &&
		   memcmp(g_att[i], out, sizeof(out))) {
		problem(r, "attention differs after the fault",
			"seq %llu layer %u: attention output differs from the fault-free run",
			(unsigned long long)r->q[j].id, l);
	}
}

static void w_read(struct run *r, int j, uint32_t l, uint32_t h, uint32_t pos)
{
	uint8_t k[HD * 4], v[HD * 4], ek[HD * 4], ev[HD * 4];
	int rc;

	STEP(r, rc, 0, 0, "kvt_seq_read_token",
	     kvt_seq_read_token(r->m, r->q[j].id, l, h, pos, k, v));
	if (rc)
		return;
	t_fill_row(r->c.dtype, HD, ek, r->q[j].id, l, h, pos, 0);
	t_fill_row(r->c.dtype, HD, ev, r->q[j].id, l, h, pos, 1);
	if (memcmp(k, ek, r->rb) || memcmp(v, ev, r->rb)) {
		g_lost++;
		problem(r, "token read wrong", "seq %llu l%u h%u pos %u: bytes differ",
			(unsigned long long)r->q[j].id, l, h, pos);
	}
}

/* Reads the first position of (j, l, h) that is not resident (host history only). */
static void w_read_host_only(struct run *r, int j, uint32_t l, uint32_t h)
{
	int32_t res[RES_CAP];
	uint32_t n = 0, p = 0;
	int rc;

	STEP(r, rc, 0, 0, "kvt_seq_resident_positions",
	     kvt_seq_resident_positions(r->m, r->q[j].id, l, h, res, RES_CAP, &n));
	if (rc)
		return;
	for (uint32_t i = 0; i < n && (uint32_t)res[i] == p; i++)
		p++;
	if (p < r->q[j].n[l])
		w_read(r, j, l, h, p);
}

static void w_preempt(struct run *r, int j)
{
	int rc;

	STEP(r, rc, 0, 0, "kvt_seq_preempt", kvt_seq_preempt(r->m, r->q[j].id));
}

static void w_resume(struct run *r, int j)
{
	int rc;

	STEP(r, rc, 0, 0, "kvt_seq_resume", kvt_seq_resume(r->m, r->q[j].id, NULL));
}

static void w_spill(struct run *r, int j)
{
	int rc;

	STEP(r, rc, disk_rc(), 0, "kvt_seq_spill", kvt_seq_spill(r->m, r->q[j].id));
}

static void w_fetch(struct run *r, const int *js, uint32_t n)
{
	uint64_t ids[MAX_BATCH];
	int rc;

	for (uint32_t i = 0; i < n; i++)
		ids[i] = r->q[js[i]].id;
	STEP(r, rc, disk_rc(), 0, "kvt_seq_fetch", kvt_seq_fetch(r->m, ids, n));
}

static void w_destroy(struct run *r, int j)
{
	int rc;

	STEP(r, rc, 0, 0, "kvt_seq_destroy", kvt_seq_destroy(r->m, r->q[j].id));
	if (!rc) {
		r->q[j].live = false;
		memset(r->q[j].n, 0, sizeof(r->q[j].n));
	}
}

static int idx_of(uint64_t id)
{
	for (int j = 0; j < N_IDS; j++)
		if (seq_id[j] == id)
			return j;
	return -1;
}

/* Three requests through the scheduler: the engine executes every batch (prefill layers,
   one decode step of every decoding request, a recall and an attention now and then). */
static void w_sched(struct run *r)
{
	struct kvt_sched_config sc = KVT_SCHED_CONFIG_INIT;
	int rc;

	sc.max_requests = 3;
	sc.max_tokens = 256;
	sc.max_inject_tokens = 48;
	r->s = S_SENTINEL;
	STEP(r, rc, 0, F_SCREATE, "kvt_sched_create", kvt_sched_create(r->m, &sc, &r->s));
	if (rc) {
		r->s = NULL;
		return;
	}
	for (int j = E; j <= G; j++) {
		w_create(r, j);
		STEP(r, rc, 0, 0, "kvt_sched_submit",
		     kvt_sched_submit(r->s, r->q[j].id, seq_max_new[j]));
	}
	for (uint32_t it = 0; it < 40 && kvt_sched_pending(r->s); it++) {
		struct kvt_sched_item items[8];
		struct kvt_sched_batch b;
		int dec[MAX_BATCH];
		uint32_t nd = 0, ni;

		STEP(r, rc, 0, F_ABSORB, "kvt_sched_step", kvt_sched_step(r->s, &b));
		if (rc)
			break;
		ni = b.n_items < 8 ? b.n_items : 8;
		memcpy(items, b.items, ni * sizeof(items[0]));
		if (r->mode == MODE_SNAP) {
			g_sched_iters++;
			g_sched_preempted += b.it.preempted;
			g_sched_resumed += b.it.resumed;
		}
		for (uint32_t x = 0; x < ni; x++) {
			int j = idx_of(items[x].seq);

			if (j < 0)
				continue;
			if (items[x].decode && nd < MAX_BATCH)
				dec[nd++] = j;
			for (uint32_t l = items[x].layer_begin; l < items[x].layer_end; l++)
				w_prefill(r, j, l);
		}
		if (nd) {
			w_decode(r, dec, nd, 1);
			if (it % 2 == 0) { /* two sequences' blocks fit the cache at once */
				w_recall(r, it % NL, dec, nd < 2 ? nd : 2);
				w_attend(r, dec[0], it % NL);
			}
		}
		STEP(r, rc, 0, 0, "kvt_sched_commit", kvt_sched_commit(r->s));
	}
	step_begin(r, "kvt_sched_destroy");
	kvt_sched_destroy(r->s);
	r->s = NULL;
	step_end(r, 0, 0, F_VOID);
}

/* Checks that are not part of the workload: state against the fault-free end, every token,
   and attention after a recall of fixed blocks (which does not depend on the cache's
   history). */
static void end_checks(struct run *r)
{
	struct snap *sn;
	struct diff d;

	pause_hook(r);
	r->what = "end checks";
	if (r->mode == MODE_SNAP && r->step <= MAX_STEPS)
		g_snap_gap[r->step] = true;
	sn = snapshot(r);
	check_invariants(r, sn, "at the end");
	if (r->mode == MODE_SNAP) {
		g_end = sn;
		sn = NULL;
	} else if (r->mode == MODE_FAULT && g_end) {
		compare(g_end, sn, r->aligned ? CMP_END : CMP_LOOSE, &d);
		if (d.n)
			problem(r, "end state differs", "at the end: %s", d.buf);
	}
	free(sn);
	check_tokens(r, "at the end");
	for (uint32_t j = 0; j < N_IDS; j++) {
		struct kvt_seq_info info = {.size = sizeof(info)};

		if (!r->q[j].live || kvt_seq_info(r->m, r->q[j].id, &info) || info.preempted)
			continue;
		for (uint32_t l = 0; l < NL; l++) {
			uint32_t nb = (r->q[j].n[l] + BT - 1) / BT;
			uint32_t sel[NH * RB] = {1, 2 < nb ? 2 : UINT32_MAX, nb - 1, 1};
			float q[NQ * HD], out[NQ * HD] = {0};
			int rc;

			if (!r->q[j].n[l])
				continue;
			rc = kvt_recall_blocks(r->m, l, &r->q[j].id, 1, sel, RB, NULL);
			if (!rc) {
				attend_q(r->q[j].id, l, q);
				rc = kvt_attend(r->m, r->q[j].id, l, q, out);
			}
			if (r->mode == MODE_SNAP) {
				g_end_att_rc[j][l] = rc;
				memcpy(g_end_att[j][l], out, sizeof(out));
				if (rc)
					problem(r, "end attention failed", "seq %llu l%u: %d",
						(unsigned long long)r->q[j].id, l, rc);
			} else if (r->mode == MODE_FAULT &&
				   (rc != g_end_att_rc[j][l] ||
				    (!rc && memcmp(g_end_att[j][l], out, sizeof(out))))) {
				problem(r, "end attention differs",
					"seq %llu l%u: recall + attend returned %d (fault-free %d) "
					"or the output differs",
					(unsigned long long)r->q[j].id, l, rc, g_end_att_rc[j][l]);
			}
		}
	}
	resume_hook(r);
}

static void workload(struct run *r)
{
	static const int ab[] = {A, B}, ba[] = {B, A}, abc[] = {A, B, C}, ac[] = {A, C}, c_[] = {C};
	int rc;

	r->m = M_SENTINEL;
	STEP(r, rc, 0, F_MCREATE | F_ABSORB, "kvt_manager_create", t_manager_create(&r->c, &r->m));
	if (rc) {
		r->m = NULL;
		return;
	}

	/* three sequences, layers prefilled in both orders; reads of resident and host-only
	   positions */
	w_create(r, A);
	w_create(r, B);
	w_create(r, C);
	w_prefill(r, A, 0);
	w_prefill(r, A, 1);
	w_prefill(r, B, 1);
	w_prefill(r, B, 0);
	w_prefill(r, C, 0);
	w_prefill(r, C, 1);
	w_read(r, A, 0, 1, 3);
	w_read_host_only(r, A, 1, 0);
	w_read(r, A, 1, 1, 47);

	/* decode across block boundaries, with scored and given recall and attention */
	w_decode(r, ab, 2, 4);
	w_recall(r, 0, ab, 2);
	w_attend(r, A, 0);
	w_attend(r, B, 0);
	w_recall(r, 1, ab, 2);
	w_attend(r, A, 1);
	w_attend(r, B, 1);
	w_decode(r, abc, 3, 4);
	w_recall(r, 0, ba, 2); /* B's frames are now the least recently used */
	w_attend(r, B, 0);
	w_attend(r, A, 0);
	w_recall_blocks(r, 1, A, 2, 3); /* evicts B's frames (the least recently used) */
	w_attend(r, A, 1);
	w_decode(r, abc, 3, 4);
	w_recall(r, 1, &ab[1], 1);
	w_attend(r, B, 1);

	/* preemption */
	w_preempt(r, B);
	w_read(r, B, 0, 0, 30);
	w_read_host_only(r, A, 0, 1);
	w_resume(r, B);
	w_attend(r, B, 0);
	w_decode(r, abc, 3, 3);
	w_recall_blocks(r, 0, C, 1, 2); /* a prompt without top-K */
	w_attend(r, C, 0);

	/* disk tier: explicit spills and fetches, and the fetches of reads, decode and resume */
	w_spill(r, A);
	w_spill(r, C);
	w_fetch(r, ac, 2); /* one batched read of both */
	w_spill(r, A);
	w_read_host_only(r, A, 0, 1);
	w_spill(r, C);
	w_decode(r, c_, 1, 2);
	w_preempt(r, C);
	w_spill(r, C);
	w_resume(r, C);
	w_decode(r, ac, 2, 1);
	w_recall_blocks(r, 1, A, 2, 3);
	w_attend(r, A, 1);

	/* a fourth sequence while the others hold the host tier; a destroy */
	w_create(r, D);
	w_prefill(r, D, 0);
	w_prefill(r, D, 1);
	w_destroy(r, B);
	w_read(r, D, 1, 0, 63);

	/* the scheduler */
	w_sched(r);
	w_resume(r, E);
	w_attend(r, E, 0);
	w_destroy(r, F);

	end_checks(r);

	/* one destroy; the manager frees the rest */
	w_destroy(r, A);
	step_begin(r, "kvt_manager_destroy");
	kvt_manager_destroy(r->m);
	r->m = NULL;
	step_end(r, 0, 0, F_VOID);
}

static void run_once(enum mode mode, uint32_t mask, uint64_t nth)
{
	struct run *r = t_xmalloc(sizeof(*r));

	r->mode = mode;
	r->mask = mask;
	r->nth = nth;
	r->aligned = true;
	r->site = KVT_FAULT_SITES;
	r->c = g_cfg;
	r->rb = (size_t)HD * kvt_dtype_size(g_cfg.dtype);
	r->k = t_xmalloc((size_t)NH * 64 * r->rb);
	r->v = t_xmalloc((size_t)NH * 64 * r->rb);
	r->qo = t_xmalloc((size_t)NQ * g_cfg.obs_window * r->rb);
	r->qd = t_xmalloc((size_t)MAX_BATCH * NQ * r->rb);
	for (int j = 0; j < N_IDS; j++) {
		r->q[j].id = seq_id[j];
		r->q[j].L = seq_prompt[j];
	}
	g_run = r;
	if (mode != MODE_SNAP) {
		kvt_fault_arm(mask, mode == MODE_COUNT ? 0 : nth);
		r->armed = true;
	}
	workload(r);
	if (r->armed) {
		pause_hook(r);
		r->armed = false;
	}
	if (mode == MODE_COUNT) {
		if (mask == KVT_FAULT_ALL) {
			g_k = r->hit_base;
			g_steps = r->step;
		}
		for (int s = 0; s < KVT_FAULT_SITES; s++)
			if (mask == 1u << s)
				g_k_site[s] = r->hit_base;
	}
	if (mode == MODE_FAULT && !r->fired)
		problem(r, "hit never fired", "hit %llu of %llu never fired (%llu hits counted)",
			(unsigned long long)nth, (unsigned long long)g_k,
			(unsigned long long)r->hit_base);
	if (r->m) {
		kvt_manager_destroy(r->m); /* a run cut short */
	}
	g_run = NULL;
	free(r->k);
	free(r->v);
	free(r->qo);
	free(r->qd);
	free(r);
}

/* ---- setup ----------------------------------------------------------------------------------- */

static void log_sink(void *user, enum kvt_log_level level, const char *msg)
{
	(void)user;
	(void)level;
	(void)msg;
	g_log_msgs++;
}

static struct kvt_config fault_config(bool disk)
{
	struct kvt_config c = t_small_config();
	uint64_t block = 2ull * BT * HD * kvt_dtype_size(c.dtype), group = block * NH;

	c.save_threads = 1;
	c.staging_bytes = 4096; /* a prefill save of 48 tokens takes two chunks */
	c.recall_blocks = RB;
	c.ws_window = 4;
	c.recall_cache_bytes = RC_FRAMES * block;
	c.device_bytes = DEV_GROUPS * group + c.recall_cache_bytes;
	c.host_bytes = (disk ? HOST_GROUPS_DISK : HOST_GROUPS) * group;
	c.spill_dir = g_dir;
	c.disk_queue_depth = 8;
	return c;
}

/* Whether this build has a disk tier: a spill that does not answer -ENOTSUP. */
static bool probe_disk(void)
{
	struct kvt_config c = fault_config(false);
	struct kvt_manager *m = NULL;
	size_t rb = (size_t)HD * kvt_dtype_size(c.dtype);
	uint8_t *k = t_xmalloc(NH * 16 * rb), *v = t_xmalloc(NH * 16 * rb);
	int rc;

	CHECK_RC(t_manager_create(&c, &m), 0);
	CHECK_RC(kvt_seq_create(m, 1, 16), 0);
	t_fill_prefill(&c, 1, 0, 16, k, v, NULL);
	CHECK_RC(t_prefill_layer(m, 1, 0, k, v, NULL, NULL), 0);
	rc = kvt_seq_spill(m, 1);
	kvt_manager_destroy(m);
	free(k);
	free(v);
	return rc != -ENOTSUP;
}

static void print_errors(void)
{
	for (uint32_t i = 0; i < g_n_errs; i++) {
		char line[256];
		size_t n = 0;

		for (uint32_t k = 0; k < 8 && g_errs[i].count[k] && n < sizeof(line); k++)
			n += (size_t)snprintf(line + n, sizeof(line) - n, "%s%d x%u", k ? ", " : "",
					      g_errs[i].rc[k], g_errs[i].count[k]);
		print_message("# failed %-20s %s; %u moved blocks between host and disk\n",
			      g_errs[i].call, line, g_errs[i].placement);
	}
}

static void print_problems(void)
{
	for (uint32_t a = 0; a < g_n_abs; a++)
		print_message("# absorbed: %s took %u %s faults and succeeded (first N=%llu)\n",
			      g_abs[a].call, g_abs[a].count, site_name[g_abs[a].site],
			      (unsigned long long)g_abs[a].first_n);
	for (uint32_t i = 0; i < g_n_prob; i++)
		print_message("# problem %u (%u runs): %s\n#   first: %s\n", i + 1, g_prob[i].count,
			      g_prob[i].key, g_prob[i].first);
	if (g_prob_dropped)
		print_message("# (%llu further problems in runs that already had one)\n",
			      (unsigned long long)g_prob_dropped);
}

static void test_fault_walk(void **state)
{
	const char *only = getenv("KVT_FAULT_ONLY");
	uint64_t n0 = 1, n1;
	double t0 = t_now_s(), t1;

	(void)state;
	g_verbose = getenv("KVT_FAULT_VERBOSE") && *getenv("KVT_FAULT_VERBOSE") == '1';
	snprintf(g_dir, sizeof(g_dir), "%s/kvt-fault-XXXXXX",
		 getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	assert_non_null(mkdtemp(g_dir));
	kvt_log_set(log_sink, NULL);
	g_disk = probe_disk();
	g_cfg = fault_config(g_disk);

	/* 1. counting runs */
	run_once(MODE_COUNT, KVT_FAULT_ALL, 0);
	for (int s = 0; s < KVT_FAULT_SITES; s++) /* the thread-local sites: the walk's */
		if (KVT_FAULT_ALL & 1u << s)
			run_once(MODE_COUNT, 1u << s, 0);
	/* 2. the fault-free state before every step */
	run_once(MODE_SNAP, 0, 0);
	print_message("# fault: disk tier %s; %u steps, K = %llu hits (alloc %llu, xfer %llu, io "
		      "%llu, cuda %llu); scheduler: %u iterations, %u preempted, %u resumed\n",
		      g_disk ? "present" : "absent (spill/fetch answer -ENOTSUP)", g_steps,
		      (unsigned long long)g_k, (unsigned long long)g_k_site[KVT_FAULT_ALLOC],
		      (unsigned long long)g_k_site[KVT_FAULT_XFER],
		      (unsigned long long)g_k_site[KVT_FAULT_IO],
		      (unsigned long long)g_k_site[KVT_FAULT_CUDA], g_sched_iters,
		      g_sched_preempted, g_sched_resumed);
	if (getenv("KVT_FAULT_STEPS"))
		for (uint32_t i = 0; i < g_steps; i++)
			print_message("# step %3u %-28s hits %3llu..%llu\n", i, g_name[i],
				      (unsigned long long)(i ? g_hits_after[i - 1] + 1 : 1),
				      (unsigned long long)g_hits_after[i]);
	if (g_n_prob) {
		print_problems();
		fail_at(__FILE__, __LINE__, "the fault-free workload is not as expected");
	}
	CHECK_EQ(g_k, g_k_site[0] + g_k_site[1] + g_k_site[2] + g_k_site[3]);
	assert_true(g_k > 0);

	/* 3. every hit in turn */
	n1 = g_k;
	if (only && *only) {
		n0 = n1 = strtoull(only, NULL, 0);
	}
	for (uint64_t n = n0; n <= n1; n++)
		run_once(MODE_FAULT, KVT_FAULT_ALL, n);
	t1 = t_now_s();
	kvt_log_set(NULL, NULL);

	print_message("# fault: %llu sites walked (alloc %llu, xfer %llu, io %llu, cuda %llu), "
		      "%llu failures returned errors (%llu retried, %llu manager creates), "
		      "%llu absorbed, %llu moved blocks between host and disk, %llu lost "
		      "tokens, %llu tokens checked, %.1f s\n",
		      (unsigned long long)(g_walked[0] + g_walked[1] + g_walked[2] + g_walked[3]),
		      (unsigned long long)g_walked[KVT_FAULT_ALLOC],
		      (unsigned long long)g_walked[KVT_FAULT_XFER],
		      (unsigned long long)g_walked[KVT_FAULT_IO],
		      (unsigned long long)g_walked[KVT_FAULT_CUDA], (unsigned long long)g_failed,
		      (unsigned long long)g_retried, (unsigned long long)g_create_failed,
		      (unsigned long long)g_absorbed, (unsigned long long)g_placement,
		      (unsigned long long)g_lost, (unsigned long long)g_tokens, t1 - t0);
	print_errors();
	print_problems();

	for (uint32_t i = 0; i <= g_steps && i <= MAX_STEPS; i++)
		free(g_snap[i]);
	for (uint32_t i = 0; i < g_steps; i++)
		free(g_att[i]);
	free(g_end);
	if (rmdir(g_dir))
		fail_at(__FILE__, __LINE__, "spill directory %s not empty or not removable (%s)",
			g_dir, strerror(errno));
	if (g_n_prob)
		fail_at(__FILE__, __LINE__, "%llu runs found problems (%u kinds), listed above",
			(unsigned long long)g_prob_total, g_n_prob);
}

/* ---- the hook itself: the shared site ------------------------------------------------------ */

/* What another thread sees: n hits of `site`, which of them failed (bit i: hit i + 1), and what
   arming the shared site there answered. */
struct other {
	enum kvt_fault_site site;
	uint32_t n, failed;
	int arm_shared;
	uint64_t local_hits; /* of a local arming there, taken and dropped after the hits */
};

static void *other_thread(void *arg)
{
	struct other *o = arg;

	for (uint32_t i = 0; i < o->n; i++)
		if (kvt_fault(o->site))
			o->failed |= 1u << i;
	o->arm_shared = kvt_fault_arm(KVT_FAULT_SHARED, 1);
	if (!o->arm_shared)
		kvt_fault_disarm();
	/* a local arming there does not see the shared count, nor the shared one its hits */
	if (!kvt_fault_arm(1u << KVT_FAULT_ALLOC, 0)) {
		(void)kvt_fault(KVT_FAULT_ALLOC);
		(void)kvt_fault(KVT_FAULT_ALLOC);
		o->local_hits = kvt_fault_disarm();
	}
	return NULL;
}

static struct other run_other(enum kvt_fault_site site, uint32_t n)
{
	struct other o = {.site = site, .n = n};
	pthread_t th;

	assert_int_equal(pthread_create(&th, NULL, other_thread, &o), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	return o;
}

/* KVT_FAULT_STAGE, armed on one thread, is counted and fired on every thread; the thread-local
   sites stay the arming thread's; one thread at a time holds the shared site. */
static void test_fault_shared_site(void **state)
{
	struct other o;

	(void)state;
	assert_int_equal(kvt_fault_arm(KVT_FAULT_SHARED | 1u << KVT_FAULT_ALLOC, 1), -EINVAL);
	assert_int_equal(kvt_fault_arm(1u << KVT_FAULT_SITES, 1), -EINVAL);
	assert_false(kvt_fault(KVT_FAULT_STAGE)); /* nothing armed by the refusals */

	assert_int_equal(kvt_fault_arm(KVT_FAULT_SHARED, 3), 0);
	assert_false(kvt_fault(KVT_FAULT_STAGE)); /* hit 1, here */
	assert_false(kvt_fault(KVT_FAULT_ALLOC)); /* not armed: not counted */
	o = run_other(KVT_FAULT_STAGE, 4);	  /* hits 2..5 there: the 2nd of them fails */
	assert_int_equal(o.failed, 1u << 1);
	assert_int_equal(o.arm_shared, -EBUSY);
	assert_int_equal(o.local_hits, 2);
	assert_int_equal(kvt_fault_hits(), 5);
	assert_true(kvt_fault_fired());
	assert_int_equal(kvt_fault_fired_site(), KVT_FAULT_STAGE);
	o = run_other(KVT_FAULT_ALLOC, 3); /* another thread's allocations: not this arming's */
	assert_int_equal(o.failed, 0);
	assert_int_equal(kvt_fault_disarm(), 5);
	assert_true(kvt_fault_fired()); /* as for the local sites, kept after disarming */
	assert_int_equal(kvt_fault_fired_site(), KVT_FAULT_STAGE);

	/* released: the other thread may take it, and hits no longer count or fail */
	o = run_other(KVT_FAULT_STAGE, 3);
	assert_int_equal(o.failed, 0);
	assert_int_equal(o.arm_shared, 0);

	/* re-arming locally releases the shared site; a local arming never counts its hits */
	assert_int_equal(kvt_fault_arm(KVT_FAULT_SHARED, 1), 0);
	assert_int_equal(kvt_fault_arm(1u << KVT_FAULT_XFER, 2), 0);
	o = run_other(KVT_FAULT_STAGE, 2);
	assert_int_equal(o.failed, 0);
	assert_int_equal(o.arm_shared, 0);
	assert_false(kvt_fault(KVT_FAULT_STAGE));
	assert_false(kvt_fault(KVT_FAULT_XFER));
	assert_true(kvt_fault(KVT_FAULT_XFER));
	assert_int_equal(kvt_fault_fired_site(), KVT_FAULT_XFER);
	assert_int_equal(kvt_fault_disarm(), 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_fault_shared_site),
					   cmocka_unit_test(test_fault_walk)};

	check_context = run_context;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
