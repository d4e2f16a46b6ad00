/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target: a sequence of public API calls (include/kvtier.h only) on a small manager
 * of the host backend, read from the input bytes. The first two bytes choose the
 * configuration (dtype, save threads, tier budgets, SnapStream shape, recall, disk tier); each
 * following operation is one opcode byte and its arguments. The target keeps a model of what
 * every live sequence holds: token counts per layer and token contents, a pure function of
 * (sequence generation, layer, kv head, position), so every row read back is compared bit for
 * bit. Checked, and a violation abort()s:
 *   - every call returns 0 or a negative errno; calls the contract says must fail do fail, and
 *     calls that must succeed fail only for a resource reason (memory, disk); a decode step's
 *     call (kvt_step_*) is held to the plain call on the step's ids as they stand, or fails
 *     when no step is open;
 *   - a failed call changes nothing visible: token counts, prefilled layers and the preempted
 *     flag of every sequence stay as they were (checked after every call);
 *   - kvt_seq_read_token is bit-exact; resident positions ascend and are the positions whose
 *     rows kvt_seq_frames's slots hold; recalled frames hold their blocks' rows; kvt_attend
 *     equals a double-precision reference over resident plus recalled tokens;
 *   - kvt_step_paged writes the paged form of kvt_step_tables's tables, its recalled tokens'
 *     rows in the pool where it says, or fails with -ENOSPC exactly when they pass the
 *     caller's capacities, writing nothing;
 *   - kvt_sched_step's batches keep the scheduler's contract (item count, distinct live
 *     sequences, prefills first, layer ranges), and its calls fail where they must;
 *   - at the end, every token of every live sequence reads back bit-exact (-EBADMSG only when
 *     kvt_seq_info reports the sequence lost), then kvt_manager_destroy.
 * FUZZ_API_TRACE=1 in the environment prints each operation (to follow a reproducer).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtier.h"
#ifdef FUZZ_API_CUDA
#include <cuda_runtime_api.h>

#include "t_backend.h"
#endif

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Geometry (fixed) and bounds of the model. */
#define NL 2
#define NKV 2
#define NQ 4
#define HD 8
#define NSLOTS 6
#define MAX_PROMPT 96
#define MAX_TOK 192
#define MAX_BATCH 4
#define MAX_OPS 512
#define MAX_ESZ 4

static const uint64_t slot_ids[NSLOTS] = {
	1, 0, 42, UINT64_MAX, (uint64_t)1 << 63, 0x123456789aull,
};
static const uint64_t unknown_ids[] = {2, 7, UINT64_MAX - 1, 43};
#define N_UNKNOWN (sizeof(unknown_ids) / sizeof(unknown_ids[0]))

#define MAX_HASHES 8
struct slot {
	bool live, preempted, lost;
	uint32_t gen; /* contents: unique per kvt_seq_create */
	uint32_t prompt;
	uint32_t tokens[NL]; /* 0: layer not prefilled */
	/* kvt_seq_create_prefix: its chain (n_hashes hashes of hash_tokens tokens each; the
	   contents of positions [0, n_hashes * hash_tokens) follow from the hashes, so that
	   sequences on the same leading hashes hold the same tokens there), the tokens it
	   shared, and each layer's positions in the host history before its prefill completes
	   (the shared prefix, then kvt_prefill_chunk's chunks) */
	uint32_t n_hashes, hash_tokens, matched;
	uint64_t hashes[MAX_HASHES];
	uint32_t filled[NL];
	uint64_t serial; /* kvt_seq_info.serial */
};

static struct {
	struct kvt_manager *m;
	struct kvt_config cfg;
	uint32_t esz, bt, gen;
	uint64_t serial; /* the latest sequence's kvt_seq_info.serial */
	bool disk, trace;
	struct slot s[NSLOTS];
	struct { /* the open decode step (kvt_step_begin), as the model sees it */
		bool open;
		uint32_t n;
		int slots[MAX_BATCH]; /* its members: slot indices (unknown ids past NSLOTS) */
	} step;
	uint32_t op; /* index of the operation, for messages */
	bool cuda;   /* this run's manager is on the CUDA backend (fuzz_api_cuda) */
	/* the scheduler over the manager (op_sched), its limits and its batch not committed */
	struct kvt_sched *sched;
	struct kvt_sched_config scfg;
	struct kvt_sched_batch sb;
	bool sb_open;
	/* fuzz_api_cuda: what each operation printed (trace) in the host backend's run, which
	   the CUDA backend's run of the same input must print too */
	bool record, compare;
	bool diverged; /* from here on trace prints, neither keeps nor compares (disk_used,
			  recall_done) */
	char *log;
	size_t log_len, log_cap, log_at;
} F;

static char spill_dir[64];

static void quiet(void *user, enum kvt_log_level level, const char *msg)
{
	(void)user;
	(void)level;
	(void)msg;
}

static void remove_spill_dir(void)
{
	rmdir(spill_dir);
}

/* ---- failures -------------------------------------------------------------------------- */

__attribute__((noreturn)) static void die(int line, const char *what, int rc)
{
	fprintf(stderr, "fuzz_api: %sline %d, op %u: %s (rc %d %s; last error: %s)\n",
		F.cuda ? "CUDA backend, " : "", line, F.op, what, rc, kvt_strerror(rc),
		F.m ? kvt_manager_last_error(F.m) : "-");
	abort();
}
#define CHECK(cond)                              \
	do {                                     \
		if (!(cond))                     \
			die(__LINE__, #cond, 0); \
	} while (0)
#define CHECK_RC(cond, rc)                          \
	do {                                        \
		if (!(cond))                        \
			die(__LINE__, #cond, (rc)); \
	} while (0)

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* fuzz_api_cuda: one line an operation printed, kept (the host backend's run) or compared
   with the line the host backend's run printed in its place (the CUDA backend's). */
static void log_line(const char *line)
{
	size_t n = strlen(line);

	if (F.record) {
		if (F.log_len + n + 1 > F.log_cap) {
			size_t cap = F.log_cap ? 2 * F.log_cap : 1 << 16;
			char *p;

			while (cap < F.log_len + n + 1)
				cap *= 2;
			p = realloc(F.log, cap);
			CHECK(p != NULL);
			F.log = p;
			F.log_cap = cap;
		}
		memcpy(F.log + F.log_len, line, n + 1);
		F.log_len += n + 1;
		return;
	}
	if (F.log_at >= F.log_len || strcmp(F.log + F.log_at, line)) {
		fprintf(stderr, "fuzz_api: host backend: %s\nfuzz_api: CUDA backend: %s\n",
			F.log_at < F.log_len ? F.log + F.log_at : "(nothing more)", line);
		die(__LINE__, "the CUDA backend differs from the host backend on the same calls",
		    0);
	}
	F.log_at += n + 1;
}

#include <stdarg.h>
static void trace(const char *fmt, ...)
{
	char line[320];
	va_list ap;
	int k;

	if (!F.trace && !F.record && !F.compare)
		return;
	k = snprintf(line, sizeof(line), "op %u: ", F.op);
	va_start(ap, fmt);
	vsnprintf(line + k, sizeof(line) - (size_t)k, fmt, ap);
	va_end(ap);
	if (F.trace) /* with the message of a call that failed */
		fprintf(stderr, "%s%s%s%s\n", F.cuda ? "cuda " : "", line,
			F.m && strstr(line, "-> -") ? ": " : "",
			F.m && strstr(line, "-> -") ? kvt_manager_last_error(F.m) : "");
	if ((F.record || F.compare) && !F.diverged)
		log_line(line);
}

/* 0 or a negative errno */
static void check_errno(int rc)
{
	CHECK_RC(rc == 0 || (rc < 0 && rc > -4096), rc);
}

/* A scheduler call that failed on a scheduler left its detail naming the error: the
   scheduler's text with the error's in parentheses, or what the scheduler was doing and the
   manager's detail, which ends so (kvt_sched_last_error). */
static void check_sched_detail(int rc)
{
	const char *d;

	if (!rc || !F.sched)
		return;
	d = kvt_sched_last_error(F.sched);
	CHECK_RC(strstr(d, kvt_strerror(rc)) != NULL, rc);
}

/* Failures that no argument can rule out: memory and the disk tier. */
static bool resource_error(int rc)
{
	if (rc == -ENOMEM)
		return true;
	return F.disk && (rc == -ENOSPC || rc == -EIO || rc == -EBADMSG);
}

/* ---- input ------------------------------------------------------------------------------ */

struct in {
	const uint8_t *p;
	size_t n;
};

static uint8_t u8(struct in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

static uint16_t u16(struct in *in)
{
	return (uint16_t)(u8(in) | u8(in) << 8);
}

/* ---- contents --------------------------------------------------------------------------- */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* k/64 with |k| <= 255: exact in f32, bf16 and f16. */
static float token_val(uint32_t gen, uint32_t layer, uint32_t head, uint32_t pos, int kv,
		       uint32_t d)
{
	uint64_t h = mix(((uint64_t)gen << 32) ^ ((uint64_t)layer << 28) ^ ((uint64_t)head << 24) ^
			 ((uint64_t)pos << 5) ^ ((uint64_t)kv << 4) ^ d);

	return (float)((int)(h % 511) - 255) / 64.0f;
}

static float query_val(uint32_t seed, uint32_t i)
{
	return (float)((int)(mix(((uint64_t)seed << 32) ^ i ^ 0x5eedull) % 511) - 255) / 64.0f;
}

static uint16_t to_f16(float v)
{
	int e;
	float f;
	uint16_t sign = v < 0 ? 0x8000 : 0;

	if (v == 0.0f)
		return 0;
	f = frexpf(fabsf(v), &e); /* |v| = f * 2^e, f in [0.5, 1), |v| >= 2^-6: normal */
	return (uint16_t)(sign | (uint16_t)(e - 1 + 15) << 10 |
			  (uint16_t)lrintf((f * 2.0f - 1.0f) * 1024.0f));
}

static void put_val(void *dst, float v)
{
	uint32_t b;

	switch (F.cfg.dtype) {
	case KVT_DTYPE_F32:
		memcpy(dst, &v, 4);
		break;
	case KVT_DTYPE_BF16:
		memcpy(&b, &v, 4);
		b >>= 16;
		memcpy(dst, &b, 2); /* little endian */
		break;
	case KVT_DTYPE_F16: {
		uint16_t h = to_f16(v);

		memcpy(dst, &h, 2);
		break;
	}
	}
}

/* The K (kv = 0) or V (kv = 1) row of a token in config.dtype: in a hashed span, a function
   of that span's hash (which covers every position before it), else of the sequence. */
static void token_row(const struct slot *s, uint32_t layer, uint32_t head, uint32_t pos, int kv,
		      uint8_t *row)
{
	uint32_t gen = s->gen;

	if (s->n_hashes && pos < s->n_hashes * s->hash_tokens) {
		uint64_t h = mix(s->hashes[pos / s->hash_tokens]);

		gen = 0x80000000u | (uint32_t)(h ^ h >> 32); /* (kvt_seq_create's are small) */
	}
	for (uint32_t d = 0; d < HD; d++)
		put_val(row + d * F.esz, token_val(gen, layer, head, pos, kv, d));
}

/* A layer's positions in the host history: its tokens once prefilled, else its shared prefix
   and chunks. */
static uint32_t history(const struct slot *s, uint32_t layer)
{
	return s->tokens[layer] ? s->tokens[layer] : s->filled[layer];
}

/* ---- model checks ------------------------------------------------------------------------ */

static uint64_t id_of(int slot)
{
	return slot < NSLOTS ? slot_ids[slot] : unknown_ids[slot - NSLOTS];
}

/* After a valid recall call that returned rc (its trace compared): a recall that failed for
   a resource ends the comparison of the two runs (both reach it at the same call). The host
   backend may fail before anything changed, reading a block back to build its metadata,
   where the CUDA backend fails after its program ran, when the blocks its loads read do not
   come back: its members' views then read as stale and their working sets keep the call's
   blocks (kvtier.h), and the regions' later decisions may differ. An -ENOSPC without a disk
   tier is the sizing's, made before anything changes on both. */
static void recall_done(int rc)
{
	if (F.diverged ||
	    !(rc == -ENOMEM || rc == -EIO || rc == -EBADMSG || (rc == -ENOSPC && F.disk)))
		return;
	F.diverged = true;
	trace("  (the runs are compared no further: a recall failed for a resource)");
}

/* fuzz_api_cuda with a disk tier: the comparison ends once a block is in the spill file.
   The host backend then reads spilled blocks back to build a recalled layer's block metadata
   from the host history, which the CUDA backend never needs (it folds the metadata in on the
   device as tokens are appended): the host tiers' contents differ from there on, and with
   them which calls find room. */
static void disk_used(const struct kvt_stats *st)
{
	if (!F.disk || !(F.record || F.compare) || F.diverged ||
	    (!st->disk_blocks_used && !st->disk_blocks_spilled))
		return;
	F.diverged = true;
	trace("  (the runs are compared no further: blocks in the spill file)");
}

/* A sequence id from one byte: mostly the slots', sometimes one never created. */
static int pick(uint8_t b)
{
	return b < 232 ? b % NSLOTS : NSLOTS + b % N_UNKNOWN;
}

static bool live(int slot)
{
	return slot < NSLOTS && F.s[slot].live;
}

/* The lost flag of every live sequence as the manager has it, and with preempted its
   preempted flag too (the scheduler preempts and resumes on its own). */
static void refresh(bool preempted)
{
	for (int i = 0; i < NSLOTS; i++) {
		struct kvt_seq_info info = {.size = sizeof(info)};

		if (!F.s[i].live)
			continue;
		CHECK(kvt_seq_info(F.m, slot_ids[i], &info) == 0);
		F.s[i].lost = info.lost != 0;
		if (preempted)
			F.s[i].preempted = info.preempted != 0;
	}
}

static void refresh_lost(void)
{
	refresh(false);
}

/* Holds a call's result to the contract: one that must fail (!ok) failed; one that may
   succeed failed only for a resource or a lost history (then the lost ones are read again).
   Whether it succeeded. */
static bool succeeded(bool ok, int rc)
{
	if (!ok) {
		CHECK_RC(rc < 0, rc);
		return false;
	}
	if (rc == -EBADMSG)
		refresh_lost();
	CHECK_RC(!rc || resource_error(rc) || rc == -EBADMSG, rc);
	return !rc;
}

/* What every sequence shows through the API equals the model: a failed call changed
   nothing, a successful one what it should. */
static void check_model(void)
{
	struct kvt_stats st = KVT_STATS_INIT;
	uint32_t n_live = 0;

	CHECK(kvt_manager_stats(F.m, &st) == 0);
	disk_used(&st);
	for (int i = 0; i < NSLOTS + (int)N_UNKNOWN; i++) {
		struct kvt_seq_info info = {.size = sizeof(info)};
		uint32_t n = 12345, most = 0, prefilled = 0, filled = UINT32_MAX;
		uint64_t blocks = 0;
		int rc;

		for (uint32_t l = 0; l < NL; l++) {
			rc = kvt_seq_tokens(F.m, id_of(i), l, &n);
			if (!live(i)) {
				CHECK_RC(rc == -ENOENT, rc);
				continue;
			}
			CHECK_RC(rc == 0 && n == F.s[i].tokens[l], rc);
			most = n > most ? n : most;
			prefilled += n > 0;
			blocks += (history(&F.s[i], l) + F.bt - 1) / F.bt * NKV;
			filled = history(&F.s[i], l) < filled ? history(&F.s[i], l) : filled;
		}
		rc = kvt_seq_info(F.m, id_of(i), &info);
		if (!live(i)) {
			CHECK_RC(rc == -ENOENT, rc);
			continue;
		}
		n_live++;
		CHECK_RC(rc == 0, rc);
		CHECK(info.size == sizeof(info));
		CHECK(info.prompt_tokens == F.s[i].prompt);
		CHECK(info.layers_prefilled == prefilled);
		CHECK(info.preempted == F.s[i].preempted);
		CHECK(info.tokens == most);
		CHECK(info.host_blocks == blocks);
		CHECK(info.filled_tokens == filled);
		CHECK(info.prefix_tokens == F.s[i].matched);
		CHECK(info.serial == F.s[i].serial);
		CHECK(info.disk_blocks <= info.host_blocks);
		CHECK(F.s[i].preempted
			      ? info.device_frames == 0
			      : info.device_frames == (uint64_t)prefilled * info.frames_per_layer);
		CHECK(info.lost == 0 || info.lost == -EBADMSG);
		CHECK(!F.s[i].lost || info.lost);
		CHECK(F.disk || info.lost == 0);
		trace("info %llu ws %llu step %llu disk %llu lost %d", (unsigned long long)id_of(i),
		      (unsigned long long)info.recall_ws_frames,
		      (unsigned long long)info.recall_step_frames,
		      (unsigned long long)info.disk_blocks, info.lost);
	}
	CHECK(st.live_seqs == n_live);
	CHECK(st.device_frames_used + st.device_frames_free == st.device_frames_total);
	CHECK(st.host_blocks_used + st.host_blocks_free == st.host_blocks_total);
	CHECK(st.recall_frames_used <= st.recall_frames_total);
	CHECK(st.disk_blocks_used <= st.disk_blocks_total);
	CHECK(F.disk || st.disk_blocks_total == 0);
	/* the figures both backends keep alike after the same calls (fuzz_api_cuda compares) */
	trace("stats device %llu/%llu recall %llu/%llu calls %llu lookups %llu hits %llu loads %llu "
	      "evictions %llu bytes %llu/%llu/%llu tokens %llu/%llu/%llu/%llu decode %llu saves %llu "
	      "pre %llu res %llu lost %llu",
	      (unsigned long long)st.device_frames_used, (unsigned long long)st.device_frames_total,
	      (unsigned long long)st.recall_frames_used, (unsigned long long)st.recall_frames_total,
	      (unsigned long long)st.recall_calls, (unsigned long long)st.recall_lookups,
	      (unsigned long long)st.recall_hits, (unsigned long long)st.recall_loads,
	      (unsigned long long)st.recall_evictions, (unsigned long long)st.bytes_h2d,
	      (unsigned long long)st.bytes_d2h, (unsigned long long)st.bytes_d2d,
	      (unsigned long long)st.tokens_saved, (unsigned long long)st.tokens_appended,
	      (unsigned long long)st.tokens_prompt, (unsigned long long)st.tokens_resident,
	      (unsigned long long)st.decode_calls, (unsigned long long)st.saves_submitted,
	      (unsigned long long)st.preemptions, (unsigned long long)st.resumes,
	      (unsigned long long)st.seqs_lost);
	trace("tiers host %llu/%llu disk %llu/%llu/%llu", (unsigned long long)st.host_blocks_used,
	      (unsigned long long)st.host_blocks_total, (unsigned long long)st.disk_blocks_used,
	      (unsigned long long)st.disk_blocks_spilled,
	      (unsigned long long)st.disk_blocks_fetched);
}

/* Reads one token and compares it with the model. Returns the call's result. */
static int read_check(int slot, uint32_t layer, uint32_t head, uint32_t pos)
{
	uint8_t k[HD * MAX_ESZ], v[HD * MAX_ESZ], ek[HD * MAX_ESZ], ev[HD * MAX_ESZ];
	const struct slot *s = &F.s[slot < NSLOTS ? slot : 0];
	bool valid = live(slot) && layer < NL && head < NKV && pos < s->tokens[layer];
	int rc = kvt_seq_read_token(F.m, id_of(slot), layer, head, pos, k, v);

	check_errno(rc);
	if (!valid) {
		CHECK_RC(rc < 0, rc);
		return rc;
	}
	if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(s->lost ? rc == -EBADMSG : resource_error(rc), rc);
		return rc;
	}
	token_row(s, layer, head, pos, 0, ek);
	token_row(s, layer, head, pos, 1, ev);
	if (memcmp(k, ek, HD * F.esz) || memcmp(v, ev, HD * F.esz)) {
		fprintf(stderr, "fuzz_api: seq %llu layer %u head %u pos %u reads back wrong\n",
			(unsigned long long)id_of(slot), layer, head, pos);
		die(__LINE__, "read_token not bit-exact", rc);
	}
	return rc;
}

static void read_all(int slot)
{
	for (uint32_t l = 0; l < NL; l++)
		for (uint32_t h = 0; h < NKV; h++)
			for (uint32_t p = 0; p < F.s[slot].tokens[l]; p++)
				if (read_check(slot, l, h, p))
					return;
}

/* Resident positions of (slot, layer, head) into pos[]; returns their count or -errno. */
static int resident(int slot, uint32_t layer, uint32_t head, int32_t *pos, uint32_t cap)
{
	uint32_t n = 0;
	int rc = kvt_seq_resident_positions(F.m, id_of(slot), layer, head, pos, cap, &n);

	check_errno(rc);
	if (rc)
		return rc;
	CHECK(n <= cap);
	for (uint32_t i = 0; i < n; i++) {
		CHECK(pos[i] >= 0 && (uint32_t)pos[i] < F.s[slot].tokens[layer]);
		CHECK(i == 0 || pos[i] > pos[i - 1]);
	}
	CHECK(!F.s[slot].preempted || n == 0);
	return (int)n;
}

/* ---- configuration ----------------------------------------------------------------------- */

static int make_manager(struct in *in)
{
	static const uint32_t dev_groups[] = {4, 7, 14, 48};
	static const uint32_t host_groups[] = {6, 14, 40, 160};
	static const uint32_t rc_blocks[] = {2, 5, 8, 24};
	static const uint32_t ws[] = {1, 4, 12, 64};
	/* sink, recent, top-K, obs window, pool kernel, block tokens */
	static const uint32_t shape[4][6] = {
		{4, 8, 8, 4, 3, 8},
		{0, 1, 0, 1, 1, 8},
		{3, 13, 5, 7, 5, 8},
		{4, 8, 8, 4, 3, 16},
	};
	static const uint32_t recall[] = {2, 2, 1, 0};
	struct kvt_config c = KVT_CONFIG_INIT;
	uint8_t a = u8(in), b = u8(in);
	const uint32_t *sh = shape[b & 3];
	uint64_t block_bytes, group_bytes;
	int rc;

	c.n_layers = NL;
	c.n_kv_heads = NKV;
	c.n_q_heads = NQ;
	c.head_dim = HD;
	c.dtype = (a >> 1 & 3) == 1   ? KVT_DTYPE_BF16
		  : (a >> 1 & 3) == 2 ? KVT_DTYPE_F16
				      : KVT_DTYPE_F32;
	c.sink_tokens = sh[0];
	c.recent_tokens = sh[1];
	c.topk_tokens = sh[2];
	c.obs_window = sh[3];
	c.pool_kernel = sh[4];
	c.block_tokens = sh[5];
	c.backend = F.cuda ? KVT_BACKEND_CUDA : KVT_BACKEND_HOST;
	c.save_threads = a & 1;
	c.staging_bytes = 4096;
	F.esz = c.dtype == KVT_DTYPE_F32 ? 4 : 2;
	F.bt = c.block_tokens;
	block_bytes = 2ull * c.block_tokens * HD * F.esz;
	group_bytes = block_bytes * NKV;
	c.recall_blocks = recall[b >> 2 & 3];
	c.recall_cache_bytes = rc_blocks[b >> 4 & 3] * block_bytes;
	c.ws_window = ws[b >> 6];
	c.device_bytes = dev_groups[a >> 3 & 3] * group_bytes + c.recall_cache_bytes;
	c.host_bytes = host_groups[a >> 5 & 3] * group_bytes;
	F.disk = a >> 7;
	if (F.disk) {
		c.spill_dir = spill_dir;
		c.disk_bytes = 64 << 10;
		c.disk_queue_depth = 8;
	}
	rc = kvt_manager_create(&c, &F.m);
	CHECK_RC(rc == 0, rc);
	CHECK(kvt_manager_config(F.m, &F.cfg) == 0);
	CHECK(F.cfg.backend == c.backend);
	return 0;
}

/* ---- the backend's memory -------------------------------------------------------------- */

/* The calls that take tensors, tables or selections in the backend's memory: host memory on
   the host backend; on the CUDA backend (fuzz_api_cuda) the test library's CUDA fixture
   (tests/lib/t_backend_cuda.c) passes device copies of the host buffers given here and reads
   back what the call wrote. n: the rows of a step's tensors (its batch). */
#ifdef FUZZ_API_CUDA
#define BE(call, ...) (F.cuda ? t_backend_cuda.call(__VA_ARGS__) : kvt_##call(__VA_ARGS__))
#define BE_STEP(call, m, layer, n, ...)                               \
	(F.cuda ? t_backend_cuda.call((m), (layer), (n), __VA_ARGS__) \
		: kvt_##call((m), (layer), __VA_ARGS__))
#else
#define BE(call, ...) kvt_##call(__VA_ARGS__)
#define BE_STEP(call, m, layer, n, ...) ((void)(n), kvt_##call((m), (layer), __VA_ARGS__))
#endif

/* Copies n bytes at a frame's address (kvt_seq_frames, kvt_seq_recall_view) into dst. */
static void frame_read(void *dst, uint64_t addr, size_t n)
{
#ifdef FUZZ_API_CUDA
	if (F.cuda) {
		t_backend_cuda.dev_read(dst, addr, n);
		return;
	}
#endif
	memcpy(dst, (const void *)(uintptr_t)addr, n);
}

/* kvt_seq_load_kv into host buffers (on the CUDA backend through device ones). */
static int be_load_kv(struct kvt_manager *m, uint64_t seq, uint32_t layer, uint32_t pos, uint32_t n,
		      void *k, void *v, void *stream)
{
#ifdef FUZZ_API_CUDA
	if (F.cuda)
		return t_backend_cuda.load_kv(m, seq, layer, pos, n, k, v, stream);
#endif
	return kvt_seq_load_kv(m, seq, layer, pos, n, k, v, stream);
}

/* ---- operations -------------------------------------------------------------------------- */

/* A sequence created in slot: its serial follows every earlier one's. */
static void note_created(int slot)
{
	struct kvt_seq_info info = {.size = sizeof(info)};

	CHECK(kvt_seq_info(F.m, slot_ids[slot], &info) == 0);
	CHECK(info.serial > F.serial);
	F.serial = F.s[slot].serial = info.serial;
}

static void op_create(struct in *in)
{
	static const uint32_t bad_prompt[] = {0, (uint32_t)INT32_MAX + 1, UINT32_MAX};
	int slot = pick(u8(in)) % NSLOTS; /* the unknown ids stay unknown */
	uint8_t p = u8(in);
	uint32_t prompt = p < 250 ? 1 + p % MAX_PROMPT : bad_prompt[p % 3];
	bool ok = !live(slot) && prompt >= 1 && prompt <= MAX_PROMPT;
	int rc = kvt_seq_create(F.m, id_of(slot), prompt);

	trace("create %llu prompt %u -> %d", (unsigned long long)id_of(slot), prompt, rc);
	check_errno(rc);
	if (!ok) {
		/* a live id with a bad prompt may be refused for either */
		CHECK_RC((live(slot) && rc == -EEXIST) ||
				 (prompt < 1 || prompt > MAX_PROMPT ? rc == -EINVAL : false),
			 rc);
		return;
	}
	CHECK_RC(rc == 0, rc);
	F.s[slot] = (struct slot){.live = true, .gen = ++F.gen, .prompt = prompt};
	note_created(slot);
}

static void op_destroy(struct in *in)
{
	int slot = pick(u8(in));
	int rc = kvt_seq_destroy(F.m, id_of(slot));

	trace("destroy %llu -> %d", (unsigned long long)id_of(slot), rc);
	check_errno(rc);
	CHECK_RC(live(slot) ? rc == 0 : rc == -ENOENT, rc);
	if (live(slot))
		F.s[slot].live = false;
}

/* kvt_prefill_layer of slot's layer with the model's rows, queries from seed (none with
   no_q), or no K with null_kv. */
static void run_prefill(int slot, uint32_t layer, uint8_t seed, bool no_q, bool null_kv)
{
	static uint8_t k[NKV * MAX_PROMPT * HD * MAX_ESZ], v[sizeof(k)];
	static uint8_t q[NQ * 8 * HD * MAX_ESZ];
	const struct slot *s = &F.s[slot < NSLOTS ? slot : 0];
	uint32_t L = s->prompt, ow = F.cfg.obs_window;
	bool selects =
		F.cfg.topk_tokens > 0 && L > F.cfg.sink_tokens + F.cfg.recent_tokens && L > ow;
	bool ok, must_fail;
	int rc;

	must_fail = !live(slot) || layer >= NL || s->preempted || null_kv ||
		    (live(slot) && s->tokens[layer]) || (no_q && selects);
	ok = !must_fail;
	if (live(slot) && L <= MAX_PROMPT) {
		for (uint32_t h = 0; h < NKV; h++)
			for (uint32_t p = 0; p < L; p++) {
				size_t off = ((size_t)h * L + p) * HD * F.esz;

				token_row(s, layer, h, p, 0, k + off);
				token_row(s, layer, h, p, 1, v + off);
			}
	}
	for (uint32_t i = 0; i < NQ * ow * HD; i++)
		put_val(q + i * F.esz, query_val(seed, i));
	rc = BE(prefill_layer, F.m, id_of(slot), layer, null_kv ? NULL : k, v, no_q ? NULL : q,
		NULL);
	trace("prefill %llu layer %u%s%s -> %d", (unsigned long long)id_of(slot), layer,
	      no_q ? " (no q)" : "", null_kv ? " (no k)" : "", rc);
	check_errno(rc);
	if (!ok) {
		CHECK_RC(rc < 0, rc);
	} else if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(resource_error(rc) || (s->lost && rc == -EBADMSG), rc);
	} else {
		F.s[slot].tokens[layer] = L;
		F.s[slot].filled[layer] = L;
	}
}

static void op_prefill(struct in *in)
{
	int slot = pick(u8(in));
	uint8_t b = u8(in), seed = u8(in);

	run_prefill(slot, b % (NL + 1), seed, b & 0x10, (b & 0xe0) == 0xe0);
}

/* ---- prefix reuse and prefill in pieces -------------------------------------------------- */

/* The rows kvt_seq_load_kv read of positions [pos, pos + n) of (slot, layer), k and v
   [NKV][n][HD], are those written there. */
static void loaded_check(int slot, uint32_t layer, uint32_t pos, uint32_t n, const uint8_t *k,
			 const uint8_t *v)
{
	for (uint32_t h = 0; h < NKV; h++)
		for (uint32_t x = 0; x < n; x++) {
			uint8_t ek[HD * MAX_ESZ], ev[HD * MAX_ESZ];
			size_t off = ((size_t)h * n + x) * HD * F.esz;

			token_row(&F.s[slot], layer, h, pos + x, 0, ek);
			token_row(&F.s[slot], layer, h, pos + x, 1, ev);
			if (memcmp(k + off, ek, HD * F.esz) || memcmp(v + off, ev, HD * F.esz)) {
				fprintf(stderr, "fuzz_api: seq %llu layer %u head %u pos %u\n",
					(unsigned long long)id_of(slot), layer, h, pos + x);
				die(__LINE__, "load_kv not bit-exact", 0);
			}
		}
}

/* A hash chain from one byte: one of four chains, chains 0 and 1 (and 2 and 3) sharing their
   first hash, so that a match may end early; hash_tokens one block (b's top bits 111: a size
   that is no multiple of it, which must be refused). Returns the number of hashes. */
static uint32_t chain_of(uint8_t b, uint64_t *hashes, uint32_t *ht)
{
	uint32_t chain = b & 3, n = (b >> 2) % (MAX_HASHES + 1);

	*ht = (b >> 5) == 7 ? F.bt + 1 : F.bt;
	for (uint32_t i = 0; i < n; i++)
		hashes[i] = mix(((uint64_t)(i ? chain : chain >> 1) << 40) ^ ((uint64_t)i << 8) ^
				*ht ^ 0xc4a1ull);
	return n;
}

/* kvt_seq_create_prefix: shares the cached run of its chain (never its last max(1,
   obs_window) tokens), or fails as kvt_seq_create does, or for a bad chain. */
static void op_create_prefix(struct in *in)
{
	int slot = pick(u8(in)) % NSLOTS;
	uint8_t p = u8(in), b = u8(in);
	uint32_t prompt = 1 + p % MAX_PROMPT, ht, matched = 12345;
	uint64_t hashes[MAX_HASHES];
	uint32_t nh = chain_of(b, hashes, &ht);
	uint32_t keep = F.cfg.obs_window > 1 ? F.cfg.obs_window : 1;
	bool ok = !live(slot) && ht % F.bt == 0 && nh * ht <= prompt;
	int rc = kvt_seq_create_prefix(F.m, id_of(slot), prompt, hashes, nh, ht, &matched);

	trace("create_prefix %llu prompt %u chain %u hashes %u tokens %u -> %d matched %u",
	      (unsigned long long)id_of(slot), prompt, b & 3, nh, ht, rc, rc ? 0 : matched);
	check_errno(rc);
	if (!ok) {
		CHECK_RC(rc < 0, rc);
		return;
	}
	if (rc) {
		CHECK_RC(resource_error(rc), rc);
		return;
	}
	CHECK(matched % ht == 0 && matched <= nh * ht);
	/* the rest to prefill: the last max(1, obs_window) tokens, the last one alone when the
	   prefill selects nothing */
	if (F.cfg.topk_tokens > 0 && prompt > F.cfg.sink_tokens + F.cfg.recent_tokens &&
	    prompt > F.cfg.obs_window)
		CHECK(matched + keep <= prompt);
	else
		CHECK(matched < prompt);
	F.s[slot] = (struct slot){.live = true,
				  .gen = ++F.gen,
				  .prompt = prompt,
				  .n_hashes = nh,
				  .hash_tokens = ht,
				  .matched = matched};
	note_created(slot);
	memcpy(F.s[slot].hashes, hashes, nh * sizeof(*hashes));
	for (uint32_t l = 0; l < NL; l++)
		F.s[slot].filled[l] = matched;
	/* the shared positions read as written by whoever cached them */
	for (uint32_t l = 0; l < NL && matched; l++) {
		uint8_t k[NKV * HD * MAX_ESZ], v[sizeof(k)];
		uint32_t pos = (p * 7u + l) % matched;

		rc = be_load_kv(F.m, id_of(slot), l, pos, 1, k, v, NULL);
		trace("  load_kv %llu layer %u pos %u -> %d", (unsigned long long)id_of(slot), l,
		      pos, rc);
		if (succeeded(true, rc))
			loaded_check(slot, l, pos, 1, k, v);
	}
}

/* kvt_prefix_match: changes nothing; a run of whole spans of the chain. */
static void op_prefix_match(struct in *in)
{
	uint8_t b = u8(in);
	uint64_t hashes[MAX_HASHES];
	uint32_t ht, tokens = 12345;
	uint32_t nh = chain_of(b, hashes, &ht);
	int rc = kvt_prefix_match(F.m, hashes, nh, ht, &tokens);

	trace("prefix_match chain %u hashes %u tokens %u -> %d matched %u", b & 3, nh, ht, rc,
	      rc ? 0 : tokens);
	check_errno(rc);
	if (ht % F.bt) {
		CHECK_RC(rc == -EINVAL, rc);
		return;
	}
	CHECK_RC(rc == 0, rc);
	CHECK(tokens % ht == 0 && tokens <= nh * ht);
}

/* kvt_prefill_chunk: positions [pos, pos + n) of a layer, pos its positions so far (a wrong
   one must be refused), the tensors from kv_from (pos: the chunk alone; 0: the layer from its
   start); the last chunk completes the layer as kvt_prefill_layer would. */
static void op_prefill_chunk(struct in *in)
{
	/* (room for a chunk that passes the prompt, pos + n <= prompt + 11: the CUDA fixture
	   copies the tensors to the device before the call refuses them) */
	static uint8_t k[NKV * (MAX_PROMPT + 16) * HD * MAX_ESZ], v[sizeof(k)];
	static uint8_t q[NQ * 8 * HD * MAX_ESZ];
	int slot = pick(u8(in));
	uint8_t b = u8(in), c = u8(in), seed = u8(in);
	uint32_t layer = b % (NL + 1);
	struct slot *s = &F.s[slot < NSLOTS ? slot : 0];
	uint32_t L = s->prompt, ow = F.cfg.obs_window;
	uint32_t have = live(slot) && layer < NL ? history(s, layer) : 0;
	uint32_t pos = (b & 0x60) == 0x60 ? have + 1 + c % 3 : have;
	uint32_t n = c >= 0xf8 ? 0 : pos < L && c < 0xc0 ? 1 + c % (L - pos) : 1 + c % 8;
	uint32_t kv_from = b & 0x10 ? 0 : b & 0x08 ? pos - (pos ? 1 : 0) : pos;
	bool no_q = b & 0x80, last = pos + n == L;
	bool selects =
		F.cfg.topk_tokens > 0 && L > F.cfg.sink_tokens + F.cfg.recent_tokens && L > ow;
	bool ok = live(slot) && layer < NL && !s->preempted && !s->tokens[layer] && n > 0 &&
		  pos == have && pos + n <= L && !(last && no_q && selects);
	int rc;

	if (live(slot) && pos + n <= L && L <= MAX_PROMPT)
		for (uint32_t h = 0; h < NKV; h++)
			for (uint32_t x = kv_from; x < pos + n; x++) {
				size_t off = ((size_t)h * (pos + n - kv_from) + x - kv_from) * HD *
					     F.esz;

				token_row(s, layer < NL ? layer : 0, h, x, 0, k + off);
				token_row(s, layer < NL ? layer : 0, h, x, 1, v + off);
			}
	for (uint32_t i = 0; i < NQ * ow * HD; i++)
		put_val(q + i * F.esz, query_val(seed, i));
	rc = BE(prefill_chunk, F.m, id_of(slot), layer, pos, n, kv_from, k, v, no_q ? NULL : q,
		NULL);
	trace("prefill_chunk %llu layer %u pos %u n %u from %u%s -> %d",
	      (unsigned long long)id_of(slot), layer, pos, n, kv_from, no_q ? " (no q)" : "", rc);
	check_errno(rc);
	if (!ok) {
		CHECK_RC(rc < 0, rc);
		return;
	}
	if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(resource_error(rc) || (s->lost && rc == -EBADMSG), rc);
		return;
	}
	s->filled[layer] = pos + n;
	if (last)
		s->tokens[layer] = L;
}

/* kvt_seq_load_kv: any run of a layer's history, prefilled or not, bit-exact. */
static void op_load_kv(struct in *in)
{
	static uint8_t k[NKV * MAX_TOK * HD * MAX_ESZ], v[sizeof(k)];
	int slot = pick(u8(in));
	uint8_t b = u8(in), c = u8(in);
	uint32_t layer = b % (NL + 1);
	const struct slot *s = &F.s[slot < NSLOTS ? slot : 0];
	uint32_t have = live(slot) && layer < NL ? history(s, layer) : 0;
	uint32_t pos = have ? c % have : c % 4, n = 1 + (b >> 2) % 16;
	bool ok;
	int rc;

	if (have && pos + n > have && !(b & 0x80))
		n = have - pos; /* mostly in range */
	ok = live(slot) && layer < NL && pos + n <= have && !s->lost;
	rc = be_load_kv(F.m, id_of(slot), layer, pos, n, k, v, NULL);
	trace("load_kv %llu layer %u pos %u n %u -> %d", (unsigned long long)id_of(slot), layer,
	      pos, n, rc);
	check_errno(rc);
	if (succeeded(ok, rc))
		loaded_check(slot, layer, pos, n, k, v);
}

/* A batch of ids for decode, recall and fetch; *valid: every id live, distinct, not lost. */
static uint32_t batch(struct in *in, int *slots, bool *distinct)
{
	uint8_t b = u8(in);
	uint32_t n = 1 + b % MAX_BATCH;

	*distinct = true;
	for (uint32_t i = 0; i < n; i++) {
		slots[i] = pick(u8(in));
		for (uint32_t j = 0; j < i; j++)
			*distinct &= slots[j] != slots[i];
	}
	return n;
}

/* Whether every sequence of the batch can take a decode/recall on layer. */
static bool batch_ready(const int *slots, uint32_t n, uint32_t layer, bool need_room)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct slot *s;

		if (!live(slots[i]) || layer >= NL)
			return false;
		s = &F.s[slots[i]];
		if (s->preempted || !s->tokens[layer] || (need_room && s->tokens[layer] >= MAX_TOK))
			return false;
	}
	return true;
}

/* The step calls (kvt_step_*) are the plain ones on the step's batch: a step call gives the
   plain call's result on the members' ids, or -EINVAL when no step is open, and changes what
   the plain call would. `step` selects the step call; slots and n are then the step's. */
static bool step_ok(bool step)
{
	return !step || F.step.open;
}

static void run_decode(uint32_t layer, const int *slots, uint32_t n, bool distinct, bool step)
{
	static uint8_t k[MAX_BATCH * NKV * HD * MAX_ESZ], v[sizeof(k)];
	uint64_t ids[MAX_BATCH];
	bool ok;
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = id_of(slots[i]);
		if (!live(slots[i]) || layer >= NL)
			continue;
		if (F.s[slots[i]].tokens[layer] >= MAX_TOK)
			return; /* the model's bound, not the library's */
		for (uint32_t h = 0; h < NKV; h++) {
			size_t off = ((size_t)i * NKV + h) * HD * F.esz;

			token_row(&F.s[slots[i]], layer, h, F.s[slots[i]].tokens[layer], 0,
				  k + off);
			token_row(&F.s[slots[i]], layer, h, F.s[slots[i]].tokens[layer], 1,
				  v + off);
		}
	}
	ok = step_ok(step) && distinct && batch_ready(slots, n, layer, true);
	rc = step ? BE_STEP(step_append, F.m, layer, n, k, v, NULL)
		  : BE(decode_append, F.m, layer, ids, n, k, v, NULL);
	trace("%s layer %u n %u first %llu -> %d", step ? "step_append" : "decode", layer, n,
	      n ? (unsigned long long)ids[0] : 0ull, rc);
	check_errno(rc);
	if (!ok) {
		CHECK_RC(rc < 0 && (step_ok(step) || rc == -EINVAL), rc);
	} else if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(resource_error(rc) || rc == -EBADMSG, rc);
	} else {
		for (uint32_t i = 0; i < n; i++)
			F.s[slots[i]].tokens[layer]++;
	}
}

static void op_decode(struct in *in)
{
	int slots[MAX_BATCH];
	uint32_t layer = u8(in) % (NL + 1);
	bool distinct;
	uint32_t n = batch(in, slots, &distinct);

	run_decode(layer, slots, n, distinct, false);
}

static void run_decode_recall(uint32_t layer, uint8_t seed, const int *slots, uint32_t n,
			      bool distinct, bool step)
{
	static uint8_t q[MAX_BATCH * NQ * HD * MAX_ESZ];
	uint64_t ids[MAX_BATCH];
	bool ok;
	int rc;

	for (uint32_t i = 0; i < n; i++)
		ids[i] = id_of(slots[i]);
	for (uint32_t i = 0; i < n * NQ * HD; i++)
		put_val(q + i * F.esz, query_val(seed, i));
	ok = step_ok(step) && distinct && batch_ready(slots, n, layer, false) &&
	     F.cfg.recall_blocks > 0;
	rc = step ? BE_STEP(step_recall, F.m, layer, n, q, NULL)
		  : BE(decode_recall, F.m, layer, ids, n, q, NULL);
	trace("%s layer %u n %u first %llu -> %d", step ? "step_recall" : "decode_recall", layer, n,
	      n ? (unsigned long long)ids[0] : 0ull, rc);
	check_errno(rc);
	if (!ok) {
		CHECK_RC(rc < 0 && (step_ok(step) || rc == -EINVAL), rc);
	} else {
		recall_done(rc);
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(!rc || rc == -ENOSPC || resource_error(rc) || rc == -EBADMSG, rc);
	}
}

static void op_decode_recall(struct in *in)
{
	int slots[MAX_BATCH];
	uint32_t layer = u8(in) % (NL + 1);
	uint8_t seed = u8(in);
	bool distinct;
	uint32_t n = batch(in, slots, &distinct);

	run_decode_recall(layer, seed, slots, n, distinct, false);
}

/* kvt_recall_blocks, or with dev kvt_recall_device_blocks (the selection in "device" memory,
   host memory on the host backend), or the step's call of either. A device selection naming
   a block past a member's history does not fail the call: that member's views read as stale
   (-ESTALE from kvt_attend) until it is recalled again, the others are recalled. */
static void run_recall_blocks(struct in *in, uint32_t layer, uint32_t r, const int *slots,
			      uint32_t n, bool distinct, bool step, bool dev)
{
	static uint32_t blocks[MAX_BATCH * NKV * 3];
	uint64_t ids[MAX_BATCH];
	bool ok, in_range = true, bad[MAX_BATCH] = {false};
	const char *what = dev ? (step ? "step_recall_device_blocks" : "recall_device_blocks")
			       : (step ? "step_recall_blocks" : "recall_blocks");
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = id_of(slots[i]);
		for (uint32_t j = 0; j < NKV * r; j++) {
			uint8_t b = u8(in);
			uint32_t blk = b == 255 ? UINT32_MAX : b % 32;
			uint32_t have = live(slots[i]) && layer < NL
						? (F.s[slots[i]].tokens[layer] + F.bt - 1) / F.bt
						: 0;

			blocks[i * NKV * r + j] = blk;
			if (blk != UINT32_MAX && blk >= have)
				bad[i] = true;
		}
		in_range = in_range && !bad[i];
	}
	ok = step_ok(step) && distinct && r > 0 && (in_range || dev) &&
	     batch_ready(slots, n, layer, false);
	if (dev)
		rc = step ? BE_STEP(step_recall_device_blocks, F.m, layer, n, blocks, r, NULL)
			  : BE(recall_device_blocks, F.m, layer, ids, n, blocks, r, NULL);
	else
		rc = step ? kvt_step_recall_blocks(F.m, layer, blocks, r, NULL)
			  : kvt_recall_blocks(F.m, layer, ids, n, blocks, r, NULL);
	trace("%s layer %u n %u r %u first %llu -> %d", what, layer, n, r,
	      n ? (unsigned long long)ids[0] : 0ull, rc);
	check_errno(rc);
	if (ok)
		recall_done(rc);
	if (!ok) {
		CHECK_RC(rc < 0 && (step_ok(step) || rc == -EINVAL), rc);
	} else if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(rc == -ENOSPC || resource_error(rc) || rc == -EBADMSG, rc);
	} else if (dev) {
		for (uint32_t i = 0; i < n; i++) {
			float q[NQ * HD] = {0}, out[NQ * HD];

			if (!bad[i])
				continue;
			rc = kvt_attend(F.m, ids[i], layer, q, out);
			trace("  attend %llu (a selection past its history) -> %d",
			      (unsigned long long)ids[i], rc);
			CHECK_RC(rc == -ESTALE, rc);
		}
	}
}

/* A plain call of run_recall_blocks: its layer, r and batch from the input. */
static void recall_blocks_op(struct in *in, bool dev)
{
	int slots[MAX_BATCH];
	uint32_t layer = u8(in) % (NL + 1);
	uint32_t r = u8(in) % 4; /* 0: invalid */
	bool distinct;
	uint32_t n = batch(in, slots, &distinct);

	run_recall_blocks(in, layer, r, slots, n, distinct, false, dev);
}

static void op_recall_blocks(struct in *in)
{
	recall_blocks_op(in, false);
}

static void op_recall_device_blocks(struct in *in)
{
	recall_blocks_op(in, true);
}

/* ---- decode steps ----------------------------------------------------------------------- */

/* kvt_step_begin over a batch that may repeat or not know an id, name one preempted or lost:
   it opens the step when every member is live, named once, not preempted and not lost
   (failing then only for a resource), and otherwise fails leaving the open step as it was. */
static void op_step_begin(struct in *in)
{
	int slots[MAX_BATCH];
	uint64_t ids[MAX_BATCH];
	bool distinct = true, ok;
	uint8_t mode = u8(in);
	uint32_t n = 0;
	int rc;

	if (mode & 0x80) {
		/* up to 1 + mode % MAX_BATCH live sequences not preempted, from a slot on: a
		   batch that opens (an input of random ids rarely does) */
		uint32_t want = 1 + mode % MAX_BATCH, at = u8(in);

		for (uint32_t k = 0; k < NSLOTS && n < want; k++) {
			int slot = (int)((at + k) % NSLOTS);

			if (live(slot) && !F.s[slot].preempted)
				slots[n++] = slot;
		}
	} else {
		n = batch(in, slots, &distinct);
	}
	ok = distinct && n > 0;
	for (uint32_t i = 0; i < n; i++) {
		ids[i] = id_of(slots[i]);
		ok &= live(slots[i]) && !F.s[slots[i]].preempted && !F.s[slots[i]].lost;
	}
	rc = kvt_step_begin(F.m, ids, n);
	trace("step_begin n %u first %llu -> %d", n, n ? (unsigned long long)ids[0] : 0ull, rc);
	check_errno(rc);
	if (!succeeded(ok, rc))
		return;
	F.step.open = true;
	F.step.n = n;
	memcpy(F.step.slots, slots, n * sizeof(*slots));
}

static void op_step_append(struct in *in)
{
	uint32_t layer = u8(in) % (NL + 1);

	run_decode(layer, F.step.slots, F.step.open ? F.step.n : 0, true, true);
}

static void op_step_recall(struct in *in)
{
	uint32_t layer = u8(in) % (NL + 1);
	uint8_t seed = u8(in);

	run_decode_recall(layer, seed, F.step.slots, F.step.open ? F.step.n : 0, true, true);
}

static void op_step_recall_blocks(struct in *in)
{
	uint32_t layer = u8(in) % (NL + 1);
	uint32_t r = u8(in) % 4; /* 0: invalid */

	run_recall_blocks(in, layer, r, F.step.slots, F.step.open ? F.step.n : 0, true, true,
			  false);
}

static void attend_rows_check(uint32_t layer, const int *slots, uint32_t n, const uint8_t *q,
			      const uint8_t *out, const float *lse, const char *what);

/* kvt_step_tables, then kvt_attend_tables over what it wrote: the same out and log-sum-exp,
   bit for bit, as kvt_attend_batch on the step's batch (the host backend runs both over the
   same rows), and each member's out as the reference's; fails as the step's calls do, or
   -ENOSPC when a row passes the tables' capacities. */
#define TF 64 /* max_frames: a layer's blocks, with room to spare */
#define TR 8  /* max_recall: a view's blocks (r <= 3) */
#define TB_ROWS (MAX_BATCH * NKV)

/* The buffers of the attention tables the step's operations have written (tables_buf). */
static struct {
	uint32_t n_batch, n_tok[TB_ROWS], frames[TB_ROWS * TF], n_rec[TB_ROWS], rec[TB_ROWS * TR],
		rec_tok[TB_ROWS * TR];
	uint64_t skip[TB_ROWS * TR];
} TB;

/* Tables of MAX_BATCH rows over TB's buffers. */
static struct kvt_attn_tables tables_buf(void)
{
	return (struct kvt_attn_tables){
		.size = sizeof(struct kvt_attn_tables),
		.max_batch = MAX_BATCH,
		.max_frames = TF,
		.max_recall = TR,
		.n_batch = &TB.n_batch,
		.n_tokens = TB.n_tok,
		.frames = TB.frames,
		.n_recall = TB.n_rec,
		.recall = TB.rec,
		.recall_tokens = TB.rec_tok,
		.recall_skip = TB.skip,
	};
}

static void op_step_tables(struct in *in)
{
	static uint8_t q[MAX_BATCH * NQ * HD * MAX_ESZ], out_t[sizeof(q)], out_b[sizeof(q)];
	float lse_t[MAX_BATCH * NQ], lse_b[MAX_BATCH * NQ];
	struct kvt_attn_tables t = tables_buf();
	uint32_t layer = u8(in) % (NL + 1), n = F.step.open ? F.step.n : 0;
	uint8_t seed = u8(in);
	uint64_t ids[MAX_BATCH];
	bool ok = F.step.open && layer < NL && batch_ready(F.step.slots, n, layer, false);
	int rc;

	for (uint32_t i = 0; i < n; i++)
		ids[i] = id_of(F.step.slots[i]);
	rc = BE(step_tables, F.m, layer, &t, NULL);
	trace("step_tables layer %u n %u -> %d", layer, n, rc);
	check_errno(rc);
	if (!ok) {
		CHECK_RC(rc < 0 && (F.step.open || rc == -EINVAL), rc);
		return;
	}
	if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(rc == -ESTALE || rc == -ENOSPC || resource_error(rc) || rc == -EBADMSG,
			 rc);
		return;
	}
	CHECK(TB.n_batch == n);
	for (uint32_t i = 0; i < n * NQ * HD; i++) /* every member asks with the same queries */
		put_val(q + i * F.esz, query_val(seed, i % (NQ * HD)));
#ifdef FUZZ_API_CUDA
	rc = F.cuda ? t_backend_cuda.attend_tables(F.m, &t, q, out_t, lse_t, 0, NULL)
		    : kvt_attend_tables(F.m, &t, q, out_t, lse_t, NULL, 0, NULL);
#else
	rc = kvt_attend_tables(F.m, &t, q, out_t, lse_t, NULL, 0, NULL);
#endif
	trace("attend_tables -> %d", rc);
	CHECK_RC(rc == 0, rc);
	rc = BE(attend_batch, F.m, layer, ids, n, q, out_b, lse_b, NULL);
	CHECK_RC(rc == 0, rc);
	attend_rows_check(layer, F.step.slots, n, q, out_t, lse_t, "attend_tables");
#ifdef FUZZ_API_CUDA
	/* The kernels split a row's tokens by the tables' capacities here, by the batch's longest
	   row in kvt_attend_batch: the parts merge in another order (kvtier.h), so the two agree
	   within f32 rounding, and each is held to the model. */
	if (F.cuda) {
		for (uint32_t x = 0; x < n * NQ; x++)
			CHECK(fabsf(lse_t[x] - lse_b[x]) <= 1e-5f * (1.0f + fabsf(lse_b[x])));
		attend_rows_check(layer, F.step.slots, n, q, out_b, lse_b, "attend_batch");
		return;
	}
#endif
	CHECK(memcmp(out_t, out_b, (size_t)n * NQ * HD * F.esz) == 0);
	CHECK(memcmp(lse_t, lse_b, (size_t)n * NQ * sizeof(*lse_t)) == 0);
}

/* The paged form p of the open step's layer `layer` (written, checked against the tables)
   read where it says, over the pool of kvt_manager_pool: every resident page a block of the
   device tier, every recalled token a row of a recall frame, and that row, K and V, the
   token's, the blocks as each member's recall view names them. */
static void paged_rows_check(uint32_t layer, const struct kvt_paged_tables *p)
{
	struct kvt_pool_info pool;
	struct kvt_recall_ref refs[TR];
	uint8_t got[HD * MAX_ESZ], want[HD * MAX_ESZ];
	size_t rb = (size_t)HD * F.esz;
	int rc = kvt_manager_pool(F.m, &pool);

	CHECK_RC(rc == 0, rc);
	CHECK(pool.row_bytes == rb && pool.block_tokens == F.bt);
	for (uint32_t i = 0; i < F.step.n; i++) {
		int slot = F.step.slots[i];

		for (uint32_t h = 0; h < NKV; h++) {
			uint32_t r = i * NKV + h, nv = 0;
			int32_t e = p->r_indptr[r];

			for (int32_t x = p->indptr[r]; x < p->indptr[r + 1]; x++)
				CHECK(p->indices[x] >= 0 &&
				      (uint64_t)p->indices[x] < pool.first_recall);
			rc = kvt_seq_recall_view(F.m, id_of(slot), layer, h, refs, TR, &nv);
			CHECK_RC(rc == 0, rc);
			CHECK(nv == TB.n_rec[r]);
			for (uint32_t j = 0; j < nv; j++) {
				CHECK(refs[j].frame ==
				      pool.base + (uint64_t)TB.rec[r * TR + j] * pool.block_bytes);
				for (uint32_t w = 0; w < refs[j].n_valid; w++) {
					uint64_t x, at;

					if (refs[j].resident >> w & 1)
						continue;
					CHECK(e < p->r_indptr[r + 1]);
					x = (uint64_t)p->r_indices[e++];
					CHECK(x >= pool.first_recall * 2 * F.bt &&
					      x < pool.n_blocks * 2 * F.bt);
					at = pool.base + x * pool.row_bytes;
					for (int kv = 0; kv < 2; kv++) {
						frame_read(got, at + (kv ? pool.v_offset : 0), rb);
						token_row(&F.s[slot], layer, h,
							  refs[j].block * F.bt + w, kv, want);
						if (memcmp(got, want, rb))
							die(__LINE__,
							    "a paged recalled row differs from the history",
							    0);
					}
				}
			}
			CHECK(e == p->r_indptr[r + 1]);
		}
	}
}

/* kvt_step_paged after kvt_step_tables on the same layer, both with every buffer poisoned
   first: the paged form is the tables' (kvtier.h): row r's pages are its first frames, as many
   as its tokens fill, the last one holding what is left; its recalled tokens are each recalled
   block's rows below the block's count whose skip bit is clear, x = block * 2 * block_tokens +
   row, in the tables' order; the rows past the batch, up to max_batch, empty. Capacities
   from the input: too small a max_batch, max_pages or max_tokens fails with -ENOSPC, and a
   failure writes nothing. */
#define PG_ROWS TB_ROWS
#define PG_PAGES (PG_ROWS * TF)
#define PG_TOKENS (PG_ROWS * TR * 16) /* block_tokens <= 16 */
static void op_step_paged(struct in *in)
{
	static int32_t indptr[PG_ROWS + 1], indices[PG_PAGES], last[PG_ROWS], r_indptr[PG_ROWS + 1],
		r_indices[PG_TOKENS];
	const int32_t poison = 0x7f7f7f7f;
	const uint32_t *n_tok = TB.n_tok, *frames = TB.frames, *n_rec = TB.n_rec, *rec = TB.rec,
		       *rec_tok = TB.rec_tok;
	const uint64_t *skip = TB.skip;
	struct kvt_attn_tables t = tables_buf();
	uint32_t layer = u8(in) % (NL + 1), n = F.step.open ? F.step.n : 0;
	uint8_t cb = u8(in), cp = u8(in), ct = u8(in);
	struct kvt_paged_tables p = {
		.size = sizeof(p),
		.max_batch = cb & 0x80 ? (cb & 0x7f) % (MAX_BATCH + 1) : MAX_BATCH,
		.max_pages = cp & 0x80 ? cp & 0x1f : PG_PAGES,
		.max_tokens = ct & 0x80 ? ct & 0x3f : PG_TOKENS,
		.indptr = indptr,
		.indices = indices,
		.last_page_len = last,
		.r_indptr = r_indptr,
		.r_indices = r_indices,
	};
	bool ok = F.step.open && layer < NL && batch_ready(F.step.slots, n, layer, false);
	uint32_t pages = 0, tokens = 0, rows = n * NKV;
	int rt, rc, want;

	rt = BE(step_tables, F.m, layer, &t, NULL);
	memset(indptr, 0x7f, sizeof(indptr));
	memset(indices, 0x7f, sizeof(indices));
	memset(last, 0x7f, sizeof(last));
	memset(r_indptr, 0x7f, sizeof(r_indptr));
	memset(r_indices, 0x7f, sizeof(r_indices));
	rc = BE(step_paged, F.m, layer, &p, NULL);
	trace("step_paged layer %u n %u max %u/%u/%u -> %d (tables %d)", layer, n, p.max_batch,
	      p.max_pages, p.max_tokens, rc, rt);
	check_errno(rc);
	if (rc) { /* nothing written */
		if (rc == -EBADMSG)
			refresh_lost();
		for (uint32_t r = 0; r <= PG_ROWS; r++)
			CHECK(indptr[r] == poison && r_indptr[r] == poison &&
			      (r == PG_ROWS || last[r] == poison));
		for (uint32_t x = 0; x < PG_PAGES; x++)
			CHECK(indices[x] == poison);
		for (uint32_t x = 0; x < PG_TOKENS; x++)
			CHECK(r_indices[x] == poison);
	}
	if (!ok) {
		CHECK_RC(rc < 0 && (F.step.open || rc == -EINVAL), rc);
		return;
	}
	if (rt) {
		/* the tables' own capacities aside, the member's error comes first where the
		   batch fits (tables_check, the same checks in the same order) */
		if (rt == -ENOSPC)
			CHECK_RC(rc == 0 || rc == -ENOSPC || resource_error(rc), rc);
		else if (p.max_batch >= n)
			CHECK_RC(rc == rt || resource_error(rc), rc);
		else
			CHECK_RC(rc == -ENOSPC, rc);
		return;
	}
	CHECK(TB.n_batch == n);
	for (uint32_t r = 0; r < rows; r++) {
		pages += (n_tok[r] + F.bt - 1) / F.bt;
		for (uint32_t j = 0; j < n_rec[r]; j++)
			for (uint32_t w = 0; w < rec_tok[r * TR + j]; w++)
				tokens += !(skip[r * TR + j] >> w & 1);
	}
	want = p.max_batch < n || pages > p.max_pages || tokens > p.max_tokens ? -ENOSPC : 0;
	CHECK_RC(rc == want || resource_error(rc), rc);
	if (rc)
		return;
	trace("  pages %u tokens %u", pages, tokens);
	CHECK(indptr[0] == 0 && r_indptr[0] == 0);
	for (uint32_t r = 0, pg_at = 0, tk_at = 0; r < p.max_batch * NKV; r++) {
		uint32_t tk = r < rows ? n_tok[r] : 0, pg = (tk + F.bt - 1) / F.bt;

		for (uint32_t e = 0; e < pg; e++) {
			CHECK(frames[r * TF + e] != UINT32_MAX);
			CHECK(indices[pg_at++] == (int32_t)frames[r * TF + e]);
		}
		CHECK(last[r] == (int32_t)(pg ? tk - (pg - 1) * F.bt : 0));
		for (uint32_t j = 0; r < rows && j < n_rec[r]; j++)
			for (uint32_t w = 0; w < rec_tok[r * TR + j]; w++)
				if (!(skip[r * TR + j] >> w & 1))
					CHECK(r_indices[tk_at++] ==
					      (int32_t)(rec[r * TR + j] * 2 * F.bt + w));
		CHECK(indptr[r + 1] == (int32_t)pg_at && r_indptr[r + 1] == (int32_t)tk_at);
	}
	paged_rows_check(layer, &p);
}

/* kvt_step_end: 0 with a step open (then none is), -EALREADY without. */
static void op_step_end(struct in *in)
{
	int rc = kvt_step_end(F.m);

	(void)in;
	trace("step_end -> %d", rc);
	CHECK_RC(F.step.open ? rc == 0 : rc == -EALREADY, rc);
	F.step.open = false;
}

static void op_preempt(struct in *in)
{
	int slot = pick(u8(in));
	int rc = kvt_seq_preempt(F.m, id_of(slot));

	trace("preempt %llu -> %d", (unsigned long long)id_of(slot), rc);
	check_errno(rc);
	if (!live(slot)) {
		CHECK_RC(rc == -ENOENT, rc);
	} else if (F.s[slot].preempted) {
		CHECK_RC(rc == -EALREADY || (F.s[slot].lost && rc == -EBADMSG), rc);
	} else if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(F.s[slot].lost && rc == -EBADMSG, rc);
	} else {
		F.s[slot].preempted = true;
	}
}

static void op_resume(struct in *in)
{
	int slot = pick(u8(in));
	int rc = kvt_seq_resume(F.m, id_of(slot), NULL);

	trace("resume %llu -> %d", (unsigned long long)id_of(slot), rc);
	check_errno(rc);
	if (!live(slot)) {
		CHECK_RC(rc == -ENOENT, rc);
	} else if (!F.s[slot].preempted) {
		CHECK_RC(rc == -EALREADY || (F.s[slot].lost && rc == -EBADMSG), rc);
	} else if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(resource_error(rc) || (F.s[slot].lost && rc == -EBADMSG), rc);
	} else {
		F.s[slot].preempted = false;
	}
}

static void op_read(struct in *in)
{
	int slot = pick(u8(in));
	uint8_t b = u8(in);
	uint16_t p = u16(in);
	uint32_t layer = b % (NL + 1), head = (b >> 2) % (NKV + 1);
	uint32_t have = live(slot) && layer < NL ? F.s[slot].tokens[layer] : 0;
	uint32_t pos = p < 0xff00 ? p % (have + 2) : UINT32_MAX - (p & 0xff);

	trace("read %llu layer %u head %u pos %u", (unsigned long long)id_of(slot), layer, head,
	      pos);
	read_check(slot, layer, head, pos);
}

static void op_read_seq(struct in *in)
{
	int slot = pick(u8(in)) % NSLOTS;

	trace("read all of %llu", (unsigned long long)id_of(slot));
	if (live(slot))
		read_all(slot);
}

/* Positions recalled for (slot, layer, head) by its view, checking each frame's rows. */
static int recalled(int slot, uint32_t layer, uint32_t head, int32_t *pos, uint32_t cap,
		    uint32_t *n_pos)
{
	struct kvt_recall_ref refs[32];
	uint8_t row[HD * MAX_ESZ];
	uint32_t n = 0;
	size_t rb = (size_t)HD * F.esz;
	int rc = kvt_seq_recall_view(F.m, id_of(slot), layer, head, refs, 32, &n);

	check_errno(rc);
	*n_pos = 0;
	if (rc)
		return rc;
	CHECK(n <= 32 && n <= 3);
	for (uint32_t i = 0; i < n; i++) {
		uint8_t frame[2 * 16 * HD * MAX_ESZ]; /* K then V rows, up to 16 tokens a block */

		CHECK(F.bt <= 16);
		frame_read(frame, refs[i].frame, 2 * (size_t)F.bt * rb);

		CHECK(i == 0 || refs[i].block > refs[i - 1].block);
		CHECK(refs[i].n_valid >= 1 && refs[i].n_valid <= F.bt);
		CHECK((uint64_t)refs[i].block * F.bt + refs[i].n_valid <= F.s[slot].tokens[layer]);
		for (uint32_t t = 0; t < refs[i].n_valid; t++) {
			uint32_t p = refs[i].block * F.bt + t;

			token_row(&F.s[slot], layer, head, p, 0, row);
			if (memcmp(frame + t * rb, row, rb))
				die(__LINE__, "recalled K row differs from the history", 0);
			token_row(&F.s[slot], layer, head, p, 1, row);
			if (memcmp(frame + (F.bt + t) * rb, row, rb))
				die(__LINE__, "recalled V row differs from the history", 0);
			if (!(refs[i].resident >> t & 1) && *n_pos < cap)
				pos[(*n_pos)++] = (int32_t)p;
		}
	}
	return 0;
}

static void op_view(struct in *in)
{
	int32_t pos[64];
	uint32_t n;
	int slot = pick(u8(in)), rc;
	uint8_t b = u8(in);
	uint32_t layer = b % (NL + 1), head = (b >> 2) % (NKV + 1);
	bool valid = live(slot) && layer < NL && head < NKV;

	if (!valid || b >= 0xf0) { /* the argument checks, with a small capacity too */
		struct kvt_recall_ref r;

		rc = kvt_seq_recall_view(F.m, id_of(slot), layer, head, &r, b & 1, &n);
		trace("recall_view (args) %llu layer %u head %u -> %d",
		      (unsigned long long)id_of(slot), layer, head, rc);
		check_errno(rc);
		CHECK_RC(valid || rc < 0, rc);
		return;
	}
	rc = recalled(slot, layer, head, pos, 64, &n);
	trace("recall_view %llu layer %u head %u -> %d", (unsigned long long)id_of(slot), layer,
	      head, rc);
	if (F.s[slot].preempted || !F.s[slot].tokens[layer])
		CHECK_RC(rc < 0, rc);
}

static void op_resident(struct in *in)
{
	int32_t pos[MAX_TOK];
	int slot = pick(u8(in));
	uint8_t b = u8(in);
	uint32_t layer = b % (NL + 1), head = (b >> 2) % (NKV + 1);
	bool valid = live(slot) && layer < NL && head < NKV && F.s[slot].tokens[layer];
	uint32_t cap = b & 0x80 ? b & 0x1f : MAX_TOK, n = 0;
	int rc = kvt_seq_resident_positions(F.m, id_of(slot), layer, head, cap ? pos : NULL, cap,
					    &n);

	trace("resident %llu layer %u head %u cap %u -> %d n %u", (unsigned long long)id_of(slot),
	      layer, head, cap, rc, n);
	check_errno(rc);
	if (!valid) {
		CHECK_RC(rc < 0, rc);
		return;
	}
	CHECK_RC(rc == 0 || (rc == -ENOSPC && n > cap), rc);
	if (!rc)
		CHECK(resident(slot, layer, head, pos, MAX_TOK) == (int)n);
}

/* Every resident position's rows are in some slot of the frames, and the slot count is the
   resident count. */
static void op_frames(struct in *in)
{
	uint64_t frames[16];
	static uint8_t fr[16][2 * 16 * HD * MAX_ESZ];
	int32_t pos[MAX_TOK];
	uint8_t k[HD * MAX_ESZ], v[HD * MAX_ESZ];
	int slot = pick(u8(in));
	uint8_t b = u8(in);
	uint32_t layer = b % (NL + 1), head = (b >> 2) % (NKV + 1);
	bool valid = live(slot) && layer < NL && head < NKV && F.s[slot].tokens[layer] &&
		     !F.s[slot].preempted;
	uint32_t cap = b & 0x80 ? b & 3 : 16, nf = 0, ns = 0;
	size_t rb = (size_t)HD * F.esz;
	int rc = kvt_seq_frames(F.m, id_of(slot), layer, head, cap ? frames : NULL, cap, &nf, &ns);
	int nres;

	trace("frames %llu layer %u head %u cap %u -> %d", (unsigned long long)id_of(slot), layer,
	      head, cap, rc);
	check_errno(rc);
	if (!valid) {
		CHECK_RC(rc < 0, rc);
		return;
	}
	CHECK_RC(rc == 0 || (rc == -ENOSPC && nf > cap), rc);
	if (rc)
		return;
	CHECK(ns <= (uint64_t)nf * F.bt);
	nres = resident(slot, layer, head, pos, MAX_TOK);
	CHECK_RC(nres >= 0 && (uint32_t)nres == ns, nres);
	CHECK(F.bt <= 16 && nf <= 16);
	for (uint32_t i = 0; i < nf; i++) /* each frame: K then V rows, up to 16 tokens */
		frame_read(fr[i], frames[i], 2 * (size_t)F.bt * rb);
	for (int i = 0; i < nres; i++) {
		bool found = false;

		token_row(&F.s[slot], layer, head, (uint32_t)pos[i], 0, k);
		token_row(&F.s[slot], layer, head, (uint32_t)pos[i], 1, v);
		for (uint32_t sl = 0; sl < ns && !found; sl++) {
			const uint8_t *f = fr[sl / F.bt];
			uint32_t r = sl % F.bt;

			found = !memcmp(f + r * rb, k, rb) && !memcmp(f + (F.bt + r) * rb, v, rb);
		}
		if (!found) {
			fprintf(stderr,
				"fuzz_api: resident position %d of seq %llu layer %u head "
				"%u is in no slot\n",
				pos[i], (unsigned long long)id_of(slot), layer, head);
			die(__LINE__, "frames do not hold the resident rows", 0);
		}
	}
}

static double to_double(const uint8_t *p)
{
	float f;
	uint32_t b = 0;
	uint16_t h;

	switch (F.cfg.dtype) {
	case KVT_DTYPE_F32:
		memcpy(&f, p, 4);
		return f;
	case KVT_DTYPE_BF16:
		memcpy(&b, p, 2);
		b <<= 16;
		memcpy(&f, &b, 4);
		return f;
	case KVT_DTYPE_F16:
		memcpy(&h, p, 2);
		if (!(h & 0x7fff))
			return 0.0;
		return ldexp(1.0 + (h & 0x3ff) / 1024.0, ((h >> 10) & 0x1f) - 15) *
		       (h & 0x8000 ? -1.0 : 1.0);
	}
	return 0.0;
}

/* Checks one sequence's attention out ([NQ][HD]) and, when lse is not NULL, its log-sum-exp
   ([NQ]) for queries q ([NQ][HD]) against a softmax in double over its resident plus
   recalled (non-resident) tokens, within tol (relative, and absolute near 0). */
static void attend_check(int slot, uint32_t layer, const float *q, const double *out,
			 const double *lse, double tol, const char *what)
{
	for (uint32_t h = 0; h < NKV; h++) {
		int32_t pos[MAX_TOK + 64];
		uint8_t kr[HD * MAX_ESZ], vr[HD * MAX_ESZ];
		uint32_t nrec = 0;
		int nres = resident(slot, layer, h, pos, MAX_TOK);
		int rc;

		CHECK_RC(nres >= 0, nres);
		rc = recalled(slot, layer, h, pos + nres, 64, &nrec);
		CHECK_RC(rc == 0, rc);
		for (uint32_t g = h * (NQ / NKV); g < (h + 1) * (NQ / NKV); g++) {
			double logit[MAX_TOK + 64], mx = -INFINITY, sum = 0, ref[HD] = {0};
			uint32_t n = (uint32_t)nres + nrec;

			for (uint32_t t = 0; t < n; t++) {
				double dot = 0;

				token_row(&F.s[slot], layer, h, (uint32_t)pos[t], 0, kr);
				for (uint32_t d = 0; d < HD; d++)
					dot += (double)q[g * HD + d] * to_double(kr + d * F.esz);
				logit[t] = dot / sqrt((double)HD);
				mx = logit[t] > mx ? logit[t] : mx;
			}
			for (uint32_t t = 0; t < n; t++) {
				double w = exp(logit[t] - mx);

				sum += w;
				token_row(&F.s[slot], layer, h, (uint32_t)pos[t], 1, vr);
				for (uint32_t d = 0; d < HD; d++)
					ref[d] += w * to_double(vr + d * F.esz);
			}
			for (uint32_t d = 0; d < HD; d++) {
				double r = n ? ref[d] / sum : 0.0, o = out[g * HD + d];

				if (!(fabs(o - r) <= tol + tol * fabs(r))) {
					fprintf(stderr,
						"fuzz_api: %s seq %llu layer %u q head %u dim %u: "
						"%.9g, reference %.9g over %u tokens\n",
						what, (unsigned long long)id_of(slot), layer, g, d,
						o, r, n);
					die(__LINE__, "attention differs from the reference", 0);
				}
			}
			if (lse) {
				double r = n ? mx + log(sum) : -INFINITY;
				bool same = n ? fabs(lse[g] - r) <= 1e-3 + 1e-3 * fabs(r)
					      : lse[g] == -INFINITY;

				if (!same) {
					fprintf(stderr,
						"fuzz_api: %s seq %llu layer %u q head %u: lse %.9g, "
						"reference %.9g over %u tokens\n",
						what, (unsigned long long)id_of(slot), layer, g,
						lse[g], r, n);
					die(__LINE__, "log-sum-exp differs from the reference", 0);
				}
			}
		}
	}
}

static void op_attend(struct in *in)
{
	float q[NQ * HD], out[NQ * HD];
	double o[NQ * HD];
	int slot = pick(u8(in));
	uint8_t b = u8(in), seed = u8(in);
	uint32_t layer = b % (NL + 1);
	bool valid = live(slot) && layer < NL && F.s[slot].tokens[layer] && !F.s[slot].preempted;
	int rc;

	for (uint32_t i = 0; i < NQ * HD; i++)
		q[i] = query_val(seed, i);
	rc = kvt_attend(F.m, id_of(slot), layer, q, out);
	trace("attend %llu layer %u -> %d", (unsigned long long)id_of(slot), layer, rc);
	check_errno(rc);
	if (!valid) {
		CHECK_RC(rc < 0, rc);
		return;
	}
	if (rc) {
		CHECK_RC(rc == -ESTALE || resource_error(rc) || (F.s[slot].lost && rc == -EBADMSG),
			 rc);
		return;
	}
	for (uint32_t i = 0; i < NQ * HD; i++)
		o[i] = out[i];
	attend_check(slot, layer, q, o, NULL, 1e-3, "attend");
}

/* attend_check of each member i < n of a batched call: out [n][NQ][HD] in config.dtype, lse
   [n][NQ], every member asked with the same queries q ([NQ][HD] in config.dtype), which the
   reference takes as the call read them; out rounded to the dtype: a looser bound for 16-bit
   ones. */
static void attend_rows_check(uint32_t layer, const int *slots, uint32_t n, const uint8_t *q,
			      const uint8_t *out, const float *lse, const char *what)
{
	double tol = F.esz == 4 ? 1e-3 : F.cfg.dtype == KVT_DTYPE_F16 ? 2e-3 : 1e-2;
	double o[NQ * HD], l[NQ];
	float qf[NQ * HD];

	for (uint32_t x = 0; x < NQ * HD; x++)
		qf[x] = (float)to_double(q + x * F.esz);
	for (uint32_t i = 0; i < n; i++) {
		for (uint32_t x = 0; x < NQ * HD; x++)
			o[x] = to_double(out + ((size_t)i * NQ * HD + x) * F.esz);
		for (uint32_t g = 0; g < NQ; g++)
			l[g] = lse[i * NQ + g];
		attend_check(slots[i], layer, qf, o, l, tol, what);
	}
}

/* kvt_attend_batch, or kvt_step_attend on the step's batch: q and out in config.dtype, every
   member checked as kvt_attend is (its out rounded to the dtype: a looser bound for 16-bit
   ones), with its log-sum-exp. */
static void run_attend_batch(uint32_t layer, uint8_t seed, const int *slots, uint32_t n,
			     bool distinct, bool step)
{
	static uint8_t q[MAX_BATCH * NQ * HD * MAX_ESZ], out[sizeof(q)];
	float lse[MAX_BATCH * NQ];
	uint64_t ids[MAX_BATCH];
	bool ok = step_ok(step) && distinct && n > 0 && batch_ready(slots, n, layer, false);
	int rc;

	for (uint32_t i = 0; i < n; i++)
		ids[i] = id_of(slots[i]);
	/* every member asks with the same queries */
	for (uint32_t i = 0; i < n * NQ * HD; i++)
		put_val(q + i * F.esz, query_val(seed, i % (NQ * HD)));
	rc = step ? BE_STEP(step_attend, F.m, layer, n, q, out, lse, NULL)
		  : BE(attend_batch, F.m, layer, ids, n, q, out, lse, NULL);
	trace("%s layer %u n %u first %llu -> %d", step ? "step_attend" : "attend_batch", layer, n,
	      n ? (unsigned long long)ids[0] : 0ull, rc);
	check_errno(rc);
	if (!ok) {
		CHECK_RC(rc < 0 && (step_ok(step) || rc == -EINVAL), rc);
		return;
	}
	if (rc) {
		if (rc == -EBADMSG)
			refresh_lost();
		CHECK_RC(rc == -ESTALE || resource_error(rc) || rc == -EBADMSG, rc);
		return;
	}
	attend_rows_check(layer, slots, n, q, out, lse, step ? "step_attend" : "attend_batch");
}

static void op_attend_batch(struct in *in)
{
	int slots[MAX_BATCH];
	uint32_t layer = u8(in) % (NL + 1);
	uint8_t seed = u8(in);
	bool distinct;
	uint32_t n = batch(in, slots, &distinct);

	run_attend_batch(layer, seed, slots, n, distinct, false);
}

static void op_step_recall_device_blocks(struct in *in)
{
	uint32_t layer = u8(in) % (NL + 1);
	uint32_t r = u8(in) % 4; /* 0: invalid */

	run_recall_blocks(in, layer, r, F.step.slots, F.step.open ? F.step.n : 0, true, true, true);
}

static void op_step_attend(struct in *in)
{
	uint32_t layer = u8(in) % (NL + 1);
	uint8_t seed = u8(in);

	run_attend_batch(layer, seed, F.step.slots, F.step.open ? F.step.n : 0, true, true);
}

static void op_info(struct in *in)
{
	struct kvt_seq_info info;
	int slot = pick(u8(in));
	uint8_t b = u8(in);
	int rc;

	memset(&info, 0xee, sizeof(info));
	/* an undersized or partial size: fields past it are not written */
	info.size = b < 200 ? sizeof(info) : b % 16;
	rc = kvt_seq_info(F.m, id_of(slot), &info);
	trace("info %llu size %u -> %d", (unsigned long long)id_of(slot), info.size, rc);
	check_errno(rc);
	if (!live(slot) || info.size < 8)
		CHECK_RC(rc < 0, rc);
	else
		CHECK_RC(rc == 0, rc);
	if (!rc && info.size < sizeof(info))
		CHECK(((uint8_t *)&info)[sizeof(info) - 1] == 0xee);
}

static void op_spill(struct in *in)
{
	int slot = pick(u8(in));
	int rc = kvt_seq_spill(F.m, id_of(slot));

	trace("spill %llu -> %d", (unsigned long long)id_of(slot), rc);
	check_errno(rc);
	if (!live(slot))
		CHECK_RC(rc < 0, rc);
	if (rc == -EBADMSG)
		refresh_lost();
}

static void op_fetch(struct in *in)
{
	int slots[MAX_BATCH];
	uint64_t ids[MAX_BATCH];
	bool distinct, all_live = true;
	uint32_t n = batch(in, slots, &distinct);
	int rc;

	for (uint32_t i = 0; i < n; i++) {
		ids[i] = id_of(slots[i]);
		all_live &= live(slots[i]);
	}
	rc = kvt_seq_fetch(F.m, ids, n);
	trace("fetch n %u first %llu -> %d", n, (unsigned long long)ids[0], rc);
	check_errno(rc);
	if (!all_live)
		CHECK_RC(rc < 0, rc);
	if (rc == -EBADMSG)
		refresh_lost();
}

static void op_sync(struct in *in)
{
	(void)in;
	trace("sync");
	CHECK(kvt_manager_sync(F.m, NULL) == 0);
}

/* ---- the scheduler ------------------------------------------------------------------------ */

/* The live slot of id, or -1. */
static int live_slot(uint64_t id)
{
	for (int i = 0; i < NSLOTS; i++)
		if (slot_ids[i] == id && F.s[i].live)
			return i;
	return -1;
}

/* The slot a scheduled id names: a live one. */
static int slot_of(uint64_t id)
{
	int slot = live_slot(id);

	if (slot < 0)
		die(__LINE__, "the scheduler names a sequence that is not live", 0);
	return slot;
}

/* The batch of kvt_sched_step against its contract: at most max_requests items, distinct live
   sequences, prefills (layer ranges inside the model) first, then decode steps; its counts
   agree; the completed and failed ones live. */
static void sched_batch_check(const struct kvt_sched_batch *b)
{
	bool decodes = false;

	CHECK(b->n_items <= F.scfg.max_requests && b->n_items <= MAX_BATCH);
	CHECK(b->it.batch_size == b->n_items && b->it.n_decode + b->it.n_prefill == b->n_items);
	for (uint32_t i = 0; i < b->n_items; i++) {
		const struct kvt_sched_item *it = &b->items[i];

		trace("  item %llu layers %u..%u decode %u", (unsigned long long)it->seq,
		      it->layer_begin, it->layer_end, it->decode);
		(void)slot_of(it->seq);
		for (uint32_t j = 0; j < i; j++)
			CHECK(b->items[j].seq != it->seq);
		if (it->decode) {
			CHECK(it->decode == 1 && it->layer_begin == 0 && it->layer_end == 0);
			decodes = true;
		} else {
			CHECK(!decodes && it->layer_begin < it->layer_end && it->layer_end <= NL);
		}
	}
	CHECK(b->it.n_decode == (uint32_t)(decodes ? b->n_items - b->it.n_prefill : 0));
	for (uint32_t i = 0; i < b->n_completed; i++)
		trace("  completed %llu", (unsigned long long)b->completed[i]);
	for (uint32_t i = 0; i < b->n_failed; i++)
		trace("  failed %llu", (unsigned long long)b->failed[i]);
}

/* The engine's part: each prefill item's layers, then the decode items' step, every layer;
   the items whose sequence it destroyed since the step left out. */
static void sched_execute(const struct kvt_sched_batch *b, uint8_t seed)
{
	int slots[MAX_BATCH];
	uint32_t n = 0;

	for (uint32_t i = 0; i < b->n_items; i++) {
		const struct kvt_sched_item *it = &b->items[i];
		int slot = live_slot(it->seq);

		if (slot < 0)
			continue;
		if (it->decode) {
			slots[n++] = slot;
			continue;
		}
		for (uint32_t l = it->layer_begin; l < it->layer_end; l++)
			run_prefill(slot, l, seed, false, false);
	}
	for (uint32_t l = 0; n && l < NL; l++)
		run_decode(l, slots, n, true, false);
}

/* The working-set-aware scheduler (kvt_sched_*) over the manager, as an engine drives it:
   create (limits from the input; again: destroy first), submit, step (its batch checked),
   execute and commit, finish, destroy; each refused as its contract says where it must be
   (no scheduler, a sequence not live, a step before the commit, a commit without a step).
   The scheduler preempts and resumes sequences itself: the model reads their flags again. */
static void op_sched(struct in *in)
{
	static const uint32_t max_tokens[] = {2, 5, 64, 8192};
	static const uint64_t inject[] = {1, 40, 200, 2048 * NL};
	uint8_t what = u8(in), a = u8(in), b = u8(in);
	int slot = pick(a), rc;

	switch (what % 6) {
	case 0: /* create */
		if (F.sched) {
			kvt_sched_destroy(F.sched);
			F.sched = NULL;
			F.sb_open = false;
		}
		F.scfg = (struct kvt_sched_config)KVT_SCHED_CONFIG_INIT;
		F.scfg.max_requests = 1 + a % MAX_BATCH;
		F.scfg.max_tokens = max_tokens[a >> 2 & 3];
		F.scfg.max_inject_tokens = inject[a >> 4 & 3];
		F.scfg.ws_control = a >> 6 & 1;
		rc = kvt_sched_create(F.m, &F.scfg, &F.sched);
		trace("sched_create requests %u tokens %u inject %llu ws %u -> %d",
		      F.scfg.max_requests, F.scfg.max_tokens,
		      (unsigned long long)F.scfg.max_inject_tokens, F.scfg.ws_control, rc);
		CHECK_RC(rc == 0 || rc == -ENOMEM, rc);
		if (rc)
			F.sched = NULL;
		break;
	case 1: /* submit */
		rc = kvt_sched_submit(F.sched, id_of(slot), b % 8);
		trace("sched_submit %llu new %u -> %d", (unsigned long long)id_of(slot), b % 8, rc);
		check_errno(rc);
		check_sched_detail(rc);
		if (!F.sched || b % 8 == 0)
			CHECK_RC(rc == -EINVAL, rc);
		else if (!live(slot))
			CHECK_RC(rc == -ENOENT, rc);
		else
			CHECK_RC(rc == 0 || rc == -EEXIST || rc == -E2BIG || rc == -EINVAL ||
					 resource_error(rc),
				 rc);
		break;
	case 2: /* step */
		rc = kvt_sched_step(F.sched, &F.sb);
		trace("sched_step -> %d", rc);
		check_errno(rc);
		check_sched_detail(rc);
		if (!F.sched) {
			CHECK_RC(rc == -EINVAL, rc);
			break;
		}
		if (F.sb_open) {
			CHECK_RC(rc == -EBUSY, rc);
			break;
		}
		refresh(true);
		if (rc) {
			CHECK_RC(resource_error(rc) || rc == -EBADMSG, rc);
			break;
		}
		F.sb_open = true;
		sched_batch_check(&F.sb);
		break;
	case 3: /* the engine executes the batch, then commits it */
		if (F.sb_open)
			sched_execute(&F.sb, b);
		rc = kvt_sched_commit(F.sched);
		trace("sched_commit -> %d", rc);
		check_errno(rc);
		check_sched_detail(rc);
		CHECK_RC(F.sb_open ? rc == 0 : rc == -EINVAL, rc);
		F.sb_open = false;
		refresh(true);
		break;
	case 4: /* finish */
		rc = kvt_sched_finish(F.sched, id_of(slot));
		trace("sched_finish %llu -> %d", (unsigned long long)id_of(slot), rc);
		check_errno(rc);
		check_sched_detail(rc);
		CHECK_RC(F.sched ? rc == 0 || rc == -ENOENT : rc == -EINVAL, rc);
		refresh(true);
		break;
	default: /* destroy */
		trace("sched_destroy");
		kvt_sched_destroy(F.sched);
		F.sched = NULL;
		F.sb_open = false;
		refresh(true);
		break;
	}
}

typedef void (*op_fn)(struct in *in);
/* Opcode byte % N_OPS; the decode steps' operations last (a step is begun and ended less often
   than its calls are made). */
static const op_fn ops[] = {
	op_create,
	op_prefill,
	op_decode,
	op_decode,
	op_decode_recall,
	op_recall_blocks,
	op_preempt,
	op_resume,
	op_read,
	op_attend,
	op_info,
	op_frames,
	op_view,
	op_resident,
	op_destroy,
	op_spill,
	op_fetch,
	op_sync,
	op_read_seq,
	op_prefill,
	op_create,
	op_step_begin,
	op_step_append,
	op_step_append,
	op_step_recall,
	op_step_recall_blocks,
	op_step_end,
	op_attend_batch,
	op_step_attend,
	op_step_tables,
	op_recall_device_blocks,
	op_step_recall_device_blocks,
	op_create_prefix,
	op_prefill_chunk,
	op_prefill_chunk,
	op_load_kv,
	op_prefix_match,
	op_create_prefix,
	op_step_paged,
	op_sched,
};
#define N_OPS (sizeof(ops) / sizeof(ops[0]))

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	snprintf(spill_dir, sizeof(spill_dir), "/tmp/kvt-fuzz-XXXXXX");
	if (!mkdtemp(spill_dir)) {
		perror("fuzz_api: mkdtemp");
		abort();
	}
	atexit(remove_spill_dir);
	F.trace = getenv("FUZZ_API_TRACE") != NULL;
	if (!F.trace)
		kvt_log_set(quiet, NULL);
	return 0;
}

/* One run of an input on a manager of the backend F.cuda names. */
static void run_input(const uint8_t *data, size_t size)
{
	struct in in = {data, size};

	memset(&F.s, 0, sizeof(F.s));
	memset(&F.step, 0, sizeof(F.step));
	F.sched = NULL;
	F.sb_open = false;
	F.diverged = false;
	F.op = 0;
	F.gen = 0;
	F.serial = 0;
	make_manager(&in);
	while (in.n && F.op < MAX_OPS) {
		uint8_t opcode = u8(&in);

		F.op++;
		ops[opcode % N_OPS](&in);
#ifdef FUZZ_API_CUDA
		/* An opcode's top bit leaves the checks for a later operation: they read the
		   recall calls' reports, settling the device's pending work, which the next
		   calls should also meet unsettled (but with a disk tier, the counters that
		   end the comparison). */
		if (opcode & 0x80) {
			struct kvt_stats st = KVT_STATS_INIT;

			if (F.disk) {
				CHECK(kvt_manager_stats(F.m, &st) == 0);
				disk_used(&st);
			}
			continue;
		}
#endif
		check_model();
	}
	/* every token of every live sequence reads back bit-exact */
	F.op++;
	refresh_lost();
	for (int i = 0; i < NSLOTS; i++)
		if (F.s[i].live)
			read_all(i);
	kvt_sched_destroy(F.sched);
	F.sched = NULL;
	kvt_manager_destroy(F.m);
	F.m = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
#ifdef FUZZ_API_CUDA
	/* the host backend's run, its lines kept; then the CUDA backend's, held to the model and
	   to those lines */
	F.cuda = false;
	F.record = true;
	F.log_len = 0;
	run_input(data, size);
	F.record = false;
	F.cuda = true;
	F.compare = true;
	F.log_at = 0;
	run_input(data, size);
	if (F.log_at != F.log_len) {
		fprintf(stderr, "fuzz_api: host backend: %s\n", F.log + F.log_at);
		die(__LINE__, "the host backend's run printed more than the CUDA backend's", 0);
	}
	F.compare = false;
	F.cuda = false;
#else
	run_input(data, size);
#endif
	return 0;
}
