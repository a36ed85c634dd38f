"""Starting the ranks of a multi-process test: no port picked ahead, every wait bounded, no orphan.

Every multi-process test in ``tests/`` starts its ranks here, so three rules hold everywhere:

* **No port is picked and bound later.** Ranks meet through a file store in the test's own temporary
  folder (:func:`rendezvous`, a ``file://`` init method): nothing to race for, however many jobs run
  at once. A port chosen by binding port 0, closed, and bound again by a rank moments later can be
  taken in between by any other process (``EADDRINUSE``).
* **Every wait is bounded.** :func:`init_rank` gives the process group a timeout (a rank whose peer
  is gone fails in :data:`GROUP_TIMEOUT`, not torch's 30 minutes); :func:`spawn_ranks` and
  :func:`run_rank_commands` give the whole job a deadline.
* **A failed rank fails the test at once, and no rank outlives it.** The parent watches every rank:
  the first that raises or exits non-zero ends the job, the others are killed (their process groups,
  for command-line jobs that start children of their own: torchrun), and the test fails with that
  rank's traceback or output. Nothing is left for pytest to wait on after its summary.

:func:`spawn_ranks` runs ``function(rank, *args)`` in fresh interpreters (the ``spawn`` start method:
forking a process that has started gloo or torch threads is unsafe) and returns each rank's return
value, in rank order.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: How long a rank waits for its peers in one collective or at start-up (torch's default: 30 minutes).
#: Only a backstop: the parent ends the job as soon as a rank dies. Generous, because a peer may be
#: building its model on a machine loaded many times over while this one waits in a collective.
GROUP_TIMEOUT = datetime.timedelta(seconds=300)
#: Default deadline of a whole job.
JOB_TIMEOUT = 600.0


def rendezvous(folder: str | os.PathLike[str] | None = None) -> str:
    """A fresh ``file://`` init method in ``folder`` (a new temporary folder when None)."""
    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="rendezvous-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="store-", dir=folder)) / "store"
    return f"file://{path.resolve()}"


def init_rank(rank: int, world_size: int, init_method: str, backend: str = "gloo",
              timeout: datetime.timedelta = GROUP_TIMEOUT) -> None:
    """``torch.distributed.init_process_group`` through ``init_method``, with a bounded timeout."""
    import torch

    torch.distributed.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                         timeout=timeout)


def single_process_group(backend: str = "gloo") -> None:
    """A process group of one rank on an in-memory store: no port, no file."""
    import torch

    torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1,
                                         timeout=GROUP_TIMEOUT)


class RankFailed(AssertionError):
    """A rank raised, exited non-zero, or the job ran past its deadline (its peers were killed)."""


def _rank_main(function: Callable[..., Any], rank: int, args: tuple[Any, ...], results: Any) -> None:
    try:
        value = function(rank, *args)
    except BaseException:  # noqa: BLE001 - every failure is the parent's to report
        results.put((rank, False, traceback.format_exc()[-6000:]))
        raise SystemExit(1) from None
    results.put((rank, True, value))


def spawn_ranks(function: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
                timeout: float = JOB_TIMEOUT) -> list[Any]:
    """Run ``function(rank, *args)`` in ``world_size`` spawned processes; their return values by rank.

    ``function`` must be importable by name (a module-level function) and its return value picklable.
    Raises :class:`RankFailed` as soon as a rank raises or dies, or at ``timeout`` seconds, after
    killing every rank still running.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_rank_main, args=(function, rank, tuple(args), results), name=f"rank{rank}")
                 for rank in range(world_size)]
    values: dict[int, Any] = {}
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + timeout
        while len(values) < world_size:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = _dead_before_reporting(processes, values)
                if dead is not None:
                    _raise_reported_failure(results, world_size)  # its traceback, if it sent one in time
                    raise RankFailed(f"{dead.name} died with exit code {dead.exitcode} before reporting") from None
                if time.monotonic() > deadline:
                    waiting = [p.name for rank, p in enumerate(processes) if rank not in values]
                    raise RankFailed(f"the job ran past its {timeout:g} s deadline; still waiting for "
                                     f"{', '.join(waiting)}") from None
                continue
            if not ok:
                raise RankFailed(f"rank {rank} of {world_size} failed:\n{value}")
            values[rank] = value
        for process in processes:
            process.join(max(1.0, deadline - time.monotonic()))
            if process.exitcode != 0:
                raise RankFailed(f"{process.name} returned its result, then exited with {process.exitcode}")
    finally:
        _end(processes)
        results.close()
        results.cancel_join_thread()
    return [values[rank] for rank in range(world_size)]


def _dead_before_reporting(processes: list[Any], values: dict[int, Any]) -> Any:
    """The first rank that exited without sending its result, or None."""
    for rank, process in enumerate(processes):
        if rank not in values and process.exitcode is not None:
            return process
    return None


def _raise_reported_failure(results: Any, world_size: int) -> None:
    """Raise the failure a rank sent just before it exited, if it arrives within a second."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            rank, ok, value = results.get(timeout=0.2)
        except queue.Empty:
            continue
        if not ok:
            raise RankFailed(f"rank {rank} of {world_size} failed:\n{value}")


def _end(processes: list[Any]) -> None:
    """Every rank still running is terminated, then killed; all are reaped."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)


def run_rank_commands(commands: Sequence[Sequence[str]], timeout: float = JOB_TIMEOUT,
                      **popen: Any) -> list[str]:
    """Run one command line per rank (each in its own session); their combined output, by rank.

    Raises :class:`RankFailed` as soon as one exits non-zero, or at ``timeout`` seconds, after killing
    every command still running together with whatever it started.
    """
    logs = [tempfile.TemporaryFile() for _ in commands]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for command, log in zip(commands, logs, strict=True):
            processes.append(subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True, **popen))
        deadline = time.monotonic() + timeout
        while None in [p.poll() for p in processes]:  # every one polled: any() would stop at the first
            failed = [r for r, p in enumerate(processes) if p.returncode not in (None, 0)]
            if failed:
                rank = failed[0]
                raise RankFailed(f"rank {rank} exited with {processes[rank].returncode}:\n{_read(logs[rank])}")
            if time.monotonic() > deadline:
                raise RankFailed(f"the job ran past its {timeout:g} s deadline:\n"
                                 + "\n".join(f"--- rank {r} ---\n{_read(log)}" for r, log in enumerate(logs)))
            time.sleep(0.2)
        outputs = [_read(log) for log in logs]
        for rank, process in enumerate(processes):
            if process.returncode != 0:
                raise RankFailed(f"rank {rank} exited with {process.returncode}:\n{outputs[rank]}")
        return outputs
    finally:
        for process in processes:
            kill_session(process)
        for log in logs:
            log.close()


def kill_session(process: subprocess.Popen[Any]) -> None:
    """Kill ``process`` and everything in its session (started with ``start_new_session=True``); reap it."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            process.kill()
    else:
        try:  # the leader is gone, children it left may not be
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
    process.wait(10)


def _read(log: Any) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode("utf-8", errors="replace")[-8000:]
