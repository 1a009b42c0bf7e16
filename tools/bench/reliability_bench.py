#!/usr/bin/env python3
"""What surviving a dead process costs, measured on the quickstart job.

Runs configs/quickstart.textproto (4 workers, 2 shards, S-SGD, 702 steps)
under cserps-launch, each run in a fresh folder:

  plain        without checkpoints;
  checkpoints  checkpoint.every_steps=100 (7 checkpoints of the whole job);
  restarted    the same with --max_restarts=1, shard 1 killed (SIGKILL) as
               soon as the first checkpoint is complete: the launcher
               restarts it alone and the workers roll back in place;
  elastic      CSER (H=4, R_C1=2, R_C2=8) with cluster.elastic and
               round_timeout_s=2, uninterrupted and with worker 3 killed at
               step 100;
  admitting    the same with cluster.admit_every_steps=50, uninterrupted and
               with worker 3 killed at step 100 under --max_restarts=1: the
               launcher starts a replacement, which rejoins at an admission
               step.

Prints each run's wall time, the final test accuracy of rank 0's global
model, the checkpoint folder's size, and for the killed runs the time from
the kill to the resumed (shrunk, rejoined) job's first sign of it.

  python3 tools/bench/reliability_bench.py --bin_dir=build-rel/bin
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(bin_dir, work, name, overrides, flags=(), kill=None):
    """Runs the launcher; kill = (process, trigger, after) kills `process` at
    the first line containing `trigger`, then times until a line containing
    `after`."""
    out = os.path.join(work, name)
    sets = ";".join([f"output_dir={out}"] + overrides)
    cmd = [os.path.join(bin_dir, "cserps-launch"),
           f"--config={ROOT}/configs/quickstart.textproto", "--timeout_s=1200",
           f"--set={sets}", *flags]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, killed_at, recovered_at = {}, None, None
    for line in proc.stdout:
        if line.startswith("[launch] ") and " is pid " in line:
            who, pid = line[len("[launch] "):].split(" is pid ")
            pids.setdefault(who, int(pid))
        if kill and killed_at is None and kill[1] in line and kill[0] in pids:
            os.kill(pids[kill[0]], signal.SIGKILL)
            killed_at = time.monotonic()
        elif killed_at is not None and recovered_at is None and kill[2] in line:
            recovered_at = time.monotonic()
    code = proc.wait()
    wall = time.monotonic() - start
    summary = {}
    path = os.path.join(out, "worker_0.json")
    if os.path.exists(path):
        with open(path) as f:
            summary = json.load(f)
    return {"name": name, "code": code, "wall": wall,
            "accuracy": summary.get("test_accuracy_global"),
            "recovery": None if recovered_at is None else recovered_at - killed_at}


def folder_bytes(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin_dir", default=os.path.join(ROOT, "build-rel", "bin"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="cserps-reliability-")
    try:
        ck = lambda name: [f"checkpoint.dir={work}/{name}-ckpt", "checkpoint.every_steps=100",
                           "checkpoint.keep=2"]
        cser = ["algorithm.name=cser", "algorithm.period=4", "algorithm.ratio_c1=2",
                "algorithm.ratio_c2=8", "cluster.elastic=true", "cluster.round_timeout_s=2"]
        rows = [
            run(args.bin_dir, work, "plain", []),
            run(args.bin_dir, work, "checkpoints", ck("checkpoints")),
            run(args.bin_dir, work, "restarted", ck("restarted"), ["--max_restarts=1"],
                kill=("server 1", "(step complete)", "resumed from the checkpoint")),
            run(args.bin_dir, work, "elastic", cser),
            run(args.bin_dir, work, "elastic-killed", cser,
                kill=("worker 3", "] step 100 ", "now wait for 3 of 4 members")),
            run(args.bin_dir, work, "admitting", cser + ["cluster.admit_every_steps=50"]),
            run(args.bin_dir, work, "admitting-killed", cser + ["cluster.admit_every_steps=50"],
                ["--max_restarts=1"],
                kill=("worker 3", "] step 100 ", "rejoined the job at step")),
        ]
        size = folder_bytes(f"{work}/checkpoints-ckpt")
        print(f"checkpoint folder (keep 2): {size / 1e6:.1f} MB")
        print(f"{'run':<16}{'exit':>5}{'wall s':>9}{'accuracy':>10}{'recovery s':>12}")
        for r in rows:
            acc = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f}%"
            rec = "-" if r["recovery"] is None else f"{r['recovery']:.2f}"
            print(f"{r['name']:<16}{r['code']:>5}{r['wall']:>9.1f}{acc:>10}{rec:>12}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
