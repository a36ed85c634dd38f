"""megatron-core's common-state loads run inside ``torch.serialization.safe_globals`` with a wider allowlist.

``weights_only`` stays on: only the types listed here (and whatever the process registered with
``torch.serialization.add_safe_globals``) may be rebuilt from a checkpoint, never an arbitrary callable.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)

#: megatron-core 0.19's ``megatron/core/safe_globals.py`` list beyond the builtins, as
#: ``(module, name)``: each one found in the installed release is allowed, so a checkpoint written by a
#: newer release loads on an older one.
MEGATRON_SAFE_TYPES = (
    ("megatron.core.enums", "ModelType"),
    ("megatron.core.optimizer", "OptimizerConfig"),
    ("megatron.core.rerun_state_machine", "RerunDiagnostic"),
    ("megatron.core.rerun_state_machine", "RerunMode"),
    ("megatron.core.rerun_state_machine", "RerunState"),
    ("megatron.core.transformer.enums", "AttnBackend"),
    ("megatron.core.transformer.enums", "CudaGraphModule"),
    ("megatron.core.transformer.enums", "CudaGraphScope"),
    ("megatron.core.transformer.enums", "InferenceCudaGraphScope"),
)

#: TransformerEngine's fused optimizers (verl's checkpoints hold ``FusedAdam``), when TE imports.
TRANSFORMER_ENGINE_OPTIMIZERS = (
    ("transformer_engine.pytorch.optimizers", "FusedAdam"),
    ("transformer_engine.pytorch.optimizers", "FusedSGD"),
)


def _builtin_safe_types() -> list[Any]:
    import argparse
    import io
    import pathlib
    import signal
    import types

    return [argparse.Namespace, types.SimpleNamespace, pathlib.PosixPath, io.BytesIO, signal.Signals,
            torch._C.Generator]


def _optional(names: tuple[tuple[str, str], ...]) -> list[Any]:
    found = []
    for module_name, name in names:
        try:
            found.append(getattr(importlib.import_module(module_name), name))
        except (ImportError, AttributeError):  # absent from this release or not installed: nothing to allow
            continue
        except Exception as exc:  # TransformerEngine can fail to import for reasons of its own (no CUDA)
            logger.debug("patchkit: %s.%s not allowlisted: %r", module_name, name, exc)
    return found


def _torch_optimizers() -> list[type]:
    return [value for value in vars(torch.optim).values()
            if inspect.isclass(value) and issubclass(value, torch.optim.Optimizer)]


@functools.lru_cache(maxsize=1)
def checkpoint_safe_globals() -> tuple[Any, ...]:
    """The types a megatron checkpoint may hold beyond what torch and megatron-core already allow."""
    return tuple(_builtin_safe_types() + _torch_optimizers() + _optional(MEGATRON_SAFE_TYPES)
                 + _optional(TRANSFORMER_ENGINE_OPTIMIZERS))


def wrap_load(original: Callable[..., Any]) -> Callable[..., Any]:
    """A ``TorchCommonLoadStrategy`` load method that runs inside ``safe_globals(checkpoint_safe_globals())``."""

    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        with torch.serialization.safe_globals(list(checkpoint_safe_globals())):
            return original(self, *args, **kwargs)

    return load
