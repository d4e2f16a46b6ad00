/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench recall: the manager's bookkeeping for dynamic recall per decode step (every
 * layer's kvt_recall_blocks for the whole batch: hit detection, LRU, eviction, views, working
 * sets, the load list), on the null backend so no payload moves and no scoring runs. The
 * selection comes from a seeded process with temporal locality: each step keeps each selected
 * block with probability 1 - churn and otherwise picks another non-resident block.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"
#include "manager.h"
#include "kvtier.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-bench recall [options]\n"
		"Measures the manager's CPU time for the recall bookkeeping of one decode step:\n"
		"kvt_recall_blocks for every layer of a batch, Llama-3-8B geometry (8 kv heads,\n"
		"d=128, bf16, 32-token blocks, sink 128, recent 512, top-K 4096), null backend (no\n"
		"payload, no scoring). Decode appends run between steps, outside the timing.\n\n"
		"  --seqs N       sequences in the batch (default 256)\n"
		"  --layers N     layers (default 32)\n"
		"  --prompt N     prompt tokens per sequence (default 8192)\n"
		"  --r N          blocks recalled per (sequence, layer, kv head) (default 16)\n"
		"  --steps N      decode steps measured (default 64)\n"
		"  --churn P      percent of selected blocks replaced each step (default 10)\n"
		"  --cache P      recall cache size, percent of one step's blocks (default 150)\n"
		"  --threads N    config.recall_threads: threads sharing each call (default 1)\n"
		"  --quest        time kvt_decode_recall instead: Quest scoring of real block\n"
		"                 metadata and the recall, host backend (its memory is real: keep\n"
		"                 seqs x layers x prompt small), no top-K (every block outside the\n"
		"                 sink and ring is a candidate), random queries each step\n"
		"  --step         through the step API: kvt_step_begin, kvt_step_recall_blocks per\n"
		"                 layer, kvt_step_end (all timed), instead of kvt_recall_blocks\n"
		"  --tables       with --step: also, outside the step's timing, the attention\n"
		"                 tables of every layer (kvt_step_tables, one call per layer)\n"
		"                 against the accessors they replace (kvt_seq_frames and\n"
		"                 kvt_seq_recall_view per sequence, layer and kv head): the\n"
		"                 calls and the median time per step of each (slow: use few\n"
		"                 --steps)\n"
		"  --stagger      sequence i's prompt is P - (i mod 32) tokens (P: --prompt), so\n"
		"                 that a few members reach a block's end each step, as in an\n"
		"                 engine's batch of mixed lengths (default: every prompt P, so\n"
		"                 that all of them cross a block boundary together, every 32\n"
		"                 steps); not with --quest\n"
		"  --csv FILE     one line per step: step,ns,loads,hits\n"
		"  --backend B    null (default: the above) or cuda: the CUDA backend with the\n"
		"                 recall regions on the device, through decode steps with the\n"
		"                 selection in device memory (kvt_step_recall_device_blocks),\n"
		"                 beside the CPU reference (the null backend's steps) on the same\n"
		"                 selections in the same run: (a) the CUDA backend's host time\n"
		"                 per step (over the CPU emulator, its kernels' work left out),\n"
		"                 (b) the reference's, (c) on a GPU the programs' device time;\n"
		"                 the two must decide alike. No top-K (the prompts are real\n"
		"                 device tensors: the host tier holds seqs x layers x prompt\n"
		"                 tokens; --prompt defaults to 2048). Needs the CUDA plugin and\n"
		"                 runtime (exit 77 without); not with --quest, --step, --tables,\n"
		"                 --csv\n"
		"  --head-dim D   with --backend cuda: the heads' dimension (default 128; the\n"
		"                 host's work does not depend on it, the memory does)\n"
		"  -h, --help     this text\n"
		"Exit status: 0 on success, 1 on a library error, 2 on bad usage.\n");
}

static int parse(int argc, char **argv, struct bench_recall_opts *o)
{
	static const struct option lo[] = {
		{"seqs", required_argument, NULL, 's'},
		{"layers", required_argument, NULL, 'l'},
		{"prompt", required_argument, NULL, 'p'},
		{"r", required_argument, NULL, 'r'},
		{"steps", required_argument, NULL, 'n'},
		{"churn", required_argument, NULL, 'u'},
		{"cache", required_argument, NULL, 'k'},
		{"csv", required_argument, NULL, 'c'},
		{"threads", required_argument, NULL, 't'},
		{"quest", no_argument, NULL, 'Q'},
		{"step", no_argument, NULL, 'S'},
		{"tables", no_argument, NULL, 'T'},
		{"backend", required_argument, NULL, 'B'},
		{"head-dim", required_argument, NULL, 'D'},
		{"stagger", no_argument, NULL, 'G'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int c, bad, li = 0;
	bool prompt_set = false, head_dim_set = false;

	*o = (struct bench_recall_opts){.seqs = 256,
					.layers = 32,
					.prompt = 8192,
					.steps = 64,
					.r = 16,
					.churn_pct = 10,
					.cache_pct = 150,
					.threads = 1,
					.head_dim = 128};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		bad = 0;
		switch (c) {
		case 's':
			bad = sim_parse_u32(optarg, 1, 1u << 16, &o->seqs);
			break;
		case 'l':
			bad = sim_parse_u32(optarg, 1, 4096, &o->layers);
			break;
		case 'p':
			bad = sim_parse_u32(optarg, 1024, 1u << 22, &o->prompt);
			prompt_set = true;
			break;
		case 'r':
			bad = sim_parse_u32(optarg, 1, 1024, &o->r);
			break;
		case 'n':
			bad = sim_parse_u32(optarg, 2, 1u << 20, &o->steps);
			break;
		case 'u':
			bad = sim_parse_u32(optarg, 0, 100, &o->churn_pct);
			break;
		case 'k':
			bad = sim_parse_u32(optarg, 100, 10000, &o->cache_pct);
			break;
		case 'c':
			o->csv = optarg;
			break;
		case 't':
			bad = sim_parse_u32(optarg, 1, 64, &o->threads);
			break;
		case 'Q':
			o->quest = true;
			break;
		case 'S':
			o->step = true;
			break;
		case 'T':
			o->tables = true;
			break;
		case 'G':
			o->stagger = true;
			break;
		case 'B':
			if (strcmp(optarg, "cuda") == 0)
				o->cuda = true;
			else if (strcmp(optarg, "null") != 0)
				bad = 1;
			break;
		case 'D':
			bad = sim_parse_u32(optarg, 1, 1024, &o->head_dim);
			head_dim_set = true;
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
	if (o->tables && (!o->step || o->quest)) {
		fprintf(stderr, "kvtier-bench: --tables goes with --step (and not --quest)\n");
		return -1;
	}
	if (o->cuda && (o->quest || o->step || o->tables || o->csv)) {
		fprintf(stderr, "kvtier-bench: --backend cuda runs decode steps itself: not with "
				"--quest, --step, --tables or --csv\n");
		return -1;
	}
	if (o->stagger && o->quest) {
		fprintf(stderr, "kvtier-bench: --stagger is not for --quest\n");
		return -1;
	}
	if (head_dim_set && !o->cuda) {
		fprintf(stderr, "kvtier-bench: --head-dim goes with --backend cuda\n");
		return -1;
	}
	if (o->cuda) { /* (its configuration's sink, ring and blocks are the defaults) */
		struct kvt_config d = KVT_CONFIG_INIT;

		if (!prompt_set)
			o->prompt = 2048;
		if (bench_recall_shortest(o, d.block_tokens) <
		    d.sink_tokens + d.recent_tokens + (o->r + 1) * d.block_tokens) {
			fprintf(stderr,
				"kvtier-bench: --backend cuda: prompt %u leaves no more than r = %u "
				"blocks outside the sink and the recent ring: every one would stay "
				"resident\n",
				o->prompt, o->r);
			return -1;
		}
	}
	return 0;
}

/* --tables: buffers for one layer's tables, reused for every layer. */
struct tab_bufs {
	struct kvt_attn_tables t;
	uint32_t n_batch;
	uint64_t *frames; /* the accessors' outputs */
	struct kvt_recall_ref *refs;
};

static int tab_bufs_init(struct tab_bufs *b, uint32_t seqs, uint32_t H, uint32_t frames, uint32_t r)
{
	size_t rows = (size_t)seqs * H;

	b->t = (struct kvt_attn_tables){
		.size = sizeof(b->t),
		.max_batch = seqs,
		.max_frames = frames,
		.max_recall = r,
		.n_batch = &b->n_batch,
		.n_tokens = calloc(rows, 4),
		.frames = calloc(rows * frames, 4),
		.n_recall = calloc(rows, 4),
		.recall = calloc(rows * r, 4),
		.recall_tokens = calloc(rows * r, 4),
		.recall_skip = calloc(rows * r, 8),
	};
	b->frames = calloc(frames, sizeof(*b->frames));
	b->refs = calloc(r, sizeof(*b->refs));
	return b->t.n_tokens && b->t.frames && b->t.n_recall && b->t.recall && b->t.recall_tokens &&
			       b->t.recall_skip && b->frames && b->refs
		       ? 0
		       : -ENOMEM;
}

static void tab_bufs_fini(struct tab_bufs *b)
{
	free(b->t.n_tokens);
	free(b->t.frames);
	free(b->t.n_recall);
	free(b->t.recall);
	free(b->t.recall_tokens);
	free(b->t.recall_skip);
	free(b->frames);
	free(b->refs);
}

/* One step's attention inputs, both ways, inside the open step: the tables of every layer
   (*tab ns), then the accessors for every (sequence, layer, kv head) (*acc ns). The two must
   agree on what they count: the tables' recalled blocks against the views'. */
static int tab_step(struct kvt_manager *m, const struct bench_recall_opts *o, const uint64_t *ids,
		    struct tab_bufs *b, double *tab, double *acc)
{
	uint32_t H = 8, nf, ns, nr;
	uint64_t n_tab = 0, n_acc = 0;
	double t0 = 1e9 * sim_now_s();
	int err = 0;

	for (uint32_t l = 0; l < o->layers && !err; l++) {
		err = kvt_step_tables(m, l, &b->t, NULL);
		for (size_t x = 0; !err && x < (size_t)o->seqs * H; x++)
			n_tab += b->t.n_recall[x];
	}
	*tab = 1e9 * sim_now_s() - t0;
	t0 = 1e9 * sim_now_s();
	for (uint32_t l = 0; l < o->layers && !err; l++)
		for (uint32_t i = 0; i < o->seqs && !err; i++)
			for (uint32_t h = 0; h < H && !err; h++) {
				err = kvt_seq_frames(m, ids[i], l, h, b->frames, b->t.max_frames,
						     &nf, &ns);
				if (!err)
					err = kvt_seq_recall_view(m, ids[i], l, h, b->refs, o->r,
								  &nr);
				n_acc += nr;
			}
	*acc = 1e9 * sim_now_s() - t0;
	if (!err && n_tab != n_acc) {
		fprintf(stderr,
			"kvtier-bench: the tables name %llu recalled blocks, the views %llu\n",
			(unsigned long long)n_tab, (unsigned long long)n_acc);
		return -EPROTO;
	}
	return err;
}

/* --quest: kvt_decode_recall on the host backend. Prefill writes real rows (a value pattern
   of the token's coordinates), so the block metadata and the scores are real; the top-K is off
   so that prefill runs no SnapKV. Each step appends a token to every layer, then times one
   kvt_decode_recall per layer with fresh random queries. */
static int bench_quest(const struct bench_recall_opts *o)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_manager *m = NULL;
	uint64_t *ids = NULL, rng = 7;
	uint16_t *k = NULL, *q = NULL, *kd = NULL;
	double *t = NULL;
	int err = 0, rc = 1;

	c.n_layers = o->layers;
	c.backend = KVT_BACKEND_HOST;
	c.save_threads = 0;
	c.topk_tokens = 0;
	c.recall_blocks = o->r;
	c.recall_threads = o->threads;

	uint32_t H = c.n_kv_heads, Hq = c.n_q_heads, D = c.head_dim, bt = c.block_tokens;
	uint64_t row = (uint64_t)D * 2, block = 2ull * bt * row, group = H * block;
	uint64_t frames = (c.sink_tokens + c.recent_tokens) / bt + 2;
	uint64_t blocks = (o->prompt + o->steps + bt - 1) / bt + 1;
	uint64_t per_step = (uint64_t)o->seqs * o->layers * H * o->r;
	size_t krow = (size_t)H * o->prompt * D;

	c.recall_cache_bytes = per_step * o->cache_pct / 100 * block;
	c.device_bytes = group * frames * o->layers * o->seqs + c.recall_cache_bytes;
	c.host_bytes = group * blocks * o->layers * o->seqs;
	err = kvt_manager_create(&c, &m);
	if (err) {
		fprintf(stderr, "kvtier-bench: cannot create the manager: %s\n", kvt_strerror(err));
		return 1;
	}
	ids = calloc(o->seqs, sizeof(*ids));
	k = malloc(krow * sizeof(*k));
	q = malloc((size_t)o->seqs * Hq * D * sizeof(*q));
	kd = calloc((size_t)o->seqs * H * D, sizeof(*kd));
	t = calloc(o->steps, sizeof(*t));
	if (!ids || !k || !q || !kd || !t) {
		fprintf(stderr, "kvtier-bench: out of memory\n");
		goto out;
	}
	bench_rand_bf16(&rng, k, krow, 0x7fu);
	for (uint32_t i = 0; i < o->seqs && !err; i++) {
		ids[i] = 9000 + (uint64_t)i;
		err = kvt_seq_create(m, ids[i], o->prompt);
		for (uint32_t l = 0; !err && l < o->layers; l++)
			err = kvt_prefill_layer(m, ids[i], l, k, k, k, NULL);
	}
	if (err) {
		fprintf(stderr, "kvtier-bench: setup: %s\n", kvt_manager_last_error(m));
		goto out;
	}
	for (uint32_t s = 0; s < o->steps; s++) {
		double t0;

		for (uint32_t l = 0; l < o->layers && !err; l++)
			err = kvt_decode_append(m, l, ids, o->seqs, kd, kd, NULL);
		bench_rand_bf16(&rng, q, (size_t)o->seqs * Hq * D, 0xffu);
		t0 = sim_now_s();
		for (uint32_t l = 0; l < o->layers && !err; l++)
			err = kvt_decode_recall(m, l, ids, o->seqs, q, NULL);
		t[s] = sim_now_s() - t0;
		if (err) {
			fprintf(stderr, "kvtier-bench: step %u: %s\n", s,
				kvt_manager_last_error(m));
			goto out;
		}
	}
	qsort(t + 1, o->steps - 1, sizeof(*t), sim_cmp_double);

	double med = t[1 + (o->steps - 1) / 2];
	struct kvt_stats st = KVT_STATS_INIT;

	kvt_manager_stats(m, &st);
	printf("kvtier-bench recall --quest: host backend, %u sequences x %u layers x 8 kv heads "
	       "(32 q heads, d=128, bf16), prompt %u, r = %u, %u recall thread(s), %u steps "
	       "(first excluded)\n",
	       o->seqs, o->layers, o->prompt, o->r, o->threads, o->steps);
	printf("per step: median %.2f ms; per (sequence, layer) %.1f us; hit rate %.3f\n",
	       med * 1e3, med * 1e6 / ((double)o->seqs * o->layers),
	       (double)st.recall_hits / (double)(st.recall_lookups ? st.recall_lookups : 1));
	rc = 0;
out:
	kvt_manager_destroy(m);
	free(ids);
	free(k);
	free(q);
	free(kd);
	free(t);
	return rc;
}

int bench_recall(int argc, char **argv)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_manager *m = NULL;
	struct bench_recall_opts o;
	uint64_t *ids = NULL, rng = 42;
	uint32_t *sel = NULL;
	double *t = NULL, *loads = NULL, *hits = NULL, *tt = NULL, *ta = NULL;
	uint8_t *kd = NULL, *dummy = NULL;
	struct tab_bufs tb = {0};
	FILE *csv = NULL;
	int err, rc = 1;

	if (parse(argc, argv, &o))
		return 2;
	if (o.quest)
		return bench_quest(&o);
	if (o.cuda)
		return bench_recall_cuda(&o);
	c.n_layers = o.layers;
	c.backend = KVT_BACKEND_HOST;
	c.save_threads = 0;
	c.recall_threads = o.threads;

	uint32_t H = c.n_kv_heads, bt = c.block_tokens;
	uint64_t row = (uint64_t)c.head_dim * 2, block = 2ull * bt * row, group = H * block;
	uint64_t frames = (c.sink_tokens + c.recent_tokens + c.topk_tokens) / bt + 1;
	uint64_t blocks = (o.prompt + o.steps + bt - 1) / bt + 1;
	uint64_t per_step = (uint64_t)o.seqs * o.layers * H * o.r;
	/* Blocks nobody holds on the device with the null backend's top-K choice (the last
	   candidates before the ring): after the sink, before the top-K range. */
	uint32_t lo_b = c.sink_tokens / bt;
	uint32_t hi_b = (bench_recall_shortest(&o, bt) - c.recent_tokens - c.topk_tokens) / bt;

	if (hi_b < lo_b + o.r) {
		fprintf(stderr,
			"kvtier-bench: prompt %u leaves fewer than r = %u recallable "
			"blocks\n",
			o.prompt, o.r);
		return 2;
	}
	c.recall_cache_bytes = per_step * o.cache_pct / 100 * block;
	c.device_bytes = group * frames * o.layers * o.seqs + c.recall_cache_bytes;
	c.host_bytes = group * blocks * o.layers * o.seqs;
	err = kvt_manager_create_with(&c, &kvt_backend_null_ops, &m);
	if (err) {
		fprintf(stderr, "kvtier-bench: cannot create the manager: %s\n", kvt_strerror(err));
		return 1;
	}
	size_t sel_n = (size_t)o.layers * o.seqs * H * o.r;

	ids = calloc(o.seqs, sizeof(*ids));
	sel = malloc(sel_n * sizeof(*sel));
	t = calloc(o.steps, sizeof(*t));
	loads = calloc(o.steps, sizeof(*loads));
	hits = calloc(o.steps, sizeof(*hits));
	kd = calloc((size_t)o.seqs * H, row);
	dummy = calloc(1, 64);
	tt = calloc(o.steps, sizeof(*tt));
	ta = calloc(o.steps, sizeof(*ta));
	if (!ids || !sel || !t || !loads || !hits || !kd || !dummy || !tt || !ta ||
	    (o.tables && tab_bufs_init(&tb, o.seqs, H, (uint32_t)frames, o.r))) {
		fprintf(stderr, "kvtier-bench: out of memory\n");
		goto out;
	}
	for (uint32_t i = 0; i < o.seqs && !err; i++) {
		ids[i] = 5000 + 3 * (uint64_t)i;
		err = kvt_seq_create(m, ids[i], bench_recall_prompt(&o, i, bt));
		for (uint32_t l = 0; !err && l < o.layers; l++)
			err = kvt_prefill_layer(m, ids[i], l, dummy, dummy, dummy, NULL);
	}
	if (err) {
		fprintf(stderr, "kvtier-bench: setup: %s\n", kvt_manager_last_error(m));
		goto out;
	}
	/* initial selection: r distinct blocks per (layer, sequence, head) */
	for (size_t g = 0; g < sel_n / o.r; g++)
		for (uint32_t j = 0; j < o.r; j++)
			sel[g * o.r + j] = lo_b + (uint32_t)((g * 7 + j * 5) % (hi_b - lo_b));

	for (uint32_t s = 0; s < o.steps; s++) {
		struct kvt_stats a = KVT_STATS_INIT, b = KVT_STATS_INIT;
		double t0;

		for (uint32_t l = 0; l < o.layers && !err; l++)
			err = kvt_decode_append(m, l, ids, o.seqs, kd, kd, NULL);
		/* churn: replace some selected blocks (repeats are allowed and ignored) */
		for (size_t x = 0; x < sel_n && o.churn_pct; x++)
			if (sim_splitmix64(&rng) % 100 < o.churn_pct)
				sel[x] = lo_b + (uint32_t)(sim_splitmix64(&rng) % (hi_b - lo_b));
		kvt_manager_stats(m, &a);
		t0 = 1e9 * sim_now_s();
		if (o.step) {
			err = kvt_step_begin(m, ids, o.seqs);
			for (uint32_t l = 0; l < o.layers && !err; l++)
				err = kvt_step_recall_blocks(
					m, l, sel + (size_t)l * o.seqs * H * o.r, o.r, NULL);
			if (!err && o.tables)
				err = tab_step(m, &o, ids, &tb, &tt[s], &ta[s]);
			if (!err)
				err = kvt_step_end(m);
		} else {
			for (uint32_t l = 0; l < o.layers && !err; l++)
				err = kvt_recall_blocks(m, l, ids, o.seqs,
							sel + (size_t)l * o.seqs * H * o.r, o.r,
							NULL);
		}
		t[s] = 1e9 * sim_now_s() - t0 - tt[s] - ta[s];
		kvt_manager_stats(m, &b);
		loads[s] = (double)(b.recall_loads - a.recall_loads);
		hits[s] = (double)(b.recall_hits - a.recall_hits);
		if (err) {
			fprintf(stderr, "kvtier-bench: step %u: %s\n", s,
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
		fprintf(csv, "step,ns,loads,hits\n");
		for (uint32_t s = 0; s < o.steps; s++)
			fprintf(csv, "%u,%.0f,%.0f,%.0f\n", s, t[s], loads[s], hits[s]);
	}
	/* the first step fills the cache: figures are over the steps after it */
	double tot_l = 0, tot_h = 0;

	for (uint32_t s = 1; s < o.steps; s++) {
		tot_l += loads[s];
		tot_h += hits[s];
	}
	qsort(t + 1, o.steps - 1, sizeof(*t), sim_cmp_double);

	uint32_t n = o.steps - 1;
	double med = t[1 + n / 2], p90 = t[1 + n * 9 / 10];

	printf("kvtier-bench recall: null backend (bookkeeping only), %u sequences x %u layers "
	       "x 8 kv heads, r = %u, prompt %u%s, %u steps (first excluded), churn %u%%%s\n",
	       o.seqs, o.layers, o.r, o.prompt, o.stagger ? " (staggered: less i mod 32)" : "",
	       o.steps, o.churn_pct, o.step ? ", step API" : "");
	printf("recall cache %llu frames (%u%% of the %llu blocks one step asks for)\n",
	       (unsigned long long)(per_step * o.cache_pct / 100), o.cache_pct,
	       (unsigned long long)per_step);
	printf("per step: median %.1f us, p90 %.1f us; %.2f ns per block asked for; loads "
	       "%.0f, hit rate %.3f\n",
	       med / 1e3, p90 / 1e3, med / (double)per_step, tot_l / n,
	       tot_h / (tot_h + tot_l > 0 ? tot_h + tot_l : 1));
	printf("per layer call (%u sequences x 8 heads x r): %.1f us\n", o.seqs,
	       med / 1e3 / o.layers);
	printf("target < 500 us per step of 256 x 32 with r = 16: %s (median / target = %.2f)\n",
	       o.seqs == 256 && o.layers == 32 && o.r == 16 ? (med < 500e3 ? "met" : "NOT met")
							    : "n/a (other shape)",
	       med / 500e3);
	if (o.tables) {
		qsort(tt + 1, n, sizeof(*tt), sim_cmp_double);
		qsort(ta + 1, n, sizeof(*ta), sim_cmp_double);
		printf("attention inputs per step: kvt_step_tables %u calls, median %.1f us; "
		       "kvt_seq_frames + kvt_seq_recall_view %llu calls, median %.1f us; "
		       "ratio %.1fx\n",
		       o.layers, tt[1 + n / 2] / 1e3, 2ull * o.seqs * o.layers * H,
		       ta[1 + n / 2] / 1e3,
		       ta[1 + n / 2] / (tt[1 + n / 2] > 0 ? tt[1 + n / 2] : 1));
	}
	rc = 0;
out:
	if (csv)
		fclose(csv);
	kvt_manager_destroy(m);
	free(ids);
	free(sel);
	free(t);
	free(loads);
	free(hits);
	free(kd);
	free(dummy);
	free(tt);
	free(ta);
	if (o.tables)
		tab_bufs_fini(&tb);
	return rc;
}
