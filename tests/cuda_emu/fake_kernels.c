/* SPDX-License-Identifier: MIT */
/*
 * CPU stand-ins for the CUDA backend plugin's kernels (transfer/cuda_gather.cu, cuda_calib.cu,
 * policy/snapkv.cu, recall.cu, attend.cu, quest.cu), linked into the emulated plugin in their
 * place. Each keeps its GPU version's contract (gather.h, policy/gpu.h): the same argument checks
 * and cudaError_t results, device pointers in, device pointers out. Each launch is checked as CUDA
 * checks it and handed to the fake runtime with a copy of its arguments (fake_cuda_launch); its
 * work, done when the runtime runs it (at once, or in the asynchronous fake when a wait needs it),
 * is the policy's CPU reference (policy.h) over the host views the fake runtime gives of device
 * memory: every range a kernel touches is bounds-checked against its allocation when it runs, and
 * the writes of one launch are checked not to overlap each other or its reads.
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

#include "attn_row.h"
#include "calib_kernels.h"
#include "fake_cudart.h"
#include "gather.h"
#include "gpu.h"
#include "policy.h"

#define SCRATCH_ALIGN 256 /* CUB's, which the GPU version's callers must honour */

/* A host view of a device-accessible range; addr may be a pointer or a uint64 address. */
#define VIEW(addr, n, what) fake_cuda_kernel_view((uint64_t)(uintptr_t)(addr), (n), (what))
#define RANGE(addr, n) ((struct fake_range){(uint64_t)(uintptr_t)(addr), (n)})

/* ---- transfer/calib_kernels.h ---------------------------------------------------------------- */

static void empty_work(void *a)
{
	(void)a;
}

int kvt_calib_empty_launch(void *stream)
{
	int unused = 0;

	return fake_cuda_launch(stream, "kvt_calib_empty_launch", empty_work, &unused,
				sizeof(unused), NULL, 0);
}

struct fill_args {
	uint64_t dst, n;
};

/* Writes nothing: only cuBLAS reads the values (the fake cuBLAS of calibrate's tests reads
   none), and the fill's range is what there is to check. */
static void fill_work(void *a)
{
	const struct fill_args *f = a;

	VIEW(f->dst, f->n * 2, "kvt_calib_fill_launch: destination");
}

int kvt_calib_fill_launch(void *dst, uint64_t n, uint32_t seed, void *stream)
{
	struct fill_args a = {(uint64_t)(uintptr_t)dst, n};

	(void)seed;
	if (n == 0)
		return cudaSuccess;
	return fake_cuda_launch(stream, "kvt_calib_fill_launch", fill_work, &a, sizeof(a), NULL, 0);
}

/* ---- transfer/gather.h ----------------------------------------------------------------------- */

struct gather_args {
	const struct kvt_gpu_piece *pieces;
	uint32_t n;
};

static void gather_work(void *a)
{
	const struct gather_args *g = a;
	const struct kvt_gpu_piece *pc;
	struct fake_range *fr = malloc((2 * (size_t)g->n + 1) * sizeof(*fr));

	if (!fr)
		fake_cuda_die("gather: no memory for %u pieces", g->n);
	pc = VIEW(g->pieces, (size_t)g->n * sizeof(*pc), "gather: piece list");
	for (uint32_t i = 0; i < g->n; i++) {
		VIEW(pc[i].dst, pc[i].bytes, "gather: piece destination");
		VIEW(pc[i].src, pc[i].bytes, "gather: piece source");
		fr[i] = RANGE(pc[i].dst, pc[i].bytes);
		fr[(size_t)g->n + i] = RANGE(pc[i].src, pc[i].bytes);
	}
	fr[2 * (size_t)g->n] = RANGE(g->pieces, (size_t)g->n * sizeof(*pc));
	fake_cuda_check_footprint(fr, g->n, fr + g->n, (size_t)g->n + 1, "gather");
	for (uint32_t i = 0; i < g->n; i++)
		if (pc[i].bytes)
			memcpy(VIEW(pc[i].dst, pc[i].bytes, "gather: piece destination"),
			       VIEW(pc[i].src, pc[i].bytes, "gather: piece source"), pc[i].bytes);
	free(fr);
}

int kvt_gather_launch(const struct kvt_gpu_piece *pieces, uint32_t n, uint32_t ctas, void *stream)
{
	struct gather_args a = {pieces, n};
	const struct kvt_gpu_piece *pc;
	struct fake_range *rd = NULL;
	int err;

	(void)ctas;
	if (n == 0)
		return cudaSuccess;
	/* the sources, watched while the launch is queued: the piece list as it will be */
	pc = fake_cuda_peek((uint64_t)(uintptr_t)pieces, (size_t)n * sizeof(*pc));
	if (pc) {
		rd = malloc((size_t)n * sizeof(*rd));
		if (!rd)
			fake_cuda_die("gather: no memory for %u pieces", n);
		for (uint32_t i = 0; i < n; i++)
			rd[i] = RANGE(pc[i].src, pc[i].bytes);
	}
	err = fake_cuda_launch(stream, "kvt_gather_launch", gather_work, &a, sizeof(a), rd,
			       rd ? n : 0);
	free(rd);
	return err;
}

struct append_args {
	uint64_t k, v, head_stride, v_offset;
	const uint64_t *dev;
	uint32_t n, n_heads, row_bytes;
};

static void append_work(void *args)
{
	const struct append_args *a = args;
	size_t rows = (size_t)a->n * a->n_heads, half = rows * a->row_bytes;
	struct fake_range *fr = malloc((2 * rows + 3) * sizeof(*fr));
	const uint64_t *d;

	if (!fr)
		fake_cuda_die("append: no memory for %zu rows", rows);
	d = VIEW(a->dev, (size_t)a->n * sizeof(*d), "append: address list");
	VIEW(a->k, half, "append: K rows");
	VIEW(a->v, half, "append: V rows");
	for (size_t r = 0; r < rows; r++) {
		uint64_t dst = d[r / a->n_heads] + r % a->n_heads * a->head_stride;

		VIEW(dst, a->row_bytes, "append: K destination");
		VIEW(dst + a->v_offset, a->row_bytes, "append: V destination");
		fr[2 * r] = RANGE(dst, a->row_bytes);
		fr[2 * r + 1] = RANGE(dst + a->v_offset, a->row_bytes);
	}
	fr[2 * rows] = RANGE(a->k, half);
	fr[2 * rows + 1] = RANGE(a->v, half);
	fr[2 * rows + 2] = RANGE(a->dev, (size_t)a->n * sizeof(*d));
	fake_cuda_check_footprint(fr, 2 * rows, fr + 2 * rows, 3, "append");
	for (size_t r = 0; r < rows; r++) {
		uint64_t dst = d[r / a->n_heads] + r % a->n_heads * a->head_stride;

		memcpy(VIEW(dst, a->row_bytes, "append: K destination"),
		       VIEW(a->k + r * a->row_bytes, a->row_bytes, "append: K row"), a->row_bytes);
		memcpy(VIEW(dst + a->v_offset, a->row_bytes, "append: V destination"),
		       VIEW(a->v + r * a->row_bytes, a->row_bytes, "append: V row"), a->row_bytes);
	}
	free(fr);
}

int kvt_append_launch(uint64_t k, uint64_t v, uint32_t n, const uint64_t *dev, uint32_t n_heads,
		      uint32_t row_bytes, uint64_t head_stride, uint64_t v_offset, uint32_t ctas,
		      void *stream)
{
	struct append_args a = {k, v, head_stride, v_offset, dev, n, n_heads, row_bytes};

	(void)ctas;
	if ((size_t)n * n_heads == 0)
		return cudaSuccess;
	return fake_cuda_launch(stream, "kvt_append_launch", append_work, &a, sizeof(a), NULL, 0);
}

/* ---- policy/gpu.h: SnapKV -------------------------------------------------------------------- */

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

/* One SnapKV launch: selection (count > 0: out holds n_kv_heads x count positions) or the
   pooled scores (count == 0: out holds n_kv_heads x (L - L_obs) floats). */
struct sk_args {
	struct kvt_snapkv p;
	const void *k, *q;
	void *out, *scratch;
	size_t out_bytes;
	uint32_t count;
	const char *what;
};

static void sk_work(void *args)
{
	const struct sk_args *a = args;
	const struct kvt_snapkv *p = &a->p;
	size_t esz = kvt_dtype_size(p->dtype), need = kvt_gpu_snapkv_scratch_bytes(p);
	size_t k_bytes = (size_t)p->n_kv_heads * p->prompt_tokens * p->head_dim * esz;
	size_t q_bytes = (size_t)p->n_q_heads * p->obs_window * p->head_dim * esz;
	struct fake_range w[2] = {RANGE(a->out, a->out_bytes), RANGE(a->scratch, need)};
	struct fake_range r[2] = {RANGE(a->k, k_bytes), RANGE(a->q, q_bytes)};
	const void *k = VIEW(a->k, k_bytes, "snapkv: k"), *q = VIEW(a->q, q_bytes, "snapkv: q_obs");
	void *scratch = VIEW(a->scratch, need, "snapkv: scratch");
	void *out = VIEW(a->out, a->out_bytes, "snapkv: output");
	size_t n = p->prompt_tokens - p->obs_window;
	int err = 0;

	fake_cuda_check_footprint(w, 2, r, 2, a->what);
	if (a->count)
		err = kvt_snapkv_select(p, k, q, out, scratch);
	for (uint32_t h = 0; !a->count && h < p->n_kv_heads && !err; h++)
		err = kvt_snapkv_scores(p, h, k, q, (float *)out + h * n, scratch);
	if (err) /* the parameters were checked at the launch */
		fake_cuda_die("%s: the CPU reference failed (%d)", a->what, err);
}

/* The GPU version's argument checks, then the launch: a cudaError_t. */
static int sk_launch(const struct sk_args *a, size_t scratch_bytes, void *stream)
{
	if (!a->k || (!a->q && a->p.obs_window) || !a->out || !a->scratch ||
	    (uintptr_t)a->scratch % SCRATCH_ALIGN ||
	    scratch_bytes < kvt_gpu_snapkv_scratch_bytes(&a->p))
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, a->what, sk_work, a, sizeof(*a), NULL, 0);
}

int kvt_gpu_snapkv_select(const struct kvt_snapkv *p, const void *k, const void *q_obs,
			  int32_t *out, void *scratch, size_t scratch_bytes, void *stream)
{
	struct sk_args a = {.k = k,
			    .q = q_obs,
			    .out = out,
			    .scratch = scratch,
			    .what = "kvt_gpu_snapkv_select"};

	if (!sk_valid(p))
		return cudaErrorInvalidValue;
	a.p = *p;
	a.count = kvt_snapkv_count(p);
	if (a.count == 0)
		return cudaSuccess; /* nothing is read, as the reference */
	a.out_bytes = (size_t)p->n_kv_heads * a.count * sizeof(*out);
	return sk_launch(&a, scratch_bytes, stream);
}

int kvt_gpu_snapkv_scores(const struct kvt_snapkv *p, const void *k, const void *q_obs,
			  float *pooled, void *scratch, size_t scratch_bytes, void *stream)
{
	struct sk_args a = {.k = k,
			    .q = q_obs,
			    .out = pooled,
			    .scratch = scratch,
			    .what = "kvt_gpu_snapkv_scores"};

	if (!sk_valid(p))
		return cudaErrorInvalidValue;
	if (p->prompt_tokens <= p->obs_window)
		return cudaSuccess;
	a.p = *p;
	a.out_bytes = (size_t)p->n_kv_heads * (p->prompt_tokens - p->obs_window) * sizeof(*pooled);
	return sk_launch(&a, scratch_bytes, stream);
}

/* ---- policy/gpu.h: block metadata and attention ---------------------------------------------- */

struct meta_args {
	enum kvt_dtype dt;
	uint32_t head_dim, n_heads, L, block_tokens;
	const void *k;
	void *meta;
};

static void meta_work(void *args)
{
	const struct meta_args *a = args;
	size_t row = (size_t)a->head_dim * kvt_dtype_size(a->dt);
	size_t nb = ((size_t)a->L + a->block_tokens - 1) / a->block_tokens;
	size_t k_bytes = (size_t)a->n_heads * a->L * row, m_bytes = nb * a->n_heads * 2 * row;
	const char *hk = VIEW(a->k, k_bytes, "block metadata: k");
	char *hm = VIEW(a->meta, m_bytes, "block metadata: output");

	fake_cuda_check_footprint(&RANGE(a->meta, m_bytes), 1, &RANGE(a->k, k_bytes), 1,
				  "kvt_gpu_block_meta");
	for (size_t b = 0; b < nb; b++) {
		size_t lo = b * a->block_tokens;
		size_t hi = lo + a->block_tokens < a->L ? lo + a->block_tokens : a->L;

		for (size_t h = 0; h < a->n_heads; h++)
			kvt_meta_build(a->dt, a->head_dim, hm + (b * a->n_heads + h) * 2 * row,
				       hk + (h * a->L + lo) * row, row, (uint32_t)(hi - lo));
	}
}

int kvt_gpu_block_meta(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t L,
		       uint32_t block_tokens, const void *k, void *meta, void *stream)
{
	struct meta_args a = {dt, head_dim, n_heads, L, block_tokens, k, meta};
	int ok = kvt_gpu_block_meta_args(dt, head_dim, n_heads, L, block_tokens, k, meta);

	if (ok <= 0)
		return ok ? cudaErrorInvalidValue : cudaSuccess;
	return fake_cuda_launch(stream, "kvt_gpu_block_meta", meta_work, &a, sizeof(a), NULL, 0);
}

struct fold_args {
	enum kvt_dtype dt;
	uint32_t head_dim, n_heads, n;
	const void *k;
	const uint64_t *meta;
};

static void fold_work(void *args)
{
	const struct fold_args *a = args;
	size_t row = (size_t)a->head_dim * kvt_dtype_size(a->dt);
	size_t entry = (size_t)a->n_heads * 2 * row; /* a sequence's heads */
	size_t k_bytes = (size_t)a->n * a->n_heads * row, m_bytes = (size_t)a->n * sizeof(uint64_t);
	const uint64_t *at = VIEW(a->meta, m_bytes, "meta fold: entry addresses");
	const char *hk = VIEW(a->k, k_bytes, "meta fold: k");
	struct fake_range *fr = malloc(((size_t)a->n + 2) * sizeof(*fr));
	size_t nw = 0;

	if (!fr)
		fake_cuda_die("meta fold: no memory for %u sequences", a->n);
	for (uint32_t i = 0; i < a->n; i++) {
		if (!at[i])
			continue;
		VIEW(at[i] & ~(uint64_t)1, entry, "meta fold: entry");
		fr[nw++] = RANGE(at[i] & ~(uint64_t)1, entry);
	}
	fr[nw] = RANGE(a->k, k_bytes);
	fr[nw + 1] = RANGE(a->meta, m_bytes);
	fake_cuda_check_footprint(fr, nw, fr + nw, 2, "kvt_gpu_meta_fold");
	for (uint32_t i = 0; i < a->n; i++) {
		char *m;

		if (!at[i])
			continue;
		m = VIEW(at[i] & ~(uint64_t)1, entry, "meta fold: entry");
		for (uint32_t h = 0; h < a->n_heads; h++) {
			const char *x = hk + ((size_t)i * a->n_heads + h) * row;

			if (at[i] & 1)
				kvt_meta_init(a->dt, a->head_dim, m + h * 2 * row, x);
			else
				kvt_meta_add(a->dt, a->head_dim, m + h * 2 * row, x);
		}
	}
	free(fr);
}

int kvt_gpu_meta_fold(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t n,
		      const void *k, const uint64_t *meta, void *stream)
{
	struct fold_args a = {dt, head_dim, n_heads, n, k, meta};
	int ok = kvt_gpu_meta_fold_args(dt, head_dim, n_heads, n, k, meta);

	if (ok <= 0)
		return ok ? cudaErrorInvalidValue : cudaSuccess;
	return fake_cuda_launch(stream, "kvt_gpu_meta_fold", fold_work, &a, sizeof(a), NULL, 0);
}

struct attend_args {
	enum kvt_dtype dt;
	uint32_t head_dim, n_heads, g_count;
	const struct kvt_attend_rows *seg;
	const uint32_t *seg_off;
	const float *q;
	float *out;
};

static void attend_work(void *args)
{
	const struct attend_args *a = args;
	size_t esz = kvt_dtype_size(a->dt), qd = (size_t)a->g_count * a->head_dim;
	size_t q_bytes = a->n_heads * qd * sizeof(float);
	size_t off_bytes = ((size_t)a->n_heads + 1) * sizeof(*a->seg_off), n_seg;
	const uint32_t *off = VIEW(a->seg_off, off_bytes, "attention: segment offsets");
	const struct kvt_attend_rows *hs;
	struct kvt_attend_rows *loc;
	struct fake_range *rd;
	const float *hq;
	float *ho;

	for (uint32_t h = 0; h < a->n_heads; h++)
		if (off[h + 1] < off[h])
			fake_cuda_die("attention: segment offsets of head %u decrease (%u, %u)", h,
				      off[h], off[h + 1]);
	n_seg = off[a->n_heads];
	hs = VIEW(a->seg, n_seg * sizeof(*hs), "attention: segments");
	hq = VIEW(a->q, q_bytes, "attention: q");
	ho = VIEW(a->out, q_bytes, "attention: output");
	loc = calloc(n_seg ? n_seg : 1, sizeof(*loc));
	rd = malloc((2 * n_seg + 3) * sizeof(*rd));
	if (!loc || !rd)
		fake_cuda_die("attention: no memory for %zu segments", n_seg);
	/* the segments with host views of their rows, and every range the launch reads */
	for (size_t i = 0; i < n_seg; i++) {
		size_t kb = hs[i].n ? (hs[i].n - 1) * hs[i].k_stride + a->head_dim * esz : 0;
		size_t vb = hs[i].n ? (hs[i].n - 1) * hs[i].v_stride + a->head_dim * esz : 0;

		loc[i] = hs[i];
		loc[i].k = VIEW(hs[i].k, kb, "attention: segment keys");
		loc[i].v = VIEW(hs[i].v, vb, "attention: segment values");
		rd[2 * i] = RANGE(hs[i].k, kb);
		rd[2 * i + 1] = RANGE(hs[i].v, vb);
	}
	rd[2 * n_seg] = RANGE(a->seg, n_seg * sizeof(*hs));
	rd[2 * n_seg + 1] = RANGE(a->seg_off, off_bytes);
	rd[2 * n_seg + 2] = RANGE(a->q, q_bytes);
	fake_cuda_check_footprint(&RANGE(a->out, q_bytes), 1, rd, 2 * n_seg + 3, "kvt_gpu_attend");
	for (uint32_t h = 0; h < a->n_heads; h++)
		kvt_attend_rows(a->dt, a->head_dim, hq + h * qd, a->g_count, loc + off[h],
				off[h + 1] - off[h], ho + h * qd);
	free(loc);
	free(rd);
}

struct attend_batch_args {
	enum kvt_dtype dt;
	struct kvt_attn_desc d;
	const void *q;
	void *out;
	float *lse;
};

/* The batched attention's stand-in: kvt_attend_table per row over host views of the tables,
   the pool, q, out and lse (the scratch a GPU uses is not touched). */
static void attend_batch_work(void *args)
{
	const struct attend_batch_args *a = args;
	struct kvt_attn_desc h = a->d;
	uint64_t rows = (uint64_t)h.n * h.n_kv_heads, G = h.g_count, D = h.head_dim;
	size_t es = kvt_dtype_size(a->dt), qb = rows * G * D * es;
	size_t eb = rows * h.max_frames * 4, rb = rows * h.max_recall * 4;
	size_t pb = h.pool_blocks * h.block_bytes;
	struct fake_range rd[9], wr[2];
	char *hq, *ho;
	float *hl = NULL,
	      *scratch = malloc(kvt_attend_table_scratch((uint32_t)G, (uint32_t)D) * sizeof(float));

	if (!scratch)
		fake_cuda_die("batched attention: no memory for the scratch");
	h.n_tokens = VIEW(a->d.n_tokens, rows * 4, "batched attention: n_tokens");
	h.n_recall = VIEW(a->d.n_recall, rows * 4, "batched attention: n_recall");
	h.frames = VIEW(a->d.frames, eb, "batched attention: frames");
	h.recall = VIEW(a->d.recall, rb, "batched attention: recall");
	h.recall_tokens = VIEW(a->d.recall_tokens, rb, "batched attention: recall_tokens");
	h.recall_skip = VIEW(a->d.recall_skip, 2 * rb, "batched attention: recall_skip");
	h.pool = (uint64_t)(uintptr_t)VIEW(a->d.pool, pb, "batched attention: the pool");
	hq = VIEW(a->q, qb, "batched attention: q");
	ho = VIEW(a->out, qb, "batched attention: out");
	if (a->lse)
		hl = VIEW(a->lse, rows * G * sizeof(float), "batched attention: lse");
	if (a->d.n_batch)
		h.n_batch = VIEW(a->d.n_batch, 4, "batched attention: n_batch");
	rd[0] = RANGE(a->d.n_tokens, rows * 4);
	rd[1] = RANGE(a->d.n_recall, rows * 4);
	rd[2] = RANGE(a->d.frames, eb);
	rd[3] = RANGE(a->d.recall, rb);
	rd[4] = RANGE(a->d.recall_tokens, rb);
	rd[5] = RANGE(a->d.recall_skip, 2 * rb);
	rd[6] = RANGE(a->d.pool, pb);
	rd[7] = RANGE(a->q, qb);
	wr[0] = RANGE(a->out, qb);
	wr[1] = RANGE(a->lse, a->lse ? rows * G * sizeof(float) : 0);
	rd[8] = RANGE(a->d.n_batch, a->d.n_batch ? 4 : 0);
	fake_cuda_check_footprint(wr, a->lse ? 2 : 1, rd, 9, "kvt_gpu_attend_batch");
	for (uint64_t r = 0; r < rows; r++) {
		if (kvt_attn_padding(&h, (uint32_t)r))
			continue; /* a padding row: nothing written */
		/* every row's frames and recalled blocks lie in the pool, in the tables
		   kvt_attend_batch makes (the caller's, with n_batch, are read as clamped) */
		for (uint64_t f = 0; !h.n_batch && f * h.block_tokens < h.n_tokens[r]; f++)
			if (h.frames[r * h.max_frames + f] >= h.pool_blocks)
				fake_cuda_die(
					"batched attention: row %llu frame %llu past the pool",
					(unsigned long long)r, (unsigned long long)f);
		for (uint32_t j = 0; !h.n_batch && j < h.n_recall[r]; j++)
			if (h.recall[r * h.max_recall + j] >= h.pool_blocks)
				fake_cuda_die(
					"batched attention: row %llu recalled block %u past the "
					"pool",
					(unsigned long long)r, j);
		kvt_attend_table(a->dt, &h, (uint32_t)r, hq + r * G * D * es, ho + r * G * D * es,
				 hl ? hl + r * G : NULL, scratch);
	}
	free(scratch);
}

int kvt_gpu_attend_batch(enum kvt_dtype dt, struct kvt_attn_desc d, const void *q, void *out,
			 float *lse, float *scratch, uint32_t splits, void *stream)
{
	struct attend_batch_args a = {dt, d, q, out, lse};
	uint64_t rows = (uint64_t)d.n * d.n_kv_heads;

	if (!kvt_dtype_size(dt))
		return cudaErrorInvalidValue;
	if (rows == 0 || d.g_count == 0 || d.head_dim == 0)
		return cudaSuccess;
	if (!q || !out || !scratch || splits == 0 || splits > 64)
		return cudaErrorInvalidValue;
	/* the scratch a GPU would use must be device memory of the size the launch needs */
	(void)VIEW(scratch, kvt_gpu_attend_batch_scratch(rows, d.g_count, d.head_dim, splits),
		   "batched attention: scratch");
	return fake_cuda_launch(stream, "kvt_gpu_attend_batch", attend_batch_work, &a, sizeof(a),
				NULL, 0);
}

int kvt_gpu_attend(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t g_count,
		   const struct kvt_attend_rows *seg, const uint32_t *seg_off, const float *q,
		   float *out, void *stream)
{
	struct attend_args a = {dt, head_dim, n_heads, g_count, seg, seg_off, q, out};
	uint64_t ctas = (uint64_t)n_heads * g_count;

	if (!kvt_dtype_size(dt))
		return cudaErrorInvalidValue;
	if (ctas == 0 || head_dim == 0)
		return cudaSuccess; /* out has no element */
	if (ctas > INT32_MAX || !seg_off || !q || !out)
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_attend", attend_work, &a, sizeof(a), NULL, 0);
}

/* ---- policy/gpu.h: Quest selection ----------------------------------------------------------- */

struct quest_args {
	enum kvt_dtype dt;
	uint32_t head_dim, n_heads, g_count, lbt, r, n;
	const struct kvt_gpu_quest *qs;
	const void *q;
	uint32_t *sel;
};

/* Entry e's blocks, and the bytes of its metadata and key table. */
static uint32_t quest_bytes(const struct quest_args *a, const struct kvt_gpu_quest *e, size_t *meta,
			    size_t *key)
{
	size_t row = (size_t)a->head_dim * kvt_dtype_size(a->dt);
	size_t nb = (size_t)(((uint64_t)e->n_tokens + (1u << a->lbt) - 1) >> a->lbt);

	*meta = nb * a->n_heads * 2 * row;
	*key = nb * a->n_heads * sizeof(struct kvt_region_key);
	return (uint32_t)nb;
}

/* An entry without tokens reads neither its metadata nor its key table (they may be NULL): its
   views are empty, and its selection is KVT_REGION_NONE throughout, as the kernel's. */
static void quest_work(void *args)
{
	const struct quest_args *a = args;
	size_t qb = (size_t)a->n_heads * a->g_count * a->head_dim * kvt_dtype_size(a->dt);
	size_t sb = (size_t)a->n_heads * a->r * sizeof(uint32_t), mb, kb;
	const struct kvt_gpu_quest *qs =
		VIEW(a->qs, (size_t)a->n * sizeof(*qs), "quest: descriptors");
	const char *q = VIEW(a->q, a->n * qb, "quest: queries");
	uint32_t *sel = VIEW(a->sel, a->n * sb, "quest: selection");
	struct fake_range *rd = malloc((2 * (size_t)a->n + 2) * sizeof(*rd));

	if (!rd)
		fake_cuda_die("quest: no memory for %u entries", a->n);
	/* reads: each entry's metadata and key table, the queries and the descriptors; writes:
	   the selection */
	for (uint32_t i = 0; i < a->n; i++) {
		quest_bytes(a, &qs[i], &mb, &kb);
		VIEW(qs[i].meta, mb, "quest: metadata");
		VIEW(qs[i].key, kb, "quest: key table");
		rd[2 * i] = RANGE(qs[i].meta, mb);
		rd[2 * i + 1] = RANGE(qs[i].key, kb);
	}
	rd[2 * (size_t)a->n] = RANGE(a->q, a->n * qb);
	rd[2 * (size_t)a->n + 1] = RANGE(a->qs, (size_t)a->n * sizeof(*qs));
	fake_cuda_check_footprint(&RANGE(a->sel, a->n * sb), 1, rd, 2 * (size_t)a->n + 2,
				  "kvt_gpu_quest_select");
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kvt_gpu_quest *e = &qs[i];
		struct kvt_region_geom g = {a->n_heads, a->lbt, e->n_tokens, e->sink, e->ring0};
		struct kvt_region rg = {0};
		uint32_t nb = quest_bytes(a, e, &mb, &kb);
		const void *meta = VIEW(e->meta, mb, "quest: metadata");
		float *score = malloc(((size_t)nb + 1) * sizeof(*score));
		uint32_t *cand = malloc(((size_t)nb + a->r) * sizeof(*cand));
		float *qf = malloc(((size_t)a->g_count + 2) * a->head_dim * sizeof(*qf));

		if (!score || !cand || !qf)
			fake_cuda_die("quest: no memory for the scratch of %u blocks", nb);
		rg.key = VIEW(e->key, kb, "quest: key table");
		rg.cap_blocks = nb;
		kvt_quest_select(a->dt, a->head_dim, a->g_count, &rg, &g, meta, q + i * qb, a->r,
				 sel + (size_t)i * a->n_heads * a->r, score, cand, qf);
		free(qf);
		free(cand);
		free(score);
	}
	free(rd);
}

int kvt_gpu_quest_select(enum kvt_dtype dt, uint32_t head_dim, uint32_t n_heads, uint32_t g_count,
			 uint32_t lbt, uint32_t r, const struct kvt_gpu_quest *qs, const void *q,
			 uint32_t *sel, uint32_t n, void *stream)
{
	struct quest_args a = {dt, head_dim, n_heads, g_count, lbt, r, n, qs, q, sel};

	if (n == 0)
		return cudaSuccess;
	if (!qs || !q || !sel || head_dim == 0 || g_count == 0 || n_heads == 0 || lbt >= 32 ||
	    r == 0 || r > KVT_GPU_QUEST_MAX_R ||
	    (uint64_t)g_count * head_dim > KVT_GPU_QUEST_MAX_QDIM ||
	    (uint64_t)n * n_heads > INT32_MAX || !kvt_dtype_size(dt))
		return cudaErrorInvalidValue;
	return fake_cuda_launch(stream, "kvt_gpu_quest_select", quest_work, &a, sizeof(a), NULL, 0);
}
