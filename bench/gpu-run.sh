#!/usr/bin/env bash
# Everything that needs a GPU, for the lent device machine (see README, "On a GPU"): builds with
# the CUDA plugin, runs the GPU suite (test_cuda, the core suites on the CUDA backend, the
# transfer benchmark's smoke run, the Python GPU tests when PyTorch is there), the other suites
# for regressions, then the full transfer benchmark, and leaves every log and the CSV under
# $OUT (default ./gpu-out), written as it goes, so a run cut short still brings back its logs.
#
# Prepared on the development machine with
#   ../shared/hooks/gpu-prepare.sh libjansson4 libjansson-dev libisal2 libisal-dev
# and run there as
#   . .device/setup.sh && bash bench/gpu-run.sh [PHASE...]
# Phases, in this order when none is named: build, gpu, bench, rest. A device machine runs one
# command for at most 10 minutes, so run them in separate calls where that is too short (e.g.
# "build gpu", then "bench", then "rest"): the build directory (build-gpu/ in the checkout,
# ignored by git) stays between calls on a machine still held.
# Environment: KVT_GPU_BUILD (build directory), KVT_BENCH_ARGS (extra kvtier-bench transfer
# options).
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
build=${KVT_GPU_BUILD:-$PWD/build-gpu}
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(build gpu bench rest)
mkdir -p "$out"
status=0

note() { echo "gpu-run: $*" | tee -a "$out/phases.txt"; }

for phase in "${phases[@]}"; do
	t0=$(date +%s)
	case $phase in
	build)
		{
			date -u +%FT%TZ
			nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv
			nvcc --version | tail -2
		} > "$out/machine.txt" 2>&1
		cat "$out/machine.txt"
		rm -rf "$build"
		if ! meson setup "$build" -Dcuda=enabled -Dwerror=true > "$out/setup.log" 2>&1 ||
			! ninja -C "$build" > "$out/build.log" 2>&1; then
			tail -40 "$out/setup.log" "$out/build.log" 2>/dev/null
			note "build failed (logs in $out)"
			exit 1
		fi
		;;
	gpu)
		# What has never run on a GPU: test_cuda first, then the core suites on CUDA.
		meson test -C "$build" --no-rebuild --suite gpu --print-errorlogs --num-processes 1 \
			> "$out/test-gpu.log" 2>&1 || status=1
		tail -25 "$out/test-gpu.log"
		cp "$build/meson-logs/testlog.txt" "$out/testlog-gpu.txt" 2>/dev/null
		;;
	bench)
		KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" "$build/tools/kvtier-bench" transfer \
			--csv "$out/transfer.csv" ${KVT_BENCH_ARGS:-} > "$out/transfer.txt" 2>&1 ||
			status=1
		cat "$out/transfer.txt"
		;;
	rest)
		meson test -C "$build" --no-rebuild --no-suite gpu --print-errorlogs \
			> "$out/test-rest.log" 2>&1 || status=1
		tail -15 "$out/test-rest.log"
		cp "$build/meson-logs/testlog.txt" "$out/testlog-rest.txt" 2>/dev/null
		;;
	*)
		echo "gpu-run: unknown phase '$phase' (build, gpu, bench, rest)" >&2
		exit 2
		;;
	esac
	note "$phase: status $status, $(($(date +%s) - t0)) s"
done
note "status $status (results in $out)"
exit $status
