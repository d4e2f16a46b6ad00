/* SPDX-License-Identifier: MIT */
/*
 * The name the trace, exec and replay tests include for the test library's check helpers
 * (lib/t_check.h: fail_at, CHECK_RC, CHECK_EQ, check_context). Include after <cmocka.h>.
 */
#ifndef KVT_TEST_CHECK_H
#define KVT_TEST_CHECK_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "t_check.h"

#endif /* KVT_TEST_CHECK_H */
