#!/usr/bin/env bash
# One pass of everything that needs a GPU, for the lent device machine (see README, "On a GPU"):
# builds with the CUDA plugin in /tmp, runs the GPU suite (test_cuda, the transfer benchmark's
# smoke run, the Python GPU tests when PyTorch is there), the core suites for regressions, then
# the full transfer benchmark, and leaves every log and the CSV under $OUT (default ./gpu-out).
#
# Prepared on the development machine with
#   ../shared/hooks/gpu-prepare.sh libjansson4 libjansson-dev libisal2 libisal-dev
# and run there as
#   . .device/setup.sh && bash bench/gpu-run.sh
# Environment: KVT_BENCH_ARGS (extra kvtier-bench transfer options), KVT_SKIP_BENCH=1.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
build=${KVT_GPU_BUILD:-/tmp/kvt-gpu-build}
mkdir -p "$out"
status=0
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
	echo "gpu-run: build failed (logs in $out)"
	exit 1
fi

# The GPU suite first (it is what has never run), then everything else.
meson test -C "$build" --suite gpu --print-errorlogs --num-processes 1 > "$out/test-gpu.log" 2>&1 ||
	status=1
tail -25 "$out/test-gpu.log"
cp "$build/meson-logs/testlog.txt" "$out/testlog-gpu.txt" 2>/dev/null
meson test -C "$build" --no-suite gpu --print-errorlogs > "$out/test-rest.log" 2>&1 || status=1
tail -15 "$out/test-rest.log"
cp "$build/meson-logs/testlog.txt" "$out/testlog-rest.txt" 2>/dev/null

if [ "${KVT_SKIP_BENCH:-0}" != 1 ]; then
	KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" "$build/tools/kvtier-bench" transfer \
		--csv "$out/transfer.csv" ${KVT_BENCH_ARGS:-} > "$out/transfer.txt" 2>&1 || status=1
	cat "$out/transfer.txt"
fi
echo "gpu-run: status $status (results in $out)"
exit $status
