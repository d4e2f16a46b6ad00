/* SPDX-License-Identifier: MIT */
/*
 * Where the keys of a JSON text are, for messages that name a file's line and field: jansson
 * parses the simulator's JSON inputs (Mooncake trace lines, preset files) but keeps no
 * positions, so these scan the text it parsed. s[0..n) is the text exactly as given to
 * jansson (after any byte-order mark), so its json_error_t.position indexes it.
 */
#ifndef SIM_JSONKEY_H
#define SIM_JSONKEY_H

#include <stddef.h>

/*
 * The line (1-based) of key `inner` of the object that is the value of key `outer` of the
 * top-level object, or of `outer` itself when inner is NULL; the last such key when one
 * repeats. 0 when there is none, or the text is not well-formed before it. Linear in n.
 */
unsigned sim_json_key_line(const char *s, size_t n, const char *outer, const char *inner);

/*
 * The key whose closing quote is the last byte before offset `end` (jansson's position for
 * json_error_duplicate_key: it stops right after the repeated key), written into name[len]
 * as "OUTER.KEY" for a key of an object that is the value of a top-level key OUTER, else
 * "KEY" (truncated to fit), with its line into *line. 0, or -ENOENT when no key ends there.
 * Linear in end.
 */
int sim_json_key_at(const char *s, size_t n, size_t end, char *name, size_t len, unsigned *line);

#endif /* SIM_JSONKEY_H */
