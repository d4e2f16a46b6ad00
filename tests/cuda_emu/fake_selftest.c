/* SPDX-License-Identifier: MIT */
/*
 * The fake runtime's reuse of freed mappings (fake_memory.c, keep_map): `fake_selftest reuse`
 * frees pinned and device memory, allocates the same sizes again and checks that the memory
 * comes back poisoned afresh (the test exits 0); `fake_selftest write-after-free` writes to
 * pinned memory after cudaFreeHost, which the next allocation of that size must catch (the
 * fake stops the process: meson expects it to fail).
 *
 * And the CPU stand-ins of fake_kernels.c that the plugin does not call yet, called directly
 * through the fake runtime: `fake_selftest kernels` runs kvt_gpu_meta_fold and
 * kvt_gpu_quest_select on device memory and compares what comes back with the CPU references
 * (kvt_meta_init/kvt_meta_add, kvt_quest_select) on the same inputs, and checks their argument
 * checks; `fake_selftest fold-overlap` folds two sequences into one entry, which the stand-in's
 * footprint check must stop (meson expects it to fail).
 *
 * `fake_selftest free-async` frees device memory on a stream (cudaFreeAsync) behind work that
 * uses it, which sees it, and checks that it is gone once the stream got there; `fake_selftest
 * free-async-early` runs work of another stream on it after that, which the fake must stop
 * (meson expects it to fail; with FAKE_CUDA_ASYNC, so that the free runs before the work).
 *
 * `fake_selftest copy-seconds` checks that fake_cuda_copy_seconds counts the copies between
 * pinned and device memory, both ways, and no other.
 *
 * `fake_selftest table` checks the allocation table (kept sorted, found by halving): hundreds of
 * device and pinned allocations of mixed sizes, a third freed in between, and every live one's
 * first and last bytes written and read back through copies whose direction the table must
 * tell, pinned ones found from any byte by cudaHostGetDevicePointer.
 *
 * `kernels` also walks three recall regions at random through the stand-ins of the region
 * kernels (fake_region.c) on device memory and the stream, beside the CPU reference
 * (kvt_region_* on host copies, and a free-frame stack used as manager/recall.c uses it: a
 * drop or clear pushes at free[n_free++], a grow pops free[--n_free]): recalls of random
 * selections over growing layers (hits, reloads, evictions, -ENOSPC) each maybe followed by a
 * gather from pinned host groups (some blocks not in DRAM), grows to random sizes off the
 * stack or with frames the caller writes, drops (dropped and freed reported or not, the view's
 * stale flag), empties of random pairs (out of range, repeated) and clears. After every call it
 * compares all of both sides: slots, key table, clock, slot count, frames, views, loads,
 * results, stale flags, working sets, the shared tally, the stack, the whole frame pool and the
 * missing count, and what drop, empty and clear report; it fails if the walk never met one of
 * the rules it tracks. Then each argument check and -EINVAL/-EOVERFLOW verdict of region.cu,
 * the clamp of a grow at KVT_REGION_MAX_SLOTS, and a region without frame[].
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "fake_cudart.h"
#include "gpu.h"
#include "policy.h"
#include "region.h"

#define N 12288

static int fail(const char *what)
{
	fprintf(stderr, "fake_selftest: %s\n", what);
	return 1;
}

static int reuse(void)
{
	unsigned char *h, *h2, back[N];
	void *d, *d2;

	if (cudaHostAlloc((void **)&h, N, 0) || cudaMalloc(&d, N))
		return fail("allocation");
	memset(h, 7, N);
	if (cudaMemcpy(d, h, N, cudaMemcpyHostToDevice))
		return fail("copy in");
	if (cudaFreeHost(h) || cudaFree(d))
		return fail("free");
	if (cudaHostAlloc((void **)&h2, N, 0) || cudaMalloc(&d2, N))
		return fail("allocation after free");
	for (size_t i = 0; i < N; i++)
		if (h2[i] != 0xab)
			return fail("reused pinned memory is not poisoned afresh");
	if (cudaMemcpy(back, d2, N, cudaMemcpyDeviceToHost))
		return fail("copy out");
	for (size_t i = 0; i < N; i++)
		if (back[i] != 0xcd)
			return fail("reused device memory is not poisoned afresh");
	if (cudaFreeHost(h2) || cudaFree(d2))
		return fail("free after reuse");
	return 0;
}

#define TABLE_N 600

/* The table (see the top): 0 when every lookup found the right allocation. */
static int table(void)
{
	static unsigned char *p[TABLE_N];
	static size_t sz[TABLE_N];
	uint32_t rng = 12345;

	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < TABLE_N; i++) {
			if (p[i])
				continue;
			rng = rng * 1664525u + 1013904223u;
			sz[i] = 1 + (rng >> 8) % 20000;
			if (i % 2 ? cudaHostAlloc((void **)&p[i], sz[i], 0)
				  : cudaMalloc((void **)&p[i], sz[i]))
				return fail("table: allocation");
		}
		for (int i = 0; i < TABLE_N; i++) {
			unsigned char v[2] = {(unsigned char)i, (unsigned char)(i * 7 + round)},
				      w[2];
			enum cudaMemcpyKind in = i % 2 ? cudaMemcpyHostToHost
						       : cudaMemcpyHostToDevice,
					    out = i % 2 ? cudaMemcpyHostToHost
							: cudaMemcpyDeviceToHost;
			void *d;

			if (cudaMemcpy(p[i], &v[0], 1, in) ||
			    cudaMemcpy(p[i] + sz[i] - 1, &v[1], 1, in) ||
			    cudaMemcpy(&w[0], p[i], 1, out) ||
			    cudaMemcpy(&w[1], p[i] + sz[i] - 1, 1, out))
				return fail("table: a copy to or from an allocation's edge");
			if (w[0] != v[0] || w[1] != v[1])
				return fail("table: an allocation's edges read back wrong");
			if (i % 2 && (cudaHostGetDevicePointer(&d, p[i] + sz[i] / 2, 0) ||
				      d != p[i] + sz[i] / 2))
				return fail("table: pinned memory not found from its middle");
		}
		for (int i = round; i < TABLE_N; i += 3) { /* a third freed, then made again */
			if (i % 2 ? cudaFreeHost(p[i]) : cudaFree(p[i]))
				return fail("table: free");
			p[i] = NULL;
		}
	}
	for (int i = 0; i < TABLE_N; i++)
		if (p[i] && (i % 2 ? cudaFreeHost(p[i]) : cudaFree(p[i])))
			return fail("table: free at the end");
	return 0;
}

static int write_after_free(void)
{
	unsigned char *h, *h2;

	if (cudaHostAlloc((void **)&h, N, 0))
		return fail("allocation");
	if (cudaFreeHost(h))
		return fail("free");
	h[N - 1] = 1; /* the bug the fake must catch */
	if (cudaHostAlloc((void **)&h2, N, 0))
		return fail("allocation after free");
	cudaFreeHost(h2);
	return 0; /* not caught: meson's should_fail turns this into a failure */
}

/* cudaFreeAsync (`free-async`): memory freed on a stream stays usable by the work queued there
   before the free, and is given back once the stream got there. 0 when so. */
static int free_async(void)
{
	unsigned char back[N];
	size_t before, after, total;
	cudaStream_t s;
	void *d, *d2;

	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMallocAsync(&d, N, s) ||
	    cudaMalloc(&d2, N))
		return fail("setup");
	if (cudaMemsetAsync(d, 5, N, s) || cudaMemcpyAsync(d2, d, N, cudaMemcpyDeviceToDevice, s))
		return fail("work before the free");
	if (cudaMemGetInfo(&before, &total) || cudaFreeAsync(d, s))
		return fail("cudaFreeAsync");
	if (cudaStreamSynchronize(s) || cudaMemGetInfo(&after, &total))
		return fail("the stream's wait");
	if (after != before + N)
		return fail("the memory was not given back when the stream got to its free");
	if (cudaMemcpy(back, d2, N, cudaMemcpyDeviceToHost) || cudaFree(d2))
		return fail("copy out");
	for (size_t i = 0; i < N; i++)
		if (back[i] != 5)
			return fail("the work queued before the free did not see its memory");
	return cudaStreamDestroy(s) ? fail("stream destroy") : 0;
}

/* `copy-seconds`: fake_cuda_copy_seconds counts the copies between pinned and device memory
   (a copy engine's on a GPU), both ways, and no other copy. 0 when so. */
static int copy_seconds(void)
{
	size_t n = (size_t)64 << 20;
	void *h, *d, *d2, *p = malloc(n);
	double c0, c1, c2, c3;

	if (!p || cudaMallocHost(&h, n) || cudaMalloc(&d, n) || cudaMalloc(&d2, n))
		return fail("setup");
	memset(p, 1, n);
	memset(h, 2, n);
	c0 = fake_cuda_copy_seconds();
	if (cudaMemcpy(d, p, n, cudaMemcpyHostToDevice) ||
	    cudaMemcpy(d2, d, n, cudaMemcpyDeviceToDevice))
		return fail("pageable and device-to-device copies");
	c1 = fake_cuda_copy_seconds();
	if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice))
		return fail("pinned to device");
	c2 = fake_cuda_copy_seconds();
	if (cudaMemcpy(h, d2, n, cudaMemcpyDeviceToHost))
		return fail("device to pinned");
	c3 = fake_cuda_copy_seconds();
	if (c1 != c0)
		return fail("a pageable or device-to-device copy was counted");
	if (!(c2 > c1) || !(c3 > c2))
		return fail("a copy between pinned and device memory was not counted");
	if (((unsigned char *)h)[n - 1] != 1)
		return fail("the copies did not copy");
	free(p);
	return cudaFree(d) || cudaFree(d2) || cudaFreeHost(h) ? fail("free") : 0;
}

/* `free-async-early`: work on another stream, not ordered after a cudaFreeAsync, that runs
   after the free touches freed memory, which the fake must stop (meson expects a failure). */
static int free_async_early(void)
{
	cudaStream_t s, t;
	void *d;

	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) ||
	    cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking) || cudaMalloc(&d, N))
		return fail("setup");
	if (cudaFreeAsync(d, s) || cudaMemsetAsync(d, 1, N, t))
		return fail("queueing");
	cudaStreamSynchronize(s); /* the free runs ... */
	cudaStreamSynchronize(t); /* ... and then the memset, on freed memory */
	return 0;		  /* not caught */
}

/* ---- the stand-ins ---------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 32);
}

/* n elements of dt: random values in [-1, 1), or (one in four) random bit patterns, NaN,
   infinities, zeros and subnormals among them. */
static void *rand_elems(enum kvt_dtype dt, size_t n)
{
	uint32_t es = kvt_dtype_size(dt);
	unsigned char *p = malloc(n * es + 1);

	for (size_t i = 0; p && i < n; i++) {
		uint32_t bits = rnd();
		float f = (float)rnd() / 2147483648.0f - 1.0f;

		if (rnd() % 4 == 0)
			memcpy(p + i * es, &bits, es);
		else
			kvt_from_f32(dt, &f, p + i * es, 1);
	}
	return p;
}

/* A device copy of n bytes at h (NULL when it fails). */
static void *to_device(const void *h, size_t n)
{
	void *d = NULL;

	if (cudaMalloc(&d, n))
		return NULL;
	if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)) {
		cudaFree(d);
		return NULL;
	}
	return d;
}

/* One fold of 5 sequences (init, add, skipped, add, init) into entries scattered over one
   device buffer, against the reference on a host copy of it. */
static int fold_case(enum kvt_dtype dt, uint32_t D, uint32_t H)
{
	static const int kind[5] = {1, 2, 0, 2, 1}; /* 0 skipped, 1 init, 2 add */
	static const uint32_t place[5] = {3, 0, 4, 1, 2};
	size_t es = kvt_dtype_size(dt), row = D * es, entry = H * 2 * row, all = 5 * entry;
	unsigned char *k = rand_elems(dt, 5 * (size_t)H * D), *want = rand_elems(dt, all / es);
	unsigned char *got = malloc(all), *dk = NULL, *dm = NULL;
	uint64_t at[5], *dat = NULL;
	int rc = 1;

	if (!k || !want || !got)
		goto out;
	dk = to_device(k, 5 * (size_t)H * row);
	dm = to_device(want, all);
	if (!dk || !dm)
		goto out;
	for (int i = 0; i < 5; i++) {
		unsigned char *e = want + place[i] * entry;

		at[i] = kind[i] ? (uint64_t)(uintptr_t)(dm + place[i] * entry) | (kind[i] == 1) : 0;
		for (uint32_t h = 0; kind[i] && h < H; h++) {
			const unsigned char *x = k + ((size_t)i * H + h) * row;

			if (kind[i] == 1)
				kvt_meta_init(dt, D, e + h * 2 * row, x);
			else
				kvt_meta_add(dt, D, e + h * 2 * row, x);
		}
	}
	dat = to_device(at, sizeof(at));
	if (!dat || kvt_gpu_meta_fold(dt, D, H, 5, dk, dat, NULL) ||
	    cudaMemcpy(got, dm, all, cudaMemcpyDeviceToHost))
		goto out;
	rc = memcmp(got, want, all) ? 2 : 0;
out:
	if (rc)
		fprintf(stderr, "fake_selftest: meta fold dtype %d, head_dim %u, %u heads: %s\n",
			(int)dt, D, H, rc == 2 ? "differs" : "a call failed");
	cudaFree(dat);
	cudaFree(dm);
	cudaFree(dk);
	free(got);
	free(want);
	free(k);
	return rc;
}

static int fold(void)
{
	uint64_t at = 0;
	uint16_t k = 0;

	for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_BF16; dt++)
		if (fold_case((enum kvt_dtype)dt, 7, 3) || fold_case((enum kvt_dtype)dt, 64, 2) ||
		    fold_case((enum kvt_dtype)dt, 1, 1))
			return 1;
	if (kvt_gpu_meta_fold((enum kvt_dtype)7, 8, 2, 1, &k, &at, NULL) != cudaErrorInvalidValue ||
	    kvt_gpu_meta_fold(KVT_DTYPE_F16, 8, 2, 1, NULL, &at, NULL) != cudaErrorInvalidValue ||
	    kvt_gpu_meta_fold(KVT_DTYPE_F16, 8, 2, 1, &k, NULL, NULL) != cudaErrorInvalidValue ||
	    kvt_gpu_meta_fold(KVT_DTYPE_F16, 8, 2, 0, NULL, NULL, NULL) ||
	    kvt_gpu_meta_fold(KVT_DTYPE_F16, 8, 0, 1, NULL, NULL, NULL) ||
	    kvt_gpu_meta_fold(KVT_DTYPE_F16, 0, 2, 1, NULL, NULL, NULL))
		return fail("meta fold: argument checks");
	return 0;
}

#define Q_N 3
#define Q_D 8
#define Q_H 2
#define Q_G 3
#define Q_LBT 2
#define Q_R 3

/* Three entries, the middle one without tokens (meta and key NULL), the others with more
   candidates than r: the selection against kvt_quest_select's on host copies. */
static int quest_case(enum kvt_dtype dt)
{
	static const uint32_t n_tok[Q_N] = {37, 0, 29}, sink[Q_N] = {4, 0, 0};
	static const uint32_t ring0[Q_N] = {30, 0, 28};
	size_t es = kvt_dtype_size(dt), row = Q_D * es, qb = (size_t)Q_H * Q_G * row;
	unsigned char *q = rand_elems(dt, (size_t)Q_N * Q_H * Q_G * Q_D), *dq = NULL;
	unsigned char *meta[Q_N] = {NULL}, *dmeta[Q_N] = {NULL};
	struct kvt_region_key *key[Q_N] = {NULL}, *dkey[Q_N] = {NULL};
	struct kvt_gpu_quest qs[Q_N], *dqs = NULL;
	uint32_t got[Q_N * Q_H * Q_R], want[Q_N * Q_H * Q_R], *dsel = NULL;
	float score[16], qf[(Q_G + 2) * Q_D];
	uint32_t cand[16 + Q_R];
	int rc = 1;

	if (!q || !(dq = to_device(q, Q_N * qb)))
		goto out;
	for (int i = 0; i < Q_N; i++) {
		uint32_t nb = (n_tok[i] + (1u << Q_LBT) - 1) >> Q_LBT;
		struct kvt_region rg = {0};
		struct kvt_region_geom g = {Q_H, Q_LBT, n_tok[i], sink[i], ring0[i]};

		qs[i] = (struct kvt_gpu_quest){NULL, NULL, n_tok[i], sink[i], ring0[i]};
		if (nb) {
			meta[i] = rand_elems(dt, (size_t)nb * Q_H * 2 * Q_D);
			key[i] = calloc((size_t)nb * Q_H, sizeof(*key[i]));
			if (!meta[i] || !key[i])
				goto out;
			for (uint32_t b = 0; b < nb * Q_H; b++)
				key[i][b].tk = (uint8_t)(rnd() % 8 == 0 ? 1u << Q_LBT : 0);
			dmeta[i] = to_device(meta[i], (size_t)nb * Q_H * 2 * row);
			dkey[i] = to_device(key[i], (size_t)nb * Q_H * sizeof(*key[i]));
			if (!dmeta[i] || !dkey[i])
				goto out;
			qs[i].meta = dmeta[i];
			qs[i].key = dkey[i];
		}
		rg.key = key[i];
		rg.cap_blocks = nb;
		kvt_quest_select(dt, Q_D, Q_G, &rg, &g, meta[i], q + i * qb, Q_R,
				 want + i * Q_H * Q_R, score, cand, qf);
	}
	if (!(dqs = to_device(qs, sizeof(qs))) || cudaMalloc((void **)&dsel, sizeof(got)) ||
	    kvt_gpu_quest_select(dt, Q_D, Q_H, Q_G, Q_LBT, Q_R, dqs, dq, dsel, Q_N, NULL) ||
	    cudaMemcpy(got, dsel, sizeof(got), cudaMemcpyDeviceToHost))
		goto out;
	rc = memcmp(got, want, sizeof(got)) ? 2 : 0;
	for (int j = 0; j < Q_H * Q_R; j++)
		if (want[Q_H * Q_R + j] != KVT_REGION_NONE) /* no token: no block */
			rc = 2;
out:
	if (rc)
		fprintf(stderr, "fake_selftest: quest selection dtype %d: %s\n", (int)dt,
			rc == 2 ? "differs" : "a call failed");
	cudaFree(dsel);
	cudaFree(dqs);
	for (int i = 0; i < Q_N; i++) {
		cudaFree(dkey[i]);
		cudaFree(dmeta[i]);
		free(key[i]);
		free(meta[i]);
	}
	cudaFree(dq);
	free(q);
	return rc;
}

static int quest(void)
{
	struct kvt_gpu_quest qs = {NULL, NULL, 0, 0, 0};
	uint32_t sel[4];
	float q[8];
	const int inval = cudaErrorInvalidValue;

	for (int dt = KVT_DTYPE_F32; dt <= KVT_DTYPE_BF16; dt++)
		if (quest_case((enum kvt_dtype)dt))
			return 1;
	/* no entry: success, whatever the rest; else every limit of quest.cu's entry point */
	if (kvt_gpu_quest_select((enum kvt_dtype)7, 0, 0, 0, 40, 0, NULL, NULL, NULL, 0, NULL) ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 1, 1, 2, 0, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 1, 1, 2, KVT_GPU_QUEST_MAX_R + 1, &qs, q, sel, 1,
				 NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 4097, 1, 1, 2, 1, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 1024, 1, 5, 2, 1, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 0, 1, 1, 2, 1, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 0, 1, 2, 1, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 1, 0, 2, 1, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 1, 1, 32, 1, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select((enum kvt_dtype)7, 8, 1, 1, 2, 1, &qs, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 65536, 1, 2, 1, &qs, q, sel, 32768, NULL) !=
		    inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 1, 1, 2, 1, NULL, q, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 1, 1, 2, 1, &qs, NULL, sel, 1, NULL) != inval ||
	    kvt_gpu_quest_select(KVT_DTYPE_F32, 8, 1, 1, 2, 1, &qs, q, NULL, 1, NULL) != inval)
		return fail("quest selection: argument checks");
	return 0;
}

/* ---- the recall-region stand-ins (fake_region.c) --------------------------------------------- */

#define RG_N 3		    /* regions */
#define RG_H 2		    /* kv heads */
#define RG_R 4		    /* selection per head */
#define RG_HR (RG_H * RG_R) /* lookups a call at most */
#define RG_LBT 2	    /* blocks of 4 tokens */
#define RG_BT (1u << RG_LBT)
#define RG_CAPB 12 /* blocks */
#define RG_KEYS (RG_CAPB * RG_H)
#define RG_CAPS 10   /* slots a region may grow to */
#define RG_FRAMES 24 /* the frame pool; more than the regions can hold */
#define RG_BB 48     /* block bytes */
#define RG_STEPS 1500
#define RG_SINK 2

/* One region: the reference's state and the outputs of its latest calls (host), and the
   device's copy, an allocation per array (so an overrun of one stops the fake). */
struct rgt {
	struct kvt_region rg; /* over slot, key and link */
	struct kvt_region_slot slot[RG_CAPS];
	struct kvt_region_key key[RG_KEYS];
	struct kvt_region_link link[RG_CAPS];
	uint32_t frame[RG_CAPS], sel[RG_HR], view[RG_HR], view_n[RG_H];
	struct kvt_region_load load[RG_HR];
	uint32_t n_load, stale, bucket[4], n_tokens, ring0;
	int32_t err;
	bool has_stale;
	struct kvt_ws ws;	 /* bucket NULL: none kept */
	uint64_t group[RG_CAPB]; /* the device array's values */
	unsigned char *rows;	 /* pinned: block b's host group at rows + b * RG_H * RG_BB */
	struct {
		struct kvt_region_slot *slot;
		struct kvt_region_key *key;
		uint32_t *clock, *n_slots, *frame, *sel, *view, *view_n, *n_load, *stale, *bucket;
		struct kvt_region_load *load;
		struct kvt_ws *ws;
		int32_t *err;
		uint64_t *group;
	} d;
};

static struct {
	struct rgt g[RG_N];
	struct kvt_region_tally tally;
	uint32_t stack[RG_FRAMES], n_free, missing,
		fresh;			       /* the free-frame stack: free[], n_free */
	unsigned char pool[RG_FRAMES * RG_BB]; /* the device frames, as they should be */
	bool ws_off;			       /* region 2's descriptor has no ws */
	cudaStream_t st;
	/* device: */
	struct kvt_region_tally *tally_d;
	struct kvt_gpu_region *desc;
	uint32_t *stack_d, *missing_d, *fresh_d, *arg, *arg2, *out, *gone, *had;
	unsigned char *pool_d;
	void *mem[64];
	int n_mem;
	bool oom; /* an allocation failed */
} T;

/* How often the walk met each rule: each must be met (else the walk proves nothing of it). */
static struct {
	uint32_t calls, hits, reloads, evictions, enospc, grow_stack, grow_caller, drops, taken,
		moved, moved_empty, empty_had, empty_repeat, clear_freed, copied, missing;
} cov;
static const char *const cov_name[] = {"calls that found slots for their misses",
				       "hits",
				       "reloads",
				       "evictions",
				       "-ENOSPC",
				       "grows off the stack",
				       "grows by the caller",
				       "drops",
				       "drops taking a slot of the view",
				       "drops moving one into the dropped place",
				       "drops moving an empty slot",
				       "empties of a key",
				       "repeated empties",
				       "clears pushing frames",
				       "gathered blocks",
				       "blocks not in DRAM"};

static int rg_fail(uint32_t step, const char *what)
{
	fprintf(stderr, "fake_selftest: recall regions, step %u: %s\n", step, what);
	return 1;
}

static void *rg_alloc(size_t n)
{
	void *d = NULL;

	if (T.n_mem == (int)(sizeof(T.mem) / sizeof(T.mem[0])) || cudaMalloc(&d, n)) {
		T.oom = true;
		return NULL;
	}
	return T.mem[T.n_mem++] = d;
}

static int put(void *d, const void *h, size_t n)
{
	return n && cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess;
}

static int get(void *h, const void *d, size_t n)
{
	return n && cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) != cudaSuccess;
}

static bool chance(uint32_t percent)
{
	return rnd() % 100 < percent;
}

static struct kvt_region_geom rg_geom(const struct rgt *g)
{
	return (struct kvt_region_geom){RG_H, RG_LBT, g->n_tokens, RG_SINK, g->ring0};
}

static struct kvt_gpu_region rg_desc(struct rgt *g)
{
	return (struct kvt_gpu_region){
		.slot = g->d.slot,
		.key = g->d.key,
		.clock = g->d.clock,
		.n_slots = g->d.n_slots,
		.frame = g->d.frame,
		.ws = g == &T.g[2] && T.ws_off ? NULL : g->d.ws,
		.sel = g->d.sel,
		.view = g->d.view,
		.view_n = g->d.view_n,
		.load = g->d.load,
		.n_load = g->d.n_load,
		.tally = T.tally_d, /* shared */
		.err = g->d.err,
		.stale = g->has_stale ? g->d.stale : NULL,
		.group = g->d.group,
		.n_heads = RG_H,
		.r = RG_R,
		.lbt = RG_LBT,
		.n_tokens = g->n_tokens,
		.sink = RG_SINK,
		.ring0 = g->ring0,
		.cap_blocks = RG_CAPB,
	};
}

static int rg_put_desc(void)
{
	struct kvt_gpu_region d[RG_N];

	for (int i = 0; i < RG_N; i++)
		d[i] = rg_desc(&T.g[i]);
	return put(T.desc, d, sizeof(d));
}

/* Everything of the device side against the reference, after the stream's work. */
static int rg_compare(uint32_t step)
{
	struct kvt_region_tally tally;
	static unsigned char pool[RG_FRAMES * RG_BB];
	uint32_t stack[RG_FRAMES], missing, fresh;

	if (cudaStreamSynchronize(T.st))
		return rg_fail(step, "stream synchronize");
	for (int i = 0; i < RG_N; i++) {
		struct rgt *g = &T.g[i];
		struct kvt_region_slot slot[RG_CAPS];
		struct kvt_region_key key[RG_KEYS];
		struct kvt_region_load load[RG_HR];
		uint32_t ns, clock, frame[RG_CAPS], view[RG_HR], view_n[RG_H], n_load, stale, b[4];
		struct kvt_ws ws;
		int32_t err;

		if (get(&ns, g->d.n_slots, 4) || get(&clock, g->d.clock, 4) ||
		    get(key, g->d.key, sizeof(key)) || get(view_n, g->d.view_n, sizeof(view_n)) ||
		    get(view, g->d.view, sizeof(view)) || get(&n_load, g->d.n_load, 4) ||
		    get(&err, g->d.err, 4) || get(&stale, g->d.stale, 4) ||
		    get(&ws, g->d.ws, sizeof(ws)) || get(b, g->d.bucket, sizeof(b)))
			return rg_fail(step, "copy back");
		if (ns != g->rg.n_slots || clock != g->rg.clock)
			return rg_fail(step, "slot count or clock differs");
		if (get(slot, g->d.slot, ns * sizeof(*slot)) ||
		    get(frame, g->d.frame, ns * sizeof(*frame)) ||
		    get(load, g->d.load, n_load <= RG_HR ? n_load * sizeof(*load) : 0))
			return rg_fail(step, "copy back");
		if (memcmp(slot, g->slot, ns * sizeof(*slot)) || memcmp(key, g->key, sizeof(key)))
			return rg_fail(step, "slots or key table differ");
		if (memcmp(frame, g->frame, ns * sizeof(*frame)))
			return rg_fail(step, "frames differ");
		if (memcmp(view_n, g->view_n, sizeof(view_n)))
			return rg_fail(step, "view counts differ");
		for (int h = 0; h < RG_H; h++)
			if (memcmp(view + h * RG_R, g->view + h * RG_R, view_n[h] * sizeof(*view)))
				return rg_fail(step, "views differ");
		if (n_load != g->n_load || memcmp(load, g->load, n_load * sizeof(*load)))
			return rg_fail(step, "loads differ");
		if (err != g->err)
			return rg_fail(step, "results differ");
		if (stale != g->stale)
			return rg_fail(step, "stale flags differ");
		if (ws.bucket != (g->ws.bucket ? g->d.bucket : NULL) || ws.w != g->ws.w ||
		    ws.step != g->ws.step || ws.cur != g->ws.cur || ws.total != g->ws.total ||
		    memcmp(b, g->bucket, sizeof(b)))
			return rg_fail(step, "working sets differ");
	}
	if (get(&tally, T.tally_d, sizeof(tally)) || get(stack, T.stack_d, sizeof(stack)) ||
	    get(pool, T.pool_d, sizeof(pool)) || get(&missing, T.missing_d, 4) ||
	    get(&fresh, T.fresh_d, 4))
		return rg_fail(step, "copy back");
	if (memcmp(&tally, &T.tally, sizeof(tally)))
		return rg_fail(step, "tallies differ");
	if (memcmp(stack, T.stack, T.n_free * sizeof(*stack)))
		return rg_fail(step, "free-frame stacks differ");
	if (memcmp(pool, T.pool, sizeof(pool)))
		return rg_fail(step, "frame pools differ");
	if (missing != T.missing)
		return rg_fail(step, "missing counts differ");
	if (fresh != T.fresh)
		return rg_fail(step, "counts of loads into empty slots differ");
	return 0;
}

static int rg_setup(void)
{
	if (cudaStreamCreate(&T.st))
		return rg_fail(0, "stream");
	T.tally_d = rg_alloc(sizeof(T.tally));
	T.desc = rg_alloc(RG_N * sizeof(*T.desc));
	T.stack_d = rg_alloc(sizeof(T.stack));
	T.missing_d = rg_alloc(4);
	T.fresh_d = rg_alloc(4);
	T.arg = rg_alloc(4 * RG_N);
	T.arg2 = rg_alloc(4 * RG_N);
	T.out = rg_alloc(sizeof(T.stack));
	T.gone = rg_alloc(4 * RG_N);
	T.had = rg_alloc(4 * 8);
	T.pool_d = rg_alloc(sizeof(T.pool));
	if (T.oom)
		return rg_fail(0, "allocation");
	/* the free frames in a random order; the pool's bytes random */
	for (uint32_t f = 0; f < RG_FRAMES; f++) {
		uint32_t at = rnd() % (f + 1);

		T.stack[f] = T.stack[at];
		T.stack[at] = f;
	}
	T.n_free = RG_FRAMES;
	for (size_t x = 0; x < sizeof(T.pool); x++)
		T.pool[x] = (unsigned char)rnd();
	if (put(T.tally_d, &T.tally, sizeof(T.tally)) || put(T.stack_d, T.stack, sizeof(T.stack)) ||
	    put(T.pool_d, T.pool, sizeof(T.pool)) || put(T.missing_d, &T.missing, 4) ||
	    put(T.fresh_d, &T.fresh, 4))
		return rg_fail(0, "upload");
	for (int i = 0; i < RG_N; i++) {
		struct rgt *g = &T.g[i];
		size_t rows = (size_t)RG_CAPB * RG_H * RG_BB;
		struct kvt_ws dws;

		g->rg = (struct kvt_region){.slot = g->slot,
					    .key = g->key,
					    .cap_blocks = RG_CAPB,
					    .link = g->link,
					    .head = KVT_REGION_PENDING,
					    .tail = KVT_REGION_PENDING,
					    .empty_end = KVT_REGION_PENDING};
		for (int k = 0; k < RG_KEYS; k++) /* a few blocks partly top-K: some resident */
			g->key[k].tk = (uint8_t)(chance(15) ? rnd() % (RG_BT + 1) : 0);
		g->n_tokens = 9 + 3 * (uint32_t)i;
		g->ring0 = g->n_tokens - 3;
		g->has_stale = i != 2;
		/* region 0 and 1 keep a working set (windows of 4 and 3 steps), region 2 one
		   without buckets */
		g->ws = (struct kvt_ws){.bucket = i < 2 ? g->bucket : NULL,
					.w = i < 2 ? 4 - (uint32_t)i : 0};
		if (cudaHostAlloc((void **)&g->rows, rows, 0))
			return rg_fail(0, "pinned allocation");
		for (size_t x = 0; x < rows; x++)
			g->rows[x] = (unsigned char)rnd();
		for (int b = 0; b < RG_CAPB; b++)
			g->group[b] =
				chance(80)
					? (uint64_t)(uintptr_t)(g->rows + (size_t)b * RG_H * RG_BB)
					: 0;
		g->d.slot = rg_alloc(sizeof(g->slot));
		g->d.key = rg_alloc(sizeof(g->key));
		g->d.clock = rg_alloc(4);
		g->d.n_slots = rg_alloc(4);
		g->d.frame = rg_alloc(sizeof(g->frame));
		g->d.sel = rg_alloc(sizeof(g->sel));
		g->d.view = rg_alloc(sizeof(g->view));
		g->d.view_n = rg_alloc(sizeof(g->view_n));
		g->d.n_load = rg_alloc(4);
		g->d.stale = rg_alloc(4);
		g->d.bucket = rg_alloc(sizeof(g->bucket));
		g->d.load = rg_alloc(sizeof(g->load));
		g->d.ws = rg_alloc(sizeof(g->ws));
		g->d.err = rg_alloc(4);
		g->d.group = rg_alloc(sizeof(g->group));
		if (T.oom)
			return rg_fail(0, "allocation");
		/* the device's slots and frames start as garbage (the fake's poison) */
		dws = g->ws;
		dws.bucket = g->ws.bucket ? g->d.bucket : NULL;
		if (put(g->d.key, g->key, sizeof(g->key)) || put(g->d.clock, &g->rg.clock, 4) ||
		    put(g->d.n_slots, &g->rg.n_slots, 4) ||
		    put(g->d.view, g->view, sizeof(g->view)) ||
		    put(g->d.view_n, g->view_n, sizeof(g->view_n)) ||
		    put(g->d.n_load, &g->n_load, 4) || put(g->d.stale, &g->stale, 4) ||
		    put(g->d.bucket, g->bucket, sizeof(g->bucket)) ||
		    put(g->d.ws, &dws, sizeof(dws)) || put(g->d.err, &g->err, 4) ||
		    put(g->d.group, g->group, sizeof(g->group)))
			return rg_fail(0, "upload");
	}
	return rg_put_desc() || rg_compare(0);
}

static void rg_teardown(void)
{
	for (int i = 0; i < T.n_mem; i++)
		cudaFree(T.mem[i]);
	for (int i = 0; i < RG_N; i++)
		cudaFreeHost(T.g[i].rows);
	if (T.st)
		cudaStreamDestroy(T.st);
}

/* Whether the reference's latest view of g names slot s. */
static bool ref_view_has(const struct rgt *g, uint32_t s)
{
	for (int h = 0; h < RG_H; h++)
		for (uint32_t x = 0; x < g->view_n[h]; x++)
			if (g->view[h * RG_R + x] == s)
				return true;
	return false;
}

/* FlashH2D of the loads of regions [lo, lo + n), after their recall. */
static int op_gather(uint32_t step, uint32_t lo, uint32_t n)
{
	bool count = chance(70), fresh = chance(70);

	T.missing = 0;
	T.fresh = 7;
	if (put(T.missing_d, &T.missing, 4) || put(T.fresh_d, &T.fresh, 4) ||
	    kvt_gpu_region_gather(T.desc + lo, n, RG_BB, (uint64_t)(uintptr_t)T.pool_d, 0,
				  count ? T.missing_d : NULL, fresh ? T.fresh_d : NULL, T.st))
		return rg_fail(step, "gather");
	for (uint32_t i = lo; i < lo + n; i++) {
		struct rgt *g = &T.g[i];

		for (uint32_t x = 0; x < g->n_load; x++) {
			const struct kvt_region_load *ld = &g->load[x];
			uint32_t b = ld->key / RG_H, h = ld->key % RG_H;

			T.fresh += fresh && ld->old == KVT_REGION_NONE; /* copied or not */

			if (!g->group[b]) {
				g->stale |= g->has_stale;
				T.missing += count;
				cov.missing++;
				continue;
			}
			memcpy(T.pool + (size_t)g->frame[ld->slot] * RG_BB,
			       g->rows + ((size_t)b * RG_H + h) * RG_BB, RG_BB);
			cov.copied++;
		}
	}
	return rg_compare(step);
}

static int recall_run(uint32_t step, uint32_t lo, uint32_t n);

/* One recall on regions [lo, lo + n): their token counts move, new selections, new views (not
   stale). */
static int op_recall(uint32_t step, uint32_t lo, uint32_t n)
{
	for (uint32_t i = lo; i < lo + n; i++) {
		struct rgt *g = &T.g[i];
		uint32_t nb;

		if (chance(40) &&
		    g->n_tokens < RG_CAPB * RG_BT) /* a decode step: the last block grows */
			g->n_tokens++;
		else if (chance(3)) /* back, or a jump past the window */
			g->n_tokens = 1 + rnd() % (RG_CAPB * RG_BT);
		g->ring0 = g->n_tokens > RG_SINK + 3 ? g->n_tokens - 3 : RG_SINK;
		nb = (g->n_tokens + RG_BT - 1) >> RG_LBT;
		for (int x = 0; x < RG_HR; x++)
			g->sel[x] = chance(12)	 ? KVT_REGION_NONE
				    : chance(50) ? nb - 1 - rnd() % (nb < 3 ? nb : 3)
						 : rnd() % nb;
		if (chance(10)) { /* top-K positions change */
			g->key[rnd() % RG_KEYS].tk = (uint8_t)(rnd() % (RG_BT + 1));
			if (put(g->d.key, g->key, sizeof(g->key)))
				return rg_fail(step, "upload");
		}
		g->stale = 0;
		if (put(g->d.sel, g->sel, sizeof(g->sel)) || put(g->d.stale, &g->stale, 4))
			return rg_fail(step, "upload");
	}
	T.ws_off = chance(50);
	if (recall_run(step, lo, n))
		return 1;
	return chance(60) ? op_gather(step, lo, n) : 0;
}

/* The recall of regions [lo, lo + n) with their selections, on both sides. */
static int recall_run(uint32_t step, uint32_t lo, uint32_t n)
{
	if (rg_put_desc() || kvt_gpu_region_recall(T.desc + lo, n, T.st))
		return rg_fail(step, "recall");
	for (uint32_t i = lo; i < lo + n; i++) {
		struct rgt *g = &T.g[i];
		struct kvt_region_geom geom = rg_geom(g);
		uint32_t hits = T.tally.hits, ev = T.tally.evictions;

		g->err = kvt_region_recall(&g->rg, &geom, g->sel, RG_R, &g->ws, g->view, g->view_n,
					   g->load, &g->n_load, &T.tally);
		cov.hits += T.tally.hits - hits;
		cov.evictions += T.tally.evictions - ev;
		cov.calls += g->err == 0;
		cov.enospc += g->err == -ENOSPC;
		for (uint32_t x = 0; x < g->n_load; x++)
			cov.reloads += g->load[x].old == g->load[x].key;
	}
	return rg_compare(step);
}

/* Grows regions [lo, lo + n) to random sizes with frames off the free stack: popped by the
   stand-in (the stack and offsets), or by the caller. */
static int op_grow(uint32_t step, uint32_t lo, uint32_t n)
{
	uint32_t want[RG_N], in_off[RG_N], top = T.n_free;
	bool stack = chance(70);

	for (uint32_t i = lo; i < lo + n; i++) {
		uint32_t had = T.g[i].rg.n_slots, w = chance(50) ? RG_CAPS : rnd() % (RG_CAPS + 1);

		if (w > had && w - had > top)
			w = had + top;
		want[i - lo] = w;
		in_off[i - lo] = top;
		if (w > had)
			top -= w - had;
	}
	if (put(T.arg, want, 4 * n) || put(T.arg2, in_off, 4 * n) ||
	    kvt_gpu_region_grow(T.desc + lo, T.arg, stack ? T.stack_d : NULL, stack ? T.arg2 : NULL,
				n, T.st))
		return rg_fail(step, "grow");
	for (uint32_t i = lo; i < lo + n; i++) {
		struct rgt *g = &T.g[i];
		uint32_t had = g->rg.n_slots, w = want[i - lo];

		for (uint32_t s = had; s < w; s++) /* the manager's region_grow */
			g->frame[s] = T.stack[--T.n_free];
		kvt_region_grow(&g->rg, w);
		if (!stack && w > had && put(g->d.frame + had, g->frame + had, (w - had) * 4))
			return rg_fail(step, "upload");
		cov.grow_stack += stack && w > had;
		cov.grow_caller += !stack && w > had;
	}
	return rg_compare(step);
}

/* k random drops on each of regions [lo, lo + n), the frames pushed on the stack: by the
   stand-in (freed at the offsets) or by the caller from what the reference freed. */
static int op_drop(uint32_t step, uint32_t lo, uint32_t n)
{
	uint32_t k[RG_N], off[RG_N], gone[RG_N], at = T.n_free, dropped[RG_FRAMES];
	const uint32_t base = T.n_free;
	const int outs = (int)(rnd() % 3); /* 0: dropped and freed, 1: freed, 2: neither */
	const bool with_gone = chance(50);

	for (uint32_t i = lo; i < lo + n; i++) {
		uint32_t ns = T.g[i].rg.n_slots;

		k[i - lo] = rnd() % 5;
		off[i - lo] = at;
		at += k[i - lo] < ns ? k[i - lo] : ns;
	}
	if (put(T.arg, k, 4 * n) || put(T.arg2, off, 4 * n) ||
	    kvt_gpu_region_drop(T.desc + lo, T.arg, outs < 2 ? T.arg2 : NULL,
				outs == 0 ? T.out : NULL, outs < 2 ? T.stack_d : NULL,
				with_gone ? T.gone : NULL, n, T.st))
		return rg_fail(step, "drop");
	for (uint32_t i = lo; i < lo + n; i++) {
		struct rgt *g = &T.g[i];
		uint32_t cnt = k[i - lo] < g->rg.n_slots ? k[i - lo] : g->rg.n_slots;

		gone[i - lo] = 0;
		for (uint32_t t = 0; t < cnt; t++) {
			uint32_t d, f;
			bool taken, moved;

			gone[i - lo] += kvt_region_drop(&g->rg, g->frame, &d, &f);
			T.stack[T.n_free++] = f;
			dropped[off[i - lo] + t] = d;
			/* manager/recall.c's region_shrink with mark */
			taken = ref_view_has(g, d);
			moved = ref_view_has(g, g->rg.n_slots);
			if (g->has_stale && (taken || moved))
				g->stale = 1;
			cov.drops++;
			cov.taken += g->has_stale && taken;
			cov.moved += g->has_stale && !taken && moved;
			cov.moved_empty += d < g->rg.n_slots && g->slot[d].stamp == 0;
		}
	}
	if (outs == 2 && put(T.stack_d + base, T.stack + base, (T.n_free - base) * 4))
		return rg_fail(step, "upload");
	if (rg_compare(step))
		return 1;
	if (outs == 0) {
		uint32_t got[RG_FRAMES];

		if (get(got + base, T.out + base, (T.n_free - base) * 4) ||
		    memcmp(got + base, dropped + base, (T.n_free - base) * 4))
			return rg_fail(step, "dropped slots differ");
	}
	if (with_gone) {
		uint32_t got[RG_N];

		if (get(got, T.gone, 4 * n) || memcmp(got, gone, 4 * n))
			return rg_fail(step, "forgotten keys of drops differ");
	}
	return 0;
}

/* Empties of random (region, slot) pairs: regions and slots out of range, repeats. */
static int op_empty(uint32_t step)
{
	uint32_t pairs[8][2], had[8], got[8], n = 1 + rnd() % 8;
	const bool with_had = chance(70);

	for (uint32_t x = 0; x < n; x++) {
		if (x && chance(25)) {
			memcpy(pairs[x], pairs[rnd() % x], sizeof(pairs[x]));
			continue;
		}
		pairs[x][0] = rnd() % (RG_N + 1);
		pairs[x][1] = rnd() % (RG_CAPS + 1);
	}
	if (put(T.out, pairs, sizeof(pairs)) ||
	    kvt_gpu_region_empty(T.desc, RG_N, T.out, with_had ? T.had : NULL, n, T.st))
		return rg_fail(step, "empty");
	for (uint32_t x = 0; x < n; x++) {
		uint32_t ri = pairs[x][0];

		had[x] = ri < RG_N ? kvt_region_empty(&T.g[ri].rg, pairs[x][1]) : 0;
		cov.empty_had += had[x];
		for (uint32_t y = 0; y < x; y++)
			cov.empty_repeat += !memcmp(pairs[x], pairs[y], sizeof(pairs[x]));
	}
	if (rg_compare(step))
		return 1;
	if (!with_had)
		return 0;
	if (get(got, T.had, 4 * n))
		return rg_fail(step, "copy back");
	/* of a repeated pair's copies, one (which is not fixed) reports the key */
	for (uint32_t x = 0; x < n; x++) {
		uint32_t want = 0, sum = 0;

		for (uint32_t y = 0; y < n; y++)
			if (!memcmp(pairs[x], pairs[y], sizeof(pairs[x]))) {
				want += had[y];
				sum += got[y];
			}
		if (got[x] > 1 || sum != want)
			return rg_fail(step, "what empties report differs");
	}
	return 0;
}

/* Clears regions [lo, lo + n), their frames pushed by the stand-in (freed) or the caller. */
static int op_clear(uint32_t step, uint32_t lo, uint32_t n)
{
	uint32_t off[RG_N], gone[RG_N], got[RG_N], at = T.n_free;
	const uint32_t base = T.n_free;
	const bool freed = chance(60), with_gone = chance(50);

	for (uint32_t i = lo; i < lo + n; i++) {
		off[i - lo] = at;
		at += T.g[i].rg.n_slots;
	}
	if (put(T.arg2, off, 4 * n) ||
	    kvt_gpu_region_clear(T.desc + lo, with_gone ? T.gone : NULL, freed ? T.arg2 : NULL,
				 freed ? T.stack_d : NULL, n, T.st))
		return rg_fail(step, "clear");
	for (uint32_t i = lo; i < lo + n; i++) { /* manager/recall.c's kvt_recall_drop_seq */
		struct rgt *g = &T.g[i];

		for (uint32_t s = 0; s < g->rg.n_slots; s++)
			T.stack[T.n_free++] = g->frame[s];
		cov.clear_freed += freed && g->rg.n_slots;
		gone[i - lo] = kvt_region_clear(&g->rg);
	}
	if (!freed && put(T.stack_d + base, T.stack + base, (T.n_free - base) * 4))
		return rg_fail(step, "upload");
	if (rg_compare(step))
		return 1;
	if (with_gone && (get(got, T.gone, 4 * n) || memcmp(got, gone, 4 * n)))
		return rg_fail(step, "forgotten keys of clears differ");
	return 0;
}

/* Blocks leave DRAM or come back; host rows change. */
static int op_groups(uint32_t step)
{
	struct rgt *g = &T.g[rnd() % RG_N];
	uint32_t b = rnd() % RG_CAPB;

	g->group[b] = g->group[b] ? 0 : (uint64_t)(uintptr_t)(g->rows + (size_t)b * RG_H * RG_BB);
	for (int x = 0; x < RG_H * RG_BB; x++)
		g->rows[(size_t)b * RG_H * RG_BB + x] = (unsigned char)rnd();
	if (put(g->d.group, g->group, sizeof(g->group)))
		return rg_fail(step, "upload");
	return 0;
}

/* A recall that must fail with err on region 0, changing nothing else. */
static int recall_refused(uint32_t step, struct kvt_gpu_region d, int32_t err, bool sel_flaw)
{
	struct rgt *g = &T.g[0];

	g->err = err;
	g->n_load = 0;
	if (sel_flaw) /* a block past the layer or its key table: the view emptied too */
		memset(g->view_n, 0, sizeof(g->view_n));
	if (put(T.desc, &d, sizeof(d)) || kvt_gpu_region_recall(T.desc, 1, T.st))
		return rg_fail(step, "recall");
	return rg_compare(step);
}

/* The verdicts of region.cu's check_call on region 0, each next to a call that passes, and
   -EOVERFLOW before them. */
static int rg_verdicts(uint32_t step)
{
	struct rgt *g = &T.g[0];
	uint32_t max = UINT32_MAX, clock = g->rg.clock, big = KVT_REGION_MAX_SLOTS + 1;
	struct kvt_gpu_region d, x;

	/* a layer of blocks 0 to 4, each selected */
	g->n_tokens = 5 * RG_BT - 1;
	g->ring0 = g->n_tokens - 3;
	for (int j = 0; j < RG_HR; j++)
		g->sel[j] = (uint32_t)j % 5;
	if (put(g->d.sel, g->sel, sizeof(g->sel)) || recall_run(step, 0, 1))
		return 1;
	if (g->err && g->err != -ENOSPC)
		return rg_fail(step, "the reference refuses the control call");
	d = rg_desc(g);
	g->sel[RG_HR - 1] = 5; /* past the layer's last block */
	if (put(g->d.sel, g->sel, sizeof(g->sel)) || recall_refused(step, d, -EINVAL, true))
		return 1;
	g->sel[RG_HR - 1] = RG_CAPB; /* past cap_blocks */
	if (put(g->d.sel, g->sel, sizeof(g->sel)) || recall_refused(step, d, -EINVAL, true))
		return 1;
	/* a spent clock comes first; the reference agrees */
	g->rg.clock = UINT32_MAX;
	if (put(g->d.clock, &max, 4) || recall_refused(step, d, -EOVERFLOW, false))
		return 1;
	g->sel[RG_HR - 1] = 4;
	if (put(g->d.sel, g->sel, sizeof(g->sel)) || recall_run(step, 0, 1))
		return 1;
	if (g->err != -EOVERFLOW)
		return rg_fail(step, "the reference's clock is not spent");
	g->rg.clock = clock;
	if (put(g->d.clock, &clock, 4))
		return rg_fail(step, "upload");
	x = d, x.ring0 = RG_SINK - 1;
	if (recall_refused(step, x, -EINVAL, false))
		return 1;
	x = d, x.n_heads = KVT_GPU_REGION_MAX_HEADS + 1;
	if (recall_refused(step, x, -EINVAL, false))
		return 1;
	x = d, x.lbt = 32;
	if (recall_refused(step, x, -EINVAL, false))
		return 1;
	x = d, x.cap_blocks = 0x80000000u; /* * 2 heads: past UINT32_MAX */
	if (recall_refused(step, x, -EINVAL, false))
		return 1;
	x = d, x.r = 0x80000000u;
	if (recall_refused(step, x, -EINVAL, false))
		return 1;
	if (put(g->d.n_slots, &big, 4) || put(T.desc, &d, sizeof(d)) ||
	    kvt_gpu_region_recall(T.desc, 1, T.st) || put(g->d.n_slots, &g->rg.n_slots, 4))
		return rg_fail(step, "recall");
	g->err = -EINVAL;
	g->n_load = 0;
	if (rg_compare(step) || recall_run(step, 0, 1))
		return 1;
	return g->err && g->err != -ENOSPC ? rg_fail(step, "the control call after") : 0;
}

/* Every entry point's own checks (cudaErrorInvalidValue, nothing launched) and n == 0. */
static int rg_args(void)
{
	const int inval = cudaErrorInvalidValue;
	const struct kvt_gpu_region *rg = T.desc;
	uint32_t *a = T.arg, *s = T.stack_d;

	if (kvt_gpu_region_recall(NULL, 0, NULL) ||
	    kvt_gpu_region_grow(NULL, NULL, s, NULL, 0, NULL) ||
	    kvt_gpu_region_drop(NULL, NULL, NULL, a, a, NULL, 0, NULL) ||
	    kvt_gpu_region_empty(NULL, 0, NULL, NULL, 0, NULL) ||
	    kvt_gpu_region_clear(NULL, NULL, a, NULL, 0, NULL) ||
	    kvt_gpu_region_gather(NULL, 0, 8, 0, 0, NULL, NULL, NULL))
		return rg_fail(0, "n == 0 does not succeed");
	if (kvt_gpu_region_recall(NULL, 1, NULL) != inval ||
	    kvt_gpu_region_recall(rg, 0x80000000u, NULL) != inval ||
	    kvt_gpu_region_grow(NULL, a, NULL, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_grow(rg, NULL, NULL, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_grow(rg, a, s, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_grow(rg, a, NULL, a, 1, NULL) != inval ||
	    kvt_gpu_region_grow(rg, a, NULL, NULL, 0x80000000u, NULL) != inval ||
	    kvt_gpu_region_drop(NULL, a, NULL, NULL, NULL, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_drop(rg, NULL, NULL, NULL, NULL, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_drop(rg, a, NULL, a, NULL, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_drop(rg, a, NULL, NULL, a, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_drop(rg, a, NULL, NULL, NULL, NULL, 0x80000000u, NULL) != inval ||
	    kvt_gpu_region_empty(NULL, 1, a, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_empty(rg, 1, NULL, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_clear(NULL, NULL, NULL, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_clear(rg, NULL, a, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_clear(rg, NULL, NULL, a, 1, NULL) != inval ||
	    kvt_gpu_region_clear(rg, NULL, NULL, NULL, 0x80000000u, NULL) != inval ||
	    kvt_gpu_region_gather(NULL, 1, 16, 0, 0, NULL, NULL, NULL) != inval ||
	    kvt_gpu_region_gather(rg, 1, 8, 0, 0, NULL, NULL, NULL) != inval ||
	    kvt_gpu_region_gather(rg, 1, 24, 0, 0, NULL, NULL, NULL) != inval ||
	    kvt_gpu_region_groups(NULL, (const uint64_t *)a, 1, NULL) != inval ||
	    kvt_gpu_region_groups((const uint64_t *)a, NULL, 1, NULL) != inval ||
	    kvt_gpu_region_groups(NULL, NULL, 0, NULL))
		return rg_fail(0, "argument checks");
	return 0;
}

/* kvt_gpu_region_groups writes its entries (distinct places of a table, a random order), and
   nothing else. */
static int rg_groups(void)
{
	enum { TABLE = 64, NG = 40 };
	uint64_t table[TABLE], want[TABLE], at[NG], val[NG], got[TABLE];
	uint64_t *table_d = rg_alloc(sizeof(table)), *at_d = rg_alloc(sizeof(at)),
		 *val_d = rg_alloc(sizeof(val));
	uint32_t perm[TABLE];

	if (T.oom)
		return rg_fail(0, "allocation");
	for (uint32_t i = 0; i < TABLE; i++) {
		table[i] = want[i] = ((uint64_t)rnd() << 32) | rnd();
		perm[i] = i;
	}
	for (uint32_t i = 0; i < NG; i++) {
		uint32_t j = i + rnd() % (TABLE - i), x = perm[i];

		perm[i] = perm[j];
		perm[j] = x;
		at[i] = (uint64_t)(uintptr_t)(table_d + perm[i]);
		val[i] = want[perm[i]] = ((uint64_t)rnd() << 32) | rnd();
	}
	if (put(table_d, table, sizeof(table)) || put(at_d, at, sizeof(at)) ||
	    put(val_d, val, sizeof(val)) || kvt_gpu_region_groups(at_d, val_d, NG, T.st) ||
	    get(got, table_d, sizeof(got)))
		return rg_fail(0, "groups");
	return memcmp(got, want, sizeof(got)) ? rg_fail(0, "group tables differ") : 0;
}

/* A grow past KVT_REGION_MAX_SLOTS stops there; a region without frame[] reports slot indices
   as its frames (drop's freed, clear's freed). Region 0's allocations with a larger slot
   array. */
static int rg_limits(uint32_t step)
{
	const uint32_t M = KVT_REGION_MAX_SLOTS, big = UINT32_MAX, one = 1, zero = 0;
	struct kvt_region_slot *slot = rg_alloc((size_t)M * sizeof(*slot)), s[2];
	uint32_t *pushed = rg_alloc((size_t)M * sizeof(*pushed));
	struct kvt_gpu_region d = rg_desc(&T.g[0]);
	uint32_t ns, out[3];

	if (!slot || !pushed)
		return rg_fail(step, "allocation");
	d.slot = slot;
	d.frame = NULL;
	if (put(d.n_slots, &zero, 4) || put(T.desc, &d, sizeof(d)) || put(T.arg, &big, 4) ||
	    kvt_gpu_region_grow(T.desc, T.arg, NULL, NULL, 1, T.st) ||
	    cudaStreamSynchronize(T.st) || get(&ns, d.n_slots, 4) || get(&s[0], slot, sizeof(*s)) ||
	    get(&s[1], slot + M - 1, sizeof(*s)))
		return rg_fail(step, "grow");
	if (ns != M || s[0].key != KVT_REGION_NONE || s[0].stamp || s[0].rank ||
	    s[1].key != KVT_REGION_NONE || s[1].stamp || s[1].rank != M - 1)
		return rg_fail(step, "a grow past KVT_REGION_MAX_SLOTS");
	/* the first slot dropped, the last moved into it; then a clear */
	if (put(T.arg, &one, 4) || put(T.arg2, &zero, 4) ||
	    kvt_gpu_region_drop(T.desc, T.arg, T.arg2, T.out, T.out + 1, NULL, 1, T.st) ||
	    kvt_gpu_region_clear(T.desc, NULL, T.arg2, pushed, 1, T.st) ||
	    cudaStreamSynchronize(T.st) || get(out, T.out, 2 * 4) || get(&ns, d.n_slots, 4))
		return rg_fail(step, "drop or clear");
	if (out[0] != 0 || out[1] != 0 || ns != 0)
		return rg_fail(step, "drop without frame[]");
	/* the clear pushed M - 1 slot indices in order: the first two */
	if (get(out, pushed, sizeof(out)) || out[0] != 0 || out[1] != 1 || out[2] != 2)
		return rg_fail(step, "clear without frame[]");
	return 0;
}

static int regions(void)
{
	int rc = 0;

	if (rg_setup() || rg_args() || rg_groups())
		rc = 1;
	for (uint32_t step = 1; !rc && step <= RG_STEPS; step++) {
		uint32_t op = rnd() % 100, lo = rnd() % RG_N, n = 1 + rnd() % (RG_N - lo);

		if (op < 40)
			rc = op_recall(step, lo, n);
		else if (op < 58)
			rc = op_grow(step, lo, n);
		else if (op < 76)
			rc = op_drop(step, lo, n);
		else if (op < 86)
			rc = op_empty(step);
		else if (op < 90)
			rc = op_clear(step, lo, n);
		else
			rc = op_groups(step);
	}
	_Static_assert(sizeof(cov) == sizeof(cov_name) / sizeof(*cov_name) * sizeof(uint32_t),
		       "a name per rule");
	for (size_t x = 0; !rc && x < sizeof(cov) / sizeof(uint32_t); x++) {
		uint32_t c;

		memcpy(&c, (const char *)&cov + x * sizeof(c), sizeof(c));
		printf("recall regions: %u %s\n", c, cov_name[x]);
		if (!c) {
			fprintf(stderr, "fake_selftest: recall regions: the walk met no %s\n",
				cov_name[x]);
			rc = 1;
		}
	}
	if (!rc)
		rc = rg_verdicts(RG_STEPS + 1) || rg_limits(RG_STEPS + 2);
	rg_teardown();
	return rc;
}

/* Two sequences folded into one entry: the stand-in's footprint check stops the process. */
static int fold_overlap(void)
{
	uint32_t k[2] = {1, 2};
	uint64_t at[2];
	void *dk = to_device(k, sizeof(k)), *dm, *dat;

	if (cudaMalloc(&dm, 2 * sizeof(uint32_t)) || !dk)
		return fail("allocation");
	at[0] = at[1] = (uint64_t)(uintptr_t)dm | 1;
	dat = to_device(at, sizeof(at));
	if (!dat || kvt_gpu_meta_fold(KVT_DTYPE_F32, 1, 1, 2, dk, dat, NULL) ||
	    cudaDeviceSynchronize())
		return fail("fold");
	cudaFree(dat);
	cudaFree(dm);
	cudaFree(dk);
	return 0; /* not caught: meson's should_fail turns this into a failure */
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "reuse") == 0)
		return reuse();
	if (argc == 2 && strcmp(argv[1], "table") == 0)
		return table();
	if (argc == 2 && strcmp(argv[1], "free-async") == 0)
		return free_async();
	if (argc == 2 && strcmp(argv[1], "free-async-early") == 0)
		return free_async_early();
	if (argc == 2 && strcmp(argv[1], "write-after-free") == 0)
		return write_after_free();
	if (argc == 2 && strcmp(argv[1], "kernels") == 0)
		return fold() || quest() || regions();
	if (argc == 2 && strcmp(argv[1], "fold-overlap") == 0)
		return fold_overlap();
	if (argc == 2 && strcmp(argv[1], "copy-seconds") == 0)
		return copy_seconds();
	fprintf(stderr,
		"usage: fake_selftest reuse|table|free-async|free-async-early|write-after-free|"
		"kernels|fold-overlap|copy-seconds\n");
	return 2;
}
