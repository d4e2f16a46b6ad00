/* SPDX-License-Identifier: MIT */
/*
 * replay: the replay engine of kvtier-replay and kvtier-curve (sim/replay.c, the vLLM
 * baseline sim/vllm.c, the reports sim/report.c). A smoke replay of the bundled trace where
 * every request ends completed or failed; the plain-vLLM baseline against a hand computation
 * of its iteration times; failures that stay alone, each with its reason; DRAM admission;
 * closed loops; working-set control cutting recall loads; layer sampling agreeing with the
 * full recall; the selection thread giving the run drawing alone gives; summary percentiles
 * and their sort; the JSON keys.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "check.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "kvtier.h"
#include "replay.h"
#include "report.h"
#include "simutil.h"
#include "test_replay.h"

void near(double got, double want, double rel, const char *what)
{
	if (!(fabs(got - want) <= 1e-12 + rel * fabs(want))) {
		print_error("%s: %.12g, expected %.12g\n", what, got, want);
		fail();
	}
}

/* Options with the measured CPU time left out, so runs are deterministic. */
void opts(struct sim_replay_opts *o, enum sim_policy p)
{
	sim_replay_opts_init(o);
	o->policy = p;
	o->cpu_time = false;
}

/* A synthetic trace of n requests (arrival gap seconds apart). */
struct sim_trace mk_trace(size_t n, uint32_t in, uint32_t out, double gap)
{
	struct sim_trace t = {0};

	t.reqs = calloc(n, sizeof(*t.reqs));
	assert_non_null(t.reqs);
	t.count = n;
	for (size_t i = 0; i < n; i++)
		t.reqs[i] = (struct sim_trace_req){gap * (double)i, in, out, (uint32_t)i + 1};
	t.duration_s = gap * (double)(n - 1);
	return t;
}

void run_ok(const struct sim_replay_opts *o, const struct sim_trace *t,
	    struct sim_replay_result *res)
{
	char err[256] = "";
	int rc = sim_replay_run(o, t, res, err, sizeof(err));

	if (rc) {
		print_error("sim_replay_run: %d: %s\n", rc, err);
		fail();
	}
}

/* Every request read ended completed or failed, consistently with its record. */
void check_accounting(const struct sim_replay_result *res)
{
	size_t done = 0, failed = 0;

	for (size_t i = 0; i < res->n_reqs; i++) {
		const struct sim_req_result *r = &res->reqs[i];

		if (r->status == SIM_REQ_DONE) {
			done++;
			assert_int_equal(r->generated, r->output_tokens);
			assert_true(r->sched_s >= r->arrival_s);
			assert_true(r->first_token_s > r->sched_s);
			assert_true(r->finish_s >= r->first_token_s);
		} else {
			assert_int_equal(r->status, SIM_REQ_FAILED);
			assert_non_null(r->reason);
			failed++;
		}
	}
	assert_int_equal(done, res->completed);
	assert_int_equal(failed, res->failed);
	assert_int_equal(res->completed + res->failed, res->n_reqs);
}

const char *bundled(void)
{
	const char *d = getenv("KVT_BUNDLED_TRACE");

	return d ? d : "traces/mooncake_synthetic.jsonl";
}

void read_bundled(struct sim_trace *t, size_t n)
{
	struct sim_trace_opts to = SIM_TRACE_OPTS_INIT;
	char err[256];

	to.max_context = 131072;
	CHECK_RC(sim_trace_read(bundled(), SIM_TRACE_AUTO, &to, t, err, sizeof(err)), 0);
	assert_true(t->count >= n);
	t->count = n;
}

static void test_smoke_bundled(void **state)
{
	static const enum sim_policy pol[] = {SIM_POLICY_KVTIER, SIM_POLICY_SNAPSTREAM,
					      SIM_POLICY_SPARSE_OFFLOAD, SIM_POLICY_FULL};
	struct sim_trace_opts to = SIM_TRACE_OPTS_INIT;
	struct sim_trace t;
	char err[256];
	(void)state;

	to.max_context = 131072;
	CHECK_RC(sim_trace_read(bundled(), SIM_TRACE_AUTO, &to, &t, err, sizeof(err)), 0);
	assert_int_equal(t.count, 3993);
	t.count = 120; /* the first 120 requests keep the test short */
	for (size_t p = 0; p < 4; p++) {
		struct sim_replay_opts o;
		struct sim_replay_result res;

		opts(&o, pol[p]);
		run_ok(&o, &t, &res);
		check_accounting(&res);
		assert_true(res.completed >= 119); /* one of the first 120 exceeds the context */
		assert_true(res.total_output_tokens > 0);
		assert_true(res.iterations > 0 && res.mean_batch_size >= 1);
		if (pol[p] == SIM_POLICY_KVTIER || pol[p] == SIM_POLICY_SPARSE_OFFLOAD)
			assert_true(res.blocks_loaded_per_iteration > 0);
		else
			assert_true(res.blocks_loaded_per_iteration == 0);
		sim_replay_result_free(&res);
	}
	sim_trace_free(&t);
}

/* Two results are the same run: every request's times and counts, every gap, the figures. */
static void same_result(const struct sim_replay_result *a, const struct sim_replay_result *b)
{
	assert_int_equal(a->n_reqs, b->n_reqs);
	assert_memory_equal(a->reqs, b->reqs, a->n_reqs * sizeof(*a->reqs));
	assert_int_equal(a->n_itl, b->n_itl);
	assert_memory_equal(a->itl_s, b->itl_s, a->n_itl * sizeof(*a->itl_s));
	assert_int_equal(a->iterations, b->iterations);
	assert_int_equal(a->preemptions, b->preemptions);
	assert_true(a->duration_s == b->duration_s);
	assert_true(a->blocks_loaded_per_iteration == b->blocks_loaded_per_iteration);
	assert_true(a->recall_hit_rate == b->recall_hit_rate);
	assert_true(a->t_transfer == b->t_transfer && a->t_attn_decode == b->t_attn_decode);
	assert_int_equal(a->prefix_hit_tokens, b->prefix_hit_tokens);
}

/* The selection model drawn on a second thread and the recall calls shared by two or three
   threads (without the measured CPU time) give the run the engine's thread gives alone:
   kvtier on 8 sampled layers and on all 32, and sparse-offload (r 44), over the bundled
   trace's first 150 requests. KVT_SEL_THREAD_REQS=N runs the first N instead, all at once
   (closed loop), so that every decode batch holds the N and the recall team shares its calls:
   meson's replay-threads runs 32 under TSan, where the 150 take about 13 minutes. */
static void test_sel_thread(void **state)
{
	static const struct {
		enum sim_policy p;
		uint32_t recall_layers;
	} cases[] = {
		{SIM_POLICY_KVTIER, 8}, {SIM_POLICY_KVTIER, 0}, {SIM_POLICY_SPARSE_OFFLOAD, 8}};
	struct sim_trace t;
	(void)state;

	const char *e = getenv("KVT_SEL_THREAD_REQS");
	unsigned long n_reqs = e && *e ? strtoul(e, NULL, 10) : 150;

	assert_true(n_reqs >= 1 && n_reqs <= 150);
	read_bundled(&t, (size_t)n_reqs);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct sim_replay_opts o;
		struct sim_replay_result alone, two;

		opts(&o, cases[c].p);
		o.recall_layers = cases[c].recall_layers;
		if (e && *e)
			o.concurrency = (uint32_t)n_reqs;
		o.sel_thread = false;
		o.recall_threads = 1;
		run_ok(&o, &t, &alone);
		o.sel_thread = true;
		o.recall_threads = 0; /* the default: 2 on a machine of two CPUs or more */
		run_ok(&o, &t, &two);
		assert_true(alone.blocks_loaded_per_iteration > 0);
		same_result(&alone, &two);
		sim_replay_result_free(&two);
		o.recall_threads = 3;
		run_ok(&o, &t, &two);
		same_result(&alone, &two);
		sim_replay_result_free(&alone);
		sim_replay_result_free(&two);
	}
	sim_trace_free(&t);
}

/* One request under `full`: a prefill iteration, then one decode iteration per further
   token, each timed by the roofline by hand. */
static void test_full_by_hand(void **state)
{
	struct sim_trace t = mk_trace(1, 4096, 5, 0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	struct sim_replay_summary s;
	(void)state;

	opts(&o, SIM_POLICY_FULL);
	o.roofline = true; /* the bare roofline: sums a hand can check */
	run_ok(&o, &t, &res);
	check_accounting(&res);
	const struct sim_model_preset *m = &o.model;
	double bw = o.gpu.hbm_gbps * 1e9, peak = o.gpu.tflops * 1e12;
	double wbytes = m->params * m->elem_bytes, L = 4096, kvb = sim_model_kv_token_bytes(m);
	double t1 = fmax(wbytes / bw, 2 * m->params * L / peak) +
		    4.0 * (L * L / 2) * m->n_q_heads * m->head_dim * m->n_layers / peak +
		    L * kvb / bw;
	double e2e = t1;

	/* each step reads the whole cache and writes one token's KV */
	for (int g = 1; g <= 4; g++)
		e2e += wbytes / bw + (L + g) * kvb / bw + kvb / bw;
	near(res.reqs[0].first_token_s, t1, 1e-9, "TTFT");
	near(res.reqs[0].finish_s, e2e, 1e-9, "E2E");
	assert_int_equal(res.iterations, 5);
	assert_int_equal(res.n_itl, 4);
	CHECK_RC(sim_replay_summarize(&res, &s), 0);
	near(s.mean_ttft_ms, 1e3 * t1, 1e-9, "mean TTFT");
	near(s.mean_tpot_ms, 1e3 * (e2e - t1) / 4, 1e-9, "TPOT");
	near(s.output_throughput, 5 / e2e, 1e-9, "output throughput");
	sim_replay_result_free(&res);
	free(t.reqs);
}

/* Chunked prefill under `full`: a 3000-token prompt in chunks of 1024 takes three iterations,
   its attention FLOPs add up to the whole prompt's, and a trace of long prompts completes. */
static void test_full_chunked(void **state)
{
	struct sim_trace t = mk_trace(1, 3000, 3, 0);
	struct sim_trace_opts to = SIM_TRACE_OPTS_INIT;
	struct sim_replay_opts o;
	struct sim_replay_result res;
	char err[256];
	(void)state;

	opts(&o, SIM_POLICY_FULL);
	o.chunk_tokens = 1024;
	o.roofline = true;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.iterations, 3 + 2);
	near(res.t_attn_prefill,
	     sim_prefill_attn_flops(&o.model, 3000, o.model.n_layers) / (o.gpu.tflops * 1e12), 1e-9,
	     "prefill attention");
	sim_replay_result_free(&res);
	/* with the preset's efficiencies each chunk runs at the efficiency of the geometric mean
	   of its queries and the keys they attend to: [0, 1024) at 1024, [1024, 2048) at
	   sqrt(1024 * 2048), [2048, 3000) at sqrt(952 * 3000) */
	o.roofline = false;
	run_ok(&o, &t, &res);
	{
		const struct sim_model_preset *m = &o.model;
		uint32_t L = m->n_layers;
		double want =
			sim_prefill_attn_s(&o.gpu, sim_prefill_attn_flops(m, 1024, L), 1024, 1024) +
			sim_prefill_attn_s(&o.gpu,
					   sim_prefill_attn_flops(m, 2048, L) -
						   sim_prefill_attn_flops(m, 1024, L),
					   1024, 2048) +
			sim_prefill_attn_s(&o.gpu,
					   sim_prefill_attn_flops(m, 3000, L) -
						   sim_prefill_attn_flops(m, 2048, L),
					   952, 3000);

		near(res.t_attn_prefill, want, 1e-9, "prefill attention at its efficiencies");
		assert_true(res.t_attn_prefill >
			    1.5 * sim_prefill_attn_flops(m, 3000, L) / (o.gpu.tflops * 1e12));
	}
	sim_replay_result_free(&res);
	free(t.reqs);

	to.max_context = 131072;
	CHECK_RC(sim_trace_read(bundled(), SIM_TRACE_AUTO, &to, &t, err, sizeof(err)), 0);
	t.count = 60;
	opts(&o, SIM_POLICY_FULL);
	o.chunk_tokens = 2048;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 60);
	sim_replay_result_free(&res);
	sim_trace_free(&t);
}

/* With the measured CPU time left out, a run on the calibrated execution model is
   deterministic for every policy (two runs agree to the bit), and it is slower than the bare
   roofline by what the efficiencies say: more than 1.2x in duration on long prompts. */
static void test_exec_model_runs(void **state)
{
	static const enum sim_policy pol[] = {SIM_POLICY_KVTIER, SIM_POLICY_SNAPSTREAM,
					      SIM_POLICY_SPARSE_OFFLOAD, SIM_POLICY_FULL};
	struct sim_trace t = mk_trace(12, 12000, 24, 0.2);
	(void)state;

	for (size_t p = 0; p < sizeof(pol) / sizeof(pol[0]); p++) {
		struct sim_replay_opts o;
		struct sim_replay_result a, b, roof;

		opts(&o, pol[p]);
		run_ok(&o, &t, &a);
		run_ok(&o, &t, &b);
		assert_int_equal(a.completed, 12);
		assert_int_equal(a.iterations, b.iterations);
		assert_true(a.duration_s == b.duration_s);
		for (size_t i = 0; i < a.n_reqs; i++)
			assert_true(a.reqs[i].first_token_s == b.reqs[i].first_token_s &&
				    a.reqs[i].finish_s == b.reqs[i].finish_s);
		assert_true(a.t_kv_write > 0 && a.t_overhead > 0);
		o.roofline = true;
		run_ok(&o, &t, &roof);
		assert_int_equal(roof.completed, 12);
		assert_true(roof.t_overhead == 0);
		print_message("# %s: %.2f s on the execution model, %.2f s on the bare roofline\n",
			      sim_policy_name(pol[p]), a.duration_s, roof.duration_s);
		assert_true(a.duration_s > 1.2 * roof.duration_s);
		sim_replay_result_free(&a);
		sim_replay_result_free(&b);
		sim_replay_result_free(&roof);
	}
	free(t.reqs);
}

/* Requests that can never run fail alone, each with its reason; the others complete. */
static void test_failures_alone(void **state)
{
	static const enum sim_policy pol[] = {SIM_POLICY_KVTIER, SIM_POLICY_FULL};
	(void)state;

	for (size_t p = 0; p < 2; p++) {
		struct sim_trace t = mk_trace(6, 8192, 8, 0.01);
		struct sim_replay_opts o;
		struct sim_replay_result res;

		t.reqs[1].input_tokens = 0;	 /* empty prompt */
		t.reqs[2].output_tokens = 0;	 /* nothing to generate */
		t.reqs[3].input_tokens = 200000; /* beyond llama3-8b's 128K context */
		t.reqs[4].input_tokens = 120000; /* fits the context, not a 4 GiB budget */
		opts(&o, pol[p]);
		o.hbm_gib = 4;
		o.dram_gib = 8;
		run_ok(&o, &t, &res);
		check_accounting(&res);
		assert_int_equal(res.completed, 2);
		assert_int_equal(res.failed, 4);
		assert_int_equal(res.reqs[0].status, SIM_REQ_DONE);
		assert_int_equal(res.reqs[5].status, SIM_REQ_DONE);
		assert_string_equal(res.reqs[1].reason, "empty prompt");
		assert_string_equal(res.reqs[2].reason, "no output tokens");
		assert_string_equal(res.reqs[3].reason,
				    "input + output exceed the model's context");
		assert_non_null(strstr(res.reqs[4].reason, "exceeds the"));
		sim_replay_result_free(&res);
		free(t.reqs);
	}
}

/* DRAM admission: with room for one history at a time, requests run one after another (the
   batch never exceeds one) and all complete. */
static void test_dram_admission(void **state)
{
	struct sim_trace t = mk_trace(4, 16384, 4, 0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	(void)state;

	opts(&o, SIM_POLICY_KVTIER);
	o.dram_gib = 2.5; /* one 16K-token history is 2 GiB */
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 4);
	assert_int_equal(res.max_batch_size, 1);
	for (size_t i = 1; i < 4; i++)
		assert_true(res.reqs[i].sched_s >= res.reqs[i - 1].finish_s);
	sim_replay_result_free(&res);
	free(t.reqs);
}

/* --spill-dir: DRAM no longer bounds how many requests are in the system, the disk tier
   takes the histories of those not running (spilled, then fetched back before they run), and
   every request completes, also with histories larger than DRAM; one whose single layer
   exceeds DRAM fails, with its reason. */
static void test_spill_dir(void **state)
{
	struct sim_trace t = mk_trace(24, 4096, 1024, 0.5);
	struct sim_replay_opts o;
	struct sim_replay_result plain, res;
	char dir[] = "/tmp/kvt-replay-spill-XXXXXX";
	(void)state;

	assert_non_null(mkdtemp(dir));
	opts(&o, SIM_POLICY_KVTIER);
	o.dram_gib = 5; /* eight of the 640 MiB histories */
	run_ok(&o, &t, &plain);
	check_accounting(&plain);
	assert_int_equal(plain.completed, 24);
	assert_int_equal(plain.disk_blocks_spilled, 0);

	o.spill_dir = dir;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 24);
	assert_true(res.disk_blocks_spilled > 0);
	assert_true(res.disk_blocks_fetched > 0);
	assert_true(res.t_disk > 0 && res.t_disk <= res.t_transfer);
	/* requests waiting on disk let more into the batch than DRAM alone did */
	assert_true(res.max_batch_size > plain.max_batch_size);
	/* a disk four times as fast moves a block in less time (each batch also costs its
	   fixed latency, so not four times less) */
	{
		struct sim_replay_result fast;

		o.disk_gbps = 24;
		run_ok(&o, &t, &fast);
		double per_fast =
			fast.t_disk / (double)(fast.disk_blocks_spilled + fast.disk_blocks_fetched);
		double per =
			res.t_disk / (double)(res.disk_blocks_spilled + res.disk_blocks_fetched);

		print_message("# disk time per block: %.3g s at 6 GB/s, %.3g s at 24 GB/s\n", per,
			      per_fast);
		assert_true(per_fast < per / 2 && per_fast > per / 4);
		o.disk_gbps = 6;
		sim_replay_result_free(&fast);
	}
	sim_replay_result_free(&res);

	/* a bounded disk: DRAM + disk admission again */
	o.disk_gib = 4;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 24);
	sim_replay_result_free(&res);

	/* histories beyond DRAM alone run: DRAM caches them, each call fetches what it
	   touches */
	o.disk_gib = 0;
	o.dram_gib = 0.5;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 24);
	assert_true(res.disk_blocks_fetched > 0);
	sim_replay_result_free(&res);

	/* one layer of a history (20 MiB) beyond DRAM cannot run even with a disk */
	o.dram_gib = 0.01;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 0);
	assert_non_null(strstr(res.reqs[0].reason, "exceeds DRAM"));
	sim_replay_result_free(&res);
	sim_replay_result_free(&plain);
	free(t.reqs);
	assert_int_equal(rmdir(dir), 0); /* no spill file left behind */
}

/* Closed loop: at most `concurrency` requests in the system, arrival times ignored, each
   entering when an earlier one completes. */
static void test_closed_loop(void **state)
{
	struct sim_trace t = mk_trace(24, 4096, 16, 1000.0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	(void)state;

	opts(&o, SIM_POLICY_KVTIER);
	o.concurrency = 4;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 24);
	assert_true(res.max_batch_size <= 4);
	assert_true(res.duration_s < 1000.0); /* the 1000 s gaps were ignored */
	for (size_t i = 4; i < 24; i++) {
		size_t before = 0;

		for (size_t k = 0; k < i; k++)
			before += res.reqs[k].finish_s <= res.reqs[i].arrival_s;
		assert_true(before >= i - 3); /* it entered when a place was free */
	}
	sim_replay_result_free(&res);
	free(t.reqs);
}

/* Fixed-batch decode with a recall cache too small for every working set: without
   working-set control the regions are squeezed below their working sets (loads rise); with
   it, admission keeps the running working sets inside the cache. */
static void run_ws(bool ws, uint32_t layers, struct sim_replay_result *res)
{
	struct sim_trace t = mk_trace(96, 32768, 200, 0);
	struct sim_replay_opts o;

	opts(&o, SIM_POLICY_KVTIER);
	o.concurrency = 48;
	o.ws_control = ws;
	o.recall_cache_frac = 0.02;
	o.recall_layers = layers;
	o.max_tokens = 1u << 30; /* every request prefilled at once: a pure decode window */
	o.max_inject_tokens = (uint64_t)1 << 40;
	o.warmup_iterations = 20;
	o.max_iterations = 80;
	run_ok(&o, &t, res);
	free(t.reqs);
}

static void test_ws_control(void **state)
{
	struct sim_replay_result on, off;
	(void)state;

	run_ws(true, 8, &on);
	run_ws(false, 8, &off);
	double l_on = (double)on.win_blocks_loaded / (double)on.win_iterations;
	double l_off = (double)off.win_blocks_loaded / (double)off.win_iterations;
	double b_on = (double)on.win_batch_sum / (double)on.win_iterations;
	double b_off = (double)off.win_batch_sum / (double)off.win_iterations;

	print_message("# ws on: batch %.1f, %.0f blocks/iteration, hit rate %.4f; off: batch %.1f, "
		      "%.0f, %.4f\n",
		      b_on, l_on, on.recall_hit_rate, b_off, l_off, off.recall_hit_rate);
	assert_true(b_off > b_on); /* control admits fewer ... */
	/* ... and loads less per request: without it the regions are squeezed below their
	   working sets (each still keeps its own hottest blocks, so this is no collapse) */
	assert_true(l_off / b_off > 1.25 * l_on / b_on);
	assert_true(on.recall_hit_rate > off.recall_hit_rate + 0.05);
	sim_replay_result_free(&on);
	sim_replay_result_free(&off);
}

/* Layer sampling stands for the full recall: blocks loaded and hit rate agree, with the
   working sets admitted to fit the cache (without control the regions of the sampled layers
   are squeezed in another order than all layers', which the figures then show). */
static void test_layer_sampling(void **state)
{
	struct sim_replay_result all, some;
	(void)state;

	run_ws(true, 0, &all);
	run_ws(true, 8, &some);
	print_message("# all layers: %llu loads, hit rate %.4f; 8 sampled: %llu, %.4f\n",
		      (unsigned long long)all.win_blocks_loaded, all.recall_hit_rate,
		      (unsigned long long)some.win_blocks_loaded, some.recall_hit_rate);
	near((double)some.win_blocks_loaded, (double)all.win_blocks_loaded, 0.05, "loads");
	near(some.recall_hit_rate, all.recall_hit_rate, 0.05, "hit rate");
	sim_replay_result_free(&all);
	sim_replay_result_free(&some);
}

/* Percentiles interpolate between ranks (numpy's default); TPOT leaves out one-token
   requests. */
/* Mean, median and p99 of the ms values of v[0..n) as the summary had them from qsort: the
   sum in sorted order, percentiles between ranks. */
static void qsort_stats(const double *v, size_t n, double out[3])
{
	double *w = malloc(n * sizeof(*w)), sum = 0;

	assert_non_null(w);
	for (size_t i = 0; i < n; i++)
		w[i] = v[i] * 1e3;
	qsort(w, n, sizeof(*w), sim_cmp_double);
	for (size_t i = 0; i < n; i++)
		sum += w[i];
	out[0] = sum / (double)n;
	out[1] = sim_percentile(w, n, 0.5);
	out[2] = sim_percentile(w, n, 0.99);
	free(w);
}

/* The summary's sort gives qsort's order, bit for bit: 200,000 gaps with repeats, zeros of
   both signs, negatives and a span of magnitudes (summaries of any size use the same sort). */
static void test_summary_sort(void **state)
{
	enum { N = 200000 };
	double *itl = malloc(N * sizeof(*itl)), want[3], got[3];
	struct sim_req_result r = {.status = SIM_REQ_DONE, .output_tokens = 1, .finish_s = 1};
	struct sim_replay_result res = {.n_reqs = 1, .reqs = &r, .completed = 1, .n_itl = N};
	struct sim_replay_summary s;
	uint64_t g = 7;
	(void)state;

	assert_non_null(itl);
	for (size_t i = 0; i < N; i++) {
		uint64_t x = sim_splitmix64(&g);

		switch (x % 8) {
		case 0:
			itl[i] = 0.0;
			break;
		case 1:
			itl[i] = -0.0;
			break;
		case 2:
			itl[i] = -(double)(x >> 40) * 1e-6;
			break;
		case 3:
			itl[i] = (double)(x % 97) * 0.01; /* many repeats */
			break;
		default:
			itl[i] = ldexp((double)(x >> 11) * 0x1p-53, (int)(x % 61) - 30);
		}
	}
	res.itl_s = itl;
	qsort_stats(itl, N, want);
	CHECK_RC(sim_replay_summarize(&res, &s), 0);
	got[0] = s.mean_itl_ms;
	got[1] = s.median_itl_ms;
	got[2] = s.p99_itl_ms;
	assert_memory_equal(got, want, sizeof(got));
	free(itl);
}

static void test_summary(void **state)
{
	struct sim_req_result r[4] = {
		{.arrival_s = 0,
		 .sched_s = 0,
		 .first_token_s = 1,
		 .finish_s = 2,
		 .output_tokens = 3},
		{.arrival_s = 0,
		 .sched_s = 1,
		 .first_token_s = 2,
		 .finish_s = 2,
		 .output_tokens = 1},
		{.arrival_s = 1,
		 .sched_s = 1,
		 .first_token_s = 4,
		 .finish_s = 8,
		 .output_tokens = 5},
		{.status = SIM_REQ_FAILED, .reason = "x", .arrival_s = 0},
	};
	double itl[3] = {0.5, 0.1, 0.3};
	struct sim_replay_result res = {.n_reqs = 4,
					.reqs = r,
					.itl_s = itl,
					.n_itl = 3,
					.completed = 3,
					.failed = 1,
					.duration_s = 8,
					.total_output_tokens = 9};
	struct sim_replay_summary s;
	(void)state;

	for (int i = 0; i < 3; i++)
		r[i].status = SIM_REQ_DONE;
	CHECK_RC(sim_replay_summarize(&res, &s), 0);
	/* TTFT 1, 2, 3 s */
	near(s.mean_ttft_ms, 2000, 1e-12, "mean TTFT");
	near(s.median_ttft_ms, 2000, 1e-12, "median TTFT");
	near(s.p99_ttft_ms, 1000 * (2 + 0.98), 1e-12, "p99 TTFT");
	/* TPOT: (2-1)/2 = 0.5 s and (8-4)/4 = 1 s */
	near(s.mean_tpot_ms, 750, 1e-12, "mean TPOT");
	near(s.median_itl_ms, 300, 1e-12, "median ITL");
	near(s.p99_itl_ms, 1000 * (0.3 + 0.98 * 0.2), 1e-12, "p99 ITL");
	near(s.mean_scheduling_delay_ms, 1000.0 / 3, 1e-12, "scheduling delay");
	near(s.output_throughput, 9.0 / 8, 1e-12, "output throughput");
	near(s.request_throughput, 3.0 / 8, 1e-12, "request throughput");
}

static void test_json_keys(void **state)
{
	static const char *const vllm[] = {
		"completed",
		"failed",
		"duration",
		"total_input_tokens",
		"total_output_tokens",
		"request_throughput",
		"output_throughput",
		"total_token_throughput",
	};
	static const char *const lat[] = {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"};
	static const char *const ours[] = {
		"mean_scheduling_delay_ms",
		"mean_batch_size",
		"max_batch_size",
		"blocks_loaded_per_iteration",
		"recall_hit_rate",
		"policy",
		"model",
		"gpu",
		"time_gemm_s",
		"time_kv_write_s",
		"time_overhead_s",
		"prefix_hit_rate",
		"prefix_input_tokens",
		"prefix_hit_tokens",
		"prefill_tokens_computed",
		"prefix_bytes_loaded",
	};
	struct sim_trace t = mk_trace(8, 8192, 8, 0.05);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	struct sim_replay_summary s;
	char path[] = "/tmp/kvt-replay-json-XXXXXX", err[256], key[64];
	json_t *root, *extra = json_pack("{s:s}", "trace", "synthetic");
	json_error_t je;
	int fd = mkstemp(path);
	(void)state;

	assert_true(fd >= 0);
	close(fd);
	opts(&o, SIM_POLICY_KVTIER);
	run_ok(&o, &t, &res);
	CHECK_RC(sim_replay_summarize(&res, &s), 0);
	CHECK_RC(sim_replay_write_json(&res, &s, extra, path, err, sizeof(err)), 0);
	root = json_load_file(path, 0, &je);
	assert_non_null(root);
	for (size_t i = 0; i < sizeof(vllm) / sizeof(vllm[0]); i++)
		assert_true(json_is_number(json_object_get(root, vllm[i])));
	for (size_t i = 0; i < 4; i++)
		for (int k = 0; k < 3; k++) {
			snprintf(key, sizeof(key), "%s_%s",
				 k == 0	  ? "mean"
				 : k == 1 ? "median"
					  : "p99",
				 lat[i]);
			assert_true(json_is_number(json_object_get(root, key)));
		}
	for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
		assert_non_null(json_object_get(root, ours[i]));
	assert_int_equal(json_integer_value(json_object_get(root, "completed")), 8);
	/* no hash ids: nothing shared, every prompt token computed */
	assert_int_equal(json_integer_value(json_object_get(root, "prefix_input_tokens")),
			 8 * 8192);
	assert_int_equal(json_integer_value(json_object_get(root, "prefill_tokens_computed")),
			 8 * 8192);
	assert_int_equal(json_integer_value(json_object_get(root, "prefix_hit_tokens")), 0);
	assert_string_equal(json_string_value(json_object_get(root, "policy")), "kvtier");
	assert_string_equal(json_string_value(json_object_get(root, "trace")), "synthetic");
	json_decref(root);
	json_decref(extra);
	unlink(path);
	/* an unwritable path is an error with a message, not a crash */
	assert_true(sim_replay_write_json(&res, &s, NULL, "/nonexistent/dir/x.json", err,
					  sizeof(err)) < 0);
	assert_non_null(strstr(err, "/nonexistent/dir/x.json"));
	sim_replay_result_free(&res);
	free(t.reqs);
}

/* Writes text to a new temporary file; returns its path (static buffer). */
static const char *tmp_file(const char *text)
{
	static char path[64];
	FILE *f;
	int fd;

	snprintf(path, sizeof(path), "/tmp/kvt-selfile-XXXXXX");
	fd = mkstemp(path);
	assert_true(fd >= 0);
	f = fdopen(fd, "w");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
	return path;
}

/* Recorded selections: a request that recalls the same three blocks at every step loads them
   once per (layer, kv head) and hits ever after; malformed or out-of-range records are
   errors naming the file and line. */
static void test_recorded_selections(void **state)
{
	struct sim_trace t = mk_trace(1, 8192, 20, 0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	struct sim_selfile sf;
	char err[512], *text = malloc(1 << 20);
	size_t at = 0;
	(void)state;

	assert_non_null(text);
	at += (size_t)sprintf(text + at, "# request step layer head blocks\n");
	for (int st = 0; st < 19; st++)
		for (int l = 0; l < 32; l++)
			for (int h = 0; h < 8; h++)
				at += (size_t)sprintf(text + at, "0 %d %d %d 100 101 102\n", st, l,
						      h);
	const char *path = tmp_file(text);

	CHECK_RC(sim_selfile_read(path, &sf, err, sizeof(err)), 0);
	assert_int_equal(sf.n_rec, 19 * 32 * 8);
	unlink(path);
	opts(&o, SIM_POLICY_KVTIER);
	o.selections = &sf;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	near(res.blocks_loaded_per_iteration * (double)res.iterations, 3 * 32 * 8, 1e-12,
	     "blocks loaded");
	near(res.recall_hit_rate, 18.0 / 19.0, 1e-12, "hit rate");
	sim_replay_result_free(&res);

	/* a block past the history at its step: the run refuses, naming the line */
	sf.blocks[sf.rec[5].first] = 8192 / 32 + 1;
	assert_int_equal(sim_replay_run(&o, &t, &res, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "field 'BLOCK'"));
	assert_non_null(strstr(err, ":"));
	sim_selfile_free(&sf);

	path = tmp_file("0 0 0 0 1 2\n0 x 0 0 1\n");
	assert_int_equal(sim_selfile_read(path, &sf, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":2: field 'STEP': not a number"));
	unlink(path);
	path = tmp_file("0 0 0\n");
	assert_int_equal(sim_selfile_read(path, &sf, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":1: field 'HEAD': missing"));
	unlink(path);
	path = tmp_file("0 0 0 0 1\n0 0 0 0 2 b\n");
	assert_int_equal(sim_selfile_read(path, &sf, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":2: field 'BLOCK 2': not a number"));
	unlink(path);
	path = tmp_file("1 2 3 4 5\n\n1 2 3 4 6\n");
	assert_int_equal(sim_selfile_read(path, &sf, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":3: record repeats line 1"));
	unlink(path);
	assert_true(sim_selfile_read("/nonexistent/sel.txt", &sf, err, sizeof(err)) == -ENOENT);
	free(text);
	free(t.reqs);
}

/* A selections file follows the traces' and presets' rules: a leading UTF-8 byte-order mark
   is skipped, and a file that cannot be opened is reported with its reason. */
static void test_selfile_rules(void **state)
{
	struct sim_selfile sf;
	char err[512];
	const char *path = tmp_file("\xEF\xBB\xBF"
				    "0 1 2 3 7 8\n");
	(void)state;

	CHECK_RC(sim_selfile_read(path, &sf, err, sizeof(err)), 0);
	assert_int_equal(sf.n_rec, 1);
	assert_int_equal(sf.rec[0].req, 0);
	assert_int_equal(sf.rec[0].head, 3);
	assert_int_equal(sf.rec[0].n, 2);
	sim_selfile_free(&sf);
	unlink(path);
	assert_int_equal(sim_selfile_read("/nonexistent/sel.txt", &sf, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "/nonexistent/sel.txt: cannot open: No such file or directory");
}

static void test_bad_options(void **state)
{
	struct sim_trace t = mk_trace(2, 1024, 4, 0), empty = {0};
	struct sim_replay_opts o;
	struct sim_replay_result res;
	char err[256];
	enum sim_policy p;
	(void)state;

	opts(&o, SIM_POLICY_KVTIER);
	assert_int_equal(sim_replay_run(&o, &empty, &res, err, sizeof(err)), -EINVAL);
	o.dram_gib = 0;
	assert_int_equal(sim_replay_run(&o, &t, &res, err, sizeof(err)), -EINVAL);
	opts(&o, SIM_POLICY_KVTIER);
	o.recall_cache_frac = 1.5;
	assert_int_equal(sim_replay_run(&o, &t, &res, err, sizeof(err)), -EINVAL);
	opts(&o, SIM_POLICY_KVTIER);
	sim_preset_gpu("a100-40g", &o.gpu);
	sim_preset_model("llama3-70b", &o.model); /* 141 GB of weights on a 40 GB GPU */
	assert_int_equal(sim_replay_run(&o, &t, &res, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "no HBM left"));
	assert_int_equal(sim_policy_parse("sparse-offload", &p), 0);
	assert_int_equal(p, SIM_POLICY_SPARSE_OFFLOAD);
	assert_int_equal(sim_policy_parse("vllm", &p), -EINVAL);
	assert_string_equal(sim_policy_name(SIM_POLICY_FULL), "full");
	free(t.reqs);
}

/* A recall cache fraction of 0 is refused at parsing (recall would have no frame to load
   into), and one too small for a single frame before the first iteration, naming the option;
   --recall 0 and sparse-offload, which use no fraction, still run. */
static void test_recall_cache_frac(void **state)
{
	struct sim_trace t = mk_trace(2, 1024, 4, 0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	char err[512];
	(void)state;

	opts(&o, SIM_POLICY_KVTIER);
	assert_int_equal(sim_replay_opt("recall-cache-frac", "0", &o), -1);
	assert_true(o.recall_cache_frac == 0.10); /* unchanged */
	assert_int_equal(sim_replay_opt("recall-cache-frac", "0.99", &o), 0);
	assert_int_equal(sim_replay_opt("recall-cache-frac", "1e-9", &o), 0);
	assert_int_equal(sim_replay_run(&o, &t, &res, err, sizeof(err)), -EINVAL);
	print_message("# %s\n", err);
	assert_non_null(strstr(err, "--recall-cache-frac"));
	o.recall_blocks = 0;
	run_ok(&o, &t, &res);
	assert_int_equal(res.completed, 2);
	sim_replay_result_free(&res);
	opts(&o, SIM_POLICY_SPARSE_OFFLOAD);
	o.recall_cache_frac = 1e-9;
	run_ok(&o, &t, &res);
	assert_int_equal(res.completed, 2);
	sim_replay_result_free(&res);
	free(t.reqs);
}

/* An element size the library does not store is refused before the run, under every policy:
   the timing would use it while the manager stored bf16. */
static void test_elem_bytes(void **state)
{
	struct sim_trace t = mk_trace(2, 1024, 4, 0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	char err[512];
	(void)state;

	for (uint32_t eb = 1; eb <= 8; eb++) {
		opts(&o, eb & 1 ? SIM_POLICY_KVTIER : SIM_POLICY_FULL);
		o.model.elem_bytes = eb;
		if (eb == 2 || eb == 4) {
			run_ok(&o, &t, &res);
			assert_int_equal(res.completed, 2);
			sim_replay_result_free(&res);
			continue;
		}
		assert_int_equal(sim_replay_run(&o, &t, &res, err, sizeof(err)), -EINVAL);
		print_message("# %s\n", err);
		assert_non_null(strstr(err, "element size"));
	}
	free(t.reqs);
}

/* With an argument, only the tests whose names match it (cmocka's filter: '*' and '?'
   wildcards), e.g. test_sel_thread for the threaded run under TSan (meson's replay-threads). */
int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_smoke_bundled),
		cmocka_unit_test(test_full_by_hand),
		cmocka_unit_test(test_full_chunked),
		cmocka_unit_test(test_exec_model_runs),
		cmocka_unit_test(test_failures_alone),
		cmocka_unit_test(test_dram_admission),
		cmocka_unit_test(test_spill_dir),
		cmocka_unit_test(test_closed_loop),
		cmocka_unit_test(test_ws_control),
		cmocka_unit_test(test_layer_sampling),
		cmocka_unit_test(test_summary),
		cmocka_unit_test(test_summary_sort),
		cmocka_unit_test(test_sel_thread),
		cmocka_unit_test(test_json_keys),
		cmocka_unit_test(test_recorded_selections),
		cmocka_unit_test(test_selfile_rules),
		cmocka_unit_test(test_bad_options),
		cmocka_unit_test(test_recall_cache_frac),
		cmocka_unit_test(test_elem_bytes),
		cmocka_unit_test(test_apc_repeat),
		cmocka_unit_test(test_apc_lru),
		cmocka_unit_test(test_apc_referenced),
		cmocka_unit_test(test_prefix_off_unchanged),
		cmocka_unit_test(test_prefix_deterministic),
		cmocka_unit_test(test_prefix_kvtier_repeat),
		cmocka_unit_test(test_prefix_dram),
		cmocka_unit_test(test_prefix_disk_pins),
	};

	if (argc > 1)
		cmocka_set_test_filter(argv[1]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
