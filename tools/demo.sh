#!/usr/bin/env bash
# Installs what is missing, builds cserps (Release) and trains the main job on
# a local cluster: 2 servers and 4 workers on 127.0.0.1, an MLP on
# Fashion-MNIST with S-SGD for 3 epochs (configs/quickstart.textproto).
#   tools/demo.sh [--monitor] [cserps-launch flags, e.g. --set='epochs=1']
# --monitor also starts Debian's Prometheus on 127.0.0.1 scraping every
# process, and prints its URL and a query to try.
set -euo pipefail
cd "$(dirname "$0")/.."

monitor=0
args=()
for a in "$@"; do
  if [ "$a" = "--monitor" ]; then monitor=1; else args+=("$a"); fi
done

tools/setup.sh
BUILD_DIR=${BUILD_DIR:-build-release}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j"$(nproc)" --target cserps-server cserps-worker cserps-launch

out=out/quickstart
if [ "$monitor" = 1 ]; then
  work=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$out"
  echo '[]' > "$out/prometheus_targets.json"
  cat > "$work/prometheus.yml" <<YAML
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: cserps
    file_sd_configs:
      - files: ["$PWD/$out/prometheus_targets.json"]
        refresh_interval: 1s
YAML
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
    --web.listen-address="127.0.0.1:$port" --log.level=warn &
  prometheus_pid=$!
  trap 'kill $prometheus_pid 2>/dev/null; wait $prometheus_pid 2>/dev/null; rm -rf "$work"' EXIT
  echo "demo: Prometheus at http://127.0.0.1:$port (try the query: rate(cserps_worker_steps_total[10s]))"
  args+=("--metrics")
fi

start=$(date +%s)
build_dir_bin="$BUILD_DIR/bin"
"$build_dir_bin/cserps-launch" --config=configs/quickstart.textproto "${args[@]}"
echo "demo: the job took $(( $(date +%s) - start )) s after the build"
if [ "$monitor" = 1 ] && [ -t 0 ]; then
  read -r -p "demo: Prometheus keeps the run at http://127.0.0.1:$port; press Enter to stop it. "
fi
