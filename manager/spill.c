/* SPDX-License-Identifier: MIT */
/*
 * The disk tier in the manager: which host block groups go to the spill file, and when they come
 * back. A spilled group's entry in its layer's group table holds KVT_SPILLED | disk slot instead
 * of a host group id, so a sequence's tables say where each block lives without another index.
 *
 * Spilling (kvt_spill_room): when a call needs more host groups than are free, the sequences not
 * named by the call at hand (their stamp is not m->stamp) are taken least recently used first
 * (smallest stamp), and their groups are written out until the request plus a little slack is
 * free: the slack (1/64 of the host tier) makes one victim scan and one I/O batch serve many
 * later allocations instead of one each.
 *
 * Fetching (kvt_spill_fetch): every call that reads or extends a sequence's host history brings
 * its spilled groups back first, all the named sequences' groups in one batched read. A sequence
 * comes back whole or not at all. A read that fails leaves the groups on disk (the call fails
 * with -EIO and may be retried); a CRC mismatch loses the sequence (-EBADMSG from then on).
 */
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "disk.h"
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
		r->s->n_spilled++;
		done++;
		/* the decode cursor may point into the freed group: fetch recomputes it */
		if (r->block == ly->n_groups - 1)
			ly->host_next = 0;
	}
	ALWAYS(done == ok); /* the units written are those without an error */
	m->st.disk_blocks_spilled += (uint64_t)ok * m->cfg.n_kv_heads;
	return first;
}

/* Spills host groups of s until `want` more are free or s has none left in the host tier.
 *err receives the first write error. */
static void spill_seq(struct kvt_manager *m, struct kvt_seq *s, uint32_t want, int *err)
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

		for (uint32_t b = 0; b < ly->n_groups && m->host.n_free < goal; b++) {
			uint32_t g = ly->groups[b];

			if (g & KVT_SPILLED)
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

int kvt_spill_room(struct kvt_manager *m, uint32_t need)
{
	struct victim *v;
	struct kvt_seq *s;
	uint32_t nv = 0, target;
	int err = 0;

	if (m->host.n_free >= need)
		return 0;
	if (!m->disk || need > m->host.n_units)
		return -ENOMEM;
	/* No queued load may still read a block this frees. */
	err = kvt_dev_quiesce(m);
	if (err)
		return err;
	target = need + m->host.n_units / 64;
	target = target > m->host.n_units ? m->host.n_units : target;
	if (reserve_io(m, SPILL_BATCH))
		return -ENOMEM;
	v = kvt_malloc((size_t)m->seqs.n * sizeof(*v) + 1);
	if (!v)
		return -ENOMEM;
	for (uint32_t pos = 0; (s = kvt_idmap_next(&m->seqs, &pos));)
		if (s->stamp != m->stamp && !s->lost && host_groups(m, s))
			v[nv++] = (struct victim){s->stamp, s};
	qsort(v, nv, sizeof(*v), cmp_victim);
	for (uint32_t i = 0; i < nv && m->host.n_free < target && err != -ENOSPC; i++)
		spill_seq(m, v[i].s, target - m->host.n_free, &err);
	free(v);
	if (err)
		kvt_log(KVT_LOG_DEBUG, "spilling: %s", kvt_strerror(err));
	return m->host.n_free >= need ? 0 : -ENOMEM;
}

/* Recomputes the decode cursors of s's layers after its groups moved. */
static void reset_cursors(struct kvt_manager *m, struct kvt_seq *s)
{
	for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
		struct kvt_seq_layer *ly = &s->layers[l];

		if (ly->n_tokens)
			ly->host_next = kvt_host_cursor(m, ly);
	}
}

/* Lists every spilled group of v[0..n) in m->dio and m->sref for one read, each into a fresh
   host group. The caller made room for `total` groups, the sum of the sequences' n_spilled,
   and in the lists. 0, or -EIO recorded with nothing taken when the tables hold another
   number of spilled groups (a violated invariant). */
static int fetch_list(struct kvt_manager *m, struct kvt_seq *const *v, uint32_t n, uint32_t total,
		      const char *what)
{
	uint32_t nio = 0;

	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = v[i];

		for (uint32_t l = 0; l < m->cfg.n_layers && s->n_spilled; l++) {
			struct kvt_seq_layer *ly = &s->layers[l];

			for (uint32_t b = 0; b < ly->n_groups; b++) {
				uint32_t g;

				if (!(ly->groups[b] & KVT_SPILLED))
					continue;
				if (NEVER(nio == total) ||
				    NEVER(kvt_pool_alloc(&m->host, 1, &g) != 0))
					goto fail;
				m->dio[nio] = (struct kvt_disk_io){
					.addr = m->host_base + (uint64_t)g * m->group_bytes,
					.slot = ly->groups[b] & ~KVT_SPILLED,
				};
				m->sref[nio++] = (struct kvt_spill_ref){s, l, b, g};
			}
		}
	}
	if (NEVER(nio != total))
		goto fail;
	return 0;
fail:
	while (nio-- > 0)
		ALWAYS(kvt_pool_free(&m->host, &m->sref[nio].group, 1) == 0);
	return kvt_fail(m, -EIO, "%s: the tables do not hold the %u spilled groups counted", what,
			total);
}

/* Commits the read of the `total` listed groups per sequence: all of a sequence's groups
   read, or none taken back (their host groups freed; a CRC mismatch loses the sequence). The
   list is in sequence order, so a sequence's entries are contiguous. Returns the groups taken
   back; *first is the first error (-EBADMSG first), *bad its sequence. */
static uint32_t fetch_commit(struct kvt_manager *m, uint32_t total, int *first,
			     struct kvt_seq **bad)
{
	uint32_t at = 0, fetched = 0;

	while (at < total) {
		struct kvt_seq *s = m->sref[at].s;
		uint32_t end = at;
		int res = 0;

		while (end < total && m->sref[end].s == s) {
			if (m->dio[end].res && res != -EBADMSG)
				res = m->dio[end].res;
			end++;
		}
		for (uint32_t i = at; i < end; i++) {
			struct kvt_spill_ref *r = &m->sref[i];

			if (res) {
				ALWAYS(kvt_pool_free(&m->host, &r->group, 1) == 0);
				continue;
			}
			kvt_disk_release(m->disk, m->dio[i].slot);
			s->layers[r->layer].groups[r->block] = r->group;
		}
		if (res) {
			if (res == -EBADMSG && !s->lost) {
				s->lost = -EBADMSG;
				m->st.seqs_lost++;
			}
			if (!*first || res == -EBADMSG) {
				*first = res;
				*bad = s;
			}
		} else {
			ALWAYS(end - at == s->n_spilled);
			fetched += end - at;
			s->n_spilled = 0;
			reset_cursors(m, s);
		}
		at = end;
	}
	return fetched;
}

int kvt_spill_fetch(struct kvt_manager *m, struct kvt_seq *const *v, uint32_t n, const char *what)
{
	uint64_t total = 0;
	uint32_t read_ok, fetched;
	int err, first = 0;
	struct kvt_seq *bad = NULL;

	for (uint32_t i = 0; i < n; i++)
		total += v[i]->n_spilled;
	if (total == 0)
		return 0;
	if (total > m->host.n_units)
		return kvt_fail(m, -ENOMEM,
				"%s: %llu spilled block groups exceed the host tier (%u)", what,
				(unsigned long long)total, m->host.n_units);
	err = kvt_spill_room(m, (uint32_t)total);
	if (err && err != -ENOMEM)
		return kvt_fail(m, err, "%s: waiting for the device before spilling: %s", what,
				m->be->err);
	if (!err)
		err = reserve_io(m, (uint32_t)total);
	if (err)
		return kvt_fail(m, -ENOMEM,
				"%s: the host tier cannot take back %llu spilled block groups (%u "
				"free after spilling)",
				what, (unsigned long long)total, m->host.n_free);

	/* One read for every named sequence. */
	err = fetch_list(m, v, n, (uint32_t)total, what);
	if (err)
		return err;
	read_ok = kvt_disk_read(m->disk, m->dio, (uint32_t)total);
	fetched = fetch_commit(m, (uint32_t)total, &first, &bad);
	ALWAYS(fetched <= read_ok); /* what came back was read without an error */
	m->st.disk_blocks_fetched += (uint64_t)fetched * m->cfg.n_kv_heads;
	if (first == -EBADMSG)
		return kvt_fail(m, first,
				"%s: sequence %llu: a spilled block failed its CRC-32C check: its "
				"history is lost",
				what, (unsigned long long)bad->id);
	if (first)
		return kvt_fail(
			m, first,
			"%s: sequence %llu: reading its spilled blocks back failed (%s); they "
			"stay on disk",
			what, (unsigned long long)bad->id, kvt_strerror(first));
	return (int)(fetched > INT32_MAX ? INT32_MAX : fetched);
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
			ALWAYS(kvt_pool_free(&m->host, &g, 1) == 0);
		}
	}
}

KVT_API int kvt_seq_fetch(struct kvt_manager *m, const uint64_t *seqs, uint32_t n)
{
	uint64_t stamp;
	uint32_t k = 0;
	int err = 0;

	if (!m)
		return -EINVAL;
	if (!seqs || n == 0)
		return kvt_fail(m, -EINVAL, "fetch: %s", n ? "NULL sequence list" : "no sequences");
	if (kvt_reserve((void **)&m->batch, &m->batch_cap, n, sizeof(*m->batch)))
		return kvt_fail(m, -ENOMEM, "fetch: no memory for a list of %u", n);
	stamp = ++m->stamp;
	for (uint32_t i = 0; i < n; i++) {
		struct kvt_seq *s = kvt_seq_usable(m, seqs[i], "fetch", &err);

		if (!s)
			return err;
		if (s->stamp != stamp) /* named twice: once in the list */
			m->batch[k++] = s;
		s->stamp = stamp;
	}
	if (!m->disk)
		return 0;
	err = kvt_spill_fetch(m, m->batch, k, "fetch");
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
	err = kvt_dev_quiesce(m); /* no queued load may still read a block this frees */
	if (err)
		return kvt_fail(m, err, "spill: sequence %llu: waiting for the device: %s",
				(unsigned long long)seq, m->be->err);
	spill_seq(m, s, (uint32_t)have, &err);
	if (err)
		return kvt_fail(
			m, err, "spill: sequence %llu: %llu of %llu block groups written (%s)",
			(unsigned long long)seq, (unsigned long long)(have - host_groups(m, s)),
			(unsigned long long)have, kvt_strerror(err));
	return 0;
}

int kvt_spill_fetch_seq(struct kvt_manager *m, struct kvt_seq *s, const char *what)
{
	int err;

	if (!s->n_spilled)
		return 0;
	s->stamp = ++m->stamp;
	err = kvt_spill_fetch(m, &s, 1, what);
	return err < 0 ? err : 0;
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
