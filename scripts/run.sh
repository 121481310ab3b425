#!/usr/bin/env bash
# The main job: a local zb cluster on this machine trains a model. Builds
# the daemons and zbctl (build/dev), starts a zb-coordinator and one
# zb-worker per rank (cpu backend with real math, TCP transport) in a
# temporary data directory, submits the default job (a small
# LLaMA-architecture model on the bytes of a text, 1f1b on 2 ranks),
# switches the running job to zb-v half-way with `zbctl update-schedule`,
# streams loss, tokens/s, bubble and memory with `zbctl watch`, prints a
# summary per schedule and shuts everything down cleanly, also on Ctrl-C.
set -euo pipefail

CALLER_DIR=$PWD
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PRESET=dev
BIN=build/$PRESET

usage() {
  cat <<'USAGE'
usage: scripts/run.sh [--no-deps] [-j N] [--workers N] [--job FILE] [--switch-to S] [--switch-at N] [--keep]
       scripts/run.sh [--no-deps] [-j N] ZBCTL_ARGS...     (e.g. plan compare --ranks 4 --microbatches 16)

With no ZBCTL_ARGS, runs a local cluster:
  1. scripts/install-deps.sh (installs missing Debian 12 packages; as a user
     that is not root it prints the apt-get command to run instead, and stops)
  2. cmake --preset dev; builds zb-coordinator, zb-worker and zbctl
  3. starts zb-coordinator (gRPC and /metrics on free loopback ports) and the
     workers, in a temporary directory (data, logs)
  4. submits the job (default deploy/jobs/local-train.yaml: a small
     LLaMA-architecture model, deploy/models/llama-tiny, learning the bytes
     of /usr/share/common-licenses/GPL-3, 1f1b, 2 ranks, 4 microbatches,
     80 iterations, every iteration's timeline sampled) and
     runs `zbctl watch --every 10` on it; once half its iterations are done,
     `zbctl update-schedule JOB --schedule zb-v` switches the running job
     (its ranks move their stages' weights to the V placement and go on)
     (deploy/jobs/local-train-builtin.yaml is the same with the builtin
     byte model, deploy/jobs/llama.yaml and gpt2.yaml start from the
     transformers fixtures' weights on token shards, deploy/jobs/
     local-demo.yaml is the sim-backend demo: --job one)
  5. prints a summary per schedule (iterations, throughput, bubble measured
     on the aligned timelines and predicted from the op times they taught,
     the largest gap between the two over the windows of 10 iterations),
     the loss first -> last, then stops the workers and the coordinator
     (SIGTERM) and removes the temporary directory (kept with --keep, or
     on failure)

  --workers N     workers to start (default: the job's ranks; one per core
                  keeps the measured bubble the schedule's, not a wait for a CPU)
  --job FILE      job spec to submit instead of the default
  --switch-to S   schedule to switch the running job to (default zb-v for the
                  default job, none for --job); 'none' keeps its schedule
  --switch-at N   switch once N iterations are done (default: half the job's)
  --keep          keep the temporary directory (data, logs) at the end
  --no-deps       skip step 1
  -j N            parallel build jobs (default: nproc, or $JOBS)
  --help          show this text

With ZBCTL_ARGS, builds zbctl and runs `zbctl ZBCTL_ARGS` in the directory
run.sh was started from (offline planning needs no cluster).
USAGE
}

deps=1
jobs=${JOBS:-$(nproc)}
workers=
job=deploy/jobs/local-train.yaml
default_job=1
switch_to=
switch_at=
every=10
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-deps) deps=0 ;;
    -j)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: -j takes a positive number" >&2; exit 2; }
      jobs=$2
      shift
      ;;
    -j[1-9]*) jobs=${1#-j} ;;
    --workers)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --workers takes a positive number" >&2; exit 2; }
      workers=$2
      shift
      ;;
    --job)
      [[ $# -ge 2 ]] || { echo "run.sh: --job takes a file" >&2; exit 2; }
      job=$(cd "$CALLER_DIR" && realpath "$2")
      default_job=0
      shift
      ;;
    --switch-to)
      [[ $# -ge 2 && $2 =~ ^[a-z0-9-]+$ ]] || { echo "run.sh: --switch-to takes a schedule name or none" >&2; exit 2; }
      switch_to=$2
      shift
      ;;
    --switch-at)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --switch-at takes a positive number" >&2; exit 2; }
      switch_at=$2
      shift
      ;;
    --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done

if [[ $deps -eq 1 ]]; then
  scripts/install-deps.sh
fi

echo "run.sh: building (preset $PRESET, $jobs jobs)" >&2
cmake --preset "$PRESET" >/dev/null
if [[ $# -gt 0 ]]; then
  cmake --build --preset "$PRESET" --target zbctl -j "$jobs" >/dev/null
  cd "$CALLER_DIR"
  exec "$ROOT/$BIN/client/zbctl" "$@"
fi
cmake --build --preset "$PRESET" --target zb-coordinator zb-worker zbctl -j "$jobs" >/dev/null
for b in daemon/zb-coordinator worker/zb-worker client/zbctl; do
  [[ -x $BIN/$b ]] || { echo "run.sh: $BIN/$b was not built (are the service packages installed?)" >&2; exit 1; }
done
[[ -r $job ]] || { echo "run.sh: cannot read job spec $job" >&2; exit 1; }

ranks=$(sed -n 's/^ranks:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$job" | head -n1)
iterations=$(sed -n 's/^iterations:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$job" | head -n1)
[[ -n $workers ]] || workers=${ranks:-4}
if [[ -z $switch_to ]]; then
  if [[ $default_job -eq 1 ]]; then switch_to=zb-v; else switch_to=none; fi
fi
[[ -n $switch_at ]] || switch_at=$(( ${iterations:-2} / 2 ))

# The summary, from the job's history: per schedule (in the order they ran;
# a schedule's first iteration is left out of its means, it warms up), the
# throughput and the bubble measured on the aligned timelines against the
# one predicted from the op times they taught; then the largest gap between
# the two over windows of $2 iterations, and the loss.
summary() {
  local tokens
  tokens=$("$ZBCTL" get "$1" --output json | jq -r '(.spec.model.batch // 0) * (.spec.model.seq_len // 0)')
  "$ZBCTL" watch "$1" --output json 2>/dev/null | jq -rs --argjson tok "${tokens:-0}" --argjson every "$2" '
    def r4: . * 10000 | round / 10000;
    def mean: if length == 0 then null else add / length end;
    [ .[] | select(.iteration != null) | .iteration ] as $it
    | if ($it | length) == 0 then "  no iteration completed" else
        ( reduce $it[] as $x ([]; if length > 0 and .[-1][0].schedule == $x.schedule
                                  then .[-1] += [$x] else . + [[$x]] end) ) as $segs
        | ($segs[] | . as $seg | ($seg[1:] // $seg) as $st | ($st | map(select(.aligned == true))) as $al
           | "  \($seg[0].schedule | (. + "        ")[0:8]) iterations \($seg[0].iteration + 1)-\($seg[-1].iteration + 1): "
             + "\($st | map(.samples_per_second) | mean | . * 10 | round / 10) microbatches/s"
             + (if $tok > 0 then " (\($st | map(.samples_per_second * $tok) | mean | round) tokens/s)" else "" end)
             + (if ($al | length) > 0
                then ", bubble \($al | map(.bubble_ratio) | mean | r4) measured, \($al | map(.predicted_bubble_ratio) | mean | r4) predicted"
                else ", bubble \($st | map(.bubble_ratio) | mean | r4) measured (no sampled timelines)" end)),
          ( [ range(0; $it | length; $every) as $k | $it[$k:$k + $every] | map(select(.aligned == true))
              | select(length > 0)
              | { first: (.[0].iteration + 1), last: (.[-1].iteration + 1),
                  gap: ((map(.bubble_ratio) | mean) - (map(.predicted_bubble_ratio) | mean) | fabs) } ] as $w
            | if ($w | length) == 0 then empty else
                ($w | max_by(.gap)) as $m
                | "  windows      \($w | length) of \($every) iterations: measured and predicted bubble differ by at most \($m.gap | r4) (iterations \($m.first)-\($m.last))"
              end),
          (if $it[0].has_loss then
             "  loss         \($it[0].loss | r4) (iteration 1) -> \($it[-1].loss | r4) (iteration \($it | length))"
           else empty end)
      end'
}

tmp=$(mktemp -d /tmp/zb-local.XXXXXX)
pids=()
coord_pid=
status=1

cleanup() {
  trap - EXIT INT TERM
  echo
  echo "run.sh: stopping ${#pids[@]} workers and the coordinator"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ -n $coord_pid ]]; then
    kill -TERM "$coord_pid" 2>/dev/null || true
    wait "$coord_pid" 2>/dev/null || true
  fi
  if [[ $keep -eq 1 || $status -ne 0 ]]; then
    echo "run.sh: data and logs kept in $tmp"
  else
    rm -rf "$tmp"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'status=130; cleanup' INT TERM

"$BIN/daemon/zb-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$tmp/data" \
  --port-file "$tmp/ports" 2>"$tmp/coordinator.log" &
coord_pid=$!
for _ in $(seq 200); do [[ -s $tmp/ports ]] && break; sleep 0.05; done
[[ -s $tmp/ports ]] || { echo "run.sh: the coordinator did not start:" >&2; tail "$tmp/coordinator.log" >&2; exit 1; }
read -r grpc_port metrics_port <"$tmp/ports"
export ZB_COORDINATOR=127.0.0.1:$grpc_port
ZBCTL=$BIN/client/zbctl

for i in $(seq 0 $((workers - 1))); do
  "$BIN/worker/zb-worker" --coordinator "$ZB_COORDINATOR" --id "local-w$i" 2>"$tmp/worker-$i.log" &
  pids+=($!)
done
for _ in $(seq 200); do
  n=$("$ZBCTL" workers --output json 2>/dev/null | grep -c '"id"' || true)
  [[ $n -ge $workers ]] && break
  sleep 0.05
done

echo "zb local cluster: coordinator $ZB_COORDINATOR, metrics http://127.0.0.1:$metrics_port/metrics, $workers workers"
echo "logs and data: $tmp"
echo
echo "\$ zbctl workers"
"$ZBCTL" workers
echo
echo "\$ zbctl submit ${job#"$ROOT"/}"
job_id=$("$ZBCTL" submit "$job")
echo "$job_id"

# Switches the running job once switch_at iterations are done (not when it
# ended first, or with --switch-to none). It follows the job's own event
# stream rather than polling, so it takes no CPU from the ranks.
switcher() {
  [[ $switch_to != none ]] || return 0
  local line done=0
  while IFS= read -r line; do
    [[ $line == *'"iteration":{'* ]] || continue
    done=$((done + 1))
    if [[ $done -ge $switch_at ]]; then
      echo
      echo "\$ zbctl update-schedule $job_id --schedule $switch_to     (after $done iterations)"
      "$ZBCTL" update-schedule "$job_id" --schedule "$switch_to" || true
      echo
      break
    fi
  done < <("$ZBCTL" watch "$job_id" --output json 2>/dev/null)
}
switcher &
switcher_pid=$!

echo
echo "\$ zbctl watch $job_id --every $every"
if "$ZBCTL" watch "$job_id" --every "$every"; then status=0; else status=1; fi
wait "$switcher_pid" 2>/dev/null || true
echo
echo "\$ zbctl get $job_id"
"$ZBCTL" get "$job_id" || status=1
echo
echo "summary:"
summary "$job_id" "$every" || true
cores=$(nproc)
if [[ $workers -gt $cores ]]; then
  echo "  note: $workers workers share $cores cores here, so ranks also wait for a CPU; the measured bubble"
  echo "        counts that wait, the spec's prediction does not (it plans with the job's op costs); the"
  echo "        timelines' prediction does (it uses the op times the workers measured)"
fi
echo
echo "metrics (excerpt):"
if command -v curl >/dev/null 2>&1; then
  curl -s "http://127.0.0.1:$metrics_port/metrics" | grep -E '^zb_(jobs\{|workers_attached |job_iterations_total\{|reports_total )' || true
fi
