"""cserps.torch.Optimizer with one worker in this process, against
torch.optim.SGD, and its refusals of bad arguments."""

import copy
import re

import pytest
import torch

import cluster
import cserps.torch
import torch_worker
from cserps import _native


def mlp(seed, widths=(20, 16, 4)):
    torch.manual_seed(seed)
    return torch_worker.mlp(widths)


def num_params(model):
    return sum(p.numel() for p in model.parameters())


def batches(steps, batch=8, dim=20, classes=4):
    generator = torch.Generator().manual_seed(5)
    return [(torch.randn(batch, dim, generator=generator),
             torch.randint(0, classes, (batch,), generator=generator)) for _ in range(steps)]


def train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


CASES = [
    # (algorithm, momentum_kind, algorithm fields, torch's SGD arguments)
    ("ssgd", "HEAVY_BALL", "", dict(momentum=0.9, weight_decay=1e-4)),
    ("ssgd", "NESTEROV", "", dict(momentum=0.9, nesterov=True, weight_decay=1e-4)),
    ("ssgd", "NONE", "", dict(weight_decay=1e-4)),
    ("cser", "HEAVY_BALL", "period: 4 ratio_c1: 2 ratio_c2: 8",
     dict(momentum=0.9, weight_decay=1e-4)),
    ("m-cser", "NESTEROV", "period: 4 ratio_c1: 2 ratio_c2: 8",
     dict(momentum=0.9, nesterov=True, weight_decay=1e-4)),
]


@pytest.mark.parametrize("algorithm,momentum_kind,fields,sgd", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_one_worker_is_torch_sgd_bit_for_bit(tmp_path, start_servers, algorithm,
                                             momentum_kind, fields, sgd):
    # A single worker has no compression error: every average is its own
    # values, so each step must be torch's SGD step, with the lr that a
    # torch scheduler sets.
    model = mlp(1)
    reference = copy.deepcopy(model)
    job = cluster.write_job(tmp_path, cluster.job_text(
        num_params(model), algorithm=algorithm, momentum_kind=momentum_kind,
        extra_algorithm=fields))
    servers = start_servers(job, 2)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers)
    torch_sgd = torch.optim.SGD(reference.parameters(), lr=0.05, **sgd)
    schedules = [torch.optim.lr_scheduler.StepLR(o, step_size=10, gamma=0.5)
                 for o in (optimizer, torch_sgd)]
    for t, (x, y) in enumerate(batches(30)):
        train_step(model, optimizer, x, y)
        train_step(reference, torch_sgd, x, y)
        for schedule in schedules:
            schedule.step()
        for a, b in zip(model.parameters(), reference.parameters()):
            assert torch.equal(a, b), f"step {t}"
    assert optimizer.steps == 30
    moved = max((a - b).abs().max().item()
                for a, b in zip(model.parameters(), mlp(1).parameters()))
    assert moved > 1e-2


def test_parameters_and_gradients_are_views_of_the_flat_buffers(tmp_path, start_servers):
    model = mlp(2)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), servers=1))
    servers = start_servers(job, 1)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers)
    flat = optimizer.flat_params
    offset = 0
    for p in model.parameters():
        assert p.data_ptr() == flat.data_ptr() + 4 * offset
        offset += p.numel()
    x, y = batches(1)[0]
    train_step(model, optimizer, x, y)
    grads = [p.grad.data_ptr() for p in model.parameters()]
    # A gradient set to None or replaced is copied back in at the next step.
    first = next(model.parameters())
    first.grad = None
    optimizer.step()
    assert [p.grad.data_ptr() for p in model.parameters()] == grads
    # zero_grad() drops a replaced gradient instead.
    first.grad = torch.ones_like(first)
    optimizer.zero_grad()
    assert [p.grad.data_ptr() for p in model.parameters()] == grads
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())


def test_a_sparse_gradient_is_taken_dense(tmp_path, start_servers):
    # nn.Embedding(sparse=True) leaves a sparse .grad where the .grad was
    # None: the step is torch's SGD step with it.
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 3))
    reference = copy.deepcopy(model)
    job = cluster.write_job(tmp_path, cluster.job_text(
        num_params(model), servers=1, momentum_kind="NONE", weight_decay=0.0))
    servers = start_servers(job, 1)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers)
    torch_sgd = torch.optim.SGD(reference.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(6)
    for t in range(5):
        # Distinct indices: a dense and a sparse gradient sum no duplicates.
        x = torch.randperm(10, generator=generator)[:6]
        y = torch.randint(0, 3, (6,), generator=generator)
        for m, o in ((model, optimizer), (reference, torch_sgd)):
            m.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(m(x), y).backward()
            assert m[0].weight.grad.is_sparse
            o.step()
        for a, b in zip(model.parameters(), reference.parameters()):
            assert torch.equal(a, b), f"step {t}"
    assert not model[0].weight.grad.is_sparse


def test_a_step_refuses_a_learning_rate_the_servers_would(tmp_path, start_servers):
    model = mlp(2)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), servers=1))
    servers = start_servers(job, 1)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers)
    before = optimizer.flat_params.clone()
    state = [b.clone() for b in optimizer.state_dict()["cserps"]["buffers"]]
    # 1e39 is finite in Python and inf in float32: refused before the step
    # changes anything, as the others.
    for lr in (float("nan"), float("inf"), -0.1, 1e39):
        optimizer.param_groups[0]["lr"] = lr
        with pytest.raises(ValueError,
                           match=rf"lr'\] is {re.escape(str(lr))}: it must be finite and >= 0"):
            optimizer.step()
    assert optimizer.steps == 0 and torch.equal(optimizer.flat_params, before)
    assert all(torch.equal(a, b) for a, b in
               zip(optimizer.state_dict()["cserps"]["buffers"], state))


def test_unknown_algorithm_lists_the_known_ones(tmp_path):
    job = cluster.write_job(tmp_path, cluster.job_text(100))
    with pytest.raises(ValueError, match=r"unknown algorithm \"sgd\"; known: .*cser.*ssgd"):
        cserps.torch.Optimizer(mlp(3).parameters(), algorithm="sgd", job=job,
                               servers="127.0.0.1:1")


def test_unknown_algorithm_parameter_lists_the_fields(tmp_path):
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(mlp(3))))
    with pytest.raises(ValueError, match=r"unknown field \"algorithm.ratio_c3\"; fields of "
                                         r"algorithm: .*ratio_c1, ratio_c2"):
        cserps.torch.Optimizer(mlp(3).parameters(), algorithm="cser", ratio_c3=4, job=job,
                               servers="127.0.0.1:1,127.0.0.1:2")
    with pytest.raises(ValueError, match=r"algorithm.period: \"x\" is not a uint32"):
        cserps.torch.Optimizer(mlp(3).parameters(), period="x", job=job,
                               servers="127.0.0.1:1,127.0.0.1:2")


def test_init_names_the_job_and_servers_and_arguments_still_win(tmp_path, start_servers):
    model = mlp(3)
    # The servers run lr 0.25; the workers' file says 0.05 and init's
    # override makes it the servers' job.
    servers = start_servers(cluster.write_job(
        tmp_path, cluster.job_text(num_params(model), servers=1, lr=0.25), "servers.textproto"), 1)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), servers=1, lr=0.05))
    try:
        cserps.torch.init(job=job, servers=[servers.servers], set="optimizer.lr=0.25")
        optimizer = cserps.torch.Optimizer(model.parameters())
        assert optimizer.param_groups[0]["lr"] == 0.25
        assert optimizer.rank == 0
        # The Optimizer's own arguments override init's.
        with pytest.raises(ConnectionError, match="no answer from the servers within 1s"):
            cserps.torch.Optimizer(mlp(3).parameters(), servers="127.0.0.1:1",
                                   setup_timeout=1.0)
    finally:
        cserps.torch.init()
    with pytest.raises(ValueError, match="no job config"):
        cserps.torch.Optimizer(mlp(3).parameters())


def test_hyperparameters_of_a_group_or_without_their_kind_make_the_servers_job(
        tmp_path, start_servers):
    model = mlp(3)
    # The servers run lr 0.25 with Nesterov momentum 0.5; the workers' file
    # says lr 0.05 and Nesterov momentum 0.9.
    servers = start_servers(cluster.write_job(
        tmp_path, cluster.job_text(num_params(model), servers=1, lr=0.25,
                                   momentum_kind="NESTEROV", momentum=0.5),
        "servers.textproto"), 1)
    job = cluster.write_job(tmp_path, cluster.job_text(
        num_params(model), servers=1, lr=0.05, momentum_kind="NESTEROV", momentum=0.9))
    # The group's lr, and a momentum that keeps the job's kind.
    optimizer = cserps.torch.Optimizer([{"params": model.parameters(), "lr": 0.25}],
                                       job=job, servers=servers.servers, momentum=0.5)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.25, 0.5, True)


def test_a_parameter_frozen_after_construction_is_refused_at_step(tmp_path, start_servers):
    # Weight decay would still move it, where torch.optim.SGD leaves a
    # parameter without a gradient alone.
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model)))
    servers = start_servers(job, 2)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers)
    (x, y), = batches(1)
    train_step(model, optimizer, x, y)
    before = [p.detach().clone() for p in model.parameters()]
    next(model.parameters()).requires_grad_(False)
    with pytest.raises(ValueError, match="parameter 0 no longer requires a gradient"):
        train_step(model, optimizer, x, y)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    assert optimizer.steps == 1


def test_a_parameter_cast_or_resized_after_construction_is_refused(tmp_path, start_servers):
    # It was put back as a float32 on the old device, or spread over its
    # slot of the flat buffer.
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), servers=1))
    servers = start_servers(job, 1)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers)
    (x, y), = batches(1)
    train_step(model, optimizer, x, y)
    saved = optimizer.state_dict()
    train_step(model, optimizer, x, y)
    model.double()
    with pytest.raises(ValueError, match=r"parameter 0 is now torch.float64 .*make the Optimizer"):
        optimizer.zero_grad()
    # Refused before any of the state goes in.
    with pytest.raises(ValueError, match=r"parameter 0 is now torch.float64"):
        optimizer.load_state_dict(saved)
    assert optimizer.steps == 2
    model.float()
    flat = optimizer.flat_params.clone()
    next(model.parameters()).data = torch.tensor([7.0])
    with pytest.raises(ValueError, match=r"parameter 0 is now torch.float32 on cpu with 1 elements"):
        optimizer.zero_grad()
    assert torch.equal(optimizer.flat_params, flat)


def test_the_jobs_settings_written_back_are_no_change(tmp_path, start_servers):
    # The group shows them as float32 holds them (0.9 reads
    # 0.8999999761581421): writing the same value back is no change.
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), servers=1))
    servers = start_servers(job, 1)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers,
                                       momentum=0.9, weight_decay=1e-4)
    optimizer.param_groups[0].update(momentum=0.9, weight_decay=1e-4)
    (x, y), = batches(1)
    train_step(model, optimizer, x, y)
    assert optimizer.steps == 1
    # Saved as written back, the state is the job's too.
    optimizer.load_state_dict(optimizer.state_dict())
    train_step(model, optimizer, x, y)
    assert optimizer.steps == 2
    optimizer.param_groups[0]["momentum"] = 0.8
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['momentum'\] changed"):
        train_step(model, optimizer, x, y)


def test_a_message_with_bytes_that_are_not_utf8_is_kept(tmp_path):
    text = cluster.job_text(100).replace('name: "torch_test"', 'name: "caf\xe9"')
    path = tmp_path / "latin1.textproto"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match=r"name: may hold only letters.*caf\\xe9"):
        _native.Job(str(path), ["cluster.servers=127.0.0.1:5"])


def test_model_of_another_size_names_both_and_the_fix(tmp_path):
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model) + 1))
    with pytest.raises(ValueError, match=rf"have {num_params(model)} floats but the job's "
                       rf"model \(FLAT\) has {num_params(model) + 1}.*num_params: "
                       rf"{num_params(model)}"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers="127.0.0.1:1")


def test_bad_arguments_are_value_errors(tmp_path):
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model)))
    layers = list(model.parameters())
    nowhere = "127.0.0.1:1,127.0.0.1:2"  # never reached: the arguments are refused first
    with pytest.raises(ValueError, match="2 parameter groups"):
        cserps.torch.Optimizer([{"params": layers[:2]}, {"params": layers[2:]}], job=job)
    with pytest.raises(ValueError, match="torch.float64; cserps trains float32"):
        cserps.torch.Optimizer(mlp(3).double().parameters(), job=job)
    frozen = mlp(3)
    next(frozen.parameters()).requires_grad_(False)
    with pytest.raises(ValueError, match="does not require a gradient"):
        cserps.torch.Optimizer(frozen.parameters(), job=job)
    with pytest.raises(ValueError, match="nesterov=True needs a momentum > 0"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers=nowhere, momentum=0.0,
                               nesterov=True)
    with pytest.raises(ValueError, match="optimizer.lr: must be > 0"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers=nowhere, lr=-1.0)
    with pytest.raises(ValueError, match="no job config"):
        cserps.torch.Optimizer(model.parameters())
    # A parameter group's own hyperparameters are the job's.
    with pytest.raises(ValueError, match="optimizer.lr: must be > 0"):
        cserps.torch.Optimizer([{"params": layers, "lr": -1.0}], job=job, servers=nowhere)
    # An endless wait would have no deadline.
    for timeouts in (dict(setup_timeout=float("inf")), dict(setup_timeout=0),
                     dict(rpc_slack=float("nan")), dict(rpc_slack=-1.0)):
        with pytest.raises(ValueError, match="must be a finite number of seconds"):
            cserps.torch.Optimizer(model.parameters(), job=job, servers=nowhere, **timeouts)
    # Counts the native layer could not take, or would read as "none given".
    for counts in (dict(steps_per_epoch=-1), dict(rank=-5), dict(rank=2**31), dict(rank=1.5),
                   dict(local_rank=-1), dict(rank=True)):
        with pytest.raises(ValueError, match=r"must be a whole number in \[0, "):
            cserps.torch.Optimizer(model.parameters(), job=job, servers=nowhere, **counts)
    checkpointed = cluster.write_job(
        tmp_path, cluster.job_text(num_params(model)) +
        f'checkpoint {{ dir: "{tmp_path}/ckpt" every_steps: 5 }}\n', name="checkpointed.textproto")
    with pytest.raises(ValueError, match=r"checkpoint.every_steps is 5: the trainer needs its "
                       r"steps per epoch \(steps_per_epoch\)"):
        cserps.torch.Optimizer(model.parameters(), job=checkpointed, servers=nowhere)
    with pytest.raises(FileNotFoundError, match="no_such_job.textproto"):
        cserps.torch.Optimizer(model.parameters(), job=str(tmp_path / "no_such_job.textproto"))


def test_launcher_of_another_size_is_refused(tmp_path, monkeypatch):
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), num_workers=2))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"\(torchrun\) started 3 workers but the job has "
                       r"cluster.num_workers 2"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers="127.0.0.1:1")


def test_a_local_rank_without_its_place_is_refused(tmp_path):
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), num_workers=2,
                                                       local_size=2))
    with pytest.raises(ValueError, match="cluster.local_size is 2: each process is one local "
                       "rank of a node, so it needs its launcher's rank and local rank"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers="127.0.0.1:1")
    # Given by hand, both must be.
    with pytest.raises(ValueError, match=r"needs its local rank in \[0, 2\) \(LOCAL_RANK\), "
                       "not 2"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers="127.0.0.1:1", rank=0,
                               local_rank=2)


def test_unreachable_servers_are_a_connection_error_in_time(tmp_path):
    import time
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model)))
    # Port 1 of 127.0.0.1: nothing listens there.
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=r"no answer from the servers within 2s"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers="127.0.0.1:1,127.0.0.1:2",
                               setup_timeout=2.0)
    assert time.monotonic() - start < 20
    # A job file valid only with the arguments' fields (no lr of its own)
    # gets as far.
    text = cluster.job_text(num_params(model))
    assert "  lr: 0.05\n" in text
    no_lr = cluster.write_job(tmp_path, text.replace("  lr: 0.05\n", ""), name="no_lr.textproto")
    with pytest.raises(ConnectionError, match=r"no answer from the servers within 2s"):
        cserps.torch.Optimizer(model.parameters(), job=no_lr, servers="127.0.0.1:1",
                               setup_timeout=2.0, lr=0.1, momentum=0.5)


def test_a_job_differing_from_the_servers_names_the_field(tmp_path, start_servers):
    model = mlp(3)
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), servers=1))
    servers = start_servers(job, 1)
    with pytest.raises(ValueError, match="optimizer.weight_decay"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers,
                               weight_decay=0.5)


def test_round_timeout_and_dead_server_are_timeout_errors_in_time(tmp_path, start_servers):
    import time
    model = mlp(4)
    # Two workers, one running: the first round cannot complete.
    job = cluster.write_job(tmp_path, cluster.job_text(num_params(model), num_workers=2,
                                                       round_timeout_s=1.0))
    servers = start_servers(job, 2)
    optimizer = cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers,
                                       rpc_slack=2.0)
    x, y = batches(1)[0]
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="rank"):
        train_step(model, optimizer, x, y)
    assert time.monotonic() - start < 1.0 + 2.0 + 10
    servers.kill(0)
    start = time.monotonic()
    with pytest.raises((TimeoutError, ConnectionError)):
        train_step(model, optimizer, x, y)
    assert time.monotonic() - start < 1.0 + 2.0 + 10


def test_job_reports_what_it_loaded(tmp_path):
    job = cluster.write_job(tmp_path, cluster.job_text(4096, algorithm="cser",
                                                       extra_algorithm="period: 4 ratio_c1: 2 "
                                                                       "ratio_c2: 8"))
    loaded = _native.Job(job, ["optimizer.lr=0.25", "cluster.servers=127.0.0.1:1,127.0.0.1:2"])
    assert loaded.num_params == 4096
    assert loaded.algorithm == "cser"
    assert loaded.lr == 0.25
    # MODEL_BLOCKS sends R_C1's round instead of R_C2's on sync steps.
    assert loaded.overall_ratio == pytest.approx(4 / (3 / 8 + 1 / 2))
