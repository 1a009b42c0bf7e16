"""Where a worker process is in its job, read from its launcher's environment.

torchrun's contract comes first (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE), then Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
SLURM_NTASKS_PER_NODE) where torchrun's is absent. Without either, the process
is a worker whose rank the servers assign when it registers. MASTER_ADDR and
MASTER_PORT are not needed: the servers are the job's meeting point.
"""

import dataclasses
import os


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
# in the order they are looked for.
_LAUNCHERS = (
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")),
)


def from_environment(env=None):
    """The Place the environment `env` (default: os.environ) describes."""
    env = os.environ if env is None else env
    for source, names in _LAUNCHERS:
        if env.get(names[0], "") != "" or env.get(names[1], "") != "":
            break
    else:
        return Place(rank=-1, world_size=0, local_rank=0, local_world_size=1, source="none")
    place = Place(
        rank=_integer(env, names[0]),
        world_size=_integer(env, names[1], minimum=1),
        local_rank=_integer(env, names[2], default=0),
        local_world_size=_integer(env, names[3], default=1, minimum=1),
        source=source,
    )
    if place.rank >= place.world_size:
        raise ValueError(f"{names[0]}={place.rank} is not below {names[1]}={place.world_size}")
    if place.local_rank >= place.local_world_size:
        raise ValueError(
            f"{names[2]}={place.local_rank} is not below {names[3]}={place.local_world_size}")
    return place
