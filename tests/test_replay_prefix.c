/* SPDX-License-Identifier: MIT */
/*
 * replay, prefix reuse: the vLLM baseline's automatic prefix caching (sim/vllm.c) on small
 * traces worked out by hand (a repeated prompt hits and prefills only its rest; unreferenced
 * spans are evicted least recently released, the latest of a chain first; referenced spans
 * never are); the prefix cache turned off gives the figures of the code before it; runs with
 * reuse are deterministic.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec_model.h"
#include "kvtier.h"
#include "replay.h"
#include "report.h"
#include "test_replay.h"

/* Gives request i of t the hash ids ids[0..n), appended to the trace's array. */
static void set_ids(struct sim_trace *t, size_t i, const uint64_t *ids, uint32_t n)
{
	uint64_t *a = realloc(t->hash_ids, (t->n_hash_ids + n) * sizeof(*a));

	assert_non_null(a);
	memcpy(a + t->n_hash_ids, ids, n * sizeof(*ids));
	t->hash_ids = a;
	t->reqs[i].hash_first = t->n_hash_ids;
	t->reqs[i].n_hash = n;
	t->n_hash_ids += n;
}

/* The figures two runs must agree on to call them the same run. */
static void same_run(const struct sim_replay_result *a, const struct sim_replay_result *b)
{
	assert_int_equal(a->n_reqs, b->n_reqs);
	assert_memory_equal(a->reqs, b->reqs, a->n_reqs * sizeof(*a->reqs));
	assert_int_equal(a->iterations, b->iterations);
	assert_int_equal(a->preemptions, b->preemptions);
	assert_true(a->duration_s == b->duration_s);
	assert_true(a->t_gemm == b->t_gemm && a->t_attn_prefill == b->t_attn_prefill &&
		    a->t_transfer == b->t_transfer && a->t_kv_write == b->t_kv_write);
	assert_int_equal(a->prefix_input_tokens, b->prefix_input_tokens);
	assert_int_equal(a->prefix_hit_tokens, b->prefix_hit_tokens);
	assert_int_equal(a->prefill_tokens, b->prefill_tokens);
	assert_int_equal(a->prefix_bytes_loaded, b->prefix_bytes_loaded);
}

/* The same prompt twice, the second after the first finished, under full on the bare
   roofline: the second shares all 8 whole spans (4,096 of its 4,100 tokens), prefills 4
   tokens attending to all 4,100, and its TTFT is a fraction of the first's. Without the
   cache both prefill everything. */
void test_apc_repeat(void **state)
{
	static const uint64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
	struct sim_trace t = mk_trace(2, 4100, 4, 10.0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	struct sim_gpu_preset g;
	const struct sim_model_preset *m;
	double a_whole, a_rest;
	(void)state;

	set_ids(&t, 0, ids, 8);
	set_ids(&t, 1, ids, 8);
	opts(&o, SIM_POLICY_FULL);
	o.roofline = true;
	m = &o.model;
	sim_replay_gpu(&o, &g);
	a_whole = sim_prefill_attn_s(&g, sim_prefill_attn_flops(m, 4100, m->n_layers), 4100, 4100);
	a_rest = sim_prefill_attn_s(&g,
				    sim_prefill_attn_flops(m, 4100, m->n_layers) -
					    sim_prefill_attn_flops(m, 4096, m->n_layers),
				    4, 4100);

	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 2);
	assert_int_equal(res.prefix_input_tokens, 8200);
	assert_int_equal(res.prefix_hit_tokens, 4096);
	assert_int_equal(res.prefill_tokens, 4100 + 4);
	assert_int_equal(res.prefix_bytes_loaded, 0); /* HBM: nothing loaded */
	near(res.prefix_hit_rate, 4096.0 / 8200, 1e-12, "prefix hit rate");
	near(res.t_attn_prefill, a_whole + a_rest, 1e-9, "prefill attention");
	assert_true(res.reqs[1].first_token_s - res.reqs[1].arrival_s <
		    0.2 * (res.reqs[0].first_token_s - res.reqs[0].arrival_s));
	sim_replay_result_free(&res);

	o.prefix_cache = false;
	run_ok(&o, &t, &res);
	assert_int_equal(res.prefix_hit_tokens, 0);
	assert_int_equal(res.prefill_tokens, 8200);
	near(res.t_attn_prefill, 2 * a_whole, 1e-9, "prefill attention, no cache");
	near(res.reqs[1].first_token_s - res.reqs[1].arrival_s,
	     res.reqs[0].first_token_s - res.reqs[0].arrival_s, 1e-9, "TTFT, no cache");
	sim_replay_result_free(&res);

	/* a prompt of exactly 8 spans is never shared whole: 7 spans, 512 tokens computed */
	t.reqs[0].input_tokens = t.reqs[1].input_tokens = 4096;
	o.prefix_cache = true;
	run_ok(&o, &t, &res);
	assert_int_equal(res.prefix_hit_tokens, 3584);
	assert_int_equal(res.prefill_tokens, 4096 + 512);
	sim_replay_result_free(&res);
	sim_trace_free(&t);
}

/* Eviction order, on 200 pages of HBM (16 tokens a page, 32 pages a span), one request after
   another: [A0 A1], [B0 B1], [C0 C1] (1,100 tokens, 69 pages each) leave 6 idle spans and 8
   free pages; [D0] (520 tokens, 33 pages) evicts one span, the least recently released
   request's latest, A1; [A0 A1] then shares A0 (512 tokens) and evicts B1 for its other 37
   pages; [C0 C1] shares both (1,024); [B0 B1] shares B0 (512). Evicting a chain's first span
   first, the most recently released first, or a referenced span, would give other hits. */
void test_apc_lru(void **state)
{
	static const uint64_t A[2] = {100, 101}, B[2] = {200, 201}, C[2] = {300, 301}, D[1] = {400};
	static const struct {
		const uint64_t *ids;
		uint32_t n, in;
	} rq[] = {{A, 2, 1100}, {B, 2, 1100}, {C, 2, 1100}, {D, 1, 520},
		  {A, 2, 1100}, {C, 2, 1100}, {B, 2, 1100}};
	const size_t n = sizeof(rq) / sizeof(rq[0]);
	struct sim_trace t = mk_trace(n, 1100, 2, 5.0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	(void)state;

	for (size_t i = 0; i < n; i++) {
		t.reqs[i].input_tokens = rq[i].in;
		set_ids(&t, i, rq[i].ids, rq[i].n);
	}
	opts(&o, SIM_POLICY_FULL);
	o.hbm_gib = 200 * 16 * sim_model_kv_token_bytes(&o.model) / 1073741824.0;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, n);
	assert_int_equal(res.preemptions, 0);
	for (size_t i = 1; i < n; i++) /* one after another, as the hits above assume */
		assert_true(res.reqs[i].sched_s > res.reqs[i - 1].finish_s);
	assert_int_equal(res.prefix_input_tokens, 6 * 1100 + 520);
	assert_int_equal(res.prefix_hit_tokens, 512 + 1024 + 512);
	assert_int_equal(res.prefill_tokens, 6 * 1100 + 520 - 2048);
	sim_replay_result_free(&res);

	/* with room for every span, nothing is evicted: [A0 A1], [C0 C1], [B0 B1] all hit */
	o.hbm_gib = 0;
	run_ok(&o, &t, &res);
	assert_int_equal(res.prefix_hit_tokens, 3 * 1024);
	sim_replay_result_free(&res);
	sim_trace_free(&t);

	/* decode evicts before it preempts: on 100 pages, [A0 A1] leaves 64 idle pages and 36
	   free; a 600-token request with 600 output tokens (38 pages, then 75) takes A1 at
	   admission and A0 while it decodes, and is never preempted */
	t = mk_trace(2, 1100, 2, 5.0);
	set_ids(&t, 0, A, 2);
	t.reqs[1].input_tokens = 600;
	t.reqs[1].output_tokens = 600;
	o.hbm_gib = 100 * 16 * sim_model_kv_token_bytes(&o.model) / 1073741824.0;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 2);
	assert_int_equal(res.preemptions, 0);
	assert_int_equal(res.prefill_tokens, 1100 + 600);
	sim_replay_result_free(&res);
	sim_trace_free(&t);
}

/* Spans a running request references are never evicted: two requests share 4 spans (128
   pages) while both decode; a third of 600 tokens (38 pages and the watermark) finds too few
   free pages and waits until the first finishes and frees its own, although evicting the
   shared spans would have let it in at once. With 40 more pages it enters at once. */
void test_apc_referenced(void **state)
{
	static const uint64_t A[4] = {1, 2, 3, 4}, Z[1] = {9};
	struct sim_trace t = mk_trace(3, 2100, 200, 0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	double page_gib;
	(void)state;

	t.reqs[1].arrival_s = 0.5;
	t.reqs[2].arrival_s = 0.6;
	t.reqs[2].input_tokens = 600;
	t.reqs[2].output_tokens = 2;
	set_ids(&t, 0, A, 4);
	set_ids(&t, 1, A, 4);
	set_ids(&t, 2, Z, 1);
	opts(&o, SIM_POLICY_FULL);
	page_gib = 16 * sim_model_kv_token_bytes(&o.model) / 1073741824.0;
	o.hbm_gib = 175 * page_gib;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 3);
	assert_int_equal(res.preemptions, 0);
	/* the second arrives while the first decodes, and shares its 4 spans */
	assert_true(res.reqs[1].sched_s < res.reqs[0].finish_s);
	assert_int_equal(res.prefix_hit_tokens, 2048);
	assert_true(res.reqs[2].sched_s >= res.reqs[0].finish_s);
	sim_replay_result_free(&res);

	o.hbm_gib = 215 * page_gib;
	run_ok(&o, &t, &res);
	assert_int_equal(res.prefix_hit_tokens, 2048);
	assert_true(res.reqs[2].sched_s < res.reqs[0].finish_s);
	sim_replay_result_free(&res);
	sim_trace_free(&t);
}

/* With the prefix cache off, the first 200 requests of the bundled trace give the figures
   the replay gave before prefix reuse existed (kvtier-replay --num-prompts 200 --no-cpu-time
   of 0a32b5c, its --json to 10 digits), for full, and for kvtier on the library since its
   recall cache became per-(sequence, layer) regions (the same run of the commit that made
   them take frames from other regions only when well below their aim: 0.03% longer than
   0a32b5c's global LRU gave; re-recorded when the regions' working sets came to be counted a
   step late, 0.00003% shorter, and when a region came to aim by its sequence's working set
   spread over the layers as all sequences' are, 0.0008% shorter, when calls stopped taking
   frames of other regions to grow, 0.002% longer, when the once-a-step trim came to
   spare regions at most a sixteenth above their aim, 0.004% longer, and when that trim gave
   way to one at each region's call and a sweep of a few regions a call, 0.005% shorter,
   and when the replay's decode items became a step whose recalls size by the working sets
   frozen at its begin, 0.0002% longer); a
   trace without hash ids gives the same with the cache on; with the cache on, the trace's ids
   make full compute fewer prefill tokens. */
void test_prefix_off_unchanged(void **state)
{
	static const struct {
		enum sim_policy pol;
		uint64_t iterations, preemptions;
		double duration_s, output_throughput, mean_ttft_ms;
	} before[] = {
		{SIM_POLICY_FULL, 1319, 1, 116.0066488, 330.7051828, 23149.86561},
		{SIM_POLICY_KVTIER, 1648, 0, 114.8953271, 333.9039191, 15578.49935},
	};
	struct sim_trace t;
	(void)state;

	read_bundled(&t, 200);
	for (size_t k = 0; k < sizeof(before) / sizeof(before[0]); k++) {
		struct sim_replay_result off, on, bare;
		struct sim_replay_summary s;
		struct sim_replay_opts o;
		struct sim_trace plain = t;

		opts(&o, before[k].pol);
		o.prefix_cache = false;
		run_ok(&o, &t, &off);

		check_accounting(&off);
		assert_int_equal(off.completed, 200);
		assert_int_equal(off.iterations, before[k].iterations);
		assert_int_equal(off.preemptions, before[k].preemptions);
		near(off.duration_s, before[k].duration_s, 1e-9, "duration");
		CHECK_RC(sim_replay_summarize(&off, &s), 0);
		near(s.output_throughput, before[k].output_throughput, 1e-9, "output throughput");
		near(s.mean_ttft_ms, before[k].mean_ttft_ms, 1e-9, "mean TTFT");
		assert_int_equal(off.prefix_hit_tokens, 0);
		/* every prompt whole, and a recomputed one again */
		assert_true(off.prefill_tokens >= off.prefix_input_tokens);

		/* full without the ids, and with them (kvtier: without ids mrun_loop never
		   turns reuse on; with them, test_prefix_deterministic) */
		if (before[k].pol == SIM_POLICY_FULL) {
			plain.hash_ids = NULL;
			plain.n_hash_ids = 0;
			plain.reqs = malloc(t.count * sizeof(*t.reqs));
			assert_non_null(plain.reqs);
			for (size_t i = 0; i < t.count; i++) {
				plain.reqs[i] = t.reqs[i];
				plain.reqs[i].n_hash = 0;
			}
			o.prefix_cache = true;
			run_ok(&o, &plain, &bare);
			same_run(&off, &bare);
			sim_replay_result_free(&bare);
			free(plain.reqs);
			/* with the ids (kvtier's: test_prefix_deterministic) */
			run_ok(&o, &t, &on);
			check_accounting(&on);
			assert_true(on.prefix_hit_tokens > 0);
			assert_int_equal(on.prefix_input_tokens, off.prefix_input_tokens);
			assert_true(on.prefill_tokens < off.prefill_tokens);
			sim_replay_result_free(&on);
		}
		sim_replay_result_free(&off);
	}
	sim_trace_free(&t);
}

/* With reuse and the measured CPU time left out, two runs of the bundled trace's first 200
   requests agree to the bit, for the baseline and for kvtier on the library. And kvtier
   shares prefixes from its DRAM cache there: fewer prefill tokens computed than without
   reuse, by the tokens its hit rate counts, and every shared token's K/V of every layer
   loaded from the host once. */
void test_prefix_deterministic(void **state)
{
	static const enum sim_policy pol[] = {SIM_POLICY_FULL, SIM_POLICY_KVTIER};
	struct sim_trace t;
	(void)state;

	read_bundled(&t, 200);
	for (size_t p = 0; p < sizeof(pol) / sizeof(pol[0]); p++) {
		struct sim_replay_result a, b, off;
		struct sim_replay_opts o;

		opts(&o, pol[p]);
		run_ok(&o, &t, &a);
		run_ok(&o, &t, &b);
		check_accounting(&a);
		assert_true(a.prefix_hit_tokens > 0);
		same_run(&a, &b);
		sim_replay_result_free(&b);
		if (pol[p] != SIM_POLICY_KVTIER) {
			sim_replay_result_free(&a);
			continue;
		}
		o.prefix_cache = false;
		run_ok(&o, &t, &off);
		check_accounting(&off);
		print_message("# kvtier, 200 requests: prefix hit rate %.4f, prefill tokens %llu "
			      "(%llu without reuse), %.2f GB loaded\n",
			      a.prefix_hit_rate, (unsigned long long)a.prefill_tokens,
			      (unsigned long long)off.prefill_tokens, 1e-9 * a.prefix_bytes_loaded);
		assert_int_equal(a.completed, off.completed);
		assert_int_equal(a.prefix_input_tokens, off.prefix_input_tokens);
		assert_int_equal(off.prefix_hit_tokens, 0);
		assert_int_equal(a.prefill_tokens + a.prefix_hit_tokens, off.prefill_tokens);
		assert_true(a.prefill_tokens < off.prefill_tokens);
		assert_true(a.prefix_bytes_loaded ==
			    (uint64_t)(a.prefix_hit_tokens * sim_model_kv_token_bytes(&o.model)));
		near(a.prefix_hit_rate, (double)a.prefix_hit_tokens / (double)a.prefix_input_tokens,
		     1e-12, "prefix hit rate");
		sim_replay_result_free(&a);
		sim_replay_result_free(&off);
	}
	sim_trace_free(&t);
}

/* The library's prefix cache under kvtier (and sparse-offload): the same prompt twice, the
   second after the first finished, shares its 8 whole spans; per layer it loads their K/V
   from the host (4,096 tokens of every layer: the bytes loaded, timed as transfer) and
   prefills 104 tokens whose queries attend to all 4,200 keys. A prompt of 4,100 tokens shares
   7 spans under kvtier: the library leaves the observation window (32 tokens) to prefill when
   the prefill selects top-K tokens, and sparse-offload selects none. snapstream shares
   nothing. */
void test_prefix_kvtier_repeat(void **state)
{
	static const uint64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
	static const enum sim_policy pol[] = {SIM_POLICY_KVTIER, SIM_POLICY_SPARSE_OFFLOAD};
	struct sim_trace t = mk_trace(2, 4200, 4, 10.0);
	(void)state;

	set_ids(&t, 0, ids, 8);
	set_ids(&t, 1, ids, 8);
	for (size_t p = 0; p < sizeof(pol) / sizeof(pol[0]); p++) {
		struct sim_replay_result on, off;
		struct sim_replay_opts o;
		const struct sim_model_preset *m;
		double a_whole, a_rest;

		opts(&o, pol[p]);
		m = &o.model;
		a_whole = sim_prefill_attn_s(&o.gpu, sim_prefill_attn_flops(m, 4200, m->n_layers),
					     4200, 4200);
		a_rest = sim_prefill_attn_s(&o.gpu,
					    sim_prefill_attn_flops(m, 4200, m->n_layers) -
						    sim_prefill_attn_flops(m, 4096, m->n_layers),
					    104, 4200);
		run_ok(&o, &t, &on);
		check_accounting(&on);
		assert_int_equal(on.completed, 2);
		assert_int_equal(on.prefix_input_tokens, 8400);
		assert_int_equal(on.prefix_hit_tokens, 4096);
		assert_int_equal(on.prefill_tokens, 4200 + 104);
		assert_true(on.prefix_bytes_loaded ==
			    (uint64_t)(4096 * sim_model_kv_token_bytes(m)));
		near(on.t_attn_prefill, a_whole + a_rest, 1e-9, "prefill attention");
		/* kvtier's fused gather loads the prefix in a fraction of its recompute;
		   sparse-offload's per-block copies (2 us each, 65,536 of them) take longer
		   than the 4,096-token prefill they save */
		if (pol[p] == SIM_POLICY_KVTIER)
			assert_true(on.reqs[1].first_token_s - on.reqs[1].arrival_s <
				    0.5 * (on.reqs[0].first_token_s - on.reqs[0].arrival_s));
		else
			assert_true(on.reqs[1].first_token_s - on.reqs[1].arrival_s >
				    on.reqs[0].first_token_s - on.reqs[0].arrival_s);

		o.prefix_cache = false;
		run_ok(&o, &t, &off);
		assert_int_equal(off.prefix_hit_tokens, 0);
		assert_int_equal(off.prefill_tokens, 8400);
		assert_int_equal(off.prefix_bytes_loaded, 0);
		near(off.t_attn_prefill, 2 * a_whole, 1e-9, "prefill attention, no cache");
		/* the load is transfer time the run without reuse does not have */
		assert_true(on.t_transfer > off.t_transfer);
		assert_true(on.t_gemm < off.t_gemm);
		sim_replay_result_free(&on);
		sim_replay_result_free(&off);

		/* 4,100 tokens: all 8 spans would leave 4 tokens to prefill */
		t.reqs[0].input_tokens = t.reqs[1].input_tokens = 4100;
		o.prefix_cache = true;
		run_ok(&o, &t, &on);
		assert_int_equal(on.prefix_hit_tokens, pol[p] == SIM_POLICY_KVTIER ? 3584 : 4096);
		sim_replay_result_free(&on);
		t.reqs[0].input_tokens = t.reqs[1].input_tokens = 4200;
	}
	{
		struct sim_replay_result res;
		struct sim_replay_opts o;

		opts(&o, SIM_POLICY_SNAPSTREAM);
		run_ok(&o, &t, &res);
		assert_int_equal(res.prefix_input_tokens, 8400);
		assert_int_equal(res.prefix_hit_tokens, 0);
		assert_int_equal(res.prefill_tokens, 8400);
		sim_replay_result_free(&res);
	}
	sim_trace_free(&t);
}

/* DRAM admission counts what a request adds beyond the prefix it shares: with room for one
   16,684-token history (2.04 GiB of 2.5), a second request on the same 32 spans, arriving
   while the first decodes, adds 300 tokens and runs beside it; without the cache it waits
   for the first to finish. */
void test_prefix_dram(void **state)
{
	struct sim_trace t = mk_trace(2, 16384 + 100, 200, 1.0);
	struct sim_replay_opts o;
	struct sim_replay_result res;
	uint64_t ids[32];
	(void)state;

	for (uint32_t k = 0; k < 32; k++)
		ids[k] = 1000 + k;
	set_ids(&t, 0, ids, 32);
	set_ids(&t, 1, ids, 32);
	opts(&o, SIM_POLICY_KVTIER);
	o.dram_gib = 2.5;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 2);
	assert_int_equal(res.prefix_hit_tokens, 16384);
	assert_true(res.reqs[1].sched_s < res.reqs[0].finish_s);
	assert_int_equal(res.max_batch_size, 2);
	sim_replay_result_free(&res);

	o.prefix_cache = false;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 2);
	assert_true(res.reqs[1].sched_s >= res.reqs[0].finish_s);
	assert_int_equal(res.max_batch_size, 1);
	sim_replay_result_free(&res);
	sim_trace_free(&t);
}

/* With a disk tier DRAM caches the histories, but spans live requests share are never
   spilled. On 2 GiB of DRAM (16,384 tokens of every layer), six different 4,096-token prompts
   run one after another (their spans cached, idle, spilled as DRAM fills), then the six come
   back together with 400 output tokens: sharing all their spans would pin 24,576 tokens'
   worth while they decode. The replay gives the library only as much of each chain as DRAM
   can keep pinned, so every request completes, and the later ones still share. */
void test_prefix_disk_pins(void **state)
{
	struct sim_trace t = mk_trace(12, 4096, 2, 5.0);
	char dir[] = "/tmp/kvt-replay-pins-XXXXXX";
	struct sim_replay_opts o;
	struct sim_replay_result res;
	(void)state;

	assert_non_null(mkdtemp(dir));
	for (size_t i = 0; i < 12; i++) {
		uint64_t ids[8];

		for (uint32_t k = 0; k < 8; k++)
			ids[k] = 100 * (i % 6) + k;
		set_ids(&t, i, ids, 8);
		if (i >= 6) {
			t.reqs[i].arrival_s = 40;
			t.reqs[i].input_tokens = 4200;
			t.reqs[i].output_tokens = 400;
		}
	}
	opts(&o, SIM_POLICY_KVTIER);
	o.dram_gib = 2;
	o.spill_dir = dir;
	run_ok(&o, &t, &res);
	check_accounting(&res);
	assert_int_equal(res.completed, 12);
	assert_true(res.prefix_hit_tokens > 0);
	assert_true(res.disk_blocks_spilled > 0);
	sim_replay_result_free(&res);
	sim_trace_free(&t);
	assert_int_equal(rmdir(dir), 0); /* the spill file is unlinked: nothing left behind */
}
