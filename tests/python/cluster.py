"""Test helpers: cserps servers on 127.0.0.1 for a job, and job files.

Every process started here is stopped by the helper that started it; every
wait is bounded.
"""

import importlib.util
import os
import queue
import subprocess
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN_DIR = os.environ.get("CSERPS_BIN_DIR", "")
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10


def free_port():
    """A port free now on 127.0.0.1 for a process to bind later, chosen as
    the Prometheus check chooses its own: below the kernel's ephemeral
    range, from which other connections would take it meanwhile."""
    spec = importlib.util.spec_from_file_location(
        "prometheus_check", os.path.join(ROOT, "tools", "prometheus", "check.py"))
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check.free_port_range(1)


def job_text(num_params, num_workers=1, servers=2, algorithm="ssgd", batch_size=8,
             lr=0.05, momentum_kind="HEAVY_BALL", momentum=0.9, weight_decay=1e-4,
             round_timeout_s=30.0, extra_algorithm="", block_size=64, name="torch_test",
             max_step_lag=8, local_size=1):
    """A FLAT job of `num_params` floats. The servers' addresses are
    placeholders: the servers pick free ports and the workers are told them."""
    addresses = "\n".join('  servers: "127.0.0.1:0"' for _ in range(servers))
    momentum_line = (f"  momentum_kind: {momentum_kind}\n  momentum: {momentum}\n"
                     if momentum_kind != "NONE" else "")
    return f"""name: "{name}"
seed: 7
cluster {{
{addresses}
  num_workers: {num_workers}
  local_size: {local_size}
  round_timeout_s: {round_timeout_s}
  max_step_lag: {max_step_lag}
}}
model {{ kind: FLAT num_params: {num_params} }}
data {{ batch_size: {batch_size} }}
optimizer {{
  lr: {lr}
{momentum_line}  weight_decay: {weight_decay}
}}
algorithm {{ name: "{algorithm}" block_size: {block_size} {extra_algorithm} }}
epochs: 1
"""


def write_job(tmp_path, text, name="job.textproto"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


class Servers:
    """The shards of `job_path`, each on a free port of 127.0.0.1."""

    def __init__(self, job_path, count):
        self.addresses = []
        self._processes = []
        self._lines = []
        try:
            for shard in range(count):
                self._start(job_path, shard)
        except BaseException:
            self.stop()
            raise

    def _start(self, job_path, shard):
        program = os.path.join(BIN_DIR, "cserps-server")
        process = subprocess.Popen(
            [program, f"--config={job_path}", f"--shard={shard}", "--listen=127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._processes.append(process)
        lines = queue.Queue()
        log = []
        self._lines.append(log)

        def drain():
            for line in process.stdout:
                log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        marker = "listening on "
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"server {shard} did not listen within "
                                   f"{START_TIMEOUT_S} s: {''.join(log)}")
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"server {shard} exited: {''.join(log)}")
            if line.startswith("cserps-server shard ") and marker in line:
                self.addresses.append(line.split(marker, 1)[1].strip())
                return

    @property
    def servers(self):
        return ",".join(self.addresses)

    def kill(self, shard):
        """Stops shard `shard` at once (a dead server)."""
        process = self._processes[shard]
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self):
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
