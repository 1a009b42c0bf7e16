#!/usr/bin/env python3
"""Checks the metrics for real: a local cluster with --metrics on
127.0.0.1 is scraped by Debian's Prometheus (also on 127.0.0.1, its own port
and data directory); afterwards Prometheus' HTTP API must show every worker's
step and GRAD byte counters rising and agreeing with the worker's own JSON
summary, and the servers' completed rounds; every metric the Grafana
dashboard (deploy/grafana/dashboards/cserps.json) queries must exist in that
scrape, its shard-balance query must agree with the shards' counters, and
deploy/prometheus/prometheus.yml must pass promtool. Run by ctest
(integration_prometheus); exits 77 (skipped) when prometheus is not
installed. Every process it starts is stopped; every wait is bounded.

  tools/prometheus/check.py --bin-dir build/bin

tools/compose_check.sh uses the same checks against the Prometheus of its
docker-compose cluster:

  tools/prometheus/check.py --wait-targets=N --port=P
  tools/prometheus/check.py --verify --port=P --out=DIR --workers=N --min-accuracy=A
"""

import argparse
import json
import os
import random
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


def free_port_range(count):
    """A base port such that base .. base+count-1 are free now (bounded
    search), below the kernel's ephemeral range: the job's own connections
    and port-0 listeners take ports from that range between this check and
    the processes' binds, and one of them once took a worker's metrics port."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(10000, max(10001, ephemeral_low - count))
        sockets = []
        try:
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
        if proc is not None and proc.poll() is not None:
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


def verify_scrape(port, out, workers, servers):
    """What Prometheus on `port` scraped from a finished job whose workers
    wrote their summaries (worker_<rank>.json) to `out`: each worker's steps
    rising and its GRAD bytes agreeing with its summary, and every shard's
    completed rounds. Returns the problems found."""
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
    rounds = query(port, "sum by (shard) (max_over_time(cserps_server_rounds_completed_total"
                   + window + "))")
    problems = []
    for rank in range(workers):
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
    if len(rounds) != servers or min(rounds.values()) <= 0:
        problems.append(f"servers' completed rounds not scraped from all {servers} shards: {rounds}")
    if not problems:
        print(f"prometheus scraped {len(steps)} workers and {len(rounds)} servers;"
              f" steps {sorted(steps.values())} agree with the summaries")
    return problems


def check_balance(port):
    """The dashboard's "Shard balance" query (busiest shard's bytes over the
    mean), over the whole job rather than its last minute (increase for
    rate, the same ratio), against that ratio computed here from each
    shard's last byte counters."""
    path = os.path.join(ROOT, "deploy", "grafana", "dashboards", "cserps.json")
    with open(path) as f:
        panels = json.load(f)["panels"]
    exprs = [t["expr"] for p in panels if p.get("title", "").startswith("Shard balance")
             for t in p.get("targets", [])]
    if len(exprs) != 1:
        return [f"{path}: {len(exprs)} queries in a \"Shard balance\" panel, expected 1"]
    whole_job = exprs[0].replace("rate(", "increase(").replace("[1m]", "[30m]")
    got = list(query(port, whole_job).values())
    last = by_label(query(port, "sum by (shard) (last_over_time(cserps_server_bytes_in_total[30m])"
                          " + last_over_time(cserps_server_bytes_out_total[30m]))"), "shard")
    if len(got) != 1 or len(last) < 2 or min(last.values()) <= 0:
        return [f"shard balance: query gave {got}, shards' bytes {last}"]
    expected = max(last.values()) / (sum(last.values()) / len(last))
    # increase() extrapolates each series to the window's edges a little.
    if not (got[0] >= 1 - 1e-9 and abs(got[0] - expected) <= 0.02 * expected):
        return [f"shard balance: the dashboard's query gives {got[0]:.4f};"
                f" the shards' bytes {last} give {expected:.4f}"]
    print(f"shard balance {got[0]:.4f} (from the shards' counters: {expected:.4f})")
    return []


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
    port = free_port_range(1)
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
        problems = verify_scrape(port, out, workers=4, servers=2)
        problems += check_dashboard(port)
        problems += check_balance(port)
        if problems:
            raise RuntimeError("\n".join(problems))
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()


def check_accuracy(out, workers, minimum):
    problems = []
    for rank in range(workers):
        with open(os.path.join(out, f"worker_{rank}.json")) as f:
            accuracy = json.load(f)["test_accuracy"]
        if not accuracy >= minimum:
            problems.append(f"rank {rank}: test accuracy {accuracy} < {minimum}")
        print(f"rank {rank}: test accuracy {accuracy:.4f}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", help="the local check: run the job from these binaries")
    parser.add_argument("--port", type=int, help="a running Prometheus on 127.0.0.1")
    parser.add_argument("--wait-targets", type=int, help="wait until it has this many targets")
    parser.add_argument("--verify", action="store_true", help="check a finished job's scrape")
    parser.add_argument("--out", help="the job's output directory (worker_<rank>.json)")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--min-accuracy", type=float, default=0.0)
    args = parser.parse_args()
    if args.port is not None:
        try:
            if args.wait_targets is not None:
                wait_ready(args.port, None)
                wait_targets(args.port, args.wait_targets)
            if args.verify:
                problems = (check_accuracy(args.out, args.workers, args.min_accuracy)
                            + verify_scrape(args.port, args.out, args.workers, args.servers))
                if problems:
                    raise RuntimeError("\n".join(problems))
        except Exception as e:  # report and fail
            print(f"FAILED: {e}", file=sys.stderr)
            return 1
        return 0
    if not args.bin_dir:
        parser.error("either --bin-dir or --port")
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
