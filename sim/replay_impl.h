/* SPDX-License-Identifier: MIT */
/*
 * Private to the replay engine (replay.c, vllm.c): the state of one run, which both serving
 * loops share, and the run's bookkeeping they call (arrivals, failures, tokens, the end of an
 * iteration). Neither tools nor tests include it.
 */
#ifndef SIM_REPLAY_IMPL_H
#define SIM_REPLAY_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "replay.h"

/* The run's error message, in a function with `run` in scope. */
#define ERRF(...) snprintf(run->err, run->err_len, __VA_ARGS__)

/* A request's state in the engine (the baseline keeps its own in vllm.c). */
struct rreq {
	double last_tok_s;	    /* time of its latest token */
	struct sim_sel_stream *sel; /* [n_layers * n_kv_heads] once decoding (recall policies) */
	uint32_t matched;	    /* leading prompt tokens shared from the prefix cache */
	uint32_t n_ref;		    /* leading hash ids counted as live shares (prefix_live) */
	uint32_t n_chain;	    /* leading hash ids given to the library (a disk tier may
				       shorten the chain: live shares stay in DRAM) */
	uint64_t pin_future;	    /* host groups its spans will pin once prefilled */
	uint64_t dram_res;	    /* host groups reserved for it: its history less what it
				       shares with the prefix cache */
	bool submitted;		    /* its history reserved in DRAM */
	bool started;		    /* its first prefill item came */
};

struct run {
	const struct sim_replay_opts *o;
	const struct sim_trace *t;
	struct sim_replay_result *res;
	struct rreq *rq;
	char *err;
	size_t err_len;
	double now;
	size_t next;	 /* next trace request to enter: next - finished are in the system */
	size_t finished; /* completed + failed */
	size_t itl_cap;
	size_t tbt_cap;
	uint64_t batch_sum, loaded_sum, lookups, hits;
	uint64_t iter;
	double last_progress;
	/* DRAM reservation (host groups) */
	uint64_t dram_groups, dram_used;
	uint64_t host_groups; /* DRAM alone, with a disk tier: a running history must fit it */
};

/* Iteration bookkeeping common to both loops. */
struct iter_rec {
	uint32_t batch, n_pre, n_dec;
	uint64_t token_layers, loaded, lookups, hits;
	uint32_t preempted, resumed, queued;
	struct sim_iter_time tm;
};

/* Fails request i now, for `reason` (static text). */
void run_fail_req(struct run *run, size_t i, const char *reason);

/* Whether request i can never run: static reasons, checked when it arrives. NULL if none. */
const char *run_static_reject(const struct run *run, size_t i);

/* Records a token of request i produced at run->now; completes it at its last token. `window`:
   the iteration counts in the window figures. 0 or -ENOMEM. */
int run_token(struct run *run, size_t i, bool window);

/* Adds the iteration that started at `start` to the run's figures (its CSV row too) and
   reports progress. 0 or -ENOMEM. */
int run_end_iteration(struct run *run, const struct iter_rec *ir, double start);

/* Whether the loop should stop: everything finished, or the iteration cap. */
bool run_over(const struct run *run);

/* The request that enters next, if its time has come (closed loop: while fewer than
   concurrency are in the system). SIZE_MAX when none. */
size_t run_arriving(struct run *run);

/* Time of the next arrival when nothing runs (open loop), or -1. */
double run_next_arrival(const struct run *run);

/* The vLLM baseline (policy full, vllm.c) over the whole run, with hbm_bytes of KV pages:
   0, or -errno with the run's message. */
int frun_loop(struct run *run, double hbm_bytes);

#endif /* SIM_REPLAY_IMPL_H */
