#!/usr/bin/env bash
# Makes what a secured cserps job needs (docs/security.md), with Debian's
# openssl, into DIR:
#   ca.pem ca.key            the job's certificate authority (keep ca.key off
#                            the cluster; only ca.pem is distributed)
#   server.pem server.key    the servers' certificate, valid for NAMES
#   client.pem client.key    the workers' certificate
#   token                    the job's token (64 hex digits)
# NAMES (comma-separated) are the host names and IP addresses the workers
# use to reach the servers; default localhost,127.0.0.1.
#
#   tools/make_certs.sh DIR [NAMES]   keeps what DIR already holds
#   tools/make_certs.sh --force DIR [NAMES]
#   tools/make_certs.sh [--force] --client NAME DIR   another worker
#                            certificate, NAME.pem and NAME.key, signed by
#                            DIR's CA (not ca, server or client; kept if
#                            there, unless --force)
set -euo pipefail

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

force=0
client=""
while [ $# -gt 0 ]; do
  case "$1" in
    --force) force=1; shift ;;
    --client) [ $# -ge 2 ] || usage; client="$2"; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "make_certs: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] && [ $# -le 2 ] || usage
dir="$1"
names="${2:-localhost,127.0.0.1}"
days=825

command -v openssl > /dev/null || {
  echo "make_certs: openssl is missing (apt-get install openssl)" >&2
  exit 1
}
mkdir -p "$dir"
umask 077

# NAME.key and NAME.pem signed by the CA in $dir, for `usage` (serverAuth or
# clientAuth) and, for a server, the subject alternative names $3.
issue() {
  local name="$1" usage="$2" alt="${3:-}"
  local ext
  ext="$(mktemp)"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    if [ -n "$alt" ]; then
      local entries=() entry
      IFS=',' read -ra parts <<< "$alt"
      for entry in "${parts[@]}"; do
        if [[ "$entry" =~ ^[0-9.]+$ || "$entry" == *:* ]]; then
          entries+=("IP:$entry")
        else
          entries+=("DNS:$entry")
        fi
      done
      (IFS=','; echo "subjectAltName=${entries[*]}")
    fi
  } > "$ext"
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/$name.key.tmp" 2> /dev/null
  openssl pkcs8 -topk8 -nocrypt -in "$dir/$name.key.tmp" -out "$dir/$name.key"
  rm -f "$dir/$name.key.tmp"
  openssl req -new -key "$dir/$name.key" -subj "/CN=cserps-$name" -out "$dir/$name.csr"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days "$days" -sha256 -extfile "$ext" -out "$dir/$name.pem" 2> /dev/null
  rm -f "$dir/$name.csr" "$ext" "$dir/ca.srl"
  chmod 600 "$dir/$name.key"
  chmod 644 "$dir/$name.pem"
}

if [ -n "$client" ]; then
  case "$client" in
    ca|server|client)
      echo "make_certs: --client $client would replace the job's own $client files; pick another name" >&2
      exit 2 ;;
  esac
  [[ "$client" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || {
    echo "make_certs: --client $client: a name of letters, digits, '.', '_' and '-'" >&2
    exit 2
  }
  if [ "$force" -eq 0 ] && { [ -e "$dir/$client.key" ] || [ -e "$dir/$client.pem" ]; }; then
    echo "make_certs: $dir already holds $client.key or $client.pem; kept (--force replaces them)" >&2
    exit 1
  fi
  [ -f "$dir/ca.pem" ] && [ -f "$dir/ca.key" ] || {
    echo "make_certs: $dir holds no ca.pem and ca.key to sign $client with" >&2
    exit 1
  }
  issue "$client" clientAuth
  echo "make_certs: $dir/$client.pem and $dir/$client.key"
  exit 0
fi

if [ -f "$dir/ca.pem" ] && [ "$force" -eq 0 ]; then
  echo "make_certs: $dir already holds a CA; kept (--force makes new ones)"
  exit 0
fi

openssl ecparam -name prime256v1 -genkey -noout -out "$dir/ca.key" 2> /dev/null
openssl req -x509 -new -key "$dir/ca.key" -subj "/CN=cserps job CA" -days "$days" -sha256 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$dir/ca.pem"
chmod 600 "$dir/ca.key"
chmod 644 "$dir/ca.pem"
issue server serverAuth "$names"
issue client clientAuth
openssl rand -hex 32 > "$dir/token"
chmod 600 "$dir/token"
echo "make_certs: CA, server ($names), client and token in $dir"
