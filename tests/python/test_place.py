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
])
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        place.from_environment(env)
