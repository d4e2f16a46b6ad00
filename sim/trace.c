/* SPDX-License-Identifier: MIT */
/*
 * Request-trace readers, tiling and arrival re-timing (trace.h). One pass over the file with
 * getline(): each line is parsed in place (CSV) or by jansson (JSON lines, a maintained parser
 * rather than a hand-written one), and requests grow in one array that is sorted at the end
 * only when the file was out of order. Work is linear in the file size, plus n log n for an
 * unsorted file.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

#include "hmap.h"
#include "jsonkey.h"
#include "simutil.h"
#include "trace.h"

#define MAX_COLS 64
#define MSG_MAX 1024
#define SHOW 40 /* characters of a bad value quoted in a message */

struct fmt_desc {
	const char *name;
	const char *time, *in, *out; /* column (CSV) or key (JSON) names, as documented */
};

static const struct fmt_desc fmts[] = {
	[SIM_TRACE_AUTO] = {"auto", NULL, NULL, NULL},
	[SIM_TRACE_MOONCAKE] = {"mooncake", "timestamp", "input_length", "output_length"},
	[SIM_TRACE_AZURE] = {"azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens"},
	[SIM_TRACE_BURSTGPT] = {"burstgpt", "Timestamp", "Request tokens", "Response tokens"},
	[SIM_TRACE_VIDUR] = {"vidur", "arrived_at", "num_prefill_tokens", "num_decode_tokens"},
};
#define N_FMTS (sizeof(fmts) / sizeof(fmts[0]))

const char *sim_trace_format_name(enum sim_trace_format fmt)
{
	return (unsigned)fmt < N_FMTS ? fmts[fmt].name : "?";
}

int sim_trace_format_parse(const char *name, enum sim_trace_format *fmt)
{
	if (!name || !fmt)
		return -EINVAL;
	for (unsigned i = 0; i < N_FMTS; i++)
		if (strcasecmp(name, fmts[i].name) == 0) {
			*fmt = (enum sim_trace_format)i;
			return 0;
		}
	return -EINVAL;
}

/* Copies src into dst[cap], truncating; cap == 0 writes nothing. */
static void copy_str(char *dst, size_t cap, const char *src)
{
	size_t n;

	if (!dst || cap == 0)
		return;
	n = strlen(src);
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* ---- reader state ---------------------------------------------------------------------- */

struct rd {
	const char *path;
	enum sim_trace_format fmt;
	struct sim_trace_opts o;
	uint32_t line;
	/* CSV: columns of the header and where the three fields are */
	int ncols, c_time, c_in, c_out;
	/* azure: absolute time of the first request read; others are kept relative to it */
	bool have_base;
	int64_t base_sec;
	int32_t base_nsec;
	struct sim_trace t; /* being built */
	size_t cap, hash_cap;
	double prev; /* raw time of the previous request kept */
	char msg[MSG_MAX];
};

__attribute__((format(printf, 3, 4))) static int bad(struct rd *r, const char *field,
						     const char *fmt, ...)
{
	va_list ap;
	int n;

	if (field)
		n = snprintf(r->msg, sizeof(r->msg), "%s:%u: field '%s': ", r->path, r->line,
			     field);
	else
		n = snprintf(r->msg, sizeof(r->msg), "%s:%u: ", r->path, r->line);
	if (n < 0 || (size_t)n >= sizeof(r->msg))
		return -EINVAL;
	va_start(ap, fmt);
	vsnprintf(r->msg + n, sizeof(r->msg) - (size_t)n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static int show_len(size_t n)
{
	return n > SHOW ? SHOW : (int)n;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t';
}

/* ---- field parsers: 0 or -EINVAL with r->msg set ---------------------------------------- */

/* A token count: digits, optionally followed by '.' and zeros (512.0), no sign but a '-' that
   is reported as negative; at most UINT32_MAX. */
static int parse_tokens(struct rd *r, const char *name, const char *s, size_t n, uint32_t *v)
{
	size_t i = 0, nd, nf = 0;
	uint64_t acc = 0;
	bool neg = false, big = false, frac_zero = true;

	if (n == 0)
		return bad(r, name, "missing (empty)");
	if (s[0] == '-') {
		neg = true;
		i = 1;
	}
	for (nd = i; i < n && is_digit(s[i]); i++)
		if (!big) {
			acc = acc * 10 + (uint64_t)(s[i] - '0');
			big = acc > UINT32_MAX;
		}
	nd = i - nd;
	if (i < n && s[i] == '.')
		for (i++; i < n && is_digit(s[i]); i++, nf++)
			frac_zero &= s[i] == '0';
	if (i != n || nd + nf == 0)
		return bad(r, name, "not a number: '%.*s'", show_len(n), s);
	if (neg && (big || acc != 0 || !frac_zero))
		return bad(r, name, "negative: '%.*s'", show_len(n), s);
	if (!frac_zero)
		return bad(r, name, "not an integer: '%.*s'", show_len(n), s);
	if (big)
		return bad(r, name, "overflow: '%.*s' exceeds 4294967295", show_len(n), s);
	*v = (uint32_t)acc;
	return 0;
}

/* A time in seconds: a finite, non-negative decimal number (s is NUL-terminated at n). */
static int parse_seconds(struct rd *r, const char *name, const char *s, size_t n, double *v)
{
	char *end;
	double x;

	if (n == 0)
		return bad(r, name, "missing (empty)");
	/* strtod alone would also take "inf", "nan" and hex floats */
	if (strspn(s, "0123456789.eE+-") != n || !(is_digit(s[0]) || s[0] == '.' || s[0] == '-'))
		return bad(r, name, "not a number: '%.*s'", show_len(n), s);
	errno = 0;
	x = strtod(s, &end);
	if (end != s + n)
		return bad(r, name, "not a number: '%.*s'", show_len(n), s);
	if (!isfinite(x))
		return bad(r, name, "out of range: '%.*s'", show_len(n), s);
	if (x < 0)
		return bad(r, name, "negative: '%.*s'", show_len(n), s);
	*v = x;
	return 0;
}

/* Days from 1970-01-01 to y-m-d of the proleptic Gregorian calendar (H. Hinnant's
   days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d)
{
	int64_t era, yoe, doy, doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

static bool digits(const char *s, int k, int *v)
{
	*v = 0;
	for (int i = 0; i < k; i++) {
		if (!is_digit(s[i]))
			return false;
		*v = *v * 10 + (s[i] - '0');
	}
	return true;
}

/* "YYYY-MM-DD HH:MM:SS[.f]" (or 'T' between date and time), f of 1 to 9 digits, no zone,
   into whole seconds and nanoseconds since 1970-01-01 00:00:00 of the same (unknown) zone. */
static int parse_datetime(struct rd *r, const char *name, const char *s, size_t n, int64_t *sec,
			  int32_t *nsec)
{
	static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	int Y, M, D, h, mi, se, ns = 0, dim;
	size_t i;

	if (n == 0)
		return bad(r, name, "missing (empty)");
	if (n < 19 || !digits(s, 4, &Y) || s[4] != '-' || !digits(s + 5, 2, &M) || s[7] != '-' ||
	    !digits(s + 8, 2, &D) || (s[10] != ' ' && s[10] != 'T') || !digits(s + 11, 2, &h) ||
	    s[13] != ':' || !digits(s + 14, 2, &mi) || s[16] != ':' || !digits(s + 17, 2, &se))
		goto bad_form;
	i = 19;
	if (i < n) {
		size_t f0;

		if (s[i] != '.')
			goto bad_form;
		for (f0 = ++i; i < n && is_digit(s[i]) && i - f0 < 9; i++)
			ns = ns * 10 + (s[i] - '0');
		if (i == f0 || i != n)
			goto bad_form;
		for (size_t k = i - f0; k < 9; k++)
			ns *= 10;
	}
	if (M < 1 || M > 12)
		return bad(r, name, "bad timestamp '%.*s': month %d", show_len(n), s, M);
	dim = mdays[M - 1] + (M == 2 && Y % 4 == 0 && (Y % 100 != 0 || Y % 400 == 0));
	if (Y < 1 || D < 1 || D > dim || h > 23 || mi > 59 || se > 59)
		return bad(r, name, "bad timestamp '%.*s': no such date or time", show_len(n), s);
	*sec = days_from_civil(Y, M, D) * 86400 + h * 3600 + mi * 60 + se;
	*nsec = ns;
	return 0;
bad_form:
	return bad(r, name, "bad timestamp '%.*s' (want YYYY-MM-DD HH:MM:SS.fffffff)", show_len(n),
		   s);
}

/* Seconds from the first request read to (sec, nsec): exact to the nanosecond, then rounded
   once to a double (within 285 years of it). */
static double azure_rel(const struct rd *r, int64_t sec, int32_t nsec)
{
	int64_t ds = sec - r->base_sec, dn = (int64_t)nsec - r->base_nsec;

	if (ds > -9000000000LL && ds < 9000000000LL)
		return (double)(ds * 1000000000LL + dn) / 1e9;
	return (double)ds + (double)dn / 1e9;
}

/* ---- requests -------------------------------------------------------------------------- */

/* Adds a request whose n_hash ids are the last n_hash of r->t.hash_ids (0: none). */
static int add(struct rd *r, double raw, uint32_t in, uint32_t out, uint32_t n_hash)
{
	struct sim_trace_req *q;

	if (r->t.count == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 1024;

		q = realloc(r->t.reqs, cap * sizeof(*q));
		if (!q) {
			snprintf(r->msg, sizeof(r->msg), "%s: out of memory at line %u", r->path,
				 r->line);
			return -ENOMEM;
		}
		r->t.reqs = q;
		r->cap = cap;
	}
	if (r->t.count > 0 && raw < r->prev)
		r->t.out_of_order++;
	r->prev = raw;
	if (r->o.max_context && (uint64_t)in + out > r->o.max_context)
		r->t.over_context++;
	q = &r->t.reqs[r->t.count++];
	q->arrival_s = raw;
	q->input_tokens = in;
	q->output_tokens = out;
	q->line = r->line;
	q->n_hash = n_hash;
	q->hash_first = r->t.n_hash_ids - n_hash;
	return 0;
}

/* ---- mooncake: one JSON object a line ---------------------------------------------------- */

static int json_tokens(struct rd *r, json_t *o, const char *key, uint32_t *v)
{
	json_t *j = json_object_get(o, key);
	double x;

	if (!j)
		return bad(r, key, "missing");
	if (json_is_integer(j)) {
		json_int_t i = json_integer_value(j);

		if (i < 0)
			return bad(r, key, "negative: %lld", (long long)i);
		if ((unsigned long long)i > UINT32_MAX)
			return bad(r, key, "overflow: %lld exceeds 4294967295", (long long)i);
		*v = (uint32_t)i;
		return 0;
	}
	if (!json_is_real(j))
		return bad(r, key, "not a number");
	x = json_real_value(j);
	if (x < 0)
		return bad(r, key, "negative: %g", x);
	if (x != floor(x))
		return bad(r, key, "not an integer: %g", x);
	if (x > UINT32_MAX)
		return bad(r, key, "overflow: %.17g exceeds 4294967295", x);
	*v = (uint32_t)x;
	return 0;
}

/* Appends the hash ids of a line's `hash_ids` (if any) to r->t.hash_ids, those of whole
   512-token spans of its in-token prompt, their number into *n_kept. On -EINVAL or -ENOMEM
   nothing is appended. */
static int json_hashes(struct rd *r, json_t *o, uint32_t in, uint32_t *n_kept)
{
	static const char key[] = "hash_ids";
	json_t *a = json_object_get(o, key);
	size_t n, keep;

	*n_kept = 0;
	if (!a)
		return 0;
	if (!json_is_array(a))
		return bad(r, key, "not an array");
	n = json_array_size(a);
	/* the last id may stand for a partial block: up to 511 tokens past the prompt */
	if (n > ((uint64_t)in + SIM_TRACE_HASH_TOKENS - 1) / SIM_TRACE_HASH_TOKENS)
		return bad(r, key,
			   "%zu ids of %u tokens cover %llu tokens: more blocks than "
			   "input_length %u has",
			   n, SIM_TRACE_HASH_TOKENS, (unsigned long long)n * SIM_TRACE_HASH_TOKENS,
			   in);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(a, i);

		if (!json_is_integer(e))
			return bad(r, key, "element %zu: not an integer", i);
		if (json_integer_value(e) < 0)
			return bad(r, key, "element %zu: negative: %lld", i,
				   (long long)json_integer_value(e));
	}
	keep = in / SIM_TRACE_HASH_TOKENS < n ? in / SIM_TRACE_HASH_TOKENS : n;
	if (r->t.n_hash_ids + keep > r->hash_cap) {
		size_t cap = r->hash_cap ? 2 * r->hash_cap : 4096;
		uint64_t *h;

		while (cap < r->t.n_hash_ids + keep)
			cap *= 2;
		h = realloc(r->t.hash_ids, cap * sizeof(*h));
		if (!h) {
			snprintf(r->msg, sizeof(r->msg), "%s: out of memory at line %u", r->path,
				 r->line);
			return -ENOMEM;
		}
		r->t.hash_ids = h;
		r->hash_cap = cap;
	}
	for (size_t i = 0; i < keep; i++)
		r->t.hash_ids[r->t.n_hash_ids + i] =
			(uint64_t)json_integer_value(json_array_get(a, i));
	r->t.n_hash_ids += keep;
	*n_kept = (uint32_t)keep;
	return 0;
}

static int line_json(struct rd *r, const char *s, size_t n)
{
	const struct fmt_desc *d = &fmts[SIM_TRACE_MOONCAKE];
	json_error_t je;
	json_t *o, *ts;
	uint32_t in = 0, out = 0, nh = 0;
	double t;
	int rc;

	o = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
	if (!o) {
		char key[SHOW + 1];

		if (json_error_code(&je) == json_error_duplicate_key &&
		    !sim_json_key_at(s, n, (size_t)je.position, key, sizeof(key), NULL))
			return bad(r, key, "duplicate key");
		return bad(r, NULL, "column %d: invalid JSON: %s", je.column, je.text);
	}
	if (!json_is_object(o)) {
		rc = bad(r, NULL, "not a JSON object");
		goto out;
	}
	ts = json_object_get(o, d->time);
	if (!ts) {
		rc = bad(r, d->time, "missing");
		goto out;
	}
	if (!json_is_number(ts)) {
		rc = bad(r, d->time, "not a number");
		goto out;
	}
	t = json_number_value(ts);
	if (t < 0) {
		rc = bad(r, d->time, "negative: %g", t);
		goto out;
	}
	rc = json_tokens(r, o, d->in, &in);
	if (!rc)
		rc = json_tokens(r, o, d->out, &out);
	if (!rc)
		rc = json_hashes(r, o, in, &nh);
	if (!rc) {
		rc = add(r, t, in, out, nh);
		if (rc)
			r->t.n_hash_ids -= nh;
	}
out:
	json_decref(o);
	return rc;
}

/* ---- CSV ------------------------------------------------------------------------------- */

/*
 * Splits the NUL-terminated line s at commas into fields f[i] of len[i] characters, each
 * NUL-terminated in place, blanks around them removed; a field may be double-quoted ("" is a
 * quote inside). Returns the number of fields (only the first MAX_COLS are stored), or -1 for
 * an unbalanced quote or text between a closing quote and the next comma.
 */
static int csv_split(char *s, char **f, size_t *len)
{
	char *p = s;
	int nf = 0;

	for (;;) {
		char *start, *w, sep;

		while (is_blank(*p))
			p++;
		start = w = p;
		if (*p == '"') {
			for (p++;; p++) {
				if (*p == '\0')
					return -1;
				if (*p == '"') {
					if (p[1] != '"')
						break;
					p++;
				}
				*w++ = *p;
			}
			for (p++; is_blank(*p); p++)
				;
			if (*p != ',' && *p != '\0')
				return -1;
		} else {
			while (*p != ',' && *p != '\0')
				p++;
			for (w = p; w > start && is_blank(w[-1]); w--)
				;
		}
		sep = *p;
		*w = '\0';
		if (nf < MAX_COLS) {
			f[nf] = start;
			len[nf] = (size_t)(w - start);
		}
		nf++;
		if (sep == '\0')
			return nf;
		p++;
	}
}

static int find_col(char **f, int nf, const char *name)
{
	for (int i = 0; i < nf && i < MAX_COLS; i++)
		if (strcasecmp(f[i], name) == 0)
			return i;
	return -1;
}

/* The header line: detects the format (SIM_TRACE_AUTO) and finds the three columns. Errors
   here are never skipped. */
static int header_csv(struct rd *r, char *s)
{
	static const enum sim_trace_format csv_fmts[] = {SIM_TRACE_AZURE, SIM_TRACE_BURSTGPT,
							 SIM_TRACE_VIDUR};
	char shown[81], *f[MAX_COLS];
	size_t len[MAX_COLS];
	const struct fmt_desc *d;
	int nf;

	copy_str(shown, sizeof(shown), s);
	nf = csv_split(s, f, len);
	if (nf < 0)
		return bad(r, NULL, "header '%s': malformed double quotes", shown);
	if (nf > MAX_COLS)
		return bad(r, NULL, "header '%s': more than %d columns", shown, MAX_COLS);
	/* a name twice is as ambiguous as a JSON key twice; unnamed columns name nothing */
	for (int j = 1; j < nf; j++)
		for (int i = 0; i < j; i++)
			if (len[j] && strcasecmp(f[i], f[j]) == 0)
				return bad(r, f[j], "duplicate column (also column %d)", i + 1);
	if (r->fmt == SIM_TRACE_AUTO) {
		for (size_t i = 0; i < sizeof(csv_fmts) / sizeof(csv_fmts[0]); i++) {
			d = &fmts[csv_fmts[i]];
			if (find_col(f, nf, d->in) >= 0 && find_col(f, nf, d->out) >= 0) {
				r->fmt = csv_fmts[i];
				break;
			}
		}
		if (r->fmt == SIM_TRACE_AUTO)
			return bad(r, NULL,
				   "unknown header '%s': expected mooncake JSON lines or a CSV "
				   "header of azure (TIMESTAMP,ContextTokens,GeneratedTokens), "
				   "burstgpt (Timestamp,...,Request tokens,Response tokens,...) or "
				   "vidur (arrived_at,num_prefill_tokens,num_decode_tokens)",
				   shown);
	}
	d = &fmts[r->fmt];
	r->c_time = find_col(f, nf, d->time);
	r->c_in = find_col(f, nf, d->in);
	r->c_out = find_col(f, nf, d->out);
	r->ncols = nf;
	if (r->c_time < 0 || r->c_in < 0 || r->c_out < 0)
		return bad(r,
			   r->c_time < 0 ? d->time
			   : r->c_in < 0 ? d->in
					 : d->out,
			   "not in the header '%s' (%s needs columns %s,%s,%s)", shown, d->name,
			   d->time, d->in, d->out);
	return 0;
}

static int line_csv(struct rd *r, char *s)
{
	const struct fmt_desc *d = &fmts[r->fmt];
	char *f[MAX_COLS];
	size_t len[MAX_COLS];
	uint32_t in = 0, out = 0;
	double t = 0;
	int nf, rc;

	nf = csv_split(s, f, len);
	if (nf < 0)
		return bad(r, NULL, "malformed double quotes");
	if (nf < r->ncols) {
		/* name the first needed field that is missing, if any */
		const int cols[3] = {r->c_time, r->c_in, r->c_out};
		const char *names[3] = {d->time, d->in, d->out}, *name = NULL;
		int c = r->ncols;

		for (int i = 0; i < 3; i++)
			if (cols[i] >= nf && cols[i] < c) {
				c = cols[i];
				name = names[i];
			}
		if (name)
			return bad(r, name, "missing (%d columns, the header has %d)", nf,
				   r->ncols);
		return bad(r, NULL, "%d columns, the header has %d", nf, r->ncols);
	}
	if (nf > r->ncols)
		return bad(r, NULL, "%d columns, the header has %d", nf, r->ncols);

	if (r->fmt == SIM_TRACE_AZURE) {
		int64_t sec = 0;
		int32_t nsec = 0;

		rc = parse_datetime(r, d->time, f[r->c_time], len[r->c_time], &sec, &nsec);
		if (rc)
			return rc;
		rc = parse_tokens(r, d->in, f[r->c_in], len[r->c_in], &in);
		if (!rc)
			rc = parse_tokens(r, d->out, f[r->c_out], len[r->c_out], &out);
		if (rc)
			return rc;
		if (!r->have_base) {
			r->have_base = true;
			r->base_sec = sec;
			r->base_nsec = nsec;
		}
		t = azure_rel(r, sec, nsec);
	} else {
		rc = parse_seconds(r, d->time, f[r->c_time], len[r->c_time], &t);
		if (!rc)
			rc = parse_tokens(r, d->in, f[r->c_in], len[r->c_in], &in);
		if (!rc)
			rc = parse_tokens(r, d->out, f[r->c_out], len[r->c_out], &out);
		if (rc)
			return rc;
	}
	if (r->fmt == SIM_TRACE_BURSTGPT && out == 0) {
		r->t.failed_in_trace++;
		return 0;
	}
	return add(r, t, in, out, 0);
}

/* ---- the reader ------------------------------------------------------------------------ */

/* By arrival, then by line: qsort made stable, since lines are unique and in file order. */
static int cmp_arrival(const void *a, const void *b)
{
	const struct sim_trace_req *x = a, *y = b;

	if (x->arrival_s != y->arrival_s)
		return x->arrival_s < y->arrival_s ? -1 : 1;
	return (x->line > y->line) - (x->line < y->line);
}

/* Sorts when needed, makes the first arrival 0, converts to seconds. */
static void finish(struct rd *r)
{
	struct sim_trace *t = &r->t;
	double t0, scale = r->fmt == SIM_TRACE_MOONCAKE ? 1000.0 : 1.0;

	if (t->out_of_order)
		qsort(t->reqs, t->count, sizeof(t->reqs[0]), cmp_arrival);
	t0 = t->reqs[0].arrival_s;
	for (size_t i = 0; i < t->count; i++)
		t->reqs[i].arrival_s = (t->reqs[i].arrival_s - t0) / scale;
	t->duration_s = t->reqs[t->count - 1].arrival_s;
	t->format = r->fmt;
}

int sim_trace_read(const char *path, enum sim_trace_format fmt, const struct sim_trace_opts *o,
		   struct sim_trace *out, char *err, size_t err_len)
{
	static const struct sim_trace_opts defaults = SIM_TRACE_OPTS_INIT;
	struct rd *r = NULL;
	char *buf = NULL;
	size_t bufcap = 0;
	uint64_t lineno = 0;
	bool started = false;
	ssize_t got;
	FILE *f = NULL;
	int rc = 0;

	if (!path || !out || (unsigned)fmt >= N_FMTS) {
		if (err && err_len)
			snprintf(err, err_len, "%s: bad arguments", path ? path : "sim_trace_read");
		return -EINVAL;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		copy_str(err, err_len, "out of memory");
		return -ENOMEM;
	}
	r->path = path;
	r->fmt = fmt;
	r->o = o ? *o : defaults;
	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		snprintf(r->msg, sizeof(r->msg), "%s: cannot open: %s", path, strerror(errno));
		goto out;
	}
	for (;;) {
		char *s;
		size_t n;

		errno = 0;
		got = getline(&buf, &bufcap, f);
		if (got < 0)
			break;
		if (++lineno > UINT32_MAX) {
			rc = -EFBIG;
			snprintf(r->msg, sizeof(r->msg), "%s: more than %u lines", path,
				 UINT32_MAX);
			goto out;
		}
		r->line = (uint32_t)lineno;
		s = buf;
		n = (size_t)got;
		while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
			n--;
		s[n] = '\0';
		if (lineno == 1 && n >= SIM_UTF8_BOM_LEN &&
		    memcmp(s, SIM_UTF8_BOM, SIM_UTF8_BOM_LEN) == 0) {
			s += SIM_UTF8_BOM_LEN; /* as spreadsheet exports write */
			n -= SIM_UTF8_BOM_LEN;
		}
		if (strlen(s) != n) {
			rc = bad(r, NULL, "contains a NUL byte");
		} else {
			size_t b = 0;

			while (b < n && (is_blank(s[b]) || s[b] == '\r'))
				b++;
			if (b == n)
				continue; /* blank line */
			if (!started) {
				started = true;
				if (r->fmt == SIM_TRACE_AUTO && s[b] == '{')
					r->fmt = SIM_TRACE_MOONCAKE;
				if (r->fmt != SIM_TRACE_MOONCAKE) {
					rc = header_csv(r, s);
					if (rc)
						goto out;
					continue;
				}
			}
			rc = r->fmt == SIM_TRACE_MOONCAKE ? line_json(r, s, n) : line_csv(r, s);
		}
		if (rc == -EINVAL && r->o.skip_bad_lines && started) {
			if (r->t.n_bad < SIM_TRACE_BAD_KEPT)
				copy_str(r->t.bad[r->t.n_bad++], SIM_TRACE_MSG_MAX, r->msg);
			r->t.skipped++;
			rc = 0;
		}
		if (rc)
			goto out;
	}
	if (ferror(f)) {
		int e = errno ? errno : EIO;

		rc = -e;
		snprintf(r->msg, sizeof(r->msg), "%s: read error: %s", path, strerror(e));
		goto out;
	}
	if (!started) {
		rc = -EINVAL;
		snprintf(r->msg, sizeof(r->msg), "%s: empty file", path);
		goto out;
	}
	if (r->t.count == 0) {
		rc = -EINVAL;
		snprintf(r->msg, sizeof(r->msg),
			 "%s: no requests (%zu bad lines skipped, %zu failed in the trace)", path,
			 r->t.skipped, r->t.failed_in_trace);
		goto out;
	}
	finish(r);
	if (!r->t.n_hash_ids) {
		free(r->t.hash_ids);
		r->t.hash_ids = NULL;
	}
	*out = r->t;
out:
	if (rc) {
		copy_str(err, err_len, r->msg);
		free(r->t.reqs);
		free(r->t.hash_ids);
	}
	free(buf);
	if (f)
		fclose(f);
	free(r);
	return rc;
}

void sim_trace_free(struct sim_trace *t)
{
	if (!t)
		return;
	free(t->reqs);
	free(t->hash_ids);
	memset(t, 0, sizeof(*t));
}

/* ---- tiling ---------------------------------------------------------------------------- */

int sim_trace_repeat(struct sim_trace *t, uint32_t n, char *err, size_t err_len)
{
	struct sim_trace_req *reqs = NULL;
	uint64_t *ids = NULL, top = 0;
	size_t count, nh;
	double shift, prev = 0;

	if (!t || !t->count || !t->reqs || n == 0 || n > SIM_TRACE_REPEAT_MAX) {
		if (err && err_len)
			snprintf(err, err_len, "want 1 to %u copies of a non-empty trace",
				 SIM_TRACE_REPEAT_MAX);
		return -EINVAL;
	}
	if (n == 1)
		return 0;
	count = t->count;
	nh = t->hash_ids ? t->n_hash_ids : 0;
	if (count > UINT32_MAX / n) {
		if (err && err_len)
			snprintf(err, err_len, "%zu requests a copy: more than %u in all", count,
				 UINT32_MAX);
		return -EFBIG;
	}
	for (size_t j = 0; j < nh; j++)
		if (t->hash_ids[j] > top)
			top = t->hash_ids[j];
	/* the last copy's largest id, (n - 1) * (top + 1) + top, must fit */
	if (top == UINT64_MAX || (uint64_t)(n - 1) > (UINT64_MAX - top) / (top + 1)) {
		if (err && err_len)
			snprintf(err, err_len,
				 "the last copy's hash ids, offset by %u x (largest id %llu + 1), "
				 "would exceed 2^64 - 1",
				 n - 1, (unsigned long long)top);
		return -EOVERFLOW;
	}
	reqs = malloc(count * n * sizeof(*reqs));
	if (nh)
		ids = malloc(nh * n * sizeof(*ids));
	if (!reqs || (nh && !ids)) {
		free(reqs);
		free(ids);
		copy_str(err, err_len, "out of memory");
		return -ENOMEM;
	}
	shift = t->duration_s + (count > 1 ? t->duration_s / (double)(count - 1) : 0.0);
	for (uint32_t c = 0; c < n; c++) {
		struct sim_trace_req *to = reqs + (size_t)c * count;

		for (size_t i = 0; i < count; i++) {
			to[i] = t->reqs[i];
			to[i].arrival_s = t->reqs[i].arrival_s + (double)c * shift;
			/* the gap keeps copies apart by far more than rounding: kept sorted anyway
			 */
			if (to[i].arrival_s < prev)
				to[i].arrival_s = prev;
			prev = to[i].arrival_s;
			to[i].hash_first += (size_t)c * nh;
		}
		for (size_t j = 0; j < nh; j++)
			ids[(size_t)c * nh + j] = t->hash_ids[j] + (uint64_t)c * (top + 1);
	}
	free(t->reqs);
	free(t->hash_ids);
	t->reqs = reqs;
	t->hash_ids = ids;
	t->n_hash_ids = nh * n;
	t->count = count * n;
	t->over_context *= n;
	t->duration_s = reqs[t->count - 1].arrival_s;
	return 0;
}

/* ---- re-timing ------------------------------------------------------------------------- */

/*
 * Seeded generator and gamma sampler, written here: Debian's C libraries offer no gamma
 * variates except GSL (gsl_ran_gamma), which is GPL-3 and so not for an MIT project's
 * installed tools; and the C library's random() cannot be seeded per trace without global
 * state. xoshiro256** (Blackman and Vigna) seeded through splitmix64.
 */
struct rng {
	uint64_t s[4];
};

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *g)
{
	uint64_t *s = g->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return res;
}

/* Uniform in the open interval (0, 1): never 0, so log(u) and pow(u, 1/a) are defined. */
static double rng_open01(struct rng *g)
{
	return ((double)(rng_next(g) >> 11) + 0.5) * 0x1.0p-53;
}

/* Standard normal (Marsaglia's polar method; accepts pi/4 of the pairs). */
static double rng_normal(struct rng *g)
{
	double u, v, s;

	do {
		u = 2.0 * rng_open01(g) - 1.0;
		v = 2.0 * rng_open01(g) - 1.0;
		s = u * u + v * v;
	} while (s >= 1.0 || s == 0.0);
	return u * sqrt(-2.0 * log(s) / s);
}

/*
 * Gamma(shape a, scale 1) by Marsaglia and Tsang, "A simple method for generating gamma
 * variables" (ACM TOMS 2000): for a >= 1, d = a - 1/3, c = 1/sqrt(9d), x normal, v = (1+cx)^3,
 * accept d*v by the squeeze or the log test (more than 95% of tries accepted for every a >= 1,
 * so the loop ends after a few tries); for a < 1, Gamma(a) = Gamma(a+1) * U^(1/a).
 */
static double rng_gamma(struct rng *g, double a)
{
	double d, c, x, v, u;

	if (a < 1.0) {
		u = rng_open01(g);
		return rng_gamma(g, a + 1.0) * exp(log(u) / a);
	}
	d = a - 1.0 / 3.0;
	c = 1.0 / sqrt(9.0 * d);
	for (;;) {
		do {
			x = rng_normal(g);
			v = 1.0 + c * x;
		} while (v <= 0.0);
		v = v * v * v;
		u = rng_open01(g);
		if (u < 1.0 - 0.0331 * (x * x) * (x * x))
			return d * v;
		if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
			return d * v;
	}
}

int sim_trace_retime(struct sim_trace *t, double rate, double burstiness, uint64_t seed)
{
	struct rng g;
	double scale, at = 0.0;
	uint64_t x = seed;

	if (!t || (t->count && !t->reqs) || isnan(rate) || rate < 0 || !isfinite(burstiness) ||
	    burstiness <= 0)
		return -EINVAL;
	if (rate == 0 || t->count == 0)
		return 0;
	if (isinf(rate)) {
		for (size_t i = 0; i < t->count; i++)
			t->reqs[i].arrival_s = 0.0;
		t->duration_s = 0.0;
		return 0;
	}
	scale = 1.0 / (rate * burstiness);
	if (!isfinite(scale))
		return -EINVAL;
	for (int i = 0; i < 4; i++)
		g.s[i] = sim_splitmix64(&x);
	t->reqs[0].arrival_s = 0.0;
	for (size_t i = 1; i < t->count; i++) {
		at += rng_gamma(&g, burstiness) * scale;
		t->reqs[i].arrival_s = at;
	}
	t->duration_s = at;
	return 0;
}

/* ---- stats ----------------------------------------------------------------------------- */

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return (x > y) - (x < y);
}

/* Percentile p of sorted v[n], linear between ranks (numpy's default). */
static double pct(const uint32_t *v, size_t n, double p)
{
	double k = (double)(n - 1) * p / 100.0;
	size_t i = (size_t)k;

	if (i + 1 >= n)
		return v[n - 1];
	return v[i] + ((double)v[i + 1] - v[i]) * (k - (double)i);
}

/* Input tokens of t's requests, by arrival, in the leading run of whole spans whose ids an
   earlier request had: 0 or -ENOMEM. */
static int prefix_seen(const struct sim_trace *t, uint64_t *tokens)
{
	struct sim_hmap seen = {0};
	int rc = 0;

	*tokens = 0;
	for (size_t i = 0; i < t->count && !rc; i++) {
		const struct sim_trace_req *q = &t->reqs[i];
		const uint64_t *h = sim_trace_hashes(t, q);
		uint32_t k = 0;

		while (k < q->n_hash && sim_hmap_get(&seen, h[k]) != SIM_HMAP_NONE)
			k++;
		*tokens += (uint64_t)k * SIM_TRACE_HASH_TOKENS;
		for (uint32_t j = k; j < q->n_hash && !rc; j++)
			rc = sim_hmap_put(&seen, h[j], 1);
	}
	sim_hmap_fini(&seen);
	return rc;
}

int sim_trace_stats(const struct sim_trace *t, struct sim_trace_stats *st)
{
	struct sim_trace_stats s = {0};
	uint32_t *in, *out;
	size_t n;

	if (!t || !st || t->count == 0 || !t->reqs)
		return -EINVAL;
	n = t->count;
	in = malloc(n * sizeof(*in));
	out = malloc(n * sizeof(*out));
	if (!in || !out || prefix_seen(t, &s.prefix_seen_tokens)) {
		free(in);
		free(out);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		in[i] = t->reqs[i].input_tokens;
		out[i] = t->reqs[i].output_tokens;
		s.total_input_tokens += in[i];
		s.total_output_tokens += out[i];
	}
	qsort(in, n, sizeof(*in), cmp_u32);
	qsort(out, n, sizeof(*out), cmp_u32);
	s.count = n;
	s.duration_s = t->duration_s;
	s.rate_rps = t->duration_s > 0 ? (double)(n - 1) / t->duration_s : 0.0;
	s.input_mean = (double)s.total_input_tokens / (double)n;
	s.output_mean = (double)s.total_output_tokens / (double)n;
	s.input_p50 = pct(in, n, 50);
	s.input_p99 = pct(in, n, 99);
	s.output_p50 = pct(out, n, 50);
	s.output_p99 = pct(out, n, 99);
	s.input_max = in[n - 1];
	s.output_max = out[n - 1];
	free(in);
	free(out);
	*st = s;
	return 0;
}
