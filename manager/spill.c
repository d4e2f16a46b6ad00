/* SPDX-License-Identifier: MIT */
/*
 * The disk tier in the manager: the host tier is a cache of every sequence's history, and the
 * spill file holds what it cannot. A spilled group's entry in its layer's group table holds
 * KVT_SPILLED | disk slot instead of a host group id, so a sequence's tables say where each
 * block lives without another index.
 *
 * Fetching is block-granular: a call lists the blocks it touches (kvt_spill_want: decode the
 * block it appends to, recall the blocks it loads, resume the resident set's blocks, a token
 * read its block, prefill nothing of the old history), which pins those in the host tier and
 * lists the spilled ones, then reads all of those back in one batched read
 * (kvt_spill_fetch_wanted). So a history larger than the host tier runs, and only what a call
 * touches must fit. A read that fails leaves its block on disk (the call fails with -EIO and may
 * be retried); a CRC mismatch loses the sequence (-EBADMSG from then on).
 *
 * Spilling (kvt_spill_room): when a call needs more host groups than are free, groups are
 * written out least recently used sequence first (smallest stamp), never one the call pinned,
 * and each layer's last group (the one decode appends to next) only when the others do not
 * suffice, until the request plus a little slack is free: the slack (1/64 of the host tier)
 * makes one victim scan and one I/O batch serve many later allocations instead of one each.
 * Pins are the call's stamp in m->hpin[group]: a new call (a new stamp) releases them all.
 */
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "disk.h"
#include "prefix.h"
#include "recall.h"
#include "spill.h"

/* Groups written per I/O batch (bounds the scratch lists, not the I/O depth). */
#define SPILL_BATCH 4096u

struct victim {
	uint64_t stamp;
	struct kvt_seq *s;
};

int kvt_spill_open(struct kvt_manager *m)
{
	struct kvt_disk_params p = {
		.dir = m->cfg.spill_dir,
		.unit_bytes = m->group_bytes,
		.max_bytes = m->cfg.disk_bytes,
		.queue_depth = m->cfg.disk_queue_depth,
		.model = !m->payload,
		.model_gbps = m->cfg.model_disk_gbps,
		.model_ns = m->cfg.model_disk_ns,
	};
	char err[256] = "";
	int e;

	if (!m->cfg.spill_dir)
		return 0;
	if (m->host.n_units >= KVT_SPILLED) {
		kvt_log(KVT_LOG_WARN, "invalid configuration: the disk tier needs fewer than 2^31 "
				      "host block groups");
		return -EINVAL;
	}
	m->spill_dir = kvt_malloc(strlen(m->cfg.spill_dir) + 1);
	if (!m->spill_dir)
		return -ENOMEM;
	strcpy(m->spill_dir, m->cfg.spill_dir);
	m->cfg.spill_dir = m->spill_dir;
	/* calloc maps zero pages: nothing is touched until a group is pinned */
	m->hpin = kvt_calloc(m->host.n_units, sizeof(*m->hpin));
	if (!m->hpin)
		return -ENOMEM;
	e = kvt_disk_open(&p, &m->disk, err, sizeof(err));
	if (e) {
		kvt_log(KVT_LOG_WARN, "disk tier: %s", err);
		return e;
	}
	return 0;
}

void kvt_spill_close(struct kvt_manager *m)
{
	kvt_disk_close(m->disk);
	m->disk = NULL;
	free(m->spill_dir);
	m->spill_dir = NULL;
	m->cfg.spill_dir = NULL;
	free(m->dio);
	free(m->sref);
	m->dio = NULL;
	m->sref = NULL;
	m->dio_cap = 0;
	free(m->hpin);
	free(m->want);
	m->hpin = NULL;
	m->want = NULL;
	m->n_want = m->want_cap = 0;
}

/* Room in the I/O scratch lists for n entries. */
static int reserve_io(struct kvt_manager *m, uint32_t n)
{
	uint32_t cap = m->dio_cap;

	if (n <= cap)
		return 0;
	if (kvt_reserve((void **)&m->dio, &cap, n, sizeof(*m->dio)))
		return -ENOMEM;
	cap = m->dio_cap;
	if (kvt_reserve((void **)&m->sref, &cap, n, sizeof(*m->sref)))
		return -ENOMEM;
	m->dio_cap = cap;
	return 0;
}

/* Host groups of s that are in the host tier now. */
static uint64_t host_groups(const struct kvt_manager *m, const struct kvt_seq *s)
{
	uint64_t g = 0;

	for (uint32_t l = 0; l < m->cfg.n_layers; l++)
		g += s->layers[l].n_groups;
	return g - s->n_spilled;
}

static inline bool pinned(const struct kvt_manager *m, uint32_t g)
{
	return m->hpin[g] == (uint32_t)m->stamp;
}

static int cmp_victim(const void *a, const void *b)
{
	const struct victim *x = a, *y = b;

	return (x->stamp > y->stamp) - (x->stamp < y->stamp);
}

/* Writes the n listed groups (m->dio, m->sref) and commits those written: their host group is
   freed and the table entry points at the slot. Returns the first error (-ENOSPC before
   -EIO), 0 when all went. */
static int flush(struct kvt_manager *m, uint32_t n)
{
	uint32_t ok, done = 0;
	int first = 0;

	ok = kvt_disk_write(m->disk, m->dio, n);
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_spill_ref *r = &m->sref[i];
		struct kvt_seq_layer *ly = &r->s->layers[r->layer];

		if (m->dio[i].res) {
			if (!first || m->dio[i].res == -ENOSPC)
				first = m->dio[i].res;
			continue;
		}
		ALWAYS(kvt_pool_free(&m->host, &ly->groups[r->block], 1) == 0);
		ly->groups[r->block] = KVT_SPILLED | m->dio[i].slot;
		kvt_recall_group_moved(ly->rc, r->block, true);
		r->s->n_spilled++;
		done++;
		/* the decode cursor may point into the freed group: a fetch recomputes it */
		if (r->block == ly->n_groups - 1)
			ly->host_next = 0;
	}
	ALWAYS(done == ok); /* the units written are those without an error */
	m->st.disk_blocks_spilled += (uint64_t)ok * m->cfg.n_kv_heads;
	return first;
}

/* Spills unpinned host groups of s until `want` more are free or s has none left to give;
   each layer's last group only with `tails`. *err receives the first write error. */
static void spill_seq(struct kvt_manager *m, struct kvt_seq *s, uint32_t want, bool tails, int *err)
{
	uint32_t n = 0, goal = m->host.n_free + want;
	int e;

	/* its blocks must have landed (the callers have waited for queued loads that read them) */
	e = m->ops->save_wait(m->be, s->save_ticket);
	if (e) {
		*err = *err ? *err : e;
		return;
	}
	for (uint32_t l = 0; l < m->cfg.n_layers && m->host.n_free < goal; l++) {
		struct kvt_seq_layer *ly = &s->layers[l];
		uint32_t end = tails || !ly->n_groups ? ly->n_groups : ly->n_groups - 1;

		for (uint32_t b = 0; b < end && m->host.n_free < goal; b++) {
			uint32_t g = ly->groups[b];

			/* a shared group stays: its other owners' tables name it */
			if ((g & KVT_SPILLED) || pinned(m, g) || kvt_host_shared(m, g))
				continue;
			m->dio[n] = (struct kvt_disk_io){.addr = m->host_base +
								 (uint64_t)g * m->group_bytes};
			m->sref[n++] = (struct kvt_spill_ref){s, l, b};
			if (n == SPILL_BATCH || m->host.n_free + n >= goal) {
				e = flush(m, n);
				n = 0;
				if (e) {
					*err = *err ? *err : e;
					if (e == -ENOSPC)
						return;
				}
			}
		}
	}
	if (n) {
		e = flush(m, n);
		if (e && !*err)
			*err = e;
	}
}

/* Spills the victims' groups, least recently used sequence first, until target groups are free;
   the last group of each layer (decode's next append) only when the rest is not enough. */
static void spill_victims(struct kvt_manager *m, const struct victim *v, uint32_t nv,
			  uint32_t target, int *err)
{
	for (int tails = 0; tails < 2 && m->host.n_free < target && *err != -ENOSPC; tails++)
		for (uint32_t i = 0; i < nv && m->host.n_free < target && *err != -ENOSPC; i++)
			spill_seq(m, v[i].s, target - m->host.n_free, tails, err);
}

int kvt_spill_room(struct kvt_manager *m, uint32_t need)
{
	struct victim *v;
	struct kvt_seq *s;
	uint32_t nv = 0, target;
	int err = 0;

	if (m->host.n_free >= need)
		return 0;
	if (need > m->host.n_units || (!m->disk && !kvt_prefix_idle(m)))
		return -ENOMEM;
	/* No queued load may still read a block this frees. */
	err = kvt_dev_quiesce(m);
	if (err)
		return err;
	target = need + m->host.n_units / 64;
	target = target > m->host.n_units ? m->host.n_units : target;
	/* Cached prefix spans no sequence holds go first (to disk, or dropped without one). */
	kvt_prefix_evict(m, target);
	if (m->host.n_free >= need || !m->disk)
		return m->host.n_free >= need ? 0 : -ENOMEM;
	if (reserve_io(m, SPILL_BATCH))
		return -ENOMEM;
	v = kvt_malloc((size_t)m->seqs.n * sizeof(*v) + 1);
	if (!v)
		return -ENOMEM;
	for (uint32_t pos = 0; (s = kvt_idmap_next(&m->seqs, &pos));)
		if (!s->lost && host_groups(m, s))
			v[nv++] = (struct victim){s->stamp, s};
	qsort(v, nv, sizeof(*v), cmp_victim);
	spill_victims(m, v, nv, target, &err);
	/* A full spill file gives up the prefix spans it caches before a live history waits. */
	if (err == -ENOSPC && m->host.n_free < need && kvt_prefix_drop_disk(m)) {
		err = 0;
		spill_victims(m, v, nv, target, &err);
	}
	free(v);
	if (err)
		kvt_log(KVT_LOG_DEBUG, "spilling: %s", kvt_strerror(err));
	return m->host.n_free >= need ? 0 : -ENOMEM;
}

/* Starts the list of the call at hand (m->stamp) unless it is started: what an earlier call
   left (one that failed before its fetch) is dropped. */
static void want_begin(struct kvt_manager *m)
{
	if (m->want_stamp == m->stamp)
		return;
	m->want_stamp = m->stamp;
	m->n_want = 0;
	m->want_err = 0;
}

int kvt_spill_want_reserve(struct kvt_manager *m, uint32_t n)
{
	if (!m->disk)
		return 0;
	want_begin(m);
	if ((uint64_t)m->n_want + n > UINT32_MAX)
		return -ENOMEM;
	return kvt_reserve((void **)&m->want, &m->want_cap, m->n_want + n, sizeof(*m->want));
}

int kvt_spill_want(struct kvt_manager *m, struct kvt_seq *s, uint32_t layer, uint32_t block)
{
	uint32_t g;

	if (!m->disk)
		return 0;
	want_begin(m);
	g = s->layers[layer].groups[block];
	if (!(g & KVT_SPILLED)) {
		m->hpin[g] = (uint32_t)m->stamp;
		return 0;
	}
	if (m->n_want == m->want_cap && kvt_spill_want_reserve(m, 1))
		return m->want_err = -ENOMEM;
	m->want[m->n_want++] = (struct kvt_want){s, layer, block, g & ~KVT_SPILLED};
	return 0;
}

void kvt_spill_want_range(struct kvt_manager *m, struct kvt_seq *s, uint32_t layer, uint32_t from,
			  uint32_t to)
{
	if (!m->disk || from >= to)
		return;
	for (uint32_t b = from >> m->lbt; b <= (to - 1) >> m->lbt; b++)
		kvt_spill_want(m, s, layer, b);
}

static int cmp_want(const void *a, const void *b)
{
	const struct kvt_want *x = a, *y = b;

	return (x->slot > y->slot) - (x->slot < y->slot);
}

/* Commits the read of the n listed groups, each on its own: a group read is placed (and
   pinned) and its slot released; one that failed goes back to the pool and stays on disk (a
   CRC mismatch loses its sequence). Returns the groups placed; *first is the first error
   (-EBADMSG first), *bad its sequence. */
static uint32_t fetch_commit(struct kvt_manager *m, uint32_t n, int *first, struct kvt_seq **bad)
{
	uint32_t placed = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct kvt_spill_ref *r = &m->sref[i];
		struct kvt_seq *s = r->s;
		struct kvt_seq_layer *ly = &s->layers[r->layer];
		int res = m->dio[i].res;

		if (res) {
			ALWAYS(kvt_pool_free(&m->host, &r->group, 1) == 0);
			if (res == -EBADMSG && !s->lost) {
				s->lost = -EBADMSG;
				m->st.seqs_lost++;
			}
			if (!*first || (res == -EBADMSG && *first != -EBADMSG)) {
				*first = res;
				*bad = s;
			}
			continue;
		}
		kvt_disk_release(m->disk, m->dio[i].slot);
		ly->groups[r->block] = r->group;
		kvt_recall_group_moved(ly->rc, r->block, false);
		m->hpin[r->group] = (uint32_t)m->stamp;
		if (ALWAYS(s->n_spilled > 0))
			s->n_spilled--;
		if (r->block == ly->n_groups - 1 && ly->n_tokens)
			ly->host_next = kvt_host_cursor(m, ly);
		placed++;
	}
	return placed;
}

int kvt_spill_fetch_wanted(struct kvt_manager *m, const char *what)
{
	uint32_t n = m->want_stamp == m->stamp ? m->n_want : 0, k = 0, read_ok, placed;
	struct kvt_seq *bad = NULL;
	int err = m->want_stamp == m->stamp ? m->want_err : 0, first = 0;

	m->n_want = 0;
	m->want_err = 0;
	if (err)
		return kvt_fail(m, err, "%s: no memory for the list of blocks", what);
	if (n == 0)
		return 0;
	/* One entry per spilled block, in file order. */
	qsort(m->want, n, sizeof(*m->want), cmp_want);
	for (uint32_t i = 0; i < n; i++)
		if (k == 0 || m->want[i].slot != m->want[k - 1].slot)
			m->want[k++] = m->want[i];
	err = kvt_spill_room(m, k);
	if (err && err != -ENOMEM)
		return kvt_fail(m, err, "%s: waiting for the device before spilling: %s", what,
				m->be->err);
	if (err || reserve_io(m, k))
		return kvt_fail(m, -ENOMEM,
				"%s: the host tier cannot take back %u spilled block groups (%u of "
				"%u free after spilling; the rest hold blocks this call needs)",
				what, k, m->host.n_free, m->host.n_units);
	for (uint32_t i = 0; i < k; i++) {
		const struct kvt_want *w = &m->want[i];
		uint32_t g;

		if (NEVER(kvt_pool_alloc(&m->host, 1, &g) != 0)) { /* counted free above */
			while (i-- > 0)
				ALWAYS(kvt_pool_free(&m->host, &m->sref[i].group, 1) == 0);
			return kvt_fail(m, -EIO, "%s: host groups counted free are not", what);
		}
		m->dio[i] = (struct kvt_disk_io){
			.addr = m->host_base + (uint64_t)g * m->group_bytes,
			.slot = w->slot,
		};
		m->sref[i] = (struct kvt_spill_ref){w->s, w->layer, w->block, g};
	}
	read_ok = kvt_disk_read(m->disk, m->dio, k);
	placed = fetch_commit(m, k, &first, &bad);
	ALWAYS(placed == read_ok); /* what was placed was read without an error */
	m->st.disk_blocks_fetched += (uint64_t)placed * m->cfg.n_kv_heads;
	if (first == -EBADMSG)
		return kvt_fail(m, first,
				"%s: sequence %llu: a spilled block failed its CRC-32C check: its "
				"history is lost",
				what, (unsigned long long)bad->id);
	if (first)
		return kvt_fail(m, first,
				"%s: sequence %llu: reading spilled blocks back failed (%s); they "
				"stay on disk",
				what, (unsigned long long)bad->id, kvt_strerror(first));
	return (int)(placed > INT32_MAX ? INT32_MAX : placed);
}

void kvt_spill_release_layer(struct kvt_manager *m, struct kvt_seq *s, struct kvt_seq_layer *ly)
{
	for (uint32_t b = 0; b < ly->n_groups; b++) {
		uint32_t g = ly->groups[b];

		if (g & KVT_SPILLED) {
			kvt_disk_release(m->disk, g & ~KVT_SPILLED);
			if (ALWAYS(s->n_spilled > 0))
				s->n_spilled--;
		} else {
			kvt_host_release(m, &g, 1);
		}
	}
}

KVT_API int kvt_seq_fetch(struct kvt_manager *m, const uint64_t *seqs, uint32_t n)
{
	uint32_t bt_mask;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!seqs || n == 0)
		return kvt_fail(m, -EINVAL, "fetch: %s", n ? "NULL sequence list" : "no sequences");
	++m->stamp;
	bt_mask = m->cfg.block_tokens - 1;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = kvt_seq_usable(m, seqs[i], "fetch", &err);

		if (!s)
			return err;
		s->stamp = m->stamp;
		/* each layer's last block, when the next token goes into it */
		for (uint32_t l = 0; l < m->cfg.n_layers; l++)
			if (s->layers[l].n_tokens & bt_mask)
				kvt_spill_want(m, s, l, s->layers[l].n_groups - 1);
	}
	err = kvt_spill_fetch_wanted(m, "fetch");
	return err < 0 ? err : 0;
}

KVT_API int kvt_seq_spill(struct kvt_manager *m, uint64_t seq)
{
	struct kvt_seq *s;
	uint64_t have;
	int err = 0;

	if (!m)
		return -EINVAL;
	s = kvt_seq_usable(m, seq, "spill", &err);
	if (!s)
		return err;
	if (!m->disk)
		return kvt_fail(m, -ENOTSUP, "spill: no disk tier (config.spill_dir)");
	have = host_groups(m, s);
	if (!have)
		return 0;
	if (reserve_io(m, SPILL_BATCH))
		return kvt_fail(m, -ENOMEM, "spill: no memory for the I/O list");
	s->stamp = ++m->stamp;	  /* no pin of an earlier call holds a group back */
	err = kvt_dev_quiesce(m); /* no queued load may still read a block this frees */
	if (err)
		return kvt_fail(m, err, "spill: sequence %llu: waiting for the device: %s",
				(unsigned long long)seq, m->be->err);
	spill_seq(m, s, (uint32_t)have, true, &err);
	/* A full spill file gives up the prefix spans it caches before a live history waits. */
	if (err == -ENOSPC && kvt_prefix_drop_disk(m)) {
		err = 0;
		spill_seq(m, s, (uint32_t)host_groups(m, s), true, &err);
	}
	if (err)
		return kvt_fail(
			m, err, "spill: sequence %llu: %llu of %llu block groups written (%s)",
			(unsigned long long)seq, (unsigned long long)(have - host_groups(m, s)),
			(unsigned long long)have, kvt_strerror(err));
	return 0;
}

int kvt_disk_corrupt_block(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t block)
{
	struct kvt_seq *s = kvt_seqmap_get(&m->seqs, seq);
	uint32_t g;

	if (!s || layer >= m->cfg.n_layers || block >= s->layers[layer].n_groups || !m->disk)
		return -ENOENT;
	g = s->layers[layer].groups[block];
	if (!(g & KVT_SPILLED))
		return -ENOENT;
	return kvt_disk_corrupt(m->disk, g & ~KVT_SPILLED);
}
