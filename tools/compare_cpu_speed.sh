#!/usr/bin/env bash
# Compares the CPU speed of two builds of cserps, side by side: the two
# builds' runs alternate (old, new, old, new, ...), so that the machine's
# drift falls on both, and the medians are compared.
#   tools/compare_cpu_speed.sh OLD_BUILD NEW_BUILD [RUNS] [OUT_DIR]
# OLD_BUILD and NEW_BUILD are build directories holding bin/cserps-launch,
# cserps-server, cserps-worker and cserps-bench-overlap (Release builds, for
# a fair comparison). Per build and run:
#   - the quickstart job (configs/quickstart.textproto, 4 workers, 2
#     servers): each worker's training samples/s from its summary;
#   - cserps-bench-overlap --steps=30 --batch=1024: the ms per step of each
#     algorithm row.
# Prints the median of each figure for both builds and new/old. RUNS
# defaults to 3.
set -euo pipefail
cd "$(dirname "$0")/.."

. tools/two_builds.sh
need_builds "tools/compare_cpu_speed.sh OLD_BUILD NEW_BUILD [RUNS] [OUT_DIR]" "${1:-}" "${2:-}" \
  cserps-launch cserps-server cserps-worker cserps-bench-overlap
old=$1
new=$2
runs=${3:-3}
out=${4:-out/compare_cpu_speed}
mkdir -p "$out"
results="$out/results.tsv"
: > "$results"

for run in $(seq 1 "$runs"); do
  for side in old new; do
    build=$old
    [ "$side" = new ] && build=$new
    dir="$out/$side.$run"
    rm -rf "$dir"
    "$build/bin/cserps-launch" --config=configs/quickstart.textproto \
      --set="output_dir=$dir;log_every_steps=100000" > "$dir.log" 2>&1
    python3 - "$dir" "$side" >> "$results" <<'PY'
import glob, json, sys
d, side = sys.argv[1:3]
for path in sorted(glob.glob(f"{d}/worker_*.json")):
    with open(path) as f:
        j = json.load(f)
    print(f"{side}\tquickstart samples/s rank {j['rank']}\t{j['samples_per_second']}")
PY
    "$build/bin/cserps-bench-overlap" --steps=30 --batch=1024 > "$dir.overlap" 2>&1
    python3 - "$dir.overlap" "$side" >> "$results" <<'PY'
import sys
path, side = sys.argv[1:3]
rows = False
for line in open(path):
    if line.startswith("algorithm"):
        rows = True
        continue
    if rows and line.strip():
        label, ms = line[:22].strip(), line[22:].split()[0]
        print(f"{side}\toverlap bench {label} ms/step\t{ms}")
PY
    echo "compare_cpu_speed: run $run $side done" >&2
  done
done

python3 - "$results" "$runs" <<'PY'
import statistics, sys
path, runs = sys.argv[1], int(sys.argv[2])
values = {}
order = []
for line in open(path):
    side, name, value = line.rstrip("\n").split("\t")
    if name not in order:
        order.append(name)
    values.setdefault((side, name), []).append(float(value))
print(f"medians over {runs} alternating runs per build")
print(f"{'figure':<44} {'old':>10} {'new':>10} {'new/old':>8}")
for name in order:
    o = statistics.median(values[("old", name)])
    n = statistics.median(values[("new", name)])
    print(f"{name:<44} {o:>10.1f} {n:>10.1f} {n / o:>8.3f}")
PY
