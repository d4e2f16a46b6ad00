/* SPDX-License-Identifier: MIT */
/*
 * The prefix cache: spans of prompts, named by the engine's hash chains, whose host block groups
 * are shared between the cache and the sequences created on them (prefix.h).
 *
 * A span is registered by the sequence that wrote it, once all its layers are prefilled: its
 * groups gain the span as an owner (href), so they outlive the sequence. A sequence created on
 * a cached run holds each span (users) and owns its groups once more. When no sequence holds a
 * span it goes to the idle list; the host tier's need for room evicts idle spans from the head
 * (least recently used; within a chain the latest span first, as vLLM's free queue does).
 */
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "disk.h"
#include "prefix.h"

int kvt_prefix_init(struct kvt_manager *m)
{
	int err = kvt_idmap_init(&m->px.map);

	if (err)
		return err;
	m->px.href = kvt_calloc(m->host.n_units, sizeof(*m->px.href));
	if (!m->px.href) {
		kvt_idmap_fini(&m->px.map);
		return -ENOMEM;
	}
	return 0;
}

void kvt_prefix_fini(struct kvt_manager *m)
{
	struct kvt_pspan *sp;

	for (uint32_t pos = 0; (sp = kvt_idmap_next(&m->px.map, &pos));)
		free(sp);
	kvt_idmap_fini(&m->px.map);
	free(m->px.href);
	free(m->px.dio);
	free(m->px.gids);
	m->px = (struct kvt_prefix){0};
}

struct kvt_seq_px *kvt_seq_px_new(const struct kvt_manager *m, uint32_t n_chain)
{
	struct kvt_seq_px *px = kvt_calloc(1, sizeof(*px) + m->cfg.n_layers * sizeof(px->fill[0]));

	if (!px)
		return NULL;
	if (n_chain) {
		px->chain = kvt_malloc((size_t)n_chain * sizeof(*px->chain));
		px->spans = kvt_malloc((size_t)n_chain * sizeof(*px->spans));
		if (!px->chain || !px->spans) {
			kvt_seq_px_free(px);
			return NULL;
		}
	}
	return px;
}

void kvt_seq_px_free(struct kvt_seq_px *px)
{
	if (!px)
		return;
	free(px->chain);
	free(px->spans);
	free(px);
}

/* How many ids ahead kvt_host_release fetches what it reads of a group: the groups of a
   history or span lie anywhere in the tier, so each is a miss of its own. */
#define RELEASE_AHEAD 16

void kvt_host_release(struct kvt_manager *m, const uint32_t *ids, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t g = ids[i];

		if (i + RELEASE_AHEAD < n) {
			uint32_t a = ids[i + RELEASE_AHEAD];

			if (m->px.href && a < m->host.n_units)
				__builtin_prefetch(&m->px.href[a]);
			kvt_pool_prefetch(&m->host, a);
		}

		if (m->px.href && m->px.href[g])
			m->px.href[g]--;
		else
			ALWAYS(kvt_pool_free(&m->host, &g, 1) == 0);
	}
}

struct kvt_pspan *kvt_prefix_span(const struct kvt_manager *m, uint64_t hash)
{
	return kvt_idmap_get(&m->px.map, hash);
}

uint32_t kvt_prefix_run(const struct kvt_manager *m, const uint64_t *hashes, uint32_t n,
			uint32_t hash_tokens, uint32_t max_spans)
{
	uint32_t k = 0;

	n = n < max_spans ? n : max_spans;
	for (; k < n; k++) {
		const struct kvt_pspan *sp = kvt_prefix_span(m, hashes[k]);

		if (!sp || sp->index != k || sp->hash_tokens != hash_tokens || sp->bad)
			break;
	}
	return k;
}

static void idle_unlink(struct kvt_manager *m, struct kvt_pspan *sp)
{
	if (sp->prev)
		sp->prev->next = sp->next;
	else
		m->px.idle_head = sp->next;
	if (sp->next)
		sp->next->prev = sp->prev;
	else
		m->px.idle_tail = sp->prev;
	sp->prev = sp->next = NULL;
	m->px.groups_idle -= sp->n_ids;
}

static void idle_push(struct kvt_manager *m, struct kvt_pspan *sp)
{
	sp->next = NULL;
	sp->prev = m->px.idle_tail;
	if (m->px.idle_tail)
		m->px.idle_tail->next = sp;
	else
		m->px.idle_head = sp;
	m->px.idle_tail = sp;
	m->px.groups_idle += sp->n_ids;
}

/* Removes an idle span from the cache, giving back its groups or slots. */
static void span_drop(struct kvt_manager *m, struct kvt_pspan *sp)
{
	if (NEVER(sp->users))
		return;
	idle_unlink(m, sp);
	if (sp->on_disk) {
		for (uint32_t i = 0; i < sp->n_ids; i++)
			kvt_disk_release(m->disk, sp->ids[i]);
		m->px.groups_disk -= sp->n_ids;
	} else {
		kvt_host_release(m, sp->ids, sp->n_ids);
	}
	m->px.groups -= sp->n_ids;
	kvt_idmap_del(&m->px.map, sp->hash);
	m->st.prefix_spans_evicted++;
	free(sp);
}

void kvt_prefix_hold(struct kvt_manager *m, struct kvt_pspan *sp)
{
	if (sp->users++ == 0)
		idle_unlink(m, sp);
}

void kvt_prefix_unhold(struct kvt_manager *m, struct kvt_pspan *const *spans, uint32_t n)
{
	while (n-- > 0) {
		struct kvt_pspan *sp = spans[n];

		if (NEVER(sp->users == 0))
			continue;
		if (--sp->users)
			continue;
		idle_push(m, sp);
		if (sp->bad)
			span_drop(m, sp);
	}
}

uint64_t kvt_prefix_disk_groups(struct kvt_pspan *const *sp, uint32_t n)
{
	uint64_t g = 0;

	for (uint32_t i = 0; i < n; i++)
		g += sp[i]->on_disk ? sp[i]->n_ids : 0;
	return g;
}

static int reserve_dio(struct kvt_manager *m, uint32_t n)
{
	return kvt_reserve((void **)&m->px.dio, &m->px.dio_cap, n, sizeof(*m->px.dio));
}

uint32_t kvt_prefix_restore(struct kvt_manager *m, struct kvt_pspan *const *sp, uint32_t n)
{
	uint64_t want = kvt_prefix_disk_groups(sp, n);
	uint32_t k = 0, at = 0, ok_spans = n;

	if (!want)
		return n;
	if (want > m->host.n_free || want > UINT32_MAX || reserve_dio(m, (uint32_t)want) ||
	    kvt_reserve((void **)&m->px.gids, &m->px.gids_cap, (uint32_t)want,
			sizeof(*m->px.gids))) {
		for (uint32_t i = 0; i < n; i++)
			if (sp[i]->on_disk)
				return i;
		return n;
	}
	ALWAYS(kvt_pool_alloc(&m->host, (uint32_t)want, m->px.gids) == 0);
	for (uint32_t i = 0; i < n; i++) {
		if (!sp[i]->on_disk)
			continue;
		for (uint32_t j = 0; j < sp[i]->n_ids; j++, k++)
			m->px.dio[k] = (struct kvt_disk_io){
				.addr = m->host_base + (uint64_t)m->px.gids[k] * m->group_bytes,
				.slot = sp[i]->ids[j],
			};
	}
	kvt_disk_read(m->disk, m->px.dio, k);
	/* Commit span by span: one whose units all read is placed, the others keep their slots
	   (a checksum mismatch marks the span bad). */
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_pspan *s = sp[i];
		int res = 0;

		if (!s->on_disk)
			continue;
		for (uint32_t j = 0; j < s->n_ids; j++)
			if (m->px.dio[at + j].res && res != -EBADMSG)
				res = m->px.dio[at + j].res;
		if (res) {
			ALWAYS(kvt_pool_free(&m->host, &m->px.gids[at], s->n_ids) == 0);
			s->bad |= res == -EBADMSG;
			ok_spans = ok_spans < i ? ok_spans : i;
		} else {
			for (uint32_t j = 0; j < s->n_ids; j++) {
				kvt_disk_release(m->disk, s->ids[j]);
				s->ids[j] = m->px.gids[at + j];
			}
			s->on_disk = false;
			m->px.groups_disk -= s->n_ids;
			m->st.prefix_spans_restored++;
			m->st.disk_blocks_fetched += (uint64_t)s->n_ids * m->cfg.n_kv_heads;
		}
		at += s->n_ids;
	}
	return ok_spans;
}

/* Starts loading the span counts of host groups g[0 .. n). */
static void prefetch_hrefs(const struct kvt_manager *m, const uint32_t *g, uint32_t n)
{
	for (uint32_t j = 0; j < n; j++)
		__builtin_prefetch(&m->px.href[g[j]], 1);
}

void kvt_prefix_register(struct kvt_manager *m, struct kvt_seq *s)
{
	struct kvt_seq_px *px = s->px;
	uint32_t per, n_ids;

	if (!px || !px->n_chain)
		return;
	per = px->hash_tokens >> m->lbt;
	n_ids = per * m->cfg.n_layers;
	for (uint32_t i = px->n_spans; i < px->n_chain; i++) {
		struct kvt_pspan *sp;
		bool in_host = true;

		if (kvt_prefix_span(m, px->chain[i]))
			continue;
		for (uint32_t l = 0; l < m->cfg.n_layers && in_host; l++)
			for (uint32_t b = i * per; b < (i + 1) * per && in_host; b++)
				in_host = !(s->layers[l].groups[b] & KVT_SPILLED);
		if (!in_host)
			continue;
		sp = kvt_malloc(sizeof(*sp) + (size_t)n_ids * sizeof(sp->ids[0]));
		if (!sp)
			return;
		*sp = (struct kvt_pspan){
			.hash = px->chain[i],
			.ticket = s->save_ticket,
			.index = i,
			.hash_tokens = px->hash_tokens,
			.users = 1,
			.n_ids = n_ids,
		};
		if (kvt_idmap_put(&m->px.map, sp->hash, sp)) {
			free(sp);
			return;
		}
		/* the groups lie anywhere in the tier: a layer's counts come in while the layer
		   before raises its own */
		prefetch_hrefs(m, s->layers[0].groups + i * per, per);
		for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
			if (l + 1 < m->cfg.n_layers)
				prefetch_hrefs(m, s->layers[l + 1].groups + i * per, per);
			for (uint32_t j = 0; j < per; j++) {
				uint32_t g = s->layers[l].groups[i * per + j];

				sp->ids[l * per + j] = g;
				m->px.href[g]++;
			}
		}
		m->px.groups += n_ids;
		px->spans[px->n_spans++] = sp;
	}
}

bool kvt_prefix_idle(const struct kvt_manager *m)
{
	for (const struct kvt_pspan *sp = m->px.idle_head; sp; sp = sp->next)
		if (!sp->on_disk)
			return true;
	return false;
}

/* Writes an idle span's groups to the spill file and frees them in the host tier: true. When
   the write fails the span is dropped instead (and freed): false. */
static bool span_spill(struct kvt_manager *m, struct kvt_pspan *sp)
{
	uint32_t n = sp->n_ids, written;

	if (reserve_dio(m, n) || m->ops->save_wait(m->be, sp->ticket)) {
		span_drop(m, sp);
		return false;
	}
	for (uint32_t i = 0; i < n; i++)
		m->px.dio[i] = (struct kvt_disk_io){
			.addr = m->host_base + (uint64_t)sp->ids[i] * m->group_bytes,
		};
	written = kvt_disk_write(m->disk, m->px.dio, n);
	if (written != n) {
		for (uint32_t i = 0; i < n; i++)
			if (!m->px.dio[i].res)
				kvt_disk_release(m->disk, m->px.dio[i].slot);
		span_drop(m, sp);
		return false;
	}
	for (uint32_t i = 0; i < n; i++) {
		ALWAYS(m->px.href[sp->ids[i]] == 0); /* idle: the span is its only owner */
		ALWAYS(kvt_pool_free(&m->host, &sp->ids[i], 1) == 0);
		sp->ids[i] = m->px.dio[i].slot;
	}
	sp->on_disk = true;
	m->px.groups_disk += n;
	m->st.prefix_spans_spilled++;
	m->st.disk_blocks_spilled += (uint64_t)n * m->cfg.n_kv_heads;
	return true;
}

void kvt_prefix_evict(struct kvt_manager *m, uint32_t target)
{
	struct kvt_pspan *sp = m->px.idle_head, *next;

	for (; sp && m->host.n_free < target; sp = next) {
		next = sp->next;
		if (sp->on_disk)
			continue;
		if (!m->disk) {
			span_drop(m, sp);
		} else if (span_spill(m, sp) && next) {
			/* still idle, now on disk: behind the spans in the host tier */
			idle_unlink(m, sp);
			idle_push(m, sp);
		}
	}
}

uint32_t kvt_prefix_drop_disk(struct kvt_manager *m)
{
	struct kvt_pspan *sp = m->px.idle_head, *next;
	uint32_t n = 0;

	for (; sp; sp = next) {
		next = sp->next;
		if (sp->on_disk) {
			span_drop(m, sp);
			n++;
		}
	}
	return n;
}

int kvt_prefix_corrupt_span(struct kvt_manager *m, uint64_t hash, uint32_t unit)
{
	struct kvt_pspan *sp = kvt_prefix_span(m, hash);

	if (!sp || !sp->on_disk || unit >= sp->n_ids)
		return -ENOENT;
	return kvt_disk_corrupt(m->disk, sp->ids[unit]);
}
