/* SPDX-License-Identifier: MIT */
/*
 * CPU stand-ins for the CUDA backend plugin's kernels (transfer/cuda_gather.cu, policy/snapkv.cu,
 * recall.cu, attend.cu), linked into the emulated plugin in their place. Each keeps its GPU
 * version's contract (gather.h, policy/gpu.h): the same argument checks and cudaError_t results,
 * device pointers in, device pointers out. The work is done now, on the calling thread, by the
 * policy's CPU references (policy.h), through the host views fake_cudart.c gives of device
 * memory; so every range a kernel touches is bounds-checked against its allocation, and the
 * writes of one launch are checked not to overlap each other or its reads.
 *
 * The SnapKV scratch is the CPU reference's own layout, rounded to 256 bytes, and the reference
 * works in the caller's device scratch itself: the backend's sizing and placement of it (io_reserve
 * and the output behind it) are exercised as on a GPU.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fake_cudart.h"
#include "gather.h"
#include "gpu.h"
#include "policy.h"

#define SCRATCH_ALIGN 256 /* CUB's, which the GPU version's callers must honour */

/* A host view of a device-accessible range; addr may be a pointer or a uint64 address. */
#define VIEW(addr, n, what) fake_cuda_kernel_view((uint64_t)(uintptr_t)(addr), (n), (what))
#define RANGE(addr, n) ((struct fake_range){(uint64_t)(uintptr_t)(addr), (n)})

/* ---- transfer/gather.h ---------------------------------------------------------------------- */

int kvt_gather_launch(const struct kvt_gpu_piece *pieces, uint32_t n, uint32_t ctas, void *stream)
{
	const struct kvt_gpu_piece *pc;
	struct fake_range *fr;
	int err;

	(void)ctas;
	if (n == 0)
		return cudaSuccess;
	err = fake_cuda_launch_begin(stream, "kvt_gather_launch");
	if (err)
		return err;
	fr = malloc((2 * (size_t)n + 1) * sizeof(*fr));
	if (!fr)
		return cudaErrorMemoryAllocation;
	pc = VIEW(pieces, (size_t)n * sizeof(*pc), "gather: piece list");
	for (uint32_t i = 0; i < n; i++) {
		VIEW(pc[i].dst, pc[i].bytes, "gather: piece destination");
		VIEW(pc[i].src, pc[i].bytes, "gather: piece source");
		fr[i] = RANGE(pc[i].dst, pc[i].bytes);
		fr[(size_t)n + i] = RANGE(pc[i].src, pc[i].bytes);
	}
	fr[2 * (size_t)n] = RANGE(pieces, (size_t)n * sizeof(*pc));
	fake_cuda_check_footprint(fr, n, fr + n, (size_t)n + 1, "gather");
	for (uint32_t i = 0; i < n; i++)
		if (pc[i].bytes)
			memcpy(VIEW(pc[i].dst, pc[i].bytes, "gather: piece destination"),
			       VIEW(pc[i].src, pc[i].bytes, "gather: piece source"), pc[i].bytes);
	free(fr);
	fake_cuda_launch_end(stream);
	return cudaSuccess;
}

int kvt_append_launch(uint64_t k, uint64_t v, uint32_t n, const uint64_t *dev, uint32_t n_heads,
		      uint32_t row_bytes, uint64_t head_stride, uint64_t v_offset, uint32_t ctas,
		      void *stream)
{
	size_t rows = (size_t)n * n_heads, half = rows * row_bytes;
	const uint64_t *d;
	struct fake_range *fr;
	int err;

	(void)ctas;
	if (rows == 0)
		return cudaSuccess;
	err = fake_cuda_launch_begin(stream, "kvt_append_launch");
	if (err)
		return err;
	fr = malloc((2 * rows + 3) * sizeof(*fr));
	if (!fr)
		return cudaErrorMemoryAllocation;
	d = VIEW(dev, (size_t)n * sizeof(*d), "append: address list");
	VIEW(k, half, "append: K rows");
	VIEW(v, half, "append: V rows");
	for (size_t r = 0; r < rows; r++) {
		uint64_t dst = d[r / n_heads] + r % n_heads * head_stride;

		VIEW(dst, row_bytes, "append: K destination");
		VIEW(dst + v_offset, row_bytes, "append: V destination");
		fr[2 * r] = RANGE(dst, row_bytes);
		fr[2 * r + 1] = RANGE(dst + v_offset, row_bytes);
	}
	fr[2 * rows] = RANGE(k, half);
	fr[2 * rows + 1] = RANGE(v, half);
	fr[2 * rows + 2] = RANGE(dev, (size_t)n * sizeof(*d));
	fake_cuda_check_footprint(fr, 2 * rows, fr + 2 * rows, 3, "append");
	for (size_t r = 0; r < rows; r++) {
		uint64_t dst = d[r / n_heads] + r % n_heads * head_stride;

		memcpy(VIEW(dst, row_bytes, "append: K destination"),
		       VIEW(k + r * row_bytes, row_bytes, "append: K row"), row_bytes);
		memcpy(VIEW(dst + v_offset, row_bytes, "append: V destination"),
		       VIEW(v + r * row_bytes, row_bytes, "append: V row"), row_bytes);
	}
	free(fr);
	fake_cuda_launch_end(stream);
	return cudaSuccess;
}

/* ---- policy/gpu.h: SnapKV ------------------------------------------------------------------- */

/* The GPU version's parameter checks: the reference's, and its own launch limits. */
static bool sk_valid(const struct kvt_snapkv *p)
{
	return kvt_snapkv_check(p) == 0 && p->n_kv_heads <= 65535 &&
	       (uint64_t)p->n_q_heads * p->obs_window <= INT32_MAX;
}

size_t kvt_gpu_snapkv_scratch_bytes(const struct kvt_snapkv *p)
{
	size_t b;

	if (!sk_valid(p))
		return 0;
	b = kvt_snapkv_scratch_bytes(p);
	if (b > SIZE_MAX - (SCRATCH_ALIGN - 1))
		return 0;
	return (b + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/* Host views of one SnapKV launch's inputs and scratch. */
struct sk_io {
	const void *k, *q;
	void *scratch;
};

/* The GPU version's argument checks, then the launch's views into *io and its footprint check:
   0 or a cudaError_t. out: the launch's output of out_bytes. */
static int sk_begin(const struct kvt_snapkv *p, const void *k, const void *q_obs, const void *out,
		    size_t out_bytes, void *scratch, size_t scratch_bytes, void *stream,
		    const char *what, struct sk_io *io)
{
	size_t esz = kvt_dtype_size(p->dtype), need = kvt_gpu_snapkv_scratch_bytes(p);
	size_t k_bytes = (size_t)p->n_kv_heads * p->prompt_tokens * p->head_dim * esz;
	size_t q_bytes = (size_t)p->n_q_heads * p->obs_window * p->head_dim * esz;
	struct fake_range w[2], r[2];
	int err;

	if (!k || (!q_obs && p->obs_window) || !out || !scratch ||
	    (uintptr_t)scratch % SCRATCH_ALIGN || scratch_bytes < need)
		return cudaErrorInvalidValue;
	err = fake_cuda_launch_begin(stream, what);
	if (err)
		return err;
	io->k = VIEW(k, k_bytes, "snapkv: k");
	io->q = VIEW(q_obs, q_bytes, "snapkv: q_obs");
	io->scratch = VIEW(scratch, need, "snapkv: scratch");
	VIEW(out, out_bytes, "snapkv: output");
	w[0] = RANGE(out, out_bytes);
	w[1] = RANGE(scratch, need);
	r[0] = RANGE(k, k_bytes);
	r[1] = RANGE(q_obs, q_bytes);
	fake_cuda_check_footprint(w, 2, r, 2, what);
	return cudaSuccess;
}

int kvt_gpu_snapkv_select(const struct kvt_snapkv *p, const void *k, const void *q_obs,
			  int32_t *out, void *scratch, size_t scratch_bytes, void *stream)
{
	size_t out_bytes;
	struct sk_io io;
	uint32_t count;
	int err;

	if (!sk_valid(p))
		return cudaErrorInvalidValue;
	count = kvt_snapkv_count(p);
	if (count == 0)
		return cudaSuccess; /* nothing is read, as the reference */
	out_bytes = (size_t)p->n_kv_heads * count * sizeof(*out);
	err = sk_begin(p, k, q_obs, out, out_bytes, scratch, scratch_bytes, stream,
		       "kvt_gpu_snapkv_select", &io);
	if (err)
		return err;
	err = kvt_snapkv_select(p, io.k, io.q, VIEW(out, out_bytes, "snapkv: output"), io.scratch);
	fake_cuda_launch_end(stream);
	return err ? cudaErrorInvalidValue : cudaSuccess;
}

int kvt_gpu_snapkv_scores(const struct kvt_snapkv *p, const void *k, const void *q_obs,
			  float *pooled, void *scratch, size_t scratch_bytes, void *stream)
{
	size_t n, out_bytes;
	float *hp;
	struct sk_io io;
	int err = 0;

	if (!sk_valid(p))
		return cudaErrorInvalidValue;
	if (p->prompt_tokens <= p->obs_window)
		return cudaSuccess;
	n = p->prompt_tokens - p->obs_window;
	out_bytes = (size_t)p->n_kv_heads * n * sizeof(*pooled);
	err = sk_begin(p, k, q_obs, pooled, out_bytes, scratch, scratch_bytes, stream,
		       "kvt_gpu_snapkv_scores", &io);
	if (err)
		return err;
	hp = VIEW(pooled, out_bytes, "snapkv: pooled");
	for (uint32_t h = 0; h < p->n_kv_heads && !err; h++)
		err = kvt_snapkv_scores(p, h, io.k, io.q, hp + h * n, io.scratch);
	fake_cuda_launch_end(stream);
	return err ? cudaErrorInvalidValue : cudaSuccess;
}

/* ---- policy/gpu.h: block metadata and attention --------------------------------------------- */

int kvt_gpu_block_meta(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t L,
		       uint32_t block_tokens, const void *k, void *meta, void *stream)
{
	size_t esz = kvt_dtype_size(dt), nb, row, k_bytes, m_bytes;
	const char *hk;
	char *hm;
	int err;

	if (!esz || block_tokens == 0)
		return cudaErrorInvalidValue;
	if (L == 0 || n_heads == 0 || head_dim == 0)
		return cudaSuccess; /* no block: nothing to write */
	if (!k || !meta)
		return cudaErrorInvalidValue;
	nb = ((size_t)L + block_tokens - 1) / block_tokens;
	if (nb * n_heads > SIZE_MAX / 4 / head_dim)
		return cudaErrorInvalidValue;
	err = fake_cuda_launch_begin(stream, "kvt_gpu_block_meta");
	if (err)
		return err;
	row = (size_t)head_dim * esz;
	k_bytes = (size_t)n_heads * L * row;
	m_bytes = nb * n_heads * 2 * row;
	hk = VIEW(k, k_bytes, "block metadata: k");
	hm = VIEW(meta, m_bytes, "block metadata: output");
	fake_cuda_check_footprint(&RANGE(meta, m_bytes), 1, &RANGE(k, k_bytes), 1,
				  "kvt_gpu_block_meta");
	for (size_t b = 0; b < nb; b++) {
		size_t lo = b * block_tokens, hi = lo + block_tokens < L ? lo + block_tokens : L;

		for (size_t h = 0; h < n_heads; h++)
			kvt_meta_build(dt, head_dim, hm + (b * n_heads + h) * 2 * row,
				       hk + (h * L + lo) * row, row, (uint32_t)(hi - lo));
	}
	fake_cuda_launch_end(stream);
	return cudaSuccess;
}

int kvt_gpu_attend(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t g_count,
		   const struct kvt_attend_rows *seg, const uint32_t *seg_off, const float *q,
		   float *out, void *stream)
{
	size_t esz = kvt_dtype_size(dt), qd = (size_t)g_count * head_dim;
	size_t q_bytes = n_heads * qd * sizeof(float), off_bytes, n_seg;
	uint64_t ctas = (uint64_t)n_heads * g_count;
	struct kvt_attend_rows *loc = NULL;
	struct fake_range *rd = NULL;
	const struct kvt_attend_rows *hs;
	const uint32_t *off;
	const float *hq;
	float *ho;
	int err;

	if (!esz)
		return cudaErrorInvalidValue;
	if (ctas == 0 || head_dim == 0)
		return cudaSuccess; /* out has no element */
	if (ctas > INT32_MAX || !seg_off || !q || !out)
		return cudaErrorInvalidValue;
	err = fake_cuda_launch_begin(stream, "kvt_gpu_attend");
	if (err)
		return err;
	off_bytes = ((size_t)n_heads + 1) * sizeof(*off);
	off = VIEW(seg_off, off_bytes, "attention: segment offsets");
	for (uint32_t h = 0; h < n_heads; h++)
		if (off[h + 1] < off[h])
			fake_cuda_die("attention: segment offsets of head %u decrease (%u, %u)", h,
				      off[h], off[h + 1]);
	n_seg = off[n_heads];
	hs = VIEW(seg, n_seg * sizeof(*seg), "attention: segments");
	hq = VIEW(q, q_bytes, "attention: q");
	ho = VIEW(out, q_bytes, "attention: output");
	loc = calloc(n_seg ? n_seg : 1, sizeof(*loc));
	rd = malloc((2 * n_seg + 3) * sizeof(*rd));
	if (!loc || !rd) {
		err = cudaErrorMemoryAllocation;
		goto out;
	}
	/* the segments with host views of their rows, and every range the launch reads */
	for (size_t i = 0; i < n_seg; i++) {
		size_t kb = hs[i].n ? (hs[i].n - 1) * hs[i].k_stride + head_dim * esz : 0;
		size_t vb = hs[i].n ? (hs[i].n - 1) * hs[i].v_stride + head_dim * esz : 0;

		loc[i] = hs[i];
		loc[i].k = VIEW(hs[i].k, kb, "attention: segment keys");
		loc[i].v = VIEW(hs[i].v, vb, "attention: segment values");
		rd[2 * i] = RANGE(hs[i].k, kb);
		rd[2 * i + 1] = RANGE(hs[i].v, vb);
	}
	rd[2 * n_seg] = RANGE(seg, n_seg * sizeof(*seg));
	rd[2 * n_seg + 1] = RANGE(seg_off, off_bytes);
	rd[2 * n_seg + 2] = RANGE(q, q_bytes);
	fake_cuda_check_footprint(&RANGE(out, q_bytes), 1, rd, 2 * n_seg + 3, "kvt_gpu_attend");
	for (uint32_t h = 0; h < n_heads; h++)
		kvt_attend_rows(dt, head_dim, hq + h * qd, g_count, loc + off[h],
				off[h + 1] - off[h], ho + h * qd);
	fake_cuda_launch_end(stream);
out:
	free(loc);
	free(rd);
	return err;
}
