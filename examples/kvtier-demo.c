/* SPDX-License-Identifier: MIT */
/*
 * kvtier-demo: prefills one synthetic long request through kvtier layer by layer, decodes
 * tokens, and reports what stayed resident on the device, whether SnapKV kept the tokens the
 * observation window attends to, the bytes moved each way, and a read-back check of every token.
 *
 * The prompt is random except for planted "needle" tokens whose keys point along the
 * observation queries: a selection that works keeps all of them.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "kvtier.h"
#include "policy.h"

struct opts {
	uint32_t prompt, decode, layers, needles, threads;
	uint64_t seed;
	bool quiet;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-demo [options]\n"
		"Prefill one synthetic request through kvtier (host backend, Llama-3-8B head\n"
		"geometry: 8 kv heads, 32 q heads, d=128, bf16; sink 128, recent 512, top-K\n"
		"4096, 32-token blocks), decode tokens, and report residency and traffic.\n\n"
		"  --prompt N     prompt tokens (default 8192)\n"
		"  --decode N     decode steps (default 1024)\n"
		"  --layers N     layers (default 4)\n"
		"  --needles N    planted tokens per kv head that selection must keep (default 64)\n"
		"  --threads N    save threads (default 2)\n"
		"  --seed N       random seed (default 1)\n"
		"  -h, --help     this text\n"
		"Exit status: 0 when every check passed, 1 when one failed, 2 on bad usage.\n");
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"prompt", required_argument, NULL, 'p'},
		{"decode", required_argument, NULL, 'd'},
		{"layers", required_argument, NULL, 'l'},
		{"needles", required_argument, NULL, 'n'},
		{"threads", required_argument, NULL, 't'},
		{"seed", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int c, li = 0;

	*o = (struct opts){8192, 1024, 4, 64, 2, 1, false};
	while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		uint32_t v = 0;
		int bad = 0;

		switch (c) {
		case 'p':
			bad = sim_parse_u32(optarg, 1, 1u << 20, &o->prompt);
			break;
		case 'd':
			bad = sim_parse_u32(optarg, 0, 1u << 24, &o->decode);
			break;
		case 'l':
			bad = sim_parse_u32(optarg, 1, 1024, &o->layers);
			break;
		case 'n':
			bad = sim_parse_u32(optarg, 0, 4096, &o->needles);
			break;
		case 't':
			bad = sim_parse_u32(optarg, 0, 64, &o->threads);
			break;
		case 's':
			bad = sim_parse_u32(optarg, 0, UINT32_MAX, &v);
			o->seed = v;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
		if (bad)
			return cli_bad_value("kvtier-demo", lo[li].name, optarg);
	}
	if (cli_no_extra("kvtier-demo", argc, argv))
		return -1;
	return 0;
}

/* Uniform in [-1, 1). */
static float rng_f(uint64_t *s)
{
	return (float)(sim_splitmix64(s) >> 40) / (float)(1u << 23) - 1.0f;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Token values are a function of (layer, head, pos, kv) so read-back can be checked without
   keeping copies: a per-token seed feeds the generator. */
static void token_row(float *row, uint32_t d, uint64_t seed, uint32_t layer, uint32_t h,
		      uint32_t pos, int is_v)
{
	uint64_t s =
		seed ^ ((uint64_t)layer << 48) ^ ((uint64_t)h << 36) ^ ((uint64_t)is_v << 35) ^ pos;

	sim_splitmix64(&s);
	for (uint32_t i = 0; i < d; i++)
		row[i] = rng_f(&s);
}

/* The query direction of (layer, kv head): needle keys are half of it. */
static void query_dir(float *qdir, uint32_t d, uint64_t seed, uint32_t layer, uint32_t h,
		      uint64_t *state)
{
	*state = seed ^ (0xabcdull << 32) ^ ((uint64_t)layer << 16) ^ h;
	for (uint32_t i = 0; i < d; i++)
		qdir[i] = rng_f(state);
}

static void mib(char *buf, size_t n, uint64_t bytes)
{
	snprintf(buf, n, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
}

int main(int argc, char **argv)
{
	struct kvt_config c = KVT_CONFIG_INIT;
	struct kvt_stats st = KVT_STATS_INIT;
	struct kvt_manager *m = NULL;
	struct opts o;
	uint8_t *k = NULL, *v = NULL, *q = NULL, *kd = NULL, *vd = NULL, *rk = NULL, *rv = NULL;
	uint8_t *want = NULL;
	float *row = NULL, *qdir = NULL;
	int32_t *pos = NULL;
	uint32_t *needle = NULL;
	uint64_t id = 42, needles_kept = 0, needles_total = 0, tokens_checked = 0, bad = 0;
	double t0, t_prefill = 0, t_decode = 0;
	int err, rc = 1;

	if (parse_opts(argc, argv, &o))
		return 2;
	c.n_layers = o.layers;
	c.backend = KVT_BACKEND_HOST;
	c.save_threads = o.threads;
	uint32_t H = c.n_kv_heads, Hq = c.n_q_heads, D = c.head_dim, G = Hq / H;
	uint32_t L = o.prompt, N = o.prompt + o.decode;
	size_t row_b = (size_t)D * 2;
	/* Device: the resident set of every layer; host: every token of every layer. */
	uint64_t group = (uint64_t)H * 2 * c.block_tokens * row_b;
	uint64_t frames = (c.sink_tokens + c.recent_tokens + c.topk_tokens) / c.block_tokens + 1;
	c.device_bytes = group * frames * o.layers;
	c.host_bytes = group * ((N + c.block_tokens - 1) / c.block_tokens) * o.layers;

	err = kvt_manager_create(&c, &m);
	if (err) {
		fprintf(stderr, "kvtier-demo: kvt_manager_create: %s\n", kvt_strerror(err));
		return 1;
	}
	k = malloc((size_t)H * L * row_b);
	v = malloc((size_t)H * L * row_b);
	q = malloc((size_t)Hq * c.obs_window * row_b);
	kd = malloc((size_t)H * row_b);
	vd = malloc((size_t)H * row_b);
	rk = malloc(row_b);
	rv = malloc(row_b);
	want = malloc(row_b);
	row = malloc((size_t)D * sizeof(float));
	qdir = malloc((size_t)D * sizeof(float));
	pos = malloc((size_t)(c.sink_tokens + c.recent_tokens + c.topk_tokens) * sizeof(*pos));
	needle = malloc((size_t)(o.needles ? o.needles : 1) * sizeof(*needle));
	if (!k || !v || !q || !kd || !vd || !rk || !rv || !want || !row || !qdir || !pos ||
	    !needle) {
		fprintf(stderr, "kvtier-demo: out of memory\n");
		goto out;
	}
	err = kvt_seq_create(m, id, L);
	if (err)
		goto api_fail;

	printf("kvtier %s demo: host backend, %u layers, %u kv heads x %u q heads, d=%u, bf16\n",
	       kvt_version(), c.n_layers, H, Hq, D);
	printf("prompt %u tokens, decode %u; sink %u + top-K %u + recent %u, %u-token blocks\n\n",
	       L, o.decode, c.sink_tokens, c.topk_tokens, c.recent_tokens, c.block_tokens);

	/* Needle positions: inside the candidate range, the same for every head and layer. */
	uint32_t cand_lo = c.sink_tokens;
	uint32_t cand_hi = L > c.recent_tokens ? L - c.recent_tokens : 0;
	uint32_t n_needles = 0;

	if (cand_hi > cand_lo + 2 * o.needles && L > c.sink_tokens + c.recent_tokens) {
		uint64_t s = o.seed * 7919;

		n_needles = o.needles;
		for (uint32_t i = 0; i < n_needles; i++) {
			uint32_t p;
			bool dup;

			do { /* distinct positions at least 8 apart keep pooled scores separate */
				p = cand_lo + (uint32_t)(sim_splitmix64(&s) % (cand_hi - cand_lo));
				dup = false;
				for (uint32_t j = 0; j < i; j++)
					dup |= (p > needle[j] ? p - needle[j] : needle[j] - p) < 8;
			} while (dup);
			needle[i] = p;
		}
		qsort(needle, n_needles, sizeof(*needle), cmp_u32);
	}

	for (uint32_t l = 0; l < c.n_layers; l++) {
		/* Queries: one random direction per kv group plus noise; needle keys lie along
		   it, so the observation window's attention (and the vote) concentrates there. */
		for (uint32_t h = 0; h < H; h++) {
			uint64_t s;

			query_dir(qdir, D, o.seed, l, h, &s);
			for (uint32_t g = h * G; g < (h + 1) * G; g++)
				for (uint32_t i = 0; i < c.obs_window; i++) {
					for (uint32_t d = 0; d < D; d++)
						row[d] = qdir[d] + 0.1f * rng_f(&s);
					kvt_from_f32(c.dtype, row,
						     q + ((size_t)g * c.obs_window + i) * row_b, D);
				}
			for (uint32_t p = 0; p < L; p++) {
				bool is_needle = bsearch(&p, needle, n_needles, sizeof(*needle),
							 cmp_u32) != NULL;

				token_row(row, D, o.seed, l, h, p, 0);
				if (is_needle)
					for (uint32_t d = 0; d < D; d++)
						row[d] = 0.5f * qdir[d];
				kvt_from_f32(c.dtype, row, k + ((size_t)h * L + p) * row_b, D);
				token_row(row, D, o.seed, l, h, p, 1);
				kvt_from_f32(c.dtype, row, v + ((size_t)h * L + p) * row_b, D);
			}
		}
		t0 = sim_now_s();
		err = kvt_prefill_layer(m, id, l, k, v, q, NULL);
		t_prefill += sim_now_s() - t0;
		if (err)
			goto api_fail;
	}

	/* Let the prefill's saves land so decode timing measures decode alone. */
	err = kvt_manager_sync(m, NULL);
	if (err)
		goto api_fail;

	/* Decode: one token per step for every layer. */
	for (uint32_t step = 0; step < o.decode; step++) {
		for (uint32_t l = 0; l < c.n_layers; l++) {
			for (uint32_t h = 0; h < H; h++) {
				token_row(row, D, o.seed, l, h, L + step, 0);
				kvt_from_f32(c.dtype, row, kd + h * row_b, D);
				token_row(row, D, o.seed, l, h, L + step, 1);
				kvt_from_f32(c.dtype, row, vd + h * row_b, D);
			}
			t0 = sim_now_s();
			err = kvt_decode_append(m, l, &id, 1, kd, vd, NULL);
			t_decode += sim_now_s() - t0;
			if (err)
				goto api_fail;
		}
	}
	err = kvt_manager_sync(m, NULL);
	if (err)
		goto api_fail;

	/* What stayed resident, per layer (head 0) and needles kept (all heads). */
	printf("resident on the device after %u tokens (per kv head):\n", N);
	for (uint32_t l = 0; l < c.n_layers; l++) {
		uint32_t n = 0, n_sink = 0, n_ring = 0, n_top = 0;

		for (uint32_t h = 0; h < H; h++) {
			err = kvt_seq_resident_positions(
				m, id, l, h, pos, c.sink_tokens + c.recent_tokens + c.topk_tokens,
				&n);
			if (err)
				goto api_fail;
			for (uint32_t i = 0; i < n_needles; i++) {
				needles_total++;
				for (uint32_t j = 0; j < n; j++)
					if ((uint32_t)pos[j] == needle[i]) {
						needles_kept++;
						break;
					}
			}
			if (h)
				continue;
			for (uint32_t j = 0; j < n; j++) {
				uint32_t p = (uint32_t)pos[j];

				if (p < c.sink_tokens)
					n_sink++;
				else if (p + c.recent_tokens >= N)
					n_ring++;
				else
					n_top++;
			}
		}
		printf("  layer %2u: %u tokens = sink %u + top-K %u + ring %u  (first top-K "
		       "%d, last ring %d)\n",
		       l, n, n_sink, n_top, n_ring, n > n_sink ? pos[n_sink] : -1,
		       n ? pos[n - 1] : -1);
	}
	if (n_needles)
		printf("planted needle tokens kept by SnapKV: %llu of %llu\n",
		       (unsigned long long)needles_kept, (unsigned long long)needles_total);

	/* Read every token back, from whichever tier holds it, and compare K and V with the
	   generator (needle keys included). */
	for (uint32_t l = 0; l < c.n_layers; l++)
		for (uint32_t h = 0; h < H; h++) {
			uint64_t s;

			query_dir(qdir, D, o.seed, l, h, &s);
			for (uint32_t p = 0; p < N; p++) {
				if (kvt_seq_read_token(m, id, l, h, p, rk, rv))
					goto api_fail;
				token_row(row, D, o.seed, l, h, p, 0);
				if (p < L &&
				    bsearch(&p, needle, n_needles, sizeof(*needle), cmp_u32))
					for (uint32_t d = 0; d < D; d++)
						row[d] = 0.5f * qdir[d];
				kvt_from_f32(c.dtype, row, want, D);
				bad += memcmp(rk, want, row_b) != 0;
				token_row(row, D, o.seed, l, h, p, 1);
				kvt_from_f32(c.dtype, row, want, D);
				bad += memcmp(rv, want, row_b) != 0;
				tokens_checked++;
			}
		}
	printf("read back %llu tokens (K and V, every layer, head and position, from whichever "
	       "tier holds each): %llu mismatches\n",
	       (unsigned long long)tokens_checked, (unsigned long long)bad);

	err = kvt_manager_stats(m, &st);
	if (err)
		goto api_fail;
	{
		char a[32], b[32], d2[32], rd[32], full[32];
		uint64_t full_b = (uint64_t)N * c.n_layers * H * 2 * row_b;

		mib(a, sizeof(a), st.bytes_d2h);
		mib(b, sizeof(b), st.bytes_h2d);
		mib(d2, sizeof(d2), st.bytes_d2d);
		mib(rd, sizeof(rd), st.bytes_read);
		mib(full, sizeof(full), full_b);
		printf("\nbytes moved: saved device->host %s (write-through of every token), loaded "
		       "host->device %s,\n  written into device frames %s, read back from device "
		       "frames %s\n",
		       a, b, d2, rd);
		printf("device frames in use %llu of %llu (%.1f MiB); full KV would be %s (%.1fx "
		       "the resident set)\n",
		       (unsigned long long)st.device_frames_used,
		       (unsigned long long)st.device_frames_total,
		       (double)st.device_frames_used * 2 * c.block_tokens * row_b / 1048576.0, full,
		       (double)full_b /
			       ((double)st.device_frames_used * 2 * c.block_tokens * row_b));
		printf("host blocks in use %llu; tokens saved %llu (layer x token)\n",
		       (unsigned long long)st.host_blocks_used,
		       (unsigned long long)st.tokens_saved);
		printf("time: prefill %.3f s (%.1f ms/layer incl. SnapKV on the CPU), decode %.2f "
		       "us/token/layer\n",
		       t_prefill, 1e3 * t_prefill / c.n_layers,
		       o.decode ? 1e6 * t_decode / ((double)o.decode * c.n_layers) : 0.0);
	}
	rc = (bad == 0 && needles_kept == needles_total) ? 0 : 1;
	printf("\n%s\n", rc == 0 ? "all checks passed" : "CHECKS FAILED");
	goto out;
api_fail:
	fprintf(stderr, "kvtier-demo: %s: %s\n", kvt_strerror(err), kvt_manager_last_error(m));
out:
	kvt_manager_destroy(m);
	free(k);
	free(v);
	free(q);
	free(kd);
	free(vd);
	free(rk);
	free(rv);
	free(want);
	free(row);
	free(qdir);
	free(pos);
	free(needle);
	return rc;
}
