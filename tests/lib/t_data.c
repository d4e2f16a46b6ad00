/* SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t_data.h"

static uint64_t rng_state;

void t_rng_seed(uint64_t seed)
{
	rng_state = seed;
}

uint64_t t_rng_next(void)
{
	uint64_t z = t_mix(rng_state);

	rng_state += 0x9e3779b97f4a7c15ull;
	return z;
}

uint32_t t_rng_below(uint32_t n)
{
	return (uint32_t)(t_rng_next() % n);
}

uint64_t t_pick_seed(void)
{
	const char *e = getenv("KVT_TEST_SEED");

	if (e && *e)
		return strtoull(e, NULL, 0);
	return t_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)clock());
}

bool t_long_run(void)
{
	const char *e = getenv("KVT_TEST_LONG");

	return e && strcmp(e, "1") == 0;
}

long t_pick_ops(long dflt)
{
	const char *e = getenv("KVT_TEST_OPS");

	if (e && *e)
		return strtol(e, NULL, 0);
	return t_long_run() ? dflt : dflt / 4;
}

void *t_xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p) {
		fprintf(stderr, "test: out of memory (%zu bytes)\n", n);
		abort();
	}
	return p;
}

double t_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *t_dt_name(enum kvt_dtype dt)
{
	return dt == KVT_DTYPE_F32 ? "f32" : dt == KVT_DTYPE_F16 ? "f16" : "bf16";
}

float t_value(uint64_t seq, uint32_t layer, uint32_t head, uint32_t pos, uint32_t dim, int is_v)
{
	uint64_t h = t_mix(seq * 0x100000001b3ull ^
			   t_mix(((uint64_t)layer << 48) ^ ((uint64_t)head << 40) ^
				 ((uint64_t)(is_v & 1) << 39) ^ pos) ^
			   dim);
	return (float)((int)(h % 256) - 128) / 128.0f;
}

void t_fill_row(enum kvt_dtype dt, uint32_t head_dim, void *dst, uint64_t seq, uint32_t layer,
		uint32_t head, uint32_t pos, int is_v)
{
	float tmp[1024];

	for (uint32_t d0 = 0; d0 < head_dim; d0 += 1024) {
		uint32_t n = head_dim - d0 < 1024 ? head_dim - d0 : 1024;

		for (uint32_t d = 0; d < n; d++)
			tmp[d] = t_value(seq, layer, head, pos, d0 + d, is_v);
		kvt_from_f32(dt, tmp, (uint8_t *)dst + (size_t)d0 * kvt_dtype_size(dt), n);
	}
}

void t_fill_prefill(const struct kvt_config *c, uint64_t seq, uint32_t layer, uint32_t L, void *k,
		    void *v, void *q_obs)
{
	size_t row = (size_t)c->head_dim * kvt_dtype_size(c->dtype);

	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		for (uint32_t p = 0; p < L; p++) {
			t_fill_row(c->dtype, c->head_dim, (uint8_t *)k + ((size_t)h * L + p) * row,
				   seq, layer, h, p, 0);
			t_fill_row(c->dtype, c->head_dim, (uint8_t *)v + ((size_t)h * L + p) * row,
				   seq, layer, h, p, 1);
		}
	if (!q_obs)
		return;
	for (uint32_t g = 0; g < c->n_q_heads; g++)
		for (uint32_t i = 0; i < c->obs_window; i++) {
			uint32_t p = L >= c->obs_window ? L - c->obs_window + i : i;

			t_fill_row(c->dtype, c->head_dim,
				   (uint8_t *)q_obs + ((size_t)g * c->obs_window + i) * row, seq,
				   layer, 1000 + g, p, 0);
		}
}

void t_fill_decode(const struct kvt_config *c, const uint64_t *seqs, const uint32_t *pos,
		   uint32_t n, uint32_t layer, void *k, void *v)
{
	size_t row = (size_t)c->head_dim * kvt_dtype_size(c->dtype);

	for (uint32_t i = 0; i < n; i++)
		for (uint32_t h = 0; h < c->n_kv_heads; h++) {
			size_t off = ((size_t)i * c->n_kv_heads + h) * row;

			t_fill_row(c->dtype, c->head_dim, (uint8_t *)k + off, seqs[i], layer, h,
				   pos[i], 0);
			t_fill_row(c->dtype, c->head_dim, (uint8_t *)v + off, seqs[i], layer, h,
				   pos[i], 1);
		}
}

struct kvt_snapkv t_snapkv_of(const struct kvt_config *c, uint32_t L)
{
	struct kvt_snapkv p = {
		.n_kv_heads = c->n_kv_heads,
		.n_q_heads = c->n_q_heads,
		.head_dim = c->head_dim,
		.dtype = c->dtype,
		.prompt_tokens = L,
		.obs_window = c->obs_window,
		.sink = c->sink_tokens,
		.recent = c->recent_tokens,
		.topk = c->topk_tokens,
		.pool_kernel = c->pool_kernel,
	};
	return p;
}

uint32_t t_naive_count(const struct kvt_config *c, uint32_t L)
{
	int64_t lo = c->sink_tokens, hi;

	if (c->topk_tokens == 0 || (uint64_t)L <= (uint64_t)c->sink_tokens + c->recent_tokens)
		return 0;
	hi = (int64_t)L - c->recent_tokens;
	if ((int64_t)L - (int64_t)c->obs_window < hi)
		hi = (int64_t)L - (int64_t)c->obs_window;
	if (hi <= lo)
		return 0;
	return hi - lo < c->topk_tokens ? (uint32_t)(hi - lo) : c->topk_tokens;
}

uint32_t t_expect_resident(const struct kvt_config *c, uint32_t N, const int32_t *topk,
			   uint32_t count, int32_t *out)
{
	uint32_t w = 0, n_sink = N < c->sink_tokens ? N : c->sink_tokens;
	uint32_t ring0 = N > c->recent_tokens ? N - c->recent_tokens : 0;

	if (ring0 < c->sink_tokens)
		ring0 = c->sink_tokens;
	for (uint32_t p = 0; p < n_sink; p++)
		out[w++] = (int32_t)p;
	for (uint32_t i = 0; i < count; i++)
		out[w++] = topk[i];
	for (uint32_t p = ring0; p < N; p++)
		out[w++] = (int32_t)p;
	return w;
}
