/* SPDX-License-Identifier: MIT */
/*
 * The working-set-aware scheduler (SparseServe Algorithm 1, docs/design.md "Scheduling").
 *
 * Every unfinished request sits on one of two lists kept in arrival order: `pre` (waiting or
 * part-way through its layer-segmented prefill) and `dec` (decoding). A step walks both as one
 * FCFS sequence (a merge by arrival number), so a prefill that gets no layers this iteration
 * does not hide the decodes behind it, and once the injection budget is spent the prefill side
 * is not walked at all. A third list, `holders`, also in arrival order, holds the requests
 * that own device frames as far as the scheduler knows: preemption takes victims from its
 * tail (latest arrival first) without walking the requests that hold nothing.
 *
 * Work per step: at most 2 * max_requests list entries are visited (max_requests candidates
 * evaluated, max_requests prefills passed over for want of injection budget), each with one
 * kvt_seq_info lookup. Only when the admitted set needs more frames than are free does a step
 * visit the holders list: once to count what preempting could give back, then from its tail
 * until enough is free. Nothing is allocated after kvt_sched_create except one record per
 * submitted request.
 *
 * The manager stays the authority: the scheduler reads kvt_seq_info before admitting a
 * request and after executing one, so a sequence that the engine destroyed, preempted or
 * prefilled on its own is noticed rather than assumed. A request knows its sequence by id and
 * serial (kvt_seq_info.serial): one the engine destroyed and created again under the same id
 * is another sequence, not the request's.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "idmap.h"
#include "kvtier.h"
#include "util.h"

enum phase {
	PH_WAITING = 0, /* submitted, no layer prefilled */
	PH_PREFILL = 1, /* some layers prefilled */
	PH_DECODE = 2,	/* every layer prefilled: producing tokens */
};

struct sreq;

struct link {
	struct sreq *prev, *next;
};

/* One submitted request. DONE requests are not kept: commit reports and frees them. */
struct sreq {
	uint64_t seq;
	uint64_t serial; /* its sequence's kvt_seq_info.serial: the sequence it was submitted for */
	uint64_t order;	 /* arrival number: the FCFS key of every list */
	uint32_t prompt, max_new, generated;
	uint32_t work;	 /* prompt tokens a layer's prefill computes: past its shared prefix */
	uint32_t layers; /* layers prefilled, as of the latest kvt_seq_info */
	uint8_t phase;
	bool holds;	     /* on `holders` */
	bool admitted;	     /* in the batch awaiting commit */
	uint64_t reset_mark; /* iteration + 1 in which it was counted in it.reset */
	struct link q;	     /* `pre` or `dec` */
	struct link h;	     /* `holders` */
};

struct list {
	struct sreq *head, *tail;
	uint32_t n;
};

enum { L_QUEUE = 0, L_HOLD = 1 };

/* An admitted candidate of the current step. */
struct plan {
	struct sreq *r;	   /* NULL once dropped from the batch */
	uint32_t k;	   /* prefill layers this iteration; 0 for a decode */
	bool resume;	   /* preempted now: kvt_seq_resume before it runs */
	uint64_t res, rec; /* working-set estimate: resident part, recall part */
	uint64_t need;	   /* device frames it must newly take (resume + new layers) */
	uint64_t held;	   /* device frames it holds already */
};

struct kvt_sched {
	struct kvt_manager *m;
	struct kvt_sched_config cfg;
	uint32_t n_layers, n_heads, block_tokens;
	struct list pre, dec, holders;
	struct kvt_idmap map; /* seq -> struct sreq */
	uint64_t next_order, iteration;
	bool open;	/* a batch awaits commit */
	bool have_last; /* an iteration was committed */

	/* the current batch; every array holds max_requests entries */
	struct plan *plan;
	uint32_t n_plan;
	struct kvt_sched_item *items;
	struct sreq **item_req; /* NULL: finished since the step */
	uint32_t n_items;
	uint64_t *completed;
	uint32_t n_completed;
	uint64_t *failed; /* requests dropped at this step: their history was lost */
	uint32_t n_failed;
	/* completed requests whose frames the preempt at commit could not free (a device error):
	   freed at the next step instead (release_completed); max_requests entries */
	struct release {
		uint64_t seq, serial;
	} * release;
	uint32_t n_release;
	struct kvt_sched_iter cur, last;
	uint64_t snap_lookups, snap_hits, snap_loads;
	char err[256]; /* the latest failed call's detail (kvt_sched_last_error) */
};

/* ---- errors ----------------------------------------------------------------------------- */

/* Records a failed call's detail, with err's text after it, and returns err. */
__attribute__((format(printf, 3, 4))) static int sfail(struct kvt_sched *s, int err,
						       const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	kvt_verror(s->err, sizeof(s->err), "scheduler: ", err, fmt, ap);
	va_end(ap);
	return err;
}

/* Records a failed call of the manager's as the scheduler's: what for, then the manager's
   detail (which names the error). Returns err. */
static int sfail_m(struct kvt_sched *s, int err, const char *what)
{
	snprintf(s->err, sizeof(s->err), "%s: %s", what, kvt_manager_last_error(s->m));
	kvt_log(KVT_LOG_DEBUG, "scheduler: %s", s->err);
	return err;
}

/* ---- lists ------------------------------------------------------------------------------ */

static inline struct link *lk(struct sreq *r, int which)
{
	return which == L_HOLD ? &r->h : &r->q;
}

/* Inserts r in arrival order, searching back from the tail: O(1) for the usual case (r
   arrived after everything on the list), otherwise one step per later arrival on it. */
static void list_insert(struct list *l, struct sreq *r, int which)
{
	struct sreq *after = l->tail;
	struct link *e = lk(r, which);

	while (after && after->order > r->order)
		after = lk(after, which)->prev;
	e->prev = after;
	e->next = after ? lk(after, which)->next : l->head;
	if (e->next)
		lk(e->next, which)->prev = r;
	else
		l->tail = r;
	if (after)
		lk(after, which)->next = r;
	else
		l->head = r;
	l->n++;
}

static void list_remove(struct list *l, struct sreq *r, int which)
{
	struct link *e = lk(r, which);

	if (e->prev)
		lk(e->prev, which)->next = e->next;
	else
		l->head = e->next;
	if (e->next)
		lk(e->next, which)->prev = e->prev;
	else
		l->tail = e->prev;
	*e = (struct link){0};
	l->n--;
}

/* ---- requests --------------------------------------------------------------------------- */

static inline struct list *queue_of(struct kvt_sched *s, const struct sreq *r)
{
	return r->phase == PH_DECODE ? &s->dec : &s->pre;
}

static void hold(struct kvt_sched *s, struct sreq *r)
{
	if (!r->holds) {
		list_insert(&s->holders, r, L_HOLD);
		r->holds = true;
	}
}

static void unhold(struct kvt_sched *s, struct sreq *r)
{
	if (r->holds) {
		list_remove(&s->holders, r, L_HOLD);
		r->holds = false;
	}
}

/* Every layer of r is prefilled: the prefill produced its first token. */
static void to_decode(struct kvt_sched *s, struct sreq *r)
{
	list_remove(&s->pre, r, L_QUEUE);
	r->phase = PH_DECODE;
	list_insert(&s->dec, r, L_QUEUE);
	r->generated = 1;
}

/* Forgets r entirely (the caller has dealt with its frames and its batch entry). */
static void drop(struct kvt_sched *s, struct sreq *r)
{
	unhold(s, r);
	list_remove(queue_of(s, r), r, L_QUEUE);
	kvt_idmap_del(&s->map, r->seq);
	free(r);
}

/* Counts r once per iteration in it.reset. */
static void mark_reset(struct kvt_sched *s, struct sreq *r)
{
	if (r->reset_mark != s->iteration + 1) {
		r->reset_mark = s->iteration + 1;
		s->cur.reset++;
	}
}

static int seq_info(struct kvt_sched *s, uint64_t seq, struct kvt_seq_info *info)
{
	*info = (struct kvt_seq_info){.size = sizeof(*info)};
	return kvt_seq_info(s->m, seq, info);
}

/* kvt_seq_info of the sequence r was submitted for: -ENOENT when it is gone, also when the
   engine destroyed it and created another under its id (another serial), which is not r's. */
static int req_info(struct kvt_sched *s, const struct sreq *r, struct kvt_seq_info *info)
{
	int err = seq_info(s, r->seq, info);

	return !err && info->serial != r->serial ? -ENOENT : err;
}

/* ---- create / destroy ------------------------------------------------------------------- */

KVT_API int kvt_sched_create(struct kvt_manager *m, const struct kvt_sched_config *cfg,
			     struct kvt_sched **out)
{
	static const struct kvt_sched_config defaults = KVT_SCHED_CONFIG_INIT;
	/* the sizes the struct has had: before `stream` was added, and now */
	size_t old_size = offsetof(struct kvt_sched_config, stream);
	struct kvt_config mc;
	struct kvt_sched *s;
	uint32_t n;
	int err;

	if (!m || !cfg || !out)
		return -EINVAL;
	/* (no scheduler to keep the detail: logged, as the manager's configuration errors; a
	   struct of an unknown size is not read further) */
	if (cfg->size != old_size && cfg->size != sizeof(*cfg)) {
		kvt_log(KVT_LOG_WARN,
			"scheduler: configuration: size %u, expected %zu (or %zu, before `stream`)",
			cfg->size, sizeof(*cfg), old_size);
		return -EINVAL;
	}
	if (cfg->version != KVT_SCHED_CONFIG_VERSION || cfg->reserved) {
		kvt_log(KVT_LOG_WARN,
			"scheduler: configuration: version %u, reserved %u: expected version %u, "
			"reserved 0",
			cfg->version, cfg->reserved, KVT_SCHED_CONFIG_VERSION);
		return -EINVAL;
	}
	if (cfg->max_requests == 0 || cfg->max_tokens == 0 || cfg->max_inject_tokens == 0 ||
	    cfg->ws_control > 1 || cfg->max_requests > (1u << 24)) {
		kvt_log(KVT_LOG_WARN,
			"scheduler: configuration: max_requests %u (1..%u), max_tokens %u, "
			"max_inject_tokens %llu (both at least 1), ws_control %u (0 or 1)",
			cfg->max_requests, 1u << 24, cfg->max_tokens,
			(unsigned long long)cfg->max_inject_tokens, cfg->ws_control);
		return -EINVAL;
	}
	err = kvt_manager_config(m, &mc);
	if (err)
		return err;
	s = kvt_calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->cfg = defaults;
	memcpy(&s->cfg, cfg, cfg->size < sizeof(s->cfg) ? cfg->size : sizeof(s->cfg));
	s->cfg.size = sizeof(s->cfg);
	s->m = m;
	s->n_layers = mc.n_layers;
	s->n_heads = mc.n_kv_heads;
	s->block_tokens = mc.block_tokens;
	n = s->cfg.max_requests;
	s->plan = kvt_calloc(n, sizeof(*s->plan));
	s->items = kvt_calloc(n, sizeof(*s->items));
	s->item_req = kvt_calloc(n, sizeof(*s->item_req));
	s->completed = kvt_calloc(n, sizeof(*s->completed));
	s->failed = kvt_calloc(n, sizeof(*s->failed));
	s->release = kvt_calloc(n, sizeof(*s->release));
	err = kvt_idmap_init(&s->map);
	if (err || !s->plan || !s->items || !s->item_req || !s->completed || !s->failed ||
	    !s->release) {
		kvt_sched_destroy(s);
		return -ENOMEM;
	}
	*out = s;
	return 0;
}

static void release_completed(struct kvt_sched *s);

KVT_API void kvt_sched_destroy(struct kvt_sched *s)
{
	if (!s)
		return;
	release_completed(s);
	while (s->pre.head)
		drop(s, s->pre.head);
	while (s->dec.head)
		drop(s, s->dec.head);
	kvt_idmap_fini(&s->map);
	free(s->plan);
	free(s->items);
	free(s->item_req);
	free(s->completed);
	free(s->failed);
	free(s->release);
	free(s);
}

KVT_API uint32_t kvt_sched_pending(const struct kvt_sched *s)
{
	return s ? s->pre.n + s->dec.n : 0;
}

/* ---- submit / finish -------------------------------------------------------------------- */

/* Frames one prompt layer of full KV takes: the one-layer buffer of layer-segmented prefill,
   counted against the device budget while the request prefills (the engine holds it). */
static inline uint64_t full_layer_frames(const struct kvt_sched *s, uint32_t prompt)
{
	return (uint64_t)DIV_UP(prompt, s->block_tokens) * s->n_heads;
}

/* Takes r out of the current batch, if it is there. */
static void unbatch(struct kvt_sched *s, struct sreq *r)
{
	if (!r->admitted)
		return;
	r->admitted = false;
	for (uint32_t i = 0; i < s->n_items; i++)
		if (s->item_req[i] == r)
			s->item_req[i] = NULL;
}

KVT_API int kvt_sched_submit(struct kvt_sched *s, uint64_t seq, uint32_t max_new_tokens)
{
	struct kvt_stats st = KVT_STATS_INIT;
	struct kvt_seq_info info;
	struct sreq *r;
	uint64_t alone, host;
	int err;

	if (!s)
		return -EINVAL;
	if (max_new_tokens == 0)
		return sfail(s, -EINVAL, "submit: sequence %llu: max_new_tokens is 0 (at least 1)",
			     (unsigned long long)seq);
	r = kvt_idmap_get(&s->map, seq);
	if (r) {
		if (req_info(s, r, &info) != -ENOENT)
			return sfail(s, -EEXIST, "submit: sequence %llu: already queued",
				     (unsigned long long)seq);
		/* its sequence is gone (destroyed by the engine, perhaps created again under
		   the id): forgotten now, as the next step would */
		unbatch(s, r);
		drop(s, r);
	}
	err = seq_info(s, seq, &info);
	if (err)
		return sfail_m(s, err, "submit");
	if (info.layers_prefilled)
		return sfail(s, -EINVAL,
			     "submit: sequence %llu: prefilled already (%u layer%s; submit it "
			     "before its prefill)",
			     (unsigned long long)seq, info.layers_prefilled,
			     info.layers_prefilled == 1 ? "" : "s");
	err = kvt_manager_stats(s->m, &st);
	if (err)
		return sfail_m(s, err, "submit");
	alone = (uint64_t)info.frames_per_layer * s->n_layers;
	if (s->cfg.ws_control)
		alone += full_layer_frames(s, info.prompt_tokens);
	if (alone > st.device_frames_total)
		return sfail(
			s, -E2BIG,
			"submit: sequence %llu needs %llu device frames alone, the device tier "
			"has %llu",
			(unsigned long long)seq, (unsigned long long)alone,
			(unsigned long long)st.device_frames_total);
	/* With a disk tier, the host tier holds what one call touches: at most one layer of a
	   sequence's history (its prefill, or the resident set a resume gathers). */
	host = DIV_UP((uint64_t)info.prompt_tokens + max_new_tokens, s->block_tokens) * s->n_heads;
	if (st.disk_blocks_total && host > st.host_blocks_total)
		return sfail(s, -E2BIG,
			     "submit: sequence %llu: one layer of %llu tokens (prompt and "
			     "max_new_tokens) takes %llu host blocks, the host tier has %llu",
			     (unsigned long long)seq,
			     (unsigned long long)info.prompt_tokens + max_new_tokens,
			     (unsigned long long)host, (unsigned long long)st.host_blocks_total);
	r = kvt_calloc(1, sizeof(*r));
	if (!r)
		return sfail(s, -ENOMEM, "submit: sequence %llu: no memory for its request",
			     (unsigned long long)seq);
	r->seq = seq;
	r->serial = info.serial;
	r->order = s->next_order;
	r->prompt = info.prompt_tokens;
	r->work = info.prompt_tokens - info.prefix_tokens;
	r->max_new = max_new_tokens;
	r->phase = PH_WAITING;
	err = kvt_idmap_put(&s->map, r->seq, r);
	if (err) {
		free(r);
		return sfail(s, err, "submit: sequence %llu: no memory for its request",
			     (unsigned long long)seq);
	}
	s->next_order++;
	list_insert(&s->pre, r, L_QUEUE);
	return 0;
}

KVT_API int kvt_sched_finish(struct kvt_sched *s, uint64_t seq)
{
	struct kvt_seq_info info;
	struct sreq *r;
	int err;

	if (!s)
		return -EINVAL;
	r = kvt_idmap_get(&s->map, seq);
	if (!r)
		return sfail(s, -ENOENT, "finish: sequence %llu: not scheduled here",
			     (unsigned long long)seq);
	/* (a sequence created again under the id is not r's: its frames stay) */
	err = req_info(s, r, &info);
	if (!err && !info.preempted && info.device_frames) {
		err = kvt_seq_preempt(s->m, seq);
		if (err && err != -EALREADY && err != -ENOENT)
			return sfail_m(s, err, "finish: freeing its frames");
	}
	unbatch(s, r);
	drop(s, r);
	return 0;
}

/* ---- step ------------------------------------------------------------------------------- */

/* Walks the candidates FCFS and fills s->plan with those admitted (Algorithm 1). */
static void admit(struct kvt_sched *s, const struct kvt_stats *st)
{
	const bool ws = s->cfg.ws_control, disk = st->disk_blocks_total != 0;
	uint64_t budget = s->cfg.max_inject_tokens, tokens = 0, res_sum = 0, rec_sum = 0;
	uint64_t host_sum = 0;
	uint32_t passed = 0;
	bool prefill_open = true, have_prefill = false;
	struct sreq *p = s->pre.head, *d = s->dec.head;

	s->n_plan = 0;
	while (s->n_plan < s->cfg.max_requests) {
		struct kvt_seq_info info;
		struct sreq *r;
		uint64_t tok = 1, res, rec = 0, need = 0, host;
		uint32_t k = 0;
		int err;

		if (!prefill_open)
			p = NULL;
		if (p && (!d || p->order < d->order)) {
			r = p;
			p = p->q.next;
		} else if (d) {
			r = d;
			d = d->q.next;
		} else {
			break;
		}
		if (r->phase != PH_DECODE) {
			uint32_t left = s->n_layers - r->layers;
			uint64_t fit = budget / r->work;

			k = fit < left ? (uint32_t)fit : left;
			if (k == 0 && !have_prefill)
				k = 1;
			if (k == 0) {
				/* It waits; later decodes are still candidates. */
				if (++passed >= s->cfg.max_requests)
					prefill_open = false;
				continue;
			}
			tok = DIV_UP((uint64_t)r->work * k, s->n_layers);
		}
		if (s->n_plan && tokens + tok > s->cfg.max_tokens)
			break;
		err = req_info(s, r, &info);
		if (err == -ENOENT) {
			/* destroyed by the engine behind the scheduler's back (perhaps created
			   again under its id: another request) */
			drop(s, r);
			continue;
		}
		if (err)
			continue;
		if (info.preempted)
			unhold(s, r);
		if (r->phase == PH_DECODE) {
			res = (uint64_t)info.frames_per_layer * s->n_layers;
			if (ws)
				rec = info.recall_ws_frames;
		} else {
			/* kvt_seq_info is the truth about its progress */
			r->layers = info.layers_prefilled;
			if (r->layers >= s->n_layers) {
				/* the engine prefilled it on its own: it decodes from now on */
				to_decode(s, r);
				continue;
			}
			if (k > s->n_layers - r->layers)
				k = s->n_layers - r->layers;
			res = (uint64_t)info.frames_per_layer * (r->layers + k);
			if (ws)
				res += full_layer_frames(s, r->prompt);
			need = (uint64_t)info.frames_per_layer * k;
		}
		/* With a disk tier, what the iteration touches in the host tier must fit it
		   together, so a step does not spill what it reads next: per decode the block
		   each layer's token goes to and the recall working set, per prefill one layer
		   of its prompt (the layers before it may go to disk). */
		host = k ? (uint64_t)s->n_heads * DIV_UP(r->prompt, s->block_tokens)
			 : (uint64_t)s->n_heads * s->n_layers + rec;
		/* The recall part of a lone candidate is let through: a working set larger than
		   the whole recall cache must still run (recall evicts within it). */
		if (res_sum + res > st->device_frames_total ||
		    (ws && s->n_plan && rec_sum + rec > st->recall_frames_total) ||
		    (disk && s->n_plan && host_sum + host > st->host_blocks_total)) {
			mark_reset(s, r);
			break;
		}
		if (info.preempted)
			need += (uint64_t)info.frames_per_layer * info.layers_prefilled;
		s->plan[s->n_plan++] = (struct plan){
			.r = r,
			.k = k,
			.resume = info.preempted != 0,
			.res = res,
			.rec = rec,
			.need = need,
			.held = info.device_frames,
		};
		r->admitted = true;
		res_sum += res;
		rec_sum += rec;
		host_sum += host;
		tokens += tok;
		if (k) {
			uint64_t used = (uint64_t)k * r->work;

			budget -= used < budget ? used : budget;
			have_prefill = true;
			if (budget == 0)
				prefill_open = false;
		}
	}
}

static uint64_t frames_free(struct kvt_sched *s)
{
	struct kvt_stats st = KVT_STATS_INIT;

	return kvt_manager_stats(s->m, &st) ? 0 : st.device_frames_free;
}

/* Takes plan entry i out of the batch; it stays queued. */
static void unplan(struct kvt_sched *s, uint32_t i)
{
	struct sreq *r = s->plan[i].r;

	r->admitted = false;
	mark_reset(s, r);
	s->plan[i].r = NULL;
}

/* Frames the holders outside the batch could give back, as the manager counts them now
   (holders found preempted or gone on the way are set right). Visits every holder. */
static uint64_t spare_frames(struct kvt_sched *s)
{
	uint64_t spare = 0;
	struct sreq *v = s->holders.head;

	while (v) {
		struct sreq *next = v->h.next;
		struct kvt_seq_info info;

		if (!v->admitted) {
			int err = req_info(s, v, &info);

			if (err == -ENOENT)
				drop(s, v);
			else if (!err && info.preempted)
				unhold(s, v);
			else if (!err)
				spare += info.device_frames;
		}
		v = next;
	}
	return spare;
}

/* Makes room for the admitted set (preempting holders that are not admitted, latest arrival
   first) and resumes the admitted preempted requests. */
static void make_resident(struct kvt_sched *s, uint64_t free_frames)
{
	uint64_t need = 0;
	struct sreq *v;

	for (uint32_t i = 0; i < s->n_plan; i++)
		need += s->plan[i].need;
	if (free_frames < need) {
		uint64_t spare = spare_frames(s);

		/* Frames held outside the scheduler: not even preempting every holder outside the
		   batch would do. The latest admitted requests that need frames wait instead (and
		   join the holders that may be preempted), so that no earlier request loses its
		   frames for a later one and the engine's calls cannot fail for want of frames. */
		for (uint32_t i = s->n_plan; free_frames + spare < need && i-- > 0;) {
			struct plan *pl = &s->plan[i];

			if (!pl->need)
				continue;
			need -= pl->need;
			spare += pl->held;
			unplan(s, i);
		}
	}
	v = s->holders.tail;
	while (free_frames < need && v) {
		struct sreq *prev = v->h.prev;
		int err;

		if (!v->admitted) {
			err = kvt_seq_preempt(s->m, v->seq);
			if (err == -ENOENT) {
				drop(s, v);
			} else if (!err || err == -EALREADY) {
				unhold(s, v);
				if (!err) {
					s->cur.preempted++;
					mark_reset(s, v);
					free_frames = frames_free(s);
				}
			}
		}
		v = prev;
	}
	/* Still short only when the manager's accounting moved under us: the same rule. */
	for (uint32_t i = s->n_plan; free_frames < need && i-- > 0;) {
		if (s->plan[i].r && s->plan[i].need) {
			need -= s->plan[i].need;
			unplan(s, i);
		}
	}
	for (uint32_t i = 0; i < s->n_plan; i++) {
		struct plan *pl = &s->plan[i];
		int err;

		if (!pl->r || !pl->resume)
			continue;
		err = kvt_seq_resume(s->m, pl->r->seq, s->cfg.stream);
		if (err == -ENOENT) {
			pl->r->admitted = false;
			drop(s, pl->r);
			pl->r = NULL;
			continue;
		}
		if (err) {
			unplan(s, i);
			continue;
		}
		s->cur.resumed++;
		if (pl->r->layers)
			hold(s, pl->r);
	}
}

/* With a disk tier: brings back, in one batched read, the blocks the admitted requests'
   decode appends to (kvt_seq_fetch), so the engine's calls find them in the host tier. A request
   whose read fails waits (I/O error: retried next step; no room: its turn comes); one whose history
   was lost is dropped and reported in the batch's failed list. */
static void fetch_planned(struct kvt_sched *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->n_plan; i++)
		if (s->plan[i].r)
			s->failed[n++] = s->plan[i].r->seq; /* scratch: the list of seqs */
	if (!n || kvt_seq_fetch(s->m, s->failed, n) == 0)
		return;
	for (uint32_t i = 0; i < s->n_plan; i++) {
		struct plan *pl = &s->plan[i];
		int err;

		if (!pl->r)
			continue;
		err = kvt_seq_fetch(s->m, &pl->r->seq, 1);
		if (err == -EBADMSG || err == -ENOENT) {
			uint64_t seq = pl->r->seq;

			unplan(s, i);
			drop(s, kvt_idmap_get(&s->map, seq));
			if (err == -EBADMSG)
				s->failed[s->n_failed++] = seq;
		} else if (err) {
			unplan(s, i);
		}
	}
}

/* Lays the plan out as items: prefills first, then decodes, FCFS within each. */
static void emit(struct kvt_sched *s)
{
	struct kvt_sched_iter *it = &s->cur;

	s->n_items = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < s->n_plan; i++) {
			const struct plan *pl = &s->plan[i];
			struct kvt_sched_item *item = &s->items[s->n_items];

			if (!pl->r || (pass == 0) != (pl->k > 0))
				continue;
			*item = (struct kvt_sched_item){.seq = pl->r->seq};
			if (pl->k) {
				item->layer_begin = pl->r->layers;
				item->layer_end = pl->r->layers + pl->k;
				it->n_prefill++;
				it->prefill_token_layers += (uint64_t)pl->k * pl->r->work;
			} else {
				item->decode = 1;
				it->n_decode++;
			}
			it->ws_estimate_frames += pl->res + pl->rec;
			s->item_req[s->n_items++] = pl->r;
		}
	}
	it->batch_size = s->n_items;
	it->admitted = s->n_items;
}

/* Frees the frames of the completed requests whose preempt failed at commit, before the step
   counts free frames; keeps those that fail again for the next step. A sequence gone (or
   created again under the id), already preempted, holding nothing or submitted again as a new
   request is no longer ours to free. */
static void release_completed(struct kvt_sched *s)
{
	uint32_t w = 0;

	for (uint32_t i = 0; i < s->n_release; i++) {
		uint64_t seq = s->release[i].seq;
		struct kvt_seq_info info;
		int err = seq_info(s, seq, &info);

		if (err || info.serial != s->release[i].serial || info.preempted ||
		    !info.device_frames || kvt_idmap_get(&s->map, seq))
			continue;
		err = kvt_seq_preempt(s->m, seq);
		if (err && err != -EALREADY && err != -ENOENT)
			s->release[w++] = s->release[i];
	}
	s->n_release = w;
}

KVT_API int kvt_sched_step(struct kvt_sched *s, struct kvt_sched_batch *out)
{
	struct kvt_stats st = KVT_STATS_INIT;
	int err;

	if (!s)
		return -EINVAL;
	if (!out)
		return sfail(s, -EINVAL, "step: NULL batch");
	if (s->open)
		return sfail(s, -EBUSY,
			     "step: the previous batch is not committed (kvt_sched_commit)");
	release_completed(s);
	err = kvt_manager_stats(s->m, &st);
	if (err)
		return sfail_m(s, err, "step");
	s->cur = (struct kvt_sched_iter){.iteration = s->iteration, .completed = s->n_completed};
	s->n_failed = 0;
	admit(s, &st);
	make_resident(s, st.device_frames_free);
	if (st.disk_blocks_total) {
		s->n_failed = 0;
		fetch_planned(s);
	}
	emit(s);
	s->cur.queued = kvt_sched_pending(s) - s->n_items;
	s->snap_lookups = st.recall_lookups;
	s->snap_hits = st.recall_hits;
	s->snap_loads = st.recall_loads;
	s->open = true;
	s->iteration++;
	*out = (struct kvt_sched_batch){
		.items = s->items,
		.n_items = s->n_items,
		.completed = s->completed,
		.n_completed = s->n_completed,
		.failed = s->failed,
		.n_failed = s->n_failed,
		.it = s->cur,
	};
	return 0;
}

/* ---- commit ----------------------------------------------------------------------------- */

/* r produced its last token: frees its frames and reports it at the next step. */
static void complete(struct kvt_sched *s, struct sreq *r)
{
	int err = kvt_seq_preempt(s->m, r->seq);

	/* -EALREADY: nothing held; -ENOENT: already gone. Any other error (the CUDA backend could
	   not wait for the device) changed nothing: the request completed all the same, and the
	   next step frees its frames, unless the engine has destroyed it by then. */
	if (err && err != -EALREADY && err != -ENOENT && s->n_release < s->cfg.max_requests)
		s->release[s->n_release++] = (struct release){r->seq, r->serial};
	s->completed[s->n_completed++] = r->seq;
	drop(s, r);
}

KVT_API int kvt_sched_commit(struct kvt_sched *s)
{
	struct kvt_stats st = KVT_STATS_INIT;
	uint64_t touched = 0;

	if (!s)
		return -EINVAL;
	if (!s->open)
		return sfail(s, -EINVAL, "commit: no batch to commit (kvt_sched_step first)");
	s->n_completed = 0;
	for (uint32_t i = 0; i < s->n_items; i++) {
		const struct kvt_sched_item *item = &s->items[i];
		struct sreq *r = s->item_req[i];
		struct kvt_seq_info info;
		int err;

		if (!r)
			continue;
		r->admitted = false;
		err = req_info(s, r, &info);
		if (err == -ENOENT) {
			drop(s, r);
			continue;
		}
		if (err)
			continue;
		if (item->decode) {
			touched += (uint64_t)info.frames_per_layer * s->n_layers +
				   info.recall_step_frames;
			r->generated++;
		} else {
			touched += info.device_frames;
			r->layers = info.layers_prefilled;
			if (r->layers && !info.preempted)
				hold(s, r);
			if (info.preempted)
				unhold(s, r);
			if (r->layers >= s->n_layers) {
				to_decode(s, r);
			} else if (r->layers) {
				r->phase = PH_PREFILL;
			}
		}
		if (r->generated >= r->max_new)
			complete(s, r);
	}
	s->n_items = 0;
	s->open = false;
	if (!kvt_manager_stats(s->m, &st)) {
		s->cur.blocks_loaded = st.recall_loads - s->snap_loads;
		s->cur.recall_lookups = st.recall_lookups - s->snap_lookups;
		s->cur.recall_hits = st.recall_hits - s->snap_hits;
	}
	s->cur.ws_touched_frames = touched;
	s->last = s->cur;
	s->have_last = true;
	return 0;
}

KVT_API int kvt_sched_last(const struct kvt_sched *s, struct kvt_sched_iter *out)
{
	if (!s || !out)
		return -EINVAL;
	if (!s->have_last)
		return -ENOENT;
	*out = s->last;
	return 0;
}

KVT_API const char *kvt_sched_last_error(const struct kvt_sched *s)
{
	return s ? s->err : "no scheduler";
}
