/* SPDX-License-Identifier: MIT */
/*
 * The help text of `kvtier-bench transfer`. The benchmark itself lives in the CUDA plugin
 * (transfer/cuda_bench.c); kvtier-bench, which never links the CUDA runtime, prints the same text
 * when the plugin cannot be loaded, so --help works on any machine. Compiled into both.
 */
#ifndef KVT_BENCH_USAGE_H
#define KVT_BENCH_USAGE_H

#include <stdio.h>

/* Writes the usage of `kvtier-bench transfer` to f. */
void kvt_bench_transfer_usage(FILE *f);

#endif /* KVT_BENCH_USAGE_H */
