/* SPDX-License-Identifier: MIT */
/*
 * The execution-time model of the replay simulator (not part of the library): model and GPU
 * presets, and the time of one serving iteration from the work it does.
 *
 * Per iteration:
 *   GEMM       roofline: max(weight bytes / HBM bandwidth, 2 * params * tokens / peak FLOPs),
 *              weights read once per iteration; tokens = decode tokens + prefill tokens, a
 *              prefilled layer of L tokens counting L / n_layers tokens of the whole model
 *   attention  decode: the KV bytes actually read / HBM bandwidth (resident + recalled frames,
 *              or the full cache for dense attention); prefill: causal attention FLOPs,
 *              4 * L^2 / 2 * n_q_heads * head_dim per layer, / peak FLOPs
 *   transfers  the backend's modelled transfer time (not overlapped: conservative)
 *   CPU        the manager's and scheduler's own time, measured by the caller
 */
#ifndef SIM_EXEC_MODEL_H
#define SIM_EXEC_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* The longest model or GPU name a preset keeps: a longer one is refused, never cut. */
#define SIM_PRESET_NAME_MAX 31

struct sim_model_preset {
	char name[SIM_PRESET_NAME_MAX + 1];
	uint32_t n_layers, n_q_heads, n_kv_heads, head_dim;
	double params;	     /* parameters */
	uint32_t elem_bytes; /* weights and KV element size: 2 (bf16) or 4 (f32) */
	uint32_t max_context;
};

struct sim_gpu_preset {
	char name[SIM_PRESET_NAME_MAX + 1];
	double hbm_gib;	 /* device memory */
	double hbm_gbps; /* HBM bandwidth, GB/s */
	double tflops;	 /* dense 16-bit peak, TFLOP/s */
	double h2d_gbps, d2h_gbps;
	double call_ns, launch_ns; /* one DMA copy call, one kernel launch */
};

/* Presets by name: models llama3-8b, lwm-7b (Llama-2-7B geometry), llama3-70b; GPUs a100-40g
   (PCIe Gen4), h100 (PCIe Gen5), h200. 0 or -ENOENT. */
int sim_preset_model(const char *name, struct sim_model_preset *out);
int sim_preset_gpu(const char *name, struct sim_gpu_preset *out);

/*
 * Overrides fields of *m and *g from a JSON file {"model": {...}, "gpu": {...}} whose keys are
 * the struct field names. A leading UTF-8 byte-order mark is skipped. Refused, with
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

/* KV bytes of one token over all layers (K and V). */
double sim_model_kv_token_bytes(const struct sim_model_preset *m);

/* Work of one iteration. */
struct sim_iter_work {
	uint64_t decode_tokens;	       /* sequences decoding one token */
	uint64_t prefill_token_layers; /* sum over prefill items of L * layers this iteration */
	double prefill_attn_flops;     /* from sim_prefill_attn_flops per item */
	double kv_bytes_read;	       /* decode attention reads */
	double transfer_s;	       /* modelled transfers */
	double cpu_s;		       /* measured manager + scheduler time */
};

struct sim_iter_time {
	double gemm_s, attn_decode_s, attn_prefill_s, transfer_s, cpu_s, total_s;
};

/* Causal prefill attention FLOPs of `layers` layers of a prompt of L tokens. */
double sim_prefill_attn_flops(const struct sim_model_preset *m, uint32_t L, uint32_t layers);

/* The iteration's time. */
void sim_iter_time(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
		   const struct sim_iter_work *w, struct sim_iter_time *out);

#endif /* SIM_EXEC_MODEL_H */
