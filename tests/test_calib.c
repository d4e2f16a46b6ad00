/* SPDX-License-Identifier: MIT */
/*
 * calib: kvtier-bench calibrate's conversion of GPU measurements into an execution-model preset
 * (sim/calib.c): efficiencies of synthetic measurements against values worked out by hand,
 * clamping, the preset's JSON round trip through sim_gpu_preset_json and
 * sim_preset_load_json, measurements refused with nothing written, the MLP width and the
 * datasheet preset of a device's name.
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

#include "calib.h"
#include "exec_model.h"

static void near(double got, double want, const char *what)
{
	if (!(fabs(got - want) <= 1e-12 + 1e-9 * fabs(want))) {
		print_error("%s: %.12g, expected %.12g\n", what, got, want);
		fail();
	}
}

/* 2 layers of 4 query and 2 kv heads of 64, 1e9 parameters: p = 5e8 a layer, h = 256. */
static const struct sim_model_preset tiny = {"tiny", 2, 4, 2, 64, 1e9, 2, 4096};

/* 100 TFLOP/s and 1000 GB/s: a layer's weights take 1 ms to read, 1024 tokens 10.24 ms of
   FLOPs. */
static void base_gpu(struct sim_gpu_preset *g)
{
	assert_int_equal(sim_preset_gpu("h100", g), 0);
	snprintf(g->name, sizeof(g->name), "base");
	g->tflops = 100;
	g->hbm_gbps = 1000;
	g->iter_overhead_us = 123;
}

/*
 * Times worked out by hand for the efficiencies the comments give:
 *   linear M = 1: roofline max(5e8 * 2 / 1e12, 2 * 5e8 / 1e14) = 1e-3 s, measured 2e-3: 0.5;
 *   M = 1024: 2 * 5e8 * 1024 / 1e14 = 1.024e-2 s, measured 1.28e-2: 0.8; M = 4096: 4.096e-2 s,
 *   measured 6.4e-2: 0.64.
 *   prefill L = 1024: causal FLOPs 4 * 1024^2 / 2 * 4 * 64 = 536870912, 0.25 of 1e14 with the
 *   full (twice causal) time 2 * 536870912 / 2.5e13 = 4.294967296e-5 s; L = 2048: 2147483648,
 *   0.4 at 2 * 2147483648 / 4e13 = 1.073741824e-4 s.
 *   decode (1, 1024): K+V 2 * 1024 * 2 * 64 * 2 = 524288 bytes, (4, 1024) 2097152 bytes,
 *   (16, 1024) 8388608 bytes, each at 2 us + bytes / (0.8 of 1e12): the line e = 0.8, a = 2 us;
 *   per point bytes / (bw * t) = 0.19745, 0.45378, 0.67185.
 *   D2D: 1e9 bytes read and written in 2.5e-3 s: 8e11 of 1e12, 0.8.
 */
static void measurements(struct kvt_calib_result *r)
{
	memset(r, 0, sizeof(*r));
	snprintf(r->device, sizeof(r->device), "Test GPU 9000");
	r->mem_bytes = 16.0 * (1u << 30);
	r->n_linear = 3;
	r->linear[0] = (struct kvt_calib_point){1, 2e-3};
	r->linear[1] = (struct kvt_calib_point){1024, 1.28e-2};
	r->linear[2] = (struct kvt_calib_point){4096, 6.4e-2};
	r->n_prefill = 2;
	r->prefill[0] = (struct kvt_calib_point){1024, 4.294967296e-5};
	r->prefill[1] = (struct kvt_calib_point){2048, 1.073741824e-4};
	r->n_decode = 3;
	r->decode[0] = (struct kvt_calib_decode){1, 1024, 2e-6 + 524288 / 0.8e12, 524288};
	r->decode[1] = (struct kvt_calib_decode){4, 1024, 2e-6 + 2097152 / 0.8e12, 2097152};
	r->decode[2] = (struct kvt_calib_decode){16, 1024, 2e-6 + 8388608 / 0.8e12, 8388608};
	r->h2d_gbps = 51.5;
	r->d2h_gbps = 49.25;
	r->call_ns = 2100;
	r->launch_ns = 3300;
	r->d2d_bytes = 1e9;
	r->d2d_seconds = 2.5e-3;
}

static void test_efficiencies(void **state)
{
	struct kvt_calib_result r;
	struct sim_gpu_preset base, g;
	struct sim_calib_report k;
	char err[256] = "";
	(void)state;

	base_gpu(&base);
	measurements(&r);
	assert_int_equal(
		sim_calib_convert(&tiny, &base, &r, "mine", "2024-05-06", &g, &k, err, sizeof(err)),
		0);
	assert_int_equal(g.linear_eff.n, 3);
	near(g.linear_eff.x[1], 1024, "linear x[1]");
	near(g.linear_eff.eff[0], 0.5, "linear_eff at 1");
	near(g.linear_eff.eff[1], 0.8, "linear_eff at 1024");
	near(g.linear_eff.eff[2], 0.64, "linear_eff at 4096");
	near(k.linear_roof_s[0], 1e-3, "roofline at 1 token");
	near(k.linear_roof_s[1], 1.024e-2, "roofline at 1024 tokens");
	assert_int_equal(g.prefill_attn_eff.n, 2);
	near(g.prefill_attn_eff.x[0], 1024, "prefill x[0]");
	near(g.prefill_attn_eff.eff[0], 0.25, "prefill_attn_eff at 1024");
	near(g.prefill_attn_eff.eff[1], 0.4, "prefill_attn_eff at 2048");
	near(k.decode_eff[0], 524288 / (1e12 * (2e-6 + 524288 / 0.8e12)), "decode (1, 1024)");
	near(k.decode_eff[1], 2097152 / (1e12 * (2e-6 + 2097152 / 0.8e12)), "decode (4, 1024)");
	assert_true(k.decode_fitted);
	near(g.decode_attn_eff, 0.8, "decode_attn_eff (the line's)");
	near(g.decode_attn_layer_us, 2, "decode_attn_layer_us (the line's floor)");
	near(g.kv_write_eff, 0.8, "kv_write_eff");
	assert_int_equal(k.n_clamped, 0);
	/* peaks and overhead from the base, the rest as measured */
	near(g.tflops, 100, "tflops");
	near(g.hbm_gbps, 1000, "hbm_gbps");
	near(g.iter_overhead_us, 123, "iter_overhead_us");
	near(g.hbm_gib, 16, "hbm_gib");
	near(g.h2d_gbps, 51.5, "h2d_gbps");
	near(g.d2h_gbps, 49.25, "d2h_gbps");
	near(g.call_ns, 2100, "call_ns");
	near(g.launch_ns, 3300, "launch_ns");
	assert_string_equal(g.name, "mine");
	assert_string_equal(g.source, "kvtier-bench calibrate on Test GPU 9000, 2024-05-06");
	assert_null(sim_eff_check(&g.linear_eff));
	assert_null(sim_eff_check(&g.prefill_attn_eff));

	/* two points make the same line */
	r.n_decode = 2;
	assert_int_equal(sim_calib_convert(&tiny, &base, &r, "mine", "2024-05-06", &g, NULL, err,
					   sizeof(err)),
			 0);
	near(g.decode_attn_eff, 0.8, "decode_attn_eff of two points");
	near(g.decode_attn_layer_us, 2, "decode_attn_layer_us of two points");
	/* a line with a negative floor (0.9 of bandwidth at the small point, 0.5 at the large):
	   the median of the points, (0.9 + 0.5) / 2, and no floor */
	r.decode[0].seconds = 524288 / 0.9e12;
	r.decode[1].seconds = 2097152 / 0.5e12;
	assert_int_equal(
		sim_calib_convert(&tiny, &base, &r, "mine", "2024-05-06", &g, &k, err, sizeof(err)),
		0);
	assert_false(k.decode_fitted);
	near(g.decode_attn_eff, 0.7, "decode_attn_eff of 0.9 and 0.5");
	near(g.decode_attn_layer_us, 0, "no floor");
	/* one point: its own fraction */
	r.n_decode = 1;
	assert_int_equal(sim_calib_convert(&tiny, &base, &r, "mine", "2024-05-06", &g, NULL, err,
					   sizeof(err)),
			 0);
	near(g.decode_attn_eff, 0.9, "decode_attn_eff of one point");
}

/* Faster than the roofline: held as 1, counted, and reported as measured. */
static void test_clamp(void **state)
{
	struct kvt_calib_result r;
	struct sim_gpu_preset base, g;
	struct sim_calib_report k;
	char err[256] = "";
	(void)state;

	base_gpu(&base);
	measurements(&r);
	r.linear[0].seconds = 5e-4; /* half the 1 ms roofline: 2 */
	r.prefill[1].seconds /= 4;  /* 1.6 */
	r.d2d_seconds = 1.25e-3;    /* 1.6 */
	for (int i = 0; i < 3; i++) /* a line of 1 us + bytes / (2 x bandwidth): e = 2 */
		r.decode[i].seconds = 1e-6 + r.decode[i].kv_bytes / 2e12;
	assert_int_equal(
		sim_calib_convert(&tiny, &base, &r, "mine", "2024-05-06", &g, &k, err, sizeof(err)),
		0);
	near(g.linear_eff.eff[0], 1, "linear_eff at 1, clamped");
	near(k.linear_eff[0], 2, "linear_eff at 1 as measured");
	near(g.linear_eff.eff[1], 0.8, "linear_eff at 1024, untouched");
	near(g.prefill_attn_eff.eff[1], 1, "prefill_attn_eff at 2048, clamped");
	near(k.prefill_eff[1], 1.6, "prefill_attn_eff at 2048 as measured");
	near(g.kv_write_eff, 1, "kv_write_eff, clamped");
	near(k.kv_write_eff, 1.6, "kv_write_eff as measured");
	near(k.decode_fit_eff, 2, "decode's e as fitted");
	near(g.decode_attn_eff, 1, "decode_attn_eff, clamped");
	near(g.decode_attn_layer_us, 1, "decode_attn_layer_us");
	assert_int_equal(k.n_clamped, 4);
	assert_null(sim_eff_check(&g.linear_eff));
	assert_null(sim_eff_check(&g.prefill_attn_eff));

	/* the median, when no line fits, is clamped too */
	r.decode[0].seconds = 524288 / 3e12;
	r.decode[1].seconds = 2097152 / 1.5e12;
	r.decode[2].seconds = 8388608 / 1.2e12;
	assert_int_equal(
		sim_calib_convert(&tiny, &base, &r, "mine", "2024-05-06", &g, &k, err, sizeof(err)),
		0);
	assert_false(k.decode_fitted);
	near(g.decode_attn_eff, 1, "decode_attn_eff, the median clamped");
	assert_true(k.decode_median > 1);
	assert_int_equal(k.n_clamped, 4);
}

static void same_curve(const struct sim_eff_curve *a, const struct sim_eff_curve *b,
		       const char *what)
{
	assert_int_equal(a->n, b->n);
	for (uint32_t i = 0; i < a->n; i++) {
		near(a->x[i], b->x[i], what);
		near(a->eff[i], b->eff[i], what);
	}
}

/* What the tool writes, {"gpu": sim_gpu_preset_json(...)}, is read back whole. */
static void test_json_round_trip(void **state)
{
	struct kvt_calib_result r;
	struct sim_gpu_preset base, g, back;
	struct sim_model_preset m = tiny;
	char err[256] = "", path[64];
	json_t *root;
	(void)state;

	base_gpu(&base);
	measurements(&r);
	/* a long device name is cut to fit the source the reader takes */
	memset(r.device, 'X', sizeof(r.device) - 1);
	r.device[sizeof(r.device) - 1] = '\0';
	r.linear[0].seconds = 5e-4; /* a clamped value too */
	assert_int_equal(sim_calib_convert(&tiny, &base, &r, "calibrated", "2024-05-06", &g, NULL,
					   err, sizeof(err)),
			 0);
	assert_true(strlen(g.source) <= SIM_PRESET_SOURCE_MAX);
	assert_non_null(strstr(g.source, ", 2024-05-06"));
	root = json_pack("{s:o}", "gpu", sim_gpu_preset_json(&g));
	assert_non_null(root);
	snprintf(path, sizeof(path), "/tmp/kvt_calib_%d.json", (int)getpid());
	assert_int_equal(json_dump_file(root, path, JSON_INDENT(2)), 0);
	json_decref(root);

	assert_int_equal(sim_preset_gpu("a100-40g", &back), 0);
	if (sim_preset_load_json(path, &m, &back, err, sizeof(err))) {
		print_error("sim_preset_load_json: %s\n", err);
		fail();
	}
	unlink(path);
	assert_string_equal(back.name, g.name);
	assert_string_equal(back.source, g.source);
	near(back.hbm_gib, g.hbm_gib, "hbm_gib");
	near(back.hbm_gbps, g.hbm_gbps, "hbm_gbps");
	near(back.tflops, g.tflops, "tflops");
	near(back.h2d_gbps, g.h2d_gbps, "h2d_gbps");
	near(back.d2h_gbps, g.d2h_gbps, "d2h_gbps");
	near(back.call_ns, g.call_ns, "call_ns");
	near(back.launch_ns, g.launch_ns, "launch_ns");
	same_curve(&back.linear_eff, &g.linear_eff, "linear_eff");
	same_curve(&back.prefill_attn_eff, &g.prefill_attn_eff, "prefill_attn_eff");
	near(back.decode_attn_eff, g.decode_attn_eff, "decode_attn_eff");
	near(back.kv_write_eff, g.kv_write_eff, "kv_write_eff");
	near(back.iter_overhead_us, g.iter_overhead_us, "iter_overhead_us");
	assert_string_equal(m.name, "tiny"); /* no "model" object: the model untouched */
}

/* One way to spoil the measurements or the arguments. */
struct spoil {
	const char *what;
	void (*apply)(struct kvt_calib_result *r, struct sim_gpu_preset *base, const char **name);
};

static void linear_zero(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->linear[1].seconds = 0;
}

static void linear_negative(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->linear[2].seconds = -1e-3;
}

static void linear_nan(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->linear[0].seconds = NAN;
}

static void linear_unsorted(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->linear[2].x = 1024;
}

static void linear_none(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->n_linear = 0;
}

static void prefill_inf(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->prefill[1].seconds = INFINITY;
}

static void prefill_too_many(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->n_prefill = KVT_CALIB_POINTS + 1;
}

static void decode_zero(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->decode[2].seconds = 0;
}

static void decode_bytes_nan(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->decode[0].kv_bytes = NAN;
}

static void decode_none(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->n_decode = 0;
}

static void h2d_zero(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->h2d_gbps = 0;
}

static void call_nan(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->call_ns = NAN;
}

static void launch_negative(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->launch_ns = -5;
}

/* Positive figures the preset reader would refuse: a copy call of two seconds, and a linear
   point at a millionth of its roofline. */
static void call_over_a_second(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->call_ns = 2e9;
}

static void linear_hopeless(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->linear[0].seconds = 1e3;
}

static void d2d_zero(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->d2d_seconds = 0;
}

static void memory_zero(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)b, (void)n;
	r->mem_bytes = 0;
}

static void base_no_peak(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)r, (void)n;
	b->tflops = 0;
}

static void name_empty(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)r, (void)b;
	*n = "";
}

static void name_long(struct kvt_calib_result *r, struct sim_gpu_preset *b, const char **n)
{
	(void)r, (void)b;
	*n = "a-preset-name-of-32-characters-x";
}

/* Refused with -EINVAL and a message, and nothing written to the preset or the report. */
static void test_bad_measurements(void **state)
{
	static const struct spoil spoils[] = {
		{"linear time 0", linear_zero},
		{"linear time negative", linear_negative},
		{"linear time NaN", linear_nan},
		{"linear sizes not ascending", linear_unsorted},
		{"no linear point", linear_none},
		{"prefill time infinite", prefill_inf},
		{"too many prefill points", prefill_too_many},
		{"decode time 0", decode_zero},
		{"decode bytes NaN", decode_bytes_nan},
		{"no decode point", decode_none},
		{"H2D rate 0", h2d_zero},
		{"call time NaN", call_nan},
		{"launch time negative", launch_negative},
		{"call of over a second", call_over_a_second},
		{"linear point under 0.0001 of its roofline", linear_hopeless},
		{"D2D time 0", d2d_zero},
		{"memory 0", memory_zero},
		{"base without a peak", base_no_peak},
		{"empty name", name_empty},
		{"name too long", name_long},
	};
	(void)state;

	for (size_t i = 0; i < sizeof(spoils) / sizeof(spoils[0]); i++) {
		struct kvt_calib_result r;
		struct sim_gpu_preset base, g, g0;
		struct sim_calib_report k, k0;
		const char *name = "mine";
		char err[256] = "";
		int rc;

		base_gpu(&base);
		measurements(&r);
		spoils[i].apply(&r, &base, &name);
		memset(&g, 0xa5, sizeof(g));
		memset(&k, 0x5a, sizeof(k));
		memcpy(&g0, &g, sizeof(g));
		memcpy(&k0, &k, sizeof(k));
		rc = sim_calib_convert(&tiny, &base, &r, name, "2024-05-06", &g, &k, err,
				       sizeof(err));
		if (rc != -EINVAL || !err[0] || memcmp(&g, &g0, sizeof(g)) ||
		    memcmp(&k, &k0, sizeof(k))) {
			print_error("%s: rc %d (want %d), message '%s', preset %s, report %s\n",
				    spoils[i].what, rc, -EINVAL, err,
				    memcmp(&g, &g0, sizeof(g)) ? "written" : "untouched",
				    memcmp(&k, &k0, sizeof(k)) ? "written" : "untouched");
			fail();
		}
	}
}

static void test_mlp_dim(void **state)
{
	struct sim_model_preset m;
	uint32_t I = 0;
	(void)state;

	/* (8.03e9 / 32 - 4096 * 48 * 128 - 4096^2) / (3 * 4096) = 17007.7: 133 * 128 */
	assert_int_equal(sim_preset_model("llama3-8b", &m), 0);
	assert_int_equal(sim_calib_mlp_dim(&m, &I), 0);
	assert_int_equal(I, 17024);
	/* (70.6e9 / 80 - 8192 * 80 * 128 - 8192^2) / (3 * 8192) = 29765.3: 233 * 128 */
	assert_int_equal(sim_preset_model("llama3-70b", &m), 0);
	assert_int_equal(sim_calib_mlp_dim(&m, &I), 0);
	assert_int_equal(I, 29824);
	/* (5e8 - 256 * 8 * 64 - 256^2) / 768 = 650785.7: 5084 * 128 */
	assert_int_equal(sim_calib_mlp_dim(&tiny, &I), 0);
	assert_int_equal(I, 650752);
	/* attention alone outweighs 1e5 parameters a layer: no MLP, I untouched */
	m = tiny;
	m.params = 2e5;
	assert_int_equal(sim_calib_mlp_dim(&m, &I), -EINVAL);
	assert_int_equal(I, 650752);
}

static void test_base_of(void **state)
{
	static const struct {
		const char *device, *base;
	} cases[] = {
		{"NVIDIA H100 80GB HBM3", "h100"},
		{"NVIDIA H200", "h200"},
		{"NVIDIA A100-SXM4-80GB", "a100-80g"},
		{"NVIDIA A100-SXM4-40GB", "a100-40g"},
		{"NVIDIA A100-PCIE-40GB", "a100-40g"},
		{"NVIDIA A100 80GB PCIe", NULL}, /* 1935 GB/s, not the SXM's 2039 */
		{"NVIDIA H100 PCIe", NULL},
		{"NVIDIA H100 NVL", NULL},
		{"NVIDIA GH200 480GB", NULL},
		{"NVIDIA L40S", NULL},
		{"CPU emulation (tests/cuda_emu)", NULL},
		{"", NULL},
	};
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *got = sim_calib_base_of(cases[i].device);

		if (got != cases[i].base &&
		    (!got || !cases[i].base || strcmp(got, cases[i].base) != 0)) {
			print_error("'%s': %s, expected %s\n", cases[i].device, got ? got : "none",
				    cases[i].base ? cases[i].base : "none");
			fail();
		}
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_efficiencies),	cmocka_unit_test(test_clamp),
		cmocka_unit_test(test_json_round_trip), cmocka_unit_test(test_bad_measurements),
		cmocka_unit_test(test_mlp_dim),		cmocka_unit_test(test_base_of),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
