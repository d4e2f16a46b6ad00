/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "t_check.h"
#include "t_config.h"
#include "t_data.h"
#include "t_ops.h"
#include "util.h"

uint64_t t_seed;
long t_op = -1;
const char *t_what = "setup";

void t_run_context(char *buf, size_t len)
{
	if (t_op >= 0)
		snprintf(buf, len, "seed %llu, op %ld (%s): ", (unsigned long long)t_seed, t_op,
			 t_what);
	else
		snprintf(buf, len, "%s: ", t_what);
}

void t_run_init(struct t_run *r, const struct kvt_config *c, uint32_t max_live)
{
	assert_true(c->n_layers <= T_RUN_MAX_LAYERS);
	memset(r, 0, sizeof(*r));
	r->c = *c;
	r->rb = t_rowb(c);
	r->max_live = max_live;
	r->live = t_xmalloc(max_live * sizeof(*r->live));
	r->id_small = 1000;
	r->prompt_span = 260;
}

void t_run_remove(struct t_run *r, uint32_t i)
{
	struct t_seq *s = &r->live[i];

	for (int l = 0; l < T_RUN_MAX_LAYERS; l++)
		free(s->layer[l]);
	*s = r->live[--r->n_live];
	memset(&r->live[r->n_live], 0, sizeof(*s));
}

void t_run_fini(struct t_run *r)
{
	while (r->n_live)
		t_run_remove(r, r->n_live - 1);
	free(r->live);
	r->live = NULL;
}

void t_run_check_stats(const struct t_run *r, const struct kvt_stats *st)
{
	CHECK_EQ(st->live_seqs, r->n_live);
	CHECK_EQ(st->device_frames_used + st->device_frames_free, st->device_frames_total);
	CHECK_EQ(st->host_blocks_used + st->host_blocks_free, st->host_blocks_total);
	CHECK_EQ(st->tokens_prompt, r->tokens_prompt);
	CHECK_EQ(st->tokens_appended, r->tokens_appended);
	CHECK_EQ(st->tokens_saved, r->tokens_prompt + r->tokens_appended);
	CHECK_EQ(st->prefill_layers, r->prefill_layers);
	CHECK_EQ(st->decode_calls, r->decode_calls);
}

struct t_seq *t_run_find(const struct t_run *r, uint64_t id)
{
	for (uint32_t i = 0; i < r->n_live; i++)
		if (r->live[i].id == id)
			return &r->live[i];
	return NULL;
}

uint32_t t_run_prompt(const struct t_run *r)
{
	const struct kvt_config *c = &r->c;
	uint32_t sr = c->sink_tokens + c->recent_tokens;

	switch (t_rng_below(4)) {
	case 0: /* Case 1, edges included */
		return 1 + t_rng_below(sr + 1);
	case 1: /* just past sink + recent: few candidates */
		return sr + 1 + t_rng_below(c->obs_window + c->topk_tokens + 2);
	default: /* long: top-K applies */
		return sr + 1 + t_rng_below(r->prompt_span);
	}
}

struct t_seq *t_run_create(struct t_run *r)
{
	const struct kvt_config *c = &r->c;
	uint32_t L = t_run_prompt(r);
	struct kvt_snapkv sp = t_snapkv_of(c, L);
	struct t_seq *s;
	uint64_t id;

	t_what = "create";
	assert_true(r->n_live < r->max_live);
	if (r->n_dead && t_rng_below(4) == 0) {
		uint32_t k = t_rng_below(r->n_dead);

		id = r->dead[k]; /* ids of destroyed sequences may come back */
		r->dead[k] = r->dead[--r->n_dead];
	} else {
		id = t_rng_below(8) == 0 ? t_rng_below(r->id_small) : t_rng_next();
	}
	if (t_run_find(r, id))
		return NULL;
	CHECK_RC(kvt_seq_create(r->m, id, L), 0);
	s = &r->live[r->n_live++];
	memset(s, 0, sizeof(*s));
	s->id = id;
	s->L = L;
	s->count = kvt_snapkv_count(&sp);
	CHECK_EQ(s->count, t_naive_count(c, L));
	s->fph = DIV_UP(c->sink_tokens + c->recent_tokens + s->count, c->block_tokens);
	r->created++;
	return s;
}

void t_run_destroy(struct t_run *r)
{
	uint32_t i;

	t_what = "destroy";
	if (!r->n_live)
		return;
	i = t_rng_below(r->n_live);
	CHECK_RC(kvt_seq_destroy(r->m, r->live[i].id), 0);
	if (r->n_dead < T_RUN_DEAD_IDS)
		r->dead[r->n_dead++] = r->live[i].id;
	else
		r->dead[t_rng_below(T_RUN_DEAD_IDS)] = r->live[i].id;
	t_run_remove(r, i);
	r->destroyed++;
}

uint32_t t_run_pick_batch(const struct t_run *r, uint32_t l, struct t_seq **out, uint32_t max)
{
	struct t_seq **cand = t_xmalloc(r->n_live * sizeof(*cand));
	uint32_t n_cand = 0, n = 0;

	for (uint32_t i = 0; i < r->n_live; i++)
		if (r->live[i].n[l] && !r->live[i].pre)
			cand[n_cand++] = &r->live[i];
	if (n_cand)
		n = 1 + t_rng_below(n_cand < max ? n_cand : max);
	for (uint32_t i = 0; i < n; i++) { /* partial Fisher-Yates */
		uint32_t j = i + t_rng_below(n_cand - i);
		struct t_seq *t = cand[i];

		cand[i] = cand[j];
		cand[j] = t;
		out[i] = cand[i];
	}
	free(cand);
	return n;
}

struct t_seq *t_run_pick(const struct t_run *r, bool resume)
{
	struct t_seq *s = &r->live[t_rng_below(r->n_live)];

	for (int tries = 0; tries < 8 && s->pre != resume; tries++)
		s = &r->live[t_rng_below(r->n_live)];
	return s;
}

void t_run_loop(struct t_run *r, long ops, const struct t_mix *mix, void (*after)(struct t_run *r))
{
	assert_true(mix->n >= 1 && mix->n <= T_MIX_MAX && mix->phase_ops > 0);
	for (t_op = 0; t_op < ops; t_op++) {
		long k = mix->ends_filling ? (ops - 1 - t_op) : t_op;
		const uint32_t *t = (k / mix->phase_ops) % 2 ? mix->drain : mix->fill;
		uint32_t x = t_rng_below(100), i = 0;

		while (i < mix->n - 1 && x >= t[i])
			i++;
		mix->op[i](r);
		if (after)
			after(r);
	}
}
