/* SPDX-License-Identifier: MIT */
/*
 * What the files of the fault walk share (test_fault.c: the records of the fault-free runs,
 * problems, the hook, data, setup and main; test_fault_snap.c: snapshots and their comparison;
 * test_fault_workload.c: the steps and the workload; test_fault_walk.c: the tests).
 */

#ifndef TEST_FAULT_H
#define TEST_FAULT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t_backend.h"
#include "t_config.h"
#include "t_data.h"
#include "fault.h"
#include "seq.h"

/* Geometry of t_small_config, which the workload uses. */
#define NL 2
#define NH 2
#define NQ 4
#define HD 16
#define BT 8
#define RB 2 /* recall_blocks */

#define RES_CAP 48 /* sink + recent + top-K = 40 */
#define FR_CAP 8
#define VIEW_CAP 8
#define MAX_STEPS 1024

#define MAX_BATCH 4
#define MAX_ROWS 96 /* positions of the longest prompt */

#define F_ABSORB (1u << 0)  /* may absorb the fault and succeed (see absorbed()) */
#define F_VOID (1u << 1)    /* returns nothing */
#define F_MCREATE (1u << 2) /* kvt_manager_create: *out must stay untouched */
#define F_SCREATE (1u << 3) /* kvt_sched_create: likewise */
#define F_CACHE (1u << 4)   /* kvt_seq_create_prefix: the cache may absorb the fault (absorbed()) */

#define M_SENTINEL ((struct kvt_manager *)(uintptr_t)0x5a5a5a50)
#define S_SENTINEL ((struct kvt_sched *)(uintptr_t)0x5a5a5a60)

/* A..D: the scripted sequences; E..G: the scheduler's requests; P..S: the prefix cache's (P
   caches a chain, Q shares part of it and prefills in chunks, R shares all of it after it went
   to the spill file, S makes the host room that sends it there). */
enum { A = 0, B, C, D, E, F, G, P, Q, R, S, N_IDS };

struct shead {
	int res_rc, fr_rc, view_rc;
	uint32_t n_res, n_fr, n_slots, n_view;
	int32_t res[RES_CAP];
	uint64_t fr[FR_CAP];
	struct kvt_recall_ref view[VIEW_CAP];
};

struct slayer {
	int tok_rc, att_rc;
	uint32_t tok;
	struct shead h[NH];
	float att[NQ * HD];
};

struct sseq {
	int info_rc;
	struct kvt_seq_info info;
	struct slayer l[NL];
};

/* The visible state of the manager (and scheduler) at one moment. */
struct snap {
	struct kvt_stats st;
	uint32_t pending; /* kvt_sched_pending, UINT32_MAX without a scheduler */
	struct sseq s[N_IDS];
};

/* Faults a call absorbed and succeeded anyway, by call and site (reported, not failures). */
struct absorbed {
	const char *call;
	enum kvt_fault_site site;
	uint32_t count;
	uint64_t first_n;
};

/* What the failed calls returned, by call. */
struct errs {
	const char *call;
	int rc[8];
	uint32_t count[8];
	uint32_t placement; /* failures that moved blocks between host and disk */
};

struct problem {
	char key[160];
	char first[2000];
	uint32_t count;
};

enum mode { MODE_COUNT, MODE_SNAP, MODE_FAULT };

struct mseq {
	uint64_t id;
	uint32_t L;
	bool live;
	uint32_t n[NL];	   /* tokens per layer; 0 = not prefilled */
	uint32_t fill[NL]; /* positions in the host history (prefix and chunks; n once prefilled) */
	uint32_t matched;  /* prefix tokens shared at creation */
};

struct run {
	enum mode mode;
	uint32_t mask;
	uint64_t nth;
	bool armed;	   /* the hook counts for this run (paused or not) */
	bool paused;	   /* disarmed for checks that are not part of the workload */
	uint64_t hit_base; /* hits counted before the latest arming */
	bool fired;	   /* the armed hit fired */
	bool aligned;	   /* the steps so far are those of the fault-free run */
	bool tainted;	   /* a problem was recorded: further ones are not */
	uint32_t step;
	const char *what;     /* step under way */
	const char *fault_at; /* step that took the fault */
	uint32_t fault_step;
	enum kvt_fault_site site;
	struct kvt_config c;
	struct kvt_manager *m;
	struct kvt_sched *s;
	struct mseq q[N_IDS];
	bool short_match;    /* a prefix match came out shorter than in the fault-free run */
	uint64_t hist_extra; /* stats.bytes_h2d_history of the checks' own loads (check_tokens) */
	size_t rb;
	uint8_t *k, *v, *qo, *qd;
};

void problem(struct run *r, const char *kind, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

enum cmp {
	CMP_FAILED, /* a failed call: nothing visible may change but block placement */
	CMP_RECALL, /* a recall whose load failed (kvtier.h): as CMP_FAILED, except that recall
		       views and attention may turn stale (-ESTALE, never silently different),
		       cache frames may have been taken and working sets may have grown */
	CMP_AFTER,  /* a retried call against the fault-free run: the same content */
	CMP_END,    /* the end of the workload: as CMP_AFTER, preemption counts aside */
	CMP_LOOSE,  /* the end of a run whose scheduler batches differed: content only (tokens,
		       resident sets, tier accounting), not how it was batched or recalled */
	CMP_SHORT,  /* the end of a run where a prefix match came out shorter (the cache lost a
		       span to the fault, or a create could not read one back): as CMP_LOOSE, and
		       not what sharing saved (prefix tokens, shared blocks, rows saved) */
};

struct diff {
	char buf[1600];
	size_t len;
	uint32_t n, n_ws; /* differences; of them, in the recall working set */
	bool placement;	  /* only block placement differed */
};

/* test_fault.c */
extern const uint64_t seq_id[N_IDS];
extern const uint32_t seq_prompt[N_IDS];
extern const uint32_t seq_max_new[N_IDS];
extern const uint64_t seq_base[N_IDS];
extern const uint32_t seq_base_len[N_IDS];
extern struct kvt_config g_cfg;
/* the build has a disk tier (spill does not say -ENOTSUP) */
extern bool g_disk;
/* spill directory */
extern char g_dir[256];
/* steps of the fault-free workload */
extern uint32_t g_steps;
extern const char *g_name[MAX_STEPS];
/* hits (all sites) after each step */
extern uint64_t g_hits_after[MAX_STEPS];
/* hits of the whole workload, all sites */
extern uint64_t g_k;
extern uint64_t g_k_site[KVT_FAULT_SITES];
/* before each step */
extern struct snap *g_snap[MAX_STEPS + 1];
extern bool g_snap_gap[MAX_STEPS + 1];
/* output of each attend step */
extern float *g_att[MAX_STEPS];
/* at the end of the workload */
extern struct snap *g_end;
extern int g_end_att_rc[N_IDS][NL];
extern float g_end_att[N_IDS][NL][NQ * HD];
extern uint32_t g_sched_preempted, g_sched_resumed, g_sched_iters;
extern uint64_t g_walked[KVT_FAULT_SITES], g_failed, g_absorbed, g_retried, g_placement;
extern uint64_t g_tokens, g_lost, g_create_failed, g_log_msgs;
extern uint64_t g_short; /* runs where a prefix match came out shorter after the fault */
extern struct absorbed g_abs[32];
extern uint32_t g_n_abs;
struct errs *count_error(const char *call, int rc);
extern uint32_t g_n_prob;
extern uint64_t g_prob_total, g_prob_dropped;
extern bool g_verbose;
/* for check_context */
extern struct run *g_run;
uint64_t hits_now(const struct run *r);
void pause_hook(struct run *r);
void resume_hook(struct run *r);
void attend_q(uint64_t id, uint32_t l, float *q);
uint64_t data_id(uint32_t j, uint32_t pos);
void log_sink(void *user, enum kvt_log_level level, const char *msg);
struct kvt_config fault_config(bool disk);
bool probe_disk(void);
void print_errors(void);
void print_problems(void);

/* test_fault_snap.c */
struct snap *snapshot(struct run *r);
void check_invariants(struct run *r, const struct snap *sn, const char *where);
void compare(const struct snap *a, const struct snap *b, enum cmp how, struct diff *d);
void check_tokens(struct run *r, const char *where);

/* test_fault_workload.c */
bool absorbed(struct run *r, uint32_t i, unsigned flags);
void run_once(enum mode mode, uint32_t mask, uint64_t nth);

/* test_fault_walk.c */
void test_fault_walk(void **state);
void test_fault_shared_site(void **state);

#endif /* TEST_FAULT_H */
