/* SPDX-License-Identifier: MIT */
/*
 * cuda: CUDA failures, one call at a time.
 */
#include "test_cuda.h"

/* ---- CUDA failures, one call at a time ------------------------------------------------------ */

/* A bystander sequence b, live on both managers, and a target t prefilled on the host manager
   (the reference); each test brings t to the CUDA manager its own way. */
struct fenv {
	struct pair p;
	struct tseq b, t;
	uint8_t *b_snap[N_LAYERS]; /* b's device frames on the CUDA manager */
	size_t b_snap_bytes[N_LAYERS];
	/* Failed calls that changed their own sequence's device frames: collected, so one run
	   walks every CUDA call and lists them all at the end (fault_problems_at). */
	char problems[1536];
	uint32_t n_problems;
};

static void fenv_init(struct fenv *e)
{
	struct pair *p = &e->p;
	struct tseq *bb[1] = {&e->b};

	memset(e, 0, sizeof(*e));
	set_ctx("fault: setup");
	pair_init(p, KVT_DTYPE_F16, NULL, 700, 1);
	tseq_gen(&e->b, &p->cfg, 0xb1e55ed0ull, 700, 16);
	tseq_gen(&e->t, &p->cfg, 0x7a59e70ull, 700, 1200);
	CHECK_RC(kvt_seq_create(p->h, e->b.id, e->b.L), 0);
	CHECK_RC(kvt_seq_create(p->c, e->b.id, e->b.L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		PREFILL_BOTH(p, &e->b, l);
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_SELECTION(p, &e->b, l);
	for (uint32_t step = 0; step < 5; step++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			DECODE_BOTH(p, bb, 1, l);
	CHECK_RC(kvt_seq_create(p->h, e->t.id, e->t.L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		CHECK_RC(prefill_on(p, p->h, &e->t, l), 0);
		e->t.n[l] = e->t.L;
	}
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		CHECK_RESIDENT(p, &e->b, l);
		e->b_snap[l] = SNAPSHOT(p, p->c, &e->b, l, &e->b_snap_bytes[l]);
	}
}

static void fenv_fini(struct fenv *e)
{
	for (uint32_t l = 0; l < N_LAYERS; l++)
		free(e->b_snap[l]);
	tseq_free(&e->b);
	tseq_free(&e->t);
	pair_fini(&e->p);
	g_ctx[0] = '\0';
}

/* The CUDA call numbered nth of `call` fails (KVT_FAULT_CUDA); fired: whether it was reached.
   Nothing between arming and disarming may fail the test (cmocka would leave it armed). */
#define ARMED(nth, fired, rc, call)                         \
	do {                                                \
		kvt_fault_arm(1u << KVT_FAULT_CUDA, (nth)); \
		(rc) = (call);                              \
		(fired) = kvt_fault_fired();                \
		kvt_fault_disarm();                         \
	} while (0)

static void expect_info_at(const struct kvt_seq_info *a, const struct kvt_seq_info *b, uint64_t id,
			   const char *op, const char *file, int line)
{
	if (a->layers_prefilled != b->layers_prefilled || a->tokens != b->tokens ||
	    a->device_frames != b->device_frames || a->host_blocks != b->host_blocks ||
	    a->preempted != b->preempted || a->frames_per_layer != b->frames_per_layer)
		fail_at(file, line,
			"failed %s changed kvt_seq_info of seq %llu: layers %u -> %u, tokens %u -> "
			"%u, device frames %llu -> %llu, host blocks %llu -> %llu, preempted %u -> %u",
			op, ULL(id), a->layers_prefilled, b->layers_prefilled, a->tokens, b->tokens,
			ULL(a->device_frames), ULL(b->device_frames), ULL(a->host_blocks),
			ULL(b->host_blocks), a->preempted, b->preempted);
}

static void before_take(struct fenv *e, struct before *b, uint32_t t_layer)
{
	struct pair *p = &e->p;

	b->ti = t_info_of(p->c, e->t.id);
	b->bi = t_info_of(p->c, e->b.id);
	b->st = t_stats_of(p->c);
	b->t_layer = t_layer;
	b->t_snap =
		b->ti.layers_prefilled ? SNAPSHOT(p, p->c, &e->t, t_layer, &b->t_snap_bytes) : NULL;
}

/* The armed call failed through its fault: a negative errno CUDA failures map to, the last
   error set, and nothing visible changed: counters, both sequences' info, the bystander's and
   the target's tokens and device frames. */
static void after_fault_at(struct fenv *e, const struct before *b, const char *op, uint64_t nth,
			   int rc, const char *file, int line)
{
	struct pair *p = &e->p;
	struct kvt_stats st = t_stats_of(p->c);
	struct kvt_seq_info ti = t_info_of(p->c, e->t.id), bi = t_info_of(p->c, e->b.id);
	char what[128];

	if (rc != -EIO && rc != -ENOMEM && rc != -ENODEV)
		fail_at(file, line,
			"%s with CUDA call %llu failing returned %d (%s): expected -EIO, -ENOMEM or "
			"-ENODEV",
			op, ULL(nth), rc, kvt_strerror(rc));
	if (!kvt_manager_last_error(p->c)[0])
		fail_at(file, line, "%s failed (%d) with an empty kvt_manager_last_error", op, rc);
	for (size_t i = 0; i < n_stat_fields; i++) {
		const struct stat_field *f = &stat_fields[i];

		if ((f->flags & F_FIX) && stat_get(&st, f) != stat_get(&b->st, f))
			fail_at(file, line,
				"failed %s (CUDA call %llu) changed stats.%s: %llu -> %llu", op,
				ULL(nth), f->name, ULL(stat_get(&b->st, f)), ULL(stat_get(&st, f)));
	}
	expect_info_at(&b->ti, &ti, e->t.id, op, file, line);
	expect_info_at(&b->bi, &bi, e->b.id, op, file, line);
	snprintf(what, sizeof(what), "after a failed %s, cuda", op);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		expect_frames_as_at(p, &e->b, l, e->b_snap[l], e->b_snap_bytes[l], what, file,
				    line);
		check_tokens_at(p, &e->b, l, false, file, line);
	}
	if (b->t_snap) {
		size_t n, used = strlen(e->problems);
		uint8_t *now = SNAPSHOT(p, p->c, &e->t, b->t_layer, &n);
		char msg[200];

		if (snapshot_differs(b->t_snap, b->t_snap_bytes, now, n, &e->t, b->t_layer, msg,
				     sizeof(msg))) {
			/* its tokens read back differently for the same reason: the retry
			   rewrites them, and then they are compared with the reference */
			e->n_problems++;
			snprintf(e->problems + used, sizeof(e->problems) - used,
				 "#   %s:%d: %s failed (%d) at CUDA call %llu but changed %s\n",
				 file, line, op, rc, ULL(nth), msg);
		} else {
			for (uint32_t l = 0; l < N_LAYERS; l++)
				check_tokens_at(p, &e->t, l, false, file, line);
		}
		free(now);
	}
}

/* kvtier.h: a failed call changes nothing visible; its own sequence's frames included. */
static void fault_problems_at(const struct fenv *e, const char *file, int line)
{
	if (!e->n_problems)
		return;
	g_ctx[0] = '\0';
	print_message("%s", e->problems);
	fail_at(file, line,
		"%u failed calls changed their own sequence's device frames (listed "
		"above)",
		e->n_problems);
}

/* The loop over nth ended: the fault hook was reached at least once. */
static void fault_expect_done_at(uint64_t failed, const char *op, const char *file, int line)
{
	if (!failed)
		fail_at(file, line,
			"KVT_FAULT_CUDA never fired during %s: the plugin does not ask the fault hook "
			"before its CUDA calls (plugin.h)",
			op);
	print_message("# %s: %llu CUDA calls, each failed once\n", op, ULL(failed));
}

/* Checks an armed call's outcome: rc and whether its fault fired. Returns whether it fired. */
static bool armed_outcome_at(struct fenv *e, const struct before *b, const char *op, uint64_t nth,
			     int rc, bool fired, const char *file, int line)
{
	if (!fired) {
		if (rc)
			fail_at(file, line,
				"%s returned %d (%s) without its fault firing (CUDA call "
				"%llu): %s",
				op, rc, kvt_strerror(rc), ULL(nth), kvt_manager_last_error(e->p.c));
		return false;
	}
	if (rc == 0)
		fail_at(file, line,
			"%s took its injected failure of CUDA call %llu and returned 0 (the error was "
			"swallowed)",
			op, ULL(nth));
	after_fault_at(e, b, op, nth, rc, file, line);
	return true;
}
#define ARMED_OUTCOME(e, b, op, nth, rc, fired) \
	armed_outcome_at((e), (b), (op), (nth), (rc), (fired), __FILE__, __LINE__)

static void retry_at(struct fenv *e, const char *op, uint64_t nth, int rc, const char *file,
		     int line)
{
	if (rc)
		fail_at(file, line, "%s retried after its fault (CUDA call %llu) = %d (%s): %s", op,
			ULL(nth), rc, kvt_strerror(rc), kvt_manager_last_error(e->p.c));
}
#define RETRY(e, op, nth, call) retry_at((e), (op), (nth), (call), __FILE__, __LINE__)

void test_fault_prefill(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t;
	uint64_t failed = 0;

	(void)state;
	fenv_init(&e);
	for (uint64_t nth = 1;; nth++) {
		struct before b;
		bool fired;
		int rc;

		set_ctx("fault: prefill, CUDA call %llu fails", ULL(nth));
		if (nth > FAULT_MAX)
			fail_at(__FILE__, __LINE__, "prefill never completed with a fault armed");
		CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
		before_take(&e, &b, 0);
		ARMED(nth, fired, rc, prefill_on(p, p->c, t, 0));
		if (ARMED_OUTCOME(&e, &b, "kvt_prefill_layer", nth, rc, fired)) {
			uint32_t n = 1;

			failed++;
			CHECK_RC(kvt_seq_tokens(p->c, t->id, 0, &n), 0);
			CHECK_EQ(n, 0);
			RETRY(&e, "kvt_prefill_layer", nth, prefill_on(p, p->c, t, 0));
		}
		sync_both(p);
		CHECK_SELECTION(p, t, 0);
		CHECK_TOKENS(p, t, 0, true);
		CHECK_FRAMES(p, t, 0);
		free(b.t_snap);
		if (!fired)
			break;
		CHECK_RC(kvt_seq_destroy(p->c, t->id), 0);
	}
	fault_expect_done_at(failed, "kvt_prefill_layer", __FILE__, __LINE__);
	fault_problems_at(&e, __FILE__, __LINE__);
	fenv_fini(&e);
}

void test_fault_decode(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t, *tt[1] = {&e.t};

	(void)state;
	fenv_init(&e);
	CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_RC(prefill_on(p, p->c, t, l), 0);
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_SELECTION(p, t, l);
	/* pass 0: the token lands inside a block; pass 1: it opens a new host block */
	for (int pass = 0; pass < 2; pass++) {
		const char *op = pass ? "kvt_decode_append (new block)" : "kvt_decode_append";
		uint64_t failed = 0;

		for (uint64_t nth = 1;; nth++) {
			struct before b;
			bool fired;
			int rc;

			set_ctx("fault: %s, CUDA call %llu fails", op, ULL(nth));
			if (nth > FAULT_MAX)
				fail_at(__FILE__, __LINE__, "%s never completed with a fault armed",
					op);
			while ((t->n[0] % BT == 0) != (pass == 1))
				DECODE_BOTH(p, tt, 1, 0);
			sync_both(p);
			before_take(&e, &b, 0);
			ARMED(nth, fired, rc, decode_on(p, p->c, tt, 1, 0));
			if (ARMED_OUTCOME(&e, &b, op, nth, rc, fired)) {
				failed++;
				RETRY(&e, op, nth, decode_on(p, p->c, tt, 1, 0));
			}
			CHECK_RC(decode_on(p, p->h, tt, 1, 0), 0);
			t->n[0]++;
			sync_both(p);
			CHECK_RESIDENT(p, t, 0);
			CHECK_TOKENS(p, t, 0, true);
			CHECK_FRAMES(p, t, 0);
			free(b.t_snap);
			if (!fired)
				break;
		}
		fault_expect_done_at(failed, op, __FILE__, __LINE__);
	}
	fault_problems_at(&e, __FILE__, __LINE__);
	fenv_fini(&e);
}

/* The target t, on both managers, prefilled and 20 tokens into its decode. */
static void t_decoding(struct fenv *e)
{
	struct pair *p = &e->p;
	struct tseq *t = &e->t, *tt[1] = {&e->t};

	CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_RC(prefill_on(p, p->c, t, l), 0);
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_SELECTION(p, t, l);
	for (uint32_t step = 0; step < 20; step++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			DECODE_BOTH(p, tt, 1, l);
	sync_both(p);
}

/* (seq, layer)'s recall region on m, read back from the device when kept there; NULL when it
   has none. */
static struct kvt_recall_layer *region_of(struct kvt_manager *m, uint64_t seq, uint32_t layer)
{
	struct kvt_seq *s = kvt_seqmap_get(&m->seqs, seq);
	struct kvt_recall_layer *rc = s ? s->layers[layer].rc : NULL;

	if (rc) {
		CHECK_RC(kvt_recall_pull(m, rc), 0);
		CHECK_RC(kvt_recall_sync(m, rc), 0);
	}
	return rc;
}

void test_fault_recall(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t, *tt[1] = {&e.t};
	uint64_t failed = 0, undone = 0;

	(void)state;
	fenv_init(&e);
	t_decoding(&e);
	for (uint64_t nth = 1;; nth++) {
		struct before b;
		uint32_t clock0;
		bool fired;
		int rc;

		set_ctx("fault: kvt_decode_recall, CUDA call %llu fails", ULL(nth));
		if (nth > FAULT_MAX)
			fail_at(__FILE__, __LINE__, "recall never completed with a fault armed");
		/* drop t's recalled blocks, so this recall loads every one of them again */
		CHECK_RC(kvt_seq_preempt(p->h, t->id), 0);
		CHECK_RC(kvt_seq_preempt(p->c, t->id), 0);
		CHECK_RC(kvt_seq_resume(p->h, t->id, NULL), 0);
		CHECK_RC(kvt_seq_resume(p->c, t->id, p->stream), 0);
		t->recalled[0] = t->recalled[1] = false;
		sync_both(p);
		before_take(&e, &b, 0);
		clock0 = p->c->dev_regions ? region_of(p->c, t->id, 0)->rg.clock : 0;
		ARMED(nth, fired, rc, recall_on(p, p->c, tt, 1, 0));
		if (ARMED_OUTCOME(&e, &b, "kvt_decode_recall", nth, rc, fired)) {
			failed++;
			/* On the device, a call that failed after its decisions were made (its
			   clock moved) undid its loads: the host's, failing its gather, does the
			   same, so that the two regions can be compared state for state. */
			if (p->c->dev_regions && region_of(p->c, t->id, 0)->rg.clock != clock0) {
				bool hf;
				int hrc;

				kvt_fault_arm(1u << KVT_FAULT_XFER, 1);
				hrc = recall_on(p, p->h, tt, 1, 0);
				hf = kvt_fault_fired();
				kvt_fault_disarm();
				if (!hf || hrc == 0)
					fail_msg("the host's recall with its gather failing = %d "
						 "(fired %d)",
						 hrc, hf);
				undone++;
			}
			RETRY(&e, "kvt_decode_recall", nth, recall_on(p, p->c, tt, 1, 0));
		}
		CHECK_RC(recall_on(p, p->h, tt, 1, 0), 0);
		t->recalled[0] = true;
		sync_both(p);
		CHECK_VIEWS(p, t, 0);
		CHECK_ATTEND(p, t, 0, NULL);
		if (p->c->dev_regions) { /* frames as indices: both caches from their base */
			struct kvt_manager *mm[2] = {p->h, p->c};
			uint64_t origin[2] = {p->h->rc.base, p->c->rc.base};

			t_same_region(mm, t->id, 0, origin);
		}
		free(b.t_snap);
		if (!fired)
			break;
	}
	fault_expect_done_at(failed, "kvt_decode_recall", __FILE__, __LINE__);
	/* failures after the decisions were reached (on the device) */
	assert_true(!p->c->dev_regions || undone > 0);
	print_message("# fault: recall: %llu CUDA calls failed, %llu after the decisions\n",
		      ULL(failed), ULL(undone));
	fault_problems_at(&e, __FILE__, __LINE__);
	fenv_fini(&e);
}

/* With the regions on the device, a recall call's program is settled later (the figures, a
   view, the layer's next call read what it reported). A program the device failed is found
   there: the call that finds it fails, the call's views read as stale, and every later recall
   call fails with that error (the regions' state on the device cannot be told), while the
   rest of the manager works on: appends, other sequences' tokens and frames. */
void test_fault_recall_settle(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t, *tt[1] = {&e.t}, *bb[1] = {&e.b};
	struct kvt_recall_ref refs[64];
	uint32_t n = 0;
	bool fired;
	int rc;

	(void)state;
	fenv_init(&e);
	if (!p->c->dev_regions) {
		print_message("# fault (settle): no recall regions on the device, nothing to do\n");
		fenv_fini(&e);
		return;
	}
	t_decoding(&e);
	set_ctx("fault: a recall program fails on the device");
	CHECK_RC(recall_on(p, p->c, tt, 1, 0), 0);
	CHECK_EQ(p->c->rc.n_pending, 1); /* queued, not waited for */
	/* the view settles it: its fence reports the failure */
	ARMED(1, fired, rc, kvt_seq_recall_view(p->c, t->id, 0, 0, refs, 64, &n));
	assert_true(fired);
	if (rc != -EIO)
		fail_msg("the view of a call whose program failed = %d (%s), expected -EIO: %s", rc,
			 kvt_strerror(rc), kvt_manager_last_error(p->c));
	CHECK_EQ(p->c->rc.n_pending, 0);
	assert_true(kvt_manager_last_error(p->c)[0] != '\0');
	/* every later recall call and view fails the same way */
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_RC(recall_on(p, p->c, tt, 1, l), -EIO);
	CHECK_RC(kvt_seq_recall_view(p->c, t->id, 0, 0, refs, 64, &n), -EIO);
	/* the rest works on */
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		DECODE_BOTH(p, bb, 1, l);
		CHECK_RC(decode_on(p, p->c, tt, 1, l), 0);
		CHECK_RC(decode_on(p, p->h, tt, 1, l), 0);
		t->n[l]++;
	}
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		CHECK_TOKENS(p, &e.b, l, true);
		CHECK_TOKENS(p, t, l, true);
	}
	fenv_fini(&e);
}

/* A save thread's wait for a staging copy fails (KVT_FAULT_STAGE: after the copy landed, as an
   asynchronous CUDA error reported there would). The calls that need the lost save fail with
   -EIO and the detail: a read of t's host history, a sync. Those that need only earlier saves
   do not: b, saved before, still reads back bit-exact, resident and host-only tokens. Nothing
   hangs, and t and the manager are destroyed as usual. */
void test_fault_stage(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t;
	uint8_t gk[ROW_MAX], gv[ROW_MAX];
	uint64_t hits;
	bool fired;
	int rc_prefill, rc_read;

	(void)state;
	fenv_init(&e);
	set_ctx("fault: a staging copy of t's prefill save is lost");
	CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
	CHECK_RC(kvt_fault_arm(KVT_FAULT_SHARED, 1), 0);
	rc_prefill = prefill_on(p, p->c, t, 0);
	/* the host history waits for the save, wherever the position is resident */
	rc_read = kvt_seq_read_token_host(p->c, t->id, 0, 0, 0, gk, gv);
	fired = kvt_fault_fired();
	hits = kvt_fault_disarm();
	CHECK_RC(rc_prefill, 0); /* its save is asynchronous: the prefill itself succeeded */
	if (!fired)
		fail_at(__FILE__, __LINE__,
			"KVT_FAULT_STAGE never fired (%llu hits): the save of a %u-token prefill "
			"did not wait for its staging copy through stage_wait",
			ULL(hits), t->L);
	CHECK_RC(rc_read, -EIO);
	if (!strstr(kvt_manager_last_error(p->c), "staging copy"))
		fail_at(__FILE__, __LINE__, "last error after the lost save: \"%s\"",
			kvt_manager_last_error(p->c));
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_TOKENS(p, &e.b, l, true);
	CHECK_RC(kvt_manager_sync(p->c, p->stream), -EIO);
	CHECK_RC(kvt_seq_read_token_host(p->c, e.b.id, 0, 0, 0, gk, gv), 0);
	CHECK_RC(kvt_seq_destroy(p->c, t->id), 0);
	CHECK_RC(kvt_seq_read_token_host(p->c, e.b.id, 1, 1, e.b.L - 1, gk, gv), 0);
	fenv_fini(&e);
}
