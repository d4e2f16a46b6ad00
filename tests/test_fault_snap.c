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
   sequences hold, and the sequences are those of the model with its token counts. */
void check_invariants(struct run *r, const struct snap *sn, const char *where)
{
	uint64_t dev = 0, host = 0, live = 0;

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
		host += ss->info.host_blocks - ss->info.disk_blocks;
		for (uint32_t l = 0; l < NL; l++)
			if (ss->l[l].tok_rc || ss->l[l].tok != r->q[j].n[l]) {
				problem(r, "token count wrong",
					"%s: seq %llu layer %u: %u tokens (rc %d), model %u", where,
					(unsigned long long)seq_id[j], l, ss->l[l].tok,
					ss->l[l].tok_rc, r->q[j].n[l]);
				return;
			}
		if (ss->info.lost)
			problem(r, "sequence lost", "%s: seq %llu lost (%d)", where,
				(unsigned long long)seq_id[j], ss->info.lost);
	}
	if (sn->st.live_seqs != live || sn->st.device_frames_used != dev ||
	    sn->st.host_blocks_used != host)
		problem(r, "pool accounting wrong",
			"%s: live %u (seqs %llu), device frames used %llu (seqs hold %llu), host "
			"blocks used %llu (seqs hold %llu)",
			where, sn->st.live_seqs, (unsigned long long)live,
			(unsigned long long)sn->st.device_frames_used, (unsigned long long)dev,
			(unsigned long long)sn->st.host_blocks_used, (unsigned long long)host);
}

/* Stats fields: compared after a failure (F), after a retry and at the end (S), changed
   only by block placement between host and disk (P), not at the end (N), depending on how
   work was batched (B: not compared loosely). */
#define SF_F 1u
#define SF_S 2u
#define SF_P 4u
#define SF_N 8u
#define SF_B 16u
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
	STAT(host_blocks_used, SF_F | SF_S | SF_P),
	STAT(bytes_h2d, SF_F),
	STAT(bytes_d2h, SF_F | SF_S),
	STAT(bytes_d2d, SF_F | SF_S),
	STAT(tokens_saved, SF_F | SF_S),
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
	if (how == CMP_LOOSE || (how == CMP_RECALL && b->view_rc == -ESTALE))
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
	memset(d, 0, sizeof(*d));
	for (size_t i = 0; i < sizeof(stat_fields) / sizeof(stat_fields[0]); i++) {
		unsigned cls = stat_fields[i].cls;
		uint64_t x = stat_get(&a->st, i), y = stat_get(&b->st, i);

		if (how == CMP_FAILED || how == CMP_RECALL ? !(cls & SF_F) : !(cls & SF_S))
			continue;
		if (how == CMP_RECALL && !strncmp(stat_fields[i].name, "recall_", 7))
			continue;
		if ((how == CMP_END || how == CMP_LOOSE) && (cls & SF_N))
			continue;
		if (how == CMP_LOOSE && (cls & SF_B))
			continue;
		if (x == y)
			continue;
		if ((cls & SF_P) && g_disk) {
			if (how == CMP_FAILED || how == CMP_RECALL)
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
		if (how != CMP_LOOSE && how != CMP_RECALL) {
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
			if (how == CMP_LOOSE)
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

/* Reads every token of every live sequence through both paths; each must be bit-exact. */
void check_tokens(struct run *r, const char *where)
{
	uint8_t k[HD * 4], v[HD * 4], ek[HD * 4], ev[HD * 4];

	for (uint32_t j = 0; j < N_IDS; j++) {
		const struct mseq *s = &r->q[j];

		if (!s->live)
			continue;
		for (uint32_t l = 0; l < NL; l++)
			for (uint32_t h = 0; h < NH; h++)
				for (uint32_t p = 0; p < s->n[l]; p++) {
					int rc1, rc2, bad;

					t_fill_row(r->c.dtype, HD, ek, s->id, l, h, p, 0);
					t_fill_row(r->c.dtype, HD, ev, s->id, l, h, p, 1);
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
