/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench attend: the batched decode attention (kvt_step_attend) of one layer for a
 * batch, against the per-sequence reference it replaces (kvt_attend per member), on the host
 * backend (the CPU reference's time). Llama-3-8B geometry; every sequence prefilled with
 * random rows, a recall of r random blocks per kv head, then per repetition one
 * kvt_step_attend of the whole batch and kvt_attend for each member. The bytes the attention
 * reads (K and V rows of every token the attention tables name, each once) over the median
 * time give its bandwidth. The GPU's figure (the kernels' bandwidth against the device's copy
 * bandwidth) needs device tensors this tool does not make: not measured here yet.
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

struct aopts {
	uint32_t seqs, prompt, r, reps;
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvtier-bench attend [options]\n"
		   "Times the batched decode attention of one layer (kvt_step_attend) against\n"
		   "kvt_attend per sequence on the host backend (the CPU reference), Llama-3-8B\n"
		   "geometry (8 kv heads, 32 q heads, d=128,\n"
		   "bf16, 32-token blocks, sink 128, recent 512, top-K 4096), r random blocks\n"
		   "recalled per kv head. Prints the median time of each, their ratio, and the\n"
		   "batched attention's bandwidth over the K and V bytes it reads.\n\n"
		   "  --seqs N       sequences in the batch (default 8)\n"
		   "  --prompt N     prompt tokens per sequence (default 8192)\n"
		   "  --r N          blocks recalled per kv head (default 16)\n"
		   "  --reps N       repetitions timed (default 5)\n"
		   "  -h, --help     this text\n"
		   "Exit status: 0 on success, 1 on a library error, 2 on bad usage.\n");
}

static int parse(int argc, char **argv, struct aopts *o)
{
	static const struct option lo[] = {
		{"seqs", required_argument, NULL, 's'}, {"prompt", required_argument, NULL, 'p'},
		{"r", required_argument, NULL, 'r'},	{"reps", required_argument, NULL, 'n'},
		{"help", no_argument, NULL, 'h'},	{NULL, 0, NULL, 0},
	};
	int c, bad, li = 0;

	*o = (struct aopts){8, 8192, 16, 5};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		bad = 0;
		switch (c) {
		case 's':
			bad = sim_parse_u32(optarg, 1, 4096, &o->seqs);
			break;
		case 'p':
			bad = sim_parse_u32(optarg, 1024, 1u << 20, &o->prompt);
			break;
		case 'r':
			bad = sim_parse_u32(optarg, 1, 256, &o->r);
			break;
		case 'n':
			bad = sim_parse_u32(optarg, 2, 10000, &o->reps);
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
	return cli_no_extra("kvtier-bench", argc, argv) ? -1 : 0;
}

static double median(double *t, uint32_t n)
{
	qsort(t, n, sizeof(*t), sim_cmp_double);
	return t[n / 2];
}

/* The K and V bytes the attention tables of the open step name for layer 0 (every token
   once), from kvt_step_tables. 0 on an error (reported). */
static double table_bytes(struct kvt_manager *m, uint32_t n, const struct kvt_config *c, uint32_t r)
{
	uint32_t H = c->n_kv_heads, n_batch,
		 mf = (c->sink_tokens + c->recent_tokens + c->topk_tokens) / c->block_tokens + 2;
	size_t rows = (size_t)n * H;
	uint32_t *nt = calloc(rows, 4), *fr = calloc(rows * mf, 4), *nr = calloc(rows, 4);
	uint32_t *rc = calloc(rows * r, 4), *rt = calloc(rows * r, 4);
	uint64_t *rs = calloc(rows * r, 8), tokens = 0;
	struct kvt_attn_tables t = {sizeof(t), n, mf, r, &n_batch, nt, fr, nr, rc, rt, rs};
	int err = nt && fr && nr && rc && rt && rs ? kvt_step_tables(m, 0, &t, NULL) : -ENOMEM;

	for (size_t x = 0; !err && x < rows; x++) {
		tokens += nt[x];
		for (uint32_t j = 0; j < nr[x]; j++)
			tokens += rt[x * r + j] - (uint32_t)__builtin_popcountll(rs[x * r + j]);
	}
	if (err)
		fprintf(stderr, "kvtier-bench: tables: %s\n", kvt_manager_last_error(m));
	free(nt);
	free(fr);
	free(nr);
	free(rc);
	free(rt);
	free(rs);
	return err ? 0 : (double)tokens * 2 * c->head_dim * 2; /* K and V rows, bf16 */
}

int bench_attend(int argc, char **argv)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_manager *m = NULL;
	struct aopts o;
	uint64_t *ids = NULL, rng = 11;
	uint16_t *k = NULL, *qo = NULL, *q = NULL, *out = NULL;
	uint32_t *sel = NULL;
	float *qf = NULL, *of = NULL;
	double *tb = NULL, *tr = NULL, bytes;
	int err, rc = 1;

	if (parse(argc, argv, &o))
		return 2;
	c.backend = KVT_BACKEND_HOST;
	c.n_layers = 1;
	c.recall_blocks = o.r;
	c.save_threads = 0;

	uint32_t H = c.n_kv_heads, Hq = c.n_q_heads, D = c.head_dim, bt = c.block_tokens;
	uint64_t block = 2ull * bt * D * 2, group = H * block;
	uint64_t frames = (c.sink_tokens + c.recent_tokens + c.topk_tokens) / bt + 2;
	uint32_t lo_b = c.sink_tokens / bt,
		 hi_b = (o.prompt > c.recent_tokens + bt ? (o.prompt - c.recent_tokens) / bt
							 : lo_b + 1);
	size_t krow = (size_t)H * o.prompt * D, qn = (size_t)o.seqs * Hq * D;

	c.recall_cache_bytes = (uint64_t)o.seqs * H * o.r * 2 * block;
	c.device_bytes = group * frames * o.seqs + c.recall_cache_bytes;
	c.host_bytes = group * ((o.prompt + bt - 1) / bt + 2) * o.seqs;
	err = kvt_manager_create(&c, &m);
	if (err) {
		fprintf(stderr, "kvtier-bench: cannot create the manager: %s\n", kvt_strerror(err));
		return 1;
	}
	kvt_manager_config(m, &c);
	ids = calloc(o.seqs, sizeof(*ids));
	k = malloc(krow * 2);
	qo = calloc((size_t)Hq * c.obs_window * D, 2);
	q = malloc(qn * 2);
	out = malloc(qn * 2);
	qf = malloc((size_t)Hq * D * 4);
	of = malloc((size_t)Hq * D * 4);
	sel = malloc((size_t)o.seqs * H * o.r * sizeof(*sel));
	tb = calloc(o.reps, sizeof(*tb));
	tr = calloc(o.reps, sizeof(*tr));
	if (!ids || !k || !qo || !q || !out || !qf || !of || !sel || !tb || !tr) {
		fprintf(stderr, "kvtier-bench: out of memory\n");
		goto out;
	}
	bench_rand_bf16(&rng, k, krow, 0x7fu);
	bench_rand_bf16(&rng, q, qn, 0xffu);
	for (size_t x = 0; x < (size_t)o.seqs * H * o.r; x++)
		sel[x] = lo_b + (uint32_t)(sim_splitmix64(&rng) % (hi_b - lo_b));
	for (uint32_t i = 0; i < o.seqs && !err; i++) {
		ids[i] = 100 + (uint64_t)i;
		err = kvt_seq_create(m, ids[i], o.prompt);
		if (!err)
			err = kvt_prefill_layer(m, ids[i], 0, k, k, qo, NULL);
	}
	if (!err)
		err = kvt_step_begin(m, ids, o.seqs);
	if (!err)
		err = kvt_step_recall_blocks(m, 0, sel, o.r, NULL);
	if (err) {
		fprintf(stderr, "kvtier-bench: setup: %s\n", kvt_manager_last_error(m));
		goto out;
	}
	bytes = table_bytes(m, o.seqs, &c, o.r);
	if (!bytes)
		goto out;
	for (uint32_t s = 0; s < o.reps; s++) {
		double t0 = sim_now_s();

		err = kvt_step_attend(m, 0, q, out, NULL, NULL);
		tb[s] = sim_now_s() - t0;
		t0 = sim_now_s();
		for (uint32_t i = 0; i < o.seqs && !err; i++) {
			for (size_t x = 0; x < (size_t)Hq * D; x++) { /* bf16 -> f32 */
				uint32_t u = (uint32_t)q[(size_t)i * Hq * D + x] << 16;

				memcpy(&qf[x], &u, 4);
			}
			err = kvt_attend(m, ids[i], 0, qf, of);
		}
		tr[s] = sim_now_s() - t0;
		if (err) {
			fprintf(stderr, "kvtier-bench: attend: %s\n", kvt_manager_last_error(m));
			goto out;
		}
	}
	double mb = median(tb, o.reps), mr = median(tr, o.reps);

	printf("kvtier-bench attend: host backend, %u sequences x 8 kv heads (32 q heads, d=128, "
	       "bf16), prompt %u, r = %u, one layer, %u repetitions\n",
	       o.seqs, o.prompt, o.r, o.reps);
	printf("K and V bytes read per call: %.1f MB\n", bytes / 1e6);
	printf("kvt_step_attend (one call): median %.3f ms, %.2f GB/s\n", mb * 1e3,
	       bytes / mb / 1e9);
	printf("kvt_attend per sequence (%u calls): median %.3f ms; ratio %.2fx\n", o.seqs,
	       mr * 1e3, mr / mb);
	rc = 0;
out:
	kvt_manager_destroy(m);
	free(ids);
	free(k);
	free(qo);
	free(q);
	free(out);
	free(qf);
	free(of);
	free(sel);
	free(tb);
	free(tr);
	return rc;
}
