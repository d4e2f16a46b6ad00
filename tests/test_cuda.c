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
#include "test_cuda.h"

_Static_assert(TOPK == N_HEAVY * POOL, "the top-K is the heavy keys' pooling windows");

static uint64_t g_seed;

/* ---- failure context ------------------------------------------------------------------- */

char g_ctx[160];

static void ctx_write(char *buf, size_t len)
{
	if (g_ctx[0])
		snprintf(buf, len, "[%s] ", g_ctx);
}

void set_ctx(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(g_ctx, sizeof(g_ctx), fmt, ap);
	va_end(ap);
}

/* ---- CUDA runtime helpers ---------------------------------------------------------------- */

void cuda_ok_at(cudaError_t e, const char *what, const char *file, int line)
{
	if (e != cudaSuccess)
		fail_at(file, line, "%s: %s (%s)", what, cudaGetErrorString(e),
			cudaGetErrorName(e));
}

void *dev_alloc(size_t n)
{
	void *p = NULL;

	CUDA_OK(cudaMalloc(&p, n ? n : 1));
	return p;
}

void dev_free(void *p)
{
	if (p)
		CUDA_OK(cudaFree(p));
}

static void dev_put(void *dst, const void *src, size_t n)
{
	CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}

/* Copies n bytes at addr into dst: a device address (CUDA manager) or a host one (host). */
void addr_get(void *dst, uint64_t addr, size_t n, bool dev)
{
	if (dev)
		CUDA_OK(cudaMemcpy(dst, (const void *)(uintptr_t)addr, n, cudaMemcpyDeviceToHost));
	else
		memcpy(dst, (const void *)(uintptr_t)addr, n);
}

/* ---- configuration and the pair of managers --------------------------------------------- */

struct kvt_config suite_config(enum kvt_dtype dt, enum kvt_backend be)
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

const char *side(const struct pair *p, const struct kvt_manager *m)
{
	return m == p->c ? "cuda" : "host";
}

/* stream: the CUDA manager's calls run on it; NULL: a stream created here (cudaStreamCreate).
   host_bytes: both managers' host budget; 0: the suite's (suite_config). */
void pair_init_host(struct pair *p, enum kvt_dtype dt, cudaStream_t stream, uint32_t max_L,
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

void pair_init(struct pair *p, enum kvt_dtype dt, cudaStream_t stream, uint32_t max_L,
	       uint32_t max_batch)
{
	pair_init_host(p, dt, stream, max_L, max_batch, 0);
}

void pair_fini(struct pair *p)
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

void sync_both(struct pair *p)
{
	CHECK_RC(kvt_manager_sync(p->c, p->stream), 0);
	CHECK_RC(kvt_manager_sync(p->h, NULL), 0);
}

/* The inputs of a call may be reused once it returns, in stream order: garbage them right
   behind it (0xff is NaN in every dtype), so a call whose device work read them later, or on
   another stream, would store garbage. */
void garble(const struct pair *p, void *d, size_t n)
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

uint32_t ring0_of(uint32_t N)
{
	uint32_t r = N > RECENT ? N - RECENT : 0;

	return r < SINK ? SINK : r;
}

/* End of the top-K candidates of a prompt of L tokens: [SINK, cand_hi(L)). */
uint32_t cand_hi(uint32_t L)
{
	uint32_t a = L > RECENT ? L - RECENT : 0, b = L > OBS ? L - OBS : 0;

	return a < b ? a : b;
}

const uint8_t *ref_row(const struct tseq *t, uint32_t layer, uint32_t h, uint32_t pos, int is_v)
{
	return (is_v ? t->v : t->k)[layer] + ((size_t)h * t->cap + pos) * t->rowb;
}

/* Generates every row of a sequence of an L-token prompt and `extra` decode tokens. Keys and
   values are uniform in [-1, 1); the observation queries of kv head h share a direction u_h
   (+-1 per channel) with N_HEAVY keys of graded strength in the candidate range, so those keys
   get most of the vote, and pooling spreads it over their windows (which never overlap): the
   top-K is exactly those windows. */
void tseq_gen(struct tseq *t, const struct kvt_config *c, uint64_t id, uint32_t L, uint32_t extra)
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

void tseq_free(struct tseq *t)
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
void prompt_tensor(const struct tseq *t, uint32_t layer, int is_v, uint8_t *dst)
{
	for (uint32_t h = 0; h < N_KV; h++)
		memcpy(dst + (size_t)h * t->L * t->rowb, ref_row(t, layer, h, 0, is_v),
		       (size_t)t->L * t->rowb);
}

/* ---- the calls, on one manager ------------------------------------------------------------ */

/* layer: UINT32_MAX for a call on every layer (resume) */
void no_device_wait(uint64_t before, int rc, const char *call, uint64_t seq, uint32_t layer)
{
	uint64_t n = DEVICE_WAITS() - before;

	if (rc == 0 && n)
		fail_msg("%s of seq %llu layer %d waited %llu times for the whole device", call,
			 ULL(seq), layer == UINT32_MAX ? -1 : (int)layer, ULL(n));
}

/* Prefills `layer` of t on m (the CUDA manager gets device copies on the pair's stream). */
int prefill_on(struct pair *p, struct kvt_manager *m, const struct tseq *t, uint32_t layer)
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
int decode_on(struct pair *p, struct kvt_manager *m, struct tseq *const *ts, uint32_t n,
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
int recall_on(struct pair *p, struct kvt_manager *m, struct tseq *const *ts, uint32_t n,
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
		uint32_t pending = m->rc.n_pending;
		uint64_t t0;

		dev_put(p->eq, q, n * qrow);
		w0 = DEVICE_WAITS();
		t0 = THREAD_WAITS();
		rc = kvt_decode_recall(m, layer, ids, n, p->eq, p->stream);
		no_device_wait(w0, rc, "recall", ids[0], layer);
		t0 = THREAD_WAITS() - t0;
		if (rc == 0 && m->dev_regions && t0 > pending)
			fail_msg(
				"recall of seq %llu layer %u with the regions on the device waited "
				"%llu times, %u calls pending before it (it queues its program and "
				"returns: test_cuda.h, THREAD_WAITS)",
				ULL(ids[0]), layer, ULL(t0), pending);
		garble(p, p->eq, n * qrow);
	}
	free(q);
	return rc;
}

void prefill_both_at(struct pair *p, struct tseq *t, uint32_t layer, const char *file, int line)
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

void decode_both_at(struct pair *p, struct tseq *const *ts, uint32_t n, uint32_t layer,
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
void recall_both_at(struct pair *p, struct tseq *const *ts, uint32_t n, uint32_t layer,
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
	if (p->c->dev_regions) { /* the regions' own gather, every call, its list on the device */
		if (kern != 1 || dma != 0)
			fail_at(file, line,
				"cuda: recall of layer %u with the regions on the device ran %llu "
				"kernels and %llu DMA batches (kvtier.h: one fused kernel a call)",
				layer, ULL(kern), ULL(dma));
		/* and its device time, read with its report (the stats above settled it) */
		if (s1.recall_device_ns <= s0.recall_device_ns)
			fail_at(file, line,
				"cuda: recall of layer %u on the device: recall_device_ns %llu -> "
				"%llu",
				layer, ULL(s0.recall_device_ns), ULL(s1.recall_device_ns));
		loads = 0; /* no DMA choice to check */
	} else if (kern + dma != (loads ? 1u : 0u))
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

/* ---- counters ------------------------------------------------------------------------------ */

#define F_SEL 1u /* depends on which positions SnapKV kept */

#define SF(f, fl)                                                                           \
	{                                                                                   \
#f, offsetof(struct kvt_stats, f), sizeof(((struct kvt_stats *)0)->f), (fl) \
	}

/* The manager's own counters (not the CUDA transfer figures, which only the CUDA backend
   keeps). */
const struct stat_field stat_fields[] = {
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

const size_t n_stat_fields = sizeof(stat_fields) / sizeof(stat_fields[0]);

uint64_t stat_get(const struct kvt_stats *st, const struct stat_field *f)
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
void compare_stats_at(struct pair *p, bool any_tie, const char *file, int line)
{
	struct kvt_stats sh = t_stats_of(p->h), sc = t_stats_of(p->c);

	for (size_t i = 0; i < n_stat_fields; i++) {
		const struct stat_field *f = &stat_fields[i];

		if ((f->flags & F_SEL) && any_tie)
			continue;
		if (stat_get(&sc, f) != stat_get(&sh, f))
			fail_at(file, line, "stats.%s: cuda %llu, host %llu after the same calls",
				f->name, ULL(stat_get(&sc, f)), ULL(stat_get(&sh, f)));
	}
	/* kvtier.h: the transfer figures are the CUDA backend's, 0 on the others */
	if (sh.h2d_kernel_launches || sh.h2d_dma_batches || sh.xfer_calibrated ||
	    sh.recall_device_ns || sh.xfer_gather_min_4k || sh.xfer_gather_min_16k ||
	    sh.xfer_gather_min_64k)
		fail_at(file, line,
			"host backend: transfer figures not 0 (kernel %llu, dma %llu, calibrated %u, "
			"gather_min %u/%u/%u)",
			ULL(sh.h2d_kernel_launches), ULL(sh.h2d_dma_batches), sh.xfer_calibrated,
			sh.xfer_gather_min_4k, sh.xfer_gather_min_16k, sh.xfer_gather_min_64k);
}

/* The calibration: measured at create, unless KVTIER_CUDA_CALIBRATE=0, and then (kvtier.h)
   "not measured: the kernel always", so no load ran as DMA. */
void check_xfer_at(const struct kvt_stats *st, const char *file, int line)
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

/* ---- main ---------------------------------------------------------------------------------- */

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backend_choice),
		cmocka_unit_test(test_vs_host_f32),
		cmocka_unit_test(test_vs_host_f16),
		cmocka_unit_test(test_vs_host_bf16),
		cmocka_unit_test(test_long_prompt),
		cmocka_unit_test(test_huge_prompt),
		cmocka_unit_test(test_nonblocking_stream),
		cmocka_unit_test(test_resume_burst),
		cmocka_unit_test(test_save_side_stream),
		cmocka_unit_test(test_tables_one_wait),
		cmocka_unit_test(test_tables_grow_across_streams),
		cmocka_unit_test(test_program_after_stream_reused),
		cmocka_unit_test(test_device_time_sample),
		cmocka_unit_test(test_fault_prefill),
		cmocka_unit_test(test_fault_decode),
		cmocka_unit_test(test_fault_recall),
		cmocka_unit_test(test_fault_recall_settle),
		cmocka_unit_test(test_fault_stage),
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
	/* every recall call's device time, which recall_both_at checks (test_device_time_sample
	   sets its own) */
	if (setenv("KVTIER_RECALL_TIME_EVERY", "1", 1)) {
		printf("# setenv: %s\n", strerror(errno));
		return 1;
	}
	g_seed = seed && *seed ? strtoull(seed, NULL, 0) : 0x6b76746965723031ull;
	printf("# seed 0x%llx (KVT_TEST_SEED)\n", ULL(g_seed));
	check_context = ctx_write;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
