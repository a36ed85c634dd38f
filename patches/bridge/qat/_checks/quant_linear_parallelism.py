"""Self-check of ``bridge.quant_linear_parallelism``: ``AutoMapping`` detects the tensor parallelism of
ModelOpt's quantized Megatron linears.
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ._harness import EXPECTED_PARALLELISM, tiny_quantizable_gpt


def check_quant_linear_parallelism(context: CheckContext) -> None:
    """``AutoMapping`` detects the tensor parallelism of ModelOpt's quantized Megatron linears."""
    from megatron.bridge.models.conversion.param_mapping import AutoMapping

    with tiny_quantizable_gpt(context.device) as model:
        found = {}
        for name in EXPECTED_PARALLELISM:
            module = model.get_submodule(name)
            expect(type(module).__name__.startswith("Quant"), f"ModelOpt's conversion renames {name}'s class",
                   "Quant<class>", type(module).__name__)
            try:
                found[name] = AutoMapping(f"{name}.weight", "hf.weight")._detect_parallelism_type(module)
            except ValueError as exc:
                found[name] = f"ValueError: {str(exc).splitlines()[0][:120]}"
    wrong = {name: found[name] for name in EXPECTED_PARALLELISM if found[name] != EXPECTED_PARALLELISM[name]}
    expect(not wrong, "AutoMapping._detect_parallelism_type of each ModelOpt-quantized linear",
           {name: EXPECTED_PARALLELISM[name] for name in wrong}, wrong)
