/* SPDX-License-Identifier: MIT */
/*
 * A fork-join team: the calling thread and threads - 1 library threads ("kvt-par") run the
 * parts of one job at a time. The manager uses it for work partitioned by sequence (a recall
 * call's regions), where each part touches only its own sequences' state.
 */
#ifndef KVT_PAR_H
#define KVT_PAR_H

#include <stdint.h>

#define KVT_PAR_MAX_THREADS 64u

struct kvt_par;

/* Part `part` of n_parts of the job (ctx). */
typedef void (*kvt_par_fn)(void *ctx, uint32_t part, uint32_t n_parts);

/* Starts a team of `threads` (2..KVT_PAR_MAX_THREADS) threads, the caller counted. 0, -EINVAL
   or -ENOMEM/-EAGAIN (nothing started). */
int kvt_par_create(uint32_t threads, struct kvt_par **out);

/* Stops and frees the team (NULL: no-op). No job may be running. */
void kvt_par_destroy(struct kvt_par *p);

/* Runs fn(ctx, k, n) for every part k < n (n = the team's threads): part 0 on the calling
   thread, the others on the team's, and returns when all have. fn must not fail and must not
   call kvt_par_run. One job at a time per team (the manager's calls are serialised). */
void kvt_par_run(struct kvt_par *p, kvt_par_fn fn, void *ctx);

#endif /* KVT_PAR_H */
