/* SPDX-License-Identifier: MIT */
/*
 * What the files of the GPU suite share (test_cuda.c: failure context, runtime helpers, the pair
 * of managers, token data, the calls on one manager, the counters, main; test_cuda_checks.c: the
 * comparisons of the pair; test_cuda_*.c: the tests by topic).
 */

#ifndef TEST_CUDA_H
#define TEST_CUDA_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "t_check.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "t_data.h"
#include "t_manager.h"
#include "base.h" /* kvt_manager.dev_regions */
#include "fault.h"
#include "seq.h" /* kvt_seq_read_token_host */
#include "plugin.h"
#include "policy.h"
#include "recall.h" /* the regions, read back (kvt_recall_pull) */
#include "util.h"
#ifdef KVT_TEST_EMULATED
#include "cuda_emu/fake_cudart.h"
#endif

/* Geometry of every manager here: small, so the suite runs in seconds. */
#define N_LAYERS 2
#define N_KV 2
#define N_Q 4
#define G_Q (N_Q / N_KV)
#define HEAD_DIM 64
#define BT 16
#define SINK 16
#define RECENT 64
#define TOPK 63 /* N_HEAVY pooling windows of POOL positions */
#define OBS 8
#define POOL 7
#define R_BLOCKS 4
#define N_HEAVY 9 /* heavy keys per (sequence, layer, kv head) of a prompt that selects */

#define POS_CAP 256  /* >= SINK + RECENT + TOPK */
#define FRAME_CAP 16 /* >= frames of one resident set */
#define VIEW_CAP 16  /* >= R_BLOCKS */
#define ROW_MAX (HEAD_DIM * 4)
#define DECODE_STEPS 70 /* > RECENT: every ring wraps */
#define FAULT_MAX 400	/* most CUDA calls one operation may make */

#define ATTEND_TOL 1e-4
#define TIE_TOL 1e-4

#define ULL(x) ((unsigned long long)(x))

void set_ctx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define CUDA_OK(call) cuda_ok_at((call), #call, __FILE__, __LINE__)

struct pair {
	struct kvt_config cfg;	   /* the host manager's; the CUDA one's differs in backend */
	struct kvt_manager *h, *c; /* host backend (reference), CUDA backend */
	cudaStream_t stream;	   /* every CUDA-manager call runs on it */
	bool own_stream;
	size_t rowb, block_bytes;
	uint32_t max_L, max_batch;
	void *dk, *dv, *dq; /* device inputs of prefill: [N_KV][max_L][D], [N_Q][OBS][D] */
	void *ek, *ev, *eq; /* of decode ([max_batch][N_KV][D]) and recall ([max_batch][N_Q][D]) */
};

/* What the test knows of one sequence: every row it ever wrote (both managers got the same). */
struct tseq {
	uint64_t id;
	uint32_t L, cap; /* prompt tokens; tokens the reference holds per layer */
	uint32_t count;	 /* top-K tokens per head (kvt_snapkv_count) */
	enum kvt_dtype dt;
	size_t rowb;
	uint32_t n[N_LAYERS];		    /* tokens written per layer (0: not prefilled) */
	uint8_t *k[N_LAYERS], *v[N_LAYERS]; /* [N_KV][cap][HEAD_DIM] of dt */
	uint8_t *q_obs[N_LAYERS];	    /* [N_Q][OBS][HEAD_DIM] of dt */
	uint8_t *q_dec[N_LAYERS];	    /* [N_Q][HEAD_DIM] of dt: the recall query */
	float *q_att[N_LAYERS];		    /* the same in f32: the attention query */
	uint32_t n_heavy;		    /* heavy keys per head (0 without selection) */
	uint32_t heavy[N_LAYERS][N_KV][N_HEAVY];
	int32_t topk_h[N_LAYERS][N_KV][TOPK]; /* top-K each manager chose at prefill */
	int32_t topk_c[N_LAYERS][N_KV][TOPK];
	bool tie[N_LAYERS];	 /* the CUDA top-K differs from the host's by accepted ties */
	bool recalled[N_LAYERS]; /* a recall named (sequence, layer) since its last preemption */
};

/* The calls of the serving loop (prefill, decode append, recall, resume) queue their device
   work on the caller's stream and wait for that stream at most: a wait for the whole device
   would also wait for a serving engine's kernels on its other streams. The emulated runtime
   counts such waits (cudaDeviceSynchronize, cudaFree, cudaFreeHost); a GPU cannot, so there
   this checks nothing. A failed call may wait for the device, to let what it queued finish. */
#ifdef KVT_TEST_EMULATED
#define DEVICE_WAITS() fake_cuda_device_waits()
#else
#define DEVICE_WAITS() 0ull
#endif

/* The manager's device tables come from the backend's memory pool, in stream order: a call
   that grows them makes no cudaMalloc, which a GPU may make wait. The emulated runtime counts
   cudaMalloc calls; a GPU cannot. */
#ifdef KVT_TEST_EMULATED
#define MALLOCS() fake_cuda_mallocs()
#else
#define MALLOCS() 0ull
#endif

/* With the regions on the device, a recall call queues its program and returns: the calling
   thread waits for nothing but the programs of earlier calls it settles (kvt_recall_settle),
   and only for those the device has not finished (a GPU finishes them a step ago, as a rule).
   The emulated runtime counts the thread's waits (stream, event, device); a GPU cannot. */
#ifdef KVT_TEST_EMULATED
#define THREAD_WAITS() fake_cuda_thread_waits()
#else
#define THREAD_WAITS() 0ull
#endif

#define PREFILL_BOTH(p, t, l) prefill_both_at((p), (t), (l), __FILE__, __LINE__)

#define DECODE_BOTH(p, ts, n, l) decode_both_at((p), (ts), (n), (l), __FILE__, __LINE__)

#define RECALL_BOTH(p, ts, n, l) recall_both_at((p), (ts), (n), (l), __FILE__, __LINE__)

/* Smallest relative gap of pooled scores at the top-K cutoff seen since the last reset. */
struct margin {
	double gap;
	uint64_t seq;
	uint32_t layer, head;
};

#define CHECK_SELECTION(p, t, l) check_selection_at((p), (t), (l), __FILE__, __LINE__)

#define CHECK_RESIDENT(p, t, l) check_resident_at((p), (t), (l), __FILE__, __LINE__)

#define CHECK_TOKENS(p, t, l, with_host) \
	check_tokens_at((p), (t), (l), (with_host), __FILE__, __LINE__)

#define CHECK_FRAMES(p, t, l) check_frames_at((p), (t), (l), __FILE__, __LINE__)

#define SNAPSHOT(p, m, t, l, b) snapshot_at((p), (m), (t), (l), (b), __FILE__, __LINE__)

#define CHECK_VIEWS(p, t, l) check_views_at((p), (t), (l), __FILE__, __LINE__)

#define CHECK_ATTEND(p, t, l, out) check_attend_at((p), (t), (l), (out), __FILE__, __LINE__)

#define F_FIX 2u /* a failed call leaves it as it was */

struct stat_field {
	const char *name;
	size_t off, size;
	unsigned flags;
};

#define COMPARE_STATS(p, tie) compare_stats_at((p), (tie), __FILE__, __LINE__)

#define CHECK_XFER(st) check_xfer_at((st), __FILE__, __LINE__)

#define CHECK_ALL(p, ts, n, tie) check_all_at((p), (ts), (n), (tie), __FILE__, __LINE__)

/* State of the CUDA manager right before an armed call. */
struct before {
	struct kvt_seq_info ti, bi;
	struct kvt_stats st;
	uint8_t *t_snap; /* t's frames of t_layer, or NULL when t has none there */
	size_t t_snap_bytes;
	uint32_t t_layer;
};

/* test_cuda.c */
extern char g_ctx[160];
void cuda_ok_at(cudaError_t e, const char *what, const char *file, int line);
void *dev_alloc(size_t n);
void dev_free(void *p);
void addr_get(void *dst, uint64_t addr, size_t n, bool dev);
struct kvt_config suite_config(enum kvt_dtype dt, enum kvt_backend be);
const char *side(const struct pair *p, const struct kvt_manager *m);
void pair_init_host(struct pair *p, enum kvt_dtype dt, cudaStream_t stream, uint32_t max_L,
		    uint32_t max_batch, uint64_t host_bytes);
void pair_init(struct pair *p, enum kvt_dtype dt, cudaStream_t stream, uint32_t max_L,
	       uint32_t max_batch);
void pair_fini(struct pair *p);
void sync_both(struct pair *p);
void garble(const struct pair *p, void *d, size_t n);
uint32_t ring0_of(uint32_t N);
uint32_t cand_hi(uint32_t L);
const uint8_t *ref_row(const struct tseq *t, uint32_t layer, uint32_t h, uint32_t pos, int is_v);
void tseq_gen(struct tseq *t, const struct kvt_config *c, uint64_t id, uint32_t L, uint32_t extra);
void tseq_free(struct tseq *t);
void prompt_tensor(const struct tseq *t, uint32_t layer, int is_v, uint8_t *dst);
void no_device_wait(uint64_t before, int rc, const char *call, uint64_t seq, uint32_t layer);
int prefill_on(struct pair *p, struct kvt_manager *m, const struct tseq *t, uint32_t layer);
int decode_on(struct pair *p, struct kvt_manager *m, struct tseq *const *ts, uint32_t n,
	      uint32_t layer);
int recall_on(struct pair *p, struct kvt_manager *m, struct tseq *const *ts, uint32_t n,
	      uint32_t layer);
void prefill_both_at(struct pair *p, struct tseq *t, uint32_t layer, const char *file, int line);
void decode_both_at(struct pair *p, struct tseq *const *ts, uint32_t n, uint32_t layer,
		    const char *file, int line);
void recall_both_at(struct pair *p, struct tseq *const *ts, uint32_t n, uint32_t layer,
		    const char *file, int line);
extern const struct stat_field stat_fields[];
extern const size_t n_stat_fields;
uint64_t stat_get(const struct kvt_stats *st, const struct stat_field *f);
void compare_stats_at(struct pair *p, bool any_tie, const char *file, int line);
void check_xfer_at(const struct kvt_stats *st, const char *file, int line);

/* test_cuda_checks.c */
extern struct margin g_margin;
void check_selection_at(struct pair *p, struct tseq *t, uint32_t layer, const char *file, int line);
void check_resident_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
		       int line);
void check_tokens_at(struct pair *p, const struct tseq *t, uint32_t layer, bool with_host,
		     const char *file, int line);
void check_frames_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
		     int line);
uint8_t *snapshot_at(struct pair *p, struct kvt_manager *m, const struct tseq *t, uint32_t layer,
		     size_t *bytes, const char *file, int line);
bool snapshot_differs(const uint8_t *before, size_t nb, const uint8_t *after, size_t na,
		      const struct tseq *t, uint32_t layer, char *msg, size_t len);
void expect_frames_as_at(struct pair *p, const struct tseq *t, uint32_t layer,
			 const uint8_t *before, size_t nb, const char *what, const char *file,
			 int line);
void check_views_at(struct pair *p, const struct tseq *t, uint32_t layer, const char *file,
		    int line);
void expect_close_at(const float *got, const float *want, const char *what, const struct tseq *t,
		     uint32_t layer, const char *file, int line);
void check_attend_at(struct pair *p, const struct tseq *t, uint32_t layer, float *out_c,
		     const char *file, int line);

/* test_cuda_vs_host.c */
void test_backend_choice(void **state);
void print_margin(enum kvt_dtype dt);
void check_all_at(struct pair *p, struct tseq *ts, uint32_t n, bool any_tie, const char *file,
		  int line);
void test_vs_host_f32(void **state);
void test_vs_host_f16(void **state);
void test_vs_host_bf16(void **state);
void test_long_prompt(void **state);
void test_huge_prompt(void **state);

/* test_cuda_streams.c */
void test_nonblocking_stream(void **state);
void test_resume_burst(void **state);
void test_save_side_stream(void **state);
void test_tables_one_wait(void **state);
void test_tables_grow_across_streams(void **state);
void test_program_after_stream_reused(void **state);
void test_device_time_sample(void **state);

/* test_cuda_faults.c */
void test_fault_prefill(void **state);
void test_fault_decode(void **state);
void test_fault_recall(void **state);
void test_fault_recall_settle(void **state);
void test_fault_stage(void **state);

#endif /* TEST_CUDA_H */
