"""A PyTorch CNN (two conv layers) on Fashion-MNIST, trained by cserps or,
for comparison, by PyTorch DDP (gloo), with the same model, data split, seed
and schedule.

cserps: 4 workers and 2 server shards on this machine. Started outside any
launcher, the script starts them itself: it runs cserps-launch (the one built
next to the cserps package it imports) with the job and the algorithm, and
the launcher runs this script again as 4 workers with torchrun's
environment (docs/torch.md):

  PYTHONPATH=build/python python3 examples/torch/fashion_mnist.py --algorithm cser

--algorithm is any cserps algorithm (default: the job's, ssgd); the compressing
ones start from settings that move 256x fewer floats than S-SGD (cser and
m-cser: H = 32, R_C1 = 16, R_C2 = 496 in the default MODEL_BLOCKS variant),
and --param key=value sets any field of the job's algorithm section
(--param period=16). The same run with the launcher started by hand, which
is what the script does:

  build/bin/cserps-launch --config=examples/torch/fashion_mnist.textproto --nproc=4 \\
      --set='algorithm.name=cser;algorithm.period=32;algorithm.ratio_c1=16;algorithm.ratio_c2=496' \\
      -- python3 examples/torch/fashion_mnist.py --algorithm cser

Under torchrun or srun, start the servers with the same job and choice first
(cserps-server --config=JOB --shard=S --set=...): a worker whose algorithm
differs from the servers' is refused, naming the field.

DDP, its 4 processes started by torch.multiprocessing, with the job file's
batch size, learning rate, momentum and weight decay:

  PYTHONPATH=build/python python3 examples/torch/fashion_mnist.py --ddp

Rank 0 prints the test accuracy and the time per step, and with --out writes
them as JSON.
"""

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from cserps.data import fashion_mnist

DDP_TIMEOUT_S = 1800
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_JOB = os.path.join(HERE, "fashion_mnist.textproto")

# Each algorithm's fields for 256x fewer floats than S-SGD where it
# compresses (its overall R_C, docs/algorithms.md); the job's otherwise.
PRESETS = {
    "cser": dict(period=32, ratio_c1=16, ratio_c2=496),
    "m-cser": dict(period=32, ratio_c1=16, ratio_c2=496),
    "cser-pl": dict(period=16, ratio_c1=16),
    "csea": dict(ratio_c1=256),
    "ef-sgd": dict(ratio=256),
    "local-sgd": dict(period=256),
    "qsparse-local-sgd": dict(period=16, ratio=16),
    "gtopk-ssgd": dict(density=1 / 256),
    "topk-ssgd": dict(density=1 / 256),
}


def cnn():
    """Two 5x5 conv stages (16 and 32 channels, ReLU, 2x2 max-pooling), then
    one linear layer: cserps' default CNN, 28,938 parameters."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 10))


def partition(size, rank, world, seed):
    """Rank's examples: every world-th of one permutation shared by all."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed))
    return order[rank::world]


def train(args, job, rank, world, make_optimizer, finish=lambda: None, wrap=lambda m: m):
    torch.set_num_threads(1)
    images, labels = fashion_mnist(train=True)
    images = images.reshape(-1, 1, 28, 28)
    mine = partition(len(images), rank, world, args.seed)
    batch_size = job.batch_sizes[rank]
    steps_per_epoch = len(mine) // batch_size
    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = cnn()
    trained = wrap(model)
    optimizer = make_optimizer(model, steps_per_epoch)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=job.epochs * steps_per_epoch)
    # A job resumed from its checkpoints (checkpoint.every_steps) goes on at
    # the checkpoint's step, its schedule where it was.
    done = getattr(optimizer, "steps", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
        for _ in range(done):
            schedule.step()
    steps = job.epochs * steps_per_epoch
    if args.max_steps > 0:
        steps = min(steps, args.max_steps)
    step_seconds, loss = [], None
    for epoch in range(done // steps_per_epoch, (steps + steps_per_epoch - 1) // steps_per_epoch):
        shuffle = torch.Generator().manual_seed(args.seed * 1000 + epoch * 100 + rank)
        order = mine[torch.randperm(len(mine), generator=shuffle)]
        first = done - epoch * steps_per_epoch if epoch == done // steps_per_epoch else 0
        for i in range(first, min(steps_per_epoch, steps - epoch * steps_per_epoch)):
            batch = order[i * batch_size:(i + 1) * batch_size]
            start = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(trained(images[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            schedule.step()
            step_seconds.append(time.perf_counter() - start)
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"{steps} steps", flush=True)
    finish()
    return model, step_seconds


def evaluate(model):
    images, labels = fashion_mnist(train=False)
    with torch.no_grad():
        predicted = model(images.reshape(-1, 1, 28, 28)).argmax(dim=1)
    return (predicted == labels).double().mean().item()


def report(args, name, model, step_seconds, extra):
    # The first epoch's first steps warm up caches and connections.
    steady = step_seconds[len(step_seconds) // 10:]
    result = dict(name=name, test_accuracy=evaluate(model), steps=len(step_seconds),
                  ms_per_step=1000 * sum(steady) / len(steady), **extra)
    print(json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


def algorithm_fields(args):
    """The job's overrides for --algorithm and --param, in --set's form."""
    fields = dict(PRESETS.get(args.algorithm, {}))
    for param in args.param:
        key, sep, value = param.partition("=")
        if not sep or not key:
            raise ValueError(f"--param {param!r}: expected key=value")
        fields[key] = value
    overrides = [] if args.algorithm is None else [f"algorithm.name={args.algorithm}"]
    overrides += [f"algorithm.{key}={value!r}" if isinstance(value, float)
                  else f"algorithm.{key}={value}" for key, value in fields.items()]
    if args.algorithm == "m-cser":
        overrides.append("optimizer.momentum_kind=NESTEROV")
    return overrides


def launch(args):
    """Starts the servers and the workers of this script with cserps-launch;
    its exit status."""
    from cserps import _native

    launcher = args.launcher or os.path.join(
        os.path.dirname(os.path.abspath(_native.__file__)), "..", "..", "bin", "cserps-launch")
    job = job_path(args)
    nproc = load_job(args).num_workers
    command = [launcher, f"--config={job}", f"--nproc={nproc}",
               "--set=" + ";".join(algorithm_fields(args)), "--",
               sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
    print(" ".join(command), flush=True)
    return subprocess.run(command).returncode


def load_job(args):
    from cserps import _native
    from cserps.torch import settings

    path, overrides = settings.resolve(job_path(args))
    overrides += algorithm_fields(args)
    if not any(o.startswith("cluster.servers=") for o in overrides):
        # DDP needs no servers; validation needs real ports.
        overrides.append("cluster.servers=127.0.0.1:1,127.0.0.1:2")
    return _native.Job(path, overrides)


def run_cserps(args):
    import cserps.torch

    from cserps import place

    where = place.from_environment()
    rank, world = where.rank, where.world_size
    job = load_job(args)
    holder = {}

    def make(model, steps_per_epoch):
        # The algorithm's fields as the job's overrides (what --algorithm and
        # --param chose), so that they reach the Optimizer as they reached
        # the servers.
        holder["optimizer"] = optimizer = cserps.torch.Optimizer(
            model.parameters(), job=job_path(args), set=algorithm_fields(args),
            steps_per_epoch=steps_per_epoch)
        holder["pushed"] = optimizer.bytes_pushed  # rank 0's initial model
        holder["resumed_at"] = optimizer.steps
        return optimizer

    def finish():
        # The steps' traffic, without the final average.
        optimizer = holder["optimizer"]
        holder["pushed"] = ((optimizer.bytes_pushed - holder["pushed"])
                            / (optimizer.steps - holder["resumed_at"]))
        optimizer.finish()

    model, seconds = train(args, job, rank, world, make, finish=finish)
    if rank == 0:
        report(args, f"cserps {job.description}", model, seconds,
               dict(achieved_compression=holder["optimizer"].achieved_compression,
                    bytes_pushed_per_step=holder["pushed"]))


def job_path(args):
    return args.job or os.environ.get("CSERPS_JOB") or DEFAULT_JOB


def ddp_worker(rank, args, port):
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    job = load_job(args)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=job.num_workers, timeout=datetime.timedelta(seconds=300))
    model, seconds = train(
        args, job, rank, job.num_workers,
        lambda m, _: torch.optim.SGD(m.parameters(), lr=job.lr, momentum=job.momentum,
                                     nesterov=job.momentum_kind == "NESTEROV",
                                     weight_decay=job.weight_decay),
        wrap=torch.nn.parallel.DistributedDataParallel)
    if rank == 0:
        report(args, "ddp gloo", model, seconds, {})
    dist.destroy_process_group()
    # torch 1.13's gloo can hang in its exit handlers.
    sys.stdout.flush()
    os._exit(0)


def run_ddp(args):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(ddp_worker, args=(args, port),
                                 nprocs=load_job(args).num_workers, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + DDP_TIMEOUT_S
    try:
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"DDP workers still running after {DDP_TIMEOUT_S} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.terminate()
                p.join(10)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ddp", action="store_true",
                        help="train with PyTorch DDP (gloo), cluster.num_workers processes")
    parser.add_argument("--algorithm", default=None,
                        help="the cserps algorithm (ssgd, cser, m-cser, ef-sgd, ...; "
                             "default: the job's)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a field of the job's algorithm section (repeatable)")
    parser.add_argument("--job", default="",
                        help="the job config (default: CSERPS_JOB, as cserps-launch sets it, "
                             "else fashion_mnist.textproto beside this script)")
    parser.add_argument("--launcher", default="",
                        help="cserps-launch, when the script starts the job itself (default: "
                             "the one built with the cserps package)")
    parser.add_argument("--seed", type=int, default=1, help="model, data split and order")
    parser.add_argument("--max_steps", type=int, default=0,
                        help="stop after this many steps (default: the job's epochs)")
    parser.add_argument("--out", default="", help="write rank 0's result here (JSON)")
    args = parser.parse_args()
    if args.ddp:
        if args.algorithm not in (None, "ssgd") or args.param:
            parser.error("--ddp trains with torch's SGD: no --algorithm or --param")
        run_ddp(args)
    elif "RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        sys.exit(launch(args))
    else:
        run_cserps(args)


if __name__ == "__main__":
    main()
