"""cserps from Python.

cserps.torch trains a PyTorch model with any cserps algorithm against
cserps servers (docs/torch.md). The native part, cserps._native, is the
worker library itself: no algorithm, client or protocol is written twice.
"""

__version__ = "0.1.0"
