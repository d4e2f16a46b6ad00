/* SPDX-License-Identifier: MIT */
/*
 * Recorded decode selections for kvtier-replay (--selections FILE): which host blocks each
 * decode step of a request recalled, per layer and kv head, as an engine logged them. A
 * request named in the file replays them instead of the synthetic selection model.
 *
 * Format: text, one record a line, fields separated by spaces or tabs:
 *
 *     REQUEST STEP LAYER HEAD [BLOCK ...]
 *
 *   REQUEST  0-based index of the request in the replayed trace (arrival order, as the
 *            replay numbers them in its per-request CSV)
 *   STEP     0-based decode step of that request (step 0 produces its second token)
 *   LAYER, HEAD  layer and kv head
 *   BLOCK    host block indices recalled (block b holds positions [b * block_tokens,
 *            (b + 1) * block_tokens)); at most the replay's r per record, none for an empty
 *            selection
 *
 * A UTF-8 byte-order mark at the start of the file is skipped, as in traces and preset files.
 * Lines starting with '#' and blank lines are ignored; records may come in any order, but a
 * (REQUEST, STEP, LAYER, HEAD) appears at most once. For a request named in the file, a
 * (step, layer, head) without a record recalls nothing. Errors name the file, line and field.
 */
#ifndef SIM_SELFILE_H
#define SIM_SELFILE_H

#include <stddef.h>
#include <stdint.h>

struct sim_selrec {
	uint32_t req, step, layer, head;
	uint32_t first, n; /* its blocks: blocks[first .. first + n) */
	uint32_t line;
};

struct sim_selfile {
	struct sim_selrec *rec; /* sorted by (req, step, layer, head) */
	size_t n_rec;
	uint32_t *blocks;
	size_t n_blocks;
	char path[256];
};

/* Reads path into *out (sim_selfile_free releases it): 0, or -errno with "FILE:LINE: field
   'NAME': what" (or "FILE: reason") in err, *out untouched. */
int sim_selfile_read(const char *path, struct sim_selfile *out, char *err, size_t err_len);
void sim_selfile_free(struct sim_selfile *f);

/* The record of (req, step, layer, head), or NULL. */
const struct sim_selrec *sim_selfile_find(const struct sim_selfile *f, uint32_t req, uint32_t step,
					  uint32_t layer, uint32_t head);
/* Whether request req has any record. */
int sim_selfile_has_req(const struct sim_selfile *f, uint32_t req);

#endif /* SIM_SELFILE_H */
