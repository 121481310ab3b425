#!/usr/bin/env bash
# Installs the Debian 12 packages zb needs to build, test and run, if any are
# missing. The package list lives here and nowhere else.
set -euo pipefail

# --- The packages, by what needs them -------------------------------------
# Build: C compiler, make, CMake (>= 3.25 for CMakePresets.json v6), pkg-config.
BUILD_PKGS=(build-essential cmake pkg-config)
# Tests: python3 for tool tests, xmllint (libxml2-utils) checks SVG/XML
# output, rsvg-convert (librsvg2-bin) renders SVG to PNG, jq checks JSON.
TEST_PKGS=(python3 libxml2-utils librsvg2-bin jq)
# Coming with the service (coordinator/worker); NOT installed yet. When the
# service lands, add these here (names checked with apt-cache policy on Debian 12):
#   event loop:    libuv1-dev
#   gRPC + protos: libgrpc-dev protobuf-compiler-grpc libprotobuf-c-dev protobuf-c-compiler
#   config, store: libyaml-dev libsqlite3-dev
#   test tools:    prometheus (for promtool) python3-grpcio
# SERVICE_PKGS=(libuv1-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-c-dev protobuf-c-compiler
#               libyaml-dev libsqlite3-dev prometheus python3-grpcio)
ALL_PKGS=("${BUILD_PKGS[@]}" "${TEST_PKGS[@]}")
# ---------------------------------------------------------------------------

usage() {
  cat <<USAGE
usage: scripts/install-deps.sh [--check | --list | --help]

Installs the Debian 12 packages zb needs that are not installed yet:
  build: ${BUILD_PKGS[*]}
  tests: ${TEST_PKGS[*]}
Checks each with dpkg-query; when all are present it does nothing and exits 0.
As root it runs 'apt-get update' and then
'apt-get install -y --no-install-recommends' for the missing ones only.
When not root it prints the exact command to run and exits 1.

  --check   only report missing packages; exit 0 if none, 1 otherwise
  --list    print the package names, one per line, and exit
  --help    show this text
USAGE
}

mode=install
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --list) mode=list ;;
  -h | --help) usage; exit 0 ;;
  *) echo "install-deps: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
if [[ $# -gt 1 ]]; then
  echo "install-deps: takes at most one argument (see --help)" >&2
  exit 2
fi

if [[ $mode == list ]]; then
  printf '%s\n' "${ALL_PKGS[@]}"
  exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: dpkg-query not found: this script knows Debian 12 only." >&2
  echo "install-deps: install the equivalents of: ${ALL_PKGS[*]}" >&2
  exit 1
fi
if [[ -r /etc/os-release ]]; then
  os_id=$(. /etc/os-release && echo "${ID:-}")
  os_ver=$(. /etc/os-release && echo "${VERSION_ID:-}")
  if [[ $os_id != debian || $os_ver != 12 ]]; then
    echo "install-deps: warning: written for Debian 12, this is ${os_id:-?} ${os_ver:-?}" >&2
  fi
fi

missing=()
for pkg in "${ALL_PKGS[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  [[ $mode == check ]] && echo "install-deps: all ${#ALL_PKGS[@]} packages are installed"
  exit 0
fi

echo "install-deps: missing Debian packages: ${missing[*]}" >&2
if [[ $mode == check ]]; then
  exit 1
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: not root, so not installing. Run this, then run your command again:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-deps: apt-get update" >&2
apt-get update -q
echo "install-deps: apt-get install -y --no-install-recommends ${missing[*]}" >&2
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done" >&2
