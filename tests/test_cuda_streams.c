/* SPDX-License-Identifier: MIT */
/*
 * cuda: a non-blocking stream, many resumes with one wait, saves off the caller's stream, the
 * attention tables' read-back in one wait.
 */
#include "test_cuda.h"

/* ---- a non-blocking stream ------------------------------------------------------------------ */

#define STALL_BYTES ((size_t)64 << 20)

/* Holds the stream back (about a GiB of device writes) so that a call whose device work did
   not follow the stream would run before the uploads queued behind the stall. */
static void stall(const struct pair *p, void *buf)
{
	for (int i = 0; i < 16; i++)
		CUDA_OK(cudaMemsetAsync(buf, i, STALL_BYTES, p->stream));
}

static void *pinned(const void *src, size_t n)
{
	void *h = NULL;

	CUDA_OK(cudaMallocHost(&h, n));
	memcpy(h, src, n);
	return h;
}

/* Uploads n bytes with cudaMemcpyAsync on the pair's stream, behind a stall. */
static void *upload_async(const struct pair *p, void *dst, const void *src, size_t n)
{
	void *h = pinned(src, n);

	CUDA_OK(cudaMemcpyAsync(dst, h, n, cudaMemcpyHostToDevice, p->stream));
	return h;
}

void test_nonblocking_stream(void **state)
{
	cudaStream_t nb;
	struct pair p;
	struct tseq ts[2];
	struct tseq *bt[2] = {&ts[0], &ts[1]};
	void *delay;
	size_t rb;

	(void)state;
	set_ctx("non-blocking stream: setup");
	CUDA_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	pair_init(&p, KVT_DTYPE_BF16, nb, 1500, 2);
	rb = p.rowb;
	delay = dev_alloc(STALL_BYTES);
	tseq_gen(&ts[0], &p.cfg, 0x5717ea0001ull, 1500, 40);
	tseq_gen(&ts[1], &p.cfg, 0x5717ea0002ull, 40, 40);
	for (uint32_t i = 0; i < 2; i++) {
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
	}
	/* garbage where the inputs go: a call that ran ahead of its uploads would store it */
	CUDA_OK(cudaMemset(p.dk, 0xff, (size_t)N_KV * 1500 * rb));
	CUDA_OK(cudaMemset(p.dv, 0xff, (size_t)N_KV * 1500 * rb));
	CUDA_OK(cudaMemset(p.dq, 0xff, (size_t)N_Q * OBS * rb));

	set_ctx("non-blocking stream: prefill");
	for (uint32_t l = 0; l < N_LAYERS; l++)
		for (uint32_t i = 0; i < 2; i++) {
			struct tseq *t = &ts[i];
			size_t kvb = (size_t)N_KV * t->L * rb, qb = (size_t)N_Q * OBS * rb;
			uint8_t *k = t_xmalloc(kvb), *v = t_xmalloc(kvb);
			void *hk, *hv, *hq = NULL;

			CHECK_RC(prefill_on(&p, p.h, t, l), 0);
			prompt_tensor(t, l, 0, k);
			prompt_tensor(t, l, 1, v);
			stall(&p, delay);
			hk = upload_async(&p, p.dk, k, kvb);
			hv = upload_async(&p, p.dv, v, kvb);
			if (t->count)
				hq = upload_async(&p, p.dq, t->q_obs[l], qb);
			CHECK_RC(kvt_prefill_layer(p.c, t->id, l, p.dk, p.dv, hq ? p.dq : NULL, nb),
				 0);
			garble(&p, p.dk, kvb);
			garble(&p, p.dv, kvb);
			garble(&p, p.dq, qb);
			CHECK_RC(kvt_manager_sync(p.c, nb), 0); /* before the pinned sources go */
			CUDA_OK(cudaFreeHost(hk));
			CUDA_OK(cudaFreeHost(hv));
			if (hq)
				CUDA_OK(cudaFreeHost(hq));
			free(k);
			free(v);
			t->n[l] = t->L;
		}
	sync_both(&p);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < 2; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_SELECTION(&p, &ts[i], l);
	print_margin(KVT_DTYPE_BF16);
	CHECK_ALL(&p, ts, 2, ts[0].tie[0] || ts[0].tie[1]);

	for (uint32_t step = 0; step < 30; step++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			size_t bytes = 2 * N_KV * rb;
			uint8_t k[2 * N_KV * ROW_MAX], v[2 * N_KV * ROW_MAX];
			uint64_t ids[2] = {ts[0].id, ts[1].id};
			void *hk, *hv;

			set_ctx("non-blocking stream: decode step %u layer %u", step, l);
			CHECK_RC(decode_on(&p, p.h, bt, 2, l), 0);
			for (uint32_t i = 0; i < 2; i++)
				for (uint32_t h = 0; h < N_KV; h++) {
					memcpy(k + (i * N_KV + h) * rb,
					       ref_row(&ts[i], l, h, ts[i].n[l], 0), rb);
					memcpy(v + (i * N_KV + h) * rb,
					       ref_row(&ts[i], l, h, ts[i].n[l], 1), rb);
				}
			stall(&p, delay);
			hk = upload_async(&p, p.ek, k, bytes);
			hv = upload_async(&p, p.ev, v, bytes);
			CHECK_RC(kvt_decode_append(p.c, l, ids, 2, p.ek, p.ev, nb), 0);
			garble(&p, p.ek, bytes);
			garble(&p, p.ev, bytes);
			CHECK_RC(kvt_manager_sync(p.c, nb), 0);
			CUDA_OK(cudaFreeHost(hk));
			CUDA_OK(cudaFreeHost(hv));
			ts[0].n[l]++;
			ts[1].n[l]++;
		}
	set_ctx("non-blocking stream: after decode");
	CHECK_ALL(&p, ts, 2, ts[0].tie[0] || ts[0].tie[1]);

	set_ctx("non-blocking stream: recall");
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		size_t qb = 2 * (size_t)N_Q * rb;
		uint8_t *q = t_xmalloc(qb);
		uint64_t ids[2] = {ts[0].id, ts[1].id};
		void *hq;

		CHECK_RC(recall_on(&p, p.h, bt, 2, l), 0);
		memcpy(q, ts[0].q_dec[l], qb / 2);
		memcpy(q + qb / 2, ts[1].q_dec[l], qb / 2);
		stall(&p, delay);
		hq = upload_async(&p, p.eq, q, qb);
		CHECK_RC(kvt_decode_recall(p.c, l, ids, 2, p.eq, nb), 0);
		garble(&p, p.eq, qb);
		CHECK_RC(kvt_manager_sync(p.c, nb), 0);
		CUDA_OK(cudaFreeHost(hq));
		free(q);
		ts[0].recalled[l] = ts[1].recalled[l] = true;
	}
	sync_both(&p);
	for (uint32_t i = 0; i < 2; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			CHECK_VIEWS(&p, &ts[i], l);
			CHECK_ATTEND(&p, &ts[i], l, NULL);
		}
	COMPARE_STATS(&p, ts[0].tie[0] || ts[0].tie[1]);

	tseq_free(&ts[0]);
	tseq_free(&ts[1]);
	pair_fini(&p);
	dev_free(delay);
	CUDA_OK(cudaStreamDestroy(nb));
	g_ctx[0] = '\0';
}

/* ---- many resumes, one wait -------------------------------------------------------------------
 */

#define BURST 20 /* more resumes than the backend has piece-list slots (16) */

/* Preempts ts[0, n) on both managers, waits, then resumes them all, the CUDA manager's on
   stream st, with no wait after. */
static void preempt_resume(struct pair *p, struct tseq *ts, uint32_t n, cudaStream_t st)
{
	for (uint32_t i = 0; i < n; i++) {
		CHECK_RC(kvt_seq_preempt(p->h, ts[i].id), 0);
		CHECK_RC(kvt_seq_preempt(p->c, ts[i].id), 0);
	}
	sync_both(p);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t w0;

		CHECK_RC(kvt_seq_resume(p->h, ts[i].id, NULL), 0);
		w0 = DEVICE_WAITS();
		CHECK_RC(kvt_seq_resume(p->c, ts[i].id, st), 0);
		no_device_wait(w0, 0, "resume", ts[i].id, UINT32_MAX);
	}
}

/* A batch of preempted sequences resumed back to back on a non-blocking stream, with one wait
   after the last, twice: every resume's gather (the fused kernel: calibration off) is still
   queued when the next one fills its piece list, and the last ones find every list slot used
   by work not yet waited for. Short prompts, so no list outgrows its slot (growing one frees
   device memory, and cudaFree waits for the device). Then every frame as before the
   preemption, bit for bit. */
void test_resume_burst(void **state)
{
	const char *was = getenv("KVTIER_CUDA_CALIBRATE");
	char *saved = was ? strdup(was) : NULL;
	struct tseq *ts = t_xmalloc(BURST * sizeof(*ts));
	uint8_t *snap[BURST][N_LAYERS];
	size_t snap_b[BURST][N_LAYERS];
	float early[N_LAYERS][N_Q * HEAD_DIM];
	struct kvt_stats s0, s1;
	bool any_tie = false;
	cudaStream_t nb;
	struct pair p;

	(void)state;
	set_ctx("resume burst: setup");
	assert_true(!was || saved);
	CUDA_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	assert_int_equal(setenv("KVTIER_CUDA_CALIBRATE", "0", 1), 0);
	pair_init(&p, KVT_DTYPE_F16, NULL, 40, 1); /* prefill_on's inputs follow a blocking one */
	if (saved)
		assert_int_equal(setenv("KVTIER_CUDA_CALIBRATE", saved, 1), 0);
	else
		assert_int_equal(unsetenv("KVTIER_CUDA_CALIBRATE"), 0);
	free(saved);
	CHECK_EQ(t_stats_of(p.c).xfer_calibrated, 0);
	for (uint32_t i = 0; i < BURST; i++) {
		tseq_gen(&ts[i], &p.cfg, 0xb0257000ull + i, 40, 1);
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++)
			PREFILL_BOTH(&p, &ts[i], l);
	}
	sync_both(&p);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < BURST; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			CHECK_SELECTION(&p, &ts[i], l);
			any_tie |= ts[i].tie[l];
			snap[i][l] = SNAPSHOT(&p, p.c, &ts[i], l, &snap_b[i][l]);
		}

	for (int round = 0; round < 2; round++) {
		set_ctx("resume burst: round %d: preempt and resume", round);
		s0 = t_stats_of(p.c);
		preempt_resume(&p, ts, BURST, nb);
		s1 = t_stats_of(p.c);
		CHECK_EQ(s1.h2d_kernel_launches - s0.h2d_kernel_launches, BURST);
		CHECK_EQ(s1.h2d_dma_batches, s0.h2d_dma_batches);
		/* attention needs the frames the queued gathers write: it waits for them */
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_RC(kvt_attend(p.c, ts[BURST - 1].id, l, ts[BURST - 1].q_att[l],
					    early[l]),
				 0);
		CHECK_RC(kvt_manager_sync(p.c, nb), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			float o[N_Q * HEAD_DIM];

			CHECK_ATTEND(&p, &ts[BURST - 1], l, o);
			expect_close_at(early[l], o,
					"cuda kvt_attend before the wait vs after the wait",
					&ts[BURST - 1], l, __FILE__, __LINE__);
		}

		set_ctx("resume burst: round %d: after the wait", round);
		for (uint32_t i = 0; i < BURST; i++)
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				expect_frames_as_at(&p, &ts[i], l, snap[i][l], snap_b[i][l],
						    "cuda after a burst of resumes", __FILE__,
						    __LINE__);
				CHECK_FRAMES(&p, &ts[i], l);
				CHECK_TOKENS(&p, &ts[i], l, true);
			}
		COMPARE_STATS(&p, any_tie);
	}

	/* Half of them resumed and destroyed at once, their resumes still queued; new sequences
	   then take their frames and host blocks (the prefills' saves write those blocks on the
	   host, their frames are written on another stream): destroy must let the queued gathers
	   land first. The new sequences and the other half: as they should be. */
	set_ctx("resume burst: destroyed while resuming");
	preempt_resume(&p, ts, BURST / 2, nb);
	for (uint32_t i = 0; i < BURST / 2; i++) {
		CHECK_RC(kvt_seq_destroy(p.h, ts[i].id), 0);
		CHECK_RC(kvt_seq_destroy(p.c, ts[i].id), 0);
		tseq_free(&ts[i]);
		tseq_gen(&ts[i], &p.cfg, 0xb0257100ull + i, 40, 1);
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++)
			PREFILL_BOTH(&p, &ts[i], l);
	}
	CHECK_RC(kvt_manager_sync(p.c, nb), 0);
	sync_both(&p);
	for (uint32_t i = 0; i < BURST; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			if (i >= BURST / 2)
				expect_frames_as_at(&p, &ts[i], l, snap[i][l], snap_b[i][l],
						    "cuda beside destroyed sequences", __FILE__,
						    __LINE__);
			CHECK_RESIDENT(&p, &ts[i], l);
			CHECK_FRAMES(&p, &ts[i], l);
			CHECK_TOKENS(&p, &ts[i], l, true);
		}
	COMPARE_STATS(&p, any_tie);
	for (uint32_t i = 0; i < BURST; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			free(snap[i][l]);

	for (uint32_t i = 0; i < BURST; i++)
		tseq_free(&ts[i]);
	free(ts);
	pair_fini(&p);
	CUDA_OK(cudaStreamDestroy(nb));
	g_ctx[0] = '\0';
}

/* ---- saves off the caller's stream ------------------------------------------------------------
 */

/* Decode steps whose saves the caller never waits for on its stream: after each append the
   test synchronizes the caller's (non-blocking) stream alone, where the fixture has already
   garbled the inputs, so a save whose device-to-host copy (on the backend's side stream) read
   the caller's tensors rather than the library's device staging buffer would store garbage
   (the asynchronous fake runs that copy only when a wait needs it: deterministically after
   the garbling). Every other step orders the caller's stream after the saves through
   kvt_manager_save_event, as an engine's wait_for_save would. Then every row of the history
   equals the host manager's. */
void test_save_side_stream(void **state)
{
	cudaStream_t nb;
	cudaEvent_t ev;
	struct pair p;
	struct tseq ts[2];
	struct tseq *bt[2] = {&ts[0], &ts[1]};

	(void)state;
	set_ctx("save side stream: setup");
	CUDA_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	CUDA_OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
	pair_init(&p, KVT_DTYPE_F16, nb, 1500, 2);
	tseq_gen(&ts[0], &p.cfg, 0x5a7e0001ull, 1500, 24);
	tseq_gen(&ts[1], &p.cfg, 0x5a7e0002ull, 40, 24);
	for (uint32_t i = 0; i < 2; i++) {
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			PREFILL_BOTH(&p, &ts[i], l);
			/* the fixture's next inputs go in with a blocking copy */
			CUDA_OK(cudaStreamSynchronize(nb));
		}
	}
	sync_both(&p);
	for (uint32_t i = 0; i < 2; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_SELECTION(&p, &ts[i], l); /* what the reference expects resident */

	CHECK_RC(kvt_manager_save_event(NULL, ev), -EINVAL);
	CHECK_RC(kvt_manager_save_event(p.c, NULL), -EINVAL);
	CHECK_RC(kvt_manager_save_event(p.h, ev), -ENOTSUP);
	for (uint32_t step = 0; step < 20; step++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			set_ctx("save side stream: step %u layer %u", step, l);
			DECODE_BOTH(&p, bt, 2, l);
			if (step % 2) {
				CHECK_RC(kvt_manager_save_event(p.c, ev), 0);
				CUDA_OK(cudaStreamWaitEvent(nb, ev, 0));
			}
			CUDA_OK(cudaStreamSynchronize(nb));
		}
	CHECK_RC(kvt_manager_save_event(p.c, ev), 0);
	CUDA_OK(cudaEventSynchronize(ev));
	set_ctx("save side stream: after decode");
	CHECK_ALL(&p, ts, 2, ts[0].tie[0] || ts[0].tie[1]);

	tseq_free(&ts[0]);
	tseq_free(&ts[1]);
	pair_fini(&p);
	CUDA_OK(cudaEventDestroy(ev));
	CUDA_OK(cudaStreamDestroy(nb));
	g_ctx[0] = '\0';
}

/* ---- the attention tables' read-back: one wait per call ---------------------------------------
 */

/* With the regions on the device, every member of a step whose views the device changed must
   be read back before its tables are written: kvt_step_tables reads them all in one go (one
   wait for the device, one gather into pinned memory), not one device-wide wait and two
   blocking copies per region. The emulated runtime counts the waits; the tables read back
   name every member's recalled blocks. */
void test_tables_one_wait(void **state)
{
	enum { NS = 4, MF = 256 };
	struct pair p;
	struct tseq ts[NS];
	struct tseq *bt[NS];
	uint64_t ids[NS], w0, t0, dw, tw;
	uint32_t rows = NS * N_KV, nb = 0, nr[NS * N_KV], *d[5];
	struct kvt_attn_tables t = {.size = sizeof(t), .max_batch = NS, .max_frames = MF};
	uint64_t *skip;

	(void)state;
	set_ctx("tables one wait: setup");
	pair_init(&p, KVT_DTYPE_F16, NULL, 1500, NS);
	t.max_recall = p.cfg.recall_blocks;
	for (uint32_t i = 0; i < NS; i++) {
		tseq_gen(&ts[i], &p.cfg, 0x7ab1e0001ull + i, 1500 - 200 * i, 8);
		bt[i] = &ts[i];
		ids[i] = ts[i].id;
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++)
			PREFILL_BOTH(&p, &ts[i], l);
	}
	sync_both(&p);
	for (uint32_t i = 0; i < NS; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_SELECTION(&p, &ts[i], l);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		DECODE_BOTH(&p, bt, NS, l);
		RECALL_BOTH(&p, bt, NS, l);
	}
	d[0] = dev_alloc(4);
	d[1] = dev_alloc(rows * 4);
	d[2] = dev_alloc((size_t)rows * MF * 4);
	d[3] = dev_alloc(rows * 4);
	d[4] = dev_alloc((size_t)rows * t.max_recall * 4);
	t.n_batch = d[0];
	t.n_tokens = d[1];
	t.frames = d[2];
	t.n_recall = d[3];
	t.recall = d[4];
	t.recall_tokens = dev_alloc((size_t)rows * t.max_recall * 4);
	skip = dev_alloc((size_t)rows * t.max_recall * 8);
	t.recall_skip = skip;

	set_ctx("tables one wait: step");
	CHECK_RC(kvt_step_begin(p.c, ids, NS), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		w0 = DEVICE_WAITS();
		t0 = THREAD_WAITS();
		CHECK_RC(kvt_step_tables(p.c, l, &t, NULL), 0);
		dw = DEVICE_WAITS() - w0;
		tw = THREAD_WAITS() - t0;
#ifdef KVT_TEST_EMULATED
		if (p.c->dev_regions) {
			CHECK_EQ(dw, 1); /* the read-back of all NS regions */
			assert_true(tw <= 3);
		}
#else
		(void)dw;
		(void)tw;
#endif
		/* nothing changed since: no read-back at all */
		w0 = DEVICE_WAITS();
		CHECK_RC(kvt_step_tables(p.c, l, &t, NULL), 0);
		CHECK_EQ(DEVICE_WAITS() - w0, 0);
		CUDA_OK(cudaMemcpy(&nb, t.n_batch, 4, cudaMemcpyDeviceToHost));
		CUDA_OK(cudaMemcpy(nr, t.n_recall, sizeof(nr), cudaMemcpyDeviceToHost));
		CHECK_EQ(nb, NS);
		for (uint32_t i = 0; i < NS; i++) {
			struct kvt_recall_ref ref[64];
			uint32_t nv = 0;

			for (uint32_t h = 0; h < N_KV; h++) {
				CHECK_RC(kvt_seq_recall_view(p.c, ids[i], l, h, ref, 64, &nv), 0);
				CHECK_EQ(nr[i * N_KV + h], nv);
			}
		}
	}
	CHECK_RC(kvt_step_end(p.c), 0);

	for (int i = 0; i < 5; i++)
		dev_free(d[i]);
	dev_free(t.recall_tokens);
	dev_free(skip);
	for (uint32_t i = 0; i < NS; i++)
		tseq_free(&ts[i]);
	pair_fini(&p);
	g_ctx[0] = '\0';
}

/* ---- a region's tables grown on one stream while another stream's program drops from them --- */

/* (seq, layer)'s recall state on m, as the host keeps it (nothing read back). */
static struct kvt_recall_layer *rc_of(struct kvt_manager *m, uint64_t seq, uint32_t layer)
{
	struct kvt_seq *s = kvt_seqmap_get(&m->seqs, seq);

	assert_non_null(s);
	return s->layers[layer].rc;
}

/* kvt_recall_blocks of one sequence ([N_KV][r] blocks) on both managers, the CUDA one's on
   stream st. */
static void recall_given(struct pair *p, uint64_t id, uint32_t layer, const uint32_t *sel,
			 uint32_t r, cudaStream_t st)
{
	CHECK_RC(kvt_recall_blocks(p->h, layer, &id, 1, sel, r, NULL), 0);
	CHECK_RC(kvt_recall_blocks(p->c, layer, &id, 1, sel, r, st), 0);
}

/* Both managers' views of (id, layer) read alike (the same error, or the same blocks), and the
   CUDA manager's frames hold what the host manager's do. Returns the last head's error (0). */
static int same_views(struct pair *p, uint64_t id, uint32_t layer)
{
	int got = 0;

	for (uint32_t h = 0; h < N_KV; h++) {
		struct kvt_recall_ref rv[2][VIEW_CAP];
		uint32_t nv[2];
		int rc[2];

		for (int s = 0; s < 2; s++)
			rc[s] = kvt_seq_recall_view(s ? p->c : p->h, id, layer, h, rv[s], VIEW_CAP,
						    &nv[s]);
		CHECK_EQ(rc[1], rc[0]);
		CHECK_EQ(nv[1], nv[0]);
		got = rc[0];
		if (rc[0])
			continue;
		for (uint32_t i = 0; i < nv[0]; i++) {
			uint8_t fh[2 * BT * ROW_MAX], fc[2 * BT * ROW_MAX];

			CHECK_EQ(rv[1][i].block, rv[0][i].block);
			CHECK_EQ(rv[1][i].n_valid, rv[0][i].n_valid);
			addr_get(fh, rv[0][i].frame, p->block_bytes, false);
			addr_get(fc, rv[1][i].frame, p->block_bytes, true);
			if (memcmp(fh, fc, p->block_bytes))
				fail_msg("seq %llu layer %u head %u: the frame of block %u differs",
					 ULL(id), layer, h, rv[0][i].block);
		}
	}
	return got;
}

/* A pair for sequences of up to max_L tokens whose recall cache holds 8 frames (one call of
   layer 0 below fills it). */
static void pair_init_8(struct pair *p, uint32_t max_L)
{
	struct kvt_config cc;

	pair_init(p, KVT_DTYPE_BF16, NULL, max_L, 1);
	kvt_manager_destroy(p->h);
	kvt_manager_destroy(p->c);
	p->cfg.recall_cache_bytes = 8 * p->block_bytes;
	cc = p->cfg;
	cc.backend = KVT_BACKEND_CUDA;
	p->h = t_mk(&p->cfg);
	p->c = t_mk(&cc);
}

/* The selections of those tests: s0 fills the 8 frames (4 blocks on each of 2 heads), s1
   asks for 4 other blocks on the first head. */
static void sel_8(uint32_t *s0, uint32_t *s1)
{
	for (uint32_t j = 0; j < R_BLOCKS; j++) {
		s0[j] = 20 + j;
		s0[R_BLOCKS + j] = 24 + j;
		s1[j] = 30 + j;
		s1[R_BLOCKS + j] = KVT_NO_ENTRY;
	}
}

/* A recall program of one layer may take frames from a region of another layer (the sizing's
   reclaim, or its sweep), and forgets their blocks in that region's key table on the device. A
   decode append of that other layer whose token starts a block past its device tables moves
   them to larger ones, copied on the append's stream. The copy must come after the drops, and
   a later program after the copy, whatever the streams: here each call has its own
   non-blocking stream, and nothing waits for the program's stream until the copy has run. */
void test_tables_grow_across_streams(void **state)
{
	enum { L = 64 * BT }; /* the device tables hold exactly its 64 blocks */
	cudaStream_t sa, sb, own;
	struct pair p;
	struct tseq ts, ty, *bt[1] = {&ts}, *by[1] = {&ty};
	uint32_t s0[N_KV * R_BLOCKS], s1[N_KV * R_BLOCKS], sw[N_KV * 2 * R_BLOCKS], dvcap;
	uint64_t w0, m0;

	(void)state;
	set_ctx("tables grow across streams: setup");
	pair_init_8(&p, L + 8);
	own = p.stream;
	CUDA_OK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
	CUDA_OK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
	tseq_gen(&ts, &p.cfg, 0x57a3e0001ull, L, 8);
	tseq_gen(&ty, &p.cfg, 0x57a3e0002ull, L - BT, 2 * BT); /* a block short of a growth */
	CHECK_RC(kvt_seq_create(p.h, ts.id, ts.L), 0);
	CHECK_RC(kvt_seq_create(p.c, ts.id, ts.L), 0);
	CHECK_RC(kvt_seq_create(p.h, ty.id, ty.L), 0);
	CHECK_RC(kvt_seq_create(p.c, ty.id, ty.L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		PREFILL_BOTH(&p, &ts, l);
		PREFILL_BOTH(&p, &ty, l);
	}
	sync_both(&p);
	sel_8(s0, s1);

	set_ctx("tables grow across streams: layer 0 takes the cache");
	recall_given(&p, ts.id, 0, s0, R_BLOCKS, sb);
	sync_both(&p);
	CHECK_EQ(rc_of(p.h, ts.id, 0)->rg.n_slots, 8);

	set_ctx("tables grow across streams: layer 1 takes 4 of layer 0's frames, on stream B");
	recall_given(&p, ts.id, 1, s1, R_BLOCKS, sb);
	CHECK_EQ(rc_of(p.h, ts.id, 0)->rg.n_slots, 4);
	CHECK_EQ(rc_of(p.c, ts.id, 0)->rg.n_slots, 4); /* the sizing's count, on the host */

	set_ctx("tables grow across streams: layer 0's next token, on stream A");
	if (p.c->dev_regions)
		CHECK_EQ(rc_of(p.c, ts.id, 0)->dcap, 64);
	p.stream = sa;
	DECODE_BOTH(&p, bt, 1, 0);
	if (p.c->dev_regions)
		CHECK_EQ(rc_of(p.c, ts.id, 0)->dcap, 128);
	/* stream A's work first (the asynchronous fake runs work only when a wait needs it), then
	   the program on B, which the settling waits for */
	CHECK_RC(kvt_manager_sync(p.c, sa), 0);
	CHECK_RC(kvt_recall_check(p.c), 0);
	CHECK_RC(kvt_recall_check(p.h), 0);

	set_ctx("tables grow across streams: layer 0 again, on stream A");
	recall_given(&p, ts.id, 0, s0, R_BLOCKS, sa);
	CHECK_RC(kvt_manager_sync(p.c, sa), 0);
	sync_both(&p);
	CHECK_RC(kvt_recall_check(p.c), 0);
	same_views(&p, ts.id, 0);
	CHECK_EQ(same_views(&p, ts.id, 1), -ESTALE); /* layer 0 took its frames back */
	COMPARE_STATS(&p, false);

	/* The same with a region's slots and view: layer 0 recalls with twice the entries a
	   head, so its region's device table grows in the call, copied on the call's stream,
	   without waiting for the program before (which dropped from it). */
	set_ctx("tables grow across streams: layer 1 takes 4 of layer 0's frames again, on B");
	recall_given(&p, ts.id, 1, s1, R_BLOCKS, sb);
	CHECK_EQ(rc_of(p.c, ts.id, 0)->rg.n_slots, 4);
	set_ctx("tables grow across streams: layer 0 with twice the entries, on stream A");
	for (uint32_t h = 0; h < N_KV; h++)
		for (uint32_t j = 0; j < 2 * R_BLOCKS; j++)
			sw[h * 2 * R_BLOCKS + j] =
				j < R_BLOCKS ? s0[h * R_BLOCKS + j] : KVT_NO_ENTRY;
	dvcap = p.c->dev_regions ? rc_of(p.c, ts.id, 0)->dvcap : 0;
	w0 = DEVICE_WAITS();
	m0 = MALLOCS();
	recall_given(&p, ts.id, 0, sw, 2 * R_BLOCKS, sa);
	/* the growth is ordered on the device, its table from the pool */
	CHECK_EQ(DEVICE_WAITS() - w0, 0);
	CHECK_EQ(MALLOCS() - m0, 0);
	if (p.c->dev_regions) {
		CHECK_EQ(dvcap, R_BLOCKS);
		CHECK_EQ(rc_of(p.c, ts.id, 0)->dvcap, 2 * R_BLOCKS);
	}
	CHECK_RC(kvt_manager_sync(p.c, sa), 0);
	sync_both(&p);
	CHECK_RC(kvt_recall_check(p.c), 0);
	CHECK_RC(kvt_recall_check(p.h), 0);
	same_views(&p, ts.id, 0);
	COMPARE_STATS(&p, false);

	/* And the other way round: an append's growth, then a program on another stream that
	   drops from the new tables, before the test waits for the append's stream. (The fake
	   runs the append's stream's work when the append's save waits for its rows, before the
	   program is queued: this holds the outcome, and cannot tell whether the program is
	   fenced behind the copy, which a GPU needs when that stream is busy.) */
	set_ctx("tables grow across streams: the second sequence's layer 0 takes the cache");
	recall_given(&p, ty.id, 0, s0, R_BLOCKS, sa);
	for (uint32_t t = 0; t < BT; t++) /* the last token of its last block */
		DECODE_BOTH(&p, by, 1, 0);
	CHECK_RC(kvt_manager_sync(p.c, sa), 0);
	sync_both(&p);
	CHECK_EQ(rc_of(p.c, ty.id, 0)->rg.n_slots, 8);
	set_ctx("tables grow across streams: its next token starts a block, on stream A");
	if (p.c->dev_regions)
		CHECK_EQ(rc_of(p.c, ty.id, 0)->dcap, 64);
	m0 = MALLOCS();
	DECODE_BOTH(&p, by, 1, 0);
	CHECK_EQ(MALLOCS() - m0, 0); /* the larger tables come from the backend's pool */
	if (p.c->dev_regions)
		CHECK_EQ(rc_of(p.c, ty.id, 0)->dcap, 128);
	set_ctx("tables grow across streams: its layer 1 takes 4 of layer 0's frames, on B");
	recall_given(&p, ty.id, 1, s1, R_BLOCKS, sb);
	CHECK_EQ(rc_of(p.c, ty.id, 0)->rg.n_slots, 4);
	/* stream B's work (and what it waits for), not A's */
	CHECK_RC(kvt_manager_sync(p.c, sb), 0);
	CHECK_RC(kvt_recall_check(p.c), 0);
	CHECK_RC(kvt_manager_sync(p.c, sa), 0);
	sync_both(&p);
	CHECK_RC(kvt_recall_check(p.c), 0);
	CHECK_RC(kvt_recall_check(p.h), 0);
	same_views(&p, ty.id, 0);
	same_views(&p, ty.id, 1);
	COMPARE_STATS(&p, false);

	p.stream = own;
	tseq_free(&ts);
	tseq_free(&ty);
	pair_fini(&p);
	CUDA_OK(cudaStreamDestroy(sa));
	CUDA_OK(cudaStreamDestroy(sb));
	g_ctx[0] = '\0';
}

/* The backend orders a program after the one before unless both come on the same stream: the
   same stream, not the same handle. A stream made after another was destroyed may get its
   handle (the C library hands the freed memory back: so does the fake's), and a program on it
   must still wait for the one queued on the stream destroyed, whose work goes on. (Neither is
   cudaStreamPerThread one stream: each thread has its own.) Here layer 0's program fills the
   cache on stream A, A is destroyed with it still queued, and layer 1's program, on a new
   stream B, takes half of layer 0's frames. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define T_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define T_SANITIZED 1
#endif
#endif
#ifndef T_SANITIZED
#define T_SANITIZED 0
#endif

void test_program_after_stream_reused(void **state)
{
	enum { L = 64 * BT };
	cudaStream_t sa, sb;
	const void *was;
	struct pair p;
	struct tseq ts;
	uint32_t s0[N_KV * R_BLOCKS], s1[N_KV * R_BLOCKS];

	(void)state;
	set_ctx("program after a stream reused: setup");
	pair_init_8(&p, L + 8);
	tseq_gen(&ts, &p.cfg, 0x57a3e0003ull, L, 8);
	CHECK_RC(kvt_seq_create(p.h, ts.id, ts.L), 0);
	CHECK_RC(kvt_seq_create(p.c, ts.id, ts.L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		PREFILL_BOTH(&p, &ts, l);
	sync_both(&p);
	sel_8(s0, s1);

	set_ctx("program after a stream reused: layer 0 takes the cache on stream A");
	CUDA_OK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
	recall_given(&p, ts.id, 0, s0, R_BLOCKS, sa);
	CHECK_EQ(rc_of(p.c, ts.id, 0)->rg.n_slots, 8);
	was = sa;
	CUDA_OK(cudaStreamDestroy(sa)); /* its work stays queued */
	CUDA_OK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
	if (!T_SANITIZED) /* (the sanitizers' allocators hold freed memory back) */
		CHECK_EQ(sb == was, true);

	set_ctx("program after a stream reused: layer 1 takes 4 of its frames on stream B");
	recall_given(&p, ts.id, 1, s1, R_BLOCKS, sb);
	CHECK_EQ(rc_of(p.c, ts.id, 0)->rg.n_slots, 4);
	/* stream B's work and what it waits for: the asynchronous fake runs work only when a
	   wait needs it, so without the wait for layer 0's program, B's ran first */
	CHECK_RC(kvt_manager_sync(p.c, sb), 0);
	CHECK_RC(kvt_recall_check(p.c), 0);
	sync_both(&p);
	CHECK_RC(kvt_recall_check(p.c), 0);
	CHECK_RC(kvt_recall_check(p.h), 0);
	same_views(&p, ts.id, 0);
	same_views(&p, ts.id, 1);
	COMPARE_STATS(&p, false);

	tseq_free(&ts);
	pair_fini(&p);
	CUDA_OK(cudaStreamDestroy(sb));
	g_ctx[0] = '\0';
}

/* Device timing is a sample (kvtier.h: one call of a layer in KVTIER_RECALL_TIME_EVERY): the
   calls of layer l whose count k (from 1) has k + l a multiple of it are timed, and only
   those; 0 times none; a value that is not a count is ignored (logged): 16. The decisions do
   not depend on it (COMPARE_STATS). */
void test_device_time_sample(void **state)
{
	enum { NS = 3, STEPS = 15 };
	static const char *const every[] = {"3", "0", "-2"};
	static const uint32_t period[] = {3, 0, 16};
	struct pair p;
	struct tseq ts[NS];
	struct tseq *bt[NS];

	(void)state;
	for (uint32_t v = 0; v < 3; v++) {
		struct kvt_stats st = KVT_STATS_INIT;
		uint64_t want = 0;

		set_ctx("device time sample: KVTIER_RECALL_TIME_EVERY=%s", every[v]);
		assert_int_equal(setenv("KVTIER_RECALL_TIME_EVERY", every[v], 1), 0);
		pair_init(&p, KVT_DTYPE_F16, NULL, 1200, NS);
		assert_int_equal(setenv("KVTIER_RECALL_TIME_EVERY", "1", 1), 0);
		for (uint32_t i = 0; i < NS; i++) {
			tseq_gen(&ts[i], &p.cfg, 0x71e5a0001ull + i, 1200 - 150 * i, STEPS);
			bt[i] = &ts[i];
			CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
			CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
			for (uint32_t l = 0; l < N_LAYERS; l++)
				PREFILL_BOTH(&p, &ts[i], l);
		}
		sync_both(&p);
		for (uint32_t k = 1; k <= STEPS; k++)
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				DECODE_BOTH(&p, bt, NS, l);
				CHECK_RC(recall_on(&p, p.h, bt, NS, l), 0);
				CHECK_RC(recall_on(&p, p.c, bt, NS, l), 0);
				want += period[v] && (k + l) % period[v] == 0;
			}
		CHECK_RC(kvt_manager_stats(p.c, &st), 0);
		if (p.c->dev_regions) {
			CHECK_EQ(st.recall_device_timed, want);
			CHECK_EQ(st.recall_device_ns > 0, want > 0);
		} else {
			CHECK_EQ(st.recall_device_timed, 0);
			CHECK_EQ(st.recall_device_ns, 0);
		}
		COMPARE_STATS(&p, false);
		for (uint32_t i = 0; i < NS; i++)
			tseq_free(&ts[i]);
		pair_fini(&p);
	}
	g_ctx[0] = '\0';
}
