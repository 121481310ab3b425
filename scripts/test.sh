#!/usr/bin/env bash
# The test command: installs missing packages, then builds and tests zb twice,
# a dev build (build/dev) and an ASan+UBSan build (build/asan), with ctest,
# then builds without CUDA, runs the fuzz harnesses briefly and checks the
# transformers fixtures.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

usage() {
  cat <<'USAGE'
usage: scripts/test.sh [--no-deps] [--only dev|asan] [--no-fuzz] [--fuzz-seconds N] [--no-hf]
                       [-j N] [-- CTEST_ARGS...]

Runs the tests the way CI does:
  1. scripts/install-deps.sh (installs missing Debian 12 packages; as a user
     that is not root it prints the apt-get command to run instead, and
     stops), then scripts/install-py-deps.sh (the PyPI package the
     Kubernetes check uses, in build/venv-deploy; offline, that check
     skips, or fails with CI=true)
  2. lint: clang-format --dry-run --Werror on every C file, and
     scripts/check-size.sh (no product file over 700 lines, no function
     over 80), scripts/check-includes.sh (no include cycle in daemon/;
     the job core, store and config below coordinator.h)
  3. for each of the CMake presets dev (RelWithDebInfo, build/dev) and asan
     (Debug + ZB_SANITIZE=ON, build/asan):
       cmake --preset P; cmake --build --preset P -j N;
       ctest --preset P -j N --output-on-failure [CTEST_ARGS]
     The GPU path (ZB_CUDA) is AUTO: built when nvcc, CUDA and NCCL are
     found; with CI=true it is ON, so a CI machine without them fails.
  4. preset nocuda (ZB_CUDA=OFF, build/nocuda): configure, build and its
     unit tests (ctest -L unit), proving a machine without CUDA still
     builds everything else and its library passes.
  5. fuzz: scripts/fuzz.sh --seconds N builds the libFuzzer harnesses
     (preset fuzz: clang-14, ASan + UBSan, build/fuzz) and runs each for N
     seconds (default 20) on a copy of its seed corpus; a crash, leak,
     timeout or broken property fails the step (log build/fuzz.log).
  6. hf-fixtures: scripts/check-hf-fixtures.sh makes build/venv-hf (torch
     and transformers from PyPI, about 2.9 GB the first time, then kept;
     scripts/install-hf-venv.sh) and re-runs tools/hf_fixtures.py to check
     that the committed fixtures in tests/data/hf still match, then runs
     service_test_hf_checkpoint in build/dev with that venv, so that
     transformers loads models zb saved and gives zb's loss (log
     build/hf-fixtures.log). When the venv cannot be installed the step
     is skipped, or fails with CI=true.
  7. torch: the tests labelled torch (PyTorch as the oracle: csv-comm run
     by PyTorch's pipelining runtime, the zb.torch package) with the venv
     of step 6, in build/dev; step 3 leaves them out (and --no-hf this
     step). With CI=true a missing venv or a skipped test fails.
Steps 4 to 7 run only when both presets do (no --only), once each.
All builds run even when one fails. Prints a summary with the test
counts and exits non-zero if any configure, build, test, fuzz run or fixture check
failed.

  --no-deps        skip step 1
  --only dev|asan  build and test one preset only
  --no-fuzz        skip step 5
  --fuzz-seconds N fuzzing time per harness in step 5 (default 20)
  --no-hf          skip step 6
  -j N             parallel jobs for make and ctest (default: nproc, or $JOBS)
  -- CTEST_ARGS    passed to ctest, e.g. -- -R test_sim  or  -- -L unit
  --help           show this text
USAGE
}

deps=1
fuzz=1
hf=1
fuzz_seconds=20
presets=(dev asan)
jobs=${JOBS:-$(nproc)}
ctest_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-deps) deps=0 ;;
    --only)
      [[ $# -ge 2 && ($2 == dev || $2 == asan) ]] || { echo "test.sh: --only takes dev or asan" >&2; exit 2; }
      presets=("$2")
      shift
      ;;
    --no-fuzz) fuzz=0 ;;
    --no-hf) hf=0 ;;
    --fuzz-seconds)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: --fuzz-seconds takes a positive number" >&2; exit 2; }
      fuzz_seconds=$2
      shift
      ;;
    -j)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: -j takes a positive number" >&2; exit 2; }
      jobs=$2
      shift
      ;;
    -j[1-9]*) jobs=${1#-j} ;;
    --) shift; ctest_args=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [[ $deps -eq 1 ]]; then
  scripts/install-deps.sh
  scripts/install-py-deps.sh || echo "test.sh: scripts/install-py-deps.sh failed (no PyPI?): the Kubernetes check will skip (fail with CI=true)"
fi
echo "test.sh: $(cc --version | head -n1); $(cmake --version | head -n1); $jobs jobs"

summary=()
total_pass=0
total_fail=0
failed=0

echo
echo "=== lint"
mapfile -t c_files < <(git ls-files '*.c' '*.h')
if clang-format --dry-run --Werror "${c_files[@]}" && scripts/check-size.sh && scripts/check-includes.sh; then
  summary+=("lint: ok (clang-format, sizes, daemon/ include layers)")
else
  summary+=("lint: FAILED (clang-format -i FILE fixes the style; scripts/check-size.sh lists the sizes; scripts/check-includes.sh the layers)")
  failed=1
fi

cuda_flag=()
if [[ ${CI:-} == true ]]; then
  cuda_flag=(-DZB_CUDA=ON)
fi
for p in "${presets[@]}"; do
  echo
  echo "=== [$p] configure"
  if ! cmake --preset "$p" "${cuda_flag[@]}"; then
    summary+=("$p: configure FAILED")
    failed=1
    continue
  fi
  echo "=== [$p] build"
  if ! cmake --build --preset "$p" -j "$jobs"; then
    summary+=("$p: build FAILED")
    failed=1
    continue
  fi
  echo "=== [$p] ctest"
  log="build/$p/test.sh-ctest.log"
  rc=0
  # the PyTorch tests (label torch) run in step 7, once the venv exists
  ctest --preset "$p" -j "$jobs" -LE '^torch$' --output-on-failure "${ctest_args[@]}" 2>&1 | tee "$log" || rc=$?
  # ctest closes with "N% tests passed, F tests failed out of T".
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n1 || true)
  if [[ -n $line ]]; then
    read -r nfail ntotal < <(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1 \2/' <<<"$line")
    total_pass=$((total_pass + ntotal - nfail))
    total_fail=$((total_fail + nfail))
    counts="$((ntotal - nfail)) passed, $nfail failed"
  else
    counts="no test summary from ctest"
  fi
  if [[ $rc -ne 0 ]]; then
    summary+=("$p: ctest FAILED (exit $rc; $counts)")
    failed=1
  else
    summary+=("$p: ctest ok ($counts)")
  fi
done

if [[ ${#presets[@]} -eq 2 ]]; then
  echo
  echo "=== [nocuda] configure and build (ZB_CUDA=OFF)"
  log=build/nocuda.log
  mkdir -p build
  if { cmake --preset nocuda && cmake --build --preset nocuda -j "$jobs"; } >"$log" 2>&1; then
    # its unit tests: what the build without CUDA compiles differently is
    # the library and worker code they cover; the service suite runs in
    # the two presets above
    echo "=== [nocuda] ctest -L unit"
    tlog=build/nocuda/test.sh-ctest.log
    rc=0
    ctest --preset nocuda -j "$jobs" -L unit --output-on-failure 2>&1 | tee "$tlog" || rc=$?
    line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$tlog" | tail -n1 || true)
    if [[ $rc -eq 0 && -n $line ]]; then
      read -r nfail ntotal < <(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1 \2/' <<<"$line")
      total_pass=$((total_pass + ntotal - nfail))
      summary+=("nocuda: build ok (ZB_CUDA=OFF), unit ctest ok ($((ntotal - nfail)) passed, $nfail failed)")
    else
      summary+=("nocuda: unit ctest FAILED (exit $rc; see $tlog)")
      failed=1
    fi
  else
    tail -n 40 "$log"
    summary+=("nocuda: build FAILED (ZB_CUDA=OFF; see $log)")
    failed=1
  fi
fi

if [[ ${#presets[@]} -eq 2 && $fuzz -eq 1 ]]; then
  echo
  echo "=== fuzz (scripts/fuzz.sh --seconds $fuzz_seconds)"
  log=build/fuzz.log
  mkdir -p build
  rc=0
  scripts/fuzz.sh --seconds "$fuzz_seconds" -j "$jobs" 2>&1 | tee "$log" || rc=$?
  # fuzz.sh closes with "fuzz.sh: ok: N runs in ... (NAME RUNS, ...)" or
  # "fuzz.sh: FAILED: ...".
  line=$(grep -E '^fuzz.sh: ' "$log" | tail -n1 || true)
  if [[ $rc -eq 0 ]]; then
    summary+=("fuzz: ${line#fuzz.sh: }")
  else
    summary+=("fuzz: FAILED (${line#fuzz.sh: FAILED: }; see $log)")
    failed=1
  fi
fi

if [[ ${#presets[@]} -eq 2 && $hf -eq 1 ]]; then
  echo
  echo "=== hf-fixtures (scripts/check-hf-fixtures.sh)"
  log=build/hf-fixtures.log
  mkdir -p build
  rc=0
  scripts/check-hf-fixtures.sh --build build/dev 2>&1 | tee "$log" || rc=$?
  # the check closes with "hf_fixtures: check ok: ..." or a list of
  # differences; exit 77 means the venv could not be installed (not CI)
  line=$(grep -E '^hf_fixtures: check ' "$log" | tail -n1 || true)
  ck=$(grep -E '^hf_fixtures: checkpoint' "$log" | tail -n1 || true)
  if [[ $rc -eq 0 ]]; then
    summary+=("hf-fixtures: ${line#hf_fixtures: check }" "hf-checkpoint: ${ck#hf_fixtures: checkpoint: }")
  elif [[ $rc -eq 77 ]]; then
    summary+=("hf-fixtures: skipped (no transformers venv: scripts/install-hf-venv.sh failed; see $log)")
  else
    line=${line#hf_fixtures: check FAILED: }
    summary+=("hf-fixtures: FAILED (${line%:}${line:+; }exit $rc; see $log)" "${ck:-hf-checkpoint: not run}")
    failed=1
  fi
fi

if [[ ${#presets[@]} -eq 2 && $hf -eq 1 ]]; then
  echo
  echo "=== torch (ctest -L torch in build/dev, with build/venv-hf's PyTorch)"
  log=build/torch.log
  if [[ -x build/venv-hf/bin/python ]]; then
    rc=0
    ZB_TORCH_PYTHON="$ROOT/build/venv-hf/bin/python" ctest --test-dir build/dev -L '^torch$' -j 1 \
      --output-on-failure 2>&1 | tee "$log" || rc=$?
    counts=$(grep -E 'tests passed, [0-9]+ tests failed out of' "$log" | tail -n1 || true)
    skipped=$(grep -c -- '\*\*\*Skipped' "$log" || true)
    if [[ $rc -ne 0 || -z $counts || (${CI:-} == true && $skipped -gt 0) ]]; then
      summary+=("torch: FAILED (exit $rc; ${counts:-no summary}; $skipped skipped; see $log)")
      failed=1
    else
      summary+=("torch: ok ($counts; $skipped skipped)")
    fi
  elif [[ ${CI:-} == true ]]; then
    summary+=("torch: FAILED (no build/venv-hf: the hf-fixtures step could not install it)")
    failed=1
  else
    summary+=("torch: skipped (no build/venv-hf)")
  fi
fi

echo
echo "=== test.sh summary"
printf '  %s\n' "${summary[@]}"
echo "total: $total_pass passed, $total_fail failed"
if [[ $failed -ne 0 ]]; then
  echo "test.sh: FAILED"
  exit 1
fi
echo "test.sh: all passed"
