"""Fashion-MNIST as cserps-worker reads it (the same files, the same
standardisation), for PyTorch scripts that train on it."""

import torch

from cserps import _native

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def fashion_mnist(train=True, dir=DEFAULT_DIR, limit=0):
    """(images, labels): float32 [N, 784] standardised pixels and int64 [N]
    labels of the train or test split; limit > 0 keeps the first `limit`."""
    features, labels, size, dim = _native.load_split(dir, train, limit)
    images = torch.frombuffer(bytearray(features), dtype=torch.float32).reshape(size, dim)
    targets = torch.frombuffer(bytearray(labels), dtype=torch.uint8).to(torch.int64)
    return images, targets
