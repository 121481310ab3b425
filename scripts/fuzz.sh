#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, CMake preset fuzz: clang-14 with
# ASan + UBSan, build/fuzz) and runs each for a bounded time on a copy of
# its seed corpus, so CI catches a parser that crashes, leaks, hangs or
# breaks a round trip on input nobody wrote a test for.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

HARNESSES=(jobspec coord_config csv action proto tcp_frame safetensors)

usage() {
  cat <<USAGE
usage: scripts/fuzz.sh [--seconds N] [--only NAME] [-j N]

Builds the fuzz preset (cmake --preset fuzz; cmake --build --preset fuzz;
output in build/fuzz-build.log) and runs each harness fuzz_NAME for N
seconds (default 20), one after the other, with
  -max_total_time=N -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
on a copy of fuzz/corpus/NAME in build/fuzz/run/NAME/corpus (the
repository's corpus is never written). Prints per harness the executions
per second and the total executions, then a summary line.
On a finding (crash, leak, timeout, out of memory, a broken property) it
prints libFuzzer's report and the path of the input that caused it
(build/fuzz/run/NAME/artifacts/), and exits 1; a failed build exits 1 too.
Reproduce a finding: build/fuzz/fuzz/fuzz_NAME PATH.

  --seconds N  fuzzing time per harness (default 20)
  --only NAME  run one harness: ${HARNESSES[*]}
  -j N         parallel jobs for the build (default: nproc, or \$JOBS)
  --help       show this text
USAGE
}

seconds=20
only=""
jobs=${JOBS:-$(nproc)}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds takes a positive number" >&2; exit 2; }
      seconds=$2
      shift
      ;;
    --only)
      [[ $# -ge 2 && " ${HARNESSES[*]} " == *" $2 "* ]] ||
        { echo "fuzz.sh: --only takes one of: ${HARNESSES[*]}" >&2; exit 2; }
      only=$2
      shift
      ;;
    -j)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: -j takes a positive number" >&2; exit 2; }
      jobs=$2
      shift
      ;;
    -j[1-9]*) jobs=${1#-j} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $only ]] && HARNESSES=("$only")

echo "=== fuzz: build (preset fuzz, build/fuzz; log build/fuzz-build.log)"
mkdir -p build
if ! { cmake --preset fuzz && cmake --build --preset fuzz -j "$jobs"; } >build/fuzz-build.log 2>&1; then
  tail -n 40 build/fuzz-build.log
  echo "fuzz.sh: FAILED: the fuzz build (needs clang-14 and libclang-rt-14-dev: scripts/install-deps.sh)"
  exit 1
fi

# UBSan stops at its first report (-fno-sanitize-recover=all in the build).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

# Runs harness $1; prints its line and, on a finding, the report.
run_one() {
  local h=$1 work="build/fuzz/run/$1" rc=0
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp fuzz/corpus/"$h"/* "$work/corpus/"
  "build/fuzz/fuzz/fuzz_$h" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 || rc=$?
  # With -print_final_stats libFuzzer ends with stat:: lines, after a
  # finding too (its "Done N runs in S second(s)" line only without one).
  local runs rate
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -n1)
  mapfile -t found < <(find "$work/artifacts" -type f)
  if [[ $rc -eq 0 && ${#found[@]} -eq 0 ]]; then
    printf '  fuzz_%-13s ok: %s runs, %s exec/s, %s s\n' "$h" "${runs:-?}" "${rate:-?}" "$seconds"
    total_runs=$((total_runs + ${runs:-0}))
    counts+=("$h ${runs:-?}")
    return 0
  fi
  printf '  fuzz_%-13s FINDING (exit %d) after %s runs; libFuzzer said:\n' "$h" "$rc" "${runs:-?}"
  grep -E -A8 'ERROR:|property failed|runtime error' "$work/log" | head -n 30 | sed 's/^/    /'
  printf '    input: %s\n' "${found[@]:-none written (see $work/log)}"
  printf '    reproduce: build/fuzz/fuzz/fuzz_%s %s\n' "$h" "${found[0]:-}"
  counts+=("$h FINDING")
  failed=1
}

echo "=== fuzz: ${#HARNESSES[@]} harness(es), $seconds s each"
total_runs=0
failed=0
counts=()
for h in "${HARNESSES[@]}"; do
  run_one "$h"
done
summary=$(printf '%s, ' "${counts[@]}")
if [[ $failed -ne 0 ]]; then
  echo "fuzz.sh: FAILED: ${summary%, }"
  exit 1
fi
echo "fuzz.sh: ok: $total_runs runs in ${#HARNESSES[@]} harness(es), ${seconds} s each (${summary%, })"
