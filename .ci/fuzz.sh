#!/usr/bin/env bash
# CI: libFuzzer targets of tests/fuzz. Builds them with clang under ASan+UBSan (build-ci-fuzz),
# runs each over its corpus as a regression test (meson suite 'fuzz'; fuzz_api_cuda's also over
# the real kernels where CI's default build made the kernel emulator), then fuzzes all targets
# at once for FUZZ_SECONDS (default 30; five targets on two cores get about 12 CPU-seconds
# each) on temporary copies of their corpora, so the repository is never written. Prints one
# line per target with its executions and a closing total; exits non-zero on any crash, leak,
# timeout or sanitizer report. Needs clang and libclang-rt-14-dev (the CI image installs them);
# installs nothing itself. Run from anywhere: bash .ci/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-30}
targets=(fuzz_api fuzz_trace fuzz_selfile fuzz_preset)
build="build-ci-fuzz"
supp=$PWD/tests/fuzz/ubsan.supp
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$supp

rm -rf "$build"
CC=clang meson setup "$build" -Dfuzz=true -Dtests=false -Db_sanitize=address,undefined \
	-Db_lundef=false -Dbuildtype=debug >/dev/null
ninja -C "$build" "${targets[@]/#/tests/fuzz/}"
# fuzz_api_cuda (fuzz_api on the CUDA backend over the fake runtime, against the host backend)
# where the CUDA runtime's headers are, as on CI's machines
if ninja -C "$build" -t targets all | grep -q '^tests/fuzz/fuzz_api_cuda:'; then
	ninja -C "$build" tests/fuzz/fuzz_api_cuda tests/cuda_emu/rt/libkvtier-cuda-emu.so
	targets+=(fuzz_api_cuda)
	export KVTIER_CUDA_PLUGIN=$PWD/$build/tests/cuda_emu/rt/libkvtier-cuda-emu.so
fi

status=0
meson test -C "$build" --suite fuzz --print-errorlogs || status=1

# The fuzz_api_cuda corpus once more, over the CUDA backend's real kernels: the kernel
# emulator's plugin of CI's default build (build-ci, where it is built), its device memory
# readable at its own address as the kernels read it. The plugin shares the fuzzing build's fake
# runtime (one library of that name per process).
kemu=$PWD/build-ci/tests/kernel_emu/libkvtier-cuda-kemu.so
if [[ " ${targets[*]} " == *" fuzz_api_cuda "* ]] && [ -f "$kemu" ]; then
	klog=$(mktemp)
	if KVTIER_CUDA_PLUGIN=$kemu FAKE_CUDA_DEVICE_READABLE=1 \
		"$build/tests/fuzz/fuzz_api_cuda" -runs=0 tests/fuzz/corpus/fuzz_api_cuda >"$klog" 2>&1; then
		echo "fuzz: fuzz_api_cuda corpus over the real kernels (kernel emulator):" \
			"$(ls tests/fuzz/corpus/fuzz_api_cuda | wc -l) inputs passed"
	else
		status=1
		echo "fuzz: fuzz_api_cuda corpus over the real kernels FAILED; the end of its log:"
		tail -n 60 "$klog"
	fi
	rm -f "$klog"
else
	echo "fuzz: no kernel emulator plugin at $kemu: the corpus over the real kernels skipped"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
total=0
crashes=0
declare -A pid
for t in "${targets[@]}"; do
	mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
	cp tests/fuzz/corpus/"$t"/* "$work/$t/corpus/"
	# (fuzz_api_cuda over the asynchronous fake runtime, where a missing wait shows)
	run=(env)
	[ "$t" != fuzz_api_cuda ] || run=(env FAKE_CUDA_ASYNC=1)
	"${run[@]}" "$build/tests/fuzz/$t" "$work/$t/corpus" -max_total_time="$seconds" -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
		>"$work/$t/log" 2>&1 &
	pid[$t]=$!
done
for t in "${targets[@]}"; do
	rc=0
	wait "${pid[$t]}" || rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log" | tail -n 1)
	found=$(find "$work/$t/artifacts" -type f | wc -l)
	if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
		[ "$found" -ne 0 ] || found=1
		crashes=$((crashes + found))
		status=1
		echo "fuzz: $t FAILED (exit $rc); the end of its log:"
		tail -n 60 "$work/$t/log"
		for a in "$work/$t/artifacts"/*; do
			[ -f "$a" ] && echo "fuzz: $t input (base64): $(base64 -w0 "$a")"
		done
	fi
	inputs=$(find "$work/$t/corpus" -type f | wc -l)
	echo "fuzz: $t: ${execs:-0} executions in ${seconds}s, corpus $inputs inputs"
	total=$((total + ${execs:-0}))
done
echo "fuzz: $total executions, $crashes crashes"
exit $status
