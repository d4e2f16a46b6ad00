/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench calibrate: measures this machine's GPU with the CUDA plugin's cuBLAS timings
 * (transfer/cuda_calib.c) and writes the replay simulator's GPU preset made of them
 * (sim/calib.c) as {"gpu": {...}}, which kvtier-replay and kvtier-curve read with
 * --preset-json. The table of what was measured against the datasheet roofline goes to stderr,
 * so that the JSON alone goes to stdout when there is no --out.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "bench.h"
#include "calib.h"
#include "cli.h"
#include "exec_model.h"
#include "plugin.h"

#define TOOL "kvtier-bench calibrate"
#define SKIP 77 /* the test harness's skip status */

/* The decode attention batches and contexts measured (contexts above --max-context left out). */
static const uint32_t decode_batch[] = {1, 16, 64, 256};
static const uint32_t decode_context[] = {1024, 8192};

struct copts {
	const char *model, *gpu, *name, *out;
	double tflops, hbm_gbps; /* 0: the base preset's */
	uint32_t reps, max_tokens, max_context, copy_mib;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-bench calibrate [options]\n"
		"Measures this machine's GPU for the replay simulator's execution model and\n"
		"writes a GPU preset that kvtier-replay and kvtier-curve read with --preset-json.\n"
		"Timed by CUDA events with cuBLAS (bf16, fp32 accumulation), each the median of\n"
		"--reps runs after a warm-up:\n"
		"  - one layer's linear layers (QKV, O, gate+up, down) of the model for\n"
		"    M = 1, 2, 4, ... --max-tokens tokens;\n"
		"  - decode attention, S = Q K^T and O = P V per sequence and kv head (softmax\n"
		"    not timed), for batches 1, 16, 64, 256 and contexts 1024, 8192;\n"
		"  - prefill attention, non-causal and unfused (S in device memory), for\n"
		"    prompts of 512, 1024, ... --max-context tokens;\n"
		"  - pinned copies each way, the host time of a copy call and of a kernel\n"
		"    launch, and a device-to-device copy (KV writes).\n"
		"Points that need more than half the free device memory are skipped. The\n"
		"efficiencies are the times against the base preset's datasheet roofline\n"
		"(above 1: clamped to 1); iter_overhead_us is the base's, since an engine's own\n"
		"per-iteration overhead cannot be measured here. The table of what was measured\n"
		"goes to stderr, the preset ({\"gpu\": {...}}) to --out or stdout.\n"
		"  --model NAME     the model whose layers are timed: llama3-8b (default),\n"
		"                   lwm-7b, llama3-70b; give kvtier-replay the same --model\n"
		"  --gpu BASE       datasheet peaks: h100, h200, a100-80g, a100-40g (default:\n"
		"                   the device's, by name; another device needs --gpu)\n"
		"  --tflops X       dense 16-bit peak TFLOP/s instead of the base's\n"
		"  --hbm-gbps X     HBM bandwidth GB/s instead of the base's\n"
		"  --name S         the preset's name (default calibrated, at most %d characters)\n"
		"  --out FILE       write the preset there (default: stdout)\n"
		"  --reps N         timed runs per point, the median kept (default 5, 1..1000)\n"
		"  --max-tokens N   largest M of the linear layers (default 16384, 1..%u)\n"
		"  --max-context N  largest prompt of prefill attention and context of decode\n"
		"                   attention (default 16384, 1024..%u)\n"
		"  --copy-mib N     each pinned copy, MiB (default 256, 1..16384); the\n"
		"                   device-to-device copy moves 4 times as much\n"
		"  -h, --help       this text\n"
		"Needs the CUDA backend plugin (libkvtier-cuda.so), a GPU and cuBLAS (dlopen of\n"
		"libcublas.so.13, .so.12 or .so; $KVTIER_CUBLAS names another, alone).\n"
		"Exit status: 0 on success, 1 on a CUDA or cuBLAS failure or a file that cannot\n"
		"be written, 2 on bad usage (a device without a preset and no --gpu included),\n"
		"77 without the plugin, a usable GPU or cuBLAS.\n",
		SIM_PRESET_NAME_MAX, 1u << 23, 1u << 20);
}

enum { OPTS_RUN, OPTS_HELP, OPTS_BAD };

static int parse(int argc, char **argv, struct copts *o)
{
	static const struct option lo[] = {
		{"model", required_argument, NULL, 'm'},
		{"gpu", required_argument, NULL, 'g'},
		{"tflops", required_argument, NULL, 'T'},
		{"hbm-gbps", required_argument, NULL, 'B'},
		{"name", required_argument, NULL, 'n'},
		{"out", required_argument, NULL, 'o'},
		{"reps", required_argument, NULL, 'r'},
		{"max-tokens", required_argument, NULL, 't'},
		{"max-context", required_argument, NULL, 'c'},
		{"copy-mib", required_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sim_model_preset m;
	struct sim_gpu_preset g;
	int c, bad, li = 0;

	*o = (struct copts){.model = "llama3-8b",
			    .name = "calibrated",
			    .reps = 5,
			    .max_tokens = 16384,
			    .max_context = 16384,
			    .copy_mib = 256};
	optind = 0; /* GNU: a full reset, whatever parsed argv before */
	while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		bad = 0;
		switch (c) {
		case 'm':
			o->model = optarg;
			bad = sim_preset_model(optarg, &m) != 0;
			break;
		case 'g':
			o->gpu = optarg;
			bad = sim_preset_gpu(optarg, &g) != 0;
			break;
		case 'T':
			bad = sim_parse_double(optarg, 1e-3, 1e6, &o->tflops);
			break;
		case 'B':
			bad = sim_parse_double(optarg, 1e-3, 1e6, &o->hbm_gbps);
			break;
		case 'n':
			o->name = optarg;
			bad = !*optarg || strlen(optarg) > SIM_PRESET_NAME_MAX;
			break;
		case 'o':
			o->out = optarg;
			break;
		case 'r':
			bad = sim_parse_u32(optarg, 1, 1000, &o->reps);
			break;
		case 't':
			bad = sim_parse_u32(optarg, 1, 1u << 23, &o->max_tokens);
			break;
		case 'c':
			bad = sim_parse_u32(optarg, 1024, 1u << 20, &o->max_context);
			break;
		case 'C':
			bad = sim_parse_u32(optarg, 1, 16384, &o->copy_mib);
			break;
		case 'h':
			usage(stdout);
			return OPTS_HELP;
		default: /* getopt has named the option */
			fprintf(stderr, TOOL ": bad usage (try --help)\n");
			return OPTS_BAD;
		}
		if (bad) {
			cli_bad_value(TOOL, lo[li].name, optarg);
			return OPTS_BAD;
		}
	}
	return cli_no_extra(TOOL, argc, argv) ? OPTS_BAD : OPTS_RUN;
}

/* The request of the options for model m (its MLP width in mlp_dim). */
static void make_request(const struct copts *o, const struct sim_model_preset *m, uint32_t mlp_dim,
			 struct kvt_calib_request *rq)
{
	*rq = (struct kvt_calib_request){
		.size = sizeof(*rq),
		.reps = o->reps,
		.hidden = m->n_q_heads * m->head_dim,
		.n_q_heads = m->n_q_heads,
		.n_kv_heads = m->n_kv_heads,
		.head_dim = m->head_dim,
		.mlp_dim = mlp_dim,
		.copy_bytes = (uint64_t)o->copy_mib << 20,
		.d2d_bytes = (uint64_t)o->copy_mib << 22,
	};
	for (uint32_t M = 1; M <= o->max_tokens && rq->n_tokens < KVT_CALIB_POINTS; M *= 2)
		rq->tokens[rq->n_tokens++] = M;
	for (uint32_t L = 512; L <= o->max_context && rq->n_prefill < KVT_CALIB_POINTS; L *= 2)
		rq->prefill[rq->n_prefill++] = L;
	for (size_t i = 0; i < sizeof(decode_batch) / sizeof(decode_batch[0]); i++)
		rq->batch[rq->n_batch++] = decode_batch[i];
	for (size_t i = 0; i < sizeof(decode_context) / sizeof(decode_context[0]); i++)
		if (decode_context[i] <= o->max_context)
			rq->context[rq->n_context++] = decode_context[i];
}

/* The efficiency as measured, starred when the preset holds it clamped to 1 (a point of a
   curve above 1; not one decode point, of which the preset holds a fitted line). */
static void print_eff(double e, bool in_preset)
{
	fprintf(stderr, " %8.3f%s\n", e, in_preset && e > 1 ? " *" : "");
}

/* The table of what was measured against the roofline (stderr). */
static void print_table(const struct kvt_calib_request *rq, const struct kvt_calib_result *r,
			const struct sim_model_preset *m, const struct sim_gpu_preset *g,
			const struct sim_calib_report *k)
{
	uint32_t asked_decode = rq->n_batch * rq->n_context;
	double bw = g->hbm_gbps * 1e9, peak = g->tflops * 1e12;

	fprintf(stderr, "\nlinear layers of one layer (QKV, O, gate+up, down), eff = roofline / "
			"time:\n");
	fprintf(stderr, "%8s %12s %12s %9s\n", "tokens", "time_us", "roofline_us", "eff");
	for (uint32_t i = 0; i < r->n_linear; i++) {
		fprintf(stderr, "%8.0f %12.2f %12.2f", r->linear[i].x, 1e6 * r->linear[i].seconds,
			1e6 * k->linear_roof_s[i]);
		print_eff(k->linear_eff[i], true);
	}
	fprintf(stderr,
		"\ndecode attention of one layer (S = Q K^T, O = P V per sequence and kv head; "
		"softmax not timed),\neff = roofline (K and V bytes / HBM bandwidth) / time:\n");
	fprintf(stderr, "%8s %8s %12s %12s %10s %9s\n", "batch", "context", "time_us",
		"roofline_us", "KV_MiB", "eff");
	for (uint32_t i = 0; i < r->n_decode; i++) {
		const struct kvt_calib_decode *d = &r->decode[i];

		fprintf(stderr, "%8u %8u %12.2f %12.2f %10.1f", d->batch, d->context,
			1e6 * d->seconds, 1e6 * d->kv_bytes / bw, d->kv_bytes / (1 << 20));
		print_eff(k->decode_eff[i], false);
	}
	fprintf(stderr,
		"\nprefill attention of one layer (non-causal S = Q K^T, O = P V over every query "
		"head, S in\ndevice memory), eff = roofline (its FLOPs at peak) / time, taken as "
		"that of a causal\nprefill, which does half the work in half the time:\n");
	fprintf(stderr, "%8s %12s %12s %10s %9s\n", "L", "time_us", "roofline_us", "TFLOP/s",
		"eff");
	for (uint32_t i = 0; i < r->n_prefill; i++) {
		double L = r->prefill[i].x, t = r->prefill[i].seconds;
		double flops = 4.0 * L * L * m->n_q_heads * m->head_dim;

		fprintf(stderr, "%8.0f %12.2f %12.2f %10.1f", L, 1e6 * t, 1e6 * flops / peak,
			flops / t / 1e12);
		print_eff(k->prefill_eff[i], true);
	}
	if (k->decode_fitted)
		fprintf(stderr,
			"\ndecode attention: t = a + bytes / (bandwidth * e) through the %u points: "
			"decode_attn_eff e = %.3f%s, decode_attn_layer_us a = %.1f\n",
			r->n_decode, k->decode_fit_eff, k->decode_fit_eff > 1 ? " *" : "",
			k->decode_layer_us);
	else
		fprintf(stderr,
			"\ndecode_attn_eff: no line with a floor >= 0 fits; the median of %u points, "
			"%.3f%s, no floor\n",
			r->n_decode, k->decode_median, k->decode_median > 1 ? " *" : "");
	fprintf(stderr,
		"kv_write_eff: a device-to-device copy of %.0f MiB at %.1f GB/s read + write, "
		"%.3f%s\n",
		r->d2d_bytes / (1 << 20), 2 * r->d2d_bytes / r->d2d_seconds / 1e9, k->kv_write_eff,
		k->kv_write_eff > 1 ? " *" : "");
	fprintf(stderr,
		"copies: H2D %.1f GB/s, D2H %.1f GB/s; one cudaMemcpyAsync call %.0f ns, one "
		"kernel launch %.0f ns (host time)\n",
		r->h2d_gbps, r->d2h_gbps, r->call_ns, r->launch_ns);
	fprintf(stderr,
		"iter_overhead_us: %.0f, the base preset's: an engine's own per-iteration overhead "
		"cannot be measured here\n",
		g->iter_overhead_us);
	if (k->n_clamped)
		fprintf(stderr,
			"* %u values above 1 (faster than the datasheet roofline) are 1 in the "
			"preset: check --tflops and --hbm-gbps\n",
			k->n_clamped);
	if (r->n_linear < rq->n_tokens || r->n_decode < asked_decode ||
	    r->n_prefill < rq->n_prefill)
		fprintf(stderr,
			"skipped, over the memory cap of %.1f GiB: %u linear, %u decode and %u "
			"prefill points\n",
			(double)r->mem_cap / (1 << 30), rq->n_tokens - r->n_linear,
			asked_decode - r->n_decode, rq->n_prefill - r->n_prefill);
}

/* Writes {"gpu": preset} to path (NULL: stdout). 0, or 1 (reported). */
static int write_preset(const struct sim_gpu_preset *g, const char *path)
{
	json_t *root = json_object(), *o = sim_gpu_preset_json(g);
	int rc = 1;

	if (!root || !o || json_object_set_new(root, "gpu", o)) {
		json_decref(o);
		fprintf(stderr, TOOL ": out of memory\n");
		goto out;
	}
	if (path ? json_dump_file(root, path, JSON_INDENT(2)) != 0
		 : json_dumpf(root, stdout, JSON_INDENT(2)) != 0 || fputc('\n', stdout) == EOF ||
			    fflush(stdout) != 0) {
		fprintf(stderr, TOOL ": cannot write the preset to %s\n", path ? path : "stdout");
		goto out;
	}
	rc = 0;
out:
	json_decref(root);
	return rc;
}

/* The exit status of a failed measurement: SKIP without a device or cuBLAS, else 1. */
static int calib_failed(int err, const char *why)
{
	fprintf(stderr, TOOL ": %s\n", why);
	return err == -ENODEV ? SKIP : 1;
}

int bench_calibrate(int argc, char **argv)
{
	struct kvt_calib_request rq;
	struct kvt_calib_result *r = NULL;
	struct sim_model_preset m;
	struct sim_gpu_preset base, g;
	struct sim_calib_report k;
	const struct kvt_plugin *p;
	const char *base_name;
	char err[768] = "", date[16] = "";
	time_t now = time(NULL);
	uint32_t mlp_dim = 0;
	struct copts o;
	struct tm tm;
	int rc, e = 0;

	switch (parse(argc, argv, &o)) {
	case OPTS_HELP:
		return 0;
	case OPTS_BAD:
		return 2;
	}
	if (sim_preset_model(o.model, &m) || sim_calib_mlp_dim(&m, &mlp_dim)) {
		fprintf(stderr, TOOL ": model %s has no room for an MLP in its layers\n", o.model);
		return 1;
	}
	p = kvt_plugin_load(&e);
	if (!p) {
		fprintf(stderr, TOOL ": the CUDA backend plugin is not available (%s)\n",
			kvt_plugin_error()[0] ? kvt_plugin_error() : "not built or not found");
		return SKIP;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		fprintf(stderr, TOOL ": out of memory\n");
		return 1;
	}
	/* the device first: one without a preset is refused before minutes of measuring */
	rq = (struct kvt_calib_request){.size = sizeof(rq), .flags = KVT_CALIB_DEVICE_ONLY};
	e = p->calibrate(&rq, r, err, sizeof(err));
	if (e) {
		rc = calib_failed(e, err);
		goto out;
	}
	base_name = o.gpu ? o.gpu : sim_calib_base_of(r->device);
	if (!base_name) {
		fprintf(stderr,
			TOOL
			": no datasheet preset for the device '%s': name the nearest with "
			"--gpu (h100, h200, a100-80g, a100-40g) and give its peaks with --tflops "
			"and --hbm-gbps\n",
			r->device);
		rc = 2;
		goto out;
	}
	sim_preset_gpu(base_name, &base); /* a known name: parse or sim_calib_base_of */
	if (o.tflops > 0)
		base.tflops = o.tflops;
	if (o.hbm_gbps > 0)
		base.hbm_gbps = o.hbm_gbps;
	make_request(&o, &m, mlp_dim, &rq);
	fprintf(stderr,
		TOOL
		": %s (%.1f GiB), model %s, base %s (%.0f TFLOP/s, %.0f GB/s)\n"
		"one layer: hidden %u, QKV width %u, MLP width %u (the layer holds params / "
		"n_layers = %.1f M),\nbf16 cuBLAS GEMMs with fp32 accumulation, the median of %u "
		"runs after a warm-up, timed by CUDA events\n",
		r->device, r->mem_bytes / (1 << 30), m.name, base_name, base.tflops, base.hbm_gbps,
		rq.hidden, (rq.n_q_heads + 2 * rq.n_kv_heads) * rq.head_dim, mlp_dim,
		m.params / m.n_layers / 1e6, o.reps);
	e = p->calibrate(&rq, r, err, sizeof(err));
	if (e) {
		rc = calib_failed(e, err);
		goto out;
	}
	if (gmtime_r(&now, &tm))
		strftime(date, sizeof(date), "%Y-%m-%d", &tm);
	e = sim_calib_convert(&m, &base, r, o.name, date, &g, &k, err, sizeof(err));
	if (e) {
		fprintf(stderr, TOOL ": the measurements make no preset: %s\n", err);
		rc = 1;
		goto out;
	}
	print_table(&rq, r, &m, &base, &k);
	sim_gpu_preset_line(&g, err, sizeof(err));
	fprintf(stderr, "preset %s\n", err);
	rc = write_preset(&g, o.out);
	if (!rc && o.out)
		fprintf(stderr, "written to %s (kvtier-replay --model %s --preset-json %s)\n",
			o.out, m.name, o.out);
out:
	free(r);
	return rc;
}
