"""Whether ModelOpt's Megatron plugin is loaded, and why not: the cause behind "nothing to quantize".

ModelOpt registers Megatron-Core's linears with ``QuantModuleRegistry`` in
``modelopt/torch/quantization/plugins/megatron.py``, imported inside ``import_plugin("megatron")``,
which swallows any import error. From 0.48 that module imports ModelOpt's TransformerEngine plugin
unconditionally (0.47 guarded it with ``if HAS_TE:``), so without TransformerEngine the plugin is
silently absent and no Megatron linear can be quantized. :func:`megatron_plugin_problem` names that.
"""

from __future__ import annotations

import importlib.util
import sys

MEGATRON_PLUGIN = "modelopt.torch.quantization.plugins.megatron"


def megatron_plugin_problem() -> str | None:
    """``None`` if ModelOpt's Megatron plugin is loaded (or megatron-core is absent), else what is missing.

    Call after ``import modelopt.torch.quantization``. The condition: megatron-core is importable, the
    plugin module is not in ``sys.modules``, and ``transformer_engine`` cannot be found.
    """
    if MEGATRON_PLUGIN in sys.modules or importlib.util.find_spec("megatron.core") is None:
        return None
    if importlib.util.find_spec("transformer_engine") is None:
        return (
            "ModelOpt's Megatron plugin is not loaded because TransformerEngine is not installed: "
            f"{MEGATRON_PLUGIN} imports it unconditionally from nvidia-modelopt 0.48, and ModelOpt drops the "
            "plugin silently, so no Megatron linear is registered for quantization. Install "
            "transformer-engine, or use nvidia-modelopt<0.48 where it is optional"
        )
    return (f"ModelOpt's Megatron plugin ({MEGATRON_PLUGIN}) failed to import; import it directly to see why")
