"""Self-check of ``bridge.skip_quantizer_params``: A Bridge export of a quantized model walks its weights and
none of its quantizer state.
"""

from __future__ import annotations

from typing import Any

from patchkit.selfcheck import CheckContext, expect

from ._harness import EXPECTED_PARALLELISM, tiny_quantizable_gpt


def exported_names(model: Any) -> list[str]:
    """The global Megatron names a Bridge export walks (``_megatron_global_param_names_all_pp_ranks``)."""
    from megatron.bridge.models.qwen.qwen3_bridge import Qwen3Bridge

    names: list[str] = Qwen3Bridge()._megatron_global_param_names_all_pp_ranks([model])
    return names


def check_skip_quantizer_params(context: CheckContext) -> None:
    """A Bridge export of a quantized model walks its weights and none of its quantizer state."""
    with tiny_quantizable_gpt(context.device) as model:
        expect(any(name.endswith("weight_quantizer._amax") for name, _ in model.named_buffers()),
               "the quantized model holds quantizer state (else nothing is tested)", "*_quantizer._amax buffers",
               "none")
        names = exported_names(model)
    quantizer_state = [name for name in names if "_quantizer" in name]
    expect(not quantizer_state, "the exported names leave ModelOpt quantizer state out", "no *_quantizer.* names",
           f"{len(quantizer_state)}, e.g. {quantizer_state[:2]}")
    weights = [f"{name}.weight" for name in EXPECTED_PARALLELISM]
    missing = [name for name in weights if name not in names]
    expect(not missing, "the exported names still hold every quantized linear's weight", weights,
           f"missing {missing}")
