#!/usr/bin/env bash
# check_bench_gpu.sh BINARY — the smoke run of zb_bench_gpu_standin (the
# GPU benchmark's sources against the CPU stand-in; docs/model.md, The CPU
# stand-in) with tiny shapes: it exits 0; prints F, B and W rows for the
# middle and the last stage whose matrix FLOPs are the model's (closed
# form below) and whose times and ratios are numbers; says the stand-in's
# timings mean nothing; says NCCL and the measured pipeline need 2 GPUs
# (the stand-in has one device); prints the predicted bubbles of 1f1b and
# zb-v with zb-v's below 1f1b's. A bad flag exits 2. Exits 1 naming the
# first check that failed.
set -uo pipefail
bin=${1:?usage: check_bench_gpu.sh BINARY}
fail() { echo "check_bench_gpu: $*" >&2; printf '%s\n' "$out" >&2; exit 1; }
out=$("$bin" --hidden 32 --heads 2 --seq 16 --batch 2 --vocab 64 --layers 2 --reps 1 --nccl-max-mib 1 \
  --mfu-layers 1 --mfu-batch 1 --mfu-seq 16 --mfu-heads 2 2>&1)
rc=$?
[[ $rc -eq 0 ]] || fail "exit status $rc, expected 0"
printf '%s\n' "$out"

# Matrix FLOPs of one stage of 2 blocks, h = 32, 2 heads (d = 16), T = 16,
# batch 2 (N = 32 tokens): linears 2N x 12h^2 per op and block (F: x W^T,
# B: dy W, W: dy^T x); attention F 2 products, B 4, each 2 x B x heads x
# T^2 x d (T < 32: one row block, so the causal skip computes all of it);
# the last stage adds its head (vocab 64): 2N h V in F, B and W each.
lin=$((2 * 32 * 12 * 32 * 32)) att=$((2 * 2 * 2 * 16 * 16 * 16)) head=$((2 * 32 * 32 * 64))
declare -A want=([middle F]=$((2 * (lin + 2 * att))) [middle B]=$((2 * (lin + 4 * att))) [middle W]=$((2 * lin)))
want[last F]=$((want[middle F] + head))
want[last B]=$((want[middle B] + head))
want[last W]=$((want[middle W] + head))
num='[0-9]+(\.[0-9]+)?(e[-+][0-9]+)?'
for stage in middle last; do
  for op in F B W; do
    row=$(grep -E "^$stage +$op +$num +[0-9]+ +$num +$num +$num +$num +[0-9]+%$" <<<"$out") ||
      fail "no well-formed row for $stage $op"
    gflop=$(awk '{print $3}' <<<"$row")
    awk -v g="$gflop" -v w="${want[$stage $op]}" 'BEGIN { d = g * 1e9 - w; exit !(d < w * 1e-3 && d > -w * 1e-3) }' ||
      fail "$stage $op: $gflop GFLOP, expected ${want[$stage $op]} FLOPs"
  done
done
grep -q "^stand-in: .*timings mean nothing" <<<"$out" || fail "no stand-in line"
grep -qE "^2\. NCCL [0-9]+ send/recv: needs 2 GPUs .*this machine has 1" <<<"$out" || fail "no NCCL line"
grep -q "predicted from measured op times" <<<"$out" || fail "no prediction"
b1=$(awk '$1 == "1f1b" && NF == 3 {sub("%", "", $3); print $3}' <<<"$out")
bv=$(awk '$1 == "zb-v" && NF == 3 {sub("%", "", $3); print $3}' <<<"$out")
[[ -n $b1 && -n $bv ]] || fail "no predicted bubble rows"
awk -v a="$b1" -v b="$bv" 'BEGIN { exit !(b < a && a < 100 && b >= 0) }' ||
  fail "predicted bubbles: 1f1b $b1%, zb-v $bv% (expected 0 <= zb-v < 1f1b < 100)"
grep -qE "measured: needs 2 GPUs or more \(this machine has 1\)" <<<"$out" || fail "no pipeline line"

# close: FLOPs (a GFLOP figure of 6 digits) within 1e-5 of an exact count.
close() { awk -v g="$1" -v w="$2" 'BEGIN { d = g * 1e9 - w; exit !(d <= w * 1e-5 && d >= -w * 1e-5) }'; }

# 4. MFU. Model FLOPs of a middle stage of 1 block, 1 sequence of T = 16
# tokens, width scaled to 2 heads: per op 2 N P for the linear weights (P
# elements) and, for attention, 2 hd T(T+1) heads (2 products of the
# causal half) in F, twice that in B, none in W. gpt2: h 128 (head dim
# 64), MLP 512, P = 12 h^2; llama: h 256 (head dim 128), 2 heads on 1
# key/value head, SwiGLU of 14336 * 2/32 = 896, P = h (2 + 2) 128 + 2 128
# h + 3 h 896. The stand-in is in no table of peaks: no MFU.
declare -A P=([gpt2]=$((12 * 128 * 128)) [llama]=$((256 * 4 * 128 + 2 * 128 * 256 + 3 * 256 * 896)))
declare -A HD=([gpt2]=64 [llama]=128)
grep -q "^   gpt2: hidden 128, 2 heads .*vocab 50257 (padded 50304)$" <<<"$out" || fail "no gpt2 shape line (padded vocab)"
grep -q "^   llama: hidden 256, 2 heads on 1 key/value heads of 128, MLP 896 (SwiGLU)" <<<"$out" || fail "no llama shape line"
grep -q "^   peak unknown: .* no MFU$" <<<"$out" || fail "no 'peak unknown' line for the stand-in"
for arch in gpt2 llama; do
  lin=$((2 * 16 * P[$arch])) att=$((2 * HD[$arch] * 16 * 17 * 2))
  declare -A mf=([F]=$((lin + att)) [B]=$((lin + 2 * att)) [W]=$lin)
  mf[F+B+W]=$((mf[F] + mf[B] + mf[W]))
  for op in F B W F+B+W; do
    row=$(grep -E "^$arch +${op//+/\\+} +$num +$num +$num +-$" <<<"$out") || fail "no well-formed MFU row for $arch $op"
    close "$(awk '{print $3}' <<<"$row")" "${mf[$op]}" || fail "MFU $arch $op: $(awk '{print $3}' <<<"$row") GFLOP, expected ${mf[$op]} FLOPs"
  done
done

# 5. Flash attention: the device has none (say so), or rows for flash and
# unfused F and B with causal FLOPs 2 hd T(T+1) heads batch = 2*16*16*17*2*2
# in F and twice that in B; the unfused path's peaks are exactly O + P in F
# (32 tokens x 32 + 2 x 2 x 16 x 16 floats) and that + dP + dQKV (32 x 96)
# in B; flash F holds at least O and the log-sum-exps (2 x 2 x 16), and
# flash's F and B peaks are below the unfused ones (no T x T buffer); the
# two paths agree to 1e-4.
if ! grep -q "^flash attention: not on this device" <<<"$out"; then
  ff=$((2 * 16 * 16 * 17 * 2 * 2))
  declare -A fw=([F]=$ff [B]=$((2 * ff)))
  declare -A upk=([F]=$(((32 * 32 + 2 * 2 * 16 * 16) * 4)) [B]=$(((32 * 32 + 2 * 2 * 2 * 16 * 16 + 32 * 96) * 4)))
  for path in flash unfused; do
    for op in F B; do
      row=$(grep -E "^$path +$op +$num +$num +$num +[0-9]+ +$num$" <<<"$out") || fail "no well-formed flash row for $path $op"
      close "$(awk '{print $3}' <<<"$row")" "${fw[$op]}" || fail "flash section $path $op: wrong FLOPs in '$row'"
      pk=$(awk '{print $6}' <<<"$row")
      [[ $path == flash || $pk -eq ${upk[$op]} ]] || fail "unfused $op peak $pk bytes, expected ${upk[$op]}"
      [[ $path == unfused || $op == B || $pk -ge $(((32 * 32 + 2 * 2 * 16) * 4)) ]] || fail "flash F peak $pk below O + L"
      [[ $path == unfused || $pk -lt ${upk[$op]} ]] || fail "flash $op peak $pk bytes, not below the unfused ${upk[$op]}"
    done
  done
  diffs=$(sed -nE 's/^   flash against unfused: O differs by ([^,]+), dQ\|dK\|dV by ([^ ]+) .*/\1 \2/p' <<<"$out")
  [[ -n $diffs ]] || fail "no flash/unfused comparison line"
  awk -v a="${diffs% *}" -v b="${diffs#* }" 'BEGIN { exit !(a < 1e-4 && b < 1e-4) }' || fail "flash differs from unfused: $diffs"
fi

# 6. Host syncs: rows for m = 4, 8, 16 with the same positive total, and
# the verdict says so.
totals=()
for m in 4 8 16; do
  row=$(grep -E "^syncs +$m +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +$num$" <<<"$out") || fail "no well-formed host-sync row for m = $m"
  totals+=("$(awk '{print $6}' <<<"$row")")
done
[[ ${totals[0]} -ge 1 && ${totals[0]} == "${totals[1]}" && ${totals[1]} == "${totals[2]}" ]] ||
  fail "host syncs per iteration not constant in m: ${totals[*]} for m = 4, 8, 16"
grep -q "^   host syncs constant in m: yes$" <<<"$out" || fail "no 'constant in m: yes' line"

"$bin" --heads 3 --hidden 32 >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "--heads 3 --hidden 32 exited $rc, expected 2"
"$bin" --sections model,bogus >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "--sections model,bogus exited $rc, expected 2"
echo "check_bench_gpu: ok"
