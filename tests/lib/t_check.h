/* SPDX-License-Identifier: MIT */
/*
 * Failure reporting for the cmocka test binaries, at the caller's file:line: fail_at, CHECK_RC
 * (a call's return code, named with kvt_strerror, so a file that uses it includes kvtier.h) and
 * CHECK_EQ (two integers). A binary that wants more context in every failure message (a seed,
 * the operation under way) points check_context at a function that writes it. Include after
 * <cmocka.h>. Linked whole into every binary (t_check.c also makes every UBSan report fatal,
 * as the library objects may be built with recoverable UBSan).
 */
#ifndef KVT_TEST_T_CHECK_H
#define KVT_TEST_T_CHECK_H

#include <stddef.h>

/* Writes a prefix for failure messages into buf (len bytes), e.g. "seed 7, op 12 (decode): ".
   NULL (the default): no prefix. */
extern void (*check_context)(char *buf, size_t len);

/* Fails the running test at file:line with a formatted message (after check_context's prefix). */
void fail_at(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

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

#endif /* KVT_TEST_T_CHECK_H */
