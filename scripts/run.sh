#!/usr/bin/env bash
# The main job (for now): build zbctl in build/dev, then plan, compare and
# draw zero-bubble schedules offline with `zbctl plan`.
set -euo pipefail

CALLER_DIR=$PWD
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PRESET=dev
ZBCTL=build/$PRESET/client/zbctl
OUT=build/out

usage() {
  cat <<'USAGE'
usage: scripts/run.sh [--no-deps] [-j N] [ZBCTL_ARGS...]

  1. scripts/install-deps.sh (installs missing Debian 12 packages; as a user
     that is not root it prints the apt-get command to run instead, and stops)
  2. cmake --preset dev; cmake --build --preset dev --target zbctl
     (the binary is build/dev/client/zbctl)
  3. with no ZBCTL_ARGS, the demo:
       zbctl plan compare --ranks 4 --microbatches 16
       zbctl plan --schedule zb-v --ranks 4 --microbatches 8 --format ascii
       zbctl plan --schedule zb-h1|zb-v --ranks 4 --microbatches 8 --format svg
         -o build/out/<schedule>-p4-m8.svg   (and prints where they are)
     with ZBCTL_ARGS, runs `zbctl ZBCTL_ARGS` instead, in the directory
     run.sh was started from, e.g.
       scripts/run.sh plan --schedule 1f1b --ranks 8 --microbatches 32 --format ascii

  --no-deps   skip step 1
  -j N        parallel build jobs (default: nproc, or $JOBS)
  --help      show this text
USAGE
}

deps=1
jobs=${JOBS:-$(nproc)}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-deps) deps=0 ;;
    -j)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: -j takes a positive number" >&2; exit 2; }
      jobs=$2
      shift
      ;;
    -j[1-9]*) jobs=${1#-j} ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "run.sh: unknown option '$1' (see --help; zbctl arguments start with a subcommand)" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done

if [[ $deps -eq 1 ]]; then
  scripts/install-deps.sh
fi

echo "run.sh: building zbctl (preset $PRESET, $jobs jobs)" >&2
cmake --preset "$PRESET" >/dev/null
cmake --build --preset "$PRESET" --target zbctl -j "$jobs"
if [[ ! -x $ZBCTL ]]; then
  echo "run.sh: built target zbctl but found no $ZBCTL" >&2
  exit 1
fi

if [[ $# -gt 0 ]]; then
  # Relative paths in the user's arguments (-o, --from-csv) mean what they
  # mean where run.sh was started.
  cd "$CALLER_DIR"
  exec "$ROOT/$ZBCTL" "$@"
fi

# run CMD...: shows the command as typed, then runs it.
run() {
  echo
  echo "\$ zbctl ${*:2}"
  "$@"
}

run "$ZBCTL" plan compare --ranks 4 --microbatches 16
run "$ZBCTL" plan --schedule zb-v --ranks 4 --microbatches 8 --format ascii

mkdir -p "$OUT"
svgs=()
for s in zb-h1 zb-v; do
  f="$OUT/$s-p4-m8.svg"
  run "$ZBCTL" plan --schedule "$s" --ranks 4 --microbatches 8 --format svg -o "$f"
  svgs+=("$ROOT/$f")
done

echo
echo "SVG timelines (open in a browser):"
printf '  %s\n' "${svgs[@]}"
