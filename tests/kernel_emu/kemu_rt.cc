/* SPDX-License-Identifier: MIT */
/*
 * The kernel emulator's runtime when it stands alone (test kernel-emu): the few runtime calls
 * the kernels' launch wrappers make, on host memory standing in for device memory, and streams
 * that are only names.
 */
#include "kemu.h"

extern "C" {

int kemu_stream_begin(void *stream)
{
	(void)stream;
	return 0;
}

void kemu_stream_end(void *stream)
{
	(void)stream;
}

cudaError_t cudaGetDevice(int *device)
{
	if (!device)
		return cudaErrorInvalidValue;
	*device = 0;
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream)
{
	(void)stream;
	if (bytes && !p)
		return cudaErrorInvalidValue;
	if (bytes)
		memset(p, value, bytes);
	return cudaSuccess;
}

} /* extern "C" */
