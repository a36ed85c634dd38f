"""``vllm.ray_worker_runtime_env`` and ``vllm.ray_store_port_window``: vLLM's own Ray executors, run up to their
first worker actor with Ray answered at its API (``patches/vllm/_checks/_ray_boundary.py``).

Ray is not installed in the test environments, and ``ray_executor_v2.py`` does not import without it, so each
probe runs in a fresh interpreter that first installs ``ray_stand_in`` (inert names for vLLM's imports of
Ray, nothing else) and then applies the patch under test, or nothing: vLLM as released. Everything vLLM does
up to the actor's creation runs: its runtime environment, its port probes, its ``MessageQueue`` and, for the
store, torch's ``TCPStore``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

VLLM = Version(version("vllm"))
RUNTIME_ENV = "vllm.ray_worker_runtime_env"
STORE_PORT = "vllm.ray_store_port_window"
HERE = Path(__file__).parent
has_v1_executor = pytest.mark.skipif(VLLM >= Version("0.33"), reason="vLLM 0.33 removed the v1 Ray executor")
probes_the_store_port = pytest.mark.skipif(VLLM >= Version("0.29"), reason="the worker binds port 0 from 0.29")


def _probe(probe: str, *patch_ids: str, **environ: str) -> dict:
    env = {**os.environ, "PATCHKIT_AUTOLOAD": "0", "VLLM_TARGET_DEVICE": "cpu", **environ}
    env.pop("VLLM_PORT", None)
    done = subprocess.run([sys.executable, str(HERE / "ray_executor_probe.py"), probe, *patch_ids], cwd=HERE,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@has_v1_executor
def test_vllm_alone_starts_its_ray_workers_without_an_interpreter_or_rays_uv_switch():
    """Upstream: the failure the runtime-env patch exists for (Ray picks the workers' interpreter)."""
    seen = _probe("worker-options", RAY_ENABLE_UV_RUN_RUNTIME_ENV="1")
    assert "py_executable" not in seen["runtime_env"], seen
    assert "RAY_ENABLE_UV_RUN_RUNTIME_ENV" not in seen["runtime_env"].get("env_vars", {}), seen


@has_v1_executor
def test_ray_workers_start_under_the_engines_interpreter_with_rays_uv_switch():
    seen = _probe("worker-options", RUNTIME_ENV, RAY_ENABLE_UV_RUN_RUNTIME_ENV="1")
    assert seen["records"][RUNTIME_ENV]["variant"] == "worker-runtime-env", seen["records"]
    assert seen["runtime_env"]["py_executable"] == seen["python"], seen
    assert seen["runtime_env"]["env_vars"]["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "1", seen


@has_v1_executor
def test_ray_workers_get_no_uv_switch_the_engine_does_not_have():
    seen = _probe("worker-options", RUNTIME_ENV)
    assert seen["runtime_env"]["py_executable"] == seen["python"], seen
    assert "RAY_ENABLE_UV_RUN_RUNTIME_ENV" not in seen["runtime_env"].get("env_vars", {}), seen


@pytest.mark.skipif(VLLM < Version("0.33"), reason="the v1 Ray executor exists up to 0.32")
def test_native_on_0_33_where_vllm_has_no_v1_ray_executor():
    from importlib.util import find_spec

    import patchkit

    assert find_spec("vllm.v1.executor.ray_executor") is None
    with patchkit.applied(RUNTIME_ENV) as (record,):
        assert record.reason.value == "native", record.to_dict()


@probes_the_store_port
def test_vllm_alone_gives_the_tcpstore_the_port_its_broadcast_queue_then_binds():
    """Upstream: the store's probed port is the queue's, and the rank-0 worker's store cannot bind it."""
    seen = _probe("ports")
    assert seen["store_port"] == seen["queue_port"], seen
    assert "EADDRINUSE" in seen["store_error"], seen


@probes_the_store_port
def test_the_tcpstore_port_is_searched_past_the_queues_and_binds():
    seen = _probe("ports", STORE_PORT)
    assert seen["records"][STORE_PORT]["state"] == "applied", seen["records"]
    assert seen["store_port"] != seen["queue_port"], seen
    assert seen["store_error"] is None, seen


@pytest.mark.skipif(VLLM < Version("0.29"), reason="vLLM 0.24-0.28 probe the store's port in the executor")
def test_native_from_0_29_the_worker_binds_its_store_on_a_port_of_its_own():
    seen = _probe("ports", STORE_PORT)
    assert seen["records"][STORE_PORT]["reason"] == "native", seen["records"]
    assert seen["store_port"] != seen["queue_port"], seen
    assert seen["store_error"] is None, seen


def test_the_window_comes_before_vllms_data_parallel_window_for_engines_that_are_not_data_parallel(monkeypatch):
    """0.25-0.28's order (run there by the executor's ``_select_tcpstore_port``): an engine without a data-parallel
    master port (NeMo-RL's every engine: rank 0, master port 0) searches the window first; a data-parallel one keeps
    vLLM's per-rank windows first unless ``PATCHKIT_RAY_STORE_PORT_WINDOW=always``."""
    from patchkit.patches.vllm._ray_store_port_window import window_before_vllms_dp_window

    monkeypatch.delenv("PATCHKIT_RAY_STORE_PORT_WINDOW", raising=False)
    assert window_before_vllms_dp_window(None, 0) and window_before_vllms_dp_window(0, 0)
    assert not window_before_vllms_dp_window(1, 29500)
    monkeypatch.setenv("PATCHKIT_RAY_STORE_PORT_WINDOW", "always")
    assert window_before_vllms_dp_window(1, 29500)
    monkeypatch.setenv("PATCHKIT_RAY_STORE_PORT_WINDOW", "sometimes")
    assert not window_before_vllms_dp_window(1, 29500)


def test_the_self_checks_verify_both_patches_on_vllms_own_executors():
    """``patchkit doctor`` in a process where Ray's names import: each check runs vLLM's executor code."""
    verdicts = _probe("doctor", RUNTIME_ENV, STORE_PORT)
    assert verdicts == {RUNTIME_ENV: ["verified", verdicts[RUNTIME_ENV][1]],
                        STORE_PORT: ["verified", verdicts[STORE_PORT][1]]}, verdicts


@has_v1_executor
@pytest.mark.breaks("vllm.ray_worker_runtime_env")
def test_the_runtime_env_check_fails_with_vllms_own_worker_start():
    (verdict, message) = _probe("doctor-upstream", RUNTIME_ENV)[RUNTIME_ENV]
    assert verdict == "failed" and "expected" in message and "found" in message, message


@probes_the_store_port
@pytest.mark.breaks("vllm.ray_store_port_window")
def test_the_store_port_check_fails_with_vllms_own_port_search():
    (verdict, message) = _probe("doctor-upstream", STORE_PORT)[STORE_PORT]
    assert verdict == "failed" and "expected" in message and "found" in message, message
