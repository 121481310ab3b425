#!/usr/bin/env bash
# run.sh BUILD_DIR ZBCTL — ctest's python_plan: installs the zb package
# (python/) into BUILD_DIR/venv-py and runs python/tests/test_plan.py
# there against ZBCTL, the oracle.
#
# The venv is Debian's python3's (python3-venv; the extension needs
# python3-dev's headers). setuptools and wheel come from PyPI once; when
# they cannot (no network) the test skips (exit 77), unless CI=true, where
# that is a failure. The package is then built without network and
# without build isolation from a fresh copy of python/ and lib/ under
# BUILD_DIR, so the checkout stays clean and every run compiles the
# current sources; CFLAGS=-Werror makes the extension's warnings errors.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: python/tests/run.sh BUILD_DIR ZBCTL" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "$1" && pwd)
zbctl=$(realpath "$2")
venv=$build/venv-py
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3)

skip_or_fail() {
  if [[ ${CI:-} == true ]]; then
    echo "python_plan: FAILED: $1 (CI=true needs it)" >&2
    exit 1
  fi
  echo "python_plan: skipped: $1" >&2
  exit 77
}

if [[ ! -x $venv/bin/python ]] && ! "$py" -m venv "$venv"; then
  rm -rf "$venv"
  skip_or_fail "'$py -m venv' failed: install the Debian package python3-venv"
fi
if ! "$venv/bin/python" -c 'import setuptools, wheel' 2>/dev/null; then
  "$venv/bin/python" -m pip install -q 'setuptools>=61' wheel || skip_or_fail "setuptools and wheel from PyPI"
fi

src=$build/py-src
rm -rf "$src"
mkdir -p "$src"
cp -r "$root/lib" "$root/python" "$src/"
rm -rf "$src/python/build" "$src/python"/*.egg-info
CFLAGS="-Werror ${CFLAGS:-}" "$venv/bin/python" -m pip install -q --no-index --no-build-isolation "$src/python"
cd "$root/python/tests"
exec "$venv/bin/python" test_plan.py "$zbctl"
