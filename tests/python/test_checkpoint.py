"""state_dict() and load_state_dict(): a checkpoint of every worker resumes
the job to the bit, and a state of another job is refused."""

import copy
import io
import pickle
import threading

import pytest
import torch

import cluster
import cserps.torch

WORKERS = 2
STEPS = 20
SAVE_AFTER = 12
THREAD_TIMEOUT_S = 120


def mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(rank, t):
    generator = torch.Generator().manual_seed(1000 * rank + t)
    return torch.randn(8, 20, generator=generator), torch.randint(0, 4, (8,), generator=generator)


def train(model, optimizer, rank, steps):
    history = []
    for t in steps:
        x, y = batch(rank, t)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        history.append(optimizer.flat_params.clone())
    return history


def on_threads(work):
    """work(rank) on one thread per worker (the native calls release the
    GIL, so the workers' rounds meet); their results, or the first error."""
    results, errors = [None] * WORKERS, []

    def run(rank):
        try:
            results[rank] = work(rank)
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=THREAD_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a worker did not finish in time"
    if errors:
        raise errors[0]
    return results


# Every algorithm whose state between steps is on its workers (async-sgd's
# is on the servers): the momentum buffer (all of them), local models (the
# periodic ones), error buffers (ef-sgd, the top-k residuals), x̂
# (qsparse-local-sgd), and the averages in flight, landed at the checkpoint
# (cocod-sgd's, saved at a period's start (4) and in its middle (5);
# pipe-sgd's).
CASES = [
    ("ssgd", ""),
    ("cser", "period: 4 ratio_c1: 2 ratio_c2: 8"),
    ("cser", "period: 4 ratio_c1: 2 ratio_c2: 8 cser_variant: GRADIENT_BLOCKS"),
    ("cser-pl", "period: 4 ratio_c1: 2"),
    ("csea", "ratio_c1: 4"),
    ("local-sgd", "period: 4"),
    ("ef-sgd", "ratio: 4"),
    ("qsparse-local-sgd", "period: 4 ratio: 4"),
    ("topk-ssgd", "density: 0.05"),
    ("gtopk-ssgd", "density: 0.05"),
    ("cocod-sgd", "period: 4"),
    ("cocod-sgd", "period: 5"),
    ("pipe-sgd", ""),
]


@pytest.mark.parametrize("algorithm,fields", CASES,
                         ids=[c[0] + ("-gradient-blocks" if "GRADIENT" in c[1] else "")
                              + ("-period-5" if "period: 5" in c[1] else "") for c in CASES])
def test_resumed_workers_take_the_same_steps(tmp_path, start_servers, algorithm, fields):
    d = 20 * 16 + 16 + 16 * 4 + 4
    # The resumed job runs on new servers, whose first round is step 12.
    job = cluster.write_job(tmp_path, cluster.job_text(
        d, num_workers=WORKERS, algorithm=algorithm, extra_algorithm=fields,
        max_step_lag=100))
    first = start_servers(job, 2)

    def uninterrupted(rank):
        model = mlp(rank)
        optimizer = cserps.torch.Optimizer(model.parameters(), job=job,
                                           servers=first.servers, rank=rank)
        train(model, optimizer, rank, range(SAVE_AFTER))
        checkpoint = io.BytesIO()
        torch.save(optimizer.state_dict(), checkpoint)
        return checkpoint.getvalue(), train(model, optimizer, rank, range(SAVE_AFTER, STEPS))

    results = on_threads(uninterrupted)
    first.stop()
    second = start_servers(job, 2)

    def resumed(rank):
        model = mlp(50 + rank)  # not the checkpoint's: loading must replace it
        optimizer = cserps.torch.Optimizer(model.parameters(), job=job,
                                           servers=second.servers, rank=rank)
        # An optimizer in use: what it holds is replaced, the averages it
        # keeps in flight (cocod-sgd's, pipe-sgd's) included.
        train(model, optimizer, rank, range(3))
        optimizer.load_state_dict(torch.load(io.BytesIO(results[rank][0])))
        assert optimizer.steps == SAVE_AFTER
        history = train(model, optimizer, rank, range(SAVE_AFTER, STEPS))
        # Of the steps since the load alone: S-SGD's is 1.
        if algorithm == "ssgd":
            assert optimizer.achieved_compression == 1.0
        return history

    for rank, history in enumerate(on_threads(resumed)):
        for t, (a, b) in enumerate(zip(results[rank][1], history)):
            assert torch.equal(a, b), f"rank {rank} step {SAVE_AFTER + t}"
    # The workers' local models differ for cser: each resumed its own.
    if algorithm.startswith("cser"):
        assert not torch.equal(results[0][1][0], results[1][1][0])


def one_worker(tmp_path, start_servers, algorithm, fields="", block_size=64, name="job",
               model=None):
    model = mlp(0) if model is None else model
    job = cluster.write_job(tmp_path, cluster.job_text(
        sum(p.numel() for p in model.parameters()), servers=1, algorithm=algorithm,
        extra_algorithm=fields, block_size=block_size), name=f"{name}.textproto")
    servers = start_servers(job, 1)
    return model, cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers)


def test_a_load_replaces_parameters_put_elsewhere(tmp_path, start_servers):
    model, optimizer = one_worker(tmp_path, start_servers, "ssgd")
    train(model, optimizer, 0, range(3))
    checkpoint = io.BytesIO()
    torch.save(optimizer.state_dict(), checkpoint)
    saved = [p.detach().clone() for p in model.parameters()]
    train(model, optimizer, 0, range(3, 5))
    weight = next(model.parameters())
    weight.data = torch.zeros_like(weight)  # no longer a view of the flat buffer
    optimizer.load_state_dict(torch.load(io.BytesIO(checkpoint.getvalue())))
    for i, (p, s) in enumerate(zip(model.parameters(), saved)):
        assert torch.equal(p, s), f"parameter {i}"


def test_a_state_of_another_job_is_refused(tmp_path, start_servers):
    _, cser = one_worker(tmp_path, start_servers, "cser", "period: 4 ratio_c1: 2 ratio_c2: 8",
                         name="cser")
    state = cser.state_dict()
    _, ssgd = one_worker(tmp_path, start_servers, "ssgd", name="ssgd")
    with pytest.raises(ValueError, match="the state is of algorithm 'cser' but this "
                                         "worker's is 'ssgd'"):
        ssgd.load_state_dict(state)
    _, blocks = one_worker(tmp_path, start_servers, "cser", "period: 4 ratio_c1: 2 ratio_c2: 8",
                           block_size=32, name="blocks")
    with pytest.raises(ValueError, match="the state is of block_size 64 but this worker's is 32"):
        blocks.load_state_dict(state)
    # A model of another layout with as many floats (404).
    _, other = one_worker(tmp_path, start_servers, "cser", "period: 4 ratio_c1: 2 ratio_c2: 8",
                          name="other", model=torch.nn.Linear(100, 4))
    with pytest.raises(ValueError, match="a model of 4 parameters but this worker's has 2"):
        other.load_state_dict(state)
    transposed = cser.state_dict()
    transposed["cserps"]["shapes"][0] = [20, 16]
    with pytest.raises(ValueError, match=r"parameter 0 has shape \(20, 16\) but this "
                                         r"worker's has \(16, 20\)"):
        cser.load_state_dict(transposed)
    smaller = cser.state_dict()
    smaller["cserps"]["num_params"] -= 1
    with pytest.raises(ValueError, match="the state is of num_params"):
        cser.load_state_dict(smaller)
    with pytest.raises(ValueError, match="has no 'cserps' entry"):
        cser.load_state_dict({"state": {}, "param_groups": state["param_groups"]})
    broken = cser.state_dict()
    broken["cserps"]["buffers"][0] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"buffers\[0\] is not"):
        cser.load_state_dict(broken)
    # Refused whole: a state found wanting changes nothing.
    params, steps = cser.flat_params.clone(), cser.steps
    unfinished = cser.state_dict()
    unfinished["cserps"]["params"] = torch.zeros_like(params)
    del unfinished["cserps"]["finished"]
    with pytest.raises(ValueError, match="the state has no 'finished'"):
        cser.load_state_dict(unfinished)
    regrouped = cser.state_dict()
    regrouped["cserps"]["params"] = torch.zeros_like(params)
    regrouped["param_groups"][0]["params"] = [0]
    with pytest.raises(ValueError, match="not one group of 4 parameters"):
        cser.load_state_dict(regrouped)
    # Entries of the wrong kind are ValueErrors too, not TypeErrors.
    malformed = [
        (("cserps", "buffers"), None, "the state's buffers are NoneType"),
        (("cserps", "shapes"), [3, 4], "are not a list of shapes"),
        (("cserps", "step"), -1, "the state's step is -1; it must be a whole number"),
        (("param_groups", 0, "lr"), None, "the state's lr is None"),
        (("cserps", "finished"), torch.zeros(3), "the state's finished is Tensor, not a bool"),
        (("param_groups", 0, "params"), 4, "not one group of 4 parameters"),
        # Ids torch could not map, found only once the trainer had loaded.
        (("param_groups", 0, "params"), [[0], [1], [2], [3]], "not one group of 4 parameters"),
    ]
    for path, value, message in malformed:
        bad = cser.state_dict()
        bad["cserps"]["params"] = torch.zeros_like(params)
        entry = bad
        for key in path[:-1]:
            entry = entry[key]
        entry[path[-1]] = value
        with pytest.raises(ValueError, match=message):
            cser.load_state_dict(bad)
    assert torch.equal(cser.flat_params, params) and cser.steps == steps


def test_a_state_of_any_step_loads_at_once(tmp_path, start_servers):
    # cocod-sgd finds the period boundary after the state's step; a search
    # step by step would take centuries for this one.
    _, optimizer = one_worker(tmp_path, start_servers, "cocod-sgd", "period: 4")
    state = optimizer.state_dict()
    state["cserps"]["step"] = 2**62 + 1
    loaded = threading.Thread(target=optimizer.load_state_dict, args=(state,), daemon=True)
    loaded.start()
    loaded.join(timeout=THREAD_TIMEOUT_S)
    assert not loaded.is_alive(), "the load did not finish in time"
    assert optimizer.steps == 2**62 + 1


def test_an_optimizer_is_not_pickled_or_copied(tmp_path, start_servers):
    # Its trainer and connections would be lost without a word.
    _, optimizer = one_worker(tmp_path, start_servers, "ssgd")
    for copy_of in (pickle.dumps, copy.deepcopy, lambda o: torch.save(o, io.BytesIO())):
        with pytest.raises(TypeError, match=r"cannot be pickled or copied: save its "
                                            r"state_dict\(\) instead"):
            copy_of(optimizer)


def test_resuming_without_a_checkpoint_names_the_folder(tmp_path, start_servers):
    model = mlp(0)
    job = cluster.write_job(tmp_path, cluster.job_text(
        sum(p.numel() for p in model.parameters()), servers=1) +
        f'checkpoint {{ dir: "{tmp_path}/checkpoints" every_steps: 5 }}\n')
    servers = start_servers(job, 1)
    with pytest.raises(ValueError, match=rf"rank 0 cannot resume: no complete checkpoint of job "
                                         rf"0x[0-9a-f]+ in {tmp_path}/checkpoints"):
        cserps.torch.Optimizer(model.parameters(), job=job, servers=servers.servers,
                               steps_per_epoch=20, set="checkpoint.resume=true")
