"""torch_memory_saver's ``hook_mode`` setter, ignoring megatron-core's import-time ``"torch"``.

megatron-core 0.16-0.19 run, at module level::

    try:
        from torch_memory_saver import torch_memory_saver

        torch_memory_saver.hook_mode = "torch"
        HAVE_TORCH_MEMORY_SAVER = True
    except ImportError:
        HAVE_TORCH_MEMORY_SAVER = False

The wrapped setter recognises that statement by its caller (module-level code of one of the
modules below) and keeps the mode the process already has: one set before, the preload default
under a ``LD_PRELOAD`` naming torch_memory_saver's preload library, or the mode of a saver already
initialised (where upstream's assignment raises ``AttributeError`` and fails the import). With none
of these, megatron's ``"torch"`` applies, as upstream intends for its own offloading. Every other
assignment goes to the original setter unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)

#: The megatron-core modules that set the hook mode while they are imported.
MODULES_FORCING_TORCH_MODE = frozenset({
    "megatron.core.inference.contexts.dynamic_context",
    "megatron.training.training",
})

#: torch_memory_saver's preload library (``torch_memory_saver_hook_mode_preload*.so``).
PRELOAD_LIBRARY = "torch_memory_saver_hook_mode_preload"


def process_hook_mode(saver: Any) -> str | None:
    """The hook mode ``saver`` already has in this process, or None if nothing chose one yet."""
    pending = vars(saver).get("_impl_ctor_kwargs")
    if pending is None:  # initialised: _ensure_initialized deletes the pending keyword arguments
        return str(getattr(getattr(saver, "_impl", None), "_hook_mode", "initialised"))
    if "hook_mode" in pending:
        return str(pending["hook_mode"])
    if any(PRELOAD_LIBRARY in path for path in os.environ.get("LD_PRELOAD", "").split(":")):
        return "preload"
    return None


def _is_megatron_import(frame: Any) -> bool:
    return frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in MODULES_FORCING_TORCH_MODE


def wrap_hook_mode(original: property) -> property:
    """``TorchMemorySaver.hook_mode`` with a setter that lets megatron-core's import keep the process's mode."""
    setter = original.fset
    if setter is None:
        raise TypeError("TorchMemorySaver.hook_mode has no setter to wrap")

    def set_hook_mode(saver: Any, hook_mode: Any) -> None:
        # Frame 1 is whoever wrote `saver.hook_mode = ...` (the property's __set__ is C code).
        caller = sys._getframe(1)
        if _is_megatron_import(caller):
            kept = process_hook_mode(saver)
            if kept is not None:
                logger.info("patchkit: %s sets torch_memory_saver.hook_mode=%r at import; keeping the "
                            "process's %r", caller.f_globals["__name__"], hook_mode, kept)
                return
        setter(saver, hook_mode)

    return property(original.fget, set_hook_mode, original.fdel, original.__doc__)
