/* SPDX-License-Identifier: MIT */
/* Subcommands of kvtier-bench that live in their own files. */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "simutil.h"

/* Fills dst[0 .. n) with random bf16 bit patterns of about [-2, 2) (mantissa bits of `mask`,
   0x7f or 0xff, over exponent 0x3c00 >> 7, a random sign), from the generator *rng. */
static inline void bench_rand_bf16(uint64_t *rng, uint16_t *dst, size_t n, uint32_t mask)
{
	for (size_t x = 0; x < n; x++)
		dst[x] = (uint16_t)(0x3c00u + (sim_splitmix64(rng) & mask) +
				    ((sim_splitmix64(rng) & 1u) << 15));
}

/* kvtier-bench recall (tools/bench_recall.c): argv[0] is "recall". Exit status. */
int bench_recall(int argc, char **argv);
/* kvtier-bench attend (tools/bench_attend.c). */
int bench_attend(int argc, char **argv);
/* kvtier-bench disk (tools/bench_disk.c). */
int bench_disk(int argc, char **argv);
/* kvtier-bench create (tools/bench_create.c). */
int bench_create(int argc, char **argv);
/* kvtier-bench calibrate (tools/bench_calibrate.c). */
int bench_calibrate(int argc, char **argv);

#endif /* KVT_BENCH_H */
