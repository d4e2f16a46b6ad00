/* SPDX-License-Identifier: MIT */
/*
 * The vLLM baseline of the replay engine (policy full): plain vLLM's paged KV in HBM and dense
 * attention, on the run's bookkeeping (replay_impl.h). The library is not involved.
 *
 * Automatic prefix caching (vLLM's APC), at the trace's granularity: a span is the 32 pages
 * of one 512-token hash id. Once a request's prompt is prefilled, each of its whole spans is
 * cached (a span another request cached already is shared instead, and the request's copy
 * freed); a later request whose leading ids are cached shares those spans, reference
 * counted, and prefills only the rest. A span no request references stays cached, its pages
 * counted free for admission, until pages are needed: then the least recently released goes
 * first, and of one request's spans the latest of the chain first (vLLM frees a request's
 * blocks in reverse order for that). Eviction comes before any preemption; a referenced span
 * is never evicted.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hmap.h"
#include "replay_impl.h"

#define FULL_BLOCK 16
#define SPAN_PAGES (SIM_TRACE_HASH_TOKENS / FULL_BLOCK)
#define NIL UINT32_MAX

/* A request's state in the baseline. */
struct freq {
	uint32_t prompt;      /* tokens to prefill: input, or input + generated on recompute */
	uint32_t blocks_held; /* KV pages held, not counting the cached spans it shares */
	uint32_t done_tok;    /* prompt tokens prefilled so far (chunked), shared ones included */
	uint32_t n_ref;	      /* its leading hash ids whose cached spans it references */
	bool started;	      /* the current prompt has its pages (from its first chunk) */
	bool created;	      /* counted in the prefix figures (its first admission) */
};

/* A cached span: SPAN_PAGES pages of one hash id. */
struct fspan {
	uint64_t id;
	uint32_t refs;	     /* requests sharing it; 0: idle, in the LRU list */
	uint32_t prev, next; /* the LRU list (head: evicted first), or the free slots (next) */
};

struct frun {
	struct run *run;
	struct freq *fq; /* [requests] */
	uint64_t total, free_blocks;
	/* APC: spans by id, their slots, the idle ones least recently released first */
	bool apc;
	struct sim_hmap map;
	struct fspan *spans;
	uint32_t n_spans, cap_spans, free_slot, lru_head, lru_tail;
	uint64_t idle_pages; /* pages of idle spans: free for admission, evicted on demand */
	size_t *wait;	     /* deque of request indices (preempted ones go to the front) */
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

/* ---- APC ---------------------------------------------------------------------------- */

static void lru_unlink(struct frun *f, uint32_t s)
{
	struct fspan *p = &f->spans[s];

	if (p->prev != NIL)
		f->spans[p->prev].next = p->next;
	else
		f->lru_head = p->next;
	if (p->next != NIL)
		f->spans[p->next].prev = p->prev;
	else
		f->lru_tail = p->prev;
	f->idle_pages -= SPAN_PAGES;
}

static void lru_push_tail(struct frun *f, uint32_t s)
{
	struct fspan *p = &f->spans[s];

	p->prev = f->lru_tail;
	p->next = NIL;
	if (f->lru_tail != NIL)
		f->spans[f->lru_tail].next = s;
	else
		f->lru_head = s;
	f->lru_tail = s;
	f->idle_pages += SPAN_PAGES;
}

/* Evicts the least recently released idle span: its pages become free. false when none. */
static bool fevict_one(struct frun *f)
{
	uint32_t s = f->lru_head;

	if (s == NIL)
		return false;
	lru_unlink(f, s);
	sim_hmap_del(&f->map, f->spans[s].id);
	f->spans[s].next = f->free_slot;
	f->free_slot = s;
	f->n_spans--;
	f->free_blocks += SPAN_PAGES;
	return true;
}

/* Frees pages until `pages` are free, evicting idle spans: false when they cannot be. */
static bool fmake_free(struct frun *f, uint64_t pages)
{
	while (f->free_blocks < pages)
		if (!fevict_one(f))
			return false;
	return true;
}

/* The hash ids of request i (NULL without APC or ids), n of them. */
static const uint64_t *fids(const struct frun *f, size_t i, uint32_t *n)
{
	const struct sim_trace_req *q = &f->run->t->reqs[i];

	*n = f->apc ? q->n_hash : 0;
	return *n ? sim_trace_hashes(f->run->t, q) : NULL;
}

/* How many leading spans of request i's prompt of `prompt` tokens are cached (never the
   whole prompt), and the pages of those that are idle into *idle. Changes nothing. */
static uint32_t fmatch(const struct frun *f, size_t i, uint32_t prompt, uint64_t *idle)
{
	uint32_t n, k = 0;
	const uint64_t *ids = fids(f, i, &n);

	*idle = 0;
	for (; k < n && (uint64_t)(k + 1) * SIM_TRACE_HASH_TOKENS < prompt; k++) {
		uint32_t s = sim_hmap_get(&f->map, ids[k]);

		if (s == SIM_HMAP_NONE)
			break;
		if (!f->spans[s].refs)
			*idle += SPAN_PAGES;
	}
	return k;
}

/* Request i references the cached spans of its ids [from, to) (all cached). */
static void fref(struct frun *f, size_t i, uint32_t from, uint32_t to)
{
	uint32_t n;
	const uint64_t *ids = fids(f, i, &n);

	for (uint32_t k = from; k < to; k++) {
		uint32_t s = sim_hmap_get(&f->map, ids[k]);

		if (f->spans[s].refs++ == 0)
			lru_unlink(f, s);
	}
	f->fq[i].n_ref = to;
}

/* Request i drops its spans, the latest of its chain first into the LRU list. */
static void funref(struct frun *f, size_t i)
{
	uint32_t n;
	const uint64_t *ids = fids(f, i, &n);

	for (uint32_t k = f->fq[i].n_ref; k-- > 0;) {
		uint32_t s = sim_hmap_get(&f->map, ids[k]);

		if (--f->spans[s].refs == 0)
			lru_push_tail(f, s);
	}
	f->fq[i].n_ref = 0;
}

/* Caches the whole spans of request i's prompt, now prefilled: each of its ids past the
   spans it shares becomes a span of its pages, or, cached by another request meanwhile, is
   shared and its own copy freed. 0 or -ENOMEM. */
static int fcache(struct frun *f, size_t i)
{
	struct freq *q = &f->fq[i];
	uint32_t n;
	const uint64_t *ids = fids(f, i, &n);

	for (uint32_t k = q->n_ref; k < n; k++) {
		uint32_t s = sim_hmap_get(&f->map, ids[k]);

		if (s == SIM_HMAP_NONE) {
			if (f->free_slot == NIL) {
				uint32_t cap = f->cap_spans ? 2 * f->cap_spans : 1024;
				struct fspan *p = realloc(f->spans, cap * sizeof(*p));

				if (!p)
					return -ENOMEM;
				for (uint32_t j = cap; j-- > f->cap_spans;) {
					p[j].next = f->free_slot;
					f->free_slot = j;
				}
				f->spans = p;
				f->cap_spans = cap;
			}
			s = f->free_slot;
			if (sim_hmap_put(&f->map, ids[k], s))
				return -ENOMEM;
			f->free_slot = f->spans[s].next;
			f->spans[s] =
				(struct fspan){.id = ids[k], .refs = 1, .prev = NIL, .next = NIL};
			f->n_spans++;
		} else {
			if (f->spans[s].refs++ == 0)
				lru_unlink(f, s);
			f->free_blocks += SPAN_PAGES; /* its duplicate */
		}
		q->blocks_held -= SPAN_PAGES;
		q->n_ref = k + 1;
	}
	return 0;
}

/* Frees request i's pages and drops its spans. */
static void ffree(struct frun *f, size_t i)
{
	f->free_blocks += f->fq[i].blocks_held;
	f->fq[i].blocks_held = 0;
	funref(f, i);
}

/* Preempts the latest running request (recompute: back to the front of the queue). */
static void fpreempt_last(struct frun *f)
{
	size_t i = f->running[--f->n_run];
	struct freq *q = &f->fq[i];

	ffree(f, i);
	q->done_tok = 0;
	q->started = false;
	q->prompt = f->run->res->reqs[i].input_tokens + f->run->res->reqs[i].generated;
	fwait_push_front(f, i);
	f->run->res->preemptions++;
}

/* Takes this iteration's prefills from the front of the queue into pre[] and pre_tok[], with
   their pages (at a prompt's first chunk): vLLM v0 gives prefills their own iteration, whole
   prompts within T_max (the first one even past it); chunked prefill (v1) mixes one budget of
   decode tokens and prompt chunks of at most B tokens. A prompt's cached leading spans are
   shared at its first chunk: it needs pages only for the rest, counts only the rest against
   the budgets, and idle spans count as free pages (less those it shares). Returns how many. */
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
		uint64_t idle = 0;
		uint32_t k = q->started ? 0 : fmatch(f, i, q->prompt, &idle);
		uint32_t first = q->started ? q->done_tok : k * SIM_TRACE_HASH_TOKENS;
		uint32_t left = q->prompt - first, take;
		uint32_t pages = q->started ? 0 : fblocks(q->prompt) - k * SPAN_PAGES;

		/* one page of watermark (at its first chunk) */
		if (!q->started && pages + 1 > f->free_blocks + f->idle_pages - idle)
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
		if (!q->started) {
			struct sim_replay_result *res = f->run->res;

			fref(f, i, 0, k);
			fmake_free(f, pages); /* cannot fail: checked above */
			q->started = true;
			q->done_tok = first;
			if (!q->created) {
				q->created = true;
				res->prefix_input_tokens += res->reqs[i].input_tokens;
				res->prefix_hit_tokens += first;
			}
		}
		f->free_blocks -= pages;
		q->blocks_held += pages;
		f->run->res->prefill_tokens += take;
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

/* Gives each running request a page for its next token where it needs one, evicting an idle
   cached span, else preempting the latest running request (recomputed later), while a page
   is missing. Returns how many decode this iteration: those still running. */
static size_t fdecode_pages(struct frun *f)
{
	const struct sim_replay_result *res = f->run->res;

	for (size_t k = 0; k < f->n_run; k++) {
		size_t i = f->running[k];
		uint64_t toks = (uint64_t)res->reqs[i].input_tokens + res->reqs[i].generated + 1;

		while (k < f->n_run &&
		       fblocks(toks) > f->fq[i].blocks_held + f->fq[i].n_ref * SPAN_PAGES) {
			if (f->free_blocks || fevict_one(f)) {
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
		q->started = false;
		if (fcache(f, i))
			return -ENOMEM;
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
	f.apc = run->o->prefix_cache && run->t->hash_ids;
	f.free_slot = f.lru_head = f.lru_tail = NIL;
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
	free(f.spans);
	sim_hmap_fini(&f.map);
	return err;
}
