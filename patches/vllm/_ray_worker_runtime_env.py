"""``RayDistributedExecutor._init_workers_ray`` (``vllm/v1/executor/ray_executor.py``, 0.24-0.32) given a
``runtime_env`` that names the engine's interpreter and carries Ray's uv switch to the worker actors.

vLLM builds every worker as ``ray.remote(num_cpus=0, ..., **ray_remote_kwargs)(RayWorkerWrapper)``, where
``ray_remote_kwargs`` is what ``_init_workers_ray`` received, its ``runtime_env`` completed by vLLM (device
variables, nsight). The engine's own call passes nothing. Here the call passes a ``runtime_env`` with
``py_executable`` (this interpreter) and the variables of :data:`WORKER_START_ENV_VARS` set in this process;
vLLM adds its entries to it, and entries a caller passed itself win.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, Callable, Mapping

logger = logging.getLogger(__name__)

#: Variables the worker actors need from their start, copied into ``runtime_env["env_vars"]`` when set here.
#: Ray reads ``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` when a worker starts tasks or actors of its own.
WORKER_START_ENV_VARS = ("RAY_ENABLE_UV_RUN_RUNTIME_ENV",)


def worker_runtime_env(given: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``given`` (a Ray ``runtime_env``, or None) with ``py_executable`` set to ``sys.executable`` and each of
    :data:`WORKER_START_ENV_VARS` set in ``environ`` (``os.environ`` by default) among its ``env_vars``;
    whatever ``given`` sets itself is kept. ``given`` is not modified."""
    environ = os.environ if environ is None else environ
    runtime_env = dict(given or {})
    runtime_env.setdefault("py_executable", sys.executable)
    carried = {name: environ[name] for name in WORKER_START_ENV_VARS if name in environ}
    if carried:
        env_vars = dict(runtime_env.get("env_vars") or {})
        for name, value in carried.items():
            env_vars.setdefault(name, value)
        runtime_env["env_vars"] = env_vars
    return runtime_env


def wrap_init_workers_ray(original: Callable[..., None]) -> Callable[..., None]:
    """``_init_workers_ray`` whose Ray actors start under :func:`worker_runtime_env`."""

    @functools.wraps(original)
    def _init_workers_ray(self: Any, placement_group: Any, **ray_remote_kwargs: Any) -> None:
        runtime_env = worker_runtime_env(ray_remote_kwargs.get("runtime_env"))
        logger.debug("patchkit: vLLM's Ray workers start with py_executable %s", runtime_env["py_executable"])
        return original(self, placement_group, **{**ray_remote_kwargs, "runtime_env": runtime_env})

    return _init_workers_ray
