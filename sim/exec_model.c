/* SPDX-License-Identifier: MIT */
/* The simulator's execution-time model: presets and iteration time (exec_model.h). */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "exec_model.h"

/* Public figures: parameters and geometry from the model cards; HBM bandwidth and dense
   16-bit peak from the datasheets (A100-40GB SXM, H100 SXM, H200 SXM); PCIe figures are what
   one large pinned copy reaches (Gen4 x16 about 25 GB/s, Gen5 x16 about 53 GB/s). */
static const struct sim_model_preset models[] = {
	{"llama3-8b", 32, 32, 8, 128, 8.03e9, 2, 131072},
	{"lwm-7b", 32, 32, 32, 128, 6.74e9, 2, 1048576},
	{"llama3-70b", 80, 64, 8, 128, 70.6e9, 2, 131072},
};

static const struct sim_gpu_preset gpus[] = {
	{"a100-40g", 40.0, 1555.0, 312.0, 25.0, 25.0, 2000.0, 5000.0},
	{"h100", 80.0, 3350.0, 989.0, 53.0, 53.0, 2000.0, 5000.0},
	{"h200", 131.3, 4800.0, 989.0, 53.0, 53.0, 2000.0, 5000.0},
};

int sim_preset_model(const char *name, struct sim_model_preset *out)
{
	for (size_t i = 0; name && i < sizeof(models) / sizeof(models[0]); i++)
		if (strcmp(name, models[i].name) == 0) {
			*out = models[i];
			return 0;
		}
	return -ENOENT;
}

int sim_preset_gpu(const char *name, struct sim_gpu_preset *out)
{
	for (size_t i = 0; name && i < sizeof(gpus) / sizeof(gpus[0]); i++)
		if (strcmp(name, gpus[i].name) == 0) {
			*out = gpus[i];
			return 0;
		}
	return -ENOENT;
}

/* A positive finite number of a JSON value, or NaN. */
static double num(const json_t *v)
{
	double d = json_is_number(v) ? json_number_value(v) : NAN;

	return isfinite(d) && d > 0 ? d : NAN;
}

static int set_u32(uint32_t *dst, const json_t *v)
{
	double d = num(v);

	if (isnan(d) || d != floor(d) || d > UINT32_MAX)
		return -1;
	*dst = (uint32_t)d;
	return 0;
}

static int set_dbl(double *dst, const json_t *v)
{
	double d = num(v);

	if (isnan(d))
		return -1;
	*dst = d;
	return 0;
}

static int load_model(json_t *o, struct sim_model_preset *m, const char **bad)
{
	const char *k;
	json_t *v;

	json_object_foreach(o, k, v)
	{
		int r = -2;

		if (!strcmp(k, "name"))
			r = json_is_string(v) ? (snprintf(m->name, sizeof(m->name), "%s",
							  json_string_value(v)),
						 0)
					      : -1;
		else if (!strcmp(k, "n_layers"))
			r = set_u32(&m->n_layers, v);
		else if (!strcmp(k, "n_q_heads"))
			r = set_u32(&m->n_q_heads, v);
		else if (!strcmp(k, "n_kv_heads"))
			r = set_u32(&m->n_kv_heads, v);
		else if (!strcmp(k, "head_dim"))
			r = set_u32(&m->head_dim, v);
		else if (!strcmp(k, "params"))
			r = set_dbl(&m->params, v);
		else if (!strcmp(k, "elem_bytes"))
			r = set_u32(&m->elem_bytes, v);
		else if (!strcmp(k, "max_context"))
			r = set_u32(&m->max_context, v);
		if (r) {
			*bad = k;
			return r;
		}
	}
	if (m->n_q_heads % m->n_kv_heads) {
		*bad = "n_q_heads";
		return -4;
	}
	return 0;
}

static int load_gpu(json_t *o, struct sim_gpu_preset *g, const char **bad)
{
	static const struct {
		const char *key;
		size_t off;
	} f[] = {
		{"hbm_gib", offsetof(struct sim_gpu_preset, hbm_gib)},
		{"hbm_gbps", offsetof(struct sim_gpu_preset, hbm_gbps)},
		{"tflops", offsetof(struct sim_gpu_preset, tflops)},
		{"h2d_gbps", offsetof(struct sim_gpu_preset, h2d_gbps)},
		{"d2h_gbps", offsetof(struct sim_gpu_preset, d2h_gbps)},
		{"call_ns", offsetof(struct sim_gpu_preset, call_ns)},
		{"launch_ns", offsetof(struct sim_gpu_preset, launch_ns)},
	};
	const char *k;
	json_t *v;

	json_object_foreach(o, k, v)
	{
		int r = -2;

		if (!strcmp(k, "name")) {
			r = json_is_string(v) ? 0 : -1;
			if (!r)
				snprintf(g->name, sizeof(g->name), "%s", json_string_value(v));
		}
		for (size_t i = 0; r == -2 && i < sizeof(f) / sizeof(f[0]); i++)
			if (!strcmp(k, f[i].key))
				r = set_dbl((double *)((char *)g + f[i].off), v);
		if (r) {
			*bad = k;
			return r;
		}
	}
	return 0;
}

int sim_preset_load_json(const char *path, struct sim_model_preset *m, struct sim_gpu_preset *g,
			 char *err, size_t err_len)
{
	struct sim_model_preset m2 = *m;
	struct sim_gpu_preset g2 = *g;
	json_error_t je;
	const char *k, *bad = NULL;
	json_t *root, *v;
	int r = 0;

	root = json_load_file(path, 0, &je);
	if (!root) {
		snprintf(err, err_len, "%s:%d: %s", path, je.line, je.text);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		snprintf(err, err_len, "%s: the top level must be an object", path);
		json_decref(root);
		return -EINVAL;
	}
	json_object_foreach(root, k, v)
	{
		if (!strcmp(k, "model") && json_is_object(v))
			r = load_model(v, &m2, &bad);
		else if (!strcmp(k, "gpu") && json_is_object(v))
			r = load_gpu(v, &g2, &bad);
		else
			r = -3;
		if (r) {
			if (r == -3)
				snprintf(err, err_len,
					 "%s: key '%s': expected \"model\" or \"gpu\" objects",
					 path, k);
			else
				snprintf(err, err_len, "%s: %s.%s: %s", path, k, bad,
					 r == -2   ? "unknown field"
					 : r == -4 ? "not a multiple of n_kv_heads"
						   : "not a positive number");
			json_decref(root);
			return -EINVAL;
		}
	}
	json_decref(root);
	*m = m2;
	*g = g2;
	return 0;
}

double sim_model_kv_token_bytes(const struct sim_model_preset *m)
{
	return 2.0 * m->n_layers * m->n_kv_heads * m->head_dim * m->elem_bytes;
}

double sim_prefill_attn_flops(const struct sim_model_preset *m, uint32_t L, uint32_t layers)
{
	/* QK^T and PV, 2 FLOPs a multiply-add each, causal: L^2 / 2 pairs */
	return 4.0 * ((double)L * L / 2.0) * m->n_q_heads * m->head_dim * layers;
}

void sim_iter_time(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
		   const struct sim_iter_work *w, struct sim_iter_time *out)
{
	double bw = g->hbm_gbps * 1e9, peak = g->tflops * 1e12;
	double tokens = (double)w->decode_tokens + (double)w->prefill_token_layers / m->n_layers;
	double wbytes = m->params * m->elem_bytes;
	double t_mem = tokens > 0 ? wbytes / bw : 0.0, t_flop = 2.0 * m->params * tokens / peak;

	out->gemm_s = t_mem > t_flop ? t_mem : t_flop;
	out->attn_decode_s = w->kv_bytes_read / bw;
	out->attn_prefill_s = w->prefill_attn_flops / peak;
	out->transfer_s = w->transfer_s;
	out->cpu_s = w->cpu_s;
	out->total_s = out->gemm_s + out->attn_decode_s + out->attn_prefill_s + out->transfer_s +
		       out->cpu_s;
}
