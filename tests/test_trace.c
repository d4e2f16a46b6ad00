/* SPDX-License-Identifier: MIT */
/*
 * trace: the simulator's request-trace readers (sim/trace.c) on the small samples in
 * data/traces (good files with their edge cases, broken files), on one-error files written
 * here for every kind of malformed line, and on the public traces bundled in traces/
 * (KVT_TRACES_DIR; a missing one fails the test); then the arrival re-timing (gap statistics
 * of the gamma process over 200,000 draws), the summary figures and the tiling in time.
 * Expected values are written out by hand from the sample files.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "check.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "hmap.h"
#include "trace.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static char path_buf[4096];

/* File `name` of the directory that environment variable `env` names (tests/meson.build sets
   it); fails the test when it is not set. */
static const char *in_dir(const char *env, const char *name)
{
	const char *dir = getenv(env);

	if (!dir) {
		print_error("%s is not set (tests/meson.build sets it)\n", env);
		fail();
	}
	snprintf(path_buf, sizeof(path_buf), "%s/%s", dir, name);
	return path_buf;
}

/* The sample `name` of data/traces (KVT_TRACE_DATA). */
static const char *sample(const char *name)
{
	return in_dir("KVT_TRACE_DATA", name);
}

/* The public trace `name` bundled in the repository's traces/ (KVT_TRACES_DIR). */
static const char *bundled(const char *name)
{
	return in_dir("KVT_TRACES_DIR", name);
}

#define READ_OK(path, fmt, o, t) read_ok(__FILE__, __LINE__, path, fmt, o, t)
static void read_ok(const char *file, int line, const char *path, enum sim_trace_format fmt,
		    const struct sim_trace_opts *o, struct sim_trace *t)
{
	char err[512] = "";
	int rc = sim_trace_read(path, fmt, o, t, err, sizeof(err));

	if (rc != 0) {
		print_error("%s:%d: sim_trace_read(%s, %s) = %d: %s\n", file, line, path,
			    sim_trace_format_name(fmt), rc, err);
		_fail(file, line);
	}
}

/* The read must fail with want_rc, leave *t as it was, and say `want` (and the path). */
#define READ_FAILS(path, fmt, o, rc, want) read_fails(__FILE__, __LINE__, path, fmt, o, rc, want)
static void read_fails(const char *file, int line, const char *path, enum sim_trace_format fmt,
		       const struct sim_trace_opts *o, int want_rc, const char *want)
{
	struct sim_trace t, before;
	char err[1024] = "";
	int rc;

	memset(&t, 0xa5, sizeof(t));
	before = t;
	rc = sim_trace_read(path, fmt, o, &t, err, sizeof(err));
	if (rc != want_rc || !strstr(err, want) || (path && !strstr(err, path)) ||
	    memcmp(&t, &before, sizeof(t)) != 0) {
		print_error("%s:%d: sim_trace_read(%s, %s) = %d (%s), expected %d and \"%s\"%s\n",
			    file, line, path, sim_trace_format_name(fmt), rc, err, want_rc, want,
			    memcmp(&t, &before, sizeof(t)) ? "; *out was changed" : "");
		if (rc == 0)
			sim_trace_free(&t);
		_fail(file, line);
	}
	print_message("# %s\n", err);
}

struct want {
	double at;
	uint32_t in, out, line;
};

#define CHECK_REQS(t, w) check_reqs(__FILE__, __LINE__, t, w, N_OF(w))
static void check_reqs(const char *file, int line, const struct sim_trace *t, const struct want *w,
		       size_t n)
{
	if (t->count != n) {
		print_error("%s:%d: %zu requests, expected %zu\n", file, line, t->count, n);
		_fail(file, line);
	}
	for (size_t i = 0; i < n; i++) {
		const struct sim_trace_req *q = &t->reqs[i];

		if (fabs(q->arrival_s - w[i].at) > 1e-9 * fmax(1.0, fabs(w[i].at)) ||
		    q->input_tokens != w[i].in || q->output_tokens != w[i].out ||
		    q->line != w[i].line) {
			print_error("%s:%d: request %zu is (%.10f s, %u, %u, line %u), expected "
				    "(%.10f s, %u, %u, line %u)\n",
				    file, line, i, q->arrival_s, q->input_tokens, q->output_tokens,
				    q->line, w[i].at, w[i].in, w[i].out, w[i].line);
			_fail(file, line);
		}
	}
	if (fabs(t->duration_s - t->reqs[n - 1].arrival_s) > 0) {
		print_error("%s:%d: duration %.10f, last arrival %.10f\n", file, line,
			    t->duration_s, t->reqs[n - 1].arrival_s);
		_fail(file, line);
	}
}

#define NEAR(x, want, tol) near(__FILE__, __LINE__, #x, x, want, tol)
static void near(const char *file, int line, const char *what, double x, double want, double tol)
{
	if (!(fabs(x - want) <= tol)) {
		print_error("%s:%d: %s = %.9g, expected %.9g within %.3g\n", file, line, what, x,
			    want, tol);
		_fail(file, line);
	}
}

/* The hash ids each request of a trace keeps (at most 4 in these samples). */
struct want_hashes {
	uint32_t n;
	uint64_t ids[4];
};

#define CHECK_HASHES(t, w) check_hashes(__FILE__, __LINE__, t, w, N_OF(w))
static void check_hashes(const char *file, int line, const struct sim_trace *t,
			 const struct want_hashes *w, size_t n)
{
	size_t total = 0;

	if (t->count != n) {
		print_error("%s:%d: %zu requests, expected %zu\n", file, line, t->count, n);
		_fail(file, line);
	}
	for (size_t i = 0; i < n; i++) {
		const struct sim_trace_req *q = &t->reqs[i];
		const uint64_t *h = sim_trace_hashes(t, q);

		total += w[i].n;
		if (q->n_hash != w[i].n || (w[i].n && !h) ||
		    (w[i].n && memcmp(h, w[i].ids, w[i].n * sizeof(*h)))) {
			print_error("%s:%d: request %zu (line %u) keeps %u hash ids, expected %u "
				    "(or other ids)\n",
				    file, line, i, q->line, q->n_hash, w[i].n);
			_fail(file, line);
		}
		if (q->n_hash && q->hash_first + q->n_hash > t->n_hash_ids) {
			print_error("%s:%d: request %zu's ids past the array\n", file, line, i);
			_fail(file, line);
		}
	}
	if (t->n_hash_ids != total || (total == 0) != (t->hash_ids == NULL)) {
		print_error("%s:%d: %zu hash ids in all, expected %zu\n", file, line, t->n_hash_ids,
			    total);
		_fail(file, line);
	}
}

/* ---- good samples -------------------------------------------------------------------- */

/* Blank line, CRLF, keys in any order, spaces, an integral real (512.0), a real timestamp,
   UINT32_MAX tokens, 0 output tokens, an unknown key, out of order (line 5), equal times
   kept in file order (lines 3 and 6), no newline at the end. */
static void test_mooncake_good(void **state)
{
	static const struct want w[] = {
		{0.0, 40160, 6, 1},   {0.020, 4294967295u, 1, 5}, {0.040, 512, 4, 3},
		{0.040, 100, 200, 6}, {1.5005, 7, 0, 4},
	};
	/* by arrival: [0, 1, 2] of 40,160 tokens kept whole; [] ; [3] of exactly 512 tokens;
	   [9] of 100 tokens, a partial block, dropped; no key */
	static const struct want_hashes hashes[] = {
		{3, {0, 1, 2}}, {0, {0}}, {1, {3}}, {0, {0}}, {0, {0}},
	};
	enum sim_trace_format fmts[] = {SIM_TRACE_AUTO, SIM_TRACE_MOONCAKE};
	(void)state;

	for (size_t i = 0; i < N_OF(fmts); i++) {
		struct sim_trace t;

		READ_OK(sample("mooncake_good.jsonl"), fmts[i], NULL, &t);
		CHECK_REQS(&t, w);
		CHECK_HASHES(&t, hashes);
		assert_int_equal(t.format, SIM_TRACE_MOONCAKE);
		assert_int_equal(t.out_of_order, 1);
		assert_int_equal(t.skipped, 0);
		assert_int_equal(t.over_context, 0);
		assert_int_equal(t.failed_in_trace, 0);
		assert_int_equal(t.n_bad, 0);
		sim_trace_free(&t);
		assert_null(t.reqs);
		assert_int_equal(t.count, 0);
	}
	sim_trace_free(NULL);
}

/* CRLF, no final newline, absolute times across a year's end and a leap day, 0 to 9
   decimals, spaces around fields, two requests out of order (the earliest is line 5). */
static void test_azure_good(void **state)
{
	static const struct want w[] = {
		{0.0, 7433, 14, 5},
		{1.0, 4808, 10, 2},
		{1.0000002, 3180, 8, 3},
		{2.5000001, 110, 27, 4},
		{5140801.123456889, 374, 14, 7},
		{5184001.0000001, 34, 12, 6},
	};
	enum sim_trace_format fmts[] = {SIM_TRACE_AUTO, SIM_TRACE_AZURE};
	struct sim_trace t;
	(void)state;

	for (size_t i = 0; i < N_OF(fmts); i++) {
		READ_OK(sample("azure_good.csv"), fmts[i], NULL, &t);
		CHECK_REQS(&t, w);
		assert_int_equal(t.format, SIM_TRACE_AZURE);
		assert_int_equal(t.out_of_order, 2);
		/* exact to the nanosecond: 1.0000002 - 1.0 is 200 ns, not 199.99... */
		NEAR((t.reqs[2].arrival_s - t.reqs[1].arrival_s) * 1e9, 200.0, 1e-6);
		sim_trace_free(&t);
	}

	/* exact: each arrival is the double nearest to the decimal difference, across midnight
	   and with 9 decimals */
	READ_OK(sample("azure_ns.csv"), SIM_TRACE_AUTO, NULL, &t);
	assert_int_equal(t.count, 4);
	assert_true(t.reqs[0].arrival_s == 0.0);
	assert_true(t.reqs[1].arrival_s == 0.0000002);
	assert_true(t.reqs[2].arrival_s == 65824.0319601);
	assert_true(t.reqs[3].arrival_s == 65824.031960101);
	sim_trace_free(&t);
}

/* Failed requests (0 response tokens) left out and counted; a quoted field with a comma and
   doubled quotes; times relative to the first request (5 s); a trailing blank line. */
static void test_burstgpt_good(void **state)
{
	static const struct want w[] = {
		{0.0, 472, 18, 2},
		{40.5, 417, 276, 4},
		{5270409.0, 300, 20, 6},
	};
	static const struct want w3[] = {{0.0, 100, 50, 2}, {2.0, 200, 60, 3}};
	enum sim_trace_format fmts[] = {SIM_TRACE_AUTO, SIM_TRACE_BURSTGPT};
	(void)state;

	for (size_t i = 0; i < N_OF(fmts); i++) {
		struct sim_trace t;

		READ_OK(sample("burstgpt_good.csv"), fmts[i], NULL, &t);
		CHECK_REQS(&t, w);
		assert_int_equal(t.format, SIM_TRACE_BURSTGPT);
		assert_int_equal(t.failed_in_trace, 2);
		assert_int_equal(t.out_of_order, 0);
		assert_int_equal(t.skipped, 0);
		sim_trace_free(&t);

		/* BurstGPT_3's layout: Session ID and Elapsed time before Model */
		READ_OK(sample("burstgpt3_good.csv"), fmts[i], NULL, &t);
		CHECK_REQS(&t, w3);
		assert_int_equal(t.format, SIM_TRACE_BURSTGPT);
		sim_trace_free(&t);
	}
}

/* Spaces around fields, float noise from pandas, first arrival not at 0, blank lines at the
   end; then columns in another order with another case, an extra column, a UTF-8 BOM and an
   integral real (1000.0), out of order. */
static void test_vidur_good(void **state)
{
	static const struct want w[] = {
		{0.0, 4808, 10, 2},
		{0.0519999999999996, 3180, 8, 3},
		{189.46150599999999, 161, 11, 4},
	};
	static const struct want wc[] = {{0.0, 2000, 9, 3}, {0.25, 1000, 7, 2}};
	enum sim_trace_format fmts[] = {SIM_TRACE_AUTO, SIM_TRACE_VIDUR};
	(void)state;

	for (size_t i = 0; i < N_OF(fmts); i++) {
		struct sim_trace t;

		READ_OK(sample("vidur_good.csv"), fmts[i], NULL, &t);
		CHECK_REQS(&t, w);
		assert_int_equal(t.format, SIM_TRACE_VIDUR);
		sim_trace_free(&t);

		READ_OK(sample("vidur_columns.csv"), fmts[i], NULL, &t);
		CHECK_REQS(&t, wc);
		assert_int_equal(t.format, SIM_TRACE_VIDUR);
		assert_int_equal(t.out_of_order, 1);
		sim_trace_free(&t);
	}
}

static void test_format_names(void **state)
{
	enum sim_trace_format f;
	(void)state;

	for (int i = SIM_TRACE_AUTO; i <= SIM_TRACE_VIDUR; i++) {
		f = (enum sim_trace_format)99;
		assert_int_equal(sim_trace_format_parse(sim_trace_format_name(i), &f), 0);
		assert_int_equal(f, i);
	}
	assert_int_equal(sim_trace_format_parse("Mooncake", &f), 0);
	assert_int_equal(f, SIM_TRACE_MOONCAKE);
	assert_int_equal(sim_trace_format_parse("sharegpt", &f), -EINVAL);
	assert_int_equal(sim_trace_format_parse(NULL, &f), -EINVAL);
	assert_string_equal(sim_trace_format_name((enum sim_trace_format)42), "?");
}

/* ---- broken samples ------------------------------------------------------------------- */

/* Each broken sample: the first error stops the read; with skip_bad_lines every bad line is
   counted, the first SIM_TRACE_BAD_KEPT messages kept, the good lines read. */
static void test_bad_samples(void **state)
{
	static const struct {
		const char *name;
		const char *first; /* the error without skip_bad_lines */
		size_t good, skipped, failed;
		const char *kept[SIM_TRACE_BAD_KEPT];
	} cases[] = {
		{"mooncake_bad.jsonl",
		 ":2: column",
		 2,
		 7,
		 0,
		 {":2: column", ":3: field 'output_length': missing",
		  ":4: field 'input_length': negative", ":5: field 'timestamp': not a number",
		  ":6: field 'output_length': overflow"}},
		{"azure_bad.csv",
		 ":3: field 'TIMESTAMP': bad timestamp",
		 2,
		 7,
		 0,
		 {":3: field 'TIMESTAMP': bad timestamp '2023-13-16 18:17:04.0319600': month 13",
		  ":4: field 'TIMESTAMP': bad timestamp '2023/11/16",
		  ":5: field 'GeneratedTokens': missing (2 columns, the header has 3)",
		  ":6: field 'ContextTokens': missing (empty)",
		  ":8: field 'ContextTokens': not a number: 'abc'"}},
		{"burstgpt_bad.csv",
		 ":3: field 'Timestamp': not a number: 'x'",
		 2,
		 4,
		 1,
		 {":3: field 'Timestamp': not a number", ":4: field 'Timestamp': negative: '-3'",
		  ":5: field 'Response tokens': missing (3 columns, the header has 6)",
		  ":7: malformed double quotes"}},
		{"vidur_bad.csv",
		 ":3: field 'arrived_at': not a number: 'nan'",
		 2,
		 4,
		 0,
		 {":3: field 'arrived_at': not a number: 'nan'",
		  ":4: field 'arrived_at': not a number: 'inf'",
		  ":5: field 'num_prefill_tokens': not an integer: '1.5'",
		  ":6: 4 columns, the header has 3"}},
	};
	struct sim_trace_opts skip = SIM_TRACE_OPTS_INIT;
	(void)state;

	skip.skip_bad_lines = true;
	for (size_t c = 0; c < N_OF(cases); c++) {
		char path[4096];
		struct sim_trace t;
		size_t kept = 0;

		snprintf(path, sizeof(path), "%s", sample(cases[c].name));
		READ_FAILS(path, SIM_TRACE_AUTO, NULL, -EINVAL, cases[c].first);
		READ_OK(path, SIM_TRACE_AUTO, &skip, &t);
		assert_int_equal(t.count, cases[c].good);
		assert_int_equal(t.skipped, cases[c].skipped);
		assert_int_equal(t.failed_in_trace, cases[c].failed);
		while (kept < SIM_TRACE_BAD_KEPT && cases[c].kept[kept])
			kept++;
		assert_int_equal(t.n_bad, kept);
		for (size_t i = 0; i < kept; i++) {
			if (!strstr(t.bad[i], cases[c].kept[i]) ||
			    strncmp(t.bad[i], path, strlen(path)) != 0) {
				print_error("%s: kept message %zu is \"%s\", expected \"%s\"\n",
					    cases[c].name, i, t.bad[i], cases[c].kept[i]);
				fail();
			}
		}
		sim_trace_free(&t);
	}
}

/* Every kind of error, one at a time, in a file of its own (written to a temporary
   directory): the message names file, line and field; a line-level error is skipped and
   counted with skip_bad_lines, a file-level one is not. */
#define MC(ts, in, out) \
	"{\"timestamp\": " ts ", \"input_length\": " in ", \"output_length\": " out "}\n"
#define MC_OK MC("0", "10", "5")
#define MCH(in, ids)                                                                            \
	"{\"timestamp\": 1, \"input_length\": " in ", \"output_length\": 1, \"hash_ids\": " ids \
	"}\n"
#define AZ_H "TIMESTAMP,ContextTokens,GeneratedTokens\n"
#define AZ_OK "2023-11-16 18:17:03.9799600,4808,10\n"
#define BG_H "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
#define BG_OK "5,ChatGPT,472,18,490,Conversation log\n"
#define VD_H "arrived_at,num_prefill_tokens,num_decode_tokens\n"
#define VD_OK "0.5,100,10\n"

static const struct bad_case {
	enum sim_trace_format fmt;
	const char *text;
	size_t len;	 /* 0: strlen(text) */
	bool line_error; /* skipped by skip_bad_lines (the file has one good request too) */
	const char *want;
	const char *want_skip; /* with skip_bad_lines, when not a line error (NULL: want) */
} bad_cases[] = {
	/* mooncake */
	{SIM_TRACE_AUTO, MC_OK "{\"input_length\": 1, \"output_length\": 1}\n", 0, true,
	 ":2: field 'timestamp': missing"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "7"), 0, true, ":2: field 'hash_ids': not an array"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "{\"a\": 1}"), 0, true,
	 ":2: field 'hash_ids': not an array"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "[1, 2.0]"), 0, true,
	 ":2: field 'hash_ids': element 1: not an integer"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "[1.5]"), 0, true,
	 ":2: field 'hash_ids': element 0: not an integer"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "[\"3\"]"), 0, true,
	 ":2: field 'hash_ids': element 0: not an integer"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "[null]"), 0, true,
	 ":2: field 'hash_ids': element 0: not an integer"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "[[1]]"), 0, true,
	 ":2: field 'hash_ids': element 0: not an integer"},
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "[0, -2]"), 0, true,
	 ":2: field 'hash_ids': element 1: negative: -2"},
	/* 1024 tokens are two blocks: a third id is a whole block past the prompt */
	{SIM_TRACE_AUTO, MC_OK MCH("1024", "[0, 1, 2]"), 0, true,
	 ":2: field 'hash_ids': 3 ids of 512 tokens cover 1536 tokens: more blocks than "
	 "input_length 1024 has"},
	{SIM_TRACE_AUTO, MC_OK MCH("0", "[0]"), 0, true,
	 ":2: field 'hash_ids': 1 ids of 512 tokens cover 512 tokens: more blocks than "
	 "input_length 0 has"},
	{SIM_TRACE_AUTO, MC_OK MC("-1", "1", "1"), 0, true, ":2: field 'timestamp': negative"},
	{SIM_TRACE_AUTO, MC_OK MC("\"0\"", "1", "1"), 0, true,
	 ":2: field 'timestamp': not a number"},
	{SIM_TRACE_MOONCAKE, MC_OK MC("1", "\"12\"", "1"), 0, true,
	 ":2: field 'input_length': not a number"},
	{SIM_TRACE_AUTO, MC_OK MC("1", "4294967296", "1"), 0, true,
	 ":2: field 'input_length': overflow: 4294967296 exceeds 4294967295"},
	{SIM_TRACE_AUTO, MC_OK MC("1", "1", "1.5"), 0, true,
	 ":2: field 'output_length': not an integer"},
	{SIM_TRACE_AUTO, MC_OK MC("1", "1", "-1"), 0, true, ":2: field 'output_length': negative"},
	{SIM_TRACE_AUTO, MC_OK MC("1", "1", "1e10"), 0, true,
	 ":2: field 'output_length': overflow"},
	{SIM_TRACE_AUTO, MC_OK "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1} x\n",
	 0, true, ":2: column"},
	{SIM_TRACE_AUTO,
	 MC_OK "{\"timestamp\": 1, \"timestamp\": 2, \"input_length\": 1, \"output_length\": 1}\n",
	 0, true, "duplicate"},
	{SIM_TRACE_AUTO, MC_OK MC("1", "99999999999999999999999", "1"), 0, true, ":2: column"},
	{SIM_TRACE_AUTO, MC_OK "[1, 2, 3]\n", 0, true, ":2: not a JSON object"},
	{SIM_TRACE_MOONCAKE, VD_H VD_OK, 0, false, ":1: column",
	 "no requests (2 bad lines skipped"},
	/* azure */
	{SIM_TRACE_AUTO, AZ_H AZ_OK "2023-11-16 24:00:00,1,1\n", 0, true,
	 ":3: field 'TIMESTAMP': bad timestamp '2023-11-16 24:00:00': no such date or time"},
	{SIM_TRACE_AUTO, AZ_H AZ_OK "2023-02-29 00:00:00.5,1,1\n", 0, true,
	 ":3: field 'TIMESTAMP': bad timestamp"},
	{SIM_TRACE_AUTO, AZ_H AZ_OK "2023-11-16 18:17:03.1234567890,1,1\n", 0, true,
	 ":3: field 'TIMESTAMP': bad timestamp"},
	{SIM_TRACE_AUTO, AZ_H AZ_OK "2023-11-16 18:17:03.,1,1\n", 0, true,
	 ":3: field 'TIMESTAMP': bad timestamp"},
	{SIM_TRACE_AUTO, AZ_H AZ_OK "2023-11-16 18:17:03Z,1,1\n", 0, true,
	 ":3: field 'TIMESTAMP': bad timestamp"},
	{SIM_TRACE_AUTO, AZ_H AZ_OK "1700158623.97,1,1\n", 0, true,
	 ":3: field 'TIMESTAMP': bad timestamp"},
	{SIM_TRACE_AUTO, AZ_H AZ_OK "2023-11-16 18:17:04,12x,1\n", 0, true,
	 ":3: field 'ContextTokens': not a number: '12x'"},
	{SIM_TRACE_AUTO, AZ_H "2023-11-16 18:17:04,12,1,9\n" AZ_OK, 0, true,
	 ":2: 4 columns, the header has 3"},
	{SIM_TRACE_AZURE, AZ_H AZ_OK "2023-11-16 18:17:04,12\n", 0, true,
	 ":3: field 'GeneratedTokens': missing (2 columns, the header has 3)"},
	{SIM_TRACE_AUTO, AZ_H AZ_OK "2023-11-16 18:17:04,1,\"7\n", 0, true,
	 ":3: malformed double quotes"},
	/* burstgpt */
	{SIM_TRACE_AUTO, BG_H BG_OK "6,ChatGPT,472,4294967296,0,Conversation log\n", 0, true,
	 ":3: field 'Response tokens': overflow"},
	{SIM_TRACE_AUTO, BG_H BG_OK "1e999,ChatGPT,472,18,490,Conversation log\n", 0, true,
	 ":3: field 'Timestamp': out of range"},
	{SIM_TRACE_BURSTGPT, BG_H BG_OK "0x10,ChatGPT,472,18,490,Conversation log\n", 0, true,
	 ":3: field 'Timestamp': not a number: '0x10'"},
	{SIM_TRACE_AUTO, BG_H BG_OK "7,ChatGPT,-0.5,18,490,Conversation log\n", 0, true,
	 ":3: field 'Request tokens': negative"},
	{SIM_TRACE_AUTO, BG_H "6,ChatGPT,472,0,472,x\n7,GPT-4,9,0,9,x\n", 0, false,
	 "no requests (0 bad lines skipped, 2 failed in the trace)"},
	/* vidur */
	{SIM_TRACE_AUTO, VD_H VD_OK ",100,10\n", 0, true, ":3: field 'arrived_at': missing"},
	{SIM_TRACE_AUTO, VD_H VD_OK "1,100,+5\n", 0, true,
	 ":3: field 'num_decode_tokens': not a number: '+5'"},
	{SIM_TRACE_AUTO, VD_H VD_OK "1,10\0 0,5\n", sizeof(VD_H VD_OK "1,10\0 0,5\n") - 1, true,
	 ":3: contains a NUL byte"},
	/* headers and whole files */
	{SIM_TRACE_AZURE, VD_H VD_OK, 0, false,
	 ":1: field 'TIMESTAMP': not in the header 'arrived_at,num_prefill_tokens,num_decode_tokens'"},
	{SIM_TRACE_AUTO, "time,ContextTokens,GeneratedTokens\n1,2,3\n", 0, false,
	 ":1: field 'TIMESTAMP': not in the header"},
	{SIM_TRACE_VIDUR, MC_OK, 0, false, ":1: header '{\"timestamp\": 0, \"input_length\""},
	{SIM_TRACE_VIDUR, "{timestamp: 0}\n", 0, false,
	 ":1: field 'arrived_at': not in the header"},
	{SIM_TRACE_AUTO, "time,prompt,completion\n1,2,3\n", 0, false,
	 ":1: unknown header 'time,prompt,completion'"},
	{SIM_TRACE_AUTO, "\"time,prompt\n1,2\n", 0, false, ":1: header"},
	{SIM_TRACE_AUTO, "", 0, false, "empty file"},
	{SIM_TRACE_AUTO, "\n  \r\n\n", 0, false, "empty file"},
	{SIM_TRACE_AUTO, VD_H "\n", 0, false, "no requests (0 bad lines skipped"},
};

static void test_bad_lines(void **state)
{
	char dir[] = "/tmp/kvt_trace_XXXXXX";
	struct sim_trace_opts skip = SIM_TRACE_OPTS_INIT;
	(void)state;

	skip.skip_bad_lines = true;
	assert_non_null(mkdtemp(dir));
	for (size_t c = 0; c < N_OF(bad_cases); c++) {
		const struct bad_case *b = &bad_cases[c];
		size_t len = b->len ? b->len : strlen(b->text);
		char path[256];
		FILE *f;

		snprintf(path, sizeof(path), "%s/case%02zu.txt", dir, c);
		f = fopen(path, "wb");
		assert_non_null(f);
		assert_int_equal(fwrite(b->text, 1, len, f), len);
		assert_int_equal(fclose(f), 0);

		READ_FAILS(path, b->fmt, NULL, -EINVAL, b->want);
		if (b->line_error) {
			struct sim_trace t;

			READ_OK(path, b->fmt, &skip, &t);
			assert_int_equal(t.count, 1);
			assert_int_equal(t.skipped, 1);
			assert_int_equal(t.n_bad, 1);
			if (!strstr(t.bad[0], b->want)) {
				print_error("case %zu: kept \"%s\", expected \"%s\"\n", c, t.bad[0],
					    b->want);
				fail();
			}
			sim_trace_free(&t);
		} else {
			READ_FAILS(path, b->fmt, &skip, -EINVAL,
				   b->want_skip ? b->want_skip : b->want);
		}
		unlink(path);
	}
	rmdir(dir);
}

/* Writes `text` to a file of its own and checks that reading it fails with `want`; with
   skip_bad_lines, that the line alone is skipped (line_error) or that the read still fails. */
static void bad_file(const char *text, bool line_error, const char *want)
{
	struct sim_trace_opts skip = SIM_TRACE_OPTS_INIT;
	struct sim_trace t;
	char path[64];
	FILE *f;

	skip.skip_bad_lines = true;
	snprintf(path, sizeof(path), "/tmp/kvt_trace_dup_%d.txt", (int)getpid());
	f = fopen(path, "wb");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
	READ_FAILS(path, SIM_TRACE_AUTO, NULL, -EINVAL, want);
	if (line_error) {
		READ_OK(path, SIM_TRACE_AUTO, &skip, &t);
		assert_int_equal(t.count, 1);
		assert_int_equal(t.skipped, 1);
		assert_non_null(strstr(t.bad[0], want));
		sim_trace_free(&t);
	} else {
		READ_FAILS(path, SIM_TRACE_AUTO, &skip, -EINVAL, want);
	}
	unlink(path);
}

/* hash_ids: the ids of whole 512-token spans are kept, a partial last block's dropped (up to
   511 tokens past the prompt are allowed, not more); a skipped line leaves none of its ids
   behind; ids follow their request when the file is sorted; the figure of a cache that
   never evicts counts each request's leading run of ids seen before. */
static void test_hash_ids(void **state)
{
	static const char text[] =
		"{\"timestamp\": 5, \"input_length\": 1025, \"output_length\": 1, "
		"\"hash_ids\": [10, 11, 12]}\n"
		"{\"timestamp\": 6, \"input_length\": 1024, \"output_length\": 1, "
		"\"hash_ids\": [10, 11, 99, 98]}\n"
		"{\"timestamp\": 1, \"input_length\": 1535, \"output_length\": 1, "
		"\"hash_ids\": [10, 13, 14]}\n"
		"{\"timestamp\": 7, \"input_length\": 2048, \"output_length\": 1, "
		"\"hash_ids\": [10, 11, 12, 15]}\n"
		"{\"timestamp\": 8, \"input_length\": 600, \"output_length\": 1, "
		"\"hash_ids\": [20, 21]}\n";
	/* by arrival: line 3 (1,535 tokens: 2 whole spans), line 1 (1,025: 2), line 4 (2,048:
	   4), line 5 (600: 1); line 2 skipped */
	static const struct want_hashes w[] = {
		{2, {10, 13}}, {2, {10, 11}}, {4, {10, 11, 12, 15}}, {1, {20}}};
	struct sim_trace_opts skip = SIM_TRACE_OPTS_INIT;
	struct sim_trace_stats st;
	struct sim_trace t;
	char path[64];
	FILE *f;
	(void)state;

	skip.skip_bad_lines = true;
	snprintf(path, sizeof(path), "/tmp/kvt_trace_hash_%d.jsonl", (int)getpid());
	f = fopen(path, "wb");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
	READ_FAILS(path, SIM_TRACE_AUTO, NULL, -EINVAL,
		   ":2: field 'hash_ids': 4 ids of 512 tokens cover 2048 tokens");
	READ_OK(path, SIM_TRACE_AUTO, &skip, &t);
	assert_int_equal(t.skipped, 1);
	assert_int_equal(t.out_of_order, 1);
	CHECK_HASHES(&t, w);
	/* seen before: request 2's [10] (512 of 1,025: 11 is new), request 3's [10, 11] */
	assert_int_equal(sim_trace_stats(&t, &st), 0);
	assert_int_equal(st.prefix_seen_tokens, 3 * 512);
	sim_trace_free(&t);
	assert_null(t.hash_ids);
	assert_int_equal(t.n_hash_ids, 0);
	unlink(path);
}

/* The map under the prefix figures (sim/hmap.c): 200,000 random puts, replacements and
   deletions of keys from a small range (long probe runs, deletions inside them) against a
   plain array, every key checked after each 1,000 operations. */
static void test_hmap(void **state)
{
	enum { KEYS = 4096 };
	static uint32_t ref[KEYS];
	struct sim_hmap h = {0};
	uint64_t x = 7;
	size_t live = 0;
	(void)state;

	for (size_t k = 0; k < KEYS; k++)
		ref[k] = SIM_HMAP_NONE;
	assert_int_equal(sim_hmap_get(&h, 1), SIM_HMAP_NONE);
	sim_hmap_del(&h, 1); /* nothing to delete in an empty map */
	for (uint32_t op = 0; op < 200000; op++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t key = (x >> 33) % KEYS;

		if ((x >> 20) % 3 == 0) {
			live -= ref[key] != SIM_HMAP_NONE;
			sim_hmap_del(&h, key * 0x100000001ull);
			ref[key] = SIM_HMAP_NONE;
		} else {
			live += ref[key] == SIM_HMAP_NONE;
			assert_int_equal(sim_hmap_put(&h, key * 0x100000001ull, op), 0);
			ref[key] = op;
		}
		assert_int_equal(h.n, live);
		if (op % 1000 == 0)
			for (uint64_t k = 0; k < KEYS; k++)
				assert_int_equal(sim_hmap_get(&h, k * 0x100000001ull), ref[k]);
	}
	assert_true(h.n * 2 <= h.cap);
	sim_hmap_fini(&h);
	assert_int_equal(h.cap, 0);
}

/* A key twice in one JSON line is ambiguous: the line is bad and the message names the key,
   as in preset files. */
static void test_duplicate_json_keys(void **state)
{
	(void)state;
	bad_file(MC_OK "{\"timestamp\": 1, \"input_length\": 1, \"input_length\": 2, "
		       "\"output_length\": 1}\n",
		 true, ":2: field 'input_length': duplicate key");
	bad_file(MC_OK "{\"timestamp\": 1, \"hash_ids\": [1], \"hash_ids\": [2], "
		       "\"input_length\": 1, \"output_length\": 1}\n",
		 true, ":2: field 'hash_ids': duplicate key");
	bad_file("\xEF\xBB\xBF{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, "
		 "\"timestamp\": 2}\n" MC_OK,
		 true, ":1: field 'timestamp': duplicate key");
}

/* A column name twice in a CSV header (case-insensitively, as columns are found) is as
   ambiguous: the header is refused, whether the format reads the column or not. */
static void test_duplicate_csv_columns(void **state)
{
	(void)state;
	bad_file(
		"arrived_at,num_prefill_tokens,num_decode_tokens,NUM_PREFILL_TOKENS\n0.5,100,10,7\n",
		false, ":1: field 'NUM_PREFILL_TOKENS': duplicate column (also column 2)");
	bad_file("\xEF\xBB\xBF"
		 "arrived_at,num_prefill_tokens,num_decode_tokens,x,x\n0.5,100,10,a,b\n",
		 false, ":1: field 'x': duplicate column (also column 4)");
	bad_file("Timestamp,Model,Request tokens,Response tokens,Total tokens,model\n" BG_OK, false,
		 ":1: field 'model': duplicate column (also column 2)");
}

/* A leading UTF-8 byte-order mark (spreadsheet exports write one) is skipped in every format,
   as preset files skip it; unnamed CSV columns may repeat (they name nothing). */
static void test_bom(void **state)
{
	static const struct {
		const char *text;
		enum sim_trace_format fmt;
		uint32_t in;
	} cases[] = {
		{"\xEF\xBB\xBF" MC("0", "10", "5"), SIM_TRACE_MOONCAKE, 10},
		{"\xEF\xBB\xBF" AZ_H AZ_OK, SIM_TRACE_AZURE, 4808},
		{"\xEF\xBB\xBF" BG_H BG_OK, SIM_TRACE_BURSTGPT, 472},
		{"\xEF\xBB\xBF" VD_H VD_OK, SIM_TRACE_VIDUR, 100},
		{"arrived_at,num_prefill_tokens,num_decode_tokens,,\n0.5,100,10,,\n",
		 SIM_TRACE_VIDUR, 100},
	};
	char path[64];
	(void)state;

	snprintf(path, sizeof(path), "/tmp/kvt_trace_bom_%d.txt", (int)getpid());
	for (size_t c = 0; c < N_OF(cases); c++) {
		struct sim_trace t;
		FILE *f = fopen(path, "wb");

		assert_non_null(f);
		fputs(cases[c].text, f);
		assert_int_equal(fclose(f), 0);
		READ_OK(path, SIM_TRACE_AUTO, NULL, &t);
		assert_int_equal(t.format, cases[c].fmt);
		assert_int_equal(t.count, 1);
		assert_int_equal(t.reqs[0].input_tokens, cases[c].in);
		sim_trace_free(&t);
	}
	unlink(path);
}

static void test_open_errors(void **state)
{
	struct sim_trace t;
	char err[8];
	(void)state;

	READ_FAILS("/nonexistent/trace.jsonl", SIM_TRACE_AUTO, NULL, -ENOENT,
		   "cannot open: No such file or directory");
	READ_FAILS(getenv("KVT_TRACE_DATA"), SIM_TRACE_AUTO, NULL, -EISDIR, "read error");
	READ_FAILS(NULL, SIM_TRACE_AUTO, NULL, -EINVAL, "bad arguments");
	READ_FAILS(sample("vidur_good.csv"), (enum sim_trace_format)7, NULL, -EINVAL,
		   "bad arguments");
	assert_int_equal(
		sim_trace_read(sample("vidur_good.csv"), SIM_TRACE_AUTO, NULL, NULL, NULL, 0),
		-EINVAL);
	/* a short message buffer is truncated and terminated; none at all is fine */
	assert_int_equal(
		sim_trace_read(sample("empty.csv"), SIM_TRACE_AUTO, NULL, &t, err, sizeof(err)),
		-EINVAL);
	assert_int_equal(strlen(err), sizeof(err) - 1);
	assert_int_equal(sim_trace_read(sample("empty.csv"), SIM_TRACE_AUTO, NULL, &t, NULL, 0),
			 -EINVAL);
	/* unknown headers and empty files among the samples */
	READ_FAILS(sample("unknown_header.csv"), SIM_TRACE_AUTO, NULL, -EINVAL, "unknown header");
	READ_FAILS(sample("empty.csv"), SIM_TRACE_AUTO, NULL, -EINVAL, "empty file");
	READ_FAILS(sample("blank_lines.csv"), SIM_TRACE_AUTO, NULL, -EINVAL, "empty file");
	READ_FAILS(sample("header_only.csv"), SIM_TRACE_AUTO, NULL, -EINVAL, "no requests");
}

/* Requests beyond the context are counted, never truncated. */
static void test_over_context(void **state)
{
	struct sim_trace_opts o = SIM_TRACE_OPTS_INIT;
	struct sim_trace t;
	(void)state;

	o.max_context = 516; /* 512 + 4 (line 3) fits exactly */
	READ_OK(sample("mooncake_good.jsonl"), SIM_TRACE_AUTO, &o, &t);
	assert_int_equal(t.count, 5);
	assert_int_equal(t.over_context, 2); /* 40160 + 6 and 4294967295 + 1 */
	assert_int_equal(t.reqs[0].input_tokens, 40160);
	assert_int_equal(t.reqs[1].input_tokens, 4294967295u);
	assert_int_equal(t.reqs[1].output_tokens, 1);
	sim_trace_free(&t);

	o.max_context = 515;
	READ_OK(sample("mooncake_good.jsonl"), SIM_TRACE_AUTO, &o, &t);
	assert_int_equal(t.over_context, 3);
	sim_trace_free(&t);
}

/* ---- the public traces ---------------------------------------------------------------- */

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_real_mooncake(void **state)
{
	static const struct want head[] = {
		{0.0, 40160, 6, 1}, {0.0, 36640, 4, 2}, {0.040, 23769, 3, 3}};
	const char *path = bundled("mooncake_synthetic.jsonl");
	struct sim_trace_stats st;
	struct sim_trace t, h;
	size_t big = 0;
	double t0, dt;
	(void)state;

	t0 = now_s();
	READ_OK(path, SIM_TRACE_AUTO, NULL, &t);
	dt = now_s() - t0;
	print_message("# read %zu mooncake requests (%s) in %.1f ms\n", t.count, path, dt * 1e3);
	assert_true(dt < 1.0);
	assert_int_equal(t.format, SIM_TRACE_MOONCAKE);
	assert_int_equal(t.count, 3993);
	assert_int_equal(t.skipped + t.out_of_order + t.failed_in_trace, 0);
	h = t;
	h.count = N_OF(head);
	h.duration_s = t.reqs[N_OF(head) - 1].arrival_s;
	CHECK_REQS(&h, head);
	assert_int_equal(t.reqs[3992].line, 3993);
	for (size_t i = 0; i < t.count; i++)
		big += t.reqs[i].input_tokens >= 8192;
	/* 121,877 ids in the file, 3,989 of them for a partial last block */
	assert_int_equal(t.n_hash_ids, 117888);
	assert_int_equal(t.reqs[0].n_hash, 78); /* 40,160 tokens: ids 0..77 of 0..78 */
	assert_int_equal(sim_trace_hashes(&t, &t.reqs[0])[77], 77);
	assert_int_equal(sim_trace_stats(&t, &st), 0);
	/* 65.0% of the input tokens lie in a prefix an earlier request had (traces/README.md) */
	assert_int_equal(st.prefix_seen_tokens, 39802880);
	assert_int_equal(st.total_input_tokens, 61194628);
	print_message("# mooncake: %.3f s, %.3f req/s, input mean %.1f p50 %.1f p99 %.2f max %u, "
		      "output p50 %.1f p99 %.2f, %.1f%% >= 8k\n",
		      st.duration_s, st.rate_rps, st.input_mean, st.input_p50, st.input_p99,
		      st.input_max, st.output_p50, st.output_p99, 100.0 * big / t.count);
	/* traces/README.md: spans 1,022 s, 3.91 req/s, input mean 15,325 / p50 11,587 /
	   p99 66,456 / max 191,378 (53% >= 8k), output p50 69 / p99 768 */
	NEAR(st.duration_s, 1022.025, 1e-9);
	NEAR(st.rate_rps, 3.91, 0.005);
	NEAR(st.input_mean, 15325, 0.5);
	NEAR(st.input_p50, 11587, 0.5);
	NEAR(st.input_p99, 66456, 0.5);
	assert_int_equal(st.input_max, 191378);
	NEAR(100.0 * big / t.count, 53, 0.5);
	NEAR(st.output_p50, 69, 0.5);
	NEAR(st.output_p99, 768, 0.5);
	sim_trace_free(&t);
}

static void test_real_azure(void **state)
{
	static const struct want head[] = {
		{0.0, 4808, 10, 2}, {0.052, 3180, 8, 3}, {0.098189, 110, 27, 4}};
	const char *path = bundled("azure_code_2023.csv");
	struct sim_trace_stats st;
	struct sim_trace t, h;
	(void)state;

	READ_OK(path, SIM_TRACE_AUTO, NULL, &t);
	assert_int_equal(t.format, SIM_TRACE_AZURE);
	assert_int_equal(t.count, 8819);
	assert_int_equal(t.skipped + t.out_of_order + t.failed_in_trace, 0);
	h = t;
	h.count = N_OF(head);
	h.duration_s = t.reqs[N_OF(head) - 1].arrival_s;
	CHECK_REQS(&h, head);
	/* the last line, 2023-11-16 19:14:19.9280160,549,173, has no newline */
	assert_int_equal(t.reqs[8818].line, 8820);
	assert_int_equal(t.reqs[8818].input_tokens, 549);
	assert_int_equal(t.reqs[8818].output_tokens, 173);
	assert_true(t.reqs[1].arrival_s == 0.052); /* exact: the double nearest 52 ms */
	assert_true(t.duration_s == 3435.948056);
	assert_int_equal(sim_trace_stats(&t, &st), 0);
	print_message("# azure: %.6f s, %.3f req/s, input p50 %.1f p99 %.2f, output p50 %.1f p99 "
		      "%.2f\n",
		      st.duration_s, st.rate_rps, st.input_p50, st.input_p99, st.output_p50,
		      st.output_p99);
	/* README: spans 3,436 s, 2.57 req/s, input p50 1,469 / p99 7,436, output p50 13 / p99 251
	 */
	NEAR(st.rate_rps, 2.57, 0.005);
	NEAR(st.input_p50, 1469, 0.5);
	NEAR(st.input_p99, 7436, 0.5);
	NEAR(st.output_p50, 13, 0.5);
	NEAR(st.output_p99, 251, 0.5);
	sim_trace_free(&t);
}

/* ---- summary figures ------------------------------------------------------------------ */

static void test_stats(void **state)
{
	struct sim_trace_stats st, before;
	struct sim_trace t;
	(void)state;

	/* burstgpt_good: inputs 472, 417, 300; outputs 18, 276, 20; arrivals 0, 40.5, 5270409 */
	READ_OK(sample("burstgpt_good.csv"), SIM_TRACE_AUTO, NULL, &t);
	assert_int_equal(sim_trace_stats(&t, &st), 0);
	assert_int_equal(st.count, 3);
	NEAR(st.duration_s, 5270409.0, 0);
	NEAR(st.rate_rps, 2.0 / 5270409.0, 1e-18);
	assert_int_equal(st.total_input_tokens, 1189);
	assert_int_equal(st.total_output_tokens, 314);
	NEAR(st.input_mean, 1189.0 / 3, 1e-9);
	NEAR(st.input_p50, 417, 1e-9);
	NEAR(st.input_p99, 417 + 55 * 0.98, 1e-9); /* rank 1.98 between 417 and 472 */
	NEAR(st.output_mean, 314.0 / 3, 1e-9);
	NEAR(st.output_p50, 20, 1e-9);
	NEAR(st.output_p99, 20 + 256 * 0.98, 1e-9);
	assert_int_equal(st.input_max, 472);
	assert_int_equal(st.output_max, 276);

	/* one request: no rate; all at 0: no rate either */
	t.count = 1;
	t.duration_s = 0;
	assert_int_equal(sim_trace_stats(&t, &st), 0);
	NEAR(st.rate_rps, 0, 0);
	NEAR(st.input_p99, 472, 0);
	t.count = 3;

	memset(&before, 0x5a, sizeof(before));
	st = before;
	t.count = 0;
	assert_int_equal(sim_trace_stats(&t, &st), -EINVAL);
	assert_int_equal(sim_trace_stats(NULL, &st), -EINVAL);
	assert_memory_equal(&st, &before, sizeof(st));
	t.count = 3;
	sim_trace_free(&t);
}

/* ---- re-timing -------------------------------------------------------------------------- */

enum { N_DRAWS = 200000 };

/* n requests one second apart, input i + 1, output i % 1000, line i + 2. */
static struct sim_trace synth(size_t n)
{
	struct sim_trace t = {0};

	t.reqs = t_xmalloc(n * sizeof(*t.reqs));
	t.count = n;
	for (size_t i = 0; i < n; i++) {
		t.reqs[i].arrival_s = (double)i;
		t.reqs[i].input_tokens = (uint32_t)i + 1;
		t.reqs[i].output_tokens = (uint32_t)(i % 1000);
		t.reqs[i].line = (uint32_t)i + 2;
	}
	t.duration_s = (double)(n - 1);
	return t;
}

/* Order and lengths kept, first at 0, non-decreasing; mean, coefficient of variation and the
   fraction below the mean of the gaps. */
static void gaps(const struct sim_trace *t, double *mean, double *cv, double *below)
{
	size_t n = t->count - 1, nb = 0;
	double s = 0, s2 = 0, m;

	assert_true(t->reqs[0].arrival_s == 0.0);
	for (size_t i = 0; i < t->count; i++) {
		assert_int_equal(t->reqs[i].input_tokens, i + 1);
		assert_int_equal(t->reqs[i].output_tokens, i % 1000);
		assert_int_equal(t->reqs[i].line, i + 2);
	}
	for (size_t i = 1; i <= n; i++) {
		double g = t->reqs[i].arrival_s - t->reqs[i - 1].arrival_s;

		assert_true(g >= 0 && isfinite(g));
		s += g;
	}
	m = s / (double)n;
	for (size_t i = 1; i <= n; i++) {
		double g = t->reqs[i].arrival_s - t->reqs[i - 1].arrival_s;

		s2 += (g - m) * (g - m);
		nb += g < m;
	}
	assert_true(t->duration_s == t->reqs[n].arrival_s);
	*mean = m;
	*cv = sqrt(s2 / (double)(n - 1)) / m;
	*below = (double)nb / (double)n;
}

static void test_retime_gamma(void **state)
{
	/* P(X < mean) for a gamma of shape B is the regularized P(B, B): B = 1: 1 - 1/e;
	   B = 0.5: erf(sqrt(0.5)); B = 4: 1 - e^-4 (1 + 4 + 8 + 32/3) */
	static const struct {
		double rate, b, below;
	} cases[] = {
		{4.0, 1.0, 0.63212055882855767},
		{4.0, 0.5, 0.68268949213708590},
		{4.0, 4.0, 0.56652987963329},
		{250.0, 1.0, 0.63212055882855767},
	};
	(void)state;

	for (size_t c = 0; c < N_OF(cases); c++) {
		struct sim_trace t = synth(N_DRAWS);
		struct sim_trace_stats st;
		double mean, cv, below, want_cv = 1.0 / sqrt(cases[c].b);

		assert_int_equal(sim_trace_retime(&t, cases[c].rate, cases[c].b, 42 + c), 0);
		gaps(&t, &mean, &cv, &below);
		print_message("# R=%g B=%g: mean gap %.6f (1/R %.6f), cv %.4f (%.4f), below mean "
			      "%.4f (%.4f)\n",
			      cases[c].rate, cases[c].b, mean, 1.0 / cases[c].rate, cv, want_cv,
			      below, cases[c].below);
		NEAR(mean * cases[c].rate, 1.0, 0.01);
		NEAR(cv / want_cv, 1.0, 0.03);
		NEAR(below, cases[c].below, 0.006);
		assert_int_equal(sim_trace_stats(&t, &st), 0);
		NEAR(st.rate_rps / cases[c].rate, 1.0, 0.01);
		sim_trace_free(&t);
	}
}

static void test_retime_semantics(void **state)
{
	struct sim_trace a = synth(1000), b = synth(1000), orig = synth(1000);
	double mean, cv, below;
	(void)state;

	/* rate 0 keeps the trace's own times */
	assert_int_equal(sim_trace_retime(&a, 0.0, 1.0, 1), 0);
	assert_memory_equal(a.reqs, orig.reqs, 1000 * sizeof(*a.reqs));
	assert_true(a.duration_s == orig.duration_s);

	/* invalid arguments change nothing */
	assert_int_equal(sim_trace_retime(NULL, 1.0, 1.0, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, -1.0, 1.0, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, NAN, 1.0, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, -INFINITY, 1.0, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, 4.0, 0.0, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, 4.0, -1.0, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, 4.0, NAN, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, 4.0, INFINITY, 1), -EINVAL);
	assert_int_equal(sim_trace_retime(&a, 0.0, 0.0, 1), -EINVAL);
	assert_memory_equal(a.reqs, orig.reqs, 1000 * sizeof(*a.reqs));
	assert_true(a.duration_s == orig.duration_s);

	/* the same seed gives the same times, another seed others */
	assert_int_equal(sim_trace_retime(&a, 2.0, 0.7, 7), 0);
	assert_int_equal(sim_trace_retime(&b, 2.0, 0.7, 7), 0);
	assert_memory_equal(a.reqs, b.reqs, 1000 * sizeof(*a.reqs));
	assert_int_equal(sim_trace_retime(&b, 2.0, 0.7, 8), 0);
	assert_memory_not_equal(a.reqs, b.reqs, 1000 * sizeof(*a.reqs));
	gaps(&a, &mean, &cv, &below);

	/* infinite rate: everything at 0, order kept */
	assert_int_equal(sim_trace_retime(&a, INFINITY, 1.0, 7), 0);
	for (size_t i = 0; i < a.count; i++) {
		assert_true(a.reqs[i].arrival_s == 0.0);
		assert_int_equal(a.reqs[i].line, i + 2);
	}
	assert_true(a.duration_s == 0.0);

	/* very bursty and very regular processes stay finite and ordered */
	assert_int_equal(sim_trace_retime(&a, 10.0, 0.05, 3), 0);
	gaps(&a, &mean, &cv, &below);
	assert_int_equal(sim_trace_retime(&a, 10.0, 1e6, 3), 0);
	gaps(&a, &mean, &cv, &below);
	NEAR(mean, 0.1, 1e-4);
	NEAR(cv, 1e-3, 2e-4);

	/* one request: at 0 */
	sim_trace_free(&b);
	b = synth(1);
	b.reqs[0].arrival_s = 3.0;
	assert_int_equal(sim_trace_retime(&b, 1.0, 1.0, 1), 0);
	assert_true(b.reqs[0].arrival_s == 0.0 && b.duration_s == 0.0);
	sim_trace_free(&a);
	sim_trace_free(&b);
	sim_trace_free(&orig);
}

/* Re-timing a trace read from a file keeps its requests in their (sorted) order. */
static void test_retime_read_trace(void **state)
{
	static const uint32_t lines[] = {1, 5, 3, 6, 4};
	struct sim_trace t;
	(void)state;

	READ_OK(sample("mooncake_good.jsonl"), SIM_TRACE_AUTO, NULL, &t);
	assert_int_equal(sim_trace_retime(&t, 1.0, 2.0, 5), 0);
	assert_true(t.reqs[0].arrival_s == 0.0);
	for (size_t i = 0; i < t.count; i++) {
		assert_int_equal(t.reqs[i].line, lines[i]);
		if (i)
			assert_true(t.reqs[i].arrival_s >= t.reqs[i - 1].arrival_s);
	}
	assert_true(t.duration_s == t.reqs[t.count - 1].arrival_s);
	sim_trace_free(&t);
}

/* ---- tiling ---------------------------------------------------------------------------- */

/* A trace with hash ids (test_hash_ids' file, its bad line left out; one request over a
   1,100-token context) tiled 3 times: copy c is the trace c * (span + mean gap) later, with
   the same lengths and lines and its ids offset by c * (largest id + 1); copies share no
   prefix. */
static void test_repeat(void **state)
{
	static const char text[] =
		"{\"timestamp\": 5, \"input_length\": 1025, \"output_length\": 1, "
		"\"hash_ids\": [10, 11, 12]}\n"
		"{\"timestamp\": 1, \"input_length\": 1535, \"output_length\": 1, "
		"\"hash_ids\": [10, 13, 14]}\n"
		"{\"timestamp\": 7, \"input_length\": 2048, \"output_length\": 1, "
		"\"hash_ids\": [10, 11, 12, 15]}\n"
		"{\"timestamp\": 8, \"input_length\": 600, \"output_length\": 3}\n"
		"{\"timestamp\": 8, \"input_length\": 600, \"output_length\": 1, "
		"\"hash_ids\": [20, 21]}\n";
	/* by arrival (ms 1, 5, 7, 8, 8): lines 2, 1, 3, 4, 5 */
	static const struct want w[] = {{0.000, 1535, 1, 2},
					{0.004, 1025, 1, 1},
					{0.006, 2048, 1, 3},
					{0.007, 600, 3, 4},
					{0.007, 600, 1, 5}};
	static const struct want_hashes wh[] = {
		{2, {10, 13}}, {2, {10, 11}}, {4, {10, 11, 12, 15}}, {0, {0}}, {1, {20}}};
	const size_t n = N_OF(w);
	const double shift = 0.007 + 0.007 / 4; /* span + mean gap */
	struct want w3[3 * N_OF(w)];
	struct want_hashes wh3[3 * N_OF(w)];
	struct sim_trace_opts o = SIM_TRACE_OPTS_INIT;
	struct sim_trace_stats st1, st3;
	struct sim_trace t, before;
	char path[64], err[256];
	FILE *f;
	(void)state;

	snprintf(path, sizeof(path), "/tmp/kvt_trace_repeat_%d.jsonl", (int)getpid());
	f = fopen(path, "wb");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
	o.max_context = 2048; /* line 3's 2,048 + 1 is over it */
	READ_OK(path, SIM_TRACE_AUTO, &o, &t);
	unlink(path);
	CHECK_REQS(&t, w);
	CHECK_HASHES(&t, wh);
	assert_int_equal(t.over_context, 1);
	assert_int_equal(t.out_of_order, 1);
	assert_int_equal(sim_trace_stats(&t, &st1), 0);

	/* n = 1 changes nothing */
	before = t;
	assert_int_equal(sim_trace_repeat(&t, 1, err, sizeof(err)), 0);
	assert_memory_equal(&t, &before, sizeof(t));

	assert_int_equal(sim_trace_repeat(&t, 3, err, sizeof(err)), 0);
	for (size_t c = 0; c < 3; c++)
		for (size_t i = 0; i < n; i++) {
			w3[c * n + i] = w[i];
			w3[c * n + i].at = w[i].at + (double)c * shift;
			wh3[c * n + i] = wh[i];
			for (uint32_t k = 0; k < wh[i].n; k++)
				wh3[c * n + i].ids[k] = wh[i].ids[k] + c * 21; /* largest id 20 */
		}
	CHECK_REQS(&t, w3); /* arrivals, lengths, lines and duration */
	CHECK_HASHES(&t, wh3);
	NEAR(t.duration_s, 2 * shift + 0.007, 1e-15);
	assert_int_equal(t.over_context, 3);
	assert_int_equal(t.out_of_order, 1); /* of the file */
	/* each copy shares within itself what the trace does, and nothing with the others */
	assert_int_equal(sim_trace_stats(&t, &st3), 0);
	assert_int_equal(st3.count, 3 * n);
	assert_int_equal(st3.prefix_seen_tokens, 3 * st1.prefix_seen_tokens);
	assert_int_equal(st3.total_input_tokens, 3 * st1.total_input_tokens);
	NEAR(st3.input_mean, st1.input_mean, 1e-9);
	NEAR(st3.output_mean, st1.output_mean, 1e-9);

	/* bad counts change nothing and say what is wanted */
	before = t;
	assert_int_equal(sim_trace_repeat(&t, 0, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "want 1 to 10000 copies of a non-empty trace");
	assert_int_equal(sim_trace_repeat(&t, SIM_TRACE_REPEAT_MAX + 1, err, sizeof(err)), -EINVAL);
	assert_memory_equal(&t, &before, sizeof(t));
	assert_int_equal(sim_trace_repeat(NULL, 2, err, sizeof(err)), -EINVAL);
	t.count = 0;
	assert_int_equal(sim_trace_repeat(&t, 2, NULL, 0), -EINVAL);
	t.count = before.count;
	sim_trace_free(&t);
}

/* The bundled Mooncake trace tiled 3 times: the 1-hour, 12,000-request workload of the replay's
   benchmark (docs/replay.md): 11,979 requests over 3 spans and 2 mean gaps, the lengths and
   the share of prefix seen before of the trace itself. */
static void test_repeat_bundled(void **state)
{
	struct sim_trace_stats st1, st3;
	struct sim_trace t;
	char err[256];
	(void)state;

	READ_OK(bundled("mooncake_synthetic.jsonl"), SIM_TRACE_AUTO, NULL, &t);
	assert_int_equal(sim_trace_stats(&t, &st1), 0);
	assert_int_equal(sim_trace_repeat(&t, 3, err, sizeof(err)), 0);
	assert_int_equal(sim_trace_stats(&t, &st3), 0);
	assert_int_equal(st3.count, 3 * 3993);
	NEAR(st3.duration_s, 3 * 1022.025 + 2 * 1022.025 / 3992, 1e-9);
	NEAR(st3.rate_rps, st1.rate_rps, 1e-3);
	NEAR(st3.input_mean, 15325, 0.5);
	NEAR(st3.output_mean, 149, 0.5);
	assert_int_equal(st3.prefix_seen_tokens, 3 * st1.prefix_seen_tokens);
	for (size_t i = 1; i < t.count; i++)
		assert_true(t.reqs[i].arrival_s >= t.reqs[i - 1].arrival_s);
	/* the first request of the second copy comes one mean gap after the last of the first */
	NEAR(t.reqs[3993].arrival_s - t.reqs[3992].arrival_s, 1022.025 / 3992, 1e-9);
	assert_int_equal(t.reqs[3993].line, 1);
	sim_trace_free(&t);
}

/* Tiling that cannot be done changes nothing: more than UINT32_MAX requests in all, ids past
   2^64 - 1 (the boundary exactly), and a one-request trace: every copy at 0. */
static void test_repeat_limits(void **state)
{
	struct sim_trace t = synth(430000), before;
	uint64_t ids[2] = {(uint64_t)1 << 62, 7};
	char err[256];
	(void)state;

	/* 430,000 x 10,000 > 4,294,967,295 */
	before = t;
	assert_int_equal(sim_trace_repeat(&t, 10000, err, sizeof(err)), -EFBIG);
	assert_string_equal(err, "430000 requests a copy: more than 4294967295 in all");
	assert_memory_equal(&t, &before, sizeof(t));
	sim_trace_free(&t);

	/* the largest id 2^62: 3 copies end at 2 x (2^62 + 1) + 2^62 < 2^64; 4 would pass it */
	t = synth(2);
	t.hash_ids = t_xmalloc(sizeof(ids));
	memcpy(t.hash_ids, ids, sizeof(ids));
	t.n_hash_ids = 2;
	t.reqs[0].n_hash = 1;
	t.reqs[1].n_hash = 1;
	t.reqs[1].hash_first = 1;
	before = t;
	assert_int_equal(sim_trace_repeat(&t, 4, err, sizeof(err)), -EOVERFLOW);
	assert_non_null(strstr(err, "would exceed 2^64 - 1"));
	assert_memory_equal(&t, &before, sizeof(t));
	assert_int_equal(sim_trace_repeat(&t, 3, err, sizeof(err)), 0);
	assert_int_equal(t.count, 6);
	assert_true(sim_trace_hashes(&t, &t.reqs[4])[0] == 3 * ((uint64_t)1 << 62) + 2);
	assert_true(sim_trace_hashes(&t, &t.reqs[5])[0] == 7 + 2 * (((uint64_t)1 << 62) + 1));
	sim_trace_free(&t);

	/* one request: no span, no gap */
	t = synth(1);
	assert_int_equal(sim_trace_repeat(&t, 5, err, sizeof(err)), 0);
	assert_int_equal(t.count, 5);
	for (size_t i = 0; i < 5; i++)
		assert_true(t.reqs[i].arrival_s == 0.0 && t.reqs[i].line == 2);
	assert_true(t.duration_s == 0.0);
	sim_trace_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_mooncake_good),
		cmocka_unit_test(test_azure_good),
		cmocka_unit_test(test_burstgpt_good),
		cmocka_unit_test(test_vidur_good),
		cmocka_unit_test(test_format_names),
		cmocka_unit_test(test_bad_samples),
		cmocka_unit_test(test_bad_lines),
		cmocka_unit_test(test_hash_ids),
		cmocka_unit_test(test_hmap),
		cmocka_unit_test(test_duplicate_json_keys),
		cmocka_unit_test(test_duplicate_csv_columns),
		cmocka_unit_test(test_bom),
		cmocka_unit_test(test_open_errors),
		cmocka_unit_test(test_over_context),
		cmocka_unit_test(test_real_mooncake),
		cmocka_unit_test(test_real_azure),
		cmocka_unit_test(test_stats),
		cmocka_unit_test(test_retime_gamma),
		cmocka_unit_test(test_retime_semantics),
		cmocka_unit_test(test_retime_read_trace),
		cmocka_unit_test(test_repeat),
		cmocka_unit_test(test_repeat_bundled),
		cmocka_unit_test(test_repeat_limits),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
