/* SPDX-License-Identifier: MIT */
/*
 * kvtier-curve: the replay engine (replay.h) swept over load, one run per (policy, x):
 *
 *   --x batch  closed loop at a fixed concurrency x (x requests always in the system), the
 *              figures taken over a window of iterations after a warmup;
 *   --x rate   open loop, requests arriving as a Poisson process of rate x req/s, the
 *              figures taken over the whole run.
 *
 * Each point gives output throughput, mean batch size, recall blocks loaded per iteration,
 * TBT, TTFT and the recall hit rate; the points go to a CSV as they finish, to a table on
 * stdout at the end, and to a two-panel plot when gnuplot is installed.
 */
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "exec_model.h"
#include "replay.h"
#include "trace.h"

#define TOOL "kvtier-curve"
#define MAX_X 256     /* values of one sweep */
#define MAX_SERIES 5  /* kvtier twice (ws on, off) and the three others */
#define PATH_LEN 4096 /* derived plot and script paths */

/* One line of the plot: a policy, and for kvtier whether working-set control is on. */
struct series {
	enum sim_policy pol;
	int ws; /* 1 or 0 for kvtier, -1 for the others (their own defaults) */
};

/* The figures of one (series, x) run. */
struct point {
	size_t series;
	double x;
	double thr, batch, blocks, tbt_ms, tbt_p99_ms, ttft_ms, hit, wall_s, prefix_hit;
	size_t completed, failed;
};

struct curve {
	struct sim_replay_opts base; /* options common to every run */
	bool rate;		     /* --x rate */
	double xs[MAX_X];
	size_t n_x;
	struct series ser[MAX_SERIES];
	size_t n_ser;
	const char *values, *policies, *ws; /* parsed once --x is known */
	const char *model, *gpu, *preset_json, *trace_path;
	enum sim_trace_format fmt;
	uint32_t prompt, output_tokens, warmup, iterations, requests, seed, repeat;
	bool lengths_set, no_plot, quiet;
	const char *csv, *plot;
	char plot_buf[PATH_LEN];
};

enum {
	O_X = 256,
	O_VALUES,
	O_POLICIES,
	O_WS,
	O_MODEL,
	O_GPU,
	O_PRESET_JSON,
	O_ENGINE, /* the engine's options: sim_replay_opt by name */
	O_SEED,
	O_TRACE,
	O_FORMAT,
	O_REPEAT,
	O_PROMPT,
	O_OUTPUT,
	O_WARMUP,
	O_ITERATIONS,
	O_REQUESTS,
	O_CSV,
	O_PLOT,
	O_NO_PLOT,
	O_QUIET,
};

/* The help text: every option, its default, the CSV columns and the exit status. */
static void usage(FILE *f)
{
	fputs("usage: kvtier-curve [options]\n"
	      "Sweeps the replay engine over batch size (closed loop at a fixed concurrency)\n"
	      "or request rate (open loop, Poisson arrivals), one run per (policy, x); writes\n"
	      "a CSV, prints a table and plots throughput and recall traffic against x.\n"
	      "\n"
	      "Sweep:\n"
	      "  --x batch|rate        what to sweep (default batch)\n"
	      "  --values LIST         comma-separated x values (at most 256), run ascending;\n"
	      "                        batch: integers >= 1 (default 1,2,4,8,16,32,48,64,96,\n"
	      "                        128,192,256); rate: req/s > 0 (default 0.5,1,2,4,8)\n"
	      "  --policies LIST       of kvtier, snapstream, sparse-offload, full\n"
	      "                        (default kvtier)\n"
	      "  --ws on|off|both      working-set control of policy kvtier (default both);\n"
	      "                        the other policies run once each, their own defaults\n"
	      "Batch sweep (closed loop; the scheduler's R_max is raised to x if smaller):\n"
	      "  --warmup N            iterations before the window (default 100)\n"
	      "  --iterations N        iterations in the window (default 200)\n"
	      "                        Requests per point: x * (2 + ceil((warmup +\n"
	      "                        iterations) / output tokens)) (a trace: its mean).\n"
	      "Rate sweep (open loop, the figures over the whole run):\n"
	      "  --requests N          requests per point (default 300)\n"
	      "Workload:\n"
	      "  --prompt N            synthetic prompt tokens per request (default 16384)\n"
	      "  --output-tokens N     synthetic output tokens per request (default: batch\n"
	      "                        sweep warmup + iterations + 1, so no request ends\n"
	      "                        inside the window; rate sweep 256)\n"
	      "  --trace FILE          the lengths of a trace instead, in file order, cycled\n"
	      "                        when more requests are needed (its times unused)\n"
	      "  --format F            auto (default), mooncake, azure, burstgpt, vidur\n"
	      "  --repeat N            the trace tiled N times (1..10000) before it is cycled,\n"
	      "                        each copy with hash ids of its own: N times as many\n"
	      "                        requests before a prompt comes again (default 1)\n"
	      "Model and GPU:\n"
	      "  --model NAME          llama3-8b (default), lwm-7b, llama3-70b\n"
	      "  --gpu NAME            h100 (default), h200, a100-80g, a100-40g\n"
	      "  --preset-json FILE    override preset fields: {\"model\": {..}, \"gpu\": {..}}\n"
	      "  --hbm-gib X           KV budget in HBM (default: the engine's, the GPU's\n"
	      "                        memory less the weights)\n"
	      "  --dram-gib X          host tier (default 1024, so that DRAM admission does\n"
	      "                        not cap the sweep)\n"
	      "Cache and recall:\n"
	      "  --recall R            blocks recalled per (layer, kv head) and step\n"
	      "                        (default 8)\n"
	      "  --recall-cache-frac F share of the HBM budget for the recall cache, in\n"
	      "                        (0, 0.99] (default 0.1)\n"
	      "  --recall-layers N     simulate recall on N evenly spaced layers standing\n"
	      "                        for all (faster; default 0: every layer)\n"
	      "  --block-tokens N      tokens per block, 8..64, power of two (default 32)\n"
	      "  --sink N, --topk N, --recent N\n"
	      "                        resident sink, top-K and ring tokens (default 128,\n"
	      "                        1024, 512)\n"
	      "  --chunked-prefill B   B prefill tokens per iteration (default:\n"
	      "                        layer-segmented prefill)\n"
	      "  --no-fused-transfer   per-block copies instead of fused gathers\n"
	      "Run and output:\n"
	      "  --seed N              selection model and arrival seed (default 1)\n"
	      "  --no-cpu-time         leave the measured CPU time out of the iteration\n"
	      "                        times (the results are then deterministic)\n"
	      "  --no-prefix-cache     no prefix reuse (by default requests of a --trace\n"
	      "                        with hash_ids share their cached prefixes; a cycled\n"
	      "                        request is the same prompt again)\n"
	      "  --roofline            time GPU work at the datasheet peaks (an upper bound)\n"
	      "  --csv PATH            the CSV (default curve.csv)\n"
	      "  --plot PATH           the plot, .svg or .png (default: the CSV path with\n"
	      "                        .svg); its gnuplot script goes next to it, .gp\n"
	      "  --no-plot             no plot\n"
	      "  --quiet               no progress lines on stderr\n"
	      "  -h, --help            this text\n"
	      "\n"
	      "CSV columns, one row per point, written as the points finish:\n"
	      "  x                     batch size or request rate\n"
	      "  policy, ws_control    the policy; 1 or 0 for kvtier, - for the others\n"
	      "  output_throughput     decode tokens / simulated time, tok/s: the window's\n"
	      "                        iteration time (batch), or first arrival to last\n"
	      "                        completion, idle gaps included (rate)\n"
	      "  mean_batch_size       mean items per iteration of the window\n"
	      "  blocks_loaded_per_iteration\n"
	      "                        recall misses loaded per iteration of the window\n"
	      "  mean_tbt_ms, p99_tbt_ms\n"
	      "                        time between tokens: the window's decode iterations\n"
	      "  mean_ttft_ms          of the first tokens produced in the window\n"
	      "  recall_hit_rate       hits / lookups over the run (0 without recall)\n"
	      "  completed, failed     requests at the end of the run\n"
	      "  wall_s                wall-clock seconds of the point\n"
	      "  prefix_hit_rate       input tokens shared from the prefix cache / input\n"
	      "                        tokens of the requests created (0 without hash_ids)\n"
	      "Exit status: 0 on success (also when gnuplot is missing: no plot), 1 on an\n"
	      "engine, output file or gnuplot error, 2 on bad usage or input (options,\n"
	      "trace, preset file).\n",
	      f);
}

/* The next comma-separated item of *s, cut in place; NULL at the end. Empty items are
   returned as "" for the caller to refuse. */
static char *next_item(char **s)
{
	char *item = *s, *comma;

	if (!item)
		return NULL;
	comma = strchr(item, ',');
	if (comma) {
		*comma = '\0';
		*s = comma + 1;
	} else {
		*s = NULL;
	}
	return item;
}

/* --values (or the default of the sweep) into c->xs, ascending: 0 or -1 (reported). */
static int parse_values(struct curve *c)
{
	const char *list = c->values ? c->values
			   : c->rate ? "0.5,1,2,4,8"
				     : "1,2,4,8,16,32,48,64,96,128,192,256";
	char *buf = strdup(list), *rest = buf, *item;
	int rc = -1;

	if (!buf) {
		fprintf(stderr, "%s: out of memory\n", TOOL);
		return -1;
	}
	c->n_x = 0;
	while ((item = next_item(&rest))) {
		uint32_t n = 0;

		if (c->n_x == MAX_X)
			goto bad;
		if (c->rate ? sim_parse_double(item, 0, DBL_MAX, &c->xs[c->n_x]) ||
				      c->xs[c->n_x] == 0
			    : sim_parse_u32(item, 1, 1u << 20, &n))
			goto bad;
		if (!c->rate)
			c->xs[c->n_x] = n;
		c->n_x++;
	}
	qsort(c->xs, c->n_x, sizeof(c->xs[0]), sim_cmp_double);
	rc = 0;
	goto out;
bad:
	cli_bad_value(TOOL, "values", list);
out:
	free(buf);
	return rc;
}

/* --policies and --ws into the series: kvtier once per working-set setting, the others once.
   0 or -1 (reported). */
static int parse_series(struct curve *c)
{
	const char *list = c->policies ? c->policies : "kvtier";
	char *buf = strdup(list), *rest = buf, *item;
	bool on = true, off = true, seen[4] = {false};
	int rc = -1;

	if (!buf) {
		fprintf(stderr, "%s: out of memory\n", TOOL);
		return -1;
	}
	if (c->ws && strcmp(c->ws, "both")) {
		on = !strcmp(c->ws, "on");
		off = !strcmp(c->ws, "off");
		if (!on && !off) {
			cli_bad_value(TOOL, "ws", c->ws);
			goto out;
		}
	}
	c->n_ser = 0;
	while ((item = next_item(&rest))) {
		enum sim_policy p;

		if (sim_policy_parse(item, &p) || (unsigned)p >= 4 || seen[p]) {
			cli_bad_value(TOOL, "policies", list);
			goto out;
		}
		seen[p] = true;
		if (p != SIM_POLICY_KVTIER)
			c->ser[c->n_ser++] = (struct series){p, -1};
		if (p == SIM_POLICY_KVTIER && on)
			c->ser[c->n_ser++] = (struct series){p, 1};
		if (p == SIM_POLICY_KVTIER && off)
			c->ser[c->n_ser++] = (struct series){p, 0};
	}
	rc = 0;
out:
	free(buf);
	return rc;
}

/* One option of the sweep, the workload or the output: 0, -1 for a bad value, or -2 for a bad
   value already reported (with what the option accepts). */
static int parse_tool_opt(int opt, char *arg, struct curve *c)
{
	switch (opt) {
	case O_X:
		c->rate = !strcmp(arg, "rate");
		return c->rate || !strcmp(arg, "batch") ? 0 : -1;
	case O_VALUES:
		c->values = arg;
		return 0;
	case O_POLICIES:
		c->policies = arg;
		return 0;
	case O_WS:
		c->ws = arg;
		return 0;
	case O_MODEL:
		c->model = arg;
		return 0;
	case O_GPU:
		c->gpu = arg;
		return 0;
	case O_PRESET_JSON:
		c->preset_json = arg;
		return 0;
	case O_SEED:
		return sim_parse_u32(arg, 0, UINT32_MAX, &c->seed);
	case O_TRACE:
		c->trace_path = arg;
		return 0;
	case O_FORMAT:
		return sim_trace_format_parse(arg, &c->fmt) ? -1 : 0;
	case O_REPEAT:
		if (sim_parse_u32(arg, 1, SIM_TRACE_REPEAT_MAX, &c->repeat)) {
			fprintf(stderr,
				"%s: bad value for --repeat: '%s' (want an integer in [1, %u])\n",
				TOOL, arg, SIM_TRACE_REPEAT_MAX);
			return -2; /* reported */
		}
		return 0;
	case O_PROMPT:
		c->lengths_set = true;
		return sim_parse_u32(arg, 1, 1u << 24, &c->prompt);
	case O_OUTPUT:
		c->lengths_set = true;
		return sim_parse_u32(arg, 1, 1u << 24, &c->output_tokens);
	case O_WARMUP:
		return sim_parse_u32(arg, 0, 1u << 24, &c->warmup);
	case O_ITERATIONS:
		return sim_parse_u32(arg, 1, 1u << 24, &c->iterations);
	case O_REQUESTS:
		return sim_parse_u32(arg, 1, 1u << 24, &c->requests);
	case O_CSV:
		c->csv = arg;
		return *arg ? 0 : -1;
	case O_PLOT:
		c->plot = arg;
		return 0;
	case O_NO_PLOT:
		c->no_plot = true;
		return 0;
	case O_QUIET:
		c->quiet = true;
		return 0;
	default:
		return -1;
	}
}

/* Whether s ends in suffix. */
static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && !strcmp(s + n - m, suffix);
}

/* path with its extension (after the last '.' of the file name) replaced by ext, into buf:
   0 or -1 when it does not fit. */
static int with_ext(const char *path, const char *ext, char *buf, size_t len)
{
	const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
	size_t stem = dot && (!slash || dot > slash + 1) ? (size_t)(dot - path) : strlen(path);
	int n = snprintf(buf, len, "%.*s%s", (int)stem, path, ext);

	return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* The checks between options once all are read: 0 or -1 (reported). */
static int check_opts(struct curve *c)
{
	if (parse_values(c) || parse_series(c))
		return -1;
	if (c->trace_path && c->lengths_set) {
		fprintf(stderr, "%s: --prompt and --output-tokens do not apply with --trace\n",
			TOOL);
		return -1;
	}
	if (!c->trace_path && c->repeat > 1) {
		fprintf(stderr, "%s: --repeat applies only with --trace\n", TOOL);
		return -1;
	}
	if (!c->output_tokens)
		c->output_tokens = c->rate ? 256 : c->warmup + c->iterations + 1;
	if (!c->plot) {
		if (with_ext(c->csv, ".svg", c->plot_buf, sizeof(c->plot_buf)))
			return cli_bad_value(TOOL, "csv", c->csv);
		c->plot = c->plot_buf;
	}
	if (!c->no_plot && !ends_with(c->plot, ".svg") && !ends_with(c->plot, ".png")) {
		fprintf(stderr, "%s: --plot must end in .svg or .png: '%s'\n", TOOL, c->plot);
		return -1;
	}
	return 0;
}

/* Options into *c: 0, or -1 on bad usage (reported). --help exits 0. */
static int parse_opts(int argc, char **argv, struct curve *c)
{
	static const struct option lo[] = {
		{"x", required_argument, NULL, O_X},
		{"values", required_argument, NULL, O_VALUES},
		{"policies", required_argument, NULL, O_POLICIES},
		{"ws", required_argument, NULL, O_WS},
		{"model", required_argument, NULL, O_MODEL},
		{"gpu", required_argument, NULL, O_GPU},
		{"preset-json", required_argument, NULL, O_PRESET_JSON},
		{"hbm-gib", required_argument, NULL, O_ENGINE},
		{"dram-gib", required_argument, NULL, O_ENGINE},
		{"recall", required_argument, NULL, O_ENGINE},
		{"recall-cache-frac", required_argument, NULL, O_ENGINE},
		{"recall-layers", required_argument, NULL, O_ENGINE},
		{"block-tokens", required_argument, NULL, O_ENGINE},
		{"sink", required_argument, NULL, O_ENGINE},
		{"topk", required_argument, NULL, O_ENGINE},
		{"recent", required_argument, NULL, O_ENGINE},
		{"chunked-prefill", required_argument, NULL, O_ENGINE},
		{"no-fused-transfer", no_argument, NULL, O_ENGINE},
		{"seed", required_argument, NULL, O_SEED},
		{"no-cpu-time", no_argument, NULL, O_ENGINE},
		{"no-prefix-cache", no_argument, NULL, O_ENGINE},
		{"roofline", no_argument, NULL, O_ENGINE},
		{"trace", required_argument, NULL, O_TRACE},
		{"format", required_argument, NULL, O_FORMAT},
		{"repeat", required_argument, NULL, O_REPEAT},
		{"prompt", required_argument, NULL, O_PROMPT},
		{"output-tokens", required_argument, NULL, O_OUTPUT},
		{"warmup", required_argument, NULL, O_WARMUP},
		{"iterations", required_argument, NULL, O_ITERATIONS},
		{"requests", required_argument, NULL, O_REQUESTS},
		{"csv", required_argument, NULL, O_CSV},
		{"plot", required_argument, NULL, O_PLOT},
		{"no-plot", no_argument, NULL, O_NO_PLOT},
		{"quiet", no_argument, NULL, O_QUIET},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	char want[96];
	int opt, bad, li = 0;

	memset(c, 0, sizeof(*c));
	sim_replay_opts_init(&c->base);
	c->base.recall_layers = 0; /* the curves simulate recall on every layer */
	c->model = "llama3-8b";
	c->gpu = "h100";
	c->base.dram_gib = 1024;
	c->prompt = 16384;
	c->output_tokens = 0; /* resolved in check_opts */
	c->warmup = 100;
	c->iterations = 200;
	c->requests = 300;
	c->seed = 1;
	c->repeat = 1;
	c->csv = "curve.csv";
	while ((opt = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		if (opt == 'h') {
			usage(stdout);
			exit(0);
		}
		if (opt == '?' || opt == ':') {
			usage(stderr);
			return -1;
		}
		bad = opt == O_ENGINE ? sim_replay_opt(lo[li].name, optarg, &c->base)
				      : parse_tool_opt(opt, optarg, c);
		if (bad && opt == O_ENGINE &&
		    !sim_replay_opt_want(lo[li].name, want, sizeof(want))) {
			fprintf(stderr, TOOL ": bad value for --%s: '%s' (want %s)\n", lo[li].name,
				optarg ? optarg : "", want);
			return -1;
		}
		if (bad == -2)
			return -1;
		if (bad)
			return cli_bad_value(TOOL, lo[li].name, optarg);
	}
	if (cli_no_extra(TOOL, argc, argv))
		return -1;
	return check_opts(c);
}

/* The presets named by the options (and the JSON overrides) into c->base: 0, or the exit
   status (reported). */
static int load_presets(struct curve *c)
{
	char err[512];

	if (sim_preset_model(c->model, &c->base.model)) {
		cli_bad_value(TOOL, "model", c->model);
		return 2;
	}
	if (sim_preset_gpu(c->gpu, &c->base.gpu)) {
		cli_bad_value(TOOL, "gpu", c->gpu);
		return 2;
	}
	if (c->preset_json &&
	    sim_preset_load_json(c->preset_json, &c->base.model, &c->base.gpu, err, sizeof(err))) {
		fprintf(stderr, "%s: %s\n", TOOL, err);
		return 2;
	}
	c->base.sel.seed = c->seed;
	return 0;
}

/* The trace of --trace into *src (count > 0), tiled --repeat times: 0, or the exit status
   (reported): 2 for a bad trace or --repeat, 1 out of memory. */
static int load_trace(const struct curve *c, struct sim_trace *src)
{
	char err[SIM_TRACE_MSG_MAX + 64];
	int rc = sim_trace_read(c->trace_path, c->fmt, NULL, src, err, sizeof(err));

	if (rc) {
		fprintf(stderr, "%s: %s\n", TOOL, err);
		return 2;
	}
	rc = sim_trace_repeat(src, c->repeat, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s: %s: --repeat %u: %s\n", TOOL, c->trace_path, c->repeat, err);
		return rc == -ENOMEM ? 1 : 2;
	}
	return 0;
}

/* Mean output tokens of a request of the workload (at least 1). */
static double mean_output(const struct curve *c, const struct sim_trace *src)
{
	double sum = 0;

	if (!src->count)
		return c->output_tokens;
	for (size_t i = 0; i < src->count; i++)
		sum += src->reqs[i].output_tokens;
	return sum / (double)src->count > 1 ? sum / (double)src->count : 1;
}

/* Requests of one point: for a batch sweep enough that x slots never run dry over warmup
   plus window; for a rate sweep --requests. */
static size_t point_requests(const struct curve *c, const struct sim_trace *src, double x)
{
	double per_slot;

	if (c->rate)
		return c->requests;
	per_slot = 2 + ceil((double)(c->warmup + c->iterations) / mean_output(c, src));
	return (size_t)x * (size_t)per_slot;
}

/* The n requests of one point into *t (released with free(t->reqs)): the lengths of src in
   order and cycled (or the synthetic ones), arriving at 0, or as a Poisson process of rate
   x for a rate sweep. 0 or -ENOMEM. */
static int make_trace(const struct curve *c, const struct sim_trace *src, size_t n, double x,
		      struct sim_trace *t)
{
	memset(t, 0, sizeof(*t));
	t->reqs = calloc(n, sizeof(*t->reqs));
	if (!t->reqs)
		return -ENOMEM;
	t->count = n;
	t->format = src->count ? src->format : SIM_TRACE_AUTO;
	t->hash_ids = src->hash_ids; /* shared with src: only t->reqs is the point's */
	t->n_hash_ids = src->n_hash_ids;
	for (size_t i = 0; i < n; i++) {
		struct sim_trace_req *r = &t->reqs[i];

		r->input_tokens = src->count ? src->reqs[i % src->count].input_tokens : c->prompt;
		r->output_tokens =
			src->count ? src->reqs[i % src->count].output_tokens : c->output_tokens;
		if (src->count) {
			r->n_hash = src->reqs[i % src->count].n_hash;
			r->hash_first = src->reqs[i % src->count].hash_first;
		}
		r->line = (uint32_t)(i + 1);
	}
	if (c->rate)
		return sim_trace_retime(t, x, 1.0, c->seed);
	return 0;
}

/* The point's TBT figures (ms) from the window's decode iterations: 0 or -ENOMEM. */
static int tbt_figures(const struct sim_replay_result *r, struct point *p)
{
	double *v, sum = 0;
	size_t n = r->n_win_tbt;

	p->tbt_ms = p->tbt_p99_ms = 0;
	if (!n)
		return 0;
	v = malloc(n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	memcpy(v, r->win_tbt_s, n * sizeof(*v));
	for (size_t i = 0; i < n; i++)
		sum += v[i];
	qsort(v, n, sizeof(*v), sim_cmp_double);
	p->tbt_ms = 1e3 * sum / (double)n;
	p->tbt_p99_ms = 1e3 * sim_percentile(v, n, 0.99);
	free(v);
	return 0;
}

/* a / b, 0 when b is 0. */
static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

/* The point's figures from a run: 0 or -ENOMEM. Throughput is over the window's iteration
   time in a closed loop (never idle); in an open loop over the whole run, first arrival to
   last completion (vLLM's figure), since the engine's iteration time leaves out the idle
   gaps between arrivals and would report more than the offered load at low rates. */
static int point_figures(const struct sim_replay_result *r, bool open_loop, struct point *p)
{
	double it = (double)r->win_iterations;

	p->thr = ratio((double)r->win_decode_tokens, open_loop ? r->duration_s : r->win_time_s);
	p->batch = ratio((double)r->win_batch_sum, it);
	p->blocks = ratio((double)r->win_blocks_loaded, it);
	p->ttft_ms = 1e3 * ratio(r->win_ttft_sum_s, (double)r->win_ttft_n);
	p->hit = r->recall_hit_rate;
	p->prefix_hit = r->prefix_hit_rate;
	p->completed = r->completed;
	p->failed = r->failed;
	return tbt_figures(r, p);
}

/* "1", "0" or "-": the ws_control column of a series. */
static const char *ws_text(const struct series *s)
{
	return s->ws < 0 ? "-" : s->ws ? "1" : "0";
}

/* "kvtier, ws-control", "kvtier, no ws-control" or the policy's name. */
static const char *series_title(const struct series *s)
{
	if (s->ws < 0)
		return sim_policy_name(s->pol);
	return s->ws ? "kvtier, ws-control" : "kvtier, no ws-control";
}

/* One CSV row of point p, flushed so a long sweep leaves every finished point on disk. */
static void csv_row(FILE *f, const struct curve *c, const struct point *p)
{
	const struct series *s = &c->ser[p->series];

	fprintf(f, "%.6g,%s,%s,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%zu,%zu,%.3f,%.6g\n", p->x,
		sim_policy_name(s->pol), ws_text(s), p->thr, p->batch, p->blocks, p->tbt_ms,
		p->tbt_p99_ms, p->ttft_ms, p->hit, p->completed, p->failed, p->wall_s,
		p->prefix_hit);
	fflush(f);
}

/* The engine's options of series s at x: a closed loop at concurrency x with a window after
   the warmup, or an open loop run to the end. */
static void point_opts(const struct curve *c, size_t s, double x, struct sim_replay_opts *o)
{
	*o = c->base;
	o->policy = c->ser[s].pol;
	if (c->ser[s].ws >= 0)
		o->ws_control = c->ser[s].ws;
	if (c->rate) {
		o->concurrency = 0;
		o->warmup_iterations = 0;
		o->max_iterations = 0;
		return;
	}
	o->concurrency = (uint32_t)x;
	if (o->max_requests < o->concurrency)
		o->max_requests = o->concurrency;
	/* a request is prefilled as soon as HBM lets it in (no per-iteration prefill budget),
	   so the window measures decode at concurrency x, as SparseServe's batch-size curves */
	o->max_tokens = 1u << 31;
	o->max_inject_tokens = (uint64_t)1 << 50;
	o->warmup_iterations = c->warmup;
	o->max_iterations = (uint64_t)c->warmup + c->iterations;
}

/* One run of the engine for series s at x into *p: 0, or 1 on an error (reported). */
static int run_point(const struct curve *c, const struct sim_trace *src, size_t s, double x,
		     struct point *p)
{
	struct sim_replay_opts o;
	struct sim_replay_result res = {0};
	struct sim_trace t;
	char err[512] = "";
	double t0 = sim_now_s();
	int rc;

	point_opts(c, s, x, &o);
	rc = make_trace(c, src, point_requests(c, src, x), x, &t);
	if (rc) {
		fprintf(stderr, "%s: the requests of x=%g: %s\n", TOOL, x, strerror(-rc));
		goto out;
	}
	rc = sim_replay_run(&o, &t, &res, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s: %s x=%g: %s\n", TOOL, series_title(&c->ser[s]), x,
			err[0] ? err : strerror(-rc));
		goto out;
	}
	*p = (struct point){.series = s, .x = x};
	rc = point_figures(&res, c->rate, p);
	p->wall_s = sim_now_s() - t0;
	if (rc)
		fprintf(stderr, "%s: out of memory\n", TOOL);
	else if (!c->rate && res.iterations < o.max_iterations)
		fprintf(stderr,
			"%s: warning: %s x=%g: the closed loop ran dry after %llu of %llu "
			"iterations; the window is short\n",
			TOOL, series_title(&c->ser[s]), x, (unsigned long long)res.iterations,
			(unsigned long long)o.max_iterations);
out:
	sim_replay_result_free(&res);
	free(t.reqs);
	return rc ? 1 : 0;
}

/* The KV budget in HBM of the runs, GiB: --hbm-gib, or the engine's default as replay.c
   computes it (the GPU's memory less the weights). */
static double hbm_budget_gib(const struct sim_replay_opts *o)
{
	if (o->hbm_gib > 0)
		return o->hbm_gib;
	return o->gpu.hbm_gib - o->model.params * o->model.elem_bytes / 1073741824.0;
}

/* The header line of the report: model, GPU, budgets, workload, sweep. */
static void print_header(const struct curve *c, const struct sim_trace *src)
{
	const struct sim_replay_opts *o = &c->base;

	printf("%s: model %s on %s, HBM budget %.1f GiB%s, DRAM %.0f GiB; ", TOOL, o->model.name,
	       o->gpu.name, hbm_budget_gib(o), o->hbm_gib > 0 ? "" : " (GPU less weights)",
	       o->dram_gib);
	if (src->count && c->repeat > 1)
		printf("lengths of %s (%zu requests, %s, %u copies, cycled)", c->trace_path,
		       src->count, sim_trace_format_name(src->format), c->repeat);
	else if (src->count)
		printf("lengths of %s (%zu requests, %s, cycled)", c->trace_path, src->count,
		       sim_trace_format_name(src->format));
	else
		printf("prompt %u + %u output tokens", c->prompt, c->output_tokens);
	if (c->rate)
		printf("; rate sweep, open loop, Poisson arrivals, %u requests per point\n",
		       c->requests);
	else
		printf("; batch sweep, closed loop, warmup %u + window %u iterations\n", c->warmup,
		       c->iterations);
	printf("cache: block %u, sink %u, top-K %u, ring %u; recall r=%u, recall cache %.0f%% of "
	       "HBM; %s transfers; %s prefill; CPU time %s; prefix cache %s\n",
	       o->block_tokens, o->sink_tokens, o->topk_tokens, o->recent_tokens, o->recall_blocks,
	       100 * o->recall_cache_frac, o->fused ? "fused" : "per-block",
	       o->chunk_tokens ? "chunked" : "layer-segmented",
	       o->cpu_time ? "counted" : "not counted",
	       !o->prefix_cache ? "off"
	       : src->hash_ids	? "on"
				: "on (no hash_ids)");
	{
		struct sim_gpu_preset g;
		char line[400];

		sim_replay_gpu(o, &g);
		sim_gpu_preset_line(&g, line, sizeof(line));
		printf("execution model: %s\n", line);
	}
}

/* The table of every point, aligned, the CSV's columns. */
static void print_table(const struct curve *c, const struct point *pts, size_t n)
{
	printf("%8s %-14s %3s %11s %7s %10s %9s %9s %10s %8s %9s %6s %7s %8s\n", "x", "policy",
	       "ws", "out_tok/s", "batch", "blk/iter", "tbt_ms", "p99_tbt", "ttft_ms", "hit_rate",
	       "completed", "failed", "wall_s", "prefix");
	for (size_t i = 0; i < n; i++) {
		const struct point *p = &pts[i];
		const struct series *s = &c->ser[p->series];

		printf("%8g %-14s %3s %11.1f %7.2f %10.2f %9.3f %9.3f %10.1f %8.4f %9zu %6zu "
		       "%7.2f %8.4f\n",
		       p->x, sim_policy_name(s->pol), ws_text(s), p->thr, p->batch, p->blocks,
		       p->tbt_ms, p->tbt_p99_ms, p->ttft_ms, p->hit, p->completed, p->failed,
		       p->wall_s, p->prefix_hit);
	}
}

/* One line per series on the shape of its curve: where throughput peaks, how much of the
   peak is left at the largest x (and the batch it ran at), and the recall traffic at both
   ends. */
static void print_shape(const struct curve *c, const struct point *pts, size_t n)
{
	const char *unit = c->rate ? " req/s" : "";

	for (size_t s = 0; s < c->n_ser; s++) {
		const struct point *peak = NULL, *lo = NULL, *hi = NULL;

		for (size_t i = 0; i < n; i++) {
			const struct point *p = &pts[i];

			if (p->series != s)
				continue;
			if (!peak || p->thr > peak->thr)
				peak = p;
			if (!lo || p->x < lo->x)
				lo = p;
			if (!hi || p->x >= hi->x)
				hi = p;
		}
		if (!peak)
			continue;
		printf("%s: peak %.1f tok/s at x=%g%s; at the largest x=%g%s %.1f tok/s = %.3f of "
		       "the peak (mean batch %.1f); blocks loaded per iteration %.2f at x=%g, "
		       "%.2f at x=%g\n",
		       series_title(&c->ser[s]), peak->thr, peak->x, unit, hi->x, unit, hi->thr,
		       ratio(hi->thr, peak->thr), hi->batch, lo->blocks, lo->x, hi->blocks, hi->x);
	}
}

/* s as a single-quoted gnuplot string (a quote inside is doubled). */
static void gp_quote(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', f);
		fputc(*s, f);
	}
	fputc('\'', f);
}

/* Whether series s has a point with recall traffic (the log panel skips those without). */
static bool has_blocks(const struct point *pts, size_t n, size_t s)
{
	for (size_t i = 0; i < n; i++)
		if (pts[i].series == s && pts[i].blocks > 0)
			return true;
	return false;
}

/* One panel's plot command: column col of every series; with log, only the series with
   recall traffic, their zeros drawn at 0.1. */
static void gp_panel(FILE *f, const struct curve *c, const struct point *pts, size_t n, int col,
		     bool log)
{
	const char *sep = "plot ";

	for (size_t s = 0; s < c->n_ser; s++) {
		const struct series *ser = &c->ser[s];

		if (log && !has_blocks(pts, n, s))
			continue;
		fputs(sep, f);
		gp_quote(f, c->csv);
		fprintf(f, " every ::1 using 1:((strcol(2) eq '%s' && strcol(3) eq '%s') ? ",
			sim_policy_name(ser->pol), ws_text(ser));
		if (log)
			fprintf(f, "($%d > 0.1 ? $%d : 0.1)", col, col);
		else
			fprintf(f, "$%d", col);
		/* the same style for a series in both panels; ws-off dashed, since its line
		   often lies on the ws-on one */
		fprintf(f, " : 1/0) with linespoints lt %zu dt %d lw 2 pt %d ps 0.7 title ", s + 1,
			ser->ws == 0 ? 2 : 1, (int)(5 + 2 * s));
		gp_quote(f, series_title(ser));
		sep = ", \\\n     ";
	}
	fputc('\n', f);
}

/* The script's preamble: the terminal of the plot's extension, the output, the layout and
   the x axis both panels share. */
static void gp_preamble(FILE *f, const struct curve *c)
{
	const struct sim_replay_opts *o = &c->base;
	char title[256];

	snprintf(title, sizeof(title), "%s on %s, HBM budget %.1f GiB: %s sweep", o->model.name,
		 o->gpu.name, hbm_budget_gib(o), c->rate ? "request-rate" : "batch-size");
	if (ends_with(c->plot, ".png"))
		fputs("if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
		      "\tset terminal pngcairo size 1000,420 noenhanced\n"
		      "} else {\n"
		      "\tset terminal png size 1000,420 noenhanced\n"
		      "}\n",
		      f);
	else
		fputs("set terminal svg size 1000,420 noenhanced background rgb 'white'\n", f);
	fputs("set output ", f);
	gp_quote(f, c->plot);
	fputs("\nset datafile separator ','\nset multiplot layout 1,2 title ", f);
	gp_quote(f, title);
	/* room above the curves for the key */
	fputs("\nset grid\nset key top left Left reverse samplen 3\n"
	      "set offsets 0, 0, graph 0.4, 0\n",
	      f);
	fprintf(f, "set xlabel '%s'\n%s",
		c->rate ? "request rate (req/s)" : "batch size (concurrency)",
		c->rate ? "" : "set logscale x 2\n");
}

/* The y axis of the blocks panel: logarithmic when a series loads blocks (zeros of those
   series drawn at 0.1), linear otherwise. Returns whether it is logarithmic. */
static bool gp_blocks_axis(FILE *f, const struct curve *c, const struct point *pts, size_t n)
{
	bool any = false, zero = false;

	for (size_t s = 0; s < c->n_ser; s++)
		any |= has_blocks(pts, n, s);
	for (size_t i = 0; i < n; i++)
		zero |= pts[i].blocks <= 0 && has_blocks(pts, n, pts[i].series);
	if (!any)
		fputs("set ylabel 'blocks loaded per iteration'\n", f);
	else if (zero)
		fputs("set ylabel 'blocks loaded per iteration (0 at 0.1)'\nset logscale y\n"
		      "set yrange [0.1:*]\n",
		      f);
	else
		fputs("set ylabel 'blocks loaded per iteration'\nset logscale y\n"
		      "set yrange [*:*]\n",
		      f);
	return any;
}

/* The gnuplot script of the plot: two panels, throughput and blocks loaded per iteration
   against x, read from the CSV. 0 or -1 (reported). */
static int write_script(const struct curve *c, const struct point *pts, size_t n, const char *path)
{
	FILE *f = fopen(path, "w");
	bool log;

	if (!f) {
		fprintf(stderr, "%s: %s: %s\n", TOOL, path, strerror(errno));
		return -1;
	}
	fprintf(f, "# written by kvtier-curve; run with `gnuplot %s`\n", path);
	gp_preamble(f, c);
	fputs("set ylabel 'output throughput (tok/s)'\nset yrange [0:*]\n", f);
	gp_panel(f, c, pts, n, 4, false);
	log = gp_blocks_axis(f, c, pts, n);
	gp_panel(f, c, pts, n, 6, log);
	fputs("unset multiplot\n", f);
	if (fclose(f)) {
		fprintf(stderr, "%s: %s: %s\n", TOOL, path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Whether an executable `gnuplot` is in one of PATH's directories. */
static bool have_gnuplot(void)
{
	const char *path = getenv("PATH");
	char file[PATH_LEN];

	while (path && *path) {
		const char *end = strchr(path, ':');
		size_t len = end ? (size_t)(end - path) : strlen(path);
		int n = snprintf(file, sizeof(file), "%.*s/gnuplot", (int)len, len ? path : ".");

		if (n > 0 && (size_t)n < sizeof(file) && access(file, X_OK) == 0)
			return true;
		path = end ? end + 1 : NULL;
	}
	return false;
}

/* Runs `gnuplot script`: 0, or -1 when it could not start or failed (reported). */
static int run_gnuplot(const char *script)
{
	char *argv[] = {"gnuplot", (char *)script, NULL};
	pid_t pid;
	int st, rc;

	fflush(NULL);
	rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
	if (rc) {
		fprintf(stderr, "%s: cannot run gnuplot: %s\n", TOOL, strerror(rc));
		return -1;
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR) {
			fprintf(stderr, "%s: waiting for gnuplot: %s\n", TOOL, strerror(errno));
			return -1;
		}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	fprintf(stderr, "%s: gnuplot failed on %s (%s %d)\n", TOOL, script,
		WIFEXITED(st) ? "exit status" : "signal",
		WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
	return -1;
}

/* The plot of the CSV with gnuplot, or a note when gnuplot is missing: 0 or 1. */
static int make_plot(const struct curve *c, const struct point *pts, size_t n)
{
	char script[PATH_LEN];

	if (c->no_plot)
		return 0;
	if (!have_gnuplot()) {
		fprintf(stderr, "%s: gnuplot not found; plot skipped, CSV kept at %s\n", TOOL,
			c->csv);
		return 0;
	}
	if (with_ext(c->plot, ".gp", script, sizeof(script))) {
		fprintf(stderr, "%s: --plot path too long\n", TOOL);
		return 1;
	}
	if (write_script(c, pts, n, script) || run_gnuplot(script))
		return 1;
	printf("plot: %s (gnuplot script %s)\n", c->plot, script);
	return 0;
}

/* Every (series, x) point, in series order then ascending x, each written to csv as it
   finishes: 0 or 1 (reported). */
static int sweep(const struct curve *c, const struct sim_trace *src, FILE *csv, struct point *pts)
{
	size_t total = c->n_ser * c->n_x, k = 0;

	for (size_t s = 0; s < c->n_ser; s++)
		for (size_t i = 0; i < c->n_x; i++, k++) {
			struct point *p = &pts[k];

			if (run_point(c, src, s, c->xs[i], p))
				return 1;
			csv_row(csv, c, p);
			if (!c->quiet)
				fprintf(stderr,
					"point %zu/%zu: %s ws=%s x=%g: %.1f tok/s, batch %.2f, "
					"%.2f blocks/iter, %.1f s\n",
					k + 1, total, sim_policy_name(c->ser[s].pol),
					ws_text(&c->ser[s]), p->x, p->thr, p->batch, p->blocks,
					p->wall_s);
		}
	return 0;
}

/* Options, workload, the sweep into the CSV, the report on stdout, then the plot. */
int main(int argc, char **argv)
{
	struct sim_trace src = {0};
	struct point *pts = NULL;
	struct curve c;
	FILE *csv = NULL;
	double t0 = sim_now_s();
	size_t n;
	int rc = 2;

	if (parse_opts(argc, argv, &c))
		goto out;
	rc = load_presets(&c);
	if (rc)
		goto out;
	if (c.trace_path) {
		rc = load_trace(&c, &src);
		if (rc)
			goto out;
	}
	rc = 1;
	n = c.n_ser * c.n_x;
	pts = calloc(n, sizeof(*pts));
	if (!pts) {
		fprintf(stderr, "%s: out of memory\n", TOOL);
		goto out;
	}
	csv = fopen(c.csv, "w");
	if (!csv) {
		fprintf(stderr, "%s: %s: %s\n", TOOL, c.csv, strerror(errno));
		goto out;
	}
	fputs("x,policy,ws_control,output_throughput,mean_batch_size,blocks_loaded_per_iteration,"
	      "mean_tbt_ms,p99_tbt_ms,mean_ttft_ms,recall_hit_rate,completed,failed,wall_s,"
	      "prefix_hit_rate\n",
	      csv);
	print_header(&c, &src);
	fflush(stdout);
	if (sweep(&c, &src, csv, pts))
		goto out;
	print_table(&c, pts, n);
	print_shape(&c, pts, n);
	printf("%zu points in %.1f s; CSV: %s\n", n, sim_now_s() - t0, c.csv);
	rc = ferror(csv);
	rc |= fclose(csv);
	csv = NULL;
	if (rc) {
		fprintf(stderr, "%s: %s: write error\n", TOOL, c.csv);
		rc = 1;
		goto out;
	}
	rc = make_plot(&c, pts, n);
out:
	if (csv)
		fclose(csv);
	sim_trace_free(&src);
	free(pts);
	return rc;
}
