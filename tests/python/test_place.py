"""cserps.place: the worker's place from torchrun's or Slurm's variables."""

import pytest

from cserps import place


def test_torchrun_variables_come_first():
    got = place.from_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                  "LOCAL_WORLD_SIZE": "2", "SLURM_PROCID": "0",
                                  "SLURM_NTASKS": "9"})
    assert got == place.Place(rank=3, world_size=4, local_rank=1, local_world_size=2,
                              source="torchrun")


def test_slurm_variables_where_torchrun_is_absent():
    got = place.from_environment({"SLURM_PROCID": "5", "SLURM_NTASKS": "8",
                                  "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4"})
    assert got == place.Place(rank=5, world_size=8, local_rank=1, local_world_size=4,
                              source="slurm")


def slurm(procid, localid, nodeid, **more):
    """What srun -n 8 on two nodes gives a task (no --ntasks-per-node, so no
    SLURM_NTASKS_PER_NODE)."""
    return dict({"SLURM_PROCID": str(procid), "SLURM_NTASKS": "8", "SLURM_LOCALID": str(localid),
                 "SLURM_NODEID": str(nodeid)}, **more)


@pytest.mark.parametrize("env,local_world_size", [
    (slurm(5, 1, 1, SLURM_STEP_TASKS_PER_NODE="4(x2)"), 4),
    (slurm(5, 1, 1, SLURM_TASKS_PER_NODE="4(x2)"), 4),
    # The step's own list wins over the allocation's.
    (slurm(5, 1, 1, SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURM_TASKS_PER_NODE="8(x2)"), 4),
    (slurm(6, 0, 1, SLURM_STEP_TASKS_PER_NODE="6,2"), 2),
    (slurm(1, 1, 0, SLURM_STEP_TASKS_PER_NODE="6,2"), 6),
    (slurm(7, 0, 3, SLURM_STEP_TASKS_PER_NODE="2(x2),3,1"), 1),
])
def test_slurm_tasks_per_node_come_from_its_per_node_lists(env, local_world_size):
    got = place.from_environment(env)
    assert (got.rank, got.local_rank, got.local_world_size) == (
        int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"]), local_world_size)
    assert place.member(got, num_workers=8, local_size=1) == (got.rank, -1)


def test_no_launcher_leaves_the_rank_to_the_servers():
    assert place.from_environment({}).rank == -1


@pytest.mark.parametrize("env,message", [
    ({"RANK": "0"}, "WORLD_SIZE is not set"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "1"},
     "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1"),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, "SLURM_PROCID=4 is not below SLURM_NTASKS=4"),
    (slurm(1, 1, 0), "SLURM_LOCALID=1 is not below the node's Slurm tasks=1"),
    (slurm(1, 1, 0, SLURM_STEP_TASKS_PER_NODE="4(x)"),
     r"SLURM_STEP_TASKS_PER_NODE='4\(x\)' is not a list of task counts"),
    (slurm(1, 1, 0, SLURM_TASKS_PER_NODE="0(x2)"), "SLURM_TASKS_PER_NODE='0"),
    (slurm(1, 1, 2, SLURM_STEP_TASKS_PER_NODE="4,2"),
     "SLURM_NODEID=2 but SLURM_STEP_TASKS_PER_NODE='4,2' lists 2 nodes"),
    ({k: v for k, v in slurm(1, 1, 0, SLURM_STEP_TASKS_PER_NODE="4,2").items()
      if k != "SLURM_NODEID"}, "SLURM_NODEID is not set"),
])
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        place.from_environment(env)


def torchrun(rank, world, local_rank, local_world):
    return place.Place(rank=rank, world_size=world, local_rank=local_rank,
                       local_world_size=local_world, source="torchrun")


def test_a_flat_job_is_one_worker_per_process():
    assert place.member(torchrun(3, 4, 1, 2), num_workers=4, local_size=1) == (3, -1)
    assert place.member(place.from_environment({}), num_workers=4, local_size=1) == (-1, -1)


def test_a_job_of_nodes_numbers_each_nodes_processes_consecutively():
    got = [place.member(torchrun(r, 6, r % 3, 3), num_workers=2, local_size=3)
           for r in range(6)]
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize("where,num_workers,local_size,message", [
    (torchrun(0, 3, 0, 1), 4, 1, "started 3 workers but the job has cluster.num_workers 4"),
    (place.Place(-1, 0, 0, 1, "none"), 2, 2, "needs its launcher's rank and local rank"),
    (torchrun(0, 2, 0, 2), 2, 2, "WORLD_SIZE=2 but the job has cluster.num_workers 2 nodes "
     "of cluster.local_size 2: 4 processes"),
    (torchrun(0, 4, 0, 4), 2, 2, "LOCAL_WORLD_SIZE=4 but the job's nodes have"),
    (torchrun(1, 4, 0, 2), 2, 2, "RANK=1 with LOCAL_RANK=0: cserps numbers a node's "
     "processes consecutively"),
])
def test_launchers_that_do_not_fit_the_job_are_refused(where, num_workers, local_size,
                                                       message):
    with pytest.raises(ValueError, match=message):
        place.member(where, num_workers, local_size)
