/* SPDX-License-Identifier: MIT */
/*
 * The execution-time model of the replay simulator (not part of the library): model and GPU
 * presets, and the time of one serving iteration from the work it does. Each class of work is
 * timed at the fraction of the GPU's datasheet peak that profiled kernels reach (the GPU
 * preset's efficiency figures; docs/replay.md cites where the defaults come from):
 *
 *   linear     per layer a token passes: max(its weight bytes / HBM bandwidth, 2 * its params *
 *              tokens / peak FLOP/s) / linear_eff(tokens through the layer); a layer's share
 *              is params / n_layers, so it stands for everything outside attention (norms,
 *              activations, embedding and LM head spread over the layers)
 *   attention  decode: the KV bytes read / (HBM bandwidth * decode_attn_eff), plus
 *              decode_attn_layer_us per layer (its latency floor); prefill: causal FLOPs /
 *              (peak * prefill_attn_eff(x)), x the geometric mean of the queries and the keys
 *              they attend to (the prompt length for a whole prompt), per item
 *              (sim_prefill_attn_s)
 *   KV writes  each token's K and V through each layer it passes / (bandwidth * kv_write_eff)
 *   overhead   iter_overhead_us per iteration that does any work (launches, sampling, inputs)
 *   transfers  the backend's modelled transfer time (not overlapped: conservative)
 *   CPU        the manager's and scheduler's own time, measured by the caller
 */
#ifndef SIM_EXEC_MODEL_H
#define SIM_EXEC_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* The longest model or GPU name a preset keeps: a longer one is refused, never cut. */
#define SIM_PRESET_NAME_MAX 31
/* The longest source line of a GPU preset's efficiency figures. */
#define SIM_PRESET_SOURCE_MAX 95
/* Points of an efficiency curve. */
#define SIM_EFF_POINTS 24

struct sim_model_preset {
	char name[SIM_PRESET_NAME_MAX + 1];
	uint32_t n_layers, n_q_heads, n_kv_heads, head_dim;
	double params;	     /* parameters */
	uint32_t elem_bytes; /* weights and KV element size: 2 (bf16) or 4 (f32) */
	uint32_t max_context;
};

/* A fraction of peak as a function of size x: piecewise linear in log x between the points
   (x ascending, eff in [0.0001, 1]), the end values beyond them. n == 0: 1 everywhere. */
struct sim_eff_curve {
	uint32_t n;
	double x[SIM_EFF_POINTS], eff[SIM_EFF_POINTS];
};

struct sim_gpu_preset {
	char name[SIM_PRESET_NAME_MAX + 1];
	double hbm_gib;	 /* device memory */
	double hbm_gbps; /* HBM bandwidth, GB/s */
	double tflops;	 /* dense 16-bit peak, TFLOP/s */
	double h2d_gbps, d2h_gbps;
	double call_ns, launch_ns; /* one DMA copy call, one kernel launch */
	/* efficiency figures (fractions of the roofline above) */
	struct sim_eff_curve linear_eff;	/* x: tokens through a layer */
	struct sim_eff_curve prefill_attn_eff;	/* x: sqrt(queries * keys attended) */
	double decode_attn_eff;			/* of HBM bandwidth */
	double decode_attn_layer_us;		/* per layer of an iteration with decodes, >= 0 */
	double kv_write_eff;			/* of HBM bandwidth */
	double iter_overhead_us;		/* per iteration, >= 0 */
	char source[SIM_PRESET_SOURCE_MAX + 1]; /* where the efficiency figures come from */
};

/* Presets by name: models llama3-8b, lwm-7b (Llama-2-7B geometry), llama3-70b; GPUs a100-40g,
   a100-80g (PCIe Gen4), h100 (PCIe Gen5), h200. 0 or -ENOENT. */
int sim_preset_model(const char *name, struct sim_model_preset *out);
int sim_preset_gpu(const char *name, struct sim_gpu_preset *out);
/* The names of the GPU presets, NULL-terminated. */
extern const char *const sim_gpu_preset_names[];

/* Whether a GPU preset made otherwise than by sim_preset_load_json (kvtier-bench calibrate)
   keeps the reader's rules, so that a file of it reads back: NULL, else what is wrong with the
   field named in *field. */
const char *sim_gpu_check(const struct sim_gpu_preset *g, const char **field);
/* Sets every efficiency of *g to 1 and its overhead to 0: the bare roofline (an upper bound). */
void sim_gpu_roofline(struct sim_gpu_preset *g);
/* The curve's value at x (x > 0). */
double sim_eff_at(const struct sim_eff_curve *c, double x);
/* Whether a curve is well formed (n <= SIM_EFF_POINTS, x in (0, 1e12] strictly ascending, eff
   in [0.0001, 1]): NULL, else what is wrong. */
const char *sim_eff_check(const struct sim_eff_curve *c);

/*
 * Overrides fields of *m and *g from a JSON file {"model": {...}, "gpu": {...}} whose keys are
 * the struct field names; an efficiency curve is an array of [x, eff] pairs, x ascending
 * (at most SIM_EFF_POINTS; it replaces the preset's curve whole), the other efficiencies
 * numbers in [0.0001, 1] (curve points' x in (0, 1e12]), iter_overhead_us and
 * decode_attn_layer_us in [0, 1e9], source a string; the peaks in [0.001, 1e7] (GB/s,
 * TFLOP/s), call_ns and launch_ns in (0, 1e9], hbm_gib in (0, 1e6], params in (0, 1e15]:
 * bounds that keep every modelled time finite. A leading UTF-8
 * byte-order mark is skipped. Refused, with
 * "FILE:LINE: field 'model.KEY': what" in err (the line of the key): unknown keys, a key twice
 * in one object (at any level), values that are not positive numbers (integers for the u32
 * fields), elem_bytes other than 2 or 4 (the library's bf16 and f32), names longer than
 * SIM_PRESET_NAME_MAX, and n_q_heads not a multiple of n_kv_heads. Returns 0; -EINVAL for
 * content ("FILE:LINE: what" for malformed JSON, "FILE: what" for a top level that is not
 * an object); -errno with "FILE: cannot open: reason" or "FILE: read error: reason" when the
 * file cannot be read; -EFBIG over 1 MiB; -ENOMEM. *m and *g change only on success.
 */
int sim_preset_load_json(const char *path, struct sim_model_preset *m, struct sim_gpu_preset *g,
			 char *err, size_t err_len);

/* The GPU preset as a JSON object of the fields sim_preset_load_json reads in "gpu" (so a
   report's preset can be given back with --preset-json); NULL when out of memory. */
struct json_t;
struct json_t *sim_gpu_preset_json(const struct sim_gpu_preset *g);
/* One line for a summary: the peaks, the efficiency figures' ranges and their source. */
void sim_gpu_preset_line(const struct sim_gpu_preset *g, char *buf, size_t len);

/* KV bytes of one token over all layers (K and V). */
double sim_model_kv_token_bytes(const struct sim_model_preset *m);

/* Work of one iteration. */
struct sim_iter_work {
	uint64_t decode_tokens;	       /* sequences decoding one token */
	uint64_t prefill_token_layers; /* sum over prefill items of L * layers this iteration */
	/* prefill tokens through each of the model's layers this iteration (n_layers entries);
	   NULL: prefill_token_layers spread evenly over the layers */
	const uint64_t *prefill_layer_tokens;
	double prefill_attn_s; /* sum of sim_prefill_attn_s over the prefill items */
	double kv_bytes_read;  /* decode attention reads */
	double transfer_s;     /* modelled transfers */
	double cpu_s;	       /* measured manager + scheduler time */
};

struct sim_iter_time {
	double gemm_s; /* the linear layers (everything outside attention) */
	double attn_decode_s, attn_prefill_s, kv_write_s, overhead_s, transfer_s, cpu_s, total_s;
};

/* Causal prefill attention FLOPs of `layers` layers of a prompt of L tokens. */
double sim_prefill_attn_flops(const struct sim_model_preset *m, uint32_t L, uint32_t layers);
/* Time of `flops` prefill attention FLOPs of `queries` query tokens that attend to up to `keys`
   keys (a chunk of a prompt: its tokens, and the prompt up to the chunk's end). */
double sim_prefill_attn_s(const struct sim_gpu_preset *g, double flops, uint32_t queries,
			  uint32_t keys);
/* The roofline time (no efficiency) of the linear layers of one layer for `tokens` tokens > 0:
   max(its weight bytes / bandwidth, 2 * its parameters * tokens / peak), its parameters
   params / n_layers. */
double sim_linear_roof_s(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
			 double tokens);
/* Time of the linear layers of one layer that `tokens` tokens pass (0 for none). */
double sim_linear_layer_s(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
			  double tokens);

/* The iteration's time. */
void sim_iter_time(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
		   const struct sim_iter_work *w, struct sim_iter_time *out);

#endif /* SIM_EXEC_MODEL_H */
