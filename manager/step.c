/* SPDX-License-Identifier: MIT */
/*
 * Decode steps (kvtier.h, "Decode steps"): an engine names its decode batch once per step,
 * kvt_step_begin validates it and resolves each member's state, and the step's per-layer calls
 * (append, recall) are kvt_decode_append, kvt_decode_recall, kvt_recall_blocks and
 * kvt_recall_device_blocks on that batch
 * with no lookup by id: base.h's kvt_member reads the resolved states while a step call runs.
 *
 * A sequence freed meanwhile (kvt_seq_destroy) would leave a resolved state dangling, so every
 * free counts in m->seq_frees, and a step call that sees the count moved resolves its members
 * again by id first: a destroyed member then fails the call as it would fail the plain call
 * (-ENOENT), and the step stays open for the engine to end and begin again without it. A
 * member created again under its id (m->seq_creates moved) is found by the next call.
 * Everything else a plain call checks per member (lost, preempted, prefilled, its tables) the
 * step calls check too: they are the plain calls.
 */
#include <errno.h>
#include <string.h>

#include "base.h"
#include "kvtier.h"
#include "recall.h"
#include "tables.h"

/* Makes the step's members the resolved states of the calls that follow (kvt_member), after
   resolving them again when a sequence was freed since. 0, or -EINVAL recorded when no step is
   open. */
static int step_enter(struct kvt_manager *m, const char *what)
{
	struct kvt_step *st = &m->step;

	if (!st->open)
		return kvt_fail(m, -EINVAL, "%s: no step begun (kvt_step_begin)", what);
	if (st->frees != m->seq_frees || (st->missing && st->creates != m->seq_creates)) {
		st->missing = 0;
		for (uint32_t i = 0; i < st->n; i++) {
			st->of[i] = kvt_seqmap_get(&m->seqs, st->ids[i]);
			st->missing += !st->of[i];
		}
		st->frees = m->seq_frees;
		st->creates = m->seq_creates;
	}
	st->active = true;
	return 0;
}

/* Grows the step's arrays to n members, keeping what they hold (the open step). 0 or
   -ENOMEM. */
static int step_reserve(struct kvt_step *st, uint32_t n)
{
	uint32_t c_ids = st->cap, c_of = st->cap;

	if (kvt_reserve((void **)&st->ids, &c_ids, n, sizeof(*st->ids)) ||
	    kvt_reserve((void **)&st->of, &c_of, n, sizeof(*st->of)))
		return -ENOMEM;
	st->cap = c_ids < c_of ? c_ids : c_of;
	return 0;
}

KVT_API int kvt_step_begin(struct kvt_manager *m, const uint64_t *seqs, uint32_t n)
{
	struct kvt_step *st;
	uint64_t stamp;
	int err = 0;

	if (!m)
		return -EINVAL;
	st = &m->step;
	if (!seqs || n == 0)
		return kvt_fail(m, -EINVAL, "step: %s", n == 0 ? "empty batch" : "NULL pointer");
	if (step_reserve(st, n) ||
	    kvt_reserve((void **)&m->batch, &m->batch_cap, n, sizeof(*m->batch)))
		return kvt_fail(m, -ENOMEM, "step: no memory for a batch of %u", n);
	/* The members are checked into the batch scratch: the open step is untouched until the
	   new one is valid. */
	stamp = ++m->stamp;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = kvt_seq_usable(m, seqs[i], "step", &err);

		if (!s)
			return err;
		if (s->stamp == stamp)
			return kvt_fail(m, -EINVAL,
					"step: sequence %llu appears twice in the batch",
					(unsigned long long)seqs[i]);
		s->stamp = stamp;
		if (s->preempted)
			return kvt_fail(m, -EINVAL,
					"step: sequence %llu: preempted (resume it first)",
					(unsigned long long)seqs[i]);
		m->batch[i] = s;
	}
	/* The blocks the step's appends write come back from the spill file now, in one read,
	   rather than layer by layer. */
	if (m->disk) {
		err = kvt_seq_fetch(m, seqs, n);
		if (err)
			return err;
	}
	memcpy(st->ids, seqs, n * sizeof(*st->ids));
	memcpy(st->of, m->batch, n * sizeof(*st->of));
	st->n = n;
	st->missing = 0;
	st->frees = m->seq_frees;
	st->creates = m->seq_creates;
	st->open = true;
	/* every recall of the step sizes its regions by the working sets as counted now */
	kvt_recall_freeze(m);
	return 0;
}

KVT_API int kvt_step_append(struct kvt_manager *m, uint32_t layer, const void *k, const void *v,
			    void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = step_enter(m, "decode");
	if (err)
		return err;
	err = kvt_decode_append(m, layer, m->step.ids, m->step.n, k, v, stream);
	m->step.active = false;
	return err;
}

KVT_API int kvt_step_recall(struct kvt_manager *m, uint32_t layer, const void *q, void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = step_enter(m, "recall");
	if (err)
		return err;
	err = kvt_decode_recall(m, layer, m->step.ids, m->step.n, q, stream);
	m->step.active = false;
	return err;
}

KVT_API int kvt_step_recall_blocks(struct kvt_manager *m, uint32_t layer, const uint32_t *blocks,
				   uint32_t r, void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = step_enter(m, "recall");
	if (err)
		return err;
	err = kvt_recall_blocks(m, layer, m->step.ids, m->step.n, blocks, r, stream);
	m->step.active = false;
	return err;
}

KVT_API int kvt_step_recall_device_blocks(struct kvt_manager *m, uint32_t layer,
					  const uint32_t *blocks, uint32_t r, void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = step_enter(m, "recall");
	if (err)
		return err;
	err = kvt_recall_device_blocks(m, layer, m->step.ids, m->step.n, blocks, r, stream);
	m->step.active = false;
	return err;
}

KVT_API int kvt_step_tables(struct kvt_manager *m, uint32_t layer, const struct kvt_attn_tables *t,
			    void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = step_enter(m, "tables");
	if (err)
		return err;
	err = kvt_tables_write(m, layer, m->step.ids, m->step.n, t, stream);
	m->step.active = false;
	return err;
}

KVT_API int kvt_step_paged(struct kvt_manager *m, uint32_t layer, const struct kvt_paged_tables *t,
			   void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = step_enter(m, "paged");
	if (err)
		return err;
	err = kvt_paged_write(m, layer, m->step.ids, m->step.n, t, stream);
	m->step.active = false;
	return err;
}

KVT_API int kvt_step_attend(struct kvt_manager *m, uint32_t layer, const void *q, void *out,
			    float *lse, void *stream)
{
	int err;

	if (!m)
		return -EINVAL;
	err = step_enter(m, "attend");
	if (err)
		return err;
	err = kvt_attend_run(m, layer, m->step.ids, m->step.n, q, out, lse, stream);
	m->step.active = false;
	return err;
}

KVT_API int kvt_step_end(struct kvt_manager *m)
{
	if (!m)
		return -EINVAL;
	if (!m->step.open)
		return kvt_fail(m, -EALREADY, "step: none begun");
	m->step.open = false;
	m->step.n = 0;
	return 0;
}
