"""megatron.tms_hook_mode: importing megatron-core keeps the process's torch_memory_saver hook mode.

Against the real torch_memory_saver (0.0.10 installs and imports on CPU; only initialising a saver
needs a GPU, so an initialised saver is the state ``_ensure_initialized`` leaves, made by hand).
The end-to-end tests import megatron-core's module for the first time in a fresh interpreter, in
the order a colocated SGLang/Megatron process does: the hook mode first, then megatron.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib.metadata import version

import pytest

pytest.importorskip("torch_memory_saver")

from patchkit.patches.megatron.memory._checks._tms_hook_mode_probe import (  # noqa: E402
    fresh_saver,
    hook_mode_statements,
    ld_preload,
    pending_hook_mode,
    run_statement,
)

import patchkit  # noqa: E402

PATCH = "megatron.tms_hook_mode"
DYNAMIC_CONTEXT = "megatron.core.inference.contexts.dynamic_context"


def _release() -> tuple[int, int]:
    major, minor = version("megatron-core").split(".")[:2]
    return int(major), int(minor)


FORCES_TORCH = _release() >= (0, 16)

IMPORT_AFTER_THE_MODE = textwrap.dedent('''
    import json, sys
    import patchkit
    from torch_memory_saver import torch_memory_saver
    from torch_memory_saver.entrypoint import TorchMemorySaver

    patchkit.apply_all()
    if sys.argv[1] == "initialised":  # the state _ensure_initialized leaves (a real one needs a GPU)
        torch_memory_saver._impl = type("Impl", (), {"_hook_mode": "preload"})()
        del torch_memory_saver._impl_ctor_kwargs
    else:
        torch_memory_saver.hook_mode = "preload"
    try:
        __import__(sys.argv[2])
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    pending = vars(torch_memory_saver).get("_impl_ctor_kwargs", {}).get("hook_mode")
    record = patchkit.status("megatron.tms_hook_mode")[0].to_dict()
    print(json.dumps({"error": error, "pending": pending, "state": record["state"], "reason": record["reason"],
                      "wrapped": TorchMemorySaver.__dict__["hook_mode"].fset.__module__}))
''')


def _import_in_fresh_interpreter(scenario: str, module: str, *env: str) -> dict[str, object]:
    import os

    environment = {**os.environ, "LD_PRELOAD": "", **dict(e.split("=", 1) for e in env)}
    done = subprocess.run([sys.executable, "-c", IMPORT_AFTER_THE_MODE, scenario, module], capture_output=True,
                          text=True, timeout=600, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_patch_is_native_before_016_and_installed_from_016() -> None:
    with patchkit.applied(PATCH) as (status,):
        record = status.to_dict()
    if FORCES_TORCH:
        assert record["state"] == "applied"
    else:
        assert (record["state"], record["reason"]) == ("skipped", "native")


def test_releases_from_016_set_the_hook_mode_at_import_and_earlier_ones_do_not() -> None:
    """What the patch is for, read from the installed files: the range the variants claim."""
    statements = hook_mode_statements()
    assert bool(statements.get(DYNAMIC_CONTEXT)) is FORCES_TORCH
    if _release() >= (0, 17):  # the wheel ships megatron/training from 0.17
        assert statements["megatron.training.training"]


def test_real_import_keeps_a_hook_mode_set_before_it() -> None:
    """SGLang / a preload worker chose preload; importing megatron-core leaves it (upstream: 'torch' from 0.16)."""
    found = _import_in_fresh_interpreter("preset", DYNAMIC_CONTEXT)
    assert found["error"] is None
    assert found["pending"] == "preload"
    assert found["state"] == ("applied" if FORCES_TORCH else "skipped")


@pytest.mark.skipif(not FORCES_TORCH, reason="megatron-core < 0.16 never touches the hook mode")
def test_real_import_after_the_saver_was_initialised_does_not_raise() -> None:
    """Upstream's assignment on an initialised saver raises AttributeError and fails megatron's import."""
    found = _import_in_fresh_interpreter("initialised", DYNAMIC_CONTEXT)
    assert found["error"] is None and found["state"] == "applied"


def test_native_import_before_016_leaves_the_hook_mode_alone() -> None:
    """0.14/0.15 without any patch: upstream's import leaves a preset mode and an initialised saver alone."""
    if FORCES_TORCH:
        pytest.skip("megatron-core 0.16+ sets the hook mode at import")
    for scenario, expected in (("preset", "preload"), ("initialised", None)):
        found = _import_in_fresh_interpreter(scenario, DYNAMIC_CONTEXT, f"PATCHKIT_DISABLE={PATCH}")
        assert (found["error"], found["pending"], found["state"]) == (None, expected, "skipped")


def _statements() -> list[tuple[str, object]]:
    return [(name, code) for name, codes in hook_mode_statements().items() for code in codes]


@pytest.fixture
def patched() -> None:
    if not FORCES_TORCH:
        pytest.skip("no import-time hook mode statement in megatron-core < 0.16")
    with patchkit.applied(PATCH):
        yield


@pytest.mark.usefixtures("patched")
def test_every_import_time_statement_keeps_a_preset_mode_and_an_initialised_saver() -> None:
    for module_name, code in _statements():
        with ld_preload(False):
            saver = fresh_saver()
            saver.hook_mode = "preload"
            run_statement(module_name, code, saver)
            assert pending_hook_mode(saver) == "preload", module_name
            initialised = fresh_saver(initialised_as="preload")
            run_statement(module_name, code, initialised)  # upstream: AttributeError
            assert initialised._impl._hook_mode == "preload"


@pytest.mark.usefixtures("patched")
@pytest.mark.parametrize("preloaded, expected", [
    (True, None),  # LD_PRELOAD of the preload library: torch_memory_saver's default (preload) kept
    (False, "torch"),  # Megatron's own offloading (no LD_PRELOAD, nobody chose) keeps needing the torch hook
], ids=["ld-preload-keeps-the-preload-default", "nothing-chosen-megatrons-torch-mode-still-applies"])
def test_megatrons_statement_without_a_chosen_mode(preloaded: bool, expected: str | None) -> None:
    for module_name, code in _statements():
        with ld_preload(preloaded):
            saver = fresh_saver()
            run_statement(module_name, code, saver)
        assert pending_hook_mode(saver) == expected, module_name


@pytest.mark.usefixtures("patched")
def test_assignments_outside_megatrons_import_go_through_unchanged() -> None:
    """A framework switching mode itself (AReaL sets 'preload' after megatron's import) is obeyed, and an
    assignment on an initialised saver still fails as torch_memory_saver makes it fail."""
    saver = fresh_saver()
    saver.hook_mode = "preload"
    saver.hook_mode = "torch"
    assert pending_hook_mode(saver) == "torch"
    with pytest.raises(AttributeError):
        fresh_saver(initialised_as="preload").hook_mode = "torch"
    # The same statement run as another module's import is not megatron's forcing one: it goes through.
    for _, code in _statements():
        saver = fresh_saver()
        saver.hook_mode = "preload"
        run_statement("megatron.core.inference.engines.dynamic_engine", code, saver)
        assert pending_hook_mode(saver) == "torch"


def test_revert_puts_torch_memory_savers_own_property_back() -> None:
    from torch_memory_saver.entrypoint import TorchMemorySaver

    original = TorchMemorySaver.__dict__["hook_mode"]
    with patchkit.applied(PATCH):
        during = TorchMemorySaver.__dict__["hook_mode"]
    assert TorchMemorySaver.__dict__["hook_mode"] is original
    assert (during is not original) is FORCES_TORCH
