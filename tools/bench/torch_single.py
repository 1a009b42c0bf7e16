"""The quickstart job's MLP trained by one plain PyTorch process on one
thread, with no communication: the samples/s that one cserps worker (a job
of num_workers 1) is compared against in docs/results/wire.md.

    PYTHONPATH=build/python python3 tools/bench/torch_single.py [--epochs=3]

Same model (784-256-10, ReLU), batch 64, SGD with Nesterov momentum 0.9 and
weight decay 1e-4, lr 0.1 with a linear warm-up over 0.2 epochs then cosine
decay, one test evaluation per epoch; samples/s counts every step's batch
over the whole loop, evaluations included, as cserps-worker's summary does.
"""

import argparse
import math
import time

import torch
import torch.nn.functional as F

from cserps.data import fashion_mnist


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--warmup_epochs", type=float, default=0.2)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(42)
    images, labels = fashion_mnist(train=True)
    test_images, test_labels = fashion_mnist(train=False)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                                weight_decay=1e-4)
    steps_per_epoch = len(images) // args.batch
    steps = args.epochs * steps_per_epoch
    warmup = args.warmup_epochs * steps_per_epoch

    def lr_at(step):
        if step < warmup:
            return args.lr * step / warmup
        return 0.5 * args.lr * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))

    start = time.perf_counter()
    accuracy = 0.0
    for epoch in range(args.epochs):
        order = torch.randperm(len(images))
        for i in range(steps_per_epoch):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(epoch * steps_per_epoch + i)
            batch = order[i * args.batch:(i + 1) * args.batch]
            optimizer.zero_grad()
            F.cross_entropy(model(images[batch]), labels[batch]).backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(test_images).argmax(dim=1) == test_labels).double().mean().item()
    seconds = time.perf_counter() - start
    print(f"plain PyTorch, one thread: {steps} steps in {seconds:.3f} s, "
          f"{steps * args.batch / seconds:.1f} samples/s, "
          f"{1000 * seconds / steps:.3f} ms/step, test accuracy {100 * accuracy:.2f}%")


if __name__ == "__main__":
    main()
