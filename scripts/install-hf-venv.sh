#!/usr/bin/env bash
# install-hf-venv.sh [--check | --help]
#
# Makes the Python virtual environment in which tools/hf_fixtures.py runs
# Hugging Face transformers on the CPU as the oracle of zb's models:
# build/venv-hf with torch, transformers, safetensors and numpy from PyPI,
# at the versions pinned below. Idempotent: a venv that already has the
# pinned versions is left as it is. Needs Debian's python3 with the venv
# module (package python3-venv) and, the first time, network access to
# PyPI and about 9 GB of disk (see below). Offline or failing, it says so
# and exits 1; the caller decides whether that skips or fails.
#
#   --check   exit 0 when the venv has the pinned versions, 1 otherwise
#   --help    show this text
#
# ZB_HF_VENV overrides the venv's path.
#
# Why the whole CUDA build of torch: PyPI's only torch wheel for Linux
# x86-64 is the CUDA one, and PyTorch's CPU-only index is not reachable
# here. `pip install torch --no-deps` with only its pure-Python
# dependencies installs (540 MB) but `import torch` then fails, even on the
# CPU: libtorch_cuda.so and libtorch_python.so are linked against cuDNN,
# cuBLAS, cuFFT, cuSPARSE(Lt), cuFile, NCCL, NVSHMEM, NVRTC and the CUDA
# runtime, so the loader needs every one of them (first missing here:
# libcufile.so.0). A CUDA toolkit on the machine does not stand in for
# them either: it lacks cuDNN, cuSPARSELt, NVSHMEM and cuFile, and its
# minor version need not be the one torch was built for. Leaving out only
# what is not linked (triton, cuda-bindings: about 0.3 GB of 2.9 GB) would
# mean keeping a copy of torch's dependency list here in step with each
# torch release; so the script installs the pinned packages with their
# declared dependencies, as pip resolves them, which is what PyTorch
# supports. Measured on the Debian 12 machine of this project (2 cores):
# 2.9 GB downloaded (kept again in pip's cache unless PIP_NO_CACHE_DIR is
# set), 5.6 GB installed, 84 s with an empty pip cache.
set -euo pipefail
# shellcheck source=venv-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/venv-lib.sh"
tag=install-hf-venv

# The pins: the fixtures in tests/data/hf were made with these versions;
# changing one means regenerating them (tools/hf_fixtures.py --out).
TORCH_VERSION=2.15.0
TRANSFORMERS_VERSION=5.23.0
SAFETENSORS_VERSION=0.8.0
NUMPY_VERSION=2.4.6
# zb.torch.attach's gRPC (python/zb/torch/agent.py): grpcio at run time,
# grpcio-tools to generate the stubs when the zb package is built (the
# torch tests install it without build isolation, so from this venv).
GRPCIO_VERSION=1.85.1

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${ZB_HF_VENV:-$root/build/venv-hf}
venv_args 2 16 "$@"

want="torch=$TORCH_VERSION transformers=$TRANSFORMERS_VERSION safetensors=$SAFETENSORS_VERSION numpy=$NUMPY_VERSION grpcio=$GRPCIO_VERSION grpcio-tools=$GRPCIO_VERSION"

# Prints "torch=V transformers=V safetensors=V numpy=V" as installed, and
# fails unless torch also imports (a half-installed venv must not pass).
installed_versions() {
  [[ -x $venv/bin/python ]] || return 1
  "$venv/bin/python" - <<'EOF' 2>/dev/null
from importlib.metadata import version
import torch  # noqa: F401  (the import itself is what is checked)
print(" ".join(f"{n}={version(n)}" for n in ("torch", "transformers", "safetensors", "numpy", "grpcio", "grpcio-tools")))
EOF
}

venv_done_or_check "$(installed_versions || true)" "$want"
venv_create
# Short timeouts and one retry: without network this fails in seconds
# rather than after pip's default three minutes per try.
echo "install-hf-venv: pip install $want into $venv (about 2.9 GB from PyPI the first time)"
start=$SECONDS
if ! "$venv/bin/python" -m pip install --disable-pip-version-check --quiet --timeout 20 --retries 1 \
  "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" \
  "safetensors==$SAFETENSORS_VERSION" "numpy==$NUMPY_VERSION" \
  "grpcio==$GRPCIO_VERSION" "grpcio-tools==$GRPCIO_VERSION"; then
  echo "install-hf-venv: pip install failed (no network to PyPI, or no disk space?); $venv is incomplete" >&2
  exit 1
fi
have=$(installed_versions || true)
if [[ $have != "$want" ]]; then
  echo "install-hf-venv: installed, but 'import torch' fails or the versions differ (${have:-torch does not import})" >&2
  exit 1
fi
echo "install-hf-venv: done in $((SECONDS - start)) s: $have"
