/* SPDX-License-Identifier: MIT */
/*
 * exec: the simulator's execution-time model (sim/exec_model.c) against hand computations,
 * its JSON overrides, and the decode selection model (sim/selection.c): distinct in-range
 * choices, determinism, and the overlap-versus-window curve it is meant to have.
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

#include "exec_model.h"
#include "selection.h"

static void near(double got, double want, const char *what)
{
	if (!(fabs(got - want) <= 1e-12 + 1e-9 * fabs(want))) {
		print_error("%s: %.12g, expected %.12g\n", what, got, want);
		fail();
	}
}

static void test_presets(void **state)
{
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	(void)state;

	assert_int_equal(sim_preset_model("llama3-8b", &m), 0);
	assert_int_equal(m.n_layers, 32);
	assert_int_equal(m.n_kv_heads, 8);
	/* 128 KiB of KV per token (docs/design.md) */
	near(sim_model_kv_token_bytes(&m), 131072.0, "llama3-8b KV per token");
	assert_int_equal(sim_preset_model("lwm-7b", &m), 0);
	assert_int_equal(m.n_kv_heads, 32); /* Llama-2-7B: no GQA */
	near(sim_model_kv_token_bytes(&m), 524288.0, "lwm-7b KV per token");
	assert_int_equal(sim_preset_model("llama3-70b", &m), 0);
	assert_int_equal(m.n_layers, 80);
	assert_int_equal(sim_preset_gpu("a100-40g", &g), 0);
	assert_true(g.h2d_gbps < 32.0); /* PCIe Gen4 */
	assert_int_equal(sim_preset_gpu("h100", &g), 0);
	near(g.hbm_gbps, 3350.0, "h100 HBM");
	assert_int_equal(sim_preset_gpu("h200", &g), 0);
	assert_int_equal(sim_preset_gpu("tpu", &g), -ENOENT);
	assert_int_equal(sim_preset_model(NULL, &m), -ENOENT);
}

/* The bare roofline (every efficiency 1, no overhead) against hand computations. */
static void test_iter_time(void **state)
{
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	struct sim_iter_time t;
	double kvw = 131072.0 / 3350e9; /* one token's KV written, all layers */
	(void)state;

	sim_preset_model("llama3-8b", &m);
	sim_preset_gpu("h100", &g);
	sim_gpu_roofline(&g);
	/* decode batch of 256: memory-bound GEMM, 1 GB of KV read, 0.5 ms of transfers */
	struct sim_iter_work w = {
		.decode_tokens = 256, .kv_bytes_read = 1e9, .transfer_s = 5e-4, .cpu_s = 1e-5};

	sim_iter_time(&m, &g, &w, &t);
	near(t.gemm_s, 8.03e9 * 2 / 3350e9, "decode GEMM (weights / HBM)");
	assert_true(2 * 8.03e9 * 256 / 989e12 < t.gemm_s); /* compute is below it */
	near(t.attn_decode_s, 1e9 / 3350e9, "decode attention");
	near(t.attn_prefill_s, 0, "no prefill");
	near(t.kv_write_s, 256 * kvw, "KV writes");
	near(t.overhead_s, 0, "no overhead");
	near(t.total_s, 8.03e9 * 2 / 3350e9 + 1e9 / 3350e9 + 256 * kvw + 5e-4 + 1e-5, "total");

	/* prefill of 8192 tokens, all 32 layers at once: compute-bound GEMM */
	w = (struct sim_iter_work){.prefill_token_layers = 8192ull * 32};
	near(sim_prefill_attn_flops(&m, 8192, 32), 4.0 * 8192.0 * 8192.0 / 2 * 32 * 128 * 32,
	     "attn FLOPs");
	w.prefill_attn_s = sim_prefill_attn_s(&g, sim_prefill_attn_flops(&m, 8192, 32), 8192);
	sim_iter_time(&m, &g, &w, &t);
	near(t.gemm_s, 2 * 8.03e9 * 8192 / 989e12, "prefill GEMM (FLOPs / peak)");
	near(t.attn_prefill_s, 4.0 * 8192.0 * 8192.0 / 2 * 32 * 128 * 32 / 989e12,
	     "prefill attention");
	/* 4 of 32 layers of 1024 tokens spread evenly: 128 tokens a layer, below the ridge point
	   (peak / bandwidth = 295 tokens): memory-bound again */
	w = (struct sim_iter_work){.prefill_token_layers = 1024ull * 4};
	sim_iter_time(&m, &g, &w, &t);
	near(t.gemm_s, 8.03e9 * 2 / 3350e9, "128 tokens a layer: memory-bound");
	w.prefill_token_layers = 1024ull * 32; /* 1024: compute-bound */
	sim_iter_time(&m, &g, &w, &t);
	near(t.gemm_s, 2 * 8.03e9 * 1024 / 989e12, "1024 tokens a layer: compute-bound");
	/* the same 4 layers given per layer: only they run, at 1024 tokens each (compute-bound),
	   and 2 decodes pass all 32 (memory-bound on the other 28) */
	uint64_t lt[32] = {0};
	for (int l = 8; l < 12; l++)
		lt[l] = 1024;
	w = (struct sim_iter_work){.decode_tokens = 2, .prefill_layer_tokens = lt};
	sim_iter_time(&m, &g, &w, &t);
	near(t.gemm_s, 28 * (8.03e9 / 32 * 2 / 3350e9) + 4 * (2 * 8.03e9 / 32 * 1026 / 989e12),
	     "per-layer tokens");
	near(t.kv_write_s, (2 * 32 + 4 * 1024) * kvw / 32, "per-layer KV writes");
	/* an empty iteration costs nothing, overhead included */
	sim_preset_gpu("h100", &g);
	w = (struct sim_iter_work){0};
	sim_iter_time(&m, &g, &w, &t);
	near(t.total_s, 0, "empty iteration");
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_json(void **state)
{
	struct sim_model_preset m, m0;
	struct sim_gpu_preset g, g0;
	char path[64], err[256];
	(void)state;

	snprintf(path, sizeof(path), "/tmp/kvt_exec_%d.json", (int)getpid());
	sim_preset_model("llama3-8b", &m);
	sim_preset_gpu("h100", &g);
	write_file(path, "{\"model\": {\"name\": \"mine\", \"n_layers\": 40, \"params\": 9e9},\n"
			 " \"gpu\": {\"hbm_gbps\": 2000, \"h2d_gbps\": 60.5}}\n");
	assert_int_equal(sim_preset_load_json(path, &m, &g, err, sizeof(err)), 0);
	assert_string_equal(m.name, "mine");
	assert_int_equal(m.n_layers, 40);
	near(m.params, 9e9, "params");
	near(g.hbm_gbps, 2000, "hbm");
	near(g.h2d_gbps, 60.5, "h2d");
	assert_int_equal(m.n_kv_heads, 8); /* untouched */

	static const struct {
		const char *text, *want;
	} bad[] = {
		{"{\"gpu\": {\"hbm_gbps\": -1}}", "gpu.hbm_gbps"},
		{"{\"gpu\": {\"hbm_gbs\": 1}}", "unknown field"},
		{"{\"model\": {\"n_layers\": 2.5}}", "model.n_layers"},
		{"{\"model\": {\"n_q_heads\": 7}}", "multiple of n_kv_heads"},
		{"{\"cpu\": {}}", "'cpu'"},
		{"[1, 2]", "top level"},
		{"{\"gpu\": {\"tflops\": 1},\n \"model\": }", ":2:"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		m0 = m;
		g0 = g;
		write_file(path, bad[i].text);
		err[0] = 0;
		assert_int_equal(sim_preset_load_json(path, &m, &g, err, sizeof(err)), -EINVAL);
		print_message("# %s\n", err);
		assert_non_null(strstr(err, path));
		assert_non_null(strstr(err, bad[i].want));
		assert_memory_equal(&m, &m0, sizeof(m)); /* nothing changed */
		assert_memory_equal(&g, &g0, sizeof(g));
	}
	unlink(path);
}

/* The preset file `text` must be refused with -EINVAL and a message that starts with its path
   and has `want`, leaving *m and *g as they were. */
static void json_refused(const char *path, const char *text, const char *want,
			 struct sim_model_preset *m, struct sim_gpu_preset *g)
{
	struct sim_model_preset m0 = *m;
	struct sim_gpu_preset g0 = *g;
	char err[256] = "";
	int rc;

	write_file(path, text);
	rc = sim_preset_load_json(path, m, g, err, sizeof(err));
	print_message("# %s\n", err);
	if (rc != -EINVAL || strncmp(err, path, strlen(path)) || !strstr(err, want)) {
		print_error("%s: %d \"%s\", expected -EINVAL and \"%s\"\n", text, rc, err, want);
		fail();
	}
	assert_memory_equal(m, &m0, sizeof(*m));
	assert_memory_equal(g, &g0, sizeof(*g));
}

/* Loading the preset file must succeed. */
static void load_ok(const char *path, struct sim_model_preset *m, struct sim_gpu_preset *g)
{
	char err[256] = "";
	int rc = sim_preset_load_json(path, m, g, err, sizeof(err));

	if (rc) {
		print_error("sim_preset_load_json: %d: %s\n", rc, err);
		fail();
	}
}

/* A fresh preset pair and a file path of this process for the preset-file tests. */
static void json_setup(char *path, size_t len, struct sim_model_preset *m, struct sim_gpu_preset *g)
{
	snprintf(path, len, "/tmp/kvt_exec_rules_%d.json", (int)getpid());
	sim_preset_model("llama3-8b", m);
	sim_preset_gpu("h100", g);
}

/* Element sizes: 2 bytes is bf16, 4 is f32, what the replay engine gives the library; any
   other size would be timed as itself but stored as bf16. */
static void test_json_elem_bytes(void **state)
{
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	char path[64];
	(void)state;

	json_setup(path, sizeof(path), &m, &g);
	write_file(path, "{\"model\": {\"elem_bytes\": 4}}");
	load_ok(path, &m, &g);
	assert_int_equal(m.elem_bytes, 4);
	write_file(path, "{\"model\": {\"elem_bytes\": 2}}");
	load_ok(path, &m, &g);
	assert_int_equal(m.elem_bytes, 2);
	json_refused(path, "{\"model\": {\"n_layers\": 32,\n  \"elem_bytes\": 3}}",
		     ":2: field 'model.elem_bytes': must be 2 (bf16) or 4 (f32)", &m, &g);
	json_refused(path, "{\"model\": {\"elem_bytes\": 1}}", ":1: field 'model.elem_bytes'", &m,
		     &g);
	json_refused(path, "{\"model\": {\"elem_bytes\": 8}}", ":1: field 'model.elem_bytes'", &m,
		     &g);
	unlink(path);
}

/* Names of up to 31 characters are kept whole; longer ones are refused, never cut. */
static void test_json_names(void **state)
{
	static const char name31[] = "0123456789012345678901234567890";
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	char path[64], text[256];
	(void)state;

	json_setup(path, sizeof(path), &m, &g);
	snprintf(text, sizeof(text),
		 "{\"model\": {\"name\": \"%s\"},\n \"gpu\": {\"name\": \"%s\"}}", name31, name31);
	write_file(path, text);
	load_ok(path, &m, &g);
	assert_string_equal(m.name, name31);
	assert_string_equal(g.name, name31);
	snprintf(text, sizeof(text),
		 "{\"model\": {\"n_layers\": 32},\n\n \"gpu\": {\"name\": \"%sX\"}}", name31);
	json_refused(path, text, ":3: field 'gpu.name': longer than 31 characters", &m, &g);
	snprintf(text, sizeof(text), "{\"model\": {\"name\": \"%sXY\"}}", name31);
	json_refused(path, text, ":1: field 'model.name': longer than 31 characters", &m, &g);
	unlink(path);
}

/* A leading UTF-8 byte-order mark is skipped, as the trace readers skip it; one elsewhere is
   an error. */
static void test_json_bom(void **state)
{
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	char path[64];
	(void)state;

	json_setup(path, sizeof(path), &m, &g);
	write_file(path, "\xEF\xBB\xBF{\"model\": {\"n_layers\": 40}}\n");
	load_ok(path, &m, &g);
	assert_int_equal(m.n_layers, 40);
	json_refused(path, "{\"model\": {\"n_layers\": 40}}\xEF\xBB\xBF", ":1:", &m, &g);
	unlink(path);
}

/* A key twice in one object is ambiguous (jansson alone would keep the last): refused at the
   second, at any level, as in traces. */
static void test_json_duplicates(void **state)
{
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	char path[64];
	(void)state;

	json_setup(path, sizeof(path), &m, &g);
	json_refused(path, "{\"model\": {\"n_layers\": 16,\n  \"n_layers\": 40}}",
		     ":2: field 'model.n_layers': duplicate key", &m, &g);
	json_refused(path, "{\"model\": {},\n \"gpu\": {},\n \"model\": {\"n_layers\": 16}}",
		     ":3: field 'model': duplicate key", &m, &g);
	json_refused(path, "{\"gpu\": {\"name\": {\"a\": 1,\n \"a\": 2}}}",
		     ":2: field 'a': duplicate key", &m, &g);
	unlink(path);
}

/* Value errors name the line of their key. */
static void test_json_lines(void **state)
{
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	char path[64];
	(void)state;

	json_setup(path, sizeof(path), &m, &g);
	json_refused(path, "{\n \"gpu\": {\n  \"tflops\": 1,\n  \"hbm_gbps\": -1}}",
		     ":4: field 'gpu.hbm_gbps': not a positive number", &m, &g);
	json_refused(path, "{\"gpu\": {\"tflops\": 1},\n \"model\": {\"n_kv_heads\": 5}}",
		     ":2: field 'model.n_kv_heads': n_q_heads (32) is not a multiple of it", &m,
		     &g);
	json_refused(path, "{\"model\": {},\n \"cpu\": {}}", ":2: field 'cpu'", &m, &g);
	unlink(path);
}

/* A file that cannot be opened: -errno and its reason, no line. */
static void test_json_open_error(void **state)
{
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	char path[64], err[256];
	(void)state;

	json_setup(path, sizeof(path), &m, &g);
	assert_int_equal(sim_preset_load_json("/nonexistent/x.json", &m, &g, err, sizeof(err)),
			 -ENOENT);
	assert_string_equal(err, "/nonexistent/x.json: cannot open: No such file or directory");
}

static void test_selection_basics(void **state)
{
	struct sim_sel_params p = SIM_SEL_PARAMS_INIT;
	struct sim_sel_stream a, b, c;
	uint32_t oa[16], ob[16], oc[16];
	int same_c = 0;
	(void)state;

	assert_int_equal(sim_sel_check(&p), 0);
	assert_int_equal(sim_sel_stream_init(&p, 7, &a), 0);
	assert_int_equal(sim_sel_stream_init(&p, 7, &b), 0);
	assert_int_equal(sim_sel_stream_init(&p, 8, &c), 0);
	for (uint32_t t = 0; t < 500; t++) {
		uint32_t lo = 4, hi = 40 + t / 10; /* the history grows */

		sim_sel_next(&p, &a, lo, hi, oa);
		sim_sel_next(&p, &b, lo, hi, ob);
		sim_sel_next(&p, &c, lo, hi, oc);
		assert_memory_equal(oa, ob, sizeof(oa)); /* deterministic */
		same_c += !memcmp(oa, oc, sizeof(oa));
		for (int i = 0; i < 16; i++) {
			assert_true(oa[i] >= lo && oa[i] < hi);
			for (int j = 0; j < i; j++)
				assert_int_not_equal(oa[i], oa[j]);
		}
	}
	assert_true(same_c < 5); /* streams differ */
	/* fewer candidates than r: all of them, then UINT32_MAX */
	sim_sel_next(&p, &a, 10, 15, oa);
	for (int i = 0; i < 16; i++)
		assert_true(i < 5 ? oa[i] >= 10 && oa[i] < 15 : oa[i] == UINT32_MAX);
	sim_sel_next(&p, &a, 10, 10, oa);
	assert_int_equal(oa[0], UINT32_MAX);
	sim_sel_stream_fini(&a);
	sim_sel_stream_fini(&b);
	sim_sel_stream_fini(&c);

	p.r = 0;
	assert_int_equal(sim_sel_check(&p), -EINVAL);
	p = (struct sim_sel_params)SIM_SEL_PARAMS_INIT;
	p.p_keep = 1.5;
	assert_int_equal(sim_sel_check(&p), -EINVAL);
	p = (struct sim_sel_params)SIM_SEL_PARAMS_INIT;
	p.window = 65;
	assert_int_equal(sim_sel_check(&p), -EINVAL);
}

/* Overlap of a step with the union of the previous k steps: p_keep at k = 1, rising by about
   (1 - p_keep) * p_revisit until the window, then flat (SparseServe Fig. 8's shape). */
static void test_selection_overlap(void **state)
{
	enum { S = 2000, K = 24, R = 16, STREAMS = 8 };
	struct sim_sel_params p = SIM_SEL_PARAMS_INIT;
	static uint32_t h[S][R];
	double ov[K + 1] = {0};
	long cnt = 0;
	(void)state;

	for (int s = 0; s < STREAMS; s++) {
		struct sim_sel_stream st;

		assert_int_equal(sim_sel_stream_init(&p, (uint64_t)s, &st), 0);
		for (int t = 0; t < S; t++) {
			sim_sel_next(&p, &st, 4, 260, h[t]);
			if (t <= K)
				continue;
			for (int k = 1; k <= K; k++) {
				int hit = 0;

				for (int j = 0; j < R; j++) {
					int f = 0;

					for (int a = 1; a <= k && !f; a++)
						for (int b = 0; b < R && !f; b++)
							f = h[t - a][b] == h[t][j];
					hit += f;
				}
				ov[k] += hit / (double)R;
			}
			cnt++;
		}
		sim_sel_stream_fini(&st);
	}
	for (int k = 1; k <= K; k++)
		ov[k] /= (double)cnt;
	print_message("# overlap with the last k steps: k=1 %.3f, k=6 %.3f, k=12 %.3f, k=24 %.3f\n",
		      ov[1], ov[6], ov[12], ov[24]);
	assert_true(fabs(ov[1] - 0.80) < 0.03);
	assert_true(ov[12] / ov[1] > 1.06 && ov[12] / ov[1] < 1.14); /* about 10% gain */
	for (int k = 2; k <= 12; k++)
		assert_true(ov[k] > ov[k - 1]); /* rising */
	assert_true(ov[24] - ov[12] < 0.03);	/* then flat */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_presets),
		cmocka_unit_test(test_iter_time),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_json_elem_bytes),
		cmocka_unit_test(test_json_names),
		cmocka_unit_test(test_json_bom),
		cmocka_unit_test(test_json_duplicates),
		cmocka_unit_test(test_json_lines),
		cmocka_unit_test(test_json_open_error),
		cmocka_unit_test(test_selection_basics),
		cmocka_unit_test(test_selection_overlap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
