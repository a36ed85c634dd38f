"""ModelOpt's ``QuantModuleRegistry`` once its vLLM plugin is imported, asked the questions ``mtq.quantize`` asks.

Shared by the self-check of ``modelopt.vllm_plugin_class_keys`` and its tests. Imports
``modelopt.torch.quantization`` (which imports the vLLM plugin when vLLM is installed) and vLLM's linear
layers; builds nothing on a device.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

PLUGIN = "modelopt.torch.quantization.plugins.vllm"


def _name(key: Any) -> str:
    return f"{getattr(key, '__module__', '?')}.{getattr(key, '__qualname__', key)}"


def _answer(question: Any) -> Any:
    """``question()``, or the text of the ``TypeError`` it raised."""
    try:
        return question()
    except TypeError as error:
        return f"TypeError: {error}"


def registry_state() -> dict[str, Any]:
    """What the registry answers: ``plugin`` (ModelOpt's vLLM plugin imported), ``non_class_keys`` (their
    names), ``unregistered`` (``torch.nn.ReLU in QuantModuleRegistry``: False, or the error),
    ``row_parallel`` (vLLM's ``RowParallelLinear`` registered) and ``quantize`` (``mtq.quantize`` of a
    ``Linear`` + ``ReLU`` model with INT8 calibration: "quantized", or the error)."""
    import modelopt.torch.quantization as mtq
    import torch
    from modelopt.torch.quantization.nn import QuantModuleRegistry
    from vllm.model_executor.layers.linear import RowParallelLinear

    registry: Any = QuantModuleRegistry

    def quantize() -> str:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
        mtq.quantize(model, mtq.INT8_DEFAULT_CFG, lambda m: m(torch.ones(2, 4)))
        return "quantized"

    return {
        "plugin": PLUGIN in sys.modules,
        "non_class_keys": [_name(key) for key in registry._registry if not inspect.isclass(key)],
        "unregistered": _answer(lambda: torch.nn.ReLU in registry),
        "row_parallel": _answer(lambda: RowParallelLinear in registry),
        "quantize": _answer(quantize),
    }
