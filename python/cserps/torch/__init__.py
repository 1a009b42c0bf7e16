"""Train a PyTorch model with a cserps algorithm (docs/torch.md):

    cserps.torch.init(job="job.textproto", servers="10.0.0.5:7000,10.0.0.6:7000")
    optimizer = cserps.torch.Optimizer(model.parameters(), algorithm="cser", lr=0.1)
    ...  # the usual loop: zero_grad(), loss.backward(), optimizer.step()
    optimizer.finish()  # every worker and the servers now hold the global model
"""

from cserps.torch.optimizer import Optimizer
from cserps.torch.settings import init

__all__ = ["Optimizer", "init"]
