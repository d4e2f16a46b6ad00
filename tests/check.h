/* SPDX-License-Identifier: MIT */
/*
 * Shared by the cmocka test binaries; include it after <cmocka.h>, once per binary. It makes
 * every UBSan report fatal (the library objects may be built with recoverable UBSan) and gives
 * failure reporting at the caller's file:line: fail_at, CHECK_RC (a call's return code) and
 * CHECK_EQ (two integers). A binary that wants more context in every failure message (a seed,
 * the operation under way) points check_context at a function that writes it. CHECK_RC names
 * the code with kvt_strerror, so a binary that uses it includes kvtier.h.
 */
#ifndef KVT_TEST_CHECK_H
#define KVT_TEST_CHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

/* Writes a prefix for failure messages into buf (len bytes), e.g. "seed 7, op 12 (decode): ". */
static void (*check_context)(char *buf, size_t len);

/* Fails the test at file:line with a formatted message. */
static inline void fail_at(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static inline void fail_at(const char *file, int line, const char *fmt, ...)
{
	char msg[512], ctx[160] = "";
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (check_context)
		check_context(ctx, sizeof(ctx));
	print_error("%s:%d: %s%s\n", file, line, ctx, msg);
	_fail(file, line);
}

#define CHECK_RC(call, want)                                                                   \
	do {                                                                                   \
		int rc_ = (call);                                                              \
		if (rc_ != (want))                                                             \
			fail_at(__FILE__, __LINE__, "%s returned %d (%s), expected %d", #call, \
				rc_, kvt_strerror(rc_), (int)(want));                          \
	} while (0)

#define CHECK_EQ(a, b)                                                                           \
	do {                                                                                     \
		unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);   \
		if (a_ != b_)                                                                    \
			fail_at(__FILE__, __LINE__, "%s = %llu, expected %s = %llu", #a, a_, #b, \
				b_);                                                             \
	} while (0)

#endif /* KVT_TEST_CHECK_H */
