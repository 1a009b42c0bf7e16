#!/usr/bin/env bash
# Brings docker-compose.yml up for real and checks it: a private
# Docker engine (own socket, data and exec directories; no bridge, no
# iptables, no forwarding, so every container uses the host's network and
# only 127.0.0.1), a debian:bookworm base made with debootstrap (no registry
# but Debian's is reachable), the CPU image and Debian's Prometheus built with
# docker-compose, then two servers, two CPU workers and Prometheus from
# docker-compose.yml plus tests/integration/compose/docker-compose.check.yml
# (a short job on ports picked here). The job must finish with a sane
# accuracy, Prometheus in its container must have scraped every server and
# worker (tools/prometheus/check.py --verify), and the servers must shut down
# cleanly. Afterwards nothing is left: containers, networks, the daemon, its
# mounts. The base image and the image layers are cached in $CACHE.
#
#   tools/compose_check.sh          (run by ctest as deploy_compose_up)
#
# Exit 77 (skipped) when not root: a private dockerd needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "$(id -u)" -ne 0 ]; then
  echo "compose_check: skipped: a private dockerd needs root"
  exit 77
fi
tools/setup.sh --docker

CACHE=${CSERPS_COMPOSE_CACHE:-/var/cache/cserps/compose-check}
MIRROR=${CSERPS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$CACHE"
# One check at a time per cache: the daemon locks its data directory.
exec 9>"$CACHE/lock"
flock --timeout 1800 9

WORK=$(mktemp -d /tmp/cserps-compose.XXXXXX)
export DOCKER_HOST="unix://$WORK/docker.sock"
PROJECT="cserps-check-$$"
COMPOSE=(docker-compose --project-name "$PROJECT" --project-directory "$ROOT"
         -f docker-compose.yml -f tests/integration/compose/docker-compose.check.yml
         --profile cpu-workers)
DOCKERD_PID=""
nets_before=$(ls /sys/class/net)

step() { echo "compose_check: $*"; }

cleanup() {
  local rc=$?
  set +e
  if [ -n "$DOCKERD_PID" ]; then
    if [ $rc -ne 0 ]; then
      timeout 60 "${COMPOSE[@]}" logs --no-color --tail=40 2>&1 | tail -n 200
    fi
    timeout 120 "${COMPOSE[@]}" down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1
    kill -TERM "$DOCKERD_PID" 2>/dev/null
    for _ in $(seq 1 300); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$DOCKERD_PID" 2>/dev/null
    wait "$DOCKERD_PID" 2>/dev/null
  fi
  # The daemon unmounts its layers when it stops; anything a killed daemon
  # left mounted under its directories goes here.
  awk -v w="$WORK" -v c="$CACHE/docker" '$2 ~ "^" w || $2 ~ "^" c {print $2}' /proc/mounts |
    sort -r | while read -r m; do umount -l "$m"; done
  if [ $rc -ne 0 ] && [ -f "$WORK/dockerd.log" ]; then
    echo "--- dockerd log (tail) ---"; tail -n 30 "$WORK/dockerd.log"
  fi
  rm -rf "$WORK"
  if [ "$(ls /sys/class/net)" != "$nets_before" ]; then
    echo "compose_check: network interfaces changed: $(ls /sys/class/net | tr '\n' ' ')"
    rc=1
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Some VMs refuse to raise rlimits: containers get the limits this shell
# already has instead of dockerd's defaults, which runc would fail to set.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
nofile="$(ulimit -Sn):$(ulimit -Hn)"

step "starting a private dockerd (data in $CACHE/docker)"
dockerd --host="$DOCKER_HOST" --data-root="$CACHE/docker" --exec-root="$WORK/exec" \
  --pidfile="$WORK/dockerd.pid" --iptables=false --ip6tables=false --ip-forward=false \
  --ip-masq=false --bridge=none --default-ulimit "nofile=$nofile" \
  >"$WORK/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 1 300); do
  docker version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || { echo "compose_check: dockerd exited"; exit 1; }
  sleep 0.1
done
docker version >/dev/null

if ! docker image inspect debian:bookworm >/dev/null 2>&1; then
  if [ ! -f "$CACHE/bookworm-minbase.tar" ]; then
    step "debootstrap --variant=minbase bookworm from $MIRROR"
    timeout 900 debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" \
      >"$WORK/debootstrap.log" 2>&1 || { tail -n 20 "$WORK/debootstrap.log"; exit 1; }
    tar -C "$WORK/rootfs" -cf "$CACHE/bookworm-minbase.tar.part" .
    mv "$CACHE/bookworm-minbase.tar.part" "$CACHE/bookworm-minbase.tar"
    rm -rf "$WORK/rootfs"
  fi
  docker import --change 'CMD ["bash"]' "$CACHE/bookworm-minbase.tar" debian:bookworm >/dev/null
fi

# Ports for 2 servers, their bulk transports and metrics, 2 workers' metrics
# and Prometheus, below the kernel's ephemeral range (check.py's
# free_port_range): a port the kernel hands out before its owner starts (a
# listener on port 0, the own end of one of Prometheus' first scrapes) once
# took a worker's metrics port here.
read -r CHECK_SERVER_0 CHECK_SERVER_1 CHECK_BULK_0 CHECK_BULK_1 CHECK_SERVER_METRICS_0 \
  CHECK_SERVER_METRICS_1 CHECK_WORKER_METRICS_0 CHECK_WORKER_METRICS_1 CHECK_PROMETHEUS \
  < <(python3 -c '
import sys
sys.path.insert(0, "tools/prometheus")
from check import free_port_range
base = free_port_range(9)
print(*range(base, base + 9))')
CHECK_DIR=$WORK
CHECK_JOB="cluster.servers=127.0.0.1:$CHECK_SERVER_0,127.0.0.1:$CHECK_SERVER_1;cluster.num_workers=2;epochs=2;log_every_steps=500"
# As docker-compose.yml's workers: the client certificate, not the servers'.
CHECK_WORKER_JOB="$CHECK_JOB;security.cert=/etc/cserps/certs/client.pem;security.key=/etc/cserps/certs/client.key"
export CHECK_SERVER_0 CHECK_SERVER_1 CHECK_BULK_0 CHECK_BULK_1 CHECK_SERVER_METRICS_0 \
  CHECK_SERVER_METRICS_1 CHECK_WORKER_METRICS_0 CHECK_WORKER_METRICS_1 CHECK_PROMETHEUS \
  CHECK_DIR CHECK_JOB CHECK_WORKER_JOB
mkdir -m 1777 "$WORK/out"
cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 500ms
  scrape_timeout: 500ms
scrape_configs:
  - job_name: cserps
    static_configs:
      - targets: ["127.0.0.1:$CHECK_SERVER_METRICS_0", "127.0.0.1:$CHECK_SERVER_METRICS_1"]
        labels: {role: server}
      - targets: ["127.0.0.1:$CHECK_WORKER_METRICS_0", "127.0.0.1:$CHECK_WORKER_METRICS_1"]
        labels: {role: worker}
EOF
chmod 644 "$WORK/prometheus.yml"

step "building the images (log: docker-compose build)"
start=$SECONDS
timeout 1500 "${COMPOSE[@]}" build server-0 prometheus >"$WORK/build.log" 2>&1 ||
  { tail -n 60 "$WORK/build.log"; exit 1; }
step "images built in $((SECONDS - start)) s"
# Images the rebuild replaced would pile up in the cache.
docker image prune --force >/dev/null

step "up: servers and prometheus"
timeout 120 "${COMPOSE[@]}" up --detach server-0 server-1 prometheus
python3 tools/prometheus/check.py --port="$CHECK_PROMETHEUS" --wait-targets=4

step "up: two CPU workers"
start=$SECONDS
timeout 120 "${COMPOSE[@]}" up --detach worker-cpu worker-cpu-1
for service in worker-cpu worker-cpu-1; do
  id=$("${COMPOSE[@]}" ps --quiet "$service")
  code=$(timeout 600 docker wait "$id")
  if [ "$code" != 0 ]; then
    echo "compose_check: $service exited with $code"
    exit 1
  fi
  # Secured rounds go over the bulk transport (TLS with the job's client
  # certificate); a worker refused there falls back to gRPC and says so.
  if fallback=$(docker logs "$id" 2>&1 | grep "rounds go over gRPC"); then
    echo "compose_check: $service did not use the bulk transport:"
    echo "$fallback"
    exit 1
  fi
done
step "job finished in $((SECONDS - start)) s"

python3 tools/prometheus/check.py --verify --port="$CHECK_PROMETHEUS" --out="$WORK/out" \
  --workers=2 --servers=2 --min-accuracy=0.75

# SIGTERM must shut the servers down cleanly (exit status 0).
timeout 120 "${COMPOSE[@]}" stop --timeout 20 server-0 server-1 >/dev/null 2>&1
for service in server-0 server-1; do
  code=$(docker inspect --format '{{.State.ExitCode}}' "$("${COMPOSE[@]}" ps --quiet "$service")")
  if [ "$code" != 0 ]; then
    echo "compose_check: $service exited with $code after SIGTERM"
    exit 1
  fi
done
step "passed"
