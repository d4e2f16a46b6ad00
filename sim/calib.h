/* SPDX-License-Identifier: MIT */
/*
 * kvtier-bench calibrate's conversion (not part of the library): what the CUDA plugin measured
 * on a GPU (transfer/calibrate.h) into a GPU preset of the execution model (exec_model.h), which
 * kvtier-replay and kvtier-curve read back with --preset-json. Pure C, so the arithmetic is
 * tested where there is no GPU (tests/test_calib.c).
 *
 * The peaks are the datasheet's (a base preset, or the caller's overrides of it); the
 * efficiencies are the measured times against the roofline the model times with:
 *
 *   linear_eff(M)        max(p * elem / bandwidth, 2 * p * M / peak) / t(M), p = params / layers
 *   prefill_attn_eff(L)  4 * (L^2 / 2) * n_q_heads * head_dim / (peak * t_full(L) / 2): the
 *                        measured run is non-causal, and a causal one does half its work
 *   decode_attn_eff,     the line t = a + bytes / (bw * e) fitted by least squares through the
 *   decode_attn_layer_us measured (batch, context) points of one layer: e and a; where no line
 *                        with e > 0 and a >= 0 fits (one point, or a negative floor), the
 *                        median over the points of bytes / (bw * t) and no floor
 *   kv_write_eff         2 * bytes / t / bandwidth of the device-to-device copy
 *
 * A value above 1 (faster than the datasheet allows: a wrong peak, or a figure the roofline
 * does not describe) is clamped to 1 and counted in the report.
 */
#ifndef SIM_CALIB_H
#define SIM_CALIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "calibrate.h"
#include "exec_model.h"

/* I of a layer's MLP such that its GEMMs hold the model's per-layer share of parameters,
   p = params / n_layers: I = (p - h * (n_q_heads + 2 * n_kv_heads) * head_dim - h * h) / (3 h)
   with h = n_q_heads * head_dim, rounded to the nearest multiple of 128 (at least 128). 0, or
   -EINVAL when p leaves no room for an MLP or the result would not fit. */
int sim_calib_mlp_dim(const struct sim_model_preset *m, uint32_t *mlp_dim);

/* The datasheet preset (a sim_preset_gpu name) of a device as CUDA names it: h100 for the
   H100 SXM ("NVIDIA H100 80GB HBM3"), h200 for the H200 SXM, a100-80g and a100-40g for the
   A100 of that memory. NULL for any other device, the PCIe and NVL parts included (their
   peaks differ from the SXM datasheet's). */
const char *sim_calib_base_of(const char *device);

/* What the conversion found per point, before clamping. */
struct sim_calib_report {
	double linear_roof_s[KVT_CALIB_POINTS]; /* the roofline time of each linear point */
	double linear_eff[KVT_CALIB_POINTS];	/* roofline / measured */
	double prefill_eff[KVT_CALIB_POINTS];
	double decode_eff[KVT_CALIB_DECODE_MAX]; /* per measured (batch, context) */
	double decode_median;			 /* of decode_eff */
	bool decode_fitted;			 /* the line fits (else: the median, no floor) */
	double decode_fit_eff, decode_layer_us;	 /* the line's e (before clamping) and a */
	double kv_write_eff;
	uint32_t n_clamped; /* values above 1 that the preset holds as 1 */
};

/*
 * Fills *out from base (its peaks, memory size aside, and iter_overhead_us, which an engine's
 * own overhead sets and this measurement cannot see) and the measurements r of model m:
 * the efficiencies above, h2d_gbps, d2h_gbps, call_ns and launch_ns as measured, hbm_gib
 * from the device's memory, name (1..SIM_PRESET_NAME_MAX characters), and source "kvtier-bench
 * calibrate on DEVICE, DATE" (the device's name cut to fit SIM_PRESET_SOURCE_MAX). date is the
 * caller's, YYYY-MM-DD. The preset passes sim_gpu_check, so sim_preset_load_json reads back
 * what sim_gpu_preset_json writes of it. rep (NULL: not wanted) gets the values before
 * clamping. Returns 0, or -EINVAL with what is wrong in err (a time, rate or size that is not
 * a positive finite number, a list empty, too long or not ascending, a bad name, a model or
 * base without positive peaks, a figure outside the preset reader's bounds); *out and *rep
 * change only on success.
 */
int sim_calib_convert(const struct sim_model_preset *m, const struct sim_gpu_preset *base,
		      const struct kvt_calib_result *r, const char *name, const char *date,
		      struct sim_gpu_preset *out, struct sim_calib_report *rep, char *err,
		      size_t err_len);

#endif /* SIM_CALIB_H */
