/* SPDX-License-Identifier: MIT */
/* kvtier-bench calibrate's conversion of measurements into a GPU preset (calib.h). */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib.h"
#include "simutil.h"

#define STR_(x) #x
#define STR(x) STR_(x)

int sim_calib_mlp_dim(const struct sim_model_preset *m, uint32_t *mlp_dim)
{
	double h, p, rest, I;

	if (!m->n_layers || !m->n_q_heads || !m->n_kv_heads || !m->head_dim || !(m->params > 0))
		return -EINVAL;
	h = (double)m->n_q_heads * m->head_dim;
	p = m->params / m->n_layers;
	rest = p - h * (m->n_q_heads + 2.0 * m->n_kv_heads) * m->head_dim - h * h;
	I = 128.0 * floor(rest / (3.0 * h) / 128.0 + 0.5);
	if (!(I >= 128.0) || I > (double)UINT32_MAX)
		return -EINVAL;
	*mlp_dim = (uint32_t)I;
	return 0;
}

/* Whether w appears in s as a word of a device name: after the start or a space, before the
   end, a space or a dash ("H100" in "NVIDIA H100 80GB HBM3", not in "GH100"). */
static bool has_word(const char *s, const char *w)
{
	size_t n = strlen(w);

	for (const char *p = strstr(s, w); p; p = strstr(p + 1, w))
		if ((p == s || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ' || p[n] == '-'))
			return true;
	return false;
}

const char *sim_calib_base_of(const char *device)
{
	bool pcie = strstr(device, "PCIe") || strstr(device, "PCIE");
	bool nvl = strstr(device, "NVL") != NULL;

	if (has_word(device, "H100") && !pcie && !nvl)
		return "h100";
	if (has_word(device, "H200") && !pcie && !nvl)
		return "h200";
	if (has_word(device, "A100") && strstr(device, "40GB")) /* SXM4 and PCIe alike */
		return "a100-40g";
	if (has_word(device, "A100") && strstr(device, "80GB") && !pcie)
		return "a100-80g";
	return NULL;
}

/* Whether v is a positive finite number. */
static bool positive(double v)
{
	return isfinite(v) && v > 0;
}

/* What is wrong with a curve's points (NULL: nothing), "what" naming them in buf. */
static const char *points_bad(const struct kvt_calib_point *p, uint32_t n, const char *what,
			      char *buf, size_t len)
{
	if (n == 0 || n > KVT_CALIB_POINTS) {
		snprintf(buf, len, "%u %s points (want 1..%d)", n, what, KVT_CALIB_POINTS);
		return buf;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!positive(p[i].x) || (i && !(p[i].x > p[i - 1].x))) {
			snprintf(buf, len, "%s point %u: size %g is not positive and ascending",
				 what, i + 1, p[i].x);
			return buf;
		}
		if (!positive(p[i].seconds)) {
			snprintf(buf, len, "%s point %u (%g): time %g s is not a positive number",
				 what, i + 1, p[i].x, p[i].seconds);
			return buf;
		}
	}
	return NULL;
}

/* What is wrong with the measurements (NULL: nothing); the message goes to buf. */
static const char *result_bad(const struct kvt_calib_result *r, char *buf, size_t len)
{
	const char *w;

	if ((w = points_bad(r->linear, r->n_linear, "linear", buf, len)) ||
	    (w = points_bad(r->prefill, r->n_prefill, "prefill attention", buf, len)))
		return w;
	if (r->n_decode == 0 || r->n_decode > KVT_CALIB_DECODE_MAX) {
		snprintf(buf, len, "%u decode attention points (want 1..%d)", r->n_decode,
			 KVT_CALIB_DECODE_MAX);
		return buf;
	}
	for (uint32_t i = 0; i < r->n_decode; i++) {
		const struct kvt_calib_decode *d = &r->decode[i];

		if (!positive(d->seconds) || !positive(d->kv_bytes)) {
			snprintf(buf, len,
				 "decode attention point %u (batch %u, context %u): time %g s or "
				 "KV bytes %g is not a positive number",
				 i + 1, d->batch, d->context, d->seconds, d->kv_bytes);
			return buf;
		}
	}
	if (!positive(r->h2d_gbps) || !positive(r->d2h_gbps))
		return "a host <-> device copy rate is not a positive number";
	if (!positive(r->call_ns) || !positive(r->launch_ns))
		return "the time of a copy call or of a launch is not a positive number";
	if (!positive(r->d2d_bytes) || !positive(r->d2d_seconds))
		return "the device-to-device copy's bytes or time is not a positive number";
	if (!positive(r->mem_bytes))
		return "the device's memory size is not a positive number";
	return NULL;
}

/* v clamped into (0, 1], counting a clamp in *n. */
static double clamp1(double v, uint32_t *n)
{
	if (v <= 1.0)
		return v;
	(*n)++;
	return 1.0;
}

/* The line t = a + x / e through the decode points, x = bytes / bw, by least squares, into
   k->decode_fit_eff and k->decode_layer_us; k->decode_fitted when it has e > 0 and a >= 0. */
static void decode_fit(const struct kvt_calib_result *r, double bw, struct sim_calib_report *k)
{
	double mx = 0, my = 0, sxx = 0, sxy = 0, n = r->n_decode, slope, a;

	k->decode_fitted = false;
	if (r->n_decode < 2)
		return;
	for (uint32_t i = 0; i < r->n_decode; i++) {
		mx += r->decode[i].kv_bytes / bw / n;
		my += r->decode[i].seconds / n;
	}
	for (uint32_t i = 0; i < r->n_decode; i++) {
		double dx = r->decode[i].kv_bytes / bw - mx;

		sxx += dx * dx;
		sxy += dx * (r->decode[i].seconds - my);
	}
	if (!(sxx > 0))
		return;
	slope = sxy / sxx;
	a = my - slope * mx;
	if (!(slope > 0) || a < -1e-12 * my) /* rounding may leave a hair below 0 */
		return;
	k->decode_fitted = true;
	k->decode_fit_eff = 1 / slope;
	k->decode_layer_us = a > 0 ? a * 1e6 : 0;
}

int sim_calib_convert(const struct sim_model_preset *m, const struct sim_gpu_preset *base,
		      const struct kvt_calib_result *r, const char *name, const char *date,
		      struct sim_gpu_preset *out, struct sim_calib_report *rep, char *err,
		      size_t err_len)
{
	static const char prefix[] = "kvtier-bench calibrate on ";
	struct sim_calib_report rp = {0}, *k = &rp;
	struct sim_gpu_preset g = *base;
	double bw = base->hbm_gbps * 1e9, peak = base->tflops * 1e12, sorted[KVT_CALIB_DECODE_MAX];
	const char *w = NULL, *field = NULL;
	char buf[160];
	int room;

	if (!m->n_layers || !m->n_q_heads || !m->head_dim || !m->elem_bytes || !positive(m->params))
		w = "the model has no layers, heads or parameters";
	else if (!positive(base->tflops) || !positive(base->hbm_gbps))
		w = "the base preset's peak FLOP/s and HBM bandwidth must be positive numbers";
	else if (!name || !*name || strlen(name) > SIM_PRESET_NAME_MAX)
		w = "the preset name must have 1 to " STR(SIM_PRESET_NAME_MAX) " characters";
	else
		w = result_bad(r, buf, sizeof(buf));
	if (w) {
		snprintf(err, err_len, "%s", w);
		return -EINVAL;
	}

	g.linear_eff.n = r->n_linear;
	for (uint32_t i = 0; i < r->n_linear; i++) {
		k->linear_roof_s[i] = sim_linear_roof_s(m, base, r->linear[i].x);
		k->linear_eff[i] = k->linear_roof_s[i] / r->linear[i].seconds;
		g.linear_eff.x[i] = r->linear[i].x;
		g.linear_eff.eff[i] = clamp1(k->linear_eff[i], &k->n_clamped);
	}
	g.prefill_attn_eff.n = r->n_prefill;
	for (uint32_t i = 0; i < r->n_prefill; i++) {
		double L = r->prefill[i].x;
		double causal = 4.0 * (L * L / 2.0) * m->n_q_heads * m->head_dim;

		k->prefill_eff[i] = causal / (peak * r->prefill[i].seconds / 2.0);
		g.prefill_attn_eff.x[i] = L;
		g.prefill_attn_eff.eff[i] = clamp1(k->prefill_eff[i], &k->n_clamped);
	}
	for (uint32_t i = 0; i < r->n_decode; i++)
		sorted[i] = k->decode_eff[i] = r->decode[i].kv_bytes / (bw * r->decode[i].seconds);
	qsort(sorted, r->n_decode, sizeof(*sorted), sim_cmp_double);
	k->decode_median = r->n_decode % 2
				   ? sorted[r->n_decode / 2]
				   : (sorted[r->n_decode / 2 - 1] + sorted[r->n_decode / 2]) / 2;
	decode_fit(r, bw, k);
	if (k->decode_fitted) {
		g.decode_attn_eff = clamp1(k->decode_fit_eff, &k->n_clamped);
		g.decode_attn_layer_us = k->decode_layer_us;
	} else {
		g.decode_attn_eff = clamp1(k->decode_median, &k->n_clamped);
		g.decode_attn_layer_us = 0;
	}
	k->kv_write_eff = 2.0 * r->d2d_bytes / r->d2d_seconds / bw;
	g.kv_write_eff = clamp1(k->kv_write_eff, &k->n_clamped);

	g.hbm_gib = r->mem_bytes / (double)(1ull << 30);
	g.h2d_gbps = r->h2d_gbps;
	g.d2h_gbps = r->d2h_gbps;
	g.call_ns = r->call_ns;
	g.launch_ns = r->launch_ns;
	snprintf(g.name, sizeof(g.name), "%s", name);
	room = SIM_PRESET_SOURCE_MAX - (int)(sizeof(prefix) - 1) - 2 -
	       (int)strlen(date ? date : "");
	snprintf(g.source, sizeof(g.source), "%s%.*s, %s", prefix, room > 0 ? room : 0, r->device,
		 date ? date : "");

	/* a measured figure can still fall outside the reader's bounds (an efficiency under
	   0.0001, a call of over a second): refused here, not in a file that cannot be read */
	w = sim_gpu_check(&g, &field);
	if (w) {
		snprintf(err, err_len, "the preset made is not valid: field '%s': %s", field, w);
		return -EINVAL;
	}
	*out = g;
	if (rep)
		*rep = rp;
	return 0;
}
