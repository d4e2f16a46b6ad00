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
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

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
	if (argc == 2 && strcmp(argv[1], "write-after-free") == 0)
		return write_after_free();
	if (argc == 2 && strcmp(argv[1], "kernels") == 0)
		return fold() || quest();
	if (argc == 2 && strcmp(argv[1], "fold-overlap") == 0)
		return fold_overlap();
	fprintf(stderr, "usage: fake_selftest reuse|write-after-free|kernels|fold-overlap\n");
	return 2;
}
