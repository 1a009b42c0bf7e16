"""A PyTorch CNN (two conv layers) on Fashion-MNIST, trained by cserps or,
for comparison, by PyTorch DDP (gloo), with the same model, data split, seed
and schedule.

cserps: 4 workers and 2 server shards on this machine, started by the local
launcher with torchrun's environment (docs/torch.md):

  build/bin/cserps-launch --config=examples/torch/fashion_mnist.textproto --nproc=4 \\
      -- python3 examples/torch/fashion_mnist.py

DDP, its 4 processes started by torch.multiprocessing, with the job file's
batch size, learning rate, momentum and weight decay:

  PYTHONPATH=build/python python3 examples/torch/fashion_mnist.py --ddp \\
      --job=examples/torch/fashion_mnist.textproto

The job file is what the servers run, so another algorithm is chosen there or
with the launcher's --set, which reaches servers and workers alike; CSER at
R_C = 256 (the paper's H = 32, R_C1 = 16, R_C2 = 512; 260 with the default
MODEL_BLOCKS variant):

  build/bin/cserps-launch --config=examples/torch/fashion_mnist.textproto --nproc=4 \\
      --set='algorithm.name=cser;algorithm.period=32;algorithm.ratio_c1=16;algorithm.ratio_c2=512' \\
      -- python3 examples/torch/fashion_mnist.py

Rank 0 prints the test accuracy and the time per step, and with --out writes
them as JSON.
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F

from cserps.data import fashion_mnist

DDP_TIMEOUT_S = 1800


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
    optimizer = make_optimizer(model)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=job.epochs * steps_per_epoch)
    step_seconds, loss = [], None
    for epoch in range(job.epochs):
        shuffle = torch.Generator().manual_seed(args.seed * 1000 + epoch * 100 + rank)
        order = mine[torch.randperm(len(mine), generator=shuffle)]
        for i in range(steps_per_epoch):
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
        print(f"{steps_per_epoch * job.epochs} steps", flush=True)
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


def load_job(args):
    from cserps import _native
    from cserps.torch import settings

    path, overrides = settings.resolve(args.job or None)
    if not any(o.startswith("cluster.servers=") for o in overrides):
        # DDP needs no servers; validation needs real ports.
        overrides.append("cluster.servers=127.0.0.1:1,127.0.0.1:2")
    return _native.Job(path, overrides)


def run_cserps(args):
    import cserps.torch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    job = load_job(args)
    holder = {}

    def make(model):
        holder["optimizer"] = optimizer = cserps.torch.Optimizer(model.parameters(),
                                                                 job=args.job or None)
        holder["pushed"] = optimizer.bytes_pushed  # rank 0's initial model
        return optimizer

    def finish():
        # The steps' traffic, without the final average.
        optimizer = holder["optimizer"]
        holder["pushed"] = (optimizer.bytes_pushed - holder["pushed"]) / optimizer.steps
        optimizer.finish()

    model, seconds = train(args, job, rank, world, make, finish=finish)
    if rank == 0:
        report(args, f"cserps {job.description}", model, seconds,
               dict(achieved_compression=holder["optimizer"].achieved_compression,
                    bytes_pushed_per_step=holder["pushed"]))


def ddp_worker(rank, args, port):
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    job = load_job(args)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=job.num_workers, timeout=datetime.timedelta(seconds=300))
    model, seconds = train(
        args, job, rank, job.num_workers,
        lambda m: torch.optim.SGD(m.parameters(), lr=job.lr, momentum=job.momentum,
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
    parser.add_argument("--job", default="",
                        help="the job config (default: CSERPS_JOB, as cserps-launch sets it)")
    parser.add_argument("--seed", type=int, default=1, help="model, data split and order")
    parser.add_argument("--out", default="", help="write rank 0's result here (JSON)")
    args = parser.parse_args()
    if args.ddp:
        run_ddp(args)
    else:
        run_cserps(args)


if __name__ == "__main__":
    main()
