"""No test, self-check or benchmark picks a port and binds it later, and every multi-process test starts its
ranks through ``tests/_multiprocess.py``.

A port found free (bind port 0, read it, close) and bound moments later by a rank can be taken in
between by any other process on the machine: the rank fails with ``EADDRINUSE`` and its peers wait for
it. Process groups meet through a file store (``tests/_multiprocess.rendezvous``), a group of one on an
in-memory or file store given as ``store=``, or a server that binds port 0 itself (torchrun
``--standalone``). Ranks are started by ``spawn_ranks``/``run_rank_commands``, which bound every
wait and kill every rank when one fails.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPAWNER = ROOT / "tests" / "_multiprocess.py"
#: The one rank script whose process group torchrun's own store (bound on port 0) hands it.
TORCHRUN_RANKS = ROOT / "tests" / "procs" / "test_procs_torchrun.py"

PICKED_PORT = re.compile(r"free_port|MASTER_PORT|tcp://|TCPStore\(")
#: A TCP address on port 0: the kernel picks the port at the bind, nothing to lose in between.
PORT_ZERO = re.compile(r"tcp://[^\"']*:0[\"']")
#: vllm.ray_store_port_window's self-check and its probe: the behaviour under test is vLLM's own search for
#: the TCPStore's port from a VLLM_PORT base, and whether a store then binds the port vLLM chose. One process,
#: no rank waits on it; a port another process takes in between is reported as the check's error, no hang.
PORT_SEARCH_UNDER_TEST = {"patches/vllm/_checks/_ray_boundary.py", "patches/vllm/_checks/ray_store_port_window.py",
                          "tests/vllm/ray_executor_probe.py"}
RANKS_STARTED_ELSEWHERE = re.compile(r"start_processes\(|\bmp\.spawn\(|multiprocessing\.spawn\(")


def sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py")
                  if p != Path(__file__).resolve() and ".nox" not in p.parts)


def test_no_test_self_check_or_benchmark_picks_a_port_to_bind_later():
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sources("tests", "patches", "patchkit", "benchmarks")
             if str(p.relative_to(ROOT)) not in PORT_SEARCH_UNDER_TEST
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if PICKED_PORT.search(line) and not PORT_ZERO.search(line)]
    assert not found, found


def test_process_groups_of_several_ranks_start_only_through_the_shared_spawner():
    found = []
    for path in sources("tests", "patches"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            starts_group = "init_process_group(" in line and path not in (SPAWNER, TORCHRUN_RANKS)
            # A group given its store (in memory, or a file) picks no port.
            if starts_group and "store=" not in line or RANKS_STARTED_ELSEWHERE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, found
