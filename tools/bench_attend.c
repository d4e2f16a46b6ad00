/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench attend: the batched decode attention of one layer for a batch. Llama-3-8B
 * geometry; every sequence prefilled with random rows, a recall of r random blocks per kv head,
 * then the attention of the whole batch timed per repetition (median over --reps). The bytes
 * it moves are counted from the attention tables (kvt_step_tables, read back to the host): the
 * K and V rows of every token they name, resident or recalled, each once.
 *
 * --backend host (default): kvt_step_attend against the per-sequence reference it replaces
 * (kvt_attend per member), wall time of each; the CPU reference's time.
 *
 * --backend cuda (tools/bench_attend_cuda.c): the kernels' HBM bandwidth against the device's
 * copy bandwidth measured in the same run (goal: a ratio >= 0.7), with the output checked
 * against kvt_attend once.
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
		"usage: kvtier-bench attend [options]\n"
		"Times the batched decode attention of one layer (kvt_step_attend), Llama-3-8B\n"
		"geometry (8 kv heads, 32 q heads, d=128, bf16, 32-token blocks, sink 128, recent\n"
		"512, top-K 4096), r random blocks recalled per kv head; bytes counted from the\n"
		"attention tables (K and V rows of every token they name, each once).\n"
		"  host backend: against kvt_attend per sequence (the CPU reference): the median\n"
		"                time of each, their ratio, the batched call's bandwidth.\n"
		"  cuda backend: tensors on the device; the median device time (CUDA events, one\n"
		"                stream) of kvt_step_attend and of kvt_attend_tables over tables\n"
		"                kvt_step_tables wrote to device buffers, the bandwidth over the K\n"
		"                and V rows read plus q and out, the device's copy bandwidth\n"
		"                (cudaMemcpyAsync device to device, read + write bytes) measured\n"
		"                in the same run, and the kernels' ratio to it (goal >= 0.7); the\n"
		"                output is checked against kvt_attend once. Needs the CUDA plugin\n"
		"                and the CUDA runtime (libcudart.so, $KVTIER_CUDART when set).\n\n"
		"  --backend B    host (default) or cuda\n"
		"  --seqs N       sequences in the batch (default 8)\n"
		"  --prompt N     prompt tokens per sequence (default 8192)\n"
		"  --r N          blocks recalled per kv head (default 16)\n"
		"  --reps N       repetitions timed (default 5)\n"
		"  --copy-mib N   cuda: MiB of the device-to-device copy timed (default 1024;\n"
		"                 less when the device has not 4 times that free)\n"
		"  -h, --help     this text\n"
		"Exit status: 0 on success, 1 on a failure (a library or CUDA error, or a wrong\n"
		"output; never on time), 2 on bad usage, 77 when --backend cuda finds no usable\n"
		"device (no plugin, no CUDA runtime or no GPU: skipped).\n");
}

static int parse(int argc, char **argv, struct bench_attend_opts *o)
{
	static const struct option lo[] = {
		{"seqs", required_argument, NULL, 's'},
		{"prompt", required_argument, NULL, 'p'},
		{"r", required_argument, NULL, 'r'},
		{"reps", required_argument, NULL, 'n'},
		{"backend", required_argument, NULL, 'b'},
		{"copy-mib", required_argument, NULL, 'c'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	bool copy_set = false;
	int c, bad, li = 0;

	*o = (struct bench_attend_opts){8, 8192, 16, 5, 1024, false};
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
		case 'b':
			if (strcmp(optarg, "host") == 0)
				o->cuda = false;
			else if (strcmp(optarg, "cuda") == 0)
				o->cuda = true;
			else
				bad = 1;
			break;
		case 'c':
			bad = sim_parse_u32(optarg, 1, 1u << 20, &o->copy_mib);
			copy_set = true;
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
	if (copy_set && !o->cuda) {
		fprintf(stderr, "kvtier-bench: --copy-mib applies only with --backend cuda\n");
		return -1;
	}
	return 0;
}

static double median(double *t, uint32_t n)
{
	qsort(t, n, sizeof(*t), sim_cmp_double);
	return t[n / 2];
}

void bench_attend_config(const struct bench_attend_opts *o, struct kvt_config *c)
{
	*c = (struct kvt_config)KVT_CONFIG_INIT;
	c->backend = o->cuda ? KVT_BACKEND_CUDA : KVT_BACKEND_HOST;
	c->n_layers = 1;
	c->recall_blocks = o->r;
	c->save_threads = 0;

	uint64_t block = 2ull * c->block_tokens * c->head_dim * 2, group = c->n_kv_heads * block;

	c->recall_cache_bytes = (uint64_t)o->seqs * c->n_kv_heads * o->r * 2 * block;
	c->device_bytes = group * bench_attend_max_frames(c) * o->seqs + c->recall_cache_bytes;
	c->host_bytes = group * ((o->prompt + c->block_tokens - 1) / c->block_tokens + 2) * o->seqs;
}

uint32_t bench_attend_max_frames(const struct kvt_config *c)
{
	return (c->sink_tokens + c->recent_tokens + c->topk_tokens) / c->block_tokens + 2;
}

int bench_attend_inputs(const struct bench_attend_opts *o, const struct kvt_config *c,
			struct bench_attend_in *in)
{
	uint32_t H = c->n_kv_heads, bt = c->block_tokens, lo_b = c->sink_tokens / bt;
	uint32_t hi_b =
		o->prompt > c->recent_tokens + bt ? (o->prompt - c->recent_tokens) / bt : lo_b + 1;
	uint64_t rng = 11;

	*in = (struct bench_attend_in){
		.k_n = (size_t)H * o->prompt * c->head_dim,
		.qo_n = (size_t)c->n_q_heads * c->obs_window * c->head_dim,
		.q_n = (size_t)o->seqs * c->n_q_heads * c->head_dim,
	};
	in->k = malloc(in->k_n * 2);
	in->qo = calloc(in->qo_n, 2);
	in->q = malloc(in->q_n * 2);
	in->sel = malloc((size_t)o->seqs * H * o->r * sizeof(*in->sel));
	if (!in->k || !in->qo || !in->q || !in->sel) {
		fprintf(stderr, "kvtier-bench: out of memory\n");
		bench_attend_inputs_free(in);
		return -1;
	}
	bench_rand_bf16(&rng, in->k, in->k_n, 0x7fu);
	bench_rand_bf16(&rng, in->q, in->q_n, 0xffu);
	for (size_t x = 0; x < (size_t)o->seqs * H * o->r; x++)
		in->sel[x] = lo_b + (uint32_t)(sim_splitmix64(&rng) % (hi_b - lo_b));
	return 0;
}

void bench_attend_inputs_free(struct bench_attend_in *in)
{
	free(in->k);
	free(in->qo);
	free(in->q);
	free(in->sel);
	*in = (struct bench_attend_in){0};
}

uint64_t bench_attend_tokens(const struct kvt_attn_tables *t, size_t rows)
{
	uint64_t tokens = 0;

	for (size_t x = 0; x < rows; x++) {
		tokens += t->n_tokens[x];
		for (uint32_t j = 0; j < t->n_recall[x] && j < t->max_recall; j++)
			tokens += t->recall_tokens[x * t->max_recall + j] -
				  (uint32_t)__builtin_popcountll(
					  t->recall_skip[x * t->max_recall + j]);
	}
	return tokens;
}

/* The K and V bytes the attention tables of the open step name for layer 0 (every token
   once), from kvt_step_tables. 0 on an error (reported). */
static double table_bytes(struct kvt_manager *m, uint32_t n, const struct kvt_config *c, uint32_t r)
{
	uint32_t H = c->n_kv_heads, n_batch, mf = bench_attend_max_frames(c);
	size_t rows = (size_t)n * H;
	uint32_t *nt = calloc(rows, 4), *fr = calloc(rows * mf, 4), *nr = calloc(rows, 4);
	uint32_t *rc = calloc(rows * r, 4), *rt = calloc(rows * r, 4);
	uint64_t *rs = calloc(rows * r, 8), tokens = 0;
	struct kvt_attn_tables t = {sizeof(t), n, mf, r, &n_batch, nt, fr, nr, rc, rt, rs};
	int err = nt && fr && nr && rc && rt && rs ? kvt_step_tables(m, 0, &t, NULL) : -ENOMEM;

	if (!err)
		tokens = bench_attend_tokens(&t, rows);
	else
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
	struct kvt_config c;
	struct kvt_manager *m = NULL;
	struct bench_attend_opts o;
	struct bench_attend_in in = {0};
	uint64_t *ids = NULL;
	uint16_t *out = NULL;
	float *qf = NULL, *of = NULL;
	double *tb = NULL, *tr = NULL, bytes;
	int err, rc = 1;

	if (parse(argc, argv, &o))
		return 2;
	if (o.cuda)
		return bench_attend_cuda(&o);
	bench_attend_config(&o, &c);

	uint32_t Hq = c.n_q_heads, D = c.head_dim;

	err = kvt_manager_create(&c, &m);
	if (err) {
		fprintf(stderr, "kvtier-bench: cannot create the manager: %s\n", kvt_strerror(err));
		return 1;
	}
	kvt_manager_config(m, &c);
	ids = calloc(o.seqs, sizeof(*ids));
	qf = malloc((size_t)Hq * D * 4);
	of = malloc((size_t)Hq * D * 4);
	tb = calloc(o.reps, sizeof(*tb));
	tr = calloc(o.reps, sizeof(*tr));
	out = malloc((size_t)o.seqs * Hq * D * 2);
	if (!ids || !qf || !of || !tb || !tr || !out) {
		fprintf(stderr, "kvtier-bench: out of memory\n");
		goto out;
	}
	if (bench_attend_inputs(&o, &c, &in))
		goto out;

	const uint16_t *q = in.q;

	for (uint32_t i = 0; i < o.seqs && !err; i++) {
		ids[i] = 100 + (uint64_t)i;
		err = kvt_seq_create(m, ids[i], o.prompt);
		if (!err)
			err = kvt_prefill_layer(m, ids[i], 0, in.k, in.k, in.qo, NULL);
	}
	if (!err)
		err = kvt_step_begin(m, ids, o.seqs);
	if (!err)
		err = kvt_step_recall_blocks(m, 0, in.sel, o.r, NULL);
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
	bench_attend_inputs_free(&in);
	free(out);
	free(ids);
	free(qf);
	free(of);
	free(tb);
	free(tr);
	return rc;
}
