/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench transfer: the CUDA backend's transfers against the CUDA runtime's own ways of
 * moving the same scattered blocks (docs/design.md "FlashH2D", "FlashD2H"). Per (block size B,
 * count N), N blocks sit in N of 2N slots of a pinned, mapped host arena (a fixed-seed shuffle),
 * and move to or from a device buffer of N * B bytes:
 *   (a) the fused gather, one kvt_gather_launch      (e) FlashD2H: the backend's save + save_wait
 *   (b) one cudaMemcpyAsync per block, H2D           (f) one cudaMemcpyAsync per block, D2H
 *   (c) one cudaMemcpyBatchAsync                     (g) one contiguous D2H copy (the ceiling)
 *   (d) one contiguous H2D copy (the ceiling)
 * Figures and ratios only: it never passes or fails on time, only on wrong bytes or CUDA errors.
 * SIGTERM or SIGINT (timeout(1) at the end of a budget, ^C) stops it after the method running,
 * still printing the targets and calibration of the cells measured.
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_usage.h"
#include "cuda_be.h"

#define TOOL "kvtier-bench transfer"
#define LIST_MAX 32
#define STAGING_BYTES ((uint64_t)32 << 20) /* per staging buffer; larger saves go in chunks */
#define SKIP 77				   /* the test harness's skip status */

enum meth {
	M_FUSED,
	M_PER_BLOCK,
	M_BATCH,
	M_CONTIG_H2D,
	M_FLASHD2H,
	M_PER_BLOCK_D2H,
	M_CONTIG_D2H,
	M_COUNT
};

static const struct {
	const char *name, *call, *col;
} meth_info[M_COUNT] = {
	{"(a) fused gather", "kvt_gather_launch", "fused"},
	{"(b) per-block H2D", "cudaMemcpyAsync", "per-blk"},
	{"(c) batch H2D", "cudaMemcpyBatchAsync", "batch"},
	{"(d) contiguous H2D", "cudaMemcpyAsync", "contig"},
	{"(e) FlashD2H", "save", "FlashD2H"},
	{"(f) per-block D2H", "cudaMemcpyAsync", "per-blk"},
	{"(g) contiguous D2H", "cudaMemcpyAsync", "contig"},
};

struct opts {
	uint32_t sizes[LIST_MAX], counts[LIST_MAX], n_sizes, n_counts;
	uint32_t ctas, threads, reps, max_gib;
	const char *csv;
};

/* What every cell shares: the stream, the timing events, the backend of (e), scratch; and the
   run's results. */
struct bench {
	const struct opts *o;
	cudaStream_t st;
	cudaEvent_t ev[2];
	struct kvt_be *be;
	int device;	    /* the current device, where every buffer lives */
	double *t;	    /* o->reps run times, seconds */
	struct result *res; /* one per cell measured, n_res of them */
	size_t n_res;
	FILE *csv; /* --csv, or NULL */
};

/* One (B, N) cell's buffers. Every pointer is NULL until allocated, so cell_free frees any
   partial state. */
struct cell {
	uint32_t kib;
	uint64_t B, N, bytes;	      /* bytes = N * B */
	uint32_t *slot;		      /* block i lives in host slot slot[i] (2N entries shuffled) */
	uint8_t *host, *dev, *check;  /* pinned arena (2N slots), device buffer, pageable copy */
	void *host_dev;		      /* the arena's device address */
	struct kvt_gpu_piece *pieces; /* pinned */
	void *pieces_dev;	      /* device copy, as the backend's gather makes */
	void **dsts;
	const void **srcs;
	size_t *sizes;
	struct kvt_xfer *x;
	uint64_t be_base, ticket; /* the backend's host arena (2N slots); latest save */
	bool be_arena;
};

struct result {
	uint32_t kib, count;
	bool measured;
	double gbps[M_COUNT];
};

/* The signal that asked the run to stop, or 0. */
static volatile sig_atomic_t bench_stop;

static void on_stop(int sig)
{
	bench_stop = sig;
}

/* A decimal integer in [lo, hi] up to end: 0, or -1. */
static int parse_u32(const char *s, const char **end, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *e;
	unsigned long long v;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &e, 10);
	if (errno || v < lo || v > hi)
		return -1;
	*out = (uint32_t)v;
	*end = e;
	return 0;
}

/* A comma-separated list of at most LIST_MAX integers in [lo, hi]: 0, or -1. */
static int parse_list(const char *s, uint32_t lo, uint32_t hi, uint32_t *out, uint32_t *n)
{
	const char *e;

	for (*n = 0;; s = e + 1) {
		if (*n == LIST_MAX || parse_u32(s, &e, lo, hi, &out[*n]))
			return -1;
		(*n)++;
		if (*e == '\0')
			return 0;
		if (*e != ',')
			return -1;
	}
}

static int parse_one(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	const char *e;

	return parse_u32(s, &e, lo, hi, out) || *e ? -1 : 0;
}

enum { OPTS_RUN, OPTS_HELP, OPTS_BAD };

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{"sizes", required_argument, NULL, 's'}, {"counts", required_argument, NULL, 'n'},
		{"ctas", required_argument, NULL, 'c'},	 {"threads", required_argument, NULL, 't'},
		{"reps", required_argument, NULL, 'r'},	 {"max-gib", required_argument, NULL, 'm'},
		{"csv", required_argument, NULL, 'C'},	 {"quick", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},	 {NULL, 0, NULL, 0},
	};
	bool quick = false, sizes_set = false, counts_set = false, reps_set = false;
	int c, bad, li = 0;

	*o = (struct opts){
		.sizes = {4, 16, 64},
		.n_sizes = 3,
		.counts = {16, 64, 256, 1024, 4096, 16384, 65536},
		.n_counts = 7,
		.ctas = KVT_GATHER_CTAS_DEFAULT,
		.threads = 4,
		.reps = 5,
		.max_gib = 4,
	};
	optind = 0; /* GNU: a full reset, whatever parsed argv before */
	while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
		bad = 0;
		switch (c) {
		case 's':
			bad = parse_list(optarg, 1, 65536, o->sizes, &o->n_sizes);
			sizes_set = true;
			break;
		case 'n':
			bad = parse_list(optarg, 1, 1u << 24, o->counts, &o->n_counts);
			counts_set = true;
			break;
		case 'c':
			bad = parse_one(optarg, 1, KVT_GATHER_CTAS_MAX, &o->ctas);
			break;
		case 't':
			bad = parse_one(optarg, 1, KVT_SAVE_MAX_THREADS, &o->threads);
			break;
		case 'r':
			bad = parse_one(optarg, 1, 1000, &o->reps);
			reps_set = true;
			break;
		case 'm':
			bad = parse_one(optarg, 1, 1024, &o->max_gib);
			break;
		case 'C':
			o->csv = optarg;
			break;
		case 'q':
			quick = true;
			break;
		case 'h':
			kvt_bench_transfer_usage(stdout);
			return OPTS_HELP;
		default: /* getopt has named the option */
			fprintf(stderr, TOOL ": bad usage (try --help)\n");
			return OPTS_BAD;
		}
		if (bad) {
			fprintf(stderr, TOOL ": bad value for --%s: '%s'\n", lo[li].name, optarg);
			return OPTS_BAD;
		}
	}
	if (optind < argc) {
		fprintf(stderr, TOOL ": unexpected argument '%s'\n", argv[optind]);
		return OPTS_BAD;
	}
	/* --quick sets what the other options leave unset, in any order */
	if (quick && !sizes_set)
		o->sizes[0] = 16, o->n_sizes = 1;
	if (quick && !counts_set)
		o->counts[0] = 64, o->counts[1] = 1024, o->n_counts = 2;
	if (quick && !reps_set)
		o->reps = 3;
	return OPTS_RUN;
}

/* GB/s of moving `bytes` in the median of t[0..n) seconds (sorts t). */
static double median_gbps(uint64_t bytes, double *t, uint32_t n)
{
	double med;

	qsort(t, n, sizeof(*t), kvt_cuda_cmp_double);
	med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
	return med > 0 ? (double)bytes / med / 1e9 : 0;
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t x = (*s += 0x9e3779b97f4a7c15ull);

	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Reports a failed CUDA call of a step (of cell c; NULL: of the start-up); returns whether e
   is a failure. */
static bool cuda_failed(cudaError_t e, const struct cell *c, const char *step, const char *call)
{
	if (e == cudaSuccess)
		return false;
	if (c)
		fprintf(stderr, TOOL ": %u KiB x %llu blocks, %s: %s failed: %s (%s)\n", c->kib,
			(unsigned long long)c->N, step, call, cudaGetErrorString(e),
			cudaGetErrorName(e));
	else
		fprintf(stderr, TOOL ": %s: %s failed: %s (%s)\n", step, call,
			cudaGetErrorString(e), cudaGetErrorName(e));
	return true;
}

/* Whether some block i of contig (N blocks in order) differs from host slot slot[i] of blocks;
   reports the first difference. */
static bool blocks_differ(const struct cell *c, const uint8_t *blocks, const uint8_t *contig,
			  const char *what)
{
	for (uint64_t i = 0; i < c->N; i++) {
		const uint8_t *a = contig + i * c->B, *b = blocks + c->slot[i] * c->B;
		uint64_t k = 0;

		if (memcmp(a, b, c->B) == 0)
			continue;
		while (a[k] == b[k])
			k++;
		fprintf(stderr,
			TOOL
			": %u KiB x %llu blocks, %s moved wrong bytes: block %llu (host slot "
			"%u) differs first at byte %llu (device side 0x%02x, host block 0x%02x)\n",
			c->kib, (unsigned long long)c->N, what, (unsigned long long)i, c->slot[i],
			(unsigned long long)k, a[k], b[k]);
		return true;
	}
	return false;
}

/* Queues one run of method m (not FlashD2H) on the stream. */
static cudaError_t enqueue(const struct bench *bn, const struct cell *c, enum meth m)
{
	struct cudaMemcpyAttributes attr = {
		.srcAccessOrder = cudaMemcpySrcAccessOrderStream,
		.srcLocHint = {.type = cudaMemLocationTypeHost},
		.dstLocHint = {.type = cudaMemLocationTypeDevice, .id = bn->device},
		.flags = cudaMemcpyFlagDefault,
	};
	size_t attr_idx = 0;
	cudaError_t e = cudaSuccess;

	switch (m) {
	case M_FUSED: /* as the backend's gather_h2d: the list to the device, then one launch */
		e = cudaMemcpyAsync(c->pieces_dev, c->pieces, c->N * sizeof(*c->pieces),
				    cudaMemcpyHostToDevice, bn->st);
		if (e != cudaSuccess)
			return e;
		return (cudaError_t)kvt_gather_launch(c->pieces_dev, (uint32_t)c->N, bn->o->ctas,
						      bn->st);
	case M_PER_BLOCK:
		for (uint64_t i = 0; i < c->N && e == cudaSuccess; i++)
			e = cudaMemcpyAsync(c->dev + i * c->B, c->host + c->slot[i] * c->B, c->B,
					    cudaMemcpyHostToDevice, bn->st);
		return e;
	case M_BATCH:
		return cudaMemcpyBatchAsync(c->dsts, c->srcs, c->sizes, c->N, &attr, &attr_idx, 1,
					    bn->st);
	case M_CONTIG_H2D:
		return cudaMemcpyAsync(c->dev, c->host, c->bytes, cudaMemcpyHostToDevice, bn->st);
	case M_PER_BLOCK_D2H:
		for (uint64_t i = 0; i < c->N && e == cudaSuccess; i++)
			e = cudaMemcpyAsync(c->host + c->slot[i] * c->B, c->dev + i * c->B, c->B,
					    cudaMemcpyDeviceToHost, bn->st);
		return e;
	case M_CONTIG_D2H:
		return cudaMemcpyAsync(c->host, c->dev, c->bytes, cudaMemcpyDeviceToHost, bn->st);
	default:
		return cudaErrorInvalidValue;
	}
}

/* The device buffer into c->check (stream-ordered, waited for). */
static bool read_back(const struct bench *bn, const struct cell *c, const char *step)
{
	return cuda_failed(
		       cudaMemcpyAsync(c->check, c->dev, c->bytes, cudaMemcpyDeviceToHost, bn->st),
		       c, step, "cudaMemcpyAsync (read back)") ||
	       cuda_failed(cudaStreamSynchronize(bn->st), c, step, "cudaStreamSynchronize");
}

/* Method m timed by events around each run on the stream; (a) and (c) write into a cleared
   device buffer at the warm-up and are checked. 0; 1 (reported); 2: stopped by a signal. */
static int time_events(struct bench *bn, struct cell *c, enum meth m, double *gbps)
{
	const char *step = meth_info[m].name, *call = meth_info[m].call;
	bool verify = m == M_FUSED || m == M_BATCH;
	float ms;

	if (verify &&
	    cuda_failed(cudaMemsetAsync(c->dev, 0, c->bytes, bn->st), c, step, "cudaMemsetAsync"))
		return 1;
	if (cuda_failed(enqueue(bn, c, m), c, step, call) ||
	    cuda_failed(cudaStreamSynchronize(bn->st), c, step, "cudaStreamSynchronize"))
		return 1;
	if (verify && (read_back(bn, c, step) || blocks_differ(c, c->host, c->check, step)))
		return 1;
	for (uint32_t r = 0; r < bn->o->reps; r++) {
		if (bench_stop)
			return 2;
		if (cuda_failed(cudaEventRecord(bn->ev[0], bn->st), c, step, "cudaEventRecord") ||
		    cuda_failed(enqueue(bn, c, m), c, step, call) ||
		    cuda_failed(cudaEventRecord(bn->ev[1], bn->st), c, step, "cudaEventRecord") ||
		    cuda_failed(cudaEventSynchronize(bn->ev[1]), c, step, "cudaEventSynchronize") ||
		    cuda_failed(cudaEventElapsedTime(&ms, bn->ev[0], bn->ev[1]), c, step,
				"cudaEventElapsedTime"))
			return 1;
		bn->t[r] = 1e-3 * ms;
	}
	*gbps = median_gbps(c->bytes, bn->t, bn->o->reps);
	return 0;
}

/* FlashD2H: wall time of save + save_wait of the whole device buffer into the N host slots of
   the backend's own arena; the warm-up's blocks are checked against a copy of the buffer.
   0; 1 (reported); 2: stopped by a signal. */
static int time_flashd2h(struct bench *bn, struct cell *c, double *gbps)
{
	const struct kvt_backend_ops *ops = &kvt_backend_cuda_ops;
	const char *step = meth_info[M_FLASHD2H].name;
	struct kvt_save_src src = {.addr = (uint64_t)(uintptr_t)c->dev, .bytes = c->bytes};
	uint8_t *blocks = (uint8_t *)(uintptr_t)c->be_base;

	if (read_back(bn, c, step))
		return 1;
	memset(blocks, 0x5a, 2 * c->bytes);
	for (uint32_t r = 0; r <= bn->o->reps; r++) { /* run 0: warm-up and check */
		double t0 = kvt_cuda_now_s();
		const char *call = "save";
		uint64_t ticket = 0;
		int err;

		if (bench_stop)
			return 2;
		err = ops->save(bn->be, &src, 1, c->x, (uint32_t)c->N, bn->st, &ticket);
		if (!err) {
			c->ticket = ticket; /* cell_free waits for it should anything fail */
			call = "save_wait";
			err = ops->save_wait(bn->be, ticket);
		}
		if (err) {
			fprintf(stderr, TOOL ": %u KiB x %llu blocks, %s: %s failed: %s (%s)\n",
				c->kib, (unsigned long long)c->N, step, call, strerror(-err),
				bn->be->err);
			return 1;
		}
		if (r > 0)
			bn->t[r - 1] = kvt_cuda_now_s() - t0;
		else if (blocks_differ(c, blocks, c->check, step))
			return 1;
	}
	*gbps = median_gbps(c->bytes, bn->t, bn->o->reps);
	return 0;
}

/* Allocates and fills a cell's buffers. 0, or 1 (reported); cell_free frees what was made. */
static int cell_setup(struct bench *bn, struct cell *c)
{
	const unsigned int flags = cudaHostAllocMapped | cudaHostAllocPortable;
	const char *step = "setup";
	uint64_t seed = 0x6b76746965720000ull ^ (c->B << 24) ^ c->N;
	int err;

	c->slot = malloc(2 * c->N * sizeof(*c->slot));
	c->check = malloc(c->bytes);
	c->dsts = malloc(c->N * sizeof(*c->dsts));
	c->srcs = malloc(c->N * sizeof(*c->srcs));
	c->sizes = malloc(c->N * sizeof(*c->sizes));
	c->x = calloc(c->N, sizeof(*c->x));
	if (!c->slot || !c->check || !c->dsts || !c->srcs || !c->sizes || !c->x) {
		fprintf(stderr, TOOL ": %u KiB x %llu blocks: out of memory\n", c->kib,
			(unsigned long long)c->N);
		return 1;
	}
	if (cuda_failed(cudaHostAlloc((void **)&c->host, 2 * c->bytes, flags), c, step,
			"cudaHostAlloc (host blocks)") ||
	    cuda_failed(cudaHostGetDevicePointer(&c->host_dev, c->host, 0), c, step,
			"cudaHostGetDevicePointer (host blocks)") ||
	    cuda_failed(cudaMalloc((void **)&c->dev, c->bytes), c, step, "cudaMalloc") ||
	    cuda_failed(cudaHostAlloc((void **)&c->pieces, c->N * sizeof(*c->pieces), flags), c,
			step, "cudaHostAlloc (piece list)") ||
	    cuda_failed(cudaMalloc(&c->pieces_dev, c->N * sizeof(*c->pieces)), c, step,
			"cudaMalloc (piece list)"))
		return 1;
	err = kvt_backend_cuda_ops.arena_alloc(bn->be, KVT_TIER_HOST, 2 * c->bytes, &c->be_base);
	if (err) {
		fprintf(stderr, TOOL ": %u KiB x %llu blocks, setup: arena_alloc failed: %s (%s)\n",
			c->kib, (unsigned long long)c->N, strerror(-err), bn->be->err);
		return 1;
	}
	c->be_arena = true;

	/* N distinct slots of 2N: the first N of a partial Fisher-Yates shuffle */
	for (uint64_t i = 0; i < 2 * c->N; i++)
		c->slot[i] = (uint32_t)i;
	for (uint64_t i = 0; i < c->N; i++) {
		uint64_t j = i + splitmix64(&seed) % (2 * c->N - i);
		uint32_t s = c->slot[i];

		c->slot[i] = c->slot[j];
		c->slot[j] = s;
	}
	for (uint64_t w = 0; w < 2 * c->bytes / 8; w++)
		((uint64_t *)(void *)c->host)[w] = splitmix64(&seed);
	for (uint64_t i = 0; i < c->N; i++) {
		uint64_t off = c->slot[i] * c->B;

		c->pieces[i] = (struct kvt_gpu_piece){
			.src = (uint64_t)(uintptr_t)c->host_dev + off,
			.dst = (uint64_t)(uintptr_t)c->dev + i * c->B,
			.bytes = c->B,
		};
		c->dsts[i] = c->dev + i * c->B;
		c->srcs[i] = c->host + off;
		c->sizes[i] = c->B;
		c->x[i] = (struct kvt_xfer){.src = i * c->B,
					    .dst = c->be_base + off,
					    .bytes = (uint32_t)c->B,
					    .reps = 1};
	}
	return 0;
}

/* Frees whatever cell_setup made, after the stream and any save in flight are done. */
static void cell_free(struct bench *bn, struct cell *c)
{
	(void)cudaStreamSynchronize(bn->st);
	if (c->ticket)
		(void)kvt_backend_cuda_ops.save_wait(bn->be, c->ticket);
	if (c->be_arena)
		kvt_backend_cuda_ops.arena_free(bn->be, KVT_TIER_HOST, c->be_base, 2 * c->bytes);
	if (c->pieces)
		(void)cudaFreeHost(c->pieces);
	if (c->pieces_dev)
		(void)cudaFree(c->pieces_dev);
	if (c->dev)
		(void)cudaFree(c->dev);
	if (c->host)
		(void)cudaFreeHost(c->host);
	free(c->slot);
	free(c->check);
	free(c->dsts);
	free(c->srcs);
	free(c->sizes);
	free(c->x);
}

/* Measures every method of one cell into res. 0; 1 (reported); 2: stopped by a signal before
   the cell was done (res not measured). */
static int run_cell(struct bench *bn, uint32_t kib, uint32_t count, struct result *res)
{
	struct cell c = {.kib = kib, .B = (uint64_t)kib << 10, .N = count};
	int rc = 1;

	c.bytes = c.N * c.B;
	*res = (struct result){.kib = kib, .count = count};
	if (cell_setup(bn, &c))
		goto out;
	for (int m = 0; m < M_COUNT; m++) {
		if (bench_stop)
			rc = 2;
		else if (m == M_FLASHD2H)
			rc = time_flashd2h(bn, &c, &res->gbps[m]);
		else
			rc = time_events(bn, &c, (enum meth)m, &res->gbps[m]);
		if (rc)
			goto out;
	}
	res->measured = true;
	rc = 0;
out:
	cell_free(bn, &c);
	return rc;
}

/* The measured cell of the largest count at size kib, or NULL. */
static const struct result *largest_at(const struct result *res, size_t n, uint32_t kib)
{
	const struct result *best = NULL;

	for (size_t i = 0; i < n; i++)
		if (res[i].measured && res[i].kib == kib && (!best || res[i].count > best->count))
			best = &res[i];
	return best;
}

static const char *verdict(double v, double target, const char *cond)
{
	return cond ? "n/a" : v >= target ? "ok" : "below";
}

/* One target line: gbps[num] / gbps[den] of the largest count measured at size kib against
   target (and stretch when > 0), as a multiple when times; cond: why no verdict (or NULL). */
static void print_target(const struct result *res, size_t n, const char *what, uint32_t kib,
			 enum meth num, enum meth den, double target, double stretch, bool times,
			 const char *cond)
{
	const struct result *r = largest_at(res, n, kib);
	const char *unit = times ? "x" : "";
	double v;

	if (!r) {
		printf("  %-26s %2u KiB: n/a (no %u KiB cell measured)\n", what, kib, kib);
		return;
	}
	v = r->gbps[den] > 0 ? r->gbps[num] / r->gbps[den] : 0;
	printf("  %-26s %2u KiB (count %u): %.2f%s, target >= %.2f%s %s", what, kib, r->count, v,
	       unit, target, unit, verdict(v, target, cond));
	if (stretch > 0)
		printf(", stretch >= %.2f%s %s", stretch, unit, verdict(v, stretch, cond));
	printf("%s%s\n", cond ? " " : "", cond ? cond : "");
}

static void print_calibration(const struct kvt_be *be)
{
	static const char *const cls[KVT_CALIB_CLASSES] = {"4 KiB", "16 KiB", ">= 64 KiB"};
	const struct kvt_cuda_calib *cal = kvt_cuda_calibration(be);

	if (!cal) {
		printf("backend calibration: none reported\n");
		return;
	}
	printf("backend calibration (%s): fused gather from gather_min pieces, else one batch\n",
	       cal->measured ? "measured at create" : "not measured: defaults");
	printf("  %-10s %16s %12s %12s\n", "class", "gather_min", "gather GB/s", "batch GB/s");
	for (int i = 0; i < KVT_CALIB_CLASSES; i++) {
		char min[32];

		if (cal->gather_min[i] == UINT32_MAX)
			snprintf(min, sizeof(min), "never (DMA)");
		else
			snprintf(min, sizeof(min), "%u", cal->gather_min[i]);
		printf("  %-10s %16s %12.2f %12.2f\n", cls[i], min, cal->gather_gbps[i],
		       cal->batch_gbps[i]);
	}
}

/* Prints what the run measures on which device. */
static void print_header(const struct bench *bn)
{
	char gpu[256] = "unknown", date[64] = "";
	int drv = 0, rt = 0;
	time_t now = time(NULL);
	struct tm tm;

	if (kvt_cuda_describe(gpu, sizeof(gpu), &drv, &rt))
		snprintf(gpu, sizeof(gpu), "device %d (kvt_cuda_describe failed)", bn->device);
	if (gmtime_r(&now, &tm))
		strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", &tm);
	printf(TOOL ": %s, driver %d.%d, runtime %d.%d, %s\n", gpu, drv / 1000, drv % 1000 / 10,
	       rt / 1000, rt % 1000 / 10, date);
	printf("fused gather: %u CTAs x %d threads; timed as the backend runs it: the piece list "
	       "copied to the device, then one launch\n",
	       bn->o->ctas, KVT_GATHER_THREADS);
	printf("FlashD2H: %u save threads, staging 2 x %llu MiB (larger saves go in chunks), "
	       "wall time of save + save_wait\n",
	       bn->o->threads, (unsigned long long)(STAGING_BYTES >> 20));
	printf("blocks in N of 2N slots of a pinned mapped arena (fixed-seed shuffle); median of "
	       "%u runs after one warm-up; GB/s = 1e9 payload bytes/s\n",
	       bn->o->reps);
	fflush(stdout);
}

/* What the run needs before its first cell: the result table, the CSV with its header (at
   once: a run stopped before its first cell still has it), the stream and events, the
   backend of (e); prints the header. 0, SKIP (no device) or 1 (reported); bench_end frees
   what was made. */
static int bench_begin(struct bench *bn)
{
	const struct opts *o = bn->o;
	struct kvt_backend_params bp = {.staging_bytes = STAGING_BYTES, .save_threads = o->threads};
	int n_dev = 0, err;
	cudaError_t e;

	e = cudaGetDeviceCount(&n_dev);
	if (e != cudaSuccess || n_dev == 0) {
		fprintf(stderr, TOOL ": no CUDA device (%s)\n",
			e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
		return SKIP;
	}
	if (!kvt_cuda_host) {
		fprintf(stderr, TOOL ": the CUDA plugin was not initialised by libkvtier\n");
		return 1;
	}
	bn->res = calloc((size_t)o->n_sizes * o->n_counts, sizeof(*bn->res));
	bn->t = calloc(o->reps, sizeof(*bn->t));
	if (!bn->res || !bn->t) {
		fprintf(stderr, TOOL ": out of memory\n");
		return 1;
	}
	if (o->csv && !(bn->csv = fopen(o->csv, "w"))) {
		fprintf(stderr, TOOL ": %s: %s\n", o->csv, strerror(errno));
		return 1;
	}
	if (bn->csv)
		fprintf(bn->csv,
			"size_kib,count,fused_gbps,per_block_gbps,batch_gbps,"
			"contig_h2d_gbps,flashd2h_gbps,per_block_d2h_gbps,contig_d2h_gbps\n");
	if (cuda_failed(cudaStreamCreateWithFlags(&bn->st, cudaStreamNonBlocking), NULL, "start-up",
			"cudaStreamCreateWithFlags"))
		return 1;
	for (int i = 0; i < 2; i++)
		if (cuda_failed(cudaEventCreate(&bn->ev[i]), NULL, "start-up", "cudaEventCreate"))
			return 1;
	if (cuda_failed(cudaGetDevice(&bn->device), NULL, "start-up", "cudaGetDevice"))
		return 1;
	print_header(bn);
	err = kvt_backend_cuda_ops.create(&bp, &bn->be);
	if (err) {
		fprintf(stderr, TOOL ": cannot create the CUDA backend: %s\n", strerror(-err));
		bn->be = NULL;
		return 1;
	}
	return 0;
}

/* Measures every (size, count) cell within --max-gib until a signal stops the run, printing
   each as a row (and a CSV line, flushed, so a run cut short keeps its cells). 0, or 1 when
   a cell failed (reported). */
static int run_cells(struct bench *bn)
{
	const struct opts *o = bn->o;
	uint32_t skipped = 0;

	printf("\n%6s %7s | %9s %9s %9s %9s | %9s %9s %9s   (GB/s)\n", "KiB", "count",
	       meth_info[0].col, meth_info[1].col, meth_info[2].col, meth_info[3].col,
	       meth_info[4].col, meth_info[5].col, meth_info[6].col);
	for (uint32_t si = 0; si < o->n_sizes && !bench_stop; si++) {
		for (uint32_t ci = 0; ci < o->n_counts && !bench_stop; ci++) {
			struct result *r = &bn->res[bn->n_res];
			const double *g = r->gbps;
			int cell_rc;

			if ((uint64_t)o->sizes[si] * o->counts[ci] > (uint64_t)o->max_gib << 20) {
				skipped++;
				continue;
			}
			cell_rc = run_cell(bn, o->sizes[si], o->counts[ci], r);
			if (cell_rc == 1)
				return 1;
			if (cell_rc == 2)
				break;
			bn->n_res++;
			printf("%6u %7u | %9.2f %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f\n", r->kib,
			       r->count, g[0], g[1], g[2], g[3], g[4], g[5], g[6]);
			fflush(stdout);
			if (bn->csv) {
				fprintf(bn->csv, "%u,%u,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n",
					r->kib, r->count, g[0], g[1], g[2], g[3], g[4], g[5], g[6]);
				fflush(bn->csv);
			}
		}
	}
	if (skipped)
		printf("(%u cells over --max-gib %u skipped)\n", skipped, o->max_gib);
	if (bench_stop)
		printf("(stopped by %s after %zu cells: the figures below are of those)\n",
		       bench_stop == SIGINT ? "SIGINT" : "SIGTERM", bn->n_res);
	return 0;
}

/* The targets, over the cells measured, and the backend's calibration. */
static void print_report(const struct bench *bn)
{
	const struct result *res = bn->res;
	size_t n = bn->n_res;

	printf("\ntargets (largest count measured at each size):\n");
	print_target(res, n, "fused / contiguous H2D", 16, M_FUSED, M_CONTIG_H2D, 0.65, 0.80, false,
		     NULL);
	print_target(res, n, "fused / contiguous H2D", 64, M_FUSED, M_CONTIG_H2D, 0.70, 0.85, false,
		     NULL);
	print_target(res, n, "fused / batch", 16, M_FUSED, M_BATCH, 3, 0, true, NULL);
	print_target(res, n, "fused / per-block H2D", 4, M_FUSED, M_PER_BLOCK, 8, 0, true, NULL);
	print_target(res, n, "FlashD2H / contiguous D2H", 16, M_FLASHD2H, M_CONTIG_D2H, 0.75, 0,
		     false, bn->o->threads <= 4 ? NULL : "(the target is for --threads <= 4)");
	printf("\n");
	print_calibration(bn->be);
}

/* Frees what bench_begin made and closes the CSV: rc, or 1 when the CSV could not be
   written and the run had succeeded. */
static int bench_end(struct bench *bn, int rc)
{
	if (bn->be)
		kvt_backend_cuda_ops.destroy(bn->be);
	for (int i = 0; i < 2; i++)
		if (bn->ev[i])
			(void)cudaEventDestroy(bn->ev[i]);
	if (bn->st)
		(void)cudaStreamDestroy(bn->st);
	if (bn->csv) {
		bool bad = ferror(bn->csv) != 0;

		if ((fclose(bn->csv) || bad) && rc == 0) {
			fprintf(stderr, TOOL ": %s: cannot write the CSV\n", bn->o->csv);
			rc = 1;
		}
	}
	free(bn->t);
	free(bn->res);
	return rc;
}

int kvt_cuda_bench(int argc, char **argv)
{
	struct sigaction stop = {.sa_handler = on_stop, .sa_flags = SA_RESTART}, old_term, old_int;
	struct opts o;
	struct bench bn = {.o = &o};
	int rc;

	switch (parse_opts(argc, argv, &o)) {
	case OPTS_HELP:
		return 0;
	case OPTS_BAD:
		return 2;
	}
	bench_stop = 0;
	sigemptyset(&stop.sa_mask);
	/* cannot fail: valid signals, valid actions */
	(void)sigaction(SIGTERM, &stop, &old_term);
	(void)sigaction(SIGINT, &stop, &old_int);
	rc = bench_begin(&bn);
	if (!rc)
		rc = run_cells(&bn);
	if (!rc) {
		print_report(&bn);
		rc = bench_stop ? 128 + bench_stop : 0;
	}
	rc = bench_end(&bn, rc);
	(void)sigaction(SIGTERM, &old_term, NULL);
	(void)sigaction(SIGINT, &old_int, NULL);
	return rc;
}
