/* SPDX-License-Identifier: MIT */
/*
 * kvtier-trace: derives request traces from the ones the replay reads. One subcommand so far,
 * `reshape`: reads a trace in any format of sim/trace.h (its reader, not a second parser),
 * tiles it in time with sim_trace_repeat (kvtier-replay's --repeat) and truncates it to a
 * request count, stretches its arrivals to a duration, scales its prompt and output lengths to
 * target means, and writes it as Mooncake JSON lines. The written file is read back with the
 * same reader before it replaces OUT, so a file the replay would refuse is never left behind.
 * See usage().
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "trace.h"

#define TOOL "kvtier-trace"

/* Largest hash id written: jansson reads JSON integers as signed 64-bit ones. */
#define ID_MAX ((uint64_t)INT64_MAX)

static void usage(FILE *f)
{
	fprintf(f,
		"usage: " TOOL " reshape [options] TRACE -o OUT   (" TOOL " reshape --help)\n"
		"       " TOOL " --help\n"
		"\n"
		"Derives request traces from the ones kvtier-replay reads.\n"
		"  reshape   tile or cut a trace to a request count, stretch its arrivals to a\n"
		"            duration, scale its prompt and output lengths to target means, and\n"
		"            write it as Mooncake JSON lines\n"
		"\n"
		"Exit status: 0, 1 on an error of the run (writing OUT), 2 on bad usage or input.\n");
}

static void usage_reshape(FILE *f)
{
	fprintf(f,
		"usage: " TOOL " reshape [options] TRACE -o OUT\n"
		"\n"
		"Reads TRACE (any format kvtier-replay reads) and writes it to OUT as Mooncake JSON\n"
		"lines (timestamp in ms from the first request, input_length, output_length,\n"
		"hash_ids), changed as the options below ask; none given, it converts the format.\n"
		"The same inputs give the same bytes.\n"
		"\n"
		"  -o, --output OUT     the trace to write (required); written to a temporary file\n"
		"                       beside it, read back, then renamed: on failure OUT is\n"
		"                       left as it was\n"
		"  --format F           auto (default), mooncake, azure, burstgpt, vidur\n"
		"  --skip-bad-lines     skip malformed lines of TRACE (counted) instead of stopping\n"
		"  --requests N         exactly N requests: the trace tiled in time as\n"
		"                       kvtier-replay --repeat does (copy c arrives c x (span +\n"
		"                       mean gap) later, its hash ids offset so that copies share\n"
		"                       no prefix) as often as needed, then cut after the first N\n"
		"  --duration S         arrival times scaled by one factor so that the last request\n"
		"                       arrives S seconds after the first (written in whole ms)\n"
		"  --mean-input T       every prompt length scaled by one factor so that the mean\n"
		"                       is T tokens (rounded, at least 1 token)\n"
		"  --mean-output T      the same for output lengths\n"
		"  -h, --help           this text\n"
		"\n"
		"hash_ids (one id per 512-token block, chained; the last block may be partial):\n"
		"each request gets exactly ceil(input_length / 512) ids. Its first ids are those of\n"
		"the whole blocks TRACE gave it, as far as its new length has whole blocks (a shrunk\n"
		"prompt keeps the prefix it shared); every block past them (blocks a grown prompt\n"
		"adds, the partial last block, all blocks of a trace without ids) gets a fresh id\n"
		"used by no other request, so it adds no sharing.\n"
		"\n"
		"Prints the written trace's figures (as read back) on stdout. Exit status: 0, 1 on an\n"
		"error of the run (writing OUT), 2 on bad usage or input.\n");
}

struct reshape_opts {
	const char *trace, *out;
	enum sim_trace_format format;
	bool skip_bad;
	uint32_t requests;		    /* 0: as read */
	double duration, mean_in, mean_out; /* < 0: as read */
};

enum {
	O_FORMAT = 256,
	O_SKIP,
	O_REQUESTS,
	O_DURATION,
	O_MEAN_IN,
	O_MEAN_OUT,
};

/* Parses reshape's command line into *o: 0, 1 for --help (printed), -1 on bad usage
   (reported). */
static int parse_reshape(int argc, char **argv, struct reshape_opts *o)
{
	static const struct option lo[] = {
		{"output", required_argument, 0, 'o'},
		{"format", required_argument, 0, O_FORMAT},
		{"skip-bad-lines", no_argument, 0, O_SKIP},
		{"requests", required_argument, 0, O_REQUESTS},
		{"duration", required_argument, 0, O_DURATION},
		{"mean-input", required_argument, 0, O_MEAN_IN},
		{"mean-output", required_argument, 0, O_MEAN_OUT},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	int c, idx = 0;

	*o = (struct reshape_opts){.duration = -1, .mean_in = -1, .mean_out = -1};
	while ((c = getopt_long(argc, argv, "o:h", lo, &idx)) != -1) {
		const char *want = NULL, *name = c == 'o' ? "output" : lo[idx].name;

		switch (c) {
		case 'o':
			o->out = optarg;
			break;
		case O_FORMAT:
			if (sim_trace_format_parse(optarg, &o->format))
				want = "auto, mooncake, azure, burstgpt or vidur";
			break;
		case O_SKIP:
			o->skip_bad = true;
			break;
		case O_REQUESTS:
			if (sim_parse_u32(optarg, 1, UINT32_MAX, &o->requests))
				want = "an integer in [1, 4294967295]";
			break;
		case O_DURATION:
			if (sim_parse_double(optarg, 0, 1e9, &o->duration) || o->duration == 0)
				want = "seconds, a number in (0, 1e9]";
			break;
		case O_MEAN_IN:
		case O_MEAN_OUT:
			if (sim_parse_double(optarg, 1, UINT32_MAX,
					     c == O_MEAN_IN ? &o->mean_in : &o->mean_out))
				want = "tokens, a number in [1, 4294967295]";
			break;
		case 'h':
			usage_reshape(stdout);
			return 1;
		default:
			fprintf(stderr, TOOL " reshape: see --help\n");
			return -1;
		}
		if (want) {
			fprintf(stderr, TOOL ": bad value for --%s: '%s' (want %s)\n", name, optarg,
				want);
			return -1;
		}
	}
	if (optind + 1 != argc) {
		fprintf(stderr, TOOL " reshape: %s (see --help)\n",
			optind >= argc ? "no trace file given" : "more than one trace file given");
		return -1;
	}
	if (!o->out) {
		fprintf(stderr, TOOL " reshape: no output given (-o OUT)\n");
		return -1;
	}
	o->trace = argv[optind];
	return 0;
}

/* ---- the transformations: 0, or -EINVAL/-ENOMEM... reported on stderr ----------------- */

/* Tiles t as often as needed for n requests, then keeps the first n. */
static int to_count(struct sim_trace *t, uint32_t n)
{
	uint64_t copies = ((uint64_t)n + t->count - 1) / t->count;
	char err[256];
	int rc;

	if (copies > SIM_TRACE_REPEAT_MAX) {
		fprintf(stderr,
			TOOL ": --requests %u: %llu copies of the trace's %zu requests, more than "
			     "the %u the tiling makes\n",
			n, (unsigned long long)copies, t->count, SIM_TRACE_REPEAT_MAX);
		return -EINVAL;
	}
	rc = sim_trace_repeat(t, (uint32_t)copies, err, sizeof(err));
	if (rc) {
		fprintf(stderr, TOOL ": --requests %u: tiling %llu copies: %s\n", n,
			(unsigned long long)copies, err);
		return rc;
	}
	t->count = n;
	t->duration_s = t->reqs[n - 1].arrival_s;
	return 0;
}

static int to_duration(struct sim_trace *t, double d)
{
	double f;

	if (!(t->duration_s > 0)) {
		fprintf(stderr,
			TOOL
			": --duration %g: the trace's %zu requests all arrive at once: no span "
			"to scale\n",
			d, t->count);
		return -EINVAL;
	}
	f = d / t->duration_s;
	for (size_t i = 0; i < t->count; i++)
		t->reqs[i].arrival_s *= f;
	t->reqs[t->count - 1].arrival_s = d; /* exactly, whatever the rounding of the product */
	t->duration_s = d;
	return 0;
}

/* Scales the input (in) or output lengths of t by one factor so that their mean is `mean`:
   each rounded to nearest, at least 1. */
static int to_mean(struct sim_trace *t, bool in, double mean)
{
	const char *opt = in ? "--mean-input" : "--mean-output";
	uint64_t total = 0;
	double f;

	for (size_t i = 0; i < t->count; i++)
		total += in ? t->reqs[i].input_tokens : t->reqs[i].output_tokens;
	if (total == 0) {
		fprintf(stderr, TOOL ": %s %g: every request has 0 %s tokens: nothing to scale\n",
			opt, mean, in ? "input" : "output");
		return -EINVAL;
	}
	f = mean / ((double)total / (double)t->count);
	for (size_t i = 0; i < t->count; i++) {
		struct sim_trace_req *q = &t->reqs[i];
		uint32_t *v = in ? &q->input_tokens : &q->output_tokens;
		double x = round((double)*v * f);

		if (x > UINT32_MAX) {
			fprintf(stderr,
				TOOL ": %s %g: the request of line %u would have %.0f tokens, more "
				     "than 4294967295\n",
				opt, mean, q->line, x);
			return -EINVAL;
		}
		*v = x < 1 ? 1 : (uint32_t)x;
	}
	return 0;
}

/* ---- writing ------------------------------------------------------------------------- */

static uint64_t blocks_of(uint32_t tokens)
{
	return ((uint64_t)tokens + SIM_TRACE_HASH_TOKENS - 1) / SIM_TRACE_HASH_TOKENS;
}

/* Kept ids of q: those of its whole blocks read, as far as its (new) length has whole
   blocks. */
static uint32_t kept_ids(const struct sim_trace_req *q)
{
	uint32_t whole = q->input_tokens / SIM_TRACE_HASH_TOKENS;

	return q->n_hash < whole ? q->n_hash : whole;
}

/* The first fresh id: past every id kept. -EOVERFLOW (reported) when the fresh ones would
   pass ID_MAX. */
static int first_fresh(const struct sim_trace *t, uint64_t *fresh)
{
	uint64_t top = 0, need = 0;
	bool any = false;

	for (size_t i = 0; i < t->count; i++) {
		const struct sim_trace_req *q = &t->reqs[i];
		const uint64_t *h = sim_trace_hashes(t, q);
		uint32_t k = h ? kept_ids(q) : 0;

		for (uint32_t j = 0; j < k; j++)
			if (!any || h[j] > top) {
				top = h[j];
				any = true;
			}
		need += blocks_of(q->input_tokens) - k;
	}
	if ((any && top > ID_MAX) || (any && need > ID_MAX - top) || need > ID_MAX) {
		fprintf(stderr,
			TOOL ": hash ids would pass 2^63 - 1, the largest a JSON reader takes "
			     "(largest id read %llu, %llu fresh ids)\n",
			(unsigned long long)top, (unsigned long long)need);
		return -EOVERFLOW;
	}
	*fresh = any ? top + 1 : 0;
	return 0;
}

/* Writes t to f as Mooncake JSON lines (ids as usage_reshape says): 0 or -EIO. */
static int write_mooncake(const struct sim_trace *t, uint64_t fresh, FILE *f)
{
	for (size_t i = 0; i < t->count; i++) {
		const struct sim_trace_req *q = &t->reqs[i];
		const uint64_t *h = sim_trace_hashes(t, q);
		uint64_t n = blocks_of(q->input_tokens), k = h ? kept_ids(q) : 0;

		fprintf(f,
			"{\"timestamp\": %.0f, \"input_length\": %u, \"output_length\": %u, "
			"\"hash_ids\": [",
			round(q->arrival_s * 1000.0), q->input_tokens, q->output_tokens);
		for (uint64_t j = 0; j < n; j++)
			fprintf(f, j ? ", %llu" : "%llu",
				(unsigned long long)(j < k ? h[j] : fresh++));
		fputs("]}\n", f);
	}
	return ferror(f) ? -EIO : 0;
}

/* Writes t to a temporary file beside `out`, reads it back into *back, and renames it to
   `out`: 0, or -errno (reported) with `out` untouched and no temporary file left. */
static int write_out(const struct sim_trace *t, const char *out, struct sim_trace *back)
{
	size_t len = strlen(out);
	char *tmp = malloc(len + 8), err[512];
	uint64_t fresh = 0;
	mode_t mask;
	FILE *f = NULL;
	bool made = false;
	int fd = -1, rc;

	if (!tmp) {
		fprintf(stderr, TOOL ": out of memory\n");
		return -ENOMEM;
	}
	rc = first_fresh(t, &fresh);
	if (rc)
		goto fail;
	memcpy(tmp, out, len);
	memcpy(tmp + len, ".XXXXXX", 8);
	fd = mkstemp(tmp);
	if (fd < 0) {
		rc = -errno;
		fprintf(stderr, TOOL ": %s: cannot create a file beside it: %s\n", out,
			strerror(errno));
		goto fail;
	}
	made = true;
	/* mkstemp makes it 0600; OUT gets what a plain fopen would give it */
	mask = umask(0);
	umask(mask);
	if (fchmod(fd, 0666 & ~mask) || !(f = fdopen(fd, "w"))) {
		rc = -errno;
		fprintf(stderr, TOOL ": %s: %s\n", tmp, strerror(errno));
		goto fail;
	}
	fd = -1; /* f owns it */
	rc = write_mooncake(t, fresh, f);
	if (!rc && fflush(f))
		rc = -errno;
	if (!rc && fsync(fileno(f)))
		rc = -errno;
	if (fclose(f) && !rc)
		rc = -errno;
	f = NULL;
	if (rc) {
		fprintf(stderr, TOOL ": %s: cannot write: %s\n", tmp, strerror(-rc));
		goto fail;
	}
	/* what the replay will read: the reader's checks, and the figures printed */
	rc = sim_trace_read(tmp, SIM_TRACE_MOONCAKE, NULL, back, err, sizeof(err));
	if (!rc && back->count != t->count)
		rc = -EIO;
	if (rc) {
		fprintf(stderr, TOOL ": reading back what was written: %s\n",
			rc == -EIO ? "a request count differs" : err);
		sim_trace_free(back);
		rc = -EIO;
		goto fail;
	}
	if (rename(tmp, out)) {
		rc = -errno;
		fprintf(stderr, TOOL ": %s: cannot rename %s to it: %s\n", out, tmp,
			strerror(errno));
		sim_trace_free(back);
		goto fail;
	}
	free(tmp);
	return 0;
fail:
	if (f)
		fclose(f);
	if (fd >= 0)
		close(fd);
	if (made)
		unlink(tmp);
	free(tmp);
	return rc;
}

static void print_stats(const struct reshape_opts *o, const struct sim_trace *t,
			const struct sim_trace_stats *s)
{
	printf("%s: %zu requests over %.3f s (%.3f req/s)\n", o->out, s->count, s->duration_s,
	       s->rate_rps);
	printf("input tokens:  mean %.1f, p50 %.0f, p99 %.0f, max %u\n", s->input_mean,
	       s->input_p50, s->input_p99, s->input_max);
	printf("output tokens: mean %.1f, p50 %.0f, p99 %.0f, max %u\n", s->output_mean,
	       s->output_p50, s->output_p99, s->output_max);
	if (t->hash_ids)
		printf("prefix seen before (unbounded cache): %.4f of the input tokens\n",
		       s->total_input_tokens
			       ? (double)s->prefix_seen_tokens / (double)s->total_input_tokens
			       : 0.0);
}

static int cmd_reshape(int argc, char **argv)
{
	struct sim_trace_opts to = SIM_TRACE_OPTS_INIT;
	struct sim_trace t = {0}, back = {0};
	struct sim_trace_stats st;
	struct reshape_opts o;
	char err[512];
	int rc;

	rc = parse_reshape(argc, argv, &o);
	if (rc)
		return rc > 0 ? 0 : 2;
	to.skip_bad_lines = o.skip_bad;
	rc = sim_trace_read(o.trace, o.format, &to, &t, err, sizeof(err));
	if (rc) {
		fprintf(stderr, TOOL ": %s\n", err);
		return rc == -ENOMEM ? 1 : 2;
	}
	for (size_t j = 0; j < t.n_bad; j++)
		fprintf(stderr, TOOL ": skipped: %s\n", t.bad[j]);
	if (o.requests)
		rc = to_count(&t, o.requests);
	if (!rc && o.duration > 0)
		rc = to_duration(&t, o.duration);
	if (!rc && o.mean_in > 0)
		rc = to_mean(&t, true, o.mean_in);
	if (!rc && o.mean_out > 0)
		rc = to_mean(&t, false, o.mean_out);
	if (rc) {
		rc = rc == -ENOMEM ? 1 : 2;
		goto out;
	}
	rc = write_out(&t, o.out, &back);
	if (rc) {
		rc = rc == -EOVERFLOW ? 2 : 1;
		goto out;
	}
	if (sim_trace_stats(&back, &st)) {
		fprintf(stderr, TOOL ": out of memory\n");
		rc = 1;
		goto out;
	}
	print_stats(&o, &back, &st);
out:
	sim_trace_free(&back);
	sim_trace_free(&t);
	return rc;
}

/* Subcommands: each takes its own argv (argv[0] its name) and returns the exit status. */
static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
} cmds[] = {
	{"reshape", cmd_reshape},
};

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (strcmp(argv[1], cmds[i].name) == 0)
			return cmds[i].run(argc - 1, argv + 1);
	fprintf(stderr, TOOL ": unknown command '%s' (try --help)\n", argv[1]);
	return 2;
}
