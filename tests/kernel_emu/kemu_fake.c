/* SPDX-License-Identifier: MIT */
/*
 * The kernel emulator over tests/cuda_emu's fake runtime (the cuda-kemu plugin): a launch
 * checks its stream and is ordered like the fake's own work (fake_cuda_launch_begin/end).
 */
#include "fake_cudart.h"
#include "kemu_api.h"

int kemu_stream_begin(void *stream)
{
	return fake_cuda_launch_begin(stream, "emulated kernel");
}

void kemu_stream_end(void *stream)
{
	fake_cuda_launch_end(stream);
}
