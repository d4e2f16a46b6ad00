/* SPDX-License-Identifier: MIT */
/*
 * The vLLM baseline of the replay engine (policy full): plain vLLM's paged KV in HBM and dense
 * attention, on the run's bookkeeping (replay_impl.h). The library is not involved.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "replay_impl.h"

#define FULL_BLOCK 16

/* A request's state in the baseline. */
struct freq {
	uint32_t prompt;      /* tokens to prefill: input, or input + generated on recompute */
	uint32_t blocks_held; /* KV pages held */
	uint32_t done_tok;    /* prompt tokens prefilled so far (chunked) */
};

struct frun {
	struct run *run;
	struct freq *fq; /* [requests] */
	uint64_t total, free_blocks;
	size_t *wait; /* deque of request indices (preempted ones go to the front) */
	size_t w_head, w_n, cap;
	size_t *running;
	size_t n_run;
	size_t *pre;	   /* this iteration's prefills ... */
	uint32_t *pre_tok; /* ... and their tokens */
};

static uint32_t fblocks(uint64_t tokens)
{
	return (uint32_t)((tokens + FULL_BLOCK - 1) / FULL_BLOCK);
}

static void fwait_push_back(struct frun *f, size_t i)
{
	f->wait[(f->w_head + f->w_n++) % f->cap] = i;
}

static void fwait_push_front(struct frun *f, size_t i)
{
	f->w_head = (f->w_head + f->cap - 1) % f->cap;
	f->wait[f->w_head] = i;
	f->w_n++;
}

static void fadmit_arrivals(struct frun *f)
{
	struct run *run = f->run;
	size_t i;

	while ((i = run_arriving(run)) != SIZE_MAX) {
		const char *why = run_static_reject(run, i);
		const struct sim_trace_req *q = &run->t->reqs[i];

		run->next++;
		/* admission keeps one page free: a request must fit with it, even when
		   recomputed near its end */
		if (!why && fblocks((uint64_t)q->input_tokens + q->output_tokens) + 1 > f->total)
			why = "its KV exceeds the HBM budget";
		if (why) {
			run_fail_req(run, i, why);
			continue;
		}
		f->fq[i].prompt = q->input_tokens;
		fwait_push_back(f, i);
	}
}

/* Frees request i's blocks. */
static void ffree(struct frun *f, size_t i)
{
	f->free_blocks += f->fq[i].blocks_held;
	f->fq[i].blocks_held = 0;
}

/* Preempts the latest running request (recompute: back to the front of the queue). */
static void fpreempt_last(struct frun *f)
{
	size_t i = f->running[--f->n_run];
	struct freq *q = &f->fq[i];

	ffree(f, i);
	q->done_tok = 0;
	q->prompt = f->run->res->reqs[i].input_tokens + f->run->res->reqs[i].generated;
	fwait_push_front(f, i);
	f->run->res->preemptions++;
}

/* Takes this iteration's prefills from the front of the queue into pre[] and pre_tok[], with
   their pages (at a prompt's first chunk): vLLM v0 gives prefills their own iteration, whole
   prompts within T_max (the first one even past it); chunked prefill (v1) mixes one budget of
   decode tokens and prompt chunks of at most B tokens. Returns how many. */
static size_t fadmit_prefills(struct frun *f)
{
	const struct sim_replay_opts *o = f->run->o;
	uint32_t chunk = o->chunk_tokens;
	uint64_t budget = chunk ? (o->max_tokens > chunk ? o->max_tokens : chunk) : o->max_tokens;
	uint64_t used = chunk ? f->n_run : 0, pre_used = 0;
	size_t n_pre = 0;

	while (f->w_n && f->n_run + n_pre < o->max_requests) {
		size_t i = f->wait[f->w_head];
		struct freq *q = &f->fq[i];
		uint32_t left = q->prompt - q->done_tok, take;
		uint32_t pages = q->done_tok ? 0 : fblocks(q->prompt); /* at its first chunk */

		if (pages && pages + 1 > f->free_blocks) /* one page of watermark */
			break;
		take = left;
		if (chunk) { /* at most B prompt tokens, and the iteration's budget */
			uint64_t room = budget > used ? budget - used : 0;

			if (chunk - pre_used < room)
				room = chunk - pre_used;
			if (take > room)
				take = (uint32_t)room;
		} else if (used + take > budget && n_pre) {
			break; /* v0: whole prompts, the first one even past the budget */
		}
		if (!take)
			break;
		f->free_blocks -= pages;
		q->blocks_held += pages;
		used += take;
		pre_used += take;
		f->pre[n_pre] = i;
		f->pre_tok[n_pre++] = take;
		f->w_head = (f->w_head + 1) % f->cap;
		f->w_n--;
		q->done_tok += take;
		if (take < left) {
			/* stays at the front for its next chunk */
			fwait_push_front(f, i);
			break;
		}
	}
	return n_pre;
}

/* Gives each running request a page for its next token where it needs one, preempting the
   latest running request (recomputed later) while a page is missing. Returns how many decode
   this iteration: those still running. */
static size_t fdecode_pages(struct frun *f)
{
	const struct sim_replay_result *res = f->run->res;

	for (size_t k = 0; k < f->n_run; k++) {
		size_t i = f->running[k];
		uint64_t toks = (uint64_t)res->reqs[i].input_tokens + res->reqs[i].generated + 1;

		while (k < f->n_run && fblocks(toks) > f->fq[i].blocks_held) {
			if (f->free_blocks) {
				f->free_blocks--;
				f->fq[i].blocks_held++;
			} else {
				fpreempt_last(f);
			}
		}
	}
	return f->n_run;
}

/* Stamps the iteration's tokens at run->now: one for each of the first n_dec running requests,
   then the first of each prefill whose prompt is complete (a recomputed request has it
   already), which joins the running list. Completed requests free their pages. 0 or -ENOMEM. */
static int fstamp_tokens(struct frun *f, size_t n_dec, size_t n_pre, bool win)
{
	struct run *run = f->run;

	for (size_t k = 0; k < n_dec;) {
		size_t i = f->running[k];

		if (run_token(run, i, win))
			return -ENOMEM;
		if (run->res->reqs[i].status == SIM_REQ_DONE) {
			ffree(f, i);
			memmove(&f->running[k], &f->running[k + 1],
				(f->n_run - k - 1) * sizeof(*f->running));
			f->n_run--;
			n_dec--;
			continue;
		}
		k++;
	}
	for (size_t k = 0; k < n_pre; k++) {
		size_t i = f->pre[k];
		struct freq *q = &f->fq[i];

		if (q->done_tok < q->prompt)
			continue; /* more chunks to go */
		q->done_tok = 0;
		if (run->res->reqs[i].generated == 0 && run_token(run, i, win))
			return -ENOMEM;
		if (run->res->reqs[i].status == SIM_REQ_DONE) {
			ffree(f, i);
			continue;
		}
		f->running[f->n_run++] = i;
	}
	return 0;
}

static int frun_iteration(struct frun *f)
{
	struct run *run = f->run;
	const struct sim_replay_opts *o = run->o;
	const struct sim_model_preset *mp = &o->model;
	struct sim_iter_work w = {0};
	struct iter_rec ir = {0};
	double start = run->now, kvb = sim_model_kv_token_bytes(mp);
	bool win = run->iter >= o->warmup_iterations;
	size_t n_pre = fadmit_prefills(f), n_dec = 0;
	int err;

	/* decodes run unless this is a v0 prefill iteration */
	if (o->chunk_tokens || !n_pre) {
		n_dec = fdecode_pages(f);
		for (size_t k = 0; k < n_dec; k++) {
			size_t i = f->running[k];

			w.kv_bytes_read += kvb * ((double)run->res->reqs[i].input_tokens +
						  run->res->reqs[i].generated);
		}
	}
	for (size_t k = 0; k < n_pre; k++) {
		uint32_t end = f->fq[f->pre[k]].done_tok, begin = end - f->pre_tok[k];

		if (run->res->reqs[f->pre[k]].sched_s < 0)
			run->res->reqs[f->pre[k]].sched_s = run->now;
		w.prefill_token_layers += (uint64_t)f->pre_tok[k] * mp->n_layers;
		/* chunk [begin, end) attends to every earlier token */
		w.prefill_attn_s +=
			sim_prefill_attn_s(&o->gpu,
					   sim_prefill_attn_flops(mp, end, mp->n_layers) -
						   sim_prefill_attn_flops(mp, begin, mp->n_layers),
					   end - begin, end);
	}
	if (n_pre + n_dec == 0) { /* a bug: the arrival check should have failed it */
		ERRF("full: request %zu waits for pages with nothing running", f->wait[f->w_head]);
		return -EDEADLK;
	}
	w.decode_tokens = n_dec;
	sim_iter_time(mp, &o->gpu, &w, &ir.tm);
	run->now += ir.tm.total_s;
	ir.batch = (uint32_t)(n_pre + n_dec);
	ir.n_pre = (uint32_t)n_pre;
	ir.n_dec = (uint32_t)n_dec;
	ir.token_layers = w.prefill_token_layers;
	ir.queued = (uint32_t)f->w_n;
	err = fstamp_tokens(f, n_dec, n_pre, win);
	if (!err)
		err = run_end_iteration(run, &ir, start);
	if (err == -ENOMEM)
		ERRF("out of memory");
	return err;
}

int frun_loop(struct run *run, double hbm_bytes)
{
	struct frun f = {.run = run};
	int err = 0;

	f.total = (uint64_t)(hbm_bytes / (FULL_BLOCK * sim_model_kv_token_bytes(&run->o->model)));
	f.free_blocks = f.total;
	f.cap = run->t->count + 1;
	f.wait = malloc(f.cap * sizeof(*f.wait));
	f.running = malloc(f.cap * sizeof(*f.running));
	f.pre = malloc(f.cap * sizeof(*f.pre));
	f.pre_tok = malloc(f.cap * sizeof(*f.pre_tok));
	f.fq = calloc(run->t->count, sizeof(*f.fq));
	if (!f.wait || !f.running || !f.pre || !f.pre_tok || !f.fq) {
		err = -ENOMEM;
		goto out;
	}
	while (!run_over(run)) {
		fadmit_arrivals(&f);
		if (!f.w_n && !f.n_run) {
			double na = run_next_arrival(run);

			if (na < 0)
				break;
			if (na > run->now)
				run->now = na;
			continue;
		}
		err = frun_iteration(&f);
		if (err)
			goto out;
	}
out:
	free(f.wait);
	free(f.running);
	free(f.pre);
	free(f.pre_tok);
	free(f.fq);
	return err;
}
