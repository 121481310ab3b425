#!/usr/bin/env bash
# install-mkl-venv.sh [--check | --help]
#
# Makes the Python virtual environment that holds Intel's MKL for a build
# with -DZB_BLAS=mkl (docs/model.md, BLAS): build/venv-mkl with the wheels
# mkl (the runtime: libmkl_rt.so.2 and the libraries it loads) and
# mkl-devel (the headers, mkl_cblas.h among them) from PyPI, at the
# version pinned below. The build reads them from -DZB_MKL_ROOT (default
# build/venv-mkl) and links libmkl_rt.so.2 with an rpath into the venv.
# Idempotent: a venv that already has the pinned version is left as it
# is. Needs Debian's python3 with the venv module (package python3-venv)
# and, the first time, network access to PyPI and about 1 GB of disk.
# Offline or failing, it says so and exits 1.
#
#   --check   exit 0 when the venv has the pinned version, 1 otherwise
#   --help    show this text
#
# ZB_MKL_VENV overrides the venv's path.
set -euo pipefail
# shellcheck source=venv-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/venv-lib.sh"
tag=install-mkl-venv

MKL_VERSION=2025.2.0

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${ZB_MKL_VENV:-$root/build/venv-mkl}
venv_args 2 17 "$@"

want="mkl=$MKL_VERSION mkl-devel=$MKL_VERSION"

# "mkl=V mkl-devel=V" as installed, and only when the header and the
# link-time library are where the build looks for them.
installed_versions() {
  [[ -f $venv/include/mkl_cblas.h && -e $venv/lib/libmkl_rt.so.2 ]] || return 1
  "$venv/bin/python" - <<'PY' 2>/dev/null
from importlib.metadata import version
print(" ".join(f"{n}={version(n)}" for n in ("mkl", "mkl-devel")))
PY
}

venv_done_or_check "$(installed_versions || true)" "$want"
venv_create
echo "install-mkl-venv: pip install $want into $venv (about 0.5 GB from PyPI the first time)"
start=$SECONDS
if ! "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --timeout 20 --retries 1 \
  "mkl==$MKL_VERSION" "mkl-devel==$MKL_VERSION"; then
  echo "install-mkl-venv: pip install failed (no network to PyPI, or no disk space?); $venv is incomplete" >&2
  exit 1
fi
have=$(installed_versions || true)
if [[ $have != "$want" ]]; then
  echo "install-mkl-venv: installed, but mkl_cblas.h or libmkl_rt.so.2 is missing under $venv, or the versions" \
    "differ (${have:-none})" >&2
  exit 1
fi
echo "install-mkl-venv: done in $((SECONDS - start)) s: $have"
