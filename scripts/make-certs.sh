#!/usr/bin/env bash
# make-certs.sh DIR [--host NAME]... [--worker ID]... [--user NAME]...
#               [--admin NAME]... [--days N]
#
# Makes a certificate authority for one zb cluster and the certificates
# its parties present (docs/operations.md, Security), with openssl:
#   DIR/ca.pem, ca.key                 the CA (keep ca.key off the cluster)
#   DIR/coordinator.pem, .key          the coordinator's server certificate:
#                                      DNS localhost, IP 127.0.0.1 and every
#                                      --host (a name or an IP address)
#   DIR/worker-ID.pem, .key            zb://worker/ID: may Attach and Report
#                                      as worker ID only
#   DIR/user-NAME.pem, .key            zb://user/NAME: its own jobs
#   DIR/admin-NAME.pem, .key           zb://admin/NAME: every job
# An existing DIR/ca.pem and ca.key are reused, so more certificates can be
# added later; keys are 0600. --days: validity (default 365; -1 makes an
# already expired certificate, which the tests use).
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
[[ $# -ge 1 && $1 != -h && $1 != --help ]] || { usage; [[ $# -ge 1 ]] && exit 0 || exit 2; }
dir=$1
shift
hosts=() workers=() users=() admins=() days=365
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "make-certs: $1 needs a value" >&2; exit 2; }
  case $1 in
    --host) hosts+=("$2") ;;
    --worker) workers+=("$2") ;;
    --user) users+=("$2") ;;
    --admin) admins+=("$2") ;;
    --days) days=$2 ;;
    *) echo "make-certs: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift 2
done
command -v openssl >/dev/null || { echo "make-certs: openssl not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
for n in "${workers[@]}" "${users[@]}" "${admins[@]}"; do
  [[ $n =~ ^[A-Za-z0-9._@-]{1,63}$ ]] || { echo "make-certs: '$n': names are 1..63 of A-Z a-z 0-9 . _ @ -" >&2; exit 2; }
done
mkdir -p "$dir"
umask 077

if [[ ! -f $dir/ca.pem || ! -f $dir/ca.key ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/O=zb/CN=zb cluster CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# sign FILE CN SAN EKU: a P-256 key and a certificate signed by the CA.
sign() {
  local out=$1 cn=$2 san=$3 eku=$4 ext
  ext=$(mktemp)
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' \
    "$san" "$eku" >"$ext"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/O=zb/CN=$cn" \
    -keyout "$dir/$out.key" -out "$dir/$out.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$out.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -extfile "$ext" -out "$dir/$out.pem" -days "$days" 2>/dev/null
  rm -f "$dir/$out.csr" "$ext"
  chmod 600 "$dir/$out.key"
  echo "make-certs: $dir/$out.pem ($san)"
}

san="DNS:localhost,IP:127.0.0.1"
for h in "${hosts[@]}"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+=",IP:$h"; else san+=",DNS:$h"; fi
done
[[ -f $dir/coordinator.pem && ${#hosts[@]} -eq 0 ]] || sign coordinator zb-coordinator "$san" serverAuth
for n in "${workers[@]}"; do sign "worker-$n" "$n" "URI:zb://worker/$n" clientAuth; done
for n in "${users[@]}"; do sign "user-$n" "$n" "URI:zb://user/$n" clientAuth; done
for n in "${admins[@]}"; do sign "admin-$n" "$n" "URI:zb://admin/$n" clientAuth; done
