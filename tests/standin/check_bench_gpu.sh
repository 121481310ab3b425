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
out=$("$bin" --hidden 32 --heads 2 --seq 16 --batch 2 --vocab 64 --layers 2 --reps 1 --nccl-max-mib 1 2>&1)
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

"$bin" --heads 3 --hidden 32 >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "--heads 3 --hidden 32 exited $rc, expected 2"
echo "check_bench_gpu: ok"
