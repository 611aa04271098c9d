#!/usr/bin/env bash
# tapwire-make-certs (scripts/make-certs.sh in the workspace): a private CA and the certificates for tapwire's tls:// endpoints (docs/operations.md).
#
#   tapwire-make-certs OUT_DIR SERVER_NAME [SERVER_NAME ...]
#
# SERVER_NAME: the host names and IP addresses clients use to reach the worker (each goes into the
# server certificate's subjectAltName; the first is also its CN), e.g. `drafter-1.internal 10.0.3.7`.
# Writes into OUT_DIR (created; existing files are never overwritten, so re-running after adding a
# host fails instead of silently replacing the CA):
#   ca.crt      the CA certificate: --tls-ca on the worker, `tls.ca` on the client
#   ca.key      the CA key: keep it offline; it signs every certificate below
#   server.crt  server.key   the worker's --tls-cert / --tls-key (serverAuth)
#   client.crt  client.key   the engine's `tls.cert` / `tls.key` (clientAuth, CN tapwire-client)
# Keys are ECDSA P-256, mode 0600. Validity: CA 10 years, server and client 825 days
# (TAPWIRE_CERT_DAYS overrides the latter). Needs openssl 1.1.1 or newer.
set -euo pipefail

if [[ $# -lt 2 || "$1" == "-h" || "$1" == "--help" ]]; then
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -ge 1 && ("$1" == "-h" || "$1" == "--help") ]] && exit 0
  exit 2
fi

out=$1
shift
days=${TAPWIRE_CERT_DAYS:-825}
command -v openssl >/dev/null || { echo "make-certs.sh: openssl not found" >&2; exit 1; }
mkdir -p "$out"
for f in ca.key ca.crt server.key server.crt client.key client.crt; do
  if [[ -e "$out/$f" ]]; then
    echo "make-certs.sh: $out/$f exists; use a new folder (refusing to overwrite)" >&2
    exit 1
  fi
done

san=""
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then
    san+="${san:+,}IP:$name"
  else
    san+="${san:+,}DNS:$name"
  fi
done

umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key "$out/ca.key"
openssl req -x509 -new -key "$out/ca.key" -sha256 -days 3650 -subj "/CN=tapwire private CA" \
  -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$out/ca.crt"

sign() { # sign NAME CN EXTFILE
  key "$out/$1.key"
  openssl req -new -key "$out/$1.key" -subj "/CN=$2" -out "$tmp/$1.csr"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -CAserial "$tmp/ca.srl" -sha256 -days "$days" -extfile "$3" -out "$out/$1.crt" 2>/dev/null
}

cat >"$tmp/server.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$san
EOF
sign server "$1" "$tmp/server.ext"

cat >"$tmp/client.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
EOF
sign client tapwire-client "$tmp/client.ext"

chmod 600 "$out"/*.key
chmod 644 "$out"/*.crt
openssl verify -CAfile "$out/ca.crt" "$out/server.crt" "$out/client.crt" >/dev/null
echo "make-certs.sh: wrote $out/{ca,server,client}.{crt,key} (server names: $san)"
