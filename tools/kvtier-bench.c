/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench: benchmarks that print figures and ratios (never pass/fail on time).
 *
 *   kvtier-bench manager   the manager's CPU cost of one decode step (every layer of a batch),
 *                          on the null backend (bookkeeping only: no payload bytes move) or
 *                          the host backend (payload copies included).
 *   kvtier-bench sched     the scheduler's decision time (kvt_sched_step) with a long queue,
 *                          on the null backend, the batches executed between steps.
 *   kvtier-bench recall    the recall bookkeeping of one decode step (tools/bench_recall.c).
 *   kvtier-bench attend    the batched decode attention: against kvt_attend per sequence on
 *                          the host backend (tools/bench_attend.c); with --backend cuda its
 *                          HBM bandwidth against the device's copy bandwidth
 *                          (tools/bench_attend_cuda.c).
 *   kvtier-bench disk      the disk tier's I/O engine against plain sequential I/O
 *                          (tools/bench_disk.c).
 *   kvtier-bench create    kvt_manager_create's time and memory for a tier of terabytes
 *                          (tools/bench_create.c).
 *   kvtier-bench transfer  the CUDA backend's transfers (in the CUDA plugin:
 *                          transfer/cuda_bench.c).
 *   kvtier-bench calibrate the GPU measured for the replay simulator's execution model, written
 *                          as a preset for --preset-json (tools/bench_calibrate.c).
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_usage.h"
#include "cli.h"
#include "manager.h"
#include "kvtier.h"
#include "plugin.h"

struct mopts {
	uint32_t seqs, layers, prompt, steps, threads;
	bool host;
	const char *csv;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-bench manager [options]\n"
		"       kvtier-bench sched [options]\n"
		"       kvtier-bench recall [options]   (kvtier-bench recall --help)\n"
		"       kvtier-bench attend [options]   (kvtier-bench attend --help; CUDA too)\n"
		"       kvtier-bench disk [options]     (kvtier-bench disk --help)\n"
		"       kvtier-bench create [options]   (kvtier-bench create --help)\n"
		"       kvtier-bench transfer [options] (kvtier-bench transfer --help; CUDA)\n"
		"       kvtier-bench calibrate [options]\n"
		"                                   (kvtier-bench calibrate --help; CUDA, cuBLAS)\n"
		"                                   measures the GPU: a preset for --preset-json\n"
		"manager and sched use Llama-3-8B geometry (8 kv heads, 32 q heads, d=128,\n"
		"bf16, 32-token blocks, sink 128, recent 512, top-K 4096).\n\n"
		"manager: the manager's CPU time for decode steps of a batch. One step =\n"
		"kvt_decode_append for every layer.\n"
		"  --seqs N       sequences in the batch (default 256)\n"
		"  --layers N     layers (default 32)\n"
		"  --prompt N     prompt tokens per sequence (default 8192 with the null backend,\n"
		"                 640 with the host backend)\n"
		"  --steps N      decode steps measured (default 512)\n"
		"  --backend B    null (default: bookkeeping only) or host (payload copies too)\n"
		"  --threads N    save threads of the host backend (default 2)\n"
		"  --csv FILE     write one line per step: step,ns\n\n"
		"sched: the scheduler's decision time, kvt_sched_step, with a queue kept at\n"
		"--requests unfinished requests, on the null backend (manager bookkeeping runs in\n"
		"full, no payload moves). Between steps the batch is executed untimed (prefill\n"
		"layers, decode appends of every layer, recalls with --recall) and committed;\n"
		"completed requests are destroyed and replaced by new ones.\n"
		"  --requests N   unfinished requests kept queued (default 1024)\n"
		"  --steps N      steps measured (default 2000), after --warmup N (default 64)\n"
		"  --ws-control B 1: working-set admission (default), 0: resident sets only\n"
		"  --prompt N     prompt tokens per request (default 8192)\n"
		"  --max-new N    tokens each request produces (default 128)\n"
		"  --device-gib N device tier in GiB (default 80)\n"
		"  --recall N     blocks recalled per kv head and layer per decode step (default\n"
		"                 0; 4 GiB of the device tier become the recall cache when > 0)\n"
		"  --csv FILE     write one line per measured step:\n"
		"                 step,ns,items,decodes,prefills,queued,preempted,resumed\n\n"
		"  -h, --help     this text\n"
		"Exit status: 0 on success, 1 on a library error, 2 on bad usage.\n");
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
			bad = sim_parse_u32(optarg, 1, 1u << 20, &o->seqs);
			break;
		case 'l':
			bad = sim_parse_u32(optarg, 1, 4096, &o->layers);
			break;
		case 'p':
			bad = sim_parse_u32(optarg, 1, 1u << 24, &o->prompt);
			prompt_set = true;
			break;
		case 'n':
			bad = sim_parse_u32(optarg, 1, 1u << 24, &o->steps);
			break;
		case 't':
			bad = sim_parse_u32(optarg, 0, 64, &o->threads);
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
		if (bad)
			return cli_bad_value("kvtier-bench", lo[li].name, optarg);
	}
	if (cli_no_extra("kvtier-bench", argc, argv))
		return -1;
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
		double t0 = 1e9 * sim_now_s();

		for (uint32_t l = 0; l < o.layers && !err; l++)
			err = kvt_decode_append(m, l, ids, o.seqs, kd, vd, NULL);
		t[s] = 1e9 * sim_now_s() - t0;
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
	qsort(t, o.steps, sizeof(*t), sim_cmp_double);

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

/* ---- sched ------------------------------------------------------------------------------ */

struct sopts {
	uint32_t requests, steps, warmup, ws, prompt, max_new, device_gib, recall;
	const char *csv;
};

static int parse_sched(int argc, char **argv, struct sopts *o)
{
	static const struct option lo[] = {
		{"requests", required_argument, NULL, 'r'},
		{"steps", required_argument, NULL, 'n'},
		{"warmup", required_argument, NULL, 'w'},
		{"ws-control", required_argument, NULL, 'W'},
		{"prompt", required_argument, NULL, 'p'},
		{"max-new", required_argument, NULL, 'm'},
		{"device-gib", required_argument, NULL, 'd'},
		{"recall", required_argument, NULL, 'R'},
		{"csv", required_argument, NULL, 'c'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int c, bad, li = 0;

	*o = (struct sopts){1024, 2000, 64, 1, 8192, 128, 80, 0, NULL};
	while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		bad = 0;
		switch (c) {
		case 'r':
			bad = sim_parse_u32(optarg, 1, 1u << 20, &o->requests);
			break;
		case 'n':
			bad = sim_parse_u32(optarg, 1, 1u << 24, &o->steps);
			break;
		case 'w':
			bad = sim_parse_u32(optarg, 0, 1u << 24, &o->warmup);
			break;
		case 'W':
			bad = sim_parse_u32(optarg, 0, 1, &o->ws);
			break;
		case 'p':
			bad = sim_parse_u32(optarg, 1, 1u << 20, &o->prompt);
			break;
		case 'm':
			bad = sim_parse_u32(optarg, 1, 1u << 20, &o->max_new);
			break;
		case 'd':
			bad = sim_parse_u32(optarg, 1, 4096, &o->device_gib);
			break;
		case 'R':
			bad = sim_parse_u32(optarg, 0, 64, &o->recall);
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
		if (bad)
			return cli_bad_value("kvtier-bench", lo[li].name, optarg);
	}
	if (cli_no_extra("kvtier-bench", argc, argv))
		return -1;
	if (o->recall && o->device_gib <= 4) {
		fprintf(stderr, "kvtier-bench: --recall needs --device-gib above 4\n");
		return -1;
	}
	return 0;
}

/* One measured step. */
struct srow {
	double ns;
	uint32_t items, decodes, prefills, queued, preempted, resumed;
};

static int cmp_srow(const void *a, const void *b)
{
	double x = ((const struct srow *)a)->ns, y = ((const struct srow *)b)->ns;

	return (x > y) - (x < y);
}

/* The engine's side of one iteration, untimed: every prefill layer the batch names, one
   decode append of every layer for its decodes, and a recall of `recall` blocks per kv head
   and layer for them. The null backend reads no tensor: small dummies do. */
static int execute(struct kvt_manager *m, const struct kvt_config *c,
		   const struct kvt_sched_batch *b, uint32_t recall, uint64_t *dseq,
		   uint32_t *blocks, const uint32_t *tokens_of, uint64_t id_base, uint64_t *rng,
		   const void *dummy)
{
	uint32_t nd = 0;
	int err = 0;

	for (uint32_t i = 0; i < b->n_items && !err; i++) {
		const struct kvt_sched_item *it = &b->items[i];

		if (it->decode) {
			dseq[nd++] = it->seq;
			continue;
		}
		for (uint32_t l = it->layer_begin; l < it->layer_end && !err; l++)
			err = kvt_prefill_layer(m, it->seq, l, dummy, dummy, dummy, NULL);
	}
	for (uint32_t l = 0; nd && l < c->n_layers && !err; l++)
		err = kvt_decode_append(m, l, dseq, nd, dummy, dummy, NULL);
	for (uint32_t l = 0; recall && nd && l < c->n_layers && !err; l++) {
		for (uint32_t i = 0; i < nd; i++) {
			uint32_t nb = (tokens_of[dseq[i] - id_base] + c->block_tokens - 1) /
				      c->block_tokens;

			for (uint32_t j = 0; j < c->n_kv_heads * recall; j++) {
				*rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
				blocks[(size_t)i * c->n_kv_heads * recall + j] =
					(uint32_t)((*rng >> 33) % nb);
			}
		}
		err = kvt_recall_blocks(m, l, dseq, nd, blocks, recall, NULL);
	}
	return err;
}

static int bench_sched(int argc, char **argv)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_sched_config sc = KVT_SCHED_CONFIG_INIT;
	struct kvt_manager *m = NULL;
	struct kvt_sched *s = NULL;
	struct sopts o;
	struct srow *rows = NULL;
	uint64_t *dseq = NULL, next_id = 1, id_base = 1, rng = 42, n_ids;
	uint32_t *blocks = NULL, *tokens_of = NULL;
	uint64_t sum_items = 0, sum_dec = 0, sum_pre = 0, sum_preempted = 0, sum_resumed = 0;
	uint64_t completed = 0, dummy[8] = {0};
	FILE *csv = NULL;
	int err = 0, rc = 1;

	if (parse_sched(argc, argv, &o))
		return 2;
	sc.ws_control = o.ws;

	uint64_t group = (uint64_t)c.n_kv_heads * 2 * c.block_tokens * c.head_dim * 2;
	uint64_t blocks_per_req =
		(uint64_t)(o.prompt + o.max_new + c.block_tokens - 1) / c.block_tokens * c.n_layers;

	c.device_bytes = (uint64_t)o.device_gib << 30;
	if (o.recall)
		c.recall_cache_bytes = (uint64_t)4 << 30;
	/* every queued request may hold a history at once (preempted ones keep theirs) */
	c.host_bytes = group * blocks_per_req * (o.requests + sc.max_requests);
	c.backend = KVT_BACKEND_HOST;
	c.save_threads = 0;
	err = kvt_manager_create_with(&c, &kvt_backend_null_ops, &m);
	if (!err)
		err = kvt_sched_create(m, &sc, &s);
	if (err) {
		fprintf(stderr, "kvtier-bench: cannot create the manager or scheduler: %s\n",
			kvt_strerror(err));
		goto out;
	}
	/* ids are handed out in order; tokens_of covers every id ever used */
	n_ids = (uint64_t)o.requests + (uint64_t)(o.warmup + o.steps) * sc.max_requests + 1;
	rows = calloc(o.steps, sizeof(*rows));
	dseq = calloc(sc.max_requests, sizeof(*dseq));
	blocks = calloc((size_t)sc.max_requests * c.n_kv_heads * (o.recall ? o.recall : 1),
			sizeof(*blocks));
	tokens_of = calloc(n_ids, sizeof(*tokens_of));
	if (!rows || !dseq || !blocks || !tokens_of) {
		fprintf(stderr, "kvtier-bench: out of memory\n");
		goto out;
	}

	for (uint32_t step = 0; step < o.warmup + o.steps; step++) {
		struct kvt_sched_batch b;
		double t0;

		/* keep the queue full */
		while (kvt_sched_pending(s) < o.requests && !err) {
			err = kvt_seq_create(m, next_id, o.prompt);
			if (!err)
				err = kvt_sched_submit(s, next_id, o.max_new);
			tokens_of[next_id - id_base] = o.prompt;
			next_id++;
		}
		if (err) {
			fprintf(stderr, "kvtier-bench: submit: %s (%s)\n", kvt_strerror(err),
				kvt_manager_last_error(m));
			goto out;
		}
		t0 = 1e9 * sim_now_s();
		err = kvt_sched_step(s, &b);
		t0 = 1e9 * sim_now_s() - t0;
		if (err) {
			fprintf(stderr, "kvtier-bench: step: %s\n", kvt_strerror(err));
			goto out;
		}
		if (step >= o.warmup) {
			struct srow *r = &rows[step - o.warmup];

			*r = (struct srow){
				.ns = t0,
				.items = b.n_items,
				.decodes = b.it.n_decode,
				.prefills = b.it.n_prefill,
				.queued = b.it.queued,
				.preempted = b.it.preempted,
				.resumed = b.it.resumed,
			};
			sum_items += b.n_items;
			sum_dec += b.it.n_decode;
			sum_pre += b.it.n_prefill;
			sum_preempted += b.it.preempted;
			sum_resumed += b.it.resumed;
		}
		for (uint32_t i = 0; i < b.n_completed && !err; i++) {
			err = kvt_seq_destroy(m, b.completed[i]);
			completed++;
		}
		if (!err)
			err = execute(m, &c, &b, o.recall, dseq, blocks, tokens_of, id_base, &rng,
				      dummy);
		for (uint32_t i = 0; i < b.n_items && !err; i++)
			if (b.items[i].decode)
				tokens_of[b.items[i].seq - id_base]++;
		if (!err)
			err = kvt_sched_commit(s);
		if (err) {
			fprintf(stderr, "kvtier-bench: step %u: %s (%s)\n", step, kvt_strerror(err),
				kvt_manager_last_error(m));
			goto out;
		}
	}
	if (o.csv) {
		csv = fopen(o.csv, "w");
		if (!csv) {
			fprintf(stderr, "kvtier-bench: %s: %s\n", o.csv, strerror(errno));
			goto out;
		}
		fprintf(csv, "step,ns,items,decodes,prefills,queued,preempted,resumed\n");
		for (uint32_t i = 0; i < o.steps; i++)
			fprintf(csv, "%u,%.0f,%u,%u,%u,%u,%u,%u\n", i, rows[i].ns, rows[i].items,
				rows[i].decodes, rows[i].prefills, rows[i].queued,
				rows[i].preempted, rows[i].resumed);
	}
	qsort(rows, o.steps, sizeof(*rows), cmp_srow);

	double med = rows[o.steps / 2].ns, p99 = rows[(uint64_t)o.steps * 99 / 100].ns;
	double mx = rows[o.steps - 1].ns, n = o.steps;

	printf("kvtier-bench sched: null backend (bookkeeping only, no payload), %u queued "
	       "requests, %u measured steps after %u warm-up\n",
	       o.requests, o.steps, o.warmup);
	printf("geometry: %u layers, 8 kv heads, d=128, bf16, %u-token blocks; prompt %u, %u new "
	       "tokens per request; device %u GiB%s\n",
	       c.n_layers, c.block_tokens, o.prompt, o.max_new, o.device_gib,
	       o.recall ? " (4 GiB of it recall cache)" : "");
	printf("scheduler: ws_control %u, R_max %u, T_max %u, inject %llu token-layers; recall "
	       "%u blocks per kv head\n",
	       o.ws, sc.max_requests, sc.max_tokens, (unsigned long long)sc.max_inject_tokens,
	       o.recall);
	printf("batches: %.1f items (%.1f decodes, %.1f prefills) on average; %llu completed, "
	       "%llu preempted, %llu resumed\n",
	       (double)sum_items / n, (double)sum_dec / n, (double)sum_pre / n,
	       (unsigned long long)completed, (unsigned long long)sum_preempted,
	       (unsigned long long)sum_resumed);
	printf("kvt_sched_step: median %.2f us, p99 %.2f us, max %.2f us\n", med / 1e3, p99 / 1e3,
	       mx / 1e3);
	printf("target < 50 us per step with 1,024 queued: %s (median / target = %.3f, p99 / "
	       "target = %.3f)\n",
	       o.requests == 1024 ? (p99 < 50e3 ? "met" : "NOT met") : "n/a (other queue length)",
	       med / 50e3, p99 / 50e3);
	rc = 0;
out:
	if (csv)
		fclose(csv);
	kvt_sched_destroy(s);
	kvt_manager_destroy(m);
	free(rows);
	free(dseq);
	free(blocks);
	free(tokens_of);
	return rc;
}

/* The transfer benchmark lives in the CUDA plugin (transfer/cuda_bench.c), which links the
   CUDA runtime; this program does not. Without the plugin, --help still prints the help (and
   says why the benchmark cannot run here), anything else exits 77 (skipped). */
static int bench_transfer(int argc, char **argv)
{
	int err = 0, i;
	const struct kvt_plugin *p = kvt_plugin_load(&err);
	const char *why;
	bool help = false;

	if (p)
		return p->bench(argc, argv);
	why = kvt_plugin_error()[0] ? kvt_plugin_error() : "not built or not found";
	for (i = 1; i < argc && !help && strcmp(argv[i], "--") != 0; i++)
		help = strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0;
	if (help) {
		kvt_bench_transfer_usage(stdout);
		fprintf(stderr, "(the CUDA backend plugin is not available here: %s)\n", why);
		return 0;
	}
	fprintf(stderr, "kvtier-bench transfer: the CUDA backend plugin is not available (%s)\n",
		why);
	return 77;
}

int main(int argc, char **argv)
{
	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "manager") == 0)
		return bench_manager(argc - 1, argv + 1);
	if (strcmp(argv[1], "sched") == 0)
		return bench_sched(argc - 1, argv + 1);
	if (strcmp(argv[1], "attend") == 0)
		return bench_attend(argc - 1, argv + 1);
	if (strcmp(argv[1], "recall") == 0)
		return bench_recall(argc - 1, argv + 1);
	if (strcmp(argv[1], "disk") == 0)
		return bench_disk(argc - 1, argv + 1);
	if (strcmp(argv[1], "create") == 0)
		return bench_create(argc - 1, argv + 1);
	if (strcmp(argv[1], "transfer") == 0)
		return bench_transfer(argc - 1, argv + 1);
	if (strcmp(argv[1], "calibrate") == 0)
		return bench_calibrate(argc - 1, argv + 1);
	fprintf(stderr, "kvtier-bench: unknown benchmark '%s' (try --help)\n", argv[1]);
	return 2;
}
