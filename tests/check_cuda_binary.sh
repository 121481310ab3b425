#!/usr/bin/env bash
# check_cuda_binary.sh BINARY — checks a product binary of the GPU path
# (docs/model.md, Devices): the real libcudart, libcublas and libnccl are
# in its DT_NEEDED and resolve (ldd), and its fatbinary holds sm_80 and
# sm_90 code and compute_90 PTX. The toolkit ships no cuobjdump; the
# fatbinary is built uncompressed (cmake/ZbCuda.cmake), so its targets
# read as plain strings: "-arch sm_80" / "-arch sm_90" in each cubin's
# options, ".target sm_90" in the PTX. Exits 1 naming what is missing.
set -euo pipefail
bin=${1:?usage: check_cuda_binary.sh BINARY}
[[ -x $bin ]] || { echo "check_cuda_binary: $bin: not an executable" >&2; exit 1; }
bad=0
needed=$(objdump -p "$bin" | awk '$1 == "NEEDED" {print $2}')
resolved=$(ldd "$bin")
for lib in libcudart.so libcublas.so libnccl.so; do
  if ! grep -q "^$lib" <<<"$needed"; then
    echo "check_cuda_binary: $bin does not link $lib (NEEDED: $(tr '\n' ' ' <<<"$needed"))" >&2
    bad=1
  elif grep "$lib" <<<"$resolved" | grep -q "not found"; then
    echo "check_cuda_binary: $lib of $bin does not resolve: $(grep "$lib" <<<"$resolved")" >&2
    bad=1
  else
    echo "linked: $(grep "$lib" <<<"$resolved" | sed 's/^[[:space:]]*//')"
  fi
done
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
if ! objcopy -O binary --only-section=.nv_fatbin "$bin" "$tmp" 2>/dev/null || [[ ! -s $tmp ]]; then
  echo "check_cuda_binary: $bin has no .nv_fatbin section" >&2
  exit 1
fi
text=$(strings "$tmp")
for want in "-arch sm_80" "-arch sm_90" ".target sm_90"; do
  if grep -qF -- "$want" <<<"$text"; then
    echo "fatbinary: found '$want'"
  else
    echo "check_cuda_binary: the fatbinary of $bin lacks '$want'" >&2
    bad=1
  fi
done
exit $bad
