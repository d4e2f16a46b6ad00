/* SPDX-License-Identifier: MIT */
/*
 * fault: snapshots of a manager's state, their comparison between a faulted run and the
 * fault-free one, and the read-back of every token.
 */
#include "test_fault.h"

/* ---- snapshots ------------------------------------------------------------------------------- */

struct snap *snapshot(struct run *r)
{
	struct snap *sn = t_xmalloc(sizeof(*sn));
	float q[NQ * HD];

	sn->st = (struct kvt_stats)KVT_STATS_INIT;
	CHECK_RC(kvt_manager_stats(r->m, &sn->st), 0);
	sn->st.bytes_h2d_history -= r->hist_extra; /* the workload's own, not the checks' */
	sn->pending = r->s && r->s != S_SENTINEL ? kvt_sched_pending(r->s) : UINT32_MAX;
	for (uint32_t j = 0; j < N_IDS; j++) {
		struct sseq *ss = &sn->s[j];

		ss->info.size = sizeof(ss->info);
		ss->info_rc = kvt_seq_info(r->m, seq_id[j], &ss->info);
		if (ss->info_rc)
			continue;
		for (uint32_t l = 0; l < NL; l++) {
			struct slayer *sl = &ss->l[l];

			sl->tok_rc = kvt_seq_tokens(r->m, seq_id[j], l, &sl->tok);
			if (sl->tok_rc || !sl->tok)
				continue;
			for (uint32_t h = 0; h < NH; h++) {
				struct shead *sh = &sl->h[h];

				sh->res_rc = kvt_seq_resident_positions(
					r->m, seq_id[j], l, h, sh->res, RES_CAP, &sh->n_res);
				sh->fr_rc = kvt_seq_frames(r->m, seq_id[j], l, h, sh->fr, FR_CAP,
							   &sh->n_fr, &sh->n_slots);
				sh->view_rc = kvt_seq_recall_view(r->m, seq_id[j], l, h, sh->view,
								  VIEW_CAP, &sh->n_view);
				/* addresses as offsets into the device arena, which each run
				   allocates anew */
				for (uint32_t f = 0; !sh->fr_rc && f < sh->n_fr && f < FR_CAP; f++)
					sh->fr[f] -= r->m->dev_base;
				for (uint32_t f = 0; !sh->view_rc && f < sh->n_view && f < VIEW_CAP;
				     f++)
					sh->view[f].frame -= r->m->dev_base;
			}
			attend_q(seq_id[j], l, q);
			sl->att_rc = kvt_attend(r->m, seq_id[j], l, q, sl->att);
		}
	}
	return sn;
}

/* Accounting that must hold at every moment: frames and blocks in use are those the live
   sequences and the prefix cache hold (a block a sequence shares with the cache counted
   once, with the cache; a span a sequence shares is in the host tier), and the sequences
   are those of the model with its token counts, history positions and shared prefixes. */
void check_invariants(struct run *r, const struct snap *sn, const char *where)
{
	const struct kvt_stats *st = &sn->st;
	uint64_t dev = 0, host = 0, live = 0, disk = 0, shared = 0;

	for (uint32_t j = 0; j < N_IDS; j++) {
		const struct sseq *ss = &sn->s[j];

		if (ss->info_rc != (r->q[j].live ? 0 : -ENOENT)) {
			problem(r, "sequence table wrong",
				"%s: seq %llu: info returned %d, model %s", where,
				(unsigned long long)seq_id[j], ss->info_rc,
				r->q[j].live ? "live" : "not live");
			return;
		}
		if (ss->info_rc)
			continue;
		live++;
		dev += ss->info.device_frames;
		host += ss->info.host_blocks - ss->info.disk_blocks - ss->info.shared_blocks;
		disk += ss->info.disk_blocks;
		shared += ss->info.shared_blocks;
		for (uint32_t l = 0; l < NL; l++)
			if (ss->l[l].tok_rc || ss->l[l].tok != r->q[j].n[l]) {
				problem(r, "token count wrong",
					"%s: seq %llu layer %u: %u tokens (rc %d), model %u", where,
					(unsigned long long)seq_id[j], l, ss->l[l].tok,
					ss->l[l].tok_rc, r->q[j].n[l]);
				return;
			}
		{
			uint32_t filled = UINT32_MAX;

			for (uint32_t l = 0; l < NL; l++) {
				uint32_t f = r->q[j].n[l] ? r->q[j].n[l] : r->q[j].fill[l];

				filled = f < filled ? f : filled;
			}
			if (ss->info.prefix_tokens != r->q[j].matched ||
			    ss->info.filled_tokens != filled ||
			    ss->info.shared_blocks + ss->info.disk_blocks > ss->info.host_blocks) {
				problem(r, "prefix state wrong",
					"%s: seq %llu: prefix %u tokens (model %u), history %u "
					"(model %u), %llu shared and %llu spilled of %llu blocks",
					where, (unsigned long long)seq_id[j],
					ss->info.prefix_tokens, r->q[j].matched,
					ss->info.filled_tokens, filled,
					(unsigned long long)ss->info.shared_blocks,
					(unsigned long long)ss->info.disk_blocks,
					(unsigned long long)ss->info.host_blocks);
				return;
			}
		}
		if (ss->info.lost)
			problem(r, "sequence lost", "%s: seq %llu lost (%d)", where,
				(unsigned long long)seq_id[j], ss->info.lost);
	}
	if (st->live_seqs != live || st->device_frames_used != dev ||
	    st->host_blocks_used != host + st->prefix_blocks - st->prefix_blocks_disk ||
	    (g_disk && st->disk_blocks_used != disk + st->prefix_blocks_disk))
		problem(r, "pool accounting wrong",
			"%s: live %u (seqs %llu), device frames used %llu (seqs hold %llu), host "
			"blocks used %llu (seqs hold %llu of their own, the prefix cache %llu), disk "
			"blocks used %llu (seqs hold %llu, the prefix cache %llu)",
			where, st->live_seqs, (unsigned long long)live,
			(unsigned long long)st->device_frames_used, (unsigned long long)dev,
			(unsigned long long)st->host_blocks_used, (unsigned long long)host,
			(unsigned long long)(st->prefix_blocks - st->prefix_blocks_disk),
			(unsigned long long)st->disk_blocks_used, (unsigned long long)disk,
			(unsigned long long)st->prefix_blocks_disk);
	else if (st->prefix_blocks != st->prefix_blocks_idle + st->prefix_blocks_shared ||
		 st->prefix_blocks_disk > st->prefix_blocks_idle ||
		 st->prefix_blocks_shared > shared || (shared && !st->prefix_blocks_shared))
		problem(r, "prefix cache accounting wrong",
			"%s: %llu blocks cached: %llu idle (%llu of them spilled), %llu shared "
			"(sequences share %llu)",
			where, (unsigned long long)st->prefix_blocks,
			(unsigned long long)st->prefix_blocks_idle,
			(unsigned long long)st->prefix_blocks_disk,
			(unsigned long long)st->prefix_blocks_shared, (unsigned long long)shared);
}

/* Stats fields: compared after a failure (F), after a retry and at the end (S), changed
   only by block placement between host and disk (P), or also by the eviction of idle prefix
   spans, which drops them without a disk tier (E: placement whether there is a disk tier or
   not), of those lowered only (D: a failed call may drop a span, never add one), not at the
   end (N), depending on how work was batched (B: not compared loosely), on how much of a
   prompt was shared from the prefix cache (M: not compared after a shorter match). */
#define SF_F 1u
#define SF_S 2u
#define SF_P 4u
#define SF_N 8u
#define SF_B 16u
#define SF_E 32u
#define SF_D 64u
#define SF_M 128u
#define STAT(f, cls)                                                                       \
	{                                                                                  \
#f, offsetof(struct kvt_stats, f), sizeof(((struct kvt_stats *)0)->f), cls \
	}

static const struct {
	const char *name;
	size_t off, size;
	unsigned cls;
} stat_fields[] = {
	STAT(device_frames_used, SF_F | SF_S),
	STAT(host_blocks_used, SF_F | SF_S | SF_P | SF_E),
	STAT(bytes_h2d, SF_F),
	STAT(bytes_d2h, SF_F | SF_S | SF_M),
	STAT(bytes_d2d, SF_F | SF_S),
	STAT(tokens_saved, SF_F | SF_S | SF_M),
	STAT(tokens_appended, SF_F | SF_S),
	STAT(tokens_prompt, SF_F | SF_S),
	STAT(tokens_resident, SF_F | SF_S),
	STAT(prefill_layers, SF_F | SF_S),
	STAT(decode_calls, SF_F | SF_S | SF_B),
	STAT(saves_submitted, SF_F | SF_S | SF_B),
	STAT(live_seqs, SF_F | SF_S),
	STAT(bytes_read, SF_F),
	STAT(recall_frames_used, SF_F),
	STAT(recall_calls, SF_F | SF_S | SF_B),
	STAT(recall_lookups, SF_F),
	STAT(recall_hits, SF_F),
	STAT(recall_loads, SF_F),
	STAT(recall_evictions, SF_F),
	STAT(preemptions, SF_F | SF_S | SF_N),
	STAT(resumes, SF_F | SF_S | SF_N),
	STAT(disk_blocks_used, SF_F | SF_P),
	STAT(disk_blocks_spilled, SF_F | SF_P),
	STAT(disk_blocks_fetched, SF_F | SF_P),
	STAT(disk_bytes_written, SF_F | SF_P),
	STAT(disk_bytes_read, SF_F | SF_P),
	STAT(disk_io_errors, SF_F | SF_P),
	STAT(disk_checksum_errors, SF_F | SF_S),
	STAT(seqs_lost, SF_F | SF_S),
	/* a span is cached by a successful last prefill only, and leaves by eviction (E): to
	   the spill file with a disk tier (P), else dropped */
	STAT(prefix_spans, SF_F | SF_S | SF_E | SF_D),
	STAT(prefix_blocks, SF_F | SF_S | SF_E | SF_D),
	STAT(prefix_blocks_idle, SF_F | SF_S | SF_E | SF_D),
	STAT(prefix_blocks_disk, SF_F | SF_P),
	STAT(prefix_blocks_shared, SF_F | SF_S | SF_M),
	STAT(prefix_tokens_asked, SF_F | SF_S),
	STAT(prefix_tokens_hit, SF_F | SF_S | SF_M),
	STAT(prefix_spans_evicted, SF_F | SF_E),
	STAT(prefix_spans_spilled, SF_F | SF_P),
	STAT(prefix_spans_restored, SF_F | SF_P),
	STAT(bytes_h2d_history, SF_F | SF_S | SF_M),
};

static uint64_t stat_get(const struct kvt_stats *st, size_t i)
{
	const uint8_t *p = (const uint8_t *)st + stat_fields[i].off;

	if (stat_fields[i].size == 4)
		return *(const uint32_t *)p;
	return *(const uint64_t *)p;
}

static void diff_add(struct diff *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void diff_add(struct diff *d, const char *fmt, ...)
{
	va_list ap;

	if (d->n++ >= 16 || d->len >= sizeof(d->buf) - 1)
		return;
	if (d->len)
		d->len += (size_t)snprintf(d->buf + d->len, sizeof(d->buf) - d->len, "; ");
	if (d->len >= sizeof(d->buf) - 1)
		return;
	va_start(ap, fmt);
	d->len += (size_t)vsnprintf(d->buf + d->len, sizeof(d->buf) - d->len, fmt, ap);
	va_end(ap);
	if (d->len > sizeof(d->buf) - 1)
		d->len = sizeof(d->buf) - 1;
}

#define DIFF_U(d, what, a, b, ...)                                                     \
	do {                                                                           \
		if ((a) != (b))                                                        \
			diff_add(d, what " %lld -> %lld", __VA_ARGS__, (long long)(a), \
				 (long long)(b));                                      \
	} while (0)

static void cmp_head(struct diff *d, enum cmp how, uint64_t id, uint32_t l, uint32_t h,
		     const struct shead *a, const struct shead *b)
{
	DIFF_U(d, "seq %llu l%u h%u: resident positions rc", a->res_rc, b->res_rc,
	       (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: resident count", a->n_res, b->n_res, (unsigned long long)id, l,
	       h);
	if (!a->res_rc && a->n_res == b->n_res &&
	    memcmp(a->res, b->res, a->n_res * sizeof(a->res[0])))
		diff_add(d, "seq %llu l%u h%u: resident positions differ", (unsigned long long)id,
			 l, h);
	DIFF_U(d, "seq %llu l%u h%u: frames rc", a->fr_rc, b->fr_rc, (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: frame count", a->n_fr, b->n_fr, (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: slots", a->n_slots, b->n_slots, (unsigned long long)id, l, h);
	if ((how == CMP_FAILED || how == CMP_RECALL) && !a->fr_rc && a->n_fr == b->n_fr &&
	    memcmp(a->fr, b->fr, a->n_fr * sizeof(a->fr[0])))
		diff_add(d, "seq %llu l%u h%u: frame addresses moved", (unsigned long long)id, l,
			 h);
	if (how == CMP_LOOSE || how == CMP_SHORT || (how == CMP_RECALL && b->view_rc == -ESTALE))
		return;
	DIFF_U(d, "seq %llu l%u h%u: recall view rc", a->view_rc, b->view_rc,
	       (unsigned long long)id, l, h);
	DIFF_U(d, "seq %llu l%u h%u: recall view blocks", a->n_view, b->n_view,
	       (unsigned long long)id, l, h);
	if (!a->view_rc && !b->view_rc && a->n_view == b->n_view)
		for (uint32_t i = 0; i < a->n_view && i < VIEW_CAP; i++) {
			const struct kvt_recall_ref *x = &a->view[i], *y = &b->view[i];

			if (x->block != y->block || x->n_valid != y->n_valid ||
			    x->resident != y->resident ||
			    ((how == CMP_FAILED || how == CMP_RECALL) && x->frame != y->frame)) {
				diff_add(d,
					 "seq %llu l%u h%u: recall view entry %u differs "
					 "(block %u -> %u, n_valid %u -> %u)",
					 (unsigned long long)id, l, h, i, x->block, y->block,
					 x->n_valid, y->n_valid);
				break;
			}
		}
}

/* Differences of b from a (what `how` compares), into d. */
void compare(const struct snap *a, const struct snap *b, enum cmp how, struct diff *d)
{
	bool failed = how == CMP_FAILED || how == CMP_RECALL;
	bool loose = how == CMP_LOOSE || how == CMP_SHORT;

	memset(d, 0, sizeof(*d));
	for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
		unsigned cls = stat_fields[i].cls;
		uint64_t x = stat_get(&a->st, i), y = stat_get(&b->st, i);

		if (failed ? !(cls & SF_F) : !(cls & SF_S))
			continue;
		if (how == CMP_RECALL && !strncmp(stat_fields[i].name, "recall_", 7))
			continue;
		if ((how == CMP_END || loose) && (cls & SF_N))
			continue;
		if (loose && (cls & SF_B))
			continue;
		if (how == CMP_SHORT && (cls & SF_M))
			continue;
		if (x == y)
			continue;
		if (((cls & SF_P) && g_disk) || (cls & SF_E)) {
			if (failed && (cls & SF_D) && y > x)
				diff_add(d, "stats.%s %llu -> %llu (placement only lowers it)",
					 stat_fields[i].name, (unsigned long long)x,
					 (unsigned long long)y);
			else if (failed)
				d->placement = true;
			continue;
		}
		diff_add(d, "stats.%s %llu -> %llu", stat_fields[i].name, (unsigned long long)x,
			 (unsigned long long)y);
	}
	DIFF_U(d, "%s", a->pending, b->pending, "scheduler pending");
	for (uint32_t j = 0; j < N_IDS; j++) {
		const struct sseq *x = &a->s[j], *y = &b->s[j];
		unsigned long long id = (unsigned long long)seq_id[j];

		DIFF_U(d, "seq %llu: info rc", x->info_rc, y->info_rc, id);
		if (x->info_rc || y->info_rc)
			continue;
		DIFF_U(d, "seq %llu: prompt_tokens", x->info.prompt_tokens, y->info.prompt_tokens,
		       id);
		DIFF_U(d, "seq %llu: layers_prefilled", x->info.layers_prefilled,
		       y->info.layers_prefilled, id);
		DIFF_U(d, "seq %llu: preempted", x->info.preempted, y->info.preempted, id);
		DIFF_U(d, "seq %llu: tokens", x->info.tokens, y->info.tokens, id);
		DIFF_U(d, "seq %llu: frames_per_layer", x->info.frames_per_layer,
		       y->info.frames_per_layer, id);
		DIFF_U(d, "seq %llu: device_frames", x->info.device_frames, y->info.device_frames,
		       id);
		DIFF_U(d, "seq %llu: host_blocks", x->info.host_blocks, y->info.host_blocks, id);
		DIFF_U(d, "seq %llu: filled_tokens", x->info.filled_tokens, y->info.filled_tokens,
		       id);
		if (how != CMP_SHORT) {
			DIFF_U(d, "seq %llu: prefix_tokens", x->info.prefix_tokens,
			       y->info.prefix_tokens, id);
			DIFF_U(d, "seq %llu: shared_blocks", x->info.shared_blocks,
			       y->info.shared_blocks, id);
		}
		if (!loose && how != CMP_RECALL) {
			uint32_t n_before = d->n;

			DIFF_U(d, "seq %llu: recall_ws_frames", x->info.recall_ws_frames,
			       y->info.recall_ws_frames, id);
			DIFF_U(d, "seq %llu: recall_step_frames", x->info.recall_step_frames,
			       y->info.recall_step_frames, id);
			d->n_ws += d->n - n_before;
		}
		DIFF_U(d, "seq %llu: lost", x->info.lost, y->info.lost, id);
		if (x->info.disk_blocks != y->info.disk_blocks) {
			if (!g_disk)
				diff_add(d, "seq %llu: disk_blocks %llu -> %llu", id,
					 (unsigned long long)x->info.disk_blocks,
					 (unsigned long long)y->info.disk_blocks);
			else if (how == CMP_FAILED || how == CMP_RECALL)
				d->placement = true;
		}
		for (uint32_t l = 0; l < NL; l++) {
			const struct slayer *p = &x->l[l], *q = &y->l[l];

			DIFF_U(d, "seq %llu l%u: tokens rc", p->tok_rc, q->tok_rc, id, l);
			DIFF_U(d, "seq %llu l%u: tokens", p->tok, q->tok, id, l);
			if (p->tok_rc || q->tok_rc || !p->tok || p->tok != q->tok)
				continue;
			for (uint32_t h = 0; h < NH; h++)
				cmp_head(d, how, seq_id[j], l, h, &p->h[h], &q->h[h]);
			if (loose)
				continue; /* views and attention follow the recall history */
			if (how == CMP_RECALL && q->att_rc == -ESTALE)
				continue;
			DIFF_U(d, "seq %llu l%u: attend rc", p->att_rc, q->att_rc, id, l);
			if (!p->att_rc && !q->att_rc && memcmp(p->att, q->att, sizeof(p->att)))
				diff_add(d, "seq %llu l%u: attention output differs", id, l);
		}
	}
	if (d->n)
		d->placement = false;
}

/* ---- read-back ------------------------------------------------------------------------------- */

/* Loads the history of a layer not prefilled yet (its shared prefix and chunks) through
   kvt_seq_load_kv; every row must be bit-exact. What the loads add to
   stats.bytes_h2d_history is the checks', which snapshots leave out. */
static void check_history(struct run *r, uint32_t j, uint32_t l, const char *where)
{
	static uint8_t k[NH * MAX_ROWS * HD * 4], v[NH * MAX_ROWS * HD * 4], e[HD * 4];
	struct kvt_stats st0 = KVT_STATS_INIT, st1 = KVT_STATS_INIT;
	const struct mseq *s = &r->q[j];
	uint32_t n = s->fill[l];
	int rc;

	if (n > MAX_ROWS)
		return;
	CHECK_RC(kvt_manager_stats(r->m, &st0), 0);
	rc = t_load_kv(r->m, s->id, l, 0, n, k, v, NULL);
	CHECK_RC(kvt_manager_stats(r->m, &st1), 0);
	r->hist_extra += st1.bytes_h2d_history - st0.bytes_h2d_history;
	for (uint32_t h = 0; !rc && h < NH; h++)
		for (uint32_t p = 0; p < n; p++) {
			size_t off = ((size_t)h * n + p) * r->rb;

			g_tokens++;
			t_fill_row(r->c.dtype, HD, e, data_id(j, p), l, h, p, 0);
			if (memcmp(k + off, e, r->rb))
				rc = -EILSEQ;
			t_fill_row(r->c.dtype, HD, e, data_id(j, p), l, h, p, 1);
			if (memcmp(v + off, e, r->rb))
				rc = -EILSEQ;
			if (rc)
				break;
		}
	if (rc) {
		g_lost++;
		problem(r, "history lost or corrupted",
			"%s: seq %llu l%u: load of its %u positions returned %d, or bytes differ",
			where, (unsigned long long)s->id, l, n, rc);
	}
}

/* Reads every token of every live sequence through both paths (and the history of layers
   not prefilled yet); each must be bit-exact. */
void check_tokens(struct run *r, const char *where)
{
	uint8_t k[HD * 4], v[HD * 4], ek[HD * 4], ev[HD * 4];

	for (uint32_t j = 0; j < N_IDS; j++) {
		const struct mseq *s = &r->q[j];

		if (!s->live)
			continue;
		for (uint32_t l = 0; l < NL; l++)
			if (!s->n[l] && s->fill[l])
				check_history(r, j, l, where);
		for (uint32_t l = 0; l < NL; l++)
			for (uint32_t h = 0; h < NH; h++)
				for (uint32_t p = 0; p < s->n[l]; p++) {
					int rc1, rc2, bad;

					t_fill_row(r->c.dtype, HD, ek, data_id(j, p), l, h, p, 0);
					t_fill_row(r->c.dtype, HD, ev, data_id(j, p), l, h, p, 1);
					rc1 = kvt_seq_read_token(r->m, s->id, l, h, p, k, v);
					bad = rc1 || memcmp(k, ek, r->rb) || memcmp(v, ev, r->rb);
					rc2 = kvt_seq_read_token_host(r->m, s->id, l, h, p, k, v);
					bad |= rc2 || memcmp(k, ek, r->rb) || memcmp(v, ev, r->rb);
					g_tokens++;
					if (bad) {
						g_lost++;
						problem(r, "token lost or corrupted",
							"%s: seq %llu l%u h%u pos %u: read rc %d, host "
							"read rc %d, or bytes differ",
							where, (unsigned long long)s->id, l, h, p,
							rc1, rc2);
					}
				}
	}
}
