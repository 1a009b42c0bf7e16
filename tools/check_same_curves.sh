#!/usr/bin/env bash
# Trains every algorithm with two builds of cserps and compares what they
# learned: a 2-member job (2 servers, the quickstart MLP, two epochs, a fixed
# seed) per algorithm, flat and for S-SGD and CSER also as 2 nodes of 2
# local ranks. Every worker process's training loss of every 10th step (its
# progress lines, 4 decimals), its learning curve (CSV: epoch, step, train
# loss, test loss, test accuracy, 6 decimals) and its final local and global
# accuracies (JSON) must be the same with both builds. With 2 members the
# servers' double sum does not depend on arrival order, so the synchronous
# algorithms are deterministic; async SGD is not, and its final accuracy
# may differ by at most 0.5 points.
#   tools/check_same_curves.sh OLD_BUILD NEW_BUILD [OUT_DIR]
# OLD_BUILD and NEW_BUILD are build directories holding bin/cserps-launch,
# cserps-server and cserps-worker. Prints one row per algorithm and exits 1
# when any differs.
set -euo pipefail
cd "$(dirname "$0")/.."

. tools/two_builds.sh
need_builds "tools/check_same_curves.sh OLD_BUILD NEW_BUILD [OUT_DIR]" "${1:-}" "${2:-}" \
  cserps-launch cserps-server cserps-worker
old=$1
new=$2
out=${3:-out/same_curves}

# name | overrides of the algorithm (and its learning rate)
cases=(
  "ssgd|algorithm.name=ssgd"
  "async-sgd|algorithm.name=async-sgd;optimizer.lr=0.05"
  "ef-sgd|algorithm.name=ef-sgd;algorithm.ratio=4;optimizer.lr=0.05"
  "local-sgd|algorithm.name=local-sgd;algorithm.period=4"
  "qsparse-local-sgd|algorithm.name=qsparse-local-sgd;algorithm.period=4;algorithm.ratio=4;optimizer.lr=0.05"
  "cser|algorithm.name=cser;algorithm.period=4;algorithm.ratio_c1=4;algorithm.ratio_c2=16;optimizer.lr=0.05;optimizer.momentum_kind=HEAVY_BALL"
  "cser-gradient-blocks|algorithm.name=cser;algorithm.cser_variant=GRADIENT_BLOCKS;algorithm.period=4;algorithm.ratio_c1=4;algorithm.ratio_c2=16;optimizer.lr=0.05"
  "m-cser|algorithm.name=m-cser;algorithm.period=4;algorithm.ratio_c1=4;algorithm.ratio_c2=16;optimizer.lr=0.05"
  "cser-pl|algorithm.name=cser-pl;algorithm.period=4;algorithm.ratio_c1=4;optimizer.lr=0.05"
  "csea|algorithm.name=csea;algorithm.ratio_c1=4;optimizer.lr=0.05"
  "gtopk-ssgd|algorithm.name=gtopk-ssgd;algorithm.density=0.01"
  "topk-ssgd|algorithm.name=topk-ssgd;algorithm.density=0.01"
  "cocod-sgd|algorithm.name=cocod-sgd;algorithm.period=4;algorithm.period_warmup_epochs=0"
  "pipe-sgd|algorithm.name=pipe-sgd"
  "ssgd-nodes|algorithm.name=ssgd;cluster.local_size=2"
  "cser-nodes|algorithm.name=cser;algorithm.period=4;algorithm.ratio_c1=4;algorithm.ratio_c2=16;optimizer.lr=0.05;cluster.local_size=2"
)
common="cluster.num_workers=2;epochs=2;algorithm.block_size=32;log_every_steps=10"

run() {  # build name overrides dir
  rm -rf "$4"
  if ! "$1/bin/cserps-launch" --config=configs/quickstart.textproto \
      --set="$common;$3;output_dir=$4" > "$4.log" 2>&1; then
    echo "check_same_curves: $2 failed with $1; see $4.log" >&2
    return 1
  fi
}

mkdir -p "$out"
failed=0
printf '%-22s %-9s %-22s %-22s\n' algorithm curves "accuracy old (l/g)" "accuracy new (l/g)"
for c in "${cases[@]}"; do
  name=${c%%|*}
  overrides=${c#*|}
  run "$old" "$name" "$overrides" "$out/$name.old" || { failed=1; continue; }
  run "$new" "$name" "$overrides" "$out/$name.new" || { failed=1; continue; }
  if ! python3 - "$out/$name.old" "$out/$name.new" "$name" <<'PY'; then failed=1; fi
import csv, glob, json, os, re, sys
old, new, name = sys.argv[1:4]
# Every worker process's summary files, by base name (worker_<rank>[_<local>]).
def bases(d):
    return sorted(os.path.basename(p)[:-5] for p in glob.glob(f"{d}/worker_*.json"))
def curves(d, base):
    with open(f"{d}/{base}.csv") as f:
        return [r[:5] for r in csv.reader(f)]
def accuracy(d, base):
    with open(f"{d}/{base}.json") as f:
        j = json.load(f)
    return j["test_accuracy_local"], j["test_accuracy_global"]
# The progress lines' losses: (worker prefix, local rank prefix, step) -> loss.
def losses(d):
    found = {}
    for line in open(f"{d}.log"):
        m = re.match(r"\[(worker \d+)\] .*\] (local rank \d+: )?step (\d+) epoch \d+ loss (\S+)", line)
        if m:
            found[(m.group(1), m.group(2), int(m.group(3)))] = m.group(4)
    return found
names = bases(old)
if not names or names != bases(new):
    print(f"{name:<22} summaries differ: {names} against {bases(new)}")
    sys.exit(1)
same = all(curves(old, b) == curves(new, b) for b in names)
steps = losses(old)
same = same and bool(steps) and steps == losses(new)
acc_old = [accuracy(old, b) for b in names]
acc_new = [accuracy(new, b) for b in names]
if name == "async-sgd":
    gap = max(abs(a - b) for o, n in zip(acc_old, acc_new) for a, b in zip(o, n))
    ok = gap <= 0.005
    verdict = f"gap {100 * gap:.2f} pt" + ("" if ok else " > 0.5")
else:
    ok = same and acc_old == acc_new
    verdict = "same" if ok else "DIFFER"
fmt = lambda a: f"{100 * a[0][0]:.2f}/{100 * a[0][1]:.2f}%"
print(f"{name:<22} {verdict:<9} {fmt(acc_old):<22} {fmt(acc_new):<22}")
sys.exit(0 if ok else 1)
PY
done
exit $failed
