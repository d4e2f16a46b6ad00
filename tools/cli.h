/* SPDX-License-Identifier: MIT */
/* Small helpers shared by the command-line tools; the number parsers, clock, generator and
   percentiles are the simulator's (sim/simutil.h). */
#ifndef KVT_CLI_H
#define KVT_CLI_H

#include <stdio.h>
#include <unistd.h>

#include "simutil.h"

/* Reports a bad value of option --opt; returns -1 (the parsers' failure value). */
static inline int cli_bad_value(const char *tool, const char *opt, const char *arg)
{
	fprintf(stderr, "%s: bad value for --%s: '%s'\n", tool, opt, arg);
	return -1;
}

/* After getopt: -1 (reported) when an argument is left over, else 0. */
static inline int cli_no_extra(const char *tool, int argc, char **argv)
{
	if (optind >= argc)
		return 0;
	fprintf(stderr, "%s: unexpected argument '%s'\n", tool, argv[optind]);
	return -1;
}

#endif /* KVT_CLI_H */
