/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench: benchmarks that print figures and ratios (never pass/fail on time).
 *
 *   kvtier-bench manager   the manager's CPU cost of one decode step (every layer of a batch),
 *                          on the null backend (bookkeeping only: no payload bytes move) or
 *                          the host backend (payload copies included).
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "internal.h"
#include "kvtier.h"

struct mopts {
	uint32_t seqs, layers, prompt, steps, threads;
	bool host;
	const char *csv;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-bench manager [options]\n"
		"Measures the manager's CPU time for decode steps of a batch with Llama-3-8B\n"
		"geometry (8 kv heads, 32 q heads, d=128, bf16, 32-token blocks, sink 128, recent\n"
		"512, top-K 4096). One step = kvt_decode_append for every layer.\n\n"
		"  --seqs N       sequences in the batch (default 256)\n"
		"  --layers N     layers (default 32)\n"
		"  --prompt N     prompt tokens per sequence (default 8192 with the null backend,\n"
		"                 640 with the host backend)\n"
		"  --steps N      decode steps measured (default 512)\n"
		"  --backend B    null (default: bookkeeping only) or host (payload copies too)\n"
		"  --threads N    save threads of the host backend (default 2)\n"
		"  --csv FILE     write one line per step: step,ns\n"
		"  -h, --help     this text\n"
		"Exit status: 0 on success, 1 on a library error, 2 on bad usage.\n");
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int parse_manager(int argc, char **argv, struct mopts *o)
{
	static const struct option lo[] = {
		{"seqs", required_argument, NULL, 's'},
		{"layers", required_argument, NULL, 'l'},
		{"prompt", required_argument, NULL, 'p'},
		{"steps", required_argument, NULL, 'n'},
		{"backend", required_argument, NULL, 'b'},
		{"threads", required_argument, NULL, 't'},
		{"csv", required_argument, NULL, 'c'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool prompt_set = false;
	int c, bad, li = 0;

	*o = (struct mopts){256, 32, 8192, 512, 2, false, NULL};
	while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		bad = 0;
		switch (c) {
		case 's':
			bad = cli_parse_u32(optarg, 1, 1u << 20, &o->seqs);
			break;
		case 'l':
			bad = cli_parse_u32(optarg, 1, 4096, &o->layers);
			break;
		case 'p':
			bad = cli_parse_u32(optarg, 1, 1u << 24, &o->prompt);
			prompt_set = true;
			break;
		case 'n':
			bad = cli_parse_u32(optarg, 1, 1u << 24, &o->steps);
			break;
		case 't':
			bad = cli_parse_u32(optarg, 0, 64, &o->threads);
			break;
		case 'b':
			if (strcmp(optarg, "null") == 0)
				o->host = false;
			else if (strcmp(optarg, "host") == 0)
				o->host = true;
			else
				bad = 1;
			break;
		case 'c':
			o->csv = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
		if (bad) {
			fprintf(stderr, "kvtier-bench: bad value for --%s: '%s'\n", lo[li].name,
				optarg);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-bench: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (o->host && !prompt_set)
		o->prompt = 640;
	return 0;
}

static int bench_manager(int argc, char **argv)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_manager *m = NULL;
	struct mopts o;
	uint8_t *k = NULL, *v = NULL, *kd = NULL, *vd = NULL;
	uint64_t *ids = NULL;
	double *t = NULL;
	FILE *csv = NULL;
	int err = 0, rc = 1;

	if (parse_manager(argc, argv, &o))
		return 2;
	c.n_layers = o.layers;
	c.save_threads = o.threads;
	c.backend = KVT_BACKEND_HOST;

	uint32_t H = c.n_kv_heads, bt = c.block_tokens;
	uint64_t row = (uint64_t)c.head_dim * 2, group = (uint64_t)H * 2 * bt * row;
	uint64_t frames = (c.sink_tokens + c.recent_tokens + c.topk_tokens) / bt + 1;
	uint64_t blocks = (o.prompt + o.steps + bt - 1) / bt;

	c.device_bytes = group * frames * o.layers * o.seqs;
	c.host_bytes = group * blocks * o.layers * o.seqs;
	err = kvt_manager_create_with(&c, o.host ? &kvt_backend_host_ops : &kvt_backend_null_ops,
				      &m);
	if (err) {
		fprintf(stderr, "kvtier-bench: cannot create the manager: %s\n", kvt_strerror(err));
		return 1;
	}
	/* The null backend never reads the tensors: small dummies do. */
	size_t pf = o.host ? (size_t)H * o.prompt * row : 64;
	size_t qb = o.host ? (size_t)c.n_q_heads * c.obs_window * row : 64;

	k = calloc(1, pf);
	v = calloc(1, pf);
	kd = calloc((size_t)o.seqs * H, row);
	vd = calloc((size_t)o.seqs * H, row);
	ids = calloc(o.seqs, sizeof(*ids));
	t = calloc(o.steps, sizeof(*t));
	uint8_t *q = calloc(1, qb);

	if (!k || !v || !kd || !vd || !ids || !t || !q) {
		fprintf(stderr, "kvtier-bench: out of memory\n");
		free(q);
		goto out;
	}
	for (uint32_t i = 0; i < o.seqs; i++) {
		ids[i] = 1000 + 7 * (uint64_t)i;
		err = kvt_seq_create(m, ids[i], o.prompt);
		for (uint32_t l = 0; !err && l < o.layers; l++)
			err = kvt_prefill_layer(m, ids[i], l, k, v, q, NULL);
		if (err)
			break;
	}
	free(q);
	if (!err)
		err = kvt_manager_sync(m, NULL);
	if (err) {
		fprintf(stderr, "kvtier-bench: setup: %s\n", kvt_manager_last_error(m));
		goto out;
	}

	for (uint32_t s = 0; s < o.steps; s++) {
		double t0 = 1e9 * cli_now_s();

		for (uint32_t l = 0; l < o.layers && !err; l++)
			err = kvt_decode_append(m, l, ids, o.seqs, kd, vd, NULL);
		t[s] = 1e9 * cli_now_s() - t0;
		if (err) {
			fprintf(stderr, "kvtier-bench: step %u: %s\n", s,
				kvt_manager_last_error(m));
			goto out;
		}
	}
	err = kvt_manager_sync(m, NULL);
	if (err)
		goto out;
	if (o.csv) {
		csv = fopen(o.csv, "w");
		if (!csv) {
			fprintf(stderr, "kvtier-bench: %s: %s\n", o.csv, strerror(errno));
			goto out;
		}
		fprintf(csv, "step,ns\n");
		for (uint32_t s = 0; s < o.steps; s++)
			fprintf(csv, "%u,%.0f\n", s, t[s]);
	}
	qsort(t, o.steps, sizeof(*t), cmp_d);

	double med = t[o.steps / 2], p10 = t[o.steps / 10], p90 = t[o.steps * 9 / 10];
	uint64_t appends = (uint64_t)o.seqs * o.layers;

	printf("kvtier-bench manager: backend %s%s, %u sequences x %u layers, prompt %u, %u "
	       "steps\n",
	       o.host ? "host" : "null",
	       o.host ? " (payload copies included)" : " (bookkeeping only, no payload)", o.seqs,
	       o.layers, o.prompt, o.steps);
	printf("geometry: 8 kv heads, 32 q heads, d=128, bf16, %u-token blocks; resident "
	       "sink %u + top-K %u + ring %u\n",
	       bt, c.sink_tokens, c.topk_tokens, c.recent_tokens);
	printf("decode step (%llu appends): median %.1f us, p10 %.1f us, p90 %.1f us; %.1f ns "
	       "per (sequence, layer)\n",
	       (unsigned long long)appends, med / 1e3, p10 / 1e3, p90 / 1e3, med / (double)appends);
	if (!o.host)
		printf("target < 100 us per step of 256 x 32: %s (median / target = %.2f)\n",
		       o.seqs == 256 && o.layers == 32 ? (med < 100e3 ? "met" : "NOT met")
						       : "n/a (other shape)",
		       med / 100e3);
	rc = 0;
out:
	if (csv)
		fclose(csv);
	kvt_manager_destroy(m);
	free(k);
	free(v);
	free(kd);
	free(vd);
	free(ids);
	free(t);
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "manager") == 0)
		return bench_manager(argc - 1, argv + 1);
	fprintf(stderr, "kvtier-bench: unknown benchmark '%s' (try --help)\n", argv[1]);
	return 2;
}
