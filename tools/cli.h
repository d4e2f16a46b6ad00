/* SPDX-License-Identifier: MIT */
/* Small helpers shared by the command-line tools. */
#ifndef KVT_CLI_H
#define KVT_CLI_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Parses a decimal integer in [lo, hi] into *out: 0, or -1 for anything else (sign, junk,
   overflow, empty). */
static inline int cli_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
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

/* Monotonic clock in seconds. */
static inline double cli_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* KVT_CLI_H */
