/* SPDX-License-Identifier: MIT */
#include "bench_usage.h"

#include "gather.h"
#include "savepool.h"

void kvt_bench_transfer_usage(FILE *f)
{
	fprintf(f,
		"usage: kvtier-bench transfer [options]\n"
		"Moves N scattered host blocks of B KiB (N of 2N slots of a pinned, mapped arena)\n"
		"to and from a device buffer of N * B bytes, and prints GB/s (1e9 bytes/s, median\n"
		"of --reps runs after one warm-up) of: (a) the fused gather kernel (FlashH2D),\n"
		"(b) one cudaMemcpyAsync per block, (c) one cudaMemcpyBatchAsync, (d) one\n"
		"contiguous H2D copy (the ceiling), (e) FlashD2H (the backend's save + save_wait,\n"
		"wall time), (f) one D2H cudaMemcpyAsync per block, (g) one contiguous D2H copy;\n"
		"then the target ratios and the backend's calibration. (a), (c) and (e) are\n"
		"checked byte for byte. Needs the CUDA backend plugin (libkvtier-cuda.so) and a GPU.\n"
		"  --sizes LIST   block sizes in KiB (default 4,16,64)\n"
		"  --counts LIST  block counts (default 16,64,256,1024,4096,16384,65536)\n"
		"  --ctas N       CTAs of the fused gather (default %d, 1..%d)\n"
		"  --threads N    save threads of FlashD2H (default 4, 1..%d)\n"
		"  --reps N       runs per cell, median reported (default 5)\n"
		"  --max-gib N    skip cells of more than N GiB (default 4); a cell of S bytes\n"
		"                 pins 4 S of host memory and takes S of device memory\n"
		"  --csv FILE     also write one line per cell there\n"
		"  --quick        sizes 16, counts 64,1024, reps 3 (the smoke test)\n"
		"  -h, --help     this text\n"
		"SIGTERM or SIGINT stops it after the method running; it still prints the\n"
		"targets and calibration of the cells measured.\n"
		"Exit status: 0 on success, 1 on a CUDA failure or wrong bytes, 2 on bad usage,\n"
		"77 when no CUDA device is usable or the plugin is not available, 128 + the\n"
		"signal when stopped by one.\n",
		KVT_GATHER_CTAS_DEFAULT, KVT_GATHER_CTAS_MAX, KVT_SAVE_MAX_THREADS);
}
