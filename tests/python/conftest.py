"""pytest set-up of the Python front's tests (run by ctest: python_torch)."""

import os

# torch's vectorised CPU kernels fuse multiply-adds (add(alpha=...) is an
# FMA on AVX2); cserps never fuses, so that servers and workers round alike.
# The comparisons with torch.optim.SGD need torch's unfused kernels, chosen
# before torch is first imported.
os.environ.setdefault("ATEN_CPU_CAPABILITY", "default")

import pytest  # noqa: E402

import cluster  # noqa: E402


@pytest.fixture
def start_servers():
    """start_servers(job_path, count) -> Servers, all stopped after the test."""
    started = []

    def start(job_path, count):
        servers = cluster.Servers(job_path, count)
        started.append(servers)
        return servers

    yield start
    for servers in started:
        servers.stop()


@pytest.fixture(autouse=True)
def no_launcher_environment(monkeypatch):
    """Each test starts outside any launcher; those that need one set it."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID",
                 "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID",
                 "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "CSERPS_JOB",
                 "CSERPS_SERVERS", "CSERPS_SET"):
        monkeypatch.delenv(name, raising=False)
