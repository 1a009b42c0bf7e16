#!/usr/bin/env python3
"""Checks the metrics for real (issue 5): a local cluster with --metrics on
127.0.0.1 is scraped by Debian's Prometheus (also on 127.0.0.1, its own port
and data directory); afterwards Prometheus' HTTP API must show every worker's
step and GRAD byte counters rising and agreeing with the worker's own JSON
summary, and the servers' completed rounds; every metric the Grafana
dashboard (deploy/grafana/dashboards/cserps.json) queries must exist in that
scrape, and deploy/prometheus/prometheus.yml must pass promtool. Run by ctest
(integration_prometheus); exits 77 (skipped) when prometheus is not
installed. Every process it starts is stopped; every wait is bounded.

  tools/prometheus/check.py --bin-dir build/bin
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP = 77


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(count):
    """A base port such that base .. base+count-1 are free now (bounded search)."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        try:
            sockets = []
            for p in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def query(port, promql):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as reply:
        data = json.load(reply)
    if data.get("status") != "success":
        raise RuntimeError(f"query {promql!r} failed: {data}")
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["data"]["result"]}


def by_label(results, label):
    return {dict(k).get(label): v for k, v in results.items()}


def wait_ready(port, proc, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"prometheus not ready on port {port} within {seconds} s")


def check_dashboard(port):
    """Every metric a Grafana panel queries exists in the real scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/label/__name__/values",
                                timeout=10) as reply:
        scraped = set(json.load(reply)["data"])
    path = os.path.join(ROOT, "deploy", "grafana", "dashboards", "cserps.json")
    with open(path) as f:
        dashboard = json.load(f)
    problems = []
    used = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            used.update(re.findall(r"cserps_[a-z_]+", target["expr"]))
    for name in sorted(used - scraped):
        problems.append(f"{path}: the dashboard queries {name}, which no process exports")
    if not used:
        problems.append(f"{path}: no cserps metric in any panel")
    return problems


def wait_targets(port, count, seconds=60):
    """Until Prometheus' scrape manager knows all `count` targets: its
    discovery hands them over only a few seconds after start."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as r:
            if len(json.load(r)["data"]["activeTargets"]) >= count:
                return
        time.sleep(0.2)
    raise RuntimeError(f"prometheus did not take up {count} targets within {seconds} s")


def check(bin_dir, work):
    out = os.path.join(work, "out")
    os.makedirs(out)
    # Static targets on ports fixed before the job starts: file-based
    # discovery reaches the scrape loop only every 5 s, which a short job
    # can outrun. 2 servers, then 4 workers (cserps-launch --metrics_port_base).
    base = free_port_range(6)
    servers = ", ".join(f'"127.0.0.1:{base + s}"' for s in range(2))
    workers = ", ".join(f'"127.0.0.1:{base + 2 + r}"' for r in range(4))
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 500ms
  scrape_timeout: 500ms
scrape_configs:
  - job_name: cserps
    static_configs:
      - targets: [{servers}]
        labels: {{role: server}}
      - targets: [{workers}]
        labels: {{role: worker}}
""")
    for path in (config, os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")):
        subprocess.run(["promtool", "check", "config", path], check=True,
                       stdout=subprocess.DEVNULL)
    port = free_port()
    log = open(os.path.join(work, "prometheus.log"), "w")
    prom = subprocess.Popen(["prometheus", f"--config.file={config}",
                             f"--storage.tsdb.path={os.path.join(work, 'data')}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, prom)
        wait_targets(port, 6)
        # A job long enough for several scrapes at 1 s.
        launch = subprocess.run(
            [os.path.join(bin_dir, "cserps-launch"),
             "--config=" + os.path.join(ROOT, "configs", "quickstart.textproto"),
             "--metrics", f"--metrics_port_base={base}", "--timeout_s=300",
             f"--set=epochs=2;log_every_steps=1000;output_dir={out}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=360)
        if launch.returncode != 0:
            raise RuntimeError("cserps-launch failed:\n" + launch.stdout[-3000:])
        # The last scrape of a process may still be in flight: query until the
        # samples stop changing (bounded).
        window = "[30m]"
        steps = {}
        for _ in range(20):
            latest = by_label(query(port, f"last_over_time(cserps_worker_steps_total{window})"), "rank")
            if latest and latest == steps:
                break
            steps = latest
            time.sleep(0.5)
        first = by_label(query(port, f"min_over_time(cserps_worker_steps_total{window})"), "rank")
        grad = by_label(query(port, 'last_over_time(cserps_worker_bytes_pushed_total{stream="GRAD"}'
                              + window + ")"), "rank")
        rounds = query(port, f"max_over_time(cserps_server_rounds_completed_total{window})")
        problems = []
        for rank in range(4):
            with open(os.path.join(out, f"worker_{rank}.json")) as f:
                summary = json.load(f)
            r = str(rank)
            if r not in steps:
                problems.append(f"rank {rank}: no cserps_worker_steps_total scraped")
                continue
            if not first[r] < steps[r] <= summary["steps"]:
                problems.append(f"rank {rank}: steps did not rise within the run:"
                                f" first {first[r]}, last {steps[r]}, summary {summary['steps']}")
            # S-SGD pushes the same bytes every step: the scraped ratio must be
            # the summary's (a scrape may fall between the two counters'
            # updates of one step, hence one step of slack).
            per_step = summary["grad_bytes_pushed"] / summary["steps"]
            if not (steps[r] - 1) * per_step <= grad.get(r, -1) <= (steps[r] + 1) * per_step:
                problems.append(f"rank {rank}: GRAD bytes {grad.get(r)} after {steps[r]} steps;"
                                f" the summary says {per_step:.0f} per step")
        if len(rounds) != 2 or min(rounds.values()) <= 0:
            problems.append(f"servers' completed rounds not scraped from both shards: {rounds}")
        problems += check_dashboard(port)
        if problems:
            raise RuntimeError("\n".join(problems))
        print(f"prometheus scraped {len(steps)} workers and {len(rounds)} servers;"
              f" steps {sorted(steps.values())} agree with the summaries")
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", required=True)
    args = parser.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        print("prometheus/promtool not installed (tools/setup.sh installs Debian's prometheus)")
        return SKIP
    work = tempfile.mkdtemp(prefix="cserps-prometheus-")
    try:
        check(args.bin_dir, work)
    except Exception as e:  # report and fail
        print(f"FAILED: {e}", file=sys.stderr)
        log = os.path.join(work, "prometheus.log")
        if os.path.exists(log):
            print(open(log).read()[-2000:], file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
