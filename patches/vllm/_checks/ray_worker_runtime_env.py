"""Self-check of ``vllm.ray_worker_runtime_env``: the options vLLM's v1 Ray executor gives Ray for a worker actor
(0.24-0.32) name this interpreter as ``py_executable`` and carry ``RAY_ENABLE_UV_RUN_RUNTIME_ENV``; on 0.33,
where that executor is gone, RayExecutorV2 hands its workers every driver variable."""

from __future__ import annotations

import sys

from patchkit.selfcheck import CheckContext, expect

from ._ray_boundary import environment, require_ray, v1_worker_options

#: The value the check gives Ray's uv switch, to find it in the workers' environment.
SWITCH = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"


def check_ray_worker_runtime_env(context: CheckContext) -> None:
    """Worker actors of the v1 Ray executor start under this interpreter with Ray's uv switch; on 0.33 the
    switch reaches RayExecutorV2's workers with the driver's variables."""
    if not context.native:
        require_ray()
    with environment(**{SWITCH: "1"}):
        if context.native:
            from vllm.v1.executor.ray_env_utils import get_driver_env_vars

            forwarded = get_driver_env_vars(worker_specific_vars=set())
            expect(forwarded.get(SWITCH) == "1", f"RayExecutorV2's driver variables carry {SWITCH}", "1",
                   forwarded.get(SWITCH))
            return
        runtime_env = v1_worker_options().get("runtime_env") or {}
    expect(runtime_env.get("py_executable") == sys.executable,
           "the runtime_env of vLLM's Ray worker actors names this interpreter", sys.executable,
           runtime_env.get("py_executable"))
    env_vars = runtime_env.get("env_vars") or {}
    expect(env_vars.get(SWITCH) == "1", f"the workers' runtime_env env_vars carry {SWITCH}", "1",
           env_vars.get(SWITCH))
