#!/usr/bin/env bash
# run_gpu_checks.sh BIN_DIR STUBS_DIR OUT_DIR — the GPU checks of issue 10
# in one run, for a machine with a GPU but without this project's build
# dependencies (a lent device machine): every program comes prebuilt in
# BIN_DIR (zb-coordinator, zb-worker, zbctl, zb-gradcheck, zb_bench_gpu,
# test_device_ops, test_flash_cuda, test_step_device, test_model_hf_cuda, from a CUDA build), the service tests'
# Python stubs in STUBS_DIR (py/ and py-health/, as the build tree's
# tests/service/ holds them), shared libraries the machine lacks in
# BIN_DIR/../lib (tests/gpu/pack_gpu_checks.sh gathers all three from a
# build). On a machine that has the build, `ctest -L gpu` runs the same
# programs.
#
# Runs, each with a time limit, logging to OUT_DIR/NAME.log:
#   device_ops    every device op on the real runtime against the host
#                 (flash attention up to T = 1024 included);
#   flash_memory  flash attention's allocator peak against the unfused one's;
#   step_device   the optimizer step on the device against the host step;
#   model_hf      GPT-2 and LLaMA on the device against transformers'
#                 loss and gradients (tests/data/hf);
#   service       test_cuda_standin.py with ZB_CUDA_REAL=1 (one GPU: every
#                 worker on it, transport tcp; two or more: nccl);
#   bench         zb_bench_gpu at its default shapes (fp32, then bf16).
# Prints one line per check and exits non-zero if any failed.
set -uo pipefail
bin=$(cd "${1:?usage: run_gpu_checks.sh BIN_DIR STUBS_DIR OUT_DIR}" && pwd)
stubs=$(cd "${2:?STUBS_DIR}" && pwd)
out=${3:?OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# CUDA's libraries where the machine keeps them (toolkit or pip wheels).
libdirs=$(cd "$bin/../lib" 2>/dev/null && pwd)
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  f=$(find /usr/local /usr/lib /opt -name "$n" 2>/dev/null | head -n 1)
  [[ -n $f ]] && libdirs="$libdirs:$(dirname "$f")"
  echo "library $n: ${f:-NOT FOUND}"
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi -L || true

fails=0
check() { # check NAME LIMIT_S CMD...
  local name=$1 limit=$2 rc
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  echo "check $name: exit $rc after $((SECONDS - t0)) s"
  [[ $rc -eq 0 ]] || fails=$((fails + 1))
}

check device_ops 180 "$bin/test_device_ops"
check flash_memory 60 "$bin/test_flash_cuda"
check step_device 60 "$bin/test_step_device"
check model_hf 120 env ZB_TEST_DATA_DIR="$here/../data" "$bin/test_model_hf_cuda"
check service 330 env ZB_CUDA_REAL=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
  ZB_COORDINATOR_BIN="$bin/zb-coordinator" ZB_WORKER_BIN="$bin/zb-worker" ZBCTL_BIN="$bin/zbctl" \
  ZB_GRADCHECK_BIN="$bin/zb-gradcheck" ZB_PY_STUBS="$stubs/py" \
  ZB_PY_HEALTH_PB2="$stubs/py-health/grpc/health/v1/health_pb2.py" \
  python3 "$here/../service/test_cuda_standin.py"
check bench_fp32 90 "$bin/zb_bench_gpu"
check bench_bf16 60 "$bin/zb_bench_gpu" --precision bf16
echo "gpu checks: $fails failed"
[[ $fails -eq 0 ]]
