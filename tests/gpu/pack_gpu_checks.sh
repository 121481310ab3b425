#!/usr/bin/env bash
# pack_gpu_checks.sh BUILD_DIR DEST — gathers what run_gpu_checks.sh needs
# on a GPU machine that has no build of this project: the programs of a
# CUDA build in DEST/bin, the service tests' Python stubs in DEST/stubs,
# and in DEST/lib every shared library they load except the C library's
# own and CUDA's (libcudart, libcublas, libcublasLt, libnccl: the GPU
# machine has its own, matched to its driver). Then, there:
#   DEST/bin/../tests/gpu/run_gpu_checks.sh DEST/bin DEST/stubs OUT
# or from a checkout: tests/gpu/run_gpu_checks.sh DEST/bin DEST/stubs OUT
set -euo pipefail
build=$(cd "${1:?usage: pack_gpu_checks.sh BUILD_DIR DEST}" && pwd)
dest=${2:?DEST}
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/stubs"
progs=(daemon/zb-coordinator worker/zb-worker client/zbctl tools/zb-gradcheck bench/zb_bench_gpu
  tests/test_device_ops tests/test_flash_cuda tests/test_step_device tests/test_model_hf_cuda)
for p in "${progs[@]}"; do
  [[ -x $build/$p ]] || { echo "pack_gpu_checks: $build/$p missing (a CUDA build: -DZB_CUDA=ON)" >&2; exit 1; }
  cp "$build/$p" "$dest/bin/"
done
cp -r "$build/tests/service/py" "$build/tests/service/py-health" "$dest/stubs/"
skip='^(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux.*|libcudart|libcublas|libcublasLt|libnccl)\.so'
for p in "$dest"/bin/*; do
  ldd "$p" | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" "$dest/lib/$name"
done
strip --strip-unneeded "$dest"/bin/* "$dest"/lib/* 2>/dev/null || true
du -sh "$dest"
