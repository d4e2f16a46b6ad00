/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend fixture (t_backend.h): managers the tests ask for on the host backend are
 * created on the CUDA backend, tensors go to the device, frames are read through the runtime.
 * Built against the CUDA runtime's headers; the binary links the real runtime (suite gpu) or
 * tests/cuda_emu's fake. Linking it makes the binary exit 77 (skipped) where no CUDA backend is
 * usable.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "plugin.h"
#include "policy.h"
#include "t_backend.h"

/* Stops the test where the runtime refused what it needs (what: the step). */
static void cu_fatal(cudaError_t e, const char *what)
{
	if (e != cudaSuccess) {
		fprintf(stderr, "test: %s: %s\n", what, cudaGetErrorString(e));
		abort();
	}
}

/* A device copy of n bytes of host memory h, made in stream order on the call's stream (which
   frees it after the call: cu_drop); NULL or empty tensors pass as they are. */
static void *cu_in(const void *h, size_t n, void *stream)
{
	void *d = NULL;
	cudaError_t e;

	if (!h || !n)
		return (void *)h;
	e = cudaMallocAsync(&d, n, (cudaStream_t)stream);
	if (e == cudaSuccess) /* (from pageable memory: h may be reused when it returns) */
		e = cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, (cudaStream_t)stream);
	cu_fatal(e, "a device copy of a tensor");
	return d;
}

/* Frees a device copy once the work queued on stream before it (the call that reads it) is
   done, in stream order (cudaFreeAsync), without waiting: work the call left queued stays
   queued, as it would in an engine's loop (under the asynchronous fake, it runs only when a
   wait needs it). */
static void cu_drop(void *d, const void *h, void *stream)
{
	if (d && d != h)
		cu_fatal(cudaFreeAsync(d, (cudaStream_t)stream), "freeing a device copy");
}

/* Shapes come from the manager itself; where it cannot say (a NULL or destroyed manager, an
   unknown sequence, a manager on another backend) the tensors pass through unchanged, and the
   call fails on its own checks as it does on the host backend. */
static int cu_shape(struct kvt_manager *m, uint64_t seq, struct kvt_config *c,
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

static int cu_manager_create(const struct kvt_config *cfg, struct kvt_manager **out)
{
	struct kvt_config c;

	if (!cfg || cfg->backend != KVT_BACKEND_HOST)
		return kvt_manager_create(cfg, out);
	c = *cfg;
	c.backend = KVT_BACKEND_CUDA;
	return kvt_manager_create(&c, out);
}

static int cu_prefill_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer, const void *k,
			    const void *v, const void *q_obs, void *stream)
{
	struct kvt_config c;
	uint32_t L;
	size_t row, kv;
	void *dk, *dv, *dq;
	int rc;

	if (cu_shape(m, seq, &c, &L))
		return kvt_prefill_layer(m, seq, layer, k, v, q_obs, stream);
	row = (size_t)c.head_dim * kvt_dtype_size(c.dtype);
	kv = (size_t)c.n_kv_heads * L * row;
	dk = cu_in(k, kv, stream);
	dv = cu_in(v, kv, stream);
	dq = cu_in(q_obs, (size_t)c.n_q_heads * c.obs_window * row, stream);
	rc = kvt_prefill_layer(m, seq, layer, dk, dv, dq, stream);
	cu_drop(dk, k, stream);
	cu_drop(dv, v, stream);
	cu_drop(dq, q_obs, stream);
	return rc;
}

static int cu_decode_append(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
			    const void *k, const void *v, void *stream)
{
	struct kvt_config c;
	size_t bytes;
	void *dk, *dv;
	int rc;

	if (cu_shape(m, 0, &c, NULL))
		return kvt_decode_append(m, layer, seqs, n, k, v, stream);
	bytes = (size_t)n * c.n_kv_heads * c.head_dim * kvt_dtype_size(c.dtype);
	dk = cu_in(k, bytes, stream);
	dv = cu_in(v, bytes, stream);
	rc = kvt_decode_append(m, layer, seqs, n, dk, dv, stream);
	cu_drop(dk, k, stream);
	cu_drop(dv, v, stream);
	return rc;
}

static int cu_decode_recall(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
			    const void *q, void *stream)
{
	struct kvt_config c;
	void *dq;
	int rc;

	if (cu_shape(m, 0, &c, NULL))
		return kvt_decode_recall(m, layer, seqs, n, q, stream);
	dq = cu_in(q, (size_t)n * c.n_q_heads * c.head_dim * kvt_dtype_size(c.dtype), stream);
	rc = kvt_decode_recall(m, layer, seqs, n, dq, stream);
	cu_drop(dq, q, stream);
	return rc;
}

static int cu_step_append(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *k,
			  const void *v, void *stream)
{
	struct kvt_config c;
	size_t bytes;
	void *dk, *dv;
	int rc;

	if (cu_shape(m, 0, &c, NULL))
		return kvt_step_append(m, layer, k, v, stream);
	bytes = (size_t)n * c.n_kv_heads * c.head_dim * kvt_dtype_size(c.dtype);
	dk = cu_in(k, bytes, stream);
	dv = cu_in(v, bytes, stream);
	rc = kvt_step_append(m, layer, dk, dv, stream);
	cu_drop(dk, k, stream);
	cu_drop(dv, v, stream);
	return rc;
}

static int cu_step_recall(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
			  void *stream)
{
	struct kvt_config c;
	void *dq;
	int rc;

	if (cu_shape(m, 0, &c, NULL))
		return kvt_step_recall(m, layer, q, stream);
	dq = cu_in(q, (size_t)n * c.n_q_heads * c.head_dim * kvt_dtype_size(c.dtype), stream);
	rc = kvt_step_recall(m, layer, dq, stream);
	cu_drop(dq, q, stream);
	return rc;
}

static int cu_recall_device_blocks(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				   uint32_t n, const uint32_t *blocks, uint32_t r, void *stream)
{
	struct kvt_config c;
	void *db;
	int rc;

	if (cu_shape(m, 0, &c, NULL))
		return kvt_recall_device_blocks(m, layer, seqs, n, blocks, r, stream);
	db = cu_in(blocks, (size_t)n * c.n_kv_heads * r * sizeof(*blocks), stream);
	rc = kvt_recall_device_blocks(m, layer, seqs, n, db, r, stream);
	cu_drop(db, blocks, stream);
	return rc;
}

static int cu_step_recall_device_blocks(struct kvt_manager *m, uint32_t layer, uint32_t n,
					const uint32_t *blocks, uint32_t r, void *stream)
{
	struct kvt_config c;
	void *db;
	int rc;

	if (cu_shape(m, 0, &c, NULL))
		return kvt_step_recall_device_blocks(m, layer, blocks, r, stream);
	db = cu_in(blocks, (size_t)n * c.n_kv_heads * r * sizeof(*blocks), stream);
	rc = kvt_step_recall_device_blocks(m, layer, db, r, stream);
	cu_drop(db, blocks, stream);
	return rc;
}

static void cu_dev_read(void *dst, uint64_t addr, size_t n);

static int cu_prefill_chunk(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
			    uint32_t n, uint32_t kv_from, const void *k, const void *v,
			    const void *q_obs, void *stream)
{
	struct kvt_config c;
	size_t row, kv;
	void *dk, *dv, *dq;
	int rc;

	if (cu_shape(m, 0, &c, NULL) || kv_from > pos || n > UINT32_MAX - pos)
		return kvt_prefill_chunk(m, seq, layer, pos, n, kv_from, k, v, q_obs, stream);
	row = (size_t)c.head_dim * kvt_dtype_size(c.dtype);
	kv = (size_t)c.n_kv_heads * (pos + n - kv_from) * row;
	dk = cu_in(k, kv, stream);
	dv = cu_in(v, kv, stream);
	dq = cu_in(q_obs, (size_t)c.n_q_heads * c.obs_window * row, stream);
	rc = kvt_prefill_chunk(m, seq, layer, pos, n, kv_from, dk, dv, dq, stream);
	cu_drop(dk, k, stream);
	cu_drop(dv, v, stream);
	cu_drop(dq, q_obs, stream);
	return rc;
}

static int cu_load_kv(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos, uint32_t n,
		      void *k_out, void *v_out, void *stream)
{
	struct kvt_config c;
	size_t bytes;
	void *dk = NULL, *dv = NULL;
	int rc;

	if (cu_shape(m, 0, &c, NULL) || !k_out || !v_out || n == 0)
		return kvt_seq_load_kv(m, seq, layer, pos, n, k_out, v_out, stream);
	bytes = (size_t)c.n_kv_heads * n * c.head_dim * kvt_dtype_size(c.dtype);
	if (cudaMalloc(&dk, bytes) != cudaSuccess || cudaMalloc(&dv, bytes) != cudaSuccess) {
		fprintf(stderr, "test: device buffers of %zu bytes\n", bytes);
		abort();
	}
	rc = kvt_seq_load_kv(m, seq, layer, pos, n, dk, dv, stream);
	if (!rc) {
		cu_dev_read(k_out, (uint64_t)(uintptr_t)dk, bytes);
		cu_dev_read(v_out, (uint64_t)(uintptr_t)dv, bytes);
	}
	cudaFree(dk);
	cudaFree(dv);
	return rc;
}

static void cu_dev_read(void *dst, uint64_t addr, size_t n)
{
	cudaError_t e = cudaMemcpy(dst, (const void *)(uintptr_t)addr, n, cudaMemcpyDeviceToHost);

	if (e != cudaSuccess) {
		fprintf(stderr, "test: reading %zu device bytes at 0x%llx: %s\n", n,
			(unsigned long long)addr, cudaGetErrorString(e));
		abort();
	}
}

/* Device copies dv[k] of the k host buffers h[k] of n[k] bytes (NULL ones stay NULL). */
static void cu_ins(void *const *h, const size_t *n, void **dv, int k, void *stream)
{
	for (int i = 0; i < k; i++)
		dv[i] = cu_in(h[i], n[i], stream);
}

/* After a call that wrote the device copies of cu_ins on stream: reads each back into its
   host buffer, and frees it. */
static void cu_outs(void *const *h, const size_t *n, void *const *dv, int k, void *stream)
{
	if (cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess)
		abort();
	for (int i = 0; i < k; i++) {
		if (dv[i] != h[i])
			cu_dev_read(h[i], (uint64_t)(uintptr_t)dv[i], n[i]);
		cu_drop(dv[i], h[i], stream);
	}
}

/* Device copies of t's seven buffers (h[0..7) and n[0..7) get their host addresses and
   sizes, dv[0..7) the copies): t with the copies in place. */
static struct kvt_attn_tables cu_tables_in(const struct kvt_attn_tables *t, uint32_t H, void **h,
					   size_t *n, void **dv, void *stream)
{
	struct kvt_attn_tables d = *t;
	size_t rows = (size_t)t->max_batch * H;

	h[0] = t->n_batch, n[0] = 4;
	h[1] = t->n_tokens, n[1] = rows * 4;
	h[2] = t->frames, n[2] = rows * t->max_frames * 4;
	h[3] = t->n_recall, n[3] = rows * 4;
	h[4] = t->recall, n[4] = rows * t->max_recall * 4;
	h[5] = t->recall_tokens, n[5] = rows * t->max_recall * 4;
	h[6] = t->recall_skip, n[6] = rows * t->max_recall * 8;
	cu_ins(h, n, dv, 7, stream);
	d.n_batch = dv[0];
	d.n_tokens = dv[1];
	d.frames = dv[2];
	d.n_recall = dv[3];
	d.recall = dv[4];
	d.recall_tokens = dv[5];
	d.recall_skip = dv[6];
	return d;
}

/* kvt_step_tables over device copies of t's buffers (NULL ones stay NULL), read back after the
   call. */
static int cu_step_tables(struct kvt_manager *m, uint32_t layer, const struct kvt_attn_tables *t,
			  void *stream)
{
	struct kvt_config c;
	struct kvt_attn_tables d;
	size_t n[7];
	void *h[7], *dv[7];
	int rc;

	if (!t || t->size < sizeof(*t) || cu_shape(m, 0, &c, NULL))
		return kvt_step_tables(m, layer, t, stream);
	d = cu_tables_in(t, c.n_kv_heads, h, n, dv, stream);
	rc = kvt_step_tables(m, layer, &d, stream);
	cu_outs(h, n, dv, 7, stream);
	return rc;
}

/* kvt_step_paged over device copies of p's buffers, read back after the call. */
static int cu_step_paged(struct kvt_manager *m, uint32_t layer, const struct kvt_paged_tables *p,
			 void *stream)
{
	struct kvt_config c;
	struct kvt_paged_tables d;
	size_t rows, n[5];
	void *h[5], *dv[5];
	int rc;

	if (!p || p->size < sizeof(*p) || cu_shape(m, 0, &c, NULL))
		return kvt_step_paged(m, layer, p, stream);
	d = *p;
	rows = (size_t)p->max_batch * c.n_kv_heads;
	h[0] = p->indptr, n[0] = (rows + 1) * 4;
	h[1] = p->indices, n[1] = (size_t)p->max_pages * 4;
	h[2] = p->last_page_len, n[2] = rows * 4;
	h[3] = p->r_indptr, n[3] = (rows + 1) * 4;
	h[4] = p->r_indices, n[4] = (size_t)p->max_tokens * 4;
	cu_ins(h, n, dv, 5, stream);
	d.indptr = dv[0];
	d.indices = dv[1];
	d.last_page_len = dv[2];
	d.r_indptr = dv[3];
	d.r_indices = dv[4];
	rc = kvt_step_paged(m, layer, &d, stream);
	cu_outs(h, n, dv, 5, stream);
	return rc;
}

/* kvt_attend_batch (seqs non-NULL) or kvt_step_attend over device copies of the n members'
   q, out and lse (out and lse read back after the call, whatever it returned). */
static int cu_attend(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
		     const void *q, void *out, float *lse, void *stream)
{
	struct kvt_config c;
	size_t nb[3];
	void *h[3] = {(void *)(uintptr_t)q, out, lse}, *dv[3];
	int rc;

	if (cu_shape(m, 0, &c, NULL))
		return seqs ? kvt_attend_batch(m, layer, seqs, n, q, out, lse, stream)
			    : kvt_step_attend(m, layer, q, out, lse, stream);
	nb[0] = nb[1] = (size_t)n * c.n_q_heads * c.head_dim * kvt_dtype_size(c.dtype);
	nb[2] = (size_t)n * c.n_q_heads * sizeof(float);
	cu_ins(h, nb, dv, 3, stream);
	rc = seqs ? kvt_attend_batch(m, layer, seqs, n, dv[0], dv[1], dv[2], stream)
		  : kvt_step_attend(m, layer, dv[0], dv[1], dv[2], stream);
	cu_outs(h + 1, nb + 1, dv + 1, 2, stream); /* out and lse; q is only read */
	cu_drop(dv[0], q, stream);
	return rc;
}

static int cu_attend_batch(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
			   const void *q, void *out, float *lse, void *stream)
{
	if (!seqs) /* (the call's own refusal, not the step's) */
		return kvt_attend_batch(m, layer, seqs, n, q, out, lse, stream);
	return cu_attend(m, layer, seqs, n, q, out, lse, stream);
}

static int cu_step_attend(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
			  void *out, float *lse, void *stream)
{
	return cu_attend(m, layer, NULL, n, q, out, lse, stream);
}

/* kvt_attend_tables over device copies of t's buffers, q, out and lse (out and lse read back
   after the call, whatever it returned), with scratch_short bytes less scratch than asked. */
static int cu_attend_tables(struct kvt_manager *m, const struct kvt_attn_tables *t, const void *q,
			    void *out, float *lse, int64_t scratch_short, void *stream)
{
	struct kvt_config c;
	struct kvt_attn_tables d;
	size_t n[10];
	void *h[10], *dv[10], *scratch = NULL;
	uint64_t need = 0;
	int rc;

	if (!t || t->size < sizeof(*t) || !q || !out || cu_shape(m, 0, &c, NULL) ||
	    kvt_attend_tables_scratch(m, t, &need))
		return kvt_attend_tables(m, t, q, out, lse, NULL, 0, stream);
	d = cu_tables_in(t, c.n_kv_heads, h, n, dv, stream);
	h[7] = (void *)(uintptr_t)q;
	n[7] = n[8] = (size_t)t->max_batch * c.n_q_heads * c.head_dim * kvt_dtype_size(c.dtype);
	h[8] = out;
	h[9] = lse, n[9] = (size_t)t->max_batch * c.n_q_heads * sizeof(float);
	cu_ins(h + 7, n + 7, dv + 7, 3, stream);
	if ((int64_t)need > scratch_short &&
	    cudaMalloc(&scratch, (size_t)((int64_t)need - scratch_short)) != cudaSuccess)
		abort();
	rc = kvt_attend_tables(m, &d, dv[7], dv[8], dv[9], scratch,
			       (uint64_t)((int64_t)need - scratch_short), stream);
	cu_outs(h + 8, n + 8, dv + 8, 2, stream); /* out and lse; the rest is only read */
	for (int i = 0; i < 8; i++)
		cu_drop(dv[i], h[i], stream);
	if (scratch)
		cudaFree(scratch);
	return rc;
}

static void *cu_stream_new(void)
{
	cudaStream_t s = NULL;

	cu_fatal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "a stream");
	return s;
}

static void cu_stream_free(void *s)
{
	if (s)
		cu_fatal(cudaStreamDestroy((cudaStream_t)s), "a stream's end");
}

/* An event recorded on t, waited for on s, and given back (the wait keeps what it needs). */
static void cu_stream_after(void *s, void *t)
{
	cudaEvent_t e;

	if (s == t)
		return;
	cu_fatal(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "an event");
	cu_fatal(cudaEventRecord(e, (cudaStream_t)t), "an event's record");
	cu_fatal(cudaStreamWaitEvent((cudaStream_t)s, e, 0), "a stream's wait");
	cu_fatal(cudaEventDestroy(e), "an event's end");
}

const struct t_backend t_backend_cuda = {
	.name = "cuda",
	.kind = KVT_BACKEND_CUDA,
	.manager_create = cu_manager_create,
	.prefill_layer = cu_prefill_layer,
	.decode_append = cu_decode_append,
	.decode_recall = cu_decode_recall,
	.step_append = cu_step_append,
	.step_recall = cu_step_recall,
	.recall_device_blocks = cu_recall_device_blocks,
	.step_recall_device_blocks = cu_step_recall_device_blocks,
	.prefill_chunk = cu_prefill_chunk,
	.load_kv = cu_load_kv,
	.dev_read = cu_dev_read,
	.step_tables = cu_step_tables,
	.step_paged = cu_step_paged,
	.attend_batch = cu_attend_batch,
	.step_attend = cu_step_attend,
	.attend_tables = cu_attend_tables,
	.stream_new = cu_stream_new,
	.stream_free = cu_stream_free,
	.stream_after = cu_stream_after,
};

const struct t_backend *const t_be = &t_backend_cuda;

/* Skips the whole binary (exit 77) where the CUDA backend cannot run: no device, the plugin
   not found, or a device the plugin finds unusable. */
__attribute__((constructor)) static void cu_require(void)
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
