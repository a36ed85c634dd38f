"""vLLM's Ray executor starting its workers under the engine's own interpreter, with Ray's uv switch.

Declaration only (see docs/writing-patches.md). ``RayDistributedExecutor._init_workers_ray``
(``vllm/v1/executor/ray_executor.py``, the executor ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`` selects) creates
one Ray actor per worker with a ``runtime_env`` that carries only vLLM's own entries (the device variables
Ray must not set, nsight when asked). A Ray actor started without ``py_executable`` runs the interpreter
Ray's job or its parent gives it, not necessarily the one the engine runs in: a trainer whose vLLM lives in
its own virtual environment gets workers that cannot import vLLM (or import another one). Ray's
``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` switch reaches the workers only after they started, with vLLM's copy of the
driver's variables.

The patch passes the workers a ``runtime_env`` naming this process's interpreter (``sys.executable``) as
``py_executable`` and, when it is set here, ``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` among its ``env_vars``, under
what vLLM adds. A ``runtime_env`` the caller passes keeps its own entries.

RayExecutorV2, vLLM's default Ray executor from 0.24 and its only one in 0.33, is left as it is: its workers
inherit the engine actor's ``py_executable`` from Ray and receive every driver variable
(``get_driver_env_vars``). 0.33 has no ``ray_executor.py`` at all.

Ranges: the runtime environment without ``py_executable`` read in ``ray_executor.py`` of 0.24.0, 0.25.0,
0.25.1, 0.26.0, 0.27.0, 0.28.0, 0.29.0, 0.30.0, 0.31.0 and 0.32.0, tested on 0.24.0 and 0.29.0; the file is
absent from 0.33.0 (tested there).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

RAY_EXECUTOR = "vllm.v1.executor.ray_executor"

PATCHES = (
    Patch(
        id="vllm.ray_worker_runtime_env",
        self_check="._checks.ray_worker_runtime_env:check_ray_worker_runtime_env",
        summary=(
            "vLLM's Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) starts its worker actors under the "
            "engine's interpreter (runtime_env py_executable = sys.executable) with RAY_ENABLE_UV_RUN_RUNTIME_ENV "
            "in their env_vars."
        ),
        why=(
            "RayDistributedExecutor._init_workers_ray gives its actors no py_executable: a trainer whose vLLM "
            "lives in another virtual environment than Ray's job gets workers on the wrong interpreter."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/executor/ray_executor.py",
        removal="Drop with vLLM 0.32: 0.33 removed the v1 Ray executor (RayExecutorV2 needs nothing).",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.33"},
                installs=(
                    Wrap(f"{RAY_EXECUTOR}:RayDistributedExecutor._init_workers_ray",
                         "._ray_worker_runtime_env:wrap_init_workers_ray"),
                ),
                label="worker-runtime-env",
            ),
            Variant(
                requires={"vllm": ">=0.33,<0.34"},
                native=(
                    "vLLM 0.33 has no v1 Ray executor; RayExecutorV2's workers inherit the engine actor's "
                    "py_executable from Ray and receive every driver variable"
                ),
            ),
        ),
    ),
)
