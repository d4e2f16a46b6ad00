/* SPDX-License-Identifier: MIT */
/*
 * Small helpers of the replay simulator (sim/): number parsing, the monotonic clock, the seeded
 * generator and the percentiles of its summaries. Header-only, so the command-line tools
 * (tools/cli.h) share them without linking the simulator.
 */
#ifndef SIM_SIMUTIL_H
#define SIM_SIMUTIL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* A UTF-8 byte-order mark: every file the simulator reads (traces, preset files, recorded
   selections) skips one at its start, and only there. */
#define SIM_UTF8_BOM "\xEF\xBB\xBF"
#define SIM_UTF8_BOM_LEN 3

/* Parses a decimal integer in [lo, hi] into *out: 0, or -1 for anything else (sign, junk,
   overflow, empty). */
static inline int sim_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	unsigned long long v;

	if (*s == '-' || *s == '+')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || end == s || v < lo || v > hi)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

/* Parses a real number in [lo, hi] (NaN refused; inf only where hi is) into *out: 0, or -1
   for anything else (junk, overflow, empty, out of range). */
static inline int sim_parse_double(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi))
		return -1;
	*out = v;
	return 0;
}

/* Monotonic clock in seconds. */
static inline double sim_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* splitmix64: the seeded generator of the simulator and the tools, and the seeder of bigger
   ones. */
static inline uint64_t sim_splitmix64(uint64_t *s)
{
	uint64_t x = (*s += 0x9e3779b97f4a7c15ull);

	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* qsort comparator: doubles, ascending. */
static inline int sim_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Percentile q (0..1) of sorted v[0..n), linear between ranks (numpy's default, as vLLM's
   summaries); 0 when n is 0. */
static inline double sim_percentile(const double *v, size_t n, double q)
{
	double x;
	size_t lo, hi;

	if (!n)
		return 0;
	x = q * (double)(n - 1);
	lo = (size_t)x;
	hi = lo + 1 < n ? lo + 1 : lo;
	return v[lo] + (x - (double)lo) * (v[hi] - v[lo]);
}

#endif /* SIM_SIMUTIL_H */
