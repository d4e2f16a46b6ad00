/* SPDX-License-Identifier: MIT */
/*
 * The library's lowest internal header, which every folder of the library may include
 * (manager, transfer, policy, scheduler) and which includes nothing of theirs: integer helpers,
 * logging, and the checked-invariant pair ALWAYS()/NEVER().
 */
#ifndef KVT_UTIL_H
#define KVT_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvtier.h"

/* ceil(a / b) for unsigned operands, b > 0. */
#define DIV_UP(a, b) (((a) + (b)-1) / (b))

/*
 * Invariants (SQLite's ALWAYS/NEVER, with jemalloc's always-compiled debug checks). ALWAYS(x)
 * states that x holds, NEVER(x) that it does not; each evaluates to x, so the branch that would
 * handle a violation stays in the code as a defence:
 *
 *	if (NEVER(ly->n_groups > ly->cap_groups))
 *		return kvt_fail(m, -EIO, "...");
 *
 * A violation is a bug in kvtier, never the caller's error. Every build compiles the check: with
 * assertions (meson's default b_ndebug, so the debugoptimized and debug builds and every test
 * build) it prints the file, line and expression and aborts; with NDEBUG (release builds) it
 * logs the same at KVT_LOG_ERROR, counts it (kvt_invariant_failures) and the defensive branch
 * runs, so one request fails and the process does not.
 */
#ifdef NDEBUG
static const bool kvt_invariant_aborts = false;
#else
static const bool kvt_invariant_aborts = true;
#endif

/* Reports a violated invariant (manager/log.c); aborts when kvt_invariant_aborts. */
void kvt_invariant_failed(const char *file, int line, const char *expr, bool aborts);
/* How many invariants were violated in this process (release builds only ever see > 0). */
uint64_t kvt_invariant_failures(void);

#define ALWAYS(x)                                                                                 \
	(__builtin_expect(!!(x), 1) ? true                                                        \
				    : (kvt_invariant_failed(__FILE__, __LINE__, "ALWAYS(" #x ")", \
							    kvt_invariant_aborts),                \
				       false))
#define NEVER(x)                                                                                 \
	(__builtin_expect(!!(x), 0) ? (kvt_invariant_failed(__FILE__, __LINE__, "NEVER(" #x ")", \
							    kvt_invariant_aborts),               \
				       true)                                                     \
				    : false)

/* Logging (manager/log.c): level checked before formatting, messages prefixed "kvtier: ". */
bool kvt_log_enabled(enum kvt_log_level level);
void kvt_log(enum kvt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* CLOCK_MONOTONIC now, in ns (manager/base.c). */
uint64_t kvt_now_ns(void);

/* Writes a failure's detail into buf (len bytes): the formatted text, then err's text in
   parentheses where it fits; logs it at debug level, after `who` (manager/base.c). What
   kvt_manager_last_error and kvt_sched_last_error return. */
void kvt_verror(char *buf, size_t len, const char *who, int err, const char *fmt, va_list ap)
	__attribute__((format(printf, 5, 0)));

#endif /* KVT_UTIL_H */
