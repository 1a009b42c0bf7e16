#!/usr/bin/env bash
# Time to accuracy where bandwidth is scarce: the job's servers in one network
# namespace, each worker in a namespace of its own, every worker's link a
# veth pair rate-limited by tc tbf in both directions. Addresses are only in
# 127.0.0.0/8 (route_localnet on); everything is created here and removed on
# every exit path, and every process is stopped.
#
#   sudo tools/bench/netem_tta.sh [--rates=100mbit,1gbit] [--methods=ssgd,m-cser-256]
#       [--job=configs/quickstart.textproto] [--target=0.85] [--epochs=3]
#       [--evals=10] [--out=out/tta] [--bin=build/bin] [--max_seconds=1800]
#       [--set='field=value;...']   (more job overrides, for every run)
#
# Prints, per rate and method, the wall time until the test accuracy (rank
# 0's local model, evals per epoch) first reaches the target, the final
# global accuracy, the bytes rank 0 pushed and pulled, and the speedup over
# S-SGD on the same link; writes the table to <out>/tta.md, a plot per rate
# to <out>/tta_<rate>.png (with python3-matplotlib) and each run's worker
# outputs under <out>/<rate>/<method>/. Needs root (network
# namespaces, tc). Results: docs/results/tta.md.
set -euo pipefail

cd "$(dirname "$0")/../.."
RATES=100mbit,1gbit
METHODS=ssgd,m-cser-256
JOB=configs/quickstart.textproto
TARGET=0.85
EPOCHS=3
EVALS=10
OUT=out/tta
BIN=build/bin
MAX_SECONDS=1800  # per run: its processes are stopped after this
EXTRA_SET=""
for arg in "$@"; do
  case "$arg" in
    --rates=*) RATES=${arg#*=} ;;
    --methods=*) METHODS=${arg#*=} ;;
    --job=*) JOB=${arg#*=} ;;
    --target=*) TARGET=${arg#*=} ;;
    --epochs=*) EPOCHS=${arg#*=} ;;
    --evals=*) EVALS=${arg#*=} ;;
    --out=*) OUT=${arg#*=} ;;
    --bin=*) BIN=${arg#*=} ;;
    --max_seconds=*) MAX_SECONDS=${arg#*=} ;;
    --set=*) EXTRA_SET=${arg#*=} ;;
    *) echo "netem_tta.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

# The methods' job overrides (docs/results/convergence*.md's settings).
declare -A METHOD_SET=(
  [ssgd]="algorithm.name=ssgd"
  [m-cser-32]="algorithm.name=m-cser;algorithm.period=16;algorithm.ratio_c1=4;algorithm.ratio_c2=64"
  [m-cser-256]="algorithm.name=m-cser;algorithm.period=32;algorithm.ratio_c1=16;algorithm.ratio_c2=512"
  [m-cser-1024]="algorithm.name=m-cser;algorithm.period=128;algorithm.ratio_c1=16;algorithm.ratio_c2=2048"
  [cser-32]="algorithm.name=cser;algorithm.period=16;algorithm.ratio_c1=4;algorithm.ratio_c2=64"
  [cser-256]="algorithm.name=cser;algorithm.period=32;algorithm.ratio_c1=16;algorithm.ratio_c2=512"
  [cser-1024]="algorithm.name=cser;algorithm.period=128;algorithm.ratio_c1=16;algorithm.ratio_c2=2048"
  [local-sgd-32]="algorithm.name=local-sgd;algorithm.period=32"
  [qsparse-32]="algorithm.name=qsparse-local-sgd;algorithm.period=16;algorithm.ratio=2"
  [qsparse-256]="algorithm.name=qsparse-local-sgd;algorithm.period=16;algorithm.ratio=16"
  [cocod-sgd]="algorithm.name=cocod-sgd;algorithm.period=5"
  [gtopk-256]="algorithm.name=gtopk-ssgd;algorithm.density=0.00390625"
  [async-sgd]="algorithm.name=async-sgd"
)
# Every name checked before anything starts.
for method in ${METHODS//,/ }; do
  if [ -z "${METHOD_SET[$method]:-}" ]; then
    echo "netem_tta.sh: unknown method $method (known: $(printf '%s\n' "${!METHOD_SET[@]}" | sort | paste -sd' '))" >&2
    exit 2
  fi
done

for program in ip tc "$BIN/cserps-server" "$BIN/cserps-worker"; do
  command -v "$program" > /dev/null || { echo "netem_tta.sh: $program not found" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "netem_tta.sh: needs root (network namespaces, tc)" >&2; exit 2; }
python3 -c 'import sys' || exit 2

WORKERS=$(sed -n 's/^ *num_workers: *\([0-9]*\).*/\1/p' "$JOB" | head -1)
# Asynchronous SGD applies every worker's gradient on its own, num_workers
# updates where S-SGD makes one of their mean: the job's lr over the
# workers (at the job's lr the quickstart MLP ended at 33-70%).
JOB_LR=$(sed -n 's/^ *lr: *\([0-9.eE+-]*\).*/\1/p' "$JOB" | head -1)
METHOD_SET[async-sgd]+=";optimizer.lr=$(python3 -c "print(${JOB_LR:-0.1} / $WORKERS)")"
SHARDS=$(grep -c '^ *servers:' "$JOB")
PREFIX="cserps-tta-$$"
SERVER_NS="$PREFIX-s"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]:-}"; do kill "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]:-}"; do wait "$pid" 2> /dev/null || true; done
  PIDS=()
  for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
    ip netns del "$ns" 2> /dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Namespaces and links: worker w is 127.3.w.2 on its link, whose server end
# is 127.3.w.1. The servers listen on every address of their namespace,
# which has no others (a worker reaches them at its link's server end).
network() {
  local rate=$1
  ip netns add "$SERVER_NS"
  ip -n "$SERVER_NS" link set lo up
  ip netns exec "$SERVER_NS" sysctl -qw net.ipv4.conf.all.route_localnet=1
  for ((w = 0; w < WORKERS; w++)); do
    local ns="$PREFIX-w$w" s="tta${w}s" c="tta${w}w"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "$s" netns "$SERVER_NS" type veth peer name "$c" netns "$ns"
    ip -n "$SERVER_NS" addr add "127.3.$w.1/24" dev "$s"
    ip -n "$ns" addr add "127.3.$w.2/24" dev "$c"
    ip -n "$SERVER_NS" link set "$s" up
    ip -n "$ns" link set "$c" up
    ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.route_localnet=1
    ip netns exec "$ns" sysctl -qw "net.ipv4.conf.$c.route_localnet=1"
    ip netns exec "$SERVER_NS" sysctl -qw "net.ipv4.conf.$s.route_localnet=1"
    ip netns exec "$SERVER_NS" tc qdisc add dev "$s" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec "$ns" tc qdisc add dev "$c" root tbf rate "$rate" burst 256kb latency 50ms
  done
}

# Runs one method on the current network; its workers' outputs in $1.
run_method() {
  local dir=$1 overrides=$2
  mkdir -p "$dir"
  local common="$overrides;epochs=$EPOCHS;evals_per_epoch=$EVALS;output_dir=$dir${EXTRA_SET:+;$EXTRA_SET}"
  # Every worker reaches the servers at an address of its own veth pair, so
  # they listen on all of the servers' namespace, which only this script's
  # worker namespaces reach: --insecure (a plaintext non-loopback listener).
  for ((s = 0; s < SHARDS; s++)); do
    timeout "$MAX_SECONDS" ip netns exec "$SERVER_NS" "$BIN/cserps-server" --config="$JOB" --shard=$s \
      --listen="0.0.0.0:$((17000 + s))" --insecure --set="$common" > "$dir/server_$s.log" 2>&1 &
    PIDS+=($!)
  done
  local workers=()
  for ((w = 0; w < WORKERS; w++)); do
    local servers=""
    for ((s = 0; s < SHARDS; s++)); do servers+="${servers:+,}127.3.$w.1:$((17000 + s))"; done
    OPENBLAS_NUM_THREADS=1 timeout "$MAX_SECONDS" ip netns exec "$PREFIX-w$w" \
      "$BIN/cserps-worker" --config="$JOB" \
      --rank=$w --blas_threads=1 --set="$common;cluster.servers=$servers" \
      > "$dir/worker_$w.log" 2>&1 &
    workers+=($!)
    PIDS+=($!)
  done
  local failed=0
  for pid in "${workers[@]}"; do wait "$pid" || failed=1; done
  cleanup_servers
  if [ "$failed" = 1 ]; then
    echo "netem_tta.sh: a worker failed; see $dir/worker_*.log" >&2
    return 1
  fi
}

cleanup_servers() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2> /dev/null || true; done
  PIDS=()
}

# time to target, final accuracy, MB pushed+pulled by rank 0, from its files.
summarise() {
  python3 - "$1" "$TARGET" << 'EOF'
import csv, json, sys
d, target = sys.argv[1], float(sys.argv[2])
rows = list(csv.DictReader(open(f"{d}/worker_0.csv")))
summary = json.load(open(f"{d}/worker_0.json"))
reached = next((float(r["wall_seconds"]) for r in rows if float(r["test_accuracy"]) >= target), None)
last = rows[-1]
mb = (int(last["bytes_pushed"]) + int(last["bytes_pulled"])) / 1e6
print(f"{'-' if reached is None else f'{reached:.1f}'} {100 * summary['test_accuracy_global']:.2f} "
      f"{float(last['wall_seconds']):.1f} {mb:.1f}")
EOF
}

mkdir -p "$OUT"
TABLE="$OUT/tta.md"
{
  echo "| link | method | time to ${TARGET} (s) | final global accuracy (%) | training time (s) | rank 0 MB moved | speedup to target over S-SGD |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
} > "$TABLE"
for rate in ${RATES//,/ }; do
  network "$rate"
  ssgd_time=""
  for method in ${METHODS//,/ }; do
    dir="$OUT/$rate/$method"
    rm -rf "$dir"
    run_method "$dir" "${METHOD_SET[$method]}"
    # An assignment of its own, so that set -e sees summarise fail.
    row=$(summarise "$dir")
    read -r reached accuracy seconds mb <<< "$row"
    [ "$method" = ssgd ] && ssgd_time=$reached
    speedup="-"
    if [ -n "$ssgd_time" ] && [ "$ssgd_time" != - ] && [ "$reached" != - ]; then
      speedup=$(python3 -c "print(f'{$ssgd_time / $reached:.1f}x')")
    fi
    line="| $rate | $method | $reached | $accuracy | $seconds | $mb | $speedup |"
    echo "$line" | tee -a "$TABLE"
  done
  cleanup
done
echo "table: $TABLE"
/usr/bin/python3 tools/bench/plot_tta.py "$OUT" "$TARGET"
