/* SPDX-License-Identifier: MIT */
/* Where the keys of a JSON text are (jsonkey.h): one forward scan of quotes, backslashes,
   brackets and newlines, with jansson decoding the keys it compares. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "jsonkey.h"

/* An object key: its token s[a..b) (quotes included), its nesting depth (1: a key of the
   top-level object; objects and arrays both count) and its line. */
struct key {
	size_t a, b;
	int depth;
	unsigned line;
};

static bool is_ws(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/*
 * Calls visit for each object key of s[0..n) in order (a key: a string followed, after
 * blanks, by ':') until it returns non-zero, and returns that, else 0. JSON strings hold no
 * raw newline and no unescaped quote, so where jansson parsed the text this scan sees the
 * tokens it saw. One pass: linear in n.
 */
static int walk(const char *s, size_t n, int (*visit)(void *u, const struct key *k), void *u)
{
	unsigned line = 1;
	int depth = 0;

	for (size_t i = 0; i < n; i++) {
		struct key k;
		size_t j;
		int rc;

		switch (s[i]) {
		case '\n':
			line++;
			break;
		case '{':
		case '[':
			depth++;
			break;
		case '}':
		case ']':
			depth--;
			break;
		case '"':
			k.a = i;
			for (i++; i < n && s[i] != '"'; i++)
				if (s[i] == '\\')
					i++;
			if (i >= n)
				return 0;
			k.b = i + 1;
			for (j = k.b; j < n && is_ws(s[j]); j++)
				;
			if (j < n && s[j] == ':') {
				k.depth = depth;
				k.line = line;
				rc = visit(u, &k);
				if (rc)
					return rc;
			}
			break;
		default:
			break;
		}
	}
	return 0;
}

/* The key's name, decoded by jansson (a new reference), or NULL. */
static json_t *decode(const char *s, const struct key *k)
{
	json_t *v = json_loadb(s + k->a, k->b - k->a, JSON_DECODE_ANY, NULL);

	if (v && !json_is_string(v)) {
		json_decref(v);
		v = NULL;
	}
	return v;
}

static bool key_is(const char *s, const struct key *k, const char *name)
{
	json_t *v = decode(s, k);
	bool eq = v && strcmp(json_string_value(v), name) == 0;

	json_decref(v);
	return eq;
}

struct find_line {
	const char *s, *outer, *inner;
	bool in_outer; /* the last top-level key was `outer` */
	unsigned line;
};

static int visit_line(void *u, const struct key *k)
{
	struct find_line *f = u;

	if (k->depth == 1) {
		f->in_outer = key_is(f->s, k, f->outer);
		if (f->in_outer && !f->inner)
			f->line = k->line;
	} else if (k->depth == 2 && f->in_outer && f->inner && key_is(f->s, k, f->inner)) {
		f->line = k->line;
	}
	return 0;
}

unsigned sim_json_key_line(const char *s, size_t n, const char *outer, const char *inner)
{
	struct find_line f = {.s = s, .outer = outer, .inner = inner};

	if (!s || !outer)
		return 0;
	walk(s, n, visit_line, &f);
	return f.line;
}

struct find_at {
	size_t end;
	struct key outer, found; /* the last top-level key; the key sought */
	bool have_outer;
};

static int visit_at(void *u, const struct key *k)
{
	struct find_at *f = u;

	if (k->b > f->end)
		return 1; /* past it: none ends there */
	if (k->b == f->end) {
		f->found = *k;
		return 2;
	}
	if (k->depth == 1) {
		f->outer = *k;
		f->have_outer = true;
	}
	return 0;
}

int sim_json_key_at(const char *s, size_t n, size_t end, char *name, size_t len, unsigned *line)
{
	struct find_at f = {.end = end};
	json_t *key = NULL, *outer = NULL;
	int rc = -ENOENT;

	if (!s || !name || !len || end > n || walk(s, n, visit_at, &f) != 2)
		return -ENOENT;
	key = decode(s, &f.found);
	if (f.found.depth == 2 && f.have_outer)
		outer = decode(s, &f.outer);
	if (!key || (f.found.depth == 2 && f.have_outer && !outer))
		goto out;
	if (outer)
		snprintf(name, len, "%s.%s", json_string_value(outer), json_string_value(key));
	else
		snprintf(name, len, "%s", json_string_value(key));
	if (line)
		*line = f.found.line;
	rc = 0;
out:
	json_decref(key);
	json_decref(outer);
	return rc;
}
