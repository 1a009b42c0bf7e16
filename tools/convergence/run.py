#!/usr/bin/env python3
"""The CSER paper's convergence study on a local cluster.

Runs the algorithms x overall compression ratio R_C in {32, 256, 1024} with 8
workers training the MLP of configs/convergence.textproto on Fashion-MNIST,
picks the best setting per (method, R_C) by final training loss (the paper's
practice), repeats it over several seeds, and writes
docs/results/convergence.md (a table like the paper's Table 2) and PNG plots
of test accuracy against epochs, one per R_C.

  tools/convergence/run.py --quick     # minutes: 1 seed, 1 setting, 1 epoch
  tools/convergence/run.py             # the full study (see the doc for time)

Needs a Release build (tools/demo.sh makes build-release/) and, for the plots,
python3-matplotlib (installed with apt when missing).
"""

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RATIOS = [32, 256, 1024]

# Settings per method and R_C. Each is a dict of algorithm.* fields. The CSER
# triples are the authors' (R_C1, R_C2, H) grid (ALGORITHMS.md) plus one
# neighbour with the same R_C = 1 / (1/R_C2 + 1/(R_C1*H)).
CSER_GRID = {
    32: [dict(ratio_c1=4, ratio_c2=64, period=16), dict(ratio_c1=2, ratio_c2=64, period=32)],
    256: [dict(ratio_c1=16, ratio_c2=512, period=32), dict(ratio_c1=8, ratio_c2=512, period=64)],
    1024: [dict(ratio_c1=8, ratio_c2=2048, period=256), dict(ratio_c1=16, ratio_c2=2048, period=128)],
}


def settings(method, rc):
    if method == "ef-sgd":
        return [dict(ratio=rc)]
    if method == "local-sgd":
        return [dict(period=rc)]
    if method == "qsparse-local-sgd":
        return [dict(period=4, ratio=rc // 4), dict(period=16, ratio=rc // 16)]
    if method in ("cser", "m-cser"):
        return CSER_GRID[rc]
    if method == "cser-pl":
        return [dict(period=4, ratio_c1=rc // 4), dict(period=16, ratio_c1=rc // 16)]
    if method == "csea":
        return [dict(ratio_c1=rc)]
    raise ValueError(method)


# cser runs with heavy-ball momentum, m-cser with Nesterov (the paper's M-CSER);
# every other method uses the base config's Nesterov momentum.
METHODS = ["ef-sgd", "local-sgd", "qsparse-local-sgd", "cser", "m-cser", "cser-pl", "csea"]
EXTRA = {"cser": ["optimizer.momentum_kind=HEAVY_BALL"]}


def describe(setting):
    names = {"ratio_c1": "R_C1", "ratio_c2": "R_C2", "period": "H", "ratio": "R"}
    return ", ".join(f"{names[k]}={v}" for k, v in setting.items())


def run_job(bin_dir, run_dir, method, setting, lr, seed, epochs, warmup, extra=()):
    overrides = [f"algorithm.name={method}", f"optimizer.lr={lr}", f"seed={seed}",
                 f"epochs={epochs}", f"optimizer.warmup_epochs={warmup}",
                 f"output_dir={run_dir}"]
    overrides += [f"algorithm.{k}={v}" for k, v in setting.items()]
    overrides += EXTRA.get(method, []) + list(extra)
    summary = os.path.join(run_dir, "worker_0.json")
    if os.path.exists(summary):  # resumable: a finished run is kept
        return load_run(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    cmd = [os.path.join(bin_dir, "cserps-launch"),
           "--config=" + os.path.join(ROOT, "configs", "convergence.textproto"),
           "--set=" + ";".join(overrides), "--timeout_s=3600"]
    with open(os.path.join(run_dir, "launch.log"), "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    if rc != 0:
        print(f"  run failed (exit {rc}): see {run_dir}/launch.log", file=sys.stderr)
        return None
    return load_run(run_dir)


def load_run(run_dir):
    workers = []
    rank = 0
    while os.path.exists(os.path.join(run_dir, f"worker_{rank}.json")):
        with open(os.path.join(run_dir, f"worker_{rank}.json")) as f:
            workers.append(json.load(f))
        rank += 1
    with open(os.path.join(run_dir, "worker_0.csv")) as f:
        curve = list(csv.DictReader(f))
    return {
        "train_loss": statistics.mean(w["train_loss"] for w in workers),
        "global": workers[0]["test_accuracy_global"],
        "local": statistics.mean(w["test_accuracy_local"] for w in workers),
        "compression": workers[0]["achieved_compression"],
        "seconds": max(w["wall_seconds"] for w in workers),
        "curve": [(int(r["epoch"]), float(r["test_accuracy"])) for r in curve],
        "timed_curve": [(float(r["wall_seconds"]), float(r["test_accuracy"])) for r in curve],
    }


def mean_std(values):
    if len(values) == 1:
        return f"{100 * values[0]:.2f}"
    return f"{100 * statistics.mean(values):.2f} ± {100 * statistics.stdev(values):.2f}"


def ensure_matplotlib():
    """Installs Debian's python3-matplotlib when missing and re-runs this script
    under /usr/bin/python3 (whose packages apt installs) if another Python
    runs it."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    if shutil.which("apt-get") and not os.path.exists("/usr/lib/python3/dist-packages/matplotlib"):
        subprocess.call(["apt-get", "install", "-y", "-q", "python3-matplotlib"],
                        stdout=subprocess.DEVNULL)
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)


def main():
    ensure_matplotlib()
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 setting, 1 epoch")
    parser.add_argument("--study", choices=["cser", "cocod", "gtopk"], default="cser",
                        help="cser: the CSER paper's Table 2; cocod: CoCoD-SGD vs S-SGD,"
                        " local SGD and Pipe-SGD, homogeneous and heterogeneous; gtopk:"
                        " gTop-k vs Top-k vs S-SGD at densities 0.01 and 0.001")
    parser.add_argument("--epochs", type=int, help="default 5 (quick: 1)")
    parser.add_argument("--seeds", type=int, help="default 3 (quick: 1)")
    parser.add_argument("--workers", type=int, default=8,
                        help="workers of the cocod and gtopk studies (256 examples per step in all)")
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build-release", "bin"))
    parser.add_argument("--runs", default=os.path.join(ROOT, "runs", "convergence"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "results"))
    args = parser.parse_args()
    quick = args.quick
    epochs = args.epochs or (1 if quick else 5)
    seeds = list(range(1, 1 + (args.seeds or (1 if quick else 3))))
    warmup = 0.2 if epochs == 1 else 1
    lrs = [0.05] if quick else [0.02, 0.05]
    if not os.path.exists(os.path.join(args.bin_dir, "cserps-launch")):
        sys.exit(f"no cserps-launch in {args.bin_dir}: build first (tools/demo.sh builds build-release/)")
    mode = "quick" if quick else "full"
    if args.study != "cser":
        return other_study(args, mode, epochs, seeds)
    runs = os.path.join(args.runs, mode)
    started = time.time()

    def job(method, setting, lr, seed):
        tag = "_".join(f"{k}{v}" for k, v in setting.items()) or "base"
        run_dir = os.path.join(runs, method, tag, f"lr{lr}", f"seed{seed}")
        print(f"{method} {describe(setting)} lr={lr} seed={seed}", flush=True)
        return run_job(args.bin_dir, run_dir, method, setting, lr, seed, epochs, warmup)

    # S-SGD reference: its own learning rate (0.1), as the paper tunes per method.
    reference = [r for r in (job("ssgd", {}, 0.1, s) for s in seeds) if r]
    results = {}  # (method, rc) -> (setting, lr, [runs])
    for rc in RATIOS:
        for method in METHODS:
            candidates = settings(method, rc)[: 1 if quick else None]
            best = None
            for setting in candidates:
                for lr in lrs:
                    r = job(method, setting, lr, seeds[0])
                    if r and (best is None or r["train_loss"] < best[2][0]["train_loss"]):
                        best = (setting, lr, [r])
            if best is None:
                continue
            for seed in seeds[1:]:
                r = job(method, best[0], best[1], seed)
                if r:
                    best[2].append(r)
            results[(method, rc)] = best
    wall = time.time() - started
    write_cser_report(args, mode, epochs, seeds, lrs, reference, results, wall)


def machine():
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}"


def plot(args, mode, reference, results):
    try:
        import matplotlib
    except ImportError:
        print("matplotlib missing: no plots (apt-get install python3-matplotlib, and run"
              " with Debian's /usr/bin/python3)", file=sys.stderr)
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    for rc in RATIOS:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        if reference:
            e, a = zip(*reference[0]["curve"])
            ax.plot(e, [100 * x for x in a], "k--", label="S-SGD")
        for method in METHODS:
            if (method, rc) not in results:
                continue
            e, a = zip(*results[(method, rc)][2][0]["curve"])
            ax.plot(e, [100 * x for x in a], marker="o", ms=3, label=method)
        ax.set_xlabel("epoch")
        ax.set_ylabel("test accuracy (%), rank 0's local model")
        ax.set_title(f"Fashion-MNIST MLP, 8 workers, R_C = {rc}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        name = f"convergence_{mode}_rc{rc}.png"
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, name), dpi=110)
        plt.close(fig)
        files.append(name)
    return files


def write_cser_report(args, mode, epochs, seeds, lrs, reference, results, wall):
    os.makedirs(args.out, exist_ok=True)
    plots = plot(args, mode, reference, results)
    cmd = "tools/convergence/run.py" + (" --quick" if mode == "quick" else "")
    lines = [
        f"# Convergence study ({mode})",
        "",
        f"- Command: `{cmd}` (after `tools/demo.sh` built `build-release/`)",
        f"- Date: {datetime.date.today().isoformat()}; machine: {machine()}; wall time {wall / 60:.1f} min",
        f"- Job: configs/convergence.textproto: Fashion-MNIST, MLP 784-256-10, 8 workers x batch 32,"
        f" 2 server shards, block size 32, Nesterov momentum 0.9 (cser: heavy ball), weight decay 1e-4,"
        f" linear warm-up then cosine, {epochs} epoch(s), seeds {seeds}.",
        f"- Per (method, R_C) the setting and learning rate (from {lrs}) with the lowest final training"
        f" loss on seed {seeds[0]} were kept and repeated over the seeds. S-SGD uses lr 0.1.",
        "- Accuracy: the global model after the final full average, mean ± std over seeds (%).",
        "",
    ]
    ref = [r["global"] for r in reference]
    header = "| method | " + " | ".join(f"R_C = {rc}" for rc in RATIOS) + " |"
    lines += [header, "|---" * (len(RATIOS) + 1) + "|"]
    lines.append("| S-SGD (R_C = 1) | " + " | ".join(mean_std(ref) if ref else "-" for _ in RATIOS) + " |")
    for method in METHODS:
        cells = []
        for rc in RATIOS:
            if (method, rc) in results:
                cells.append(mean_std([r["global"] for r in results[(method, rc)][2]]))
            else:
                cells.append("failed")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "Chosen settings, achieved compression (against S-SGD's floats for the same steps),"
              " mean local-model accuracy, and time per run:", "",
              "| method | R_C | setting | lr | achieved | local acc | s/run |", "|---|---|---|---|---|---|---|"]
    for method in METHODS:
        for rc in RATIOS:
            if (method, rc) not in results:
                continue
            setting, lr, rs = results[(method, rc)]
            lines.append(f"| {method} | {rc} | {describe(setting)} | {lr} | {rs[0]['compression']:.0f}x |"
                         f" {mean_std([r['local'] for r in rs])} | {statistics.mean(r['seconds'] for r in rs):.0f} |")
    lines += [""] + [f"![R_C plot]({p})" for p in plots] + [""]
    write_report(os.path.join(args.out, f"convergence_{mode}.md"), lines, wall)


def write_report(path, lines, wall):
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print(f"wrote {path} ({wall / 60:.1f} min)")


# --- The CoCoD-SGD and gTop-k studies -------------------------------------

def study_runs(study, epochs, workers):
    """(label, method, setting, lr, extra overrides) of a study."""
    half = workers // 2
    # The same 256 examples per step in all, whatever the number of workers.
    size = [f"cluster.num_workers={workers}", f"data.batch_size={256 // workers}"]
    HALF_SLOW = size + ["data.rank_slowdown=" + ",".join(["2"] * half + ["1"] * (workers - half))]
    HALF_SPEED = ["data.rank_speeds=" + ",".join(["0.5"] * half + ["1"] * (workers - half))]
    if study == "cocod":
        k = dict(period=5)
        warm = dict(period=5, period_warmup_epochs=1) if epochs > 2 else k
        runs = []
        for env, slow in (("homogeneous", size), ("heterogeneous", HALF_SLOW)):
            runs += [
                (f"S-SGD ({env})", "ssgd", {}, 0.1, slow),
                (f"local SGD k=5 ({env})", "local-sgd", k, 0.1, slow),
                (f"Pipe-SGD ({env})", "pipe-sgd", {}, 0.1, slow),
                (f"CoCoD-SGD k=5 ({env})", "cocod-sgd", warm, 0.1, slow),
            ]
        # Proportional sampling: the slow half gets half the batch.
        runs.append(("CoCoD-SGD k=5, proportional (heterogeneous)", "cocod-sgd", warm, 0.1,
                     HALF_SLOW + HALF_SPEED))
        return runs
    runs = [("S-SGD", "ssgd", {}, 0.1, size),
            ("S-SGD without momentum", "ssgd", {}, 0.1,
             size + ["optimizer.momentum_kind=NONE", "optimizer.momentum=0"])]
    for density in (0.01, 0.001):
        runs += [(f"gTop-k density {density}", "gtopk-ssgd", dict(density=density), 0.1,
                  size + ["optimizer.momentum_kind=NONE", "optimizer.momentum=0"]),
                 (f"Top-k density {density}", "topk-ssgd", dict(density=density), 0.1,
                  size + ["optimizer.momentum_kind=NONE", "optimizer.momentum=0"])]
    return runs


def time_to(curve, target):
    for seconds, accuracy in curve:
        if accuracy >= target:
            return seconds
    return None


def other_study(args, mode, epochs, seeds):
    started = time.time()
    runs_dir = os.path.join(args.runs, f"{args.study}-{mode}-w{args.workers}")
    warmup = 0.2 if epochs == 1 else 1
    rows = []
    for label, method, setting, lr, extra in study_runs(args.study, epochs, args.workers):
        results = []
        for seed in seeds:
            tag = label.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
            run_dir = os.path.join(runs_dir, tag, f"seed{seed}")
            print(f"{label} seed={seed}", flush=True)
            r = run_job(args.bin_dir, run_dir, method, setting, lr, seed, epochs, warmup, extra)
            if r:
                results.append(r)
        rows.append((label, method, setting, results))
    wall = time.time() - started
    os.makedirs(args.out, exist_ok=True)
    target = 0.80 if epochs <= 2 else 0.85
    lines = [
        f"# {'CoCoD-SGD' if args.study == 'cocod' else 'gTop-k'} study ({mode})",
        "",
        f"- Command: `tools/convergence/run.py --study={args.study}"
        f"{' --quick' if mode == 'quick' else ''}` (after `tools/demo.sh` built `build-release/`)",
        f"- Date: {datetime.date.today().isoformat()}; machine: {machine()}; wall time {wall / 60:.1f} min",
        f"- Job: configs/convergence.textproto (Fashion-MNIST, MLP 784-256-10, {args.workers} workers"
        f" x batch {256 // args.workers}, 2 server shards), lr 0.1 with warm-up then cosine,"
        f" {epochs} epoch(s), seeds {seeds}.",
    ]
    if args.study == "cocod":
        slow = "worker 0 computes" if args.workers < 4 else f"workers 0-{args.workers // 2 - 1} compute"
        lines.append(f"- Heterogeneous: {slow} at half speed (data.rank_slowdown 2);"
                     " 'proportional' also gives them half the batch (data.rank_speeds 0.5), the"
                     " CoCoD paper's proportional sampling.")
    else:
        lines.append("- gTop-k and Top-k run without momentum (the gTop-k paper's Algorithm 1).")
    lines += ["", f"| method | final test accuracy (%) | time to {100 * target:.0f}% (s) | wall time (s) |",
              "|---|---|---|---|"]
    for label, method, setting, results in rows:
        if not results:
            lines.append(f"| {label} | failed | - | - |")
            continue
        reach = [time_to(r["timed_curve"], target) for r in results]
        reach_s = "not reached" if any(x is None for x in reach) else f"{statistics.mean(reach):.1f}"
        lines.append(f"| {label} | {mean_std([r['global'] for r in results])} | {reach_s} |"
                     f" {statistics.mean(r['seconds'] for r in results):.1f} |")
    plots = plot_study(args, mode, rows)
    lines += [""] + [f"![{p}]({p})" for p in plots] + [""]
    write_report(os.path.join(args.out, f"{args.study}_{mode}_w{args.workers}.md"), lines, wall)


def plot_study(args, mode, rows):
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, method, setting, results in rows:
        if not results:
            continue
        r = results[0]
        e, a = zip(*r["curve"])
        axes[0].plot(e, [100 * x for x in a], marker="o", ms=3, label=label)
        s, a = zip(*r["timed_curve"])
        axes[1].plot(s, [100 * x for x in a], marker="o", ms=3, label=label)
    axes[0].set_xlabel("epoch")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    name = f"{args.study}_{mode}_w{args.workers}.png"
    fig.savefig(os.path.join(args.out, name), dpi=110)
    plt.close(fig)
    return [name]


if __name__ == "__main__":
    main()
