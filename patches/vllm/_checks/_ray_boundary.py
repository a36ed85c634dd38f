"""vLLM's Ray executors run up to their first worker actor, with Ray answered at its API: the driver of the
``vllm.ray_worker_runtime_env`` and ``vllm.ray_store_port_window`` self-checks and their tests.

What stands in is Ray, and only for the block: the executor module's ``ray`` name answers the calls the
executor makes before and at its first ``ray.remote(...)`` (the node's id and address), and the actor's
creation raises :class:`ActorCreated` with what vLLM passed to Ray instead of starting a process; its
``PlacementGroupSchedulingStrategy`` is a plain record. For RayExecutorV2 the two helpers that set up and read
the Ray cluster (``initialize_ray_cluster``, ``get_bundles_sorted_by_node``) answer a placement group of one
bundle on another node than the driver's: what a node-spanning engine's worker meets. vLLM's executor code,
its port probes, its ``MessageQueue`` and torch's ``TCPStore`` run as they are. Every name is put back
afterwards, whether Ray is installed or not.
"""

from __future__ import annotations

import contextlib
import os
import socket
from datetime import timedelta
from types import ModuleType, SimpleNamespace
from typing import Any, Iterator
from urllib.parse import urlsplit

from patchkit.selfcheck import MissingDependency

from ._lost_port_race import LOOPBACK, close_queue

_ABSENT = object()
DRIVER_NODE = "driver-node"
WORKER_NODE = "worker-node"


class ActorCreated(Exception):
    """vLLM asked Ray for a worker actor: ``options`` are the actor's options, ``arguments`` its constructor's."""

    def __init__(self, options: dict[str, Any], arguments: dict[str, Any]) -> None:
        super().__init__("vLLM created a Ray worker actor")
        self.options = options
        self.arguments = arguments


class _ActorClass:
    """``ray.remote(cls)`` / ``ray.remote(**options)(cls)``: ``.options(...)`` adds options, ``.remote(...)``
    raises :class:`ActorCreated`."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options

    def options(self, **options: Any) -> _ActorClass:
        return _ActorClass({**self._options, **options})

    def remote(self, *args: Any, **arguments: Any) -> Any:
        raise ActorCreated(self._options, arguments)


class RayApi:
    """The ``ray`` calls vLLM's executors make up to their first worker actor, answered for a driver on
    :data:`DRIVER_NODE` at ``node_ip``."""

    def __init__(self, node_ip: str = LOOPBACK) -> None:
        self.util = SimpleNamespace(get_node_ip_address=lambda: node_ip)

    @staticmethod
    def get_runtime_context() -> Any:
        return SimpleNamespace(get_node_id=lambda: DRIVER_NODE)

    @staticmethod
    def remote(*args: Any, **options: Any) -> Any:
        if args and isinstance(args[0], type):
            return _ActorClass({})
        return lambda cls: _ActorClass(options)


def _strategy(**fields: Any) -> SimpleNamespace:
    return SimpleNamespace(**fields)


@contextlib.contextmanager
def names_in(module: ModuleType, **values: Any) -> Iterator[None]:
    """``module``'s names set to ``values`` for the block, then put back (or removed, if it had none)."""
    before = {name: module.__dict__.get(name, _ABSENT) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in before.items():
            if value is _ABSENT:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, value)


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """``os.environ`` with ``values`` set (None: unset) for the block."""
    before = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def require_ray() -> None:
    """Raise :class:`MissingDependency` when ``ray`` cannot be imported: vLLM's Ray executors cannot run
    (``ray_executor_v2.py`` does not even import) and the Ray patches change nothing."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise MissingDependency("Ray is not installed: vLLM's Ray executors cannot run in this process") from None


def v1_worker_options() -> dict[str, Any]:
    """The options ``RayDistributedExecutor._init_workers_ray`` (vLLM 0.24-0.32) gives Ray for its first worker
    actor, on a placement group of one bundle of this platform's device."""
    from vllm.config import ParallelConfig
    from vllm.platforms import current_platform
    from vllm.v1.executor import ray_executor

    executor = object.__new__(ray_executor.RayDistributedExecutor)
    executor.parallel_config = ParallelConfig()
    placement_group = SimpleNamespace(bundle_specs=[{current_platform.ray_device_key: 1}])
    with environment(VLLM_RAY_BUNDLE_INDICES=None), \
            names_in(ray_executor, ray=RayApi(), PlacementGroupSchedulingStrategy=_strategy):
        try:
            executor._init_workers_ray(placement_group)
        except ActorCreated as created:
            return created.options
    raise AssertionError("RayDistributedExecutor._init_workers_ray created no Ray actor")


def _port(address: str) -> int:
    port = urlsplit(address).port
    if port is None:
        raise ValueError(f"no port in {address!r}")
    return port


def free_port_base(span: int = 64) -> int:
    """A port the kernel chose, usable as ``VLLM_PORT``: free when asked, as are the ``span`` ports after it
    (checked by binding each; another process may still take one later)."""
    for _ in range(32):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            base = int(probe.getsockname()[1])
        if base + span < 65536 and all(_free(port) for port in range(base, base + span)):
            return base
    raise RuntimeError(f"no run of {span} free ports found")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def _store_binds(port: int) -> str | None:
    """None when torch's ``TCPStore`` binds ``port`` now as the rank-0 worker's would; else the error."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(LOOPBACK, port, world_size=1, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=10))
    except (RuntimeError, OSError) as error:
        return f"{type(error).__name__}: {error}"
    del store
    return None


def store_and_queue_ports(vllm_port: int) -> dict[str, Any]:
    """Run ``RayExecutorV2._init_executor`` with ``VLLM_PORT=vllm_port`` for an engine whose one worker is on
    another node than the driver, up to its first worker actor; on 0.29+ then the rank-0 worker's
    ``create_dist_init_method``. What happened, with the broadcast queue still holding its port:
    ``store_port`` (the TCPStore's), ``queue_port`` (the queue's TCP socket's), ``store_error`` (None when
    a TCPStore binds the store's port then, or the worker's own store holds it; else the error)."""
    from vllm.config import ParallelConfig
    from vllm.v1.executor import ray_executor_v2

    parallel = ParallelConfig()
    executor = object.__new__(ray_executor_v2.RayExecutorV2)
    executor.parallel_config = parallel
    executor.vllm_config = SimpleNamespace(parallel_config=parallel, instance_id="patchkit-check",
                                           weight_transfer_config=None)
    bundles = [(0, WORKER_NODE, LOOPBACK)]
    captured: ActorCreated | None = None
    with environment(VLLM_PORT=str(vllm_port), VLLM_RAY_BUNDLE_INDICES=None), \
            names_in(ray_executor_v2, ray=RayApi(), PlacementGroupSchedulingStrategy=_strategy,
                     initialize_ray_cluster=lambda *args, **kwargs: None,
                     get_bundles_sorted_by_node=lambda placement_group: bundles):
        try:
            executor._init_executor()
        except ActorCreated as created:
            captured = created
        finally:
            finalizer = getattr(executor, "_finalizer", None)
            if finalizer is not None:
                finalizer.detach()
        queue = getattr(executor, "rpc_broadcast_mq", None)
        try:
            if captured is None:
                raise AssertionError("RayExecutorV2._init_executor created no Ray actor")
            queue_port = _port(queue.handle.remote_subscribe_addr)
            init_method = captured.arguments.get("distributed_init_method")
            if init_method is not None:  # 0.24-0.28: the executor chose the port; the worker binds it later
                store_port = _port(init_method)
                store_error = _store_binds(store_port)
            else:  # 0.29+: the rank-0 worker binds its store and reports the address
                worker = object.__new__(ray_executor_v2.RayWorkerProc)
                worker._parallel_config = parallel
                store_port = _port(worker.create_dist_init_method())
                store_error = None if worker._dist_init_store.port == store_port else "the store moved"
                del worker._dist_init_store
        finally:
            if queue is not None:
                close_queue(queue)
    return {"store_port": store_port, "queue_port": queue_port, "store_error": store_error}
