"""A minimal ``transformer_engine`` import stub so that Megatron-Bridge imports without TransformerEngine.

Why: Megatron-Bridge imports ``transformer_engine.pytorch`` at module level in ``peft/lora.py`` and
``peft/lora_layers.py`` (reached from ``import megatron.bridge``), where it subclasses ``te.Linear``
and names ``te.ops.Sequential`` in annotations. TransformerEngine cannot be installed on a machine
without CUDA. None of the code under test (parameter-name mapping, parallelism detection, layer
specs built from local Megatron modules) runs any TransformerEngine code.

What it provides: the modules ``transformer_engine``, ``transformer_engine.pytorch`` and
``transformer_engine.pytorch.ops`` with empty ``torch.nn.Module`` subclasses ``Linear``,
``LayerNormLinear``, ``ops.Sequential``, and ``__version__ = "0.0.0"`` so that version probes
(``is_te_min_version``) answer "too old" and TE-only features stay off.

Scope: :func:`bridge_import_context` puts the stub in ``sys.modules`` only while Megatron-Bridge is
first imported, after importing the megatron-core modules the tests use (so megatron-core's own
``HAVE_TE`` probes keep seeing no TransformerEngine), and removes it afterwards.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from typing import Iterator

import torch

#: megatron-core modules imported before the stub exists, so their TE probes see the truth.
MEGATRON_CORE_FIRST = (
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.post_training.modelopt.gpt.model_specs",
    "megatron.core.extensions.transformer_engine",
    "megatron.core.transformer.moe.experts",
    "megatron.core.utils",
)


def _stub_modules() -> dict[str, types.ModuleType]:
    te = types.ModuleType("transformer_engine")
    te.__path__ = []  # a package, so submodule imports resolve through sys.modules
    te.__version__ = "0.0.0"
    pytorch = types.ModuleType("transformer_engine.pytorch")
    pytorch.__path__ = []
    ops = types.ModuleType("transformer_engine.pytorch.ops")
    pytorch.Linear = type("Linear", (torch.nn.Module,), {"__module__": pytorch.__name__})
    pytorch.LayerNormLinear = type("LayerNormLinear", (torch.nn.Module,), {"__module__": pytorch.__name__})
    ops.Sequential = type("Sequential", (torch.nn.Module,), {"__module__": ops.__name__})
    pytorch.ops = ops
    te.pytorch = pytorch
    return {module.__name__: module for module in (te, pytorch, ops)}


@contextlib.contextmanager
def bridge_import_context() -> Iterator[None]:
    """Import megatron-core first, then let ``import megatron.bridge...`` succeed, then remove the stub."""
    if "transformer_engine" in sys.modules and not hasattr(sys.modules["transformer_engine"], "__file__"):
        yield  # already stubbed by an outer context
        return
    for name in MEGATRON_CORE_FIRST:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    real = {name: sys.modules.get(name) for name in _stub_modules()}
    if any(module is not None for module in real.values()):
        yield  # a real TransformerEngine is installed: use it
        return
    sys.modules.update(_stub_modules())
    try:
        yield
    finally:
        for name in real:
            sys.modules.pop(name, None)
