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
# What is made is made here first and moved into $dir once all of it is:
# a failed or interrupted run leaves $dir as it was.
work="$(mktemp -d "$dir/.make_certs.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# openssl with its messages shown only when it fails.
run_openssl() {
  if ! openssl "$@" 2> "$work/openssl.log"; then
    cat "$work/openssl.log" >&2
    echo "make_certs: openssl $1 failed" >&2
    return 1
  fi
}

# $work/NAME.key and NAME.pem signed by the CA in $2, for `usage` (serverAuth
# or clientAuth) and, for a server, the subject alternative names $4.
issue() {
  local name="$1" ca="$2" usage="$3" alt="${4:-}"
  local ext="$work/$name.ext"
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
  run_openssl ecparam -name prime256v1 -genkey -noout -out "$work/$name.key.ec"
  run_openssl pkcs8 -topk8 -nocrypt -in "$work/$name.key.ec" -out "$work/$name.key"
  run_openssl req -new -key "$work/$name.key" -subj "/CN=cserps-$name" -out "$work/$name.csr"
  run_openssl x509 -req -in "$work/$name.csr" -CA "$ca/ca.pem" -CAkey "$ca/ca.key" \
    -CAserial "$work/ca.srl" -CAcreateserial -days "$days" -sha256 -extfile "$ext" \
    -out "$work/$name.pem"
  chmod 600 "$work/$name.key"
  chmod 644 "$work/$name.pem"
}

# Moves the named files from $work into $dir.
install_files() {
  local f
  for f in "$@"; do mv -f "$work/$f" "$dir/$f"; done
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
  issue "$client" "$dir" clientAuth
  install_files "$client.key" "$client.pem"
  echo "make_certs: $dir/$client.pem and $dir/$client.key"
  exit 0
fi

files=(ca.key ca.pem server.key server.pem client.key client.pem token)
if [ "$force" -eq 0 ]; then
  present=() absent=()
  for f in "${files[@]}"; do
    if [ -e "$dir/$f" ]; then present+=("$f"); else absent+=("$f"); fi
  done
  if [ ${#absent[@]} -eq 0 ]; then
    echo "make_certs: $dir already holds a CA; kept (--force makes new ones)"
    exit 0
  fi
  if [ ${#present[@]} -gt 0 ]; then
    echo "make_certs: $dir holds ${present[*]} but not ${absent[*]}; --force makes a new set" >&2
    exit 1
  fi
fi

run_openssl ecparam -name prime256v1 -genkey -noout -out "$work/ca.key"
run_openssl req -x509 -new -key "$work/ca.key" -subj "/CN=cserps job CA" -days "$days" -sha256 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$work/ca.pem"
chmod 600 "$work/ca.key"
chmod 644 "$work/ca.pem"
issue server "$work" serverAuth "$names"
issue client "$work" clientAuth
run_openssl rand -hex -out "$work/token" 32
chmod 600 "$work/token"
install_files "${files[@]}"
echo "make_certs: CA, server ($names), client and token in $dir"
