"""cserps.torch.Optimizer: a torch.optim.Optimizer whose step() is a cserps
algorithm (its direction, local update and exchanges with the servers), run
by the worker library on the parameters in place."""

import math
import numbers
import struct

import torch

from cserps import _native
from cserps import place as _place
from cserps.torch import settings

# The hyperparameters torch's param_groups hold; the job fixes all but lr.
_FIXED = ("momentum", "nesterov", "weight_decay")
# The version of the "cserps" entry of state_dict().
_STATE_FORMAT = "cserps.torch/1"


def _value(value):
    """`value` as an override's right-hand side."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_value(v) for v in value)
    return str(value)


def _hyperparameter_overrides(algorithm, lr, momentum, nesterov, weight_decay,
                              algorithm_params, job_under):
    """The job's overrides for the arguments that are not None. job_under(o)
    loads the job with overrides `o`; it is read only where momentum or
    nesterov leaves the other to the job, so that a job file valid only with
    the arguments' fields (no optimizer.lr of its own, say) loads."""
    overrides = []
    if algorithm is not None:
        overrides.append(f"algorithm.name={algorithm}")
    for key, value in algorithm_params.items():
        overrides.append(f"algorithm.{key}={_value(value)}")
    if lr is not None:
        overrides.append(f"optimizer.lr={_value(float(lr))}")
    if weight_decay is not None:
        overrides.append(f"optimizer.weight_decay={_value(float(weight_decay))}")
    if momentum is not None or nesterov is not None:
        job = job_under(overrides) if momentum is None or nesterov is None else None
        beta = float(momentum) if momentum is not None else job.momentum
        if beta == 0.0:
            if nesterov:
                raise ValueError("nesterov=True needs a momentum > 0")
            kind = "NONE"
        elif nesterov is None:
            # A momentum alone keeps the job's kind of it.
            kind = job.momentum_kind if job.momentum_kind != "NONE" else "HEAVY_BALL"
        else:
            kind = "NESTEROV" if nesterov else "HEAVY_BALL"
        overrides += [f"optimizer.momentum={_value(beta)}", f"optimizer.momentum_kind={kind}"]
    return overrides


def _seconds(name, value, zero_allowed):
    """`value` as seconds: ValueError unless it is finite and > 0 (>= 0
    where zero is allowed); an infinite wait would have no deadline."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_allowed):
        raise ValueError(f"{name} is {value!r}; it must be a finite number of seconds "
                         f"{'>= 0' if zero_allowed else '> 0'}")
    return seconds


def _float32(value):
    """`value` rounded to float32, as the job and the servers hold it (inf
    beyond its range)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _learning_rate(name, value):
    """`value` as a learning rate: ValueError unless it is a finite number
    >= 0 in float32, as the servers require."""
    try:
        lr = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        lr = math.nan
    if not math.isfinite(_float32(lr)) or lr < 0:
        raise ValueError(f"{name} is {value!r}: it must be finite and >= 0 (a float32)")
    return lr


def _same_setting(a, b):
    """Whether two values of a fixed setting are the same once held in
    float32 (the job's momentum 0.9 reads 0.8999999761581421)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    try:
        return _float32(float(a)) == _float32(float(b))
    except (TypeError, ValueError, OverflowError):
        return False


def _count(name, value, limit):
    """`value` as an int in [0, limit): ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or \
            not 0 <= value < limit:
        raise ValueError(f"{name} is {value!r}; it must be a whole number in [0, {limit})")
    return int(value)


class Optimizer(torch.optim.Optimizer):
    """Runs the job's cserps algorithm on `params` at every step().

    The parameters (float32, all trainable, one group, on the CPU or, in a
    CUDA build of cserps, on one GPU, whose state then stays there) are moved
    at construction into one contiguous buffer, and their gradients into a
    second one, as fused optimizers do: each parameter and its .grad become
    views of them, so a step copies nothing between torch and cserps. The
    buffers follow the order of `params`, each tensor flattened row-major
    (docs/protocol.md, "Model layout").

    The job config (job=, or cserps.torch.init, or CSERPS_JOB) is the one the
    servers run; the arguments that are not None override its fields: the
    algorithm's name, optimizer.lr, momentum (optimizer.momentum, with
    momentum_kind HEAVY_BALL, or NESTEROV with nesterov=True, or NONE for
    0), weight_decay, and algorithm_params as algorithm.<key>=<value>
    (ratio_c1=256, period=4, ...). A worker whose job differs from the
    servers' is refused at registration, naming the first differing field.

    The learning rate of each step is param_groups[0]["lr"], so
    torch.optim.lr_scheduler drives it; every worker must use the same
    schedule: the servers apply the lr of a round's first push.

    Construction registers with the servers (rank: the rank argument, else
    RANK or SLURM_PROCID when set, else assigned; a restarted process gets
    its rank back by giving the worker_id it registered with) and starts
    every worker from the same model: rank 0's parameters, pushed to the
    servers and pulled by all. In a job of nodes (cluster.local_size L > 1)
    each process is one local rank (LOCAL_RANK, or local_rank=) of node
    RANK / L (or rank=), its node's local ranks average among themselves
    first and the node is the servers' member; they must make the same calls
    in the same order (step, finish, server_model).

    state_dict() holds, besides torch's param_groups, the algorithm's whole
    state on this worker (its local model, momentum and error buffers, step
    count), so torch.save of it is this worker's checkpoint and
    load_state_dict() resumes from it to the bit. Each rank saves and loads
    its own: the workers' local states differ.

    A job with checkpoints of its own (checkpoint.every_steps and dir,
    docs/reliability.md; steps_per_epoch is then needed) takes them as
    cserps-worker does: a step that ends on a multiple of every_steps is
    followed by a full average and this worker's file of it. Resumed
    (checkpoint.resume, which cserps-launch --resume and --max_restarts
    set), construction takes this worker's state from the newest complete
    checkpoint and the model from the servers, and `steps` is the step the
    script goes on at.
    """

    def __init__(self, params, algorithm=None, lr=None, momentum=None, nesterov=None,
                 weight_decay=None, *, job=None, servers=None, set=None,
                 steps_per_epoch=0, setup_timeout=120.0, rpc_slack=30.0, worker_id="",
                 rank=None, local_rank=None, **algorithm_params):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov,
                                      weight_decay=weight_decay))
        if len(self.param_groups) != 1:
            raise ValueError(
                f"cserps averages one model with one learning rate: got "
                f"{len(self.param_groups)} parameter groups, give one")
        self._params = list(self.param_groups[0]["params"])
        self._device = self._check_params(self._params)
        self._num_params = sum(p.numel() for p in self._params)

        setup_timeout = _seconds("setup_timeout", setup_timeout, zero_allowed=False)
        rpc_slack = _seconds("rpc_slack", rpc_slack, zero_allowed=True)
        steps_per_epoch = _count("steps_per_epoch", steps_per_epoch, 2**63)
        if rank is not None:
            rank = _count("rank", rank, 2**31)
        if local_rank is not None:
            local_rank = _count("local_rank", local_rank, 2**31)
        path, overrides = settings.resolve(job, servers, set)
        # A group's own hyperparameters (torch's [{"params": ..., "lr": ...}])
        # are the arguments' values where it gives them.
        group = self.param_groups[0]
        overrides += _hyperparameter_overrides(
            algorithm, group["lr"], group["momentum"], group["nesterov"],
            group["weight_decay"], algorithm_params,
            lambda own: _native.Job(path, overrides + own))
        self._job = _native.Job(path, overrides)
        if self._job.num_params != self._num_params:
            raise ValueError(
                f"the parameters have {self._num_params} floats but the job's model "
                f"({self._job.model_kind}) has {self._job.num_params}: a PyTorch model "
                f"needs model {{ kind: FLAT num_params: {self._num_params} }} in the job")
        group["lr"] = self._job.lr
        group["momentum"] = self._job.momentum
        group["nesterov"] = self._job.momentum_kind == "NESTEROV"
        group["weight_decay"] = self._job.weight_decay
        self._fixed = {key: group[key] for key in _FIXED}

        if rank is None or (local_rank is None and self._job.local_size > 1):
            found = _place.member(_place.from_environment(), self._job.num_workers,
                                  self._job.local_size)
            rank = found[0] if rank is None else rank
            local_rank = found[1] if local_rank is None else local_rank
        self._flatten()
        device_index = -1
        if self._device.type == "cuda":
            device_index = torch.cuda.current_device() if self._device.index is None \
                else self._device.index
        self._trainer = _native.Trainer(
            self._job, rank=int(rank), worker_id=str(worker_id),
            setup_timeout_s=float(setup_timeout), rpc_slack_s=float(rpc_slack),
            steps_per_epoch=int(steps_per_epoch), device=device_index,
            local_rank=-1 if local_rank is None else int(local_rank))
        self._trainer.initialize_model(self._flat.data_ptr(), self._num_params)
        self._finished = False

    @staticmethod
    def _check_params(params):
        """The device all `params` are on; ValueError for what cserps cannot
        train."""
        if not params:
            raise ValueError("no parameters to train")
        device = params[0].device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"parameters on {device}: cserps trains them on the CPU or, "
                             "built with CUDA, on a GPU")
        if device.type == "cuda" and not _native.has_cuda:
            raise ValueError(f"parameters on {device}: this cserps was built without CUDA "
                             "(configure with -DCSERPS_CUDA=ON where nvcc is installed)")
        seen = set()
        for i, p in enumerate(params):
            what = f"parameter {i} ({tuple(p.shape)})"
            if id(p) in seen:
                raise ValueError(f"{what} is given twice")
            seen.add(id(p))
            if p.dtype != torch.float32:
                raise ValueError(f"{what} is {p.dtype}; cserps trains float32 models")
            if p.device != device:
                raise ValueError(f"{what} is on {p.device} but parameter 0 on {device}: "
                                 "a worker's model is on one device")
            if p.is_sparse:
                raise ValueError(f"{what} is sparse; cserps trains dense parameters")
            if not p.requires_grad:
                raise ValueError(f"{what} does not require a gradient; give the "
                                 "Optimizer only the parameters it trains")
        return device

    def _flatten(self):
        self._flat = torch.empty(self._num_params, dtype=torch.float32, device=self._device)
        self._flat_grad = torch.zeros(self._num_params, dtype=torch.float32, device=self._device)
        self._slices = []
        offset = 0
        with torch.no_grad():
            for p in self._params:
                n = p.numel()
                self._flat[offset:offset + n].copy_(p.reshape(-1))
                self._slices.append((offset, n))
                offset += n
        self._repoint()

    def _view(self, flat, p, offset, n):
        return flat[offset:offset + n].view_as(p)

    def _repoint(self):
        """Makes every parameter and gradient a view of the flat buffers again,
        copying in what was put elsewhere (a parameter's .data replaced, a
        .grad set to None or to a new tensor)."""
        self._check_unchanged()
        flat_ptr, grad_ptr = self._flat.data_ptr(), self._flat_grad.data_ptr()
        with torch.no_grad():
            for p, (offset, n) in zip(self._params, self._slices):
                if p.data_ptr() != flat_ptr + 4 * offset or not p.is_contiguous():
                    self._flat[offset:offset + n].copy_(p.reshape(-1))
                    p.data = self._view(self._flat, p, offset, n)
                g = p.grad
                if g is not None and g.layout == torch.strided and \
                        g.data_ptr() == grad_ptr + 4 * offset and g.is_contiguous():
                    continue
                if g is None:
                    self._flat_grad[offset:offset + n].zero_()
                else:
                    # A sparse one (nn.Embedding(sparse=True) after its
                    # .grad was set to None) is copied in dense.
                    dense = g if g.layout == torch.strided else g.to_dense()
                    self._flat_grad[offset:offset + n].copy_(dense.reshape(-1))
                p.grad = self._view(self._flat_grad, p, offset, n)

    def _check_unchanged(self):
        """ValueError when a parameter was cast, moved or resized since
        (model.double(), .to(), p.data = ...): _repoint would put it back as a
        float32 on the old device, or spread it over its slot."""
        for i, (p, (_, n)) in enumerate(zip(self._params, self._slices)):
            if p.dtype != torch.float32 or p.device != self._device or p.numel() != n:
                raise ValueError(
                    f"parameter {i} is now {p.dtype} on {p.device} with {p.numel()} elements; "
                    f"it was torch.float32 on {self._device} with {n}: make the Optimizer "
                    "after model.to(), .cuda() or .double(), and keep every parameter's shape")

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients in place (set_to_none is ignored: they stay
        views of the flat gradient buffer). A .grad put elsewhere is dropped,
        not copied back in."""
        for p in self._params:
            p.grad = None
        self._repoint()

    @torch.no_grad()
    def step(self, closure=None):
        """One step of the algorithm at lr = param_groups[0]["lr"]. Blocks for
        the step's exchanges with the servers (TimeoutError when they do not
        answer within cluster.round_timeout_s plus rpc_slack)."""
        if self._finished:
            raise ValueError("step() after finish(): the job's training is over")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        group = self.param_groups[0]
        for key, value in self._fixed.items():
            if not _same_setting(group[key], value):
                raise ValueError(
                    f"param_groups[0][{key!r}] changed from {value} to {group[key]}: "
                    "the job fixes it for every worker and the servers (only lr may change)")
        lr = _learning_rate("param_groups[0]['lr']", group["lr"])
        for i, p in enumerate(self._params):
            if not p.requires_grad:
                # Weight decay, momentum and the averages with the other
                # workers' copies would still move it.
                raise ValueError(
                    f"parameter {i} no longer requires a gradient, but cserps steps every "
                    "parameter the Optimizer holds: make the Optimizer with only the "
                    "parameters it trains (and model.num_params their count)")
        self._repoint()
        self._trainer.step(lr, self._flat_grad.data_ptr(),
                           self._flat.data_ptr(), self._num_params)
        return loss

    def finish(self):
        """After the last step: the algorithm's final average, after which every
        worker's parameters and the servers' model are the same global model."""
        if self._finished:
            return
        self._repoint()
        self._trainer.finish(self._flat.data_ptr(), self._num_params)
        self._finished = True

    def server_model(self):
        """A copy of the servers' model, as one flat tensor."""
        out = torch.empty(self._num_params, dtype=torch.float32)
        self._trainer.pull_model(out.data_ptr(), self._num_params)
        return out

    def state_dict(self):
        """torch's state_dict, plus this worker's cserps state under "cserps".
        An algorithm that keeps an average in flight between steps
        (cocod-sgd, pipe-sgd) first waits for it; in a job of nodes that is
        a collective: every local rank of the node calls state_dict() at the
        same step."""
        state = super().state_dict()
        buffers = [torch.empty(self._num_params, dtype=torch.float32)
                   for _ in range(self._trainer.state_size())]
        self._repoint()
        self._trainer.save_state(self._flat.data_ptr(), [b.data_ptr() for b in buffers],
                                 self._num_params)
        state["cserps"] = {
            "format": _STATE_FORMAT,
            "algorithm": self._job.algorithm,
            "block_size": self._job.block_size,
            "num_params": self._num_params,
            "shapes": [list(p.shape) for p in self._params],
            "rank": self.rank,
            "local_rank": self.local_rank,
            "step": self.steps,
            "finished": self._finished,
            "params": self._flat.clone(),
            "buffers": buffers,
        }
        return state

    def load_state_dict(self, state_dict):
        """Resumes from a state_dict() of this rank in a job of the same
        algorithm, block size and model (its size and parameter shapes);
        ValueError naming what differs."""
        saved = state_dict.get("cserps") if isinstance(state_dict, dict) else None
        if not isinstance(saved, dict):
            raise ValueError("not the state of a cserps.torch.Optimizer: it has no "
                             "'cserps' entry")
        if saved.get("format") != _STATE_FORMAT:
            raise ValueError(f"state format {saved.get('format')!r}; this cserps reads "
                             f"{_STATE_FORMAT!r}")
        for key, mine in (("algorithm", self._job.algorithm),
                          ("block_size", self._job.block_size),
                          ("num_params", self._num_params), ("rank", self.rank),
                          ("local_rank", self.local_rank)):
            if saved.get(key, 0 if key == "local_rank" else None) != mine:
                raise ValueError(f"the state is of {key} {saved.get(key)!r} but this "
                                 f"worker's is {mine!r}")
        for key in ("step", "finished", "params", "buffers"):
            if key not in saved:
                raise ValueError(f"the state has no {key!r}")
        if not isinstance(saved["buffers"], (list, tuple)):
            raise ValueError(f"the state's buffers are {type(saved['buffers']).__name__}, "
                             "not a list of tensors")
        # States saved before shapes were kept have none to compare.
        self._check_shapes(saved.get("shapes"))
        tensors = [saved["params"]] + list(saved["buffers"])
        for i, t in enumerate(tensors):
            if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32
                    or tuple(t.shape) != (self._num_params,)):
                what = "params" if i == 0 else f"buffers[{i - 1}]"
                raise ValueError(f"the state's {what} is not {self._num_params} float32s")
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != 1 or \
                not isinstance(groups[0], dict) or \
                not isinstance(groups[0].get("params"), (list, tuple)) or \
                len(groups[0]["params"]) != len(self._params) or \
                not all(type(i) is int for i in groups[0]["params"]):
            raise ValueError(f"the state's param_groups are not one group of "
                             f"{len(self._params)} parameters (their ids)")
        for key, value in self._fixed.items():
            if not _same_setting(groups[0].get(key), value):
                raise ValueError(
                    f"the state's {key} is {groups[0].get(key)} but the job's is {value}")
        _learning_rate("the state's lr", groups[0].get("lr"))
        step = _count("the state's step", saved["step"], 2**63)
        finished = saved["finished"]
        if not isinstance(finished, bool):
            raise ValueError(f"the state's finished is {type(finished).__name__}, not a bool")
        self._check_unchanged()
        # Checked whole above; what torch or the trainer may still refuse
        # leaves the optimizer as it was.
        buffers = [t.detach().cpu().contiguous() for t in tensors[1:]]
        before = torch.optim.Optimizer.state_dict(self)
        super().load_state_dict({"state": {}, "param_groups": groups})
        try:
            self._trainer.load_state(step, [b.data_ptr() for b in buffers], self._num_params)
        except BaseException:
            super().load_state_dict(before)
            raise
        # Parameters put elsewhere since are views of the flat buffer again
        # before the state's values go in, so that none keeps its own.
        self._repoint()
        with torch.no_grad():
            self._flat.copy_(saved["params"])
        self._finished = finished

    def __getstate__(self):
        raise TypeError("a cserps.torch.Optimizer holds its trainer and its connections to "
                        "the servers, which cannot be pickled or copied: save its "
                        "state_dict() instead")

    def _check_shapes(self, shapes):
        """ValueError when `shapes` (a state's, or None) are not this model's
        parameter shapes: a model of another layout but the same size."""
        if shapes is None:
            return
        mine = [list(p.shape) for p in self._params]
        if not isinstance(shapes, (list, tuple)) or \
                not all(isinstance(s, (list, tuple, torch.Size)) for s in shapes):
            raise ValueError(f"the state's shapes {shapes!r} are not a list of shapes")
        if len(shapes) != len(mine):
            raise ValueError(f"the state is of a model of {len(shapes)} parameters but this "
                             f"worker's has {len(mine)}")
        for i, (theirs, ours) in enumerate(zip(shapes, mine)):
            if list(theirs) != ours:
                raise ValueError(f"the state's parameter {i} has shape {tuple(theirs)} but "
                                 f"this worker's has {tuple(ours)}")

    def add_param_group(self, param_group):
        if hasattr(self, "_trainer"):
            raise ValueError("cserps trains the model the Optimizer was made with: "
                             "it cannot add parameter groups")
        super().add_param_group(param_group)

    @property
    def rank(self):
        """The member's rank in the job (the node's, in a job of nodes)."""
        return self._trainer.rank

    @property
    def local_rank(self):
        """This process's local rank in its node (0 for a worker of its own)."""
        return self._trainer.local_rank

    @property
    def partition(self):
        """This process's index among the job's cluster.num_workers x
        cluster.local_size processes (rank x local_size + local rank): the
        index of its data partition and of its entries in the job's
        per-process lists."""
        return self._trainer.partition

    @property
    def batch_size(self):
        """This process's batch size in the job: its weight in the averages."""
        return int(self._trainer.weight)

    @property
    def algorithm(self):
        """The job's algorithm, e.g. "cser (MODEL_BLOCKS): H=16, R_C1=4,
        R_C2=64 -> overall R_C = 33.03"."""
        return self._job.description

    @property
    def steps(self):
        """Steps taken so far."""
        return self._trainer.step_count

    @property
    def achieved_compression(self):
        """Steps times the model's floats over the floats the steps pushed
        (finish()'s final average not counted): S-SGD's traffic over this one's.
        In a node: of this local rank's shards."""
        return self._trainer.achieved_compression

    @property
    def bytes_pushed(self):
        return self._trainer.bytes_pushed

    @property
    def bytes_pulled(self):
        return self._trainer.bytes_pulled

    @property
    def flat_params(self):
        """The parameters' flat buffer (a view: the parameters are in it)."""
        return self._flat
