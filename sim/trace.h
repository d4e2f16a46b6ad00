/* SPDX-License-Identifier: MIT */
/*
 * Request-trace readers of the simulator (kvtier-replay, kvtier-curve): public LLM-serving traces
 * read into one array of (arrival, input tokens, output tokens), tiled in time (--repeat), and
 * the arrivals re-timed the way `vllm bench serve` does (--request-rate, --burstiness).
 *
 * Formats (CSV columns are found by name, case-insensitively, in any order, extra columns
 * ignored; JSON keys are matched exactly):
 *   mooncake  JSON lines: `timestamp` (ms from start), `input_length`, `output_length`, and
 *             `hash_ids` when present; any other key ignored (kvcache-ai/Mooncake traces).
 *             hash_ids is an array of non-negative integers, one per 512-token block of
 *             the prompt, chained: id i stands for tokens [0, 512 * (i + 1)), so equal ids
 *             mean an equal prefix. The last block may be partial: the ids may cover up to
 *             511 tokens past input_length, not more. Only whole spans can be shared, so
 *             the id of a partial last block is dropped (the request keeps
 *             floor(input_length / 512) ids at most); fewer ids than that are kept as
 *             given. An id that is not an integer (a real, a string), a negative one, or
 *             more ids than the prompt has blocks make the line bad (field 'hash_ids').
 *             The CSV formats below carry no prefix column: their requests have no ids.
 *   azure     CSV `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP absolute, like
 *             `2023-11-16 18:17:03.9799600` (up to 9 decimals, no zone: differences are taken
 *             as if it were UTC) (Azure LLM inference traces, Splitwise).
 *   burstgpt  CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`,
 *             Timestamp in seconds. Rows with 0 response tokens are requests that failed in
 *             the original service: they are counted in `failed_in_trace` and left out, since
 *             their output length is unknown. Model, Total tokens and Log Type are not read.
 *   vidur     CSV `arrived_at,num_prefill_tokens,num_decode_tokens`, seconds (Vidur/Splitwise
 *             processed traces).
 * Lines may end in LF or CRLF, the last one without a newline; a UTF-8 byte-order mark at the
 * start of the file is skipped; blank lines are ignored; fields may carry spaces around them
 * and CSV fields may be double-quoted. A key twice in a JSON line makes the line bad ("field
 * 'KEY': duplicate key"), and a column name twice in a CSV header (case-insensitively; empty
 * names excepted) the header ("field 'NAME': duplicate column"), as preset files refuse
 * theirs (exec_model.h): which one was meant is unknown. Token counts are integers
 * in [0, UINT32_MAX] (an integral value written as a real, like 512.0, is accepted); zero
 * counts are passed through (a 0-token prompt is the replay's to refuse). Times must be finite
 * and non-negative (except azure's absolute ones).
 *
 * Arrivals come back in seconds relative to the first request (the first is at 0), sorted
 * non-decreasing: a file out of order is sorted stably (equal times keep file order) and the
 * number of requests that arrived earlier than the one before them in the file is counted.
 */
#ifndef SIM_TRACE_H
#define SIM_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sim_trace_format {
	SIM_TRACE_AUTO = 0, /* reading only: detected from the first non-empty line */
	SIM_TRACE_MOONCAKE,
	SIM_TRACE_AZURE,
	SIM_TRACE_BURSTGPT,
	SIM_TRACE_VIDUR,
};

/* "auto", "mooncake", "azure", "burstgpt", "vidur"; "?" for anything else. */
const char *sim_trace_format_name(enum sim_trace_format fmt);
/* The format named `name` (as above, case-insensitive) into *fmt: 0 or -EINVAL. */
int sim_trace_format_parse(const char *name, enum sim_trace_format *fmt);

/* Tokens one prefix hash id stands for (Mooncake's block). */
#define SIM_TRACE_HASH_TOKENS 512

struct sim_trace_req {
	double arrival_s; /* seconds after the first request */
	uint32_t input_tokens, output_tokens;
	uint32_t line;	   /* 1-based line of the source file */
	uint32_t n_hash;   /* prefix hash ids of its whole 512-token spans (0: none) */
	size_t hash_first; /* where they start in sim_trace.hash_ids */
};

struct sim_trace_opts {
	/* Skip malformed lines (counted in `skipped`, the first few messages kept in `bad`)
	   instead of failing the whole read. Header errors are never skipped. */
	bool skip_bad_lines;
	/* The model's context in tokens, 0 for none. Requests whose input + output exceed it
	   are kept whole and counted in `over_context`: never truncated. */
	uint64_t max_context;
};
#define SIM_TRACE_OPTS_INIT                               \
	{                                                 \
		.skip_bad_lines = false, .max_context = 0 \
	}

#define SIM_TRACE_BAD_KEPT 5
#define SIM_TRACE_MSG_MAX 256

struct sim_trace {
	struct sim_trace_req *reqs; /* `count` requests, by arrival; sim_trace_free releases */
	size_t count;
	/* The prefix hash ids of every request, one array for all (reqs[i].hash_first,
	   .n_hash); NULL when no request has any. sim_trace_free releases it. */
	uint64_t *hash_ids;
	size_t n_hash_ids;
	enum sim_trace_format format; /* as read (detected for SIM_TRACE_AUTO) */
	size_t skipped;		      /* malformed lines skipped (opts.skip_bad_lines) */
	size_t over_context;	      /* requests with input + output > opts.max_context */
	size_t failed_in_trace;	      /* burstgpt rows that failed in the trace, left out */
	size_t out_of_order;	      /* requests earlier than the one before them in the file */
	double duration_s;	      /* arrival of the last request */
	/* Messages "FILE:LINE: field 'NAME': what is wrong" of the first skipped lines. */
	size_t n_bad;
	char bad[SIM_TRACE_BAD_KEPT][SIM_TRACE_MSG_MAX];
};

/*
 * Reads the trace at `path` in format `fmt` (SIM_TRACE_AUTO: a JSON object on the first
 * non-empty line means mooncake, otherwise the CSV header's columns decide). `o` may be NULL
 * for the defaults. On success fills *out (the caller releases it with sim_trace_free) and
 * returns 0. On failure returns -errno, leaves *out untouched and, when err_len > 0, writes a
 * message into err:
 *   -EINVAL  a malformed line without skip_bad_lines ("FILE:LINE: field 'NAME': what is
 *            wrong": missing, not a number, not an integer, negative, overflow, bad timestamp,
 *            duplicate key, a wrong column count, or bad hash_ids: not an array, an element
 *            not an integer or negative, more ids than the prompt's blocks), an empty file,
 *            an unknown, incomplete
 *            or ambiguous (duplicate column) header, no requests at all, or bad arguments;
 *   -ENOENT, -EACCES, -EISDIR, -EIO...  opening or reading the file ("FILE: reason");
 *   -EFBIG   more than UINT32_MAX lines;  -ENOMEM.
 */
int sim_trace_read(const char *path, enum sim_trace_format fmt, const struct sim_trace_opts *o,
		   struct sim_trace *out, char *err, size_t err_len);

/* The prefix hash ids of request q of t (q->n_hash of them; NULL when none). */
static inline const uint64_t *sim_trace_hashes(const struct sim_trace *t,
					       const struct sim_trace_req *q)
{
	return q->n_hash && t->hash_ids ? t->hash_ids + q->hash_first : NULL;
}

/* Releases t's requests and hash ids and zeroes *t. t == NULL does nothing. */
void sim_trace_free(struct sim_trace *t);

/* Most copies sim_trace_repeat makes (kvtier-replay's and kvtier-curve's --repeat). */
#define SIM_TRACE_REPEAT_MAX 10000

/*
 * Tiles t in time into n copies of its requests, one after the other: copy c (0-based) is the
 * trace with every arrival c * (duration_s + gap) later, gap being the trace's mean gap
 * between arrivals, duration_s / (count - 1) (0 for one request), so the tiled trace keeps the
 * arrival rate and its copies do not overlap. Lengths and source lines are copied. The hash
 * ids of copy c are the original's plus c * (largest id + 1): each copy shares prefixes
 * within itself as the trace does, and none with the other copies (a later copy is other
 * users' prompts, not a replay of the same ones). over_context is multiplied by n; the
 * counts of the file (skipped, failed_in_trace, out_of_order, bad) are kept.
 * n == 1 changes nothing. Returns 0, or -errno with *t unchanged and, when err_len > 0, a
 * message in err (it does not repeat n: the caller names its option and value): -EINVAL (t
 * NULL or empty, n 0 or above SIM_TRACE_REPEAT_MAX); -EFBIG (more than UINT32_MAX requests in
 * all); -EOVERFLOW (an offset id past UINT64_MAX); -ENOMEM. Work: linear in the tiled
 * trace's requests and hash ids.
 */
int sim_trace_repeat(struct sim_trace *t, uint32_t n, char *err, size_t err_len);

/*
 * Re-times the arrivals as `vllm bench serve` does, keeping the requests' order and lengths:
 *   rate == 0         the trace's own times are kept (nothing changes);
 *   rate == INFINITY  every request arrives at 0;
 *   rate R > 0        the first request at 0, then gaps drawn independently from a gamma
 *                     distribution of shape B = burstiness and scale 1/(R*B): mean 1/R,
 *                     coefficient of variation 1/sqrt(B) (B = 1: a Poisson process; B < 1
 *                     burstier, B > 1 more regular).
 * The same seed gives the same arrivals. duration_s is updated. Returns 0, or -EINVAL (t NULL,
 * rate negative or NaN, burstiness not finite and > 0) with *t unchanged.
 */
int sim_trace_retime(struct sim_trace *t, double rate, double burstiness, uint64_t seed);

/* Figures of a trace for the replay's summary. Percentiles interpolate linearly between
   ranks (numpy's default, as vLLM's summaries). */
struct sim_trace_stats {
	size_t count;
	double duration_s;
	double rate_rps; /* (count - 1) / duration_s: arrivals per second; 0 if duration is 0 */
	uint64_t total_input_tokens, total_output_tokens;
	double input_mean, input_p50, input_p99;
	double output_mean, output_p50, output_p99;
	uint32_t input_max, output_max;
	/* Input tokens of each request's leading run of whole 512-token spans whose hash ids
	   an earlier request (by arrival) had: what a prefix cache that never evicts would
	   share (0 without hash ids). */
	uint64_t prefix_seen_tokens;
};

/* Fills *st for t: 0, -EINVAL (NULL or empty trace) or -ENOMEM, with *st unchanged. Work:
   n log n in the requests, plus linear in the hash ids. */
int sim_trace_stats(const struct sim_trace *t, struct sim_trace_stats *st);

#endif /* SIM_TRACE_H */
