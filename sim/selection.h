/* SPDX-License-Identifier: MIT */
/*
 * Decode selection model for replays without a real model: which host blocks each decode step
 * of one (sequence, layer, kv head) asks recall for. A seeded process with temporal locality:
 * each of the r blocks of the previous step is kept with probability p_keep; a replaced one is,
 * with probability p_revisit, a block dropped within the last `window` steps (picked
 * uniformly among them), else a fresh block uniform over the candidates. The overlap of a
 * step with the union of the previous k steps is therefore p_keep at k = 1 and rises about
 * linearly by (1 - p_keep) * p_revisit until k = window, then stays flat: SparseServe Fig. 8's
 * shape (defaults 0.80, 0.45, 12: about 0.80 -> 0.89, a 10% gain).
 */
#ifndef SIM_SELECTION_H
#define SIM_SELECTION_H

#include <stdint.h>

struct sim_sel_params {
	uint32_t r;	 /* blocks per step, 1..1024 */
	uint32_t window; /* steps a dropped block can come back within, 1..64 */
	double p_keep, p_revisit;
	uint64_t seed;
};

#define SIM_SEL_PARAMS_INIT                                                         \
	{                                                                           \
		.r = 16, .window = 12, .p_keep = 0.80, .p_revisit = 0.45, .seed = 1 \
	}

/* One (sequence, layer, kv head) stream. */
struct sim_sel_stream {
	uint32_t *cur;	 /* [r] current selection */
	uint32_t *drop;	 /* [window * r] ring of dropped blocks */
	uint32_t *dstep; /* step each was dropped at */
	uint32_t n_cur, n_drop, drop_head, step;
	uint64_t rng;
};

/* 0, or -EINVAL for bad parameters. */
int sim_sel_check(const struct sim_sel_params *p);
/* Allocates a stream (id makes streams independent under one seed). 0 or -ENOMEM. */
int sim_sel_stream_init(const struct sim_sel_params *p, uint64_t id, struct sim_sel_stream *st);
void sim_sel_stream_fini(struct sim_sel_stream *st);
/* The next step's selection among blocks [lo, hi): min(r, hi - lo) distinct blocks into out
   (UINT32_MAX in the remaining entries). Blocks outside [lo, hi) (the range grew or moved)
   are replaced. */
void sim_sel_next(const struct sim_sel_params *p, struct sim_sel_stream *st, uint32_t lo,
		  uint32_t hi, uint32_t *out);

#endif /* SIM_SELECTION_H */
