/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench calibrate's measurements (struct kvt_plugin.calibrate, transfer/calibrate.h):
 * the work the replay simulator's execution model times (sim/exec_model.h), run on this GPU.
 *
 * - Linear layers: one layer's QKV, O, gate+up and down GEMMs for M tokens, back to back.
 * - Decode attention: per (sequence, kv head), S = Q[G x d] K[C x d]^T and O = P[G x C] V[C x d]
 *   for the G query heads that share the kv head, as two strided-batched GEMMs over every
 *   (sequence, kv head). The softmax between them is not timed.
 * - Prefill attention: per query head, S = Q K^T [L x L] and O = P V, non-causal, head q reading
 *   the K and V of kv head q / G; S lives in device memory, so heads go in chunks of kv heads
 *   whose S fits the memory cap (and 8 GiB). Unfused (FlashAttention keeps S on chip): the
 *   figure is what cuBLAS reaches, a lower bound of what a fused kernel does.
 * - Copies: pinned host <-> device, the host's cost of one cudaMemcpyAsync call and of one
 *   kernel launch, and a device-to-device copy (the HBM traffic of KV writes).
 *
 * cuBLAS is opened with dlopen and its functions looked up by name, so the plugin loads and the
 * backend works where cuBLAS is not installed; its headers give the types alone. bf16 operands
 * and results, fp32 accumulation, the default algorithm; operands are filled with random
 * values first (calib_kernels.h). Row-major matrices are handed to column-major cuBLAS as their
 * transposes: Y[M x N] = X[M x K] W[K x N] is Y^T = W^T X^T, so W comes first.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "calib_kernels.h"
#include "cuda_be.h"

#define BF16 2			  /* bytes of an element */
#define ENQUEUES 1000		  /* calls per run of a host-time measurement */
#define CALL_BYTES (16u << 10)	  /* the copy whose call is timed */
#define S_CAP ((uint64_t)8 << 30) /* most bytes of prefill scores at once */
#define REPS_MAX 1000		  /* runs per point */
#define BUFS 6			  /* device buffers of one measurement */
#define TOKENS_MAX (1u << 24)	  /* largest list entries a request may hold */
#define PREFILL_MAX (1u << 20)
#define BATCH_MAX (1u << 16)
#define CONTEXT_MAX (1u << 22)
#define DIM_MAX (1u << 16)

/* cuBLAS as dlopen found it: the functions' types are those its header declares. */
struct blas {
	void *lib;
	__typeof__(cublasCreate_v2) *create;
	__typeof__(cublasDestroy_v2) *destroy;
	__typeof__(cublasSetStream_v2) *set_stream;
	__typeof__(cublasGemmEx) *gemm;
	__typeof__(cublasGemmStridedBatchedEx) *gemm_batched;
	__typeof__(cublasGetStatusString) *status_string; /* (optional) */
	cublasHandle_t h;
};

/* One run: the request, the result being filled, the stream, events and cuBLAS it times with,
   and the device buffers of the measurement under way. */
struct cal {
	const struct kvt_calib_request *rq;
	struct kvt_calib_result *r;
	char *err;
	size_t err_len;
	cudaStream_t st;
	cudaEvent_t ev[2];
	struct blas b;
	double *t; /* rq->reps times */
	void *buf[BUFS];
	uint64_t cap; /* device bytes a point may allocate */
};

static const float one = 1.0f, zero = 0.0f;

static int fail(struct cal *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records what failed in the caller's err; returns err. */
static int fail(struct cal *c, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, c->err_len, fmt, ap);
	va_end(ap);
	return err;
}

/* 0, or -ENOMEM (out of device or pinned memory) or -EIO with "what: CUDA's text" recorded. */
static int cu(struct cal *c, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	return fail(c, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, "%s: %s (%s)", what,
		    cudaGetErrorString(e), cudaGetErrorName(e));
}

/* 0, or -ENOMEM or -EIO with "what: cuBLAS's text" recorded. */
static int bl(struct cal *c, cublasStatus_t s, const char *what)
{
	if (s == CUBLAS_STATUS_SUCCESS)
		return 0;
	if (c->b.status_string)
		return fail(c, s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO, "%s: %s", what,
			    c->b.status_string(s));
	return fail(c, s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO, "%s: cuBLAS status %d",
		    what, (int)s);
}

/* The median of t[0..n) (sorts t). */
static double median(double *t, uint32_t n)
{
	qsort(t, n, sizeof(*t), kvt_cuda_cmp_double);
	return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* ---- cuBLAS ---------------------------------------------------------------------------------- */

/* Looks up each function by name: 0, or -ENODEV naming the one missing. */
static int blas_symbols(struct cal *c, const char *lib)
{
	static const struct {
		const char *name;
		size_t off;
		bool optional;
	} f[] = {
		{"cublasCreate_v2", offsetof(struct blas, create), false},
		{"cublasDestroy_v2", offsetof(struct blas, destroy), false},
		{"cublasSetStream_v2", offsetof(struct blas, set_stream), false},
		{"cublasGemmEx", offsetof(struct blas, gemm), false},
		{"cublasGemmStridedBatchedEx", offsetof(struct blas, gemm_batched), false},
		{"cublasGetStatusString", offsetof(struct blas, status_string), true},
	};

	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		void *sym = dlsym(c->b.lib, f[i].name);

		if (!sym && !f[i].optional)
			return fail(c, -ENODEV, "cuBLAS unusable: %s has no %s", lib, f[i].name);
		memcpy((char *)&c->b + f[i].off, &sym, sizeof(sym));
	}
	return 0;
}

/* Opens cuBLAS ($KVTIER_CUBLAS alone when set, else the sonames of CUDA 13 and 12, then the
   development link) and creates a handle on the run's stream. 0; -ENODEV when no cuBLAS can be
   loaded (every dlopen error recorded); -EIO or -ENOMEM when cuBLAS cannot start. */
static int blas_open(struct cal *c)
{
	static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
	const char *env = getenv("KVTIER_CUBLAS"), *lib = NULL;
	char tried[768] = "";
	size_t used = 0;
	int err;

	for (size_t i = 0; !c->b.lib && i < (env && *env ? 1 : sizeof(names) / sizeof(names[0]));
	     i++) {
		const char *e;

		lib = env && *env ? env : names[i];
		c->b.lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
		e = c->b.lib ? NULL : dlerror();
		if (e && used < sizeof(tried))
			used += (size_t)snprintf(tried + used, sizeof(tried) - used, "%s%s",
						 used ? "; " : "", e);
	}
	if (!c->b.lib)
		return fail(c, -ENODEV, "cuBLAS not found (%s)", tried);
	err = blas_symbols(c, lib);
	if (!err)
		err = bl(c, c->b.create(&c->b.h), "cublasCreate");
	if (!err)
		err = bl(c, c->b.set_stream(c->b.h, c->st), "cublasSetStream");
	return err;
}

static void blas_close(struct blas *b)
{
	if (b->h)
		(void)b->destroy(b->h);
	if (b->lib)
		dlclose(b->lib);
}

/* Row-major Y[m x n] = X[m x k] W[k x n] (see the top of the file). */
static int gemm(struct cal *c, const void *w, const void *x, void *y, uint32_t m, uint32_t n,
		uint32_t k, const char *what)
{
	return bl(c,
		  c->b.gemm(c->b.h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, w,
			    CUDA_R_16BF, (int)n, x, CUDA_R_16BF, (int)k, &zero, y, CUDA_R_16BF,
			    (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
		  what);
}

/* batch products of row-major matrices, each operand `stride` elements after the last:
   S[m x n] = Q[m x k] K[n x k]^T when kt, else O[m x n] = P[m x k] V[k x n]. */
static int gemm_batched(struct cal *c, bool kt, const void *q, long long q_stride, const void *k,
			long long k_stride, void *s, long long s_stride, uint32_t m, uint32_t n,
			uint32_t kk, uint32_t batch, const char *what)
{
	return bl(c,
		  c->b.gemm_batched(c->b.h, kt ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, (int)n,
				    (int)m, (int)kk, &one, k, CUDA_R_16BF, kt ? (int)kk : (int)n,
				    k_stride, q, CUDA_R_16BF, (int)kk, q_stride, &zero, s,
				    CUDA_R_16BF, (int)n, s_stride, (int)batch, CUBLAS_COMPUTE_32F,
				    CUBLAS_GEMM_DEFAULT),
		  what);
}

/* ---- Buffers and timing ---------------------------------------------------------------------- */

/* Device buffer i of n bf16 elements, filled with random values. */
static int dev_buf(struct cal *c, int i, uint64_t n, const char *what)
{
	int err = cu(c, cudaMalloc(&c->buf[i], n * BF16), what);

	if (!err)
		err = cu(c,
			 (cudaError_t)kvt_calib_fill_launch(c->buf[i], n, 0x6b767431u + i, c->st),
			 "kvt_calib_fill_launch");
	return err;
}

/* Frees the measurement's buffers once the stream is done with them. */
static void bufs_free(struct cal *c)
{
	(void)cudaStreamSynchronize(c->st);
	for (int i = 0; i < BUFS; i++) {
		if (c->buf[i])
			(void)cudaFree(c->buf[i]);
		c->buf[i] = NULL;
	}
}

/* Queues one run of a measurement's work on c->st. */
typedef int (*enqueue_fn)(struct cal *c, const void *arg);

/* The median seconds of rq->reps runs of fn after one warm-up, each between two events. */
static int time_gpu(struct cal *c, enqueue_fn fn, const void *arg, double *out)
{
	int err = fn(c, arg);
	float ms = 0;

	if (!err)
		err = cu(c, cudaStreamSynchronize(c->st), "cudaStreamSynchronize");
	for (uint32_t i = 0; !err && i < c->rq->reps; i++) {
		err = cu(c, cudaEventRecord(c->ev[0], c->st), "cudaEventRecord");
		if (!err)
			err = fn(c, arg);
		if (!err)
			err = cu(c, cudaEventRecord(c->ev[1], c->st), "cudaEventRecord");
		if (!err)
			err = cu(c, cudaEventSynchronize(c->ev[1]), "cudaEventSynchronize");
		if (!err)
			err = cu(c, cudaEventElapsedTime(&ms, c->ev[0], c->ev[1]),
				 "cudaEventElapsedTime");
		c->t[i] = 1e-3 * ms;
	}
	if (!err)
		*out = median(c->t, c->rq->reps);
	return err;
}

/* The median over rq->reps runs, after one warm-up, of the host's seconds per call of ENQUEUES
   calls of fn (the queued work waited for after the clock stops). */
static int time_host(struct cal *c, enqueue_fn fn, const void *arg, double *out)
{
	int err = 0;

	for (uint32_t i = 0; !err && i <= c->rq->reps; i++) {
		double t0 = kvt_cuda_now_s();

		for (uint32_t j = 0; !err && j < ENQUEUES; j++)
			err = fn(c, arg);
		if (i > 0)
			c->t[i - 1] = (kvt_cuda_now_s() - t0) / ENQUEUES;
		if (!err)
			err = cu(c, cudaStreamSynchronize(c->st), "cudaStreamSynchronize");
	}
	if (!err)
		*out = median(c->t, c->rq->reps);
	return err;
}

/* ---- Linear layers --------------------------------------------------------------------------- */

/* The four GEMMs of one layer: Y = X W_i, W_i [K_i x N_i], for M tokens. */
struct linear {
	uint32_t M, K[4], N[4];
};

/* buf[0..3]: the weights; buf[4]: X, buf[5]: Y, each large enough for every GEMM. */
static int enqueue_linear(struct cal *c, const void *arg)
{
	static const char *const what[4] = {"cublasGemmEx (QKV)", "cublasGemmEx (O)",
					    "cublasGemmEx (gate+up)", "cublasGemmEx (down)"};
	const struct linear *l = arg;
	int err = 0;

	for (int i = 0; !err && i < 4; i++)
		err = gemm(c, c->buf[i], c->buf[4], c->buf[5], l->M, l->N[i], l->K[i], what[i]);
	return err;
}

static int measure_linear(struct cal *c)
{
	const struct kvt_calib_request *rq = c->rq;
	uint64_t h = rq->hidden, I = rq->mlp_dim,
		 qkv = (uint64_t)(rq->n_q_heads + 2 * rq->n_kv_heads) * rq->head_dim;
	struct linear l = {.K = {(uint32_t)h, (uint32_t)h, (uint32_t)h, (uint32_t)I},
			   .N = {(uint32_t)qkv, (uint32_t)h, (uint32_t)(2 * I), (uint32_t)h}};
	uint64_t w = 0, in = h > I ? h : I, out = 0, M = 0;
	uint32_t n = 0;
	int err = 0;

	for (int i = 0; i < 4; i++) {
		w += (uint64_t)l.K[i] * l.N[i];
		out = l.N[i] > out ? l.N[i] : out;
	}
	/* the list ascends: the points that fit are a prefix, sized for its last */
	while (n < rq->n_tokens &&
	       (double)BF16 * ((double)w + (double)rq->tokens[n] * (double)(in + out)) <=
		       (double)c->cap)
		M = rq->tokens[n++];
	if (n == 0)
		return 0;
	err = dev_buf(c, 0, h * qkv, "cudaMalloc (W_qkv)");
	if (!err)
		err = dev_buf(c, 1, h * h, "cudaMalloc (W_o)");
	if (!err)
		err = dev_buf(c, 2, h * 2 * I, "cudaMalloc (W_gate_up)");
	if (!err)
		err = dev_buf(c, 3, I * h, "cudaMalloc (W_down)");
	if (!err)
		err = dev_buf(c, 4, M * in, "cudaMalloc (X)");
	if (!err)
		err = dev_buf(c, 5, M * out, "cudaMalloc (Y)");
	for (uint32_t i = 0; !err && i < n; i++) {
		l.M = rq->tokens[i];
		c->r->linear[i].x = l.M;
		err = time_gpu(c, enqueue_linear, &l, &c->r->linear[i].seconds);
		c->r->n_linear = err ? i : i + 1;
	}
	bufs_free(c);
	return err;
}

/* ---- Decode attention ------------------------------------------------------------------------ */

struct decode {
	uint32_t batches, G, C, d; /* batches: sequences x kv heads */
};

/* buf[0..4]: Q [batches][G][d], K and V [batches][C][d], S [batches][G][C], O like Q. */
static int enqueue_decode(struct cal *c, const void *arg)
{
	const struct decode *a = arg;
	long long qs = (long long)a->G * a->d, ks = (long long)a->C * a->d;
	long long ss = (long long)a->G * a->C;
	int err;

	err = gemm_batched(c, true, c->buf[0], qs, c->buf[1], ks, c->buf[3], ss, a->G, a->C, a->d,
			   a->batches, "cublasGemmStridedBatchedEx (decode S = Q K^T)");
	if (!err)
		err = gemm_batched(c, false, c->buf[3], ss, c->buf[2], ks, c->buf[4], qs, a->G,
				   a->d, a->C, a->batches,
				   "cublasGemmStridedBatchedEx (decode O = P V)");
	return err;
}

static int measure_decode(struct cal *c)
{
	const struct kvt_calib_request *rq = c->rq;
	int err = 0;

	for (uint32_t bi = 0; !err && bi < rq->n_batch; bi++) {
		for (uint32_t ci = 0; !err && ci < rq->n_context; ci++) {
			struct decode a = {.batches = rq->batch[bi] * rq->n_kv_heads,
					   .G = rq->n_q_heads / rq->n_kv_heads,
					   .C = rq->context[ci],
					   .d = rq->head_dim};
			uint64_t q = (uint64_t)a.batches * a.G * a.d;
			uint64_t kv = (uint64_t)a.batches * a.C * a.d;
			uint64_t s = (uint64_t)a.batches * a.G * a.C;
			struct kvt_calib_decode *o = &c->r->decode[c->r->n_decode];

			if ((double)BF16 * (2.0 * q + 2.0 * kv + s) > (double)c->cap)
				continue;
			err = dev_buf(c, 0, q, "cudaMalloc (decode Q)");
			if (!err)
				err = dev_buf(c, 1, kv, "cudaMalloc (decode K)");
			if (!err)
				err = dev_buf(c, 2, kv, "cudaMalloc (decode V)");
			if (!err)
				err = dev_buf(c, 3, s, "cudaMalloc (decode S)");
			if (!err)
				err = dev_buf(c, 4, q, "cudaMalloc (decode O)");
			if (!err)
				err = time_gpu(c, enqueue_decode, &a, &o->seconds);
			if (!err) {
				o->batch = rq->batch[bi];
				o->context = a.C;
				o->kv_bytes = 2.0 * BF16 * (double)kv;
				c->r->n_decode++;
			}
			bufs_free(c);
		}
	}
	return err;
}

/* ---- Prefill attention ----------------------------------------------------------------------- */

struct prefill {
	uint32_t L, G, d, n_kv, chunk; /* chunk: kv heads whose scores are in memory at once */
};

/* buf[0..4]: Q [n_q][L][d], K and V [n_kv][L][d], S [chunk][G][L][L], O like Q. Query head
   kv * G + g reads kv head kv: one batched product per g over the chunk's kv heads. */
static int enqueue_prefill(struct cal *c, const void *arg)
{
	const struct prefill *a = arg;
	uint64_t hd = (uint64_t)a->L * a->d, ll = (uint64_t)a->L * a->L;
	const uint16_t *k = c->buf[1], *v = c->buf[2];
	uint16_t *q = c->buf[0], *s = c->buf[3], *o = c->buf[4];
	int err = 0;

	for (uint32_t kv = 0; !err && kv < a->n_kv; kv += a->chunk) {
		uint32_t nb = a->n_kv - kv < a->chunk ? a->n_kv - kv : a->chunk;

		for (uint32_t g = 0; !err && g < a->G; g++)
			err = gemm_batched(c, true, q + ((uint64_t)kv * a->G + g) * hd,
					   (long long)(a->G * hd), k + kv * hd, (long long)hd,
					   s + g * ll, (long long)(a->G * ll), a->L, a->L, a->d, nb,
					   "cublasGemmStridedBatchedEx (prefill S = Q K^T)");
		for (uint32_t g = 0; !err && g < a->G; g++)
			err = gemm_batched(c, false, s + g * ll, (long long)(a->G * ll),
					   v + kv * hd, (long long)hd,
					   o + ((uint64_t)kv * a->G + g) * hd,
					   (long long)(a->G * hd), a->L, a->d, a->L, nb,
					   "cublasGemmStridedBatchedEx (prefill O = P V)");
	}
	return err;
}

static int measure_prefill(struct cal *c)
{
	const struct kvt_calib_request *rq = c->rq;
	int err = 0;

	for (uint32_t i = 0; !err && i < rq->n_prefill; i++) {
		struct prefill a = {.L = rq->prefill[i],
				    .G = rq->n_q_heads / rq->n_kv_heads,
				    .d = rq->head_dim,
				    .n_kv = rq->n_kv_heads};
		double q = (double)rq->n_q_heads * a.L * a.d, kv = (double)a.n_kv * a.L * a.d;
		double head_s = (double)BF16 * a.G * a.L * a.L, left, s_room;
		struct kvt_calib_point *p = &c->r->prefill[c->r->n_prefill];

		left = (double)c->cap - BF16 * (2 * q + 2 * kv);
		s_room = left < (double)S_CAP ? left : (double)S_CAP;
		if (s_room < head_s)
			continue;
		a.chunk = s_room / head_s < a.n_kv ? (uint32_t)(s_room / head_s) : a.n_kv;
		err = dev_buf(c, 0, (uint64_t)q, "cudaMalloc (prefill Q)");
		if (!err)
			err = dev_buf(c, 1, (uint64_t)kv, "cudaMalloc (prefill K)");
		if (!err)
			err = dev_buf(c, 2, (uint64_t)kv, "cudaMalloc (prefill V)");
		if (!err)
			err = dev_buf(c, 3, (uint64_t)a.chunk * a.G * a.L * a.L,
				      "cudaMalloc (prefill S)");
		if (!err)
			err = dev_buf(c, 4, (uint64_t)q, "cudaMalloc (prefill O)");
		if (!err)
			err = time_gpu(c, enqueue_prefill, &a, &p->seconds);
		if (!err) {
			p->x = a.L;
			c->r->n_prefill++;
		}
		bufs_free(c);
	}
	return err;
}

/* ---- Copies and calls ------------------------------------------------------------------------ */

struct copy {
	void *dst;
	const void *src;
	size_t bytes;
	enum cudaMemcpyKind kind;
	const char *what;
};

static int enqueue_copy(struct cal *c, const void *arg)
{
	const struct copy *a = arg;

	return cu(c, cudaMemcpyAsync(a->dst, a->src, a->bytes, a->kind, c->st), a->what);
}

static int enqueue_empty(struct cal *c, const void *arg)
{
	(void)arg;
	return cu(c, (cudaError_t)kvt_calib_empty_launch(c->st), "kvt_calib_empty_launch");
}

/* Pinned copies each way, the cost of a copy call and of a launch, and the device-to-device
   copy; the copies are capped to the memory cap. */
static int measure_copies(struct cal *c)
{
	uint64_t bytes = c->rq->copy_bytes < c->cap ? c->rq->copy_bytes : c->cap;
	uint64_t d2d = c->rq->d2d_bytes < c->cap / 2 ? c->rq->d2d_bytes : c->cap / 2;
	struct copy cp;
	void *host = NULL;
	double s = 0;
	int err;

	err = cu(c, cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
	if (!err) {
		memset(host, 0x3c, bytes);
		err = dev_buf(c, 0, bytes / BF16, "cudaMalloc (copies)");
	}
	if (!err) {
		cp = (struct copy){c->buf[0], host, bytes, cudaMemcpyHostToDevice,
				   "cudaMemcpyAsync (H2D)"};
		err = time_gpu(c, enqueue_copy, &cp, &s);
		c->r->h2d_gbps = (double)bytes / s / 1e9;
	}
	if (!err) {
		cp = (struct copy){host, c->buf[0], bytes, cudaMemcpyDeviceToHost,
				   "cudaMemcpyAsync (D2H)"};
		err = time_gpu(c, enqueue_copy, &cp, &s);
		c->r->d2h_gbps = (double)bytes / s / 1e9;
	}
	if (!err) {
		cp = (struct copy){c->buf[0], host, bytes < CALL_BYTES ? bytes : CALL_BYTES,
				   cudaMemcpyHostToDevice, "cudaMemcpyAsync (16 KiB)"};
		err = time_host(c, enqueue_copy, &cp, &s);
		c->r->call_ns = 1e9 * s;
	}
	if (!err) {
		err = time_host(c, enqueue_empty, NULL, &s);
		c->r->launch_ns = 1e9 * s;
	}
	bufs_free(c);
	if (host)
		(void)cudaFreeHost(host);
	if (!err)
		err = dev_buf(c, 0, d2d / BF16, "cudaMalloc (D2D source)");
	if (!err)
		err = dev_buf(c, 1, d2d / BF16, "cudaMalloc (D2D destination)");
	if (!err) {
		cp = (struct copy){c->buf[1], c->buf[0], d2d / BF16 * BF16,
				   cudaMemcpyDeviceToDevice, "cudaMemcpyAsync (D2D)"};
		err = time_gpu(c, enqueue_copy, &cp, &c->r->d2d_seconds);
		c->r->d2d_bytes = (double)cp.bytes;
	}
	bufs_free(c);
	return err;
}

/* ---- The entry ------------------------------------------------------------------------------- */

/* Whether n entries of l are in [1, max] and strictly ascending. */
static bool list_ok(const uint32_t *l, uint32_t n, uint32_t max)
{
	if (n > KVT_CALIB_POINTS)
		return false;
	for (uint32_t i = 0; i < n; i++)
		if (l[i] == 0 || l[i] > max || (i && l[i] <= l[i - 1]))
			return false;
	return true;
}

static const char *request_bad(const struct kvt_calib_request *rq)
{
	if (rq->size != sizeof(*rq))
		return "built for another kvtier (request size)";
	if (rq->flags & ~KVT_CALIB_DEVICE_ONLY)
		return "unknown flags";
	if (rq->flags & KVT_CALIB_DEVICE_ONLY)
		return NULL;
	if (rq->reps < 1 || rq->reps > REPS_MAX)
		return "reps not in 1..1000";
	if (!rq->hidden || !rq->n_q_heads || !rq->n_kv_heads || !rq->head_dim || !rq->mlp_dim ||
	    rq->hidden > DIM_MAX || rq->n_q_heads > DIM_MAX || rq->head_dim > DIM_MAX ||
	    rq->mlp_dim > 8 * DIM_MAX || rq->n_q_heads % rq->n_kv_heads)
		return "bad model geometry";
	if (!list_ok(rq->tokens, rq->n_tokens, TOKENS_MAX) ||
	    !list_ok(rq->batch, rq->n_batch, BATCH_MAX) ||
	    !list_ok(rq->context, rq->n_context, CONTEXT_MAX) ||
	    !list_ok(rq->prefill, rq->n_prefill, PREFILL_MAX))
		return "a list not strictly ascending, empty entries or too many";
	if (rq->copy_bytes < CALL_BYTES || rq->d2d_bytes < 2 * BF16)
		return "copies smaller than 16 KiB";
	return NULL;
}

/* The device's name and memory, and the memory cap. */
static int describe(struct cal *c)
{
	struct cudaDeviceProp prop;
	size_t free_b = 0, total_b = 0;
	int n = 0, dev = 0, err;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess || n == 0)
		return fail(c, -ENODEV, "no usable CUDA device (%s)",
			    e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
	err = cu(c, cudaGetDevice(&dev), "cudaGetDevice");
	if (!err)
		err = cu(c, cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
	if (err)
		return err;
	snprintf(c->r->device, sizeof(c->r->device), "%s", prop.name);
	c->r->mem_bytes = (double)prop.totalGlobalMem;
	if (c->rq->flags & KVT_CALIB_DEVICE_ONLY)
		return 0;
	c->cap = c->rq->mem_cap;
	if (!c->cap) {
		err = cu(c, cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
		c->cap = free_b / 2;
	}
	c->r->mem_cap = c->cap;
	return err;
}

int kvt_cuda_calibrate(const struct kvt_calib_request *rq, struct kvt_calib_result *out,
		       char *err_buf, size_t err_len)
{
	struct cal c = {.rq = rq, .err = err_buf, .err_len = err_len};
	const char *bad = rq ? request_bad(rq) : "no request";
	int err;

	if (bad)
		return fail(&c, -EINVAL, "calibrate: %s", bad);
	c.r = calloc(1, sizeof(*c.r));
	c.t = calloc(rq->reps ? rq->reps : 1, sizeof(*c.t));
	if (!c.r || !c.t) {
		err = fail(&c, -ENOMEM, "calibrate: out of memory");
		goto out;
	}
	err = describe(&c);
	if (err || rq->flags & KVT_CALIB_DEVICE_ONLY)
		goto out;
	err = cu(&c, cudaStreamCreateWithFlags(&c.st, cudaStreamNonBlocking),
		 "cudaStreamCreateWithFlags");
	for (int i = 0; !err && i < 2; i++)
		err = cu(&c, cudaEventCreate(&c.ev[i]), "cudaEventCreate");
	if (!err)
		err = blas_open(&c);
	if (!err)
		err = measure_linear(&c);
	if (!err)
		err = measure_decode(&c);
	if (!err)
		err = measure_prefill(&c);
	if (!err)
		err = measure_copies(&c);
out:
	if (c.st)
		bufs_free(&c);
	blas_close(&c.b);
	for (int i = 0; i < 2; i++)
		if (c.ev[i])
			(void)cudaEventDestroy(c.ev[i]);
	if (c.st)
		(void)cudaStreamDestroy(c.st);
	if (!err)
		*out = *c.r;
	free(c.r);
	free(c.t);
	return err;
}
