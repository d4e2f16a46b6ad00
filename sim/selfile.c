/* SPDX-License-Identifier: MIT */
/* Recorded decode selections (selfile.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "selfile.h"
#include "simutil.h"

static const char *const field_names[] = {"REQUEST", "STEP", "LAYER", "HEAD"};

static int cmp_key(const struct sim_selrec *a, const struct sim_selrec *b)
{
	if (a->req != b->req)
		return a->req < b->req ? -1 : 1;
	if (a->step != b->step)
		return a->step < b->step ? -1 : 1;
	if (a->layer != b->layer)
		return a->layer < b->layer ? -1 : 1;
	if (a->head != b->head)
		return a->head < b->head ? -1 : 1;
	return 0;
}

static int cmp_rec(const void *a, const void *b)
{
	return cmp_key(a, b);
}

/* Parses one unsigned 32-bit field at *p (advancing it): 0, 1 at the end of the line, -1
   when not a number. */
static int field(char **p, uint32_t *out)
{
	char *s = *p + strspn(*p, " \t\r\n"), *end;
	unsigned long long v;

	if (!*s)
		return 1;
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || v > UINT32_MAX || (*end && !strchr(" \t\r\n", *end)))
		return -1;
	*out = (uint32_t)v;
	*p = end;
	return 0;
}

static int grow(void **a, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 1024;
	void *p;

	while (nc < need)
		nc *= 2;
	p = realloc(*a, nc * size);
	if (!p)
		return -ENOMEM;
	*a = p;
	*cap = nc;
	return 0;
}

int sim_selfile_read(const char *path, struct sim_selfile *out, char *err, size_t err_len)
{
	struct sim_selfile f = {0};
	size_t cap_rec = 0, cap_blk = 0, len = 0;
	char *line = NULL;
	uint32_t ln = 0;
	FILE *fp = fopen(path, "r");
	int rc = 0;

	if (!fp) {
		rc = -errno;
		snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
		return rc;
	}
	snprintf(f.path, sizeof(f.path), "%s", path);
	while (getline(&line, &len, fp) != -1) {
		struct sim_selrec r = {.line = ++ln};
		uint32_t *key[4] = {&r.req, &r.step, &r.layer, &r.head}, b;
		char *p = line;
		int k;

		if (ln == 1 && !strncmp(p, SIM_UTF8_BOM, SIM_UTF8_BOM_LEN))
			p += SIM_UTF8_BOM_LEN; /* as traces and preset files skip it */
		p += strspn(p, " \t");

		if (*p == '#' || !*(p + strspn(p, " \t\r\n")))
			continue;
		for (int i = 0; i < 4; i++) {
			k = field(&p, key[i]);
			if (k) {
				snprintf(err, err_len, "%s:%u: field '%s': %s", path, ln,
					 field_names[i], k > 0 ? "missing" : "not a number");
				rc = -EINVAL;
				goto out;
			}
		}
		r.first = (uint32_t)f.n_blocks;
		while ((k = field(&p, &b)) == 0) {
			if (grow((void **)&f.blocks, &cap_blk, f.n_blocks + 1, sizeof(*f.blocks)))
				goto nomem;
			f.blocks[f.n_blocks++] = b;
			r.n++;
		}
		if (k < 0) {
			snprintf(err, err_len, "%s:%u: field 'BLOCK %u': not a number", path, ln,
				 r.n + 1);
			rc = -EINVAL;
			goto out;
		}
		if (grow((void **)&f.rec, &cap_rec, f.n_rec + 1, sizeof(*f.rec)))
			goto nomem;
		f.rec[f.n_rec++] = r;
	}
	if (ferror(fp)) {
		snprintf(err, err_len, "%s: read error", path);
		rc = -EIO;
		goto out;
	}
	if (f.n_rec > 1)
		qsort(f.rec, f.n_rec, sizeof(*f.rec), cmp_rec);
	for (size_t i = 1; i < f.n_rec; i++)
		if (!cmp_key(&f.rec[i - 1], &f.rec[i])) {
			uint32_t a = f.rec[i - 1].line, c = f.rec[i].line;

			snprintf(err, err_len,
				 "%s:%u: record repeats line %u's (request, step, layer, head)",
				 path, a > c ? a : c, a > c ? c : a);
			rc = -EINVAL;
			goto out;
		}
	*out = f;
	memset(&f, 0, sizeof(f));
	goto out;
nomem:
	snprintf(err, err_len, "%s: out of memory", path);
	rc = -ENOMEM;
out:
	free(line);
	fclose(fp);
	sim_selfile_free(&f);
	return rc;
}

void sim_selfile_free(struct sim_selfile *f)
{
	if (!f)
		return;
	free(f->rec);
	free(f->blocks);
	memset(f, 0, sizeof(*f));
}

const struct sim_selrec *sim_selfile_find(const struct sim_selfile *f, uint32_t req, uint32_t step,
					  uint32_t layer, uint32_t head)
{
	struct sim_selrec key = {.req = req, .step = step, .layer = layer, .head = head};

	return f->n_rec ? bsearch(&key, f->rec, f->n_rec, sizeof(*f->rec), cmp_rec) : NULL;
}

int sim_selfile_has_req(const struct sim_selfile *f, uint32_t req)
{
	size_t lo = 0, hi = f->n_rec;

	while (lo < hi) { /* first record with req >= req */
		size_t mid = lo + (hi - lo) / 2;

		if (f->rec[mid].req < req)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < f->n_rec && f->rec[lo].req == req;
}
