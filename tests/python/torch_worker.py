"""A PyTorch worker of the tests, started by cserps-launch --nproc (or
alone): trains a small MLP with cserps.torch.Optimizer and writes what the
tests check to <out>/worker_<partition>.pt (partition: the process's index
in the job): the flat parameters after every step (from the step a resumed
job goes on at), the achieved compression before finish(), the bytes
pushed, the parameters after finish() and the servers' model.

  torch_worker.py --out DIR --steps N [--model 20,16,4 | --fashion-mnist H]
      [--algorithm NAME] [--param key=value ...] [--steps-per-epoch N]
      [--die-after T [--die-once FILE]]
"""

import argparse
import os

import torch

import cserps.torch
from cserps.data import fashion_mnist


def mlp(widths):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--model", default="20,16,4")
    parser.add_argument("--fashion-mnist", type=int, default=0,
                        help="hidden width of an MLP on Fashion-MNIST (0: synthetic data)")
    parser.add_argument("--algorithm", default=None)
    parser.add_argument("--param", action="append", default=[])
    parser.add_argument("--die-after", type=int, default=-1,
                        help="end the process abruptly after this many steps (a crash)")
    parser.add_argument("--die-once", default="",
                        help="with --die-after: only if this file does not exist yet (it is "
                             "made first), so that a restarted process goes on")
    parser.add_argument("--steps-per-epoch", type=int, default=0,
                        help="the Optimizer's steps_per_epoch (a job with checkpoints needs it)")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0")
    # Each rank starts from its own model: the Optimizer must replace it
    # with rank 0's.
    torch.manual_seed(100 + rank)
    if args.fashion_mnist:
        widths = [784, args.fashion_mnist, 10]
        images, labels = fashion_mnist(train=True, limit=2000)
    else:
        widths = [int(w) for w in args.model.split(",")]
        generator = torch.Generator().manual_seed(200 + rank)
        images = torch.randn(args.steps * args.batch, widths[0], generator=generator)
        labels = torch.randint(0, widths[-1], (args.steps * args.batch,), generator=generator)
    model = mlp(widths)
    params = dict(p.split("=", 1) for p in args.param)
    optimizer = cserps.torch.Optimizer(model.parameters(), algorithm=args.algorithm,
                                       steps_per_epoch=args.steps_per_epoch, **params)
    history = []
    # A job resumed from its checkpoints goes on at the checkpoint's step.
    for t in range(optimizer.steps, args.steps):
        if t == args.die_after and not (args.die_once and os.path.exists(args.die_once)):
            if args.die_once:
                open(args.die_once, "w").close()
            os._exit(3)
        at = (t * args.batch) % (len(images) - args.batch + 1)
        x, y = images[at:at + args.batch], labels[at:at + args.batch]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        history.append(optimizer.flat_params.clone())
    compression = optimizer.achieved_compression
    optimizer.finish()
    torch.save({"rank": optimizer.rank, "local_rank": optimizer.local_rank,
                "history": history, "compression": compression,
                "compression_after_finish": optimizer.achieved_compression,
                "bytes_pushed": optimizer.bytes_pushed,
                "final": optimizer.flat_params.clone(), "servers": optimizer.server_model()},
               os.path.join(args.out, f"worker_{optimizer.partition}.pt"))


if __name__ == "__main__":
    main()
