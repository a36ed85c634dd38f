"""Tell "ModelOpt's Megatron plugin did not load" apart from "the model has no linear layer".

ModelOpt registers Megatron's parallel linears for quantization in
``modelopt.torch.quantization.plugins.megatron``, imported inside ``import_plugin("megatron")``,
which swallows any error. ModelOpt 0.48.0rc1's plugin imports TransformerEngine unconditionally
(0.47 guarded it with ``HAS_TE``), so without TE the plugin is silently absent and a Megatron model
looks like it has nothing to quantize. When that happens, :func:`megatron_plugin_failure` imports the
plugin once more to learn why, and ``apply_qat`` raises :class:`ModelOptPluginError` with the cause.
"""

from __future__ import annotations

import importlib
import sys

MEGATRON_PLUGIN = "modelopt.torch.quantization.plugins.megatron"


def import_megatron_plugin() -> BaseException | None:
    """Import ModelOpt's Megatron plugin as ModelOpt does; the exception it raises, or ``None`` if it loads.

    Only called once the plugin is known to be missing from ``sys.modules`` (its import failed,
    leaving nothing registered), so importing it again repeats exactly what ModelOpt tried.
    """
    try:
        importlib.import_module(MEGATRON_PLUGIN)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer we are looking for
        return exc
    return None


def megatron_plugin_failure(module_types: set[type]) -> BaseException | None:
    """Why ModelOpt's Megatron plugin is not loaded, if the model has Megatron layers and it is not."""
    if not any(t.__module__.startswith("megatron.") for t in module_types):
        return None
    if sys.modules.get(MEGATRON_PLUGIN) is not None:
        return None
    return import_megatron_plugin()


def megatron_linear_types(module_types: set[type]) -> list[str]:
    """Names of the Megatron (and Megatron TE) linear classes among ``module_types``."""
    return sorted(
        t.__name__ for t in module_types
        if t.__module__.startswith("megatron.") and "Linear" in t.__name__
    )
