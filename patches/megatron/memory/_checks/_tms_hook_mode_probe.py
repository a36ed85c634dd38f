"""Run megatron-core's import-time torch_memory_saver statement against a saver of the check's choosing.

Shared by the ``megatron.tms_hook_mode`` self-check and its tests. The statement is read from the
installed module's file and executed as module-level code under the module's own name, so it is
upstream's code running exactly as it does during ``import``, without importing the module again
(which would redefine its classes in the process). The saver is a fresh ``TorchMemorySaver``, put
in place of the process-wide singleton only while the statement runs.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._tms_hook_mode import MODULES_FORCING_TORCH_MODE, PRELOAD_LIBRARY


def installed_source(module_name: str) -> tuple[str, str] | None:
    """(file, source) of ``module_name`` as installed, or None if absent. Found from the top-level
    package's location, so no package on the way is imported (``megatron.training`` imports much)."""
    top, _, rest = module_name.partition(".")
    spec = importlib.util.find_spec(top)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location, *rest.split(".")).with_suffix(".py")
        if path.is_file():
            return str(path), path.read_text(encoding="utf-8")
    return None


def _sets_hook_mode(node: ast.stmt) -> bool:
    return any(isinstance(target, ast.Attribute) and target.attr == "hook_mode"
               for sub in ast.walk(node) if isinstance(sub, ast.Assign) for target in sub.targets)


def hook_mode_statements() -> dict[str, Any]:
    """Per module of :data:`MODULES_FORCING_TORCH_MODE` installed here: its compiled top-level
    statements that assign ``hook_mode`` (an empty list where the release has none)."""
    found: dict[str, Any] = {}
    for module_name in sorted(MODULES_FORCING_TORCH_MODE):
        located = installed_source(module_name)
        if located is None:
            continue
        path, source = located
        nodes = [node for node in ast.parse(source, path).body if _sets_hook_mode(node)]
        found[module_name] = [compile(ast.Module(body=[node], type_ignores=[]), path, "exec") for node in nodes]
    return found


def fresh_saver(initialised_as: str | None = None) -> Any:
    """A new ``TorchMemorySaver``; with ``initialised_as``, in the state ``_ensure_initialized`` leaves
    (its pending arguments deleted, an implementation of that hook mode), without touching a GPU."""
    import types

    from torch_memory_saver.entrypoint import TorchMemorySaver

    saver = TorchMemorySaver()
    if initialised_as is not None:
        saver._impl = types.SimpleNamespace(_hook_mode=initialised_as)
        del saver._impl_ctor_kwargs
    return saver


def pending_hook_mode(saver: Any) -> str | None:
    """The hook mode ``saver`` will be initialised with if set explicitly, else None (preload default)."""
    pending = vars(saver).get("_impl_ctor_kwargs") or {}
    mode = pending.get("hook_mode")
    return None if mode is None else str(mode)


@contextlib.contextmanager
def ld_preload(with_preload_library: bool) -> Iterator[None]:
    """``LD_PRELOAD`` naming torch_memory_saver's preload library, or without it, for the block."""
    before = os.environ.get("LD_PRELOAD")
    os.environ["LD_PRELOAD"] = f"/opt/tms/{PRELOAD_LIBRARY}.abi3.so" if with_preload_library else ""
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before


def run_statement(module_name: str, code: Any, saver: Any) -> None:
    """Execute one import-time statement of ``module_name`` with ``saver`` as the process's saver."""
    import torch_memory_saver as package

    singleton = package.torch_memory_saver
    package.torch_memory_saver = saver
    try:
        exec(code, {"__name__": module_name, "__builtins__": __builtins__})
    finally:
        package.torch_memory_saver = singleton
