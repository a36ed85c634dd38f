"""Undo a partial or complete ``mtq.quantize`` on a model, so QAT is all or nothing across chunks.

ModelOpt has no "unquantize". What it does to a model is structural: it swaps each converted
module's class (``module.__class__``), adds ``TensorQuantizer`` children and buffers, instance
attributes (``_dm_attribute_manager``, ``_parallel_state``...), state-dict hooks, and the root's
``_modelopt_state``. All of that lives in the modules' ``__dict__`` and class, so a snapshot of
every module's class and a shallow copy of its ``__dict__`` (with the containers in it copied, as
ModelOpt mutates ``_modules``/``_buffers``/hook dicts in place) restores the model exactly. Parameter
tensors are shared, not copied: weight-only calibration reads weights and never writes them, which
:meth:`ModuleSnapshot.restore` verifies through the tensors' version counters.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a module ``__dict__`` whose dicts, lists and sets are new containers (same contents)."""
    return {key: type(value)(value) if isinstance(value, (dict, list, set)) else value for key, value in state.items()}


class ModuleSnapshot:
    """Class and ``__dict__`` of every module under a root, restorable after ModelOpt changed them."""

    def __init__(self, root: nn.Module) -> None:
        self._entries = [(module, module.__class__, _copy_state(module.__dict__)) for module in root.modules()]
        self._versions = {id(p): (p, p._version) for p in root.parameters()}

    def restore(self) -> list[str]:
        """Put every module back; returns the names of parameters written in place meanwhile (normally none)."""
        for module, cls, state in self._entries:
            if module.__class__ is not cls:
                module.__class__ = cls
            module.__dict__.clear()
            module.__dict__.update(_copy_state(state))
        changed = [str(tuple(p.shape)) for p, version in self._versions.values() if p._version != version]
        if changed:
            logger.warning("patchkit: QAT rollback: %d parameter(s) were written in place and keep their new values",
                           len(changed))
        return changed
