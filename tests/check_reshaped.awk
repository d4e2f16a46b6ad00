# Checks a trace `kvtier-trace reshape` wrote from a Mooncake trace, reading both files as
# text (not through sim/trace.c, whose reader the tool itself uses):
#   awk -v n=N -v dur_ms=MS -v mean_in=T -v mean_out=T -f check_reshaped.awk SRC OUT
# OUT must have exactly n lines, the first at timestamp 0 and the last at dur_ms, timestamps
# non-decreasing, mean input and output lengths within 1% of mean_in and mean_out, every
# length at least 1, and ceil(input_length / 512) hash ids a line. Line i of OUT is line
# (i - 1) % lines(SRC) + 1 of SRC in copy c = int((i - 1) / lines(SRC)) of the tiling: its
# first ids must be SRC's ids of its whole blocks plus c * (the largest of those + 1: the
# reader drops the id of a partial last block), as far as its new length has whole blocks;
# every later id must be used by no other line. Prints what
# it checked; exits 1 on the first failure.

function fail(msg) {
	printf "check_reshaped: %s:%d: %s\n", FILENAME, FNR, msg
	failed = 1
	exit 1
}

# Splits the line's fields into the globals ts, inl, out, ids[1..nids].
function parse(line,    s, k) {
	if (!match(line, /"timestamp": *[0-9.]+/)) fail("no timestamp")
	s = substr(line, RSTART, RLENGTH); sub(/.*: */, "", s); ts = s + 0
	if (!match(line, /"input_length": *[0-9]+/)) fail("no input_length")
	s = substr(line, RSTART, RLENGTH); sub(/.*: */, "", s); inl = s + 0
	if (!match(line, /"output_length": *[0-9]+/)) fail("no output_length")
	s = substr(line, RSTART, RLENGTH); sub(/.*: */, "", s); out = s + 0
	if (!match(line, /"hash_ids": *\[[0-9, ]*\]/)) fail("no hash_ids")
	s = substr(line, RSTART, RLENGTH); sub(/.*\[/, "", s); sub(/\].*/, "", s)
	nids = split(s, ids, /, */)
	for (k = 1; k <= nids; k++) ids[k] += 0
}

FNR == 1 { file++ }

file == 1 {
	parse($0)
	nsrc++
	whole = int(inl / 512)
	srcn[nsrc] = nids < whole ? nids : whole
	for (k = 1; k <= srcn[nsrc]; k++) {
		src[nsrc, k] = ids[k]
		if (ids[k] > top) top = ids[k]
	}
	next
}

{
	parse($0)
	lines++
	if (lines == 1 && ts != 0) fail("first timestamp " ts ", want 0")
	if (lines > 1 && ts < last) fail("timestamp " ts " before " last)
	last = ts
	if (inl < 1 || out < 1) fail("a length below 1")
	if (nids != int((inl + 511) / 512)) fail(nids " hash ids for " inl " tokens")
	tin += inl; tout += out
	s = (lines - 1) % nsrc + 1
	c = int((lines - 1) / nsrc)
	kept = int(inl / 512); if (srcn[s] < kept) kept = srcn[s]
	for (k = 1; k <= nids; k++) {
		if (k <= kept) {
			if (ids[k] != src[s, k] + c * (top + 1))
				fail("id " k " is " ids[k] ", want " src[s, k] + c * (top + 1))
			shared[ids[k]] = 1
		} else {
			fresh[ids[k]]++
		}
	}
	nkept += kept
	nfresh += nids - kept
}

END {
	if (failed) exit 1
	if (lines != n) { printf "check_reshaped: %d requests, want %d\n", lines, n; exit 1 }
	if (last != dur_ms) { printf "check_reshaped: last timestamp %s, want %s\n", last, dur_ms; exit 1 }
	mi = tin / lines; mo = tout / lines
	if (mi < 0.99 * mean_in || mi > 1.01 * mean_in) {
		printf "check_reshaped: mean input %.1f, want %s\n", mi, mean_in; exit 1
	}
	if (mo < 0.99 * mean_out || mo > 1.01 * mean_out) {
		printf "check_reshaped: mean output %.1f, want %s\n", mo, mean_out; exit 1
	}
	for (id in fresh)
		if (fresh[id] > 1 || (id in shared)) {
			printf "check_reshaped: fresh id %s used %d times\n", id, fresh[id] + (id in shared)
			exit 1
		}
	printf "ok: %d requests over %.3f s, mean input %.1f, mean output %.1f, %d ids kept, %d fresh\n",
		lines, last / 1000, mi, mo, nkept, nfresh
}
