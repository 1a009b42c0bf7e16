"""Where a worker process is in its job, read from its launcher's environment.

torchrun's contract comes first (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE), then Slurm's where torchrun's is absent: SLURM_PROCID,
SLURM_NTASKS, SLURM_LOCALID, and the tasks on this node from
SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE; "2(x3),1" lists each
node's count in SLURM_NODEID order), else SLURM_NTASKS_PER_NODE, which srun
sets only when given --ntasks-per-node. Without either launcher, the process
is a worker whose rank the servers assign when it registers. MASTER_ADDR and
MASTER_PORT are not needed: the servers are the job's meeting point.

In a job of nodes (cluster.local_size L > 1) the launcher's processes are
the nodes' local ranks, numbered node by node as torchrun --nnodes and
srun's block distribution number them: process RANK is local rank
RANK mod L of node RANK / L, and the node is the job's member.
"""

import dataclasses
import os
import re


@dataclasses.dataclass(frozen=True)
class Place:
    rank: int  # -1: the servers assign it at registration
    world_size: int  # 0: not known
    local_rank: int
    local_world_size: int
    source: str  # "torchrun", "slurm" or "none"


def _integer(env, name, default=None, minimum=0):
    text = env.get(name, "")
    if text == "":
        if default is None:
            raise ValueError(f"{name} is not set, but the variables of its launcher are")
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


# Each launcher's names of (rank, world size, local rank, local world size),
# in the order they are looked for; Slurm's local world size comes from one
# of several variables (_slurm_local_world_size).
_LAUNCHERS = (
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "the node's Slurm tasks")),
)
_NAMES = dict(_LAUNCHERS)
_SLURM_NODE_COUNTS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def _node_counts(name, text):
    """Slurm's tasks per node, "2(x3),1", as [2, 2, 2, 1]."""
    counts = []
    for piece in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", piece)
        if match is None or int(match.group(1)) < 1 or match.group(2) == "0":
            raise ValueError(f"{name}={text!r} is not a list of task counts "
                             "such as '2(x3),1'")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _slurm_local_world_size(env):
    """The tasks on this node, from Slurm's per-node lists where one is set."""
    for name in _SLURM_NODE_COUNTS:
        text = env.get(name, "")
        if text == "":
            continue
        counts = _node_counts(name, text)
        if len(set(counts)) == 1:
            return counts[0]
        node = _integer(env, "SLURM_NODEID")
        if node >= len(counts):
            raise ValueError(f"SLURM_NODEID={node} but {name}={text!r} lists "
                             f"{len(counts)} nodes")
        return counts[node]
    return _integer(env, "SLURM_NTASKS_PER_NODE", default=1, minimum=1)


def from_environment(env=None):
    """The Place the environment `env` (default: os.environ) describes."""
    env = os.environ if env is None else env
    for source, names in _LAUNCHERS:
        if env.get(names[0], "") != "" or env.get(names[1], "") != "":
            break
    else:
        return Place(rank=-1, world_size=0, local_rank=0, local_world_size=1, source="none")
    if source == "slurm":
        local_world_size = _slurm_local_world_size(env)
    else:
        local_world_size = _integer(env, names[3], default=1, minimum=1)
    place = Place(
        rank=_integer(env, names[0]),
        world_size=_integer(env, names[1], minimum=1),
        local_rank=_integer(env, names[2], default=0),
        local_world_size=local_world_size,
        source=source,
    )
    if place.rank >= place.world_size:
        raise ValueError(f"{names[0]}={place.rank} is not below {names[1]}={place.world_size}")
    if place.local_rank >= place.local_world_size:
        raise ValueError(
            f"{names[2]}={place.local_rank} is not below {names[3]}={place.local_world_size}")
    return place


def member(place, num_workers, local_size):
    """(rank, local rank) of the process at `place` in a job of `num_workers`
    members of `local_size` processes each: the rank to claim (-1: the
    servers assign it) and, in a node, the local rank (-1 for a worker of its
    own). ValueError when the launcher's numbers do not fit the job."""
    if local_size == 1:
        if place.world_size and place.world_size != num_workers:
            raise ValueError(f"the launcher ({place.source}) started {place.world_size} "
                             f"workers but the job has cluster.num_workers {num_workers}")
        return place.rank, -1
    if place.source == "none":
        raise ValueError(
            f"cluster.local_size is {local_size}: each process is one local rank of a "
            "node, so it needs its launcher's rank and local rank (start the processes "
            "with torchrun, srun or cserps-launch --nproc)")
    rank, world, local_rank, local_world = _NAMES[place.source]
    processes = num_workers * local_size
    if place.world_size != processes:
        raise ValueError(
            f"{world}={place.world_size} but the job has cluster.num_workers {num_workers} "
            f"nodes of cluster.local_size {local_size}: {processes} processes")
    if place.local_world_size != local_size:
        raise ValueError(f"{local_world}={place.local_world_size} but the job's nodes have "
                         f"cluster.local_size {local_size} processes")
    if place.rank % local_size != place.local_rank:
        raise ValueError(
            f"{rank}={place.rank} with {local_rank}={place.local_rank}: cserps numbers a "
            f"node's processes consecutively ({rank} = node x {local_size} + local rank), "
            "as torchrun and srun's block distribution do")
    return place.rank // local_size, place.local_rank
