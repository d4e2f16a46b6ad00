/* SPDX-License-Identifier: MIT */
/*
 * A fork-join team: the calling thread and threads - 1 library threads ("kvt-par") share the
 * items of one job at a time. The manager uses it for work partitioned by sequence (a recall
 * call's regions, its Quest scoring), where each item touches only its own sequences' state
 * and its own result record.
 *
 * Items are claimed one by one, by whichever thread of the team comes first, and the caller
 * waits only for the items other threads have claimed: a worker that has not woken by the
 * time the caller has claimed the last item takes no part in that job. So a job never waits
 * for a thread the system has not scheduled (another process, or a thread of the caller's own
 * program, on the same cores), and at worst runs on the caller alone. Between jobs a worker
 * looks for the next one for a quarter of a millisecond, yielding its CPU between looks, and
 * then sleeps.
 */
#ifndef KVT_PAR_H
#define KVT_PAR_H

#include <stdint.h>

#define KVT_PAR_MAX_THREADS 64u

struct kvt_par;

/* Item `item` of the job (ctx), on the thread with scratch slot `slot` (0 the caller, else
   < the team's threads; one thread at a time uses a slot). */
typedef void (*kvt_par_fn)(void *ctx, uint32_t slot, uint32_t item);

/* Starts a team of `threads` (2..KVT_PAR_MAX_THREADS) threads, the caller counted. 0, -EINVAL
   or -ENOMEM/-EAGAIN (nothing started). */
int kvt_par_create(uint32_t threads, struct kvt_par **out);

/* Stops and frees the team (NULL: no-op). No job may be running. */
void kvt_par_destroy(struct kvt_par *p);

/* Runs fn(ctx, slot, item) once for every item < n_items, on the calling thread and on those
   of the team that join in time (p NULL: on the calling thread alone, in item order), and
   returns when all have run. Which thread runs an item is not fixed, so an item must not
   depend on its thread beyond its slot's scratch. fn must not fail and must not call
   kvt_par_run. One job at a time per team (the manager's calls are serialised). */
void kvt_par_run(struct kvt_par *p, kvt_par_fn fn, void *ctx, uint32_t n_items);

#endif /* KVT_PAR_H */
