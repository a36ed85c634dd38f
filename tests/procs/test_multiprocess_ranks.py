"""``tests/_multiprocess``, which starts every multi-process test's ranks: a dead rank fails the job at
once with no rank left behind, and rendezvous never races for a port, even with several jobs and
other processes binding ports at the same moment on a loaded machine."""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from _multiprocess import RankFailed, init_rank, rendezvous, run_rank_commands, spawn_ranks

pytest.importorskip("torch.distributed")


def _one_rank_dies_at_once(rank: int, init_method: str, pid_dir: str, how: str) -> None:
    Path(pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
    if rank == 1:
        waited = time.monotonic()
        while not Path(pid_dir, "rank0.pid").exists() and time.monotonic() - waited < 30:
            time.sleep(0.1)  # rank 0 is on its way to the rendezvous
        if how == "raises":
            raise RuntimeError("rank 1 broke before the rendezvous")
        os._exit(3)
    init_rank(rank, 2, init_method)  # waits for rank 1, which never comes
    time.sleep(600)


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie runs nothing


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether ``pid`` has ended, or ends within ``within`` seconds.

    SIGKILL is delivered at once but carried out when the kernel next schedules the process: on a
    loaded machine a killed process can still read as running for a moment after ``killpg`` returned.
    """
    deadline = time.monotonic() + within
    while not _dead(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("how", ["raises", "exits"])
def test_a_rank_that_dies_at_once_fails_the_job_within_a_minute_and_no_rank_is_left(tmp_path, how):
    started = time.monotonic()
    with pytest.raises(RankFailed) as failed:
        spawn_ranks(_one_rank_dies_at_once, 2, (rendezvous(tmp_path), str(tmp_path), how), timeout=300)
    assert time.monotonic() - started < 60
    assert ("rank 1 broke before the rendezvous" if how == "raises" else "exit code 3") in str(failed.value)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("rank*.pid"))]
    assert len(pids) == 2 and all(_gone(pid) for pid in pids), pids


def test_a_rank_command_that_fails_ends_the_job_at_once_and_kills_the_others_with_their_children(tmp_path):
    marker = tmp_path / "sleeper.pid"
    sleeper = [sys.executable, "-c", "import os, subprocess, sys, time; "
               f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
               f"open({str(marker)!r}, 'w').write(str(child.pid)); time.sleep(600)"]
    failing = [sys.executable, "-c", "import sys, time; time.sleep(3); print('rank 1 gives up'); sys.exit(4)"]
    started = time.monotonic()
    with pytest.raises(RankFailed) as failed:
        run_rank_commands([sleeper, failing], timeout=300)
    assert time.monotonic() - started < 60
    assert "rank 1 exited with 4" in str(failed.value) and "rank 1 gives up" in str(failed.value)
    assert _gone(int(marker.read_text()))  # the grandchild too


def _all_reduce_rank(rank: int, world_size: int, init_method: str) -> float:
    import torch

    init_rank(rank, world_size, init_method)
    try:
        value = torch.tensor([float(rank + 1)])
        torch.distributed.all_reduce(value)
        torch.distributed.barrier()
        return float(value.item())
    finally:
        torch.distributed.destroy_process_group()


def _churn_ports(stop: multiprocessing.synchronize.Event) -> None:
    """Another process on the machine, taking whatever ephemeral port the kernel hands out, all the time."""
    while not stop.is_set():
        held = []
        for _ in range(50):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            held.append(sock)
        for sock in held:
            sock.close()


def _burn(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def test_several_jobs_meet_at_once_under_load_while_other_processes_bind_ports(tmp_path):
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    noise = [context.Process(target=_churn_ports, args=(stop,), daemon=True) for _ in range(2)]
    noise += [context.Process(target=_burn, args=(stop,), daemon=True)]
    for process in noise:
        process.start()
    outcomes: dict[int, object] = {}

    def job(number: int) -> None:
        try:
            outcomes[number] = spawn_ranks(_all_reduce_rank, 2, (2, rendezvous(tmp_path / f"job{number}")),
                                           timeout=400)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcomes[number] = exc

    try:
        jobs = [threading.Thread(target=job, args=(number,)) for number in range(3)]
        for thread in jobs:
            thread.start()
        for thread in jobs:
            thread.join(450)
    finally:
        stop.set()
        for process in noise:
            process.join(10)
            if process.is_alive():
                process.kill()
    assert outcomes == {0: [3.0, 3.0], 1: [3.0, 3.0], 2: [3.0, 3.0]}, outcomes
