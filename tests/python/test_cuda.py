"""CUDA tensors: the CUDA device ops of a CUDA build on the parameters' GPU,
bit for bit the host steps (the device ops round as the host loops do).
Skipped without a GPU, a CUDA build of torch or a CUDA build of cserps."""

import pytest
import torch

import cluster
import cserps.torch
from cserps import _native

D = 3000
STEPS = 12
CASES = [("ssgd", ""), ("cser", "period: 4 ratio_c1: 2 ratio_c2: 8"), ("ef-sgd", "ratio: 4")]
needs_gpu = pytest.mark.skipif(
    not (_native.has_cuda and torch.cuda.is_available()),
    reason="needs a GPU, torch built with CUDA and cserps built with CUDA")


def run(job, servers, device):
    x0 = torch.linspace(-1, 1, D)
    p = torch.nn.Parameter(x0.to(device))
    optimizer = cserps.torch.Optimizer([p], job=job, servers=servers)
    generator = torch.Generator().manual_seed(3)
    models = []
    for _ in range(STEPS):
        p.grad = torch.randn(D, generator=generator).to(device)
        optimizer.step()
        models.append(p.detach().cpu().clone())
    state = optimizer.state_dict()["cserps"]
    return models, [b.clone() for b in state["buffers"]]


@needs_gpu
@pytest.mark.parametrize("algorithm,fields", CASES, ids=[c[0] for c in CASES])
def test_gpu_steps_are_the_host_steps(tmp_path, start_servers, algorithm, fields):
    job = cluster.write_job(tmp_path, cluster.job_text(D, servers=1, algorithm=algorithm,
                                                       extra_algorithm=fields))
    host = run(job, start_servers(job, 1).servers, "cpu")
    gpu = run(job, start_servers(job, 1).servers, "cuda")
    for t, (a, b) in enumerate(zip(host[0], gpu[0])):
        assert torch.equal(a, b), f"step {t}"
    for a, b in zip(host[1], gpu[1]):
        assert torch.equal(a, b)


def test_parameters_on_another_device_kind_are_refused():
    p = torch.nn.Parameter(torch.zeros(4, device="meta"))
    with pytest.raises(ValueError, match="parameters on meta: cserps trains them on the CPU"):
        cserps.torch.Optimizer([p], job="unused.textproto")
