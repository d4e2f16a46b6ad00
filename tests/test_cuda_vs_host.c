/* SPDX-License-Identifier: MIT */
/*
 * cuda: the backend choice, and the CUDA backend against the host backend on the same prompts
 * (every dtype, a long prompt, a prompt at kvtier's scale).
 */
#include "test_cuda.h"

/* ---- the backend choice ------------------------------------------------------------------ */

void test_backend_choice(void **state)
{
	static const enum kvt_backend asked[] = {KVT_BACKEND_AUTO, KVT_BACKEND_CUDA};

	(void)state;
	for (int i = 0; i < 2; i++) {
		struct kvt_config c = suite_config(KVT_DTYPE_BF16, asked[i]), got;
		struct kvt_manager *m = t_mk(&c);
		struct kvt_stats st = t_stats_of(m);

		set_ctx("backend %s", i ? "CUDA" : "AUTO");
		CHECK_RC(kvt_manager_config(m, &got), 0);
		CHECK_EQ(got.backend, KVT_BACKEND_CUDA);
		CHECK_EQ(got.n_layers, c.n_layers);
		CHECK_EQ(got.n_kv_heads, c.n_kv_heads);
		CHECK_EQ(got.head_dim, c.head_dim);
		CHECK_EQ(got.dtype, c.dtype);
		CHECK_EQ(got.recall_blocks, c.recall_blocks);
		assert_string_equal(kvt_manager_last_error(m), "");
		CHECK_XFER(&st);
		/* the calibration's own transfers are no loads of this manager */
		CHECK_EQ(st.h2d_kernel_launches, 0);
		CHECK_EQ(st.h2d_dma_batches, 0);
		CHECK_EQ(st.device_frames_used, 0);
		kvt_manager_destroy(m);
	}
	g_ctx[0] = '\0';
}

/* ---- the CUDA backend against the host backend --------------------------------------------- */

void print_margin(enum kvt_dtype dt)
{
	if (g_margin.gap < INFINITY)
		print_message("# %s: smallest relative gap of pooled scores at the top-K cutoff: "
			      "%.3g (seq %llu layer %u head %u)\n",
			      t_dt_name(dt), g_margin.gap, ULL(g_margin.seq), g_margin.layer,
			      g_margin.head);
}

/* Checks 2 and 3 (and resident positions) for every sequence and layer, and the counters. */
void check_all_at(struct pair *p, struct tseq *ts, uint32_t n, bool any_tie, const char *file,
		  int line)
{
	sync_both(p);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			check_resident_at(p, &ts[i], l, file, line);
			check_tokens_at(p, &ts[i], l, true, file, line);
			check_frames_at(p, &ts[i], l, file, line);
		}
	compare_stats_at(p, any_tie, file, line);
}

static void run_vs_host(enum kvt_dtype dt)
{
	/* 50 <= sink + recent: Case 1; 1010 tokens fill 64 blocks, so that decoding outgrows the
	   block tables sized at prefill (the CUDA backend's device metadata is copied into a
	   larger one before the recalls score it) */
	static const uint32_t lens[3] = {1010, 1500, 50};
	const char *dn = t_dt_name(dt);
	struct pair p;
	struct tseq ts[3];
	struct tseq *all[3], *rev[3], *pr[2];
	float before[2][N_LAYERS][N_Q * HEAD_DIM];
	bool any_tie = false;
	struct kvt_stats sc, sh;

	set_ctx("%s: setup", dn);
	pair_init(&p, dt, NULL, 1500, 3);
	for (uint32_t i = 0; i < 3; i++) {
		tseq_gen(&ts[i], &p.cfg, 0x7e57000000ull + ((uint64_t)dt << 8) + i, lens[i],
			 DECODE_STEPS + 8);
		all[i] = &ts[i];
		rev[2 - i] = &ts[i];
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
	}
	assert_int_equal(ts[2].count, 0);
	assert_true(ts[0].count > 0 && ts[1].count > 0);

	/* 1-3. prefill every layer (layer 1 first), then positions, tokens, frames, counters */
	set_ctx("%s: prefill", dn);
	for (uint32_t l = N_LAYERS; l-- > 0;)
		for (uint32_t i = 0; i < 3; i++)
			PREFILL_BOTH(&p, &ts[i], l);
	sync_both(&p);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			CHECK_SELECTION(&p, &ts[i], l);
			any_tie |= ts[i].tie[l];
		}
	print_margin(dt);
	CHECK_ALL(&p, ts, 3, any_tie);
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_ATTEND(&p, &ts[i], l, NULL); /* resident sets only */

	/* 4. decode: layer 0 in one order, layer 1 in the other; checked across the first
	   block boundaries (the Case-1 sequence not yet wrapped) and after every ring wrapped */
	for (uint32_t step = 0; step < DECODE_STEPS; step++) {
		set_ctx("%s: decode step %u", dn, step);
		DECODE_BOTH(&p, all, 3, 0);
		DECODE_BOTH(&p, rev, 3, 1);
		if (step + 1 == 9 || step + 1 == DECODE_STEPS)
			CHECK_ALL(&p, ts, 3, any_tie);
	}

	/* 5. recall every sequence on each layer, same queries */
	set_ctx("%s: recall", dn);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		RECALL_BOTH(&p, all, 3, l);
	sync_both(&p);
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_VIEWS(&p, &ts[i], l);
	sh = t_stats_of(p.h);
	if (sh.recall_loads == 0)
		fail_at(__FILE__, __LINE__, "%s: the recalls loaded no block", dn);

	/* 6. attention over resident sets plus recalled blocks */
	set_ctx("%s: attend", dn);
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_ATTEND(&p, &ts[i], l, i == 1 ? NULL : before[i / 2][l]);
	COMPARE_STATS(&p, any_tie);

	/* 7. preempt two sequences and resume them: frames bit for bit as before */
	set_ctx("%s: preempt and resume", dn);
	pr[0] = &ts[0];
	pr[1] = &ts[2];
	{
		uint8_t *snap[2][N_LAYERS];
		size_t snap_b[2][N_LAYERS];

		for (uint32_t j = 0; j < 2; j++)
			for (uint32_t l = 0; l < N_LAYERS; l++)
				snap[j][l] = SNAPSHOT(&p, p.c, pr[j], l, &snap_b[j][l]);
		for (uint32_t j = 0; j < 2; j++) {
			uint64_t fr[FRAME_CAP];
			uint32_t nf, ns;
			float o[N_Q * HEAD_DIM];

			for (int s = 0; s < 2; s++) {
				struct kvt_manager *m = s ? p.c : p.h;
				struct kvt_seq_info in;

				CHECK_RC(kvt_seq_preempt(m, pr[j]->id), 0);
				CHECK_RC(kvt_seq_preempt(m, pr[j]->id), -EALREADY);
				in = t_info_of(m, pr[j]->id);
				CHECK_EQ(in.preempted, 1);
				CHECK_EQ(in.device_frames, 0);
				CHECK_EQ(in.layers_prefilled, N_LAYERS);
				CHECK_RC(
					kvt_seq_frames(m, pr[j]->id, 0, 0, fr, FRAME_CAP, &nf, &ns),
					-EINVAL);
				CHECK_RC(kvt_attend(m, pr[j]->id, 0, pr[j]->q_att[0], o), -EINVAL);
			}
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				pr[j]->recalled[l] = false;
				/* every token now from the host history */
				CHECK_TOKENS(&p, pr[j], l, true);
			}
		}
		/* the sequence left running keeps its frames */
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_FRAMES(&p, &ts[1], l);
		for (uint32_t j = 0; j < 2; j++) {
			struct kvt_stats s0 = t_stats_of(p.c), s1;
			uint64_t gathers, w0;

			CHECK_RC(kvt_seq_resume(p.h, pr[j]->id, NULL), 0);
			w0 = DEVICE_WAITS();
			CHECK_RC(kvt_seq_resume(p.c, pr[j]->id, p.stream), 0);
			no_device_wait(w0, 0, "resume", pr[j]->id, UINT32_MAX);
			s1 = t_stats_of(p.c);
			gathers = s1.h2d_kernel_launches + s1.h2d_dma_batches -
				  (s0.h2d_kernel_launches + s0.h2d_dma_batches);
			if (gathers != 1)
				fail_at(__FILE__, __LINE__,
					"cuda: resume of seq %llu ran %llu gathers (kvtier.h: one)",
					ULL(pr[j]->id), ULL(gathers));
			CHECK_RC(kvt_seq_resume(p.h, pr[j]->id, NULL), -EALREADY);
			CHECK_RC(kvt_seq_resume(p.c, pr[j]->id, p.stream), -EALREADY);
		}
		sync_both(&p);
		for (uint32_t j = 0; j < 2; j++)
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				expect_frames_as_at(&p, pr[j], l, snap[j][l], snap_b[j][l],
						    "cuda after preempt + resume", __FILE__,
						    __LINE__);
				free(snap[j][l]);
				CHECK_EQ(t_info_of(p.c, pr[j]->id).preempted, 0);
				CHECK_RESIDENT(&p, pr[j], l);
				CHECK_FRAMES(&p, pr[j], l);
				CHECK_TOKENS(&p, pr[j], l, true);
				CHECK_VIEWS(&p, pr[j], l);	  /* forgotten: none */
				CHECK_ATTEND(&p, pr[j], l, NULL); /* resident sets only */
			}
		/* recalled again with the same queries: the same attention as before */
		for (uint32_t l = 0; l < N_LAYERS; l++)
			RECALL_BOTH(&p, pr, 2, l);
		sync_both(&p);
		for (uint32_t j = 0; j < 2; j++)
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				float o[N_Q * HEAD_DIM];

				CHECK_VIEWS(&p, pr[j], l);
				CHECK_ATTEND(&p, pr[j], l, o);
				expect_close_at(
					o, before[j][l],
					"cuda kvt_attend after preempt + resume + recall vs "
					"before",
					pr[j], l, __FILE__, __LINE__);
			}
	}

	/* 8. counters */
	set_ctx("%s: stats", dn);
	COMPARE_STATS(&p, any_tie);
	sc = t_stats_of(p.c);
	CHECK_XFER(&sc);
	if (sc.h2d_kernel_launches + sc.h2d_dma_batches == 0)
		fail_at(__FILE__, __LINE__, "cuda: no gather counted after the recalls");
	print_message("# %s: %llu recall loads; gathers: %llu kernel, %llu DMA; gather_min "
		      "%u/%u/%u\n",
		      dn, ULL(sc.recall_loads), ULL(sc.h2d_kernel_launches),
		      ULL(sc.h2d_dma_batches), sc.xfer_gather_min_4k, sc.xfer_gather_min_16k,
		      sc.xfer_gather_min_64k);
	for (uint32_t i = 0; i < 3; i++)
		tseq_free(&ts[i]);
	pair_fini(&p);
	g_ctx[0] = '\0';
}

void test_vs_host_f32(void **state)
{
	(void)state;
	run_vs_host(KVT_DTYPE_F32);
}

void test_vs_host_f16(void **state)
{
	(void)state;
	run_vs_host(KVT_DTYPE_F16);
}

void test_vs_host_bf16(void **state)
{
	(void)state;
	run_vs_host(KVT_DTYPE_BF16);
}

/* ---- a long prompt --------------------------------------------------------------------------- */

#define LONG_L 20000

/* Prompts of the given lengths (at most 3), one sequence each, prefilled layer by layer on a
   pair of bf16 managers with host budget host_bytes (0: the suite's), each layer's selection
   checked right after its prefill; then tokens, frames and counters as on the host. */
static void prompts_vs_host(const char *what, const uint32_t *lens, uint32_t n, uint64_t id0,
			    uint64_t host_bytes)
{
	struct tseq ts[3];
	bool any_tie = false;
	uint32_t max_L = 0;
	struct pair p;

	assert_true(n <= 3);
	for (uint32_t i = 0; i < n; i++)
		max_L = lens[i] > max_L ? lens[i] : max_L;
	set_ctx("%s: setup", what);
	pair_init_host(&p, KVT_DTYPE_BF16, NULL, max_L, 1, host_bytes);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < n; i++) {
		tseq_gen(&ts[i], &p.cfg, id0 + i, lens[i], 1);
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		set_ctx("%s: prefill of %u tokens", what, lens[i]);
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			PREFILL_BOTH(&p, &ts[i], l);
			sync_both(&p);
			CHECK_SELECTION(&p, &ts[i], l);
			any_tie = any_tie || ts[i].tie[l];
		}
	}
	print_margin(KVT_DTYPE_BF16);
	set_ctx("%s: after the prefills", what);
	CHECK_ALL(&p, ts, n, any_tie);
	for (uint32_t i = 0; i < n; i++)
		tseq_free(&ts[i]);
	pair_fini(&p);
	g_ctx[0] = '\0';
}

/* A prompt long enough that SnapKV's device scratch outgrows what the short prompts before it
   left (the backend allocates a larger one, without a wait for the whole device: prefill_on
   checks that on the emulated runtime), between two short prompts, which then reuse the larger
   scratch: selection, tokens, frames and counters as on the host. */
void test_long_prompt(void **state)
{
	static const uint32_t lens[3] = {600, LONG_L, 600};

	(void)state;
	prompts_vs_host("long prompt", lens, 3, 0x10e6000000ull, 0);
}

/* ---- a prompt at the scale kvtier is for ------------------------------------------------- */

/* 528,000 tokens of 2 kv heads: as many (kv head, token) pairs as a 132K-token prompt of
   Llama-3-8B's 8 kv heads, where the suite's other prompts stop at 20,000 tokens. There the GPU
   SnapKV runs past its span clamp (policy/snapkv.cu: spans of at most SK_SPAN_MAX = 16 key
   tiles; past 16,384 (kv head, 64-key tile) pairs the grid grows past 1,024 CTAs instead: 516
   spans a head here), and a layer's save (270 MB) goes through about a thousand staging
   chunks. Selection, tokens, frames and counters as on the host. The selection check is
   coarse: the heavy keys dominate the vote, so a softmax denominator that missed the last 6% of
   the keys would still select the same positions (tried: nspan from the unclamped span passes
   here on cuda-kemu); kernel-emu compares the scores themselves, at the span cap too, and
   fails on that mistake. On a GPU only: on the CPU emulators (tests/cuda_emu builds this file
   with KVT_TEST_EMULATED, for cuda-emu and cuda-kemu alike) it takes 40 s with the stand-in
   kernels and 5 minutes with the real ones. KVT_TEST_NO_HUGE=1 skips it. */
#define HUGE_L 528000
_Static_assert((HUGE_L + 63) / 64 * N_KV > 16 * 1024 + 64, "17 tiles a span unclamped");

void test_huge_prompt(void **state)
{
	static const uint32_t len = HUGE_L;
	/* the host history of every token (bf16 K and V), and room for the blocks' rounding */
	uint64_t history = (uint64_t)HUGE_L * N_LAYERS * N_KV * 2 * HEAD_DIM * 2;

	(void)state;
#ifdef KVT_TEST_EMULATED
	skip();
#endif
	/* bench/gpu-run.sh's compute-sanitizer runs: the CPU side of this case would take their
	   time, and its kernels are the ones the shorter prompts run */
	if (getenv("KVT_TEST_NO_HUGE") && *getenv("KVT_TEST_NO_HUGE") == '1')
		skip();
	prompts_vs_host("huge prompt", &len, 1, 0xc1a3000000ull, history + history / 8);
}
