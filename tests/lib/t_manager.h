/* SPDX-License-Identifier: MIT */
/*
 * Shorthands for a manager under test: create one (on the backend under test, t_backend.h),
 * read its stats, a sequence's info and token count, each failing the test where the call
 * fails; a check of the library's threads' signal masks; the process's resident memory.
 */
#ifndef KVT_TEST_T_MANAGER_H
#define KVT_TEST_T_MANAGER_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier.h"

/* A manager of configuration c on the backend under test (t_manager_create); fails the test
   unless it is created. */
struct kvt_manager *t_mk(const struct kvt_config *c);
/* Creates seq with an L-token prompt and prefills every layer of it with the generator's rows
   (t_fill_prefill, through t_prefill_layer); fails the test unless every call succeeds. */
void t_prefill_seq(struct kvt_manager *m, const struct kvt_config *c, uint64_t seq, uint32_t L);

/* Every recall view of (seq, layer) in two managers of configuration c (views of at most r
   blocks): the same result, count, blocks, valid counts, resident masks, and frames as offsets
   from the first frame each manager showed (origin, set by the first call that sees one; their
   recall caches lie elsewhere). Fails the test where they differ. */
void t_same_views(struct kvt_manager *const mm[2], const struct kvt_config *c, uint64_t seq,
		  uint32_t layer, uint32_t r, uint64_t origin[2]);

/* Where two managers keep their regions apart (mm[0] on the CPU, mm[1] on the device), checks
   that (seq, layer)'s region is the same state on both: slot count, clock, every slot (key,
   n_valid, stamp, rank) and its frame (as an offset from origin[k]), every key's slot, touch
   and top-K count (once both counted them), the working set. The device's is read back. Fails
   the test where they differ; nothing to check when both keep their regions alike. */
void t_same_region(struct kvt_manager *const mm[2], uint64_t seq, uint32_t layer,
		   uint64_t origin[2]);

/* kvt_manager_stats, which must succeed. */
struct kvt_stats t_stats_of(const struct kvt_manager *m);
/* kvt_seq_info of a live sequence, which must succeed. */
struct kvt_seq_info t_info_of(struct kvt_manager *m, uint64_t seq);
/* kvt_seq_tokens of a live sequence's layer, which must succeed. */
uint32_t t_tokens_of(struct kvt_manager *m, uint64_t seq, uint32_t layer);

/* Fails the test at file:line, naming the counters that differ most often, unless the two
   stats are identical (a failed call must change nothing) but for recall_device_ns, a time,
   and recall_device_timed, the calls it sums. */
void t_check_stats_equal(const struct kvt_stats *a, const struct kvt_stats *b, const char *file,
			 int line);
#define CHECK_STATS_EQUAL(a, b) t_check_stats_equal((a), (b), __FILE__, __LINE__)

/* Whether every thread of the library's (named "kvt-...") blocks SIGINT, SIGTERM and SIGUSR1:
   they leave the application's signals alone. From Name and SigBlk in
   /proc/self/task/TID/status; *n: how many such threads there are. */
bool t_kvt_threads_block_signals(uint32_t *n);

/* The process's resident memory now, in bytes (from /proc/self/statm); fails the test when it
   cannot be read. Memory taken (written) and not yet given back shows in it. */
uint64_t t_rss_bytes(void);

/* Entries of dir other than . and .. (a spill directory: the spill file is unlinked, so none
   while a manager runs, and none after). Fails the test when dir cannot be read. */
uint32_t t_dir_entries(const char *dir);

#endif /* KVT_TEST_T_MANAGER_H */
