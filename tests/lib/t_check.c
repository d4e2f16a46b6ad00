/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>

#include "t_check.h"

/* Every UBSan report ends the test binary (the library objects may be built with recoverable
   UBSan). This object is linked whole, so every binary has it. */
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void)
{
	return "halt_on_error=1:print_stacktrace=1";
}

void (*check_context)(char *buf, size_t len);

void fail_at(const char *file, int line, const char *fmt, ...)
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
