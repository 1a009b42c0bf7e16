"""Jobs of several worker processes: PyTorch workers started by
cserps-launch --nproc with torchrun's variables, and a PyTorch worker next
to a C++ cserps-worker."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

import cluster
from cserps import _native
from cserps.data import fashion_mnist

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch_worker.py")
JOB_TIMEOUT_S = 240


def launch(job, nproc, out, *worker_args, launcher_args=()):
    """cserps-launch with `nproc` torch_worker.py processes; their results and
    the launcher's output."""
    command = [os.path.join(cluster.BIN_DIR, "cserps-launch"), f"--config={job}",
               f"--nproc={nproc}", f"--timeout_s={JOB_TIMEOUT_S}", *launcher_args, "--",
               sys.executable, WORKER, f"--out={out}", *worker_args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=JOB_TIMEOUT_S + 30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{nproc} processes of {sys.executable} finished" in done.stdout
    return [torch.load(os.path.join(out, f"worker_{r}.pt")) for r in range(nproc)], done.stdout


def run_all(processes):
    """Waits for every (command, env) to end, each within JOB_TIMEOUT_S, and
    kills what is left; their (return codes, outputs)."""
    started = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for command, env in processes]
    try:
        outputs = [p.communicate(timeout=JOB_TIMEOUT_S)[0] for p in started]
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    return [p.returncode for p in started], outputs


def run_group(command, env):
    """Runs `command` (a launcher) in a session of its own, killing all of it
    if it outlives JOB_TIMEOUT_S; (return code, output)."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output = process.communicate(timeout=JOB_TIMEOUT_S)[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    return process.returncode, output


def test_two_ssgd_workers_stay_bit_identical(tmp_path):
    d = 20 * 16 + 16 + 16 * 4 + 4
    job = cluster.write_job(tmp_path, cluster.job_text(d, num_workers=2))
    (first, second), _ = launch(job, 2, tmp_path, "--steps=20")
    assert (first["rank"], second["rank"]) == (0, 1)
    for t, (a, b) in enumerate(zip(first["history"], second["history"])):
        assert torch.equal(a, b), f"step {t}"
    assert torch.equal(first["final"], first["servers"])
    # They trained: each rank's data differs, and the model moved.
    assert not torch.equal(first["history"][0], first["history"][-1])


def test_a_job_of_nodes_averages_each_nodes_processes_first(tmp_path):
    # 2 nodes of 2 processes (cluster.local_size 2): each local rank talks to
    # its own shard, the node averages its processes' gradients first. The
    # same 4 processes (the same data, RANK for RANK) as 4 workers of their
    # own must train the same model, up to the order of float additions.
    d = 20 * 16 + 16 + 16 * 4 + 4
    nodes, _ = launch(cluster.write_job(
        tmp_path, cluster.job_text(d, num_workers=2, local_size=2), "nodes.textproto"), 4,
        tmp_path, "--steps=20")
    assert [(r["rank"], r["local_rank"]) for r in nodes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for t in range(20):
        for r in nodes[1:]:
            assert torch.equal(r["history"][t], nodes[0]["history"][t]), f"step {t}"
    assert torch.equal(nodes[0]["final"], nodes[0]["servers"])
    flat_dir = tmp_path / "flat"
    flat_dir.mkdir()
    flat, _ = launch(cluster.write_job(tmp_path, cluster.job_text(d, num_workers=4),
                                       "flat.textproto"), 4, flat_dir, "--steps=20")
    assert torch.allclose(nodes[0]["final"], flat[0]["final"], rtol=1e-4, atol=1e-6)
    assert not torch.equal(flat[0]["history"][0], flat[0]["history"][-1])
    # A node's local ranks push between them what a flat worker of the same
    # rank (only rank 0 pushes the initial model) does, each its shard's
    # share (up to registration's bytes: the worker ids' lengths differ).
    for node, alone in ((nodes[:2], flat[0]), (nodes[2:], flat[1])):
        assert 0.3 < node[0]["bytes_pushed"] / alone["bytes_pushed"] < 0.7
        assert node[0]["bytes_pushed"] + node[1]["bytes_pushed"] == pytest.approx(
            alone["bytes_pushed"], rel=0.01)


def test_a_dead_local_rank_fails_its_node_peer_at_once(tmp_path, start_servers):
    # The round timeout is far longer than the test's bound: the peer can
    # only fail in time, and with ConnectionError rather than TimeoutError,
    # because the dead process's socket closed.
    d = 20 * 16 + 16 + 16 * 4 + 4
    job = cluster.write_job(tmp_path, cluster.job_text(d, num_workers=1, local_size=2,
                                                       round_timeout_s=600.0))
    servers = start_servers(job, 2)
    common = dict(os.environ, WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", CSERPS_JOB=job,
                  CSERPS_SERVERS=servers.servers, OMP_NUM_THREADS="1")
    codes, outputs = run_all(
        ([sys.executable, WORKER, f"--out={tmp_path}", "--steps=20",
          *(["--die-after=3"] if r == 1 else [])],
         dict(common, RANK=str(r), LOCAL_RANK=str(r))) for r in range(2))
    assert codes[1] == 3, outputs[1]
    assert codes[0] != 0, outputs[0]
    assert "ConnectionError" in outputs[0], outputs[0]
    assert "local rank 1 (did its process end?)" in outputs[0], outputs[0]


def test_workers_started_by_srun_take_their_ranks_from_slurm(tmp_path, start_servers):
    # What `srun -n 2 python3 script.py` gives its tasks on one node: Slurm's
    # variables and none of torchrun's, and no SLURM_NTASKS_PER_NODE (srun
    # sets it only with --ntasks-per-node).
    d = 20 * 16 + 16 + 16 * 4 + 4
    job = cluster.write_job(tmp_path, cluster.job_text(d, num_workers=2))
    servers = start_servers(job, 2)
    common = dict(os.environ, SLURM_NTASKS="2", SLURM_NODEID="0", SLURM_TASKS_PER_NODE="2",
                  SLURM_STEP_TASKS_PER_NODE="2", CSERPS_JOB=job,
                  CSERPS_SERVERS=servers.servers, OMP_NUM_THREADS="1")
    # Rank 1's process starts first: ranks are Slurm's, not the order of
    # registration.
    codes, outputs = run_all(
        ([sys.executable, WORKER, f"--out={tmp_path}", "--steps=10"],
         dict(common, SLURM_PROCID=str(r), SLURM_LOCALID=str(r))) for r in (1, 0))
    assert codes == [0, 0], outputs
    first, second = (torch.load(os.path.join(tmp_path, f"worker_{r}.pt")) for r in range(2))
    assert (first["rank"], second["rank"]) == (0, 1)
    for t, (a, b) in enumerate(zip(first["history"], second["history"])):
        assert torch.equal(a, b), f"step {t}"
    assert not torch.equal(first["history"][0], first["history"][-1])


@pytest.mark.parametrize("algorithm,fields,local_size", [
    ("cser", "period: 4 ratio_c1: 2 ratio_c2: 8", 1),
    ("ef-sgd", "ratio: 4", 1),
    ("cser", "period: 4 ratio_c1: 2 ratio_c2: 8", 2),
], ids=["cser", "ef-sgd", "cser-nodes"])
def test_a_job_with_checkpoints_survives_a_dead_worker_to_the_bit(tmp_path, algorithm, fields,
                                                                  local_size):
    # A worker process dies after 12 steps (the first there; the marker file
    # keeps it to once); cserps-launch --max_restarts restarts the job from
    # the checkpoint of step 10 (checkpoint.every_steps 5), whose files the
    # PyTorch workers wrote as cserps-worker does, and it must end as the
    # job that nothing interrupted. With local_size 2 the processes are the
    # local ranks of 2 nodes, which resume together.
    d = 20 * 16 + 16 + 16 * 4 + 4
    processes = 2 * local_size
    text = cluster.job_text(d, num_workers=2, algorithm=algorithm, extra_algorithm=fields,
                            local_size=local_size)
    runs = {}
    for name, dying in (("whole", []), ("restarted", ["--die-after=12"])):
        out = tmp_path / name
        out.mkdir()
        job = cluster.write_job(
            out, text + f'checkpoint {{ dir: "{out}/checkpoints" every_steps: 5 }}\n')
        runs[name] = launch(job, processes, out, "--steps=20", "--steps-per-epoch=20",
                            *(dying and [*dying, f"--die-once={out}/died"]),
                            launcher_args=["--max_restarts=1"])
    whole, restarted = runs["whole"][0], runs["restarted"][0]
    assert "restart 1 of 1" in runs["restarted"][1], runs["restarted"][1]
    assert "restart" not in runs["whole"][1]
    for p in range(processes):
        # The restarted run's processes went on from step 10.
        assert len(restarted[p]["history"]) == 10
        for t in range(10):
            assert torch.equal(restarted[p]["history"][t], whole[p]["history"][10 + t]), \
                f"process {p} step {10 + t}"
        assert torch.equal(restarted[p]["final"], whole[p]["final"])
    assert torch.equal(restarted[0]["servers"], whole[0]["servers"])
    # Every checkpoint but the last step's was written, by every process and
    # both shards, with its manifest.
    steps = sorted(os.listdir(tmp_path / "whole" / "checkpoints"))
    assert steps and all(
        len(os.listdir(tmp_path / "whole" / "checkpoints" / s)) == processes + 2 + 1
        for s in steps), steps


def test_cser_achieves_the_configured_compression(tmp_path):
    # 63 -> 64 is 4096 floats, 256 blocks of 16: every GRBS round selects
    # exactly 1/R of them, so the ratio is the formula's.
    fields = "period: 4 ratio_c1: 2 ratio_c2: 8"
    job = cluster.write_job(tmp_path, cluster.job_text(4096, num_workers=2, algorithm="cser",
                                                       block_size=16, extra_algorithm=fields))
    results, _ = launch(job, 2, tmp_path, "--steps=20", "--model=63,64")
    expected = _native.Job(job, ["cluster.servers=127.0.0.1:1,127.0.0.1:2"]).overall_ratio
    for result in results:
        assert result["compression"] == pytest.approx(expected, rel=1e-12)
        # finish()'s full average is not training traffic.
        assert result["compression_after_finish"] == result["compression"]
    # The final average leaves every worker with the servers' model.
    for result in results:
        assert torch.equal(result["final"], results[0]["servers"])


def test_the_example_starts_its_own_job_with_the_algorithm_chosen(tmp_path):
    # Outside any launcher, examples/torch/fashion_mnist.py starts the
    # build's cserps-launch with its job and the algorithm's fields, which
    # runs the script again as the job's 4 workers: m-cser at R_C = 256
    # (and the NESTEROV momentum it needs) must reach servers and workers.
    example = os.path.join(HERE, "..", "..", "examples", "torch", "fashion_mnist.py")
    out = tmp_path / "result.json"
    code, output = run_group(
        [sys.executable, example, "--algorithm=m-cser", "--max_steps=40", f"--out={out}"],
        dict(os.environ, OMP_NUM_THREADS="1"))
    assert code == 0, output
    assert "4 processes of" in output and "finished" in output, output
    with open(out) as f:
        result = json.load(f)
    assert result["name"] == ("cserps m-cser (MODEL_BLOCKS): H=32, R_C1=16, R_C2=496 -> "
                              "overall R_C = 256")
    assert result["steps"] == 40
    # 40 steps reach no period's end: every round is an R_C2 one.
    assert result["achieved_compression"] > 256
    assert result["test_accuracy"] > 0.6


def evaluate(flat, hidden, images, labels):
    model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 10))
    torch.nn.utils.vector_to_parameters(flat, model.parameters())
    with torch.no_grad():
        return (model(images).argmax(dim=1) == labels).double().mean().item()


def test_a_pytorch_worker_and_a_cpp_worker_train_one_job(tmp_path, start_servers):
    # The C++ worker's MLP job (docs/protocol.md's layout): the PyTorch MLP of
    # the same layers has the same d, so it joins as rank 0, and the model
    # both end with must mean the same to each: the C++ worker's accuracy of
    # the servers' model is torch's.
    hidden = 32
    text = f"""name: "mixed"
seed: 3
cluster {{ servers: "127.0.0.1:0" servers: "127.0.0.1:0" num_workers: 2 }}
model {{ kind: MLP hidden: {hidden} }}
data {{ batch_size: 32 train_limit: 2000 test_limit: 1000 }}
optimizer {{ lr: 0.05 momentum_kind: HEAVY_BALL momentum: 0.9 }}
algorithm {{ name: "ssgd" block_size: 256 }}
epochs: 1
output_dir: "{tmp_path}/out"
"""
    job = cluster.write_job(tmp_path, text)
    servers = start_servers(job, 2)
    steps = 2000 // (2 * 32)
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", CSERPS_JOB=job,
               CSERPS_SERVERS=servers.servers, OMP_NUM_THREADS="1")
    codes, outputs = run_all([
        ([sys.executable, WORKER, f"--out={tmp_path}", f"--steps={steps}", "--batch=32",
          f"--fashion-mnist={hidden}"], env),
        ([os.path.join(cluster.BIN_DIR, "cserps-worker"), f"--config={job}", "--rank=1",
          f"--set=cluster.servers={servers.servers}"],
         dict(os.environ, OPENBLAS_NUM_THREADS="1"))])
    assert codes == [0, 0], outputs
    result = torch.load(os.path.join(tmp_path, "worker_0.pt"))
    assert torch.equal(result["final"], result["servers"])
    with open(os.path.join(tmp_path, "out", "worker_1.json")) as f:
        summary = json.load(f)
    assert summary["steps"] == steps
    images, labels = fashion_mnist(train=False, limit=1000)
    accuracy = evaluate(result["servers"], hidden, images, labels)
    assert accuracy > 0.6
    # Printed with 6 decimals; 1000 examples make steps of 0.001.
    assert accuracy == pytest.approx(summary["test_accuracy_global"], abs=1e-6)


def test_debian_torchrun_runs_the_workers_with_the_documented_work_around(tmp_path,
                                                                          start_servers):
    # Debian 12's torchrun fails in its redirection settings on Python 3.11
    # (docs/torch.md); --redirects=9:0 --tee=9:0 (no local rank 9) takes the
    # parsing path that works and redirects nothing.
    d = 20 * 16 + 16 + 16 * 4 + 4
    job = cluster.write_job(tmp_path, cluster.job_text(d, num_workers=2))
    servers = start_servers(job, 2)
    port = cluster.free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--redirects=9:0", "--tee=9:0",
               "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}",
               WORKER, f"--out={tmp_path}", "--steps=10"]
    code, output = run_group(command, dict(os.environ, CSERPS_JOB=job,
                                           CSERPS_SERVERS=servers.servers, OMP_NUM_THREADS="1"))
    assert code == 0, output
    first, second = (torch.load(os.path.join(tmp_path, f"worker_{r}.pt")) for r in range(2))
    assert torch.equal(first["final"], second["final"])
    assert torch.equal(first["history"][-1], second["history"][-1])
