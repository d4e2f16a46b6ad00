/* SPDX-License-Identifier: MIT */
/*
 * kvtier-replay: replays a request trace through kvtier (or a baseline policy) on simulated
 * time and prints a vLLM-style summary; optionally writes JSON (keys a superset of
 * `vllm bench serve`'s) and per-request / per-iteration CSV. See usage() and replay.h.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "replay.h"
#include "report.h"

#define TOOL "kvtier-replay"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " TOOL " [options] TRACE\n"
		"\n"
		"Replays the requests of TRACE through a simulated deployment: kvtier's manager,\n"
		"policy and scheduler run for real on the model backend (no KV bytes), GPU work is\n"
		"timed by an execution model (a roofline at the efficiencies profiled kernels\n"
		"reach), transfers by the backend's bandwidth and per-call model. Prints a\n"
		"vLLM-style summary.\n"
		"\n"
		"trace:\n"
		"  --format F            auto (default), mooncake, azure, burstgpt, vidur\n"
		"  --skip-bad-lines      skip malformed lines (counted) instead of stopping\n"
		"  --repeat N            tile the trace N times in time (1..10000): copy c arrives\n"
		"                        c x (its span + its mean gap) later, with hash ids of its\n"
		"                        own (copies share no prefix); default 1\n"
		"  --num-prompts N       replay only the first N requests (of the tiled trace)\n"
		"  --rate R              re-time arrivals: R requests/s (inf: all at 0); default:\n"
		"                        the trace's own times\n"
		"  --burstiness B        gamma shape of the gaps with --rate (1 = Poisson, default)\n"
		"  --seed N              seed of the re-timing and the selection model (default 1)\n"
		"  --concurrency N       closed loop: N requests in the system, arrivals ignored\n"
		"deployment:\n"
		"  --policy P            kvtier (default), snapstream, sparse-offload, full\n"
		"  --model M             llama3-8b (default), lwm-7b, llama3-70b\n"
		"  --gpu G               h100 (default), h200, a100-80g, a100-40g\n"
		"  --preset-json FILE    override model/GPU fields: {\"model\": {...}, \"gpu\": {...}}\n"
		"                        (kvtier-bench calibrate writes one for a GPU at hand)\n"
		"  --roofline            time GPU work at the datasheet peaks (efficiency 1, no\n"
		"                        per-iteration overhead): an upper bound\n"
		"  --hbm-gib X           HBM for KV (default: the GPU's memory less the weights)\n"
		"  --dram-gib X          host tier (default 256)\n"
		"  --spill-dir DIR       disk tier in DIR (kvtier, sparse-offload): host blocks\n"
		"                        spill there when DRAM is full, so DRAM no longer limits\n"
		"                        admission (the model backend times the I/O, writes none)\n"
		"  --disk-gib X          most the disk tier holds (default 0: no limit)\n"
		"  --disk-gbps X         the modelled disk's bandwidth in GB/s (default 6, one\n"
		"                        NVMe drive)\n"
		"  --max-batch N         R_max, requests per iteration (default 256)\n"
		"  --max-batch-tokens N  T_max, tokens per iteration (default 8192)\n"
		"cache and recall:\n"
		"  --block-tokens N      8..64, power of two (default 32)\n"
		"  --sink N --topk N --recent N   compressed cache (default 128, 1024, 512)\n"
		"  --recall R            blocks recalled per layer and kv head per step (default 8;\n"
		"                        0: none)\n"
		"  --recall-cache-frac F share of the HBM budget for the recall cache, in (0, 0.99]\n"
		"                        (default 0.1)\n"
		"  --ws-window W         working-set window in steps (default 12)\n"
		"  --recall-layers N     simulate recall on N evenly spaced layers standing for\n"
		"                        all (loads and times scaled; default 8, 0: every layer)\n"
		"  --recall-threads N    threads sharing each recall call (0..64; 0, the default:\n"
		"                        2 with --no-cpu-time and a second CPU, else 1; the same\n"
		"                        results with any)\n"
		"  --sel-keep P --sel-revisit P --sel-window W   selection model (0.80, 0.45, 12)\n"
		"  --selections FILE     recorded selections for the requests they name, instead\n"
		"                        of the selection model (format: sim/selfile.h)\n"
		"ablations:\n"
		"  --no-ws-control       admit by R_max/T_max and resident sets only\n"
		"  --no-fused-transfer   recall by per-block copies instead of one fused gather\n"
		"  --chunked-prefill B   B prompt tokens (all layers) per iteration instead of\n"
		"                        layer-segmented prefill\n"
		"  --no-cpu-time         leave the measured manager/scheduler CPU time out of the\n"
		"                        iteration time (deterministic results)\n"
		"  --no-prefix-cache     no prefix reuse: every prompt is prefilled whole (by\n"
		"                        default requests share the cached spans of a trace's\n"
		"                        hash_ids: vLLM's APC in HBM for full, the library's\n"
		"                        prefix cache in DRAM for kvtier and sparse-offload)\n"
		"output:\n"
		"  --json PATH           results as JSON\n"
		"  --requests-csv PATH   one row per request\n"
		"  --iterations-csv PATH one row per iteration\n"
		"  --quiet               no progress bar (it is drawn only when stderr is a tty)\n"
		"  --help\n"
		"\n"
		"Every request read ends completed or failed (with a reason): completed + failed =\n"
		"requests read. Exit status: 0, 1 on an error of the run, 2 on bad usage or input.\n");
}

struct opts {
	struct sim_replay_opts r;
	const char *trace, *json, *req_csv, *iter_csv, *preset_json, *selfile;
	enum sim_trace_format format;
	bool skip_bad, quiet;
	uint32_t num_prompts, repeat;
	double rate, burstiness;
	uint64_t seed;
};

enum {
	O_FORMAT = 256,
	O_SKIP,
	O_NUM,
	O_REPEAT,
	O_RATE,
	O_BURST,
	O_SEED,
	O_POLICY,
	O_MODEL,
	O_GPU,
	O_PRESET,
	O_SELFILE,
	O_ENGINE, /* the engine's options: sim_replay_opt by name */
	O_JSON,
	O_REQCSV,
	O_ITERCSV,
	O_QUIET,
	O_HELP,
};

static int parse_opt(int c, const char *a, const char *name, struct opts *o)
{
	struct sim_replay_opts *r = &o->r;
	char want[96];
	uint32_t u = 0;
	int bad = 0;

	switch (c) {
	case O_FORMAT:
		bad = sim_trace_format_parse(a, &o->format);
		break;
	case O_NUM:
		bad = sim_parse_u32(a, 1, UINT32_MAX, &o->num_prompts);
		break;
	case O_REPEAT:
		if (sim_parse_u32(a, 1, SIM_TRACE_REPEAT_MAX, &o->repeat)) {
			fprintf(stderr,
				"%s: bad value for --repeat: '%s' (want an integer in [1, %u])\n",
				TOOL, a, SIM_TRACE_REPEAT_MAX);
			return -1;
		}
		break;
	case O_RATE:
		bad = sim_parse_double(a, 0, INFINITY, &o->rate) || o->rate == 0;
		break;
	case O_BURST:
		bad = sim_parse_double(a, 1e-3, 1e3, &o->burstiness);
		break;
	case O_SEED:
		bad = sim_parse_u32(a, 0, UINT32_MAX, &u);
		o->seed = r->sel.seed = u;
		break;
	case O_POLICY:
		bad = sim_policy_parse(a, &r->policy);
		break;
	case O_MODEL:
		bad = sim_preset_model(a, &r->model);
		break;
	case O_GPU:
		bad = sim_preset_gpu(a, &r->gpu);
		break;
	case O_ENGINE:
		bad = sim_replay_opt(name, a, r);
		if (bad && !sim_replay_opt_want(name, want, sizeof(want))) {
			fprintf(stderr, TOOL ": bad value for --%s: '%s' (want %s)\n", name,
				a ? a : "", want);
			return -1;
		}
		break;
	default:
		break;
	}
	return bad ? cli_bad_value(TOOL, name, a ? a : "") : 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"format", required_argument, 0, O_FORMAT},
		{"skip-bad-lines", no_argument, 0, O_SKIP},
		{"num-prompts", required_argument, 0, O_NUM},
		{"repeat", required_argument, 0, O_REPEAT},
		{"rate", required_argument, 0, O_RATE},
		{"burstiness", required_argument, 0, O_BURST},
		{"seed", required_argument, 0, O_SEED},
		{"concurrency", required_argument, 0, O_ENGINE},
		{"policy", required_argument, 0, O_POLICY},
		{"model", required_argument, 0, O_MODEL},
		{"gpu", required_argument, 0, O_GPU},
		{"preset-json", required_argument, 0, O_PRESET},
		{"hbm-gib", required_argument, 0, O_ENGINE},
		{"dram-gib", required_argument, 0, O_ENGINE},
		{"spill-dir", required_argument, 0, O_ENGINE},
		{"disk-gib", required_argument, 0, O_ENGINE},
		{"disk-gbps", required_argument, 0, O_ENGINE},
		{"max-batch", required_argument, 0, O_ENGINE},
		{"max-batch-tokens", required_argument, 0, O_ENGINE},
		{"block-tokens", required_argument, 0, O_ENGINE},
		{"sink", required_argument, 0, O_ENGINE},
		{"topk", required_argument, 0, O_ENGINE},
		{"recent", required_argument, 0, O_ENGINE},
		{"recall", required_argument, 0, O_ENGINE},
		{"recall-cache-frac", required_argument, 0, O_ENGINE},
		{"ws-window", required_argument, 0, O_ENGINE},
		{"recall-threads", required_argument, 0, O_ENGINE},
		{"recall-layers", required_argument, 0, O_ENGINE},
		{"selections", required_argument, 0, O_SELFILE},
		{"sel-keep", required_argument, 0, O_ENGINE},
		{"sel-revisit", required_argument, 0, O_ENGINE},
		{"sel-window", required_argument, 0, O_ENGINE},
		{"no-ws-control", no_argument, 0, O_ENGINE},
		{"no-fused-transfer", no_argument, 0, O_ENGINE},
		{"chunked-prefill", required_argument, 0, O_ENGINE},
		{"no-cpu-time", no_argument, 0, O_ENGINE},
		{"no-prefix-cache", no_argument, 0, O_ENGINE},
		{"roofline", no_argument, 0, O_ENGINE},
		{"json", required_argument, 0, O_JSON},
		{"requests-csv", required_argument, 0, O_REQCSV},
		{"iterations-csv", required_argument, 0, O_ITERCSV},
		{"quiet", no_argument, 0, O_QUIET},
		{"help", no_argument, 0, O_HELP},
		{0, 0, 0, 0},
	};
	int c, idx;

	sim_replay_opts_init(&o->r);
	o->burstiness = 1.0;
	o->seed = 1;
	o->repeat = 1;
	while ((c = getopt_long(argc, argv, "", lo, &idx)) != -1) {
		const char *name = c >= O_FORMAT ? lo[idx].name : "?";

		switch (c) {
		case O_SKIP:
			o->skip_bad = true;
			break;
		case O_PRESET:
			o->preset_json = optarg;
			break;
		case O_SELFILE:
			o->selfile = optarg;
			break;
		case O_JSON:
			o->json = optarg;
			break;
		case O_REQCSV:
			o->req_csv = optarg;
			break;
		case O_ITERCSV:
			o->iter_csv = optarg;
			break;
		case O_QUIET:
			o->quiet = true;
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		case '?':
			return -1;
		default:
			if (parse_opt(c, optarg, name, o))
				return -1;
		}
	}
	if (optind + 1 != argc) {
		fprintf(stderr, TOOL ": %s (see --help)\n",
			optind >= argc ? "no trace file given" : "more than one trace file given");
		return -1;
	}
	o->trace = argv[optind];
	return 0;
}

static void draw_progress(void *user, size_t done, size_t total, double sim_s)
{
	int width = 30, fill = total ? (int)((double)done / (double)total * width) : 0;

	(void)user;
	fprintf(stderr, "\r[%.*s%*s] %3.0f%%  %zu/%zu requests  %.0f s simulated ", fill,
		"##############################", width - fill, "",
		total ? 100.0 * (double)done / (double)total : 0.0, done, total, sim_s);
	fflush(stderr);
}

/* Failures by reason (the engine's reasons are static strings). */
struct reasons {
	const char *why[16];
	size_t n[16], k;
};

static void count_reasons(const struct sim_replay_result *res, struct reasons *rs)
{
	memset(rs, 0, sizeof(*rs));
	for (size_t i = 0; i < res->n_reqs; i++) {
		const char *w = res->reqs[i].reason;
		size_t j = 0;

		if (res->reqs[i].status != SIM_REQ_FAILED)
			continue;
		while (j < rs->k && rs->why[j] != w)
			j++;
		if (j == rs->k && rs->k < 16)
			rs->why[rs->k++] = w;
		if (j < rs->k)
			rs->n[j]++;
	}
}

static void line(const char *k, double v, int prec)
{
	printf("%-40s %-10.*f\n", k, prec, v);
}

static void section(const char *title)
{
	int pad = 50 - (int)strlen(title) - 2, l = pad / 2, r = pad - l;

	printf("%.*s %s %.*s\n", l, "--------------------------------------------------", title, r,
	       "--------------------------------------------------");
}

static void print_summary(const struct opts *o, const struct sim_trace *t,
			  const struct sim_trace_stats *ts, const struct sim_replay_result *res,
			  const struct sim_replay_summary *s, const struct reasons *rs)
{
	printf("============ Serving Benchmark Result ============\n");
	printf("%-40s %-10zu\n", "Successful requests:", res->completed);
	printf("%-40s %-10zu\n", "Failed requests:", res->failed);
	line("Benchmark duration (s):", res->duration_s, 2);
	printf("%-40s %-10llu\n",
	       "Total input tokens:", (unsigned long long)res->total_input_tokens);
	printf("%-40s %-10llu\n",
	       "Total generated tokens:", (unsigned long long)res->total_output_tokens);
	line("Request throughput (req/s):", s->request_throughput, 2);
	line("Output token throughput (tok/s):", s->output_throughput, 2);
	line("Total Token throughput (tok/s):", s->total_token_throughput, 2);
	section("Time to First Token");
	line("Mean TTFT (ms):", s->mean_ttft_ms, 2);
	line("Median TTFT (ms):", s->median_ttft_ms, 2);
	line("P99 TTFT (ms):", s->p99_ttft_ms, 2);
	section("Time per Output Token (excl. 1st token)");
	line("Mean TPOT (ms):", s->mean_tpot_ms, 2);
	line("Median TPOT (ms):", s->median_tpot_ms, 2);
	line("P99 TPOT (ms):", s->p99_tpot_ms, 2);
	section("Inter-token Latency");
	line("Mean ITL (ms):", s->mean_itl_ms, 2);
	line("Median ITL (ms):", s->median_itl_ms, 2);
	line("P99 ITL (ms):", s->p99_itl_ms, 2);
	section("End-to-end Latency");
	line("Mean E2EL (ms):", s->mean_e2el_ms, 2);
	line("Median E2EL (ms):", s->median_e2el_ms, 2);
	line("P99 E2EL (ms):", s->p99_e2el_ms, 2);
	section("kvtier");
	printf("%-40s %s / %s / %s\n", "Policy / model / GPU:", res->policy, res->model, res->gpu);
	{
		struct sim_gpu_preset g;
		char line[400];

		sim_replay_gpu(&o->r, &g);
		sim_gpu_preset_line(&g, line, sizeof(line));
		printf("%-40s %s\n", "Execution model:", line);
	}
	if (o->repeat > 1)
		printf("%-40s %s (%s, %u copies), %zu requests over %.1f s\n", "Trace:", o->trace,
		       sim_trace_format_name(t->format), o->repeat, ts->count, ts->duration_s);
	else
		printf("%-40s %s (%s), %zu requests over %.1f s\n", "Trace:", o->trace,
		       sim_trace_format_name(t->format), ts->count, ts->duration_s);
	printf("%-40s mean %.0f, p50 %.0f, p99 %.0f, max %u\n", "Input tokens:", ts->input_mean,
	       ts->input_p50, ts->input_p99, ts->input_max);
	printf("%-40s mean %.0f, p50 %.0f, p99 %.0f, max %u\n", "Output tokens:", ts->output_mean,
	       ts->output_p50, ts->output_p99, ts->output_max);
	if (t->hash_ids)
		printf("%-40s %.4f of the input tokens\n", "Prefix seen before (unbounded cache):",
		       ts->total_input_tokens
			       ? (double)ts->prefix_seen_tokens / (double)ts->total_input_tokens
			       : 0.0);
	if (t->skipped)
		printf("%-40s %zu\n", "Malformed lines skipped:", t->skipped);
	if (t->over_context)
		printf("%-40s %zu\n", "Beyond the model's context:", t->over_context);
	for (size_t j = 0; j < rs->k; j++)
		printf("  failed: %-31s %zu\n", rs->why[j], rs->n[j]);
	line("Mean scheduling delay (ms):", s->mean_scheduling_delay_ms, 2);
	printf("%-40s %llu\n", "Iterations:", (unsigned long long)res->iterations);
	printf("%-40s %.2f (max %u)\n", "Mean batch size:", res->mean_batch_size,
	       res->max_batch_size);
	line("Blocks loaded per iteration:", res->blocks_loaded_per_iteration, 1);
	line("Recall hit rate:", res->recall_hit_rate, 4);
	printf("%-40s %.4f (%llu of %llu input tokens shared%s)\n",
	       "Prefix hit rate:", res->prefix_hit_rate, (unsigned long long)res->prefix_hit_tokens,
	       (unsigned long long)res->prefix_input_tokens,
	       !o->r.prefix_cache		      ? "; --no-prefix-cache"
	       : !t->hash_ids			      ? "; the trace has no hash_ids"
	       : o->r.policy == SIM_POLICY_SNAPSTREAM ? "; snapstream keeps no prefix"
						      : "");
	printf("%-40s %llu\n", "Prefill tokens computed:", (unsigned long long)res->prefill_tokens);
	printf("%-40s %.3f GB\n", "Prefix bytes loaded (H2D):", 1e-9 * res->prefix_bytes_loaded);
	printf("%-40s %llu\n", "Preemptions:", (unsigned long long)res->preemptions);
	if (res->disk_blocks_spilled || res->disk_blocks_fetched)
		printf("%-40s %llu spilled, %llu fetched, %.1f s of I/O\n",
		       "Disk tier (blocks):", (unsigned long long)res->disk_blocks_spilled,
		       (unsigned long long)res->disk_blocks_fetched, res->t_disk);
	printf("%-40s linear %.1f, attention %.1f + %.1f, KV write %.1f, overhead %.1f, "
	       "transfer %.1f, cpu %.1f\n",
	       "Iteration time (s):", res->t_gemm, res->t_attn_decode, res->t_attn_prefill,
	       res->t_kv_write, res->t_overhead, res->t_transfer, res->t_cpu);
	line("Wall time (s):", res->wall_s, 2);
	printf("==================================================\n");
}

/* Trace figures and options merged into the JSON. */
static json_t *extra_json(const struct opts *o, const struct sim_trace *t, const struct reasons *rs)
{
	json_t *x = json_object(), *fr = json_object();

	if (!x || !fr)
		goto fail;
	for (size_t j = 0; j < rs->k; j++)
		if (json_object_set_new(fr, rs->why[j], json_integer((json_int_t)rs->n[j])))
			goto fail;
	if (json_object_set_new(x, "failed_reasons", fr)) {
		fr = NULL;
		goto fail;
	}
	fr = NULL;
	if (json_object_set_new(x, "trace", json_string(o->trace)) ||
	    json_object_set_new(x, "trace_format", json_string(sim_trace_format_name(t->format))) ||
	    json_object_set_new(x, "num_prompts", json_integer((json_int_t)t->count)) ||
	    json_object_set_new(x, "skipped_lines", json_integer((json_int_t)t->skipped)) ||
	    json_object_set_new(x, "over_context", json_integer((json_int_t)t->over_context)) ||
	    json_object_set_new(x, "request_rate",
				o->rate > 0 && isfinite(o->rate) ? json_real(o->rate)
				: o->rate > 0			 ? json_string("inf")
								 : json_null()) ||
	    json_object_set_new(x, "burstiness", json_real(o->burstiness)) ||
	    json_object_set_new(x, "max_concurrency",
				o->r.concurrency ? json_integer(o->r.concurrency) : json_null()) ||
	    json_object_set_new(x, "ws_control", json_boolean(o->r.ws_control)) ||
	    json_object_set_new(x, "fused_transfer", json_boolean(o->r.fused)) ||
	    json_object_set_new(x, "chunked_prefill", json_integer(o->r.chunk_tokens)) ||
	    json_object_set_new(x, "recall_blocks", json_integer(o->r.recall_blocks)) ||
	    json_object_set_new(x, "hbm_gib", json_real(o->r.hbm_gib)) ||
	    json_object_set_new(x, "dram_gib", json_real(o->r.dram_gib)) ||
	    json_object_set_new(x, "roofline", json_boolean(o->r.roofline)) ||
	    json_object_set_new(x, "prefix_cache", json_boolean(o->r.prefix_cache)))
		goto fail;
	/* a tiled trace says how many copies it is */
	if (o->repeat > 1 && json_object_set_new(x, "repeat", json_integer(o->repeat)))
		goto fail;
	{
		struct sim_gpu_preset g;
		json_t *gp;

		sim_replay_gpu(&o->r, &g);
		gp = sim_gpu_preset_json(&g);
		if (!gp || json_object_set_new(x, "gpu_preset", gp))
			goto fail;
	}
	return x;
fail:
	json_decref(fr);
	json_decref(x);
	return NULL;
}

static int write_outputs(const struct opts *o, const struct sim_trace *t,
			 const struct sim_replay_result *res, const struct sim_replay_summary *s,
			 const struct reasons *rs)
{
	char err[512];
	int rc = 0;

	if (o->json) {
		json_t *x = extra_json(o, t, rs);

		if (!x || sim_replay_write_json(res, s, x, o->json, err, sizeof(err))) {
			fprintf(stderr, TOOL ": %s\n", x ? err : "out of memory");
			rc = -1;
		}
		json_decref(x);
	}
	if (o->req_csv) {
		FILE *f = fopen(o->req_csv, "w");

		if (!f || sim_replay_write_requests_csv(res, f) || fclose(f)) {
			fprintf(stderr, TOOL ": %s: cannot write: %s\n", o->req_csv,
				strerror(errno));
			rc = -1;
		}
	}
	return rc;
}

int main(int argc, char **argv)
{
	struct opts o = {0};
	struct sim_trace t = {0};
	struct sim_trace_opts to = SIM_TRACE_OPTS_INIT;
	struct sim_trace_stats ts;
	struct sim_replay_result res = {0};
	struct sim_replay_summary s;
	struct sim_selfile sf = {0};
	struct reasons rs;
	FILE *iter = NULL;
	char err[512];
	int rc = 2;

	if (parse(argc, argv, &o))
		return 2;
	if (o.preset_json &&
	    sim_preset_load_json(o.preset_json, &o.r.model, &o.r.gpu, err, sizeof(err))) {
		fprintf(stderr, TOOL ": %s\n", err);
		return 2;
	}
	if (o.selfile) {
		if (sim_selfile_read(o.selfile, &sf, err, sizeof(err))) {
			fprintf(stderr, TOOL ": %s\n", err);
			return 2;
		}
		o.r.selections = &sf;
	}
	to.skip_bad_lines = o.skip_bad;
	to.max_context = o.r.model.max_context;
	if (sim_trace_read(o.trace, o.format, &to, &t, err, sizeof(err))) {
		fprintf(stderr, TOOL ": %s\n", err);
		sim_selfile_free(&sf);
		return 2;
	}
	for (size_t j = 0; j < t.n_bad; j++)
		fprintf(stderr, TOOL ": skipped: %s\n", t.bad[j]);
	rc = sim_trace_repeat(&t, o.repeat, err, sizeof(err));
	if (rc) {
		fprintf(stderr, TOOL ": %s: --repeat %u: %s\n", o.trace, o.repeat, err);
		rc = rc == -ENOMEM ? 1 : 2;
		goto out;
	}
	rc = 2;
	if (o.num_prompts && o.num_prompts < t.count) {
		t.count = o.num_prompts;
		t.duration_s = t.reqs[t.count - 1].arrival_s;
		t.over_context = 0;
		for (size_t i = 0; i < t.count; i++)
			t.over_context +=
				to.max_context &&
				(uint64_t)t.reqs[i].input_tokens + t.reqs[i].output_tokens >
					to.max_context;
	}
	if (o.rate > 0 && sim_trace_retime(&t, o.rate, o.burstiness, o.seed)) {
		fprintf(stderr, TOOL ": bad --rate/--burstiness\n");
		goto out;
	}
	if (sim_trace_stats(&t, &ts)) {
		fprintf(stderr, TOOL ": out of memory\n");
		rc = 1;
		goto out;
	}
	if (o.iter_csv) {
		iter = fopen(o.iter_csv, "w");
		if (!iter) {
			fprintf(stderr, TOOL ": %s: %s\n", o.iter_csv, strerror(errno));
			goto out;
		}
		fputs(SIM_REPLAY_ITER_CSV_HEADER, iter);
		o.r.iter_csv = iter;
	}
	if (!o.quiet && isatty(STDERR_FILENO))
		o.r.progress = draw_progress;
	rc = sim_replay_run(&o.r, &t, &res, err, sizeof(err));
	if (rc) {
		if (o.r.progress)
			fputc('\n', stderr);
		fprintf(stderr, TOOL ": %s\n", err);
		rc = rc == -EINVAL ? 2 : 1; /* bad options or selections: bad input */
		goto out;
	}
	rc = 1;
	if (o.r.progress)
		fputc('\n', stderr);
	if (sim_replay_summarize(&res, &s)) {
		fprintf(stderr, TOOL ": out of memory\n");
		goto out;
	}
	count_reasons(&res, &rs);
	print_summary(&o, &t, &ts, &res, &s, &rs);
	if (write_outputs(&o, &t, &res, &s, &rs))
		goto out;
	rc = res.completed + res.failed == res.n_reqs ? 0 : 1;
	if (rc)
		fprintf(stderr, TOOL ": %zu requests neither completed nor failed\n",
			res.n_reqs - res.completed - res.failed);
out:
	if (iter && fclose(iter) && !rc) {
		fprintf(stderr, TOOL ": %s: %s\n", o.iter_csv, strerror(errno));
		rc = 1;
	}
	sim_replay_result_free(&res);
	sim_trace_free(&t);
	sim_selfile_free(&sf);
	return rc;
}
