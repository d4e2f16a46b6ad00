#!/usr/bin/env bash
# Everything that needs a GPU, for the lent device machine (see README, "On a GPU"): builds with
# the CUDA plugin, runs the GPU suite (test_cuda, the core suites on the CUDA backend, the
# transfer benchmark's smoke run), then the full transfer benchmark, the other suites for
# regressions (the Python GPU tests among them, when PyTorch is there), and the GPU suite's own
# test under compute-sanitizer. Every log and the CSV go under $OUT (default ./gpu-out), written
# as they go, so a run cut short still brings back its logs.
#
# Prepared on the development machine with
#   ../shared/hooks/gpu-prepare.sh libjansson4 libjansson-dev libisal2 libisal-dev
# and run there as
#   . .device/setup.sh && bash bench/gpu-run.sh [PHASE...]
# Phases, in this order when none is named: build, gpu, bench, rest, sanitize. A device machine
# runs one command for at most 10 minutes, so run them in separate calls where that is too short
# (e.g. "build gpu bench", then "rest sanitize"): the build directory (build-gpu/ in the
# checkout, ignored by git) stays between calls on a machine still held.
# At most 8 files come back from a device command's $OUT, so the script writes at most 8 in
# all: phases.txt, machine.txt, build.log, test-gpu.log, transfer.txt, transfer.csv,
# test-rest.log and sanitize.log.
# Environment: KVT_GPU_BUILD (build directory), KVT_BENCH_ARGS (extra kvtier-bench transfer
# options), KVT_SANITIZE_TOOLS (compute-sanitizer tools, default "memcheck racecheck synccheck").
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
build=${KVT_GPU_BUILD:-$PWD/build-gpu}
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(build gpu bench rest sanitize)
mkdir -p "$out"
status=0

note() { echo "gpu-run: $*" | tee -a "$out/phases.txt"; }

# A phase's meson test run: the summary on stdout, then the whole test log (passing tests'
# output too, for their figures) after it in the phase's one file.
run_tests() {
	local log=$1
	shift
	meson test -C "$build" --no-rebuild --print-errorlogs "$@" > "$log" 2>&1 || status=1
	tail -25 "$log"
	{
		echo
		echo "==== $build/meson-logs/testlog.txt"
		cat "$build/meson-logs/testlog.txt"
	} >> "$log" 2>/dev/null
}

for phase in "${phases[@]}"; do
	t0=$(date +%s)
	case $phase in
	build)
		{
			date -u +%FT%TZ
			nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv
			nvcc --version | tail -2
			cc --version | head -1
			meson --version
		} > "$out/machine.txt" 2>&1
		cat "$out/machine.txt"
		rm -rf "$build"
		# No -Dwerror here: this machine's host compiler is not CI's, and a warning only it
		# gives must not cost a lent GPU its run. Its warnings are counted instead.
		if ! meson setup "$build" -Dcuda=enabled > "$out/build.log" 2>&1 ||
			! ninja -C "$build" >> "$out/build.log" 2>&1; then
			tail -40 "$out/build.log"
			note "build failed (log in $out/build.log)"
			exit 1
		fi
		note "build: $(grep -c 'warning:' "$out/build.log") compiler warnings (see build.log)"
		;;
	gpu)
		# What has never run on a GPU: test_cuda first, then the core suites on CUDA.
		run_tests "$out/test-gpu.log" --suite gpu --num-processes 1
		;;
	bench)
		KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" "$build/tools/kvtier-bench" transfer \
			--csv "$out/transfer.csv" ${KVT_BENCH_ARGS:-} > "$out/transfer.txt" 2>&1 ||
			status=1
		cat "$out/transfer.txt"
		;;
	rest)
		run_tests "$out/test-rest.log" --no-suite gpu
		;;
	sanitize)
		# The GPU suite's own test and the transfer smoke run under compute-sanitizer: out of
		# bounds and misaligned accesses (memcheck), shared-memory races below barrier
		# granularity, which the CPU emulator cannot see (racecheck), and barriers reached by
		# part of a CTA (synccheck). API errors are left out: the tests provoke some on purpose.
		cs=$(command -v compute-sanitizer ||
			ls /usr/local/cuda*/bin/compute-sanitizer \
				/usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
		: > "$out/sanitize.log"
		if [ -z "$cs" ]; then
			note "sanitize: no compute-sanitizer on this machine"
			status=1
			continue
		fi
		for tool in ${KVT_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
			# meson names the log of a wrapped run after the wrapper
			log=$build/meson-logs/testlog-compute-sanitizer.txt
			rm -f "$log"
			meson test -C "$build" --no-rebuild --num-processes 1 --timeout-multiplier 20 \
				--wrapper "$cs --tool $tool --error-exitcode 66 --report-api-errors no" \
				cuda bench-transfer > "$out/sanitize.tmp" 2>&1 || status=1
			echo "$tool:"
			grep -E '^ *[0-9]+/[0-9]+ ' "$out/sanitize.tmp"
			{
				echo "==== compute-sanitizer --tool $tool"
				cat "$out/sanitize.tmp" "$log"
			} >> "$out/sanitize.log" 2>/dev/null
			rm -f "$out/sanitize.tmp"
		done
		;;
	*)
		echo "gpu-run: unknown phase '$phase' (build, gpu, bench, rest, sanitize)" >&2
		exit 2
		;;
	esac
	note "$phase: status $status, $(($(date +%s) - t0)) s"
done
note "status $status (results in $out)"
exit $status
