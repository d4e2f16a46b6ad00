/* SPDX-License-Identifier: MIT */
/*
 * cuda: the CUDA backend (the plugin libkvtier-cuda.so, found through $KVTIER_CUDA_PLUGIN)
 * checked against the host backend, the reference, on the same inputs. Two managers whose
 * configurations differ only in the backend get the same calls, the CUDA one with device copies
 * of every tensor (on a stream of the test's, the inputs overwritten in stream order right
 * behind each call), and must agree:
 *   - resident positions exactly, except a top-K position whose pooled SnapKV score ties the
 *     cutoff (kvt_snapkv_scores within a relative 1e-4: the GPU sums in another order); such a
 *     tie is reported, and the comparisons that depend on the selection are then skipped for
 *     that (sequence, layer) while each side is still checked against the input rows;
 *   - every token read back (kvt_seq_read_token, and the CUDA manager's host history) bit for
 *     bit, and equal to the input rows;
 *   - device frames (copied back with cudaMemcpy), slot by slot, bit for bit with the host
 *     backend's and with the input rows of the positions the slots hold;
 *   - recall views (blocks, valid counts, resident masks) and the recalled frames' bytes;
 *   - kvt_attend within 1e-4 of the largest output of each query head, against each other and
 *     against attention computed here over the rows the resident set and views name;
 *   - the manager's counters, and the CUDA transfer counters and calibration as kvtier.h states.
 * Also: AUTO picks the CUDA backend; a 528,000-token prompt, the scale kvtier is for (on a GPU
 * only: the emulators' build, KVT_TEST_EMULATED, skips it); calls on a
 * cudaStreamNonBlocking stream see inputs the test queued on that stream just before; and every
 * CUDA call of a prefill, a decode append and a recall, failed one at a time (KVT_FAULT_CUDA),
 * fails its call with a negative errno and changes nothing visible, after which the same call
 * succeeds with the reference's results.
 *
 * Data: splitmix64 from a fixed seed (KVT_TEST_SEED overrides it). N_HEAVY "heavy" keys per
 * head point along a direction the observation queries share; their pooling windows (POOL
 * positions each, never overlapping) fill the top-K exactly (TOPK = N_HEAVY x POOL), so the
 * vote is far from flat and the cutoff falls between the heavy windows and the rest, far apart
 * (the smallest relative gap is printed), instead of between two noise-level scores.
 * Without a usable device (no driver, no device, plugin not found) the binary prints
 * "# skip: ..." and exits 77.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "t_data.h"
#include "t_manager.h"
#include "fault.h"
#include "internal.h" /* kvt_seq_read_token_host */
#include "plugin.h"
#include "policy.h"
#ifdef KVT_TEST_EMULATED
#include "cuda_emu/fake_cudart.h"
#include "util.h"
#endif

/* Geometry of every manager here: small, so the suite runs in seconds. */
#define N_LAYERS 2
#define N_KV 2
#define N_Q 4
#define G_Q (N_Q / N_KV)
#define HEAD_DIM 64
#define BT 16
#define SINK 16
#define RECENT 64
#define TOPK 63 /* N_HEAVY pooling windows of POOL positions */
#define OBS 8
#define POOL 7
#define R_BLOCKS 4
#define N_HEAVY 9 /* heavy keys per (sequence, layer, kv head) of a prompt that selects */
_Static_assert(TOPK == N_HEAVY * POOL, "the top-K is the heavy keys' pooling windows");

#define POS_CAP 256  /* >= SINK + RECENT + TOPK */
#define FRAME_CAP 16 /* >= frames of one resident set */
#define VIEW_CAP 16  /* >= R_BLOCKS */
#define ROW_MAX (HEAD_DIM * 4)
#define DECODE_STEPS 70 /* > RECENT: every ring wraps */
#define FAULT_MAX 400	/* most CUDA calls one operation may make */

#define ATTEND_TOL 1e-4
#define TIE_TOL 1e-4

#define ULL(x) ((unsigned long long)(x))

static uint64_t g_seed;

/* ---- failure context ------------------------------------------------------------------- */

static char g_ctx[160];

static void ctx_write(char *buf, size_t len)
{
	if (g_ctx[0])
		snprintf(buf, len, "[%s] ", g_ctx);
}

static void set_ctx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void set_ctx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(g_ctx, sizeof(g_ctx), fmt, ap);
	va_end(ap);
}

/* ---- CUDA runtime helpers ---------------------------------------------------------------- */

#define CUDA_OK(call) cuda_ok_at((call), #call, __FILE__, __LINE__)

static void cuda_ok_at(cudaError_t e, const char *what, const char *file, int line)
{
	if (e != cudaSuccess)
		fail_at(file, line, "%s: %s (%s)", what, cudaGetErrorString(e),
			cudaGetErrorName(e));
}

static void *dev_alloc(size_t n)
{
	void *p = NULL;

	CUDA_OK(cudaMalloc(&p, n ? n : 1));
	return p;
}

static void dev_free(void *p)
{
	if (p)
		CUDA_OK(cudaFree(p));
}

static void dev_put(void *dst, const void *src, size_t n)
{
	CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}

/* Copies n bytes at addr into dst: a device address (CUDA manager) or a host one (host). */
static void addr_get(void *dst, uint64_t addr, size_t n, bool dev)
{
	if (dev)
		CUDA_OK(cudaMemcpy(dst, (const void *)(uintptr_t)addr, n, cudaMemcpyDeviceToHost));
	else
		memcpy(dst, (const void *)(uintptr_t)addr, n);
}

/* ---- configuration and the pair of managers --------------------------------------------- */

static struct kvt_config suite_config(enum kvt_dtype dt, enum kvt_backend be)
{
	struct kvt_config c = KVT_CONFIG_INIT;

	c.n_layers = N_LAYERS;
	c.n_kv_heads = N_KV;
	c.n_q_heads = N_Q;
	c.head_dim = HEAD_DIM;
	c.block_tokens = BT;
	c.dtype = dt;
	c.sink_tokens = SINK;
	c.recent_tokens = RECENT;
	c.topk_tokens = TOPK;
	c.obs_window = OBS;
	c.pool_kernel = POOL;
	c.device_bytes = 8u << 20;
	c.host_bytes = 24u << 20;
	c.backend = be;
	c.save_threads = 2;
	c.staging_bytes = 256u << 10; /* a long prompt's save takes several staging chunks */
	c.recall_blocks = R_BLOCKS;
	c.recall_cache_bytes = 1u << 20;
	return c;
}

struct pair {
	struct kvt_config cfg;	   /* the host manager's; the CUDA one's differs in backend */
	struct kvt_manager *h, *c; /* host backend (reference), CUDA backend */
	cudaStream_t stream;	   /* every CUDA-manager call runs on it */
	bool own_stream;
	size_t rowb, block_bytes;
	uint32_t max_L, max_batch;
	void *dk, *dv, *dq; /* device inputs of prefill: [N_KV][max_L][D], [N_Q][OBS][D] */
	void *ek, *ev, *eq; /* of decode ([max_batch][N_KV][D]) and recall ([max_batch][N_Q][D]) */
};

static const char *side(const struct pair *p, const struct kvt_manager *m)
{
	return m == p->c ? "cuda" : "host";
}

/* stream: the CUDA manager's calls run on it; NULL: a stream created here (cudaStreamCreate).
   host_bytes: both managers' host budget; 0: the suite's (suite_config). */
static void pair_init_host(struct pair *p, enum kvt_dtype dt, cudaStream_t stream, uint32_t max_L,
			   uint32_t max_batch, uint64_t host_bytes)
{
	struct kvt_config cc, got;

	memset(p, 0, sizeof(*p));
	p->cfg = suite_config(dt, KVT_BACKEND_HOST);
	if (host_bytes)
		p->cfg.host_bytes = host_bytes;
	cc = p->cfg;
	cc.backend = KVT_BACKEND_CUDA;
	p->h = t_mk(&p->cfg);
	p->c = t_mk(&cc);
	CHECK_RC(kvt_manager_config(p->c, &got), 0);
	CHECK_EQ(got.backend, KVT_BACKEND_CUDA);
	if (stream) {
		p->stream = stream;
	} else {
		CUDA_OK(cudaStreamCreate(&p->stream));
		p->own_stream = true;
	}
	p->rowb = (size_t)HEAD_DIM * kvt_dtype_size(dt);
	p->block_bytes = 2 * BT * p->rowb;
	p->max_L = max_L;
	p->max_batch = max_batch;
	p->dk = dev_alloc((size_t)N_KV * max_L * p->rowb);
	p->dv = dev_alloc((size_t)N_KV * max_L * p->rowb);
	p->dq = dev_alloc((size_t)N_Q * OBS * p->rowb);
	p->ek = dev_alloc((size_t)max_batch * N_KV * p->rowb);
	p->ev = dev_alloc((size_t)max_batch * N_KV * p->rowb);
	p->eq = dev_alloc((size_t)max_batch * N_Q * p->rowb);
}

static void pair_init(struct pair *p, enum kvt_dtype dt, cudaStream_t stream, uint32_t max_L,
		      uint32_t max_batch)
{
	pair_init_host(p, dt, stream, max_L, max_batch, 0);
}

static void pair_fini(struct pair *p)
{
	kvt_manager_destroy(p->c);
	kvt_manager_destroy(p->h);
	dev_free(p->dk);
	dev_free(p->dv);
	dev_free(p->dq);
	dev_free(p->ek);
	dev_free(p->ev);
	dev_free(p->eq);
	if (p->own_stream)
		CUDA_OK(cudaStreamDestroy(p->stream));
}

static void sync_both(struct pair *p)
{
	CHECK_RC(kvt_manager_sync(p->c, p->stream), 0);
	CHECK_RC(kvt_manager_sync(p->h, NULL), 0);
}

/* The inputs of a call may be reused once it returns, in stream order: garbage them right
   behind it (0xff is NaN in every dtype), so a call whose device work read them later, or on
   another stream, would store garbage. */
static void garble(const struct pair *p, void *d, size_t n)
{
	CUDA_OK(cudaMemsetAsync(d, 0xff, n, p->stream));
}

/* ---- token data ---------------------------------------------------------------------------- */

static uint64_t sm_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1), 24 bits. */
static float sm_unit(uint64_t *s)
{
	return (float)((double)(sm_next(s) >> 40) * (2.0 / 16777216.0) - 1.0);
}

static uint32_t ring0_of(uint32_t N)
{
	uint32_t r = N > RECENT ? N - RECENT : 0;

	return r < SINK ? SINK : r;
}

/* End of the top-K candidates of a prompt of L tokens: [SINK, cand_hi(L)). */
static uint32_t cand_hi(uint32_t L)
{
	uint32_t a = L > RECENT ? L - RECENT : 0, b = L > OBS ? L - OBS : 0;

	return a < b ? a : b;
}

/* What the test knows of one sequence: every row it ever wrote (both managers got the same). */
struct tseq {
	uint64_t id;
	uint32_t L, cap; /* prompt tokens; tokens the reference holds per layer */
	uint32_t count;	 /* top-K tokens per head (kvt_snapkv_count) */
	enum kvt_dtype dt;
	size_t rowb;
	uint32_t n[N_LAYERS];		    /* tokens written per layer (0: not prefilled) */
	uint8_t *k[N_LAYERS], *v[N_LAYERS]; /* [N_KV][cap][HEAD_DIM] of dt */
	uint8_t *q_obs[N_LAYERS];	    /* [N_Q][OBS][HEAD_DIM] of dt */
	uint8_t *q_dec[N_LAYERS];	    /* [N_Q][HEAD_DIM] of dt: the recall query */
	float *q_att[N_LAYERS];		    /* the same in f32: the attention query */
	uint32_t n_heavy;		    /* heavy keys per head (0 without selection) */
	uint32_t heavy[N_LAYERS][N_KV][N_HEAVY];
	int32_t topk_h[N_LAYERS][N_KV][TOPK]; /* top-K each manager chose at prefill */
	int32_t topk_c[N_LAYERS][N_KV][TOPK];
	bool tie[N_LAYERS];	 /* the CUDA top-K differs from the host's by accepted ties */
	bool recalled[N_LAYERS]; /* a recall named (sequence, layer) since its last preemption */
};

static const uint8_t *ref_row(const struct tseq *t, uint32_t layer, uint32_t h, uint32_t pos,
			      int is_v)
{
	return (is_v ? t->v : t->k)[layer] + ((size_t)h * t->cap + pos) * t->rowb;
}

/* Generates every row of a sequence of an L-token prompt and `extra` decode tokens. Keys and
   values are uniform in [-1, 1); the observation queries of kv head h share a direction u_h
   (+-1 per channel) with N_HEAVY keys of graded strength in the candidate range, so those keys
   get most of the vote, and pooling spreads it over their windows (which never overlap): the
   top-K is exactly those windows. */
static void tseq_gen(struct tseq *t, const struct kvt_config *c, uint64_t id, uint32_t L,
		     uint32_t extra)
{
	struct kvt_snapkv sp = t_snapkv_of(c, L);
	size_t D = HEAD_DIM, kv_n = (size_t)N_KV * (L + extra) * D, q_n = (size_t)N_Q * OBS * D;
	size_t es = kvt_dtype_size(c->dtype);
	float *kf = t_xmalloc(kv_n * sizeof(float)), *vf = t_xmalloc(kv_n * sizeof(float));
	float *qf = t_xmalloc(q_n * sizeof(float)), qd[N_Q * HEAD_DIM], u[N_KV][HEAD_DIM];

	memset(t, 0, sizeof(*t));
	t->id = id;
	t->L = L;
	t->cap = L + extra;
	t->dt = c->dtype;
	t->rowb = D * es;
	t->count = kvt_snapkv_count(&sp);
	t->n_heavy = t->count ? N_HEAVY : 0;
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		uint64_t s = g_seed ^ t_mix(id * 64 + l);

		for (uint32_t h = 0; h < N_KV; h++)
			for (uint32_t d = 0; d < D; d++)
				u[h][d] = (sm_next(&s) & 1) ? 1.0f : -1.0f;
		for (size_t i = 0; i < kv_n; i++) {
			kf[i] = sm_unit(&s);
			vf[i] = sm_unit(&s);
		}
		if (t->n_heavy) {
			uint32_t lo = SINK + 4, span = (cand_hi(L) - 4 - lo) / N_HEAVY;

			assert_true(span >= 16);
			for (uint32_t h = 0; h < N_KV; h++)
				for (uint32_t i = 0; i < N_HEAVY; i++) {
					uint32_t p = lo + i * span +
						     (uint32_t)(sm_next(&s) % (span - 8));
					float strength = 1.0f + 0.15f * (float)i;

					t->heavy[l][h][i] = p;
					for (uint32_t d = 0; d < D; d++)
						kf[((size_t)h * t->cap + p) * D + d] =
							strength * u[h][d] + 0.1f * sm_unit(&s);
				}
		}
		for (uint32_t g = 0; g < N_Q; g++)
			for (uint32_t i = 0; i < OBS; i++)
				for (uint32_t d = 0; d < D; d++)
					qf[((size_t)g * OBS + i) * D + d] =
						0.5f * u[g / G_Q][d] + sm_unit(&s);
		for (uint32_t g = 0; g < N_Q; g++)
			for (uint32_t d = 0; d < D; d++)
				qd[g * D + d] = 0.25f * u[g / G_Q][d] + sm_unit(&s);
		t->k[l] = t_xmalloc(kv_n * es);
		t->v[l] = t_xmalloc(kv_n * es);
		t->q_obs[l] = t_xmalloc(q_n * es);
		t->q_dec[l] = t_xmalloc((size_t)N_Q * D * es);
		t->q_att[l] = t_xmalloc((size_t)N_Q * D * sizeof(float));
		kvt_from_f32(c->dtype, kf, t->k[l], kv_n);
		kvt_from_f32(c->dtype, vf, t->v[l], kv_n);
		kvt_from_f32(c->dtype, qf, t->q_obs[l], q_n);
		kvt_from_f32(c->dtype, qd, t->q_dec[l], (size_t)N_Q * D);
		kvt_to_f32(c->dtype, t->q_dec[l], t->q_att[l], (size_t)N_Q * D);
	}
	free(kf);
	free(vf);
	free(qf);
}

static void tseq_free(struct tseq *t)
{
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		free(t->k[l]);
		free(t->v[l]);
		free(t->q_obs[l]);
		free(t->q_dec[l]);
		free(t->q_att[l]);
	}
	memset(t, 0, sizeof(*t));
}

/* The prompt's K (is_v 0) or V of a layer as prefill takes it: [N_KV][L][HEAD_DIM]. */
static void prompt_tensor(const struct tseq *t, uint32_t layer, int is_v, uint8_t *dst)
{
	for (uint32_t h = 0; h < N_KV; h++)
		memcpy(dst + (size_t)h * t->L * t->rowb, ref_row(t, layer, h, 0, is_v),
		       (size_t)t->L * t->rowb);
}

/* ---- the calls, on one manager ------------------------------------------------------------ */

/* The calls of the serving loop (prefill, decode append, recall, resume) queue their device
   work on the caller's stream and wait for that stream at most: a wait for the whole device
   would also wait for a serving engine's kernels on its other streams. The emulated runtime
   counts such waits (cudaDeviceSynchronize, cudaFree, cudaFreeHost); a GPU cannot, so there
   this checks nothing. A failed call may wait for the device, to let what it queued finish. */
#ifdef KVT_TEST_EMULATED
#define DEVICE_WAITS() fake_cuda_device_waits()
#else
#define DEVICE_WAITS() 0ull
#endif

/* layer: UINT32_MAX for a call on every layer (resume) */
static void no_device_wait(uint64_t before, int rc, const char *call, uint64_t seq, uint32_t layer)
{
	uint64_t n = DEVICE_WAITS() - before;

	if (rc == 0 && n)
		fail_msg("%s of seq %llu layer %d waited %llu times for the whole device", call,
			 ULL(seq), layer == UINT32_MAX ? -1 : (int)layer, ULL(n));
}

/* Prefills `layer` of t on m (the CUDA manager gets device copies on the pair's stream). */
static int prefill_on(struct pair *p, struct kvt_manager *m, const struct tseq *t, uint32_t layer)
{
	size_t kvb = (size_t)N_KV * t->L * t->rowb, qb = (size_t)N_Q * OBS * t->rowb;
	const void *q = t->count ? t->q_obs[layer] : NULL; /* NULL: no selection (Case 1) */
	uint8_t *k = t_xmalloc(kvb), *v = t_xmalloc(kvb);
	uint64_t w0;
	int rc;

	prompt_tensor(t, layer, 0, k);
	prompt_tensor(t, layer, 1, v);
	if (m == p->h) {
		rc = kvt_prefill_layer(m, t->id, layer, k, v, q, NULL);
	} else {
		assert_true(t->L <= p->max_L);
		dev_put(p->dk, k, kvb);
		dev_put(p->dv, v, kvb);
		if (q)
			dev_put(p->dq, q, qb);
		w0 = DEVICE_WAITS();
		rc = kvt_prefill_layer(m, t->id, layer, p->dk, p->dv, q ? p->dq : NULL, p->stream);
		no_device_wait(w0, rc, "prefill", t->id, layer);
		garble(p, p->dk, kvb);
		garble(p, p->dv, kvb);
		if (q)
			garble(p, p->dq, qb);
	}
	free(k);
	free(v);
	return rc;
}

/* Appends the next token of each of ts[0..n) to `layer` on m (k, v: [n][N_KV][HEAD_DIM]). */
static int decode_on(struct pair *p, struct kvt_manager *m, struct tseq *const *ts, uint32_t n,
		     uint32_t layer)
{
	size_t bytes = (size_t)n * N_KV * p->rowb;
	uint64_t ids[8];
	uint8_t *k = t_xmalloc(bytes), *v = t_xmalloc(bytes);
	uint64_t w0;
	int rc;

	assert_true(n <= 8 && n <= p->max_batch);
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = ts[i]->id;
		assert_true(ts[i]->n[layer] < ts[i]->cap);
		for (uint32_t h = 0; h < N_KV; h++) {
			memcpy(k + ((size_t)i * N_KV + h) * p->rowb,
			       ref_row(ts[i], layer, h, ts[i]->n[layer], 0), p->rowb);
			memcpy(v + ((size_t)i * N_KV + h) * p->rowb,
			       ref_row(ts[i], layer, h, ts[i]->n[layer], 1), p->rowb);
		}
	}
	if (m == p->h) {
		rc = kvt_decode_append(m, layer, ids, n, k, v, NULL);
	} else {
		dev_put(p->ek, k, bytes);
		dev_put(p->ev, v, bytes);
		w0 = DEVICE_WAITS();
		rc = kvt_decode_append(m, layer, ids, n, p->ek, p->ev, p->stream);
		no_device_wait(w0, rc, "decode append", ids[0], layer);
		garble(p, p->ek, bytes);
		garble(p, p->ev, bytes);
	}
	free(k);
	free(v);
	return rc;
}

/* Recalls `layer` of ts[0..n) on m with each sequence's decode query ([n][N_Q][HEAD_DIM]). */
static int recall_on(struct pair *p, struct kvt_manager *m, struct tseq *const *ts, uint32_t n,
		     uint32_t layer)
{
	size_t qrow = (size_t)N_Q * p->rowb;
	uint64_t ids[8];
	uint8_t *q = t_xmalloc(n * qrow);
	uint64_t w0;
	int rc;

	assert_true(n <= 8 && n <= p->max_batch);
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = ts[i]->id;
		memcpy(q + i * qrow, ts[i]->q_dec[layer], qrow);
	}
	if (m == p->h) {
		rc = kvt_decode_recall(m, layer, ids, n, q, NULL);
	} else {
		dev_put(p->eq, q, n * qrow);
		w0 = DEVICE_WAITS();
		rc = kvt_decode_recall(m, layer, ids, n, p->eq, p->stream);
		no_device_wait(w0, rc, "recall", ids[0], layer);
		garble(p, p->eq, n * qrow);
	}
	free(q);
	return rc;
}

static void prefill_both_at(struct pair *p, struct tseq *t, uint32_t layer, const char *file,
			    int line)
{
	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;
		int rc = prefill_on(p, m, t, layer);

		if (rc)
			fail_at(file, line, "%s: prefill of seq %llu layer %u (L=%u) = %d (%s): %s",
				side(p, m), ULL(t->id), layer, t->L, rc, kvt_strerror(rc),
				kvt_manager_last_error(m));
	}
	t->n[layer] = t->L;
}
#define PREFILL_BOTH(p, t, l) prefill_both_at((p), (t), (l), __FILE__, __LINE__)

static void decode_both_at(struct pair *p, struct tseq *const *ts, uint32_t n, uint32_t layer,
			   const char *file, int line)
{
	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;
		int rc = decode_on(p, m, ts, n, layer);

		if (rc)
			fail_at(file, line,
				"%s: decode append of %u sequences (first %llu at pos %u) to layer %u "
				"= %d (%s): %s",
				side(p, m), n, ULL(ts[0]->id), ts[0]->n[layer], layer, rc,
				kvt_strerror(rc), kvt_manager_last_error(m));
	}
	for (uint32_t i = 0; i < n; i++)
		ts[i]->n[layer]++;
}
#define DECODE_BOTH(p, ts, n, l) decode_both_at((p), (ts), (n), (l), __FILE__, __LINE__)

/* Size class of a gather piece in struct kvt_stats: <= 4 KiB, <= 16 KiB, larger. */
static uint32_t gather_min_of(const struct kvt_stats *st, size_t piece)
{
	return piece <= 4096	? st->xfer_gather_min_4k
	       : piece <= 16384 ? st->xfer_gather_min_16k
				: st->xfer_gather_min_64k;
}

/* Recall on both managers. On the CUDA one, a recall that loads blocks runs one gather, and
   kvtier.h says which: the fused kernel when it loads at least xfer_gather_min_* pieces (one
   piece per block), else one cudaMemcpyBatchAsync. */
static void recall_both_at(struct pair *p, struct tseq *const *ts, uint32_t n, uint32_t layer,
			   const char *file, int line)
{
	struct kvt_stats s0 = t_stats_of(p->c), s1;
	uint64_t loads, kern, dma;

	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;
		int rc = recall_on(p, m, ts, n, layer);

		if (rc)
			fail_at(file, line,
				"%s: recall of %u sequences (first %llu) on layer %u = %d (%s): %s",
				side(p, m), n, ULL(ts[0]->id), layer, rc, kvt_strerror(rc),
				kvt_manager_last_error(m));
	}
	s1 = t_stats_of(p->c);
	loads = s1.recall_loads - s0.recall_loads;
	kern = s1.h2d_kernel_launches - s0.h2d_kernel_launches;
	dma = s1.h2d_dma_batches - s0.h2d_dma_batches;
	if (kern + dma != (loads ? 1u : 0u))
		fail_at(file, line,
			"cuda: recall of layer %u loaded %llu blocks with %llu kernel launches and "
			"%llu DMA batches (kvtier.h: one fused kernel or one cudaMemcpyBatchAsync per "
			"load)",
			layer, ULL(loads), ULL(kern), ULL(dma));
	if (loads) {
		uint32_t min = gather_min_of(&s1, p->block_bytes);
		bool want_kernel = loads >= min;

		if (want_kernel != (kern == 1))
			fail_at(file, line,
				"cuda: recall of layer %u loaded %llu blocks of %zu bytes as %s, but "
				"xfer_gather_min for that size is %u (kvtier.h: at least that many "
				"pieces run as the kernel, fewer as DMA)",
				layer, ULL(loads), p->block_bytes, kern ? "the kernel" : "DMA",
				min);
	}
	for (uint32_t i = 0; i < n; i++)
		ts[i]->recalled[layer] = true;
}
#define RECALL_BOTH(p, ts, n, l) recall_both_at((p), (ts), (n), (l), __FILE__, __LINE__)

/* ---- checks ---------------------------------------------------------------------------------- */

static uint32_t positions_at(struct pair *p, struct kvt_manager *m, const struct tseq *t,
			     uint32_t layer, uint32_t h, int32_t *out, const char *file, int line)
{
	uint32_t n = 0;
	int rc = kvt_seq_resident_positions(m, t->id, layer, h, out, POS_CAP, &n);

	if (rc)
		fail_at(file, line,
			"%s: kvt_seq_resident_positions(seq %llu, layer %u, head %u) = %d (%s): %s",
			side(p, m), ULL(t->id), layer, h, rc, kvt_strerror(rc),
			kvt_manager_last_error(m));
	return n;
}

static void resident_map(const int32_t *pos, uint32_t n, bool *map, uint32_t N)
{
	memset(map, 0, N);
	for (uint32_t i = 0; i < n; i++)
		if (pos[i] >= 0 && (uint32_t)pos[i] < N)
			map[pos[i]] = true;
}

/* Which position each valid slot holds (docs/design.md: sink slots, the ring by the ring rule, then
   the top-K after the ring), from the resident positions of a layer of N tokens. */
static void slot_map_at(const int32_t *pos, uint32_t n_pos, uint32_t N, uint32_t n_slots,
			int32_t *slot_pos, const char *what, const char *file, int line)
{
	uint32_t r0 = ring0_of(N), ti = 0;

	for (uint32_t s = 0; s < n_slots; s++)
		slot_pos[s] = -1;
	for (uint32_t i = 0; i < n_pos; i++) {
		uint32_t q = (uint32_t)pos[i];
		uint32_t s = q < SINK  ? q
			     : q >= r0 ? kvt_ring_slot(q, SINK, RECENT)
				       : SINK + RECENT + ti++;

		if (s >= n_slots || slot_pos[s] >= 0)
			fail_at(file, line,
				"%s: resident position %u maps to slot %u: beyond the %u valid slots "
				"or taken twice",
				what, q, s, n_slots);
		slot_pos[s] = (int32_t)q;
	}
	for (uint32_t s = 0; s < n_slots; s++)
		if (slot_pos[s] < 0)
			fail_at(file, line, "%s: valid slot %u holds no resident position", what,
				s);
}

static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i] != b[i])
			return i;
	return SIZE_MAX;
}

/* Smallest relative gap of pooled scores at the top-K cutoff seen since the last reset. */
static struct {
	double gap;
	uint64_t seq;
	uint32_t layer, head;
} g_margin;

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x < y) - (x > y);
}

static void margin_note(const struct tseq *t, uint32_t layer, uint32_t h, const float *pooled)
{
	uint32_t lo = SINK, hi = cand_hi(t->L), n = hi > lo ? hi - lo : 0;
	float *s;
	double gap;

	if (t->count == 0 || t->count >= n)
		return;
	s = t_xmalloc(n * sizeof(float));
	memcpy(s, pooled + lo, n * sizeof(float));
	qsort(s, n, sizeof(float), cmp_desc);
	gap = ((double)s[t->count - 1] - s[t->count]) / fabs((double)s[t->count - 1]);
	if (gap < g_margin.gap) {
		g_margin.gap = gap;
		g_margin.seq = t->id;
		g_margin.layer = layer;
		g_margin.head = h;
	}
	free(s);
}

/* After prefill: the host backend's resident positions are docs/design.md's rule over
   kvt_snapkv_select on the very tensors the test handed over (so the tie analysis below reads
   the right scores), its top-K is the heavy keys' windows, and the CUDA backend's list is sink, an
   ascending top-K within the candidates, then the ring; its top-K equals the host's, or differs
   only by positions whose pooled scores are within TIE_TOL of each other. */
static void check_selection_at(struct pair *p, struct tseq *t, uint32_t layer, const char *file,
			       int line)
{
	struct kvt_snapkv sp = t_snapkv_of(&p->cfg, t->L);
	uint32_t N = t->L, count = t->count, n_sink = N < SINK ? N : SINK, r0 = ring0_of(N);
	uint32_t hi = cand_hi(N);
	uint8_t *k = t_xmalloc((size_t)N_KV * N * t->rowb);
	int32_t *sel = t_xmalloc((size_t)N_KV * (count ? count : 1) * sizeof(int32_t));
	float *pooled = NULL;
	void *scratch = NULL;
	int32_t ph[POS_CAP], pc[POS_CAP], want[POS_CAP];

	assert_int_equal(t->n[layer], t->L);
	prompt_tensor(t, layer, 0, k);
	if (count) {
		scratch = t_xmalloc(kvt_snapkv_scratch_bytes(&sp));
		pooled = t_xmalloc((size_t)(N - OBS) * sizeof(float));
		CHECK_RC(kvt_snapkv_select(&sp, k, t->q_obs[layer], sel, scratch), 0);
	}
	t->tie[layer] = false;
	for (uint32_t h = 0; h < N_KV; h++) {
		uint32_t nh = positions_at(p, p->h, t, layer, h, ph, file, line);
		uint32_t nc = positions_at(p, p->c, t, layer, h, pc, file, line);
		uint32_t nw = t_expect_resident(&p->cfg, N, sel + (size_t)h * count, count, want);
		const int32_t *th = ph + n_sink, *tc = pc + n_sink;

		for (uint32_t i = 0; i < nw; i++)
			if (nh != nw || ph[i] != want[i])
				fail_at(file, line,
					"host: seq %llu layer %u head %u (L=%u): resident[%u] = %d (of "
					"%u), the design rule over kvt_snapkv_select gives %d (of %u)",
					ULL(t->id), layer, h, N, i, i < nh ? ph[i] : -1, nh,
					want[i], nw);
		if (nc != nw)
			fail_at(file, line,
				"cuda: seq %llu layer %u head %u (L=%u): %u resident positions, "
				"expected %u (sink %u + top-K %u + ring %u)",
				ULL(t->id), layer, h, N, nc, nw, n_sink, count, N - r0);
		for (uint32_t i = 0; i < n_sink; i++)
			if (pc[i] != (int32_t)i)
				fail_at(file, line,
					"cuda: seq %llu layer %u head %u: resident[%u] = %d, expected "
					"sink position %u",
					ULL(t->id), layer, h, i, pc[i], i);
		for (uint32_t i = 0; i < N - r0; i++)
			if (pc[n_sink + count + i] != (int32_t)(r0 + i))
				fail_at(file, line,
					"cuda: seq %llu layer %u head %u: resident[%u] = %d, expected "
					"ring position %u",
					ULL(t->id), layer, h, n_sink + count + i,
					pc[n_sink + count + i], r0 + i);
		for (uint32_t i = 0; i < count; i++)
			if (tc[i] < (int32_t)SINK || tc[i] >= (int32_t)hi ||
			    (i && tc[i] <= tc[i - 1]))
				fail_at(file, line,
					"cuda: seq %llu layer %u head %u: top-K[%u] = %d is outside the "
					"candidates [%u, %u) or not ascending",
					ULL(t->id), layer, h, i, tc[i], SINK, hi);
		memcpy(t->topk_h[layer][h], th, count * sizeof(int32_t));
		memcpy(t->topk_c[layer][h], tc, count * sizeof(int32_t));
		/* the data does what it was made for: the top-K is the heavy keys' windows */
		for (uint32_t i = 0; i < t->n_heavy * POOL; i++) {
			int32_t w = (int32_t)t->heavy[layer][h][i / POOL] - POOL / 2 +
				    (int32_t)(i % POOL);
			bool found = false;

			for (uint32_t j = 0; j < count && !found; j++)
				found = th[j] == w;
			if (!found)
				fail_at(file, line,
					"test data: seq %llu layer %u head %u: position %d, in the pooling "
					"window of the heavy key at %u, is not in the host backend's top-K "
					"(the vote is flatter than designed)",
					ULL(t->id), layer, h, w, t->heavy[layer][h][i / POOL]);
		}
		if (!count)
			continue;
		CHECK_RC(kvt_snapkv_scores(&sp, h, k, t->q_obs[layer], pooled, scratch), 0);
		margin_note(t, layer, h, pooled);
		if (!memcmp(th, tc, count * sizeof(int32_t)))
			continue;
		/* Positions only one side kept (both lists ascending): each must tie each
		   position only the other side kept. */
		{
			uint32_t a[TOPK], b[TOPK], na = 0, nb = 0, i = 0, j = 0;

			while (i < count || j < count) {
				if (j == count || (i < count && th[i] < tc[j]))
					a[na++] = (uint32_t)th[i++];
				else if (i == count || tc[j] < th[i])
					b[nb++] = (uint32_t)tc[j++];
				else
					i++, j++;
			}
			for (i = 0; i < na; i++)
				for (j = 0; j < nb; j++) {
					double sa = pooled[a[i]], sb = pooled[b[j]];

					if (!(fabs(sa - sb) <= TIE_TOL * fmax(fabs(sa), fabs(sb))))
						fail_at(file, line,
							"%s: seq %llu layer %u head %u: the CUDA backend "
							"keeps position %u (pooled score %.9g) where the "
							"host keeps %u (%.9g): relative difference %.3g, "
							"not a tie (> %.0e)",
							t_dt_name(t->dt), ULL(t->id), layer, h,
							b[j], sb, a[i], sa,
							fabs(sa - sb) / fmax(fabs(sa), fabs(sb)),
							TIE_TOL);
					print_message(
						"# %s: seq %llu layer %u head %u: tie at the top-K "
						"cutoff accepted: cuda keeps %u (%.9g), host %u "
						"(%.9g)\n",
						t_dt_name(t->dt), ULL(t->id), layer, h, b[j], sb,
						a[i], sa);
				}
			t->tie[layer] = true;
		}
	}
	free(k);
	free(sel);
	free(pooled);
	free(scratch);
}
#define CHECK_SELECTION(p, t, l) check_selection_at((p), (t), (l), __FILE__, __LINE__)

/* Resident positions on both managers: docs/design.md's rule over each one's top-K from prefill. */
static void check_resident_at(struct pair *p, const struct tseq *t, uint32_t layer,
			      const char *file, int line)
{
	int32_t got[POS_CAP], want[POS_CAP];

	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;

		for (uint32_t h = 0; h < N_KV; h++) {
			const int32_t *tk = s ? t->topk_c[layer][h] : t->topk_h[layer][h];
			uint32_t n = positions_at(p, m, t, layer, h, got, file, line);
			uint32_t nw = t_expect_resident(&p->cfg, t->n[layer], tk, t->count, want);

			for (uint32_t i = 0; i < nw || i < n; i++)
				if (n != nw || got[i] != want[i])
					fail_at(file, line,
						"%s: seq %llu layer %u head %u (L=%u, N=%u): "
						"resident[%u] = %d (of %u), expected %d (of %u)",
						side(p, m), ULL(t->id), layer, h, t->L, t->n[layer],
						i, i < n ? got[i] : -1, n, i < nw ? want[i] : -1,
						nw);
		}
	}
}
#define CHECK_RESIDENT(p, t, l) check_resident_at((p), (t), (l), __FILE__, __LINE__)

static void expect_row_at(const uint8_t *got, const uint8_t *want, size_t n, const char *what,
			  const struct tseq *t, uint32_t layer, uint32_t h, uint32_t pos,
			  const char *file, int line)
{
	size_t i = first_diff(got, want, n);

	if (i != SIZE_MAX)
		fail_at(file, line,
			"%s %s: seq %llu layer %u head %u pos %u (N=%u): differs from the input at "
			"byte %zu of %zu (0x%02x, expected 0x%02x)",
			t_dt_name(t->dt), what, ULL(t->id), layer, h, pos, t->n[layer], i, n,
			got[i], want[i]);
}

/* Every token of (t, layer), every head, read back bit-exact: through kvt_seq_read_token and
   the host history of the CUDA manager, and (with_host) kvt_seq_read_token of the host one. */
static void check_tokens_at(struct pair *p, const struct tseq *t, uint32_t layer, bool with_host,
			    const char *file, int line)
{
	uint32_t N = t->n[layer], got;
	uint8_t gk[ROW_MAX], gv[ROW_MAX];
	int32_t pos[POS_CAP];
	bool *map = t_xmalloc(N ? N : 1);
	size_t rb = t->rowb;

	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;
		int rc;

		if (!s && !with_host)
			continue;
		got = UINT32_MAX;
		rc = kvt_seq_tokens(m, t->id, layer, &got);
		if (rc || got != N)
			fail_at(file, line,
				"%s: kvt_seq_tokens(seq %llu, layer %u) = %d, %u tokens; "
				"expected %u",
				side(p, m), ULL(t->id), layer, rc, got, N);
		/* one past the end is out of range */
		rc = kvt_seq_read_token(m, t->id, layer, 0, N, gk, gv);
		if (rc != -EINVAL)
			fail_at(file, line,
				"%s: reading pos %u of seq %llu layer %u (N=%u) = %d, expected -EINVAL",
				side(p, m), N, ULL(t->id), layer, N, rc);
	}
	for (uint32_t h = 0; h < N_KV; h++) {
		uint32_t nres = positions_at(p, p->c, t, layer, h, pos, file, line);

		resident_map(pos, nres, map, N);
		for (uint32_t q = 0; q < N; q++) {
			const uint8_t *wk = ref_row(t, layer, h, q, 0),
				      *wv = ref_row(t, layer, h, q, 1);

			for (int path = 0; path < 3; path++) {
				static const char *const names[3] = {
					"cuda kvt_seq_read_token",
					"cuda host history (kvt_seq_read_token_host)",
					"host kvt_seq_read_token",
				};
				struct kvt_manager *m = path == 2 ? p->h : p->c;
				const char *where =
					map[q] ? "position resident" : "position not resident";
				char what[128];
				int rc;

				if (path == 2 && !with_host)
					continue;
				rc = path == 1 ? kvt_seq_read_token_host(m, t->id, layer, h, q, gk,
									 gv)
					       : kvt_seq_read_token(m, t->id, layer, h, q, gk, gv);
				if (rc)
					fail_at(file, line,
						"%s: reading seq %llu layer %u head %u pos %u (N=%u) = "
						"%d (%s): %s",
						side(p, m), ULL(t->id), layer, h, q, N, rc,
						kvt_strerror(rc), kvt_manager_last_error(m));
				snprintf(what, sizeof(what), "%s, K row (%s)", names[path], where);
				expect_row_at(gk, wk, rb, what, t, layer, h, q, file, line);
				snprintf(what, sizeof(what), "%s, V row (%s)", names[path], where);
				expect_row_at(gv, wv, rb, what, t, layer, h, q, file, line);
			}
		}
	}
	free(map);
}
#define CHECK_TOKENS(p, t, l, with_host) \
	check_tokens_at((p), (t), (l), (with_host), __FILE__, __LINE__)

/* The valid slots of (t, layer, h) on m, each as its K row then its V row; *ns_out slots. */
static uint8_t *frame_rows_at(struct pair *p, struct kvt_manager *m, const struct tseq *t,
			      uint32_t layer, uint32_t h, uint32_t *ns_out, const char *file,
			      int line)
{
	uint64_t fr[FRAME_CAP];
	uint32_t nf = 0, ns = 0, N = t->n[layer];
	uint32_t nf_want = DIV_UP(SINK + RECENT + t->count, BT);
	uint32_t ns_want = (N < SINK + RECENT ? N : SINK + RECENT) + t->count;
	size_t rb = t->rowb, bb = p->block_bytes;
	uint8_t *blk, *out;
	int rc = kvt_seq_frames(m, t->id, layer, h, fr, FRAME_CAP, &nf, &ns);

	if (rc)
		fail_at(file, line, "%s: kvt_seq_frames(seq %llu, layer %u, head %u) = %d (%s): %s",
			side(p, m), ULL(t->id), layer, h, rc, kvt_strerror(rc),
			kvt_manager_last_error(m));
	if (nf != nf_want || ns != ns_want)
		fail_at(file, line,
			"%s: seq %llu layer %u head %u (N=%u): %u frames with %u valid slots, "
			"expected %u frames, %u slots",
			side(p, m), ULL(t->id), layer, h, N, nf, ns, nf_want, ns_want);
	blk = t_xmalloc(nf * bb);
	out = t_xmalloc(ns * 2 * rb);
	for (uint32_t f = 0; f < nf; f++)
		addr_get(blk + f * bb, fr[f], bb, m == p->c);
	for (uint32_t s = 0; s < ns; s++) {
		const uint8_t *row = blk + (s / BT) * bb + (s % BT) * rb;

		memcpy(out + (size_t)s * 2 * rb, row, rb);
		memcpy(out + (size_t)s * 2 * rb + rb, row + BT * rb, rb); /* V after K */
	}
	free(blk);
	*ns_out = ns;
	return out;
}

/* The device frames of (t, layer) on both managers, slot by slot: each slot holds the input
   rows of the position the layout puts there, and the CUDA frames equal the host backend's
   bit for bit (when both kept the same positions). */
static void check_frames_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
			    int line)
{
	size_t rb = t->rowb;

	for (uint32_t h = 0; h < N_KV; h++) {
		uint8_t *rows[2];
		uint32_t ns[2];

		for (int s = 0; s < 2; s++) {
			struct kvt_manager *m = s ? p->c : p->h;
			int32_t pos[POS_CAP], slot_pos[POS_CAP];
			uint32_t np = positions_at(p, m, t, layer, h, pos, file, line);
			char what[96];

			rows[s] = frame_rows_at(p, m, t, layer, h, &ns[s], file, line);
			snprintf(what, sizeof(what), "%s: seq %llu layer %u head %u", side(p, m),
				 ULL(t->id), layer, h);
			slot_map_at(pos, np, t->n[layer], ns[s], slot_pos, what, file, line);
			for (uint32_t sl = 0; sl < ns[s]; sl++) {
				uint32_t q = (uint32_t)slot_pos[sl];

				snprintf(what, sizeof(what), "%s device frame slot %u, K row",
					 side(p, m), sl);
				expect_row_at(rows[s] + (size_t)sl * 2 * rb,
					      ref_row(t, layer, h, q, 0), rb, what, t, layer, h, q,
					      file, line);
				snprintf(what, sizeof(what), "%s device frame slot %u, V row",
					 side(p, m), sl);
				expect_row_at(rows[s] + (size_t)sl * 2 * rb + rb,
					      ref_row(t, layer, h, q, 1), rb, what, t, layer, h, q,
					      file, line);
			}
		}
		if (!t->tie[layer])
			for (uint32_t sl = 0; sl < ns[0]; sl++) {
				size_t i = first_diff(rows[1] + (size_t)sl * 2 * rb,
						      rows[0] + (size_t)sl * 2 * rb, 2 * rb);

				if (i != SIZE_MAX)
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: cuda device frame slot %u "
						"differs from the host backend's at byte %zu of its %s row",
						t_dt_name(t->dt), ULL(t->id), layer, h, sl, i % rb,
						i < rb ? "K" : "V");
			}
		free(rows[0]);
		free(rows[1]);
	}
}
#define CHECK_FRAMES(p, t, l) check_frames_at((p), (t), (l), __FILE__, __LINE__)

/* Every valid slot of every head of (t, layer) on m, in head and slot order. */
static uint8_t *snapshot_at(struct pair *p, struct kvt_manager *m, const struct tseq *t,
			    uint32_t layer, size_t *bytes, const char *file, int line)
{
	uint8_t *all = NULL;
	size_t at = 0;

	for (uint32_t h = 0; h < N_KV; h++) {
		uint32_t ns;
		uint8_t *rows = frame_rows_at(p, m, t, layer, h, &ns, file, line);
		size_t n = (size_t)ns * 2 * t->rowb;

		if (!all)
			all = t_xmalloc(N_KV * n);
		memcpy(all + at, rows, n);
		at += n;
		free(rows);
	}
	*bytes = at;
	return all;
}
#define SNAPSHOT(p, m, t, l, b) snapshot_at((p), (m), (t), (l), (b), __FILE__, __LINE__)

/* Whether two snapshots of (t, layer) differ; if so, where, into msg. */
static bool snapshot_differs(const uint8_t *before, size_t nb, const uint8_t *after, size_t na,
			     const struct tseq *t, uint32_t layer, char *msg, size_t len)
{
	size_t rb = t->rowb, i = nb == na ? first_diff(before, after, nb) : 0;
	size_t ns = nb / (N_KV * 2 * rb);

	if (nb != na)
		snprintf(msg, len, "seq %llu layer %u: %zu bytes of valid slots, %zu before",
			 ULL(t->id), layer, na, nb);
	else if (i != SIZE_MAX)
		snprintf(msg, len,
			 "seq %llu layer %u: device frame of head %zu slot %zu (%s row, byte %zu) "
			 "differs from before",
			 ULL(t->id), layer, i / (2 * rb) / ns, i / (2 * rb) % ns,
			 i % (2 * rb) < rb ? "K" : "V", i % rb);
	return nb != na || i != SIZE_MAX;
}

/* The CUDA manager's frames of (t, layer) now, against a snapshot of them taken before. */
static void expect_frames_as_at(struct pair *p, const struct tseq *t, uint32_t layer,
				const uint8_t *before, size_t nb, const char *what,
				const char *file, int line)
{
	size_t na;
	uint8_t *after = snapshot_at(p, p->c, t, layer, &na, file, line);
	char msg[200];

	if (snapshot_differs(before, nb, after, na, t, layer, msg, sizeof(msg)))
		fail_at(file, line, "%s: %s", what, msg);
	free(after);
}

/* Recall views of (t, layer) on both managers: as many blocks as kvtier.h makes resident
   (min(recall_blocks, blocks not fully resident) after a recall, none after a preemption),
   ascending, valid counts and resident masks as the resident set says, frames holding the input
   rows; and the CUDA view equal to the host's, frame bytes included. */
static void check_views_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
			   int line)
{
	uint32_t N = t->n[layer], nb = DIV_UP(N, BT);
	size_t rb = t->rowb, bb = p->block_bytes;
	bool *map = t_xmalloc(N);

	for (uint32_t h = 0; h < N_KV; h++) {
		struct kvt_recall_ref rv[2][VIEW_CAP];
		uint8_t *fb[2];
		uint32_t nv[2];

		for (int s = 0; s < 2; s++) {
			struct kvt_manager *m = s ? p->c : p->h;
			int32_t pos[POS_CAP];
			uint32_t np = positions_at(p, m, t, layer, h, pos, file, line), cand = 0,
				 want;
			int rc = kvt_seq_recall_view(m, t->id, layer, h, rv[s], VIEW_CAP, &nv[s]);

			if (rc)
				fail_at(file, line,
					"%s: kvt_seq_recall_view(seq %llu, layer %u, head %u) = %d "
					"(%s): %s",
					side(p, m), ULL(t->id), layer, h, rc, kvt_strerror(rc),
					kvt_manager_last_error(m));
			resident_map(pos, np, map, N);
			for (uint32_t b = 0; b < nb; b++) {
				uint32_t n_valid = N - b * BT < BT ? N - b * BT : BT, i = 0;

				while (i < n_valid && map[b * BT + i])
					i++;
				cand += i < n_valid;
			}
			want = t->recalled[layer] ? (cand < R_BLOCKS ? cand : R_BLOCKS) : 0;
			if (nv[s] != want)
				fail_at(file, line,
					"%s: seq %llu layer %u head %u (N=%u): recall view of %u blocks, "
					"expected %u (%u blocks not fully resident, recall_blocks %u%s)",
					side(p, m), ULL(t->id), layer, h, N, nv[s], want, cand,
					R_BLOCKS, t->recalled[layer] ? "" : ", not recalled");
			fb[s] = t_xmalloc(nv[s] * bb + 1);
			for (uint32_t j = 0; j < nv[s]; j++) {
				const struct kvt_recall_ref *r = &rv[s][j];
				uint32_t n_valid = r->block < nb && N - r->block * BT < BT
							   ? N - r->block * BT
							   : BT;
				uint64_t mask = 0;
				char what[96];

				if (r->block >= nb || (j && r->block <= rv[s][j - 1].block))
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: view[%u] names block %u "
						"(%u blocks; ascending order expected)",
						side(p, m), ULL(t->id), layer, h, j, r->block, nb);
				for (uint32_t i = 0; i < n_valid; i++)
					mask |= (uint64_t)map[r->block * BT + i] << i;
				if (r->n_valid != n_valid || r->resident != mask ||
				    mask == ((uint64_t)1 << n_valid) - 1)
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: view of block %u: "
						"n_valid %u resident 0x%llx; expected %u and 0x%llx (not "
						"all set)",
						side(p, m), ULL(t->id), layer, h, r->block,
						r->n_valid, ULL(r->resident), n_valid, ULL(mask));
				addr_get(fb[s] + j * bb, r->frame, bb, m == p->c);
				for (uint32_t i = 0; i < n_valid; i++) {
					uint32_t q = r->block * BT + i;

					snprintf(what, sizeof(what),
						 "%s recalled frame of block %u, K row", side(p, m),
						 r->block);
					expect_row_at(fb[s] + j * bb + i * rb,
						      ref_row(t, layer, h, q, 0), rb, what, t,
						      layer, h, q, file, line);
					snprintf(what, sizeof(what),
						 "%s recalled frame of block %u, V row", side(p, m),
						 r->block);
					expect_row_at(fb[s] + j * bb + (BT + i) * rb,
						      ref_row(t, layer, h, q, 1), rb, what, t,
						      layer, h, q, file, line);
				}
			}
		}
		if (!t->tie[layer]) {
			if (nv[0] != nv[1])
				fail_at(file, line,
					"seq %llu layer %u head %u: cuda recall view of %u blocks, "
					"host %u",
					ULL(t->id), layer, h, nv[1], nv[0]);
			for (uint32_t j = 0; j < nv[0]; j++) {
				const struct kvt_recall_ref *a = &rv[1][j], *b = &rv[0][j];
				size_t vb = (size_t)a->n_valid * rb;

				if (a->block != b->block || a->n_valid != b->n_valid ||
				    a->resident != b->resident)
					fail_at(file, line,
						"seq %llu layer %u head %u: cuda view[%u] = block %u "
						"n_valid %u resident 0x%llx, host block %u n_valid %u "
						"resident 0x%llx",
						ULL(t->id), layer, h, j, a->block, a->n_valid,
						ULL(a->resident), b->block, b->n_valid,
						ULL(b->resident));
				if (memcmp(fb[1] + j * bb, fb[0] + j * bb, vb) ||
				    memcmp(fb[1] + j * bb + BT * rb, fb[0] + j * bb + BT * rb, vb))
					fail_at(file, line,
						"%s: seq %llu layer %u head %u: recalled frame of block "
						"%u differs between cuda and host",
						t_dt_name(t->dt), ULL(t->id), layer, h, a->block);
			}
		}
		free(fb[0]);
		free(fb[1]);
	}
	free(map);
}
#define CHECK_VIEWS(p, t, l) check_views_at((p), (t), (l), __FILE__, __LINE__)

/* Attention over exactly the rows m's resident set and recall views of (t, layer) name, each
   token once, from the input rows (kvt_attend_rows, one segment per head). */
static void attend_reference_at(struct pair *p, struct kvt_manager *m, const struct tseq *t,
				uint32_t layer, const float *q, float *out, const char *file,
				int line)
{
	size_t rb = t->rowb, cap = POS_CAP + (size_t)VIEW_CAP * BT;
	uint8_t *kb = t_xmalloc(cap * rb), *vb = t_xmalloc(cap * rb);

	for (uint32_t h = 0; h < N_KV; h++) {
		struct kvt_recall_ref rv[VIEW_CAP];
		int32_t pos[POS_CAP];
		uint32_t n = positions_at(p, m, t, layer, h, pos, file, line), nv = 0, w = 0;
		int rc = kvt_seq_recall_view(m, t->id, layer, h, rv, VIEW_CAP, &nv);

		if (rc)
			fail_at(file, line,
				"%s: kvt_seq_recall_view(seq %llu, layer %u, head %u) = %d",
				side(p, m), ULL(t->id), layer, h, rc);
		for (uint32_t i = 0; i < n; i++) {
			memcpy(kb + w * rb, ref_row(t, layer, h, (uint32_t)pos[i], 0), rb);
			memcpy(vb + w * rb, ref_row(t, layer, h, (uint32_t)pos[i], 1), rb);
			w++;
		}
		for (uint32_t j = 0; j < nv; j++)
			for (uint32_t i = 0; i < rv[j].n_valid; i++) {
				if ((rv[j].resident >> i) & 1)
					continue;
				memcpy(kb + w * rb, ref_row(t, layer, h, rv[j].block * BT + i, 0),
				       rb);
				memcpy(vb + w * rb, ref_row(t, layer, h, rv[j].block * BT + i, 1),
				       rb);
				w++;
			}
		{
			struct kvt_attend_rows seg = {kb, vb, rb, rb, w};

			kvt_attend_rows(t->dt, HEAD_DIM, q + (size_t)h * G_Q * HEAD_DIM, G_Q, &seg,
					1, out + (size_t)h * G_Q * HEAD_DIM);
		}
	}
	free(kb);
	free(vb);
}

/* got within ATTEND_TOL of want, relative to the largest |want| of each query head (a single
   output near zero is the difference of large terms, so its own magnitude is no scale). */
static void expect_close_at(const float *got, const float *want, const char *what,
			    const struct tseq *t, uint32_t layer, const char *file, int line)
{
	for (uint32_t g = 0; g < N_Q; g++) {
		double mx = 0;

		for (uint32_t d = 0; d < HEAD_DIM; d++)
			mx = fmax(mx, fabs((double)want[g * HEAD_DIM + d]));
		for (uint32_t d = 0; d < HEAD_DIM; d++) {
			double a = got[g * HEAD_DIM + d], b = want[g * HEAD_DIM + d];

			if (!(fabs(a - b) <= ATTEND_TOL * mx))
				fail_at(file, line,
					"%s %s: seq %llu layer %u (N=%u) q head %u dim %u: %.9g, "
					"expected %.9g (|diff| %.3g > %.0e x %.3g, the head's largest "
					"output)",
					t_dt_name(t->dt), what, ULL(t->id), layer, t->n[layer], g,
					d, a, b, fabs(a - b), ATTEND_TOL, mx);
		}
	}
}

/* kvt_attend on both managers: each within tolerance of attention over the rows it names, and
   of each other (same selection). out_c (optional) receives the CUDA output. */
static void check_attend_at(struct pair *p, const struct tseq *t, uint32_t layer, float *out_c,
			    const char *file, int line)
{
	float out[2][N_Q * HEAD_DIM], ref[2][N_Q * HEAD_DIM];

	for (int s = 0; s < 2; s++) {
		struct kvt_manager *m = s ? p->c : p->h;
		int rc = kvt_attend(m, t->id, layer, t->q_att[layer], out[s]);

		if (rc)
			fail_at(file, line, "%s: kvt_attend(seq %llu, layer %u) = %d (%s): %s",
				side(p, m), ULL(t->id), layer, rc, kvt_strerror(rc),
				kvt_manager_last_error(m));
		attend_reference_at(p, m, t, layer, t->q_att[layer], ref[s], file, line);
	}
	expect_close_at(out[0], ref[0], "host kvt_attend vs its rows", t, layer, file, line);
	expect_close_at(out[1], ref[1], "cuda kvt_attend vs its rows", t, layer, file, line);
	if (!t->tie[layer])
		expect_close_at(out[1], out[0], "cuda kvt_attend vs host kvt_attend", t, layer,
				file, line);
	if (out_c)
		memcpy(out_c, out[1], sizeof(out[1]));
}
#define CHECK_ATTEND(p, t, l, out) check_attend_at((p), (t), (l), (out), __FILE__, __LINE__)

/* ---- counters ------------------------------------------------------------------------------ */

#define F_SEL 1u /* depends on which positions SnapKV kept */
#define F_FIX 2u /* a failed call leaves it as it was */

struct stat_field {
	const char *name;
	size_t off, size;
	unsigned flags;
};

#define SF(f, fl)                                                                           \
	{                                                                                   \
#f, offsetof(struct kvt_stats, f), sizeof(((struct kvt_stats *)0)->f), (fl) \
	}

/* The manager's own counters (not the CUDA transfer figures, which only the CUDA backend
   keeps). */
static const struct stat_field stat_fields[] = {
	SF(device_frames_total, F_FIX),
	SF(device_frames_used, F_FIX),
	SF(device_frames_free, F_FIX),
	SF(host_blocks_total, F_FIX),
	SF(host_blocks_used, F_FIX),
	SF(host_blocks_free, F_FIX),
	SF(bytes_h2d, F_SEL | F_FIX),
	SF(bytes_d2h, F_FIX),
	SF(bytes_d2d, F_FIX),
	SF(tokens_saved, F_FIX),
	SF(tokens_appended, F_FIX),
	SF(tokens_prompt, F_FIX),
	SF(tokens_resident, F_FIX),
	SF(prefill_layers, F_FIX),
	SF(decode_calls, F_FIX),
	SF(saves_submitted, F_FIX),
	SF(live_seqs, F_FIX),
	SF(save_threads, F_FIX),
	SF(bytes_read, F_FIX),
	SF(recall_frames_total, F_FIX),
	SF(recall_frames_used, F_SEL),
	SF(recall_calls, F_FIX),
	SF(recall_lookups, F_SEL | F_FIX),
	SF(recall_hits, F_SEL | F_FIX),
	SF(recall_loads, F_SEL | F_FIX),
	SF(recall_evictions, F_SEL),
	SF(preemptions, F_FIX),
	SF(resumes, F_FIX),
	SF(model_ns_h2d, 0),
	SF(model_ns_d2h, 0),
	SF(model_ns_d2d, 0),
	SF(model_calls_h2d, 0),
	SF(model_calls_d2h, 0),
	SF(model_calls_d2d, 0),
	SF(disk_blocks_total, 0),
	SF(disk_blocks_used, 0),
	SF(disk_blocks_spilled, 0),
	SF(disk_blocks_fetched, 0),
	SF(disk_bytes_written, 0),
	SF(disk_bytes_read, 0),
	SF(disk_io_errors, 0),
	SF(disk_checksum_errors, 0),
	SF(seqs_lost, 0),
	SF(model_ns_disk, 0),
	SF(disk_direct, 0),
};

static uint64_t stat_get(const struct kvt_stats *st, const struct stat_field *f)
{
	const uint8_t *a = (const uint8_t *)st + f->off;

	if (f->size == 4) {
		uint32_t v;

		memcpy(&v, a, 4);
		return v;
	} else {
		uint64_t v;

		memcpy(&v, a, 8);
		return v;
	}
}

/* The two managers' counters after the same calls (those that depend on the selection only
   when no tie was accepted). */
static void compare_stats_at(struct pair *p, bool any_tie, const char *file, int line)
{
	struct kvt_stats sh = t_stats_of(p->h), sc = t_stats_of(p->c);

	for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
		const struct stat_field *f = &stat_fields[i];

		if ((f->flags & F_SEL) && any_tie)
			continue;
		if (stat_get(&sc, f) != stat_get(&sh, f))
			fail_at(file, line, "stats.%s: cuda %llu, host %llu after the same calls",
				f->name, ULL(stat_get(&sc, f)), ULL(stat_get(&sh, f)));
	}
	/* kvtier.h: the transfer figures are the CUDA backend's, 0 on the others */
	if (sh.h2d_kernel_launches || sh.h2d_dma_batches || sh.xfer_calibrated ||
	    sh.xfer_gather_min_4k || sh.xfer_gather_min_16k || sh.xfer_gather_min_64k)
		fail_at(file, line,
			"host backend: transfer figures not 0 (kernel %llu, dma %llu, calibrated %u, "
			"gather_min %u/%u/%u)",
			ULL(sh.h2d_kernel_launches), ULL(sh.h2d_dma_batches), sh.xfer_calibrated,
			sh.xfer_gather_min_4k, sh.xfer_gather_min_16k, sh.xfer_gather_min_64k);
}
#define COMPARE_STATS(p, tie) compare_stats_at((p), (tie), __FILE__, __LINE__)

/* The calibration: measured at create, unless KVTIER_CUDA_CALIBRATE=0, and then (kvtier.h)
   "not measured: the kernel always", so no load ran as DMA. */
static void check_xfer_at(const struct kvt_stats *st, const char *file, int line)
{
	const char *e = getenv("KVTIER_CUDA_CALIBRATE");

	if (e && !strcmp(e, "0")) {
		if (st->xfer_calibrated || st->xfer_gather_min_4k || st->xfer_gather_min_16k ||
		    st->xfer_gather_min_64k || st->h2d_dma_batches)
			fail_at(file, line,
				"KVTIER_CUDA_CALIBRATE=0: calibrated %u, gather_min %u/%u/%u, %llu DMA "
				"batches; expected 0, 0/0/0 (the kernel always), 0",
				st->xfer_calibrated, st->xfer_gather_min_4k,
				st->xfer_gather_min_16k, st->xfer_gather_min_64k,
				ULL(st->h2d_dma_batches));
	} else if (st->xfer_calibrated != 1) {
		fail_at(file, line, "cuda: xfer_calibrated = %u, expected 1 (measured at create)",
			st->xfer_calibrated);
	}
}
#define CHECK_XFER(st) check_xfer_at((st), __FILE__, __LINE__)

/* ---- the backend choice ------------------------------------------------------------------ */

static void test_backend_choice(void **state)
{
	static const enum kvt_backend asked[] = {KVT_BACKEND_AUTO, KVT_BACKEND_CUDA};

	(void)state;
	for (int i = 0; i < 2; i++) {
		struct kvt_config c = suite_config(KVT_DTYPE_BF16, asked[i]), got;
		struct kvt_manager *m = t_mk(&c);
		struct kvt_stats st = t_stats_of(m);

		set_ctx("backend %s", i ? "CUDA" : "AUTO");
		CHECK_RC(kvt_manager_config(m, &got), 0);
		CHECK_EQ(got.backend, KVT_BACKEND_CUDA);
		CHECK_EQ(got.n_layers, c.n_layers);
		CHECK_EQ(got.n_kv_heads, c.n_kv_heads);
		CHECK_EQ(got.head_dim, c.head_dim);
		CHECK_EQ(got.dtype, c.dtype);
		CHECK_EQ(got.recall_blocks, c.recall_blocks);
		assert_string_equal(kvt_manager_last_error(m), "");
		CHECK_XFER(&st);
		/* the calibration's own transfers are no loads of this manager */
		CHECK_EQ(st.h2d_kernel_launches, 0);
		CHECK_EQ(st.h2d_dma_batches, 0);
		CHECK_EQ(st.device_frames_used, 0);
		kvt_manager_destroy(m);
	}
	g_ctx[0] = '\0';
}

/* ---- the CUDA backend against the host backend --------------------------------------------- */

static void print_margin(enum kvt_dtype dt)
{
	if (g_margin.gap < INFINITY)
		print_message("# %s: smallest relative gap of pooled scores at the top-K cutoff: "
			      "%.3g (seq %llu layer %u head %u)\n",
			      t_dt_name(dt), g_margin.gap, ULL(g_margin.seq), g_margin.layer,
			      g_margin.head);
}

/* Checks 2 and 3 (and resident positions) for every sequence and layer, and the counters. */
static void check_all_at(struct pair *p, struct tseq *ts, uint32_t n, bool any_tie,
			 const char *file, int line)
{
	sync_both(p);
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			check_resident_at(p, &ts[i], l, file, line);
			check_tokens_at(p, &ts[i], l, true, file, line);
			check_frames_at(p, &ts[i], l, file, line);
		}
	compare_stats_at(p, any_tie, file, line);
}
#define CHECK_ALL(p, ts, n, tie) check_all_at((p), (ts), (n), (tie), __FILE__, __LINE__)

static void run_vs_host(enum kvt_dtype dt)
{
	static const uint32_t lens[3] = {700, 1500, 50}; /* 50 <= sink + recent: Case 1 */
	const char *dn = t_dt_name(dt);
	struct pair p;
	struct tseq ts[3];
	struct tseq *all[3], *rev[3], *pr[2];
	float before[2][N_LAYERS][N_Q * HEAD_DIM];
	bool any_tie = false;
	struct kvt_stats sc, sh;

	set_ctx("%s: setup", dn);
	pair_init(&p, dt, NULL, 1500, 3);
	for (uint32_t i = 0; i < 3; i++) {
		tseq_gen(&ts[i], &p.cfg, 0x7e57000000ull + ((uint64_t)dt << 8) + i, lens[i],
			 DECODE_STEPS + 8);
		all[i] = &ts[i];
		rev[2 - i] = &ts[i];
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
	}
	assert_int_equal(ts[2].count, 0);
	assert_true(ts[0].count > 0 && ts[1].count > 0);

	/* 1-3. prefill every layer (layer 1 first), then positions, tokens, frames, counters */
	set_ctx("%s: prefill", dn);
	for (uint32_t l = N_LAYERS; l-- > 0;)
		for (uint32_t i = 0; i < 3; i++)
			PREFILL_BOTH(&p, &ts[i], l);
	sync_both(&p);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			CHECK_SELECTION(&p, &ts[i], l);
			any_tie |= ts[i].tie[l];
		}
	print_margin(dt);
	CHECK_ALL(&p, ts, 3, any_tie);
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_ATTEND(&p, &ts[i], l, NULL); /* resident sets only */

	/* 4. decode: layer 0 in one order, layer 1 in the other; checked across the first
	   block boundaries (the Case-1 sequence not yet wrapped) and after every ring wrapped */
	for (uint32_t step = 0; step < DECODE_STEPS; step++) {
		set_ctx("%s: decode step %u", dn, step);
		DECODE_BOTH(&p, all, 3, 0);
		DECODE_BOTH(&p, rev, 3, 1);
		if (step + 1 == 9 || step + 1 == DECODE_STEPS)
			CHECK_ALL(&p, ts, 3, any_tie);
	}

	/* 5. recall every sequence on each layer, same queries */
	set_ctx("%s: recall", dn);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		RECALL_BOTH(&p, all, 3, l);
	sync_both(&p);
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_VIEWS(&p, &ts[i], l);
	sh = t_stats_of(p.h);
	if (sh.recall_loads == 0)
		fail_at(__FILE__, __LINE__, "%s: the recalls loaded no block", dn);

	/* 6. attention over resident sets plus recalled blocks */
	set_ctx("%s: attend", dn);
	for (uint32_t i = 0; i < 3; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_ATTEND(&p, &ts[i], l, i == 1 ? NULL : before[i / 2][l]);
	COMPARE_STATS(&p, any_tie);

	/* 7. preempt two sequences and resume them: frames bit for bit as before */
	set_ctx("%s: preempt and resume", dn);
	pr[0] = &ts[0];
	pr[1] = &ts[2];
	{
		uint8_t *snap[2][N_LAYERS];
		size_t snap_b[2][N_LAYERS];

		for (uint32_t j = 0; j < 2; j++)
			for (uint32_t l = 0; l < N_LAYERS; l++)
				snap[j][l] = SNAPSHOT(&p, p.c, pr[j], l, &snap_b[j][l]);
		for (uint32_t j = 0; j < 2; j++) {
			uint64_t fr[FRAME_CAP];
			uint32_t nf, ns;
			float o[N_Q * HEAD_DIM];

			for (int s = 0; s < 2; s++) {
				struct kvt_manager *m = s ? p.c : p.h;
				struct kvt_seq_info in;

				CHECK_RC(kvt_seq_preempt(m, pr[j]->id), 0);
				CHECK_RC(kvt_seq_preempt(m, pr[j]->id), -EALREADY);
				in = t_info_of(m, pr[j]->id);
				CHECK_EQ(in.preempted, 1);
				CHECK_EQ(in.device_frames, 0);
				CHECK_EQ(in.layers_prefilled, N_LAYERS);
				CHECK_RC(
					kvt_seq_frames(m, pr[j]->id, 0, 0, fr, FRAME_CAP, &nf, &ns),
					-EINVAL);
				CHECK_RC(kvt_attend(m, pr[j]->id, 0, pr[j]->q_att[0], o), -EINVAL);
			}
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				pr[j]->recalled[l] = false;
				/* every token now from the host history */
				CHECK_TOKENS(&p, pr[j], l, true);
			}
		}
		/* the sequence left running keeps its frames */
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_FRAMES(&p, &ts[1], l);
		for (uint32_t j = 0; j < 2; j++) {
			struct kvt_stats s0 = t_stats_of(p.c), s1;
			uint64_t gathers, w0;

			CHECK_RC(kvt_seq_resume(p.h, pr[j]->id, NULL), 0);
			w0 = DEVICE_WAITS();
			CHECK_RC(kvt_seq_resume(p.c, pr[j]->id, p.stream), 0);
			no_device_wait(w0, 0, "resume", pr[j]->id, UINT32_MAX);
			s1 = t_stats_of(p.c);
			gathers = s1.h2d_kernel_launches + s1.h2d_dma_batches -
				  (s0.h2d_kernel_launches + s0.h2d_dma_batches);
			if (gathers != 1)
				fail_at(__FILE__, __LINE__,
					"cuda: resume of seq %llu ran %llu gathers (kvtier.h: one)",
					ULL(pr[j]->id), ULL(gathers));
			CHECK_RC(kvt_seq_resume(p.h, pr[j]->id, NULL), -EALREADY);
			CHECK_RC(kvt_seq_resume(p.c, pr[j]->id, p.stream), -EALREADY);
		}
		sync_both(&p);
		for (uint32_t j = 0; j < 2; j++)
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				expect_frames_as_at(&p, pr[j], l, snap[j][l], snap_b[j][l],
						    "cuda after preempt + resume", __FILE__,
						    __LINE__);
				free(snap[j][l]);
				CHECK_EQ(t_info_of(p.c, pr[j]->id).preempted, 0);
				CHECK_RESIDENT(&p, pr[j], l);
				CHECK_FRAMES(&p, pr[j], l);
				CHECK_TOKENS(&p, pr[j], l, true);
				CHECK_VIEWS(&p, pr[j], l);	  /* forgotten: none */
				CHECK_ATTEND(&p, pr[j], l, NULL); /* resident sets only */
			}
		/* recalled again with the same queries: the same attention as before */
		for (uint32_t l = 0; l < N_LAYERS; l++)
			RECALL_BOTH(&p, pr, 2, l);
		sync_both(&p);
		for (uint32_t j = 0; j < 2; j++)
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				float o[N_Q * HEAD_DIM];

				CHECK_VIEWS(&p, pr[j], l);
				CHECK_ATTEND(&p, pr[j], l, o);
				expect_close_at(
					o, before[j][l],
					"cuda kvt_attend after preempt + resume + recall vs "
					"before",
					pr[j], l, __FILE__, __LINE__);
			}
	}

	/* 8. counters */
	set_ctx("%s: stats", dn);
	COMPARE_STATS(&p, any_tie);
	sc = t_stats_of(p.c);
	CHECK_XFER(&sc);
	if (sc.h2d_kernel_launches + sc.h2d_dma_batches == 0)
		fail_at(__FILE__, __LINE__, "cuda: no gather counted after the recalls");
	print_message("# %s: %llu recall loads; gathers: %llu kernel, %llu DMA; gather_min "
		      "%u/%u/%u\n",
		      dn, ULL(sc.recall_loads), ULL(sc.h2d_kernel_launches),
		      ULL(sc.h2d_dma_batches), sc.xfer_gather_min_4k, sc.xfer_gather_min_16k,
		      sc.xfer_gather_min_64k);
	for (uint32_t i = 0; i < 3; i++)
		tseq_free(&ts[i]);
	pair_fini(&p);
	g_ctx[0] = '\0';
}

static void test_vs_host_f32(void **state)
{
	(void)state;
	run_vs_host(KVT_DTYPE_F32);
}

static void test_vs_host_f16(void **state)
{
	(void)state;
	run_vs_host(KVT_DTYPE_F16);
}

static void test_vs_host_bf16(void **state)
{
	(void)state;
	run_vs_host(KVT_DTYPE_BF16);
}

/* ---- a long prompt --------------------------------------------------------------------------- */

#define LONG_L 20000

/* Prompts of the given lengths (at most 3), one sequence each, prefilled layer by layer on a
   pair of bf16 managers with host budget host_bytes (0: the suite's), each layer's selection
   checked right after its prefill; then tokens, frames and counters as on the host. */
static void prompts_vs_host(const char *what, const uint32_t *lens, uint32_t n, uint64_t id0,
			    uint64_t host_bytes)
{
	struct tseq ts[3];
	bool any_tie = false;
	uint32_t max_L = 0;
	struct pair p;

	assert_true(n <= 3);
	for (uint32_t i = 0; i < n; i++)
		max_L = lens[i] > max_L ? lens[i] : max_L;
	set_ctx("%s: setup", what);
	pair_init_host(&p, KVT_DTYPE_BF16, NULL, max_L, 1, host_bytes);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < n; i++) {
		tseq_gen(&ts[i], &p.cfg, id0 + i, lens[i], 1);
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		set_ctx("%s: prefill of %u tokens", what, lens[i]);
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			PREFILL_BOTH(&p, &ts[i], l);
			sync_both(&p);
			CHECK_SELECTION(&p, &ts[i], l);
			any_tie = any_tie || ts[i].tie[l];
		}
	}
	print_margin(KVT_DTYPE_BF16);
	set_ctx("%s: after the prefills", what);
	CHECK_ALL(&p, ts, n, any_tie);
	for (uint32_t i = 0; i < n; i++)
		tseq_free(&ts[i]);
	pair_fini(&p);
	g_ctx[0] = '\0';
}

/* A prompt long enough that SnapKV's device scratch outgrows what the short prompts before it
   left (the backend allocates a larger one, without a wait for the whole device: prefill_on
   checks that on the emulated runtime), between two short prompts, which then reuse the larger
   scratch: selection, tokens, frames and counters as on the host. */
static void test_long_prompt(void **state)
{
	static const uint32_t lens[3] = {600, LONG_L, 600};

	(void)state;
	prompts_vs_host("long prompt", lens, 3, 0x10e6000000ull, 0);
}

/* ---- a prompt at the scale kvtier is for ------------------------------------------------- */

/* 528,000 tokens of 2 kv heads: as many (kv head, token) pairs as a 132K-token prompt of
   Llama-3-8B's 8 kv heads, where the suite's other prompts stop at 20,000 tokens. There the GPU
   SnapKV runs past its span clamp (policy/snapkv.cu: spans of at most SK_SPAN_MAX = 16 key
   tiles; past 16,384 (kv head, 64-key tile) pairs the grid grows past 1,024 CTAs instead: 516
   spans a head here), and a layer's save (270 MB) goes through about a thousand staging
   chunks. Selection, tokens, frames and counters as on the host. The selection check is
   coarse: the heavy keys dominate the vote, so a softmax denominator that missed the last 6% of
   the keys would still select the same positions (tried: nspan from the unclamped span passes
   here on cuda-kemu); kernel-emu compares the scores themselves, at the span cap too, and
   fails on that mistake. On a GPU only: on the CPU emulators (tests/cuda_emu builds this file
   with KVT_TEST_EMULATED, for cuda-emu and cuda-kemu alike) it takes 40 s with the stand-in
   kernels and 5 minutes with the real ones. KVT_TEST_NO_HUGE=1 skips it. */
#define HUGE_L 528000
_Static_assert((HUGE_L + 63) / 64 * N_KV > 16 * 1024 + 64, "17 tiles a span unclamped");

static void test_huge_prompt(void **state)
{
	static const uint32_t len = HUGE_L;
	/* the host history of every token (bf16 K and V), and room for the blocks' rounding */
	uint64_t history = (uint64_t)HUGE_L * N_LAYERS * N_KV * 2 * HEAD_DIM * 2;

	(void)state;
#ifdef KVT_TEST_EMULATED
	skip();
#endif
	/* bench/gpu-run.sh's compute-sanitizer runs: the CPU side of this case would take their
	   time, and its kernels are the ones the shorter prompts run */
	if (getenv("KVT_TEST_NO_HUGE") && *getenv("KVT_TEST_NO_HUGE") == '1')
		skip();
	prompts_vs_host("huge prompt", &len, 1, 0xc1a3000000ull, history + history / 8);
}

/* ---- a non-blocking stream ------------------------------------------------------------------ */

#define STALL_BYTES ((size_t)64 << 20)

/* Holds the stream back (about a GiB of device writes) so that a call whose device work did
   not follow the stream would run before the uploads queued behind the stall. */
static void stall(const struct pair *p, void *buf)
{
	for (int i = 0; i < 16; i++)
		CUDA_OK(cudaMemsetAsync(buf, i, STALL_BYTES, p->stream));
}

static void *pinned(const void *src, size_t n)
{
	void *h = NULL;

	CUDA_OK(cudaMallocHost(&h, n));
	memcpy(h, src, n);
	return h;
}

/* Uploads n bytes with cudaMemcpyAsync on the pair's stream, behind a stall. */
static void *upload_async(const struct pair *p, void *dst, const void *src, size_t n)
{
	void *h = pinned(src, n);

	CUDA_OK(cudaMemcpyAsync(dst, h, n, cudaMemcpyHostToDevice, p->stream));
	return h;
}

static void test_nonblocking_stream(void **state)
{
	cudaStream_t nb;
	struct pair p;
	struct tseq ts[2];
	struct tseq *bt[2] = {&ts[0], &ts[1]};
	void *delay;
	size_t rb;

	(void)state;
	set_ctx("non-blocking stream: setup");
	CUDA_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	pair_init(&p, KVT_DTYPE_BF16, nb, 1500, 2);
	rb = p.rowb;
	delay = dev_alloc(STALL_BYTES);
	tseq_gen(&ts[0], &p.cfg, 0x5717ea0001ull, 1500, 40);
	tseq_gen(&ts[1], &p.cfg, 0x5717ea0002ull, 40, 40);
	for (uint32_t i = 0; i < 2; i++) {
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
	}
	/* garbage where the inputs go: a call that ran ahead of its uploads would store it */
	CUDA_OK(cudaMemset(p.dk, 0xff, (size_t)N_KV * 1500 * rb));
	CUDA_OK(cudaMemset(p.dv, 0xff, (size_t)N_KV * 1500 * rb));
	CUDA_OK(cudaMemset(p.dq, 0xff, (size_t)N_Q * OBS * rb));

	set_ctx("non-blocking stream: prefill");
	for (uint32_t l = 0; l < N_LAYERS; l++)
		for (uint32_t i = 0; i < 2; i++) {
			struct tseq *t = &ts[i];
			size_t kvb = (size_t)N_KV * t->L * rb, qb = (size_t)N_Q * OBS * rb;
			uint8_t *k = t_xmalloc(kvb), *v = t_xmalloc(kvb);
			void *hk, *hv, *hq = NULL;

			CHECK_RC(prefill_on(&p, p.h, t, l), 0);
			prompt_tensor(t, l, 0, k);
			prompt_tensor(t, l, 1, v);
			stall(&p, delay);
			hk = upload_async(&p, p.dk, k, kvb);
			hv = upload_async(&p, p.dv, v, kvb);
			if (t->count)
				hq = upload_async(&p, p.dq, t->q_obs[l], qb);
			CHECK_RC(kvt_prefill_layer(p.c, t->id, l, p.dk, p.dv, hq ? p.dq : NULL, nb),
				 0);
			garble(&p, p.dk, kvb);
			garble(&p, p.dv, kvb);
			garble(&p, p.dq, qb);
			CHECK_RC(kvt_manager_sync(p.c, nb), 0); /* before the pinned sources go */
			CUDA_OK(cudaFreeHost(hk));
			CUDA_OK(cudaFreeHost(hv));
			if (hq)
				CUDA_OK(cudaFreeHost(hq));
			free(k);
			free(v);
			t->n[l] = t->L;
		}
	sync_both(&p);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < 2; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_SELECTION(&p, &ts[i], l);
	print_margin(KVT_DTYPE_BF16);
	CHECK_ALL(&p, ts, 2, ts[0].tie[0] || ts[0].tie[1]);

	for (uint32_t step = 0; step < 30; step++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			size_t bytes = 2 * N_KV * rb;
			uint8_t k[2 * N_KV * ROW_MAX], v[2 * N_KV * ROW_MAX];
			uint64_t ids[2] = {ts[0].id, ts[1].id};
			void *hk, *hv;

			set_ctx("non-blocking stream: decode step %u layer %u", step, l);
			CHECK_RC(decode_on(&p, p.h, bt, 2, l), 0);
			for (uint32_t i = 0; i < 2; i++)
				for (uint32_t h = 0; h < N_KV; h++) {
					memcpy(k + (i * N_KV + h) * rb,
					       ref_row(&ts[i], l, h, ts[i].n[l], 0), rb);
					memcpy(v + (i * N_KV + h) * rb,
					       ref_row(&ts[i], l, h, ts[i].n[l], 1), rb);
				}
			stall(&p, delay);
			hk = upload_async(&p, p.ek, k, bytes);
			hv = upload_async(&p, p.ev, v, bytes);
			CHECK_RC(kvt_decode_append(p.c, l, ids, 2, p.ek, p.ev, nb), 0);
			garble(&p, p.ek, bytes);
			garble(&p, p.ev, bytes);
			CHECK_RC(kvt_manager_sync(p.c, nb), 0);
			CUDA_OK(cudaFreeHost(hk));
			CUDA_OK(cudaFreeHost(hv));
			ts[0].n[l]++;
			ts[1].n[l]++;
		}
	set_ctx("non-blocking stream: after decode");
	CHECK_ALL(&p, ts, 2, ts[0].tie[0] || ts[0].tie[1]);

	set_ctx("non-blocking stream: recall");
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		size_t qb = 2 * (size_t)N_Q * rb;
		uint8_t *q = t_xmalloc(qb);
		uint64_t ids[2] = {ts[0].id, ts[1].id};
		void *hq;

		CHECK_RC(recall_on(&p, p.h, bt, 2, l), 0);
		memcpy(q, ts[0].q_dec[l], qb / 2);
		memcpy(q + qb / 2, ts[1].q_dec[l], qb / 2);
		stall(&p, delay);
		hq = upload_async(&p, p.eq, q, qb);
		CHECK_RC(kvt_decode_recall(p.c, l, ids, 2, p.eq, nb), 0);
		garble(&p, p.eq, qb);
		CHECK_RC(kvt_manager_sync(p.c, nb), 0);
		CUDA_OK(cudaFreeHost(hq));
		free(q);
		ts[0].recalled[l] = ts[1].recalled[l] = true;
	}
	sync_both(&p);
	for (uint32_t i = 0; i < 2; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			CHECK_VIEWS(&p, &ts[i], l);
			CHECK_ATTEND(&p, &ts[i], l, NULL);
		}
	COMPARE_STATS(&p, ts[0].tie[0] || ts[0].tie[1]);

	tseq_free(&ts[0]);
	tseq_free(&ts[1]);
	pair_fini(&p);
	dev_free(delay);
	CUDA_OK(cudaStreamDestroy(nb));
	g_ctx[0] = '\0';
}

/* ---- many resumes, one wait -------------------------------------------------------------------
 */

#define BURST 20 /* more resumes than the backend has piece-list slots (16) */

/* Preempts ts[0, n) on both managers, waits, then resumes them all, the CUDA manager's on
   stream st, with no wait after. */
static void preempt_resume(struct pair *p, struct tseq *ts, uint32_t n, cudaStream_t st)
{
	for (uint32_t i = 0; i < n; i++) {
		CHECK_RC(kvt_seq_preempt(p->h, ts[i].id), 0);
		CHECK_RC(kvt_seq_preempt(p->c, ts[i].id), 0);
	}
	sync_both(p);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t w0;

		CHECK_RC(kvt_seq_resume(p->h, ts[i].id, NULL), 0);
		w0 = DEVICE_WAITS();
		CHECK_RC(kvt_seq_resume(p->c, ts[i].id, st), 0);
		no_device_wait(w0, 0, "resume", ts[i].id, UINT32_MAX);
	}
}

/* A batch of preempted sequences resumed back to back on a non-blocking stream, with one wait
   after the last, twice: every resume's gather (the fused kernel: calibration off) is still
   queued when the next one fills its piece list, and the last ones find every list slot used
   by work not yet waited for. Short prompts, so no list outgrows its slot (growing one frees
   device memory, and cudaFree waits for the device). Then every frame as before the
   preemption, bit for bit. */
static void test_resume_burst(void **state)
{
	const char *was = getenv("KVTIER_CUDA_CALIBRATE");
	char *saved = was ? strdup(was) : NULL;
	struct tseq *ts = t_xmalloc(BURST * sizeof(*ts));
	uint8_t *snap[BURST][N_LAYERS];
	size_t snap_b[BURST][N_LAYERS];
	float early[N_LAYERS][N_Q * HEAD_DIM];
	struct kvt_stats s0, s1;
	bool any_tie = false;
	cudaStream_t nb;
	struct pair p;

	(void)state;
	set_ctx("resume burst: setup");
	assert_true(!was || saved);
	CUDA_OK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
	assert_int_equal(setenv("KVTIER_CUDA_CALIBRATE", "0", 1), 0);
	pair_init(&p, KVT_DTYPE_F16, NULL, 40, 1); /* prefill_on's inputs follow a blocking one */
	if (saved)
		assert_int_equal(setenv("KVTIER_CUDA_CALIBRATE", saved, 1), 0);
	else
		assert_int_equal(unsetenv("KVTIER_CUDA_CALIBRATE"), 0);
	free(saved);
	CHECK_EQ(t_stats_of(p.c).xfer_calibrated, 0);
	for (uint32_t i = 0; i < BURST; i++) {
		tseq_gen(&ts[i], &p.cfg, 0xb0257000ull + i, 40, 1);
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++)
			PREFILL_BOTH(&p, &ts[i], l);
	}
	sync_both(&p);
	g_margin.gap = INFINITY;
	for (uint32_t i = 0; i < BURST; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			CHECK_SELECTION(&p, &ts[i], l);
			any_tie |= ts[i].tie[l];
			snap[i][l] = SNAPSHOT(&p, p.c, &ts[i], l, &snap_b[i][l]);
		}

	for (int round = 0; round < 2; round++) {
		set_ctx("resume burst: round %d: preempt and resume", round);
		s0 = t_stats_of(p.c);
		preempt_resume(&p, ts, BURST, nb);
		s1 = t_stats_of(p.c);
		CHECK_EQ(s1.h2d_kernel_launches - s0.h2d_kernel_launches, BURST);
		CHECK_EQ(s1.h2d_dma_batches, s0.h2d_dma_batches);
		/* attention needs the frames the queued gathers write: it waits for them */
		for (uint32_t l = 0; l < N_LAYERS; l++)
			CHECK_RC(kvt_attend(p.c, ts[BURST - 1].id, l, ts[BURST - 1].q_att[l],
					    early[l]),
				 0);
		CHECK_RC(kvt_manager_sync(p.c, nb), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			float o[N_Q * HEAD_DIM];

			CHECK_ATTEND(&p, &ts[BURST - 1], l, o);
			expect_close_at(early[l], o,
					"cuda kvt_attend before the wait vs after the wait",
					&ts[BURST - 1], l, __FILE__, __LINE__);
		}

		set_ctx("resume burst: round %d: after the wait", round);
		for (uint32_t i = 0; i < BURST; i++)
			for (uint32_t l = 0; l < N_LAYERS; l++) {
				expect_frames_as_at(&p, &ts[i], l, snap[i][l], snap_b[i][l],
						    "cuda after a burst of resumes", __FILE__,
						    __LINE__);
				CHECK_FRAMES(&p, &ts[i], l);
				CHECK_TOKENS(&p, &ts[i], l, true);
			}
		COMPARE_STATS(&p, any_tie);
	}

	/* Half of them resumed and destroyed at once, their resumes still queued; new sequences
	   then take their frames and host blocks (the prefills' saves write those blocks on the
	   host, their frames are written on another stream): destroy must let the queued gathers
	   land first. The new sequences and the other half: as they should be. */
	set_ctx("resume burst: destroyed while resuming");
	preempt_resume(&p, ts, BURST / 2, nb);
	for (uint32_t i = 0; i < BURST / 2; i++) {
		CHECK_RC(kvt_seq_destroy(p.h, ts[i].id), 0);
		CHECK_RC(kvt_seq_destroy(p.c, ts[i].id), 0);
		tseq_free(&ts[i]);
		tseq_gen(&ts[i], &p.cfg, 0xb0257100ull + i, 40, 1);
		CHECK_RC(kvt_seq_create(p.h, ts[i].id, ts[i].L), 0);
		CHECK_RC(kvt_seq_create(p.c, ts[i].id, ts[i].L), 0);
		for (uint32_t l = 0; l < N_LAYERS; l++)
			PREFILL_BOTH(&p, &ts[i], l);
	}
	CHECK_RC(kvt_manager_sync(p.c, nb), 0);
	sync_both(&p);
	for (uint32_t i = 0; i < BURST; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++) {
			if (i >= BURST / 2)
				expect_frames_as_at(&p, &ts[i], l, snap[i][l], snap_b[i][l],
						    "cuda beside destroyed sequences", __FILE__,
						    __LINE__);
			CHECK_RESIDENT(&p, &ts[i], l);
			CHECK_FRAMES(&p, &ts[i], l);
			CHECK_TOKENS(&p, &ts[i], l, true);
		}
	COMPARE_STATS(&p, any_tie);
	for (uint32_t i = 0; i < BURST; i++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			free(snap[i][l]);

	for (uint32_t i = 0; i < BURST; i++)
		tseq_free(&ts[i]);
	free(ts);
	pair_fini(&p);
	CUDA_OK(cudaStreamDestroy(nb));
	g_ctx[0] = '\0';
}

/* ---- CUDA failures, one call at a time ------------------------------------------------------ */

/* A bystander sequence b, live on both managers, and a target t prefilled on the host manager
   (the reference); each test brings t to the CUDA manager its own way. */
struct fenv {
	struct pair p;
	struct tseq b, t;
	uint8_t *b_snap[N_LAYERS]; /* b's device frames on the CUDA manager */
	size_t b_snap_bytes[N_LAYERS];
	/* Failed calls that changed their own sequence's device frames: collected, so one run
	   walks every CUDA call and lists them all at the end (fault_problems_at). */
	char problems[1536];
	uint32_t n_problems;
};

static void fenv_init(struct fenv *e)
{
	struct pair *p = &e->p;
	struct tseq *bb[1] = {&e->b};

	memset(e, 0, sizeof(*e));
	set_ctx("fault: setup");
	pair_init(p, KVT_DTYPE_F16, NULL, 700, 1);
	tseq_gen(&e->b, &p->cfg, 0xb1e55ed0ull, 700, 16);
	tseq_gen(&e->t, &p->cfg, 0x7a59e70ull, 700, 1200);
	CHECK_RC(kvt_seq_create(p->h, e->b.id, e->b.L), 0);
	CHECK_RC(kvt_seq_create(p->c, e->b.id, e->b.L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		PREFILL_BOTH(p, &e->b, l);
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_SELECTION(p, &e->b, l);
	for (uint32_t step = 0; step < 5; step++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			DECODE_BOTH(p, bb, 1, l);
	CHECK_RC(kvt_seq_create(p->h, e->t.id, e->t.L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		CHECK_RC(prefill_on(p, p->h, &e->t, l), 0);
		e->t.n[l] = e->t.L;
	}
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		CHECK_RESIDENT(p, &e->b, l);
		e->b_snap[l] = SNAPSHOT(p, p->c, &e->b, l, &e->b_snap_bytes[l]);
	}
}

static void fenv_fini(struct fenv *e)
{
	for (uint32_t l = 0; l < N_LAYERS; l++)
		free(e->b_snap[l]);
	tseq_free(&e->b);
	tseq_free(&e->t);
	pair_fini(&e->p);
	g_ctx[0] = '\0';
}

/* The CUDA call numbered nth of `call` fails (KVT_FAULT_CUDA); fired: whether it was reached.
   Nothing between arming and disarming may fail the test (cmocka would leave it armed). */
#define ARMED(nth, fired, rc, call)                         \
	do {                                                \
		kvt_fault_arm(1u << KVT_FAULT_CUDA, (nth)); \
		(rc) = (call);                              \
		(fired) = kvt_fault_fired();                \
		kvt_fault_disarm();                         \
	} while (0)

static void expect_info_at(const struct kvt_seq_info *a, const struct kvt_seq_info *b, uint64_t id,
			   const char *op, const char *file, int line)
{
	if (a->layers_prefilled != b->layers_prefilled || a->tokens != b->tokens ||
	    a->device_frames != b->device_frames || a->host_blocks != b->host_blocks ||
	    a->preempted != b->preempted || a->frames_per_layer != b->frames_per_layer)
		fail_at(file, line,
			"failed %s changed kvt_seq_info of seq %llu: layers %u -> %u, tokens %u -> "
			"%u, device frames %llu -> %llu, host blocks %llu -> %llu, preempted %u -> %u",
			op, ULL(id), a->layers_prefilled, b->layers_prefilled, a->tokens, b->tokens,
			ULL(a->device_frames), ULL(b->device_frames), ULL(a->host_blocks),
			ULL(b->host_blocks), a->preempted, b->preempted);
}

/* State of the CUDA manager right before an armed call. */
struct before {
	struct kvt_seq_info ti, bi;
	struct kvt_stats st;
	uint8_t *t_snap; /* t's frames of t_layer, or NULL when t has none there */
	size_t t_snap_bytes;
	uint32_t t_layer;
};

static void before_take(struct fenv *e, struct before *b, uint32_t t_layer)
{
	struct pair *p = &e->p;

	b->ti = t_info_of(p->c, e->t.id);
	b->bi = t_info_of(p->c, e->b.id);
	b->st = t_stats_of(p->c);
	b->t_layer = t_layer;
	b->t_snap =
		b->ti.layers_prefilled ? SNAPSHOT(p, p->c, &e->t, t_layer, &b->t_snap_bytes) : NULL;
}

/* The armed call failed through its fault: a negative errno CUDA failures map to, the last
   error set, and nothing visible changed: counters, both sequences' info, the bystander's and
   the target's tokens and device frames. */
static void after_fault_at(struct fenv *e, const struct before *b, const char *op, uint64_t nth,
			   int rc, const char *file, int line)
{
	struct pair *p = &e->p;
	struct kvt_stats st = t_stats_of(p->c);
	struct kvt_seq_info ti = t_info_of(p->c, e->t.id), bi = t_info_of(p->c, e->b.id);
	char what[128];

	if (rc != -EIO && rc != -ENOMEM && rc != -ENODEV)
		fail_at(file, line,
			"%s with CUDA call %llu failing returned %d (%s): expected -EIO, -ENOMEM or "
			"-ENODEV",
			op, ULL(nth), rc, kvt_strerror(rc));
	if (!kvt_manager_last_error(p->c)[0])
		fail_at(file, line, "%s failed (%d) with an empty kvt_manager_last_error", op, rc);
	for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
		const struct stat_field *f = &stat_fields[i];

		if ((f->flags & F_FIX) && stat_get(&st, f) != stat_get(&b->st, f))
			fail_at(file, line,
				"failed %s (CUDA call %llu) changed stats.%s: %llu -> %llu", op,
				ULL(nth), f->name, ULL(stat_get(&b->st, f)), ULL(stat_get(&st, f)));
	}
	expect_info_at(&b->ti, &ti, e->t.id, op, file, line);
	expect_info_at(&b->bi, &bi, e->b.id, op, file, line);
	snprintf(what, sizeof(what), "after a failed %s, cuda", op);
	for (uint32_t l = 0; l < N_LAYERS; l++) {
		expect_frames_as_at(p, &e->b, l, e->b_snap[l], e->b_snap_bytes[l], what, file,
				    line);
		check_tokens_at(p, &e->b, l, false, file, line);
	}
	if (b->t_snap) {
		size_t n, used = strlen(e->problems);
		uint8_t *now = SNAPSHOT(p, p->c, &e->t, b->t_layer, &n);
		char msg[200];

		if (snapshot_differs(b->t_snap, b->t_snap_bytes, now, n, &e->t, b->t_layer, msg,
				     sizeof(msg))) {
			/* its tokens read back differently for the same reason: the retry
			   rewrites them, and then they are compared with the reference */
			e->n_problems++;
			snprintf(e->problems + used, sizeof(e->problems) - used,
				 "#   %s:%d: %s failed (%d) at CUDA call %llu but changed %s\n",
				 file, line, op, rc, ULL(nth), msg);
		} else {
			for (uint32_t l = 0; l < N_LAYERS; l++)
				check_tokens_at(p, &e->t, l, false, file, line);
		}
		free(now);
	}
}

/* kvtier.h: a failed call changes nothing visible; its own sequence's frames included. */
static void fault_problems_at(const struct fenv *e, const char *file, int line)
{
	if (!e->n_problems)
		return;
	g_ctx[0] = '\0';
	print_message("%s", e->problems);
	fail_at(file, line,
		"%u failed calls changed their own sequence's device frames (listed "
		"above)",
		e->n_problems);
}

/* The loop over nth ended: the fault hook was reached at least once. */
static void fault_expect_done_at(uint64_t failed, const char *op, const char *file, int line)
{
	if (!failed)
		fail_at(file, line,
			"KVT_FAULT_CUDA never fired during %s: the plugin does not ask the fault hook "
			"before its CUDA calls (plugin.h)",
			op);
	print_message("# %s: %llu CUDA calls, each failed once\n", op, ULL(failed));
}

/* Checks an armed call's outcome: rc and whether its fault fired. Returns whether it fired. */
static bool armed_outcome_at(struct fenv *e, const struct before *b, const char *op, uint64_t nth,
			     int rc, bool fired, const char *file, int line)
{
	if (!fired) {
		if (rc)
			fail_at(file, line,
				"%s returned %d (%s) without its fault firing (CUDA call "
				"%llu): %s",
				op, rc, kvt_strerror(rc), ULL(nth), kvt_manager_last_error(e->p.c));
		return false;
	}
	if (rc == 0)
		fail_at(file, line,
			"%s took its injected failure of CUDA call %llu and returned 0 (the error was "
			"swallowed)",
			op, ULL(nth));
	after_fault_at(e, b, op, nth, rc, file, line);
	return true;
}
#define ARMED_OUTCOME(e, b, op, nth, rc, fired) \
	armed_outcome_at((e), (b), (op), (nth), (rc), (fired), __FILE__, __LINE__)

static void retry_at(struct fenv *e, const char *op, uint64_t nth, int rc, const char *file,
		     int line)
{
	if (rc)
		fail_at(file, line, "%s retried after its fault (CUDA call %llu) = %d (%s): %s", op,
			ULL(nth), rc, kvt_strerror(rc), kvt_manager_last_error(e->p.c));
}
#define RETRY(e, op, nth, call) retry_at((e), (op), (nth), (call), __FILE__, __LINE__)

static void test_fault_prefill(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t;
	uint64_t failed = 0;

	(void)state;
	fenv_init(&e);
	for (uint64_t nth = 1;; nth++) {
		struct before b;
		bool fired;
		int rc;

		set_ctx("fault: prefill, CUDA call %llu fails", ULL(nth));
		if (nth > FAULT_MAX)
			fail_at(__FILE__, __LINE__, "prefill never completed with a fault armed");
		CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
		before_take(&e, &b, 0);
		ARMED(nth, fired, rc, prefill_on(p, p->c, t, 0));
		if (ARMED_OUTCOME(&e, &b, "kvt_prefill_layer", nth, rc, fired)) {
			uint32_t n = 1;

			failed++;
			CHECK_RC(kvt_seq_tokens(p->c, t->id, 0, &n), 0);
			CHECK_EQ(n, 0);
			RETRY(&e, "kvt_prefill_layer", nth, prefill_on(p, p->c, t, 0));
		}
		sync_both(p);
		CHECK_SELECTION(p, t, 0);
		CHECK_TOKENS(p, t, 0, true);
		CHECK_FRAMES(p, t, 0);
		free(b.t_snap);
		if (!fired)
			break;
		CHECK_RC(kvt_seq_destroy(p->c, t->id), 0);
	}
	fault_expect_done_at(failed, "kvt_prefill_layer", __FILE__, __LINE__);
	fault_problems_at(&e, __FILE__, __LINE__);
	fenv_fini(&e);
}

static void test_fault_decode(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t, *tt[1] = {&e.t};

	(void)state;
	fenv_init(&e);
	CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_RC(prefill_on(p, p->c, t, l), 0);
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_SELECTION(p, t, l);
	/* pass 0: the token lands inside a block; pass 1: it opens a new host block */
	for (int pass = 0; pass < 2; pass++) {
		const char *op = pass ? "kvt_decode_append (new block)" : "kvt_decode_append";
		uint64_t failed = 0;

		for (uint64_t nth = 1;; nth++) {
			struct before b;
			bool fired;
			int rc;

			set_ctx("fault: %s, CUDA call %llu fails", op, ULL(nth));
			if (nth > FAULT_MAX)
				fail_at(__FILE__, __LINE__, "%s never completed with a fault armed",
					op);
			while ((t->n[0] % BT == 0) != (pass == 1))
				DECODE_BOTH(p, tt, 1, 0);
			sync_both(p);
			before_take(&e, &b, 0);
			ARMED(nth, fired, rc, decode_on(p, p->c, tt, 1, 0));
			if (ARMED_OUTCOME(&e, &b, op, nth, rc, fired)) {
				failed++;
				RETRY(&e, op, nth, decode_on(p, p->c, tt, 1, 0));
			}
			CHECK_RC(decode_on(p, p->h, tt, 1, 0), 0);
			t->n[0]++;
			sync_both(p);
			CHECK_RESIDENT(p, t, 0);
			CHECK_TOKENS(p, t, 0, true);
			CHECK_FRAMES(p, t, 0);
			free(b.t_snap);
			if (!fired)
				break;
		}
		fault_expect_done_at(failed, op, __FILE__, __LINE__);
	}
	fault_problems_at(&e, __FILE__, __LINE__);
	fenv_fini(&e);
}

static void test_fault_recall(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t, *tt[1] = {&e.t};
	uint64_t failed = 0;

	(void)state;
	fenv_init(&e);
	CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_RC(prefill_on(p, p->c, t, l), 0);
	sync_both(p);
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_SELECTION(p, t, l);
	for (uint32_t step = 0; step < 20; step++)
		for (uint32_t l = 0; l < N_LAYERS; l++)
			DECODE_BOTH(p, tt, 1, l);
	sync_both(p);
	for (uint64_t nth = 1;; nth++) {
		struct before b;
		bool fired;
		int rc;

		set_ctx("fault: kvt_decode_recall, CUDA call %llu fails", ULL(nth));
		if (nth > FAULT_MAX)
			fail_at(__FILE__, __LINE__, "recall never completed with a fault armed");
		/* drop t's recalled blocks, so this recall loads every one of them again */
		CHECK_RC(kvt_seq_preempt(p->h, t->id), 0);
		CHECK_RC(kvt_seq_preempt(p->c, t->id), 0);
		CHECK_RC(kvt_seq_resume(p->h, t->id, NULL), 0);
		CHECK_RC(kvt_seq_resume(p->c, t->id, p->stream), 0);
		t->recalled[0] = t->recalled[1] = false;
		sync_both(p);
		before_take(&e, &b, 0);
		ARMED(nth, fired, rc, recall_on(p, p->c, tt, 1, 0));
		if (ARMED_OUTCOME(&e, &b, "kvt_decode_recall", nth, rc, fired)) {
			failed++;
			RETRY(&e, "kvt_decode_recall", nth, recall_on(p, p->c, tt, 1, 0));
		}
		CHECK_RC(recall_on(p, p->h, tt, 1, 0), 0);
		t->recalled[0] = true;
		sync_both(p);
		CHECK_VIEWS(p, t, 0);
		CHECK_ATTEND(p, t, 0, NULL);
		free(b.t_snap);
		if (!fired)
			break;
	}
	fault_expect_done_at(failed, "kvt_decode_recall", __FILE__, __LINE__);
	fault_problems_at(&e, __FILE__, __LINE__);
	fenv_fini(&e);
}

/* A save thread's wait for a staging copy fails (KVT_FAULT_STAGE: after the copy landed, as an
   asynchronous CUDA error reported there would). The calls that need the lost save fail with
   -EIO and the detail: a read of t's host history, a sync. Those that need only earlier saves
   do not: b, saved before, still reads back bit-exact, resident and host-only tokens. Nothing
   hangs, and t and the manager are destroyed as usual. */
static void test_fault_stage(void **state)
{
	struct fenv e;
	struct pair *p = &e.p;
	struct tseq *t = &e.t;
	uint8_t gk[ROW_MAX], gv[ROW_MAX];
	uint64_t hits;
	bool fired;
	int rc_prefill, rc_read;

	(void)state;
	fenv_init(&e);
	set_ctx("fault: a staging copy of t's prefill save is lost");
	CHECK_RC(kvt_seq_create(p->c, t->id, t->L), 0);
	CHECK_RC(kvt_fault_arm(KVT_FAULT_SHARED, 1), 0);
	rc_prefill = prefill_on(p, p->c, t, 0);
	/* the host history waits for the save, wherever the position is resident */
	rc_read = kvt_seq_read_token_host(p->c, t->id, 0, 0, 0, gk, gv);
	fired = kvt_fault_fired();
	hits = kvt_fault_disarm();
	CHECK_RC(rc_prefill, 0); /* its save is asynchronous: the prefill itself succeeded */
	if (!fired)
		fail_at(__FILE__, __LINE__,
			"KVT_FAULT_STAGE never fired (%llu hits): the save of a %u-token prefill "
			"did not wait for its staging copy through stage_wait",
			ULL(hits), t->L);
	CHECK_RC(rc_read, -EIO);
	if (!strstr(kvt_manager_last_error(p->c), "staging copy"))
		fail_at(__FILE__, __LINE__, "last error after the lost save: \"%s\"",
			kvt_manager_last_error(p->c));
	for (uint32_t l = 0; l < N_LAYERS; l++)
		CHECK_TOKENS(p, &e.b, l, true);
	CHECK_RC(kvt_manager_sync(p->c, p->stream), -EIO);
	CHECK_RC(kvt_seq_read_token_host(p->c, e.b.id, 0, 0, 0, gk, gv), 0);
	CHECK_RC(kvt_seq_destroy(p->c, t->id), 0);
	CHECK_RC(kvt_seq_read_token_host(p->c, e.b.id, 1, 1, e.b.L - 1, gk, gv), 0);
	fenv_fini(&e);
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backend_choice),	   cmocka_unit_test(test_vs_host_f32),
		cmocka_unit_test(test_vs_host_f16),	   cmocka_unit_test(test_vs_host_bf16),
		cmocka_unit_test(test_long_prompt),	   cmocka_unit_test(test_huge_prompt),
		cmocka_unit_test(test_nonblocking_stream), cmocka_unit_test(test_resume_burst),
		cmocka_unit_test(test_fault_prefill),	   cmocka_unit_test(test_fault_decode),
		cmocka_unit_test(test_fault_recall),	   cmocka_unit_test(test_fault_stage),
	};
	const struct kvt_plugin *plugin;
	const char *seed = getenv("KVT_TEST_SEED");
	char why[256] = "";
	int n = 0, err = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n == 0) {
		printf("# skip: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
		return 77;
	}
	plugin = kvt_plugin_load(&err);
	if (!plugin) {
		printf("# skip: CUDA backend plugin not loaded (%s)\n",
		       kvt_plugin_error()[0] ? kvt_plugin_error() : "not found");
		return 77;
	}
	if (plugin->probe(why, sizeof(why))) {
		printf("# skip: %s\n", why[0] ? why : "no usable CUDA device");
		return 77;
	}
	g_seed = seed && *seed ? strtoull(seed, NULL, 0) : 0x6b76746965723031ull;
	printf("# seed 0x%llx (KVT_TEST_SEED)\n", ULL(g_seed));
	check_context = ctx_write;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
