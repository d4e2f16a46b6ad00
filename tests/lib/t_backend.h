/* SPDX-License-Identifier: MIT */
/*
 * The backend under test. The suites that drive a manager with payload (manager, errors,
 * random, recall, sched, spill, fault) run twice: on the host backend (tests/meson.build's
 * `manager`, ...) and on the CUDA backend (`cuda-manager` on a GPU, `cuda-emu-manager` over the
 * fake runtime, `cuda-kemu-manager` over the kernel emulator). The test code is the same; what
 * differs is the backend fixture t_be that the binary is linked with:
 *
 *   - t_backend_host (t_backend_host.c, library kvt_test_host): plain calls, tensors and frames
 *     in host memory;
 *   - t_backend_cuda (t_backend_cuda.c, the kvt_test_cuda* libraries, linked with the real CUDA
 *     runtime or tests/cuda_emu's fake): a manager the test asks for on the host backend is
 *     created on the CUDA backend, the host tensors the tests build are copied to the device for
 *     the calls that take tensors in the backend's memory, and frames are read with cudaMemcpy.
 *     A binary linked with it exits 77 (skipped) where the CUDA backend cannot run.
 *
 * So a test creates its managers with t_manager_create (or t_mk) and passes tensors through
 * t_prefill_layer, t_decode_append, t_decode_recall, t_step_append, t_step_recall and the
 * device-selection recalls (t_recall_device_blocks, t_step_recall_device_blocks); it reads
 * frames (kvt_seq_frames, kvt_seq_recall_view addresses) with t_dev_read and names the backend its
 * managers report as t_be->kind. Calls that take no tensors go to kvtier's API directly. A
 * configuration that names another backend than host (model, an explicit CUDA one) or a call on a
 * manager that is NULL or not on the CUDA backend passes through unchanged, so it fails on its own
 * checks as it does on the host backend.
 */
#ifndef KVT_TEST_T_BACKEND_H
#define KVT_TEST_T_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

struct t_backend {
	const char *name;      /* "host", "cuda" */
	enum kvt_backend kind; /* what managers created through it run on */
	/* kvtier's calls of the same names, with the backend's handling of configurations and
	   tensors */
	int (*manager_create)(const struct kvt_config *cfg, struct kvt_manager **out);
	int (*prefill_layer)(struct kvt_manager *m, uint64_t seq, uint32_t layer, const void *k,
			     const void *v, const void *q_obs, void *stream);
	int (*decode_append)(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			     uint32_t n, const void *k, const void *v, void *stream);
	int (*decode_recall)(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
			     uint32_t n, const void *q, void *stream);
	int (*prefill_chunk)(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
			     uint32_t n, uint32_t kv_from, const void *k, const void *v,
			     const void *q_obs, void *stream);
	/* k_out, v_out: host memory here (the fixture reads the device's copy back) */
	int (*load_kv)(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
		       uint32_t n, void *k_out, void *v_out, void *stream);
	/* kvt_step_append and kvt_step_recall; n: the step's batch size (the tensors' rows) */
	int (*step_append)(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *k,
			   const void *v, void *stream);
	int (*step_recall)(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
			   void *stream);
	/* kvt_recall_device_blocks and kvt_step_recall_device_blocks (n: the step's batch size)
	   with the selection [n][n_kv_heads][r] in host memory here (on the CUDA backend the
	   fixture passes a device copy) */
	int (*recall_device_blocks)(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				    uint32_t n, const uint32_t *blocks, uint32_t r, void *stream);
	int (*step_recall_device_blocks)(struct kvt_manager *m, uint32_t layer, uint32_t n,
					 const uint32_t *blocks, uint32_t r, void *stream);
	/* Copies n bytes at device address addr (a frame, a recall-view frame) to host dst. */
	void (*dev_read)(void *dst, uint64_t addr, size_t n);
	/* kvt_step_tables into t's buffers, which are host memory here (on the CUDA backend the
	   fixture passes device buffers of t's capacities, filled with t's contents first, and
	   reads them back after the call, whatever it returned) */
	int (*step_tables)(struct kvt_manager *m, uint32_t layer, const struct kvt_attn_tables *t,
			   void *stream);
	/* kvt_step_paged into p's buffers (host memory here, as step_tables) */
	int (*step_paged)(struct kvt_manager *m, uint32_t layer, const struct kvt_paged_tables *p,
			  void *stream);
	/* kvt_attend_batch; q, out and lse in host memory here */
	int (*attend_batch)(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs, uint32_t n,
			    const void *q, void *out, float *lse, void *stream);
	/* kvt_step_attend; n: the step's batch size; q, out and lse in host memory here */
	int (*step_attend)(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
			   void *out, float *lse, void *stream);
	/* kvt_attend_tables over t (host buffers here, as step_tables, with t->max_batch
	   members' q, out and lse in host memory) with the scratch it asks for (on the CUDA
	   backend extra bytes of scratch: the fixture passes that many fewer) */
	int (*attend_tables)(struct kvt_manager *m, const struct kvt_attn_tables *t, const void *q,
			     void *out, float *lse, int64_t scratch_short, void *stream);
	/* Streams for the calls above, as an engine keeps several: a new one (on the CUDA
	   backend non-blocking, ordered with nothing but itself; NULL on the host backend,
	   whose calls finish before they return), its end, and an order: the work queued on s
	   after the call runs after the work queued on t before it (either NULL: the legacy
	   stream). */
	void *(*stream_new)(void);
	void (*stream_free)(void *s);
	void (*stream_after)(void *s, void *t);
};

extern const struct t_backend t_backend_host;
extern const struct t_backend t_backend_cuda;

/* The backend this binary runs its tests on: &t_backend_host or &t_backend_cuda, fixed by the
   kvt_test_* backend library it links (see above). */
extern const struct t_backend *const t_be;

static inline int t_manager_create(const struct kvt_config *cfg, struct kvt_manager **out)
{
	return t_be->manager_create(cfg, out);
}

static inline int t_prefill_layer(struct kvt_manager *m, uint64_t seq, uint32_t layer,
				  const void *k, const void *v, const void *q_obs, void *stream)
{
	return t_be->prefill_layer(m, seq, layer, k, v, q_obs, stream);
}

static inline int t_decode_append(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				  uint32_t n, const void *k, const void *v, void *stream)
{
	return t_be->decode_append(m, layer, seqs, n, k, v, stream);
}

static inline int t_step_append(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *k,
				const void *v, void *stream)
{
	return t_be->step_append(m, layer, n, k, v, stream);
}

static inline int t_step_recall(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
				void *stream)
{
	return t_be->step_recall(m, layer, n, q, stream);
}

static inline int t_recall_device_blocks(struct kvt_manager *m, uint32_t layer,
					 const uint64_t *seqs, uint32_t n, const uint32_t *blocks,
					 uint32_t r, void *stream)
{
	return t_be->recall_device_blocks(m, layer, seqs, n, blocks, r, stream);
}

static inline int t_step_recall_device_blocks(struct kvt_manager *m, uint32_t layer, uint32_t n,
					      const uint32_t *blocks, uint32_t r, void *stream)
{
	return t_be->step_recall_device_blocks(m, layer, n, blocks, r, stream);
}

static inline int t_decode_recall(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				  uint32_t n, const void *q, void *stream)
{
	return t_be->decode_recall(m, layer, seqs, n, q, stream);
}

static inline int t_prefill_chunk(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
				  uint32_t n, uint32_t kv_from, const void *k, const void *v,
				  const void *q_obs, void *stream)
{
	return t_be->prefill_chunk(m, seq, layer, pos, n, kv_from, k, v, q_obs, stream);
}

/* kvt_seq_load_kv into host memory k_out, v_out ([n_kv_heads][n][head_dim]). */
static inline int t_load_kv(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos,
			    uint32_t n, void *k_out, void *v_out, void *stream)
{
	return t_be->load_kv(m, seq, layer, pos, n, k_out, v_out, stream);
}

static inline int t_step_tables(struct kvt_manager *m, uint32_t layer,
				const struct kvt_attn_tables *t, void *stream)
{
	return t_be->step_tables(m, layer, t, stream);
}

static inline int t_step_paged(struct kvt_manager *m, uint32_t layer,
			       const struct kvt_paged_tables *p, void *stream)
{
	return t_be->step_paged(m, layer, p, stream);
}

static inline int t_attend_batch(struct kvt_manager *m, uint32_t layer, const uint64_t *seqs,
				 uint32_t n, const void *q, void *out, float *lse, void *stream)
{
	return t_be->attend_batch(m, layer, seqs, n, q, out, lse, stream);
}

static inline int t_step_attend(struct kvt_manager *m, uint32_t layer, uint32_t n, const void *q,
				void *out, float *lse, void *stream)
{
	return t_be->step_attend(m, layer, n, q, out, lse, stream);
}

static inline int t_attend_tables(struct kvt_manager *m, const struct kvt_attn_tables *t,
				  const void *q, void *out, float *lse, int64_t scratch_short,
				  void *stream)
{
	return t_be->attend_tables(m, t, q, out, lse, scratch_short, stream);
}

static inline void t_dev_read(void *dst, uint64_t addr, size_t n)
{
	t_be->dev_read(dst, addr, n);
}

/* What KVT_BACKEND_AUTO resolves to here: CUDA where the plugin loads and a device is usable
   (a GPU machine with the plugin built), else host. */
enum kvt_backend t_auto_backend(void);

#endif /* KVT_TEST_T_BACKEND_H */
