/* SPDX-License-Identifier: MIT */
/* The simulator's execution-time model: presets and iteration time (exec_model.h). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "exec_model.h"
#include "jsonkey.h"
#include "simutil.h"

/* Public figures: parameters and geometry from the model cards; HBM bandwidth and dense
   16-bit peak from the datasheets (A100-40GB and -80GB SXM, H100 SXM, H200 SXM); PCIe figures
   are what one large pinned copy reaches (Gen4 x16 about 25 GB/s, Gen5 x16 about 53 GB/s). */
static const struct sim_model_preset models[] = {
	{"llama3-8b", 32, 32, 8, 128, 8.03e9, 2, 131072},
	{"lwm-7b", 32, 32, 32, 128, 6.74e9, 2, 1048576},
	{"llama3-70b", 80, 64, 8, 128, 70.6e9, 2, 131072},
};

/* Efficiency figures, fitted to profiled kernels (docs/replay.md, "The execution model", says
   where each comes from and how it was derived; tests/test_exec.c checks the A100 figures
   against the measurements). A100: Vidur's profile of Llama-3-8B on an A100-80GB (linear
   layers, FlashInfer prefill and decode attention), Vidur's model-execution launch time for
   the overhead. H100: Vidur's profile of the Llama-2-7B layer on an H100 for the linear layers;
   the A100's attention figures, prefill scaled to FlashAttention-3's H100 plateau. */
#define A100_EFF                                                                       \
	.linear_eff = {10,                                                             \
		       {1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 16384},            \
		       {0.81, 0.78, 0.70, 0.60, 0.68, 0.76, 0.71, 0.735, 0.77, 0.77}}, \
	.prefill_attn_eff = {6,                                                        \
			     {512, 1024, 2048, 4096, 8192, 16384},                     \
			     {0.143, 0.25, 0.355, 0.455, 0.52, 0.56}},                 \
	.decode_attn_eff = 0.82, .decode_attn_layer_us = 21.5, .kv_write_eff = 0.8,    \
	.iter_overhead_us = 50, .source = "Vidur's A100-80GB profile of Llama-3-8B"
#define H100_EFF                                                                      \
	.linear_eff = {10,                                                            \
		       {1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 16384},           \
		       {0.79, 0.77, 0.76, 0.70, 0.49, 0.64, 0.73, 0.76, 0.74, 0.74}}, \
	.prefill_attn_eff = {6,                                                       \
			     {512, 1024, 2048, 4096, 8192, 16384},                    \
			     {0.159, 0.278, 0.395, 0.506, 0.578, 0.623}},             \
	.decode_attn_eff = 0.82, .decode_attn_layer_us = 21.5, .kv_write_eff = 0.8,   \
	.iter_overhead_us = 50,                                                       \
	.source = "Vidur's H100 linear-layer profile; attention derived from A100, FA3"

static const struct sim_gpu_preset gpus[] = {
	{"a100-40g", 40.0, 1555.0, 312.0, 25.0, 25.0, 2000.0, 5000.0, A100_EFF},
	{"a100-80g", 80.0, 2039.0, 312.0, 25.0, 25.0, 2000.0, 5000.0, A100_EFF},
	{"h100", 80.0, 3350.0, 989.0, 53.0, 53.0, 2000.0, 5000.0, H100_EFF},
	{"h200", 131.3, 4800.0, 989.0, 53.0, 53.0, 2000.0, 5000.0, H100_EFF},
};

const char *const sim_gpu_preset_names[] = {"h100", "h200", "a100-80g", "a100-40g", NULL};

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

/* The bounds of the GPU figures: wide enough for any real GPU, narrow enough that no time
   the model computes from them overflows, and that call_ns and launch_ns fit the library's
   32-bit nanoseconds. */
#define EFF_MIN 1e-4 /* a class of work at a ten-thousandth of its roofline */
#define RATE_MIN 1e-3
#define RATE_MAX 1e7 /* GB/s, TFLOP/s */
#define NS_MAX 1e9   /* one second a call */
#define US_MAX 1e9   /* overheads: 1,000 s */
#define GIB_MAX 1e6
#define PARAMS_MAX 1e15

/* Whether d is a finite number in [lo, hi], lo excluded when lo_open. */
static bool in_range(double d, double lo, bool lo_open, double hi)
{
	return isfinite(d) && d <= hi && d >= lo && !(lo_open && d == lo);
}

/* A number in [lo, hi] (lo excluded when lo_open); what is wrong is `want`. */
static const char *set_range(double *dst, const json_t *v, double lo, bool lo_open, double hi,
			     const char *want)
{
	double d = json_is_number(v) ? json_number_value(v) : NAN;

	if (!in_range(d, lo, lo_open, hi))
		return want;
	*dst = d;
	return NULL;
}

/* The GPU preset's numbers, their bounds and what a refusal says: the reader's rules
   (load_gpu) and the check of a preset made otherwise (sim_gpu_check). */
static const struct gpu_num {
	const char *key;
	size_t off;
	double lo, hi;
	bool lo_open;
	const char *want;
} gpu_nums[] = {
#define GPU_NUM(k, lo, hi, open, want)                                     \
	{                                                                  \
#k, offsetof(struct sim_gpu_preset, k), lo, hi, open, want \
	}
	GPU_NUM(hbm_gib, 0, GIB_MAX, true, "not a number in (0, 1e6]"),
	GPU_NUM(hbm_gbps, RATE_MIN, RATE_MAX, false, "not a number in [0.001, 1e7]"),
	GPU_NUM(tflops, RATE_MIN, RATE_MAX, false, "not a number in [0.001, 1e7]"),
	GPU_NUM(h2d_gbps, RATE_MIN, RATE_MAX, false, "not a number in [0.001, 1e7]"),
	GPU_NUM(d2h_gbps, RATE_MIN, RATE_MAX, false, "not a number in [0.001, 1e7]"),
	GPU_NUM(call_ns, 0, NS_MAX, true, "not a number in (0, 1e9]"),
	GPU_NUM(launch_ns, 0, NS_MAX, true, "not a number in (0, 1e9]"),
	GPU_NUM(decode_attn_eff, EFF_MIN, 1, false, "not a number in [0.0001, 1]"),
	GPU_NUM(kv_write_eff, EFF_MIN, 1, false, "not a number in [0.0001, 1]"),
	GPU_NUM(iter_overhead_us, 0, US_MAX, false, "not a number in [0, 1e9]"),
	GPU_NUM(decode_attn_layer_us, 0, US_MAX, false, "not a number in [0, 1e9]"),
#undef GPU_NUM
};

/* What is wrong with a field: NULL when it was taken. */
static const char *set_u32(uint32_t *dst, const json_t *v)
{
	double d = num(v);

	if (isnan(d) || d != floor(d) || d > UINT32_MAX)
		return "not a positive integer";
	*dst = (uint32_t)d;
	return NULL;
}

#define STR_(x) #x
#define STR(x) STR_(x)

/* A string of at most `max` characters into dst (max + 1 bytes), kept whole or refused: a cut
   name would name another model or GPU. */
static const char *set_text(char *dst, size_t max, const json_t *v, const char *too_long)
{
	if (!json_is_string(v))
		return "not a string";
	if (json_string_length(v) > max)
		return too_long;
	memcpy(dst, json_string_value(v), json_string_length(v) + 1);
	return NULL;
}

static const char *set_name(char *dst, const json_t *v)
{
	return set_text(dst, SIM_PRESET_NAME_MAX, v,
			"longer than " STR(SIM_PRESET_NAME_MAX) " characters");
}

/* The replay engine gives the library bf16 for 2-byte elements and f32 for 4-byte ones (it
   stores no other size); any other would be timed as itself but stored as bf16. */
static const char *set_elem_bytes(uint32_t *dst, const json_t *v)
{
	uint32_t e = 0;

	if (set_u32(&e, v) || (e != 2 && e != 4))
		return "must be 2 (bf16) or 4 (f32)";
	*dst = e;
	return NULL;
}

/* A refused field: its key in the "model" or "gpu" object and what is wrong. */
struct field_err {
	const char *key;
	char what[64];
};

/* Fills *e for key k from set_*'s answer w (NULL: taken); -1 when refused, else 0. */
static int check_field(struct field_err *e, const char *k, const char *w)
{
	if (!w)
		return 0;
	e->key = k;
	snprintf(e->what, sizeof(e->what), "%s", w);
	return -1;
}

/* Fields of the "model" object into *m: 0, or -1 with the refused field in *e. */
static int load_model(json_t *o, struct sim_model_preset *m, struct field_err *e)
{
	const char *k, *w;
	json_t *v;

	json_object_foreach(o, k, v)
	{
		if (!strcmp(k, "name"))
			w = set_name(m->name, v);
		else if (!strcmp(k, "n_layers"))
			w = set_u32(&m->n_layers, v);
		else if (!strcmp(k, "n_q_heads"))
			w = set_u32(&m->n_q_heads, v);
		else if (!strcmp(k, "n_kv_heads"))
			w = set_u32(&m->n_kv_heads, v);
		else if (!strcmp(k, "head_dim"))
			w = set_u32(&m->head_dim, v);
		else if (!strcmp(k, "params"))
			w = set_range(&m->params, v, 0, true, PARAMS_MAX,
				      "not a number in (0, 1e15]");
		else if (!strcmp(k, "elem_bytes"))
			w = set_elem_bytes(&m->elem_bytes, v);
		else if (!strcmp(k, "max_context"))
			w = set_u32(&m->max_context, v);
		else
			w = "unknown field";
		if (check_field(e, k, w))
			return -1;
	}
	if (m->n_q_heads % m->n_kv_heads == 0)
		return 0;
	/* name the one the file sets, n_q_heads when it sets both */
	if (json_object_get(o, "n_q_heads")) {
		e->key = "n_q_heads";
		snprintf(e->what, sizeof(e->what), "not a multiple of n_kv_heads (%u)",
			 m->n_kv_heads);
	} else {
		e->key = "n_kv_heads";
		snprintf(e->what, sizeof(e->what), "n_q_heads (%u) is not a multiple of it",
			 m->n_q_heads);
	}
	return -1;
}

/* A curve from [[x, eff], ...]; what is wrong goes to buf. */
static const char *set_curve(struct sim_eff_curve *dst, const json_t *v, char *buf, size_t len)
{
	struct sim_eff_curve c = {0};
	const char *w;
	size_t i;
	json_t *p;

	if (!json_is_array(v) || json_array_size(v) == 0)
		return "not an array of [x, eff] pairs";
	if (json_array_size(v) > SIM_EFF_POINTS)
		return "more than " STR(SIM_EFF_POINTS) " points";
	json_array_foreach(v, i, p)
	{
		if (!json_is_array(p) || json_array_size(p) != 2) {
			snprintf(buf, len, "point %zu is not an [x, eff] pair", i + 1);
			return buf;
		}
		c.x[i] = num(json_array_get(p, 0));
		c.eff[i] = num(json_array_get(p, 1));
		c.n++;
	}
	w = sim_eff_check(&c);
	if (w)
		return w;
	*dst = c;
	return NULL;
}

/* Fields of the "gpu" object into *g: 0, or -1 with the refused field in *e. */
static int load_gpu(json_t *o, struct sim_gpu_preset *g, struct field_err *e)
{
	char buf[64];
	const char *k, *w;
	json_t *v;

	json_object_foreach(o, k, v)
	{
		w = "unknown field";
		if (!strcmp(k, "name"))
			w = set_name(g->name, v);
		else if (!strcmp(k, "source"))
			w = set_text(g->source, SIM_PRESET_SOURCE_MAX, v,
				     "longer than " STR(SIM_PRESET_SOURCE_MAX) " characters");
		else if (!strcmp(k, "linear_eff"))
			w = set_curve(&g->linear_eff, v, buf, sizeof(buf));
		else if (!strcmp(k, "prefill_attn_eff"))
			w = set_curve(&g->prefill_attn_eff, v, buf, sizeof(buf));
		for (size_t i = 0; i < sizeof(gpu_nums) / sizeof(gpu_nums[0]); i++) {
			const struct gpu_num *f = &gpu_nums[i];

			if (!strcmp(k, f->key))
				w = set_range((double *)((char *)g + f->off), v, f->lo, f->lo_open,
					      f->hi, f->want);
		}
		if (check_field(e, k, w))
			return -1;
	}
	return 0;
}

/* Preset files are a few hundred bytes; this bounds what a wrong path makes us read. */
#define PRESET_MAX_BYTES (1u << 20)

/* The file whole into a new NUL-terminated *buf of *n bytes: 0, or -errno with the message
   in err. */
static int read_whole(const char *path, char **buf, size_t *n, char *err, size_t err_len)
{
	FILE *f = fopen(path, "rb");
	char *b = NULL;
	size_t got = 0;
	int rc = 0;

	if (!f) {
		rc = -errno;
		snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
		return rc;
	}
	b = malloc(PRESET_MAX_BYTES + 1);
	if (!b) {
		snprintf(err, err_len, "%s: out of memory", path);
		rc = -ENOMEM;
		goto out;
	}
	got = fread(b, 1, PRESET_MAX_BYTES + 1, f);
	if (ferror(f)) {
		rc = errno ? -errno : -EIO;
		snprintf(err, err_len, "%s: read error: %s", path, strerror(-rc));
		goto out;
	}
	if (got > PRESET_MAX_BYTES) {
		snprintf(err, err_len, "%s: larger than %u bytes: not a preset file", path,
			 PRESET_MAX_BYTES);
		rc = -EFBIG;
		goto out;
	}
	b[got] = '\0';
	*buf = b;
	*n = got;
	b = NULL;
out:
	free(b);
	fclose(f);
	return rc;
}

int sim_preset_load_json(const char *path, struct sim_model_preset *m, struct sim_gpu_preset *g,
			 char *err, size_t err_len)
{
	struct sim_model_preset m2 = *m;
	struct sim_gpu_preset g2 = *g;
	struct field_err fe = {0};
	const char *k = NULL, *s;
	char *buf = NULL, name[96];
	json_t *root = NULL, *v;
	json_error_t je;
	unsigned line;
	size_t n = 0;
	int rc;

	rc = read_whole(path, &buf, &n, err, err_len);
	if (rc)
		return rc;
	s = buf;
	if (n >= SIM_UTF8_BOM_LEN && !memcmp(s, SIM_UTF8_BOM, SIM_UTF8_BOM_LEN)) {
		s += SIM_UTF8_BOM_LEN;
		n -= SIM_UTF8_BOM_LEN;
	}
	rc = -EINVAL;
	root = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		if (json_error_code(&je) == json_error_duplicate_key &&
		    !sim_json_key_at(s, n, (size_t)je.position, name, sizeof(name), &line))
			snprintf(err, err_len, "%s:%u: field '%s': duplicate key", path, line,
				 name);
		else if (je.line > 0)
			snprintf(err, err_len, "%s:%d: %s", path, je.line, je.text);
		else
			snprintf(err, err_len, "%s: %s", path, je.text);
		goto out;
	}
	if (!json_is_object(root)) {
		snprintf(err, err_len, "%s: the top level must be an object", path);
		goto out;
	}
	json_object_foreach(root, k, v)
	{
		int bad;

		if (!strcmp(k, "model") && json_is_object(v))
			bad = load_model(v, &m2, &fe);
		else if (!strcmp(k, "gpu") && json_is_object(v))
			bad = load_gpu(v, &g2, &fe);
		else
			bad = check_field(&fe, NULL, "expected \"model\" or \"gpu\" objects");
		if (bad) {
			/* the line of the field, else of its object's key */
			line = fe.key ? sim_json_key_line(s, n, k, fe.key) : 0;
			if (!line)
				line = sim_json_key_line(s, n, k, NULL);
			snprintf(name, sizeof(name), "%s%s%s", k, fe.key ? "." : "",
				 fe.key ? fe.key : "");
			if (line)
				snprintf(err, err_len, "%s:%u: field '%s': %s", path, line, name,
					 fe.what);
			else /* not found: no line rather than a wrong one */
				snprintf(err, err_len, "%s: field '%s': %s", path, name, fe.what);
			goto out;
		}
	}
	*m = m2;
	*g = g2;
	rc = 0;
out:
	json_decref(root);
	free(buf);
	return rc;
}

static json_t *curve_json(const struct sim_eff_curve *c)
{
	json_t *a = json_array();

	for (uint32_t i = 0; a && i < c->n; i++)
		if (json_array_append_new(a, json_pack("[f, f]", c->x[i], c->eff[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

json_t *sim_gpu_preset_json(const struct sim_gpu_preset *g)
{
	json_t *o = json_pack("{s:s, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:s}",
			      "name", g->name, "hbm_gib", g->hbm_gib, "hbm_gbps", g->hbm_gbps,
			      "tflops", g->tflops, "h2d_gbps", g->h2d_gbps, "d2h_gbps", g->d2h_gbps,
			      "call_ns", g->call_ns, "launch_ns", g->launch_ns, "decode_attn_eff",
			      g->decode_attn_eff, "decode_attn_layer_us", g->decode_attn_layer_us,
			      "kv_write_eff", g->kv_write_eff, "iter_overhead_us",
			      g->iter_overhead_us, "source", g->source);
	json_t *a, *b;

	if (!o)
		return NULL;
	/* an empty curve (1 everywhere) is written as one point: the reader wants a point */
	struct sim_eff_curve one = {1, {1}, {1}};
	a = curve_json(g->linear_eff.n ? &g->linear_eff : &one);
	b = curve_json(g->prefill_attn_eff.n ? &g->prefill_attn_eff : &one);
	if (!a || !b || json_object_set_new(o, "linear_eff", a) ||
	    json_object_set_new(o, "prefill_attn_eff", b)) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* Lowest and highest value of a curve. */
static void curve_range(const struct sim_eff_curve *c, double *lo, double *hi)
{
	*lo = *hi = c->n ? c->eff[0] : 1.0;
	for (uint32_t i = 1; i < c->n; i++) {
		*lo = c->eff[i] < *lo ? c->eff[i] : *lo;
		*hi = c->eff[i] > *hi ? c->eff[i] : *hi;
	}
}

void sim_gpu_preset_line(const struct sim_gpu_preset *g, char *buf, size_t len)
{
	double l0, l1, p0, p1;

	curve_range(&g->linear_eff, &l0, &l1);
	curve_range(&g->prefill_attn_eff, &p0, &p1);
	snprintf(buf, len,
		 "%s: %.0f TFLOP/s, %.0f GB/s; efficiency linear %.2f-%.2f, attention decode "
		 "%.2f + %.1f us/layer, prefill %.2f-%.2f, KV write %.2f, %.0f us/iteration (%s)",
		 g->name, g->tflops, g->hbm_gbps, l0, l1, g->decode_attn_eff,
		 g->decode_attn_layer_us, p0, p1, g->kv_write_eff, g->iter_overhead_us, g->source);
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

double sim_eff_at(const struct sim_eff_curve *c, double x)
{
	uint32_t i = 1;
	double f, r;

	if (c->n == 0)
		return 1.0;
	if (x <= c->x[0])
		return c->eff[0];
	if (x >= c->x[c->n - 1])
		return c->eff[c->n - 1];
	while (c->x[i] < x)
		i++;
	/* the ratio keeps close points apart; for points whose ratio overflows (x from 1e-300
	   to 1e12, say: sim_eff_check accepts them) the logs apart are exact enough */
	r = c->x[i] / c->x[i - 1];
	if (isfinite(r))
		f = log(x / c->x[i - 1]) / log(r);
	else
		f = (log(x) - log(c->x[i - 1])) / (log(c->x[i]) - log(c->x[i - 1]));
	return c->eff[i - 1] + f * (c->eff[i] - c->eff[i - 1]);
}

const char *sim_eff_check(const struct sim_eff_curve *c)
{
	if (c->n > SIM_EFF_POINTS)
		return "too many points";
	for (uint32_t i = 0; i < c->n; i++) {
		if (!(c->x[i] > 0) || !(c->x[i] <= 1e12))
			return "x must be a number in (0, 1e12]";
		if (i && !(c->x[i] > c->x[i - 1]))
			return "x must be strictly ascending";
		if (!(c->eff[i] >= EFF_MIN && c->eff[i] <= 1))
			return "eff must be a number in [0.0001, 1]";
	}
	return NULL;
}

const char *sim_gpu_check(const struct sim_gpu_preset *g, const char **field)
{
	const char *w;

	for (size_t i = 0; i < sizeof(gpu_nums) / sizeof(gpu_nums[0]); i++) {
		const struct gpu_num *f = &gpu_nums[i];

		*field = f->key;
		if (!in_range(*(const double *)((const char *)g + f->off), f->lo, f->lo_open,
			      f->hi))
			return f->want;
	}
	*field = "linear_eff";
	if ((w = sim_eff_check(&g->linear_eff)))
		return w;
	*field = "prefill_attn_eff";
	if ((w = sim_eff_check(&g->prefill_attn_eff)))
		return w;
	*field = NULL;
	return NULL;
}

void sim_gpu_roofline(struct sim_gpu_preset *g)
{
	g->linear_eff.n = 0;
	g->prefill_attn_eff.n = 0;
	g->decode_attn_eff = 1;
	g->decode_attn_layer_us = 0;
	g->kv_write_eff = 1;
	g->iter_overhead_us = 0;
	snprintf(g->source, sizeof(g->source), "none: the bare roofline (--roofline)");
}

double sim_prefill_attn_s(const struct sim_gpu_preset *g, double flops, uint32_t queries,
			  uint32_t keys)
{
	double x = sqrt((double)queries * keys);

	return flops <= 0 ? 0.0
			  : flops / (g->tflops * 1e12 *
				     sim_eff_at(&g->prefill_attn_eff, x > 1 ? x : 1));
}

double sim_linear_roof_s(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
			 double tokens)
{
	double p = m->params / m->n_layers;
	double t_mem = p * m->elem_bytes / (g->hbm_gbps * 1e9);
	double t_flop = 2.0 * p * tokens / (g->tflops * 1e12);

	return t_mem > t_flop ? t_mem : t_flop;
}

double sim_linear_layer_s(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
			  double tokens)
{
	if (tokens <= 0)
		return 0.0;
	return sim_linear_roof_s(m, g, tokens) / sim_eff_at(&g->linear_eff, tokens);
}

void sim_iter_time(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
		   const struct sim_iter_work *w, struct sim_iter_time *out)
{
	double bw = g->hbm_gbps * 1e9, dec = (double)w->decode_tokens, through = 0;
	double kv_layer_bytes = sim_model_kv_token_bytes(m) / m->n_layers;

	out->gemm_s = 0;
	if (w->prefill_layer_tokens) {
		/* layers with the same tokens cost the same: a layer-segmented prefill covers
		   ranges of layers, so runs of equal counts are timed once */
		for (uint32_t l = 0; l < m->n_layers;) {
			uint64_t t = w->prefill_layer_tokens[l];
			uint32_t e = l + 1;

			while (e < m->n_layers && w->prefill_layer_tokens[e] == t)
				e++;
			out->gemm_s += (e - l) * sim_linear_layer_s(m, g, dec + (double)t);
			through += (e - l) * (dec + (double)t);
			l = e;
		}
	} else {
		double t = dec + (double)w->prefill_token_layers / m->n_layers;

		out->gemm_s = m->n_layers * sim_linear_layer_s(m, g, t);
		through = m->n_layers * t;
	}
	out->attn_decode_s = w->kv_bytes_read / (bw * g->decode_attn_eff) +
			     (dec > 0 ? m->n_layers * g->decode_attn_layer_us * 1e-6 : 0.0);
	out->attn_prefill_s = w->prefill_attn_s;
	out->kv_write_s = through * kv_layer_bytes / (bw * g->kv_write_eff);
	out->overhead_s = through > 0 ? g->iter_overhead_us * 1e-6 : 0.0;
	out->transfer_s = w->transfer_s;
	out->cpu_s = w->cpu_s;
	out->total_s = out->gemm_s + out->attn_decode_s + out->attn_prefill_s + out->kv_write_s +
		       out->overhead_s + out->transfer_s + out->cpu_s;
}
