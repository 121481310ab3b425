#!/usr/bin/env bash
# install-py-deps.sh [--check | --help]
#
# Makes the Python virtual environment that the deployment test
# (tests/deploy/test_k8s.py) uses to validate the rendered Kubernetes
# manifests: build/venv-deploy with kubernetes-validate (from PyPI) pinned
# below. Idempotent: a venv that already has the pinned version is left as
# it is. Needs Debian's python3 with the venv module (package python3-venv)
# and, the first time, network access to PyPI.
#
#   --check   exit 0 when the venv has the pinned version, 1 otherwise
#   --help    show this text
#
# ZB_DEPLOY_VENV overrides the venv's path.
set -euo pipefail
# shellcheck source=venv-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/venv-lib.sh"
tag=install-py-deps

# The pin: kubernetes-validate carries the JSON schemas of Kubernetes
# 1.25..1.37; the test validates against one of them (tests/deploy/test_k8s.py).
KV_VERSION=1.37.0

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${ZB_DEPLOY_VENV:-$root/build/venv-deploy}
venv_args 2 14 "$@"

installed_version() {
  [[ -x $venv/bin/python ]] || return 1
  "$venv/bin/python" - <<'EOF' 2>/dev/null
from importlib.metadata import version
print("kubernetes-validate " + version("kubernetes-validate"))
EOF
}

venv_done_or_check "$(installed_version || true)" "kubernetes-validate $KV_VERSION"
venv_create
# Short timeouts and one retry: without network this fails in seconds, and
# the test then skips its schema validation, saying why.
echo "install-py-deps: pip install kubernetes-validate==$KV_VERSION into $venv"
if ! "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --timeout 10 --retries 1 \
  "kubernetes-validate==$KV_VERSION"; then
  echo "install-py-deps: pip install failed (no network to PyPI?)" >&2
  exit 1
fi
echo "install-py-deps: done: $("$venv/bin/kubernetes-validate" --version 2>&1 | tail -1)"
