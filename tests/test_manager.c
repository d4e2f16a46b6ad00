/* SPDX-License-Identifier: MIT */
/*
 * manager: the public data path on the host backend. Every check is against an expectation
 * computed here, not by the library: token data comes from the generator in lib/t_data.h (any row
 * can be regenerated), resident positions from docs/design.md's rule (sink, top-K, last `recent`),
 * the top-K set from kvt_snapkv_select run on the very tensors handed to prefill (and, once,
 * from hand-made tensors whose answer is known), attention from a double-precision loop over
 * the resident positions, and frame/block counts from the geometry.
 */
#include "test_manager.h"

void tseq_init(struct tseq *t, uint64_t id, uint32_t L)
{
	memset(t, 0, sizeof(*t));
	t->id = id;
	t->L = L;
}

void tseq_fini(struct tseq *t)
{
	for (int l = 0; l < MAX_LAYERS; l++) {
		free(t->topk[l]);
		t->topk[l] = NULL;
		t->n[l] = 0;
	}
}

/* Prefills (seq, layer) with the generator's tensors. When topk is non-NULL it receives
   kvt_snapkv_select's choice on those very tensors ([n_kv_heads][count]). The tensors are
   overwritten right after the call, so a library that kept reading them would be caught. */
int prefill_raw(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t layer,
		uint32_t L, int32_t *topk, bool null_q)
{
	size_t rb = t_rowb(c), kv_bytes = (size_t)c->n_kv_heads * L * rb;
	size_t q_bytes = (size_t)c->n_q_heads * c->obs_window * rb;
	void *k = t_xmalloc(kv_bytes), *v = t_xmalloc(kv_bytes), *q = t_xmalloc(q_bytes);
	struct kvt_snapkv sp = t_snapkv_of(c, L);
	uint32_t count = kvt_snapkv_count(&sp);
	int rc;

	t_fill_prefill(c, seq, layer, L, k, v, q);
	if (topk && count) {
		void *scratch = t_xmalloc(kvt_snapkv_scratch_bytes(&sp));

		CHECK_RC(kvt_snapkv_select(&sp, k, q, topk, scratch), 0);
		free(scratch);
	}
	rc = t_prefill_layer(m, seq, layer, k, v, null_q ? NULL : q, NULL);
	memset(k, 0x5a, kv_bytes);
	memset(v, 0xa5, kv_bytes);
	memset(q, 0x3c, q_bytes);
	free(k);
	free(v);
	free(q);
	return rc;
}

/* Checks the structural promises of a top-K set: count, range, strictly ascending. */
static void check_topk_shape(const struct kvt_config *c, uint32_t L, const int32_t *t,
			     uint32_t count)
{
	int64_t hi = (int64_t)L - c->recent_tokens;

	if ((int64_t)L - (int64_t)c->obs_window < hi)
		hi = (int64_t)L - (int64_t)c->obs_window;
	for (uint32_t i = 0; i < count; i++) {
		if (t[i] < (int32_t)c->sink_tokens || t[i] >= hi)
			fail_at(__FILE__, __LINE__, "L=%u: top-K position %d outside [%u, %lld)", L,
				t[i], c->sink_tokens, (long long)hi);
		if (i && t[i] <= t[i - 1])
			fail_at(__FILE__, __LINE__, "L=%u: top-K not ascending at %u", L, i);
	}
}

/* Prefills one layer of a tracked sequence, which must succeed. */
void tseq_prefill(struct kvt_manager *m, const struct kvt_config *c, struct tseq *t, uint32_t layer)
{
	struct kvt_snapkv sp = t_snapkv_of(c, t->L);
	uint32_t got = 0;

	assert_true(layer < MAX_LAYERS);
	t->count = kvt_snapkv_count(&sp);
	if (t->count != t_naive_count(c, t->L))
		fail_at(__FILE__, __LINE__, "kvt_snapkv_count(L=%u) = %u, the design rule gives %u",
			t->L, t->count, t_naive_count(c, t->L));
	t->topk[layer] = t_xmalloc((size_t)c->n_kv_heads * t->count * sizeof(int32_t));
	CHECK_RC(prefill_raw(m, c, t->id, layer, t->L, t->topk[layer], t->count == 0), 0);
	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		check_topk_shape(c, t->L, t->topk[layer] + (size_t)h * t->count, t->count);
	t->n[layer] = t->L;
	CHECK_RC(kvt_seq_tokens(m, t->id, layer, &got), 0);
	assert_int_equal(got, t->L);
}

void check_resident_at(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
		       uint32_t layer, const char *file, int line)
{
	size_t cap = (size_t)c->sink_tokens + c->recent_tokens + t->count + 8;
	int32_t *want = t_xmalloc(cap * sizeof(int32_t)), *got = t_xmalloc(cap * sizeof(int32_t));

	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t nw = t_expect_resident(
			c, t->n[layer], t->topk[layer] + (size_t)h * t->count, t->count, want);
		uint32_t ng = 0xdeadbeef;
		int rc = kvt_seq_resident_positions(m, t->id, layer, h, got, (uint32_t)cap, &ng);

		if (rc != 0)
			fail_at(file, line, "seq %llu layer %u head %u: resident positions: %d",
				(unsigned long long)t->id, layer, h, rc);
		if (ng != nw)
			fail_at(file, line,
				"seq %llu layer %u head %u (L=%u, N=%u): %u resident, expected %u",
				(unsigned long long)t->id, layer, h, t->L, t->n[layer], ng, nw);
		for (uint32_t i = 0; i < nw; i++)
			if (got[i] != want[i])
				fail_at(file, line,
					"seq %llu layer %u head %u (L=%u, N=%u): resident[%u] = %d, "
					"expected %d",
					(unsigned long long)t->id, layer, h, t->L, t->n[layer], i,
					got[i], want[i]);
	}
	free(want);
	free(got);
}

/* Reads back every token of (seq, layer), every head, through both kvt_seq_read_token and the
   host-history-only read, and compares bit-exactly with the generator. */
void check_readback_at(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
		       uint32_t layer, const char *file, int line)
{
	size_t rb = t_rowb(c);
	uint8_t *wk = t_xmalloc(rb), *wv = t_xmalloc(rb), *gk = t_xmalloc(rb), *gv = t_xmalloc(rb);
	int32_t *res = t_xmalloc(((size_t)c->sink_tokens + c->recent_tokens + t->count + 1) *
				 sizeof(int32_t));
	uint32_t N = t->n[layer];
	uint64_t resident = 0, read0 = t_stats_of(m).bytes_read;

	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		resident += t_expect_resident(c, N, t->topk[layer] + (size_t)h * t->count, t->count,
					      res);
	for (uint32_t h = 0; h < c->n_kv_heads; h++)
		for (uint32_t p = 0; p < N; p++) {
			t_fill_row(c->dtype, c->head_dim, wk, t->id, layer, h, p, 0);
			t_fill_row(c->dtype, c->head_dim, wv, t->id, layer, h, p, 1);
			for (int tier = 0; tier < 2; tier++) {
				int rc = tier ? kvt_seq_read_token_host(m, t->id, layer, h, p, gk,
									gv)
					      : kvt_seq_read_token(m, t->id, layer, h, p, gk, gv);

				if (rc)
					fail_at(file, line,
						"%s(seq %llu, layer %u, head %u, pos %u) = %d",
						tier ? "read_token_host" : "read_token",
						(unsigned long long)t->id, layer, h, p, rc);
				if (memcmp(gk, wk, rb) || memcmp(gv, wv, rb))
					fail_at(file, line,
						"%s: seq %llu layer %u head %u pos %u (L=%u, N=%u): %s "
						"row differs",
						tier ? "host history" : "read_token",
						(unsigned long long)t->id, layer, h, p, t->L, N,
						memcmp(gk, wk, rb) ? "K" : "V");
			}
		}
	/* bytes_read counts device reads: exactly the resident rows came from the device tier
	   (the host-history pass reads none) */
	if (t_stats_of(m).bytes_read - read0 != 2 * rb * resident)
		fail_at(file, line,
			"seq %llu layer %u: %llu bytes read from the device tier, expected %llu "
			"(%llu resident rows)",
			(unsigned long long)t->id, layer,
			(unsigned long long)(t_stats_of(m).bytes_read - read0),
			(unsigned long long)(2 * rb * resident), (unsigned long long)resident);
	/* one past the end is out of range */
	CHECK_RC(kvt_seq_read_token(m, t->id, layer, 0, N, gk, gv), -EINVAL);
	free(res);
	free(wk);
	free(wv);
	free(gk);
	free(gv);
}

/* Reads back only the resident positions (these come from device frames). */
void check_resident_rows(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
			 uint32_t layer)
{
	size_t rb = t_rowb(c), cap = (size_t)c->sink_tokens + c->recent_tokens + t->count + 8;
	uint8_t *wk = t_xmalloc(rb), *wv = t_xmalloc(rb), *gk = t_xmalloc(rb), *gv = t_xmalloc(rb);
	int32_t *pos = t_xmalloc(cap * sizeof(int32_t));
	uint32_t n = 0;

	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		CHECK_RC(kvt_seq_resident_positions(m, t->id, layer, h, pos, (uint32_t)cap, &n), 0);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t p = (uint32_t)pos[i];

			t_fill_row(c->dtype, c->head_dim, wk, t->id, layer, h, p, 0);
			t_fill_row(c->dtype, c->head_dim, wv, t->id, layer, h, p, 1);
			CHECK_RC(kvt_seq_read_token(m, t->id, layer, h, p, gk, gv), 0);
			if (memcmp(gk, wk, rb) || memcmp(gv, wv, rb))
				fail_at(__FILE__, __LINE__,
					"resident row: seq %llu layer %u head %u pos %u (N=%u) differs",
					(unsigned long long)t->id, layer, h, p, t->n[layer]);
		}
	}
	free(pos);
	free(wk);
	free(wv);
	free(gk);
	free(gv);
}

/* kvt_attend against a double-precision softmax over exactly the resident positions, with
   K and V taken from the generator (its values are exact in every dtype). */
void check_attend_at(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t,
		     uint32_t layer, uint64_t salt, const char *file, int line)
{
	uint32_t D = c->head_dim, G = c->n_q_heads / c->n_kv_heads;
	size_t cap = (size_t)c->sink_tokens + c->recent_tokens + t->count + 8;
	float *q = t_xmalloc((size_t)c->n_q_heads * D * sizeof(float));
	float *out = t_xmalloc((size_t)c->n_q_heads * D * sizeof(float));
	int32_t *pos = t_xmalloc(cap * sizeof(int32_t));
	double *logit = t_xmalloc(cap * sizeof(double)), *ref = t_xmalloc(D * sizeof(double));
	double scale = 1.0 / sqrt((double)D);

	for (size_t i = 0; i < (size_t)c->n_q_heads * D; i++)
		q[i] = (float)((int)(t_mix(salt * 7919 + i) % 512) - 256) / 128.0f;
	CHECK_RC(kvt_attend(m, t->id, layer, q, out), 0);
	for (uint32_t h = 0; h < c->n_kv_heads; h++) {
		uint32_t n = 0;

		CHECK_RC(kvt_seq_resident_positions(m, t->id, layer, h, pos, (uint32_t)cap, &n), 0);
		assert_true(n > 0);
		for (uint32_t g = h * G; g < h * G + G; g++) {
			const float *qg = q + (size_t)g * D;
			double mx = -INFINITY, sum = 0;

			for (uint32_t j = 0; j < n; j++) {
				double s = 0;

				for (uint32_t d = 0; d < D; d++)
					s += (double)qg[d] *
					     t_value(t->id, layer, h, (uint32_t)pos[j], d, 0);
				logit[j] = s * scale;
				if (logit[j] > mx)
					mx = logit[j];
			}
			memset(ref, 0, D * sizeof(double));
			for (uint32_t j = 0; j < n; j++) {
				double w = exp(logit[j] - mx);

				sum += w;
				for (uint32_t d = 0; d < D; d++)
					ref[d] += w *
						  t_value(t->id, layer, h, (uint32_t)pos[j], d, 1);
			}
			for (uint32_t d = 0; d < D; d++) {
				double r = ref[d] / sum, o = out[(size_t)g * D + d];

				if (!(fabs(o - r) <= 1e-5 * (1.0 + fabs(r))))
					fail_at(file, line,
						"attend: seq %llu layer %u (N=%u) q head %u dim %u: %.9g, "
						"naive %.9g",
						(unsigned long long)t->id, layer, t->n[layer], g, d,
						o, r);
			}
		}
	}
	free(q);
	free(out);
	free(pos);
	free(logit);
	free(ref);
}

/* Appends the next token of each listed sequence to `layer` (generator data); returns the
   call's result and, on success, advances the model. */
int decode_step(struct kvt_manager *m, const struct kvt_config *c, uint32_t layer, struct tseq **ts,
		uint32_t n)
{
	size_t bytes = (size_t)n * c->n_kv_heads * t_rowb(c);
	uint64_t *ids = t_xmalloc(n * sizeof(uint64_t));
	uint32_t *pos = t_xmalloc(n * sizeof(uint32_t));
	void *k = t_xmalloc(bytes), *v = t_xmalloc(bytes);
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = ts[i]->id;
		pos[i] = ts[i]->n[layer];
	}
	t_fill_decode(c, ids, pos, n, layer, k, v);
	rc = t_decode_append(m, layer, ids, n, k, v, NULL);
	memset(k, 0x77, bytes);
	memset(v, 0x88, bytes);
	if (rc == 0)
		for (uint32_t i = 0; i < n; i++)
			ts[i]->n[layer]++;
	free(ids);
	free(pos);
	free(k);
	free(v);
	return rc;
}

void check_tokens(struct kvt_manager *m, const struct kvt_config *c, const struct tseq *t)
{
	for (uint32_t l = 0; l < c->n_layers; l++) {
		uint32_t n = 0xdeadbeef;

		CHECK_RC(kvt_seq_tokens(m, t->id, l, &n), 0);
		if (n != t->n[l])
			fail_at(__FILE__, __LINE__, "seq %llu layer %u: %u tokens, expected %u",
				(unsigned long long)t->id, l, n, t->n[l]);
	}
}

/* Frames and blocks the model says are in use. */
void check_usage(struct kvt_manager *m, const struct kvt_config *c, struct tseq *ts, uint32_t n)
{
	struct kvt_stats st = t_stats_of(m);
	uint64_t frames = 0, blocks = 0;

	for (uint32_t i = 0; i < n; i++)
		for (uint32_t l = 0; l < c->n_layers; l++) {
			if (!ts[i].n[l])
				continue;
			frames += (uint64_t)c->n_kv_heads * t_frames_per_head(c, ts[i].L);
			blocks += (uint64_t)c->n_kv_heads * DIV_UP(ts[i].n[l], c->block_tokens);
		}
	assert_int_equal(st.device_frames_used, frames);
	assert_int_equal(st.host_blocks_used, blocks);
	assert_int_equal(st.device_frames_used + st.device_frames_free, st.device_frames_total);
	assert_int_equal(st.host_blocks_used + st.host_blocks_free, st.host_blocks_total);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_and_geometry),
		cmocka_unit_test(test_stats_counters),
		cmocka_unit_test(test_layout_small_config),
		cmocka_unit_test(test_layout_other_windows),
		cmocka_unit_test(test_topk_known),
		cmocka_unit_test(test_resident_enospc),
		cmocka_unit_test(test_ring_wrap_long),
		cmocka_unit_test(test_dtypes_groups_windows),
		cmocka_unit_test(test_save_threads_staging),
		cmocka_unit_test(test_save_visibility),
		cmocka_unit_test(test_batched_interleaved),
		cmocka_unit_test(test_device_capacity),
		cmocka_unit_test(test_host_capacity_prefill),
		cmocka_unit_test(test_host_capacity_decode),
		cmocka_unit_test(test_sync_tokens_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
