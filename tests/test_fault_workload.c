/* SPDX-License-Identifier: MIT */
/*
 * fault: the steps of the workload (each call, its expected outcome and what a failure may
 * leave) and one run of it with or without a fault armed.
 */
#include "test_fault.h"

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
   - the prefix cache, which is best effort (kvtier.h): kvt_seq_create_prefix (flag F_CACHE)
     whose room for the spans on disk or their read back failed shares fewer of them (the
     caller checks the match, never longer than the fault-free one); a call that had to
     drop an idle span it would have written to the spill file, or a last prefill that could
     not cache its spans (fewer spans cached, or more dropped, than without the fault). A
     later match may then be shorter, and the run goes on unaligned from there;
   - a CUDA error in kvt_sched_commit: the device wait of a completed request's preempt
     failed; the next kvt_sched_step frees its frames, so the run goes on as the fault-free
     one (still compared step by step).
   Anything else that succeeds although its hit failed is a problem. Every token is read back
   after an absorbed fault. */
bool absorbed(struct run *r, uint32_t i, unsigned flags)
{
	bool ok = false;
	uint32_t a;

	if (flags & (F_ABSORB | F_CACHE)) {
		ok = true;
		if (!strcmp(r->what, "kvt_sched_step"))
			r->aligned = false;
	} else if (r->site == KVT_FAULT_CUDA && !strcmp(r->what, "kvt_sched_commit")) {
		ok = true;
	} else if (r->m && r->aligned && g_snap[i]) {
		const struct snap *after =
			i + 1 < g_steps && !g_snap_gap[i + 1] ? g_snap[i + 1] : NULL;
		struct kvt_stats st = KVT_STATS_INIT;

		CHECK_RC(kvt_manager_stats(r->m, &st), 0);
		ok = r->site == KVT_FAULT_IO && st.disk_io_errors > g_snap[i]->st.disk_io_errors;
		ok |= after && (st.prefix_spans < after->st.prefix_spans ||
				st.prefix_spans_evicted > after->st.prefix_spans_evicted);
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

/* Rows [from, to) of every head of (j, l), as [NH][to - from][HD], into k and v. */
static void fill_rows(struct run *r, int j, uint32_t l, uint32_t from, uint32_t to, uint8_t *k,
		      uint8_t *v)
{
	for (uint32_t h = 0; h < NH; h++)
		for (uint32_t p = from; p < to; p++) {
			size_t off = ((size_t)h * (to - from) + (p - from)) * r->rb;

			t_fill_row(r->c.dtype, HD, k + off, data_id(j, p), l, h, p, 0);
			t_fill_row(r->c.dtype, HD, v + off, data_id(j, p), l, h, p, 1);
		}
}

/* The observation queries of (j, l) as t_fill_prefill makes them. */
static void fill_qobs(struct run *r, int j, uint32_t l)
{
	uint32_t L = r->q[j].L, obs = r->c.obs_window;

	for (uint32_t g = 0; g < NQ; g++)
		for (uint32_t i = 0; i < obs; i++)
			t_fill_row(r->c.dtype, HD, r->qo + ((size_t)g * obs + i) * r->rb,
				   r->q[j].id, l, 1000 + g, L >= obs ? L - obs + i : i, 0);
}

/* kvt_prefill_layer: the whole layer's tensors (after a shared prefix, the rest is saved). */
static void w_prefill(struct run *r, int j, uint32_t l)
{
	struct mseq *s = &r->q[j];
	int rc;

	fill_rows(r, j, l, 0, s->L, r->k, r->v);
	fill_qobs(r, j, l);
	STEP(r, rc, 0, 0, "kvt_prefill_layer",
	     t_prefill_layer(r->m, s->id, l, r->k, r->v, r->qo, NULL));
	if (!rc)
		s->n[l] = s->fill[l] = s->L;
}

/* A prefix match of fault-free length want came out as got: a difference is a problem, but
   for a shorter one once the fault fired (the cache is best effort; see absorbed()), after
   which the run goes on unaligned, adapting its prefill to the match. */
static void match_seen(struct run *r, const char *what, uint32_t got, uint32_t want)
{
	if (got == want)
		return;
	if (r->mode == MODE_FAULT && r->fired && got < want) {
		if (!r->short_match)
			g_short++;
		r->short_match = true;
		r->aligned = false;
		return;
	}
	problem(r, "prefix match differs", "%s matched %u tokens, %s %u", what, got,
		r->mode == MODE_FAULT ? "the fault-free run" : "expected", want);
}

#define HT 16 /* hash_tokens: two blocks */

static void w_match(struct run *r, const uint64_t *h, uint32_t n, uint32_t want)
{
	uint32_t got = UINT32_MAX;
	int rc;

	STEP(r, rc, 0, 0, "kvt_prefix_match", kvt_prefix_match(r->m, h, n, HT, &got));
	if (!rc)
		match_seen(r, "kvt_prefix_match", got, want);
}

static void w_create_prefix(struct run *r, int j, const uint64_t *h, uint32_t n, uint32_t want)
{
	struct mseq *s = &r->q[j];
	uint32_t got = UINT32_MAX;
	int rc;

	STEP(r, rc, 0, F_CACHE, "kvt_seq_create_prefix",
	     kvt_seq_create_prefix(r->m, s->id, s->L, h, n, HT, &got));
	if (rc)
		return;
	s->live = true;
	s->matched = got;
	for (uint32_t l = 0; l < NL; l++)
		s->fill[l] = got;
	match_seen(r, "kvt_seq_create_prefix", got, want);
}

/* Where a chunk's tensors start: the chunk alone, the layer from 0, or halfway. */
enum kv_from { KV_ALONE, KV_ALL, KV_HALF };

/* kvt_prefill_chunk of (j, l) from where its history ends to `end` (nothing when it reaches
   there already); the last chunk completes the layer. */
static void w_chunk(struct run *r, int j, uint32_t l, uint32_t end, enum kv_from from)
{
	struct mseq *s = &r->q[j];
	uint32_t pos = s->fill[l], kv = from == KV_ALONE ? pos : from == KV_ALL ? 0 : pos / 2;
	bool last = end == s->L;
	int rc;

	if (s->n[l] || end <= pos)
		return;
	fill_rows(r, j, l, kv, end, r->k, r->v);
	if (last)
		fill_qobs(r, j, l);
	STEP(r, rc, 0, 0, "kvt_prefill_chunk",
	     t_prefill_chunk(r->m, s->id, l, pos, end - pos, kv, r->k, r->v, last ? r->qo : NULL,
			     NULL));
	if (rc)
		return;
	s->fill[l] = end;
	if (last)
		s->n[l] = end;
}

/* kvt_seq_load_kv of positions [pos, pos + n) of (j, l), as far as its history holds them;
   every row must be the one written. */
static void w_load(struct run *r, int j, uint32_t l, uint32_t pos, uint32_t n)
{
	static uint8_t k[NH * MAX_ROWS * HD * 4], v[NH * MAX_ROWS * HD * 4],
		ek[NH * MAX_ROWS * HD * 4], ev[NH * MAX_ROWS * HD * 4];
	struct mseq *s = &r->q[j];
	uint32_t filled = s->n[l] ? s->n[l] : s->fill[l];
	int rc;

	n = pos + n <= filled ? n : pos < filled ? filled - pos : 0;
	if (!n || n > MAX_ROWS)
		return;
	STEP(r, rc, 0, 0, "kvt_seq_load_kv", t_load_kv(r->m, s->id, l, pos, n, k, v, NULL));
	if (rc)
		return;
	fill_rows(r, j, l, pos, pos + n, ek, ev);
	if (memcmp(k, ek, NH * n * r->rb) || memcmp(v, ev, NH * n * r->rb)) {
		g_lost++;
		problem(r, "history load wrong", "seq %llu l%u [%u, +%u): bytes differ",
			(unsigned long long)s->id, l, pos, n);
	}
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
	t_fill_row(r->c.dtype, HD, ek, data_id(j, pos), l, h, pos, 0);
	t_fill_row(r->c.dtype, HD, ev, data_id(j, pos), l, h, pos, 1);
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
		r->q[j].matched = 0;
		memset(r->q[j].n, 0, sizeof(r->q[j].n));
		memset(r->q[j].fill, 0, sizeof(r->q[j].fill));
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
		compare(g_end, sn,
			r->aligned	 ? CMP_END
			: r->short_match ? CMP_SHORT
					 : CMP_LOOSE,
			&d);
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
	static const int ab[] = {A, B}, ba[] = {B, A}, abc[] = {A, B, C}, ac[] = {A, C}, c_[] = {C},
			 pq[] = {P, Q};
	/* P's chain; Q's shares its first two spans, then its own */
	static const uint64_t hp[] = {0x5100, 0x5101, 0x5102}, hq[] = {0x5100, 0x5101, 0x5202};
	int rc;

	r->m = M_SENTINEL;
	STEP(r, rc, 0, F_MCREATE | F_ABSORB, "kvt_manager_create", t_manager_create(&r->c, &r->m));
	if (rc) {
		r->m = NULL;
		return;
	}
	/* The walk holds every failed call to changing nothing. A recall program on the device is
	   settled by a later call, which reports its failure and leaves its views stale by
	   contract (kvt_decode_recall), so the walk keeps the regions on the CPU, and the device's
	   are walked by test_cuda's test_fault_recall and test_fault_recall_settle, and
	   test_step's test_step_recall_disk_faults. */
	r->m->dev_regions = false;

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
	w_destroy(r, E);
	w_destroy(r, D); /* device frames for two prompts at a time */

	/* the prefix cache: P caches its chain's three spans; Q shares two of them and prefills
	   the rest in chunks (the chunk alone, rows from 0, rows from halfway; the last chunk of
	   each layer assembles it from the host history) between loads of the history */
	w_match(r, hp, 3, 0);
	w_create_prefix(r, P, hp, 3, 0);
	w_prefill(r, P, 0);
	w_prefill(r, P, 1);
	w_match(r, hp, 3, 48);
	w_match(r, hq, 3, 32);
	w_create_prefix(r, Q, hq, 3, 32);
	w_load(r, Q, 0, 0, 32);
	w_chunk(r, Q, 0, 40, KV_ALONE);
	w_load(r, Q, 0, 16, 24);
	w_chunk(r, Q, 0, 50, KV_ALL);
	w_chunk(r, Q, 1, 44, KV_ALONE);
	w_chunk(r, Q, 0, 60, KV_ALONE); /* rows [0, 50) from the history */
	w_chunk(r, Q, 1, 60, KV_HALF);	/* rows [0, 22): Q's own span is cached */
	w_match(r, hq, 3, 48);
	w_decode(r, pq, 2, 1);
	w_attend(r, Q, 0);

	/* explicit spills of sequences that share spans (the shared blocks stay); once neither
	   is live the spans are idle: S's prefill sends the least recently used (P's last) to
	   the spill file, and R's create reads it back, making room by sending Q's own there */
	w_spill(r, P);
	w_spill(r, Q);
	w_read(r, Q, 1, 1, 40);
	w_load(r, Q, 1, 24, 30);
	w_destroy(r, P);
	w_destroy(r, Q);
	w_create(r, S);
	w_prefill(r, S, 0);
	w_prefill(r, S, 1);
	w_match(r, hq, 3, 48); /* spans in the spill file count */
	w_match(r, hp, 3, 48);
	w_create_prefix(r, R, hp, 3, 48);
	w_destroy(r, S); /* done: the checks after later faults need not read it back */
	w_chunk(r, R, 0, 52, KV_ALONE); /* rows [0, 48) from the spans read back */
	w_prefill(r, R, 1);
	w_spill(r, R);
	w_read_host_only(r, R, 0, 1);
	w_attend(r, R, 1);

	end_checks(r);

	/* one destroy; the manager frees the rest */
	w_destroy(r, A);
	step_begin(r, "kvt_manager_destroy");
	kvt_manager_destroy(r->m);
	r->m = NULL;
	step_end(r, 0, 0, F_VOID);
}

void run_once(enum mode mode, uint32_t mask, uint64_t nth)
{
	struct run *r = t_xmalloc(sizeof(*r));

	r->mode = mode;
	r->mask = mask;
	r->nth = nth;
	r->aligned = true;
	r->site = KVT_FAULT_SITES;
	r->c = g_cfg;
	r->rb = (size_t)HD * kvt_dtype_size(g_cfg.dtype);
	r->k = t_xmalloc((size_t)NH * MAX_ROWS * r->rb);
	r->v = t_xmalloc((size_t)NH * MAX_ROWS * r->rb);
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
