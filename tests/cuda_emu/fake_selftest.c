/* SPDX-License-Identifier: MIT */
/*
 * The fake runtime's reuse of freed mappings (fake_memory.c, keep_map): `fake_selftest reuse`
 * frees pinned and device memory, allocates the same sizes again and checks that the memory
 * comes back poisoned afresh (the test exits 0); `fake_selftest write-after-free` writes to
 * pinned memory after cudaFreeHost, which the next allocation of that size must catch (the
 * fake stops the process: meson expects it to fail).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

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

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "reuse") == 0)
		return reuse();
	if (argc == 2 && strcmp(argv[1], "write-after-free") == 0)
		return write_after_free();
	fprintf(stderr, "usage: fake_selftest reuse|write-after-free\n");
	return 2;
}
