/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: the input is a preset file (sim/exec_model.c's sim_preset_load_json, the
 * replay's --preset-json), read over llama3-8b and one of the GPU presets (the input's byte sum
 * picks which). A refused file must leave both presets as they were and start its message with
 * the file's path. An accepted one is checked against exec_model.h's rules field by field and
 * against the file itself, parsed again here (a field the file sets holds its value, every other
 * field the base preset's); its GPU preset, written by sim_gpu_preset_json and read back over a
 * fresh base, must come back equal; its curves must interpolate as documented (piecewise linear
 * in log x, between the values of the two points around x); and sim_iter_time over four fixed
 * works (a decode batch, a whole prefill, a layer-segmented prefill chunk with decodes, no work)
 * must give times that are not negative, and, where every figure lies within PHYS_MIN..PHYS_MAX
 * (efficiencies at least PHYS_MIN), finite, adding up to their total, and 0 for no work.
 * Outside those bounds the reader accepts figures (a peak of 1e-300, an efficiency of 1e-320)
 * whose times overflow (to infinity, or NaN for no work), so there only the sign is checked.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "exec_model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                         \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "fuzz_preset: %s:%d: check failed: %s\n", __FILE__, \
				__LINE__, #cond);                                           \
			abort();                                                            \
		}                                                                           \
	} while (0)

/* The bounds within which sim_iter_time's arithmetic cannot overflow for any u32 geometry
   (the largest time it can reach there is about 1e43 s). */
#define PHYS_MIN 1e-9
#define PHYS_MAX 1e15
/* The per-layer work is built only for models up to this many layers. */
#define MAX_LAYERS_PER_LAYER_WORK 4096

static int fd = -1;
static char path[64];
static struct sim_model_preset base_m;
static struct sim_gpu_preset base_g[8];
static size_t n_gpu;

static const struct {
	const char *key;
	size_t off;
} gpu_dbl[] = {
	{"hbm_gib", offsetof(struct sim_gpu_preset, hbm_gib)},
	{"hbm_gbps", offsetof(struct sim_gpu_preset, hbm_gbps)},
	{"tflops", offsetof(struct sim_gpu_preset, tflops)},
	{"h2d_gbps", offsetof(struct sim_gpu_preset, h2d_gbps)},
	{"d2h_gbps", offsetof(struct sim_gpu_preset, d2h_gbps)},
	{"call_ns", offsetof(struct sim_gpu_preset, call_ns)},
	{"launch_ns", offsetof(struct sim_gpu_preset, launch_ns)},
	{"decode_attn_eff", offsetof(struct sim_gpu_preset, decode_attn_eff)},
	{"decode_attn_layer_us", offsetof(struct sim_gpu_preset, decode_attn_layer_us)},
	{"kv_write_eff", offsetof(struct sim_gpu_preset, kv_write_eff)},
	{"iter_overhead_us", offsetof(struct sim_gpu_preset, iter_overhead_us)},
};
#define N_PEAKS 7 /* the first entries of gpu_dbl: positive and finite */

static const struct {
	const char *key;
	size_t off;
} model_u32[] = {
	{"n_layers", offsetof(struct sim_model_preset, n_layers)},
	{"n_q_heads", offsetof(struct sim_model_preset, n_q_heads)},
	{"n_kv_heads", offsetof(struct sim_model_preset, n_kv_heads)},
	{"head_dim", offsetof(struct sim_model_preset, head_dim)},
	{"elem_bytes", offsetof(struct sim_model_preset, elem_bytes)},
	{"max_context", offsetof(struct sim_model_preset, max_context)},
};

static double dbl_at(const void *p, size_t off)
{
	double d;

	memcpy(&d, (const char *)p + off, sizeof(d));
	return d;
}

static uint32_t u32_at(const void *p, size_t off)
{
	uint32_t u;

	memcpy(&u, (const char *)p + off, sizeof(u));
	return u;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	fd = memfd_create("fuzz_preset", 0);
	if (fd < 0) {
		perror("fuzz_preset: memfd_create");
		abort();
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	CHECK(sim_preset_model("llama3-8b", &base_m) == 0);
	for (n_gpu = 0; sim_gpu_preset_names[n_gpu]; n_gpu++) {
		CHECK(n_gpu < sizeof(base_g) / sizeof(base_g[0]));
		CHECK(sim_preset_gpu(sim_gpu_preset_names[n_gpu], &base_g[n_gpu]) == 0);
	}
	CHECK(n_gpu > 0);
	return 0;
}

static void put_file(const void *data, size_t size)
{
	size_t off = 0;

	CHECK(ftruncate(fd, 0) == 0);
	while (off < size) {
		ssize_t w = pwrite(fd, (const char *)data + off, size - off, (off_t)off);

		CHECK(w > 0);
		off += (size_t)w;
	}
}

static bool same_curve_points(const struct sim_eff_curve *a, const struct sim_eff_curve *b)
{
	return a->n == b->n && a->n <= SIM_EFF_POINTS &&
	       !memcmp(a->x, b->x, a->n * sizeof(a->x[0])) &&
	       !memcmp(a->eff, b->eff, a->n * sizeof(a->eff[0]));
}

/* Field by field, doubles bit for bit. */
static bool same_model(const struct sim_model_preset *a, const struct sim_model_preset *b)
{
	for (size_t i = 0; i < sizeof(model_u32) / sizeof(model_u32[0]); i++)
		if (u32_at(a, model_u32[i].off) != u32_at(b, model_u32[i].off))
			return false;
	return !strcmp(a->name, b->name) && !memcmp(&a->params, &b->params, sizeof(a->params));
}

/* g2 read back from what sim_gpu_preset_json wrote of g: an empty curve of g comes back as
   one point of 1, so that one is compared by its values. */
static bool same_curve_rt(const struct sim_eff_curve *g, const struct sim_eff_curve *g2)
{
	static const double xs[] = {1e-3, 1, 10, 1000, 1e6};

	if (g->n)
		return same_curve_points(g, g2);
	for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++)
		if (sim_eff_at(g, xs[i]) != sim_eff_at(g2, xs[i]))
			return false;
	return true;
}

/* Field by field (a curve has padding after n), doubles bit for bit. */
static bool same_gpu_rt(const struct sim_gpu_preset *g, const struct sim_gpu_preset *g2)
{
	for (size_t i = 0; i < sizeof(gpu_dbl) / sizeof(gpu_dbl[0]); i++) {
		double a = dbl_at(g, gpu_dbl[i].off), b = dbl_at(g2, gpu_dbl[i].off);

		if (memcmp(&a, &b, sizeof(a)))
			return false;
	}
	return !strcmp(g->name, g2->name) && !strcmp(g->source, g2->source) &&
	       same_curve_rt(&g->linear_eff, &g2->linear_eff) &&
	       same_curve_rt(&g->prefill_attn_eff, &g2->prefill_attn_eff);
}

/* exec_model.h's rules for an accepted preset. */
static void check_rules(const struct sim_model_preset *m, const struct sim_gpu_preset *g)
{
	CHECK(memchr(m->name, 0, sizeof(m->name)));
	CHECK(strlen(m->name) <= SIM_PRESET_NAME_MAX);
	CHECK(m->n_layers > 0 && m->n_q_heads > 0 && m->n_kv_heads > 0 && m->head_dim > 0);
	CHECK(m->max_context > 0);
	CHECK(m->n_q_heads % m->n_kv_heads == 0);
	CHECK(m->elem_bytes == 2 || m->elem_bytes == 4);
	CHECK(isfinite(m->params) && m->params > 0);

	CHECK(memchr(g->name, 0, sizeof(g->name)));
	CHECK(strlen(g->name) <= SIM_PRESET_NAME_MAX);
	CHECK(memchr(g->source, 0, sizeof(g->source)));
	for (size_t i = 0; i < N_PEAKS; i++) {
		double d = dbl_at(g, gpu_dbl[i].off);

		CHECK(isfinite(d) && d > 0);
	}
	CHECK(sim_eff_check(&g->linear_eff) == NULL);
	CHECK(sim_eff_check(&g->prefill_attn_eff) == NULL);
	CHECK(g->decode_attn_eff > 0 && g->decode_attn_eff <= 1);
	CHECK(g->kv_write_eff > 0 && g->kv_write_eff <= 1);
	CHECK(isfinite(g->iter_overhead_us) && g->iter_overhead_us >= 0);
	CHECK(isfinite(g->decode_attn_layer_us) && g->decode_attn_layer_us >= 0);
}

/* The fields of the file's object `o` (NULL: none) as the reader must have taken them. */
static void check_model_from(const json_t *o, const struct sim_model_preset *m)
{
	const json_t *v;

	for (size_t i = 0; i < sizeof(model_u32) / sizeof(model_u32[0]); i++) {
		v = o ? json_object_get(o, model_u32[i].key) : NULL;
		CHECK(u32_at(m, model_u32[i].off) ==
		      (v ? (uint32_t)json_number_value(v) : u32_at(&base_m, model_u32[i].off)));
	}
	v = o ? json_object_get(o, "params") : NULL;
	CHECK(m->params == (v ? json_number_value(v) : base_m.params));
	v = o ? json_object_get(o, "name") : NULL;
	CHECK(!strcmp(m->name, v ? json_string_value(v) : base_m.name));
}

static void check_curve_from(const json_t *a, const struct sim_eff_curve *c,
			     const struct sim_eff_curve *base)
{
	size_t i;
	json_t *p;

	if (!a) {
		CHECK(same_curve_points(c, base));
		return;
	}
	CHECK(c->n == json_array_size(a));
	json_array_foreach(a, i, p)
	{
		CHECK(c->x[i] == json_number_value(json_array_get(p, 0)));
		CHECK(c->eff[i] == json_number_value(json_array_get(p, 1)));
	}
}

static void check_gpu_from(const json_t *o, const struct sim_gpu_preset *g,
			   const struct sim_gpu_preset *base)
{
	const json_t *v;

	for (size_t i = 0; i < sizeof(gpu_dbl) / sizeof(gpu_dbl[0]); i++) {
		v = o ? json_object_get(o, gpu_dbl[i].key) : NULL;
		CHECK(dbl_at(g, gpu_dbl[i].off) ==
		      (v ? json_number_value(v) : dbl_at(base, gpu_dbl[i].off)));
	}
	v = o ? json_object_get(o, "name") : NULL;
	CHECK(!strcmp(g->name, v ? json_string_value(v) : base->name));
	v = o ? json_object_get(o, "source") : NULL;
	CHECK(!strcmp(g->source, v ? json_string_value(v) : base->source));
	check_curve_from(o ? json_object_get(o, "linear_eff") : NULL, &g->linear_eff,
			 &base->linear_eff);
	check_curve_from(o ? json_object_get(o, "prefill_attn_eff") : NULL, &g->prefill_attn_eff,
			 &base->prefill_attn_eff);
}

/* The file parsed again: it must be an object of "model" and "gpu" objects, and the presets
   must hold what it says. */
static void check_from_file(const uint8_t *data, size_t size, const struct sim_model_preset *m,
			    const struct sim_gpu_preset *g, const struct sim_gpu_preset *base)
{
	json_t *root, *mo, *go;

	if (size >= 3 && !memcmp(data, "\xef\xbb\xbf", 3)) {
		data += 3;
		size -= 3;
	}
	root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	CHECK(json_is_object(root));
	mo = json_object_get(root, "model");
	go = json_object_get(root, "gpu");
	CHECK(json_object_size(root) == (size_t) !!mo + !!go);
	CHECK(!mo || json_is_object(mo));
	CHECK(!go || json_is_object(go));
	check_model_from(mo, m);
	check_gpu_from(go, g, base);
	json_decref(root);
}

/* The curve at x as documented, with log x - log x0 over log x1 - log x0 where this code's
   own rounding is small against the segment (else NAN: only the range is checked); the
   segment's lowest and highest value into *lo and *hi. */
static double eff_ref(const struct sim_eff_curve *c, double x, double *lo, double *hi)
{
	uint32_t i = 1;
	double d, f;

	if (c->n == 0) {
		*lo = *hi = 1;
		return 1;
	}
	if (x <= c->x[0] || x >= c->x[c->n - 1]) {
		*lo = *hi = x <= c->x[0] ? c->eff[0] : c->eff[c->n - 1];
		return *lo;
	}
	while (!(x <= c->x[i]))
		i++;
	*lo = fmin(c->eff[i - 1], c->eff[i]);
	*hi = fmax(c->eff[i - 1], c->eff[i]);
	d = log(c->x[i]) - log(c->x[i - 1]);
	if (!(d >= 1e-6))
		return NAN;
	f = (log(x) - log(c->x[i - 1])) / d;
	f = fmin(fmax(f, 0), 1);
	return c->eff[i - 1] + f * (c->eff[i] - c->eff[i - 1]);
}

static void check_eff_at(const struct sim_eff_curve *c, double x)
{
	double lo, hi, want = eff_ref(c, x, &lo, &hi), got = sim_eff_at(c, x);

	CHECK(got >= lo - 1e-12 && got <= hi + 1e-12);
	if (!isnan(want))
		CHECK(fabs(got - want) <= 1e-6);
}

/* Every point of the curve, a value inside each segment, and the sizes the model asks for. */
static void check_curve(const struct sim_eff_curve *c)
{
	static const double xs[] = {1e-3, 0.5, 1, 3, 16, 100, 777, 4096, 1e5, 1e9};

	for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++)
		check_eff_at(c, xs[i]);
	for (uint32_t i = 0; i < c->n; i++) {
		check_eff_at(c, c->x[i]);
		if (i)
			check_eff_at(c, c->x[i - 1] + (c->x[i] - c->x[i - 1]) / 2);
	}
}

static bool phys(double d)
{
	return d >= PHYS_MIN && d <= PHYS_MAX;
}

static bool curve_phys(const struct sim_eff_curve *c)
{
	for (uint32_t i = 0; i < c->n; i++)
		if (c->eff[i] < PHYS_MIN)
			return false;
	return true;
}

/* Whether every figure lies where sim_iter_time cannot overflow. */
static bool in_bounds(const struct sim_model_preset *m, const struct sim_gpu_preset *g)
{
	for (size_t i = 0; i < N_PEAKS; i++)
		if (!phys(dbl_at(g, gpu_dbl[i].off)))
			return false;
	return phys(m->params) && g->decode_attn_eff >= PHYS_MIN && g->kv_write_eff >= PHYS_MIN &&
	       g->iter_overhead_us <= PHYS_MAX && g->decode_attn_layer_us <= PHYS_MAX &&
	       curve_phys(&g->linear_eff) && curve_phys(&g->prefill_attn_eff);
}

static void check_time(const struct sim_model_preset *m, const struct sim_gpu_preset *g,
		       const struct sim_iter_work *w, bool bounded, bool empty)
{
	struct sim_iter_time t;
	double parts[7], sum = 0;

	memset(&t, 0x5a, sizeof(t));
	sim_iter_time(m, g, w, &t);
	parts[0] = t.gemm_s;
	parts[1] = t.attn_decode_s;
	parts[2] = t.attn_prefill_s;
	parts[3] = t.kv_write_s;
	parts[4] = t.overhead_s;
	parts[5] = t.transfer_s;
	parts[6] = t.cpu_s;
	CHECK(!(t.total_s < 0));
	for (int i = 0; i < 7; i++) {
		CHECK(!(parts[i] < 0));
		sum += parts[i];
	}
	if (!bounded)
		return;
	CHECK(isfinite(t.total_s) && t.total_s >= 0);
	for (int i = 0; i < 7; i++)
		CHECK(isfinite(parts[i]) && parts[i] >= 0);
	CHECK(fabs(t.total_s - sum) <= 1e-12 * sum);
	CHECK(t.transfer_s == w->transfer_s && t.cpu_s == w->cpu_s);
	if (empty)
		CHECK(t.total_s == 0 && sum == 0);
}

static void check_times(const struct sim_model_preset *m, const struct sim_gpu_preset *g)
{
	bool bounded = in_bounds(m, g);
	double kvtb = sim_model_kv_token_bytes(m);
	struct sim_iter_work w;
	uint64_t *layers;
	uint32_t half = m->n_layers / 2;

	CHECK(sim_prefill_attn_s(g, 0, 100, 100) == 0);
	CHECK(sim_linear_layer_s(m, g, 0) == 0);

	/* a decode batch: 64 sequences of 2000 tokens */
	memset(&w, 0, sizeof(w));
	w.decode_tokens = 64;
	w.kv_bytes_read = 64 * 2000 * kvtb;
	w.transfer_s = 1e-4;
	w.cpu_s = 2e-5;
	check_time(m, g, &w, bounded, false);

	/* a whole prompt of 1500 tokens */
	memset(&w, 0, sizeof(w));
	w.prefill_token_layers = 1500ull * m->n_layers;
	w.prefill_attn_s =
		sim_prefill_attn_s(g, sim_prefill_attn_flops(m, 1500, m->n_layers), 1500, 1500);
	check_time(m, g, &w, bounded, false);

	/* a layer-segmented chunk of 512 tokens (its first half of the layers, the second 512 of
	   its prompt) beside 8 decodes */
	if (m->n_layers <= MAX_LAYERS_PER_LAYER_WORK) {
		layers = calloc(m->n_layers, sizeof(*layers));
		CHECK(layers);
		for (uint32_t l = 0; l < half; l++)
			layers[l] = 512;
		memset(&w, 0, sizeof(w));
		w.decode_tokens = 8;
		w.kv_bytes_read = 8 * 300 * kvtb;
		w.prefill_layer_tokens = layers;
		w.prefill_token_layers = 512ull * half;
		w.prefill_attn_s = sim_prefill_attn_s(g,
						      sim_prefill_attn_flops(m, 1024, half) -
							      sim_prefill_attn_flops(m, 512, half),
						      512, 1024);
		w.cpu_s = 1e-5;
		check_time(m, g, &w, bounded, false);
		free(layers);
	}

	memset(&w, 0, sizeof(w));
	check_time(m, g, &w, bounded, true);
}

/* What sim_gpu_preset_json writes of g, read back over a fresh base, must equal g. */
static void check_round_trip(const struct sim_gpu_preset *g, const struct sim_gpu_preset *base)
{
	struct sim_model_preset m2 = base_m;
	struct sim_gpu_preset g2 = *base;
	char err[256], *text;
	json_t *o;
	int rc;

	o = json_pack("{s:o}", "gpu", sim_gpu_preset_json(g));
	CHECK(o);
	text = json_dumps(o, JSON_REAL_PRECISION(17));
	CHECK(text);
	put_file(text, strlen(text));
	rc = sim_preset_load_json(path, &m2, &g2, err, sizeof(err));
	if (rc)
		fprintf(stderr, "fuzz_preset: round trip: %d: %s\n%s\n", rc, err, text);
	CHECK(rc == 0);
	CHECK(same_model(&m2, &base_m));
	CHECK(same_gpu_rt(g, &g2));
	free(text);
	json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sim_model_preset m = base_m, m_keep;
	struct sim_gpu_preset g, g_keep;
	const struct sim_gpu_preset *base;
	char err[256], line[160];
	size_t sum = 0, plen = strlen(path);
	int rc;

	for (size_t i = 0; i < size; i++)
		sum += data[i];
	base = &base_g[sum % n_gpu];
	g = *base;
	m_keep = m;
	g_keep = g;
	put_file(data, size);
	memset(err, 0x5a, sizeof(err));
	rc = sim_preset_load_json(path, &m, &g, err, sizeof(err));
	if (rc) {
		CHECK(rc < 0 && rc > -4096);
		CHECK(!memcmp(&m, &m_keep, sizeof(m)) && !memcmp(&g, &g_keep, sizeof(g)));
		CHECK(memchr(err, 0, sizeof(err)));
		CHECK(!strncmp(err, path, plen) && err[plen] == ':');
		return 0;
	}
	check_rules(&m, &g);
	check_from_file(data, size, &m, &g, base);
	check_curve(&g.linear_eff);
	check_curve(&g.prefill_attn_eff);
	check_times(&m, &g);
	sim_gpu_preset_line(&g, line, sizeof(line));
	CHECK(memchr(line, 0, sizeof(line)));
	check_round_trip(&g, base);
	return 0;
}
