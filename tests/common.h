/* SPDX-License-Identifier: MIT */
/*
 * Shared by the test binaries: deterministic token data (every (seq, layer, head, pos, kv) row
 * can be regenerated, so tests check read-back without keeping copies), small configurations,
 * and tensor builders in the layouts kvtier's API takes.
 */
#ifndef KVT_TEST_COMMON_H
#define KVT_TEST_COMMON_H

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "policy.h"

static inline uint64_t t_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The randomized tests' number stream: splitmix64, one per test binary, seeded with
   t_rng_seed (the state lives in a function so binaries that draw none carry no variable). */
static inline uint64_t *t_rng_state(void)
{
	static uint64_t state;

	return &state;
}

static inline void t_rng_seed(uint64_t seed)
{
	*t_rng_state() = seed;
}

static inline uint64_t t_rng_next(void)
{
	uint64_t *s = t_rng_state(), z = t_mix(*s);

	*s += 0x9e3779b97f4a7c15ull;
	return z;
}

/* uniform in [0, n) */
static inline uint32_t t_rng_below(uint32_t n)
{
	return (uint32_t)(t_rng_next() % n);
}

/* KVT_TEST_SEED when set (a run is repeated with it), else one from the clock and pid. */
static inline uint64_t t_pick_seed(void)
{
	const char *e = getenv("KVT_TEST_SEED");

	if (e && *e)
		return strtoull(e, NULL, 0);
	return t_mix((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)clock());
}

/* KVT_TEST_OPS when set (longer or shorter runs, e.g. under valgrind), else dflt. */
static inline long t_pick_ops(long dflt)
{
	const char *e = getenv("KVT_TEST_OPS");

	return e && *e ? strtol(e, NULL, 0) : dflt;
}

/* Whether every thread of the library's (named "kvt-...") blocks SIGINT, SIGTERM and SIGUSR1:
   they leave the application's signals alone. From Name and SigBlk in
   /proc/self/task/TID/status; *n: how many such threads there are. */
static inline bool t_kvt_threads_block_signals(uint32_t *n)
{
	const unsigned long long want =
		(1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1)) | (1ull << (SIGUSR1 - 1));
	DIR *dir = opendir("/proc/self/task");
	struct dirent *e;
	bool all = dir != NULL;

	*n = 0;
	while (dir && (e = readdir(dir))) {
		char path[300], line[128];
		unsigned long long blk = 0;
		bool ours = false, seen = false;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* the thread has just exited */
		while (fgets(line, sizeof(line), f)) {
			if (!strncmp(line, "Name:\tkvt-", 10))
				ours = true;
			if (sscanf(line, "SigBlk: %llx", &blk) == 1)
				seen = true;
		}
		fclose(f);
		if (!ours)
			continue;
		(*n)++;
		all = all && seen && (blk & want) == want;
	}
	if (dir)
		closedir(dir);
	return all;
}

/* Zeroed allocation that never returns NULL to a test (n == 0 allocates 1 byte). */
static inline void *t_xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p) {
		fprintf(stderr, "test: out of memory (%zu bytes)\n", n);
		abort();
	}
	return p;
}

/* SnapKV parameters of a manager configuration for a prompt of L tokens. */
static inline struct kvt_snapkv t_snapkv_of(const struct kvt_config *c, uint32_t L)
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

/* valid_topk straight from docs/design.md steps 4-6, independent of the library, to cross-check
   kvt_snapkv_count and the frames a prefill takes. */
static inline uint32_t t_naive_count(const struct kvt_config *c, uint32_t L)
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

/* Resident positions by docs/design.md's rule, independent of the library: [0, min(N, sink)), the
   count top-K positions, then [max(sink, N - recent), N), ascending. Returns how many. */
static inline uint32_t t_expect_resident(const struct kvt_config *c, uint32_t N,
					 const int32_t *topk, uint32_t count, int32_t *out)
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

/* A value in [-1, 1) determined by the token's coordinates; exactly representable in bf16 and
   f16 (multiples of 1/128), so every dtype stores it exactly. */
static inline float t_value(uint64_t seq, uint32_t layer, uint32_t head, uint32_t pos, uint32_t dim,
			    int is_v)
{
	uint64_t h = t_mix(seq * 0x100000001b3ull ^
			   t_mix(((uint64_t)layer << 48) ^ ((uint64_t)head << 40) ^
				 ((uint64_t)(is_v & 1) << 39) ^ pos) ^
			   dim);
	return (float)((int)(h % 256) - 128) / 128.0f;
}

/* Fills one row (head_dim elements of dt) of token (seq, layer, head, pos). */
static inline void t_fill_row(enum kvt_dtype dt, uint32_t head_dim, void *dst, uint64_t seq,
			      uint32_t layer, uint32_t head, uint32_t pos, int is_v)
{
	float tmp[1024];

	for (uint32_t d0 = 0; d0 < head_dim; d0 += 1024) {
		uint32_t n = head_dim - d0 < 1024 ? head_dim - d0 : 1024;

		for (uint32_t d = 0; d < n; d++)
			tmp[d] = t_value(seq, layer, head, pos, d0 + d, is_v);
		kvt_from_f32(dt, tmp, (uint8_t *)dst + (size_t)d0 * kvt_dtype_size(dt), n);
	}
}

/* Prefill tensors of (seq, layer): k/v [H][L][D]; q_obs [Hq][obs][D] (query values are the
   token values of the last obs positions, head g, with is_v = 2 so they differ from K). */
static inline void t_fill_prefill(const struct kvt_config *c, uint64_t seq, uint32_t layer,
				  uint32_t L, void *k, void *v, void *q_obs)
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

/* Decode tensors for a batch: k/v [n][H][D] holding token pos[i] of seqs[i]. */
static inline void t_fill_decode(const struct kvt_config *c, const uint64_t *seqs,
				 const uint32_t *pos, uint32_t n, uint32_t layer, void *k, void *v)
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

#ifdef KVT_TEST_CUDA
#include <cuda_runtime_api.h>

#include "plugin.h"
#endif

/* The backend a manager that a test creates on the host backend runs on: the host backend, or
   the CUDA backend when the core suites run on it (KVT_TEST_CUDA below). */
#ifdef KVT_TEST_CUDA
#define T_HOST_BACKEND KVT_BACKEND_CUDA
#else
#define T_HOST_BACKEND KVT_BACKEND_HOST
#endif

/* Copies n bytes of a frame or recall-view frame at device address addr (kvt_seq_frames,
   kvt_seq_recall_view) into host memory dst: a plain read on the host backend, a cudaMemcpy
   when the core suites run on the CUDA backend (KVT_TEST_CUDA below). */
static inline void t_dev_read(void *dst, uint64_t addr, size_t n)
{
#ifdef KVT_TEST_CUDA
	cudaError_t e = cudaMemcpy(dst, (const void *)(uintptr_t)addr, n, cudaMemcpyDeviceToHost);

	if (e != cudaSuccess) {
		fprintf(stderr, "test: reading %zu device bytes at 0x%llx: %s\n", n,
			(unsigned long long)addr, cudaGetErrorString(e));
		abort();
	}
#else
	memcpy(dst, (const void *)(uintptr_t)addr, n);
#endif
}

#ifdef KVT_PLUGIN_H
/* What KVT_BACKEND_AUTO resolves to here: CUDA where the plugin loads and a device is usable
   (a GPU machine with the plugin built), else host. */
static inline enum kvt_backend t_auto_backend(void)
{
	const struct kvt_plugin *p;
	char why[256];
	int err = 0;

	p = kvt_plugin_load(&err);
	return p && p->probe(why, sizeof(why)) == 0 ? KVT_BACKEND_CUDA : KVT_BACKEND_HOST;
}
#endif

/* A small host-backend configuration: 2 layers, 2 kv heads, 4 q heads, d=16, 8-token blocks,
   sink 8, recent 16, top-K 16, obs 4, kernel 3, f16, 4 MiB per tier, 2 save threads. */
static inline struct kvt_config t_small_config(void)
{
	struct kvt_config c = KVT_CONFIG_INIT;

	c.n_layers = 2;
	c.n_kv_heads = 2;
	c.n_q_heads = 4;
	c.head_dim = 16;
	c.block_tokens = 8;
	c.dtype = KVT_DTYPE_F16;
	c.sink_tokens = 8;
	c.recent_tokens = 16;
	c.topk_tokens = 16;
	c.obs_window = 4;
	c.pool_kernel = 3;
	c.device_bytes = 4u << 20;
	c.host_bytes = 4u << 20;
	c.backend = KVT_BACKEND_HOST;
	c.save_threads = 2;
	c.staging_bytes = 64u << 10;
	return c;
}

#ifdef KVT_TEST_CUDA
/*
 * The core suites on the CUDA backend. A binary built with KVT_TEST_CUDA (tests/meson.build:
 * suite 'gpu' with the real runtime and plugin, suite 'core' over the emulated ones in
 * tests/cuda_emu) runs its unchanged test code against CUDA: every manager the tests create on
 * the host backend is created on the CUDA backend instead, and the calls that take tensors in
 * the backend's memory get device copies of the host tensors the tests build. The tests read
 * frames through t_dev_read. The binary exits 77 (skipped) where no CUDA backend is usable.
 */
static inline void *t_cu_in(const void *h, size_t n)
{
	void *d = NULL;
	cudaError_t e;

	if (!h || !n)
		return (void *)h;
	e = cudaMalloc(&d, n);
	if (e == cudaSuccess)
		e = cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
	if (e != cudaSuccess) {
		fprintf(stderr, "test: a device copy of %zu bytes: %s\n", n, cudaGetErrorString(e));
		abort();
	}
	return d;
}

/* Frees a device copy once the work queued on the legacy stream (the suites pass NULL) that
   reads it is done: cudaFree waits for the device. */
static inline void t_cu_drop(void *d, const void *h)
{
	if (d && d != h)
		cudaFree(d);
}

/* Shapes come from the manager itself; where it cannot say (a NULL or destroyed manager, an
   unknown sequence, a model-backend manager) the tensors pass through unchanged, and the call
   fails on its own checks as it does on the host backend. */
static inline int t_cu_shape(struct kvt_manager *m, uint64_t seq, struct kvt_config *c,
			     uint32_t *prompt_tokens)
{
	struct kvt_seq_info si = {.size = sizeof(si)};

	if (!m || kvt_manager_config(m, c) || c->backend != KVT_BACKEND_CUDA)
		return -1;
	if (prompt_tokens) {
		if (kvt_seq_info(m, seq, &si))
			return -1;
		*prompt_tokens = si.prompt_tokens;
	}
	return 0;
}

static inline int t_cu_manager_create(const struct kvt_config *cfg, struct kvt_manager **out)
{
	struct kvt_config c;

	if (!cfg || cfg->backend != KVT_BACKEND_HOST)
		return kvt_manager_create(cfg, out);
	c = *cfg;
	c.backend = KVT_BACKEND_CUDA;
	return kvt_manager_create(&c, out);
}

static inline int t_cu_prefill_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				     const void *k, const void *v, const void *q_obs, void *stream)
{
	struct kvt_config c;
	uint32_t L;
	size_t row, kv;
	void *dk, *dv, *dq;
	int rc;

	if (t_cu_shape(m, seq, &c, &L))
		return kvt_prefill_layer(m, seq, layer, k, v, q_obs, stream);
	row = (size_t)c.head_dim * kvt_dtype_size(c.dtype);
	kv = (size_t)c.n_kv_heads * L * row;
	dk = t_cu_in(k, kv);
	dv = t_cu_in(v, kv);
	dq = t_cu_in(q_obs, (size_t)c.n_q_heads * c.obs_window * row);
	rc = kvt_prefill_layer(m, seq, layer, dk, dv, dq, stream);
	t_cu_drop(dk, k);
	t_cu_drop(dv, v);
	t_cu_drop(dq, q_obs);
	return rc;
}

static inline int t_cu_decode_append(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				     uint32_t n, const void *k, const void *v, void *stream)
{
	struct kvt_config c;
	size_t bytes;
	void *dk, *dv;
	int rc;

	if (t_cu_shape(m, 0, &c, NULL))
		return kvt_decode_append(m, layer, seqs, n, k, v, stream);
	bytes = (size_t)n * c.n_kv_heads * c.head_dim * kvt_dtype_size(c.dtype);
	dk = t_cu_in(k, bytes);
	dv = t_cu_in(v, bytes);
	rc = kvt_decode_append(m, layer, seqs, n, dk, dv, stream);
	t_cu_drop(dk, k);
	t_cu_drop(dv, v);
	return rc;
}

static inline int t_cu_decode_recall(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				     uint32_t n, const void *q, void *stream)
{
	struct kvt_config c;
	void *dq;
	int rc;

	if (t_cu_shape(m, 0, &c, NULL))
		return kvt_decode_recall(m, layer, seqs, n, q, stream);
	dq = t_cu_in(q, (size_t)n * c.n_q_heads * c.head_dim * kvt_dtype_size(c.dtype));
	rc = kvt_decode_recall(m, layer, seqs, n, dq, stream);
	t_cu_drop(dq, q);
	return rc;
}

#define kvt_manager_create(cfg, out) t_cu_manager_create(cfg, out)
#define kvt_prefill_layer(m, seq, layer, k, v, q, s) t_cu_prefill_layer(m, seq, layer, k, v, q, s)
#define kvt_decode_append(m, layer, seqs, n, k, v, s) t_cu_decode_append(m, layer, seqs, n, k, v, s)
#define kvt_decode_recall(m, layer, seqs, n, q, s) t_cu_decode_recall(m, layer, seqs, n, q, s)

/* Skips the whole binary (exit 77) where the CUDA backend cannot run: no device, the plugin
   not found, or a device the plugin finds unusable. */
__attribute__((constructor)) static void t_cu_require(void)
{
	const struct kvt_plugin *p;
	char why[256] = "";
	int n = 0, err = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n == 0) {
		printf("# skip: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
		exit(77);
	}
	p = kvt_plugin_load(&err);
	if (!p) {
		printf("# skip: CUDA backend plugin not loaded (%s)\n",
		       kvt_plugin_error()[0] ? kvt_plugin_error() : "not found");
		exit(77);
	}
	if (p->probe(why, sizeof(why))) {
		printf("# skip: %s\n", why[0] ? why : "no usable CUDA device");
		exit(77);
	}
}
#endif /* KVT_TEST_CUDA */

#endif /* KVT_TEST_COMMON_H */
