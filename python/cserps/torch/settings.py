"""Where a PyTorch worker finds its job: the arguments of cserps.torch.init,
else the environment (CSERPS_JOB, CSERPS_SERVERS, CSERPS_SET), which
cserps-launch --nproc sets for the processes it starts."""

import os

_init = {}


def _overrides(value, where):
    if value is None:
        return []
    if isinstance(value, str):
        return [piece.strip() for piece in value.split(";") if piece.strip()]
    try:
        return [str(piece) for piece in value]
    except TypeError:
        raise ValueError(f"{where}: overrides are a list of 'field.path=value' or one "
                         f"string of them separated by ';', not {value!r}") from None


def _servers(value, where):
    if value is None:
        return None
    if isinstance(value, str):
        value = [s.strip() for s in value.split(",") if s.strip()]
    servers = [str(s) for s in value]
    if not servers:
        raise ValueError(f"{where}: no server addresses")
    return ",".join(servers)


def init(job=None, servers=None, set=None):
    """Names the job config file and the servers of the Optimizers this process
    makes from now on (their own arguments still win).

    job: a text-format cserps.v1.JobConfig file, the one the servers run.
    servers: "host:port,host:port" or a list of them, in shard order: the
        job's cluster.servers.
    set: config overrides, "field.path=value" as cserps-worker's --set, in a
        list or in one string separated by ';'.
    """
    _init.clear()
    _init.update(job=job, servers=_servers(servers, "init(servers=...)"),
                 set=_overrides(set, "init(set=...)"))


def resolve(job=None, servers=None, set=None):
    """The job file and overrides for an Optimizer given these arguments."""
    path = job or _init.get("job") or os.environ.get("CSERPS_JOB", "")
    if not path:
        raise ValueError("no job config: pass job=PATH to the Optimizer or to "
                         "cserps.torch.init, or set CSERPS_JOB")
    overrides = _overrides(os.environ.get("CSERPS_SET"), "CSERPS_SET")
    overrides += _init.get("set", [])
    overrides += _overrides(set, "set=")
    chosen = (_servers(servers, "servers=") or _init.get("servers")
              or _servers(os.environ.get("CSERPS_SERVERS") or None, "CSERPS_SERVERS"))
    if chosen:
        overrides.append(f"cluster.servers={chosen}")
    return str(path), overrides
