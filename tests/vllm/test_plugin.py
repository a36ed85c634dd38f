"""patchkit's ``vllm.general_plugins`` entry point, in fresh processes as vLLM starts them.

Each test runs vLLM's own ``load_general_plugins()`` in a new interpreter (the entry point comes
from this package's installed metadata) and reads ``patchkit.runtime.status`` there. Importing vLLM
imports torch, so each process costs seconds: the scenarios are kept to the ones that differ.
"""

from __future__ import annotations

import textwrap

import pytest
from fresh_process import last_printed

pytest.importorskip("vllm")

PATCH = "vllm.nvfp4_refit"


def run_vllm_process(body: str, **env: str) -> dict:
    """Run ``load_general_plugins()`` then ``body`` in a fresh process; return what it prints last."""
    script = textwrap.dedent(
        """
        import json, sys
        from vllm.plugins import load_general_plugins
        import patchkit
        result = {}
        """
    ) + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
    return last_printed(script, without=("PATCHKIT_", "VLLM_PLUGINS"), timeout=300, VLLM_TARGET_DEVICE="cpu", **env)


STATE = f"""
load_general_plugins()
record = patchkit.status({PATCH!r})[0]
result["state"], result["reason"] = record.state.value, record.reason and record.reason.value
"""


def test_vllm_plugin_loading_applies_patchkit() -> None:
    # The targets are not imported yet: the patch waits for them (it was asked for).
    assert run_vllm_process(STATE) == {"state": "pending", "reason": None}


def test_vllm_plugins_without_patchkit_skips_it() -> None:
    assert run_vllm_process(STATE, VLLM_PLUGINS="some_other_plugin") == {"state": "registered", "reason": None}


def test_patchkit_disable_is_honoured_in_vllm_processes() -> None:
    assert run_vllm_process(STATE, PATCHKIT_DISABLE=PATCH) == {"state": "skipped", "reason": "disabled"}


def test_loading_twice_installs_once() -> None:
    body = f"""
    from patchkit.patches import entry_points
    load_general_plugins()
    entry_points.vllm()
    entry_points.vllm()
    from vllm.model_executor.layers.quantization import modelopt
    entry_points.vllm()
    method = modelopt.ModelOptNvFp4FusedMoE.process_weights_after_loading  # in every variant
    depth = 0
    while hasattr(method, "__wrapped__"):
        method, depth = method.__wrapped__, depth + 1
    result["state"] = patchkit.status({PATCH!r})[0].state.value
    result["wraps"] = depth
    """
    assert run_vllm_process(body) == {"state": "applied", "wraps": 1}


def test_bad_toggle_does_not_stop_vllm_unless_strict() -> None:
    # A malformed PATCHKIT_DISABLE: patchkit applies nothing and says why; vLLM carries on.
    assert run_vllm_process(STATE, PATCHKIT_DISABLE="vllm..refit") == {"state": "skipped", "reason": "config_error"}
    failed = run_vllm_process(STATE, PATCHKIT_DISABLE="vllm..refit", PATCHKIT_STRICT="1")
    assert failed["returncode"] != 0 and "PATCHKIT_DISABLE" in failed["stderr"]
