#!/usr/bin/env bash
# Everything that needs a GPU, for a machine with one (docs/cuda.md, "Running the GPU suite on
# a machine with a GPU"): builds with the CUDA plugin, runs the GPU suite (test_cuda, the core
# suites on the CUDA backend, the smoke runs of the transfer benchmark and of calibrate) and the
# Python suite (its GPU tests need PyTorch), then the full transfer benchmark, the recall
# benchmarks (tests/bench_recall_cuda.c, kvtier-bench recall --backend cuda) and the CPU
# reference's (kvtier-bench recall), the
# batched attention's bandwidth (kvtier-bench attend --backend cuda) and the replay
# simulator's calibration of this GPU (kvtier-bench calibrate: preset.json), then the GPU
# suite's own test and the smoke run under compute-sanitizer, then the other suites for
# regressions. Every log and the CSV go under $OUT (default ./gpu-out), written as they go, so
# a run cut short still brings back its logs.
#
# The machine needs what a build needs (meson, nvcc, jemalloc, liburing, cmocka, jansson,
# ISA-L); run from the checkout as
#   bash bench/gpu-run.sh [PHASE...]
# Phases: build, gpu, bench, profile, sanitize, rest (most needed first: what has never run on
# a GPU, then the figures, then where the kernels' time goes, then the checks CI already
# makes). Named ones run in that order; with none named, build gpu bench: the run the issue
# needs. "all" names all six.
#
# Time: a session's device time is short (15 minutes, each machine's start included, and no
# machine starts with under 4 minutes left) and one device command runs at most 10 minutes, so
# the script keeps to a budget, KVT_GPU_BUDGET seconds in all (default 420: one start, this run
# and a second start and run of about 4 minutes still fit, for a rerun after a fix or for
# "sanitize rest"). Each phase runs under `timeout` with what is left of it, less
# KVT_GPU_RESERVE seconds (default 15) for writing the logs back; a phase that would get less
# than 30 s is skipped, and a phase cut short is reported as such. Phase gpu leaves
# KVT_GPU_BENCH_MIN seconds (default 120) to a phase bench after it, so that a test that hangs
# on its first GPU run cannot cost the figures too; within phase bench the transfer and recall
# benchmarks leave KVT_GPU_ATTEND_SECS seconds (default 30) to the attention benchmark and
# KVT_GPU_CALIB_SECS seconds (default 45) to the calibration after them. Phase sanitize
# shares its time between its tools. meson test handles SIGTERM: it stops the test running, counts it
# as interrupted and still writes its summary and log.
# The build directory (build-gpu/ in the checkout, ignored by git) stays between calls on a
# machine still held: phase build then rebuilds only what changed, and the other phases build
# first when it is missing (a fresh machine), so "sanitize rest" works as a second call on a
# warm machine or a fresh one alike.
# At most 8 files come back from a device command's $OUT, so the script writes at most 8 in
# all: phases.txt (which starts with the machine's description), build.log, test-gpu.log,
# transfer.txt (the transfer benchmark's output, the recall benchmark's, the attention
# benchmark's, then calibrate's table, then phase profile's reports), transfer.csv,
# preset.json (calibrate's GPU preset, for kvtier-replay --preset-json), sanitize.log and
# test-rest.log.
# Environment: KVT_GPU_BUDGET, KVT_GPU_RESERVE, KVT_GPU_BENCH_MIN, KVT_GPU_ATTEND_SECS,
# KVT_GPU_CALIB_SECS (above),
# KVT_GPU_BUILD (build directory), KVT_BENCH_ARGS (extra kvtier-bench transfer options),
# KVT_CALIB_ARGS (extra kvtier-bench calibrate options), KVT_SANITIZE_TOOLS (compute-sanitizer
# tools, default "memcheck racecheck synccheck").
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
build=${KVT_GPU_BUILD:-$PWD/build-gpu}
budget=${KVT_GPU_BUDGET:-420}
reserve=${KVT_GPU_RESERVE:-15}
bench_min=${KVT_GPU_BENCH_MIN:-120}
calib_secs=${KVT_GPU_CALIB_SECS:-45}
attend_secs=${KVT_GPU_ATTEND_SECS:-30}
all_phases=(build gpu bench profile sanitize rest) # in the order they run
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(build gpu bench)
[ "${phases[*]}" = all ] && phases=("${all_phases[@]}")
for v in "$budget" "$reserve" "$bench_min" "$calib_secs" "$attend_secs"; do
	case $v in
	'' | *[!0-9]*)
		echo "gpu-run: KVT_GPU_BUDGET, KVT_GPU_RESERVE, KVT_GPU_BENCH_MIN," \
			"KVT_GPU_ATTEND_SECS and KVT_GPU_CALIB_SECS are whole seconds, not '$v'" >&2
		exit 2
		;;
	esac
done
for phase in "${phases[@]}"; do
	case $phase in
	build | gpu | bench | profile | sanitize | rest) ;;
	*)
		echo "gpu-run: unknown phase '$phase' (build, gpu, bench, profile, sanitize, rest, or" \
			"all alone)" >&2
		exit 2
		;;
	esac
done
# in the fixed order, each once; build first when there is no build to run (a fresh machine)
want=" ${phases[*]} "
[ -f "$build/build.ninja" ] || want="$want build "
phases=()
left_out=""
for phase in "${all_phases[@]}"; do
	case $want in
	*" $phase "*) phases+=("$phase") ;;
	*) left_out="$left_out $phase" ;;
	esac
done
deadline=$(($(date +%s) + budget))
mkdir -p "$out"
status=0

note() { echo "gpu-run: $*" | tee -a "$out/phases.txt"; }

# Seconds a phase may still take: what is left of the budget, less the reserve.
left() { echo $((deadline - $(date +%s) - reserve)); }

# The path of CUDA tool $1: on PATH, else in a toolkit under /usr/local (bin/ or a folder of its
# own, as compute-sanitizer's); nothing where there is none.
cuda_tool() {
	local c
	for c in "$(command -v "$1")" /usr/local/cuda*/bin/"$1" /usr/local/cuda*/"$1"/"$1"; do
		[ -n "$c" ] && [ -x "$c" ] && echo "$c" && return
	done
}

# Runs a command under the time left ($1 seconds); a run stopped by it sets `cut`.
cut=0
timed() {
	local secs=$1 rc
	shift
	[ "$secs" -ge 1 ] || secs=1 # a phase's later step may find the budget spent
	timeout -k 10 "$secs" "$@"
	rc=$?
	[ $rc -eq 124 ] || [ $rc -eq 137 ] && cut=1
	return $rc
}

# A phase's meson test run, its output streamed into the phase's one file as it goes (so a run
# cut short keeps what it printed), then meson's own log of it; the summary on stdout.
run_tests() {
	local log=$1 secs=$2
	shift 2
	rm -f "$build/meson-logs/testlog.txt" # an earlier run's, which a killed run would leave
	timed "$secs" meson test -C "$build" --no-rebuild --verbose "$@" > "$log" 2>&1 || status=1
	sed '/^Summary of Failures/,$d' "$log" |
		grep -E '^ *[0-9]+/[0-9]+ .* (OK|FAIL|SKIP|TIMEOUT|INTERRUPT|ERROR|EXPECTEDFAIL|UNEXPECTEDPASS) '
	sed -n '/^Ok:/,/^Timeout:/p' "$log"
	{
		echo
		echo "==== $build/meson-logs/testlog.txt"
		cat "$build/meson-logs/testlog.txt"
	} >> "$log" 2>/dev/null
}

for phase in "${phases[@]}"; do
	t0=$(date +%s)
	cut=0
	if [ "$(left)" -lt 30 ]; then
		note "$phase: skipped, $(left) s left of the budget ($budget s)"
		status=1
		continue
	fi
	case $phase in
	build)
		# the machine, at the head of phases.txt (each line "machine: ...")
		{
			date -u +%FT%TZ
			echo "kernel $(uname -r) (4.4.0: gVisor, where compute-sanitizer was refused)"
			nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv
			nvcc --version | tail -2
			cc --version | head -1
			meson --version
			nproc
		} 2>&1 | sed 's/^/machine: /' | tee -a "$out/phases.txt"
		# An existing build of this checkout is rebuilt incrementally (a rerun after a fix on
		# a machine still held); anything else is set up afresh.
		if ! grep -qF "\"source\": \"$PWD\"" "$build/meson-info/meson-info.json" 2>/dev/null; then
			rm -rf "$build"
		fi
		: > "$out/build.log"
		# No -Dwerror here: this machine's host compiler is not CI's, and a warning only it
		# gives must not cost a lent GPU its run. Its warnings are counted instead.
		if { [ -f "$build/build.ninja" ] ||
			timed "$(left)" meson setup "$build" -Dcuda=enabled >> "$out/build.log" 2>&1; } &&
			timed "$(left)" ninja -C "$build" >> "$out/build.log" 2>&1; then
			:
		else
			tail -40 "$out/build.log"
			note "build failed$([ $cut -eq 1 ] && echo ', out of time') (log in $out/build.log)"
			exit 1
		fi
		note "build: $(grep -c 'warning:' "$out/build.log") compiler warnings (see build.log)"
		;;
	gpu)
		# What has never run on a GPU: test_cuda first, then the core suites on CUDA, then
		# the Python binding's CUDA tensor paths (python/tests/test_gpu.py, with PyTorch).
		secs=$(left)
		case " ${phases[*]} " in *" bench "*) secs=$((secs - bench_min)) ;; esac
		[ "$secs" -ge 30 ] || secs=$(left) # too little for both: the suite first
		run_tests "$out/test-gpu.log" "$secs" --suite gpu --suite python --num-processes 1
		# On the GPU machine a skip (exit 77) means the device was not usable: not a pass.
		skipped=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$out/test-gpu.log" | head -1)
		if [ "${skipped:-0}" -gt 0 ]; then
			note "gpu: $skipped tests skipped (no usable device?)"
			status=1
		fi
		pyskip=$(grep -m1 '^SKIPPED .*test_gpu\.py' "$out/test-gpu.log")
		if [ -n "$pyskip" ]; then
			note "gpu: the Python GPU tests skipped: $pyskip"
			status=1
		fi
		;;
	bench)
		# Lines of the table and of the CSV are flushed as each cell is measured; stopped by
		# the budget (SIGTERM), the tool still prints the targets of the cells it measured.
		# It leaves attend_secs + calib_secs to the attention benchmark and the calibration
		# (unless that leaves it under 30 s).
		read -ra bench_args <<< "${KVT_BENCH_ARGS:-}"
		secs=$(($(left) - attend_secs - calib_secs))
		[ "$secs" -ge 30 ] || secs=$(left)
		KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$secs" \
			"$build/tools/kvtier-bench" transfer --csv "$out/transfer.csv" \
			"${bench_args[@]}" > "$out/transfer.txt" 2>&1 || status=1
		cat "$out/transfer.txt"
		# The recall calls' host side and device time with the regions on the device
		# (tests/bench_recall_cuda.c): beside the host backend at a small shape (the two must
		# decide alike), then CUDA alone at 256 sequences through decode steps, as an engine
		# calls it, each scored (kvt_decode_recall) and with the selection given on the device
		# (--blocks), 60 steps (the regions grow over the first few dozen: shorter runs give
		# higher medians); then at the full 256 x 32 x 8 shape through decode steps with the
		# selection given on the device, beside the CPU reference on the same selections
		# (kvtier-bench recall --backend cuda: (a) the host's time, (b) the reference's, (c) the
		# programs' device time), the heads' dimension cut to 16 so that it fits (the host's
		# part does not depend on it), and at four other points of it; then the CPU
		# reference's bookkeeping at the issue's 8,192-token prompts (kvtier-bench recall, null
		# backend, two threads); appended to transfer.txt.
		secs=$(($(left) - attend_secs - calib_secs))
		[ "$secs" -gt 100 ] && secs=100
		if [ "$secs" -ge 25 ]; then
			for args in "16 4 4096 16 8" "--cuda-only --step 256 4 2048 16 60" \
				"--blocks 16 4 4096 16 8" "--cuda-only --step --blocks 256 4 2048 16 60"; do
				echo "==== bench_recall_cuda $args" >> "$out/transfer.txt"
				read -ra a <<< "$args"
				KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$((secs / 6))" \
					"$build/tests/bench_recall_cuda" "${a[@]}" \
					>> "$out/transfer.txt" 2>&1 || status=1
			done
			echo "==== kvtier-bench recall --backend cuda --head-dim 16 --steps 60" \
				>> "$out/transfer.txt"
			KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$((secs / 6))" \
				"$build/tools/kvtier-bench" recall --backend cuda --head-dim 16 --steps 60 \
				>> "$out/transfer.txt" 2>&1 || status=1
			# The other points at that shape, 40 steps each while the budget allows (each took
			# under 10 s on an H100): 8 sequences (against 256, a layer-call's fixed host cost
			# apart from its members'), r = 8 and 32, and 4,096-token prompts (twice the blocks
			# of a sequence).
			for args in "--seqs 8" "--r 8" "--r 32" "--prompt 4096"; do
				if [ $(($(left) - attend_secs - calib_secs)) -lt 40 ]; then
					note "bench: recall --backend cuda $args and after skipped, out of time"
					break
				fi
				echo "==== kvtier-bench recall --backend cuda --head-dim 16 --steps 40 $args" \
					>> "$out/transfer.txt"
				read -ra a <<< "$args"
				KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed 20 \
					"$build/tools/kvtier-bench" recall --backend cuda --head-dim 16 \
					--steps 40 "${a[@]}" >> "$out/transfer.txt" 2>&1 || status=1
			done
			echo "==== kvtier-bench recall --steps 24 --threads 2" >> "$out/transfer.txt"
			timed "$((secs / 6))" "$build/tools/kvtier-bench" recall --steps 24 --threads 2 \
				>> "$out/transfer.txt" 2>&1 || status=1
			sed -n '/^==== bench_recall_cuda/,/^==== kvtier-bench calibrate$/p' \
				"$out/transfer.txt"
		else
			note "bench: bench_recall_cuda skipped, $secs s left of the budget"
		fi
		# The batched attention's HBM bandwidth against the device's copy bandwidth measured
		# in the same run (kvtier-bench attend --backend cuda, goal >= 0.7; each run checks
		# its output against kvt_attend): at the host mode's batch (8 x 8,192 tokens), then
		# at 32 sequences; appended to transfer.txt. A skip (77: no plugin, runtime or
		# device) fails the phase, as any exit but 0.
		secs=$(($(left) - calib_secs))
		[ "$secs" -gt $((2 * attend_secs)) ] && secs=$((2 * attend_secs))
		if [ "$secs" -ge 20 ]; then
			for args in "--seqs 8" "--seqs 32 --reps 10"; do
				echo "==== kvtier-bench attend --backend cuda $args" >> "$out/transfer.txt"
				read -ra a <<< "$args"
				KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$((secs / 2))" \
					"$build/tools/kvtier-bench" attend --backend cuda "${a[@]}" \
					>> "$out/transfer.txt" 2>&1 || status=1
			done
			sed -n '/^==== kvtier-bench attend/,/^==== kvtier-bench calibrate$/p' \
				"$out/transfer.txt"
		else
			note "bench: kvtier-bench attend skipped, $secs s left of the budget"
			status=1
		fi
		# The replay simulator's GPU preset: the table (stderr) appended to transfer.txt, the
		# preset in preset.json; a device without a datasheet preset needs --gpu in
		# KVT_CALIB_ARGS (exit 2).
		read -ra calib_args <<< "${KVT_CALIB_ARGS:-}"
		secs=$(left)
		if [ "$secs" -lt 20 ]; then
			note "bench: calibrate skipped, $secs s left of the budget"
			status=1
		else
			echo "==== kvtier-bench calibrate" >> "$out/transfer.txt"
			KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$secs" \
				"$build/tools/kvtier-bench" calibrate --out "$out/preset.json" \
				"${calib_args[@]}" >> "$out/transfer.txt" 2>&1 || status=1
			sed -n '/^==== kvtier-bench calibrate$/,$p' "$out/transfer.txt"
		fi
		;;
	profile)
		# Where the kernels' time goes (Nsight Compute, appended to transfer.txt): the batched
		# attention at 32 sequences (its part and merge kernels, three launches after two),
		# then the recall programs' kernels (region_*, and the append's metadata fold) through
		# decode steps at 64 x 2 x 8 (selection given, twelve of their launches after the
		# first 36, which are the first six steps': ncu counts only the launches its name
		# filter lets through, and a run without the filter profiled the prefill's gathers):
		# throughput against the device's peaks, occupancy, warp stalls, launch shapes; then
		# each of those kernels' device time over 12 steps at 256 x 4 x 8 (one metric, every
		# launch: where recall_device_ns goes). A third of the time left to each.
		ncu=$(cuda_tool ncu)
		if [ -z "$ncu" ]; then
			note "profile: no ncu on this machine"
			status=1
			continue
		fi
		sections=(--section SpeedOfLight --section Occupancy --section WarpStateStats
			--section LaunchStats)
		echo "==== ncu: kvtier-bench attend --backend cuda --seqs 32 --reps 5" >> "$out/transfer.txt"
		KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$(($(left) / 3))" "$ncu" \
			--kernel-name regex:'af_part|ab_part|ab_merge' --launch-skip 2 --launch-count 3 \
			"${sections[@]}" "$build/tools/kvtier-bench" attend --backend cuda --seqs 32 \
			--reps 5 >> "$out/transfer.txt" 2>&1 || status=1
		echo "==== ncu: bench_recall_cuda --cuda-only --step --blocks 64 2 2048 16 12" \
			>> "$out/transfer.txt"
		KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$(($(left) / 2))" "$ncu" \
			--kernel-name regex:'region_|fold_' --launch-skip 36 --launch-count 12 \
			"${sections[@]}" "$build/tests/bench_recall_cuda" --cuda-only --step --blocks \
			64 2 2048 16 12 >> "$out/transfer.txt" 2>&1 || status=1
		echo "==== ncu per kernel:" \
			"bench_recall_cuda --cuda-only --step --blocks 256 4 2048 16 12" >> "$out/transfer.txt"
		KVTIER_CUDA_PLUGIN="$build/libkvtier-cuda.so" timed "$(left)" "$ncu" \
			--kernel-name regex:'region_|fold_|append_' --metrics gpu__time_duration.sum \
			--print-summary per-kernel "$build/tests/bench_recall_cuda" --cuda-only --step \
			--blocks 256 4 2048 16 12 >> "$out/transfer.txt" 2>&1 || status=1
		sed -n '/^==== ncu: kvtier-bench attend/,$p' "$out/transfer.txt" |
			grep -E -e '^====|^  [a-z_]+.*\(|Duration|Throughput|Occupancy|Registers|Cycles Per' \
				-e 'gpu__time_duration'
		;;
	sanitize)
		# The GPU suite's own test and the transfer smoke run under compute-sanitizer: out of
		# bounds and misaligned accesses (memcheck), shared-memory races below barrier
		# granularity, which the CPU emulator cannot see (racecheck), and barriers reached by
		# part of a CTA (synccheck). API errors are left out: the tests provoke some on purpose.
		cs=$(cuda_tool compute-sanitizer)
		: > "$out/sanitize.log"
		if [ -z "$cs" ]; then
			note "sanitize: no compute-sanitizer on this machine"
			status=1
			continue
		fi
		read -ra tools <<< "${KVT_SANITIZE_TOOLS:-memcheck racecheck synccheck}"
		for i in "${!tools[@]}"; do
			tool=${tools[$i]}
			# the time left, shared evenly by the tools still to run
			secs=$(($(left) / (${#tools[@]} - i)))
			if [ $secs -lt 20 ]; then
				note "sanitize: $tool skipped, out of time"
				status=1
				continue
			fi
			# meson names the log of a wrapped run after the wrapper
			log=$build/meson-logs/testlog-compute-sanitizer.txt
			rm -f "$log"
			# test_cuda's 528,000-token case left out: its CPU side would take the
			# time, and its kernels are the ones the shorter prompts run
			KVT_TEST_NO_HUGE=1 timed $secs meson test -C "$build" --no-rebuild \
				--num-processes 1 \
				--timeout-multiplier 20 \
				--wrapper "$cs --tool $tool --error-exitcode 66 --report-api-errors no" \
				cuda bench-transfer > "$out/sanitize.tmp" 2>&1 || status=1
			echo "$tool:"
			grep -E '^ *[0-9]+/[0-9]+ ' "$out/sanitize.tmp"
			{
				echo "==== compute-sanitizer --tool $tool ($secs s at most)"
				cat "$out/sanitize.tmp" "$log"
			} >> "$out/sanitize.log" 2>/dev/null
			rm -f "$out/sanitize.tmp"
		done
		;;
	rest)
		run_tests "$out/test-rest.log" "$(left)" --no-suite gpu --no-suite python
		;;
	esac
	[ $cut -eq 1 ] && status=1
	note "$phase: status $status, $(($(date +%s) - t0)) s$([ $cut -eq 1 ] && echo ', cut short by the budget')"
done
note "status $status (results in $out)${left_out:+; not run this time:$left_out}"
exit $status
