/* SPDX-License-Identifier: MIT */
/* Decode selection model (selection.h). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "simutil.h"
#include "selection.h"

static double uniform(uint64_t *s)
{
	return (double)(sim_splitmix64(s) >> 11) * 0x1.0p-53;
}

static uint32_t below(uint64_t *s, uint32_t n)
{
	return (uint32_t)(((sim_splitmix64(s) >> 32) * n) >> 32);
}

int sim_sel_check(const struct sim_sel_params *p)
{
	if (!p || p->r == 0 || p->r > 1024 || p->window == 0 || p->window > 64 ||
	    !(p->p_keep >= 0 && p->p_keep <= 1) || !(p->p_revisit >= 0 && p->p_revisit <= 1))
		return -EINVAL;
	return 0;
}

int sim_sel_stream_init(const struct sim_sel_params *p, uint64_t id, struct sim_sel_stream *st)
{
	memset(st, 0, sizeof(*st));
	st->cur = malloc(p->r * sizeof(*st->cur));
	st->drop = malloc((size_t)p->window * p->r * sizeof(*st->drop));
	st->dstep = malloc((size_t)p->window * p->r * sizeof(*st->dstep));
	if (!st->cur || !st->drop || !st->dstep) {
		sim_sel_stream_fini(st);
		return -ENOMEM;
	}
	st->rng = p->seed ^ (id * 0xd1b54a32d192ed03ull);
	sim_splitmix64(&st->rng);
	return 0;
}

void sim_sel_stream_fini(struct sim_sel_stream *st)
{
	free(st->cur);
	free(st->drop);
	free(st->dstep);
	memset(st, 0, sizeof(*st));
}

static bool chosen(const uint32_t *out, uint32_t n, uint32_t b)
{
	for (uint32_t i = 0; i < n; i++)
		if (out[i] == b)
			return true;
	return false;
}

/* Records a dropped block (the ring keeps the latest window * r). */
static void push_drop(const struct sim_sel_params *p, struct sim_sel_stream *st, uint32_t b)
{
	uint32_t cap = p->window * p->r, at = (st->drop_head + st->n_drop) % cap;

	if (st->n_drop == cap) {
		st->drop_head = (st->drop_head + 1) % cap;
		st->n_drop--;
		at = (st->drop_head + st->n_drop) % cap;
	}
	st->drop[at] = b;
	st->dstep[at] = st->step;
	st->n_drop++;
}

void sim_sel_next(const struct sim_sel_params *p, struct sim_sel_stream *st, uint32_t lo,
		  uint32_t hi, uint32_t *out)
{
	uint32_t span = hi > lo ? hi - lo : 0, k = span < p->r ? span : p->r, n = 0;
	uint32_t cap = p->window * p->r;

	st->step++;
	/* forget drops older than the window */
	while (st->n_drop && st->step - st->dstep[st->drop_head] > p->window) {
		st->drop_head = (st->drop_head + 1) % cap;
		st->n_drop--;
	}
	for (uint32_t j = 0; j < k; j++) {
		uint32_t b = UINT32_MAX;

		if (j < st->n_cur) {
			uint32_t prev = st->cur[j];
			bool keep = prev >= lo && prev < hi && uniform(&st->rng) < p->p_keep &&
				    !chosen(out, n, prev);

			if (keep)
				b = prev;
			else
				push_drop(p, st, prev);
		}
		if (b == UINT32_MAX && st->n_drop && uniform(&st->rng) < p->p_revisit) {
			uint32_t d = st->drop[(st->drop_head + below(&st->rng, st->n_drop)) % cap];

			if (d >= lo && d < hi && !chosen(out, n, d) &&
			    !(j < st->n_cur && d == st->cur[j]))
				b = d;
		}
		for (int tries = 0; b == UINT32_MAX && tries < 64; tries++) {
			uint32_t c = lo + below(&st->rng, span);

			if (!chosen(out, n, c))
				b = c;
		}
		for (uint32_t c = lo; b == UINT32_MAX && c < hi; c++) /* dense corner */
			if (!chosen(out, n, c))
				b = c;
		out[n++] = b;
	}
	for (uint32_t j = k; j < p->r; j++)
		out[j] = UINT32_MAX;
	memcpy(st->cur, out, k * sizeof(*out));
	st->n_cur = k;
}
