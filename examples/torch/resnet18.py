"""torchvision's ResNet-18 (11,181,642 parameters) on Fashion-MNIST resized
to 32 x 32 (three equal channels), trained by cserps for a few hundred steps,
reporting steps per second and bytes per step: a model of real size, whose
pushes the PS client splits into chunks under cluster.max_message_bytes by
itself.

  build/bin/cserps-launch --config=examples/torch/resnet18.textproto --nproc=2 \\
      -- python3 examples/torch/resnet18.py [--steps=200] [--out=result.json]

Another algorithm through the launcher's --set (servers and workers alike),
e.g. CSER at R_C = 256 (H = 32, R_C1 = 16, R_C2 = 496 in its default
MODEL_BLOCKS variant):

  --set='algorithm.name=cser;algorithm.period=32;algorithm.ratio_c1=16;algorithm.ratio_c2=496'

BatchNorm's running statistics are buffers, not parameters: each worker keeps
its own (DDP would broadcast rank 0's).
"""

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import torchvision

import cserps.torch
from cserps.data import fashion_mnist


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="", help="write rank 0's result here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    images, labels = fashion_mnist(train=True)
    images = images[rank::world]
    labels = labels[rank::world]
    torch.manual_seed(1)
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = cserps.torch.Optimizer(model.parameters())
    batch = optimizer.batch_size
    # Rank 0's initial model is not a step's traffic.
    pushed_before, pulled_before = optimizer.bytes_pushed, optimizer.bytes_pulled
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    model.train()
    times = []
    for t in range(args.steps):
        at = (t * batch) % (len(images) - batch)
        x = F.interpolate(images[at:at + batch].reshape(-1, 1, 28, 28), size=32,
                          mode="bilinear", align_corners=False).expand(-1, 3, -1, -1)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels[at:at + batch])
        loss.backward()
        optimizer.step()
        schedule.step()
        times.append(time.perf_counter() - start)
        if rank == 0 and (t + 1) % 50 == 0:
            print(f"step {t + 1}: loss {loss.item():.4f}", flush=True)
    pushed = optimizer.bytes_pushed - pushed_before
    pulled = optimizer.bytes_pulled - pulled_before
    optimizer.finish()
    if rank == 0:
        steady = times[len(times) // 10:]
        result = dict(algorithm=optimizer.algorithm, num_params=sum(
            p.numel() for p in model.parameters()), steps=args.steps,
            steps_per_second=len(steady) / sum(steady),
            bytes_pushed_per_step=pushed / args.steps, bytes_pulled_per_step=pulled / args.steps,
            achieved_compression=optimizer.achieved_compression, last_loss=loss.item())
        print(json.dumps(result), flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
