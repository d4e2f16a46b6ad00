/* SPDX-License-Identifier: MIT */
/*
 * The replay engine of kvtier-replay and kvtier-curve (not part of the library): a serving
 * engine's loop over a request trace, run on simulated time. The real manager, policy and
 * scheduler run on the model backend (no payload bytes; transfers timed by its bandwidth and
 * per-call model); the GPU's work is timed by the execution model (exec_model.h); the decode
 * selection comes from the selection model (selection.h).
 *
 * One iteration: the requests that arrived by now are submitted; the scheduler forms a batch;
 * each prefill item's layers are prefilled, each decode item appends one token to every layer
 * and (policies with recall) recalls its selection per layer; the iteration takes
 * sim_iter_time() of that work; tokens produced by it are stamped at its end.
 *
 * Policies:
 *   kvtier          SnapStream compressed cache (sink, top-K, ring) in HBM, every token in
 *                   DRAM, dynamic recall of r blocks per (layer, kv head) into the recall
 *                   cache, fused gathers, working-set-aware admission
 *   snapstream      the compressed cache in HBM and no host tier: no recall, and the saves
 *                   to the host history are not timed (SnapStream keeps nothing off the GPU)
 *   sparse-offload  all KV in DRAM, a small ring in HBM, recall of the whole attention
 *                   budget per step by per-block copies, no working-set control (vLLM-SO)
 *   full            every token in HBM, dense attention, paged admission (plain vLLM: blocks
 *                   of 16 tokens, admission while the prompt's blocks fit, the latest
 *                   request preempted and recomputed when a decode finds no free block),
 *                   with automatic prefix caching (APC) of the trace's 512-token spans
 *
 * Prefix reuse (prefix_cache, on by default; the trace's hash ids, trace.h): a request whose
 * leading spans a cache holds shares them and prefills only the rest of its prompt, never
 * the whole prompt (at least one token is computed). full: vLLM's APC in HBM, spans of 32
 * pages cached once a prefill completes, kept after their requests finish, unreferenced ones
 * evicted least recently used (the latest span of a chain first) whenever pages are needed,
 * before any preemption. kvtier and sparse-offload: the library's prefix cache in the host
 * tier (kvt_seq_create_prefix); per layer the engine loads the shared prefix's K/V from the
 * host (kvt_seq_load_kv, timed as transfer) and computes the suffix's queries over all the
 * keys. snapstream: none (it keeps nothing off the GPU to share).
 *
 * DRAM: a request is submitted to the scheduler only while DRAM can hold its whole history
 * (prompt + output) less the prefix it shares (spans live requests share counted once, idle
 * cached spans as free space), or, with a disk tier, DRAM and the disk together (no limit
 * when the disk has none; DRAM then caches the histories, and one layer of a history must fit
 * it); until then it waits in arrival order. With prefix reuse it is also created only while
 * fewer than 4 created requests have not begun their prefill, so that it is matched against
 * the cache when its prefill is near. Failures, each alone and counted
 * with a reason: input + output beyond the model's context, an empty prompt or no output
 * tokens, a request whose resident set or history could never fit the budgets alone.
 */
#ifndef SIM_REPLAY_H
#define SIM_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "exec_model.h"
#include "selection.h"
#include "selfile.h"
#include "trace.h"

enum sim_policy {
	SIM_POLICY_KVTIER = 0,
	SIM_POLICY_SNAPSTREAM,
	SIM_POLICY_SPARSE_OFFLOAD,
	SIM_POLICY_FULL,
};

/* "kvtier", "snapstream", "sparse-offload", "full"; "?" otherwise. */
const char *sim_policy_name(enum sim_policy p);
/* 0 or -EINVAL. */
int sim_policy_parse(const char *name, enum sim_policy *p);

struct sim_replay_opts {
	enum sim_policy policy;
	struct sim_model_preset model;
	struct sim_gpu_preset gpu;
	double hbm_gib;	 /* KV budget in HBM; <= 0: the GPU's memory less the weights */
	double dram_gib; /* host tier, default 256 */
	/* Cache geometry: block tokens (8..64, power of two), sink, top-K, ring (recent) tokens */
	uint32_t block_tokens, sink_tokens, topk_tokens, recent_tokens;
	/* Recall (kvtier): r blocks per (layer, kv head) per decode step; the recall cache takes
	   recall_cache_frac of the HBM budget; ws_window steps of working set. */
	uint32_t recall_blocks, ws_window;
	double recall_cache_frac;
	/* Recall simulated on this many layers (evenly spaced; 0 or n_layers: all). The
	   selection model's layers are independent and alike, so one layer in n_layers /
	   recall_layers stands for the others: that layer's recall cache share is simulated,
	   and its loads, load time, recall CPU time and recalled frames are scaled by the
	   ratio. Cuts the replay's cost by that ratio; kvtier-curve runs all layers. */
	uint32_t recall_layers;
	/* sparse-offload: the ring it keeps in HBM, and its recall (defaults: 64 tokens;
	   (sink + top-K + r * block) / block blocks, the same attention budget as kvtier) */
	uint32_t so_recent_tokens, so_recall_blocks;
	struct sim_sel_params sel; /* .r is set from the policy */
	/* Recorded selections (selfile.h) replayed for the requests they name, or NULL; with
	   them every layer is simulated (recall_layers is ignored). */
	const struct sim_selfile *selections;
	bool ws_control;		   /* --no-ws-control clears it */
	bool fused;			   /* --no-fused-transfer clears it */
	uint32_t chunk_tokens;		   /* --chunked-prefill B: B tokens of prefill per iteration
					      (all layers); 0: layer-segmented (2048 * n_layers
					      token-layers per iteration) */
	uint32_t max_requests, max_tokens; /* R_max, T_max (T_max >= chunk) */
	/* Prefill token-layers per iteration (kvtier, snapstream, sparse-offload); 0: the
	   default, 2048 * n_layers, or chunk * n_layers. kvtier-curve raises it (with T_max)
	   so that a closed loop's requests are all prefilled before its measured window. */
	uint64_t max_inject_tokens;
	/* Add the measured manager+scheduler CPU time. Without it the results are deterministic,
	   and (sel_thread) the selection model draws on a second thread, with a second CPU
	   online, while the engine's thread prefills, appends and recalls: the same draws,
	   sooner. */
	bool cpu_time;
	bool sel_thread; /* default true; false: the engine's thread draws (the same results) */
	/* The manager's config.recall_threads (the same results with any count); 0, the
	   default: 2 without the measured CPU time and with a second CPU online, else 1. */
	uint32_t recall_threads;
	bool prefix_cache; /* share prompt prefixes of equal hash ids; --no-prefix-cache clears it
			    */
	bool roofline;	   /* time every class of work at the datasheet peak (sim_gpu_roofline) */
	/* Disk tier (kvtier, sparse-offload): the manager spills host blocks to a spill file in
	   this directory (NULL: none), of at most disk_gib (0: no limit), and DRAM admission
	   counts DRAM plus disk. The model backend writes no file: each I/O batch is timed by
	   the manager's disk model and added to the iteration's transfer time. */
	const char *spill_dir;
	double disk_gib;
	double disk_gbps; /* the modelled disk's bandwidth, GB/s (default 6: one NVMe drive;
			     several striped drives give more) */
	/* Closed loop: keep `concurrency` requests in the system, the next one entering when
	   one completes (arrival times ignored); 0: open loop by arrival time. */
	uint32_t concurrency;
	/* Stop after this many iterations (0: run to the end); and iterations before which
	   the curve's window figures are not counted. */
	uint64_t max_iterations, warmup_iterations;
	/* Per-iteration callback for the progress bar (may be NULL). */
	void (*progress)(void *user, size_t done, size_t total, double sim_s);
	void *progress_user;
	FILE *iter_csv; /* per-iteration rows, or NULL */
};

/* Defaults for the llama3-8b/h100 presets, policy kvtier: block 32, sink 128, top-K 1024,
   ring 512, r = 8 on 8 sampled layers, recall cache 10% of HBM, w = 12, ws control and fused
   transfers on, layer-segmented prefill, R_max 256, T_max 8192, CPU time counted (the
   selection thread allowed when it is not), DRAM 256 GiB, no disk tier, prefix cache on. */
void sim_replay_opts_init(struct sim_replay_opts *o);

/*
 * The engine options kvtier-replay and kvtier-curve share, by long-option name (without
 * "--"; arg is NULL for the flags): hbm-gib, dram-gib, max-batch, max-batch-tokens,
 * concurrency, block-tokens, sink, topk, recent, recall, recall-cache-frac, recall-layers,
 * ws-window, sel-keep, sel-revisit, sel-window, chunked-prefill, no-ws-control,
 * no-fused-transfer, no-cpu-time, no-prefix-cache, roofline, spill-dir, disk-gib. Parses arg into
 * *o: 0, -1 for a bad value (*o unchanged), 1 when name is not one of them. A tool accepts those
 * its getopt table lists.
 */
int sim_replay_opt(const char *name, const char *arg, struct sim_replay_opts *o);

/* The GPU preset a run with options o times its work with (o->gpu, made the bare roofline
   with o->roofline). */
void sim_replay_gpu(const struct sim_replay_opts *o, struct sim_gpu_preset *g);

/* What engine option `name` (one that takes a value) accepts, for a message: "an integer in
   [8, 64], a power of two", "a number in (0, 0.99]". Into buf[len]: 0, or 1 when name is not
   such an option. */
int sim_replay_opt_want(const char *name, char *buf, size_t len);

enum sim_req_status {
	SIM_REQ_PENDING = 0,
	SIM_REQ_DONE,
	SIM_REQ_FAILED,
};

struct sim_req_result {
	double arrival_s, sched_s, first_token_s, finish_s; /* simulated; -1 when not reached */
	uint32_t input_tokens, output_tokens, generated;
	uint32_t preemptions;
	enum sim_req_status status;
	const char *reason; /* static text when failed */
};

struct sim_replay_result {
	size_t n_reqs;		      /* requests read */
	struct sim_req_result *reqs;  /* [n_reqs], trace order */
	size_t completed, failed;     /* completed + failed == n_reqs when run to the end */
	double duration_s;	      /* simulated: first arrival to last completion */
	uint64_t total_input_tokens;  /* of completed requests */
	uint64_t total_output_tokens; /* of completed requests */
	double *itl_s;		      /* every inter-token latency, [n_itl] */
	size_t n_itl;
	uint64_t iterations;
	double mean_batch_size;
	uint32_t max_batch_size;
	double blocks_loaded_per_iteration; /* recall misses loaded, mean over iterations */
	double recall_hit_rate;		    /* hits / lookups; 0 without recall */
	uint64_t preemptions;
	/* Disk tier: blocks written to / read back from the spill file, and their modelled time
	   (part of t_transfer) */
	uint64_t disk_blocks_spilled, disk_blocks_fetched;
	double t_disk;
	/* Prefix reuse: input tokens of the requests created (each once, at its first
	   admission), of those the tokens shared from the prefix cache then, and their ratio
	   (0 when nothing was created); prompt tokens whose prefill was computed (each token
	   once, not per layer; full counts recomputed prompts again); bytes of shared prefixes
	   loaded from the host tier (kvt_seq_load_kv; 0 for full, whose cache is HBM). */
	uint64_t prefix_input_tokens, prefix_hit_tokens, prefill_tokens, prefix_bytes_loaded;
	double prefix_hit_rate;
	/* Iteration time split (simulated seconds, summed) */
	double t_gemm, t_attn_decode, t_attn_prefill, t_kv_write, t_overhead, t_transfer, t_cpu;
	/* Window figures (iterations after warmup_iterations): simulated time, decode tokens,
	   batch sizes, blocks loaded, decode-iteration times for TBT */
	double win_time_s;
	uint64_t win_iterations, win_decode_tokens, win_blocks_loaded, win_batch_sum;
	double *win_tbt_s; /* times of the window's iterations that had decode items */
	size_t n_win_tbt;
	double win_ttft_sum_s; /* TTFTs of first tokens produced in the window */
	uint64_t win_ttft_n;
	double wall_s; /* wall-clock time of the run */
	char policy[24], model[SIM_PRESET_NAME_MAX + 1], gpu[SIM_PRESET_NAME_MAX + 1];
};

/*
 * Replays trace t (not modified) under o into *res (released with sim_replay_result_free).
 * Returns 0, or -errno with a message in err: -EINVAL for bad options, found before the first
 * iteration (among them a model element size other than 2 or 4 bytes, and a recall cache too
 * small for one block frame when recall is on), -ENOMEM, or an unexpected library error (a
 * bug: the message names the call).
 */
int sim_replay_run(const struct sim_replay_opts *o, const struct sim_trace *t,
		   struct sim_replay_result *res, char *err, size_t err_len);
void sim_replay_result_free(struct sim_replay_result *res);

/* Header of the per-iteration CSV the engine writes to opts.iter_csv. */
#define SIM_REPLAY_ITER_CSV_HEADER                                                         \
	"iteration,start_s,time_s,batch_size,n_prefill,n_decode,prefill_token_layers,"     \
	"blocks_loaded,recall_lookups,recall_hits,preempted,resumed,queued,gemm_s,attn_s," \
	"transfer_s,cpu_s,kv_write_s,overhead_s\n"

#endif /* SIM_REPLAY_H */
