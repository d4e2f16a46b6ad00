/* SPDX-License-Identifier: MIT */
/*
 * decode_loop: an end-to-end decode loop over kvtier, written the way a serving engine drives it.
 *
 * A small synthetic transformer (random weights, real RoPE, attention only) prefills one long
 * prompt through kvtier and then decodes tokens with dynamic recall. Every decode layer runs on
 * kvtier's batched attention (kvt_step_attend, the step's whole batch in one call), and each
 * output is checked against dense attention over exactly the tokens kvtier kept, computed here
 * from our own full copy of K and V.
 *
 * Call order for each layer l:
 *   prefill (one layer of full KV at a time, as layer-segmented prefill does):
 *     compute K, V [kv head][token][dim] and the post-RoPE queries of the last obs_window
 *     positions [q head][obs_window][dim], then call kvt_prefill_layer. kvtier keeps the sink,
 *     the SnapKV top-K and the recent tokens on the device, and writes every token through to
 *     the host history. The engine computes its own dense causal attention for the prompt.
 *   decode step at position p (kvt_step_begin over the batch, here one sequence, before the
 *   first layer; kvt_step_end after the last):
 *     q, k, v of the new token, with RoPE at p
 *     kvt_step_append(k, v)     the token goes into the ring and the host history
 *     kvt_step_recall(q)        the recall_blocks host blocks per kv head with the highest
 *                               Quest bound become resident in the recall cache
 *     kvt_step_attend(q) -> out attention over resident plus recalled tokens; `out` feeds
 *                               the rest of the layer (an engine's own kernel reads the
 *                               same tokens from kvt_step_tables or kvt_step_paged)
 *   check (not part of an engine): kvt_seq_resident_positions, plus the slots of
 *   kvt_seq_recall_view not marked resident, give each kv head's kept set. Dense attention over
 *   that set must match `out` within 1e-4 of max|dense| (or 1e-5 absolute), and once p + 1
 *   passes what resident and recalled slots can hold (400 + 8 x 16) the set must be smaller
 *   than p + 1 (compression happened). The share of full attention's weight (softmax over all
 *   p + 1 tokens) that falls on the kept set is reported for information. Random weights give
 *   SnapKV and recall little to exploit, so that share stays near the share of tokens kept
 *   (0.12-0.14 with 12.6% of the tokens at the defaults, about 0.5 with half of them at
 *   --prompt 1024); a trained model's attention is concentrated and the share is high. The check
 *   against the kept set is what verifies kvtier.
 *
 * The model (a Python twin uses the same definition). RNG: a splitmix64 stream seeded with
 * --seed; uniform = (splitmix64() >> 40) * 2^-23 - 1, in [-1, 1). Draws, in order: embeddings
 * [512][256] (uniform); per layer Wq [256][512], Wk [256][128], Wv [256][128], Wo [512][256],
 * each entry uniform / sqrt(fan_in), with Wq also times Q_GAIN = 8 so softmax is peaked and the
 * choice of kept tokens matters; then the prompt ids, splitmix64() % 512. A layer does
 * h = x / sqrt(mean(x^2) + 1e-6); q = h Wq, k = h Wk, v = h Wv; RoPE (theta 10000, dims i and
 * i + 32 rotated by pos * theta^(-2i/64)) on q and k; x += attention Wo. The next token is the
 * argmax over ids other than the current one of x . embedding[id], ties to the lower id (with
 * tied embeddings the residual keeps the current token's own embedding, which would always win).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"

/* Geometry (fixed: the Python twin uses the same numbers). */
#define VOCAB 512u
#define D_MODEL 256u
#define N_KV 2u
#define N_Q 8u
#define HD 64u /* head_dim */
#define GROUP (N_Q / N_KV)
#define QD (N_Q * HD)
#define KD (N_KV * HD)
#define BLOCK_TOKENS 16u
#define SINK 16u
#define RECENT 128u
#define TOPK 256u
#define OBS_WINDOW 32u
#define POOL_KERNEL 7u
#define RECALL_BLOCKS 8u
#define WS_WINDOW 12u
#define SAVE_THREADS 2u
#define RESIDENT_MAX (SINK + RECENT + TOPK)
#define KEPT_MAX (RESIDENT_MAX + RECALL_BLOCKS * BLOCK_TOKENS)

#define Q_GAIN 8.0f
#define ROPE_THETA 10000.0
#define RMS_EPS 1e-6f
#define TOL_REL 1e-4
#define TOL_ABS 1e-5

/* Runs one kvtier call; on failure reports the function, the error and the manager's detail
   and jumps to `label` with err set (NCCL's CHECKGOTO). */
#define KVT_TRY(m, call, label)                                                                  \
	do {                                                                                     \
		err = (call);                                                                    \
		if (err) {                                                                       \
			fprintf(stderr, "decode_loop: %.*s: %s: %s\n", (int)strcspn(#call, "("), \
				#call, kvt_strerror(err), kvt_manager_last_error(m));            \
			goto label;                                                              \
		}                                                                                \
	} while (0)

struct opts {
	uint32_t prompt, decode, layers;
	uint64_t seed;
	bool quiet;
};

struct ctx {
	struct opts o;
	struct kvt_manager *m;
	uint64_t seq;
	uint32_t cap; /* prompt + decode: ground-truth tokens per (layer, kv head) */
	float *emb, *wq, *wk, *wv, *wo;
	float *gk, *gv; /* ground truth K, V: [layer][kv head][cap][HD] */
	float *x;	/* residual stream of the prompt [prompt][D_MODEL] */
	/* prefill scratch: q [T][N_Q][HD], k, v [N_KV][T][HD], q_obs, attention out [T][QD],
	   K^T of one kv head [HD][T rounded up to 64], logits */
	float *pq, *pk, *pv, *qobs, *att, *kt, *logit;
	double *w; /* softmax weights of the checks [cap] */
	int32_t pos[KEPT_MAX];
	struct kvt_recall_ref view[RECALL_BLOCKS];
	double t_kvt; /* seconds inside kvtier calls */
};

/* What one decode step found, over all layers and kv heads. */
struct step_check {
	double max_diff;	     /* max |kvtier - dense(kept)| */
	double mass;		     /* sum over (layer, q head) of full attention's weight
					on the kept tokens */
	uint64_t resident, recalled; /* kept tokens, summed over (layer, kv head) */
	bool ok, compressed;
};

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float uniform(uint64_t *s)
{
	return (float)(splitmix64(s) >> 40) / (float)(1u << 23) - 1.0f;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t round64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* y[0, n) += a * x[0, n), n a multiple of 64: fixed-width inner loops vectorise at -O2. */
static void axpy(float *restrict y, float a, const float *restrict x, size_t n)
{
	for (size_t i = 0; i < n; i += 64)
		for (size_t j = 0; j < 64; j++)
			y[i + j] += a * x[i + j];
}

/* y[n] = x[k] W[k][n] */
static void vec_mat(float *restrict y, const float *restrict x, const float *restrict w, size_t k,
		    size_t n)
{
	memset(y, 0, n * sizeof(*y));
	for (size_t i = 0; i < k; i++)
		axpy(y, x[i], w + i * n, n);
}

/* Rotates pairs (i, i + HD/2) of each of the n heads of x by pos * theta^(-2i/HD). */
static void rope(float *x, uint32_t n, uint32_t pos)
{
	float c[HD / 2], s[HD / 2];

	for (uint32_t i = 0; i < HD / 2; i++) {
		double a = pos * pow(ROPE_THETA, -2.0 * i / HD);

		c[i] = (float)cos(a);
		s[i] = (float)sin(a);
	}
	for (uint32_t h = 0; h < n; h++, x += HD)
		for (uint32_t i = 0; i < HD / 2; i++) {
			float a = x[i], b = x[i + HD / 2];

			x[i] = a * c[i] - b * s[i];
			x[i + HD / 2] = b * c[i] + a * s[i];
		}
}

/* q [N_Q][HD], k, v [N_KV][HD] of one token of layer l with residual x at position pos. */
static void project(const struct ctx *c, uint32_t l, const float *x, uint32_t pos, float *q,
		    float *k, float *v)
{
	float h[D_MODEL], ss = 0.0f;

	for (uint32_t i = 0; i < D_MODEL; i++)
		ss += x[i] * x[i];
	ss = 1.0f / sqrtf(ss / D_MODEL + RMS_EPS);
	for (uint32_t i = 0; i < D_MODEL; i++)
		h[i] = x[i] * ss;
	vec_mat(q, h, c->wq + (size_t)l * D_MODEL * QD, D_MODEL, QD);
	vec_mat(k, h, c->wk + (size_t)l * D_MODEL * KD, D_MODEL, KD);
	vec_mat(v, h, c->wv + (size_t)l * D_MODEL * KD, D_MODEL, KD);
	rope(q, N_Q, pos);
	rope(k, N_KV, pos);
}

/* x[D_MODEL] += a[QD] Wo of layer l */
static void add_output(const struct ctx *c, uint32_t l, const float *a, float *x)
{
	float y[D_MODEL];

	vec_mat(y, a, c->wo + (size_t)l * QD * D_MODEL, QD, D_MODEL);
	for (uint32_t i = 0; i < D_MODEL; i++)
		x[i] += y[i];
}

/* The engine's prefill attention: dense and causal over the T prompt tokens, from c->pq,
   c->pk, c->pv into c->att. Logits come from K^T so the inner loop runs over keys. */
static void causal_attention(struct ctx *c, uint32_t T)
{
	size_t tp = round64(T);
	float scale = 1.0f / sqrtf((float)HD);

	for (uint32_t h = 0; h < N_KV; h++) {
		const float *k = c->pk + (size_t)h * T * HD, *v = c->pv + (size_t)h * T * HD;

		memset(c->kt, 0, HD * tp * sizeof(float));
		for (size_t j = 0; j < T; j++)
			for (size_t d = 0; d < HD; d++)
				c->kt[d * tp + j] = k[j * HD + d];
		for (uint32_t g = h * GROUP; g < (h + 1) * GROUP; g++)
			for (size_t i = 0; i < T; i++) {
				const float *q = c->pq + (i * N_Q + g) * HD;
				float *o = c->att + i * QD + (size_t)g * HD, mx = -INFINITY,
				      sum = 0;
				size_t n = i + 1;

				memset(c->logit, 0, round64(n) * sizeof(float));
				for (size_t d = 0; d < HD; d++)
					axpy(c->logit, q[d] * scale, c->kt + d * tp, round64(n));
				for (size_t j = 0; j < n; j++)
					mx = c->logit[j] > mx ? c->logit[j] : mx;
				memset(o, 0, HD * sizeof(float));
				for (size_t j = 0; j < n; j++) {
					float e = expf(c->logit[j] - mx);

					sum += e;
					axpy(o, e, v + j * HD, HD);
				}
				for (size_t d = 0; d < HD; d++)
					o[d] /= sum;
			}
	}
}

static int prefill_layer(struct ctx *c, uint32_t l)
{
	uint32_t T = c->o.prompt;
	float k[KD], v[KD];
	double t0;
	int err;

	for (uint32_t t = 0; t < T; t++) {
		project(c, l, c->x + (size_t)t * D_MODEL, t, c->pq + (size_t)t * QD, k, v);
		for (uint32_t h = 0; h < N_KV; h++) {
			memcpy(c->pk + ((size_t)h * T + t) * HD, k + h * HD, HD * sizeof(float));
			memcpy(c->pv + ((size_t)h * T + t) * HD, v + h * HD, HD * sizeof(float));
		}
	}
	for (uint32_t g = 0; g < N_Q && T > OBS_WINDOW; g++)
		for (uint32_t i = 0; i < OBS_WINDOW; i++)
			memcpy(c->qobs + ((size_t)g * OBS_WINDOW + i) * HD,
			       c->pq + ((size_t)(T - OBS_WINDOW + i) * N_Q + g) * HD,
			       HD * sizeof(float));
	/* q_obs may be NULL only when the prompt is too short for any selection. */
	t0 = now_s();
	KVT_TRY(c->m,
		kvt_prefill_layer(c->m, c->seq, l, c->pk, c->pv, T > OBS_WINDOW ? c->qobs : NULL,
				  NULL),
		out);
	c->t_kvt += now_s() - t0;
	for (uint32_t h = 0; h < N_KV; h++) {
		size_t at = ((size_t)l * N_KV + h) * c->cap * HD;

		memcpy(c->gk + at, c->pk + (size_t)h * T * HD, (size_t)T * HD * sizeof(float));
		memcpy(c->gv + at, c->pv + (size_t)h * T * HD, (size_t)T * HD * sizeof(float));
	}
	causal_attention(c, T);
	for (uint32_t t = 0; t < T; t++)
		add_output(c, l, c->att + (size_t)t * QD, c->x + (size_t)t * D_MODEL);
out:
	return err;
}

/* softmax(q . K^T / sqrt(HD)) V over rows pos[0, n) of K, V [.][HD] (rows 0 .. n-1 when pos is
   NULL), in double. */
static void dense_attention(const float *q, const float *k, const float *v, const int32_t *pos,
			    uint32_t n, double *w, double *out)
{
	double mx = -INFINITY, sum = 0.0;

	for (uint32_t j = 0; j < n; j++) {
		const float *kr = k + (size_t)(pos ? (uint32_t)pos[j] : j) * HD;
		double s = 0.0;

		for (uint32_t d = 0; d < HD; d++)
			s += (double)q[d] * kr[d];
		w[j] = s / sqrt((double)HD);
		mx = w[j] > mx ? w[j] : mx;
	}
	memset(out, 0, HD * sizeof(*out));
	for (uint32_t j = 0; j < n; j++) {
		const float *vr = v + (size_t)(pos ? (uint32_t)pos[j] : j) * HD;

		w[j] = exp(w[j] - mx);
		sum += w[j];
		for (uint32_t d = 0; d < HD; d++)
			out[d] += w[j] * vr[d];
	}
	for (uint32_t d = 0; d < HD; d++)
		out[d] /= sum;
}

/* Compares kvt_step_attend's output of layer l at position p with dense attention over the kept
   set of each kv head (resident positions plus the recalled slots not resident). */
static int check_layer(struct ctx *c, uint32_t l, uint32_t p, const float *q, const float *out,
		       struct step_check *sc)
{
	double dense[HD], full[HD], max_diff = 0.0, max_ref = 0.0;
	uint32_t n, nv;
	bool bad = false;
	int err;

	for (uint32_t h = 0; h < N_KV; h++) {
		size_t at = ((size_t)l * N_KV + h) * c->cap * HD;

		KVT_TRY(c->m,
			kvt_seq_resident_positions(c->m, c->seq, l, h, c->pos, RESIDENT_MAX, &n),
			out);
		KVT_TRY(c->m, kvt_seq_recall_view(c->m, c->seq, l, h, c->view, RECALL_BLOCKS, &nv),
			out);
		sc->resident += n;
		for (uint32_t b = 0; b < nv; b++)
			for (uint32_t i = 0; i < c->view[b].n_valid && i < BLOCK_TOKENS; i++)
				if (!(c->view[b].resident >> i & 1)) {
					c->pos[n++] =
						(int32_t)(c->view[b].block * BLOCK_TOKENS + i);
					sc->recalled++;
				}
		if (p + 1 > KEPT_MAX && n >= p + 1)
			sc->compressed = false;
		for (uint32_t j = 0; j < n; j++) /* never read past our copy */
			bad |= c->pos[j] < 0 || (uint32_t)c->pos[j] > p;
		if (bad) {
			sc->ok = false;
			continue;
		}
		for (uint32_t g = h * GROUP; g < (h + 1) * GROUP; g++) {
			const float *qg = q + (size_t)g * HD, *og = out + (size_t)g * HD;

			dense_attention(qg, c->gk + at, c->gv + at, c->pos, n, c->w, dense);
			for (uint32_t d = 0; d < HD; d++) {
				double e = fabs(og[d] - dense[d]);

				max_diff = e > max_diff ? e : max_diff;
				max_ref = fabs(dense[d]) > max_ref ? fabs(dense[d]) : max_ref;
			}
			/* for information: the share of full attention's weight on the kept set
			   (c->w holds the unnormalised weights of all p + 1 tokens) */
			dense_attention(qg, c->gk + at, c->gv + at, NULL, p + 1, c->w, full);
			double all = 0.0, kept = 0.0;

			for (uint32_t j = 0; j <= p; j++)
				all += c->w[j];
			for (uint32_t j = 0; j < n; j++)
				kept += c->w[c->pos[j]];
			sc->mass += kept / all;
		}
	}
	if (max_diff > TOL_REL * max_ref && max_diff > TOL_ABS)
		sc->ok = false;
	sc->max_diff = max_diff > sc->max_diff ? max_diff : sc->max_diff;
out:
	return err;
}

/* One layer of one decode step: x [D_MODEL] is the new token's residual at position p. */
static int decode_layer(struct ctx *c, uint32_t l, uint32_t p, float *x, struct step_check *sc)
{
	float q[QD], k[KD], v[KD], attn[QD];
	double t0;
	int err;

	project(c, l, x, p, q, k, v);
	for (uint32_t h = 0; h < N_KV; h++) {
		size_t at = (((size_t)l * N_KV + h) * c->cap + p) * HD;

		memcpy(c->gk + at, k + h * HD, HD * sizeof(float));
		memcpy(c->gv + at, v + h * HD, HD * sizeof(float));
	}
	t0 = now_s();
	KVT_TRY(c->m, kvt_step_append(c->m, l, k, v, NULL), out);
	KVT_TRY(c->m, kvt_step_recall(c->m, l, q, NULL), out);
	KVT_TRY(c->m, kvt_step_attend(c->m, l, q, attn, NULL, NULL), out);
	c->t_kvt += now_s() - t0;
	err = check_layer(c, l, p, q, attn, sc);
	if (err)
		goto out;
	add_output(c, l, attn, x);
out:
	return err;
}

/* argmax over ids other than cur of x . embedding[id], ties to the lower id */
static uint32_t next_token(const struct ctx *c, const float *x, uint32_t cur)
{
	uint32_t best = cur == 0 ? 1 : 0;
	float best_s = -INFINITY;

	for (uint32_t id = 0; id < VOCAB; id++) {
		const float *e = c->emb + (size_t)id * D_MODEL;
		float s = 0.0f;

		for (uint32_t i = 0; i < D_MODEL; i++)
			s += x[i] * e[i];
		if (id != cur && s > best_s) {
			best = id;
			best_s = s;
		}
	}
	return best;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-example-decode [options]\n"
		"Prefill a synthetic attention stack (d_model %u, %u q heads / %u kv heads, head_dim\n"
		"%u, f32, host backend) through kvtier, decode with dynamic recall, and check every\n"
		"step against dense attention over the tokens kvtier kept.\n\n"
		"  --prompt N   prompt tokens (default 4096)\n"
		"  --decode N   decode steps (default 32)\n"
		"  --layers N   layers (default 4)\n"
		"  --seed N     random seed (default 1)\n"
		"  --quiet      print only the final line and failures\n"
		"  -h, --help   this text\n"
		"Exit status: 0 when every step agreed, 1 otherwise or on a library error, 2 on bad\n"
		"usage.\n",
		D_MODEL, N_Q, N_KV, HD);
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	unsigned long long v;
	char *end;

	if (!s || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* 0: run; 1: help printed; -1: bad usage (reported). */
static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"prompt", required_argument, NULL, 'p'},
		{"decode", required_argument, NULL, 'd'},
		{"layers", required_argument, NULL, 'l'},
		{"seed", required_argument, NULL, 's'},
		{"quiet", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	int ch, li = 0;

	*o = (struct opts){.prompt = 4096, .decode = 32, .layers = 4, .seed = 1};
	while ((ch = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		uint64_t v = 0;
		int bad = 0;

		switch (ch) {
		case 'p':
			bad = parse_u64(optarg, 1, 1u << 16, &v);
			o->prompt = (uint32_t)v;
			break;
		case 'd':
			bad = parse_u64(optarg, 0, 1u << 16, &v);
			o->decode = (uint32_t)v;
			break;
		case 'l':
			bad = parse_u64(optarg, 1, 64, &v);
			o->layers = (uint32_t)v;
			break;
		case 's':
			bad = parse_u64(optarg, 0, UINT64_MAX, &o->seed);
			break;
		case 'q':
			o->quiet = true;
			break;
		case 'h':
			usage(stdout);
			return 1;
		default:
			fprintf(stderr, "Try 'kvtier-example-decode --help'.\n");
			return -1;
		}
		if (bad) {
			fprintf(stderr, "kvtier-example-decode: bad value '%s' for --%s\n", optarg,
				lo[li].name);
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvtier-example-decode: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	return 0;
}

/* Model weights and the prompt, in the documented draw order. */
static void init_model(struct ctx *c, uint32_t *prompt)
{
	uint64_t s = c->o.seed;
	float sm = 1.0f / sqrtf((float)D_MODEL), sq = 1.0f / sqrtf((float)QD);

	for (size_t i = 0; i < (size_t)VOCAB * D_MODEL; i++)
		c->emb[i] = uniform(&s);
	for (size_t l = 0; l < c->o.layers; l++) {
		for (size_t i = 0; i < (size_t)D_MODEL * QD; i++)
			c->wq[l * D_MODEL * QD + i] = uniform(&s) * sm * Q_GAIN;
		for (size_t i = 0; i < (size_t)D_MODEL * KD; i++)
			c->wk[l * D_MODEL * KD + i] = uniform(&s) * sm;
		for (size_t i = 0; i < (size_t)D_MODEL * KD; i++)
			c->wv[l * D_MODEL * KD + i] = uniform(&s) * sm;
		for (size_t i = 0; i < (size_t)QD * D_MODEL; i++)
			c->wo[l * QD * D_MODEL + i] = uniform(&s) * sq;
	}
	for (uint32_t t = 0; t < c->o.prompt; t++)
		prompt[t] = (uint32_t)(splitmix64(&s) % VOCAB);
}

int main(int argc, char **argv)
{
	struct kvt_config cfg = KVT_CONFIG_INIT;
	struct kvt_stats st = KVT_STATS_INIT;
	struct ctx c = {.seq = 1};
	uint32_t *prompt = NULL, tok, agree = 0;
	float xd[D_MODEL];
	double t0, t_prefill, t_decode;
	int err, rc = 1;

	switch (parse_opts(argc, argv, &c.o)) {
	case 1:
		return 0;
	case -1:
		return 2;
	}
	uint32_t T = c.o.prompt, L = c.o.layers;

	c.cap = T + c.o.decode;
	size_t gt = (size_t)L * N_KV * c.cap * HD;

	/* Every float buffer with its length; freed through the same table. */
	struct {
		float **p;
		size_t n;
	} fb[] = {
		{&c.emb, (size_t)VOCAB * D_MODEL},
		{&c.wq, (size_t)L * D_MODEL * QD},
		{&c.wk, (size_t)L * D_MODEL * KD},
		{&c.wv, (size_t)L * D_MODEL * KD},
		{&c.wo, (size_t)L * QD * D_MODEL},
		{&c.gk, gt},
		{&c.gv, gt},
		{&c.x, (size_t)T * D_MODEL},
		{&c.pq, (size_t)T * QD},
		{&c.pk, (size_t)T * KD},
		{&c.pv, (size_t)T * KD},
		{&c.qobs, (size_t)N_Q * OBS_WINDOW * HD},
		{&c.att, (size_t)T * QD},
		{&c.kt, HD * round64(T)},
		{&c.logit, round64(T)},
	};
	bool oom = !(prompt = malloc(T * sizeof(*prompt))) ||
		   !(c.w = malloc((c.cap + KEPT_MAX) * sizeof(double)));

	for (size_t i = 0; i < sizeof(fb) / sizeof(fb[0]); i++)
		oom |= !(*fb[i].p = malloc(fb[i].n * sizeof(float)));
	if (oom) {
		fprintf(stderr, "decode_loop: out of memory\n");
		goto out;
	}
	init_model(&c, prompt);

	/* Budgets: the device holds every layer's resident set plus a recall cache of single-block
	   frames (K and V of block_tokens rows) for 2 x recall_blocks per (layer, kv head); the
	   host holds every token of every layer. */
	uint64_t block_bytes = 2ull * BLOCK_TOKENS * HD * sizeof(float);
	uint64_t resident_bytes = (uint64_t)L * N_KV *
				  ((RESIDENT_MAX + BLOCK_TOKENS - 1) / BLOCK_TOKENS) * block_bytes;

	cfg.backend = KVT_BACKEND_HOST;
	cfg.dtype = KVT_DTYPE_F32;
	cfg.n_layers = L;
	cfg.n_kv_heads = N_KV;
	cfg.n_q_heads = N_Q;
	cfg.head_dim = HD;
	cfg.block_tokens = BLOCK_TOKENS;
	cfg.sink_tokens = SINK;
	cfg.recent_tokens = RECENT;
	cfg.topk_tokens = TOPK;
	cfg.obs_window = OBS_WINDOW;
	cfg.pool_kernel = POOL_KERNEL;
	cfg.recall_blocks = RECALL_BLOCKS;
	cfg.ws_window = WS_WINDOW;
	cfg.save_threads = SAVE_THREADS;
	cfg.recall_cache_bytes = (uint64_t)RECALL_BLOCKS * N_KV * L * 2 * block_bytes;
	cfg.device_bytes = resident_bytes + cfg.recall_cache_bytes;
	cfg.host_bytes =
		(uint64_t)L * N_KV * ((c.cap + BLOCK_TOKENS - 1) / BLOCK_TOKENS) * block_bytes;
	err = kvt_manager_create(&cfg, &c.m);
	if (err) {
		fprintf(stderr, "decode_loop: kvt_manager_create: %s\n", kvt_strerror(err));
		goto out;
	}
	KVT_TRY(c.m, kvt_seq_create(c.m, c.seq, T), out);
	if (!c.o.quiet) {
		printf("kvtier %s decode loop: host backend, f32, %u layers, d_model %u, %u q heads / "
		       "%u kv heads, head_dim %u\n",
		       kvt_version(), L, D_MODEL, N_Q, N_KV, HD);
		printf("prompt %u tokens, decode %u, seed %llu; kept per (layer, kv head): sink %u + "
		       "top-K %u + recent %u resident, + %u recalled %u-token blocks\n",
		       T, c.o.decode, (unsigned long long)c.o.seed, SINK, TOPK, RECENT,
		       RECALL_BLOCKS, BLOCK_TOKENS);
		printf("budgets: device %.2f MiB (resident sets %.2f + recall cache %.2f), host %.2f "
		       "MiB\n",
		       cfg.device_bytes / 1048576.0, resident_bytes / 1048576.0,
		       cfg.recall_cache_bytes / 1048576.0, cfg.host_bytes / 1048576.0);
	}

	/* Prefill, layer by layer: embeddings in, each layer's K/V handed to kvtier. */
	t0 = now_s();
	for (uint32_t t = 0; t < T; t++)
		memcpy(c.x + (size_t)t * D_MODEL, c.emb + (size_t)prompt[t] * D_MODEL,
		       D_MODEL * sizeof(float));
	for (uint32_t l = 0; l < L; l++)
		if (prefill_layer(&c, l))
			goto out;
	KVT_TRY(c.m, kvt_manager_sync(c.m, NULL), out);
	t_prefill = now_s() - t0;
	if (!c.o.quiet)
		printf("prefill: %u layers in %.2f s (kvt_prefill_layer %.3f s; the rest is the "
		       "model and its dense causal attention)\n\n",
		       L, t_prefill, c.t_kvt);

	/* Decode: the token at p comes from the hidden state at p - 1. */
	memcpy(xd, c.x + (size_t)(T - 1) * D_MODEL, sizeof(xd));
	tok = prompt[T - 1];
	c.t_kvt = 0;
	t0 = now_s();
	for (uint32_t t = 0; t < c.o.decode; t++) {
		struct step_check sc = {.ok = true, .compressed = true};
		uint32_t p = T + t;

		tok = next_token(&c, xd, tok);
		memcpy(xd, c.emb + (size_t)tok * D_MODEL, sizeof(xd));
		KVT_TRY(c.m, kvt_step_begin(c.m, &c.seq, 1), out);
		for (uint32_t l = 0; l < L; l++)
			if (decode_layer(&c, l, p, xd, &sc))
				goto out;
		KVT_TRY(c.m, kvt_step_end(c.m), out);
		agree += sc.ok && sc.compressed;
		if (c.o.quiet && sc.ok && sc.compressed)
			continue;
		printf("step %3u  pos %u  kept %.0f+%.0f/%u  max|kvtier-dense(kept)| %.1e %s  "
		       "full-attention weight kept %.2f\n",
		       t, p, (double)sc.resident / (L * N_KV), (double)sc.recalled / (L * N_KV),
		       p + 1, sc.max_diff,
		       !sc.ok		? "FAIL"
		       : !sc.compressed ? "FAIL (nothing compressed)"
					: "ok",
		       sc.mass / (L * N_Q));
	}
	t_decode = now_s() - t0;
	KVT_TRY(c.m, kvt_manager_stats(c.m, &st), out);
	if (!c.o.quiet)
		printf("\ndecode: %u steps in %.2f s (kvtier append + recall + attend %.2f ms/step); "
		       "recall: %llu lookups, %llu hits, %llu loads\n",
		       c.o.decode, t_decode, c.o.decode ? 1e3 * c.t_kvt / c.o.decode : 0.0,
		       (unsigned long long)st.recall_lookups, (unsigned long long)st.recall_hits,
		       (unsigned long long)st.recall_loads);
	printf("%u/%u steps agree with dense attention over the kept tokens\n", agree, c.o.decode);
	KVT_TRY(c.m, kvt_seq_destroy(c.m, c.seq), out);
	rc = agree == c.o.decode ? 0 : 1;
out:
	kvt_manager_destroy(c.m);
	free(prompt);
	free(c.w);
	for (size_t i = 0; i < sizeof(fb) / sizeof(fb[0]); i++)
		free(*fb[i].p);
	return rc;
}
