"""A recorded QAT export of a tiny Qwen3-MoE, for the tests that load it into vLLM.

The vLLM test environments have no Megatron-Core, ModelOpt or Megatron-Bridge, and the environment
that has all three with Hugging Face names (``export-bridge-0.6``) has no vLLM. So the export is
recorded here, in ``export-bridge-0.6``, by the real calls, and read there
(``tests/vllm/test_qwen3_moe_load_weights.py``). ``test_qwen3_moe_recording`` re-runs the recording
and requires it to equal the file byte for byte, so the file cannot drift from what
``export_qat_weights`` writes.

What is recorded, for ``bridge_models.build(moe=True)`` (a 2-layer Qwen3-MoE, 4 experts, bf16)
after ``apply_qat`` and one SGD step through the QAT forward:

- ``streams``: ``export_qat_weights([model], bridge, expert_layout=...)`` for ``per_expert`` (the
  default) and ``fused``, in stream order. Both take the native path (Bridge 0.6's
  ``export_hf_weights_modelopt``, split per expert for ``per_expert``).
- ``quant_config``: ``export_qat_config([model], bridge)`` (what a checkpoint's
  ``hf_quant_config.json`` holds).
- ``trained``: the weights the trainer's QAT forward multiplies, under Hugging Face names: every
  quantized linear's ``weight_quantizer(weight)`` (the fake-quantized weight), every other parameter
  as it is, mapped to Hugging Face names by the Bridge's own ``export_hf_weights`` (it splits QKV
  and gate/up rows the way the export does).
- ``hf_config``: the model's Hugging Face config (JSON), the ``config.json`` a vLLM engine reads.

Rewrite the file (after a deliberate change to the export): ``python tests/export/qwen3_moe_recording.py``
in the ``export-bridge-0.6`` environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).resolve().parents[1]
RECORDING = TESTS / "vllm" / "data" / "qwen3_moe_qat_export.pt"
FORMAT = 1
LAYOUTS = ("per_expert", "fused")


def _conversion_tasks(bridge: Any, model: torch.nn.Module) -> list[Any]:
    model_bridge = getattr(bridge, "_model_bridge", bridge)
    return [task for task in model_bridge.build_conversion_tasks(bridge.hf_pretrained, [model]) if task]


@torch.no_grad()
def trained_weights(bridge: Any, model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Hugging Face name -> what the QAT forward multiplies (fake-quantized where quantized).

    The fake-quantized weights are written into the model for the Bridge's export and put back after.
    """
    originals: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if getattr(getattr(module, "weight_quantizer", None), "is_enabled", False):
            originals[name] = module.weight.detach().clone()
    try:
        for name in originals:
            module = model.get_submodule(name)
            module.weight.copy_(module.weight_quantizer(module.weight))
        stream = bridge.export_hf_weights([model], cpu=True, show_progress=False,
                                          conversion_tasks=_conversion_tasks(bridge, model))
        return [(name, tensor.detach().clone()) for name, tensor in stream if "_quantizer." not in name]
    finally:
        for name, weight in originals.items():
            model.get_submodule(name).weight.copy_(weight)


def trained_model(seed: int = 0) -> tuple[Any, torch.nn.Module]:
    """``(bridge, model)``: the tiny Qwen3-MoE, QAT applied, after one SGD step through the QAT forward.

    Call with Megatron's CPU parallel state and patchkit's CPU fake-quant backend in place.
    """
    from bridge_models import build
    from patchkit.patches.modelopt.qat import apply_qat
    from qat_fixtures import batch

    bridge, model = build(True, seed=seed)
    (model,) = apply_qat([model])
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model(**batch(seed=seed)).float().mean().backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)
    return bridge, model


def record(bridge: Any, model: torch.nn.Module) -> dict[str, Any]:
    """Everything the vLLM tests read (see the module docstring)."""
    from bridge_models import hf_config
    from patchkit.patches.modelopt.qat import export_qat_config, export_qat_weights

    return {
        "format": FORMAT,
        "hf_config": json.dumps(hf_config(True).to_dict(), sort_keys=True),
        "quant_config": export_qat_config([model], bridge),
        "streams": {layout: [(name, tensor.detach().clone())
                             for name, tensor in export_qat_weights([model], bridge, expert_layout=layout)]
                    for layout in LAYOUTS},
        "trained": trained_weights(bridge, model),
    }


def main() -> None:
    """Record here: Megatron's CPU parallel state and the CPU fake-quant backend, as in the tests."""
    sys.path[:0] = [str(TESTS / "export"), str(TESTS / "modelopt"), str(TESTS)]
    from te_harness import load_modelopt_megatron_plugin

    load_modelopt_megatron_plugin()
    from megatron.core.transformer.moe import moe_utils
    from qat_fixtures import cpu_megatron, destroy_parallel_state, initialize_parallel_state

    import patchkit

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    with cpu_megatron(), patchkit.applied("modelopt.nvfp4_cpu_fake_quant"):
        initialize_parallel_state()
        try:
            recorded = record(*trained_model())
        finally:
            destroy_parallel_state()
    RECORDING.parent.mkdir(parents=True, exist_ok=True)
    torch.save(recorded, RECORDING)


if __name__ == "__main__":
    main()
