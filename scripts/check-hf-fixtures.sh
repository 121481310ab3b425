#!/usr/bin/env bash
# check-hf-fixtures.sh [--build DIR] [--help]
#
# Checks that the committed transformers fixtures (tests/data/hf) are still
# what tools/hf_fixtures.py makes: installs build/venv-hf when it lacks the
# pinned torch and transformers (scripts/install-hf-venv.sh), then runs
# `tools/hf_fixtures.py --check tests/data/hf`, which regenerates them in a
# temporary folder and names every file, key or tensor that differs.
# With --build DIR (a build tree with the daemons), it then runs the
# service test service_test_hf_checkpoint there with ZB_HF_PYTHON set to
# the venv's python: transformers loads a model zb trained and saved, and
# its loss must equal zb's.
#
# Exit status: 0 when they match, 1 when they differ or the check cannot
# run. When the venv cannot be installed (no network to PyPI, no disk):
# with CI=true that is a failure (exit 1); otherwise it prints why and
# exits 77, which scripts/test.sh reports as skipped.
#
# ZB_HF_VENV overrides the venv's path (as for install-hf-venv.sh).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${ZB_HF_VENV:-$root/build/venv-hf}

build=
case "${1:-}" in
  "") ;;
  --build)
    [[ $# -eq 2 && -d $2 ]] || { echo "check-hf-fixtures: --build takes a build directory" >&2; exit 2; }
    build=$2
    ;;
  -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "check-hf-fixtures: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac

if ! scripts/install-hf-venv.sh --check >/dev/null 2>&1; then
  if ! scripts/install-hf-venv.sh; then
    if [[ ${CI:-} == true ]]; then
      echo "check-hf-fixtures: FAILED: could not install the transformers venv (scripts/install-hf-venv.sh); CI=true needs it" >&2
      exit 1
    fi
    echo "check-hf-fixtures: skipped: could not install the transformers venv (scripts/install-hf-venv.sh says why above)" >&2
    exit 77
  fi
fi
rc=0
"$venv/bin/python" tools/hf_fixtures.py --check tests/data/hf || rc=$?
if [[ -n $build ]]; then
  # the test prints one line per architecture with both losses
  if ZB_HF_PYTHON="$venv/bin/python" ctest --test-dir "$build" -R '^service_test_hf_checkpoint$' \
    --output-on-failure -V 2>&1 | tee "$build/hf-checkpoint.log" | grep -E 'held-out loss|FAIL|Error'; then :; fi
  if grep -q '100% tests passed' "$build/hf-checkpoint.log" && grep -q 'transformers [0-9]' "$build/hf-checkpoint.log"; then
    echo "hf_fixtures: checkpoint: transformers loads zb's saved models with zb's loss ($build/hf-checkpoint.log)"
  else
    echo "hf_fixtures: checkpoint FAILED: service_test_hf_checkpoint with transformers (see $build/hf-checkpoint.log)"
    rc=1
  fi
fi
exit $rc
