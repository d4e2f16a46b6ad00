/* SPDX-License-Identifier: MIT */
/* placeholder: being written */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

static void test_placeholder(void **state)
{
	(void)state;
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_placeholder)};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
