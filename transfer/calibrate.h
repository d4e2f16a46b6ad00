/* SPDX-License-Identifier: MIT */
/*
 * The measurements of `kvtier-bench calibrate`: what the CUDA plugin times on the GPU for the
 * replay simulator's execution model (struct kvt_plugin.calibrate, transfer/cuda_calib.c), in
 * plain C, so that kvtier-bench and the conversion into a GPU preset (sim/calib.c) use them
 * without CUDA's headers. Not the backend's own transfer calibration (struct kvt_cuda_calib).
 *
 * Every time is the median of `reps` runs after one warm-up, timed by CUDA events around the
 * work on one stream (host times: the host clock around the calls), in seconds.
 */
#ifndef KVT_CALIBRATE_H
#define KVT_CALIBRATE_H

#include <stdint.h>

/* Entries of each list of a request (and points of each curve made from them). */
#define KVT_CALIB_POINTS 24
/* (batch, context) pairs of decode attention: every batch with every context. */
#define KVT_CALIB_DECODE_MAX (KVT_CALIB_POINTS * KVT_CALIB_POINTS)
/* Only the device's name and memory (kvt_calib_result.device, mem_bytes): nothing is timed. */
#define KVT_CALIB_DEVICE_ONLY 1u

/* What to measure. Lists are strictly ascending, n of them in use. Every matrix is bf16 with
   fp32 accumulation (cuBLAS's CUBLAS_COMPUTE_32F, default algorithm). */
struct kvt_calib_request {
	uint32_t size;	/* sizeof(struct kvt_calib_request) */
	uint32_t flags; /* KVT_CALIB_DEVICE_ONLY, or 0 */
	uint32_t reps;	/* timed runs per point, >= 1 */
	/* One layer of the model: hidden = n_q_heads * head_dim; mlp_dim: I of the gate+up
	   [hidden x 2I] and down [I x hidden] projections. */
	uint32_t hidden, n_q_heads, n_kv_heads, head_dim, mlp_dim;
	/* Linear layers: QKV, O, gate+up and down of one layer for M tokens, timed together. */
	uint32_t n_tokens, tokens[KVT_CALIB_POINTS];
	/* Decode attention of one layer for every (batch, context) pair. */
	uint32_t n_batch, batch[KVT_CALIB_POINTS];
	uint32_t n_context, context[KVT_CALIB_POINTS];
	/* Prefill attention of one layer for prompts of L tokens (non-causal). */
	uint32_t n_prefill, prefill[KVT_CALIB_POINTS];
	uint64_t copy_bytes; /* each pinned host <-> device copy */
	uint64_t d2d_bytes;  /* the device-to-device copy */
	/* Device bytes one point may allocate; a point that needs more is skipped (not in the
	   result). 0: half the device's free memory when the run starts. */
	uint64_t mem_cap;
};

/* One measured point of a curve: its size (tokens M, or prompt length L) and its time. */
struct kvt_calib_point {
	double x, seconds;
};

/* One layer's decode attention for `batch` sequences of `context` tokens. */
struct kvt_calib_decode {
	uint32_t batch, context;
	double seconds;
	double kv_bytes; /* K and V read: 2 * batch * context * n_kv_heads * head_dim * 2 */
};

/* What was measured. The points of the request that fit the memory cap, in its order. */
struct kvt_calib_result {
	char device[256];
	double mem_bytes; /* the device's memory */
	uint64_t mem_cap; /* the cap used (the request's, or the one chosen) */
	/* One layer's QKV, O, gate+up and down GEMMs for M = x tokens. */
	uint32_t n_linear;
	struct kvt_calib_point linear[KVT_CALIB_POINTS];
	/* One layer's S = Q K^T then O = P V over every query head, x = L, non-causal (every
	   query against every key); softmax is not timed. */
	uint32_t n_prefill;
	struct kvt_calib_point prefill[KVT_CALIB_POINTS];
	/* S = Q K^T and O = P V per (sequence, kv head), softmax not timed. */
	uint32_t n_decode;
	struct kvt_calib_decode decode[KVT_CALIB_DECODE_MAX];
	double h2d_gbps, d2h_gbps;     /* pinned copies of copy_bytes, 1e9 bytes/s */
	double call_ns;		       /* host time of one cudaMemcpyAsync of 16 KiB */
	double launch_ns;	       /* host time of one empty kernel launch */
	double d2d_bytes, d2d_seconds; /* one device-to-device copy (reads and writes it) */
};

#endif /* KVT_CALIBRATE_H */
